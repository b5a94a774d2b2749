//! Runs: one seat step that hands out a contiguous run of first deliveries, and the run's acks
//! and nacks with one advancer pass for the whole run.
//!
//! A run changes none of the per-item protocol: each item of a run is delivered with the same
//! state word as by [`take`](Ring::take) (next generation, one holder, attempt 1,
//! `DELIVERED`), and acked or released with the same compare-and-swap as a single handle's
//! (`ack_slot`, `release_slot`), so a re-attach takes back exactly the items of a run that were
//! not acked yet and a late ack of each item lands xor is refused ([L8](crate::contract#l8)).
//! What a run saves is the shared traffic around those steps: one seat compare-and-swap, one
//! `tail` load, one `next` store and one statistics store per run instead of per item on the
//! receive side; one advancer request (`advance` RMW, `acked_end` and the acked mark) per run
//! instead of per item on the ack side; one `released` RMW and one wake-up per released run.
//!
//! A run taken while nothing of the lane is in flight is *plain* (the ring's module docs): it
//! writes no state word at all, and its acks are one `plain_acked` store under the seat. Its
//! items become ordinary state words (`RELEASED`) only if it is released or a re-attach takes
//! it back, so the per-item protocol above is what every other step sees.

use super::receive::Take;
use super::slot::CURSOR_SHIFT;
use super::slot::{
    delivered_word, gen, tag, with_tag, ACKED, ATTEMPT_SHIFT, DELIVERED, GEN_SHIFT, HOLDER_ONE, RELEASED,
    SKIPPED,
};
use super::{Ring, ATTACHED, BUSY, EPOCH_SHIFT};
use crate::sync::{AtomicUsize, Ordering};
use crossbeam_utils::Backoff;

/// Gives back `left` counts of `released` when dropped (see `nack_run`).
struct Uncounted<'a> {
    released: &'a AtomicUsize,
    left: usize,
}

impl Drop for Uncounted<'_> {
    fn drop(&mut self) {
        if self.left > 0 {
            // Relaxed: as the take-back in `nack`.
            self.released.fetch_sub(self.left, Ordering::Relaxed);
        }
    }
}

/// What one run step found.
pub(crate) enum TakeRun {
    /// Items `index..index + len` were delivered; each item's generation (the state word's
    /// `gen` field, shifted down) is in the caller's buffer, and every item has `attempt`. A
    /// `plain` run wrote no state word (ring docs, "Plain runs"): its generations are not set,
    /// its acks and release go through [`ack_plain`](Ring::ack_plain) and
    /// [`release_plain`](Ring::release_plain).
    Run {
        index: u64,
        len: usize,
        attempt: u32,
        plain: bool,
    },
    /// As [`Take`]'s variants of the same names.
    Empty,
    Blocked,
    Closed,
    Detached,
}

impl<T> Ring<T> {
    /// One non-blocking receive step for the consumer of `epoch` that delivers up to
    /// `gens.len()` (>= 1) items: a redelivery alone if one is released (released items come
    /// first, [L2](crate::contract#l2); a run of redeliveries would not be contiguous), else a
    /// contiguous run of queued items, each delivered for the first time. Writes the items'
    /// generations into `gens`. Never blocks ([L12](crate::contract#l12)).
    pub(crate) fn take_run(&self, epoch: u64, cached_tail: &mut u64, gens: &mut [u32]) -> TakeRun {
        debug_assert!(!gens.is_empty());
        if !self.readable(epoch) {
            // As in `take`: nothing to take, answered without the seat (P5b).
            return TakeRun::Empty;
        }
        // The seat, taken and given back as for one item (P5, P16).
        let mut skipped = false;
        let taken = self
            .seated(epoch, || self.take_run_seated(cached_tail, gens, &mut skipped))
            .unwrap_or(TakeRun::Detached);
        if skipped {
            // As in `take`: one advancer request for the gaps passed (P23).
            self.request_advance();
        }
        taken
    }

