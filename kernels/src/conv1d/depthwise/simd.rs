//! The depthwise row kernels, on the crate's SIMD dispatch layer.
//!
//! A row kernel computes a contiguous range of one output row,
//! `y[l] = bias + sum_k taps[k] * x[l + k * dilation - pad_left]` with
//! out-of-range `x` reading as zero, in three parts:
//!
//! * the **interior**, where every tap reads a real sample: vectorised along
//!   time, `R` vectors of outputs per iteration (register blocking), taps
//!   broadcast into registers once per call when the tap count `K` is a
//!   compile-time constant (1..=8 on AVX-512, AVX2 and NEON), or once per block
//!   otherwise. A partial last block is recomputed as the full block
//!   ending at the last output (same values, written twice); interiors
//!   shorter than one block run halving blocks and single vectors, the same
//!   way, and only those shorter than one vector run scalar. No branch on
//!   padding anywhere.
//! * left and right **edges**, the outputs where some tap reads padding (at
//!   most `span = (K - 1) * dilation` on each side, or the whole row when
//!   it is shorter than the filter): for short spans, scalar over exactly
//!   each output's valid taps; for longer ones, and for every span of the
//!   grouped AVX-512 kernel (`K >= 9`), the interior kernel run on a
//!   zero-padded copy of the input window in a small stack buffer.
//!
//! Every output is `bias`, then one multiply-add per tap in ascending tap
//! order (in the scalar edges, per valid tap only), with the same rounding
//! in every part of a backend: fused on AVX-512, AVX2 and NEON, unfused in the
//! portable backend. Which part computes an output depends only on its
//! position and the shape, so splitting rows into time chunks (which
//! depends on the thread count) cannot change any result.
//!
//! Backends implement [`Simd`] (the crate's shared dispatch layer,
//! `crate::simd`); the algorithm is written once, generic over it, and each
//! backend instantiates it inside a function compiled with its target
//! features (`row_avx512`, `row_avx2`, `row_neon`, `row_portable`), whose
//! pointer [`RowKernel`] stores once the features were detected.
//! `#[inline(always)]` on the generic code and the trait methods makes the
//! intrinsics inline into those functions.

#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

use std::mem::MaybeUninit;

pub(crate) use crate::simd::Backend;
use crate::simd::{per_backend, Isa, Simd};

/// Outputs per register block of the interior loop for `kernel_size` taps
/// on `backend`, outside the grouped kernel ([`grouped`]).
fn block_outputs(backend: Backend, kernel_size: usize) -> usize {
    let k = if kernel_size <= MAX_CONST_TAPS {
        kernel_size
    } else {
        0
    };
    match backend {
        Backend::Portable => PORTABLE_R * 8,
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2 => avx2_r(k) * 8,
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512 => avx512_r(k) * 16,
        #[cfg(target_arch = "aarch64")]
        Backend::Neon => neon_r(k) * 4,
    }
}

/// Tap counts up to this are compile-time constants with taps in registers.
const MAX_CONST_TAPS: usize = 8;

/// Register blocks (vectors of outputs per interior iteration) for `K`
/// taps held in registers (`K == 0`: taps read per block), per backend.
/// AVX2 has 16 vector registers: `K` taps plus `R` accumulators plus the
/// bias must fit, or taps spill and reload (measured: `R = 8` up to `K =
/// 5`, 6 above). NEON has 32 registers.
///
/// The portable backend always reads its taps per block (`K == 0`):
/// with a compile-time `K` the block loop body becomes straight-line
/// scalar code, and LLVM's loop vectorizer re-vectorises it across
/// iterations with shuffles and spills (measured 4 to 6 times slower for
/// some `K`). Its `[f32; 8]` is two SSE2 registers, hence the smaller block.
const PORTABLE_R: usize = 4;
#[cfg(target_arch = "x86_64")]
const fn avx2_r(k: usize) -> usize {
    match k {
        0 => 8,
        1..=5 => 8,
        _ => 6,
    }
}
/// Tap counts up to this (beyond [`MAX_CONST_TAPS`]) take the grouped
/// AVX-512 kernel ([`block_grouped`]) at dilation 1.
/// (Measured: 4 groups, K = 64, run at 1.6e11 flop/s; 8 groups, K = 128,
/// fall to the speed of [`block_dyn`].)
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const MAX_GROUPED_TAPS: usize = 64;
/// Register block of the grouped AVX-512 kernel: 12 accumulators, up to 4
/// tap groups and a loaded vector in 32 registers (measured: 12 beats 8 by
/// 12% at K = 32).
#[cfg(target_arch = "x86_64")]
const AVX512_GROUPED_R: usize = 12;

