//! The GEMM conv's tile loop and register-blocked micro-kernels, generic
//! over the crate's SIMD layer ([`Simd`]); the only unsafe code of the
//! GEMM conv.
//!
//! A tile (one group's block of output channels over a chunk of output
//! positions) runs in two steps, both on the calling thread's scratch slot:
//!
//! 1. **Window.** The input the chunk reads is copied into the slot, one
//!    row per input channel and *phase*, with padding written as zeros.
//!    Output `l` reads padded position `l·stride + k·dilation` at tap `k`,
//!    which is `(l + o_k)·stride + r_k` with `o_k = (k·dilation) / stride`
//!    and `r_k = (k·dilation) % stride`; phase row `r` holds the padded
//!    positions `(l0 + q)·stride + r` for `q = 0, 1, ...`, so tap `k` of
//!    outputs `l0 + j ..` reads phase row `r_k` from `j + o_k` on, at unit
//!    stride, whatever the convolution's stride. Only the phases some tap
//!    reads have a row. The row offsets are fixed at prepare ([`Window`]);
//!    rows start on 64-byte boundaries, so the taps with `o_k = 0` load
//!    whole cache lines (7-9% faster at stride 2 than rows packed end to
//!    end).
//! 2. **Micro-kernels.** For each block of `MR` output channels (their
//!    filters read in place, `[in_channel][tap]` each, side by side; rows
//!    past the tile's last output channel repeat its filter), and each
//!    block of `NR` vectors of output positions, the `MR × NR` accumulators
//!    start at the bias and take, for every input channel and tap in
//!    ascending order, `NR` unit-stride loads from the window shared by `MR`
//!    weight broadcasts: `MR · NR` multiply-adds per `NR + MR` loads. Rows
//!    past the tile's end are computed but not stored. The columns a chunk
//!    has beyond its whole blocks take blocks of 2 vectors, then one of 1
//!    or 2 vectors that ends at the chunk's last output (recomputing a few
//!    outputs with the same values), so a ragged end computes at most a
//!    vector's worth of extra columns; a chunk shorter than that last block
//!    is computed into a stack buffer and copied. Each panel of `MR` rows
//!    can be handed on as soon as its columns are done
//!    ([`TileKernel::tile`]'s `done`), while it is in L1.
//!
//! Every output is its bias plus one multiply-add per (input channel, tap),
//! channels outer, taps inner, fused on the SIMD backends: the same order
//! in every block, so results depend neither on the tiling nor on the
//! number of threads. Taps that read padding add `w · 0` (as an explicitly
//! padded convolution does; the same as skipping them for finite weights).

#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

use crate::fused::{block_tmp, RowSource, ROW_BLOCK};
use crate::simd::{per_backend, Backend, Isa, Simd};

/// A micro-kernel's register block: `mr` output channels by `nr` vectors
/// of `lanes` output positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Block {
    pub mr: usize,
    pub nr: usize,
    pub lanes: usize,
}

impl Block {
    /// Output positions per block.
    pub(crate) fn cols(self) -> usize {
        self.nr * self.lanes
    }
}

/// The blocks `backend` offers: a regular one, and one with fewer rows
/// and more columns for groups with few output channels. Accumulators
/// (`mr · nr` vectors), the `nr` loaded vectors and one broadcast fit the
/// register file: 32 vector registers on AVX-512 and NEON, 16 on AVX2, and
/// on the portable backend 16 SSE2 registers, two per `[f32; 8]`.
///
/// AVX2's narrow block is 2 × 5, not the 4 × 3 of the other backends'
/// shape: 4 × 3 also takes all 16 registers, and LLVM spilled an
/// accumulator to the stack and shuffled the others every step, which ran
/// at 35-43 GFLOP/s where 6 × 2 and 2 × 5 reach 70-90 on the 2-core
/// AVX2 AMD EPYC VM (`calibrate_blocks`, 2 to 512 channels, 2026-11-28);
/// it was the block of every group whose output channels are a multiple
/// of 4 and not of 6 (128, 256, 512). AVX-512's 4 × 6 runs as fast as its
/// 8 × 3 on the 16-core Intel Xeon (within its noise, 4 to 512 channels).
pub(crate) fn blocks(backend: Backend) -> [Block; 2] {
    let (regular, few, lanes) = match backend {
        Backend::Portable => ((4, 1), (2, 2), 8),
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2 => ((6, 2), (2, 5), 8),
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512 => ((8, 3), (4, 6), 16),
        #[cfg(target_arch = "aarch64")]
        Backend::Neon => ((8, 3), (4, 6), 4),
    };
    [regular, few].map(|(mr, nr)| Block { mr, nr, lanes })
}

