//! The ring: one lane's view of the stream's shared cells — a bounded single-consumer ring of
//! items whose slots are reused only after their item is acked, with out-of-order acks,
//! releases, redelivery and consumer re-attach.
//!
//! # One array, one cursor, a lane each
//! A stream writes each item once into one array of cells ([`Cells`]) and publishes it to every
//! lane with one compare-and-swap of one publication cursor (the LMAX Disruptor's shape: one
//! cursor for all consumers). What is per lane is the consumer's side: each lane has its own
//! state word per slot, its own cursors below, its seat and its acked mark, so each lane behaves
//! as a single-producer/single-consumer lane of its own. A standalone lane and the request lane
//! are streams of one lane.
//!
//! # Indices
//! Four monotonically increasing `u64` counters (they never wrap in practice: 2^64 items) split
//! the published items into ranges; item `i` lives in slot `i % capacity`:
//!
//! ```text
//!   free           acked_end       next           tail
//!    | acked, read  |  delivered    |   queued     |   (empty slots)
//!    | by a stale   |  released     |              |
//!    | handle       |  acked (*)    |              |
//! ```
//! - `tail`: items published, the cursor in [`Cells`] shared by every lane (stored shifted left
//!   by two; bit 0 is `ITEMS_WANTED`, bit 1 `CLOSED`). Advanced only by the publisher, with a
//!   compare-and-swap that fails once `CLOSED` is set: publishing and closing are one atomic
//!   step against each other.
//! - `next`: the lane's first never-delivered item. Written only by its seated consumer.
//! - `acked_end`: the end of the lane's contiguous acked prefix ([L5](crate::contract#l5)); the
//!   lane's acked position is the last positioned item below it. Written only by the advancer.
//! - `free`: every item below it was acked on this lane and its slot emptied. Written only by the
//!   advancer. `free < acked_end` only while a detached consumer's stale handle still reads an
//!   acked item. The publisher may fill cell `tail` while `tail - free < capacity` on every lane,
//!   and drops the items below every lane's `free` at its next publish.
//!
//! (*) an acked item inside `acked_end..next` waits there until every item before it is acked.
//!
//! # Slot states
//! Each slot has one state word per lane, `gen:24 | holders:16 | attempt:16 | tag:8`. Tags:
//! `EMPTY` (free, or published and not yet delivered: `tail`/`next` tell which), `SKIPPED` (an
//! item published to another lane only, passed as acked), `DELIVERED` (the current delivery's
//! handle may ack or nack it), `RELEASED` (nacked or taken back by a re-attach: waits for
//! redelivery) and `ACKED`. `gen` counts the slot's deliveries, so a handle names exactly one
//! delivery: an ack or nack from a handle whose delivery was taken back finds another `gen` (or
//! tag) and fails instead of touching a later delivery.
//!
//! `holders` counts live handles reading the slot's item. A re-attach can release an item while
//! the detached consumer's handle still reads it; the slot is emptied only when it is acked **and**
//! `holders == 0`, so no cell is reused while a redelivery (or a stale delivery) reads it. Because
//! a stale handle keeps its item in the slot, `gen` only has to tell apart the deliveries of one
//! item while a stale handle of it lives: an ABA needs 2^24 redeliveries of that one item in the
//! meantime, and even then the item is acked once, never lost.
//!
//! Keeping the holders in the state word makes an ack one compare-and-swap.
//!
//! # The advancer
//! Acks come from any thread. Moving `free` forward is done by one thread at a time, the
//! advancer, chosen without a lock by the `advance` word: every thread that may have made
//! progress possible adds one request; the thread that moved the count from 0 advances, then
//! tries to swap the word it saw back to 0; if more requests arrived meanwhile it advances again.
//! A request is never lost because all of them are RMWs on one atomic, totally ordered (no
//! `SeqCst` needed). The two low bits of `advance` are wishes: `ROOM_WANTED` (the publisher
//! waits for this lane's room) and `WATERMARK_WANTED` (a confirmer waits for the watermark,
//! [W6](crate::contract#w6)). A waiter sets its bit (RMW) before re-checking; the advancer's
//! final swap sees it and notifies the list the waiter is on. So an ack wakes nobody, at no
//! cost, when nobody waits.
//!
//! # Waking the consumer
//! Bit 0 of the cursor is `ITEMS_WANTED`: a consumer about to wait sets it (RMW) before
//! re-checking the cursor, and publishing is one compare-and-swap on the cursor that sees (and
//! clears) the bit. Rare events (nack, close, re-attach) notify the items list directly.
//!
//! # Plain runs
//! A run taken while nothing of the lane is in flight (every item below `next` acked and its
//! slot emptied: `free == acked_end == next`) is delivered *plain*: no state word is written.
//! The consumer line records the run as `plain_acked..plain_end` (under the seat: its
//! un-acked items), the run's acks move `plain_acked` (under the seat, with the consumer's
//! epoch), and the advancer, on
//! finding a word that is not `ACKED` at `acked_end`, passes everything below `plain_acked` as
//! acked, emptied slots included (their words were never changed). So an in-order run costs
//! its lane a handful of stores whatever its length, as a disruptor consumer's one sequence
//! store, instead of three state-word writes per item. Anything out of the ordinary first turns
//! the plain items into ordinary state words, under the seat: a release (nack or drop) writes
//! `RELEASED` words, a re-attach writes `RELEASED` words holding the old run's one holder (its
//! items turn stale, as delivered items do). The old run learns it from the seat: its epoch is
//! gone. A plain run is first deliveries only, and holds no gap: it reads the run's state
//! words for one only when the lane's `gaps_end` (raised by the publisher with each gap it
//! marks, before publishing it) is past the run's start.
//!
//! # The seat
//! `seat` holds the consumer epoch (`epoch << 2`), an `ATTACHED` bit (a consumer of that epoch
//! is alive) and a `BUSY` bit. A consumer takes the seat with a compare-and-swap from its own
//! epoch for each non-blocking receive step; an attach waits for the seat to be idle, takes it
//! with the next epoch (refusing while `ATTACHED`, unless it re-attaches), releases every
//! `DELIVERED` slot and gives the seat back. The old consumer's next step fails its swap:
//! `Detached`. A consumer that goes away clears `ATTACHED` only if its epoch is still current.
//!
//! # Rooms
//! - `slot.rs`: the slot state word, and the shared cells with their cursor and counters.
//! - `room.rs`: the lane's part in publishing: room, gaps, waiting wishes, closing.
//! - `receive.rs`: the consumer side and the seat: attach, take, waiting for items.
//! - `ack.rs`: handles and the advancer: ack, nack, stale handles, the acked prefix.
//! - `take_run.rs`: runs: one seat step delivering a contiguous run, its acks and nacks with one
//!   advancer request and one wake-up per run; plain runs.
//! - `counters.rs`: lock-free reads: idleness, acked position, counters.
//!
//! The publisher itself (claiming the role, writing cells, the one blocking body) is
//! `lane/publisher.rs`; the wait lists are `crate::wait`.
//!
//! The memory-ordering pairs are named at each atomic operation (`Release` ... pairs with ...).

