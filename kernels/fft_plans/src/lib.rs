//! realfft's planner for `f32`, behind a type that is not generic.
//!
//! realfft and rustfft are generic over the float type, so their code
//! (every butterfly, for every instruction set rustfft plans for) is
//! generated in the crate that names `RealFftPlanner::<f32>`: in the kernels
//! that was 54% of the crate's LLVM IR, generated again for each of
//! its builds (the library, its unit tests, and both again for aarch64).
//! Here it is generated once per target; the kernels call the plans through
//! realfft's trait objects, as they did, so nothing they run changes.
//!
//! No tests of its own: a test build would generate rustfft's code once
//! more, and the kernels' FFT convolution tests (`conv1d/fft/tests.rs`)
//! run every plan made here against direct convolution.

use std::sync::Arc;

pub use realfft::{ComplexToReal, RealToComplex};

/// Plans real-to-complex and complex-to-real transforms of `f32`; plans of
/// one planner share their tables.
#[derive(Default)]
pub struct Planner(realfft::RealFftPlanner<f32>);

impl Planner {
    pub fn new() -> Self {
        Self(realfft::RealFftPlanner::new())
    }

    /// The forward transform of `len` real samples (`len / 2 + 1` bins).
    pub fn forward(&mut self, len: usize) -> Arc<dyn RealToComplex<f32>> {
        self.0.plan_fft_forward(len)
    }

    /// The inverse transform back to `len` real samples.
    pub fn inverse(&mut self, len: usize) -> Arc<dyn ComplexToReal<f32>> {
        self.0.plan_fft_inverse(len)
    }
}
