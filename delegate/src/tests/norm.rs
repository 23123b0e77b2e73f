//! Normalisations inside fused kernels: `Reduce` nodes gathered by the
//! kernel's statistics pass before its main loop, the rest of the norm as
//! elementwise nodes reading them (a LayerNorm over a conv's channels
//! between two convs, wav2vec2's layout; GroupNorm over time; RMSNorm
//! before a pointwise conv), run against references computed here in f64,
//! with every grouping the exporter may record; and the groupings the
//! runtime must refuse.

use super::*;
use crate::fusion::StatisticsKind;

const C: usize = 6;
const C2: usize = 5;
const EPS: f32 = 1e-5;
/// The input's length bound, and the two convs' outputs' (K 4 stride 2,
/// then K 3 stride 2).
const NX: usize = 40;
const N1: usize = (NX - 4) / 2 + 1;
const N2: usize = (N1 - 3) / 2 + 1;

fn w1() -> Vec<f32> {
    ramp(C * 4, 0.3)
}
fn b1() -> Vec<f32> {
    ramp(C, 0.7)
}
fn w2() -> Vec<f32> {
    ramp(C2 * C * 3, 0.05)
}
fn gamma() -> Vec<f32> {
    (0..C).map(|c| 0.5 + 0.25 * c as f32).collect()
}
fn beta() -> Vec<f32> {
    (0..C).map(|c| 0.1 * c as f32 - 0.2).collect()
}

fn conv(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    cin: usize,
    cout: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    let p = Conv1dParams {
        batch: 1,
        in_channels: cin,
        out_channels: cout,
        in_len: n,
        kernel_size: k,
        stride: 2,
        pad_left: 0,
        pad_right: 0,
        dilation: 1,
        groups: 1,
    };
    reference::conv1d_f32(&p, x, w, bias).unwrap()
}

/// Mean and population variance of `v`, in f64.
fn moments(v: impl Iterator<Item = f32> + Clone) -> (f64, f64) {
    let n = v.clone().count() as f64;
    let mean = v.clone().map(f64::from).sum::<f64>() / n;
    let var = v.map(|x| (f64::from(x) - mean).powi(2)).sum::<f64>() / n;
    (mean, var)
}

/// The conv stack with a norm between: conv1 -> norm -> tanh -> conv2,
/// `layer`: LayerNorm over the channels per time step, else GroupNorm of
/// one group per channel (over time).
fn stack_reference(x: &[f32], n: usize, layer: bool) -> Vec<f32> {
    let n1 = (n - 4) / 2 + 1;
    let y1 = conv(x, &w1(), Some(&b1()), 1, C, 4, n);
    let (g, b) = (gamma(), beta());
    let mut h = vec![0.0; C * n1];
    for c in 0..C {
        for t in 0..n1 {
            let (mean, var) = if layer {
                moments((0..C).map(|k| y1[k * n1 + t]))
            } else {
                moments((0..n1).map(|k| y1[c * n1 + k]))
            };
            let z = (f64::from(y1[c * n1 + t]) - mean) / (var + f64::from(EPS)).sqrt();
            h[c * n1 + t] = (z * f64::from(g[c]) + f64::from(b[c])).tanh() as f32;
        }
    }
    conv(&h, &w2(), None, C, C2, 3, n1)
}

fn nodes_conv1() -> N {
    N::Conv {
        input: 0,
        weight: 1,
        bias: 2,
        output: 3,
        stride: 2,
        pad: (0, 0),
        dilation: 1,
        groups: 1,
    }
}

fn binary(op: fb::BinaryOp, a: i32, b: i32, b_scalar: f32, output: u32) -> N {
    N::Binary {
        op,
        a,
        b,
        b_scalar,
        output,
    }
}

