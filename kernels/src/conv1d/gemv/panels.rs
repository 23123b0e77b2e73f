//! Short calls of a conv with constant weights, output channels in the
//! vector lanes: the weights packed once at prepare into panels of `W`
//! output channels, `[filter tap][channel]`, so that a block of `T`
//! outputs by `W` channels takes, per filter tap, `W / LANES` vector loads
//! of the panel shared by `T` broadcasts of the call's columns:
//! `T · W / LANES` multiply-adds per `W / LANES + T` loads, where the dot
//! products along the filter ([`super::dots_generic`]) take one column
//! load per multiply-add and reduce every output's lanes at the end.
//!
//! This is how XNNPACK runs such a conv (channels-last, packed weights);
//! measured: see [`PANELS_MIN_OUTPUTS`]. The packed copy costs the
//! weights' size again, so only convs whose every call is short and has
//! several outputs pack them: a decode step of one output reads each
//! weight once for one multiply-add either way, bound by memory.
//!
//! Each output is its bias plus one sum over the filter's taps in
//! ascending order, whatever the tiling or the number of threads.

#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

use crate::conv1d::params::Conv1dGeometry;
use crate::simd::{per_backend, Backend, Isa, Simd};

/// Fewest outputs per call (of the prepared shape) for which a conv packs
/// its weights. Against the dot products (pte_runner p10, one thread,
/// AVX-512, K = 3): 128 -> 128 channels + GELU, 8 outputs 15.5 -> 9.4 µs
/// (XNNPACK 9.8), 6 outputs 12.0 -> 7.9 µs (XNNPACK 5.7); 256 -> 256,
/// 8 outputs 39.9 -> 24.8 µs (XNNPACK 33.4); and 512 -> 512, 8 outputs,
/// which the GEMM ran, 267 -> 134 µs (XNNPACK 191).
pub(crate) const PANELS_MIN_OUTPUTS: usize = 2;

/// Most outputs per row a call of packed weights may have: the
/// matrix-vector kernel's bound (its `MAX_OUTPUTS` is this). Against the
/// GEMM, pointwise convs, one AVX-512 thread (kernel alone, median of
/// 15 × 50 calls): 128 -> 256 channels, 16 outputs 17.0 -> 10.4 µs, 32
/// outputs 19.0 -> 20.0; 512 -> 512, 16 outputs 121 -> 61 µs, 32 outputs
/// 135 -> 120. At 64 outputs the GEMM was as fast or faster (38 vs 40 µs
/// at 128 -> 256).
pub(super) const MAX_OUTPUTS: usize = 32;

/// Outputs per row one block of a panel computes ([`panel_generic`]'s
/// `T`): longer calls run blocks of this many in turn over the same panel
/// (in L1 or L2 by the second block).
const BLOCK_OUTPUTS: usize = 8;

/// Most floats of a panel block [`panel_generic`] writes: `T · W`.
const MAX_BLOCK: usize = BLOCK_OUTPUTS * MAX_WIDTH;

/// Widest panel of any backend; every width divides it, so a task of a
/// multiple of it output channels is whole panels.
pub(super) const MAX_WIDTH: usize = 32;

/// `f(panel, cols, filter_len, bias, out)`: one block of a call's outputs
/// by one panel's channels; unsafe for the CPU features it is compiled
/// for.
type PanelFn = unsafe fn(&[f32], Cols, usize, &[f32], &mut [f32]);

/// A call's columns: the value output `t` multiplies with tap `j` of a
/// filter is `data[t · t_stride + j · j_stride]`. Gathered columns lie
/// output after output (`t_stride` the filter's length, `j_stride` 1); a
/// pointwise conv's input rows are its columns as they lie (`t_stride` 1,
/// `j_stride` the row length), with no gather.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cols<'a> {
    pub data: &'a [f32],
    pub t_stride: usize,
    pub j_stride: usize,
}

impl<'a> Cols<'a> {
    /// The columns of outputs `t0 ..`.
    fn starting_at(self, t0: usize) -> Self {
        Cols {
            data: &self.data[(t0 * self.t_stride).min(self.data.len())..],
            ..self
        }
    }

