use super::*;
use crate::reference;
use crate::test_support::{conv_params as params, thinned_under_emulation, ReluSink, Rng};
use crate::{Algorithm, Choice, Conv1dParams, KernelError, PreparedConv1d};

/// The accuracy the algorithm promises: absolute, against the reference.
const ATOL: f32 = 1e-4;

fn prepare(max: &Conv1dParams, w: &[f32]) -> PreparedConv1d {
    let conv = PreparedConv1d::new(max, w, Choice::Force(Algorithm::FftGemm)).unwrap();
    assert_eq!(conv.algorithm(), Algorithm::FftGemm);
    assert!(conv.reads_weights());
    conv
}

/// `conv` at `p` into a NaN-filled buffer, so unwritten outputs fail.
fn run(
    conv: &PreparedConv1d,
    p: &Conv1dParams,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let mut y = vec![f32::NAN; p.output_elems().unwrap()];
    let scratch = Scratch::sized(
        rayon::current_num_threads(),
        conv.scratch_per_thread(),
        conv.shared_scratch(),
    );
    conv.run(p, x, Some(w), bias, &mut y, &scratch).unwrap();
    y
}

fn assert_close(got: &[f32], want: &[f32], atol: f32, context: &str) {
    assert_eq!(got.len(), want.len(), "{context}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= atol,
            "{context}: y[{i}] = {g}, reference {w}"
        );
    }
}

/// Dense, grouped, dilated; small and wide channels; K from 1 to 31;
/// "same", causal, one-sided and no padding; lengths shorter and longer
/// than one tile of blocks.
fn grid() -> Vec<Conv1dParams> {
    let mut out = Vec::new();
    for &(cin, cout, groups) in &[(1, 1, 1), (3, 5, 1), (16, 16, 1), (40, 24, 1), (8, 12, 4)] {
        for &k in &[1, 3, 5, 11, 31] {
            for &n in &[1, 23, 300, 1100] {
                for &(pl, pr) in &[(k / 2, k / 2), (k - 1, 0), (0, 0), (2, 7)] {
                    let p = params(1, (cin, cout, groups), n, k, 1, (pl, pr), 1);
                    if p.validate().is_ok() {
                        out.push(p);
                    }
                }
            }
        }
    }
    out.push(params(2, (6, 10, 2), 97, 4, 1, (3, 3), 3));
    out.push(params(3, (12, 7, 1), 64, 7, 1, (6, 0), 2));
    out
}

#[test]
fn grid_matches_reference_on_random_inputs() {
    let mut rng = Rng::new(7);
    for p in thinned_under_emulation(grid()) {
        let w = rng.vec(p.weight_elems(), -1.0, 1.0);
        let bias = rng.vec(p.bias_elems(), -1.0, 1.0);
        let x = rng.vec(p.input_elems(), -1.0, 1.0);
        let conv = prepare(&p, &w);
        for bias in [None, Some(&bias[..])] {
            let want = reference::conv1d_f32(&p, &x, &w, bias).unwrap();
            let got = run(&conv, &p, &x, &w, bias);
            assert_close(
                &got,
                &want,
                ATOL,
                &format!("{p:?}, bias {}", bias.is_some()),
            );
        }
    }
}

#[test]
fn structured_inputs_match_reference() {
    // Ones and ramps: large, correlated sums where cancellation in the
    // transforms would show.
    for p in [
        params(1, (16, 16, 1), 300, 11, 1, (5, 5), 1),
        params(1, (40, 24, 1), 1100, 5, 1, (4, 0), 1),
        params(2, (8, 12, 4), 77, 3, 1, (1, 1), 1),
    ] {
        let ones = |n| vec![1.0f32; n];
        let ramp = |n: usize, modulus: usize, scale: f32| {
            (0..n)
                .map(|i| (i % modulus) as f32 * scale)
                .collect::<Vec<_>>()
        };
        let inputs = [
            ("ones", ones(p.input_elems()), ones(p.weight_elems())),
            (
                "ramps",
                ramp(p.input_elems(), 64, 1.0 / 64.0),
                ramp(p.weight_elems(), 7, 1.0 / 7.0),
            ),
        ];
        let bias = ramp(p.bias_elems(), 5, 1.0);
        for (kind, x, w) in &inputs {
            let conv = prepare(&p, w);
            for bias in [None, Some(&bias[..])] {
                let want = reference::conv1d_f32(&p, x, w, bias).unwrap();
                // Outputs here reach cin · K: the tolerance is relative to
                // the largest, as the DFT's error is.
                let scale = want.iter().fold(1.0f32, |a, v| a.max(v.abs()));
                let got = run(&conv, &p, x, w, bias);
                assert_close(&got, &want, ATOL * scale, &format!("{kind}: {p:?}"));
            }
        }
    }
}

