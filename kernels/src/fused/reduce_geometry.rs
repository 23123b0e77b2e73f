//! What a reduction (`reduce.rs`) derives from shapes alone, as data: the
//! type the compiled program keeps per shape generation
//! (`CompiledProgram::reduction`). Its own module, below both, so that the
//! compiled program holds it without importing the reduction, which reads
//! compiled programs; `reduce.rs` derives and reads it.

use super::program::views::LeafGeometry;
use super::shape::MAX_RANK;

/// How a reduction walks its input (see `reduce.rs`'s module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Walk {
    /// Each output reduces lines along `dim`, a reduced dimension.
    Rows { dim: usize },
    /// Blocks of outputs along `dim`, a kept dimension, accumulate a line
    /// per reduced coordinate.
    Columns { dim: usize },
}

/// What a reduction derives from shapes alone, kept per shape generation
/// in its compiled program (`CompiledProgram::reduction`), so that a call
/// of unchanged shapes walks no views: the walk (the loads' strides along
/// each dimension), where the root lies, where it is a stored tensor, and
/// whether its rows along the last dimension lie end to end.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct ReduceGeometry {
    /// The reduced dimensions it was derived for.
    pub(super) dims: [bool; MAX_RANK],
    pub(super) walk: Walk,
    pub(super) leaf: Option<LeafGeometry>,
    /// For rows along the last dimension: consecutive ones lie end to end
    /// in everything the program reads (see `reduce.rs`'s `Run::rows_in_lines`).
    pub(super) rows_end_to_end: bool,
}
