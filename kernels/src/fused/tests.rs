//! Programs against index-by-index references, and the fused conv and scan
//! against the plain kernels on materialised operands.

use super::*;
use crate::conv1d::{Algorithm, Choice, Conv1dParams, PreparedConv1d};
use crate::scan::{linear_scan_rows, linear_scan_rows_pair, scan_rows_scratch, ScanParams};
use crate::scratch::Scratch;
use crate::simd::Isa;
use crate::test_support::{Rng, TestEnv};

fn at(shape: &Shape, idx: &[usize]) -> usize {
    let st = shape.strides();
    idx.iter().zip(st).map(|(i, s)| i * s).sum()
}

/// Evaluates `p` over every element of its root (lines along the last
/// dimension, chunks of 7 to cross chunk edges).
fn eval_all(p: &Program, env: &TestEnv) -> Vec<f32> {
    let shape = env.shape(p.nodes()[p.root()].value);
    let rank = shape.rank();
    let len = shape[rank - 1];
    let rows = shape.numel() / len.max(1);
    let mut out = vec![0.0; shape.numel()];
    let mut tmp = vec![0.0; 7 * p.temporaries()];
    for r in 0..rows {
        let mut base = [0; MAX_RANK];
        let mut rest = r;
        for d in (0..rank - 1).rev() {
            base[d] = rest % shape[d];
            rest /= shape[d];
        }
        for t0 in (0..len).step_by(7) {
            let n = 7.min(len - t0);
            base[rank - 1] = t0;
            let line = Line::along(base, rank - 1);
            p.eval(
                Isa::detect(),
                env,
                &[],
                &line,
                &mut out[r * len + t0..][..n],
                &mut tmp,
            );
        }
    }
    out
}

#[test]
fn views_broadcasts_and_cat_read_the_right_elements() {
    let mut rng = Rng::new(1);
    let mut env = TestEnv::default();
    // in [1, N, 3D] -> permute [1, 3D, N] -> chunk 3 along dim 1 (slices)
    let (n, d) = (10, 4);
    let input = env.stored(&[1, n, 3 * d], rng.vec(n * 3 * d, -1.0, 1.0));
    let state = env.stored(&[1, d, 2], rng.vec(2 * d, -1.0, 1.0));
    let scale = env.stored(&[d, 1], rng.vec(d, 0.5, 2.0));
    let perm = env.virt(&[1, 3 * d, n]);
    let b = env.virt(&[1, d, n]);
    let x = env.virt(&[1, d, n]);
    let bx = env.virt(&[1, d, n]);
    let cat = env.virt(&[1, d, n + 2]);
    let cond = env.virt(&[1, d, n + 2]);
    let out = env.virt(&[1, d, n + 2]);

    let mut p = Program::default();
    let l = p.push(Expr::Load, input);
    let pm = p.push(
        Expr::View {
            x: l,
            map: [Some(0), Some(2), Some(1), None],
        },
        perm,
    );
    let bs = p.push(
        Expr::Slice {
            x: pm,
            dim: 1,
            start: 0,
            step: 1,
        },
        b,
    );
    let xs = p.push(
        Expr::Slice {
            x: pm,
            dim: 1,
            start: -(d as i64),
            step: 1,
        },
        x,
    );
    let m = p.push(
        Expr::Binary {
            op: BinaryOp::Mul,
            a: bs,
            b: xs,
        },
        bx,
    );
    let st = p.push(Expr::Load, state);
    let c = p.push(
        Expr::Cat {
            parts: vec![st, m],
            dim: 2,
        },
        cat,
    );
    let sc = p.push(Expr::Load, scale);
    let scb = p.push(Expr::Broadcast { x: sc }, cat);
    let zero = p.push(Expr::Const(0.0), cat);
    let gt = p.push(
        Expr::Binary {
            op: BinaryOp::Gt,
            a: c,
            b: zero,
        },
        cond,
    );
    let scaled = p.push(
        Expr::Binary {
            op: BinaryOp::Mul,
            a: c,
            b: scb,
        },
        cat,
    );
    p.push(
        Expr::Where {
            cond: gt,
            a: scaled,
            b: c,
        },
        out,
    );
    assert_eq!(p.temporaries(), 3);

    let got = eval_all(&p, &env);
    let (si, ss, sc_) = (env.shapes[input], env.shapes[state], env.shapes[scale]);
    for ch in 0..d {
        for t in 0..n + 2 {
            let v = if t < 2 {
                env.data[state][at(&ss, &[0, ch, t])]
            } else {
                let t = t - 2;
                env.data[input][at(&si, &[0, t, ch])]
                    * env.data[input][at(&si, &[0, t, 2 * d + ch])]
            };
            let want = if v > 0.0 {
                v * env.data[scale][at(&sc_, &[ch, 0])]
            } else {
                v
            };
            assert_eq!(got[ch * (n + 2) + t], want, "channel {ch}, time {t}");
        }
    }
}

#[test]
fn strided_slices_and_a_cat_along_lines_of_another_dimension() {
    let mut env = TestEnv::default();
    let a = env.stored(&[2, 9], (0..18).map(|v| v as f32).collect());
    let b = env.stored(&[1, 9], (100..109).map(|v| v as f32).collect());
    let cat = env.virt(&[3, 9]);
    let sl = env.virt(&[3, 4]);
    let mut p = Program::default();
    let la = p.push(Expr::Load, a);
    let lb = p.push(Expr::Load, b);
    let c = p.push(
        Expr::Cat {
            parts: vec![la, lb],
            dim: 0,
        },
        cat,
    );
    p.push(
        Expr::Slice {
            x: c,
            dim: 1,
            start: 1,
            step: 2,
        },
        sl,
    );
    let got = eval_all(&p, &env);
    assert_eq!(
        got,
        [1., 3., 5., 7., 10., 12., 14., 16., 101., 103., 105., 107.]
    );
}

/// A prologue `x1 * x2` read from `[B, N, C]` (transposed) or `[B, C, N]`,
/// and an epilogue `silu(y) * c` stored transposed again (the
/// channels-last walk) or as is (rows, transposed through scratch; or,
/// with neither operand transposed, whole rows per walk), around a
/// depthwise conv: equal to the plain kernel on materialised tensors.
#[test]
fn fused_depthwise_matches_the_plain_kernel() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    let mut rng = Rng::new(7);
    for (case, transposed_in, transposed_out, silu) in [
        (1, 5, 2500, 4, (3, 0), 1),
        (2, 3, 40, 3, (2, 2), 2),
        (1, 4, 1, 3, (2, 0), 1),
        (1, 2, 3000, 32, (31, 0), 1),
        // Decode steps (the column path): more channels than one block,
        // a few outputs, padding, and one large enough to run in parallel.
        (1, 1500, 3, 3, (0, 0), 1),
        (2, 70, 5, 4, (1, 0), 1),
        (2, 9000, 4, 4, (0, 0), 1),
        // Long rows across channels: several channel blocks with a tail
        // that fills no vector, partial last tiles, padding on both sides,
        // dilation, and the longest span walked across channels.
        (2, 300, 100, 3, (2, 0), 1),
        (1, 37, 70, 5, (3, 5), 2),
        (1, 20, 200, 17, (16, 0), 1),
        // Short rows (a FastConformer's 16 to 64 frames): whole rows in
        // blocks of channels, one block and several per item.
        (1, 128, 16, 9, (4, 4), 1),
        (2, 300, 32, 9, (4, 4), 1),
        (1, 24, 64, 31, (15, 15), 1),
    ]
    .iter()
    // Input and output transposed or not; `silu(y) * c` (interpreted) or
    // `y * c` (the gate recipe, across channels in the channels-last walk).
    .flat_map(|case| {
        [
            (case, true, true, true),
            (case, true, false, true),
            (case, true, true, false),
            (case, false, false, true),
        ]
    }) {
        let &(batch, ch, n, k, (pl, pr), dil) = case;
        let p = Conv1dParams {
            batch,
            in_channels: ch,
            out_channels: ch,
            in_len: n,
            kernel_size: k,
            stride: 1,
            pad_left: pl,
            pad_right: pr,
            dilation: dil,
            groups: ch,
        };
        let out_len = p.geometry().unwrap().out_len;
        let mut env = TestEnv::default();
        let x_dims = if transposed_in {
            [batch, n, ch]
        } else {
            [batch, ch, n]
        };
        let x1 = env.stored(&x_dims, rng.vec(batch * n * ch, -1.0, 1.0));
        let x2 = env.stored(&x_dims, rng.vec(batch * n * ch, -1.0, 1.0));
        let c_dims = if transposed_out {
            [batch, out_len, ch]
        } else {
            [batch, ch, out_len]
        };
        let c = env.stored(&c_dims, rng.vec(batch * out_len * ch, -1.0, 1.0));
        let xt = env.virt(&x_dims);
        let x = env.virt(&[batch, ch, n]);
        let y = env.virt(&[batch, ch, out_len]);
        let ct = env.virt(&[batch, ch, out_len]);
        let e = env.virt(&[batch, ch, out_len]);
        let w = rng.vec(ch * k, -1.0, 1.0);
        let bias = rng.vec(ch, -1.0, 1.0);
        let transpose = [Some(0), Some(2), Some(1), None];

        let mut pro = Program::default();
        let a = pro.push(Expr::Load, x1);
        let b = pro.push(Expr::Load, x2);
        let m = pro.push(
            Expr::Binary {
                op: BinaryOp::Mul,
                a,
                b,
            },
            xt,
        );
        if transposed_in {
            pro.push(
                Expr::View {
                    x: m,
                    map: transpose,
                },
                x,
            );
        }
        let mut epi = Program::default();
        let an = epi.push(Expr::Anchor, y);
        let s = if silu {
            epi.push(
                Expr::Unary {
                    op: UnaryOp::Silu,
                    x: an,
                },
                y,
            )
        } else {
            an
        };
        let lc = epi.push(Expr::Load, c);
        let cv = if transposed_out {
            epi.push(
                Expr::View {
                    x: lc,
                    map: transpose,
                },
                ct,
            )
        } else {
            lc
        };
        epi.push(
            Expr::Binary {
                op: BinaryOp::Mul,
                a: s,
                b: cv,
            },
            e,
        );

        // Reference: materialise, run the plain kernel, finish by hand.
        let xm = eval_all(&pro, &env);
        let prepared =
            PreparedConv1d::new(&p, &w, Choice::Force(Algorithm::DepthwiseSimd)).unwrap();
        let mut yref = vec![0.0; batch * ch * out_len];
        let scratch0 = Scratch::new(crate::par::threads(), prepared.scratch_per_thread());
        pool.install(|| prepared.run(&p, &xm, Some(&w), Some(&bias), &mut yref, &scratch0))
            .unwrap();
        let mut want = vec![0.0; batch * out_len * ch];
        for bi in 0..batch {
            for cc in 0..ch {
                for t in 0..out_len {
                    let v = yref[(bi * ch + cc) * out_len + t];
                    let act = if silu { v / (1.0 + (-v).exp()) } else { v };
                    let at = if transposed_out {
                        (bi * out_len + t) * ch + cc
                    } else {
                        (bi * ch + cc) * out_len + t
                    };
                    want[at] = act * env.data[c][at];
                }
            }
        }

        let mut got = vec![0.0; want.len()];
        let views = [StoreView {
            map: transpose,
            rank: 3,
        }];
        let views: &[StoreView] = if transposed_out { &views } else { &[] };
        let (pro, epi) = (pro.compile(), epi.compile());
        let source = ProgramRows::new(&pro, &env);
        let sink = EpilogueSink::new(
            &epi,
            &env,
            Shape::new(&[batch, ch, out_len]),
            views,
            &mut got,
            Shape::new(&c_dims),
        );
        assert_eq!(source.prefers_columns(), transposed_in);
        assert_eq!(sink.prefers_columns(), transposed_out);
        let (xt_, yt_) = (source.temporaries(), sink.temporaries());
        let scratch = Scratch::new(
            crate::par::threads(),
            prepared.rows_scratch_per_thread(xt_, yt_),
        );
        pool.install(|| {
            prepared.run_rows(
                &p,
                RowsIn::Fused(&source),
                Some(&w),
                Some(&bias),
                RowsOut::Fused(&sink),
                xt_,
                yt_,
                &scratch,
            )
        })
        .unwrap();
        for (i, (g, w_)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w_).abs() <= 1e-5 * (1.0 + w_.abs()),
                "case {case:?} transposed in {transposed_in} out {transposed_out} silu {silu}: \
                 element {i}: {g} vs {w_}"
            );
        }
    }
}

