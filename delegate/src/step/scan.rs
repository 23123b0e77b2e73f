//! A linear scan, from its schema table to its run: its description
//! ([`ScanOp`]: decoding, checks, shape inference, the step fusion builds)
//! and its step ([`ScanStep`]: the scan's kernel with its operands computed
//! by prologue programs (`a` and `u` together where they share terms) and
//! its epilogue, all in its loops).

use rustconv_kernels::fused::{EpilogueSink, ProgramRows, RowsIn, RowsOut};
use rustconv_kernels::{scan_rows_scratch, Isa, KernelError, LinearScan, ScanParams};
use rustconv_schema as fb;

use super::anchor::{AnchorOp, Decode, DecodeAnchor, Fused};
use super::call::Call;
use super::kind::{epilogue_temps, Epilogue, Source, StepKind};
use crate::error::GraphError;
use crate::shape::Shape;
use crate::value::ValueDesc;

/// A linear scan node: `y[t] = a[t] * y[t - 1] + u[t]` from `x0`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScanOp {
    pub x0: usize,
    pub a: usize,
    pub u: usize,
    pub output: usize,
}

/// Kernel parameters of a scan whose `a` has shape `shape`.
fn scan_params(shape: Shape) -> ScanParams {
    ScanParams {
        batch: shape[0],
        channels: shape[1],
        len: shape[2],
    }
}

impl DecodeAnchor for ScanOp {
    const SCHEMA: fb::Op = fb::Op::LinearScan;

    fn decode(d: &Decode) -> Result<Self, GraphError> {
        let s = d.table(d.node.op_as_linear_scan(), "LinearScan")?;
        Ok(ScanOp {
            x0: d.value("x0", s.x0())?,
            a: d.value("a", s.a())?,
            u: d.value("u", s.u())?,
            output: d.value("output", s.output())?,
        })
    }
}

impl AnchorOp for ScanOp {
    fn kind(&self) -> &'static str {
        "linear_scan"
    }

    fn inputs(&self) -> Vec<usize> {
        vec![self.x0, self.a, self.u]
    }

    fn output(&self) -> usize {
        self.output
    }

    fn check_static(&self, values: &[ValueDesc]) -> Result<(), String> {
        let rank = |v: usize, want: usize, what: &str| values[v].check_rank(want, what);
        rank(self.x0, 2, "x0")?;
        rank(self.a, 3, "a")?;
        rank(self.u, 3, "u")?;
        rank(self.output, 3, "output")
    }

    fn infer_shape(&self, shape_of: &dyn Fn(usize) -> Shape) -> Result<Shape, String> {
        let (x0, a, u) = (shape_of(self.x0), shape_of(self.a), shape_of(self.u));
        if a != u {
            return Err(format!(
                "a {:?} and u {:?} differ in shape",
                a.dims(),
                u.dims()
            ));
        }
        if x0.dims() != &a.dims()[..2] {
            return Err(format!(
                "x0 {:?} does not match the [batch, channels] of a {:?}",
                x0.dims(),
                a.dims()
            ));
        }
        Ok(a)
    }

    /// Every operand may be a prologue program; `a` and `u` computed
    /// together where they share subexpressions.
    fn build_step(&self, fused: Fused) -> Result<Box<dyn StepKind>, String> {
        let operands = fused.operands;
        let (a, u) = match (operands.source(self.a)?, operands.source(self.u)?) {
            (Source::Computed(_), Source::Computed(_)) => operands.paired(self.a, self.u)?,
            other => other,
        };
        Ok(Box::new(ScanStep {
            op: *self,
            kernel: LinearScan::new(Isa::detect()),
            x0: operands.source(self.x0)?,
            a,
            u,
            epilogue: fused.epilogue,
            result: fused.result,
        }))
    }
}

#[derive(Debug)]
pub struct ScanStep {
    op: ScanOp,
    /// The scan on the instruction set chosen when the plan was built, so
    /// that a run asks the CPU nothing.
    kernel: LinearScan,
    x0: Source,
    a: Source,
    u: Source,
    epilogue: Option<Epilogue>,
    /// The value the step stores: the scan's output, or the epilogue's.
    result: usize,
}

