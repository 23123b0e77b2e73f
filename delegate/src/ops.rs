//! Per-op semantics shared by planning (at the shapes' upper bounds) and
//! execution (at the actual shapes): which ranks and dtypes an op takes and
//! the shape it produces.

use rustconv_kernels::fused::resolve_start;
use rustconv_kernels::{Conv1dParams, ScanParams, MAX_RANK};

use crate::graph::{Conv1dOp, DType, OpDesc, Operand, ScanOp, ValueDesc};
use crate::shape::Shape;

/// Checks what does not depend on runtime shapes: ranks, dtypes, which
/// operands must be constant-shaped. Errors are reasons, worded for a node.
pub fn check_static(op: &OpDesc, values: &[ValueDesc]) -> Result<(), String> {
    // Kernels compute in f32; float16 tensors are converted around them, so
    // one node's tensors must share a dtype (`Full`'s `like` is read for its
    // shape only).
    let out = op.output();
    let dtype: DType = values[out].dtype;
    let like = match *op {
        OpDesc::Full { like, .. } => Some(like),
        _ => None,
    };
    for v in op.inputs() {
        if Some(v) != like && values[v].dtype != dtype {
            return Err(format!(
                "'{}' is {} but the node's output is {}",
                values[v].name,
                values[v].dtype.name(),
                dtype.name()
            ));
        }
    }
    let rank_of = |v: usize| values[v].dims.len();
    let rank = |v: usize, want: usize, what: &str| {
        let got = rank_of(v);
        if got == want {
            Ok(())
        } else {
            Err(format!(
                "{what} '{}' has rank {got}, expected {want}",
                values[v].name
            ))
        }
    };
    let same_rank = |v: usize, what: &str| rank(v, rank_of(out), what);
    match *op {
        OpDesc::Conv1d(Conv1dOp {
            input,
            weight,
            bias,
            output,
            groups,
            ..
        }) => {
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
        }
        OpDesc::LinearScan(ScanOp { x0, a, u, output }) => {
            rank(x0, 2, "x0")?;
            rank(a, 3, "a")?;
            rank(u, 3, "u")?;
            rank(output, 3, "output")?;
        }
        OpDesc::Unary { input, .. } | OpDesc::Clamp { input, .. } => same_rank(input, "input")?,
        OpDesc::Binary { a, b, .. } => {
            for v in [a, b].into_iter().filter_map(Operand::value) {
                if rank_of(v) > rank_of(out) {
                    return Err(format!(
                        "operand '{}' has a higher rank than the output",
                        values[v].name
                    ));
                }
            }
        }
        OpDesc::Where { cond, a, b, .. } => {
            for v in [Operand::Value(cond), a, b]
                .into_iter()
                .filter_map(Operand::value)
            {
                if rank_of(v) > rank_of(out) {
                    return Err(format!(
                        "operand '{}' has a higher rank than the output",
                        values[v].name
                    ));
                }
            }
        }
        OpDesc::Full { like, .. } => same_rank(like, "like")?,
        OpDesc::Permute {
            input, ref perm, ..
        } => {
            same_rank(input, "input")?;
            let mut seen = [false; MAX_RANK];
            let valid = perm.len() == rank_of(out)
                && perm
                    .iter()
                    .all(|&p| p < perm.len() && !std::mem::replace(&mut seen[p], true));
            if !valid {
                return Err(format!(
                    "{perm:?} is not a permutation of {} dimensions",
                    rank_of(out)
                ));
            }
        }
        OpDesc::Slice { input, dim, .. } => {
            same_rank(input, "input")?;
            if dim >= rank_of(out) {
                return Err(format!(
                    "slice dimension {dim} of a rank-{} tensor",
                    rank_of(out)
                ));
            }
        }
        OpDesc::Reshape { .. } => {} // its map was checked when decoded
        OpDesc::Reduce { input, dims, .. } => {
            same_rank(input, "input")?;
            if let Some(d) = (rank_of(out)..MAX_RANK).find(|&d| dims[d]) {
                return Err(format!(
                    "reduce dimension {d} of a rank-{} tensor",
                    rank_of(out)
                ));
            }
        }
        OpDesc::Cat {
            ref inputs, dim, ..
        } => {
            for &v in inputs {
                same_rank(v, "cat input")?;
            }
            if dim >= rank_of(out) {
                return Err(format!(
                    "cat dimension {dim} of a rank-{} tensor",
                    rank_of(out)
                ));
            }
        }
    }
    Ok(())
}

/// A value's declared dimensions (upper bounds where dynamic).
fn describe(v: &ValueDesc) -> Vec<usize> {
    v.dims.iter().map(|d| d.size).collect()
}

