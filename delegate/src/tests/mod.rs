//! Whole-delegate tests: blobs built here with the generated flatbuffer
//! builders, run through `Delegate::init`/`execute` with in-memory tensors,
//! checked against the kernels crate's naive references; and the bad-input
//! cases (corrupt blobs, wrong arguments), which must fail with the right
//! error and never panic.

use flatbuffers::FlatBufferBuilder;
use rustconv_kernels::{reference, Conv1dParams, ScanParams};
use rustconv_schema as fb;

use crate::blob::{BlobBytes, CONSTANT_ALIGNMENT, HEADER_LEN, LAYOUT_VERSION, MAGIC};
use crate::error::DelegateError;
use crate::executor::{ArgTensor, CallArgs};
use crate::graph::DType;
use crate::host::{LogLevel, Status};
use crate::memory::AlignedBuf;
use crate::plan::Location;
use crate::Delegate;

// ---- blob construction -------------------------------------------------

struct V {
    name: &'static str,
    dims: Vec<(i64, bool)>,
    kind: fb::ValueKind,
    io: u32,
    data: Option<Vec<f32>>,
    /// For a state: the value copied into it after each call.
    update: i32,
    /// The constant's byte count as the blob declares it, where a test
    /// makes it disagree with `data`.
    declared_bytes: Option<u64>,
}

fn input(name: &'static str, io: u32, dims: &[(i64, bool)]) -> V {
    V {
        name,
        dims: dims.to_vec(),
        kind: fb::ValueKind::Input,
        io,
        data: None,
        update: -1,
        declared_bytes: None,
    }
}
fn output(name: &'static str, io: u32, dims: &[(i64, bool)]) -> V {
    V {
        name,
        dims: dims.to_vec(),
        kind: fb::ValueKind::Output,
        io,
        data: None,
        update: -1,
        declared_bytes: None,
    }
}
fn inter(name: &'static str, dims: &[(i64, bool)]) -> V {
    V {
        name,
        dims: dims.to_vec(),
        kind: fb::ValueKind::Intermediate,
        io: 0,
        data: None,
        update: -1,
        declared_bytes: None,
    }
}
fn constant(name: &'static str, dims: &[i64], data: Vec<f32>) -> V {
    V {
        name,
        dims: dims.iter().map(|&d| (d, false)).collect(),
        kind: fb::ValueKind::Constant,
        io: 0,
        data: Some(data),
        update: -1,
        declared_bytes: None,
    }
}
fn state(name: &'static str, dims: &[i64], data: Vec<f32>, update: i32) -> V {
    V {
        kind: fb::ValueKind::State,
        update,
        ..constant(name, dims, data)
    }
}
fn s(d: i64) -> (i64, bool) {
    (d, false)
}
fn dynamic(bound: i64) -> (i64, bool) {
    (bound, true)
}

mod constant_checks;
mod fed_weights;
mod fused;
mod norm;
mod streaming;

#[derive(Clone, Copy)]
enum N {
    Conv {
        input: u32,
        weight: u32,
        bias: i32,
        output: u32,
        stride: u32,
        pad: (u32, u32),
        dilation: u32,
        groups: u32,
    },
    Scan {
        x0: u32,
        a: u32,
        u: u32,
        output: u32,
    },
    Unary {
        op: fb::UnaryOp,
        input: u32,
        output: u32,
    },
    /// Operand -1: the scalar beside it.
    Binary {
        op: fb::BinaryOp,
        a: i32,
        b: i32,
        b_scalar: f32,
        output: u32,
    },
    Permute {
        input: u32,
        output: u32,
        perm: &'static [u8],
    },
    Slice {
        input: u32,
        output: u32,
        dim: u8,
        start: i64,
        end: i64,
    },
    Cat {
        inputs: &'static [u32],
        output: u32,
        dim: u8,
    },
    Reshape {
        input: u32,
        output: u32,
    },
    Reduce {
        op: fb::ReduceOp,
        input: u32,
        output: u32,
        dims: &'static [u8],
    },
}

fn build_blob(values: &[V], inputs: &[u32], outputs: &[u32], nodes: &[N]) -> Vec<u8> {
    build_blob_grouped(values, inputs, outputs, nodes, &vec![-1; nodes.len()])
}

