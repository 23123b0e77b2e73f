//! Per-op semantics shared by planning (at the shapes' upper bounds) and
//! execution (at the actual shapes): which ranks and dtypes an op takes and
//! the shape it produces.

use rustconv_kernels::{Conv1dParams, ScanParams};

use crate::graph::{OpDesc, ValueDesc};
use crate::shape::Shape;

/// Checks what does not depend on runtime shapes: ranks, dtypes, which
/// operands must be constant-shaped. Errors are reasons, worded for a node.
pub fn check_static(op: &OpDesc, values: &[ValueDesc]) -> Result<(), String> {
    // Kernels compute in f32; float16 tensors are converted around them, so
    // one node's tensors must share a dtype.
    let dtype = values[op.output()].dtype;
    for v in op.inputs() {
        if values[v].dtype != dtype {
            return Err(format!(
                "'{}' is {} but the node's output is {}",
                values[v].name,
                values[v].dtype.name(),
                dtype.name()
            ));
        }
    }
    let rank = |v: usize, want: usize, what: &str| {
        let got = values[v].dims.len();
        if got == want {
            Ok(())
        } else {
            Err(format!(
                "{what} '{}' has rank {got}, expected {want}",
                values[v].name
            ))
        }
    };
    match *op {
        OpDesc::Conv1d {
            input,
            weight,
            bias,
            output,
            ..
        } => {
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
        }
        OpDesc::LinearScan { x0, a, u, output } => {
            rank(x0, 2, "x0")?;
            rank(a, 3, "a")?;
            rank(u, 3, "u")?;
            rank(output, 3, "output")?;
        }
    }
    Ok(())
}

/// Kernel parameters of a conv1d for the given input and weight shapes.
pub fn conv1d_params(op: &OpDesc, input: Shape, weight: Shape) -> Conv1dParams {
    let OpDesc::Conv1d {
        stride,
        pad_left,
        pad_right,
        dilation,
        groups,
        ..
    } = *op
    else {
        unreachable!("conv1d_params called on {op:?}")
    };
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

/// The output shape of `op` given the shapes of its operands, checking that
/// they fit together.
pub fn infer_shape(op: &OpDesc, shape_of: impl Fn(usize) -> Shape) -> Result<Shape, String> {
    match *op {
        OpDesc::Conv1d {
            input,
            weight,
            bias,
            groups,
            ..
        } => {
            let (x, w) = (shape_of(input), shape_of(weight));
            if x[1] != w[1] * groups {
                return Err(format!(
                    "input has {} channels but weight expects {} x {groups} groups",
                    x[1], w[1]
                ));
            }
            if let Some(b) = bias {
                if shape_of(b)[0] != w[0] {
                    return Err(format!(
                        "bias has {} entries for {} output channels",
                        shape_of(b)[0],
                        w[0]
                    ));
                }
            }
            let params = conv1d_params(op, x, w);
            let len = params.out_len().map_err(|e| e.to_string())?;
            Ok(Shape::new(&[x[0], w[0], len]))
        }
        OpDesc::LinearScan { x0, a, u, .. } => {
            let (x0, a, u) = (shape_of(x0), shape_of(a), shape_of(u));
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
    }
}

pub fn scan_params(shape: Shape) -> ScanParams {
    ScanParams {
        batch: shape[0],
        channels: shape[1],
        len: shape[2],
    }
}
