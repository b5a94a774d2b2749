//! The one place the engine gets its atomics, cells, locks, threads and `Arc` from.
//!
//! Under `--cfg lanestream_loom` everything comes from [loom](https://docs.rs/loom), so the whole
//! engine runs under the model checker; otherwise from `std`. `UnsafeCell` has loom's closure API
//! (`with` / `with_mut`) in both builds, the way tokio's `loom` module does it.

#[cfg(not(lanestream_loom))]
mod imp {
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
    pub(crate) use std::sync::{Arc, Mutex};
    pub(crate) use std::thread::{current, park, park_timeout, Thread};

    /// `std::cell::UnsafeCell` with loom's access API.
    #[derive(Debug)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) const fn new(value: T) -> Self {
            Self(std::cell::UnsafeCell::new(value))
        }

        /// Calls `f` with a shared raw pointer to the contents.
        #[inline(always)]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        /// Calls `f` with an exclusive raw pointer to the contents.
        #[inline(always)]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }

    /// Whether waits spin before parking; the spin phase is skipped under loom.
    pub(crate) const SPIN: bool = true;

    /// One step of a bounded spin-wait for another thread's short critical section.
    #[inline]
    pub(crate) fn spin(backoff: &crossbeam_utils::Backoff) {
        backoff.snooze();
    }
}

#[cfg(lanestream_loom)]
mod imp {
    pub(crate) use loom::cell::UnsafeCell;
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
    pub(crate) use loom::sync::{Arc, Mutex};
    pub(crate) use loom::thread::{current, park, Thread};

    /// loom has no timed park; a timed wait parks like an untimed one, and models never use
    /// timeouts.
    pub(crate) fn park_timeout(_: std::time::Duration) {
        loom::thread::park();
    }

    /// Spinning only multiplies loom's state space; waits park at once under loom.
    pub(crate) const SPIN: bool = false;

    /// Under loom a spin-wait must yield, or the model never schedules the thread it waits for.
    pub(crate) fn spin(_: &crossbeam_utils::Backoff) {
        loom::thread::yield_now();
    }
}

pub(crate) use imp::*;
pub(crate) use std::sync::atomic::Ordering;

/// Locks `m`, ignoring poisoning: the engine's critical sections hold plain lists and values
/// that a panic cannot leave half-updated. The crate's one lock helper; it hands back the
/// mutex's own guard, so that a condition variable can wait on it. The Redis backend locks its
/// `std::sync::Mutex`es with it too: they are this shim's `Mutex` in every build the backend
/// is part of (it does not build under loom, which models the in-memory engine and the log).
#[cfg(not(lanestream_loom))]
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// As the std build's: loom's guard.
#[cfg(lanestream_loom)]
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> loom::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
