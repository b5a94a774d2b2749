//! The slot and its state word: `gen:24 | holders:16 | attempt:16 | tag:8` (see the ring's
//! module docs).

use std::mem::MaybeUninit;

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicU64, Ordering, UnsafeCell};

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
/// Published to this lane as a gap: a shared ring's item addressed to another lane
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

/// One slot's item and position, apart from its state word: the producer writes cells, the
/// consumer side writes state words (`Shape::states`), so neither side's writes move the other's
/// cache lines (a consumer's state store never pulls the line of the cell the producer fills next).
pub(super) struct Cell<T> {
    /// The item's position, or `NO_POSITION`. Written by the producer with the item.
    pub(super) position: UnsafeCell<u64>,
    /// Initialised for items in `free..tail` (a lane's own cells), or for the shared ring's
    /// items in `reclaimed..written` ([`Cells`]).
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

/// A ring's cells: its own, or one array shared by every lane of a stream and written once per
/// item by the stream's fan-out (`shared`).
///
/// Own cells hold items in the lane's `free..tail`, and the lane's advancer moves each item out
/// and drops it when its slot is emptied. Shared cells hold every item from `reclaimed` to
/// `written` (both advanced only by the fan-out, which holds every lane's producer role): a
/// lane's advancer empties its own state word and leaves the item, and the fan-out drops an item
/// when it reuses its cell (every lane's `free` passed it) or reclaims the cells every lane freed
/// ([`reclaim`](super::Ring::reclaim_shared)); the rest are dropped with the array.
pub(crate) struct Cells<T> {
    pub(super) cells: Box<[Cell<T>]>,
    /// [`mask_of`] the capacity: a cell is found without a division.
    mask: u64,
    pub(super) shared: bool,
    /// Shared cells: written by the fan-out only, on a line of their own (every lane's hot path
    /// reads `cells` and `shared` above).
    counts: CachePadded<Counts>,
}

/// The shared cells' counters. Relaxed throughout: only the fan-out (holding every lane's
/// producer role, claimed with Acquire and given back with Release) writes or reads them while
/// the cells live, and the last owner's drop reads them after every other owner is gone.
struct Counts {
    /// Items below this were dropped.
    reclaimed: AtomicU64,
    /// Items below this were written.
    written: AtomicU64,
}

// SAFETY: the cells hand out `&T` to handles on other threads (needs `T: Sync`) and move `T`s
// between the producer and whichever thread drops them (needs `T: Send`). Every access to a
// cell is serialised by its ring's protocol (ring module docs): the producer writes a cell only
// while no lane's slot of it is in use, and readers read it only while their slot is.
unsafe impl<T: Send + Sync> Sync for Cells<T> {}
// SAFETY: as above; the cells own `T`s and drop them on whatever thread drops them last.
unsafe impl<T: Send + Sync> Send for Cells<T> {}

impl<T> Cells<T> {
    /// `capacity` empty cells, own (`shared == false`) or shared.
    pub(crate) fn new(capacity: usize, shared: bool) -> Cells<T> {
        Cells {
            cells: (0..capacity)
                .map(|_| Cell {
                    position: UnsafeCell::new(super::NO_POSITION),
                    item: UnsafeCell::new(MaybeUninit::uninit()),
                })
                .collect(),
            mask: mask_of(capacity as u64),
            shared,
            counts: CachePadded::new(Counts { reclaimed: AtomicU64::new(0), written: AtomicU64::new(0) }),
        }
    }

    fn cell(&self, index: u64) -> &Cell<T> {
        &self.cells[slot_of(index, self.cells.len() as u64, self.mask)]
    }

    /// Items written so far.
    pub(crate) fn written(&self) -> u64 {
        // Relaxed: see `Counts`.
        self.counts.written.load(Ordering::Relaxed)
    }

