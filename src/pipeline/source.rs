//! The ingest side: what the [driver](super::Pipeline) reads from ([`Source`]), what it tells a
//! source at start ([`SinkStart`]) and hears back ([`SourceStart`]), and what a source hands
//! over ([`SourceItem`]). Sources live with what they read: the crate `lanestream-postgres` has
//! a replication slot's (`LiveSource`) and a capture file's (`FileSource`), the crate
//! `lanestream-log` the event log's (`LogSource`).

use std::time::Duration;

use crate::{Batch, IndexName, LaneItem, Position, Request, SinkName};

use super::state::SinkState;

/// Where a pipeline's changes come from: a replication slot, a file, an event log.
///
/// The [driver](super::Pipeline) calls [`next`](Source::next) in a loop from one thread,
/// publishes what it returns, calls [`confirm`](Source::confirm) with the stream's watermark (what
/// every sink has made durable and acked, never more), and hands each backfill request of the
/// request lane to [`backfill`](Source::backfill).
pub trait Source: Send {
    /// Why the source cannot go on; the driver stops with it ([`PipelineError::Source`](super::PipelineError::Source)).
    type Error: std::error::Error + Send + Sync + 'static;

    /// Waits up to `timeout` for the next thing to publish; `Ok(None)` on timeout; the end of a
    /// finite input is [`SourceItem::End`] (and stays so on later calls, except for snapshot
    /// items of a backfill asked for after it).
    ///
    /// # Errors
    /// The source's own; the driver stops.
    fn next(&mut self, timeout: Duration) -> Result<Option<SourceItem>, Self::Error>;

    /// The stream's watermark reached `position`: the source may confirm up to it, never more
    /// (everything at or before it is durable in every sink).
    ///
    /// # Errors
    /// The source's own; the driver stops.
    fn confirm(&mut self, position: Position) -> Result<(), Self::Error>;

    /// A sink asked for a backfill: start serving it. Its snapshot batches (position `None`) and
    /// then its `SnapshotComplete` come out of [`next`](Source::next) as
    /// [`SourceItem::Snapshot`], interleaved with the live changes. A source that cannot
    /// backfill returns an error naming the request (the driver then stops: a sink waiting for a
    /// snapshot that never comes would hold stale data silently).
    ///
    /// # Errors
    /// The source's own, or its refusal.
    fn backfill(&mut self, request: Request) -> Result<(), Self::Error>;

    /// How far the upstream is ahead of what was confirmed, in bytes, for
    /// [`PipelineMetrics::source_lag_bytes`](super::metrics::PipelineMetrics::source_lag_bytes)
    /// (for a replication slot: the log the server keeps beyond its confirmed position). The driver
    /// asks about once a second, on its own thread. Default: `None` (not known).
    fn lag_bytes(&mut self) -> Option<u64> {
        None
    }

    /// Called once by the driver before the first [`next`](Source::next), with the durable
    /// state of every local sink ([P1](super::state#the-rules)): a source that resumes from a
    /// position of its own (a replication slot) refuses to resume past a sink's
    /// [`SinkState::applied`] position (what was committed in between would be in no sink),
    /// naming both positions and the remedy. Returns what the driver needs for the sinks'
    /// plans ([`SourceStart`]).
    ///
    /// Required, so that no source (a wrapper around another included) skips the checks by
    /// accident: a source with nothing to check — a file read from its start, where a new sink
    /// gets everything by reading it — returns `Ok(SourceStart::default())` (no origin, no
    /// history, indexes not listed); a wrapper forwards the call.
    ///
    /// # Errors
    /// The source's refusal, or its own failure; the pipeline then starts nothing.
    fn start(&mut self, sinks: &[SinkStart<'_>]) -> Result<SourceStart, Self::Error>;
}

/// One local sink as [`Source::start`] sees it.
#[derive(Clone, Copy, Debug)]
pub struct SinkStart<'a> {
    /// The sink.
    pub sink: &'a SinkName,
    /// Its durable state; `None` for a sink that never committed one.
    pub state: Option<&'a SinkState>,
    /// What the pipeline does with it if it is a joiner (`state` is `None` on a source with
    /// history): with [`Joiners::Backfill`](super::Joiners::Backfill) it will ask a backfill of
    /// every index, so until then it holds no row (a source that treats changes of rows a sink
    /// does not hold specially needs to know: the live PostgreSQL source's partial updates).
    pub joiners: super::Joiners,
}

/// What a source says at start ([`Source::start`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SourceStart {
    /// Names the source's data: recorded in each sink's state, and a sink recorded with
    /// another origin is refused (for a replication slot: the database, the slot and what it
    /// publishes). `None`: no check.
    pub origin: Option<String>,
    /// Whether the stream starts after data a sink would miss: a slot that resumes mid-stream,
    /// tables that hold rows. A new sink then is a joiner ([`Joiners`](super::Joiners)).
    pub history: bool,
    /// Where the stream resumes (the source sends again every transaction that commits at or
    /// after it), for messages.
    pub resumes_from: Option<Position>,
    /// Every index the source publishes now, when it can list them: a joiner's backfill, and
    /// the indexes a sink starts to track (a change of any other makes it owe a backfill).
    pub indexes: Option<Vec<IndexName>>,
}

impl SourceStart {
    /// A start with these fields (the struct is `non_exhaustive`).
    pub fn new(
        origin: Option<String>,
        history: bool,
        resumes_from: Option<Position>,
        indexes: Option<Vec<IndexName>>,
    ) -> Self {
        SourceStart { origin, history, resumes_from, indexes }
    }
}

/// What [`Source::next`] hands the driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceItem {
    /// A committed transaction (or one chunk of it): published to every lane.
    Change(Batch),
    /// For one sink only (published with [`publish_to`](crate::StreamFanout::publish_to)): a snapshot batch or the
    /// `LaneItem::SnapshotComplete { indexes }` that ends a backfill. The driver acks the
    /// request's delivery only after it published this `SnapshotComplete` ([R2](crate::contract#r2)).
    Snapshot {
        /// The sink that asked.
        sink: SinkName,
        /// The snapshot batch, or `SnapshotComplete`.
        item: LaneItem,
    },
    /// A finite input is exhausted.
    End,
}
