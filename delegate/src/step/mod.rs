//! The kinds of step a plan runs, one type each: a conv (`ConvStep`), a
//! scan (`ScanStep`), each in its anchor op's file, an elementwise pass
//! ([`PassStep`]) and a copy ([`CopyStep`], a reshape no view reads).
//! `fusion` builds each from the blob's kernel, `Plan::build` prepares it
//! (a conv chooses its algorithm and what it stages through memory), and
//! the executor runs it: the same value from fusion to execution, asked
//! through [`StepKind`] for everything a plan needs of it (what it reads
//! and stages, its scratch, its description for logs, inspect and the
//! profiler, its work, and its run).
//!
//! An anchor op (the op a fused kernel is built around) is described, in
//! its step's file, by a type implementing [`AnchorOp`] and
//! [`DecodeAnchor`]: its schema table, operands, static checks, shape
//! inference and the step it builds. [`ANCHORS`] registers them; graph
//! decoding, validation, shape inference and fusion go through it and the
//! trait. Adding an anchor op is its file here (the op and its step) and
//! one line in the `anchors!` list below, which declares the file's module
//! and enters the op in [`ANCHORS`].
//!
//! [`Call`] is what a step sees of one call: the values' shapes and data.

mod anchor;
mod call;
mod copy;
mod kind;
mod pass;

pub use anchor::{AnchorKind, AnchorOp, Decode, DecodeAnchor, Fused, IndexFn, Operands};
pub use call::Call;
pub use copy::CopyStep;
pub use kind::{Epilogue, Prepare, Source, StepKind};
pub use pass::PassStep;

/// Declares each anchor op's module (`file::Op`: the file of its step, the
/// type implementing [`DecodeAnchor`]) and enters the op in [`ANCHORS`],
/// so that the list below is the one place an anchor op is registered.
macro_rules! anchors {
    ($($module:ident::$op:ident),+ $(,)?) => {
        $(mod $module;)+

        /// The anchor ops, one entry each: the schema table each decodes.
        pub static ANCHORS: &[AnchorKind] = &[$(AnchorKind::of::<$module::$op>()),+];
    };
}

anchors! {
    conv::Conv1dOp,
    scan::ScanOp,
}

/// The registry's entry for schema table `op`, if it is an anchor's.
pub fn anchor_kind(op: rustconv_schema::Op) -> Option<&'static AnchorKind> {
    ANCHORS.iter().find(|k| k.schema == op)
}

#[cfg(test)]
mod tests {
    use rustconv_schema as fb;

    /// Each entry decodes its own schema table: none is NONE or unknown to
    /// the schema, and no two claim one table (the second would never be
    /// reached). The list is `anchors!`'s, whatever it holds.
    #[test]
    fn anchor_registry_entries_claim_distinct_schema_tables() {
        let tags: Vec<fb::Op> = super::ANCHORS.iter().map(|k| k.schema).collect();
        for (i, tag) in tags.iter().enumerate() {
            assert!(*tag != fb::Op::NONE && fb::Op::ENUM_VALUES.contains(tag));
            assert!(!tags[..i].contains(tag), "{tag:?} registered twice");
        }
        assert!(!tags.is_empty(), "no anchor op registered");
    }
}
