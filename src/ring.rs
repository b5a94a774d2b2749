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
//! - `tail`: items published (stored shifted left by one; bit 0 is `ITEMS_WANTED`). Advanced
//!   only by the producer.
//! - `next`: the first never-delivered item. Written only by the seated consumer.
//! - `acked_end`: the end of the contiguous acked prefix (L5); the lane's acked position is the
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
//! `tail`, and publishing is one `fetch_add` on `tail` that sees the bit. Rare events (nack,
//! close, re-attach) notify through the wait list's own counter (`wait.rs`).
//!
//! # The seat
//! `seat` holds the consumer epoch (`epoch << 1`) and a `BUSY` bit. A consumer takes the seat
//! with a compare-and-swap from its own epoch for each non-blocking receive step; a re-attach
//! waits for the seat to be idle, takes it with the next epoch, releases every `DELIVERED` slot
//! and gives the seat back. The old consumer's next step fails its swap: `Detached`.
//!
//! The memory-ordering pairs are named at each atomic operation (`Release` ... pairs with ...).

use std::mem::MaybeUninit;
use std::panic::{self, AssertUnwindSafe};
use std::ptr;
use std::sync::Arc as StdArc;
use std::task::Waker;
use std::time::Instant;

use crossbeam_utils::{Backoff, CachePadded};

use crate::item::Item;
use crate::stats::LaneStats;
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Ordering, UnsafeCell};
use crate::wait::{self, WaitList};
use crate::Position;

/// "No position" in a slot and in `last_published`.
pub(crate) const NO_POSITION: u64 = u64::MAX;

/// A lane's acked mark holds its acked position plus one, and 0 before the first positioned ack
/// (`u64::MAX` is never a position, so `+ 1` never overflows). With this encoding the watermark
/// is a plain minimum: any unset lane makes it 0.
pub(crate) const NO_MARK: u64 = 0;

const TAG_MASK: u64 = 0xFF;
const ATTEMPT_SHIFT: u32 = 8;
const ATTEMPT_MASK: u64 = 0xFFFF << ATTEMPT_SHIFT;
const HOLDER_SHIFT: u32 = 24;
const HOLDER_ONE: u64 = 1 << HOLDER_SHIFT;
const HOLDER_MASK: u64 = 0xFFFF << HOLDER_SHIFT;
const GEN_SHIFT: u32 = 40;
const GEN_ONE: u64 = 1 << GEN_SHIFT;
const GEN_MASK: u64 = !(GEN_ONE - 1);

/// Bit 0 of `tail`: a consumer waits for items.
const ITEMS_WANTED: u64 = 1;
/// One published item in `tail`.
const TAIL_ONE: u64 = 2;
/// Bit 0 of `advance`: a producer waits for room.
const ROOM_WANTED: usize = 1;
/// One advance request in `advance`.
const REQUEST_ONE: usize = 2;

pub(crate) const EMPTY: u64 = 0;
pub(crate) const DELIVERED: u64 = 1;
pub(crate) const RELEASED: u64 = 2;
pub(crate) const ACKED: u64 = 3;

#[inline]
pub(crate) fn tag(word: u64) -> u64 {
    word & TAG_MASK
}

#[inline]
fn with_tag(word: u64, t: u64) -> u64 {
    (word & !TAG_MASK) | t
}

/// The attempt number (1 = first delivery) recorded in a state word.
#[inline]
pub(crate) fn attempt(word: u64) -> u32 {
    ((word & ATTEMPT_MASK) >> ATTEMPT_SHIFT) as u32
}

#[inline]
fn holders(word: u64) -> u64 {
    (word & HOLDER_MASK) >> HOLDER_SHIFT
}

#[inline]
pub(crate) fn gen(word: u64) -> u64 {
    word & GEN_MASK
}

/// The word of the next delivery of a slot whose current word is `word`: next generation, one
/// more holder, `attempt` (saturating at 16 bits), `DELIVERED`.
#[inline]
fn delivered_word(word: u64, attempt: u32) -> u64 {
    debug_assert!(holders(word) < 0xFFFF, "too many live handles on one item");
    gen(word).wrapping_add(GEN_ONE)
        | ((word & HOLDER_MASK) + HOLDER_ONE)
        | (u64::from(attempt.min(0xFFFF)) << ATTEMPT_SHIFT)
        | DELIVERED
}

