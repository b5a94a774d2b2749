//! [`RedisProducer`] (a sink lane's publishing end) and [`RedisRequestSender`] (the request
//! lane's senders).

use std::fmt;
use std::future::{poll_fn, Future};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread;
use std::time::Instant;

use super::conn::Budget;
use super::item::RedisItem;
use super::lane::{LaneDef, Published, Publisher};
use super::shared::Shared;
use super::waiter::Waiter;
use crate::codec::AlignedVec;
use crate::error::{BackendError, PublishError, PublishTimeoutError, TryPublishError};
use crate::item::{LaneItem, Request};
use crate::position::Position;
use crate::stream::port::RequestPublisher;

/// An item checked and encoded for a publish: its position and its payload.
pub(super) struct Encoded {
    pub(super) position: Option<Position>,
    pub(super) bytes: AlignedVec,
}

/// Checks and encodes `item`; hands it back if it cannot be published.
fn encode<T: RedisItem>(shared: &Shared, item: &T) -> Result<Encoded, Option<BackendError>> {
    let position = item.position();
    if position == Some(Position::RESERVED) {
        return Err(None);
    }
    match item.encode() {
        Ok(bytes) => Ok(Encoded { position, bytes }),
        Err(e) => {
            shared.pool.record(format!("lanestream: could not encode: {e}"));
            Err(Some(BackendError::Server(crate::error::ServerReason::Other(crate::error::ErrorCode::new(
                "ENCODE",
            )))))
        }
    }
}

/// One publish step shared by producers and senders: run the publish script with `encoded`,
/// map the reply. Never waits for room. `Ok(true)`: published; `Ok(false)`: the entry for this
/// publish count was there on the first try (`Published::Duplicate`, producers only). `room`:
/// set to the publish count up to which the lane has room, when the step learnt it.
fn publish_step<T: RedisItem>(
    shared: &Shared,
    lane: &LaneDef,
    who: Publisher,
    item: T,
    encoded: &Encoded,
    budget: Budget,
    room: &mut Option<u64>,
) -> Result<(T, bool), TryPublishError<T>> {
    let position = encoded.position;
    let outcome = lane.publish(&shared.pool, budget, who, &encoded.bytes, position).map(|(p, r)| {
        *room = r.or(*room);
        p
    });
    match outcome {
        Ok(Published::Done) => Ok((item, true)),
        Ok(Published::Duplicate) => Ok((item, false)),
        Ok(Published::Full) => Err(TryPublishError::Full(item)),
        Ok(Published::Closed) => Err(TryPublishError::Closed(item)),
        Ok(Published::Regressed(last)) => Err(TryPublishError::PositionRegressed {
            position: position.expect("only positioned items regress"),
            last,
            item,
        }),
        Ok(Published::Fenced) => Err(TryPublishError::Backend { item, error: BackendError::Fenced }),
        Err(error) => Err(TryPublishError::Backend { item, error }),
    }
}

/// [`encode`], mapping a refusal to the error that hands `item` back.
pub(super) fn encoded<T: RedisItem>(shared: &Shared, item: T) -> Result<(T, Encoded), TryPublishError<T>> {
    match encode(shared, &item) {
        Ok(e) => Ok((item, e)),
        Err(None) => Err(TryPublishError::InvalidPosition(item)),
        Err(Some(error)) => Err(TryPublishError::Backend { item, error }),
    }
}

pub(super) fn timeout_error<T>(e: TryPublishError<T>) -> PublishTimeoutError<T> {
    match e {
        TryPublishError::Full(t) => PublishTimeoutError::Timeout(t),
        other => match other.into_waitable() {
            Ok(t) => PublishTimeoutError::Timeout(t),
            Err(e) => e.into(),
        },
    }
}

