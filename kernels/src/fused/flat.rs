//! A program flattened, once, into a list of instructions over blocks of
//! elements: the general form an elementwise program takes (of one root,
//! or of several: a scan's `a` and `u` computed together, the largest
//! node both read computed once, then each root's instructions and its
//! store) where no dedicated recipe (`recipes.rs`,
//! `conv_recipes.rs`, `chain_recipes.rs`) matches and it is more than a
//! view of a stored tensor (which the interpreter copies once;
//! `compiled.rs` decides).
//!
//! The interpreter (`program/eval.rs`) walks the tree for every line: per
//! node a match, a view mapped through the env's shapes, a pass over a
//! line buffer, every stored operand copied into one first. On long lines
//! that is cheap; on short ones it is most of the time. A conformer's GLU
//! before its depthwise conv (`a * sigmoid(b)`, two slices of the
//! pointwise conv's output) walked 128 lines of 40 elements per call at
//! T = 32, and the walk cost more than the conv. Flattened, the tree is a
//! list of instructions (an op, its operands, the register it writes) and
//! its leaves are affine maps into their tensors, both found here once per
//! program; a line costs one read of each leaf (a few multiply-adds:
//! where it starts, whether it is one value or a contiguous run), then
//! each block of [`BLOCK`] elements runs the list over registers of a
//! block each, in L1, every leaf read in place. The registers are the
//! caller's line temporaries ([`FlatForm::temporaries`] count in the
//! program's, `CompiledProgram::temporaries`): a stack array zeroed per
//! line cost a fifth of the GLU's time.
//!
//! Each instruction applies the interpreter's own loop for its op
//! (`UnaryOp::apply_generic` and `BinaryOp::apply_generic`, in the same
//! instruction-set variant), element by element, so results are the
//! interpreter's bit for bit (the tests check this on random programs).
//! A leaf read with a stride along a line (a transposed operand, every
//! line across the channels) is gathered a block at a time into a
//! register of its own, with the interpreter's strided moves. A binary
//! op or a select of a leaf or the anchor writes its register in one
//! pass, with no copy of its operand first; the last of a root's writes
//! the output itself. ExecuTorch's LFM2 example's gate (`b * x`, two
//! slices of a projection) is then one pass per line, not a pass and two
//! copies (that block 5-8% faster on the 16-core Xeon, 5% on the 2-core
//! AVX2 VM). One
//! peephole: `nn.ELU` as the blob writes it (a compare, `exp`, a
//! difference and a product with constants, and a select) is one
//! instruction, the same arithmetic in one loop.
//!
//! # Cats
//!
//! A program with cats (a streaming conv's input, `cat(state, x)`, with
//! the previous layer's activation on `x`; a padding) is flattened once
//! per choice of one part of every cat (a `Piece`): below a cat the way
//! to a leaf goes into the chosen part, shifted back by the parts before
//! it. A line is cut where it crosses a part's bounds, and each stretch
//! runs its piece. Interpreted, the cats of a transformers Mimi encoder's
//! prologues took about a quarter of its time (2-core AVX2 VM); flat, with
//! the ELU peephole, the encoder and decoder ran 7-17% faster on the
//! 16-core Xeon device (`docs/bench/ab-s39-device.md`). A first version
//! (session 33) slowed LFM2's decode step by 30-88%: its rows (3 state
//! elements and 1 new one) were read along time at a set-up per part.
//! Lines through a cat are now priced as the interpreter's, so such steps
//! read across the channels (each line in one part), and a piece that
//! only views a leaf (the state) reads it straight into the output.

use super::ops::{clamp, copy, elu, select, select_into, select_scalar, BinaryOp, UnaryOp};
use super::program::views::{Leaf, LeafGeometry, LeafMap};
use super::program::{Env, Expr, Line, Program};
use super::shape::MAX_RANK;
use super::strided;
use crate::simd::{per_backend, Isa};

/// Elements per block: registers of 256 floats (1 KiB each) stay in L1,
/// and each instruction's loop is long enough to pipeline (a sigmoid's
/// vectors are long dependency chains).
const BLOCK: usize = 256;

/// Most instructions a flattened program has (a LayerNorm applied with
/// its weight, bias and activation has five; a shared subtree is
/// flattened once per use).
const MAX_INSTRS: usize = 24;

/// Most distinct leaves.
const MAX_LEAVES: usize = 8;

/// Most roots: a scan's `a` and `u` computed together are two.
const MAX_ROOTS: usize = 4;

/// Most cats a flat program reads (a streaming conv's input is one).
const MAX_CATS: usize = 2;

/// Most pieces (choices of one part of every cat): a cat of up to four
/// parts, or two of two.
const MAX_PIECES: usize = 4;

/// Most views between the root and one leaf.
const MAX_VIEWS: usize = 8;

/// Most registers: a tree deeper than this on its right-hand side is
/// interpreted.
const REGS: usize = 4;

/// Most nodes several roots read that a piece computes once (a scan's
/// `softplus(dt)` for its `a` and `u`, and a gate shared by two others).
/// Each takes a register from the roots' below it.
const MAX_KEPT: usize = 2;

/// Elements of the widest vector (AVX-512's), a multiple of the others':
/// registers are padded to a whole number of them where room allows.
const LANES: usize = 16;

/// Where an instruction's operand is.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Src {
    /// A register an earlier instruction wrote.
    Reg(u8),
    /// A leaf, read in place.
    Leaf(u8),
    /// The anchor's values (an epilogue's).
    Anchor,
}

/// What an instruction does to its register once `x` is in it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Unary(UnaryOp),
    Binary(BinaryOp, Src),
    Clamp(f32, f32),
    /// `cond != 0 ? x : other`.
    Where {
        cond: Src,
        other: Src,
    },
    /// ELU as the blob writes it, `where(x > 0, x, (exp(x) - 1) * alpha)`,
    /// in one loop ([`elu`]) instead of five.
    Elu(f32),
}

/// `dst = op(x, ...)`. `x` is `dst` itself, a leaf or the anchor; every
/// register operand is above `dst` (the right-hand side of a tree is
/// computed into the registers above its left-hand side's).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Instr {
    dst: u8,
    x: Src,
    op: Op,
}

impl Instr {
    /// Whether the instruction reads its `x` and writes its register in
    /// one pass (a binary op or a select of a leaf or the anchor, in
    /// [`apply`]), so that it can write a root's output itself.
    fn one_pass(&self) -> bool {
        self.x != Src::Reg(self.dst) && matches!(self.op, Op::Binary(..) | Op::Where { .. })
    }
}

/// A leaf (or a cat) and the view nodes between the root and it,
/// outermost first; where a view is a cat, the part the way goes into.
#[derive(Clone, Copy, Debug, PartialEq)]
struct LeafPath {
    node: usize,
    views: [usize; MAX_VIEWS],
    parts: [u8; MAX_VIEWS],
    n_views: usize,
}

impl LeafPath {
    const ROOT: LeafPath = LeafPath {
        node: 0,
        views: [0; MAX_VIEWS],
        parts: [0; MAX_VIEWS],
        n_views: 0,
    };

    /// Whether both are the same node on the same way down.
    fn same(&self, other: &LeafPath) -> bool {
        let n = self.n_views;
        self.node == other.node
            && n == other.n_views
            && self.views[..n] == other.views[..n]
            && self.parts[..n] == other.parts[..n]
    }

    /// This way, one view further down (into part `part` of a cat).
    fn below(mut self, view: usize, part: usize) -> Option<LeafPath> {
        *self.views.get_mut(self.n_views)? = view;
        self.parts[self.n_views] = u8::try_from(part).ok()?;
        self.n_views += 1;
        Some(self)
    }
}

/// A program flattened: one [`Piece`] per choice of a part for every cat
/// it reads (one piece where it reads none), and those cats, found once,
/// when the program is compiled. A line runs each stretch of its elements
/// that lies in one part of every cat as that choice's piece: a causal
/// conv's streaming input, `cat(state, x)` along time, is the state's
/// piece for the first `K - 1` elements of a row and `x`'s for the rest.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct FlatForm {
    pieces: [Piece; MAX_PIECES],
    n_pieces: usize,
    /// The cats, each under views alone (a cat inside another's part is
    /// left to the interpreter); piece `p` takes part `p`'s digits in the
    /// mixed radix of their part counts, the last cat's least significant.
    cats: [LeafPath; MAX_CATS],
    /// Each cat's parts.
    radix: [usize; MAX_CATS],
    n_cats: usize,
}

/// A cat-free program (or a program with one part of each of its cats
/// chosen): its instructions and leaves.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Piece {
    instrs: [Instr; MAX_INSTRS],
    len: usize,
    /// Where each run of instructions ends: `instrs[..ends[0]]` compute
    /// the nodes several roots read (none, or [`Builder::keep`]'s), once
    /// per block, into registers above every root's; root `k`'s are
    /// `instrs[ends[k]..ends[k + 1]]`, its values in register 0 after
    /// them.
    ends: [usize; MAX_ROOTS + 1],
    n_roots: usize,
    leaves: [LeafPath; MAX_LEAVES],
    n_leaves: usize,
    /// Where its leaves start among all the pieces' (they share one list
    /// of at most [`MAX_LEAVES`], so that binding a call's tensors costs
    /// what it did before cats had pieces).
    first: usize,
    /// The root reads the anchor (an epilogue).
    reads_anchor: bool,
    /// Registers the instructions write.
    regs: usize,
}

