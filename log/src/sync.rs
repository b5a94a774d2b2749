//! The one place the log gets its atomics, locks, condition variables, threads and `Arc` from
//! (its request queue, waits, writer thread and close flag).
//!
//! Under `--cfg lanestream_loom` (the same switch as the core's lanes) everything comes from
//! [loom](https://docs.rs/loom), so the log's waits run under the model checker; otherwise from
//! `std`.

#[cfg(not(lanestream_loom))]
mod imp {
    pub(crate) use std::sync::atomic::AtomicBool;
    pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};
    pub(crate) use std::thread::{current, park, park_timeout, Builder as ThreadBuilder, JoinHandle, Thread};
}

#[cfg(lanestream_loom)]
mod imp {
    pub(crate) use loom::sync::atomic::AtomicBool;
    pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};
    pub(crate) use loom::thread::{current, park, Builder as ThreadBuilder, JoinHandle, Thread};

    /// loom has no timed park; a timed wait parks like an untimed one, and models never use
    /// timeouts.
    pub(crate) fn park_timeout(_: std::time::Duration) {
        loom::thread::park();
    }
}

pub(crate) use imp::*;
pub(crate) use std::sync::atomic::Ordering;

/// Locks `m`, ignoring poisoning: the log's critical sections hold plain lists and counters that
/// a panic cannot leave half-updated (the writer's state is guarded by its own failure flag).
pub(crate) fn lock<T>(m: &Mutex<T>) -> impl std::ops::DerefMut<Target = T> + '_ {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}
