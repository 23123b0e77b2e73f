//! A fused elementwise program: a small expression tree over tensors, views
//! of them and constants, evaluated one *line* (a run of elements along one
//! direction of the iteration space) at a time into a caller's buffer.
//!
//! Views (permute, slice, squeeze/unsqueeze, broadcast, cat) are not copies:
//! each maps the coordinates its parent asks for to its child's, so a line
//! `base + t * step` in the root's coordinates stays such a line all the way
//! down to a stored tensor, where it becomes a strided read. Lines have
//! non-negative steps (every view here maps a step >= 0 to a step >= 0).
//!
//! Evaluation recurses over the tree: a node writes its values for the line
//! into `out` and takes temporaries for its operands from `tmp`, a slice of
//! [`Program::temporaries`] line-sized buffers; nothing allocates.
//! Shapes come from an [`Env`] at run time, so dynamic sizes (a slice that
//! counts from the end, a cat of parts of varying length) resolve per call.

use super::ops::{clamp, copy, prefetch, select, BinaryOp, UnaryOp};
use super::shape::{Shape, MAX_RANK};
use super::strided;

/// What a program reads at run time: the shape of every value it names and
/// the data of those it loads (row-major f32).
pub trait Env: Sync {
    /// The current shape of value `value`.
    fn shape(&self, value: usize) -> Shape;
    /// The elements of stored value `value`.
    fn data(&self, value: usize) -> &[f32];
}

/// One node of a [`Program`]. Operands are indices of earlier nodes.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// A stored tensor, read through strides.
    Load,
    /// The chunk the anchor kernel just computed (epilogues only): the line
    /// asked of it is always the line the anchor produced.
    Anchor,
    /// A constant (a scalar operand, or `full_like`).
    Const(f32),
    #[allow(missing_docs)]
    Unary { op: UnaryOp, x: usize },
    #[allow(missing_docs)]
    Binary { op: BinaryOp, a: usize, b: usize },
    /// `cond != 0 ? a : b`.
    #[allow(missing_docs)]
    Where { cond: usize, a: usize, b: usize },
    #[allow(missing_docs)]
    Clamp { x: usize, min: f32, max: f32 },
    /// `x` broadcast to this node's shape with NumPy's rules.
    #[allow(missing_docs)]
    Broadcast { x: usize },
    /// A permutation or a squeeze / unsqueeze of `x`: this node's dimension
    /// `d` is `x`'s dimension `map[d]`, or an inserted size-1 dimension
    /// (`None`); dimensions of `x` no entry names have size 1.
    #[allow(missing_docs)]
    View {
        x: usize,
        map: [Option<u8>; MAX_RANK],
    },
    /// `x[start::step]` along `dim`, `start` with Python's rules (negative
    /// counts from the end of `x`'s dimension, clamped).
    #[allow(missing_docs)]
    Slice {
        x: usize,
        dim: usize,
        start: i64,
        step: usize,
    },
    /// `torch.cat(parts, dim)`.
    #[allow(missing_docs)]
    Cat { parts: Vec<usize>, dim: usize },
}

/// A node and the value (in the [`Env`]'s numbering) whose shape it has and,
/// for [`Expr::Load`], whose data it reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    #[allow(missing_docs)]
    pub expr: Expr,
    #[allow(missing_docs)]
    pub value: usize,
}

/// A line of elements in a node's coordinates: element `t` is at
/// `base + t * step`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Line {
    #[allow(missing_docs)]
    pub base: [usize; MAX_RANK],
    #[allow(missing_docs)]
    pub step: [usize; MAX_RANK],
}

impl Line {
    /// The line starting at `base` along dimension `dim`.
    pub fn along(base: [usize; MAX_RANK], dim: usize) -> Line {
        let mut step = [0; MAX_RANK];
        step[dim] = 1;
        Line { base, step }
    }
}

/// Shared nodes whose lines one evaluation keeps (further ones are
/// recomputed at each use).
pub const MAX_SHARED: usize = 8;

