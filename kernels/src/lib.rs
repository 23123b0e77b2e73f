//! Pure-Rust compute kernels for RustConv, the ExecuTorch backend for 1-D
//! convolutions and linear scans.
//!
//! This crate knows nothing of ExecuTorch: kernels take shape parameters and
//! flat, row-major `f32` slices, and report problems as [`KernelError`]
//! values, never panics.
//!
//! * [`conv1d_f32`] with [`Conv1dParams`]: PyTorch `aten.convolution`
//!   restricted to one spatial dimension, non-transposed.
//! * [`linear_scan_f32`] with [`ScanParams`]: `y[t] = a[t] * y[t-1] + u[t]`
//!   ([`LinearScan`]: the same on an instruction set chosen once).
//! * [`fused`]: elementwise programs over strided views, and the row hooks
//!   through which the conv and scan kernels run them as prologues and
//!   epilogues inside their own loops.
//! * [`reference`](mod@reference): slow, obviously-correct versions for tests.
//!
//! Kernels run their loops on the *current* pool ([`par`]: one the host
//! installs, such as ExecuTorch's threadpool, or else the current rayon
//! pool), write only into the caller's output slice, and
//! perform no heap allocation of their own, so they can run inside an
//! executor's memory plan.
//!
//! ```
//! use rustconv_kernels::{conv1d_f32, Conv1dParams};
//!
//! // One channel, a 3-tap difference filter, PyTorch `padding=1`.
//! let p = Conv1dParams {
//!     batch: 1,
//!     in_channels: 1,
//!     out_channels: 1,
//!     in_len: 4,
//!     kernel_size: 3,
//!     stride: 1,
//!     pad_left: 1,
//!     pad_right: 1,
//!     dilation: 1,
//!     groups: 1,
//! };
//! let mut y = vec![0.0; p.output_elems()?];
//! conv1d_f32(&p, &[1.0, 2.0, 3.0, 4.0], &[1.0, 0.0, -1.0], None, &mut y)?;
//! assert_eq!(y, [-2.0, -2.0, -2.0, 3.0]);
//! # Ok::<(), rustconv_kernels::KernelError>(())
//! ```

// Unsafe code is confined to the modules that allow it (SIMD intrinsics,
// per-thread scratch), each block with its invariant stated.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod conv1d;
mod error;
pub mod fused;
pub mod par;
pub mod reference;
mod scan;
mod scratch;
mod simd;

#[cfg(test)]
mod test_support;

pub use conv1d::{
    applicable, conv1d_f32, estimate_cost, Algorithm, Choice, Conv1dParams, PreparedConv1d, Weights,
};
pub use error::KernelError;
pub use fused::{Shape, MAX_RANK};
pub use scan::{
    linear_scan_f32, linear_scan_rows, linear_scan_rows_pair, scan_rows_scratch, LinearScan,
    ScanParams,
};
pub use scratch::Scratch;
pub use simd::{vector_instructions, Isa};
