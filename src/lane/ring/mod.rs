//! The ring: a bounded single-producer/single-consumer ring of items whose slots are reused only
//! after their item is acked, with out-of-order acks, releases, redelivery and consumer re-attach.
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
//! - `tail`: items published (stored shifted left by two; bit 0 is `ITEMS_WANTED`, bit 1
//!   `CLOSED`). Advanced only by the producer, with a compare-and-swap that fails once `CLOSED`
//!   is set: publishing and closing are one atomic step against each other.
//! - `next`: the first never-delivered item. Written only by the seated consumer.
//! - `acked_end`: the end of the contiguous acked prefix ([L5](crate::contract#l5)); the lane's acked position is the
//!   last positioned item below it. Written only by the advancer (see below).
//! - `free`: every item below it was acked and its slot emptied. Written only by the advancer.
//!   `free < acked_end` only while a detached consumer's stale handle still reads an acked
//!   item. The producer may fill slot `tail` while `tail - free < capacity`.
//!
//! (*) an acked item inside `acked_end..next` waits there until every item before it is acked.
//!
//! # Slot states
//! Each slot has one state word `gen:24 | holders:16 | attempt:16 | tag:8`. Tags: `EMPTY` (free,
//! or published and not yet delivered: `tail`/`next` tell which), `DELIVERED` (the current
//! delivery's handle may ack or nack it), `RELEASED` (nacked or taken back by a re-attach: waits
//! for redelivery) and `ACKED`. `gen` counts the slot's deliveries, so a handle names exactly one
//! delivery: an ack or nack from a handle whose delivery was taken back finds another `gen` (or
//! tag) and fails instead of touching a later delivery.
//!
//! `holders` counts live handles reading the slot's item. A re-attach can release an item while
//! the detached consumer's handle still reads it; the slot is emptied only when it is acked **and**
//! `holders == 0`, so no slot is reused while a redelivery (or a stale delivery) reads it. Because
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
//! `SeqCst` needed). Bit 0 of `advance` is `ROOM_WANTED`: a producer waiting for room sets it
//! (RMW) before re-checking `free`; the advancer's final swap sees it and wakes the producer. So
//! an ack wakes nobody, at no cost, when nobody waits.
//!
//! # Waking the consumer
//! Bit 0 of `tail` is `ITEMS_WANTED`: a consumer about to wait sets it (RMW) before re-checking
//! `tail`, and publishing is one compare-and-swap on `tail` that sees (and clears) the bit. Rare events (nack,
//! close, re-attach) notify through the wait list's own counter (`wait.rs`).
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
//! - `slot.rs`: the slot and its state word (tags, holder count and its bound, generation).
//! - `publish.rs`: the producer side: the producer role, publishing, waiting for room, closing.
//! - `receive.rs`: the consumer side and the seat: attach, take, waiting for items.
//! - `ack.rs`: handles and the advancer: ack, nack, stale handles, the acked prefix.
//! - `run.rs`: runs: one seat step delivering a contiguous run, its acks and nacks with one
//!   advancer request and one wake-up per run (the per-item protocol unchanged).
//! - `stats.rs`: lock-free reads: idleness, acked position, counters.
//! - `wait.rs`: the wait lists (spin then park, or a registered waker), private to the ring.
//!
//! The memory-ordering pairs are named at each atomic operation (`Release` ... pairs with ...).

mod ack;
mod publish;
mod receive;
mod run;
mod slot;
mod stats;
mod wait;

pub(crate) use self::publish::ProducerState;
pub(crate) use self::receive::Take;
pub(crate) use self::run::TakeRun;
pub(crate) use self::slot::attempt;
pub(crate) use self::slot::Cells;

use std::panic::{self, AssertUnwindSafe};
use std::ptr;

use crossbeam_utils::CachePadded;

use self::slot::{Cell, EMPTY};
use self::wait::WaitList;
use crate::stream::watermark::AckedMark;
use crate::sync::{Arc, AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// "No position" in a slot and in `last_published`.
pub(crate) const NO_POSITION: u64 = u64::MAX;

/// Bit 0 of `tail`: a consumer waits for items.
const ITEMS_WANTED: u64 = 1;
/// Bit 1 of `tail`: the lane is closed.
const CLOSED: u64 = 2;
/// The published count sits above the two flag bits of `tail`.
const TAIL_SHIFT: u32 = 2;
/// Bit 0 of `advance`: a producer waits for room.
const ROOM_WANTED: usize = 1;
/// One advance request in `advance`.
const REQUEST_ONE: usize = 2;

/// Written by the producer (one cache line).
struct ProducerLine {
    /// `published << 2 | CLOSED | ITEMS_WANTED`.
    tail: AtomicU64,
    last_published: AtomicU64,
}

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
}

/// Written by the advancer, and by ackers' requests (one cache line).
struct AdvancerLine {
    free: AtomicU64,
    /// The end of the contiguous acked prefix (`free <= acked_end <= next`); items in
    /// `free..acked_end` are acked but still read by a stale handle (their slots wait).
    acked_end: AtomicU64,
    /// `requests << 1 | ROOM_WANTED` (module docs).
    advance: AtomicUsize,
}

