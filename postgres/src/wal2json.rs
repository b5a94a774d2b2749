//! Reads PostgreSQL logical decoding output in wal2json **format-version 2** and builds one
//! [`Batch`] per committed transaction.
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
//! Each transaction `B … C` becomes one positioned [`Batch`]:
//!
//! - **position**: the C line's `lsn`, parsed with [`Position::from_lsn`]. In format-version 2
//!   that is the *commit LSN* (where the commit record starts, PostgreSQL's `commit_lsn`; the B line
//!   carries the same value), while `nextlsn` is the LSN just past the commit record (`end_lsn`).
//!   Commit LSNs strictly increase in commit order, which is the order wal2json emits
//!   transactions in, so batch positions strictly increase (a regression is refused with
//!   [`Wal2JsonErrorKind::LsnRegressed`]). A replication client that confirms a batch's position
//!   to the server has that transaction re-sent after a restart ([At least once](#at-least-once)).
//! - **changes**: the number of I/U/D/T lines in the transaction.
//! - **envelopes**, one per change, all carrying the batch's position:
//!   - `index`: `schema_table` as an [`IndexName`]. When that is not a valid name it is
//!     normalised: ASCII letters are lower-cased, every other character outside `[a-z0-9_]`
//!     becomes `_`, a leading digit gets a `_` prefix, and the result is cut to
//!     [`MAX_NAME_LEN`](lanestream::MAX_NAME_LEN) bytes (so `"Inventory"."Stock Items"` becomes
//!     `inventory_stock_items`). Distinct tables may collide after normalisation.
//!   - `id`: the row's key values joined with `:` (see [Ids](#ids) for which columns and how
//!     values are written).
//!   - `op`: [`Op::Upsert`] for I and U, [`Op::Delete`] for D, [`Op::Truncate`] for T (empty id
//!     and document).
//!   - `document`: the row as a JSON object `{"column":value,…}` whose values are copied byte for
//!     byte from the input (numerics keep their exact digits; names too, except a name written
//!     with escapes, which is written escaped again). I and U give the new row; D gives
//!     the `identity` object (the old key, or the whole old row under `REPLICA IDENTITY FULL`),
//!     or empty bytes if the line has no identity. An update that leaves a TOASTed value unchanged
//!     does not carry that column (wal2json omits it): under `REPLICA IDENTITY FULL` the reader
//!     takes it from the update's `identity` (the whole old row), so the document is the whole
//!     new row; under any other identity the document lacks it, so sinks should merge updates
//!     into what they hold rather than replace (see [Replica identities](#replica-identities)).
//!
//!   Every document of a transaction is written into one buffer, frozen into a [`Bytes`] at the
//!   commit; each envelope's document is a [`Bytes::slice`] of it, so a transaction costs one
//!   allocation for all its documents and lanes share them without copying.
//! - An **update that changes the key** (its `identity` gives a different id than its new
//!   `columns`) yields two envelopes: a [`Op::Delete`] of the old id (document: the identity)
//!   then an [`Op::Upsert`] of the new id. It still counts as **one** change, so `changes` is
//!   always the number of I/U/D/T lines while `envelopes.len()` may be larger.
//! - An **empty transaction** (`B` then `C`, e.g. a DDL-only transaction) gives a positioned
//!   batch with no envelopes; acking it still moves the watermark.
//! - A **huge transaction**, with [`TransactionBuilder::with_max_batch_changes`]`(Some(n))`: every
//!   `n` changes give an **unpositioned** chunk (`position: None`, `changes` its share), whose
//!   envelopes carry the `B` line's `lsn` (the commit LSN in format-version 2); the `C` gives the
//!   positioned batch with the rest. Only that last batch moves the watermark, so the watermark
//!   never passes a half-delivered transaction, and the builder holds at most `n` changes.
//!   Summed over a transaction's batches, `changes` is its number of I/U/D/T lines. Each batch's
//!   [`Batch::offset`] is the number of envelopes of the transaction in the chunks before it, so a
//!   sink that acked some chunks before a restart resumes at the right envelope
//!   ([I4, C1](lanestream::contract#c1)).
//!
//! # Ids
//! **Which columns.** The key columns of a row are, in this order of preference:
//! 1. the columns given for its table with [`TransactionBuilder::set_key_columns`];
//! 2. the columns of its replica identity index (`REPLICA IDENTITY USING INDEX`) as the
//!    [key lookup](TransactionBuilder::with_key_lookup) returns them
//!    ([`CatalogKey::IdentityIndex`]; the live source ([`crate::live`]) reads the catalog);
//! 3. the line's `pk` (wal2json's `include-pk=true`: the primary key *as it was at that change*,
//!    so keys follow the stream across a renamed key column or a redefined key, whenever the
//!    reader reads that change);
//! 4. the key lookup's primary key ([`CatalogKey::PrimaryKey`]), for lines without a `pk`;
//! 5. every column of the row, in order.
//!
//! The key lookup is asked when a table is first met and again when a line shows its answer
//! stale (a different `pk`, an `identity` other than the looked-up index, a key column missing
//! from the row). A key column holding NULL fails the transaction
//! ([`Wal2JsonErrorKind::NullKey`]: wal2json writes numeric and float `NaN`, `Infinity` and
//! `-Infinity` as `null`, so such rows would share one id); a failed look-up fails it too
//! ([`Wal2JsonErrorKind::KeyLookupFailed`]), never keying rows by every column instead.
//!
//! The new row (`columns`) and the old one (`identity`) are keyed by the same columns, so a row
//! keeps one id across insert, update and delete, and a key change gives a delete of the old id.
//!
//! **How values are written.** A string value is its text with `\` written `\\` and `:` written
//! `\:`; SQL NULL is `\N`; any other value (numbers, booleans) is its JSON text. wal2json writes a
//! column's values all as strings or all as JSON numbers/booleans (by the column's type; `json`
//! and `jsonb` values are strings holding the JSON text), so two different rows never get one id:
//! NULL (`\N`) and the text `'null'` (`null`) differ, and `\N` cannot come from a string, whose
//! `\` would be doubled.
//!
//! # Replica identities
//! What each replica identity gives (wal2json 2.5, format-version 2, checked on PostgreSQL 15):
//!
//! | identity | I | U | D | ids |
//! |---|---|---|---|---|
//! | `DEFAULT` with a primary key | new row | new row, without unchanged TOASTed columns; `identity` (old key) only when the key changed | `identity`: the old key | the primary key |
//! | `USING INDEX` (no primary key; wal2json writes `"pk":[]`) | new row | new row; `identity`: the index columns | `identity`: the index columns | the index columns, **when the reader is told** (rule 1: the live source is); otherwise every column, until the first `identity` narrower than the rows shows the index: then [`Wal2JsonErrorKind::UnknownReplicaIdentity`] (the ids before it did not match) and the index columns from then on |
//! | `USING INDEX` on a table that also has a primary key | new row | new row; `identity`: the index columns | `identity`: the index columns | the index columns when told; otherwise the primary key, which the `identity` lacks: [`Wal2JsonErrorKind::MissingKeyColumn`] |
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
//! Lines are parsed with sonic-rs (SIMD), one pass into the fields above, values kept as their
//! raw text borrowed from the line. A line sonic-rs refuses, or one it must not see (nested
//! deeper than 64 levels, or with a `\` that does not start a valid JSON escape, which sonic-rs
//! does not check in what it skips), is parsed again with serde_json, which reads it or names
//! the error: so the reader accepts and reads exactly what serde_json accepts (tested on the
//! capture, the fuzz corpus and damaged lines). Nothing here panics on any input.
//! Every error is a [`Wal2JsonError`] naming the line number and a [`Wal2JsonErrorKind`]. After
//! an error the [`TransactionBuilder`] stays usable. **A transaction is never published without
//! some of its changes**:
//!
//! - a bad line inside a transaction (malformed JSON, unknown action, missing or mistyped field,
//!   a key column missing, a line over the reader's length limit) is reported at once, and the
//!   transaction is then **discarded whole** at its `C`, which reports
//!   [`Wal2JsonErrorKind::DamagedTransaction`] (with [`Wal2JsonError::lost_changes`] = its
//!   readable changes + its bad lines). A caller that stops at the first error never sees it; a
//!   caller that skips bad lines adds up `lost_changes` and reports them as lost. (With chunks,
//!   the chunks returned before the bad line are out already: the error says how many, and their
//!   envelopes' position tells a sink which pending chunks to drop.)
//! - a change, `C` or malformed line outside a transaction is dropped;
//! - a `B` inside an open transaction (its `C` was lost) discards the open transaction and begins
//!   the new one ([`Wal2JsonErrorKind::BeginInsideTransaction`], its changes lost);
//! - a `C` that cannot position its transaction (missing or invalid `lsn`, LSN not after the
//!   previous commit, `xid` different from its `B`'s) discards the transaction.
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

use std::borrow::Cow;
use std::fmt;
use std::io::{self, BufRead, Read};
use std::ops::Range;
use std::sync::Arc;

use ahash::AHashMap as HashMap;
use bytes::Bytes;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use lanestream::{Batch, Envelope, IndexName, Op, ParseLsnError, Position};

/// An error while reading wal2json input: the 1-based line number and what is wrong.
///
/// ```
/// use lanestream_postgres::wal2json::{TransactionBuilder, Wal2JsonErrorKind};
/// let mut b = TransactionBuilder::new();
/// let err = b.push_line(3, br#"{"action":"I","schema":"s","table":"t","columns":[]}"#).unwrap_err();
/// assert_eq!(err.line(), 3);
/// assert!(matches!(err.kind(), Wal2JsonErrorKind::OutsideTransaction { action: 'I' }));
/// assert_eq!(err.to_string(), "wal2json line 3: I outside a transaction (no B before it)");
/// ```
#[derive(Debug, thiserror::Error)]
#[error("wal2json line {line}: {kind}")]
pub struct Wal2JsonError {
    line: u64,
    /// Boxed: every line's result carries the error type, and a small one is returned in
    /// registers on the way that counts.
    #[source]
    kind: Box<Wal2JsonErrorKind>,
    discarded: u64,
}

impl Wal2JsonError {
    /// Builds an error for `line` (1-based).
    pub fn new(line: u64, kind: Wal2JsonErrorKind) -> Self {
        Wal2JsonError { line, kind: Box::new(kind), discarded: 0 }
    }

    /// How many changes of a transaction this error discarded: the changes read so far, and the
    /// bad lines counted as lost changes, of a transaction that will never be published because
    /// of it ([`Wal2JsonErrorKind::DamagedTransaction`], a bad `C`, a `B` inside a transaction).
    /// 0 for an error that discarded nothing (a bad line inside a transaction reports its loss
    /// at the transaction's `C`). A caller that skips bad lines adds these up as lost changes.
    pub fn lost_changes(&self) -> u64 {
        self.discarded
    }

    /// The 1-based number of the offending line (for an end-of-input error, the number of lines
    /// read).
    pub fn line(&self) -> u64 {
        self.line
    }

    /// What is wrong.
    pub fn kind(&self) -> &Wal2JsonErrorKind {
        &self.kind
    }

    /// Whether this error discarded a transaction of which chunks may already have been returned
    /// ([`Wal2JsonErrorKind::DamagedTransaction`], a bad `C`, a `B` inside a transaction): a caller
    /// tracking a transaction's chunks drops them.
    pub fn open_transaction_discarded(&self) -> bool {
        self.discarded > 0
            || matches!(
                *self.kind,
                Wal2JsonErrorKind::DamagedTransaction { .. }
                    | Wal2JsonErrorKind::BeginInsideTransaction { .. }
                    | Wal2JsonErrorKind::BadLsn(_)
                    | Wal2JsonErrorKind::LsnRegressed { .. }
                    | Wal2JsonErrorKind::XidMismatch { .. }
                    | Wal2JsonErrorKind::Truncated { .. }
            )
    }

    /// The kind and the changes discarded, taken apart (the pgoutput decoder rewraps them).
    pub(crate) fn into_parts(self) -> (Wal2JsonErrorKind, u64) {
        (*self.kind, self.discarded)
    }

    /// Whether reading may go on after this error (everything but I/O errors and failed key
    /// look-ups, after which nothing can be read right). See the module docs for what happens to
    /// the open transaction.
    pub fn is_recoverable(&self) -> bool {
        !matches!(*self.kind, Wal2JsonErrorKind::Io(_) | Wal2JsonErrorKind::KeyLookupFailed { .. })
    }
}

