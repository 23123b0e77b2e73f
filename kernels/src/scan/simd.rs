//! x86-64 intrinsics of the scan: the only unsafe code in it.
//!
//! * [`transpose4`]: the SSE 4 x 4 transpose of the portable kernels'
//!   tiles (SSE is part of the x86-64 baseline).
//! * [`Avx2`]: the in-register scan of one row, for CPUs with AVX2 and FMA
//!   (an instruction set `crate::simd` checked that has them).
//!
//! # The in-register scan
//!
//! A row is read 8 consecutive steps at a time, one vector of `a` and one
//! of `u`, and three Hillis-Steele levels turn them into the block's prefix
//! maps: lane `i` ends up with `P[i] = a[i] * ... * a[0]` and `S[i]`, the
//! state after step `i` from a zero state at the block's start. The
//! block's outputs are then `y = P * c + S` (one FMA) for the state `c`
//! before the block, broadcast. Level `k` combines each lane `i >= k` with
//! lane `i - k`: `S[i] += P[i] * S[i - k]`, then `P[i] *= P[i - k]`.
//! Levels 1 and 2 work within each 128-bit half (byte shifts, one
//! in-lane shuffle each, which fill with the zeros `S` needs; ones are ORed
//! into `P`), level 3 combines the upper half with lane 3 (a lane permute
//! and a blend). The state after the block is lane 7, computed as
//! `P[7] * c + S[7]` from broadcasts of `P[7]` and `S[7]` that do not
//! depend on `c`, so the dependency chain from block to block is one FMA.
//! Per 8 elements that is 8 shuffles, 9 multiply-adds, 2 blends, 2 ORs and
//! the checks below, with no transposes: loads and stores are contiguous,
//! and a thread streams `a`, `u` and `y` in order. Shuffles are what bound
//! it (measured 0.25 ns per element on one Zen 5 core from L1, against
//! 1.45 ns for the plain loop's latency chain). Stepping rows together
//! (8 x 8 transposes) would cost more shuffles per element. Measured and
//! not taken: an AVX-512 version (two 8-step scans per vector, masked
//! permutes; 0.21 ns from L1, 10-20% faster from L3) needs the AVX-512
//! intrinsics stabilized in Rust 1.89, which this module does not assume;
//! two rows per vector, 4 steps each (no lane-crossing shuffles; 0.20 ns
//! from L1) streams six arrays at once and was no faster from L3 or DRAM
//! in the runs we could take on a shared machine.
//!
//! Outputs too large for the caches are written with non-temporal stores
//! (`scan_rows` with `stream`; see [`scan_row_impl`]): the scan is then
//! bound by memory bandwidth, and not reading each line of `y` before
//! overwriting it moves three streams instead of four.
//!
//! This reassociates the recurrence, so results differ from the sequential
//! loop by rounding, a few `f32` epsilons of the terms' magnitudes (like
//! the blocked portable scans). Two things could make the reassociated
//! form worse than rounding; both are detected per group of [`GROUP`]
//! steps, which is then recomputed by the plain loop from the group's
//! start state:
//!
//! * products of `a` that underflow: a partial product spans at most 8
//!   steps, so none can be subnormal or flush to 0 unless some `a` in the
//!   group is nonzero with `|a| < 2^-15` (`2^-120` is still normal). Such
//!   an `a` flags the group. Zeros do not: the products they make are exact.
//! * anything not finite in the group's `y` (a product or sum that
//!   overflowed, `inf * 0`, NaN or infinity in the inputs), so that
//!   non-finite results are always the plain loop's. Non-finite values
//!   never turn finite under `+` and `*`, so every one shows in `y`.

#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;

use crate::simd::{Backend, Isa};

/// `out[j][i] = rows[i][j]`, in eight shuffles (compilers left alone emit
/// twelve, and shuffles are the scarce port in the portable kernels).
#[inline(always)]
pub(super) fn transpose4(rows: [&[f32; 4]; 4], out: [&mut [f32; 4]; 4]) {
    // SAFETY: SSE is part of the x86-64 baseline, so the intrinsics are
    // available; every load reads and every store writes exactly the four
    // `f32`s behind a reference of type `[f32; 4]`, which is valid for that
    // (unaligned access is what `loadu`/`storeu` do).
    unsafe {
        let r0 = _mm_loadu_ps(rows[0].as_ptr());
        let r1 = _mm_loadu_ps(rows[1].as_ptr());
        let r2 = _mm_loadu_ps(rows[2].as_ptr());
        let r3 = _mm_loadu_ps(rows[3].as_ptr());
        let lo01 = _mm_unpacklo_ps(r0, r1);
        let lo23 = _mm_unpacklo_ps(r2, r3);
        let hi01 = _mm_unpackhi_ps(r0, r1);
        let hi23 = _mm_unpackhi_ps(r2, r3);
        let [o0, o1, o2, o3] = out;
        _mm_storeu_ps(o0.as_mut_ptr(), _mm_movelh_ps(lo01, lo23));
        _mm_storeu_ps(o1.as_mut_ptr(), _mm_movehl_ps(lo23, lo01));
        _mm_storeu_ps(o2.as_mut_ptr(), _mm_movelh_ps(hi01, hi23));
        _mm_storeu_ps(o3.as_mut_ptr(), _mm_movehl_ps(hi23, hi01));
    }
}

