//! [`Envelope`]: one document change, and its [`Op`].

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::{IndexName, Position};

/// What a change does to its document.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Insert or replace the document with this id.
    Upsert,
    /// Remove the document with this id.
    Delete,
    /// Empty the whole index; the envelope's id and document are empty.
    Truncate,
}

/// One document change: which index, which document, what happens to it, and the document itself.
///
/// `document` is [`Bytes`], so a parser can slice it out of its input buffer and every lane and
/// redelivery shares it without copying.
///
/// ```
/// use bytes::Bytes;
/// use lanestream::{Envelope, IndexName, Op, Position};
/// let e = Envelope {
///     index: IndexName::new("public_users").unwrap(),
///     id: "42".into(),
///     op: Op::Upsert,
///     position: Some(Position(7)),
///     document: Bytes::from_static(br#"{"id":42}"#),
///     built_at_micros: None,
/// };
/// assert_eq!(e.op, Op::Upsert);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// The index the document belongs to.
    pub index: IndexName,
    /// The document's id within its index (for PostgreSQL input: the primary-key values joined
    /// with `:`). Empty for [`Op::Truncate`].
    pub id: String,
    /// What the change does.
    pub op: Op,
    /// The position of the change's transaction; `None` for snapshot (backfill) rows.
    pub position: Option<Position>,
    /// The document bytes (for PostgreSQL input, the row as a JSON object). Empty for deletes and
    /// truncates unless the source sent the old row.
    pub document: Bytes,
    /// When the envelope was built, in microseconds since the Unix epoch, if the builder recorded
    /// it (used to measure end-to-end latency).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub built_at_micros: Option<u64>,
}
