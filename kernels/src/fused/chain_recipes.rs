//! A recipe for a tensor through a chain of adds, subtractions and products
//! by stored operands, then an activation: `act((x - mean) * rstd * w + b)`,
//! a normalisation applied (LayerNorm, GroupNorm, RMSNorm's
//! `x * rrms * w`), with its statistics loaded as stored values (the
//! kernel's statistics pass computed them, `rstd` included); and a scale,
//! a shift and an activation in general.
//!
//! Interpreted, every step is a pass over a line buffer, and every operand
//! is first copied into one, or filled in where it is one value along the
//! line (a statistic across the channels, a per-channel parameter along
//! time): seven passes and six copies or fills per line for a LayerNorm with
//! its GELU. Between wav2vec2's convs (`[1, 512, 3199]`) that took 14 ms of
//! a conv's 2 ms staged prologue. Here `x` and every operand is read in
//! place, a block of 64 at a time, each step a vector loop over the block
//! while it is in registers or L1.
//!
//! As the other recipes, it computes the program's ops in its tree's order
//! with the same functions and instruction-set variant as the interpreter,
//! so its results are the interpreter's bit for bit; per line it runs only
//! where `x` is read contiguously (or is the anchor's chunk, in an
//! epilogue) and every operand contiguously or as one value. Any other line
//! or program is interpreted.

use super::ops::{BinaryOp, UnaryOp};
use super::program::views::{Leaf, LeafGeometry, LeafMap};
use super::program::{Env, Expr, Line, Program};
use super::recipes::BLOCK;
use crate::simd::{per_backend, Isa};

/// Most steps a chain has (a LayerNorm with weight and bias has four).
const MAX_STEPS: usize = 6;

/// Most views a chain passes through.
const MAX_VIEWS: usize = 8;

/// Where the chain starts.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Start<'a> {
    /// A stored tensor (through views).
    Stored(LeafMap<'a>),
    /// The anchor's chunk (an epilogue).
    Anchor,
}

/// `act(((x op0 o0) op1 o1) ...)`, each `op` an add, a subtraction of the
/// operand or a product, each operand a leaf.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Chain<'a> {
    /// The program's instruction set.
    isa: Isa,
    x: Start<'a>,
    steps: [(BinaryOp, LeafMap<'a>); MAX_STEPS],
    len: usize,
    act: Option<UnaryOp>,
}

/// The form of a [`Chain`] in a program: its steps' ops and leaves' nodes
/// with the views above each, matched on structure once, when the program
/// is built.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct ChainForm {
    /// The stored tensor it starts at; `None`: the anchor's chunk.
    x: Option<usize>,
    /// The view nodes from the root down to `x`, outermost first: every
    /// leaf is read through those above it.
    views: [usize; MAX_VIEWS],
    n_views: usize,
    /// From the root down: each step's op, operand and how many of
    /// `views` are above it.
    found: [(BinaryOp, usize, usize); MAX_STEPS],
    len: usize,
    act: Option<UnaryOp>,
}

impl ChainForm {
    /// The form of a program whose root is such a chain (views anywhere
    /// along it, commuted sums and products); None for any other program,
    /// and for a chain of no step (a view or an activation alone gains
    /// nothing).
    pub(super) fn find(program: &Program) -> Option<Self> {
        let nodes = program.nodes();
        let mut views = [0usize; MAX_VIEWS];
        let mut n_views = 0;
        let through_views = |views: &mut [usize; MAX_VIEWS], n: &mut usize, mut i: usize| {
            while let Expr::View { x, .. } = nodes[i].expr {
                *views.get_mut(*n)? = i;
                *n += 1;
                i = x;
            }
            Some(i)
        };
        let mut i = program.root();
        let act = match nodes.get(i)?.expr {
            Expr::Unary { op, x } => {
                i = x;
                Some(op)
            }
            _ => None,
        };
        i = through_views(&mut views, &mut n_views, i)?;
        let mut found = [(BinaryOp::Add, 0usize, 0usize); MAX_STEPS];
        let mut len = 0;
        let x = loop {
            match nodes[i].expr {
                Expr::Anchor => break None,
                _ if program.is_leaf(i) => break Some(i),
                Expr::Binary { op, a, b } => {
                    let (next, operand) = match op {
                        BinaryOp::Sub => (a, b),
                        BinaryOp::Add | BinaryOp::Mul if program.is_leaf(b) => (a, b),
                        BinaryOp::Add | BinaryOp::Mul if program.is_leaf(a) => (b, a),
                        _ => return None,
                    };
                    if !program.is_leaf(operand) || len == MAX_STEPS {
                        return None;
                    }
                    found[len] = (op, operand, n_views);
                    len += 1;
                    i = through_views(&mut views, &mut n_views, next)?;
                }
                _ => return None,
            }
        };
        // The anchor's chunk is in the root's coordinates. A stored tensor
        // through an activation alone gains nothing over the interpreter; an
        // epilogue's lone activation (a conv's GELU) does: it is pointwise,
        // so a sink finishes a whole block of rows with it at once
        // ([`Chain::finish_in_place`]).
        if (len == 0 && (x.is_some() || act.is_none())) || (x.is_none() && n_views > 0) {
            return None;
        }
        Some(ChainForm {
            x,
            views,
            n_views,
            found,
            len,
            act,
        })
    }

