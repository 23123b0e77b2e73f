//! Dense and grouped conv1d as GEMM with weights packed at prepare.
//!
//! Per group `g` and tap `k`, the convolution is a matrix product
//!
//! ```text
//! Y_g[:, l] += W_{g,k} · X_g[:, l·stride + k·dilation − pad_left]
//! ```
//!
//! where `W_{g,k}` is `[out_per_group × in_per_group]` and the right-hand
//! side is a *strided view* of the input: rows are the group's input
//! channels (row stride `in_len`), columns are output positions (column
//! stride `stride`). No im2col copy is made. Padding is never materialised:
//! each tap's product runs only over the output positions at which it reads
//! real input ([`TapSpan`]), the others simply get no term from that tap.
//!
//! # Work split
//!
//! The output is cut into tiles of (batch item, group, block of output
//! channels, chunk of output positions); rayon runs the tiles on the
//! *current* pool, and each tile is one single-threaded GEMM per tap
//! ([`gemm::Parallelism::None`]). A tile first sets its outputs to the bias
//! (or lets the first tap that covers the whole chunk overwrite them), then
//! the taps accumulate in order. The tiling depends only on the shape, never
//! on the pool size, so results are identical for any number of threads.
//!
//! # The GEMM crate and allocation
//!
//! The products run on [`gemm`] 0.19 (sarah-quinones), built with its
//! `x86-v4` feature so AVX-512 machines get its AVX-512 kernels (AVX2+FMA
//! otherwise, NEON on aarch64; all dispatched at run time). Measured on one
//! core of the 2-core AVX-512 EPYC this was developed on, over this
//! module's per-tap strided products (GFLOP/s, gemm vs `matrixmultiply`
//! 0.3.11 with its own AVX-512 kernel): 256→256 channels, K=3: 210 vs 160;
//! 64→64: 163 vs 120; 64→64, K=7: 199 vs 147; 4→4: 40–50 vs 12. An im2col
//! copy into scratch (one product per chunk over all taps) was slower with
//! both crates (170 and 130 on the first shape), so the input is read in
//! place.
//!
//! Neither crate has a workspace API and both allocate inside every call
//! (`matrixmultiply` its packing buffer, up to ~600 KB), so this algorithm
//! does **not** keep the crate's no-allocation promise. With gemm 0.19,
//! each GEMM call (one per tile and tap that reads input) allocates and
//! frees before returning:
//!
//! * an 8-byte `Vec<bool>` (`did_pack_lhs` in `gemm-common`), always;
//! * a packed copy of the input view, at most `chunk × in_per_group` `f32`s,
//!   when `stride > 1` or when the call's column count is not a multiple of
//!   the SIMD width (the chunks next to padding, the last chunk);
//! * on aarch64, where gemm packs the right-hand side from 2 micro-panels
//!   on, a packed copy of the weight panel (`in_per_group × out block`).
//!
//! Once per thread, on its first call, gemm also allocates a thread-local
//! packing slab the size of the L2 cache, and once per process it detects
//! the CPU. Measured per `run` after warm-up (x86-64): 64→64, K=3, N=4096:
//! 50 allocations, 131 KB; the same with stride 2: 96, 1.6 MB.

#![allow(unsafe_code)]

use std::ops::Range;

use rayon::prelude::*;

use super::params::Conv1dGeometry;
use super::tap_span::TapSpan;
use crate::scratch::Scratch;

/// How many times faster than [`super::cost::DIRECT_MACS_PER_SEC`] one core runs the
/// GEMM tiles when both matrix dimensions (`in_per_group`, `out_per_group`)
/// are large. Measured: gemm about 110e9 multiply-adds/s against the direct
/// loop's 11e9 at stride 1 (see [`cost`]).
const SPEEDUP_OVER_DIRECT: f64 = 10.0;
/// Extra time per multiply-add, relative to the large-matrix rate, for each
/// `1 / in_per_group`: short inner products spend their time loading and
/// storing the output tile rather than multiplying.
const SHORT_INNER: f64 = 8.0;
/// Extra time per multiply-add for each `1 / out_per_group`: a thin weight
/// panel leaves most of the micro-kernel's accumulators idle.
const FEW_OUTPUTS: f64 = 5.0;
/// Fixed seconds per GEMM call (dispatch, blocking decisions, the small
/// allocation described in the module docs): at most 0.1 µs measured,
/// calls on tiny matrices included.
const SECONDS_PER_CALL: f64 = 0.1e-6;

