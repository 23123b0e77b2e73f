//! Operator libraries loaded at run time, for programs that need kernels
//! pte_runner does not link.
//!
//! * `-kernel_lib A,B`: libraries whose static initialisers register
//!   ExecuTorch kernels (a model's own custom ops), loaded before the
//!   program.
//! * ExecuTorch's LLM custom ops (`llama::custom_sdpa.out`,
//!   `llama::update_cache.out`, `llama::sdpa_with_kv_cache.out`, ...), which
//!   the programs of ExecuTorch's LLM recipes (`examples/models/llama`,
//!   `export_llama`) call. The executorch wheel ships their kernels only in
//!   `extension/llm/custom_ops/libcustom_ops_aot_lib.so`, the library Python
//!   loads for export: loading it registers the `.out` kernels with the
//!   ExecuTorch runtime pte_runner runs on (the same `libexecutorch.so`), but
//!   it also needs libtorch (found through its own RUNPATH) and CPython's
//!   symbols (it links the pybindings module), so a shared libpython is
//!   loaded first. This costs about a second at start-up and libtorch's
//!   mappings, so by default (`-llm_ops auto`) it happens only when the
//!   method fails to load for a missing operator, and the load is retried.

use std::path::{Path, PathBuf};

use crate::ffi::bridge as et;

/// An operator every LLM recipe program with `use_sdpa_with_kv_cache`
/// calls, and that the library registers: its presence says the library
/// is loaded (by us or by a `-kernel_lib`).
pub const LLM_PROBE_OPERATOR: &str = "llama::custom_sdpa.out";
const LLM_OPS_FILE: &str = "extension/llm/custom_ops/libcustom_ops_aot_lib.so";

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LlmOps {
    /// Loaded when the method fails to load for a missing operator.
    #[default]
    Auto,
    /// Loaded before the program.
    On,
    /// Never loaded.
    Off,
}

impl LlmOps {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "on" => Ok(Self::On),
            "off" => Ok(Self::Off),
            _ => Err(format!("-llm_ops expects auto, on or off, got '{s}'")),
        }
    }
}

/// Loads the user's `-kernel_lib` libraries, in order.
pub fn load_user_libraries(paths: &[PathBuf]) -> Result<(), String> {
    for path in paths {
        if !path.is_file() {
            return Err(format!("-kernel_lib {} does not exist", path.display()));
        }
        let file = path.to_str().ok_or("-kernel_lib path is not valid UTF-8")?;
        // SAFETY: the user named this library to be loaded into an
        // ExecuTorch runner for its kernels (load_library's contract).
        unsafe { et::load_library(file) }.map_err(|e| e.what().to_owned())?;
    }
    Ok(())
}

/// Loads ExecuTorch's LLM custom ops unless they are registered already;
/// returns the library loaded, if any.
pub fn load_llm_ops() -> Result<Option<PathBuf>, String> {
    if et::has_operator(LLM_PROBE_OPERATOR) {
        return Ok(None);
    }
    let library = llm_ops_library()?;
    let python = libpython().ok_or_else(|| {
        format!(
            "{} needs CPython's symbols, and no shared libpython was found: set \
             RUSTCONV_LIBPYTHON to one (the libpython3.X.so of the Python that has \
             executorch)",
            library.display()
        )
    })?;
    for file in [&python, &library] {
        let name = file.to_str().ok_or("library path is not valid UTF-8")?;
        // SAFETY: libpython (exported for the library after it, its
        // initialisers register nothing) and the executorch wheel's own LLM
        // operator library, built against the libexecutorch.so this process
        // runs on (load_library's contract).
        unsafe { et::load_library(name) }.map_err(|e| {
            format!(
                "loading ExecuTorch's LLM custom ops: {} (set RUSTCONV_LLM_OPS_LIB or \
                 RUSTCONV_LIBPYTHON to override the paths)",
                e.what()
            )
        })?;
    }
    if !et::has_operator(LLM_PROBE_OPERATOR) {
        return Err(format!(
            "{} loaded but registered no {LLM_PROBE_OPERATOR} kernel",
            library.display()
        ));
    }
    Ok(Some(library))
}

/// `$RUSTCONV_LLM_OPS_LIB`, else the library in the executorch package
/// whose `libexecutorch.so` this process runs on (the wheel's layout).
fn llm_ops_library() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("RUSTCONV_LLM_OPS_LIB") {
        return existing(PathBuf::from(path), "RUSTCONV_LLM_OPS_LIB");
    }
    let package = executorch_package()?;
    existing(package.join(LLM_OPS_FILE), "the executorch package")
}

fn existing(path: PathBuf, from: &str) -> Result<PathBuf, String> {
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "ExecuTorch's LLM custom ops library {} (from {from}) does not exist",
            path.display()
        ))
    }
}

/// `$RUSTCONV_LIBPYTHON`, else the build Python's shared libpython if it
/// still exists (the wheel's launcher sets the variable to its own).
fn libpython() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("RUSTCONV_LIBPYTHON") {
        return Some(PathBuf::from(path));
    }
    let built = env!("RUSTCONV_BUILD_LIBPYTHON");
    (!built.is_empty() && Path::new(built).is_file()).then(|| PathBuf::from(built))
}

/// The executorch package (the directory holding `lib/libexecutorch.so`)
/// this process has loaded, read from /proc/self/maps.
fn executorch_package() -> Result<PathBuf, String> {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| format!("cannot read /proc/self/maps: {e}"))?;
    let lib = loaded_library(&maps, "libexecutorch.so")
        .ok_or("libexecutorch.so is not among this process's mappings")?;
    lib.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .ok_or_else(|| format!("{} has no package directory", lib.display()))
}

/// The path of the mapped file named `name` in a /proc/<pid>/maps text.
fn loaded_library(maps: &str, name: &str) -> Option<PathBuf> {
    maps.lines()
        // address perms offset dev inode path: the path is the sixth field.
        .filter_map(|line| line.split_whitespace().nth(5))
        .map(Path::new)
        .find(|path| path.file_name().is_some_and(|f| f == name))
        .map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_library_in_maps_by_file_name() {
        let maps = "\
7f00-7f01 r--p 00000000 08:01 12 /usr/lib/libc.so.6
7f02-7f03 r-xp 00001000 08:01 34 /env/site-packages/executorch/lib/libexecutorch.so
7f04-7f05 rw-p 00000000 00:00 0 
7f06-7f07 r--p 00000000 08:01 56 /x/libexecutorch.so.bak";
        assert_eq!(
            loaded_library(maps, "libexecutorch.so"),
            Some(PathBuf::from(
                "/env/site-packages/executorch/lib/libexecutorch.so"
            ))
        );
        assert_eq!(loaded_library(maps, "libpython3.11.so.1.0"), None);
    }

    #[test]
    fn this_process_maps_its_executorch() {
        let package = executorch_package().unwrap();
        assert!(
            package.join("lib/libexecutorch.so").is_file(),
            "{package:?}"
        );
    }

    #[test]
    fn llm_ops_modes_parse() {
        assert_eq!(LlmOps::parse("auto"), Ok(LlmOps::Auto));
        assert_eq!(LlmOps::parse("on"), Ok(LlmOps::On));
        assert_eq!(LlmOps::parse("off"), Ok(LlmOps::Off));
        assert!(LlmOps::parse("yes")
            .unwrap_err()
            .contains("auto, on or off"));
    }
}
