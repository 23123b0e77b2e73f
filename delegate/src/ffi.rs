//! The cxx bridge between ExecuTorch's C++ `BackendInterface`
//! (delegate/cpp/backend.cpp) and the Rust delegate.
//!
//! Every Rust function called from C++ catches panics and converts errors to
//! a [`Status`] after logging them through ExecuTorch's log: nothing
//! unwinds across the boundary and no exception is thrown. The status codes
//! and the log are the host interface in host.rs, below this module.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;

use crate::delegate::Delegate;
use crate::error::DelegateError;
use crate::executor::{ArgTensor, CallArgs};
use crate::graph::DType;
use crate::host::{log, LogLevel, Status};
use crate::profiling::{Clock, EventSink};

#[cxx::bridge(namespace = "rustconv::ffi")]
pub(crate) mod bridge {
    #[repr(u8)]
    enum DType {
        Float32,
        Float16,
        Unsupported,
    }

    extern "Rust" {
        type Delegate;
        fn delegate_new() -> Box<Delegate>;
        fn add_compile_spec(self: &mut Delegate, key: &str, value: &[u8]);
        #[cxx_name = "init"]
        fn ffi_init(self: &mut Delegate, blob: &[u8]) -> Status;
        fn keeps_blob(self: &Delegate) -> bool;
        #[cxx_name = "execute"]
        fn ffi_execute(
            self: &Delegate,
            args: Pin<&mut ExecuteArgs>,
            events: Pin<&mut KernelEventLog>,
        ) -> Status;
        fn set_num_threads(num_threads: i32) -> Status;
        fn reset_state();
    }

    unsafe extern "C++" {
        include!("rustconv-backend/cpp/backend.h");
        include!("rustconv-backend/src/host.rs.h");

        /// The host's error codes, shared with host.rs's bridge.
        type Status = crate::host::Status;

        type ExecuteArgs;
        fn len(self: &ExecuteArgs) -> usize;
        fn is_tensor(self: &ExecuteArgs, i: usize) -> bool;
        fn dtype(self: &ExecuteArgs, i: usize) -> DType;
        fn sizes(self: &ExecuteArgs, i: usize) -> &[i32];
        fn is_contiguous(self: &ExecuteArgs, i: usize) -> bool;
        fn nbytes(self: &ExecuteArgs, i: usize) -> usize;
        fn data_ptr(self: &ExecuteArgs, i: usize) -> *mut u8;
        fn resize(self: Pin<&mut ExecuteArgs>, i: usize, sizes: &[i32]) -> bool;

        type KernelEventLog;
        fn enabled(self: &KernelEventLog) -> bool;
        fn log_kernel(
            self: Pin<&mut KernelEventLog>,
            kernel: u32,
            start: u64,
            end: u64,
            metadata: &[u8],
        );
        fn current_ticks() -> u64;

        fn register_backend() -> bool;
    }

    unsafe extern "C++" {
        include!("rustconv-backend/cpp/scan_kernel.h");

        fn linear_scan_kernel_registered() -> bool;
    }
}

fn delegate_new() -> Box<Delegate> {
    Box::new(Delegate::default())
}

/// Runs `f`, turning an error or a panic into a logged [`Status`].
fn guarded(what: &str, f: impl FnOnce() -> Result<(), DelegateError>) -> Status {
    let error = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => return Status::Ok,
        Ok(Err(error)) => error,
        Err(payload) => DelegateError::Panic(panic_message(payload.as_ref())),
    };
    log(LogLevel::Error, &format!("{what} failed: {error}"));
    error.status()
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_owned()
    }
}

impl Delegate {
    fn ffi_init(&mut self, blob: &[u8]) -> Status {
        // SAFETY: backend.cpp frees the FreeableBuffer holding `blob` after
        // init only if `keeps_blob()` is false (nothing here reads it then);
        // otherwise it moves it into the handle that owns this Delegate,
        // declared before it, so the bytes stay valid and unmodified until
        // after the Delegate is dropped.
        let blob = unsafe { crate::blob::BlobBytes::new(blob.as_ptr(), blob.len()) };
        guarded("init", || self.init(blob))
    }

    fn ffi_execute(
        &self,
        args: Pin<&mut bridge::ExecuteArgs>,
        events: Pin<&mut bridge::KernelEventLog>,
    ) -> Status {
        guarded("execute", || {
            // One branch when no tracer is attached.
            if events.enabled() {
                self.execute_traced(&mut CxxArgs(args), Some(&mut TracerSink(events)))
            } else {
                self.execute(&mut CxxArgs(args))
            }
        })
    }
}

fn set_num_threads(num_threads: i32) -> Status {
    guarded("set_option(num_threads)", || {
        crate::threads::set_runtime_threads(num_threads).map_err(DelegateError::from)
    })
}

