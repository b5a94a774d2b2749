//! The reader's one JSON parser: a line into its [`Line`], in one pass, without a value tree.
//!
//! It reads a line as serde_json reads it into the fields of a [`Line`] (values kept as their
//! raw text, `columns` and `identity` as lists of `{"name":…,"value":…}`, `pk` as a list
//! of `{"name":…}`, a list of objects also given as a list of arrays `["name", value]`, every
//! other member skipped): the same lines accepted with the same fields, the same lines refused
//! with the same error, at the same byte (the tests check it against serde_json on the capture,
//! the fuzz corpus and generated lines). The tokens are [`json`](super::json)'s.
//!
//! For speed it reads what wal2json writes first: a key is told by its first letters and matched
//! as a whole token (`"columns"`), and a column or `pk` object written exactly as wal2json
//! writes it (`{"name":"…","type":"…","value":…}`, no whitespace) by fixed-token compares; any
//! other object goes through the member loop, with the same result.

use std::borrow::Cow;

use super::error::Wal2JsonErrorKind;
use super::json::{reason, Json, Scan, Stop};
use crate::batch::{BuildErrorKind, Column, Key};

/// The fields of one line that the reader uses, as this parser reads them: `action`, `xid`,
/// `lsn`, `schema` and `table` as their raw JSON text, checked only by the actions that use them
/// (a `B` with `"lsn":5` is fine); `columns`, `identity` and `pk` must have their shape on every
/// line. Every field is `Some` when present, even as `null`.
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

/// Reads `text` (which starts like a JSON object) into `line` (which must come in empty).
/// `line` is meaningful only on `Ok`.
pub(super) fn parse_into<'a>(text: &'a str, line: &mut Line<'a>) -> Result<(), Wal2JsonErrorKind> {
    let mut s = Json::new(text);
    match s.line(line) {
        Ok(()) => Ok(()),
        Err(Stop) => Err(error(text, &s)),
    }
}

/// The error of a scan that stopped.
#[cold]
fn error(text: &str, s: &Json<'_>) -> Wal2JsonErrorKind {
    let Some(stopped) = s.stopped else {
        return Wal2JsonErrorKind::Malformed { offset: s.at, reason: reason::INVALID_JSON };
    };
    let explained = if stopped.data { explain(text).map(Wal2JsonErrorKind::Build) } else { None };
    explained.unwrap_or(Wal2JsonErrorKind::Malformed { offset: stopped.offset, reason: stopped.reason })
}

/// The object keys the scanner tells apart (any other is [`Field::Other`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Action,
    Xid,
    Lsn,
    Schema,
    Table,
    Columns,
    Identity,
    Pk,
    Name,
    Value,
    Other,
}

impl Field {
    fn of(key: &str) -> Field {
        match key {
            "action" => Field::Action,
            "xid" => Field::Xid,
            "lsn" => Field::Lsn,
            "schema" => Field::Schema,
            "table" => Field::Table,
            "columns" => Field::Columns,
            "identity" => Field::Identity,
            "pk" => Field::Pk,
            "name" => Field::Name,
            "value" => Field::Value,
            _ => Field::Other,
        }
    }
}

/// Sets a field read once: a field given twice stops the scan, as serde_json stops.
#[inline(always)]
fn once<'a, T>(
    s: &mut Json<'a>,
    slot: &mut Option<T>,
    read: impl FnOnce(&mut Json<'a>) -> Scan<T>,
) -> Scan<()> {
    if slot.is_some() {
        return Err(duplicate(s));
    }
    s.colon()?;
    *slot = Some(read(s)?);
    Ok(())
}

/// A field given twice (the scan just after its key): a data error where serde_json places it,
/// once the object's end is looked for.
#[cold]
fn duplicate(s: &mut Json<'_>) -> Stop {
    if s.ws_peek() == Some(b'}') {
        s.at += 1;
    }
    s.data(reason::DUPLICATE_FIELD)
}

