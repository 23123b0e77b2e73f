//! A conv1d, from its schema table to its run: its description
//! ([`Conv1dOp`]: decoding, checks, shape inference, the step fusion builds)
//! and its step ([`ConvStep`]: the conv's kernel with its prologue (the
//! input computed by a program) and epilogue fused in its loops, or staged
//! through memory where the algorithm chosen cannot take them).

use rustconv_kernels::fused::{
    drain, line_scratch, materialise, EpilogueSink, ProgramRows, RowsIn, RowsOut,
};
use rustconv_kernels::{self as kernels, Choice, Conv1dParams, KernelError, PreparedConv1d};
use rustconv_schema as fb;

use super::anchor::{AnchorOp, Decode, DecodeAnchor, Fused};
use super::call::Call;
use super::kind::{epilogue_temps, Epilogue, Prepare, Source, StepKind};
use crate::error::{DelegateError, GraphError};
use crate::shape::Shape;
use crate::value::ValueDesc;

/// A conv1d node: its operand values and parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Conv1dOp {
    pub input: usize,
    pub weight: usize,
    pub bias: Option<usize>,
    pub output: usize,
    pub stride: usize,
    pub pad_left: usize,
    pub pad_right: usize,
    pub dilation: usize,
    pub groups: usize,
}

impl Conv1dOp {
    /// Kernel parameters for the given input and weight shapes.
    pub fn params(&self, input: Shape, weight: Shape) -> Conv1dParams {
        let Conv1dOp {
            stride,
            pad_left,
            pad_right,
            dilation,
            groups,
            ..
        } = *self;
        Conv1dParams {
            batch: input[0],
            in_channels: input[1],
            out_channels: weight[0],
            in_len: input[2],
            kernel_size: weight[2],
            stride,
            pad_left,
            pad_right,
            dilation,
            groups,
        }
    }
}

impl DecodeAnchor for Conv1dOp {
    const SCHEMA: fb::Op = fb::Op::Conv1d;

    fn decode(d: &Decode) -> Result<Self, GraphError> {
        let c = d.table(d.node.op_as_conv_1d(), "Conv1d")?;
        Ok(Conv1dOp {
            input: d.value("input", c.input())?,
            weight: d.value("weight", c.weight())?,
            bias: d.optional("bias", c.bias())?,
            output: d.value("output", c.output())?,
            stride: c.stride() as usize,
            pad_left: c.pad_left() as usize,
            pad_right: c.pad_right() as usize,
            dilation: c.dilation() as usize,
            groups: c.groups() as usize,
        })
    }
}

impl AnchorOp for Conv1dOp {
    fn kind(&self) -> &'static str {
        "conv1d"
    }

    fn inputs(&self) -> Vec<usize> {
        [Some(self.input), Some(self.weight), self.bias]
            .into_iter()
            .flatten()
            .collect()
    }

    fn output(&self) -> usize {
        self.output
    }

    fn check_static(&self, values: &[ValueDesc]) -> Result<(), String> {
        let Conv1dOp {
            input,
            weight,
            bias,
            output,
            groups,
            ..
        } = *self;
        let rank = |v: usize, want: usize, what: &str| values[v].check_rank(want, what);
        rank(input, 3, "input")?;
        rank(weight, 3, "weight")?;
        rank(output, 3, "output")?;
        if let Some(b) = bias {
            rank(b, 1, "bias")?;
        }
        for v in [Some(weight), bias].into_iter().flatten() {
            if values[v].dims.iter().any(|d| d.dynamic) {
                return Err(format!("'{}' must have a static shape", values[v].name));
            }
        }
        if values[input].dims[1].dynamic {
            return Err("the input's channel dimension must be static".into());
        }
        // What the kernels will read of the weight and bias, from the
        // declared shapes (the weight's bytes are its shape's, checked
        // when it was decoded): `[out_channels, in_channels / groups, K]`
        // and `[out_channels]`.
        let size = |v: usize, d: usize| values[v].dims[d].size;
        let (w, x) = (&values[weight], &values[input]);
        if groups == 0 || size(input, 1) != size(weight, 1).saturating_mul(groups) {
            return Err(format!(
                "weight '{}' {:?} does not fit input '{}' of {} channels in {groups} group(s): \
                 it needs [out_channels, {} / {groups}, kernel_size]",
                w.name,
                describe(w),
                x.name,
                size(input, 1),
                size(input, 1)
            ));
        }
        if size(weight, 0) == 0 || size(weight, 2) == 0 {
            return Err(format!(
                "weight '{}' {:?} has no output channel or no tap",
                w.name,
                describe(w)
            ));
        }
        if let Some(b) = bias {
            if size(b, 0) != size(weight, 0) {
                return Err(format!(
                    "bias '{}' has {} entries for the {} output channels of weight '{}'",
                    values[b].name,
                    size(b, 0),
                    size(weight, 0),
                    w.name
                ));
            }
        }
        Ok(())
    }

    fn infer_shape(&self, shape_of: &dyn Fn(usize) -> Shape) -> Result<Shape, String> {
        let (x, w) = (shape_of(self.input), shape_of(self.weight));
        let groups = self.groups;
        if x[1] != w[1] * groups {
            return Err(format!(
                "input has {} channels but weight expects {} x {groups} groups",
                x[1], w[1]
            ));
        }
        if let Some(b) = self.bias {
            if shape_of(b)[0] != w[0] {
                return Err(format!(
                    "bias has {} entries for {} output channels",
                    shape_of(b)[0],
                    w[0]
                ));
            }
        }
        let len = self.params(x, w).out_len().map_err(|e| e.to_string())?;
        Ok(Shape::new(&[x[0], w[0], len]))
    }

    /// The weight and bias are read whole by every row: they come stored
    /// from outside the kernel; the input may be a prologue program.
    fn build_step(&self, fused: Fused) -> Result<Box<dyn StepKind>, String> {
        let operands = fused.operands;
        for v in [Some(self.weight), self.bias].into_iter().flatten() {
            if !operands.stored_outside(v) {
                return Err(format!(
                    "the conv's weight or bias '{}' is computed inside the kernel; \
                     it must be a constant or come from outside",
                    operands.name(v)
                ));
            }
        }
        Ok(Box::new(ConvStep {
            node: (fused.id, fused.name.to_owned()),
            op: *self,
            input: operands.source(self.input)?,
            epilogue: fused.epilogue,
            result: fused.result,
            kernel: None,
        }))
    }
}

/// A value's declared dimensions (upper bounds where dynamic).
fn describe(v: &ValueDesc) -> Vec<usize> {
    v.dims.iter().map(|d| d.size).collect()
}

#[derive(Debug)]
pub struct ConvStep {
    /// The conv's node id and name (for errors and logs).
    node: (u32, String),
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
        let values = ctx.values;
        let (id, name) = (self.node.0, self.node.1.as_str());
        let Conv1dOp { input, weight, .. } = self.op;
        let max = self
            .op
            .params(values[input].bound_shape(), values[weight].bound_shape());
        let prepare_error = |source| DelegateError::Prepare {
            id,
            name: name.to_owned(),
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
                    id,
                    name,
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
            id,
            name,
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
        let p = self
            .op
            .params(shapes[self.op.input], shapes[self.op.weight]);
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
        let params = self.op.params(call.shape(x), call.shape(weight));
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
