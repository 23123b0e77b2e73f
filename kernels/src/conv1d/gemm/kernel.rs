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
//!    reads are written. The row offsets `r_k·pitch + o_k` are fixed at
//!    prepare ([`Window`]).
//! 2. **Micro-kernels.** For each block of `MR` output channels (their
//!    filters read in place, `[in_channel][tap]` each, side by side; rows
//!    past the tile's last output channel repeat its filter), and each
//!    block of `NR` vectors of output positions, the `MR × NR` accumulators
//!    start at the bias and take, for every input channel and tap in
//!    ascending order, `NR` unit-stride loads from the window shared by `MR`
//!    weight broadcasts: `MR · NR` multiply-adds per `NR + MR` loads. Rows
//!    past the tile's end are computed but not stored. A chunk whose length is not
//!    a multiple of the block ends with the block that ends at its last
//!    output, recomputing some outputs with the same values; a chunk
//!    shorter than one block is computed into a stack buffer and copied.
//!
//! Every output is its bias plus one multiply-add per (input channel, tap),
//! channels outer, taps inner, fused on the SIMD backends: the same order
//! in every block, so results depend neither on the tiling nor on the
//! number of threads. Taps that read padding add `w · 0` (as an explicitly
//! padded convolution does; the same as skipping them for finite weights).

#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

#[cfg(target_arch = "aarch64")]
use crate::simd::Neon;
#[cfg(target_arch = "x86_64")]
use crate::simd::{Avx2, Avx512};
use crate::simd::{Backend, Portable, Simd};

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

/// The blocks `backend` offers: a regular one, and one with half the rows
/// and twice the columns for groups with few output channels. Accumulators
/// (`mr · nr` vectors), the `nr` loaded vectors and one broadcast fit the
/// register file: 32 vector registers on AVX-512 and NEON, 16 on AVX2, and
/// on the portable backend 16 SSE2 registers, two per `[f32; 8]`.
pub(crate) fn blocks(backend: Backend) -> [Block; 2] {
    let (regular, few, lanes) = match backend {
        Backend::Portable => ((4, 1), (2, 2), 8),
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2 => ((6, 2), (4, 3), 8),
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512 => ((8, 3), (4, 6), 16),
        #[cfg(target_arch = "aarch64")]
        Backend::Neon => ((8, 3), (4, 6), 4),
    };
    [regular, few].map(|(mr, nr)| Block { mr, nr, lanes })
}

/// The block for `out_per_group` output channels on `backend`: the one
/// that computes the fewest padding rows (the regular one on a tie).
pub(crate) fn choose_block(backend: Backend, out_per_group: usize) -> Block {
    let [regular, few] = blocks(backend);
    let padded = |b: Block| out_per_group.next_multiple_of(b.mr);
    if padded(few) < padded(regular) {
        few
    } else {
        regular
    }
}

/// Largest `mr · cols` of any block, the stack buffer of short chunks.
pub(crate) const MAX_BLOCK_FLOATS: usize = 384;

/// Where each tap reads in a tile's input window (see the module docs),
/// fixed at prepare.
#[derive(Debug)]
pub(crate) struct Window {
    /// Floats per phase row: the longest chunk (or one block, if longer)
    /// plus [`Window::halo`].
    pub pitch: usize,
    /// `max_k o_k`: positions a phase row holds beyond the chunk.
    pub halo: usize,
    /// The convolution's stride: phase rows per input channel.
    pub stride: usize,
    /// `r_k · pitch + o_k` for each tap `k`.
    pub offsets: Box<[usize]>,
    /// The phases some tap reads, ascending.
    pub phases: Box<[usize]>,
}

impl Window {
    /// The window for `kernel_size` taps at `stride` and `dilation`, with
    /// chunks of at most `max_chunk` outputs and blocks of `cols`.
    pub(crate) fn new(
        kernel_size: usize,
        stride: usize,
        dilation: usize,
        max_chunk: usize,
        cols: usize,
    ) -> Self {
        let halo = (kernel_size - 1) * dilation / stride;
        let pitch = max_chunk.max(cols) + halo;
        let offsets = (0..kernel_size)
            .map(|k| (k * dilation % stride) * pitch + k * dilation / stride)
            .collect();
        let phases = (0..stride)
            .filter(|&r| (0..kernel_size).any(|k| k * dilation % stride == r))
            .collect();
        Window {
            pitch,
            halo,
            stride,
            offsets,
            phases,
        }
    }

    /// Floats of scratch per input channel.
    pub(crate) fn channel_stride(&self) -> usize {
        self.stride * self.pitch
    }
}

/// One tile's inputs and output.
pub(crate) struct TileArgs<'a> {
    /// The group's input rows, `cin × in_len`.
    pub x: &'a [f32],
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
    /// The output at (first row of the tile, `l0`); rows `out_stride` apart.
    pub y: *mut f32,
    pub y_stride: usize,
}

