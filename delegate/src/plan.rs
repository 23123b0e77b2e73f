//! The execution plan built once at `init`: a list of self-describing
//! [`Step`]s (one per fused kernel the exporter recorded), where every
//! materialised value lives, and how big the arena is. `execute` only
//! follows it.

use rustconv_kernels as kernels;
use rustconv_kernels::fused::{line_scratch, reduce_scratch};

use crate::error::{DelegateError, GraphError};
use crate::fusion::{self, Statistics, StatisticsKind};
use crate::graph::{DType, GraphDesc, NodeDesc, Role, ValueDesc};
use crate::memory::{self, Lifetime};
use crate::ops;
use crate::options::CompileOptions;
use crate::shape::Shape;
use crate::step::{Prepare, StepKind};

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
    /// A state's update written in place of its next value: the same
    /// element offset into the state buffer's other half. After a call the
    /// two halves of such a state trade places ([`StateSlot::swaps`]).
    NextState(usize),
}

/// A mutable buffer the delegate owns (a conv's or a scan's state).
#[derive(Clone, Debug)]
pub struct StateSlot {
    pub value: usize,
    /// The value that becomes the state at the end of every call.
    pub update: usize,
    /// Element offset into the state buffer and element count.
    pub offset: usize,
    pub len: usize,
    /// Whether its step writes the update straight into the state buffer's
    /// other half ([`Location::NextState`]), which then becomes the state
    /// by trading places with it: no copy at the end of the call (a decode
    /// step's conv state is otherwise copied every token). A float16
    /// state's update is copied instead, rounded as the model's `copy_`
    /// would.
    pub swaps: bool,
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
    pub absorbed: Vec<Absorbed>,
    /// Materialised values read during `execute`.
    pub reads: Vec<usize>,
    /// Materialised values written (the statistics' too).
    pub writes: Vec<usize>,
    /// Reductions computed before `exec` runs, in order, into stored
    /// values its programs read.
    pub statistics: Vec<Statistics>,
    /// How it runs: the step's own kind, from fusion to execution.
    pub exec: Box<dyn StepKind>,
}

impl std::fmt::Debug for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Step")
            .field("kernel", &self.kernel)
            .field("algorithm", &self.algorithm())
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
    /// Per node, the operands each call must give the node's result shape
    /// ([`ops::unbroadcast_operands`]).
    pub unbroadcast: Vec<Vec<usize>>,
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
                    swaps: false,
                });
            }
        }

        let mut report = vec![format!(
            "plan: vector instructions {}",
            kernels::vector_instructions()
        )];
        // A conv prepares from its weights where they are constants.
        let constant = |v: usize| {
            let n = graph.values[v].max_numel();
            match locations[v] {
                Location::Constant(offset) => Some(as_f32(&constants[offset..offset + 4 * n])),
                Location::Converted(offset) => Some(&converted[offset..offset + n]),
                _ => None,
            }
        };
        let mut prepare = Prepare {
            values: &graph.values,
            constant: &constant,
            options,
            report: &mut report,
        };
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
            let mut exec = kernel.body;
            exec.prepare(&mut prepare)?;
            let staged = exec.staged();
            for &v in &staged {
                materialised[v] = true;
            }
            let mut writes = staged;
            writes.extend(kernel.statistics.iter().flat_map(Statistics::values));
            writes.extend(kernel.writes);
            let mut step = Step {
                kernel: kernel.index,
                absorbed,
                reads: Vec::new(),
                writes,
                statistics: kernel.statistics,
                exec,
            };
            step.reads = step.values_read(&materialised);
            prepare.report.push(step.describe(&graph.values));
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
        // An f32 update that one step writes whole goes straight into the
        // state buffer's other half; the others are read after the last
        // step, when they are copied into their state.
        for i in 0..states.len() {
            let slot = &states[i];
            let (value, update) = (&graph.values[slot.value], &graph.values[slot.update]);
            let writers = steps.iter().filter(|s| s.writes.contains(&slot.update));
            let swaps = value.dtype == DType::F32
                && update.dtype == DType::F32
                && matches!(update.role, Role::Intermediate)
                && materialised[slot.update]
                && update.max_numel() == slot.len
                && writers.count() == 1
                && states.iter().filter(|s| s.update == slot.update).count() == 1;
            if swaps {
                locations[slot.update] = Location::NextState(slot.offset);
            } else {
                last[slot.update] = steps.len();
            }
            states[i].swaps = swaps;
        }
        let in_arena = |v: usize| {
            let value = &graph.values[v];
            materialised[v]
                && !matches!(locations[v], Location::NextState(_))
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
        let unbroadcast = graph
            .nodes
            .iter()
            .map(|node| ops::unbroadcast_operands(&node.op, &graph.values))
            .collect();
        Ok(Plan {
            unbroadcast,
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

    /// Bytes of one half of the state buffer: the states' initial contents'
    /// layout. A swapping state's update lies this far after the state.
    pub fn state_half_bytes(&self) -> usize {
        std::mem::size_of_val(self.state_init.as_slice())
    }

    /// Bytes the delegate-owned states take: one half, twice where some
    /// state swaps halves with its update.
    pub fn state_bytes(&self) -> usize {
        let half = self.state_half_bytes();
        if self.states.iter().any(|slot| slot.swaps) {
            2 * half
        } else {
            half
        }
    }
}

impl Step {
    /// The materialised values the step reads during `execute`.
    fn values_read(&self, materialised: &[bool]) -> Vec<usize> {
        let mut reads = self.exec.loads();
        reads.extend(self.statistics.iter().flat_map(|s| s.program.loads()));
        reads.retain(|&v| materialised[v]);
        reads.sort_unstable();
        reads.dedup();
        reads
    }

    /// The algorithm it runs, for logs, plans and the profiler.
    pub fn algorithm(&self) -> &'static str {
        self.exec.algorithm()
    }

    fn shared_scratch(&self) -> usize {
        self.exec.shared_scratch()
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
        statistics.max(self.exec.scratch_per_thread())
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
            self.algorithm(),
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
        statistics + &self.exec.summary()
    }
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
    let bounds: Vec<Shape> = values.iter().map(ValueDesc::bound_shape).collect();
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