/// A blob whose node `i` is in fused kernel `kernels[i]` (-1: no grouping).
fn build_blob_grouped(
    values: &[V],
    inputs: &[u32],
    outputs: &[u32],
    nodes: &[N],
    kernels: &[i32],
) -> Vec<u8> {
    let mut segment = Vec::new();
    let mut offsets = Vec::new();
    for v in values {
        let offset = segment.len().next_multiple_of(CONSTANT_ALIGNMENT);
        offsets.push(offset as u64);
        if let Some(data) = &v.data {
            segment.resize(offset, 0);
            for x in data {
                segment.extend_from_slice(&x.to_le_bytes());
            }
        }
    }
    let mut b = FlatBufferBuilder::new();
    let vals: Vec<_> = values
        .iter()
        .zip(&offsets)
        .map(|(v, &offset)| {
            let dims: Vec<fb::Dim> = v
                .dims
                .iter()
                .map(|&(size, dynamic)| fb::Dim::new(size, dynamic))
                .collect();
            let dims = b.create_vector(&dims);
            let name = b.create_string(v.name);
            let size = v
                .declared_bytes
                .unwrap_or(v.data.as_ref().map_or(0, |d| 4 * d.len() as u64));
            fb::Value::create(
                &mut b,
                &fb::ValueArgs {
                    name: Some(name),
                    dtype: fb::DType::Float32,
                    dims: Some(dims),
                    kind: v.kind,
                    io_index: v.io,
                    constant_offset: if v.data.is_some() { offset } else { 0 },
                    constant_size: size,
                    state_update: v.update,
                },
            )
        })
        .collect();
    let nodes: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let (op_type, op) = match *n {
                N::Conv {
                    input,
                    weight,
                    bias,
                    output,
                    stride,
                    pad,
                    dilation,
                    groups,
                } => (
                    fb::Op::Conv1d,
                    fb::Conv1d::create(
                        &mut b,
                        &fb::Conv1dArgs {
                            input,
                            weight,
                            bias,
                            output,
                            stride,
                            pad_left: pad.0,
                            pad_right: pad.1,
                            dilation,
                            groups,
                        },
                    )
                    .as_union_value(),
                ),
                N::Scan { x0, a, u, output } => (
                    fb::Op::LinearScan,
                    fb::LinearScan::create(&mut b, &fb::LinearScanArgs { x0, a, u, output })
                        .as_union_value(),
                ),
                N::Unary { op, input, output } => (
                    fb::Op::Unary,
                    fb::Unary::create(&mut b, &fb::UnaryArgs { input, output, op })
                        .as_union_value(),
                ),
                N::Binary {
                    op,
                    a,
                    b: rhs,
                    b_scalar,
                    output,
                } => (
                    fb::Op::Binary,
                    fb::Binary::create(
                        &mut b,
                        &fb::BinaryArgs {
                            op,
                            a,
                            b: rhs,
                            a_scalar: 0.0,
                            b_scalar,
                            output,
                        },
                    )
                    .as_union_value(),
                ),
                N::Permute {
                    input,
                    output,
                    perm,
                } => {
                    let perm = b.create_vector(perm);
                    (
                        fb::Op::Permute,
                        fb::Permute::create(
                            &mut b,
                            &fb::PermuteArgs {
                                input,
                                output,
                                perm: Some(perm),
                            },
                        )
                        .as_union_value(),
                    )
                }
                N::Slice {
                    input,
                    output,
                    dim,
                    start,
                    end,
                } => (
                    fb::Op::Slice,
                    fb::Slice::create(
                        &mut b,
                        &fb::SliceArgs {
                            input,
                            output,
                            dim,
                            start,
                            end,
                            step: 1,
                        },
                    )
                    .as_union_value(),
                ),
                N::Reshape { input, output } => (
                    fb::Op::Reshape,
                    fb::Reshape::create(&mut b, &fb::ReshapeArgs { input, output })
                        .as_union_value(),
                ),
                N::Cat {
                    inputs,
                    output,
                    dim,
                } => {
                    let inputs = b.create_vector(inputs);
                    (
                        fb::Op::Cat,
                        fb::Cat::create(
                            &mut b,
                            &fb::CatArgs {
                                inputs: Some(inputs),
                                output,
                                dim,
                            },
                        )
                        .as_union_value(),
                    )
                }
                N::Reduce {
                    op,
                    input,
                    output,
                    dims,
                } => {
                    let dims = b.create_vector(dims);
                    (
                        fb::Op::Reduce,
                        fb::Reduce::create(
                            &mut b,
                            &fb::ReduceArgs {
                                input,
                                output,
                                op,
                                dims: Some(dims),
                            },
                        )
                        .as_union_value(),
                    )
                }
            };
            let name = b.create_string(&format!("node{i}"));
            let handles = b.create_vector(&[i as u32 + 100]);
            fb::Node::create(
                &mut b,
                &fb::NodeArgs {
                    op_type,
                    op: Some(op),
                    id: i as u32,
                    debug_handles: Some(handles),
                    name: Some(name),
                    kernel: kernels[i],
                },
            )
        })
        .collect();
    let vals = b.create_vector(&vals);
    let nodes = b.create_vector(&nodes);
    let ins = b.create_vector(inputs);
    let outs = b.create_vector(outputs);
    let graph = fb::Graph::create(
        &mut b,
        &fb::GraphArgs {
            values: Some(vals),
            inputs: Some(ins),
            outputs: Some(outs),
            nodes: Some(nodes),
        },
    );
    fb::finish_graph_buffer(&mut b, graph);
    frame(b.finished_data(), &segment)
}

