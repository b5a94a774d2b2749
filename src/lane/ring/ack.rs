//! Handles and the advancer: reading a delivered item, ack, nack, stale handles ending, and the
//! lock-free advancer that moves the contiguous acked prefix and empties slots.

use super::slot::{gen, holders, tag, with_tag, ACKED, DELIVERED, EMPTY, HOLDER_ONE, RELEASED};
use super::{Ring, NO_POSITION, REQUEST_ONE, ROOM_WANTED, WATERMARK_WANTED};
use crate::error::AckError;
use crate::sync::Ordering;

impl<T> Ring<T> {
    /// The item of a live delivery.
    ///
    /// # Safety
    /// The caller holds a live handle on item `index` (so the slot's holder count is > 0: the
    /// item stays initialised and is not moved until the handle ends).
    pub(crate) unsafe fn item(&self, index: u64) -> &T {
        // SAFETY: per the contract, the cell holds initialised item `index` and nothing writes
        // it while the slot has holders (for shared cells: while this lane's `free` is not past
        // it, which the fan-out checks before it reuses the cell); shared reads are fine (`T:
        // Sync` for cross-thread handles).
        self.cell(index).item.with(|c| unsafe { (*c).assume_init_ref() })
    }

    /// Acks delivery `word` of item `index`; ends the handle either way.
    pub(crate) fn ack(&self, index: u64, word: u64) -> Result<(), AckError> {
        if self.ack_slot(index, word) {
            // Even with stale holders left: the acked position moves now, only the slot waits
            // for them.
            self.request_advance();
            return Ok(());
        }
        self.end_stale(index);
        Err(AckError::Detached)
    }

    /// The ack's compare-and-swap: `DELIVERED` (of `word`'s generation) to `ACKED`, one fewer
    /// holder. `false` if a re-attach took the delivery back first (the holder is still
    /// counted: the caller ends it with `end_stale`).
    pub(super) fn ack_slot(&self, index: u64, word: u64) -> bool {
        let state = self.state(index);
        // Relaxed: the compare-and-swap below is what synchronises.
        let mut now = state.load(Ordering::Relaxed);
        while tag(now) == DELIVERED && gen(now) == gen(word) {
            // One fewer holder, ACKED. Release: the sink's writes before the ack are published
            // to the advancer (which acquires the ACKED word) and from there to watermark
            // readers (W4), and our reads of the item happen before it is moved out.
            let acked = with_tag(now, ACKED) - HOLDER_ONE;
            match state.compare_exchange_weak(now, acked, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(w) => now = w,
            }
        }
        false
    }

    /// Releases delivery `word` of item `index` for redelivery ([L6](crate::contract#l6)); ends the handle. A no-op
    /// on the slot if a re-attach already took the delivery back.
    pub(crate) fn nack(&self, index: u64, word: u64) {
        // Count the release *before* the slot shows RELEASED, so every RELEASED slot the
        // consumer can see is already counted: the consumer never spends the count of another
        // released item on this one and then skips that one for a new item (L2). Until our
        // switch lands the count is one ahead and the consumer only scans for nothing.
        // Relaxed: the consumer acquires the slot word itself.
        self.cons.released.fetch_add(1, Ordering::Relaxed);
        if self.release_slot(index, word) {
            self.shape.cells.items.notify();
            return;
        }
        // A re-attach took the delivery back (and counted it): take our count back.
        self.cons.released.fetch_sub(1, Ordering::Relaxed);
        self.end_stale(index);
    }

    /// The nack's compare-and-swap: `DELIVERED` (of `word`'s generation) to `RELEASED`, one
    /// fewer holder. `false` if a re-attach took the delivery back first (the holder is still
    /// counted: the caller ends it with `end_stale`). The caller counted the release first.
    pub(super) fn release_slot(&self, index: u64, word: u64) -> bool {
        let state = self.state(index);
        let mut now = state.load(Ordering::Relaxed);
        while tag(now) == DELIVERED && gen(now) == gen(word) {
            // Release: pairs with the consumer's Acquire load of the RELEASED word.
            let released = with_tag(now, RELEASED) - HOLDER_ONE;
            match state.compare_exchange_weak(now, released, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(w) => now = w,
            }
        }
        false
    }

    /// Ends a handle whose delivery was taken back by a re-attach: drops its holder count, and
    /// if it was the item's last holder after an ack, lets the prefix advance. A plain run's
    /// items that a re-attach took back are ended here too, one by one (their `RELEASED` words
    /// hold the run's one holder each).
    pub(crate) fn end_stale(&self, index: u64) {
        // Release: our reads of the item happen before the advancer (Acquire) may move it out.
        let before = self.state(index).fetch_sub(HOLDER_ONE, Ordering::Release);
        // Not while unwinding: a handle dropped after an earlier panic would abort the process and
        // hide that first error.
        debug_assert!(
            holders(before) > 0 || std::thread::panicking(),
            "handle ended on a slot with no holders"
        );
        // After the holder RMW above (program order, Release): a seat-held run ack that reads the
        // count this lowers sees that RMW done (P21).
        self.cons.stale.fetch_sub(1, Ordering::Release);
        if tag(before) == ACKED && holders(before) == 1 {
            self.request_advance();
        }
    }

