//! The execution plan built once at `init`: where every value lives, which
//! kernel runs each node, and how big the arena is. `execute` only follows it.

use crate::error::{DelegateError, GraphError};
use crate::graph::{GraphDesc, NodeDesc, OpDesc, Role, ValueDesc};
use crate::memory::{self, Lifetime};
use crate::ops;
use crate::shape::Shape;

/// Where a value's bytes are during `execute`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    /// The delegate call's argument at this position (inputs, then outputs).
    Arg(usize),
    /// Byte offset into the constant segment.
    Constant(usize),
    /// Byte offset into the arena.
    Arena(usize),
}

/// The kernel chosen for a node. One per op for now; faster alternatives are
/// added as variants chosen here, at plan time, never per call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Conv1dDirect,
    LinearScanSequential,
}

#[derive(Clone, Debug)]
pub struct Step {
    pub node: NodeDesc,
    pub kernel: Kernel,
}

#[derive(Debug)]
pub struct Plan {
    pub values: Vec<ValueDesc>,
    pub locations: Vec<Location>,
    pub inputs: Vec<usize>,
    pub outputs: Vec<usize>,
    pub steps: Vec<Step>,
    pub arena_bytes: usize,
}

impl Plan {
    pub fn build(graph: GraphDesc) -> Result<Self, DelegateError> {
        let GraphDesc {
            values,
            inputs,
            outputs,
            nodes,
        } = graph;
        check_shapes(&values, &nodes)?;

        // Lifetimes of intermediates, in steps.
        let mut first = vec![usize::MAX; values.len()];
        let mut last = vec![0; values.len()];
        for (step, node) in nodes.iter().enumerate() {
            first[node.op.output()] = step;
            last[node.op.output()] = step;
            for v in node.op.inputs() {
                last[v] = last[v].max(step);
            }
        }
        let intermediates: Vec<usize> = (0..values.len())
            .filter(|&v| values[v].role == Role::Intermediate && first[v] != usize::MAX)
            .collect();
        let lifetimes: Vec<Lifetime> = intermediates
            .iter()
            .map(|&v| Lifetime {
                bytes: values[v].max_numel() * values[v].dtype.size(),
                first: first[v],
                last: last[v],
            })
            .collect();
        let (offsets, arena_bytes) = memory::place(&lifetimes);

        let mut locations: Vec<Location> = values
            .iter()
            .map(|v| match v.role {
                Role::Input(i) => Location::Arg(i),
                Role::Output(i) => Location::Arg(inputs.len() + i),
                Role::Constant { offset, .. } => Location::Constant(offset),
                // Unused intermediates (never produced) get an empty slot.
                Role::Intermediate => Location::Arena(0),
            })
            .collect();
        for (&v, &offset) in intermediates.iter().zip(&offsets) {
            locations[v] = Location::Arena(offset);
        }

        let steps = nodes
            .into_iter()
            .map(|node| {
                let kernel = match node.op {
                    OpDesc::Conv1d { .. } => Kernel::Conv1dDirect,
                    OpDesc::LinearScan { .. } => Kernel::LinearScanSequential,
                };
                Step { node, kernel }
            })
            .collect();
        Ok(Plan {
            values,
            locations,
            inputs,
            outputs,
            steps,
            arena_bytes,
        })
    }
}

/// Checks every node at the shapes' upper bounds: operands fit together and
/// each result fits the shape (or bound) the blob declares for it.
fn check_shapes(values: &[ValueDesc], nodes: &[NodeDesc]) -> Result<(), GraphError> {
    let bounds: Vec<Shape> = values
        .iter()
        .map(|v| Shape::new(&v.dims.iter().map(|d| d.size).collect::<Vec<_>>()))
        .collect();
    for node in nodes {
        let bad = |reason: String| GraphError::BadNode {
            id: node.id,
            name: node.name.clone(),
            reason,
        };
        ops::check_static(&node.op, values).map_err(bad)?;
        let inferred = ops::infer_shape(&node.op, |v| bounds[v]).map_err(bad)?;
        let out = &values[node.op.output()];
        let fits = inferred.rank() == out.dims.len()
            && inferred.dims().iter().zip(&out.dims).all(|(&got, d)| {
                if d.dynamic {
                    got <= d.size
                } else {
                    got == d.size
                }
            });
        if !fits {
            return Err(bad(format!(
                "computes shape {:?} at the upper bounds, but output '{}' is declared {:?}",
                inferred.dims(),
                out.name,
                out.dims
            )));
        }
    }
    Ok(())
}