impl<'a> Json<'a> {
    /// The line's object, then nothing but whitespace. (The member loop of
    /// [`members`](Self::members), written out: this is the loop every line goes through.)
    fn line(&mut self, line: &mut Line<'a>) -> Scan<()> {
        self.ws();
        // The caller checked that the line starts with `{`.
        self.at += 1;
        let mut first = true;
        while self.next_key(first)? {
            first = false;
            match self.key()? {
                Field::Action => once(self, &mut line.action, Json::raw_value)?,
                Field::Xid => once(self, &mut line.xid, Json::raw_value)?,
                Field::Lsn => once(self, &mut line.lsn, Json::raw_value)?,
                Field::Schema => once(self, &mut line.schema, Json::raw_value)?,
                Field::Table => once(self, &mut line.table, Json::raw_value)?,
                Field::Columns => once(self, &mut line.columns, Json::columns)?,
                Field::Identity => once(self, &mut line.identity, Json::columns)?,
                Field::Pk => once(self, &mut line.pk, Json::keys)?,
                Field::Name | Field::Value | Field::Other => {
                    self.colon()?;
                    self.skip_value()?;
                }
            }
        }
        self.at += 1;
        match self.ws_peek() {
            Some(_) => Err(self.at_next(reason::TRAILING_CHARACTERS)),
            None => Ok(()),
        }
    }

    /// An object's members after its `{`, each handed to `member` at its `:`, then its `}`.
    #[inline(always)]
    fn members(&mut self, mut member: impl FnMut(&mut Self, Field) -> Scan<()>) -> Scan<()> {
        let mut first = true;
        while self.next_key(first)? {
            first = false;
            let field = self.key()?;
            member(self, field)?;
        }
        self.at += 1;
        Ok(())
    }

    /// An object key (its opening quote next), as the field it names. A key written as wal2json
    /// writes it is told by its first letters and matched whole; any other is read as text.
    #[inline(always)]
    fn key(&mut self) -> Scan<Field> {
        let rest = self.text.as_bytes().get(self.at..).unwrap_or_default();
        // Each arm compares with a literal, so that the compare is inlined at its length.
        let whole = |token: &[u8], field| rest.starts_with(token).then_some((token.len(), field));
        let known = match rest.get(1..3) {
            Some([b'a', _]) => whole(b"\"action\"", Field::Action),
            Some([b'x', _]) => whole(b"\"xid\"", Field::Xid),
            Some([b'l', _]) => whole(b"\"lsn\"", Field::Lsn),
            Some([b's', _]) => whole(b"\"schema\"", Field::Schema),
            Some([b't', b'a']) => whole(b"\"table\"", Field::Table),
            Some([b't', b'i']) => whole(b"\"timestamp\"", Field::Other),
            Some([b't', b'y']) => whole(b"\"type\"", Field::Other),
            Some([b'c', _]) => whole(b"\"columns\"", Field::Columns),
            Some([b'i', _]) => whole(b"\"identity\"", Field::Identity),
            Some([b'p', _]) => whole(b"\"pk\"", Field::Pk),
            Some([b'n', b'a']) => whole(b"\"name\"", Field::Name),
            Some([b'n', b'e']) => whole(b"\"nextlsn\"", Field::Other),
            Some([b'v', _]) => whole(b"\"value\"", Field::Value),
            _ => None,
        };
        if let Some((len, field)) = known {
            self.at += len;
            return Ok(field);
        }
        self.at += 1;
        Ok(Field::of(&self.text_str()?))
    }