    fn take_run_seated(&self, cached_tail: &mut u64, gens: &mut [u32], skipped: &mut bool) -> TakeRun {
        // Relaxed: as in `take_seated` (only the seated consumer writes `next`).
        let mut next = self.cons.next.load(Ordering::Relaxed);
        // Relaxed: a hint to scan, as in `take_seated`.
        if self.cons.released.load(Ordering::Relaxed) > 0 {
            match self.take_released(next) {
                Some(Take::Item { index, word }) => {
                    gens[0] = (gen(word) >> GEN_SHIFT) as u32;
                    return TakeRun::Run { index, len: 1, attempt: super::slot::attempt(word), plain: false };
                }
                Some(_) => return TakeRun::Blocked,
                // As in `take_seated`: a release counted, not switched yet, comes first (L2).
                None => return TakeRun::Empty,
            }
        }
        // Gaps first (a shared ring's items for other lanes): acked on the way past.
        if let Err(closed) = self.first_queued(&mut next, cached_tail, skipped) {
            return if closed { TakeRun::Closed } else { TakeRun::Empty };
        }
        // Reload `tail` whenever the cached count cannot fill the run (once per run, not per
        // item). `>=` / saturating: a freshly attached consumer's cache starts at 0.
        // Item `next` is queued (`first_queued`), so the run has at least one item.
        if cached_tail.saturating_sub(next) < gens.len() as u64 {
            // Acquire: as in `first_queued` (pairs with the producer's Release compare-and-swap).
            *cached_tail = self.shape.cells.cursor.load(Ordering::Acquire) >> CURSOR_SHIFT;
        }
        let mut len = (*cached_tail - next).min(gens.len() as u64) as usize;
        // Acquire: pairs with the advancer's Release stores: every item below `next` is acked
        // and its slot emptied, so no handle of this lane is live and the advancer's next pass
        // starts at `next`, where the plain run begins (P26).
        if self.adv.acked_end.load(Ordering::Acquire) == next && self.adv.free.load(Ordering::Acquire) == next
        {
            // Relaxed: the publisher raised `gaps_end` past every gap below `cached_tail` before
            // the cursor's Release that published it, which our Acquire load of the cursor read
            // (P27): at or below `next`, no item of the run is a gap and no word is read.
            if self.shape.gaps_end.load(Ordering::Relaxed) > next {
                for j in 1..len {
                    // Relaxed: as below; only the gap tag is read.
                    if tag(self.state(next + j as u64).load(Ordering::Relaxed)) == SKIPPED {
                        len = j;
                        break;
                    }
                }
            }
            // Relaxed: `plain_end` is read under the seat only (its Release below publishes
            // it). The advancer also reads `plain_acked`, but passes only items below it and
            // past its own `acked`, which is at `next` already: this value makes it pass none.
            self.cons.plain_acked.store(next, Ordering::Relaxed);
            self.cons.plain_end.store(next + len as u64, Ordering::Relaxed);
            self.delivered_run(next, len);
            return TakeRun::Run { index: next, len, attempt: 1, plain: true };
        }
        for (j, g) in gens[..len].iter_mut().enumerate() {
            let state = self.state(next + j as u64);
            // Relaxed load, Release store: as in `take_seated`, for every item below the `tail`
            // acquired above (the same `free` -> producer -> `tail` chain orders each slot's
            // last writer before us; no handle exists yet, so nothing else writes the word).
            let now = state.load(Ordering::Relaxed);
            if tag(now) == SKIPPED {
                // A gap ends the run (item `next` is not one: the loop above passed the gaps).
                len = j;
                break;
            }
            let word = delivered_word(now, 1);
            state.store(word, Ordering::Release);
            *g = (gen(word) >> GEN_SHIFT) as u32;
        }
        self.delivered_run(next, len);
        TakeRun::Run { index: next, len, attempt: 1, plain: false }
    }

    /// Moves `next` past a run of `len` first deliveries from `next` (the seated consumer).
    fn delivered_run(&self, next: u64, len: usize) {
        // Release: as in `take_seated` (`next` is read by re-attach after the seat, and by
        // statistics).
        self.cons.next.store(next + len as u64, Ordering::Release);
        // Relaxed: statistics; only the seated consumer writes.
        self.cons
            .delivered
            .store(self.cons.delivered.load(Ordering::Relaxed) + len as u64, Ordering::Relaxed);
    }

    /// Acks the items of the plain run received by the consumer of `epoch` below `end`
    /// (holding the seat, so no re-attach can turn them stale meanwhile): `true` if done (the
    /// caller then requests one advance with [`run_acked`](Ring::run_acked)), `false` if a
    /// re-attach took the run's items back first (they are stale: the caller ends each with
    /// [`end_stale`](Ring::end_stale)). Waits out a receive step of the consumer
    /// on another thread, as [`seated`](Ring::seated) does.
    pub(crate) fn ack_plain(&self, epoch: u64, end: u64) -> bool {
        let seated = self.seated(epoch, || {
            // Relaxed: written under the seat only. Checked after the seat is given back (a
            // panic under the seat would keep it busy).
            let (acked, end_now) =
                (self.cons.plain_acked.load(Ordering::Relaxed), self.cons.plain_end.load(Ordering::Relaxed));
            // Release: pairs with the advancer's Acquire load (P26): the sink's writes and
            // the run's reads of its items happen before the advancer passes them (and before
            // the acked mark and `free` it then publishes).
            self.cons.plain_acked.store(end, Ordering::Release);
            (acked, end_now)
        });
        match seated {
            Some((acked, end_now)) => {
                debug_assert!(acked < end && end <= end_now, "plain ack to {end} of {acked}..{end_now}");
                true
            }
            None => {
                self.plain_taken_back();
                false
            }
        }
    }

