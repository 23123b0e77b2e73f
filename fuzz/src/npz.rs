//! Target `npz`: pte_runner's npz reader on the input as a file, and what
//! it reads written back with its writer, which must read as the same
//! arrays.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use rustconv_pte_runner::npz::{read_all, select_inputs, write_outputs, Array};

pub fn run(data: &[u8]) {
    // The reader takes a path: a file of this process and call's own.
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rustconv-fuzz-npz-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    let scratch = Scratch(dir);
    let path = scratch.0.join("in.npz");
    std::fs::write(&path, data).expect("the input written");
    let Ok(arrays) = read_all(&path) else {
        return;
    };
    let mut arrays: Vec<(usize, Array)> = arrays.into_iter().collect();
    arrays.sort_by_key(|&(i, _)| i);
    let arrays: Vec<Array> = arrays.into_iter().map(|(_, a)| a).collect();
    let back = scratch.0.join("out.npz");
    write_outputs(&back, &arrays).expect("arrays read from an npz write back");
    let read = read_all(&back).expect("a written npz reads");
    let read = select_inputs(read, &back, arrays.len()).expect("every array written reads");
    assert!(read == arrays, "an npz written back reads differently");
}

/// Removes its folder when dropped, on every return.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