/// An expression tree in topological order (a DAG: a node may be the
/// operand of several); the last node is the root, unless [`Program::set_roots`]
/// names several.
///
/// A computing node read by more than one parent (a common subexpression,
/// such as `softplus(p)` feeding both a scan's `a` and `u`) is *shared*: one
/// evaluation computes its line once, keeps it in a line-sized slot of the
/// temporaries and copies it to every later use of the same line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Program {
    nodes: Vec<Node>,
    /// Per node, what evaluating it needs (kept as nodes are pushed, so
    /// asking costs nothing at run time).
    meta: Vec<Meta>,
    /// Slots assigned so far.
    slots: usize,
    /// The results, when not just the last node.
    roots: Vec<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Meta {
    /// Line-sized temporaries, not counting the shared nodes' slots.
    temporaries: usize,
    /// How many later nodes (and roots) read it.
    uses: u32,
    /// Its slot when it is shared.
    slot: Option<u8>,
}

/// The lines of shared nodes one evaluation has computed.
struct Memo<'a> {
    /// Per slot, the line and length it holds.
    keys: [Option<(Line, usize)>; MAX_SHARED],
    /// `MAX_SHARED` slots of `len` elements.
    data: &'a mut [f32],
    len: usize,
}

impl Program {
    /// Appends a node and returns its index. Operands must be earlier nodes.
    ///
    /// # Panics
    /// If an operand index is not an earlier node.
    ///
    /// Two decompositions the edge dialect produces are recognised here and
    /// pushed as the one op they compute, so that evaluation makes one pass
    /// instead of four or two (the nodes they replace stay, unevaluated):
    /// `where(x > 20, x, log1p(exp(x)))` is `softplus(x)` and
    /// `x * sigmoid(x)` is `silu(x)`.
    pub fn push(&mut self, expr: Expr, value: usize) -> usize {
        let expr = self.recognise(expr);
        let n = self.nodes.len();
        for operand in operands(&expr) {
            assert!(operand < n, "operand {operand} of node {n} is not earlier");
            self.use_node(operand);
        }
        let need = |i: usize| self.meta[i].temporaries;
        let temporaries = match expr {
            Expr::Load | Expr::Anchor | Expr::Const(_) => 0,
            Expr::Unary { x, .. }
            | Expr::Clamp { x, .. }
            | Expr::Broadcast { x }
            | Expr::View { x, .. }
            | Expr::Slice { x, .. } => need(x),
            // `b` is evaluated while `a`'s values wait in the output.
            Expr::Binary { a, b, .. } => need(a).max(1 + need(b)),
            Expr::Where { cond, a, b } => need(a).max(1 + need(b)).max(2 + need(cond)),
            Expr::Cat { ref parts, .. } => parts.iter().map(|&p| need(p)).max().unwrap_or(0),
        };
        self.meta.push(Meta {
            temporaries,
            uses: 0,
            slot: None,
        });
        self.nodes.push(Node { expr, value });
        n
    }

    /// The one op `expr` computes when it ends a known decomposition (see
    /// [`Self::push`]), else `expr`.
    fn recognise(&self, expr: Expr) -> Expr {
        let unary_of = |i: usize| match self.nodes.get(i).map(|n| &n.expr) {
            Some(&Expr::Unary { op, x }) => Some((op, x)),
            _ => None,
        };
        match expr {
            Expr::Where { cond, a, b } => {
                let threshold = matches!(
                    self.nodes.get(cond).map(|n| &n.expr),
                    Some(&Expr::Binary { op: BinaryOp::Gt, a: x, b: c })
                        if x == a && self.nodes.get(c).map(|n| &n.expr) == Some(&Expr::Const(20.0))
                );
                let log1p_exp = unary_of(b)
                    .filter(|&(op, _)| op == UnaryOp::Log1p)
                    .and_then(|(_, e)| unary_of(e))
                    == Some((UnaryOp::Exp, a));
                if threshold && log1p_exp {
                    return Expr::Unary {
                        op: UnaryOp::Softplus,
                        x: a,
                    };
                }
                expr
            }
            Expr::Binary {
                op: BinaryOp::Mul,
                a,
                b,
            } => {
                if unary_of(b) == Some((UnaryOp::Sigmoid, a)) {
                    return Expr::Unary {
                        op: UnaryOp::Silu,
                        x: a,
                    };
                }
                if unary_of(a) == Some((UnaryOp::Sigmoid, b)) {
                    return Expr::Unary {
                        op: UnaryOp::Silu,
                        x: b,
                    };
                }
                expr
            }
            expr => expr,
        }
    }

