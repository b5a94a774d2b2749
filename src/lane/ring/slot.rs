//! The slot and its state word: `gen:24 | holders:16 | attempt:16 | tag:8` (see the ring's
//! module docs).

use std::mem::MaybeUninit;

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicBool, AtomicU64, Ordering, UnsafeCell};
use crate::wait::WaitList;

pub(super) const TAG_MASK: u64 = 0xFF;
pub(super) const ATTEMPT_SHIFT: u32 = 8;
pub(super) const ATTEMPT_MASK: u64 = 0xFFFF << ATTEMPT_SHIFT;
pub(super) const HOLDER_SHIFT: u32 = 24;
pub(super) const HOLDER_ONE: u64 = 1 << HOLDER_SHIFT;
pub(super) const HOLDER_MASK: u64 = 0xFFFF << HOLDER_SHIFT;
/// The most live handles one item may have: a redelivery that would pass it waits instead
/// (`take_released`), so the 16-bit count never overflows into `gen`.
pub(super) const MAX_HOLDERS: u64 = 0xFFFF;
pub(super) const GEN_SHIFT: u32 = 40;
pub(super) const GEN_ONE: u64 = 1 << GEN_SHIFT;
pub(super) const GEN_MASK: u64 = !(GEN_ONE - 1);

pub(super) const EMPTY: u64 = 0;
pub(super) const DELIVERED: u64 = 1;
pub(super) const RELEASED: u64 = 2;
pub(super) const ACKED: u64 = 3;
/// Published to this lane as a gap: an item addressed to another lane
/// (`Fanout::publish_to`). Written by the fan-out before it publishes the slot; the consumer
/// acks it on its way past (`ACKED`, no holder) and delivers nothing.
pub(super) const SKIPPED: u64 = 4;

#[inline]
pub(super) fn tag(word: u64) -> u64 {
    word & TAG_MASK
}

#[inline]
pub(super) fn with_tag(word: u64, t: u64) -> u64 {
    (word & !TAG_MASK) | t
}

/// The attempt number (1 = first delivery) recorded in a state word.
#[inline]
pub(crate) fn attempt(word: u64) -> u32 {
    ((word & ATTEMPT_MASK) >> ATTEMPT_SHIFT) as u32
}

#[inline]
pub(super) fn holders(word: u64) -> u64 {
    (word & HOLDER_MASK) >> HOLDER_SHIFT
}

#[inline]
pub(super) fn gen(word: u64) -> u64 {
    word & GEN_MASK
}

/// The word of the next delivery of a slot whose current word is `word`: next generation, one
/// more holder, `attempt` (saturating at 16 bits), `DELIVERED`.
#[inline]
pub(super) fn delivered_word(word: u64, attempt: u32) -> u64 {
    // Guaranteed by `take_released` (redeliveries) and by first deliveries starting at 0.
    debug_assert!(holders(word) < MAX_HOLDERS, "too many live handles on one item");
    gen(word).wrapping_add(GEN_ONE)
        | ((word & HOLDER_MASK) + HOLDER_ONE)
        | (u64::from(attempt.min(0xFFFF)) << ATTEMPT_SHIFT)
        | DELIVERED
}

/// One cell: an item, its position and its charge, apart from the lanes' state words. The
/// publisher writes cells, the lanes' consumer sides write state words (`Shape::states`), so
/// neither side's writes move the other's cache lines.
///
/// Aligned to a cache line (64 bytes for a `LaneItem`'s cell): with 56-byte cells, the
/// publisher writing the next cell took the line the consumer was reading the last one from,
/// and the W3 round trip went from about 220 to 300 ns (alternating runs,
/// `benches/alternate.rs`).
#[repr(align(64))]
pub(super) struct Cell<T> {
    /// The item's position, or `NO_POSITION`. Written by the publisher with the item.
    pub(super) position: UnsafeCell<u64>,
    /// The item's [charge](crate::Item::charge) against the memory budget (0 without one).
    /// Written and read by the publisher only.
    pub(super) charge: UnsafeCell<u64>,
    /// Initialised for the items in `reclaimed..written` ([`Cells`]).
    pub(super) item: UnsafeCell<MaybeUninit<T>>,
}

/// `capacity - 1` when the capacity is a power of two, else `u64::MAX`: see [`slot_of`].
pub(super) fn mask_of(capacity: u64) -> u64 {
    if capacity.is_power_of_two() {
        capacity - 1
    } else {
        u64::MAX
    }
}

