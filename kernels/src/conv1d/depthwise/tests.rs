use super::*;
use crate::reference;
use crate::test_support::{assert_conv_close, depthwise_params as depthwise, Rng};
use crate::{estimate_cost, Algorithm, Choice, Conv1dParams, KernelError, PreparedConv1d};

/// Relative tolerance against the per-output sum of |terms|: recursive f32
/// summation of the bias and K products errs by at most about
/// (K + 1) * eps / 2 of that sum; twice that leaves headroom.
fn rtol(k: usize) -> f32 {
    (k + 1) as f32 * f32::EPSILON
}

/// Runs `kernel` for `p` into a NaN-filled buffer, so unwritten outputs fail.
fn run_kernel(
    kernel: &DepthwiseConv,
    p: &Conv1dParams,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let g = p.geometry().unwrap();
    let mut y = vec![f32::NAN; g.output_elems];
    kernel.run(&g, x, w, bias, &mut y, &Scratch::default());
    y
}

/// Checks `got` against the reference within [`rtol`] of the sum of |terms|.
fn check(p: &Conv1dParams, x: &[f32], w: &[f32], bias: Option<&[f32]>, got: &[f32], ctx: &str) {
    assert_conv_close(p, x, w, bias, got, rtol(p.kernel_size), ctx);
}

// 9 ..= 64 at dilation 1 take the grouped kernel on AVX-512 (1 to 4 groups).
const KS: [usize; 15] = [1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 32, 33, 64, 100, 128];
const LENS: [usize; 17] = [
    1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 63, 64, 65, 100, 129, 257, 300,
];

#[test]
fn backends_include_the_detected_one() {
    let all = Backend::all_available();
    #[cfg(not(target_arch = "aarch64"))]
    assert!(all.contains(&Backend::Portable));
    assert!(all.contains(&Backend::detect()));
    #[cfg(target_arch = "x86_64")]
    if Backend::Avx2.is_available() {
        assert!(all.contains(&Backend::Avx2), "AVX2 path must be tested");
    }
    #[cfg(target_arch = "x86_64")]
    if Backend::Avx512.is_available() {
        assert!(
            all.contains(&Backend::Avx512),
            "AVX-512 path must be tested"
        );
        assert_eq!(Backend::detect(), Backend::Avx512);
    }
}

#[test]
fn grid_matches_reference_on_every_backend() {
    let mut rng = Rng::new(7);
    let mut cases = 0;
    for isa in Isa::all_available() {
        let backend = isa.backend();
        for k in KS {
            for in_len in LENS {
                for dilation in 1..=3 {
                    let span = (k - 1) * dilation;
                    let pads = [
                        (0, 0),
                        (k - 1, 0),
                        (span, 0),
                        (span / 2, span / 2),
                        (span / 2 + 1, span.div_ceil(3)),
                        (k + 3, 1),
                    ];
                    for pads in pads {
                        let batch = rng.range(1, 2);
                        let channels = rng.range(1, 9);
                        let p = depthwise(batch, channels, in_len, k, pads, dilation);
                        let Ok(g) = p.geometry() else { continue };
                        assert!(applies(&g));
                        let x = rng.vec(p.input_elems(), -1.0, 1.0);
                        let w = rng.vec(p.weight_elems(), -1.0, 1.0);
                        let b = rng.vec(p.bias_elems(), -1.0, 1.0);
                        let bias = (rng.range(0, 1) == 1).then_some(&b[..]);
                        let kernel = DepthwiseConv::new(&g, Weights::Constant(&w), isa).unwrap();
                        assert_eq!(kernel.kernel.backend(), backend);
                        let got = run_kernel(&kernel, &p, &x, &w, bias);
                        let ctx = format!("{backend:?}, bias {}: {p:?}", bias.is_some());
                        check(&p, &x, &w, bias, &got, &ctx);
                        cases += 1;
                    }
                }
            }
        }
    }
    assert!(cases > 2000, "{cases} cases");
}

