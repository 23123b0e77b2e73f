//! Naive, obviously-correct versions of every kernel, for tests.
//!
//! Each function transcribes the defining formula with plain index
//! arithmetic and explicit zero padding checks, and accumulates in `f64`, so
//! it is at least as accurate as any `f32` kernel it is used to check. They
//! validate parameters and buffer lengths exactly like the fast kernels
//! (returning the same errors), allocate their output, and are slow: use
//! them only in tests, in this crate and in the delegate.

use crate::conv1d::Conv1dParams;
use crate::error::{check_len, KernelError};
use crate::scan::ScanParams;

/// Reference conv1d: returns `y` `[batch, out_channels, out_len]` for the
/// same arguments as [`crate::conv1d_f32`].
///
/// # Errors
///
/// Exactly those of [`crate::conv1d_f32`], except that there is no `y` to check.
pub fn conv1d_f32(
    p: &Conv1dParams,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
) -> Result<Vec<f32>, KernelError> {
    let geom = p.geometry()?;
    geom.check_inputs(x, w, bias)?;
    let (in_per_group, out_per_group) = (geom.in_per_group, geom.out_per_group);

    let mut y = Vec::with_capacity(geom.output_elems);
    for b in 0..p.batch {
        for o in 0..p.out_channels {
            let group = o / out_per_group;
            for l in 0..geom.out_len {
                let mut acc = f64::from(bias.map_or(0.0, |bias| bias[o]));
                for c in 0..in_per_group {
                    let i = group * in_per_group + c;
                    for k in 0..p.kernel_size {
                        // Position in the zero-padded input.
                        let padded_pos = l * p.stride + k * p.dilation;
                        if padded_pos < p.pad_left || padded_pos - p.pad_left >= p.in_len {
                            continue; // reads a padding zero
                        }
                        let xv = x[(b * p.in_channels + i) * p.in_len + (padded_pos - p.pad_left)];
                        let wv = w[(o * in_per_group + c) * p.kernel_size + k];
                        acc += f64::from(wv) * f64::from(xv);
                    }
                }
                y.push(acc as f32);
            }
        }
    }
    Ok(y)
}

/// Reference linear scan: returns `y` `[batch, channels, len]` for the same
/// arguments as [`crate::linear_scan_f32`].
///
/// # Errors
///
/// Exactly those of [`crate::linear_scan_f32`], except that there is no `y`
/// to check.
pub fn linear_scan_f32(
    p: &ScanParams,
    x0: &[f32],
    a: &[f32],
    u: &[f32],
) -> Result<Vec<f32>, KernelError> {
    p.validate()?;
    check_len("x0", p.state_elems(), x0.len())?;
    check_len("a", p.seq_elems(), a.len())?;
    check_len("u", p.seq_elems(), u.len())?;

    let mut y = vec![0.0; p.seq_elems()];
    // One x0 per (batch, channel) row, in row order.
    for (row, &init) in x0.iter().enumerate() {
        let mut state = f64::from(init);
        for t in 0..p.len {
            let idx = row * p.len + t;
            state = f64::from(a[idx]) * state + f64::from(u[idx]);
            y[idx] = state as f32;
        }
    }
    Ok(y)
}

#[cfg(test)]
mod tests {
    //! Hand-computed cases (each also checked against PyTorch's
    //! `torch.nn.functional.conv1d`), so the reference is known right and not
    //! merely consistent with the kernels.

    use super::*;
    use crate::test_support::conv_params;

    fn params(
        in_channels: usize,
        out_channels: usize,
        in_len: usize,
        kernel_size: usize,
    ) -> Conv1dParams {
        let channels = (in_channels, out_channels, 1);
        conv_params(1, channels, in_len, kernel_size, 1, (0, 0), 1)
    }

