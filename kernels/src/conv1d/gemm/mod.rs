//! Dense and grouped conv1d as GEMM, reading the weights where the model
//! holds them, on our own register-blocked micro-kernels and the caller's
//! per-thread scratch.
//!
//! Per group `g` the convolution is a matrix product with an implicit
//! im2col right-hand side:
//!
//! ```text
//! Y_g[o, l] = bias[o] + Σ_c Σ_k W[o, c, k] · X_g[c, l·stride + k·dilation − pad_left]
//! ```
//!
//! The inner dimension runs over (input channel, tap) pairs. The im2col
//! matrix is never built: each tile copies the input *window* its outputs
//! read into its thread's scratch slot, with padding as zeros and, for
//! stride > 1, split into `stride` phases so that every tap reads a
//! unit-stride row; a micro-kernel then computes `MR` output channels by
//! `NR` vectors of output positions in registers, loading each window
//! vector once for `MR` broadcast weights (`kernel.rs` has the details;
//! it is the design of XNNPACK's convolution micro-kernels). The weights
//! are read in place, `[out_channel][in_channel][tap]`: the `MR` filters of
//! a block's rows are streamed side by side, one broadcast per row and
//! (channel, tap), in the order they are stored. Packing them into panels
//! at prepare, as XNNPACK does, measured no faster (`calibrate_gemm`, both
//! builds interleaved: within 3% either way on every shape below) and kept
//! a copy of every layer's weights beside the blob's while the delegate
//! prepared. The instruction set (AVX-512, AVX2 + FMA, NEON or portable Rust)
//! is the crate's SIMD layer (`crate::simd`), detected once at prepare,
//! and with it the block: `MR × NR` vectors of 8 × 3 on AVX-512 and NEON,
//! 6 × 2 on AVX2, 4 × 1 portable, or a narrow one (4 × 6, 2 × 5 on AVX2,
//! 2 × 2 portable) where its panels take fewer steps, padding rows
//! included (groups with few outputs; `kernel::choose_block`).
//!
//! # Work split
//!
//! The output is cut into tiles of (batch item, group, block of output
//! channels, chunk of output positions); rayon runs the tiles on the
//! *current* pool, each on its thread's scratch slot ([`Scratch`]). The
//! tiling depends only on the shape, never on the pool size, and every
//! output sums its terms in the same order whatever the tile, so results
//! are identical for any number of threads.
//!
//! # No allocation
//!
//! `run` allocates nothing: the window lives in the scratch slot, sized at
//! prepare ([`GemmConv::scratch_per_thread`]: per input channel, a row of
//! `pitch` floats for each phase some tap reads, the pitch being the
//! longest chunk plus the filter's reach in phase rows, and in windows of
//! up to 512 rows the channels an odd number of cache lines apart: see
//! `kernel.rs`'s `channel_stride`), and chunks shorter than one block go
//! through a stack buffer. This replaced the `gemm` crate (0.19), which
//! allocated inside every call (a flag vector, packed copies of strided or
//! ragged operands, and a thread-local slab on each thread's first call);
//! neither it nor `matrixmultiply` takes a caller's workspace.
//!
//! # Measured
//!
//! GFLOP/s (2 per multiply-add) of whole calls, batch 1, N = 4096, "same"
//! padding, bias, release build, best of several runs on the 2-core
//! AVX-512 AMD EPYC (Zen 5) VM this was developed on (shared with other
//! builds, so the 2-thread column is noisy), with `calibrate_gemm` in
//! `tests.rs`; 1 and 2 threads, these kernels then the gemm crate 0.19
//! they replaced (with its AVX-512 kernels):
//!
//! | shape                        | 1 thread     | 2 threads    |
//! |------------------------------|--------------|--------------|
//! | 256→256, K=3                 | 220 vs 223   | 422 vs 219   |
//! | 64→64, K=3                   | 209 vs 189   | 360 vs 347   |
//! | 64→64, K=7                   | 227 vs 193   | 425 vs 369   |
//! | 512 channels, 8 groups, K=3  | 195 vs 172   | 383 vs 306   |
//! | 4→4, K=3                     | 109 vs 35    | 107 vs 49    |
//! | 64→64, K=3, stride 2         | 177 vs 166   | 324 vs 303   |
//! | 64→64, K=3, dilation 2       | 211 vs 191   | 375 vs 348   |
//!
//! At stride 2 the window copy gathers every other sample; with the stride
//! a compile-time constant (2 to 5) that loop vectorises, which took the
//! stride-2 row from 105 to 177 GFLOP/s. 4→4 (one 4-row panel) takes the
//! 4 × 6 block. The 4→4 shape is too small (0.4 MFLOP, a few tiles of
//! [`MIN_TILE_MACS`]) to gain from a second thread.
//!
//! wav2vec2's feature encoder (1 s of 16 kHz audio: 1→512 K=10 stride 5,
//! then 512→512 K=3 and K=2 at stride 2, outputs 3199 down to 49), one
//! thread's CPU time (best of 30 calls, `CLOCK_THREAD_CPUTIME_ID`, so the
//! other jobs of the shared 2-core Xeon (Emerald Rapids, AVX-512, 179
//! GFLOP/s FMA peak per core) this was measured on cost little), GFLOP/s:
//! rows that start on 64-byte boundaries and ragged ends in 1- and
//! 2-vector blocks took the K=3 layers from 134/133/124/112 to
//! 149/146/139/126 (outputs 1599/799/399/199) and the last one (49
//! outputs) from 58 to 67; the whole stack stored 38.8 → 34.9 ms. Blocks of
//! 12 × 2, 6 × 4, 7 × 4, 14 × 2 and 5 × 5 vectors ran within 2% of 8 × 3;
//! a row per tap (every load aligned, but `K / stride` times the window),
//! and cutting the reduction into L1-sized slices of channels, ran no
//! faster.

