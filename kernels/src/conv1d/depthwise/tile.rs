//! The column kernel: a tile of outputs of a block of channels from a
//! window of input columns, vectorised across channels.
//!
//! Both buffers are laid out time-major (`[time][channel]`, `n` channels
//! per column), as the channels-last walk ([`super::columns`]) fills and
//! drains them:
//!
//! `out[l * n + c] = bias[c] + sum_j taps[j * tap_stride + c] * win[(l + j * dilation) * n + c]`
//!
//! for `l < m`, `c < n`. The window holds every input the tile reads, zero
//! columns standing for the padding, so there is no edge case: per vector
//! of channels the taps stay in registers (a compile-time tap count up to
//! 8) while the tile's outputs stream through. Each output is the bias,
//! then one multiply-add per tap in ascending order, fused on AVX-512, AVX2
//! and NEON and unfused in the portable backend (as the row kernels round).

#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

use crate::simd::Backend;
use crate::simd::{per_backend, Isa, Simd};

/// A tile's operands (see the module docs).
pub(super) struct Tile<'a> {
    pub n: usize,
    pub m: usize,
    pub dilation: usize,
    /// `taps[j * tap_stride + c]`: tap `j` of channel `c`.
    pub taps: &'a [f32],
    pub tap_stride: usize,
    pub bias: Option<&'a [f32]>,
    pub win: &'a [f32],
}

/// `f(tile, taps, out)`: unsafe only because it may be compiled for CPU
/// features that must be present ([`ColumnKernel`] guarantees they are)
/// and because it trusts the lengths [`ColumnKernel::run`] checked.
type TileFn = unsafe fn(&Tile, usize, &mut [f32]);

/// The column kernel for one backend and tap count, chosen at prepare.
#[derive(Clone, Copy)]
pub(super) struct ColumnKernel {
    kernel_size: usize,
    f: TileFn,
}

/// `$f::<K>` for the compile-time tap counts, `$f::<0>` (tap count read
/// at run time) otherwise.
macro_rules! by_taps {
    ($f:ident, $k:expr) => {
        match $k {
            1 => $f::<1> as TileFn,
            2 => $f::<2> as TileFn,
            3 => $f::<3> as TileFn,
            4 => $f::<4> as TileFn,
            5 => $f::<5> as TileFn,
            6 => $f::<6> as TileFn,
            7 => $f::<7> as TileFn,
            8 => $f::<8> as TileFn,
            _ => $f::<0> as TileFn,
        }
    };
}

impl ColumnKernel {
    /// The kernel for `kernel_size` taps on `isa`, or `None` for no taps.
    pub(super) fn new(isa: Isa, kernel_size: usize) -> Option<Self> {
        if kernel_size == 0 {
            return None;
        }
        let f = match isa.backend() {
            Backend::Portable => by_taps!(tile_portable, kernel_size),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 => by_taps!(tile_avx2, kernel_size),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512 => by_taps!(tile_avx512, kernel_size),
            #[cfg(target_arch = "aarch64")]
            Backend::Neon => by_taps!(tile_neon, kernel_size),
        };
        Some(ColumnKernel { kernel_size, f })
    }

    /// Computes the tile into `out[.. m * n]`.
    ///
    /// # Panics
    /// If a buffer is shorter than the tile needs.
    pub(super) fn run(&self, t: &Tile, out: &mut [f32]) {
        let k = self.kernel_size;
        let (n, m) = (t.n, t.m);
        if n == 0 || m == 0 {
            return;
        }
        let span = (k - 1) * t.dilation;
        assert!(t.win.len() >= (m + span) * n, "window too short");
        assert!(t.taps.len() >= (k - 1) * t.tap_stride + n, "taps too short");
        assert!(t.bias.is_none_or(|b| b.len() >= n), "bias too short");
        assert!(out.len() >= m * n, "output too short");
        // SAFETY: `new` only stores a function whose CPU features are
        // present, and the lengths its loads and stores rely on were
        // checked above.
        unsafe { (self.f)(t, k, out) }
    }
}

