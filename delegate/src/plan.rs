//! The execution plan built once at `init`: where every value lives, which
//! kernel runs each node, and how big the arena is. `execute` only follows it.

use rustconv_kernels::{self as kernels, Choice, PreparedConv1d};

use crate::error::{DelegateError, GraphError};
use crate::graph::{DType, GraphDesc, NodeDesc, OpDesc, Role, ValueDesc};
use crate::memory::{self, Lifetime};
use crate::ops;
use crate::options::CompileOptions;
use crate::shape::Shape;

/// Where kernels read and write a value, as f32, during `execute`.
///
/// Kernels compute in f32. A float16 input or output of the delegate call
/// gets an f32 shadow in the arena, converted from the argument before the
/// first step / to it after the producing step; a float16 intermediate lives
/// only as f32; a float16 constant is converted once at init.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    /// The delegate call's argument at this position (inputs, then outputs).
    Arg(usize),
    /// Byte offset into the constant segment.
    Constant(usize),
    /// Element offset into [`Plan::converted`].
    Converted(usize),
    /// Byte offset into the arena.
    Arena(usize),
    /// A constant no step reads during `execute` (its kernel transformed it
    /// at init); its bytes were not kept (see constants.rs).
    Released,
}

/// The kernel chosen for a node, at plan time, never per call.
pub enum Kernel {
    /// Prepared for the node's largest shape: algorithm chosen, weights
    /// transformed where the algorithm wants it.
    Conv1d(Box<PreparedConv1d>),
    LinearScan,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kernel::Conv1d(k) => write!(f, "Conv1d({})", k.algorithm().name()),
            Kernel::LinearScan => write!(f, "LinearScan"),
        }
    }
}

#[derive(Debug)]
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
    /// The most scratch any step needs per thread, in f32 elements.
    pub scratch_per_thread: usize,
    /// f32 copies of the float16 constants.
    pub converted: Vec<f32>,
    /// One line per decision worth logging (kernel choices and estimates).
    /// Returned rather than logged: planning may run on pool threads, and
    /// only the thread that called into the delegate may log.
    pub report: Vec<String>,
}

impl Plan {
    /// `constants` is the constant segment, 64-byte aligned; kernels prepare
    /// from the weights in it.
    pub fn build(
        graph: GraphDesc,
        constants: &[u8],
        options: &CompileOptions,
    ) -> Result<Self, DelegateError> {
        let GraphDesc {
            values,
            inputs,
            outputs,
            nodes,
        } = graph;
        check_shapes(&values, &nodes)?;

        // Lifetimes in steps. Inputs are bound (and float16 ones converted)
        // before step 0.
        let mut first = vec![usize::MAX; values.len()];
        let mut last = vec![0; values.len()];
        for &v in &inputs {
            first[v] = 0;
        }
        for (step, node) in nodes.iter().enumerate() {
            first[node.op.output()] = step;
            last[node.op.output()] = step;
            for v in node.op.inputs() {
                last[v] = last[v].max(step);
            }
        }
        // Everything kernels see as f32 that is not an f32 argument or a
        // constant lives in the arena: intermediates and float16 shadows.
        let in_arena = |v: &ValueDesc| match v.role {
            Role::Intermediate => true,
            Role::Input(_) | Role::Output(_) => v.dtype == DType::F16,
            Role::Constant { .. } => false,
        };
        let placed: Vec<usize> = (0..values.len())
            .filter(|&v| in_arena(&values[v]) && first[v] != usize::MAX)
            .collect();
        let lifetimes: Vec<Lifetime> = placed
            .iter()
            .map(|&v| Lifetime {
                bytes: values[v].max_numel() * std::mem::size_of::<f32>(),
                first: first[v],
                last: last[v],
            })
            .collect();
        let (offsets, arena_bytes) = memory::place(&lifetimes);

        let mut converted = Vec::new();
        let mut locations: Vec<Location> = values
            .iter()
            .map(|v| match v.role {
                Role::Input(i) => Location::Arg(i),
                Role::Output(i) => Location::Arg(inputs.len() + i),
                Role::Constant { offset, len } if v.dtype == DType::F16 => {
                    let at = converted.len();
                    converted.extend(f16_bytes(&constants[offset..offset + len]).map(f32::from));
                    Location::Converted(at)
                }
                Role::Constant { offset, .. } => Location::Constant(offset),
                // Unused intermediates (never produced) get an empty slot.
                Role::Intermediate => Location::Arena(0),
            })
            .collect();
        for (&v, &offset) in placed.iter().zip(&offsets) {
            locations[v] = Location::Arena(offset);
        }

        let mut report = Vec::new();
        let steps = nodes
            .into_iter()
            .map(|node| {
                let kernel = match node.op {
                    OpDesc::Conv1d { .. } => prepare_conv(
                        &node,
                        &values,
                        &locations,
                        constants,
                        &converted,
                        options,
                        &mut report,
                    )?,
                    OpDesc::LinearScan { .. } => {
                        // The scan picks rows-in-parallel or a chunked scan
                        // along time per call, from the rows and the pool.
                        report.push(format!(
                            "plan: node {} '{}' linear_scan -> parallel_scan",
                            node.id, node.name
                        ));
                        Kernel::LinearScan
                    }
                };
                Ok(Step { node, kernel })
            })
            .collect::<Result<Vec<_>, DelegateError>>()?;
        let scratch_per_thread = steps
            .iter()
            .map(|s| match &s.kernel {
                Kernel::Conv1d(k) => k.scratch_per_thread(),
                Kernel::LinearScan => 0,
            })
            .max()
            .unwrap_or(0);
        Ok(Plan {
            values,
            locations,
            inputs,
            outputs,
            steps,
            arena_bytes,
            scratch_per_thread,
            converted,
            report,
        })
    }
}

