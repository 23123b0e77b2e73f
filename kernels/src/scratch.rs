//! Per-thread scratch memory, sized once (at plan time) and handed to kernel
//! tasks without allocation: FFT buffers, packed panels, converted rows.

#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// One slot of `per_thread` `f32`s for each thread of a rayon pool of
/// `threads` threads, plus one for a caller outside any pool.
///
/// A task asks for its thread's slot with [`Scratch::with_slot`]. A slot is
/// marked busy while lent, so a second borrow of the same slot (a task that
/// re-enters rayon and gets another task scheduled on its thread, or two
/// callers outside the pool) panics instead of aliasing memory.
pub struct Scratch {
    slots: Box<[Slot]>,
    per_thread: usize,
}

struct Slot {
    busy: AtomicBool,
    data: UnsafeCell<Box<[f32]>>,
}

// SAFETY: a slot's data is only reached through `with_slot`, which hands out
// at most one `&mut` at a time per slot (guarded by `busy`).
unsafe impl Sync for Scratch {}

impl Default for Scratch {
    fn default() -> Self {
        Scratch::new(0, 0)
    }
}

impl Scratch {
    /// Slots for a pool of `threads` threads (plus the caller), `per_thread` elements each.
    pub fn new(threads: usize, per_thread: usize) -> Self {
        let slots = (0..threads + 1)
            .map(|_| Slot {
                busy: AtomicBool::new(false),
                data: UnsafeCell::new(vec![0.0; per_thread].into_boxed_slice()),
            })
            .collect();
        Scratch { slots, per_thread }
    }

    /// Grows (never shrinks) to `threads` pool threads of `per_thread`
    /// elements each; allocates only when it grows.
    pub fn reserve(&mut self, threads: usize, per_thread: usize) {
        if threads + 1 > self.slots.len() || per_thread > self.per_thread {
            *self = Scratch::new(
                threads.max(self.slots.len() - 1),
                per_thread.max(self.per_thread),
            );
        }
    }

    /// Elements in each slot.
    pub fn per_thread(&self) -> usize {
        self.per_thread
    }

    /// Runs `f` with the calling thread's slot: its index in the current
    /// rayon pool, or the extra slot outside any pool.
    ///
    /// # Panics
    /// If the pool has more threads than the scratch was sized for, or the
    /// slot is already lent (see the type's docs). Kernels call this only in
    /// leaf tasks that do not call back into rayon.
    pub fn with_slot<R>(&self, f: impl FnOnce(&mut [f32]) -> R) -> R {
        let index = rayon::current_thread_index().unwrap_or(self.slots.len() - 1);
        let slot = self.slots.get(index).unwrap_or_else(|| {
            panic!(
                "scratch sized for {} threads, used by thread {index}",
                self.slots.len() - 1
            )
        });
        assert!(
            !slot.busy.swap(true, Ordering::Acquire),
            "scratch slot {index} borrowed twice"
        );
        struct Release<'a>(&'a AtomicBool);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _release = Release(&slot.busy);
        // SAFETY: `busy` was false and is now true until `_release` drops, so
        // this is the only reference to the slot's data.
        let data = unsafe { &mut *slot.data.get() };
        f(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    #[test]
    fn each_pool_thread_gets_its_own_slot() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let scratch = Scratch::new(3, 16);
        pool.install(|| {
            (0..64).into_par_iter().for_each(|i| {
                scratch.with_slot(|s| {
                    s.fill(i as f32);
                    std::thread::yield_now();
                    assert!(
                        s.iter().all(|&v| v == i as f32),
                        "slot shared between tasks"
                    );
                })
            })
        });
        // Outside any pool: the extra slot.
        assert_eq!(scratch.with_slot(|s| s.len()), 16);
    }

    #[test]
    #[should_panic(expected = "borrowed twice")]
    fn nested_borrow_panics_instead_of_aliasing() {
        let scratch = Scratch::new(1, 4);
        scratch.with_slot(|_| scratch.with_slot(|_| ()));
    }

    #[test]
    #[should_panic(expected = "sized for 1 threads")]
    fn too_many_threads_panics() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        let scratch = Scratch::new(1, 4);
        // broadcast runs on every thread, including those past the slots.
        pool.broadcast(|_| scratch.with_slot(|_| ()));
    }

    #[test]
    fn reserve_grows_only() {
        let mut scratch = Scratch::new(2, 8);
        scratch.reserve(1, 4);
        assert_eq!((scratch.slots.len(), scratch.per_thread()), (3, 8));
        scratch.reserve(4, 32);
        assert_eq!((scratch.slots.len(), scratch.per_thread()), (5, 32));
    }
}
