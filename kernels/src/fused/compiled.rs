//! A [`Program`] compiled once, when the plan is built: the program, the
//! instruction set its loops run with ([`Isa`], chosen here once, so that
//! no call asks the CPU), and the recipes (`recipes.rs`,
//! `conv_recipes.rs`, `chain_recipes.rs`) whose form it has, and its flat
//! form (`flat.rs`) for any other line, found by the one registry below.
//!
//! A recipe is matched on the program's structure alone, so the match is
//! made here, once; what depends on the call is bound when a kernel call
//! reads the program as rows or stores through it as an epilogue
//! ([`Recipes::prologue`], [`Recipes::epilogue`]). Of that, where each leaf
//! lies (its offset and coefficients, and whether a recipe fits the
//! shapes at all) depends on shapes alone: it is derived once per shape
//! generation and kept here ([`ShapeCache`]), so that a call of unchanged
//! shapes only pairs it with its tensors' data. `execute` matches nothing
//! ([`programs_compiled`] counts the matches, and the delegate's
//! `no_alloc` test checks that calls make none).

use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::chain_recipes::{Chain, ChainForm, ChainGeometry};
use super::conv_recipes::{
    Product, ProductForm, ProductGeometry, SkipGate, SkipGateForm, SkipGateGeometry,
};
use super::flat::{Flat, FlatForm, FlatGeometry};
use super::generation::{ShapeCache, ShapeMemo};
use super::program::views::{LeafGeometry, LeafMap};
use super::program::{Env, Expr, Line, Program};
use super::recipes::{
    Discretise, DiscretiseForm, DiscretiseGeometry, Gate, GateForm, GateGeometry,
};
use super::reduce_geometry::ReduceGeometry;
use crate::simd::Isa;

/// How many programs were compiled (their recipes matched) in this process.
static COMPILED: AtomicUsize = AtomicUsize::new(0);

/// How many programs this process has compiled, each matched against every
/// recipe once: a call that compiles none matched nothing.
pub fn programs_compiled() -> usize {
    COMPILED.load(Ordering::Relaxed)
}

/// A program with the recipes it takes, matched once, and the instruction
/// set it runs with.
#[derive(Clone, Debug, PartialEq)]
pub struct CompiledProgram {
    program: Program,
    isa: Isa,
    /// Boxed: the forms hold fixed arrays (a chain's steps and views), and
    /// a plan's steps hold several programs.
    recipes: Box<Recipes>,
    /// Where the recipes' leaves lie, per shape generation (boxed as the
    /// recipes are).
    geometry: Box<Geometries>,
    /// Whether blocks of rows are read across them, as rows of a kernel's
    /// prologue ([`ProgramRows`](super::ProgramRows)) and as its epilogue
    /// ([`EpilogueSink`](super::EpilogueSink)), per shape generation: the
    /// views' strides are walked once per set of shapes, not per call.
    pub(super) rows_across: ShapeMemo,
    pub(super) sink_across: ShapeMemo,
}

impl Program {
    /// Matches the recipes against this program, once: done building it.
    /// Its loops run with this CPU's fastest instruction set.
    pub fn compile(self) -> CompiledProgram {
        self.compile_for(Isa::detect())
    }

    /// [`Self::compile`] for the loops of `isa`.
    pub fn compile_for(self, isa: Isa) -> CompiledProgram {
        COMPILED.fetch_add(1, Ordering::Relaxed);
        CompiledProgram {
            recipes: Box::new(Recipes::find(&self)),
            geometry: Box::default(),
            program: self,
            isa,
            rows_across: ShapeMemo::default(),
            sink_across: ShapeMemo::default(),
        }
    }
}

impl CompiledProgram {
    /// The program as built.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The instruction set chosen at compile: every loop reading or
    /// storing through the program runs with it.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// [`Program::eval`] with the program's instruction set.
    ///
    /// # Panics
    /// As [`Program::eval`].
    pub fn eval(
        &self,
        env: &dyn Env,
        anchor: &[f32],
        line: &Line,
        out: &mut [f32],
        tmp: &mut [f32],
    ) {
        self.program.eval(self.isa, env, anchor, line, out, tmp)
    }

