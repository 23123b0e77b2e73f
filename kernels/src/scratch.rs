//! Per-thread scratch memory, sized once (at plan time) and handed to kernel
//! tasks without allocation: FFT buffers, packed panels, converted rows;
//! and one region shared by a call's tasks (a layer's weights packed once
//! per call, then read by every tile).

#![allow(unsafe_code)]

use std::alloc::Layout;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::KernelError;

/// One slot of `per_thread` `f32`s for each thread of a rayon pool of
/// `threads` threads, plus one for a caller outside any pool.
///
/// A task asks for its thread's slot with [`Scratch::with_slot`]. A slot is
/// marked busy while lent, so a second borrow of the same slot (a task that
/// re-enters rayon and gets another task scheduled on its thread, or two
/// callers outside the pool) panics instead of aliasing memory. The shared
/// region is lent the same way, to one caller at a time ([`Scratch::with_shared`]).
pub struct Scratch {
    slots: Box<[Slot]>,
    per_thread: usize,
    shared: Slot,
}

/// Every slot (and the shared region) starts on a 64-byte boundary:
/// kernels lay out their regions in whole vectors from the start, and a
/// misaligned base would make every AVX-512 access split two cache lines
/// (3-9% slower `gemm` and `fft_gemm` calls where the allocator returned
/// 16-byte aligned memory).
const ALIGN_FLOATS: usize = 16;

struct Slot {
    busy: AtomicBool,
    /// The length lent, readable while it is lent; the data has
    /// [`ALIGN_FLOATS`] more, to start it on a boundary.
    len: usize,
    data: UnsafeCell<Box<[f32]>>,
}

// SAFETY: a slot's data is only reached through `Slot::lend` (from
// `with_slot` and `with_shared`), which hands out at most one `&mut` at a
// time per slot (guarded by `busy`).
unsafe impl Sync for Scratch {}

/// `n` zeroed `f32`s, or [`KernelError::OutOfMemory`] where the allocator
/// has none to give: sizes come from a plan, and so from a blob, which may
/// ask for terabytes (`vec!` would abort the process). Zeroed by the
/// allocator, as `vec![0.0; n]` is: pages a kernel never touches are never
/// made resident.
pub(crate) fn zeroed_floats(n: usize, what: &'static str) -> Result<Box<[f32]>, KernelError> {
    let too_large = || KernelError::OutOfMemory { what, elements: n };
    if n == 0 {
        return Ok(Box::default());
    }
    let layout = Layout::array::<f32>(n).map_err(|_| too_large())?;
    // SAFETY: `layout` has a non-zero size (`n > 0`).
    let data = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<f32>();
    if data.is_null() {
        return Err(too_large());
    }
    // SAFETY: `data` is a fresh allocation of `layout`, `n` f32s (all bits
    // zero is 0.0), owned by nothing else; a `Box<[f32]>` of `n` frees it
    // with that same layout (`Layout::for_value` of `[f32; n]`).
    Ok(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(data, n)) })
}

impl Slot {
    fn new(len: usize) -> Result<Self, KernelError> {
        let total = len
            .checked_add(ALIGN_FLOATS)
            .ok_or(KernelError::Overflow { what: "scratch" })?;
        Ok(Slot {
            busy: AtomicBool::new(false),
            len,
            data: UnsafeCell::new(zeroed_floats(total, "scratch")?),
        })
    }

    /// Runs `f` with the slot's data; panics with `what` if it is lent.
    fn lend<R>(&self, what: &dyn std::fmt::Display, f: impl FnOnce(&mut [f32]) -> R) -> R {
        assert!(
            !self.busy.swap(true, Ordering::Acquire),
            "scratch {what} borrowed twice"
        );
        struct Release<'a>(&'a AtomicBool);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _release = Release(&self.busy);
        // SAFETY: `busy` was false and is now true until `_release` drops, so
        // this is the only reference to the slot's data.
        let data = unsafe { &mut *self.data.get() };
        // An f32 pointer is 4-byte aligned, so at most 15 values are skipped.
        let skip = data.as_ptr().align_offset(ALIGN_FLOATS * 4);
        f(&mut data[skip..skip + self.len])
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch::new(0, 0)
    }
}