    /// A string value read as text (after whitespace).
    fn text_value(&mut self) -> Scan<Cow<'a, str>> {
        match self.ws_peek() {
            Some(b'"') => {
                self.at += 1;
                self.text_str()
            }
            Some(_) => Err(self.wrong_type()),
            None => Err(self.at_next(reason::EOF_VALUE)),
        }
    }

    /// A list of objects (`columns`, `identity`, `pk`), each read by `element`.
    #[inline(always)]
    fn list<T>(&mut self, capacity: usize, mut element: impl FnMut(&mut Self) -> Scan<T>) -> Scan<Vec<T>> {
        match self.ws_peek() {
            Some(b'[') => self.at += 1,
            Some(_) => return Err(self.wrong_type()),
            None => return Err(self.at_next(reason::EOF_VALUE)),
        }
        let mut out = Vec::with_capacity(capacity);
        let mut first = true;
        while self.next_element(first)? {
            first = false;
            out.push(element(self)?);
        }
        self.at += 1;
        Ok(out)
    }

    /// `columns` / `identity`: `[{"name":…,"value":…,…},…]`.
    fn columns(&mut self) -> Scan<Vec<Column<'a>>> {
        self.list(8, |s| match s.written_column() {
            Some(column) => Ok(column),
            None => s.column(),
        })
    }

    /// `pk`: `[{"name":…,…},…]`.
    fn keys(&mut self) -> Scan<Vec<Key<'a>>> {
        self.list(2, |s| match s.written_key() {
            Some(key) => Ok(key),
            None => s.key_object(),
        })
    }

    /// One column: an object with a string `name` and a `value` (any other member skipped), or
    /// an array `[name, value]`.
    fn column(&mut self) -> Scan<Column<'a>> {
        match self.peek() {
            Some(b'{') => {
                self.at += 1;
                let (mut name, mut value) = (None, None);
                self.members(|s, field| match field {
                    Field::Name => once(s, &mut name, Json::text_value),
                    Field::Value => once(s, &mut value, Json::raw_value),
                    _ => {
                        s.colon()?;
                        s.skip_value()
                    }
                })?;
                match (name, value) {
                    (Some(name), Some(value)) => Ok(Column { name, value }),
                    _ => Err(self.data(reason::INVALID_JSON)),
                }
            }
            Some(b'[') => {
                self.at += 1;
                let name = self.array_element(true, Json::text_value)?;
                let value = self.array_element(false, Json::raw_value)?;
                self.end_array()?;
                Ok(Column { name, value })
            }
            _ => Err(self.wrong_type()),
        }
    }

    /// One `pk` element: an object with a string `name` (any other member skipped), or an array
    /// `[name]`.
    fn key_object(&mut self) -> Scan<Key<'a>> {
        match self.peek() {
            Some(b'{') => {
                self.at += 1;
                let mut name = None;
                self.members(|s, field| match field {
                    Field::Name => once(s, &mut name, Json::text_value),
                    _ => {
                        s.colon()?;
                        s.skip_value()
                    }
                })?;
                match name {
                    Some(name) => Ok(Key { name }),
                    None => Err(self.data(reason::INVALID_JSON)),
                }
            }
            Some(b'[') => {
                self.at += 1;
                let name = self.array_element(true, Json::text_value)?;
                self.end_array()?;
                Ok(Key { name })
            }
            _ => Err(self.wrong_type()),
        }
    }

    /// The next element of an array read as a struct: missing (its `]` next) is a data error.
    fn array_element<T>(&mut self, first: bool, read: impl FnOnce(&mut Self) -> Scan<T>) -> Scan<T> {
        if self.next_element(first)? {
            return read(self);
        }
        self.at += 1;
        Err(self.data(reason::INVALID_JSON))
    }

    /// The start of a column or key object as wal2json writes it, `{"name":"…","type":"…"` with
    /// no whitespace and a name without escapes: the name. `None` for any other shape (where the
    /// scan then stands is the caller's to undo).
    #[inline(always)]
    fn written_name_and_type(&mut self) -> Option<&'a str> {
        let bytes = self.text.as_bytes();
        if bytes.get(self.at..self.at + 9)? != b"{\"name\":\"" {
            return None;
        }
        self.at += 9;
        let start = self.at;
        if self.skip_str().ok()? {
            return None;
        }
        // Both ends are next to an ASCII quote, so they are char boundaries.
        let name = self.text.get(start..self.at - 1)?;
        if bytes.get(self.at..self.at + 9)? != b",\"type\":\"" {
            return None;
        }
        self.at += 9;
        self.skip_str().ok()?;
        Some(name)
    }

    /// One column object as wal2json writes it, `{"name":"…","type":"…","value":…}` with no
    /// whitespace and a name without escapes; `None` (nothing consumed) for any other shape,
    /// which [`column`](Self::column) then reads.
    #[inline]
    fn written_column(&mut self) -> Option<Column<'a>> {
        let from = self.at;
        let column = (|| {
            let name = self.written_name_and_type()?;
            if self.text.as_bytes().get(self.at..self.at + 9)? != b",\"value\":" {
                return None;
            }
            self.at += 9;
            let value = self.raw_value().ok()?;
            if self.peek()? != b'}' {
                return None;
            }
            self.at += 1;
            Some(Column { name: Cow::Borrowed(name), value })
        })();
        if column.is_none() {
            self.at = from;
        }
        column
    }

    /// One key object as wal2json writes it, `{"name":"…","type":"…"}` with no whitespace and a
    /// name without escapes; `None` (nothing consumed) for any other shape, which
    /// [`key_object`](Self::key_object) then reads.
    #[inline]
    fn written_key(&mut self) -> Option<Key<'a>> {
        let from = self.at;
        let key = (|| {
            let name = self.written_name_and_type()?;
            if self.peek()? != b'}' {
                return None;
            }
            self.at += 1;
            Some(Key { name: Cow::Borrowed(name) })
        })();
        if key.is_none() {
            self.at = from;
        }
        key
    }
}