/// The slot (and cell) of item `index` in a ring of `capacity`: a mask when the capacity is a
/// power of two (`mask` from [`mask_of`]), else the remainder (a division, on every item).
#[inline]
pub(super) fn slot_of(index: u64, capacity: u64, mask: u64) -> usize {
    let i = if mask != u64::MAX { index & mask } else { index % capacity };
    debug_assert!(i < capacity);
    i as usize
}

/// Bit 0 of the cursor: a consumer (of any lane) waits for items.
pub(super) const ITEMS_WANTED: u64 = 1;
/// Bit 1 of the cursor: a lane is closed; nothing more is published to any lane.
pub(crate) const CLOSED: u64 = 2;
/// The published count sits above the two flag bits of the cursor.
pub(super) const CURSOR_SHIFT: u32 = 2;

/// The one array of cells every lane of a stream reads in place, and its one publication
/// cursor ([the contract's layout section](crate::contract#layout)).
///
/// The publisher ([`Publisher`](crate::lane::Publisher), holding the producer role) writes each
/// item once into cell `i % capacity` and publishes it to every lane with one Release
/// compare-and-swap of `cursor`, as the LMAX Disruptor publishes with one cursor for all its
/// consumers; each lane keeps its own state words, consumer seat and acked prefix. An item's
/// cell is reused only after every lane emptied its slot (each lane's `free` passed it). Cells
/// hold every item from `reclaimed` to `written`: the publisher drops the items every lane freed
/// at its next publish (and when it is dropped), the rest are dropped with the array.
pub(crate) struct Cells<T> {
    pub(super) cells: Box<[Cell<T>]>,
    /// [`mask_of`] the capacity: a cell is found without a division.
    mask: u64,
    /// `published << CURSOR_SHIFT | CLOSED | ITEMS_WANTED`: advanced only by the publisher, with a
    /// compare-and-swap that fails once `CLOSED` is set (publishing and closing are one atomic
    /// step against each other: [L10](crate::contract#l10)); consumers set `ITEMS_WANTED` (RMW)
    /// before they wait. Every lane's consumer reads it (Acquire), nothing else is on its line.
    pub(crate) cursor: CachePadded<AtomicU64>,
    /// Consumers of every lane wait here for items; notified by a publish that sees
    /// `ITEMS_WANTED`, and by nacks, re-attaches and closes (rare: every lane's waiter re-checks).
    pub(crate) items: WaitList,
    /// The publisher waits here for room or budget; notified by the advancer of the lane it
    /// waits for (`ROOM_WANTED` in that lane's `advance` word) and by a close of any lane.
    pub(crate) room: WaitList,
    /// The publisher's counters, on a line of their own.
    pub(crate) counts: CachePadded<Counts>,
    /// Whether a publisher holds the producer role ([L9](crate::contract#l9)).
    pub(crate) producer_live: AtomicBool,
    /// The memory budget in bytes ([M4](crate::contract#m4)), if any.
    pub(crate) budget: Option<u64>,
}

/// The publisher's counters. Written only by the publisher (holding the producer role, claimed
/// with Acquire and given back with Release), so its own accesses are Relaxed; other threads
/// read them Relaxed as statistics, and the last owner's drop reads them after every other owner
/// is gone.
pub(crate) struct Counts {
    /// Items below this were dropped.
    pub(crate) reclaimed: AtomicU64,
    /// Items below this were written (`written` = the published count, except inside a publish).
    pub(crate) written: AtomicU64,
    /// The last position published (`NO_POSITION` if none).
    pub(crate) last_published: AtomicU64,
    /// The charges of the items in `reclaimed..written`, in bytes.
    pub(crate) held_bytes: AtomicU64,
}

// SAFETY: the cells hand out `&T` to handles on other threads (needs `T: Sync`) and move `T`s
// between the publisher and whichever thread drops them (needs `T: Send`). Every access to a
// cell is serialised by the ring's protocol (ring module docs): the publisher writes a cell only
// while no lane's slot of it is in use, and readers read it only while their slot is.
unsafe impl<T: Send + Sync> Sync for Cells<T> {}
// SAFETY: as above; the cells own `T`s and drop them on whatever thread drops them last.
unsafe impl<T: Send + Sync> Send for Cells<T> {}

