//! Every file of `fuzz/corpus/<target>/` through its target: the seeds and
//! every failure the fuzzers found (kept there as regressions), on stable
//! Rust without libFuzzer. Each file must return without a panic; the
//! failing files are named.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

fn replay(target: &str, run: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} is empty", dir.display());
    let failed: Vec<String> = files
        .iter()
        .filter(|file| {
            let data = std::fs::read(file).unwrap();
            catch_unwind(AssertUnwindSafe(|| run(&data))).is_err()
        })
        .map(|file| file.display().to_string())
        .collect();
    assert!(failed.is_empty(), "{target}: failed on {failed:#?}");
}

#[test]
fn init() {
    replay("init", rustconv_fuzz::init::run);
}

#[test]
fn execute() {
    replay("execute", rustconv_fuzz::execute::run);
}

#[test]
fn npz() {
    replay("npz", rustconv_fuzz::npz::run);
}

#[test]
fn args() {
    replay("args", rustconv_fuzz::runner_args::run);
}

/// The seeds are blobs init accepts, so the fuzzer starts inside the plan
/// builder, not at the framing checks.
#[test]
fn init_accepts_every_seed() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/init");
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if name.starts_with("seed-") {
            let data = std::fs::read(&path).unwrap();
            assert!(rustconv_fuzz::init::accepted(&data), "{name} refused");
        }
    }
}
