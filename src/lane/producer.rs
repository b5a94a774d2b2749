//! [`Producer`]: the publishing end of a standalone lane, and [`Publish`], the one future of
//! every async publish.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::publisher::{cancel_room, poll_room, Publisher, Refusal, Target};
use super::ring::Ring;
use crate::error::PublishError;
use crate::item::Item;
use crate::sync::Mutex;

/// The publishing end of a [standalone lane](crate::Lane::standalone): at most one is alive per
/// lane ([L9](crate::contract#l9)); dropping it lets a restarted producer take the lane at once
/// with [`Lane::producer`](crate::Lane::producer). A stream's lanes are published to together,
/// through the stream's [`Fanout`](crate::Fanout).
///
/// Runs are the fast path ([`publish_run`](Producer::publish_run): one publication step for
/// the run); [`publish`](Producer::publish) is the run of one, as rtrb's `push` beside its
/// `write_chunk`.
///
/// `Producer<T>` is `Send` (and `Sync`) only when `T: Send + Sync`: the item is shared with
/// handles on other threads. Publishing takes `&mut self`.
///
/// ```
/// use lanestream::{Item, Lane, Position, SinkName};
/// #[derive(Debug)]
/// struct Tick(u64);
/// impl Item for Tick {
///     fn position(&self) -> Option<Position> { Some(Position(self.0)) }
/// }
/// let lane = Lane::standalone(SinkName::new("ticks").unwrap(), 1).unwrap();
/// let mut producer = lane.producer().unwrap();
/// producer.try_publish(Tick(1)).unwrap();
/// // The lane holds one item: the next one comes back with `Full`, untouched.
/// let err = producer.try_publish(Tick(2)).unwrap_err();
/// assert!(err.is_full());
/// assert_eq!(err.into_inner().0, 2);
/// ```
pub struct Producer<T> {
    publisher: Publisher<T>,
}

impl<T: Item> Producer<T> {
    pub(crate) fn new(publisher: Publisher<T>) -> Producer<T> {
        Producer { publisher }
    }

    /// Publishes `item` if there is room now; never waits.
    ///
    /// # Errors
    /// Hands `item` back, nothing enqueued: [`PublishError::Full`] if the lane has `capacity`
    /// unacked items, [`Closed`](PublishError::Closed) after [`close`](Producer::close),
    /// [`PositionRegressed`](PublishError::PositionRegressed) if the item's position is not
    /// greater than the last positioned item's ([L4](crate::contract#l4)),
    /// [`InvalidPosition`](PublishError::InvalidPosition) for `Position(u64::MAX)`.
    pub fn try_publish(&mut self, item: T) -> Result<(), PublishError<T>> {
        self.publisher.try_step(None, item).map_err(|(item, refusal)| refusal.error(item))
    }

    /// Publishes `item`, waiting (spin, then park) while the lane is full
    /// ([L3](crate::contract#l3)).
    ///
    /// # Errors
    /// [`PublishError`]: `Closed`, `PositionRegressed`, `InvalidPosition`; the item handed back.
    pub fn publish(&mut self, item: T) -> Result<(), PublishError<T>> {
        self.publish_deadline(item, None)
    }

    /// Publishes `item`, waiting at most `timeout` for room.
    ///
    /// # Errors
    /// [`PublishError::Timeout`] (item handed back) if the lane stayed full, or a cause
    /// of [`publish`](Producer::publish).
    pub fn publish_timeout(&mut self, item: T, timeout: Duration) -> Result<(), PublishError<T>> {
        self.publish_deadline(item, Some(Instant::now() + timeout))
    }

    /// Publishes `item`, waiting until `deadline` at most for room (`None`: for as long as it
    /// takes; [`publish`](Producer::publish) and [`publish_timeout`](Producer::publish_timeout)
    /// are this, as the port's forms over [`StreamFanout::publish_deadline`](crate::StreamFanout::publish_deadline)).
    ///
    /// # Errors
    /// As [`publish_timeout`](Producer::publish_timeout) with a deadline, as
    /// [`publish`](Producer::publish) without.
    pub fn publish_deadline(&mut self, item: T, deadline: Option<Instant>) -> Result<(), PublishError<T>> {
        self.publisher.publish_until(None, item, deadline)
    }

