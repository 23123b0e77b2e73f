//! Fused kernels: blobs whose nodes the exporter grouped (`Node.kernel`),
//! run against references computed here index by index, grouped and
//! ungrouped; and groupings the runtime must refuse.

use super::*;

const D: usize = 4;
const KW: usize = 3;
const NMAX: usize = 32;

fn conv_weights() -> Vec<f32> {
    ramp(D * KW, 0.1)
}

/// transformers' Lfm2ShortConv between its projections: `bcx [1, N, 3D]`
/// -> transpose -> chunk(3) -> `b * x` -> causal depthwise conv -> `c * y`
/// -> transpose -> `[1, N, D]`.
fn lfm2_blob(kernels: &[i32]) -> Vec<u8> {
    let n = dynamic(NMAX as i64);
    let d = s(D as i64);
    build_blob_grouped(
        &[
            input("bcx", 0, &[s(1), n, s(3 * D as i64)]),
            constant("w", &[D as i64, 1, KW as i64], conv_weights()),
            inter("bcx_t", &[s(1), s(3 * D as i64), n]),
            inter("b", &[s(1), d, n]),
            inter("c", &[s(1), d, n]),
            inter("x", &[s(1), d, n]),
            inter("bx", &[s(1), d, n]),
            inter("y", &[s(1), d, n]),
            inter("cy", &[s(1), d, n]),
            output("out", 0, &[s(1), n, d]),
        ],
        &[0],
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
                end: D as i64,
            },
            N::Slice {
                input: 2,
                output: 4,
                dim: 1,
                start: D as i64,
                end: 2 * D as i64,
            },
            N::Slice {
                input: 2,
                output: 5,
                dim: 1,
                start: 2 * D as i64,
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
                groups: D as u32,
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

fn lfm2_reference(bcx: &[f32], n: usize) -> Vec<f32> {
    let w = conv_weights();
    let at = |t: usize, ch: usize| bcx[t * 3 * D + ch];
    let mut out = vec![0.0; n * D];
    for t in 0..n {
        for c in 0..D {
            let mut y = 0.0;
            for k in 0..KW {
                if let Some(ti) = (t + k).checked_sub(KW - 1) {
                    y += w[c * KW + k] * at(ti, c) * at(ti, 2 * D + c);
                }
            }
            out[t * D + c] = at(t, D + c) * y;
        }
    }
    out
}

fn run(d: &Delegate, inputs: Vec<T>, outputs: Vec<T>) -> Args {
    let mut args = Args(inputs.into_iter().chain(outputs).collect());
    d.execute(&mut args).unwrap();
    args
}

#[test]
fn lfm2_block_is_one_step_and_matches_the_reference_at_every_length() {
    // The delegate may read the blob's constants in place: keep it alive.
    let (fused_blob, unfused_blob) = (lfm2_blob(&[0; 8]), lfm2_blob(&[-1; 8]));
    let fused = init(&fused_blob).unwrap();
    let plan = fused.plan().unwrap();
    assert_eq!(plan.steps.len(), 1, "{:?}", plan.steps);
    assert_eq!(plan.steps[0].absorbed.len(), 8);
    assert_eq!(plan.steps[0].algorithm(), "depthwise_simd");
    assert_eq!(
        plan.arena_bytes, 0,
        "nothing between the projections is stored"
    );
    assert!(
        plan.report
            .iter()
            .any(|l| l.contains("prologue in its loops, epilogue in its loops")),
        "{:?}",
        plan.report
    );

    let unfused = init(&unfused_blob).unwrap();
    assert_eq!(unfused.plan().unwrap().steps.len(), 8);
    for n in [1, 2, 5, NMAX] {
        let bcx = ramp(n * 3 * D, 0.05);
        let want = lfm2_reference(&bcx, n);
        for d in [&fused, &unfused] {
            let args = run(
                d,
                vec![tensor(&[1, n as i32, 3 * D as i32], bcx.clone())],
                vec![out_tensor(&[1, NMAX as i32, D as i32])],
            );
            assert_eq!(args.0[1].sizes, vec![1, n as i32, D as i32]);
            assert_close(&args.0[1].data[..n * D], &want);
        }
    }
}

/// `dt = softplus(p)`, `a = exp(-(dt * A))`, `u = dt * x`,
/// `y = scan(x0, a, u)`, `out = y * silu(z)`, in one kernel.
#[test]
fn ssm_block_runs_its_coefficients_and_gate_inside_the_scan() {
    let n = dynamic(NMAX as i64);
    let d = s(D as i64);
    let big_a = vec![0.5, 1.0, 1.5, 2.0];
    let blob = build_blob_grouped(
        &[
            input("p", 0, &[s(1), d, n]),
            input("x", 1, &[s(1), d, n]),
            input("z", 2, &[s(1), d, n]),
            input("x0", 3, &[s(1), d]),
            constant("A", &[D as i64, 1], big_a.clone()),
            inter("dt", &[s(1), d, n]),
            inter("dtA", &[s(1), d, n]),
            inter("neg", &[s(1), d, n]),
            inter("a", &[s(1), d, n]),
            inter("u", &[s(1), d, n]),
            inter("y", &[s(1), d, n]),
            inter("sz", &[s(1), d, n]),
            output("out", 0, &[s(1), d, n]),
        ],
        &[0, 1, 2, 3],
        &[12],
        &[
            N::Unary {
                op: fb::UnaryOp::Softplus,
                input: 0,
                output: 5,
            },
            N::Binary {
                op: fb::BinaryOp::Mul,
                a: 5,
                b: 4,
                b_scalar: 0.0,
                output: 6,
            },
            N::Binary {
                op: fb::BinaryOp::Mul,
                a: 6,
                b: -1,
                b_scalar: -1.0,
                output: 7,
            },
            N::Unary {
                op: fb::UnaryOp::Exp,
                input: 7,
                output: 8,
            },
            N::Binary {
                op: fb::BinaryOp::Mul,
                a: 5,
                b: 1,
                b_scalar: 0.0,
                output: 9,
            },
            N::Scan {
                x0: 3,
                a: 8,
                u: 9,
                output: 10,
            },
            N::Unary {
                op: fb::UnaryOp::Silu,
                input: 2,
                output: 11,
            },
            N::Binary {
                op: fb::BinaryOp::Mul,
                a: 10,
                b: 11,
                b_scalar: 0.0,
                output: 12,
            },
        ],
        &[0; 8],
    );
    let dl = init(&blob).unwrap();
    let plan = dl.plan().unwrap();
    assert_eq!(plan.steps.len(), 1);
    assert_eq!(plan.arena_bytes, 0);
    for len in [1, 7, NMAX] {
        let p = ramp(D * len, 0.3);
        let x = ramp(D * len, -0.2);
        let z = ramp(D * len, 0.25);
        let x0 = vec![0.1, -0.2, 0.3, 0.0];
        let mut want = vec![0.0; D * len];
        for c in 0..D {
            let mut h = x0[c] as f64;
            for t in 0..len {
                let i = c * len + t;
                let dt = (p[i] as f64).exp().ln_1p();
                h = (-dt * big_a[c] as f64).exp() * h + dt * x[i] as f64;
                let zi = z[i] as f64;
                want[i] = (h * zi / (1.0 + (-zi).exp())) as f32;
            }
        }
        let dims = [1, D as i32, len as i32];
        let args = run(
            &dl,
            vec![
                tensor(&dims, p),
                tensor(&dims, x),
                tensor(&dims, z),
                tensor(&[1, D as i32], x0),
            ],
            vec![out_tensor(&[1, D as i32, NMAX as i32])],
        );
        assert_close(&args.0[4].data[..D * len], &want);
    }
}

/// ExecuTorch's LFM2 example: the conv reads `cat([state, bx], -1)` in
/// place, and the new state `bx[..., -2:]` is a second, pass kernel.
#[test]
fn cat_of_the_state_is_read_in_place_as_the_left_context() {
    let n = dynamic(NMAX as i64);
    let d = s(D as i64);
    let blob = build_blob_grouped(
        &[
            input("state", 0, &[s(1), d, s(KW as i64 - 1)]),
            input("bx", 1, &[s(1), d, n]),
            constant("w", &[D as i64, 1, KW as i64], conv_weights()),
            inter("cat", &[s(1), d, dynamic((NMAX + KW - 1) as i64)]),
            output("y", 0, &[s(1), d, n]),
            output("new_state", 1, &[s(1), d, s(KW as i64 - 1)]),
        ],
        &[0, 1],
        &[4, 5],
        &[
            N::Cat {
                inputs: &[0, 1],
                output: 3,
                dim: 2,
            },
            N::Conv {
                input: 3,
                weight: 2,
                bias: -1,
                output: 4,
                stride: 1,
                pad: (0, 0),
                dilation: 1,
                groups: D as u32,
            },
            N::Slice {
                input: 1,
                output: 5,
                dim: 2,
                start: 1 - KW as i64,
                end: i64::MAX,
            },
        ],
        &[0, 0, 1],
    );
    let dl = init(&blob).unwrap();
    assert_eq!(dl.plan().unwrap().steps.len(), 2);
    let len = 9;
    let state = ramp(D * (KW - 1), 0.5);
    let bx = ramp(D * len, 0.1);
    let args = run(
        &dl,
        vec![
            tensor(&[1, D as i32, KW as i32 - 1], state.clone()),
            tensor(&[1, D as i32, len as i32], bx.clone()),
        ],
        vec![
            out_tensor(&[1, D as i32, NMAX as i32]),
            out_tensor(&[1, D as i32, KW as i32 - 1]),
        ],
    );
    let w = conv_weights();
    let mut want = vec![0.0; D * len];
    for c in 0..D {
        let row: Vec<f32> = state[c * 2..c * 2 + 2]
            .iter()
            .chain(&bx[c * len..(c + 1) * len])
            .copied()
            .collect();
        for t in 0..len {
            want[c * len + t] = (0..KW).map(|k| w[c * KW + k] * row[t + k]).sum();
        }
    }
    assert_close(&args.0[2].data[..D * len], &want);
    let new_state: Vec<f32> = (0..D)
        .flat_map(|c| bx[c * len + len - 2..c * len + len].to_vec())
        .collect();
    assert_eq!(args.0[3].data, new_state);
}

fn kernel_error(blob: &[u8]) -> String {
    match init(blob) {
        Err(e) => {
            assert_eq!(e.status(), Status::InvalidProgram, "{e}");
            e.to_string()
        }
        Ok(_) => panic!("the grouping was accepted"),
    }
}

#[test]
fn groupings_the_runtime_cannot_run_are_refused_with_the_reason() {
    // Kernels not numbered in order.
    let e = kernel_error(&lfm2_blob(&[0, 0, 0, 0, 0, 2, 2, 2]));
    assert!(e.contains("consecutive"), "{e}");
    // Some nodes grouped, others not.
    let e = kernel_error(&lfm2_blob(&[0, 0, 0, 0, 0, 0, 0, -1]));
    assert!(e.contains("no kernel index"), "{e}");
    // The permute back into [1, N, D] in its own pass kernel makes `cy`
    // stored: still valid. But the epilogue may not read the conv's output
    // through a view: put the first permute after the conv instead.
    let n = dynamic(NMAX as i64);
    let d = s(D as i64);
    let blob = build_blob_grouped(
        &[
            input("x", 0, &[s(1), d, n]),
            constant("w", &[D as i64, 1, KW as i64], conv_weights()),
            inter("y", &[s(1), d, n]),
            inter("yt", &[s(1), n, d]),
            input("g", 1, &[s(1), n, d]),
            output("out", 0, &[s(1), n, d]),
        ],
        &[0, 4],
        &[5],
        &[
            N::Conv {
                input: 0,
                weight: 1,
                bias: -1,
                output: 2,
                stride: 1,
                pad: (2, 0),
                dilation: 1,
                groups: D as u32,
            },
            N::Permute {
                input: 2,
                output: 3,
                perm: &[0, 2, 1],
            },
            N::Binary {
                op: fb::BinaryOp::Mul,
                a: 3,
                b: 4,
                b_scalar: 0.0,
                output: 5,
            },
        ],
        &[0, 0, 0],
    );
    let e = kernel_error(&blob);
    assert!(
        e.contains("fused kernel 0") && e.contains("shape of the anchor"),
        "{e}"
    );
    // Two anchors in one kernel.
    let blob = build_blob_grouped(
        &[
            input("x", 0, &[s(1), d, n]),
            constant("w", &[D as i64, 1, KW as i64], conv_weights()),
            inter("y", &[s(1), d, n]),
            output("z", 0, &[s(1), d, n]),
        ],
        &[0],
        &[3],
        &[
            N::Conv {
                input: 0,
                weight: 1,
                bias: -1,
                output: 2,
                stride: 1,
                pad: (2, 0),
                dilation: 1,
                groups: D as u32,
            },
            N::Conv {
                input: 2,
                weight: 1,
                bias: -1,
                output: 3,
                stride: 1,
                pad: (2, 0),
                dilation: 1,
                groups: D as u32,
            },
        ],
        &[0, 0],
    );
    let e = kernel_error(&blob);
    assert!(e.contains("holds 2 convs or scans"), "{e}");
}

/// A transposed conv's phases `[1, C*S, n]` interleaved into `[1, C, n*S]`:
/// a reshape splitting the channels, a permute, a reshape merging the time
/// axis with the phases. Each reshape is a copy, alone in its kernel
/// (`kernels`), its dynamic size inferred per call.
fn interleave_blob(kernels: &[i32]) -> Vec<u8> {
    let (c, p) = (2, 3);
    build_blob_grouped(
        &[
            input("phases", 0, &[s(1), s(c * p), dynamic(NMAX as i64)]),
            inter("split", &[s(1), s(c), s(p), dynamic(NMAX as i64)]),
            inter("swapped", &[s(1), s(c), dynamic(NMAX as i64), s(p)]),
            output("out", 0, &[s(1), s(c), dynamic(p * NMAX as i64)]),
        ],
        &[0],
        &[3],
        &[
            N::Reshape {
                input: 0,
                output: 1,
            },
            N::Permute {
                input: 1,
                output: 2,
                perm: &[0, 1, 3, 2],
            },
            N::Reshape {
                input: 2,
                output: 3,
            },
        ],
        kernels,
    )
}

#[test]
fn reshapes_that_split_or_merge_dimensions_run_as_copies() {
    let (c, p) = (2, 3);
    let blob = interleave_blob(&[0, 1, 2]);
    let d = init(&blob).unwrap();
    assert_eq!(d.plan().unwrap().steps.len(), 3);
    for n in [1, 5, NMAX] {
        let x = ramp(c * p * n, 0.5);
        let args = run(
            &d,
            vec![tensor(&[1, (c * p) as i32, n as i32], x.clone())],
            vec![out_tensor(&[1, c as i32, (p * NMAX) as i32])],
        );
        assert_eq!(args.0[1].sizes, vec![1, c as i32, (p * n) as i32]);
        let mut want = vec![0.0; c * p * n];
        for ch in 0..c {
            for q in 0..n {
                for r in 0..p {
                    want[ch * p * n + q * p + r] = x[(ch * p + r) * n + q];
                }
            }
        }
        assert_close(&args.0[1].data[..want.len()], &want);
    }
    // No view reads such a reshape: one sharing a kernel is refused.
    let e = kernel_error(&interleave_blob(&[0, 1, 1]));
    assert!(e.contains("splitting or merging dimensions"), "{e}");
}

#[test]
fn inspect_entry_point_returns_the_plan_or_the_error_as_json() {
    use std::ffi::CStr;
    let call = |blob: &[u8], specs: &[u8]| -> serde_json::Value {
        // SAFETY: both slices are valid for their lengths during the call;
        // the returned string is read once and freed once.
        unsafe {
            let raw = crate::ffi::rustconv_inspect_plan(
                blob.as_ptr(),
                blob.len(),
                specs.as_ptr(),
                specs.len(),
            );
            assert!(!raw.is_null());
            let doc = serde_json::from_str(CStr::from_ptr(raw).to_str().unwrap()).unwrap();
            crate::ffi::rustconv_free_string(raw);
            doc
        }
    };
    let blob = lfm2_blob(&[0; 8]);
    let doc = call(&blob, br#"[["num_threads", "01000000"]]"#);
    let plan = &doc["plan"];
    assert_eq!(plan["threads"], 1);
    assert_eq!(plan["kernels"].as_array().unwrap().len(), 1);
    assert_eq!(plan["kernels"][0]["absorbed"].as_array().unwrap().len(), 8);
    assert_eq!(plan["arena_bytes"], 0);
    let virtual_values = plan["values"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["location"] == "virtual")
        .count();
    assert_eq!(
        virtual_values, 7,
        "everything between input and output stays in registers"
    );
    let doc = call(&blob[..40], b"[]");
    assert!(doc["error"].as_str().unwrap().contains("shorter"), "{doc}");
    let doc = call(&blob, b"[[\"num_threads\", \"00000000\"]]");
    assert!(
        doc["error"].as_str().unwrap().contains("num_threads"),
        "{doc}"
    );
    // Null pointers with zero lengths are valid input, and get an error.
    // SAFETY: zero lengths, never read; the result is freed once.
    unsafe {
        let raw = crate::ffi::rustconv_inspect_plan(std::ptr::null(), 0, std::ptr::null(), 0);
        assert!(CStr::from_ptr(raw).to_str().unwrap().contains("error"));
        crate::ffi::rustconv_free_string(raw);
        crate::ffi::rustconv_free_string(std::ptr::null_mut());
    }
}

/// Records what the delegate reports, with a clock that counts reads.
struct RecordingSink {
    events: Vec<(u32, u64, u64, String)>,
}

static TICKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn fake_ticks() -> u64 {
    TICKS.fetch_add(10, std::sync::atomic::Ordering::SeqCst)
}

impl crate::profiling::EventSink for RecordingSink {
    fn clock(&self) -> crate::profiling::Clock {
        fake_ticks
    }

    fn log(&mut self, kernel: u32, start: u64, end: u64, metadata: &[u8]) {
        let metadata = String::from_utf8(metadata.to_vec()).unwrap();
        self.events.push((kernel, start, end, metadata));
    }
}

#[test]
fn traced_calls_report_one_event_per_fused_kernel_with_its_work() {
    let (fused_blob, unfused_blob) = (lfm2_blob(&[0; 8]), lfm2_blob(&[-1; 8]));
    for (blob, kernels) in [(&fused_blob, 1), (&unfused_blob, 8)] {
        let d = init(blob).unwrap();
        for n in [5, NMAX] {
            let mut args = Args(vec![
                tensor(&[1, n as i32, 3 * D as i32], ramp(n * 3 * D, 0.05)),
                out_tensor(&[1, NMAX as i32, D as i32]),
            ]);
            let mut sink = RecordingSink { events: Vec::new() };
            d.execute_traced(&mut args, Some(&mut sink)).unwrap();
            let ids: Vec<u32> = sink.events.iter().map(|e| e.0).collect();
            assert_eq!(ids, (0..kernels).collect::<Vec<u32>>());
            // Spans come from the clock, in order, one read at each end.
            for pair in sink.events.windows(2) {
                assert!(pair[0].2 <= pair[1].1, "{:?}", sink.events);
            }
            for (_, start, end, _) in &sink.events {
                assert_eq!(end - start, 10);
            }
            if kernels == 1 {
                // Reads bcx and writes out, nothing stored in between;
                // a depthwise conv of D channels, KW taps, n outputs.
                let bytes = (n * 3 * D + n * D + D * KW) * 4;
                let flops = 2 * D * n * KW;
                assert_eq!(
                    sink.events[0].3,
                    format!("algorithm=depthwise_simd;bytes={bytes};flops={flops}")
                );
            } else {
                assert!(sink.events[0].3.starts_with("algorithm=elementwise;bytes="));
                assert!(!sink.events[0].3.contains("flops"));
                assert!(sink.events[5].3.contains(";flops="), "{:?}", sink.events);
            }
            assert_close(
                &args.0[1].data[..n * D],
                &lfm2_reference(&ramp(n * 3 * D, 0.05), n),
            );
        }
    }
}

#[test]
fn untraced_calls_read_no_clock() {
    let blob = lfm2_blob(&[0; 8]);
    let d = init(&blob).unwrap();
    let args = run(
        &d,
        vec![tensor(&[1, 4, 3 * D as i32], ramp(4 * 3 * D, 0.05))],
        vec![out_tensor(&[1, NMAX as i32, D as i32])],
    );
    assert_eq!(args.0[1].sizes, vec![1, 4, D as i32]);
    // The plain path records no span (the fake clock is shared with
    // concurrent tests, so the state is checked instead).
    assert_eq!(d.recorded_spans(), vec![(0, 0)]);
}