/// The flattening walk's state.
struct Builder<'p> {
    program: &'p Program,
    form: Piece,
    /// The cats met so far; a walk that may not add any (`discover`
    /// false) has no flat form where it meets another.
    cats: [LeafPath; MAX_CATS],
    n_cats: usize,
    discover: bool,
    /// The part this piece takes of each cat.
    choice: [usize; MAX_CATS],
    /// How many nodes several roots read to compute once, at most (see
    /// [`Builder::keep`]).
    share: usize,
    /// Those nodes and their registers, once computed.
    kept: [(usize, Src); MAX_KEPT],
    n_kept: usize,
    /// Registers the instructions may write: below the kept nodes'.
    limit: usize,
}

impl FlatForm {
    /// The flat form of a program whose roots are made of leaves, the
    /// anchor, unary and binary ops, clamps, selects and cats (views
    /// anywhere): per choice of one part of every cat, each root's
    /// instructions in turn, then its store. Of several roots, the largest
    /// node more than one of them computes (a scan's `softplus(dt)`, read
    /// by its `a` and `u`) is computed once, first, into a register the
    /// roots' instructions leave alone, and so is the largest one left
    /// outside it, up to [`MAX_KEPT`]; where the roots then lack
    /// registers, one fewer is kept, down to none (each computed for every
    /// root, as the interpreter's shared nodes: the same values). None for
    /// a cat inside another's part, and for a program larger than the
    /// limits above.
    pub(super) fn find(program: &Program) -> Option<Self> {
        if program.nodes().is_empty() {
            return None;
        }
        (0..=MAX_KEPT)
            .rev()
            .find_map(|share| Self::find_sharing(program, share))
    }

    /// [`Self::find`], computing at most `share` nodes several roots read
    /// once.
    fn find_sharing(program: &Program, share: usize) -> Option<Self> {
        // The first piece finds the cats (each on its first part).
        let mut b = Builder::new(program, [LeafPath::ROOT; MAX_CATS], 0, [0; MAX_CATS], share);
        b.discover = true;
        let first = b.piece()?;
        let (cats, n_cats) = (b.cats, b.n_cats);
        let radix = cats.map(|c| match program.nodes()[c.node].expr {
            Expr::Cat { ref parts, .. } => parts.len(),
            _ => 1,
        });
        let n_pieces = radix[..n_cats].iter().product::<usize>();
        if !(1..=MAX_PIECES).contains(&n_pieces) {
            return None;
        }
        let mut form = FlatForm {
            pieces: [first; MAX_PIECES],
            n_pieces,
            cats,
            radix,
            n_cats,
        };
        for p in 1..n_pieces {
            *form.pieces.get_mut(p)? = {
                let mut choice = [0; MAX_CATS];
                let mut rest = p;
                for c in (0..n_cats).rev() {
                    (choice[c], rest) = (rest % radix[c], rest / radix[c]);
                }
                Builder::new(program, cats, n_cats, choice, share).piece()?
            };
        }
        let mut first = 0;
        for piece in &mut form.pieces[..n_pieces] {
            piece.first = first;
            first += piece.n_leaves;
        }
        (first <= MAX_LEAVES).then_some(form)
    }

    /// Whether the program reads the anchor's values (an epilogue's).
    pub(super) fn reads_anchor(&self) -> bool {
        self.pieces().iter().any(|p| p.reads_anchor)
    }

    /// Line-sized temporaries a run takes its registers from: one per
    /// register the instructions write, one per leaf (gathered where a
    /// line reads it with a stride) and one for the anchor's values of a
    /// run in place; twice that, so that registers padded to whole
    /// vectors fit (at most twice a line of [`LANES`] or more elements).
    /// The largest piece's.
    pub(super) fn temporaries(&self) -> usize {
        2 * self.widest()
    }

    /// Registers the largest piece takes, at most.
    fn widest(&self) -> usize {
        let each = self.pieces().iter().map(|p| p.regs + p.n_leaves + 1);
        each.max().unwrap_or(1)
    }

    fn pieces(&self) -> &[Piece] {
        &self.pieces[..self.n_pieces]
    }

    /// Where its leaves and cats lie for `env`'s current shapes (shapes
    /// alone: see [`LeafGeometry`]).
    pub(super) fn geometry(&self, program: &Program, env: &dyn Env) -> Option<FlatGeometry> {
        let mut leaves = [LeafGeometry::Const(0.0); MAX_LEAVES];
        for piece in self.pieces() {
            let of = &mut leaves[piece.first..piece.first + piece.n_leaves];
            for (leaf, path) in of.iter_mut().zip(&piece.leaves) {
                let (views, parts) = (&path.views[..path.n_views], &path.parts[..path.n_views]);
                *leaf = program.leaf_geometry_into(views, parts, path.node, env)?;
            }
        }
        let mut cats = [CatGeometry::default(); MAX_CATS];
        for (cat, path) in cats.iter_mut().zip(&self.cats[..self.n_cats]) {
            let (views, parts) = (&path.views[..path.n_views], &path.parts[..path.n_views]);
            let (offset, coef, bounds) = program.cat_coordinate(views, parts, path.node, env)?;
            *cat = CatGeometry {
                offset,
                coef,
                bounds,
            };
        }
        Some(FlatGeometry { leaves, cats })
    }

    /// The flat program on `isa`, its leaves where `geometry` puts them in
    /// `env`'s data.
    pub(super) fn bind<'a>(
        &'a self,
        isa: Isa,
        geometry: &FlatGeometry,
        env: &'a dyn Env,
    ) -> Flat<'a> {
        let mut leaves = [LeafMap::Const(0.0); MAX_LEAVES];
        let last = &self.pieces[self.n_pieces - 1];
        let n = last.first + last.n_leaves;
        for (map, leaf) in leaves.iter_mut().zip(&geometry.leaves[..n]) {
            *map = leaf.bind(env);
        }
        Flat {
            isa,
            form: self,
            leaves,
            cats: geometry.cats,
        }
    }
}

impl Piece {
    const EMPTY: Piece = Piece {
        instrs: [Instr {
            dst: 0,
            x: Src::Anchor,
            op: Op::Unary(UnaryOp::Identity),
        }; MAX_INSTRS],
        len: 0,
        ends: [0; MAX_ROOTS + 1],
        n_roots: 0,
        leaves: [LeafPath::ROOT; MAX_LEAVES],
        n_leaves: 0,
        first: 0,
        reads_anchor: false,
        regs: 0,
    };
}

/// Where the leaves of a [`FlatForm`] lie for one set of shapes (every
/// piece's, in one list), and where its cats' parts are.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct FlatGeometry {
    leaves: [LeafGeometry; MAX_LEAVES],
    cats: [CatGeometry; MAX_CATS],
}

/// Where a cat is along its dimension at root coordinates `c`, `offset +
/// sum(c[d] * coef[d])` (wrapping: `Program::cat_coordinate`), and where
/// its parts start (`bounds[k]..bounds[k + 1]` is part `k`; past the
/// last part's end they are 0, empty ranges).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct CatGeometry {
    offset: usize,
    coef: [usize; MAX_RANK],
    bounds: [usize; MAX_PIECES + 1],
}

impl CatGeometry {
    /// Where `line` starts along the cat's dimension, and its step there.
    fn along(&self, line: &Line) -> (usize, usize) {
        let mut start = self.offset;
        let mut step = 0;
        for ((&b, &s), &c) in line.base.iter().zip(&line.step).zip(&self.coef) {
            start = start.wrapping_add(b.wrapping_mul(c));
            step += s * c;
        }
        (start, step)
    }

    /// The part holding coordinate `at`, if any.
    fn part(&self, at: usize) -> Option<usize> {
        (0..MAX_PIECES).find(|&k| (self.bounds[k]..self.bounds[k + 1]).contains(&at))
    }
}

impl<'p> Builder<'p> {
    /// A walk that adds no cat to `cats` (see `discover`).
    fn new(
        program: &'p Program,
        cats: [LeafPath; MAX_CATS],
        n_cats: usize,
        choice: [usize; MAX_CATS],
        share: usize,
    ) -> Self {
        Builder {
            program,
            form: Piece::EMPTY,
            cats,
            n_cats,
            discover: false,
            choice,
            share,
            kept: [(0, Src::Anchor); MAX_KEPT],
            n_kept: 0,
            limit: REGS,
        }
    }

    /// The piece of this walk's choice of parts: the nodes several roots
    /// read, then each root's instructions and its store.
    fn piece(&mut self) -> Option<Piece> {
        let program = self.program;
        let single = [program.root()];
        let roots = match program.named_roots() {
            [] => &single[..],
            roots => roots,
        };
        if roots.len() > 1 {
            while self.n_kept < self.share {
                match self.common(roots) {
                    Some(node) if self.keep(node) => {}
                    _ => break,
                }
            }
        }
        self.form.ends[0] = self.form.len;
        for &root in roots {
            let root = self.node(root, LeafPath::ROOT, 0)?;
            if root != Src::Reg(0) {
                // A leaf or the anchor as it is: copied.
                self.emit(0, root, Op::Unary(UnaryOp::Identity))?;
            }
            let form = &mut self.form;
            *form.ends.get_mut(form.n_roots + 1)? = form.len;
            form.n_roots += 1;
        }
        Some(self.form)
    }

