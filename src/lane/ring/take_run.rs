//! Runs: one seat step that hands out a contiguous run of first deliveries, and the run's acks
//! and releases, each one seat step with one advancer request for the whole run.
//!
//! A run changes none of the per-item states: each item of a run is delivered with the same
//! state word as by [`take`](Ring::take) (next generation, one holder, attempt 1,
//! `DELIVERED`), and acked or released into the same word as a single handle's ack or nack, so
//! a re-attach takes back exactly the items of a run that were not acked yet and each item
//! lands xor is redelivered ([L8](crate::contract#l8)). What differs is who may write the
//! words: a run's acks and releases hold the seat from the run's epoch, so no re-attach can
//! take the items back meanwhile and the words are the run's own deliveries (P21) — no
//! generation per item is kept, and if the epoch is gone every outstanding item was taken back
//! (each is then ended as a stale handle). What a run saves is the shared traffic around those
//! steps: one seat compare-and-swap, one `tail` load, one `next` store and one statistics store
//! per run instead of per item on the receive side; one seat step and one advancer request
//! (`advance` RMW, `acked_end` and the acked mark) per run instead of a compare-and-swap and a
//! request per item on the ack side; one `released` RMW and one wake-up per released run.
//!
//! A run taken while nothing of the lane is in flight is *plain* (the ring's module docs): it
//! writes no state word at all, and its acks are one `plain_acked` store under the seat. Its
//! items become ordinary state words (`RELEASED`) only if it is released or a re-attach takes
//! it back, so the per-item protocol above is what every other step sees.

use super::receive::Take;
use super::slot::CURSOR_SHIFT;
use super::slot::{delivered_word, holders, tag, with_tag, ACKED, DELIVERED, HOLDER_ONE, RELEASED, SKIPPED};
use super::{Ring, BUSY};
use crate::sync::Ordering;
use crossbeam_utils::Backoff;

/// What one run step found.
pub(crate) enum TakeRun {
    /// Items `index..index + len` were delivered, every one with `attempt`. A `plain` run wrote
    /// no state word (ring docs, "Plain runs"); its acks and release say so to
    /// [`ack_run`](Ring::ack_run) and [`release_run`](Ring::release_run).
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
    /// One non-blocking receive step for the consumer of `epoch` that delivers up to `max`
    /// (>= 1) items: a redelivery alone if one is released (released items come first,
    /// [L2](crate::contract#l2); a run of redeliveries would not be contiguous), else a
    /// contiguous run of queued items, each delivered for the first time. Never blocks
    /// ([L12](crate::contract#l12)).
    pub(crate) fn take_run(&self, epoch: u64, cached_tail: &mut u64, max: usize) -> TakeRun {
        debug_assert!(max >= 1);
        if !self.readable(epoch) {
            // As in `take`: nothing to take, answered without the seat (P5b).
            return TakeRun::Empty;
        }
        // The seat, taken and given back as for one item (P5, P16).
        let mut skipped = false;
        let taken = self
            .seated(epoch, || self.take_run_seated(cached_tail, max, &mut skipped))
            .unwrap_or(TakeRun::Detached);
        if skipped {
            // As in `take`: one advancer request for the gaps passed (P23).
            self.request_advance();
        }
        taken
    }

