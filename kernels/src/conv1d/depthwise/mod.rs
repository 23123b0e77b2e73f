//! Depthwise conv1d with short filters (the short convolution of gated-conv
//! language models, `K = 3, 4`, and up to a few tens of taps): SIMD along
//! time with the taps in registers.
//!
//! Applies to depthwise convolutions with multiplier 1 (`groups ==
//! in_channels == out_channels`) and stride 1, with any dilation, padding
//! and bias. Each output row `(b, c)` is
//! `y[l] = bias[c] + sum_k w[c, k] * x[b, c, l + k * dilation - pad_left]`;
//! the row kernels ([`simd`]) split it into an unpadded interior
//! (vectorised along time, register-blocked, no branches) and the padded
//! edges (scalar for short filters, vectorised through a small zero-padded
//! stack window for longer ones, which takes all of a short row). The
//! instruction set (AVX-512, AVX2 + FMA, NEON or portable auto-vectorised
//! Rust) is the one the preparation chose (`crate::simd`).
//!
//! Rows run in parallel on the current rayon pool, several short rows per
//! task; when there are too few rows to keep every thread busy, rows are
//! also split into time chunks. The row kernels read the weights in place
//! and need no scratch. A decode step (at most four outputs per row), and a
//! call whose fused operands lie channels-last (`[B, N, C]` tensors seen
//! through transposes), run across channels instead ([`columns`], with the
//! column kernel of [`tile`]), on the taps transposed (`K * C` floats): once
//! at prepare for constant weights, per call into scratch for weights fed at
//! run time.

mod columns;
mod simd;
mod tile;

use super::algorithm::{ConvAlgorithm, Entry, NotFusable};
use super::cost::{compulsory_bytes, direct_macs};
use super::params::Conv1dGeometry;
use super::weights::Weights;
use crate::fused::{block_tmp, RowSink, RowsIn, RowsOut, ROW_BLOCK};
use crate::scratch::Scratch;
use crate::simd::Isa;
use columns::{ColumnWalk, SERIAL_MACS, SHORT_OUTPUTS};
use simd::{Backend, RowGeom, RowKernel};

/// Depthwise with multiplier 1 and stride 1.
pub(crate) fn applies(g: &Conv1dGeometry) -> bool {
    let p = &g.params;
    p.groups == p.in_channels && p.out_channels == p.in_channels && p.stride == 1
}

// Cost model constants: single-thread rates of this kernel, calibrated
// with `calibrate` in the tests (`cargo test --release -p rustconv-kernels
// calibrate -- --ignored --nocapture`) on a 2-core AMD EPYC (Zen 5) VM
// shared with other builds, so only roughly. NEON's are unmeasured guesses
// scaled from AVX2 by vector width.

/// AVX2 + FMA interior multiply-adds per second (taps in registers for
/// K <= 8, broadcast per block above; both measured near 33e9, about 80% of
/// two 8-lane FMAs per cycle).
#[cfg(target_arch = "x86_64")]
const AVX2_MACS_PER_SEC: f64 = 3.2e10;
/// AVX-512 interior multiply-adds per second with the taps in registers
/// or broadcast per block (measured 5.0e10 to 5.5e10 at K = 32 and 128,
/// 1.5 times AVX2: the unaligned loads, one per FMA and most of them split
/// across cache lines, bound it rather than the FMAs).
#[cfg(target_arch = "x86_64")]
const AVX512_MACS_PER_SEC: f64 = 5.2e10;
/// AVX-512 with the grouped kernel (`9 <= K <= 64`, dilation 1), each
/// load shared by several taps: FMA-bound, measured 9.6e10 to 1.08e11 at
/// K = 32 (near two 16-lane FMAs per cycle).
#[cfg(target_arch = "x86_64")]
const AVX512_GROUPED_MACS_PER_SEC: f64 = 9.5e10;
/// Portable interior multiply-adds per second (SSE2 on x86_64).
const PORTABLE_MACS_PER_SEC: f64 = 2.0e10;
/// NEON interior multiply-adds per second (guess: half of AVX2's lanes).
#[cfg(target_arch = "aarch64")]
const NEON_MACS_PER_SEC: f64 = 1.6e10;
/// Bytes per second this kernel streams x in and y out at: it moves
/// exactly the compulsory bytes, like a copy, and reaches a single-thread
/// copy's bandwidth from DRAM (measured about 4e10 here; more in cache).
/// The crate-wide [`super::cost::BYTES_PER_SEC`] (1e10) is well below what
/// this machine streams, and would make every short filter look as slow as
/// the direct loop.
const STREAM_BYTES_PER_SEC: f64 = 4.0e10;
/// Scalar edge multiply-adds per second, for spans too long for the edge
/// window ([`simd`]'s `EDGE_BUF`): one FMA dependency chain per output,
/// consecutive outputs overlapping.
const SCALAR_EDGE_MACS_PER_SEC: f64 = 2.0e9;
/// Fixed cost per output row: task share, row set-up, edges of short spans.
const SECONDS_PER_ROW: f64 = 1.0e-8;
/// Cost per output row and tap: the row's short pieces (edge windows, last
/// partial blocks) keep few vectors in flight, which shows in rows of a
/// few hundred outputs. Fitted at K = 32 and 64, N = 64 and 256, C = 512
/// (AVX-512, one core): within 20% of the measured times.
const SECONDS_PER_ROW_TAP: f64 = 7.0e-10;