mod ack;
mod counters;
mod receive;
mod room;
mod slot;
mod take_run;

pub(crate) use self::receive::Take;
pub(crate) use self::slot::attempt;
pub(crate) use self::slot::{Cells, CLOSED};
pub(crate) use self::take_run::TakeRun;

use crossbeam_utils::CachePadded;

use self::slot::{Cell, EMPTY};
use crate::lane::marks::AckedMark;
use crate::sync::{Arc, AtomicBool, AtomicU64, AtomicUsize};

/// "No position" in a cell and in `last_published`.
pub(crate) const NO_POSITION: u64 = u64::MAX;

/// Bit 0 of `advance`: the publisher waits for this lane's room.
const ROOM_WANTED: usize = 1;
/// Bit 1 of `advance`: a confirmer waits for the watermark to move.
const WATERMARK_WANTED: usize = 2;
/// One advance request in `advance`.
const REQUEST_ONE: usize = 4;

/// Written by the seated consumer, and by nacks (`released`) and re-attach (one cache line).
struct ConsumerLine {
    next: AtomicU64,
    seat: AtomicU64,
    released: AtomicUsize,
    /// Live stale handles: deliveries a re-attach took back whose handles have not ended.
    /// Raised by re-attach (under the seat), lowered by each such handle's end.
    stale: AtomicUsize,
    delivered: AtomicU64,
    redelivered: AtomicU64,
    /// The last plain run's un-acked items are `plain_acked..plain_end` ("Plain runs" above).
    /// `plain_end` is written under the seat: set by the run's take, cut back to `plain_acked`
    /// by its release or a re-attach.
    plain_end: AtomicU64,
    /// The end of the plain run's acked prefix: written under the seat (set to the run's start
    /// by its take, moved by its acks), read by the advancer, which passes the items below it
    /// as acked. Only grows.
    plain_acked: AtomicU64,
}

/// Written by the advancer, and by ackers' requests (one cache line).
struct AdvancerLine {
    free: AtomicU64,
    /// The end of the contiguous acked prefix (`free <= acked_end <= next`); items in
    /// `free..acked_end` are acked but still read by a stale handle (their slots wait).
    acked_end: AtomicU64,
    /// `requests << 2 | WATERMARK_WANTED | ROOM_WANTED` (module docs).
    advance: AtomicUsize,
}