/// AVX-512 has 32 vector registers: `K` taps, `R` accumulators, the bias
/// and a loaded vector fit with `R = 8` for every `K <= 8`.
#[cfg(target_arch = "x86_64")]
const fn avx512_r(_k: usize) -> usize {
    8
}
#[cfg(target_arch = "aarch64")]
const fn neon_r(_k: usize) -> usize {
    8
}

/// What a row kernel needs to know of the convolution, besides its taps.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowGeom {
    pub in_len: usize,
    pub pad_left: usize,
    pub dilation: usize,
}

/// `f(geom, x_row, taps, bias, l0, y)`: outputs `l0 .. l0 + y.len()` of one
/// row into `y`. Unsafe only because it may be compiled for CPU features
/// that must be present; [`RowKernel`] guarantees they are.
type RowFn = unsafe fn(&RowGeom, &[f32], &[f32], f32, usize, &mut [f32]);

/// A row kernel for one backend and tap count, chosen once at prepare.
#[derive(Clone, Copy)]
pub(crate) struct RowKernel {
    backend: Backend,
    kernel_size: usize,
    /// [`RowKernel::block_outputs`].
    block: usize,
    f: RowFn,
}

impl std::fmt::Debug for RowKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowKernel")
            .field("backend", &self.backend)
            .field("kernel_size", &self.kernel_size)
            .finish()
    }
}

/// `$f::<K, $r>` for the compile-time tap counts, `$f::<0, $r>` (tap count
/// read at run time) otherwise.
macro_rules! by_taps {
    ($f:ident, $r:ident, $k:expr) => {
        match $k {
            1 => $f::<1, { $r(1) }> as RowFn,
            2 => $f::<2, { $r(2) }> as RowFn,
            3 => $f::<3, { $r(3) }> as RowFn,
            4 => $f::<4, { $r(4) }> as RowFn,
            5 => $f::<5, { $r(5) }> as RowFn,
            6 => $f::<6, { $r(6) }> as RowFn,
            7 => $f::<7, { $r(7) }> as RowFn,
            8 => $f::<8, { $r(8) }> as RowFn,
            _ => $f::<0, { $r(0) }> as RowFn,
        }
    };
}

/// Whether `backend` runs `kernel_size` taps at `dilation` with the grouped
/// kernel ([`block_grouped`]; AVX-512 only).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn grouped(backend: Backend, kernel_size: usize, dilation: usize) -> bool {
    match backend {
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512 => {
            dilation == 1 && kernel_size > MAX_CONST_TAPS && kernel_size <= MAX_GROUPED_TAPS
        }
        _ => {
            let _ = (kernel_size, dilation);
            false
        }
    }
}