    /// Whether the chain starts at the anchor's chunk (an epilogue's).
    pub(super) fn reads_anchor(&self) -> bool {
        self.x.is_none()
    }

    /// Where its leaves lie for `env`'s current shapes (shapes alone: see
    /// [`LeafGeometry`]).
    pub(super) fn geometry(&self, program: &Program, env: &dyn Env) -> Option<ChainGeometry> {
        let x = match self.x {
            Some(leaf) => {
                Some(program.leaf_geometry_through(&self.views[..self.n_views], leaf, env)?)
            }
            None => None,
        };
        let mut steps = [LeafGeometry::Const(0.0); MAX_STEPS];
        // Applied from the start up.
        for (slot, &(_, leaf, above)) in steps.iter_mut().zip(self.found[..self.len].iter().rev()) {
            *slot = program.leaf_geometry_through(&self.views[..above], leaf, env)?;
        }
        Some(ChainGeometry { x, steps })
    }

    /// The recipe on `isa`, its leaves where `geometry` puts them in
    /// `env`'s data.
    pub(super) fn bind<'a>(
        &self,
        isa: Isa,
        geometry: &ChainGeometry,
        env: &'a dyn Env,
    ) -> Chain<'a> {
        let mut chain = Chain {
            isa,
            x: geometry
                .x
                .map_or(Start::Anchor, |x| Start::Stored(x.bind(env))),
            steps: [(BinaryOp::Add, LeafMap::Const(0.0)); MAX_STEPS],
            len: self.len,
            act: self.act,
        };
        for ((slot, &(op, _, _)), leaf) in chain
            .steps
            .iter_mut()
            .zip(self.found[..self.len].iter().rev())
            .zip(&geometry.steps)
        {
            *slot = (op, leaf.bind(env));
        }
        chain
    }
}

/// Where the leaves of a [`ChainForm`] lie for one set of shapes: its
/// start's (`None`: the anchor's chunk) and its steps', from the start up.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct ChainGeometry {
    x: Option<LeafGeometry>,
    steps: [LeafGeometry; MAX_STEPS],
}

impl<'a> Chain<'a> {
    /// Matched and bound at once, as the tests ask.
    #[cfg(test)]
    pub(super) fn find(program: &Program, env: &'a dyn Env) -> Option<Self> {
        let form = ChainForm::find(program)?;
        Some(form.bind(Isa::detect(), &form.geometry(program, env)?, env))
    }

    /// Whether the chain starts at the anchor's chunk (an epilogue's).
    #[cfg(test)]
    pub(super) fn reads_anchor(&self) -> bool {
        self.x == Start::Anchor
    }

    /// Whether the chain computes each element from the anchor's value at
    /// the same place alone (no operand but constants), whatever the line:
    /// a block of rows can be finished in place at once.
    pub(super) fn pointwise(&self) -> bool {
        self.x == Start::Anchor
            && self.steps[..self.len]
                .iter()
                .all(|(_, leaf)| matches!(leaf, LeafMap::Const(_)))
    }

