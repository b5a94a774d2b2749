//! [`Subscription`]: every matching event after a position, exactly once, in order, across the
//! catch-up and the live tail.
//!
//! A subscription is a cursor, nothing more: each batch is a read of the latest snapshot over
//! `(cursor, head]`, and the cursor moves to the last event delivered — or, when nothing in
//! `(cursor, head]` matched, to the head. Catch-up and live tail are the same loop, so there is
//! no hand-off for an append to slip through, and the writer never knows a subscriber exists
//! beyond waking it ([`Signal`](super::signal::Signal)).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::error::{NextTimeoutError, ReadError, SubscriptionError, TryNextError};
use super::event::SequencedEvent;
use super::position::LogPosition;
use super::query::Query;
use super::snapshot::{Dir, Shared, View};

/// What one look at the log gave.
enum Step {
    Batch(Vec<SequencedEvent>),
    Nothing,
    Closed,
    Failed(Arc<std::io::Error>),
    /// The batch's events could not be read back; the cursor did not move.
    Read(ReadError),
}

/// Every event matching a query after a position, exactly once, ascending, in batches; from
/// [`ReadHandle::subscribe`](super::ReadHandle::subscribe).
///
/// Batches come from the already-written log first and then from the live tail, with no gap and
/// no duplicate whatever appends race the switch. Each batch holds at most
/// [`batch_limit`](Subscription::batch_limit) events (by default the log's
/// [`subscription_batch`](super::LogOptions::subscription_batch)). After the log closes, the
/// events published before the close are still delivered, then `Ok(None)`; after the writer
/// fails, the events published before the failure, then [`SubscriptionError::Failed`]. A
/// subscription holds no lock and nothing the writer waits for; drop it at any time.
///
/// ```
/// use lanestream_log::{Event, EventLog, LogOptions, Query};
/// let log = EventLog::in_memory(LogOptions::default())?;
/// let mut sub = log.subscribe(Query::types(["Paid"]), None);
/// log.append(vec![Event::untagged("Paid", &b"1"[..])?], None)?;
/// let batch = sub.next_batch()?.expect("not closed");
/// assert_eq!(batch[0].position.get(), 1);
/// log.close();
/// assert!(sub.next_batch()?.is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Subscription {
    shared: Arc<Shared>,
    query: Query,
    /// Everything matching at or below this raw position was delivered.
    after: u64,
    batch: usize,
}

impl Subscription {
    pub(crate) fn new(shared: Arc<Shared>, query: Query, after: Option<LogPosition>) -> Subscription {
        let batch = shared.subscription_batch;
        Subscription { shared, query, after: super::position::raw(after), batch }
    }

    /// Sets the most events per batch (at least 1; 0 is taken as 1).
    pub fn batch_limit(mut self, events: usize) -> Subscription {
        self.batch = events.max(1);
        self
    }

    /// The query.
    pub fn query(&self) -> &Query {
        &self.query
    }

    /// The cursor: every matching event at or before it was delivered (or lay before the
    /// subscription's start). Resubscribing with this as `after` continues without a gap.
    pub fn position(&self) -> Option<LogPosition> {
        LogPosition::from_raw(self.after)
    }

    fn step(&mut self) -> Step {
        // Read the end flags before the snapshot: the writer publishes its last snapshot before
        // it sets them, so a batch committed just before the end is still seen here.
        let closed = self.shared.is_closed();
        let failure = self.shared.failure.get().cloned();
        let snap = self.shared.snapshot.load();
        let view = View::published(snap.head, &snap.types, &snap.tags, &self.shared.events);
        let events = match view.collect(&self.query, self.after, snap.head, Dir::Up, self.batch) {
            Ok((events, _)) => events,
            Err(e) => return Step::Read(e),
        };
        if let Some(last) = events.last() {
            self.after = last.position.get();
            return Step::Batch(events);
        }
        self.after = self.after.max(snap.head);
        match (failure, closed) {
            (Some(cause), _) => Step::Failed(cause),
            (None, true) => Step::Closed,
            (None, false) => Step::Nothing,
        }
    }

    /// Whether a look at the log could give something new (checked after registering with the
    /// signal).
    fn ready(shared: &Shared, after: u64) -> bool {
        shared.is_ended() || shared.snapshot.load().head > after
    }

