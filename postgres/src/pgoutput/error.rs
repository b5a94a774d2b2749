//! The decoder's errors: [`PgOutputError`] (which message, what is wrong, what it discarded) and
//! [`PgOutputErrorKind`].

use crate::batch::{BuildError, BuildErrorKind};

/// An error while decoding pgoutput: the 1-based number of the message in this decoder and what
/// is wrong.
///
/// ```
/// use lanestream_postgres::pgoutput::{PgOutputDecoder, PgOutputErrorKind};
/// use lanestream_postgres::batch::TransactionBuilder;
/// let mut d = PgOutputDecoder::new(TransactionBuilder::new());
/// let err = d.decode(b"B\0\0").unwrap_err();
/// assert_eq!(err.message(), 1);
/// assert!(matches!(err.kind(), PgOutputErrorKind::Truncated { tag: 'B', .. }));
/// ```
#[derive(Debug, thiserror::Error)]
#[error("pgoutput message {message}: {kind}")]
pub struct PgOutputError {
    pub(super) message: u64,
    /// Boxed: every message's result carries the error type, and a small one is returned in
    /// registers on the way that counts.
    #[source]
    pub(super) kind: Box<PgOutputErrorKind>,
    pub(super) lost: u64,
}

impl PgOutputError {
    /// The 1-based number of the offending message (counted by the decoder since it was made).
    pub fn message(&self) -> u64 {
        self.message
    }

    /// What is wrong.
    pub fn kind(&self) -> &PgOutputErrorKind {
        &self.kind
    }

    /// How many changes of a transaction this error discarded (see
    /// [`BuildError::lost_changes`]); 0 for an error that discarded nothing yet (a bad message
    /// inside a transaction reports its loss at the transaction's commit).
    pub fn lost_changes(&self) -> u64 {
        self.lost
    }

    /// Whether decoding may go on after this error: everything but a failed key look-up
    /// ([`BuildErrorKind::KeyLookupFailed`]), after which no id can be built right.
    pub fn is_recoverable(&self) -> bool {
        !matches!(*self.kind, PgOutputErrorKind::Build(BuildErrorKind::KeyLookupFailed { .. }))
    }
}

/// What is wrong with a pgoutput message (see [`PgOutputError`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgOutputErrorKind {
    /// The message has no bytes.
    #[error("empty message")]
    Empty,
    /// The message ends inside one of its fields.
    #[error("{tag:?} message ends inside its {field} (at byte {at} of {len})")]
    Truncated {
        /// The message's tag.
        tag: char,
        /// The field being read.
        field: &'static str,
        /// Where it starts.
        at: usize,
        /// The message's length.
        len: usize,
    },
    /// Bytes follow the message's last field.
    #[error("{tag:?} message has {extra} bytes after its last field")]
    TrailingBytes {
        /// The message's tag.
        tag: char,
        /// How many.
        extra: usize,
    },
    /// The first byte is no pgoutput message type.
    #[error("unknown pgoutput message type {0:#04x}")]
    UnknownMessage(u8),
    /// A message of protocol version 2 or later (streamed or two-phase transactions).
    #[error("{0:?} is a message of pgoutput protocol version 2 or later (streamed or two-phase transactions): start replication with proto_version '1' and without streaming or two_phase")]
    UnsupportedMessage(char),
    /// A name or value is not UTF-8 (the replication connection asks for `client_encoding`
    /// UTF8, so this is not a server's output).
    #[error("{field} is not valid UTF-8")]
    NotUtf8 {
        /// The field.
        field: &'static str,
    },
    /// A count or length is negative.
    #[error("{field} is negative ({value})")]
    Negative {
        /// The field.
        field: &'static str,
        /// Its value.
        value: i64,
    },
    /// A change for a relation whose Relation message the decoder has not seen (the stream did
    /// not start at the session's first message, or a malformed Relation message made the
    /// decoder forget its relations).
    #[error("change for relation OID {0} before its Relation message (the decoder must see the replication session from its first message)")]
    UnknownRelation(u32),
    /// A tuple's column count differs from its Relation message's.
    #[error("a tuple of {table} has {got} columns but its Relation message {expected}")]
    ColumnCount {
        /// `schema.table`.
        table: String,
        /// The Relation message's count.
        expected: usize,
        /// The tuple's.
        got: usize,
    },
    /// A tuple marker other than the message allows (`N`, `K`, `O`).
    #[error("{tag:?} message: unexpected tuple marker {marker:#04x}")]
    BadTupleMarker {
        /// The message's tag.
        tag: char,
        /// The byte found.
        marker: u8,
    },
    /// A column's kind byte is not `n`, `u`, `t` or `b`.
    #[error("column {column} of {table}: unknown value kind {kind:#04x}")]
    BadValueKind {
        /// `schema.table`.
        table: String,
        /// The column.
        column: String,
        /// The byte found.
        kind: u8,
    },
    /// A value in binary format: the decoder reads text-format values.
    #[error("column {column} of {table} is in binary format: start replication without the binary option")]
    BinaryValue {
        /// `schema.table`.
        table: String,
        /// The column.
        column: String,
    },
    /// A text value that its column's type cannot have (a number type's value that is no JSON
    /// number, a bool that is neither `t` nor `f`).
    #[error("column {column} of {table} (type OID {type_oid}): {value:?} is not {expected}")]
    BadValue {
        /// `schema.table`.
        table: String,
        /// The column.
        column: String,
        /// Its type OID.
        type_oid: u32,
        /// The value (at most 64 bytes of it).
        value: String,
        /// What it should be.
        expected: &'static str,
    },
    /// The batch builder refused the change (a null key, a failed key look-up, a commit LSN not
    /// after the previous one, a damaged transaction discarded at its commit...): see
    /// [`BuildErrorKind`], whose variants name what the builder checks, whatever the input.
    #[error("{0}")]
    Build(#[source] BuildErrorKind),
    /// A capture could not be read ([`PgOutputReader`](super::PgOutputReader)): an I/O error, or a
    /// message cut short (`UnexpectedEof`).
    #[error("reading the capture: {0}")]
    Io(#[source] std::io::Error),
}

/// Why a message failed: the decoder's own check (boxed, as in [`PgOutputError`]) or the
/// builder's.
pub(super) enum Fail {
    Message(Box<PgOutputErrorKind>),
    Builder(BuildError),
}

impl From<PgOutputErrorKind> for Fail {
    #[cold]
    fn from(k: PgOutputErrorKind) -> Self {
        Fail::Message(Box::new(k))
    }
}