#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod kernel;

use super::algorithm::{ConvAlgorithm, Entry, NotFusable};
use super::cost::direct_macs;
use super::params::Conv1dGeometry;
use std::ops::Range;

use crate::fused::{block_tmp, RowSink, RowsIn, RowsOut, ROW_BLOCK};
use crate::scratch::Scratch;
use crate::simd::{Backend, Isa};
use kernel::{
    choose_block, source_buf, Block, TileArgs, TileInput, TileKernel, TileWindow, Window,
};

/// How many times faster than [`super::cost::DIRECT_MACS_PER_SEC`] one core runs the
/// micro-kernels when both matrix dimensions (`in_per_group`,
/// `out_per_group`) are large (see [`cost`]).
pub(crate) const SPEEDUP_OVER_DIRECT: f64 = 12.0;
/// Extra time per multiply-add, relative to the large-matrix rate, for each
/// `1 / in_per_group`: short inner products spend relatively more on the
/// window copy and the output stores. Small, because the window is copied
/// once per tile and every block reads it for all its rows.
const SHORT_INNER: f64 = 1.0;
/// Extra time per multiply-add for each `1 / out_per_group`: a group with
/// fewer output channels than a block has rows computes padding rows
/// (one output channel fills a quarter of the narrow block).
const FEW_OUTPUTS: f64 = 6.0;
/// Fixed seconds per tile (task, window set-up): measured about 0.2 µs for
/// whole one-tile calls.
const SECONDS_PER_TILE: f64 = 0.2e-6;