    /// Asks for the acked prefix to be advanced; advances it if no other thread is doing so.
    pub(super) fn request_advance(&self) {
        // AcqRel: Release hands our ACKED word to the advancer; Acquire (when we become the
        // advancer) takes the previous advancer's `free` and slot writes.
        let before = self.adv.advance.fetch_add(REQUEST_ONE, Ordering::AcqRel);
        if before >= REQUEST_ONE {
            return; // the current advancer will see our request and go round again
        }
        let mut seen = before + REQUEST_ONE;
        loop {
            self.advance_prefix();
            // AcqRel: success hands the role back (Release for the next advancer) and clears the
            // wishes; failure acquires the requests (or wishes) that arrived meanwhile, and we go
            // round again.
            match self.adv.advance.compare_exchange(seen, 0, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(now) => seen = now,
            }
        }
        // Only the advancer's swap clears a wish, so the word it swapped holds every wish made.
        if seen & ROOM_WANTED != 0 {
            self.shape.cells.room.notify();
        }
        if seen & WATERMARK_WANTED != 0 {
            self.shape.mark.notify();
        }
    }

    /// Publishes a pass's new end of the acked prefix (moved from `start` to `acked`) and the
    /// last position in it (`NO_POSITION` if none) as the lane's acked position. The advancer
    /// only.
    fn publish_acked(&self, start: u64, acked: u64, position: u64) {
        if acked != start {
            // Release: statistics and `is_idle` readers (Acquire).
            self.adv.acked_end.store(acked, Ordering::Release);
            if position != NO_POSITION {
                // Release: pairs with the watermark's Acquire loads (W4). Positions grow along
                // the lane, so the mark only grows (W3).
                self.shape.mark.publish(position);
            }
        }
    }

    /// Advances the acked prefix over every contiguous ACKED item (moving the lane's acked
    /// position: an acked item counts at once, [L5](crate::contract#l5)/W1), and empties the
    /// slots of the prefix that no handle reads any more, in one pass when no stale handle pins
    /// one (the common case); then publishes `acked_end` (and the acked position) before `free`
    /// (readers rely on `free <= acked_end`). A pinned slot stops the emptying there; the rest of
    /// the prefix still counts as acked, and the stale handle's end requests another pass. The
    /// slots' items stay in the cells: the publisher drops them once every lane freed them.
    /// Must be called only by the advancer.
    fn advance_prefix(&self) {
        // Relaxed: only the advancer writes `acked_end` and `free`, and the role's Acquire
        // ordered us after the previous advancer.
        let mut acked = self.adv.acked_end.load(Ordering::Relaxed);
        let free_before = self.adv.free.load(Ordering::Relaxed);
        let (start, mut free) = (acked, free_before);
        let mut position = NO_POSITION;
        // Below `free + capacity` the slot of item `acked` belongs to that item or, if it is not
        // published yet, to nobody (item `acked - capacity` was emptied): its word is ACKED only
        // if item `acked` was acked. Bounding by our own `free` instead of the cursor keeps the
        // advancer off the publisher's cache line.
        while acked < free + self.shape.capacity {
            let state = self.state(acked);
            // Acquire: pairs with the ack's Release (W4 chain), and with stale handles' Release
            // holder decrements (their reads of the item happen before the slot is emptied).
            let word = state.load(Ordering::Acquire);
            if tag(word) != ACKED {
                // A plain run's acked prefix (P26) starts at `acked` if it ends past it: the run
                // was taken when every item below its start was acked and emptied, so our
                // `acked` is inside it. Acquire: pairs with the plain ack's Release store.
                let plain = self.cons.plain_acked.load(Ordering::Acquire);
                if plain <= acked {
                    break;
                }
                debug_assert_eq!(free, acked, "no slot below a plain run is pinned");
                // The last positioned item of the prefix is the lane's acked position.
                let mut i = plain;
                while i > acked {
                    i -= 1;
                    // SAFETY: as below, for item `i` of the plain run: published before its
                    // delivery, and not rewritten before our `free` passes it.
                    let p = unsafe { self.cell(i).position.with(|c| *c) };
                    if p != NO_POSITION {
                        position = p;
                        break;
                    }
                }
                // The plain items' words were never changed (EMPTY): their slots are empty.
                (acked, free) = (plain, plain);
                continue;
            }
            // SAFETY: the publisher wrote the position before publishing item `acked`, which
            // happens before its delivery (or gap) and so before the ack whose Release word we
            // just acquired; it rewrites the cell only after every lane's `free` passed it.
            let p = unsafe { self.cell(acked).position.with(|c| *c) };
            if p != NO_POSITION {
                position = p;
            }
            if free == acked && holders(word) == 0 {
                // Relaxed: published by the Release store of `free` below. Keeps `gen`.
                state.store(gen(word) | EMPTY, Ordering::Relaxed);
                free += 1;
            }
            acked += 1;
        }
        self.publish_acked(start, acked, position);
        // Then the slots the pass left behind a pinned one, as far as no handle pins them now.
        while free < acked {
            let state = self.state(free);
            // Acquire: as above.
            let word = state.load(Ordering::Acquire);
            debug_assert_eq!(tag(word), ACKED);
            if holders(word) != 0 {
                break;
            }
            // Relaxed: as above.
            state.store(gen(word) | EMPTY, Ordering::Relaxed);
            free += 1;
        }
        if free != free_before {
            // Release: pairs with the publisher's Acquire load of `free` (the cells below may be
            // reused and their items dropped once every lane passed them).
            self.adv.free.store(free, Ordering::Release);
        }
    }
}
