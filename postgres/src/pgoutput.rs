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
//! names, ids and their encoding, key changes as a delete then an upsert. Two differences come
//! from the plugin, not the decoder: pgoutput sends no empty transaction (PostgreSQL 15 skips
//! transactions with nothing published), and only the tables of the publication.
//!
//! **Documents** are JSON objects of the row, in the relation's column order, each text-format
//! value typed by its column's type OID as wal2json does: `int2`, `int4`, `int8`, `oid`,
//! `float4`, `float8` and `numeric` values are JSON numbers (their `NaN`, `Infinity` and
//! `-Infinity` are `null`, as wal2json writes them); `bool` is `true` / `false`; `bytea` is a
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
//! discard that transaction whole at its commit ([`Wal2JsonErrorKind::DamagedTransaction`] in
//! [`PgOutputErrorKind::Build`], with [`PgOutputError::lost_changes`]), so a transaction is never
//! published without some of its changes. No input makes the decoder panic (a cargo-fuzz target
//! checks it).
//!
//! # Example
//! ```
//! use lanestream::{Op, Position};
//! use lanestream_postgres::pgoutput::PgOutputDecoder;
//! use lanestream_postgres::wal2json::TransactionBuilder;
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

use std::borrow::Cow;
use std::fmt;

use ahash::AHashMap as HashMap;
use lanestream::{Batch, Position};

use crate::backfill::{Mark, MARK_PREFIX};
use crate::wal2json::{Change, Column, Key, TransactionBuilder, Wal2JsonError, Wal2JsonErrorKind};

/// An error while decoding pgoutput: the 1-based number of the message in this decoder and what
/// is wrong.
///
/// ```
/// use lanestream_postgres::pgoutput::{PgOutputDecoder, PgOutputErrorKind};
/// use lanestream_postgres::wal2json::TransactionBuilder;
/// let mut d = PgOutputDecoder::new(TransactionBuilder::new());
/// let err = d.decode(b"B\0\0").unwrap_err();
/// assert_eq!(err.message(), 1);
/// assert!(matches!(err.kind(), PgOutputErrorKind::Truncated { tag: 'B', .. }));
/// ```
#[derive(Debug, thiserror::Error)]
#[error("pgoutput message {message}: {kind}")]
pub struct PgOutputError {
    message: u64,
    /// Boxed: every message's result carries the error type, and a small one is returned in
    /// registers on the way that counts.
    #[source]
    kind: Box<PgOutputErrorKind>,
    lost: u64,
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
    /// [`Wal2JsonError::lost_changes`]); 0 for an error that discarded nothing yet (a bad message
    /// inside a transaction reports its loss at the transaction's commit).
    pub fn lost_changes(&self) -> u64 {
        self.lost
    }

    /// Whether decoding may go on after this error: everything but a failed key look-up
    /// ([`Wal2JsonErrorKind::KeyLookupFailed`]), after which no id can be built right.
    pub fn is_recoverable(&self) -> bool {
        !matches!(*self.kind, PgOutputErrorKind::Build(Wal2JsonErrorKind::KeyLookupFailed { .. }))
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
    /// [`Wal2JsonErrorKind`], whose variants name what the builder checks, whatever the input.
    #[error("{0}")]
    Build(#[source] Wal2JsonErrorKind),
}

/// One column of a relation, as its Relation message gives it.
#[derive(Debug)]
struct RelColumn {
    name: String,
    /// The name needs no JSON escaping (then documents borrow it).
    plain: bool,
    type_oid: u32,
    /// How its values become JSON (from `type_oid`).
    json: JsonType,
    /// Flagged as part of the replica identity (pgoutput's flag 1).
    key: bool,
}

/// A relation's shape, from its last Relation message.
#[derive(Debug)]
struct Relation {
    /// `schema.table`, for errors.
    name: String,
    schema: String,
    table: String,
    columns: Vec<RelColumn>,
    /// The key the builder gets with each change: the flagged columns, except under `REPLICA
    /// IDENTITY FULL` (every column is flagged there): `None`, so the builder asks its key
    /// look-up for the primary key.
    key: Option<Vec<Key<'static>>>,
}

/// The decoder: a relation cache in front of a [`TransactionBuilder`]. See the
/// [module docs](self).
pub struct PgOutputDecoder {
    builder: TransactionBuilder,
    relations: HashMap<u32, Relation>,
    messages: u64,
    resume_after: Option<Position>,
    /// Inside a transaction being skipped (see [`PgOutputDecoder::resume_after`]).
    skipping: bool,
    skipped: u64,
    /// The commit time of the last Begin, in microseconds since the Unix epoch.
    commit_time: Option<i64>,
    /// The string values of the change being decoded, JSON-escaped (see `Val`).
    scratch: String,
    /// The allocations of the change's values and columns, kept from one change to the next
    /// (empty between changes; see [`recycle`]).
    values: Vec<(usize, Val<'static>)>,
    columns: Vec<Column<'static>>,
    /// Backfill marks read and not yet taken ([`PgOutputDecoder::take_mark`]).
    marks: std::collections::VecDeque<Mark>,
}

impl fmt::Debug for PgOutputDecoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgOutputDecoder")
            .field("builder", &self.builder)
            .field("relations", &self.relations.len())
            .field("messages", &self.messages)
            .field("resume_after", &self.resume_after)
            .finish_non_exhaustive()
    }
}

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01 00:00:00 UTC).
const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;