/// Publishes `item` with `step`, waiting on `lane`'s publishers' wake-up key while the lane is
/// full, until `deadline` if any.
fn publish_until<T>(
    shared: &Shared,
    lane: &LaneDef,
    mut item: T,
    deadline: Option<Instant>,
    mut step: impl FnMut(T) -> Result<(), TryPublishError<T>>,
) -> Result<(), PublishTimeoutError<T>> {
    let pbell = lane.pbell();
    loop {
        match step(item) {
            Err(TryPublishError::Full(back)) => item = back,
            other => return other.map_err(timeout_error),
        }
        let mut slice = shared.pool.settings.wait_slice;
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(PublishTimeoutError::Timeout(item));
            }
            slice = slice.min(left);
        }
        if lane.wait(&shared.pool, &pbell, slice).is_err() {
            thread::sleep(shared.pool.settings.backoff_min);
        }
    }
}

pub(super) fn waitable<T>(e: PublishTimeoutError<T>) -> PublishError<T> {
    match e {
        PublishTimeoutError::Timeout(_) => unreachable!("a wait without a deadline never times out"),
        PublishTimeoutError::Closed(t) => PublishError::Closed(t),
        PublishTimeoutError::InvalidPosition(t) => PublishError::InvalidPosition(t),
        PublishTimeoutError::PositionRegressed { item, position, last } => {
            PublishError::PositionRegressed { item, position, last }
        }
        PublishTimeoutError::Backend { item, error } => PublishError::Backend { item, error },
    }
}

/// What a claimed publisher (a lane's producer, or a fan-out) knows between its publishes: what
/// lets a publish skip the gate script, and what tells a retried publish from the next item.
/// `K` tells the targets of one publisher's publishes apart (`()` for a producer, the lane or
/// every lane for a fan-out).
pub(super) struct Progress<K> {
    /// The publish count, as of the last publish.
    pub(super) published: u64,
    /// The payload and target of the last publish that ended in an error: it may have landed all
    /// the same (a lost reply). A next publish that finds its entry already there is a retry of
    /// that item if both are equal, else that item landed and the new one goes after it.
    unsure: Option<(AlignedVec, K)>,
    /// The publish count up to which the lane (every lane) has room, as the gate last saw it
    /// (the acked prefix only grows): publishes up to it skip the gate.
    room: u64,
    /// The last position published as this publisher knows it (from its claim, then its own
    /// publishes; `None` when it does not know: after finding an earlier call's publish landed).
    /// A publish not above it takes the gate (which refuses it).
    pub(super) last: Option<Option<Position>>,
}

impl<K: PartialEq> Progress<K> {
    /// A claimed publisher's: the publish count and the last position, as the claim read them.
    pub(super) fn new(published: u64, last: Option<Position>) -> Self {
        Progress { published, unsure: None, room: 0, last: Some(last) }
    }

    /// The count a publish of an item at `position` would take, and whether it may skip the
    /// gate: room proven, its position rises (or it has none), nothing unsure, and not every
    /// 64th entry (the gate trims the log then).
    pub(super) fn next(&self, position: Option<Position>) -> (u64, bool) {
        let after = self.published + 1;
        let rises = match (position, self.last) {
            (_, None) => false,
            (Some(p), Some(Some(last))) => p > last,
            _ => true,
        };
        (after, self.unsure.is_none() && after <= self.room && rises && after % 64 != 0)
    }

    /// What a gate answered: the room, and the last position before this publish.
    pub(super) fn learnt(&mut self, room: Option<u64>, last: Option<Option<Position>>) {
        if let Some(room) = room {
            self.room = room;
        }
        if last.is_some() {
            self.last = last;
        }
    }

    /// The publish of an item at `position` landed.
    pub(super) fn landed(&mut self, position: Option<Position>) {
        self.published += 1;
        self.unsure = None;
        if position.is_some() {
            self.last = Some(position);
        }
    }

    /// The entry for the next count was there already: an earlier call's, whose error hid that it
    /// landed (and moved the last position, which only the gate knows now). `true` if it was
    /// this very publish (`bytes` to `target`) again: it landed once.
    pub(super) fn found_landed(&mut self, bytes: &[u8], target: &K) -> bool {
        self.published += 1;
        self.last = None;
        self.unsure.take().is_some_and(|(earlier, to)| earlier.as_slice() == bytes && to == *target)
    }

    /// The publish of `bytes` to `target` ended in an error that leaves it unsure: it may have
    /// landed.
    pub(super) fn failed(&mut self, bytes: AlignedVec, target: K) {
        self.unsure = Some((bytes, target));
    }
}