/// Longest chunk of output positions one tile covers. Long enough that
/// gemm's per-call work (packing the weight panel, its set-up) is amortised,
/// short enough that a tile's output and input stay in L2.
const CHUNK_MAX: usize = 512;
/// Shortest chunk the tiling makes in order to find parallelism.
const CHUNK_MIN: usize = 64;
/// Chunks are multiples of this (a micro-kernel's width), where the output
/// is longer.
const CHUNK_ALIGN: usize = 16;
/// Fewest output channels in a tile when channel blocks are split for
/// parallelism.
const ROWS_MIN: usize = 32;
/// Tiles the split aims for at least, so that a pool can balance its
/// threads. A constant rather than the pool size, so the tiling (and with
/// it the summation order) does not depend on the number of threads.
const MIN_TILES: usize = 16;

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
/// traffic is the compulsory bytes (a tile's output stays in cache while
/// its taps accumulate); the larger of the two wins, as everywhere in
/// `cost.rs`, and each GEMM call adds [`SECONDS_PER_CALL`].
///
/// Calibrated in release on one core of a 2-core AVX-512 EPYC (gemm's
/// AVX-512 kernels), sweeping `in_per_group` and `out_per_group` over
/// 1..256 at K=3, N=2048: gemm runs 8–11 GMAC/s at `in_per_group = 1`,
/// 35 at 4, 57 at 8, 80 at 16 and 96–110 from 32 up (with many outputs);
/// 18, 25, 50, 60 and 90 at `out_per_group` 1, 2, 4, 8, 16 (with many
/// inputs). The direct loop ran 9–11 GMAC/s throughout. The factor above
/// fits these within about 25%, except `in_per_group = 2`, where it is
/// optimistic by up to 1.6×, and the direct loop's own model ignores that
/// it runs 4× slower at stride 2. Whole calls on a quiet machine, GFLOP/s
/// on 1 and 2 threads, gemm vs direct: dense 256→256, K=3, N=4096: 215 and
/// 442 vs 23 and 43; 512 channels in 8 groups, K=3, N=4096: 159 and 279 vs
/// 22 and 40.
pub(crate) fn cost(g: &Conv1dGeometry) -> f64 {
    use super::cost::{compulsory_bytes, direct_macs, roofline, DIRECT_MACS_PER_SEC};
    let p = &g.params;
    let slowdown = 1.0 + SHORT_INNER / g.in_per_group as f64 + FEW_OUTPUTS / g.out_per_group as f64;
    let rate = DIRECT_MACS_PER_SEC * SPEEDUP_OVER_DIRECT / slowdown;
    let tiling = Tiling::new(g);
    let calls = (p.batch * p.groups * tiling.row_blocks * tiling.chunks * p.kernel_size) as f64;
    roofline(direct_macs(g), rate, compulsory_bytes(g)) + calls * SECONDS_PER_CALL
}

/// The weights repacked for the GEMMs, and nothing else: the geometry comes
/// with every call.
pub(crate) struct GemmConv {
    /// `[groups, kernel_size, out_per_group, in_per_group]`: for each group
    /// and tap, the row-major `W_{g,k}` (unit stride along input channels,
    /// which lets gemm use it in place without packing it again).
    packed: Box<[f32]>,
}