impl RowKernel {
    /// The kernel for `kernel_size` taps at `dilation` on `isa`, or `None`
    /// for no taps.
    pub(crate) fn new(isa: Isa, kernel_size: usize, dilation: usize) -> Option<Self> {
        if kernel_size == 0 {
            return None;
        }
        let backend = isa.backend();
        // Only the AVX-512 grouped kernel depends on the dilation.
        #[cfg(not(target_arch = "x86_64"))]
        let _ = dilation;
        #[cfg(target_arch = "x86_64")]
        if grouped(backend, kernel_size, dilation) {
            let f = match kernel_size.div_ceil(16) {
                1 => row_avx512_grouped::<1> as RowFn,
                2 => row_avx512_grouped::<2> as RowFn,
                3 => row_avx512_grouped::<3> as RowFn,
                _ => row_avx512_grouped::<4> as RowFn,
            };
            return Some(RowKernel {
                backend,
                kernel_size,
                block: AVX512_GROUPED_R * 16,
                f,
            });
        }
        let f = match backend {
            Backend::Portable => row_portable::<0, PORTABLE_R> as RowFn,
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 => by_taps!(row_avx2, avx2_r, kernel_size),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512 => by_taps!(row_avx512, avx512_r, kernel_size),
            #[cfg(target_arch = "aarch64")]
            Backend::Neon => by_taps!(row_neon, neon_r, kernel_size),
        };
        Some(RowKernel {
            backend,
            kernel_size,
            block: block_outputs(backend, kernel_size),
            f,
        })
    }

    #[cfg(test)]
    pub(crate) fn backend(&self) -> Backend {
        self.backend
    }

    /// Outputs per register block of the interior loop; time chunks are
    /// made multiples of it.
    pub(crate) fn block_outputs(&self) -> usize {
        self.block
    }

    /// Outputs `l0 .. l0 + y.len()` of the row whose input is `x_row`
    /// (`geom.in_len` samples) and filter `taps` (`kernel_size` of them).
    ///
    /// The caller keeps `l0 + y.len()` within the row's output length
    /// (outputs past it would be computed as if the padding went on).
    ///
    /// # Panics
    /// If `x_row` or `taps` have the wrong length.
    #[inline]
    pub(crate) fn row(
        &self,
        geom: &RowGeom,
        x_row: &[f32],
        taps: &[f32],
        bias: f32,
        l0: usize,
        y: &mut [f32],
    ) {
        assert_eq!(taps.len(), self.kernel_size, "taps");
        // SAFETY: `new` built `f` for the backend of an `Isa`, which this
        // CPU has (only detection makes one). Everything else `f` relies on
        // it checks itself (`row_generic`).
        unsafe { (self.f)(geom, x_row, taps, bias, l0, y) }
    }
}

/// Outputs `l0 .. l0 + y.len()` of one row (see [`RowKernel::row`]).
/// `K == 0` reads the tap count from `taps`; otherwise `taps.len() == K`.
///
/// # Safety
/// `S`'s CPU features must be present. Slice lengths are checked here.
#[inline(always)]
unsafe fn row_generic<S: Simd, const K: usize, const R: usize, const Q: usize>(
    geom: &RowGeom,
    x: &[f32],
    taps: &[f32],
    bias: f32,
    l0: usize,
    y: &mut [f32],
) {
    let RowGeom {
        in_len,
        pad_left,
        dilation,
    } = *geom;
    assert!(K == 0 || taps.len() == K, "taps");
    assert_eq!(x.len(), in_len, "x row");
    let span = (taps.len() - 1) * dilation;
    // Outputs whose taps all read real samples: l >= pad_left and
    // l + span - pad_left < in_len. Never past the row's end: out_len =
    // in_len + pad_left + pad_right - span.
    let (interior_lo, interior_hi) = (pad_left, (in_len + pad_left).saturating_sub(span));
    let (c0, c1) = (l0, l0 + y.len());
    let a = interior_lo.clamp(c0, c1);
    let b = interior_hi.clamp(a, c1);

    let has_edges = a - c0 + c1 - b > 0;
    if has_edges
        && !scalar_edges(span, Q)
        && y.len() <= WINDOWED_ROW
        && !edge_window_too_small(span + y.len())
    {
        // A short row whose edges would be windowed: one window for all of
        // it rather than two windows and an interior in between.
        // SAFETY: as for the edges below.
        unsafe { windowed::<S, K, R, Q>(geom, x, taps, bias, c0, y) };
        return;
    }
    let (y_left, rest) = y.split_at_mut(a - c0);
    let (y_mid, y_right) = rest.split_at_mut(b - a);
    // SAFETY: S's features are present (our caller's contract).
    unsafe { edges::<S, K, R, Q>(geom, x, taps, bias, c0, y_left) };
    if !y_mid.is_empty() {
        // a >= pad_left, and the samples read, a - pad_left .. b - pad_left
        // + span, end at or before in_len because b <= interior_hi.
        let xs = &x[a - pad_left..];
        assert!(xs.len() >= y_mid.len() + span);
        // SAFETY: xs holds the y_mid.len() + span samples the interior
        // reads; y_mid is writable for its length; features as above.
        unsafe {
            interior::<S, K, R, Q>(
                xs.as_ptr(),
                taps,
                dilation,
                bias,
                y_mid.as_mut_ptr(),
                y_mid.len(),
            );
        }
    }
    // SAFETY: as for the left edge.
    unsafe { edges::<S, K, R, Q>(geom, x, taps, bias, b, y_right) };
}