    /// [`Program::eval_roots`] with the program's instruction set.
    ///
    /// # Panics
    /// As [`Program::eval_roots`].
    pub fn eval_roots(
        &self,
        env: &dyn Env,
        anchor: &[f32],
        line: &Line,
        outs: &mut [&mut [f32]],
        tmp: &mut [f32],
    ) {
        self.program
            .eval_roots(self.isa, env, anchor, line, outs, tmp)
    }

    pub(super) fn recipes(&self) -> &Recipes {
        &self.recipes
    }

    /// What a reduction of the program derives from shapes (`reduce.rs`),
    /// kept per shape generation.
    pub(super) fn reduction(&self) -> &ShapeCache<ReduceGeometry> {
        &self.geometry.reduction
    }

    /// Line-sized temporaries evaluating the program needs: the
    /// interpreter's, or the flat form's registers where more
    /// (`flat.rs`).
    pub fn temporaries(&self) -> usize {
        let flat = self.recipes.flat.as_ref().map_or(0, FlatForm::temporaries);
        self.program.temporaries().max(flat)
    }
}

/// Reading a compiled program is reading its program.
impl Deref for CompiledProgram {
    type Target = Program;

    fn deref(&self) -> &Program {
        &self.program
    }
}

/// The registry: every recipe's form in a program, in the order they are
/// tried. A new recipe is one field here, its form's `find` in
/// [`Recipes::find`], its `geometry` in [`PrologueGeometry`] or
/// [`EpilogueGeometry`] and its `bind` in [`Recipes::prologue`] or
/// [`Recipes::epilogue`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Recipes {
    /// A scan's discretisation: two roots `[a, u]` (`recipes.rs`).
    discretise: Option<DiscretiseForm>,
    /// A product of two stored operands (`conv_recipes.rs`).
    product: Option<ProductForm>,
    /// A scan's gate, an epilogue (`recipes.rs`).
    gate: Option<GateForm>,
    /// A gated convolution's epilogue (`conv_recipes.rs`).
    skip_gate: Option<SkipGateForm>,
    /// A chain of adds and products then an activation, from a stored
    /// tensor (a prologue) or from the anchor (an epilogue)
    /// (`chain_recipes.rs`).
    chain: Option<ChainForm>,
    /// The root only views a stored tensor or a constant (see [`Gather`]).
    gather: bool,
    /// The root is the anchor's values as they are (only the store views
    /// of an epilogue act).
    identity: bool,
    /// The program as a list of instructions over blocks (`flat.rs`):
    /// tried after the dedicated recipes, before the interpreter.
    flat: Option<FlatForm>,
}

impl Recipes {
    fn find(program: &Program) -> Self {
        if program.nodes().is_empty() {
            return Recipes::default();
        }
        let root = program.root();
        let mut recipes = Recipes {
            discretise: DiscretiseForm::find(program, program.named_roots()),
            product: ProductForm::find(program),
            gate: GateForm::find(program),
            skip_gate: SkipGateForm::find(program),
            chain: ChainForm::find(program),
            gather: program.is_leaf(root),
            identity: program.nodes()[root].expr == Expr::Anchor,
            flat: None,
        };
        // The flat form runs where no dedicated recipe matched: binding
        // its leaves as well costs a decode step's call a fifth of its
        // time, for the few lines the recipe declines (an operand read
        // with a stride), which the interpreter takes. A root that only views a tensor is
        // the interpreter's one copy (or the gather's), not two.
        // A pair's roots are read together (`PairSource`), which only the
        // discretisation computes of the dedicated recipes (the others
        // match the first root alone).
        let dedicated = if program.named_roots().len() > 1 {
            recipes.discretise.is_some()
        } else {
            recipes.product.is_some()
                || recipes.gate.is_some()
                || recipes.skip_gate.is_some()
                || recipes.chain.is_some()
                || recipes.gather
        };
        if !dedicated {
            recipes.flat = FlatForm::find(program);
        }
        recipes
    }