/// Longest chunk of output positions one tile covers (rounded up to a
/// multiple of the block): long enough to amortise the window's halo and
/// the weight panels' trip through L1, short enough that the window stays
/// in L2.
const CHUNK_MAX: usize = 512;
/// Floats of window a tile aims to stay under (512 KiB, half of L2 on the
/// machine measured); wide groups get shorter chunks.
const WINDOW_FLOATS: usize = 1 << 17;
/// Floats of shared windows a conv may keep (4 MiB): where a call splits
/// its chunks into blocks of rows, each chunk's window is filled once into
/// the scratch's shared region and read by its tiles, instead of by every
/// tile into its own slot (unless they fill their own:
/// [`Tiling::fills_own_windows`]). A redundant fill costs about as much as
/// the multiply-adds of a tile of 32 rows at K = 2, stride 2 (wav2vec2's
/// last layers: 91 and 67 GFLOP/s against 124 and 96 with one fill per
/// chunk). Shapes needing more (long outputs split into two or three
/// blocks of rows, where a fill is a few % of a tile) fill per tile.
const SHARED_WINDOW_FLOATS: usize = 1 << 20;
/// Multiply-adds per float of its window (`rows × K`) from which a tile
/// of a unit-stride conv on a pool of [`OWN_WINDOW_THREADS`] or more fills
/// its own window rather than share its chunk's. A shared window costs a
/// pass of its own before the tiles (one more wait for the whole pool)
/// and is read from other cores' caches, which a wide pool pays more for;
/// a unit-stride fill is a copy of whole rows, a few per cent of 64 rows'
/// multiply-adds at K = 3, but a prologue is computed again with it.
/// Measured on the 16-core Xeon, 2026-11-29, both ways in turn
/// (`calibrate_vocoder`, stored inputs): 128 channels over 800 outputs (64
/// rows a tile, K = 3 to 11) ran 1.27x as fast with their own windows on 4
/// threads and 1.24x on 16; 256 channels over 200 (about 32 rows) 1.10x
/// and 1.18x. SpeechT5's HiFi-GAN (a LeakyReLU prologue before most
/// convs) ran 44.8 -> 42.2 ms median at 4 threads, 32.7 -> 31.5 at 8 and
/// 20.4 -> 19.9 at 16 (faster in 5, 4 and 4 of 6 rounds); on the 2-core
/// Zen 3 VM at 2 threads, filling their own windows ran it 8% slower (136
/// -> 147 ms median, faster in 3 of 10 rounds), hence the pool size.
/// Strided windows are gathers into phases and always shared: wav2vec2's
/// 512-channel stride-2 layers ran 0.64-0.93x as fast filling their own
/// even at 256 rows a tile (`calibrate_speech`).
const SHARED_FILL_MACS: usize = 128;
/// Fewest threads a pool has for tiles to fill their own windows (see
/// [`SHARED_FILL_MACS`]).
const OWN_WINDOW_THREADS: usize = 4;
/// Input channels per task when a shared window is filled.
const FILL_CHANNELS: usize = 64;
/// Shortest chunk the tiling makes in order to find parallelism.
const CHUNK_MIN: usize = 64;
/// Fewest output channels in a tile when channel blocks are split for
/// parallelism. 32 stopped 128-channel convs of a few hundred outputs (a
/// HiFi-GAN's first residual stage) at 8 tiles; at 16 they reach
/// [`MIN_TILES`], which took them from 307-545 to 442-802 GFLOP/s on 16
/// threads of the device machine (`calibrate_vocoder`, 2026-11-28).
const ROWS_MIN: usize = 16;
/// Tiles the split aims for at least, so that a pool can balance its
/// threads. A constant rather than the pool size, so the tiling (and with
/// it the summation order) does not depend on the number of threads.
const MIN_TILES: usize = 16;
/// Multiply-adds of a chunk's tile below which its output channels stay in
/// one block where the chunks already give half of [`MIN_TILES`] (see
/// [`Tiling::new`]): 8 Mi, about 80 µs on one core, where the shared
/// windows' fill pass is a few per cent of the tile.
const SPLIT_MIN_MACS: usize = 1 << 23;
/// Multiply-adds below which a tile is not worth its task: small
/// convolutions get fewer tiles than [`MIN_TILES`].
const MIN_TILE_MACS: usize = 1 << 16;

/// Whether this algorithm computes `g`: every convolution except depthwise
/// with channel multiplier 1 (`groups == in_channels == out_channels`),
/// which is a product of `1 × 1` matrices.
pub(crate) fn applies(g: &Conv1dGeometry) -> bool {
    let p = &g.params;
    !(p.groups == p.in_channels && p.out_channels == p.in_channels)
}

