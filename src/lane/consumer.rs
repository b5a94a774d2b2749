//! [`Consumer`]: the receiving end of a lane.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;

use super::delivery::{AckHandle, Delivery};
use super::ring::{Ring, Take, TakeRun};
use super::run::{Run, MAX_RUN};
use crate::error::{RecvError, RecvTimeoutError, TryRecvError};
#[cfg(doc)]
use crate::port::LaneConsumer;

/// How long a receive blocked by the holder bound parks before it looks again.
const BLOCKED_BACKOFF: Duration = Duration::from_millis(1);

/// Why a receive step delivered nothing.
enum Miss {
    Empty,
    /// The next redelivery waits for a live delivery of its item to end (the holder bound).
    Blocked,
    Closed,
    Detached,
}
use crate::item::Item;
use crate::sync::Arc;

/// The receiving end of one lane.
///
/// Receiving hands out a [`Delivery`]; several may be outstanding at once and be acked in any
/// order from any thread ([L5](crate::contract#l5)). Released items (nacked, or dropped
/// un-acked) are redelivered before any new item ([L2](crate::contract#l2),
/// [L6](crate::contract#l6)). A re-attach ([`Lane::reattach`](crate::Lane::reattach)) detaches
/// this consumer (`Detached` from then on) and hands its unacked items to the new one
/// ([L8](crate::contract#l8)); dropping it lets [`Lane::attach`](crate::Lane::attach) succeed.
///
/// `Consumer<T>` is `Send` only when `T: Send + Sync`.
///
/// Its own methods are the primitives (`try_recv`, `recv_deadline`, the runs', the async and
/// poll forms); the blocking and timed forms (`recv`, `recv_timeout`, `recv_run`,
/// `recv_run_timeout`) are the port's [`LaneConsumer`]'s, provided over the deadline forms, for
/// items that are `Send + Sync` (`recv_deadline(None)` is `recv` for any item).
///
/// ```
/// use lanestream::prelude::*;
/// use lanestream::{MemoryStream, LaneItem, Batch, Position};
/// let stream = MemoryStream::builder().capacity(4).sink("cache").build().unwrap();
/// let lane = stream.lane("cache").unwrap();
/// let mut producer = stream.fanout().unwrap();
/// let mut consumer = lane.attach().unwrap();
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
    /// The waker registration of `poll_recv`.
    poll_key: Option<u64>,
}

impl<T: Item> Consumer<T> {
    /// Attaches a new consumer to `ring`, detaching the previous one if `detach`, else refusing
    /// (`None`) while one is attached.
    pub(crate) fn attach(ring: Arc<Ring<T>>, detach: bool) -> Option<Consumer<T>> {
        let epoch = ring.attach(detach)?;
        Some(Consumer { ring, epoch, cached_tail: 0, poll_key: None })
    }

    fn step(&mut self) -> Result<Delivery<T>, Miss> {
        match self.ring.take(self.epoch, &mut self.cached_tail) {
            Take::Item { index, word } => Ok(Delivery::new(AckHandle::new(self.ring.clone(), index, word))),
            Take::Empty => Err(Miss::Empty),
            Take::Blocked => Err(Miss::Blocked),
            Take::Closed => Err(Miss::Closed),
            Take::Detached => Err(Miss::Detached),
        }
    }

    fn step_run(&mut self, max: usize) -> Result<Run<T>, Miss> {
        match self.ring.take_run(self.epoch, &mut self.cached_tail, max.clamp(1, MAX_RUN)) {
            TakeRun::Run { index, len, attempt, plain } => {
                Ok(Run::new(self.ring.clone(), self.epoch, index, len, attempt, plain))
            }
            TakeRun::Empty => Err(Miss::Empty),
            TakeRun::Blocked => Err(Miss::Blocked),
            TakeRun::Closed => Err(Miss::Closed),
            TakeRun::Detached => Err(Miss::Detached),
        }
    }

    /// Receives the next item if one is queued or released; never blocks, not even while a
    /// publish is half-way ([L12](crate::contract#l12)).
    ///
    /// # Errors
    /// [`TryRecvError::Empty`] (nothing now), [`Closed`](TryRecvError::Closed) (closed and
    /// drained), [`Detached`](TryRecvError::Detached) (a newer consumer took the lane).
    pub fn try_recv(&mut self) -> Result<Delivery<T>, TryRecvError> {
        self.step().map_err(|miss| match miss {
            Miss::Empty | Miss::Blocked => TryRecvError::Empty,
            Miss::Closed => TryRecvError::Closed,
            Miss::Detached => TryRecvError::Detached,
        })
    }