/// Estimated single-thread seconds on `backend`: a roofline of the
/// multiply-adds at the backend's interior rate against the compulsory bytes at this kernel's
/// streaming bandwidth, plus a per-row overhead (and scalar edges where the
/// span is too long for the vector edge window).
pub(crate) fn cost(g: &Conv1dGeometry, backend: Backend) -> f64 {
    let p = &g.params;
    let k = p.kernel_size;
    let rate = match backend {
        #[cfg(target_arch = "x86_64")]
        _ if simd::grouped(backend, k, p.dilation) => AVX512_GROUPED_MACS_PER_SEC,
        Backend::Portable => PORTABLE_MACS_PER_SEC,
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2 => AVX2_MACS_PER_SEC,
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512 => AVX512_MACS_PER_SEC,
        #[cfg(target_arch = "aarch64")]
        Backend::Neon => NEON_MACS_PER_SEC,
    };
    let rows = (p.batch * p.out_channels) as f64;
    if columns::applies(g) {
        // Vectorised across channels, no row set-up.
        return roofline(
            direct_macs(g),
            PORTABLE_MACS_PER_SEC,
            compulsory_bytes(g),
            STREAM_BYTES_PER_SEC,
        );
    }
    if g.out_len <= SHORT_OUTPUTS {
        // The plain channel loop of `short_rows`: scalar, no row set-up.
        return roofline(
            direct_macs(g),
            SCALAR_EDGE_MACS_PER_SEC,
            compulsory_bytes(g),
            STREAM_BYTES_PER_SEC,
        );
    }
    let span = (k - 1) * p.dilation;
    let scalar_edges = if simd::edge_window_too_small(span) {
        // Outputs per row where some tap reads padding; about half their
        // taps read real samples.
        let interior = (p.in_len + p.pad_left)
            .saturating_sub(span)
            .saturating_sub(p.pad_left);
        let edge_macs = rows * (g.out_len - interior) as f64 * k as f64 / 2.0;
        edge_macs / SCALAR_EDGE_MACS_PER_SEC
    } else {
        0.0
    };
    roofline(
        direct_macs(g),
        rate,
        compulsory_bytes(g),
        STREAM_BYTES_PER_SEC,
    ) + scalar_edges
        + rows * (SECONDS_PER_ROW + k as f64 * SECONDS_PER_ROW_TAP)
}

/// Roofline time: `macs` at `rate`, or `bytes` at `bytes_per_sec`.
fn roofline(macs: f64, rate: f64, bytes: f64, bytes_per_sec: f64) -> f64 {
    (macs / rate).max(bytes / bytes_per_sec)
}

/// Smallest time chunk a task gets when rows are split, in outputs.
const MIN_CHUNK_OUTPUTS: usize = 2048;
/// Work (multiply-adds) below which a task is not worth its scheduling.
const MIN_TASK_MACS: usize = 1 << 15;

/// The prepared kernel: the row kernel for this tap count on the backend
/// chosen at prepare, and the walk across channels ([`columns`]) with its
/// column kernel and taps.
pub(crate) struct DepthwiseConv {
    kernel: RowKernel,
    columns: ColumnWalk,
}

impl DepthwiseConv {
    /// The kernel on `isa`, or `None` for a filter of no taps.
    pub(crate) fn new(g: &Conv1dGeometry, weights: Weights, isa: Isa) -> Option<Self> {
        Some(DepthwiseConv {
            kernel: RowKernel::new(isa, g.params.kernel_size, g.params.dilation)?,
            columns: ColumnWalk::new(g, weights, isa)?,
        })
    }

