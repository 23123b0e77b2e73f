//! How many threads the kernels use, and which threads they are.
//!
//! Precedence of the count, highest first: the runtime option
//! (`set_option("num_threads")`, which `pte_runner -num_threads` uses), the
//! `RUSTCONV_NUM_THREADS` environment variable, the `num_threads` compile
//! spec, the size of ExecuTorch's threadpool, the machine's cores. A count asked
//! for is at most [`max_threads`] (8 per core).
//!
//! # ExecuTorch's threadpool, shared
//!
//! A process running ExecuTorch has one threadpool (a pthreadpool, from
//! `libexecutorch_threadpool`) on which XNNPACK and the optimized CPU
//! kernels run. When it has the thread count a call wants, the kernels run
//! their loops on it ([`ExecutorchPool`], installed as the kernels' current
//! pool): a program's delegates then take turns on the same threads.
//! Two pools would not: after each of its calls, pthreadpool's workers spin
//! for a while waiting for the next, on the cores our own workers need, and
//! ours do the same to XNNPACK's next call. On a 2-core machine with one
//! core busy elsewhere, that made our calls in ExecuTorch's LFM2 recipe 4.5
//! times as slow as on the shared pool (`bench/interference.py`, README).
//! `RUSTCONV_THREADPOOL=own` keeps the kernels on pools of their own, as
//! they were before.
//!
//! # Our own pools, where ExecuTorch's does not fit
//!
//! For another thread count than ExecuTorch's pool has (or a host without
//! one) the kernels run on a rayon pool of ours. A rayon pool's `install`,
//! called from outside the pool, hands the work to a sleeping worker and
//! blocks until it is done: two thread wake-ups, about 13 µs on the 2-core
//! EPYC this was measured on, which is most of a small call (C = 512,
//! N = 64, K = 4 computes in 11 µs). So, as pthreadpool does, the thread
//! that calls into the delegate is itself one of the pool's threads
//! (rayon's `use_current_thread`, index 0): `install` then runs on it at
//! once and the other `threads - 1` workers steal from it. Pools therefore
//! belong to a calling thread (one per thread count; a thread can be a
//! member of only one pool, so a second thread count on the same thread
//! gets an ordinary pool of `threads` workers). A host that runs methods
//! from several threads at once gets a pool per thread, and with it
//! `threads - 1` workers each: set the thread count accordingly.
#![allow(unsafe_code)]

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use rayon::ThreadPool;
use rustconv_kernels::par::{self, Pool as _};

use crate::error::ConfigError;

pub const ENV_VAR: &str = "RUSTCONV_NUM_THREADS";
pub const POOL_ENV_VAR: &str = "RUSTCONV_THREADPOOL";

/// 0 when unset.
static RUNTIME_THREADS: AtomicUsize = AtomicUsize::new(0);

/// Threads per core beyond which a count is refused (the runtime option,
/// the environment) or lowered (a program's compile spec).
pub const MAX_THREADS_PER_CORE: usize = 8;

/// The most threads a call runs on: 8 per core. More only slows the
/// kernels, and a count in the tens of thousands (rayon starts up to 65535)
/// takes minutes and gigabytes to start, or fails to.
pub fn max_threads() -> usize {
    machine_threads().saturating_mul(MAX_THREADS_PER_CORE)
}

pub fn set_runtime_threads(n: i32) -> Result<(), ConfigError> {
    let max = max_threads();
    if n < 1 || n as usize > max {
        return Err(ConfigError::NumThreads { got: n.into(), max });
    }
    RUNTIME_THREADS.store(n as usize, Ordering::Relaxed);
    Ok(())
}

/// The environment is read once: `execute` must not allocate, and reading a
/// variable does.
fn env_threads() -> Result<Option<usize>, ConfigError> {
    static ENV: OnceLock<Result<Option<usize>, String>> = OnceLock::new();
    ENV.get_or_init(|| match std::env::var(ENV_VAR) {
        Err(_) => Ok(None),
        Ok(s) => match s.trim().parse::<usize>() {
            Ok(n) if (1..=max_threads()).contains(&n) => Ok(Some(n)),
            _ => Err(s),
        },
    })
    .clone()
    .map_err(ConfigError::EnvThreads)
}