/// Chooses and prepares a conv1d's kernel for the node's largest shape, and
/// logs the choice with the cost model's estimates so it can be checked.
fn prepare_conv(
    node: &NodeDesc,
    values: &[ValueDesc],
    locations: &[Location],
    constants: &[u8],
    converted: &[f32],
    options: &CompileOptions,
    report: &mut Vec<String>,
) -> Result<Kernel, DelegateError> {
    let OpDesc::Conv1d { input, weight, .. } = node.op else {
        unreachable!("prepare_conv on {:?}", node.op)
    };
    let max = ops::conv1d_params(
        &node.op,
        bound_shape(&values[input]),
        bound_shape(&values[weight]),
    );
    let prepare_error = |source| DelegateError::Prepare {
        id: node.id,
        name: node.name.clone(),
        source,
    };
    let candidates = kernels::applicable(&max);
    // A weight fed at run time cannot be transformed ahead: only algorithms
    // that read it in place qualify.
    let n = values[weight].max_numel();
    let weights = match locations[weight] {
        Location::Constant(offset) => Some(as_f32(&constants[offset..offset + 4 * n])),
        Location::Converted(offset) => Some(&converted[offset..offset + n]),
        _ => None,
    };
    let choice = match (options.conv1d_algorithm, weights) {
        (Choice::Force(a), _) if !candidates.contains(&a) => {
            report.push(format!(
                "node {} '{}': {} does not apply, choosing automatically",
                node.id,
                node.name,
                a.name()
            ));
            Choice::Auto
        }
        (choice, Some(_)) => choice,
        (_, None) => Choice::Force(cheapest_in_place(&max)),
    };
    let empty = vec![0.0; max.weight_elems()];
    let w = weights.unwrap_or(&empty);
    let prepared = PreparedConv1d::new(&max, w, choice).map_err(prepare_error)?;
    let estimates: Vec<String> = candidates
        .iter()
        .filter_map(|&a| {
            Some(format!(
                "{} {:.3}",
                a.name(),
                kernels::estimate_cost(a, &max)? * 1e3
            ))
        })
        .collect();
    report.push(format!(
        "plan: node {} '{}' conv1d -> {} (estimated ms: {}; prepared {:.1} MiB)",
        node.id,
        node.name,
        prepared.algorithm().name(),
        estimates.join(", "),
        prepared.prepared_bytes() as f64 / (1 << 20) as f64
    ));
    Ok(Kernel::Conv1d(Box::new(prepared)))
}

/// The cheapest algorithm that reads the weights in place.
fn cheapest_in_place(max: &kernels::Conv1dParams) -> kernels::Algorithm {
    use kernels::Algorithm;
    [Algorithm::DepthwiseSimd, Algorithm::Direct]
        .into_iter()
        .filter_map(|a| Some((a, kernels::estimate_cost(a, max)?)))
        .min_by(|x, y| x.1.total_cmp(&y.1))
        .map_or(Algorithm::Direct, |(a, _)| a)
}

fn bound_shape(value: &ValueDesc) -> Shape {
    Shape::new(&value.dims.iter().map(|d| d.size).collect::<Vec<_>>())
}

fn f16_bytes(bytes: &[u8]) -> impl Iterator<Item = half::f16> + '_ {
    bytes
        .chunks_exact(2)
        .map(|b| half::f16::from_le_bytes([b[0], b[1]]))
}

/// Views 4-byte aligned little-endian bytes as f32 (what the blob stores).
pub(crate) fn as_f32(bytes: &[u8]) -> &[f32] {
    // SAFETY: f32 has no invalid bit patterns, so reinterpreting initialised
    // bytes is sound; align_to puts any misaligned head or tail outside the
    // middle slice, and the assert below rejects that case.
    let (head, floats, tail) = unsafe { bytes.align_to::<f32>() };
    assert!(
        head.is_empty() && tail.is_empty(),
        "constant not 4-byte aligned"
    );
    floats
}

#[cfg(target_endian = "big")]
compile_error!("the blob stores little-endian values; big-endian targets need a conversion");

/// Checks every node at the shapes' upper bounds: operands fit together and
/// each result fits the shape (or bound) the blob declares for it.
fn check_shapes(values: &[ValueDesc], nodes: &[NodeDesc]) -> Result<(), GraphError> {
    let bounds: Vec<Shape> = values.iter().map(bound_shape).collect();
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