fn frame(graph: &[u8], segment: &[u8]) -> Vec<u8> {
    let segment_start = (HEADER_LEN + graph.len()).next_multiple_of(CONSTANT_ALIGNMENT);
    let mut blob = Vec::new();
    blob.extend_from_slice(&MAGIC);
    blob.extend_from_slice(&LAYOUT_VERSION.to_le_bytes());
    blob.extend_from_slice(&(HEADER_LEN as u32).to_le_bytes());
    blob.extend_from_slice(&0u32.to_le_bytes());
    for v in [HEADER_LEN, graph.len(), segment_start, segment.len()] {
        blob.extend_from_slice(&(v as u64).to_le_bytes());
    }
    blob.extend_from_slice(graph);
    blob.resize(segment_start, 0);
    blob.extend_from_slice(segment);
    blob
}

// ---- in-memory arguments -------------------------------------------------

struct T {
    dtype: Option<DType>,
    sizes: Vec<i32>,
    contiguous: bool,
    data: Vec<f32>,
    /// Elements the host allocated (outputs may be resized up to this).
    capacity: usize,
}

fn tensor(sizes: &[i32], data: Vec<f32>) -> T {
    let capacity = data.len();
    T {
        dtype: Some(DType::F32),
        sizes: sizes.to_vec(),
        contiguous: true,
        data,
        capacity,
    }
}

fn out_tensor(max_sizes: &[i32]) -> T {
    let n: i32 = max_sizes.iter().product();
    tensor(max_sizes, vec![f32::NAN; n as usize])
}

struct Args(Vec<T>);

impl CallArgs for Args {
    fn count(&self) -> usize {
        self.0.len()
    }
    fn tensor(&self, i: usize) -> Option<ArgTensor<'_>> {
        let t = self.0.get(i)?;
        let numel: i32 = t.sizes.iter().product();
        Some(ArgTensor {
            dtype: t.dtype,
            sizes: &t.sizes,
            contiguous: t.contiguous,
            nbytes: numel.max(0) as usize * 4,
            data: t.data.as_ptr() as *mut u8,
        })
    }
    fn resize(&mut self, i: usize, sizes: &[i32]) -> bool {
        let t = &mut self.0[i];
        let numel: i32 = sizes.iter().product();
        if sizes.len() != t.sizes.len() || numel as usize > t.capacity {
            return false;
        }
        t.sizes = sizes.to_vec();
        true
    }
}

fn ramp(n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 % 17) as f32 - 8.0) * scale)
        .collect()
}

fn init(blob: &[u8]) -> Result<Delegate, DelegateError> {
    let mut d = Delegate::default();
    // SAFETY: every test keeps `blob` alive and unmodified until `d` drops.
    d.init(unsafe { BlobBytes::new(blob.as_ptr(), blob.len()) })?;
    Ok(d)
}

/// Each blob is refused at init as an invalid program, with its needle in
/// the message.
fn assert_invalid_programs(cases: Vec<(&str, Vec<u8>)>) {
    for (needle, blob) in cases {
        let err = init(&blob)
            .err()
            .unwrap_or_else(|| panic!("accepted a graph that should fail with '{needle}'"));
        assert_eq!(err.status(), Status::InvalidProgram, "{err}");
        assert!(
            err.to_string().contains(needle),
            "expected '{needle}' in: {err}"
        );
    }
}

fn assert_close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
            "element {i}: got {g}, want {w}"
        );
    }
}

// ---- the conv -> scan graph used by most tests ---------------------------

const C_IN: usize = 3;
const C_OUT: usize = 4;
const K: usize = 3;
const N_MAX: usize = 16;

/// x [1, 3, <=16] --conv(k3, pad 2 left)--> h [1, 4, <=16] --scan(x0, a, h)--> y
fn conv_scan_blob() -> Vec<u8> {
    let n = dynamic(N_MAX as i64);
    build_blob(
        &[
            input("x", 0, &[s(1), s(C_IN as i64), n]),
            constant(
                "w",
                &[C_OUT as i64, C_IN as i64, K as i64],
                ramp(C_OUT * C_IN * K, 0.1),
            ),
            constant("b", &[C_OUT as i64], vec![0.5, -0.25, 0.0, 1.0]),
            inter("h", &[s(1), s(C_OUT as i64), n]),
            input("x0", 1, &[s(1), s(C_OUT as i64)]),
            input("a", 2, &[s(1), s(C_OUT as i64), n]),
            output("y", 0, &[s(1), s(C_OUT as i64), n]),
        ],
        &[0, 4, 5],
        &[6],
        &[
            N::Conv {
                input: 0,
                weight: 1,
                bias: 2,
                output: 3,
                stride: 1,
                pad: (2, 0),
                dilation: 1,
                groups: 1,
            },
            N::Scan {
                x0: 4,
                a: 5,
                u: 3,
                output: 6,
            },
        ],
    )
}