impl<T> Cells<T> {
    /// `capacity` (>= 1) empty cells, with a memory budget of `budget` bytes if any.
    pub(crate) fn new(capacity: usize, budget: Option<u64>) -> Cells<T> {
        assert!(capacity > 0, "ring capacity must be at least 1");
        Cells {
            cells: (0..capacity)
                .map(|_| Cell {
                    position: UnsafeCell::new(super::NO_POSITION),
                    charge: UnsafeCell::new(0),
                    item: UnsafeCell::new(MaybeUninit::uninit()),
                })
                .collect(),
            mask: mask_of(capacity as u64),
            cursor: CachePadded::new(AtomicU64::new(0)),
            items: WaitList::new(2),
            room: WaitList::new(2),
            counts: CachePadded::new(Counts {
                reclaimed: AtomicU64::new(0),
                written: AtomicU64::new(0),
                last_published: AtomicU64::new(super::NO_POSITION),
                held_bytes: AtomicU64::new(0),
            }),
            producer_live: AtomicBool::new(false),
            budget,
        }
    }

    pub(super) fn cell(&self, index: u64) -> &Cell<T> {
        &self.cells[slot_of(index, self.cells.len() as u64, self.mask)]
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.cells.len() as u64
    }

    /// Items published so far.
    #[inline]
    pub(crate) fn published(&self) -> u64 {
        // Acquire: pairs with the publisher's Release compare-and-swap (the cells are written).
        self.cursor.load(Ordering::Acquire) >> CURSOR_SHIFT
    }

    /// Whether a lane was closed (nothing more is published).
    pub(crate) fn any_closed(&self) -> bool {
        // Acquire: pairs with `close`'s Release RMW.
        self.cursor.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Items written and not dropped yet, and their charges in bytes.
    pub(crate) fn held(&self) -> (u64, u64) {
        // Relaxed: statistics (see `Counts`); `reclaimed <= written`, loaded first.
        let reclaimed = self.counts.reclaimed.load(Ordering::Relaxed);
        let written = self.counts.written.load(Ordering::Relaxed);
        (written.saturating_sub(reclaimed), self.counts.held_bytes.load(Ordering::Relaxed))
    }

    /// The memory budget in bytes, if any.
    pub(crate) fn budget(&self) -> Option<u64> {
        self.budget
    }

    /// The last position published, if any.
    pub(crate) fn last_published(&self) -> Option<crate::position::Position> {
        // Relaxed: statistics.
        let last = self.counts.last_published.load(Ordering::Relaxed);
        (last != super::NO_POSITION).then_some(crate::position::Position(last))
    }

    /// Marks that a consumer is about to wait for items (before its re-check).
    pub(crate) fn want_items(&self) {
        // AcqRel RMW: totally ordered with the publisher's compare-and-swap, which either sees
        // the bit (and notifies) or is read by this RMW, so the consumer's re-check sees it.
        self.cursor.fetch_or(ITEMS_WANTED, Ordering::AcqRel);
    }

    /// Stops publishing to every lane: an RMW on the cursor, so it is ordered against every
    /// publish (a consumer that sees `CLOSED` sees the count of every item published before it).
    pub(crate) fn close(&self) {
        // Release: pairs with the consumers' Acquire loads of the cursor.
        self.cursor.fetch_or(CLOSED, Ordering::Release);
        self.items.notify();
        self.room.notify();
    }

    /// Copies the item at `item` (its position, or `NO_POSITION`, and its charge) into the cell
    /// of item `index`, bit for bit: the item is not moved out of `item`, the caller decides
    /// whose copy lives on (see [`Publisher::push`](crate::lane::Publisher)). A copy, not a
    /// move by value, so the item is not staged on the stack on its way (a 48-byte move through
    /// the stack stalls on store forwarding: about 10% of a run publish's time, `perf annotate`).
    ///
    /// # Safety
    /// The caller holds the producer role; item `index` is not published, and the cell's
    /// previous item was dropped ([`reclaim`](Cells::reclaim)) after every lane freed it; `item`
    /// points to an initialised `T`.
    #[inline]
    pub(crate) unsafe fn write(&self, index: u64, item: *const T, position: u64, charge: u64) {
        let cell = self.cell(index);
        // SAFETY: the caller's guarantee: nothing else touches the cell until it is published,
        // and `item` is a valid `T` that does not overlap the cell (it is not in the cells).
        unsafe {
            cell.item.with_mut(|c| std::ptr::copy_nonoverlapping(item, (*c).as_mut_ptr(), 1));
            cell.position.with_mut(|c| *c = position);
            cell.charge.with_mut(|c| *c = charge);
        }
    }

    /// Publishes items `tail..tail + n` (written by the caller, the producer role's holder) to
    /// every lane with one compare-and-swap of the cursor, and wakes waiting consumers if one
    /// asked. `Err` if the stream was closed: nothing was published.
    #[inline]
    pub(crate) fn publish(&self, tail: u64, n: u64) -> Result<(), ()> {
        // Release: pairs with the consumers' Acquire loads of the cursor (publishes every cell
        // written before it). An RMW, so it sees an `ITEMS_WANTED` set by a consumer about to
        // wait (either we see the bit and clear it in the same step, or the consumer's RMW comes
        // after ours and its re-check sees the items), and it fails on `CLOSED` (publishing and
        // closing are one atomic step against each other, L3/L10). Failure: Relaxed, we only
        // learn the flags.
        let mut seen = tail << CURSOR_SHIFT;
        loop {
            if seen & CLOSED != 0 {
                return Err(());
            }
            match self.cursor.compare_exchange_weak(
                seen,
                (tail + n) << CURSOR_SHIFT,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => seen = now,
            }
        }
        if seen & ITEMS_WANTED != 0 {
            self.items.notify();
        }
        Ok(())
    }

    /// Drops the items below `end` (every lane's `free`, loaded with Acquire, is at `end` or
    /// past it) that were not dropped yet, releasing their charges.
    ///
    /// # Safety
    /// The caller holds the producer role and every lane emptied the slots of the items below
    /// `end`: no handle reads their cells any more.
    ///
    /// Returns the first panic of a dropped item's Drop, caught once every item is dropped
    /// ([M3](crate::contract#m3)): the caller resumes it when its own step is done.
    #[must_use = "a caught drop panic must be resumed"]
    pub(crate) unsafe fn reclaim(&self, end: u64) -> Result<(), crate::lane::CaughtPanic> {
        // Relaxed: the publisher's own counters (see `Counts`).
        let end = end.min(self.counts.written.load(Ordering::Relaxed));
        let mut i = self.counts.reclaimed.load(Ordering::Relaxed);
        if i >= end {
            return Ok(());
        }
        let mut first_panic = None;
        // Records the pass's progress once, when it ends: the loop always ends (a drop's panic
        // is caught, a later payload's too), and the guard keeps that so should it ever unwind.
        let mut pass = Pass { counts: &self.counts, reclaimed: i, released: 0 };
        while i < end {
            let cell = self.cell(i);
            // SAFETY: item `i` is initialised (`reclaimed <= i < written`) and no handle reads it
            // (the caller's guarantee); it is read out once (`pass` records it below, before its
            // drop can panic).
            let (item, charge) =
                unsafe { (cell.item.with(|c| std::ptr::read(c).assume_init()), cell.charge.with(|c| *c)) };
            i += 1;
            (pass.reclaimed, pass.released) = (i, pass.released + charge);
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(item))) {
                crate::lane::keep_first_panic(&mut first_panic, p);
            }
        }
        drop(pass);
        first_panic.map_or(Ok(()), Err)
    }
}

