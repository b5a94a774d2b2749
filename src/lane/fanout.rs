//! [`Fanout`]: one publisher for every lane of a stream.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::ring::{Cells, ProducerState, Ring, NO_POSITION};
use crate::error::{PublishError, PublishTimeoutError, StreamError, TryPublishError};
use crate::item::LaneItem;
use crate::lane::Lane;
use crate::position::Position;
use crate::sync::Arc;

/// One publisher for every lane of a [`MemoryStream`](crate::MemoryStream)
/// ([`MemoryStream::fanout`](crate::MemoryStream::fanout)): publishes each item to every lane in
/// one pass, and a run of items with one publication step per lane.
///
/// It holds every lane's producer role ([L9](crate::contract#l9)): while it lives, no
/// [`Producer`](crate::Producer) of the stream's lanes can be taken, and dropping it gives every
/// lane back at once. Each lane gets a clone of each item (for a [`LaneItem`], a reference
/// count: the envelopes are shared, never copied, [M2](crate::contract#m2)) — unless the stream
/// was built with a [shared ring](crate::StreamBuilder::shared_ring): then each item is written
/// once into the one array every lane reads, and published to each lane with one step per lane
/// ([the contract's shared-ring section](crate::contract#shared-ring)). The shared ring is the
/// fast fan-out: one write per item, however many lanes.
///
/// An item goes to every lane or to none: a publish waits (or `try_` refuses with `Full`) until
/// every lane has room, and checks the position against every lane ([L4](crate::contract#l4))
/// before it writes anything. The one exception is a lane closed by another thread while the
/// publish is half-way: the lanes before it got the item, the closed lane and the lanes after it
/// did not, and the publish returns `Closed` with the item (the lanes are closing; a close before
/// the publish starts refuses it on every lane).
///
/// ```
/// use lanestream::{Batch, LaneItem, MemoryStream, Position, Stream};
/// let stream = MemoryStream::builder().capacity(4).sinks(["search", "cache"]).build().unwrap();
/// let mut consumers: Vec<_> = stream.lanes().map(|lane| lane.attach().unwrap()).collect();
/// let mut fanout = stream.fanout().unwrap();
/// let batch = |p| LaneItem::Batch(Batch::new(Some(Position(p)), Vec::new().into()));
/// fanout.publish(batch(1)).unwrap();
/// assert_eq!(fanout.publish_run(&[batch(2), batch(3)]), Ok(()));
/// for consumer in &mut consumers {
///     let run = consumer.try_recv_run(8).unwrap();
///     assert_eq!(run.len(), 3);
///     run.ack().unwrap();
/// }
/// assert_eq!(stream.watermark(), Some(Position(3)));
/// ```
pub struct Fanout {
    lanes: Box<[FanoutLane]>,
    /// The stream's shared ring's cells ([`StreamBuilder::shared_ring`](crate::StreamBuilder::shared_ring)):
    /// each item is written into them once and published to every lane; `None` when every lane
    /// has cells of its own (each gets a clone).
    shared: Option<Arc<Cells<LaneItem>>>,
    /// Per lane, the key of a waiting publish's close-only registration on that lane's room
    /// list (see [`Fanout::wait_for_room`]); `None` while nobody waits.
    close_keys: Box<[Option<u64>]>,
}

struct FanoutLane {
    ring: Arc<Ring<LaneItem>>,
    state: ProducerState,
}

/// Why an item cannot be published now, and at which lane.
enum Refusal {
    /// The lane at this index has no room for the item.
    Full(usize),
    Closed,
    Regressed {
        position: Position,
        last: Position,
    },
    Invalid,
}

impl Fanout {
    /// Claims every lane's producer role; releases those it took if one is held.
    pub(crate) fn claim(lanes: &[Lane]) -> Result<Fanout, StreamError> {
        let mut claimed = Vec::with_capacity(lanes.len());
        for lane in lanes {
            match lane.ring().claim_producer() {
                Some(state) => claimed.push(FanoutLane { ring: lane.ring().clone(), state }),
                None => {
                    for l in &claimed {
                        l.ring.release_producer();
                    }
                    return Err(StreamError::ProducerBusy(lane.name().clone()));
                }
            }
        }
        let close_keys = vec![None; claimed.len()].into_boxed_slice();
        let shared = claimed.first().filter(|l| l.ring.is_shared()).map(|l| l.ring.cells().clone());
        Ok(Fanout { lanes: claimed.into_boxed_slice(), shared, close_keys })
    }

