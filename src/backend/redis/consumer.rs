//! [`RedisConsumer`] and [`RedisDelivery`]: the receiving end of a lane over Redis, and one
//! received item with the right to ack or nack it; the async waits' helper thread.

use std::fmt;
use std::future::{poll_fn, Future};
use std::marker::PhantomData;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use super::conn::Budget;
use super::item::RedisItem;
use super::lane::{Acked, LaneDef, Received};
use super::shared::Shared;
use super::waiter::{wait_until, Waiter};
use crate::error::{AckError, BackendError, RecvError, RecvTimeoutError, TryRecvError};
use crate::port::{DeliveryRun, LaneConsumer, LaneDelivery};
use crate::position::Position;
use crate::sync::lock;

/// An ack or a nack that could not reach Redis, kept to be sent again (in the order they were
/// made) before the consumer's next receive.
#[derive(Clone, Copy, Debug)]
enum Settle {
    /// A nack (a delivery dropped or nacked) that met a lost connection: epoch, entry, attempt.
    Nack { epoch: u64, n: u64, attempt: u32 },
    /// An ack whose tries all failed within the retry budget (a lost connection, a transient
    /// refusal): it may have landed or not, so it is sent again, as a retry (the pipeline's rule
    /// P8: a lane never stays full behind an item its sink applied).
    Ack { epoch: u64, n: u64, position: Option<Position>, attempt: u32 },
}

/// The acks and nacks that could not reach Redis, sent again before the consumer's next receive
/// (and, once, when it is dropped).
type Unsent = Arc<Mutex<Vec<Settle>>>;

/// Whether an ack that failed with `e` is kept to be sent again: its outcome is unknown and a
/// later try may settle it (a lost connection, a transient refusal that outlasted the budget).
/// Not after a fence or a lost state, which no retry changes.
fn resendable(e: BackendError) -> bool {
    use crate::error::ServerReason;
    matches!(
        e,
        BackendError::Connection
            | BackendError::Server(ServerReason::OutOfMemory | ServerReason::Loading | ServerReason::Busy)
    )
}

/// Sends the kept acks and nacks of `unsent` again, in order, on `lane` of `shared` within
/// `budget`; on an error the rest stay kept (in front of any made meanwhile).
fn resend(shared: &Shared, lane: &LaneDef, unsent: &Unsent, budget: Budget) -> Result<(), BackendError> {
    let kept: Vec<Settle> = std::mem::take(&mut *lock(unsent));
    for (i, settle) in kept.iter().enumerate() {
        let sent = match *settle {
            Settle::Nack { epoch, n, attempt } => lane.nack(&shared.pool, budget, epoch, n, attempt),
            // Whatever it answers settles it: acked (now or before), or refused as detached (a
            // re-attach took the item back: it is redelivered), or unknown after a re-attach.
            Settle::Ack { epoch, n, position, attempt } => {
                lane.ack(&shared.pool, budget, epoch, n, position, attempt, true).map(drop)
            }
        };
        if let Err(e) = sent {
            let mut unsent = lock(unsent);
            let later = std::mem::take(&mut *unsent);
            unsent.extend_from_slice(&kept[i..]);
            unsent.extend(later);
            return Err(e);
        }
    }
    Ok(())
}

/// The receiving end of a lane over Redis: [`LaneConsumer`] for sink lanes (`T` =
/// [`LaneItem`](crate::LaneItem)) and the request lane (`T` = [`Request`](crate::Request)).
///
/// Each receive is one round trip: a plain record in the lane's delivery log with an `XRANGE`
/// of the expected entry, or a script run in Redis (with a plain `XRANGE` of the expected entry
/// in the same round trip, so the payload does not pass through the script); a receive that
/// waits blocks on a wake-up list
/// (`BLPOP`) that publishes, nacks, closes and re-attaches push to. The async forms hand that
/// wait to a helper thread of this consumer (started on the first wait), which wakes the task;
/// no async runtime is involved.
pub struct RedisConsumer<T> {
    shared: Arc<Shared>,
    lane: Arc<LaneDef>,
    /// The consumer epoch; `None` while a re-attach that could not reach Redis is pending (it
    /// is retried by the first receive).
    epoch: Option<u64>,
    token: u64,
    /// Receive requests made in this epoch (a retried request is recognised by its number).
    requests: u64,
    /// The entry number expected next (the one after the last new entry received; 0 before
    /// the first): the lane hands that entry's payload over outside Lua.
    expect: u64,
    /// Nacks sent (or queued) by this consumer's deliveries, counted before they are sent.
    nacks: Arc<AtomicU64>,
    /// `nacks` as it was when a receive that then delivered a new entry started: while it is
    /// still the count, no entry of this epoch waits for redelivery (released entries come
    /// first), so the next receive may take the expected entry without a script. `None` before
    /// the first new delivery and after a receive that found nothing.
    clean_at: Option<u64>,
    detached: bool,
    unsent: Unsent,
    waiter: Option<Waiter>,
    _item: PhantomData<fn() -> T>,
}