impl GemmConv {
    /// Repacks `w` (`[out_channels, in_per_group, kernel_size]`) per group
    /// and tap. Nothing here depends on the batch or the input length.
    pub(crate) fn prepare(g: &Conv1dGeometry, w: &[f32]) -> Self {
        let p = &g.params;
        let (cin, cout, taps) = (g.in_per_group, g.out_per_group, p.kernel_size);
        debug_assert_eq!(w.len(), g.weight_elems);
        let mut packed = vec![0.0; g.weight_elems].into_boxed_slice();
        for group in 0..p.groups {
            for tap in 0..taps {
                let panel = &mut packed[(group * taps + tap) * cout * cin..][..cout * cin];
                for (o, row) in panel.chunks_exact_mut(cin).enumerate() {
                    let filter = &w[(group * cout + o) * cin * taps..][..cin * taps];
                    for (dst, taps_of_c) in row.iter_mut().zip(filter.chunks_exact(taps)) {
                        *dst = taps_of_c[tap];
                    }
                }
            }
        }
        warm_up();
        GemmConv { packed }
    }

    /// No scratch: the GEMMs read the input in place.
    pub(crate) fn scratch_per_thread(&self) -> usize {
        0
    }

    /// Bytes of the packed weights.
    pub(crate) fn prepared_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.packed)
    }

    /// Computes `y = conv1d(x, w) + bias` for `g`, whose static parameters
    /// are those this was prepared with (batch and input length may be
    /// smaller). The caller has checked every slice length.
    pub(crate) fn run(
        &self,
        g: &Conv1dGeometry,
        x: &[f32],
        bias: Option<&[f32]>,
        y: &mut [f32],
        _scratch: &Scratch,
    ) {
        let p = &g.params;
        debug_assert_eq!(self.packed.len(), g.weight_elems);
        debug_assert_eq!(x.len(), g.input_elems);
        debug_assert_eq!(y.len(), g.output_elems);
        debug_assert!(bias.is_none_or(|b| b.len() == p.out_channels));

        let tiling = Tiling::new(g);
        let per_item = p.groups * tiling.row_blocks * tiling.chunks;
        let tiles = p.batch * per_item;
        let spans = TapSpans { g };
        let out = OutPtr(y.as_mut_ptr());
        (0..tiles).into_par_iter().for_each(|t| {
            let (b, rest) = (t / per_item, t % per_item);
            let (group, rest) = (
                rest / (tiling.row_blocks * tiling.chunks),
                rest % (tiling.row_blocks * tiling.chunks),
            );
            let (block, chunk) = (rest / tiling.chunks, rest % tiling.chunks);
            let rows = block * tiling.rows..((block + 1) * tiling.rows).min(g.out_per_group);
            let cols = chunk * tiling.chunk..((chunk + 1) * tiling.chunk).min(g.out_len);
            let tile = Tile {
                b,
                group,
                rows,
                cols,
            };
            // SAFETY: tiles partition the output (distinct (b, group, rows,
            // cols) cover disjoint elements), so no two tasks write the same
            // element, and `y` outlives the parallel loop.
            unsafe { self.tile(g, &spans, &tile, x, bias, out) };
        });
    }

    /// Computes one tile of the output.
    ///
    /// # Safety
    /// `out` points to the start of `y` (`g.output_elems` elements), and no
    /// other thread accesses this tile's elements during the call.
    unsafe fn tile(
        &self,
        g: &Conv1dGeometry,
        spans: &TapSpans<'_>,
        tile: &Tile,
        x: &[f32],
        bias: Option<&[f32]>,
        out: OutPtr,
    ) {
        let p = &g.params;
        let (cin, cout, taps) = (g.in_per_group, g.out_per_group, p.kernel_size);
        let o0 = tile.group * cout + tile.rows.start;
        let m = tile.rows.len();
        let y_offset = (tile.b * p.out_channels + o0) * g.out_len + tile.cols.start;
        let x_group =
            &x[(tile.b * p.in_channels + tile.group * cin) * p.in_len..][..cin * p.in_len];

        // The first tap that reads input at every position of the chunk can
        // overwrite the outputs; otherwise they start at the bias (or zero).
        let covering = match bias {
            None => (0..taps).find(|&k| {
                spans
                    .span(k)
                    .is_some_and(|s| s.out.start <= tile.cols.start && tile.cols.end <= s.out.end)
            }),
            Some(_) => None,
        };
        if covering.is_none() {
            for (i, o) in (o0..o0 + m).enumerate() {
                let value = bias.map_or(0.0, |bias| bias[o]);
                // SAFETY: row `o` of batch item `b`, columns `cols`, lie in
                // `y` and belong to this tile (the caller's contract).
                let row = unsafe {
                    std::slice::from_raw_parts_mut(
                        out.0.add(y_offset + i * g.out_len),
                        tile.cols.len(),
                    )
                };
                row.fill(value);
            }
        }

        let order = covering
            .into_iter()
            .chain((0..taps).filter(|&k| Some(k) != covering));
        for k in order {
            let Some(span) = spans.span(k) else { continue };
            let start = span.out.start.max(tile.cols.start);
            let end = span.out.end.min(tile.cols.end);
            if start >= end {
                continue;
            }
            let first_in = span.first_in + (start - span.out.start) * p.stride;
            let x_view = &x_group[first_in..];
            let w_panel =
                &self.packed[((tile.group * taps + k) * cout + tile.rows.start) * cin..][..m * cin];
            // Last element the GEMM reads of the view: channel cin - 1, column end - start - 1.
            debug_assert!((cin - 1) * p.in_len + (end - start - 1) * p.stride < x_view.len());
            // SAFETY: dst: rows `o0..o0 + m` (stride out_len) and columns
            // `start..end` of this tile, inside `y` (caller's contract).
            // lhs: `w_panel`, `m × cin` row-major, in bounds by its slicing.
            // rhs: `cin × (end - start)` with strides (in_len, stride), its
            // last element in bounds of `x_view` (asserted above: the span
            // guarantees every read position is a real input sample).
            // gemm reads nothing else and writes only dst.
            unsafe {
                gemm::gemm(
                    m,
                    end - start,
                    cin,
                    out.0.add(y_offset + (start - tile.cols.start)),
                    1,
                    g.out_len as isize,
                    Some(k) != covering,
                    w_panel.as_ptr(),
                    1,
                    cin as isize,
                    x_view.as_ptr(),
                    p.stride as isize,
                    p.in_len as isize,
                    1.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        }
    }
}

/// Runs one small product, once per process, so that gemm's one-time set-up
/// (CPU feature and cache detection, about 1 ms measured) happens at
/// prepare rather than in the first `run`, or in the single call that
/// [`super::Choice::Measure`] times. Each thread's first call still pays
/// its thread-local set-up (tens of µs).
fn warm_up() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Above 64 in every dimension, so gemm's blocking code runs too.
        const N: usize = 96;
        let (a, b) = (vec![0.0f32; N * N], vec![0.0f32; N * N]);
        let mut c = vec![0.0f32; N * N];
        // SAFETY: three N × N row-major matrices, each N * N long; gemm
        // reads `a` and `b` and writes `c` within those bounds.
        unsafe {
            gemm::gemm(
                N,
                N,
                N,
                c.as_mut_ptr(),
                1,
                N as isize,
                false,
                a.as_ptr(),
                1,
                N as isize,
                b.as_ptr(),
                1,
                N as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    });
}