/// Read-only after build, read by every side (one cache line, never written).
struct Shape<T> {
    /// Each slot's state word (`gen | holders | attempt | tag`), apart from the cells so that
    /// the consumer side's writes stay off the publisher's cache lines.
    states: Box<[AtomicU64]>,
    /// The stream's cells and publication cursor, shared by every lane.
    cells: Arc<Cells<T>>,
    /// The first of `cells`' cells (a boxed slice: it never moves while `cells` lives), so that
    /// reaching a cell is one load, not two.
    cell_base: *const Cell<T>,
    capacity: u64,
    /// `capacity - 1` when the capacity is a power of two, else `u64::MAX` (use `%`).
    mask: u64,
    /// Where this lane's acked position is published for the watermark.
    mark: AckedMark,
    /// One past the last item ever marked a gap on this lane (0: none), so that a plain run
    /// reads no state word unless a gap may lie in it (P27). Written by the publisher only,
    /// in [`mark_gap`](Ring::mark_gap) (rare: a `publish_to`); it only grows.
    gaps_end: AtomicU64,
}

/// One lane's own state over the stream's shared cells, grouped by writer so that no two sides
/// write one cache line (Rust reorders plain fields, so the groups are padded structs, not field
/// order).
pub(crate) struct Ring<T> {
    cons: CachePadded<ConsumerLine>,
    adv: CachePadded<AdvancerLine>,
    shape: CachePadded<Shape<T>>,
    /// Cold: set once by [`close`](Ring::close).
    closed: AtomicBool,
}

/// Bit 0 of `seat`: the seated consumer (or a re-attach) is inside a step.
const BUSY: u64 = 1;
/// Bit 1 of `seat`: a consumer of the current epoch is alive.
const ATTACHED: u64 = 2;
/// The epoch sits above the two flag bits of `seat`.
const EPOCH_SHIFT: u32 = 2;

// SAFETY: the ring hands out `&T` to handles on other threads (needs `T: Sync`) and reads `T`s
// the publisher moved in from another thread (needs `T: Send`). All other fields are atomics,
// or cells whose accesses the protocol in the module docs serialises.
unsafe impl<T: Send + Sync> Sync for Ring<T> {}
// SAFETY: as above; the ring owns no `T` (the cells do, and drop them).
unsafe impl<T: Send + Sync> Send for Ring<T> {}

impl<T> Ring<T> {
    /// A lane over `cells` (shared by every lane of a stream and written by its publisher),
    /// with as many slots as there are cells, whose acked position is published to `mark`.
    pub(crate) fn new(cells: Arc<Cells<T>>, mark: AckedMark) -> Ring<T> {
        let capacity = cells.capacity();
        let states = (0..capacity).map(|_| AtomicU64::new(EMPTY)).collect();
        Ring {
            cons: CachePadded::new(ConsumerLine {
                next: AtomicU64::new(0),
                seat: AtomicU64::new(0),
                released: AtomicUsize::new(0),
                stale: AtomicUsize::new(0),
                delivered: AtomicU64::new(0),
                redelivered: AtomicU64::new(0),
                plain_end: AtomicU64::new(0),
                plain_acked: AtomicU64::new(0),
            }),
            adv: CachePadded::new(AdvancerLine {
                free: AtomicU64::new(0),
                acked_end: AtomicU64::new(0),
                advance: AtomicUsize::new(0),
            }),
            shape: CachePadded::new(Shape {
                states,
                cell_base: cells.cells.as_ptr(),
                cells,
                capacity,
                mask: slot::mask_of(capacity),
                mark,
                gaps_end: AtomicU64::new(0),
            }),
            closed: AtomicBool::new(false),
        }
    }

    /// The slot of item `index`.
    #[inline]
    fn at(&self, index: u64) -> usize {
        slot::slot_of(index, self.shape.capacity, self.shape.mask)
    }

    /// The state word of item `index`'s slot.
    #[inline]
    fn state(&self, index: u64) -> &AtomicU64 {
        // SAFETY: `at` is below `capacity == states.len()`.
        unsafe { self.shape.states.get_unchecked(self.at(index)) }
    }

    /// The cell (item and position) of item `index`'s slot.
    #[inline]
    fn cell(&self, index: u64) -> &Cell<T> {
        // SAFETY: `cell_base` points at the first of `capacity` cells in `shape.cells`' boxed
        // slice, which this ring keeps alive (its `Arc`) and which never moves; `at` is below
        // `capacity`.
        unsafe { &*self.shape.cell_base.add(self.at(index)) }
    }

    /// The stream's cells (for its publisher).
    pub(crate) fn cells(&self) -> &Arc<Cells<T>> {
        &self.shape.cells
    }
}
