//! `execute` allocates nothing, fused blocks included: blobs exported from
//! the reference blocks (an LFM2 short conv between its projections, a
//! diagonal SSM, and their streaming forms whose state the delegate owns)
//! and from transformers' wav2vec2 feature encoder (LayerNorm and
//! GroupNorm: statistics passes; `Wav2Vec2FeatureEncoder` with
//! `conv_dim=(32, 32, 32)`, `conv_kernel=(10, 3, 2)`, `conv_stride=(5, 2, 2)`,
//! 1600 samples, seed 0) (`tests/fixtures/*.blob`, made by
//! `RustConvBackend.preprocess`) run through the delegate under a counting
//! global allocator.
//!
//! Profiled calls (an event sink attached) allocate nothing either, and no
//! call matches recipes against its programs: `init` compiles every program
//! once (`rustconv_kernels::fused::programs_compiled`).
//!
//! Its own test binary without the libtest harness (`harness = false`), so
//! that only this thread and the delegate's pool are alive (see the kernels'
//! `tests/no_alloc.rs`).

#[path = "../../kernels/tests/common/counting_alloc.rs"]
mod counting_alloc;

use std::sync::atomic::Ordering;

use counting_alloc::ALLOCATIONS;

use rustconv_backend::blob::{BlobBytes, BlobLayout};
use rustconv_backend::executor::{ArgTensor, CallArgs};
use rustconv_backend::graph::{DType, GraphDesc};
use rustconv_backend::profiling::{Clock, EventSink};
use rustconv_backend::Delegate;
use rustconv_kernels::fused::programs_compiled;

/// Counts the events and their bytes, as a host's event tracer would keep
/// them (in memory it owns).
#[derive(Default)]
struct CountingSink {
    events: usize,
    metadata_bytes: usize,
}

fn ticks() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

impl EventSink for CountingSink {
    fn clock(&self) -> Clock {
        ticks
    }

    fn log(&mut self, _kernel: u32, start: u64, end: u64, metadata: &[u8]) {
        assert!(start <= end);
        self.events += 1;
        self.metadata_bytes += metadata.len();
    }
}

/// The call's tensors: inputs then outputs, float32 at their bound shapes.
struct Args {
    sizes: Vec<Vec<i32>>,
    data: Vec<Vec<f32>>,
}

impl CallArgs for Args {
    fn count(&self) -> usize {
        self.data.len()
    }

    fn tensor(&self, i: usize) -> Option<ArgTensor<'_>> {
        Some(ArgTensor {
            dtype: Some(DType::F32),
            sizes: &self.sizes[i],
            contiguous: true,
            nbytes: self.data[i].len() * 4,
            data: self.data[i].as_ptr() as *mut u8,
        })
    }

    fn resize(&mut self, i: usize, sizes: &[i32]) -> bool {
        sizes == self.sizes[i].as_slice()
    }
}

/// Runs the block at its bound shapes, or with every dynamic dimension at 1
/// (`one_token`: a decode step of a streaming block).
fn run_block(name: &str, one_token: bool) {
    let path = format!("{}/tests/fixtures/{name}.blob", env!("CARGO_MANIFEST_DIR"));
    let blob = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let layout = BlobLayout::parse(&blob).unwrap();
    let graph = GraphDesc::decode(&blob, &layout).unwrap();
    let mut sizes = Vec::new();
    let mut data = Vec::new();
    for &v in graph.inputs.iter().chain(&graph.outputs) {
        let dims: Vec<i32> = graph.values[v]
            .dims
            .iter()
            .map(|d| {
                if one_token && d.dynamic {
                    1
                } else {
                    d.size as i32
                }
            })
            .collect();
        let n: i32 = dims.iter().product();
        data.push(
            (0..n)
                .map(|i| ((i * 37 % 17) as f32 - 8.0) * 0.05)
                .collect(),
        );
        sizes.push(dims);
    }
    let mut args = Args { sizes, data };
    let mut delegate = Delegate::default();
    // SAFETY: `blob` outlives `delegate` (dropped at the end of this
    // function, before `blob`) and is not modified.
    let compiled = programs_compiled();
    delegate
        .init(unsafe { BlobBytes::new(blob.as_ptr(), blob.len()) })
        .unwrap();
    let compiled_at_init = programs_compiled() - compiled;

    // Warm-up: the pool's threads start and every thread-local is set.
    let mut sink = CountingSink::default();
    for _ in 0..3 {
        delegate.execute(&mut args).unwrap();
        delegate.execute_traced(&mut args, Some(&mut sink)).unwrap();
    }
    // Rayon's deques may grow now and then under load (amortised, not the
    // delegate's); a delegate that allocates does so on every call.
    let rounds: Vec<usize> = (0..5)
        .map(|_| {
            let before = ALLOCATIONS.load(Ordering::SeqCst);
            for _ in 0..5 {
                delegate.execute(&mut args).unwrap();
                // Profiled: spans and metadata go to preallocated slots.
                delegate.execute_traced(&mut args, Some(&mut sink)).unwrap();
            }
            ALLOCATIONS.load(Ordering::SeqCst) - before
        })
        .collect();
    assert!(
        rounds.contains(&0),
        "{name} (one token: {one_token}): execute allocated in every round: {rounds:?} per 10 calls"
    );
    assert!(
        sink.events >= 28 && sink.events.is_multiple_of(28) && sink.metadata_bytes > 0,
        "{name}: {} events",
        sink.events
    );
    assert_eq!(
        programs_compiled() - compiled,
        compiled_at_init,
        "{name} (one token: {one_token}): execute compiled programs"
    );
    let outputs = &args.data[graph.inputs.len()..];
    assert!(
        outputs.iter().flatten().all(|v| v.is_finite()),
        "{name}: non-finite output"
    );
    assert!(
        outputs.iter().flatten().any(|v| *v != 0.0),
        "{name}: the outputs were not written"
    );
}

fn main() {
    for name in [
        "fused_lfm2_hf_core",
        "fused_ssm",
        "v1_causal_conv_scan",
        "stream_lfm2_example_core",
        "stream_ssm",
        // Statistics passes: transformers' wav2vec2 feature encoder at 32
        // channels, its LayerNorms over the channels (and GroupNorm over
        // time) gathered before the kernels that apply them.
        "fused_w2v2_layer_norm",
        "fused_w2v2_group_norm",
    ] {
        run_block(name, false);
    }
    // Decode steps: the column paths (one token of the streaming blocks).
    for name in ["stream_lfm2_example_core", "stream_ssm"] {
        run_block(name, true);
    }
    assert!(
        programs_compiled() > 0,
        "no block's init compiled a program"
    );
    println!(
        "no_alloc: the delegate's execute made no heap allocation and compiled no program \
         (fused blocks included)"
    );
}
