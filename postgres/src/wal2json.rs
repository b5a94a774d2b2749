//! Reads PostgreSQL logical decoding output in wal2json **format-version 2** and builds one
//! [`Batch`] per committed transaction, through the [batch builder](crate::batch).
//!
//! # Input
//! One JSON object per line, as `pg_recvlogical --start -o format-version=2 -o include-lsn=true
//! -o include-pk=true …` writes it. The `action` field says what the line is:
//!
//! | action | meaning | used fields |
//! |---|---|---|
//! | `B` | begin | `xid` (optional) |
//! | `I` / `U` / `D` | insert / update / delete of one row | `schema`, `table`, `columns` (I, U), `identity` (D; U when the key changed or the table has `REPLICA IDENTITY FULL`), `pk` |
//! | `T` | truncate of one table | `schema`, `table` |
//! | `C` | commit | `lsn` (required: run wal2json with `include-lsn=true`), `xid` (optional) |
//! | `M` | logical message (`pg_logical_emit_message`) | ignored, inside or outside a transaction |
//!
//! Other fields (`timestamp`, `type`, `nextlsn`, …) are accepted and ignored.
//!
//! # Output
//! Each transaction `B … C` becomes one positioned [`Batch`], as the [batch module](crate::batch)
//! says (*Batches*, *Ids*); what is wal2json's own:
//!
//! - **position**: the C line's `lsn`. In format-version 2 that is the *commit LSN* (where the
//!   commit record starts, PostgreSQL's `commit_lsn`; the B line carries the same value, which
//!   positions the envelopes of a large transaction's chunks), while `nextlsn` is the LSN just
//!   past the commit record (`end_lsn`). A replication client that confirms a batch's position
//!   to the server has that transaction re-sent after a restart ([At least once](#at-least-once)).
//! - **changes**: the number of I/U/D/T lines in the transaction.
//! - **documents**: values are copied byte for byte from the line (numerics keep their exact
//!   digits; names too, except a name written with escapes, which is written escaped again). I
//!   and U give `columns`; D gives the `identity` object. An update that leaves a TOASTed value
//!   unchanged does not carry that column (wal2json omits it): under `REPLICA IDENTITY FULL` the
//!   builder takes it from the update's `identity` (the whole old row); see
//!   [Replica identities](#replica-identities).
//! - **ids**: the key is, when nothing given to the builder beats it, the line's `pk`
//!   (`include-pk=true`: the primary key as it was at that change); a line without `pk` takes the
//!   key look-up's primary key. wal2json writes a column's values all as strings or all as JSON
//!   numbers/booleans, by the column's type.
//!
//! # Replica identities
//! What each replica identity gives (wal2json 2.5, format-version 2, checked on PostgreSQL 15):
//!
//! | identity | I | U | D | ids |
//! |---|---|---|---|---|
//! | `DEFAULT` with a primary key | new row | new row, without unchanged TOASTed columns; `identity` (old key) only when the key changed | `identity`: the old key | the primary key |
//! | `USING INDEX` (no primary key; wal2json writes `"pk":[]`) | new row | new row; `identity`: the index columns | `identity`: the index columns | the index columns, **when the reader is told** (rule 1 of the batch module's *Ids*: the live source is); otherwise every column, until the first `identity` narrower than the rows shows the index: then [`BuildErrorKind::UnknownReplicaIdentity`] (the ids before it did not match) and the index columns from then on |
//! | `USING INDEX` on a table that also has a primary key | new row | new row; `identity`: the index columns | `identity`: the index columns | the index columns when told; otherwise the primary key, which the `identity` lacks: [`BuildErrorKind::MissingKeyColumn`] |
//! | `FULL` | new row | new row; `identity`: the whole old row, so columns the update left out (unchanged TOASTed values) are filled in from it | `identity`: the whole old row | the primary key if there is one, else every column (so with no key, adding a column changes every row's id, and two identical rows share one id) |
//! | `NOTHING`, or `DEFAULT` without a primary key | new row | **not emitted** (the server logs `WARNING: no tuple identifier for UPDATE`) | **not emitted** | every column; only inserts reach the sinks, so such tables cannot be mirrored: give them a key or `REPLICA IDENTITY FULL` |
//!
//! An update under `DEFAULT` or `USING INDEX` that leaves a TOASTed value unchanged and changes
//! the key gives a delete of the old id and an upsert of a new document without that column: a
//! merging sink loses the value. Use `REPLICA IDENTITY FULL` on tables whose keys change and
//! which hold TOASTed values.
//!
//! # Partitioned tables
//! wal2json reports a change to a partitioned table under the partition that holds the row
//! (`schema` and `table` are the leaf partition's, e.g. `public.measurements_2024_01`, never the
//! parent `public.measurements`), so each partition is its own index
//! (`public_measurements_2024_01`), keyed by the partition's own replica identity; an update that
//! moves a row to another partition arrives as a delete from the old partition and an insert into
//! the new one. A sink that wants one index per partitioned table maps the partitions' names to
//! it (and a `TRUNCATE` of the parent arrives as one `T` per partition).
//!
//! # At least once
//! A client that confirms a batch's position (the commit LSN) to its replication slot gets that
//! transaction again after a restart: PostgreSQL re-sends every transaction whose commit record
//! starts at or after the slot's `confirmed_flush_lsn`, and the commit LSN is where it starts.
//! That duplicate is the at-least-once redelivery that sinks absorb by remembering the last
//! position they applied (the pipeline example's checkpoints do).
//!
//! # Errors and recovery
//! Each line is read by serde_json into the fields above, values kept as their raw text
//! borrowed from the line (`serde_json::value::RawValue`); a line serde_json refuses is refused
//! with its error, at the byte it names. Nothing here panics on any input, and no line can
//! exhaust the stack (serde_json's recursion limit).
//! Every error is a [`Wal2JsonError`] naming the line number and a [`Wal2JsonErrorKind`]: the
//! reader's own (a line that is not JSON, an unknown action, a line over the length limit, I/O)
//! or the builder's ([`Wal2JsonErrorKind::Build`]). After an error the [`TransactionBuilder`]
//! stays usable, and **a transaction is never published without some of its changes**: a bad
//! line inside a transaction (malformed JSON, unknown action, missing or mistyped field, a key
//! column missing, a line over the reader's length limit) is reported at once, and the
//! transaction is then discarded whole at its `C`
//! ([`BuildErrorKind::DamagedTransaction`], with [`Wal2JsonError::lost_changes`]); a change, `C`
//! or malformed line outside a transaction is dropped; a `B` inside an open transaction discards
//! it; a `C` that cannot position its transaction discards it (the batch module's *Errors and
//! recovery*).
//!
//! So a caller that wants to skip bad lines logs the error, adds up
//! [`lost_changes`](Wal2JsonError::lost_changes) and keeps pushing lines; a caller that wants to
//! stop (the default of the pipeline example) just stops.
//!
//! # Example
//! ```
//! use lanestream::{Op, Position};
//! use lanestream_postgres::wal2json::Wal2JsonReader;
//!
//! let input = br#"{"action":"B","xid":7}
//! {"action":"I","xid":7,"schema":"public","table":"users","columns":[{"name":"id","type":"integer","value":1},{"name":"name","type":"text","value":"Ann"}],"pk":[{"name":"id","type":"integer"}]}
//! {"action":"D","xid":7,"schema":"public","table":"users","identity":[{"name":"id","type":"integer","value":2}],"pk":[{"name":"id","type":"integer"}]}
//! {"action":"C","xid":7,"lsn":"0/16B3748","nextlsn":"0/16B3778"}
//! "#;
//! let batches: Vec<_> = Wal2JsonReader::new(&input[..]).collect::<Result<_, _>>()?;
//! assert_eq!(batches.len(), 1);
//! let batch = &batches[0];
//! assert_eq!(batch.position, Some(Position::from_lsn("0/16B3748")?));
//! assert_eq!(batch.changes, 2);
//! assert_eq!(batch.envelopes[0].index.as_str(), "public_users");
//! assert_eq!(batch.envelopes[0].id, "1");
//! assert_eq!(batch.envelopes[0].document, &br#"{"id":1,"name":"Ann"}"#[..]);
//! assert_eq!(batch.envelopes[1].op, Op::Delete);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`Batch`]: lanestream::Batch
//! [`TransactionBuilder`]: crate::batch::TransactionBuilder
//! [`BuildErrorKind::UnknownReplicaIdentity`]: crate::batch::BuildErrorKind::UnknownReplicaIdentity
//! [`BuildErrorKind::MissingKeyColumn`]: crate::batch::BuildErrorKind::MissingKeyColumn
//! [`BuildErrorKind::DamagedTransaction`]: crate::batch::BuildErrorKind::DamagedTransaction

mod error;
mod line;
mod parse;
mod reader;

pub use error::{Wal2JsonError, Wal2JsonErrorKind};
pub use reader::{Wal2JsonReader, DEFAULT_MAX_LINE_LEN};

#[cfg(test)]
mod tests;
