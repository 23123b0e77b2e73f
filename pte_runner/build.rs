//! Compiles pte_runner's C++ side (cpp/runner.cpp, which drives ExecuTorch's
//! Program/Method API) with cxx, and links the ExecuTorch libraries whose
//! static initialisers register the CPU operators and the XNNPACK backend.
//!
//! The executorch package is the one the backend was built against: the
//! backend's build.rs finds it and hands on its include directories,
//! defines, `lib/` and the build Python's libpython as its `links =
//! "executorch"` metadata, which cargo passes here as `DEP_EXECUTORCH_*`.
//! libexecutorch itself comes linked with the backend's rlib; the rpath is
//! written here too (a dependency's link arguments do not reach this binary).

use std::env;

/// Registration-only libraries pte_runner needs: their static initialisers
/// register the CPU operators and the XNNPACK backend.
const RUNNER_LIBS: &[&str] = &[
    "executorch_kernels_optimized",
    "executorch_backend_xnnpack",
    "executorch_etdump",
    "executorch_threadpool",
];

/// `DEP_EXECUTORCH_<key>`, set by the backend's build.rs.
fn backend_metadata(key: &str) -> String {
    let var = format!("DEP_EXECUTORCH_{key}");
    env::var(&var).unwrap_or_else(|_| panic!("{var} is unset: rustconv-backend's build.rs sets it"))
}

fn main() {
    let lib_dir = backend_metadata("LIB_DIR");

    // cxx puts this crate's files under `rustconv-pte-runner/` on the
    // include path: cpp/runner.h is "rustconv-pte-runner/cpp/runner.h".
    let mut build = cxx_build::bridge("src/ffi.rs");
    build.file("cpp/runner.cpp").std("c++17");
    for dir in env::split_paths(&backend_metadata("INCLUDE_DIRS")) {
        build.include(dir);
    }
    for define in backend_metadata("DEFINES")
        .split(',')
        .filter(|d| !d.is_empty())
    {
        build.define(define, None);
    }
    build
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .compile("rustconv_runner_cpp");

    println!("cargo:rustc-link-search=native={lib_dir}");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib_dir}");
    // An ExecuTorch build that links all of these into libexecutorch.so
    // (Android's AAR, docs/aarch64.md) names the ones it has, maybe none.
    println!("cargo:rerun-if-env-changed=RUSTCONV_EXECUTORCH_RUNNER_LIBS");
    let runner_lib_list = env::var("RUSTCONV_EXECUTORCH_RUNNER_LIBS")
        .map(|v| {
            v.split(',')
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_else(|_| {
            RUNNER_LIBS
                .iter()
                .map(|l| l.to_string())
                .collect::<Vec<_>>()
        });
    let mut runner_libs = String::from("-Wl,--push-state,--no-as-needed");
    for lib in &runner_lib_list {
        runner_libs.push_str(&format!(",-l{lib}"));
    }
    runner_libs.push_str(",--pop-state");
    // Every binary of this package: pte_runner, and the library's own tests,
    // which run on the same ExecuTorch (kernel_libs.rs finds it mapped).
    println!("cargo:rustc-link-arg={runner_libs}");

    for path in ["cpp/runner.cpp", "cpp/runner.h"] {
        println!("cargo:rerun-if-changed={path}");
    }
    // The default libpython for ExecuTorch's LLM custom ops (kernel_libs.rs):
    // the build Python's, if it has one; empty otherwise (a cross build: the
    // target's is given at run time).
    println!(
        "cargo:rustc-env=RUSTCONV_BUILD_LIBPYTHON={}",
        backend_metadata("LIBPYTHON")
    );
}