/// The block for `out_per_group` output channels on `backend`: the one
/// whose panels take the fewest steps, padding rows included. A step of
/// a block keeps its `mr · nr` accumulators busy, so a panel's cost goes
/// with its rows over that count (AVX2's 2 × 5 keeps 10 where 6 × 2
/// keeps 12; the others' two blocks keep as many): the narrow block where
/// the regular one would pad more rows than that difference makes up
/// (the regular one on a tie).
pub(crate) fn choose_block(backend: Backend, out_per_group: usize) -> Block {
    let [regular, few] = blocks(backend);
    let padded = |b: Block| out_per_group.next_multiple_of(b.mr);
    let acc = |b: Block| b.mr * b.nr;
    if padded(few) * acc(regular) < padded(regular) * acc(few) {
        few
    } else {
        regular
    }
}

/// Largest `mr · cols` of any block, the stack buffer of short chunks.
pub(crate) const MAX_BLOCK_FLOATS: usize = 384;

/// Where each tap reads in a tile's input window (see the module docs),
/// fixed at prepare.
///
/// The window holds, per input channel, one row per phase `r` some tap
/// reads, [`Window::pitch`] floats apart: padded input positions
/// `(l0 + q)·stride + r` for `q = 0, 1, ...`. Tap `k` of outputs `l0 + j ..`
/// reads the row of its phase `(k·dilation) % stride` from `j + o_k` on,
/// `o_k = (k·dilation) / stride`, at unit stride.
#[derive(Debug)]
pub(crate) struct Window {
    /// Floats per row: the longest chunk (or one block, if longer) plus
    /// [`Window::halo`], rounded up to a multiple of 16 (64 bytes).
    pub pitch: usize,
    /// `max_k o_k`: positions a row holds beyond the chunk.
    pub halo: usize,
    /// The convolution's stride.
    pub stride: usize,
    /// `i_k · pitch + o_k` for each tap `k`, `i_k` the row of its phase.
    pub offsets: Box<[usize]>,
    /// The phases some tap reads, ascending: row `i` holds phase
    /// `phases[i]`.
    pub phases: Box<[usize]>,
    /// Floats from one input channel's rows to the next's
    /// ([`channel_stride`]).
    channel_stride: usize,
    /// Where each (input channel, tap) of the micro-kernels' one loop
    /// reads, in their order: `c · channel_stride + offsets[k]` at index
    /// `c · taps + k`, for the `cin` input channels of a group.
    pub reads: Box<[usize]>,
}

impl Window {
    /// The window of `cin` input channels for `kernel_size` taps at
    /// `stride` and `dilation`, with chunks of at most `max_chunk` outputs
    /// and blocks of `cols`.
    pub(crate) fn new(
        cin: usize,
        kernel_size: usize,
        stride: usize,
        dilation: usize,
        max_chunk: usize,
        cols: usize,
    ) -> Self {
        // From the taps, not by scanning every residue below the stride:
        // a stride of 4e9 (a fuzzed blob's) took minutes at init.
        let mut phases: Vec<usize> = (0..kernel_size).map(|k| k * dilation % stride).collect();
        phases.sort_unstable();
        phases.dedup();
        let phases = phases.into_boxed_slice();
        let halo = (kernel_size - 1) * dilation / stride;
        let pitch = (max_chunk.max(cols) + halo).next_multiple_of(16);
        let offsets: Box<[usize]> = (0..kernel_size)
            .map(|k| {
                let row = phases.iter().position(|&r| r == k * dilation % stride);
                row.expect("a phase some tap reads") * pitch + k * dilation / stride
            })
            .collect();
        let channel_stride = channel_stride(cin, phases.len(), pitch);
        let reads = (0..cin)
            .flat_map(|c| offsets.iter().map(move |&o| c * channel_stride + o))
            .collect();
        Window {
            pitch,
            halo,
            stride,
            offsets,
            phases,
            channel_stride,
            reads,
        }
    }

