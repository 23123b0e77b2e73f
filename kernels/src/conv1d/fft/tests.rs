//! The FFT convolution against the naive reference.
//!
//! Tolerance: the FFT's rounding error is normwise, not relative to each
//! output, so each output row `(b, c)` is allowed
//! `TOL * (||h_c||_2 * ||x_{b,c}||_2 + |bias_c|)`, the Cauchy-Schwarz bound
//! on the row's magnitudes scaled by `TOL = 1e-5`. The expected error is
//! about `eps * log2 M` (6e-8 * 17 = 1e-6 at `M = 2^17`) times that scale,
//! so `TOL` leaves an order of magnitude of headroom while still catching
//! any misplaced tap or block (an error of the size of one term).

use super::plan;
use super::*;
use crate::reference;
use crate::test_support::{assert_close, depthwise_params as params, Rng};
use crate::{Algorithm, Choice, Conv1dParams, PreparedConv1d};

const TOL: f32 = 1e-5;

/// Per-element tolerance (see the module docs).
fn tolerance(p: &Conv1dParams, x: &[f32], w: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
    let norm = |v: &[f32]| v.iter().map(|&a| f64::from(a).powi(2)).sum::<f64>().sqrt();
    let out_len = p.out_len().unwrap();
    let mut tol = Vec::with_capacity(p.output_elems().unwrap());
    for b in 0..p.batch {
        for c in 0..p.in_channels {
            let x_row = &x[(b * p.in_channels + c) * p.in_len..][..p.in_len];
            let w_row = &w[c * p.kernel_size..][..p.kernel_size];
            let b_c = bias.map_or(0.0, |bias| f64::from(bias[c]).abs());
            let t = (f64::from(TOL) * (norm(w_row) * norm(x_row) + b_c)) as f32;
            tol.extend(std::iter::repeat_n(t.max(f32::MIN_POSITIVE), out_len));
        }
    }
    tol
}

fn data(rng: &mut Rng, p: &Conv1dParams) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    (
        rng.vec(p.input_elems(), -1.0, 1.0),
        rng.vec(p.weight_elems(), -1.0, 1.0),
        rng.vec(p.bias_elems(), -1.0, 1.0),
    )
}

/// Runs a prepared conv into a NaN-filled output, so unwritten outputs fail.
/// The FFT path gets no weights (it must use its spectra); others get `w`.
fn run_prepared(
    prepared: &PreparedConv1d,
    p: &Conv1dParams,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let scratch = Scratch::new(rayon::current_num_threads(), prepared.scratch_per_thread());
    let mut y = vec![f32::NAN; p.output_elems().unwrap()];
    let w = prepared.reads_weights().then_some(w);
    prepared.run(p, x, w, bias, &mut y, &scratch).unwrap();
    y
}

/// Prepares `max` by force through `PreparedConv1d`, then runs it at every
/// `(batch, in_len)` in `runs` that is valid, with and without bias,
/// comparing each with the reference. `run` gets NaN weights: it must not
/// read them.
fn check(name: &str, max: Conv1dParams, runs: &[(usize, usize)], rng: &mut Rng) {
    let (x_max, w, bias_all) = data(rng, &max);
    let prepared = PreparedConv1d::new(&max, &w, Choice::Force(Algorithm::Fft))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(prepared.algorithm(), Algorithm::Fft);
    assert!(!prepared.reads_weights());
    let nan_w = vec![f32::NAN; w.len()];
    for &(batch, in_len) in runs.iter().chain([&(max.batch, max.in_len)]) {
        let p = Conv1dParams {
            batch,
            in_len,
            ..max
        };
        if p.validate().is_err() {
            continue;
        }
        let x = &x_max[..p.input_elems()];
        for bias in [None, Some(bias_all.as_slice())] {
            let want = reference::conv1d_f32(&p, x, &w, bias).unwrap();
            let got = run_prepared(&prepared, &p, x, &nan_w, bias);
            let context = format!("{name}: {p:?}, bias {}", bias.is_some());
            assert_close(&got, &want, &tolerance(&p, x, &w, bias), &context);
        }
    }
}