    /// Whether the values of `t < outputs`, `j < len` lie inside `data`.
    fn holds(&self, outputs: usize, len: usize) -> bool {
        outputs == 0
            || len == 0
            || (outputs - 1) * self.t_stride + (len - 1) * self.j_stride < self.data.len()
    }
}

/// A conv's weights packed into panels, and the kernels that read them.
pub(crate) struct Panels {
    /// `[group][panel][tap][W]`, channels past the group's last zero.
    data: Box<[f32]>,
    /// Output channels per panel.
    width: usize,
    /// Taps per filter: `cin · K`.
    filter_len: usize,
    /// Panels per group.
    per_group: usize,
    /// Indexed by the number of outputs of a block minus one.
    kernels: [PanelFn; BLOCK_OUTPUTS],
}

/// `$f::<T, V>` for `T` in `1 ..= BLOCK_OUTPUTS`.
macro_rules! per_outputs {
    ($f:ident, $v:literal) => {
        [
            $f::<1, $v> as PanelFn,
            $f::<2, $v>,
            $f::<3, $v>,
            $f::<4, $v>,
            $f::<5, $v>,
            $f::<6, $v>,
            $f::<7, $v>,
            $f::<8, $v>,
        ]
    };
}
const _: () = assert!(BLOCK_OUTPUTS == 8, "per_outputs! lists 8 kernels");

impl Panels {
    /// `w` (`[out_channels][cin][K]`) packed for `isa`.
    pub(crate) fn new(isa: Isa, g: &Conv1dGeometry, w: &[f32]) -> Self {
        let backend = isa.backend();
        // `W / LANES` panel vectors and `T · W / LANES` accumulators fit
        // the register file for every `T` up to 8 (32 registers on
        // AVX-512 and NEON, 16 on AVX2 and the portable backend's SSE2).
        let (width, kernels) = match backend {
            Backend::Portable => (8, per_outputs!(panel_portable, 1)),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 => (8, per_outputs!(panel_avx2, 1)),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512 => (32, per_outputs!(panel_avx512, 2)),
            #[cfg(target_arch = "aarch64")]
            Backend::Neon => (8, per_outputs!(panel_neon, 2)),
        };
        debug_assert!(MAX_WIDTH.is_multiple_of(width));
        let p = &g.params;
        let (cout, filter_len) = (g.out_per_group, g.in_per_group * p.kernel_size);
        assert_eq!(w.len(), p.out_channels * filter_len, "weights");
        let per_group = cout.div_ceil(width);
        let mut data = vec![0.0; p.groups * per_group * filter_len * width].into_boxed_slice();
        for (i, panel) in data.chunks_exact_mut(filter_len * width).enumerate() {
            let (group, first) = (i / per_group, i % per_group * width);
            for c in 0..width.min(cout - first) {
                let filter = &w[(group * cout + first + c) * filter_len..][..filter_len];
                for (j, &v) in filter.iter().enumerate() {
                    panel[j * width + c] = v;
                }
            }
        }
        Panels {
            data,
            width,
            filter_len,
            per_group,
            kernels,
        }
    }

    /// Outputs `values[r · n + t]` (`r < rows.len()`, `t < n`) of output
    /// channels `rows` of `group` (starting at a multiple of the width),
    /// from the call's columns `cols` (`n` outputs of `cin · K` values)
    /// and the bias of those channels.
    pub(crate) fn outputs(
        &self,
        group: usize,
        rows: std::ops::Range<usize>,
        n: usize,
        cols: Cols,
        bias: Option<&[f32]>,
        values: &mut [f32],
    ) {
        let w = self.width;
        let (r0, rows) = (rows.start, rows.len());
        assert!(
            r0.is_multiple_of(w) && (1..=MAX_OUTPUTS).contains(&n),
            "{r0} {n}"
        );
        assert!(values.len() >= rows * n, "values");
        let (len, panel_len) = (self.filter_len, self.filter_len * w);
        let mut block = [0.0f32; MAX_BLOCK];
        for first in (0..rows).step_by(w) {
            let panel = group * self.per_group + (r0 + first) / w;
            let panel = &self.data[panel * panel_len..][..panel_len];
            let m = w.min(rows - first);
            let mut b = [0.0f32; MAX_WIDTH];
            if let Some(bias) = bias {
                b[..m].copy_from_slice(&bias[first..first + m]);
            }
            let values = &mut values[first * n..][..m * n];
            for t0 in (0..n).step_by(BLOCK_OUTPUTS) {
                let nb = BLOCK_OUTPUTS.min(n - t0);
                let kernel = self.kernels[nb - 1];
                // SAFETY: `new` chose `kernel` for a backend whose
                // features this CPU has; it checks its bounds.
                unsafe {
                    kernel(
                        panel,
                        cols.starting_at(t0),
                        len,
                        &b[..w],
                        &mut block[..nb * w],
                    )
                };
                match (w, nb) {
                    (32, BLOCK_OUTPUTS) => transpose_block::<32>(&block, values, n, t0),
                    (8, BLOCK_OUTPUTS) => transpose_block::<8>(&block, values, n, t0),
                    _ => {
                        for (r, values) in values.chunks_exact_mut(n).enumerate() {
                            for (t, v) in values[t0..t0 + nb].iter_mut().enumerate() {
                                *v = block[t * w + r];
                            }
                        }
                    }
                }
            }
        }
    }