    /// Floats of scratch per input channel, from one channel's rows to the
    /// next's ([`channel_stride`]).
    pub(crate) fn channel_stride(&self) -> usize {
        self.channel_stride
    }
}

/// Most rows (of phases, one per input channel and phase) a window may
/// have for [`channel_stride`] to pad them: one 64-byte line of each is
/// 32 KiB, the L1 data cache of Zen 3 and 4 and of many Arm cores.
pub(crate) const SPREAD_ROWS: usize = 512;

/// The distance between consecutive input channels' rows in a window of
/// `cin` channels holding `phases` rows of `pitch` floats (a multiple of
/// 16) each.
///
/// Up to [`SPREAD_ROWS`] rows, an odd number of 64-byte lines. The
/// micro-kernel's steps read every channel's row at the same columns; an
/// even number of lines apart, those reads fall into a fraction of the L1
/// cache's 64 sets (rows of 512 floats: 2 of them, 16 lines for all the
/// channels), and a block's reads go to L2. An odd number spreads any 64
/// consecutive channels over all the sets. Measured with `calibrate_blocks`
/// (1 thread, best of 11-15 alternating rounds, 2026-11-29): a pointwise
/// conv of 256 -> 512 channels over 512 frames ran 1.16x as fast on the
/// 2-core Zen 3 VM (AVX2) and 1.11x on the 16-core Xeon (AVX-512), 256 ->
/// 256 1.09x and 1.20x; shapes whose rows were already an odd number of
/// lines apart stayed within noise (0.98-1.04x), and so did SpeechT5's
/// HiFi-GAN on the Xeon at 1 to 16 threads (bit-identical outputs: the sums
/// run in the same order).
///
/// More rows than that overflow L1 at every step whatever their sets, and
/// the padding only grows the window (by up to a line a channel) and the
/// fill's writes. wav2letter's 2000-channel pointwise convs over 26 frames
/// (rows of 2 lines, 3 padded) ran 4-6% slower padded with AVX2 on a Zen 4
/// core (`calibrate_blocks`, median of 5 alternating rounds, 2026-11-29:
/// 2000 -> 40 at 53.7 GFLOP/s against 56.9, 2000 -> 2000 at 55.2 against
/// 57.6, `docs/bench/ab-s46-gemm-wide-windows.md`), and the 2000 -> 2000
/// one 5.0 -> 7.55 ms in session 45's ETDumps of the builds before and
/// after the padding on Zen 3, whose L2 is half as large.
/// 1024 channels had gained nothing from it (0.96x on Zen 3, 1.01x on the
/// Xeon).
fn channel_stride(cin: usize, phases: usize, pitch: usize) -> usize {
    debug_assert!(pitch.is_multiple_of(16));
    let floats = phases * pitch;
    if cin * phases <= SPREAD_ROWS && (floats / 16).is_multiple_of(2) {
        floats + 16
    } else {
        floats
    }
}

/// A tile's input channels.
#[derive(Clone, Copy)]
pub(crate) enum TileInput<'a> {
    /// The group's input rows, stored, `cin × in_len`.
    Rows(&'a [f32]),
    /// Computed by a prologue: the group's rows are the source's rows
    /// `row0 .. row0 + cin` (consecutive channels of one batch item).
    Source {
        source: &'a dyn RowSource,
        row0: usize,
    },
}

/// Where a tile's window is: filled by the tile into its thread's scratch
/// (with room for a prologue's input), or already filled and shared by
/// the tiles of one chunk.
pub(crate) enum TileWindow<'a> {
    Fill {
        window: &'a mut [f32],
        buf: &'a mut [f32],
    },
    Filled(&'a [f32]),
}

