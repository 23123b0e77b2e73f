//! Runs a [`Plan`]: checks the call's tensors against it, derives every shape
//! from the actual inputs, sizes the outputs and runs the kernels, without
//! heap allocation (everything per-call lives in [`ExecState`], sized at init).

use std::sync::Arc;

use rayon::ThreadPool;
use rustconv_kernels::{self as kernels, Scratch};

use crate::error::{ArgError, DelegateError};
use crate::graph::{DType, OpDesc, Role, ValueDesc, MAX_RANK};
use crate::memory::AlignedBuf;
use crate::ops;
use crate::plan::{Kernel, Location, Plan};
use crate::shape::Shape;
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
    /// Where kernels read and write each value as f32 this call.
    data: Vec<*mut u8>,
    /// The call's own tensor for each input and output value (for float16
    /// values, distinct from its f32 shadow in `data`).
    args: Vec<*mut u8>,
    /// Owns the memory that intermediates' entries of `data` point into.
    _arena: AlignedBuf,
    /// Per-thread kernel scratch (FFT buffers and the like), sized for the
    /// plan and the pool.
    scratch: Scratch,
    pool: Option<(usize, std::thread::ThreadId, Arc<ThreadPool>)>,
}

// SAFETY: the raw pointers in `data` are only written and read inside one
// `execute`, with the state locked, and point into buffers that outlive that
// call (the arena owned here, the constants owned by the delegate, the call's
// tensors); nothing keeps them across calls. During the kernels the state is
// only read (the pool's threads see it through a shared reference).
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
    pub fn new(plan: &Plan, constants: *const u8) -> Self {
        let converted = plan.converted.as_ptr();
        let mut arena = AlignedBuf::zeroed(plan.arena_bytes);
        let arena_base = arena.as_mut_ptr();
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
                // Never viewed: the step that names it does not read it.
                Location::Released => {
                    shapes[v] = bound_shape(plan, v);
                    std::ptr::null_mut()
                }
                Location::Arg(_) => std::ptr::null_mut(),
            })
            .collect();
        ExecState {
            shapes,
            args: vec![std::ptr::null_mut(); data.len()],
            data,
            _arena: arena,
            scratch: Scratch::default(),
            pool: None,
        }
    }
}

/// Everything `execute` reads but never changes.
pub struct Executable<'a> {
    pub plan: &'a Plan,
    pub spec_threads: Option<usize>,
}

