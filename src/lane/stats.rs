//! [`LaneStats`]: a lane's counters, read lock-free.

use crate::position::Position;

/// A snapshot of one lane's counters, read lock-free from the lane's atomics
/// ([`Lane::stats`](crate::Lane::stats)). The counters are read one after another, not
/// atomically together; each is exact at the moment it was read, and the derived counts never
/// underflow.
///
/// Item counts are in items (batches or `SnapshotComplete`s), not envelopes.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct LaneStats {
    /// Slots in the lane (fixed at build).
    pub capacity: usize,
    /// Published and never delivered.
    pub queued: u64,
    /// Nacked (or taken back by a re-attach) and waiting for redelivery.
    pub released: u64,
    /// Delivered and not yet acked, plus acked items waiting for an earlier item's ack ([L5](crate::contract#l5)).
    pub in_flight: u64,
    /// Deliveries made, redeliveries included.
    pub delivered: u64,
    /// Redeliveries made.
    pub redelivered: u64,
    /// Items ever published on the lane.
    pub published: u64,
    /// Items in the contiguous acked prefix ([L5](crate::contract#l5)).
    pub acked_items: u64,
    /// Acked items whose slot is still held by a detached consumer's stale delivery (a hung
    /// worker, say): they count as acked for the acked position, the watermark and
    /// `is_idle`, but their slots are reused only once every such delivery is dropped, acked or
    /// nacked. A lane whose `pinned` equals its `capacity` cannot take a publish.
    pub pinned: u64,
    /// The position of the last positioned item published, if any.
    pub last_published: Option<Position>,
    /// The lane's acked position: the last positioned item of the contiguous acked prefix ([L5](crate::contract#l5)).
    pub acked: Option<Position>,
    /// Whether the producer side closed the lane.
    pub closed: bool,
}

impl LaneStats {
    /// Items published and not yet acked: `queued + released + in_flight`.
    pub fn lag(&self) -> u64 {
        self.published - self.acked_items
    }

    /// Slots a publish could fill now: `capacity - lag - pinned`.
    pub fn free_slots(&self) -> u64 {
        (self.capacity as u64).saturating_sub(self.lag() + self.pinned)
    }
}