/// `f(args, scratch)`: one tile. Unsafe because of the CPU features it may
/// be compiled for and because it writes through `args.y`.
type TileFn = unsafe fn(&TileArgs<'_>, &mut [f32]);

/// The tile function for one backend and block, chosen at prepare.
#[derive(Clone, Copy)]
pub(crate) struct TileKernel {
    backend: Backend,
    block: Block,
    f: TileFn,
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
    /// The kernel for `out_per_group` output channels on `backend`, or
    /// `None` where this CPU lacks the backend's features.
    pub(crate) fn new(backend: Backend, out_per_group: usize) -> Option<Self> {
        if !backend.is_available() {
            return None;
        }
        let block = choose_block(backend, out_per_group);
        /// `$f::<MR, NR>` for the blocks of [`blocks`].
        macro_rules! pick {
            ($f:ident) => {
                match (block.mr, block.nr) {
                    (2, 2) => $f::<2, 2> as TileFn,
                    (4, 1) => $f::<4, 1> as TileFn,
                    (4, 3) => $f::<4, 3> as TileFn,
                    (4, 6) => $f::<4, 6> as TileFn,
                    (6, 2) => $f::<6, 2> as TileFn,
                    (8, 3) => $f::<8, 3> as TileFn,
                    _ => unreachable!("no kernel for {block:?}"),
                }
            };
        }
        let f = match backend {
            Backend::Portable => pick!(tile_portable),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 => pick!(tile_avx2),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512 => pick!(tile_avx512),
            #[cfg(target_arch = "aarch64")]
            Backend::Neon => pick!(tile_neon),
        };
        Some(TileKernel { backend, block, f })
    }

    #[cfg(test)]
    pub(crate) fn backend(&self) -> Backend {
        self.backend
    }

    pub(crate) fn block(&self) -> Block {
        self.block
    }

    /// Computes one tile (see the module docs), its window in `scratch`.
    ///
    /// # Safety
    /// `args.y` is valid for writes of `args.n` floats at each of
    /// `args.rows` rows `args.y_stride` apart, and no other thread accesses
    /// them during the call. Everything else is checked (panics).
    pub(crate) unsafe fn tile(&self, args: &TileArgs<'_>, scratch: &mut [f32]) {
        // SAFETY: `new` built `f` for `backend` only after checking this CPU
        // has its features; the output is valid by our caller's contract.
        unsafe { (self.f)(args, scratch) }
    }
}

/// Copies the window of `a` into `scratch` (see the module docs): for each
/// input channel `c` and phase `r` read, `max(n, cols) + halo` values from
/// `c · channel_stride + r · pitch` on. Safe, bounds-checked code.
#[inline(always)]
fn fill_window(a: &TileArgs<'_>, cols: usize, scratch: &mut [f32]) {
    let win = a.window;
    let s = win.stride;
    let needed = a.n.max(cols) + win.halo;
    assert!(needed <= win.pitch, "window pitch");
    assert!(a.x.len() == a.cin * a.in_len, "x group");
    let cs = win.channel_stride();
    for c in 0..a.cin {
        let x_row = &a.x[c * a.in_len..][..a.in_len];
        for &r in &*win.phases {
            let row = &mut scratch[c * cs + r * win.pitch..][..needed];
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
                let first = p0 + lo * s - a.pad_left;
                if s == 1 {
                    row[lo..hi].copy_from_slice(&x_row[first..first + hi - lo]);
                } else {
                    match s {
                        2 => gather::<2>(&mut row[lo..hi], &x_row[first..]),
                        3 => gather::<3>(&mut row[lo..hi], &x_row[first..]),
                        4 => gather::<4>(&mut row[lo..hi], &x_row[first..]),
                        _ => gather_any(&mut row[lo..hi], &x_row[first..], s),
                    }
                }
            }
        }
    }
}

/// `dst[i] = src[i · S]`. With `S` known, the loop vectorises (strided
/// loads become shuffles): the window copy is a sizeable share of a tile
/// at stride > 1, where the scalar loop ([`gather_any`]) made 64→64, K=3,
/// stride 2 run at half the speed of stride 1.
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

