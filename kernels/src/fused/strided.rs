//! Columns of short rows: `out[i] = line[i * S]` (a gather) and
//! `rows[i * S + t] = cols[t][i]` (an interleave of `S` columns) for
//! strides `S` of 2 to 4.
//!
//! A decode step reads and writes its conv state, `[B, C, K - 1]`, a time
//! step (a column across the channels) at a time: one element in every
//! `K - 1`. Element by element those moves were most of a step's time
//! (a third of a 4096-channel conv step); whole vectors do them at the
//! speed of the loads. Gathers: AVX-512 permutes of `S` loaded vectors
//! into one, AVX2 permutes (`vpermps`) of each of `S` loaded vectors
//! blended into one, NEON's structure loads (`vld2q` .. `vld4q`).
//! Interleaves write the rows from all `S` columns at once, so they only
//! store: the same permutes and blends the other way, NEON's structure
//! stores (`vst2q` .. `vst4q`). A column scattered into the rows on its
//! own is a read-modify-write of every row vector, which LLVM compiles
//! into masked stores on AVX2 (`vmaskmovps`, so slow on Zen 3 that a
//! 1024-channel conv step spent half its time in it;
//! `tests/test_release_machine_code.py` refuses them), and element by
//! element it was a quarter of an LFM2 decode step's time there.
//! Each move takes the instruction set its caller's program was compiled
//! for ([`Isa`]) and matches it: no move asks the CPU.

#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

use crate::simd::{Backend, Isa};

/// `out[i] = line[i * S]` with the vectors of `isa`; `line` holds at least
/// `S * (out.len() - 1) + 1` elements.
///
/// # Panics
/// If `line` is shorter than that.
pub(crate) fn gather<const S: usize>(isa: Isa, line: &[f32], out: &mut [f32]) {
    let Some(last) = out.len().checked_sub(1) else {
        return;
    };
    assert!(line.len() > S * last, "gather past the line");
    let done = simd_gather::<S>(isa, line, out);
    for (i, o) in out.iter_mut().enumerate().skip(done) {
        *o = line[i * S];
    }
}

/// `out[i] = line[i * stride]` for any stride of 2 or more: [`gather`]'s
/// vectors for the small ones (a column across a conv state's channels),
/// a plain loop for the others. The interpreter's loads and the flat
/// form's strided leaves both take it, so they move the same elements.
///
/// # Panics
/// If `line` holds fewer than `stride * (out.len() - 1) + 1` elements.
pub(crate) fn gather_by(isa: Isa, stride: usize, line: &[f32], out: &mut [f32]) {
    match stride {
        2 => gather::<2>(isa, line, out),
        3 => gather::<3>(isa, line, out),
        4 => gather::<4>(isa, line, out),
        _ => {
            if let Some(last) = out.len().checked_sub(1) {
                assert!(line.len() > stride * last, "gather past the line");
            }
            for (o, &v) in out.iter_mut().zip(line.iter().step_by(stride)) {
                *o = v;
            }
        }
    }
}

/// `rows[i * S + t] = cols[t * n + i]` for every `t < S` and `i < n`,
/// where `n = cols.len() / S`: `S` columns of `n` elements, one after
/// another in `cols`, stored as `n` rows of `S` (a decode step's state
/// rows from their time steps), whole vectors of `rows` at a time with the
/// vectors of `isa`. Nothing of `rows` is read, so no store depends on a
/// load (a column at a time, each store was a read-modify-write of the
/// rows' vectors, or a scalar store).
///
/// # Panics
/// If `cols.len()` is not a multiple of `S` or `rows` is shorter than it.
pub(crate) fn interleave<const S: usize>(isa: Isa, cols: &[f32], rows: &mut [f32]) {
    assert!(
        cols.len().is_multiple_of(S) && rows.len() >= cols.len(),
        "interleave past the rows"
    );
    let n = cols.len() / S;
    let done = simd_interleave::<S>(isa, cols, rows);
    for i in done..n {
        for t in 0..S {
            rows[i * S + t] = cols[t * n + i];
        }
    }
}