#[test]
fn conv_stack_layer_within_1e4() {
    // The shape the algorithm is for, at a shorter length (shorter still
    // under emulation, still several tiles and a partial one): 250
    // channels, K = 11, "same" padding, PyTorch's default init range.
    let mut rng = Rng::new(11);
    let len = if crate::test_support::emulated() {
        300
    } else {
        700
    };
    let p = params(1, (250, 250, 1), len, 11, 1, (5, 5), 1);
    let bound = 1.0 / ((250 * 11) as f32).sqrt();
    let w = rng.vec(p.weight_elems(), -bound, bound);
    let bias = rng.vec(p.bias_elems(), -bound, bound);
    let x = rng.vec(p.input_elems(), -1.0, 1.0);
    let conv = prepare(&p, &w);
    let want = reference::conv1d_f32(&p, &x, &w, Some(&bias)).unwrap();
    assert_close(
        &run(&conv, &p, &x, &w, Some(&bias)),
        &want,
        ATOL,
        "conv stack",
    );
}

#[test]
fn prepared_memory_is_the_transforms_only() {
    // Spectra kept at prepare would take L / K = 32 / 11 times the
    // weights, packed weights kept at prepare the weights again (beside
    // the blob's copy while the delegate prepares). Prepare keeps only
    // the transform matrices; each call packs the weights into the
    // scratch's shared region, one layer's weights plus the last panel's
    // padding, which a stack of convs shares.
    for (c, k) in [(250, 11), (64, 5), (7, 3)] {
        let p = params(1, (c, c, 1), 4096, k, 1, (k / 2, k / 2), 1);
        let w = vec![0.5; p.weight_elems()];
        let conv = prepare(&p, &w);
        assert!(
            conv.prepared_bytes() <= 4 * (2 * 128 * 128 + 128 * 96),
            "{c} channels, K = {k}: {} prepared bytes",
            conv.prepared_bytes()
        );
        let weights = p.weight_elems();
        let shared = conv.shared_scratch();
        assert!(
            shared >= weights && shared <= weights + weights / 20 + 5 * c * k + 64,
            "{c} channels, K = {k}: {shared} shared floats for {weights} weights"
        );
    }
}

#[test]
fn refuses_a_call_without_weights_or_shared_scratch() {
    let p = params(1, (8, 8, 1), 64, 3, 1, (1, 1), 1);
    let w = vec![0.5; p.weight_elems()];
    let conv = prepare(&p, &w);
    let x = vec![1.0; p.input_elems()];
    let mut y = vec![0.0; p.output_elems().unwrap()];
    let scratch = Scratch::sized(
        rayon::current_num_threads(),
        conv.scratch_per_thread(),
        conv.shared_scratch(),
    );
    assert!(matches!(
        conv.run(&p, &x, None, None, &mut y, &scratch),
        Err(KernelError::MissingWeights)
    ));
    let no_shared = Scratch::new(rayon::current_num_threads(), conv.scratch_per_thread());
    assert!(matches!(
        conv.run(&p, &x, Some(&w), None, &mut y, &no_shared),
        Err(KernelError::BufferLen {
            which: "shared scratch",
            ..
        })
    ));
}

