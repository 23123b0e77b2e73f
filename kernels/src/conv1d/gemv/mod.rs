//! Dense and grouped conv1d calls of a few outputs per row (a decode step:
//! one new token and the state before it) as matrix-vector products over
//! the weights where the model holds them.
//!
//! The algorithms chosen for a conv's longest calls waste most of their
//! work on a call of one output: the GEMM computes blocks of 48 positions
//! (AVX-512) to keep one, `fft_gemm` computes every panel's weight spectra
//! for one block, and the direct loop is scalar. Measured on one thread,
//! 250 → 250 channels, `K = 11`, one output per row: `gemm` 388 µs,
//! `fft_gemm` 841 µs, `direct` 1.48 ms. Here every output channel's filter
//! (`cin · K` contiguous values) is multiplied with the call's columns (the
//! `cin · K` inputs each output reads, gathered once per task, padding as
//! zeros), so the call reads each weight once and is bound by reading them
//! (2.75 MB for that layer). A call of one output per row (a decode step)
//! reads [`STREAMS`] filters side by side, sharing each load of its column
//! ([`rows_generic`]); calls of more share each load of a filter between
//! up to four outputs' accumulators, prefetching the weights [`AHEAD`]
//! floats ahead of the multiply-adds.
//!
//! # Measured
//!
//! The benchmark's `decode_conv_stack` (12 causal layers of the above,
//! ReLU, a state per layer; 33 MB of weights per token), pte_runner p50 on
//! the 2-core AMD EPYC VM, 2026-11-25: 0.99 ms at 2 threads and 1.18 ms at
//! 1, where the previous build (the direct loop at one output) took
//! 14.8 ms; XNNPACK alone 0.375 and 0.62 ms. The matrix-vector products
//! alone took about 0.45 ms of it at 2 threads; the rest is the 24 steps a
//! token makes (each layer's state update, then its conv with the `cat` of
//! state and token staged through memory).
//!
//! On the 2-core AMD EPYC (Zen 3) VM, whose DRAM holds the weights
//! (25 GB/s copy bandwidth), 2026-11-29, median of 5 alternating rounds:
//! the filters read as eight streams took the same program from 3.19 to
//! 1.88 ms at 1 thread and from 1.62 to 1.12 ms at 2, against XNNPACK's
//! 2.65 and 1.51 (0.83x and 0.69x before, 1.41x and 1.34x after); on the
//! 16-core Xeon (the weights in its L3) both builds ran within noise
//! (1.73 and 1.67 ms at 1 thread, 0.54 and 0.56 at 16).
//!
//! [`PreparedConv1d`](super::PreparedConv1d) sends every call of at most
//! four outputs per row of a dense or grouped conv here, whatever
//! algorithm it prepared, and calls of up to [`UNPACKED_OUTPUTS`] where
//! their columns stay in L1 ([`Gemv::takes`]), in passes of four outputs.
//! A conv whose every call has at most [`MAX_OUTPUTS`] outputs, several,
//! with constant weights, packs them at prepare instead and runs output
//! channels in the lanes (`panels.rs`), whatever the columns' size; a
//! pointwise conv's panels read its input rows where they lie. Each
//! output is its bias plus one sum in a fixed
//! order (accumulators pairwise, their lanes as a tree, then the tail), so
//! results do not depend on the number of threads; they differ from the
//! other algorithms' by rounding.

#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

mod panels;

use self::panels::{Cols, Panels, PANELS_MIN_OUTPUTS};
use super::params::Conv1dGeometry;
use crate::fused::{block_tmp, col_tmp, RowSink, RowsIn, RowsOut, ROW_BLOCK};
use crate::scratch::Scratch;
use crate::simd::{per_backend, Backend, Isa, Simd};

/// Most outputs per row a call may have to run here, with weights packed
/// ([`Gemv::packs`]): a conv of short calls (the subsampled encoder of a
/// FastConformer, 32 frames a call in the zoo's small config) streams
/// each weight once per block of outputs instead of once per row of the
/// GEMM's blocks (see `panels.rs`).
pub(crate) const MAX_OUTPUTS: usize = panels::MAX_OUTPUTS;

/// Outputs per call up to which any conv packs (the panels' first reach,
/// one block of outputs per panel).
const SHORT_BLOCK_OUTPUTS: usize = 8;

/// Longest filter (input channels per group × taps) of a conv whose
/// calls have more than [`SHORT_BLOCK_OUTPUTS`] outputs and still packs:
/// a 32-channel panel of 128 KiB. wav2letter's 250 -> 2000 K = 32 layer
/// (1 MiB panels, 32 outputs a call) and its 250-channel K = 7 ones
/// took the whole model from 12.7 to 25 ms in panels (1 thread), against
/// the GEMM, which reads each weight once per call.
const LONG_CALL_FILTER_LEN: usize = 1024;

/// Most outputs per row a call of unpacked weights may have here: a
/// decode step has one, a streaming encoder's chunk a few (voxtral's
/// stem: 8 mel frames a call). Below a vector of outputs the GEMM computes
/// a whole vector of positions per block of output channels. Calls of
/// more than [`DECODE_OUTPUTS`] come here only where their columns stay in
/// L1 ([`L1_COLS`]; see [`Gemv::takes`]).
const UNPACKED_OUTPUTS: usize = 8;

/// Outputs per row every call of a dense or grouped conv up to which runs
/// here, whatever its size: decode steps.
const DECODE_OUTPUTS: usize = 4;

/// Most floats of columns (`outputs · cin · K`) a call of more than
/// [`DECODE_OUTPUTS`] outputs may have: every filter is multiplied with
/// all of them, so they must stay in L1. Measured (pte_runner, one thread,
/// AVX-512, K = 3, 8 outputs, against the GEMM): 128 -> 128 channels
/// (3072 floats) 21 -> 15 µs, 256 -> 256 (6144) 69 -> 40 µs, but
/// 512 -> 512 (12288, from L2) 270 -> 309 µs.
const L1_COLS: usize = 6 * 1024;

/// Outputs one pass of the dot products computes together, sharing each
/// filter load: [`CHAINS`] accumulators each. A call of more outputs per
/// row takes them in passes of this many over the same filter (in L1 by
/// the second pass), each output summed in the same order whatever the
/// pass, so a call's results do not depend on how its outputs are split.
const DOTS_OUTPUTS: usize = 4;

/// Output channels per task: the columns are gathered once per task, so
/// each task should multiply them with many filters.
const ROWS: usize = 32;
const _: () = assert!(
    ROWS.is_multiple_of(panels::MAX_WIDTH),
    "tasks of whole panels"
);

