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

use rustconv_kernels::{
    conv1d_f32, linear_scan_f32, Algorithm, Choice, Conv1dParams, PreparedConv1d, ScanParams,
    Scratch,
};

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
    // The scan's other paths: rows scanned one by one (fewer than four),
    // and one long row cut into pieces scanned in parallel (fewer rows than
    // threads).
    let few = ScanParams {
        batch: 1,
        channels: 3,
        len: 5000,
    };
    let (few_x0, few_a, few_u) = (vec![1.0; 3], vec![0.9; 15_000], vec![0.1; 15_000]);
    let mut few_h = vec![0.0; 15_000];
    let long = ScanParams {
        batch: 1,
        channels: 1,
        len: 1 << 16,
    };
    let (long_a, long_u) = (vec![0.9; 1 << 16], vec![0.1; 1 << 16]);
    let mut long_h = vec![0.0; 1 << 16];

    // Depthwise causal convs through the prepared SIMD and FFT paths (GEMM
    // is absent on purpose: the gemm crate allocates inside each call).
    let depthwise = Conv1dParams {
        batch: 1,
        in_channels: 8,
        out_channels: 8,
        in_len: 4096,
        kernel_size: 64,
        stride: 1,
        pad_left: 63,
        pad_right: 0,
        dilation: 1,
        groups: 8,
    };
    let dx = vec![0.5; depthwise.input_elems()];
    let dw = vec![0.25; depthwise.weight_elems()];
    let mut dy = vec![0.0; depthwise.output_elems().unwrap()];
    let prepared: Vec<PreparedConv1d> = [Algorithm::DepthwiseSimd, Algorithm::Fft]
        .into_iter()
        .map(|a| PreparedConv1d::new(&depthwise, &dw, Choice::Force(a)).unwrap())
        .collect();
    let scratch = Scratch::new(
        2,
        prepared
            .iter()
            .map(|p| p.scratch_per_thread())
            .max()
            .unwrap(),
    );

    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let mut run_both = || {
        pool.install(|| {
            conv1d_f32(&conv, &x, &w, Some(&bias), &mut y).unwrap();
            linear_scan_f32(&scan, &x0, &a, &u, &mut h).unwrap();
            linear_scan_f32(&few, &few_x0, &few_a, &few_u, &mut few_h).unwrap();
            linear_scan_f32(&long, &[1.0], &long_a, &long_u, &mut long_h).unwrap();
            for p in &prepared {
                p.run(&depthwise, &dx, Some(&dw), Some(&bias), &mut dy, &scratch)
                    .unwrap();
            }
        })
    };

    // Warm-up: every pool thread has started and every thread-local is set.
    pool.broadcast(|_| ());
    run_both();
    run_both();

    // Rayon's work-stealing deques may still grow now and then when the
    // machine is loaded (its allocation, amortised, not the kernels'). A
    // kernel that allocates does so on every call, so it shows in every
    // round; require one round of 10 calls with none.
    let rounds: Vec<usize> = (0..5)
        .map(|_| {
            let before = ALLOCATIONS.load(Ordering::SeqCst);
            for _ in 0..10 {
                run_both();
            }
            ALLOCATIONS.load(Ordering::SeqCst) - before
        })
        .collect();
    assert!(
        rounds.contains(&0),
        "kernels allocated in every round: {rounds:?} allocations per 10 calls"
    );
    // Make sure the work was real, not optimised away or skipped.
    assert!(y.iter().all(|v| v.is_finite() && *v > 1.0));
    for h in [&h, &few_h, &long_h] {
        assert!(h.iter().all(|v| v.is_finite() && *v > 0.0));
    }
    assert!(dy.iter().all(|v| v.is_finite() && *v > 1.0));
    println!("no_alloc: kernels made no heap allocation");
}
