//! lanestream-postgres: the PostgreSQL side of [`lanestream`].
//!
//! The core crate `lanestream` is the in-process stream port (lanes per sink, acks, the
//! watermark) and knows nothing of any source database. This crate is where PostgreSQL lives:
//!
//! - [`wal2json`]: reads PostgreSQL logical decoding output in wal2json format-version 2 and
//!   builds one [`lanestream::Batch`] per committed transaction, positioned at its commit LSN.
//!
//! The `pipeline` example (`cargo run --release -p lanestream-postgres --example pipeline`) runs
//! the bundled real capture through a [`lanestream::MemoryStream`] into sink threads and checks
//! that every sink received every change.
//!
//! - [`live`]: the live source: a logical replication slot with the wal2json plugin, read by SQL
//!   polling and confirmed only up to the stream's watermark (`pipeline --source postgres://...`).
#![warn(missing_docs)]
#![deny(missing_debug_implementations)]
#![forbid(unsafe_code)]

pub mod live;
pub mod wal2json;