/// The output pointer, shared by the tile tasks (each writes only its own tile).
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements through it (see `GemmConv::run`).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// One tile: batch item, group, the group's output channels `rows` and the
/// output positions `cols`.
struct Tile {
    b: usize,
    group: usize,
    rows: Range<usize>,
    cols: Range<usize>,
}

/// How the output of one (batch item, group) is cut into tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tiling {
    /// Output positions per chunk (the last chunk may be shorter).
    chunk: usize,
    /// Chunks per output row.
    chunks: usize,
    /// Output channels per block (the last block may be smaller).
    rows: usize,
    /// Blocks per group.
    row_blocks: usize,
}

impl Tiling {
    /// Chunks of at most [`CHUNK_MAX`] positions; where that gives fewer
    /// than [`MIN_TILES`] tiles, narrower chunks (down to [`CHUNK_MIN`]) and
    /// then blocks of output channels (down to [`ROWS_MIN`]).
    fn new(g: &Conv1dGeometry) -> Self {
        let p = &g.params;
        let outer = (p.batch * p.groups).max(1);
        let want_chunks = MIN_TILES.div_ceil(outer);
        let chunks = g
            .out_len
            .div_ceil(CHUNK_MAX)
            .max(want_chunks.min(g.out_len / CHUNK_MIN))
            .max(1);
        let mut chunk = g.out_len.div_ceil(chunks);
        if chunk > CHUNK_ALIGN {
            chunk = chunk.next_multiple_of(CHUNK_ALIGN).min(g.out_len);
        }
        let chunks = g.out_len.div_ceil(chunk);

        let want_blocks = MIN_TILES.div_ceil(outer * chunks);
        let blocks = want_blocks.min(g.out_per_group / ROWS_MIN).max(1);
        let mut rows = g.out_per_group.div_ceil(blocks);
        if blocks > 1 {
            rows = rows.next_multiple_of(CHUNK_ALIGN).min(g.out_per_group);
        }
        Tiling {
            chunk,
            chunks,
            rows,
            row_blocks: g.out_per_group.div_ceil(rows),
        }
    }
}

