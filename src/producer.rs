//! [`Producer`]: the publishing end of a lane.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::item::Item;
use crate::ring::{ProducerState, Ring};
use crate::sync::Arc;
use crate::PublishError;

/// The publishing end of one lane: at most one is alive per lane (L9); dropping it lets a
/// restarted ingest engine take the lane at once with [`Lane::producer`](crate::Lane::producer).
///
/// `Producer<T>` is `Send` (and `Sync`) only when `T: Send + Sync`: the item is shared with
/// handles on other threads. Publishing takes `&mut self`.
///
/// ```
/// use lanestream::{MemoryStream, Stream, LaneItem, Batch, Position, PublishError};
/// let stream = MemoryStream::builder().capacity(1).sink("search").build().unwrap();
/// let lane = stream.lane("search").unwrap();
/// let mut producer = lane.producer().unwrap();
/// let batch = |p| LaneItem::Batch(Batch::new(Some(Position(p)), Vec::new().into()));
/// producer.try_publish(batch(1)).unwrap();
/// // The lane holds one item: the next one comes back with `Full`, untouched.
/// let err = producer.try_publish(batch(2)).unwrap_err();
/// assert!(matches!(err, PublishError::Full(_)));
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
    /// Hands `item` back, nothing enqueued: [`PublishError::Full`] if the lane has `capacity`
    /// unacked items, [`Closed`](PublishError::Closed) after [`close`](Producer::close),
    /// [`PositionRegressed`](PublishError::PositionRegressed) if the item's position is not
    /// greater than the last positioned item's (L4),
    /// [`InvalidPosition`](PublishError::InvalidPosition) for `Position(u64::MAX)`.
    pub fn try_publish(&mut self, item: T) -> Result<(), PublishError<T>> {
        self.ring.try_push(&mut self.state, item)
    }

    /// Publishes `item`, waiting (spin, then park) while the lane is full (L3).
    ///
    /// # Errors
    /// As [`try_publish`](Producer::try_publish), except never `Full`.
    pub fn publish(&mut self, item: T) -> Result<(), PublishError<T>> {
        self.publish_until(item, None)
    }

    /// Publishes `item`, waiting at most `timeout` for room.
    ///
    /// # Errors
    /// As [`publish`](Producer::publish), plus [`PublishError::Timeout`] (item handed back) if
    /// the lane stayed full.
    pub fn publish_timeout(&mut self, item: T, timeout: Duration) -> Result<(), PublishError<T>> {
        self.publish_until(item, Some(Instant::now() + timeout))
    }

    fn publish_until(&mut self, item: T, deadline: Option<Instant>) -> Result<(), PublishError<T>> {
        let (ring, state) = (&self.ring, &mut self.state);
        ring.publish_until(item, deadline, |item| ring.try_push(state, item))
    }

    /// Publishes `item`, waiting asynchronously while the lane is full. Works on any executor.
    /// Dropping the future drops the item it holds (it was not published).
    ///
    /// # Errors
    /// As [`publish`](Producer::publish).
    pub fn publish_async(&mut self, item: T) -> Publish<'_, T> {
        Publish { producer: self, item: Some(item), key: None }
    }

    /// Closes the lane (L10): consumers receive everything queued or released, then `None`.
    /// Publishing fails with `Closed` from now on, for this and any later producer. Takes no
    /// slot; wakes every waiter. Idempotent.
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

/// The future of [`Producer::publish_async`].
#[must_use = "futures do nothing unless polled"]
pub struct Publish<'a, T> {
    producer: &'a mut Producer<T>,
    item: Option<T>,
    key: Option<u64>,
}

// The item is moved in and out by value and never pinned.
impl<T> Unpin for Publish<'_, T> {}

impl<T: Item> Future for Publish<'_, T> {
    type Output = Result<(), PublishError<T>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        loop {
            let item = this.item.take().expect("Publish polled after completion");
            match this.producer.ring.try_push(&mut this.producer.state, item) {
                Err(PublishError::Full(back)) => this.item = Some(back),
                done => {
                    this.producer.ring.room.cancel(&mut this.key);
                    return Poll::Ready(done);
                }
            }
            if !this.producer.ring.poll_writable(&mut this.key, cx.waker()) {
                return Poll::Pending;
            }
        }
    }
}

impl<T> Drop for Publish<'_, T> {
    fn drop(&mut self) {
        self.producer.ring.room.cancel(&mut self.key);
    }
}