/// `out[t] = Σ_j filter[j] · cols[t · filter.len() + j]` for `t < T`;
/// unsafe for the CPU features it is compiled for.
type DotsFn = unsafe fn(&[f32], &[f32], &mut [f32], &[f32]);

/// Output channels a call of one output per row multiplies together,
/// each filter a stream of its own, sharing each load of the column (see
/// [`rows_generic`]).
const STREAMS: usize = 8;

/// `out[r] = Σ_j filters[r · col.len() + j] · col[j]` for `r < M`; unsafe
/// for the CPU features it is compiled for.
type RowsFn = unsafe fn(&[f32], &[f32], &mut [f32]);

/// Takes a task's outputs: its rows' values (`rows × n`, row after row)
/// and the rest of the slot (the epilogue's temporaries).
type TaskOut<'a> = &'a mut dyn FnMut(&mut [f32], &mut [f32]);

/// The dot products for one backend, chosen at prepare.
pub(crate) struct Gemv {
    /// The instruction set the dot products and the panels are built for.
    isa: Isa,
    /// Indexed by the number of outputs per pass minus one.
    dots: [DotsFn; DOTS_OUTPUTS],
    /// A call of one output per row: indexed by the number of output
    /// channels multiplied together minus one.
    rows: [RowsFn; STREAMS],
    /// The weights packed with output channels in the lanes, for a conv
    /// whose every call runs here with several outputs ([`Self::pack`]).
    panels: Option<Panels>,
}

impl Gemv {
    /// The kernel on `isa`.
    pub(crate) fn new(isa: Isa) -> Self {
        /// A kernel's variants for one backend: the dot products' for 1
        /// to [`DOTS_OUTPUTS`] outputs, the rows' for 1 to [`STREAMS`]
        /// filters.
        macro_rules! variants {
            ($dots:ident, $rows:ident) => {
                (
                    [$dots::<1>, $dots::<2>, $dots::<3>, $dots::<4>],
                    [
                        $rows::<1>, $rows::<2>, $rows::<3>, $rows::<4>, $rows::<5>, $rows::<6>,
                        $rows::<7>, $rows::<8>,
                    ],
                )
            };
        }
        let (dots, rows): ([DotsFn; DOTS_OUTPUTS], [RowsFn; STREAMS]) = match isa.backend() {
            Backend::Portable => variants!(dots_portable, rows_portable),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 => variants!(dots_avx2, rows_avx2),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512 => variants!(dots_avx512, rows_avx512),
            #[cfg(target_arch = "aarch64")]
            Backend::Neon => variants!(dots_neon, rows_neon),
        };
        Gemv {
            isa,
            dots,
            rows,
            panels: None,
        }
    }

    /// Whether a conv prepared for `max` packs its constant weights
    /// ([`Self::pack`]): every call has at most [`MAX_OUTPUTS`] outputs,
    /// and several. Packed, every call runs here whatever the columns'
    /// size: the panels read each column value once per panel, not once
    /// per output channel.
    ///
    /// Calls of more than [`SHORT_BLOCK_OUTPUTS`] outputs pack only
    /// filters of at most [`LONG_CALL_FILTER_LEN`] values: their blocks of
    /// outputs take turns over each panel, which must stay in cache.
    pub(crate) fn packs(max: &Conv1dGeometry) -> bool {
        let filter_len = max.in_per_group * max.params.kernel_size;
        (PANELS_MIN_OUTPUTS..=MAX_OUTPUTS).contains(&max.out_len)
            && (max.out_len <= SHORT_BLOCK_OUTPUTS || filter_len <= LONG_CALL_FILTER_LEN)
    }

    /// Bytes of the packed weights, if any.
    pub(crate) fn prepared_bytes(&self) -> usize {
        self.panels.as_ref().map_or(0, Panels::bytes)
    }

    /// Whether [`Self::pack`] packed the weights.
    #[cfg(test)]
    pub(crate) fn is_packed(&self) -> bool {
        self.panels.is_some()
    }

    /// Packs the constant weights `w` of a conv prepared for `max` into
    /// panels (see `panels.rs`), which every call then reads instead of
    /// `w`, where [`Self::packs`] holds; else does nothing.
    pub(crate) fn pack(&mut self, max: &Conv1dGeometry, w: &[f32]) {
        if Self::packs(max) {
            self.panels = Some(Panels::new(self.isa, max, w));
        }
    }

    /// Scratch floats per thread: a task's outputs and a column of them,
    /// and `y_temps` temporaries per row of a task for a fused epilogue
    /// ([`RowSink::store_col`]); with `x_temps`, also room to compute a
    /// prologue's input rows ([`Self::stage_len`]) and its temporaries.
    pub(crate) fn scratch_per_thread(
        g: &Conv1dGeometry,
        x_temps: Option<usize>,
        y_temps: usize,
    ) -> usize {
        // A column for a decode step's epilogue, or a task's rows whole.
        let out_tmp =
            (ROWS + col_tmp(y_temps, ROWS)).max(block_tmp(y_temps, Self::most_outputs(g)));
        let (stage, tmp) = match x_temps {
            Some(x_temps) => (
                g.in_per_group * Self::stage_len(g),
                out_tmp.max(block_tmp(x_temps, Self::stage_len(g))),
            ),
            None => (0, out_tmp),
        };
        ROWS * MAX_OUTPUTS + stage + tmp
    }

    /// Most outputs per row a call of `g`'s channels and filter runs here
    /// with unpacked weights: [`MAX_OUTPUTS`] where their columns stay in
    /// L1, else [`DECODE_OUTPUTS`].
    fn unpacked_outputs(g: &Conv1dGeometry) -> usize {
        (DECODE_OUTPUTS + 1..=UNPACKED_OUTPUTS)
            .rev()
            .find(|&n| Self::cols_len(g, n) <= L1_COLS)
            .unwrap_or(DECODE_OUTPUTS)
    }

    /// Most outputs per row any call of a conv prepared for `max` runs
    /// here with, packed ([`Self::packs`]) or not: what its scratch holds.
    fn most_outputs(max: &Conv1dGeometry) -> usize {
        if Self::packs(max) {
            MAX_OUTPUTS
        } else {
            Self::unpacked_outputs(max)
        }
    }

    /// Whether a call of `g` runs here, with unpacked weights, rather than
    /// in the conv's prepared algorithm (a dense or grouped conv's).
    pub(crate) fn takes(g: &Conv1dGeometry) -> bool {
        g.out_len <= Self::unpacked_outputs(g)
    }