    /// Receives the next item, waiting (spin, then park) while the lane is empty, until
    /// `deadline` at most (`None`: for as long as it takes; the port's
    /// [`recv`](LaneConsumer::recv) and [`recv_timeout`](LaneConsumer::recv_timeout) are this).
    /// `Ok(None)` once the lane is closed and nothing queued or released is left
    /// ([L10](crate::contract#l10)). `None` is not final while deliveries are outstanding: one
    /// nacked (or dropped) after it is released and comes back from the next receive, so a
    /// consumer that wants everything acked keeps receiving until it holds no delivery.
    ///
    /// One case waits by polling instead of parking: when the next redelivery's item already has
    /// [65,535 live deliveries](crate::contract#l8) (each left alive by a re-attach), it is
    /// redelivered only once one of them ends, and the wait looks again every millisecond.
    ///
    /// # Errors
    /// [`RecvTimeoutError::Timeout`] (only with a deadline) if nothing arrived in time (nothing
    /// changed); [`RecvTimeoutError::Detached`] if a newer consumer took the lane, including
    /// while waiting.
    pub fn recv_deadline(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<Option<Delivery<T>>, RecvTimeoutError> {
        self.wait_for(deadline, Consumer::step)
    }

    /// Runs `step` until it delivers, the lane ends or the consumer is detached, waiting in
    /// between (the shared body of the blocking receives and receives of runs).
    fn wait_for<R>(
        &mut self,
        deadline: Option<Instant>,
        mut step: impl FnMut(&mut Self) -> Result<R, Miss>,
    ) -> Result<Option<R>, RecvTimeoutError> {
        // Empty right after a wait said "readable": a nack or a released run was counted and its
        // slots are not switched yet (the count comes first). The nacker is mid-step; back off
        // (under loom: yield) rather than spin on the count.
        let backoff = Backoff::new();
        let mut woken = false;
        loop {
            match step(self) {
                Ok(d) => return Ok(Some(d)),
                Err(Miss::Closed) => return Ok(None),
                Err(Miss::Detached) => return Err(RecvTimeoutError::Detached),
                Err(Miss::Empty) => {
                    if woken {
                        crate::sync::spin(&backoff);
                    }
                    woken = true;
                    if !self.ring.wait_readable(self.epoch, deadline) {
                        return Err(RecvTimeoutError::Timeout);
                    }
                }
                Err(Miss::Blocked) => {
                    // Nothing wakes this wait (the deliveries that block it end on any thread,
                    // without a wake-up): back off with a short timed park instead.
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d) {
                        return Err(RecvTimeoutError::Timeout);
                    }
                    let nap = deadline.map_or(BLOCKED_BACKOFF, |d| (d - now).min(BLOCKED_BACKOFF));
                    crate::sync::park_timeout(nap);
                }
            }
        }
    }

    /// One poll of an asynchronous receive, for hand-written futures and `Stream` adapters:
    /// `Ready` as [`recv`](LaneConsumer::recv) would return, or `Pending` with `cx`'s waker
    /// registered. A consumer keeps one registration, replaced on every poll (so re-polling with
    /// a new waker never grows a list); it is cancelled when the consumer is dropped or a poll
    /// returns `Ready`.
    ///
    /// # Errors
    /// [`RecvError::Detached`].
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Delivery<T>>, RecvError>> {
        let mut key = self.poll_key.take();
        let polled = poll_step(self, &mut key, cx);
        self.poll_key = key;
        polled
    }

    /// Receives the next item, waiting asynchronously; works on any executor. Same results as
    /// [`recv`](LaneConsumer::recv). Dropping the future loses nothing: an item is taken only when
    /// the future completes.
    pub fn recv_async(&mut self) -> Recv<'_, T> {
        Recv { consumer: self, key: None }
    }

    /// Receives a [`Run`] of up to `max` items (clamped to `1..=`[`MAX_RUN`]) if any is queued
    /// or released; never blocks ([L12](crate::contract#l12)). The run holds every item queued
    /// now, up to `max`, in lane order; a released item comes first, in a run of its own
    /// ([L2](crate::contract#l2)). One step of the consumer's seat for the whole run.
    ///
    /// # Errors
    /// As [`try_recv`](Consumer::try_recv).
    ///
    /// ```
    /// use lanestream::prelude::*;
    /// use lanestream::{Batch, LaneItem, MemoryStream, Position, TryRecvError};
    /// let stream = MemoryStream::builder().capacity(8).sink("s").build().unwrap();
    /// let lane = stream.lane("s").unwrap();
    /// let (mut producer, mut consumer) = (stream.fanout().unwrap(), lane.attach().unwrap());
    /// assert!(matches!(consumer.try_recv_run(16), Err(TryRecvError::Empty)));
    /// for p in 1..=3 {
    ///     producer.publish(LaneItem::Batch(Batch::new(Some(Position(p)), Vec::new().into()))).unwrap();
    /// }
    /// let run = consumer.try_recv_run(16).unwrap();
    /// assert_eq!(run.len(), 3);
    /// run.ack().unwrap();
    /// assert_eq!(stream.watermark(), Some(Position(3)));
    /// ```
    pub fn try_recv_run(&mut self, max: usize) -> Result<Run<T>, TryRecvError> {
        self.step_run(max).map_err(|miss| match miss {
            Miss::Empty | Miss::Blocked => TryRecvError::Empty,
            Miss::Closed => TryRecvError::Closed,
            Miss::Detached => TryRecvError::Detached,
        })
    }

    /// Receives a [`Run`] of up to `max` items (as [`try_recv_run`](Consumer::try_recv_run)),
    /// waiting (spin, then park) while the lane is empty, until `deadline` at most (`None`: for
    /// as long as it takes; the port's [`recv_run`](LaneConsumer::recv_run) and
    /// [`recv_run_timeout`](LaneConsumer::recv_run_timeout) are this). `Ok(None)` once the lane
    /// is closed and drained, with the same caveats as
    /// [`recv_deadline`](Consumer::recv_deadline) ([L10](crate::contract#l10)). It does not wait
    /// for a run to fill: it returns as soon as one item is there.
    ///
    /// # Errors
    /// As [`recv_deadline`](Consumer::recv_deadline).
    pub fn recv_run_deadline(
        &mut self,
        max: usize,
        deadline: Option<Instant>,
    ) -> Result<Option<Run<T>>, RecvTimeoutError> {
        self.wait_for(deadline, |c| c.step_run(max))
    }

    /// Receives a [`Run`] of up to `max` items, waiting asynchronously; works on any executor.
    /// Same results as [`recv_run`](LaneConsumer::recv_run). Dropping the future loses nothing: the
    /// items are taken only when it completes.
    pub fn recv_run_async(&mut self, max: usize) -> RecvRun<'_, T> {
        RecvRun { consumer: self, max, key: None }
    }

    /// The caught-up hint ([L11](crate::contract#l11)): nothing queued and nothing released behind the deliveries
    /// already handed out.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// This consumer as a [`futures_core::Stream`] of deliveries (feature `futures`).
    #[cfg(feature = "futures")]
    pub fn into_stream(self) -> super::ConsumerStream<T> {
        super::ConsumerStream::new(self)
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

impl<T> fmt::Debug for Recv<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recv")
            .field("epoch", &self.consumer.epoch)
            .field("waiting", &self.key.is_some())
            .finish()
    }
}

