//! Compiles the C++ side of the delegate (the `BackendInterface` shim and the
//! `rustconv::linear_scan.out` operator kernel, cpp/) with cxx against the
//! headers of the pinned executorch wheel, and links the wheel's shared
//! libraries with an rpath.
//!
//! The executorch package (the directory holding `include/` and `lib/`) is
//! `$RUSTCONV_EXECUTORCH_DIR` when set: how a cross build (scripts/build_aarch64.sh)
//! names the target's libraries, unpacked from the target's wheel. Otherwise
//! it is found through the project's Python: `$RUSTCONV_PYTHON`, else the
//! checkout's `.venv/bin/python` (the link `scripts/common.sh` makes to the
//! cached env). The package's version is compiled into the library
//! (`RUSTCONV_BUILT_FOR_EXECUTORCH`), so a mismatched runtime is refused
//! before it is loaded.
//!
//! What pte_runner's build.rs needs to compile and link against the same
//! package (its include directories and defines, its `lib/`, and that
//! Python's shared libpython, if any) is handed on as this package's `links`
//! metadata, which cargo gives the build scripts of its dependents as
//! `DEP_EXECUTORCH_*`: the package is found once, here.
//!
//! The rpath written here is the package's absolute `lib/`, right for
//! `target/`; the wheel build (setup.py) rewrites it relative to the
//! installed executorch package.

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

fn main() {
    let crate_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    // The checkout (the workspace root), where scripts/common.sh links .venv.
    let checkout = crate_dir.parent().unwrap();
    let (package, version, libpython) = executorch_package(checkout);
    let include = package.join("include");
    let c10_include = include.join("executorch/runtime/core/portable_type/c10");
    let lib_dir = package.join("lib");
    for needed in [&include, &c10_include, &lib_dir.join("libexecutorch.so")] {
        if !needed.exists() {
            panic!(
                "the executorch package at {} lacks {}; is executorch installed (or \
                 $RUSTCONV_EXECUTORCH_DIR an unpacked executorch wheel's package)?",
                package.display(),
                needed.display()
            );
        }
    }

    // cxx puts this crate's files under `rustconv-backend/` on the include
    // path: cpp/backend.h is included as "rustconv-backend/cpp/backend.h".
    let mut build = cxx_build::bridges(["src/host.rs", "src/ffi.rs"]);
    build
        .file("cpp/backend.cpp")
        .file("cpp/scan_kernel.cpp")
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
    // The shared threadpool the delegate runs its kernels on
    // (delegate/src/threads.rs); a build that links it into libexecutorch.so
    // has no separate library.
    if lib_dir.join("libexecutorch_threadpool.so").exists() {
        println!("cargo:rustc-link-lib=dylib=executorch_threadpool");
    }
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());

    // For pte_runner's build.rs (DEP_EXECUTORCH_*): the same headers, defines
    // and libraries, and the default libpython for ExecuTorch's LLM custom
    // ops: the build Python's, if it has one; empty otherwise (a cross build:
    // the target's is given at run time).
    let include_dirs = env::join_paths([&include, &c10_include]).unwrap();
    println!("cargo:include_dirs={}", include_dirs.to_string_lossy());
    println!("cargo:defines={}", EXECUTORCH_DEFINES.join(","));
    println!("cargo:lib_dir={}", lib_dir.display());
    println!(
        "cargo:libpython={}",
        libpython
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    );

    for path in [
        "cpp/backend.cpp",
        "cpp/backend.h",
        "cpp/scan_kernel.cpp",
        "cpp/scan_kernel.h",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
    println!("cargo:rerun-if-env-changed=RUSTCONV_PYTHON");
    println!("cargo:rerun-if-env-changed=RUSTCONV_EXECUTORCH_DIR");
    // Another executorch installed in the same place: new version, new library.
    println!(
        "cargo:rerun-if-changed={}",
        lib_dir.join("libexecutorch.so").display()
    );
    println!(
        "cargo:rustc-env=RUSTCONV_EXECUTORCH_LIB_DIR={}",
        lib_dir.display()
    );
    println!("cargo:rustc-env=RUSTCONV_EXECUTORCH_VERSION={version}");
}

