//! Lane items: [`Batch`], [`LaneItem`] and [`Request`], and the [`Item`] trait the lanes need.

use std::sync::Arc;

use crate::envelope::Envelope;
use crate::name::{IndexName, SinkName};
use crate::position::Position;

/// What a lane needs to know about the values it carries.
///
/// The lanes are generic so that tests can carry instrumented values; the stream carries
/// [`LaneItem`] on sink lanes and [`Request`] on the request lane.
pub trait Item {
    /// The value's position: `Some` for a positioned batch, which must be strictly greater than
    /// the previous positioned value on its lane ([L4](crate::contract#l4)) and which the lane's acked
    /// position and the watermark follow once it is acked; `None` for anything else. It must
    /// give the same answer on every call: a publish reads it more than once (to check it, then
    /// to store it beside the item).
    fn position(&self) -> Option<Position>;

    /// What the value costs against a stream's memory budget, in bytes
    /// ([`StreamBuilder::memory_budget`](crate::StreamBuilder::memory_budget),
    /// [M4](crate::contract#m4)). Computed once per publish, only on a stream with a budget;
    /// the default is the value's own size (`size_of_val(self)`).
    fn charge(&self) -> u64 {
        std::mem::size_of_val(self) as u64
    }
}

/// The fixed charge of one envelope against a memory budget, besides its id's and document's
/// bytes: the envelope's own size in the batch's shared array (`size_of::<Envelope>()`, 168
/// bytes on 64-bit targets), which covers its index name's and id's handles.
pub const ENVELOPE_OVERHEAD: u64 = std::mem::size_of::<Envelope>() as u64;

/// One committed source transaction (or a chunk of snapshot rows), built once and shared by every
/// lane and every redelivery.
///
/// Cloning a batch moves a reference count; the envelopes are never copied.
///
/// ```
/// use std::sync::Arc;
/// use lanestream::{Batch, Position};
/// let b = Batch::new(Some(Position(10)), Arc::from(Vec::new()));
/// assert_eq!(b.position, Some(Position(10)));
/// assert_eq!(b.changes, 0); // an empty transaction still carries its position (I2)
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Batch {
    /// The position of the batch's last change (the commit LSN); `None` for snapshot rows.
    pub position: Option<Position>,
    /// How many changes the source transaction held (for wal2json input: its I/U/D/T actions);
    /// for one chunk of a large transaction, that chunk's share.
    pub changes: u64,
    /// Where this batch's envelopes start within their transaction: the number of envelopes of
    /// the same transaction published in earlier chunks. `0` for a whole transaction, for a
    /// large transaction's first chunk and for snapshot batches.
    ///
    /// A large transaction is published as unpositioned chunks followed by its positioned last
    /// batch, and a sink may ack a chunk as soon as the chunk is durable
    /// ([C1](crate::contract#c1)): after a sink restart, the chunks it acked are not redelivered,
    /// while a restarted source sends the whole transaction again from its start. The offset is
    /// what lets the sink tell the two apart: it resumes a transaction at the envelope its
    /// checkpoint records (skipping `recorded - offset` envelopes of a batch that overlaps it).
    #[cfg_attr(feature = "serde", serde(default))]
    pub offset: u64,
    /// The envelopes, shared: cloning the batch clones this `Arc`, not the documents.
    pub envelopes: Arc<[Envelope]>,
}

impl Batch {
    /// A batch whose `changes` is the number of envelopes, at offset 0 (a whole transaction).
    pub fn new(position: Option<Position>, envelopes: Arc<[Envelope]>) -> Batch {
        Batch { position, changes: envelopes.len() as u64, offset: 0, envelopes }
    }

    /// Which of the three a batch is: a whole transaction (or a large one's last part), a chunk of
    /// a large transaction, or snapshot rows. Told from the positions: only a transaction's batch
    /// is positioned; a chunk's envelopes carry their transaction's commit position, snapshot
    /// rows none.
    ///
    /// ```
    /// use lanestream::{Batch, BatchKind, Position};
    /// assert_eq!(Batch::new(Some(Position(9)), vec![].into()).kind(), BatchKind::Transaction);
    /// assert_eq!(Batch::new(None, vec![].into()).kind(), BatchKind::Snapshot);
    /// ```
    pub fn kind(&self) -> BatchKind {
        match (self.position, self.envelopes.first().and_then(|e| e.position)) {
            (Some(_), _) => BatchKind::Transaction,
            (None, Some(_)) => BatchKind::Chunk,
            (None, None) => BatchKind::Snapshot,
        }
    }
}

