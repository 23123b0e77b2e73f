//! Compiles the C++ side of the delegate (the `BackendInterface` shim, the
//! `rustconv::linear_scan.out` operator kernel and the pte_runner driver) with
//! cxx against the headers of the pinned executorch wheel, and links the
//! wheel's shared libraries with an rpath.
//!
//! The wheel is found through the project's Python: `$RUSTCONV_PYTHON`, else
//! `.venv/bin/python` (the link `scripts/common.sh` makes to the cached env).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the wheel's CMake config (share/cmake/executorch-config.cmake) asks
/// consumers to compile with. ET_EVENT_TRACER_ENABLED must match the shipped
/// libraries or the profiling scope classes change layout.
const EXECUTORCH_DEFINES: &[&str] = &[
    "C10_USING_CUSTOM_GENERATED_MACROS",
    "ET_EVENT_TRACER_ENABLED",
    "ET_USE_THREADPOOL",
];

/// Registration-only libraries pte_runner needs: their static initialisers
/// register the CPU operators and the XNNPACK backend.
const RUNNER_LIBS: &[&str] = &[
    "executorch_kernels_optimized",
    "executorch_backend_xnnpack",
    "executorch_etdump",
    "executorch_threadpool",
];

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let python = find_python(&root);
    let package = executorch_package_dir(&python);
    let include = package.join("include");
    let c10_include = include.join("executorch/runtime/core/portable_type/c10");
    let lib_dir = package.join("lib");
    for needed in [&include, &c10_include, &lib_dir.join("libexecutorch.so")] {
        if !needed.exists() {
            panic!(
                "the executorch package at {} lacks {}; is executorch==1.5.1 installed?",
                package.display(),
                needed.display()
            );
        }
    }

    let mut build =
        cxx_build::bridges(["delegate/src/ffi.rs", "delegate/src/bin/pte_runner/ffi.rs"]);
    build
        .file("delegate/cpp/backend.cpp")
        .file("delegate/cpp/runner.cpp")
        .file("delegate/cpp/scan_kernel.cpp")
        .include(&root)
        .include(&include)
        .include(&c10_include)
        .std("c++17")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations");
    for define in EXECUTORCH_DEFINES {
        build.define(define, None);
    }
    build.compile("rustconv_cpp");

    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=executorch");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
    let mut runner_libs = String::from("-Wl,--push-state,--no-as-needed");
    for lib in RUNNER_LIBS {
        runner_libs.push_str(&format!(",-l{lib}"));
    }
    runner_libs.push_str(",--pop-state");
    println!("cargo:rustc-link-arg-bin=pte_runner={runner_libs}");

    for path in [
        "delegate/cpp/backend.cpp",
        "delegate/cpp/backend.h",
        "delegate/cpp/runner.cpp",
        "delegate/cpp/runner.h",
        "delegate/cpp/scan_kernel.cpp",
        "delegate/cpp/scan_kernel.h",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
    println!("cargo:rerun-if-env-changed=RUSTCONV_PYTHON");
    println!(
        "cargo:rustc-env=RUSTCONV_EXECUTORCH_LIB_DIR={}",
        lib_dir.display()
    );
}

fn find_python(root: &Path) -> PathBuf {
    if let Some(python) = env::var_os("RUSTCONV_PYTHON") {
        return PathBuf::from(python);
    }
    let venv = root.join(".venv/bin/python");
    println!("cargo:rerun-if-changed={}", venv.display());
    if venv.exists() {
        return venv;
    }
    panic!(
        "no Python with executorch found: run scripts/setup.sh (which creates the pinned \
         environment and links it at .venv) or set RUSTCONV_PYTHON"
    );
}

fn executorch_package_dir(python: &Path) -> PathBuf {
    // executorch is a namespace package in the wheel, so __file__ is None.
    let output = Command::new(python)
        .args([
            "-c",
            "import executorch; print(list(executorch.__path__)[0])",
        ])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    if !output.status.success() {
        panic!(
            "{} cannot import executorch: {}",
            python.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    PathBuf::from(String::from_utf8(output.stdout).unwrap().trim())
}