impl StepKind for ScanStep {
    fn algorithm(&self) -> &'static str {
        "parallel_scan"
    }

    fn loads(&self) -> Vec<usize> {
        let mut r: Vec<usize> = [&self.x0, &self.a, &self.u]
            .into_iter()
            .flat_map(Source::loads)
            .collect();
        r.extend(self.epilogue.iter().flat_map(|e| e.program.loads()));
        r
    }

    fn scratch_per_thread(&self) -> usize {
        let temps = [&self.x0, &self.a, &self.u]
            .into_iter()
            .map(Source::temporaries)
            .max()
            .unwrap_or(0);
        scan_rows_scratch(temps.max(epilogue_temps(&self.epilogue)))
    }

    fn summary(&self) -> String {
        let computed = [&self.x0, &self.a, &self.u]
            .iter()
            .filter(|s| matches!(s, Source::Computed(_) | Source::Paired))
            .count();
        let prologue = match computed {
            0 => String::new(),
            n => format!(", prologue of {n} operand(s) in its loops"),
        };
        let prologue = match (&self.a, &self.u) {
            (Source::Computed(p), Source::Paired) => format!(
                "{prologue}, a and u together ({} shared subexpression(s) once)",
                p.shared()
            ),
            _ => prologue,
        };
        let epilogue = if self.epilogue.is_some() {
            ", epilogue in its loops"
        } else {
            ""
        };
        prologue + epilogue
    }

    fn flops(&self, shapes: &[Shape]) -> Option<u64> {
        Some(2 * shapes[self.op.a].numel() as u64)
    }

    fn run(&self, call: &Call) -> Result<(), KernelError> {
        let params = scan_params(call.shape(self.op.a));
        if let (Source::Stored(x0), Source::Stored(a), Source::Stored(u), None) =
            (&self.x0, &self.a, &self.u, &self.epilogue)
        {
            return self.kernel.run(
                &params,
                call.view(*x0),
                call.view(*a),
                call.view(*u),
                call.out(self.result),
            );
        }
        let (r0, ra, ru) = (
            program_rows(&self.x0, call, true),
            program_rows(&self.a, call, false),
            program_rows(&self.u, call, false),
        );
        let sink;
        let y_out = match &self.epilogue {
            None => RowsOut::Slice(call.out(self.result)),
            Some(e) => {
                sink = EpilogueSink::new(
                    &e.program,
                    call,
                    call.shape(self.op.output),
                    &e.views,
                    call.out(self.result),
                    call.shape(self.result),
                );
                RowsOut::Fused(&sink)
            }
        };
        match (&ra, &self.u) {
            (Some(au), Source::Paired) => self.kernel.run_rows_pair(
                &params,
                rows_in(&self.x0, &r0, call),
                au,
                y_out,
                call.scratch,
            ),
            _ => self.kernel.run_rows(
                &params,
                rows_in(&self.x0, &r0, call),
                rows_in(&self.a, &ra, call),
                rows_in(&self.u, &ru, call),
                y_out,
                call.scratch,
            ),
        }
    }
}

/// The rows of a computed scan operand (`scalar`: one per row, `x0`).
fn program_rows<'a>(source: &'a Source, call: &'a Call, scalar: bool) -> Option<ProgramRows<'a>> {
    match source {
        Source::Stored(_) | Source::Paired => None,
        Source::Computed(p) if scalar => Some(ProgramRows::scalar_rows(p, call)),
        Source::Computed(p) => Some(ProgramRows::new(p, call)),
    }
}

/// A scan operand as the kernel takes it.
fn rows_in<'a>(source: &Source, rows: &'a Option<ProgramRows<'a>>, call: &'a Call) -> RowsIn<'a> {
    match (source, rows) {
        (Source::Stored(v), _) => RowsIn::Slice(call.view(*v)),
        (Source::Computed(_), Some(r)) => RowsIn::Fused(r),
        (Source::Computed(_), None) => unreachable!("computed sources have rows"),
        (Source::Paired, _) => unreachable!("a paired u is computed with a"),
    }
}