#[test]
fn structured_inputs_match_reference_exactly() {
    // Small integers keep every partial sum exact, so any summation order
    // and fused or unfused rounding must agree bit for bit.
    for isa in Isa::all_available() {
        let backend = isa.backend();
        // K = 200 with dilation 3 spans more than the edge window: scalar edges.
        for k in [1, 3, 4, 8, 9, 33, 200] {
            for (in_len, pads, dilation) in [
                (700, (3 * (k - 1), 5), 3),
                (40, (0, 0), 1),
                (70, (k - 1, 0), 1),
                (70, (k, k + 2), 2),
                (5, (2 * k, 1), 3),
            ] {
                let p = depthwise(2, 3, in_len, k, pads, dilation);
                let Ok(g) = p.geometry() else { continue };
                let x: Vec<f32> = (0..p.input_elems())
                    .map(|i| (i % 13) as f32 - 6.0)
                    .collect();
                let w: Vec<f32> = (0..p.weight_elems())
                    .map(|i| (i % 5) as f32 - 2.0)
                    .collect();
                let b: Vec<f32> = (0..p.bias_elems()).map(|i| i as f32).collect();
                let kernel = DepthwiseConv::new(&g, Weights::Constant(&w), isa).unwrap();
                for bias in [None, Some(&b[..])] {
                    assert_eq!(
                        run_kernel(&kernel, &p, &x, &w, bias),
                        reference::conv1d_f32(&p, &x, &w, bias).unwrap(),
                        "{backend:?}, bias {}: {p:?}",
                        bias.is_some()
                    );
                }
            }
        }
    }
}

#[test]
fn long_rows_split_into_chunks_give_the_same_bits_on_any_pool() {
    // Few rows, long: split into time chunks whose boundaries depend on the
    // thread count; every output must still be computed identically.
    let mut rng = Rng::new(11);
    for isa in Isa::all_available() {
        let backend = isa.backend();
        for (k, pads, dilation) in [(4, (3, 0), 1), (3, (1, 1), 2), (33, (5, 40), 1)] {
            let p = depthwise(1, 2, 20_011, k, pads, dilation);
            let g = p.geometry().unwrap();
            let x = rng.vec(p.input_elems(), -1.0, 1.0);
            let w = rng.vec(p.weight_elems(), -1.0, 1.0);
            let b = rng.vec(p.bias_elems(), -1.0, 1.0);
            let kernel = DepthwiseConv::new(&g, Weights::Constant(&w), isa).unwrap();
            let run_on = |threads| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                pool.install(|| run_kernel(&kernel, &p, &x, &w, Some(&b)))
            };
            let single = run_on(1);
            check(&p, &x, &w, Some(&b), &single, &format!("{backend:?} {p:?}"));
            for threads in [2, 3, 5] {
                assert!(
                    time_chunk(2, g.out_len, threads, 64) < g.out_len,
                    "rows must be split"
                );
                assert_eq!(run_on(threads), single, "{backend:?}, {threads} threads");
            }
        }
    }
}

