//! The pipeline as a library: a [`Source`] into a [`Stream`](crate::Stream) into [`Sink`]s.
//!
//! - [`Source`] ([`source`]): checks the sinks' states at start, produces transactions
//!   ([`SourceItem::Change`]), confirms a position, serves backfills ([`SourceItem::Snapshot`]).
//!   Sources live with what they read: the crate `lanestream-postgres` has `LiveSource` (a
//!   replication slot) and `FileSource` (a capture file, or any iterator of batches), the crate
//!   `lanestream-log` has `LogSource` (the event log).
//! - [`CommitLatency`] ([`metrics`]): each sink's commit → ack latency (p50 / p99 in
//!   [`SinkReport::commit_to_ack`]).
//! - [`Sink`] ([`sink`]): what a user implements: apply a run of lane items, commit it together
//!   with the [`SinkState`] the engine hands over (one atomic step), give that state back at
//!   open (the crate `lanestream-postgres` has one ready to use, `DurableNdjson`);
//!   [`RetryPolicy`] says how a failing (or panicking) sink is retried.
//! - [`SinkState`] ([`state`]): a sink's durable state — its position and in-transaction offset,
//!   the backfills it is owed, the indexes it holds, its origin — and the rules P1-P3 and P7 it
//!   carries.
//! - [`Pipeline`] ([`driver`]): the ingest loop on the calling thread and one sink engine per
//!   sink on threads of its own ([`engine`]), over any stream backend (`MemoryStream`
//!   in-process, `RedisStream` across processes; [`run_sink`] runs one engine alone, for a sink
//!   process).
//!
//! # What the driver guarantees
//! - **At start** it reads every local sink's state and hands it to [`Source::start`]: a source
//!   that would resume past a sink's data refuses (P1); a sink with no state on a source with
//!   history is backfilled, refused or started live-only ([`Joiners`], P2); a table the source
//!   publishes that a sink does not hold is owed to it (P2); every backfill owed is committed in
//!   the sink's state before its request is published, and asked again by a restarted engine
//!   (P3). A refusal starts nothing and writes nothing.
//! - Each [`SourceItem::Change`] is published to every lane (that lacks it) with the stream's one fan-out; a
//!   [`SourceItem::Snapshot`] to its sink's lane only (`publish_to`).
//! - The source is confirmed only at the stream's watermark (what every sink made durable and
//!   acked), never past it: after publishing while it moves, while a full lane keeps the ingest
//!   waiting, while the source is idle, and at the end (waiting with
//!   [`Stream::wait_watermark`](crate::Stream::wait_watermark), not by sleep-polling).
//! - A backfill request is acked only after its `SnapshotComplete` is published
//!   ([R2](crate::contract#r2)); a restarted driver gets the unacked ones again, and a
//!   restarted sink engine asks again for what its state owes. A request for a sink the stream
//!   has no lane for is acked unanswered ([`PipelineReport::requests_refused`]).
//! - A restarted ingest over lanes that hold published, unacked items beyond the watermark
//!   publishes nothing twice: each lane gets only what it lacks ([`Pipeline::run`],
//!   "Resuming").
//! - A sink engine receives runs through the port ([`LaneConsumer::recv_run`](crate::LaneConsumer::recv_run);
//!   several, up to [`Pipeline::max_run`] items), hands its sink what the state does not cover,
//!   commits it with the state advanced, and acks each run only after the commit
//!   ([C1](crate::contract#c1)); a change of an index the sink neither holds nor is owed
//!   makes it owe a backfill of it (a table that joined while running). A failed or panicking run
//!   is released, the sink reopened from its durable state, the lane re-attached and the run
//!   redelivered, within the [`RetryPolicy`]; after it the pipeline stops with
//!   [`PipelineError::Sink`] naming the sink. Never a silent drop.
//! - P8: a transient backend error inside the backend's retry budget (a broker's lost
//!   connection, a server restarting or refusing writes for a moment) is retried, never turned
//!   into an error of the pipeline nor a close; an ack the backend could not confirm is sent
//!   again, or its item redelivered (the sink skips what its checkpoint holds). A pipeline that
//!   stops on an error leaves the lanes open, as a crash would: closing them is the stream's
//!   end, final for every later publisher ([L10](crate::contract#l10)), so a restarted
//!   ingest publishes again at once ([L9](crate::contract#l9)); so does a sink engine run
//!   alone ([`run_sink`]) that gives up.
//! - A [`StopHandle`] (wire it to SIGTERM) stops reading the source, waits until the sinks acked
//!   what was published (bounded), confirms, stops and joins the engines, and leaves the lanes
//!   open (a stop is a pause; only the source's end closes them, final by
//!   [L10](crate::contract#l10)): `Ok`.
//!
//! # Feature
//! The module is the feature `pipeline` (on by default). It runs on plain threads: the crate
//! still depends on no async runtime.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use lanestream::pipeline::{Pipeline, Sink, SinkStart, SinkState, Source, SourceItem, SourceStart};
//! use lanestream::{Batch, LaneItem, MemoryStream, Position, Request};
//!
//! /// Three transactions, then the end.
//! struct Numbers(u64);
//! impl Source for Numbers {
//!     type Error = std::io::Error;
//!     fn start(&mut self, _: &[SinkStart<'_>]) -> Result<SourceStart, Self::Error> {
//!         Ok(SourceStart::default()) // read from its start: nothing to check
//!     }
//!     fn next(&mut self, _: Duration) -> Result<Option<SourceItem>, Self::Error> {
//!         self.0 += 1;
//!         Ok(Some(match self.0 {
//!             1..=3 => SourceItem::Change(Batch::new(Some(Position(self.0 * 10)), Arc::from(vec![]))),
//!             _ => SourceItem::End,
//!         }))
//!     }
//!     fn confirm(&mut self, _: Position) -> Result<(), Self::Error> {
//!         Ok(())
//!     }
//!     fn backfill(&mut self, request: Request) -> Result<(), Self::Error> {
//!         Err(std::io::Error::other(format!("cannot backfill {request:?}")))
//!     }
//! }
//!
//! /// Keeps the state it is given (a real sink stores it with its data, atomically).
//! #[derive(Default)]
//! struct Memory(Option<SinkState>);
//! impl Sink for Memory {
//!     type Error = std::io::Error;
//!     fn state(&mut self) -> Result<Option<SinkState>, Self::Error> {
//!         Ok(self.0.clone())
//!     }
//!     fn apply(&mut self, _items: &[LaneItem]) -> Result<(), Self::Error> {
//!         Ok(())
//!     }
//!     fn commit(&mut self, state: &SinkState) -> Result<(), Self::Error> {
//!         self.0 = Some(state.clone());
//!         Ok(())
//!     }
//! }
//!
//! let stream = MemoryStream::builder().sinks(["search"]).build()?;
//! let report = Pipeline::new(stream)
//!     .sink("search", || Ok::<_, std::io::Error>(Memory::default()))
//!     .run(&mut Numbers(0))?;
//! assert_eq!(report.transactions, 3);
//! assert_eq!(report.confirmed, Some(Position(30))); // every sink acked it, then confirmed
//! assert_eq!(report.sinks[0].position, Some(Position(30)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod driver;
pub mod engine;
pub mod error;
mod ingest;
pub mod metrics;
pub mod sink;
pub mod source;
pub mod state;
pub mod stop;
#[cfg(test)]
mod tests;

pub use driver::{Joiners, Pipeline};
pub use engine::run_sink;
pub use error::PipelineError;
pub use metrics::{
    peak_rss_bytes, CommitLatency, LatencySummary, MetricsHandle, PipelineMetrics, PipelineReport,
    SinkMetrics, SinkReport,
};
pub use sink::{MemorySink, RetryPolicy, Sink};
pub use source::{SinkStart, Source, SourceItem, SourceStart};
pub use state::{InTransaction, OwedBackfill, SinkState, StateError, Uncovered};
pub use stop::StopHandle;

/// Any error, boxed: what a [`Sink::Error`] converts into.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
