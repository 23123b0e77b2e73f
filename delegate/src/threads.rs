//! How many threads the kernels use, and the rayon pools that provide them.
//!
//! Precedence, highest first: the runtime option (`set_option("num_threads")`,
//! which `pte_runner -num_threads` uses), the `RUSTCONV_NUM_THREADS`
//! environment variable, the `num_threads` compile spec, the machine's cores.
//! Pools are shared per thread count across every delegate in the process.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

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
    Ok(compile_spec.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())))
}

pub fn pool(threads: usize) -> Result<Arc<ThreadPool>, ConfigError> {
    static POOLS: OnceLock<Mutex<HashMap<usize, Arc<ThreadPool>>>> = OnceLock::new();
    let mut pools = POOLS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(pool) = pools.get(&threads) {
        return Ok(pool.clone());
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("rustconv-{i}"))
        .build()
        .map_err(|source| ConfigError::ThreadPool { threads, source })?;
    let pool = Arc::new(pool);
    pools.insert(threads, pool.clone());
    Ok(pool)
}

#[cfg(test)]
mod tests {
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