impl Executable<'_> {
    pub fn run(&self, state: &mut ExecState, args: &mut dyn CallArgs) -> Result<(), DelegateError> {
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
        for (position, &v) in plan.inputs.iter().enumerate() {
            state.shapes[v] = self.bind_arg(state, args, "input", position, v)?;
        }

        for step in &plan.steps {
            let node = &step.node;
            let out = node.op.output();
            let shape = ops::infer_shape(&node.op, |v| state.shapes[v]).map_err(|reason| {
                ArgError::Node {
                    id: node.id,
                    name: node.name.clone(),
                    reason,
                }
            })?;
            state.shapes[out] = shape;
            if let Role::Output(position) = plan.values[out].role {
                let (sizes, rank) = crate::shape::to_i32(shape);
                if !args.resize(n_in + position, &sizes[..rank]) {
                    return Err(ArgError::Resize {
                        index: position,
                        name: plan.values[out].name.clone(),
                        shape: shape.dims().iter().map(|&d| d as i64).collect(),
                    }
                    .into());
                }
                self.bind_arg(state, args, "output", position, out)?;
            }
        }
        self.check_outputs_disjoint(state)?;

        let threads = threads::resolve(self.spec_threads)?;
        // Pools belong to the calling thread (see threads.rs).
        let caller = std::thread::current().id();
        let pool = match &state.pool {
            Some((n, owner, pool)) if *n == threads && *owner == caller => pool.clone(),
            _ => {
                // Only when the thread count or the calling thread changes
                // (first call, a new runtime option): the one time execute
                // may allocate.
                let pool = threads::pool(threads)?;
                state.scratch.reserve(threads, plan.scratch_per_thread);
                state.pool = Some((threads, caller, pool.clone()));
                pool
            }
        };
        pool.install(|| self.run_steps(state))
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

    fn run_steps(&self, state: &ExecState) -> Result<(), DelegateError> {
        for &v in &self.plan.inputs {
            if self.plan.values[v].dtype == DType::F16 {
                // SAFETY: `args[v]` holds `numel` f16s (checked in bind_arg)
                // and `data[v]` is its f32 shadow, planned for the bound
                // shape in the arena; they do not overlap.
                unsafe { f16_to_f32(state.args[v], state.data[v], state.shapes[v].numel()) };
            }
        }
        for step in &self.plan.steps {
            let node = &step.node;
            let kernel_error = |source| ArgError::Kernel {
                id: node.id,
                name: node.name.clone(),
                source,
            };
            let view = |v: usize| -> &[f32] {
                // SAFETY: `data[v]` points to `shapes[v].numel()` f32s: checked
                // against nbytes and alignment for arguments, against the
                // segment for constants, and planned within the arena for
                // intermediates. Values read by one step are never written by it.
                unsafe {
                    std::slice::from_raw_parts(state.data[v] as *const f32, state.shapes[v].numel())
                }
            };
            let out = node.op.output();
            // SAFETY: as for `view`; in addition the output's bytes overlap no
            // operand of this step (arena: lifetimes overlap so the planner
            // separated them; arguments: check_outputs_disjoint), so this is
            // the only live reference to them.
            let y = unsafe {
                std::slice::from_raw_parts_mut(
                    state.data[out] as *mut f32,
                    state.shapes[out].numel(),
                )
            };
            match (&step.kernel, &node.op) {
                (
                    Kernel::Conv1d(prepared),
                    &OpDesc::Conv1d {
                        input,
                        weight,
                        bias,
                        ..
                    },
                ) => {
                    let params =
                        ops::conv1d_params(&node.op, state.shapes[input], state.shapes[weight]);
                    let released = self.plan.locations[weight] == Location::Released;
                    prepared
                        .run(
                            &params,
                            view(input),
                            (!released).then(|| view(weight)),
                            bias.map(view),
                            y,
                            &state.scratch,
                        )
                        .map_err(kernel_error)?;
                }
                (Kernel::LinearScan, &OpDesc::LinearScan { x0, a, u, .. }) => {
                    let params = ops::scan_params(state.shapes[a]);
                    kernels::linear_scan_f32(&params, view(x0), view(a), view(u), y)
                        .map_err(kernel_error)?;
                }
                (kernel, op) => unreachable!("plan paired {kernel:?} with {op:?}"),
            }
            if let (Role::Output(_), DType::F16) =
                (&self.plan.values[out].role, self.plan.values[out].dtype)
            {
                // SAFETY: as for the inputs above, in the other direction.
                unsafe { f32_to_f16(state.data[out], state.args[out], state.shapes[out].numel()) };
            }
        }
        Ok(())
    }
}

/// Chunk of a float16 conversion each task handles.
const CONVERT_CHUNK: usize = 1 << 14;

/// # Safety
/// `src` holds `n` f16s, `dst` room for `n` f32s, and they do not overlap.
unsafe fn f16_to_f32(src: *const u8, dst: *mut u8, n: usize) {
    use half::slice::HalfFloatSliceExt;
    use rayon::prelude::*;
    let src = std::slice::from_raw_parts(src.cast::<half::f16>(), n);
    let dst = std::slice::from_raw_parts_mut(dst.cast::<f32>(), n);
    src.par_chunks(CONVERT_CHUNK)
        .zip(dst.par_chunks_mut(CONVERT_CHUNK))
        .for_each(|(s, d)| s.convert_to_f32_slice(d));
}

/// # Safety
/// `src` holds `n` f32s, `dst` room for `n` f16s, and they do not overlap.
unsafe fn f32_to_f16(src: *const u8, dst: *mut u8, n: usize) {
    use half::slice::HalfFloatSliceExt;
    use rayon::prelude::*;
    let src = std::slice::from_raw_parts(src.cast::<f32>(), n);
    let dst = std::slice::from_raw_parts_mut(dst.cast::<half::f16>(), n);
    dst.par_chunks_mut(CONVERT_CHUNK)
        .zip(src.par_chunks(CONVERT_CHUNK))
        .for_each(|(d, s)| d.convert_from_f32_slice(s));
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
