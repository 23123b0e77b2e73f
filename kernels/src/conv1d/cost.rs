//! The cost model that picks a conv1d algorithm at prepare time.
//!
//! Each algorithm estimates one call's single-thread time as the larger of
//! its arithmetic at a sustained rate and its memory traffic at a sustained
//! bandwidth (a roofline). The rates below are per core, calibrated on the
//! benchmark's per-candidate timings (`bench/`, which prints each
//! candidate's measured time beside this estimate); only their ratios
//! matter for the choice. The choice compares them on the threads of the
//! pool it prepares on: each algorithm's serial fraction ([`on_threads`])
//! scales its single-thread time, since the algorithms split their work
//! differently well. Where the model is wrong for a deployment, the
//! `algorithm` compile spec forces a choice or asks for measurement.

use super::params::Conv1dGeometry;

/// Scalar direct loop, multiply-adds per second.
pub(crate) const DIRECT_MACS_PER_SEC: f64 = 4.0e9;
/// Sustained memory bandwidth of one core, bytes per second.
pub(crate) const BYTES_PER_SEC: f64 = 1.0e10;

/// Multiply-adds of the direct definition.
pub(crate) fn direct_macs(g: &Conv1dGeometry) -> f64 {
    let p = &g.params;
    (p.batch * p.out_channels * g.out_len) as f64 * (g.in_per_group * p.kernel_size) as f64
}

/// Bytes every algorithm must move at least: read x and w, write y.
pub(crate) fn compulsory_bytes(g: &Conv1dGeometry) -> f64 {
    4.0 * (g.input_elems + g.weight_elems + g.output_elems) as f64
}

/// Roofline time: `macs` at `rate`, or `bytes` at [`BYTES_PER_SEC`].
pub(crate) fn roofline(macs: f64, rate: f64, bytes: f64) -> f64 {
    (macs / rate).max(bytes / BYTES_PER_SEC)
}

/// The share of a call's single-thread time that more threads do not
/// shorten (Amdahl's serial fraction), for an algorithm with no fitted one
/// of its own: the `gemm` algorithm's, 7.3 times faster on 16 threads than
/// on one and 3.2 times on 4 (medians over 36 shapes of HiFi-GAN's blocks,
/// 32 to 256 channels, on the 16-core Intel Xeon device, 2026-11-28:
/// `calibrate_vocoder`).
pub(crate) const SERIAL: f64 = 0.08;

/// Seconds on `threads` threads of a call taking `seconds` on one, of an
/// algorithm whose serial fraction is `serial`.
pub(crate) fn on_threads(seconds: f64, serial: f64, threads: usize) -> f64 {
    seconds * (serial + (1.0 - serial) / threads.max(1) as f64)
}
