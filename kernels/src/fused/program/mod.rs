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
//! Evaluation (`eval.rs`) recurses over the tree: a node writes its values
//! for the line into `out` and takes temporaries for its operands from
//! `tmp`, a slice of [`Program::temporaries`] line-sized buffers; nothing
//! allocates. Shapes come from an [`Env`] at run time, so dynamic sizes (a
//! slice that counts from the end, a cat of parts of varying length)
//! resolve per call. The view algebra (`views.rs`) maps lines through views
//! without data: how a leaf reads the root's lines, and the strides a line
//! reads. This file holds the IR and its builder.

mod eval;
pub(super) mod views;

use super::generation::ShapeGeneration;
use super::ops::{BinaryOp, UnaryOp};
use super::shape::{Shape, MAX_RANK};

/// What a program reads at run time: the shape of every value it names and
/// the data of those it loads (row-major f32).
pub trait Env: Sync {
    /// The current shape of value `value`.
    fn shape(&self, value: usize) -> Shape;
    /// The elements of stored value `value`.
    fn data(&self, value: usize) -> &[f32];
    /// The number of this call's set of shapes, where the host keeps one
    /// (see `generation.rs`): what depends on shapes alone is then derived
    /// once per generation. None (the default): derived every call.
    fn generation(&self) -> Option<ShapeGeneration> {
        None
    }
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
}

/// Python's rule for a slice start: negative counts from the end, clamped.
pub fn resolve_start(start: i64, size: usize) -> usize {
    let size = size as i64;
    let s = if start < 0 { start + size } else { start };
    s.clamp(0, size) as usize
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
