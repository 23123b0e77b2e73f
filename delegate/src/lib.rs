//! RustConv: an ExecuTorch backend delegate for 1-D convolutions and linear
//! scans.
//!
//! A delegate blob (schema/README.md) goes through
//! [`blob`] (framing) → [`graph`] (flatbuffer, structural checks) →
//! `fusion` (the fused kernels recorded at export, checked and built:
//! stored values, prologue and epilogue programs, each kernel's [`step`]) →
//! [`plan`] (steps prepared: kernel choice, what they stage; arena
//! placement, the constants kept once the blob is freed) →
//! [`executor`] (per-call checks, shapes, then each step's own run).
//! [`step`] holds one type per kind of step (conv, scan, elementwise pass)
//! behind one trait, the same value from fusion to execution, and each
//! anchor op's description (`AnchorOp`), registered once in
//! `step::ANCHORS`, through which `graph`, `ops` and `fusion` reach it.
//! The values' types (dtype, dims, role) are in `value`.
//! [`profiling`] times each fused kernel for ExecuTorch's event tracer.
//! [`inspect`] describes a plan for `python -m rustconv.inspect`. `ffi` is
//! the cxx bridge to the C++ `BackendInterface` in cpp/ and the
//! C entry point of `inspect`; `host`, below it, the host interface the
//! other modules use (ExecuTorch's status codes and log).

pub mod blob;
mod constants;
pub mod delegate;
pub mod error;
pub mod executor;
mod ffi;
mod fusion;
pub mod graph;
mod host;
pub mod inspect;
pub mod memory;
mod ops;
mod options;
pub mod plan;
pub mod profiling;
mod shape;
pub mod state;
pub mod step;
pub mod threads;
mod value;

#[cfg(test)]
mod tests;

pub use delegate::Delegate;
pub use ffi::{linear_scan_kernel_registered, register};

/// The ExecuTorch release this library was compiled and linked against, as
/// `RUSTCONV_BUILT_FOR_EXECUTORCH=<version>` and a NUL. `rustconv.runtime`
/// reads it from the file before loading the library, so a mismatched
/// ExecuTorch is refused with a message naming both versions instead of
/// failing in the dynamic loader or in a static initialiser. Exported, so the
/// linker keeps it.
#[no_mangle]
pub static RUSTCONV_BUILT_FOR_EXECUTORCH: &str = concat!(
    "RUSTCONV_BUILT_FOR_EXECUTORCH=",
    env!("RUSTCONV_EXECUTORCH_VERSION"),
    "\0"
);

/// Registers the backend when the shared library is loaded (ctypes.CDLL in
/// rustconv.runtime). pte_runner links the rlib and calls [`register`].
#[ctor::ctor]
fn register_on_load() {
    if !register() {
        eprintln!("RustConvBackend: registration with ExecuTorch failed");
    }
}
