//! What a conv1d algorithm provides: its [`Entry`] in the registry (name,
//! where it applies, its cost, whether it takes fed weights, how to prepare
//! it) and the [`ConvAlgorithm`] its prepared form implements, which
//! [`super::PreparedConv1d`] holds as a trait object and calls once per
//! conv call (never per row or tile: the loops are the algorithm's own).
//!
//! Each algorithm's `Entry` and `impl ConvAlgorithm` sit in its own module
//! (`direct.rs`, `depthwise/`, `fft/`, `gemm/`, `fft_gemm/`), so adding one
//! touches its own files, its `mod` line and one line of `registry.rs`.

use super::params::Conv1dGeometry;
use super::weights::Weights;
use crate::fused::{RowsIn, RowsOut};
use crate::scratch::Scratch;
use crate::simd::{Backend, Isa};

/// One registered algorithm: everything choosing it needs before anything
/// is prepared, and the function that prepares it.
pub(crate) struct Entry {
    /// The name used in compile specs, blobs' logs, `inspect`, the
    /// benchmark and the Python side; never change one (exported models
    /// name it).
    pub name: &'static str,
    /// Whether the algorithm can compute convolutions of this shape on
    /// the backend (`fft_gemm` bounds its scratch by the backend's tile).
    pub applies: fn(&Conv1dGeometry, Backend) -> bool,
    /// Estimated single-thread seconds of one call at the shape on the
    /// backend (see `cost.rs`); asked only where `applies` holds.
    pub cost: fn(&Conv1dGeometry, Backend) -> f64,
    /// The share of that time more threads do not shorten (see
    /// `cost::on_threads`): `cost::SERIAL` unless fitted for the algorithm.
    pub serial: f64,
    /// Whether it can run with weights fed at run time (see [`Weights`]):
    /// false for an algorithm that derives data from the weights at
    /// prepare.
    pub takes_fed_weights: bool,
    /// Prepares it for the maximum shape `g`, where `applies(g)` holds, on
    /// the instruction set the preparation chose (which every call then
    /// runs); `None` where it cannot take `weights` (fed to an algorithm
    /// that does not take fed weights).
    pub prepare: fn(&Conv1dGeometry, Weights, Isa) -> Option<Box<dyn ConvAlgorithm>>,
}

/// A fused operand (a prologue's input, an epilogue's output) that this
/// algorithm cannot take; [`super::PreparedConv1d::run_rows`] reports it as
/// [`crate::KernelError::NotFusable`] with the algorithm's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NotFusable;

/// A conv1d algorithm prepared for a maximum shape. Calls pass their own
/// geometry (the prepared one, or a smaller batch and input length); the
/// caller ([`super::PreparedConv1d`]) has checked every slice length, the
/// weights' presence and the scratch against these methods before `run`
/// or `run_rows`, so the algorithms only compute.
///
/// `Send + Sync`: a prepared conv is built at `init` and run from whatever
/// thread calls `execute`, its tasks on the rayon pool.
pub(crate) trait ConvAlgorithm: Send + Sync {
    /// `f32` elements of scratch each thread needs for [`Self::run`] at
    /// any call up to the prepared shape: sized once, so `run` allocates
    /// nothing.
    fn scratch_per_thread(&self) -> usize;

    /// `f32` elements of the scratch's shared region a call needs (see
    /// [`Scratch::with_shared`]), at most the prepared shape `max`: data
    /// every task of a call reads, built once per call. None by default.
    fn shared_scratch(&self, max: &Conv1dGeometry) -> usize {
        let _ = max;
        0
    }

    /// Bytes of weight-derived data held (filter spectra, transform
    /// matrices, transposed taps), for memory reporting: the price of what
    /// was prepared, beside the weights the model holds.
    fn prepared_bytes(&self) -> usize;

    /// Whether `run` reads the original weights; where it does not (all
    /// it needs was derived at prepare), the caller may release them and
    /// pass none. True by default.
    fn reads_weights(&self) -> bool {
        true
    }

    /// Whether [`Self::run_rows`] takes a computed input (a prologue run in
    /// this algorithm's loops, so the input is never stored whole);
    /// otherwise the plan stores the input first. False by default.
    fn fuses_input(&self) -> bool {
        false
    }

    /// Whether [`Self::run_rows`] hands its output to an epilogue inside
    /// its loops (while in cache); otherwise the plan stores the output and
    /// runs the epilogue as a pass of its own. False by default.
    fn fuses_output(&self) -> bool {
        false
    }

    /// `f32` elements of scratch each thread needs for [`Self::run_rows`]
    /// at the prepared shape `max`, where the input's and the output's
    /// programs need `x_temps` and `y_temps` line-sized temporaries (0 for
    /// stored ones). By default that of [`Self::run`], for an algorithm
    /// that fuses nothing.
    fn rows_scratch(&self, max: &Conv1dGeometry, x_temps: usize, y_temps: usize) -> usize {
        let _ = (max, x_temps, y_temps);
        self.scratch_per_thread()
    }

    /// Computes `y = conv1d(x, w) + bias` for the call's geometry `g`, in
    /// parallel on the current rayon pool, allocating nothing. `w` is empty
    /// where [`Self::reads_weights`] is false and no weights were given.
    fn run(
        &self,
        g: &Conv1dGeometry,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        y: &mut [f32],
        scratch: &Scratch,
    );

    /// [`Self::run`] with at least one fused operand (a stored input and
    /// output go to `run`), within what [`Self::fuses_input`] and
    /// [`Self::fuses_output`] allow; [`NotFusable`] for a combination the
    /// algorithm cannot take, before computing anything. `scratch` has
    /// [`Self::rows_scratch`] elements per thread. By default nothing is
    /// fusable.
    fn run_rows(
        &self,
        g: &Conv1dGeometry,
        x: RowsIn,
        w: &[f32],
        bias: Option<&[f32]>,
        y: RowsOut,
        scratch: &Scratch,
    ) -> Result<(), NotFusable> {
        let _ = (g, x, w, bias, y, scratch);
        Err(NotFusable)
    }
}
