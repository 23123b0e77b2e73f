//! Fusion of elementwise work into the kernels' loops.
//!
//! * [`Program`]: an expression tree of elementwise ops over stored
//!   tensors, views of them (permute, slice, squeeze, broadcast, cat) and
//!   constants, evaluated a line of elements at a time with no allocation.
//! * [`RowsIn`] / [`RowsOut`]: how the conv and scan kernels take an
//!   operand computed by a program (a prologue) and hand their output to
//!   one (an epilogue), row chunk by row chunk, while it is in cache.
//! * [`UnaryOp`], [`BinaryOp`]: the elementwise functions, on vectorisable
//!   implementations of exp, log, erf and friends (`math.rs`).
//! * [`reduce`]: sums, means and two-pass variances of a program over some
//!   of its dimensions (a normalisation's statistics), gathered before a
//!   kernel's loops read them.

mod chain_recipes;
mod compiled;
mod conv_recipes;
mod flat;
mod generation;
mod math;
mod ops;
mod program;
mod recipes;
mod reduce;
mod reduce_geometry;
mod rows;
mod shape;
mod strided;

pub use compiled::{programs_compiled, CompiledProgram};
pub use generation::ShapeGeneration;
pub(crate) use ops::{prefetch, STREAM_OUTPUT_BYTES};
pub use ops::{BinaryOp, UnaryOp};
pub use program::{resolve_start, Env, Expr, Line, Node, Program, MAX_SHARED};
pub use reduce::{reduce, reduce_scratch, ReduceOp, Statistic};
pub use rows::{
    block_tmp, col_tmp, drain, line_scratch, materialise, EpilogueSink, PairSource, ProgramRows,
    RowSink, RowSource, RowsIn, RowsOut, SharedOut, StoreView, LINE_CHUNK, ROW_BLOCK,
};
pub use shape::{Shape, MAX_RANK};

#[cfg(test)]
mod tests;
