//! The writer's bounded request queue and the one-shot reply each append waits on.
//!
//! Appenders push a [`Request`] (blocking on a condvar, or parking their task's waker, while the
//! queue is full: backpressure without spinning); the writer takes up to a group commit's worth
//! at once. Each request carries a [`ReplySender`]; its appender waits on the matching
//! [`ReplySlot`] (parked thread or registered waker). A sender dropped without replying — the
//! writer going away — replies [`AppendError::Shutdown`], so no appender ever waits forever.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, PoisonError};
use std::task::{Context, Poll, Waker};

use crate::sync::{self, Condvar, Mutex, MutexGuard, Thread};

use super::condition::AppendCondition;
use super::error::AppendError;
use super::event::Event;
use super::position::PositionRange;

/// Locks `m`, ignoring poisoning: every critical section here leaves its state consistent.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What an append's caller waits for.
pub(crate) type AppendResult = Result<PositionRange, AppendError>;

/// One append on its way to the writer.
pub(crate) struct Request {
    pub(crate) events: Vec<Event>,
    pub(crate) condition: Option<AppendCondition>,
    /// The events' encoded size, in bytes (the group commit's byte budget counts it).
    pub(crate) bytes: usize,
    pub(crate) reply: ReplySender,
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("events", &self.events.len())
            .field("condition", &self.condition)
            .field("bytes", &self.bytes)
            .finish()
    }
}

enum Waiter {
    Thread(Thread),
    Task(Waker),
}

impl Waiter {
    fn wake(self) {
        match self {
            Waiter::Thread(t) => t.unpark(),
            Waiter::Task(w) => w.wake(),
        }
    }
}

#[derive(Default)]
struct ReplyState {
    result: Option<AppendResult>,
    waiter: Option<Waiter>,
}

/// Where the writer leaves one append's outcome.
#[derive(Default)]
pub(crate) struct ReplySlot {
    state: Mutex<ReplyState>,
}

impl ReplySlot {
    /// A slot and the sender that fills it.
    pub(crate) fn pair() -> (Arc<ReplySlot>, ReplySender) {
        let slot = Arc::new(ReplySlot::default());
        (slot.clone(), ReplySender(Some(slot)))
    }

    /// Blocks (parks) until the outcome is in.
    pub(crate) fn wait(&self) -> AppendResult {
        let mut st = lock(&self.state);
        loop {
            if let Some(r) = st.result.take() {
                return r;
            }
            st.waiter = Some(Waiter::Thread(sync::current()));
            drop(st);
            sync::park();
            st = lock(&self.state);
        }
    }

    /// The outcome if it is in, else registers `cx`'s waker.
    pub(crate) fn poll(&self, cx: &mut Context<'_>) -> Poll<AppendResult> {
        let mut st = lock(&self.state);
        match st.result.take() {
            Some(r) => Poll::Ready(r),
            None => {
                if !matches!(&st.waiter, Some(Waiter::Task(w)) if w.will_wake(cx.waker())) {
                    st.waiter = Some(Waiter::Task(cx.waker().clone()));
                }
                Poll::Pending
            }
        }
    }
}

impl fmt::Debug for ReplySlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplySlot").field("ready", &lock(&self.state).result.is_some()).finish()
    }
}

/// The writer's end of a [`ReplySlot`]; replies `Shutdown` if dropped unused.
pub(crate) struct ReplySender(Option<Arc<ReplySlot>>);

impl ReplySender {
    /// Delivers the outcome and wakes the waiter.
    pub(crate) fn send(mut self, result: AppendResult) {
        if let Some(slot) = self.0.take() {
            deliver(&slot, result);
        }
    }
}

fn deliver(slot: &ReplySlot, result: AppendResult) {
    let waiter = {
        let mut st = lock(&slot.state);
        st.result = Some(result);
        st.waiter.take()
    };
    if let Some(w) = waiter {
        w.wake();
    }
}

impl Drop for ReplySender {
    /// Unanswered: `Shutdown` if the request was never committed (the writer went away), `Io`
    /// if it is dropped in a panic's unwinding — a commit (a bug in it or in the storage) panicked
    /// with the request in hand, possibly after its record was written, so the outcome is
    /// unknown, which is what `Io` says.
    fn drop(&mut self) {
        if let Some(slot) = self.0.take() {
            let answer = if std::thread::panicking() {
                AppendError::Io(Arc::new(std::io::Error::other(
                    "the log's writer panicked while committing this append; it may have been written",
                )))
            } else {
                AppendError::Shutdown
            };
            deliver(&slot, Err(answer));
        }
    }
}

struct QueueState {
    items: VecDeque<Request>,
    closed: bool,
    /// The writer thread holds a drained group it has not finished committing.
    committing: bool,
    /// The writer is waiting on `not_empty`.
    writer_waiting: bool,
    /// Blocked pushers waiting on `not_full`.
    pushers_waiting: usize,
    /// Async pushers waiting for room, by key.
    space_wakers: Vec<(u64, Waker)>,
    next_key: u64,
}

