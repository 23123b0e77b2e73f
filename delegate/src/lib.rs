//! RustConv: an ExecuTorch backend delegate for 1-D convolutions and linear
//! scans.
//!
//! A delegate blob (schema/README.md) goes through
//! [`blob`] (framing) → [`graph`] (flatbuffer, structural checks) →
//! [`plan`] (shapes at their bounds, kernel choice, arena placement, the
//! constants kept once the blob is freed) →
//! [`executor`] (per-call checks and kernels). [`ffi`] is the cxx bridge to
//! the C++ `BackendInterface` in delegate/cpp/.

pub mod blob;
mod constants;
pub mod delegate;
pub mod error;
pub mod executor;
mod ffi;
mod fusion;
pub mod graph;
pub mod inspect;
pub mod memory;
mod ops;
mod options;
pub mod plan;
mod shape;
pub mod threads;

#[cfg(test)]
mod tests;

pub use delegate::Delegate;
pub use ffi::register;

/// Registers the backend when the shared library is loaded (ctypes.CDLL in
/// rustconv.runtime). pte_runner links the rlib and calls [`register`].
#[ctor::ctor]
fn register_on_load() {
    if !register() {
        eprintln!("RustConvBackend: registration with ExecuTorch failed");
    }
}
