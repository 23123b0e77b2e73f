//! Where the kernels' parallel loops run: the one place they reach threads.
//!
//! A kernel splits its work into numbered tasks and calls [`for_each`] (or
//! [`for_each_chunk_mut`] for disjoint pieces of an output); the *current
//! pool* runs them. A host picks the pool with [`install`]: the delegate
//! installs ExecuTorch's own threadpool, the pthreadpool that XNNPACK and
//! the optimized CPU kernels run on, so a program's delegates share one set
//! of threads instead of two sets competing for the same cores. With no
//! pool installed the loops run on the current rayon pool (pick one with
//! `rayon::ThreadPool::install`), which is how the kernels' own tests and
//! benchmarks choose a thread count.
//!
//! # One level of parallelism
//!
//! A loop started from inside a task runs serially on that task's thread:
//! pthreadpool is not re-entrant (a nested `parallelize` on the same pool
//! waits for itself). Kernels therefore flatten nested loops into one index
//! space (`item * blocks + block`) rather than nesting them.
//!
//! # Per-thread scratch
//!
//! A task knows its thread's index in the pool ([`task_thread`]), which
//! [`crate::Scratch`] uses to lend each thread its own slot.
#![allow(unsafe_code)]

use std::cell::Cell;

use rayon::prelude::*;

/// Fewest elements a task of an elementwise or scan loop takes (the fused
/// loops' rows and drains, the statistics passes, the scans' rows): one
/// task grain for all of them, defined here once.
pub(crate) const MIN_TASK_ELEMS: usize = 16 * 1024;

/// A set of threads that runs a loop's tasks.
pub trait Pool: Sync {
    /// How many threads `run` may use, the calling thread included.
    fn threads(&self) -> usize;

    /// Calls `task(thread, i)` exactly once for every `i` in `0..tasks`,
    /// from at most [`Pool::threads`] threads, each passing its own index
    /// `thread < threads()`, and returns when every call has returned.
    /// Calls on the same thread do not overlap.
    fn run(&self, tasks: usize, task: &(dyn Fn(usize, usize) + Sync));
}

/// No threads: every task on the calling thread, in order.
pub struct Serial;

impl Pool for Serial {
    fn threads(&self) -> usize {
        1
    }

    fn run(&self, tasks: usize, task: &(dyn Fn(usize, usize) + Sync)) {
        (0..tasks).for_each(|i| task(0, i));
    }
}

/// The current rayon pool (the default when no pool is installed).
struct Rayon;

impl Pool for Rayon {
    fn threads(&self) -> usize {
        rayon::current_num_threads()
    }

    fn run(&self, tasks: usize, task: &(dyn Fn(usize, usize) + Sync)) {
        (0..tasks).into_par_iter().for_each(|i| {
            // Outside any rayon pool, rayon runs the tasks on its global
            // pool, whose threads have indices too.
            task(rayon::current_thread_index().unwrap_or(0), i)
        });
    }
}

/// The installed pool, its lifetime erased: [`install`] keeps the borrow
/// alive while it is set and restores the previous one after.
type PoolPtr = *const (dyn Pool + 'static);

thread_local! {
    static CURRENT: Cell<Option<PoolPtr>> = const { Cell::new(None) };
    /// The pool thread index of the task running on this thread, if any.
    static IN_TASK: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Runs `f` with `pool` as the current pool of this thread's loops.
pub fn install<R>(pool: &dyn Pool, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<PoolPtr>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.set(self.0);
        }
    }
    // SAFETY: only the lifetime is erased. The pointer is read by
    // `with_current` on this thread while `f` runs, and `Restore` takes it
    // out again before `install` returns or unwinds, so it never outlives
    // the borrow of `pool`.
    let erased: PoolPtr = unsafe { std::mem::transmute::<*const dyn Pool, PoolPtr>(pool) };
    let _restore = Restore(CURRENT.replace(Some(erased)));
    f()
}