/// One tile's inputs and output.
pub(crate) struct TileArgs<'a> {
    /// The group's input channels.
    pub x: TileInput<'a>,
    pub in_len: usize,
    pub pad_left: usize,
    pub cin: usize,
    pub window: &'a Window,
    /// The filters of the tile's output channels, `[rows][cin][taps]`.
    pub weights: &'a [f32],
    /// The bias of the tile's output channels, if any.
    pub bias: Option<&'a [f32]>,
    /// Output channels in the tile (the last panel may be partly padding).
    pub rows: usize,
    /// First output position and number of positions.
    pub l0: usize,
    pub n: usize,
    /// The output at (first row of the tile, `l0`); rows `y_stride` apart.
    pub y: *mut f32,
    pub y_stride: usize,
    /// Every panel is written at `y` (a buffer of `MR` rows, each handed
    /// on before the next panel overwrites it), not at its own rows.
    pub reuse: bool,
}

/// `f(args, scratch)`: one tile. Unsafe because of the CPU features it may
/// be compiled for and because it writes through `args.y`.
type TileFn = unsafe fn(&TileArgs<'_>, TileWindow<'_>, Option<&mut PanelDone<'_>>);

/// `f(args, channels, cols, out, buf)`: [`fill_window`] compiled for one
/// backend (its gathers vectorise with the backend's instructions).
type FillFn = unsafe fn(&TileArgs<'_>, std::ops::Range<usize>, usize, &mut [f32], &mut [f32]);

/// The tile function for one backend and block, chosen at prepare.
#[derive(Clone, Copy)]
pub(crate) struct TileKernel {
    backend: Backend,
    block: Block,
    f: TileFn,
    fill: FillFn,
}

impl std::fmt::Debug for TileKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TileKernel")
            .field("backend", &self.backend)
            .field("block", &self.block)
            .finish()
    }
}

impl TileKernel {
    /// The kernel of `block` (one of [`blocks`]'s for `isa`) on `isa`.
    pub(crate) fn new(isa: Isa, block: Block) -> Self {
        let backend = isa.backend();
        debug_assert!(blocks(backend).contains(&block), "{block:?}");
        /// `$f::<MR, NR>` for the blocks of [`blocks`].
        macro_rules! pick {
            ($f:ident) => {
                match (block.mr, block.nr) {
                    (2, 2) => $f::<2, 2> as TileFn,
                    (2, 5) => $f::<2, 5> as TileFn,
                    (4, 1) => $f::<4, 1> as TileFn,
                    (4, 6) => $f::<4, 6> as TileFn,
                    (6, 2) => $f::<6, 2> as TileFn,
                    (8, 3) => $f::<8, 3> as TileFn,
                    _ => unreachable!("no kernel for {block:?}"),
                }
            };
        }
        let (f, fill) = match backend {
            Backend::Portable => (pick!(tile_portable), fill_portable as FillFn),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 => (pick!(tile_avx2), fill_avx2 as FillFn),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512 => (pick!(tile_avx512), fill_avx512 as FillFn),
            #[cfg(target_arch = "aarch64")]
            Backend::Neon => (pick!(tile_neon), fill_neon as FillFn),
        };
        TileKernel {
            backend,
            block,
            f,
            fill,
        }
    }

    #[cfg(test)]
    pub(crate) fn backend(&self) -> Backend {
        self.backend
    }

    pub(crate) fn block(&self) -> Block {
        self.block
    }

    /// Computes one tile (see the module docs), filling its window or
    /// reading one filled for it (`window`, which must then be this tile's
    /// chunk's, as [`TileKernel::fill`] wrote it), and handing each panel
    /// of `MR` rows to `done` once written.
    ///
    /// # Safety
    /// `args.y` is valid for reads and writes of `args.n` floats at each of
    /// `args.rows` rows (`MR` rows where `args.reuse`) `args.y_stride` apart,
    /// `args.n <= args.y_stride`, and no other thread accesses them during
    /// the call. Everything else is checked (panics).
    pub(crate) unsafe fn tile(
        &self,
        args: &TileArgs<'_>,
        window: TileWindow<'_>,
        done: Option<&mut PanelDone<'_>>,
    ) {
        // SAFETY: `new` built `f` for the backend of an `Isa`, which this
        // CPU has (only detection makes one); the output is valid by our
        // caller's contract.
        unsafe { (self.f)(args, window, done) }
    }