/// What is wrong with a wal2json line (see [`Wal2JsonError`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Wal2JsonErrorKind {
    /// The line is not one well-formed JSON object.
    #[error("malformed JSON at byte {offset}: {reason}")]
    Malformed {
        /// Byte offset in the line where the problem was found.
        offset: usize,
        /// What the parser expected.
        reason: &'static str,
    },
    /// The `action` field is not one of B, I, U, D, T, C, M.
    #[error("unknown action {0:?} (expected one of B, I, U, D, T, C, M)")]
    UnknownAction(String),
    /// A required field is missing.
    #[error("{action} line without {field}{hint}")]
    MissingField {
        /// The line's action (`?` when the action itself is missing).
        action: char,
        /// The missing field.
        field: &'static str,
        /// A hint on how to produce it, or empty.
        hint: &'static str,
    },
    /// A field has the wrong JSON type.
    #[error("field {field} should be {expected}")]
    WrongType {
        /// The field.
        field: &'static str,
        /// What it should be.
        expected: &'static str,
    },
    /// A key column (named by `pk`, or given to the builder) is not among the row's columns.
    #[error("key column {column:?} not in the row's {side} (if the table's replica identity is an index other than its primary key, give the reader its key columns)")]
    MissingKeyColumn {
        /// The primary-key column.
        column: String,
        /// `columns` or `identity`.
        side: &'static str,
    },
    /// A change (I, U, D, T) or a C arrived while no transaction was open.
    #[error("{action} outside a transaction (no B before it)")]
    OutsideTransaction {
        /// The line's action.
        action: char,
    },
    /// A B arrived while a transaction was open: the open one was discarded.
    #[error("B inside the transaction begun at line {begun} (its C is missing); that transaction, with {dropped} changes, was discarded")]
    BeginInsideTransaction {
        /// The line of the discarded transaction's B.
        begun: u64,
        /// How many changes it held.
        dropped: u64,
    },
    /// The C's `lsn` is not a valid LSN; the transaction was discarded.
    #[error("invalid commit LSN: {0}; the transaction was discarded")]
    BadLsn(#[source] ParseLsnError),
    /// The C's `lsn` is not after the previous commit's; the transaction was discarded.
    #[error(
        "commit LSN {lsn} is not after the previous commit LSN {previous}; the transaction was discarded"
    )]
    LsnRegressed {
        /// This commit's LSN.
        lsn: Position,
        /// The previous commit's LSN.
        previous: Position,
    },
    /// The C's `xid` differs from the B's; the transaction was discarded.
    #[error("C has xid {commit} but the transaction began with xid {begin}; the transaction was discarded")]
    XidMismatch {
        /// The B's xid.
        begin: u64,
        /// The C's xid.
        commit: u64,
    },
    /// The input ended inside a transaction (its C never came); it was discarded.
    #[error("input ended inside the transaction begun at line {begun}; it was discarded")]
    Truncated {
        /// The line of its B.
        begun: u64,
    },
    /// The transaction had bad lines (malformed, too long, out of shape): it was discarded whole
    /// at its `C` (a transaction is never published without some of its changes).
    #[error("the transaction begun at line {begun} (commit LSN {lsn}) had {bad_lines} bad lines, the first at line {first_bad}; it was discarded whole with its {changes} readable changes{chunks}",
        chunks = if *chunks > 0 { format!(" ({chunks} chunks of it were already returned unpositioned: drop them)") } else { String::new() })]
    DamagedTransaction {
        /// The line of its `B`.
        begun: u64,
        /// Its commit LSN as the `C` line gave it (may be invalid).
        lsn: String,
        /// The first bad line.
        first_bad: u64,
        /// How many bad lines it had.
        bad_lines: u64,
        /// How many readable changes it had.
        changes: u64,
        /// How many unpositioned chunks of it were already returned (see
        /// [`TransactionBuilder::with_max_batch_changes`]).
        chunks: u64,
    },
    /// A table without a primary key turned out to have an index as its replica identity (its
    /// `identity` holds fewer columns than its rows): the ids of its rows read before used every
    /// column, so they do not match. From now on its key columns are the identity's; to be right
    /// from the first row, give the builder the table's key columns
    /// ([`TransactionBuilder::set_key_columns`], [`TransactionBuilder::with_key_lookup`]).
    #[error("table {table} has no primary key and its replica identity is the index on ({columns}), which the reader was not told: ids of its earlier rows used every column; give the reader its key columns (the live source reads them from the catalog)", columns = columns.join(", "))]
    UnknownReplicaIdentity {
        /// `schema.table`.
        table: String,
        /// The identity's columns, now used as the key.
        columns: Vec<String>,
    },
    /// A key column of a change holds NULL. Key columns are never NULL (a primary key's, and a
    /// replica identity index's, are `NOT NULL`), so this is wal2json writing a value it cannot
    /// print as `null`: numeric and float `NaN`, `Infinity` and `-Infinity` (an upstream bug).
    /// Such rows would all get one id (`\N`), and deleting one would remove the others from a
    /// keyed sink, so the transaction fails instead.
    #[error("table {table}: key column {column:?} is null in the change at LSN {lsn} (key columns are NOT NULL: this is wal2json writing numeric/float NaN, Infinity or -Infinity as null, which would give such rows one id); use another key for the table (REPLICA IDENTITY USING INDEX on columns without such values) or keep these values out of its key")]
    NullKey {
        /// `schema.table`.
        table: String,
        /// The key column.
        column: String,
        /// The change's `lsn` (or, without one, its transaction's commit LSN; `unknown`).
        lsn: String,
    },
    /// The key look-up ([`TransactionBuilder::with_key_lookup`]) failed for a table: its key is
    /// unknown, so no id can be built for its rows (ids from every column would not match the
    /// others). Not recoverable: reading on would lose the transaction.
    #[error("the key look-up of table {table} failed: {error}; no id was built from it (stop, fix the cause, and start again: the transaction comes again)")]
    KeyLookupFailed {
        /// `schema.table`.
        table: String,
        /// Why.
        #[source]
        error: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A line is longer than the reader's limit; it was skipped (and its transaction, if one is
    /// open, will be discarded at its `C`).
    #[error("line longer than {limit} bytes")]
    LineTooLong {
        /// The limit.
        limit: usize,
    },
    /// Reading the input failed; the reader stops.
    #[error("I/O error: {0}")]
    Io(#[source] io::Error),
}

fn malformed(offset: usize, reason: &'static str) -> Wal2JsonErrorKind {
    Wal2JsonErrorKind::Malformed { offset, reason }
}

// ---------------------------------------------------------------------------------------------
// Parsing. First a scanner made for wal2json's lines (`scan`): one pass, building `Line` directly
// and giving up (`None`) on anything it does not know, never deciding an error. A line it gives up
// on goes to the generic fast path, sonic-rs (SIMD): one pass over the line into a derived `Line`, whose
// values stay raw JSON text borrowed from the line, so documents get their exact input bytes
// (numerics keep their digits) and nothing is allocated per value. A line sonic-rs refuses goes
// through serde_json (the slow path, `slow::parse`), which accepts it (then it is read as usual)
// or names the error exactly. Both parsers validate everything they skip; the tests check that
// they agree on every line of the capture, the fuzz corpus, and generated lines.

/// One JSON value's raw text, borrowed from the line. sonic-rs hands over a string value that
/// has escapes as a copy, so that one is owned.
pub(crate) type Raw<'a> = Cow<'a, str>;

/// The fields of one line this module reads, which the wal2json parsers fill from a JSON line;
/// the builder reads a change's fields into a [`Change`], what the pgoutput decoder
/// ([`crate::pgoutput`]) hands over from a binary message, so that both go through the one
/// [`TransactionBuilder`]. `action`, `xid`, `lsn`,
/// `schema` and `table` stay raw JSON and are checked only by the actions that use them (a `B`
/// with `"lsn":5` is fine); `columns`, `identity` and `pk` must have their shape on every line.
/// Every field is `Some` when present, even as `null` (see [`present`]).
#[derive(Deserialize, Debug, Default, PartialEq)]
pub(crate) struct Line<'a> {
    #[serde(borrow, default, deserialize_with = "present_raw")]
    pub(crate) action: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present_raw")]
    pub(crate) xid: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present_raw")]
    pub(crate) lsn: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present_raw")]
    pub(crate) schema: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present_raw")]
    pub(crate) table: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub(crate) columns: Option<Vec<Column<'a>>>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub(crate) identity: Option<Vec<Column<'a>>>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub(crate) pk: Option<Vec<Key<'a>>>,
}

/// One change (`I`, `U`, `D`, `T`) as the builder takes it: read from a wal2json [`Line`], or
/// handed over by the pgoutput decoder ([`TransactionBuilder::push_change`]) from a binary
/// message without a JSON record in between.
#[derive(Clone, Copy)]
pub(crate) struct Change<'r, 'a> {
    /// `I`, `U`, `D` or `T`.
    pub(crate) action: char,
    /// The schema and table names (unescaped).
    pub(crate) schema: &'r str,
    pub(crate) table: &'r str,
    pub(crate) pk: Option<&'r [Key<'a>]>,
    pub(crate) columns: Option<&'r [Column<'a>]>,
    pub(crate) identity: Option<&'r [Column<'a>]>,
    /// The `pk` is the table's replica identity as the stream knew it at this change (pgoutput's
    /// Relation message), so the catalog is not asked: it tells the key as it is now, which may
    /// be later DDL's. Only columns given with [`TransactionBuilder::set_key_columns`] beat it.
    /// Never set for a wal2json line (whose `pk` is the primary key only).
    pub(crate) key_from_stream: bool,
    /// The line's own `lsn` (raw JSON), if any: named in a [`Wal2JsonErrorKind::NullKey`].
    pub(crate) lsn: Option<&'r str>,
}

/// One `{"name":…,"type":…,"value":…}` element of `columns` / `identity`. The name is borrowed
/// only when it needs no JSON escaping (a wal2json name without escapes; a pgoutput name without
/// `"`, `\` or control characters): [`write_row`] writes a borrowed name as it is.
#[derive(Deserialize, Clone, Debug, PartialEq)]
pub(crate) struct Column<'a> {
    #[serde(borrow)]
    pub(crate) name: Cow<'a, str>,
    /// The value as JSON text (`1`, `"text"`, `null`, `true`).
    #[serde(borrow, deserialize_with = "raw")]
    pub(crate) value: Raw<'a>,
}

/// One `{"name":…,"type":…}` element of `pk`.
#[derive(Deserialize, Debug, PartialEq)]
pub(crate) struct Key<'a> {
    #[serde(borrow)]
    pub(crate) name: Cow<'a, str>,
}

/// A field that is present is `Some`, `null` included (a plain `Option` would make it `None`).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A value's raw text (sonic-rs's deserializer only: through its `LazyValue`).
fn raw<'de, D: Deserializer<'de>>(d: D) -> Result<Raw<'de>, D::Error> {
    sonic_rs::LazyValue::deserialize(d).map(|v| v.as_raw_cow())
}

/// [`raw`], `Some` when present (see [`present`]).
fn present_raw<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Raw<'de>>, D::Error> {
    raw(d).map(Some)
}

type ParseResult<T> = Result<T, Wal2JsonErrorKind>;

/// [`parse_line_into`] into a fresh [`Line`].
#[cfg(test)]
fn parse_line(line: &[u8]) -> ParseResult<Line<'_>> {
    let mut parsed = Line::default();
    parse_line_into(line, &mut parsed).map(|()| parsed)
}

/// Parses one line into `out` (which must come in empty): the scanner ([`scan`]), else sonic-rs,
/// or serde_json when sonic-rs refuses it or must not see it (see above). The UTF-8 is checked
/// here first: sonic-rs's `from_slice` hands invalid UTF-8 on unchecked (a debug assertion in
/// 0.5), so it only ever gets a `&str`. The scanner writes the fields in place (a [`Line`] is a
/// few hundred bytes, which moving out through each layer copied); `out` is meaningful only on
/// `Ok`.
fn parse_line_into<'a>(line: &'a [u8], out: &mut Line<'a>) -> ParseResult<()> {
    let text = object_text(line)?;
    if scan::parse_into(text, out) {
        return Ok(());
    }
    if shallow(line) && escapes_valid(line) {
        if let Ok(parsed) = sonic_rs::from_str(text) {
            *out = parsed;
            return Ok(());
        }
    }
    *out = slow::parse(text)?;
    Ok(())
}

/// The line as text, if it is UTF-8 and starts like a JSON object.
fn object_text(line: &[u8]) -> ParseResult<&str> {
    // simdutf8's fast check; std's names where invalid UTF-8 starts.
    let text = simdutf8::basic::from_utf8(line)
        .or_else(|_| std::str::from_utf8(line))
        .map_err(|e| malformed(e.valid_up_to(), "not valid UTF-8"))?;
    // A derived struct also accepts a JSON array (as a tuple): refuse anything but an object.
    let start = text.find(|c| !matches!(c, ' ' | '\t' | '\n' | '\r')).unwrap_or(text.len());
    if !text[start..].starts_with('{') {
        return Err(malformed(start, "expected a JSON object"));
    }
    Ok(text)
}

/// The deepest nesting handed to sonic-rs. Its skipping of a nested value recurses with no
/// limit, so a hostile line of deeply nested arrays would overflow the stack; wal2json's own
/// lines nest 3 deep. Deeper lines take the slow path (serde_json stops at 128 levels).
const MAX_FAST_DEPTH: usize = 64;

/// Whether `line` nests at most [`MAX_FAST_DEPTH`] deep. Counting brackets bounds the depth and
/// costs little (the capture's lines have at most 18); only a line with more is scanned.
fn shallow(line: &[u8]) -> bool {
    // `[` is 0x5B and `{` 0x7B: the only bytes that OR 0x20 makes `{`. Counted in u8 lanes, 255
    // bytes at a time, which the compiler vectorises.
    let brackets: usize = line
        .chunks(255)
        .map(|chunk| usize::from(chunk.iter().fold(0u8, |n, &b| n + u8::from(b | 0x20 == b'{'))))
        .sum();
    brackets <= MAX_FAST_DEPTH || max_depth(line) <= MAX_FAST_DEPTH
}

/// Whether every `\` in `line` starts a valid JSON escape (`\"`, `\\`, `\/`, `\b`, `\f`,
/// `\n`, `\r`, `\t`, `\uXXXX`). sonic-rs does not check the escapes of a string it skips or
/// keeps raw (`"\q"` would reach a document), serde_json does; a line that fails here takes the
/// slow path. Lines without a backslash cost one `memchr` scan.
fn escapes_valid(line: &[u8]) -> bool {
    let mut at = 0;
    while let Some(i) = memchr::memchr(b'\\', &line[at..]) {
        let i = at + i;
        match line.get(i + 1) {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => at = i + 2,
            Some(b'u') => match line.get(i + 2..i + 6) {
                Some(hex) if hex.iter().all(u8::is_ascii_hexdigit) => at = i + 6,
                _ => return false,
            },
            _ => return false,
        }
    }
    true
}

/// The deepest nesting of arrays and objects in `line`, brackets inside strings left out. Up to
/// the first error a parser would report, this is the depth it reaches.
#[cold]
fn max_depth(line: &[u8]) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in line {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

mod scan;

/// The slow path: serde_json, which names the error of a line sonic-rs refused.
mod slow {
    use super::*;

    /// [`Line`] as serde_json reads it (values as `RawValue`s).
    #[derive(Deserialize)]
    pub(super) struct Line<'a> {
        #[serde(borrow, default, deserialize_with = "present")]
        action: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "present")]
        xid: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "present")]
        lsn: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "present")]
        schema: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "present")]
        table: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "present")]
        columns: Option<Vec<Column<'a>>>,
        #[serde(borrow, default, deserialize_with = "present")]
        identity: Option<Vec<Column<'a>>>,
        #[serde(borrow, default, deserialize_with = "present")]
        pk: Option<Vec<Key<'a>>>,
    }

    /// [`Column`](super::Column) as serde_json reads it.
    #[derive(Deserialize)]
    struct Column<'a> {
        #[serde(borrow)]
        name: Cow<'a, str>,
        #[serde(borrow)]
        value: &'a RawValue,
    }

    fn raw(v: &RawValue) -> Raw<'_> {
        Cow::Borrowed(v.get())
    }

    fn columns(c: Option<Vec<Column<'_>>>) -> Option<Vec<super::Column<'_>>> {
        c.map(|c| c.into_iter().map(|c| super::Column { name: c.name, value: raw(c.value) }).collect())
    }

    impl<'a> From<Line<'a>> for super::Line<'a> {
        fn from(l: Line<'a>) -> Self {
            super::Line {
                action: l.action.map(raw),
                xid: l.xid.map(raw),
                lsn: l.lsn.map(raw),
                schema: l.schema.map(raw),
                table: l.table.map(raw),
                columns: columns(l.columns),
                identity: columns(l.identity),
                pk: l.pk,
            }
        }
    }

    /// Parses `text` (a JSON object's text) with serde_json; only errors take the slower path
    /// ([`shape_error`]) that names the field.
    #[cold]
    pub(super) fn parse(text: &str) -> ParseResult<super::Line<'_>> {
        serde_json::from_str::<Line<'_>>(text).map(super::Line::from).map_err(|e| {
            let shape = if e.is_data() { shape_error(text) } else { None };
            shape.unwrap_or_else(|| malformed(byte_offset(text, e.line(), e.column()), reason(&e)))
        })
    }
}

/// The byte offset of serde_json's 1-based line and column.
fn byte_offset(text: &str, line: usize, column: usize) -> usize {
    let line_start: usize = text.split_inclusive('\n').take(line.saturating_sub(1)).map(str::len).sum();
    (line_start + column.saturating_sub(1)).min(text.len())
}

/// serde_json's description of an error, as one of its fixed messages.
fn reason(e: &serde_json::Error) -> &'static str {
    const REASONS: [&str; 21] = [
        "EOF while parsing a list",
        "EOF while parsing an object",
        "EOF while parsing a string",
        "EOF while parsing a value",
        "expected `:`",
        "expected `,` or `]`",
        "expected `,` or `}`",
        "expected ident",
        "expected value",
        "expected `\"`",
        "invalid escape",
        "invalid number",
        "number out of range",
        "invalid unicode code point",
        "control character (\\u0000-\\u001F) found while parsing a string",
        "key must be a string",
        "lone leading surrogate in hex escape",
        "trailing comma",
        "trailing characters",
        "unexpected end of hex escape",
        "recursion limit exceeded",
    ];
    let message = e.to_string();
    if let Some(r) = REASONS.iter().find(|r| message.starts_with(**r)) {
        return r;
    }
    match e.classify() {
        serde_json::error::Category::Eof => "unexpected end of line",
        serde_json::error::Category::Data if message.starts_with("duplicate field") => "duplicate field",
        _ => "invalid JSON",
    }
}

/// `columns`, `identity` and `pk` as raw JSON, to find which one is misshapen.
#[derive(Deserialize)]
struct Shape<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    columns: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    identity: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    pk: Option<&'a RawValue>,
}

/// An element of `columns`, `identity` or `pk` with its members as raw JSON.
#[derive(Deserialize)]
struct ElementShape<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    name: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    value: Option<&'a RawValue>,
}

/// The elements of an array of objects; `None` if `raw` is not one.
fn objects<'a>(raw: &'a RawValue) -> Option<Vec<ElementShape<'a>>> {
    let elements: Vec<&RawValue> = serde_json::from_str(raw.get()).ok()?;
    elements
        .into_iter()
        .map(|e| e.get().starts_with('{').then(|| serde_json::from_str(e.get()).ok()).flatten())
        .collect()
}

/// Why a syntactically valid line did not deserialize into a [`Line`]: the field with the wrong
/// shape, or `None` (e.g. a duplicate key).
#[cold]
fn shape_error(text: &str) -> Option<Wal2JsonErrorKind> {
    let shape: Shape<'_> = serde_json::from_str(text).ok()?;
    let is_str = |v: &RawValue| v.get().starts_with('"');
    for (field, raw) in [("columns", shape.columns), ("identity", shape.identity)] {
        let Some(raw) = raw else { continue };
        let Some(elements) = objects(raw) else {
            return Some(Wal2JsonErrorKind::WrongType { field, expected: "an array of column objects" });
        };
        for e in elements {
            let missing = |what| Wal2JsonErrorKind::MissingField { action: '?', field: what, hint: "" };
            match (e.name, e.value) {
                (None, _) => return Some(missing("a column name")),
                (_, None) => return Some(missing("a column value")),
                (Some(name), _) if !is_str(name) => {
                    return Some(Wal2JsonErrorKind::WrongType {
                        field,
                        expected: "columns with a string name",
                    })
                }
                _ => {}
            }
        }
    }
    let pk = shape.pk?;
    let named = objects(pk).is_some_and(|keys| keys.iter().all(|k| k.name.is_some_and(is_str)));
    (!named)
        .then_some(Wal2JsonErrorKind::WrongType {
            field: "pk", expected: "an array of {\"name\":…} objects"
        })
}