/// Lanes of an AVX vector of `f32`.
const V: usize = 8;

/// Steps per group: the unit of the fallback checks (see the module docs).
pub(super) const GROUP: usize = 8 * V;

/// `a` with `0 < |a| < 2^-15` flags a group: `2 * bits(a) - 1`, wrapping,
/// is then below `2 * bits(2^-15) - 1` (as `u32`), while `a = ±0` gives
/// `u32::MAX`.
const TINY_BELOW: u32 = 2 * ((127 - 15) << 23);

/// Proof that this CPU has AVX2 and FMA: only [`Avx2::of`] makes one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Avx2(());

impl Avx2 {
    /// `Some` if `isa` has AVX2 and FMA (the AVX2 and AVX-512 backends,
    /// which an [`Isa`] names only where this CPU has them).
    pub(super) fn of(isa: Isa) -> Option<Avx2> {
        (isa.backend() >= Backend::Avx2).then_some(Avx2(()))
    }

    /// One row from state `s` (see the module docs); returns the final
    /// state (`s` if empty).
    ///
    /// # Panics
    ///
    /// If `a`, `u` and `y` differ in length.
    #[inline]
    pub(super) fn scan_row(self, s: f32, a: &[f32], u: &[f32], y: &mut [f32]) -> f32 {
        assert!(a.len() == y.len() && u.len() == y.len(), "row lengths");
        // SAFETY: `self` exists only where the CPU has AVX2 and FMA; the
        // lengths are checked above.
        unsafe { scan_row_avx2(s, a, u, y) }
    }

    /// The rows of a contiguous `[rows, len]` block (`rows = x0.len()`),
    /// one after the other, each as [`scan_row`](Self::scan_row) scans it.
    /// With `stream`, `y` is written with non-temporal stores (see
    /// [`scan_row_impl`]), for outputs too large for the caches.
    ///
    /// # Panics
    ///
    /// If `a`, `u` and `y` differ in length or are not `rows` rows.
    pub(super) fn scan_rows(self, x0: &[f32], a: &[f32], u: &[f32], y: &mut [f32], stream: bool) {
        let rows = x0.len();
        if rows == 0 {
            return;
        }
        let len = y.len() / rows;
        assert!(
            a.len() == y.len() && u.len() == y.len() && y.len() == rows * len,
            "block lengths"
        );
        // SAFETY: `self` exists only where the CPU has AVX2 and FMA; the
        // lengths are checked above.
        unsafe {
            if stream {
                scan_rows_avx2::<true>(x0, a, u, y, len)
            } else {
                scan_rows_avx2::<false>(x0, a, u, y, len)
            }
        }
    }
}

/// The plain loop, `y[t] = a[t] * s + u[t]`, over `n` steps from `s`;
/// returns the final state.
///
/// # Safety
///
/// `a` and `u` valid for `n` reads, `y` for `n` writes.
#[inline(always)]
unsafe fn plain(mut s: f32, a: *const f32, u: *const f32, y: *mut f32, n: usize) -> f32 {
    for t in 0..n {
        // SAFETY: t < n (our caller's contract).
        unsafe {
            s = *a.add(t) * s + *u.add(t);
            *y.add(t) = s;
        }
    }
    s
}

/// Vector constants of the kernel, hidden from the optimizer (see
/// [`Consts::new`]).
#[derive(Clone, Copy)]
struct Consts {
    ones: __m256,
    zero: __m256,
    /// `1.0` in lane 0 of each half, zero bits elsewhere.
    one_lo1: __m256,
    /// `1.0` in lanes 0 and 1 of each half, zero bits elsewhere.
    one_lo2: __m256,
    /// Lane indices `[0, 0, 0, 0, 3, 3, 3, 3]`.
    lane3_hi: __m256i,
    /// Lane index 7 in every lane.
    lane7: __m256i,
}