    /// The prologue recipes bound for `env`'s tensors and shapes, running
    /// with the program's instruction set: their leaves where the
    /// geometry of this call's shapes puts them, in its data.
    pub(super) fn prologue<'a>(
        &'a self,
        program: &CompiledProgram,
        env: &'a dyn Env,
    ) -> Prologue<'a> {
        let derive = || self.prologue_geometry(program, env);
        let bind = |g: &PrologueGeometry| self.bind_prologue(program.isa, g, env);
        program
            .geometry
            .prologue
            .read(env.generation(), derive, bind)
    }

    /// The prologue recipes on `isa` whose leaves `geometry` places, bound
    /// to `env`'s data.
    fn bind_prologue<'a>(
        &'a self,
        isa: Isa,
        geometry: &PrologueGeometry,
        env: &'a dyn Env,
    ) -> Prologue<'a> {
        let g = geometry;
        Prologue {
            discretise: (self.discretise.zip(g.discretise)).map(|(f, g)| f.bind(isa, &g, env)),
            product: g.product.map(|g| g.bind(env)),
            chain: (self.chain.zip(g.chain)).map(|(f, g)| f.bind(isa, &g, env)),
            gather: match g.gather.map(|g| g.bind(env)) {
                Some(LeafMap::Stored { data, offset, coef }) => Some(Gather { data, offset, coef }),
                _ => None,
            },
            flat: (self.flat.as_ref().zip(g.flat.as_ref())).map(|(f, g)| f.bind(isa, g, env)),
        }
    }

    /// Where the prologue recipes' leaves lie for `env`'s shapes, for the
    /// recipes whose form the program has and whose reads the shapes fit.
    fn prologue_geometry(&self, program: &Program, env: &dyn Env) -> PrologueGeometry {
        PrologueGeometry {
            discretise: self.discretise.and_then(|f| f.geometry(program, env)),
            product: self.product.and_then(|f| f.geometry(program, env)),
            chain: self
                .chain
                .filter(|f| !f.reads_anchor())
                .and_then(|f| f.geometry(program, env)),
            gather: self
                .gather
                .then(|| program.leaf_geometry(program.root(), env))
                .flatten()
                .filter(|g| matches!(g, LeafGeometry::Stored { .. })),
            flat: self
                .flat
                .as_ref()
                .filter(|f| !f.reads_anchor())
                .and_then(|f| f.geometry(program, env)),
        }
    }

    /// The epilogue recipe bound for `env`'s tensors and shapes: the first
    /// whose form the program has and whose reads this call's shapes fit,
    /// running with the program's instruction set (bound as
    /// [`Self::prologue`]'s).
    pub(super) fn epilogue<'a>(
        &'a self,
        program: &CompiledProgram,
        env: &'a dyn Env,
    ) -> Option<EpilogueRecipe<'a>> {
        let derive = || self.epilogue_geometry(program, env);
        let bind = |g: &Option<EpilogueGeometry>| self.bind_epilogue(program.isa, g.as_ref()?, env);
        program
            .geometry
            .epilogue
            .read(env.generation(), derive, bind)
    }

    /// The epilogue recipe on `isa` whose leaves `geometry` places, bound
    /// to `env`'s data.
    fn bind_epilogue<'a>(
        &'a self,
        isa: Isa,
        geometry: &EpilogueGeometry,
        env: &'a dyn Env,
    ) -> Option<EpilogueRecipe<'a>> {
        Some(match geometry {
            EpilogueGeometry::Gate(g) => EpilogueRecipe::Gate(self.gate?.bind(isa, g, env)),
            EpilogueGeometry::SkipGate(g) => {
                EpilogueRecipe::SkipGate(self.skip_gate?.bind(isa, g, env))
            }
            EpilogueGeometry::Chain(g) => EpilogueRecipe::Chain(self.chain?.bind(isa, g, env)),
            EpilogueGeometry::Flat(g) => {
                EpilogueRecipe::Flat(self.flat.as_ref()?.bind(isa, g, env))
            }
        })
    }

    /// Where the leaves of the epilogue recipe [`Self::epilogue`] takes
    /// lie for `env`'s shapes; `None` where none fits them.
    fn epilogue_geometry(&self, program: &Program, env: &dyn Env) -> Option<EpilogueGeometry> {
        self.gate
            .and_then(|f| f.geometry(program, env))
            .map(EpilogueGeometry::Gate)
            .or_else(|| {
                self.skip_gate
                    .and_then(|f| f.geometry(program, env))
                    .map(EpilogueGeometry::SkipGate)
            })
            .or_else(|| {
                self.chain
                    .filter(ChainForm::reads_anchor)
                    .and_then(|f| f.geometry(program, env))
                    .map(EpilogueGeometry::Chain)
            })
            .or_else(|| {
                self.flat
                    .as_ref()
                    .and_then(|f| f.geometry(program, env))
                    .map(EpilogueGeometry::Flat)
            })
    }

    /// Whether the root is the anchor's values as they are.
    pub(super) fn identity(&self) -> bool {
        self.identity
    }
}

