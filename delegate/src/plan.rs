//! The execution plan built once at `init`: a list of self-describing
//! [`Step`]s (one per fused kernel the exporter recorded), where every
//! materialised value lives, and how big the arena is. `execute` only
//! follows it.

use rustconv_kernels::fused::{line_scratch, reduce_scratch, CompiledProgram};
use rustconv_kernels::{self as kernels, scan_rows_scratch, Choice, PreparedConv1d, Weights};

use crate::error::{DelegateError, GraphError};
use crate::fusion::{self, Epilogue, KernelBody, Source, Statistics, StatisticsKind};
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
    /// Computed inside a fused kernel where it is read; never stored.
    Virtual,
    /// Element offset into the delegate's state (f32, kept across calls; see
    /// [`Plan::states`]).
    State(usize),
}

/// A mutable buffer the delegate owns (a conv's or a scan's state).
#[derive(Clone, Debug)]
pub struct StateSlot {
    pub value: usize,
    /// The value copied into the state at the end of every call.
    pub update: usize,
    /// Element offset into the state buffer and element count.
    pub offset: usize,
    pub len: usize,
}

/// How a step runs: the anchor kernel (or a pass) and what is fused into it.
pub enum Exec {
    Conv1d {
        /// Prepared for the node's largest shape: algorithm chosen, weights
        /// transformed where the algorithm wants it.
        prepared: Box<PreparedConv1d>,
        /// The value the step stores: the conv's output, or the epilogue's.
        result: usize,
        /// The conv node's op (parameters and operand values).
        op: OpDesc,
        input: Source,
        epilogue: Option<Epilogue>,
        /// The algorithm cannot compute the input in its own loops: it is
        /// materialised first, into its value's arena slot.
        stage_input: bool,
        /// The algorithm cannot hand its output to the epilogue in its own
        /// loops: it is stored into the anchor's arena slot, then drained
        /// through the epilogue.
        stage_output: bool,
    },
    LinearScan {
        op: OpDesc,
        result: usize,
        x0: Source,
        a: Source,
        u: Source,
        epilogue: Option<Epilogue>,
    },
    /// Every result computed by its program in one pass over memory.
    Pass {
        results: Vec<(usize, CompiledProgram)>,
    },
}

/// An original op of the model that a step implements.
#[derive(Clone, Debug)]
pub struct Absorbed {
    pub id: u32,
    pub name: String,
    pub op: &'static str,
    pub debug_handles: Vec<u32>,
}

/// One fused kernel: what it reads and writes, how it runs, and which of
/// the model's ops it absorbed.
pub struct Step {
    /// The kernel index recorded at export (stable from export to
    /// profiling).
    pub kernel: u32,
    /// The algorithm it runs, for logs and plans.
    pub algorithm: &'static str,
    pub absorbed: Vec<Absorbed>,
    /// Materialised values read during `execute`.
    pub reads: Vec<usize>,
    /// Materialised values written (the statistics' too).
    pub writes: Vec<usize>,
    /// Reductions computed before `exec` runs, in order, into stored
    /// values its programs read.
    pub statistics: Vec<Statistics>,
    pub exec: Exec,
}

impl std::fmt::Debug for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Step")
            .field("kernel", &self.kernel)
            .field("algorithm", &self.algorithm)
            .field("absorbed", &self.absorbed)
            .field("reads", &self.reads)
            .field("writes", &self.writes)
            .finish()
    }
}

