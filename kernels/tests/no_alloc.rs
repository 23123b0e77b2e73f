//! The kernels promise no heap allocation of their own, so they can run
//! inside an executor's memory plan. This checks it with a counting global
//! allocator.
//!
//! It is its own test binary, without the libtest harness (`harness = false`
//! in Cargo.toml), so that the only threads alive are this one and the rayon
//! pool's: a process-wide counter then sees nothing but the kernels and
//! rayon's scheduling. Rayon allocates while starting its threads and on
//! first use of its thread-locals, so those happen in a warm-up phase.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use rustconv_kernels::{conv1d_f32, linear_scan_f32, Conv1dParams, ScanParams};

/// Forwards to the system allocator, counting allocations.
struct CountingAlloc;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards its arguments unchanged to `System`, which
// upholds the `GlobalAlloc` contract; the counter never touches memory
// handed out.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: our caller guarantees `layout` is valid for `alloc`.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: our caller guarantees `layout` is valid for `alloc_zeroed`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: our caller guarantees `ptr` came from this allocator (so from
        // `System`) with `layout`, and that `new_size` is valid.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: our caller guarantees `ptr` came from this allocator (so
        // from `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn main() {
    let conv = Conv1dParams {
        batch: 2,
        in_channels: 8,
        out_channels: 8,
        in_len: 512,
        kernel_size: 5,
        stride: 2,
        pad_left: 3,
        pad_right: 1,
        dilation: 2,
        groups: 2,
    };
    let x = vec![0.5; conv.input_elems()];
    let w = vec![0.25; conv.weight_elems()];
    let bias = vec![1.0; conv.bias_elems()];
    let mut y = vec![0.0; conv.output_elems().unwrap()];

    let scan = ScanParams {
        batch: 2,
        channels: 16,
        len: 512,
    };
    let x0 = vec![1.0; scan.state_elems()];
    let a = vec![0.9; scan.seq_elems()];
    let u = vec![0.1; scan.seq_elems()];
    let mut h = vec![0.0; scan.seq_elems()];

    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let mut run_both = || {
        pool.install(|| {
            conv1d_f32(&conv, &x, &w, Some(&bias), &mut y).unwrap();
            linear_scan_f32(&scan, &x0, &a, &u, &mut h).unwrap();
        })
    };

    // Warm-up: every pool thread has started and every thread-local is set.
    pool.broadcast(|_| ());
    run_both();
    run_both();

    let before = ALLOCATIONS.load(Ordering::SeqCst);
    for _ in 0..10 {
        run_both();
    }
    let allocations = ALLOCATIONS.load(Ordering::SeqCst) - before;

    assert_eq!(allocations, 0, "kernels allocated {allocations} times");
    // Make sure the work was real, not optimised away or skipped.
    assert!(y.iter().all(|v| v.is_finite() && *v > 1.0));
    assert!(h.iter().all(|v| v.is_finite() && *v > 0.0));
    println!("no_alloc: kernels made no heap allocation");
}
