//! The channels-last walk: a call computed across channels, a time step
//! (a *column*: that step of every channel of a block) at a time, instead
//! of along each channel's row.
//!
//! Two kinds of call take it:
//!
//! * **decode steps** ([`applies`]): rows a few outputs long (one token of a
//!   streaming model, with its `K - 1` remembered inputs) are a vector
//!   operation across channels; along time they would pay the row kernels'
//!   set-up per row for one output.
//! * **channels-last operands** ([`prefers`]): when the input comes from a
//!   prologue that reads across channels contiguously and the output goes
//!   to an epilogue that writes across them (the `[B, N, C]` projections
//!   around an LFM2-style short conv, seen through transposes), walking rows
//!   would transpose both through scratch; columns read and write them as
//!   they lie, each program line once per column of a block.
//!
//! Per block of channels and tile of outputs, the walk reads the tile's
//! input window into scratch column by column (zero columns for padding; a
//! stored `[B, C, N]` input by a short strided gather, a fused one as one
//! program line across the channels), runs the column kernel ([`super::tile`]:
//! taps in registers, vectorised across channels) and hands each output
//! column to the epilogue as one line (or scatters it into stored rows).
//! Consecutive tiles of a task share the filter's span of window columns,
//! which are moved, not recomputed.
//!
//! Small calls (a decode step of a few thousand channels) run on the calling
//! thread: waking the pool costs more than their work.
//!
//! The column kernel reads the taps tap-major (`[K, C]`). For constant
//! weights they were transposed at prepare; for weights fed at run time
//! each task transposes its block's taps from the call's weights into its
//! buffers first (`K` floats per channel, against the `K` multiply-adds per
//! channel and output the task then computes), so a fed weight is never
//! read from anything prepared.

use super::tile::{ColumnKernel, Tile};
use crate::conv1d::params::Conv1dGeometry;
use crate::conv1d::weights::Weights;
use crate::fused::{col_tmp, RowsIn, RowsOut};
use crate::scratch::Scratch;
use crate::simd::Isa;

/// Rows this short (a decode step: one output, or a few) skip the row
/// kernels, whose set-up per row (edges, register blocks) costs more than the
/// row: this walk, or a plain loop over channels, computes them.
pub(super) const SHORT_OUTPUTS: usize = 4;

/// Multiply-adds below which a call runs on the calling thread alone: waking
/// the pool costs more than the work (a decode step of a few thousand
/// channels).
pub(super) const SERIAL_MACS: usize = 1 << 16;

/// Channels per block of a decode step with stored operands (buffers on the
/// stack: `run` gets no scratch).
const STACK_BLOCK: usize = 64;
/// Channels per block of a decode step with a fused operand: a whole step's
/// channels, so each program line is as long as possible.
const FUSED_BLOCK: usize = 1024;
/// Window columns a decode step holds: [`SHORT_OUTPUTS`] outputs with
/// filters up to 13 taps; longer spans take the row paths.
const MAX_COLS: usize = 16;
/// Channels per block of long rows. Each column of a block is one line a
/// prologue reads and an epilogue writes, contiguous in a channels-last
/// tensor: whole pages of it, so that the hardware prefetchers stream it
/// (256-channel lines, a kilobyte each from rows several kilobytes apart,
/// ran at about 2.5 times this one's time, latency bound).
const LONG_BLOCK: usize = 1024;
/// Fewest outputs per tile of long rows: a tile's window and outputs stay
/// in L2 (`(2 * TILE + span) * LONG_BLOCK` floats); a filter's span more
/// keeps the columns the next tile reuses from outnumbering the new ones.
const TILE: usize = 8;
/// Longest filter span (`(K - 1) * dilation`) long rows walk across
/// channels; longer filters walk rows.
const MAX_SPAN: usize = 16;

/// Whether the call is a decode step, which always takes this walk.
pub(super) fn applies(g: &Conv1dGeometry) -> bool {
    g.out_len <= SHORT_OUTPUTS && g.out_len + span(g) <= MAX_COLS
}

/// Whether a call of long rows takes this walk for its operands: both are
/// programs whose rows lie far apart in memory ([`crate::fused::RowSource::prefers_columns`]).
pub(super) fn prefers(g: &Conv1dGeometry, x: &RowsIn, y: &RowsOut) -> bool {
    span(g) <= MAX_SPAN
        && matches!(x, RowsIn::Fused(s) if s.prefers_columns())
        && matches!(y, RowsOut::Fused(s) if s.prefers_columns())
}

fn span(g: &Conv1dGeometry) -> usize {
    (g.params.kernel_size - 1) * g.params.dilation
}

/// Outputs per tile of long rows.
fn long_tile(g: &Conv1dGeometry) -> usize {
    TILE.max(span(g))
}