    /// Counts a read of node `i`; a computing node read twice gets a slot.
    fn use_node(&mut self, i: usize) {
        let computes = matches!(
            self.nodes[i].expr,
            Expr::Unary { .. } | Expr::Binary { .. } | Expr::Where { .. } | Expr::Clamp { .. }
        );
        let meta = &mut self.meta[i];
        meta.uses += 1;
        if meta.uses == 2 && meta.slot.is_none() && computes && self.slots < MAX_SHARED {
            meta.slot = Some(self.slots as u8);
            self.slots += 1;
        }
    }

    /// The nodes, root last.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Index of the (first) root: the last node unless [`Self::set_roots`]
    /// named others.
    ///
    /// # Panics
    /// If the program is empty.
    pub fn root(&self) -> usize {
        match self.roots.first() {
            Some(&r) => r,
            None => self.nodes.len().checked_sub(1).expect("empty program"),
        }
    }

    /// Makes the program compute several results, evaluated together by
    /// [`Self::eval_roots`] (their common subexpressions once).
    ///
    /// # Panics
    /// If a root is not a node.
    pub fn set_roots(&mut self, roots: Vec<usize>) {
        assert!(
            roots.iter().all(|&r| r < self.nodes.len()),
            "root is not a node"
        );
        for &r in &roots {
            // A root also read by another root is shared too.
            self.use_node(r);
        }
        self.roots = roots;
    }

    /// The results: the roots [`Self::set_roots`] named, or the last node.
    pub fn roots(&self) -> Vec<usize> {
        if self.roots.is_empty() {
            vec![self.root()]
        } else {
            self.roots.clone()
        }
    }

    /// The roots [`Self::set_roots`] named (empty for a single-root
    /// program), without the allocation of [`Self::roots`].
    pub(super) fn named_roots(&self) -> &[usize] {
        &self.roots
    }

    /// Nodes whose line one evaluation computes once for all its uses.
    pub fn shared(&self) -> usize {
        self.slots
    }

    /// Whether some node is the anchor's output.
    pub fn reads_anchor(&self) -> bool {
        self.nodes.iter().any(|n| n.expr == Expr::Anchor)
    }

