//! The sink side: what a user implements ([`Sink`]), how a failing sink is retried
//! ([`RetryPolicy`]), and an in-memory sink for tests and examples ([`MemorySink`]). The crate
//! `lanestream-postgres` has a ready durable one (`DurableNdjson`, an NDJSON file with its
//! checkpoint).

use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::LaneItem;

use super::metrics::lock;
use super::state::SinkState;
use super::BoxError;

/// A destination a sink engine applies its lane to: a search index, a cache, a table, a file.
///
/// The engine ([`Pipeline::sink`](super::Pipeline::sink), [`run_sink`](super::run_sink)) reads
/// the sink's durable [`SinkState`] once per instance ([`state`](Sink::state)), receives a run
/// of lane items, hands [`apply`](Sink::apply) the part the state does not cover yet (a
/// transaction the source sends again after a restart, or the chunks of one already applied,
/// never reach the sink twice), then calls [`commit`](Sink::commit) with the state advanced
/// past them, and acks the run only after `commit` returned `Ok` (contract
/// [C1](crate::contract#c1)): what is acked is durable, and the stream's watermark (what
/// the source confirms) never passes it.
///
/// **The one thing a sink must do**: make `commit` store the data applied since the last commit
/// *and* the state it is given ([`SinkState::to_text`]) in one atomic step (one database
/// transaction, or a file and a checkpoint renamed over the old one), and give that state back
/// from `state` ([`SinkState::parse`]). Then every rule of the pipeline holds for it: exactly
/// once per change across crashes, owed backfills asked again after a restart and resumed after
/// the last row applied, a joining sink or table backfilled (see [`SinkState`]).
///
/// When `apply` or `commit` returns an error or panics, the engine drops this instance (what it
/// applied and did not commit must not survive: the next instance starts from the durable
/// state), releases the run for redelivery, waits the [`RetryPolicy`]'s backoff, opens a new
/// instance and re-attaches to the lane: the run comes again.
///
/// Items reach `apply` in lane order: positioned batches (transactions), unpositioned chunks of
/// large ones (their envelopes carry the commit position; [`Batch::offset`](crate::Batch::offset)
/// says where they start), snapshot batches (position `None` everywhere: upserts, applied at
/// least once) and `LaneItem::SnapshotComplete`.
pub trait Sink: Send {
    /// Why a run could not be applied or made durable: any error, boxed ones included.
    type Error: Into<BoxError>;

    /// The state the last [`commit`](Sink::commit) stored with the data; `None` for a sink that
    /// never committed one (a new sink: see [`Joiners`](super::Joiners)).
    ///
    /// # Errors
    /// The sink's own: the engine retries opening it.
    fn state(&mut self) -> Result<Option<SinkState>, Self::Error>;

    /// Applies lane items, in lane order (see the trait docs). Need not be durable before
    /// [`commit`](Sink::commit).
    ///
    /// # Errors
    /// The sink's own: the engine retries (see the trait docs).
    fn apply(&mut self, items: &[LaneItem]) -> Result<(), Self::Error>;

    /// Makes everything applied so far durable together with `state`, in one atomic step;
    /// after `Ok` the engine acks it. Also called with nothing applied, when only the state
    /// changed (a backfill owed before it is asked).
    ///
    /// # Errors
    /// The sink's own: nothing of the run is acked, and the engine retries.
    fn commit(&mut self, state: &SinkState) -> Result<(), Self::Error>;
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

/// An in-memory [`Sink`] for tests and examples: it records every item applied, in order, and
/// the state of its last commit. Clones share both, and both outlive an instance, as a durable
/// sink's data and checkpoint would: hand a clone to [`Pipeline::sink`](super::Pipeline::sink)'s
/// open function, and a restarted engine (or a second pipeline run) resumes from the committed
/// state while the test reads what was applied. Applied items are kept even when their commit
/// fails (unlike a durable sink's, which its next instance would not see): tests of failing
/// commits wrap it.
///
/// ```
/// use lanestream::pipeline::{MemorySink, Pipeline};
/// use lanestream::MemoryStream;
///
/// let stream = MemoryStream::builder().sinks(["search"]).build().unwrap();
/// let search = MemorySink::new();
/// let pipeline = Pipeline::new(stream).sink("search", {
///     let search = search.clone();
///     move || Ok::<_, std::convert::Infallible>(search.clone())
/// });
/// # let _ = pipeline;
/// assert!(search.applied().is_empty() && search.committed().is_none());
/// ```
#[derive(Clone, Debug, Default)]
pub struct MemorySink {
    applied: Arc<Mutex<Vec<LaneItem>>>,
    committed: Arc<Mutex<Option<SinkState>>>,
    delay: Duration,
}

impl MemorySink {
    /// An empty sink: nothing applied, no state (a new sink).
    pub fn new() -> Self {
        MemorySink::default()
    }

    /// This sink (sharing what it holds) taking `delay` per [`apply`](Sink::apply): a slow
    /// sink, whose lane fills while it applies.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// The items applied so far, in order, over every instance; locked while the guard lives
    /// (the engine's `apply` waits for it).
    pub fn applied(&self) -> MutexGuard<'_, Vec<LaneItem>> {
        lock(&self.applied)
    }

    /// The state of the last commit (`None` before the first), which the next instance's
    /// [`state`](Sink::state) returns; locked while the guard lives. Set it to start a sink
    /// from a state of your own.
    pub fn committed(&self) -> MutexGuard<'_, Option<SinkState>> {
        lock(&self.committed)
    }
}

impl Sink for MemorySink {
    type Error = Infallible;

    fn state(&mut self) -> Result<Option<SinkState>, Infallible> {
        Ok(self.committed().clone())
    }

    fn apply(&mut self, items: &[LaneItem]) -> Result<(), Infallible> {
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        self.applied().extend_from_slice(items);
        Ok(())
    }

    fn commit(&mut self, state: &SinkState) -> Result<(), Infallible> {
        *self.committed() = Some(state.clone());
        Ok(())
    }
}