#[test]
fn applies_only_to_depthwise_multiplier_one_stride_one() {
    let base = params(1, 4, 32, 5, (2, 2), 1);
    let applies = |p: Conv1dParams| super::applies(&p.geometry().unwrap(), Backend::detect());
    assert!(applies(base));
    assert!(applies(Conv1dParams {
        dilation: 3,
        ..base
    }));
    assert!(applies(Conv1dParams {
        in_channels: 1,
        out_channels: 1,
        groups: 1,
        ..base
    }));
    assert!(!applies(Conv1dParams { stride: 2, ..base }));
    assert!(!applies(Conv1dParams { groups: 1, ..base }));
    assert!(!applies(Conv1dParams { groups: 2, ..base }));
    assert!(!applies(Conv1dParams {
        out_channels: 8,
        ..base
    }));
}

#[test]
fn matches_reference_through_prepared() {
    let mut rng = Rng::new(11);
    // (name, max params, smaller (batch, in_len) runs)
    let cases = [
        ("K=1", params(2, 3, 50, 1, (0, 0), 1), vec![(1, 7), (2, 1)]),
        (
            "K=2 symmetric",
            params(2, 2, 40, 2, (1, 1), 1),
            vec![(1, 3)],
        ),
        (
            "K=5 causal",
            params(1, 5, 100, 5, (4, 0), 1),
            vec![(1, 1), (1, 37)],
        ),
        (
            "K=5 dilation 2",
            params(2, 3, 61, 5, (4, 4), 2),
            vec![(1, 9)],
        ),
        (
            "K=5 dilation 3",
            params(1, 2, 70, 5, (12, 0), 3),
            vec![(1, 13)],
        ),
        (
            "K=32 causal",
            params(2, 3, 300, 32, (31, 0), 1),
            vec![(1, 1), (2, 45), (1, 299)],
        ),
        (
            "K=33 asymmetric",
            params(1, 4, 257, 33, (5, 27), 1),
            vec![(1, 100)],
        ),
        (
            "K=128 causal",
            params(1, 2, 1000, 128, (127, 0), 1),
            vec![(1, 129), (1, 513)],
        ),
        (
            "K=128 same",
            params(2, 1, 700, 128, (63, 64), 1),
            vec![(1, 64), (2, 350)],
        ),
        ("K=N no padding", params(2, 3, 64, 64, (0, 0), 1), vec![]),
        (
            "K=N causal",
            params(2, 2, 200, 200, (199, 0), 1),
            vec![(1, 1), (2, 77)],
        ),
        (
            "K=N dilation 2",
            params(1, 2, 99, 50, (98, 0), 2),
            vec![(1, 10)],
        ),
        (
            "K>N padded",
            params(1, 3, 10, 17, (9, 8), 1),
            vec![(1, 1), (1, 0)],
        ),
        (
            "K>N causal",
            params(2, 2, 20, 50, (49, 0), 1),
            vec![(1, 0), (2, 5)],
        ),
        (
            "outputs only padding",
            params(1, 2, 3, 2, (6, 5), 1),
            vec![(1, 0)],
        ),
        (
            "right pad only",
            params(1, 3, 45, 7, (0, 6), 1),
            vec![(1, 6)],
        ),
    ];
    for (name, max, runs) in cases {
        check(name, max, &runs, &mut rng);
    }
}

