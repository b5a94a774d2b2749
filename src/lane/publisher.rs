//! The publisher: the one engine behind every publishing end — a stream's [`Fanout`], a
//! standalone lane's [`Producer`] and the request lane's senders.
//!
//! It holds the producer role of the stream's cells ([L9](crate::contract#l9)), writes each item
//! once into the next cell and publishes it to every lane with one compare-and-swap of the one
//! cursor. Before each publish it loads every lane's `free` (Acquire), which tells it both how
//! much room there is and which items every lane has freed: those are dropped then, so memory
//! held tracks what is unacked ([M3](crate::contract#m3)), and their charges leave the memory
//! budget ([M4](crate::contract#m4)).
//!
//! One blocking body, [`Publisher::publish_until`] (deadline `None`: wait for ever), serves the
//! blocking, timed and deadline forms; [`Publisher::poll_publish`] is its async step. Both wait
//! for the lane that is short of room (or holds the oldest item, for the budget) through the
//! shared room list: register, set that lane's `ROOM_WANTED` wish, re-check, park.
//!
//! [`Fanout`]: crate::Fanout
//! [`Producer`]: crate::Producer

use std::task::Waker;
use std::time::Instant;

use super::ring::{Cells, Ring, NO_POSITION};
use super::{discard_panic, keep_first_panic, CaughtPanic, MAX_RUN};
use crate::error::PublishError;
use crate::item::Item;
use crate::position::Position;
use crate::sync::{lock, Arc, Mutex, Ordering};
use crate::wait;

/// Why an item cannot be published now.
pub(crate) enum Refusal {
    /// Lane `lane` must free items below `need` first (its room, or the budget's oldest item).
    Full {
        lane: usize,
        need: u64,
    },
    Closed,
    Regressed {
        position: Position,
        last: Position,
    },
    Invalid,
}

impl Refusal {
    /// The error of a publish refused for this reason, carrying `value` (a waiting publish waits
    /// out `Full` and never asks for it).
    pub(crate) fn error<V>(self, value: V) -> PublishError<V> {
        match self {
            Refusal::Full { .. } => PublishError::Full(value),
            Refusal::Closed => PublishError::Closed(value),
            Refusal::Regressed { position, last } => {
                PublishError::PositionRegressed { item: value, position, last }
            }
            Refusal::Invalid => PublishError::InvalidPosition(value),
        }
    }
}

/// The producer role over a stream's cells and lanes.
pub(crate) struct Publisher<T> {
    cells: Arc<Cells<T>>,
    lanes: Box<[Arc<Ring<T>>]>,
    /// Items published: the cursor's count (only the role's holder advances it).
    tail: u64,
    /// The last position published, `NO_POSITION` if none ([L4](crate::contract#l4)).
    last: u64,
    /// The lowest `free` over the lanes at the last load, and the lane that had it.
    min_free: u64,
    slowest: usize,
    /// The charges [`admissible`](Publisher::admissible) computed for the items it admitted, in
    /// order, handed to [`push`](Publisher::push) (budgeted streams only: each is O(envelopes)).
    charges: Vec<u64>,
    /// A drop panic caught in a step that was then refused: kept so that the refused items go
    /// back to the caller, and resumed after the next step that publishes, or by the drop
    /// ([M3](crate::contract#m3)). Never locked: reached through `&mut self` only
    /// ([`kept_panic`](Publisher::kept_panic)); the mutex makes the payload (`Send`, not `Sync`)
    /// shareable, so the ends stay `Sync`, and loom need not model it.
    kept_panic: std::sync::Mutex<Option<CaughtPanic>>,
}

