//! Recipes: single-pass loops for the elementwise programs that surround a
//! selective scan, recognised in a [`Program`]'s structure.
//!
//! The interpreter ([`Program::eval`]) makes one pass over a line buffer
//! per node, and copies every stored operand and shared value into a
//! buffer first. For the diagonal SSM block (`dt = softplus(p)`,
//! `a = exp(-dt * A)`, `u = dt * x`, the scan, `y * silu(z)`) that is 7
//! op passes, 7 line copies and a fill per chunk: profiled, the time
//! around the ops' loops (copies, tree walks, line set-up) was about that
//! in them. The discretisation of a Mamba-style scan and the gate after
//! it are the same few ops in every such model (Mamba's own kernel fuses
//! exactly these), so they get dedicated loops: each operand is read
//! once, in place, every intermediate stays in a register, and `a`, `u`
//! and the gated output are each stored once (the output straight into
//! the result, or streamed past the caches when it is larger than them).
//! On the SSM block (D = 2048, N = 4096, 2 threads of a 2-core EPYC) this
//! took the call from 10.7 to 8.1 ms; cheaper softplus and sigmoid
//! (`math.rs`), prefetching and streaming stores took it to about 5.8.
//!
//! A recipe computes the ops the program names, in the same order, with
//! the same functions (`math.rs`, same instruction-set variant): its
//! results are the interpreter's, bit for bit (NaN aside, whose sign may
//! differ; the tests check this), so taking it is never a numerical
//! decision. Its form is matched once per program, on structure alone,
//! when the plan compiles it (`compiled.rs`); where its leaves lie is
//! derived once per set of shapes, and a kernel call binds its tensors'
//! data to that; per line it runs only when its stored
//! operands are read contiguously and its per-row factor is one value
//! along the line (a `[C, 1]` parameter along time). Any other line, or
//! any other program, is interpreted.

use super::math;
use super::ops::{prefetch, BinaryOp, UnaryOp};
use super::program::views::{Leaf, LeafGeometry, LeafMap};
use super::program::{Env, Expr, Line, Program};
use crate::simd::{per_backend, Isa};

/// The operands of node `i` if it is the binary `op` (in the program's
/// order: callers try both where the op commutes).
pub(super) fn binary(program: &Program, i: usize, op: BinaryOp) -> Option<(usize, usize)> {
    match program.nodes().get(i)?.expr {
        Expr::Binary { op: o, a, b } if o == op => Some((a, b)),
        _ => None,
    }
}

/// Of operands `a` and `b`, the one beside the anchor (the kernel's own
/// values), if the other is the anchor.
pub(super) fn beside_anchor(program: &Program, a: usize, b: usize) -> Option<usize> {
    match (&program.nodes()[a].expr, &program.nodes()[b].expr) {
        (Expr::Anchor, _) => Some(b),
        (_, Expr::Anchor) => Some(a),
        _ => None,
    }
}

/// The discretisation of a diagonal selective scan, computing its two
/// operands together: `a = exp(±dt * k)` and `u = dt * x`, with
/// `dt = softplus(p)` (or `dt = p`) computed once for both, `k` one value
/// per line and `p`, `x` stored.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Discretise<'a> {
    /// The program's instruction set.
    isa: Isa,
    /// The leaf `dt` is computed from.
    p: LeafMap<'a>,
    /// `dt = softplus(p)`; else `dt = p`.
    softplus: bool,
    /// The leaf of the per-line factor `k`.
    k: LeafMap<'a>,
    /// `a = exp(-(dt * k))`: an odd number of negations in the exponent.
    negate: bool,
    /// The leaf `u` multiplies `dt` by.
    x: LeafMap<'a>,
}

/// The form of [`Discretise`] in a program: its leaves' nodes, matched on
/// structure alone, once, when the program is built.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct DiscretiseForm {
    p: usize,
    softplus: bool,
    k: usize,
    negate: bool,
    x: usize,
}

