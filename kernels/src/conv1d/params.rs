//! Conv1d shape parameters, their validation, and the derived geometry that
//! every conv1d algorithm works from.

use crate::error::{check_len, checked_product, KernelError};

/// Shape and hyper-parameters of a 1-D, non-transposed convolution, with the
/// meaning of PyTorch's `aten.convolution`.
///
/// Tensors are row-major and contiguous:
/// input `[batch, in_channels, in_len]`,
/// weight `[out_channels, in_channels / groups, kernel_size]`,
/// bias `[out_channels]`,
/// output `[batch, out_channels, out_len]`.
///
/// Padding is split into left and right so a causal convolution (left only)
/// needs no copy of the input; PyTorch's symmetric `padding = p` is
/// `pad_left = pad_right = p`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv1dParams {
    /// Batch size. Zero is allowed and makes the call a no-op.
    pub batch: usize,
    /// Input channels; at least 1 and a multiple of `groups`.
    pub in_channels: usize,
    /// Output channels; at least 1 and a multiple of `groups`.
    pub out_channels: usize,
    /// Input length along the time axis (before padding).
    pub in_len: usize,
    /// Taps per filter; at least 1.
    pub kernel_size: usize,
    /// Step between output positions, in input samples; at least 1.
    pub stride: usize,
    /// Implicit zeros before the input.
    pub pad_left: usize,
    /// Implicit zeros after the input.
    pub pad_right: usize,
    /// Spacing between taps, in input samples; at least 1.
    pub dilation: usize,
    /// Channel groups; each output channel sees only its group's
    /// `in_channels / groups` input channels. `groups == in_channels ==
    /// out_channels` is a depthwise convolution.
    pub groups: usize,
}

impl Conv1dParams {
    /// Checks every constraint on the parameters, with overflow-checked
    /// arithmetic, so that kernels can index without further checks.
    ///
    /// # Errors
    ///
    /// * [`KernelError::InvalidParam`] if a channel count, `kernel_size`,
    ///   `stride`, `dilation` or `groups` is zero;
    /// * [`KernelError::GroupsMismatch`] if `groups` does not divide a channel count;
    /// * [`KernelError::KernelTooLarge`] if `dilation * (kernel_size - 1) + 1`
    ///   exceeds `in_len + pad_left + pad_right` (no output position exists);
    /// * [`KernelError::Overflow`] if a length or element count does not fit
    ///   in `usize`.
    pub fn validate(&self) -> Result<(), KernelError> {
        self.geometry().map(|_| ())
    }

    /// Output length `floor((in_len + pad_left + pad_right - dilation * (kernel_size - 1) - 1) / stride) + 1`,
    /// after validating the parameters.
    ///
    /// # Errors
    ///
    /// As [`validate`](Self::validate).
    pub fn out_len(&self) -> Result<usize, KernelError> {
        self.geometry().map(|g| g.out_len)
    }

    /// Elements in the input `[batch, in_channels, in_len]`.
    ///
    /// Saturates at `usize::MAX` on overflow rather than failing: no `f32`
    /// slice can be that long, so a length check against it fails cleanly.
    /// `validate` reports the overflow itself.
    #[must_use]
    pub fn input_elems(&self) -> usize {
        saturating_product(&[self.batch, self.in_channels, self.in_len])
    }

    /// Elements in the weight `[out_channels, in_channels / groups, kernel_size]`.
    ///
    /// Saturates like [`input_elems`](Self::input_elems); unspecified (but
    /// never panicking) when `groups` is zero.
    #[must_use]
    pub fn weight_elems(&self) -> usize {
        let in_per_group = self.in_channels.checked_div(self.groups).unwrap_or(0);
        saturating_product(&[self.out_channels, in_per_group, self.kernel_size])
    }

    /// Elements in the bias `[out_channels]`.
    #[must_use]
    pub fn bias_elems(&self) -> usize {
        self.out_channels
    }

    /// Elements in the output `[batch, out_channels, out_len]`, after
    /// validating the parameters.
    ///
    /// # Errors
    ///
    /// As [`validate`](Self::validate).
    pub fn output_elems(&self) -> Result<usize, KernelError> {
        self.geometry().map(|g| g.output_elems)
    }