impl<T: RedisItem> RedisConsumer<T> {
    pub(crate) fn new(shared: Arc<Shared>, lane: Arc<LaneDef>, epoch: Option<u64>, token: u64) -> Self {
        RedisConsumer {
            shared,
            lane,
            epoch,
            token,
            requests: 0,
            expect: 0,
            nacks: Arc::new(AtomicU64::new(0)),
            clean_at: None,
            detached: false,
            unsent: Arc::new(Mutex::new(Vec::new())),
            waiter: None,
            _item: PhantomData,
        }
    }

    /// The epoch, re-attaching first if a re-attach is pending.
    fn epoch(&mut self) -> Result<u64, BackendError> {
        if let Some(e) = self.epoch {
            return Ok(e);
        }
        let e = self.shared.attach_lane(&self.lane, false, self.token).map_err(|e| match e {
            crate::error::StreamError::Backend(b) => b,
            _ => BackendError::Server(crate::error::ServerReason::UnexpectedReply),
        })?;
        self.epoch = Some(e);
        Ok(e)
    }

    fn step(&mut self, budget: Budget) -> Result<RedisDelivery<T>, TryRecvError> {
        if self.detached {
            return Err(TryRecvError::Detached);
        }
        let epoch = self.epoch().map_err(TryRecvError::Backend)?;
        let pool = &self.shared.pool;
        resend(&self.shared, &self.lane, &self.unsent, budget).map_err(TryRecvError::Backend)?;
        // SeqCst, as the increment: a nack counts itself before it is sent to Redis, so a
        // receive that starts after a nack completed reads the new count (the increment is a
        // read-modify-write made visible before the nack's write to the socket).
        loop {
            let nacks = self.nacks.load(Ordering::SeqCst);
            let fast = self.clean_at == Some(nacks);
            let received = self
                .lane
                .receive(pool, budget, epoch, self.requests + 1, self.expect, fast)
                .map_err(TryRecvError::Backend)?;
            if let Received::Item { n, attempt, gap: true, payload } = &received {
                // Another lane's entry on the sink log: acked on the way past, with its
                // position (the lane acked everything before it, as a gap of the in-memory shared
                // ring), never delivered; then the next one.
                let (n, attempt) = (*n, *attempt);
                let position = T::decode(payload).ok().and_then(|item| item.position());
                // On an error the consumer does not move on: its next receive (the same request
                // number, the same expected entry) gets the gap again, and acks it again (an ack
                // that landed counts once).
                let acked = self.lane.ack(pool, budget, epoch, n, position, attempt, false);
                match acked.map_err(TryRecvError::Backend)? {
                    Acked::Done | Acked::Unknown => {
                        self.requests += 1;
                        if attempt == 1 {
                            self.expect = n + 1;
                            self.clean_at = Some(nacks);
                        }
                        continue;
                    }
                    Acked::Detached => {
                        self.detached = true;
                        return Err(TryRecvError::Detached);
                    }
                }
            }
            return self.deliver(received, nacks, epoch, budget);
        }
    }

    /// The delivery (or the error) for what one receive found.
    fn deliver(
        &mut self,
        received: Received,
        nacks: u64,
        epoch: u64,
        budget: Budget,
    ) -> Result<RedisDelivery<T>, TryRecvError> {
        let pool = &self.shared.pool;
        match received {
            Received::Item { n, attempt, payload, .. } => {
                self.requests += 1;
                if attempt == 1 {
                    self.expect = n + 1;
                    self.clean_at = Some(nacks);
                }
                match T::decode(&payload) {
                    Ok(item) => Ok(RedisDelivery {
                        position: item.position(),
                        item,
                        n,
                        attempt,
                        epoch,
                        shared: self.shared.clone(),
                        lane: self.lane.clone(),
                        unsent: self.unsent.clone(),
                        nacks: self.nacks.clone(),
                        done: false,
                    }),
                    Err(e) => {
                        pool.record(format!(
                            "lanestream: entry {n} of {} does not decode: {e}",
                            self.lane.base
                        ));
                        // Released again, untouched: it stays first in line (L2).
                        self.nacks.fetch_add(1, Ordering::SeqCst); // see `step`
                        let _ = self.lane.nack(pool, budget, epoch, n, attempt);
                        Err(TryRecvError::Backend(BackendError::Corrupt))
                    }
                }
            }
            Received::Empty => {
                // The next receive takes the script (one round trip): a delivery-log record of
                // an entry not published yet would be one more per empty poll.
                self.clean_at = None;
                Err(TryRecvError::Empty)
            }
            Received::Closed => Err(TryRecvError::Closed),
            Received::Detached => {
                self.detached = true;
                Err(TryRecvError::Detached)
            }
        }
    }