fn conv_scan_reference(x: &[f32], x0: &[f32], a: &[f32], n: usize) -> Vec<f32> {
    let conv = Conv1dParams {
        batch: 1,
        in_channels: C_IN,
        out_channels: C_OUT,
        in_len: n,
        kernel_size: K,
        stride: 1,
        pad_left: 2,
        pad_right: 0,
        dilation: 1,
        groups: 1,
    };
    let h = reference::conv1d_f32(
        &conv,
        x,
        &ramp(C_OUT * C_IN * K, 0.1),
        Some(&[0.5, -0.25, 0.0, 1.0]),
    )
    .unwrap();
    reference::linear_scan_f32(
        &ScanParams {
            batch: 1,
            channels: C_OUT,
            len: n,
        },
        x0,
        a,
        &h,
    )
    .unwrap()
}

fn conv_scan_args(n: usize) -> Args {
    let ni = n as i32;
    Args(vec![
        tensor(&[1, C_IN as i32, ni], ramp(C_IN * n, 0.05)),
        tensor(&[1, C_OUT as i32], vec![0.1, 0.2, -0.3, 0.4]),
        tensor(
            &[1, C_OUT as i32, ni],
            (0..C_OUT * n).map(|i| 0.9 - (i % 5) as f32 * 0.1).collect(),
        ),
        out_tensor(&[1, C_OUT as i32, N_MAX as i32]),
    ])
}

#[test]
fn conv_then_scan_matches_reference_at_every_dynamic_length() {
    let blob = conv_scan_blob();
    let d = init(&blob).unwrap();
    for n in [N_MAX, 9, 1] {
        let mut args = conv_scan_args(n);
        d.execute(&mut args).unwrap();
        assert_eq!(
            args.0[3].sizes,
            vec![1, C_OUT as i32, n as i32],
            "output resized to the actual length"
        );
        let want = conv_scan_reference(&args.0[0].data, &args.0[1].data, &args.0[2].data, n);
        assert_close(&args.0[3].data[..C_OUT * n], &want);
    }
}

/// Calls of unchanged shapes skip shape inference and its checks
/// (`ExecState::generation`): new data at the same shapes is still read, a
/// refused call is refused again at the same shapes, and a change of
/// length after either derives the shapes again.
#[test]
fn calls_of_unchanged_shapes_reuse_their_shapes_and_nothing_else() {
    let blob = conv_scan_blob();
    let d = init(&blob).unwrap();
    let check = |args: &Args, n: usize| {
        let want = conv_scan_reference(&args.0[0].data, &args.0[1].data, &args.0[2].data, n);
        assert_close(&args.0[3].data[..C_OUT * n], &want);
        assert_eq!(args.0[3].sizes, vec![1, C_OUT as i32, n as i32]);
    };
    let mut args = conv_scan_args(8);
    d.execute(&mut args).unwrap();
    check(&args, 8);
    // Same shapes, other data and a fresh output tensor.
    let mut other = conv_scan_args(8);
    other.0[0].data.iter_mut().for_each(|x| *x = -*x);
    d.execute(&mut other).unwrap();
    check(&other, 8);
    // A scan input one step short: refused, and refused again.
    let mut bad = conv_scan_args(8);
    bad.0[2].sizes = vec![1, C_OUT as i32, 7];
    for _ in 0..2 {
        let err = d
            .execute(&mut bad)
            .expect_err("mismatched lengths accepted");
        assert!(err.to_string().contains("differ in shape"), "{err}");
    }
    for n in [8, 9, 9, 8] {
        let mut args = conv_scan_args(n);
        d.execute(&mut args).unwrap();
        check(&args, n);
    }
}

#[test]
fn plan_places_intermediates_in_the_arena() {
    let blob = conv_scan_blob();
    let d = init(&blob).unwrap();
    let plan = d.plan().unwrap();
    assert_eq!(plan.locations[3], Location::Arena(0));
    assert_eq!(plan.arena_bytes, C_OUT * N_MAX * 4);
    assert!(matches!(plan.locations[1], Location::Constant(_)));
    assert_eq!(plan.steps[1].absorbed[0].debug_handles, vec![101]);
}

#[test]
fn calls_from_different_threads_give_the_same_results() {
    // Each calling thread is worker 0 of its own pool (threads.rs), so the
    // state's cached pool and scratch change hands between these calls;
    // results must not depend on which thread called.
    let blob = conv_scan_blob();
    let d = init(&blob).unwrap();
    let run = || {
        let mut args = conv_scan_args(N_MAX);
        d.execute(&mut args).unwrap();
        args.0[3].data.clone()
    };
    let here = run();
    let there = std::thread::scope(|s| s.spawn(run).join().unwrap());
    assert_eq!(here, there);
    assert_eq!(run(), here);
    let want = {
        let args = conv_scan_args(N_MAX);
        conv_scan_reference(&args.0[0].data, &args.0[1].data, &args.0[2].data, N_MAX)
    };
    assert_close(&here, &want);
}

