//! What every anchor op is asked ([`AnchorOp`]): an op a fused kernel is
//! built around (a conv, a scan), from its schema table to the step that
//! runs it. The generic code (graph decoding, validation, shape inference,
//! fusion) goes through this trait and the registry in `step/mod.rs`
//! (`ANCHORS`), never through a match on the anchor's kind; each anchor op
//! is one type, in the file of its step.

use std::sync::Arc;

use rustconv_schema as fb;

use super::kind::{Epilogue, Source, StepKind};
use crate::error::GraphError;
use crate::shape::Shape;
use crate::value::ValueDesc;

/// An anchor op's description: its operands as value indices and its
/// parameters, decoded from its schema table.
pub trait AnchorOp: std::fmt::Debug + Send + Sync {
    /// Its name in plans and logs (PyTorch's spelling where it has one).
    fn kind(&self) -> &'static str;

    /// The values it reads, in its schema's order.
    fn inputs(&self) -> Vec<usize>;

    /// The value it writes.
    fn output(&self) -> usize;

    /// Checks what does not depend on runtime shapes (ranks, static
    /// dimensions, how the operands' declared shapes fit), after the
    /// generic dtype check. Errors are reasons, worded for the node.
    fn check_static(&self, values: &[ValueDesc]) -> Result<(), String>;

    /// Its output shape given its operands' shapes, checking that they fit
    /// together. Called at init at the upper bounds and on every call: it
    /// allocates nothing where the shapes fit.
    fn infer_shape(&self, shape_of: &dyn Fn(usize) -> Shape) -> Result<Shape, String>;

    /// Its step, for the kernel `fused` describes (errors are reasons,
    /// worded for the kernel).
    fn build_step(&self, fused: Fused) -> Result<Box<dyn StepKind>, String>;
}

/// An anchor op decoded from its schema table.
pub trait DecodeAnchor: AnchorOp + Sized + 'static {
    /// Its table in the schema's `Op` union.
    const SCHEMA: fb::Op;

    fn decode(d: &Decode) -> Result<Self, GraphError>;
}

/// One entry of the anchor registry: a schema table and how it decodes.
pub struct AnchorKind {
    pub schema: fb::Op,
    pub decode: fn(&Decode) -> Result<Arc<dyn AnchorOp>, GraphError>,
}

impl AnchorKind {
    /// The entry of anchor op `T`.
    pub const fn of<T: DecodeAnchor>() -> Self {
        AnchorKind {
            schema: T::SCHEMA,
            decode: decode_as::<T>,
        }
    }
}

fn decode_as<T: DecodeAnchor>(d: &Decode) -> Result<Arc<dyn AnchorOp>, GraphError> {
    Ok(Arc::new(T::decode(d)?))
}

/// A value index as the blob stores it, checked against the graph's
/// values; its first argument names the field for the error.
pub type IndexFn<'a> = dyn Fn(&dyn Fn() -> String, i64) -> Result<usize, GraphError> + 'a;

/// What decoding an anchor's table may consult: the node, and the check of
/// its value indices.
pub struct Decode<'a> {
    pub node: &'a fb::Node<'a>,
    pub id: u32,
    pub name: &'a str,
    pub index: &'a IndexFn<'a>,
}

impl Decode<'_> {
    /// The node's table `table` (`node.op_as_*()`), or the error that it is
    /// missing.
    pub fn table<T>(&self, t: Option<T>, table: &str) -> Result<T, GraphError> {
        t.ok_or_else(|| GraphError::BadNode {
            id: self.id,
            name: self.name.to_owned(),
            reason: format!("missing {table} table"),
        })
    }

    /// Operand `field`: value index `i`, checked.
    pub fn value(&self, field: &'static str, i: impl Into<i64>) -> Result<usize, GraphError> {
        let (id, name) = (self.id, self.name);
        (self.index)(&|| format!("node {id} ('{name}') {field}"), i.into())
    }

    /// Optional operand `field`: none where the blob stores -1.
    pub fn optional(&self, field: &'static str, i: i32) -> Result<Option<usize>, GraphError> {
        match i {
            -1 => Ok(None),
            i => self.value(field, i).map(Some),
        }
    }
}

/// What fusion tells an anchor about its kernel when it builds its step.
pub struct Fused<'a> {
    /// The anchor's node.
    pub id: u32,
    pub name: &'a str,
    pub operands: &'a dyn Operands,
    /// What the anchor's output goes through before it is stored.
    pub epilogue: Option<Epilogue>,
    /// The value the step stores: the anchor's output, or the epilogue's.
    pub result: usize,
}

/// How the kernel provides the anchor's operands.
pub trait Operands {
    /// Operand `v`: stored where it comes from outside the kernel, else
    /// computed by a prologue program.
    fn source(&self, v: usize) -> Result<Source, String>;

    /// Two computed operands: one program with both as roots where they
    /// share a computed subexpression (the second then [`Source::Paired`]),
    /// else one each.
    fn paired(&self, a: usize, b: usize) -> Result<(Source, Source), String>;

    /// Whether `v` comes stored from outside the kernel (a constant, an
    /// argument, another kernel's result), not computed inside it.
    fn stored_outside(&self, v: usize) -> bool;

    /// Value `v`'s name, for errors.
    fn name(&self, v: usize) -> &str;
}
