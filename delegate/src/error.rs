//! Typed errors of the delegate. Each is mapped to the ExecuTorch error code
//! the FFI boundary returns by [`DelegateError::status`], in host.rs: this
//! module knows nothing of the host.

use rustconv_kernels::KernelError;

/// The blob's framing: header, flatbuffer and constant segment.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    #[error("blob is {len} bytes, shorter than its {needed}-byte header")]
    TooShort { len: usize, needed: usize },
    #[error("bad magic {found:?}: this is not a RustConv delegate blob")]
    BadMagic { found: [u8; 4] },
    #[error(
        "blob layout version {found} is newer than this runtime reads (up to {supported}): \
         update the runtime or re-export with a matching rustconv"
    )]
    NewerVersion { found: u32, supported: u32 },
    #[error("blob layout version 0 is invalid")]
    ZeroVersion,
    #[error("header size {0} is smaller than the 48-byte version 1 header")]
    HeaderSize(u32),
    #[error("{what} spans bytes {start}..{end} but the blob has {len}")]
    OutOfBounds {
        what: &'static str,
        start: u64,
        end: u64,
        len: usize,
    },
    #[error("constant segment offset {0} is not 64-byte aligned")]
    MisalignedSegment(u64),
    #[error("flatbuffer graph is {0} bytes, too short for a flatbuffer (at least 8)")]
    GraphTooShort(usize),
    #[error("flatbuffer graph does not carry the \"RCG1\" identifier")]
    Identifier,
    #[error("flatbuffer graph fails verification: {0}")]
    Flatbuffer(#[from] flatbuffers::InvalidFlatbuffer),
}

/// A graph that decodes but does not make sense.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error("{what} refers to value {index}, but the graph has {count} values")]
    BadValueIndex {
        what: String,
        index: i64,
        count: usize,
    },
    #[error("value {index} ('{name}'): {reason}")]
    BadValue {
        index: usize,
        name: String,
        reason: String,
    },
    #[error("node {id} ('{name}'): {reason}")]
    BadNode {
        id: u32,
        name: String,
        reason: String,
    },
    #[error(
        "node {id} ('{name}') has op kind {kind}, unknown to this runtime: update the runtime"
    )]
    UnknownOp { id: u32, name: String, kind: u8 },
    #[error("graph {what}: {reason}")]
    BadIo { what: &'static str, reason: String },
    #[error("fused kernel {index} (from '{name}') cannot run: {reason}")]
    BadKernel {
        index: u32,
        name: String,
        reason: String,
    },
}

/// A compile spec or runtime option the delegate cannot use.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("compile spec '{key}' has {len} bytes, expected {expected}")]
    SpecLength {
        key: String,
        len: usize,
        expected: usize,
    },
    #[error("num_threads must be between 1 and {max} (8 per core), got {got}")]
    NumThreads { got: i64, max: usize },
    #[error(
        "compile spec conv1d_algorithm='{0}' is not one of auto, measure, {names}",
        names = algorithm_names()
    )]
    Algorithm(String),
    #[error(
        "environment variable RUSTCONV_NUM_THREADS='{0}' is not a thread count from 1 to 8 per core"
    )]
    EnvThreads(String),
    #[error("environment variable RUSTCONV_THREADPOOL='{0}' is not 'executorch' or 'own'")]
    EnvThreadpool(String),
    #[error("cannot start a pool of {threads} threads: {source}")]
    ThreadPool {
        threads: usize,
        source: rayon::ThreadPoolBuildError,
    },
}

/// Inputs or outputs handed to `execute` that do not match the plan.
#[derive(Debug, thiserror::Error)]
pub enum ArgError {
    #[error("expected {expected} arguments ({inputs} inputs + {outputs} outputs), got {got}")]
    Count {
        expected: usize,
        inputs: usize,
        outputs: usize,
        got: usize,
    },
    #[error("{which} {index} ('{name}') is not a tensor")]
    NotTensor {
        which: &'static str,
        index: usize,
        name: String,
    },
    #[error("{which} {index} ('{name}') has dtype {got}, expected {expected}")]
    DType {
        which: &'static str,
        index: usize,
        name: String,
        got: &'static str,
        expected: &'static str,
    },
    #[error("{which} {index} ('{name}') has shape {got:?}, expected {expected}")]
    Shape {
        which: &'static str,
        index: usize,
        name: String,
        got: Vec<i64>,
        expected: String,
    },
    #[error("{which} {index} ('{name}') is not contiguous (non-default dim order)")]
    Layout {
        which: &'static str,
        index: usize,
        name: String,
    },
    #[error("{which} {index} ('{name}') has {got} bytes of data, expected {expected}")]
    Bytes {
        which: &'static str,
        index: usize,
        name: String,
        got: usize,
        expected: usize,
    },
    #[error("{which} {index} ('{name}') data pointer is null or not aligned for its dtype")]
    Pointer {
        which: &'static str,
        index: usize,
        name: String,
    },
    #[error("output {index} ('{name}') cannot be resized to {shape:?}")]
    Resize {
        index: usize,
        name: String,
        shape: Vec<i64>,
    },
    #[error("node {id} ('{name}'): {reason}")]
    Node {
        id: u32,
        name: String,
        reason: String,
    },
    #[error("the new value of state '{state}' has shape {got:?}, the state {expected:?}")]
    StateShape {
        state: String,
        got: Vec<usize>,
        expected: Vec<usize>,
    },
    /// A fused kernel's kernel refused the call (`kernel`: its index as
    /// recorded at export, `name`: its first op).
    #[error("fused kernel {kernel} ('{name}'): {source}")]
    Kernel {
        kernel: u32,
        name: String,
        source: KernelError,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum DelegateError {
    #[error(transparent)]
    Blob(#[from] BlobError),
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Arg(#[from] ArgError),
    #[error("{0} is not supported by this runtime yet")]
    Unsupported(String),
    #[error("execute called before a successful init")]
    NotInitialized,
    #[error("execute called while another execute of the same method is running")]
    Busy,
    #[error("node {id} ('{name}'): {source}")]
    Prepare {
        id: u32,
        name: String,
        source: KernelError,
    },
    #[error("the {what} needs {bytes} bytes, which could not be allocated")]
    OutOfMemory { what: &'static str, bytes: usize },
    #[error("internal error (panic): {0}")]
    Panic(String),
}

/// The algorithm names a compile spec may give, from the kernels' one list.
fn algorithm_names() -> String {
    rustconv_kernels::Algorithm::ALL
        .map(rustconv_kernels::Algorithm::name)
        .join(", ")
}
