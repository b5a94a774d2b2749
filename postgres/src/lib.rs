//! lanestream-postgres: the PostgreSQL side of [`lanestream`].
//!
//! The core crate `lanestream` is the in-process stream port (lanes per sink, acks, the
//! watermark) and knows nothing of any source database. This crate is where PostgreSQL lives:
//!
//! - [`wal2json`]: reads PostgreSQL logical decoding output in wal2json format-version 2 and
//!   builds one [`lanestream::Batch`] per committed transaction (large ones in chunks),
//!   positioned at its commit LSN. Changes to a partitioned table arrive under each partition's
//!   name (see [`wal2json`], *Partitioned tables*).
//! - [`pgoutput`]: decodes PostgreSQL's built-in pgoutput plugin (protocol version 1) into the
//!   same batches, through the same builder as the wal2json reader (the tests check both on
//!   captures of one server).
//! - [`batch`]: the one batch builder both decoders feed ([`batch::TransactionBuilder`]: ids,
//!   documents, keys, chunks, what an error discards), and the one value codec that types the
//!   pgoutput decoder's and the backfill's text values.
//! - [`live`]: the live source: a logical replication slot of the built-in pgoutput plugin,
//!   streamed with `START_REPLICATION` (through the `pgwire-replication` client, on a Tokio
//!   runtime inside this crate) and confirmed by standby status updates only up to the stream's
//!   watermark (or, when every lane has acked everything, up to where the server says it has
//!   sent, so an idle slot follows the server's WAL); it reconnects after a server restart.
//! - [`backfill`]: the live source's backfill from the tables, served while the stream flows
//!   (Netflix DBLog's low and high marks in the WAL, [`mark`]; chunks in key order, resumable by
//!   id).
//! - [`ndjson`]: a durable NDJSON file sink (fsync and an atomic checkpoint before acking, cut
//!   back on restart, chunks of large transactions resumed by offset), one writer per output.
//! - [`pipeline`]: the pipeline as a library, the core's [`lanestream::pipeline`] re-exported
//!   whole: a [`pipeline::Source`] (this crate's capture file source, [`pipeline::FileSource`],
//!   and live source are ones), a [`pipeline::Sink`] a user implements ([`ndjson`]'s is one),
//!   and the driver between them over any [`lanestream::Stream`] backend: it publishes,
//!   confirms the source at the watermark, serves backfill requests, retries failing sinks and
//!   stops cleanly.
//!
//! The `pipeline` example (`cargo run --release -p lanestream-postgres --example pipeline`) runs
//! the bundled real capture through the library into three sinks and checks them against the
//! input. The `lanestream-pipeline` binary (feature `cli`, on by default) is the end-to-end
//! harness: chaos, kill switches, the live source (`--source postgres://...`), the Redis roles.
#![warn(missing_docs)]
#![deny(missing_debug_implementations)]
#![forbid(unsafe_code)]

/// The core crate, re-exported whole: a sink needs one dependency (`lanestream_postgres::lanestream::Envelope`,
/// `lanestream_postgres::lanestream::MemoryStream`...).
pub use lanestream;

pub mod backfill;
pub mod batch;
pub mod live;
pub mod mark;
pub mod ndjson;
pub mod pgoutput;
pub mod pipeline;
pub mod wal2json;