    /// The values the program loads.
    pub fn loads(&self) -> impl Iterator<Item = usize> + '_ {
        self.nodes
            .iter()
            .filter(|n| n.expr == Expr::Load)
            .map(|n| n.value)
    }

    /// How many line-sized temporaries [`Self::eval`] and
    /// [`Self::eval_roots`] need: the roots' own and a slot per shared node.
    pub fn temporaries(&self) -> usize {
        let own = if self.roots.is_empty() {
            self.meta.last().map_or(0, |m| m.temporaries)
        } else {
            self.roots
                .iter()
                .map(|&r| self.meta[r].temporaries)
                .max()
                .unwrap_or(0)
        };
        own + self.slots
    }

    /// Writes the root's elements along `line` (in the root's coordinates)
    /// into `out`, `out.len()` of them. `anchor` is the anchor's chunk for
    /// [`Expr::Anchor`] (same length as `out`); `tmp` holds at least
    /// [`Self::temporaries`] `* out.len()` elements.
    ///
    /// # Panics
    /// If the line leaves a tensor the env stores, or `tmp` is too short:
    /// both are bugs of the caller's plan, and safe indexing turns them into
    /// panics rather than wrong reads.
    pub fn eval(
        &self,
        env: &dyn Env,
        anchor: &[f32],
        line: &Line,
        out: &mut [f32],
        tmp: &mut [f32],
    ) {
        let (slots, tmp) = tmp.split_at_mut(self.slots * out.len());
        let mut memo = Memo {
            keys: [None; MAX_SHARED],
            data: slots,
            len: out.len(),
        };
        self.eval_node(self.root(), env, anchor, line, out, tmp, &mut memo);
    }

    /// [`Self::eval`] for every root ([`Self::roots`]) into `outs` (one per
    /// root, equally long), computing each shared node's line once.
    ///
    /// # Panics
    /// As [`Self::eval`]; also if `outs` does not hold one line per root.
    pub fn eval_roots(
        &self,
        env: &dyn Env,
        anchor: &[f32],
        line: &Line,
        outs: &mut [&mut [f32]],
        tmp: &mut [f32],
    ) {
        let roots = if self.roots.is_empty() {
            &[self.root()][..]
        } else {
            &self.roots[..]
        };
        assert_eq!(outs.len(), roots.len(), "one output per root");
        let len = outs.first().map_or(0, |o| o.len());
        let (slots, tmp) = tmp.split_at_mut(self.slots * len);
        let mut memo = Memo {
            keys: [None; MAX_SHARED],
            data: slots,
            len,
        };
        for (&root, out) in roots.iter().zip(outs.iter_mut()) {
            assert_eq!(out.len(), len, "outputs of one length");
            self.eval_node(root, env, anchor, line, out, tmp, &mut memo);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn eval_node(
        &self,
        i: usize,
        env: &dyn Env,
        anchor: &[f32],
        line: &Line,
        out: &mut [f32],
        tmp: &mut [f32],
        memo: &mut Memo,
    ) {
        let len = out.len();
        let slot = self.meta[i].slot.map(usize::from);
        if let Some(k) = slot {
            if memo.keys[k] == Some((*line, len)) {
                copy(out, &memo.data[k * memo.len..][..len]);
                return;
            }
        }
        self.compute_node(i, env, anchor, line, out, tmp, memo);
        if let Some(k) = slot {
            copy(&mut memo.data[k * memo.len..][..len], out);
            memo.keys[k] = Some((*line, len));
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn compute_node(
        &self,
        i: usize,
        env: &dyn Env,
        anchor: &[f32],
        line: &Line,
        out: &mut [f32],
        tmp: &mut [f32],
        memo: &mut Memo,
    ) {
        let len = out.len();
        let node = &self.nodes[i];
        match node.expr {
            Expr::Load => load(env.data(node.value), &env.shape(node.value), line, out),
            Expr::Anchor => copy(out, &anchor[..len]),
            Expr::Const(c) => out.fill(c),
            Expr::Unary { op, x } => {
                self.eval_node(x, env, anchor, line, out, tmp, memo);
                op.apply(out);
            }
            Expr::Clamp { x, min, max } => {
                self.eval_node(x, env, anchor, line, out, tmp, memo);
                clamp(out, min, max);
            }
            Expr::Binary { op, a, b } => {
                self.eval_node(a, env, anchor, line, out, tmp, memo);
                let (bv, rest) = tmp.split_at_mut(len);
                self.eval_node(b, env, anchor, line, bv, rest, memo);
                op.apply(out, bv);
            }
            Expr::Where { cond, a, b } => {
                self.eval_node(a, env, anchor, line, out, tmp, memo);
                let (bv, rest) = tmp.split_at_mut(len);
                self.eval_node(b, env, anchor, line, bv, rest, memo);
                let (cv, rest) = rest.split_at_mut(len);
                self.eval_node(cond, env, anchor, line, cv, rest, memo);
                select(cv, out, bv);
            }
            Expr::Broadcast { x } | Expr::View { x, .. } | Expr::Slice { x, .. } => {
                let child = self.view_line(i, env, line);
                self.eval_node(x, env, anchor, &child, out, tmp, memo);
            }
            Expr::Cat { ref parts, dim } => {
                let (base, step) = (line.base[dim], line.step[dim]);
                let mut offset = 0;
                for &part in parts {
                    let size = env.shape(self.nodes[part].value)[dim];
                    let (lo, hi) = (offset, offset + size);
                    offset = hi;
                    // Elements t of the line whose coordinate lies in [lo, hi).
                    let (t0, t1) = if step == 0 {
                        if (lo..hi).contains(&base) {
                            (0, len)
                        } else {
                            (0, 0)
                        }
                    } else {
                        (
                            lo.saturating_sub(base).div_ceil(step),
                            hi.saturating_sub(base).div_ceil(step).min(len),
                        )
                    };
                    if t0 >= t1 {
                        continue;
                    }
                    let mut child = *line;
                    for d in 0..MAX_RANK {
                        child.base[d] += t0 * line.step[d];
                    }
                    child.base[dim] -= lo;
                    self.eval_node(part, env, anchor, &child, &mut out[t0..t1], tmp, memo);
                }
            }
        }
    }
}

impl Program {
    /// The line a view node (broadcast, permute / squeeze, slice) reads of
    /// its operand when asked for `line`; any other node's `line` itself.
    pub(super) fn view_line(&self, i: usize, env: &dyn Env, line: &Line) -> Line {
        let node = &self.nodes[i];
        match node.expr {
            Expr::Broadcast { x } => {
                let (to, from) = (env.shape(node.value), env.shape(self.nodes[x].value));
                let lead = to.rank() - from.rank();
                let mut child = Line::default();
                for d in 0..from.rank() {
                    if from[d] != 1 {
                        child.base[d] = line.base[d + lead];
                        child.step[d] = line.step[d + lead];
                    }
                }
                child
            }
            Expr::Slice {
                x,
                dim,
                start,
                step,
            } => {
                let size = env.shape(self.nodes[x].value)[dim];
                let mut child = *line;
                child.base[dim] = resolve_start(start, size) + step * line.base[dim];
                child.step[dim] = step * line.step[dim];
                child
            }
            Expr::View { map, .. } => {
                let mut child = Line::default();
                for (d, m) in map.iter().enumerate().take(env.shape(node.value).rank()) {
                    if let Some(m) = *m {
                        child.base[m as usize] = line.base[d];
                        child.step[m as usize] = line.step[d];
                    }
                }
                child
            }
            _ => *line,
        }
    }

    /// Whether node `i` is a *leaf*: a stored tensor or a constant, read
    /// through views only (what [`Self::leaf_map`] resolves).
    pub(super) fn is_leaf(&self, mut i: usize) -> bool {
        loop {
            match self.nodes[i].expr {
                Expr::Load | Expr::Const(_) => return true,
                Expr::Broadcast { x } | Expr::View { x, .. } | Expr::Slice { x, .. } => i = x,
                _ => return false,
            }
        }
    }

    /// How leaf `i` (see [`Self::is_leaf`]) reads any line of the root,
    /// resolved once for the env's current shapes: the views between a
    /// stored tensor and the root are affine maps of coordinates, so an
    /// element's offset is `offset + sum(coord[d] * coef[d])` over the
    /// root's dimensions. `None` for other nodes.
    pub(super) fn leaf_map<'e>(&self, i: usize, env: &'e dyn Env) -> Option<LeafMap<'e>> {
        // Offset and stride of the line `line` of node `i`, down to a load.
        let resolve = |line: Line| -> Option<(usize, usize, usize)> {
            let (mut i, mut line) = (i, line);
            loop {
                let node = &self.nodes[i];
                match node.expr {
                    Expr::Load => {
                        let shape = env.shape(node.value);
                        let strides = shape.strides();
                        let rank = shape.rank();
                        let start = (0..rank).map(|d| line.base[d] * strides[d]).sum();
                        let stride = (0..rank).map(|d| line.step[d] * strides[d]).sum();
                        return Some((node.value, start, stride));
                    }
                    Expr::Broadcast { x } | Expr::View { x, .. } | Expr::Slice { x, .. } => {
                        line = self.view_line(i, env, &line);
                        i = x;
                    }
                    _ => return None,
                }
            }
        };
        if let Some(c) = self.leaf_const(i) {
            return Some(LeafMap::Const(c));
        }
        let (value, offset, _) = resolve(Line::default())?;
        let mut coef = [0; MAX_RANK];
        for (d, c) in coef.iter_mut().enumerate() {
            let mut unit = Line::default();
            unit.step[d] = 1;
            *c = resolve(unit)?.2;
        }
        Some(LeafMap::Stored {
            data: env.data(value),
            offset,
            coef,
        })
    }

    /// [`Self::leaf_map`] of leaf `i` for lines of another node's
    /// coordinates, `views` the view nodes between that node and `i`'s
    /// (outermost first): how `i` reads the lines of a node above views.
    pub(super) fn leaf_map_through<'e>(
        &self,
        views: &[usize],
        i: usize,
        env: &'e dyn Env,
    ) -> Option<LeafMap<'e>> {
        let map = self.leaf_map(i, env)?;
        let LeafMap::Stored { data, offset, coef } = map else {
            return Some(map);
        };
        let down = |line: Line| {
            views
                .iter()
                .fold(line, |line, &v| self.view_line(v, env, &line))
        };
        let at = |line: &Line, of: fn(&Line) -> &[usize; MAX_RANK]| -> usize {
            of(line).iter().zip(&coef).map(|(&c, &k)| c * k).sum()
        };
        let base = down(Line::default());
        let mut through = [0; MAX_RANK];
        for (d, t) in through.iter_mut().enumerate() {
            let mut unit = Line::default();
            unit.step[d] = 1;
            *t = at(&down(unit), |l| &l.step);
        }
        Some(LeafMap::Stored {
            data,
            offset: offset + at(&base, |l| &l.base),
            coef: through,
        })
    }

    /// The constant leaf `i` is, if it is one (through views).
    fn leaf_const(&self, mut i: usize) -> Option<f32> {
        loop {
            match self.nodes[i].expr {
                Expr::Const(c) => return Some(c),
                Expr::Broadcast { x } | Expr::View { x, .. } | Expr::Slice { x, .. } => i = x,
                _ => return None,
            }
        }
    }
}