    /// The chain applied to `values` in place, for a [`Chain::pointwise`]
    /// chain (returns false, changing nothing, for any other): the same
    /// loops as [`Chain::run`], so bit for bit its results.
    pub(super) fn finish_in_place(&self, values: &mut [f32]) -> bool {
        if !self.pointwise() {
            return false;
        }
        let mut steps = [(BinaryOp::Add, Operand::Scalar(0.0)); MAX_STEPS];
        for (step, &(op, leaf)) in steps.iter_mut().zip(&self.steps[..self.len]) {
            let LeafMap::Const(v) = leaf else {
                unreachable!("a pointwise chain's operands are constants")
            };
            *step = (op, Operand::Scalar(v));
        }
        chain_in_place(self.isa, &steps[..self.len], self.act, values);
        true
    }

    /// Writes the chain along `line` into `out` and returns true, or
    /// returns false, writing nothing, where `x` or an operand is not read
    /// contiguously or as one value along this line. `anchor` is the
    /// anchor's chunk where the chain starts there (as long as `out`).
    pub(super) fn run(&self, line: &Line, anchor: &[f32], out: &mut [f32]) -> bool {
        let len = out.len();
        let x = match self.x {
            Start::Anchor => anchor,
            Start::Stored(x) => match x.read(line, len) {
                Some(Leaf::Contiguous(x, _)) => x,
                _ => return false,
            },
        };
        let mut steps = [(BinaryOp::Add, Operand::Scalar(0.0)); MAX_STEPS];
        for (step, &(op, leaf)) in steps.iter_mut().zip(&self.steps[..self.len]) {
            *step = match leaf.read(line, len) {
                Some(Leaf::Scalar(v)) => (op, Operand::Scalar(v)),
                Some(Leaf::Contiguous(v, _)) => (op, Operand::Slice(v)),
                None => return false,
            };
        }
        chain(self.isa, &steps[..self.len], self.act, x, out);
        true
    }
}

/// A step's operand along a line.
#[derive(Clone, Copy, Debug)]
enum Operand<'a> {
    Scalar(f32),
    Slice(&'a [f32]),
}

per_backend! {
    fn chain(
        steps: &[(BinaryOp, Operand)],
        act: Option<UnaryOp>,
        x: &[f32],
        out: &mut [f32],
    ) => chain_generic
}

/// The loops, inlined into each instruction-set variant; `F` as in
/// `UnaryOp::apply`, so the activation rounds as the interpreter's. Each
/// step and the activation is a loop of its own over a block, so each
/// vectorises without a test per element.
#[inline(always)]
fn chain_generic<const F: bool>(
    steps: &[(BinaryOp, Operand)],
    act: Option<UnaryOp>,
    x: &[f32],
    out: &mut [f32],
) {
    for (b, out) in out.chunks_mut(BLOCK).enumerate() {
        let at = b * BLOCK;
        let n = out.len();
        out.copy_from_slice(&x[at..at + n]);
        chain_block::<F>(steps, act, out, at);
    }
}

per_backend! {
    fn chain_in_place(
        steps: &[(BinaryOp, Operand)],
        act: Option<UnaryOp>,
        x: &mut [f32],
    ) => chain_in_place_generic
}

/// [`chain_generic`] over `x` in place (no operand is a slice).
#[inline(always)]
fn chain_in_place_generic<const F: bool>(
    steps: &[(BinaryOp, Operand)],
    act: Option<UnaryOp>,
    x: &mut [f32],
) {
    for (b, out) in x.chunks_mut(BLOCK).enumerate() {
        chain_block::<F>(steps, act, out, b * BLOCK);
    }
}

