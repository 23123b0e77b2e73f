//! Conv weights and biases fed at run time (a model that reshapes its conv
//! weight outside the delegate hands it over as an input): every algorithm
//! and layout reads each call's weights, never something prepared at init
//! from stand-in values. The LFM2 short conv between its projections (the
//! channels-last prologue and epilogue walk), dense convs with an epilogue
//! (gemm, fft_gemm, the matrix-vector kernel on decode-sized calls), and a
//! streaming depthwise conv's decode steps.

use super::*;

/// Each algorithm the tests force, and automatic choice.
const ALGORITHMS: [&str; 6] = [
    "auto",
    "direct",
    "depthwise_simd",
    "fft",
    "gemm",
    "fft_gemm",
];

fn init_with(blob: &[u8], algorithm: &str) -> Delegate {
    let mut d = Delegate::default();
    d.add_compile_spec("conv1d_algorithm", algorithm.as_bytes());
    // SAFETY: every caller keeps `blob` alive and unmodified until `d` drops.
    d.init(unsafe { BlobBytes::new(blob.as_ptr(), blob.len()) })
        .unwrap();
    d
}

/// Two weight sets, so that a kernel that kept the first (or the zeros it
/// may have been prepared from) fails on the second.
fn weight_sets(n: usize) -> [Vec<f32>; 2] {
    [
        ramp(n, 0.1),
        (0..n).map(|i| ((i * 13 % 7) as f32 - 2.5) * 0.3).collect(),
    ]
}

/// The plan chose `algorithm` (or, where it cannot take a fed weight,
/// something else, saying why) and says the weights are fed.
fn check_plan(d: &Delegate, algorithm: &str) {
    let plan = d.plan().unwrap();
    let report = plan.report.join("\n");
    assert!(report.contains("weights fed at run time"), "{report}");
    if algorithm == "fft" {
        assert!(report.contains("fft does not apply"), "{report}");
    }
    for step in &plan.steps {
        assert_ne!(step.algorithm(), "fft", "{report}");
    }
}

// ---- LFM2's short conv, its weight an input --------------------------------

const KW: usize = 3;

/// transformers' `Lfm2ShortConv` between its projections, as the exporter
/// hands it over when the model computes `weight.squeeze(1).unsqueeze(1)`
/// outside the delegate: `bcx [1, N, 3D]` and `w [D, 1, K]` are inputs;
/// transpose -> chunk(3) -> `b * x` -> causal depthwise conv -> `c * y` ->
/// transpose -> `[1, N, D]`.
fn lfm2_fed_blob(d: usize, n_max: usize, kernels: &[i32]) -> Vec<u8> {
    let n = dynamic(n_max as i64);
    let dd = s(d as i64);
    let d = d as i64;
    build_blob_grouped(
        &[
            input("bcx", 0, &[s(1), n, s(3 * d)]),
            input("w", 1, &[dd, s(1), s(KW as i64)]),
            inter("bcx_t", &[s(1), s(3 * d), n]),
            inter("b", &[s(1), dd, n]),
            inter("c", &[s(1), dd, n]),
            inter("x", &[s(1), dd, n]),
            inter("bx", &[s(1), dd, n]),
            inter("y", &[s(1), dd, n]),
            inter("cy", &[s(1), dd, n]),
            output("out", 0, &[s(1), n, dd]),
        ],
        &[0, 1],
        &[9],
        &[
            N::Permute {
                input: 0,
                output: 2,
                perm: &[0, 2, 1],
            },
            N::Slice {
                input: 2,
                output: 3,
                dim: 1,
                start: 0,
                end: d,
            },
            N::Slice {
                input: 2,
                output: 4,
                dim: 1,
                start: d,
                end: 2 * d,
            },
            N::Slice {
                input: 2,
                output: 5,
                dim: 1,
                start: 2 * d,
                end: i64::MAX,
            },
            N::Binary {
                op: fb::BinaryOp::Mul,
                a: 3,
                b: 5,
                b_scalar: 0.0,
                output: 6,
            },
            N::Conv {
                input: 6,
                weight: 1,
                bias: -1,
                output: 7,
                stride: 1,
                pad: (KW as u32 - 1, 0),
                dilation: 1,
                groups: d as u32,
            },
            N::Binary {
                op: fb::BinaryOp::Mul,
                a: 4,
                b: 7,
                b_scalar: 0.0,
                output: 8,
            },
            N::Permute {
                input: 8,
                output: 9,
                perm: &[0, 2, 1],
            },
        ],
        kernels,
    )
}