/// `rows[i * stride + t] = cols[t * n + i]` (`n = cols.len() / stride`)
/// for any stride of 1 or more: [`interleave`]'s vectors for the small
/// ones (a decode step's state), a plain loop over the rows for the
/// others.
///
/// # Panics
/// If `stride` is 0, `cols.len()` is not a multiple of it or `rows` is
/// shorter than `cols`.
pub(crate) fn interleave_by(isa: Isa, stride: usize, cols: &[f32], rows: &mut [f32]) {
    match stride {
        2 => interleave::<2>(isa, cols, rows),
        3 => interleave::<3>(isa, cols, rows),
        4 => interleave::<4>(isa, cols, rows),
        _ => {
            assert!(
                stride > 0 && cols.len().is_multiple_of(stride) && rows.len() >= cols.len(),
                "interleave past the rows"
            );
            let n = cols.len() / stride;
            for (i, row) in rows[..cols.len()].chunks_exact_mut(stride).enumerate() {
                for (t, v) in row.iter_mut().enumerate() {
                    *v = cols[t * n + i];
                }
            }
        }
    }
}

/// Side of the square blocks [`transpose`] moves at a time: 8 lines of 8
/// floats in, 8 out, all in registers (one AVX vector a line, or two NEON
/// ones).
const TILE: usize = 8;

/// `dst[j * dst_stride + i] = src[i * src_stride + j]` for `i < n` and
/// `j < m`: `n` lines of `m` elements in, `m` lines of `n` out (a conv's
/// `[N, C]` projection read as its `[C, N]` rows). Element by element,
/// every read or every write is a strided access, a compiled loop of
/// scalar moves at 0.6-0.8 ns an element: a sixth of transformers'
/// FastConformer convolution module went to its two transposes. In
/// [`TILE`] × [`TILE`] blocks, shuffled in registers, both sides move
/// whole vectors (those of `isa`).
///
/// # Panics
/// If a line leaves `src` or `dst`.
pub(crate) fn transpose(
    isa: Isa,
    src: &[f32],
    src_stride: usize,
    n: usize,
    m: usize,
    dst: &mut [f32],
    dst_stride: usize,
) {
    if n == 0 || m == 0 {
        return;
    }
    assert!(
        (n - 1) * src_stride + m <= src.len() && (m - 1) * dst_stride + n <= dst.len(),
        "transpose past a tensor"
    );
    // SAFETY: every element read is at `i * src_stride + j` with `i < n`,
    // `j < m`, inside `src` (asserted); every element written likewise
    // inside `dst`, which is borrowed mutably and so aliases nothing.
    unsafe {
        transpose_raw(
            isa,
            src.as_ptr(),
            src_stride,
            n,
            m,
            dst.as_mut_ptr(),
            dst_stride,
        )
    }
}

/// [`transpose`] through pointers, for an output that other tasks write
/// elsewhere (a [`SharedOut`](super::rows::SharedOut)'s lines).
///
/// # Safety
/// `src + i * src_stride + j` is readable and `dst + j * dst_stride + i`
/// writable for every `i < n`, `j < m`; nothing else accesses the written
/// elements meanwhile, and no written element is read.
pub(crate) unsafe fn transpose_raw(
    isa: Isa,
    src: *const f32,
    src_stride: usize,
    n: usize,
    m: usize,
    dst: *mut f32,
    dst_stride: usize,
) {
    let (nb, mb) = (n - n % TILE, m - m % TILE);
    let tile = tile_fn(isa);
    for i0 in (0..nb).step_by(TILE) {
        for j0 in (0..mb).step_by(TILE) {
            // SAFETY: the block's lines `i0 ..` and `j0 ..` lie inside the
            // caller's ranges (`i0 + 8 <= n`, `j0 + 8 <= m`); `tile_fn`
            // picked a function whose features `isa`, so this CPU, has.
            unsafe {
                tile(
                    src.add(i0 * src_stride + j0),
                    src_stride,
                    dst.add(j0 * dst_stride + i0),
                    dst_stride,
                )
            }
        }
    }
    // The edges, element by element.
    for i in 0..n {
        for j in if i < nb { mb..m } else { 0..m } {
            // SAFETY: `i < n`, `j < m`: inside the caller's ranges.
            unsafe { *dst.add(j * dst_stride + i) = *src.add(i * src_stride + j) };
        }
    }
}

/// Transposes the 8 × 8 block at `src` (lines `src_stride` apart) into the
/// one at `dst`; unsafe for the CPU features it is compiled for and the
/// pointers' ranges.
type TileFn = unsafe fn(*const f32, usize, *mut f32, usize);

