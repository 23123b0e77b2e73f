//! The shape of a scan, which every entry point checks.

use crate::error::{checked_product, KernelError};

/// Shape of a linear scan: `x0` is `[batch, channels]`; `a`, `u` and `y` are
/// `[batch, channels, len]`, row-major and contiguous.
///
/// Any dimension may be zero; the scan is then a no-op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanParams {
    /// Batch size.
    pub batch: usize,
    /// Independent recurrences per batch item.
    pub channels: usize,
    /// Steps per recurrence (the time axis).
    pub len: usize,
}

impl ScanParams {
    /// Checks that every element count fits in `usize`.
    ///
    /// # Errors
    ///
    /// [`KernelError::Overflow`] if `batch * channels` or
    /// `batch * channels * len` does not fit in `usize`.
    pub fn validate(&self) -> Result<(), KernelError> {
        checked_product(&[self.batch, self.channels], "scan state element count")?;
        checked_product(
            &[self.batch, self.channels, self.len],
            "scan sequence element count",
        )?;
        Ok(())
    }

    /// Elements in `x0`: `batch * channels`.
    ///
    /// Saturates at `usize::MAX` on overflow, which no `f32` slice can match;
    /// `validate` reports the overflow itself.
    #[must_use]
    pub fn state_elems(&self) -> usize {
        self.batch.saturating_mul(self.channels)
    }

    /// Elements in `a`, `u` and `y`: `batch * channels * len`. Saturates like
    /// [`state_elems`](Self::state_elems); exact whenever the true product
    /// fits (a saturated partial product times a zero `len` is still 0).
    #[must_use]
    pub fn seq_elems(&self) -> usize {
        self.state_elems().saturating_mul(self.len)
    }
}
