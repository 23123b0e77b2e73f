//! Resetting delegate-owned state (conv and scan states the partitioner
//! tagged as mutable buffers; see `Plan::states`).
//!
//! ExecuTorch hands backends options through `set_option` on the backend,
//! not on a delegate instance, so a reset is process-wide: the backend
//! option `reset_state` (or [`crate::ffi`]'s `rustconv_reset_state`, for
//! hosts without ExecuTorch's options API, such as its Python runtime)
//! advances an epoch, and every delegate restores its states' initial
//! values at the start of its next `execute` when it sees a new epoch. The
//! reset costs one copy of the state and no allocation, and needs no lock
//! shared with a call in flight. Loading a method again also starts it from
//! the initial state (each load creates new delegates).

use std::sync::atomic::{AtomicU64, Ordering};

static EPOCH: AtomicU64 = AtomicU64::new(0);

/// Every delegate's state goes back to its initial value before its next call.
pub fn request_reset() {
    EPOCH.fetch_add(1, Ordering::Relaxed);
}

/// The current reset epoch.
pub fn epoch() -> u64 {
    EPOCH.load(Ordering::Relaxed)
}