/// The block transpose for `isa`: AVX where it has AVX2 (an [`Isa`] names
/// only backends this CPU has), NEON, else element by element.
fn tile_fn(isa: Isa) -> TileFn {
    match isa.backend() {
        Backend::Portable => portable_tile,
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2 | Backend::Avx512 => x86::transpose_tile,
        #[cfg(target_arch = "aarch64")]
        Backend::Neon => neon::transpose_tile,
    }
}

/// [`TileFn`] element by element.
///
/// # Safety
/// The 8 lines of 8 at `src` are readable and those at `dst` writable, as
/// [`transpose_raw`] requires of the whole.
unsafe fn portable_tile(src: *const f32, src_stride: usize, dst: *mut f32, dst_stride: usize) {
    for i in 0..TILE {
        for j in 0..TILE {
            // SAFETY: `i, j < 8`: inside the block (see above).
            unsafe { *dst.add(j * dst_stride + i) = *src.add(i * src_stride + j) };
        }
    }
}

/// The vector part of [`gather`] on `isa`: how many leading outputs it
/// wrote.
#[inline]
fn simd_gather<const S: usize>(isa: Isa, line: &[f32], out: &mut [f32]) -> usize {
    match isa.backend() {
        // SAFETY: AVX-512 F is present (an `Isa` names only backends this
        // CPU has); `gather` checked the line's length.
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512 => unsafe { x86::gather::<S>(line, out) },
        // SAFETY: AVX2 is present (as above); `gather` checked the line's
        // length.
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2 => unsafe { x86::gather_avx2::<S>(line, out) },
        // SAFETY: NEON is present (as above); `gather` checked the line's
        // length.
        #[cfg(target_arch = "aarch64")]
        Backend::Neon => unsafe { neon::gather::<S>(line, out) },
        _ => 0,
    }
}

