//! The sink side: what a user implements ([`Sink`]), how a failing sink is retried
//! ([`RetryPolicy`]), and the ready durable NDJSON sink ([`DurableNdjson`]).

use std::time::Duration;

use lanestream::{LaneItem, Position, Request};

use crate::ndjson::{DurableNdjson, NdjsonError};

/// A destination a sink engine applies its lane to: a search index, a cache, a file.
///
/// The engine ([`Pipeline::sink`](super::Pipeline::sink), [`run_sink`](super::run_sink))
/// receives a run of lane items, calls [`apply`](Sink::apply) with it, then
/// [`commit`](Sink::commit), and acks the run's deliveries only after `commit` returned `Ok`
/// (contract [C1](lanestream::contract#c1)): what is acked is durable, and the stream's watermark
/// (what the source confirms) never passes it.
///
/// When `apply` or `commit` returns an error or panics, the engine drops this instance (what it
/// applied and did not commit must not survive: the next instance starts from the durable
/// checkpoint), releases the run for redelivery, waits the [`RetryPolicy`]'s backoff, opens a new
/// instance and re-attaches to the lane: the run comes again. Deliveries are at least once: a
/// sink makes a redelivered item idempotent (by position and [`Batch::offset`](lanestream::Batch::offset),
/// as [`DurableNdjson`] does) or tolerates it.
pub trait Sink: Send {
    /// Why a run could not be applied or made durable.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Applies a run of lane items, in lane order: positioned batches (transactions), their
    /// unpositioned chunks, snapshot batches (position `None` everywhere) and
    /// `LaneItem::SnapshotComplete`. Need not be durable before [`commit`](Sink::commit).
    ///
    /// # Errors
    /// The sink's own: the engine retries (see the trait docs).
    fn apply(&mut self, items: &[LaneItem]) -> Result<(), Self::Error>;

    /// Makes everything applied so far durable; after `Ok` the engine acks it.
    ///
    /// # Errors
    /// The sink's own: nothing of the run is acked, and the engine retries.
    fn commit(&mut self) -> Result<(), Self::Error>;

    /// The last transaction (commit position) the sink holds durably, if any.
    fn checkpoint(&self) -> Option<Position>;

    /// A backfill this sink wants (again) when its engine starts, such as one a crash
    /// interrupted; the engine publishes it on the request lane once, for the first instance it
    /// opens (an instance reopened after a failed run does not ask again: the request is still
    /// pending on the same stream). Default: none.
    fn resume(&self) -> Option<Request> {
        None
    }
}

/// How often and how patiently a sink engine retries a run whose [`Sink::apply`] or
/// [`Sink::commit`] failed (or panicked): up to `attempts` tries of one run in a row, waiting
/// `initial_backoff` after the first failure and twice as long after each further one, at most
/// `max_backoff`. After the last try the engine stops and the pipeline stops with
/// [`PipelineError::Sink`](super::PipelineError::Sink) naming the sink; nothing of the failed run
/// was acked. A run that succeeds resets the count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries of one run, the first included (at least 1).
    pub attempts: u32,
    /// The wait after the first failure.
    pub initial_backoff: Duration,
    /// The longest wait between two tries.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// 5 tries, backoff 50 ms doubling up to 2 s (about 0.75 s in all before giving up).
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
        }
    }
}

impl RetryPolicy {
    /// The wait after the `failures`-th failure in a row (1 for the first).
    pub fn backoff(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(30);
        self.initial_backoff.saturating_mul(1 << doublings).min(self.max_backoff)
    }
}

/// The durable NDJSON file sink: each batch's envelopes as lines, fsynced and checkpointed at
/// [`commit`](Sink::commit); a redelivered or re-sent transaction is skipped by its position and
/// offset (see [`crate::ndjson`]). Snapshot rows move the checkpoint's backfill record and
/// `SnapshotComplete` clears it ([`DurableNdjson::apply_item`]); [`resume`](Sink::resume) asks
/// a recorded backfill again after the last row applied ([`DurableNdjson::resume_request`]). A
/// new instance after a failure is opened with [`DurableNdjson::open`], which cuts the output
/// back to the checkpoint.
impl Sink for DurableNdjson {
    type Error = NdjsonError;

    fn apply(&mut self, items: &[LaneItem]) -> Result<(), NdjsonError> {
        for item in items {
            self.apply_item(item)?;
        }
        Ok(())
    }

    fn commit(&mut self) -> Result<(), NdjsonError> {
        DurableNdjson::commit(self)
    }

    fn checkpoint(&self) -> Option<Position> {
        DurableNdjson::checkpoint(self).committed
    }

    fn resume(&self) -> Option<Request> {
        self.resume_request()
    }
}
