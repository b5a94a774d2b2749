//! The builder's errors: [`BuildError`] (which record, what is wrong, what it discarded) and
//! [`BuildErrorKind`].

use lanestream::{ParseLsnError, Position};

/// An error of the [`TransactionBuilder`](super::TransactionBuilder): the 1-based number of the
/// record the caller fed (a wal2json line, a pgoutput message) and what is wrong with it.
///
/// The decoders wrap it: the wal2json reader's
/// [`Wal2JsonErrorKind::Build`](crate::wal2json::Wal2JsonErrorKind::Build), the pgoutput
/// decoder's [`PgOutputErrorKind::Build`](crate::pgoutput::PgOutputErrorKind::Build).
///
/// ```
/// use lanestream_postgres::batch::{BuildErrorKind, TransactionBuilder};
/// let mut b = TransactionBuilder::new();
/// b.push_line(1, br#"{"action":"B"}"#)?;
/// let err = b.finish(2).unwrap_err();
/// assert_eq!(err.record(), 2);
/// assert!(matches!(err.kind(), BuildErrorKind::Truncated { begun: 1 }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[error("record {record}: {kind}")]
pub struct BuildError {
    record: u64,
    /// Boxed: every record's result carries the error type, and a small one is returned in
    /// registers on the way that counts.
    #[source]
    kind: Box<BuildErrorKind>,
    discarded: u64,
}

impl BuildError {
    /// Builds an error for `record` (1-based) that discarded nothing.
    pub fn new(record: u64, kind: BuildErrorKind) -> Self {
        BuildError { record, kind: Box::new(kind), discarded: 0 }
    }

    /// An error that discarded `discarded` changes of an open transaction.
    pub(crate) fn discarding(record: u64, kind: BuildErrorKind, discarded: u64) -> Self {
        BuildError { record, kind: Box::new(kind), discarded }
    }

    /// How many changes of a transaction this error discarded: the changes read so far, and the
    /// bad records counted as lost changes, of a transaction that will never be published
    /// because of it ([`BuildErrorKind::DamagedTransaction`], a bad commit, a begin inside a
    /// transaction). 0 for an error that discarded nothing (a bad record inside a transaction
    /// reports its loss at the transaction's commit). A caller that skips bad records adds these
    /// up as lost changes.
    pub fn lost_changes(&self) -> u64 {
        self.discarded
    }

    /// The 1-based number of the offending record (for an end-of-input error, the number of
    /// records read).
    pub fn record(&self) -> u64 {
        self.record
    }

    /// What is wrong.
    pub fn kind(&self) -> &BuildErrorKind {
        &self.kind
    }

    /// Whether this error discarded a transaction of which chunks may already have been returned
    /// ([`BuildErrorKind::DamagedTransaction`], a bad commit, a begin inside a transaction): a
    /// caller tracking a transaction's chunks drops them.
    pub fn open_transaction_discarded(&self) -> bool {
        self.discarded > 0 || self.kind.discards_the_open_transaction()
    }

    /// Whether feeding may go on after this error (everything but a failed key look-up, after
    /// which nothing can be read right). See the [module docs](super) for what happens to the
    /// open transaction.
    pub fn is_recoverable(&self) -> bool {
        !matches!(*self.kind, BuildErrorKind::KeyLookupFailed { .. })
    }

    /// The kind and the changes discarded, taken apart (the decoders rewrap them).
    pub(crate) fn into_parts(self) -> (BuildErrorKind, u64) {
        (*self.kind, self.discarded)
    }
}

/// What is wrong with a record the builder was fed (see [`BuildError`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildErrorKind {
    /// A required field is missing.
    #[error("{action} line without {field}{hint}")]
    MissingField {
        /// The record's action (`?` when the action itself is missing).
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
        /// The record's action.
        action: char,
    },
    /// A B arrived while a transaction was open: the open one was discarded.
    #[error("B inside the transaction begun at line {begun} (its C is missing); that transaction, with {dropped} changes, was discarded")]
    BeginInsideTransaction {
        /// The record of the discarded transaction's B.
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
        /// The record of its B.
        begun: u64,
    },
    /// The transaction had bad records (malformed, too long, out of shape): it was discarded
    /// whole at its `C` (a transaction is never published without some of its changes).
    #[error("the transaction begun at line {begun} (commit LSN {lsn}) had {bad_lines} bad lines, the first at line {first_bad}; it was discarded whole with its {changes} readable changes{chunks}",
        chunks = if *chunks > 0 { format!(" ({chunks} chunks of it were already returned unpositioned: drop them)") } else { String::new() })]
    DamagedTransaction {
        /// The record of its `B`.
        begun: u64,
        /// Its commit LSN as the `C` gave it (may be invalid).
        lsn: String,
        /// The first bad record.
        first_bad: u64,
        /// How many bad records it had.
        bad_lines: u64,
        /// How many readable changes it had.
        changes: u64,
        /// How many unpositioned chunks of it were already returned (see
        /// [`TransactionBuilder::with_max_batch_changes`](super::TransactionBuilder::with_max_batch_changes)).
        chunks: u64,
    },
    /// A table without a primary key turned out to have an index as its replica identity (its
    /// `identity` holds fewer columns than its rows): the ids of its rows read before used every
    /// column, so they do not match. From now on its key columns are the identity's; to be right
    /// from the first row, give the builder the table's key columns
    /// ([`TransactionBuilder::set_key_columns`](super::TransactionBuilder::set_key_columns),
    /// [`TransactionBuilder::with_key_lookup`](super::TransactionBuilder::with_key_lookup)).
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
    /// The key look-up
    /// ([`TransactionBuilder::with_key_lookup`](super::TransactionBuilder::with_key_lookup))
    /// failed for a table: its key is unknown, so no id can be built for its rows (ids from every
    /// column would not match the others). Not recoverable: reading on would lose the
    /// transaction.
    #[error("the key look-up of table {table} failed: {error}; no id was built from it (stop, fix the cause, and start again: the transaction comes again)")]
    KeyLookupFailed {
        /// `schema.table`.
        table: String,
        /// Why.
        #[source]
        error: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl BuildErrorKind {
    /// Whether an error of this kind discards the open transaction (which may have had chunks
    /// returned already).
    pub(crate) fn discards_the_open_transaction(&self) -> bool {
        matches!(
            self,
            BuildErrorKind::DamagedTransaction { .. }
                | BuildErrorKind::BeginInsideTransaction { .. }
                | BuildErrorKind::BadLsn(_)
                | BuildErrorKind::LsnRegressed { .. }
                | BuildErrorKind::XidMismatch { .. }
                | BuildErrorKind::Truncated { .. }
        )
    }
}