/// Kernel parameters of a conv1d for the given input and weight shapes.
pub fn conv1d_params(op: &Conv1dOp, input: Shape, weight: Shape) -> Conv1dParams {
    let Conv1dOp {
        stride,
        pad_left,
        pad_right,
        dilation,
        groups,
        ..
    } = *op;
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

/// NumPy broadcasting of `shapes` (trailing dimensions aligned) into a
/// result of rank `rank`.
fn broadcast(rank: usize, shapes: impl Iterator<Item = Shape>) -> Result<Shape, String> {
    let mut dims = [1usize; MAX_RANK];
    for s in shapes {
        let lead = rank - s.rank();
        for (d, &size) in s.dims().iter().enumerate() {
            let have = &mut dims[lead + d];
            if *have == 1 {
                *have = size;
            } else if size != 1 && size != *have {
                return Err(format!(
                    "operands do not broadcast: size {size} against {} in dimension {}",
                    *have,
                    lead + d
                ));
            }
        }
    }
    Ok(Shape::new(&dims[..rank]))
}

/// Python's rule for a slice end: negative counts from the end, clamped.
fn resolve_end(end: i64, size: usize) -> usize {
    let size_i = size as i64;
    let e = if end < 0 {
        end.saturating_add(size_i)
    } else {
        end
    };
    e.clamp(0, size_i) as usize
}

/// The output shape of `op` given the shapes of its operands, checking that
/// they fit together. `rank` is the output's declared rank.
pub fn infer_shape(
    op: &OpDesc,
    rank: usize,
    shape_of: impl Fn(usize) -> Shape,
) -> Result<Shape, String> {
    match *op {
        OpDesc::Conv1d(
            conv @ Conv1dOp {
                input,
                weight,
                bias,
                groups,
                ..
            },
        ) => {
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
            let params = conv1d_params(&conv, x, w);
            let len = params.out_len().map_err(|e| e.to_string())?;
            Ok(Shape::new(&[x[0], w[0], len]))
        }
        OpDesc::LinearScan(ScanOp { x0, a, u, .. }) => {
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
        OpDesc::Unary { input, .. } | OpDesc::Clamp { input, .. } => Ok(shape_of(input)),
        OpDesc::Full { like, .. } => Ok(shape_of(like)),
        OpDesc::Binary { a, b, .. } => broadcast(
            rank,
            [a, b].into_iter().filter_map(Operand::value).map(&shape_of),
        ),
        OpDesc::Where { cond, a, b, .. } => broadcast(
            rank,
            [Operand::Value(cond), a, b]
                .into_iter()
                .filter_map(Operand::value)
                .map(&shape_of),
        ),
        OpDesc::Permute {
            input, ref perm, ..
        } => {
            // A fixed array: execute allocates nothing.
            let x = shape_of(input);
            let mut dims = [0usize; MAX_RANK];
            for (d, &p) in dims.iter_mut().zip(perm) {
                *d = x[p];
            }
            Ok(Shape::new(&dims[..perm.len()]))
        }
        OpDesc::Slice {
            input,
            dim,
            start,
            end,
            step,
            ..
        } => {
            let x = shape_of(input);
            let (s, e) = (resolve_start(start, x[dim]), resolve_end(end, x[dim]));
            Ok(x.with(dim, e.saturating_sub(s).div_ceil(step)))
        }
        OpDesc::Reshape { input, map, .. } => {
            let x = shape_of(input);
            let mut dims = [1usize; MAX_RANK];
            for (d, m) in map.iter().enumerate().take(rank) {
                if let Some(m) = m {
                    dims[d] = x[*m as usize];
                }
            }
            let out = Shape::new(&dims[..rank]);
            if out.numel() != x.numel() {
                return Err(format!(
                    "reshape of {:?} to {:?} (a dimension read as size 1 is not)",
                    x.dims(),
                    out.dims()
                ));
            }
            Ok(out)
        }
        OpDesc::Reduce { input, dims, .. } => {
            let mut x = shape_of(input);
            for d in (0..x.rank()).filter(|&d| dims[d]) {
                x = x.with(d, 1);
            }
            Ok(x)
        }
        OpDesc::Cat {
            ref inputs, dim, ..
        } => {
            let first = shape_of(inputs[0]);
            let mut total = 0;
            for &v in inputs {
                let s = shape_of(v);
                for d in (0..first.rank()).filter(|&d| d != dim) {
                    if s[d] != first[d] {
                        return Err(format!(
                            "cat inputs {:?} and {:?} differ outside dimension {dim}",
                            first.dims(),
                            s.dims()
                        ));
                    }
                }
                total += s[dim];
            }
            Ok(first.with(dim, total))
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