    /// Whether this kernel runs a call of `g`: [`Self::takes`], or any
    /// call of up to [`MAX_OUTPUTS`] outputs with packed weights.
    pub(crate) fn runs(&self, g: &Conv1dGeometry) -> bool {
        Self::takes(g) || (self.panels.is_some() && g.out_len <= MAX_OUTPUTS)
    }

    /// Floats of the scratch's shared region a call of a conv prepared
    /// for `max` needs: the columns of every batch item and group
    /// (`outputs · cin · K` each, for the most outputs a call has here),
    /// gathered once per call and read by every task of its output
    /// channels.
    pub(crate) fn shared_scratch(max: &Conv1dGeometry) -> usize {
        let p = &max.params;
        p.batch * p.groups * Self::cols_len(max, Self::most_outputs(max))
    }

    /// Floats of one batch item and group's columns for `n` outputs.
    fn cols_len(g: &Conv1dGeometry, n: usize) -> usize {
        n * g.in_per_group * g.params.kernel_size
    }

    /// Longest input row a call taken here has: at most `n` outputs
    /// ([`Self::most_outputs`]) means `in_len + pads − dilation·(K − 1) − 1
    /// < n · stride`.
    fn stage_len(g: &Conv1dGeometry) -> usize {
        let p = &g.params;
        Self::most_outputs(g) * p.stride + p.dilation * (p.kernel_size - 1)
    }

    /// `y = conv1d(x, w) + bias` for a call this kernel [runs](Self::runs), stored or handed to a sink row by row. The caller
    /// has checked every slice length and the scratch (per thread and
    /// [`Self::shared_scratch`]).
    ///
    /// First the columns of every batch item and group are gathered (a
    /// prologue's input rows computed whole) into the shared region, then
    /// tasks of [`ROWS`] output channels multiply them with their filters.
    /// Gathering in every task instead repeated it per block of channels:
    /// SileroVAD's STFT magnitude into its 129 -> 128 channel conv of four
    /// outputs computed and gathered its input four times per call, in
    /// copies of three floats, most of the kernel's time.
    pub(crate) fn run(
        &self,
        g: &Conv1dGeometry,
        x: RowsIn<'_>,
        w: &[f32],
        bias: Option<&[f32]>,
        y: RowsOut<'_>,
        scratch: &Scratch,
    ) {
        let p = &g.params;
        let n = g.out_len;
        assert!(self.runs(g), "{n} outputs per row");
        let (cin, cout) = (g.in_per_group, g.out_per_group);
        if n == 0 || p.batch == 0 || cout == 0 {
            return;
        }
        let filter_len = cin * p.kernel_size;
        let cols_len = Self::cols_len(g, n);
        // A pointwise conv's input rows are its columns: the panels read
        // them where they lie (a stored input) or where a prologue
        // computed them, with no gather.
        let direct = self.panels.is_some() && pointwise(g);
        // A prologue whose rows lie across (a `[B, N, C]` projection read
        // as the conv's `[B, C, N]`, a LayerNorm over its channels applied
        // on the way) computes the columns themselves, `[t][c]`: a
        // contiguous line across the channels per output, which the panels
        // read as they read gathered columns. As rows, FastConformer's
        // first pointwise conv (128 channels, 32 frames) computed 64-channel
        // lines per frame and transposed them into its rows.
        let as_columns = direct && matches!(x, RowsIn::Fused(s) if s.prefers_columns());
        scratch.with_shared(|shared| {
            let all_cols = &mut shared[..p.batch * p.groups * cols_len];
            // The columns of batch item and group `bg` (nothing to do for
            // a stored input read where it lies).
            let gathers = !(direct && matches!(x, RowsIn::Slice(_)));
            let gathered = if gathers { cols_len } else { 0 };
            let filled = &mut all_cols[..gathered * p.batch * p.groups];
            crate::par::for_each_chunk_mut(filled, cols_len, |bg, cols| {
                let (b, group) = (bg / p.groups, bg % p.groups);
                let row0 = b * p.in_channels + group * cin;
                match x {
                    RowsIn::Slice(_) if direct => {}
                    RowsIn::Slice(x) => {
                        gather_columns(g, &x[row0 * p.in_len..][..cin * p.in_len], n, cols)
                    }
                    RowsIn::Fused(source) if as_columns => scratch.with_slot(|tmp| {
                        for (t, col) in cols.chunks_exact_mut(cin).enumerate() {
                            for (k, part) in col.chunks_mut(ROW_BLOCK).enumerate() {
                                source.fill_col(row0 + k * ROW_BLOCK, t, part, tmp);
                            }
                        }
                    }),
                    RowsIn::Fused(source) if direct => {
                        // The group's rows, `cin × in_len` as `cols_len` is.
                        for (k, block) in cols.chunks_mut(ROW_BLOCK * p.in_len).enumerate() {
                            let m = block.len() / p.in_len;
                            scratch.with_slot(|tmp| {
                                source.fill_rows(row0 + k * ROW_BLOCK, m, 0, p.in_len, block, tmp)
                            });
                        }
                    }
                    RowsIn::Fused(source) => scratch.with_slot(|slot| {
                        // The group's rows computed whole (they are
                        // short: at most stage_len), then gathered.
                        assert!(p.in_len <= Self::stage_len(g), "input row of a short call");
                        let (stage, tmp) = slot.split_at_mut(cin * Self::stage_len(g));
                        let stage = &mut stage[..cin * p.in_len];
                        if p.in_len > 0 {
                            for (k, block) in stage.chunks_mut(ROW_BLOCK * p.in_len).enumerate() {
                                let m = block.len() / p.in_len;
                                let c0 = row0 + k * ROW_BLOCK;
                                source.fill_rows(c0, m, 0, p.in_len, block, tmp);
                            }
                        }
                        gather_columns(g, stage, n, cols);
                    }),
                }
            });
            let all_cols = &*all_cols;
            // One task: batch item and group `bg`, output channels `r0 ..
            // r0 + rows` of the group.
            let task = |bg: usize, r0: usize, rows: usize, out: TaskOut<'_>| {
                let group = bg % p.groups;
                let cols = &all_cols[bg * cols_len..][..cols_len];
                let panel_cols = match x {
                    RowsIn::Slice(x) if direct => {
                        let (b, group) = (bg / p.groups, bg % p.groups);
                        let row0 = b * p.in_channels + group * cin;
                        Cols {
                            data: &x[row0 * p.in_len..][..cin * p.in_len],
                            t_stride: 1,
                            j_stride: p.in_len,
                        }
                    }
                    _ if as_columns => Cols {
                        data: cols,
                        t_stride: cin,
                        j_stride: 1,
                    },
                    _ if direct => Cols {
                        data: cols,
                        t_stride: 1,
                        j_stride: p.in_len,
                    },
                    _ => Cols {
                        data: cols,
                        t_stride: filter_len,
                        j_stride: 1,
                    },
                };
                scratch.with_slot(|slot| {
                    let (values, tmp) = slot.split_at_mut(ROWS * MAX_OUTPUTS);
                    let values = &mut values[..rows * n];
                    if let Some(panels) = &self.panels {
                        let o = group * cout + r0;
                        let bias = bias.map(|bias| &bias[o..o + rows]);
                        panels.outputs(group, r0..r0 + rows, n, panel_cols, bias, values);
                        out(values, tmp);
                        return;
                    }
                    if n == 1 {
                        // A decode step: STREAMS filters at a time.
                        for (r, values) in values.chunks_mut(STREAMS).enumerate() {
                            let o = group * cout + r0 + r * STREAMS;
                            let filters = &w[o * filter_len..][..values.len() * filter_len];
                            let rows = self.rows[values.len() - 1];
                            // SAFETY: `new` chose `rows` for a backend whose
                            // features this CPU has; it checks its bounds.
                            unsafe { rows(filters, &cols[..filter_len], values) };
                            if let Some(bias) = bias {
                                for (v, b) in values.iter_mut().zip(&bias[o..]) {
                                    *v += b;
                                }
                            }
                        }
                        out(values, tmp);
                        return;
                    }
                    for (r, values) in values.chunks_exact_mut(n).enumerate() {
                        let o = group * cout + r0 + r;
                        // The weights the next rows read, prefetched as this
                        // one is multiplied.
                        let ahead = w.get(o * filter_len + AHEAD..).unwrap_or(&[]);
                        let filter = &w[o * filter_len..][..filter_len];
                        for (pass, values) in values.chunks_mut(DOTS_OUTPUTS).enumerate() {
                            let t0 = pass * DOTS_OUTPUTS;
                            let cols = &cols[t0 * filter_len..];
                            // Later passes read the filter from L1.
                            let ahead = if pass == 0 { ahead } else { &[] };
                            let dots = self.dots[values.len() - 1];
                            // SAFETY: `new` chose `dots` for a backend whose
                            // features this CPU has; it checks its bounds.
                            unsafe { dots(filter, cols, values, ahead) };
                        }
                        let b0 = bias.map_or(0.0, |bias| bias[o]);
                        for v in values.iter_mut() {
                            *v += b0;
                        }
                    }
                    out(values, tmp);
                });
            };
            match y {
                RowsOut::Slice(y) => {
                    // The rows of one batch item and group are contiguous in
                    // `y`, and so are a task's.
                    crate::par::for_each_chunk_mut_2d(y, cout * n, ROWS * n, |bg, blk, y| {
                        let rows = y.len() / n;
                        task(bg, blk * ROWS, rows, &mut |values, _| {
                            y.copy_from_slice(values)
                        })
                    });
                }
                RowsOut::Fused(sink) => {
                    // A decode step's outputs: each output position's column
                    // of the task's rows (one batch item's consecutive
                    // channels) to the epilogue at once: finishing row by
                    // row walked its program once per row for one to four
                    // values (SileroVAD's 128 -> 1 and 64 -> 128 convs of
                    // one step, ReLU after). Longer calls hand over the
                    // task's rows whole, as the GEMM does: a column per
                    // output position walked the program 32 times per task
                    // for a FastConformer's 32-frame calls, into a
                    // transpose (16 -> 11 µs of that 128-channel conv).
                    let sink: &dyn RowSink = sink;
                    let blocks = cout.div_ceil(ROWS);
                    crate::par::for_each(p.batch * p.groups * blocks, |t| {
                        let (bg, r0) = (t / blocks, t % blocks * ROWS);
                        let rows = ROWS.min(cout - r0);
                        let (b, group) = (bg / p.groups, bg % p.groups);
                        let row0 = b * p.out_channels + group * cout + r0;
                        task(bg, r0, rows, &mut |values, tmp| {
                            if n > DECODE_OUTPUTS {
                                if sink.stores_across(row0, rows, n) {
                                    sink.store_rows(row0, rows, 0, n, values, tmp);
                                } else {
                                    for (r, row) in values.chunks_exact(n).enumerate() {
                                        sink.store(row0 + r, 0, row, tmp);
                                    }
                                }
                                return;
                            }
                            let (col, tmp) = tmp.split_at_mut(ROWS);
                            let col = &mut col[..rows];
                            for t in 0..n {
                                for (c, row) in col.iter_mut().zip(values.chunks_exact(n)) {
                                    *c = row[t];
                                }
                                sink.store_col(row0, t, col, tmp);
                            }
                        })
                    });
                }
            }
        });
    }
}

