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
use super::slot::{delivered_word, gen, GEN_SHIFT};
use super::{Ring, CLOSED, TAIL_SHIFT};
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
        // The seat, taken and given back as for one item (P5, P16).
        self.seated(epoch, || self.take_run_seated(cached_tail, gens)).unwrap_or(TakeRun::Detached)
    }

    fn take_run_seated(&self, cached_tail: &mut u64, gens: &mut [u32]) -> TakeRun {
        // Relaxed: as in `take_seated` (only the seated consumer writes `next`).
        let next = self.cons.next.load(Ordering::Relaxed);
        // Relaxed: a hint to scan, as in `take_seated`.
        if self.cons.released.load(Ordering::Relaxed) > 0 {
            match self.take_released(next) {
                Some(Take::Item { index, word }) => {
                    gens[0] = (gen(word) >> GEN_SHIFT) as u32;
                    return TakeRun::Run { index, len: 1, attempt: super::slot::attempt(word) };
                }
                Some(_) => return TakeRun::Blocked,
                None => {}
            }
        }
        // Reload `tail` whenever the cached count cannot fill the run (once per run, not per
        // item). `>=` / saturating: a freshly attached consumer's cache starts at 0.
        if cached_tail.saturating_sub(next) < gens.len() as u64 {
            // Acquire: as in `take_seated` (pairs with the producer's Release compare-and-swap
            // and with `close`'s Release RMW).
            let tail = self.prod.tail.load(Ordering::Acquire);
            *cached_tail = tail >> TAIL_SHIFT;
            if next == *cached_tail {
                return if tail & CLOSED != 0 { TakeRun::Closed } else { TakeRun::Empty };
            }
        }
        let len = (*cached_tail - next).min(gens.len() as u64) as usize;
        for (j, g) in gens[..len].iter_mut().enumerate() {
            let state = self.state(next + j as u64);
            // Relaxed load, Release store: as in `take_seated`, for every item below the `tail`
            // acquired above (the same `free` -> producer -> `tail` chain orders each slot's
            // last writer before us; no handle exists yet, so nothing else writes the word).
            let word = delivered_word(state.load(Ordering::Relaxed), 1);
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
            self.items.notify();
        }
    }
}