/// Floats of the on-stack window that edges are computed in.
const EDGE_BUF: usize = 512;
/// Tap spans up to this compute edges scalar (few, short outputs), outside
/// the grouped kernel.
const SCALAR_EDGE_SPAN: usize = 8;

/// Whether edges of a filter spanning `span` samples run scalar, for the
/// interior kernel of `Q` tap groups: short spans do, except in the
/// grouped kernel (`Q > 0`, from `K = 9`), whose vector window beats `K - 1`
/// scalar edge outputs of up to `K - 1` taps each. Measured, one AVX-512
/// thread, C = 128, K = 9, "same" padding, windowed against scalar: N = 16
/// 11.5 -> 4.7 µs, 32 8.5 -> 4.9, 64 9.4 -> 6.3, 256 17.0 -> 13.8; at K =
/// 6 (not grouped) the window lost from N = 64 (4.9 -> 5.6 µs).
fn scalar_edges(span: usize, q: usize) -> bool {
    q == 0 && span <= SCALAR_EDGE_SPAN
}
/// Rows (or parts) of at most this many outputs whose edges are windowed
/// are computed whole in one window. Measured on one AVX-512 core, C = 512,
/// K = 32: 35 -> 77 GFLOP/s at N = 64, 128 -> 139 at N = 256. (With scalar
/// edges, K <= 9, one window was slower: 27 -> 20 GFLOP/s at K = 4, N = 64.)
const WINDOWED_ROW: usize = 256;

/// Whether a filter spanning `span` samples beyond its first has its edges
/// computed scalar because the span is too long for the edge window (short
/// spans are scalar too, but cheaply).
pub(crate) fn edge_window_too_small(span: usize) -> bool {
    span + MAX_LANES > EDGE_BUF
}

/// The widest vector of any backend.
const MAX_LANES: usize = 16;

/// Outputs `e0 .. e0 + y.len()` where some tap may read padding.
///
/// Short spans run [`edge`] per output. Longer ones (up to what
/// [`EDGE_BUF`] holds) copy the padded input window into a zero-filled
/// buffer on the stack and run the vector [`interior`] on it, so that long
/// filters' edges (`span` outputs of up to `K` taps each) stay fast; there
/// the padding taps add `w * 0`, as an explicitly padded convolution does,
/// instead of being skipped (the same for finite weights).
///
/// # Safety
/// `S`'s CPU features must be present.
#[inline(always)]
unsafe fn edges<S: Simd, const K: usize, const R: usize, const Q: usize>(
    geom: &RowGeom,
    x: &[f32],
    taps: &[f32],
    bias: f32,
    e0: usize,
    y: &mut [f32],
) {
    if y.is_empty() {
        return;
    }
    let span = (taps.len() - 1) * geom.dilation;
    if scalar_edges(span, Q) || edge_window_too_small(span) {
        for (l, out) in (e0..).zip(y) {
            // SAFETY: S's features are present (our caller's contract).
            *out = unsafe { edge::<S>(geom, x, taps, bias, l) };
        }
        return;
    }
    // SAFETY: as ours.
    unsafe { windowed::<S, K, R, Q>(geom, x, taps, bias, e0, y) };
}