    fn recv_until(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<Option<RedisDelivery<T>>, RecvTimeoutError> {
        let shared = self.shared.clone();
        let answer = wait_until(&shared, deadline, || match self.step(Budget::Retry) {
            Ok(d) => ControlFlow::Break(Ok(Some(d))),
            Err(TryRecvError::Closed) => ControlFlow::Break(Ok(None)),
            Err(TryRecvError::Detached) => ControlFlow::Break(Err(RecvTimeoutError::Detached)),
            Err(TryRecvError::Backend(e)) => ControlFlow::Break(Err(RecvTimeoutError::Backend(e))),
            Err(TryRecvError::Empty) => ControlFlow::Continue(Some(self.lane.bell(self.epoch.unwrap_or(0)))),
        });
        answer.unwrap_or(Err(RecvTimeoutError::Timeout))
    }

    /// One poll of an asynchronous receive: `Ready` as `recv` would return, or `Pending` with
    /// `cx`'s waker handed to the helper thread, which waits for a wake-up token.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<RedisDelivery<T>>, RecvError>> {
        match self.step(Budget::Retry) {
            Ok(d) => Poll::Ready(Ok(Some(d))),
            Err(TryRecvError::Closed) => Poll::Ready(Ok(None)),
            Err(TryRecvError::Detached) => Poll::Ready(Err(RecvError::Detached)),
            Err(TryRecvError::Backend(e)) => Poll::Ready(Err(RecvError::Backend(e))),
            Err(TryRecvError::Empty) => {
                let bell = self.lane.bell(self.epoch.unwrap_or(0));
                let shared = self.shared.clone();
                self.waiter.get_or_insert_with(|| Waiter::new(shared, Waiter::RECV)).arm(bell, cx.waker());
                Poll::Pending
            }
        }
    }

    /// Whether a newer consumer took the lane over (asks Redis unless already known).
    fn check_detached(&self) -> bool {
        if self.detached {
            return true;
        }
        let Some(epoch) = self.epoch else { return false };
        match self.lane.field(&self.shared.pool, Budget::Once, "ep") {
            Ok(Some(ep)) => ep.parse::<u64>().is_ok_and(|ep| ep != epoch),
            _ => false,
        }
    }
}

impl<T: RedisItem> LaneConsumer<T> for RedisConsumer<T> {
    type Delivery = RedisDelivery<T>;
    /// Redis receives one entry per round trip (the receive script decides each entry's fate:
    /// a gap, a fenced epoch, a redelivery), so a run is that receive in a loop.
    type Run = DeliveryRun<RedisDelivery<T>>;

    fn try_recv(&mut self) -> Result<RedisDelivery<T>, TryRecvError> {
        self.step(Budget::Once)
    }

    fn recv_deadline(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<Option<RedisDelivery<T>>, RecvTimeoutError> {
        self.recv_until(deadline)
    }

    fn recv_async(
        &mut self,
    ) -> impl Future<Output = Result<Option<RedisDelivery<T>>, RecvError>> + Send + '_ {
        poll_fn(move |cx| self.poll_recv(cx))
    }

    fn is_empty(&self) -> bool {
        match self.lane.stats(&self.shared.pool, Budget::Once) {
            Ok(st) => st.queued == 0 && st.released == 0,
            Err(_) => false,
        }
    }

    fn is_detached(&self) -> bool {
        self.check_detached()
    }

    fn try_recv_run(&mut self, max: usize) -> Result<Self::Run, TryRecvError> {
        DeliveryRun::try_recv(self, max)
    }

    fn recv_run_deadline(
        &mut self,
        max: usize,
        deadline: Option<Instant>,
    ) -> Result<Option<Self::Run>, RecvTimeoutError> {
        DeliveryRun::recv_deadline(self, max, deadline)
    }
}

impl<T> Drop for RedisConsumer<T> {
    fn drop(&mut self) {
        // The acks and nacks kept for the next receive, once, never waiting: what still cannot
        // be sent is settled by the next attach (which releases every unacked item).
        if !self.detached {
            let _ = resend(&self.shared, &self.lane, &self.unsent, Budget::Once);
        }
        // Give the attachment up, so that a polite `attach` may take the lane (and, with it,
        // this consumer's outstanding deliveries) at once.
        if let Some(claim) = self.shared.pool.claim_value(self.token) {
            if !self.detached {
                let _ = self.lane.release(&self.shared.pool, "holder", &claim);
            }
        }
        self.shared.pool.forget(self.token);
    }
}