    pub(crate) fn scratch_per_thread(&self) -> usize {
        0
    }

    pub(crate) fn prepared_bytes(&self) -> usize {
        self.columns.prepared_bytes()
    }

    /// Computes `y` for the call's geometry `g` (at most the prepared
    /// batch and length; same kernel size). Allocates nothing.
    pub(crate) fn run(
        &self,
        g: &Conv1dGeometry,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        y: &mut [f32],
        _scratch: &Scratch,
    ) {
        let p = &g.params;
        debug_assert!(applies(g));
        debug_assert_eq!(x.len(), g.input_elems);
        debug_assert_eq!(w.len(), g.weight_elems);
        debug_assert_eq!(y.len(), g.output_elems);
        if y.is_empty() {
            return;
        }
        let (channels, in_len, out_len, k) = (p.in_channels, p.in_len, g.out_len, p.kernel_size);
        let geom = RowGeom {
            in_len,
            pad_left: p.pad_left,
            dilation: p.dilation,
        };
        let rows = p.batch * channels;
        if columns::applies(g) {
            self.columns
                .run(g, RowsIn::Slice(x), w, bias, RowsOut::Slice(y), None);
            return;
        }
        if out_len <= SHORT_OUTPUTS {
            short_rows(g, x, w, bias, y);
            return;
        }
        let kernel = &self.kernel;
        let row_part = |row: usize, l0: usize, y_part: &mut [f32]| {
            let c = row % channels;
            kernel.row(
                &geom,
                &x[row * in_len..][..in_len],
                &w[c * k..][..k],
                bias.map_or(0.0, |b| b[c]),
                l0,
                y_part,
            );
        };

        let min_outputs = (MIN_TASK_MACS / k).max(1);
        let chunk = time_chunk(rows, out_len, crate::par::threads(), kernel.block_outputs());
        if chunk >= out_len {
            // Whole rows, grouped so each task has enough work.
            let min_rows = min_outputs.div_ceil(out_len);
            crate::par::for_each_chunk_mut_min(y, out_len, min_rows, |row, y_row| {
                row_part(row, 0, y_row)
            });
        } else {
            crate::par::for_each_chunk_mut_2d(y, out_len, chunk, |row, i, y_part| {
                row_part(row, i * chunk, y_part)
            });
        }
    }
}

/// Outputs a fused call computes per step of a task: the input window
/// (this plus the filter's span) and the outputs stay in L1.
pub(crate) const FUSED_CHUNK: usize = 1024;

/// Outputs per row in a step of a task that handles [`ROW_BLOCK`] rows at
/// once (when the epilogue takes blocks of rows).
const BLOCK_CHUNK: usize = 64;

impl DepthwiseConv {
    /// f32 elements of per-thread scratch [`Self::run_rows`] needs, for an
    /// input and an output needing `x_temps` and `y_temps` line-sized
    /// temporaries.
    pub(crate) fn rows_scratch(g: &Conv1dGeometry, x_temps: usize, y_temps: usize) -> usize {
        let span = (g.params.kernel_size - 1) * g.params.dilation;
        let window = FUSED_CHUNK + span;
        let per_row = window + FUSED_CHUNK + (x_temps * window).max(y_temps * FUSED_CHUNK);
        let block_window = BLOCK_CHUNK + span;
        let per_block = ROW_BLOCK * (block_window + BLOCK_CHUNK)
            + block_tmp(x_temps, block_window).max(block_tmp(y_temps, BLOCK_CHUNK));
        per_row
            .max(per_block)
            .max(columns::scratch(g, x_temps, y_temps))
    }