/// Per-thread scratch of the walk with a fused operand (a call of geometry
/// `g` or smaller): the window, the output tile, the block's taps (used
/// where the weights are fed) and the programs' temporaries, for a decode
/// step and for long rows.
pub(super) fn scratch(g: &Conv1dGeometry, x_temps: usize, y_temps: usize) -> usize {
    let temps = x_temps.max(y_temps);
    let k = g.params.kernel_size;
    let decode = (MAX_COLS + SHORT_OUTPUTS + k) * FUSED_BLOCK + col_tmp(temps, FUSED_BLOCK);
    let long = if span(g) <= MAX_SPAN {
        (2 * long_tile(g) + span(g) + k) * LONG_BLOCK + col_tmp(temps, LONG_BLOCK)
    } else {
        0
    };
    decode.max(long)
}

/// Buffers of one block: the window, the output tile, the block's taps,
/// temporaries.
type BlockFn<'a> = dyn FnMut(&mut [f32], &mut [f32], &mut [f32], &mut [f32]) + 'a;

/// The walk prepared: the column kernel for this tap count on the backend
/// chosen at prepare, and where it gets its taps.
pub(super) struct ColumnWalk {
    kernel: ColumnKernel,
    taps: ColumnTaps,
}

/// The taps laid out for the column kernel (`[K, C]`, tap-major).
enum ColumnTaps {
    /// Transposed at prepare from constant weights:
    /// `taps_t[j * C + c] = w[c, j]`.
    Prepared(Vec<f32>),
    /// Weights fed at run time: each task of the walk transposes its block
    /// of channels' taps from the call's weights into its scratch.
    PerCall,
}

impl ColumnWalk {
    /// The walk on `isa`, or `None` for a filter of no taps.
    pub(super) fn new(g: &Conv1dGeometry, weights: Weights, isa: Isa) -> Option<Self> {
        let (c, k) = (g.params.out_channels, g.params.kernel_size);
        let taps = match weights {
            Weights::Constant(w) => {
                debug_assert_eq!(w.len(), c * k);
                let mut taps_t = vec![0.0; c * k];
                for (i, &v) in w.iter().take(c * k).enumerate() {
                    taps_t[(i % k) * c + i / k] = v;
                }
                ColumnTaps::Prepared(taps_t)
            }
            Weights::Fed => ColumnTaps::PerCall,
        };
        Some(ColumnWalk {
            kernel: ColumnKernel::new(isa, k)?,
            taps,
        })
    }

    /// Bytes of the taps transposed at prepare.
    pub(super) fn prepared_bytes(&self) -> usize {
        match &self.taps {
            ColumnTaps::Prepared(taps_t) => std::mem::size_of_val(taps_t.as_slice()),
            ColumnTaps::PerCall => 0,
        }
    }

