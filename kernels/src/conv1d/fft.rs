//! Depthwise conv1d with long filters: FFT with filter spectra computed at prepare.
//! (To be implemented: currently applies to nothing.)

use super::params::Conv1dGeometry;
use crate::scratch::Scratch;

pub(crate) fn applies(_g: &Conv1dGeometry) -> bool {
    false
}

pub(crate) fn cost(_g: &Conv1dGeometry) -> f64 {
    f64::INFINITY
}

pub(crate) struct FftConv;

impl FftConv {
    pub(crate) fn prepare(_g: &Conv1dGeometry, _w: &[f32]) -> Self {
        FftConv
    }
    pub(crate) fn scratch_per_thread(&self) -> usize {
        0
    }
    pub(crate) fn prepared_bytes(&self) -> usize {
        0
    }
    pub(crate) fn run(
        &self,
        _g: &Conv1dGeometry,
        _x: &[f32],
        _bias: Option<&[f32]>,
        _y: &mut [f32],
        _scratch: &Scratch,
    ) {
        unreachable!("fft::applies is false")
    }
}
