//! Per-op semantics shared by planning (at the shapes' upper bounds) and
//! execution (at the actual shapes): which ranks and dtypes an op takes and
//! the shape it produces. An anchor op answers for itself (`AnchorOp` in
//! `step/`); the arms here are the non-anchor ops'.

use rustconv_kernels::fused::resolve_start;
use rustconv_kernels::MAX_RANK;

use crate::graph::{DType, OpDesc, Operand, ValueDesc};
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
    let rank = |v: usize, want: usize, what: &str| values[v].check_rank(want, what);
    let same_rank = |v: usize, what: &str| rank(v, rank_of(out), what);
    match *op {
        OpDesc::Anchor(ref anchor) => anchor.check_static(values)?,
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
        // Their map or sizes were checked when decoded.
        OpDesc::Reshape { .. } | OpDesc::Regroup { .. } => {}
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

/// Whether elementwise operand `v` was exported with the shape of the
/// node's result `out` (the same declared dims, static sizes and dynamic
/// bounds alike): fusion then reads it with no broadcast, so every call
/// must give it the result's shape ([`check_unbroadcast`]).
pub fn declared_same_shape(values: &[ValueDesc], v: usize, out: usize) -> bool {
    values[v].dims == values[out].dims
}

/// The operands of an elementwise node that every call must give its
/// result's shape: those exported with it ([`declared_same_shape`]), which
/// fusion reads element for element. Decided once, when the plan is built
/// ([`check_unbroadcast`] runs on every call).
pub fn unbroadcast_operands(op: &OpDesc, values: &[ValueDesc]) -> Vec<usize> {
    let (out, operands) = match *op {
        OpDesc::Binary { a, b, output, .. } => (output, [a, b, Operand::Scalar(0.0)]),
        OpDesc::Where { cond, a, b, output } => (output, [Operand::Value(cond), a, b]),
        _ => return Vec::new(),
    };
    operands
        .into_iter()
        .filter_map(Operand::value)
        .filter(|&v| declared_same_shape(values, v, out))
        .collect()
}

/// Refuses a call whose elementwise operand broadcasts where the exported
/// program had none: one of the node's [`unbroadcast_operands`] given
/// another shape than the result's, such as a length of 1 against 64 along
/// a dimension both share as one dynamic size. NumPy's rules would accept
/// it, but the fused programs read such an operand element for element (a
/// fuzzed call read past its end).
pub fn check_unbroadcast(
    operands: &[usize],
    values: &[ValueDesc],
    shape: Shape,
    shape_of: impl Fn(usize) -> Shape,
) -> Result<(), String> {
    match operands.iter().find(|&&v| shape_of(v) != shape) {
        None => Ok(()),
        Some(&v) => Err(format!(
            "operand '{}' has shape {:?} where the exported program has its result's {:?} \
             (a broadcast the export did not have)",
            values[v].name,
            shape_of(v).dims(),
            shape.dims()
        )),
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
        OpDesc::Anchor(ref anchor) => anchor.infer_shape(&shape_of),
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
        OpDesc::Regroup { input, dims, .. } => {
            let x = shape_of(input);
            let known: usize = dims[..rank].iter().flatten().product();
            let mut out = [1usize; MAX_RANK];
            for (o, d) in out.iter_mut().zip(&dims[..rank]) {
                // The dynamic dimension: what the static ones leave.
                *o = d.unwrap_or(x.numel().checked_div(known).unwrap_or(0));
            }
            let out = Shape::new(&out[..rank]);
            if out.numel() != x.numel() {
                return Err(format!(
                    "reshape of {:?} into sizes {:?} (None: dynamic) loses elements",
                    x.dims(),
                    &dims[..rank]
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