/// Outputs `e0 .. e0 + y.len()` computed by [`interior`] on copies of the
/// padded input in a zero-filled window on the stack (see [`edges`]).
///
/// # Safety
/// `S`'s CPU features must be present; `span + MAX_LANES <= EDGE_BUF`.
#[inline(always)]
unsafe fn windowed<S: Simd, const K: usize, const R: usize, const Q: usize>(
    geom: &RowGeom,
    x: &[f32],
    taps: &[f32],
    bias: f32,
    e0: usize,
    y: &mut [f32],
) {
    let RowGeom {
        in_len,
        pad_left,
        dilation,
    } = *geom;
    let span = (taps.len() - 1) * dilation;
    // Left uninitialised: zeroing all of it would cost more than a short
    // row's outputs (each window writes the part it reads).
    let mut buf = [MaybeUninit::<f32>::uninit(); EDGE_BUF];
    let window = EDGE_BUF - span;
    for (l, y_win) in (e0..).step_by(window).zip(y.chunks_mut(window)) {
        // Padded positions l .. l + len; the real samples are at padded
        // positions pad_left .. pad_left + in_len.
        let len = y_win.len() + span;
        let buf = &mut buf[..len];
        let lo = pad_left.clamp(l, l + len);
        let hi = (pad_left + in_len).clamp(lo, l + len);
        buf[..lo - l].fill(MaybeUninit::new(0.0));
        for (b, &v) in buf[lo - l..hi - l]
            .iter_mut()
            .zip(&x[lo - pad_left..hi - pad_left])
        {
            b.write(v);
        }
        buf[hi - l..].fill(MaybeUninit::new(0.0));
        // SAFETY: the three writes above initialised all of buf, which
        // holds y_win.len() + span values; y_win is writable for its
        // length, and the features are present.
        unsafe {
            interior::<S, K, R, Q>(
                buf.as_ptr().cast::<f32>(),
                taps,
                dilation,
                bias,
                y_win.as_mut_ptr(),
                y_win.len(),
            );
        }
    }
}

/// Output `l` summed over exactly the taps that read real samples
/// (bounds-checked indexing: edges are short).
///
/// # Safety
/// `S`'s CPU features must be present.
#[inline(always)]
unsafe fn edge<S: Simd>(geom: &RowGeom, x: &[f32], taps: &[f32], bias: f32, l: usize) -> f32 {
    let RowGeom {
        in_len,
        pad_left,
        dilation,
    } = *geom;
    // Tap k reads x[l + k * dilation - pad_left]; valid for k >= first and
    // k * dilation <= in_len - 1 + pad_left - l. Dilation 1 skips the
    // divisions, which would dominate short rows.
    let Some(reach) = (in_len + pad_left).checked_sub(l + 1) else {
        return bias;
    };
    let before = pad_left.saturating_sub(l);
    let (first, last) = if dilation == 1 {
        (before, reach)
    } else {
        (before.div_ceil(dilation), reach / dilation)
    };
    let end = (last + 1).min(taps.len());
    let mut acc = bias;
    for k in first..end {
        // SAFETY: S's features are present (our caller's contract).
        acc = unsafe { S::mul_add_scalar(acc, taps[k], x[l + k * dilation - pad_left]) };
    }
    acc
}