/// The executorch package directory, its version and, when found through
/// a Python, that Python's shared libpython (if it was built with one).
fn executorch_package(checkout: &Path) -> (PathBuf, String, Option<PathBuf>) {
    if let Some(dir) = env::var_os("RUSTCONV_EXECUTORCH_DIR") {
        let dir = PathBuf::from(dir);
        println!("cargo:rerun-if-env-changed=RUSTCONV_EXECUTORCH_VERSION");
        let version = env::var("RUSTCONV_EXECUTORCH_VERSION")
            .ok()
            .or_else(|| dist_info_version(&dir))
            .unwrap_or_else(|| {
                panic!(
                    "$RUSTCONV_EXECUTORCH_DIR={}: no executorch-*.dist-info beside it to read \
                     the version from (unpack the wheel's dist-info with its package, or set \
                     RUSTCONV_EXECUTORCH_VERSION)",
                    dir.display()
                )
            });
        return (dir, version, None);
    }
    if env::var("TARGET").unwrap() != env::var("HOST").unwrap() {
        panic!(
            "cross-compiling for {} needs that target's ExecuTorch: set \
             RUSTCONV_EXECUTORCH_DIR to the executorch package of its wheel \
             (scripts/build_aarch64.sh does)",
            env::var("TARGET").unwrap()
        );
    }
    executorch_from_python(&find_python(checkout))
}

/// `Version:` of the `executorch-*.dist-info/METADATA` next to the package.
fn dist_info_version(package: &Path) -> Option<String> {
    let parent = package.parent()?;
    for entry in std::fs::read_dir(parent).ok()? {
        let path = entry.ok()?.path();
        let name = path.file_name()?.to_string_lossy().into_owned();
        if name.starts_with("executorch-") && name.ends_with(".dist-info") {
            let metadata = std::fs::read_to_string(path.join("METADATA")).ok()?;
            return metadata
                .lines()
                .find_map(|l| l.strip_prefix("Version: "))
                .map(|v| v.trim().to_owned());
        }
    }
    None
}

fn find_python(checkout: &Path) -> PathBuf {
    if let Some(python) = env::var_os("RUSTCONV_PYTHON") {
        return PathBuf::from(python);
    }
    let venv = checkout.join(".venv/bin/python");
    println!("cargo:rerun-if-changed={}", venv.display());
    if venv.exists() {
        return venv;
    }
    panic!(
        "no Python with executorch found: run scripts/setup.sh (which creates the pinned \
         environment and links it at .venv) or set RUSTCONV_PYTHON"
    );
}

fn executorch_from_python(python: &Path) -> (PathBuf, String, Option<PathBuf>) {
    // executorch is a namespace package in the wheel, so __file__ is None.
    // The third line: LIBDIR/INSTSONAME when the interpreter is a shared
    // build (Py_ENABLE_SHARED), else empty.
    let output = Command::new(python)
        .args([
            "-c",
            "import executorch, importlib.metadata as m, os, sysconfig as s; \
             print(list(executorch.__path__)[0]); print(m.version('executorch')); \
             v = s.get_config_var; \
             print(os.path.join(v('LIBDIR'), v('INSTSONAME')) if v('Py_ENABLE_SHARED') else '')",
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
    let stdout = String::from_utf8(output.stdout).unwrap();
    let mut lines = stdout.lines();
    let (Some(package), Some(version)) = (lines.next(), lines.next()) else {
        panic!(
            "{} did not name executorch's path and version",
            python.display()
        );
    };
    let libpython = lines
        .next()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(PathBuf::from);
    (
        PathBuf::from(package.trim()),
        version.trim().to_owned(),
        libpython,
    )
}
