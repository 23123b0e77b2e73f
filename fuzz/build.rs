//! The rpath to ExecuTorch's libraries for this crate's binaries (the fuzz
//! targets and the corpus replay), which link the backend's rlib and with
//! it libexecutorch: a dependency's link arguments do not reach them. The
//! directory is the one the backend's build.rs found (`links` metadata).

fn main() {
    let lib_dir = std::env::var("DEP_EXECUTORCH_LIB_DIR")
        .expect("DEP_EXECUTORCH_LIB_DIR is unset: rustconv-backend's build.rs sets it");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib_dir}");
}