    /// Validates the parameters and derives everything a kernel needs.
    ///
    /// This is the single place where constraints are checked; `validate`,
    /// `out_len` and the kernels all go through it so they cannot disagree.
    pub(crate) fn geometry(&self) -> Result<Conv1dGeometry, KernelError> {
        // Zero checks come first: the later arithmetic divides by some of these.
        for (what, value) in [
            ("in_channels", self.in_channels),
            ("out_channels", self.out_channels),
            ("kernel_size", self.kernel_size),
            ("stride", self.stride),
            ("dilation", self.dilation),
            ("groups", self.groups),
        ] {
            if value == 0 {
                return Err(KernelError::InvalidParam {
                    what,
                    value,
                    requirement: "must be at least 1",
                });
            }
        }
        for (which, channels) in [
            ("in_channels", self.in_channels),
            ("out_channels", self.out_channels),
        ] {
            if channels % self.groups != 0 {
                return Err(KernelError::GroupsMismatch {
                    groups: self.groups,
                    which,
                    channels,
                });
            }
        }

        let effective_kernel = self
            .dilation
            .checked_mul(self.kernel_size - 1)
            .and_then(|span| span.checked_add(1))
            .ok_or(KernelError::Overflow {
                what: "effective kernel size",
            })?;
        let padded_len = self
            .in_len
            .checked_add(self.pad_left)
            .and_then(|n| n.checked_add(self.pad_right))
            .ok_or(KernelError::Overflow {
                what: "padded input length",
            })?;
        if effective_kernel > padded_len {
            return Err(KernelError::KernelTooLarge {
                effective_kernel,
                padded_len,
            });
        }
        // Cannot overflow: the quotient is at most padded_len - 1.
        let out_len = (padded_len - effective_kernel) / self.stride + 1;

        let in_per_group = self.in_channels / self.groups;
        let out_per_group = self.out_channels / self.groups;
        Ok(Conv1dGeometry {
            params: *self,
            out_len,
            in_per_group,
            out_per_group,
            input_elems: checked_product(
                &[self.batch, self.in_channels, self.in_len],
                "input element count",
            )?,
            weight_elems: checked_product(
                &[self.out_channels, in_per_group, self.kernel_size],
                "weight element count",
            )?,
            output_elems: checked_product(
                &[self.batch, self.out_channels, out_len],
                "output element count",
            )?,
        })
    }
}

/// Validated conv1d parameters plus the quantities derived from them.
///
/// Every conv1d algorithm takes this rather than raw [`Conv1dParams`], so it
/// can rely on: all counts non-zero except `batch` and `in_len`, `groups`
/// dividing both channel counts, `out_len >= 1`, and every element count and
/// every input position `l * stride + k * dilation` (`l < out_len`,
/// `k < kernel_size`) fitting in `usize`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Conv1dGeometry {
    pub params: Conv1dParams,
    pub out_len: usize,
    pub in_per_group: usize,
    pub out_per_group: usize,
    pub input_elems: usize,
    pub weight_elems: usize,
    pub output_elems: usize,
}

impl Conv1dGeometry {
    /// Checks the input, weight and (if present) bias slices against the
    /// shape. The output is checked by the caller, which may allocate it.
    pub(crate) fn check_inputs(
        &self,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
    ) -> Result<(), KernelError> {
        check_len("x", self.input_elems, x.len())?;
        check_len("w", self.weight_elems, w.len())?;
        if let Some(bias) = bias {
            check_len("bias", self.params.out_channels, bias.len())?;
        }
        Ok(())
    }
}