#[test]
fn every_length_and_backend_matches_reference() {
    let mut rng = Rng::new(3);
    for p in [
        params(1, (24, 20, 1), 500, 11, 1, (5, 5), 1),
        params(2, (9, 6, 3), 150, 3, 1, (0, 2), 2),
    ] {
        let g = p.geometry().unwrap();
        let w = rng.vec(p.weight_elems(), -1.0, 1.0);
        let bias = rng.vec(p.bias_elems(), -1.0, 1.0);
        let x = rng.vec(p.input_elems(), -1.0, 1.0);
        let want = reference::conv1d_f32(&p, &x, &w, Some(&bias)).unwrap();
        for isa in Isa::all_available() {
            let backend = isa.backend();
            for l in lengths(&g, backend) {
                let conv = FftGemmConv::with(&g, isa, l);
                assert_eq!(conv.length(), l);
                let scratch = Scratch::sized(
                    rayon::current_num_threads(),
                    conv.scratch_per_thread(),
                    conv.shared_scratch(p.groups),
                );
                let mut y = vec![f32::NAN; g.output_elems];
                conv.run(&g, &x, &w, Some(&bias), &mut y, &scratch);
                assert_close(&y, &want, ATOL, &format!("{backend:?}, L = {l}: {p:?}"));
            }
        }
    }
}

#[test]
fn shorter_calls_than_prepared_match_reference() {
    let mut rng = Rng::new(5);
    let max = params(3, (10, 14, 1), 900, 9, 1, (4, 4), 1);
    let w = rng.vec(max.weight_elems(), -1.0, 1.0);
    let conv = prepare(&max, &w);
    // Several tiles per panel (weights packed once per call into the shared
    // region) and one (each tile packs its panels), batch 0 and length 1.
    for (batch, in_len) in [(3, 900), (1, 17), (2, 500), (1, 700), (0, 10), (1, 1)] {
        let p = Conv1dParams {
            batch,
            in_len,
            ..max
        };
        let x = rng.vec(p.input_elems(), -1.0, 1.0);
        let want = reference::conv1d_f32(&p, &x, &w, None).unwrap();
        assert_close(
            &run(&conv, &p, &x, &w, None),
            &want,
            ATOL,
            &format!("{p:?}"),
        );
    }
}

#[test]
fn result_does_not_depend_on_pool_size() {
    let mut rng = Rng::new(9);
    let p = params(2, (32, 40, 1), 2000, 11, 1, (5, 5), 1);
    let w = rng.vec(p.weight_elems(), -1.0, 1.0);
    let x = rng.vec(p.input_elems(), -1.0, 1.0);
    let conv = prepare(&p, &w);
    let run_on = |threads| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| run(&conv, &p, &x, &w, None))
    };
    let single = run_on(1);
    for threads in [2, 3, 16] {
        assert_eq!(run_on(threads), single, "{threads} threads");
    }
}

#[test]
fn refuses_stride_and_long_filters_at_prepare() {
    for p in [
        params(1, (4, 4, 1), 64, 3, 2, (1, 1), 1),
        params(1, (4, 4, 1), 400, 98, 1, (0, 0), 1),
        params(1, (4, 4, 1), 400, 20, 1, (0, 0), 6),
        // Input spectra past the scratch bound at every length, on every
        // backend (NEON's 8 blocks a tile take 1 << 14 channels at L = 16).
        params(1, (1 << 15, 1, 1), 64, 3, 1, (1, 1), 1),
    ] {
        assert_eq!(
            PreparedConv1d::new(
                &p,
                &vec![0.0; p.weight_elems()],
                Choice::Force(Algorithm::FftGemm)
            )
            .err(),
            Some(KernelError::NotApplicable {
                algorithm: "fft_gemm"
            }),
            "{p:?}"
        );
    }
    // The longest reach it takes.
    let p = params(1, (2, 2, 1), 400, 97, 1, (0, 0), 1);
    assert!(applies(&p.geometry().unwrap(), Backend::detect()));
}

/// The algorithm [`Choice::Auto`] prepares for `p` on one thread: the shapes
/// below were measured and the model fitted there (on more threads the
/// GEMM's better scaling moves some to it, `cost::on_threads`).
fn auto_on_one_thread(p: &Conv1dParams) -> Algorithm {
    crate::par::install(&crate::par::Serial, || {
        PreparedConv1d::new(p, &vec![0.0; p.weight_elems()], Choice::Auto)
            .unwrap()
            .algorithm()
    })
}

#[test]
fn cost_model_prefers_it_for_wide_dense_convs_with_long_filters_only() {
    let choose = auto_on_one_thread;
    // The conv stack layer.
    assert_eq!(
        choose(&params(1, (250, 250, 1), 4096, 11, 1, (5, 5), 1)),
        Algorithm::FftGemm
    );
    // Short filters and few channels stay with the GEMM.
    assert_eq!(
        choose(&params(1, (256, 256, 1), 4096, 3, 1, (1, 1), 1)),
        Algorithm::Gemm
    );
    assert_eq!(
        choose(&params(1, (4, 4, 1), 4096, 11, 1, (5, 5), 1)),
        Algorithm::Gemm
    );
    // Depthwise keeps its own kernels.
    assert_ne!(
        choose(&params(1, (64, 64, 64), 4096, 11, 1, (5, 5), 1)),
        Algorithm::FftGemm
    );
}

