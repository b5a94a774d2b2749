//! Handles and the advancer: reading a delivered item, ack, nack, stale handles ending, and the
//! lock-free advancer that moves the contiguous acked prefix and empties slots.

use std::panic::{self, AssertUnwindSafe};
use std::ptr;

use super::slot::{gen, holders, tag, with_tag, ACKED, DELIVERED, EMPTY, HOLDER_ONE, RELEASED};
use super::{Ring, NO_POSITION, REQUEST_ONE, ROOM_WANTED};
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
            self.items.notify();
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
    /// if it was the item's last holder after an ack, lets the prefix advance.
    pub(super) fn end_stale(&self, index: u64) {
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
            // Never while unwinding: a stale delivery dropped during a panic must not turn the
            // item's drop panic into an abort (as `Ring::drop`). The item was dropped either way.
            if !std::thread::panicking() {
                panic::resume_unwind(p);
            }
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

    /// [`advance_prefix`](Ring::advance_prefix) for a shared ring, whose slots hold no item of
    /// their own to drop: one pass that advances the acked prefix and empties each of its slots
    /// at once when no stale handle pins it (the common case), then publishes `acked_end` (and
    /// the acked position) before `free`, as the two-pass form does (readers rely on
    /// `free <= acked_end`). A pinned slot stops the emptying there; the rest of the prefix
    /// still counts as acked, and the stale handle's end requests another pass.
    fn advance_shared(&self) {
        // Relaxed: as in `advance_prefix` (only the advancer writes them).
        let mut acked = self.adv.acked_end.load(Ordering::Relaxed);
        let free_before = self.adv.free.load(Ordering::Relaxed);
        let (start, mut free) = (acked, free_before);
        let mut position = NO_POSITION;
        while acked < free + self.shape.capacity {
            let state = self.state(acked);
            // Acquire: pairs with the ack's Release (W4 chain), and with stale handles' Release
            // holder decrements (their reads of the item happen before the slot is emptied).
            let word = state.load(Ordering::Acquire);
            if tag(word) != ACKED {
                break;
            }
            // SAFETY: as in `advance_prefix` (the fan-out wrote the position before publishing
            // item `acked`, and rewrites it only after every lane's `free` passed it).
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
        // Then the slots the pass left behind a pinned one, as far as no handle pins them now
        // (the second pass of `advance_prefix`).
        while free < acked {
            let state = self.state(free);
            // Acquire: as above.
            let word = state.load(Ordering::Acquire);
            if holders(word) != 0 {
                break;
            }
            // Relaxed: as above.
            state.store(gen(word) | EMPTY, Ordering::Relaxed);
            free += 1;
        }
        if free != free_before {
            // Release: pairs with the fan-out's Acquire load of `free` (the cells below may be
            // reused once every lane passed them).
            self.adv.free.store(free, Ordering::Release);
        }
    }

    /// Advances the acked prefix over every contiguous ACKED item (moving the lane's acked
    /// position: an acked item counts at once, [L5](crate::contract#l5)/W1), then empties the slots of the prefix
    /// that no handle reads any more (a detached consumer's stale handle keeps its item's slot,
    /// not the watermark). Must be called only by the advancer. Item drops that panic are caught
    /// (the bookkeeping is already done) and the first panic is kept to be resumed.
    fn advance_prefix(&self, first_panic: &mut Option<Box<dyn std::any::Any + Send>>) {
        if self.is_shared() {
            self.advance_shared();
            return;
        }
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
            // Acquire: pairs with the ack's Release (W4 chain).
            if tag(self.state(acked).load(Ordering::Acquire)) != ACKED {
                break;
            }
            // SAFETY: the producer wrote the position before publishing item `acked`, which
            // happens before its delivery and so before the ack whose Release word we just
            // acquired; the producer rewrites it only after the slot is emptied, behind `free`.
            let p = unsafe { self.cell(acked).position.with(|c| *c) };
            if p != NO_POSITION {
                position = p;
            }
            acked += 1;
        }
        self.publish_acked(start, acked, position);
        while free < acked {
            let state = self.state(free);
            // Acquire: pairs with stale handles' Release holder decrements (their reads of the
            // item happen before). The word is ACKED: only the advancer changes an ACKED word's
            // tag, and item `free` is below `acked`.
            let word = state.load(Ordering::Acquire);
            debug_assert_eq!(tag(word), ACKED);
            if holders(word) != 0 {
                break;
            }
            // SAFETY: item `free` is acked and no handle reads it, so the slot is ours: the
            // consumer never touches an ACKED slot and the producer waits for `free` to pass it.
            // Shared cells keep the item: the fan-out drops it once every lane freed it.
            let item = (!self.is_shared())
                .then(|| unsafe { self.cell(free).item.with(|c| ptr::read(c).assume_init()) });
            // Relaxed: published to the producer by the Release store of `free` below. Keeps
            // `gen`; zero holders, zero attempts.
            state.store(gen(word) | EMPTY, Ordering::Relaxed);
            free += 1;
            // Release: pairs with the producer's Acquire load of `free` (the slot may be reused;
            // for shared cells, the fan-out's, which drops the item once every lane passed it).
            self.adv.free.store(free, Ordering::Release);
            // M3: the item is dropped exactly once, here, on its final ack (or when its last
            // stale handle ends); a panic in its Drop is held back until the role is handed back.
            if let Err(p) = panic::catch_unwind(AssertUnwindSafe(move || drop(item))) {
                first_panic.get_or_insert(p);
            }
        }
    }
}
