//! Decoding of the flatbuffer graph into owned, structurally checked Rust
//! types: every index in range, every value produced once and before use,
//! inputs/outputs/constants consistent. Op semantics (ranks, shapes, kernel
//! parameters) are checked when the plan is built (`ops`).

use rustconv_schema as fb;

use crate::blob::{BlobLayout, CONSTANT_ALIGNMENT};
use crate::error::{BlobError, DelegateError, GraphError};

/// Ranks above this are refused; every op here uses rank 2 or 3.
pub const MAX_RANK: usize = 4;
/// Dimensions above this are refused as corrupt (2^40 elements).
const MAX_DIM: i64 = 1 << 40;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
        }
    }
}

/// One dimension: a fixed size, or a dynamic one with its upper bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DimSpec {
    pub size: usize,
    pub dynamic: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    Input(usize),
    Output(usize),
    /// Byte range within the constant segment.
    Constant {
        offset: usize,
        len: usize,
    },
    Intermediate,
}

#[derive(Clone, Debug)]
pub struct ValueDesc {
    pub name: String,
    pub dtype: DType,
    pub dims: Vec<DimSpec>,
    pub role: Role,
}

impl ValueDesc {
    /// Element count at the upper bounds.
    pub fn max_numel(&self) -> usize {
        self.dims.iter().map(|d| d.size).product()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpDesc {
    Conv1d {
        input: usize,
        weight: usize,
        bias: Option<usize>,
        output: usize,
        stride: usize,
        pad_left: usize,
        pad_right: usize,
        dilation: usize,
        groups: usize,
    },
    LinearScan {
        x0: usize,
        a: usize,
        u: usize,
        output: usize,
    },
}

impl OpDesc {
    pub fn inputs(&self) -> Vec<usize> {
        match *self {
            OpDesc::Conv1d {
                input,
                weight,
                bias,
                ..
            } => [Some(input), Some(weight), bias]
                .into_iter()
                .flatten()
                .collect(),
            OpDesc::LinearScan { x0, a, u, .. } => vec![x0, a, u],
        }
    }

    pub fn output(&self) -> usize {
        match *self {
            OpDesc::Conv1d { output, .. } | OpDesc::LinearScan { output, .. } => output,
        }
    }
}

#[derive(Clone, Debug)]
pub struct NodeDesc {
    pub id: u32,
    pub name: String,
    pub debug_handles: Vec<u32>,
    pub op: OpDesc,
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
            let at = |field: &'static str| {
                let name = name.clone();
                move || format!("node {id} ('{name}') {field}")
            };
            let op = match node.op_type() {
                fb::Op::Conv1d => {
                    let c = node
                        .op_as_conv_1d()
                        .ok_or_else(|| bad_node(id, &name, "missing Conv1d table"))?;
                    OpDesc::Conv1d {
                        input: index(&at("input"), c.input().into())?,
                        weight: index(&at("weight"), c.weight().into())?,
                        bias: match c.bias() {
                            -1 => None,
                            b => Some(index(&at("bias"), b.into())?),
                        },
                        output: index(&at("output"), c.output().into())?,
                        stride: c.stride() as usize,
                        pad_left: c.pad_left() as usize,
                        pad_right: c.pad_right() as usize,
                        dilation: c.dilation() as usize,
                        groups: c.groups() as usize,
                    }
                }
                fb::Op::LinearScan => {
                    let s = node
                        .op_as_linear_scan()
                        .ok_or_else(|| bad_node(id, &name, "missing LinearScan table"))?;
                    OpDesc::LinearScan {
                        x0: index(&at("x0"), s.x0().into())?,
                        a: index(&at("a"), s.a().into())?,
                        u: index(&at("u"), s.u().into())?,
                        output: index(&at("output"), s.output().into())?,
                    }
                }
                fb::Op::NONE => return Err(bad_node(id, &name, "has no op").into()),
                other => {
                    return Err(GraphError::UnknownOp {
                        id,
                        name,
                        kind: other.0,
                    }
                    .into())
                }
            };
            nodes.push(NodeDesc {
                id,
                debug_handles: node.debug_handles().into_iter().flatten().collect(),
                name,
                op,
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
                    Role::Input(_) | Role::Constant { .. } => true,
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
        fb::ValueKind::Constant => {
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
            Role::Constant {
                offset: offset as usize,
                len: len as usize,
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