/// Every candidate FFT length, from the span itself (one output per block)
/// to past the single FFT, odd lengths included: the block bookkeeping must
/// be right whatever the policy picks.
#[test]
fn every_fft_length_matches_reference() {
    let mut rng = Rng::new(12);
    let shapes = [
        params(2, 2, 37, 5, (4, 0), 1),
        params(1, 3, 29, 4, (2, 5), 2),
        params(1, 1, 12, 20, (10, 9), 1),
    ];
    for p in shapes {
        let g = p.geometry().unwrap();
        let (x, w, bias) = data(&mut rng, &p);
        let want = reference::conv1d_f32(&p, &x, &w, Some(&bias)).unwrap();
        let tol = tolerance(&p, &x, &w, Some(&bias));
        let span = plan::span(&g);
        for m in span..span + g.out_len + 8 {
            let conv = FftConv::with_plan(&g, &w, plan::Engine::Real, m, Isa::detect());
            let scratch = Scratch::new(rayon::current_num_threads(), conv.scratch_per_thread());
            let mut y = vec![f32::NAN; g.output_elems];
            conv.run(&g, &x, Some(&bias), &mut y, &scratch);
            assert_close(&y, &want, &tol, &format!("{p:?}, M = {m}"));
        }
    }
}

/// Few rows, many blocks: the blocks of a row are split among threads, and
/// the result must not depend on the pool size.
#[test]
fn result_does_not_depend_on_pool_size() {
    let mut rng = Rng::new(13);
    let p = params(1, 1, 5000, 33, (32, 0), 1);
    let (x, w, bias) = data(&mut rng, &p);
    let prepared = PreparedConv1d::new(&p, &w, Choice::Force(Algorithm::Fft)).unwrap();
    let run_on = |threads| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| run_prepared(&prepared, &p, &x, &w, Some(&bias)))
    };
    let single = run_on(1);
    let want = reference::conv1d_f32(&p, &x, &w, Some(&bias)).unwrap();
    assert_close(
        &single,
        &want,
        &tolerance(&p, &x, &w, Some(&bias)),
        "1 thread",
    );
    for threads in [2, 3, 7] {
        assert_eq!(run_on(threads), single, "{threads} threads");
    }
}

/// PyTorch's default init for a depthwise conv: uniform in `±1 / sqrt(K)`.
fn default_init(rng: &mut Rng, channels: usize, k: usize) -> Vec<f32> {
    let bound = 1.0 / (k as f32).sqrt();
    rng.vec(channels * k, -bound, bound)
}

