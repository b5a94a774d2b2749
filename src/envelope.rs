//! [`Envelope`]: one document change, and its [`Op`].

use std::sync::Arc;

use bytes::Bytes;

use crate::name::IndexName;
use crate::position::Position;
use crate::relation::Relation;

/// What a change does to its document.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum Op {
    /// Insert or replace the document with this id.
    Upsert,
    /// Remove the document with this id.
    Delete,
    /// Empty the whole index; the envelope's id and document are empty.
    Truncate,
    /// The index's rows come again ("re-sync", as Fivetran and Airbyte call a table's reload):
    /// what the sink holds of it may be stale, so empty it, and backfill it. A source sends it
    /// when the index's table rejoined what it publishes (a PostgreSQL table removed from the
    /// publication and added again, or dropped and created again, or its row filter or
    /// column list changed): changes made meanwhile never reached the stream. The id and
    /// document are empty, as for [`Op::Truncate`].
    ///
    /// A sink behind a sink engine ([`Pipeline`](crate::pipeline::Pipeline),
    /// [`run_sink`](crate::pipeline::run_sink)) never sees it: the engine hands the sink an
    /// [`Op::Truncate`] in its place and, in the same commit, makes a backfill of the index
    /// owed ([`SinkState::resync`](crate::pipeline::SinkState::resync), P2). A consumer of a
    /// lane without an engine empties the index and asks for its backfill itself.
    Resync,
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
///     relation: None,
///     old_id: None,
///     unchanged: Vec::new(),
/// };
/// assert_eq!(e.op, Op::Upsert);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Envelope {
    /// The index the document belongs to.
    pub index: IndexName,
    /// The document's id within its index (for PostgreSQL input: the primary-key values joined
    /// with `:`). Empty for [`Op::Truncate`] and [`Op::Resync`].
    pub id: String,
    /// What the change does.
    pub op: Op,
    /// The position of the change's transaction; `None` for snapshot (backfill) rows.
    pub position: Option<Position>,
    /// The document bytes (for PostgreSQL input, the row as a JSON object). Empty for deletes and
    /// truncates unless the source sent the old row.
    ///
    /// Serde: in human-readable formats (JSON) a UTF-8 document is a string and anything else an
    /// array of byte values; in binary formats, bytes. Deserialization accepts all three.
    #[cfg_attr(feature = "serde", serde(with = "document_serde"))]
    pub document: Bytes,
    /// The time end-to-end latency is measured from, in microseconds since the Unix epoch, if the
    /// builder recorded it: when the envelope was built, or (a database source) its transaction's
    /// commit time. Every envelope of one transaction carries the same value.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub built_at_micros: Option<u64>,
    /// The shape of the change's table: its name, its columns with their types, which columns
    /// make [`id`](Self::id) ([`Relation`]). A source shares one `Arc` between the changes of one
    /// shape (a reference count per envelope, no allocation); a relation that differs (`!=`) from
    /// the one before for the same [`Relation::id`] is a new shape (DDL: a column added, dropped,
    /// renamed or retyped; a table renamed), in order with the changes. Compare by value: a batch
    /// decoded from the wire ([`codec`](crate::codec)) has `Arc`s of its own. `None` when the
    /// source gives no shape (a hand-built envelope, a source that does not know it).
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub relation: Option<Arc<Relation>>,
    /// For an [`Op::Upsert`] that moves a row from another id (an update that changed the
    /// row's key): that old id. The row's values the document leaves out
    /// ([`unchanged`](Self::unchanged)) are the old row's; an [`Op::Delete`] of the old id
    /// follows in the same batch. `None` otherwise.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub old_id: Option<String>,
    /// For a **partial update** (an [`Op::Upsert`] whose document leaves out values the source
    /// did not send because they did not change, e.g. PostgreSQL's unchanged TOASTed values):
    /// the names of the columns it leaves out, in the table's order. A sink keeps those values
    /// from the row it holds (at [`old_id`](Self::old_id) if set, else at `id`) and takes every
    /// other column from the document. Empty for a whole row (replace what is held).
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Vec::is_empty"))]
    pub unchanged: Vec<String>,
}

impl Envelope {
    /// Whether this is a partial update: its document leaves out the columns named in
    /// [`unchanged`](Self::unchanged).
    pub fn is_partial(&self) -> bool {
        !self.unchanged.is_empty()
    }
}

/// Serde for [`Envelope::document`]: a string when the format is human-readable and the bytes are
/// UTF-8 (so JSON output shows the document), bytes otherwise.
#[cfg(feature = "serde")]
mod document_serde {
    use std::fmt;

    use bytes::Bytes;
    use serde::de::{self, SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(doc: &Bytes, s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(doc) {
            Ok(text) if s.is_human_readable() => s.serialize_str(text),
            _ => s.serialize_bytes(doc),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        struct Document;

        impl<'de> Visitor<'de> for Document {
            type Value = Bytes;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a document as a string, bytes, or an array of byte values")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Bytes, E> {
                Ok(Bytes::copy_from_slice(v.as_bytes()))
            }

            fn visit_string<E: de::Error>(self, v: String) -> Result<Bytes, E> {
                Ok(Bytes::from(v))
            }

            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Bytes, E> {
                Ok(Bytes::copy_from_slice(v))
            }

            fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
                Ok(Bytes::from(v))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bytes, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(b) = seq.next_element::<u8>()? {
                    out.push(b);
                }
                Ok(Bytes::from(out))
            }
        }

        d.deserialize_any(Document)
    }
}

#[cfg(all(test, feature = "serde"))]
mod tests {
    use super::*;

    fn envelope(document: Bytes) -> Envelope {
        Envelope {
            index: IndexName::new("public_users").unwrap(),
            id: "1".into(),
            op: Op::Upsert,
            position: Some(Position(9)),
            document,
            built_at_micros: None,
            relation: None,
            old_id: None,
            unchanged: Vec::new(),
        }
    }

    #[test]
    fn json_shows_a_utf8_document_as_a_string_and_round_trips() {
        let e = envelope(Bytes::from_static(r#"{"id":1,"name":"Zoë"}"#.as_bytes()));
        let json = serde_json::to_string(&e).unwrap();
        assert!(json.contains(r#""document":"{\"id\":1,\"name\":\"Zoë\"}""#), "{json}");
        assert!(json.contains(r#""op":"upsert""#), "{json}");
        assert_eq!(serde_json::from_str::<Envelope>(&json).unwrap(), e);
    }

    #[test]
    fn json_keeps_a_non_utf8_document_as_byte_values() {
        let e = envelope(Bytes::from_static(&[0xff, 0x00, 0x7f]));
        let json = serde_json::to_string(&e).unwrap();
        assert!(json.contains(r#""document":[255,0,127]"#), "{json}");
        assert_eq!(serde_json::from_str::<Envelope>(&json).unwrap(), e);
    }
}