#[test]
fn misaligned_blob_memory_is_copied_and_still_correct() {
    let blob = conv_scan_blob();
    // Shift the blob by one byte so its constant segment is misaligned.
    let mut shifted = vec![0u8; blob.len() + 1];
    shifted[1..].copy_from_slice(&blob);
    let d = init(&shifted[1..]).unwrap();
    assert!(!d.keeps_blob(), "the constants were copied out");
    let mut args = conv_scan_args(8);
    d.execute(&mut args).unwrap();
    let want = conv_scan_reference(&args.0[0].data, &args.0[1].data, &args.0[2].data, 8);
    assert_close(&args.0[3].data[..C_OUT * 8], &want);
}

#[test]
fn dense_convs_read_their_weights_in_place() {
    // No dense algorithm keeps a copy of the weights: the blob stays loaded
    // and nothing is copied out of it.
    for algorithm in ["gemm", "fft_gemm", "direct"] {
        let blob = AlignedBuf::from_bytes(&conv_scan_blob());
        let mut d = Delegate::default();
        d.add_compile_spec("conv1d_algorithm", algorithm.as_bytes());
        // SAFETY: `blob` outlives `d` and is never modified.
        d.init(unsafe { BlobBytes::new(blob.as_ptr(), blob.len()) })
            .unwrap();
        assert!(d.keeps_blob(), "{algorithm}");
        assert!(matches!(
            d.plan().unwrap().locations[1],
            Location::Constant(_)
        ));
        let mut args = conv_scan_args(N_MAX);
        d.execute(&mut args).unwrap();
        let want = conv_scan_reference(&args.0[0].data, &args.0[1].data, &args.0[2].data, N_MAX);
        assert_close(&args.0[3].data[..C_OUT * N_MAX], &want);
    }
}

#[test]
fn blob_is_released_when_no_step_reads_its_constants_in_place() {
    // A causal depthwise conv: the FFT keeps the filter spectra (only the
    // bias is still read), the SIMD and direct loops read the weights at
    // every call.
    let (c, k, n) = (4usize, 3usize, 16usize);
    let blob_bytes = build_blob(
        &[
            input("x", 0, &[s(1), s(c as i64), s(n as i64)]),
            constant("w", &[c as i64, 1, k as i64], ramp(c * k, 0.1)),
            constant("b", &[c as i64], vec![0.5, -0.25, 0.0, 1.0]),
            output("y", 0, &[s(1), s(c as i64), s(n as i64)]),
        ],
        &[0],
        &[3],
        &[N::Conv {
            input: 0,
            weight: 1,
            bias: 2,
            output: 3,
            stride: 1,
            pad: (k as u32 - 1, 0),
            dilation: 1,
            groups: c as u32,
        }],
    );
    let params = Conv1dParams {
        batch: 1,
        in_channels: c,
        out_channels: c,
        in_len: n,
        kernel_size: k,
        stride: 1,
        pad_left: k - 1,
        pad_right: 0,
        dilation: 1,
        groups: c,
    };
    let x = ramp(c * n, 0.05);
    let want = reference::conv1d_f32(
        &params,
        &x,
        &ramp(c * k, 0.1),
        Some(&[0.5, -0.25, 0.0, 1.0]),
    )
    .unwrap();
    for (algorithm, keeps_blob) in [("fft", false), ("depthwise_simd", true), ("direct", true)] {
        // Aligned as ExecuTorch aligns it, so the segment can be used in place.
        let mut blob = AlignedBuf::from_bytes(&blob_bytes);
        let mut d = Delegate::default();
        d.add_compile_spec("conv1d_algorithm", algorithm.as_bytes());
        // SAFETY: `blob` outlives `d`, and is overwritten below only once
        // `d` says it no longer reads it.
        d.init(unsafe { BlobBytes::new(blob.as_ptr(), blob.len()) })
            .unwrap();
        assert_eq!(d.keeps_blob(), keeps_blob, "{algorithm}");
        let plan = d.plan().unwrap();
        assert_eq!(
            plan.locations[1] == Location::Released,
            !keeps_blob,
            "{algorithm}: weight {:?}",
            plan.locations[1]
        );
        assert!(matches!(plan.locations[2], Location::Constant(_)));
        if !keeps_blob {
            blob.as_mut_slice().fill(0xAB);
        }
        let mut args = Args(vec![
            tensor(&[1, c as i32, n as i32], x.clone()),
            out_tensor(&[1, c as i32, n as i32]),
        ]);
        d.execute(&mut args).unwrap();
        assert_close(&args.0[1].data, &want);
    }
}

