//! How many threads the kernels use, and the rayon pools that provide them.
//!
//! Precedence, highest first: the runtime option (`set_option("num_threads")`,
//! which `pte_runner -num_threads` uses), the `RUSTCONV_NUM_THREADS`
//! environment variable, the `num_threads` compile spec, the machine's cores.
//!
//! # The calling thread works too
//!
//! A rayon pool's `install`, called from outside the pool, hands the work to
//! a sleeping worker and blocks until it is done: two thread wake-ups, about
//! 13 µs on the 2-core EPYC this was measured on, which is most of a small
//! call (C = 512, N = 64, K = 4 computes in 11 µs). So, as pthreadpool
//! does for XNNPACK, the thread that calls into the delegate is itself one
//! of the pool's threads (rayon's `use_current_thread`, index 0): `install`
//! then runs on it at once and the other `threads - 1` workers steal from
//! it. Pools therefore belong to a calling thread (one per thread count;
//! a thread can be a member of only one pool, so a second thread count on
//! the same thread gets an ordinary pool of `threads` workers). A host that
//! runs methods from several threads at once gets a pool per thread, and
//! with it `threads - 1` workers each: set the thread count accordingly.
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use rayon::ThreadPool;

use crate::error::ConfigError;

pub const ENV_VAR: &str = "RUSTCONV_NUM_THREADS";

/// 0 when unset.
static RUNTIME_THREADS: AtomicUsize = AtomicUsize::new(0);

pub fn set_runtime_threads(n: i32) -> Result<(), ConfigError> {
    if n < 1 {
        return Err(ConfigError::NumThreads(n.into()));
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
            Ok(n) if n >= 1 => Ok(Some(n)),
            _ => Err(s),
        },
    })
    .clone()
    .map_err(ConfigError::EnvThreads)
}

pub fn resolve(compile_spec: Option<usize>) -> Result<usize, ConfigError> {
    match RUNTIME_THREADS.load(Ordering::Relaxed) {
        0 => {}
        n => return Ok(n),
    }
    if let Some(n) = env_threads()? {
        return Ok(n);
    }
    Ok(compile_spec.unwrap_or_else(machine_threads))
}

/// The machine's cores, read once: `available_parallelism` reads cgroup
/// files and allocates, and `execute` must not.
fn machine_threads() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Names of the threads pools spawn (the calling thread keeps its own).
const WORKER_PREFIX: &str = "rustconv-";

/// Whether the current thread is one a pool spawned, rather than one that
/// called into the delegate.
pub fn is_worker() -> bool {
    std::thread::current()
        .name()
        .is_some_and(|name| name.starts_with(WORKER_PREFIX))
}

/// The pool of `threads` threads for the calling thread (see the module
/// docs). Builds it on first use; later calls return the same pool.
pub fn pool(threads: usize) -> Result<Arc<ThreadPool>, ConfigError> {
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
    fn runtime_option_is_validated() {
        assert!(matches!(
            set_runtime_threads(0),
            Err(ConfigError::NumThreads(0))
        ));
        assert!(matches!(
            set_runtime_threads(-3),
            Err(ConfigError::NumThreads(-3))
        ));
    }
}