    /// How many lanes it publishes to.
    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// Checks items `items[..]` in order against every lane (closed, positions, room) and
    /// returns how many leading items can be published to every lane now (>= 1), or why the
    /// first cannot.
    fn admissible(&mut self, items: &[LaneItem]) -> Result<usize, Refusal> {
        self.admissible_to(None, items)
    }

    /// As [`admissible`](Fanout::admissible), for items to every lane (`None`) or to lane `i`
    /// only: then only that lane needs room, unless the ring is shared (an item takes a cell of
    /// every lane).
    fn admissible_to(&mut self, to: Option<usize>, items: &[LaneItem]) -> Result<usize, Refusal> {
        // The highest position any lane has (each lane refuses positions at or below its own).
        let mut last = self
            .lanes
            .iter()
            .map(|l| Ring::<LaneItem>::last_position(&l.state))
            .filter(|&p| p != NO_POSITION)
            .max();
        let mut n = 0;
        for item in items {
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
        // Every lane's close first: a closed lane refuses the publish even while an earlier
        // lane is full ([L10](crate::contract#l10)), rather than the publish waiting for room.
        if self.lanes.iter().any(|lane| lane.ring.is_closed()) {
            return Err(Refusal::Closed);
        }
        let only = to.filter(|_| self.shared.is_none());
        for (i, lane) in self.lanes.iter_mut().enumerate() {
            if only.is_some_and(|only| only != i) {
                continue;
            }
            let room = lane.ring.room(&mut lane.state, n as u64) as usize;
            if room == 0 {
                return Err(Refusal::Full(i));
            }
            n = n.min(room);
        }
        Ok(n)
    }

    /// Publishes `item` (admitted) to lane `to` only: for a shared ring, to every lane with a
    /// gap marked on each other lane first. `false` if a lane was closed meanwhile.
    fn push_to(&mut self, to: usize, item: &LaneItem) -> bool {
        let position = item.position().map_or(NO_POSITION, |p| p.0);
        let Some(cells) = &self.shared else {
            let lane = &mut self.lanes[to];
            return lane.ring.push_run_checked(&mut lane.state, 1, |_| (item.clone(), position));
        };
        // SAFETY: as in `push`, for one item.
        let dropped = unsafe { cells.write(1, |_| (item.clone(), position)) };
        for (i, lane) in self.lanes.iter().enumerate() {
            if i != to {
                lane.ring.mark_gap(&lane.state);
            }
        }
        let published =
            self.lanes.iter_mut().all(|lane| lane.ring.publish_written(&mut lane.state, 1, position));
        // As in `push`.
        if let Err(p) = dropped {
            std::panic::resume_unwind(p);
        }
        published
    }

    /// Publishes `items[..n]` (admitted) to every lane; `false` if a lane was closed meanwhile.
    fn push(&mut self, items: &[LaneItem], n: usize) -> bool {
        let positions = |k: u64| items[k as usize].position().map_or(NO_POSITION, |p| p.0);
        if let Some(cells) = &self.shared {
            // Written once, published to every lane. Every lane's `tail` equals the cells'
            // `written` here: a publish that a close stopped half-way is the last one.
            debug_assert!(self.lanes.iter().all(|l| l.state.tail == cells.written()));
            let last = (0..n as u64).map(positions).rfind(|&p| p != NO_POSITION).unwrap_or(NO_POSITION);
            // SAFETY: we hold every lane's producer role, and `admissible` found room for `n`
            // items on every lane against a `free` loaded with Acquire: every lane emptied the
            // slots of items `tail + n - capacity` and below, so no handle reads their cells.
            let dropped = unsafe { cells.write(n as u64, |k| (items[k as usize].clone(), positions(k))) };
            let published =
                self.lanes.iter_mut().all(|lane| lane.ring.publish_written(&mut lane.state, n as u64, last));
            // M3: an old item's drop panic reaches the caller once the new items are published.
            if let Err(p) = dropped {
                std::panic::resume_unwind(p);
            }
            return published;
        }
        for lane in self.lanes.iter_mut() {
            let pushed = lane
                .ring
                .push_run_checked(&mut lane.state, n as u64, |k| (items[k as usize].clone(), positions(k)));
            if !pushed {
                return false;
            }
        }
        true
    }

    /// Publishes `item` to every lane if every lane has room now; never waits.
    ///
    /// # Errors
    /// Hands `item` back: [`TryPublishError::Full`] if some lane has `capacity` unacked items
    /// (no lane got it), [`Closed`](TryPublishError::Closed) if a lane is closed (see the type's
    /// docs for a close racing the publish), [`PositionRegressed`](TryPublishError::PositionRegressed)
    /// and [`InvalidPosition`](TryPublishError::InvalidPosition) as for a lane's producer
    /// ([L4](crate::contract#l4); no lane got it).
    pub fn try_publish(&mut self, item: LaneItem) -> Result<(), TryPublishError<LaneItem>> {
        self.try_step(item).map_err(|(item, refusal, _)| refusal_error(item, refusal))
    }

    /// Publishes `item` to lane `lane` only (its index in
    /// [`MemoryStream::lanes`](crate::MemoryStream::lanes) order), waiting (spin, then park) while
    /// it is full: a reply for one sink, such as the snapshot batches of a
    /// [backfill](crate::Request::Backfill) it asked for.
    ///
    /// With a lane ring each, only that lane is written and needs room. With a
    /// [shared ring](crate::StreamBuilder::shared_ring) the item takes a cell, so it needs room on
    /// every lane: it is published to every lane, and every other lane's consumer acks it on its
    /// way past without delivering it (a gap; such a lane is not idle until its consumer passed
    /// it, and its acked position may move to the item's position). An item's position, if it has
    /// one, must grow past every lane's last ([L4](crate::contract#l4)), as for
    /// [`publish`](Fanout::publish).
    ///
    /// # Errors
    /// As [`publish`](Fanout::publish).
    ///
    /// # Panics
    /// If `lane` is not below [`lanes`](Fanout::lanes).
    pub fn publish_to(&mut self, lane: usize, item: LaneItem) -> Result<(), PublishError<LaneItem>> {
        assert!(lane < self.lanes.len(), "publish_to: lane {lane} of {}", self.lanes.len());
        self.publish_waiting(Some(lane), item)
    }

    /// As [`publish_to`](Fanout::publish_to), never waiting.
    ///
    /// # Errors
    /// As [`try_publish`](Fanout::try_publish).
    ///
    /// # Panics
    /// If `lane` is not below [`lanes`](Fanout::lanes).
    pub fn try_publish_to(&mut self, lane: usize, item: LaneItem) -> Result<(), TryPublishError<LaneItem>> {
        assert!(lane < self.lanes.len(), "try_publish_to: lane {lane} of {}", self.lanes.len());
        self.try_step_to(Some(lane), item).map_err(|(item, refusal, _)| refusal_error(item, refusal))
    }

    /// One attempt; on refusal the item, why, and the lane to wait for (if full).
    fn try_step(&mut self, item: LaneItem) -> Result<(), (LaneItem, Refusal, usize)> {
        self.try_step_to(None, item)
    }

    /// One attempt, to every lane or (`Some(i)`) to lane `i` only (see
    /// [`publish_to`](Fanout::publish_to)).
    fn try_step_to(&mut self, to: Option<usize>, item: LaneItem) -> Result<(), (LaneItem, Refusal, usize)> {
        let items = std::slice::from_ref(&item);
        match self.admissible_to(to, items) {
            Ok(_) => {
                let pushed = match to {
                    None => self.push(items, 1),
                    Some(i) => self.push_to(i, &item),
                };
                if pushed {
                    Ok(())
                } else {
                    Err((item, Refusal::Closed, 0))
                }
            }
            Err(Refusal::Full(i)) => Err((item, Refusal::Full(i), i)),
            Err(r) => Err((item, r, 0)),
        }
    }

    /// Publishes `item` to every lane, waiting (spin, then park) while some lane is full
    /// ([L3](crate::contract#l3)).
    ///
    /// # Errors
    /// [`PublishError`]: `Closed`, `PositionRegressed`, `InvalidPosition`; the item handed back.
    pub fn publish(&mut self, item: LaneItem) -> Result<(), PublishError<LaneItem>> {
        self.publish_waiting(None, item)
    }

    /// The blocking publish to every lane (`None`) or to one.
    fn publish_waiting(
        &mut self,
        to: Option<usize>,
        mut item: LaneItem,
    ) -> Result<(), PublishError<LaneItem>> {
        loop {
            match self.try_step_to(to, item) {
                Ok(()) => return Ok(()),
                Err((back, Refusal::Full(i), _)) => {
                    item = back;
                    self.wait_for_room(i, None);
                }
                Err((back, refusal, _)) => {
                    return Err(match refusal_error(back, refusal).into_waitable() {
                        Err(e) => e,
                        Ok(_) => unreachable!("Full is handled above"),
                    })
                }
            }
        }
    }

    /// As [`publish`](Fanout::publish), waiting at most `timeout` for room.
    ///
    /// # Errors
    /// [`PublishTimeoutError::Timeout`] (item handed back, no lane got it), or a cause of
    /// [`publish`](Fanout::publish).
    pub fn publish_timeout(
        &mut self,
        item: LaneItem,
        timeout: Duration,
    ) -> Result<(), PublishTimeoutError<LaneItem>> {
        self.publish_until(item, Some(Instant::now() + timeout))
    }

    /// As [`publish`](Fanout::publish), waiting for room until `deadline` at the latest.
    ///
    /// # Errors
    /// As [`publish_timeout`](Fanout::publish_timeout).
    pub fn publish_deadline(
        &mut self,
        item: LaneItem,
        deadline: Instant,
    ) -> Result<(), PublishTimeoutError<LaneItem>> {
        self.publish_until(item, Some(deadline))
    }

    fn publish_until(
        &mut self,
        mut item: LaneItem,
        deadline: Option<Instant>,
    ) -> Result<(), PublishTimeoutError<LaneItem>> {
        loop {
            match self.try_step(item) {
                Ok(()) => return Ok(()),
                Err((back, Refusal::Full(i), _)) => {
                    item = back;
                    if !self.wait_for_room(i, deadline) {
                        return Err(PublishTimeoutError::Timeout(item));
                    }
                }
                Err((back, refusal, _)) => {
                    return Err(match refusal_error(back, refusal).into_waitable() {
                        Err(e) => e.into(),
                        Ok(_) => unreachable!("Full is handled above"),
                    })
                }
            }
        }
    }

    /// Publishes the longest prefix of `items` that every lane has room for now, each lane
    /// receiving the whole prefix in one publication step (one `tail` update per lane, not per
    /// item), and returns its length (>= 1). Never waits. The items are cloned into every lane
    /// (into the one shared array, for a shared ring); `items` stays the caller's.
    ///
    /// # Errors
    /// When not even the first item can go: `TryPublishError::<usize>::Full(0)`, `Closed(0)`,
    /// `PositionRegressed { item: 0, .. }`, `InvalidPosition(0)` (the payload is the index of
    /// the item refused, here always 0). A prefix stops before an item that would be refused.
    pub fn try_publish_run(&mut self, items: &[LaneItem]) -> Result<usize, TryPublishError<usize>> {
        if items.is_empty() {
            return Ok(0);
        }
        match self.admissible(items) {
            Ok(n) => {
                if self.push(items, n) {
                    Ok(n)
                } else {
                    Err(TryPublishError::Closed(0))
                }
            }
            Err(r) => Err(refusal_error(0, r)),
        }
    }

    /// Publishes every item of `items` to every lane, in order, in as few publication steps as
    /// the lanes' room allows, waiting (spin, then park) while a lane is full.
    ///
    /// # Errors
    /// [`PublishError`] whose payload is the index of the first item not published: items
    /// before it reached every lane. As for [`publish`](Fanout::publish), a close racing the
    /// run may have let the lanes before the closed one have the items of the step it stopped
    /// (from that index on, as many as every lane had room for at once), not only that item.
    pub fn publish_run(&mut self, items: &[LaneItem]) -> Result<(), PublishError<usize>> {
        let mut done = 0;
        while done < items.len() {
            match self.admissible(&items[done..]) {
                Ok(n) => {
                    if !self.push(&items[done..], n) {
                        return Err(PublishError::Closed(done));
                    }
                    done += n;
                }
                Err(Refusal::Full(i)) => {
                    self.wait_for_room(i, None);
                }
                Err(r) => {
                    return Err(match refusal_error(done, r).into_waitable() {
                        Err(e) => e,
                        Ok(_) => unreachable!("Full is handled above"),
                    })
                }
            }
        }
        Ok(())
    }

    /// Waits until lane `i` has room or any lane is closed; `false` if `deadline` passed first.
    ///
    /// It waits on lane `i`'s room list (asking for room, so that lane's acks wake it) and is
    /// registered on every other lane's room list without asking for room: a close notifies its
    /// lane's room list, so a close of any lane wakes the wait at once
    /// ([L10](crate::contract#l10)). Each registration comes before the re-check of every lane's
    /// closed flag, the register-then-check order that makes a wake-up impossible to miss
    /// (memory-ordering chapter, P20).
    fn wait_for_room(&mut self, i: usize, deadline: Option<Instant>) -> bool {
        let Fanout { lanes, close_keys, .. } = self;
        let lanes = &**lanes;
        let woke = lanes[i].ring.wait_writable_or(
            deadline,
            || register_close_waiters(lanes, close_keys, i, None),
            || any_closed(lanes),
        );
        cancel_close_waiters(lanes, close_keys);
        woke
    }

    /// Publishes `item` to every lane, waiting asynchronously while some lane is full; works on
    /// any executor. Dropping the future drops the item it holds (no lane got it).
    ///
    /// # Errors
    /// As [`publish`](Fanout::publish).
    pub fn publish_async(&mut self, item: LaneItem) -> FanoutPublish<'_> {
        FanoutPublish { fanout: self, item: Some(item), key: None, waiting_on: 0 }
    }

