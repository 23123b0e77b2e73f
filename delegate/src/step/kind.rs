//! What every step kind is asked ([`StepKind`]), and the operands and
//! context they are built from.

use rustconv_kernels::fused::{CompiledProgram, StoreView};
use rustconv_kernels::{KernelError, Weights};

use super::call::Call;

use crate::error::DelegateError;
use crate::options::CompileOptions;
use crate::shape::Shape;
use crate::value::ValueDesc;

/// An anchor operand: a stored value, or a program computing it.
#[derive(Debug)]
pub enum Source {
    Stored(usize),
    Computed(CompiledProgram),
    /// A scan's `u` computed by `a`'s program, as its second root: the two
    /// share subexpressions (`softplus(p)` in `exp(-softplus(p) * A)` and
    /// `softplus(p) * x`), which one evaluation computes once per chunk.
    Paired,
}

impl Source {
    /// The values its program loads (the value itself where stored).
    pub(super) fn loads(&self) -> Vec<usize> {
        match self {
            Source::Stored(v) => vec![*v],
            Source::Computed(p) => p.loads().collect(),
            Source::Paired => Vec::new(),
        }
    }

    /// Line-sized temporaries its program needs.
    pub(super) fn temporaries(&self) -> usize {
        match self {
            Source::Stored(_) | Source::Paired => 0,
            Source::Computed(p) => p.temporaries(),
        }
    }
}

/// What an anchor's output goes through before it is stored.
#[derive(Debug)]
pub struct Epilogue {
    /// Over the anchor output's coordinates, reading it as `Expr::Anchor`.
    pub program: CompiledProgram,
    /// Views from the program's result to the stored result, in order.
    pub views: Vec<StoreView>,
}

/// Line-sized temporaries an epilogue's sink needs (its result buffer too).
pub(super) fn epilogue_temps(epilogue: &Option<Epilogue>) -> usize {
    epilogue.as_ref().map_or(0, |e| 1 + e.program.temporaries())
}

/// What preparing a step may consult, at init.
pub struct Prepare<'a> {
    pub values: &'a [ValueDesc],
    /// A value's f32 data where it is a constant (converted from float16
    /// where stored so), `None` where it is fed at run time.
    pub constant: &'a dyn Fn(usize) -> Option<&'a [f32]>,
    pub options: &'a CompileOptions,
    /// Lines for the plan's log.
    pub report: &'a mut Vec<String>,
}

impl<'a> Prepare<'a> {
    /// How a kernel sees the weights `v`.
    pub(super) fn weights(&self, v: usize) -> Weights<'a> {
        match (self.constant)(v) {
            Some(w) => Weights::Constant(w),
            None => Weights::Fed,
        }
    }
}

/// A kind of step: built by `fusion`, prepared by `Plan::build`, run by the
/// executor.
pub trait StepKind: std::fmt::Debug + Send + Sync {
    /// Chooses how it runs, at init.
    fn prepare(&mut self, _ctx: &mut Prepare) -> Result<(), DelegateError> {
        Ok(())
    }

    /// Values it stores that fusion left unstored, first among its writes
    /// (buffers it stages through memory). After [`Self::prepare`].
    fn staged(&self) -> Vec<usize> {
        Vec::new()
    }

    /// The algorithm it runs, for logs, plans and the profiler.
    fn algorithm(&self) -> &'static str;

    /// Every value its loops load (stored or not).
    fn loads(&self) -> Vec<usize>;

    /// Scratch (f32 elements) it shares among its tasks.
    fn shared_scratch(&self) -> usize {
        0
    }

    /// Scratch (f32 elements) each thread needs.
    fn scratch_per_thread(&self) -> usize;

    /// What runs inside its loops and what goes through memory, as
    /// ", prologue in its loops, epilogue staged through memory" (empty
    /// where nothing is fused).
    fn summary(&self) -> String;

    /// Floating-point operations at this call's shapes, where counted.
    fn flops(&self, _shapes: &[Shape]) -> Option<u64> {
        None
    }

    /// Runs it for one call.
    fn run(&self, call: &Call) -> Result<(), KernelError>;
}