impl Consts {
    /// The constants, passed through [`std::hint::black_box`]: LLVM
    /// otherwise rewrites shuffles with known constants or constant indices
    /// into sequences it deems cheaper (a lane broadcast into two shuffles,
    /// a shift with ones blended in into two `vshufps`), which doubled the
    /// shuffles per vector (measured 17% slower). Made once per call.
    ///
    /// # Safety
    ///
    /// AVX present.
    #[inline(always)]
    unsafe fn new() -> Consts {
        // SAFETY: register-only AVX intrinsics; our caller guarantees AVX.
        let c = unsafe {
            Consts {
                ones: _mm256_set1_ps(1.0),
                zero: _mm256_setzero_ps(),
                one_lo1: _mm256_setr_ps(1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0),
                one_lo2: _mm256_setr_ps(1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0),
                lane3_hi: _mm256_setr_epi32(0, 0, 0, 0, 3, 3, 3, 3),
                lane7: _mm256_set1_epi32(7),
            }
        };
        std::hint::black_box(c)
    }
}

/// The prefix maps `(P, S)` of the 8 steps `(a, u)` (see the module docs).
///
/// # Safety
///
/// AVX2 and FMA present.
#[inline(always)]
unsafe fn prefix8(k: &Consts, a: __m256, u: __m256) -> (__m256, __m256) {
    // SAFETY: register-only intrinsics of AVX2 and FMA, which our caller
    // guarantees.
    unsafe {
        let (mut p, mut s) = (a, u);
        // Level 1: lanes shift up by one within each half (byte shifts
        // fill with zeros, which S needs), and P gets ones ORed in.
        let shift1 =
            |v: __m256| _mm256_castsi256_ps(_mm256_slli_si256::<4>(_mm256_castps_si256(v)));
        let ps = _mm256_or_ps(shift1(p), k.one_lo1);
        s = _mm256_fmadd_ps(p, shift1(s), s);
        p = _mm256_mul_ps(p, ps);
        // Level 2: by two.
        let shift2 =
            |v: __m256| _mm256_castsi256_ps(_mm256_slli_si256::<8>(_mm256_castps_si256(v)));
        let ps = _mm256_or_ps(shift2(p), k.one_lo2);
        s = _mm256_fmadd_ps(p, shift2(s), s);
        p = _mm256_mul_ps(p, ps);
        // Level 3: the upper half combines with lane 3.
        let ps = _mm256_blend_ps::<0x0F>(_mm256_permutevar8x32_ps(p, k.lane3_hi), k.ones);
        let ss = _mm256_blend_ps::<0x0F>(_mm256_permutevar8x32_ps(s, k.lane3_hi), k.zero);
        s = _mm256_fmadd_ps(p, ss, s);
        p = _mm256_mul_ps(p, ps);
        (p, s)
    }
}

/// Scans `NV` vectors of steps from `c` (the state, broadcast), writing
/// `y`, and returns the state after them, broadcast, and whether the group
/// is flagged (see the module docs).
///
/// # Safety
///
/// AVX2 and FMA present; `a` and `u` valid for `NV * V` reads, `y` for
/// `NV * V` writes, and 32-byte aligned if `STREAM`.
#[inline(always)]
unsafe fn group<const NV: usize, const STREAM: bool>(
    k: &Consts,
    mut c: __m256,
    a: *const f32,
    u: *const f32,
    y: *mut f32,
) -> (__m256, bool) {
    // SAFETY: AVX2 and FMA are present, and the loads and stores touch
    // elements `0..NV * V` of the pointers (our caller's contract).
    unsafe {
        let one = _mm256_set1_epi32(1);
        let mut amin = _mm256_set1_epi32(-1);
        let mut bad = k.zero;
        for v in 0..NV {
            let av = _mm256_loadu_ps(a.add(v * V));
            let uv = _mm256_loadu_ps(u.add(v * V));
            let twice = _mm256_slli_epi32::<1>(_mm256_castps_si256(av));
            amin = _mm256_min_epu32(amin, _mm256_sub_epi32(twice, one));
            let (p, s) = prefix8(k, av, uv);
            let p7 = _mm256_permutevar8x32_ps(p, k.lane7);
            let s7 = _mm256_permutevar8x32_ps(s, k.lane7);
            let yv = _mm256_fmadd_ps(p, c, s);
            c = _mm256_fmadd_ps(p7, c, s7);
            // y * 0 is 0 for finite y and NaN otherwise, which then sticks.
            bad = _mm256_fmadd_ps(yv, k.zero, bad);
            if STREAM {
                _mm256_stream_ps(y.add(v * V), yv);
            } else {
                _mm256_storeu_ps(y.add(v * V), yv);
            }
        }
        // amin < TINY_BELOW - 1 (unsigned) iff min(amin, TINY_BELOW - 2)
        // equals amin.
        let tiny = _mm256_cmpeq_epi32(
            _mm256_min_epu32(amin, _mm256_set1_epi32((TINY_BELOW - 2) as i32)),
            amin,
        );
        let nonfinite = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(bad, bad));
        let flags = _mm256_or_si256(tiny, nonfinite);
        (c, _mm256_testz_si256(flags, flags) == 0)
    }
}