/// Each tap's valid output range for one geometry (see [`TapSpan`]).
struct TapSpans<'a> {
    g: &'a Conv1dGeometry,
}

impl TapSpans<'_> {
    fn span(&self, tap: usize) -> Option<TapSpan> {
        TapSpan::new(self.g, tap * self.g.params.dilation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::test_support::{assert_close, Rng};
    use crate::{Algorithm, Choice, Conv1dParams, KernelError, PreparedConv1d};

    #[allow(clippy::too_many_arguments)]
    fn params(
        batch: usize,
        (in_channels, out_channels, groups): (usize, usize, usize),
        in_len: usize,
        kernel_size: usize,
        stride: usize,
        (pad_left, pad_right): (usize, usize),
        dilation: usize,
    ) -> Conv1dParams {
        Conv1dParams {
            batch,
            in_channels,
            out_channels,
            in_len,
            kernel_size,
            stride,
            pad_left,
            pad_right,
            dilation,
            groups,
        }
    }

    fn prepare(max: &Conv1dParams, w: &[f32]) -> PreparedConv1d {
        let conv = PreparedConv1d::new(max, w, Choice::Force(Algorithm::Gemm)).unwrap();
        assert_eq!(conv.algorithm(), Algorithm::Gemm);
        conv
    }

    /// Runs `conv` at `p` into a NaN-filled buffer, so unwritten outputs fail.
    /// No original weights are passed to `run`: the kernel must use its
    /// packed copy.
    fn run(conv: &PreparedConv1d, p: &Conv1dParams, x: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
        let mut y = vec![f32::NAN; p.output_elems().unwrap()];
        let scratch = Scratch::new(rayon::current_num_threads(), conv.scratch_per_thread());
        assert!(!conv.reads_weights());
        conv.run(p, x, None, bias, &mut y, &scratch).unwrap();
        y
    }

    fn abs(v: &[f32]) -> Vec<f32> {
        v.iter().map(|e| e.abs()).collect()
    }

    /// Runs `conv` at `p` on random `x` and checks it against the reference
    /// within `2 n eps` of the per-output sum of |terms|, `n` the number of
    /// terms: f32 summation of `n` terms in any order errs by at most about
    /// `n eps` of that sum.
    fn check_at(
        conv: &PreparedConv1d,
        p: &Conv1dParams,
        w: &[f32],
        bias: Option<&[f32]>,
        rng: &mut Rng,
        context: &str,
    ) {
        let x = rng.vec(p.input_elems(), -1.0, 1.0);
        let got = run(conv, p, &x, bias);
        let want = reference::conv1d_f32(p, &x, w, bias).unwrap();
        let abs_bias = bias.map(abs);
        let magnitude = reference::conv1d_f32(p, &abs(&x), &abs(w), abs_bias.as_deref()).unwrap();
        let terms = (p.in_channels / p.groups * p.kernel_size + 1) as f32;
        let tol: Vec<f32> = magnitude
            .iter()
            .map(|m| 2.0 * terms * f32::EPSILON * m)
            .collect();
        assert_close(&got, &want, &tol, context);
    }

    /// Prepares at `max` with random weights and bias, then checks runs at
    /// `max` and at each smaller (batch, in_len) that is valid.
    fn check_prepared(max: &Conv1dParams, smaller: &[(usize, usize)], rng: &mut Rng, name: &str) {
        let w = rng.vec(max.weight_elems(), -1.0, 1.0);
        let bias = rng.vec(max.bias_elems(), -1.0, 1.0);
        let conv = prepare(max, &w);
        assert_eq!(conv.prepared_bytes(), 4 * max.weight_elems());
        for with_bias in [false, true] {
            let bias = with_bias.then_some(&bias[..]);
            let runs = std::iter::once((max.batch, max.in_len)).chain(smaller.iter().copied());
            for (batch, in_len) in runs {
                let p = Conv1dParams {
                    batch,
                    in_len,
                    ..*max
                };
                if batch > max.batch || in_len > max.in_len || p.validate().is_err() {
                    continue;
                }
                let context = format!("{name}, bias {with_bias}: {p:?} prepared at {max:?}");
                check_at(&conv, &p, &w, bias, rng, &context);
            }
        }
    }

    #[test]
    fn grid_matches_reference() {
        let mut rng = Rng::new(7);
        let channels = [
            ("dense", (3, 5, 1)),
            ("groups 4", (12, 8, 4)),
            ("groups 2", (6, 4, 2)),
            ("depthwise multiplier 2", (3, 6, 3)),
        ];
        let pads = [(0, 0), (2, 2), (3, 1), (4, 0)];
        for (name, ch) in channels {
            for kernel_size in [1, 3, 7] {
                for stride in 1..=3 {
                    for dilation in 1..=3 {
                        for pad in pads {
                            let in_len = rng.range(1, 40);
                            let max = params(2, ch, in_len, kernel_size, stride, pad, dilation);
                            if max.validate().is_err() {
                                continue;
                            }
                            let smaller = [(1, in_len), (2, in_len / 2), (1, 1)];
                            check_prepared(&max, &smaller, &mut rng, name);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn edge_shapes_match_reference() {
        let mut rng = Rng::new(11);
        let cases = [
            (
                "K > N with padding",
                params(1, (2, 3, 1), 4, 7, 1, (3, 3), 1),
            ),
            ("K > N grouped", params(2, (6, 4, 2), 2, 7, 1, (6, 3), 1)),
            ("stride > N", params(1, (2, 2, 1), 5, 2, 8, (1, 1), 1)),
            (
                "stride > N, two outputs",
                params(2, (4, 2, 2), 5, 2, 8, (1, 10), 1),
            ),
            (
                "outputs reading only padding",
                params(1, (2, 2, 1), 3, 2, 1, (6, 5), 1),
            ),
            (
                "empty input, padding only",
                params(2, (2, 3, 1), 0, 3, 1, (2, 1), 1),
            ),
            ("N = 1", params(2, (12, 8, 4), 1, 3, 1, (1, 1), 1)),
            ("K = N", params(2, (3, 2, 1), 6, 6, 1, (0, 0), 1)),
            ("pointwise", params(2, (5, 7, 1), 200, 1, 1, (0, 0), 1)),
            ("long causal", params(1, (6, 4, 2), 200, 7, 1, (6, 0), 1)),
            (
                "long dilated strided",
                params(2, (12, 8, 4), 197, 3, 3, (2, 5), 3),
            ),
            (
                "one output channel",
                params(1, (8, 1, 1), 50, 3, 2, (1, 1), 2),
            ),
            (
                "one input channel per group",
                params(1, (4, 8, 4), 60, 3, 1, (1, 1), 1),
            ),
        ];
        for (name, max) in cases {
            check_prepared(&max, &[(1, max.in_len / 2), (1, 0)], &mut rng, name);
        }
    }

    #[test]
    fn several_tiles_and_blocks_match_reference() {
        // Shapes whose tiling has many chunks, channel blocks, or both, with
        // channel counts large enough for gemm's full micro-kernels.
        let mut rng = Rng::new(13);
        let cases = [
            ("many chunks", params(1, (16, 24, 1), 1500, 3, 1, (1, 1), 1)),
            (
                "many chunks, stride 2",
                params(1, (16, 24, 1), 1500, 3, 2, (1, 1), 1),
            ),
            (
                "chunks, stride 3, dilation 2, grouped",
                params(2, (12, 8, 4), 900, 7, 3, (6, 2), 2),
            ),
            ("row blocks", params(1, (40, 128, 1), 100, 5, 1, (2, 2), 1)),
            (
                "row blocks grouped",
                params(1, (64, 192, 2), 70, 3, 2, (1, 0), 2),
            ),
            (
                "batch 2, chunks",
                params(2, (32, 32, 4), 1100, 7, 1, (3, 3), 1),
            ),
        ];
        for (name, max) in cases {
            let g = max.geometry().unwrap();
            let t = Tiling::new(&g);
            assert!(t.chunks > 1 || t.row_blocks > 1, "{name}: {t:?}");
            check_prepared(&max, &[(1, max.in_len - 37), (2, 130)], &mut rng, name);
        }
    }

    #[test]
    fn random_shapes_match_reference() {
        let mut rng = Rng::new(1234);
        let mut checked = 0;
        for trial in 0..300 {
            let groups = rng.range(1, 4);
            let max = Conv1dParams {
                batch: rng.range(1, 2),
                in_channels: groups * rng.range(1, 6),
                out_channels: groups * rng.range(1, 6),
                in_len: rng.range(1, 200),
                kernel_size: rng.range(1, 8),
                stride: rng.range(1, 3),
                pad_left: rng.range(0, 6),
                pad_right: rng.range(0, 6),
                dilation: rng.range(1, 3),
                groups,
            };
            let Ok(g) = max.geometry() else { continue };
            if !applies(&g) {
                continue;
            }
            let smaller = [(1, rng.range(0, max.in_len))];
            check_prepared(&max, &smaller, &mut rng, &format!("trial {trial}"));
            checked += 1;
        }
        assert!(checked > 150, "only {checked} valid shapes");
    }

    #[test]
    fn structured_inputs_match_reference_exactly() {
        // Small integers keep every partial sum exact in f32, so the result
        // must equal the reference bit for bit whatever the summation order.
        let cases = [
            params(2, (12, 8, 4), 31, 3, 2, (1, 2), 2),
            params(1, (3, 5, 1), 20, 7, 1, (6, 0), 1),
            params(2, (40, 128, 1), 90, 3, 1, (1, 1), 1),
        ];
        for max in cases {
            let ramp = |n: usize, modulus: usize| (0..n).map(|i| (i % modulus) as f32).collect();
            let x: Vec<f32> = ramp(max.input_elems(), 17);
            let w: Vec<f32> = ramp(max.weight_elems(), 7);
            let bias: Vec<f32> = ramp(max.bias_elems(), 5);
            let conv = prepare(&max, &w);
            for bias in [None, Some(&bias[..])] {
                let want = reference::conv1d_f32(&max, &x, &w, bias).unwrap();
                assert_eq!(run(&conv, &max, &x, bias), want, "{max:?}");
            }
        }
    }

    #[test]
    fn result_does_not_depend_on_pool_size() {
        let mut rng = Rng::new(5);
        let p = params(2, (24, 32, 2), 700, 5, 2, (3, 1), 2);
        let x = rng.vec(p.input_elems(), -1.0, 1.0);
        let w = rng.vec(p.weight_elems(), -1.0, 1.0);
        let bias = rng.vec(p.bias_elems(), -1.0, 1.0);
        let conv = prepare(&p, &w);
        let run_on = |threads| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| run(&conv, &p, &x, Some(&bias)))
        };
        let single = run_on(1);
        for threads in [2, 3] {
            assert_eq!(run_on(threads), single, "{threads} threads");
        }
    }

    #[test]
    fn applies_to_all_but_depthwise_multiplier_one() {
        let applies_to = |ch| applies(&params(1, ch, 10, 3, 1, (0, 0), 1).geometry().unwrap());
        assert!(applies_to((4, 4, 1)));
        assert!(applies_to((6, 4, 2)));
        assert!(applies_to((4, 8, 4)));
        assert!(!applies_to((4, 4, 4)));
        assert!(!applies_to((1, 1, 1)));
        let p = params(1, (4, 4, 4), 10, 3, 1, (0, 0), 1);
        assert_eq!(
            PreparedConv1d::new(&p, &[0.0; 12], Choice::Force(Algorithm::Gemm)).err(),
            Some(KernelError::NotApplicable { algorithm: "gemm" })
        );
    }

    #[test]
    fn packs_each_group_and_tap_row_major() {
        // w[o, c, k] = 100 o + 10 c + k; 2 groups of 2 inputs and 3 outputs, 2 taps.
        let p = params(1, (4, 6, 2), 8, 2, 1, (0, 0), 1);
        let g = p.geometry().unwrap();
        let w: Vec<f32> = (0..6)
            .flat_map(|o| {
                (0..2).flat_map(move |c| (0..2).map(move |k| (100 * o + 10 * c + k) as f32))
            })
            .collect();
        let conv = GemmConv::prepare(&g, &w);
        let panel = |group: usize, k: usize| -> Vec<f32> {
            (0..3)
                .flat_map(|o| (0..2).map(move |c| (100 * (group * 3 + o) + 10 * c + k) as f32))
                .collect()
        };
        let expected: Vec<f32> = [(0, 0), (0, 1), (1, 0), (1, 1)]
            .into_iter()
            .flat_map(|(group, k)| panel(group, k))
            .collect();
        assert_eq!(&*conv.packed, &expected[..]);
        assert_eq!(conv.prepared_bytes(), 4 * 24);
        assert_eq!(conv.scratch_per_thread(), 0);
    }

    #[test]
    fn tiling_partitions_the_output() {
        let mut rng = Rng::new(3);
        for _ in 0..2000 {
            let groups = rng.range(1, 8);
            let p = Conv1dParams {
                batch: rng.range(0, 4),
                in_channels: groups,
                out_channels: groups * rng.range(1, 300),
                in_len: rng.range(1, 5000),
                kernel_size: 1,
                stride: 1,
                pad_left: 0,
                pad_right: 0,
                dilation: 1,
                groups,
            };
            let g = p.geometry().unwrap();
            let t = Tiling::new(&g);
            let context = format!("{p:?}: {t:?}");
            // Every chunk and block is non-empty and together they cover exactly.
            assert!(t.chunk >= 1 && t.rows >= 1, "{context}");
            assert_eq!(t.chunks, g.out_len.div_ceil(t.chunk), "{context}");
            assert_eq!(t.row_blocks, g.out_per_group.div_ceil(t.rows), "{context}");
            assert!(t.chunk <= CHUNK_MAX.max(CHUNK_ALIGN), "{context}");
            if t.chunks > 1 {
                assert!(t.chunk >= CHUNK_MIN.min(g.out_len), "{context}");
            }
            if t.row_blocks > 1 {
                assert!(t.rows >= ROWS_MIN, "{context}");
            }
        }
    }

    #[test]
    fn cost_is_finite_and_grows_with_work() {
        let small = params(1, (64, 64, 1), 1000, 3, 1, (1, 1), 1);
        let large = Conv1dParams {
            in_len: 4000,
            ..small
        };
        let (cs, cl) = (
            cost(&small.geometry().unwrap()),
            cost(&large.geometry().unwrap()),
        );
        assert!(cs.is_finite() && cs > 0.0 && cl > cs, "{cs} {cl}");
    }
}