/// What a [`Batch`] is ([`Batch::kind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BatchKind {
    /// A committed transaction, or the last part of a large one: positioned; acking it moves the
    /// watermark.
    Transaction,
    /// An unpositioned chunk of a large transaction ([`Batch::offset`] says where it starts);
    /// its envelopes carry the transaction's commit position.
    Chunk,
    /// Snapshot (backfill) rows: upserts, applied at least once, no position anywhere.
    Snapshot,
}

/// What travels on a sink's lane. Serde form: externally tagged, snake_case
/// (`{"batch":{…}}`, `{"snapshot_complete":{"indexes":[…]}}`).
///
/// ```
/// use lanestream::{IndexName, LaneItem};
/// let done = LaneItem::SnapshotComplete { indexes: vec![IndexName::new("users").unwrap()] };
/// assert_eq!(done.position(), None); // I1
/// assert_eq!(serde_json::to_string(&done).unwrap(), r#"{"snapshot_complete":{"indexes":["users"]}}"#);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum LaneItem {
    /// A batch of changes.
    Batch(Batch),
    /// Every snapshot batch for these indexes has been published (answers a
    /// [`Request::Backfill`]).
    SnapshotComplete {
        /// The indexes whose snapshot is complete.
        indexes: Vec<IndexName>,
    },
}

impl LaneItem {
    /// The batch's position; `None` for a snapshot batch and for `SnapshotComplete` ([I1](crate::contract#i1)).
    pub fn position(&self) -> Option<Position> {
        match self {
            LaneItem::Batch(b) => b.position,
            LaneItem::SnapshotComplete { .. } => None,
        }
    }
}

impl Item for LaneItem {
    fn position(&self) -> Option<Position> {
        LaneItem::position(self)
    }

    /// A batch: its documents' and ids' bytes plus [`ENVELOPE_OVERHEAD`] per envelope, plus
    /// the item's own size; `SnapshotComplete`: the item's own size. Shared envelopes are
    /// charged once per publish, however many lanes hold them.
    fn charge(&self) -> u64 {
        let own = std::mem::size_of::<LaneItem>() as u64;
        match self {
            LaneItem::Batch(b) => {
                own + b
                    .envelopes
                    .iter()
                    .map(|e| e.document.len() as u64 + e.id.len() as u64 + ENVELOPE_OVERHEAD)
                    .sum::<u64>()
            }
            _ => own,
        }
    }
}

impl From<Batch> for LaneItem {
    fn from(b: Batch) -> Self {
        LaneItem::Batch(b)
    }
}

/// What travels on the request lane, from sink engines up to the ingest engine. Serde form:
/// externally tagged, snake_case (`{"backfill":{"sink":"search","indexes":["users"]}}`);
/// `after` is left out when `None` and read as `None` when absent, so JSON written before the
/// field existed still reads.
///
/// ```
/// use lanestream::{IndexName, Request, SinkName};
/// let r = Request::backfill(SinkName::new("search").unwrap(), vec![IndexName::new("users").unwrap()]);
/// assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"backfill":{"sink":"search","indexes":["users"]}}"#);
/// let resumed = Request::Backfill {
///     sink: SinkName::new("search").unwrap(),
///     indexes: vec![IndexName::new("users").unwrap()],
///     after: Some("42".into()),
/// };
/// assert_eq!(
///     serde_json::to_string(&resumed).unwrap(),
///     r#"{"backfill":{"sink":"search","indexes":["users"],"after":"42"}}"#
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum Request {
    /// Send a snapshot of these indexes to this sink, then `SnapshotComplete`.
    Backfill {
        /// The sink that asks.
        sink: SinkName,
        /// The indexes to snapshot, served in this order.
        indexes: Vec<IndexName>,
        /// Where the first index resumes: `Some(id)` skips its rows up to and including the row
        /// whose envelope id ([`Envelope::id`]) is `id`, in the source's key order (a sink
        /// re-sends the id of the last snapshot row it applied after a crash); `None` starts
        /// every index from its first row. The other indexes always start from their first row.
        #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
        after: Option<String>,
    },
}

impl Request {
    /// `Backfill { sink, indexes, after: None }`: a snapshot of `indexes` from their first
    /// rows, for `sink`.
    pub fn backfill(sink: SinkName, indexes: Vec<IndexName>) -> Request {
        Request::Backfill { sink, indexes, after: None }
    }
}

impl Item for Request {
    /// Requests are never positioned: they never move the watermark ([W2](crate::contract#w2)).
    fn position(&self) -> Option<Position> {
        None
    }
}
