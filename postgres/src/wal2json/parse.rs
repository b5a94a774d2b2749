//! A line into its [`Line`]: serde_json reads the fields the reader uses, values kept as their
//! raw text ([`RawValue`]) borrowed from the line, every other member skipped.
//!
//! `columns` and `identity` are lists of `{"name":…,"value":…}` objects and `pk` a list of
//! `{"name":…}` objects (each may also be given as an array in field order, `["name", value]`,
//! as serde's derived readers take it); any other member of them is skipped. serde_json refuses
//! a field given twice, and skips nested values with its recursion limit (no input exhausts the
//! stack).
//!
//! Errors: a line that is not well-formed JSON, or has a field twice, is
//! [`Wal2JsonErrorKind::Malformed`] at the byte serde_json names, with serde_json's message; a
//! well-formed line whose `columns`, `identity` or `pk` has the wrong shape is the builder's
//! [`BuildErrorKind::WrongType`] or [`BuildErrorKind::MissingField`] naming that field (found
//! by reading the line again, on the error path only).

use std::borrow::Cow;

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use super::error::Wal2JsonErrorKind;
use crate::batch::{BuildErrorKind, Column, Key};

/// The fields of one line that the reader uses: `action`, `xid`, `lsn`, `schema` and `table` as
/// their raw JSON text, checked only by the actions that use them (a `B` with `"lsn":5` is fine);
/// `columns`, `identity` and `pk` must have their shape on every line (`null` is not a list).
/// Every field is `Some` when present; a scalar even as `null`.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Line<'a> {
    pub(crate) action: Option<&'a str>,
    pub(crate) xid: Option<&'a str>,
    pub(crate) lsn: Option<&'a str>,
    pub(crate) schema: Option<&'a str>,
    pub(crate) table: Option<&'a str>,
    pub(crate) columns: Option<Vec<Column<'a>>>,
    pub(crate) identity: Option<Vec<Column<'a>>>,
    pub(crate) pk: Option<Vec<Key<'a>>>,
}

/// A field that is present is `Some`, `null` included (a plain `Option` would make it `None`).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A present scalar field as its raw text.
fn raw<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de str>, D::Error> {
    <&RawValue>::deserialize(d).map(|v| Some(v.get()))
}

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow, default, deserialize_with = "raw")]
    action: Option<&'a str>,
    #[serde(borrow, default, deserialize_with = "raw")]
    xid: Option<&'a str>,
    #[serde(borrow, default, deserialize_with = "raw")]
    lsn: Option<&'a str>,
    #[serde(borrow, default, deserialize_with = "raw")]
    schema: Option<&'a str>,
    #[serde(borrow, default, deserialize_with = "raw")]
    table: Option<&'a str>,
    #[serde(borrow, default, deserialize_with = "present")]
    columns: Option<Vec<WireColumn<'a>>>,
    #[serde(borrow, default, deserialize_with = "present")]
    identity: Option<Vec<WireColumn<'a>>>,
    #[serde(borrow, default, deserialize_with = "present")]
    pk: Option<Vec<WireKey<'a>>>,
}

#[derive(Deserialize)]
struct WireColumn<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow)]
    value: &'a RawValue,
}

#[derive(Deserialize)]
struct WireKey<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
}

fn columns(c: Option<Vec<WireColumn<'_>>>) -> Option<Vec<Column<'_>>> {
    c.map(|c| c.into_iter().map(|c| Column { name: c.name, value: c.value.get() }).collect())
}

/// Reads `text` (a JSON object's text) into its [`Line`].
pub(super) fn parse(text: &str) -> Result<Line<'_>, Wal2JsonErrorKind> {
    let l: Wire<'_> = serde_json::from_str(text).map_err(|e| error(text, &e))?;
    Ok(Line {
        action: l.action,
        xid: l.xid,
        lsn: l.lsn,
        schema: l.schema,
        table: l.table,
        columns: columns(l.columns),
        identity: columns(l.identity),
        pk: l.pk.map(|k| k.into_iter().map(|k| Key { name: k.name }).collect()),
    })
}

/// serde_json's error as the reader's: the misshapen field, or where and why it failed.
#[cold]
fn error(text: &str, e: &serde_json::Error) -> Wal2JsonErrorKind {
    let shape = if e.is_data() { shape_error(text) } else { None };
    shape.map(Wal2JsonErrorKind::Build).unwrap_or_else(|| Wal2JsonErrorKind::Malformed {
        offset: byte_offset(text, e.line(), e.column()),
        reason: reason(e),
    })
}

/// The byte offset of serde_json's 1-based line and column.
fn byte_offset(text: &str, line: usize, column: usize) -> usize {
    let line_start: usize = text.split_inclusive('\n').take(line.saturating_sub(1)).map(str::len).sum();
    (line_start + column.saturating_sub(1)).min(text.len())
}

/// serde_json's description of an error, as one of its fixed messages
/// ([`Wal2JsonErrorKind::Malformed`] holds a `&'static str`).
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

/// The elements of a list of objects; `None` if `raw` is not one.
fn objects(raw: &RawValue) -> Option<Vec<ElementShape<'_>>> {
    let elements: Vec<&RawValue> = serde_json::from_str(raw.get()).ok()?;
    elements
        .into_iter()
        .map(|e| e.get().starts_with('{').then(|| serde_json::from_str(e.get()).ok()).flatten())
        .collect()
}

/// Why a well-formed line did not deserialize: the first of `columns`, `identity` and `pk` (in
/// that order) that is not a list of objects with a string `name` (and, for columns, a
/// `value`); `None` when they all are (e.g. a duplicate key: then serde_json's error stands).
fn shape_error(text: &str) -> Option<BuildErrorKind> {
    let shape: Shape<'_> = serde_json::from_str(text).ok()?;
    let is_str = |v: &RawValue| v.get().starts_with('"');
    for (field, raw) in [("columns", shape.columns), ("identity", shape.identity)] {
        let Some(raw) = raw else { continue };
        let Some(elements) = objects(raw) else {
            return Some(BuildErrorKind::WrongType { field, expected: "an array of column objects" });
        };
        for e in elements {
            let missing = |what| BuildErrorKind::MissingField { action: '?', field: what, hint: "" };
            match (e.name, e.value) {
                (None, _) => return Some(missing("a column name")),
                (_, None) => return Some(missing("a column value")),
                (Some(name), _) if !is_str(name) => {
                    return Some(BuildErrorKind::WrongType { field, expected: "columns with a string name" })
                }
                _ => {}
            }
        }
    }
    let named = objects(shape.pk?).is_some_and(|keys| keys.iter().all(|k| k.name.is_some_and(is_str)));
    (!named)
        .then_some(BuildErrorKind::WrongType { field: "pk", expected: "an array of {\"name\":…} objects" })
}
