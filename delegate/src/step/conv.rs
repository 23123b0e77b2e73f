//! A conv1d step: the conv's kernel with its prologue (the input computed
//! by a program) and epilogue fused in its loops, or staged through memory
//! where the algorithm chosen cannot take them.

use rustconv_kernels::fused::{drain, materialise, EpilogueSink, ProgramRows, RowsIn, RowsOut};
use rustconv_kernels::{self as kernels, Choice, KernelError, PreparedConv1d};

use super::call::Call;
use super::kind::{epilogue_temps, Epilogue, Prepare, Source, StepKind};
use crate::error::DelegateError;
use crate::graph::Conv1dOp;
use crate::ops;
use crate::shape::Shape;
use rustconv_kernels::fused::line_scratch;

#[derive(Debug)]
pub struct ConvStep {
    /// The conv's node (for errors and logs).
    node: usize,
    op: Conv1dOp,
    input: Source,
    epilogue: Option<Epilogue>,
    /// The value the step stores: the conv's output, or the epilogue's.
    result: usize,
    /// Chosen at init ([`StepKind::prepare`]).
    kernel: Option<Kernel>,
}

/// How the conv runs, chosen at init.
struct Kernel {
    /// Prepared for the node's largest shape: algorithm chosen, weights
    /// transformed where the algorithm wants it.
    prepared: Box<PreparedConv1d>,
    /// The algorithm cannot compute the input in its own loops: it is
    /// materialised first, into its value's arena slot.
    stage_input: bool,
    /// The algorithm cannot hand its output to the epilogue in its own
    /// loops: it is stored into the anchor's arena slot, then drained
    /// through the epilogue.
    stage_output: bool,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("algorithm", &self.prepared.algorithm())
            .field("stage_input", &self.stage_input)
            .field("stage_output", &self.stage_output)
            .finish()
    }
}

impl ConvStep {
    pub fn new(
        node: usize,
        op: Conv1dOp,
        input: Source,
        epilogue: Option<Epilogue>,
        result: usize,
    ) -> Self {
        ConvStep {
            node,
            op,
            input,
            epilogue,
            result,
            kernel: None,
        }
    }

    /// The epilogue `e` over the conv's output, storing the step's result.
    fn sink<'a>(&self, e: &'a Epilogue, call: &'a Call) -> EpilogueSink<'a> {
        EpilogueSink::new(
            &e.program,
            call,
            call.shape(self.op.output),
            &e.views,
            call.out(self.result),
            call.shape(self.result),
        )
    }

    fn kernel(&self) -> &Kernel {
        self.kernel
            .as_ref()
            .expect("a conv step is prepared at init (Plan::build)")
    }
}

impl StepKind for ConvStep {
    /// Chooses and prepares the conv's kernel for the node's largest shape,
    /// and logs the choice with the cost model's estimates so it can be
    /// checked.
    fn prepare(&mut self, ctx: &mut Prepare) -> Result<(), DelegateError> {
        let (nodes, values) = (ctx.nodes, ctx.values);
        let node = &nodes[self.node];
        let Conv1dOp { input, weight, .. } = self.op;
        let max = ops::conv1d_params(
            &self.op,
            values[input].bound_shape(),
            values[weight].bound_shape(),
        );
        let prepare_error = |source| DelegateError::Prepare {
            id: node.id,
            name: node.name.clone(),
            source,
        };
        // A weight fed at run time (an argument, or a value another step
        // computes) is read by every call; the kernel is told so and derives
        // nothing from it ahead.
        let weights = ctx.weights(weight);
        let candidates = kernels::applicable(&max, &weights);
        let choice = match ctx.options.conv1d_algorithm {
            Choice::Force(a) if !candidates.contains(&a) => {
                ctx.report.push(format!(
                    "node {} '{}': {} does not apply{}, choosing automatically",
                    node.id,
                    node.name,
                    a.name(),
                    if kernels::estimate_cost(a, &max).is_some() {
                        // It applies to the shape: not to fed weights.
                        " to a weight fed at run time"
                    } else {
                        ""
                    }
                ));
                Choice::Auto
            }
            choice => choice,
        };
        let prepared = PreparedConv1d::for_weights(&max, weights, choice).map_err(prepare_error)?;
        let estimates: Vec<String> = candidates
            .iter()
            .filter_map(|&a| {
                Some(format!(
                    "{} {:.3}",
                    a.name(),
                    kernels::estimate_cost(a, &max)? * 1e3
                ))
            })
            .collect();
        ctx.report.push(format!(
            "plan: node {} '{}' conv1d -> {}{} (estimated ms: {}; prepared {:.1} MiB)",
            node.id,
            node.name,
            prepared.algorithm().name(),
            if prepared.weights_fed() {
                ", weights fed at run time"
            } else {
                ""
            },
            estimates.join(", "),
            prepared.prepared_bytes() as f64 / (1 << 20) as f64
        ));
        self.kernel = Some(Kernel {
            stage_input: matches!(self.input, Source::Computed(_)) && !prepared.fuses_input(),
            stage_output: self.epilogue.is_some() && !prepared.fuses_output(),
            prepared: Box::new(prepared),
        });
        Ok(())
    }