/// Type OIDs whose text values are JSON numbers (as wal2json): int8, int2, int4, oid, float4,
/// float8, numeric.
const NUMBER_TYPES: [u32; 7] = [20, 21, 23, 26, 700, 701, 1700];
const BOOL_OID: u32 = 16;
const BYTEA_OID: u32 = 17;

/// Why a message failed: the decoder's own check (boxed, as in [`PgOutputError`]) or the
/// builder's.
enum Fail {
    Message(Box<PgOutputErrorKind>),
    Builder(Wal2JsonError),
}

impl From<PgOutputErrorKind> for Fail {
    #[cold]
    fn from(k: PgOutputErrorKind) -> Self {
        Fail::Message(Box::new(k))
    }
}

/// Reads a message's fields, big-endian as the protocol has them.
struct Fields<'m> {
    buf: &'m [u8],
    at: usize,
    tag: char,
    /// The whole message when it is valid UTF-8 (checked once for a change, whose values are
    /// then slices of it, see [`Fields::text`]).
    text: Option<&'m str>,
}

// The readers are inlined into the per-value loop, their errors built out of line: a
// `PgOutputErrorKind` is large, and building (or dropping) one on the way costs more than the read.
impl<'m> Fields<'m> {
    #[inline(always)]
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'m [u8], PgOutputErrorKind> {
        match self.buf.get(self.at..self.at.saturating_add(n)) {
            Some(b) if self.at.checked_add(n).is_some() => {
                self.at += n;
                Ok(b)
            }
            _ => Err(self.truncated(field)),
        }
    }

    #[cold]
    #[inline(never)]
    fn truncated(&self, field: &'static str) -> PgOutputErrorKind {
        PgOutputErrorKind::Truncated { tag: self.tag, field, at: self.at, len: self.buf.len() }
    }

    #[inline(always)]
    fn u8(&mut self, field: &'static str) -> Result<u8, PgOutputErrorKind> {
        Ok(self.take(1, field)?[0])
    }

    #[inline(always)]
    fn u16(&mut self, field: &'static str) -> Result<u16, PgOutputErrorKind> {
        let b = self.take(2, field)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    #[inline(always)]
    fn u32(&mut self, field: &'static str) -> Result<u32, PgOutputErrorKind> {
        let b = self.take(4, field)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, PgOutputErrorKind> {
        let b = self.take(8, field)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    /// `n` bytes as text ([`PgOutputErrorKind::NotUtf8`] when they are not UTF-8).
    #[inline(always)]
    fn text(&mut self, n: usize, field: &'static str) -> Result<&'m str, PgOutputErrorKind> {
        let at = self.at;
        let bytes = self.take(n, field)?;
        let text = match self.text {
            // A slice of valid UTF-8 is valid exactly when it starts and ends at characters.
            Some(all) => all.get(at..at + n),
            None => simdutf8::basic::from_utf8(bytes).ok(),
        };
        let Some(text) = text else { return Err(PgOutputErrorKind::NotUtf8 { field }) };
        Ok(text)
    }

    /// A signed 16-bit count (pgoutput's `Int16` column counts), refused when negative.
    #[inline(always)]
    fn count16(&mut self, field: &'static str) -> Result<usize, PgOutputErrorKind> {
        let v = self.u16(field)? as i16;
        usize::try_from(v).map_err(|_| PgOutputErrorKind::Negative { field, value: v.into() })
    }

    /// A signed 32-bit count or length, refused when negative.
    #[inline(always)]
    fn count32(&mut self, field: &'static str) -> Result<usize, PgOutputErrorKind> {
        let v = self.u32(field)? as i32;
        usize::try_from(v).map_err(|_| PgOutputErrorKind::Negative { field, value: v.into() })
    }

    /// A NUL-terminated string.
    fn cstr(&mut self, field: &'static str) -> Result<&'m str, PgOutputErrorKind> {
        let rest = self.buf.get(self.at..).unwrap_or(&[]);
        let Some(end) = memchr::memchr(0, rest) else {
            return Err(PgOutputErrorKind::Truncated {
                tag: self.tag,
                field,
                at: self.at,
                len: self.buf.len(),
            });
        };
        let s = simdutf8::basic::from_utf8(&rest[..end]).map_err(|_| PgOutputErrorKind::NotUtf8 { field })?;
        self.at += end + 1;
        Ok(s)
    }

    fn end(&self) -> Result<(), PgOutputErrorKind> {
        match self.buf.len() - self.at.min(self.buf.len()) {
            0 => Ok(()),
            extra => Err(PgOutputErrorKind::TrailingBytes { tag: self.tag, extra }),
        }
    }
}

/// Whether `s` needs no JSON escaping.
pub(crate) fn plain(s: &str) -> bool {
    !s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\')
}

/// Appends `s` as a JSON string, escaped as PostgreSQL's `escape_json` (and so wal2json) does:
/// `\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, other control characters as `\u00xx`.
fn push_json_string(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    // Most values need no escape: skip the 8-byte words without a byte to escape at once.
    let clean = s.as_bytes().as_chunks::<8>().0.iter().take_while(|&&w| !word_needs_escape(w)).count() * 8;
    let mut start = 0;
    for (i, b) in s.bytes().enumerate().skip(clean) {
        let esc: &str = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if esc.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.push_str("\\u00");
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 0xf)] as char);
        } else {
            out.push_str(esc);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// Whether the 8 bytes `w` hold one that a JSON string escapes (`"`, `\`, below 0x20): the
/// exact zero-byte and less-than tests on a word ("Bit Twiddling Hacks").
fn word_needs_escape(w: [u8; 8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let x = u64::from_ne_bytes(w);
    let has_zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH != 0;
    let below_space = x.wrapping_sub(ONES * 0x20) & !x & HIGH != 0;
    below_space || has_zero(x ^ (ONES * u64::from(b'"'))) || has_zero(x ^ (ONES * u64::from(b'\\')))
}

#[cfg(test)]
fn json_string(s: &str) -> String {
    let mut out = String::new();
    push_json_string(&mut out, s);
    out
}

/// Whether `s` is a JSON number (`-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`).
fn is_json_number(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = usize::from(b.first() == Some(&b'-'));
    let digits = |i: &mut usize| {
        let start = *i;
        while b.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i - start
    };
    match b.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => {
            digits(&mut i);
        }
        _ => return false,
    }
    if b.get(i) == Some(&b'.') {
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

/// A value as the builder gets it: text of the message (or a constant), or a range of the
/// decoder's scratch buffer (strings, written there escaped: one buffer for a change's values
/// instead of a string each).
#[derive(Clone, Copy)]
enum Val<'m> {
    Text(&'m str),
    Scratch(usize, usize),
}

/// How the text values of a column type become JSON (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JsonType {
    /// A JSON number ([`NUMBER_TYPES`]).
    Number,
    /// `true` / `false`.
    Bool,
    /// A string of the hex digits.
    Bytea,
    /// A string of the text.
    Text,
}

impl JsonType {
    fn of(type_oid: u32) -> Self {
        match type_oid {
            t if NUMBER_TYPES.contains(&t) => JsonType::Number,
            BOOL_OID => JsonType::Bool,
            BYTEA_OID => JsonType::Bytea,
            _ => JsonType::Text,
        }
    }
}

/// A text-format value as JSON, typed by its column's type (see the module docs); a JSON
/// string is written into `scratch`. `Err` names what it should have been.
fn json_value<'m>(json: JsonType, text: &'m str, scratch: &mut String) -> Result<Val<'m>, &'static str> {
    match json {
        JsonType::Number => {
            if is_json_number(text) {
                return Ok(Val::Text(text));
            }
            // wal2json writes these as null (JSON has no such numbers).
            if ["NaN", "Infinity", "-Infinity"].iter().any(|s| text.eq_ignore_ascii_case(s)) {
                return Ok(Val::Text("null"));
            }
            Err("a number")
        }
        JsonType::Bool => match text {
            "t" => Ok(Val::Text("true")),
            "f" => Ok(Val::Text("false")),
            _ => Err("a bool (t or f)"),
        },
        JsonType::Bytea | JsonType::Text => {
            let text = if json == JsonType::Bytea { text.strip_prefix("\\x").unwrap_or(text) } else { text };
            let start = scratch.len();
            push_json_string(scratch, text);
            Ok(Val::Scratch(start, scratch.len()))
        }
    }
}

/// Appends a text-format value of a column of type `type_oid` to `out` as JSON, exactly as the
/// decoder writes it into a change's document (see the module docs): the one conversion, for
/// rows read from the table by the backfill ([`crate::backfill`]). `Err` names what the text
/// should have been; `out` is then unchanged.
pub(crate) fn push_json_value(type_oid: u32, text: &str, out: &mut String) -> Result<(), &'static str> {
    let start = out.len();
    match json_value(JsonType::of(type_oid), text, out) {
        Ok(Val::Text(t)) => out.push_str(t),
        Ok(Val::Scratch(..)) => {}
        Err(e) => {
            out.truncate(start);
            return Err(e);
        }
    }
    Ok(())
}

/// What a tuple is read into.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TupleKind {
    /// A new row or a whole old row (`N`, `O`): every column.
    Row,
    /// An old key (`K`): only the key columns.
    Key,
}

/// Reads a tuple of `rel`, appending to `out` (column index, value): NULL as `null`, unchanged
/// TOASTed values (`u`) left out, strings written into `scratch`.
fn read_tuple<'m>(
    f: &mut Fields<'m>,
    rel: &Relation,
    kind: TupleKind,
    scratch: &mut String,
    out: &mut Vec<(usize, Val<'m>)>,
) -> Result<(), PgOutputErrorKind> {
    let n = f.count16("tuple's column count")?;
    if n != rel.columns.len() {
        return Err(PgOutputErrorKind::ColumnCount {
            table: rel.name.clone(),
            expected: rel.columns.len(),
            got: n,
        });
    }
    out.reserve(n);
    for (i, col) in rel.columns.iter().enumerate() {
        let value_kind = f.u8("column's value kind")?;
        let value = match value_kind {
            b'n' => Some(Val::Text("null")),
            b'u' => None,
            b't' => {
                let len = f.count32("value's length")?;
                let text = f.text(len, "value")?;
                Some(json_value(col.json, text, scratch).map_err(|expected| PgOutputErrorKind::BadValue {
                    table: rel.name.clone(),
                    column: col.name.clone(),
                    type_oid: col.type_oid,
                    value: text.chars().take(64).collect(),
                    expected,
                })?)
            }
            b'b' => {
                return Err(PgOutputErrorKind::BinaryValue {
                    table: rel.name.clone(),
                    column: col.name.clone(),
                })
            }
            other => {
                return Err(PgOutputErrorKind::BadValueKind {
                    table: rel.name.clone(),
                    column: col.name.clone(),
                    kind: other,
                })
            }
        };
        let Some(value) = value else { continue };
        if kind == TupleKind::Key && !col.key {
            continue;
        }
        out.push((i, value));
    }
    Ok(())
}

/// The builder's column of a value read by [`read_tuple`].
fn column<'a>(rel: &'a Relation, (i, v): (usize, Val<'a>), scratch: &'a str) -> Column<'a> {
    let name = match rel.columns.get(i) {
        Some(col) if col.plain => Cow::Borrowed(col.name.as_str()),
        Some(col) => Cow::Owned(col.name.clone()),
        None => Cow::Borrowed(""),
    };
    let value = match v {
        Val::Text(t) => t,
        Val::Scratch(a, b) => scratch.get(a..b).unwrap_or("null"),
    };
    Column { name, value: Cow::Borrowed(value) }
}

