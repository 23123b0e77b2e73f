//! Per-kernel profiling for ExecuTorch's event tracer.
//!
//! When the host attaches an event tracer, `execute` reads a clock around
//! every step (one fused kernel, whose identity is the `Node.kernel` index
//! recorded at export and the key of the debug-handle map `preprocess`
//! returned) into [`KernelEvents`], sized at init; after the kernels ran, the
//! calling thread hands each span with its metadata to an [`EventSink`]
//! (ffi.rs logs it with `event_tracer_log_profiling_delegate`), as XNNPACK's
//! profiler does. Nothing is logged from the pool's threads and nothing is
//! allocated. Without a tracer the only cost is one branch per step.
//!
//! Metadata is ASCII `key=value` pairs joined by `;`:
//! `algorithm=depthwise_simd;bytes=16777216;flops=33554432`, where `bytes` is
//! what the kernel must read and write in memory (every stored value it reads
//! or writes, counted once, at this call's shapes, plus what its statistics
//! pass reads; values computed in its loops cost nothing) and `flops` (absent for elementwise passes) counts a
//! multiply-add as two. `rustconv.profiling.parse_delegate_metadata` reads it.

use std::io::Write;

use crate::plan::{Plan, Step};
use crate::shape::Shape;

/// Reads a monotonic clock, in the ticks of the event tracer's own clock.
pub type Clock = fn() -> u64;

/// Room for one kernel's metadata; the longest algorithm name and two
/// 20-digit counts fit with margin.
pub const METADATA_CAPACITY: usize = 128;

/// Receives a call's kernel events, on the thread that called `execute`,
/// once the kernels ran.
pub trait EventSink {
    /// The clock the spans are read from.
    fn clock(&self) -> Clock;
    /// One fused kernel's span and metadata (see the module docs).
    fn log(&mut self, kernel: u32, start: u64, end: u64, metadata: &[u8]);
}

/// Spans and metadata of one call, one slot per step, allocated at init.
pub struct KernelEvents {
    /// `(start, end)` of each step, in clock ticks.
    pub(crate) spans: Vec<(u64, u64)>,
    metadata: Vec<u8>,
}

impl KernelEvents {
    pub fn new(steps: usize) -> Self {
        KernelEvents {
            spans: vec![(0, 0); steps],
            metadata: vec![0; steps * METADATA_CAPACITY],
        }
    }

    /// Reports every step's span of the call that just ran to `sink`, with
    /// its metadata at the call's shapes. Allocates nothing.
    pub(crate) fn report(&mut self, plan: &Plan, shapes: &[Shape], sink: &mut dyn EventSink) {
        for ((step, &(start, end)), slot) in plan
            .steps
            .iter()
            .zip(&self.spans)
            .zip(self.metadata.chunks_exact_mut(METADATA_CAPACITY))
        {
            let len = write_metadata(slot, step, work(step, shapes));
            sink.log(step.kernel, start, end, &slot[..len]);
        }
    }
}

/// What one kernel did in a call: bytes it moved, FLOPs where meaningful.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Work {
    pub bytes: u64,
    pub flops: Option<u64>,
}

/// The work of `step` at the call's `shapes`.
pub fn work(step: &Step, shapes: &[Shape]) -> Work {
    // Reads and writes are each sorted and deduplicated; a value both read
    // and written (a staged conv's buffers) is moved twice, and counted so.
    // The statistics pass reads its inputs once more (its variance pass
    // re-reads them from cache).
    let bytes = step
        .reads
        .iter()
        .chain(&step.writes)
        .copied()
        .chain(step.statistics.iter().flat_map(|s| s.program.loads()))
        // Kernels read and write every stored value as f32 (float16
        // arguments through f32 shadows, converted outside the steps).
        .map(|v| (shapes[v].numel() * std::mem::size_of::<f32>()) as u64)
        .sum();
    let flops = step.exec.flops(shapes);
    Work { bytes, flops }
}

/// Writes `step`'s metadata into `slot`; returns its length. A slot too
/// small truncates the text rather than failing (it cannot be with the
/// names the plan uses).
fn write_metadata(slot: &mut [u8], step: &Step, work: Work) -> usize {
    let capacity = slot.len();
    let mut cursor: &mut [u8] = slot;
    let _ = write!(
        cursor,
        "algorithm={};bytes={}",
        step.algorithm(),
        work.bytes
    );
    if let Some(flops) = work.flops {
        let _ = write!(cursor, ";flops={flops}");
    }
    capacity - cursor.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_truncates_instead_of_failing() {
        let mut slot = [0u8; 16];
        let mut long = [0u8; METADATA_CAPACITY];
        let step = Step {
            kernel: 3,
            absorbed: Vec::new(),
            reads: Vec::new(),
            writes: Vec::new(),
            statistics: Vec::new(),
            exec: Box::new(crate::step::PassStep::new(Vec::new())),
        };
        let work = Work {
            bytes: u64::MAX,
            flops: Some(u64::MAX),
        };
        assert_eq!(write_metadata(&mut slot, &step, work), 16);
        let n = write_metadata(&mut long, &step, work);
        assert_eq!(
            std::str::from_utf8(&long[..n]).unwrap(),
            "algorithm=elementwise;bytes=18446744073709551615;flops=18446744073709551615"
        );
    }
}
