//! Decoding of the flatbuffer graph into owned, structurally checked Rust
//! types: every index in range, every value produced once and before use,
//! inputs/outputs/constants consistent. Op semantics (ranks, shapes, kernel
//! parameters) are checked when the plan is built (`ops`).

use std::sync::Arc;

use rustconv_schema as fb;

use crate::blob::{BlobLayout, CONSTANT_ALIGNMENT};
use crate::error::{BlobError, DelegateError, GraphError};
use crate::step::{self, AnchorOp, Decode, IndexFn};
pub use crate::value::{DType, DimSpec, Role, ValueDesc};
pub use rustconv_kernels::fused::{BinaryOp, ReduceOp, UnaryOp};

/// Ranks above this are refused; every op here uses rank 1 to 4.
pub use rustconv_kernels::MAX_RANK;
/// Dimensions above this are refused as corrupt (2^40 elements).
const MAX_DIM: i64 = 1 << 40;

/// An elementwise operand: a value, or a scalar the exporter folded in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Operand {
    Value(usize),
    Scalar(f32),
}

impl Operand {
    pub fn value(self) -> Option<usize> {
        match self {
            Operand::Value(v) => Some(v),
            Operand::Scalar(_) => None,
        }
    }
}

/// One node's operation, with its operands as value indices (see
/// schema/rustconv.fbs for each op's semantics).
#[derive(Clone, Debug)]
pub enum OpDesc {
    /// A conv or scan: the op a fused kernel is built around, described by
    /// its own type (`step::ANCHORS` lists them).
    Anchor(Arc<dyn AnchorOp>),
    Unary {
        op: UnaryOp,
        input: usize,
        output: usize,
    },
    Binary {
        op: BinaryOp,
        a: Operand,
        b: Operand,
        output: usize,
    },
    Where {
        cond: usize,
        a: Operand,
        b: Operand,
        output: usize,
    },
    /// Bounds are infinite where the blob has none.
    Clamp {
        input: usize,
        output: usize,
        min: f32,
        max: f32,
    },
    /// `like` is read for its shape only.
    Full {
        like: usize,
        output: usize,
        value: f32,
    },
    Permute {
        input: usize,
        output: usize,
        perm: Vec<usize>,
    },
    Slice {
        input: usize,
        output: usize,
        dim: usize,
        start: i64,
        end: i64,
        step: usize,
    },
    /// A squeeze / unsqueeze: output dimension `d` is input dimension
    /// `map[d]`, or an inserted size-1 one. Derived from the declared dims
    /// when the graph is decoded.
    Reshape {
        input: usize,
        output: usize,
        map: [Option<u8>; MAX_RANK],
    },
    /// A `Reshape` that splits or merges dimensions (no `map` pairs them):
    /// no view reads it, so it copies its stored input, in row-major order,
    /// into its stored output, a kernel of its own. `dims` are the output's
    /// static sizes; the one dynamic dimension it may have (None) takes what
    /// the input's size leaves.
    Regroup {
        input: usize,
        output: usize,
        dims: [Option<usize>; MAX_RANK],
    },
    Cat {
        inputs: Vec<usize>,
        output: usize,
        dim: usize,
    },
    /// `op` over the dimensions `dims` marks, kept with size 1.
    Reduce {
        op: ReduceOp,
        input: usize,
        output: usize,
        dims: [bool; MAX_RANK],
    },
}

impl OpDesc {
    /// The values the op reads (`Full`'s `like` only for its shape).
    pub fn inputs(&self) -> Vec<usize> {
        match *self {
            OpDesc::Anchor(ref op) => op.inputs(),
            OpDesc::Unary { input, .. }
            | OpDesc::Clamp { input, .. }
            | OpDesc::Permute { input, .. }
            | OpDesc::Slice { input, .. }
            | OpDesc::Reshape { input, .. }
            | OpDesc::Regroup { input, .. }
            | OpDesc::Reduce { input, .. } => vec![input],
            OpDesc::Binary { a, b, .. } => [a.value(), b.value()].into_iter().flatten().collect(),
            OpDesc::Where { cond, a, b, .. } => [Some(cond), a.value(), b.value()]
                .into_iter()
                .flatten()
                .collect(),
            OpDesc::Full { like, .. } => vec![like],
            OpDesc::Cat { ref inputs, .. } => inputs.clone(),
        }
    }