    /// After a plain run's seat step found its epoch gone: waits until the re-attach that took
    /// the epoch has given the seat back, so that its take-back of the run's items (the holder
    /// count each `RELEASED` word gets) happens before the caller ends them (P26).
    fn plain_taken_back(&self) {
        let backoff = Backoff::new();
        // Acquire: pairs with the re-attach's Release store that gave the seat back (or a later
        // seat-holder's, ordered after it). A seat without `BUSY` and with a newer epoch is only
        // ever stored after that re-attach's take-back.
        while self.cons.seat.load(Ordering::Acquire) & BUSY != 0 {
            crate::sync::spin(&backoff);
        }
    }

    /// Releases the items `from..end` of the plain run received by the consumer of `epoch`
    /// (its un-acked rest) for redelivery ([L6](crate::contract#l6)), with one wake-up: each
    /// slot gets the word a nacked delivery leaves (`RELEASED`, next generation, attempt 1, no
    /// holder). `false` if a re-attach took them back first (the caller ends each stale item
    /// with [`end_stale`](Ring::end_stale)).
    pub(crate) fn release_plain(&self, epoch: u64, from: u64, end: u64) -> bool {
        let released = self.seated(epoch, || {
            // Relaxed: written under the seat only. Checked after the seat is given back.
            let span =
                (self.cons.plain_acked.load(Ordering::Relaxed), self.cons.plain_end.load(Ordering::Relaxed));
            self.materialize_plain(from, end, 0);
            span
        });
        match released {
            Some((acked, end_now)) => {
                debug_assert!(
                    acked == from && end == end_now,
                    "plain release {from}..{end} of {acked}..{end_now}"
                );
                self.shape.cells.items.notify();
                true
            }
            None => {
                self.plain_taken_back();
                false
            }
        }
    }

    /// Turns the plain items `from..end` (under the seat) into `RELEASED` state words with
    /// `holders` live handles (0 for a release, 1 for a re-attach: the old run still reads them),
    /// counted in `released` first as a nack counts, and ends the plain run at `from`.
    pub(super) fn materialize_plain(&self, from: u64, end: u64, holders: u64) {
        if from >= end {
            return;
        }
        // Release: pairs with the consumer's Acquire load of `released`. Counted before any slot
        // shows RELEASED, as a nack counts (P7).
        self.cons.released.fetch_add((end - from) as usize, Ordering::Release);
        for i in from..end {
            let state = self.state(i);
            // Relaxed: a plain item's word is written by nobody while the run is plain (the
            // seat's Acquire ordered us after its last writer, as for the take).
            let word = state.load(Ordering::Relaxed);
            let released = with_tag(delivered_word(word, 1), RELEASED) - HOLDER_ONE + holders * HOLDER_ONE;
            // Release: pairs with the consumer's Acquire of the RELEASED word (`take_released`).
            state.store(released, Ordering::Release);
        }
        // Relaxed: read under the seat only.
        self.cons.plain_end.store(from, Ordering::Relaxed);
    }

    /// Acks item `index` of a run (its delivery's generation `g`) without requesting an advance:
    /// `true` if the ack landed (the caller requests one advance for the whole run with
    /// [`run_acked`](Ring::run_acked)), `false` if a re-attach took the delivery back first (the
    /// handle is ended here, as a refused single ack ends it).
    ///
    /// # Panics
    /// As [`ack`](Ring::ack): resumes an item's drop panic if ending a stale handle let its
    /// item go (the handle is ended first).
    pub(crate) fn ack_in_run(&self, index: u64, g: u32) -> bool {
        let word = u64::from(g) << GEN_SHIFT;
        if self.ack_slot(index, word) {
            true
        } else {
            self.end_stale(index);
            false
        }
    }