    /// Publishes `item`, waiting asynchronously while the lane is full. Works on any executor.
    /// Dropping the future drops the item it holds (it was not published).
    ///
    /// # Errors
    /// As [`publish`](Producer::publish).
    pub fn publish_async(&mut self, item: T) -> Publish<'_, T> {
        Publish::own(&mut self.publisher, None, item)
    }

    /// Publishes the longest prefix of `items` that fits now, with one publication step, and
    /// returns its length (>= 1; 0 for no items). Never waits. The published items are moved
    /// out of the front of `items` (no clone, no allocation): `items` keeps the rest, in order.
    ///
    /// # Errors
    /// When not even the first item can go: `PublishError::<usize>::Full(0)`, `Closed(0)`,
    /// `PositionRegressed { item: 0, .. }`, `InvalidPosition(0)` (the payload is how many were
    /// published); `items` is handed back untouched. A prefix stops before an item that would be
    /// refused.
    pub fn try_publish_run(&mut self, items: &mut Vec<T>) -> Result<usize, PublishError<usize>> {
        if items.is_empty() {
            return Ok(0);
        }
        self.publisher.try_step_run(items).map_err(|refusal| refusal.error(0))
    }

    /// Publishes every item of `items`, in order, in as few publication steps as the room
    /// allows, waiting while the lane is full; the items are moved out of `items` as they go
    /// (empty on `Ok`).
    ///
    /// # Errors
    /// [`PublishError`] whose payload is how many items were published; `items` holds exactly
    /// the rest, the refused one first.
    pub fn publish_run(&mut self, items: &mut Vec<T>) -> Result<(), PublishError<usize>> {
        self.publisher.publish_run(items)
    }

    /// Closes the lane ([L10](crate::contract#l10)): consumers receive everything queued or
    /// released, then `None`. Publishing fails with `Closed` from now on, for this and any later
    /// producer. Takes no slot; wakes every waiter. Idempotent.
    pub fn close(&self) {
        self.publisher.close();
    }

    /// Whether the lane was closed.
    pub fn is_closed(&self) -> bool {
        self.publisher.is_closed()
    }

    /// The lane's capacity in items.
    pub fn capacity(&self) -> usize {
        self.publisher.capacity() as usize
    }
}

impl<T> fmt::Debug for Producer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer").field("lanes", &self.publisher.lanes()).finish_non_exhaustive()
    }
}

/// The future of every async publish ([`Fanout::publish_async`](crate::StreamFanout::publish_async),
/// [`Producer::publish_async`], the request lane's): tries to publish, and while refused with
/// `Full` waits for the lane short of room with the task's waker registered (no thread, any
/// executor). Dropping it drops the item it holds (nothing was published).
#[must_use = "futures do nothing unless polled"]
pub struct Publish<'a, T> {
    target: Target<'a, T>,
    item: Option<T>,
    key: Option<u64>,
}

impl<'a, T> Publish<'a, T> {
    pub(crate) fn own(publisher: &'a mut Publisher<T>, to: Option<usize>, item: T) -> Publish<'a, T> {
        Publish { target: Target::Own(publisher, to), item: Some(item), key: None }
    }

    /// A publish through a publisher shared behind `publisher`'s lock, over the one lane `ring`.
    pub(crate) fn shared(publisher: &'a Mutex<Publisher<T>>, ring: &'a Ring<T>, item: T) -> Publish<'a, T> {
        Publish { target: Target::Shared(publisher, ring), item: Some(item), key: None }
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
            match this.target.step(item) {
                Ok(()) => return this.finish(Ok(())),
                Err((back, Refusal::Full { lane, need })) => {
                    this.item = Some(back);
                    if !poll_room(this.target.ring(lane), need, &mut this.key, cx.waker()) {
                        return Poll::Pending;
                    }
                }
                Err((back, refusal)) => return this.finish(Err(refusal.error(back))),
            }
        }
    }
}

impl<T> Publish<'_, T> {
    fn finish(&mut self, done: Result<(), PublishError<T>>) -> Poll<Result<(), PublishError<T>>> {
        self.cancel();
        Poll::Ready(done)
    }

    fn cancel(&mut self) {
        if self.key.is_some() {
            // Every lane's ring waits on the cells' one room list.
            cancel_room(self.target.ring(0), &mut self.key);
        }
    }
}

impl<T> Drop for Publish<'_, T> {
    fn drop(&mut self) {
        self.cancel();
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
