//! One lane: a bounded single-producer/single-consumer ring whose slots are reused only after
//! their item is acked, and its ends.
//!
//! - [`ring`] (private): the shared state and its protocol, one room per side: the slot state
//!   word, the producer side, the consumer side and its seat, acks and the advancer, counters.
//! - `publisher` (private): the one publishing engine behind [`Fanout`], [`Producer`] and the
//!   request lane's senders.
//! - [`Fanout`], [`Producer`], [`Consumer`], [`Delivery`] / [`AckHandle`], [`Run`]: the ends
//!   users hold.
//! - `marks` (private): the lanes' acked marks (written by each lane's advancer), their
//!   lock-free minimum (the watermark) and the watermark's wait list.
//! - [`Lane`]: a handle that hands out the ends; [`Lane::standalone`] builds one outside any
//!   stream for any [`Item`] type.

#[cfg(feature = "futures")]
mod adapter;
mod consumer;
mod delivery;
mod fanout;
pub(crate) mod limits;
pub(crate) mod marks;
mod producer;
mod publisher;
mod ring;
mod run;
pub(crate) mod stats;

use std::fmt;

#[cfg(feature = "futures")]
pub use self::adapter::ConsumerStream;
pub use self::consumer::{Consumer, Recv, RecvRun};
pub use self::delivery::{AckHandle, Delivery};
pub use self::fanout::{Fanout, FanoutPublish, MemoryStats};
pub(crate) use self::limits::{check_budget, check_capacity};
pub use self::limits::{MAX_BUDGET, MAX_CAPACITY};
pub(crate) use self::marks::{AckedMark, Marks};
pub use self::producer::{Producer, Publish};
pub(crate) use self::publisher::{publish_until, Publisher, Target};
pub(crate) use self::ring::{Cells, Ring};
pub use self::run::{Run, RunIter, MAX_RUN};
pub use self::stats::LaneStats;

use crate::error::{BuildError, StreamError};
use crate::item::{Item, LaneItem};
use crate::name::SinkName;
use crate::position::Position;
use crate::sync::Arc;

/// A panic caught while dropping items ([M3](crate::contract#m3)), to resume once the step is done.
pub(crate) type CaughtPanic = Box<dyn std::any::Any + Send>;

/// Keeps the first panic caught in a pass over items; a later one's payload is discarded
/// ([`discard_panic`]), so the pass always reaches its end ([M3](crate::contract#m3)).
pub(crate) fn keep_first_panic(first: &mut Option<CaughtPanic>, caught: CaughtPanic) {
    if first.is_none() {
        *first = Some(caught);
    } else {
        discard_panic(caught);
    }
}

/// Drops a caught panic's payload where its own panic cannot escape (a payload whose drop
/// panics is leaked instead).
pub(crate) fn discard_panic(caught: CaughtPanic) {
    if let Err(again) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(caught))) {
        std::mem::forget(again);
    }
}

/// A handle on one lane: attach its [`Consumer`], close it, read its statistics (and, for a
/// standalone lane, take its [`Producer`]). Cheap to clone.
///
/// A stream's lanes carry [`LaneItem`]s. [`Lane::standalone`] builds a lane outside any stream,
/// for any [`Item`] type (its acked position counts for no watermark).
pub struct Lane<T = LaneItem> {
    name: SinkName,
    ring: Arc<Ring<T>>,
    /// A lane of its own ([`Lane::standalone`]), not one of a stream's.
    standalone: bool,
}

impl<T> Clone for Lane<T> {
    fn clone(&self) -> Self {
        Lane { name: self.name.clone(), ring: self.ring.clone(), standalone: self.standalone }
    }
}

impl<T> Lane<T> {
    /// The lane of `name` over a new ring, one of a stream's.
    pub(crate) fn new(name: SinkName, ring: Ring<T>) -> Lane<T> {
        Lane { name, ring: Arc::new(ring), standalone: false }
    }
}

