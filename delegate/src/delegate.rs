//! The delegate instance ExecuTorch holds per lowered subgraph: compile specs
//! gathered, then `init` (validate the blob, build the plan, bind constants),
//! then any number of `execute` calls.

use std::sync::Mutex;

use crate::blob::{BlobBytes, BlobLayout};
use crate::error::DelegateError;
use crate::executor::{CallArgs, ExecState, Executable};
use crate::ffi::{log, LogLevel};
use crate::graph::GraphDesc;
use crate::memory::AlignedBuf;
use crate::options::CompileOptions;
use crate::plan::Plan;
use crate::threads;

#[derive(Default)]
pub struct Delegate {
    options: CompileOptions,
    option_error: Option<crate::error::ConfigError>,
    loaded: Option<Loaded>,
}

struct Loaded {
    plan: Plan,
    /// Kept alive because `state` points into its constant segment.
    _blob: BlobBytes,
    /// A copy of the constant segment, made only when the blob's segment is
    /// not aligned for in-place use (e.g. a .pte loaded into an unaligned
    /// buffer). `state` points into it when present.
    _constants_copy: Option<AlignedBuf>,
    state: Mutex<ExecState>,
}

impl Delegate {
    pub fn add_compile_spec(&mut self, key: &str, value: &[u8]) {
        // Reported by init, which has a way to fail.
        if let Err(e) = self.options.apply(key, value) {
            self.option_error.get_or_insert(e);
        }
    }

    pub fn init(&mut self, blob: BlobBytes) -> Result<(), DelegateError> {
        if let Some(e) = self.option_error.take() {
            return Err(e.into());
        }
        let bytes = blob.as_slice();
        let layout = BlobLayout::parse(bytes)?;
        let graph = GraphDesc::decode(bytes, &layout)?;

        let segment = &bytes[layout.constants.clone()];
        let copy = (!(segment.as_ptr() as usize).is_multiple_of(crate::blob::CONSTANT_ALIGNMENT))
            .then(|| AlignedBuf::from_bytes(segment));
        let constants: &[u8] = match &copy {
            // SAFETY: `from_bytes` filled `segment.len()` bytes of the buffer.
            Some(copy) => unsafe { std::slice::from_raw_parts(copy.as_ptr(), segment.len()) },
            None => segment,
        };
        // Kernel preparation may time candidates (`conv1d_algorithm=measure`):
        // do it on the pool execute will use.
        let pool = threads::pool(threads::resolve(self.options.num_threads)?)?;
        let plan = pool.install(|| Plan::build(graph, constants, &self.options))?;
        for line in &plan.report {
            log(LogLevel::Info, line);
        }
        let constants = constants.as_ptr();
        let state = ExecState::new(&plan, constants);
        self.loaded = Some(Loaded {
            plan,
            _blob: blob,
            _constants_copy: copy,
            state: Mutex::new(state),
        });
        Ok(())
    }

    pub fn execute(&self, args: &mut dyn CallArgs) -> Result<(), DelegateError> {
        let loaded = self.loaded.as_ref().ok_or(DelegateError::NotInitialized)?;
        // ExecuTorch never runs one method concurrently; refuse rather than wait
        // if a host does.
        let mut state = match loaded.state.try_lock() {
            Ok(state) => state,
            Err(std::sync::TryLockError::WouldBlock) => return Err(DelegateError::Busy),
            // A panic mid-call leaves nothing half-valid: every call rebinds.
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        };
        Executable {
            plan: &loaded.plan,
            spec_threads: self.options.num_threads,
        }
        .run(&mut state, args)
    }

    #[cfg(test)]
    pub(crate) fn plan(&self) -> Option<&Plan> {
        self.loaded.as_ref().map(|l| &l.plan)
    }
}