/// Estimated single-thread seconds (see `cost.rs`).
///
/// The multiply-adds run at [`SPEEDUP_OVER_DIRECT`] times the direct
/// loop's rate, slowed by the factor
/// `1 + SHORT_INNER / in_per_group + FEW_OUTPUTS / out_per_group`; memory
/// traffic is the compulsory bytes (a tile's window and output stay in
/// cache); the larger of the two wins, as everywhere in `cost.rs`, and each
/// tile adds [`SECONDS_PER_TILE`].
///
/// Calibrated with `calibrate_gemm_sweep` (in `tests.rs`) in release on one
/// core of the 2-core AVX-512 AMD EPYC (Zen 5) this was developed on,
/// shared with other builds: dense, K=3, N=2048, `in_per_group` and
/// `out_per_group` each over 1, 2, 4, ..., 64, 256. The micro-kernels ran
/// 210–235 GFLOP/s from 16 inputs and 32 outputs up, 145–180 at 8 outputs,
/// 110–125 at 4, 30–35 at one output channel, and 67–85 with one input
/// channel; the direct loop ran 20–24 GFLOP/s throughout. A least-squares
/// fit of the time ratio (log scale) gave the constants above, within
/// 1.3× on every point but `in_per_group = 1` with 256 outputs, where the
/// model is optimistic by 1.7×. The direct loop's own model ignores its
/// per-call overhead (tiny shapes: 0.3–150 µs where these kernels take
/// 0.2–11) and that it runs 4× slower at stride 2, so the model prefers
/// the direct loop a little more often than measurement would.
pub(crate) fn cost(g: &Conv1dGeometry, backend: Backend) -> f64 {
    use super::cost::{compulsory_bytes, roofline, DIRECT_MACS_PER_SEC};
    let p = &g.params;
    let slowdown = 1.0 + SHORT_INNER / g.in_per_group as f64 + FEW_OUTPUTS / g.out_per_group as f64;
    let rate = DIRECT_MACS_PER_SEC * SPEEDUP_OVER_DIRECT / slowdown;
    let tiling = Tiling::new(g, choose_block(backend, g.out_per_group));
    let tiles = (p.batch * p.groups * tiling.row_blocks * tiling.chunks) as f64;
    roofline(direct_macs(g), rate, compulsory_bytes(g)) + tiles * SECONDS_PER_TILE
}

/// The tile kernel and window layout, chosen at prepare; the geometry and
/// the weights come with every call.
pub(crate) struct GemmConv {
    kernel: TileKernel,
    /// The window layout for chunks up to the prepared shape's longest.
    window: Window,
    /// Input channels per group.
    cin: usize,
    /// Floats of the scratch's shared region a call may fill its windows
    /// into, one per chunk, where its chunks are split into blocks of rows
    /// ([`SHARED_WINDOW_FLOATS`]); 0 where the prepared shape's are not.
    shared_windows: usize,
}

impl GemmConv {
    /// The kernel on `isa`. Nothing here depends on the batch; the input
    /// length bounds the window.
    pub(crate) fn new(g: &Conv1dGeometry, isa: Isa) -> Self {
        Self::with_block(g, isa, choose_block(isa.backend(), g.out_per_group))
    }

    /// [`Self::new`] on `block`, one of [`kernel::blocks`]'s for `isa`
    /// (the tests' and calibration's choice).
    pub(crate) fn with_block(g: &Conv1dGeometry, isa: Isa, block: Block) -> Self {
        let p = &g.params;
        let kernel = TileKernel::new(isa, block);
        // Chunks never exceed the output length nor the cap plus the ragged
        // end a last chunk takes in (Tiling::new), and calls have at most
        // the prepared length.
        let max_chunk = max_chunk(g, block);
        let window = Window::new(
            g.in_per_group,
            p.kernel_size,
            p.stride,
            p.dilation,
            max_chunk,
            block.cols(),
        );
        let mut conv = GemmConv {
            kernel,
            window,
            cin: g.in_per_group,
            shared_windows: 0,
        };
        let need = conv.shared_need(g, &Tiling::new(g, block));
        if need <= SHARED_WINDOW_FLOATS {
            conv.shared_windows = need;
        }
        conv
    }

    /// The window of one tile: `in_per_group × phases × pitch` floats.
    pub(crate) fn scratch_per_thread(&self) -> usize {
        self.cin * self.window.channel_stride()
    }

    /// Floats of the scratch's shared region a call needs (see
    /// [`Scratch::with_shared`]): the windows of the prepared shape's
    /// chunks, where they are split into blocks of rows.
    pub(crate) fn shared_scratch(&self) -> usize {
        self.shared_windows
    }