fn with_current<R>(f: impl FnOnce(&dyn Pool) -> R) -> R {
    match CURRENT.get() {
        // SAFETY: set by `install`, whose borrow outlives this call (see there).
        Some(pool) => f(unsafe { &*pool }),
        None => f(&Rayon),
    }
}

/// Threads a loop started here would use: 1 inside a task (nested loops
/// are serial), else the current pool's.
pub fn threads() -> usize {
    if IN_TASK.get().is_some() {
        1
    } else {
        with_current(|pool| pool.threads())
    }
}

/// The pool thread index of the task running on this thread, or `None`
/// outside any task (the caller between its loops).
pub fn task_thread() -> Option<usize> {
    IN_TASK.get()
}

/// Calls `f(i)` for every `i` in `0..n`, in parallel on the current pool
/// (serially inside a task, or when `n` is 1).
pub fn for_each(n: usize, f: impl Fn(usize) + Sync) {
    if n == 0 {
        return;
    }
    if IN_TASK.get().is_some() {
        return (0..n).for_each(f);
    }
    with_current(|pool| {
        let threads = pool.threads();
        if n == 1 || threads <= 1 {
            // On the caller, as thread 0 (whose scratch slot is free: no
            // other task runs).
            return in_task(0, || (0..n).for_each(&f));
        }
        // Consecutive indices grouped into at most GROUPS_PER_THREAD tasks
        // per thread: enough to even out uneven tasks, few enough that a
        // loop over thousands of rows does not pay the pool's per-task
        // cost (an atomic and an indirect call) for each.
        let groups = n.min(threads * GROUPS_PER_THREAD);
        pool.run(groups, &|thread, g| {
            in_task(thread, || {
                (g * n / groups..(g + 1) * n / groups).for_each(&f)
            })
        });
    })
}

/// See [`for_each`].
const GROUPS_PER_THREAD: usize = 16;

/// [`for_each`] over tasks of at least `min_len` consecutive indices each:
/// for loops whose single index is too little work to be worth a task.
pub fn for_each_min(n: usize, min_len: usize, f: impl Fn(usize) + Sync) {
    let min_len = min_len.max(1);
    for_each(n.div_ceil(min_len), |task| {
        (task * min_len..n.min((task + 1) * min_len)).for_each(&f)
    });
}

/// Calls `f(i, chunk)` for each `chunk_len`-long piece of `out` (the last
/// may be shorter), in parallel as [`for_each`].
pub fn for_each_chunk_mut<T: Send>(
    out: &mut [T],
    chunk_len: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    for_each_chunk_mut_min(out, chunk_len, 1, f)
}

/// [`for_each_chunk_mut`] with at least `min_len` chunks per task.
pub fn for_each_chunk_mut_min<T: Send>(
    out: &mut [T],
    chunk_len: usize,
    min_len: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    assert!(chunk_len > 0, "chunk length 0");
    let len = out.len();
    let base = SendPtr(out.as_mut_ptr());
    for_each_min(len.div_ceil(chunk_len), min_len, |i| {
        let start = i * chunk_len;
        let n = chunk_len.min(len - start);
        // SAFETY: `for_each_min` calls this once per `i`, and chunk `i` is
        // `out[i * chunk_len..][..n]`: in bounds (`start < len`, `n <= len -
        // start`) and disjoint from every other chunk. `out` is borrowed
        // mutably for the whole loop, which returns only when every task
        // has, so nothing else reads or writes it meanwhile.
        let chunk = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), n) };
        f(i, chunk)
    });
}

