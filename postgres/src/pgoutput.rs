//! Decodes PostgreSQL's built-in **pgoutput** logical replication messages (protocol version 1)
//! into the same batches as the wal2json reader: both feed the one [`TransactionBuilder`].
//!
//! # Input
//! One message at a time, as the bytes of an `XLogData` payload of `START_REPLICATION ... LOGICAL
//! (proto_version '1', publication_names '...', messages 'true')` (or a row of
//! `pg_logical_slot_peek_binary_changes` with the same options), text-format values (no `binary`
//! option):
//!
//! | tag | message | what the decoder does |
//! |---|---|---|
//! | `B` | Begin (commit LSN, commit time, xid) | opens the transaction |
//! | `R` | Relation (OID, schema, name, replica identity, columns: flags, name, type OID) | remembers (or replaces) the relation's shape: following rows use it |
//! | `Y` | Type (OID, schema, name) | checked, nothing to keep (values of user-defined types are text) |
//! | `I` | Insert (`N` new tuple) | an upsert of the new row |
//! | `U` | Update (optional `K` old key or `O` old row, `N` new tuple) | an upsert; a delete of the old id first when the old key gives another id |
//! | `D` | Delete (`K` old key or `O` old row) | a delete |
//! | `T` | Truncate (relations, options) | a truncate per relation |
//! | `C` | Commit (flags, commit LSN, end LSN, commit time) | the positioned batch |
//! | `O` | Origin (LSN, name) | ignored (changes of every origin are kept) |
//! | `M` | logical Message (`pg_logical_emit_message`) | a backfill mark (prefix [`MARK_PREFIX`]) is kept for the source ([`PgOutputDecoder::take_mark`]); any other message is ignored, inside or outside a transaction (heartbeats) |
//!
//! Messages of later protocol versions (streamed and two-phase transactions: `S`, `E`, `c`, `A`,
//! `b`, `P`, `K`, `r`, `p`) are [`PgOutputErrorKind::UnsupportedMessage`]: ask for protocol
//! version 1 without `streaming`.
//!
//! # Output
//! Exactly what the [wal2json reader](crate::wal2json) builds from the same transactions (the
//! tests check it on captures of one server through both plugins): one [`Batch`] per committed
//! transaction at its commit LSN, chunks of large ones with
//! [`TransactionBuilder::with_max_batch_changes`] (only the last carries the position), index
//! names, ids and their encoding, key changes as the upsert of the new id naming the old one
//! (`old_id`) then the delete of the old id. The differences come from the plugin, not the
//! decoder: pgoutput sends no empty transaction (PostgreSQL 15 skips transactions with nothing
//! published), and only the tables of the publication; and only pgoutput says which columns an
//! update left out unchanged ([`Envelope::unchanged`](lanestream::Envelope::unchanged)) and
//! gives each change its table's shape ([`Envelope::relation`](lanestream::Envelope::relation):
//! the Relation message's columns and type OIDs, type names from PostgreSQL's built-in types and
//! the Type messages).
//!
//! **Documents** are JSON objects of the row, in the relation's column order, each text-format
//! value typed by its column's type OID as wal2json does, by the one value codec the backfill
//! uses too (the [batch module](crate::batch)'s `value.rs`): `int2`, `int4`, `int8`, `oid`,
//! `float4`, `float8` and `numeric` values are JSON numbers, except `NaN`, `Infinity` and
//! `-Infinity`, which JSON has no numbers for: they are the JSON strings `"NaN"`, `"Infinity"`
//! and `"-Infinity"`, so that they stay distinct from SQL NULL (`null`) and from each other, in
//! documents and in ids (a key may hold them; wal2json writes all three as `null`, so its
//! reader refuses such a key: [`BuildErrorKind::NullKey`](crate::batch::BuildErrorKind::NullKey)); `bool` is `true` / `false`; `bytea` is a
//! string of its hex digits without the `\x` (wal2json's form; a server with
//! `bytea_output = escape` gives the escaped text as a string); every other type is a JSON
//! string of its text (`json` and `jsonb` too). SQL NULL is `null`. An update's unchanged
//! TOASTed columns (`u`) are left out of its document, as wal2json leaves them out.
//!
//! **Ids** come from the relation's replica identity as the Relation message gives it (the
//! columns flagged as key): the primary key under `REPLICA IDENTITY DEFAULT`, the index columns
//! under `USING INDEX` (which wal2json does not tell, so there pgoutput needs no catalog
//! look-up), every column when there is no identity. Under `REPLICA IDENTITY FULL` pgoutput
//! flags every column, so the decoder gives the builder no key and the builder takes the
//! primary key from its key look-up, or every column without one — as the wal2json reader
//! does without `pk`. The old key tuple (`K`) carries only the key columns (the rest are sent
//! as NULL and dropped), so a delete's document is the old key, as wal2json's `identity`.
//!
//! # Schema changes
//! PostgreSQL sends a Relation message before the first change of a relation in a session and
//! again before the first change after its definition changed (`ALTER TABLE ... ADD / DROP /
//! RENAME COLUMN`, `ALTER COLUMN ... TYPE`, `REPLICA IDENTITY`, a new primary key, a new table),
//! inside the transaction of that change. The decoder replaces the relation's shape there, so
//! documents and ids take the new shape from the next change on. A change for a relation whose
//! Relation message was not seen is [`PgOutputErrorKind::UnknownRelation`] (a stream that does
//! not start at a session's first message), never a row decoded with a guessed shape; a
//! malformed Relation message forgets every relation for the same reason.
//!
//! # Re-sent transactions
//! PostgreSQL re-sends, after a reconnect, every transaction whose commit LSN is at or after
//! the slot's confirmed position. [`PgOutputDecoder::resume_after`] makes the decoder skip,
//! whole, the transactions at or before a position (those already handed over), so a
//! reconnecting source does not publish them twice within one run.
//!
//! # Errors
//! Every error is a [`PgOutputError`] naming the message (its 1-based number in this decoder)
//! and a [`PgOutputErrorKind`]. A malformed message inside a transaction makes the builder
//! discard that transaction whole at its commit ([`BuildErrorKind::DamagedTransaction`](crate::batch::BuildErrorKind::DamagedTransaction) in
//! [`PgOutputErrorKind::Build`], with [`PgOutputError::lost_changes`]), so a transaction is never
//! published without some of its changes. No input makes the decoder panic (a cargo-fuzz target
//! checks it).
//!
//! # Example
//! ```
//! use lanestream::{Op, Position};
//! use lanestream_postgres::pgoutput::PgOutputDecoder;
//! use lanestream_postgres::batch::TransactionBuilder;
//!
//! let mut d = PgOutputDecoder::new(TransactionBuilder::new());
//! let mut begin = vec![b'B'];
//! begin.extend(0x16B_3748u64.to_be_bytes()); // the commit LSN
//! begin.extend(0i64.to_be_bytes()); // commit time
//! begin.extend(7u32.to_be_bytes()); // xid
//! assert!(d.decode(&begin)?.is_none());
//! // Relation 16384 public.users (REPLICA IDENTITY DEFAULT): id int4 (key), name text.
//! let mut rel = vec![b'R'];
//! rel.extend(16384u32.to_be_bytes());
//! rel.extend(b"public\0users\0d");
//! rel.extend(2u16.to_be_bytes());
//! rel.extend([1u8]); rel.extend(b"id\0"); rel.extend(23u32.to_be_bytes()); rel.extend((-1i32).to_be_bytes());
//! rel.extend([0u8]); rel.extend(b"name\0"); rel.extend(25u32.to_be_bytes()); rel.extend((-1i32).to_be_bytes());
//! assert!(d.decode(&rel)?.is_none());
//! let mut insert = vec![b'I'];
//! insert.extend(16384u32.to_be_bytes());
//! insert.extend(b"N");
//! insert.extend(2u16.to_be_bytes());
//! insert.extend(b"t"); insert.extend(1u32.to_be_bytes()); insert.extend(b"1");
//! insert.extend(b"t"); insert.extend(3u32.to_be_bytes()); insert.extend(b"Ann");
//! assert!(d.decode(&insert)?.is_none());
//! let mut commit = vec![b'C', 0];
//! commit.extend(0x16B_3748u64.to_be_bytes());
//! commit.extend(0x16B_3778u64.to_be_bytes());
//! commit.extend(0i64.to_be_bytes());
//! let batch = d.decode(&commit)?.expect("the transaction's batch");
//! assert_eq!(batch.position, Some(Position::from_lsn("0/16B3748")?));
//! assert_eq!(batch.envelopes[0].index.as_str(), "public_users");
//! assert_eq!(batch.envelopes[0].id, "1");
//! assert_eq!(batch.envelopes[0].op, Op::Upsert);
//! assert_eq!(batch.envelopes[0].document, &br#"{"id":1,"name":"Ann"}"#[..]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`TransactionBuilder`]: crate::batch::TransactionBuilder
//! [`TransactionBuilder::with_max_batch_changes`]: crate::batch::TransactionBuilder::with_max_batch_changes
//! [`MARK_PREFIX`]: crate::mark::MARK_PREFIX
//! [`Batch`]: lanestream::Batch

mod decoder;
mod error;
mod file;
mod tuple;

pub use decoder::PgOutputDecoder;
pub use error::{PgOutputError, PgOutputErrorKind};
pub use file::PgOutputReader;

#[cfg(test)]
mod decoder_tests;
#[cfg(test)]
mod tests;
