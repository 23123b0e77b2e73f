//! First-order linear recurrence (diagonal linear scan):
//! `y[t] = a[t] * y[t - 1] + u[t]`, with `y[-1] = x0`, independently for
//! every `(batch, channel)` row.

use rayon::prelude::*;

use crate::error::{check_len, checked_product, KernelError};

/// Shape of a linear scan: `x0` is `[batch, channels]`; `a`, `u` and `y` are
/// `[batch, channels, len]`, row-major and contiguous.
///
/// Any dimension may be zero; the scan is then a no-op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanParams {
    /// Batch size.
    pub batch: usize,
    /// Independent recurrences per batch item.
    pub channels: usize,
    /// Steps per recurrence (the time axis).
    pub len: usize,
}

impl ScanParams {
    /// Checks that every element count fits in `usize`.
    ///
    /// # Errors
    ///
    /// [`KernelError::Overflow`] if `batch * channels` or
    /// `batch * channels * len` does not fit in `usize`.
    pub fn validate(&self) -> Result<(), KernelError> {
        checked_product(&[self.batch, self.channels], "scan state element count")?;
        checked_product(
            &[self.batch, self.channels, self.len],
            "scan sequence element count",
        )?;
        Ok(())
    }

    /// Elements in `x0`: `batch * channels`.
    ///
    /// Saturates at `usize::MAX` on overflow, which no `f32` slice can match;
    /// `validate` reports the overflow itself.
    #[must_use]
    pub fn state_elems(&self) -> usize {
        self.batch.saturating_mul(self.channels)
    }

    /// Elements in `a`, `u` and `y`: `batch * channels * len`. Saturates like
    /// [`state_elems`](Self::state_elems); exact whenever the true product
    /// fits (a saturated partial product times a zero `len` is still 0).
    #[must_use]
    pub fn seq_elems(&self) -> usize {
        self.state_elems().saturating_mul(self.len)
    }
}

/// Runs the scan: `y[b,c,0] = a[b,c,0] * x0[b,c] + u[b,c,0]` and
/// `y[b,c,t] = a[b,c,t] * y[b,c,t-1] + u[b,c,t]`.
///
/// Checks the slice lengths against `p` (an error, never a panic) before
/// touching `y`. Rows run in parallel on the *current* rayon pool (the caller
/// picks it with `ThreadPool::install`); each row is sequential in `t`, so the
/// result does not depend on the pool size. Performs no heap allocation of
/// its own; rayon's scheduling makes none either once the pool is warm
/// (`tests/no_alloc.rs`).
///
/// # Errors
///
/// Any error of [`ScanParams::validate`], or [`KernelError::BufferLen`] if
/// a slice's length differs from the shape's (`x0`, `a`, `u`, `y` checked in
/// that order).
pub fn linear_scan_f32(
    p: &ScanParams,
    x0: &[f32],
    a: &[f32],
    u: &[f32],
    y: &mut [f32],
) -> Result<(), KernelError> {
    p.validate()?;
    check_len("x0", p.state_elems(), x0.len())?;
    check_len("a", p.seq_elems(), a.len())?;
    check_len("u", p.seq_elems(), u.len())?;
    check_len("y", p.seq_elems(), y.len())?;
    if p.len == 0 {
        // Nothing to compute, and `par_chunks(0)` would panic.
        return Ok(());
    }

    y.par_chunks_mut(p.len)
        .zip(a.par_chunks(p.len))
        .zip(u.par_chunks(p.len))
        .zip(x0.par_iter())
        .for_each(|(((y_row, a_row), u_row), &init)| scan_row(init, a_row, u_row, y_row));
    Ok(())
}