/// The thread count set by the runtime option, the environment or the
/// compile spec, in that order; `None` when none is set.
fn requested(compile_spec: Option<usize>) -> Result<Option<usize>, ConfigError> {
    match RUNTIME_THREADS.load(Ordering::Relaxed) {
        0 => {}
        n => return Ok(Some(n)),
    }
    Ok(env_threads()?.or(compile_spec.map(spec_threads)))
}

/// A compile spec's count, lowered to [`max_threads`]: the program was
/// exported for some machine, maybe one with more cores than this, and is
/// not to be refused for it; nor is its count, which the program's bytes
/// set, to start more threads than this machine has use for.
fn spec_threads(n: usize) -> usize {
    n.min(max_threads())
}

/// Whether `RUSTCONV_THREADPOOL=own` keeps the kernels off ExecuTorch's
/// threadpool. Read once, as [`env_threads`].
fn own_pools_only() -> Result<bool, ConfigError> {
    static OWN: OnceLock<Result<bool, String>> = OnceLock::new();
    OWN.get_or_init(|| match std::env::var(POOL_ENV_VAR) {
        Err(_) => Ok(false),
        Ok(s) => match s.trim() {
            "executorch" => Ok(false),
            "own" => Ok(true),
            _ => Err(s),
        },
    })
    .clone()
    .map_err(ConfigError::EnvThreadpool)
}

/// Where a call's kernels run.
pub enum Workers {
    /// One thread: the caller's.
    Caller,
    /// ExecuTorch's threadpool, shared with XNNPACK and the CPU kernels.
    Executorch(ExecutorchPool),
    /// A rayon pool of ours, of this many threads.
    Own(usize),
}

impl Workers {
    /// The workers for a call now, given the delegate's compile spec.
    /// Allocates nothing (the environment is read once).
    pub fn choose(compile_spec: Option<usize>) -> Result<Workers, ConfigError> {
        let executorch = if own_pools_only()? {
            None
        } else {
            ExecutorchPool::get()
        };
        Ok(Workers::pick(requested(compile_spec)?, executorch))
    }

    /// ExecuTorch's pool where it has the count asked for (its own when
    /// none is), else the caller alone or a pool of ours.
    fn pick(requested: Option<usize>, executorch: Option<ExecutorchPool>) -> Workers {
        let threads = match requested {
            Some(n) => n,
            None => executorch
                .as_ref()
                .map_or_else(machine_threads, |pool| pool.threads),
        };
        match executorch {
            _ if threads == 1 => Workers::Caller,
            Some(pool) if pool.threads == threads => Workers::Executorch(pool),
            _ => Workers::Own(threads),
        }
    }

    pub fn threads(&self) -> usize {
        match self {
            Workers::Caller => 1,
            Workers::Executorch(pool) => pool.threads(),
            Workers::Own(threads) => *threads,
        }
    }

    /// Runs `f` with these workers as the kernels' pool. The first call for
    /// an [`Workers::Own`] count on a thread builds its pool (allocating);
    /// later ones reuse it.
    pub fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R, ConfigError> {
        Ok(match self {
            Workers::Caller => par::install(&par::Serial, f),
            Workers::Executorch(pool) => par::install(pool, f),
            Workers::Own(threads) => pool(*threads)?.install(f),
        })
    }
}

/// The machine's cores, read once: `available_parallelism` reads cgroup
/// files and allocates, and `execute` must not.
fn machine_threads() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Names of the threads pools spawn (the calling thread keeps its own).
const WORKER_PREFIX: &str = "rustconv-";

/// Whether the current thread is a pool worker rather than the thread that
/// called into the delegate: one our pools spawned, or one running a task
/// of ExecuTorch's pool other than its caller (thread 0).
pub fn is_worker() -> bool {
    par::task_thread().is_some_and(|t| t > 0)
        || std::thread::current()
            .name()
            .is_some_and(|name| name.starts_with(WORKER_PREFIX))
}

/// Our pool of `threads` threads for the calling thread (see the module
/// docs). Builds it on first use; later calls return the same pool.
pub(crate) fn pool(threads: usize) -> Result<Arc<ThreadPool>, ConfigError> {
    thread_local! {
        static POOLS: RefCell<HashMap<usize, Arc<ThreadPool>>> = RefCell::default();
    }
    if let Some(pool) = POOLS.with_borrow(|pools| pools.get(&threads).cloned()) {
        return Ok(pool);
    }
    let builder = || {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("{WORKER_PREFIX}{i}"))
    };
    // Fails when this thread is already a member of a pool (ours, for
    // another thread count, or the host's own rayon pool).
    let pool = match builder().use_current_thread().build() {
        Ok(pool) => pool,
        Err(_) => builder()
            .build()
            .map_err(|source| ConfigError::ThreadPool { threads, source })?,
    };
    let pool = Arc::new(pool);
    POOLS.with_borrow_mut(|pools| pools.insert(threads, pool.clone()));
    Ok(pool)
}

