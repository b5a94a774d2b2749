//! [`Fanout`]: the one publisher of a stream's lanes, and [`MemoryStats`].

use std::fmt;
use std::time::Instant;

use super::producer::Publish;
use super::publisher::Publisher;
use super::ring::Cells;
use crate::error::{PublishError, StreamError};
use crate::item::LaneItem;
use crate::lane::Lane;
use crate::name::SinkName;
use crate::port::StreamFanout;
use crate::sync::Arc;

/// The one publisher of a stream's lanes ([`Stream::fanout`](crate::Stream::fanout)): writes
/// each item once into the stream's one array of cells and publishes it to every lane with one
/// step for all of them (one compare-and-swap of the stream's cursor, however many lanes), and
/// a run of items with one step for the run.
///
/// It holds the stream's producer role ([L9](crate::contract#l9)): while it lives, no other
/// fan-out of the stream can be taken; dropping it lets a restarted ingest engine take the
/// stream at once, publishing after what was published. Every lane reads the one copy of each
/// item in place ([M2](crate::contract#m2)); an item is dropped once every lane has acked it, at
/// the latest on the fan-out's next publish ([M3](crate::contract#m3)).
///
/// Its surface is the port's [`StreamFanout`] (bring it into scope, or
/// `use lanestream::prelude::*`). **Runs are the fast path**
/// ([`publish_run`](StreamFanout::publish_run)); [`publish`](StreamFanout::publish) is the run of
/// one. An item goes to every lane or to none: a publish waits (or `try_` refuses
/// with `Full`) until every lane has room for it and the [memory
/// budget](crate::StreamBuilder::memory_budget) allows it, and checks its position
/// ([L4](crate::contract#l4)) before it writes anything. A close of any lane stops the fan-out:
/// the publish returns `Closed` with the item, on every lane alike.
///
/// ```
/// use lanestream::prelude::*;
/// use lanestream::{Batch, LaneItem, MemoryStream, Position};
/// let stream = MemoryStream::builder().capacity(4).sinks(["search", "cache"]).build().unwrap();
/// let mut consumers: Vec<_> = stream.lanes().map(|lane| lane.attach().unwrap()).collect();
/// let mut fanout = stream.fanout().unwrap();
/// let batch = |p| LaneItem::Batch(Batch::new(Some(Position(p)), Vec::new().into()));
/// fanout.publish(batch(1)).unwrap();
/// let mut run = vec![batch(2), batch(3)];
/// assert_eq!(fanout.publish_run(&mut run), Ok(()));
/// assert!(run.is_empty()); // moved in; the Vec is kept for the next run
/// for consumer in &mut consumers {
///     let run = consumer.try_recv_run(8).unwrap();
///     assert_eq!(run.len(), 3);
///     run.ack().unwrap();
/// }
/// assert_eq!(stream.watermark(), Some(Position(3)));
/// ```
pub struct Fanout {
    publisher: Publisher<LaneItem>,
}

/// The future of the fan-out's [`publish_async`](StreamFanout::publish_async) (the one async
/// publish, [`Publish`]).
pub type FanoutPublish<'a> = Publish<'a, LaneItem>;

impl Fanout {
    /// Claims the producer role of a stream's `cells`, read by `lanes` (every lane of it).
    pub(crate) fn claim(cells: &Arc<Cells<LaneItem>>, lanes: &[Lane]) -> Result<Fanout, StreamError> {
        let rings = lanes.iter().map(|lane| lane.ring().clone()).collect();
        Publisher::claim(cells.clone(), rings).map(|publisher| Fanout { publisher }).ok_or_else(|| {
            // A stream with no lanes still has one producer role; its error names "stream".
            let name = lanes.first().map(|l| l.name().clone());
            StreamError::ProducerBusy(name.unwrap_or_else(|| SinkName::new("stream").expect("a valid name")))
        })
    }

    /// Whether the stream was closed (some lane was).
    pub fn is_closed(&self) -> bool {
        self.publisher.is_closed()
    }

    /// The items published and not dropped yet, and the bytes they are charged against the
    /// memory budget (0 without a budget): see [`MemoryStream::memory`](crate::MemoryStream::memory).
    pub fn memory(&self) -> MemoryStats {
        MemoryStats::of(self.publisher.cells())
    }
}

/// The memory backend's fan-out: each primitive is one step of the stream's one publisher;
/// `publish` and `publish_timeout` are the port's, over `publish_deadline`.
impl StreamFanout for Fanout {
    fn lanes(&self) -> usize {
        self.publisher.lanes()
    }

    /// Publishes `item` to every lane if every lane has room (and the budget allows it) now;
    /// never waits.
    ///
    /// # Errors
    /// Hands `item` back, no lane got it: [`PublishError::Full`] if some lane has `capacity`
    /// unacked items or the memory budget is spent, [`Closed`](PublishError::Closed) if a
    /// lane is closed, [`PositionRegressed`](PublishError::PositionRegressed) and
    /// [`InvalidPosition`](PublishError::InvalidPosition) ([L4](crate::contract#l4)).
    #[inline]
    fn try_publish(&mut self, item: LaneItem) -> Result<(), PublishError<LaneItem>> {
        self.publisher.try_step(None, item).map_err(|(item, refusal)| refusal.error(item))
    }