/// How a leaf reads the root's lines ([`Program::leaf_map`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum LeafMap<'a> {
    /// A constant.
    Const(f32),
    /// A stored tensor: the element at root coordinates `c` is
    /// `data[offset + sum(c[d] * coef[d])]`.
    Stored {
        data: &'a [f32],
        offset: usize,
        coef: [usize; MAX_RANK],
    },
}

impl<'a> LeafMap<'a> {
    /// The `len` elements along `line` when they need no copy: one value
    /// repeated (a constant, or a stored tensor read with stride 0, such
    /// as a per-channel parameter along time) or a contiguous run of a
    /// stored tensor. `None` for strided reads, which [`Program::eval`]
    /// gathers.
    ///
    /// # Panics
    /// If the line leaves its tensor (a bug of the caller's plan, as in
    /// [`Program::eval`]).
    #[inline]
    pub(super) fn read(&self, line: &Line, len: usize) -> Option<Leaf<'a>> {
        match *self {
            LeafMap::Const(c) => Some(Leaf::Scalar(c)),
            LeafMap::Stored { data, offset, coef } => {
                let mut start = offset;
                let mut stride = 0;
                for ((&b, &s), &c) in line.base.iter().zip(&line.step).zip(&coef) {
                    start += b * c;
                    stride += s * c;
                }
                match stride {
                    0 => Some(Leaf::Scalar(data[start])),
                    1 => {
                        let end = start + len;
                        let ahead = &data[end.min(data.len())..(end + len).min(data.len())];
                        Some(Leaf::Contiguous(&data[start..end], ahead))
                    }
                    _ => None,
                }
            }
        }
    }
}

