//! The producer side: claiming the role, publishing into the slot at `tail`, waiting for room,
//! closing.

use std::task::Waker;
use std::time::Instant;

use std::ptr;

use super::wait;
use super::{Ring, CLOSED, ITEMS_WANTED, NO_POSITION, ROOM_WANTED, TAIL_SHIFT};
use crate::error::{PublishError, PublishTimeoutError, TryPublishError};
use crate::item::Item;
use crate::position::Position;
use crate::sync::Ordering;

impl<T> Ring<T> {
    /// Items published so far.
    #[inline]
    pub(super) fn published(&self) -> u64 {
        // Acquire: pairs with the producer's Release compare-and-swap on `tail` (the slot's item and
        // position are initialised).
        self.prod.tail.load(Ordering::Acquire) >> TAIL_SHIFT
    }

    /// Items whose slots are emptied: every handle of them ended.
    pub(crate) fn freed(&self) -> u64 {
        // Acquire: pairs with the advancer's Release store of `free` (the last reads of the items
        // below it happen before).
        self.adv.free.load(Ordering::Acquire)
    }

    /// Claims the producer role. `None` if a live producer holds it ([L9](crate::contract#l9)).
    pub(crate) fn claim_producer(&self) -> Option<ProducerState> {
        // Acquire: pairs with `release_producer`'s Release, so a restarted producer sees the
        // previous producer's `tail` and `last_published`.
        self.producer_live.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).ok()?;
        Some(ProducerState {
            // Relaxed: advanced only by producers, ordered by the claim above.
            tail: self.prod.tail.load(Ordering::Relaxed) >> TAIL_SHIFT,
            cached_free: self.adv.free.load(Ordering::Acquire),
            last: self.prod.last_published.load(Ordering::Relaxed),
        })
    }

    /// Gives the producer role back.
    pub(crate) fn release_producer(&self) {
        // Release: pairs with `claim_producer`'s Acquire.
        self.producer_live.store(false, Ordering::Release);
    }

    /// Publishes `item` unless the lane is closed, full, or the position regresses.
    ///
    /// The caller must hold the producer role (the `ProducerState` came from `claim_producer`
    /// and is used by one thread at a time).
    pub(crate) fn try_push(&self, p: &mut ProducerState, item: T) -> Result<(), TryPublishError<T>>
    where
        T: Item,
    {
        // Relaxed: only a shortcut (a closed lane refuses before it reports `Full`, so a waiting
        // publish ends); the compare-and-swap below is what decides.
        if self.prod.tail.load(Ordering::Relaxed) & CLOSED != 0 {
            return Err(TryPublishError::Closed(item));
        }
        let position = match item.position() {
            Some(Position(u64::MAX)) => return Err(TryPublishError::InvalidPosition(item)),
            Some(pos) => {
                if p.last != NO_POSITION && pos.0 <= p.last {
                    return Err(TryPublishError::PositionRegressed {
                        item,
                        position: pos,
                        last: Position(p.last),
                    });
                }
                pos.0
            }
            None => NO_POSITION,
        };
        if p.tail - p.cached_free >= self.shape.capacity {
            // Acquire: pairs with the advancer's Release store of `free`: the slot's old item
            // was moved out before we overwrite it.
            p.cached_free = self.adv.free.load(Ordering::Acquire);
            if p.tail - p.cached_free >= self.shape.capacity {
                return Err(TryPublishError::Full(item));
            }
        }
        debug_assert!(!self.is_shared(), "a shared ring is published to by its fan-out only");
        let cell = self.cell(p.tail);
        // SAFETY: item `tail` is not published, and `tail - free < capacity` means the slot's
        // previous item (`tail - capacity`) was moved out by the advancer, which then stored
        // `free` with Release (acquired above). No other thread touches the slot's cells until
        // the `tail` update below publishes them.
        unsafe {
            cell.item.with_mut(|c| (*c).write(item));
            cell.position.with_mut(|c| *c = position);
        }
        // Publishing and closing are one atomic step against each other (L3, L10): the count and
        // `CLOSED` share the `tail` word, so either our compare-and-swap lands before `close`'s
        // RMW (a consumer that sees the close sees the item) or it fails on `CLOSED` and the item
        // is handed back.
        // Release: pairs with the consumer's Acquire loads of `tail` (publishes the slot).
        // An RMW, so it also sees an `ITEMS_WANTED` set by a consumer about to wait: either we
        // see the bit (and clear it in the same step), or the consumer's RMW comes after ours and
        // its re-check sees the item. Failure: Relaxed, we only learn the flags.
        let mut seen = p.tail << TAIL_SHIFT;
        loop {
            if seen & CLOSED != 0 {
                // SAFETY: we wrote item `tail` above and it was never published, so no other
                // thread can reach the slot's item; we take it back out exactly once.
                let item = unsafe { cell.item.with(|c| ptr::read(c).assume_init()) };
                return Err(TryPublishError::Closed(item));
            }
            match self.prod.tail.compare_exchange_weak(
                seen,
                (p.tail + 1) << TAIL_SHIFT,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => seen = now,
            }
        }
        p.tail += 1;
        if position != NO_POSITION {
            p.last = position;
            // Relaxed: statistics, and a restarted producer reads it after `claim_producer`.
            self.prod.last_published.store(position, Ordering::Relaxed);
        }
        if seen & ITEMS_WANTED != 0 {
            self.items.notify();
        }
        Ok(())
    }

    /// How many of `n` more items fit in the ring now (refreshing the producer's cached `free`
    /// when it is short). The caller holds the producer role.
    pub(crate) fn room(&self, p: &mut ProducerState, n: u64) -> u64 {
        if p.tail - p.cached_free + n > self.shape.capacity {
            // Acquire: as in `try_push` (pairs with the advancer's Release store of `free`).
            p.cached_free = self.adv.free.load(Ordering::Acquire);
        }
        (self.shape.capacity - (p.tail - p.cached_free)).min(n)
    }

    /// The last position published on the lane by this producer (`NO_POSITION` if none).
    pub(crate) fn last_position(p: &ProducerState) -> u64 {
        p.last
    }

    /// Publishes `n` items with one `tail` compare-and-swap: item `k` (`0..n`) is `make(k)`,
    /// with its position (or `NO_POSITION`). The caller holds the producer role and checked
    /// that `n` items fit ([`room`](Ring::room)) and that their positions are valid and grow
    /// past `last_position` ([L4](crate::contract#l4)). `false` if the lane is closed: nothing
    /// was published (the items made were dropped).
    pub(crate) fn push_run_checked(
        &self,
        p: &mut ProducerState,
        n: u64,
        mut make: impl FnMut(u64) -> (T, u64),
    ) -> bool {
        debug_assert!(n >= 1 && p.tail - p.cached_free + n <= self.shape.capacity);
        debug_assert!(!self.is_shared(), "a shared ring is published to by its fan-out only");
        // Relaxed: a shortcut, as in `try_push`; the compare-and-swap below decides.
        if self.prod.tail.load(Ordering::Relaxed) & CLOSED != 0 {
            return false;
        }
        let mut last = NO_POSITION;
        for k in 0..n {
            let (item, position) = make(k);
            let cell = self.cell(p.tail + k);
            // SAFETY: as in `try_push`, for each of items `tail..tail + n`: none is published,
            // and `tail + n - free <= capacity` (checked by the caller against a `free` loaded
            // with Acquire) means each slot's previous item was moved out by the advancer. No
            // other thread touches these cells until the `tail` update below publishes them.
            unsafe {
                cell.item.with_mut(|c| (*c).write(item));
                cell.position.with_mut(|c| *c = position);
            }
            if position != NO_POSITION {
                last = position;
            }
        }
        if self.publish_written(p, n, last) {
            return true;
        }
        for k in 0..n {
            // SAFETY: we wrote items `tail..tail + n` above and never published them, so no other
            // thread can reach them; each is taken back out exactly once.
            let item = unsafe { self.cell(p.tail + k).item.with(|c| ptr::read(c).assume_init()) };
            drop(item);
        }
        false
    }

    /// Marks item `tail` (the next to publish) a gap for this lane: a shared ring's item for
    /// another lane, which this lane's consumer acks on its way past without delivering it (P23).
    /// The caller holds the producer role, found room for the item ([`room`](Ring::room)) and
    /// publishes it next with [`publish_written`](Ring::publish_written).
    pub(crate) fn mark_gap(&self, p: &ProducerState) {
        debug_assert!(p.tail - p.cached_free < self.shape.capacity);
        let state = self.state(p.tail);
        // Relaxed: the slot is empty and unpublished (its last writer, the advancer emptying it,
        // is ordered before us by the room check's Acquire of `free`), and the `tail` Release
        // that publishes it orders this store before the consumer's read.
        let word = state.load(Ordering::Relaxed);
        debug_assert_eq!(super::slot::tag(word), super::slot::EMPTY);
        state.store(super::slot::gen(word) | super::slot::SKIPPED, Ordering::Relaxed);
    }

    /// Publishes items `tail..tail + n`, whose cells the caller wrote (the last position among
    /// them is `last`, or `NO_POSITION`), with one `tail` compare-and-swap. `false` if the lane
    /// is closed: nothing was published and the cells are the caller's again. The caller holds
    /// the producer role: this lane's ([`push_run_checked`](Ring::push_run_checked)), or for a
    /// shared ring every lane's (the fan-out, which writes each shared cell once and then
    /// publishes it to every lane with this).
    pub(crate) fn publish_written(&self, p: &mut ProducerState, n: u64, last: u64) -> bool {
        // Release, one RMW for the whole run: as in `try_push` (publishes every cell written
        // before it; an RMW, so it sees `ITEMS_WANTED`, and fails on `CLOSED`).
        let mut seen = p.tail << TAIL_SHIFT;
        loop {
            if seen & CLOSED != 0 {
                return false;
            }
            match self.prod.tail.compare_exchange_weak(
                seen,
                (p.tail + n) << TAIL_SHIFT,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => seen = now,
            }
        }
        p.tail += n;
        if last != NO_POSITION {
            p.last = last;
            // Relaxed: as in `try_push`.
            self.prod.last_published.store(last, Ordering::Relaxed);
        }
        if seen & ITEMS_WANTED != 0 {
            self.items.notify();
        }
        true
    }

    /// Marks that a consumer is about to wait for items (before its re-check).
    pub(crate) fn want_items(&self) {
        // AcqRel RMW: see `try_push`.
        self.prod.tail.fetch_or(ITEMS_WANTED, Ordering::AcqRel);
    }

    /// Marks that a producer is about to wait for room (before its re-check).
    pub(crate) fn want_room(&self) {
        // AcqRel RMW: totally ordered with the advancer's final compare-and-swap, which either
        // sees the bit (and wakes us) or is read by this RMW, so our re-check sees its `free`.
        self.adv.advance.fetch_or(ROOM_WANTED, Ordering::AcqRel);
    }

    /// Whether a publish could make progress now: room in the ring, or the lane closed.
    fn writable(&self) -> bool {
        // Acquire: `free` as in `try_push`; `tail` pairs with `close`'s Release. Load `free`
        // first: both counters only grow and `free <= tail`, so `tail - free` cannot underflow.
        let free = self.adv.free.load(Ordering::Acquire);
        let tail = self.prod.tail.load(Ordering::Acquire);
        tail & CLOSED != 0 || (tail >> TAIL_SHIFT) - free < self.shape.capacity
    }

    /// Waits (spin, then park) until a publish could make progress. `false` if `deadline`
    /// passed first.
    pub(crate) fn wait_writable(&self, deadline: Option<Instant>) -> bool {
        wait::block_until(&self.room, || self.want_room(), deadline, || self.writable().then_some(()))
            .is_some()
    }

    /// As [`wait_writable`](Ring::wait_writable), and also returns once `also` holds:
    /// `register_more` runs in each round after this lane's registration and before the
    /// re-check, so a waiter it registers on other lists (checked by `also`) is woken by their
    /// notifiers too.
    pub(crate) fn wait_writable_or(
        &self,
        deadline: Option<Instant>,
        mut register_more: impl FnMut(),
        also: impl Fn() -> bool,
    ) -> bool {
        let arm = || {
            self.want_room();
            register_more();
        };
        wait::block_until(&self.room, arm, deadline, || (self.writable() || also()).then_some(())).is_some()
    }

    /// One poll of the async form of [`wait_writable`](Ring::wait_writable); the caller keeps
    /// `key` and cancels it when its future is dropped.
    pub(crate) fn poll_writable(&self, key: &mut Option<u64>, waker: &Waker) -> bool {
        wait::poll_until(&self.room, || self.want_room(), key, waker, || self.writable().then_some(()))
            .is_some()
    }

    /// Registers a waiter (the task of `waker`, or the current thread for `None`) on the room
    /// list **without** asking for room: it is woken by a [`close`](Ring::close) (and by any
    /// notification the list gets for another waiter), not by acks. A fan-out publish waiting for
    /// one lane's room registers so on every other lane, to see any lane's close at once. Cancel
    /// with [`cancel_writable`](Ring::cancel_writable).
    pub(crate) fn register_close_waiter(&self, key: &mut Option<u64>, waker: Option<&Waker>) {
        self.room.register(key, waker);
    }

    /// Cancels a registration made by [`poll_writable`](Ring::poll_writable) (a future dropped
    /// or done).
    pub(crate) fn cancel_writable(&self, key: &mut Option<u64>) {
        self.room.cancel(key);
    }

    /// Publishes `item` with `try_push`, waiting for room while it comes back `Full`: the
    /// blocking publish of the lane producer and of the request lane's senders.
    pub(crate) fn publish_blocking(
        &self,
        mut item: T,
        mut try_push: impl FnMut(T) -> Result<(), TryPublishError<T>>,
    ) -> Result<(), PublishError<T>> {
        loop {
            match try_push(item).map_err(TryPublishError::into_waitable) {
                Ok(()) => return Ok(()),
                Err(Ok(back)) => item = back,
                Err(Err(refused)) => return Err(refused),
            }
            self.wait_writable(None);
        }
    }

    /// As [`publish_blocking`](Ring::publish_blocking), giving up at `deadline`.
    pub(crate) fn publish_until(
        &self,
        mut item: T,
        deadline: Instant,
        mut try_push: impl FnMut(T) -> Result<(), TryPublishError<T>>,
    ) -> Result<(), PublishTimeoutError<T>> {
        loop {
            match try_push(item).map_err(TryPublishError::into_waitable) {
                Ok(()) => return Ok(()),
                Err(Ok(back)) => item = back,
                Err(Err(refused)) => return Err(refused.into()),
            }
            if !self.wait_writable(Some(deadline)) {
                return Err(PublishTimeoutError::Timeout(item));
            }
        }
    }

    /// Closes the lane ([L10](crate::contract#l10)): publishing fails with `Closed` from now on, consumers drain what
    /// is queued or released and then see the end. Takes no slot. Wakes every waiter.
    pub(crate) fn close(&self) {
        // An RMW on `tail`, so it is ordered against every publish (see `try_push`): a consumer
        // that sees `CLOSED` sees the count of every item published before it. Release: pairs
        // with the consumers' and `is_closed`'s Acquire loads of `tail`.
        self.prod.tail.fetch_or(CLOSED, Ordering::Release);
        self.items.notify();
        self.room.notify();
    }

    pub(crate) fn is_closed(&self) -> bool {
        // Acquire: pairs with `close`'s Release.
        self.prod.tail.load(Ordering::Acquire) & CLOSED != 0
    }
}

/// The producer's private view: its `tail`, its cached `free`, its last position.
pub(crate) struct ProducerState {
    pub(crate) tail: u64,
    pub(super) cached_free: u64,
    pub(super) last: u64,
}