#[test]
fn prepared_for_max_shape_runs_smaller_calls() {
    let mut rng = Rng::new(3);
    for (k, pads, dilation) in [
        (4, (3, 0), 1),
        (3, (1, 1), 1),
        (7, (0, 0), 2),
        (32, (31, 0), 1),
        (40, (10, 30), 1),
    ] {
        let max = depthwise(2, 9, 300, k, pads, dilation);
        let w = rng.vec(max.weight_elems(), -1.0, 1.0);
        let b = rng.vec(max.bias_elems(), -1.0, 1.0);
        let prepared =
            PreparedConv1d::new(&max, &w, Choice::Force(Algorithm::DepthwiseSimd)).unwrap();
        assert_eq!(prepared.algorithm(), Algorithm::DepthwiseSimd);
        assert_eq!(prepared.scratch_per_thread(), 0);
        // The transposed taps of the decode path.
        assert_eq!(prepared.prepared_bytes(), 9 * k * 4);
        assert!(prepared.reads_weights());
        let scratch = Scratch::default();
        for (batch, in_len) in [(2, 300), (1, 300), (2, 1), (1, 17), (2, 129), (0, 50)] {
            let p = Conv1dParams {
                batch,
                in_len,
                ..max
            };
            if p.validate().is_err() {
                continue;
            }
            let x = rng.vec(p.input_elems(), -1.0, 1.0);
            for bias in [None, Some(&b[..])] {
                let mut y = vec![f32::NAN; p.output_elems().unwrap()];
                prepared
                    .run(&p, &x, Some(&w), bias, &mut y, &scratch)
                    .unwrap();
                check(&p, &x, &w, bias, &y, &format!("{p:?}"));
            }
        }
        // Larger than prepared is refused.
        let p = Conv1dParams { in_len: 301, ..max };
        let x = vec![0.0; p.input_elems()];
        let mut y = vec![0.0; p.output_elems().unwrap()];
        assert_eq!(
            prepared.run(&p, &x, Some(&w), None, &mut y, &scratch),
            Err(KernelError::NotPrepared)
        );
        // This path reads the weights at every call: it needs them.
        let x = vec![0.0; max.input_elems()];
        let mut y = vec![0.0; max.output_elems().unwrap()];
        assert_eq!(
            prepared.run(&max, &x, None, None, &mut y, &scratch),
            Err(KernelError::MissingWeights)
        );
    }
}

#[test]
fn applies_only_to_depthwise_stride_one() {
    let ok = depthwise(1, 4, 16, 3, (1, 1), 2);
    let applies_to = |p: Conv1dParams| applies(&p.geometry().unwrap());
    assert!(applies_to(ok));
    assert!(applies_to(Conv1dParams {
        in_channels: 1,
        out_channels: 1,
        groups: 1,
        ..ok
    }));
    assert!(!applies_to(Conv1dParams { stride: 2, ..ok }));
    assert!(!applies_to(Conv1dParams { groups: 2, ..ok }));
    assert!(!applies_to(Conv1dParams {
        out_channels: 8,
        ..ok
    }));
    let w = vec![0.0; 8 * 2 * 3];
    let dense = Conv1dParams {
        out_channels: 8,
        groups: 2,
        ..ok
    };
    assert_eq!(
        PreparedConv1d::new(&dense, &w, Choice::Force(Algorithm::DepthwiseSimd)).err(),
        Some(KernelError::NotApplicable {
            algorithm: "depthwise_simd"
        })
    );
}

#[test]
fn cost_beats_direct_and_grows_with_taps() {
    for (k, n) in [(3, 64), (4, 1024), (4, 16384), (16, 4096), (64, 4096)] {
        let p = depthwise(1, 512, n, k, (k - 1, 0), 1);
        let ours = estimate_cost(Algorithm::DepthwiseSimd, &p).unwrap();
        let direct = estimate_cost(Algorithm::Direct, &p).unwrap();
        assert!(ours.is_finite() && ours > 0.0);
        assert!(ours < direct, "K={k} N={n}: {ours} vs direct {direct}");
    }
    let at = |k| {
        estimate_cost(
            Algorithm::DepthwiseSimd,
            &depthwise(1, 64, 4096, k, (0, 0), 1),
        )
    };
    assert!(at(64) > at(16) && at(16) > at(4));
}

#[test]
fn time_chunks() {
    // Enough rows: no split.
    assert_eq!(time_chunk(64, 10_000, 4, 64), 10_000);
    assert_eq!(time_chunk(1, 10_000, 1, 64), 10_000);
    // One row, 2 threads: 8 parts of 12500, rounded up to the block.
    assert_eq!(time_chunk(1, 100_000, 2, 64), 12_544);
    // Three rows, 2 threads: 3 parts each.
    assert_eq!(time_chunk(3, 30_000, 2, 64), 10_048);
    // Never below the minimum chunk.
    assert_eq!(time_chunk(1, 3000, 8, 64), MIN_CHUNK_OUTPUTS);
    assert!(time_chunk(1, 100, 8, 64) >= 100);
}