    /// Acks items `index..index + gens.len()` of a run received by the consumer of `epoch`
    /// (each item's delivery generation in `gens`, all with `attempt`) with one plain store per
    /// item, holding the seat: `true` if done (the caller then requests one advance with
    /// [`run_acked`](Ring::run_acked)), `false` if nothing was done and the caller must ack
    /// item by item with [`ack_in_run`](Ring::ack_in_run).
    ///
    /// A plain store is enough while nothing else can write the items' state words: a re-attach
    /// (the only other writer of a `DELIVERED` word of the current epoch) needs the seat, and a
    /// stale handle (which lowers the holder count of its item's word) exists only while
    /// `stale > 0`, and only a re-attach, under the seat, makes one. So this takes the seat
    /// from `epoch` (failing if a re-attach took the items back, or if the consumer is inside a
    /// receive step), then checks `stale == 0`, stores the words and gives the seat back
    /// (P21 in the memory-ordering chapter).
    pub(crate) fn ack_run_seated(&self, epoch: u64, index: u64, gens: &[u32], attempt: u32) -> bool {
        let seated = (epoch << EPOCH_SHIFT) | ATTACHED;
        // Acquire: pairs with the Release that gave the seat back (a re-attach's, so its `stale`
        // increments are seen below). Fails if the seat is busy or our epoch is gone.
        if self
            .cons
            .seat
            .compare_exchange(seated, seated | BUSY, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        // Acquire: pairs with the Release decrement of every stale handle that ended (one
        // release sequence on `stale`): reading 0, each one's holder RMW on its item's word
        // happens before our stores, so none is overwritten.
        let plain = self.cons.stale.load(Ordering::Acquire) == 0;
        // Debug builds check each word is the delivery's own (our generation, our one holder,
        // DELIVERED), and report a mismatch only after the seat is given back.
        let mut mismatch = None;
        if plain {
            let attempt = u64::from(attempt.min(0xFFFF)) << ATTEMPT_SHIFT;
            for (j, &g) in gens.iter().enumerate() {
                let state = self.state(index + j as u64);
                let delivered = (u64::from(g) << GEN_SHIFT) | HOLDER_ONE | attempt | DELIVERED;
                if cfg!(debug_assertions) && mismatch.is_none() {
                    let now = state.load(Ordering::Relaxed);
                    mismatch = (now != delivered).then_some((index + j as u64, now, delivered));
                }
                // Release: as the ack's compare-and-swap (`ack_slot`): the sink's writes and our
                // reads of the item happen before the advancer's Acquire of the ACKED word.
                state.store((u64::from(g) << GEN_SHIFT) | attempt | ACKED, Ordering::Release);
            }
        }
        // Release: pairs with the next seat-taker's Acquire.
        self.cons.seat.store(seated, Ordering::Release);
        if let Some((i, now, delivered)) = mismatch {
            panic!("seat-held ack of item {i}: its word is {now:#x}, not its delivery's {delivered:#x}");
        }
        plain
    }

    /// Ends a run's acks: one advancer request for every item acked by
    /// [`ack_in_run`](Ring::ack_in_run).
    pub(crate) fn run_acked(&self) {
        self.request_advance();
    }

    /// Releases items `index..index + gens.len()` of a run for redelivery
    /// ([L6](crate::contract#l6)): as many single nacks, with one `released` increment and one
    /// wake-up for all of them.
    ///
    /// # Panics
    /// As [`nack`](Ring::nack): an item's drop panic, if ending a stale handle let it go; the
    /// items before it are released and the caller must not release them again.
    pub(crate) fn nack_run(&self, index: u64, gens: &[u32], mut done: impl FnMut(usize)) {
        // Count every release before any slot shows RELEASED, as `nack` does for one item; the
        // count of an item a re-attach took back is given back below. Relaxed: as in `nack`.
        self.cons.released.fetch_add(gens.len(), Ordering::Relaxed);
        // If ending a stale handle below panics, the items after it were counted and not
        // released: the guard gives their counts back (the caller releases them again).
        let mut uncounted = Uncounted { released: &self.cons.released, left: gens.len() };
        let mut released = 0;
        for (j, &g) in gens.iter().enumerate() {
            done(j + 1);
            uncounted.left -= 1;
            if self.release_slot(index + j as u64, u64::from(g) << GEN_SHIFT) {
                released += 1;
            } else {
                // Relaxed: as in `nack` (a re-attach counted it).
                self.cons.released.fetch_sub(1, Ordering::Relaxed);
                self.end_stale(index + j as u64);
            }
        }
        if released > 0 {
            self.shape.cells.items.notify();
        }
    }
}