impl DiscretiseForm {
    /// The form of a program whose two roots are `[a, u]` as [`Discretise`]
    /// computes them (factors in either order, negations anywhere in `a`'s
    /// product).
    pub(super) fn find(program: &Program, roots: &[usize]) -> Option<Self> {
        let nodes = program.nodes();
        let &[ra, ru] = roots else { return None };
        let Expr::Unary {
            op: UnaryOp::Exp,
            x: mut e,
        } = nodes[ra].expr
        else {
            return None;
        };
        // Strips negations, counting them.
        let strip = |mut i: usize, negate: &mut bool| {
            while let Expr::Unary {
                op: UnaryOp::Neg,
                x,
            } = nodes[i].expr
            {
                *negate = !*negate;
                i = x;
            }
            i
        };
        let mut negate = false;
        e = strip(e, &mut negate);
        let (f1, f2) = binary(program, e, BinaryOp::Mul)?;
        let (f1, f2) = (strip(f1, &mut negate), strip(f2, &mut negate));
        let (g1, g2) = binary(program, ru, BinaryOp::Mul)?;
        // `dt` is the factor both roots share; the other ones are leaves.
        let (dt, k, x) = [(f1, f2), (f2, f1)]
            .into_iter()
            .flat_map(|(dt, k)| [(dt, k, g1, g2), (dt, k, g2, g1)])
            .find(|&(dt, _, g_dt, _)| dt == g_dt)
            .map(|(dt, k, _, x)| (dt, k, x))?;
        if !program.is_leaf(k) || !program.is_leaf(x) {
            return None;
        }
        let (p, softplus) = match nodes[dt].expr {
            Expr::Unary {
                op: UnaryOp::Softplus,
                x: p,
            } if program.is_leaf(p) => (p, true),
            _ if program.is_leaf(dt) => (dt, false),
            _ => return None,
        };
        Some(DiscretiseForm {
            p,
            softplus,
            k,
            negate,
            x,
        })
    }

    /// Where its leaves lie for `env`'s current shapes (shapes alone: see
    /// [`LeafGeometry`]).
    pub(super) fn geometry(&self, program: &Program, env: &dyn Env) -> Option<DiscretiseGeometry> {
        Some(DiscretiseGeometry {
            p: program.leaf_geometry(self.p, env)?,
            k: program.leaf_geometry(self.k, env)?,
            x: program.leaf_geometry(self.x, env)?,
        })
    }

    /// The recipe on `isa`, its leaves where `geometry` puts them in
    /// `env`'s data: a line then costs a few multiply-adds to locate.
    pub(super) fn bind<'a>(
        &self,
        isa: Isa,
        geometry: &DiscretiseGeometry,
        env: &'a dyn Env,
    ) -> Discretise<'a> {
        Discretise {
            isa,
            p: geometry.p.bind(env),
            softplus: self.softplus,
            k: geometry.k.bind(env),
            negate: self.negate,
            x: geometry.x.bind(env),
        }
    }
}

/// Where the leaves of a [`DiscretiseForm`] lie for one set of shapes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct DiscretiseGeometry {
    p: LeafGeometry,
    k: LeafGeometry,
    x: LeafGeometry,
}

impl<'a> Discretise<'a> {
    /// Matched and bound at once, as the tests ask.
    #[cfg(test)]
    pub(super) fn find(program: &Program, roots: &[usize], env: &'a dyn Env) -> Option<Self> {
        let form = DiscretiseForm::find(program, roots)?;
        Some(form.bind(Isa::detect(), &form.geometry(program, env)?, env))
    }

    /// Writes both operands along `line` into `a` and `u` (equally long)
    /// and returns true, or returns false, writing nothing, where this
    /// line's reads do not fit the recipe (see the module docs).
    pub(super) fn run(&self, line: &Line, a: &mut [f32], u: &mut [f32]) -> bool {
        let len = a.len();
        debug_assert_eq!(len, u.len());
        let (
            Some(Leaf::Contiguous(p, p_ahead)),
            Some(Leaf::Contiguous(x, x_ahead)),
            Some(Leaf::Scalar(k)),
        ) = (
            self.p.read(line, len),
            self.x.read(line, len),
            self.k.read(line, len),
        )
        else {
            return false;
        };
        // `(-dt) * k`, `-(dt * k)` and `dt * (-k)` round alike: negation
        // is exact and rounding symmetric.
        let k = if self.negate { -k } else { k };
        discretise(self.isa, [p, x], [p_ahead, x_ahead], k, self.softplus, a, u);
        true
    }
}