/// The execution context's event tracer, as the delegate reports to it.
struct TracerSink<'a>(Pin<&'a mut bridge::KernelEventLog>);

impl EventSink for TracerSink<'_> {
    fn clock(&self) -> Clock {
        bridge::current_ticks
    }

    fn log(&mut self, kernel: u32, start: u64, end: u64, metadata: &[u8]) {
        self.0.as_mut().log_kernel(kernel, start, end, metadata);
    }
}

/// The backend option `reset_state` (see state.rs).
fn reset_state() {
    crate::state::request_reset();
}

/// The same for hosts that cannot set backend options (ExecuTorch's Python
/// runtime, through ctypes: `rustconv.runtime.reset_state()`): every
/// RustConv delegate in the process restores its initial state before its
/// next call.
#[no_mangle]
pub extern "C" fn rustconv_reset_state() {
    crate::state::request_reset();
}

/// The delegate call's arguments, read through the C++ `ExecuteArgs`.
struct CxxArgs<'a>(Pin<&'a mut bridge::ExecuteArgs>);

impl CallArgs for CxxArgs<'_> {
    fn count(&self) -> usize {
        self.0.len()
    }

    fn tensor(&self, i: usize) -> Option<ArgTensor<'_>> {
        if i >= self.0.len() || !self.0.is_tensor(i) {
            return None;
        }
        Some(ArgTensor {
            dtype: match self.0.dtype(i) {
                bridge::DType::Float32 => Some(DType::F32),
                bridge::DType::Float16 => Some(DType::F16),
                _ => None,
            },
            sizes: self.0.sizes(i),
            contiguous: self.0.is_contiguous(i),
            nbytes: self.0.nbytes(i),
            data: self.0.data_ptr(i),
        })
    }

    fn resize(&mut self, i: usize, sizes: &[i32]) -> bool {
        self.0.as_mut().resize(i, sizes)
    }
}

/// Registers the backend with ExecuTorch. Called when the shared library
/// loads (see lib.rs) and by pte_runner, which links the rlib.
pub fn register() -> bool {
    bridge::register_backend()
}

/// Whether ExecuTorch has a `rustconv::linear_scan.out` kernel
/// (cpp/scan_kernel.cpp, registered with the backend), for scans no delegate
/// took: pte_runner checks it at start.
pub fn linear_scan_kernel_registered() -> bool {
    bridge::linear_scan_kernel_registered()
}

/// `python -m rustconv.inspect`'s entry point (loaded with ctypes): plans
/// the blob at `blob` (`blob_len` bytes) with the compile specs in
/// `specs_json` (see [`crate::inspect::parse_specs`]) and returns a
/// NUL-terminated JSON document `{"plan": ...}` or `{"error": "..."}`,
/// owned by the caller, who frees it with [`rustconv_free_string`]. Never
/// unwinds.
///
/// # Safety
/// `blob` and `specs_json` point to `blob_len` and `specs_len` readable
/// bytes (either may be null when its length is 0).
#[no_mangle]
pub unsafe extern "C" fn rustconv_inspect_plan(
    blob: *const u8,
    blob_len: usize,
    specs_json: *const u8,
    specs_len: usize,
) -> *mut std::ffi::c_char {
    let bytes = |p: *const u8, n: usize| -> &[u8] {
        if n == 0 {
            &[]
        } else {
            // SAFETY: the caller guarantees `n` readable bytes at `p`.
            unsafe { std::slice::from_raw_parts(p, n) }
        }
    };
    let (blob, specs) = (bytes(blob, blob_len), bytes(specs_json, specs_len));
    let result = catch_unwind(AssertUnwindSafe(|| {
        let specs = crate::inspect::parse_specs(specs)?;
        let doc = crate::inspect::describe(blob, &specs).map_err(|e| e.to_string())?;
        serde_json::to_string(&serde_json::json!({ "plan": doc })).map_err(|e| e.to_string())
    }));
    let json = match result {
        Ok(Ok(json)) => json,
        Ok(Err(message)) => serde_json::json!({ "error": message }).to_string(),
        Err(_) => serde_json::json!({ "error": "the planner panicked" }).to_string(),
    };
    // JSON text has no interior NUL (serde_json escapes control characters).
    std::ffi::CString::new(json).map_or(std::ptr::null_mut(), std::ffi::CString::into_raw)
}

/// Frees a string [`rustconv_inspect_plan`] returned.
///
/// # Safety
/// `s` came from [`rustconv_inspect_plan`] and is freed once (null is
/// ignored).
#[no_mangle]
pub unsafe extern "C" fn rustconv_free_string(s: *mut std::ffi::c_char) {
    if !s.is_null() {
        // SAFETY: `s` came from `CString::into_raw` (the caller's promise).
        drop(unsafe { std::ffi::CString::from_raw(s) });
    }
}