    /// [`Self::run`] with a fused input and / or output: each task computes
    /// [`FUSED_CHUNK`] outputs of a row at a time, reading the input window
    /// they need from the prologue into scratch (zero padding stays the row
    /// kernel's business: the window is the part of the row inside the
    /// input) and handing the outputs to the epilogue.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run_rows(
        &self,
        g: &Conv1dGeometry,
        x: RowsIn,
        w: &[f32],
        bias: Option<&[f32]>,
        y: RowsOut,
        scratch: &Scratch,
    ) {
        let p = &g.params;
        let (channels, in_len, out_len, k) = (p.in_channels, p.in_len, g.out_len, p.kernel_size);
        let rows = p.batch * channels;
        if rows == 0 || out_len == 0 {
            return;
        }
        if columns::applies(g) || columns::prefers(g, &x, &y) {
            // A decode step's stored operands use stack buffers, as `run`
            // (which gets no scratch) does.
            let fused = matches!(x, RowsIn::Fused(_)) || matches!(y, RowsOut::Fused(_));
            self.columns.run(g, x, w, bias, y, fused.then_some(scratch));
            return;
        }
        let (x, y) = match (x, y) {
            (RowsIn::Slice(x), RowsOut::Slice(y)) if out_len <= SHORT_OUTPUTS => {
                short_rows(g, x, w, bias, y);
                return;
            }
            other => other,
        };
        let span = (k - 1) * p.dilation;
        let window = FUSED_CHUNK + span;
        let kernel = &self.kernel;
        let (stored, sink) = match y {
            RowsOut::Slice(y) => (Some(y), None),
            RowsOut::Fused(sink) => (None, Some(sink)),
        };
        // Outputs `l0 .. l0 + n` of `row`, into `y_part` when stored as is,
        // in the thread's scratch `slot`.
        let in_slot =
            |slot: &mut [f32], row: usize, l0: usize, n: usize, mut y_part: Option<&mut [f32]>| {
                let c = row % channels;
                let taps = &w[c * k..][..k];
                let b = bias.map_or(0.0, |b| b[c]);
                let (x_win, rest) = slot.split_at_mut(window);
                let (y_buf, tmp) = rest.split_at_mut(FUSED_CHUNK);
                for l in (l0..l0 + n).step_by(FUSED_CHUNK) {
                    let m = FUSED_CHUNK.min(l0 + n - l);
                    let (x_row, geom, at): (&[f32], RowGeom, usize) = match x {
                        RowsIn::Slice(x) => (
                            &x[row * in_len..][..in_len],
                            RowGeom {
                                in_len,
                                pad_left: p.pad_left,
                                dilation: p.dilation,
                            },
                            l,
                        ),
                        RowsIn::Fused(source) => {
                            // Inputs `s .. e` feed outputs `l .. l + m`.
                            let s = l.saturating_sub(p.pad_left).min(in_len);
                            let e = (l + m + span).saturating_sub(p.pad_left).min(in_len).max(s);
                            source.fill(row, s, &mut x_win[..e - s], tmp);
                            (
                                &x_win[..e - s],
                                RowGeom {
                                    in_len: e - s,
                                    pad_left: p.pad_left,
                                    dilation: p.dilation,
                                },
                                l - s,
                            )
                        }
                    };
                    match (&mut y_part, sink) {
                        (Some(part), _) => {
                            kernel.row(&geom, x_row, taps, b, at, &mut part[l - l0..][..m])
                        }
                        (None, Some(sink)) => {
                            kernel.row(&geom, x_row, taps, b, at, &mut y_buf[..m]);
                            sink.store(row, l, &y_buf[..m], tmp);
                        }
                        (None, None) => unreachable!("stored outputs come with their row"),
                    }
                }
            };
        let task = |row: usize, l0: usize, n: usize, y_part: Option<&mut [f32]>| {
            scratch.with_slot(|slot| in_slot(slot, row, l0, n, y_part))
        };
        let chunk = time_chunk(rows, out_len, crate::par::threads(), FUSED_CHUNK);
        let min_rows = (MIN_TASK_MACS / k).max(1).div_ceil(out_len);
        match stored {
            Some(y) if chunk >= out_len => {
                crate::par::for_each_chunk_mut_min(y, out_len, min_rows, |row, y_row| {
                    task(row, 0, out_len, Some(y_row))
                })
            }
            Some(y) => crate::par::for_each_chunk_mut_2d(y, out_len, chunk, |row, i, part| {
                task(row, i * chunk, part.len(), Some(part))
            }),
            None => {
                let sink = sink.expect("a fused output has a sink");
                let source_across = matches!(x, RowsIn::Fused(source) if source.prefers_columns());
                // Rows no longer than a block's chunk are whole in it: the
                // blocks' one walk over all their rows' prologue and
                // epilogue beats a short walk per row.
                if sink.prefers_columns() || source_across || out_len <= BLOCK_CHUNK {
                    return self.run_blocks(g, x, w, bias, sink, scratch);
                }
                // Rows of both operands lie along time: whole rows (up to
                // FUSED_CHUNK outputs) per program walk, not run_blocks'
                // BLOCK_CHUNK, whose per-line set-up cost a transformers
                // FastConformer module's GLU and SiLU (128 rows of 256)
                // ten times their arithmetic.
                // The slot taken once per task, not per row: short rows
                // (a FastConformer's 32 frames) paid for its checks per row.
                let per_row = out_len.div_ceil(chunk);
                let (pieces, min) = (rows * per_row, min_rows.max(1));
                crate::par::for_each(pieces.div_ceil(min), |group| {
                    scratch.with_slot(|slot| {
                        for t in group * min..pieces.min((group + 1) * min) {
                            let (row, l0) = (t / per_row, t % per_row * chunk);
                            in_slot(slot, row, l0, chunk.min(out_len - l0), None)
                        }
                    })
                })
            }
        }
    }
}