/// Largest absolute error of `got` against `want`.
fn max_abs_error(got: &[f32], want: &[f32]) -> f32 {
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

/// A long causal filter, K = N = 8192, against the full reference.
#[test]
fn long_causal_filter_is_accurate() {
    let mut rng = Rng::new(14);
    let (n, k) = (8192, 8192);
    let p = params(1, 1, n, k, (k - 1, 0), 1);
    let x = rng.vec(n, -1.0, 1.0);
    let w = default_init(&mut rng, 1, k);
    let prepared = PreparedConv1d::new(&p, &w, Choice::Force(Algorithm::Fft)).unwrap();
    let got = run_prepared(&prepared, &p, &x, &w, None);
    let want = reference::conv1d_f32(&p, &x, &w, None).unwrap();
    let err = max_abs_error(&got, &want);
    assert!(err < 1e-5, "max abs error {err}");
    assert_close(&got, &want, &tolerance(&p, &x, &w, None), "K = N = 8192");
}

/// The largest workload shape, K = N = 65536 causal (one FFT of 2^17),
/// checked at sampled outputs (the full reference is 4e9 multiply-adds).
#[test]
fn k_equals_n_65536_is_accurate_at_samples() {
    let mut rng = Rng::new(15);
    let (n, k) = (65536, 65536);
    let p = params(1, 1, n, k, (k - 1, 0), 1);
    let x = rng.vec(n, -1.0, 1.0);
    let w = default_init(&mut rng, 1, k);
    let prepared = PreparedConv1d::new(&p, &w, Choice::Force(Algorithm::Fft)).unwrap();
    assert_eq!(prepared.prepared_bytes(), 8 * ((1 << 17) / 2 + 1));
    let got = run_prepared(&prepared, &p, &x, &w, None);
    // Causal: y[l] = sum_{j <= l} w[K - 1 - l + j] * x[j].
    let mut err: f32 = 0.0;
    for l in (0..n).step_by(997).chain([1, n - 1]) {
        let want: f64 = (0..=l)
            .map(|j| f64::from(w[k - 1 - l + j]) * f64::from(x[j]))
            .sum();
        err = err.max((got[l] - want as f32).abs());
    }
    assert!(err < 1e-5, "max abs error {err}");
}

#[test]
fn prepared_bytes_are_the_spectra() {
    let p = params(2, 6, 16384, 128, (127, 0), 1);
    let g = p.geometry().unwrap();
    let w = vec![0.5; p.weight_elems()];
    let m = plan::choose(&g, Backend::detect()).unwrap().fft_len;
    for engine in plan::Engine::available(Backend::detect()).filter(|e| e.supports(m)) {
        let conv = FftConv::with_plan(&g, &w, engine, m, Isa::detect());
        assert_eq!(conv.fft_len, m);
        // The lanes engine pads the channels to a whole group of 32.
        let channels = match engine {
            plan::Engine::Real => 6,
            #[cfg(target_arch = "x86_64")]
            plan::Engine::Lanes => 32,
        };
        assert_eq!(conv.prepared_bytes(), channels * (m / 2 + 1) * 8);
        assert!(conv.scratch_per_thread() >= 2 * m + 2);
    }
}

#[test]
fn cost_prefers_fft_to_direct_for_long_filters() {
    for k in [128, 16384] {
        let g = params(1, 64, 16384, k, (k - 1, 0), 1).geometry().unwrap();
        let fft = super::cost(&g, Backend::detect());
        let direct = super::super::direct::cost(&g);
        assert!(
            fft.is_finite() && fft < direct / 4.0,
            "K={k}: {fft} vs {direct}"
        );
    }
}

/// [`tolerance`] for the lanes engine: two rows share each transform
/// (channels `c` and `c + 16` of a group of 32), so each row's rounding
/// error scales with the larger of the two rows' magnitudes.
#[cfg(target_arch = "x86_64")]
fn lanes_tolerance(p: &Conv1dParams, x: &[f32], w: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
    let per_row = tolerance(p, x, w, bias);
    let out_len = p.out_len().unwrap();
    let row_tol = |b: usize, c: usize| per_row[(b * p.in_channels + c) * out_len];
    let mut tol = per_row.clone();
    for b in 0..p.batch {
        for c in 0..p.in_channels {
            let lane = c % lanes::GROUP;
            let partner = c - lane + (lane + lanes::GROUP / 2) % lanes::GROUP;
            let t = if partner < p.in_channels {
                row_tol(b, c).max(row_tol(b, partner))
            } else {
                row_tol(b, c)
            };
            tol[(b * p.in_channels + c) * out_len..][..out_len].fill(t);
        }
    }
    tol
}

/// The lanes engine (AVX-512), forced at every power-of-two length from the
/// span to past the single FFT: channel counts around the group of 32,
/// batches, padding, dilation, bias, and calls smaller than prepared.
#[cfg(target_arch = "x86_64")]
#[test]
fn lanes_engine_matches_reference_at_every_length() {
    if !lanes::runs_on(Backend::detect()) {
        eprintln!("no AVX-512: lanes engine not tested");
        return;
    }
    let mut rng = Rng::new(16);
    let shapes = [
        params(1, 1, 40, 5, (4, 0), 1),
        params(2, 5, 37, 5, (4, 0), 1),
        params(1, 31, 100, 7, (3, 3), 2),
        params(1, 32, 64, 64, (63, 0), 1),
        params(2, 33, 129, 16, (15, 0), 1),
        params(1, 64, 300, 33, (5, 27), 1),
        params(1, 70, 200, 200, (199, 0), 1),
        params(1, 3, 12, 20, (10, 9), 1),
        params(1, 2, 3, 2, (6, 5), 1),
        params(2, 40, 1000, 128, (127, 0), 1),
        // Lengths that are multiples of 16: aligned input and output tiles.
        params(1, 40, 256, 32, (31, 0), 1),
        params(2, 33, 512, 100, (50, 49), 1),
        params(1, 16, 64, 3, (1, 1), 1),
    ];
    for max in shapes {
        let g = max.geometry().unwrap();
        let (x_max, w, bias_all) = data(&mut rng, &max);
        let span = plan::span(&g);
        let mut m = span.max(16).next_power_of_two();
        loop {
            let conv = FftConv::with_plan(&g, &w, plan::Engine::Lanes, m, Isa::detect());
            assert_eq!(conv.engine(), plan::Engine::Lanes);
            let scratch = Scratch::new(rayon::current_num_threads(), conv.scratch_per_thread());
            let runs = [(max.batch, max.in_len), (1, max.in_len / 2 + 1), (1, 1)];
            for (batch, in_len) in runs {
                let p = Conv1dParams {
                    batch,
                    in_len,
                    ..max
                };
                let Ok(g) = p.geometry() else { continue };
                let x = &x_max[..p.input_elems()];
                for bias in [None, Some(bias_all.as_slice())] {
                    let want = reference::conv1d_f32(&p, x, &w, bias).unwrap();
                    let mut y = vec![f32::NAN; g.output_elems];
                    conv.run(&g, x, bias, &mut y, &scratch);
                    let context = format!("{p:?}, M = {m}, bias {}", bias.is_some());
                    assert_close(&y, &want, &lanes_tolerance(&p, x, &w, bias), &context);
                }
            }
            if m >= g.out_len + span {
                break;
            }
            m *= 2;
        }
    }
}

/// Few groups, many blocks: the lanes engine splits each group's blocks
/// among threads; the result must not depend on the pool size.
#[cfg(target_arch = "x86_64")]
#[test]
fn lanes_result_does_not_depend_on_pool_size() {
    if !lanes::runs_on(Backend::detect()) {
        return;
    }
    let mut rng = Rng::new(17);
    let p = params(1, 20, 5000, 33, (32, 0), 1);
    let g = p.geometry().unwrap();
    let (x, w, bias) = data(&mut rng, &p);
    let conv = FftConv::with_plan(&g, &w, plan::Engine::Lanes, 128, Isa::detect());
    let run_on = |threads| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let scratch = Scratch::new(threads, conv.scratch_per_thread());
            let mut y = vec![f32::NAN; g.output_elems];
            conv.run(&g, &x, Some(&bias), &mut y, &scratch);
            y
        })
    };
    let single = run_on(1);
    let want = reference::conv1d_f32(&p, &x, &w, Some(&bias)).unwrap();
    let tol = lanes_tolerance(&p, &x, &w, Some(&bias));
    assert_close(&single, &want, &tol, "1 thread");
    for threads in [2, 3, 7] {
        assert_eq!(run_on(threads), single, "{threads} threads");
    }
}