/// The bounded request queue in front of the writer.
pub(crate) struct Queue {
    capacity: usize,
    state: Mutex<QueueState>,
    not_empty: Condvar,
    not_full: Condvar,
}

impl Queue {
    pub(crate) fn new(capacity: usize) -> Queue {
        Queue {
            capacity,
            state: Mutex::new(QueueState {
                items: VecDeque::with_capacity(capacity.min(4096)),
                closed: false,
                committing: false,
                writer_waiting: false,
                pushers_waiting: 0,
                space_wakers: Vec::new(),
                next_key: 0,
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
        }
    }

    fn enqueue(&self, mut st: MutexGuard<'_, QueueState>, request: Request) {
        st.items.push_back(request);
        let wake_writer = st.writer_waiting;
        drop(st);
        if wake_writer {
            self.not_empty.notify_one();
        }
    }

    /// Queues `request`, blocking while the queue is full. `Err` hands it back once the queue
    /// is closed.
    pub(crate) fn push(&self, request: Request) -> Result<(), Request> {
        let mut st = lock(&self.state);
        while !st.closed && st.items.len() >= self.capacity {
            st.pushers_waiting += 1;
            st = self.not_full.wait(st).unwrap_or_else(PoisonError::into_inner);
            st.pushers_waiting -= 1;
        }
        if st.closed {
            return Err(request);
        }
        self.enqueue(st, request);
        Ok(())
    }

    /// Queues `*request` if there is room (taking it), else registers `cx`'s waker under `key`.
    /// `Ready(false)` once the queue is closed (the request stays in `*request`).
    pub(crate) fn poll_push(
        &self,
        request: &mut Option<Request>,
        key: &mut Option<u64>,
        cx: &mut Context<'_>,
    ) -> Poll<bool> {
        let mut st = lock(&self.state);
        if let Some(k) = key.take() {
            st.space_wakers.retain(|(x, _)| *x != k);
        }
        if st.closed {
            return Poll::Ready(false);
        }
        if st.items.len() < self.capacity {
            let r = request.take().expect("polled after completion");
            self.enqueue(st, r);
            return Poll::Ready(true);
        }
        let k = st.next_key;
        st.next_key += 1;
        st.space_wakers.push((k, cx.waker().clone()));
        *key = Some(k);
        Poll::Pending
    }

    /// Forgets the waker registered under `key` (a dropped future).
    pub(crate) fn cancel(&self, key: u64) {
        lock(&self.state).space_wakers.retain(|(x, _)| *x != key);
    }

    /// Moves up to `max_requests` requests (and up to about `max_bytes`; always at least one)
    /// into `out`, waiting while the queue is empty. `false` once it is closed and empty.
    pub(crate) fn drain(&self, max_requests: usize, max_bytes: usize, out: &mut Vec<Request>) -> bool {
        let mut st = lock(&self.state);
        while st.items.is_empty() {
            if st.closed {
                return false;
            }
            st.writer_waiting = true;
            st = self.not_empty.wait(st).unwrap_or_else(PoisonError::into_inner);
            st.writer_waiting = false;
        }
        let mut bytes = 0;
        while let Some(r) = st.items.front() {
            if !out.is_empty() && (out.len() >= max_requests || bytes + r.bytes > max_bytes) {
                break;
            }
            bytes += r.bytes;
            out.push(st.items.pop_front().expect("front exists"));
        }
        st.committing = true;
        let wake_blocked = st.pushers_waiting > 0;
        let wakers = std::mem::take(&mut st.space_wakers);
        drop(st);
        if wake_blocked {
            self.not_full.notify_all();
        }
        wakers.into_iter().for_each(|(_, w)| w.wake());
        true
    }

    /// The writer thread has answered the group [`drain`](Queue::drain) gave it.
    pub(crate) fn committed(&self) {
        lock(&self.state).committing = false;
    }

    /// Whether the writer is idle: open, nothing queued, no group being committed. An append
    /// may then commit on its own thread (the writer's inline commit), and nothing queued
    /// earlier is overtaken.
    pub(crate) fn is_idle(&self) -> bool {
        let st = lock(&self.state);
        !st.closed && !st.committing && st.items.is_empty()
    }

    /// Closes the queue: later pushes are refused (and waiting pushers too); what is queued is
    /// still drained.
    pub(crate) fn close(&self) {
        let wakers = {
            let mut st = lock(&self.state);
            st.closed = true;
            std::mem::take(&mut st.space_wakers)
        };
        self.not_full.notify_all();
        self.not_empty.notify_all();
        wakers.into_iter().for_each(|(_, w)| w.wake());
    }
}

#[cfg(test)]
impl Queue {
    /// Whether [`close`](Queue::close) was called.
    pub(crate) fn is_closed(&self) -> bool {
        lock(&self.state).closed
    }
}

impl fmt::Debug for Queue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = lock(&self.state);
        f.debug_struct("Queue")
            .field("capacity", &self.capacity)
            .field("queued", &st.items.len())
            .field("closed", &st.closed)
            .finish()
    }
}