fn saturating_product(factors: &[usize]) -> usize {
    // Exact whenever the true product fits: without a zero factor the partial
    // products never exceed the result, and with one the result is 0 anyway.
    factors.iter().fold(1usize, |acc, &f| acc.saturating_mul(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A valid baseline that each test perturbs.
    fn base() -> Conv1dParams {
        Conv1dParams {
            batch: 2,
            in_channels: 6,
            out_channels: 4,
            in_len: 10,
            kernel_size: 3,
            stride: 1,
            pad_left: 0,
            pad_right: 0,
            dilation: 1,
            groups: 2,
        }
    }

    #[test]
    fn out_len_matches_pytorch_formula() {
        // (in_len, k, stride, pad_left, pad_right, dilation) -> out_len,
        // each checked by hand against floor((N + pl + pr - d(K-1) - 1) / s) + 1.
        let cases = [
            ((10, 3, 1, 0, 0, 1), 8),
            ((10, 3, 1, 1, 1, 1), 10),
            ((10, 3, 2, 1, 1, 1), 5),
            ((10, 3, 3, 0, 0, 1), 3),
            ((10, 3, 1, 0, 0, 2), 6),
            ((10, 3, 1, 0, 0, 3), 4),
            ((10, 10, 1, 0, 0, 1), 1),
            ((10, 1, 25, 0, 0, 1), 1),
            ((4, 7, 1, 3, 0, 1), 1),
            ((4, 7, 1, 4, 2, 1), 4),
            ((0, 3, 1, 2, 1, 1), 1),
        ];
        for ((in_len, kernel_size, stride, pad_left, pad_right, dilation), want) in cases {
            let p = Conv1dParams {
                in_len,
                kernel_size,
                stride,
                pad_left,
                pad_right,
                dilation,
                ..base()
            };
            assert_eq!(p.out_len(), Ok(want), "{p:?}");
        }
    }

    #[test]
    fn element_counts() {
        let p = base();
        assert_eq!(p.input_elems(), 2 * 6 * 10);
        assert_eq!(p.weight_elems(), 4 * 3 * 3);
        assert_eq!(p.bias_elems(), 4);
        assert_eq!(p.output_elems(), Ok(2 * 4 * 8));
    }

    #[test]
    fn zero_batch_is_valid_and_empty() {
        let p = Conv1dParams { batch: 0, ..base() };
        assert_eq!(p.validate(), Ok(()));
        assert_eq!(p.input_elems(), 0);
        assert_eq!(p.output_elems(), Ok(0));
    }

    #[test]
    fn each_zero_param_is_rejected() {
        let zeroed = [
            (
                "in_channels",
                Conv1dParams {
                    in_channels: 0,
                    ..base()
                },
            ),
            (
                "out_channels",
                Conv1dParams {
                    out_channels: 0,
                    ..base()
                },
            ),
            (
                "kernel_size",
                Conv1dParams {
                    kernel_size: 0,
                    ..base()
                },
            ),
            (
                "stride",
                Conv1dParams {
                    stride: 0,
                    ..base()
                },
            ),
            (
                "dilation",
                Conv1dParams {
                    dilation: 0,
                    ..base()
                },
            ),
            (
                "groups",
                Conv1dParams {
                    groups: 0,
                    ..base()
                },
            ),
        ];
        for (name, p) in zeroed {
            assert_eq!(
                p.validate(),
                Err(KernelError::InvalidParam {
                    what: name,
                    value: 0,
                    requirement: "must be at least 1",
                })
            );
            // The size helpers must not panic on invalid params either.
            let _ = (p.input_elems(), p.weight_elems(), p.output_elems());
        }
    }

    #[test]
    fn groups_must_divide_both_channel_counts() {
        let p = Conv1dParams {
            in_channels: 6,
            out_channels: 4,
            groups: 3,
            ..base()
        };
        assert_eq!(
            p.validate(),
            Err(KernelError::GroupsMismatch {
                groups: 3,
                which: "out_channels",
                channels: 4
            })
        );
        let p = Conv1dParams {
            in_channels: 5,
            out_channels: 4,
            groups: 2,
            ..base()
        };
        assert_eq!(
            p.validate(),
            Err(KernelError::GroupsMismatch {
                groups: 2,
                which: "in_channels",
                channels: 5
            })
        );
    }

    #[test]
    fn kernel_larger_than_padded_input_is_rejected() {
        let p = Conv1dParams {
            in_len: 4,
            kernel_size: 3,
            dilation: 2,
            pad_left: 0,
            pad_right: 0,
            ..base()
        };
        assert_eq!(
            p.out_len(),
            Err(KernelError::KernelTooLarge {
                effective_kernel: 5,
                padded_len: 4
            })
        );
        // One more sample of padding makes it fit exactly.
        assert_eq!(Conv1dParams { pad_right: 1, ..p }.out_len(), Ok(1));
        // Empty input with no padding has no output position.
        let p = Conv1dParams {
            in_len: 0,
            kernel_size: 1,
            ..base()
        };
        assert_eq!(
            p.out_len(),
            Err(KernelError::KernelTooLarge {
                effective_kernel: 1,
                padded_len: 0
            })
        );
    }

    #[test]
    fn overflow_is_an_error_not_a_panic() {
        let cases = [
            (
                Conv1dParams {
                    dilation: usize::MAX,
                    ..base()
                },
                "effective kernel size",
            ),
            (
                Conv1dParams {
                    in_len: usize::MAX,
                    pad_left: 1,
                    ..base()
                },
                "padded input length",
            ),
            (
                Conv1dParams {
                    batch: usize::MAX,
                    ..base()
                },
                "input element count",
            ),
            (
                Conv1dParams {
                    in_len: 1,
                    kernel_size: usize::MAX / 2,
                    pad_right: usize::MAX - 1,
                    ..base()
                },
                "weight element count",
            ),
            (
                Conv1dParams {
                    batch: usize::MAX / 8,
                    in_len: 1,
                    kernel_size: 1,
                    pad_right: 15,
                    in_channels: 1,
                    out_channels: 1,
                    groups: 1,
                    ..base()
                },
                "output element count",
            ),
        ];
        for (p, what) in cases {
            assert_eq!(p.validate(), Err(KernelError::Overflow { what }), "{p:?}");
            // The saturating size helpers must not panic either.
            let _ = (p.input_elems(), p.weight_elems());
        }
    }

    #[test]
    fn saturating_sizes_never_match_a_real_slice() {
        let p = Conv1dParams {
            batch: usize::MAX,
            ..base()
        };
        assert_eq!(p.input_elems(), usize::MAX);
        let p = Conv1dParams {
            out_channels: usize::MAX - 1,
            groups: 1,
            ..base()
        };
        assert_eq!(p.weight_elems(), usize::MAX);
    }
}