    /// Floats of shared windows a call of `g` tiled by `tiling` fills: one
    /// window per (batch item, group, chunk), where the chunks are split
    /// into blocks of rows (every tile would fill the same window
    /// otherwise); 0 where they are not.
    fn shared_need(&self, g: &Conv1dGeometry, tiling: &Tiling) -> usize {
        if tiling.row_blocks > 1 {
            g.params.batch * g.params.groups * tiling.chunks * self.scratch_per_thread()
        } else {
            0
        }
    }

    /// Computes `y = conv1d(x, w) + bias` for `g`, whose static parameters
    /// are those this was prepared with (batch and input length may be
    /// smaller), `w` being `[out_channels, in_per_group, kernel_size]`. The
    /// caller has checked every slice length, and `scratch` has
    /// [`GemmConv::scratch_per_thread`] floats per thread of the pool (and
    /// a shared region of [`GemmConv::shared_scratch`], or the windows are
    /// filled per tile).
    pub(crate) fn run(
        &self,
        g: &Conv1dGeometry,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        y: &mut [f32],
        scratch: &Scratch,
    ) {
        debug_assert_eq!(y.len(), g.output_elems);
        debug_assert_eq!(x.len(), g.input_elems);
        let dest = Dest::Stored(OutPtr(y.as_mut_ptr()));
        self.run_tiles(g, RowsIn::Slice(x), w, bias, dest, scratch);
    }

    /// f32 elements of per-thread scratch [`Self::run_rows`] needs: the
    /// window, room to compute a prologue's input for it
    /// ([`kernel::source_buf`]), the largest tile (an epilogue that stores
    /// across rows takes whole tiles; others a panel at a time, which fits
    /// in it), and the sink's temporaries for a block of rows.
    pub(crate) fn rows_scratch(&self, g: &Conv1dGeometry, x_temps: usize, y_temps: usize) -> usize {
        let block = self.kernel.block();
        let chunk = max_chunk(g, block);
        self.scratch_per_thread()
            + source_buf(&self.window, x_temps)
            + g.out_per_group.next_multiple_of(block.mr) * chunk
            + block_tmp(y_temps, chunk)
    }

    /// [`Self::run`] with the input computed by a prologue and / or the
    /// output handed to an epilogue, both while in cache:
    ///
    /// * a prologue's values go straight into each window, a block of
    ///   input channels at a time (never stored whole). Where a chunk's
    ///   window is shared by its tiles, it is computed once; where it
    ///   would not fit the shared region, the chunks are not split into
    ///   blocks of rows, so that no tile computes another's window again;
    /// * an epilogue gets each panel of a tile's rows as soon as it is
    ///   computed, or, where it stores across rows (a transposed result,
    ///   or rows too short for a program walk each:
    ///   [`RowSink::stores_across`]), each tile in blocks of up to
    ///   [`ROW_BLOCK`] rows.
    ///
    /// `scratch` has [`Self::rows_scratch`] floats per thread.
    pub(crate) fn run_rows(
        &self,
        g: &Conv1dGeometry,
        x: RowsIn<'_>,
        w: &[f32],
        bias: Option<&[f32]>,
        y: RowsOut<'_>,
        scratch: &Scratch,
    ) {
        match y {
            RowsOut::Slice(y) => {
                debug_assert_eq!(y.len(), g.output_elems);
                let dest = Dest::Stored(OutPtr(y.as_mut_ptr()));
                self.run_tiles(g, x, w, bias, dest, scratch)
            }
            RowsOut::Fused(sink) => self.run_tiles(g, x, w, bias, Dest::Sink(sink), scratch),
        }
    }