    /// Fills the window rows of input channels `channels` of the tile
    /// `args` into `out` ([`fill_window`], with `buf` for a prologue's
    /// input): a chunk's window shared by its tiles, filled before them.
    pub(crate) fn fill(
        &self,
        args: &TileArgs<'_>,
        channels: std::ops::Range<usize>,
        out: &mut [f32],
        buf: &mut [f32],
    ) {
        // SAFETY: `new` built `fill` for the backend of an `Isa`, which this
        // CPU has (only detection makes one); the function is otherwise safe.
        unsafe { (self.fill)(args, channels, self.block.cols(), out, buf) }
    }
}

/// Channels a window fill computes from a prologue at a time
/// ([`RowSource::fill_rows`]): few enough that their input span stays in
/// L1/L2 before it is split into phases, at most [`ROW_BLOCK`].
pub(crate) const SOURCE_CHANNELS: usize = 64;
const _: () = assert!(SOURCE_CHANNELS <= ROW_BLOCK);

/// Floats of `buf` [`fill_window`] needs for a prologue input needing
/// `x_temps` line-sized temporaries: a block of [`SOURCE_CHANNELS`]
/// channels' input span (at most `pitch · stride` samples each) and the
/// prologue's temporaries for reading it.
pub(crate) fn source_buf(win: &Window, x_temps: usize) -> usize {
    let span = win.pitch * win.stride;
    SOURCE_CHANNELS * span + block_tmp(x_temps, span)
}

/// Fills the window rows of input channels `channels` of the tile `a`
/// into `out` (`channels.len() · channel_stride` floats, from the first
/// channel's rows; see the module docs): for each channel `c` and phase
/// read, `max(n, cols) + halo` values. A stored input is gathered from its
/// rows; a prologue's is computed, [`SOURCE_CHANNELS`] channels at a time,
/// into `buf` (at least [`source_buf`] floats), over the samples the tile
/// reads, then gathered. Safe, bounds-checked code.
#[inline(always)]
fn fill_window(
    a: &TileArgs<'_>,
    channels: std::ops::Range<usize>,
    cols: usize,
    out: &mut [f32],
    buf: &mut [f32],
) {
    let win = a.window;
    let s = win.stride;
    let needed = a.n.max(cols) + win.halo;
    assert!(needed <= win.pitch, "window pitch");
    assert!(channels.end <= a.cin, "channels");
    let cs = win.channel_stride();
    // Samples t_lo .. t_hi are all any row of the tile reads.
    let last_phase = win.phases.last().copied().unwrap_or(0);
    let t_lo = (a.l0 * s).saturating_sub(a.pad_left).min(a.in_len);
    let t_hi = ((a.l0 + needed - 1) * s + last_phase + 1)
        .saturating_sub(a.pad_left)
        .min(a.in_len);
    match a.x {
        TileInput::Rows(x) => {
            assert!(x.len() == a.cin * a.in_len, "x group");
            for c in channels.clone() {
                let x_row = &x[c * a.in_len..][..a.in_len];
                let rows = &mut out[(c - channels.start) * cs..][..cs];
                fill_channel(a, needed, x_row, 0, rows);
            }
        }
        TileInput::Source { source, row0 } => {
            let span = t_hi - t_lo;
            assert!(span <= win.pitch * s, "span");
            let (block, tmp) = buf.split_at_mut(SOURCE_CHANNELS * span);
            for c0 in channels.clone().step_by(SOURCE_CHANNELS) {
                let m = SOURCE_CHANNELS.min(channels.end - c0);
                if span > 0 {
                    source.fill_rows(row0 + c0, m, t_lo, span, &mut block[..m * span], tmp);
                }
                for c in c0..c0 + m {
                    let x_row = &block[(c - c0) * span..][..span];
                    let rows = &mut out[(c - channels.start) * cs..][..cs];
                    fill_channel(a, needed, x_row, t_lo, rows);
                }
            }
        }
    }
}

