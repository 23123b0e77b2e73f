//! Reductions of a fused program's result over some of its dimensions:
//! the statistics normalisations need (LayerNorm's and GroupNorm's mean and
//! variance, RMSNorm's mean of squares), gathered before a kernel's main
//! loop reads them.
//!
//! A [`reduce`] call computes any of [`ReduceOp`]'s statistics of one
//! program over the same dimensions in one walk: the variance is two-pass
//! (the mean of a block first, then its squared deviations, the block read
//! again while it is in cache), never `E[x^2] - E[x]^2`, whose cancellation
//! loses every digit of a variance small against the squared mean. The
//! second pass also sums the deviations themselves, which corrects both the
//! mean and the variance for the rounding of the first pass's mean (the
//! corrected two-pass algorithm of Chan, Golub and LeVeque). Sums are
//! accumulated in f32 within a line or a block of 64 rows, and in f64
//! (rows) or across blocks (columns) beyond it.
//!
//! The walk follows memory: where the program's loads are contiguous along
//! a reduced dimension (LayerNorm over the channels of a `[B, N, C]`
//! projection, GroupNorm over time), each output element reduces whole
//! lines along it (*rows*); where they are contiguous along a kept one
//! (LayerNorm over the channels of a `[B, C, N]` conv output), a block of
//! outputs along that dimension accumulates one line per reduced
//! coordinate, so every read is a contiguous run (*columns*). Results do
//! not depend on the thread count: every output's sum runs in a fixed
//! order.
//!
//! What a call derives from shapes alone (the walk, where a stored root
//! lies, whether rows lie end to end) is kept in the compiled program per
//! shape generation ([`ReduceGeometry`]): a call of unchanged shapes maps
//! no views.

use super::compiled::CompiledProgram;
use super::program::views::{Leaf, LeafMap};
use super::program::{Env, Line};
use super::reduce_geometry::{ReduceGeometry, Walk};
use super::rows::ProgramRows;
use super::rows::{SharedOut, LINE_CHUNK};
// The fewest elements one task reduces: the fused loops' one task grain.
use super::shape::{Shape, MAX_RANK};
use crate::error::KernelError;
use crate::par::MIN_TASK_ELEMS;
use crate::scratch::Scratch;

/// A statistic over the reduced dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The mean (NaN over no element, as PyTorch).
    Mean,
    /// The population variance (`correction = 0`, what LayerNorm and
    /// GroupNorm divide by), two-pass.
    Var,
}

impl ReduceOp {
    /// The op's name in plans and logs (PyTorch's spelling).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Var => "var",
        }
    }
}

/// One statistic of a [`reduce`] call and where it goes: a row-major tensor
/// of the program's shape with the reduced dimensions of size 1.
pub struct Statistic<'a> {
    #[allow(missing_docs)]
    pub op: ReduceOp,
    #[allow(missing_docs)]
    pub out: &'a mut [f32],
}

/// Rows of a column block accumulated in f32 before they are added to the
/// block's running sums (error `~(64 + K / 64) eps` rather than `K eps`).
const ROW_BLOCK: usize = 64;

/// Most elements of one column block's reduced rows together: a block's
/// variance pass reads them again, from L2.
const BLOCK_ELEMS: usize = 64 * 1024;

/// f32 elements of per-thread scratch [`reduce`] needs for a program
/// needing `temporaries` line-sized temporaries.
pub fn reduce_scratch(temporaries: usize) -> usize {
    (temporaries + 7) * LINE_CHUNK
}

impl ReduceGeometry {
    fn derive(program: &CompiledProgram, env: &dyn Env, dims: &[bool; MAX_RANK]) -> Self {
        let root = program.root();
        let shape = env.shape(program.nodes()[root].value);
        let rank = shape.rank();
        let walk = walk(program, env, dims);
        ReduceGeometry {
            dims: *dims,
            walk,
            leaf: program
                .is_leaf(root)
                .then(|| program.leaf_geometry(root, env))
                .flatten(),
            rows_end_to_end: matches!(walk, Walk::Rows { dim } if rank >= 2 && dim == rank - 1)
                && program.rows_end_to_end(root, env, rank - 2, rank - 1, shape[rank - 1]),
        }
    }
}