/// Calls `f(d, s)` for the matching pieces of [`MIN_TASK_ELEMS`] elements
/// of `dst` and `src` (the last may be shorter), in parallel as
/// [`for_each`]: whole-tensor copies and conversions. A stored tensor a
/// wide pool has just written lies in every core's cache: one thread
/// copying it alone ran slower on 16 threads than on one (a HiFi-GAN's
/// reshapes, 16-core Xeon).
///
/// # Panics
/// If the lengths differ.
pub fn zip_chunks<D: Send, S: Sync>(dst: &mut [D], src: &[S], f: impl Fn(&mut [D], &[S]) + Sync) {
    assert_eq!(
        dst.len(),
        src.len(),
        "pieces of slices of different lengths"
    );
    for_each_chunk_mut(dst, MIN_TASK_ELEMS, |i, d| {
        f(d, &src[i * MIN_TASK_ELEMS..][..d.len()])
    });
}

/// `dst.copy_from_slice(src)` on the current pool ([`zip_chunks`]).
///
/// # Panics
/// If the lengths differ (as `copy_from_slice`).
pub fn copy<T: Copy + Send + Sync>(dst: &mut [T], src: &[T]) {
    zip_chunks(dst, src, |d, s| d.copy_from_slice(s));
}

/// Calls `f(i, j, piece)` for the `j`-th `inner`-long piece (the last of a
/// chunk may be shorter) of each `outer`-long chunk `i` of `out`: the two
/// nested loops of a kernel (rows, then runs of a row) as one loop, so the
/// pool sees every piece even where there is one chunk.
pub fn for_each_chunk_mut_2d<T: Send>(
    out: &mut [T],
    outer: usize,
    inner: usize,
    f: impl Fn(usize, usize, &mut [T]) + Sync,
) {
    assert!(outer > 0 && inner > 0, "chunk length 0");
    let len = out.len();
    let per_chunk = outer.div_ceil(inner);
    let base = SendPtr(out.as_mut_ptr());
    for_each(len.div_ceil(outer) * per_chunk, |task| {
        let (i, j) = (task / per_chunk, task % per_chunk);
        let start = i * outer + j * inner;
        let end = (start + inner).min((i + 1) * outer).min(len);
        if start >= end {
            // Past the end of a short last chunk.
            return;
        }
        // SAFETY: each `task` is run once and names the piece
        // `out[start..end]`, in bounds (`end <= len`) and disjoint from
        // every other task's (pieces tile each chunk, chunks tile `out`).
        // `out` is borrowed mutably until every task has returned.
        let piece = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), end - start) };
        f(i, j, piece)
    });
}

/// Runs `f` as a task on pool thread `thread`.
fn in_task<R>(thread: usize, f: impl FnOnce() -> R) -> R {
    struct Leave(Option<usize>);
    impl Drop for Leave {
        fn drop(&mut self) {
            IN_TASK.set(self.0);
        }
    }
    let _leave = Leave(IN_TASK.replace(Some(thread)));
    f()
}

/// A pointer that tasks on other threads may use; what they do with it is
/// justified where they do it.
struct SendPtr<T>(*mut T);

impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}

