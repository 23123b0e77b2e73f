//! Shape generations: what a kernel call derives from shapes alone is
//! derived once per set of shapes, not once per call.
//!
//! A host that runs programs call after call numbers each set of shapes it
//! binds with a [`ShapeGeneration`] (a new one whenever any shape changes)
//! and reports it through [`Env::generation`](super::Env::generation). A
//! [`ShapeMemo`] keeps one answer computed under a generation; a later call
//! of the same generation reads it instead of walking the program's views
//! again. The numbers are unique in the process, so two hosts sharing a
//! compiled program never read each other's answers.

use std::sync::atomic::{AtomicU64, Ordering};

/// The last generation handed out; 0 is never one (an empty memo).
static LAST: AtomicU64 = AtomicU64::new(0);

/// A number for one set of shapes, unique in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShapeGeneration(u64);

impl ShapeGeneration {
    /// A generation no one has used.
    pub fn fresh() -> Self {
        ShapeGeneration(LAST.fetch_add(1, Ordering::Relaxed) + 1)
    }
}

/// A flag derived from a call's shapes, kept for the generation it was
/// computed under: the generation and the flag packed in one atomic word,
/// so the pool's threads and concurrent hosts read and write it without a
/// lock. Every thread computing it under one generation computes the same
/// flag, so a race only computes it twice.
#[derive(Default)]
pub(crate) struct ShapeMemo(AtomicU64);

impl ShapeMemo {
    /// The flag under `generation` (computed by `compute` unless kept from
    /// an earlier call of the same generation); without a generation,
    /// computed every time.
    pub(crate) fn get(
        &self,
        generation: Option<ShapeGeneration>,
        compute: impl FnOnce() -> bool,
    ) -> bool {
        let Some(ShapeGeneration(g)) = generation else {
            return compute();
        };
        let kept = self.0.load(Ordering::Relaxed);
        if kept >> 1 == g {
            return kept & 1 == 1;
        }
        let flag = compute();
        // Generations stay below 2^63: one a nanosecond would take 292 years.
        self.0.store(g << 1 | u64::from(flag), Ordering::Relaxed);
        flag
    }
}

/// A memo is a cache: a copy starts empty, and it plays no part in
/// comparisons or debug output of what holds it.
impl Clone for ShapeMemo {
    fn clone(&self) -> Self {
        ShapeMemo::default()
    }
}

impl PartialEq for ShapeMemo {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for ShapeMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShapeMemo")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memo_computes_once_per_generation() {
        let memo = ShapeMemo::default();
        let (a, b) = (ShapeGeneration::fresh(), ShapeGeneration::fresh());
        assert_ne!(a, b);
        let mut calls = 0;
        let mut ask = |g, flag| {
            memo.get(g, || {
                calls += 1;
                flag
            })
        };
        assert!(ask(Some(a), true));
        assert!(ask(Some(a), false), "kept from generation a");
        assert!(!ask(Some(b), false), "a new generation recomputes");
        assert!(!ask(Some(b), true));
        assert!(ask(None, true), "no generation: always computed");
        assert!(!ask(None, false));
        assert_eq!(calls, 4);
    }
}