/// Writes the statistics `stats` of `program`'s root over the dimensions
/// `dims` marks (`dims[d]` for dimension `d`) into their tensors, in
/// parallel on the current pool. `scratch` needs [`reduce_scratch`]`(program.temporaries())`
/// elements per thread. The program must not read an anchor
/// ([`crate::fused::Expr::Anchor`]): a reduction runs before any kernel.
///
/// # Errors
/// [`KernelError::BufferLen`] for an output of the wrong size or too little
/// scratch; [`KernelError::NotFusable`] for a program reading an anchor;
/// [`KernelError::InvalidParam`] for an op asked for twice.
pub fn reduce(
    program: &CompiledProgram,
    env: &dyn Env,
    dims: &[bool; MAX_RANK],
    stats: &mut [Statistic],
    scratch: &Scratch,
) -> Result<(), KernelError> {
    if program.reads_anchor() {
        return Err(KernelError::NotFusable {
            algorithm: "reduce",
        });
    }
    let shape = env.shape(program.nodes()[program.root()].value);
    let rank = shape.rank();
    let mut out_shape = shape;
    for d in (0..rank).filter(|&d| dims[d]) {
        out_shape = out_shape.with(d, 1);
    }
    for (i, s) in stats.iter().enumerate() {
        crate::error::check_len("statistic", out_shape.numel(), s.out.len())?;
        if stats[..i].iter().any(|t| t.op == s.op) {
            return Err(KernelError::InvalidParam {
                what: "statistics",
                value: stats.len(),
                requirement: "each op at most once",
            });
        }
    }
    let need = reduce_scratch(program.temporaries());
    if scratch.per_thread() < need {
        return Err(KernelError::BufferLen {
            which: "scratch",
            expected: need,
            actual: scratch.per_thread(),
        });
    }
    if out_shape.numel() == 0 || stats.is_empty() {
        return Ok(());
    }
    let derive = || ReduceGeometry::derive(program, env, dims);
    let kept = program.reduction().read(env.generation(), derive, |g| *g);
    // Kept for other dimensions: a program reduced two ways (a plan
    // compiles one per reduction, so never in a plan).
    let geometry = if kept.dims == *dims { kept } else { derive() };
    let run = Run {
        program,
        shape,
        out_shape,
        dims: *dims,
        count: (0..rank).filter(|&d| dims[d]).map(|d| shape[d]).product(),
        var: stats.iter().any(|s| s.op == ReduceOp::Var),
        leaf: geometry.leaf.map(|g| g.bind(env)),
        rows_end_to_end: geometry.rows_end_to_end,
        rows: ProgramRows::new(program, env),
    };
    let [a, b, c] = split_stats(stats);
    let outs = [a, b, c].map(|s| s.map(|(op, out)| (op, SharedOut::new(out))));
    match geometry.walk {
        Walk::Rows { dim } => run.rows(dim, &outs, scratch),
        Walk::Columns { dim } => run.columns(dim, &outs, scratch),
    }
    Ok(())
}

/// How to walk `program`'s root, reduced over `dims`, for `env`'s shapes:
/// rows where the loads are no less contiguous along the best reduced
/// dimension than along the best kept one.
fn walk(program: &CompiledProgram, env: &dyn Env, dims: &[bool; MAX_RANK]) -> Walk {
    let shape = env.shape(program.nodes()[program.root()].value);
    let rank = shape.rank();
    let stride = |d: usize| program.max_load_stride(env, &Line::along([0; MAX_RANK], d));
    // The innermost of the least strided, among dimensions of size > 1.
    let best = |reduced: bool| {
        (0..rank)
            .filter(|&d| dims[d] == reduced && shape[d] > 1)
            .map(|d| (stride(d), std::cmp::Reverse(d)))
            .min()
            .map(|(s, d)| (s, d.0))
    };
    let reduced = best(true);
    match (reduced, best(false)) {
        (Some((sr, _)), Some((sk, dk))) if sk < sr => Walk::Columns { dim: dk },
        (Some((_, dr)), _) => Walk::Rows { dim: dr },
        // Nothing longer than 1 is reduced: each output reads one element.
        (None, _) => Walk::Rows {
            dim: (0..rank).rev().find(|&d| dims[d]).unwrap_or(0),
        },
    }
}

/// Adds a line (the second argument) into a column block's partial sums.
type AddLine<'f> = &'f dyn Fn(&mut [&mut [f32]], &[f32]);

/// The statistics, one of each op at most.
type Outs<'a> = [Option<(ReduceOp, SharedOut<'a>)>; 3];