/// The text of a JSON string, unescaped only when it has escapes; `None` if `raw` is not a
/// string or does not unescape (a lone surrogate).
fn json_str(text: &str) -> Option<Cow<'_, str>> {
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    if inner.contains('\\') {
        serde_json::from_str(text).ok().map(Cow::Owned)
    } else {
        Some(Cow::Borrowed(inner))
    }
}

fn string_field<'a>(
    raw: Option<&'a str>,
    action: char,
    field: &'static str,
    hint: &'static str,
) -> ParseResult<Cow<'a, str>> {
    // `let … else` rather than `ok_or`: the error is built (and dropped) only when it is returned,
    // which shows on a per-line path.
    let Some(raw) = raw else { return Err(Wal2JsonErrorKind::MissingField { action, field, hint }) };
    match json_str(raw) {
        Some(s) => Ok(s),
        None => {
            let expected = if raw.starts_with('"') { "a valid string" } else { "a string" };
            Err(Wal2JsonErrorKind::WrongType { field, expected })
        }
    }
}

/// `xid` as a number; `None` when absent or null.
fn xid_field(raw: Option<&str>) -> ParseResult<Option<u64>> {
    match raw {
        None | Some("null") => Ok(None),
        // Only a JSON number of plain digits parses (not "7", 7.0 or -7).
        Some(text) => text
            .parse::<u64>()
            .map(Some)
            .map_err(|_| Wal2JsonErrorKind::WrongType { field: "xid", expected: "an unsigned integer" }),
    }
}

/// Appends one id component (see the module docs, *Ids*): a string value unescaped, with `\` and
/// `:` escaped as `\\` and `\:`; SQL NULL as `\N`; any other value as its JSON text.
fn push_id_part(id: &mut String, text: &str) -> ParseResult<()> {
    if text == "null" {
        id.push_str("\\N");
        return Ok(());
    }
    if !text.starts_with('"') {
        id.push_str(text);
        return Ok(());
    }
    let Some(s) = json_str(text) else {
        return Err(Wal2JsonErrorKind::WrongType { field: "value", expected: "a valid string" });
    };
    let mut rest = s.as_ref();
    while let Some(i) = memchr::memchr2(b'\\', b':', rest.as_bytes()) {
        // `\` and `:` are ASCII: `i` and `i + 1` are character boundaries.
        id.push_str(&rest[..i]);
        id.push('\\');
        id.push_str(&rest[i..=i]);
        rest = &rest[i + 1..];
    }
    id.push_str(rest);
    Ok(())
}

/// Which columns make a row's id.
#[derive(Clone, Copy)]
enum KeyRef<'k, 'a> {
    /// Columns given to the builder (the table's replica identity, from the catalog).
    Named(&'k [String]),
    /// The line's `pk`.
    Pk(&'k [Key<'a>]),
    /// Every column of the row (no key known).
    All,
}

/// The id of a row: its key values (or all its values without a key), joined with `:`. A key
/// column holding NULL is [`Wal2JsonErrorKind::NullKey`] (its table and LSN left empty).
fn row_id(row: &[Column<'_>], key: KeyRef<'_, '_>, side: &'static str) -> ParseResult<String> {
    let mut id = String::new();
    let mut push = |i: usize, value: &str| {
        if i > 0 {
            id.push(':');
        }
        push_id_part(&mut id, value)
    };
    let mut by_name = |i: usize, name: &str| {
        let col = row
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| Wal2JsonErrorKind::MissingKeyColumn { column: name.to_owned(), side })?;
        if col.value == "null" {
            // Filled in by the caller, which knows the table and the LSN.
            return Err(Wal2JsonErrorKind::NullKey {
                table: String::new(),
                column: name.to_owned(),
                lsn: String::new(),
            });
        }
        push(i, &col.value)
    };
    match key {
        KeyRef::Named(names) => {
            for (i, name) in names.iter().enumerate() {
                by_name(i, name)?;
            }
        }
        KeyRef::Pk(pk) => {
            for (i, k) in pk.iter().enumerate() {
                by_name(i, &k.name)?;
            }
        }
        KeyRef::All => {
            for (i, col) in row.iter().enumerate() {
                push(i, &col.value)?;
            }
        }
    }
    Ok(id)
}

/// A snapshot row's id and document, keyed by `key` (the table's key columns, in the order the
/// live stream builds its ids from them), exactly as the builder writes a change's: the one id
/// encoding and the one document writer, for rows read from the table rather than the stream
/// ([`crate::backfill`]). The document is appended to `docs`; its range is returned.
///
/// # Errors
/// [`Wal2JsonErrorKind::MissingKeyColumn`] / [`Wal2JsonErrorKind::NullKey`] (its table and LSN
/// left empty) as for a change.
pub(crate) fn snapshot_row(
    row: &[Column<'_>],
    key: &[String],
    docs: &mut Vec<u8>,
) -> Result<(String, Range<usize>), Wal2JsonErrorKind> {
    let id = row_id(row, KeyRef::Named(key), "columns")?;
    Ok((id, write_row(docs, row)))
}

/// An update's new row with the columns it left out (TOASTed values it did not change) taken
/// from its `identity` when that holds them (`REPLICA IDENTITY FULL`); `None` when nothing is
/// missing.
fn filled_row<'r, 'a>(columns: &'r [Column<'a>], identity: &'r [Column<'a>]) -> Option<Vec<Column<'a>>> {
    let missing = |old: &&Column<'a>| !columns.iter().any(|c| c.name == old.name);
    if !identity.iter().any(|c| missing(&c)) {
        return None;
    }
    // In the identity's (the table's) order, then any new column the identity lacks.
    let mut row: Vec<Column<'a>> = identity
        .iter()
        .map(|old| columns.iter().find(|c| c.name == old.name).unwrap_or(old).clone())
        .collect();
    row.extend(columns.iter().filter(|c| !identity.iter().any(|old| old.name == c.name)).cloned());
    Some(row)
}
/// Writes `{"name":value,…}` into `buf`, returning the range written. Values are the input's
/// bytes; a name is too unless it had escapes (then it is escaped again by serde_json).
fn write_row(buf: &mut Vec<u8>, row: &[Column<'_>]) -> Range<usize> {
    let start = buf.len();
    buf.push(b'{');
    for (i, col) in row.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        match &col.name {
            // Borrowed means no escapes in the input, so this is the input's token.
            Cow::Borrowed(name) => {
                buf.push(b'"');
                buf.extend_from_slice(name.as_bytes());
                buf.push(b'"');
            }
            Cow::Owned(name) => {
                // Writing a string into a Vec cannot fail.
                let _ = serde_json::to_writer(&mut *buf, name);
            }
        }
        buf.push(b':');
        buf.extend_from_slice(col.value.as_bytes());
    }
    buf.push(b'}');
    start..buf.len()
}

/// `schema_table` as an index name, normalised when needed (see the module docs).
pub fn index_name(schema: &str, table: &str) -> IndexName {
    let joined = format!("{schema}_{table}");
    if let Ok(name) = IndexName::new(joined.as_str()) {
        return name;
    }
    let mut out = String::with_capacity(joined.len() + 1);
    if joined.starts_with(|c: char| c.is_ascii_digit()) {
        out.push('_');
    }
    for c in joined.chars() {
        let c = c.to_ascii_lowercase();
        out.push(if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' { c } else { '_' });
    }
    // All ASCII now, so any cut is a char boundary.
    out.truncate(lanestream::MAX_NAME_LEN);
    // `out` is non-empty, starts with [a-z_] and holds only [a-z0-9_]: always valid.
    IndexName::new(out).unwrap_or_else(|_| unreachable_index_name())
}

#[cold]
fn unreachable_index_name() -> IndexName {
    // Never reached (see `index_name`); a fixed valid name rather than a panic.
    IndexName::new("_").unwrap_or_else(|_| unreachable!("\"_\" is a valid index name"))
}

// ---------------------------------------------------------------------------------------------

/// An envelope to add for a change line: id, op, and the row for its document.
type Planned<'r, 'a> = Option<(String, Op, Option<&'r [Column<'a>]>)>;

struct Pending {
    index: IndexName,
    id: String,
    op: Op,
    doc: Range<usize>,
}

struct OpenTxn {
    begun: u64,
    xid: Option<u64>,
    /// The `B` line's `lsn` (in format-version 2, the commit LSN): the position of the envelopes
    /// of the transaction's unpositioned chunks.
    begin_lsn: Option<Position>,
    /// Changes not yet returned in a chunk.
    changes: u64,
    /// All changes read so far.
    total_changes: u64,
    /// Unpositioned chunks returned so far.
    chunks: u64,
    /// Envelopes returned in those chunks: the next batch's [`Batch::offset`].
    offset: u64,
    /// Bad lines inside the transaction; the first one's number.
    bad_lines: u64,
    first_bad: u64,
    pending: Vec<Pending>,
    docs: Vec<u8>,
    /// The commit time, µs since the Unix epoch, when the decoder knows it
    /// ([`TransactionBuilder::set_commit_time`]): recorded on every envelope.
    commit_micros: Option<u64>,
}

impl OpenTxn {
    /// `hint`: the previous batch's envelopes and document bytes, to size the buffers (at most
    /// 1,024 envelopes and 64 KiB).
    fn new(begun: u64, xid: Option<u64>, begin_lsn: Option<Position>, hint: (usize, usize)) -> Self {
        OpenTxn {
            begun,
            xid,
            begin_lsn,
            changes: 0,
            total_changes: 0,
            chunks: 0,
            offset: 0,
            bad_lines: 0,
            first_bad: 0,
            pending: Vec::with_capacity(hint.0.min(1 << 10)),
            docs: Vec::with_capacity(hint.1.min(1 << 16)),
            commit_micros: None,
        }
    }

    /// Changes lost if the transaction is discarded now: its changes and its bad lines.
    fn lost(&self) -> u64 {
        self.total_changes + self.bad_lines
    }

    /// The error of a commit (at `lsn`) of this transaction when it had bad lines.
    fn damaged(&self, lsn: String) -> Wal2JsonErrorKind {
        Wal2JsonErrorKind::DamagedTransaction {
            begun: self.begun,
            lsn,
            first_bad: self.first_bad,
            bad_lines: self.bad_lines,
            changes: self.total_changes,
            chunks: self.chunks,
        }
    }

    /// The envelopes gathered so far, at `position`, as one batch; the transaction goes on empty.
    fn take_envelopes(&mut self, position: Option<Position>) -> Arc<[Envelope]> {
        let mut docs = std::mem::take(&mut self.docs);
        // The batch keeps this allocation while it is in a lane: not much more than it uses (a
        // buffer sized after a larger transaction is cut down).
        if docs.capacity() > 2 * docs.len() + (1 << 12) {
            docs.shrink_to_fit();
        }
        let docs = Bytes::from(docs);
        // Collected straight into the batch's allocation (no intermediate Vec to copy); the
        // pending list keeps its allocation for the next chunk.
        self.pending
            .drain(..)
            .map(|p| Envelope {
                index: p.index,
                id: p.id,
                op: p.op,
                position,
                document: if p.doc.is_empty() || p.doc.end > docs.len() {
                    Bytes::new()
                } else {
                    docs.slice(p.doc)
                },
                built_at_micros: self.commit_micros,
            })
            .collect()
    }
}

/// What the builder knows of one table.
struct Table {
    index: IndexName,
    /// Its key columns when they beat the line's `pk`: given by the caller
    /// ([`TransactionBuilder::set_key_columns`]), the identity index of the key lookup
    /// ([`CatalogKey::IdentityIndex`]), or learned from an identity
    /// ([`Wal2JsonErrorKind::UnknownReplicaIdentity`]).
    key: Option<Arc<[String]>>,
    /// The key lookup's primary key ([`CatalogKey::PrimaryKey`]): used only for lines without
    /// a `pk` (wal2json run without `include-pk`).
    primary: Option<Arc<[String]>>,
    /// Whether `key` came from the key lookup (then it is asked again when the shape changes).
    looked_up: bool,
    /// The column names of its last row (a table without any key: to recognise an index
    /// identity; with a key lookup: to see its shape change).
    columns: Vec<String>,
    /// With a key lookup: the `pk` names of its last line (its shape, with `columns`).
    pk: Vec<String>,
}

/// A table's key as the catalog gives it (see [`TransactionBuilder::with_key_lookup`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CatalogKey {
    /// The primary key's columns, in column order (what wal2json's `pk` gives each change).
    PrimaryKey(Vec<String>),
    /// The columns of the index of `REPLICA IDENTITY USING INDEX`, in column order: the
    /// `identity` of updates and deletes, which wal2json's `pk` does not give.
    IdentityIndex(Vec<String>),
}

/// Looks up a table's key (schema, table) in the catalog: `Ok(None)` for a table without a
/// primary key or identity index, `Err` when the look-up failed (which fails the change's
/// transaction with [`Wal2JsonErrorKind::KeyLookupFailed`]); see
/// [`TransactionBuilder::with_key_lookup`].
pub type KeyLookup =
    Box<dyn FnMut(&str, &str) -> Result<Option<CatalogKey>, Box<dyn std::error::Error + Send + Sync>> + Send>;

/// Turns wal2json format-version 2 lines into batches, one line at a time.
///
/// Push every line with [`push_line`](Self::push_line); a `C` line returns the finished
/// transaction's [`Batch`] (and, with [`with_max_batch_changes`](Self::with_max_batch_changes),
/// a change line may return an unpositioned chunk of a large transaction). At the end of the
/// input call [`finish`](Self::finish) to learn whether a transaction was left open. See the
/// [module docs](self) for the mapping and for how the builder recovers after an error; no input
/// makes it panic.
///
/// ```
/// use lanestream_postgres::wal2json::TransactionBuilder;
/// let mut b = TransactionBuilder::new();
/// assert!(b.push_line(1, br#"{"action":"B"}"#)?.is_none());
/// let batch = b.push_line(2, br#"{"action":"C","lsn":"0/10"}"#)?.expect("a batch");
/// assert_eq!(batch.changes, 0); // an empty transaction still gives a positioned batch
/// assert_eq!(batch.position.map(|p| p.0), Some(0x10));
/// b.finish(2)?;
/// # Ok::<(), lanestream_postgres::wal2json::Wal2JsonError>(())
/// ```
pub struct TransactionBuilder {
    open: Option<OpenTxn>,
    last_commit: Option<Position>,
    tables: HashMap<Vec<u8>, Table>,
    /// Key columns given by the caller, by `schema\0table`.
    keys: HashMap<Vec<u8>, Option<Arc<[String]>>>,
    lookup: Option<KeyLookup>,
    name_key: Vec<u8>,
    transactions: u64,
    max_batch_changes: Option<u64>,
    /// Changes discarded by the error being returned (see [`Wal2JsonError::lost_changes`]).
    discarded: u64,
    /// The last batch's envelopes and document bytes: the next transaction's buffer sizes.
    hint: (usize, usize),
}

impl fmt::Debug for TransactionBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransactionBuilder")
            .field("open_since_line", &self.open.as_ref().map(|t| t.begun))
            .field("last_commit", &self.last_commit)
            .field("transactions", &self.transactions)
            .field("max_batch_changes", &self.max_batch_changes)
            .finish_non_exhaustive()
    }
}

impl Default for TransactionBuilder {
    fn default() -> Self {
        Self::new()
    }
}

/// The table cache is cleared when it grows past this many tables (hostile input).
const MAX_CACHED_NAMES: usize = 4096;

impl TransactionBuilder {
    /// A builder with no open transaction and no previous commit.
    pub fn new() -> Self {
        TransactionBuilder {
            open: None,
            last_commit: None,
            tables: HashMap::new(),
            keys: HashMap::new(),
            lookup: None,
            name_key: Vec::new(),
            transactions: 0,
            max_batch_changes: None,
            discarded: 0,
            hint: (0, 0),
        }
    }

    /// Records `micros` (the open transaction's commit time, µs since the Unix epoch) on the
    /// [`Envelope::built_at_micros`] of every envelope of the transaction, its chunks included:
    /// what the pipeline measures commit → ack latency from. No effect without an open
    /// transaction. (The pgoutput decoder calls it from each Begin; wal2json input has none.)
    pub fn set_commit_time(&mut self, micros: Option<u64>) {
        if let Some(txn) = &mut self.open {
            txn.commit_micros = micros;
        }
    }