impl DepthwiseConv {
    /// The fused-output path: tasks of up to [`ROW_BLOCK`] channels of one
    /// batch item and a time chunk, so that a source or sink whose rows are
    /// far apart in memory (a transposed `[B, N, C]` tensor) reads and
    /// writes across the rows, contiguously.
    fn run_blocks(
        &self,
        g: &Conv1dGeometry,
        x: RowsIn,
        w: &[f32],
        bias: Option<&[f32]>,
        sink: &dyn RowSink,
        scratch: &Scratch,
    ) {
        let p = &g.params;
        let (channels, in_len, out_len, k) = (p.in_channels, p.in_len, g.out_len, p.kernel_size);
        let span = (k - 1) * p.dilation;
        let window = BLOCK_CHUNK + span;
        let blocks_per_item = channels.div_ceil(ROW_BLOCK);
        let chunks = out_len.div_ceil(BLOCK_CHUNK);
        let kernel = &self.kernel;
        // Chunks of time a task computes one after the other, so that the
        // windows' overlap (the filter's span) is read once per group.
        let chunks_per_task = chunks
            .div_ceil((4 * crate::par::threads()).div_ceil(p.batch * blocks_per_item))
            .max(1);
        let groups = chunks.div_ceil(chunks_per_task);
        let tasks = p.batch * blocks_per_item * groups;
        crate::par::for_each(tasks, |task| {
            let (item_block, group) = (task / groups, task % groups);
            let (b, block) = (item_block / blocks_per_item, item_block % blocks_per_item);
            let c0 = block * ROW_BLOCK;
            let rows = ROW_BLOCK.min(channels - c0);
            let row0 = b * channels + c0;
            scratch.with_slot(|slot| {
                let (x_win, rest) = slot.split_at_mut(ROW_BLOCK * window);
                let (y_buf, tmp) = rest.split_at_mut(ROW_BLOCK * BLOCK_CHUNK);
                for chunk in group * chunks_per_task..((group + 1) * chunks_per_task).min(chunks) {
                    let l = chunk * BLOCK_CHUNK;
                    let m = BLOCK_CHUNK.min(out_len - l);
                    // Inputs `s .. e` feed outputs `l .. l + m`.
                    let s = l.saturating_sub(p.pad_left).min(in_len);
                    let e = (l + m + span).saturating_sub(p.pad_left).min(in_len).max(s);
                    if let RowsIn::Fused(source) = x {
                        source.fill_rows(row0, rows, s, e - s, &mut x_win[..rows * (e - s)], tmp);
                    }
                    for r in 0..rows {
                        let c = c0 + r;
                        let (x_row, geom, at) = match x {
                            RowsIn::Slice(x) => (
                                &x[(row0 + r) * in_len..][..in_len],
                                RowGeom {
                                    in_len,
                                    pad_left: p.pad_left,
                                    dilation: p.dilation,
                                },
                                l,
                            ),
                            RowsIn::Fused(_) => (
                                &x_win[r * (e - s)..][..e - s],
                                RowGeom {
                                    in_len: e - s,
                                    pad_left: p.pad_left,
                                    dilation: p.dilation,
                                },
                                l - s,
                            ),
                        };
                        kernel.row(
                            &geom,
                            x_row,
                            &w[c * k..][..k],
                            bias.map_or(0.0, |b| b[c]),
                            at,
                            &mut y_buf[r * m..][..m],
                        );
                    }
                    sink.store_rows(row0, rows, l, m, &mut y_buf[..rows * m], tmp);
                }
            })
        });
    }
}

/// Channels `short_rows` computes together: independent accumulators, so
/// the multiply-adds of one channel do not wait on each other's latency.
const SHORT_BLOCK: usize = 16;