/// Whether `g` is a pointwise conv (one tap, stride 1, no padding), whose
/// input rows are its columns channel after channel: `cols(t, c) = x[c ·
/// in_len + t]`.
fn pointwise(g: &Conv1dGeometry) -> bool {
    let p = &g.params;
    p.kernel_size == 1 && p.stride == 1 && p.pad_left == 0 && p.pad_right == 0
}

/// The columns of a call's `n` outputs, `cols[t][c][k]` = padded input
/// `t · stride + k · dilation` of channel `c` (zero in the padding), from
/// one group's input rows `xg` (`cin × in_len`). Filters of up to 8
/// contiguous taps copy theirs as fixed-size arrays: a `copy_from_slice`
/// of a run-time length is a `memmove` call, which cost more than the
/// three floats it copied for each channel of SileroVAD's K = 3 convs.
fn gather_columns(g: &Conv1dGeometry, xg: &[f32], n: usize, cols: &mut [f32]) {
    let p = &g.params;
    if p.dilation != 1 {
        return gather_any(g, xg, n, cols);
    }
    match p.kernel_size {
        1 => gather_taps::<1>(g, xg, n, cols),
        2 => gather_taps::<2>(g, xg, n, cols),
        3 => gather_taps::<3>(g, xg, n, cols),
        4 => gather_taps::<4>(g, xg, n, cols),
        5 => gather_taps::<5>(g, xg, n, cols),
        6 => gather_taps::<6>(g, xg, n, cols),
        7 => gather_taps::<7>(g, xg, n, cols),
        8 => gather_taps::<8>(g, xg, n, cols),
        _ => gather_any(g, xg, n, cols),
    }
}

