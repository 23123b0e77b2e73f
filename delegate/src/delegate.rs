//! The delegate instance ExecuTorch holds per lowered subgraph: compile specs
//! gathered, then `init` (validate the blob, build the plan, bind constants),
//! then any number of `execute` calls.

use std::sync::Mutex;

use crate::blob::{BlobBytes, BlobLayout};
use crate::error::DelegateError;
use crate::executor::{CallArgs, ExecState, Executable};
use crate::graph::GraphDesc;
use crate::host::{log, LogLevel};
use crate::memory::AlignedBuf;
use crate::options::CompileOptions;
use crate::plan::Plan;
use crate::profiling::EventSink;
use crate::threads;

#[derive(Default)]
pub struct Delegate {
    options: CompileOptions,
    option_error: Option<crate::error::ConfigError>,
    loaded: Option<Loaded>,
}

struct Loaded {
    plan: Plan,
    /// Where `state` reads constants from: the blob's own segment (kept
    /// alive here) or a copy of the constants `execute` reads.
    constants: Constants,
    state: Mutex<ExecState>,
}

enum Constants {
    /// In place, in the blob's 64-byte aligned constant segment.
    InBlob(BlobBytes),
    /// Copied out, so the blob can be freed (see constants.rs).
    Retained(AlignedBuf),
}

impl Delegate {
    pub fn add_compile_spec(&mut self, key: &str, value: &[u8]) {
        // Reported by init, which has a way to fail.
        if let Err(e) = self.options.apply(key, value) {
            self.option_error.get_or_insert(e);
        }
    }

    /// Validates `blob`, builds the plan and binds the constants. Once this
    /// returns, the delegate reads `blob` again only if [`Self::keeps_blob`].
    pub fn init(&mut self, blob: BlobBytes) -> Result<(), DelegateError> {
        if let Some(e) = self.option_error.take() {
            return Err(e.into());
        }
        let bytes = blob.as_slice();
        let layout = BlobLayout::parse(bytes)?;
        let graph = GraphDesc::decode(bytes, &layout)?;
        let segment = &bytes[layout.constants.clone()];
        // Kernels read constants as f32 slices: an unaligned segment (a .pte
        // loaded into an unaligned buffer) is copied before planning.
        let aligned = (segment.as_ptr() as usize).is_multiple_of(crate::blob::CONSTANT_ALIGNMENT);
        let copy = (!aligned).then(|| AlignedBuf::from_bytes(segment));
        let segment: &[u8] = match &copy {
            // SAFETY: `from_bytes` filled `segment.len()` bytes of the buffer.
            Some(copy) => unsafe { std::slice::from_raw_parts(copy.as_ptr(), segment.len()) },
            None => segment,
        };
        // Kernel preparation may time candidates (`conv1d_algorithm=measure`):
        // do it on the pool execute will use.
        let workers = threads::Workers::choose(self.options.num_threads)?;
        let mut plan = workers.run(|| Plan::build(graph, segment, &self.options))??;
        plan.drop_unread_converted();
        let release = !aligned || plan.has_unread_constants();
        let retained = release.then(|| plan.retain_constants(segment));
        for line in &plan.report {
            log(LogLevel::Info, line);
        }
        if let Some(retained) = &retained {
            log(
                LogLevel::Info,
                &format!(
                    "constants: {} of {} bytes kept for execute; the blob is released",
                    retained.len(),
                    segment.len()
                ),
            );
        }
        drop(copy);
        let constants = match retained {
            Some(buf) => Constants::Retained(buf),
            None => Constants::InBlob(blob),
        };
        let base = match &constants {
            Constants::Retained(buf) => buf.as_ptr(),
            Constants::InBlob(blob) => blob.as_slice()[layout.constants].as_ptr(),
        };
        let state = ExecState::new(&plan, base)?;
        self.loaded = Some(Loaded {
            plan,
            constants,
            state: Mutex::new(state),
        });
        Ok(())
    }

    /// Whether the delegate still reads the blob passed to `init` (its
    /// constants in place). When false, the host may free the blob.
    pub fn keeps_blob(&self) -> bool {
        matches!(
            self.loaded,
            Some(Loaded {
                constants: Constants::InBlob(_),
                ..
            })
        )
    }

    pub fn execute(&self, args: &mut dyn CallArgs) -> Result<(), DelegateError> {
        self.execute_traced(args, None)
    }

    /// Like [`Self::execute`]; with a `sink` (the host attached an event
    /// tracer), times every fused kernel and reports them to it once the
    /// call succeeded, from this thread (see profiling.rs).
    pub fn execute_traced(
        &self,
        args: &mut dyn CallArgs,
        sink: Option<&mut dyn EventSink>,
    ) -> Result<(), DelegateError> {
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
        .run(&mut state, args, sink.as_ref().map(|s| s.clock()))?;
        if let Some(sink) = sink {
            state.report_events(&loaded.plan, sink);
        }
        Ok(())
    }

    #[cfg(test)]
    pub(crate) fn recorded_spans(&self) -> Vec<(u64, u64)> {
        let loaded = self.loaded.as_ref().expect("initialised");
        loaded.state.lock().unwrap().events.spans.clone()
    }

    #[cfg(test)]
    pub(crate) fn plan(&self) -> Option<&Plan> {
        self.loaded.as_ref().map(|l| &l.plan)
    }
}
