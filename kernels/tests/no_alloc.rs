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

    // Depthwise causal convs through the prepared SIMD and FFT paths.
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

    // Dense and grouped convs through the prepared GEMM path: its windows
    // live in the scratch slots. Dense, grouped, stride 2, dilation 2 and
    // padding, with output lengths and channel counts that leave ragged
    // blocks, and one output shorter than any block (the stack buffer).
    let gemm_shape =
        |in_channels, out_channels, groups, in_len, stride, dilation, pads: (usize, usize)| {
            Conv1dParams {
                batch: 2,
                in_channels,
                out_channels,
                in_len,
                kernel_size: 3,
                stride,
                pad_left: pads.0,
                pad_right: pads.1,
                dilation,
                groups,
            }
        };
    let gemm_shapes = [
        gemm_shape(32, 24, 1, 1000, 1, 1, (0, 0)),
        gemm_shape(48, 36, 4, 777, 1, 1, (1, 1)),
        gemm_shape(16, 20, 1, 1001, 2, 1, (1, 2)),
        gemm_shape(16, 18, 2, 999, 1, 2, (4, 0)),
        gemm_shape(8, 5, 1, 9, 1, 1, (2, 2)),
    ];
    let gemm_runs: Vec<_> = gemm_shapes
        .iter()
        .map(|p| {
            let w = vec![0.25; p.weight_elems()];
            let conv = PreparedConv1d::new(p, &w, Choice::Force(Algorithm::Gemm)).unwrap();
            assert_eq!(conv.algorithm(), Algorithm::Gemm);
            let x = vec![0.5; p.input_elems()];
            let bias = vec![1.0; p.bias_elems()];
            let y = vec![0.0; p.output_elems().unwrap()];
            (*p, conv, x, bias, y)
        })
        .collect();
    let mut gemm_runs = gemm_runs;

    let scratch = Scratch::new(
        2,
        prepared
            .iter()
            .chain(gemm_runs.iter().map(|r| &r.1))
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
            for (p, conv, x, b, y) in gemm_runs.iter_mut() {
                conv.run(p, x, None, Some(b), y, &scratch).unwrap();
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
    for (p, _, _, _, y) in &gemm_runs {
        assert!(y.iter().all(|v| v.is_finite() && *v >= 1.0), "{p:?}");
        assert!(y.iter().any(|v| *v > 1.0), "{p:?}");
    }
    println!("no_alloc: kernels made no heap allocation");
}