#[test]
fn transform_matrices_invert_each_other() {
    // G · F restricted to the block's outputs is the identity on the first
    // M samples when the filter is a unit impulse: check through a
    // one-channel conv with w = [1].
    let p = params(1, (1, 1, 1), 100, 1, 1, (0, 0), 1);
    let x: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
    let conv = prepare(&p, &[1.0]);
    assert_close(&run(&conv, &p, &x, &[1.0], None), &x, 1e-6, "identity");
}

/// Release-only timing of the conv stack layer against the GEMM:
/// `cargo test --release -p rustconv-kernels calibrate_fft_gemm -- --ignored --nocapture`.
#[test]
#[ignore = "timing; run by hand in release"]
fn calibrate_fft_gemm() {
    use std::time::Instant;
    for &(c, k, n) in &[
        (250, 11, 4096),
        (256, 5, 4096),
        (128, 7, 4096),
        (64, 11, 4096),
        (32, 11, 4096),
        (512, 3, 2048),
        (250, 11, 512),
    ] {
        let p = params(1, (c, c, 1), n, k, 1, (k / 2, k / 2), 1);
        let mut rng = Rng::new(1);
        let w = rng.vec(p.weight_elems(), -0.1, 0.1);
        let x = rng.vec(p.input_elems(), -1.0, 1.0);
        let mut line = format!("C={c} K={k} N={n}:");
        for a in [Algorithm::Gemm, Algorithm::FftGemm] {
            let conv = PreparedConv1d::new(&p, &w, Choice::Force(a)).unwrap();
            let scratch = Scratch::sized(
                rayon::current_num_threads(),
                conv.scratch_per_thread(),
                conv.shared_scratch(),
            );
            let mut y = vec![0.0; p.output_elems().unwrap()];
            let mut best = f64::INFINITY;
            for _ in 0..5 {
                let t = Instant::now();
                conv.run(&p, &x, Some(&w), None, &mut y, &scratch).unwrap();
                best = best.min(t.elapsed().as_secs_f64());
            }
            let est = crate::estimate_cost(a, &p).unwrap();
            line += &format!("  {} {:.2} ms (est {:.2})", a.name(), best * 1e3, est * 1e3);
        }
        println!("{line}");
    }
}

/// Release-only sweep of channel counts, filter lengths and output lengths
/// (dense, stride 1, "same" padding, with bias), the GEMM against this
/// algorithm, one thread (timed by the GEMM's `gflops`; `GEMM_REPS` calls):
/// ms of each and the cost model's estimates, for the small-channel term of
/// [`cost`]:
/// `cargo test --release -p rustconv-kernels calibrate_fft_gemm_channels -- --ignored --nocapture`.
#[test]
#[ignore = "timing; run by hand in release"]
fn calibrate_fft_gemm_channels() {
    use crate::conv1d::gemm::tests::gflops;
    for &c in &[8, 16, 32, 64, 128, 256] {
        for &k in &[5, 7, 11] {
            for &n in &[200, 800, 3200, 12800] {
                if c * c * k * n > 256 * 256 * 11 * 3200 {
                    continue;
                }
                let p = params(1, (c, c, 1), n, k, 1, (k / 2, k / 2), 1);
                let flops = 2.0 * crate::conv1d::cost::direct_macs(&p.geometry().unwrap());
                let mut line = format!("C={c} K={k} N={n}:");
                for a in [Algorithm::Gemm, Algorithm::FftGemm] {
                    let (rates, est) = gflops(&p, a, &[1]);
                    let ms = flops / rates[0] / 1e6;
                    line += &format!(" {} {ms:.4} est {:.4}", a.name(), est * 1e3);
                }
                println!("{line}");
            }
        }
    }
}

