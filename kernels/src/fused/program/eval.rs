//! Evaluating a [`Program`] along a line: the interpreter.

use super::{Env, Expr, Line, Program, MAX_SHARED};
use crate::fused::ops::{clamp, copy, prefetch, select};
use crate::fused::shape::{Shape, MAX_RANK};
use crate::fused::strided;
use crate::simd::Isa;

/// One evaluation's instruction set and the lines of shared nodes it has
/// computed.
struct Memo<'a> {
    /// The vectors every node's loop runs with.
    isa: Isa,
    /// Per slot, the line and length it holds.
    keys: [Option<(Line, usize)>; MAX_SHARED],
    /// `MAX_SHARED` slots of `len` elements.
    data: &'a mut [f32],
    len: usize,
}

impl Program {
    /// Writes the root's elements along `line` (in the root's coordinates)
    /// into `out`, `out.len()` of them, with the vectors of `isa` (a
    /// compiled program's: [`super::super::CompiledProgram::eval`]). `anchor` is the anchor's chunk for
    /// [`Expr::Anchor`] (same length as `out`); `tmp` holds at least
    /// [`Self::temporaries`] `* out.len()` elements.
    ///
    /// # Panics
    /// If the line leaves a tensor the env stores, or `tmp` is too short:
    /// both are bugs of the caller's plan, and safe indexing turns them into
    /// panics rather than wrong reads.
    pub fn eval(
        &self,
        isa: Isa,
        env: &dyn Env,
        anchor: &[f32],
        line: &Line,
        out: &mut [f32],
        tmp: &mut [f32],
    ) {
        let (slots, tmp) = tmp.split_at_mut(self.slots * out.len());
        let mut memo = Memo {
            isa,
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
        isa: Isa,
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
            isa,
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
            Expr::Load => load(
                memo.isa,
                env.data(node.value),
                &env.shape(node.value),
                line,
                out,
            ),
            Expr::Anchor => copy(out, &anchor[..len]),
            Expr::Const(c) => out.fill(c),
            Expr::Unary { op, x } => {
                self.eval_node(x, env, anchor, line, out, tmp, memo);
                op.apply(memo.isa, out);
            }
            Expr::Clamp { x, min, max } => {
                self.eval_node(x, env, anchor, line, out, tmp, memo);
                clamp(out, min, max);
            }
            Expr::Binary { op, a, b } => {
                self.eval_node(a, env, anchor, line, out, tmp, memo);
                let (bv, rest) = tmp.split_at_mut(len);
                self.eval_node(b, env, anchor, line, bv, rest, memo);
                op.apply(memo.isa, out, bv);
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
                    // The anchor's values of these elements (an anchor
                    // reads the root's line, views or not).
                    let anchor = anchor.get(t0..t1).unwrap_or_default();
                    self.eval_node(part, env, anchor, &child, &mut out[t0..t1], tmp, memo);
                }
            }
        }
    }
}

/// Elements of a row-major tensor of `shape` along `line`, moved with the
/// vectors of `isa`.
fn load(isa: Isa, data: &[f32], shape: &Shape, line: &Line, out: &mut [f32]) {
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
            strided::gather_by(isa, stride, line, out);
        }
    }
}