/// The statistics by op (each at most once, checked by [`reduce`]).
fn split_stats<'a>(stats: &'a mut [Statistic]) -> [Option<(ReduceOp, &'a mut [f32])>; 3] {
    let mut slots: [Option<(ReduceOp, &'a mut [f32])>; 3] = [None, None, None];
    for s in stats.iter_mut() {
        let i = match s.op {
            ReduceOp::Sum => 0,
            ReduceOp::Mean => 1,
            ReduceOp::Var => 2,
        };
        slots[i] = Some((s.op, &mut *s.out));
    }
    slots
}

struct Run<'a> {
    program: &'a CompiledProgram,
    shape: Shape,
    out_shape: Shape,
    dims: [bool; MAX_RANK],
    /// Elements reduced into each output.
    count: usize,
    /// The variance is asked for: a second pass.
    var: bool,
    /// The program's root, where it is a stored tensor (through views).
    leaf: Option<LeafMap<'a>>,
    /// [`ReduceGeometry::rows_end_to_end`].
    rows_end_to_end: bool,
    /// The program's lines, by its recipes where one fits (a flat list of
    /// instructions, a chain), else interpreted.
    rows: ProgramRows<'a>,
}

impl<'a> Run<'a> {
    /// The program's values along `line` (as long as `buf`): read in place
    /// where the program is a stored tensor read contiguously, else
    /// computed into `buf` (`tmp` holding the program's temporaries) by
    /// the recipes the program compiled to, as a kernel's prologue is:
    /// interpreted, a LayerNorm's input (a residual sum) cost a
    /// FastConformer block's statistics a walk of the tree per row.
    fn line<'s>(&'s self, line: &Line, buf: &'s mut [f32], tmp: &mut [f32]) -> &'s [f32] {
        if let Some(Leaf::Contiguous(v, _)) = self.leaf.and_then(|l| l.read(line, buf.len())) {
            return v;
        }
        self.rows.eval_line(line, buf, tmp);
        buf
    }

    /// The coordinates of element `i` of a row-major walk over the
    /// dimensions `over` marks, each of `shape`'s size there (others 0).
    fn unravel(shape: &Shape, over: impl Fn(usize) -> bool, mut i: usize) -> [usize; MAX_RANK] {
        let mut c = [0; MAX_RANK];
        for d in (0..shape.rank()).rev().filter(|&d| over(d)) {
            c[d] = i % shape[d];
            i /= shape[d];
        }
        c
    }

    /// Offset of output coordinates `c`.
    fn out_offset(&self, c: &[usize; MAX_RANK]) -> usize {
        let strides = self.out_shape.strides();
        (0..self.out_shape.rank()).map(|d| c[d] * strides[d]).sum()
    }

    /// A statistic from the sum and, when the variance was asked for, the
    /// second pass's sums of deviations from the first pass's mean `m` and
    /// of their squares.
    fn finish(&self, op: ReduceOp, sum: f64, m: f32, dev: f64, sq: f64) -> f32 {
        let n = self.count as f64;
        (match op {
            ReduceOp::Sum => sum,
            ReduceOp::Mean if self.var => f64::from(m) + dev / n,
            ReduceOp::Mean => sum / n,
            ReduceOp::Var => (sq - dev * dev / n) / n,
        }) as f32
    }

    /// One output per task element: whole lines along `dim`, and every
    /// coordinate of the other reduced dimensions.
    fn rows(&self, dim: usize, outs: &Outs, scratch: &Scratch) {
        let len = self.shape[dim];
        let others = |d: usize| self.dims[d] && d != dim;
        let outer: usize = (0..self.shape.rank())
            .filter(|&d| others(d))
            .map(|d| self.shape[d])
            .product();
        let temps = self.program.temporaries();
        // For every line of the output element `base`, its values.
        let each_line = |base: &[usize; MAX_RANK],
                         buf: &mut [f32],
                         tmp: &mut [f32],
                         f: &mut dyn FnMut(&[f32])| {
            for o in 0..outer {
                let inner = Self::unravel(&self.shape, others, o);
                let mut b = *base;
                for d in (0..self.shape.rank()).filter(|&d| others(d)) {
                    b[d] = inner[d];
                }
                for t0 in (0..len).step_by(LINE_CHUNK) {
                    let n = LINE_CHUNK.min(len - t0);
                    b[dim] = t0;
                    f(self.line(&Line::along(b, dim), &mut buf[..n], &mut tmp[..temps * n]));
                }
            }
        };
        let kept = |d: usize| !self.dims[d];
        if outer == 1 && self.rows_in_lines(dim, len) {
            return self.row_blocks(dim, len, outs, scratch);
        }
        let per_task = MIN_TASK_ELEMS.div_ceil(self.count.max(1));
        crate::par::for_each_min(self.out_shape.numel(), per_task, |e| {
            scratch.with_slot(|slot| {
                let (buf, tmp) = slot.split_at_mut(LINE_CHUNK);
                let base = Self::unravel(&self.out_shape, kept, e);
                let mut sum = 0.0f64;
                each_line(&base, buf, tmp, &mut |v| sum += f64::from(sum_line(v)));
                let mean = (sum / self.count as f64) as f32;
                let (mut dev, mut sq) = (0.0f64, 0.0f64);
                if self.var {
                    each_line(&base, buf, tmp, &mut |v| {
                        let (d, s) = sum_dev(v, mean);
                        dev += f64::from(d);
                        sq += f64::from(s);
                    });
                }
                let at = self.out_offset(&base);
                for (op, out) in outs.iter().flatten() {
                    out.store_line(at, 1, &[self.finish(*op, sum, mean, dev, sq)]);
                }
            })
        });
    }

    /// Whether each output of a [`Walk::Rows`] along `dim` reduces one row
    /// of `len` elements along the last dimension, several of which fit a
    /// line, and consecutive rows lie end to end in everything the program
    /// reads ([`Program::rows_end_to_end`](super::program::Program)): the
    /// case of [`Self::row_blocks`].
    fn rows_in_lines(&self, dim: usize, len: usize) -> bool {
        let rank = self.shape.rank();
        rank >= 2
            && dim == rank - 1
            && !self.dims[rank - 2]
            && self.shape[rank - 2] > 1
            && (1..=LINE_CHUNK / 2).contains(&len)
            && self.rows_end_to_end
    }

    /// [`Self::rows`] for [`Self::rows_in_lines`]: per task, blocks of rows
    /// of one batch item, each block computed as one line and each row's
    /// statistics taken from it, the line read once for both passes. Row
    /// by row, a LayerNorm over the 128 channels of a FastConformer block's
    /// 32 frames computed its input (a residual sum) twice per row, paying
    /// a line's set-up each time. The sums are those of [`Self::rows`]
    /// (one line per output), so the results are bit for bit the same.
    fn row_blocks(&self, dim: usize, len: usize, outs: &Outs, scratch: &Scratch) {
        let rank = self.shape.rank();
        let per_item = self.shape[rank - 2];
        let block = (LINE_CHUNK / len).min(per_item);
        let blocks = per_item.div_ceil(block);
        let items = self.out_shape.numel() / per_item;
        let temps = self.program.temporaries();
        let kept = |d: usize| !self.dims[d];
        let per_task = MIN_TASK_ELEMS.div_ceil(block * len);
        crate::par::for_each_min(items * blocks, per_task, |task| {
            let (item, b) = (task / blocks, task % blocks);
            let row0 = item * per_item + b * block;
            let n = block.min(per_item - b * block) * len;
            scratch.with_slot(|slot| {
                let (buf, tmp) = slot.split_at_mut(LINE_CHUNK);
                let base = Self::unravel(&self.out_shape, kept, row0);
                let line = Line::along(base, dim);
                let values = self.line(&line, &mut buf[..n], &mut tmp[..temps * n]);
                // Rows of one item are consecutive outputs.
                let at = self.out_offset(&base);
                for (r, v) in values.chunks_exact(len).enumerate() {
                    let sum = f64::from(sum_line(v));
                    let mean = (sum / self.count as f64) as f32;
                    let (dev, sq) = if self.var {
                        let (d, s) = sum_dev(v, mean);
                        (f64::from(d), f64::from(s))
                    } else {
                        (0.0, 0.0)
                    };
                    for (op, out) in outs.iter().flatten() {
                        out.store_line(at + r, 1, &[self.finish(*op, sum, mean, dev, sq)]);
                    }
                }
            })
        });
    }

    /// Blocks of outputs along `dim`, a kept dimension: per block, a line
    /// along `dim` for every reduced coordinate, accumulated.
    fn columns(&self, dim: usize, outs: &Outs, scratch: &Scratch) {
        let len = self.shape[dim];
        let count = self.count;
        let block = (BLOCK_ELEMS / count.max(1)).clamp(64, 512).min(len);
        let blocks = len.div_ceil(block);
        let lines_over = |d: usize| !self.dims[d] && d != dim;
        let lines = self.out_shape.numel() / len;
        let reduced = |d: usize| self.dims[d];
        let temps = self.program.temporaries();
        let tasks_per_block = (MIN_TASK_ELEMS / (count * block).max(1)).max(1);
        crate::par::for_each_min(lines * blocks, tasks_per_block, |task| {
            let (line, j) = (task / blocks, task % blocks);
            let t0 = j * block;
            let n = block.min(len - t0);
            let mut base = Self::unravel(&self.out_shape, lines_over, line);
            base[dim] = t0;
            scratch.with_slot(|slot| {
                let (buf, rest) = slot.split_at_mut(LINE_CHUNK);
                let (sum, rest) = rest.split_at_mut(LINE_CHUNK);
                let (part, rest) = rest.split_at_mut(2 * LINE_CHUNK);
                let (mean, rest) = rest.split_at_mut(LINE_CHUNK);
                let (dev, rest) = rest.split_at_mut(LINE_CHUNK);
                let (sq, tmp) = rest.split_at_mut(LINE_CHUNK);
                let (buf, sum, mean) = (&mut buf[..n], &mut sum[..n], &mut mean[..n]);
                let (dev, sq) = (&mut dev[..n], &mut sq[..n]);
                let tmp = &mut tmp[..temps * n];
                // Every reduced coordinate's line, in blocks of rows:
                // `f` adds a line into the block's partial sums, which
                // are added into `acc` after each block.
                let mut pass = |acc: &mut [&mut [f32]], f: AddLine| {
                    for a in acc.iter_mut() {
                        a.fill(0.0);
                    }
                    for k0 in (0..count).step_by(ROW_BLOCK) {
                        let (p0, p1) = part.split_at_mut(n);
                        let mut parts = [p0, &mut p1[..n]];
                        let parts = &mut parts[..acc.len()];
                        for p in parts.iter_mut() {
                            p.fill(0.0);
                        }
                        for k in k0..(k0 + ROW_BLOCK).min(count) {
                            let c = Self::unravel(&self.shape, reduced, k);
                            let mut b = base;
                            for d in (0..self.shape.rank()).filter(|&d| reduced(d)) {
                                b[d] = c[d];
                            }
                            f(parts, self.line(&Line::along(b, dim), buf, tmp));
                        }
                        for (a, p) in acc.iter_mut().zip(parts.iter()) {
                            add(a, p);
                        }
                    }
                };
                pass(&mut [&mut *sum], &|p, v| add(p[0], v));
                let inv = 1.0 / count as f32;
                for (m, &s) in mean.iter_mut().zip(sum.iter()) {
                    *m = s * inv;
                }
                if self.var {
                    let m = &*mean;
                    pass(&mut [&mut *dev, &mut *sq], &|p, v| {
                        let (d, s) = p.split_at_mut(1);
                        add_dev(d[0], s[0], v, m)
                    });
                    // The corrected two-pass mean and variance.
                    for i in 0..n {
                        let d = dev[i] * inv;
                        mean[i] += d;
                        sq[i] = (sq[i] - dev[i] * d) * inv;
                    }
                }
                let stride = self.out_shape.strides()[dim];
                let at = self.out_offset(&base);
                for (op, out) in outs.iter().flatten() {
                    let values: &[f32] = match op {
                        ReduceOp::Sum => sum,
                        ReduceOp::Mean => mean,
                        ReduceOp::Var => sq,
                    };
                    out.store_line(at, stride, values);
                }
            })
        });
    }
}

/// The sum of `v`, in 16 lanes (vectorised) then across them.
#[inline]
fn sum_line(v: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 16];
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += x;
        }
    }
    for (l, &x) in lanes.iter_mut().zip(chunks.remainder()) {
        *l += x;
    }
    lanes.iter().sum()
}