    #[test]
    fn conv_difference_filter() {
        let x = [1.0, 2.0, 3.0, 4.0];
        let w = [1.0, 0.0, -1.0];
        let p = params(1, 1, 4, 3);
        assert_eq!(conv1d_f32(&p, &x, &w, None).unwrap(), [-2.0, -2.0]);
        // Symmetric padding 1: the ends read zeros.
        let p = Conv1dParams {
            pad_left: 1,
            pad_right: 1,
            ..p
        };
        assert_eq!(
            conv1d_f32(&p, &x, &w, None).unwrap(),
            [-2.0, -2.0, -2.0, 3.0]
        );
    }

    #[test]
    fn conv_stride_dilation_asymmetric_padding_bias() {
        // Padded input: [0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 0]; taps at +0 and +3;
        // outputs start at 0, 2, 4, 6.
        // y[0] = 10 + 1*0 + 2*1 = 12, y[1] = 10 + 0 + 2*3 = 16,
        // y[2] = 10 + 2 + 2*5 = 22,   y[3] = 10 + 4 + 2*7 = 28.
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0];
        let p = Conv1dParams {
            stride: 2,
            dilation: 3,
            pad_left: 3,
            pad_right: 1,
            ..params(1, 1, 7, 2)
        };
        let y = conv1d_f32(&p, &x, &[1.0, 2.0], Some(&[10.0])).unwrap();
        assert_eq!(y, [12.0, 16.0, 22.0, 28.0]);
    }

    #[test]
    fn conv_groups_use_only_their_channels() {
        // x channels: [0,1,2], [3,4,5], [6,7,8], [9,10,11]; groups = 2.
        // o0 sees channels 0,1 with [[1,-1],[2,0]]: [0-1+6, 1-2+8] = [5, 7].
        // o1 sees channels 2,3 with [[0,1],[1,1]]: [7+9+10, 8+10+11] = [26, 29].
        let x: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let w = [1.0, -1.0, 2.0, 0.0, 0.0, 1.0, 1.0, 1.0];
        let p = Conv1dParams {
            groups: 2,
            ..params(4, 2, 3, 2)
        };
        assert_eq!(
            conv1d_f32(&p, &x, &w, None).unwrap(),
            [5.0, 7.0, 26.0, 29.0]
        );
    }

    #[test]
    fn conv_batches_are_independent() {
        let x = [1.0, 2.0, 10.0, 20.0];
        let p = Conv1dParams {
            batch: 2,
            ..params(1, 1, 2, 2)
        };
        assert_eq!(conv1d_f32(&p, &x, &[1.0, 1.0], None).unwrap(), [3.0, 30.0]);
    }

    #[test]
    fn scan_recurrence() {
        // Row 0: x0 = 2; y = [0.5*2+1, 2*2+1, 1*5+1] = [2, 5, 6].
        // Row 1: x0 = -1; y = [0*(-1)+3, -1*3+0, 2*(-3)+1] = [3, -3, -5].
        let p = ScanParams {
            batch: 1,
            channels: 2,
            len: 3,
        };
        let y = linear_scan_f32(
            &p,
            &[2.0, -1.0],
            &[0.5, 2.0, 1.0, 0.0, -1.0, 2.0],
            &[1.0, 1.0, 1.0, 3.0, 0.0, 1.0],
        )
        .unwrap();
        assert_eq!(y, [2.0, 5.0, 6.0, 3.0, -3.0, -5.0]);
    }

    #[test]
    fn validates_like_the_kernels() {
        let p = params(1, 1, 4, 3);
        assert_eq!(
            conv1d_f32(&p, &[0.0; 3], &[0.0; 3], None),
            Err(KernelError::BufferLen {
                which: "x",
                expected: 4,
                actual: 3
            })
        );
        assert!(matches!(
            conv1d_f32(&Conv1dParams { stride: 0, ..p }, &[0.0; 4], &[0.0; 3], None),
            Err(KernelError::InvalidParam { what: "stride", .. })
        ));
        let p = ScanParams {
            batch: 1,
            channels: 1,
            len: 2,
        };
        assert_eq!(
            linear_scan_f32(&p, &[0.0], &[0.0; 2], &[0.0; 3]),
            Err(KernelError::BufferLen {
                which: "u",
                expected: 2,
                actual: 3
            })
        );
    }
}
