//! [`Consumer`]: the receiving end of a lane.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::delivery::{AckHandle, Delivery};
use crate::item::Item;
use crate::ring::{Ring, Take};
use crate::sync::Arc;
use crate::wait;
use crate::{RecvError, TryRecvError};

/// The receiving end of one lane.
///
/// Receiving hands out a [`Delivery`]; several may be outstanding at once and be acked in any
/// order from any thread (L5). Released items (nacked, or dropped un-acked) are redelivered
/// before any new item (L2, L6). Asking the stream for the lane's consumer again re-attaches
/// (L8): this consumer is detached (`Detached` from then on) and its unacked items go to the new
/// one.
///
/// `Consumer<T>` is `Send` only when `T: Send + Sync`.
///
/// ```
/// use lanestream::{MemoryStream, Stream, LaneItem, Batch, Position};
/// let stream = MemoryStream::builder().capacity(4).sink("cache").build().unwrap();
/// let lane = stream.lane("cache").unwrap();
/// let mut producer = lane.producer().unwrap();
/// let mut consumer = lane.consumer();
/// producer.publish(LaneItem::Batch(Batch::new(Some(Position(7)), Vec::new().into()))).unwrap();
/// producer.close();
/// while let Some(delivery) = consumer.recv().unwrap() {
///     assert_eq!(delivery.position(), Some(Position(7)));
///     delivery.ack().unwrap();
/// }
/// assert_eq!(stream.watermark(), Some(Position(7)));
/// ```
pub struct Consumer<T> {
    ring: Arc<Ring<T>>,
    epoch: u64,
    cached_tail: u64,
}

impl<T: Item> Consumer<T> {
    /// Attaches a new consumer to `ring`, detaching the previous one.
    pub(crate) fn attach(ring: Arc<Ring<T>>) -> Consumer<T> {
        let epoch = ring.attach();
        Consumer { ring, epoch, cached_tail: 0 }
    }

    fn step(&mut self) -> Result<Delivery<T>, TryRecvError> {
        match self.ring.take(self.epoch, &mut self.cached_tail) {
            Take::Item { index, word } => Ok(Delivery::new(AckHandle::new(self.ring.clone(), index, word))),
            Take::Empty => Err(TryRecvError::Empty),
            Take::Closed => Err(TryRecvError::Closed),
            Take::Detached => Err(TryRecvError::Detached),
        }
    }

    /// Receives the next item if one is queued or released; never blocks, not even while a
    /// publish is half-way (L12).
    ///
    /// # Errors
    /// [`TryRecvError::Empty`] (nothing now), [`Closed`](TryRecvError::Closed) (closed and
    /// drained), [`Detached`](TryRecvError::Detached) (a newer consumer took the lane).
    pub fn try_recv(&mut self) -> Result<Delivery<T>, TryRecvError> {
        self.step()
    }

    /// Receives the next item, waiting (spin, then park) while the lane is empty. `Ok(None)`
    /// once the lane is closed and nothing queued or released is left (L10). `None` is not
    /// final while deliveries are outstanding: one nacked (or dropped) after it is released and
    /// comes back from the next receive, so a consumer that wants everything acked keeps
    /// receiving until it holds no delivery.
    ///
    /// # Errors
    /// [`RecvError::Detached`] if a newer consumer took the lane, including while waiting.
    pub fn recv(&mut self) -> Result<Option<Delivery<T>>, RecvError> {
        self.recv_until(None)
    }

    /// As [`recv`](Consumer::recv), waiting at most `timeout`.
    ///
    /// # Errors
    /// [`RecvError::Timeout`] if nothing arrived in time, [`RecvError::Detached`] as for `recv`.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<Delivery<T>>, RecvError> {
        self.recv_until(Some(Instant::now() + timeout))
    }

    fn recv_until(&mut self, deadline: Option<Instant>) -> Result<Option<Delivery<T>>, RecvError> {
        loop {
            match self.step() {
                Ok(d) => return Ok(Some(d)),
                Err(TryRecvError::Closed) => return Ok(None),
                Err(TryRecvError::Detached) => return Err(RecvError::Detached),
                Err(TryRecvError::Empty) => {}
            }
            let (ring, epoch) = (&self.ring, self.epoch);
            if wait::block_until(
                &ring.items,
                || ring.want_items(),
                deadline,
                || ring.readable(epoch).then_some(()),
            )
            .is_none()
            {
                return Err(RecvError::Timeout);
            }
        }
    }

    /// Receives the next item, waiting asynchronously; works on any executor. Same results as
    /// [`recv`](Consumer::recv). Dropping the future loses nothing: an item is taken only when
    /// the future completes.
    pub fn recv_async(&mut self) -> Recv<'_, T> {
        Recv { consumer: self, key: None }
    }

    /// The caught-up hint (L11): nothing queued and nothing released behind the deliveries
    /// already handed out.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// Whether a newer consumer of the lane detached this one.
    pub fn is_detached(&self) -> bool {
        self.ring.epoch() != self.epoch
    }
}

impl<T> fmt::Debug for Consumer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer").field("epoch", &self.epoch).finish_non_exhaustive()
    }
}

/// The future of [`Consumer::recv_async`].
#[must_use = "futures do nothing unless polled"]
pub struct Recv<'a, T> {
    consumer: &'a mut Consumer<T>,
    key: Option<u64>,
}

impl<T: Item> Future for Recv<'_, T> {
    type Output = Result<Option<Delivery<T>>, RecvError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        loop {
            let done = match this.consumer.step() {
                Ok(d) => Ok(Some(d)),
                Err(TryRecvError::Closed) => Ok(None),
                Err(TryRecvError::Detached) => Err(RecvError::Detached),
                Err(TryRecvError::Empty) => {
                    let (ring, epoch) = (&this.consumer.ring, this.consumer.epoch);
                    if wait::poll_until(
                        &ring.items,
                        || ring.want_items(),
                        &mut this.key,
                        cx.waker(),
                        || ring.readable(epoch).then_some(()),
                    )
                    .is_none()
                    {
                        return Poll::Pending;
                    }
                    continue;
                }
            };
            this.consumer.ring.items.cancel(&mut this.key);
            return Poll::Ready(done);
        }
    }
}

impl<T> Drop for Recv<'_, T> {
    fn drop(&mut self) {
        self.consumer.ring.items.cancel(&mut self.key);
    }
}
