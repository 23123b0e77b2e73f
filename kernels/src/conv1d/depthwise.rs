//! Depthwise conv1d with short filters: SIMD along time, taps in registers.
//! (To be implemented: currently applies to nothing.)

use super::params::Conv1dGeometry;
use crate::scratch::Scratch;

pub(crate) fn applies(_g: &Conv1dGeometry) -> bool {
    false
}

pub(crate) fn cost(_g: &Conv1dGeometry) -> f64 {
    f64::INFINITY
}

pub(crate) struct DepthwiseConv;

impl DepthwiseConv {
    pub(crate) fn prepare(_g: &Conv1dGeometry, _w: &[f32]) -> Self {
        DepthwiseConv
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
        _w: &[f32],
        _bias: Option<&[f32]>,
        _y: &mut [f32],
        _scratch: &Scratch,
    ) {
        unreachable!("depthwise::applies is false")
    }
}