/// Rough single- and two-thread rates, for calibrating the cost constants:
/// `cargo test --release -p rustconv-kernels calibrate -- --ignored --nocapture`.
#[test]
#[ignore]
fn calibrate() {
    use rayon::prelude::*;
    use std::time::Instant;
    let time = |threads: usize, f: &mut (dyn FnMut() + Send)| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            f();
            let mut best = f64::INFINITY;
            for _ in 0..7 {
                let t = Instant::now();
                f();
                best = best.min(t.elapsed().as_secs_f64());
            }
            best
        })
    };
    let shapes = [
        (512, 16384, 4),
        (512, 16384, 3),
        (512, 1024, 4),
        (64, 1024, 4),
        (512, 256, 4),
        (4096, 64, 4),
        (64, 4096, 8),
        (64, 4096, 9),
        (64, 4096, 16),
        (64, 4096, 32),
        (64, 4096, 64),
        (64, 4096, 128),
    ];
    // DW_SHAPES="c,n,k;c,n,k" and DW_THREADS="1,2" override the defaults.
    let shapes: Vec<(usize, usize, usize)> = match std::env::var("DW_SHAPES") {
        Ok(s) => s
            .split(';')
            .map(|t| {
                let v: Vec<usize> = t.split(',').map(|e| e.trim().parse().unwrap()).collect();
                (v[0], v[1], v[2])
            })
            .collect(),
        Err(_) => shapes.to_vec(),
    };
    let thread_counts: Vec<usize> = match std::env::var("DW_THREADS") {
        Ok(s) => s.split(',').map(|e| e.trim().parse().unwrap()).collect(),
        Err(_) => vec![1, 2],
    };
    for (c, n, k) in shapes {
        // DW_PAD=none: no padding (default causal).
        let pads = match std::env::var("DW_PAD").as_deref() {
            Ok("none") => (0, 0),
            _ => (k - 1, 0),
        };
        let p = depthwise(1, c, n, k, pads, 1);
        let g = p.geometry().unwrap();
        let mut rng = Rng::new(1);
        let x = rng.vec(p.input_elems(), -1.0, 1.0);
        let w = rng.vec(p.weight_elems(), -1.0, 1.0);
        let b = rng.vec(p.bias_elems(), -1.0, 1.0);
        let mut y = vec![0.0; g.output_elems];
        let mut x_copy = vec![0.0; x.len()];
        let macs = direct_macs(&g);
        let bytes = compulsory_bytes(&g);
        let scratch = Scratch::default();
        let mut line = format!("C={c:5} N={n:6} K={k:3}:");
        for &threads in &thread_counts {
            let t_copy = time(threads, &mut || {
                x_copy
                    .par_chunks_mut(4096)
                    .zip(x.par_chunks(4096))
                    .for_each(|(y, x)| y.copy_from_slice(x))
            });
            line += &format!(" | {threads}T copy {:5.1} GB/s", bytes / t_copy / 1e9);
            let direct = PreparedConv1d::new(&p, &w, Choice::Force(Algorithm::Direct)).unwrap();
            let t = time(threads, &mut || {
                direct
                    .run(&p, &x, Some(&w), Some(&b), &mut y, &scratch)
                    .unwrap()
            });
            line += &format!(" direct {:6.1} GF/s", 2.0 * macs / t / 1e9);
            for isa in Isa::all_available() {
                let backend = isa.backend();
                let kernel = DepthwiseConv::new(&g, Weights::Constant(&w), isa).unwrap();
                let t = time(threads, &mut || {
                    kernel.run(&g, &x, &w, Some(&b), &mut y, &scratch)
                });
                line += &format!(
                    " {backend:?} {:6.1} GF/s {:5.1} GB/s ({:3.0}% copy)",
                    2.0 * macs / t / 1e9,
                    bytes / t / 1e9,
                    100.0 * t_copy / t
                );
            }
            if threads == 1 {
                line += &format!(
                    " [model {:.1} GF/s]",
                    2.0 * macs / cost(&g, Backend::detect()) / 1e9
                );
            }
        }
        println!("{line}");
    }
}