/// `y[i] = bias + sum_k taps[k] * x[i + k * dilation]` for `i < n`.
///
/// # Safety
/// `S`'s CPU features must be present; `x` must be valid for reading
/// `n + (taps.len() - 1) * dilation` values and `y` for writing `n`; if
/// `K != 0`, `taps.len() == K`.
#[inline(always)]
unsafe fn interior<S: Simd, const K: usize, const R: usize, const Q: usize>(
    x: *const f32,
    taps: &[f32],
    dilation: usize,
    bias: f32,
    y: *mut f32,
    n: usize,
) {
    let lanes = S::LANES;
    // SAFETY: the features are present, and every access is in bounds: a
    // block of r vectors at i reads r * lanes values from each x + i + k *
    // dilation (k < taps.len()) and writes r * lanes values at y + i, and
    // is only taken with i + r * lanes <= n, so it stays within the n + span
    // readable and n writable values; scalar steps have i < n.
    unsafe {
        let b = S::splat(bias);
        let mut i = 0;
        let full = R * lanes;
        // Schedule, the same for both tap modes: full blocks; then, if a
        // full block fits in the row, one more ending at n (overlapping the
        // last, same values); otherwise halving blocks and single vectors,
        // the last one ending at n. Each vector keeps independent FMA chains.
        if K != 0 {
            // Taps broadcast once, held in registers for the whole interior.
            let mut w = [b; K];
            for (wk, &t) in w.iter_mut().zip(taps) {
                *wk = S::splat(t);
            }
            while i + full <= n {
                block::<S, K, R>(x.add(i), &w, dilation, b, y.add(i));
                i += full;
            }
            if i < n && n >= full {
                let i = n - full;
                block::<S, K, R>(x.add(i), &w, dilation, b, y.add(i));
            } else if i < n && n >= lanes {
                if R > 4 && i + 4 * lanes <= n {
                    block::<S, K, 4>(x.add(i), &w, dilation, b, y.add(i));
                    i += 4 * lanes;
                }
                if R > 2 && i + 2 * lanes <= n {
                    block::<S, K, 2>(x.add(i), &w, dilation, b, y.add(i));
                    i += 2 * lanes;
                }
                while i + lanes <= n {
                    block::<S, K, 1>(x.add(i), &w, dilation, b, y.add(i));
                    i += lanes;
                }
                if i < n {
                    let i = n - lanes;
                    block::<S, K, 1>(x.add(i), &w, dilation, b, y.add(i));
                }
            }
        } else if Q != 0 {
            // Taps in groups of LANES, each load shared by the Q taps
            // LANES apart (dilation 1).
            // The rest in halving blocks rather than one overlapping full
            // block, which would recompute up to R - 1 vectors (every
            // block size sums in the same order).
            while i + full <= n {
                block_grouped::<S, R, Q>(x.add(i), taps, b, y.add(i));
                i += full;
            }
            if i < n && n >= lanes {
                if R > 8 && i + 8 * lanes <= n {
                    block_grouped::<S, 8, Q>(x.add(i), taps, b, y.add(i));
                    i += 8 * lanes;
                }
                if R > 4 && i + 4 * lanes <= n {
                    block_grouped::<S, 4, Q>(x.add(i), taps, b, y.add(i));
                    i += 4 * lanes;
                }
                if R > 2 && i + 2 * lanes <= n {
                    block_grouped::<S, 2, Q>(x.add(i), taps, b, y.add(i));
                    i += 2 * lanes;
                }
                while i + lanes <= n {
                    block_grouped::<S, 1, Q>(x.add(i), taps, b, y.add(i));
                    i += lanes;
                }
                if i < n {
                    let i = n - lanes;
                    block_grouped::<S, 1, Q>(x.add(i), taps, b, y.add(i));
                }
            }
        } else {
            // Taps broadcast from memory once per block.
            while i + full <= n {
                block_dyn::<S, R>(x.add(i), taps, dilation, b, y.add(i));
                i += full;
            }
            if i < n && n >= full {
                let i = n - full;
                block_dyn::<S, R>(x.add(i), taps, dilation, b, y.add(i));
            } else if i < n && n >= lanes {
                if R > 4 && i + 4 * lanes <= n {
                    block_dyn::<S, 4>(x.add(i), taps, dilation, b, y.add(i));
                    i += 4 * lanes;
                }
                if R > 2 && i + 2 * lanes <= n {
                    block_dyn::<S, 2>(x.add(i), taps, dilation, b, y.add(i));
                    i += 2 * lanes;
                }
                while i + lanes <= n {
                    block_dyn::<S, 1>(x.add(i), taps, dilation, b, y.add(i));
                    i += lanes;
                }
                if i < n {
                    let i = n - lanes;
                    block_dyn::<S, 1>(x.add(i), taps, dilation, b, y.add(i));
                }
            }
        }
        // Fewer outputs than one vector: scalar.
        if n < lanes {
            for i in 0..n {
                let mut acc = bias;
                for (k, &t) in taps.iter().enumerate() {
                    acc = S::mul_add_scalar(acc, t, *x.add(i + k * dilation));
                }
                *y.add(i) = acc;
            }
        }
    }
}