/// The publishing end of a sink lane over Redis (at most one per lane, across processes:
/// [L9](crate::contract#l9)).
///
/// Claiming it starts a new producer epoch in Redis; every publish carries the epoch and the
/// lane's publish count, so a publish retried after a lost connection lands once, and a
/// producer whose claim another process took over (after this one's connection dropped) is
/// refused with [`BackendError::Fenced`].
pub struct RedisProducer {
    shared: Arc<Shared>,
    lane: Arc<LaneDef>,
    epoch: u64,
    /// The lane's publish count and what the producer knows besides (the gate is the publish
    /// script; only a sink lane alone on its log skips it).
    progress: Progress<()>,
    token: u64,
    waiter: Option<Waiter>,
}

impl RedisProducer {
    pub(crate) fn new(
        shared: Arc<Shared>,
        lane: Arc<LaneDef>,
        epoch: u64,
        published: u64,
        last: Option<Position>,
        token: u64,
    ) -> Self {
        RedisProducer { shared, lane, epoch, progress: Progress::new(published, last), token, waiter: None }
    }

    fn step(&mut self, item: LaneItem, budget: Budget) -> Result<(), TryPublishError<LaneItem>> {
        let (mut item, encoded) = encoded(&self.shared, item)?;
        loop {
            let (after, proven) = self.progress.next(encoded.position);
            let who = Publisher::Producer { epoch: self.epoch, published_after: after, proven };
            let mut room = None;
            let stepped = publish_step(&self.shared, &self.lane, who, item, &encoded, budget, &mut room);
            self.progress.learnt(room, None);
            match stepped {
                Ok((_, true)) => {
                    self.progress.landed(encoded.position);
                    return Ok(());
                }
                Ok((back, false)) => {
                    if self.progress.found_landed(&encoded.bytes, &()) {
                        return Ok(()); // this very item, published again: it landed once
                    }
                    item = back; // another item: it goes after the one that landed
                }
                Err(TryPublishError::Backend { item, error }) => {
                    if error != BackendError::Fenced {
                        self.progress.failed(encoded.bytes, ());
                    }
                    return Err(TryPublishError::Backend { item, error });
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn poll_publish(
        &mut self,
        item: &mut Option<LaneItem>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), PublishError<LaneItem>>> {
        let Some(it) = item.take() else { return Poll::Ready(Ok(())) };
        match self.step(it, Budget::Retry) {
            Ok(()) => Poll::Ready(Ok(())),
            Err(TryPublishError::Full(back)) => {
                *item = Some(back);
                let shared = self.shared.clone();
                self.waiter.get_or_insert_with(|| Waiter::new(shared)).arm(self.lane.pbell(), cx.waker());
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(match e.into_waitable() {
                Ok(_) => unreachable!("Full is handled above"),
                Err(e) => e,
            })),
        }
    }
}

/// The per-lane producer of the retired layout (being removed: the fan-out is the only way).
#[allow(missing_docs)]
impl RedisProducer {
    pub fn try_publish(&mut self, item: LaneItem) -> Result<(), TryPublishError<LaneItem>> {
        self.step(item, Budget::Once)
    }

    pub fn publish(&mut self, item: LaneItem) -> Result<(), PublishError<LaneItem>> {
        self.publish_until(item, None).map_err(waitable)
    }

    pub fn publish_deadline(
        &mut self,
        item: LaneItem,
        deadline: Instant,
    ) -> Result<(), PublishTimeoutError<LaneItem>> {
        self.publish_until(item, Some(deadline))
    }

    pub fn publish_async(
        &mut self,
        item: LaneItem,
    ) -> impl Future<Output = Result<(), PublishError<LaneItem>>> + Send + '_ {
        let mut item = Some(item);
        poll_fn(move |cx| self.poll_publish(&mut item, cx))
    }

    pub fn close(&self) {
        let _ = self.lane.close(&self.shared.pool, Budget::Retry);
    }

    pub fn is_closed(&self) -> bool {
        matches!(self.lane.field(&self.shared.pool, Budget::Once, "closed"), Ok(Some(c)) if c == "1")
    }

    pub fn capacity(&self) -> usize {
        self.lane.capacity
    }
}

impl RedisProducer {
    fn publish_until(
        &mut self,
        item: LaneItem,
        deadline: Option<Instant>,
    ) -> Result<(), PublishTimeoutError<LaneItem>> {
        let (shared, lane) = (self.shared.clone(), self.lane.clone());
        publish_until(&shared, &lane, item, deadline, |item| self.step(item, Budget::Retry))
    }

    /// Closes the lane, reporting a backend failure (`close` cannot).
    ///
    /// # Errors
    /// [`BackendError`] if Redis could not be reached within the retry budget.
    pub fn try_close(&self) -> Result<(), BackendError> {
        self.lane.close(&self.shared.pool, Budget::Retry)
    }
}

impl Drop for RedisProducer {
    fn drop(&mut self) {
        if let Some(claim) = self.shared.pool.claim_value(self.token) {
            let _ = self.lane.release(&self.shared.pool, "ph", &claim);
        }
        self.shared.pool.forget(self.token);
    }
}

impl fmt::Debug for RedisProducer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisProducer")
            .field("lane", &self.lane.base)
            .field("epoch", &self.epoch)
            .field("published", &self.progress.published)
            .finish_non_exhaustive()
    }
}

/// Publishes requests on the request lane over Redis; any number, in any process
/// ([R1](crate::contract#r1)). Cheap to clone.
///
/// A send retried after a lost connection may land twice: requests are at-least-once
/// ([R2](crate::contract#r2)).
#[derive(Clone)]
pub struct RedisRequestSender {
    shared: Arc<Shared>,
    lane: Arc<LaneDef>,
}

impl RedisRequestSender {
    pub(crate) fn new(shared: Arc<Shared>, lane: Arc<LaneDef>) -> Self {
        RedisRequestSender { shared, lane }
    }