    /// For a stream with a [shared ring](crate::StreamBuilder::shared_ring): drops now the items
    /// every lane has acked (their slots emptied). Without it they are dropped when the fan-out
    /// writes over their cells, when it is dropped, or with the stream, so an idle stream holds
    /// up to `capacity` acked items. A no-op when every lane has cells of its own (a lane drops
    /// each item on its final ack).
    ///
    /// # Panics
    /// Resumes the first panic of a dropped item's Drop, once every item is dropped.
    pub fn reclaim(&mut self) {
        if let Some(cells) = &self.shared {
            let end = self.lanes.iter().map(|lane| lane.ring.freed()).min().unwrap_or(0);
            // SAFETY: we hold every lane's producer role, and every lane's `free` (loaded with
            // Acquire) is at `end` or past it.
            unsafe { cells.reclaim(end) };
        }
    }

    /// Closes every lane ([L10](crate::contract#l10)).
    pub fn close(&self) {
        for lane in self.lanes.iter() {
            lane.ring.close();
        }
    }
}

/// Registers the current thread (`None`) or `waker`'s task on the room list of every lane but
/// `except`, without asking for room: a close of any of them wakes it.
fn register_close_waiters(
    lanes: &[FanoutLane],
    keys: &mut [Option<u64>],
    except: usize,
    waker: Option<&Waker>,
) {
    for (j, (lane, key)) in lanes.iter().zip(keys.iter_mut()).enumerate() {
        if j == except {
            lane.ring.cancel_writable(key);
        } else {
            lane.ring.register_close_waiter(key, waker);
        }
    }
}

