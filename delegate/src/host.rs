//! What the delegate needs from its host, ExecuTorch, below the cxx bridge
//! of the `BackendInterface` (ffi.rs): the error codes a call ends with
//! ([`Status`], and [`DelegateError::status`] mapping the typed errors onto
//! them) and ExecuTorch's log ([`log`]).
//!
//! Its own bridge, so that the modules that log or name a status (delegate,
//! options, ffi) depend on this one and not on ffi.rs, which depends on
//! them: no import circle (scripts/import_cycles.py checks). ffi.rs's bridge
//! names [`Status`] through `type Status = crate::host::Status`.

use crate::error::{BlobError, ConfigError, DelegateError, GraphError};
use rustconv_kernels::KernelError;

#[cxx::bridge(namespace = "rustconv::ffi")]
pub(crate) mod bridge {
    /// The ExecuTorch error a call ends with (mapped in backend.cpp).
    #[derive(Debug)]
    #[repr(u8)]
    enum Status {
        Ok,
        Internal,
        InvalidArgument,
        InvalidProgram,
        InvalidState,
        NotSupported,
        DelegateInvalidCompatibility,
        MemoryAllocationFailed,
    }

    #[repr(u8)]
    enum LogLevel {
        Debug,
        Info,
        Error,
    }

    unsafe extern "C++" {
        include!("rustconv-backend/cpp/backend.h");

        fn log(level: LogLevel, message: &str);
    }
}

pub(crate) use bridge::{LogLevel, Status};

/// Writes one line to ExecuTorch's log.
///
/// Only from the thread that called into the delegate: inside Python,
/// ExecuTorch forwards log lines to Python's logging, which takes the GIL that
/// the calling thread holds while it waits for the pool, so a log line from
/// one of the pool's own workers deadlocks. That is a bug, reported as a
/// panic (caught at the boundary) rather than a hang. (The calling thread
/// may itself be a member of the pool: see threads.rs.)
pub(crate) fn log(level: LogLevel, message: &str) {
    assert!(
        !crate::threads::is_worker(),
        "log from a kernel thread (would deadlock under Python): {message}"
    );
    bridge::log(level, message);
}

// Here rather than in error.rs, which knows nothing of the host.
impl DelegateError {
    /// The ExecuTorch error code this error is reported as.
    pub fn status(&self) -> Status {
        match self {
            DelegateError::Blob(BlobError::NewerVersion { .. }) => {
                Status::DelegateInvalidCompatibility
            }
            DelegateError::Graph(GraphError::UnknownOp { .. }) => {
                Status::DelegateInvalidCompatibility
            }
            DelegateError::Blob(_) | DelegateError::Graph(_) => Status::InvalidProgram,
            DelegateError::Config(ConfigError::ThreadPool { .. }) => Status::Internal,
            DelegateError::Config(_) | DelegateError::Arg(_) => Status::InvalidArgument,
            DelegateError::Unsupported(_) => Status::NotSupported,
            DelegateError::Prepare {
                source: KernelError::OutOfMemory { .. },
                ..
            } => Status::MemoryAllocationFailed,
            DelegateError::Prepare { .. } => Status::InvalidProgram,
            DelegateError::NotInitialized | DelegateError::Busy => Status::InvalidState,
            DelegateError::OutOfMemory { .. } => Status::MemoryAllocationFailed,
            DelegateError::Panic(_) => Status::Internal,
        }
    }
}
