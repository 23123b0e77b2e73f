//! The decode path: a call whose rows are a few outputs long (one token of
//! a streaming model, with its `K - 1` remembered inputs) is a vector
//! operation across channels, not along time. Per block of channels it reads
//! each input *column* (one time step of every channel: from a stored
//! `[B, C, N]` tensor, a short strided gather; from a prologue, one program
//! line across the channels, so a transposed `[B, N, C]` projection is read
//! contiguously and the program's per-line set-up is paid once per column
//! instead of once per row), computes every output column with the
//! transposed taps (`acc[c] += w[c, j] * x[c, t + j * dilation]`, contiguous
//! in `c`, auto-vectorised) and stores it, or hands it to the epilogue as
//! one line.
//!
//! Small calls (a decode step of a few thousand channels) run on the calling
//! thread: waking the pool costs more than their work.

use rayon::prelude::*;

use super::{DepthwiseConv, SERIAL_MACS, SHORT_OUTPUTS};
use crate::conv1d::params::Conv1dGeometry;
use crate::fused::{col_tmp, RowsIn, RowsOut};
use crate::scratch::Scratch;

/// Channels per block with stored operands (buffers on the stack).
const STACK_BLOCK: usize = 64;
/// Channels per block with a fused operand (buffers in scratch): a whole
/// decode step's channels, so each program line is as long as possible.
const FUSED_BLOCK: usize = 1024;
/// Input columns the path holds: `SHORT_OUTPUTS` outputs with filters up
/// to 13 taps; longer spans take the row paths.
const MAX_COLS: usize = 16;

/// Work on one block's buffers: input columns, output column, temporaries.
type BlockFn<'a> = dyn FnMut(&mut [f32], &mut [f32], &mut [f32]) + 'a;

/// Whether the call takes this path.
pub(super) fn applies(g: &Conv1dGeometry) -> bool {
    g.out_len <= SHORT_OUTPUTS && g.params.in_len <= MAX_COLS
}

/// Per-thread scratch of the fused form: the input columns, an output
/// column and the programs' temporaries.
pub(super) fn scratch(x_temps: usize, y_temps: usize) -> usize {
    (MAX_COLS + 1) * FUSED_BLOCK + col_tmp(x_temps.max(y_temps), FUSED_BLOCK)
}

impl DepthwiseConv {
    /// Computes the call (see the module docs). `scratch` is `None` for
    /// stored operands (stack buffers), and holds [`scratch`] elements per
    /// thread otherwise.
    pub(super) fn columns(
        &self,
        g: &Conv1dGeometry,
        x: RowsIn,
        bias: Option<&[f32]>,
        y: RowsOut,
        scratch: Option<&Scratch>,
    ) {
        let p = &g.params;
        let (channels, out_len) = (p.in_channels, g.out_len);
        if p.batch * channels == 0 || out_len == 0 {
            return;
        }
        let block = if scratch.is_some() {
            FUSED_BLOCK
        } else {
            STACK_BLOCK
        };
        let blocks = channels.div_ceil(block);
        let macs = p.batch * channels * out_len * p.kernel_size;
        let serial = macs <= SERIAL_MACS || rayon::current_num_threads() <= 1;
        // Buffers for one block: the input columns, an output column, the
        // programs' temporaries.
        let with_buffers = |f: &mut BlockFn| match scratch {
            None => {
                let mut cols = [0.0f32; STACK_BLOCK * MAX_COLS];
                let mut acc = [0.0f32; STACK_BLOCK];
                f(&mut cols, &mut acc, &mut [])
            }
            Some(scratch) => scratch.with_slot(|slot| {
                let (cols, rest) = slot.split_at_mut(MAX_COLS * FUSED_BLOCK);
                let (acc, tmp) = rest.split_at_mut(FUSED_BLOCK);
                f(cols, acc, tmp)
            }),
        };
        match y {
            RowsOut::Slice(y) => {
                // Block `blk` of item `b`: its rows are one contiguous range.
                let run = |b: usize, blk: usize, y_blk: &mut [f32]| {
                    with_buffers(&mut |cols, acc, tmp| {
                        self.block(g, b, blk * block, x, bias, cols, acc, tmp, |l, acc, _| {
                            for (row, &a) in y_blk.chunks_exact_mut(out_len).zip(acc) {
                                row[l] = a;
                            }
                        })
                    })
                };
                let item = channels * out_len;
                if serial {
                    for (b, y_item) in y.chunks_mut(item).enumerate() {
                        for (blk, y_blk) in y_item.chunks_mut(block * out_len).enumerate() {
                            run(b, blk, y_blk);
                        }
                    }
                } else {
                    y.par_chunks_mut(item).enumerate().for_each(|(b, y_item)| {
                        y_item
                            .par_chunks_mut(block * out_len)
                            .enumerate()
                            .for_each(|(blk, y_blk)| run(b, blk, y_blk))
                    });
                }
            }
            RowsOut::Fused(sink) => {
                let run = |t: usize| {
                    let (b, c0) = (t / blocks, (t % blocks) * block);
                    with_buffers(&mut |cols, acc, tmp| {
                        self.block(g, b, c0, x, bias, cols, acc, tmp, |l, acc, tmp| {
                            sink.store_col(b * channels + c0, l, acc, tmp)
                        })
                    })
                };
                let tasks = p.batch * blocks;
                if serial {
                    (0..tasks).for_each(run);
                } else {
                    (0..tasks).into_par_iter().for_each(run);
                }
            }
        }
    }

    /// One block of channels `c0 ..` (as many as `acc` holds, at most the
    /// rest) of batch item `b`: reads its input columns into `cols`, then
    /// hands each output column to `emit` (with `tmp`, free again by then).
    #[allow(clippy::too_many_arguments)]
    fn block(
        &self,
        g: &Conv1dGeometry,
        b: usize,
        c0: usize,
        x: RowsIn,
        bias: Option<&[f32]>,
        cols: &mut [f32],
        acc: &mut [f32],
        tmp: &mut [f32],
        mut emit: impl FnMut(usize, &[f32], &mut [f32]),
    ) {
        let p = &g.params;
        let (channels, in_len, k) = (p.in_channels, p.in_len, p.kernel_size);
        let n = acc.len().min(channels - c0);
        let row0 = b * channels + c0;
        for (t, col) in cols.chunks_exact_mut(n).take(in_len).enumerate() {
            match x {
                RowsIn::Slice(x) => {
                    let rows = x[row0 * in_len..].chunks_exact(in_len);
                    for (v, row) in col.iter_mut().zip(rows) {
                        *v = row[t];
                    }
                }
                RowsIn::Fused(source) => source.fill_col(row0, t, col, tmp),
            }
        }
        let acc = &mut acc[..n];
        for l in 0..g.out_len {
            match bias {
                Some(bias) => acc.copy_from_slice(&bias[c0..c0 + n]),
                None => acc.fill(0.0),
            }
            for j in 0..k {
                // Input position l + j * dilation - pad_left, if in the row.
                let at = (l + j * p.dilation).wrapping_sub(p.pad_left);
                if at >= in_len {
                    continue;
                }
                let col = &cols[at * n..][..n];
                let taps = &self.taps_t[j * channels + c0..][..n];
                for ((a, &w), &v) in acc.iter_mut().zip(taps).zip(col) {
                    *a += w * v;
                }
            }
            emit(l, acc, tmp);
        }
    }
}