impl<T> Drop for Cells<T> {
    /// [M3](crate::contract#m3): drops every item not reclaimed yet. Keeps going when an item's
    /// Drop panics, then resumes the first panic.
    fn drop(&mut self) {
        // Relaxed: `&mut self`, every other owner is gone.
        let from = self.counts.reclaimed.load(Ordering::Relaxed);
        let to = self.counts.written.load(Ordering::Relaxed);
        let mut first_panic = None;
        for i in from..to {
            let cell = self.cell(i);
            // SAFETY: items `reclaimed..written` are initialised (the publisher drops an item
            // only when it advances `reclaimed` past it) and nothing else references them now.
            let item = unsafe { cell.item.with(|c| std::ptr::read(c).assume_init()) };
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(item))) {
                crate::lane::keep_first_panic(&mut first_panic, p);
            }
        }
        if let Some(p) = first_panic {
            if !std::thread::panicking() {
                std::panic::resume_unwind(p);
            }
        }
    }
}

/// A drop pass's progress ([`Cells::reclaim`]), recorded in the publisher's counters once, when
/// the pass ends or unwinds: the items below `reclaimed` were read out of their cells, and
/// `released` is their charges.
struct Pass<'a> {
    counts: &'a Counts,
    reclaimed: u64,
    released: u64,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        // Relaxed: the publisher's own counters (see `Counts`); once per pass, not per item.
        self.counts.reclaimed.store(self.reclaimed, Ordering::Relaxed);
        if self.released != 0 {
            let held = self.counts.held_bytes.load(Ordering::Relaxed);
            self.counts.held_bytes.store(held - self.released, Ordering::Relaxed);
        }
    }
}
