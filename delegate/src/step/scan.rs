//! A linear scan step: the scan's kernel with its operands computed by
//! prologue programs (`a` and `u` together where they share terms) and its
//! epilogue, all in its loops.

use rustconv_kernels::fused::{EpilogueSink, ProgramRows, RowsIn, RowsOut};
use rustconv_kernels::{self as kernels, scan_rows_scratch, KernelError};

use super::call::Call;
use super::kind::{epilogue_temps, Epilogue, Source, StepKind};
use crate::graph::ScanOp;
use crate::ops;
use crate::shape::Shape;

#[derive(Debug)]
pub struct ScanStep {
    op: ScanOp,
    x0: Source,
    a: Source,
    u: Source,
    epilogue: Option<Epilogue>,
    /// The value the step stores: the scan's output, or the epilogue's.
    result: usize,
}

impl ScanStep {
    pub fn new(
        op: ScanOp,
        [x0, a, u]: [Source; 3],
        epilogue: Option<Epilogue>,
        result: usize,
    ) -> Self {
        ScanStep {
            op,
            x0,
            a,
            u,
            epilogue,
            result,
        }
    }
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
        let params = ops::scan_params(call.shape(self.op.a));
        if let (Source::Stored(x0), Source::Stored(a), Source::Stored(u), None) =
            (&self.x0, &self.a, &self.u, &self.epilogue)
        {
            return kernels::linear_scan_f32(
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
            (Some(au), Source::Paired) => kernels::linear_scan_rows_pair(
                &params,
                rows_in(&self.x0, &r0, call),
                au,
                y_out,
                call.scratch,
            ),
            _ => kernels::linear_scan_rows(
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
