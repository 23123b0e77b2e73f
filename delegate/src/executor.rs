//! Runs a [`Plan`]: checks the call's tensors against it, derives every shape
//! from the actual inputs, sizes the outputs and runs the kernels, without
//! heap allocation (everything per-call lives in [`ExecState`], sized at init).

use rustconv_kernels::fused::{materialise, reduce, ProgramRows, ShapeGeneration, Statistic};
use rustconv_kernels::{self as kernels, par, KernelError, Scratch};

use crate::error::{ArgError, DelegateError};
use crate::fusion::StatisticsKind;
use crate::graph::{DType, Role, ValueDesc, MAX_RANK};
use crate::memory::AlignedBuf;
use crate::ops;
use crate::plan::{Location, Plan, Step};
use crate::profiling::{Clock, EventSink, KernelEvents};
use crate::shape::Shape;
use crate::step::Call;
use crate::threads;

/// One argument of the delegate call, as the host runtime describes it.
pub struct ArgTensor<'a> {
    /// None for a dtype this delegate never handles.
    pub dtype: Option<DType>,
    pub sizes: &'a [i32],
    pub contiguous: bool,
    pub nbytes: usize,
    pub data: *mut u8,
}

/// The delegate call's arguments: inputs then outputs. Implemented over
/// ExecuTorch's EValues in ffi.rs and over plain buffers in tests.
pub trait CallArgs {
    fn count(&self) -> usize;
    fn tensor(&self, i: usize) -> Option<ArgTensor<'_>>;
    /// Resizes output argument `i`; false if the host refuses.
    fn resize(&mut self, i: usize, sizes: &[i32]) -> bool;
}

/// Per-call scratch, allocated once at init and reused by every call.
pub struct ExecState {
    shapes: Vec<Shape>,
    /// The number of `shapes` as the last call left them, where every
    /// check of them passed: a call whose inputs have the same shapes
    /// skips shape inference and its checks, and the steps derive what
    /// depends on shapes alone once per generation (see
    /// `rustconv_kernels::fused::ShapeGeneration`). None: not yet bound, or
    /// the last call's shapes were refused.
    generation: Option<ShapeGeneration>,
    /// Where kernels read and write each value as f32 this call.
    data: Vec<*mut u8>,
    /// The call's own tensor for each input and output value (for float16
    /// values, distinct from its f32 shadow in `data`).
    args: Vec<*mut u8>,
    /// Owns the memory that intermediates' entries of `data` point into.
    _arena: AlignedBuf,
    /// Owns the delegate-owned states, kept across calls (f32, two halves
    /// laid out as `Plan::state_init`: a state's entry of `data` points into
    /// one, a swapping state's update into the other), and the reset epoch
    /// they were last reset at.
    _states: AlignedBuf,
    state_epoch: u64,
    /// Per-thread kernel scratch (FFT buffers and the like), sized for the
    /// plan and the pool.
    scratch: Scratch,
    /// Each step's span when the call is profiled.
    pub(crate) events: KernelEvents,
}

// SAFETY: the raw pointers in `data` are only written and read inside one
// `execute`, with the state locked, and point into buffers that outlive that
// call (the arena owned here, the constants owned by the delegate, the call's
// tensors, the states' two halves); nothing keeps them across calls. During
// the kernels the `ExecState` is only read (the pool's threads see it through
// a shared reference): steps write through `data` into the values they own,
// a swapping state's update half among them, and the halves trade places
// only after the steps, through `&mut`.
unsafe impl Send for ExecState {}
unsafe impl Sync for ExecState {}