/// Read-only after build, read by every side (one cache line, never written).
struct Shape<T> {
    /// Each slot's state word (`gen | holders | attempt | tag`), apart from the items so that
    /// the consumer side's writes stay off the producer's cache lines.
    states: Box<[AtomicU64]>,
    /// Each slot's item and position: the lane's own, or the stream's shared ring's.
    cells: Arc<Cells<T>>,
    /// The first of `cells`' cells (a boxed slice: it never moves while `cells` lives), so that
    /// reaching a cell is one load, not two.
    cell_base: *const Cell<T>,
    /// `cells.shared`, here for the same reason.
    shared: bool,
    capacity: u64,
    /// `capacity - 1` when the capacity is a power of two, else `u64::MAX` (use `%`).
    mask: u64,
    /// Where this lane's acked position is published for the watermark.
    mark: AckedMark,
}

/// One lane's shared state, grouped by writer so that no two sides write one cache line (Rust
/// reorders plain fields, so the groups are padded structs, not field order).
pub(crate) struct Ring<T> {
    prod: CachePadded<ProducerLine>,
    cons: CachePadded<ConsumerLine>,
    adv: CachePadded<AdvancerLine>,
    shape: CachePadded<Shape<T>>,
    // Cold: written on close, producer hand-over and waits only.
    producer_live: AtomicBool,
    /// Consumers wait here for items; notified by publish (when `ITEMS_WANTED`), nack, close
    /// and re-attach.
    items: WaitList,
    /// Producers wait here for room; notified by the advancer (when `ROOM_WANTED`) and close.
    room: WaitList,
}

/// Bit 0 of `seat`: the seated consumer (or a re-attach) is inside a step.
const BUSY: u64 = 1;
/// Bit 1 of `seat`: a consumer of the current epoch is alive.
const ATTACHED: u64 = 2;
/// The epoch sits above the two flag bits of `seat`.
const EPOCH_SHIFT: u32 = 2;

// SAFETY: the ring hands out `&T` to handles on other threads (needs `T: Sync`) and moves `T`
// between the producer, the consumer's threads and the advancer (needs `T: Send`). All other
// fields are atomics, or cells whose accesses the protocol in the module docs serialises.
unsafe impl<T: Send + Sync> Sync for Ring<T> {}
// SAFETY: as above; the ring owns `T`s and drops them on whatever thread drops it last.
unsafe impl<T: Send + Sync> Send for Ring<T> {}

impl<T> Ring<T> {
    /// A ring of `capacity` (>= 1) slots with cells of its own, whose acked position is
    /// published to `mark`.
    pub(crate) fn new(capacity: usize, mark: AckedMark) -> Ring<T> {
        assert!(capacity > 0, "ring capacity must be at least 1");
        Ring::with_cells(Arc::new(Cells::new(capacity, false)), mark)
    }

    /// A ring over `cells` (own, or shared by every lane of a stream and written by its
    /// fan-out), with as many slots as there are cells.
    pub(crate) fn with_cells(cells: Arc<Cells<T>>, mark: AckedMark) -> Ring<T> {
        let capacity = cells.cells.len() as u64;
        assert!(capacity > 0, "ring capacity must be at least 1");
        let states = (0..capacity).map(|_| AtomicU64::new(EMPTY)).collect();
        Ring {
            prod: CachePadded::new(ProducerLine {
                tail: AtomicU64::new(0),
                last_published: AtomicU64::new(NO_POSITION),
            }),
            cons: CachePadded::new(ConsumerLine {
                next: AtomicU64::new(0),
                seat: AtomicU64::new(0),
                released: AtomicUsize::new(0),
                stale: AtomicUsize::new(0),
                delivered: AtomicU64::new(0),
                redelivered: AtomicU64::new(0),
            }),
            adv: CachePadded::new(AdvancerLine {
                free: AtomicU64::new(0),
                acked_end: AtomicU64::new(0),
                advance: AtomicUsize::new(0),
            }),
            shape: CachePadded::new(Shape {
                states,
                cell_base: cells.cells.as_ptr(),
                shared: cells.shared,
                cells,
                capacity,
                mask: slot::mask_of(capacity),
                mark,
            }),
            producer_live: AtomicBool::new(false),
            items: WaitList::new(2),
            room: WaitList::new(2),
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

    /// Whether the ring's cells are shared by every lane of a stream (written by its fan-out).
    #[inline]
    pub(crate) fn is_shared(&self) -> bool {
        self.shape.shared
    }

    /// The ring's cells (for the fan-out of a shared ring).
    pub(crate) fn cells(&self) -> &Arc<Cells<T>> {
        &self.shape.cells
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.shape.capacity
    }
}

impl<T> Drop for Ring<T> {
    /// [M3](crate::contract#m3): drops every item still in the ring's own cells (published and
    /// not yet emptied by an ack); shared cells drop their items themselves. Keeps going when an
    /// item's Drop panics, then resumes the first panic.
    fn drop(&mut self) {
        if self.is_shared() {
            return;
        }
        // `&mut self`: no other thread can hold a handle (each holds an `Arc` of the ring).
        let free = self.adv.free.load(Ordering::Relaxed);
        let tail = self.prod.tail.load(Ordering::Relaxed) >> TAIL_SHIFT;
        let mut first_panic = None;
        for i in free..tail {
            // SAFETY: items `free..tail` of own cells are initialised and nothing else references
            // them now (the cells are this ring's alone).
            let item = unsafe { self.cell(i).item.with(|c| ptr::read(c).assume_init()) };
            if let Err(p) = panic::catch_unwind(AssertUnwindSafe(move || drop(item))) {
                first_panic.get_or_insert(p);
            }
        }
        if let Some(p) = first_panic {
            if !std::thread::panicking() {
                panic::resume_unwind(p);
            }
        }
    }
}
