//! The one place the log gets its atomics, locks and threads from (its request queue, writer
//! thread and close flag). Its waits themselves are the core's wait list
//! (`lanestream::wait`), whose parts come from the core's own `sync` module under the same
//! switch.
//!
//! Under `--cfg lanestream_loom` (the same switch as the core's lanes) everything comes from
//! [loom](https://docs.rs/loom), so the log's waits run under the model checker; otherwise from
//! `std`.

#[cfg(not(lanestream_loom))]
mod imp {
    pub(crate) use std::sync::atomic::AtomicBool;
    pub(crate) use std::sync::{Mutex, MutexGuard};
    pub(crate) use std::thread::{Builder as ThreadBuilder, JoinHandle};
}

#[cfg(lanestream_loom)]
mod imp {
    pub(crate) use loom::sync::atomic::AtomicBool;
    pub(crate) use loom::sync::{Mutex, MutexGuard};
    pub(crate) use loom::thread::{Builder as ThreadBuilder, JoinHandle};
}

pub(crate) use imp::*;
pub(crate) use std::sync::atomic::Ordering;

/// Locks `m`, ignoring poisoning: the log's critical sections hold plain lists and counters that
/// a panic cannot leave half-updated (the writer's state is guarded by its own failure flag).
/// The crate's one lock helper (the process-wide set of open directories, a `static` std mutex
/// even under loom, locks inline: `src/disk/storage.rs`).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