#[test]
fn fused_epilogue_gets_every_output_once_in_rows() {
    use crate::fused::{RowsIn, RowsOut};
    let mut rng = Rng::new(21);
    let p = params(2, (20, 30, 1), 1500, 11, 1, (5, 5), 1);
    let w = rng.vec(p.weight_elems(), -1.0, 1.0);
    let bias = rng.vec(p.bias_elems(), -1.0, 1.0);
    let x = rng.vec(p.input_elems(), -1.0, 1.0);
    let conv = prepare(&p, &w);
    assert!(conv.fuses_output() && !conv.fuses_input());
    let out_len = p.out_len().unwrap();
    let sink = ReluSink::new(p.output_elems().unwrap(), out_len);
    let scratch = Scratch::sized(
        rayon::current_num_threads(),
        conv.rows_scratch_per_thread(0, 0),
        conv.shared_scratch(),
    );
    conv.run_rows(
        &p,
        RowsIn::Slice(&x),
        Some(&w),
        Some(&bias),
        RowsOut::Fused(&sink),
        0,
        0,
        &scratch,
    )
    .unwrap();
    let want: Vec<f32> = reference::conv1d_f32(&p, &x, &w, Some(&bias))
        .unwrap()
        .into_iter()
        .map(|v| v.max(0.0))
        .collect();
    assert_close(&sink.into_values(), &want, ATOL, "relu epilogue");
}

#[test]
fn depthwise_convs_keep_their_own_algorithms() {
    // The bench's conv matrix (causal depthwise) at every size: the cost
    // model never trades the depthwise kernels for this one.
    for c in [512, 2048] {
        for n in [64, 256, 1024, 2048, 4096, 16384] {
            for k in [4, 32, 128] {
                if k > n {
                    continue;
                }
                let p = params(1, (c, c, c), n, k, 1, (k - 1, 0), 1);
                let auto = PreparedConv1d::new(&p, &vec![0.0; p.weight_elems()], Choice::Auto)
                    .unwrap()
                    .algorithm();
                assert_ne!(auto, Algorithm::FftGemm, "{p:?}");
            }
        }
    }
}

#[test]
fn cost_model_keeps_narrow_groups_on_the_gemm() {
    // Shapes where one algorithm ran at least 1.4 times faster than the
    // other on both machines `SHORT_CHANNELS` was fitted on (one thread):
    // narrow groups on the GEMM (a HiFi-GAN's last stages), wide groups
    // with long filters on this algorithm; and Wav2Letter's conv stack
    // (250 channels, `K` = 11: 2.2 times, `calibrate_fft_gemm`).
    let gemm = [
        (16, 7, 12800),
        (16, 11, 3200),
        (32, 7, 3200),
        (32, 5, 12800),
        (64, 5, 800),
    ];
    let fft_gemm = [
        (128, 11, 3200),
        (250, 11, 4096),
        (256, 7, 800),
        (128, 7, 3200),
    ];
    for (shapes, want) in [
        (&gemm[..], Algorithm::Gemm),
        (&fft_gemm[..], Algorithm::FftGemm),
    ] {
        for &(c, k, n) in shapes {
            let p = params(1, (c, c, 1), n, k, 1, (k / 2, k / 2), 1);
            assert_eq!(auto_on_one_thread(&p), want, "C={c} K={k} N={n}");
        }
    }
}

#[test]
fn packed_panels_hold_each_filter_tap_by_tap() {
    // Full panels and the last, partial one, for every backend's block.
    let (cin, cout, taps) = (5, 13usize, 3);
    let w: Vec<f32> = (0..cout * cin * taps).map(|i| i as f32 + 1.0).collect();
    for isa in Isa::all_available() {
        let backend = isa.backend();
        let kernel = kernel::TileKernel::new(isa);
        let mr = kernel.block().mr;
        for pn in 0..cout.div_ceil(mr) {
            let mut panel = vec![f32::NAN; kernel::panel_len(cin, taps, kernel.block())];
            kernel.pack(&w, cin, taps, pn * mr, &mut panel);
            for k in 0..taps {
                for c in 0..cin {
                    for i in 0..mr {
                        let o = pn * mr + i;
                        let want = if o < cout {
                            w[(o * cin + c) * taps + k]
                        } else {
                            0.0
                        };
                        assert_eq!(
                            panel[(k * cin + c) * mr + i],
                            want,
                            "{backend:?} {o} {c} {k}"
                        );
                    }
                }
            }
        }
    }
}