// ---- bad blobs -------------------------------------------------------------

#[test]
fn truncated_blobs_fail_cleanly_at_every_length() {
    let blob = conv_scan_blob();
    for len in 0..blob.len() {
        let cut = blob[..len].to_vec();
        let err = init(&cut)
            .err()
            .unwrap_or_else(|| panic!("{len}-byte prefix accepted"));
        assert_eq!(err.status(), Status::InvalidProgram, "{len}: {err}");
    }
}

#[test]
fn graphs_too_short_for_a_flatbuffer_root_are_invalid_programs() {
    // A flatbuffer starts with its root offset and identifier (8 bytes);
    // flatbuffers' identifier check asserts on fewer, so each of these
    // sizes must be refused before it is called.
    let blob = conv_scan_blob();
    for size in 0..8u64 {
        let mut bad = blob.clone();
        bad[24..32].copy_from_slice(&size.to_le_bytes());
        let err = init(&bad)
            .err()
            .unwrap_or_else(|| panic!("{size}-byte graph accepted"));
        assert_eq!(err.status(), Status::InvalidProgram, "{size}: {err}");
        assert!(
            err.to_string().contains("too short for a flatbuffer"),
            "{size}: {err}"
        );
    }
}

#[test]
fn corrupted_bytes_never_panic() {
    let blob = conv_scan_blob();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..3000 {
        let mut bad = blob.clone();
        for _ in 0..1 + (rng % 4) as usize {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let at = (rng as usize) % bad.len();
            bad[at] ^= (rng >> 32) as u8 | 1;
        }
        // Either rejected with an error or accepted as a still-valid graph,
        // which must then execute or fail without panicking.
        if let Ok(d) = init(&bad) {
            let _ = d.execute(&mut conv_scan_args(8));
        }
    }
}

#[test]
fn newer_layout_version_is_an_incompatibility() {
    let mut blob = conv_scan_blob();
    blob[4..8].copy_from_slice(&(LAYOUT_VERSION + 1).to_le_bytes());
    let err = init(&blob).err().unwrap();
    assert_eq!(err.status(), Status::DelegateInvalidCompatibility);
    assert!(err.to_string().contains("newer than this runtime"), "{err}");
}

#[test]
fn unknown_op_kind_is_an_incompatibility() {
    let mut blob = conv_scan_blob();
    // Overwrite the first node's union tag, located through the reader
    // (`loc` is relative to the graph, which starts right after the header).
    let tag_at = {
        let graph = fb::root_as_graph(&blob[HEADER_LEN..]).unwrap();
        let node = graph.nodes().unwrap().get(0);
        HEADER_LEN + node._tab.loc() + node._tab.vtable().get(fb::Node::VT_OP_TYPE) as usize
    };
    assert_eq!(blob[tag_at], fb::Op::Conv1d.0);
    blob[tag_at] = 42;
    let err = init(&blob).err().unwrap();
    assert_eq!(err.status(), Status::DelegateInvalidCompatibility, "{err}");
    assert!(err.to_string().contains("op kind 42"), "{err}");
}