    /// The largest node (the last, as nodes follow their operands) that
    /// more than one of `roots` computes, reached from each through ops
    /// alone (no view between, so every root reads it at the same
    /// coordinates) and not through a node already kept.
    fn common(&self, roots: &[usize]) -> Option<usize> {
        let nodes = self.program.nodes();
        let mut reached_by = vec![0_usize; nodes.len()];
        for (k, &root) in roots.iter().enumerate() {
            let mut stack = vec![root];
            while let Some(i) = stack.pop() {
                if self.program.is_leaf(i)
                    || self.kept_at(i).is_some()
                    || reached_by[i] & (1 << k) != 0
                {
                    continue;
                }
                reached_by[i] |= 1 << k;
                match nodes[i].expr {
                    Expr::Unary { x, .. } | Expr::Clamp { x, .. } => stack.push(x),
                    Expr::Binary { a, b, .. } => stack.extend([a, b]),
                    Expr::Where { cond, a, b } => stack.extend([cond, a, b]),
                    _ => {}
                }
            }
        }
        (0..nodes.len()).rev().find(|&i| {
            let computed = !matches!(nodes[i].expr, Expr::Anchor | Expr::Cat { .. })
                && !self.program.is_leaf(i);
            computed && reached_by[i].count_ones() > 1
        })
    }

    /// Computes `node` into the highest register its instructions fit
    /// below the limit, and keeps it there for the roots, whose
    /// instructions (and the next kept node's) then write only the
    /// registers below it. False, with nothing added, where it fits nowhere.
    fn keep(&mut self, node: usize) -> bool {
        let saved = (self.form, self.cats, self.n_cats);
        for base in (1..self.limit).rev() {
            if let Some(src @ Src::Reg(_)) = self.node(node, LeafPath::ROOT, base) {
                self.kept[self.n_kept] = (node, src);
                self.n_kept += 1;
                self.limit = base;
                return true;
            }
            (self.form, self.cats, self.n_cats) = saved;
        }
        false
    }

    /// Where kept node `i` is, if it is one.
    fn kept_at(&self, i: usize) -> Option<Src> {
        let kept = &self.kept[..self.n_kept];
        kept.iter()
            .find(|&&(node, _)| node == i)
            .map(|&(_, src)| src)
    }

    /// The cat at `path`: its index among the cats, added where this walk
    /// discovers them. None inside another cat's part.
    fn cat(&mut self, path: LeafPath) -> Option<usize> {
        let nodes = self.program.nodes();
        let views = &path.views[..path.n_views];
        if views
            .iter()
            .any(|&v| matches!(nodes[v].expr, Expr::Cat { .. }))
        {
            return None;
        }
        match self.cats[..self.n_cats].iter().position(|c| c.same(&path)) {
            Some(c) => Some(c),
            None if self.discover => {
                *self.cats.get_mut(self.n_cats)? = path;
                self.n_cats += 1;
                Some(self.n_cats - 1)
            }
            None => None,
        }
    }

    /// Flattens node `i` (read through the views of `path`) into register
    /// `r` and above: returns where its values are (`r`, or a leaf or the
    /// anchor, which need no instruction), or None if the program has no
    /// flat form.
    fn node(&mut self, i: usize, path: LeafPath, r: usize) -> Option<Src> {
        let program = self.program;
        if path.n_views == 0 {
            if let Some(src) = self.kept_at(i) {
                return Some(src);
            }
        }
        if program.is_leaf(i) {
            return self.leaf(LeafPath { node: i, ..path });
        }
        match program.nodes()[i].expr {
            Expr::Anchor => {
                self.form.reads_anchor = true;
                Some(Src::Anchor)
            }
            Expr::Broadcast { x } | Expr::View { x, .. } | Expr::Slice { x, .. } => {
                self.node(x, path.below(i, 0)?, r)
            }
            Expr::Cat { ref parts, .. } => {
                let part = self.choice[self.cat(LeafPath { node: i, ..path })?];
                self.node(parts[part], path.below(i, part)?, r)
            }
            Expr::Unary { op, x } => {
                let x = self.node(x, path, r)?;
                self.emit(r, x, Op::Unary(op))
            }
            Expr::Clamp { x, min, max } => {
                let x = self.node(x, path, r)?;
                self.emit(r, x, Op::Clamp(min, max))
            }
            Expr::Binary { op, a, b } => {
                let a = self.node(a, path, r)?;
                let b = self.node(b, path, r + 1)?;
                self.emit(r, a, Op::Binary(op, b))
            }
            Expr::Where { cond, a, b } if self.elu(cond, a, b).is_some() => {
                let alpha = self.elu(cond, a, b)?;
                let x = self.node(a, path, r)?;
                self.emit(r, x, Op::Elu(alpha))
            }
            Expr::Where { cond, a, b } => {
                let a = self.node(a, path, r)?;
                let other = self.node(b, path, r + 1)?;
                let cond = self.node(cond, path, r + 2)?;
                self.emit(r, a, Op::Where { cond, other })
            }
            Expr::Load | Expr::Const(_) => None,
        }
    }

    /// `alpha` where `where(cond, a, b)` is an ELU of `a` as the blob
    /// writes `aten.elu` with unit scales (`nn.ELU`, every SEANet conv's
    /// activation): `cond = a > 0`, `b = (exp(a) - 1) * alpha`.
    fn elu(&self, cond: usize, a: usize, b: usize) -> Option<f32> {
        let nodes = self.program.nodes();
        let constant = |i: usize| match nodes[i].expr {
            Expr::Const(c) => Some(c),
            _ => None,
        };
        let binary = |i: usize, want: BinaryOp| match nodes[i].expr {
            Expr::Binary { op, a, b } if op == want => Some((a, constant(b)?)),
            _ => None,
        };
        let (x, zero) = binary(cond, BinaryOp::Gt)?;
        let (negative, alpha) = binary(b, BinaryOp::Mul)?;
        let (exp, one) = binary(negative, BinaryOp::Sub)?;
        let exp_of_a = nodes[exp].expr
            == Expr::Unary {
                op: UnaryOp::Exp,
                x: a,
            };
        (x == a && exp_of_a && zero == 0.0 && one == 1.0).then_some(alpha)
    }

    /// The leaf at `path`, added unless the same one is already there.
    fn leaf(&mut self, path: LeafPath) -> Option<Src> {
        let form = &mut self.form;
        let k = match form.leaves[..form.n_leaves]
            .iter()
            .position(|l| l.same(&path))
        {
            Some(k) => k,
            None => {
                *form.leaves.get_mut(form.n_leaves)? = path;
                form.n_leaves += 1;
                form.n_leaves - 1
            }
        };
        Some(Src::Leaf(k as u8))
    }

    /// Appends `r = op(x, ...)`.
    fn emit(&mut self, r: usize, x: Src, op: Op) -> Option<Src> {
        if r >= self.limit {
            return None;
        }
        let form = &mut self.form;
        *form.instrs.get_mut(form.len)? = Instr {
            dst: r as u8,
            x,
            op,
        };
        form.len += 1;
        form.regs = form.regs.max(r + 1);
        Some(Src::Reg(r as u8))
    }
}

/// A flat program bound to one call's tensors.
#[derive(Clone, Copy, Debug)]
pub(super) struct Flat<'a> {
    /// The program's instruction set.
    isa: Isa,
    form: &'a FlatForm,
    /// Every piece's ([`Piece::first`]).
    leaves: [LeafMap<'a>; MAX_LEAVES],
    cats: [CatGeometry; MAX_CATS],
}