/// Where the recipes' leaves lie, kept per shape generation
/// ([`Recipes::prologue`], [`Recipes::epilogue`]): a program read as rows
/// and one stored through as an epilogue keep theirs apart; and what a
/// reduction of the program derives ([`CompiledProgram::reduction`]).
#[derive(Clone, Debug, Default, PartialEq)]
struct Geometries {
    prologue: ShapeCache<PrologueGeometry>,
    epilogue: ShapeCache<Option<EpilogueGeometry>>,
    reduction: ShapeCache<ReduceGeometry>,
}

/// Where the leaves of the prologue recipes that fit a set of shapes lie
/// (`None`: the program has no such form, or the shapes do not fit it).
#[derive(Clone, Copy, Debug)]
struct PrologueGeometry {
    discretise: Option<DiscretiseGeometry>,
    product: Option<ProductGeometry>,
    chain: Option<ChainGeometry>,
    /// The root's, a stored tensor's.
    gather: Option<LeafGeometry>,
    flat: Option<FlatGeometry>,
}

/// Where the leaves of the epilogue recipe that fits a set of shapes lie.
// The flat form's are the largest; boxing them would allocate in `execute`
// whenever a call's shapes change.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug)]
enum EpilogueGeometry {
    Gate(GateGeometry),
    SkipGate(SkipGateGeometry),
    Chain(ChainGeometry),
    Flat(FlatGeometry),
}

/// The prologue recipes of one call ([`Recipes::prologue`]).
pub(super) struct Prologue<'a> {
    /// The one-pass loop for a pair of this form (`recipes.rs`).
    pub(super) discretise: Option<Discretise<'a>>,
    /// The one-pass loop for a product of two stored operands
    /// (`conv_recipes.rs`).
    pub(super) product: Option<Product<'a>>,
    /// The one-pass loop for a chain of adds and products of a stored
    /// tensor, then an activation (a normalisation applied;
    /// `chain_recipes.rs`).
    pub(super) chain: Option<Chain<'a>>,
    /// The root only views a stored tensor.
    pub(super) gather: Option<Gather<'a>>,
    /// Any other program, as a list of instructions over blocks
    /// (`flat.rs`).
    pub(super) flat: Option<Flat<'a>>,
}

/// A program that only views a stored tensor (a permute of a `[B, N, C]`
/// projection into a conv's `[B, C, N]`): where it stores the element at
/// root coordinates `c`, `data[offset + sum(c[d] * coef[d])]`, so that
/// blocks of rows are copied, not interpreted line by line.
#[derive(Clone, Copy)]
pub(super) struct Gather<'a> {
    pub(super) data: &'a [f32],
    pub(super) offset: usize,
    pub(super) coef: [usize; super::shape::MAX_RANK],
}