/// pthreadpool's C API, exported by ExecuTorch's threadpool library.
type Pthreadpool = *mut c_void;
type Task1dWithThread = extern "C" fn(context: *mut c_void, thread: usize, i: usize);

extern "C" {
    /// ExecuTorch's pool (delegate/cpp/backend.cpp), or null.
    fn rustconv_executorch_pthreadpool() -> Pthreadpool;
    fn pthreadpool_get_threads_count(pool: Pthreadpool) -> usize;
    fn pthreadpool_parallelize_1d_with_thread(
        pool: Pthreadpool,
        task: Task1dWithThread,
        context: *mut c_void,
        range: usize,
        flags: u32,
    );
}

/// ExecuTorch's threadpool as the kernels' [`par::Pool`]: its calling
/// thread is thread 0 and takes part, like our own pools' (see the module
/// docs).
pub struct ExecutorchPool {
    pool: NonNull<c_void>,
    threads: usize,
}

impl ExecutorchPool {
    /// The process's pool now (ExecuTorch may replace it between calls:
    /// `_unsafe_reset_threadpool`), or `None` without one.
    pub fn get() -> Option<Self> {
        // SAFETY: a plain getter with no preconditions; it returns the
        // process's pool or null (ExecuTorch creates the pool on first use).
        let pool = NonNull::new(unsafe { rustconv_executorch_pthreadpool() })?;
        // SAFETY: `pool` is a live pthreadpool: ExecuTorch's, which lives
        // until the process exits or the host resets it, and hosts reset it
        // between calls, not during one.
        let threads = unsafe { pthreadpool_get_threads_count(pool.as_ptr()) }.max(1);
        Some(ExecutorchPool { pool, threads })
    }
}

/// What a task of [`ExecutorchPool::run`] reaches through pthreadpool's
/// context pointer.
struct Job<'a> {
    task: &'a (dyn Fn(usize, usize) + Sync),
    /// The first panic of a task: unwinding must not cross pthreadpool's C
    /// frames, so it is caught there and resumed on the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

extern "C" fn run_task(context: *mut c_void, thread: usize, i: usize) {
    // SAFETY: `context` is the `&Job` that `ExecutorchPool::run` passed to
    // pthreadpool, which calls this only until `parallelize` returns, while
    // that borrow is alive. `Job` is `Sync`: tasks on other threads share it.
    let job = unsafe { &*(context as *const Job) };
    if let Err(payload) = catch_unwind(AssertUnwindSafe(|| (job.task)(thread, i))) {
        let mut first = job.panic.lock().unwrap_or_else(|e| e.into_inner());
        first.get_or_insert(payload);
    }
}

impl par::Pool for ExecutorchPool {
    fn threads(&self) -> usize {
        self.threads
    }

    fn run(&self, tasks: usize, task: &(dyn Fn(usize, usize) + Sync)) {
        let job = Job {
            task,
            panic: Mutex::new(None),
        };
        // SAFETY: the pool is live (see `get`); `run_task` matches the task
        // type pthreadpool calls with the context given, `&job`, which
        // outlives the call: `parallelize` returns only when every task has.
        // Flags 0: workers spin briefly for the next call, as XNNPACK's do.
        unsafe {
            pthreadpool_parallelize_1d_with_thread(
                self.pool.as_ptr(),
                run_task,
                &job as *const Job as *mut c_void,
                tasks,
                0,
            )
        };
        if let Some(payload) = job.panic.into_inner().unwrap_or_else(|e| e.into_inner()) {
            resume_unwind(payload);
        }
    }
}