/// A leaf's elements along one line.
#[derive(Clone, Copy, Debug)]
enum Read<'a> {
    Scalar(f32),
    Slice(&'a [f32]),
    /// Every `stride`-th element of the run, from its first: gathered a
    /// block at a time into a register of its own.
    Strided(&'a [f32], usize),
}

/// An operand's elements along one block.
#[derive(Clone, Copy, Debug)]
enum Operand<'a> {
    Scalar(f32),
    Slice(&'a [f32]),
}

impl<'a> Flat<'a> {
    /// Writes the program along `line` into `out` and returns true, or
    /// returns false, writing nothing, where `tmp` holds fewer than
    /// [`FlatForm::temporaries`] line-sized temporaries. `anchor`: the
    /// anchor's values along the line (as long as `out`) where the program
    /// reads them. A leaf read with a stride along the line (a transposed
    /// operand, a line across channels) is gathered a block at a time.
    ///
    /// # Panics
    /// If the line leaves a tensor (a bug of the caller's plan, as in
    /// [`Program::eval`]).
    pub(super) fn run(
        &self,
        line: &Line,
        anchor: &[f32],
        out: &mut [f32],
        tmp: &mut [f32],
    ) -> bool {
        self.run_roots(line, anchor, 1, &mut [out], tmp)
    }

    /// [`Self::run`] of the program's first `roots` roots, into `outs`
    /// (one per root, equally long; the first root alone is the
    /// program's value as [`Program::eval`] computes it). False also
    /// where the program has fewer roots or `outs` is not one per root.
    pub(super) fn run_roots(
        &self,
        line: &Line,
        anchor: &[f32],
        roots: usize,
        outs: &mut [&mut [f32]],
        tmp: &mut [f32],
    ) -> bool {
        let form = self.form;
        let len = outs.first().map_or(0, |o| o.len());
        let n_roots = form.pieces[0].n_roots;
        if roots > n_roots || outs.len() != roots || outs.iter().any(|o| o.len() != len) {
            return false;
        }
        if len == 0 {
            return true;
        }
        if form.n_cats == 0 {
            return self.run_piece(0, line, anchor, outs, tmp);
        }
        // Registers for the largest piece, and a line inside every cat:
        // declined before any stretch is written.
        let cats = &self.cats[..form.n_cats];
        // Where the line starts along each cat, and its step there.
        let mut along = [(0, 0); MAX_CATS];
        for (a, cat) in along.iter_mut().zip(cats) {
            *a = cat.along(line);
        }
        let inside = cats.iter().zip(&along).all(|(cat, &(start, step))| {
            let last = start.wrapping_add(step * (len - 1));
            cat.part(start).is_some() && cat.part(last).is_some()
        });
        if !inside || registers(tmp, len, form.widest()).is_none() {
            return false;
        }
        let mut t = 0;
        while t < len {
            // This stretch's piece, and where the first of its parts ends.
            let (mut piece, mut end) = (0, len);
            for ((cat, radix), &(start, step)) in cats.iter().zip(&form.radix).zip(&along) {
                let k = cat
                    .part(start.wrapping_add(step * t))
                    .expect("inside the cat");
                piece = piece * radix + k;
                if step > 0 {
                    end = end.min((cat.bounds[k + 1] - start).div_ceil(step));
                }
            }
            let mut stretch = *line;
            for (b, s) in stretch.base.iter_mut().zip(&line.step) {
                *b += t * s;
            }
            let mut parts: [&mut [f32]; MAX_ROOTS] = Default::default();
            for (part, out) in parts.iter_mut().zip(outs.iter_mut()) {
                *part = &mut out[t..end];
            }
            let anchor = anchor.get(t..end).unwrap_or_default();
            let ran = self.run_piece(piece, &stretch, anchor, &mut parts[..roots], tmp);
            debug_assert!(ran, "registers were checked for the largest piece");
            t = end;
        }
        true
    }

    /// The leaves `piece` reads, bound.
    fn leaves_of(&self, piece: &Piece) -> &[LeafMap<'a>] {
        &self.leaves[piece.first..piece.first + piece.n_leaves]
    }

    /// [`Self::run_roots`] of piece `p` (which the caller checked `outs`
    /// for).
    fn run_piece(
        &self,
        p: usize,
        line: &Line,
        anchor: &[f32],
        outs: &mut [&mut [f32]],
        tmp: &mut [f32],
    ) -> bool {
        let piece = &self.form.pieces[p];
        let leaves = self.leaves_of(piece);
        let len = outs.first().map_or(0, |o| o.len());
        let mut reads = [Read::Scalar(0.0); MAX_LEAVES];
        let mut gathered = 0;
        for (read, leaf) in reads.iter_mut().zip(leaves) {
            *read = match leaf.read(line, len) {
                Some(Leaf::Scalar(v)) => Read::Scalar(v),
                Some(Leaf::Contiguous(v, _)) => Read::Slice(v),
                None => {
                    let Some((v, stride)) = leaf.strided(line, len) else {
                        return false;
                    };
                    gathered += 1;
                    Read::Strided(v, stride)
                }
            };
        }
        // A piece that only views a leaf (a cat's stored state) is that
        // leaf's elements: read straight into the output, as the
        // interpreter loads it, not through a register block by block.
        let copy_of_leaf = Instr {
            dst: 0,
            x: Src::Leaf(0),
            op: Op::Unary(UnaryOp::Identity),
        };
        if let ([out], [instr]) = (&mut *outs, &piece.instrs[..piece.len]) {
            if *instr == copy_of_leaf {
                match reads[0] {
                    Read::Scalar(v) => out.fill(v),
                    Read::Slice(v) => copy(out, &v[..len]),
                    Read::Strided(v, stride) => strided::gather_by(self.isa, stride, v, out),
                }
                return true;
            }
        }
        let Some((regs, w)) = registers(tmp, len, piece.regs + gathered + 1) else {
            return false;
        };
        flat(
            self.isa,
            &piece.instrs[..piece.len],
            &piece.ends[..=outs.len()],
            &reads[..piece.n_leaves],
            Some(anchor),
            outs,
            regs,
            w,
            self.isa,
        );
        true
    }

    /// Whether rows of `len` elements along dimension `along` of the root,
    /// consecutive along dimension `across`, lie end to end in every leaf
    /// ([`LeafMap::rows_end_to_end`]): then such rows are one line, a run
    /// from the first row's start ([`Self::run`] of that line, `rows * len`
    /// long). A GLU of a conv's whole rows is 128 lines of 32 elements at
    /// T = 32; as one line, its vectors are independent of each other
    /// instead of a few dependent ones per row. Never through a cat,
    /// whose parts a run of several rows would leave.
    pub(super) fn rows_are_one_line(&self, across: usize, along: usize, len: usize) -> bool {
        self.form.n_cats == 0
            && self
                .leaves_of(&self.form.pieces[0])
                .iter()
                .all(|l| l.rows_end_to_end(across, along, len))
    }

    /// Whether every leaf is read contiguously (or as one value) along
    /// dimension `along` of the root, and no cat splits the lines: lines
    /// along it run flat at one set-up each. A line through a cat runs a
    /// set-up per part: a decode step's rows (`cat(state, x)` along time,
    /// 3 + 1 elements) are then better read across the channels, where
    /// each line lies in one part (read along, LFM2's decode step ran 45%
    /// slower on the device, 16-core Xeon).
    pub(super) fn contiguous_along(&self, along: usize) -> bool {
        if self.form.n_cats > 0 {
            return false;
        }
        self.leaves_of(&self.form.pieces[0])
            .iter()
            .all(|l| match *l {
                LeafMap::Const(_) => true,
                LeafMap::Stored { coef, .. } => coef[along] <= 1,
            })
    }

    /// Whether the program computes each element from the anchor's value
    /// at the same place alone (every leaf a constant, no cat): a block of
    /// rows can be finished in place at once.
    pub(super) fn pointwise(&self) -> bool {
        let piece = &self.form.pieces[0];
        self.form.n_cats == 0
            && piece.reads_anchor
            && self
                .leaves_of(piece)
                .iter()
                .all(|l| matches!(l, LeafMap::Const(_)))
    }

    /// The program applied to anchor values `values` in place, for a
    /// [`Self::pointwise`] one (returns false, changing nothing, for any
    /// other, or where `tmp` holds fewer than [`FlatForm::temporaries`]
    /// blocks): the same loops as [`Self::run`], so bit for bit its
    /// results.
    pub(super) fn finish_in_place(&self, values: &mut [f32], tmp: &mut [f32]) -> bool {
        if !self.pointwise() {
            return false;
        }
        let piece = &self.form.pieces[0];
        let Some((regs, w)) = registers(tmp, values.len(), piece.regs + 1) else {
            return false;
        };
        let mut reads = [Read::Scalar(0.0); MAX_LEAVES];
        for (read, leaf) in reads.iter_mut().zip(self.leaves_of(piece)) {
            if let LeafMap::Const(v) = *leaf {
                *read = Read::Scalar(v);
            }
        }
        flat(
            self.isa,
            &piece.instrs[..piece.len],
            &piece.ends[..=1],
            &reads[..piece.n_leaves],
            None,
            &mut [values],
            regs,
            w,
            self.isa,
        );
        true
    }
}

/// `n` registers for lines of `len` elements: `tmp`'s first blocks (of
/// `len` elements where shorter), one per register the instructions
/// write, one per gathered leaf and one for the anchor, if it holds them,
/// and their width: a whole number of vectors where `tmp` has room.
fn registers(tmp: &mut [f32], len: usize, n: usize) -> Option<(&mut [f32], usize)> {
    let w = len.min(BLOCK);
    let padded = w.next_multiple_of(LANES);
    [padded, w]
        .into_iter()
        .find(|&w| n * w <= tmp.len())
        .map(|w| (&mut tmp[..n * w], w))
}

per_backend! {
    /// The instructions over `outs`, block by block: those before
    /// `ends[0]`, then each root's (to `ends[k + 1]`) and its store into
    /// its output; `anchor` None:
    /// the first output holds the anchor's values, replaced by the
    /// results. `regs`: the
    /// registers, `w` elements each (at least `min(out.len(), BLOCK)`),
    /// then one per strided leaf of `reads` and the last for the anchor's
    /// values of a run in place. `moves`: the instruction set the strided
    /// leaves are gathered with.
    #[allow(clippy::too_many_arguments)]
    fn flat(
        instrs: &[Instr],
        ends: &[usize],
        reads: &[Read],
        anchor: Option<&[f32]>,
        outs: &mut [&mut [f32]],
        regs: &mut [f32],
        w: usize,
        moves: Isa,
    ) => flat_generic
}

/// The loops, inlined into each instruction-set variant; `F` as in
/// `UnaryOp::apply`, so every op rounds as the interpreter's.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn flat_generic<const F: bool>(
    instrs: &[Instr],
    ends: &[usize],
    reads: &[Read],
    anchor: Option<&[f32]>,
    outs: &mut [&mut [f32]],
    regs: &mut [f32],
    w: usize,
    moves: Isa,
) {
    let strided = reads
        .iter()
        .filter(|r| matches!(r, Read::Strided(..)))
        .count();
    let (regs, rest) = regs.split_at_mut(regs.len() - (strided + 1) * w);
    let (gathers, own) = rest.split_at_mut(strided * w);
    let len = outs.first().map_or(0, |o| o.len());
    for at in (0..len).step_by(BLOCK) {
        let n = BLOCK.min(len - at);
        // Each leaf's elements in this block: in place, or gathered into
        // its register.
        let mut blocks = [Operand::Scalar(0.0); MAX_LEAVES];
        let mut free = gathers.chunks_exact_mut(w);
        for (block, read) in blocks.iter_mut().zip(reads) {
            *block = match *read {
                Read::Scalar(v) => Operand::Scalar(v),
                Read::Slice(v) => Operand::Slice(&v[at..at + n]),
                Read::Strided(v, stride) => {
                    let reg = free.next().expect("a register per strided leaf");
                    strided::gather_by(moves, stride, &v[at * stride..], &mut reg[..n]);
                    Operand::Slice(&reg[..n])
                }
            };
        }
        let anchor: &[f32] = match anchor {
            // Empty where the program reads no anchor (a prologue's).
            Some(a) => a.get(at..at + n).unwrap_or_default(),
            None => {
                own[..n].copy_from_slice(&outs[0][at..at + n]);
                &own[..n]
            }
        };
        // One loop, so that `run_block` is inlined once.
        for (k, &end) in ends.iter().enumerate() {
            let from = k.checked_sub(1).map_or(0, |j| ends[j]);
            let out = k.checked_sub(1).map(|j| &mut outs[j][at..at + n]);
            run_block::<F>(&instrs[from..end], &blocks, anchor, regs, w, n, out);
        }
    }
}