// SAFETY: a `SendPtr` is only dereferenced by the tasks of
// `for_each_chunk_mut_min` and `for_each_chunk_mut_2d`, each on its own
// disjoint piece of a `&mut [T]` with `T: Send`.
unsafe impl<T: Send> Send for SendPtr<T> {}
unsafe impl<T: Send> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// A method, so closures capture the whole `SendPtr` (which is `Sync`)
    /// rather than its raw pointer field.
    fn get(self) -> *mut T {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use super::*;

    /// A pool of `n` plain threads, each taking every `n`-th task: what a
    /// host's pool (ExecuTorch's pthreadpool) looks like to the kernels.
    struct Striped(usize);

    impl Pool for Striped {
        fn threads(&self) -> usize {
            self.0
        }
        fn run(&self, tasks: usize, task: &(dyn Fn(usize, usize) + Sync)) {
            std::thread::scope(|s| {
                for t in 0..self.0 {
                    s.spawn(move || (t..tasks).step_by(self.0).for_each(|i| task(t, i)));
                }
            });
        }
    }

    #[test]
    fn every_index_runs_once_on_the_installed_pool() {
        let pool = Striped(3);
        let seen: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
        let used = Mutex::new(HashSet::new());
        install(&pool, || {
            assert_eq!(threads(), 3);
            for_each(100, |i| {
                seen[i].fetch_add(1, Ordering::Relaxed);
                used.lock().unwrap().insert(task_thread().unwrap());
            })
        });
        assert!(seen.iter().all(|n| n.load(Ordering::Relaxed) == 1));
        assert_eq!(used.into_inner().unwrap(), HashSet::from([0, 1, 2]));
        // Uninstalled again: the rayon pool.
        let rayon = rayon::ThreadPoolBuilder::new()
            .num_threads(5)
            .build()
            .unwrap();
        assert_eq!(rayon.install(threads), 5);
    }

    #[test]
    fn loops_inside_tasks_are_serial() {
        let pool = Striped(2);
        install(&pool, || {
            for_each(4, |_| {
                let me = std::thread::current().id();
                assert_eq!(threads(), 1);
                for_each(8, |_| assert_eq!(std::thread::current().id(), me));
            })
        });
    }

    #[test]
    fn chunks_cover_the_output_once() {
        let pool = Striped(4);
        for (len, chunk, min) in [(0, 3, 1), (10, 3, 1), (10, 3, 2), (64, 8, 3), (7, 100, 1)] {
            let mut out = vec![0usize; len];
            install(&pool, || {
                for_each_chunk_mut_min(&mut out, chunk, min, |i, c| {
                    assert!(c.len() == chunk || (i + 1) * chunk >= len);
                    c.iter_mut()
                        .enumerate()
                        .for_each(|(j, v)| *v += i * chunk + j + 1)
                })
            });
            assert_eq!(out, (1..=len).collect::<Vec<_>>());
        }
    }

    #[test]
    fn copies_split_into_tasks_on_the_pool() {
        /// Runs tasks on the caller, recording how many each loop asked for.
        struct Recording(Mutex<Vec<usize>>);
        impl Pool for Recording {
            fn threads(&self) -> usize {
                4
            }
            fn run(&self, tasks: usize, task: &(dyn Fn(usize, usize) + Sync)) {
                self.0.lock().unwrap().push(tasks);
                (0..tasks).for_each(|i| task(i % 4, i));
            }
        }
        for len in [0, 1, MIN_TASK_ELEMS, 2 * MIN_TASK_ELEMS + 5] {
            let src: Vec<u32> = (0..len as u32).collect();
            let mut dst = vec![u32::MAX; len];
            let pool = Recording(Mutex::new(Vec::new()));
            install(&pool, || copy(&mut dst, &src));
            assert_eq!(dst, src);
            let tasks: usize = pool.0.into_inner().unwrap().iter().sum();
            assert_eq!(tasks.max(1), len.div_ceil(MIN_TASK_ELEMS).max(1), "{len}");
        }
    }

    #[test]
    #[should_panic(expected = "different lengths")]
    fn a_copy_between_different_lengths_panics() {
        copy(&mut [0.0f32; 3], &[1.0; 4]);
    }

    #[test]
    fn pieces_of_chunks_cover_the_output_once() {
        let pool = Striped(3);
        for (len, outer, inner) in [(12, 4, 3), (12, 4, 4), (10, 4, 3), (5, 8, 2), (0, 2, 1)] {
            let mut out = vec![0usize; len];
            install(&pool, || {
                for_each_chunk_mut_2d(&mut out, outer, inner, |i, j, c| {
                    assert!(c.len() <= inner);
                    let start = i * outer + j * inner;
                    c.iter_mut()
                        .enumerate()
                        .for_each(|(k, v)| *v += start + k + 1)
                })
            });
            assert_eq!(out, (1..=len).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_one_thread_pool_runs_on_the_caller_as_thread_zero() {
        let me = std::thread::current().id();
        install(&Serial, || {
            for_each(3, |_| {
                assert_eq!(std::thread::current().id(), me);
                assert_eq!(task_thread(), Some(0));
            })
        });
        assert_eq!(task_thread(), None);
    }
}