fn lfm2_reference(d: usize, bcx: &[f32], w: &[f32], n: usize) -> Vec<f32> {
    let at = |t: usize, ch: usize| bcx[t * 3 * d + ch];
    let mut out = vec![0.0; n * d];
    for t in 0..n {
        for c in 0..d {
            let mut y = 0.0;
            for k in 0..KW {
                if let Some(ti) = (t + k).checked_sub(KW - 1) {
                    y += w[c * KW + k] * at(ti, c) * at(ti, 2 * d + c);
                }
            }
            out[t * d + c] = at(t, d + c) * y;
        }
    }
    out
}

#[test]
fn lfm2_short_conv_with_a_fed_weight_reads_it_at_every_call() {
    // Regression: the channels-last walk (prologue b * x and epilogue c * y
    // in its loops, taken from N = 32 on) read taps transposed at init from
    // zeros, so the output was off by its whole scale.
    let (d, n_max) = (40, 64);
    let fused_blob = lfm2_fed_blob(d, n_max, &[0; 8]);
    let unfused_blob = lfm2_fed_blob(d, n_max, &[-1; 8]);
    for algorithm in ALGORITHMS {
        for (grouping, blob) in [("fused", &fused_blob), ("unfused", &unfused_blob)] {
            let dg = init_with(blob, algorithm);
            check_plan(&dg, algorithm);
            let report = dg.plan().unwrap().report.join("\n");
            if algorithm == "fft" {
                // The FFT would apply to the shape, with constant weights.
                assert!(
                    report.contains("fft does not apply to a weight fed at run time"),
                    "{report}"
                );
            }
            if grouping == "fused" {
                assert_eq!(dg.plan().unwrap().steps.len(), 1, "{algorithm}");
            }
            for n in [1, 2, 4, 5, 17, 32, n_max] {
                let bcx = ramp(n * 3 * d, 0.05);
                for w in weight_sets(d * KW) {
                    let args = run_args(
                        &dg,
                        vec![
                            tensor(&[1, n as i32, 3 * d as i32], bcx.clone()),
                            tensor(&[d as i32, 1, KW as i32], w.clone()),
                        ],
                        vec![out_tensor(&[1, n_max as i32, d as i32])],
                    );
                    assert_eq!(args.0[2].sizes, vec![1, n as i32, d as i32]);
                    let want = lfm2_reference(d, &bcx, &w, n);
                    assert_close_ctx(
                        &args.0[2].data[..n * d],
                        &want,
                        &format!("{algorithm}, {grouping}, N = {n}"),
                    );
                }
            }
        }
    }
}

fn run_args(d: &Delegate, inputs: Vec<T>, outputs: Vec<T>) -> Args {
    let mut args = Args(inputs.into_iter().chain(outputs).collect());
    d.execute(&mut args).unwrap();
    args
}

fn assert_close_ctx(got: &[f32], want: &[f32], ctx: &str) {
    assert_eq!(got.len(), want.len(), "{ctx}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
            "{ctx}: element {i}: got {g}, want {w}"
        );
    }
}

// ---- dense convs, weight and bias inputs, an epilogue -----------------------

/// `x [1, CI, <=N]`, `w [CO, CI / groups, K]` and `b [CO]` inputs;
/// `relu(conv(x, w, b))` in one kernel.
fn dense_fed_blob(ci: usize, co: usize, groups: usize, k: usize, n_max: usize) -> Vec<u8> {
    let n = dynamic(n_max as i64);
    build_blob_grouped(
        &[
            input("x", 0, &[s(1), s(ci as i64), n]),
            input(
                "w",
                1,
                &[s(co as i64), s((ci / groups) as i64), s(k as i64)],
            ),
            input("b", 2, &[s(co as i64)]),
            inter("h", &[s(1), s(co as i64), n]),
            output("y", 0, &[s(1), s(co as i64), n]),
        ],
        &[0, 1, 2],
        &[4],
        &[
            N::Conv {
                input: 0,
                weight: 1,
                bias: 2,
                output: 3,
                stride: 1,
                pad: (k as u32 - 1, 0),
                dilation: 1,
                groups: groups as u32,
            },
            N::Unary {
                op: fb::UnaryOp::Relu,
                input: 3,
                output: 4,
            },
        ],
        &[0, 0],
    )
}