/// `v` emptied, its allocation kept for elements of another lifetime: the standard library
/// collects a vector's iterator into the same allocation when the element layouts match (as
/// they do for one type under two lifetimes), so no unsafe code is needed; were it ever to
/// allocate instead, only speed would change.
fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

impl PgOutputDecoder {
    /// A decoder that knows no relation yet, feeding `builder` (configure chunks and key
    /// look-ups on it: [`TransactionBuilder::with_max_batch_changes`],
    /// [`TransactionBuilder::with_key_lookup`]).
    pub fn new(builder: TransactionBuilder) -> Self {
        PgOutputDecoder {
            builder,
            relations: HashMap::new(),
            messages: 0,
            resume_after: None,
            skipping: false,
            skipped: 0,
            commit_time: None,
            scratch: String::new(),
            values: Vec::new(),
            columns: Vec::new(),
            marks: std::collections::VecDeque::new(),
        }
    }

    /// A logical message already parsed (a client such as pgwire-replication hands messages over
    /// as events; an `M` message given to [`decode`](Self::decode) comes here too): a backfill
    /// mark ([`MARK_PREFIX`], see [`crate::backfill`]) is kept for
    /// [`take_mark`](Self::take_mark), in stream order; anything else is ignored. `lsn` is the
    /// message's LSN.
    pub fn message(&mut self, lsn: u64, prefix: &str, content: &[u8]) {
        if prefix != MARK_PREFIX {
            return;
        }
        if let Some(mark) = Mark::parse(content, Position(lsn)) {
            self.marks.push_back(mark);
        }
    }