#[derive(Debug)]
pub struct Plan {
    pub values: Vec<ValueDesc>,
    pub locations: Vec<Location>,
    pub inputs: Vec<usize>,
    pub outputs: Vec<usize>,
    /// Every node, in order: `execute` derives every value's shape from them.
    pub nodes: Vec<NodeDesc>,
    pub steps: Vec<Step>,
    pub arena_bytes: usize,
    /// Step at which each arena value is written and last read (for plans
    /// and tests): `(first, last)`, or None for values not in the arena.
    pub lifetimes: Vec<Option<(usize, usize)>>,
    /// The most scratch any step needs per thread, in f32 elements.
    pub scratch_per_thread: usize,
    /// The most scratch any step shares among its tasks (a layer's packed
    /// weights), in f32 elements.
    pub shared_scratch: usize,
    /// f32 copies of the float16 constants.
    pub converted: Vec<f32>,
    /// The delegate-owned states, and their initial contents laid out as
    /// the state buffer (f32, `state_init.len()` elements): what a new
    /// delegate starts from and what a reset restores.
    pub states: Vec<StateSlot>,
    pub state_init: Vec<f32>,
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
        check_shapes(&graph.values, &graph.nodes)?;
        let (kernels, mut materialised) = fusion::build(&graph)?;

        let mut converted = Vec::new();
        let mut locations: Vec<Location> = graph
            .values
            .iter()
            .map(|v| match v.role {
                Role::Input(i) => Location::Arg(i),
                Role::Output(i) => Location::Arg(graph.inputs.len() + i),
                Role::Constant { offset, len } if v.dtype == DType::F16 => {
                    let at = converted.len();
                    converted.extend(f16_bytes(&constants[offset..offset + len]).map(f32::from));
                    Location::Converted(at)
                }
                Role::Constant { offset, .. } => Location::Constant(offset),
                Role::Intermediate => Location::Virtual,
                Role::State { .. } => Location::Virtual, // placed below
            })
            .collect();

        let mut states = Vec::new();
        let mut state_init: Vec<f32> = Vec::new();
        for (v, value) in graph.values.iter().enumerate() {
            if let Role::State {
                offset,
                len,
                update,
            } = value.role
            {
                // Each state starts on a cache line of its own.
                let at = state_init.len().next_multiple_of(16);
                state_init.resize(at, 0.0);
                let bytes = &constants[offset..offset + len];
                match value.dtype {
                    DType::F16 => state_init.extend(f16_bytes(bytes).map(f32::from)),
                    DType::F32 => state_init.extend(
                        bytes
                            .chunks_exact(4)
                            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                    ),
                }
                locations[v] = Location::State(at);
                states.push(StateSlot {
                    value: v,
                    update,
                    offset: at,
                    len: value.max_numel(),
                });
            }
        }

        let mut report = vec![format!(
            "plan: vector instructions {}",
            kernels::vector_instructions()
        )];
        let mut steps = Vec::with_capacity(kernels.len());
        for kernel in kernels {
            let absorbed = graph.nodes[kernel.nodes.clone()]
                .iter()
                .map(|n| Absorbed {
                    id: n.id,
                    name: n.name.clone(),
                    op: n.op.kind(),
                    debug_handles: n.debug_handles.clone(),
                })
                .collect();
            let (exec, algorithm) = match kernel.body {
                KernelBody::Conv1d {
                    node,
                    input,
                    epilogue,
                } => {
                    let result = kernel.writes[0];
                    let node = &graph.nodes[node];
                    let prepared = prepare_conv(
                        node,
                        &graph.values,
                        &locations,
                        constants,
                        &converted,
                        options,
                        &mut report,
                    )?;
                    let stage_input =
                        matches!(input, Source::Computed(_)) && !prepared.fuses_input();
                    let stage_output = epilogue.is_some() && !prepared.fuses_output();
                    if let (true, OpDesc::Conv1d { input, .. }) = (stage_input, &node.op) {
                        materialised[*input] = true;
                    }
                    if stage_output {
                        materialised[node.op.output()] = true;
                    }
                    let algorithm = prepared.algorithm().name();
                    let exec = Exec::Conv1d {
                        prepared: Box::new(prepared),
                        result,
                        op: node.op.clone(),
                        input,
                        epilogue,
                        stage_input,
                        stage_output,
                    };
                    (exec, algorithm)
                }
                KernelBody::LinearScan {
                    node,
                    x0,
                    a,
                    u,
                    epilogue,
                } => (
                    Exec::LinearScan {
                        op: graph.nodes[node].op.clone(),
                        result: kernel.writes[0],
                        x0,
                        a,
                        u,
                        epilogue,
                    },
                    "parallel_scan",
                ),
                KernelBody::Pass { results } => (Exec::Pass { results }, "elementwise"),
            };
            let mut writes: Vec<usize> = kernel
                .statistics
                .iter()
                .flat_map(Statistics::values)
                .collect();
            writes.extend(kernel.writes);
            let mut step = Step {
                kernel: kernel.index,
                algorithm,
                absorbed,
                reads: Vec::new(),
                writes,
                statistics: kernel.statistics,
                exec,
            };
            step.reads = step.values_read(&materialised);
            // A staged conv also writes its input and output buffers.
            if let Exec::Conv1d {
                op: OpDesc::Conv1d { input, output, .. },
                stage_input,
                stage_output,
                ..
            } = &step.exec
            {
                if *stage_input {
                    step.writes.insert(0, *input);
                }
                if *stage_output {
                    step.writes.insert(0, *output);
                }
            }
            report.push(step.describe(&graph.values));
            steps.push(step);
        }