/// [`Avx2::scan_row`].
///
/// # Safety
///
/// AVX2 and FMA present; `a`, `u` and `y` of the same length.
#[target_feature(enable = "avx2,fma")]
unsafe fn scan_row_avx2(s: f32, a: &[f32], u: &[f32], y: &mut [f32]) -> f32 {
    // SAFETY: our caller's contract.
    unsafe {
        let k = Consts::new();
        scan_row_impl::<false>(&k, s, a.as_ptr(), u.as_ptr(), y.as_mut_ptr(), y.len())
    }
}

/// [`Avx2::scan_rows`].
///
/// # Safety
///
/// AVX2 and FMA present; `a`, `u` and `y` hold `x0.len() * len` elements.
#[target_feature(enable = "avx2,fma")]
unsafe fn scan_rows_avx2<const STREAM: bool>(
    x0: &[f32],
    a: &[f32],
    u: &[f32],
    y: &mut [f32],
    len: usize,
) {
    let (a, u, y) = (a.as_ptr(), u.as_ptr(), y.as_mut_ptr());
    // SAFETY: AVX2 and FMA are present, and row `r` is elements
    // `r * len .. (r + 1) * len` of slices of `x0.len() * len` elements.
    unsafe {
        let k = Consts::new();
        for (r, &s) in x0.iter().enumerate() {
            let at = r * len;
            scan_row_impl::<STREAM>(&k, s, a.add(at), u.add(at), y.add(at), len);
        }
        if STREAM {
            // Non-temporal stores are weakly ordered: make them visible
            // before the task reports completion to other threads.
            _mm_sfence();
        }
    }
}

/// One row, inlined into [`scan_row_avx2`] and [`scan_rows_avx2`].
///
/// With `STREAM`, outputs are written with non-temporal stores, which skip
/// reading each line of `y` into the cache before overwriting it: a DRAM-
/// sized scan then moves three streams instead of four. Those stores need
/// 32-byte alignment, so the steps before `y`'s first aligned address run
/// the plain loop (the blocks start there instead, which changes rounding
/// only). The caller fences after its rows.
///
/// # Safety
///
/// AVX2 and FMA present; `a` and `u` valid for `n` reads, `y` for `n`
/// writes.
#[inline(always)]
unsafe fn scan_row_impl<const STREAM: bool>(
    k: &Consts,
    s: f32,
    a: *const f32,
    u: *const f32,
    y: *mut f32,
    n: usize,
) -> f32 {
    // SAFETY: AVX2 and FMA are present, and every pointer offset below
    // stays within the `n` elements of all three: groups and vectors run
    // while `t + GROUP <= n` or `t + V <= n`, the plain loop over the
    // remaining `n - t`.
    unsafe {
        let mut t = 0;
        let mut s = s;
        if STREAM {
            // f32s to the next 32-byte boundary (y is 4-byte aligned).
            t = ((y as usize).wrapping_neg() % 32 / 4).min(n);
            s = plain(s, a, u, y, t);
        }
        let mut c = _mm256_set1_ps(s);
        while t + GROUP <= n {
            let (a, u, y) = (a.add(t), u.add(t), y.add(t));
            let (next, flagged) = group::<{ GROUP / V }, STREAM>(k, c, a, u, y);
            c = if flagged {
                _mm256_set1_ps(plain(_mm256_cvtss_f32(c), a, u, y, GROUP))
            } else {
                next
            };
            t += GROUP;
        }
        while t + V <= n {
            let (a, u, y) = (a.add(t), u.add(t), y.add(t));
            let (next, flagged) = group::<1, STREAM>(k, c, a, u, y);
            c = if flagged {
                _mm256_set1_ps(plain(_mm256_cvtss_f32(c), a, u, y, V))
            } else {
                next
            };
            t += V;
        }
        plain(_mm256_cvtss_f32(c), a.add(t), u.add(t), y.add(t), n - t)
    }
}