    /// The oldest backfill mark read and not yet taken (see [`message`](Self::message)). A
    /// source calls it after each message it hands the decoder, so that marks and batches keep
    /// their stream order.
    pub fn take_mark(&mut self) -> Option<Mark> {
        self.marks.pop_front()
    }

    /// Skips, whole, every transaction whose commit LSN (its Begin's) is at or before `position`:
    /// transactions already handed over, which the server sends again after a reconnect. `None`
    /// skips nothing. Relation messages inside skipped transactions are still taken.
    pub fn resume_after(&mut self, position: Option<Position>) {
        self.resume_after = position;
    }

    /// The builder (its last commit, its transaction count).
    pub fn builder(&self) -> &TransactionBuilder {
        &self.builder
    }

    /// How many messages were decoded (or refused) so far.
    pub fn messages(&self) -> u64 {
        self.messages
    }

    /// How many transactions were skipped as already handed over (see
    /// [`resume_after`](Self::resume_after)).
    pub fn skipped_transactions(&self) -> u64 {
        self.skipped
    }

    /// Whether a transaction is open (begun, not yet committed), skipped ones included.
    pub fn in_transaction(&self) -> bool {
        self.skipping || self.builder.open_since().is_some()
    }

    /// The commit time of the last transaction begun, in microseconds since the Unix epoch
    /// (from its Begin message); `None` before the first.
    pub fn commit_time_micros(&self) -> Option<i64> {
        self.commit_time
    }