    /// Publishes a transaction of more than `max` changes as several batches: every `max`
    /// changes an **unpositioned** chunk ([`Batch::position`] `None`, its envelopes positioned at
    /// the `B` line's `lsn`, which in format-version 2 is the commit LSN), and at the `C` the
    /// positioned batch with the rest. So memory stays bounded by what the lanes hold, and since
    /// only the last batch carries the position, the watermark cannot pass a half-delivered
    /// transaction. `None` (the default) or 0: one batch per transaction.
    pub fn with_max_batch_changes(mut self, max: Option<u64>) -> Self {
        self.max_batch_changes = max.filter(|&m| m > 0);
        self
    }

    /// Sets the key columns of `schema.table`: the columns of its replica identity (a primary
    /// key, or the unique index of `REPLICA IDENTITY USING INDEX`), which make its rows' ids
    /// whatever the line's `pk` says. `None` forgets them. See the module docs, *Ids*.
    pub fn set_key_columns(&mut self, schema: &str, table: &str, columns: Option<Vec<String>>) {
        let key = table_key(schema, table);
        self.tables.remove(&key);
        match columns {
            Some(c) if !c.is_empty() => {
                self.keys.insert(key, Some(Arc::from(c)));
            }
            _ => {
                self.keys.remove(&key);
            }
        }
    }

    /// Asks `lookup(schema, table)` for the key of each table the first time the builder meets
    /// it, and again whenever its shape changes (the column names of its rows, or the line's
    /// `pk`) or a key column is missing from a row (the live source reads the catalog). An
    /// [`CatalogKey::IdentityIndex`] keys the table's rows; a [`CatalogKey::PrimaryKey`] only
    /// lines without a `pk` (the line's `pk` is the key as it was at that change, where the
    /// catalog tells how it is now). A failed look-up fails the change with
    /// [`Wal2JsonErrorKind::KeyLookupFailed`] and is asked again at the next change. Columns
    /// given with [`set_key_columns`](Self::set_key_columns) come first.
    pub fn with_key_lookup(mut self, lookup: KeyLookup) -> Self {
        self.lookup = Some(lookup);
        self
    }

    /// The line number of the open transaction's B, if a transaction is open.
    pub fn open_since(&self) -> Option<u64> {
        self.open.as_ref().map(|t| t.begun)
    }

    /// The position of the last batch returned, if any.
    pub fn last_commit(&self) -> Option<Position> {
        self.last_commit
    }

    /// How many positioned batches (committed transactions) were returned so far.
    pub fn transactions(&self) -> u64 {
        self.transactions
    }

    /// Feeds one line (without its newline; surrounding whitespace is allowed). `line_no` is used
    /// in errors only.
    ///
    /// Returns `Ok(Some(batch))` for a `C` line (the positioned batch of the transaction) and,
    /// with [`with_max_batch_changes`](Self::with_max_batch_changes), for the change line that
    /// fills a chunk (an unpositioned batch); `Ok(None)` for any other accepted line.
    ///
    /// # Errors
    /// A [`Wal2JsonError`] for `line_no` when the line is malformed or out of place; the builder
    /// stays usable (see the [module docs](self): a bad line inside a transaction makes the
    /// whole transaction fail at its `C`).
    pub fn push_line(&mut self, line_no: u64, line: &[u8]) -> Result<Option<Batch>, Wal2JsonError> {
        let mut parsed = Line::default();
        self.record(line_no, |b| parse_line_into(line, &mut parsed).and_then(|()| b.apply(line_no, &parsed)))
    }

    /// Opens a transaction read by the pgoutput decoder (what a `B` line does): `xid`, and
    /// `commit_lsn` (the position of its unpositioned chunks). `seq` numbers the input in errors,
    /// as a line number does.
    pub(crate) fn push_begin(
        &mut self,
        seq: u64,
        xid: Option<u64>,
        commit_lsn: Position,
    ) -> Result<(), Wal2JsonError> {
        self.record(seq, |b| b.begin(seq, xid, Some(commit_lsn).filter(|&p| p != Position::RESERVED)))
    }

    /// Feeds one change read by the pgoutput decoder (what a change line does, see
    /// [`push_begin`](Self::push_begin)).
    pub(crate) fn push_change(
        &mut self,
        seq: u64,
        change: &Change<'_, '_>,
    ) -> Result<Option<Batch>, Wal2JsonError> {
        self.record(seq, |b| b.change(change))
    }

    /// Commits the open transaction at `position`, read by the pgoutput decoder (what a `C` line
    /// does, see [`push_begin`](Self::push_begin)).
    pub(crate) fn push_commit(
        &mut self,
        seq: u64,
        position: Position,
    ) -> Result<Option<Batch>, Wal2JsonError> {
        self.record(seq, |b| {
            let txn = b.open.take().ok_or(Wal2JsonErrorKind::OutsideTransaction { action: 'C' })?;
            b.discarded = txn.lost();
            if txn.bad_lines > 0 {
                return Err(txn.damaged(position.to_string()));
            }
            if position == Position::RESERVED {
                return Err(Wal2JsonErrorKind::BadLsn(ParseLsnError(position.to_string())));
            }
            b.committed(txn, position, Ok(None))
        })
    }

    /// Runs `f`, one input record's work, with its errors handled as [`push_line`](Self::push_line)'s.
    fn record<T>(
        &mut self,
        seq: u64,
        f: impl FnOnce(&mut Self) -> ParseResult<T>,
    ) -> Result<T, Wal2JsonError> {
        self.discarded = 0;
        f(self).map_err(|kind| {
            if !matches!(kind, Wal2JsonErrorKind::BeginInsideTransaction { .. }) {
                self.damage(seq);
            }
            Wal2JsonError { line: seq, kind: Box::new(kind), discarded: std::mem::take(&mut self.discarded) }
        })
    }

    /// Counts line `line_no` as a bad line of the open transaction, if one is open: a line the
    /// caller could not read (over its length limit, say). The transaction will be discarded at
    /// its `C` with [`Wal2JsonErrorKind::DamagedTransaction`].
    pub fn skip_line(&mut self, line_no: u64) {
        self.damage(line_no);
    }

    fn damage(&mut self, line_no: u64) {
        if let Some(t) = self.open.as_mut() {
            if t.bad_lines == 0 {
                t.first_bad = line_no;
                // Nothing of it will be published: free what it holds.
                t.pending = Vec::new();
                t.docs = Vec::new();
            }
            t.bad_lines += 1;
        }
    }

    /// Ends the input at line `line_no`.
    ///
    /// # Errors
    /// [`Wal2JsonErrorKind::Truncated`] when a transaction is still open; it is discarded, and the
    /// builder can be used again. (Its changes never committed in the input, so they count as
    /// no loss.)
    pub fn finish(&mut self, line_no: u64) -> Result<(), Wal2JsonError> {
        match self.open.take() {
            Some(t) => Err(Wal2JsonError::new(line_no, Wal2JsonErrorKind::Truncated { begun: t.begun })),
            None => Ok(()),
        }
    }

    fn apply(&mut self, line_no: u64, f: &Line<'_>) -> ParseResult<Option<Batch>> {
        let action = {
            let s = string_field(f.action.as_deref(), '?', "action", "")?;
            let mut chars = s.chars();
            match (chars.next(), chars.next()) {
                (Some(c @ ('B' | 'I' | 'U' | 'D' | 'T' | 'C' | 'M')), None) => c,
                _ => return Err(Wal2JsonErrorKind::UnknownAction(s.into_owned())),
            }
        };
        match action {
            'M' => Ok(None),
            'B' => {
                let xid = xid_field(f.xid.as_deref())?;
                // Only used to position chunks: an absent or invalid lsn is no error here.
                let begin_lsn = f
                    .lsn
                    .as_deref()
                    .and_then(json_str)
                    .and_then(|l| Position::from_lsn(&l).ok())
                    .filter(|&p| p != Position::RESERVED);
                self.begin(line_no, xid, begin_lsn).map(|()| None)
            }
            'C' => self.commit(f),
            _ => {
                if self.open.is_none() {
                    return Err(Wal2JsonErrorKind::OutsideTransaction { action });
                }
                let schema = string_field(f.schema.as_deref(), action, "schema", "")?;
                let table = string_field(f.table.as_deref(), action, "table", "")?;
                self.change(&Change {
                    action,
                    schema: &schema,
                    table: &table,
                    pk: f.pk.as_deref(),
                    columns: f.columns.as_deref(),
                    identity: f.identity.as_deref(),
                    key_from_stream: false,
                    lsn: f.lsn.as_deref(),
                })
            }
        }
    }

    fn begin(&mut self, line_no: u64, xid: Option<u64>, begin_lsn: Option<Position>) -> ParseResult<()> {
        match self.open.replace(OpenTxn::new(line_no, xid, begin_lsn, self.hint)) {
            Some(old) => {
                self.discarded = old.lost();
                Err(Wal2JsonErrorKind::BeginInsideTransaction { begun: old.begun, dropped: old.lost() })
            }
            None => Ok(()),
        }
    }