    /// Bytes the packed panels hold.
    pub(crate) fn bytes(&self) -> usize {
        std::mem::size_of_val(&*self.data)
    }
}

/// `values[r · n + t0 + t] = block[t · W + r]` for a whole block of
/// [`BLOCK_OUTPUTS`] outputs of a `W`-channel panel (the rows of `values`
/// being its channels, at most `W`): with `W` known, the copies go
/// without bounds checks, 8 outputs of a channel at once.
fn transpose_block<const W: usize>(
    block: &[f32; MAX_BLOCK],
    values: &mut [f32],
    n: usize,
    t0: usize,
) {
    let block: &[[f32; W]] = block.as_chunks::<W>().0;
    let block: &[[f32; W]; BLOCK_OUTPUTS] = block[..BLOCK_OUTPUTS].try_into().expect("a block");
    for (r, values) in values.chunks_exact_mut(n).take(W).enumerate() {
        let out: &mut [f32; BLOCK_OUTPUTS] = (&mut values[t0..t0 + BLOCK_OUTPUTS])
            .try_into()
            .expect("a block of outputs");
        *out = std::array::from_fn(|t| block[t][r % W]);
    }
}

/// `out[t · W + c] = bias[c] + Σ_j col(t, j) · panel[j · W + c]` for `t <
/// T`, `c < W = V · LANES`, `col(t, j)` the value of [`Cols`]: the taps in
/// ascending order, one multiply-add each.
///
/// # Safety
/// `S`'s features are present. Bounds are checked (panics).
#[inline(always)]
unsafe fn panel_generic<S: Simd, const T: usize, const V: usize>(
    panel: &[f32],
    cols: Cols,
    len: usize,
    bias: &[f32],
    out: &mut [f32],
) {
    let w = V * S::LANES;
    assert!(panel.len() == len * w && cols.holds(T, len));
    assert!(bias.len() == w && out.len() == T * w);
    // SAFETY: features by our contract; every load reads LANES values at
    // j · w + v · LANES + LANES <= len · w of `panel`, or v · LANES +
    // LANES <= w of `bias`; every store writes LANES values at t · w +
    // v · LANES + LANES <= T · w of `out`; every scalar read is the
    // column value of t < T, j < len, inside `cols.data` (all asserted
    // above).
    unsafe {
        let mut acc = [[S::splat(0.0); V]; T];
        for v in 0..V {
            let b = S::load(bias.as_ptr().add(v * S::LANES));
            for acc in acc.iter_mut() {
                acc[v] = b;
            }
        }
        for j in 0..len {
            let mut wv = [S::splat(0.0); V];
            for (v, wv) in wv.iter_mut().enumerate() {
                *wv = S::load(panel.as_ptr().add(j * w + v * S::LANES));
            }
            for (t, acc) in acc.iter_mut().enumerate() {
                let x = S::splat(
                    *cols
                        .data
                        .as_ptr()
                        .add(t * cols.t_stride + j * cols.j_stride),
                );
                for v in 0..V {
                    acc[v] = S::mul_add(acc[v], wv[v], x);
                }
            }
        }
        for (t, acc) in acc.iter().enumerate() {
            for (v, &a) in acc.iter().enumerate() {
                S::store(out.as_mut_ptr().add(t * w + v * S::LANES), a);
            }
        }
    }
}