/// The tile on backend `S`, with `K` taps (or `k` when `K == 0`).
///
/// # Safety
/// `S`'s CPU features are present, and the buffers are as long as
/// [`ColumnKernel::run`] checks.
#[inline(always)]
unsafe fn tile_generic<S: Simd, const K: usize>(t: &Tile, k: usize, out: &mut [f32]) {
    let k = if K > 0 { K } else { k };
    let (n, m, dil, ts) = (t.n, t.m, t.dilation, t.tap_stride);
    let (taps, win, y) = (t.taps.as_ptr(), t.win.as_ptr(), out.as_mut_ptr());
    let full = n - n % S::LANES;
    for c in (0..full).step_by(S::LANES) {
        // SAFETY: for every load and store below, `c + LANES <= n`, and for
        // `l < m`, `j < k`: taps `j * ts + c + LANES <= (k - 1) * ts + n`,
        // window `(l + j * dil) * n + c + LANES <= (m + span) * n`, output
        // `l * n + c + LANES <= m * n`, bias `c + LANES <= n`: all within
        // the lengths `run` checked.
        unsafe {
            let b = match t.bias {
                Some(bias) => S::load(bias.as_ptr().add(c)),
                None => S::splat(0.0),
            };
            if K > 0 {
                let mut w = [S::splat(0.0); 8];
                for (j, w) in w.iter_mut().enumerate().take(K) {
                    *w = S::load(taps.add(j * ts + c));
                }
                for l in 0..m {
                    let mut acc = b;
                    for (j, &w) in w.iter().enumerate().take(K) {
                        acc = S::mul_add(acc, w, S::load(win.add((l + j * dil) * n + c)));
                    }
                    S::store(y.add(l * n + c), acc);
                }
            } else {
                for l in 0..m {
                    let mut acc = b;
                    for j in 0..k {
                        let w = S::load(taps.add(j * ts + c));
                        acc = S::mul_add(acc, w, S::load(win.add((l + j * dil) * n + c)));
                    }
                    S::store(y.add(l * n + c), acc);
                }
            }
        }
    }
    // The last `n % LANES` channels, one at a time, rounded as the vectors.
    for c in full..n {
        let b = t.bias.map_or(0.0, |b| b[c]);
        for l in 0..m {
            let mut acc = b;
            for j in 0..k {
                // SAFETY: as above; mul_add_scalar needs `S`'s features.
                acc = unsafe {
                    S::mul_add_scalar(acc, t.taps[j * ts + c], t.win[(l + j * dil) * n + c])
                };
            }
            out[l * n + c] = acc;
        }
    }
}

per_backend! {
    /// [`tile_generic`] on one backend.
    unsafe fn [tile_portable, tile_avx2, tile_avx512, tile_neon]<const K: usize>(
        t: &Tile,
        k: usize,
        out: &mut [f32],
    ) => tile_generic::<S, K>
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every backend, tap count (compile-time and run-time ones), channel
    /// count (full vectors and tails) and dilation against a plain loop.
    #[test]
    fn tiles_match_a_plain_loop_on_every_backend() {
        for isa in Isa::all_available() {
            let backend = isa.backend();
            for k in [1, 3, 4, 8, 9, 13] {
                let kernel = ColumnKernel::new(isa, k).unwrap();
                for (n, m, dilation) in [(1, 1, 1), (7, 3, 2), (16, 5, 1), (37, 33, 3), (64, 2, 1)]
                {
                    let span = (k - 1) * dilation;
                    let stride = n + 3;
                    let val = |i: usize| ((i * 7919) % 113) as f32 / 56.0 - 1.0;
                    let taps: Vec<f32> = (0..(k - 1) * stride + n).map(val).collect();
                    let win: Vec<f32> = (0..(m + span) * n).map(|i| val(i + 5)).collect();
                    let bias: Vec<f32> = (0..n).map(|i| val(i + 11)).collect();
                    for bias in [None, Some(bias.as_slice())] {
                        let tile = Tile {
                            n,
                            m,
                            dilation,
                            taps: &taps,
                            tap_stride: stride,
                            bias,
                            win: &win,
                        };
                        let mut out = vec![f32::NAN; m * n + 1];
                        kernel.run(&tile, &mut out);
                        for l in 0..m {
                            for c in 0..n {
                                let mut want = bias.map_or(0.0, |b| b[c]) as f64;
                                for j in 0..k {
                                    want += taps[j * stride + c] as f64
                                        * win[(l + j * dilation) * n + c] as f64;
                                }
                                let got = out[l * n + c] as f64;
                                assert!(
                                    (got - want).abs() < 1e-4,
                                    "{backend:?} k={k} n={n} m={m}: {got} vs {want}"
                                );
                            }
                        }
                        assert!(out[m * n].is_nan(), "wrote past the tile");
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "window too short")]
    fn a_short_window_is_refused_before_any_load() {
        let kernel = ColumnKernel::new(Isa::detect(), 3).unwrap();
        let tile = Tile {
            n: 16,
            m: 4,
            dilation: 1,
            taps: &[0.0; 48],
            tap_stride: 16,
            bias: None,
            win: &[0.0; 16 * 5],
        };
        kernel.run(&tile, &mut [0.0; 64]);
    }
}