    /// Decodes one pgoutput message (an `XLogData` payload).
    ///
    /// Returns `Ok(Some(batch))` for a Commit (the transaction's positioned batch) and, with
    /// [`TransactionBuilder::with_max_batch_changes`], for the change that fills a chunk (an
    /// unpositioned batch); `Ok(None)` for every other message.
    ///
    /// # Errors
    /// A [`PgOutputError`] naming the message when it is malformed, unsupported, or refused by
    /// the builder; the decoder stays usable (see the [module docs](self), *Errors*).
    pub fn decode(&mut self, message: &[u8]) -> Result<Option<Batch>, PgOutputError> {
        self.messages += 1;
        let seq = self.messages;
        match self.decode_inner(seq, message) {
            Ok(b) => Ok(b),
            Err(Fail::Builder(e)) => {
                let (kind, lost) = e.into_parts();
                Err(PgOutputError { message: seq, kind: Box::new(PgOutputErrorKind::Build(kind)), lost })
            }
            Err(Fail::Message(kind)) => {
                // A bad message inside a transaction: the builder discards it whole at its
                // commit (nothing of it is ever published).
                self.builder.skip_line(seq);
                Err(PgOutputError { message: seq, kind, lost: 0 })
            }
        }
    }

    /// Opens a transaction from a Begin already parsed (a client such as pgwire-replication
    /// hands Begin and Commit over as events): `commit_lsn` is the Begin's final LSN (the commit
    /// LSN), `commit_time_micros` its time in microseconds since PostgreSQL's epoch (2000-01-01).
    ///
    /// # Errors
    /// As [`decode`](Self::decode) for a Begin.
    pub fn begin(&mut self, commit_lsn: u64, xid: u32, commit_time_micros: i64) -> Result<(), PgOutputError> {
        self.messages += 1;
        let seq = self.messages;
        self.on_begin(seq, commit_lsn, xid, commit_time_micros).map_err(|e| {
            let (kind, lost) = e.into_parts();
            PgOutputError { message: seq, kind: Box::new(PgOutputErrorKind::Build(kind)), lost }
        })
    }

