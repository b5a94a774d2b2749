//! The lane's part in publishing: its `free` for the publisher's room check, gaps, the wishes a
//! waiter leaves in `advance`, closing.

use super::slot::{gen, tag, EMPTY, SKIPPED};
use super::{Ring, ROOM_WANTED, WATERMARK_WANTED};
use crate::sync::Ordering;

impl<T> Ring<T> {
    /// Items published so far (to every lane: the shared cursor).
    #[inline]
    pub(super) fn published(&self) -> u64 {
        self.shape.cells.published()
    }

    /// Items whose slots this lane emptied: every handle of them ended.
    #[inline]
    pub(crate) fn freed(&self) -> u64 {
        // Acquire: pairs with the advancer's Release store of `free` (the last reads of the items
        // below it happen before), so the publisher may reuse and drop their cells.
        self.adv.free.load(Ordering::Acquire)
    }

    /// Marks item `index` (the next to publish) a gap for this lane: an item for another lane,
    /// which this lane's consumer acks on its way past without delivering it (P23). The caller
    /// is the publisher, found room for the item on this lane and publishes it next.
    pub(crate) fn mark_gap(&self, index: u64) {
        let state = self.state(index);
        // Relaxed: the slot is empty and unpublished (its last writer, the advancer emptying it,
        // is ordered before us by the room check's Acquire of `free`), and the cursor's Release
        // that publishes it orders this store before the consumer's read.
        let word = state.load(Ordering::Relaxed);
        debug_assert_eq!(tag(word), EMPTY);
        state.store(gen(word) | SKIPPED, Ordering::Relaxed);
        // Relaxed: only the publisher writes it; the cursor's Release that publishes the item
        // orders it before a consumer's read, as for the word (P27). `index` is the next to
        // publish, so it only grows.
        self.shape.gaps_end.store(index + 1, Ordering::Relaxed);
    }

    /// Undoes [`mark_gap`](Ring::mark_gap) for an item that was never published (the stream
    /// closed under the publish). `gaps_end` stays: past the gap, it only costs a scan.
    pub(crate) fn unmark_gap(&self, index: u64) {
        let state = self.state(index);
        // Relaxed: as in `mark_gap`; the item was not published, so no consumer reads the word.
        let word = state.load(Ordering::Relaxed);
        state.store(gen(word) | EMPTY, Ordering::Relaxed);
    }

    /// Marks that the publisher is about to wait for this lane's room (before its re-check).
    pub(crate) fn want_room(&self) {
        // AcqRel RMW: totally ordered with the advancer's final compare-and-swap, which either
        // sees the bit (and wakes us) or is read by this RMW, so our re-check sees its `free`.
        self.adv.advance.fetch_or(ROOM_WANTED, Ordering::AcqRel);
    }

    /// Marks that a confirmer is about to wait for the watermark (before its re-check).
    pub(crate) fn want_watermark(&self) {
        // AcqRel RMW: as `want_room`, for the acked mark the advancer publishes before its swap.
        self.adv.advance.fetch_or(WATERMARK_WANTED, Ordering::AcqRel);
    }

    /// Closes the lane ([L10](crate::contract#l10)): publishing fails with `Closed` from now on
    /// (on every lane: an item goes to every lane or to none), this lane's consumer drains what
    /// is queued or released and then sees the end. Takes no slot. Wakes every waiter.
    pub(crate) fn close(&self) {
        // Relaxed: published by the cursor RMW's Release below; a consumer that acquires a
        // cursor with `CLOSED` from it (or a later RMW) sees the flag. A consumer that sees the
        // flag from an earlier close's cursor value knows the count is final either way.
        self.closed.store(true, Ordering::Relaxed);
        self.shape.cells.close();
        self.shape.mark.notify();
    }

    /// Whether this lane was closed.
    pub(crate) fn is_closed(&self) -> bool {
        // Relaxed: a flag that is only ever set; the count's finality comes from the cursor.
        self.closed.load(Ordering::Relaxed)
    }

    /// Whether this lane's consumer has seen its end: the lane closed and the cursor closed,
    /// read from `cursor` (a value of the shared cursor loaded with Acquire).
    #[inline]
    pub(super) fn ended(&self, cursor: u64) -> bool {
        cursor & super::slot::CLOSED != 0 && self.closed.load(Ordering::Acquire)
    }
}
