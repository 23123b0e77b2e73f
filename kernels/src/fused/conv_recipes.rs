//! Recipes around a gated convolution (Hyena, H3): single-pass loops for
//! its prologue `v * x` and its epilogue `act((y + d * u) * g)`, recognised
//! in a [`Program`]'s structure as `recipes.rs` does for the scan's.
//!
//! Hyena's long convolution reads `u = v * x` and finishes with the
//! per-channel skip `d * u`, the gate `g` and a GELU. Interpreted, that is
//! three passes over each prologue line and ten over each epilogue line
//! (every stored operand copied into a buffer first): in the Hyena block
//! they took more time than the FFT. Here each operand is read once, in
//! place, and every intermediate stays in a register.
//!
//! As in `recipes.rs`, a recipe computes the program's ops in its tree's
//! order with the same functions and instruction-set variant, so its
//! results are the interpreter's bit for bit (the tests check this); per
//! line it runs only where its stored operands are read contiguously and
//! the skip's factor is one value along the line (a `[C, 1]` parameter
//! along time). Any other line or program is interpreted.

use super::math;
use super::ops::prefetch;
use super::ops::{BinaryOp, UnaryOp};
use super::program::views::{Leaf, LeafGeometry, LeafMap};
use super::program::{Env, Expr, Line, Program};
use super::recipes::{beside_anchor, binary, BLOCK};
use crate::simd::{per_backend, Isa};

/// The operands of `a * b` if node `i` is that product.
fn product(program: &Program, i: usize) -> Option<(usize, usize)> {
    binary(program, i, BinaryOp::Mul)
}

/// A product of two stored operands, `a * b`: Hyena's `v * x`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Product<'a> {
    a: LeafMap<'a>,
    b: LeafMap<'a>,
}

/// The form of [`Product`] in a program: its leaves' nodes, matched on
/// structure once, when the program is built.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct ProductForm {
    a: usize,
    b: usize,
}

impl ProductForm {
    /// The form of a program whose root is a product of two leaves.
    pub(super) fn find(program: &Program) -> Option<Self> {
        let (a, b) = product(program, program.root())?;
        (program.is_leaf(a) && program.is_leaf(b)).then_some(ProductForm { a, b })
    }

    /// Where its leaves lie for `env`'s current shapes (shapes alone: see
    /// [`LeafGeometry`]).
    pub(super) fn geometry(&self, program: &Program, env: &dyn Env) -> Option<ProductGeometry> {
        Some(ProductGeometry {
            a: program.leaf_geometry(self.a, env)?,
            b: program.leaf_geometry(self.b, env)?,
        })
    }
}

/// Where the leaves of a [`ProductForm`] lie for one set of shapes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct ProductGeometry {
    a: LeafGeometry,
    b: LeafGeometry,
}

impl ProductGeometry {
    /// The recipe, its leaves here in `env`'s data.
    pub(super) fn bind<'a>(&self, env: &'a dyn Env) -> Product<'a> {
        Product {
            a: self.a.bind(env),
            b: self.b.bind(env),
        }
    }
}

impl<'a> Product<'a> {
    /// Matched and bound at once, as the tests ask.
    #[cfg(test)]
    pub(super) fn find(program: &Program, env: &'a dyn Env) -> Option<Self> {
        Some(
            ProductForm::find(program)?
                .geometry(program, env)?
                .bind(env),
        )
    }

    /// Writes the product along `line` into `out` and returns true, or
    /// returns false, writing nothing, where an operand is not read
    /// contiguously along this line.
    pub(super) fn run(&self, line: &Line, out: &mut [f32]) -> bool {
        let len = out.len();
        match (self.a.read(line, len), self.b.read(line, len)) {
            (Some(Leaf::Contiguous(a, a_ahead)), Some(Leaf::Contiguous(b, b_ahead))) => {
                for (i, ((out, a), b)) in out
                    .chunks_mut(BLOCK)
                    .zip(a.chunks(BLOCK))
                    .zip(b.chunks(BLOCK))
                    .enumerate()
                {
                    for ahead in [a_ahead, b_ahead] {
                        prefetch(ahead.get(i * BLOCK..(i + 1) * BLOCK).unwrap_or(&[]));
                    }
                    for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
                        *o = a * b;
                    }
                }
                true
            }
            _ => false,
        }
    }
}

/// The skip `d * u` of a gated convolution: `u` stored, or the product of
/// two stored operands (`d * (v * x)`, recomputed rather than read back).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Skip<'a> {
    Stored(LeafMap<'a>),
    Product(LeafMap<'a>, LeafMap<'a>),
}