/// A run of instructions over one block of `n` elements: a root's, its
/// values stored into `out` (`n` long), or (`out` None) those computing
/// the nodes several roots read, kept in their registers. `blocks` the leaves' elements, `anchor`
/// the anchor's, `regs` the registers, `w` elements each. The last
/// instruction writes `out` itself where it takes one pass
/// ([`Instr::one_pass`]: a gate `b * x` of two leaves); otherwise its
/// register is copied there.
#[inline(always)]
fn run_block<const F: bool>(
    instrs: &[Instr],
    blocks: &[Operand],
    anchor: &[f32],
    regs: &mut [f32],
    w: usize,
    n: usize,
    mut out: Option<&mut [f32]>,
) {
    // Ops on registers alone run over whole vectors where the registers
    // are that wide: a line's last few elements would otherwise take the
    // loops' scalar tails (a sigmoid's division each: 8 of a 40-element
    // line's took half its time). The lanes past `n` hold stale values,
    // computed and never read.
    let whole = n.next_multiple_of(LANES).min(w);
    // One call site of `apply`: each inlines every op's loops (a second
    // one, for the last instruction, made the AVX2 variant 3.5 times
    // larger and Mimi's decoder 10% slower on the 16-core Xeon;
    // tests/test_release_machine_code.py bounds each variant's size).
    for (i, ins) in instrs.iter().enumerate() {
        let d = usize::from(ins.dst);
        let (low, high) = regs.split_at_mut((d + 1) * w);
        let operands = Operands {
            blocks,
            anchor,
            high,
            d,
            w,
            whole,
        };
        let dst = match out.as_deref_mut() {
            // A root's values are in register 0 (`Piece::ends`).
            Some(out) if i + 1 == instrs.len() && ins.one_pass() => {
                debug_assert_eq!(d, 0);
                out
            }
            _ => &mut low[d * w..][..whole],
        };
        apply::<F>(ins, &operands, dst, n);
    }
    match (out, instrs.last()) {
        (Some(out), Some(last)) if !last.one_pass() => out.copy_from_slice(&regs[..n]),
        _ => {}
    }
}

/// Where one instruction's operands are, for a destination register `d`
/// (every register operand is above it, in `high`).
struct Operands<'r, 'b> {
    blocks: &'r [Operand<'b>],
    anchor: &'r [f32],
    high: &'r [f32],
    d: usize,
    w: usize,
    whole: usize,
}

impl<'r> Operands<'r, '_> {
    #[inline(always)]
    fn get(&self, src: Src) -> Operand<'r> {
        match src {
            Src::Reg(r) => {
                Operand::Slice(&self.high[(usize::from(r) - self.d - 1) * self.w..][..self.whole])
            }
            Src::Leaf(k) => self.blocks[usize::from(k)],
            Src::Anchor => Operand::Slice(self.anchor),
        }
    }
}

/// `dst = op(x, ...)` for instruction `ins` over a block of `n` elements;
/// `dst` is `n` long, or a register of whole vectors (see [`run_block`])
/// holding `x` already where `x` is that register.
#[inline(always)]
fn apply<const F: bool>(ins: &Instr, operands: &Operands, dst: &mut [f32], n: usize) {
    if ins.x != Src::Reg(ins.dst) {
        match (ins.op, operands.get(ins.x)) {
            // A select or a binary op of a leaf or the anchor (a leaky
            // ReLU's `x`, a gate's `b`) writes the register from it: one
            // pass, no copy first.
            (Op::Where { cond, other }, Operand::Slice(x)) => {
                if let (Operand::Slice(c), Operand::Slice(o)) =
                    (operands.get(cond), operands.get(other))
                {
                    select_into(&c[..n], &x[..n], &o[..n], &mut dst[..n]);
                    return;
                }
                copy(&mut dst[..n], &x[..n]);
            }
            (Op::Binary(op, b), Operand::Slice(x)) => {
                match operands.get(b) {
                    Operand::Slice(v) => op.apply_into_generic::<F>(&x[..n], v, &mut dst[..n]),
                    Operand::Scalar(v) => {
                        op.apply_scalar_into_generic::<F>(&x[..n], v, &mut dst[..n])
                    }
                }
                return;
            }
            (_, Operand::Slice(v)) => dst[..n].copy_from_slice(&v[..n]),
            (_, Operand::Scalar(v)) => dst.fill(v),
        }
    }
    match ins.op {
        Op::Unary(UnaryOp::Identity) => {}
        Op::Unary(op) => op.apply_generic::<F>(dst),
        Op::Clamp(min, max) => clamp(dst, min, max),
        Op::Elu(alpha) => elu::<F>(&mut dst[..n], alpha),
        Op::Binary(op, b) => match operands.get(b) {
            // A leaf or the anchor has `n` elements here.
            Operand::Slice(v) if v.len() < dst.len() => op.apply_generic::<F>(&mut dst[..n], v),
            Operand::Slice(v) => op.apply_generic::<F>(dst, v),
            Operand::Scalar(v) => op.apply_scalar_generic::<F>(dst, v),
        },
        Op::Where { cond, other } => {
            select_block(operands.get(cond), operands.get(other), &mut dst[..n], n)
        }
    }
}