/// The sums of `v - mean` and of `(v - mean)^2`, as [`sum_line`].
#[inline]
fn sum_dev(v: &[f32], mean: f32) -> (f32, f32) {
    let (mut dev, mut sq) = ([0.0f32; 16], [0.0f32; 16]);
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        for ((l, q), &x) in dev.iter_mut().zip(sq.iter_mut()).zip(c) {
            let d = x - mean;
            *l += d;
            *q += d * d;
        }
    }
    for ((l, q), &x) in dev.iter_mut().zip(sq.iter_mut()).zip(chunks.remainder()) {
        let d = x - mean;
        *l += d;
        *q += d * d;
    }
    (dev.iter().sum(), sq.iter().sum())
}

/// `acc[i] += v[i]`.
#[inline]
fn add(acc: &mut [f32], v: &[f32]) {
    for (a, &x) in acc.iter_mut().zip(v) {
        *a += x;
    }
}

/// `dev[i] += v[i] - mean[i]` and `sq[i] += (v[i] - mean[i])^2`.
#[inline]
fn add_dev(dev: &mut [f32], sq: &mut [f32], v: &[f32], mean: &[f32]) {
    for (((a, q), &x), &m) in dev.iter_mut().zip(sq.iter_mut()).zip(v).zip(mean) {
        let d = x - m;
        *a += d;
        *q += d * d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fused::ShapeGeneration;
    use crate::fused::{BinaryOp, Expr, Program};
    use crate::test_support::{CountingEnv, Rng, TestEnv};

    fn mask(dims: &[usize]) -> [bool; MAX_RANK] {
        let mut m = [false; MAX_RANK];
        for &d in dims {
            m[d] = true;
        }
        m
    }

    /// Sum, mean and population variance in f64, element by element of
    /// `get`'s tensor of `shape`, over `dims`.
    fn reference(shape: &[usize], dims: &[usize], get: impl Fn(&[usize]) -> f64) -> [Vec<f64>; 3] {
        let out: Vec<usize> = (0..shape.len())
            .map(|d| if dims.contains(&d) { 1 } else { shape[d] })
            .collect();
        let n_out: usize = out.iter().product();
        let mut groups: Vec<Vec<f64>> = vec![Vec::new(); n_out];
        let total: usize = shape.iter().product();
        for i in 0..total {
            let mut idx = vec![0; shape.len()];
            let mut rest = i;
            for d in (0..shape.len()).rev() {
                idx[d] = rest % shape[d];
                rest /= shape[d];
            }
            let mut o = 0;
            for d in 0..shape.len() {
                o = o * out[d] + if dims.contains(&d) { 0 } else { idx[d] };
            }
            groups[o].push(get(&idx));
        }
        let sum: Vec<f64> = groups.iter().map(|g| g.iter().sum()).collect();
        let mean: Vec<f64> = groups
            .iter()
            .zip(&sum)
            .map(|(g, s)| s / g.len() as f64)
            .collect();
        let var = groups
            .iter()
            .zip(&mean)
            .map(|(g, m)| g.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / g.len() as f64)
            .collect();
        [sum, mean, var]
    }

    /// Runs every statistic of `p` over `dims` on a pool of `threads`.
    fn run(p: &Program, env: &TestEnv, dims: &[usize], threads: usize) -> [Vec<f32>; 3] {
        let shape = env.shape(p.nodes()[p.root()].value);
        let n: usize = (0..shape.rank())
            .map(|d| if dims.contains(&d) { 1 } else { shape[d] })
            .product();
        let (mut s, mut m, mut v) = (vec![f32::NAN; n], vec![f32::NAN; n], vec![f32::NAN; n]);
        let p = p.clone().compile();
        let scratch = Scratch::new(threads, reduce_scratch(p.temporaries()));
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let mut stats = [
                Statistic {
                    op: ReduceOp::Sum,
                    out: &mut s,
                },
                Statistic {
                    op: ReduceOp::Mean,
                    out: &mut m,
                },
                Statistic {
                    op: ReduceOp::Var,
                    out: &mut v,
                },
            ];
            reduce(&p, env, &mask(dims), &mut stats, &scratch).unwrap();
        });
        [s, m, v]
    }

    fn check(got: &[Vec<f32>; 3], want: &[Vec<f64>; 3], context: &str) {
        for (what, (g, w)) in ["sum", "mean", "var"].iter().zip(got.iter().zip(want)) {
            let scale = w.iter().fold(1e-30f64, |a, x| a.max(x.abs()));
            for (i, (&g, &w)) in g.iter().zip(w).enumerate() {
                assert!(
                    (f64::from(g) - w).abs() <= 2e-6 * scale,
                    "{context}: {what}[{i}] = {g}, want {w} (scale {scale})"
                );
            }
        }
    }

    /// `x` stored as `dims`, read through the permutation `perm` (the
    /// program's root is `x.permute(perm)`).
    fn permuted(env: &mut TestEnv, x: usize, perm: &[usize]) -> Program {
        let mut p = Program::default();
        let l = p.push(Expr::Load, x);
        let stored = env.shape(x);
        let dims: Vec<usize> = perm.iter().map(|&q| stored[q]).collect();
        let v = env.computed(&dims);
        let mut map = [None; MAX_RANK];
        for (d, &q) in perm.iter().enumerate() {
            map[d] = Some(q as u8);
        }
        p.push(Expr::View { x: l, map }, v);
        p
    }

    /// Contiguous reductions (rows), transposed ones (columns), several
    /// dimensions, lines crossing the chunk and block edges, against f64.
    #[test]
    fn statistics_match_the_f64_reference_on_every_walk() {
        let mut rng = Rng::new(7);
        // (stored shape, permutation read, reduced dims of the read view)
        let cases: &[(&[usize], &[usize], &[usize])] = &[
            (&[2, 5, 37], &[0, 1, 2], &[2]),          // LayerNorm over rows
            (&[2, 3, 2500], &[0, 1, 2], &[2]),        // GroupNorm over time
            (&[3, 4, 300], &[0, 1, 2], &[1, 2]),      // GroupNorm(1, C)
            (&[1, 37, 130], &[0, 2, 1], &[2]),        // LayerNorm over a conv's channels
            (&[2, 600, 1500], &[0, 2, 1], &[2]),      // columns, several blocks
            (&[2, 7, 9, 11], &[0, 1, 2, 3], &[1, 3]), // rank 4, not adjacent
            (&[4, 1, 33], &[0, 1, 2], &[1]),          // a size-1 dimension reduced
            (&[5, 70], &[1, 0], &[0]),                // columns of a transpose
        ];
        for &(stored, perm, dims) in cases {
            let mut env = TestEnv::default();
            let n: usize = stored.iter().product();
            let x = env.stored(stored, rng.vec(n, -2.0, 3.0));
            let p = permuted(&mut env, x, perm);
            let view: Vec<usize> = perm.iter().map(|&q| stored[q]).collect();
            let st = Shape::new(stored).strides();
            let data = env.data[x].clone();
            let want = reference(&view, dims, |idx| {
                let off: usize = perm.iter().enumerate().map(|(d, &q)| idx[d] * st[q]).sum();
                f64::from(data[off])
            });
            let got = run(&p, &env, dims, 2);
            check(&got, &want, &format!("{stored:?} {perm:?} over {dims:?}"));
        }
    }

    /// Calls of one shape generation take the walk and the root's place
    /// kept from the first: each later one asks the env the root's shape
    /// alone (for the outputs' sizes and the rows), while a call without
    /// a generation maps the views again; every call gives the same bits.
    /// A LayerNorm's input read in place along its channels (rows) and
    /// transposed (columns), and a computed one (its flat form).
    #[test]
    fn calls_of_one_generation_keep_the_walk_and_the_leaf() {
        let mut rng = Rng::new(12);
        let mut env = TestEnv::default();
        let x = env.stored(&[2, 5, 37], rng.vec(2 * 5 * 37, -2.0, 2.0));
        let y = env.stored(&[2, 5, 37], rng.vec(2 * 5 * 37, -2.0, 2.0));
        let direct = permuted(&mut env, x, &[0, 1, 2]);
        let transposed = permuted(&mut env, x, &[0, 2, 1]);
        let mut sum = direct.clone();
        let (a, ly) = (sum.root(), sum.push(Expr::Load, y));
        let v = sum.nodes()[a].value;
        sum.push(
            Expr::Binary {
                op: BinaryOp::Add,
                a,
                b: ly,
            },
            v,
        );
        for (name, p, dims) in [
            ("rows", direct, [2]),
            ("columns", transposed, [1]),
            ("sum", sum, [2]),
        ] {
            let p = p.compile();
            let scratch = Scratch::new(crate::par::threads(), reduce_scratch(p.temporaries()));
            let shape = env.shape(p.nodes()[p.root()].value);
            let n = shape.numel() / shape[dims[0]];
            let mut counting = CountingEnv::new(
                TestEnv {
                    shapes: env.shapes.clone(),
                    data: env.data.clone(),
                },
                Some(ShapeGeneration::fresh()),
            );
            let call = |env: &CountingEnv| {
                let mut m = vec![f32::NAN; n];
                let mut v = vec![f32::NAN; n];
                let mut stats = [
                    Statistic {
                        op: ReduceOp::Mean,
                        out: &mut m,
                    },
                    Statistic {
                        op: ReduceOp::Var,
                        out: &mut v,
                    },
                ];
                reduce(&p, env, &mask(&dims), &mut stats, &scratch).unwrap();
                let asked = env.asked();
                (
                    asked,
                    [m, v].map(|s| s.iter().map(|x| x.to_bits()).collect::<Vec<_>>()),
                )
            };
            let (first, bits) = call(&counting);
            for _ in 0..2 {
                let (asked, again) = call(&counting);
                assert_eq!(again, bits, "{name}");
                assert!(
                    asked <= 2 && asked < first,
                    "{name}: asked {asked}, first {first}"
                );
            }
            counting.generation = None;
            for _ in 0..2 {
                let (asked, again) = call(&counting);
                assert_eq!(again, bits, "{name}");
                assert_eq!(asked, first, "{name}: no generation maps again");
            }
        }
    }

    #[test]
    fn the_walk_follows_memory() {
        let mut env = TestEnv::default();
        let x = env.stored(&[1, 8, 16], vec![0.0; 128]);
        let direct = permuted(&mut env, x, &[0, 1, 2]);
        let transposed = permuted(&mut env, x, &[0, 2, 1]);
        let walk =
            |p: &Program, dims: &[usize]| super::walk(&p.clone().compile(), &env, &mask(dims));
        assert_eq!(walk(&direct, &[2]), Walk::Rows { dim: 2 });
        assert_eq!(walk(&direct, &[1]), Walk::Columns { dim: 2 });
        assert_eq!(walk(&transposed, &[2]), Walk::Columns { dim: 1 });
        assert_eq!(walk(&transposed, &[1]), Walk::Rows { dim: 1 });
        assert_eq!(walk(&direct, &[1, 2]), Walk::Rows { dim: 2 });
    }

    /// A LayerNorm's input as FastConformer blocks write it, a residual
    /// sum times a gate (`(x + r) * sigmoid(r)`, `[B, N, C]`), reduced over
    /// the channels (rows) and over time (columns): the program's flat
    /// form computes the lines, the statistics those of the f64 reference.
    #[test]
    fn compiled_inputs_reduce_as_the_reference() {
        use crate::fused::UnaryOp;
        let mut rng = Rng::new(4);
        let dims = [2usize, 33, 128];
        let n: usize = dims.iter().product();
        let mut env = TestEnv::default();
        let x = env.stored(&dims, rng.vec(n, -2.0, 2.0));
        let r = env.stored(&dims, rng.vec(n, -2.0, 2.0));
        let v = env.computed(&dims);
        let mut p = Program::default();
        let lx = p.push(Expr::Load, x);
        let lr = p.push(Expr::Load, r);
        let sum = p.push(
            Expr::Binary {
                op: BinaryOp::Add,
                a: lx,
                b: lr,
            },
            v,
        );
        let g = p.push(
            Expr::Unary {
                op: UnaryOp::Sigmoid,
                x: lr,
            },
            v,
        );
        p.push(
            Expr::Binary {
                op: BinaryOp::Mul,
                a: sum,
                b: g,
            },
            v,
        );
        let (xs, rs) = (env.data[x].clone(), env.data[r].clone());
        for over in [[2usize], [1]] {
            let want = reference(&dims, &over, |idx| {
                let i = (idx[0] * dims[1] + idx[1]) * dims[2] + idx[2];
                let (a, b) = (f64::from(xs[i]), f64::from(rs[i]));
                (a + b) / (1.0 + (-b).exp())
            });
            check(&run(&p, &env, &over, 2), &want, &format!("over {over:?}"));
        }
    }

    /// `x + r` over the channels of `[B, N, C]`, with `x` stored once with
    /// its rows end to end (blocks of rows read as one line,
    /// `Run::row_blocks`) and once as the first `C` of rows of `C + 1`
    /// (a slice: a line per row): the same values, so the same bits, on 1
    /// and 3 threads; items of 33 rows cross the 8-row blocks.
    #[test]
    fn rows_read_as_one_line_give_the_bits_of_rows_read_one_by_one() {
        let mut rng = Rng::new(5);
        let dims = [2usize, 33, 128];
        let n: usize = dims.iter().product();
        let xs = rng.vec(n, -2.0, 2.0);
        let mut env = TestEnv::default();
        let r = env.stored(&dims, rng.vec(n, -2.0, 2.0));
        let v = env.computed(&dims);
        let sum = |p: &mut Program, x: usize| {
            let lr = p.push(Expr::Load, r);
            p.push(
                Expr::Binary {
                    op: BinaryOp::Add,
                    a: x,
                    b: lr,
                },
                v,
            );
        };
        let x = env.stored(&dims, xs.clone());
        let mut whole = Program::default();
        let lx = whole.push(Expr::Load, x);
        sum(&mut whole, lx);
        let padded: Vec<f32> = xs
            .chunks_exact(128)
            .flat_map(|row| row.iter().copied().chain([f32::NAN]))
            .collect();
        let wide = env.stored(&[2, 33, 129], padded);
        let mut sliced = Program::default();
        let lw = sliced.push(Expr::Load, wide);
        let s = sliced.push(
            Expr::Slice {
                x: lw,
                dim: 2,
                start: 0,
                step: 1,
            },
            v,
        );
        sum(&mut sliced, s);
        let (root, rank) = (whole.root(), dims.len());
        assert!(whole.rows_end_to_end(root, &env, rank - 2, rank - 1, 128));
        let root = sliced.root();
        assert!(!sliced.rows_end_to_end(root, &env, rank - 2, rank - 1, 128));
        for threads in [1, 3] {
            let (a, b) = (
                run(&whole, &env, &[2], threads),
                run(&sliced, &env, &[2], threads),
            );
            for (what, (a, b)) in ["sum", "mean", "var"].iter().zip(a.iter().zip(&b)) {
                assert!(
                    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{what}, {threads} thread(s): one line per block differs from one per row"
                );
            }
        }
    }

    /// A computed input (`2 x + 1`, read through a transpose), on pools of
    /// 1, 2 and 3 threads: the same bits every time.
    #[test]
    fn computed_inputs_and_every_thread_count_give_the_same_bits() {
        let mut rng = Rng::new(3);
        for (stored, perm, dims) in [
            ([1usize, 96, 700], [0usize, 2, 1], [2usize]),
            ([1, 96, 700], [0, 1, 2], [2]),
        ] {
            let mut env = TestEnv::default();
            let x = env.stored(&stored, rng.vec(96 * 700, -1.0, 1.0));
            let mut p = permuted(&mut env, x, &perm);
            let root = env.shape(p.nodes()[p.root()].value);
            let v = env.computed(root.dims());
            let two = p.push(Expr::Const(2.0), v);
            let one = p.push(Expr::Const(1.0), v);
            let m = p.push(
                Expr::Binary {
                    op: BinaryOp::Mul,
                    a: 1,
                    b: two,
                },
                v,
            );
            p.push(
                Expr::Binary {
                    op: BinaryOp::Add,
                    a: m,
                    b: one,
                },
                v,
            );
            let data = env.data[x].clone();
            let st = Shape::new(&stored).strides();
            let want = reference(root.dims(), &dims, |idx| {
                let off: usize = perm.iter().enumerate().map(|(d, &q)| idx[d] * st[q]).sum();
                2.0 * f64::from(data[off]) + 1.0
            });
            let one_thread = run(&p, &env, &dims, 1);
            check(&one_thread, &want, "2x + 1");
            for threads in [2, 3] {
                let got = run(&p, &env, &dims, threads);
                for (a, b) in got.iter().zip(&one_thread) {
                    assert!(
                        a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{threads} threads differ from 1"
                    );
                }
            }
        }
    }

    /// Values of 1000 with a spread of 1e-2: `E[x^2] - E[x]^2` in f32 has
    /// no digit of the variance left (1e6 against 3e-5); two passes and the
    /// correction keep it to 1e-5.
    #[test]
    fn the_variance_survives_a_large_mean() {
        let mut rng = Rng::new(11);
        for perm in [[0usize, 1, 2], [0, 2, 1]] {
            let mut env = TestEnv::default();
            let x = env.stored(
                &[1, 512, 300],
                (0..512 * 300)
                    .map(|_| 1000.0 + rng.uniform(-0.01, 0.01))
                    .collect(),
            );
            let p = permuted(&mut env, x, &perm);
            let data = env.data[x].clone();
            let shape = env.shape(p.nodes()[p.root()].value);
            let st = Shape::new(&[1, 512, 300]).strides();
            let want = reference(shape.dims(), &[1], |idx| {
                let off: usize = perm.iter().enumerate().map(|(d, &q)| idx[d] * st[q]).sum();
                f64::from(data[off])
            });
            let got = run(&p, &env, &[1], 2);
            for (i, (&g, &w)) in got[2].iter().zip(&want[2]).enumerate() {
                assert!(
                    (f64::from(g) - w).abs() <= 1e-5 * w,
                    "{perm:?}: var[{i}] = {g}, want {w}"
                );
            }
        }
    }

    #[test]
    fn nothing_to_reduce_gives_pytorchs_nan_mean_and_zero_sum() {
        let mut env = TestEnv::default();
        let x = env.stored(&[1, 3, 0], Vec::new());
        let p = permuted(&mut env, x, &[0, 1, 2]);
        let [s, m, v] = run(&p, &env, &[2], 1);
        assert_eq!(s, [0.0; 3]);
        assert!(m.iter().chain(&v).all(|x| x.is_nan()));
    }

    #[test]
    fn bad_outputs_scratch_and_anchors_are_errors() {
        let mut env = TestEnv::default();
        let x = env.stored(&[2, 8], vec![1.0; 16]);
        let p = permuted(&mut env, x, &[0, 1]);
        let scratch = Scratch::new(crate::par::threads(), reduce_scratch(0));
        let mut out = vec![0.0; 3];
        let mut stats = [Statistic {
            op: ReduceOp::Mean,
            out: &mut out,
        }];
        assert!(matches!(
            reduce(
                &p.clone().compile(),
                &env,
                &mask(&[1]),
                &mut stats,
                &scratch
            ),
            Err(KernelError::BufferLen {
                expected: 2,
                actual: 3,
                ..
            })
        ));
        let mut out = vec![0.0; 2];
        let mut stats = [Statistic {
            op: ReduceOp::Mean,
            out: &mut out,
        }];
        let small = Scratch::new(crate::par::threads(), 8);
        assert!(matches!(
            reduce(&p.clone().compile(), &env, &mask(&[1]), &mut stats, &small),
            Err(KernelError::BufferLen {
                which: "scratch",
                ..
            })
        ));
        let mut anchored = Program::default();
        anchored.push(Expr::Anchor, x);
        assert!(matches!(
            reduce(&anchored.compile(), &env, &mask(&[1]), &mut stats, &scratch),
            Err(KernelError::NotFusable { .. })
        ));
        let (mut a, mut b) = (vec![0.0; 2], vec![0.0; 2]);
        let mut twice = [
            Statistic {
                op: ReduceOp::Var,
                out: &mut a,
            },
            Statistic {
                op: ReduceOp::Var,
                out: &mut b,
            },
        ];
        assert!(matches!(
            reduce(&p.compile(), &env, &mask(&[1]), &mut twice, &scratch),
            Err(KernelError::InvalidParam { .. })
        ));
        assert_eq!(out, [0.0; 2], "nothing written");
    }
}