    /// The next batch if one is ready now; never blocks.
    ///
    /// # Errors
    /// [`TryNextError::Empty`] (nothing new yet), [`TryNextError::Closed`] (closed and
    /// drained), [`TryNextError::Failed`], [`TryNextError::Read`] (the cursor did not move).
    pub fn try_next_batch(&mut self) -> Result<Vec<SequencedEvent>, TryNextError> {
        match self.step() {
            Step::Batch(b) => Ok(b),
            Step::Nothing => Err(TryNextError::Empty),
            Step::Closed => Err(TryNextError::Closed),
            Step::Failed(c) => Err(TryNextError::Failed(c)),
            Step::Read(e) => Err(TryNextError::Read(e)),
        }
    }

    /// The next batch, blocking (a brief spin, then parked) until there is one; `Ok(None)` once the
    /// log is closed and every matching event was delivered.
    ///
    /// # Errors
    /// [`SubscriptionError::Failed`] once the writer failed and every event published before
    /// was delivered; [`SubscriptionError::Read`] when the batch could not be read back from a
    /// durable log's segments (the cursor did not move: calling again retries it).
    pub fn next_batch(&mut self) -> Result<Option<Vec<SequencedEvent>>, SubscriptionError> {
        loop {
            match self.step() {
                Step::Batch(b) => return Ok(Some(b)),
                Step::Closed => return Ok(None),
                Step::Failed(c) => return Err(SubscriptionError::Failed(c)),
                Step::Read(e) => return Err(SubscriptionError::Read(e)),
                Step::Nothing => {
                    let (shared, after) = (&self.shared, self.after);
                    shared.signal.wait(|| Self::ready(shared, after), None);
                }
            }
        }
    }

    /// As [`next_batch`](Subscription::next_batch), waiting until `deadline` at most.
    ///
    /// # Errors
    /// [`NextTimeoutError::Timeout`] when nothing came in time; [`NextTimeoutError::Failed`];
    /// [`NextTimeoutError::Read`].
    pub fn next_batch_deadline(
        &mut self,
        deadline: Instant,
    ) -> Result<Option<Vec<SequencedEvent>>, NextTimeoutError> {
        loop {
            match self.step() {
                Step::Batch(b) => return Ok(Some(b)),
                Step::Closed => return Ok(None),
                Step::Failed(c) => return Err(NextTimeoutError::Failed(c)),
                Step::Read(e) => return Err(NextTimeoutError::Read(e)),
                Step::Nothing => {
                    let (shared, after) = (&self.shared, self.after);
                    if !shared.signal.wait(|| Self::ready(shared, after), Some(deadline)) {
                        return Err(NextTimeoutError::Timeout);
                    }
                }
            }
        }
    }

    /// As [`next_batch`](Subscription::next_batch), waiting `timeout` at most.
    ///
    /// # Errors
    /// As [`next_batch_deadline`](Subscription::next_batch_deadline).
    pub fn next_batch_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<Vec<SequencedEvent>>, NextTimeoutError> {
        self.next_batch_deadline(Instant::now() + timeout)
    }

    /// As [`next_batch`](Subscription::next_batch), awaiting instead of blocking; any executor.
    /// Dropping the future loses nothing (the cursor moves only when a batch is returned).
    pub fn next_batch_async(&mut self) -> NextBatch<'_> {
        NextBatch { sub: self, key: None }
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("query", &self.query)
            .field("after", &self.after)
            .field("batch", &self.batch)
            .finish()
    }
}

/// The future of [`Subscription::next_batch_async`].
#[must_use = "futures do nothing unless polled"]
pub struct NextBatch<'a> {
    sub: &'a mut Subscription,
    key: Option<u64>,
}

impl Future for NextBatch<'_> {
    type Output = Result<Option<Vec<SequencedEvent>>, SubscriptionError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match this.sub.step() {
                Step::Batch(b) => return Poll::Ready(Ok(Some(b))),
                Step::Closed => return Poll::Ready(Ok(None)),
                Step::Failed(c) => return Poll::Ready(Err(SubscriptionError::Failed(c))),
                Step::Read(e) => return Poll::Ready(Err(SubscriptionError::Read(e))),
                Step::Nothing => {
                    let (shared, after) = (&this.sub.shared, this.sub.after);
                    if shared
                        .signal
                        .poll(|| Subscription::ready(shared, after), &mut this.key, cx)
                        .is_pending()
                    {
                        return Poll::Pending;
                    }
                }
            }
        }
    }
}

impl Drop for NextBatch<'_> {
    fn drop(&mut self) {
        self.sub.shared.signal.cancel(&mut self.key);
    }
}

impl fmt::Debug for NextBatch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NextBatch")
            .field("subscription", &self.sub)
            .field("waiting", &self.key.is_some())
            .finish()
    }
}