/// One channel's window rows (`rows`, one per phase read) from `x_row`,
/// which holds its input samples from `x_first` on (every sample the
/// tile reads): `needed` values per row, padding as zeros.
#[inline(always)]
fn fill_channel(a: &TileArgs<'_>, needed: usize, x_row: &[f32], x_first: usize, rows: &mut [f32]) {
    let win = a.window;
    let s = win.stride;
    for (i, &r) in win.phases.iter().enumerate() {
        let row = &mut rows[i * win.pitch..][..needed];
        // row[q] is padded position p0 + q·s, input sample p0 + q·s −
        // pad_left: real for q in lo..hi.
        let p0 = a.l0 * s + r;
        let lo = a.pad_left.saturating_sub(p0).div_ceil(s).min(needed);
        let hi = (a.in_len + a.pad_left)
            .saturating_sub(p0)
            .div_ceil(s)
            .clamp(lo, needed);
        row[..lo].fill(0.0);
        row[hi..].fill(0.0);
        if lo < hi {
            let first = p0 + lo * s - a.pad_left - x_first;
            let src = &x_row[first..];
            let dst = &mut row[lo..hi];
            match s {
                1 => dst.copy_from_slice(&src[..hi - lo]),
                2 => gather::<2>(dst, src),
                3 => gather::<3>(dst, src),
                4 => gather::<4>(dst, src),
                5 => gather::<5>(dst, src),
                _ => gather_any(dst, src, s),
            }
        }
    }
}

/// `dst[i] = src[i · S]`. With `S` known, the loop vectorises (strided
/// loads become shuffles): the window copy is a sizeable share of a tile
/// at stride > 1, where the scalar loop ([`gather_any`]) made 64→64, K=3,
/// stride 2 run at half the speed of stride 1. Strides 2 to 5 (speech
/// front-ends stride their first layer by 5) take it.
#[inline(always)]
fn gather<const S: usize>(dst: &mut [f32], src: &[f32]) {
    let (whole, _) = src.as_chunks::<S>();
    let n = whole.len().min(dst.len());
    let (head, tail) = dst.split_at_mut(n);
    for (d, c) in head.iter_mut().zip(whole) {
        *d = c[0];
    }
    gather_any(tail, &src[n * S..], S);
}

/// `dst[i] = src[i · s]` for any `s`.
#[inline(always)]
fn gather_any(dst: &mut [f32], src: &[f32], s: usize) {
    // `chunks` rather than `step_by`: no per-step bounds arithmetic.
    for (d, c) in dst.iter_mut().zip(src.chunks(s)) {
        *d = c[0];
    }
}