    /// Ends the transaction from a Commit already parsed (see [`begin`](Self::begin)); returns
    /// its positioned batch (`None` for a skipped transaction).
    ///
    /// # Errors
    /// As [`decode`](Self::decode) for a Commit.
    pub fn commit(&mut self, commit_lsn: u64) -> Result<Option<Batch>, PgOutputError> {
        self.messages += 1;
        let seq = self.messages;
        self.on_commit(seq, commit_lsn).map_err(|e| {
            let (kind, lost) = e.into_parts();
            PgOutputError { message: seq, kind: Box::new(PgOutputErrorKind::Build(kind)), lost }
        })
    }

    /// Ends the input: a transaction left open is discarded.
    ///
    /// # Errors
    /// [`Wal2JsonErrorKind::Truncated`] (in [`PgOutputErrorKind::Build`]) when one was open.
    pub fn finish(&mut self) -> Result<(), PgOutputError> {
        self.skipping = false;
        self.builder.finish(self.messages).map_err(|e| {
            let (kind, lost) = e.into_parts();
            PgOutputError { message: self.messages, kind: Box::new(PgOutputErrorKind::Build(kind)), lost }
        })
    }

    fn on_begin(&mut self, seq: u64, commit_lsn: u64, xid: u32, time: i64) -> Result<(), Wal2JsonError> {
        self.commit_time = Some(time.saturating_add(PG_EPOCH_UNIX_MICROS));
        if self.resume_after.is_some_and(|p| commit_lsn <= p.0) && self.builder.open_since().is_none() {
            self.skipping = true;
            return Ok(());
        }
        self.skipping = false;
        self.builder.push_begin(seq, Some(u64::from(xid)), Position(commit_lsn))?;
        // The envelopes carry the commit time: the pipeline's commit → ack latency starts there.
        self.builder.set_commit_time(self.commit_time.and_then(|t| u64::try_from(t).ok()));
        Ok(())
    }

    fn on_commit(&mut self, seq: u64, commit_lsn: u64) -> Result<Option<Batch>, Wal2JsonError> {
        if std::mem::take(&mut self.skipping) {
            self.skipped += 1;
            return Ok(None);
        }
        self.builder.push_commit(seq, Position(commit_lsn))
    }