fn cancel_close_waiters(lanes: &[FanoutLane], keys: &mut [Option<u64>]) {
    for (lane, key) in lanes.iter().zip(keys.iter_mut()) {
        lane.ring.cancel_writable(key);
    }
}

fn any_closed(lanes: &[FanoutLane]) -> bool {
    lanes.iter().any(|lane| lane.ring.is_closed())
}

/// The future of [`Fanout::publish_async`]: tries to publish to every lane, and while a lane is
/// full waits for its room with the task's waker registered there (and, for a close, on every
/// other lane).
#[must_use = "futures do nothing unless polled"]
pub struct FanoutPublish<'a> {
    fanout: &'a mut Fanout,
    item: Option<LaneItem>,
    /// The registration on the room list of lane `waiting_on`.
    key: Option<u64>,
    waiting_on: usize,
}

impl Future for FanoutPublish<'_> {
    type Output = Result<(), PublishError<LaneItem>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            let item = this.item.take().expect("FanoutPublish polled after completion");
            let full = match this.fanout.try_step(item) {
                Ok(()) => return this.finish(Ok(())),
                Err((back, Refusal::Full(i), _)) => {
                    this.item = Some(back);
                    i
                }
                Err((back, refusal, _)) => {
                    let refused = match refusal_error(back, refusal).into_waitable() {
                        Err(e) => e,
                        Ok(_) => unreachable!("Full is handled above"),
                    };
                    return this.finish(Err(refused));
                }
            };
            let Fanout { lanes, close_keys, .. } = &mut *this.fanout;
            if full != this.waiting_on {
                lanes[this.waiting_on].ring.cancel_writable(&mut this.key);
                this.waiting_on = full;
            }
            // Close-only registrations first, then the room wait (which re-checks lane `full`);
            // then every lane's closed flag again, after every registration.
            register_close_waiters(lanes, close_keys, full, Some(cx.waker()));
            if lanes[full].ring.poll_writable(&mut this.key, cx.waker()) || any_closed(lanes) {
                continue;
            }
            return Poll::Pending;
        }
    }
}