    fn staged(&self) -> Vec<usize> {
        let k = self.kernel();
        [
            k.stage_output.then_some(self.op.output),
            k.stage_input.then_some(self.op.input),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    fn algorithm(&self) -> &'static str {
        self.kernel().prepared.algorithm().name()
    }

    fn loads(&self) -> Vec<usize> {
        let mut r = self.input.loads();
        if self.kernel().prepared.reads_weights() {
            r.push(self.op.weight);
        }
        r.extend(self.op.bias);
        r.extend(self.epilogue.iter().flat_map(|e| e.program.loads()));
        r
    }

    fn shared_scratch(&self) -> usize {
        self.kernel().prepared.shared_scratch()
    }

    fn scratch_per_thread(&self) -> usize {
        let k = self.kernel();
        let (x, y) = (self.input.temporaries(), epilogue_temps(&self.epilogue));
        let staged_x = if k.stage_input { x } else { 0 };
        let staged_y = if k.stage_output { y } else { 0 };
        let staged = line_scratch(staged_x.max(staged_y));
        let fused = k
            .prepared
            .rows_scratch_per_thread(x - staged_x, y - staged_y);
        staged.max(fused)
    }

    fn summary(&self) -> String {
        let k = self.kernel();
        let part = |what: &str, present: bool, staged: bool| match (present, staged) {
            (false, _) => String::new(),
            (true, false) => format!(", {what} in its loops"),
            (true, true) => format!(", {what} staged through memory"),
        };
        part(
            "prologue",
            matches!(self.input, Source::Computed(_)),
            k.stage_input,
        ) + &part("epilogue", self.epilogue.is_some(), k.stage_output)
    }

    fn flops(&self, shapes: &[Shape]) -> Option<u64> {
        let p = ops::conv1d_params(&self.op, shapes[self.op.input], shapes[self.op.weight]);
        p.out_len().ok().map(|out_len| {
            2 * (p.batch * p.out_channels * out_len * (p.in_channels / p.groups.max(1))) as u64
                * p.kernel_size as u64
        })
    }

    fn run(&self, call: &Call) -> Result<(), KernelError> {
        let k = self.kernel();
        let Conv1dOp {
            input: x,
            weight,
            bias,
            output,
            ..
        } = self.op;
        let params = ops::conv1d_params(&self.op, call.shape(x), call.shape(weight));
        // A kernel that does not read the weights (an FFT's spectra are
        // prepared) is not given them: the plan may have released them.
        let w = k.prepared.reads_weights().then(|| call.view(weight));
        let b = bias.map(|b| call.view(b));
        let source;
        let (x_in, x_temps) = match &self.input {
            Source::Paired => unreachable!("only a scan's u is paired"),
            Source::Stored(v) => (RowsIn::Slice(call.view(*v)), 0),
            Source::Computed(p) if k.stage_input => {
                materialise(
                    &ProgramRows::new(p, call),
                    call.out(x),
                    call.row_len(x),
                    call.scratch,
                );
                (RowsIn::Slice(call.view(x)), 0)
            }
            Source::Computed(p) => {
                source = ProgramRows::new(p, call);
                (RowsIn::Fused(&source), p.temporaries())
            }
        };
        let sink;
        let (y_out, y_temps) = match &self.epilogue {
            None => (RowsOut::Slice(call.out(self.result)), 0),
            Some(_) if k.stage_output => (RowsOut::Slice(call.out(output)), 0),
            Some(e) => {
                sink = self.sink(e, call);
                (RowsOut::Fused(&sink), 1 + e.program.temporaries())
            }
        };
        k.prepared
            .run_rows(&params, x_in, w, b, y_out, x_temps, y_temps, call.scratch)?;
        if let (Some(e), true) = (&self.epilogue, k.stage_output) {
            drain(
                &self.sink(e, call),
                call.view(output),
                call.row_len(output),
                call.scratch,
            );
        }
        Ok(())
    }
}
