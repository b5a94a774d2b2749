//! The consumer side and its seat: attaching (and re-attaching), taking the next delivery
//! (redeliveries first), the readiness checks used for waiting.

use std::task::Waker;
use std::time::Instant;

use crossbeam_utils::Backoff;

use super::slot::CURSOR_SHIFT;
use super::slot::{
    attempt, delivered_word, gen, holders, tag, with_tag, ACKED, DELIVERED, MAX_HOLDERS, RELEASED, SKIPPED,
};
use super::{Ring, ATTACHED, BUSY, EPOCH_SHIFT};
use crate::sync::Ordering;
use crate::wait;

/// What the seated consumer found.
pub(crate) enum Take {
    /// A delivery of item `index`, with the slot's new state word.
    Item {
        index: u64,
        word: u64,
    },
    Empty,
    /// The next redelivery waits for one of its item's live deliveries to end (the holder count
    /// is at its bound); nothing else may be delivered before it.
    Blocked,
    Closed,
    Detached,
}

impl<T> Ring<T> {
    /// Attaches a new consumer ([L8](crate::contract#l8)): takes the next epoch (detaching the
    /// previous consumer, if any), releases every delivered item for redelivery, and returns the
    /// new epoch. With `detach == false`, refuses (`None`) while a consumer is attached.
    pub(crate) fn attach(&self, detach: bool) -> Option<u64> {
        let backoff = Backoff::new();
        // Relaxed: the compare-and-swap below is what synchronises.
        let mut seat = self.cons.seat.load(Ordering::Relaxed);
        loop {
            if !detach && seat & ATTACHED != 0 {
                return None;
            }
            if seat & BUSY != 0 {
                // The old consumer is inside a non-blocking receive step; it ends shortly.
                crate::sync::spin(&backoff);
                seat = self.cons.seat.load(Ordering::Relaxed);
                continue;
            }
            // Acquire: pairs with the Release of the last seat-holder (the old consumer leaving
            // a receive step, or dropping), so its `next` and slot writes are visible here.
            let epoch = (seat >> EPOCH_SHIFT) + 1;
            match self.cons.seat.compare_exchange_weak(
                seat,
                (epoch << EPOCH_SHIFT) | ATTACHED | BUSY,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => seat = now,
            }
        }
        let epoch = (seat >> EPOCH_SHIFT) + 1;
        // Relaxed: the seat's Acquire above ordered us after the last consumer that wrote it.
        let next = self.cons.next.load(Ordering::Relaxed);
        // Acquire: pairs with the advancer's Release store of `free` (slots below are empty).
        let mut i = self.adv.free.load(Ordering::Acquire);
        let mut taken_back = 0;
        while i < next {
            let state = self.state(i);
            let mut word = state.load(Ordering::Acquire);
            // AcqRel: races a late ack or nack of the same delivery, and stale handles ending
            // (holder count); exactly one of ack and take-back wins (L8).
            while tag(word) == DELIVERED {
                match state.compare_exchange_weak(
                    word,
                    with_tag(word, RELEASED),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        // Release: pairs with the consumer's Acquire load of `released`.
                        self.cons.released.fetch_add(1, Ordering::Release);
                        taken_back += 1;
                        break;
                    }
                    Err(now) => word = now,
                }
            }
            i += 1;
        }
        // The outstanding rest of a plain run (P26): its words become the RELEASED words of
        // taken-back deliveries, each holding the old run's handle. Relaxed: written under the
        // seat, whose Acquire above ordered us after their writers.
        let plain_from = self.cons.plain_acked.load(Ordering::Relaxed);
        let plain_end = self.cons.plain_end.load(Ordering::Relaxed);
        if plain_from < plain_end {
            self.materialize_plain(plain_from, plain_end, 1);
            taken_back += (plain_end - plain_from) as usize;
        }
        if taken_back > 0 {
            // Each delivery taken back leaves its handle stale until it ends. Counted before the
            // seat is given back (Release below), so a seat-held run ack sees it (P21). Relaxed:
            // ordered by that Release; the handles' decrements are RMWs on the same atomic.
            self.cons.stale.fetch_add(taken_back, Ordering::Relaxed);
        }
        // Release: pairs with the next seat-taker's Acquire.
        self.cons.seat.store((epoch << EPOCH_SHIFT) | ATTACHED, Ordering::Release);
        // Wake a detached consumer parked in `recv`, so it returns `Detached`.
        self.shape.cells.items.notify();
        Some(epoch)
    }

    /// The consumer of `epoch` goes away: the seat shows no attached consumer, unless a newer
    /// one took it already.
    pub(crate) fn detach(&self, epoch: u64) {
        let seated = (epoch << EPOCH_SHIFT) | ATTACHED;
        let backoff = Backoff::new();
        // Release: pairs with the next `attach`'s Acquire (our `next` and slot writes). The
        // seat is BUSY with our epoch only while a run of ours is acked or released on
        // another thread (`ack_run`, `release_run`: a few stores): wait for it.
        while let Err(now) = self.cons.seat.compare_exchange(
            seated,
            epoch << EPOCH_SHIFT,
            Ordering::Release,
            Ordering::Relaxed,
        ) {
            if now != seated | BUSY {
                return; // a newer consumer took the seat
            }
            crate::sync::spin(&backoff);
        }
    }

    /// One non-blocking receive step for the consumer of `epoch`: a redelivery first ([L2](crate::contract#l2), [L6](crate::contract#l6)),
    /// else the next queued item, else `Empty`/`Closed`. Never blocks ([L12](crate::contract#l12)).
    pub(crate) fn take(&self, epoch: u64, cached_tail: &mut u64) -> Take {
        if !self.readable(epoch) {
            // Nothing to take: answered without the seat's two writes (P5b).
            return Take::Empty;
        }
        let mut skipped = false;
        let taken =
            self.seated(epoch, || self.take_seated(cached_tail, &mut skipped)).unwrap_or(Take::Detached);
        if skipped {
            // The gaps passed are acked: one advancer request for all of them (P23).
            self.request_advance();
        }
        taken
    }

    /// Acks the gap at `state` (word `word`, `SKIPPED`) on the seated consumer's way past: the
    /// item is another lane's (P23).
    pub(super) fn pass_gap(&self, state: &crate::sync::AtomicU64, word: u64) {
        // Release: pairs with the advancer's Acquire of the word, as an ack's (P8). No handle
        // exists and only the seated consumer changes a queued slot's word.
        state.store(gen(word) | ACKED, Ordering::Release);
    }

    /// Runs `step` holding the seat of the consumer of `epoch` (P5 in the memory-ordering
    /// chapter): the receive steps, one item ([`take`](Ring::take)) or a run
    /// ([`take_run`](Ring::take_run)), go through here. `None` if another consumer was attached
    /// meanwhile: our epoch is gone.
    pub(super) fn seated<R>(&self, epoch: u64, step: impl FnOnce() -> R) -> Option<R> {
        // Acquire: pairs with the Release that gave the seat back (a re-attach, a seat-held run
        // ack, or our own previous step). Fails if another consumer was attached: our epoch is
        // gone. The seat is BUSY with our epoch only while a run of ours is acked or released
        // on another thread (`ack_run`, `release_run`: a few stores): wait for it.
        // The consumer may have gone away (`ATTACHED` clear) while its run is still acked or
        // released: that run's step takes the seat all the same, as long as no newer consumer
        // took the epoch; the bit is kept as it was.
        let backoff = Backoff::new();
        // Relaxed: the compare-and-swap below is what synchronises.
        let mut seat = self.cons.seat.load(Ordering::Relaxed);
        loop {
            if seat >> EPOCH_SHIFT != epoch {
                return None;
            }
            if seat & BUSY != 0 {
                crate::sync::spin(&backoff);
                seat = self.cons.seat.load(Ordering::Relaxed);
                continue;
            }
            match self.cons.seat.compare_exchange_weak(
                seat,
                seat | BUSY,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => seat = now,
            }
        }
        let taken = step();
        // Release: pairs with the next seat-taker's Acquire (re-attach reads `next` and the slot
        // words we wrote). While we hold `BUSY` nobody else changes the seat (every writer swaps
        // from a seat without it), so the value we took is the one to give back.
        self.cons.seat.store(seat, Ordering::Release);
        Some(taken)
    }

    fn take_seated(&self, cached_tail: &mut u64, skipped: &mut bool) -> Take {
        // Relaxed: `next` is written only by the seated consumer; the seat's Acquire ordered us
        // after the last writer.
        let mut next = self.cons.next.load(Ordering::Relaxed);
        // Relaxed: the scan acquires each slot word. Nack counts before its switch to RELEASED,
        // re-attach counts under the seat; and a consumer that took one item of a released run
        // lowered the count itself (an RMW after the nack's increment), so it reads the count
        // of the run's other items (coherence) and never passes them for a new item.
        if self.cons.released.load(Ordering::Relaxed) > 0 {
            // A release counted but not switched yet (its nacker is between the two steps)
            // comes before anything new (L2): nothing is delivered until it shows.
            return self.take_released(next).unwrap_or(Take::Empty);
        }
        let now = match self.first_queued(&mut next, cached_tail, skipped) {
            Ok(word) => word,
            Err(closed) => return if closed { Take::Closed } else { Take::Empty },
        };
        let state = self.state(next);
        let word = delivered_word(now, 1);
        // Release: pairs with the Acquire of a re-attach scanning delivered slots. Nothing else
        // can change a queued slot's word, so a plain store suffices.
        state.store(word, Ordering::Release);
        // Release: `next` is read by re-attach (after the seat) and by statistics.
        self.cons.next.store(next + 1, Ordering::Release);
        // Relaxed: statistics; only the seated consumer writes.
        self.cons.delivered.store(self.cons.delivered.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        Take::Item { index: next, word }
    }

    /// Moves the seated consumer's `next` past the gaps queued at it (a shared ring's items for
    /// other lanes: each acked on the way past, `*skipped` set), reloading `tail` when `next`
    /// reaches the cached count. Returns the state word of the first queued item that is not a
    /// gap (item `*next`), or, when nothing more is queued, whether the lane is closed (`next`
    /// is stored first if gaps were passed).
    pub(super) fn first_queued(
        &self,
        next: &mut u64,
        cached_tail: &mut u64,
        skipped: &mut bool,
    ) -> Result<u64, bool> {
        loop {
            // `>=`: a freshly attached consumer's cache starts at 0, behind `next`.
            if *next >= *cached_tail {
                // Acquire: pairs with the publisher's Release compare-and-swap (the cell is
                // written) and with `close`'s Release RMW; `CLOSED` and the count are one
                // word, so a close we see brings every item published before it.
                let tail = self.shape.cells.cursor.load(Ordering::Acquire);
                *cached_tail = tail >> CURSOR_SHIFT;
                if *next == *cached_tail {
                    if *skipped {
                        // Release: as the receive steps' `next` store (the gaps passed are
                        // behind it).
                        self.cons.next.store(*next, Ordering::Release);
                    }
                    return Err(self.ended(tail));
                }
            }
            let state = self.state(*next);
            // Relaxed: the slot's last writer (the advancer emptying it, or the fan-out marking
            // a gap) is ordered before us by the `free` -> producer -> `tail` chain acquired
            // above. No handle exists, so no holder.
            let now = state.load(Ordering::Relaxed);
            if tag(now) != SKIPPED {
                return Ok(now);
            }
            self.pass_gap(state, now);
            *next += 1;
            *skipped = true;
        }
    }

    /// Redelivers the lowest released item below `next`, if any.
    pub(super) fn take_released(&self, next: u64) -> Option<Take> {
        // Acquire: pairs with the advancer's Release of `free`.
        let mut i = self.adv.free.load(Ordering::Acquire);
        let mut start = i;
        while i < next {
            let state = self.state(i);
            // Acquire: pairs with the Release (AcqRel) switch to RELEASED by nack or re-attach.
            let mut word = state.load(Ordering::Acquire);
            if tag(word) == RELEASED {
                // Re-read `free` after the state: if item `i` was still unreclaimed then, the
                // slot held item `i` (a later item enters only after `i` is reclaimed), and a
                // released item is never reclaimed. Otherwise start again from the new prefix.
                let free = self.adv.free.load(Ordering::Acquire);
                if free > i {
                    i = free;
                    start = free;
                    continue;
                }
                // A release that landed below `i` after the scan passed it comes first (L2):
                // one thread releases in lane order (a released run, in-order nacks), so having
                // acquired this RELEASED word we see that thread's earlier switches. Look again
                // below `i`; the lowest released item wins (`i` only decreases here).
                if let Some(j) = (start..i).find(|&j| tag(self.state(j).load(Ordering::Acquire)) == RELEASED)
                {
                    i = j;
                    continue;
                }
                // Only the seated consumer changes a RELEASED word's tag (acks and nacks expect
                // DELIVERED), but stale handles ending may lower its holder count meanwhile.
                let new = loop {
                    if holders(word) >= MAX_HOLDERS {
                        // The holder count is at its bound: detached consumers still hold
                        // `MAX_HOLDERS` live deliveries of this item. Redeliver it only once one
                        // of them ends; until then nothing is delivered, and no later item
                        // overtakes it (L2). The consumer backs off (see `Consumer::recv_deadline`).
                        return Some(Take::Blocked);
                    }
                    let new = delivered_word(word, attempt(word).saturating_add(1));
                    // Release: as for a first delivery.
                    match state.compare_exchange_weak(word, new, Ordering::Release, Ordering::Relaxed) {
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
        self.cons.seat.load(Ordering::Acquire) >> EPOCH_SHIFT
    }

    /// Whether a receive could make progress now (for waiting, and the receive steps' shortcut
    /// to `Empty`, P5b): something queued or released, the lane closed, or this consumer
    /// detached. Reads only: a poll that finds nothing writes nothing shared.
    pub(super) fn readable(&self, epoch: u64) -> bool {
        // Acquire loads, as in `take_seated`.
        (self.cons.seat.load(Ordering::Acquire) >> EPOCH_SHIFT) != epoch
            || self.cons.released.load(Ordering::Acquire) > 0
            || {
                let tail = self.shape.cells.cursor.load(Ordering::Acquire);
                self.ended(tail) || self.cons.next.load(Ordering::Acquire) != tail >> CURSOR_SHIFT
            }
    }

    /// [L11](crate::contract#l11): nothing queued and nothing released.
    pub(crate) fn is_empty(&self) -> bool {
        self.cons.released.load(Ordering::Acquire) == 0
            && self.cons.next.load(Ordering::Acquire) == self.published()
    }

    /// Waits (spin, then park) until a receive by the consumer of `epoch` could make progress.
    /// `false` if `deadline` passed first.
    pub(crate) fn wait_readable(&self, epoch: u64, deadline: Option<Instant>) -> bool {
        wait::block_until(
            &self.shape.cells.items,
            || self.shape.cells.want_items(),
            deadline,
            || self.readable(epoch).then_some(()),
        )
        .is_some()
    }

    /// One poll of the async form of [`wait_readable`](Ring::wait_readable): `true` if a
    /// receive could make progress now, else `waker` is registered under `key` (replacing an
    /// earlier registration, so re-polling never grows the list).
    pub(crate) fn poll_readable(&self, epoch: u64, key: &mut Option<u64>, waker: &Waker) -> bool {
        wait::poll_until(
            &self.shape.cells.items,
            || self.shape.cells.want_items(),
            key,
            waker,
            || self.readable(epoch).then_some(()),
        )
        .is_some()
    }

    /// Cancels a registration made by [`poll_readable`](Ring::poll_readable).
    pub(crate) fn cancel_readable(&self, key: &mut Option<u64>) {
        self.shape.cells.items.cancel(key);
    }
}
