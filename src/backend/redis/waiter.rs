//! The backend's waits: [`wait_until`], the one loop of every blocking call that waits (a
//! publish for room, a receive for an item, a watermark wait), and [`Waiter`], the helper
//! thread behind the async forms of the same waits.

use std::ops::ControlFlow;
use std::sync::{Arc, Condvar, Mutex};
use std::task::Waker;
use std::thread;
use std::time::{Duration, Instant};

use super::shared::Shared;
use crate::sync::lock;

/// The one wait loop of this backend's blocking calls (publishes waiting for room, receives
/// waiting for an item, watermark waits): runs `attempt` until it breaks with an answer,
/// waiting between attempts on the wake-up key it continues with (`BLPOP` on it for at most the
/// stream's wait slice, cut to what is left before `deadline`); an attempt that names no key
/// (it could not reach Redis), or a wait that lost its connection, sleeps the backoff's minimum
/// instead, and the next attempt reconnects or reports the error. `None` once `deadline` has
/// passed with no answer (checked after each attempt, so an attempt always runs at least once);
/// without a deadline it waits until `attempt` breaks.
///
/// No wake-up is lost: an attempt that needs one names the key it waits on, and whatever could
/// change its answer pushes a token there after changing the lane; a token pushed between the
/// attempt and the wait stays in the list until the wait takes it; a wake-up lost with a
/// connection costs one wait slice.
pub(super) fn wait_until<R>(
    shared: &Shared,
    deadline: Option<Instant>,
    mut attempt: impl FnMut() -> ControlFlow<R, Option<String>>,
) -> Option<R> {
    let settings = shared.pool.settings;
    loop {
        let bell = match attempt() {
            ControlFlow::Break(answer) => return Some(answer),
            ControlFlow::Continue(bell) => bell,
        };
        let mut slice = settings.wait_slice;
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            slice = slice.min(left);
        }
        wait_once(shared, bell.as_deref(), slice);
    }
}

/// One wait of [`wait_until`] and of a [`Waiter`]'s thread: `BLPOP` on `bell` for at most
/// `slice`; with no bell, or when the wait lost its connection, a sleep of the backoff's minimum.
fn wait_once(shared: &Shared, bell: Option<&str>, slice: Duration) {
    match bell {
        Some(bell) if shared.pool.wait_token(bell, slice).is_ok() => {}
        _ => thread::sleep(shared.pool.settings.backoff_min),
    }
}

struct WaitInner {
    /// The wake-up key to wait on, while armed.
    key: Option<String>,
    waker: Option<Waker>,
    stop: bool,
}

struct WaitState {
    inner: Mutex<WaitInner>,
    cv: Condvar,
}

/// A helper thread that waits on a wake-up key for an async receive, publish or watermark wait,
/// then wakes the task. One per end (per waiting future for request senders and watermark
/// waits), started on its first async wait, stopped when the end is dropped; named after what it
/// waits for ([`Waiter::RECV`], ...), so that a thread list tells them apart.
///
/// No wake-up is lost: the task tried the operation before arming, and everything that could
/// make it succeed pushes a token after changing the lane, which stays in the list until a
/// wait takes it; each wait lasts at most the stream's wait slice, after which the task is
/// woken anyway and tries again.
pub(crate) struct Waiter {
    state: Arc<WaitState>,
}

impl Waiter {
    /// The thread name of a consumer's waiter (an async receive).
    pub(crate) const RECV: &'static str = "lanestream-redis-recv-wait";
    /// The thread name of a fan-out's waiter (an async publish waiting for room).
    pub(crate) const PUBLISH: &'static str = "lanestream-redis-publish-wait";
    /// The thread name of a request sender's waiter (an async request publish).
    pub(crate) const REQUEST: &'static str = "lanestream-redis-request-wait";
    /// The thread name of an async watermark wait's waiter.
    pub(crate) const WATERMARK: &'static str = "lanestream-redis-watermark-wait";

    /// Starts the helper thread, named `role` (one of the constants above).
    ///
    /// # Panics
    /// If the thread cannot be spawned (as `std::thread::spawn`).
    pub(crate) fn new(shared: Arc<Shared>, role: &'static str) -> Waiter {
        let state = Arc::new(WaitState {
            inner: Mutex::new(WaitInner { key: None, waker: None, stop: false }),
            cv: Condvar::new(),
        });
        let st = state.clone();
        thread::Builder::new()
            .name(role.into())
            .spawn(move || loop {
                let key = {
                    let mut inner = lock(&st.inner);
                    loop {
                        if inner.stop {
                            return;
                        }
                        if let Some(k) = inner.key.clone() {
                            break k;
                        }
                        inner = st.cv.wait(inner).unwrap_or_else(|p| p.into_inner());
                    }
                };
                wait_once(&shared, Some(&key), shared.pool.settings.wait_slice);
                let waker = {
                    let mut inner = lock(&st.inner);
                    inner.key = None;
                    inner.waker.take()
                };
                if let Some(w) = waker {
                    w.wake();
                }
            })
            .unwrap_or_else(|e| panic!("spawning the {role} thread: {e}"));
        Waiter { state }
    }

    /// Waits on `key` and wakes `waker` (replacing any earlier one) when it is rung.
    pub(crate) fn arm(&self, key: String, waker: &Waker) {
        let mut inner = lock(&self.state.inner);
        inner.key = Some(key);
        match &mut inner.waker {
            Some(w) if w.will_wake(waker) => {}
            slot => *slot = Some(waker.clone()),
        }
        self.state.cv.notify_one();
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        lock(&self.state.inner).stop = true;
        self.state.cv.notify_one();
    }
}