/// Taps of output `t` whose input lies inside the row: `k` in `lo .. hi`
/// (dilated positions `t·stride + k·dilation − pad_left` in `0 .. in_len`).
fn inside_taps(g: &Conv1dGeometry, t: usize) -> (usize, usize) {
    let p = &g.params;
    let taps = p.kernel_size;
    let first = t * p.stride;
    let lo = p
        .pad_left
        .saturating_sub(first)
        .div_ceil(p.dilation)
        .min(taps);
    let hi = (p.pad_left + p.in_len)
        .saturating_sub(first)
        .div_ceil(p.dilation)
        .clamp(lo, taps);
    (lo, hi)
}

/// [`gather_columns`] for `K` contiguous taps (dilation 1): outputs whose
/// taps all lie inside the rows copy `[f32; K]` per channel, the others
/// (reaching into the padding) select each tap's value or zero.
fn gather_taps<const K: usize>(g: &Conv1dGeometry, xg: &[f32], n: usize, cols: &mut [f32]) {
    let p = &g.params;
    debug_assert!(p.kernel_size == K && p.dilation == 1);
    let cin = g.in_per_group;
    for t in 0..n {
        let cols = &mut cols[t * cin * K..][..cin * K];
        let (lo, hi) = inside_taps(g, t);
        if (lo, hi) != (0, K) {
            // An output whose taps reach into the padding, tap by tap (a
            // copy of hi − lo floats would be a memmove call again).
            for (c, col) in cols.chunks_exact_mut(K).enumerate() {
                let row = &xg[c * p.in_len..][..p.in_len];
                for (k, v) in col.iter_mut().enumerate() {
                    *v = if (lo..hi).contains(&k) {
                        row[t * p.stride + k - p.pad_left]
                    } else {
                        0.0
                    };
                }
            }
            continue;
        }
        let start = t * p.stride - p.pad_left;
        for (c, col) in cols.chunks_exact_mut(K).enumerate() {
            let src: &[f32; K] = xg[c * p.in_len + start..][..K].try_into().expect("K taps");
            let col: &mut [f32; K] = col.try_into().expect("K taps");
            *col = *src;
        }
    }
}

/// [`gather_columns`] for any filter.
fn gather_any(g: &Conv1dGeometry, xg: &[f32], n: usize, cols: &mut [f32]) {
    for t in 0..n {
        gather_output(g, xg, t, cols);
    }
}

/// The columns of output `t`, any filter and padding.
fn gather_output(g: &Conv1dGeometry, xg: &[f32], t: usize, cols: &mut [f32]) {
    let p = &g.params;
    let (cin, taps) = (g.in_per_group, p.kernel_size);
    let (lo, hi) = inside_taps(g, t);
    for c in 0..cin {
        let row = &xg[c * p.in_len..][..p.in_len];
        let col = &mut cols[(t * cin + c) * taps..][..taps];
        col[..lo].fill(0.0);
        col[hi..].fill(0.0);
        if hi > lo {
            let start = t * p.stride + lo * p.dilation - p.pad_left;
            if p.dilation == 1 {
                col[lo..hi].copy_from_slice(&row[start..start + hi - lo]);
            } else {
                for (v, &x) in col[lo..hi]
                    .iter_mut()
                    .zip(row[start..].iter().step_by(p.dilation))
                {
                    *v = x;
                }
            }
        }
    }
}

/// Independent accumulators per output: a dot product of one output
/// would otherwise wait on each multiply-add's latency.
const CHAINS: usize = 4;
const _: () = assert!(CHAINS == 4, "the reduction below adds four chains");

/// How far ahead of the multiply-adds the weights are prefetched, in floats.
const AHEAD: usize = 2048;

/// The lanes of `v` added as a tree (halves, then quarters, ...), the
/// order every dot product here sums its lanes in.
///
/// # Safety
/// `S`'s features are present.
#[inline(always)]
unsafe fn lane_tree_sum<S: Simd>(v: S::V) -> f32 {
    let mut lanes = [0.0f32; 16];
    assert!(S::LANES <= lanes.len());
    // SAFETY: features by our contract; the buffer holds 16 >= LANES
    // values (asserted).
    unsafe { S::store(lanes.as_mut_ptr(), v) };
    let mut width = S::LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            lanes[i] += lanes[i + width];
        }
    }
    lanes[0]
}

/// `out[t] = Σ_j filter[j] · cols[t · len + j]`, `len = filter.len()`, for
/// `t < T`: [`CHAINS`] vectors of the filter at a time into as many
/// accumulators per output, each filter load shared by the `T` outputs,
/// then the whole vectors left one at a time into the first; then the
/// accumulators added pairwise, their lanes as a tree, then the tail (less
/// than a vector).
///
/// # Safety
/// `S`'s features are present. Bounds are checked (panics).
#[inline(always)]
unsafe fn dots_generic<S: Simd, const T: usize>(
    filter: &[f32],
    cols: &[f32],
    out: &mut [f32],
    ahead: &[f32],
) {
    let len = filter.len();
    assert!(cols.len() >= T * len && out.len() == T && S::LANES <= 16);
    let step = CHAINS * S::LANES;
    let steps_end = len - len % step;
    let mut sums = [0.0f32; T];
    // SAFETY: features by our contract; every load reads LANES values at
    // j + c · LANES < whole <= len (the steps), or at j with j + LANES <=
    // len (the vectors after them), of `filter` and of column t (inside
    // `cols`, asserted); the lanes are summed by `lane_tree_sum`.
    let whole = unsafe {
        let mut acc = [[S::splat(0.0); CHAINS]; T];
        let mut j = 0;
        while j < steps_end {
            crate::fused::prefetch(ahead.get(j..j + step).unwrap_or(&[]));
            for c in 0..CHAINS {
                let at = j + c * S::LANES;
                let wv = S::load(filter.as_ptr().add(at));
                for (t, acc) in acc.iter_mut().enumerate() {
                    acc[c] = S::mul_add(acc[c], wv, S::load(cols.as_ptr().add(t * len + at)));
                }
            }
            j += step;
        }
        // Whole vectors past the last whole step, into the first chain: a
        // filter of 240 taps (80 channels, K = 3) left 48 of them to the
        // scalar tail below, a chain of dependent adds per output that
        // took three times as long as its 192 vectorised taps.
        while j + S::LANES <= len {
            let wv = S::load(filter.as_ptr().add(j));
            for (t, acc) in acc.iter_mut().enumerate() {
                acc[0] = S::mul_add(acc[0], wv, S::load(cols.as_ptr().add(t * len + j)));
            }
            j += S::LANES;
        }
        let whole = j;
        // The chains added as vectors, (0 + 1) + (2 + 3), then the lanes
        // as a tree: a sequential sum of every chain's every lane was a
        // chain of CHAINS · LANES dependent adds per output, which cost
        // more than the multiply-adds of filters up to a few hundred
        // taps (SileroVAD's 1 -> 258, K = 256 layer: 28 -> 6 µs).
        let one = S::splat(1.0);
        for (sum, acc) in sums.iter_mut().zip(&acc) {
            let low = S::mul_add(acc[0], one, acc[1]);
            let high = S::mul_add(acc[2], one, acc[3]);
            *sum = lane_tree_sum::<S>(S::mul_add(low, one, high));
        }
        whole
    };
    for (t, (sum, out)) in sums.iter().zip(out).enumerate() {
        let col = &cols[t * len..][..len];
        *out = filter[whole..]
            .iter()
            .zip(&col[whole..])
            .fold(*sum, |s, (w, x)| s + w * x);
    }
}