/// The vector part of [`interleave`] on `isa`: how many leading rows it
/// stored.
#[inline]
fn simd_interleave<const S: usize>(isa: Isa, cols: &[f32], rows: &mut [f32]) -> usize {
    match isa.backend() {
        // SAFETY: AVX-512 F is present (an `Isa` names only backends this
        // CPU has); `interleave` checked the lengths.
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512 => unsafe { x86::interleave::<S>(cols, rows) },
        // SAFETY: AVX2 is present (as above); `interleave` checked the
        // lengths.
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2 => unsafe { x86::interleave_avx2::<S>(cols, rows) },
        // SAFETY: NEON is present (as above); `interleave` checked the
        // lengths.
        #[cfg(target_arch = "aarch64")]
        Backend::Neon => unsafe { neon::interleave::<S>(cols, rows) },
        _ => 0,
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// [`super::TileFn`] on AVX: 8 loads, the usual network of 24
    /// shuffles (pairs of lanes, then of pairs, then of 128-bit halves),
    /// 8 stores. Compiled with the AVX2 row's features (`per_backend!`'s
    /// table), the row it runs on and the AVX-512 row includes.
    ///
    /// # Safety
    /// The AVX2 row's features are present; the 8 lines of 8 at `src` are
    /// readable and those at `dst` writable.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn transpose_tile(src: *const f32, ss: usize, dst: *mut f32, ds: usize) {
        // SAFETY: unaligned loads and stores of 8 floats at the lines the
        // caller vouches for.
        unsafe {
            let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(src.add(i * ss)));
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            let o = [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ];
            for (j, v) in o.into_iter().enumerate() {
                _mm256_storeu_ps(dst.add(j * ds), v);
            }
        }
    }

    /// Lane `i` of the result is element `S * i` of `S` consecutive
    /// vectors: `lo` picks those of the first two (`S * i < 32`), `hi`
    /// those of the third and fourth, `high` says which.
    struct GatherIdx {
        lo: __m512i,
        hi: __m512i,
        high: __mmask16,
    }

    #[inline(always)]
    fn gather_idx<const S: usize>() -> ([i32; 16], [i32; 16], u16) {
        let (mut lo, mut hi, mut high) = ([0i32; 16], [0i32; 16], 0u16);
        for i in 0..16 {
            let e = (S * i) as i32;
            if e < 32 {
                lo[i] = e;
            } else {
                hi[i] = e - 32;
                high |= 1 << i;
            }
        }
        (lo, hi, high)
    }

    /// # Safety
    /// AVX-512 F is present and `line` holds `S * (out.len() - 1) + 1`
    /// elements or more.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn gather<const S: usize>(line: &[f32], out: &mut [f32]) -> usize {
        let (lo, hi, high) = gather_idx::<S>();
        // SAFETY: plain loads of 16 i32 from arrays of 16.
        let idx = unsafe {
            GatherIdx {
                lo: _mm512_loadu_si512(lo.as_ptr().cast()),
                hi: _mm512_loadu_si512(hi.as_ptr().cast()),
                high,
            }
        };
        // Blocks of 16 outputs whose `16 * S` inputs lie in the line.
        let blocks = (line.len() / (16 * S)).min(out.len() / 16);
        let (src, dst) = (line.as_ptr(), out.as_mut_ptr());
        for b in 0..blocks {
            // SAFETY: block `b` reads `line[16 * S * b .. 16 * S * (b + 1)]`
            // and writes `out[16 * b .. 16 * (b + 1)]`, both in bounds
            // (`blocks` above); unaligned loads and stores.
            unsafe {
                let p = src.add(16 * S * b);
                let v0 = _mm512_loadu_ps(p);
                let v1 = _mm512_loadu_ps(p.add(16));
                let mut r = _mm512_permutex2var_ps(v0, idx.lo, v1);
                if S > 2 {
                    let v2 = _mm512_loadu_ps(p.add(32));
                    let v3 = if S > 3 {
                        _mm512_loadu_ps(p.add(48))
                    } else {
                        v2
                    };
                    let h = _mm512_permutex2var_ps(v2, idx.hi, v3);
                    r = _mm512_mask_blend_ps(idx.high, r, h);
                }
                _mm512_storeu_ps(dst.add(16 * b), r);
            }
        }
        16 * blocks
    }

    /// [`interleave`] on AVX-512: per block of 16 rows, each of the `S`
    /// output vectors is two-source permutes (`vpermt2ps`) of the first two
    /// columns' vectors and of the third and fourth, blended: the mirror of
    /// [`gather`].
    ///
    /// # Safety
    /// AVX-512 F is present, `cols.len()` is a multiple of `S` and `rows`
    /// holds at least `cols.len()` elements.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn interleave<const S: usize>(cols: &[f32], rows: &mut [f32]) -> usize {
        // Output vector j's lane e is row element q = 16 j + e: lane q / S
        // of column t = q % S, which is lane (t % 2) 16 + q / S of the pair
        // of columns t belongs to; `high` marks the lanes of the second
        // pair.
        let (mut idx, mut high) = ([[0i32; 16]; 4], [0u16; 4]);
        for (j, (idx, high)) in idx.iter_mut().zip(&mut high).enumerate().take(S) {
            for (e, v) in idx.iter_mut().enumerate() {
                let q = 16 * j + e;
                *v = ((q % S % 2) * 16 + q / S) as i32;
                if q % S >= 2 {
                    *high |= 1 << e;
                }
            }
        }
        // SAFETY: plain loads of 16 i32 from arrays of 16.
        let idx: [__m512i; 4] =
            std::array::from_fn(|j| unsafe { _mm512_loadu_si512(idx[j].as_ptr().cast()) });
        let n = cols.len() / S;
        let (src, dst) = (cols.as_ptr(), rows.as_mut_ptr());
        for b in 0..n / 16 {
            // SAFETY: block `b` reads `cols[t n + 16 b ..][..16]` for every
            // `t < S` (`16 (b + 1) <= n`) and writes `rows[16 S b ..][..16
            // S]`, inside the `S n` elements `rows` holds; unaligned loads
            // and stores.
            unsafe {
                let c = |t: usize| _mm512_loadu_ps(src.add(t.min(S - 1) * n + 16 * b));
                let (c0, c1) = (c(0), c(1));
                let (c2, c3) = if S > 2 { (c(2), c(3)) } else { (c0, c1) };
                for j in 0..S {
                    let mut v = _mm512_permutex2var_ps(c0, idx[j], c1);
                    if S > 2 {
                        let h = _mm512_permutex2var_ps(c2, idx[j], c3);
                        v = _mm512_mask_blend_ps(high[j], v, h);
                    }
                    _mm512_storeu_ps(dst.add(16 * (S * b + j)), v);
                }
            }
        }
        16 * (n / 16)
    }

    /// [`gather`] on AVX2: per block of 8 outputs, the `S` vectors of its
    /// inputs each permuted (`vpermps`) and blended into place.
    ///
    /// # Safety
    /// The AVX2 row's features are present and `line` holds `S *
    /// (out.len() - 1) + 1` elements or more.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gather_avx2<const S: usize>(line: &[f32], out: &mut [f32]) -> usize {
        // Output lane i takes element S i of the block: lane S i % 8 of
        // its vector S i / 8.
        let (mut idx, mut mask) = ([[0i32; 8]; 4], [[0i32; 8]; 4]);
        for i in 0..8 {
            let e = S * i;
            idx[e / 8][i] = (e % 8) as i32;
            mask[e / 8][i] = -1;
        }
        // SAFETY: plain loads of 8 i32 from arrays of 8.
        let (idx, mask): ([__m256i; 4], [__m256; 4]) = unsafe {
            (
                std::array::from_fn(|j| _mm256_loadu_si256(idx[j].as_ptr().cast())),
                std::array::from_fn(|j| {
                    _mm256_castsi256_ps(_mm256_loadu_si256(mask[j].as_ptr().cast()))
                }),
            )
        };
        // Blocks of 8 outputs whose `8 * S` inputs lie in the line.
        let blocks = (line.len() / (8 * S)).min(out.len() / 8);
        let (src, dst) = (line.as_ptr(), out.as_mut_ptr());
        for b in 0..blocks {
            // SAFETY: block `b` reads `line[8 S b .. 8 S (b + 1)]` and
            // writes `out[8 b .. 8 (b + 1)]`, both in bounds (`blocks`
            // above); unaligned loads and stores.
            unsafe {
                let p = src.add(8 * S * b);
                let mut r = _mm256_permutevar8x32_ps(_mm256_loadu_ps(p), idx[0]);
                for j in 1..S {
                    let v = _mm256_permutevar8x32_ps(_mm256_loadu_ps(p.add(8 * j)), idx[j]);
                    r = _mm256_blendv_ps(r, v, mask[j]);
                }
                _mm256_storeu_ps(dst.add(8 * b), r);
            }
        }
        8 * blocks
    }

    /// [`interleave`] on AVX2: per block of 8 rows, each of the `S`
    /// output vectors is the `S` columns' vectors permuted (`vpermps`) and
    /// blended into place.
    ///
    /// # Safety
    /// The AVX2 row's features are present, `cols.len()` is a multiple of
    /// `S` and `rows` holds at least `cols.len()` elements.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn interleave_avx2<const S: usize>(cols: &[f32], rows: &mut [f32]) -> usize {
        // Output vector j's lane e is row element q = 8 j + e: lane q / S
        // of column q % S.
        let (mut idx, mut mask) = ([[0i32; 8]; 4], [[[0i32; 8]; 4]; 4]);
        for j in 0..S {
            for e in 0..8 {
                let q = 8 * j + e;
                idx[j][e] = (q / S) as i32;
                mask[j][q % S][e] = -1;
            }
        }
        // SAFETY: plain loads of 8 i32 from arrays of 8.
        let (idx, mask): ([__m256i; 4], [[__m256; 4]; 4]) = unsafe {
            (
                std::array::from_fn(|j| _mm256_loadu_si256(idx[j].as_ptr().cast())),
                std::array::from_fn(|j| {
                    std::array::from_fn(|t| {
                        _mm256_castsi256_ps(_mm256_loadu_si256(mask[j][t].as_ptr().cast()))
                    })
                }),
            )
        };
        let n = cols.len() / S;
        let (src, dst) = (cols.as_ptr(), rows.as_mut_ptr());
        for b in 0..n / 8 {
            // SAFETY: block `b` reads `cols[t n + 8 b ..][..8]` for every
            // `t < S` (`8 (b + 1) <= n`) and writes `rows[8 S b ..][..8 S]`,
            // inside the `S n` elements `rows` holds; unaligned loads and
            // stores.
            unsafe {
                let c: [__m256; 4] =
                    std::array::from_fn(|t| _mm256_loadu_ps(src.add((t % S) * n + 8 * b)));
                for j in 0..S {
                    let mut v = _mm256_permutevar8x32_ps(c[0], idx[j]);
                    for t in 1..S {
                        let w = _mm256_permutevar8x32_ps(c[t], idx[j]);
                        v = _mm256_blendv_ps(v, w, mask[j][t]);
                    }
                    _mm256_storeu_ps(dst.add(8 * (S * b + j)), v);
                }
            }
        }
        8 * (n / 8)
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;

    /// [`super::TileFn`] on NEON: four 4 × 4 blocks, each 4 loads, two
    /// rounds of `trn` (lanes, then 64-bit pairs), 4 stores.
    ///
    /// # Safety
    /// NEON is present; the 8 lines of 8 at `src` are readable and those
    /// at `dst` writable.
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn transpose_tile(src: *const f32, ss: usize, dst: *mut f32, ds: usize) {
        for (bi, bj) in [(0, 0), (0, 4), (4, 0), (4, 4)] {
            // SAFETY: the 4 × 4 block at lines bi.., columns bj.. of the
            // 8 × 8 one the caller vouches for, written transposed into
            // lines bj.., columns bi.. of `dst`'s.
            unsafe {
                let p = src.add(bi * ss + bj);
                let r0 = vld1q_f32(p);
                let r1 = vld1q_f32(p.add(ss));
                let r2 = vld1q_f32(p.add(2 * ss));
                let r3 = vld1q_f32(p.add(3 * ss));
                let t0 = vreinterpretq_f64_f32(vtrn1q_f32(r0, r1));
                let t1 = vreinterpretq_f64_f32(vtrn2q_f32(r0, r1));
                let t2 = vreinterpretq_f64_f32(vtrn1q_f32(r2, r3));
                let t3 = vreinterpretq_f64_f32(vtrn2q_f32(r2, r3));
                let q = dst.add(bj * ds + bi);
                vst1q_f32(q, vreinterpretq_f32_f64(vtrn1q_f64(t0, t2)));
                vst1q_f32(q.add(ds), vreinterpretq_f32_f64(vtrn1q_f64(t1, t3)));
                vst1q_f32(q.add(2 * ds), vreinterpretq_f32_f64(vtrn2q_f64(t0, t2)));
                vst1q_f32(q.add(3 * ds), vreinterpretq_f32_f64(vtrn2q_f64(t1, t3)));
            }
        }
    }

    /// # Safety
    /// NEON is present and `line` holds `S * (out.len() - 1) + 1` elements
    /// or more.
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn gather<const S: usize>(line: &[f32], out: &mut [f32]) -> usize {
        // Blocks of 4 outputs whose `4 * S` inputs lie in the line.
        let blocks = (line.len() / (4 * S)).min(out.len() / 4);
        let (src, dst) = (line.as_ptr(), out.as_mut_ptr());
        for b in 0..blocks {
            // SAFETY: block `b` reads `line[4 S b .. 4 S (b + 1)]` and
            // writes `out[4 b .. 4 (b + 1)]`, in bounds (`blocks` above).
            unsafe {
                let p = src.add(4 * S * b);
                let v = match S {
                    2 => vld2q_f32(p).0,
                    3 => vld3q_f32(p).0,
                    _ => vld4q_f32(p).0,
                };
                vst1q_f32(dst.add(4 * b), v);
            }
        }
        4 * blocks
    }

    /// # Safety
    /// NEON is present, `cols.len()` is a multiple of `S` and `rows` holds
    /// at least `cols.len()` elements.
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn interleave<const S: usize>(cols: &[f32], rows: &mut [f32]) -> usize {
        let n = cols.len() / S;
        let (src, dst) = (cols.as_ptr(), rows.as_mut_ptr());
        for b in 0..n / 4 {
            // SAFETY: block `b` reads `cols[t n + 4 b ..][..4]` for every
            // `t < S` (`4 (b + 1) <= n`) and writes `rows[4 S b ..][..4 S]`,
            // inside the `S n` elements `rows` holds.
            unsafe {
                let c = |t: usize| vld1q_f32(src.add(t * n + 4 * b));
                let p = dst.add(4 * S * b);
                match S {
                    2 => vst2q_f32(p, float32x4x2_t(c(0), c(1))),
                    3 => vst3q_f32(p, float32x4x3_t(c(0), c(1), c(2))),
                    _ => vst4q_f32(p, float32x4x4_t(c(0), c(1), c(2), c(3))),
                }
            }
        }
        4 * (n / 4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shape around the block size, with strides longer than the
    /// lines (padding that must stay untouched), against the definition;
    /// the block function of every instruction set this CPU has.
    #[test]
    fn transpose_moves_every_element_and_nothing_else() {
        for (n, m) in [
            (1, 1),
            (8, 8),
            (7, 9),
            (16, 24),
            (17, 31),
            (3, 64),
            (64, 3),
            (40, 40),
        ] {
            for (pad_s, pad_d) in [(0, 0), (3, 5)] {
                let (ss, ds) = (m + pad_s, n + pad_d);
                let src: Vec<f32> = (0..n * ss).map(|i| i as f32).collect();
                let mut want = vec![-1.0f32; m * ds];
                for i in 0..n {
                    for j in 0..m {
                        want[j * ds + i] = src[i * ss + j];
                    }
                }
                for isa in Isa::all_available() {
                    let mut got = vec![-1.0f32; m * ds];
                    transpose(isa, &src, ss, n, m, &mut got, ds);
                    assert_eq!(got, want, "{isa:?}: {n}x{m} strides {ss}, {ds}");
                }
            }
        }
        for tile in Isa::all_available().into_iter().map(tile_fn) {
            let src: Vec<f32> = (0..80).map(|i| i as f32).collect();
            let mut got = vec![-1.0f32; 8 * 9];
            // SAFETY: 8 lines of 10 readable (80 floats), 8 lines of 9
            // writable (72); each `Isa` is one this CPU has.
            unsafe { tile(src.as_ptr(), 10, got.as_mut_ptr(), 9) };
            for (k, &v) in got.iter().enumerate() {
                let (j, i) = (k / 9, k % 9);
                let want = if i < 8 { (i * 10 + j) as f32 } else { -1.0 };
                assert_eq!(v, want, "element {k}");
            }
        }
    }

    fn check_stride<const S: usize>(isa: Isa) {
        for n in [0, 1, 3, 4, 5, 15, 16, 17, 33, 64, 100] {
            // Exactly as long as the gather needs (its last block must not
            // read past it), and longer.
            for extra in [0, S - 1] {
                let len = if n == 0 { 0 } else { S * (n - 1) + 1 + extra };
                let line: Vec<f32> = (0..len).map(|i| i as f32).collect();
                let mut out = vec![f32::NAN; n];
                gather::<S>(isa, &line, &mut out);
                let want: Vec<f32> = (0..n).map(|i| (i * S) as f32).collect();
                assert_eq!(out, want, "gather S={S} n={n}");
            }
        }
    }

    /// Every stride and length (whole vectors, tails, lines exactly as
    /// long as needed), against the definition; the vector paths run on
    /// every instruction set this CPU has (AVX2 and AVX-512 on x86-64, NEON
    /// under QEMU).
    #[test]
    fn gathers_move_exactly_their_elements() {
        for isa in Isa::all_available() {
            check_stride::<2>(isa);
            check_stride::<3>(isa);
            check_stride::<4>(isa);
        }
    }

    /// Every stride (the vector ones, 2 to 4, through [`interleave`]) and
    /// length (whole vectors, tails), against the definition, with rows one
    /// element longer than the columns fill (it must stay), on every
    /// instruction set this CPU has.
    #[test]
    fn interleaves_move_exactly_their_elements_at_any_stride() {
        for isa in Isa::all_available() {
            for s in 1..=6 {
                for n in [0, 1, 3, 4, 5, 7, 8, 15, 16, 17, 33, 64, 100] {
                    let cols: Vec<f32> = (0..s * n).map(|k| k as f32).collect();
                    let mut rows = vec![-1.0f32; s * n + 1];
                    interleave_by(isa, s, &cols, &mut rows);
                    for (q, &v) in rows.iter().enumerate() {
                        let want = if q < s * n {
                            ((q % s) * n + q / s) as f32
                        } else {
                            -1.0
                        };
                        assert_eq!(v, want, "{isa:?} stride {s} n={n} element {q}");
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "gather past the line")]
    fn a_short_line_is_refused_before_any_load() {
        gather::<3>(Isa::detect(), &[0.0; 45], &mut [0.0; 16]);
    }

    #[test]
    #[should_panic(expected = "interleave past the rows")]
    fn short_rows_are_refused_before_any_store() {
        interleave::<3>(Isa::detect(), &[0.0; 48], &mut [0.0; 47]);
    }

    #[test]
    #[should_panic(expected = "interleave past the rows")]
    fn columns_of_unequal_lengths_are_refused() {
        interleave::<3>(Isa::detect(), &[0.0; 47], &mut [0.0; 48]);
    }
}