    /// Writes items `written..written + n` into shared cells (`make(k)` gives item `written + k`
    /// and its position, or `NO_POSITION`), dropping each cell's previous item on the way.
    ///
    /// # Safety
    /// The caller holds every lane's producer role, and every lane emptied the slots of items
    /// below `written + n - capacity` (its `free` is past them, loaded with Acquire): no handle
    /// reads those cells any more, and the items written are not published yet.
    ///
    /// Returns the first panic of a dropped item's Drop, caught once every cell is written: the
    /// caller publishes the items first and then resumes it, so a panicking drop never leaves
    /// cells written but unpublished.
    #[must_use = "a caught drop panic must be resumed once the items are published"]
    pub(crate) unsafe fn write(
        &self,
        n: u64,
        mut make: impl FnMut(u64) -> (T, u64),
    ) -> Result<(), Box<dyn std::any::Any + Send>> {
        debug_assert!(self.shared);
        let cap = self.cells.len() as u64;
        let from = self.written();
        let mut first_panic = None;
        for k in 0..n {
            let i = from + k;
            let cell = self.cell(i);
            // The cell's previous item, `i - capacity`, unless it was reclaimed already.
            let old = if i >= cap && i - cap >= self.counts.reclaimed.load(Ordering::Relaxed) {
                // SAFETY: item `i - capacity` is initialised (at or above `reclaimed`) and no
                // handle reads it (the caller's guarantee); it is moved out exactly once, and
                // `reclaimed` passes it at once, so no later drop reads it again.
                let old = unsafe { cell.item.with(|c| std::ptr::read(c).assume_init()) };
                self.counts.reclaimed.store(i - cap + 1, Ordering::Relaxed);
                Some(old)
            } else {
                None
            };
            let (item, position) = make(k);
            // SAFETY: the cell is empty now (its old item moved out above, or never written or
            // reclaimed) and unpublished: only we touch it until a lane's `tail` publishes it.
            unsafe {
                cell.item.with_mut(|c| (*c).write(item));
                cell.position.with_mut(|c| *c = position);
            }
            self.counts.written.store(i + 1, Ordering::Relaxed);
            if let Some(old) = old {
                if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(old))) {
                    first_panic.get_or_insert(p);
                }
            }
        }
        first_panic.map_or(Ok(()), Err)
    }

    /// Drops the items of shared cells below `end` (every lane's `free`, loaded with Acquire, is
    /// at `end` or past it) that were not dropped yet.
    ///
    /// # Safety
    /// As [`write`](Cells::write): the caller holds every lane's producer role and every lane
    /// emptied the slots of the items below `end`.
    ///
    /// # Panics
    /// Resumes the first panic of a dropped item's Drop, once every item is dropped.
    pub(crate) unsafe fn reclaim(&self, end: u64) {
        debug_assert!(self.shared);
        let end = end.min(self.written());
        let mut first_panic = None;
        let mut i = self.counts.reclaimed.load(Ordering::Relaxed);
        while i < end {
            // SAFETY: item `i` is initialised (`reclaimed <= i < written`), no handle reads it
            // (the caller's guarantee), and `reclaimed` passes it before it is dropped.
            let item = unsafe { self.cell(i).item.with(|c| std::ptr::read(c).assume_init()) };
            i += 1;
            self.counts.reclaimed.store(i, Ordering::Relaxed);
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(item))) {
                first_panic.get_or_insert(p);
            }
        }
        if let Some(p) = first_panic {
            std::panic::resume_unwind(p);
        }
    }
}

impl<T> Drop for Cells<T> {
    /// [M3](crate::contract#m3) for shared cells: drops every item not reclaimed yet. (A lane's
    /// own cells are emptied by its ring's drop.) Keeps going when an item's Drop panics, then
    /// resumes the first panic.
    fn drop(&mut self) {
        if !self.shared {
            return;
        }
        // Relaxed: `&mut self`, every other owner is gone.
        let (from, to) = (self.counts.reclaimed.load(Ordering::Relaxed), self.written());
        let mut first_panic = None;
        for i in from..to {
            let cell = self.cell(i);
            // SAFETY: items `reclaimed..written` are initialised (the fan-out drops an item only
            // when it advances `reclaimed` past it) and nothing else references them now.
            let item = unsafe { cell.item.with(|c| std::ptr::read(c).assume_init()) };
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(item))) {
                first_panic.get_or_insert(p);
            }
        }
        if let Some(p) = first_panic {
            if !std::thread::panicking() {
                std::panic::resume_unwind(p);
            }
        }
    }
}