/// One tile on backend `S` with blocks of `MR × NR` vectors (see the
/// module docs), each panel handed to `done` once written.
///
/// # Safety
/// `S`'s features are present, and `a.y` is as [`TileKernel::tile`]
/// requires.
#[inline(always)]
unsafe fn tile_generic<S: Simd, const MR: usize, const NR: usize>(
    a: &TileArgs<'_>,
    window: TileWindow<'_>,
    mut done: Option<&mut PanelDone<'_>>,
) {
    let lanes = S::LANES;
    let cols = NR * lanes;
    let win = a.window;
    let taps = win.offsets.len();
    let cs = win.channel_stride();
    let scratch: &[f32] = match window {
        TileWindow::Fill { window, buf } => {
            fill_window(a, 0..a.cin, cols, window, buf);
            window
        }
        TileWindow::Filled(window) => window,
    };
    let panels = a.rows.div_ceil(MR);
    let filter_len = a.cin * taps;
    assert!(a.weights.len() == a.rows * filter_len, "weights");
    assert!(win.reads.len() == filter_len, "the window's channels");
    assert!(a.bias.is_none_or(|b| b.len() >= a.rows), "bias");
    assert!(a.cin == 0 || scratch.len() >= (a.cin - 1) * cs + win.pitch);
    assert!(MR * 2 * lanes <= MAX_BLOCK_FLOATS && NR >= 1);
    assert!(a.n <= a.y_stride, "output rows overlap");
    // Every tap's offset plus a block's reads stays in its row: o_k <=
    // halo, and every block (of at most `cols` columns) starts at j with
    // j + its width <= max(n, cols), so the last value read is at
    // i_k·pitch + halo + max(n, cols) - 1 < (i_k + 1)·pitch (fill_window
    // asserted max(n, cols) + halo <= pitch).
    debug_assert!(win
        .offsets
        .iter()
        .all(|&o| o % win.pitch <= win.halo && o / win.pitch < win.phases.len()));
    let x = scratch.as_ptr();
    for p in 0..panels {
        let r0 = p * MR;
        let rows = (a.rows - r0).min(MR);
        let mut bias = [0.0f32; MR];
        if let Some(b) = a.bias {
            bias[..rows].copy_from_slice(&b[r0..r0 + rows]);
        }
        // The block's filters; rows past the tile's repeat its last (they
        // are computed, never stored).
        let filters = &a.weights[r0 * filter_len..][..rows * filter_len];
        let w: [*const f32; MR] =
            std::array::from_fn(|i| filters[i.min(rows - 1) * filter_len..].as_ptr());
        let y = if a.reuse {
            a.y
        } else {
            a.y.wrapping_add(r0 * a.y_stride)
        };
        // Every `block` call below is sound: the features by our contract.
        // Reads: the window as argued above (`reads` holds c·cs + o_k for
        // c < cin, asserted to be cin·taps long), every block ending at or
        // before max(n, cols); cin·taps values from each of the MR filter
        // pointers, each the start of a whole filter inside `filters`
        // (sliced above). Writes: `rows` rows at `y`, the panel's (<= the
        // tile's remaining rows, of which columns j0 .. j0 + width <= n,
        // valid by our contract) or the stack buffer's (MR rows of `width`).
        let args = (x, &*win.reads, w, &bias);
        let mut j = 0;
        while j + cols <= a.n {
            // SAFETY: see above; j + cols <= n.
            unsafe { block::<S, MR, NR>(args, j, y, a.y_stride, rows, NR) };
            j += cols;
        }
        while NR > 2 && j + 2 * lanes <= a.n {
            // SAFETY: see above; j + 2 · lanes <= n.
            unsafe { block::<S, MR, NR>(args, j, y, a.y_stride, rows, 2) };
            j += 2 * lanes;
        }
        if j < a.n {
            // At most 2 vectors remain (or NR, if fewer), ending at n.
            let vectors = (a.n - j).div_ceil(lanes);
            let width = vectors * lanes;
            if a.n >= width {
                // SAFETY: see above; the block ends at n.
                unsafe { block::<S, MR, NR>(args, a.n - width, y, a.y_stride, rows, vectors) };
            } else {
                // Shorter than the block: all MR rows into `buf` (which
                // holds MR · 2 · lanes, asserted), then copied.
                let mut buf = [0.0f32; MAX_BLOCK_FLOATS];
                // SAFETY: see above; width <= 2 · lanes <= cols, the
                // window's rows hold max(n, cols) + halo values.
                unsafe { block::<S, MR, NR>(args, 0, buf.as_mut_ptr(), width, MR, vectors) };
                for (i, src) in buf.chunks_exact(width).take(rows).enumerate() {
                    // SAFETY: row i < rows of this panel, columns 0 .. n,
                    // valid and ours by the contract.
                    let dst = unsafe { std::slice::from_raw_parts_mut(y.add(i * a.y_stride), a.n) };
                    dst.copy_from_slice(&src[..a.n]);
                }
            }
        }
        if let Some(done) = done.as_deref_mut() {
            // SAFETY: the panel's rows were just written (columns 0 .. n
            // of `rows` rows, y_stride apart, valid for reads and writes by
            // our contract) and nothing else reads or writes them while
            // `done` has them (the next panel is computed after it returns).
            let values =
                unsafe { std::slice::from_raw_parts_mut(y, (rows - 1) * a.y_stride + a.n) };
            done(r0, rows, values);
        }
    }
}

/// One block of `vectors` vectors (1, 2 or `NR`) at column `j0` of the
/// window in `args`, written to `rows` rows at `y + j0`, `y_stride` apart
/// (see [`micro`]). A function rather than a closure so that it inlines
/// into the backend's `#[target_feature]` function with its intrinsics.
///
/// # Safety
/// As [`micro`] for the window and output offset by `j0`.
#[inline(always)]
unsafe fn block<S: Simd, const MR: usize, const NR: usize>(
    args: MicroArgs<'_, MR>,
    j0: usize,
    y: *mut f32,
    y_stride: usize,
    rows: usize,
    vectors: usize,
) {
    let (x, reads, w, bias) = args;
    let args = (x.wrapping_add(j0), reads, w, bias);
    let y = y.wrapping_add(j0);
    // SAFETY: by our contract.
    unsafe {
        match vectors {
            1 => micro::<S, MR, 1>(args, y, y_stride, rows),
            2 => micro::<S, MR, 2>(args, y, y_stride, rows),
            _ => micro::<S, MR, NR>(args, y, y_stride, rows),
        }
    }
}