impl<T: Item> Future for Recv<'_, T> {
    type Output = Result<Option<Delivery<T>>, RecvError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        poll_step(this.consumer, &mut this.key, cx)
    }
}

impl<T> Drop for Recv<'_, T> {
    fn drop(&mut self) {
        self.consumer.ring.cancel_readable(&mut self.key);
    }
}

/// The future of [`Consumer::recv_run_async`].
#[must_use = "futures do nothing unless polled"]
pub struct RecvRun<'a, T> {
    consumer: &'a mut Consumer<T>,
    max: usize,
    key: Option<u64>,
}

impl<T> fmt::Debug for RecvRun<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvRun")
            .field("epoch", &self.consumer.epoch)
            .field("max", &self.max)
            .field("waiting", &self.key.is_some())
            .finish()
    }
}

impl<T: Item> Future for RecvRun<'_, T> {
    type Output = Result<Option<Run<T>>, RecvError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let max = this.max;
        poll_with(this.consumer, &mut this.key, cx, |c| c.step_run(max))
    }
}

impl<T> Drop for RecvRun<'_, T> {
    fn drop(&mut self) {
        self.consumer.ring.cancel_readable(&mut self.key);
    }
}

impl<T> Drop for Consumer<T> {
    fn drop(&mut self) {
        self.ring.cancel_readable(&mut self.poll_key);
        self.ring.detach(self.epoch);
    }
}

/// Receives, or registers `cx`'s waker under `key` and returns `Pending`; cancels the
/// registration when it returns `Ready`.
fn poll_step<T: Item>(
    consumer: &mut Consumer<T>,
    key: &mut Option<u64>,
    cx: &mut Context<'_>,
) -> Poll<Result<Option<Delivery<T>>, RecvError>> {
    poll_with(consumer, key, cx, Consumer::step)
}

/// [`poll_step`] for any receive step (single deliveries or runs).
fn poll_with<T: Item, R>(
    consumer: &mut Consumer<T>,
    key: &mut Option<u64>,
    cx: &mut Context<'_>,
    mut step: impl FnMut(&mut Consumer<T>) -> Result<R, Miss>,
) -> Poll<Result<Option<R>, RecvError>> {
    let mut readable_but_empty = false;
    loop {
        let done = match step(consumer) {
            Ok(d) => Ok(Some(d)),
            Err(Miss::Closed) => Ok(None),
            Err(Miss::Detached) => Err(RecvError::Detached),
            Err(Miss::Blocked) => {
                // As in `wait_for`: nothing will wake us, so ask to be polled again and yield
                // to the executor (whose other tasks may hold the blocking deliveries).
                consumer.ring.cancel_readable(key);
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Err(Miss::Empty) => {
                if !consumer.ring.poll_readable(consumer.epoch, key, cx.waker()) {
                    return Poll::Pending;
                }
                if readable_but_empty {
                    // Readable, yet the step found nothing twice: a nack counted its release and
                    // has not switched the slot yet (the count comes first; its nacker is
                    // mid-step on another thread). As `wait_for` backs off, ask to be polled
                    // again and yield to the executor instead of spinning inside this poll.
                    consumer.ring.cancel_readable(key);
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                readable_but_empty = true;
                continue;
            }
        };
        consumer.ring.cancel_readable(key);
        return Poll::Ready(done);
    }
}