/// The epilogue `act((y + d * u) * g)`, `y` the anchor's chunk, `act`
/// GELU or nothing, `d` one value per line, `u` and `g` stored (sums and
/// products in either order).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct SkipGate<'a> {
    /// The program's instruction set.
    isa: Isa,
    d: LeafMap<'a>,
    u: Skip<'a>,
    g: LeafMap<'a>,
    gelu: bool,
}

/// The skip's `u` in a [`SkipGateForm`]: a leaf, or the product of two.
#[derive(Clone, Copy, Debug, PartialEq)]
enum SkipForm {
    Stored(usize),
    Product(usize, usize),
}

impl SkipForm {
    fn find(program: &Program, u: usize) -> Option<Self> {
        if program.is_leaf(u) {
            return Some(SkipForm::Stored(u));
        }
        let (v, x) = product(program, u)?;
        (program.is_leaf(v) && program.is_leaf(x)).then_some(SkipForm::Product(v, x))
    }

    fn geometry(&self, program: &Program, env: &dyn Env) -> Option<SkipGeometry> {
        Some(match *self {
            SkipForm::Stored(u) => SkipGeometry::Stored(program.leaf_geometry(u, env)?),
            SkipForm::Product(v, x) => SkipGeometry::Product(
                program.leaf_geometry(v, env)?,
                program.leaf_geometry(x, env)?,
            ),
        })
    }
}

/// Where the leaves of a [`SkipForm`] lie for one set of shapes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum SkipGeometry {
    Stored(LeafGeometry),
    Product(LeafGeometry, LeafGeometry),
}

impl SkipGeometry {
    fn bind<'a>(&self, env: &'a dyn Env) -> Skip<'a> {
        match self {
            SkipGeometry::Stored(u) => Skip::Stored(u.bind(env)),
            SkipGeometry::Product(v, x) => Skip::Product(v.bind(env), x.bind(env)),
        }
    }
}

/// The form of [`SkipGate`] in a program (see [`ProductForm`]). Which
/// factor of the skip is `d` depends on shapes (the one that is one value
/// along time), so the form keeps both readings and [`Self::bind`] picks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct SkipGateForm {
    /// The skip's factors `[p, q]` that are leaves (`d` is one).
    factors: [Option<usize>; 2],
    /// Per factor taken as `d`, the other as `u` (`None`: not of `u`'s
    /// form).
    skips: [Option<SkipForm>; 2],
    g: usize,
    gelu: bool,
}

impl SkipGateForm {
    /// The form of an epilogue `act((y + d * u) * g)`.
    pub(super) fn find(program: &Program) -> Option<Self> {
        let nodes = program.nodes();
        let (body, gelu) = match nodes.get(program.root())?.expr {
            Expr::Unary {
                op: UnaryOp::Gelu,
                x,
            } => (x, true),
            _ => (program.root(), false),
        };
        let (p, q) = product(program, body)?;
        let (sum, g) = if program.is_leaf(q) { (p, q) } else { (q, p) };
        let (a, b) = binary(program, sum, BinaryOp::Add)?;
        let skip = beside_anchor(program, a, b)?;
        let (p, q) = product(program, skip)?;
        program.is_leaf(g).then(|| SkipGateForm {
            factors: [p, q].map(|i| program.is_leaf(i).then_some(i)),
            skips: [SkipForm::find(program, q), SkipForm::find(program, p)],
            g,
            gelu,
        })
    }

    /// Where its leaves lie for `env`'s current shapes; `None` where no
    /// factor of the skip is one value along time with the other of `u`'s
    /// form (shapes alone decide).
    pub(super) fn geometry(&self, program: &Program, env: &dyn Env) -> Option<SkipGateGeometry> {
        // `d` is the factor one value along time (a `[C, 1]` parameter).
        let time = env
            .shape(program.nodes()[program.root()].value)
            .rank()
            .checked_sub(1)?;
        let per_row = |i: Option<usize>| {
            let geometry = program.leaf_geometry(i?, env)?;
            match geometry {
                LeafGeometry::Const(_) => Some(geometry),
                LeafGeometry::Stored { coef, .. } => (coef[time] == 0).then_some(geometry),
            }
        };
        let (which, d) = match per_row(self.factors[0]) {
            Some(d) => (0, d),
            None => (1, per_row(self.factors[1])?),
        };
        Some(SkipGateGeometry {
            d,
            u: self.skips[which]?.geometry(program, env)?,
            g: program.leaf_geometry(self.g, env)?,
        })
    }

