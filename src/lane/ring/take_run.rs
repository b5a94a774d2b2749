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

use super::receive::Take;
use super::slot::CURSOR_SHIFT;
use super::slot::{
    delivered_word, gen, tag, ACKED, ATTEMPT_SHIFT, DELIVERED, GEN_SHIFT, HOLDER_ONE, SKIPPED,
};
use super::{Ring, ATTACHED, BUSY, EPOCH_SHIFT};
use crate::sync::{AtomicUsize, Ordering};

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
    /// `gen` field, shifted down) is in the caller's buffer, and every item has `attempt`.
    Run {
        index: u64,
        len: usize,
        attempt: u32,
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
                    return TakeRun::Run { index, len: 1, attempt: super::slot::attempt(word) };
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
        // Release: as in `take_seated` (`next` is read by re-attach after the seat, and by
        // statistics).
        self.cons.next.store(next + len as u64, Ordering::Release);
        // Relaxed: statistics; only the seated consumer writes.
        self.cons
            .delivered
            .store(self.cons.delivered.load(Ordering::Relaxed) + len as u64, Ordering::Relaxed);
        TakeRun::Run { index: next, len, attempt: 1 }
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