impl<T> fmt::Debug for RedisConsumer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConsumer")
            .field("lane", &self.lane.base)
            .field("epoch", &self.epoch)
            .field("detached", &self.detached)
            .finish_non_exhaustive()
    }
}

/// One item received from Redis, decoded (and validated) from its entry, with the right to ack
/// or nack it. Dropping it un-acked nacks it ([L6](crate::contract#l6)).
///
/// Unlike the in-memory delivery it holds its own copy of the item: a stale delivery (its
/// consumer detached) pins nothing in the lane.
pub struct RedisDelivery<T> {
    item: T,
    /// The item's position, handed to the ack (the lane takes it from there).
    position: Option<Position>,
    n: u64,
    attempt: u32,
    epoch: u64,
    shared: Arc<Shared>,
    lane: Arc<LaneDef>,
    unsent: Unsent,
    /// The consumer's count of nacks (see `RedisConsumer::clean_at`).
    nacks: Arc<AtomicU64>,
    done: bool,
}

impl<T> RedisDelivery<T> {
    /// The entry number of the item in its lane's Redis stream (its entry id is `<n>-<epoch>`
    /// on the sink log, `<n>-0` on the request log).
    pub fn entry(&self) -> u64 {
        self.n
    }

    fn release(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        // Counted before the nack can reach Redis, so that a receive that starts after it sees
        // the count changed and runs the script, which delivers released entries first
        // (SeqCst: see `RedisConsumer::step`).
        self.nacks.fetch_add(1, Ordering::SeqCst);
        let (epoch, n, attempt) = (self.epoch, self.n, self.attempt);
        if self.lane.nack(&self.shared.pool, Budget::Once, epoch, n, attempt).is_err() {
            lock(&self.unsent).push(Settle::Nack { epoch, n, attempt });
        }
    }
}

/// The port's delivery is this backend's surface for one (with [`entry`](RedisDelivery::entry)).
impl<T: RedisItem> LaneDelivery<T> for RedisDelivery<T> {
    fn item(&self) -> &T {
        &self.item
    }

    fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Acknowledges the item ([L5](crate::contract#l5)): one script that checks the epoch, so a
    /// delivery whose consumer was detached is refused, never counted after the take-back
    /// ([L8](crate::contract#l8)).
    ///
    /// An ack whose every try failed within the retry budget (a lost connection, a transient
    /// refusal such as `OOM`) is kept by its consumer and sent again, as a retry, before that
    /// consumer's next receive (the pipeline's rule P8): it lands then (or is found landed), so
    /// the lane's acked prefix moves on and the lane never stays full behind an item its sink
    /// applied. Should the consumer be dropped first and still fail to send it, the next attach
    /// of the lane releases the item and it is redelivered (a sink skips what its checkpoint
    /// holds). While an earlier ack or nack of the consumer is kept, an ack makes one try only
    /// (and is kept behind it if that fails), so that a run acked during an outage costs one
    /// retry budget, not one per item.
    ///
    /// # Errors
    /// [`AckError::Detached`]; [`AckError::Backend`] if Redis could not be reached within the
    /// retry budget (with [`BackendError::Connection`] the outcome is unknown; the ack is kept
    /// and sent again as above: receive on).
    fn ack(mut self) -> Result<(), AckError> {
        self.done = true;
        let budget = if lock(&self.unsent).is_empty() { Budget::Retry } else { Budget::Once };
        let (epoch, n, position, attempt) = (self.epoch, self.n, self.position, self.attempt);
        match self.lane.ack(&self.shared.pool, budget, epoch, n, position, attempt, false) {
            Ok(Acked::Done) => Ok(()),
            Ok(Acked::Detached) => Err(AckError::Detached),
            Ok(Acked::Unknown) => Err(AckError::Backend(BackendError::Connection)),
            Err(e) => {
                if resendable(e) {
                    lock(&self.unsent).push(Settle::Ack { epoch, n, position, attempt });
                }
                Err(AckError::Backend(e))
            }
        }
    }

    /// Releases the item for redelivery before any new item ([L6](crate::contract#l6)). If
    /// Redis cannot be reached the release is retried by the consumer's next receive.
    fn nack(mut self) {
        self.release();
    }
}

impl<T> Drop for RedisDelivery<T> {
    fn drop(&mut self) {
        self.release();
    }
}

impl<T: fmt::Debug> fmt::Debug for RedisDelivery<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisDelivery")
            .field("item", &self.item)
            .field("entry", &self.n)
            .field("attempt", &self.attempt)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}