/// wav2vec2's `Wav2Vec2LayerNormConvLayer` then the next conv: `x [1, 1,
/// n]` -> conv1 -> transpose -> LayerNorm over the channels (mean and
/// variance as `Reduce` nodes, the rest elementwise) -> transpose -> tanh
/// -> conv2.
fn layer_norm_stack(kernels: &[i32]) -> Vec<u8> {
    let (n, n1, n2) = (dynamic(NX as i64), dynamic(N1 as i64), dynamic(N2 as i64));
    let c = s(C as i64);
    build_blob_grouped(
        &[
            input("x", 0, &[s(1), s(1), n]),
            constant("w1", &[C as i64, 1, 4], w1()),
            constant("b1", &[C as i64], b1()),
            inter("y1", &[s(1), c, n1]),
            inter("p1", &[s(1), n1, c]),
            inter("mean", &[s(1), n1, s(1)]),
            inter("var", &[s(1), n1, s(1)]),
            inter("d", &[s(1), n1, c]),
            inter("ve", &[s(1), n1, s(1)]),
            inter("r", &[s(1), n1, s(1)]),
            inter("nrm", &[s(1), n1, c]),
            constant("gamma", &[C as i64], gamma()),
            inter("nw", &[s(1), n1, c]),
            constant("beta", &[C as i64], beta()),
            inter("nb", &[s(1), n1, c]),
            inter("p2", &[s(1), c, n1]),
            inter("act", &[s(1), c, n1]),
            constant("w2", &[C2 as i64, C as i64, 3], w2()),
            output("y2", 0, &[s(1), s(C2 as i64), n2]),
        ],
        &[0],
        &[18],
        &[
            nodes_conv1(),
            N::Permute {
                input: 3,
                output: 4,
                perm: &[0, 2, 1],
            },
            N::Reduce {
                op: fb::ReduceOp::Mean,
                input: 4,
                output: 5,
                dims: &[2],
            },
            N::Reduce {
                op: fb::ReduceOp::Var,
                input: 4,
                output: 6,
                dims: &[2],
            },
            binary(fb::BinaryOp::Sub, 4, 5, 0.0, 7),
            binary(fb::BinaryOp::Add, 6, -1, EPS, 8),
            N::Unary {
                op: fb::UnaryOp::Rsqrt,
                input: 8,
                output: 9,
            },
            binary(fb::BinaryOp::Mul, 7, 9, 0.0, 10),
            binary(fb::BinaryOp::Mul, 10, 11, 0.0, 12),
            binary(fb::BinaryOp::Add, 12, 13, 0.0, 14),
            N::Permute {
                input: 14,
                output: 15,
                perm: &[0, 2, 1],
            },
            N::Unary {
                op: fb::UnaryOp::Tanh,
                input: 15,
                output: 16,
            },
            N::Conv {
                input: 16,
                weight: 17,
                bias: -1,
                output: 18,
                stride: 2,
                pad: (0, 0),
                dilation: 1,
                groups: 1,
            },
        ],
        kernels,
    )
}

/// wav2vec2's `Wav2Vec2GroupNormConvLayer` (`GroupNorm(C, C)`: statistics
/// per channel over the whole sequence) then the next conv.
fn group_norm_stack(kernels: &[i32]) -> Vec<u8> {
    let (n, n1, n2) = (dynamic(NX as i64), dynamic(N1 as i64), dynamic(N2 as i64));
    let c = s(C as i64);
    build_blob_grouped(
        &[
            input("x", 0, &[s(1), s(1), n]),
            constant("w1", &[C as i64, 1, 4], w1()),
            constant("b1", &[C as i64], b1()),
            inter("y1", &[s(1), c, n1]),
            inter("mean", &[s(1), c, s(1)]),
            inter("var", &[s(1), c, s(1)]),
            inter("d", &[s(1), c, n1]),
            inter("ve", &[s(1), c, s(1)]),
            inter("r", &[s(1), c, s(1)]),
            inter("nrm", &[s(1), c, n1]),
            constant("gamma", &[C as i64, 1], gamma()),
            inter("nw", &[s(1), c, n1]),
            constant("beta", &[C as i64, 1], beta()),
            inter("nb", &[s(1), c, n1]),
            inter("act", &[s(1), c, n1]),
            constant("w2", &[C2 as i64, C as i64, 3], w2()),
            output("y2", 0, &[s(1), s(C2 as i64), n2]),
        ],
        &[0],
        &[16],
        &[
            nodes_conv1(),
            N::Reduce {
                op: fb::ReduceOp::Var,
                input: 3,
                output: 5,
                dims: &[2],
            },
            N::Reduce {
                op: fb::ReduceOp::Mean,
                input: 3,
                output: 4,
                dims: &[2],
            },
            binary(fb::BinaryOp::Sub, 3, 4, 0.0, 6),
            binary(fb::BinaryOp::Add, 5, -1, EPS, 7),
            N::Unary {
                op: fb::UnaryOp::Rsqrt,
                input: 7,
                output: 8,
            },
            binary(fb::BinaryOp::Mul, 6, 8, 0.0, 9),
            binary(fb::BinaryOp::Mul, 9, 10, 0.0, 11),
            binary(fb::BinaryOp::Add, 11, 12, 0.0, 13),
            N::Unary {
                op: fb::UnaryOp::Tanh,
                input: 13,
                output: 14,
            },
            N::Conv {
                input: 14,
                weight: 15,
                bias: -1,
                output: 16,
                stride: 2,
                pad: (0, 0),
                dilation: 1,
                groups: 1,
            },
        ],
        kernels,
    )
}

