//! The kinds of step a plan runs, one type each: a conv ([`ConvStep`]), a
//! scan ([`ScanStep`]) and an elementwise pass ([`PassStep`]). `fusion`
//! builds each from the blob's kernel, `Plan::build` prepares it (a conv
//! chooses its algorithm and what it stages through memory), and the
//! executor runs it: the same value from fusion to execution, asked
//! through [`StepKind`] for everything a plan needs of it (what it reads
//! and stages, its scratch, its description for logs, inspect and the
//! profiler, its work, and its run). Adding an anchor op is a new type
//! here, its construction in `fusion`, and its description in `graph.rs`
//! and `ops.rs` (decoding, checks, shape inference).
//!
//! [`Call`] is what a step sees of one call: the values' shapes and data.

mod call;
mod conv;
mod kind;
mod pass;
mod scan;

pub use call::Call;
pub use conv::ConvStep;
pub use kind::{Epilogue, Prepare, Source, StepKind};
pub use pass::PassStep;
pub use scan::ScanStep;
