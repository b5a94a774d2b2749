//! A message's fields ([`Fields`], big-endian as the protocol has them), and what the decoder
//! reads with them: a relation's shape ([`read_relation`]) and a tuple's values ([`read_tuple`]),
//! typed by the one value codec ([`crate::batch`]'s `value.rs`).

use std::borrow::Cow;
use std::sync::Arc;

use ahash::AHashMap as HashMap;

use crate::batch::value::{json_value, plain, type_name, JsonType, Val};
use crate::batch::{Column, Key};

use super::error::PgOutputErrorKind;

/// One column of a relation, as its Relation message gives it.
#[derive(Debug)]
pub(super) struct RelColumn {
    pub(super) name: String,
    /// The name needs no JSON escaping (then documents borrow it).
    pub(super) plain: bool,
    pub(super) type_oid: u32,
    /// How its values become JSON (from `type_oid`).
    pub(super) json: JsonType,
    /// Flagged as part of the replica identity (pgoutput's flag 1).
    pub(super) key: bool,
}

/// A relation's shape, from its last Relation message.
#[derive(Debug)]
pub(super) struct Relation {
    /// `schema.table`, for errors.
    pub(super) name: String,
    pub(super) schema: String,
    pub(super) table: String,
    pub(super) columns: Vec<RelColumn>,
    /// The key the builder gets with each change: the flagged columns, except under `REPLICA
    /// IDENTITY FULL` (every column is flagged there): `None`, so the builder asks its key
    /// look-up for the primary key.
    pub(super) key: Option<Vec<Key<'static>>>,
    /// The shape the envelopes carry ([`lanestream::Relation`]): one `Arc` per Relation message.
    pub(super) shape: Arc<lanestream::Relation>,
}

/// Reads a message's fields, big-endian as the protocol has them.
pub(super) struct Fields<'m> {
    pub(super) buf: &'m [u8],
    pub(super) at: usize,
    pub(super) tag: char,
    /// The whole message when it is valid UTF-8 (checked once for a change, whose values are
    /// then slices of it, see [`Fields::text`]).
    pub(super) text: Option<&'m str>,
}

// The readers are inlined into the per-value loop, their errors built out of line: a
// `PgOutputErrorKind` is large, and building (or dropping) one on the way costs more than the read.
impl<'m> Fields<'m> {
    #[inline(always)]
    pub(super) fn take(&mut self, n: usize, field: &'static str) -> Result<&'m [u8], PgOutputErrorKind> {
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
    pub(super) fn truncated(&self, field: &'static str) -> PgOutputErrorKind {
        PgOutputErrorKind::Truncated { tag: self.tag, field, at: self.at, len: self.buf.len() }
    }

    #[inline(always)]
    pub(super) fn u8(&mut self, field: &'static str) -> Result<u8, PgOutputErrorKind> {
        Ok(self.take(1, field)?[0])
    }

    #[inline(always)]
    pub(super) fn u16(&mut self, field: &'static str) -> Result<u16, PgOutputErrorKind> {
        let b = self.take(2, field)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    #[inline(always)]
    pub(super) fn u32(&mut self, field: &'static str) -> Result<u32, PgOutputErrorKind> {
        let b = self.take(4, field)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(super) fn u64(&mut self, field: &'static str) -> Result<u64, PgOutputErrorKind> {
        let b = self.take(8, field)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    /// `n` bytes as text ([`PgOutputErrorKind::NotUtf8`] when they are not UTF-8).
    #[inline(always)]
    pub(super) fn text(&mut self, n: usize, field: &'static str) -> Result<&'m str, PgOutputErrorKind> {
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
    pub(super) fn count16(&mut self, field: &'static str) -> Result<usize, PgOutputErrorKind> {
        let v = self.u16(field)? as i16;
        usize::try_from(v).map_err(|_| PgOutputErrorKind::Negative { field, value: v.into() })
    }

    /// A signed 32-bit count or length, refused when negative.
    #[inline(always)]
    pub(super) fn count32(&mut self, field: &'static str) -> Result<usize, PgOutputErrorKind> {
        let v = self.u32(field)? as i32;
        usize::try_from(v).map_err(|_| PgOutputErrorKind::Negative { field, value: v.into() })
    }

    /// A NUL-terminated string.
    pub(super) fn cstr(&mut self, field: &'static str) -> Result<&'m str, PgOutputErrorKind> {
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

    pub(super) fn end(&self) -> Result<(), PgOutputErrorKind> {
        match self.buf.len() - self.at.min(self.buf.len()) {
            0 => Ok(()),
            extra => Err(PgOutputErrorKind::TrailingBytes { tag: self.tag, extra }),
        }
    }
}

/// What a tuple is read into.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum TupleKind {
    /// A new row or a whole old row (`N`, `O`): every column.
    Row,
    /// An old key (`K`): only the key columns.
    Key,
}

/// Reads a tuple of `rel`, appending to `out` (column index, value): NULL as `null`, unchanged
/// TOASTed values (`u`) left out and their column indexes appended to `unchanged`, strings
/// written into `scratch`.
pub(super) fn read_tuple<'m>(
    f: &mut Fields<'m>,
    rel: &Relation,
    kind: TupleKind,
    scratch: &mut String,
    out: &mut Vec<(usize, Val<'m>)>,
    unchanged: &mut Vec<usize>,
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
        let Some(value) = value else {
            unchanged.push(i);
            continue;
        };
        if kind == TupleKind::Key && !col.key {
            continue;
        }
        out.push((i, value));
    }
    Ok(())
}

/// The builder's column of a value read by [`read_tuple`].
pub(super) fn column<'a>(rel: &'a Relation, (i, v): (usize, Val<'a>), scratch: &'a str) -> Column<'a> {
    let name = match rel.columns.get(i) {
        Some(col) if col.plain => Cow::Borrowed(col.name.as_str()),
        Some(col) => Cow::Owned(col.name.clone()),
        None => Cow::Borrowed(""),
    };
    let value = match v {
        Val::Text(t) => t,
        Val::Scratch(a, b) => scratch.get(a..b).unwrap_or("null"),
    };
    Column { name, value }
}

/// A Relation message's fields (after its tag): the relation's OID and shape. Column types are
/// named from `types` (the Type messages read so far, for types not built in) or PostgreSQL's
/// built-in types.
pub(super) fn read_relation(
    f: &mut Fields<'_>,
    types: &HashMap<u32, String>,
) -> Result<(u32, Relation), PgOutputErrorKind> {
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
        let typmod = f.u32("column type modifier")? as i32;
        columns.push((
            RelColumn {
                name: name.to_owned(),
                plain: plain(name),
                type_oid,
                json: JsonType::of(type_oid),
                key: flags & 1 != 0,
            },
            typmod,
        ));
    }
    f.end()?;
    let shape = Arc::new(lanestream::Relation {
        id: oid,
        namespace: schema.to_owned(),
        name: table.to_owned(),
        columns: columns
            .iter()
            .map(|(c, typmod)| lanestream::RelationColumn {
                name: c.name.clone(),
                type_id: c.type_oid,
                type_name: types.get(&c.type_oid).cloned().unwrap_or_else(|| type_name(c.type_oid)),
                type_modifier: *typmod,
            })
            .collect(),
        // The flagged columns (the identity), as the builder keys by them; under `FULL` the
        // builder sets the key it looked up.
        key: columns.iter().enumerate().filter(|(_, (c, _))| c.key).map(|(i, _)| i as u16).collect(),
    });
    let columns: Vec<RelColumn> = columns.into_iter().map(|(c, _)| c).collect();
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
            shape,
        },
    ))
}