per_backend! {
    /// [`panel_generic`] on one backend.
    unsafe fn [panel_portable, panel_avx2, panel_avx512, panel_neon]<const T: usize, const V: usize>(
        panel: &[f32],
        cols: Cols,
        len: usize,
        bias: &[f32],
        out: &mut [f32],
    ) => panel_generic::<S, T, V>
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv1d::gemv::{gather_columns, pointwise, Gemv, ROWS};
    use crate::fused::{RowSink, RowSource, RowsIn, RowsOut};
    use crate::test_support::{
        assert_conv_close, conv_params as params, run_into_relu, thinned_under_emulation, Rng,
    };
    use crate::{Algorithm, Choice, Conv1dParams, PreparedConv1d, Weights};

    fn check(p: &Conv1dParams, x: &[f32], w: &[f32], bias: Option<&[f32]>, got: &[f32], ctx: &str) {
        let terms = (p.in_channels / p.groups * p.kernel_size + 1) as f32;
        assert_conv_close(p, x, w, bias, got, 2.0 * terms * f32::EPSILON, ctx);
    }

    /// Batch, (in, out channels, groups), K, stride, pads, dilation.
    type Shape = (
        usize,
        (usize, usize, usize),
        usize,
        usize,
        (usize, usize),
        usize,
    );

    /// Dense and grouped, strided, dilated, padded, output channels that
    /// fill panels and ragged ones, more than one task's rows.
    /// The last one's columns pass L1: unpacked, its longer calls would
    /// stay with the GEMM.
    /// Pointwise ones too (one tap, stride 1, no padding), whose panels
    /// read the input rows where they lie.
    const SHAPES: [Shape; 8] = [
        (1, (128, 128, 1), 3, 1, (2, 0), 1),
        (1, (40, 70, 1), 1, 1, (0, 0), 1),
        (2, (12, 8, 4), 1, 1, (0, 0), 1),
        (2, (12, 8, 4), 3, 2, (1, 1), 2),
        (1, (3, 70, 1), 3, 1, (1, 1), 1),
        (1, (16, 40, 2), 5, 1, (0, 0), 1),
        (1, (80, 33, 1), 7, 3, (3, 3), 1),
        (1, (300, 70, 1), 3, 1, (2, 0), 1),
    ];

    /// Each panel kernel, on every backend this CPU has, for every number
    /// of outputs: packed weights times gathered columns, plus the bias,
    /// against the reference conv.
    #[test]
    fn panels_match_the_reference_on_every_backend() {
        let mut rng = Rng::new(31);
        let cases = SHAPES
            .iter()
            .flat_map(|&shape| (1..=MAX_OUTPUTS).map(move |outputs| (shape, outputs)));
        for ((b, ch, k, stride, pad, dil), outputs) in thinned_under_emulation(cases) {
            let in_len = (outputs - 1) * stride + (k - 1) * dil + 1 - pad.0 - pad.1;
            let p = params(b, ch, in_len, k, stride, pad, dil);
            let g = p.geometry().unwrap();
            assert_eq!(g.out_len, outputs);
            let x = rng.vec(p.input_elems(), -1.0, 1.0);
            let w = rng.vec(p.weight_elems(), -1.0, 1.0);
            let bias = rng.vec(p.bias_elems(), -1.0, 1.0);
            let (cin, cout) = (g.in_per_group, g.out_per_group);
            for isa in Isa::all_available() {
                let backend = isa.backend();
                let panels = Panels::new(isa, &g, &w);
                assert_eq!(
                    panels.bytes(),
                    4 * p.groups * cout.div_ceil(panels.width) * panels.width * cin * k
                );
                for bias in [None, Some(&bias[..])] {
                    let mut y = vec![f32::NAN; g.output_elems];
                    for (bg, y) in y.chunks_exact_mut(cout * outputs).enumerate() {
                        let (bi, group) = (bg / p.groups, bg % p.groups);
                        let row0 = bi * p.in_channels + group * cin;
                        let xg = &x[row0 * in_len..][..cin * in_len];
                        let mut cols = vec![f32::NAN; outputs * cin * k];
                        gather_columns(&g, xg, outputs, &mut cols);
                        let cols = if pointwise(&g) {
                            Cols {
                                data: xg,
                                t_stride: 1,
                                j_stride: in_len,
                            }
                        } else {
                            Cols {
                                data: &cols,
                                t_stride: cin * k,
                                j_stride: 1,
                            }
                        };
                        for r0 in (0..cout).step_by(ROWS) {
                            let rows = ROWS.min(cout - r0);
                            let o = group * cout + r0;
                            let bias = bias.map(|bias| &bias[o..o + rows]);
                            let values = &mut y[r0 * outputs..][..rows * outputs];
                            panels.outputs(group, r0..r0 + rows, outputs, cols, bias, values);
                        }
                    }
                    let ctx = format!("{backend:?} {p:?} bias {}", bias.is_some());
                    check(&p, &x, &w, bias, &y, &ctx);
                }
            }
        }
    }

    /// A conv prepared for calls of 2 to 8 outputs packs its constant
    /// weights, and its calls (that length, and shorter ones of a dynamic
    /// length) come out right, stored or handed to an epilogue; a conv of
    /// one output per call, or fed weights, does not pack.
    /// A stored input handed over as a prologue's, with one temporary.
    struct Copied<'a> {
        x: &'a [f32],
        in_len: usize,
        /// [`RowSource::prefers_columns`]: a pointwise conv's panels then
        /// have it fill their columns (`[t][c]`) a column at a time.
        across: bool,
        /// Columns filled ([`RowSource::fill_col`] calls).
        columns: std::sync::atomic::AtomicUsize,
    }

    impl<'a> Copied<'a> {
        fn new(x: &'a [f32], in_len: usize, across: bool) -> Self {
            Copied {
                x,
                in_len,
                across,
                columns: Default::default(),
            }
        }
    }

    impl RowSource for Copied<'_> {
        fn fill(&self, row: usize, t0: usize, out: &mut [f32], _tmp: &mut [f32]) {
            out.copy_from_slice(&self.x[row * self.in_len + t0..][..out.len()]);
        }
        fn temporaries(&self) -> usize {
            1
        }
        fn isa(&self) -> crate::simd::Isa {
            crate::simd::Isa::detect()
        }
        fn prefers_columns(&self) -> bool {
            self.across
        }
        fn fill_col(&self, row0: usize, t: usize, out: &mut [f32], _tmp: &mut [f32]) {
            self.columns
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            for (r, o) in out.iter_mut().enumerate() {
                *o = self.x[(row0 + r) * self.in_len + t];
            }
        }
    }

    /// An epilogue storing across rows (as a transposed result does): it
    /// takes a call's rows in blocks, and counts them.
    struct Across {
        out: std::sync::Mutex<Vec<f32>>,
        out_len: usize,
        blocks: std::sync::atomic::AtomicUsize,
    }

    impl RowSink for Across {
        fn store(&self, row: usize, t0: usize, values: &[f32], _tmp: &mut [f32]) {
            let mut out = self.out.lock().unwrap();
            out[row * self.out_len + t0..][..values.len()].copy_from_slice(values);
        }
        fn temporaries(&self) -> usize {
            0
        }
        fn store_rows(
            &self,
            row0: usize,
            rows: usize,
            t0: usize,
            len: usize,
            values: &mut [f32],
            tmp: &mut [f32],
        ) {
            self.blocks
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            for (r, values) in values.chunks_exact(len).take(rows).enumerate() {
                self.store(row0 + r, t0, values, tmp);
            }
        }
        fn stores_across(&self, _row0: usize, _rows: usize, _len: usize) -> bool {
            true
        }
    }

    #[test]
    fn prepared_short_convs_pack_and_run_stored_or_fused() {
        let mut rng = Rng::new(37);
        for (b, ch, k, stride, pad, dil) in SHAPES {
            for outputs in [1, 2, 5, 8, 9, 16, 31, 32, 33] {
                let in_len = (outputs - 1) * stride + (k - 1) * dil + 1 - pad.0 - pad.1;
                let max = params(b, ch, in_len, k, stride, pad, dil);
                let g = max.geometry().unwrap();
                let w = rng.vec(max.weight_elems(), -1.0, 1.0);
                let bias = rng.vec(max.bias_elems(), -1.0, 1.0);
                let packs = (2..=MAX_OUTPUTS).contains(&outputs);
                assert_eq!(Gemv::packs(&g), packs, "{max:?}");
                let conv = PreparedConv1d::new(&max, &w, Choice::Auto).unwrap();
                if packs {
                    assert_eq!(conv.algorithm(), Algorithm::Gemm, "{max:?}");
                }
                assert_eq!(conv.packed(), packs, "{max:?}");
                // The packed copy is reported; the GEMM reads in place.
                let (cout, filter_len) = (g.out_per_group, g.in_per_group * k);
                let at_least = 4 * max.groups * cout * filter_len;
                if conv.packed() {
                    assert!(conv.prepared_bytes() >= at_least, "{max:?}");
                } else {
                    assert_eq!(conv.prepared_bytes(), 0, "{max:?}");
                }
                let fed = PreparedConv1d::for_weights(&max, Weights::Fed, Choice::Auto).unwrap();
                assert!(!fed.packed());
                for shorter in [0, stride] {
                    let p = Conv1dParams {
                        in_len: in_len - shorter.min(in_len - 1),
                        ..max
                    };
                    let Ok(pg) = p.geometry() else { continue };
                    if pg.out_len == 0 {
                        continue;
                    }
                    let x = rng.vec(p.input_elems(), -1.0, 1.0);
                    let scratch = crate::Scratch::sized(
                        crate::par::threads(),
                        conv.rows_scratch_per_thread(0, 0),
                        conv.shared_scratch(),
                    );
                    let mut y = vec![f32::NAN; pg.output_elems];
                    conv.run(&p, &x, Some(&w), Some(&bias), &mut y, &scratch)
                        .unwrap();
                    check(&p, &x, &w, Some(&bias), &y, &format!("{p:?}"));
                    if conv.fuses_output() {
                        let relu: Vec<f32> = y.iter().map(|v| v.max(0.0)).collect();
                        let fused = run_into_relu(&conv, &p, &x, &w, Some(&bias), &scratch);
                        assert_eq!(fused, relu, "{p:?}");
                        // Calls of more than 4 outputs hand a sink that
                        // stores across rows each task's rows whole.
                        let across = Across {
                            out: std::sync::Mutex::new(vec![f32::NAN; pg.output_elems]),
                            out_len: pg.out_len,
                            blocks: Default::default(),
                        };
                        conv.run_rows(
                            &p,
                            RowsIn::Slice(&x),
                            Some(&w),
                            Some(&bias),
                            RowsOut::Fused(&across),
                            0,
                            0,
                            &scratch,
                        )
                        .unwrap();
                        let blocks = across.blocks.into_inner();
                        assert_eq!(across.out.into_inner().unwrap(), y, "{p:?}");
                        if conv.packed() && pg.out_len > 4 {
                            assert!(blocks > 0, "{p:?}");
                        }
                    }
                    // The input from a prologue (into the shared region
                    // where a pointwise conv's panels read it), as rows or,
                    // where the prologue's rows lie across, as columns.
                    for across in [false, true].into_iter().filter(|_| conv.fuses_input()) {
                        let source = Copied::new(&x, p.in_len, across);
                        let mut from_source = vec![f32::NAN; pg.output_elems];
                        let scratch = crate::Scratch::sized(
                            crate::par::threads(),
                            conv.rows_scratch_per_thread(1, 0),
                            conv.shared_scratch(),
                        );
                        conv.run_rows(
                            &p,
                            RowsIn::Fused(&source),
                            Some(&w),
                            Some(&bias),
                            RowsOut::Slice(&mut from_source),
                            1,
                            0,
                            &scratch,
                        )
                        .unwrap();
                        assert_eq!(from_source, y, "fused input, across {across}, {p:?}");
                        // Pointwise convs of packed weights (panels reading
                        // the prologue's values in place) take columns.
                        let columns = source.columns.into_inner();
                        let pointwise = (k, stride, pad) == (1, 1, (0, 0));
                        let as_columns = across && conv.packed() && pointwise;
                        assert_eq!(columns > 0, as_columns, "across {across}, {p:?}");
                    }
                }
            }
        }
    }
}