    fn decode_inner(&mut self, seq: u64, message: &[u8]) -> Result<Option<Batch>, Fail> {
        let Some(&tag) = message.first() else { return Err(PgOutputErrorKind::Empty.into()) };
        let mut f = Fields { buf: message, at: 1, tag: tag as char, text: None };
        match tag {
            b'B' => {
                let lsn = f.u64("final LSN")?;
                let time = f.u64("commit time")? as i64;
                let xid = f.u32("xid")?;
                f.end()?;
                self.on_begin(seq, lsn, xid, time).map_err(Fail::Builder)?;
                Ok(None)
            }
            b'C' => {
                let _flags = f.u8("flags")?;
                let lsn = f.u64("commit LSN")?;
                let _end = f.u64("end LSN")?;
                let _time = f.u64("commit time")?;
                f.end()?;
                self.on_commit(seq, lsn).map_err(Fail::Builder)
            }
            b'R' => {
                let parsed = Self::relation(&mut f);
                match parsed {
                    Ok((oid, rel)) => {
                        self.relations.insert(oid, rel);
                        Ok(None)
                    }
                    Err(e) => {
                        // A relation whose new shape could not be read must not be decoded
                        // with its old one: forget them all (their changes fail loudly).
                        self.relations.clear();
                        Err(e.into())
                    }
                }
            }
            b'Y' => {
                let _oid = f.u32("type OID")?;
                let _schema = f.cstr("type's schema")?;
                let _name = f.cstr("type's name")?;
                f.end()?;
                Ok(None)
            }
            b'O' => {
                let _lsn = f.u64("origin LSN")?;
                let _name = f.cstr("origin's name")?;
                f.end()?;
                Ok(None)
            }
            b'M' => {
                let _flags = f.u8("flags")?;
                let lsn = f.u64("message LSN")?;
                let prefix = f.cstr("prefix")?;
                let len = f.count32("content's length")?;
                let content = f.take(len, "content")?;
                f.end()?;
                self.message(lsn, prefix, content);
                Ok(None)
            }
            b'I' | b'U' | b'D' => self.change(seq, tag, f),
            b'T' => {
                let n = f.count32("relation count")?;
                let _options = f.u8("options")?;
                let mut oids = Vec::with_capacity(n.min(message.len() / 4));
                for _ in 0..n {
                    oids.push(f.u32("relation OID")?);
                }
                f.end()?;
                let mut out = None;
                for oid in oids {
                    let rel = self.relations.get(&oid).ok_or(PgOutputErrorKind::UnknownRelation(oid))?;
                    if self.skipping {
                        continue;
                    }
                    let change = Change {
                        action: 'T',
                        schema: &rel.schema,
                        table: &rel.table,
                        pk: None,
                        columns: None,
                        identity: None,
                        key_from_stream: false,
                        lsn: None,
                    };
                    // A chunk may fill in the middle of a multi-table truncate: return the last
                    // one (with max_batch_changes >= 2 only one can fill per message... but a
                    // chunk of 1 fills at each relation: keep them all).
                    if let Some(b) = self.builder.push_change(seq, &change).map_err(Fail::Builder)? {
                        out = merge_chunks(out, b);
                    }
                }
                Ok(out)
            }
            b'S' | b'E' | b'c' | b'A' | b'b' | b'P' | b'K' | b'r' | b'p' => {
                Err(PgOutputErrorKind::UnsupportedMessage(tag as char).into())
            }
            other => Err(PgOutputErrorKind::UnknownMessage(other).into()),
        }
    }

    fn relation(f: &mut Fields<'_>) -> Result<(u32, Relation), PgOutputErrorKind> {
        let oid = f.u32("relation OID")?;
        let schema = f.cstr("schema")?;
        // pgoutput writes an empty namespace for pg_catalog.
        let schema = if schema.is_empty() { "pg_catalog" } else { schema };
        let table = f.cstr("relation name")?;
        let identity = f.u8("replica identity")?;
        let n = f.count16("column count")?;
        let mut columns = Vec::with_capacity(n.min(f.buf.len()));
        for _ in 0..n {
            let flags = f.u8("column flags")?;
            let name = f.cstr("column name")?;
            let type_oid = f.u32("column type OID")?;
            let _typmod = f.u32("column type modifier")?;
            columns.push(RelColumn {
                name: name.to_owned(),
                plain: plain(name),
                type_oid,
                json: JsonType::of(type_oid),
                key: flags & 1 != 0,
            });
        }
        f.end()?;
        let key = (identity != b'f').then(|| {
            columns.iter().filter(|c| c.key).map(|c| Key { name: Cow::Owned(c.name.clone()) }).collect()
        });
        Ok((
            oid,
            Relation {
                name: format!("{schema}.{table}"),
                schema: schema.to_owned(),
                table: table.to_owned(),
                columns,
                key,
            },
        ))
    }

