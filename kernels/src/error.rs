//! The error type shared by every kernel in this crate.
//!
//! Kernels never panic on bad input: shapes come from a model file the
//! delegate does not control, so every problem is reported as a value the
//! caller can turn into an ExecuTorch error code and a log line.

use thiserror::Error;

/// Why a kernel refused to run.
///
/// Variants carry enough context for the `Display` text to stand alone in a
/// log line. The enum is `#[non_exhaustive]` so later algorithms can add
/// failure modes without breaking callers' `match`es.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum KernelError {
    /// A shape or hyper-parameter has a value the operation cannot accept.
    #[error("invalid {what} = {value}: {requirement}")]
    InvalidParam {
        /// The parameter's name, e.g. `"stride"`.
        what: &'static str,
        /// The rejected value.
        value: usize,
        /// What the value must satisfy, e.g. `"must be at least 1"`.
        requirement: &'static str,
    },

    /// `groups` does not divide a channel count.
    #[error("groups = {groups} does not divide {which} = {channels}")]
    GroupsMismatch {
        /// The number of groups.
        groups: usize,
        /// Which channel count it fails to divide: `"in_channels"` or `"out_channels"`.
        which: &'static str,
        /// That channel count.
        channels: usize,
    },

    /// The dilated kernel is longer than the padded input, so not even one
    /// output position exists (PyTorch: "Kernel size can't be greater than
    /// actual input size").
    #[error(
        "effective kernel size {effective_kernel} (dilation * (kernel_size - 1) + 1) \
         exceeds padded input length {padded_len}"
    )]
    KernelTooLarge {
        /// `dilation * (kernel_size - 1) + 1`.
        effective_kernel: usize,
        /// `in_len + pad_left + pad_right`.
        padded_len: usize,
    },

    /// A forced algorithm cannot compute this convolution.
    #[error("algorithm {algorithm} does not apply to this convolution")]
    NotApplicable {
        /// The algorithm's name.
        algorithm: &'static str,
    },

    /// An algorithm was handed a fused operand it cannot take.
    #[error("algorithm {algorithm} cannot read a fused input or write a fused output")]
    NotFusable {
        /// The algorithm's name.
        algorithm: &'static str,
    },

    /// A prepared convolution was called with parameters it was not
    /// prepared for (different static parameters, or a larger batch or
    /// input length).
    #[error("called with parameters other than those it was prepared for")]
    NotPrepared,

    /// A prepared convolution that reads its weights at every call (see
    /// `PreparedConv1d::reads_weights`) was called without them.
    #[error("this convolution's algorithm reads the weights at every call, and none were given")]
    MissingWeights,

    /// A buffer's length does not match what the parameters imply.
    #[error("buffer `{which}` has {actual} elements, expected {expected}")]
    BufferLen {
        /// The argument's name, e.g. `"x"` or `"bias"`.
        which: &'static str,
        /// Element count implied by the parameters.
        expected: usize,
        /// Element count of the slice actually passed.
        actual: usize,
    },

    /// A size derived from the parameters does not fit in `usize`.
    #[error("integer overflow computing {what}")]
    Overflow {
        /// The quantity being computed, e.g. `"input element count"`.
        what: &'static str,
    },

    /// Memory a plan asks for could not be allocated (a program may declare
    /// sizes larger than the device's memory).
    #[error("cannot allocate {elements} f32 values for {what}")]
    OutOfMemory {
        /// What the memory is for, e.g. `"scratch"`.
        what: &'static str,
        /// How many `f32` values were asked for.
        elements: usize,
    },
}

/// Returns `BufferLen` unless `actual == expected`.
pub(crate) fn check_len(
    which: &'static str,
    expected: usize,
    actual: usize,
) -> Result<(), KernelError> {
    if actual == expected {
        Ok(())
    } else {
        Err(KernelError::BufferLen {
            which,
            expected,
            actual,
        })
    }
}

/// Multiplies `factors`, reporting overflow as `KernelError::Overflow { what }`.
///
/// A zero factor makes the product zero whatever the others are, so an empty
/// tensor with one huge dimension is accepted regardless of factor order.
pub(crate) fn checked_product(factors: &[usize], what: &'static str) -> Result<usize, KernelError> {
    if factors.contains(&0) {
        return Ok(0);
    }
    factors
        .iter()
        .try_fold(1usize, |acc, &f| acc.checked_mul(f))
        .ok_or(KernelError::Overflow { what })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_as_log_lines() {
        let cases = [
            (
                KernelError::InvalidParam {
                    what: "stride",
                    value: 0,
                    requirement: "must be at least 1",
                },
                "invalid stride = 0: must be at least 1",
            ),
            (
                KernelError::GroupsMismatch {
                    groups: 3,
                    which: "in_channels",
                    channels: 4,
                },
                "groups = 3 does not divide in_channels = 4",
            ),
            (
                KernelError::KernelTooLarge {
                    effective_kernel: 7,
                    padded_len: 5,
                },
                "effective kernel size 7 (dilation * (kernel_size - 1) + 1) \
                 exceeds padded input length 5",
            ),
            (
                KernelError::BufferLen {
                    which: "x",
                    expected: 12,
                    actual: 10,
                },
                "buffer `x` has 10 elements, expected 12",
            ),
            (
                KernelError::Overflow {
                    what: "input element count",
                },
                "integer overflow computing input element count",
            ),
        ];
        for (err, text) in cases {
            assert_eq!(err.to_string(), text);
        }
    }

    #[test]
    fn check_len_accepts_only_exact_match() {
        assert_eq!(check_len("y", 4, 4), Ok(()));
        assert_eq!(
            check_len("y", 4, 5),
            Err(KernelError::BufferLen {
                which: "y",
                expected: 4,
                actual: 5
            })
        );
    }

    #[test]
    fn checked_product_detects_overflow() {
        assert_eq!(checked_product(&[], "n"), Ok(1));
        assert_eq!(checked_product(&[2, 3, 4], "n"), Ok(24));
        assert_eq!(checked_product(&[0, usize::MAX, 2], "n"), Ok(0));
        assert_eq!(checked_product(&[usize::MAX, 2, 0], "n"), Ok(0));
        assert_eq!(
            checked_product(&[usize::MAX, 2], "n"),
            Err(KernelError::Overflow { what: "n" })
        );
    }
}