#[test]
fn short_rows_match_reference_in_both_entry_points() {
    // Decode-sized rows (one to four outputs) take the plain channel loop:
    // padding on either side, dilation, bias, serial and parallel sizes.
    let mut rng = Rng::new(11);
    for (channels, in_len, k, pads, dilation) in [
        (1024, 3, 3, (0, 0), 1),
        (64, 1, 4, (3, 0), 1),
        (5, 2, 3, (1, 1), 1),
        (33, 5, 3, (0, 0), 2),
        (40_000, 4, 4, (0, 0), 1),
        (7, 1, 1, (0, 0), 1),
        // Past the decode path's columns: the plain channel loop.
        (64, 20, 17, (0, 0), 1),
        (3, 17, 4, (0, 0), 5),
    ] {
        let p = depthwise(2, channels, in_len, k, pads, dilation);
        let g = p.geometry().unwrap();
        assert!(g.out_len <= SHORT_OUTPUTS, "{p:?}");
        let x = rng.vec(p.input_elems(), -1.0, 1.0);
        let w = rng.vec(p.weight_elems(), -1.0, 1.0);
        let b = rng.vec(p.bias_elems(), -1.0, 1.0);
        let kernel = DepthwiseConv::new(&g, Weights::Constant(&w), Isa::detect()).unwrap();
        for bias in [None, Some(&b[..])] {
            let got = run_kernel(&kernel, &p, &x, &w, bias);
            check(&p, &x, &w, bias, &got, &format!("run {p:?}"));
            let mut y = vec![f32::NAN; g.output_elems];
            kernel.run_rows(
                &g,
                RowsIn::Slice(&x),
                &w,
                bias,
                RowsOut::Slice(&mut y),
                &Scratch::default(),
            );
            check(&p, &x, &w, bias, &y, &format!("run_rows {p:?}"));
        }
    }
}

#[test]
fn grouped_filters_short_and_long_rows_match_reference_exactly() {
    // From K = 9 at dilation 1 the AVX-512 grouped kernel computes a short
    // row's edges in one window (spans of 8 included) and a long row's in
    // edge windows: every row length around the vector and window sizes,
    // "same", causal and anti-causal padding. Small integers keep every
    // partial sum exact, so the bits must equal the reference's.
    for isa in Isa::all_available() {
        let backend = isa.backend();
        for k in [9, 10, 16, 17] {
            let lens = (1..=40).chain([63, 64, 65, 255, 256, 257, 300]);
            for in_len in lens {
                for pads in [(k / 2, (k - 1) / 2), (k - 1, 0), (0, k - 1), (1, 2)] {
                    let p = depthwise(1, 3, in_len, k, pads, 1);
                    let Ok(g) = p.geometry() else { continue };
                    let x: Vec<f32> = (0..p.input_elems())
                        .map(|i| (i % 11) as f32 - 5.0)
                        .collect();
                    let w: Vec<f32> = (0..p.weight_elems())
                        .map(|i| (i % 7) as f32 - 3.0)
                        .collect();
                    let b: Vec<f32> = (0..p.bias_elems()).map(|i| i as f32 + 0.5).collect();
                    let kernel = DepthwiseConv::new(&g, Weights::Constant(&w), isa).unwrap();
                    assert_eq!(
                        run_kernel(&kernel, &p, &x, &w, Some(&b)),
                        reference::conv1d_f32(&p, &x, &w, Some(&b)).unwrap(),
                        "{backend:?}: {p:?}"
                    );
                }
            }
        }
    }
}