    fn change(&mut self, seq: u64, tag: u8, mut f: Fields<'_>) -> Result<Option<Batch>, Fail> {
        let oid = f.u32("relation OID")?;
        let Self { relations, builder, skipping, scratch, values, columns, .. } = self;
        let Some(rel) = relations.get(&oid) else {
            return Err(PgOutputErrorKind::UnknownRelation(oid).into());
        };
        scratch.clear();
        // The values are slices of the message: checked as UTF-8 once, not one by one.
        f.text = simdutf8::basic::from_utf8(f.buf).ok();
        let mut vals: Vec<(usize, Val<'_>)> = recycle(std::mem::take(values));
        let mut marker = f.u8("tuple marker")?;
        let old_kind = |marker: u8| if marker == b'K' { TupleKind::Key } else { TupleKind::Row };
        // `vals` holds the old tuple's values (if any) before `split`, the new one's after.
        let (split, has_old, has_new) = match tag {
            b'I' => {
                if marker != b'N' {
                    return Err(PgOutputErrorKind::BadTupleMarker { tag: 'I', marker }.into());
                }
                read_tuple(&mut f, rel, TupleKind::Row, scratch, &mut vals)?;
                (0, false, true)
            }
            b'U' => {
                let has_old = marker == b'K' || marker == b'O';
                if has_old {
                    read_tuple(&mut f, rel, old_kind(marker), scratch, &mut vals)?;
                    marker = f.u8("tuple marker")?;
                }
                if marker != b'N' {
                    return Err(PgOutputErrorKind::BadTupleMarker { tag: 'U', marker }.into());
                }
                let split = vals.len();
                read_tuple(&mut f, rel, TupleKind::Row, scratch, &mut vals)?;
                (split, has_old, true)
            }
            _ => {
                if marker != b'K' && marker != b'O' {
                    return Err(PgOutputErrorKind::BadTupleMarker { tag: 'D', marker }.into());
                }
                read_tuple(&mut f, rel, old_kind(marker), scratch, &mut vals)?;
                (vals.len(), true, false)
            }
        };
        f.end()?;
        let scratch = scratch.as_str();
        let mut cols: Vec<Column<'_>> = recycle(std::mem::take(columns));
        cols.extend(vals.iter().map(|&v| column(rel, v, scratch)));
        *values = recycle(vals);
        if *skipping {
            *columns = recycle(cols);
            return Ok(None);
        }
        let (old, new) = cols.split_at(split);
        let change = Change {
            action: tag as char,
            schema: &rel.schema,
            table: &rel.table,
            pk: rel.key.as_deref(),
            columns: has_new.then_some(new),
            identity: has_old.then_some(old),
            key_from_stream: rel.key.is_some(),
            lsn: None,
        };
        let out = builder.push_change(seq, &change).map_err(Fail::Builder);
        *columns = recycle(cols);
        out
    }
}

/// Two chunks filled by one message (a multi-table truncate with chunks of one change): one
/// batch holding both, its changes summed. Only unpositioned chunks fill inside a message.
fn merge_chunks(first: Option<Batch>, next: Batch) -> Option<Batch> {
    match first {
        None => Some(next),
        Some(a) => {
            let envelopes: std::sync::Arc<[lanestream::Envelope]> =
                a.envelopes.iter().chain(next.envelopes.iter()).cloned().collect();
            Some(Batch { position: None, changes: a.changes + next.changes, offset: a.offset, envelopes })
        }
    }
}

#[cfg(test)]
mod tests;