impl FanoutPublish<'_> {
    fn finish(
        &mut self,
        done: Result<(), PublishError<LaneItem>>,
    ) -> Poll<Result<(), PublishError<LaneItem>>> {
        self.cancel();
        Poll::Ready(done)
    }

    fn cancel(&mut self) {
        let Fanout { lanes, close_keys, .. } = &mut *self.fanout;
        lanes[self.waiting_on].ring.cancel_writable(&mut self.key);
        cancel_close_waiters(lanes, close_keys);
    }
}

impl Drop for FanoutPublish<'_> {
    fn drop(&mut self) {
        self.cancel();
    }
}

impl fmt::Debug for FanoutPublish<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FanoutPublish")
            .field("done", &self.item.is_none())
            .field("waiting_on", &self.key.map(|_| self.waiting_on))
            .finish_non_exhaustive()
    }
}

fn refusal_error<T>(item: T, refusal: Refusal) -> TryPublishError<T> {
    match refusal {
        Refusal::Full(_) => TryPublishError::Full(item),
        Refusal::Closed => TryPublishError::Closed(item),
        Refusal::Regressed { position, last } => TryPublishError::PositionRegressed { item, position, last },
        Refusal::Invalid => TryPublishError::InvalidPosition(item),
    }
}

impl Drop for Fanout {
    /// Drops the shared ring's items every lane has acked ([`reclaim`](Fanout::reclaim)), then
    /// gives every lane's producer role back.
    fn drop(&mut self) {
        // A panicking item drop must not keep the producer roles: they are given back first,
        // and the panic resumed after (never while unwinding already, M3).
        let reclaimed = if std::thread::panicking() {
            Ok(())
        } else {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.reclaim()))
        };
        for lane in self.lanes.iter() {
            lane.ring.release_producer();
        }
        if let Err(p) = reclaimed {
            std::panic::resume_unwind(p);
        }
    }
}

impl fmt::Debug for Fanout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fanout").field("lanes", &self.lanes.len()).finish_non_exhaustive()
    }
}