impl Scratch {
    /// Slots for a pool of `threads` threads (plus the caller), `per_thread`
    /// elements each, and no shared region.
    ///
    /// # Panics
    /// If the memory cannot be had: for sizes a kernel chose itself (tests,
    /// small fixed sizes). Sizes from a plan go through [`Scratch::try_sized`].
    pub fn new(threads: usize, per_thread: usize) -> Self {
        Self::sized(threads, per_thread, 0)
    }

    /// As [`Scratch::new`], with a shared region of `shared` elements.
    ///
    /// # Panics
    /// As [`Scratch::new`].
    pub fn sized(threads: usize, per_thread: usize, shared: usize) -> Self {
        Self::try_sized(threads, per_thread, shared).expect("scratch allocated")
    }

    /// As [`Scratch::sized`], or [`KernelError::OutOfMemory`] where the
    /// memory cannot be had.
    pub fn try_sized(
        threads: usize,
        per_thread: usize,
        shared: usize,
    ) -> Result<Self, KernelError> {
        let slots = (0..threads.saturating_add(1))
            .map(|_| Slot::new(per_thread))
            .collect::<Result<_, _>>()?;
        Ok(Scratch {
            slots,
            per_thread,
            shared: Slot::new(shared)?,
        })
    }

    /// Grows (never shrinks) to `threads` pool threads of `per_thread`
    /// elements each and a shared region of `shared`; allocates only when
    /// it grows. Where that memory cannot be had, it is left as it was.
    pub fn reserve(
        &mut self,
        threads: usize,
        per_thread: usize,
        shared: usize,
    ) -> Result<(), KernelError> {
        if threads.saturating_add(1) > self.slots.len()
            || per_thread > self.per_thread
            || shared > self.shared_len()
        {
            *self = Scratch::try_sized(
                threads.max(self.slots.len() - 1),
                per_thread.max(self.per_thread),
                shared.max(self.shared_len()),
            )?;
        }
        Ok(())
    }

    /// Elements in each slot.
    pub fn per_thread(&self) -> usize {
        self.per_thread
    }

    /// Elements in the shared region.
    pub fn shared_len(&self) -> usize {
        self.shared.len
    }

    /// Runs `f` with the shared region. A kernel fills it (splitting it
    /// among its tasks) and then lets its tasks read it, all inside `f`.
    ///
    /// # Panics
    /// If the region is already lent: kernels take it only around their
    /// own tasks, never from inside one.
    pub fn with_shared<R>(&self, f: impl FnOnce(&mut [f32]) -> R) -> R {
        self.shared.lend(&"shared region", f)
    }