/// A leaf's elements along a line, read in place ([`LeafMap::read`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Leaf<'a> {
    /// Every element is this value.
    Scalar(f32),
    /// The elements, in order, and as many after them as there are (the
    /// next line of a row walk, for the reader to prefetch while it
    /// computes this one: asked for all at once, at the line's start,
    /// the prefetches of three streams stalled on the memory system).
    Contiguous(&'a [f32], &'a [f32]),
}

impl Program {
    /// The largest element stride of the stored tensors the root's `line`
    /// reads (0 where it reads none): 1 is contiguous, larger means a
    /// strided gather. Walks the tree as [`Self::eval`] does, reading no
    /// data.
    pub fn max_load_stride(&self, env: &dyn Env, line: &Line) -> usize {
        self.stride_of(self.root(), env, line)
    }

    fn stride_of(&self, i: usize, env: &dyn Env, line: &Line) -> usize {
        let node = &self.nodes[i];
        let child_line = |x: usize| -> Line {
            let mut child = Line::default();
            match node.expr {
                Expr::Broadcast { .. } => {
                    let (to, from) = (env.shape(node.value), env.shape(self.nodes[x].value));
                    let lead = to.rank() - from.rank();
                    for d in 0..from.rank() {
                        if from[d] != 1 {
                            child.base[d] = line.base[d + lead];
                            child.step[d] = line.step[d + lead];
                        }
                    }
                }
                Expr::View { map, .. } => {
                    for (d, m) in map.iter().enumerate().take(env.shape(node.value).rank()) {
                        if let Some(m) = *m {
                            child.base[m as usize] = line.base[d];
                            child.step[m as usize] = line.step[d];
                        }
                    }
                }
                Expr::Slice { dim, step, .. } => {
                    child = *line;
                    child.base[dim] = 0;
                    child.step[dim] = step * line.step[dim];
                }
                _ => child = *line,
            }
            child
        };
        match node.expr {
            Expr::Load => {
                let strides = env.shape(node.value).strides();
                (0..env.shape(node.value).rank())
                    .map(|d| line.step[d] * strides[d])
                    .sum()
            }
            Expr::Anchor | Expr::Const(_) => 0,
            Expr::Unary { x, .. }
            | Expr::Clamp { x, .. }
            | Expr::Broadcast { x }
            | Expr::View { x, .. }
            | Expr::Slice { x, .. } => self.stride_of(x, env, &child_line(x)),
            Expr::Binary { a, b, .. } => self
                .stride_of(a, env, line)
                .max(self.stride_of(b, env, line)),
            Expr::Where { cond, a, b } => self
                .stride_of(cond, env, line)
                .max(self.stride_of(a, env, line))
                .max(self.stride_of(b, env, line)),
            Expr::Cat { ref parts, dim } => parts
                .iter()
                .map(|&p| {
                    let mut child = *line;
                    child.base[dim] = 0;
                    self.stride_of(p, env, &child)
                })
                .max()
                .unwrap_or(0),
        }
    }
}

