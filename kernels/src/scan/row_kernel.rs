//! Which row kernels a scan runs: resolved from the instruction set
//! `crate::simd` chose, at the scan's entry.

use super::kernel::{self, ROWS_JOINT};
#[cfg(target_arch = "x86_64")]
use super::simd;
use crate::simd::Isa;

/// The scan's row kernels on an instruction set, resolved from the one
/// choice of `crate::simd` ([`RowKernel::of`]) at the scan's entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowKernel {
    /// Safe Rust shaped for 4-lane vectors (SSE, NEON), `kernel.rs`: rows
    /// stepped four at a time through transposed tiles, bit-identical to
    /// the plain loop; single rows in blocks of lanes.
    Portable,
    /// AVX2 and FMA: each row scanned on its own, 8 steps per vector by an
    /// in-register prefix scan (`simd.rs`).
    #[cfg(target_arch = "x86_64")]
    Avx2(simd::Avx2),
}

impl RowKernel {
    /// The kernels `isa` runs: the in-register scan where it has AVX2 and
    /// FMA (the AVX2 and AVX-512 backends), else the portable ones.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    pub(crate) fn of(isa: Isa) -> RowKernel {
        #[cfg(target_arch = "x86_64")]
        if let Some(avx2) = simd::Avx2::of(isa) {
            return RowKernel::Avx2(avx2);
        }
        RowKernel::Portable
    }

    /// Every row kernel this CPU can run, once each (tests force each in
    /// turn).
    #[cfg(test)]
    pub(crate) fn all_available() -> Vec<RowKernel> {
        let mut all: Vec<RowKernel> = Isa::all_available().into_iter().map(Self::of).collect();
        all.dedup();
        all
    }

    /// Scans the rows of a contiguous `[rows, len]` block (`rows =
    /// x0.len()`); `stream` asks for non-temporal stores of `y` where the
    /// kernel has them.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    pub(super) fn scan_rows(self, x0: &[f32], a: &[f32], u: &[f32], y: &mut [f32], stream: bool) {
        match self {
            RowKernel::Portable => kernel::scan_rows(x0, a, u, y),
            #[cfg(target_arch = "x86_64")]
            RowKernel::Avx2(avx2) => avx2.scan_rows(x0, a, u, y, stream),
        }
    }

    /// One row from state `s`; returns the final state.
    pub(super) fn scan_row(self, s: f32, a: &[f32], u: &[f32], y: &mut [f32]) -> f32 {
        match self {
            RowKernel::Portable => kernel::scan_row(s, a, u, y),
            #[cfg(target_arch = "x86_64")]
            RowKernel::Avx2(avx2) => avx2.scan_row(s, a, u, y),
        }
    }

    /// Rows a task of the rows strategy should hold a multiple of.
    pub(super) fn rows_joint(self) -> usize {
        match self {
            RowKernel::Portable => ROWS_JOINT,
            #[cfg(target_arch = "x86_64")]
            RowKernel::Avx2(_) => 1,
        }
    }
}