/// `R` vectors of outputs at `y` from the taps `w` held in registers:
/// `y[j] = b + sum_k w[k] * x[j + k * dilation]`, `j < R * LANES`, taps in
/// ascending order.
///
/// # Safety
/// `S`'s features are present; `x` is readable for `R * LANES + (K - 1) *
/// dilation` values and `y` writable for `R * LANES`.
#[inline(always)]
unsafe fn block<S: Simd, const K: usize, const R: usize>(
    x: *const f32,
    w: &[S::V; K],
    dilation: usize,
    b: S::V,
    y: *mut f32,
) {
    // SAFETY: in bounds and with the features present, by the contract.
    unsafe {
        let mut acc = [b; R];
        for (k, &wk) in w.iter().enumerate() {
            let xk = x.add(k * dilation);
            for (r, a) in acc.iter_mut().enumerate() {
                *a = S::mul_add(*a, wk, S::load(xk.add(r * S::LANES)));
            }
        }
        for (r, &a) in acc.iter().enumerate() {
            S::store(y.add(r * S::LANES), a);
        }
    }
}

/// As [`block_dyn`] at dilation 1, for `LANES * (Q - 1) < K <= LANES *
/// Q` taps, with the taps taken in groups: tap `k = LANES * q + s`, for `s`
/// ascending, then `q` ascending. The vector loaded at offset `LANES * j +
/// s` serves tap `LANES * q + s` of output vector `j - q` for every `q`, so
/// each load feeds up to `Q` multiply-adds instead of one: the kernel is
/// bound by the FMAs rather than by unaligned loads (measured 1.9 times
/// [`block_dyn`] at `K = 32` on AVX-512). Every output sums its taps in
/// this same order whatever `R`.
///
/// # Safety
/// As [`block`], with `K = taps.len()` and dilation 1.
#[inline(always)]
unsafe fn block_grouped<S: Simd, const R: usize, const Q: usize>(
    x: *const f32,
    taps: &[f32],
    b: S::V,
    y: *mut f32,
) {
    let lanes = S::LANES;
    let k = taps.len();
    debug_assert!(lanes * (Q - 1) < k && k <= lanes * Q);
    // Offsets s < full have all Q taps; the others Q - 1.
    let full = k - lanes * (Q - 1);
    // SAFETY: in bounds and with the features present, by the contract
    // (see `grouped_step`).
    unsafe {
        let mut acc = [b; R];
        for s in 0..full {
            grouped_step::<S, R, Q, true>(x, taps, s, &mut acc);
        }
        for s in full..lanes {
            grouped_step::<S, R, Q, false>(x, taps, s, &mut acc);
        }
        for (r, &a) in acc.iter().enumerate() {
            S::store(y.add(r * S::LANES), a);
        }
    }
}