#[test]
fn fused_scan_matches_the_plain_scan() {
    // Long rows, and decode steps (the column path): more channels than one
    // block, a few steps, and one large enough to run in parallel.
    for (b, c, n) in [(2, 3, 2100), (1, 1500, 1), (2, 5, 3), (2, 20_000, 2)] {
        check_fused_scan(b, c, n);
    }
}

fn check_fused_scan(b: usize, c: usize, n: usize) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let mut rng = Rng::new(3);
    let p = ScanParams {
        batch: b,
        channels: c,
        len: n,
    };
    let mut env = TestEnv::default();
    let pp = env.stored(&[b, c, n], rng.vec(b * c * n, -3.0, 3.0));
    let xin = env.stored(&[b, c, n], rng.vec(b * c * n, -1.0, 1.0));
    let big_a = env.stored(&[c, 1], rng.vec(c, 0.1, 1.0));
    let z = env.stored(&[b, c, n], rng.vec(b * c * n, -2.0, 2.0));
    let x0 = env.stored(&[b, c], rng.vec(b * c, -1.0, 1.0));
    let full = env.virt(&[b, c, n]);
    // dt = softplus(p); a = exp(-(dt * A)); u = dt * x; out = y * silu(z)
    let mut pa = Program::default();
    let lp = pa.push(Expr::Load, pp);
    let dt = pa.push(
        Expr::Unary {
            op: UnaryOp::Softplus,
            x: lp,
        },
        full,
    );
    let la = pa.push(Expr::Load, big_a);
    let ab = pa.push(Expr::Broadcast { x: la }, full);
    let m = pa.push(
        Expr::Binary {
            op: BinaryOp::Mul,
            a: dt,
            b: ab,
        },
        full,
    );
    let ng = pa.push(
        Expr::Unary {
            op: UnaryOp::Neg,
            x: m,
        },
        full,
    );
    pa.push(
        Expr::Unary {
            op: UnaryOp::Exp,
            x: ng,
        },
        full,
    );
    let mut pu = Program::default();
    let lp = pu.push(Expr::Load, pp);
    let dt = pu.push(
        Expr::Unary {
            op: UnaryOp::Softplus,
            x: lp,
        },
        full,
    );
    let lx = pu.push(Expr::Load, xin);
    pu.push(
        Expr::Binary {
            op: BinaryOp::Mul,
            a: dt,
            b: lx,
        },
        full,
    );
    let mut px0 = Program::default();
    px0.push(Expr::Load, x0);
    let mut epi = Program::default();
    let an = epi.push(Expr::Anchor, full);
    let lz = epi.push(Expr::Load, z);
    let sz = epi.push(
        Expr::Unary {
            op: UnaryOp::Silu,
            x: lz,
        },
        full,
    );
    epi.push(
        Expr::Binary {
            op: BinaryOp::Mul,
            a: an,
            b: sz,
        },
        full,
    );

    let (av, uv) = (eval_all(&pa, &env), eval_all(&pu, &env));
    let mut y = vec![0.0; b * c * n];
    crate::scan::linear_scan_f32(&p, &env.data[x0], &av, &uv, &mut y).unwrap();
    let want: Vec<f32> = y
        .iter()
        .zip(&env.data[z])
        .map(|(&y, &z)| y * z / (1.0 + (-z).exp()))
        .collect();

    let mut got = vec![0.0; want.len()];
    let [pa, pu, px0, epi] = [pa, pu, px0, epi].map(Program::compile);
    let (sa, su, sx0) = (
        ProgramRows::new(&pa, &env),
        ProgramRows::new(&pu, &env),
        ProgramRows::scalar_rows(&px0, &env),
    );
    let sink = EpilogueSink::new(
        &epi,
        &env,
        Shape::new(&[b, c, n]),
        &[],
        &mut got,
        Shape::new(&[b, c, n]),
    );
    let temps = [sa.temporaries(), su.temporaries(), sink.temporaries()]
        .into_iter()
        .max()
        .unwrap();
    let scratch = Scratch::new(crate::par::threads(), scan_rows_scratch(temps));
    pool.install(|| {
        linear_scan_rows(
            &p,
            RowsIn::Fused(&sx0),
            RowsIn::Fused(&sa),
            RowsIn::Fused(&su),
            RowsOut::Fused(&sink),
            &scratch,
        )
    })
    .unwrap();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
            "element {i}: {g} vs {w}"
        );
    }
    // `a` and `u` from one program with both as roots: `dt` (and `p`'s
    // load) shared, computed once per chunk; the same result.
    let mut pj = Program::default();
    let lp = pj.push(Expr::Load, pp);
    let dt = pj.push(
        Expr::Unary {
            op: UnaryOp::Softplus,
            x: lp,
        },
        full,
    );
    let la = pj.push(Expr::Load, big_a);
    let ab = pj.push(Expr::Broadcast { x: la }, full);
    let m = pj.push(
        Expr::Binary {
            op: BinaryOp::Mul,
            a: dt,
            b: ab,
        },
        full,
    );
    let ng = pj.push(
        Expr::Unary {
            op: UnaryOp::Neg,
            x: m,
        },
        full,
    );
    let ra = pj.push(
        Expr::Unary {
            op: UnaryOp::Exp,
            x: ng,
        },
        full,
    );
    let lx = pj.push(Expr::Load, xin);
    let ru = pj.push(
        Expr::Binary {
            op: BinaryOp::Mul,
            a: dt,
            b: lx,
        },
        full,
    );
    pj.set_roots(vec![ra, ru]);
    assert_eq!(pj.shared(), 1, "dt is the one computed node read twice");
    let mut paired = vec![0.0; want.len()];
    let sink = EpilogueSink::new(
        &epi,
        &env,
        Shape::new(&[b, c, n]),
        &[],
        &mut paired,
        Shape::new(&[b, c, n]),
    );
    let pj = pj.compile();
    let joint = ProgramRows::new(&pj, &env);
    let temps = pj
        .temporaries()
        .max(sink.temporaries())
        .max(sx0.temporaries());
    let scratch = Scratch::new(crate::par::threads(), scan_rows_scratch(temps));
    pool.install(|| {
        linear_scan_rows_pair(
            &p,
            RowsIn::Fused(&sx0),
            &joint,
            RowsOut::Fused(&sink),
            &scratch,
        )
    })
    .unwrap();
    for (i, (g, w)) in paired.iter().zip(&got).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
            "paired, element {i}: {g} vs {w}"
        );
    }
    // Scratch without room for the joint program's shared slot: a typed
    // error, not an out-of-bounds slice.
    let small = Scratch::new(
        crate::par::threads(),
        scan_rows_scratch(pj.temporaries() - 1),
    );
    let mut plain = vec![0.0; want.len()];
    let r = pool.install(|| {
        linear_scan_rows_pair(
            &p,
            RowsIn::Fused(&sx0),
            &joint,
            RowsOut::Slice(&mut plain),
            &small,
        )
    });
    assert!(r.is_err(), "too little scratch is refused");

    // Stored operands and a stored output through the same entry point.
    let mut y2 = vec![0.0; want.len()];
    let scratch = Scratch::new(crate::par::threads(), scan_rows_scratch(0));
    pool.install(|| {
        linear_scan_rows(
            &p,
            RowsIn::Slice(&env.data[x0]),
            RowsIn::Slice(&av),
            RowsIn::Slice(&uv),
            RowsOut::Slice(&mut y2),
            &scratch,
        )
    })
    .unwrap();
    for (g, w) in y2.iter().zip(&y) {
        assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()));
    }
}