        // Arena: every materialised value kernels see as f32 that is not an
        // f32 argument or a constant. Lifetimes in steps; inputs are bound
        // (and float16 ones converted) before step 0.
        let mut first = vec![usize::MAX; graph.values.len()];
        let mut last = vec![0; graph.values.len()];
        for &v in &graph.inputs {
            first[v] = 0;
        }
        for (s, step) in steps.iter().enumerate() {
            for &v in &step.writes {
                first[v] = first[v].min(s);
                last[v] = last[v].max(s);
            }
            for &v in &step.reads {
                last[v] = last[v].max(s);
            }
        }
        // Read after the last step, when it is copied into its state.
        for slot in &states {
            last[slot.update] = steps.len();
        }
        let in_arena = |v: usize| {
            let value = &graph.values[v];
            materialised[v]
                && first[v] != usize::MAX
                && match value.role {
                    Role::Intermediate => true,
                    Role::Input(_) | Role::Output(_) => value.dtype == DType::F16,
                    Role::Constant { .. } | Role::State { .. } => false,
                }
        };
        let placed: Vec<usize> = (0..graph.values.len()).filter(|&v| in_arena(v)).collect();
        let buffers: Vec<Lifetime> = placed
            .iter()
            .map(|&v| Lifetime {
                bytes: graph.values[v].max_numel() * std::mem::size_of::<f32>(),
                first: first[v],
                last: last[v],
            })
            .collect();
        let (offsets, arena_bytes) = memory::place(&buffers);
        let mut lifetimes = vec![None; graph.values.len()];
        for ((&v, &offset), b) in placed.iter().zip(&offsets).zip(&buffers) {
            locations[v] = Location::Arena(offset);
            lifetimes[v] = Some((b.first, b.last));
        }

        let scratch_per_thread = steps
            .iter()
            .map(Step::scratch_per_thread)
            .max()
            .unwrap_or(0);
        let shared_scratch = steps.iter().map(Step::shared_scratch).max().unwrap_or(0);
        Ok(Plan {
            values: graph.values,
            locations,
            inputs: graph.inputs,
            outputs: graph.outputs,
            nodes: graph.nodes,
            steps,
            arena_bytes,
            lifetimes,
            scratch_per_thread,
            shared_scratch,
            converted,
            states,
            state_init,
            report,
        })
    }
}

fn source_loads(source: &Source) -> Vec<usize> {
    match source {
        Source::Stored(v) => vec![*v],
        Source::Computed(p) => p.loads().collect(),
        Source::Paired => Vec::new(),
    }
}

fn program_temps(source: &Source) -> usize {
    match source {
        Source::Stored(_) | Source::Paired => 0,
        Source::Computed(p) => p.temporaries(),
    }
}

/// Line-sized temporaries an epilogue's sink needs (its result buffer too).
fn epilogue_temps(epilogue: &Option<Epilogue>) -> usize {
    epilogue.as_ref().map_or(0, |e| 1 + e.program.temporaries())
}