    fn run_tiles(
        &self,
        g: &Conv1dGeometry,
        x: RowsIn<'_>,
        w: &[f32],
        bias: Option<&[f32]>,
        dest: Dest<'_>,
        scratch: &Scratch,
    ) {
        let p = &g.params;
        debug_assert!(bias.is_none_or(|b| b.len() == p.out_channels));
        let (cin, cout) = (g.in_per_group, g.out_per_group);
        assert_eq!(cin, self.cin, "prepared for another shape");
        debug_assert_eq!(w.len(), g.weight_elems);
        let block = self.kernel.block();
        let filter_len = cin * p.kernel_size;

        let mut tiling = Tiling::new(g, block);
        let need = self.shared_need(g, &tiling);
        let own = tiling.fills_own_windows(g, crate::par::threads());
        let shared = !own && need > 0 && need <= self.shared_windows.min(scratch.shared_len());
        if need > 0 && !shared && !own && matches!(x, RowsIn::Fused(_)) {
            tiling = tiling.whole_rows(g);
        }
        let per_item = p.groups * tiling.row_blocks * tiling.chunks;
        let tiles = p.batch * per_item;
        let window_len = self.scratch_per_thread();
        let source_len = match x {
            RowsIn::Slice(_) => 0,
            RowsIn::Fused(_) => source_buf(&self.window, x.temporaries()),
        };
        // The tile args of (batch item, group, rows, columns).
        let args = |b: usize, group: usize, rows: Range<usize>, cols: Range<usize>| {
            let o0 = group * cout + rows.start;
            TileArgs {
                x: match x {
                    RowsIn::Slice(x) => TileInput::Rows(
                        &x[(b * p.in_channels + group * cin) * p.in_len..][..cin * p.in_len],
                    ),
                    RowsIn::Fused(source) => TileInput::Source {
                        source,
                        row0: b * p.in_channels + group * cin,
                    },
                },
                in_len: p.in_len,
                pad_left: p.pad_left,
                cin,
                window: &self.window,
                // rows.start is a multiple of MR (Tiling::new).
                weights: &w[o0 * filter_len..][..rows.len() * filter_len],
                bias: bias.map(|bias| &bias[o0..o0 + rows.len()]),
                rows: rows.len(),
                l0: cols.start,
                n: cols.len(),
                y: std::ptr::null_mut(),
                y_stride: 0,
                reuse: false,
            }
        };
        // One tile (batch item b, group, block of rows, chunk), its window
        // filled into the thread's slot or read from `windows`.
        let tile = |t: usize, windows: Option<&[f32]>| {
            let (b, rest) = (t / per_item, t % per_item);
            let per_group = tiling.row_blocks * tiling.chunks;
            let (group, rest) = (rest / per_group, rest % per_group);
            let (row_block, chunk) = (rest / tiling.chunks, rest % tiling.chunks);
            let rows = row_block * tiling.rows..((row_block + 1) * tiling.rows).min(cout);
            let cols = tiling.cols(chunk, g.out_len);
            let o0 = group * cout + rows.start;
            let mut args = args(b, group, rows.clone(), cols.clone());
            let shared_window = windows.map(|windows| {
                let i = (b * p.groups + group) * tiling.chunks + chunk;
                &windows[i * window_len..][..window_len]
            });
            scratch.with_slot(|slot| {
                let (own, rest) = match shared_window {
                    Some(_) => slot.split_at_mut(0),
                    None => slot.split_at_mut(window_len + source_len),
                };
                let window = match shared_window {
                    Some(window) => TileWindow::Filled(window),
                    None => {
                        let (window, buf) = own.split_at_mut(window_len);
                        TileWindow::Fill { window, buf }
                    }
                };
                match dest {
                    Dest::Stored(out) => {
                        args.y = out.at((b * p.out_channels + o0) * g.out_len + cols.start);
                        args.y_stride = g.out_len;
                        // SAFETY: `args.y` addresses rows `rows` of group
                        // `group`, batch item `b`, columns `cols`, all
                        // inside `y`, which outlives the loop; tiles
                        // partition the output (distinct (b, group, rows,
                        // cols) cover disjoint elements), so no other task
                        // touches them.
                        unsafe { self.kernel.tile(&args, window, None) }
                    }
                    Dest::Sink(sink) => {
                        let n = cols.len();
                        let row0 = b * p.out_channels + o0;
                        let across = sink.stores_across(row0, rows.len(), n);
                        let tile_rows = if across { rows.len() } else { block.mr };
                        let (tile, tmp) = rest.split_at_mut(tile_rows * n);
                        args.y = tile.as_mut_ptr();
                        args.y_stride = n;
                        args.reuse = !across;
                        if across {
                            // SAFETY: `args.y` addresses `rows × n` floats
                            // of this thread's own scratch slot (`tile`),
                            // borrowed mutably here and nowhere else.
                            unsafe { self.kernel.tile(&args, window, None) }
                            for r in (0..rows.len()).step_by(ROW_BLOCK) {
                                let m = ROW_BLOCK.min(rows.len() - r);
                                let values = &mut tile[r * n..][..m * n];
                                sink.store_rows(row0 + r, m, cols.start, n, values, tmp);
                            }
                        } else {
                            // The panel's rows are `n` apart (`y_stride`):
                            // one block, finished by the sink.
                            let mut done = |r: usize, m: usize, values: &mut [f32]| {
                                sink.store_rows(row0 + r, m, cols.start, n, values, tmp);
                            };
                            // SAFETY: `args.y` addresses `MR × n` floats of
                            // this thread's own scratch slot (`tile`),
                            // borrowed mutably here and nowhere else; each
                            // panel is handed to `done` before the next
                            // overwrites it.
                            unsafe { self.kernel.tile(&args, window, Some(&mut done)) }
                        }
                    }
                }
            });
        };
        if !shared {
            crate::par::for_each(tiles, |t| tile(t, None));
            return;
        }
        // Each chunk's window once, in blocks of channels, then its tiles.
        scratch.with_shared(|region| {
            let windows = &mut region[..need];
            let cs = self.window.channel_stride();
            crate::par::for_each_chunk_mut_2d(
                windows,
                window_len,
                FILL_CHANNELS * cs,
                |i, k, out| {
                    let (item, chunk) = (i / tiling.chunks, i % tiling.chunks);
                    let (b, group) = (item / p.groups, item % p.groups);
                    let cols = tiling.cols(chunk, g.out_len);
                    let args = args(b, group, 0..0, cols);
                    let c0 = k * FILL_CHANNELS;
                    let channels = c0..(c0 + FILL_CHANNELS).min(cin);
                    scratch.with_slot(|buf| self.kernel.fill(&args, channels, out, buf));
                },
            );
            let windows = &*windows;
            crate::par::for_each(tiles, |t| tile(t, Some(windows)));
        });
    }
}