/// `out[r] = Σ_j filters[r · len + j] · col[j]` for `r < M`, `len =
/// col.len()`: each column vector loaded once for the `M` filters, which
/// are read side by side, as `M` streams, one accumulator each; then the
/// lanes added as a tree, then the tail (less than a vector).
///
/// A call of one output per row is bound by reading its filters, and one
/// filter at a time (as [`dots_generic`] reads them, prefetching ahead)
/// left most of the memory's bandwidth unused. A C model of these loops,
/// 250 -> 250 channels at `K = 11` (2.75 MB of weights a layer), one
/// core, 2026-11-29: one stream, prefetched or not, 10-14 GB/s on a Zen 3
/// core reading from DRAM, four streams of two chains 16-18, eight of one
/// 16-22; from the 16-core Xeon's 300 MB L3 every arrangement read 26-29.
/// Software prefetch slowed every arrangement on the Zen 3 core and sped
/// none on the Xeon. Eight accumulators are enough independent chains for
/// the multiply-adds' latency (two per cycle, four cycles each).
///
/// # Safety
/// `S`'s features are present. Bounds are checked (panics).
#[inline(always)]
unsafe fn rows_generic<S: Simd, const M: usize>(filters: &[f32], col: &[f32], out: &mut [f32]) {
    let len = col.len();
    assert!(filters.len() == M * len && out.len() == M && S::LANES <= 16);
    let whole = len - len % S::LANES;
    let mut sums = [0.0f32; M];
    // SAFETY: features by our contract; every load reads LANES values at
    // j with j + LANES <= whole <= len, of `col` and of filter r (inside
    // `filters`, asserted); the lanes are summed by `lane_tree_sum`.
    unsafe {
        let mut acc = [S::splat(0.0); M];
        for j in (0..whole).step_by(S::LANES) {
            let xv = S::load(col.as_ptr().add(j));
            for (r, acc) in acc.iter_mut().enumerate() {
                *acc = S::mul_add(*acc, S::load(filters.as_ptr().add(r * len + j)), xv);
            }
        }
        for (sum, &acc) in sums.iter_mut().zip(&acc) {
            *sum = lane_tree_sum::<S>(acc);
        }
    }
    for (r, (sum, out)) in sums.iter().zip(out).enumerate() {
        let filter = &filters[r * len..][..len];
        *out = filter[whole..]
            .iter()
            .zip(&col[whole..])
            .fold(*sum, |s, (w, x)| s + w * x);
    }
}

per_backend! {
    /// [`rows_generic`] on one backend.
    unsafe fn [rows_portable, rows_avx2, rows_avx512, rows_neon]<const M: usize>(
        filters: &[f32],
        col: &[f32],
        out: &mut [f32],
    ) => rows_generic::<S, M>
}

