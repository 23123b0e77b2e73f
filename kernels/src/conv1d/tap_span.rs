//! Where a filter tap meets real input rather than padding: the arithmetic
//! the direct loop uses so its hot loop needs no padding branches (the
//! GEMM conv materialises padding in its window instead).

use std::ops::Range;

use super::params::Conv1dGeometry;

/// The output positions at which one tap reads a real input sample (not
/// padding), and the first sample it reads.
///
/// Output `l` reads input index `j = l * stride + tap_offset - pad_left`,
/// where `tap_offset = k * dilation`; `out` holds exactly the `l` with
/// `0 <= j < in_len`, and `first_in` is `j` at `out.start`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct TapSpan {
    pub out: Range<usize>,
    pub first_in: usize,
}

impl TapSpan {
    /// `None` when the tap reads only padding.
    pub fn new(geom: &Conv1dGeometry, tap_offset: usize) -> Option<Self> {
        let p = &geom.params;
        // Lower bound, j >= 0: l * stride >= pad_left - tap_offset.
        let start = p.pad_left.saturating_sub(tap_offset).div_ceil(p.stride);
        // Upper bound, j <= in_len - 1: l * stride <= pad_left + in_len - 1 - tap_offset.
        // No addition here can overflow: validation bounds tap_offset + 1 and
        // pad_left + in_len by the padded length.
        let last_reach = (p.pad_left + p.in_len).checked_sub(tap_offset + 1)?;
        let end = (last_reach / p.stride + 1).min(geom.out_len);
        if start >= end {
            return None;
        }
        // start < out_len, so start * stride + tap_offset is a position
        // inside the padded input, which validation showed fits in usize;
        // it is >= pad_left by the choice of start.
        let first_in = start * p.stride + tap_offset - p.pad_left;
        Some(Self {
            out: start..end,
            first_in,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::conv_params;
    use crate::Conv1dParams;

    fn params(
        in_len: usize,
        kernel_size: usize,
        stride: usize,
        pads: (usize, usize),
        dilation: usize,
    ) -> Conv1dParams {
        conv_params(1, (1, 1, 1), in_len, kernel_size, stride, pads, dilation)
    }

    /// The span a tap covers, found by brute force over every output position.
    fn brute_force_span(geom: &Conv1dGeometry, tap_offset: usize) -> Option<TapSpan> {
        let p = &geom.params;
        let reads_input = |l: usize| {
            let pos = l * p.stride + tap_offset;
            pos >= p.pad_left && pos - p.pad_left < p.in_len
        };
        let valid: Vec<usize> = (0..geom.out_len).filter(|&l| reads_input(l)).collect();
        let (&first, &last) = (valid.first()?, valid.last()?);
        // The valid positions of one tap are always contiguous.
        assert_eq!(valid.len(), last - first + 1);
        Some(TapSpan {
            out: first..last + 1,
            first_in: first * p.stride + tap_offset - p.pad_left,
        })
    }

    #[test]
    fn tap_span_matches_brute_force() {
        for in_len in 0..7 {
            for kernel_size in 1..6 {
                for stride in 1..5 {
                    for dilation in 1..4 {
                        for pads in [(0, 0), (1, 1), (3, 0), (0, 2), (5, 4), (9, 1)] {
                            let p = params(in_len, kernel_size, stride, pads, dilation);
                            // Invalid combinations (kernel too large) have no spans.
                            let Ok(geom) = p.geometry() else { continue };
                            for k in 0..kernel_size {
                                assert_eq!(
                                    TapSpan::new(&geom, k * dilation),
                                    brute_force_span(&geom, k * dilation),
                                    "{p:?}, tap {k}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn tap_span_hand_cases() {
        // N=4, K=3, pad 1/1: tap 0 misses output 0, tap 2 misses output 3.
        let geom = params(4, 3, 1, (1, 1), 1).geometry().unwrap();
        assert_eq!(
            TapSpan::new(&geom, 0),
            Some(TapSpan {
                out: 1..4,
                first_in: 0
            })
        );
        assert_eq!(
            TapSpan::new(&geom, 1),
            Some(TapSpan {
                out: 0..4,
                first_in: 0
            })
        );
        assert_eq!(
            TapSpan::new(&geom, 2),
            Some(TapSpan {
                out: 0..3,
                first_in: 1
            })
        );
        // All-padding tap: N=1, K=2, pad 3/0 -> out_len 3, tap 0 reads positions 0, 1, 2 (all padding).
        let geom = params(1, 2, 1, (3, 0), 1).geometry().unwrap();
        assert_eq!(TapSpan::new(&geom, 0), None);
        assert_eq!(
            TapSpan::new(&geom, 1),
            Some(TapSpan {
                out: 2..3,
                first_in: 0
            })
        );
    }
}