/// Where tiles go: the output tensor, or an epilogue.
#[derive(Clone, Copy)]
enum Dest<'a> {
    Stored(OutPtr),
    Sink(&'a dyn RowSink),
}

/// The output pointer, shared by the tile tasks (each writes only its own tile).
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements through it (see `GemmConv::run`).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The element `offset` past the start (not dereferenced here).
    fn at(self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}

/// Longest chunk for `g` with `block`: [`CHUNK_MAX`], or fewer positions
/// where the window (`in_per_group × stride` floats per position) would
/// pass [`WINDOW_FLOATS`]; a multiple of the block, at least one block.
fn chunk_cap(g: &Conv1dGeometry, block: Block) -> usize {
    let cols = block.cols();
    let per_position = (g.in_per_group * g.params.stride).max(1);
    let by_window = WINDOW_FLOATS / per_position / cols * cols;
    by_window.clamp(cols, CHUNK_MAX.next_multiple_of(cols))
}

/// Longest chunk any call up to `g`'s shape makes: [`chunk_cap`] plus
/// the ragged end a last chunk takes in ([`Tiling::new`]), at most the
/// output length.
fn max_chunk(g: &Conv1dGeometry, block: Block) -> usize {
    (chunk_cap(g, block) + block.cols() - 1).min(g.out_len)
}

/// How the output of one (batch item, group) is cut into tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tiling {
    /// Output positions per chunk; the last chunk may be shorter, or up to
    /// a block longer (it takes in a ragged end).
    chunk: usize,
    /// Chunks per output row.
    chunks: usize,
    /// Output channels per block (the last block may be smaller).
    rows: usize,
    /// Blocks per group.
    row_blocks: usize,
}

