//! [`Signal`]: what subscribers (and the log source) wait on, and what the writer wakes after
//! each publish, on close and on failure.
//!
//! It is the core's wait list ([`lanestream::wait`]), the lanes' own waiting mechanism: a
//! waiting subscriber registers (its thread or its task's waker), then checks "head above my
//! cursor, or the log ended", then sleeps; the writer changes the state (stores the snapshot,
//! marks closed or failed) and then notifies. The list's register-then-check against
//! change-then-notify argument (its module docs) rules out a lost wake-up whatever publishes the
//! state — `arc-swap`, the `closed` flag, the failure's `OnceLock` — as long as the change comes
//! before the notify.

use std::fmt;
use std::task::{Context, Poll};
use std::time::Instant;

use lanestream::wait::{WaitList, block_until, poll_until};

/// Wakes every waiter after a state change (see the module docs).
pub(crate) struct Signal {
    waiters: WaitList,
}

impl Signal {
    pub(crate) fn new() -> Signal {
        Signal { waiters: WaitList::new(4) }
    }

    /// Wakes every waiter; call after changing what they check.
    pub(crate) fn notify(&self) {
        self.waiters.notify();
    }

    /// Blocks until `ready()` holds (checked after registering) or `deadline` passes; returns
    /// whether it holds.
    pub(crate) fn wait(&self, mut ready: impl FnMut() -> bool, deadline: Option<Instant>) -> bool {
        block_until(&self.waiters, || {}, deadline, || ready().then_some(())).is_some()
    }

    /// `Ready` if `ready()` holds (checked before and again after registering `cx`'s waker under
    /// `key`, which replaces the one registered before). On `Ready` the key is cancelled.
    pub(crate) fn poll(
        &self,
        mut ready: impl FnMut() -> bool,
        key: &mut Option<u64>,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        match poll_until(&self.waiters, || {}, key, cx.waker(), || ready().then_some(())) {
            Some(()) => Poll::Ready(()),
            None => Poll::Pending,
        }
    }

    /// Forgets the waiter registered under `key` (a dropped future); clears `key`.
    pub(crate) fn cancel(&self, key: &mut Option<u64>) {
        self.waiters.cancel(key);
    }
}

impl fmt::Debug for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signal").field("waiters", &self.waiters).finish()
    }
}