/// With AVX-512, the cost model picks the lanes engine for the benchmark's
/// long-filter shapes, and it is accurate there (K = N = 8192, 64 channels).
#[cfg(target_arch = "x86_64")]
#[test]
fn lanes_engine_is_chosen_and_accurate_for_long_filters() {
    if !lanes::runs_on(Backend::detect()) {
        return;
    }
    for (n, k) in [(1024, 32), (1024, 128), (4096, 128), (4096, 4096)] {
        let g = params(1, 512, n, k, (k - 1, 0), 1).geometry().unwrap();
        assert_eq!(
            plan::choose(&g, Backend::detect()).unwrap().engine,
            plan::Engine::Lanes,
            "N={n} K={k}"
        );
    }
    let mut rng = Rng::new(18);
    let (c, n) = (64, 8192);
    let p = params(1, c, n, n, (n - 1, 0), 1);
    let x = rng.vec(c * n, -1.0, 1.0);
    let w = default_init(&mut rng, c, n);
    let prepared = PreparedConv1d::new(&p, &w, Choice::Force(Algorithm::Fft)).unwrap();
    let got = run_prepared(&prepared, &p, &x, &w, None);
    // Check four channels against the reference.
    for ch in [0, 17, 32, 63] {
        let p1 = params(1, 1, n, n, (n - 1, 0), 1);
        let want = reference::conv1d_f32(&p1, &x[ch * n..][..n], &w[ch * n..][..n], None).unwrap();
        let err = max_abs_error(&got[ch * n..][..n], &want);
        assert!(err < 1e-5, "channel {ch}: max abs error {err}");
    }
}

