//! The pipeline as a library: a [`Source`] into a [`lanestream::Stream`] into [`Sink`]s.
//!
//! - [`Source`] ([`source`]): produces transactions ([`SourceItem::Change`]), confirms a
//!   position, serves backfills ([`SourceItem::Snapshot`]). This crate's: [`FileSource`] (a
//!   wal2json capture or pipe) and [`PgLiveSource`] (a pgoutput replication slot).
//! - [`CommitLatency`] ([`metrics`]): each sink's commit → ack latency (p50 / p99 in
//!   [`SinkReport::commit_to_ack`]).
//! - [`Sink`] ([`sink`]): what a user implements: apply a run of lane items, make it durable,
//!   report the checkpoint, optionally re-ask a backfill at start. [`DurableNdjson`] is one,
//!   ready to use; [`RetryPolicy`] says how a failing (or panicking) sink is retried.
//! - [`Pipeline`] ([`driver`]): the ingest loop on the calling thread and one sink engine per
//!   sink on threads of its own, over any stream backend (`MemoryStream` in-process,
//!   `RedisStream` across processes; [`run_sink`] runs one engine alone, for a sink process).
//!
//! # What the driver guarantees
//! - Each [`SourceItem::Change`] is published to every lane with the stream's one fan-out; a
//!   [`SourceItem::Snapshot`] to its sink's lane only (`publish_to`).
//! - The source is confirmed only at the stream's watermark (what every sink made durable and
//!   acked), never past it: after publishing while it moves, while a full lane keeps the ingest
//!   waiting, while the source is idle, and at the end (waiting with
//!   [`Stream::wait_watermark`](lanestream::Stream::wait_watermark), not by sleep-polling).
//! - A backfill request is acked only after its `SnapshotComplete` is published
//!   ([R2](lanestream::contract#r2)); a restarted driver gets the unacked ones again.
//! - A sink engine receives runs through the port ([`LaneConsumer::recv_run`](lanestream::LaneConsumer::recv_run);
//!   several, up to [`Pipeline::max_run`] items), applies and commits them as one, and acks each
//!   run only after the commit ([C1](lanestream::contract#c1)): it acks only what its sink committed; a failed or panicking run is released,
//!   the sink reopened, the lane re-attached and the run redelivered, within the
//!   [`RetryPolicy`]; after it the pipeline stops with [`PipelineError::Sink`] naming the sink.
//!   Never a silent drop.
//! - A [`StopHandle`] (wire it to SIGTERM) stops reading the source, waits until the sinks acked
//!   what was published (bounded), confirms, closes the lanes and joins the engines: `Ok`.
//!
//! ```
//! use std::time::Duration;
//! use lanestream::{MemoryStream, Stream};
//! use lanestream_postgres::ndjson::DurableNdjson;
//! use lanestream_postgres::pipeline::{FileSource, Pipeline};
//! use lanestream_postgres::wal2json::TransactionBuilder;
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
pub mod metrics;
pub mod sink;
pub mod source;

pub use driver::{run_sink, Pipeline, PipelineError, PipelineReport, StopHandle};
pub use metrics::{CommitLatency, LatencySummary, MetricsHandle, PipelineMetrics, SinkMetrics, SinkReport};
pub use sink::{RetryPolicy, Sink};
pub use source::{FileSource, FileSourceError, PgLiveSource, Source, SourceItem};

#[cfg(doc)]
use crate::ndjson::DurableNdjson;