#[test]
fn a_store_outside_the_output_panics_instead_of_writing() {
    let mut data = vec![0.0; 4];
    let out = SharedOut::new(&mut data);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        out.store_line_for_test(2, 1, &[1.0, 2.0, 3.0])
    }));
    assert!(r.is_err());
    out.store_line_for_test(1, 2, &[5.0, 6.0]);
    assert_eq!(data, [0.0, 5.0, 0.0, 6.0]);
    // The contiguous (copy) path: in bounds up to the last element, and
    // refused one past it.
    let mut data = vec![0.0; 4];
    let out = SharedOut::new(&mut data);
    out.store_line_for_test(1, 1, &[7.0, 8.0, 9.0]);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        out.store_line_for_test(2, 1, &[1.0, 2.0, 3.0])
    }));
    assert!(r.is_err());
    assert_eq!(data, [0.0, 7.0, 8.0, 9.0]);
}

/// `e` evaluated through `eval_roots` with common subexpressions shared,
/// against the same expressions each in its own program (no node read
/// twice), on lines of several lengths and through a cat (sub-lines).
#[test]
fn shared_subexpressions_are_computed_once_and_give_the_same_values() {
    let mut rng = Rng::new(7);
    let mut env = TestEnv::default();
    let (c, n) = (3, 50);
    let p = env.stored(&[1, c, n], rng.vec(c * n, -30.0, 30.0));
    let x = env.stored(&[1, c, n], rng.vec(c * n, -1.0, 1.0));
    let head = env.stored(&[1, c, 4], rng.vec(c * 4, -1.0, 1.0));
    let full = env.virt(&[1, c, n]);
    let body = env.virt(&[1, c, n - 4]);
    // softplus as the edge dialect decomposes it:
    // dt = where(p > 20, p, log1p(exp(p)))
    // a = exp(-dt); u = dt * x; w = cat(head, (dt * x)[.., 4..]) (a view of a shared node)
    let build = |shared: bool| -> Vec<Program> {
        let mut programs = Vec::new();
        let mut prog = Program::default();
        let dt_of = |prog: &mut Program| -> usize {
            let lp = prog.push(Expr::Load, p);
            let e = prog.push(
                Expr::Unary {
                    op: UnaryOp::Exp,
                    x: lp,
                },
                full,
            );
            let l = prog.push(
                Expr::Unary {
                    op: UnaryOp::Log1p,
                    x: e,
                },
                full,
            );
            let k = prog.push(Expr::Const(20.0), full);
            let g = prog.push(
                Expr::Binary {
                    op: BinaryOp::Gt,
                    a: lp,
                    b: k,
                },
                full,
            );
            prog.push(
                Expr::Where {
                    cond: g,
                    a: lp,
                    b: l,
                },
                full,
            )
        };
        let a_of = |prog: &mut Program, dt: usize| {
            let ng = prog.push(
                Expr::Unary {
                    op: UnaryOp::Neg,
                    x: dt,
                },
                full,
            );
            prog.push(
                Expr::Unary {
                    op: UnaryOp::Exp,
                    x: ng,
                },
                full,
            )
        };
        let u_of = |prog: &mut Program, dt: usize| {
            let lx = prog.push(Expr::Load, x);
            prog.push(
                Expr::Binary {
                    op: BinaryOp::Mul,
                    a: dt,
                    b: lx,
                },
                full,
            )
        };
        let w_of = |prog: &mut Program, u: usize| {
            let s = prog.push(
                Expr::Slice {
                    x: u,
                    dim: 2,
                    start: 4,
                    step: 1,
                },
                body,
            );
            let h = prog.push(Expr::Load, head);
            env_cat(prog, h, s)
        };
        fn env_cat(prog: &mut Program, h: usize, s: usize) -> usize {
            // The cat's shape is the full one (value index passed by the caller's env).
            prog.push(
                Expr::Cat {
                    parts: vec![h, s],
                    dim: 2,
                },
                usize::MAX,
            )
        }
        if shared {
            let dt = dt_of(&mut prog);
            let a = a_of(&mut prog, dt);
            let u = u_of(&mut prog, dt);
            let w = w_of(&mut prog, u);
            prog.set_roots(vec![a, u, w]);
            programs.push(prog);
        } else {
            for which in 0..3 {
                let mut prog = Program::default();
                let dt = dt_of(&mut prog);
                match which {
                    0 => {
                        a_of(&mut prog, dt);
                    }
                    1 => {
                        u_of(&mut prog, dt);
                    }
                    _ => {
                        let u = u_of(&mut prog, dt);
                        w_of(&mut prog, u);
                    }
                }
                programs.push(prog);
            }
        }
        programs
    };
    // The cat's value: patch the placeholder index to a [1, c, n] value.
    let fix = |mut programs: Vec<Program>| -> Vec<Program> {
        for prog in &mut programs {
            let mut fixed = Program::default();
            for node in prog.nodes() {
                let value = if node.value == usize::MAX {
                    full
                } else {
                    node.value
                };
                fixed.push(node.expr.clone(), value);
            }
            if prog.roots().len() > 1 {
                fixed.set_roots(prog.roots());
            }
            *prog = fixed;
        }
        programs
    };
    let joint = fix(build(true)).remove(0);
    let separate = fix(build(false));
    // dt (the where), log1p's input exp, the gt, u: several shared nodes.
    assert!(joint.shared() >= 2, "{}", joint.shared());
    assert!(separate.iter().all(|p| p.shared() <= 1));
    for len in [1, 7, 16, 50] {
        let mut tmp = vec![0.0; len * joint.temporaries()];
        for r in 0..c {
            for t0 in (0..n).step_by(len) {
                let m = len.min(n - t0);
                let line = Line::along([0, r, t0, 0], 2);
                let mut outs = vec![vec![0.0; m]; 3];
                {
                    let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
                    joint.eval_roots(Isa::detect(), &env, &[], &line, &mut refs, &mut tmp);
                }
                for (k, prog) in separate.iter().enumerate() {
                    let mut want = vec![0.0; m];
                    let mut t = vec![0.0; m * prog.temporaries().max(1)];
                    prog.eval(Isa::detect(), &env, &[], &line, &mut want, &mut t);
                    for (g, w) in outs[k].iter().zip(&want) {
                        assert!(
                            (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                            "root {k}, row {r}, t0 {t0}, len {len}: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn decomposed_softplus_and_silu_are_evaluated_as_one_op() {
    let mut env = TestEnv::default();
    let xs: Vec<f32> = (0..60).map(|i| (i as f32 - 30.0) * 1.1).collect();
    let x = env.stored(&[2, 30], xs.clone());
    let v = env.virt(&[2, 30]);
    // where(x > 20, x, log1p(exp(x))), as the edge dialect writes softplus.
    let mut p = Program::default();
    let l = p.push(Expr::Load, x);
    let e = p.push(
        Expr::Unary {
            op: UnaryOp::Exp,
            x: l,
        },
        v,
    );
    let lp = p.push(
        Expr::Unary {
            op: UnaryOp::Log1p,
            x: e,
        },
        v,
    );
    let c = p.push(Expr::Const(20.0), v);
    let g = p.push(
        Expr::Binary {
            op: BinaryOp::Gt,
            a: l,
            b: c,
        },
        v,
    );
    let w = p.push(
        Expr::Where {
            cond: g,
            a: l,
            b: lp,
        },
        v,
    );
    assert_eq!(
        p.nodes()[w].expr,
        Expr::Unary {
            op: UnaryOp::Softplus,
            x: l
        }
    );
    // Then its silu, sigmoid on either side of the product.
    let s = p.push(
        Expr::Unary {
            op: UnaryOp::Sigmoid,
            x: w,
        },
        v,
    );
    let m = p.push(
        Expr::Binary {
            op: BinaryOp::Mul,
            a: s,
            b: w,
        },
        v,
    );
    assert_eq!(
        p.nodes()[m].expr,
        Expr::Unary {
            op: UnaryOp::Silu,
            x: w
        }
    );
    let got = eval_all(&p, &env);
    for (&x, &g) in xs.iter().zip(&got) {
        let x = x as f64;
        let sp = if x > 20.0 { x } else { x.exp().ln_1p() };
        let want = sp / (1.0 + (-sp).exp());
        assert!(
            (g as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()),
            "{x}: {g} vs {want}"
        );
    }
    // Another threshold or comparison is not softplus: left as written.
    let mut q = Program::default();
    let l = q.push(Expr::Load, x);
    let e = q.push(
        Expr::Unary {
            op: UnaryOp::Exp,
            x: l,
        },
        v,
    );
    let lp = q.push(
        Expr::Unary {
            op: UnaryOp::Log1p,
            x: e,
        },
        v,
    );
    let c = q.push(Expr::Const(10.0), v);
    let g = q.push(
        Expr::Binary {
            op: BinaryOp::Gt,
            a: l,
            b: c,
        },
        v,
    );
    let w = q.push(
        Expr::Where {
            cond: g,
            a: l,
            b: lp,
        },
        v,
    );
    assert!(matches!(q.nodes()[w].expr, Expr::Where { .. }));
    let got = eval_all(&q, &env);
    for (&x, &g) in xs.iter().zip(&got) {
        let want = if x > 10.0 {
            x as f64
        } else {
            (x as f64).exp().ln_1p()
        };
        assert!((g as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()));
    }
}

#[test]
fn line_copies_and_prefetches_of_every_length() {
    for n in 0..70 {
        let src: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
        let mut dst = vec![f32::NAN; n];
        ops::copy(&mut dst, &src);
        assert_eq!(dst, src);
        ops::prefetch(&src);
    }
}

#[test]
fn fft_conv_runs_prologues_and_epilogues_in_its_block_loops() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let mut rng = Rng::new(11);
    // 40 channels: a whole group of 32 and a partial one; lengths that are
    // not multiples of 16 nor of the sink's chunk; K = N (a Hyena filter)
    // and a shorter filter over several blocks.
    for (batch, ch, n, k) in [(2, 40, 1500, 1500), (1, 33, 3001, 300)] {
        let p = Conv1dParams {
            batch,
            in_channels: ch,
            out_channels: ch,
            in_len: n,
            kernel_size: k,
            stride: 1,
            pad_left: k - 1,
            pad_right: 0,
            dilation: 1,
            groups: ch,
        };
        let w = rng.vec(ch * k, -0.1, 0.1);
        let prepared = PreparedConv1d::new(&p, &w, Choice::Force(Algorithm::Fft)).unwrap();
        let bias = rng.vec(ch, -0.5, 0.5);
        let mut env = TestEnv::default();
        // The input is v * u (Hyena's gate before the conv).
        let v = env.stored(&[batch, ch, n], rng.vec(batch * ch * n, -1.0, 1.0));
        let u = env.stored(&[batch, ch, n], rng.vec(batch * ch * n, -1.0, 1.0));
        let xv = env.virt(&[batch, ch, n]);
        let mut pro = Program::default();
        let lv = pro.push(Expr::Load, v);
        let lu = pro.push(Expr::Load, u);
        pro.push(
            Expr::Binary {
                op: BinaryOp::Mul,
                a: lv,
                b: lu,
            },
            xv,
        );
        let x: Vec<f32> = env.data[v]
            .iter()
            .zip(&env.data[u])
            .map(|(a, b)| a * b)
            .collect();
        let gate = env.stored(&[batch, ch, n], rng.vec(batch * ch * n, -2.0, 2.0));
        let y = env.virt(&[batch, ch, n]);
        // gelu(y * gate)
        let mut epi = Program::default();
        let an = epi.push(Expr::Anchor, y);
        let lg = epi.push(Expr::Load, gate);
        let m = epi.push(
            Expr::Binary {
                op: BinaryOp::Mul,
                a: an,
                b: lg,
            },
            y,
        );
        epi.push(
            Expr::Unary {
                op: UnaryOp::Gelu,
                x: m,
            },
            y,
        );
        let mut yref = vec![0.0; batch * ch * n];
        let scratch0 = Scratch::new(crate::par::threads(), prepared.scratch_per_thread());
        pool.install(|| prepared.run(&p, &x, Some(&w), Some(&bias), &mut yref, &scratch0))
            .unwrap();
        let mut want = yref.clone();
        for (w_, g) in want.iter_mut().zip(&env.data[gate]) {
            let mut v = [*w_ * g];
            UnaryOp::Gelu.apply(Isa::detect(), &mut v);
            *w_ = v[0];
        }
        let shape = Shape::new(&[batch, ch, n]);
        let (pro, epi) = (pro.compile(), epi.compile());
        let source = ProgramRows::new(&pro, &env);
        let xt = source.temporaries();
        // Epilogue only, prologue only, both.
        for (fused_in, fused_out) in [(false, true), (true, false), (true, true)] {
            let mut got = vec![f32::NAN; want.len()];
            let mut stored = vec![f32::NAN; want.len()];
            let sink = EpilogueSink::new(&epi, &env, shape, &[], &mut got, shape);
            let yt = sink.temporaries();
            let x_in = if fused_in {
                RowsIn::Fused(&source)
            } else {
                RowsIn::Slice(&x)
            };
            let y_out = if fused_out {
                RowsOut::Fused(&sink)
            } else {
                RowsOut::Slice(&mut stored)
            };
            let scratch = Scratch::new(
                crate::par::threads(),
                prepared.rows_scratch_per_thread(xt, yt),
            );
            let r = pool.install(|| {
                prepared.run_rows(&p, x_in, Some(&w), Some(&bias), y_out, xt, yt, &scratch)
            });
            if !prepared.fuses_output() {
                // The realfft engine (no AVX-512): stored operands only.
                assert!(!prepared.fuses_input());
                assert!(matches!(r, Err(crate::KernelError::NotFusable { .. })));
                continue;
            }
            r.unwrap();
            let (result, reference) = if fused_out {
                (&got, &want)
            } else {
                (&stored, &yref)
            };
            for (i, (g, w_)) in result.iter().zip(reference).enumerate() {
                assert!(
                    (g - w_).abs() <= 1e-5 * (1.0 + w_.abs()),
                    "n={n} k={k} in {fused_in} out {fused_out}: element {i}: {g} vs {w_}"
                );
            }
        }
    }
}

#[test]
fn columns_of_short_rows_read_and_materialise_every_element() {
    // A decode step reads `[C, S]` tensors a column at a time (stride S,
    // fixed-stride copies for S <= 4) and materialise writes short rows the
    // same way: every element, whatever the stride and column length.
    let mut rng = Rng::new(5);
    for s in 1..=6 {
        for c in [1, 2, 7, 1025, 2100] {
            let mut env = TestEnv::default();
            let x = env.stored(&[1, c, s], rng.vec(c * s, -1.0, 1.0));
            let mut p = Program::default();
            p.push(Expr::Load, x);
            let mut col = vec![0.0; c];
            for t in 0..s {
                p.eval(
                    Isa::detect(),
                    &env,
                    &[],
                    &Line::along([0, 0, t, 0], 1),
                    &mut col,
                    &mut [],
                );
                for (r, v) in col.iter().enumerate() {
                    assert_eq!(*v, env.data[x][r * s + t], "s={s} c={c} t={t} r={r}");
                }
            }
            let mut out = vec![f32::NAN; c * s];
            let scratch = Scratch::new(crate::par::threads(), line_scratch(p.temporaries()));
            let p = p.compile();
            materialise(&ProgramRows::new(&p, &env), &mut out, s, &scratch);
            assert_eq!(out, env.data[x], "materialise s={s} c={c}");
        }
    }
}

/// A transposed program (a `[B, N, C]` tensor read as `[B, C, N]`, times
/// a per-channel scale) is materialised in blocks of rows across them:
/// every element, partial blocks and tiles, on 1 and 3 threads, the same
/// bits as evaluating it row by row.
#[test]
fn transposed_programs_materialise_across_their_rows() {
    let mut rng = Rng::new(9);
    for (b, c, n) in [(1, 300, 130), (2, 7, 65), (3, 256, 64), (1, 1, 40)] {
        let mut env = TestEnv::default();
        let x = env.stored(&[b, n, c], rng.vec(b * n * c, -1.0, 1.0));
        let g = env.stored(&[c, 1], rng.vec(c, 0.5, 2.0));
        let t = env.virt(&[b, c, n]);
        let mut p = Program::default();
        let l = p.push(Expr::Load, x);
        let v = p.push(
            Expr::View {
                x: l,
                map: [Some(0), Some(2), Some(1), None],
            },
            t,
        );
        let lg = p.push(Expr::Load, g);
        let bg = p.push(Expr::Broadcast { x: lg }, t);
        p.push(
            Expr::Binary {
                op: BinaryOp::Mul,
                a: v,
                b: bg,
            },
            t,
        );
        let p = p.compile();
        let rows = ProgramRows::new(&p, &env);
        assert_eq!(rows.prefers_columns(), c > 1, "b={b} c={c} n={n}");
        let want = eval_all(&p, &env);
        for threads in [1, 3] {
            let scratch = Scratch::new(threads, line_scratch(p.temporaries()));
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut out = vec![f32::NAN; b * c * n];
            pool.install(|| materialise(&rows, &mut out, n, &scratch));
            assert_eq!(
                bits(&out),
                bits(&want),
                "b={b} c={c} n={n}, {threads} threads"
            );
        }
    }
}

/// A GLU staged before a conv of a few frames (`x[:, :C] *
/// sigmoid(x[:, C:])` over `[B, 2C, N]`): its whole rows lie end to end in
/// both operands, so `materialise` computes blocks of rows as one line.
/// Every element, on 1 and 3 threads, the same bits as the interpreter row
/// by row; longer rows (past `SHORT_ROW`) take the row-by-row path.
#[test]
fn whole_rows_materialise_in_blocks_bit_for_bit() {
    let mut rng = Rng::new(31);
    for (b, c, n) in [
        (1, 128, 16),
        (2, 7, 9),
        (1, 300, 40),
        (3, 1, 5),
        (1, 64, 300),
    ] {
        let mut env = TestEnv::default();
        let x = env.stored(&[b, 2 * c, n], rng.vec(b * 2 * c * n, -3.0, 3.0));
        let t = env.virt(&[b, c, n]);
        let mut p = Program::default();
        let l = p.push(Expr::Load, x);
        let half = |p: &mut Program, start| {
            p.push(
                Expr::Slice {
                    x: l,
                    dim: 1,
                    start,
                    step: 1,
                },
                t,
            )
        };
        let a = half(&mut p, 0);
        let g = half(&mut p, c as i64);
        let s = p.push(
            Expr::Unary {
                op: UnaryOp::Sigmoid,
                x: g,
            },
            t,
        );
        p.push(
            Expr::Binary {
                op: BinaryOp::Mul,
                a,
                b: s,
            },
            t,
        );
        let p = p.compile();
        let rows = ProgramRows::new(&p, &env);
        assert!(rows.whole_rows_one_line(n), "{b}x{c}x{n}");
        assert!(!rows.whole_rows_one_line(n - 1), "{b}x{c}x{n}: part rows");
        let want = eval_all(&p, &env);
        for threads in [1, 3] {
            let scratch = Scratch::new(threads, line_scratch(p.temporaries()));
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut out = vec![f32::NAN; b * c * n];
            pool.install(|| materialise(&rows, &mut out, n, &scratch));
            assert_eq!(bits(&out), bits(&want), "{b}x{c}x{n}, {threads} threads");
        }
    }
}

/// `drain` through a pointwise epilogue (a staged conv's activation, after
/// a scale by a constant) finishes blocks of short rows in place: every
/// element, on 1 and 3 threads, the same bits as storing row by row; a
/// per-channel operand makes the epilogue not pointwise (stored row by
/// row, the same values).
#[test]
fn pointwise_epilogues_drain_in_blocks_bit_for_bit() {
    let mut rng = Rng::new(32);
    for (b, c, n) in [(1, 128, 16), (2, 9, 7), (1, 300, 3), (1, 40, 300)] {
        for per_channel in [false, true] {
            let mut env = TestEnv::default();
            let y = env.virt(&[b, c, n]);
            let scale = env.stored(&[c, 1], rng.vec(c, 0.5, 2.0));
            let mut p = Program::default();
            let an = p.push(Expr::Anchor, y);
            let k = if per_channel {
                let l = p.push(Expr::Load, scale);
                p.push(Expr::Broadcast { x: l }, y)
            } else {
                p.push(Expr::Const(0.5), y)
            };
            let x = p.push(
                Expr::Binary {
                    op: BinaryOp::Mul,
                    a: an,
                    b: k,
                },
                y,
            );
            p.push(
                Expr::Unary {
                    op: UnaryOp::Silu,
                    x,
                },
                y,
            );
            let p = p.compile();
            let shape = Shape::new(&[b, c, n]);
            let values = rng.vec(b * c * n, -4.0, 4.0);
            let mut want = vec![-7.0; b * c * n];
            {
                let sink = EpilogueSink::new(&p, &env, shape, &[], &mut want, shape);
                assert_eq!(sink.finishes_blocks(), !per_channel, "{b}x{c}x{n}");
                let mut tmp = vec![f32::NAN; block_tmp(sink.temporaries(), n)];
                for (r, v) in values.chunks_exact(n).enumerate() {
                    sink.store(r, 0, v, &mut tmp);
                }
            }
            for threads in [1, 3] {
                let mut got = vec![-7.0; b * c * n];
                let scratch = Scratch::new(threads, line_scratch(p.temporaries() + 1));
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                {
                    let sink = EpilogueSink::new(&p, &env, shape, &[], &mut got, shape);
                    pool.install(|| drain(&sink, &values, n, &scratch));
                }
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{b}x{c}x{n} per channel {per_channel}, {threads} threads"
                );
            }
        }
    }
}

/// Bit patterns, so that equal NaNs compare equal and -0 differs from 0.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The discretisation recipe recognises the forms models write `a` and
/// `u` in and computes the interpreter's values bit for bit, on every
/// line length (vector blocks and remainders); lines it cannot read in
/// place, and programs of other forms, are left to the interpreter.
#[test]
fn discretise_recipe_matches_the_interpreter_bit_for_bit() {
    use super::recipes::Discretise;
    let (c, n) = (3, 203);
    let mut rng = Rng::new(11);
    let mut env = TestEnv::default();
    let mut p_data = rng.vec(c * n, -30.0, 30.0);
    p_data[5] = 0.0;
    p_data[6] = -0.0;
    p_data[7] = 1e-30;
    let p = env.stored(&[1, c, n], p_data);
    let x = env.stored(&[1, c, n], rng.vec(c * n, -2.0, 2.0));
    let big_a = env.stored(&[c, 1], rng.vec(c, 0.1, 3.0));
    let per_step = env.stored(&[1, c, n], rng.vec(c * n, 0.1, 3.0));
    let xt = env.stored(&[1, n, c], rng.vec(c * n, -2.0, 2.0));
    let long = env.stored(&[1, c, n + 5], rng.vec(c * (n + 5), -2.0, 2.0));
    let full = env.virt(&[1, c, n]);
    let un = |op, x| Expr::Unary { op, x };
    let mul = |a, b| Expr::Binary {
        op: BinaryOp::Mul,
        a,
        b,
    };
    // Builds `[a, u]` from `p`, `k` and `x` values: `form` picks where the
    // negation goes and the factors' order, `sp` whether dt = softplus(p).
    let build = |form: usize, sp: bool, k_val: Option<usize>, x_val: usize, x_view: bool| {
        let mut g = Program::default();
        let lp = g.push(Expr::Load, p);
        let dt = if sp {
            g.push(un(UnaryOp::Softplus, lp), full)
        } else {
            lp
        };
        let k = match k_val {
            Some(v) => {
                let lk = g.push(Expr::Load, v);
                g.push(Expr::Broadcast { x: lk }, full)
            }
            None => g.push(Expr::Const(-0.75), full),
        };
        let e = match form {
            // exp(-dt * A), as DiagonalSSM writes it
            0 => {
                let ng = g.push(un(UnaryOp::Neg, dt), full);
                g.push(mul(ng, k), full)
            }
            // exp(-(A * dt))
            1 => {
                let m = g.push(mul(k, dt), full);
                g.push(un(UnaryOp::Neg, m), full)
            }
            // exp(dt * A) with A < 0 (Mamba's own form)
            2 => g.push(mul(dt, k), full),
            // exp(-(-A) * (-dt)): negations cancel
            _ => {
                let nk = g.push(un(UnaryOp::Neg, k), full);
                let nd = g.push(un(UnaryOp::Neg, dt), full);
                let m = g.push(mul(nk, nd), full);
                g.push(un(UnaryOp::Neg, m), full)
            }
        };
        let ra = g.push(un(UnaryOp::Exp, e), full);
        let lx = g.push(Expr::Load, x_val);
        let xv = if x_view {
            let mut map = [None; MAX_RANK];
            map[..3].copy_from_slice(&[Some(0), Some(2), Some(1)]);
            g.push(Expr::View { x: lx, map }, full)
        } else {
            lx
        };
        let ru = g.push(mul(xv, dt), full);
        g.set_roots(vec![ra, ru]);
        g
    };
    let line_of = |r: usize, t0: usize| {
        let mut base = [0; MAX_RANK];
        base[1] = r;
        base[2] = t0;
        Line::along(base, 2)
    };
    // Every line length from 1 to past a vector block, at every offset.
    let check = |g: &Program, recipe: &Discretise, expect_run: bool| {
        for r in 0..c {
            for (t0, len) in [(0, n), (0, 64), (1, 79), (64, 64), (130, 73), (202, 1)] {
                let line = line_of(r, t0);
                let (mut a0, mut u0) = (vec![0.0; len], vec![0.0; len]);
                let mut tmp = vec![0.0; len * g.temporaries()];
                g.eval_roots(
                    Isa::detect(),
                    &env,
                    &[],
                    &line,
                    &mut [&mut a0, &mut u0],
                    &mut tmp,
                );
                let (mut a1, mut u1) = (vec![7.0; len], vec![7.0; len]);
                let ran = recipe.run(&line, &mut a1, &mut u1);
                assert_eq!(ran, expect_run, "line {r} {t0} {len}");
                if ran {
                    assert_eq!(bits(&a0), bits(&a1), "a, line {r} {t0} {len}");
                    assert_eq!(bits(&u0), bits(&u1), "u, line {r} {t0} {len}");
                } else {
                    assert!(a1.iter().chain(&u1).all(|&v| v == 7.0), "wrote nothing");
                }
            }
        }
    };
    for form in 0..4 {
        for sp in [true, false] {
            for k in [Some(big_a), None] {
                let g = build(form, sp, k, x, false);
                let recipe = Discretise::find(&g, &g.roots(), &env)
                    .unwrap_or_else(|| panic!("form {form}, softplus {sp}"));
                check(&g, &recipe, true);
            }
        }
    }
    // `x` as the last `n` steps of a longer tensor (a slice counted from
    // the end: the leaf's offset): read in place.
    let mut g = build(0, true, Some(big_a), x, false);
    let ll = g.push(Expr::Load, long);
    let sl = g.push(
        Expr::Slice {
            x: ll,
            dim: 2,
            start: -(n as i64),
            step: 1,
        },
        full,
    );
    let roots = g.roots();
    let Expr::Binary { b: dt, .. } = g.nodes()[roots[1]].expr else {
        unreachable!()
    };
    let ru = g.push(mul(dt, sl), full);
    g.set_roots(vec![roots[0], ru]);
    check(&g, &Discretise::find(&g, &g.roots(), &env).unwrap(), true);
    // A decay that varies along time, or a transposed `x`, is found but
    // read through the interpreter.
    let g = build(0, true, Some(per_step), x, false);
    check(&g, &Discretise::find(&g, &g.roots(), &env).unwrap(), false);
    let g = build(0, true, Some(big_a), xt, true);
    check(&g, &Discretise::find(&g, &g.roots(), &env).unwrap(), false);
    // Other forms are not this recipe: one root, roots swapped, a sigmoid
    // instead of exp, dt not shared.
    let g = build(0, true, Some(big_a), x, false);
    assert!(Discretise::find(&g, &[g.roots()[0]], &env).is_none());
    assert!(Discretise::find(&g, &[g.roots()[1], g.roots()[0]], &env).is_none());
    let mut h = Program::default();
    let lp = h.push(Expr::Load, p);
    let dt = h.push(un(UnaryOp::Softplus, lp), full);
    let dt2 = h.push(un(UnaryOp::Softplus, lp), full);
    let lk = h.push(Expr::Load, big_a);
    let k = h.push(Expr::Broadcast { x: lk }, full);
    let m = h.push(mul(dt, k), full);
    let ra = h.push(un(UnaryOp::Sigmoid, m), full);
    let ra2 = h.push(un(UnaryOp::Exp, m), full);
    let lx = h.push(Expr::Load, x);
    let ru = h.push(mul(dt, lx), full);
    let ru2 = h.push(mul(dt2, lx), full);
    assert!(Discretise::find(&h, &[ra, ru], &env).is_none(), "sigmoid");
    assert!(
        Discretise::find(&h, &[ra2, ru2], &env).is_none(),
        "dt not shared"
    );
    assert!(Discretise::find(&h, &[ra2, ru], &env).is_some());
}

/// Stores the anchor values `y` (`[1, c, n]`) through an epilogue sink of
/// `program`, 64 elements per call, and checks the result against the
/// interpreter's bit for bit.
fn assert_sink_is_the_interpreter(program: &Program, env: &TestEnv, y: &[f32], c: usize, n: usize) {
    let mut out = vec![0.0; c * n];
    let shape = Shape::new(&[1, c, n]);
    let program = program.clone().compile();
    let sink = EpilogueSink::new(&program, env, shape, &[], &mut out, shape);
    let mut tmp = vec![0.0; 64 * sink.temporaries()];
    for r in 0..c {
        for t0 in (0..n).step_by(64) {
            let len = 64.min(n - t0);
            sink.store(r, t0, &y[r * n + t0..][..len], &mut tmp);
        }
    }
    let mut want = vec![0.0; c * n];
    let mut tmp = vec![0.0; n * program.temporaries()];
    for r in 0..c {
        let mut base = [0; MAX_RANK];
        base[1] = r;
        let line = Line::along(base, 2);
        program.eval(
            env,
            &y[r * n..][..n],
            &line,
            &mut want[r * n..][..n],
            &mut tmp,
        );
    }
    assert_eq!(bits(&want), bits(&out));
}

/// The gate recipe (`y * silu(z)`, `y * z`, either order) stores the
/// interpreter's values bit for bit, straight into the result; a sigmoid
/// gate or a transposed one goes through the interpreter, with the same
/// result.
#[test]
fn gate_recipe_matches_the_interpreter_bit_for_bit() {
    use super::recipes::Gate;
    let (c, n) = (2, 150);
    let mut rng = Rng::new(12);
    let mut env = TestEnv::default();
    let mut z_data = rng.vec(c * n, -40.0, 40.0);
    z_data[3] = 0.0;
    z_data[4] = -0.0;
    let z = env.stored(&[1, c, n], z_data);
    let zt = env.stored(&[1, n, c], rng.vec(c * n, -4.0, 4.0));
    let full = env.virt(&[1, c, n]);
    let y = rng.vec(c * n, -3.0, 3.0);
    let mut cases = vec![];
    for (op, anchor_first, transposed) in [
        (Some(UnaryOp::Silu), true, false),
        (Some(UnaryOp::Silu), false, false),
        (None, true, false),
        (None, false, false),
        (Some(UnaryOp::Sigmoid), true, false),
        (Some(UnaryOp::Silu), true, true),
    ] {
        let mut g = Program::default();
        let an = g.push(Expr::Anchor, full);
        let lz = if transposed {
            let l = g.push(Expr::Load, zt);
            let mut map = [None; MAX_RANK];
            map[..3].copy_from_slice(&[Some(0), Some(2), Some(1)]);
            g.push(Expr::View { x: l, map }, full)
        } else {
            g.push(Expr::Load, z)
        };
        let gz = match op {
            Some(op) => g.push(Expr::Unary { op, x: lz }, full),
            None => lz,
        };
        let (a, b) = if anchor_first { (an, gz) } else { (gz, an) };
        g.push(
            Expr::Binary {
                op: BinaryOp::Mul,
                a,
                b,
            },
            full,
        );
        let found = Gate::find(&g, &env);
        assert_eq!(found.is_some(), op != Some(UnaryOp::Sigmoid), "{op:?}");
        cases.push((g, found, transposed));
    }
    for (g, found, transposed) in &cases {
        let mut tmp = vec![0.0; n * g.temporaries()];
        for r in 0..c {
            for (t0, len) in [(0, n), (0, 64), (3, 100), (149, 1)] {
                let mut base = [0; MAX_RANK];
                base[1] = r;
                base[2] = t0;
                let line = Line::along(base, 2);
                let ys = &y[r * n + t0..][..len];
                let mut want = vec![0.0; len];
                g.eval(Isa::detect(), &env, ys, &line, &mut want, &mut tmp);
                if let Some(gate) = found {
                    let mut got = vec![7.0; len];
                    let ran = gate.run(&line, ys, &mut got);
                    assert_eq!(ran, !transposed);
                    if ran {
                        assert_eq!(bits(&want), bits(&got));
                    }
                }
            }
        }
        // Through the sink (the recipe's direct store, or the interpreter).
        assert_sink_is_the_interpreter(g, &env, &y, c, n);
    }
}

/// A gated result larger than the caches (16 MiB and up) is streamed
/// past them: the same values as the interpreter's.
#[test]
fn a_large_gated_result_is_streamed_with_the_same_values() {
    let (c, n) = (2, (8 << 20) / 4 + 37);
    let mut rng = Rng::new(13);
    let mut env = TestEnv::default();
    let z = env.stored(&[1, c, n], rng.vec(c * n, -4.0, 4.0));
    let full = env.virt(&[1, c, n]);
    let y = rng.vec(c * n, -3.0, 3.0);
    let mut g = Program::default();
    let an = g.push(Expr::Anchor, full);
    let lz = g.push(Expr::Load, z);
    let sz = g.push(
        Expr::Unary {
            op: UnaryOp::Silu,
            x: lz,
        },
        full,
    );
    g.push(
        Expr::Binary {
            op: BinaryOp::Mul,
            a: an,
            b: sz,
        },
        full,
    );
    let mut out = vec![0.0; c * n];
    let g = g.compile();
    let sink = EpilogueSink::new(
        &g,
        &env,
        Shape::new(&[1, c, n]),
        &[],
        &mut out,
        Shape::new(&[1, c, n]),
    );
    let chunk = 509; // odd, so that lines start at every alignment
    let mut tmp = vec![0.0; chunk * sink.temporaries()];
    for r in 0..c {
        for t0 in (0..n).step_by(chunk) {
            let len = chunk.min(n - t0);
            sink.store(r, t0, &y[r * n + t0..][..len], &mut tmp);
        }
    }
    let want: Vec<f32> = y
        .iter()
        .zip(&env.data[z])
        .map(|(&y, &z)| {
            let mut s = [z];
            UnaryOp::Silu.apply(Isa::detect(), &mut s);
            y * s[0]
        })
        .collect();
    assert!(bits(&want) == bits(&out), "streamed result differs");
}

/// The gated convolution's recipes (`conv_recipes.rs`): the prologue
/// `v * x` and the epilogue `act((y + d * u) * g)`, in the orders and forms
/// models write them (GELU or none, `u` stored or `v * x`, operands either
/// side), give the interpreter's values bit for bit, alone and through the
/// source and sink; a transposed operand is interpreted, with the same
/// result, and other forms are not taken.
#[test]
fn gated_conv_recipes_match_the_interpreter_bit_for_bit() {
    use super::conv_recipes::{Product, SkipGate};
    let (c, n) = (3, 150);
    let mut rng = Rng::new(14);
    let mut env = TestEnv::default();
    let full = env.virt(&[1, c, n]);
    let v = env.stored(&[1, c, n], rng.vec(c * n, -3.0, 3.0));
    let x = env.stored(&[1, c, n], rng.vec(c * n, -3.0, 3.0));
    let g = env.stored(&[1, c, n], rng.vec(c * n, -3.0, 3.0));
    let xt = env.stored(&[1, n, c], rng.vec(c * n, -3.0, 3.0));
    let d = env.stored(&[c, 1], rng.vec(c, -2.0, 2.0));
    let y = rng.vec(c * n, -3.0, 3.0);
    let mul = |p: &mut Program, a: usize, b: usize| {
        p.push(
            Expr::Binary {
                op: BinaryOp::Mul,
                a,
                b,
            },
            full,
        )
    };
    // `x`, or the transposed tensor read through a view.
    let load_x = |p: &mut Program, transposed: bool| {
        if transposed {
            let l = p.push(Expr::Load, xt);
            let mut map = [None; MAX_RANK];
            map[..3].copy_from_slice(&[Some(0), Some(2), Some(1)]);
            p.push(Expr::View { x: l, map }, full)
        } else {
            p.push(Expr::Load, x)
        }
    };
    let row_line = |r: usize, t0: usize| {
        let mut base = [0; MAX_RANK];
        base[1] = r;
        base[2] = t0;
        Line::along(base, 2)
    };
    let lines = [(0, n), (0, 64), (3, 100), (149, 1)];

    // The prologue.
    for transposed in [false, true] {
        let mut p = Program::default();
        let lv = p.push(Expr::Load, v);
        let lx = load_x(&mut p, transposed);
        mul(&mut p, lx, lv);
        let recipe = Product::find(&p, &env).expect("a product of two leaves");
        let compiled = p.clone().compile();
        let mut tmp = vec![0.0; n * p.temporaries()];
        for r in 0..c {
            for (t0, len) in lines {
                let line = row_line(r, t0);
                let mut want = vec![0.0; len];
                p.eval(Isa::detect(), &env, &[], &line, &mut want, &mut tmp);
                let mut got = vec![7.0; len];
                assert_eq!(recipe.run(&line, &mut got), !transposed);
                let mut filled = vec![7.0; len];
                ProgramRows::new(&compiled, &env).fill(r, t0, &mut filled, &mut tmp);
                assert_eq!(bits(&want), bits(&filled));
                if !transposed {
                    assert_eq!(bits(&want), bits(&got));
                }
            }
        }
    }
    let mut p = Program::default();
    let lv = p.push(Expr::Load, v);
    let e = p.push(
        Expr::Unary {
            op: UnaryOp::Exp,
            x: lv,
        },
        full,
    );
    let lx = p.push(Expr::Load, x);
    mul(&mut p, e, lx);
    assert!(
        Product::find(&p, &env).is_none(),
        "exp(v) * x is no product of leaves"
    );

    // The epilogue.
    for (gelu, anchor_first, d_first, u_product, gate_first, transposed, add) in [
        (true, true, true, true, false, false, true),
        (true, false, false, true, true, false, true),
        (false, true, false, true, false, false, true),
        (true, true, true, false, false, false, true),
        (true, true, true, true, false, true, true),
        (true, true, true, true, false, false, false),
    ] {
        let mut p = Program::default();
        let an = p.push(Expr::Anchor, full);
        let ld = p.push(Expr::Load, d);
        let bd = p.push(Expr::Broadcast { x: ld }, full);
        let u = if u_product {
            let lv = p.push(Expr::Load, v);
            let lx = load_x(&mut p, transposed);
            mul(&mut p, lv, lx)
        } else {
            p.push(Expr::Load, v)
        };
        let skip = if d_first {
            mul(&mut p, bd, u)
        } else {
            mul(&mut p, u, bd)
        };
        let (a, b) = if anchor_first { (an, skip) } else { (skip, an) };
        let op = if add { BinaryOp::Add } else { BinaryOp::Sub };
        let sum = p.push(Expr::Binary { op, a, b }, full);
        let lg = p.push(Expr::Load, g);
        let gated = if gate_first {
            mul(&mut p, lg, sum)
        } else {
            mul(&mut p, sum, lg)
        };
        if gelu {
            p.push(
                Expr::Unary {
                    op: UnaryOp::Gelu,
                    x: gated,
                },
                full,
            );
        }
        let found = SkipGate::find(&p, &env);
        assert_eq!(
            found.is_some(),
            add,
            "only a sum with the skip is the recipe"
        );
        let mut tmp = vec![0.0; n * p.temporaries()];
        for r in 0..c {
            for (t0, len) in lines {
                let line = row_line(r, t0);
                let ys = &y[r * n + t0..][..len];
                let mut want = vec![0.0; len];
                p.eval(Isa::detect(), &env, ys, &line, &mut want, &mut tmp);
                if let Some(recipe) = &found {
                    let mut got = vec![7.0; len];
                    assert_eq!(
                        recipe.run(&line, ys, &mut got),
                        !transposed,
                        "{gelu} {anchor_first} {d_first} {u_product} {gate_first} line {t0}+{len}"
                    );
                    if !transposed {
                        assert_eq!(bits(&want), bits(&got));
                    }
                }
            }
        }
        assert_sink_is_the_interpreter(&p, &env, &y, c, n);
    }
}

/// `fill_rows` of short lines (a conv's prologue at a decode-sized or
/// streaming call) reads across the rows, one line per step: every row
/// block, offset and length short enough (`short_rows`) and a block
/// crossing batch items (read row by row), the same bits as filling row by
/// row.
#[test]
fn short_lines_fill_across_their_rows_bit_for_bit() {
    let mut rng = Rng::new(21);
    for (b, c, n) in [
        (2, 129, 4),
        (1, 128, 1),
        (3, 5, 7),
        (1, 300, 6),
        (2, 9, 9),
        (1, 64, 10),
        (2, 200, 24),
    ] {
        let mut env = TestEnv::default();
        let x = env.stored(&[b, c, n], rng.vec(b * c * n, -2.0, 2.0));
        let y = env.stored(&[b, c, n], rng.vec(b * c * n, -2.0, 2.0));
        let t = env.virt(&[b, c, n]);
        let mut p = Program::default();
        let lx = p.push(Expr::Load, x);
        let ly = p.push(Expr::Load, y);
        let prod = p.push(
            Expr::Binary {
                op: BinaryOp::Mul,
                a: lx,
                b: lx,
            },
            t,
        );
        let sum = p.push(
            Expr::Binary {
                op: BinaryOp::Add,
                a: prod,
                b: ly,
            },
            t,
        );
        p.push(
            Expr::Unary {
                op: UnaryOp::Tanh,
                x: sum,
            },
            t,
        );
        let p = p.compile();
        let rows = ProgramRows::new(&p, &env);
        let mut tmp = vec![f32::NAN; block_tmp(p.temporaries(), n)];
        for (row0, m) in [
            (0, c.min(ROW_BLOCK)),
            (1, c - 1),
            (c / 2, c - c / 2),
            (c - 1, 2),
        ] {
            let m = m.min(b * c - row0).min(ROW_BLOCK);
            for (t0, len) in [(0, n), (n / 2, n - n / 2), (n - 1, 1)] {
                let mut want = vec![0.0; m * len];
                for (r, out) in want.chunks_exact_mut(len).enumerate() {
                    rows.fill(row0 + r, t0, out, &mut tmp);
                }
                let mut got = vec![f32::NAN; m * len];
                rows.fill_rows(row0, m, t0, len, &mut got, &mut tmp);
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{b}x{c}x{n} rows {row0}+{m} t {t0}+{len}"
                );
            }
        }
    }
}

/// `store_rows` of short rows through an epilogue that walks a program
/// (a conv's GELU at a streaming call of 8 frames) finishes and stores
/// across the rows, a line per step: the same bits as storing row by row,
/// for blocks within one batch item and one crossing two (stored row by
/// row), and nothing outside the block written.
#[test]
fn short_rows_store_across_their_rows_bit_for_bit() {
    let mut rng = Rng::new(22);
    for (b, c, n) in [(1, 128, 8), (2, 64, 10), (1, 300, 3), (2, 9, 9)] {
        let mut env = TestEnv::default();
        let skip = env.stored(&[b, c, n], rng.vec(b * c * n, -2.0, 2.0));
        let y = env.virt(&[b, c, n]);
        let mut p = Program::default();
        let an = p.push(Expr::Anchor, y);
        let ls = p.push(Expr::Load, skip);
        let sum = p.push(
            Expr::Binary {
                op: BinaryOp::Add,
                a: an,
                b: ls,
            },
            y,
        );
        p.push(
            Expr::Unary {
                op: UnaryOp::Gelu,
                x: sum,
            },
            y,
        );
        let values = rng.vec(b * c * n, -3.0, 3.0);
        let shape = Shape::new(&[b, c, n]);
        let mut tmp = vec![f32::NAN; block_tmp(p.temporaries() + 1, n)];
        let p = p.compile();
        for (row0, m) in [(0, c.min(ROW_BLOCK)), (1, c - 1), (c - 1, 2)] {
            let m = m.min(b * c - row0).min(ROW_BLOCK);
            let block = &values[row0 * n..][..m * n];
            let mut want = vec![-7.0; b * c * n];
            let by_row = EpilogueSink::new(&p, &env, shape, &[], &mut want, shape);
            for (r, v) in block.chunks_exact(n).enumerate() {
                by_row.store(row0 + r, 0, v, &mut tmp);
            }
            let mut got = vec![-7.0; b * c * n];
            let sink = EpilogueSink::new(&p, &env, shape, &[], &mut got, shape);
            let crosses = row0 % c + m > c;
            assert_eq!(
                sink.stores_across(row0, m, n),
                rows::short_rows(m, n) && !crosses,
                "{b}x{c}x{n} rows {row0}+{m}"
            );
            sink.store_rows(row0, m, 0, n, &mut block.to_vec(), &mut tmp);
            assert_eq!(bits(&got), bits(&want), "{b}x{c}x{n} rows {row0}+{m}");
        }
    }
}

/// A pointwise epilogue (a conv's activation, after a scale and a shift by
/// constants) finishes a whole block of rows in place, then stores it as
/// an identity would: transposed into a `[B, N, C]` result (across the
/// rows) or row by row. The same values as the activation applied to every
/// anchor value, bit for bit, in both layouts, for blocks that start and
/// end mid-item.
#[test]
fn pointwise_epilogues_finish_blocks_in_place_bit_for_bit() {
    let mut rng = Rng::new(23);
    let transpose = [Some(0), Some(2), Some(1), None];
    for (b, c, n) in [(1, 128, 32), (2, 64, 10), (1, 300, 3), (2, 9, 17)] {
        for (scaled, transposed) in [(false, true), (true, true), (true, false)] {
            let mut env = TestEnv::default();
            let y = env.virt(&[b, c, n]);
            let mut p = Program::default();
            let mut x = p.push(Expr::Anchor, y);
            if scaled {
                let half = p.push(Expr::Const(0.5), y);
                x = p.push(
                    Expr::Binary {
                        op: BinaryOp::Mul,
                        a: half,
                        b: x,
                    },
                    y,
                );
                let shift = p.push(Expr::Const(0.25), y);
                x = p.push(
                    Expr::Binary {
                        op: BinaryOp::Add,
                        a: x,
                        b: shift,
                    },
                    y,
                );
            }
            p.push(
                Expr::Unary {
                    op: UnaryOp::Gelu,
                    x,
                },
                y,
            );
            let p = p.compile();
            let values = rng.vec(b * c * n, -3.0, 3.0);
            // The reference: the same functions over every value, placed
            // by hand.
            let mut act = values.clone();
            if scaled {
                act.iter_mut().for_each(|v| *v = 0.5 * *v + 0.25);
            }
            UnaryOp::Gelu.apply(Isa::detect(), &mut act);
            let mut want = vec![0.0; b * c * n];
            for (i, &v) in act.iter().enumerate() {
                let (bi, ci, t) = (i / (c * n), i / n % c, i % n);
                let at = if transposed { (bi * n + t) * c + ci } else { i };
                want[at] = v;
            }
            let views = [StoreView {
                map: transpose,
                rank: 3,
            }];
            let (views, out_dims): (&[StoreView], _) = if transposed {
                (&views, [b, n, c])
            } else {
                (&[], [b, c, n])
            };
            let mut got = vec![f32::NAN; b * c * n];
            let shape = Shape::new(&[b, c, n]);
            let mut tmp = vec![f32::NAN; block_tmp(p.temporaries() + 1, n)];
            {
                let sink =
                    EpilogueSink::new(&p, &env, shape, views, &mut got, Shape::new(&out_dims));
                assert_eq!(sink.prefers_columns(), transposed);
                // Blocks of uneven sizes within each batch item (as a
                // kernel hands them over: one item's channels).
                for item in 0..b {
                    let mut row0 = item * c;
                    for m in [1, 7, 64, 5, ROW_BLOCK].into_iter().cycle() {
                        if row0 == (item + 1) * c {
                            break;
                        }
                        let m = m.min((item + 1) * c - row0);
                        let mut block = values[row0 * n..][..m * n].to_vec();
                        sink.store_rows(row0, m, 0, n, &mut block, &mut tmp);
                        row0 += m;
                    }
                }
            }
            assert_eq!(
                bits(&got),
                bits(&want),
                "{b}x{c}x{n} scaled {scaled} transposed {transposed}"
            );
        }
    }
}

/// A conformer's GLU before its depthwise conv (`a * sigmoid(g)`, two
/// halves of a `[B, 2C, N]` tensor) runs as its flat form: rows filled
/// one by one and blocks of whole rows filled as one line (they lie end to
/// end in both halves) give the interpreter's bits; a block of partial
/// rows, or a program with a per-channel operand, is not one line.
#[test]
fn glu_prologues_fill_whole_rows_as_one_line_bit_for_bit() {
    let mut rng = Rng::new(24);
    for (b, c, n) in [(1, 128, 32), (2, 9, 17), (1, 5, 1), (1, 3, 100)] {
        let mut env = TestEnv::default();
        let y = env.stored(&[b, 2 * c, n], rng.vec(b * 2 * c * n, -3.0, 3.0));
        let param = env.stored(&[c, 1], rng.vec(c, -1.0, 1.0));
        let half = env.computed(&[b, c, n]);
        let mut p = Program::default();
        let ly = p.push(Expr::Load, y);
        let a = p.push(
            Expr::Slice {
                x: ly,
                dim: 1,
                start: 0,
                step: 1,
            },
            half,
        );
        let g = p.push(
            Expr::Slice {
                x: ly,
                dim: 1,
                start: c as i64,
                step: 1,
            },
            half,
        );
        let s = p.push(
            Expr::Unary {
                op: UnaryOp::Sigmoid,
                x: g,
            },
            half,
        );
        p.push(
            Expr::Binary {
                op: BinaryOp::Mul,
                a,
                b: s,
            },
            half,
        );
        // The same gate scaled per channel: its rows are not one line.
        let mut scaled = p.clone();
        let root = scaled.root();
        let lp = scaled.push(Expr::Load, param);
        let bp = scaled.push(Expr::Broadcast { x: lp }, half);
        scaled.push(
            Expr::Binary {
                op: BinaryOp::Mul,
                a: root,
                b: bp,
            },
            half,
        );
        for (p, per_channel) in [(p, false), (scaled, true)] {
            let p = p.compile();
            let rows = ProgramRows::new(&p, &env);
            let flat = p.recipes().prologue(&p, &env).flat.expect("a flat form");
            assert_eq!(flat.rows_are_one_line(1, 2, n), !per_channel);
            assert!(n == 1 || !flat.rows_are_one_line(1, 2, n - 1));
            let mut tmp = vec![f32::NAN; block_tmp(p.temporaries(), n)];
            let mut line_tmp = vec![f32::NAN; n * p.temporaries()];
            for (row0, m) in [(0, c), (1, c - 1), (b * c - 2, 2)] {
                let m = m.min(ROW_BLOCK);
                for (t0, len) in [(0, n), (n / 2, n - n / 2)] {
                    let mut want = vec![0.0; m * len];
                    for (r, out) in want.chunks_exact_mut(len).enumerate() {
                        let row = row0 + r;
                        let mut base = [0; MAX_RANK];
                        (base[0], base[1], base[2]) = (row / c, row % c, t0);
                        p.eval(&env, &[], &Line::along(base, 2), out, &mut line_tmp);
                    }
                    let mut got = vec![f32::NAN; m * len];
                    rows.fill_rows(row0, m, t0, len, &mut got, &mut tmp);
                    let at = format!("{b}x{c}x{n} rows {row0}+{m} t {t0}+{len}");
                    assert_eq!(bits(&got), bits(&want), "{at}");
                    let mut one = vec![f32::NAN; len];
                    rows.fill(row0, t0, &mut one, &mut tmp);
                    assert_eq!(bits(&one), bits(&want[..len]), "{at}");
                }
            }
        }
    }
}

/// An epilogue no dedicated recipe takes (a PReLU: a select on the sign,
/// its slope per channel or one constant) runs as its flat form: stored
/// row by row, and, with a constant slope (pointwise), finished in place
/// a block of rows at a time and stored transposed, it gives the
/// interpreter's bits.
#[test]
fn select_epilogues_run_flat_bit_for_bit() {
    let mut rng = Rng::new(25);
    let transpose = [Some(0), Some(2), Some(1), None];
    for (c, n) in [(128, 32), (9, 17), (5, 130)] {
        for per_channel in [true, false] {
            let mut env = TestEnv::default();
            let y = env.virt(&[1, c, n]);
            let slope = env.stored(&[c, 1], rng.vec(c, 0.0, 0.5));
            let mut p = Program::default();
            let an = p.push(Expr::Anchor, y);
            let zero = p.push(Expr::Const(0.0), y);
            let pos = p.push(
                Expr::Binary {
                    op: BinaryOp::Gt,
                    a: an,
                    b: zero,
                },
                y,
            );
            let k = if per_channel {
                let ls = p.push(Expr::Load, slope);
                p.push(Expr::Broadcast { x: ls }, y)
            } else {
                p.push(Expr::Const(0.125), y)
            };
            let neg = p.push(
                Expr::Binary {
                    op: BinaryOp::Mul,
                    a: an,
                    b: k,
                },
                y,
            );
            p.push(
                Expr::Where {
                    cond: pos,
                    a: an,
                    b: neg,
                },
                y,
            );
            let compiled = p.clone().compile();
            assert!(matches!(
                compiled.recipes().epilogue(&compiled, &env),
                Some(compiled::EpilogueRecipe::Flat(_))
            ));
            let values = rng.vec(c * n, -3.0, 3.0);
            assert_sink_is_the_interpreter(&p, &env, &values, c, n);
            if per_channel {
                continue;
            }
            // The reference, transposed by hand.
            let mut want = vec![0.0; c * n];
            let mut line_tmp = vec![0.0; n * p.temporaries()];
            for r in 0..c {
                let mut base = [0; MAX_RANK];
                base[1] = r;
                let mut row = vec![0.0; n];
                p.eval(
                    Isa::detect(),
                    &env,
                    &values[r * n..][..n],
                    &Line::along(base, 2),
                    &mut row,
                    &mut line_tmp,
                );
                for (t, v) in row.into_iter().enumerate() {
                    want[t * c + r] = v;
                }
            }
            let p = p.compile();
            let views = [StoreView {
                map: transpose,
                rank: 3,
            }];
            let mut got = vec![f32::NAN; c * n];
            let shape = Shape::new(&[1, c, n]);
            let mut tmp = vec![f32::NAN; block_tmp(p.temporaries() + 1, n)];
            {
                let sink =
                    EpilogueSink::new(&p, &env, shape, &views, &mut got, Shape::new(&[1, n, c]));
                let mut row0 = 0;
                for m in [1, 7, 64, 5].into_iter().cycle() {
                    if row0 == c {
                        break;
                    }
                    let m = m.min(c - row0);
                    let mut block = values[row0 * n..][..m * n].to_vec();
                    sink.store_rows(row0, m, 0, n, &mut block, &mut tmp);
                    row0 += m;
                }
            }
            assert_eq!(bits(&got), bits(&want), "{c}x{n}");
        }
    }
}
