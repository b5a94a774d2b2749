//! The reader's errors: [`Wal2JsonError`] (which line, what is wrong, what it discarded) and
//! [`Wal2JsonErrorKind`]: the reader's own, or the builder's.

use std::io;

use crate::batch::{BuildError, BuildErrorKind};

/// An error while reading wal2json input: the 1-based line number and what is wrong.
///
/// ```
/// use lanestream_postgres::batch::{BuildErrorKind, TransactionBuilder};
/// use lanestream_postgres::wal2json::Wal2JsonErrorKind;
/// let mut b = TransactionBuilder::new();
/// let err = b.push_line(3, br#"{"action":"I","schema":"s","table":"t","columns":[]}"#).unwrap_err();
/// assert_eq!(err.line(), 3);
/// assert!(matches!(err.kind(), Wal2JsonErrorKind::Build(BuildErrorKind::OutsideTransaction { action: 'I' })));
/// assert_eq!(err.to_string(), "wal2json line 3: I outside a transaction (no B before it)");
/// ```
#[derive(Debug, thiserror::Error)]
#[error("wal2json line {line}: {kind}")]
pub struct Wal2JsonError {
    line: u64,
    /// Boxed: every line's result carries the error type, and a small one is returned in
    /// registers on the way that counts.
    #[source]
    pub(super) kind: Box<Wal2JsonErrorKind>,
    discarded: u64,
}

impl Wal2JsonError {
    /// Builds an error for `line` (1-based).
    pub fn new(line: u64, kind: Wal2JsonErrorKind) -> Self {
        Wal2JsonError { line, kind: Box::new(kind), discarded: 0 }
    }

    /// How many changes of a transaction this error discarded (see
    /// [`BuildError::lost_changes`]): 0 for an error that discarded nothing (a bad line inside a
    /// transaction reports its loss at the transaction's `C`). A caller that skips bad lines adds
    /// these up as lost changes.
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
    /// (see [`BuildError::open_transaction_discarded`]): a caller tracking a transaction's chunks
    /// drops them.
    pub fn open_transaction_discarded(&self) -> bool {
        self.discarded > 0
            || matches!(&*self.kind, Wal2JsonErrorKind::Build(kind) if kind.discards_the_open_transaction())
    }

    /// Whether reading may go on after this error (everything but I/O errors and failed key
    /// look-ups, after which nothing can be read right). See the module docs for what happens to
    /// the open transaction.
    pub fn is_recoverable(&self) -> bool {
        !matches!(
            *self.kind,
            Wal2JsonErrorKind::Io(_) | Wal2JsonErrorKind::Build(BuildErrorKind::KeyLookupFailed { .. })
        )
    }
}

impl From<BuildError> for Wal2JsonError {
    fn from(e: BuildError) -> Self {
        let line = e.record();
        let (kind, discarded) = e.into_parts();
        Wal2JsonError { line, kind: Box::new(Wal2JsonErrorKind::Build(kind)), discarded }
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
    /// What the line says is refused (a field missing or of the wrong type, a change outside a
    /// transaction, a commit that cannot position its transaction, a damaged transaction
    /// discarded at its `C`...): see [`BuildErrorKind`].
    #[error("{0}")]
    Build(#[source] BuildErrorKind),
}

impl From<BuildErrorKind> for Wal2JsonErrorKind {
    fn from(kind: BuildErrorKind) -> Self {
        Wal2JsonErrorKind::Build(kind)
    }
}