// SAFETY: a pthreadpool is made to be driven from any thread (its
// `parallelize` calls are serialised by the pool itself); the pointer is
// only passed to pthreadpool's functions.
unsafe impl Sync for ExecutorchPool {}
unsafe impl Send for ExecutorchPool {}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[test]
    fn pools_are_shared_per_thread_count() {
        let a = pool(2).unwrap();
        let b = pool(2).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.current_num_threads(), 2);
        assert_eq!(pool(1).unwrap().current_num_threads(), 1);
    }

    #[test]
    fn the_calling_thread_is_worker_zero_of_its_first_pool() {
        std::thread::spawn(|| {
            let caller = std::thread::current().id();
            let two = pool(2).unwrap();
            // Runs on this very thread: no hand-off.
            assert_eq!(two.install(|| std::thread::current().id()), caller);
            assert_eq!(two.install(rayon::current_thread_index), Some(0));
            // Both threads take part in parallel work.
            let seen = Mutex::new(std::collections::HashSet::new());
            two.install(|| {
                rayon::broadcast(|_| seen.lock().unwrap().insert(std::thread::current().id()))
            });
            assert_eq!(seen.into_inner().unwrap().len(), 2);
            // A second thread count on this thread: an ordinary pool.
            let three = pool(3).unwrap();
            assert_eq!(three.current_num_threads(), 3);
            assert_ne!(three.install(|| std::thread::current().id()), caller);
        })
        .join()
        .unwrap();
        // Threads alive at the same time get their own pools.
        let both = Arc::new(std::sync::Barrier::new(2));
        let spawn = || {
            let both = both.clone();
            std::thread::spawn(move || {
                let mine = pool(2).unwrap();
                both.wait();
                Arc::as_ptr(&mine) as usize
            })
        };
        let (here, there) = (spawn(), spawn());
        assert_ne!(here.join().unwrap(), there.join().unwrap());
    }

    #[test]
    fn executorchs_pool_is_used_where_it_has_the_count_asked_for() {
        let pool = ExecutorchPool::get().expect("ExecuTorch's threadpool is linked");
        let n = pool.threads;
        let kind = |requested, executorch| match Workers::pick(requested, executorch) {
            Workers::Caller => "caller".to_string(),
            Workers::Executorch(p) => format!("executorch {}", p.threads),
            Workers::Own(t) => format!("own {t}"),
        };
        let get = ExecutorchPool::get;
        let default = if n == 1 {
            "caller".into()
        } else {
            format!("executorch {n}")
        };
        assert_eq!(kind(None, get()), default);
        assert_eq!(kind(Some(n), get()), default);
        assert_eq!(kind(Some(n + 1), get()), format!("own {}", n + 1));
        assert_eq!(kind(Some(1), get()), "caller");
        // Without ExecuTorch's (RUSTCONV_THREADPOOL=own): ours, or the caller.
        assert_eq!(kind(Some(3), None), "own 3");
        assert_eq!(
            kind(None, None),
            match machine_threads() {
                1 => "caller".to_string(),
                m => format!("own {m}"),
            }
        );
    }

    #[test]
    fn a_panicking_task_on_executorchs_pool_unwinds_on_the_caller() {
        let pool = ExecutorchPool::get().unwrap();
        let done = AtomicUsize::new(0);
        let caught = catch_unwind(AssertUnwindSafe(|| {
            par::install(&pool, || {
                par::for_each(16, |i| {
                    assert!(i != 5, "task 5 fails");
                    done.fetch_add(1, Ordering::Relaxed);
                })
            })
        }));
        let payload = caught.unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"task 5 fails"));
        // The other tasks ran; the pool works on.
        assert_eq!(done.load(Ordering::Relaxed), 15);
        let again = AtomicUsize::new(0);
        par::install(&pool, || {
            par::for_each(8, |_| _ = again.fetch_add(1, Ordering::Relaxed))
        });
        assert_eq!(again.into_inner(), 8);
    }

    #[test]
    fn runtime_option_is_validated() {
        let max = max_threads();
        for n in [0, -3, max as i32 + 1, 100_000, i32::MAX] {
            let err = set_runtime_threads(n).unwrap_err();
            assert!(
                matches!(err, ConfigError::NumThreads { got, max: m } if got == i64::from(n) && m == max),
                "{n}: {err}"
            );
            assert!(
                err.to_string().contains(&format!("between 1 and {max}")),
                "{err}"
            );
        }
    }

    #[test]
    fn a_compile_spec_asks_for_at_most_max_threads() {
        let max = max_threads();
        assert!(max >= MAX_THREADS_PER_CORE);
        assert_eq!(spec_threads(2), 2);
        assert_eq!(spec_threads(max), max);
        assert_eq!(spec_threads(u32::MAX as usize), max);
    }
}