#[test]
fn structurally_invalid_graphs_are_invalid_programs() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "refers to value 9",
            build_blob(
                &[
                    input("x", 0, &[s(1), s(2), s(8)]),
                    output("y", 0, &[s(1), s(2), s(8)]),
                ],
                &[0],
                &[1],
                &[N::Scan {
                    x0: 9,
                    a: 0,
                    u: 0,
                    output: 1,
                }],
            ),
        ),
        (
            "before it is produced",
            build_blob(
                &[
                    input("x", 0, &[s(1), s(2), s(8)]),
                    input("x0", 1, &[s(1), s(2)]),
                    inter("h", &[s(1), s(2), s(8)]),
                    output("y", 0, &[s(1), s(2), s(8)]),
                ],
                &[0, 1],
                &[3],
                &[
                    N::Scan {
                        x0: 1,
                        a: 0,
                        u: 2,
                        output: 3,
                    },
                    N::Scan {
                        x0: 1,
                        a: 0,
                        u: 0,
                        output: 2,
                    },
                ],
            ),
        ),
        (
            "an input or constant",
            build_blob(
                &[
                    input("x", 0, &[s(1), s(2), s(8)]),
                    input("x0", 1, &[s(1), s(2)]),
                ],
                &[0, 1],
                &[],
                &[N::Scan {
                    x0: 1,
                    a: 0,
                    u: 0,
                    output: 0,
                }],
            ),
        ),
        (
            "computes shape",
            build_blob(
                &[
                    input("x", 0, &[s(1), s(2), s(8)]),
                    input("x0", 1, &[s(1), s(2)]),
                    output("y", 0, &[s(1), s(2), s(7)]),
                ],
                &[0, 1],
                &[2],
                &[N::Scan {
                    x0: 1,
                    a: 0,
                    u: 0,
                    output: 2,
                }],
            ),
        ),
        (
            "groups",
            build_blob(
                &[
                    input("x", 0, &[s(1), s(4), s(8)]),
                    constant("w", &[3, 2, 1], vec![1.0; 6]),
                    output("y", 0, &[s(1), s(3), s(8)]),
                ],
                &[0],
                &[2],
                &[N::Conv {
                    input: 0,
                    weight: 1,
                    bias: -1,
                    output: 2,
                    stride: 1,
                    pad: (0, 0),
                    dilation: 1,
                    groups: 2,
                }],
            ),
        ),
        (
            "stride",
            build_blob(
                &[
                    input("x", 0, &[s(1), s(2), s(8)]),
                    constant("w", &[2, 2, 1], vec![1.0; 4]),
                    output("y", 0, &[s(1), s(2), s(8)]),
                ],
                &[0],
                &[2],
                &[N::Conv {
                    input: 0,
                    weight: 1,
                    bias: -1,
                    output: 2,
                    stride: 0,
                    pad: (0, 0),
                    dilation: 1,
                    groups: 1,
                }],
            ),
        ),
        (
            "graph inputs",
            build_blob(
                &[
                    input("x", 1, &[s(1), s(2), s(8)]),
                    output("y", 0, &[s(1), s(2), s(8)]),
                ],
                &[0],
                &[1],
                &[N::Scan {
                    x0: 0,
                    a: 0,
                    u: 0,
                    output: 1,
                }],
            ),
        ),
    ];
    assert_invalid_programs(cases);
}

/// The anchor ops' own errors (decoding, static checks, fusion), as they
/// read since before anchors went through `step::AnchorOp`.
#[test]
fn anchor_op_errors_keep_their_wording() {
    let conv = |bias: i32| N::Conv {
        input: 0,
        weight: 1,
        bias,
        output: 2,
        stride: 1,
        pad: (0, 0),
        dilation: 1,
        groups: 1,
    };
    let conv_values = [
        input("x", 0, &[s(1), s(2), s(8)]),
        constant("w", &[2, 2, 1], vec![1.0; 4]),
        output("y", 0, &[s(1), s(2), s(8)]),
    ];
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "bias refers to value 9, but the graph has 3 values",
            build_blob(&conv_values, &[0], &[2], &[conv(9)]),
        ),
        (
            "x0 'x' has rank 3, expected 2",
            build_blob(
                &[
                    input("x", 0, &[s(1), s(2), s(8)]),
                    output("y", 0, &[s(1), s(2), s(8)]),
                ],
                &[0],
                &[1],
                &[N::Scan {
                    x0: 0,
                    a: 0,
                    u: 0,
                    output: 1,
                }],
            ),
        ),
        (
            "the conv's weight or bias 'w' is computed inside the kernel; it must be a \
             constant or come from outside",
            build_blob_grouped(
                &[
                    input("x", 0, &[s(1), s(2), s(8)]),
                    inter("w", &[s(2), s(2), s(1)]),
                    output("y", 0, &[s(1), s(2), s(8)]),
                    input("w0", 1, &[s(2), s(2), s(1)]),
                ],
                &[0, 3],
                &[2],
                &[
                    N::Unary {
                        op: fb::UnaryOp::Neg,
                        input: 3,
                        output: 1,
                    },
                    conv(-1),
                ],
                &[0, 0],
            ),
        ),
    ];
    assert_invalid_programs(cases);
}

#[test]
fn constant_outside_the_segment_is_rejected() {
    let mut blob = conv_scan_blob();
    // Shrink the declared segment so the bias no longer fits.
    let size = u64::from_le_bytes(blob[40..48].try_into().unwrap());
    blob[40..48].copy_from_slice(&(size - 4).to_le_bytes());
    let err = init(&blob).err().unwrap();
    assert!(err.to_string().contains("outside"), "{err}");
}

// ---- bad arguments -------------------------------------------------------------

fn arg_error(mutate: impl FnOnce(&mut Args)) -> DelegateError {
    let blob = conv_scan_blob();
    let d = init(&blob).unwrap();
    let mut args = conv_scan_args(8);
    mutate(&mut args);
    let err = d.execute(&mut args).expect_err("bad arguments accepted");
    assert_eq!(err.status(), Status::InvalidArgument, "{err}");
    err
}