/// Timings of the chosen plan against the cost model, for calibrating the
/// constants in `plan.rs`: `FFT_SHAPES="c,n,k;..." cargo test --release -p
/// rustconv-kernels calibrate_fft -- --ignored --nocapture` (causal shapes).
#[test]
#[ignore]
fn calibrate_fft() {
    use std::time::Instant;
    let shapes: Vec<(usize, usize, usize)> = std::env::var("FFT_SHAPES")
        .unwrap_or_else(|_| "512,1024,128;512,4096,128;512,1024,32;512,4096,4096".into())
        .split(';')
        .map(|t| {
            let v: Vec<usize> = t.split(',').map(|e| e.trim().parse().unwrap()).collect();
            (v[0], v[1], v[2])
        })
        .collect();
    for (c, n, k) in shapes {
        let p = params(1, c, n, k, (k - 1, 0), 1);
        let g = p.geometry().unwrap();
        let mut rng = Rng::new(1);
        let (x, w, b) = data(&mut rng, &p);
        let chosen = plan::choose(&g, Backend::detect()).unwrap();
        let mut line = format!("C={c:5} N={n:6} K={k:5}: chosen {chosen:?}\n");
        for engine in plan::Engine::available(Backend::detect()) {
            let mut m = plan::span(&g).max(16).next_power_of_two();
            while m < 2 * (g.out_len + k) && m <= 1 << 18 {
                let conv = FftConv::with_plan(&g, &w, engine, m, Isa::detect());
                let est = plan::price(&g, engine, plan::span(&g), m).seconds;
                line += &format!("  {engine:?} M={m:6} est {:8.3} ms:", est * 1e3);
                for threads in [1, 2] {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    let scratch = Scratch::new(threads, conv.scratch_per_thread());
                    let mut y = vec![0.0; g.output_elems];
                    let best = pool.install(|| {
                        (0..7)
                            .map(|_| {
                                let t = Instant::now();
                                conv.run(&g, &x, Some(&b), &mut y, &scratch);
                                t.elapsed().as_secs_f64()
                            })
                            .fold(f64::INFINITY, f64::min)
                    });
                    line += &format!(" {threads}T {:8.3} ms", best * 1e3);
                }
                line += "\n";
                m *= 2;
            }
        }
        print!("{line}");
    }
}

/// The lanes engine's tiles follow the alignment of `x` and `y`: every
/// offset of both within a cache line gives the same result.
#[cfg(target_arch = "x86_64")]
#[test]
fn lanes_result_does_not_depend_on_alignment() {
    if !lanes::runs_on(Backend::detect()) {
        return;
    }
    let mut rng = Rng::new(19);
    let p = params(2, 35, 256, 40, (39, 0), 1);
    let g = p.geometry().unwrap();
    let (x, w, bias) = data(&mut rng, &p);
    let conv = FftConv::with_plan(&g, &w, plan::Engine::Lanes, 128, Isa::detect());
    let scratch = Scratch::new(rayon::current_num_threads(), conv.scratch_per_thread());
    let want = reference::conv1d_f32(&p, &x, &w, Some(&bias)).unwrap();
    let tol = lanes_tolerance(&p, &x, &w, Some(&bias));
    let mut first: Option<Vec<f32>> = None;
    for offset in 0..16 {
        let mut x_buf = vec![0.0; x.len() + 16];
        x_buf[offset..][..x.len()].copy_from_slice(&x);
        let mut y_buf = vec![f32::NAN; g.output_elems + 16];
        let y = &mut y_buf[15 - offset..][..g.output_elems];
        conv.run(&g, &x_buf[offset..][..x.len()], Some(&bias), y, &scratch);
        assert_close(y, &want, &tol, &format!("offset {offset}"));
        match &first {
            None => first = Some(y.to_vec()),
            Some(f) => assert_eq!(f, y, "offset {offset}"),
        }
    }
}