    /// Publishes `item` to every lane, waiting (spin, then park) while some lane is full or the
    /// budget is spent ([L3](crate::contract#l3)), until `deadline` at the latest (`None`: for as
    /// long as it takes).
    ///
    /// # Errors
    /// [`PublishError`]: `Timeout` (with a deadline: item handed back, no lane got it),
    /// `Closed`, `PositionRegressed`, `InvalidPosition`; the item handed back.
    #[inline]
    fn publish_deadline(
        &mut self,
        item: LaneItem,
        deadline: Option<Instant>,
    ) -> Result<(), PublishError<LaneItem>> {
        self.publisher.publish_until(None, item, deadline)
    }

    /// Publishes `item` to every lane, waiting asynchronously while some lane is full or the
    /// budget is spent; works on any executor. Dropping the future drops the item it holds (no
    /// lane got it). The future is a [`FanoutPublish`], named here so that it can be stored.
    #[allow(refining_impl_trait)]
    fn publish_async(&mut self, item: LaneItem) -> FanoutPublish<'_> {
        Publish::own(&mut self.publisher, None, item)
    }

    /// Publishes the longest prefix of `items` that every lane has room for (and the budget
    /// allows) now, with one publication step for all lanes, and returns its length (>= 1; 0 for
    /// no items). Never waits. The published items are moved out of the front of `items` into
    /// the one array (no clone, no allocation): `items` keeps the rest, in order, and its
    /// capacity, to be refilled for the next run.
    ///
    /// # Errors
    /// When not even the first item can go: `PublishError::<usize>::Full(0)`, `Closed(0)`,
    /// `PositionRegressed { item: 0, .. }`, `InvalidPosition(0)` (the payload is how many were
    /// published, here always 0); `items` is handed back untouched, the refused item first. A
    /// prefix stops before an item that would be refused.
    #[inline]
    fn try_publish_run(&mut self, items: &mut Vec<LaneItem>) -> Result<usize, PublishError<usize>> {
        if items.is_empty() {
            return Ok(0);
        }
        self.publisher.try_step_run(items).map_err(|refusal| refusal.error(0))
    }

    /// Publishes every item of `items` to every lane, in order, in as few publication steps as
    /// room and budget allow, waiting (spin, then park) while a lane is full. The items are
    /// moved out of `items` as they go: on `Ok` it is empty (its capacity kept).
    ///
    /// # Errors
    /// [`PublishError`] (`Closed`, `PositionRegressed`, `InvalidPosition`) whose payload is how
    /// many items were published (they reached every lane); `items` holds exactly the rest,
    /// none of which reached any lane, the refused one first.
    #[inline]
    fn publish_run(&mut self, items: &mut Vec<LaneItem>) -> Result<(), PublishError<usize>> {
        self.publisher.publish_run(items)
    }

    /// Publishes `item` to lane `lane` only (its index in the stream's sink order), waiting
    /// while it is refused with `Full`: a reply for one sink, such as the snapshot batches of a
    /// [backfill](crate::Request::Backfill) it asked for.
    ///
    /// The item takes a cell, so it needs room on every lane: every other lane's consumer acks
    /// it on its way past without delivering it (a gap; such a lane is not idle until its
    /// consumer passed it, and its acked position may move to the item's position). A position,
    /// if the item has one, must grow past the last published ([L4](crate::contract#l4)).
    ///
    /// # Errors
    /// As [`publish`](StreamFanout::publish).
    ///
    /// # Panics
    /// If `lane` is not below [`lanes`](StreamFanout::lanes).
    fn publish_to(&mut self, lane: usize, item: LaneItem) -> Result<(), PublishError<LaneItem>> {
        assert!(lane < self.lanes(), "publish_to: lane {lane} of {}", self.lanes());
        self.publisher.publish_until(Some(lane), item, None)
    }

    /// As [`publish_to`](StreamFanout::publish_to), never waiting.
    ///
    /// # Errors
    /// As [`try_publish`](StreamFanout::try_publish).
    ///
    /// # Panics
    /// If `lane` is not below [`lanes`](StreamFanout::lanes).
    fn try_publish_to(&mut self, lane: usize, item: LaneItem) -> Result<(), PublishError<LaneItem>> {
        assert!(lane < self.lanes(), "try_publish_to: lane {lane} of {}", self.lanes());
        self.publisher.try_step(Some(lane), item).map_err(|(item, refusal)| refusal.error(item))
    }

    /// Closes every lane ([L10](crate::contract#l10)).
    fn close(&self) {
        self.publisher.close();
    }
}

impl fmt::Debug for Fanout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fanout").field("lanes", &self.lanes()).finish_non_exhaustive()
    }
}

/// What a stream's published items hold in memory ([`MemoryStream::memory`](crate::MemoryStream::memory)):
/// read lock-free, each field exact for the moment it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MemoryStats {
    /// Items published and not dropped yet: unacked on some lane, or acked everywhere and
    /// waiting for the fan-out's next publish to drop them.
    pub held_items: u64,
    /// Their charges in bytes ([`Item::charge`](crate::Item::charge)); counted only on a
    /// stream with a memory budget, else 0.
    pub held_bytes: u64,
    /// The memory budget in bytes, if the stream has one.
    pub budget: Option<u64>,
}

impl MemoryStats {
    pub(crate) fn of<T>(cells: &Cells<T>) -> MemoryStats {
        let (held_items, held_bytes) = cells.held();
        MemoryStats { held_items, held_bytes, budget: cells.budget() }
    }
}