// The role is used from one thread at a time (`&mut self`); the rings and cells are `Sync`.
impl<T> Publisher<T> {
    /// Claims the producer role of `cells`, read by `lanes` (every lane over them, in lane
    /// order). `None` while another publisher holds it.
    pub(crate) fn claim(cells: Arc<Cells<T>>, lanes: Box<[Arc<Ring<T>>]>) -> Option<Publisher<T>> {
        debug_assert!(lanes.iter().all(|lane| Arc::ptr_eq(lane.cells(), &cells)));
        // Acquire: pairs with `Drop`'s Release, so a restarted publisher sees the previous one's
        // cells and counters.
        cells.producer_live.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).ok()?;
        // Relaxed: the role's Acquire ordered us after the previous holder's writes.
        let tail = cells.counts.written.load(Ordering::Relaxed);
        let last = cells.counts.last_published.load(Ordering::Relaxed);
        // Room for a run's charges up front: no allocation per publish (M1).
        let charges = Vec::with_capacity(if cells.budget.is_some() { MAX_RUN } else { 0 });
        let mut publisher = Publisher {
            cells,
            lanes,
            tail,
            last,
            min_free: 0,
            slowest: 0,
            charges,
            kept_panic: Default::default(),
        };
        publisher.refresh();
        Some(publisher)
    }

    /// How many lanes it publishes to.
    pub(crate) fn lanes(&self) -> usize {
        self.lanes.len()
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.cells.capacity()
    }

    pub(crate) fn cells(&self) -> &Cells<T> {
        &self.cells
    }

    /// Loads every lane's `free` (Acquire, in `freed`) and keeps the lowest (with no lanes,
    /// everything published is free at once). When the slowest lane has not moved since the last
    /// load, the lowest has not either (`free` only grows, and every other lane was at
    /// `min_free` or past it then), so that one load answers: one load per publish, not one per
    /// lane, while the slowest lane holds the oldest item.
    fn refresh(&mut self) {
        if let Some(lane) = self.lanes.get(self.slowest) {
            if lane.freed() == self.min_free {
                return;
            }
        }
        let (mut min, mut slowest) = (self.tail, 0);
        for (i, lane) in self.lanes.iter().enumerate() {
            let free = lane.freed();
            if free < min {
                (min, slowest) = (free, i);
            }
        }
        (self.min_free, self.slowest) = (min, slowest);
    }

    /// Drops the items every lane freed. Returns a caught drop panic for the step to settle
    /// ([`settle`](Publisher::settle)).
    fn reclaim(&mut self) -> Result<(), CaughtPanic> {
        self.refresh();
        // SAFETY: we hold the producer role, and every lane's `free`, loaded with Acquire in
        // `refresh`, is at `min_free` or past it.
        unsafe { self.cells.reclaim(self.min_free) }
    }

    /// Checks `items` in order (positions against the last published and each other) and
    /// returns how many leading ones may go now (>= 1, at most `max`), or why the first cannot.
    /// Drops what every lane freed on the way ([`reclaim`](Publisher::reclaim)).
    fn admissible(
        &mut self,
        items: &[T],
        max: usize,
        dropped: &mut Result<(), CaughtPanic>,
    ) -> Result<usize, Refusal>
    where
        T: Item,
    {
        let mut last = (self.last != NO_POSITION).then_some(self.last);
        let mut n = 0;
        for item in items.iter().take(max) {
            match item.position() {
                Some(Position(u64::MAX)) => {
                    if n == 0 {
                        return Err(Refusal::Invalid);
                    }
                    break;
                }
                Some(p) => {
                    if let Some(l) = last.filter(|&l| p.0 <= l) {
                        if n == 0 {
                            return Err(Refusal::Regressed { position: p, last: Position(l) });
                        }
                        break;
                    }
                    last = Some(p.0);
                }
                None => {}
            }
            n += 1;
        }
        // Relaxed: a shortcut (a closed stream refuses before it reports `Full`, so a waiting
        // publish ends); the cursor's compare-and-swap is what decides.
        if self.cells.cursor.load(Ordering::Relaxed) & CLOSED != 0 {
            return Err(Refusal::Closed);
        }
        *dropped = self.reclaim();
        let room = self.cells.capacity() - (self.tail - self.min_free);
        if room == 0 {
            return Err(Refusal::Full { lane: self.slowest, need: self.tail + 1 - self.cells.capacity() });
        }
        n = n.min(room as usize);
        if let Some(budget) = self.cells.budget {
            let (held_items, mut held) = self.cells.held();
            let mut fit = 0;
            self.charges.clear();
            for item in &items[..n] {
                let charge = item.charge();
                // One item over the whole budget goes alone, once nothing else is held (M4).
                if held_items + fit as u64 > 0 && held.saturating_add(charge) > budget {
                    break;
                }
                held = held.saturating_add(charge);
                self.charges.push(charge);
                fit += 1;
            }
            if fit == 0 {
                // The oldest item held must be dropped first: the slowest lane frees it.
                return Err(Refusal::Full { lane: self.slowest, need: self.min_free + 1 });
            }
            n = fit;
        }
        Ok(n)
    }

    /// Copies `items` (just admitted by [`admissible`](Publisher::admissible), whose charges it
    /// takes on a budgeted stream) into the next cells, marks them gaps on every lane but `to`
    /// (if any), and publishes them to every lane with one compare-and-swap of the cursor.
    /// `Err` if the stream was closed meanwhile: nothing was published.
    ///
    /// # Safety
    /// On `Ok` the items now live in the cells: the caller must forget its copies (never use or
    /// drop them). On `Err` the cells' copies are abandoned (never read or dropped: `written`
    /// goes back) and the caller still owns `items`.
    unsafe fn push(&mut self, to: Option<usize>, items: &[T]) -> Result<(), ()>
    where
        T: Item,
    {
        let n = items.len() as u64;
        let budget = self.cells.budget.is_some();
        let mut last = NO_POSITION;
        let mut charged = 0;
        for (k, item) in items.iter().enumerate() {
            let index = self.tail + k as u64;
            let position = item.position().map_or(NO_POSITION, |p| p.0);
            let charge = if budget { self.charges[k] } else { 0 };
            if position != NO_POSITION {
                last = position;
            }
            charged += charge;
            // SAFETY: item `index` is not published, and the room check (against every lane's
            // `free`, loaded with Acquire) found `index - capacity` freed on every lane and
            // `reclaim` dropped it: no handle reads the cell and only we touch it until the
            // cursor update below publishes it. `item` is a live `T` outside the cells.
            unsafe { self.cells.write(index, item, position, charge) };
            if let Some(to) = to {
                for (j, lane) in self.lanes.iter().enumerate() {
                    if j != to {
                        lane.mark_gap(index);
                    }
                }
            }
        }
        // Relaxed: the publisher's own counters (see `Counts`).
        self.cells.counts.written.store(self.tail + n, Ordering::Relaxed);
        if charged != 0 {
            let held = self.cells.counts.held_bytes.load(Ordering::Relaxed);
            self.cells.counts.held_bytes.store(held + charged, Ordering::Relaxed);
        }
        match self.cells.publish(self.tail, n) {
            Ok(()) => {
                self.tail += n;
                if last != NO_POSITION {
                    self.last = last;
                    // Relaxed: statistics, and a restarted publisher reads it after its claim.
                    self.cells.counts.last_published.store(last, Ordering::Relaxed);
                }
                Ok(())
            }
            Err(()) => {
                // Nothing was published: the cells' copies are not items (`written` goes back),
                // the marks go.
                self.cells.counts.written.store(self.tail, Ordering::Relaxed);
                if charged != 0 {
                    let held = self.cells.counts.held_bytes.load(Ordering::Relaxed);
                    self.cells.counts.held_bytes.store(held - charged, Ordering::Relaxed);
                }
                if let Some(to) = to {
                    for index in self.tail..self.tail + n {
                        for (j, lane) in self.lanes.iter().enumerate() {
                            if j != to {
                                lane.unmark_gap(index);
                            }
                        }
                    }
                }
                Err(())
            }
        }
    }

    /// One attempt to publish `item` to every lane (`to == None`) or to lane `to` only; on
    /// refusal the item and why.
    ///
    /// The item is read where the caller put it and each result is built in place: a 48-byte
    /// item copied through a temporary, or a result built in a temporary and copied out, stalls
    /// on store forwarding (most of this step's time in `perf annotate`).
    pub(crate) fn try_step(&mut self, to: Option<usize>, item: T) -> Result<(), (T, Refusal)>
    where
        T: Item,
    {
        let mut dropped = Ok(());
        let admitted = self.admissible(std::slice::from_ref(&item), 1, &mut dropped);
        // SAFETY: on `Ok` the item lives in its cell and ours is forgotten at once (before a
        // caught drop panic is resumed); on `Err` it is still ours and goes back.
        let pushed = admitted.map(|_| unsafe { self.push(to, std::slice::from_ref(&item)) });
        if let Ok(Ok(())) = pushed {
            std::mem::forget(item);
            self.settle(dropped, true);
            return Ok(());
        }
        self.settle(dropped, false);
        match pushed {
            Ok(_) => Err((item, Refusal::Closed)),
            Err(refusal) => Err((item, refusal)),
        }
    }

    /// One attempt to publish the longest prefix of `items` that may go now, moving it out of
    /// the front of `items` into the cells; how many. On refusal `items` is as it was.
    pub(crate) fn try_step_run(&mut self, items: &mut Vec<T>) -> Result<usize, Refusal>
    where
        T: Item,
    {
        let mut dropped = Ok(());
        let done = match self.admissible(items, items.len(), &mut dropped) {
            // SAFETY: on `Ok` the first `n` items live in the cells and leave `items` without
            // being dropped (below); on `Err` they are still `items`' own.
            Ok(n) => match unsafe { self.push(None, &items[..n]) } {
                Ok(()) => {
                    let rest = items.len() - n;
                    // SAFETY: the first `n` items moved into the cells (forgotten here: the
                    // length goes to 0 first); the `rest` after them move to the front.
                    unsafe {
                        items.set_len(0);
                        std::ptr::copy(items.as_ptr().add(n), items.as_mut_ptr(), rest);
                        items.set_len(rest);
                    }
                    Ok(n)
                }
                Err(()) => Err(Refusal::Closed),
            },
            Err(refusal) => Err(refusal),
        };
        self.settle(dropped, done.is_ok());
        done
    }

    /// Ends a step that caught `dropped` ([M3](crate::contract#m3)): a step that published
    /// resumes the first drop panic caught (this step's, or one an earlier refused step kept)
    /// now that it is done; a refused step keeps it, so that its items go back to the caller
    /// rather than being dropped by the unwinding.
    fn settle(&mut self, dropped: Result<(), CaughtPanic>, published: bool) {
        if let Err(p) = dropped {
            keep_first_panic(self.kept_panic(), p);
        }
        if published {
            if let Some(p) = self.kept_panic().take() {
                std::panic::resume_unwind(p);
            }
        }
    }

    /// The kept drop panic's place (no lock taken: `&mut self` is exclusive; never poisoned,
    /// as it is never locked).
    fn kept_panic(&mut self) -> &mut Option<CaughtPanic> {
        self.kept_panic.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits until lane `lane` freed the items below `need`: see [`wait_room`].
    pub(crate) fn wait(&self, lane: usize, need: u64, deadline: Option<Instant>) -> bool {
        wait_room(&self.lanes[lane], need, deadline)
    }

    /// The one blocking publish of `item` to every lane (`to == None`) or to lane `to`
    /// ([`publish_until`]).
    pub(crate) fn publish_until(
        &mut self,
        to: Option<usize>,
        item: T,
        deadline: Option<Instant>,
    ) -> Result<(), PublishError<T>>
    where
        T: Item,
    {
        publish_until(&mut Target::Own(self, to), item, deadline)
    }

    /// Publishes every item of `items` in order, moving them out of it, in as few steps as room
    /// and budget allow, waiting while refused with `Full`: `items` is empty on `Ok`. `Err`
    /// carries how many were published; `items` holds exactly the rest, the refused one first.
    pub(crate) fn publish_run(&mut self, items: &mut Vec<T>) -> Result<(), PublishError<usize>>
    where
        T: Item,
    {
        let mut done = 0;
        while !items.is_empty() {
            match self.try_step_run(items) {
                Ok(n) => done += n,
                Err(Refusal::Full { lane, need }) => {
                    self.wait(lane, need, None);
                }
                Err(refusal) => return Err(refusal.error(done)),
            }
        }
        Ok(())
    }

    /// Closes every lane ([L10](crate::contract#l10)).
    pub(crate) fn close(&self) {
        for lane in self.lanes.iter() {
            lane.close();
        }
    }

    /// Whether the stream was closed (some lane was).
    pub(crate) fn is_closed(&self) -> bool {
        self.cells.any_closed()
    }
}