/// The gate after a scan: `y * silu(z)` (or `y * z`), `y` the anchor's
/// chunk and `z` stored.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Gate<'a> {
    /// The program's instruction set.
    isa: Isa,
    /// The gate's leaf.
    z: LeafMap<'a>,
    /// `y * silu(z)`; else `y * z`.
    silu: bool,
}

/// The form of [`Gate`] in a program (see [`DiscretiseForm`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct GateForm {
    z: usize,
    silu: bool,
}

impl GateForm {
    /// The form of an epilogue whose root is the gate (factors in either
    /// order).
    pub(super) fn find(program: &Program) -> Option<Self> {
        let nodes = program.nodes();
        let (a, b) = binary(program, program.root(), BinaryOp::Mul)?;
        let g = beside_anchor(program, a, b)?;
        let (z, silu) = match nodes[g].expr {
            Expr::Unary {
                op: UnaryOp::Silu,
                x: z,
            } if program.is_leaf(z) => (z, true),
            _ if program.is_leaf(g) => (g, false),
            _ => return None,
        };
        Some(GateForm { z, silu })
    }

    /// Where its leaf lies for `env`'s current shapes.
    pub(super) fn geometry(&self, program: &Program, env: &dyn Env) -> Option<GateGeometry> {
        Some(GateGeometry {
            z: program.leaf_geometry(self.z, env)?,
        })
    }

    /// The recipe on `isa`, its leaf where `geometry` puts it in `env`'s
    /// data.
    pub(super) fn bind<'a>(&self, isa: Isa, geometry: &GateGeometry, env: &'a dyn Env) -> Gate<'a> {
        Gate {
            isa,
            z: geometry.z.bind(env),
            silu: self.silu,
        }
    }
}

/// Where the leaf of a [`GateForm`] lies for one set of shapes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct GateGeometry {
    z: LeafGeometry,
}

impl<'a> Gate<'a> {
    /// Matched and bound at once, as the tests ask.
    #[cfg(test)]
    pub(super) fn find(program: &Program, env: &'a dyn Env) -> Option<Self> {
        let form = GateForm::find(program)?;
        Some(form.bind(Isa::detect(), &form.geometry(program, env)?, env))
    }

    /// Writes the gated `y` (the anchor's values along `line`) into `out`
    /// (as long) and returns true, or returns false, writing nothing,
    /// where the gate is not read contiguously along this line.
    pub(super) fn run(&self, line: &Line, y: &[f32], out: &mut [f32]) -> bool {
        match self.z.read(line, y.len()) {
            Some(Leaf::Contiguous(z, ahead)) => {
                gate(self.isa, y, z, ahead, self.silu, out);
                true
            }
            _ => false,
        }
    }
}

per_backend! {
    /// `a[i] = exp(dt * k)`, `u[i] = dt * x[i]` with `dt = softplus(p[i])`
    /// (`softplus`) or `p[i]`, `[p, x] = px`, in one pass with the vectors
    /// of the program's instruction set, prefetching `ahead` (what follows `p` and `x`)
    /// as it goes. `px`, `a` and `u` equally long.
    pub(super) fn discretise(
        px: [&[f32]; 2],
        ahead: [&[f32]; 2],
        k: f32,
        softplus: bool,
        a: &mut [f32],
        u: &mut [f32],
    ) => discretise_generic
}

/// Elements per block of the loops of every recipe (this file's,
/// conv_recipes.rs's and chain_recipes.rs's, which import it): fixed-size
/// blocks of several vectors compile to interleaved independent chains, and
/// a block's prefetches (a few lines per stream) spread over the line.
pub(super) const BLOCK: usize = 64;

/// The loops, inlined into each instruction-set variant; `F`: the
/// variant has fused multiply-add (as [`UnaryOp::apply`]'s, so the math
/// rounds as the interpreter's does).
#[inline(always)]
fn discretise_generic<const F: bool>(
    px: [&[f32]; 2],
    ahead: [&[f32]; 2],
    k: f32,
    softplus: bool,
    a: &mut [f32],
    u: &mut [f32],
) {
    // One loop per form, so that none tests a flag per element. A decay
    // (`exp(-dt * A)` with `A > 0`, so `k <= 0`) of a softplus (`dt >= 0`)
    // never has a positive exponent: the cheaper `exp` for those applies,
    // equal bit for bit.
    let f = DiscretiseFns { ahead, k, a, u };
    if softplus && k <= 0.0 {
        f.blocks(px, math::softplus::<F>, math::exp_nonpositive::<F>)
    } else if softplus {
        f.blocks(px, math::softplus::<F>, math::exp::<F>)
    } else {
        f.blocks(px, |p| p, math::exp::<F>)
    }
}