    /// Runs `f` with the calling thread's slot: its index in the pool
    /// running the current task ([`crate::par::task_thread`]), or the extra
    /// slot outside any task.
    ///
    /// # Panics
    /// If the pool has more threads than the scratch was sized for, or the
    /// slot is already lent (see the type's docs). Kernels call this only in
    /// leaf tasks, which start no loops of their own.
    pub fn with_slot<R>(&self, f: impl FnOnce(&mut [f32]) -> R) -> R {
        let index = crate::par::task_thread().unwrap_or(self.slots.len() - 1);
        let slot = self.slots.get(index).unwrap_or_else(|| {
            panic!(
                "scratch sized for {} threads, used by thread {index}",
                self.slots.len() - 1
            )
        });
        slot.lend(&format_args!("slot {index}"), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pool_thread_gets_its_own_slot() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let scratch = Scratch::new(3, 16);
        pool.install(|| {
            crate::par::for_each(64, |i| {
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
        // Outside any task: the extra slot.
        assert_eq!(scratch.with_slot(|s| s.len()), 16);
    }

    #[test]
    fn slots_start_on_64_byte_boundaries() {
        for len in [1, 7, 1000, 1 << 20] {
            let scratch = Scratch::sized(1, len, len);
            let starts = [
                scratch.with_slot(|s| (s.as_ptr() as usize, s.len())),
                scratch.with_shared(|s| (s.as_ptr() as usize, s.len())),
            ];
            for (start, lent) in starts {
                assert_eq!((start % 64, lent), (0, len));
            }
        }
    }

    #[test]
    #[should_panic(expected = "borrowed twice")]
    fn nested_borrow_panics_instead_of_aliasing() {
        let scratch = Scratch::new(1, 4);
        scratch.with_slot(|_| scratch.with_slot(|_| ()));
    }

    #[test]
    #[should_panic(expected = "sized for 1 threads, used by thread 3")]
    fn too_many_threads_panics() {
        /// A pool whose tasks all claim to run on its fourth thread.
        struct Fourth;
        impl crate::par::Pool for Fourth {
            fn threads(&self) -> usize {
                4
            }
            fn run(&self, tasks: usize, task: &(dyn Fn(usize, usize) + Sync)) {
                (0..tasks).for_each(|i| task(3, i))
            }
        }
        let scratch = Scratch::new(1, 4);
        crate::par::install(&Fourth, || {
            crate::par::for_each(2, |_| scratch.with_slot(|_| ()))
        });
    }

    #[test]
    fn reserve_grows_only() {
        let mut scratch = Scratch::sized(2, 8, 6);
        scratch.reserve(1, 4, 2).unwrap();
        assert_eq!(
            (
                scratch.slots.len(),
                scratch.per_thread(),
                scratch.shared_len()
            ),
            (3, 8, 6)
        );
        scratch.reserve(4, 32, 0).unwrap();
        assert_eq!(
            (
                scratch.slots.len(),
                scratch.per_thread(),
                scratch.shared_len()
            ),
            (5, 32, 6)
        );
        scratch.reserve(1, 4, 100).unwrap();
        assert_eq!(
            (
                scratch.slots.len(),
                scratch.per_thread(),
                scratch.shared_len()
            ),
            (5, 32, 100)
        );
    }

    #[test]
    fn shared_region_is_written_once_and_read_by_every_task() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let scratch = Scratch::sized(3, 4, 64);
        let sum: f32 = pool.install(|| {
            scratch.with_shared(|shared| {
                crate::par::for_each_chunk_mut(shared, 8, |i, c| c.fill(i as f32));
                let shared = &*shared;
                let sum = std::sync::Mutex::new(0.0);
                crate::par::for_each(64, |i| {
                    let v = scratch.with_slot(|_| shared[i]);
                    *sum.lock().unwrap() += v;
                });
                sum.into_inner().unwrap()
            })
        });
        assert_eq!(sum, 8.0 * (0..8).sum::<i32>() as f32);
    }

    #[test]
    #[should_panic(expected = "shared region borrowed twice")]
    fn nested_shared_borrow_panics_instead_of_aliasing() {
        let scratch = Scratch::sized(1, 4, 4);
        scratch.with_shared(|_| scratch.with_shared(|_| ()));
    }

    #[test]
    fn scratch_that_cannot_be_had_is_an_error_and_leaves_it_as_it_was() {
        let mut scratch = Scratch::sized(1, 8, 8);
        // Fuzzed blobs asked for 1.5 and 6.2 TiB: here 4 PiB (past any
        // process's address space, so the allocator refuses it whatever the
        // overcommit policy), more than `Layout::array` takes, and an
        // overflow.
        for per_thread in [1 << 50, usize::MAX / 8, usize::MAX] {
            let err = scratch.reserve(1, per_thread, 0).unwrap_err();
            assert!(
                matches!(
                    err,
                    KernelError::OutOfMemory {
                        what: "scratch",
                        ..
                    } | KernelError::Overflow { what: "scratch" }
                ),
                "{err:?}"
            );
            assert_eq!((scratch.per_thread(), scratch.shared_len()), (8, 8));
        }
        // What is lent is the allocator's zeroed memory, whole.
        scratch.reserve(2, 1 << 16, 0).unwrap();
        assert!(scratch.with_slot(|s| s.len() == 1 << 16 && s.iter().all(|&v| v == 0.0)));
        assert!(zeroed_floats(0, "nothing").unwrap().is_empty());
    }
}