impl Tiling {
    /// Chunks of at most [`chunk_cap`] positions; where that gives fewer
    /// than [`MIN_TILES`] tiles (or fewer than the work allows, at
    /// [`MIN_TILE_MACS`] per tile), narrower chunks (down to [`CHUNK_MIN`])
    /// and then blocks of output channels (down to [`ROWS_MIN`], a multiple
    /// of `block.mr`), except where the chunks give half the target or more
    /// and their tiles are small ([`SPLIT_MIN_MACS`]): a split adds a pass
    /// filling the chunks' shared windows, which then costs more than it
    /// balances (32 channels, 3200 outputs: 14 chunks, 2 blocks of 16 rows
    /// ran 630 -> 356 GFLOP/s at `K` = 3 on 16 threads). Where there are several
    /// chunks, they are multiples of the block, and a last chunk shorter
    /// than one block joins the one before it (a ragged end costs a tile its
    /// narrow blocks, not a tile of its own whose one block is mostly
    /// padding).
    fn new(g: &Conv1dGeometry, block: Block) -> Self {
        let p = &g.params;
        let cols = block.cols();
        let target = MIN_TILES.min((direct_macs(g) as usize / MIN_TILE_MACS).max(1));
        let outer = (p.batch * p.groups).max(1);
        let want_chunks = target.div_ceil(outer);
        let chunks = g
            .out_len
            .div_ceil(chunk_cap(g, block))
            .max(want_chunks.min(g.out_len / CHUNK_MIN))
            .max(1);
        let mut chunk = g.out_len.div_ceil(chunks);
        if chunks > 1 {
            chunk = chunk.next_multiple_of(cols).min(g.out_len);
        }
        let mut chunks = g.out_len.div_ceil(chunk);
        if chunks > 1 && g.out_len - (chunks - 1) * chunk < cols {
            chunks -= 1;
        }

        let tile_macs = direct_macs(g) as usize / (outer * chunks);
        let want_blocks = if 2 * outer * chunks > target && tile_macs < SPLIT_MIN_MACS {
            1
        } else {
            target.div_ceil(outer * chunks)
        };
        let blocks = want_blocks.min(g.out_per_group / ROWS_MIN).max(1);
        let mut rows = g.out_per_group.div_ceil(blocks);
        if blocks > 1 {
            rows = rows.next_multiple_of(block.mr).min(g.out_per_group);
        }
        Tiling {
            chunk,
            chunks,
            rows,
            row_blocks: g.out_per_group.div_ceil(rows),
        }
    }

    /// Whether the tiles of a chunk split into blocks of rows each fill
    /// their own window on a pool of `threads` rather than share one:
    /// unit stride, at least [`SHARED_FILL_MACS`] multiply-adds per float
    /// of window, and at least [`OWN_WINDOW_THREADS`] threads.
    fn fills_own_windows(&self, g: &Conv1dGeometry, threads: usize) -> bool {
        let p = &g.params;
        self.row_blocks > 1
            && p.stride == 1
            && self.rows * p.kernel_size >= SHARED_FILL_MACS
            && threads >= OWN_WINDOW_THREADS
    }

    /// This tiling with every chunk's rows in one block (for a prologue
    /// whose windows cannot be shared: each is then computed once).
    fn whole_rows(self, g: &Conv1dGeometry) -> Self {
        Tiling {
            rows: g.out_per_group,
            row_blocks: 1,
            ..self
        }
    }

    /// The output positions of chunk `c` of a row of `out_len`.
    fn cols(&self, c: usize, out_len: usize) -> std::ops::Range<usize> {
        let end = if c + 1 == self.chunks {
            out_len
        } else {
            (c + 1) * self.chunk
        };
        c * self.chunk..end
    }
}

/// The registration: every convolution but depthwise with multiplier 1;
/// the weights, fed or constant, are read in place.
pub(super) const ENTRY: Entry = Entry {
    name: "gemm",
    applies: |g, _| applies(g),
    cost,
    serial: super::cost::SERIAL,
    takes_fed_weights: true,
    prepare: |g, _, isa| Some(Box::new(GemmConv::new(g, isa))),
};

/// Fuses a prologue into its windows and an epilogue into its tiles'
/// stores.
impl ConvAlgorithm for GemmConv {
    fn scratch_per_thread(&self) -> usize {
        GemmConv::scratch_per_thread(self)
    }

    fn shared_scratch(&self, _max: &Conv1dGeometry) -> usize {
        GemmConv::shared_scratch(self)
    }

    fn prepared_bytes(&self) -> usize {
        0
    }

    fn fuses_input(&self) -> bool {
        true
    }

    fn fuses_output(&self) -> bool {
        true
    }

    fn rows_scratch(&self, max: &Conv1dGeometry, x_temps: usize, y_temps: usize) -> usize {
        GemmConv::rows_scratch(self, max, x_temps, y_temps)
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
        GemmConv::run(self, g, x, w, bias, y, scratch);
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
        GemmConv::run_rows(self, g, x, w, bias, y, scratch);
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests;