/// The acked marks of a set of lanes, one cache line each, read together by the watermark.
pub(crate) type Marks = StdArc<[CachePadded<AtomicU64>]>;

/// One slot, on a cache line of its own (a `LaneItem` slot is exactly 64 bytes): the consumer
/// writes the state word of slot `i` while the producer fills slot `i + 1`, and without the
/// alignment the two would share a line and bounce it between the cores on every item.
#[repr(align(64))]
struct Slot<T> {
    /// `gen | holders | attempt | tag` (module docs).
    state: AtomicU64,
    /// The item's position, or `NO_POSITION`. Written by the producer with the item.
    position: UnsafeCell<u64>,
    /// Initialised for items in `free..tail`.
    item: UnsafeCell<MaybeUninit<T>>,
}

/// What the seated consumer found.
pub(crate) enum Take {
    /// A delivery of item `index`, with the slot's new state word.
    Item {
        index: u64,
        word: u64,
    },
    Empty,
    Closed,
    Detached,
}

/// Written by the producer (one cache line).
struct ProducerLine {
    /// `published << 1 | ITEMS_WANTED`.
    tail: AtomicU64,
    last_published: AtomicU64,
}

/// Written by the seated consumer, and by nacks (`released`) and re-attach (one cache line).
struct ConsumerLine {
    next: AtomicU64,
    seat: AtomicU64,
    released: AtomicUsize,
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
    slots: Box<[Slot<T>]>,
    capacity: u64,
    /// `capacity - 1` when the capacity is a power of two, else `u64::MAX` (use `%`).
    mask: u64,
    marks: Marks,
    mark: usize,
}

/// One lane's shared state, grouped by writer so that no two sides write one cache line (Rust
/// reorders plain fields, so the groups are padded structs, not field order).
pub(crate) struct Ring<T> {
    prod: CachePadded<ProducerLine>,
    cons: CachePadded<ConsumerLine>,
    adv: CachePadded<AdvancerLine>,
    shape: CachePadded<Shape<T>>,
    // Cold: written on close, producer hand-over and waits only.
    closed: AtomicBool,
    producer_live: AtomicBool,
    /// Consumers wait here for items; notified by publish (when `ITEMS_WANTED`), nack, close
    /// and re-attach.
    pub(crate) items: WaitList,
    /// Producers wait here for room; notified by the advancer (when `ROOM_WANTED`) and close.
    pub(crate) room: WaitList,
}

const BUSY: u64 = 1;

// SAFETY: the ring hands out `&T` to handles on other threads (needs `T: Sync`) and moves `T`
// between the producer, the consumer's threads and the advancer (needs `T: Send`). All other
// fields are atomics, or cells whose accesses the protocol in the module docs serialises.
unsafe impl<T: Send + Sync> Sync for Ring<T> {}
// SAFETY: as above; the ring owns `T`s and drops them on whatever thread drops it last.
unsafe impl<T: Send + Sync> Send for Ring<T> {}

impl<T> Ring<T> {
    /// A ring of `capacity` (>= 1) slots whose acked position is `marks[mark]`.
    pub(crate) fn new(capacity: usize, marks: Marks, mark: usize) -> Ring<T> {
        assert!(capacity > 0, "ring capacity must be at least 1");
        let slots = (0..capacity)
            .map(|_| Slot {
                state: AtomicU64::new(EMPTY),
                position: UnsafeCell::new(NO_POSITION),
                item: UnsafeCell::new(MaybeUninit::uninit()),
            })
            .collect();
        let capacity = capacity as u64;
        Ring {
            prod: CachePadded::new(ProducerLine {
                tail: AtomicU64::new(0),
                last_published: AtomicU64::new(NO_POSITION),
            }),
            cons: CachePadded::new(ConsumerLine {
                next: AtomicU64::new(0),
                seat: AtomicU64::new(0),
                released: AtomicUsize::new(0),
                delivered: AtomicU64::new(0),
                redelivered: AtomicU64::new(0),
            }),
            adv: CachePadded::new(AdvancerLine {
                free: AtomicU64::new(0),
                acked_end: AtomicU64::new(0),
                advance: AtomicUsize::new(0),
            }),
            shape: CachePadded::new(Shape {
                slots,
                capacity,
                mask: if capacity.is_power_of_two() { capacity - 1 } else { u64::MAX },
                marks,
                mark,
            }),
            closed: AtomicBool::new(false),
            producer_live: AtomicBool::new(false),
            items: WaitList::new(2),
            room: WaitList::new(2),
        }
    }