/// Every output of a call whose rows are at most [`SHORT_OUTPUTS`] long:
/// per output, the taps that land inside the row (the padding reads zeros),
/// [`SHORT_BLOCK`] rows at a time.
fn short_rows(g: &Conv1dGeometry, x: &[f32], w: &[f32], bias: Option<&[f32]>, y: &mut [f32]) {
    let p = &g.params;
    let (channels, in_len, out_len, k) = (p.in_channels, p.in_len, g.out_len, p.kernel_size);
    let (pad_left, dilation) = (p.pad_left, p.dilation);
    // Rows r0 .. r0 + y_rows.len() / out_len.
    let block = |(i, y_rows): (usize, &mut [f32])| {
        let r0 = i * SHORT_BLOCK;
        let n = y_rows.len() / out_len;
        // Each row's channel, once per block (a division per row).
        let mut ch = [0usize; SHORT_BLOCK];
        for (m, c) in ch[..n].iter_mut().enumerate() {
            *c = (r0 + m) % channels;
        }
        let mut acc = [0.0f32; SHORT_BLOCK];
        for l in 0..out_len {
            for (a, &c) in acc[..n].iter_mut().zip(&ch) {
                *a = bias.map_or(0.0, |b| b[c]);
            }
            for j in 0..k {
                // Input position l + j * dilation - pad_left, if in the row.
                let at = (l + j * dilation).wrapping_sub(pad_left);
                if at >= in_len {
                    continue;
                }
                for (m, (a, &c)) in acc[..n].iter_mut().zip(&ch).enumerate() {
                    *a += w[c * k + j] * x[(r0 + m) * in_len + at];
                }
            }
            for (m, &a) in acc[..n].iter().enumerate() {
                y_rows[m * out_len + l] = a;
            }
        }
    };
    let block_len = SHORT_BLOCK * out_len;
    if y.len() * k <= SERIAL_MACS || crate::par::threads() <= 1 {
        y.chunks_mut(block_len).enumerate().for_each(block);
    } else {
        let min_blocks = SERIAL_MACS.div_ceil(block_len * k);
        crate::par::for_each_chunk_mut_min(y, block_len, min_blocks, |i, y| block((i, y)));
    }
}

/// Length of the time chunks rows are split into (`>= out_len`: not split).
/// Rows are split only when there are fewer than four per thread, into
/// about four tasks per thread, each at least [`MIN_CHUNK_OUTPUTS`] long
/// and a multiple of the register block.
fn time_chunk(rows: usize, out_len: usize, threads: usize, block: usize) -> usize {
    let want_tasks = 4 * threads;
    if threads <= 1 || rows >= want_tasks {
        return out_len;
    }
    let parts = want_tasks.div_ceil(rows);
    out_len
        .div_ceil(parts)
        .max(MIN_CHUNK_OUTPUTS)
        .next_multiple_of(block)
}

/// The registration: depthwise, multiplier 1, stride 1; fed weights are
/// read in place (the column walk transposes them per call).
pub(super) const ENTRY: Entry = Entry {
    name: "depthwise_simd",
    applies: |g, _| applies(g),
    cost,
    serial: super::cost::SERIAL,
    takes_fed_weights: true,
    prepare: |g, weights, isa| Some(Box::new(DepthwiseConv::new(g, weights, isa)?)),
};

/// Fuses a prologue and an epilogue on every path (row kernels, blocks of
/// rows, the column walk).
impl ConvAlgorithm for DepthwiseConv {
    fn scratch_per_thread(&self) -> usize {
        DepthwiseConv::scratch_per_thread(self)
    }

    fn prepared_bytes(&self) -> usize {
        DepthwiseConv::prepared_bytes(self)
    }

    fn fuses_input(&self) -> bool {
        true
    }

    fn fuses_output(&self) -> bool {
        true
    }

    fn rows_scratch(&self, max: &Conv1dGeometry, x_temps: usize, y_temps: usize) -> usize {
        DepthwiseConv::rows_scratch(max, x_temps, y_temps)
    }

    fn run(
        &self,
        g: &Conv1dGeometry,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        y: &mut [f32],
        scratch: &Scratch,
    ) {
        DepthwiseConv::run(self, g, x, w, bias, y, scratch);
    }

    fn run_rows(
        &self,
        g: &Conv1dGeometry,
        x: RowsIn,
        w: &[f32],
        bias: Option<&[f32]>,
        y: RowsOut,
        scratch: &Scratch,
    ) -> Result<(), NotFusable> {
        DepthwiseConv::run_rows(self, g, x, w, bias, y, scratch);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