/// What the discretisation loops write and prefetch.
struct DiscretiseFns<'a, 'b> {
    ahead: [&'a [f32]; 2],
    k: f32,
    a: &'b mut [f32],
    u: &'b mut [f32],
}

impl DiscretiseFns<'_, '_> {
    /// The loop over [`BLOCK`]s and the remainder. (Closures in the
    /// instruction-set variants would not inherit their target features:
    /// helpers are `#[inline(always)]` fns, the functions they take
    /// inlined.)
    #[inline(always)]
    fn blocks(
        self,
        [p, x]: [&[f32]; 2],
        dt: impl Fn(f32) -> f32 + Copy,
        exp: impl Fn(f32) -> f32 + Copy,
    ) {
        let k = self.k;
        let (mut pc, mut xc, mut ac, mut uc) = (
            p.chunks_exact(BLOCK),
            x.chunks_exact(BLOCK),
            self.a.chunks_exact_mut(BLOCK),
            self.u.chunks_exact_mut(BLOCK),
        );
        for (i, (((p, x), a), u)) in (&mut pc).zip(&mut xc).zip(&mut ac).zip(&mut uc).enumerate() {
            for ahead in self.ahead {
                prefetch(ahead.get(i * BLOCK..(i + 1) * BLOCK).unwrap_or(&[]));
            }
            // `dt` for the whole block first, then `a` and `u`: fixed-length
            // loops of independent vectors (measured 10% faster than one
            // loop doing both per vector).
            let mut dts = [0.0f32; BLOCK];
            for (d, &p) in dts.iter_mut().zip(p) {
                *d = dt(p);
            }
            line(&dts, x, k, a, u, |d| d, exp);
        }
        let (p, x) = (pc.remainder(), xc.remainder());
        line(p, x, k, ac.into_remainder(), uc.into_remainder(), dt, exp);
    }
}

#[inline(always)]
fn line(
    p: &[f32],
    x: &[f32],
    k: f32,
    a: &mut [f32],
    u: &mut [f32],
    dt: impl Fn(f32) -> f32,
    exp: impl Fn(f32) -> f32,
) {
    for (((&p, &x), a), u) in p.iter().zip(x).zip(a.iter_mut()).zip(u.iter_mut()) {
        let dt = dt(p);
        *a = exp(dt * k);
        *u = dt * x;
    }
}

per_backend! {
    /// `out[i] = y[i] * silu(z[i])` (`silu`) or `y[i] * z[i]`, in one pass,
    /// prefetching `ahead` (what follows `z`) as it goes. `y`, `z` and `out`
    /// equally long.
    pub(super) fn gate(
        y: &[f32],
        z: &[f32],
        ahead: &[f32],
        silu: bool,
        out: &mut [f32],
    ) => gate_generic
}

#[inline(always)]
fn gate_generic<const F: bool>(y: &[f32], z: &[f32], ahead: &[f32], silu: bool, out: &mut [f32]) {
    #[inline(always)]
    fn each(y: &[f32], z: &[f32], out: &mut [f32], g: impl Fn(f32) -> f32) {
        for ((o, &y), &z) in out.iter_mut().zip(y).zip(z) {
            *o = y * g(z);
        }
    }
    #[inline(always)]
    fn blocks(y: &[f32], z: &[f32], ahead: &[f32], out: &mut [f32], g: impl Fn(f32) -> f32 + Copy) {
        for (i, ((y, z), out)) in y
            .chunks(BLOCK)
            .zip(z.chunks(BLOCK))
            .zip(out.chunks_mut(BLOCK))
            .enumerate()
        {
            prefetch(ahead.get(i * BLOCK..(i + 1) * BLOCK).unwrap_or(&[]));
            each(y, z, out, g);
        }
    }
    if silu {
        // As `UnaryOp::Silu` computes it (`z / (1 + e^-z)`).
        blocks(y, z, ahead, out, math::silu::<F>)
    } else {
        blocks(y, z, ahead, out, |z| z)
    }
}