/// `dst = cond != 0 ? dst : other` over one block of `n` elements, either
/// operand one value or a slice: the interpreter's select, element by
/// element.
#[inline(always)]
fn select_block(cond: Operand, other: Operand, dst: &mut [f32], n: usize) {
    match (cond, other) {
        (Operand::Slice(c), Operand::Slice(o)) => select(&c[..n], dst, &o[..n]),
        (Operand::Slice(c), Operand::Scalar(o)) => select_scalar(&c[..n], dst, o),
        (Operand::Scalar(c), _) if c != 0.0 => {}
        (Operand::Scalar(_), Operand::Slice(o)) => copy(dst, &o[..n]),
        (Operand::Scalar(_), Operand::Scalar(o)) => dst.fill(o),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fused::program::Line;
    use crate::fused::shape::MAX_RANK;
    use crate::test_support::{Rng, TestEnv};

    const B: usize = 2;
    const C: usize = 3;
    const N: usize = 150;
    /// A cat's first part along time (a conv's `K - 1`, or a longer state).
    const P: usize = 70;
    /// `[B, N, C]` read as `[B, C, N]`, and back.
    const SWAP: [Option<u8>; MAX_RANK] = [Some(0), Some(2), Some(1), None];

    /// The tensors random programs read, by value index.
    struct Tensors {
        /// `[B, C, N]`, two of them.
        x: [usize; 2],
        /// `[B, 2C, N]`, read as two `[B, C, N]` halves (a GLU's).
        y: usize,
        /// `[C, 1]`, a per-channel parameter along time.
        p: usize,
        /// `[B, N, C]`: strided along time once permuted.
        xt: usize,
        /// `[B, C, 2N]`, read every other element (stride 2 along time).
        z: usize,
        /// `[B, C, P]`: a streaming conv's state.
        state: usize,
        /// Shapes computed nodes take.
        bcn: usize,
        bnc: usize,
        /// Shapes of cats' parts: `[B, C, P]`, `[B, C, N - P]`, `[B, C,
        /// N - 2P]`, `[B, 1, N]`, `[B, C - 1, N]`.
        bcp: usize,
        bcq: usize,
        bcr: usize,
        b1n: usize,
        bc1n: usize,
    }

    fn tensors(env: &mut TestEnv, rng: &mut Rng) -> Tensors {
        let mut x = || rng.vec(B * C * N, -3.0, 3.0);
        let x = [x(), x()];
        Tensors {
            x: x.map(|v| env.stored(&[B, C, N], v)),
            y: env.stored(&[B, 2 * C, N], rng.vec(B * 2 * C * N, -3.0, 3.0)),
            p: env.stored(&[C, 1], rng.vec(C, -2.0, 2.0)),
            xt: env.stored(&[B, N, C], rng.vec(B * C * N, -3.0, 3.0)),
            z: env.stored(&[B, C, 2 * N], rng.vec(B * C * 2 * N, -3.0, 3.0)),
            state: env.stored(&[B, C, P], rng.vec(B * C * P, -3.0, 3.0)),
            bcn: env.computed(&[B, C, N]),
            bnc: env.computed(&[B, N, C]),
            bcp: env.computed(&[B, C, P]),
            bcq: env.computed(&[B, C, N - P]),
            bcr: env.computed(&[B, C, N - 2 * P]),
            b1n: env.computed(&[B, 1, N]),
            bc1n: env.computed(&[B, C - 1, N]),
        }
    }

    /// Grows a random `[B, C, N]` node of `p` of at most `depth` levels:
    /// loads (plain, a half of `y`, every other element of `z`, a
    /// broadcast parameter, a permuted `[B, N, C]` tensor), constants, the anchor (`anchor`), every unary
    /// and binary op, clamps, selects, and a subtree computed in `[B, N,
    /// C]` then permuted.
    fn grow(p: &mut Program, t: &Tensors, rng: &mut Rng, depth: usize, anchor: bool) -> usize {
        grow_in(p, t, rng, depth, anchor, true)
    }

    /// [`grow`], with cats where `cat` (not inside another's part).
    fn grow_in(
        p: &mut Program,
        t: &Tensors,
        rng: &mut Rng,
        depth: usize,
        anchor: bool,
        cat: bool,
    ) -> usize {
        let pick = if depth == 0 {
            rng.range(0, 5)
        } else {
            rng.range(0, 12)
        };
        match pick {
            0 | 1 => p.push(Expr::Load, t.x[rng.range(0, 1)]),
            2 if rng.range(0, 2) == 0 => {
                let z = p.push(Expr::Load, t.z);
                let slice = Expr::Slice {
                    x: z,
                    dim: 2,
                    start: rng.range(0, 1) as i64,
                    step: 2,
                };
                p.push(slice, t.bcn)
            }
            2 => {
                let y = p.push(Expr::Load, t.y);
                let start = [0, C as i64, -(C as i64)][rng.range(0, 2)];
                let slice = Expr::Slice {
                    x: y,
                    dim: 1,
                    start,
                    step: 1,
                };
                p.push(slice, t.bcn)
            }
            3 => {
                let w = p.push(Expr::Load, t.p);
                p.push(Expr::Broadcast { x: w }, t.bcn)
            }
            4 if anchor => p.push(Expr::Anchor, t.bcn),
            4 => p.push(Expr::Const(rng.uniform(-2.0, 2.0)), t.bcn),
            5 => {
                let v = p.push(Expr::Load, t.xt);
                p.push(Expr::View { x: v, map: SWAP }, t.bcn)
            }
            6 | 7 => {
                let op = UnaryOp::ALL[rng.range(0, UnaryOp::ALL.len() - 1)];
                let x = grow_in(p, t, rng, depth - 1, anchor, cat);
                p.push(Expr::Unary { op, x }, t.bcn)
            }
            8 | 9 => {
                let op = BinaryOp::ALL[rng.range(0, BinaryOp::ALL.len() - 1)];
                let a = grow_in(p, t, rng, depth - 1, anchor, cat);
                let b = grow_in(p, t, rng, depth - 1, anchor, cat);
                p.push(Expr::Binary { op, a, b }, t.bcn)
            }
            10 => {
                let x = grow_in(p, t, rng, depth - 1, anchor, cat);
                let (min, max) = (rng.uniform(-2.0, 0.0), rng.uniform(0.0, 2.0));
                p.push(Expr::Clamp { x, min, max }, t.bcn)
            }
            12 if cat => {
                // A slice of a part-sized stretch of a random node, from
                // `start` along `dim`.
                let part = |p: &mut Program, rng: &mut Rng, dim, start, value| {
                    let x = grow_in(p, t, rng, depth - 1, anchor, false);
                    p.push(
                        Expr::Slice {
                            x,
                            dim,
                            start,
                            step: 1,
                        },
                        value,
                    )
                };
                let (parts, dim) = match rng.range(0, 3) {
                    // A streaming conv's input: its state then the new
                    // samples, along time.
                    0 => {
                        let state = p.push(Expr::Load, t.state);
                        (vec![state, part(p, rng, 2, P as i64, t.bcq)], 2)
                    }
                    1 => {
                        let a = part(p, rng, 2, -(P as i64), t.bcp);
                        (vec![a, part(p, rng, 2, P as i64, t.bcq)], 2)
                    }
                    // Zeros, a stretch, a stretch: a padding.
                    2 => {
                        let zeros = p.push(Expr::Const(0.0), t.bcp);
                        let a = part(p, rng, 2, 1, t.bcp);
                        (vec![zeros, a, part(p, rng, 2, 2 * P as i64, t.bcr)], 2)
                    }
                    // Along the channels: every line across them crosses.
                    _ => {
                        let a = part(p, rng, 1, C as i64 - 1, t.b1n);
                        (vec![a, part(p, rng, 1, 1, t.bc1n)], 1)
                    }
                };
                p.push(Expr::Cat { parts, dim }, t.bcn)
            }
            _ if rng.range(0, 1) == 0 => {
                let cond = grow_in(p, t, rng, depth - 1, anchor, cat);
                let a = grow_in(p, t, rng, depth - 1, anchor, cat);
                let b = grow_in(p, t, rng, depth - 1, anchor, cat);
                p.push(Expr::Where { cond, a, b }, t.bcn)
            }
            _ => {
                // A product computed along `[B, N, C]`, then permuted.
                let a = p.push(Expr::Load, t.xt);
                let x = grow_in(p, t, rng, depth - 1, anchor, cat);
                let b = p.push(Expr::View { x, map: SWAP }, t.bnc);
                let m = p.push(
                    Expr::Binary {
                        op: BinaryOp::Mul,
                        a,
                        b,
                    },
                    t.bnc,
                );
                p.push(Expr::View { x: m, map: SWAP }, t.bcn)
            }
        }
    }

    /// ELU as the blob writes it for `nn.ELU`, the scalars as constants:
    /// `where(x > 0, x, (exp(x) - 1) * alpha)`. Of a stored tensor, of a
    /// sum, and of the new samples of a streaming conv's input,
    /// `cat(state, elu(x))`: one fused instruction per ELU, the
    /// interpreter's values bit for bit, over values that overflow `exp`,
    /// zeros of both signs, infinities and NaN.
    #[test]
    fn elu_runs_as_one_instruction_bit_for_bit() {
        let mut rng = Rng::new(5);
        let mut env = TestEnv::default();
        let mut x = rng.vec(B * C * N, -30.0, 100.0);
        x[..6].copy_from_slice(&[0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 88.8]);
        let x = env.stored(&[B, C, N], x);
        let y = env.stored(&[B, C, N], rng.vec(B * C * N, -3.0, 3.0));
        let state = env.stored(&[B, C, P], rng.vec(B * C * P, -3.0, 3.0));
        let (bcn, bcq) = (env.computed(&[B, C, N]), env.computed(&[B, C, N - P]));
        let bin = |p: &mut Program, op, a, b| p.push(Expr::Binary { op, a, b }, bcn);
        let konst = |p: &mut Program, c| p.push(Expr::Const(c), bcn);
        let elu = |p: &mut Program, x: usize, alpha: f32| {
            let zero = konst(p, 0.0);
            let cond = bin(p, BinaryOp::Gt, x, zero);
            let op = UnaryOp::Exp;
            let exp = p.push(Expr::Unary { op, x }, bcn);
            let one = konst(p, 1.0);
            let m1 = bin(p, BinaryOp::Sub, exp, one);
            let k = konst(p, alpha);
            let b = bin(p, BinaryOp::Mul, m1, k);
            p.push(Expr::Where { cond, a: x, b }, bcn)
        };
        let mut programs = Vec::new();
        let mut p = Program::default();
        let lx = p.push(Expr::Load, x);
        elu(&mut p, lx, 1.0);
        programs.push(p);
        let mut p = Program::default();
        let (lx, ly) = (p.push(Expr::Load, x), p.push(Expr::Load, y));
        let sum = bin(&mut p, BinaryOp::Add, lx, ly);
        elu(&mut p, sum, 0.7);
        programs.push(p);
        let mut p = Program::default();
        let ls = p.push(Expr::Load, state);
        let lx = p.push(Expr::Load, x);
        let e = elu(&mut p, lx, 1.0);
        let new = p.push(
            Expr::Slice {
                x: e,
                dim: 2,
                start: P as i64,
                step: 1,
            },
            bcq,
        );
        p.push(
            Expr::Cat {
                parts: vec![ls, new],
                dim: 2,
            },
            bcn,
        );
        programs.push(p);
        for (case, p) in programs.iter().enumerate() {
            let form = FlatForm::find(p).expect("a flat form");
            let elus = form
                .pieces()
                .iter()
                .flat_map(|piece| &piece.instrs[..piece.len]);
            let elus: Vec<_> = elus.filter(|i| matches!(i.op, Op::Elu(_))).collect();
            // The cat's: its state's piece is a copy, the new samples' an ELU.
            assert_eq!(elus.len(), 1, "case {case}");
            let rows = (0..B * C).map(|row| (Line::along([row / C, row % C, 0, 0], 2), N, &[][..]));
            assert_runs_as_eval(p, &form, &env, rows, &format!("case {case}"));
        }
    }

    /// Runs `form`, `p`'s flat form, along every `(line, len, anchor)` on
    /// every instruction set, and asserts it writes what `p.eval` does,
    /// bit for bit.
    fn assert_runs_as_eval<'a>(
        p: &Program,
        form: &FlatForm,
        env: &TestEnv,
        lines: impl Iterator<Item = (Line, usize, &'a [f32])> + Clone,
        what: &str,
    ) {
        for isa in Isa::all_available() {
            let geometry = form.geometry(p, env).expect("every leaf resolves");
            let flat = form.bind(isa, &geometry, env);
            let mut tmp = vec![0.0; N * p.temporaries()];
            let mut regs = vec![0.0; N * form.temporaries()];
            for (line, len, anchor) in lines.clone() {
                let (mut want, mut got) = (vec![0.0; len], vec![f32::NAN; len]);
                p.eval(isa, env, anchor, &line, &mut want, &mut tmp);
                assert!(flat.run(&line, anchor, &mut got, &mut regs));
                assert_eq!(bits(&want), bits(&got), "{what}, {isa:?}, {line:?}");
            }
        }
    }

    /// A root whose last instruction reads a leaf or the anchor (a gate
    /// `b * x`, `x * 0.5`, a select) writes the output itself in one
    /// pass: the interpreter's values bit for bit, on lines of every
    /// length (the loops' tails), a gathered leaf's too.
    #[test]
    fn roots_of_leaves_write_their_output_in_one_pass_bit_for_bit() {
        let mut rng = Rng::new(9);
        let mut env = TestEnv::default();
        let t = tensors(&mut env, &mut rng);
        let bin = |p: &mut Program, op, a, b| p.push(Expr::Binary { op, a, b }, t.bcn);
        let mut programs = Vec::new();
        for op in [BinaryOp::Mul, BinaryOp::Sub, BinaryOp::Maximum] {
            // Of two leaves, one of them transposed (gathered).
            let mut p = Program::default();
            let a = p.push(Expr::Load, t.x[0]);
            let xt = p.push(Expr::Load, t.xt);
            let b = p.push(Expr::View { x: xt, map: SWAP }, t.bcn);
            bin(&mut p, op, a, b);
            programs.push(p);
            // Of the anchor and a constant.
            let mut p = Program::default();
            let a = p.push(Expr::Anchor, t.bcn);
            let k = p.push(Expr::Const(0.5), t.bcn);
            bin(&mut p, op, a, k);
            programs.push(p);
        }
        let mut p = Program::default();
        let (a, b) = (p.push(Expr::Load, t.x[0]), p.push(Expr::Load, t.x[1]));
        let cond = bin(&mut p, BinaryOp::Gt, a, b);
        p.push(Expr::Where { cond, a, b }, t.bcn);
        programs.push(p);
        let anchor = rng.vec(N, -3.0, 3.0);
        for (case, p) in programs.iter().enumerate() {
            let form = FlatForm::find(p).expect("a flat form");
            let piece = &form.pieces()[0];
            let last = piece.instrs[piece.len - 1];
            assert!(last.one_pass(), "case {case}: {last:?}");
            let lines = [0, 1, 13, 100, N - 3]
                .into_iter()
                .map(|t0| (Line::along([1, 2, t0, 0], 2), N - t0, &anchor[t0..]));
            assert_runs_as_eval(p, &form, &env, lines, &format!("case {case}"));
        }
    }

    /// A scan's `a = exp(dt * A)` and `u = dt * x`, `dt = softplus(p)`
    /// (as the recipes would take it, here with `A` a stored tensor):
    /// `softplus` is computed once per block, kept for both roots, each
    /// root the interpreter's bit for bit. A root that is the shared node
    /// itself is stored from its register.
    #[test]
    fn a_node_several_roots_read_is_computed_once() {
        let mut rng = Rng::new(21);
        let mut env = TestEnv::default();
        let t = tensors(&mut env, &mut rng);
        let un = |p: &mut Program, op, x| p.push(Expr::Unary { op, x }, t.bcn);
        let bin = |p: &mut Program, op, a, b| p.push(Expr::Binary { op, a, b }, t.bcn);
        for dt_is_a_root in [false, true] {
            let mut p = Program::default();
            let (lp, la, lx) = (
                p.push(Expr::Load, t.x[0]),
                p.push(Expr::Load, t.x[1]),
                p.push(Expr::Load, t.xt),
            );
            let x = p.push(Expr::View { x: lx, map: SWAP }, t.bcn);
            let dt = un(&mut p, UnaryOp::Softplus, lp);
            let da = bin(&mut p, BinaryOp::Mul, dt, la);
            let a = un(&mut p, UnaryOp::Exp, da);
            let u = bin(&mut p, BinaryOp::Mul, dt, x);
            let roots = if dt_is_a_root {
                vec![a, u, dt]
            } else {
                vec![a, u]
            };
            p.set_roots(roots);
            let form = FlatForm::find(&p).expect("a flat form");
            let piece = &form.pieces()[0];
            let softplus = piece.instrs[..piece.len]
                .iter()
                .filter(|i| i.op == Op::Unary(UnaryOp::Softplus))
                .count();
            assert_eq!(softplus, 1, "{:?}", &piece.instrs[..piece.len]);
            assert_eq!(piece.ends[0], 1, "softplus first, alone");
            assert_every_isa_roots_as_eval(&p, &form, &env, "");
        }
    }

    /// Two nodes several roots read, neither inside the other (`dt =
    /// softplus(p)` of `dt * y` and `dt * g`, `g = sigmoid(q)` of `dt * g`
    /// and `g * p`): each computed once per block, first, each root the
    /// interpreter's bit for bit. One more root that needs three registers
    /// leaves room for one kept node (the later, `g`), one that needs four
    /// for none; the values stay the same.
    #[test]
    fn two_nodes_several_roots_read_are_each_computed_once() {
        let mut rng = Rng::new(22);
        let mut env = TestEnv::default();
        let t = tensors(&mut env, &mut rng);
        let un = |p: &mut Program, op, x| p.push(Expr::Unary { op, x }, t.bcn);
        let bin = |p: &mut Program, op, a, b| p.push(Expr::Binary { op, a, b }, t.bcn);
        // Registers the extra root needs -> (softplus, sigmoid, ends[0]).
        for (depth, want) in [(0, (1, 1, 2)), (3, (2, 1, 1)), (4, (2, 2, 0))] {
            let mut p = Program::default();
            let (lp, lq, ly) = (
                p.push(Expr::Load, t.x[0]),
                p.push(Expr::Load, t.x[1]),
                p.push(Expr::Load, t.xt),
            );
            let y = p.push(Expr::View { x: ly, map: SWAP }, t.bcn);
            let dt = un(&mut p, UnaryOp::Softplus, lp);
            let g = un(&mut p, UnaryOp::Sigmoid, lq);
            let mut roots = vec![
                bin(&mut p, BinaryOp::Mul, dt, y),
                bin(&mut p, BinaryOp::Mul, dt, g),
                bin(&mut p, BinaryOp::Mul, g, lp),
            ];
            if depth > 0 {
                // lp - (lq - exp(lp)), or lp - (lq - (y - exp(lp))): each
                // right-hand operand one register up.
                let mut right = un(&mut p, UnaryOp::Exp, lp);
                for &a in [y, lq, lp][4 - depth..].iter() {
                    right = bin(&mut p, BinaryOp::Sub, a, right);
                }
                roots.push(right);
            }
            p.set_roots(roots);
            let form = FlatForm::find(&p).expect("a flat form");
            let piece = &form.pieces()[0];
            let instrs = &piece.instrs[..piece.len];
            let count = |op| instrs.iter().filter(|i| i.op == op).count();
            let got = (
                count(Op::Unary(UnaryOp::Softplus)),
                count(Op::Unary(UnaryOp::Sigmoid)),
                piece.ends[0],
            );
            assert_eq!(got, want, "depth {depth}: {instrs:?}");
            assert_every_isa_roots_as_eval(&p, &form, &env, &format!("depth {depth}"));
        }
    }

    /// [`assert_roots_as_eval`] of `form`, `p`'s flat form, on every
    /// instruction set, along a row from its fourth element and across the
    /// channels.
    fn assert_every_isa_roots_as_eval(p: &Program, form: &FlatForm, env: &TestEnv, what: &str) {
        for isa in Isa::all_available() {
            let geometry = form.geometry(p, env).expect("every leaf resolves");
            let flat = form.bind(isa, &geometry, env);
            let mut tmp = vec![0.0; N * p.temporaries()];
            let mut regs = vec![0.0; N * form.temporaries()];
            for line in [Line::along([1, 2, 3, 0], 2), Line::along([0, 0, 7, 0], 1)] {
                let len = if line.step[2] == 1 { N - 3 } else { C };
                let what = format!("{isa:?} {what}");
                assert_roots_as_eval(p, &flat, env, (&line, len), &mut tmp, &mut regs, &what);
            }
        }
    }

    /// Runs `flat`, `p`'s flat form, along `line` (`len` elements) into
    /// every root, and asserts it writes what `p.eval_roots` does, bit for
    /// bit; returns those values.
    fn assert_roots_as_eval(
        p: &Program,
        flat: &Flat,
        env: &TestEnv,
        (line, len): (&Line, usize),
        tmp: &mut [f32],
        regs: &mut [f32],
        what: &str,
    ) -> Vec<Vec<f32>> {
        let n_roots = p.roots().len();
        let mut want = vec![vec![0.0; len]; n_roots];
        let mut refs: Vec<&mut [f32]> = want.iter_mut().map(|v| &mut v[..]).collect();
        p.eval_roots(flat.isa, env, &[], line, &mut refs, tmp);
        let mut got = vec![vec![f32::NAN; len]; n_roots];
        let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|v| &mut v[..]).collect();
        assert!(flat.run_roots(line, &[], n_roots, &mut outs, regs));
        for (k, (w, g)) in want.iter().zip(&got).enumerate() {
            assert_eq!(bits(w), bits(g), "{what}, root {k}, {line:?}");
        }
        want
    }

    /// Random programs of two or three roots sharing a subtree (as a
    /// scan's `a` and `u` share `softplus(dt)`), sometimes two, one root
    /// sometimes the shared node itself: the flat form stores every root,
    /// each the interpreter's `eval_roots` bit for bit along rows and
    /// across the channels, its first root alone `eval`'s; compiled, the
    /// pair's rows take it.
    #[test]
    fn random_programs_of_several_roots_store_each_root_bit_for_bit() {
        use crate::fused::rows::{PairSource, ProgramRows};
        let isas = Isa::all_available();
        let mut rng = Rng::new(33);
        let mut ran = 0;
        // A third of the cases under emulation (QEMU), as the other grids.
        let cases = if crate::test_support::emulated() {
            70
        } else {
            200
        };
        for case in 0..cases {
            let mut env = TestEnv::default();
            let t = tensors(&mut env, &mut rng);
            let mut p = Program::default();
            let shared = grow(&mut p, &t, &mut rng, 1 + case % 3, false);
            // A quarter of the cases: a second shared node, outside the
            // first, read by the second and third roots.
            let second = (case % 4 == 3).then(|| grow(&mut p, &t, &mut rng, 1, false));
            let roots: Vec<usize> = (0..2 + case % 2)
                .map(|k| {
                    if k == 1 && case % 5 == 0 {
                        return shared;
                    }
                    let other = match second {
                        Some(second) if k > 0 => second,
                        _ => grow(&mut p, &t, &mut rng, case % 3, false),
                    };
                    let op = BinaryOp::ALL[rng.range(0, BinaryOp::ALL.len() - 1)];
                    p.push(
                        Expr::Binary {
                            op,
                            a: shared,
                            b: other,
                        },
                        t.bcn,
                    )
                })
                .collect();
            let n_roots = roots.len();
            p.set_roots(roots);
            let Some(form) = FlatForm::find(&p) else {
                continue;
            };
            let isa = isas[case % isas.len()];
            let geometry = form.geometry(&p, &env).expect("every leaf resolves");
            let flat = form.bind(isa, &geometry, &env);
            let mut tmp = vec![0.0; N * p.temporaries()];
            let mut regs = vec![0.0; N * form.temporaries()];
            let mut lines = Vec::new();
            for (row, t0) in [(0, 0), (4, 63), (5, 1)] {
                let mut base = [0; MAX_RANK];
                (base[0], base[1], base[2]) = (row / C, row % C, t0);
                lines.push((Line::along(base, 2), N - t0));
            }
            lines.push((Line::along([1, 0, 9, 0], 1), C));
            for (line, len) in lines {
                let what = format!("case {case}");
                let want =
                    assert_roots_as_eval(&p, &flat, &env, (&line, len), &mut tmp, &mut regs, &what);
                let mut first = vec![f32::NAN; len];
                assert!(flat.run(&line, &[], &mut first, &mut regs));
                assert_eq!(bits(&first), bits(&want[0]), "case {case}: the first root");
            }
            if n_roots == 2 {
                let compiled = p.clone().compile_for(isa);
                let rows = ProgramRows::new(&compiled, &env);
                assert!(compiled.recipes().prologue(&compiled, &env).flat.is_some());
                let mut tmp = vec![0.0; N * compiled.temporaries()];
                let (mut a, mut u) = (vec![f32::NAN; N], vec![f32::NAN; N]);
                rows.fill_pair(C + 1, 0, &mut a, &mut u, &mut tmp);
                let mut want = [vec![0.0; N], vec![0.0; N]];
                let [wa, wu] = &mut want;
                p.eval_roots(
                    isa,
                    &env,
                    &[],
                    &Line::along([1, 1, 0, 0], 2),
                    &mut [wa, wu],
                    &mut tmp,
                );
                assert_eq!(
                    [bits(&a), bits(&u)],
                    want.map(|w| bits(&w)),
                    "case {case}: rows"
                );
            }
            ran += 1;
        }
        assert!(ran > cases * 3 / 4, "{ran} of {cases} programs flat");
    }

    /// The values' bits, every NaN as one: which NaN an op of two NaNs
    /// keeps depends on its operands' order in the instruction, which the
    /// compiler picks per loop (`sqrt(a) + log1p(b)` of a negative `a`
    /// and a `b` below -1 gave +NaN in one loop and -NaN in the other).
    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter()
            .map(|x| if x.is_nan() { f32::NAN } else { *x }.to_bits())
            .collect()
    }

    /// Random programs along every row (from several starts) and across
    /// the channels: the flat program runs on every line, its leaves read
    /// in place or, with a stride (a transposed tensor, every other
    /// element, any line across the channels), gathered, and writes the
    /// interpreter's values bit for bit.
    #[test]
    fn random_programs_equal_the_interpreter_bit_for_bit() {
        // Each case on one of this CPU's instruction sets, in turn.
        let isas = Isa::all_available();
        let mut rng = Rng::new(27);
        let (mut ran, mut gathered, mut unflat, mut catted) = (0, 0, 0, 0);
        // A third of the cases under emulation (QEMU), as the other grids.
        let cases = if crate::test_support::emulated() {
            140
        } else {
            400
        };
        for case in 0..cases {
            let mut env = TestEnv::default();
            let t = tensors(&mut env, &mut rng);
            let anchor = case % 3 == 0;
            let mut p = Program::default();
            grow(&mut p, &t, &mut rng, 1 + case % 4, anchor);
            let Some(form) = FlatForm::find(&p) else {
                unflat += 1;
                continue;
            };
            catted += usize::from(p.nodes().iter().any(|n| matches!(n.expr, Expr::Cat { .. })));
            assert_eq!(
                form.reads_anchor(),
                { p.nodes().iter().any(|n| n.expr == Expr::Anchor) } && anchor
            );
            let isa = isas[case % isas.len()];
            let geometry = form.geometry(&p, &env).expect("every leaf resolves");
            let flat = form.bind(isa, &geometry, &env);
            let values = rng.vec(N, -3.0, 3.0);
            let mut tmp = vec![0.0; N * p.temporaries()];
            let mut lines = Vec::new();
            for row in 0..B * C {
                for t0 in [0, 1, 63, 64, 100] {
                    let mut base = [0; MAX_RANK];
                    (base[0], base[1], base[2]) = (row / C, row % C, t0);
                    lines.push((Line::along(base, 2), N - t0, true));
                }
            }
            for (b, n) in [(0, 0), (1, 7)] {
                let mut base = [0; MAX_RANK];
                (base[0], base[2]) = (b, n);
                lines.push((Line::along(base, 1), C, false));
            }
            for (line, len, along) in lines {
                let mut want = vec![0.0; len];
                let mut got = vec![f32::NAN; len];
                p.eval(isa, &env, &values[..len], &line, &mut want, &mut tmp);
                // Registers of the line's length, or padded to whole
                // vectors (their lanes past the line computed too).
                let room = if case % 2 == 0 { len } else { len + LANES };
                let mut regs = vec![0.0; form.temporaries() * room];
                assert!(
                    flat.run(&line, &values[..len], &mut got, &mut regs),
                    "case {case} declined line {line:?}"
                );
                assert_eq!(bits(&want), bits(&got), "case {case}, line {line:?}");
                ran += 1;
                gathered += usize::from(p.max_load_stride(&env, &line) > 1 && along);
            }
        }
        // The walk stays within the limits for most programs, cats among
        // them (lines along time cross their parts' bounds at P and 2P,
        // lines across the channels those of cats along them), and rows
        // gather (lines across the channels always do).
        assert!(
            unflat < cases / 10,
            "{unflat} of {cases} programs have no flat form"
        );
        assert!(catted > cases / 16, "{catted} of {cases} flat programs cat");
        assert!(
            ran > cases * 5 / 2 && gathered > cases / 2,
            "ran {ran}, gathered {gathered}"
        );
    }
}
