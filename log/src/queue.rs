//! The writer's bounded request queue and the one-shot reply each append waits on.
//!
//! Appenders push a [`Request`] (blocking, or parking their task's waker, while the queue is
//! full: backpressure); the writer takes up to a group commit's worth at once. Each request
//! carries a [`ReplySender`]; its appender waits on the matching [`ReplySlot`]. A sender dropped
//! without replying — the writer going away — replies [`AppendError::Shutdown`], so no appender
//! ever waits forever.
//!
//! Every wait here — a pusher for room, the writer for work, an appender for its reply — is the
//! core's wait list ([`lanestream::wait`]), as the subscribers' signal is: the state (the queue,
//! the slot's result) sits behind a mutex, the waiter's check locks it, and the notifier changes
//! it under that mutex and notifies after the unlock. The list's register-then-check argument
//! does not need the check to run under the state's lock (a condition variable's argument
//! does), so no condition variable is left: the mutex only keeps the queue consistent.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use lanestream::wait::{WaitList, block_until, poll_until};

use crate::sync::{Mutex, lock};

use super::condition::AppendCondition;
use super::error::AppendError;
use super::event::Event;
use super::position::PositionRange;

/// A wait without a deadline ends only with a value.
const NO_DEADLINE: &str = "a wait without a deadline returns only once ready";

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

/// Where the writer leaves one append's outcome.
pub(crate) struct ReplySlot {
    result: Mutex<Option<AppendResult>>,
    /// The appender, parked or registered (one waiter at most; no room reserved: an append
    /// that finds its reply ready never registers).
    waiter: WaitList,
}

impl ReplySlot {
    /// A slot and the sender that fills it.
    pub(crate) fn pair() -> (Arc<ReplySlot>, ReplySender) {
        let slot = Arc::new(ReplySlot { result: Mutex::new(None), waiter: WaitList::new(0) });
        (slot.clone(), ReplySender(Some(slot)))
    }

    /// Blocks (spins briefly, then parks) until the outcome is in.
    pub(crate) fn wait(&self) -> AppendResult {
        block_until(&self.waiter, || {}, None, || lock(&self.result).take()).expect(NO_DEADLINE)
    }

    /// The outcome if it is in, else registers `cx`'s waker under `key` (replacing the one
    /// registered before; cancelled on `Ready`).
    pub(crate) fn poll(&self, key: &mut Option<u64>, cx: &mut Context<'_>) -> Poll<AppendResult> {
        match poll_until(&self.waiter, || {}, key, cx.waker(), || lock(&self.result).take()) {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }

    /// Forgets the waker registered under `key` (a dropped future); clears `key`.
    pub(crate) fn cancel(&self, key: &mut Option<u64>) {
        self.waiter.cancel(key);
    }
}

impl fmt::Debug for ReplySlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplySlot").field("ready", &lock(&self.result).is_some()).finish()
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
    *lock(&slot.result) = Some(result);
    // After the unlock: the result is in before the notify (the wait list's ordering argument).
    slot.waiter.notify();
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
}

/// The bounded request queue in front of the writer.
pub(crate) struct Queue {
    capacity: usize,
    state: Mutex<QueueState>,
    /// The writer thread, waiting for a request (or the close).
    work: WaitList,
    /// Pushers, blocked or async, waiting for room (or the close).
    room: WaitList,
}

impl Queue {
    pub(crate) fn new(capacity: usize) -> Queue {
        Queue {
            capacity,
            state: Mutex::new(QueueState {
                items: VecDeque::with_capacity(capacity.min(4096)),
                closed: false,
                committing: false,
            }),
            work: WaitList::new(1),
            room: WaitList::new(2),
        }
    }

    /// Queues `*request` (taking it) if there is room: `Some(true)`; `Some(false)` once the
    /// queue is closed (the request stays); `None` while it is full.
    fn try_push(&self, request: &mut Option<Request>) -> Option<bool> {
        let mut st = lock(&self.state);
        if st.closed {
            return Some(false);
        }
        if st.items.len() >= self.capacity {
            return None;
        }
        st.items.push_back(request.take().expect("polled after completion"));
        drop(st);
        // After the unlock: the request is queued before the notify.
        self.work.notify();
        Some(true)
    }

    /// Queues `request`, blocking while the queue is full. `Err` hands it back once the queue
    /// is closed.
    pub(crate) fn push(&self, request: Request) -> Result<(), Request> {
        let mut request = Some(request);
        let queued = block_until(&self.room, || {}, None, || self.try_push(&mut request)).expect(NO_DEADLINE);
        match request {
            Some(r) if !queued => Err(r),
            _ => Ok(()),
        }
    }

    /// Queues `*request` if there is room (taking it), else registers `cx`'s waker under `key`.
    /// `Ready(false)` once the queue is closed (the request stays in `*request`). On `Ready` the
    /// key is cancelled.
    pub(crate) fn poll_push(
        &self,
        request: &mut Option<Request>,
        key: &mut Option<u64>,
        cx: &mut Context<'_>,
    ) -> Poll<bool> {
        match poll_until(&self.room, || {}, key, cx.waker(), || self.try_push(request)) {
            Some(queued) => Poll::Ready(queued),
            None => Poll::Pending,
        }
    }

    /// Forgets the waker registered under `key` (a dropped future); clears `key`.
    pub(crate) fn cancel(&self, key: &mut Option<u64>) {
        self.room.cancel(key);
    }

    /// Moves up to `max_requests` requests (and up to about `max_bytes`; always at least one)
    /// into `out`, waiting while the queue is empty. `false` once it is closed and empty.
    pub(crate) fn drain(&self, max_requests: usize, max_bytes: usize, out: &mut Vec<Request>) -> bool {
        let took = block_until(
            &self.work,
            || {},
            None,
            || {
                let mut st = lock(&self.state);
                if st.items.is_empty() {
                    return st.closed.then_some(false);
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
                Some(true)
            },
        )
        .expect(NO_DEADLINE);
        if took {
            // After the unlock: the room is made before the notify.
            self.room.notify();
        }
        took
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
        lock(&self.state).closed = true;
        // After the unlock: closed before the notifies.
        self.room.notify();
        self.work.notify();
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
