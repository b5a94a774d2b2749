//! [`Producer`]: the publishing end of a lane.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::ring::{ProducerState, Ring};
use crate::error::{PublishError, PublishTimeoutError, TryPublishError};
use crate::item::Item;
use crate::sync::{lock, Arc, Mutex};

/// The publishing end of one lane: at most one is alive per lane ([L9](crate::contract#l9)); dropping it lets a
/// restarted ingest engine take the lane at once with [`Lane::producer`](crate::Lane::producer).
///
/// `Producer<T>` is `Send` (and `Sync`) only when `T: Send + Sync`: the item is shared with
/// handles on other threads. Publishing takes `&mut self`.
///
/// ```
/// use lanestream::{MemoryStream, LaneItem, Batch, Position, TryPublishError};
/// let stream = MemoryStream::builder().capacity(1).sink("search").build().unwrap();
/// let lane = stream.lane("search").unwrap();
/// let mut producer = lane.producer().unwrap();
/// let batch = |p| LaneItem::Batch(Batch::new(Some(Position(p)), Vec::new().into()));
/// producer.try_publish(batch(1)).unwrap();
/// // The lane holds one item: the next one comes back with `Full`, untouched.
/// let err = producer.try_publish(batch(2)).unwrap_err();
/// assert!(err.is_full());
/// assert_eq!(err.into_inner().position(), Some(Position(2)));
/// ```
pub struct Producer<T> {
    ring: Arc<Ring<T>>,
    state: ProducerState,
}

impl<T: Item> Producer<T> {
    pub(crate) fn new(ring: Arc<Ring<T>>, state: ProducerState) -> Producer<T> {
        Producer { ring, state }
    }

    /// Publishes `item` if there is room now; never waits.
    ///
    /// # Errors
    /// Hands `item` back, nothing enqueued: [`TryPublishError::Full`] if the lane has `capacity`
    /// unacked items, [`Closed`](TryPublishError::Closed) after [`close`](Producer::close),
    /// [`PositionRegressed`](TryPublishError::PositionRegressed) if the item's position is not
    /// greater than the last positioned item's ([L4](crate::contract#l4)),
    /// [`InvalidPosition`](TryPublishError::InvalidPosition) for `Position(u64::MAX)`.
    pub fn try_publish(&mut self, item: T) -> Result<(), TryPublishError<T>> {
        self.ring.try_push(&mut self.state, item)
    }

    /// Publishes `item`, waiting (spin, then park) while the lane is full
    /// ([L3](crate::contract#l3)).
    ///
    /// # Errors
    /// [`PublishError`]: `Closed`, `PositionRegressed`, `InvalidPosition`; the item handed back.
    pub fn publish(&mut self, item: T) -> Result<(), PublishError<T>> {
        let (ring, state) = (&self.ring, &mut self.state);
        ring.publish_blocking(item, |item| ring.try_push(state, item))
    }

    /// Publishes `item`, waiting at most `timeout` for room.
    ///
    /// # Errors
    /// [`PublishTimeoutError::Timeout`] (item handed back) if the lane stayed full, or a cause
    /// of [`publish`](Producer::publish).
    pub fn publish_timeout(&mut self, item: T, timeout: Duration) -> Result<(), PublishTimeoutError<T>> {
        self.publish_deadline(item, Instant::now() + timeout)
    }

    /// Publishes `item`, waiting until `deadline` at most for room.
    ///
    /// # Errors
    /// As [`publish_timeout`](Producer::publish_timeout).
    pub fn publish_deadline(&mut self, item: T, deadline: Instant) -> Result<(), PublishTimeoutError<T>> {
        let (ring, state) = (&self.ring, &mut self.state);
        ring.publish_until(item, deadline, |item| ring.try_push(state, item))
    }

    /// Publishes `item`, waiting asynchronously while the lane is full. Works on any executor.
    /// Dropping the future drops the item it holds (it was not published).
    ///
    /// # Errors
    /// As [`publish`](Producer::publish).
    pub fn publish_async(&mut self, item: T) -> Publish<'_, T> {
        Publish { ring: &self.ring, state: State::Own(&mut self.state), item: Some(item), key: None }
    }

    /// Closes the lane ([L10](crate::contract#l10)): consumers receive everything queued or
    /// released, then `None`. Publishing fails with `Closed` from now on, for this and any later
    /// producer. Takes no slot; wakes every waiter. Idempotent.
    pub fn close(&self) {
        self.ring.close();
    }

    /// Whether the lane was closed.
    pub fn is_closed(&self) -> bool {
        self.ring.is_closed()
    }

    /// The lane's capacity in items.
    pub fn capacity(&self) -> usize {
        self.ring.capacity() as usize
    }
}

impl<T> Drop for Producer<T> {
    fn drop(&mut self) {
        self.ring.release_producer();
    }
}

impl<T> fmt::Debug for Producer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer").field("published", &self.state.tail).finish_non_exhaustive()
    }
}

/// Whose producer state a [`Publish`] pushes with.
enum State<'a> {
    /// A lane producer's own.
    Own(&'a mut ProducerState),
    /// The request lane's, shared by its senders behind a lock held for one push at a time.
    Shared(&'a Mutex<ProducerState>),
}

/// The future of [`Producer::publish_async`] and of the request lane's `publish_async`: tries
/// to publish, and while the lane is full waits for room with the task's waker registered.
#[must_use = "futures do nothing unless polled"]
pub struct Publish<'a, T> {
    ring: &'a Ring<T>,
    state: State<'a>,
    item: Option<T>,
    key: Option<u64>,
}

impl<'a, T> Publish<'a, T> {
    /// A publish through a producer state shared behind `state`'s lock.
    pub(crate) fn shared(ring: &'a Ring<T>, state: &'a Mutex<ProducerState>, item: T) -> Publish<'a, T> {
        Publish { ring, state: State::Shared(state), item: Some(item), key: None }
    }
}

// The item is moved in and out by value and never pinned.
impl<T> Unpin for Publish<'_, T> {}

impl<T: Item> Future for Publish<'_, T> {
    type Output = Result<(), PublishError<T>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        loop {
            let item = this.item.take().expect("Publish polled after completion");
            let pushed = match &mut this.state {
                State::Own(state) => this.ring.try_push(state, item),
                State::Shared(state) => this.ring.try_push(&mut lock(state), item),
            };
            match pushed.map_err(TryPublishError::into_waitable) {
                Err(Ok(back)) => this.item = Some(back),
                Ok(()) => return this.finish(Ok(())),
                Err(Err(refused)) => return this.finish(Err(refused)),
            }
            if !this.ring.poll_writable(&mut this.key, cx.waker()) {
                return Poll::Pending;
            }
        }
    }
}

impl<T> Publish<'_, T> {
    fn finish(&mut self, done: Result<(), PublishError<T>>) -> Poll<Result<(), PublishError<T>>> {
        self.ring.cancel_writable(&mut self.key);
        Poll::Ready(done)
    }
}

impl<T> Drop for Publish<'_, T> {
    fn drop(&mut self) {
        self.ring.cancel_writable(&mut self.key);
    }
}

impl<T> fmt::Debug for Publish<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publish")
            .field("done", &self.item.is_none())
            .field("waiting", &self.key.is_some())
            .finish_non_exhaustive()
    }
}