impl ExecState {
    /// Binds what is fixed for the delegate's life: the shapes and addresses
    /// of constants and the addresses of intermediates. Arguments are bound
    /// per call.
    ///
    /// `constants` is the start of the buffer the plan's Constant offsets
    /// point into: the blob's segment (whose bounds were checked when the
    /// graph was decoded) or the copy `Plan::retain_constants` made.
    pub fn new(plan: &Plan, constants: *const u8) -> Result<Self, DelegateError> {
        let converted = plan.converted.as_ptr();
        let mut arena =
            AlignedBuf::try_zeroed(plan.arena_bytes).ok_or(DelegateError::OutOfMemory {
                what: "arena",
                bytes: plan.arena_bytes,
            })?;
        let arena_base = arena.as_mut_ptr();
        // The states, and (`Plan::state_bytes`) a second half where the
        // swapping ones' updates go, `half` bytes further on.
        let half = plan.state_half_bytes();
        let mut states = AlignedBuf::zeroed(plan.state_bytes());
        let states_base = states.as_mut_ptr();
        let mut shapes = vec![Shape::default(); plan.values.len()];
        let data: Vec<*mut u8> = plan
            .locations
            .iter()
            .enumerate()
            .map(|(v, location)| match *location {
                Location::Constant(offset) => {
                    shapes[v] = bound_shape(plan, v);
                    // wrapping_add: computing the address touches no memory.
                    constants.wrapping_add(offset).cast_mut()
                }
                Location::Converted(offset) => {
                    shapes[v] = bound_shape(plan, v);
                    converted.wrapping_add(offset).cast::<u8>().cast_mut()
                }
                Location::Arena(offset) => arena_base.wrapping_add(offset),
                Location::State(offset) => {
                    shapes[v] = bound_shape(plan, v);
                    states_base.wrapping_add(offset * std::mem::size_of::<f32>())
                }
                Location::NextState(offset) => {
                    states_base.wrapping_add(half + offset * std::mem::size_of::<f32>())
                }
                // Never viewed: the step that names it does not read it.
                Location::Released => {
                    shapes[v] = bound_shape(plan, v);
                    std::ptr::null_mut()
                }
                Location::Arg(_) | Location::Virtual => std::ptr::null_mut(),
            })
            .collect();
        let mut exec = ExecState {
            shapes,
            generation: None,
            args: vec![std::ptr::null_mut(); data.len()],
            data,
            _arena: arena,
            _states: states,
            state_epoch: crate::state::epoch(),
            scratch: Scratch::default(),
            events: KernelEvents::new(plan.steps.len()),
        };
        exec.reset_states(plan);
        Ok(exec)
    }

    /// Puts every delegate-owned state back to its initial value.
    pub fn reset_states(&mut self, plan: &Plan) {
        for slot in &plan.states {
            // SAFETY: `data[value]` is the state's current range, `len`
            // f32s inside `states` (one half or the other: swapping slots
            // trade halves after a call), 64-byte aligned; nothing else
            // borrows it here.
            let state =
                unsafe { std::slice::from_raw_parts_mut(self.data[slot.value].cast(), slot.len) };
            state.copy_from_slice(&plan.state_init[slot.offset..][..slot.len]);
        }
    }
}

impl ExecState {
    /// Reports the spans the last call recorded, at its shapes.
    pub(crate) fn report_events(&mut self, plan: &Plan, sink: &mut dyn EventSink) {
        self.events.report(plan, &self.shapes, sink);
    }
}

/// Everything `execute` reads but never changes.
pub struct Executable<'a> {
    pub plan: &'a Plan,
    pub spec_threads: Option<usize>,
}