// --- what a data error was about ----------------------------------------------------------------

/// Why a line that stopped on a data error (a value of the wrong type, a field twice or missing)
/// did, as serde_json's reader explained it: the first of `columns`, `identity` and `pk` (in that
/// order, wherever they stand) that is not a list of objects with a string `name` (and, for
/// columns, a `value`); `None` when they all are, or when the line is not well formed past the
/// error (then the error stands as it is).
#[cold]
fn explain(text: &str) -> Option<BuildErrorKind> {
    let mut s = Json::new(text);
    let [columns, identity, pk] = s.shape().ok()?;
    let is_str = |v: &str| v.starts_with('"');
    for (field, raw) in [("columns", columns), ("identity", identity)] {
        let Some(raw) = raw else { continue };
        let Some(elements) = objects(raw) else {
            return Some(BuildErrorKind::WrongType { field, expected: "an array of column objects" });
        };
        for (name, value) in elements {
            let missing = |what| BuildErrorKind::MissingField { action: '?', field: what, hint: "" };
            match (name, value) {
                (None, _) => return Some(missing("a column name")),
                (_, None) => return Some(missing("a column value")),
                (Some(name), _) if !is_str(name) => {
                    return Some(BuildErrorKind::WrongType { field, expected: "columns with a string name" })
                }
                _ => {}
            }
        }
    }
    let named = objects(pk?).is_some_and(|keys| keys.iter().all(|(name, _)| name.is_some_and(is_str)));
    (!named)
        .then_some(BuildErrorKind::WrongType { field: "pk", expected: "an array of {\"name\":…} objects" })
}

/// The elements of a list of objects as their `name` and `value` members' raw text; `None` if
/// `raw` is not a list of objects, or an object has either member twice.
fn objects(raw: &str) -> Option<Vec<(Option<&str>, Option<&str>)>> {
    let mut s = Json::new(raw);
    if s.peek() != Some(b'[') {
        return None;
    }
    s.list(4, |s| {
        if s.peek() != Some(b'{') {
            return Err(Stop);
        }
        s.at += 1;
        let (mut name, mut value) = (None, None);
        s.members(|s, field| match field {
            Field::Name => once(s, &mut name, Json::raw_value),
            Field::Value => once(s, &mut value, Json::raw_value),
            _ => {
                s.colon()?;
                s.skip_value()
            }
        })?;
        Ok((name, value))
    })
    .ok()
}

impl<'a> Json<'a> {
    /// The line read only for the raw text of its `columns`, `identity` and `pk` (any other
    /// member skipped); a syntax error, or one of them twice, stops it.
    fn shape(&mut self) -> Scan<[Option<&'a str>; 3]> {
        let mut raw = [None; 3];
        self.ws();
        self.at += 1;
        self.members(|s, field| {
            let slot = match field {
                Field::Columns => &mut raw[0],
                Field::Identity => &mut raw[1],
                Field::Pk => &mut raw[2],
                _ => {
                    s.colon()?;
                    return s.skip_value();
                }
            };
            once(s, slot, Json::raw_value)
        })?;
        match self.ws_peek() {
            Some(_) => Err(Stop),
            None => Ok(raw),
        }
    }
}