per_backend! {
    /// [`dots_generic`] on one backend.
    unsafe fn [dots_portable, dots_avx2, dots_avx512, dots_neon]<const T: usize>(
        filter: &[f32],
        cols: &[f32],
        out: &mut [f32],
        ahead: &[f32],
    ) => dots_generic::<S, T>
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{
        assert_conv_close, conv_params as params, run_into_relu, ReluSink, Rng,
    };
    use crate::{Algorithm, Choice, Conv1dParams, PreparedConv1d};

    /// Sums of `n` terms in any order err by about `n eps` of the sum of
    /// their magnitudes.
    fn check(p: &Conv1dParams, x: &[f32], w: &[f32], bias: Option<&[f32]>, got: &[f32], ctx: &str) {
        let terms = (p.in_channels / p.groups * p.kernel_size + 1) as f32;
        assert_conv_close(p, x, w, bias, got, 2.0 * terms * f32::EPSILON, ctx);
    }

    /// Calls of 1 to 8 outputs per row (one pass of the dot products and
    /// two, the second partial): dense and grouped, strided,
    /// dilated, causal and centred padding, batches, filters that are and
    /// are not whole vectors, more channels than one task's.
    fn shapes() -> Vec<Conv1dParams> {
        let mut out = Vec::new();
        for outputs in 1..=MAX_OUTPUTS {
            for (b, ch, k, stride, pad, dil) in [
                (1, (250, 250, 1), 11, 1, (10, 0), 1),
                (2, (12, 8, 4), 3, 2, (1, 1), 2),
                (1, (3, 70, 1), 3, 1, (1, 1), 1),
                (1, (16, 16, 2), 5, 1, (0, 0), 1),
                (1, (80, 160, 1), 3, 1, (2, 0), 1),
            ] {
                let reach = (k - 1) * dil;
                let in_len = (outputs - 1) * stride + reach + 1 - pad.0 - pad.1;
                let p = params(b, ch, in_len, k, stride, pad, dil);
                assert_eq!(p.out_len().unwrap(), outputs, "{p:?}");
                // The first's columns pass L1 beyond four outputs.
                if Gemv::takes(&p.geometry().unwrap()) {
                    out.push(p);
                }
            }
        }
        out
    }

    /// The stored result of `gemv` on a pool of `threads`.
    fn run_on(
        gemv: &Gemv,
        g: &Conv1dGeometry,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        threads: usize,
    ) -> Vec<f32> {
        let scratch = Scratch::sized(
            threads,
            Gemv::scratch_per_thread(g, None, 0),
            Gemv::shared_scratch(g),
        );
        let mut y = vec![f32::NAN; g.output_elems];
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let out = RowsOut::Slice(&mut y);
        pool.install(|| gemv.run(g, RowsIn::Slice(x), w, bias, out, &scratch));
        y
    }

    /// A decode step of 12 dense layers (250 -> 250, K = 11: 33 MB of
    /// weights, past the caches), one output per row, one thread: the
    /// weights read in place as [`STREAMS`] filters side by side, against
    /// packed into panels (output channels in the lanes, one stream).
    /// `cargo test --release -p rustconv-kernels calibrate_decode -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn calibrate_decode() {
        let mut rng = Rng::new(7);
        let layers = 12;
        let step = params(1, (250, 250, 1), 11, 11, 1, (0, 0), 1);
        let x = rng.vec(step.input_elems(), -1.0, 1.0);
        let ws: Vec<Vec<f32>> = (0..layers)
            .map(|_| rng.vec(step.weight_elems(), -1.0, 1.0))
            .collect();
        let bytes = (layers * step.weight_elems() * 4) as f64;
        for (name, max_len) in [("in place, 8 streams", 11), ("packed panels", 12)] {
            let max = Conv1dParams {
                in_len: max_len,
                ..step
            };
            assert_eq!(
                Gemv::packs(&max.geometry().unwrap()),
                max_len == 12,
                "{name}"
            );
            let convs: Vec<PreparedConv1d> = ws
                .iter()
                .map(|w| PreparedConv1d::new(&max, w, Choice::Force(Algorithm::Gemm)).unwrap())
                .collect();
            let scratch = Scratch::sized(
                crate::par::threads(),
                convs[0].rows_scratch_per_thread(0, 0),
                convs[0].shared_scratch(),
            );
            let mut y = vec![0.0; step.output_elems().unwrap()];
            let mut times = Vec::new();
            for _ in 0..200 {
                let t = std::time::Instant::now();
                for (conv, w) in convs.iter().zip(&ws) {
                    conv.run(&step, &x, Some(w), None, &mut y, &scratch)
                        .unwrap();
                }
                times.push(t.elapsed().as_secs_f64());
            }
            times.sort_by(f64::total_cmp);
            let median = times[times.len() / 2];
            println!(
                "{name}: {:.3} ms a step, {:.1} GB/s",
                median * 1e3,
                bytes / median / 1e9
            );
        }
    }

    #[test]
    fn matches_reference_on_every_backend() {
        let mut rng = Rng::new(3);
        for p in shapes() {
            let g = p.geometry().unwrap();
            let x = rng.vec(p.input_elems(), -1.0, 1.0);
            let w = rng.vec(p.weight_elems(), -1.0, 1.0);
            let bias = rng.vec(p.bias_elems(), -1.0, 1.0);
            for isa in Isa::all_available() {
                let backend = isa.backend();
                let gemv = Gemv::new(isa);
                for bias in [None, Some(&bias[..])] {
                    let y = run_on(&gemv, &g, &x, &w, bias, 3);
                    check(&p, &x, &w, bias, &y, &format!("{backend:?} {p:?}"));
                }
            }
        }
    }

    /// Calls of up to 8 outputs pack any filter; longer calls (up to 32)
    /// only filters whose panels stay in cache (wav2letter's 250-channel
    /// K = 32 layer ran twice as slow packed as in the GEMM).
    #[test]
    fn long_calls_pack_only_short_filters() {
        let packs = |cin: usize, k: usize, outputs: usize| {
            let p = params(1, (cin, 64, 1), outputs + k - 1, k, 1, (0, 0), 1);
            Gemv::packs(&p.geometry().unwrap())
        };
        assert!(packs(128, 1, 32) && packs(512, 1, 16) && packs(128, 8, 32));
        assert!(packs(250, 32, 8) && packs(2000, 1, 4));
        assert!(!packs(250, 32, 32) && !packs(250, 7, 16) && !packs(2000, 1, 9));
        assert!(!packs(128, 1, 1) && !packs(128, 1, 33));
    }

    #[test]
    fn prepared_convs_take_it_for_short_calls_stored_or_fused() {
        // Prepared for a long causal call by each algorithm that reads the
        // weights in place: calls of 1 to 8 outputs per row run here, so
        // they come out bit for bit the same whatever the algorithm, stored
        // or handed to an epilogue; a longer call does not.
        let mut rng = Rng::new(5);
        let max = params(1, (40, 24, 1), 600, 11, 1, (10, 0), 1);
        let w = rng.vec(max.weight_elems(), -1.0, 1.0);
        let bias = rng.vec(max.bias_elems(), -1.0, 1.0);
        for in_len in [1, 2, 4, 5, 8, 9, 600] {
            let p = Conv1dParams { in_len, ..max };
            let x = rng.vec(p.input_elems(), -1.0, 1.0);
            let mut outputs = Vec::new();
            for a in [Algorithm::Direct, Algorithm::Gemm, Algorithm::FftGemm] {
                let conv = PreparedConv1d::new(&max, &w, Choice::Force(a)).unwrap();
                let scratch = Scratch::sized(
                    crate::par::threads(),
                    conv.rows_scratch_per_thread(0, 0),
                    conv.shared_scratch(),
                );
                let mut y = vec![f32::NAN; p.output_elems().unwrap()];
                conv.run(&p, &x, Some(&w), Some(&bias), &mut y, &scratch)
                    .unwrap();
                check(&p, &x, &w, Some(&bias), &y, &format!("{a:?}, {in_len}"));
                if conv.fuses_output() {
                    let relu: Vec<f32> = y.iter().map(|v| v.max(0.0)).collect();
                    let fused = run_into_relu(&conv, &p, &x, &w, Some(&bias), &scratch);
                    assert_eq!(fused, relu, "{a:?}, {in_len}");
                }
                outputs.push(y);
            }
            let same = outputs.windows(2).all(|pair| pair[0] == pair[1]);
            let taken = Gemv::takes(&p.geometry().unwrap());
            assert_eq!(taken, in_len <= UNPACKED_OUTPUTS, "{in_len} outputs");
            assert_eq!(same, taken, "{in_len} outputs");
        }
    }

    /// A fused epilogue takes each task's outputs a column at a time, and a
    /// prologue's input is computed whole: rows of several batch items and
    /// groups, tasks of [`ROWS`] rows and a ragged last one, every call
    /// length up to the longest input row, the same values as stored.
    #[test]
    fn epilogue_columns_cover_batches_groups_and_ragged_tasks() {
        use crate::fused::{RowSource, RowsIn};
        let mut rng = Rng::new(13);
        let max = params(2, (6, 2 * (ROWS + 7), 2), 9, 3, 2, (1, 1), 1);
        let w = rng.vec(max.weight_elems(), -1.0, 1.0);
        let bias = rng.vec(max.bias_elems(), -1.0, 1.0);
        for in_len in [1, 2, 5, 8] {
            let p = Conv1dParams { in_len, ..max };
            let x = rng.vec(p.input_elems(), -1.0, 1.0);
            let conv = PreparedConv1d::new(&max, &w, Choice::Force(Algorithm::Gemm)).unwrap();
            let scratch = Scratch::sized(
                crate::par::threads(),
                conv.rows_scratch_per_thread(0, 0),
                conv.shared_scratch(),
            );
            let mut y = vec![f32::NAN; p.output_elems().unwrap()];
            conv.run(&p, &x, Some(&w), Some(&bias), &mut y, &scratch)
                .unwrap();
            let out_len = p.geometry().unwrap().out_len;
            assert!(Gemv::takes(&p.geometry().unwrap()));
            let relu: Vec<f32> = y.iter().map(|v| v.max(0.0)).collect();
            let fused = run_into_relu(&conv, &p, &x, &w, Some(&bias), &scratch);
            assert_eq!(fused, relu, "{in_len}");
            // The input from a prologue, computed whole into the slot:
            // the same bits, stored or through the epilogue.
            let source = Stored { x: &x, in_len };
            let per_thread = conv.rows_scratch_per_thread(source.temporaries(), 0);
            let scratch = Scratch::sized(crate::par::threads(), per_thread, conv.shared_scratch());
            let mut got = vec![f32::NAN; y.len()];
            let (x_in, out) = (RowsIn::Fused(&source), RowsOut::Slice(&mut got));
            conv.run_rows(&p, x_in, Some(&w), Some(&bias), out, 0, 0, &scratch)
                .unwrap();
            assert_eq!(got, y, "fused input, {in_len}");
            let sink = ReluSink::new(y.len(), out_len);
            let (x_in, out) = (RowsIn::Fused(&source), RowsOut::Fused(&sink));
            conv.run_rows(&p, x_in, Some(&w), Some(&bias), out, 0, 0, &scratch)
                .unwrap();
            assert_eq!(sink.into_values(), relu, "fused input and output, {in_len}");
        }
    }

    /// A stored input handed over as a prologue's.
    struct Stored<'a> {
        x: &'a [f32],
        in_len: usize,
    }

    impl crate::fused::RowSource for Stored<'_> {
        fn fill(&self, row: usize, t0: usize, out: &mut [f32], _tmp: &mut [f32]) {
            out.copy_from_slice(&self.x[row * self.in_len + t0..][..out.len()]);
        }
        fn temporaries(&self) -> usize {
            1
        }
        fn isa(&self) -> crate::simd::Isa {
            crate::simd::Isa::detect()
        }
    }

    /// Decode steps run here whatever the conv's size; calls of five to
    /// eight outputs only where their columns stay in L1.
    #[test]
    fn longer_calls_run_here_only_with_columns_in_l1() {
        for (ch, outputs, taken) in [
            (128, 8, true),
            (256, 8, true),
            (512, 4, true),
            (512, 5, false),
            (2048, 1, true),
            (128, 9, false),
        ] {
            let p = params(1, (ch, ch, 1), outputs + 2, 3, 1, (0, 0), 1);
            let g = p.geometry().unwrap();
            assert_eq!(g.out_len, outputs);
            assert_eq!(Gemv::takes(&g), taken, "{ch} channels, {outputs} outputs");
        }
    }

    /// The fixed-size copies of filters of up to 8 taps gather what the
    /// general loop does: every tap count around them, strides, causal,
    /// centred and one-sided padding, every call length of 1 to 8 outputs,
    /// the edge outputs whose taps reach into the padding included.
    #[test]
    fn short_filters_gather_as_the_general_loop() {
        let mut rng = Rng::new(17);
        for k in 1..=9 {
            for stride in 1..=3 {
                for pad in [(0, 0), (k - 1, 0), (k / 2, k / 2), (0, k - 1), (1, 2)] {
                    for outputs in 1..=MAX_OUTPUTS {
                        let Some(in_len) = ((outputs - 1) * stride + k).checked_sub(pad.0 + pad.1)
                        else {
                            continue;
                        };
                        let p = params(1, (5, 2, 1), in_len, k, stride, pad, 1);
                        let g = p.geometry().unwrap();
                        if g.out_len == 0 || g.out_len > MAX_OUTPUTS {
                            continue;
                        }
                        let x = rng.vec(p.input_elems(), -1.0, 1.0);
                        let len = Gemv::cols_len(&g, g.out_len);
                        let (mut fast, mut general) = (vec![f32::NAN; len], vec![f32::NAN; len]);
                        gather_columns(&g, &x, g.out_len, &mut fast);
                        gather_any(&g, &x, g.out_len, &mut general);
                        assert_eq!(fast, general, "{p:?}");
                        assert!(fast.iter().all(|v| !v.is_nan()), "{p:?}");
                    }
                }
            }
        }
    }

    /// Every count of filters read side by side (1 to [`STREAMS`]) on
    /// every backend, filters shorter than a vector, with and without a
    /// tail past the whole vectors: each output the dot product of its own
    /// filter, whatever its neighbours.
    #[test]
    fn filters_in_streams_are_each_their_own_dot_product() {
        let mut rng = Rng::new(11);
        for isa in Isa::all_available() {
            let gemv = Gemv::new(isa);
            for len in [1, 3, 8, 16, 37, 100] {
                let col = rng.vec(len, -1.0, 1.0);
                for m in 1..=STREAMS {
                    let filters = rng.vec(m * len, -1.0, 1.0);
                    let mut out = vec![f32::NAN; m];
                    // SAFETY: `Gemv::new` chose the variants for `isa`,
                    // which this CPU has (`all_available`).
                    unsafe { gemv.rows[m - 1](&filters, &col, &mut out) };
                    for (r, &got) in out.iter().enumerate() {
                        let filter = &filters[r * len..][..len];
                        let want: f64 = filter
                            .iter()
                            .zip(&col)
                            .map(|(&w, &x)| w as f64 * x as f64)
                            .sum();
                        let bound = 2.0 * len as f64 * f32::EPSILON as f64;
                        assert!(
                            (got as f64 - want).abs() <= bound,
                            "{isa:?} len {len}, {m} filters, row {r}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn result_does_not_depend_on_pool_size() {
        let mut rng = Rng::new(7);
        // One output per row (the filters in streams) and two.
        for in_len in [1, 2] {
            let p = params(2, (64, 100, 2), in_len, 11, 1, (10, 0), 1);
            let g = p.geometry().unwrap();
            let x = rng.vec(p.input_elems(), -1.0, 1.0);
            let w = rng.vec(p.weight_elems(), -1.0, 1.0);
            let gemv = Gemv::new(Isa::detect());
            let run_on = |threads| run_on(&gemv, &g, &x, &w, None, threads);
            let single = run_on(1);
            for threads in [2, 5] {
                assert_eq!(
                    run_on(threads),
                    single,
                    "{threads} threads, {in_len} inputs"
                );
            }
        }
    }
}