    fn step(&self, request: Request, budget: Budget) -> Result<(), TryPublishError<Request>> {
        let (request, encoded) = encoded(&self.shared, request)?;
        // A sender's publish is never a `Duplicate` (that check is the producer's).
        publish_step(&self.shared, &self.lane, Publisher::Sender, request, &encoded, budget, &mut None)
            .map(drop)
    }

    fn until(&self, request: Request, deadline: Option<Instant>) -> Result<(), PublishTimeoutError<Request>> {
        publish_until(&self.shared, &self.lane, request, deadline, |r| self.step(r, Budget::Retry))
    }
}

impl RequestPublisher for RedisRequestSender {
    fn try_publish(&self, request: Request) -> Result<(), TryPublishError<Request>> {
        self.step(request, Budget::Once)
    }

    fn publish(&self, request: Request) -> Result<(), PublishError<Request>> {
        self.until(request, None).map_err(waitable)
    }

    fn publish_deadline(
        &self,
        request: Request,
        deadline: Instant,
    ) -> Result<(), PublishTimeoutError<Request>> {
        self.until(request, Some(deadline))
    }

    fn publish_async(
        &self,
        request: Request,
    ) -> impl Future<Output = Result<(), PublishError<Request>>> + Send + '_ {
        // Senders are shared, so each waiting future has a waiter of its own.
        let mut request = Some(request);
        let mut waiter: Option<Waiter> = None;
        poll_fn(move |cx| {
            let Some(r) = request.take() else { return Poll::Ready(Ok(())) };
            match self.step(r, Budget::Retry) {
                Ok(()) => Poll::Ready(Ok(())),
                Err(TryPublishError::Full(back)) => {
                    request = Some(back);
                    let shared = self.shared.clone();
                    waiter.get_or_insert_with(|| Waiter::new(shared)).arm(self.lane.pbell(), cx.waker());
                    Poll::Pending
                }
                Err(e) => Poll::Ready(Err(match e.into_waitable() {
                    Ok(_) => unreachable!("Full is handled above"),
                    Err(e) => e,
                })),
            }
        })
    }
}

impl fmt::Debug for RedisRequestSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRequestSender").field("lane", &self.lane.base).finish()
    }
}