impl<T: Item> Lane<T> {
    /// A lane of `capacity` slots outside any stream, carrying `T`.
    ///
    /// ```
    /// use lanestream::{Item, Lane, Position, SinkName};
    /// #[derive(Debug)]
    /// struct Tick(u64);
    /// impl Item for Tick {
    ///     fn position(&self) -> Option<Position> { Some(Position(self.0)) }
    /// }
    /// let lane = Lane::standalone(SinkName::new("ticks").unwrap(), 3).unwrap();
    /// let (mut tx, mut rx) = (lane.producer().unwrap(), lane.attach().unwrap());
    /// tx.publish(Tick(5)).unwrap();
    /// rx.try_recv().unwrap().ack().unwrap();
    /// assert_eq!(lane.acked(), Some(Position(5)));
    /// ```
    ///
    /// # Errors
    /// [`BuildError::ZeroCapacity`] for a capacity of 0, [`BuildError::CapacityTooLarge`] above
    /// [`MAX_CAPACITY`].
    pub fn standalone(name: SinkName, capacity: usize) -> Result<Lane<T>, BuildError> {
        check_capacity(capacity, "a standalone lane")?;
        let cells = Arc::new(Cells::new(capacity, None));
        Ok(Lane { standalone: true, ..Lane::new(name, Ring::new(cells, AckedMark::standalone())) })
    }

    /// The lane's ring (for the stream's fan-out publisher).
    pub(crate) fn ring(&self) -> &Arc<Ring<T>> {
        &self.ring
    }

    /// The sink this lane feeds.
    pub fn name(&self) -> &SinkName {
        &self.name
    }

    /// The producer of a [standalone](Lane::standalone) lane ([L9](crate::contract#l9)).
    ///
    /// # Errors
    /// [`StreamError::ProducerBusy`] while another producer of this lane is alive, and for a
    /// lane of a stream (its lanes are published to together, by the stream's
    /// [`Fanout`](crate::Fanout), which holds the role while it lives). Once the producer is
    /// dropped (a restarted ingest engine), this succeeds at once and publishing continues after
    /// the last published item and position.
    pub fn producer(&self) -> Result<Producer<T>, StreamError> {
        let busy = || StreamError::ProducerBusy(self.name.clone());
        if !self.standalone {
            return Err(busy());
        }
        Publisher::claim(self.ring.cells().clone(), Box::new([self.ring.clone()]))
            .map(Producer::new)
            .ok_or_else(busy)
    }

    /// A consumer of the lane, refusing while another consumer of it is alive.
    ///
    /// Deliveries still outstanding from a consumer that was dropped are taken back as by
    /// [`reattach`](Lane::reattach): a late ack of one either lands or is refused with
    /// [`AckError::Detached`](crate::AckError::Detached) and the item is redelivered.
    ///
    /// # Errors
    /// [`StreamError::ConsumerAttached`] while another consumer of the lane is alive.
    pub fn attach(&self) -> Result<Consumer<T>, StreamError> {
        Consumer::attach(self.ring.clone(), false)
            .ok_or_else(|| StreamError::ConsumerAttached(self.name.clone()))
    }

    /// A consumer of the lane that detaches whoever is attached ([L8](crate::contract#l8)):
    /// the previous consumer's receives return `Detached` from then on, and every unacked item is
    /// redelivered to the new one, in order. Never fails. For a restarted sink engine.
    pub fn reattach(&self) -> Consumer<T> {
        Consumer::attach(self.ring.clone(), true).expect("a re-attach never refuses")
    }

    /// Closes the lane without holding the producer: for a supervisor shutting a pipeline down
    /// while the publisher waits in `publish` ([L10](crate::contract#l10)). The lane's consumer
    /// drains, then ends; the stream's fan-out publishes to no lane from then on (an item goes
    /// to every lane or to none). Wakes every waiter; a waiting publish returns `Closed` with its
    /// item.
    pub fn close(&self) {
        self.ring.close();
    }

    /// The lane's acked position ([L5](crate::contract#l5)): the position of the last positioned item in the
    /// contiguous acked prefix.
    pub fn acked(&self) -> Option<Position> {
        self.ring.acked()
    }

    /// The lane's counters, read lock-free.
    pub fn stats(&self) -> LaneStats {
        self.ring.stats()
    }

    /// Whether the lane has nothing queued, released or unacked.
    pub fn is_idle(&self) -> bool {
        self.ring.is_idle()
    }
}

impl<T: Item> fmt::Debug for Lane<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lane").field("name", &self.name).field("stats", &self.stats()).finish()
    }
}