    #[inline]
    fn slot(&self, index: u64) -> &Slot<T> {
        let i =
            if self.shape.mask != u64::MAX { index & self.shape.mask } else { index % self.shape.capacity };
        debug_assert!(i < self.shape.capacity);
        // SAFETY: `i < capacity == slots.len()` by the mask/modulo above.
        unsafe { self.shape.slots.get_unchecked(i as usize) }
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.shape.capacity
    }

    // ----- producer side -------------------------------------------------------------------

    /// Items published so far.
    #[inline]
    fn published(&self) -> u64 {
        // Acquire: pairs with the producer's Release `fetch_add` on `tail` (the slot's item and
        // position are initialised).
        self.prod.tail.load(Ordering::Acquire) >> 1
    }

    /// Claims the producer role. `None` if a live producer holds it (L9).
    pub(crate) fn claim_producer(&self) -> Option<ProducerState> {
        // Acquire: pairs with `release_producer`'s Release, so a restarted producer sees the
        // previous producer's `tail` and `last_published`.
        self.producer_live.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).ok()?;
        Some(ProducerState {
            // Relaxed: advanced only by producers, ordered by the claim above.
            tail: self.prod.tail.load(Ordering::Relaxed) >> 1,
            cached_free: self.adv.free.load(Ordering::Acquire),
            last: self.prod.last_published.load(Ordering::Relaxed),
        })
    }

    /// Gives the producer role back.
    pub(crate) fn release_producer(&self) {
        // Release: pairs with `claim_producer`'s Acquire.
        self.producer_live.store(false, Ordering::Release);
    }

    /// Publishes `item` unless the lane is closed, full, or the position regresses.
    ///
    /// The caller must hold the producer role (the `ProducerState` came from `claim_producer`
    /// and is used by one thread at a time).
    pub(crate) fn try_push(&self, p: &mut ProducerState, item: T) -> Result<(), crate::PublishError<T>>
    where
        T: Item,
    {
        use crate::PublishError;
        // Acquire: pairs with `close`'s Release (for a restarted producer's sake).
        if self.closed.load(Ordering::Acquire) {
            return Err(PublishError::Closed(item));
        }
        let position = match item.position() {
            Some(Position(u64::MAX)) => return Err(PublishError::InvalidPosition(item)),
            Some(pos) => {
                if p.last != NO_POSITION && pos.0 <= p.last {
                    return Err(PublishError::PositionRegressed {
                        item,
                        position: pos,
                        last: Position(p.last),
                    });
                }
                pos.0
            }
            None => NO_POSITION,
        };
        if p.tail - p.cached_free >= self.shape.capacity {
            // Acquire: pairs with the advancer's Release store of `free`: the slot's old item
            // was moved out before we overwrite it.
            p.cached_free = self.adv.free.load(Ordering::Acquire);
            if p.tail - p.cached_free >= self.shape.capacity {
                return Err(PublishError::Full(item));
            }
        }
        let slot = self.slot(p.tail);
        // SAFETY: item `tail` is not published, and `tail - free < capacity` means the slot's
        // previous item (`tail - capacity`) was moved out by the advancer, which then stored
        // `free` with Release (acquired above). No other thread touches the slot's cells until
        // the `tail` update below publishes them.
        unsafe {
            slot.item.with_mut(|c| (*c).write(item));
            slot.position.with_mut(|c| *c = position);
        }
        p.tail += 1;
        if position != NO_POSITION {
            p.last = position;
            // Relaxed: statistics, and a restarted producer reads it after `claim_producer`.
            self.prod.last_published.store(position, Ordering::Relaxed);
        }
        // Release: pairs with the consumer's Acquire loads of `tail` (publishes the slot).
        // An RMW, so it also sees an `ITEMS_WANTED` set by a consumer about to wait: either we
        // see the bit, or the consumer's RMW comes after ours and its re-check sees the item.
        let before = self.prod.tail.fetch_add(TAIL_ONE, Ordering::Release);
        if before & ITEMS_WANTED != 0 {
            // Relaxed: the wait list's own RMWs order the wake-up.
            self.prod.tail.fetch_and(!ITEMS_WANTED, Ordering::Relaxed);
            self.items.notify();
        }
        Ok(())
    }

    /// Marks that a consumer is about to wait for items (before its re-check).
    pub(crate) fn want_items(&self) {
        // AcqRel RMW: see `try_push`.
        self.prod.tail.fetch_or(ITEMS_WANTED, Ordering::AcqRel);
    }

    /// Marks that a producer is about to wait for room (before its re-check).
    pub(crate) fn want_room(&self) {
        // AcqRel RMW: totally ordered with the advancer's final compare-and-swap, which either
        // sees the bit (and wakes us) or is read by this RMW, so our re-check sees its `free`.
        self.adv.advance.fetch_or(ROOM_WANTED, Ordering::AcqRel);
    }

    /// Whether a publish could make progress now: room in the ring, or the lane closed.
    fn writable(&self) -> bool {
        // Acquire: `free` as in `try_push`, `closed` pairs with `close`. Load `free` first: both
        // counters only grow and `free <= tail`, so `tail - free` cannot underflow.
        let free = self.adv.free.load(Ordering::Acquire);
        self.closed.load(Ordering::Acquire) || self.published() - free < self.shape.capacity
    }

    /// Waits (spin, then park) until a publish could make progress. `false` if `deadline`
    /// passed first.
    pub(crate) fn wait_writable(&self, deadline: Option<Instant>) -> bool {
        wait::block_until(&self.room, || self.want_room(), deadline, || self.writable().then_some(()))
            .is_some()
    }

    /// One poll of the async form of [`wait_writable`](Ring::wait_writable); the caller keeps
    /// `key` and cancels it when its future is dropped.
    pub(crate) fn poll_writable(&self, key: &mut Option<u64>, waker: &Waker) -> bool {
        wait::poll_until(&self.room, || self.want_room(), key, waker, || self.writable().then_some(()))
            .is_some()
    }

    /// Publishes `item` with `try_push`, waiting for room while it comes back `Full`: the
    /// blocking publish of the lane producer and of the request lane's senders.
    pub(crate) fn publish_until(
        &self,
        mut item: T,
        deadline: Option<Instant>,
        mut try_push: impl FnMut(T) -> Result<(), crate::PublishError<T>>,
    ) -> Result<(), crate::PublishError<T>> {
        loop {
            match try_push(item) {
                Err(crate::PublishError::Full(back)) => item = back,
                done => return done,
            }
            if !self.wait_writable(deadline) {
                return Err(crate::PublishError::Timeout(item));
            }
        }
    }

    /// Closes the lane (L10): publishing fails with `Closed` from now on, consumers drain what
    /// is queued or released and then see the end. Takes no slot. Wakes every waiter.
    pub(crate) fn close(&self) {
        // Release: pairs with the consumer's Acquire load of `closed`, which it makes before
        // re-reading `tail`, so a consumer that sees the close also sees every item published
        // before it.
        self.closed.store(true, Ordering::Release);
        self.items.notify();
        self.room.notify();
    }

    pub(crate) fn is_closed(&self) -> bool {
        // Acquire: pairs with `close`'s Release.
        self.closed.load(Ordering::Acquire)
    }

    // ----- consumer side -------------------------------------------------------------------

    /// Attaches a new consumer (L8): detaches the previous one, releases every delivered item
    /// for redelivery, and returns the new epoch.
    pub(crate) fn attach(&self) -> u64 {
        let backoff = Backoff::new();
        // Relaxed: the compare-and-swap below is what synchronises.
        let mut seat = self.cons.seat.load(Ordering::Relaxed);
        loop {
            if seat & BUSY != 0 {
                // The old consumer is inside a non-blocking receive step; it ends shortly.
                crate::sync::spin(&backoff);
                seat = self.cons.seat.load(Ordering::Relaxed);
                continue;
            }
            // Acquire: pairs with the old consumer's Release when it left the seat, so its
            // `next` and slot writes are visible here.
            match self.cons.seat.compare_exchange_weak(
                seat,
                (seat + 2) | BUSY,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => seat = now,
            }
        }
        let epoch = (seat >> 1) + 1;
        // Relaxed: the seat's Acquire above ordered us after the last consumer that wrote it.
        let next = self.cons.next.load(Ordering::Relaxed);
        // Acquire: pairs with the advancer's Release store of `free` (slots below are empty).
        let mut i = self.adv.free.load(Ordering::Acquire);
        while i < next {
            let slot = self.slot(i);
            let mut word = slot.state.load(Ordering::Acquire);
            // AcqRel: races a late ack or nack of the same delivery, and stale handles ending
            // (holder count); exactly one of ack and take-back wins (L8).
            while tag(word) == DELIVERED {
                match slot.state.compare_exchange_weak(
                    word,
                    with_tag(word, RELEASED),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        // Release: pairs with the consumer's Acquire load of `released`.
                        self.cons.released.fetch_add(1, Ordering::Release);
                        break;
                    }
                    Err(now) => word = now,
                }
            }
            i += 1;
        }
        // Release: pairs with the next seat-taker's Acquire.
        self.cons.seat.store(epoch << 1, Ordering::Release);
        // Wake a detached consumer parked in `recv`, so it returns `Detached`.
        self.items.notify();
        epoch
    }

    /// One non-blocking receive step for the consumer of `epoch`: a redelivery first (L2, L6),
    /// else the next queued item, else `Empty`/`Closed`. Never blocks (L12).
    pub(crate) fn take(&self, epoch: u64, cached_tail: &mut u64) -> Take {
        // Acquire: pairs with the Release that gave the seat back (a re-attach or our own
        // previous step). Fails if another consumer was attached: our epoch is gone.
        if self
            .cons
            .seat
            .compare_exchange(epoch << 1, (epoch << 1) | BUSY, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Take::Detached;
        }
        let taken = self.take_seated(cached_tail);
        // Release: pairs with the next seat-taker's Acquire (re-attach reads `next` and the slot
        // words we wrote).
        self.cons.seat.store(epoch << 1, Ordering::Release);
        taken
    }

    fn take_seated(&self, cached_tail: &mut u64) -> Take {
        // Relaxed: `next` is written only by the seated consumer; the seat's Acquire ordered us
        // after the last writer.
        let next = self.cons.next.load(Ordering::Relaxed);
        // Relaxed: a count only says "scan"; the scan acquires each slot word. Nack counts
        // before its switch to RELEASED, re-attach counts under the seat.
        if self.cons.released.load(Ordering::Relaxed) > 0 {
            if let Some(t) = self.take_released(next) {
                return t;
            }
        }
        // `>=`: a freshly attached consumer's cache starts at 0, behind `next`.
        if next >= *cached_tail {
            *cached_tail = self.published();
            if next == *cached_tail {
                // Acquire on `closed` then re-read `tail`: `close` stores with Release after the
                // producer's last `tail` update, so a close we see brings every item before it.
                if !self.closed.load(Ordering::Acquire) {
                    return Take::Empty;
                }
                *cached_tail = self.published();
                if next == *cached_tail {
                    return Take::Closed;
                }
            }
        }
        let slot = self.slot(next);
        // Relaxed: the slot's last writer (the advancer emptying it) is ordered before us by the
        // `free` -> producer -> `tail` chain acquired above. No handle exists, so no holder.
        let word = delivered_word(slot.state.load(Ordering::Relaxed), 1);
        // Release: pairs with the Acquire of a re-attach scanning delivered slots. Nothing else
        // can change a queued slot's word, so a plain store suffices.
        slot.state.store(word, Ordering::Release);
        // Release: `next` is read by re-attach (after the seat) and by statistics.
        self.cons.next.store(next + 1, Ordering::Release);
        // Relaxed: statistics; only the seated consumer writes.
        self.cons.delivered.store(self.cons.delivered.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        Take::Item { index: next, word }
    }

    /// Redelivers the lowest released item below `next`, if any.
    fn take_released(&self, next: u64) -> Option<Take> {
        // Acquire: pairs with the advancer's Release of `free`.
        let mut i = self.adv.free.load(Ordering::Acquire);
        while i < next {
            let slot = self.slot(i);
            // Acquire: pairs with the Release (AcqRel) switch to RELEASED by nack or re-attach.
            let mut word = slot.state.load(Ordering::Acquire);
            if tag(word) == RELEASED {
                // Re-read `free` after the state: if item `i` was still unreclaimed then, the
                // slot held item `i` (a later item enters only after `i` is reclaimed), and a
                // released item is never reclaimed. Otherwise start again from the new prefix.
                let free = self.adv.free.load(Ordering::Acquire);
                if free > i {
                    i = free;
                    continue;
                }
                // Only the seated consumer changes a RELEASED word's tag (acks and nacks expect
                // DELIVERED), but stale handles ending may lower its holder count meanwhile.
                let new = loop {
                    let new = delivered_word(word, attempt(word).saturating_add(1));
                    // Release: as for a first delivery.
                    match slot.state.compare_exchange_weak(word, new, Ordering::Release, Ordering::Relaxed) {
                        Ok(_) => break new,
                        Err(now) => word = now,
                    }
                };
                // Relaxed: every RELEASED slot was counted before it showed RELEASED, so this
                // never underflows.
                self.cons.released.fetch_sub(1, Ordering::Relaxed);
                self.cons.delivered.store(self.cons.delivered.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                self.cons
                    .redelivered
                    .store(self.cons.redelivered.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                return Some(Take::Item { index: i, word: new });
            }
            i += 1;
        }
        None
    }

    /// The epoch of the current consumer (during a re-attach, of the one being attached).
    pub(crate) fn epoch(&self) -> u64 {
        // Acquire: pairs with the Release that gave the seat back.
        self.cons.seat.load(Ordering::Acquire) >> 1
    }

    /// Whether a receive could make progress now (for waiting): something queued or released,
    /// the lane closed, or this consumer detached.
    pub(crate) fn readable(&self, epoch: u64) -> bool {
        // Acquire loads, as in `take_seated`.
        (self.cons.seat.load(Ordering::Acquire) >> 1) != epoch
            || self.cons.released.load(Ordering::Acquire) > 0
            || self.cons.next.load(Ordering::Acquire) != self.published()
            || self.closed.load(Ordering::Acquire)
    }

    /// L11: nothing queued and nothing released.
    pub(crate) fn is_empty(&self) -> bool {
        self.cons.released.load(Ordering::Acquire) == 0
            && self.cons.next.load(Ordering::Acquire) == self.published()
    }

    // ----- handles ---------------------------------------------------------------------------

    /// The item of a live delivery.
    ///
    /// # Safety
    /// The caller holds a live handle on item `index` (so the slot's holder count is > 0: the
    /// item stays initialised and is not moved until the handle ends).
    pub(crate) unsafe fn item(&self, index: u64) -> &T {
        let slot = self.slot(index);
        // SAFETY: per the contract, the slot holds initialised item `index` and nothing writes
        // it while it has holders; shared reads are fine (`T: Sync` for cross-thread handles).
        slot.item.with(|c| unsafe { (*c).assume_init_ref() })
    }

    /// Acks delivery `word` of item `index`; ends the handle either way.
    pub(crate) fn ack(&self, index: u64, word: u64) -> Result<(), crate::AckError> {
        let slot = self.slot(index);
        // Relaxed: the compare-and-swap below is what synchronises.
        let mut now = slot.state.load(Ordering::Relaxed);
        while tag(now) == DELIVERED && gen(now) == gen(word) {
            // One fewer holder, ACKED. Release: the sink's writes before the ack are published
            // to the advancer (which acquires the ACKED word) and from there to watermark
            // readers (W4), and our reads of the item happen before it is moved out.
            let acked = with_tag(now, ACKED) - HOLDER_ONE;
            match slot.state.compare_exchange_weak(now, acked, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => {
                    // Even with stale holders left: the acked position moves now, only the
                    // slot waits for them.
                    self.request_advance();
                    return Ok(());
                }
                Err(w) => now = w,
            }
        }
        self.end_stale(slot);
        Err(crate::AckError::Detached)
    }

    /// Releases delivery `word` of item `index` for redelivery (L6); ends the handle. A no-op
    /// on the slot if a re-attach already took the delivery back.
    pub(crate) fn nack(&self, index: u64, word: u64) {
        let slot = self.slot(index);
        // Count the release *before* the slot shows RELEASED, so every RELEASED slot the
        // consumer can see is already counted: the consumer never spends the count of another
        // released item on this one and then skips that one for a new item (L2). Until our
        // switch lands the count is one ahead and the consumer only scans for nothing.
        // Relaxed: the consumer acquires the slot word itself.
        self.cons.released.fetch_add(1, Ordering::Relaxed);
        let mut now = slot.state.load(Ordering::Relaxed);
        while tag(now) == DELIVERED && gen(now) == gen(word) {
            // Release: pairs with the consumer's Acquire load of the RELEASED word.
            let released = with_tag(now, RELEASED) - HOLDER_ONE;
            match slot.state.compare_exchange_weak(now, released, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => {
                    self.items.notify();
                    return;
                }
                Err(w) => now = w,
            }
        }
        // A re-attach took the delivery back (and counted it): take our count back.
        self.cons.released.fetch_sub(1, Ordering::Relaxed);
        self.end_stale(slot);
    }

    /// Ends a handle whose delivery was taken back by a re-attach: drops its holder count, and
    /// if it was the item's last holder after an ack, lets the prefix advance.
    fn end_stale(&self, slot: &Slot<T>) {
        // Release: our reads of the item happen before the advancer (Acquire) may move it out.
        let before = slot.state.fetch_sub(HOLDER_ONE, Ordering::Release);
        debug_assert!(holders(before) > 0, "handle ended on a slot with no holders");
        if tag(before) == ACKED && holders(before) == 1 {
            self.request_advance();
        }
    }

    /// Asks for the acked prefix to be advanced; advances it if no other thread is doing so.
    fn request_advance(&self) {
        // AcqRel: Release hands our ACKED word to the advancer; Acquire (when we become the
        // advancer) takes the previous advancer's `free` and slot writes.
        let before = self.adv.advance.fetch_add(REQUEST_ONE, Ordering::AcqRel);
        if before >= REQUEST_ONE {
            return; // the current advancer will see our request and go round again
        }
        let mut seen = before + REQUEST_ONE;
        let mut first_panic = None;
        loop {
            self.advance_prefix(&mut first_panic);
            // AcqRel: success hands the role back (Release for the next advancer) and clears
            // `ROOM_WANTED`; failure acquires the requests (or the producer's wish) that arrived
            // meanwhile, and we go round again.
            match self.adv.advance.compare_exchange(seen, 0, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(now) => seen = now,
            }
        }
        if seen & ROOM_WANTED != 0 {
            self.room.notify();
        }
        if let Some(p) = first_panic {
            panic::resume_unwind(p);
        }
    }

    /// Advances the acked prefix over every contiguous ACKED item (moving the lane's acked
    /// position: an acked item counts at once, L5/W1), then empties the slots of the prefix
    /// that no handle reads any more (a detached consumer's stale handle keeps its item's slot,
    /// not the watermark). Must be called only by the advancer. Item drops that panic are caught
    /// (the bookkeeping is already done) and the first panic is kept to be resumed.
    fn advance_prefix(&self, first_panic: &mut Option<Box<dyn std::any::Any + Send>>) {
        // Relaxed: only the advancer writes `acked_end` and `free`, and the role's Acquire ordered us
        // after the previous advancer.
        let mut acked = self.adv.acked_end.load(Ordering::Relaxed);
        let mut free = self.adv.free.load(Ordering::Relaxed);
        let start = acked;
        let mut position = NO_POSITION;
        // Below `free + capacity` the slot of item `acked` holds that item or, if it is not
        // published yet, nothing (item `acked - capacity` was emptied): its word is ACKED only
        // if item `acked` was acked. Bounding by our own `free` instead of `tail` keeps the
        // advancer off the producer's cache line.
        while acked < free + self.shape.capacity {
            let slot = self.slot(acked);
            // Acquire: pairs with the ack's Release (W4 chain).
            if tag(slot.state.load(Ordering::Acquire)) != ACKED {
                break;
            }
            // SAFETY: the producer wrote the position before publishing item `acked`, which
            // happens before its delivery and so before the ack whose Release word we just
            // acquired; the producer rewrites it only after the slot is emptied, behind `free`.
            let p = unsafe { slot.position.with(|c| *c) };
            if p != NO_POSITION {
                position = p;
            }
            acked += 1;
        }
        if acked != start {
            // Release: statistics and `is_idle` readers (Acquire).
            self.adv.acked_end.store(acked, Ordering::Release);
            if position != NO_POSITION {
                // Release: pairs with the watermark's Acquire loads (W4). Positions grow along
                // the lane, so the mark only grows (W3).
                self.shape.marks[self.shape.mark].store(position + 1, Ordering::Release);
            }
        }
        while free < acked {
            let slot = self.slot(free);
            // Acquire: pairs with stale handles' Release holder decrements (their reads of the
            // item happen before). The word is ACKED: only the advancer changes an ACKED word's
            // tag, and item `free` is below `acked`.
            let word = slot.state.load(Ordering::Acquire);
            debug_assert_eq!(tag(word), ACKED);
            if holders(word) != 0 {
                break;
            }
            // SAFETY: item `free` is acked and no handle reads it, so the slot is ours: the
            // consumer never touches an ACKED slot and the producer waits for `free` to pass it.
            let item = unsafe { slot.item.with(|c| ptr::read(c).assume_init()) };
            // Relaxed: published to the producer by the Release store of `free` below. Keeps
            // `gen`; zero holders, zero attempts.
            slot.state.store(gen(word) | EMPTY, Ordering::Relaxed);
            free += 1;
            // Release: pairs with the producer's Acquire load of `free` (the slot may be reused).
            self.adv.free.store(free, Ordering::Release);
            // M3: the item is dropped exactly once, here, on its final ack (or when its last
            // stale handle ends); a panic in its Drop is held back until the role is handed back.
            if let Err(p) = panic::catch_unwind(AssertUnwindSafe(move || drop(item))) {
                first_panic.get_or_insert(p);
            }
        }
    }

    // ----- statistics --------------------------------------------------------------------------

    /// W5 for one lane: nothing queued, released, or delivered-but-unacked.
    pub(crate) fn is_idle(&self) -> bool {
        // Load `acked_end` before `tail`: both grow and `acked_end <= tail`, so equality means that at
        // the moment of the first load everything published was acked.
        let acked = self.adv.acked_end.load(Ordering::Acquire);
        acked == self.published()
    }

    /// The lane's acked position (L5).
    pub(crate) fn acked(&self) -> Option<Position> {
        match self.shape.marks[self.shape.mark].load(Ordering::Acquire) {
            NO_MARK => None,
            mark => Some(Position(mark - 1)),
        }
    }

    pub(crate) fn stats(&self) -> LaneStats {
        // Lower bounds first (acked_end <= next <= tail at every instant, all growing), so the
        // differences never underflow; `released` is read separately and clamped.
        let acked = self.adv.acked_end.load(Ordering::Acquire);
        let next = self.cons.next.load(Ordering::Acquire);
        let tail = self.published();
        let released = (self.cons.released.load(Ordering::Relaxed) as u64).min(next - acked);
        let last = self.prod.last_published.load(Ordering::Relaxed);
        LaneStats {
            capacity: self.shape.capacity as usize,
            queued: tail - next,
            released,
            in_flight: next - acked - released,
            // Relaxed: statistics counters, each exact for the moment it is read.
            delivered: self.cons.delivered.load(Ordering::Relaxed),
            redelivered: self.cons.redelivered.load(Ordering::Relaxed),
            published: tail,
            acked_items: acked,
            last_published: (last != NO_POSITION).then_some(Position(last)),
            acked: self.acked(),
            closed: self.is_closed(),
        }
    }
}

impl<T> Drop for Ring<T> {
    /// M3: drops every item still in the ring (published and not yet emptied by an ack). Keeps
    /// going when an item's Drop panics, then resumes the first panic.
    fn drop(&mut self) {
        // `&mut self`: no other thread can hold a handle (each holds an `Arc` of the ring).
        let free = self.adv.free.load(Ordering::Relaxed);
        let tail = self.prod.tail.load(Ordering::Relaxed) >> 1;
        let cap = self.shape.slots.len() as u64;
        let mut first_panic = None;
        for i in free..tail {
            let slot = &self.shape.slots[(i % cap) as usize];
            // SAFETY: items `free..tail` are initialised and nothing else references them now.
            let item = unsafe { slot.item.with(|c| ptr::read(c).assume_init()) };
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

/// The producer's private view: its `tail`, its cached `free`, its last position.
pub(crate) struct ProducerState {
    pub(crate) tail: u64,
    cached_free: u64,
    last: u64,
}