/// One tile on backend `S` with blocks of `MR × NR` vectors.
///
/// # Safety
/// `S`'s features are present, and `a.y` is as [`TileKernel::tile`]
/// requires.
#[inline(always)]
unsafe fn tile_generic<S: Simd, const MR: usize, const NR: usize>(
    a: &TileArgs<'_>,
    scratch: &mut [f32],
) {
    let cols = NR * S::LANES;
    let win = a.window;
    let taps = win.offsets.len();
    let cs = win.channel_stride();
    fill_window(a, cols, scratch);
    let panels = a.rows.div_ceil(MR);
    let filter_len = a.cin * taps;
    assert!(a.weights.len() == a.rows * filter_len, "weights");
    assert!(a.bias.is_none_or(|b| b.len() >= a.rows), "bias");
    assert!(a.cin == 0 || scratch.len() >= (a.cin - 1) * cs + win.pitch);
    assert!(MR * cols <= MAX_BLOCK_FLOATS);
    // Every tap's offset plus a block's reads stays in its phase row:
    // o_k <= halo and the blocks start at j <= max(n, cols) - cols, so the
    // last value read is at r_k·pitch + halo + max(n, cols) - 1 < (r_k + 1)·pitch
    // (fill_window asserted max(n, cols) + halo <= pitch).
    debug_assert!(win
        .offsets
        .iter()
        .all(|&o| o % win.pitch <= win.halo && o / win.pitch < win.stride));
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
        if a.n >= cols {
            let mut j = 0;
            while j < a.n {
                let j0 = j.min(a.n - cols);
                // SAFETY: features by our contract. Reads: the window as
                // argued above with j0 + cols <= n; cin·taps values from
                // each of the MR filter pointers, each the start of a
                // whole filter inside `filters` (sliced above). Writes: rows `rows` (<= the tile's
                // remaining rows) and columns j0 .. j0 + cols <= n of the
                // tile's output, valid by our contract.
                unsafe {
                    micro::<S, MR, NR>(
                        x.add(j0),
                        cs,
                        &win.offsets,
                        a.cin,
                        w,
                        &bias,
                        a.y.add(r0 * a.y_stride + j0),
                        a.y_stride,
                        rows,
                    );
                }
                j += cols;
            }
        } else {
            let mut buf = [0.0f32; MAX_BLOCK_FLOATS];
            // SAFETY: as above with j0 = 0 (the window holds cols + halo
            // values per row), writing all MR rows of cols values into
            // `buf`, which holds MR · cols (asserted).
            unsafe {
                micro::<S, MR, NR>(
                    x,
                    cs,
                    &win.offsets,
                    a.cin,
                    w,
                    &bias,
                    buf.as_mut_ptr(),
                    cols,
                    MR,
                );
            }
            for (i, src) in buf.chunks_exact(cols).take(rows).enumerate() {
                // SAFETY: row r0 + i < a.rows, columns 0 .. n of the tile's
                // output, valid and ours by the contract.
                let dst =
                    unsafe { std::slice::from_raw_parts_mut(a.y.add((r0 + i) * a.y_stride), a.n) };
                dst.copy_from_slice(&src[..a.n]);
            }
        }
    }
}

/// `MR × NR` vectors of outputs: `y[i][j] = bias[i] + Σ_c Σ_k w[i][c][k] ·
/// x[c·chan_stride + offsets[k] + j]`, channels then taps ascending, for
/// `j < NR · LANES`; rows `i < rows` are stored at `y + i·y_stride`.
///
/// # Safety
/// `S`'s features are present; `x` is readable at `c·chan_stride +
/// offsets[k] + j` for every `c < cin`, `k` and `j < NR · LANES`; each
/// `w[i]` for `cin · offsets.len()` values; `y` writable for `NR · LANES` values at
/// each of the first `rows` rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn micro<S: Simd, const MR: usize, const NR: usize>(
    x: *const f32,
    chan_stride: usize,
    offsets: &[usize],
    cin: usize,
    w: [*const f32; MR],
    bias: &[f32; MR],
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
        let mut kk = 0;
        let mut xc = x;
        for _ in 0..cin {
            for &o in offsets {
                let xk = xc.add(o);
                let mut xv = [zero; NR];
                for (r, v) in xv.iter_mut().enumerate() {
                    *v = S::load(xk.add(r * S::LANES));
                }
                for (i, row) in acc.iter_mut().enumerate() {
                    let wi = S::splat(*w[i].add(kk));
                    for (a, &v) in row.iter_mut().zip(&xv) {
                        *a = S::mul_add(*a, wi, v);
                    }
                }
                kk += 1;
            }
            xc = xc.add(chan_stride);
        }
        for (i, row) in acc.iter().enumerate().take(rows) {
            for (r, &v) in row.iter().enumerate() {
                S::store(y.add(i * y_stride + r * S::LANES), v);
            }
        }
    }
}

/// # Safety
/// As [`TileKernel::tile`]; the portable backend needs no CPU feature.
unsafe fn tile_portable<const MR: usize, const NR: usize>(a: &TileArgs<'_>, s: &mut [f32]) {
    // SAFETY: Portable needs no feature; the output by our contract.
    unsafe { tile_generic::<Portable, MR, NR>(a, s) }
}

/// # Safety
/// As [`TileKernel::tile`]; the CPU supports AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const MR: usize, const NR: usize>(a: &TileArgs<'_>, s: &mut [f32]) {
    // SAFETY: our caller guarantees AVX2, FMA and the output.
    unsafe { tile_generic::<Avx2, MR, NR>(a, s) }
}

/// # Safety
/// As [`TileKernel::tile`]; the CPU supports AVX-512 F and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn tile_avx512<const MR: usize, const NR: usize>(a: &TileArgs<'_>, s: &mut [f32]) {
    // SAFETY: our caller guarantees AVX-512 F, FMA and the output.
    unsafe { tile_generic::<Avx512, MR, NR>(a, s) }
}

/// # Safety
/// As [`TileKernel::tile`]; the CPU supports NEON.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
unsafe fn tile_neon<const MR: usize, const NR: usize>(a: &TileArgs<'_>, s: &mut [f32]) {
    // SAFETY: our caller guarantees NEON and the output.
    unsafe { tile_generic::<Neon, MR, NR>(a, s) }
}
