//! [`Signal`]: what subscribers (and the log source) wait on, and what the writer wakes after
//! each publish, on close and on failure.
//!
//! # No lost wake-up
//! A waiting subscriber locks the signal, checks "head above my cursor, or the log ended", and
//! only then sleeps (a condvar wait, or a registered waker) — still under the lock. The writer
//! changes the state (publishes, marks closed or failed) and then takes the same lock to wake
//! everyone. Either the writer's lock comes after the check, and it wakes the sleeper, or it came
//! before, and the check (whose lock acquisition follows the writer's unlock) sees the change.

use std::fmt;
use std::sync::PoisonError;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use super::queue::lock;
use crate::sync::{Condvar, Mutex};

struct SignalState {
    wakers: Vec<(u64, Waker)>,
    next_key: u64,
}

/// Wakes every waiter after a state change (see the module docs).
pub(crate) struct Signal {
    state: Mutex<SignalState>,
    cond: Condvar,
}

impl Signal {
    pub(crate) fn new() -> Signal {
        Signal { state: Mutex::new(SignalState { wakers: Vec::new(), next_key: 0 }), cond: Condvar::new() }
    }

    /// Wakes every waiter; call after changing what they check.
    pub(crate) fn notify(&self) {
        let wakers = std::mem::take(&mut lock(&self.state).wakers);
        self.cond.notify_all();
        wakers.into_iter().for_each(|(_, w)| w.wake());
    }

    /// Blocks until `ready()` holds (checked under the lock) or `deadline` passes; returns
    /// whether it holds.
    pub(crate) fn wait(&self, mut ready: impl FnMut() -> bool, deadline: Option<Instant>) -> bool {
        let mut st = lock(&self.state);
        loop {
            if ready() {
                return true;
            }
            match deadline {
                None => st = self.cond.wait(st).unwrap_or_else(PoisonError::into_inner),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return false;
                    }
                    st = self.cond.wait_timeout(st, d - now).unwrap_or_else(PoisonError::into_inner).0;
                }
            }
        }
    }

    /// `Ready` if `ready()` holds (checked under the lock), else registers `cx`'s waker under
    /// `key` (replacing the one registered before).
    pub(crate) fn poll(
        &self,
        ready: impl FnOnce() -> bool,
        key: &mut Option<u64>,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        let mut st = lock(&self.state);
        if let Some(k) = key.take() {
            st.wakers.retain(|(x, _)| *x != k);
        }
        if ready() {
            return Poll::Ready(());
        }
        let k = st.next_key;
        st.next_key += 1;
        st.wakers.push((k, cx.waker().clone()));
        *key = Some(k);
        Poll::Pending
    }

    /// Forgets the waker registered under `key`.
    pub(crate) fn cancel(&self, key: u64) {
        lock(&self.state).wakers.retain(|(x, _)| *x != key);
    }
}

impl fmt::Debug for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signal").field("async_waiters", &lock(&self.state).wakers.len()).finish()
    }
}