#[test]
fn dense_and_grouped_convs_with_fed_weights_and_bias_read_them_at_every_call() {
    // Decode-sized calls (1 to 4 outputs: the matrix-vector kernel) and long
    // ones, with the ReLU fused into the conv's loops where it can be.
    for (ci, co, groups, k, n_max) in [(24, 20, 1, 5, 96), (12, 8, 4, 3, 40)] {
        let blob = dense_fed_blob(ci, co, groups, k, n_max);
        for algorithm in ALGORITHMS {
            let dg = init_with(&blob, algorithm);
            check_plan(&dg, algorithm);
            for n in [1, 3, 4, 5, n_max] {
                let x = ramp(ci * n, 0.07);
                let p = Conv1dParams {
                    batch: 1,
                    in_channels: ci,
                    out_channels: co,
                    in_len: n,
                    kernel_size: k,
                    stride: 1,
                    pad_left: k - 1,
                    pad_right: 0,
                    dilation: 1,
                    groups,
                };
                let [w0, w1] = weight_sets(co * ci / groups * k);
                for (w, b) in [(w0, ramp(co, 0.2)), (w1, ramp(co, -0.3))] {
                    let args = run_args(
                        &dg,
                        vec![
                            tensor(&[1, ci as i32, n as i32], x.clone()),
                            tensor(&[co as i32, (ci / groups) as i32, k as i32], w.clone()),
                            tensor(&[co as i32], b.clone()),
                        ],
                        vec![out_tensor(&[1, co as i32, n_max as i32])],
                    );
                    let want: Vec<f32> = reference::conv1d_f32(&p, &x, &w, Some(&b))
                        .unwrap()
                        .into_iter()
                        .map(|v| v.max(0.0))
                        .collect();
                    assert_close_ctx(
                        &args.0[3].data[..co * n],
                        &want,
                        &format!("{algorithm}, ci {ci} co {co} groups {groups}, N = {n}"),
                    );
                }
            }
        }
    }
}

// ---- a streaming depthwise conv's decode steps ------------------------------

/// x [1, C, <=8] and w [C, 1, 3] inputs; xs = cat([state, x]);
/// state <- xs[..., -2:]; y = dwconv(xs, w)
fn stream_fed_blob(c: usize) -> Vec<u8> {
    let n_max = 8;
    build_blob(
        &[
            input("x", 0, &[s(1), s(c as i64), dynamic(n_max)]),
            state("st", &[1, c as i64, 2], vec![0.0; c * 2], 3),
            inter("xs", &[s(1), s(c as i64), dynamic(n_max + 2)]),
            inter("upd", &[s(1), s(c as i64), s(2)]),
            input("w", 1, &[s(c as i64), s(1), s(KW as i64)]),
            output("y", 0, &[s(1), s(c as i64), dynamic(n_max)]),
        ],
        &[0, 4],
        &[5],
        &[
            N::Cat {
                inputs: &[1, 0],
                output: 2,
                dim: 2,
            },
            N::Slice {
                input: 2,
                output: 3,
                dim: 2,
                start: -2,
                end: i64::MAX,
            },
            N::Conv {
                input: 2,
                weight: 4,
                bias: -1,
                output: 5,
                stride: 1,
                pad: (0, 0),
                dilation: 1,
                groups: c as u32,
            },
        ],
    )
}

#[test]
fn decode_steps_of_a_streaming_conv_read_the_fed_weight() {
    // One token at a time: the column walk (stack buffers, stored
    // operands), each step with a different weight.
    let c = 70;
    let blob = stream_fed_blob(c);
    for algorithm in ALGORITHMS {
        let dg = init_with(&blob, algorithm);
        check_plan(&dg, algorithm);
        crate::state::request_reset();
        let n = 6;
        let x = ramp(c * n, 0.1);
        let mut history = vec![vec![0.0f32; 2]; c];
        for t in 0..n {
            let w = weight_sets(c * KW)[t % 2].clone();
            let xt: Vec<f32> = (0..c).map(|ch| x[ch * n + t]).collect();
            let args = run_args(
                &dg,
                vec![
                    tensor(&[1, c as i32, 1], xt.clone()),
                    tensor(&[c as i32, 1, KW as i32], w.clone()),
                ],
                vec![out_tensor(&[1, c as i32, 8])],
            );
            let want: Vec<f32> = (0..c)
                .map(|ch| {
                    let window = [history[ch][0], history[ch][1], xt[ch]];
                    (0..KW).map(|k| w[ch * KW + k] * window[k]).sum()
                })
                .collect();
            assert_close_ctx(
                &args.0[2].data[..c],
                &want,
                &format!("{algorithm}, step {t}"),
            );
            for ch in 0..c {
                history[ch] = vec![history[ch][1], xt[ch]];
            }
        }
    }
}