/// One recurrence, carried in `f32`.
fn scan_row(init: f32, a: &[f32], u: &[f32], y: &mut [f32]) {
    let mut state = init;
    for ((yt, &at), &ut) in y.iter_mut().zip(a).zip(u) {
        // Deliberately not `mul_add`: without a hardware FMA target feature it
        // becomes a slow libm call.
        state = at * state + ut;
        *yt = state;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::test_support::{assert_close, Rng};

    fn params(batch: usize, channels: usize, len: usize) -> ScanParams {
        ScanParams {
            batch,
            channels,
            len,
        }
    }

    /// Runs kernel and reference on the same inputs and compares them within
    /// a rounding-error bound.
    ///
    /// The bound is the reference scan of `|x0|`, `|a|`, `|u|` (the largest
    /// the terms of `y[t]` can add up to) times `max(1e-5, 3 (t+1) eps)`: each
    /// `f32` step adds at most about `2 eps` of that, and step errors are
    /// damped by `|a|` on their way to later steps, so after `t + 1` steps the
    /// error is below `2 (t+1) eps` of the bound.
    fn check_against_reference(p: &ScanParams, x0: &[f32], a: &[f32], u: &[f32]) {
        let mut y = vec![f32::NAN; p.seq_elems()];
        linear_scan_f32(p, x0, a, u, &mut y).unwrap();
        let want = reference::linear_scan_f32(p, x0, a, u).unwrap();
        let abs = |v: &[f32]| v.iter().map(|e| e.abs()).collect::<Vec<_>>();
        let bound = reference::linear_scan_f32(p, &abs(x0), &abs(a), &abs(u)).unwrap();
        let tol: Vec<f32> = bound
            .iter()
            .enumerate()
            .map(|(idx, &b)| {
                let steps = (idx % p.len + 1) as f32;
                b * f32::max(1e-5, 3.0 * steps * f32::EPSILON)
            })
            .collect();
        assert_close(&y, &want, &tol, &format!("{p:?}"));
    }

    #[test]
    fn matches_reference_on_random_inputs() {
        let mut rng = Rng::new(7);
        for (batch, channels, len) in [(1, 1, 1), (1, 3, 2), (2, 5, 17), (3, 4, 64), (2, 1, 300)] {
            let p = params(batch, channels, len);
            let x0 = rng.vec(p.state_elems(), -1.0, 1.0);
            let a = rng.vec(p.seq_elems(), -1.0, 1.0);
            let u = rng.vec(p.seq_elems(), -1.0, 1.0);
            check_against_reference(&p, &x0, &a, &u);
        }
    }

    #[test]
    fn long_sequences_with_a_near_one() {
        let mut rng = Rng::new(11);
        let p = params(2, 3, 20_000);
        let x0 = rng.vec(p.state_elems(), -1.0, 1.0);
        let u = rng.vec(p.seq_elems(), -1.0, 1.0);
        // Slow decay, slow alternation, and exactly 1 (a running sum).
        for (lo, hi) in [(0.999, 1.0), (-1.0, -0.999), (1.0, 1.0)] {
            let a = rng.vec(p.seq_elems(), lo, hi);
            check_against_reference(&p, &x0, &a, &u);
        }
    }

    #[test]
    fn len_one_is_a_single_step() {
        let p = params(1, 2, 1);
        let mut y = [0.0; 2];
        linear_scan_f32(&p, &[2.0, 3.0], &[0.5, -1.0], &[1.0, 1.0], &mut y).unwrap();
        assert_eq!(y, [2.0, -2.0]);
    }

    #[test]
    fn zero_a_passes_u_through() {
        let p = params(1, 1, 4);
        let u = [1.0, -2.0, 3.0, -4.0];
        let mut y = [0.0; 4];
        linear_scan_f32(&p, &[100.0], &[0.0; 4], &u, &mut y).unwrap();
        assert_eq!(y, u);
    }

    #[test]
    fn empty_shapes_are_no_ops() {
        // len = 0: x0 still has one value per row, everything else is empty.
        let mut y: [f32; 0] = [];
        assert_eq!(
            linear_scan_f32(&params(2, 3, 0), &[1.0; 6], &[], &[], &mut y),
            Ok(())
        );
        assert_eq!(
            linear_scan_f32(&params(0, 3, 5), &[], &[], &[], &mut y),
            Ok(())
        );
        assert_eq!(
            linear_scan_f32(&params(2, 0, 5), &[], &[], &[], &mut y),
            Ok(())
        );
        assert_eq!(params(usize::MAX, 2, 0).seq_elems(), 0);
        assert_eq!(params(0, usize::MAX, usize::MAX).validate(), Ok(()));
    }

    #[test]
    fn wrong_buffer_lengths_are_errors() {
        // Expected lengths: x0 2, a, u and y 6.
        let p = params(1, 2, 3);
        let (x0, a, u) = ([0.0; 3], [0.0; 7], [0.0; 7]);
        let mut y = [7.0; 7];
        let err = |which, expected, actual| {
            Err(KernelError::BufferLen {
                which,
                expected,
                actual,
            })
        };
        let mut run = |x0_len, a_len, u_len, y_len| {
            linear_scan_f32(&p, &x0[..x0_len], &a[..a_len], &u[..u_len], &mut y[..y_len])
        };
        assert_eq!(run(1, 6, 6, 6), err("x0", 2, 1));
        assert_eq!(run(3, 6, 6, 6), err("x0", 2, 3));
        assert_eq!(run(2, 5, 6, 6), err("a", 6, 5));
        assert_eq!(run(2, 6, 7, 6), err("u", 6, 7));
        assert_eq!(run(2, 6, 6, 7), err("y", 6, 7));
        assert_eq!(run(2, 6, 6, 0), err("y", 6, 0));
        // Nothing was written before the errors.
        assert_eq!(y, [7.0; 7]);
    }

    #[test]
    fn overflowing_shape_is_an_error() {
        let p = params(usize::MAX, 2, 1);
        assert_eq!(
            linear_scan_f32(&p, &[], &[], &[], &mut []),
            Err(KernelError::Overflow {
                what: "scan state element count"
            })
        );
        let p = params(usize::MAX / 2, 2, 3);
        assert_eq!(
            p.validate(),
            Err(KernelError::Overflow {
                what: "scan sequence element count"
            })
        );
    }

    #[test]
    fn result_does_not_depend_on_pool_size() {
        let mut rng = Rng::new(3);
        let p = params(3, 7, 50);
        let x0 = rng.vec(p.state_elems(), -1.0, 1.0);
        let a = rng.vec(p.seq_elems(), -1.0, 1.0);
        let u = rng.vec(p.seq_elems(), -1.0, 1.0);
        let run = |threads| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut y = vec![0.0; p.seq_elems()];
            pool.install(|| linear_scan_f32(&p, &x0, &a, &u, &mut y))
                .unwrap();
            y
        };
        let single = run(1);
        for threads in [2, 3] {
            assert_eq!(run(threads), single, "{threads} threads");
        }
    }
}