    pub fn output(&self) -> usize {
        match *self {
            OpDesc::Anchor(ref op) => op.output(),
            OpDesc::Unary { output, .. }
            | OpDesc::Binary { output, .. }
            | OpDesc::Where { output, .. }
            | OpDesc::Clamp { output, .. }
            | OpDesc::Full { output, .. }
            | OpDesc::Permute { output, .. }
            | OpDesc::Slice { output, .. }
            | OpDesc::Reshape { output, .. }
            | OpDesc::Regroup { output, .. }
            | OpDesc::Cat { output, .. }
            | OpDesc::Reduce { output, .. } => output,
        }
    }

    /// The op's name in plans and logs (PyTorch's spelling where it has one).
    pub fn kind(&self) -> &'static str {
        match self {
            OpDesc::Anchor(op) => op.kind(),
            OpDesc::Unary { op, .. } => op.name(),
            OpDesc::Binary { op, .. } => op.name(),
            OpDesc::Where { .. } => "where",
            OpDesc::Clamp { .. } => "clamp",
            OpDesc::Full { .. } => "full_like",
            OpDesc::Permute { .. } => "permute",
            OpDesc::Slice { .. } => "slice",
            OpDesc::Reshape { .. } | OpDesc::Regroup { .. } => "reshape",
            OpDesc::Cat { .. } => "cat",
            OpDesc::Reduce { op, .. } => op.name(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct NodeDesc {
    pub id: u32,
    pub name: String,
    pub debug_handles: Vec<u32>,
    pub op: OpDesc,
    /// The fused kernel the exporter put the node in (`Node.kernel`); None
    /// in blobs written before fusion.
    pub kernel: Option<u32>,
}

#[derive(Clone, Debug)]
pub struct GraphDesc {
    pub values: Vec<ValueDesc>,
    pub inputs: Vec<usize>,
    pub outputs: Vec<usize>,
    pub nodes: Vec<NodeDesc>,
}

impl GraphDesc {
    /// Verifies and decodes the graph of `blob` laid out as `layout`.
    pub fn decode(blob: &[u8], layout: &BlobLayout) -> Result<Self, DelegateError> {
        let bytes = &blob[layout.graph.clone()];
        // flatbuffers' identifier check asserts that the root offset and the
        // identifier are there rather than failing.
        if bytes.len() < flatbuffers::SIZE_UOFFSET + flatbuffers::FILE_IDENTIFIER_LENGTH {
            return Err(BlobError::GraphTooShort(bytes.len()).into());
        }
        if !fb::graph_buffer_has_identifier(bytes) {
            return Err(BlobError::Identifier.into());
        }
        let graph = fb::root_as_graph(bytes).map_err(BlobError::from)?;
        let values = graph
            .values()
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, v)| decode_value(i, &v, layout.constants.len()))
            .collect::<Result<Vec<_>, _>>()?;
        let index = |what: &dyn Fn() -> String, i: i64| -> Result<usize, GraphError> {
            if i >= 0 && (i as usize) < values.len() {
                Ok(i as usize)
            } else {
                Err(GraphError::BadValueIndex {
                    what: what(),
                    index: i,
                    count: values.len(),
                })
            }
        };
        let inputs = graph
            .inputs()
            .into_iter()
            .flatten()
            .map(|i| index(&|| "graph input".into(), i64::from(i)))
            .collect::<Result<Vec<_>, _>>()?;
        let outputs = graph
            .outputs()
            .into_iter()
            .flatten()
            .map(|i| index(&|| "graph output".into(), i64::from(i)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut nodes = Vec::new();
        for node in graph.nodes().into_iter().flatten() {
            let id = node.id();
            let name = node.name().unwrap_or("").to_owned();
            let op = decode_op(&node, id, &name, &values, &index)?;
            let kernel = match node.kernel() {
                -1 => None,
                k if k >= 0 => Some(k as u32),
                k => return Err(bad_node(id, &name, &format!("kernel index {k}")).into()),
            };
            nodes.push(NodeDesc {
                id,
                debug_handles: node.debug_handles().into_iter().flatten().collect(),
                name,
                op,
                kernel,
            });
        }
        let graph = GraphDesc {
            values,
            inputs,
            outputs,
            nodes,
        };
        graph.check_structure()?;
        Ok(graph)
    }

    fn check_structure(&self) -> Result<(), GraphError> {
        check_io(&self.values, &self.inputs, "inputs", |r| match r {
            Role::Input(i) => Some(*i),
            _ => None,
        })?;
        check_io(&self.values, &self.outputs, "outputs", |r| match r {
            Role::Output(i) => Some(*i),
            _ => None,
        })?;
        if self.nodes.is_empty() {
            return Err(GraphError::BadIo {
                what: "nodes",
                reason: "the graph has no nodes".into(),
            });
        }
        let mut produced = vec![false; self.values.len()];
        for node in &self.nodes {
            for input in node.op.inputs() {
                let v = &self.values[input];
                let ready = match v.role {
                    Role::Input(_) | Role::Constant { .. } | Role::State { .. } => true,
                    Role::Output(_) | Role::Intermediate => produced[input],
                };
                if !ready {
                    return Err(bad_node(
                        node.id,
                        &node.name,
                        &format!("reads value {input} ('{}') before it is produced", v.name),
                    ));
                }
            }
            let out = node.op.output();
            let v = &self.values[out];
            if !matches!(v.role, Role::Output(_) | Role::Intermediate) {
                return Err(bad_node(
                    node.id,
                    &node.name,
                    &format!("writes value {out} ('{}'), an input or constant", v.name),
                ));
            }
            if std::mem::replace(&mut produced[out], true) {
                return Err(bad_node(
                    node.id,
                    &node.name,
                    &format!("writes value {out} ('{}'), already written", v.name),
                ));
            }
        }
        for (i, v) in self.values.iter().enumerate() {
            if let Role::State { update, .. } = v.role {
                let bad = |reason: String| GraphError::BadValue {
                    index: i,
                    name: v.name.clone(),
                    reason,
                };
                let Some(u) = self.values.get(update) else {
                    return Err(bad(format!("its update value {update} does not exist")));
                };
                if !matches!(u.role, Role::Intermediate) || !produced[update] {
                    return Err(bad(format!(
                        "its update value {update} ('{}') is not computed by the graph",
                        u.name
                    )));
                }
                if u.dims != v.dims || u.dtype != v.dtype {
                    return Err(bad(format!(
                        "its update value {update} ('{}') differs in shape or dtype",
                        u.name
                    )));
                }
            }
            if matches!(v.role, Role::Output(_)) && !produced[i] {
                return Err(GraphError::BadValue {
                    index: i,
                    name: v.name.clone(),
                    reason: "is an output no node produces".into(),
                });
            }
        }
        Ok(())
    }
}

/// Decodes one node's op table, checking every value index.
fn decode_op(
    node: &fb::Node,
    id: u32,
    name: &str,
    values: &[ValueDesc],
    index: &IndexFn,
) -> Result<OpDesc, DelegateError> {
    if let Some(anchor) = step::anchor_kind(node.op_type()) {
        let d = Decode {
            node,
            id,
            name,
            index,
        };
        return Ok(OpDesc::Anchor((anchor.decode)(&d)?));
    }
    let at = |field: &'static str| move || format!("node {id} ('{name}') {field}");
    let missing = |table: &str| bad_node(id, name, &format!("missing {table} table"));
    let operand = |field: &'static str, i: i32, scalar: f32| -> Result<Operand, GraphError> {
        Ok(match i {
            -1 => Operand::Scalar(scalar),
            i => Operand::Value(index(&at(field), i.into())?),
        })
    };
    Ok(match node.op_type() {
        fb::Op::Unary => {
            let u = node.op_as_unary().ok_or_else(|| missing("Unary"))?;
            OpDesc::Unary {
                op: unary_op(u.op()).ok_or_else(|| {
                    bad_node(
                        id,
                        name,
                        &format!("unknown unary op {}: update the runtime", u.op().0),
                    )
                })?,
                input: index(&at("input"), u.input().into())?,
                output: index(&at("output"), u.output().into())?,
            }
        }
        fb::Op::Binary => {
            let b = node.op_as_binary().ok_or_else(|| missing("Binary"))?;
            OpDesc::Binary {
                op: binary_op(b.op()).ok_or_else(|| {
                    bad_node(
                        id,
                        name,
                        &format!("unknown binary op {}: update the runtime", b.op().0),
                    )
                })?,
                a: operand("a", b.a(), b.a_scalar())?,
                b: operand("b", b.b(), b.b_scalar())?,
                output: index(&at("output"), b.output().into())?,
            }
        }
        fb::Op::Where => {
            let w = node.op_as_where().ok_or_else(|| missing("Where"))?;
            OpDesc::Where {
                cond: index(&at("cond"), w.cond().into())?,
                a: operand("a", w.a(), w.a_scalar())?,
                b: operand("b", w.b(), w.b_scalar())?,
                output: index(&at("output"), w.output().into())?,
            }
        }
        fb::Op::Clamp => {
            let c = node.op_as_clamp().ok_or_else(|| missing("Clamp"))?;
            OpDesc::Clamp {
                input: index(&at("input"), c.input().into())?,
                output: index(&at("output"), c.output().into())?,
                min: if c.has_min() {
                    c.min()
                } else {
                    f32::NEG_INFINITY
                },
                max: if c.has_max() { c.max() } else { f32::INFINITY },
            }
        }
        fb::Op::Full => {
            let f = node.op_as_full().ok_or_else(|| missing("Full"))?;
            OpDesc::Full {
                like: index(&at("like"), f.like().into())?,
                output: index(&at("output"), f.output().into())?,
                value: f.value(),
            }
        }
        fb::Op::Permute => {
            let p = node.op_as_permute().ok_or_else(|| missing("Permute"))?;
            OpDesc::Permute {
                input: index(&at("input"), p.input().into())?,
                output: index(&at("output"), p.output().into())?,
                perm: p.perm().into_iter().flatten().map(usize::from).collect(),
            }
        }
        fb::Op::Slice => {
            let s = node.op_as_slice().ok_or_else(|| missing("Slice"))?;
            if s.step() < 1 {
                return Err(bad_node(
                    id,
                    name,
                    &format!("slice step {} is not positive", s.step()),
                )
                .into());
            }
            OpDesc::Slice {
                input: index(&at("input"), s.input().into())?,
                output: index(&at("output"), s.output().into())?,
                dim: s.dim().into(),
                start: s.start(),
                end: s.end(),
                step: s.step() as usize,
            }
        }
        fb::Op::Reshape => {
            let r = node.op_as_reshape().ok_or_else(|| missing("Reshape"))?;
            let input = index(&at("input"), r.input().into())?;
            let output = index(&at("output"), r.output().into())?;
            let (from, to) = (&values[input].dims, &values[output].dims);
            match reshape_map(from, to) {
                Some(map) => OpDesc::Reshape { input, output, map },
                None => OpDesc::Regroup {
                    input,
                    output,
                    dims: regroup_dims(from, to).map_err(|reason| bad_node(id, name, &reason))?,
                },
            }
        }
        fb::Op::Cat => {
            let c = node.op_as_cat().ok_or_else(|| missing("Cat"))?;
            let inputs = c
                .inputs()
                .into_iter()
                .flatten()
                .map(|i| index(&at("inputs"), i.into()))
                .collect::<Result<Vec<_>, _>>()?;
            if inputs.is_empty() {
                return Err(bad_node(id, name, "cat of no tensors").into());
            }
            OpDesc::Cat {
                inputs,
                output: index(&at("output"), c.output().into())?,
                dim: c.dim().into(),
            }
        }
        fb::Op::Reduce => {
            let r = node.op_as_reduce().ok_or_else(|| missing("Reduce"))?;
            let op = match r.op() {
                fb::ReduceOp::Sum => ReduceOp::Sum,
                fb::ReduceOp::Mean => ReduceOp::Mean,
                fb::ReduceOp::Var => ReduceOp::Var,
                other => {
                    return Err(bad_node(
                        id,
                        name,
                        &format!("unknown reduce op {}: update the runtime", other.0),
                    )
                    .into())
                }
            };
            let mut dims = [false; MAX_RANK];
            for d in r.dims().into_iter().flatten() {
                let d = usize::from(d);
                if d >= MAX_RANK || std::mem::replace(&mut dims[d], true) {
                    return Err(bad_node(
                        id,
                        name,
                        &format!("reduce dimension {d} is out of range or listed twice"),
                    )
                    .into());
                }
            }
            OpDesc::Reduce {
                op,
                input: index(&at("input"), r.input().into())?,
                output: index(&at("output"), r.output().into())?,
                dims,
            }
        }
        fb::Op::NONE => return Err(bad_node(id, name, "has no op").into()),
        other => {
            return Err(GraphError::UnknownOp {
                id,
                name: name.to_owned(),
                kind: other.0,
            }
            .into())
        }
    })
}

/// The kernels' op for a schema enum value (by name: the kernels' op
/// table names its variants as the schema does); `None` for a value this
/// runtime does not know (a newer exporter's).
fn unary_op(op: fb::UnaryOp) -> Option<UnaryOp> {
    UnaryOp::from_schema_name(op.variant_name()?)
}

/// As [`unary_op`].
fn binary_op(op: fb::BinaryOp) -> Option<BinaryOp> {
    BinaryOp::from_schema_name(op.variant_name()?)
}

/// The dimension map of a reshape that only removes or inserts size-1
/// dimensions (output dimension `d` reads input dimension `map[d]`, None a
/// size-1 dimension), which the runtime reads as a view; None when it splits
/// or merges dimensions ([`regroup_dims`]).
pub fn reshape_map(input: &[DimSpec], output: &[DimSpec]) -> Option<[Option<u8>; MAX_RANK]> {
    let kept = |dims: &[DimSpec]| -> Vec<usize> {
        (0..dims.len())
            .filter(|&d| dims[d].dynamic || dims[d].size != 1)
            .collect()
    };
    let (ki, ko) = (kept(input), kept(output));
    let pairs = ki.len() == ko.len() && ki.iter().zip(&ko).all(|(&i, &o)| input[i] == output[o]);
    if !pairs {
        return None;
    }
    let mut map = [None; MAX_RANK];
    for (&i, &o) in ki.iter().zip(&ko) {
        map[o] = Some(i as u8);
    }
    Some(map)
}

/// The output sizes of a reshape that splits or merges dimensions (None for
/// its dynamic one), if every call can infer them: at most one dynamic
/// output dimension, and the same number of elements at the upper bounds
/// (a dynamic size scaled by a constant on both sides, such as a time axis
/// `T` split into `[T / s, s]`).
pub fn regroup_dims(
    input: &[DimSpec],
    output: &[DimSpec],
) -> Result<[Option<usize>; MAX_RANK], String> {
    let dynamic = output.iter().filter(|d| d.dynamic).count();
    if dynamic > 1 {
        return Err(format!(
            "reshape from {input:?} to {output:?} regroups dimensions into {dynamic} dynamic \
             ones; the runtime infers at most one"
        ));
    }
    let numel = |dims: &[DimSpec]| dims.iter().try_fold(1usize, |n, d| n.checked_mul(d.size));
    if numel(input).is_none() || numel(input) != numel(output) {
        return Err(format!(
            "reshape from {input:?} to {output:?} changes the number of elements"
        ));
    }
    let mut dims = [None; MAX_RANK];
    for (d, spec) in dims.iter_mut().zip(output) {
        *d = (!spec.dynamic).then_some(spec.size);
    }
    Ok(dims)
}

fn bad_node(id: u32, name: &str, reason: &str) -> GraphError {
    GraphError::BadNode {
        id,
        name: name.to_owned(),
        reason: reason.to_owned(),
    }
}

fn decode_value(index: usize, v: &fb::Value, segment_len: usize) -> Result<ValueDesc, GraphError> {
    let name = v.name().unwrap_or("").to_owned();
    let bad = |reason: String| GraphError::BadValue {
        index,
        name: name.clone(),
        reason,
    };
    let dtype = match v.dtype() {
        fb::DType::Float32 => DType::F32,
        fb::DType::Float16 => DType::F16,
        other => return Err(bad(format!("unknown dtype code {}", other.0))),
    };
    let dims_fb = v.dims().ok_or_else(|| bad("has no dims".into()))?;
    if dims_fb.is_empty() || dims_fb.len() > MAX_RANK {
        return Err(bad(format!(
            "rank {} outside 1..={MAX_RANK}",
            dims_fb.len()
        )));
    }
    let mut dims = Vec::with_capacity(dims_fb.len());
    let mut numel: usize = 1;
    for d in dims_fb.iter() {
        if !(0..=MAX_DIM).contains(&d.size_()) {
            return Err(bad(format!("dimension {} out of range", d.size_())));
        }
        let size = d.size_() as usize;
        numel = numel
            .checked_mul(size)
            .filter(|n| (*n as u64) <= MAX_DIM as u64)
            .ok_or_else(|| bad("element count overflows".into()))?;
        dims.push(DimSpec {
            size,
            dynamic: d.dynamic(),
        });
    }
    let role = match v.kind() {
        fb::ValueKind::Input => Role::Input(v.io_index() as usize),
        fb::ValueKind::Output => Role::Output(v.io_index() as usize),
        fb::ValueKind::Intermediate => Role::Intermediate,
        kind @ (fb::ValueKind::Constant | fb::ValueKind::State) => {
            let (offset, len) = (v.constant_offset(), v.constant_size());
            if offset % CONSTANT_ALIGNMENT as u64 != 0 {
                return Err(bad(format!(
                    "constant offset {offset} is not 64-byte aligned"
                )));
            }
            if offset
                .checked_add(len)
                .is_none_or(|end| end > segment_len as u64)
            {
                return Err(bad(format!(
                    "constant bytes {offset}..+{len} lie outside the {segment_len}-byte segment"
                )));
            }
            if dims.iter().any(|d| d.dynamic) {
                return Err(bad("a constant cannot have a dynamic dimension".into()));
            }
            let expected = numel * dtype.size();
            if len as usize != expected {
                return Err(bad(format!(
                    "constant has {len} bytes, its shape and dtype need {expected}"
                )));
            }
            let (offset, len) = (offset as usize, len as usize);
            if kind == fb::ValueKind::Constant {
                Role::Constant { offset, len }
            } else {
                let update = v.state_update();
                if update < 0 {
                    return Err(bad("a state names no update value".into()));
                }
                // Checked against the other values in check_structure.
                Role::State {
                    offset,
                    len,
                    update: update as usize,
                }
            }
        }
        other => return Err(bad(format!("unknown value kind {}", other.0))),
    };
    Ok(ValueDesc {
        name,
        dtype,
        dims,
        role,
    })
}

/// Checks that `list` names, in order, the values whose role carries io
/// index 0, 1, 2, ... and that no other value claims that role.
fn check_io(
    values: &[ValueDesc],
    list: &[usize],
    what: &'static str,
    io_index: impl Fn(&Role) -> Option<usize>,
) -> Result<(), GraphError> {
    for (position, &v) in list.iter().enumerate() {
        if io_index(&values[v].role) != Some(position) {
            return Err(GraphError::BadIo {
                what,
                reason: format!(
                    "entry {position} is value {v} ('{}') with role {:?}",
                    values[v].name, values[v].role
                ),
            });
        }
    }
    let claimed = values
        .iter()
        .filter(|v| io_index(&v.role).is_some())
        .count();
    if claimed != list.len() {
        return Err(GraphError::BadIo {
            what,
            reason: format!(
                "{claimed} values claim the role but the list has {}",
                list.len()
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schema's element-wise ops and the kernels' are the same set: each
    /// schema value maps to the kernels' op of that name, and back.
    #[test]
    fn every_schema_elementwise_op_maps_to_a_kernel_op() {
        for &op in fb::UnaryOp::ENUM_VALUES {
            let ours = unary_op(op).unwrap_or_else(|| panic!("{op:?} has no kernel op"));
            assert_eq!(Some(format!("{ours:?}").as_str()), op.variant_name());
        }
        assert_eq!(fb::UnaryOp::ENUM_VALUES.len(), UnaryOp::ALL.len());
        for &op in fb::BinaryOp::ENUM_VALUES {
            let ours = binary_op(op).unwrap_or_else(|| panic!("{op:?} has no kernel op"));
            assert_eq!(Some(format!("{ours:?}").as_str()), op.variant_name());
        }
        assert_eq!(fb::BinaryOp::ENUM_VALUES.len(), BinaryOp::ALL.len());
        // A value a newer exporter may write is refused, not misread.
        assert_eq!(unary_op(fb::UnaryOp(u8::MAX)), None);
    }

    fn dims(sizes: &[(usize, bool)]) -> Vec<DimSpec> {
        sizes
            .iter()
            .map(|&(size, dynamic)| DimSpec { size, dynamic })
            .collect()
    }

    /// A reshape is a view where its non-unit dimensions pair up, and a
    /// regroup (a copy) where it splits or merges them: a transposed conv's
    /// phases `[B, Co*s, Q] -> [B, Co, s, Q]` and `[B, Co, Q, s] -> [B, Co, Q*s]`
    /// with `Q` dynamic, whose one dynamic output size is inferred per call.
    #[test]
    fn reshapes_that_split_or_merge_dimensions_are_regroups() {
        let squeeze = reshape_map(&dims(&[(1, false), (6, false)]), &dims(&[(6, false)]));
        assert_eq!(squeeze.map(|m| m[0]), Some(Some(1)));
        let split = (
            dims(&[(2, false), (12, false), (9, true)]),
            dims(&[(2, false), (3, false), (4, false), (9, true)]),
        );
        assert!(reshape_map(&split.0, &split.1).is_none());
        assert_eq!(
            regroup_dims(&split.0, &split.1),
            Ok([Some(2), Some(3), Some(4), None])
        );
        let merge = (
            dims(&[(3, false), (9, true), (4, false)]),
            dims(&[(3, false), (36, true)]),
        );
        assert!(reshape_map(&merge.0, &merge.1).is_none());
        assert_eq!(
            regroup_dims(&merge.0, &merge.1),
            Ok([Some(3), None, None, None])
        );
        // Two dynamic output sizes cannot both be inferred; nor can a
        // reshape that changes the number of elements run.
        let two = regroup_dims(&dims(&[(36, true)]), &dims(&[(9, true), (4, true)]));
        assert!(two.unwrap_err().contains("at most one"));
        let lossy = regroup_dims(&dims(&[(2, false), (6, false)]), &dims(&[(13, false)]));
        assert!(lossy.unwrap_err().contains("number of elements"));
        let huge = regroup_dims(&dims(&[(1 << 40, false); 4]), &dims(&[(1, false)]));
        assert!(huge.is_err());
    }

    /// A regroup's dynamic size is what the input leaves at this call's
    /// shape; an input that does not divide is refused, not truncated.
    #[test]
    fn a_regroup_infers_its_dynamic_size_per_call() {
        use crate::ops::infer_shape;
        use crate::shape::Shape;
        let op = OpDesc::Regroup {
            input: 0,
            output: 1,
            dims: [Some(3), None, None, None],
        };
        let shape = infer_shape(&op, 2, |_| Shape::new(&[3, 5, 4])).unwrap();
        assert_eq!(shape.dims(), &[3, 20]);
        let split = OpDesc::Regroup {
            input: 0,
            output: 1,
            dims: [Some(2), Some(4), None, None],
        };
        assert_eq!(
            infer_shape(&split, 3, |_| Shape::new(&[2, 12]))
                .unwrap()
                .dims(),
            &[2, 4, 3]
        );
        assert!(infer_shape(&split, 3, |_| Shape::new(&[2, 13])).is_err());
    }
}