    /// The recipe on `isa`, its leaves where `geometry` puts them in
    /// `env`'s data.
    pub(super) fn bind<'a>(
        &self,
        isa: Isa,
        geometry: &SkipGateGeometry,
        env: &'a dyn Env,
    ) -> SkipGate<'a> {
        SkipGate {
            isa,
            d: geometry.d.bind(env),
            u: geometry.u.bind(env),
            g: geometry.g.bind(env),
            gelu: self.gelu,
        }
    }
}

/// Where the leaves of a [`SkipGateForm`] lie for one set of shapes, its
/// skip's factors told apart.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct SkipGateGeometry {
    d: LeafGeometry,
    u: SkipGeometry,
    g: LeafGeometry,
}

impl<'a> SkipGate<'a> {
    /// Matched and bound at once, as the tests ask.
    #[cfg(test)]
    pub(super) fn find(program: &Program, env: &'a dyn Env) -> Option<Self> {
        let form = SkipGateForm::find(program)?;
        Some(form.bind(Isa::detect(), &form.geometry(program, env)?, env))
    }

    /// Writes the finished `y` (the anchor's values along `line`) into
    /// `out` (as long) and returns true, or returns false, writing nothing,
    /// where this line's reads do not fit the recipe.
    pub(super) fn run(&self, line: &Line, y: &[f32], out: &mut [f32]) -> bool {
        let len = y.len();
        let Some(Leaf::Scalar(d)) = self.d.read(line, len) else {
            return false;
        };
        let Some(Leaf::Contiguous(g, g_ahead)) = self.g.read(line, len) else {
            return false;
        };
        let (v, x, aheads) = match self.u {
            Skip::Stored(u) => match u.read(line, len) {
                Some(Leaf::Contiguous(u, u_ahead)) => (u, None, [g_ahead, u_ahead, &[][..]]),
                _ => return false,
            },
            Skip::Product(v, x) => match (v.read(line, len), x.read(line, len)) {
                (Some(Leaf::Contiguous(v, v_ahead)), Some(Leaf::Contiguous(x, x_ahead))) => {
                    (v, Some(x), [g_ahead, v_ahead, x_ahead])
                }
                _ => return false,
            },
        };
        skip_gate(
            self.isa,
            &SkipGateArgs {
                y,
                d,
                v,
                x,
                g,
                aheads,
                gelu: self.gelu,
            },
            out,
        );
        true
    }
}

/// One line of [`SkipGate`]: `u = v` (or `v * x`), `out = act((y + d * u) * g)`.
struct SkipGateArgs<'a> {
    y: &'a [f32],
    d: f32,
    v: &'a [f32],
    x: Option<&'a [f32]>,
    g: &'a [f32],
    aheads: [&'a [f32]; 3],
    gelu: bool,
}

per_backend! {
    fn skip_gate(args: &SkipGateArgs, out: &mut [f32]) => skip_gate_generic
}

/// The loops, inlined into each instruction-set variant; `F` as in
/// `UnaryOp::apply` (so GELU rounds as the interpreter's). One loop per
/// form, so none tests a flag per element.
#[inline(always)]
fn skip_gate_generic<const F: bool>(args: &SkipGateArgs, out: &mut [f32]) {
    // `x` stands for 1.0 where `u` is stored: `u * 1.0` is `u` exactly.
    let ones = [1.0f32; BLOCK];
    match (args.x, args.gelu) {
        (Some(x), true) => blocks(args, x, BLOCK, out, math::gelu::<F>),
        (Some(x), false) => blocks(args, x, BLOCK, out, |s| s),
        (None, true) => blocks(args, &ones, 0, out, math::gelu::<F>),
        (None, false) => blocks(args, &ones, 0, out, |s| s),
    }
}

/// `out[i] = act((y[i] + d * (v[i] * x[i])) * g[i])` over [`BLOCK`]s,
/// prefetching the next line's operands a block at a time; `x` advances
/// `x_step` elements per block (0: the same block of ones throughout).
#[inline(always)]
fn blocks(
    args: &SkipGateArgs,
    x: &[f32],
    x_step: usize,
    out: &mut [f32],
    act: impl Fn(f32) -> f32,
) {
    let d = args.d;
    for (b, out) in out.chunks_mut(BLOCK).enumerate() {
        let at = b * BLOCK;
        let n = out.len();
        for ahead in args.aheads {
            prefetch(ahead.get(at..at + BLOCK).unwrap_or(&[]));
        }
        let (y, v, g) = (
            &args.y[at..at + n],
            &args.v[at..at + n],
            &args.g[at..at + n],
        );
        let x = &x[b * x_step..][..n];
        for ((((o, &y), &v), &x), &g) in out.iter_mut().zip(y).zip(v).zip(x).zip(g) {
            *o = act((y + d * (v * x)) * g);
        }
    }
}