use super::ring::CLOSED;

/// Whose publisher a publish steps with: the one a fan-out or producer owns, or the request
/// lane's, shared by its senders behind a lock held for one step at a time (with its one lane's
/// ring, to wait on outside the lock).
pub(crate) enum Target<'a, T> {
    /// A publisher of one's own, publishing to every lane (`None`) or to one.
    Own(&'a mut Publisher<T>, Option<usize>),
    Shared(&'a Mutex<Publisher<T>>, &'a Ring<T>),
}

impl<T: Item> Target<'_, T> {
    /// One attempt; on refusal the item and why.
    pub(crate) fn step(&mut self, item: T) -> Result<(), (T, Refusal)> {
        match self {
            Target::Own(publisher, to) => publisher.try_step(*to, item),
            Target::Shared(publisher, _) => lock(publisher).try_step(None, item),
        }
    }
}

impl<T> Target<'_, T> {
    /// The ring of lane `lane`, to wait on (the room list is the cells', shared by every lane).
    pub(crate) fn ring(&self, lane: usize) -> &Ring<T> {
        match self {
            Target::Own(publisher, _) => &publisher.lanes[lane],
            Target::Shared(_, ring) => ring,
        }
    }
}

/// The one blocking body ([L3](crate::contract#l3)): publishes `item` through `target`, waiting
/// (spin, then park) while it is refused with `Full` until `deadline` (`None`: no deadline). It
/// serves every blocking, timed and deadline publish: the fan-out's, `publish_to`, a
/// producer's and the request lane's senders' (crossbeam-channel's `array.rs` shape).
pub(crate) fn publish_until<T: Item>(
    target: &mut Target<'_, T>,
    mut item: T,
    deadline: Option<Instant>,
) -> Result<(), PublishError<T>> {
    loop {
        match target.step(item) {
            Ok(()) => return Ok(()),
            Err((back, Refusal::Full { lane, need })) => {
                item = back;
                if !wait_room(target.ring(lane), need, deadline) {
                    return Err(PublishError::Timeout(item));
                }
            }
            Err((back, refusal)) => return Err(refusal.error(back)),
        }
    }
}