    fn take_run_seated(&self, cached_tail: &mut u64, max: usize, skipped: &mut bool) -> TakeRun {
        // Relaxed: as in `take_seated` (only the seated consumer writes `next`).
        let mut next = self.cons.next.load(Ordering::Relaxed);
        // Relaxed: a hint to scan, as in `take_seated`.
        if self.cons.released.load(Ordering::Relaxed) > 0 {
            match self.take_released(next) {
                Some(Take::Item { index, word }) => {
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
        if cached_tail.saturating_sub(next) < max as u64 {
            // Acquire: as in `first_queued` (pairs with the producer's Release compare-and-swap).
            *cached_tail = self.shape.cells.cursor.load(Ordering::Acquire) >> CURSOR_SHIFT;
        }
        let mut len = (*cached_tail - next).min(max as u64) as usize;
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
        for j in 0..len {
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
            state.store(delivered_word(now, 1), Ordering::Release);
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

    /// Acks items `from..end` of a run received by the consumer of `epoch` (`plain` as the
    /// run's take said), holding the seat: `true` if done (the caller then requests one
    /// advance with [`run_acked`](Ring::run_acked)), `false` if a re-attach took the run's
    /// outstanding items back first (each is stale: the caller ends it with
    /// [`end_stale`](Ring::end_stale); this waited until the re-attach was done). Waits out a
    /// receive step of the consumer on another thread, as [`seated`](Ring::seated) does.
    ///
    /// Holding the seat from the run's epoch, no re-attach can take the items back meanwhile,
    /// so each item's word is its delivery by this run (P21): a plain run's acks are one
    /// `plain_acked` store (P26); another run's are one plain store per item while no stale
    /// handle can lower a holder count, else the ack's compare-and-swap per item.
    ///
    /// # Panics
    /// If a word is not the run's delivery (an engine bug: checked in debug builds, and by the
    /// compare-and-swap in any build), after giving the seat back.
    pub(crate) fn ack_run(&self, epoch: u64, from: u64, end: u64, plain: bool) -> bool {
        let seated = self.seated(epoch, || {
            // The first item whose word is not the run's delivery (checked in debug builds),
            // reported after the seat is given back (a panic under the seat would keep it busy).
            let mut mismatch = None;
            if plain {
                // Relaxed: written under the seat only.
                let acked = self.cons.plain_acked.load(Ordering::Relaxed);
                let plain_end = self.cons.plain_end.load(Ordering::Relaxed);
                if cfg!(debug_assertions) && (acked != from || end > plain_end) {
                    mismatch = Some((from, acked));
                }
                // Release: pairs with the advancer's Acquire load (P26): the sink's writes and
                // the run's reads of its items happen before the advancer passes them (and
                // before the acked mark and `free` it then publishes).
                self.cons.plain_acked.store(end, Ordering::Release);
                return mismatch;
            }
            // Acquire: pairs with the Release decrement of every stale handle that ended (one
            // release sequence on `stale`): reading 0, each one's holder RMW on its item's word
            // happens before our stores, so none is overwritten (P21).
            let alone = self.cons.stale.load(Ordering::Acquire) == 0;
            for i in from..end {
                let state = self.state(i);
                // Relaxed: the word is this run's delivery (the seat's Acquire ordered us after
                // its take); only a stale handle's holder RMW may change it meanwhile.
                let word = state.load(Ordering::Relaxed);
                if cfg!(debug_assertions) && (tag(word) != DELIVERED || (alone && holders(word) != 1)) {
                    mismatch.get_or_insert((i, word));
                }
                if alone {
                    // Release: as the ack's compare-and-swap (`ack_slot`): the sink's writes and
                    // our reads of the item happen before the advancer's Acquire of the ACKED word.
                    state.store(with_tag(word, ACKED) - HOLDER_ONE, Ordering::Release);
                } else if !self.ack_slot(i, word) {
                    mismatch.get_or_insert((i, word));
                }
            }
            mismatch
        });
        match seated {
            Some(None) => true,
            Some(Some((i, found))) => {
                panic!("run ack of item {i} under the seat found {found:#x}, not the run's delivery")
            }
            None => {
                self.taken_back();
                false
            }
        }
    }

    /// After a run's seat step found its epoch gone: waits until the re-attach that took the
    /// epoch has given the seat back, so that its take-back of the run's items (a plain run's
    /// items get their `RELEASED` words and holder counts, another run's keep their holders)
    /// happens before the caller ends them as stale handles (P26).
    fn taken_back(&self) {
        let backoff = Backoff::new();
        // Acquire: pairs with the re-attach's Release store that gave the seat back (or a later
        // seat-holder's, ordered after it). A seat without `BUSY` and with a newer epoch is only
        // ever stored after that re-attach's take-back.
        while self.cons.seat.load(Ordering::Acquire) & BUSY != 0 {
            crate::sync::spin(&backoff);
        }
    }

    /// Releases items `from..end` of a run received by the consumer of `epoch` (its un-acked
    /// rest) for redelivery ([L6](crate::contract#l6)), holding the seat as
    /// [`ack_run`](Ring::ack_run) does, with one wake-up: each item gets the word a nack
    /// leaves (`RELEASED`, no holder of this delivery; a plain item gets the next generation
    /// and attempt 1). `false` if a re-attach took them back first (the caller ends each stale
    /// item with [`end_stale`](Ring::end_stale)).
    ///
    /// # Panics
    /// As [`ack_run`](Ring::ack_run), unless the thread is already panicking (a run dropped
    /// while unwinding from its own ack's panic).
    pub(crate) fn release_run(&self, epoch: u64, from: u64, end: u64, plain: bool) -> bool {
        let released = self.seated(epoch, || {
            // As in `ack_run`.
            let mut mismatch = None;
            if plain {
                // Relaxed: written under the seat only.
                let acked = self.cons.plain_acked.load(Ordering::Relaxed);
                let plain_end = self.cons.plain_end.load(Ordering::Relaxed);
                if cfg!(debug_assertions) && (acked, plain_end) != (from, end) {
                    mismatch = Some((from, acked));
                }
                self.materialize_plain(from, end, 0);
                return mismatch;
            }
            // Counted before any slot shows RELEASED, as `nack` counts one (P7). Relaxed: as
            // in `nack` (the consumer acquires the slot word itself).
            self.cons.released.fetch_add((end - from) as usize, Ordering::Relaxed);
            for i in from..end {
                // Relaxed: as in `ack_run`. The nack's compare-and-swap (which a stale handle's
                // holder RMW may make retry, never fail).
                let word = self.state(i).load(Ordering::Relaxed);
                if !self.release_slot(i, word) {
                    // Not released: its count goes back, as a refused `nack`'s (a count with no
                    // `RELEASED` slot behind it would keep the consumer scanning for ever).
                    // Relaxed: as above.
                    self.cons.released.fetch_sub(1, Ordering::Relaxed);
                    mismatch.get_or_insert((i, word));
                }
            }
            mismatch
        });
        match released {
            Some(None) => {
                self.shape.cells.items.notify();
                true
            }
            Some(Some((i, found))) => {
                if !std::thread::panicking() {
                    panic!("run release of item {i} under the seat found {found:#x}, not the run's delivery");
                }
                true
            }
            None => {
                self.taken_back();
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

    /// Ends a run's acks: one advancer request for every item acked by
    /// [`ack_run`](Ring::ack_run).
    pub(crate) fn run_acked(&self) {
        self.request_advance();
    }
}
