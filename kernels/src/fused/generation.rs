//! Shape generations: what a kernel call derives from shapes alone is
//! derived once per set of shapes, not once per call.
//!
//! A host that runs programs call after call numbers each set of shapes it
//! binds with a [`ShapeGeneration`] (a new one whenever any shape changes)
//! and reports it through [`Env::generation`](super::Env::generation). A
//! [`ShapeMemo`] keeps one answer computed under a generation, a
//! [`ShapeCache`] one value; a later call of the same generation reads it
//! instead of walking the program's views again. The numbers are unique in
//! the process, so two hosts sharing a compiled program never read each
//! other's answers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, TryLockError};

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

/// A value derived from a call's shapes (the leaves' geometries of a
/// program's recipes, `compiled.rs`), kept with the generation it was
/// derived under. Too large for one atomic word, it sits behind a lock
/// that no call waits for: a call that finds it taken (another thread
/// binding the same program) derives its own, as a call without a
/// generation does. The generation is compared and the value read under
/// the lock, so a call never reads another generation's value. The lock
/// allocates nothing (a futex), so neither does a call.
pub(crate) struct ShapeCache<T>(Mutex<Option<(ShapeGeneration, T)>>);

impl<T> ShapeCache<T> {
    /// `read` of the value under `generation`: the one kept from an
    /// earlier call of the same generation, else `derive`d (and kept, where
    /// the lock is free); without a generation, derived every time.
    pub(crate) fn read<R>(
        &self,
        generation: Option<ShapeGeneration>,
        derive: impl FnOnce() -> T,
        read: impl FnOnce(&T) -> R,
    ) -> R {
        let Some(generation) = generation else {
            return read(&derive());
        };
        let mut kept = match self.0.try_lock() {
            Ok(kept) => kept,
            // A call panicked holding it (an env's `data` asserting): the
            // value is only replaced whole, once derived, so it still
            // belongs to the generation beside it.
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return read(&derive()),
        };
        if let Some((g, value)) = &*kept {
            if *g == generation {
                return read(value);
            }
        }
        let (_, value) = kept.insert((generation, derive()));
        read(value)
    }
}

/// Empty at first, and as [`ShapeMemo`] a cache: a copy starts empty, and
/// it plays no part in comparisons or debug output.
impl<T> Default for ShapeCache<T> {
    fn default() -> Self {
        ShapeCache(Mutex::new(None))
    }
}

impl<T> Clone for ShapeCache<T> {
    fn clone(&self) -> Self {
        ShapeCache::default()
    }
}

impl<T> PartialEq for ShapeCache<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl<T> std::fmt::Debug for ShapeCache<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShapeCache")
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

    #[test]
    fn a_cache_derives_once_per_generation() {
        let cache = ShapeCache::default();
        let (a, b) = (ShapeGeneration::fresh(), ShapeGeneration::fresh());
        let mut derived = 0;
        let mut ask = |g, value: u32| {
            cache.read(
                g,
                || {
                    derived += 1;
                    value
                },
                |&v| v,
            )
        };
        assert_eq!(ask(Some(a), 1), 1);
        assert_eq!(ask(Some(a), 2), 1, "kept from generation a");
        assert_eq!(ask(Some(b), 3), 3, "a new generation derives again");
        assert_eq!(ask(Some(b), 4), 3);
        assert_eq!(ask(None, 5), 5, "no generation: always derived");
        assert_eq!(ask(Some(b), 6), 3, "and nothing kept from it");
        assert_eq!(ask(Some(a), 7), 7, "one generation kept: a is gone");
        assert_eq!(derived, 4);
    }

    /// A call that finds the cache taken derives its own value and keeps
    /// nothing; one that panicked holding it leaves the kept value usable.
    #[test]
    fn a_taken_cache_is_derived_around_and_a_poisoned_one_still_read() {
        let cache = ShapeCache::default();
        let g = ShapeGeneration::fresh();
        assert_eq!(cache.read(Some(g), || 1, |&v| v), 1);
        let nested = cache.read(Some(g), || 2, |_| cache.read(Some(g), || 3, |&v| v));
        assert_eq!(nested, 3, "derived beside the holder");
        assert_eq!(cache.read(Some(g), || 4, |&v| v), 1, "still kept");
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            cache.read(Some(g), || 5, |_| panic!("an env's data asserting"))
        }));
        assert!(panicked.is_err());
        assert_eq!(cache.read(Some(g), || 6, |&v| v), 1, "read after a panic");
    }
}