/// The steps and the activation over one block `out` (the chain's
/// elements from `at` on), each a loop of its own.
#[inline(always)]
fn chain_block<const F: bool>(
    steps: &[(BinaryOp, Operand)],
    act: Option<UnaryOp>,
    out: &mut [f32],
    at: usize,
) {
    #[inline(always)]
    fn each(out: &mut [f32], f: impl Fn(f32) -> f32) {
        for v in out {
            *v = f(*v);
        }
    }
    #[inline(always)]
    fn with(out: &mut [f32], o: &[f32], f: impl Fn(f32, f32) -> f32) {
        for (v, &o) in out.iter_mut().zip(o) {
            *v = f(*v, o);
        }
    }
    let n = out.len();
    for &(op, operand) in steps {
        match (op, operand) {
            (BinaryOp::Add, Operand::Scalar(o)) => each(out, |v| v + o),
            (BinaryOp::Sub, Operand::Scalar(o)) => each(out, |v| v - o),
            (BinaryOp::Mul, Operand::Scalar(o)) => each(out, |v| v * o),
            (BinaryOp::Add, Operand::Slice(o)) => with(out, &o[at..at + n], |v, o| v + o),
            (BinaryOp::Sub, Operand::Slice(o)) => with(out, &o[at..at + n], |v, o| v - o),
            (BinaryOp::Mul, Operand::Slice(o)) => with(out, &o[at..at + n], |v, o| v * o),
            _ => unreachable!("a chain adds, subtracts and multiplies"),
        }
    }
    if let Some(op) = act {
        // The interpreter's own loop for the op, over the block.
        op.apply_generic::<F>(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{Rng, TestEnv};

    const T: [Option<u8>; 4] = [Some(0), Some(2), Some(1), None];

    /// wav2vec2's LayerNorm applied in the next conv's prologue:
    /// `act(permute((x - mean) * rstd * w + b))` over a stored `[1, N, C]`
    /// `x`, its statistics `[1, N, 1]` and parameters `[C]`, read as
    /// `[1, C, N]`.
    fn layer_norm(
        env: &mut TestEnv,
        rng: &mut Rng,
        n: usize,
        c: usize,
        act: Option<UnaryOp>,
    ) -> Program {
        let x = env.stored(&[1, n, c], rng.vec(n * c, -2.0, 2.0));
        let m = env.stored(&[1, n, 1], rng.vec(n, -0.5, 0.5));
        let r = env.stored(&[1, n, 1], rng.vec(n, 0.5, 2.0));
        let w = env.stored(&[c], rng.vec(c, 0.5, 1.5));
        let b = env.stored(&[c], rng.vec(c, -0.5, 0.5));
        let nc = env.computed(&[1, n, c]);
        let cn = env.computed(&[1, c, n]);
        let mut p = Program::default();
        let lx = p.push(Expr::Load, x);
        let lm = p.push(Expr::Load, m);
        let bm = p.push(Expr::Broadcast { x: lm }, nc);
        let d = p.push(
            Expr::Binary {
                op: BinaryOp::Sub,
                a: lx,
                b: bm,
            },
            nc,
        );
        let lr = p.push(Expr::Load, r);
        let br = p.push(Expr::Broadcast { x: lr }, nc);
        let y = p.push(
            Expr::Binary {
                op: BinaryOp::Mul,
                a: d,
                b: br,
            },
            nc,
        );
        let lw = p.push(Expr::Load, w);
        let bw = p.push(Expr::Broadcast { x: lw }, nc);
        // The weight first: a commuted product.
        let y = p.push(
            Expr::Binary {
                op: BinaryOp::Mul,
                a: bw,
                b: y,
            },
            nc,
        );
        let lb = p.push(Expr::Load, b);
        let bb = p.push(Expr::Broadcast { x: lb }, nc);
        let y = p.push(
            Expr::Binary {
                op: BinaryOp::Add,
                a: y,
                b: bb,
            },
            nc,
        );
        let v = p.push(Expr::View { x: y, map: T }, cn);
        if let Some(op) = act {
            p.push(Expr::Unary { op, x: v }, cn);
        }
        p
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Every line of the root, across the channels and along time: the
    /// recipe runs where it reads in place (across) and declines where `x`
    /// is strided (along), and equals the interpreter bit for bit.
    #[test]
    fn a_layer_norm_through_a_transpose_equals_the_interpreter() {
        let mut rng = Rng::new(4);
        for act in [
            None,
            Some(UnaryOp::Gelu),
            Some(UnaryOp::Silu),
            Some(UnaryOp::Relu),
        ] {
            let (n, c) = (37, 150);
            let mut env = TestEnv::default();
            let p = layer_norm(&mut env, &mut rng, n, c, act);
            let chain = Chain::find(&p, &env).expect("a chain");
            assert_eq!(chain.len, 4);
            let mut tmp = vec![0.0; p.temporaries() * c.max(n)];
            for t in 0..n {
                let line = Line::along([0, 0, t, 0], 1);
                let (mut got, mut want) = (vec![0.0; c], vec![0.0; c]);
                assert!(chain.run(&line, &[], &mut got), "across the channels");
                p.eval(Isa::detect(), &env, &[], &line, &mut want, &mut tmp);
                assert_eq!(bits(&got), bits(&want), "{act:?} t={t}");
            }
            let line = Line::along([0, 3, 0, 0], 2);
            assert!(
                !chain.run(&line, &[], &mut vec![0.0; n]),
                "x is strided along time"
            );
        }
    }

    /// An epilogue's chain starts at the anchor's chunk: a per-channel
    /// scale and shift then a SiLU (a batch norm folded to an affine),
    /// along time; RMSNorm's `x * rrms * w` across the channels; and the
    /// programs that are not chains.
    #[test]
    fn anchored_and_rms_chains_and_the_forms_refused() {
        let mut rng = Rng::new(8);
        let (c, n) = (5, 300);
        let mut env = TestEnv::default();
        let y = env.computed(&[1, c, n]);
        let s = env.stored(&[c, 1], rng.vec(c, 0.5, 1.5));
        let t = env.stored(&[c, 1], rng.vec(c, -1.0, 1.0));
        let mut p = Program::default();
        let a = p.push(Expr::Anchor, y);
        let ls = p.push(Expr::Load, s);
        let bs = p.push(Expr::Broadcast { x: ls }, y);
        let m = p.push(
            Expr::Binary {
                op: BinaryOp::Mul,
                a,
                b: bs,
            },
            y,
        );
        let lt = p.push(Expr::Load, t);
        let bt = p.push(Expr::Broadcast { x: lt }, y);
        let z = p.push(
            Expr::Binary {
                op: BinaryOp::Add,
                a: bt,
                b: m,
            },
            y,
        );
        p.push(
            Expr::Unary {
                op: UnaryOp::Silu,
                x: z,
            },
            y,
        );
        let chain = Chain::find(&p, &env).expect("a chain from the anchor");
        assert!(chain.reads_anchor());
        let values = rng.vec(n, -3.0, 3.0);
        let mut tmp = vec![0.0; p.temporaries() * n];
        for row in 0..c {
            let line = Line::along([0, row, 0, 0], 2);
            let (mut got, mut want) = (vec![0.0; n], vec![0.0; n]);
            assert!(chain.run(&line, &values, &mut got));
            p.eval(Isa::detect(), &env, &values, &line, &mut want, &mut tmp);
            assert_eq!(bits(&got), bits(&want), "row {row}");
        }

        // RMSNorm over a [1, N, C] projection, read as [1, C, N].
        let mut env = TestEnv::default();
        let (n, c) = (9, 70);
        let x = env.stored(&[1, n, c], rng.vec(n * c, -2.0, 2.0));
        let r = env.stored(&[1, n, 1], rng.vec(n, 0.5, 2.0));
        let w = env.stored(&[c], rng.vec(c, 0.5, 1.5));
        let nc = env.computed(&[1, n, c]);
        let cn = env.computed(&[1, c, n]);
        let mut p = Program::default();
        let lx = p.push(Expr::Load, x);
        let lr = p.push(Expr::Load, r);
        let br = p.push(Expr::Broadcast { x: lr }, nc);
        let h = p.push(
            Expr::Binary {
                op: BinaryOp::Mul,
                a: lx,
                b: br,
            },
            nc,
        );
        let lw = p.push(Expr::Load, w);
        let bw = p.push(Expr::Broadcast { x: lw }, nc);
        let h = p.push(
            Expr::Binary {
                op: BinaryOp::Mul,
                a: h,
                b: bw,
            },
            nc,
        );
        p.push(Expr::View { x: h, map: T }, cn);
        let chain = Chain::find(&p, &env).expect("RMSNorm's chain");
        let mut tmp = vec![0.0; p.temporaries() * c];
        for t in 0..n {
            let line = Line::along([0, 0, t, 0], 1);
            let (mut got, mut want) = (vec![0.0; c], vec![0.0; c]);
            assert!(chain.run(&line, &[], &mut got));
            p.eval(Isa::detect(), &env, &[], &line, &mut want, &mut tmp);
            assert_eq!(bits(&got), bits(&want), "t={t}");
        }

        // Not chains: an operand computed (rsqrt of a statistic), the
        // spine subtracted from a leaf, a division, a lone activation.
        let refused = |build: &dyn Fn(&mut Program, usize, usize)| {
            let mut p = Program::default();
            let lx = p.push(Expr::Load, x);
            let lr = p.push(Expr::Load, r);
            build(&mut p, lx, lr);
            Chain::find(&p, &env).is_none()
        };
        assert!(refused(&|p, lx, lr| {
            let q = p.push(
                Expr::Unary {
                    op: UnaryOp::Rsqrt,
                    x: lr,
                },
                r,
            );
            let bq = p.push(Expr::Broadcast { x: q }, nc);
            p.push(
                Expr::Binary {
                    op: BinaryOp::Mul,
                    a: lx,
                    b: bq,
                },
                nc,
            );
        }));
        assert!(refused(&|p, lx, lr| {
            let br = p.push(Expr::Broadcast { x: lr }, nc);
            let e = p.push(
                Expr::Unary {
                    op: UnaryOp::Exp,
                    x: lx,
                },
                nc,
            );
            p.push(
                Expr::Binary {
                    op: BinaryOp::Sub,
                    a: br,
                    b: e,
                },
                nc,
            );
        }));
        assert!(refused(&|p, lx, lr| {
            let br = p.push(Expr::Broadcast { x: lr }, nc);
            p.push(
                Expr::Binary {
                    op: BinaryOp::Div,
                    a: lx,
                    b: br,
                },
                nc,
            );
        }));
        assert!(refused(&|p, lx, _| {
            p.push(
                Expr::Unary {
                    op: UnaryOp::Gelu,
                    x: lx,
                },
                nc,
            );
        }));
    }

    /// An epilogue's lone activation (a conv's GELU) and a scale and shift
    /// by constants are pointwise chains, finished in place as the line
    /// loop finishes them; one reading a per-channel operand is not.
    #[test]
    fn pointwise_chains_finish_in_place_as_along_a_line() {
        let mut rng = Rng::new(5);
        let mut env = TestEnv::default();
        let (c, n) = (3, 70);
        let y = env.virt(&[1, c, n]);
        let s = env.stored(&[c, 1], rng.vec(c, 0.5, 1.5));
        let values = rng.vec(c * n, -3.0, 3.0);
        for operand in ["none", "const", "stored"] {
            let mut p = Program::default();
            let mut x = p.push(Expr::Anchor, y);
            if operand != "none" {
                let o = match operand {
                    "const" => p.push(Expr::Const(0.5), y),
                    _ => {
                        let l = p.push(Expr::Load, s);
                        p.push(Expr::Broadcast { x: l }, y)
                    }
                };
                x = p.push(
                    Expr::Binary {
                        op: BinaryOp::Mul,
                        a: x,
                        b: o,
                    },
                    y,
                );
            }
            p.push(
                Expr::Unary {
                    op: UnaryOp::Gelu,
                    x,
                },
                y,
            );
            let chain = Chain::find(&p, &env).expect("a chain from the anchor");
            assert_eq!(chain.pointwise(), operand != "stored", "{operand}");
            let mut in_place = values.clone();
            assert_eq!(chain.finish_in_place(&mut in_place), chain.pointwise());
            if !chain.pointwise() {
                assert_eq!(bits(&in_place), bits(&values), "unchanged");
                continue;
            }
            for row in 0..c {
                let line = Line::along([0, row, 0, 0], 2);
                let mut want = vec![0.0; n];
                assert!(chain.run(&line, &values[row * n..][..n], &mut want));
                assert_eq!(bits(&in_place[row * n..][..n]), bits(&want), "row {row}");
            }
        }
        // A stored tensor's lone activation stays with the interpreter.
        let x = env.stored(&[1, c, n], values.clone());
        let mut p = Program::default();
        let l = p.push(Expr::Load, x);
        p.push(
            Expr::Unary {
                op: UnaryOp::Gelu,
                x: l,
            },
            y,
        );
        assert!(Chain::find(&p, &env).is_none());
    }
}
