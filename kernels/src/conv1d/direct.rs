//! Direct conv1d: follows the definition, one output row at a time.
//!
//! For each output row `(b, o)` the row is set to the bias, then every
//! `(input channel, tap)` pair adds `w * x` over the output positions whose
//! input sample lies inside `[0, in_len)`. Taps that would read padding are
//! simply skipped, so padding is never materialised and the hot loop has no
//! per-element branch: the valid output range is computed once per tap
//! (see [`TapSpan`]).
//!
//! The innermost loop walks the time axis of one input row and one output
//! row, so both are streamed through cache linearly.

use super::algorithm::{ConvAlgorithm, Entry};
use super::params::Conv1dGeometry;
use super::tap_span::TapSpan;
use crate::scratch::Scratch;

/// The direct loop's registration: it applies to every convolution, and
/// reads the weights in place, fed or constant.
pub(super) const ENTRY: Entry = Entry {
    name: "direct",
    applies: |_, _| true,
    // Scalar: the same on every backend.
    cost: |g, _| cost(g),
    serial: super::cost::SERIAL,
    takes_fed_weights: true,
    prepare: |_, _, _| Some(Box::new(DirectConv)),
};

/// The direct loop prepared: nothing to prepare, no scratch, and no fused
/// operands (the fallback for any shape, not a fast path: the plan stores
/// its input and output).
struct DirectConv;

impl ConvAlgorithm for DirectConv {
    fn scratch_per_thread(&self) -> usize {
        0
    }

    fn prepared_bytes(&self) -> usize {
        0
    }

    fn run(
        &self,
        g: &Conv1dGeometry,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        y: &mut [f32],
        _scratch: &Scratch,
    ) {
        conv1d(g, x, w, bias, y);
    }
}

/// Computes `y` from `x`, `w` and `bias`, in parallel over output rows on the
/// current rayon pool.
///
/// The caller has checked every slice length against `geom`. Performs no heap
/// allocation of its own.
pub(super) fn conv1d(
    geom: &Conv1dGeometry,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    let p = &geom.params;
    debug_assert_eq!(x.len(), geom.input_elems);
    debug_assert_eq!(w.len(), geom.weight_elems);
    debug_assert_eq!(y.len(), geom.output_elems);
    debug_assert!(bias.is_none_or(|b| b.len() == p.out_channels));

    let x_batch_stride = p.in_channels * p.in_len;
    let x_group_len = geom.in_per_group * p.in_len;
    let filter_len = geom.in_per_group * p.kernel_size;

    // `out_len >= 1` is guaranteed by validation, as `par_chunks_mut` requires.
    crate::par::for_each_chunk_mut(y, geom.out_len, |row, y_row| {
        let (b, o) = (row / p.out_channels, row % p.out_channels);
        let group = o / geom.out_per_group;
        let x_group = &x[b * x_batch_stride + group * x_group_len..][..x_group_len];
        let filter = &w[o * filter_len..][..filter_len];
        let bias_o = bias.map_or(0.0, |bias| bias[o]);
        conv_row(geom, x_group, filter, bias_o, y_row);
    });
}

/// One output row: `y_row[l] = bias + sum_c sum_k filter[c, k] * x_group[c, l*stride + k*dilation - pad_left]`.
///
/// `x_group` is `[in_per_group, in_len]` (this row's group of input
/// channels for one batch item), `filter` is `[in_per_group, kernel_size]`.
fn conv_row(geom: &Conv1dGeometry, x_group: &[f32], filter: &[f32], bias: f32, y_row: &mut [f32]) {
    let p = &geom.params;
    y_row.fill(bias);
    for (channel, taps) in filter.chunks_exact(p.kernel_size).enumerate() {
        // Indexed rather than `chunks_exact(in_len)`, which panics when `in_len == 0`.
        let x_row = &x_group[channel * p.in_len..][..p.in_len];
        for (tap, &weight) in taps.iter().enumerate() {
            if let Some(span) = TapSpan::new(geom, tap * p.dilation) {
                accumulate(
                    &mut y_row[span.out],
                    weight,
                    &x_row[span.first_in..],
                    p.stride,
                );
            }
        }
    }
}

/// `y[l] += weight * x[l * stride]` for every `l < y.len()`.
///
/// `x` must hold at least `(y.len() - 1) * stride + 1` samples.
fn accumulate(y: &mut [f32], weight: f32, x: &[f32], stride: usize) {
    debug_assert!(y.is_empty() || (y.len() - 1) * stride < x.len());
    if stride == 1 {
        // Two equal-length contiguous slices: LLVM drops the bounds checks and
        // vectorises. `step_by(1)` would hide the contiguity from it.
        let x = &x[..y.len()];
        for (yv, &xv) in y.iter_mut().zip(x) {
            *yv += weight * xv;
        }
    } else {
        for (yv, &xv) in y.iter_mut().zip(x.iter().step_by(stride)) {
            *yv += weight * xv;
        }
    }
}

/// Estimated single-thread seconds (see `cost.rs`).
pub(super) fn cost(g: &Conv1dGeometry) -> f64 {
    use super::cost::{compulsory_bytes, direct_macs, roofline, DIRECT_MACS_PER_SEC};
    roofline(direct_macs(g), DIRECT_MACS_PER_SEC, compulsory_bytes(g))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accumulate_strided() {
        let mut y = [1.0, 1.0, 1.0];
        accumulate(&mut y, 2.0, &[1.0, 9.0, 2.0, 9.0, 3.0], 2);
        assert_eq!(y, [3.0, 5.0, 7.0]);
        let mut y = [0.0; 2];
        accumulate(&mut y, -1.0, &[4.0, 5.0, 6.0], 1);
        assert_eq!(y, [-4.0, -5.0]);
    }
}