/// Whether `ring` freed the items below `need`, or the stream was closed: a refused step may go
/// now.
fn ready<T>(ring: &Ring<T>, need: u64) -> bool {
    ring.cells().any_closed() || ring.freed() >= need
}

/// Waits (spin, then park) until `ring` freed the items below `need` or the stream was closed;
/// `false` if `deadline` passed first. Needs no producer role: the request lane's senders wait
/// outside their lock.
pub(crate) fn wait_room<T>(ring: &Ring<T>, need: u64, deadline: Option<Instant>) -> bool {
    wait::block_until(&ring.cells().room, || ring.want_room(), deadline, || ready(ring, need).then_some(()))
        .is_some()
}

/// One poll of the async form of [`wait_room`]: `true` if the step may go now, else `waker` is
/// registered under `key` (replacing an earlier registration). The caller cancels `key`
/// ([`cancel_room`]) when its future ends or is dropped.
pub(crate) fn poll_room<T>(ring: &Ring<T>, need: u64, key: &mut Option<u64>, waker: &Waker) -> bool {
    wait::poll_until(&ring.cells().room, || ring.want_room(), key, waker, || ready(ring, need).then_some(()))
        .is_some()
}

/// Cancels a registration made by [`poll_room`].
pub(crate) fn cancel_room<T>(ring: &Ring<T>, key: &mut Option<u64>) {
    ring.cells().room.cancel(key);
}

impl<T> Drop for Publisher<T> {
    /// Drops the items every lane has freed, then gives the producer role back.
    fn drop(&mut self) {
        // A panicking item drop must not keep the role: it is given back first, and the panic
        // resumed after (never while unwinding already, M3).
        let unwinding = std::thread::panicking();
        let reclaimed = if unwinding { Ok(()) } else { self.reclaim() };
        // Release: pairs with `claim`'s Acquire.
        self.cells.producer_live.store(false, Ordering::Release);
        if unwinding {
            // Never resumed while unwinding (M3): a kept panic is discarded.
            if let Some(p) = self.kept_panic().take() {
                discard_panic(p);
            }
        } else {
            // As a step that published: the first panic caught (a kept one first) surfaces.
            self.settle(reclaimed, true);
        }
    }
}