/// Called with each finished panel: its first row (of the tile), its rows,
/// and their values (`rows` rows of `n`, `y_stride` apart), which it may
/// change in place (an epilogue finishing them).
pub(crate) type PanelDone<'a> = dyn FnMut(usize, usize, &mut [f32]) + 'a;

/// The inputs of one micro-kernel call that do not depend on where its
/// output goes: the window, where each (input channel, tap) reads in it
/// ([`Window::reads`]), the `MR` filter pointers and the bias.
type MicroArgs<'a, const MR: usize> = (*const f32, &'a [usize], [*const f32; MR], &'a [f32; MR]);

/// `MR × NR` vectors of outputs: `y[i][j] = bias[i] + Σ_s w[i][s] ·
/// x[reads[s] + j]` over the (input channel, tap) steps `s` in order
/// (channels then taps ascending), for `j < NR · LANES`; rows `i < rows`
/// are stored at `y + i·y_stride`.
///
/// One loop over the steps, each reading its offset from `reads`: nested
/// loops over channels and taps made the compiler reload the `MR` filter
/// pointers from the stack and recompute them every channel, which at
/// one to three taps cost about as much as the multiply-adds
/// (128 -> 128 channels, N = 1024, AVX2: 44-58 GFLOP/s at K = 2 and 3,
/// 60-64 at K = 7; `calibrate_blocks`).
///
/// # Safety
/// `S`'s features are present; `x` is readable at `reads[s] + j` for
/// every step `s` and `j < NR · LANES`; each `w[i]` for `reads.len()`
/// values; `y` writable for `NR · LANES` values at each of the first
/// `rows` rows.
#[inline(always)]
unsafe fn micro<S: Simd, const MR: usize, const NR: usize>(
    (x, reads, w, bias): MicroArgs<'_, MR>,
    y: *mut f32,
    y_stride: usize,
    rows: usize,
) {
    // SAFETY: every read and write is in bounds by the contract, and the
    // features are present.
    unsafe {
        let zero = S::splat(0.0);
        let mut acc = [[zero; NR]; MR];
        for (row, &b) in acc.iter_mut().zip(bias) {
            *row = [S::splat(b); NR];
        }
        for (s, &at) in reads.iter().enumerate() {
            let xs = x.add(at);
            let mut xv = [zero; NR];
            for (r, v) in xv.iter_mut().enumerate() {
                *v = S::load(xs.add(r * S::LANES));
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let wi = S::splat(*w[i].add(s));
                for (a, &v) in row.iter_mut().zip(&xv) {
                    *a = S::mul_add(*a, wi, v);
                }
            }
        }
        for (i, row) in acc.iter().enumerate().take(rows) {
            for (r, &v) in row.iter().enumerate() {
                S::store(y.add(i * y_stride + r * S::LANES), v);
            }
        }
    }
}

per_backend! {
    /// [`tile_generic`] on one backend (as [`TileKernel::tile`]).
    unsafe fn [tile_portable, tile_avx2, tile_avx512, tile_neon]<const MR: usize, const NR: usize>(
        a: &TileArgs<'_>,
        s: TileWindow<'_>,
        done: Option<&mut PanelDone<'_>>,
    ) => tile_generic::<S, MR, NR>
}

per_backend! {
    /// [`fill_window`] on one backend (as [`TileKernel::fill`]); its safe
    /// loops need only the backend's features.
    unsafe fn [fill_portable, fill_avx2, fill_avx512, fill_neon](
        a: &TileArgs<'_>,
        c: std::ops::Range<usize>,
        cols: usize,
        out: &mut [f32],
        buf: &mut [f32],
    ) => fill_window
}
