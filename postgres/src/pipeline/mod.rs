//! The pipeline as a library: a [`Source`] into a [`lanestream::Stream`] into [`Sink`]s.
//!
//! The driver, the sink engine, the sinks' state and the metrics are the core crate's
//! ([`lanestream::pipeline`], re-exported here whole, so `lanestream_postgres::pipeline::X` names
//! the same item; read the guarantees there). This crate adds what is PostgreSQL's:
//! - [`FileSource`] ([`file`](mod@file)): a wal2json or pgoutput capture (or any iterator of batches) as
//!   a [`Source`]; the live replication slot, [`LiveSource`](crate::live::LiveSource), is a
//!   `Source` of its own.
//! - `impl Sink for` [`DurableNdjson`]: the durable NDJSON file sink, ready to use.
//!
//! # Applying changes
//! Every envelope of the live source and the backfill carries its table's shape
//! ([`Envelope::relation`](lanestream::Envelope::relation): schema and name, the columns with
//! their PostgreSQL type OIDs and `typname`s, the key columns in id order), and its document is
//! the row as a JSON object. A sink that applies them by these rules ends **equal to the table**,
//! under `REPLICA IDENTITY DEFAULT` as under `FULL` (P5, P6):
//!
//! 1. **Upsert**: the row at `id` becomes the document, *replacing* what is held (so a dropped or
//!    renamed column's old value goes with the next change of the row) — except the columns named
//!    in [`unchanged`](lanestream::Envelope::unchanged) (a **partial update**: PostgreSQL did
//!    not send TOASTed values the update left unchanged), whose values are kept from the row
//!    held at [`old_id`](lanestream::Envelope::old_id) if set (the update changed the key: the
//!    row moved), else at `id`. If the sink holds no such row (it never saw the table's earlier
//!    rows), those values are unknown: the envelope names them; never write them as NULL.
//!    While a table is being backfilled or owed to a local sink (a new sink, a table that
//!    joined the publication while the pipeline was down or while it runs), the live source
//!    hands its partial updates over whole (it reads their unchanged values from the table),
//!    since the sink may not hold the row yet
//!    ([`LiveMetrics::partial_filled`](crate::live::LiveMetrics::partial_filled)).
//! 2. An upsert with an `old_id` is followed, in the same batch, by a **delete** of `old_id`;
//!    **delete** removes the row at `id`; **truncate** empties the index. A table that
//!    rejoined the publication comes as a truncate too (its rows are then backfilled: a sink
//!    engine hands it over in place of [`Op::Resync`](lanestream::Op::Resync), see
//!    [`crate::live`], *A table that rejoins*).
//! 3. **Shape**: the columns a row has are its relation's. A relation that differs from the last
//!    one of the same [`Relation::id`](lanestream::Relation::id) is DDL, seen at the first change
//!    after it: columns added hold NULL in the rows held (PostgreSQL's `ADD COLUMN` without a
//!    default; a default or a rewrite fills existing rows without streaming them, so backfill the
//!    table after such DDL); a column gone was dropped; a column renamed keeps its place in the
//!    column order (compare the two shapes by position); a retyped column keeps its name and
//!    changes its type OID. A table renamed keeps its `Relation::id`.
//! 4. **Typed keys**: the key's values are the document's values of the relation's
//!    [`key_columns`](lanestream::Relation::key_columns); [`Envelope::id`](lanestream::Envelope::id)
//!    is those values joined ([`crate::batch`], *Ids*), for sinks that key by one string.
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

pub mod file;

pub use file::{FileSource, FileSourceError};
pub use lanestream::pipeline::*;

use lanestream::LaneItem;

use crate::ndjson::{DurableNdjson, NdjsonError};

/// The durable NDJSON file sink: each batch's envelopes as lines, fsynced with the state in its
/// checkpoint at [`commit`](Sink::commit) (see [`crate::ndjson`]). A new instance after a
/// failure is opened with [`DurableNdjson::open`], which cuts the output back to the checkpoint.
impl Sink for DurableNdjson {
    type Error = NdjsonError;

    fn state(&mut self) -> Result<Option<SinkState>, NdjsonError> {
        Ok(DurableNdjson::state(self).cloned())
    }

    fn apply(&mut self, items: &[LaneItem]) -> Result<(), NdjsonError> {
        for item in items {
            self.apply_item(item)?;
        }
        Ok(())
    }

    fn commit(&mut self, state: &SinkState) -> Result<(), NdjsonError> {
        DurableNdjson::commit(self, state)
    }
}
