//! pte_runner's modules, as a library: the binary (main.rs) is built on it,
//! and the fuzz targets (fuzz/) reach its argument parser and npz reader
//! without starting a runner.

pub mod args;
pub mod concurrent;
// Public for main.rs. The unsafe functions' contracts are in the bridge's
// docs; clippy still finds the code cxx generates from it undocumented.
#[allow(
    clippy::missing_safety_doc,
    reason = "documented in the bridge, see above"
)]
pub mod ffi;
pub mod kernel_libs;
pub mod npz;
pub mod tensors;