/// The taps `LANES * q + s` of [`block_grouped`] for one `s`: all `Q`
/// groups when `LAST`, else the first `Q - 1`. Every condition is known at
/// compile time once the loops are unrolled, so the accumulators stay in
/// registers.
///
/// # Safety
/// As [`block_grouped`]; `LANES * (Q - 1) + s < K` when `LAST`. The load
/// at `LANES * j + s` is only taken when it serves some tap `LANES * q + s
/// < K` of some vector `j - q < R`, so it ends at or before `R * LANES + K
/// - 1`.
#[inline(always)]
unsafe fn grouped_step<S: Simd, const R: usize, const Q: usize, const LAST: bool>(
    x: *const f32,
    taps: &[f32],
    s: usize,
    acc: &mut [S::V; R],
) {
    let lanes = S::LANES;
    let groups = if LAST { Q } else { Q - 1 };
    if groups == 0 {
        return;
    }
    // SAFETY: by the contract.
    unsafe {
        let mut w = [acc[0]; Q];
        for (q, wq) in w.iter_mut().enumerate().take(groups) {
            *wq = S::splat(*taps.get_unchecked(lanes * q + s));
        }
        for j in 0..R + Q - 1 {
            // Groups q with 0 <= j - q < R and q < groups.
            if j >= R + groups - 1 {
                continue;
            }
            let v = S::load(x.add(lanes * j + s));
            for (q, &wq) in w.iter().enumerate().take(groups) {
                if q <= j && j - q < R {
                    acc[j - q] = S::mul_add(acc[j - q], wq, v);
                }
            }
        }
    }
}

/// As [`block`], with the taps read (and broadcast) from `taps`.
///
/// # Safety
/// As [`block`], with `K = taps.len()`.
#[inline(always)]
unsafe fn block_dyn<S: Simd, const R: usize>(
    x: *const f32,
    taps: &[f32],
    dilation: usize,
    b: S::V,
    y: *mut f32,
) {
    // SAFETY: in bounds and with the features present, by the contract.
    unsafe {
        let mut acc = [b; R];
        for (k, &t) in taps.iter().enumerate() {
            let wk = S::splat(t);
            let xk = x.add(k * dilation);
            for (r, a) in acc.iter_mut().enumerate() {
                *a = S::mul_add(*a, wk, S::load(xk.add(r * S::LANES)));
            }
        }
        for (r, &a) in acc.iter().enumerate() {
            S::store(y.add(r * S::LANES), a);
        }
    }
}

per_backend! {
    /// [`row_generic`] on one backend, taps ungrouped.
    unsafe fn [row_portable, row_avx2, row_avx512, row_neon]<const K: usize, const R: usize>(
        geom: &RowGeom,
        x: &[f32],
        taps: &[f32],
        bias: f32,
        l0: usize,
        y: &mut [f32],
    ) => row_generic::<S, K, R, 0>
}

/// [`row_generic`] with the taps in `Q` groups of 16 ([`block_grouped`]),
/// for the AVX-512 backend (16 lanes), the one that groups.
///
/// # Safety
/// As [`row_generic`]; the taps' count and the dilation are checked here.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn row_grouped_generic<S: Simd, const Q: usize>(
    geom: &RowGeom,
    x: &[f32],
    taps: &[f32],
    bias: f32,
    l0: usize,
    y: &mut [f32],
) {
    assert!(geom.dilation == 1 && 16 * (Q - 1) < taps.len() && taps.len() <= 16 * Q);
    // SAFETY: our caller guarantees `S`'s features; the taps and dilation
    // suit block_grouped (asserted).
    unsafe { row_generic::<S, 0, AVX512_GROUPED_R, Q>(geom, x, taps, bias, l0, y) }
}

per_backend! {
    /// [`row_grouped_generic`] on AVX-512 alone.
    unsafe fn [_, _, row_avx512_grouped, _]<const Q: usize>(
        geom: &RowGeom,
        x: &[f32],
        taps: &[f32],
        bias: f32,
        l0: usize,
        y: &mut [f32],
    ) => row_grouped_generic::<S, Q>
}