impl Step {
    /// The materialised values the step reads during `execute`.
    fn values_read(&self, materialised: &[bool]) -> Vec<usize> {
        let mut reads: Vec<usize> = match &self.exec {
            Exec::Conv1d {
                prepared,
                op,
                input,
                epilogue,
                ..
            } => {
                let OpDesc::Conv1d { weight, bias, .. } = *op else {
                    unreachable!("conv step holds a conv")
                };
                let mut r = source_loads(input);
                if prepared.reads_weights() {
                    r.push(weight);
                }
                r.extend(bias);
                r.extend(epilogue.iter().flat_map(|e| e.program.loads()));
                r
            }
            Exec::LinearScan {
                x0, a, u, epilogue, ..
            } => {
                let mut r: Vec<usize> = [x0, a, u].into_iter().flat_map(source_loads).collect();
                r.extend(epilogue.iter().flat_map(|e| e.program.loads()));
                r
            }
            Exec::Pass { results } => results.iter().flat_map(|(_, p)| p.loads()).collect(),
        };
        reads.extend(self.statistics.iter().flat_map(|s| s.program.loads()));
        reads.retain(|&v| materialised[v]);
        reads.sort_unstable();
        reads.dedup();
        reads
    }

    fn shared_scratch(&self) -> usize {
        match &self.exec {
            Exec::Conv1d { prepared, .. } => prepared.shared_scratch(),
            Exec::LinearScan { .. } | Exec::Pass { .. } => 0,
        }
    }

    fn scratch_per_thread(&self) -> usize {
        let statistics = self
            .statistics
            .iter()
            .map(|s| match s.kind {
                StatisticsKind::Reduce { .. } => reduce_scratch(s.program.temporaries()),
                StatisticsKind::Derived { .. } => line_scratch(s.program.temporaries()),
            })
            .max()
            .unwrap_or(0);
        statistics.max(self.exec_scratch_per_thread())
    }

    fn exec_scratch_per_thread(&self) -> usize {
        match &self.exec {
            Exec::Conv1d {
                prepared,
                input,
                epilogue,
                stage_input,
                stage_output,
                ..
            } => {
                let (x, y) = (program_temps(input), epilogue_temps(epilogue));
                let staged = line_scratch(if *stage_input { x } else { 0 }.max(if *stage_output {
                    y
                } else {
                    0
                }));
                let fused = prepared.rows_scratch_per_thread(
                    if *stage_input { 0 } else { x },
                    if *stage_output { 0 } else { y },
                );
                staged.max(fused)
            }
            Exec::LinearScan {
                x0, a, u, epilogue, ..
            } => {
                let temps = [x0, a, u].into_iter().map(program_temps).max().unwrap_or(0);
                scan_rows_scratch(temps.max(epilogue_temps(epilogue)))
            }
            Exec::Pass { results } => line_scratch(
                results
                    .iter()
                    .map(|(_, p)| p.temporaries())
                    .max()
                    .unwrap_or(0),
            ),
        }
    }

    /// The plan's log line for this step.
    fn describe(&self, values: &[ValueDesc]) -> String {
        let ops: Vec<String> = self
            .absorbed
            .iter()
            .map(|a| format!("{} '{}'", a.op, a.name))
            .collect();
        let writes: Vec<&str> = self
            .writes
            .iter()
            .map(|&v| values[v].name.as_str())
            .collect();
        format!(
            "plan: kernel {} -> {}{}; writes {}; absorbs {} op(s): {}",
            self.kernel,
            self.algorithm,
            self.fusion_summary(),
            writes.join(", "),
            self.absorbed.len(),
            ops.join(", ")
        )
    }