    /// Computes the call (see the module docs). `scratch` is `None` for a
    /// decode step with stored operands (stack buffers), and holds
    /// [`scratch`] elements per thread otherwise.
    pub(super) fn run(
        &self,
        g: &Conv1dGeometry,
        x: RowsIn,
        w: &[f32],
        bias: Option<&[f32]>,
        y: RowsOut,
        scratch: Option<&Scratch>,
    ) {
        let p = &g.params;
        let (channels, out_len) = (p.in_channels, g.out_len);
        if p.batch * channels == 0 || out_len == 0 {
            return;
        }
        let (block, tile) = match (applies(g), scratch) {
            (true, None) => (STACK_BLOCK, out_len),
            (true, Some(_)) => (FUSED_BLOCK, out_len),
            (false, _) => (LONG_BLOCK, long_tile(g)),
        };
        let blocks = channels.div_ceil(block);
        let tiles = out_len.div_ceil(tile);
        let macs = p.batch * channels * out_len * p.kernel_size;
        let threads = crate::par::threads();
        let serial = macs <= SERIAL_MACS || threads <= 1;
        // Tiles a task computes one after the other (sharing their windows'
        // overlap): enough tasks for about four per thread.
        let tiles_per_task = if serial {
            tiles
        } else {
            tiles
                .div_ceil((4 * threads).div_ceil(p.batch * blocks))
                .max(1)
        };
        let groups = tiles.div_ceil(tiles_per_task);
        let window = tile + span(g);
        let k = p.kernel_size;
        let with_buffers = |f: &mut BlockFn| match scratch {
            None => {
                // `applies` bounds the tap count by the window's columns.
                debug_assert!(k <= MAX_COLS);
                let mut win = [0.0f32; STACK_BLOCK * MAX_COLS];
                let mut out = [0.0f32; STACK_BLOCK * SHORT_OUTPUTS];
                let mut taps = [0.0f32; STACK_BLOCK * MAX_COLS];
                f(&mut win, &mut out, &mut taps, &mut [])
            }
            Some(scratch) => scratch.with_slot(|slot| {
                let (win, rest) = slot.split_at_mut(window * block);
                let (out, rest) = rest.split_at_mut(tile * block);
                let (taps, tmp) = rest.split_at_mut(k * block);
                f(win, out, taps, tmp)
            }),
        };
        match y {
            RowsOut::Slice(y) => {
                // A decode step (`prefers` needs a fused output): one tile,
                // and block `blk` of item `b` is one contiguous range of rows.
                debug_assert_eq!(tiles, 1);
                let run = |b: usize, blk: usize, y_blk: &mut [f32]| {
                    with_buffers(&mut |win, out, taps, tmp| {
                        self.tiles(
                            g,
                            b,
                            blk * block,
                            block,
                            0..1,
                            tile,
                            x,
                            w,
                            bias,
                            win,
                            out,
                            taps,
                            tmp,
                            |_, m, out, _| {
                                if out_len == 1 {
                                    // One token: the column is the block's rows.
                                    y_blk.copy_from_slice(out);
                                    return;
                                }
                                let n = y_blk.len() / out_len;
                                for (c, row) in y_blk.chunks_exact_mut(out_len).enumerate() {
                                    for (l, v) in row[..m].iter_mut().enumerate() {
                                        *v = out[l * n + c];
                                    }
                                }
                            },
                        )
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
                    crate::par::for_each_chunk_mut_2d(y, item, block * out_len, run);
                }
            }
            RowsOut::Fused(sink) => {
                let run = |task: usize| {
                    let (item_block, group) = (task / groups, task % groups);
                    let (b, c0) = (item_block / blocks, (item_block % blocks) * block);
                    let first = group * tiles_per_task;
                    let range = first..(first + tiles_per_task).min(tiles);
                    with_buffers(&mut |win, out, taps, tmp| {
                        self.tiles(
                            g,
                            b,
                            c0,
                            block,
                            range.clone(),
                            tile,
                            x,
                            w,
                            bias,
                            win,
                            out,
                            taps,
                            tmp,
                            |l0, m, out, tmp| {
                                let n = out.len() / m;
                                for (l, col) in out.chunks_exact(n).enumerate() {
                                    sink.store_col(b * channels + c0, l0 + l, col, tmp);
                                }
                            },
                        )
                    })
                };
                let tasks = p.batch * blocks * groups;
                if serial {
                    (0..tasks).for_each(run);
                } else {
                    crate::par::for_each(tasks, run);
                }
            }
        }
    }

    /// Tiles `tiles` (of `tile` outputs each) of the block of channels
    /// `c0 ..` (`block` of them, at most the rest) of batch
    /// item `b`: reads each tile's input window into `win`, computes it into
    /// `out` and hands it to `emit(l0, m, out, tmp)` (outputs `l0 .. l0 + m`,
    /// time-major; `tmp` free again by then). `w` are the call's weights;
    /// where they are fed, the block's taps are transposed from them into
    /// `taps_buf` (`K * block` floats) first.
    #[allow(clippy::too_many_arguments)]
    fn tiles(
        &self,
        g: &Conv1dGeometry,
        b: usize,
        c0: usize,
        block: usize,
        tiles: std::ops::Range<usize>,
        tile: usize,
        x: RowsIn,
        w: &[f32],
        bias: Option<&[f32]>,
        win: &mut [f32],
        out: &mut [f32],
        taps_buf: &mut [f32],
        tmp: &mut [f32],
        mut emit: impl FnMut(usize, usize, &[f32], &mut [f32]),
    ) {
        let p = &g.params;
        let (channels, in_len, k) = (p.in_channels, p.in_len, p.kernel_size);
        let n = block.min(channels - c0);
        let row0 = b * channels + c0;
        let span = span(g);
        let (taps, tap_stride): (&[f32], usize) = match &self.taps {
            ColumnTaps::Prepared(taps_t) => (&taps_t[c0..], channels),
            ColumnTaps::PerCall => {
                let taps_buf = &mut taps_buf[..k * n];
                for (c, filter) in w[c0 * k..][..n * k].chunks_exact(k).enumerate() {
                    for (j, &v) in filter.iter().enumerate() {
                        taps_buf[j * n + c] = v;
                    }
                }
                (taps_buf, n)
            }
        };
        // Window column `i` of the tile at `l0` is input `l0 + i - pad_left`.
        let fill = |win: &mut [f32], l0: usize, cols: std::ops::Range<usize>, tmp: &mut [f32]| {
            for i in cols {
                let col = &mut win[i * n..][..n];
                let at = (l0 + i).wrapping_sub(p.pad_left);
                if at >= in_len {
                    col.fill(0.0);
                    continue;
                }
                match x {
                    RowsIn::Slice(x) => {
                        let rows = x[row0 * in_len..].chunks_exact(in_len);
                        for (v, row) in col.iter_mut().zip(rows) {
                            *v = row[at];
                        }
                    }
                    RowsIn::Fused(source) => source.fill_col(row0, at, col, tmp),
                }
            }
        };
        let first = tiles.start;
        for t in tiles {
            let l0 = t * tile;
            let m = tile.min(g.out_len - l0);
            if t == first {
                fill(win, l0, 0..m + span, tmp);
            } else {
                // The previous (full) tile's last `span` columns are this
                // one's first.
                win.copy_within(tile * n..(tile + span) * n, 0);
                fill(win, l0, span..m + span, tmp);
            }
            let tile_args = Tile {
                n,
                m,
                dilation: p.dilation,
                taps,
                tap_stride,
                bias: bias.map(|b| &b[c0..c0 + n]),
                win: &win[..(m + span) * n],
            };
            self.kernel.run(&tile_args, out);
            emit(l0, m, &out[..m * n], tmp);
        }
    }
}
