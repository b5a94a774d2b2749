//! The pipeline as a library: a [`Source`] into a [`lanestream::Stream`] into [`Sink`]s.
//!
//! - [`Source`] ([`source`]): checks the sinks' states at start, produces transactions
//!   ([`SourceItem::Change`]), confirms a position, serves backfills ([`SourceItem::Snapshot`]).
//!   This crate's: [`FileSource`] (a wal2json or pgoutput capture) and [`LiveSource`](crate::live::LiveSource) (a pgoutput
//!   replication slot).
//! - [`CommitLatency`] ([`metrics`]): each sink's commit → ack latency (p50 / p99 in
//!   [`SinkReport::commit_to_ack`]).
//! - [`Sink`] ([`sink`]): what a user implements: apply a run of lane items, commit it together
//!   with the [`SinkState`] the engine hands over (one atomic step), give that state back at
//!   open. [`DurableNdjson`] is one, ready to use; [`RetryPolicy`] says how a failing (or
//!   panicking) sink is retried.
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
//! - Each [`SourceItem::Change`] is published to every lane with the stream's one fan-out; a
//!   [`SourceItem::Snapshot`] to its sink's lane only (`publish_to`).
//! - The source is confirmed only at the stream's watermark (what every sink made durable and
//!   acked), never past it: after publishing while it moves, while a full lane keeps the ingest
//!   waiting, while the source is idle, and at the end (waiting with
//!   [`Stream::wait_watermark`](lanestream::Stream::wait_watermark), not by sleep-polling).
//! - A backfill request is acked only after its `SnapshotComplete` is published
//!   ([R2](lanestream::contract#r2)); a restarted driver gets the unacked ones again, and a
//!   restarted sink engine asks again for what its state owes.
//! - A sink engine receives runs through the port ([`LaneConsumer::recv_run`](lanestream::LaneConsumer::recv_run);
//!   several, up to [`Pipeline::max_run`] items), hands its sink what the state does not cover,
//!   commits it with the state advanced, and acks each run only after the commit
//!   ([C1](lanestream::contract#c1)); a change of an index the sink neither holds nor is owed
//!   makes it owe a backfill of it (a table that joined while running). A failed or panicking run
//!   is released, the sink reopened from its durable state, the lane re-attached and the run
//!   redelivered, within the [`RetryPolicy`]; after it the pipeline stops with
//!   [`PipelineError::Sink`] naming the sink. Never a silent drop.
//! - P8: a transient backend error inside the backend's retry budget (a broker's lost
//!   connection, a server restarting or refusing writes for a moment) is retried, never turned
//!   into an error of the pipeline nor a close; an ack the backend could not confirm is sent
//!   again, or its item redelivered (the sink skips what its checkpoint holds). A pipeline that
//!   stops on an error leaves the lanes open, as a crash would: closing them is the stream's
//!   end, final for every later publisher ([L10](lanestream::contract#l10)), so a restarted
//!   ingest publishes again at once ([L9](lanestream::contract#l9)); so does a sink engine run
//!   alone ([`run_sink`]) that gives up.
//! - A [`StopHandle`] (wire it to SIGTERM) stops reading the source, waits until the sinks acked
//!   what was published (bounded), confirms, stops and joins the engines, and leaves the lanes
//!   open (a stop is a pause; only the source's end closes them, final by
//!   [L10](lanestream::contract#l10)): `Ok`.
//!
//! ```
//! use std::time::Duration;
//! use lanestream::{MemoryStream, Stream};
//! use lanestream_postgres::ndjson::DurableNdjson;
//! use lanestream_postgres::pipeline::{FileSource, Pipeline};
//! use lanestream_postgres::batch::TransactionBuilder;
//!
//! let wal2json = concat!(
//!     r#"{"action":"B","xid":1,"lsn":"0/16B3748","nextlsn":"0/16B3778"}"#, "\n",
//!     r#"{"action":"I","xid":1,"lsn":"0/16B3700","schema":"public","table":"t","#,
//!     r#""columns":[{"name":"id","type":"integer","value":1}],"pk":[{"name":"id","type":"integer"}]}"#, "\n",
//!     r#"{"action":"C","xid":1,"lsn":"0/16B3748","nextlsn":"0/16B3778"}"#, "\n",
//! );
//! let dir = std::env::temp_dir().join(format!("pipeline-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let stream = MemoryStream::builder().sinks(["search"]).build()?;
//! let out = dir.clone();
//! let report = Pipeline::new(stream.clone())
//!     .sink("search", move || DurableNdjson::open(&out, "search", Duration::ZERO))
//!     .run(&mut FileSource::new(wal2json.as_bytes(), TransactionBuilder::new()))?;
//! assert_eq!(report.transactions, 1);
//! assert_eq!(report.confirmed, report.last_position); // every sink acked it, then confirmed
//! assert_eq!(std::fs::read_to_string(dir.join("search.ndjson"))?.lines().count(), 1);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod driver;
pub mod engine;
pub mod metrics;
pub mod sink;
pub mod source;
pub mod state;

pub use driver::{Joiners, Pipeline, PipelineError, PipelineReport, StopHandle};
pub use engine::run_sink;
pub use metrics::{
    peak_rss_bytes, CommitLatency, LatencySummary, MetricsHandle, PipelineMetrics, SinkMetrics, SinkReport,
};
pub use sink::{RetryPolicy, Sink};
pub use source::{FileSource, FileSourceError, SinkStart, Source, SourceItem, SourceStart};
pub use state::{InTransaction, OwedBackfill, SinkState, StateError, Uncovered};

/// Any error, boxed: what a [`Sink::Error`] converts into.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[cfg(doc)]
use crate::ndjson::DurableNdjson;