/// The epilogues the recipes compute in one pass: a scan's gate
/// (`recipes.rs`), a gated convolution's (`conv_recipes.rs`), a chain
/// of adds and products then an activation (`chain_recipes.rs`), and any
/// other as a list of instructions (`flat.rs`).
// The chain is twice the others' size, but a sink is built on the stack
// once per kernel call: boxing it would allocate in `execute`.
#[allow(clippy::large_enum_variant)]
pub(super) enum EpilogueRecipe<'a> {
    Gate(Gate<'a>),
    SkipGate(SkipGate<'a>),
    Chain(Chain<'a>),
    Flat(Flat<'a>),
}

impl EpilogueRecipe<'_> {
    /// Writes the finished anchor values along `line` into `out` and
    /// returns true, or returns false, writing nothing, where the line's
    /// reads do not fit the recipe. `tmp`: line temporaries the recipe
    /// may use ([`CompiledProgram::temporaries`] of them).
    pub(super) fn run(
        &self,
        line: &Line,
        values: &[f32],
        out: &mut [f32],
        tmp: &mut [f32],
    ) -> bool {
        match self {
            Self::Gate(r) => r.run(line, values, out),
            Self::SkipGate(r) => r.run(line, values, out),
            Self::Chain(r) => r.run(line, values, out),
            Self::Flat(r) => r.run(line, values, out, tmp),
        }
    }

    /// Whether the recipe computes each element from the anchor's value at
    /// the same place alone (see [`Self::finish_in_place`]).
    pub(super) fn pointwise(&self) -> bool {
        match self {
            Self::Chain(r) => r.pointwise(),
            Self::Flat(r) => r.pointwise(),
            Self::Gate(_) | Self::SkipGate(_) => false,
        }
    }

    /// Finishes `values`, anchor values of any rows and places, in place
    /// and returns true where the recipe is pointwise (a conv's
    /// activation: see [`Chain::pointwise`]); else returns false,
    /// changing nothing. `tmp` as for [`Self::run`].
    pub(super) fn finish_in_place(&self, values: &mut [f32], tmp: &mut [f32]) -> bool {
        match self {
            Self::Chain(r) => r.finish_in_place(values),
            Self::Flat(r) => r.finish_in_place(values, tmp),
            Self::Gate(_) | Self::SkipGate(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {

    use super::super::conv_recipes::Product;
    use super::super::generation::ShapeGeneration;
    use super::super::ops::{BinaryOp, UnaryOp};
    use super::super::program::{Env, Expr, Line, Program};
    use super::super::rows::{block_tmp, EpilogueSink, ProgramRows, RowSink, RowSource};
    use super::super::shape::MAX_RANK;
    use super::{CompiledProgram, EpilogueRecipe, Prologue};
    use crate::test_support::{CountingEnv as Counting, Rng, TestEnv};

    /// The values every case reads: `[1, c, n]` operands `a` and `b`, a
    /// `[c, 1]` parameter, a `[1, n, c]` operand read transposed, and
    /// `full`, the shape of the anchor's values and of every node.
    struct Values {
        a: usize,
        b: usize,
        param: usize,
        t: usize,
        full: usize,
    }

    const C: usize = 3;

    /// The values for length `n`, from `seed`.
    fn values(n: usize, seed: u64) -> (TestEnv, Values) {
        let mut rng = Rng::new(seed);
        let mut env = TestEnv::default();
        let full = env.virt(&[1, C, n]);
        let a = env.stored(&[1, C, n], rng.vec(C * n, -3.0, 3.0));
        let b = env.stored(&[1, C, n], rng.vec(C * n, -3.0, 3.0));
        let param = env.stored(&[C, 1], rng.vec(C, -1.0, -0.1));
        let t = env.stored(&[1, n, C], rng.vec(C * n, -3.0, 3.0));
        let v = Values {
            a,
            b,
            param,
            t,
            full,
        };
        (env, v)
    }

    /// Whether a program's recipe was bound for a call.
    type Bound = fn(&CompiledProgram, &dyn Env) -> bool;

    /// One program per recipe, named for it, with its test of whether
    /// that recipe was bound.
    fn cases(v: &Values) -> Vec<(&'static str, Program, Bound)> {
        let full = v.full;
        let un = |p: &mut Program, op, x| p.push(Expr::Unary { op, x }, full);
        let bin = |p: &mut Program, op, a, b| p.push(Expr::Binary { op, a, b }, full);
        let param = |p: &mut Program| {
            let l = p.push(Expr::Load, v.param);
            p.push(Expr::Broadcast { x: l }, full)
        };
        fn prologue(c: &CompiledProgram, env: &dyn Env, bound: fn(&Prologue) -> bool) -> bool {
            bound(&c.recipes().prologue(c, env))
        }
        let mut cases: Vec<(&'static str, Program, Bound)> = Vec::new();

        // `[exp(-softplus(a) * param), b * softplus(a)]`.
        let mut p = Program::default();
        let la = p.push(Expr::Load, v.a);
        let dt = un(&mut p, UnaryOp::Softplus, la);
        let neg = un(&mut p, UnaryOp::Neg, dt);
        let k = param(&mut p);
        let e = bin(&mut p, BinaryOp::Mul, neg, k);
        let ra = un(&mut p, UnaryOp::Exp, e);
        let lb = p.push(Expr::Load, v.b);
        let ru = bin(&mut p, BinaryOp::Mul, lb, dt);
        p.set_roots(vec![ra, ru]);
        cases.push(("discretise", p, |c, env| {
            prologue(c, env, |r| r.discretise.is_some())
        }));

        let mut p = Program::default();
        let la = p.push(Expr::Load, v.a);
        let lb = p.push(Expr::Load, v.b);
        bin(&mut p, BinaryOp::Mul, la, lb);
        cases.push(("product", p, |c, env| {
            prologue(c, env, |r| r.product.is_some())
        }));

        // `silu(a * param + b)`.
        let mut p = Program::default();
        let la = p.push(Expr::Load, v.a);
        let k = param(&mut p);
        let m = bin(&mut p, BinaryOp::Mul, la, k);
        let lb = p.push(Expr::Load, v.b);
        let s = bin(&mut p, BinaryOp::Add, m, lb);
        un(&mut p, UnaryOp::Silu, s);
        cases.push(("chain", p, |c, env| prologue(c, env, |r| r.chain.is_some())));

        // `t` transposed into `[1, c, n]`.
        let mut p = Program::default();
        let lt = p.push(Expr::Load, v.t);
        let mut map = [None; MAX_RANK];
        map[..3].copy_from_slice(&[Some(0), Some(2), Some(1)]);
        p.push(Expr::View { x: lt, map }, full);
        cases.push(("gather", p, |c, env| {
            prologue(c, env, |r| r.gather.is_some())
        }));

        // A GLU, `a * sigmoid(b)`: no dedicated recipe.
        let mut p = Program::default();
        let la = p.push(Expr::Load, v.a);
        let lb = p.push(Expr::Load, v.b);
        let s = un(&mut p, UnaryOp::Sigmoid, lb);
        bin(&mut p, BinaryOp::Mul, la, s);
        cases.push(("flat prologue", p, |c, env| {
            prologue(c, env, |r| r.flat.is_some())
        }));

        // `y * silu(a)`.
        let mut p = Program::default();
        let y = p.push(Expr::Anchor, full);
        let la = p.push(Expr::Load, v.a);
        let s = un(&mut p, UnaryOp::Silu, la);
        bin(&mut p, BinaryOp::Mul, y, s);
        cases.push(("gate", p, |c, env| {
            matches!(c.recipes().epilogue(c, env), Some(EpilogueRecipe::Gate(_)))
        }));

        // `gelu((y + param * a) * b)`.
        let mut p = Program::default();
        let y = p.push(Expr::Anchor, full);
        let k = param(&mut p);
        let la = p.push(Expr::Load, v.a);
        let skip = bin(&mut p, BinaryOp::Mul, k, la);
        let s = bin(&mut p, BinaryOp::Add, y, skip);
        let lb = p.push(Expr::Load, v.b);
        let g = bin(&mut p, BinaryOp::Mul, s, lb);
        un(&mut p, UnaryOp::Gelu, g);
        cases.push(("skip gate", p, |c, env| {
            matches!(
                c.recipes().epilogue(c, env),
                Some(EpilogueRecipe::SkipGate(_))
            )
        }));

        // `tanh(y * param + b)`.
        let mut p = Program::default();
        let y = p.push(Expr::Anchor, full);
        let k = param(&mut p);
        let m = bin(&mut p, BinaryOp::Mul, y, k);
        let lb = p.push(Expr::Load, v.b);
        let s = bin(&mut p, BinaryOp::Add, m, lb);
        un(&mut p, UnaryOp::Tanh, s);
        cases.push(("chain epilogue", p, |c, env| {
            matches!(c.recipes().epilogue(c, env), Some(EpilogueRecipe::Chain(_)))
        }));

        // `y * sigmoid(a)`: no dedicated recipe.
        let mut p = Program::default();
        let y = p.push(Expr::Anchor, full);
        let la = p.push(Expr::Load, v.a);
        let s = un(&mut p, UnaryOp::Sigmoid, la);
        bin(&mut p, BinaryOp::Mul, y, s);
        cases.push(("flat epilogue", p, |c, env| {
            matches!(c.recipes().epilogue(c, env), Some(EpilogueRecipe::Flat(_)))
        }));
        cases
    }

    /// A call of a generation binds each recipe's leaves from shapes once:
    /// later calls of the generation ask no shape; a new generation asks
    /// again, and a call without one asks every time.
    #[test]
    fn calls_of_one_generation_bind_leaves_without_asking_shapes() {
        let (env, v) = values(40, 1);
        let mut env = Counting::new(env, None);
        for (name, p, bound) in cases(&v) {
            let compiled = p.compile();
            for generation in [ShapeGeneration::fresh(), ShapeGeneration::fresh()] {
                env.generation = Some(generation);
                assert!(bound(&compiled, &env), "{name}: its recipe bound");
                assert!(env.asked() > 0, "{name}: a new generation asks shapes");
                for _ in 0..2 {
                    assert!(bound(&compiled, &env), "{name}: bound again");
                    assert_eq!(env.asked(), 0, "{name}: kept from the generation");
                }
            }
            env.generation = None;
            for _ in 0..2 {
                assert!(bound(&compiled, &env), "{name}: bound without generation");
                assert!(env.asked() > 0, "{name}: no generation asks every time");
            }
        }
    }

    /// The bits of `compiled` over every row of `env`'s `[1, c, n]`
    /// root: interpreted, and through its recipes (the rows filled at once
    /// as a prologue, or stored as the epilogue of anchor values `y`).
    fn run(compiled: &CompiledProgram, env: &dyn Env, y: &[f32]) -> [Vec<u32>; 2] {
        let shape = env.shape(compiled.nodes()[compiled.root()].value);
        let n = shape[2];
        let mut tmp = vec![0.0; block_tmp(compiled.temporaries() + 1, n)];
        let mut want = vec![0.0; C * n];
        let mut got = vec![0.0; C * n];
        for (r, out) in want.chunks_exact_mut(n).enumerate() {
            let mut base = [0; MAX_RANK];
            base[1] = r;
            let y = if y.is_empty() { y } else { &y[r * n..][..n] };
            compiled.eval(env, y, &Line::along(base, 2), out, &mut tmp);
        }
        if y.is_empty() {
            ProgramRows::new(compiled, env).fill_rows(0, C, 0, n, &mut got, &mut tmp);
        } else {
            EpilogueSink::new(compiled, env, shape, &[], &mut got, shape).store_rows(
                0,
                C,
                0,
                n,
                &mut y.to_vec(),
                &mut tmp,
            );
        }
        [want, got].map(|v| v.iter().map(|x| x.to_bits()).collect())
    }

    /// New data under the generation whose geometry is kept is read: the
    /// recipes give the interpreter's values of this call's tensors.
    #[test]
    fn new_data_under_a_kept_generation_is_read() {
        let n = 40;
        let (first, v) = values(n, 2);
        let generation = Some(ShapeGeneration::fresh());
        let first = Counting::new(first, generation);
        let (other, _) = values(n, 3);
        let other = Counting::new(other, generation);
        let y = Rng::new(4).vec(C * n, -3.0, 3.0);
        for (name, p, bound) in cases(&v) {
            if name == "discretise" {
                // Two roots: a pair of rows, not one.
                continue;
            }
            let compiled = p.compile();
            let y = if compiled.reads_anchor() { &y[..] } else { &[] };
            let [want, got] = run(&compiled, &first, y);
            assert_eq!(want, got, "{name}");
            assert!(bound(&compiled, &other));
            let [other_want, other_got] = run(&compiled, &other, y);
            assert_eq!(other_want, other_got, "{name}: this call's data");
            assert_ne!(want, other_want, "{name}: other data");
        }
    }

    /// Calls of two generations (two hosts sharing a program, other
    /// shapes) each bind their own shapes' leaves, in turn and at once.
    #[test]
    fn generations_never_read_each_others_leaves() {
        let mut p = Program::default();
        let (_, v) = values(1, 0);
        let la = p.push(Expr::Load, v.a);
        let lb = p.push(Expr::Load, v.b);
        p.push(
            Expr::Binary {
                op: BinaryOp::Mul,
                a: la,
                b: lb,
            },
            v.full,
        );
        let compiled = p.clone().compile();
        let envs: Vec<_> = (0..3)
            .map(|i| {
                let (env, _) = values(10 + 7 * i, i as u64);
                Counting::new(env, Some(ShapeGeneration::fresh()))
            })
            .collect();
        let check = |env: &Counting| {
            let bound = compiled.recipes().prologue(&compiled, env).product;
            assert_eq!(bound, Product::find(&p, env), "the call's own leaves");
        };
        for _ in 0..3 {
            envs.iter().for_each(check);
        }
        std::thread::scope(|s| {
            for env in &envs {
                s.spawn(move || (0..2000).for_each(|_| check(env)));
            }
        });
    }
}