impl Executable<'_> {
    /// Runs the call; with a `clock`, records each step's span in
    /// `state.events` (read on the thread running the steps, the caller's).
    pub fn run(
        &self,
        state: &mut ExecState,
        args: &mut dyn CallArgs,
        clock: Option<Clock>,
    ) -> Result<(), DelegateError> {
        let plan = self.plan;
        let n_in = plan.inputs.len();
        let expected = n_in + plan.outputs.len();
        if args.count() != expected {
            return Err(ArgError::Count {
                expected,
                inputs: n_in,
                outputs: plan.outputs.len(),
                got: args.count(),
            }
            .into());
        }
        let mut same_shapes = state.generation.is_some();
        for (position, &v) in plan.inputs.iter().enumerate() {
            let shape = self.bind_arg(state, args, "input", position, v)?;
            if shape != state.shapes[v] {
                // Until every shape below is derived and checked again.
                state.generation = None;
                same_shapes = false;
                state.shapes[v] = shape;
            }
        }
        if !same_shapes {
            self.derive_shapes(state)?;
            state.generation = Some(ShapeGeneration::fresh());
        }
        for (position, &out) in plan.outputs.iter().enumerate() {
            let (sizes, rank) = crate::shape::to_i32(state.shapes[out]);
            if !args.resize(n_in + position, &sizes[..rank]) {
                return Err(ArgError::Resize {
                    index: position,
                    name: plan.values[out].name.clone(),
                    shape: state.shapes[out].dims().iter().map(|&d| d as i64).collect(),
                }
                .into());
            }
            self.bind_arg(state, args, "output", position, out)?;
        }
        self.check_outputs_disjoint(state)?;
        let epoch = crate::state::epoch();
        if epoch != state.state_epoch {
            state.reset_states(plan);
            state.state_epoch = epoch;
        }

        let workers = threads::Workers::choose(self.spec_threads)?;
        // Allocates only when the thread count grows (a new runtime option).
        state
            .scratch
            .reserve(
                workers.threads(),
                plan.scratch_per_thread,
                plan.shared_scratch,
            )
            .map_err(|_| DelegateError::OutOfMemory {
                what: "scratch",
                bytes: scratch_bytes(workers.threads(), plan),
            })?;
        // The spans leave the state for the call: the steps see the state
        // only through a shared reference. Moving a Vec allocates nothing.
        let mut spans = std::mem::take(&mut state.events.spans);
        let result = {
            let state = &*state;
            workers.run(|| self.run_steps(state, clock, &mut spans))
        };
        state.events.spans = spans;
        result??;
        // The updates written into the other half become the states; the
        // states' half takes the next call's updates.
        for slot in plan.states.iter().filter(|slot| slot.swaps) {
            state.data.swap(slot.value, slot.update);
        }
        Ok(())
    }

    /// Every value's shape, stored or not, from the inputs' (already in
    /// `state.shapes`), each checked as the plan requires.
    fn derive_shapes(&self, state: &mut ExecState) -> Result<(), ArgError> {
        let plan = self.plan;
        for (node, unbroadcast) in plan.nodes.iter().zip(&plan.unbroadcast) {
            let out = node.op.output();
            let rank = plan.values[out].dims.len();
            state.shapes[out] = ops::infer_shape(&node.op, rank, |v| state.shapes[v])
                .and_then(|shape| {
                    ops::check_unbroadcast(unbroadcast, &plan.values, shape, |v| state.shapes[v])
                        .map(|()| shape)
                })
                .map_err(|reason| ArgError::Node {
                    id: node.id,
                    name: node.name.clone(),
                    reason,
                })?;
        }
        for slot in &plan.states {
            if state.shapes[slot.update] != state.shapes[slot.value] {
                return Err(ArgError::StateShape {
                    state: plan.values[slot.value].name.clone(),
                    got: state.shapes[slot.update].dims().to_vec(),
                    expected: state.shapes[slot.value].dims().to_vec(),
                });
            }
        }
        Ok(())
    }

    /// Checks argument `position` of kind `which` against value `v` and
    /// records its address; returns its shape.
    fn bind_arg(
        &self,
        state: &mut ExecState,
        args: &dyn CallArgs,
        which: &'static str,
        position: usize,
        v: usize,
    ) -> Result<Shape, ArgError> {
        let value = &self.plan.values[v];
        let arg = if which == "input" {
            position
        } else {
            self.plan.inputs.len() + position
        };
        let name = || value.name.clone();
        let t = args.tensor(arg).ok_or_else(|| ArgError::NotTensor {
            which,
            index: position,
            name: name(),
        })?;
        if t.dtype != Some(value.dtype) {
            return Err(ArgError::DType {
                which,
                index: position,
                name: name(),
                got: t.dtype.map_or("an unsupported dtype", DType::name),
                expected: value.dtype.name(),
            });
        }
        let fits = t.sizes.len() == value.dims.len()
            && t.sizes.iter().zip(&value.dims).all(|(&got, d)| {
                got >= 0
                    && if d.dynamic {
                        got as usize <= d.size
                    } else {
                        got as usize == d.size
                    }
            });
        if !fits {
            return Err(ArgError::Shape {
                which,
                index: position,
                name: name(),
                got: t.sizes.iter().map(|&d| d.into()).collect(),
                expected: describe_dims(value),
            });
        }
        if !t.contiguous {
            return Err(ArgError::Layout {
                which,
                index: position,
                name: name(),
            });
        }
        let mut dims = [0usize; MAX_RANK];
        for (d, &s) in dims.iter_mut().zip(t.sizes) {
            *d = s as usize;
        }
        let shape = Shape::new(&dims[..t.sizes.len()]);
        let bytes = shape.numel() * value.dtype.size();
        if t.nbytes != bytes {
            return Err(ArgError::Bytes {
                which,
                index: position,
                name: name(),
                got: t.nbytes,
                expected: bytes,
            });
        }
        if bytes > 0 && (t.data.is_null() || !(t.data as usize).is_multiple_of(value.dtype.size()))
        {
            return Err(ArgError::Pointer {
                which,
                index: position,
                name: name(),
            });
        }
        state.args[v] = t.data;
        if value.dtype == DType::F32 {
            state.data[v] = t.data;
        }
        Ok(shape)
    }

    /// Outputs are written through `&mut` slices, so no output may share
    /// memory with any other argument. ExecuTorch's planner never does that;
    /// this turns a host bug into an error instead of undefined behaviour.
    fn check_outputs_disjoint(&self, state: &ExecState) -> Result<(), ArgError> {
        let plan = self.plan;
        let range = |v: usize| {
            let start = state.args[v] as usize;
            (
                start,
                start + state.shapes[v].numel() * plan.values[v].dtype.size(),
            )
        };
        for (position, &out) in plan.outputs.iter().enumerate() {
            let (a0, a1) = range(out);
            for &other in plan.inputs.iter().chain(&plan.outputs) {
                let (b0, b1) = range(other);
                if other != out && a0 < b1 && b0 < a1 {
                    return Err(ArgError::Pointer {
                        which: "output (overlaps another argument)",
                        index: position,
                        name: plan.values[out].name.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    fn run_steps(
        &self,
        state: &ExecState,
        clock: Option<Clock>,
        spans: &mut [(u64, u64)],
    ) -> Result<(), DelegateError> {
        for &v in &self.plan.inputs {
            if self.plan.values[v].dtype == DType::F16 {
                // SAFETY: `args[v]` holds `numel` f16s (checked in bind_arg)
                // and `data[v]` is its f32 shadow, planned for the bound
                // shape in the arena; they do not overlap.
                unsafe { f16_to_f32(state.args[v], state.data[v], state.shapes[v].numel()) };
            }
        }
        for (step, span) in self.plan.steps.iter().zip(spans) {
            let start = clock.map(|now| now());
            self.run_step(step, state)
                .map_err(|source| ArgError::Kernel {
                    kernel: step.kernel,
                    name: step
                        .absorbed
                        .first()
                        .map_or(String::new(), |a| a.name.clone()),
                    source,
                })?;
            if let (Some(now), Some(start)) = (clock, start) {
                *span = (start, now());
            }
            for &v in &step.writes {
                if let (Role::Output(_), DType::F16) =
                    (&self.plan.values[v].role, self.plan.values[v].dtype)
                {
                    // SAFETY: as for the inputs above, in the other direction.
                    unsafe { f32_to_f16(state.data[v], state.args[v], state.shapes[v].numel()) };
                }
            }
        }
        for slot in self.plan.states.iter().filter(|slot| !slot.swaps) {
            // SAFETY: `data[update]` is the update's arena slot, live to the
            // end of the call (plan.rs), of `len` f32s (its shape equals the
            // state's, checked before the steps); `data[value]` is the
            // state's own range of the state buffer. Different buffers.
            let (from, to) = unsafe {
                (
                    std::slice::from_raw_parts(state.data[slot.update].cast::<f32>(), slot.len),
                    std::slice::from_raw_parts_mut(state.data[slot.value].cast::<f32>(), slot.len),
                )
            };
            if self.plan.values[slot.value].dtype == DType::F16 {
                // The model's buffer holds float16: round as its copy_ would.
                for (t, &f) in to.iter_mut().zip(from) {
                    *t = half::f16::from_f32(f).to_f32();
                }
            } else {
                to.copy_from_slice(from);
            }
        }
        Ok(())
    }

    /// Runs one step: its statistics, then its kind.
    fn run_step(&self, step: &Step, state: &ExecState) -> Result<(), KernelError> {
        // SAFETY: `data[v]` points to `shapes[v].numel()` f32s for every
        // value a step names (checked against nbytes and alignment for
        // arguments in `bind_arg`, against the segment for constants,
        // planned within the arena for intermediates), null for the
        // released constants no step reads; the plan keeps what a step
        // writes apart from what it reads (fusion.rs, plan.rs,
        // `check_outputs_disjoint`).
        let call =
            unsafe { Call::new(&state.shapes, &state.data, &state.scratch, state.generation) };
        // Each group's slices are dropped before a later group's or the main
        // loop's programs read them.
        for s in &step.statistics {
            match &s.kind {
                StatisticsKind::Reduce { dims, outputs, .. } => {
                    // At most one statistic per op (fusion.rs groups them so).
                    let mut stats = [None, None, None];
                    for (slot, &(op, v)) in stats.iter_mut().zip(outputs) {
                        *slot = Some(Statistic {
                            op,
                            out: call.out(v),
                        });
                    }
                    let mut stats = stats.map(|s| {
                        s.unwrap_or(Statistic {
                            op: kernels::fused::ReduceOp::Sum,
                            out: &mut [],
                        })
                    });
                    reduce(
                        &s.program,
                        &call,
                        dims,
                        &mut stats[..outputs.len()],
                        call.scratch,
                    )?;
                }
                StatisticsKind::Derived { value, .. } => materialise(
                    &ProgramRows::new(&s.program, &call),
                    call.out(*value),
                    call.row_len(*value),
                    call.scratch,
                ),
            }
        }
        step.exec.run(&call)
    }
}

/// # Safety
/// `src` holds `n` f16s, `dst` room for `n` f32s, and they do not overlap.
unsafe fn f16_to_f32(src: *const u8, dst: *mut u8, n: usize) {
    use half::slice::HalfFloatSliceExt;
    let src = std::slice::from_raw_parts(src.cast::<half::f16>(), n);
    let dst = std::slice::from_raw_parts_mut(dst.cast::<f32>(), n);
    par::zip_chunks(dst, src, |d, s| s.convert_to_f32_slice(d));
}

/// # Safety
/// `src` holds `n` f32s, `dst` room for `n` f16s, and they do not overlap.
unsafe fn f32_to_f16(src: *const u8, dst: *mut u8, n: usize) {
    use half::slice::HalfFloatSliceExt;
    let src = std::slice::from_raw_parts(src.cast::<f32>(), n);
    let dst = std::slice::from_raw_parts_mut(dst.cast::<half::f16>(), n);
    par::zip_chunks(dst, src, |d, s| d.convert_from_f32_slice(s));
}

fn bound_shape(plan: &Plan, v: usize) -> Shape {
    let mut dims = [0usize; MAX_RANK];
    let value = &plan.values[v];
    for (d, spec) in dims.iter_mut().zip(&value.dims) {
        *d = spec.size;
    }
    Shape::new(&dims[..value.dims.len()])
}

fn describe_dims(value: &ValueDesc) -> String {
    let dims: Vec<String> = value
        .dims
        .iter()
        .map(|d| {
            if d.dynamic {
                format!("<={}", d.size)
            } else {
                d.size.to_string()
            }
        })
        .collect();
    format!("[{}]", dims.join(", "))
}

/// The bytes of scratch a call on `threads` pool threads asks for (for the
/// error when they cannot be had; saturating, as a blob's sizes may
/// overflow).
fn scratch_bytes(threads: usize, plan: &Plan) -> usize {
    threads
        .saturating_add(1)
        .saturating_mul(plan.scratch_per_thread)
        .saturating_add(plan.shared_scratch)
        .saturating_mul(std::mem::size_of::<f32>())
}