fn run_stack(d: &Delegate, n: usize) -> Vec<f32> {
    let x = ramp(n, 0.11);
    let mut args = Args(vec![
        tensor(&[1, 1, n as i32], x),
        out_tensor(&[1, C2 as i32, N2 as i32]),
    ]);
    d.execute(&mut args).unwrap();
    let n2 = ((n - 4) / 2 + 1 - 3) / 2 + 1;
    assert_eq!(args.0[1].sizes, [1, C2 as i32, n2 as i32]);
    args.0[1].data[..C2 * n2].to_vec()
}

fn check_stack(blob: &[u8], layer: bool, what: &str) -> Delegate {
    let d = init(blob).unwrap_or_else(|e| panic!("{what}: {e}"));
    for n in [10, 23, NX] {
        let x = ramp(n, 0.11);
        let got = run_stack(&d, n);
        let want = stack_reference(&x, n, layer);
        let scale = want.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-4 * scale,
                "{what}, n = {n}: element {i}: got {g}, want {w} (scale {scale})"
            );
        }
    }
    d
}

/// The norm in the next conv's prologue (its statistics read the first
/// conv's output through the transpose: columns), with the transpose
/// stored by the first conv instead (rows), and every node its own kernel.
#[test]
fn layer_norm_over_a_convs_channels_runs_in_the_next_convs_kernel() {
    let in_prologue = layer_norm_stack(&[0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
    let d = check_stack(&in_prologue, true, "in the prologue");
    let plan = d.plan().unwrap();
    assert_eq!(plan.steps.len(), 2, "{:?}", plan.steps);
    let step = &plan.steps[1];
    // Mean and var in one walk, then rsqrt(var + eps) once per time step.
    assert_eq!(step.statistics.len(), 3, "{:?}", step.statistics);
    assert_eq!(step.statistics[0].values().len(), 2);
    let summary = step.fusion_summary();
    assert!(
        summary.starts_with(
            ", statistics first: mean and var over dim 2 (then add, rsqrt once per statistic)"
        ),
        "{summary}"
    );
    let ops: Vec<&str> = step.absorbed.iter().map(|a| a.op).collect();
    assert!(ops.contains(&"mean") && ops.contains(&"var"), "{ops:?}");
    // The statistics are stored, [1, N1, 1] each, and nothing else between
    // the convs is but the first conv's output (and the staged input of a
    // conv that cannot compute its prologue in its loops).
    let stored = |name: &str| {
        let v = plan.values.iter().position(|v| v.name == name).unwrap();
        matches!(plan.locations[v], Location::Arena(_))
    };
    assert!(stored("mean") && stored("var") && stored("y1"));
    assert!(stored("ve") && stored("r"), "derived statistics");
    assert!(!stored("d") && !stored("nrm") && !stored("p1"));
    assert!(plan
        .report
        .iter()
        .any(|l| l.contains("statistics first: mean and var over dim 2")));

    let transposed_store = layer_norm_stack(&[0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
    let d = check_stack(&transposed_store, true, "after a transposed store");
    assert!(d.plan().unwrap().steps[1].statistics.len() == 3);
    check_stack(&layer_norm_stack(&[-1; 13]), true, "unfused");
}

#[test]
fn group_norm_over_time_runs_in_the_next_convs_kernel() {
    let blob = group_norm_stack(&[0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
    let d = check_stack(&blob, false, "fused");
    let step = &d.plan().unwrap().steps[1];
    assert_eq!(step.statistics.len(), 3);
    let StatisticsKind::Reduce { outputs, .. } = &step.statistics[0].kind else {
        panic!("{:?}", step.statistics)
    };
    let mut ops: Vec<_> = outputs.iter().map(|o| o.0.name()).collect();
    ops.sort_unstable();
    assert_eq!(ops, ["mean", "var"]);
    check_stack(&group_norm_stack(&[-1; 11]), false, "unfused");
}

/// transformers' `Lfm2RMSNorm` / `nn.RMSNorm` as the edge dialect writes
/// it (`x * rsqrt(mean(x * x) + eps) * w`) over a `[1, N, C]` input, then
/// a pointwise conv reading it through a transpose; one kernel, and the
/// normalised value also returned by a pass kernel.
#[test]
fn rms_norm_of_a_projection_is_a_pointwise_convs_prologue() {
    let n = dynamic(NX as i64);
    let c = s(C as i64);
    let blob = |kernels: &[i32], with_pass: bool| {
        let mut values = vec![
            input("h", 0, &[s(1), n, c]),
            inter("sq", &[s(1), n, c]),
            inter("ms", &[s(1), n, s(1)]),
            inter("a", &[s(1), n, s(1)]),
            inter("r", &[s(1), n, s(1)]),
            inter("hn", &[s(1), n, c]),
            constant("gamma", &[C as i64], gamma()),
            inter("hw", &[s(1), n, c]),
            inter("t", &[s(1), c, n]),
            constant("w", &[C2 as i64, C as i64, 1], ramp(C2 * C, 0.2)),
            output("y", 0, &[s(1), s(C2 as i64), n]),
        ];
        if with_pass {
            values[7] = output("hw", 1, &[s(1), n, c]);
        }
        build_blob_grouped(
            &values,
            &[0],
            if with_pass { &[10, 7] } else { &[10] },
            &[
                binary(fb::BinaryOp::Mul, 0, 0, 0.0, 1),
                N::Reduce {
                    op: fb::ReduceOp::Mean,
                    input: 1,
                    output: 2,
                    dims: &[2],
                },
                binary(fb::BinaryOp::Add, 2, -1, EPS, 3),
                N::Unary {
                    op: fb::UnaryOp::Rsqrt,
                    input: 3,
                    output: 4,
                },
                binary(fb::BinaryOp::Mul, 0, 4, 0.0, 5),
                binary(fb::BinaryOp::Mul, 5, 6, 0.0, 7),
                N::Permute {
                    input: 7,
                    output: 8,
                    perm: &[0, 2, 1],
                },
                N::Conv {
                    input: 8,
                    weight: 9,
                    bias: -1,
                    output: 10,
                    stride: 1,
                    pad: (0, 0),
                    dilation: 1,
                    groups: 1,
                },
            ],
            kernels,
        )
    };
    let reference = |h: &[f32], n: usize| {
        let g = gamma();
        let mut hw = vec![0.0; n * C];
        for t in 0..n {
            let row = &h[t * C..(t + 1) * C];
            let ms = row.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / C as f64;
            let r = 1.0 / (ms + f64::from(EPS)).sqrt();
            for c in 0..C {
                hw[t * C + c] = (f64::from(row[c]) * r * f64::from(g[c])) as f32;
            }
        }
        let w = ramp(C2 * C, 0.2);
        let mut y = vec![0.0; C2 * n];
        for o in 0..C2 {
            for t in 0..n {
                y[o * n + t] = (0..C).map(|c| w[o * C + c] * hw[t * C + c]).sum();
            }
        }
        (y, hw)
    };
    for (kernels, with_pass) in [
        (&[0, 0, 0, 0, 0, 0, 0, 0][..], false),
        (&[-1; 8][..], false),
        (&[0, 0, 0, 0, 0, 0, 1, 1][..], true),
    ] {
        let blob = blob(kernels, with_pass);
        let d = init(&blob).unwrap();
        let plan = d.plan().unwrap();
        if kernels[0] == 0 {
            // The mean of squares, then rsqrt(ms + eps) once per step.
            assert_eq!(plan.steps[0].statistics.len(), 3, "{kernels:?}");
        }
        for n in [1, 7, NX] {
            let h = ramp(n * C, 0.3);
            let mut ts = vec![
                tensor(&[1, n as i32, C as i32], h.clone()),
                out_tensor(&[1, C2 as i32, NX as i32]),
            ];
            if with_pass {
                ts.push(out_tensor(&[1, NX as i32, C as i32]));
            }
            let mut args = Args(ts);
            d.execute(&mut args).unwrap();
            let (y, hw) = reference(&h, n);
            assert_close(&args.0[1].data[..C2 * n], &y);
            if with_pass {
                assert_close(&args.0[2].data[..n * C], &hw);
            }
        }
    }
}

/// A reduction of the kernel's own anchor's output cannot be gathered
/// before the anchor runs: refused at init, naming the reduction. The
/// exporter puts such a reduction in a later kernel.
#[test]
fn a_reduction_of_its_own_anchor_is_refused() {
    let (n, n1) = (dynamic(NX as i64), dynamic(N1 as i64));
    let blob = build_blob_grouped(
        &[
            input("x", 0, &[s(1), s(1), n]),
            constant("w1", &[C as i64, 1, 4], w1()),
            constant("b1", &[C as i64], b1()),
            inter("y1", &[s(1), s(C as i64), n1]),
            inter("m", &[s(1), s(C as i64), s(1)]),
            output("out", 0, &[s(1), s(C as i64), n1]),
        ],
        &[0],
        &[5],
        &[
            nodes_conv1(),
            N::Reduce {
                op: fb::ReduceOp::Mean,
                input: 3,
                output: 4,
                dims: &[2],
            },
            binary(fb::BinaryOp::Sub, 3, 4, 0.0, 5),
        ],
        &[0, 0, 0],
    );
    let err = init(&blob).err().unwrap();
    assert_eq!(err.status(), Status::InvalidProgram, "{err}");
    let text = err.to_string();
    assert!(
        text.contains(
            "the reduction 'node1' reads the output of 'node0' (conv1d), the kernel's own anchor"
        ),
        "{text}"
    );
}

#[test]
fn bad_reduce_dimensions_are_invalid_programs() {
    let blob = |dims: &'static [u8], out_dims: &[(i64, bool)]| {
        build_blob(
            &[input("x", 0, &[s(2), s(3)]), output("m", 0, out_dims)],
            &[0],
            &[1],
            &[N::Reduce {
                op: fb::ReduceOp::Mean,
                input: 0,
                output: 1,
                dims,
            }],
        )
    };
    for (dims, out, reason) in [
        (
            &[2u8][..],
            [s(2), s(3)],
            "reduce dimension 2 of a rank-2 tensor",
        ),
        (&[1, 1][..], [s(2), s(1)], "out of range or listed twice"),
        (&[9][..], [s(2), s(3)], "out of range or listed twice"),
        (&[1][..], [s(2), s(3)], "computes shape [2, 1]"),
    ] {
        let blob = blob(dims, &out);
        let err = init(&blob).err().unwrap();
        assert_eq!(err.status(), Status::InvalidProgram, "{err}");
        assert!(err.to_string().contains(reason), "{dims:?}: {err}");
    }
    // A valid one runs as a pass of its own: the mean of each row.
    let blob = blob(&[1], &[s(2), s(1)]);
    let d = init(&blob).unwrap();
    let mut args = Args(vec![
        tensor(&[2, 3], vec![1.0, 2.0, 6.0, -1.0, 0.0, 4.0]),
        out_tensor(&[2, 1]),
    ]);
    d.execute(&mut args).unwrap();
    assert_eq!(args.0[1].data, [3.0, 1.0]);
}