    /// What runs inside the kernel's loops and what goes through memory,
    /// as ", prologue in its loops, epilogue staged through memory" (empty
    /// for a kernel with nothing fused), after the statistics it gathers
    /// first (", statistics first: mean, var over dim 2").
    pub fn fusion_summary(&self) -> String {
        let mut statistics = String::new();
        let mut derived = Vec::new();
        for s in &self.statistics {
            match &s.kind {
                StatisticsKind::Reduce { dims, outputs, .. } => {
                    let ops: Vec<&str> = outputs.iter().map(|(op, _)| op.name()).collect();
                    let dims: Vec<String> = (0..dims.len())
                        .filter(|&d| dims[d])
                        .map(|d| d.to_string())
                        .collect();
                    let plural = if dims.len() == 1 { "" } else { "s" };
                    statistics += &format!(
                        ", statistics first: {} over dim{plural} {}",
                        ops.join(" and "),
                        dims.join(" and ")
                    );
                }
                StatisticsKind::Derived { op, .. } => derived.push(*op),
            }
        }
        if !derived.is_empty() {
            statistics += &format!(" (then {} once per statistic)", derived.join(", "));
        }
        statistics + &self.exec_summary()
    }

    fn exec_summary(&self) -> String {
        match &self.exec {
            Exec::Conv1d {
                input,
                epilogue,
                stage_input,
                stage_output,
                ..
            } => {
                let part = |what: &str, present: bool, staged: bool| match (present, staged) {
                    (false, _) => String::new(),
                    (true, false) => format!(", {what} in its loops"),
                    (true, true) => format!(", {what} staged through memory"),
                };
                part(
                    "prologue",
                    matches!(input, Source::Computed(_)),
                    *stage_input,
                ) + &part("epilogue", epilogue.is_some(), *stage_output)
            }
            Exec::LinearScan {
                x0, a, u, epilogue, ..
            } => {
                let computed = [x0, a, u]
                    .iter()
                    .filter(|s| matches!(s, Source::Computed(_) | Source::Paired))
                    .count();
                let prologue = match computed {
                    0 => String::new(),
                    n => format!(", prologue of {n} operand(s) in its loops"),
                };
                let prologue = match (a, u) {
                    (Source::Computed(p), Source::Paired) => format!(
                        "{prologue}, a and u together ({} shared subexpression(s) once)",
                        p.shared()
                    ),
                    _ => prologue,
                };
                let epilogue = if epilogue.is_some() {
                    ", epilogue in its loops"
                } else {
                    ""
                };
                prologue + epilogue
            }
            Exec::Pass { .. } => String::new(),
        }
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
) -> Result<PreparedConv1d, DelegateError> {
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
    // A weight fed at run time (an argument, or a value another step
    // computes) is read by every call; the kernel is told so and derives
    // nothing from it ahead.
    let n = values[weight].max_numel();
    let weights = match locations[weight] {
        Location::Constant(offset) => Weights::Constant(as_f32(&constants[offset..offset + 4 * n])),
        Location::Converted(offset) => Weights::Constant(&converted[offset..offset + n]),
        _ => Weights::Fed,
    };
    let candidates = kernels::applicable(&max, &weights);
    let choice = match options.conv1d_algorithm {
        Choice::Force(a) if !candidates.contains(&a) => {
            report.push(format!(
                "node {} '{}': {} does not apply{}, choosing automatically",
                node.id,
                node.name,
                a.name(),
                if kernels::estimate_cost(a, &max).is_some() {
                    // It applies to the shape: not to fed weights.
                    " to a weight fed at run time"
                } else {
                    ""
                }
            ));
            Choice::Auto
        }
        choice => choice,
    };
    let prepared = PreparedConv1d::for_weights(&max, weights, choice).map_err(prepare_error)?;
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
        "plan: node {} '{}' conv1d -> {}{} (estimated ms: {}; prepared {:.1} MiB)",
        node.id,
        node.name,
        prepared.algorithm().name(),
        if prepared.weights_fed() {
            ", weights fed at run time"
        } else {
            ""
        },
        estimates.join(", "),
        prepared.prepared_bytes() as f64 / (1 << 20) as f64
    ));
    Ok(prepared)
}

pub(crate) fn bound_shape(value: &ValueDesc) -> Shape {
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
        let out = &values[node.op.output()];
        let inferred = ops::infer_shape(&node.op, out.dims.len(), |v| bounds[v]).map_err(bad)?;
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