    fn change(&mut self, c: &Change<'_, '_>) -> ParseResult<Option<Batch>> {
        let action = c.action;
        if self.open.is_none() {
            return Err(Wal2JsonErrorKind::OutsideTransaction { action });
        }
        let (schema, table) = (c.schema, c.table);
        let (pk, columns, identity) = (c.pk, c.columns, c.identity);
        let row = if action == 'D' { identity } else { columns };
        let (index, known_key, primary) = self.table(schema, table, pk, row, identity, !c.key_from_stream)?;
        // Compute everything that can fail before touching the transaction.
        let filled = match (action, columns, identity) {
            ('U', Some(new), Some(old)) => filled_row(new, old),
            _ => None,
        };
        let columns = filled.as_deref().or(columns);
        let key = match (&known_key, pk) {
            (Some(names), _) => KeyRef::Named(names),
            (None, Some(pk)) if !pk.is_empty() => KeyRef::Pk(pk),
            (None, _) => match &primary {
                Some(names) => KeyRef::Named(names),
                None => {
                    self.learn_identity(schema, table, columns, identity)?;
                    KeyRef::All
                }
            },
        };
        let begin_lsn = self.open.as_ref().and_then(|t| t.begin_lsn);
        let named = |e: Wal2JsonErrorKind| match e {
            Wal2JsonErrorKind::NullKey { column, .. } => Wal2JsonErrorKind::NullKey {
                table: format!("{schema}.{table}"),
                column,
                lsn: c
                    .lsn
                    .and_then(json_str)
                    .map(Cow::into_owned)
                    .or_else(|| begin_lsn.map(|p| p.to_string()))
                    .unwrap_or_else(|| "unknown".to_owned()),
            },
            e => e,
        };
        let row_id = |row: &[Column<'_>], side| row_id(row, key, side).map_err(named);
        let mut out: [Planned<'_, '_>; 2] = [None, None];
        match action {
            'T' => out[0] = Some((String::new(), Op::Truncate, None)),
            'D' => {
                let old = identity.ok_or(Wal2JsonErrorKind::MissingField {
                    action,
                    field: "identity",
                    hint: " (the table needs a primary key or REPLICA IDENTITY FULL)",
                })?;
                out[0] = Some((row_id(old, "identity")?, Op::Delete, Some(old)));
            }
            _ => {
                let new =
                    columns.ok_or(Wal2JsonErrorKind::MissingField { action, field: "columns", hint: "" })?;
                let new_id = row_id(new, "columns")?;
                if let (Some(old), 'U') = (identity, action) {
                    let old_id = row_id(old, "identity")?;
                    if old_id != new_id {
                        out[0] = Some((old_id, Op::Delete, Some(old)));
                    }
                }
                out[1] = Some((new_id, Op::Upsert, Some(new)));
            }
        }
        let max = self.max_batch_changes;
        let Some(txn) = self.open.as_mut() else {
            return Err(Wal2JsonErrorKind::OutsideTransaction { action });
        };
        txn.changes += 1;
        txn.total_changes += 1;
        if txn.bad_lines > 0 {
            return Ok(None); // it will be discarded: keep nothing
        }
        // The index (an `Arc`) moves into the last envelope: one count change less per change.
        let planned = match out {
            [Some(a), Some(b)] => [Some((a, index.clone())), Some((b, index))],
            [a, b] => [a.or(b).map(|p| (p, index)), None],
        };
        for ((id, op, row), index) in planned.into_iter().flatten() {
            let doc = match row {
                Some(row) => write_row(&mut txn.docs, row),
                None => txn.docs.len()..txn.docs.len(),
            };
            txn.pending.push(Pending { index, id, op, doc });
        }
        if max.is_some_and(|m| txn.changes >= m) {
            self.hint = (txn.pending.len(), txn.docs.len());
            let envelopes = txn.take_envelopes(txn.begin_lsn);
            // The next chunk is likely as large as this one (bounded by `max`): its documents'
            // buffer sized so, instead of grown from empty through a copy at each doubling.
            txn.docs = Vec::with_capacity(self.hint.1);
            let changes = std::mem::take(&mut txn.changes);
            txn.chunks += 1;
            let offset = txn.offset;
            txn.offset += envelopes.len() as u64;
            return Ok(Some(Batch { position: None, changes, offset, envelopes }));
        }
        Ok(None)
    }

    /// For a table with no key known: an `identity` with fewer columns than its rows means an
    /// index identity the builder was not told about. Learns it and reports it (once).
    fn learn_identity(
        &mut self,
        schema: &str,
        table: &str,
        columns: Option<&[Column<'_>]>,
        identity: Option<&[Column<'_>]>,
    ) -> ParseResult<()> {
        let Some(t) = self.tables.get_mut(self.name_key.as_slice()) else { return Ok(()) };
        if let Some(columns) = columns {
            if t.columns.len() != columns.len() || t.columns.iter().zip(columns).any(|(a, b)| *a != b.name) {
                t.columns = columns.iter().map(|c| c.name.clone().into_owned()).collect();
            }
        }
        let Some(identity) = identity else { return Ok(()) };
        let narrower = !identity.is_empty()
            && identity.len() < t.columns.len()
            && identity.iter().all(|c| t.columns.iter().any(|n| *n == c.name));
        if !narrower {
            return Ok(());
        }
        let names: Vec<String> = identity.iter().map(|c| c.name.clone().into_owned()).collect();
        t.key = Some(Arc::from(names.clone()));
        Err(Wal2JsonErrorKind::UnknownReplicaIdentity { table: format!("{schema}.{table}"), columns: names })
    }

    fn commit(&mut self, f: &Line<'_>) -> ParseResult<Option<Batch>> {
        let txn = self.open.take().ok_or(Wal2JsonErrorKind::OutsideTransaction { action: 'C' })?;
        // From here on, any error discards the transaction.
        self.discarded = txn.lost();
        if txn.bad_lines > 0 {
            let lsn =
                f.lsn.as_deref().and_then(json_str).map_or_else(|| "unknown".to_owned(), Cow::into_owned);
            return Err(txn.damaged(lsn));
        }
        let lsn = string_field(f.lsn.as_deref(), 'C', "lsn", " (run wal2json with include-lsn=true)")?;
        let position = Position::from_lsn(&lsn).map_err(Wal2JsonErrorKind::BadLsn)?;
        if position == Position::RESERVED {
            return Err(Wal2JsonErrorKind::BadLsn(ParseLsnError(lsn.into_owned())));
        }
        self.committed(txn, position, xid_field(f.xid.as_deref()))
    }

    /// The end of a commit whose transaction (taken out of `self.open`) is undamaged, at a valid
    /// `position`; `xid` is the commit's own xid, checked against the Begin's.
    fn committed(
        &mut self,
        mut txn: OpenTxn,
        position: Position,
        xid: ParseResult<Option<u64>>,
    ) -> ParseResult<Option<Batch>> {
        if let Some(previous) = self.last_commit {
            if position <= previous {
                return Err(Wal2JsonErrorKind::LsnRegressed { lsn: position, previous });
            }
        }
        if let (Some(begin), Some(commit)) = (txn.xid, xid?) {
            if begin != commit {
                return Err(Wal2JsonErrorKind::XidMismatch { begin, commit });
            }
        }
        self.discarded = 0;
        self.hint = (txn.pending.len(), txn.docs.len());
        let envelopes = txn.take_envelopes(Some(position));
        self.last_commit = Some(position);
        self.transactions += 1;
        Ok(Some(Batch { position: Some(position), changes: txn.changes, offset: txn.offset, envelopes }))
    }

    /// The table's index name, its key when that beats the line's `pk` (given, the catalog's
    /// identity index, or learned), and the catalog's primary key; leaves `self.name_key` set to
    /// its key. With a key lookup, asks it the first time the table is met and again when the
    /// line shows the answer stale: its `pk` differs from the last line's, its `identity` is not
    /// the looked-up identity index, or a key column is missing from `row` (the row the id is
    /// built from).
    ///
    /// # Errors
    /// [`Wal2JsonErrorKind::KeyLookupFailed`] (nothing is cached: the next change asks again).
    fn table(
        &mut self,
        schema: &str,
        table: &str,
        pk: Option<&[Key<'_>]>,
        row: Option<&[Column<'_>]>,
        identity: Option<&[Column<'_>]>,
        use_lookup: bool,
    ) -> ParseResult<TableKeys> {
        self.name_key.clear();
        self.name_key.extend_from_slice(schema.as_bytes());
        self.name_key.push(0);
        self.name_key.extend_from_slice(table.as_bytes());
        let pk = pk.unwrap_or(&[]);
        // A table met without the look-up (its key from the stream) that now needs it.
        let want_lookup =
            use_lookup && self.lookup.is_some() && !self.keys.contains_key(self.name_key.as_slice());
        if let Some(t) = self.tables.get(self.name_key.as_slice()) {
            let fresh = if t.looked_up { !use_lookup || !stale(t, pk, row, identity) } else { !want_lookup };
            if fresh {
                // The stream's key: the looked-up identity index is not used.
                let key = if use_lookup || !t.looked_up { t.key.clone() } else { None };
                return Ok((t.index.clone(), key, t.primary.clone()));
            }
        }
        if self.tables.len() >= MAX_CACHED_NAMES {
            self.tables.clear();
        }
        let (key, primary, looked_up) = match self.keys.get(self.name_key.as_slice()) {
            Some(k) => (k.clone(), None, false),
            None if !use_lookup => (None, None, false),
            None => match self.lookup.as_mut() {
                None => (None, None, false),
                Some(lookup) => match lookup(schema, table) {
                    Err(error) => {
                        self.tables.remove(self.name_key.as_slice());
                        return Err(Wal2JsonErrorKind::KeyLookupFailed {
                            table: format!("{schema}.{table}"),
                            error,
                        });
                    }
                    Ok(Some(CatalogKey::IdentityIndex(c))) if !c.is_empty() => {
                        (Some(Arc::from(c)), None, true)
                    }
                    Ok(Some(CatalogKey::PrimaryKey(c))) if !c.is_empty() => (None, Some(Arc::from(c)), true),
                    Ok(_) => (None, None, true),
                },
            },
        };
        let index = index_name(schema, table);
        let columns =
            row.map(|r| r.iter().map(|c| c.name.clone().into_owned()).collect()).unwrap_or_default();
        let pk = pk.iter().map(|k| k.name.clone().into_owned()).collect();
        self.tables.insert(
            self.name_key.clone(),
            Table {
                index: index.clone(),
                key: key.clone(),
                primary: primary.clone(),
                looked_up,
                columns,
                pk,
            },
        );
        Ok((index, key, primary))
    }
}

/// A table's index name, its key when that beats the line's `pk`, and the catalog's primary key.
type TableKeys = (IndexName, Option<Arc<[String]>>, Option<Arc<[String]>>);

/// Whether a line shows the key lookup's answer for table `t` stale (see
/// [`TransactionBuilder::table`]).
fn stale(t: &Table, pk: &[Key<'_>], row: Option<&[Column<'_>]>, identity: Option<&[Column<'_>]>) -> bool {
    if t.pk.len() != pk.len() || t.pk.iter().zip(pk).any(|(a, b)| *a != b.name) {
        return true;
    }
    if let (Some(key), Some(identity)) = (&t.key, identity) {
        if key.len() != identity.len() || key.iter().zip(identity).any(|(a, b)| *a != b.name) {
            return true;
        }
    }
    let names: &[String] = match (&t.key, &t.primary) {
        (Some(k), _) => k,
        (None, _) if !pk.is_empty() => return false, // the line's own pk: nothing looked up
        (None, Some(p)) => p,
        (None, None) => return false,
    };
    row.is_some_and(|row| names.iter().any(|n| !row.iter().any(|c| c.name == n.as_str())))
}

fn table_key(schema: &str, table: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(schema.len() + table.len() + 1);
    key.extend_from_slice(schema.as_bytes());
    key.push(0);
    key.extend_from_slice(table.as_bytes());
    key
}

// ---------------------------------------------------------------------------------------------

/// The default longest line a [`Wal2JsonReader`] accepts: 256 MiB.
pub const DEFAULT_MAX_LINE_LEN: usize = 256 << 20;

/// Reads wal2json format-version 2 from a [`BufRead`], one batch per committed transaction.
///
/// An [`Iterator`] of `Result<Batch, Wal2JsonError>`: each `C` line yields `Ok(batch)` (and each
/// full chunk, with [`TransactionBuilder::with_max_batch_changes`]); a bad line yields `Err` and
/// iteration may go on (the line is skipped and its transaction discarded whole at its `C`, see
/// the [module docs](self));
/// an I/O error yields `Err` and ends the iteration ([`Wal2JsonError::is_recoverable`] is false).
/// At the end of the input, a transaction left open yields one
/// [`Wal2JsonErrorKind::Truncated`] error. Blank lines are skipped (but counted in line
/// numbers); a trailing `\r` is allowed.
///
/// ```
/// use lanestream_postgres::wal2json::{Wal2JsonErrorKind, Wal2JsonReader};
/// let input = "{\"action\":\"B\"}\nnot json\n{\"action\":\"C\",\"lsn\":\"0/A\"}\n\
///              {\"action\":\"B\"}\n{\"action\":\"C\",\"lsn\":\"0/B\"}\n";
/// let mut reader = Wal2JsonReader::new(input.as_bytes());
/// let err = reader.next().unwrap().unwrap_err(); // line 2 is skipped...
/// assert_eq!(err.line(), 2);
/// assert!(matches!(err.kind(), Wal2JsonErrorKind::Malformed { .. }));
/// let err = reader.next().unwrap().unwrap_err(); // ...and its transaction discarded at its C
/// assert!(matches!(err.kind(), Wal2JsonErrorKind::DamagedTransaction { .. }));
/// assert_eq!(err.lost_changes(), 1);
/// let batch = reader.next().unwrap()?; // the next one goes through
/// assert_eq!(batch.position.map(|p| p.0), Some(0xB));
/// assert!(reader.next().is_none());
/// # Ok::<(), lanestream_postgres::wal2json::Wal2JsonError>(())
/// ```
#[derive(Debug)]
pub struct Wal2JsonReader<R> {
    input: R,
    builder: TransactionBuilder,
    line: Vec<u8>,
    line_no: u64,
    max_line_len: usize,
    done: bool,
}

impl<R: BufRead> Wal2JsonReader<R> {
    /// A reader over `input` with a fresh [`TransactionBuilder`].
    pub fn new(input: R) -> Self {
        Wal2JsonReader {
            input,
            builder: TransactionBuilder::new(),
            line: Vec::new(),
            line_no: 0,
            max_line_len: DEFAULT_MAX_LINE_LEN,
            done: false,
        }
    }

    /// Sets the longest line accepted (default [`DEFAULT_MAX_LINE_LEN`]); a longer line is
    /// skipped with [`Wal2JsonErrorKind::LineTooLong`], and its transaction is discarded at its
    /// `C` ([`Wal2JsonErrorKind::DamagedTransaction`]).
    pub fn with_max_line_len(mut self, max: usize) -> Self {
        self.max_line_len = max;
        self
    }

    /// Reads with `builder` (configured with chunking or key columns) instead of a fresh one.
    pub fn with_builder(mut self, builder: TransactionBuilder) -> Self {
        self.builder = builder;
        self
    }

    /// How many lines were read so far (the number of the last line read).
    pub fn lines_read(&self) -> u64 {
        self.line_no
    }

    /// The builder, for its counters ([`TransactionBuilder::transactions`], …).
    pub fn builder(&self) -> &TransactionBuilder {
        &self.builder
    }

    /// Reads the next line into `self.line` (without its `\n`); `Ok(false)` at the end of input.
    /// A line longer than the limit is consumed and reported as `Ok(true)` with `too_long`.
    fn read_line(&mut self, too_long: &mut bool) -> io::Result<bool> {
        self.line.clear();
        // One byte over the limit: room for the `\n`, or proof that the line is too long.
        let limit = u64::try_from(self.max_line_len).unwrap_or(u64::MAX).saturating_add(1);
        if (&mut self.input).take(limit).read_until(b'\n', &mut self.line)? == 0 {
            return Ok(false);
        }
        if self.line.last() == Some(&b'\n') {
            self.line.pop();
            *too_long = false;
            return Ok(true);
        }
        *too_long = self.line.len() > self.max_line_len;
        if *too_long {
            // Skip the rest of the line, a chunk at a time.
            while self.line.last() != Some(&b'\n') {
                self.line.clear();
                if (&mut self.input).take(1 << 16).read_until(b'\n', &mut self.line)? == 0 {
                    break;
                }
            }
            self.line.clear();
        }
        Ok(true)
    }
}

impl<R: BufRead> Iterator for Wal2JsonReader<R> {
    type Item = Result<Batch, Wal2JsonError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            // A line whole in the input's buffer is read there, without copying it out.
            if let Ok(buf) = self.input.fill_buf() {
                if let Some(n) = memchr::memchr(b'\n', buf).filter(|&n| n <= self.max_line_len) {
                    self.line_no += 1;
                    let line = &buf[..n];
                    let pushed = (!line.iter().all(u8::is_ascii_whitespace))
                        .then(|| self.builder.push_line(self.line_no, line));
                    self.input.consume(n + 1);
                    match pushed {
                        Some(Ok(Some(batch))) => return Some(Ok(batch)),
                        Some(Err(e)) => return Some(Err(e)),
                        Some(Ok(None)) | None => continue,
                    }
                }
            }
            let mut too_long = false;
            match self.read_line(&mut too_long) {
                Err(e) => {
                    self.done = true;
                    return Some(Err(Wal2JsonError::new(self.line_no + 1, Wal2JsonErrorKind::Io(e))));
                }
                Ok(false) => {
                    self.done = true;
                    return self.builder.finish(self.line_no).err().map(Err);
                }
                Ok(true) => {}
            }
            self.line_no += 1;
            if too_long {
                self.builder.skip_line(self.line_no);
                let kind = Wal2JsonErrorKind::LineTooLong { limit: self.max_line_len };
                return Some(Err(Wal2JsonError::new(self.line_no, kind)));
            }
            if self.line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match self.builder.push_line(self.line_no, &self.line) {
                Ok(Some(batch)) => return Some(Ok(batch)),
                Ok(None) => {}
                Err(e) => return Some(Err(e)),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy;

    fn push_all(b: &mut TransactionBuilder, lines: &[&str]) -> Vec<Result<Option<Batch>, Wal2JsonError>> {
        lines.iter().enumerate().map(|(i, l)| b.push_line(i as u64 + 1, l.as_bytes())).collect()
    }

    fn one_batch(lines: &[&str]) -> Batch {
        let mut b = TransactionBuilder::new();
        let mut out = None;
        for r in push_all(&mut b, lines) {
            if let Some(batch) = r.expect("line accepted") {
                assert!(out.replace(batch).is_none(), "more than one batch");
            }
        }
        b.finish(lines.len() as u64).expect("no open transaction");
        out.expect("a batch")
    }

    const PK_ID: &str = r#""pk":[{"name":"id","type":"integer"}]"#;

    /// A wal2json insert line of table `s.t` keyed by `id`.
    fn insert_id(id: u32) -> String {
        format!(
            r#"{{"action":"I","schema":"s","table":"t","columns":[{{"name":"id","value":{id}}}],{PK_ID}}}"#
        )
    }

    fn doc(e: &Envelope) -> &str {
        std::str::from_utf8(&e.document).expect("UTF-8 document")
    }

    #[test]
    fn maps_each_action() {
        let i = format!(
            r#"{{"action":"I","xid":9,"lsn":"0/1","schema":"public","table":"users","columns":[{{"name":"id","type":"integer","value":1}},{{"name":"name","type":"text","value":"Zoë \"Z\""}},{{"name":"n","type":"numeric","value":12345678901234567890.123456789}},{{"name":"e","type":"text","value":null}}],{PK_ID}}}"#
        );
        let u = format!(
            r#"{{"action":"U","schema":"public","table":"users","columns":[{{"name":"id","type":"integer","value":1}},{{"name":"name","type":"text","value":"Z"}}],{PK_ID}}}"#
        );
        let d = format!(
            r#"{{"action":"D","schema":"public","table":"users","identity":[{{"name":"id","type":"integer","value":2}}],{PK_ID}}}"#
        );
        let t = r#"{"action":"T","schema":"public","table":"users"}"#;
        let batch = one_batch(&[
            r#"{"action":"B","xid":9,"lsn":"1/2","nextlsn":"1/3"}"#,
            &i,
            r#"{"action":"M","xid":9,"transactional":true,"prefix":"p","content":"c"}"#,
            &u,
            &d,
            t,
            r#"{"action":"C","xid":9,"lsn":"1/2","nextlsn":"1/3"}"#,
        ]);
        let pos = Position((1 << 32) | 2);
        assert_eq!(batch.position, Some(pos));
        assert_eq!(batch.changes, 4);
        let e = &batch.envelopes;
        assert_eq!(e.len(), 4);
        assert!(e.iter().all(|e| e.position == Some(pos) && e.index.as_str() == "public_users"));
        assert_eq!((e[0].op, e[0].id.as_str()), (Op::Upsert, "1"));
        assert_eq!(doc(&e[0]), r#"{"id":1,"name":"Zoë \"Z\"","n":12345678901234567890.123456789,"e":null}"#);
        assert_eq!((e[1].op, e[1].id.as_str(), doc(&e[1])), (Op::Upsert, "1", r#"{"id":1,"name":"Z"}"#));
        assert_eq!((e[2].op, e[2].id.as_str(), doc(&e[2])), (Op::Delete, "2", r#"{"id":2}"#));
        assert_eq!((e[3].op, e[3].id.as_str(), doc(&e[3])), (Op::Truncate, "", ""));
        // All documents of the transaction live in one buffer, back to back.
        let end0 = e[0].document.as_ptr() as usize + e[0].document.len();
        assert_eq!(end0, e[1].document.as_ptr() as usize);
    }

    #[test]
    fn key_change_is_delete_then_upsert_and_one_change() {
        let u = format!(
            r#"{{"action":"U","schema":"public","table":"users","columns":[{{"name":"id","type":"integer","value":7}},{{"name":"v","type":"text","value":"x"}}],"identity":[{{"name":"id","type":"integer","value":3}}],{PK_ID}}}"#
        );
        let batch = one_batch(&[r#"{"action":"B"}"#, &u, r#"{"action":"C","lsn":"0/5"}"#]);
        assert_eq!(batch.changes, 1);
        let e = &batch.envelopes;
        assert_eq!(e.len(), 2);
        assert_eq!((e[0].op, e[0].id.as_str(), doc(&e[0])), (Op::Delete, "3", r#"{"id":3}"#));
        assert_eq!((e[1].op, e[1].id.as_str(), doc(&e[1])), (Op::Upsert, "7", r#"{"id":7,"v":"x"}"#));
    }

    #[test]
    fn update_with_same_key_identity_is_one_upsert() {
        // REPLICA IDENTITY FULL with a primary key: identity is the whole old row, same key.
        let u = format!(
            r#"{{"action":"U","schema":"s","table":"t","columns":[{{"name":"id","type":"integer","value":7}},{{"name":"v","type":"text","value":"new"}}],"identity":[{{"name":"id","type":"integer","value":7}},{{"name":"v","type":"text","value":"old"}}],{PK_ID}}}"#
        );
        let batch = one_batch(&[r#"{"action":"B"}"#, &u, r#"{"action":"C","lsn":"0/5"}"#]);
        assert_eq!(batch.envelopes.len(), 1);
        assert_eq!(batch.envelopes[0].op, Op::Upsert);
    }

    #[test]
    fn composite_keys_and_id_escaping() {
        let i = r#"{"action":"I","schema":"s","table":"t","columns":[{"name":"a","type":"text","value":"x:y\\z"},{"name":"b","type":"integer","value":5},{"name":"c","type":"text","value":"\u00e9"}],"pk":[{"name":"c","type":"text"},{"name":"a","type":"text"},{"name":"b","type":"integer"}]}"#;
        let batch = one_batch(&[r#"{"action":"B"}"#, i, r#"{"action":"C","lsn":"0/5"}"#]);
        assert_eq!(batch.envelopes[0].id, r"é:x\:y\\z:5");
    }

    #[test]
    fn tables_without_a_key_use_every_value() {
        let i = r#"{"action":"I","schema":"public","table":"log","columns":[{"name":"at","type":"text","value":"t1"},{"name":"n","type":"integer","value":null}],"pk":[]}"#;
        let u = r#"{"action":"U","schema":"public","table":"log","columns":[{"name":"at","type":"text","value":"t1"},{"name":"n","type":"integer","value":2}],"identity":[{"name":"at","type":"text","value":"t1"},{"name":"n","type":"integer","value":null}],"pk":[]}"#;
        let d = r#"{"action":"D","schema":"public","table":"log","identity":[{"name":"at","type":"text","value":"t1"},{"name":"n","type":"integer","value":2}],"pk":[]}"#;
        let batch = one_batch(&[r#"{"action":"B"}"#, i, u, d, r#"{"action":"C","lsn":"0/5"}"#]);
        let ids: Vec<_> = batch.envelopes.iter().map(|e| (e.op, e.id.as_str())).collect();
        assert_eq!(
            ids,
            [(Op::Upsert, r"t1:\N"), (Op::Delete, r"t1:\N"), (Op::Upsert, "t1:2"), (Op::Delete, "t1:2")]
        );
        assert_eq!(batch.changes, 3);
    }

    /// Every batch of `lines` (one builder), or the first error.
    fn batches(b: &mut TransactionBuilder, lines: &[&str]) -> Result<Vec<Batch>, Wal2JsonError> {
        let mut out = Vec::new();
        for r in push_all(b, lines) {
            out.extend(r?);
        }
        Ok(out)
    }

    /// (op, id, document) of every envelope.
    fn ops(batches: &[Batch]) -> Vec<(Op, String, String)> {
        batches
            .iter()
            .flat_map(|b| b.envelopes.iter())
            .map(|e| (e.op, e.id.clone(), doc(e).to_owned()))
            .collect()
    }

    fn txn(lsn: &str, lines: &[&str]) -> Vec<String> {
        let mut v = vec![format!(r#"{{"action":"B","lsn":"{lsn}"}}"#)];
        v.extend(lines.iter().map(|l| (*l).to_owned()));
        v.push(format!(r#"{{"action":"C","lsn":"{lsn}"}}"#));
        v
    }

    /// The issue's `accounts` table (no primary key, `REPLICA IDENTITY USING INDEX accounts_email`),
    /// as wal2json 2.5 wrote it: insert, update of the balance, change of the email, delete.
    const ACCOUNTS: [&str; 4] = [
        r#"{"action":"I","schema":"public","table":"accounts","columns":[{"name":"email","type":"text","value":"a@x"},{"name":"name","type":"text","value":"Ann"},{"name":"balance","type":"integer","value":10}],"pk":[]}"#,
        r#"{"action":"U","schema":"public","table":"accounts","columns":[{"name":"email","type":"text","value":"a@x"},{"name":"name","type":"text","value":"Ann"},{"name":"balance","type":"integer","value":20}],"identity":[{"name":"email","type":"text","value":"a@x"}],"pk":[]}"#,
        r#"{"action":"U","schema":"public","table":"accounts","columns":[{"name":"email","type":"text","value":"b@x"},{"name":"name","type":"text","value":"Ann"},{"name":"balance","type":"integer","value":20}],"identity":[{"name":"email","type":"text","value":"a@x"}],"pk":[]}"#,
        r#"{"action":"D","schema":"public","table":"accounts","identity":[{"name":"email","type":"text","value":"b@x"}],"pk":[]}"#,
    ];

    fn accounts_lines() -> Vec<String> {
        let mut lines = Vec::new();
        for (i, l) in ACCOUNTS.iter().enumerate() {
            lines.extend(txn(&format!("0/{}", i + 1), &[l]));
        }
        lines
    }

    #[test]
    fn index_identity_keys_rows_by_the_index_columns_when_told() {
        let lines = accounts_lines();
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        let mut b = TransactionBuilder::new();
        b.set_key_columns("public", "accounts", Some(vec!["email".into()]));
        let got = ops(&batches(&mut b, &lines).expect("no error"));
        let s = |x: &str| x.to_owned();
        assert_eq!(
            got,
            [
                (Op::Upsert, s("a@x"), s(r#"{"email":"a@x","name":"Ann","balance":10}"#)),
                (Op::Upsert, s("a@x"), s(r#"{"email":"a@x","name":"Ann","balance":20}"#)),
                (Op::Delete, s("a@x"), s(r#"{"email":"a@x"}"#)),
                (Op::Upsert, s("b@x"), s(r#"{"email":"b@x","name":"Ann","balance":20}"#)),
                (Op::Delete, s("b@x"), s(r#"{"email":"b@x"}"#)),
            ]
        );
        // The same through a lookup (what the live source does with the catalog), asked once.
        let asked = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = asked.clone();
        let mut b = TransactionBuilder::new().with_key_lookup(Box::new(move |schema, table| {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok((schema == "public" && table == "accounts")
                .then(|| CatalogKey::IdentityIndex(vec!["email".to_owned()])))
        }));
        assert_eq!(ops(&batches(&mut b, &lines).expect("no error")), got);
        assert_eq!(asked.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[test]
    fn index_identity_not_told_fails_loudly_then_uses_the_index() {
        let lines = accounts_lines();
        let mut b = TransactionBuilder::new();
        // The insert can only use every column...
        let first = one_of(b.push_line(1, lines[0].as_bytes()), b.push_line(2, lines[1].as_bytes()));
        assert!(first.is_none());
        let batch = b.push_line(3, lines[2].as_bytes()).unwrap().unwrap();
        assert_eq!(batch.envelopes[0].id, "a@x:Ann:10");
        // ...the first identity shows the index: reported, and its transaction discarded.
        b.push_line(4, lines[3].as_bytes()).unwrap();
        let e = b.push_line(5, lines[4].as_bytes()).unwrap_err();
        assert!(
            matches!(e.kind(), Wal2JsonErrorKind::UnknownReplicaIdentity { table, columns } if table == "public.accounts" && columns == &["email"]),
            "{e}"
        );
        let e = b.push_line(6, lines[5].as_bytes()).unwrap_err();
        assert!(matches!(e.kind(), Wal2JsonErrorKind::DamagedTransaction { .. }), "{e}");
        assert_eq!(e.lost_changes(), 1);
        // From then on the index columns are the key.
        let rest: Vec<&str> = lines[6..].iter().map(String::as_str).collect();
        let got: Vec<_> =
            ops(&batches(&mut b, &rest).unwrap()).into_iter().map(|(op, id, _)| (op, id)).collect();
        assert_eq!(got, [(Op::Delete, "a@x".into()), (Op::Upsert, "b@x".into()), (Op::Delete, "b@x".into())]);
    }

    /// An insert into `public.t` with columns `(name, value)` and `pk` names.
    fn keyed_insert(columns: &[(&str, &str)], pk: &[&str]) -> String {
        let cols: Vec<String> = columns
            .iter()
            .map(|(n, v)| format!(r#"{{"name":"{n}","type":"numeric","value":{v}}}"#))
            .collect();
        let pk: Vec<String> = pk.iter().map(|n| format!(r#"{{"name":"{n}","type":"numeric"}}"#)).collect();
        format!(
            r#"{{"action":"I","schema":"public","table":"t","columns":[{}],"pk":[{}],"lsn":"0/AB"}}"#,
            cols.join(","),
            pk.join(",")
        )
    }

    #[test]
    fn keys_follow_the_pk_each_change_carries_across_key_ddl() {
        // The catalog says (today) the key is `uid`; the stream's changes carry their own `pk`:
        // before a rename (`id`), after it (`uid`), after the key was redefined as (uid, k).
        let asked = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = asked.clone();
        let mut b = TransactionBuilder::new().with_key_lookup(Box::new(move |_, _| {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(Some(CatalogKey::PrimaryKey(vec!["uid".to_owned()])))
        }));
        let lines = [
            txn("0/1", &[&keyed_insert(&[("id", "1"), ("k", "1")], &["id"])]),
            txn("0/2", &[&keyed_insert(&[("uid", "2"), ("k", "1")], &["uid"])]),
            txn("0/3", &[&keyed_insert(&[("uid", "3"), ("k", "1")], &["uid", "k"])]),
            txn("0/4", &[&keyed_insert(&[("uid", "3"), ("k", "2")], &["uid", "k"])]),
        ]
        .concat();
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        let ids: Vec<String> = ops(&batches(&mut b, &lines).expect("keys follow the stream"))
            .into_iter()
            .map(|(_, id, _)| id)
            .collect();
        assert_eq!(ids, ["1", "2", "3:1", "3:2"]);
        // Asked again only when the key the stream carries changed (id → uid → (uid, k)).
        assert_eq!(asked.load(std::sync::atomic::Ordering::Relaxed), 3);
    }

    #[test]
    fn an_identity_index_is_looked_up_again_when_the_rows_no_longer_have_its_columns() {
        // REPLICA IDENTITY USING INDEX on `email`, renamed to `mail` while running.
        let answers = Arc::new(std::sync::Mutex::new(vec!["mail", "email"]));
        let next = answers.clone();
        let mut b = TransactionBuilder::new().with_key_lookup(Box::new(move |_, _| {
            let column = next.lock().expect("lock").pop().expect("asked too often");
            Ok(Some(CatalogKey::IdentityIndex(vec![column.to_owned()])))
        }));
        let insert = |col: &str, v: &str| {
            format!(
                r#"{{"action":"I","schema":"public","table":"t","columns":[{{"name":"{col}","type":"text","value":"{v}"}},{{"name":"n","type":"integer","value":1}}],"pk":[]}}"#
            )
        };
        let lines = [txn("0/1", &[&insert("email", "a")]), txn("0/2", &[&insert("mail", "b")])].concat();
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        let ids: Vec<String> = ops(&batches(&mut b, &lines).expect("looked up again"))
            .into_iter()
            .map(|(_, id, _)| id)
            .collect();
        assert_eq!(ids, ["a", "b"]);
        assert!(answers.lock().expect("lock").is_empty());
    }

    #[test]
    fn a_failed_key_lookup_fails_the_transaction_and_never_keys_by_every_column() {
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let failing = fail.clone();
        let mut b = TransactionBuilder::new().with_key_lookup(Box::new(move |_, _| {
            if failing.load(std::sync::atomic::Ordering::Relaxed) {
                return Err("the side connection was terminated".into());
            }
            Ok(Some(CatalogKey::IdentityIndex(vec!["email".to_owned()])))
        }));
        let lines = accounts_lines();
        b.push_line(1, lines[0].as_bytes()).expect("B");
        let e = b.push_line(2, lines[1].as_bytes()).unwrap_err();
        assert!(
            matches!(e.kind(), Wal2JsonErrorKind::KeyLookupFailed { table, .. } if table == "public.accounts"),
            "{e}"
        );
        assert!(!e.is_recoverable(), "reading on after a failed look-up would lose the transaction");
        assert!(e.to_string().contains("the side connection was terminated"), "{e}");
        // Its transaction is never published...
        let e = b.push_line(3, lines[2].as_bytes()).unwrap_err();
        assert!(matches!(e.kind(), Wal2JsonErrorKind::DamagedTransaction { .. }), "{e}");
        // ...and nothing was cached as "no key": once the look-up works, the index keys the rows.
        fail.store(false, std::sync::atomic::Ordering::Relaxed);
        let rest: Vec<&str> = lines[3..].iter().map(String::as_str).collect();
        let ids: Vec<String> =
            ops(&batches(&mut b, &rest).expect("ok")).into_iter().map(|(_, id, _)| id).collect();
        assert_eq!(ids, ["a@x", "a@x", "b@x", "b@x"]);
    }

    #[test]
    fn a_null_in_a_key_column_fails_the_transaction_naming_table_column_and_lsn() {
        // wal2json writes numeric NaN, Infinity and -Infinity as null: three rows, one id.
        for (pk, key) in [(&["id"][..], None), (&[][..], Some(vec!["id".to_owned()]))] {
            let mut b = TransactionBuilder::new();
            if let Some(key) = key {
                b.set_key_columns("public", "t", Some(key));
            }
            let lines = txn("0/10", &[&keyed_insert(&[("id", "null"), ("v", "1")], pk)]);
            b.push_line(1, lines[0].as_bytes()).expect("B");
            let e = b.push_line(2, lines[1].as_bytes()).unwrap_err();
            assert!(
                matches!(e.kind(), Wal2JsonErrorKind::NullKey { table, column, lsn }
                    if table == "public.t" && column == "id" && lsn == "0/AB"),
                "{e}"
            );
            assert!(e.to_string().contains("NaN"), "{e}");
            let e = b.push_line(3, lines[2].as_bytes()).unwrap_err();
            assert!(matches!(e.kind(), Wal2JsonErrorKind::DamagedTransaction { .. }), "{e}");
        }
        // Without a key, NULL is a value like any other (REPLICA IDENTITY FULL tables).
        let mut b = TransactionBuilder::new();
        let lines = txn("0/10", &[&keyed_insert(&[("id", "null"), ("v", "1")], &[])]);
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        assert_eq!(ops(&batches(&mut b, &lines).expect("ok"))[0].1, "\\N:1");
    }

    fn one_of<T>(a: Result<Option<T>, Wal2JsonError>, b: Result<Option<T>, Wal2JsonError>) -> Option<T> {
        a.unwrap().or(b.unwrap())
    }

    #[test]
    fn index_identity_beside_a_primary_key() {
        // `pki`: primary key id, REPLICA IDENTITY USING INDEX on email: the identity lacks the pk.
        let d = r#"{"action":"D","schema":"public","table":"pki","identity":[{"name":"email","type":"text","value":"e"}],"pk":[{"name":"id","type":"integer"}]}"#;
        let i = r#"{"action":"I","schema":"public","table":"pki","columns":[{"name":"id","type":"integer","value":1},{"name":"email","type":"text","value":"e"},{"name":"b","type":"integer","value":1}],"pk":[{"name":"id","type":"integer"}]}"#;
        let lines = [txn("0/1", &[i]), txn("0/2", &[d])].concat();
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        let e = batches(&mut TransactionBuilder::new(), &lines).unwrap_err();
        assert!(
            matches!(e.kind(), Wal2JsonErrorKind::MissingKeyColumn { column, side: "identity" } if column == "id")
        );
        let mut b = TransactionBuilder::new();
        b.set_key_columns("public", "pki", Some(vec!["email".into()]));
        let got: Vec<_> =
            ops(&batches(&mut b, &lines).unwrap()).into_iter().map(|(op, id, _)| (op, id)).collect();
        assert_eq!(got, [(Op::Upsert, "e".into()), (Op::Delete, "e".into())]);
    }

    #[test]
    fn full_identity_without_a_key_keeps_one_id_and_fills_toasted_columns() {
        // `tf`: no primary key, REPLICA IDENTITY FULL, `big` stored externally; the update of `v`
        // leaves `big` out of its columns (unchanged TOAST) but the identity has the whole old row.
        let i = r#"{"action":"I","schema":"public","table":"tf","columns":[{"name":"k","type":"text","value":"k"},{"name":"big","type":"text","value":"BIG"},{"name":"v","type":"integer","value":1}],"pk":[]}"#;
        let u = r#"{"action":"U","schema":"public","table":"tf","columns":[{"name":"k","type":"text","value":"k"},{"name":"v","type":"integer","value":2}],"identity":[{"name":"k","type":"text","value":"k"},{"name":"big","type":"text","value":"BIG"},{"name":"v","type":"integer","value":1}],"pk":[]}"#;
        let d = r#"{"action":"D","schema":"public","table":"tf","identity":[{"name":"k","type":"text","value":"k"},{"name":"big","type":"text","value":"BIG"},{"name":"v","type":"integer","value":2}],"pk":[]}"#;
        let lines = txn("0/1", &[i, u, d]);
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        let s = |x: &str| x.to_owned();
        assert_eq!(
            ops(&batches(&mut TransactionBuilder::new(), &lines).unwrap()),
            [
                (Op::Upsert, s("k:BIG:1"), s(r#"{"k":"k","big":"BIG","v":1}"#)),
                (Op::Delete, s("k:BIG:1"), s(r#"{"k":"k","big":"BIG","v":1}"#)),
                (Op::Upsert, s("k:BIG:2"), s(r#"{"k":"k","big":"BIG","v":2}"#)),
                (Op::Delete, s("k:BIG:2"), s(r#"{"k":"k","big":"BIG","v":2}"#)),
            ]
        );
        // With a primary key and the default identity, the update's document lacks the column
        // (sinks merge) and its id is the key.
        let u = format!(
            r#"{{"action":"U","schema":"public","table":"t","columns":[{{"name":"id","type":"integer","value":1}},{{"name":"v","type":"integer","value":2}}],{PK_ID}}}"#
        );
        let batch = one_batch(&[r#"{"action":"B"}"#, &u, r#"{"action":"C","lsn":"0/5"}"#]);
        assert_eq!((batch.envelopes[0].id.as_str(), doc(&batch.envelopes[0])), ("1", r#"{"id":1,"v":2}"#));
    }

    #[test]
    fn null_and_the_text_null_get_different_ids() {
        // `f`: no key, REPLICA IDENTITY FULL, rows (NULL, 1) and ('null', 1); then the NULL row's
        // b is set to 2 and the 'null' row is deleted.
        let rows = [
            r#"{"action":"I","schema":"public","table":"f","columns":[{"name":"a","type":"text","value":null},{"name":"b","type":"integer","value":1}],"pk":[]}"#,
            r#"{"action":"I","schema":"public","table":"f","columns":[{"name":"a","type":"text","value":"null"},{"name":"b","type":"integer","value":1}],"pk":[]}"#,
            r#"{"action":"U","schema":"public","table":"f","columns":[{"name":"a","type":"text","value":null},{"name":"b","type":"integer","value":2}],"identity":[{"name":"a","type":"text","value":null},{"name":"b","type":"integer","value":1}],"pk":[]}"#,
            r#"{"action":"D","schema":"public","table":"f","identity":[{"name":"a","type":"text","value":"null"},{"name":"b","type":"integer","value":1}],"pk":[]}"#,
            // Strings that look like the escapes stay apart: the text `\N` and `a:b`.
            r#"{"action":"I","schema":"public","table":"f","columns":[{"name":"a","type":"text","value":"\\N"},{"name":"b","type":"integer","value":null}],"pk":[]}"#,
            r#"{"action":"I","schema":"public","table":"f","columns":[{"name":"a","type":"jsonb","value":"null"},{"name":"b","type":"text","value":"a:b"}],"pk":[]}"#,
        ];
        let lines = txn("0/1", &rows);
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        let got: Vec<_> = ops(&batches(&mut TransactionBuilder::new(), &lines).unwrap())
            .into_iter()
            .map(|(op, id, _)| (op, id))
            .collect();
        let s = |x: &str| x.to_owned();
        assert_eq!(
            got,
            [
                (Op::Upsert, s(r"\N:1")),
                (Op::Upsert, s("null:1")),
                (Op::Delete, s(r"\N:1")),
                (Op::Upsert, s(r"\N:2")),
                (Op::Delete, s("null:1")),
                (Op::Upsert, s(r"\\N:\N")),
                (Op::Upsert, s(r"null:a\:b")),
            ]
        );
    }

    #[test]
    fn a_line_too_long_discards_its_whole_transaction() {
        let i = insert_id;
        let long = format!(
            r#"{{"action":"I","schema":"s","table":"t","columns":[{{"name":"id","value":3}},{{"name":"x","value":"{}"}}],{PK_ID}}}"#,
            "x".repeat(300)
        );
        let input = [
            r#"{"action":"B","lsn":"0/1"}"#.to_owned(),
            i(1),
            long,
            i(2),
            r#"{"action":"C","lsn":"0/1"}"#.to_owned(),
            r#"{"action":"B","lsn":"0/2"}"#.to_owned(),
            i(4),
            r#"{"action":"C","lsn":"0/2"}"#.to_owned(),
        ]
        .join("\n");
        let mut r = Wal2JsonReader::new(input.as_bytes()).with_max_line_len(200);
        let e = r.next().unwrap().unwrap_err();
        assert!(matches!(e.kind(), Wal2JsonErrorKind::LineTooLong { limit: 200 }) && e.line() == 3);
        assert_eq!(e.lost_changes(), 0);
        let e = r.next().unwrap().unwrap_err();
        assert!(
            matches!(
                e.kind(),
                Wal2JsonErrorKind::DamagedTransaction {
                    begun: 1,
                    first_bad: 3,
                    bad_lines: 1,
                    changes: 2,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!((e.line(), e.lost_changes()), (5, 3));
        let batch = r.next().unwrap().unwrap();
        assert_eq!(
            (batch.position, batch.changes, batch.envelopes[0].id.as_str()),
            (Some(Position(2)), 1, "4")
        );
        assert!(r.next().is_none());
    }

    #[test]
    fn huge_transactions_come_in_chunks_and_only_the_last_is_positioned() {
        let i = insert_id;
        let u = format!(
            r#"{{"action":"U","schema":"s","table":"t","columns":[{{"name":"id","value":9}}],"identity":[{{"name":"id","value":5}}],{PK_ID}}}"#
        );
        let mut lines = vec![r#"{"action":"B","xid":3,"lsn":"0/A0"}"#.to_owned()];
        lines.extend((1..=4).map(i));
        lines.push(u);
        lines.push(r#"{"action":"C","xid":3,"lsn":"0/A0"}"#.to_owned());
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        let mut b = TransactionBuilder::new().with_max_batch_changes(Some(2));
        let got = batches(&mut b, &lines).unwrap();
        let shape: Vec<_> = got
            .iter()
            .map(|b| {
                let ids: Vec<_> = b.envelopes.iter().map(|e| (e.op, e.id.as_str(), e.position)).collect();
                (b.position, b.changes, b.offset, ids)
            })
            .collect();
        let p = Some(Position(0xA0));
        // Each batch's offset: the envelopes of the transaction before it (I4).
        assert_eq!(
            shape,
            [
                (None, 2, 0, vec![(Op::Upsert, "1", p), (Op::Upsert, "2", p)]),
                (None, 2, 2, vec![(Op::Upsert, "3", p), (Op::Upsert, "4", p)]),
                (p, 1, 4, vec![(Op::Delete, "5", p), (Op::Upsert, "9", p)]),
            ]
        );
        assert_eq!(b.transactions(), 1);
        // The next transaction starts at offset 0 again.
        let again: Vec<String> = lines.iter().map(|l| l.replace("0/A0", "0/B0")).collect();
        let got = batches(&mut b, &again.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
        assert_eq!(got.iter().map(|b| b.offset).collect::<Vec<_>>(), [0, 2, 4]);
        // A multiple of the chunk size: the C gives an empty positioned batch.
        let mut b = TransactionBuilder::new().with_max_batch_changes(Some(5));
        let got = batches(&mut b, &lines).unwrap();
        assert_eq!(
            got.iter().map(|b| (b.position, b.changes, b.offset)).collect::<Vec<_>>(),
            [(None, 5, 0), (p, 0, 6)]
        );
        // A bad line after a chunk: the C says how many chunks are out.
        let mut damaged = lines.clone();
        damaged.insert(4, "not json");
        let mut b = TransactionBuilder::new().with_max_batch_changes(Some(2));
        let results = push_all(&mut b, &damaged);
        assert!(matches!(&results[2], Ok(Some(chunk)) if chunk.position.is_none()));
        assert!(results[4].is_err());
        let e = results.last().unwrap().as_ref().unwrap_err();
        assert!(
            matches!(
                e.kind(),
                Wal2JsonErrorKind::DamagedTransaction { chunks: 1, changes: 5, bad_lines: 1, .. }
            ),
            "{e}"
        );
        assert_eq!(e.lost_changes(), 6);
    }

    #[test]
    fn index_names_are_normalised() {
        assert_eq!(index_name("public", "users").as_str(), "public_users");
        assert_eq!(index_name("Inventory", "Stock Items").as_str(), "inventory_stock_items");
        assert_eq!(index_name("1s", "t-é").as_str(), "_1s_t__");
        let long = index_name("s", &"x".repeat(100));
        assert_eq!(long.as_str().len(), lanestream::MAX_NAME_LEN);
    }

    #[test]
    fn empty_transactions_and_messages() {
        let mut b = TransactionBuilder::new();
        assert!(b
            .push_line(1, br#"{"action":"M","xid":null,"transactional":false,"prefix":"p","content":"c"}"#)
            .unwrap()
            .is_none());
        assert!(b.push_line(2, br#"  {"action":"B","xid":1}  "#).unwrap().is_none());
        let batch = b.push_line(3, b"{\"action\":\"C\",\"xid\":1,\"lsn\":\"0/10\"}\r").unwrap().unwrap();
        assert_eq!((batch.position, batch.changes, batch.envelopes.len()), (Some(Position(16)), 0, 0));
        assert_eq!(b.transactions(), 1);
    }

    fn kind_of(r: Result<Option<Batch>, Wal2JsonError>) -> Wal2JsonErrorKind {
        *r.expect_err("an error").kind
    }

    /// After each error, a good transaction still goes through.
    fn assert_recovers(b: &mut TransactionBuilder, lsn: &str) {
        if b.open_since().is_some() {
            b.push_line(99, br#"{"action":"C","lsn":"0/0"}"#).ok();
            b.finish(99).ok();
        }
        b.push_line(100, br#"{"action":"B"}"#).expect("B");
        let i = format!(
            r#"{{"action":"I","schema":"s","table":"t","columns":[{{"name":"id","type":"integer","value":1}}],{PK_ID}}}"#
        );
        b.push_line(101, i.as_bytes()).expect("I");
        let c = format!(r#"{{"action":"C","lsn":"{lsn}"}}"#);
        let batch = b.push_line(102, c.as_bytes()).expect("C").expect("batch");
        assert_eq!(batch.changes, 1);
    }

    #[test]
    fn errors_name_the_line_and_the_builder_recovers() {
        use Wal2JsonErrorKind as K;
        let mut b = TransactionBuilder::new();
        let e = b.push_line(7, b"{not json").unwrap_err();
        assert_eq!(e.line(), 7);
        assert!(e.to_string().starts_with("wal2json line 7: malformed JSON at byte 1"), "{e}");
        assert_recovers(&mut b, "0/1");

        assert!(matches!(kind_of(b.push_line(1, br#"{"action":"X"}"#)), K::UnknownAction(a) if a == "X"));
        assert!(matches!(kind_of(b.push_line(1, br#"{"action":"BB"}"#)), K::UnknownAction(_)));
        assert!(matches!(kind_of(b.push_line(1, br#"{"xid":1}"#)), K::MissingField { field: "action", .. }));
        assert!(matches!(kind_of(b.push_line(1, br#"{"action":1}"#)), K::WrongType { field: "action", .. }));
        assert!(matches!(kind_of(b.push_line(1, br#"[1]"#)), K::Malformed { .. }));
        assert!(matches!(kind_of(b.push_line(1, br#"{"action":"B"} x"#)), K::Malformed { .. }));
        assert!(matches!(kind_of(b.push_line(1, b"{\"action\":\"B\xff\"}")), K::Malformed { .. }));
        assert!(matches!(
            kind_of(b.push_line(1, br#"{"action":"I","schema":"s","table":"t","columns":[]}"#)),
            K::OutsideTransaction { action: 'I' }
        ));
        assert!(matches!(
            kind_of(b.push_line(1, br#"{"action":"C","lsn":"0/9"}"#)),
            K::OutsideTransaction { action: 'C' }
        ));
        assert_recovers(&mut b, "0/2");

        // Inside a transaction: each bad line is reported, and the transaction is discarded whole
        // at its C, counting its readable changes and its bad lines as lost.
        b.push_line(1, br#"{"action":"B"}"#).unwrap();
        assert!(matches!(
            kind_of(b.push_line(2, br#"{"action":"I","table":"t","columns":[]}"#)),
            K::MissingField { field: "schema", .. }
        ));
        assert!(matches!(
            kind_of(b.push_line(3, br#"{"action":"D","schema":"s","table":"t"}"#)),
            K::MissingField { field: "identity", .. }
        ));
        assert!(matches!(
            kind_of(b.push_line(4, br#"{"action":"I","schema":"s","table":"t","columns":[{"name":"a","value":1}],"pk":[{"name":"id"}]}"#)),
            K::MissingKeyColumn { column, side: "columns" } if column == "id"
        ));
        assert!(matches!(
            kind_of(b.push_line(5, br#"{"action":"I","schema":"s","table":"t","columns":{}}"#)),
            K::WrongType { field: "columns", .. }
        ));
        assert!(matches!(
            kind_of(b.push_line(6, br#"{"action":"I","schema":"s","table":"t","columns":[{"value":1}]}"#)),
            K::MissingField { .. }
        ));
        let ok = format!(
            r#"{{"action":"I","schema":"s","table":"t","columns":[{{"name":"id","value":1}}],{PK_ID}}}"#
        );
        assert!(b.push_line(7, ok.as_bytes()).unwrap().is_none());
        let e = b.push_line(8, br#"{"action":"C","lsn":"0/3"}"#).unwrap_err();
        assert!(
            matches!(e.kind(), K::DamagedTransaction { begun: 1, first_bad: 2, bad_lines: 5, changes: 1, chunks: 0, lsn } if lsn == "0/3"),
            "{e}"
        );
        assert_eq!(e.lost_changes(), 6);
        assert_eq!(
            e.to_string(),
            "wal2json line 8: the transaction begun at line 1 (commit LSN 0/3) had 5 bad lines, the first at line 2; it was discarded whole with its 1 readable changes"
        );
        assert_eq!((b.open_since(), b.last_commit()), (None, Some(Position(2))));

        // C problems discard the transaction.
        for (c, check) in [
            (
                r#"{"action":"C"}"#,
                &(|k: &K| matches!(k, K::MissingField { field: "lsn", .. })) as &dyn Fn(&K) -> bool,
            ),
            (r#"{"action":"C","lsn":"nope"}"#, &|k: &K| matches!(k, K::BadLsn(_))),
            (r#"{"action":"C","lsn":"FFFFFFFF/FFFFFFFF"}"#, &|k: &K| matches!(k, K::BadLsn(_))),
            (r#"{"action":"C","lsn":"0/2"}"#, &|k: &K| matches!(k, K::LsnRegressed { .. })),
            (r#"{"action":"C","lsn":"0/4","xid":2}"#, &|k: &K| {
                matches!(k, K::XidMismatch { begin: 1, commit: 2 })
            }),
            (r#"{"action":"C","lsn":"0/4","xid":"2"}"#, &|k: &K| {
                matches!(k, K::WrongType { field: "xid", .. })
            }),
        ] {
            b.push_line(10, br#"{"action":"B","xid":1}"#).unwrap();
            let k = kind_of(b.push_line(11, c.as_bytes()));
            assert!(check(&k), "{c}: {k}");
            assert_eq!(b.open_since(), None, "{c}: transaction not discarded");
        }
        assert_recovers(&mut b, "0/4");

        // B inside a transaction: the open one is discarded, the new one begun.
        b.push_line(20, br#"{"action":"B"}"#).unwrap();
        b.push_line(21, ok.as_bytes()).unwrap();
        let e = b.push_line(22, br#"{"action":"B"}"#).unwrap_err();
        assert!(matches!(e.kind(), K::BeginInsideTransaction { begun: 20, dropped: 1 }), "{e}");
        assert_eq!(e.lost_changes(), 1);
        assert_eq!(b.open_since(), Some(22));
        let e = b.finish(23).unwrap_err();
        assert!(matches!(e.kind(), K::Truncated { begun: 22 }));
        assert_eq!(e.lost_changes(), 0);
        assert_eq!(b.open_since(), None);
        assert_recovers(&mut b, "0/5");
    }

    #[test]
    fn fields_are_checked_only_where_used_and_errors_name_them() {
        use Wal2JsonErrorKind as K;
        let mut b = TransactionBuilder::new();
        // B reads only xid; columns, identity and pk must have their shape on every line.
        b.push_line(1, br#"{"action":"B","lsn":5,"schema":null,"table":[]}"#).expect("B");
        let bad = |b: &mut TransactionBuilder, line: &str| kind_of(b.push_line(2, line.as_bytes()));
        assert!(matches!(
            bad(&mut b, r#"{"action":"M","columns":null}"#),
            K::WrongType { field: "columns", .. }
        ));
        assert!(matches!(
            bad(&mut b, r#"{"action":"M","identity":[1]}"#),
            K::WrongType { field: "identity", .. }
        ));
        assert!(matches!(
            bad(&mut b, r#"{"action":"M","pk":[{"name":1}]}"#),
            K::WrongType { field: "pk", .. }
        ));
        assert!(matches!(
            bad(&mut b, r#"{"action":"I","schema":"s","table":"t","columns":[{"name":1,"value":1}]}"#),
            K::WrongType { field: "columns", expected: "columns with a string name" }
        ));
        assert!(matches!(
            bad(&mut b, r#"{"action":"I","schema":"s","table":"t","columns":[{"name":"a"}]}"#),
            K::MissingField { field: "a column value", .. }
        ));
        let e = b.push_line(3, br#"{"action":"M",}"#).unwrap_err();
        assert_eq!(e.to_string(), "wal2json line 3: malformed JSON at byte 14: trailing comma");
        // Those bad lines discard their transaction.
        let e = b.push_line(4, br#"{"action":"C","lsn":"0/1"}"#).unwrap_err();
        assert!(matches!(e.kind(), K::DamagedTransaction { bad_lines: 6, .. }), "{e}");
        // An escaped column name matches its key unescaped and is written escaped by serde_json.
        b.push_line(3, br#"{"action":"B"}"#).expect("B");
        let i = r#"{"action":"I","schema":"s","table":"t","columns":[{"name":"i\u0064","value":1}],"pk":[{"name":"id"}]}"#;
        b.push_line(4, i.as_bytes()).expect("I");
        let batch = b.push_line(5, br#"{"action":"C","lsn":"0/1"}"#).unwrap().unwrap();
        assert_eq!((batch.envelopes[0].id.as_str(), doc(&batch.envelopes[0])), ("1", r#"{"id":1}"#));
    }

    #[test]
    fn reader_counts_lines_skips_blanks_and_limits_length() {
        let input = b"\n{\"action\":\"B\"}\n\n{\"action\":\"C\",\"lsn\":\"0/1\"}\n{\"action\":\"B\"}\n";
        let mut r = Wal2JsonReader::new(&input[..]);
        assert_eq!(r.next().unwrap().unwrap().position, Some(Position(1)));
        let e = r.next().unwrap().unwrap_err();
        assert_eq!((e.line(), e.is_recoverable()), (5, true));
        assert!(matches!(e.kind(), Wal2JsonErrorKind::Truncated { begun: 5 }));
        assert!(r.next().is_none());

        let long = format!("{{\"action\":\"M\",\"content\":\"{}\"}}\n{{\"action\":\"B\"}}\n{{\"action\":\"C\",\"lsn\":\"0/1\"}}", "x".repeat(100));
        let mut r =
            Wal2JsonReader::new(std::io::BufReader::with_capacity(8, long.as_bytes())).with_max_line_len(50);
        let e = r.next().unwrap().unwrap_err();
        assert!(matches!(e.kind(), Wal2JsonErrorKind::LineTooLong { limit: 50 }) && e.line() == 1);
        assert_eq!(r.next().unwrap().unwrap().position, Some(Position(1))); // no final newline
        assert!(r.next().is_none());
        assert_eq!(r.lines_read(), 3);
    }

    #[test]
    fn io_errors_end_the_iteration() {
        struct Broken;
        impl std::io::Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::Error::other("boom"))
            }
        }
        let mut r = Wal2JsonReader::new(std::io::BufReader::new(Broken));
        let e = r.next().unwrap().unwrap_err();
        assert!(!e.is_recoverable() && e.to_string().contains("boom"));
        assert!(r.next().is_none());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Arbitrary lines never panic the builder, and it keeps working afterwards.
        #[test]
        fn arbitrary_lines_never_panic(lines in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::collection::vec(proptest::num::u8::ANY, 0..40),
                r#"\{"action":"[BIUDTCMX]"(,"(lsn|xid|schema|table|columns|identity|pk)":("0/[0-9A-F]{1,3}"|[0-9]{1,3}|"s"|\[\{"name":"id","value":[0-9]\}\]|\[\]|null))*\}"#
                    .prop_map(String::into_bytes),
            ], 0..20)) {
            let mut b = TransactionBuilder::new();
            for (n, l) in lines.iter().enumerate() {
                let _ = b.push_line(n as u64 + 1, l);
            }
            let _ = b.finish(lines.len() as u64);
            let last = b.last_commit().map_or(0, |p| p.0);
            let begin = b.push_line(1000, br#"{"action":"B"}"#);
            proptest::prop_assert!(begin.is_ok());
            let c = format!(r#"{{"action":"C","lsn":"{}"}}"#, Position(last + 1));
            let commit = b.push_line(1001, c.as_bytes());
            proptest::prop_assert!(matches!(commit, Ok(Some(_))));
        }
    }

    /// Counts of the bundled capture, checked independently with serde_json.
    #[test]
    fn bundled_capture_parses_completely() {
        use std::io::BufReader;
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/wal2json-sample.jsonl.gz");
        let file = std::fs::File::open(path).expect("data/wal2json-sample.jsonl.gz");
        let text = {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(file), &mut s).expect("gunzip");
            s
        };
        // Expected: per transaction, the commit LSN and the number of I/U/D/T lines.
        let mut expected = Vec::new();
        let mut count = 0u64;
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).expect("capture line is JSON");
            match v["action"].as_str().expect("action") {
                "B" => count = 0,
                "I" | "U" | "D" | "T" => count += 1,
                "C" => expected.push((Position::from_lsn(v["lsn"].as_str().expect("lsn")).unwrap(), count)),
                _ => {}
            }
        }
        let batches: Vec<Batch> = Wal2JsonReader::new(BufReader::new(text.as_bytes()))
            .collect::<Result<_, _>>()
            .expect("every line of the capture parses");
        let got: Vec<_> = batches.iter().map(|b| (b.position.unwrap(), b.changes)).collect();
        assert_eq!(got, expected);
        assert!(batches.windows(2).all(|w| w[0].position < w[1].position), "positions strictly increase");
        assert!(batches.iter().any(|b| b.changes == 0), "an empty transaction");
        assert!(batches.iter().any(|b| b.changes > 10_000), "a large transaction");
        assert!(batches.iter().any(|b| b.envelopes.len() as u64 > b.changes), "a key change");
        let mut indexes = std::collections::BTreeSet::new();
        for e in batches.iter().flat_map(|b| b.envelopes.iter()) {
            indexes.insert(e.index.as_str());
            match e.op {
                Op::Truncate => assert!(e.id.is_empty() && e.document.is_empty()),
                _ => {
                    let doc: serde_json::Value =
                        serde_json::from_slice(&e.document).expect("document is JSON");
                    assert!(doc.is_object() && !e.id.is_empty());
                }
            }
        }
        for name in ["public_customers", "public_audit_log", "inventory_stock_items", "public_order_lines"] {
            assert!(indexes.contains(name), "{name} missing from {indexes:?}");
        }
        assert!(
            batches.iter().flat_map(|b| b.envelopes.iter()).any(|e| e.document.len() > 2048),
            "the TOASTed document"
        );
    }

    /// The reader's parse (sonic-rs, serde_json for the lines it refuses or must not see) gives
    /// exactly what serde_json alone gives: the same fields, or the same error. So sonic-rs never
    /// lets through bytes that serde_json refuses (they would end up in documents).
    fn parsers_agree(text: &str) -> Result<(), String> {
        let got = format!("{:?}", parse_line(text.as_bytes()));
        let want = format!("{:?}", object_text(text.as_bytes()).and_then(slow::parse));
        if got == want {
            Ok(())
        } else {
            Err(format!("{text:?}: read {got}, serde_json alone {want}"))
        }
    }

    #[test]
    fn fast_path_reads_every_line_as_serde_json_does() {
        let mut lines: Vec<String> = Vec::new();
        // The bundled capture.
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/wal2json-sample.jsonl.gz");
        let file = std::fs::File::open(path).expect("data/wal2json-sample.jsonl.gz");
        let mut text = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(file), &mut text).expect("gunzip");
        let capture: Vec<&str> = text.lines().collect();
        lines.extend(capture.iter().map(|l| l.to_string()));
        // The fuzz corpus, line by line.
        let corpus = concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/corpus/wal2json_lines");
        for entry in std::fs::read_dir(corpus).expect("the fuzz corpus").flatten() {
            let bytes = std::fs::read(entry.path()).expect("a corpus file");
            lines.extend(
                bytes.split(|&b| b == b'\n').filter_map(|l| std::str::from_utf8(l).ok()).map(str::to_owned),
            );
        }
        // What JSON parsers disagree on, in a value that would be copied into a document.
        let head = r#"{"action":"I","schema":"s","table":"t","columns":[{"name":"a","value":"#;
        for value in [
            r#""ok""#, r#""\q""#, r#""\u12""#, r#""\ud800""#, r#""\udc00\ud800""#, r#""\ud83d\ude00""#,
            "\"\u{1}\"", "\"\t\"", "\"\u{7f}\"", r#""\/""#, "01", "-", "1.", ".5", "1e", "1e+", "-0", "1E400",
            "+1", "0x10", "NaN", "Infinity", "tru", "nul", "truex", "[1,]", "[,1]", "{\"a\":1,}", "{\"a\"}",
            "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
            "1 ", " 1", "\"a\"\u{0}", "'a'", "\"a\" \"b\"",
        ] {
            lines.push(format!("{head}{value}}}]}}"));
            lines.push(format!(r#"{{"action":"B","timestamp":{value}}}"#));
            lines.push(format!(r#"{{"action":{value},"lsn":"0/1"}}"#));
            lines.push(format!(r#"{{"action":"I","columns":[{{"name":{value},"value":1}}]}}"#));
            // The same in the objects as wal2json writes them (the scanner's fixed-token path).
            let col = |name: &str, ty: &str, v: &str| format!(r#"{{"name":{name},"type":{ty},"value":{v}}}"#);
            for c in [col("\"a\"", "\"t\"", value), col("\"a\"", value, "1"), col(value, "\"t\"", "1")] {
                lines.push(format!(r#"{{"action":"I","columns":[{c},{}]}}"#, col("\"b\"", "\"t\"", "2")));
                lines.push(format!(r#"{{"action":"U","identity":[{c}],"columns":[{c}]}}"#));
            }
            for k in [format!(r#"{{"name":{value},"type":"t"}}"#), format!(r#"{{"name":"a","type":{value}}}"#)] {
                lines.push(format!(r#"{{"action":"I","columns":[{}],"pk":[{k}]}}"#, col("\"a\"", "\"t\"", "1")));
            }
        }
        for extra in [
            r#"{"action":"B","action":"C"}"#,
            r#"{"action":"B","x":1,"x":2}"#,
            r#"{"act\u0069on":"B"}"#,
            r#"{"action":"B"} x"#,
            r#"{"action":"B"}}"#,
            "{\"action\":\"B\"}\u{0}",
            " {\"action\":\"B\"} ",
            r#"{"action":"I","columns":[{"name":"a","value":1,"name":"b"}]}"#,
            r#"{"action":"I","columns":[{"name":"a\u0000","value":1}]}"#,
            r#"{"action":"I","columns":[{"value":1}]}"#,
            r#"{"action":"I","pk":[{"type":"int"}]}"#,
            r#"{"action":"I","columns":{}}"#,
            r#"{"action":"I","columns":null}"#,
            r#"{"action":null}"#,
            // Near misses of the written forms: whitespace, another member, another order.
            r#"{"action":"I","columns":[{"name":"a","type":"t","value":1 }]}"#,
            r#"{"action":"I","columns":[ {"name" :"a","type":"t","value":1}]}"#,
            r#"{"action":"I","columns":[{"name":"a","type":"t","value":1,"x":2}]}"#,
            r#"{"action":"I","columns":[{"name":"a","type":"t","value":1,"name":"b"}]}"#,
            r#"{"action":"I","columns":[{"type":"t","name":"a","value":1}]}"#,
            r#"{"action":"I","columns":[{"name":"a","type":"t","value":1}],"pk":[{"name":"a","type":"t","x":1}]}"#,
            r#"{"action":"I","columns":[{"name":"a","type":"t\"","value":"x\u0041"}],"pk":[{"name":"a","type":"t\n"}]}"#,
            r#"{"action":"I","columns":[{"name":"a","type":"t","value":1}"#,
            r#"{"action":"I","columns":[{"name":"a","type":"t","value":"#,
            r#"{"action":"I","columns":[{"name":"a","type":"t""#,
            r#"{"action":"I","columns":[{"name":"a"#,
            r#"{"actio":"I","n":1,"nam":2,"t":3,"ta":4,"pkk":5,"schem":6}"#,
        ] {
            lines.push(extra.to_owned());
        }
        let failures: Vec<String> = lines.iter().filter_map(|l| parsers_agree(l).err()).collect();
        assert!(
            failures.is_empty(),
            "{} of {} lines: {:#?}",
            failures.len(),
            lines.len(),
            &failures[..failures.len().min(10)]
        );
        // The capture takes the fast paths (a line they refuse is not slower, only rarer): every
        // line the scanner, and sonic-rs too (the path of lines with escaped names).
        assert!(capture.iter().all(|l| scan::parse(l).is_some()), "a capture line refused by the scanner");
        assert!(
            capture.iter().all(|l| sonic_rs::from_str::<Line<'_>>(l).is_ok()),
            "a capture line refused by sonic-rs"
        );
        // Lines the scanner gives up on (the generic path reads them or names their error).
        for line in [
            r#"{"act\u0069on":"B"}"#,
            r#"{"action":"I","columns":[{"name":"a\"b","value":1}]}"#,
            r#"{"action":"B","timestamp":[1]}"#,
            r#"{"action":"B","action":"C"}"#,
            r#"{"action":"I","columns":[{"value":1}]}"#,
            r#"{"action":"B"} x"#,
        ] {
            assert!(scan::parse(line).is_none(), "{line}");
        }
        assert_eq!(
            scan::parse(" {\"action\" : \"B\" , \"xid\":-0.5E+3}\r\n").map(|l| (l.action, l.xid)),
            Some((Some("\"B\"".into()), Some("-0.5E+3".into())))
        );
    }

    #[test]
    fn deep_nesting_takes_the_slow_path_and_is_refused_without_overflowing() {
        for depth in [3, 64, 65, 200, 100_000] {
            let nested = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
            let in_ignored = format!(r#"{{"action":"B","timestamp":{nested}}}"#);
            let in_value = format!(
                r#"{{"action":"I","schema":"s","table":"t","columns":[{{"name":"a","value":{nested}}}]}}"#
            );
            let in_string = format!(r#"{{"action":"B","timestamp":"{}"}}"#, "[".repeat(depth));
            assert_eq!(max_depth(in_ignored.as_bytes()), depth + 1);
            assert_eq!(max_depth(in_string.as_bytes()), 1, "brackets inside a string do not nest");
            assert_eq!(shallow(in_ignored.as_bytes()), depth < MAX_FAST_DEPTH);
            assert!(shallow(in_string.as_bytes()));
            // Whatever serde_json says (it skips nested values without recursing).
            for line in [&in_ignored, &in_value, &in_string] {
                assert_eq!(parse_line(line.as_bytes()).ok(), slow::parse(line).ok(), "depth {depth}");
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]

        /// Capture-like lines with bytes replaced: the parsers still agree.
        #[test]
        fn parsers_agree_on_damaged_lines(
            at in 0usize..400,
            bytes in proptest::collection::vec(proptest::prop_oneof![
                proptest::sample::select(b"\"\\{}[],:0123456789.eE+-tfnulx \t\x01\x7f".to_vec()),
                proptest::num::u8::ANY,
            ], 1..4),
        ) {
            let base = r#"{"action":"U","xid":725,"lsn":"0/1524B20","schema":"public","table":"t","columns":[{"name":"id","type":"integer","value":1},{"name":"n","type":"numeric","value":-1.5e3},{"name":"s","type":"text","value":"a\"b\\c\u00e9"},{"name":"b","type":"boolean","value":false},{"name":"z","type":"text","value":null}],"identity":[{"name":"id","type":"integer","value":1}],"pk":[{"name":"id","type":"integer"}]}"#;
            let mut line = base.as_bytes().to_vec();
            let at = at % line.len();
            let end = (at + bytes.len()).min(line.len());
            line.splice(at..end, bytes);
            if let Ok(text) = std::str::from_utf8(&line) {
                if let Err(e) = parsers_agree(text) {
                    proptest::prop_assert!(false, "{}", e);
                }
            }
        }
    }
}