#[test]
fn wrong_arguments_are_invalid_arguments() {
    let msg = |f: fn(&mut Args)| arg_error(f).to_string();
    assert!(msg(|a| a.0[0].dtype = Some(DType::F16)).contains("dtype float16, expected float32"));
    assert!(msg(|a| a.0[0].dtype = None).contains("unsupported dtype"));
    assert!(msg(|a| a.0[0].sizes = vec![1, 3, 17]).contains("expected [1, 3, <=16]"));
    assert!(msg(|a| a.0[1].sizes = vec![1, 5]).contains("x0"));
    assert!(msg(|a| a.0[0].sizes = vec![3, 8]).contains("shape"));
    assert!(msg(|a| a.0[0].contiguous = false).contains("not contiguous"));
    assert!(msg(|a| {
        a.0.pop();
    })
    .contains("expected 4 arguments"));
    // The scan's `a` must have the same length as the conv result.
    assert!(msg(|a| {
        a.0[2].sizes = vec![1, 4, 7];
    })
    .contains("differ in shape"));
    // An output the host cannot grow.
    assert!(msg(|a| a.0[3].capacity = 4).contains("cannot be resized"));
}

#[test]
fn aliased_output_is_refused() {
    let blob = conv_scan_blob();
    let d = init(&blob).unwrap();
    let mut args = conv_scan_args(8);
    // Make the output tensor point into input `a`'s memory.
    struct Aliased(Args);
    impl CallArgs for Aliased {
        fn count(&self) -> usize {
            self.0.count()
        }
        fn tensor(&self, i: usize) -> Option<ArgTensor<'_>> {
            let mut t = self.0.tensor(i)?;
            if i == 3 {
                t.data = self.0 .0[2].data.as_ptr() as *mut u8;
            }
            Some(t)
        }
        fn resize(&mut self, i: usize, sizes: &[i32]) -> bool {
            self.0.resize(i, sizes)
        }
    }
    args.0[2].capacity = C_OUT * 8;
    let mut aliased = Aliased(args);
    let err = d.execute(&mut aliased).err().unwrap();
    assert!(err.to_string().contains("overlaps"), "{err}");
}

#[test]
fn execute_before_init_is_an_invalid_state() {
    let d = Delegate::default();
    let err = d.execute(&mut conv_scan_args(8)).err().unwrap();
    assert_eq!(err.status(), Status::InvalidState);
}

#[test]
fn bad_compile_specs_fail_init() {
    let blob = conv_scan_blob();
    let mut d = Delegate::default();
    d.add_compile_spec("num_threads", &[1, 0]);
    // SAFETY: `blob` outlives `d`.
    let err = d
        .init(unsafe { BlobBytes::new(blob.as_ptr(), blob.len()) })
        .err()
        .unwrap();
    assert_eq!(err.status(), Status::InvalidArgument);
    let mut d = Delegate::default();
    d.add_compile_spec("num_threads", &1u32.to_le_bytes());
    d.add_compile_spec("some_future_key", b"x");
    // SAFETY: as above.
    d.init(unsafe { BlobBytes::new(blob.as_ptr(), blob.len()) })
        .unwrap();
    d.execute(&mut conv_scan_args(4)).unwrap();
}

#[test]
fn plan_report_is_returned_not_logged_from_pool_threads() {
    // Regression: planning runs on the kernel pool, and a log line from a
    // pool thread deadlocked the Python runtime (ET_LOG takes the GIL).
    let blob = conv_scan_blob();
    let d = init(&blob).unwrap();
    let report = &d.plan().unwrap().report;
    assert!(
        report.iter().any(|l| l.contains("conv1d -> ")),
        "{report:?}"
    );
    // The calling thread is the pool's thread 0 and may log; the workers
    // the pool spawned may not.
    let pool = crate::threads::pool(2).unwrap();
    let outcomes = pool.broadcast(|_| {
        let refused =
            std::panic::catch_unwind(|| crate::host::log(LogLevel::Info, "log test")).is_err();
        (crate::threads::is_worker(), refused)
    });
    assert_eq!(outcomes, vec![(false, false), (true, true)]);
}

#[test]
fn executorch_pool_workers_may_not_log_either() {
    use rustconv_kernels::par;
    let pool = crate::threads::ExecutorchPool::get().expect("ExecuTorch's threadpool");
    let outcomes = std::sync::Mutex::new(std::collections::BTreeSet::new());
    par::install(&pool, || {
        par::for_each(32, |_| {
            let refused =
                std::panic::catch_unwind(|| crate::host::log(LogLevel::Info, "log test")).is_err();
            let thread = par::task_thread().unwrap();
            outcomes
                .lock()
                .unwrap()
                .insert((thread > 0, crate::threads::is_worker(), refused));
            // Long enough that every thread gets tasks of its own.
            std::thread::sleep(std::time::Duration::from_millis(2));
        })
    });
    let expected = if par::Pool::threads(&pool) > 1 {
        vec![(false, false, false), (true, true, true)]
    } else {
        vec![(false, false, false)]
    };
    assert_eq!(
        outcomes
            .into_inner()
            .unwrap()
            .into_iter()
            .collect::<Vec<_>>(),
        expected
    );
}