/// Python's rule for a slice start: negative counts from the end, clamped.
pub fn resolve_start(start: i64, size: usize) -> usize {
    let size = size as i64;
    let s = if start < 0 { start + size } else { start };
    s.clamp(0, size) as usize
}

/// Elements of a row-major tensor of `shape` along `line`.
fn load(data: &[f32], shape: &Shape, line: &Line, out: &mut [f32]) {
    if out.is_empty() {
        return;
    }
    let strides = shape.strides();
    let rank = shape.rank();
    let start: usize = (0..rank).map(|d| line.base[d] * strides[d]).sum();
    let stride: usize = (0..rank).map(|d| line.step[d] * strides[d]).sum();
    match stride {
        0 => out.fill(data[start]),
        1 => {
            let end = start + out.len();
            copy(out, &data[start..end]);
            // The next line of a row walk: ask for it now, so that it
            // arrives while this one is computed.
            prefetch(&data[end.min(data.len())..(end + out.len()).min(data.len())]);
        }
        _ => {
            // One bounds check for the whole line, then plain strided reads.
            let last = start + stride * (out.len() - 1);
            let line = &data[start..=last];
            // A column across the channels of a `[B, C, K - 1]` conv state
            // (a decode step's read) has a small stride: deinterleaved a
            // vector at a time.
            match stride {
                2 => strided::gather::<2>(line, out),
                3 => strided::gather::<3>(line, out),
                4 => strided::gather::<4>(line, out),
                _ => {
                    for (o, &v) in out.iter_mut().zip(line.iter().step_by(stride)) {
                        *o = v;
                    }
                }
            }
        }
    }
}

fn operands(expr: &Expr) -> Vec<usize> {
    match *expr {
        Expr::Load | Expr::Anchor | Expr::Const(_) => vec![],
        Expr::Unary { x, .. }
        | Expr::Clamp { x, .. }
        | Expr::Broadcast { x }
        | Expr::View { x, .. }
        | Expr::Slice { x, .. } => vec![x],
        Expr::Binary { a, b, .. } => vec![a, b],
        Expr::Where { cond, a, b } => vec![cond, a, b],
        Expr::Cat { ref parts, .. } => parts.clone(),
    }
}
