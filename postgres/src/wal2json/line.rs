//! A wal2json line into the builder: [`TransactionBuilder::push_line`], the reader's way in.

use std::borrow::Cow;

use lanestream::{Batch, Position};

use super::error::{Wal2JsonError, Wal2JsonErrorKind};
use super::parse::{self, Line};
use crate::batch::value::json_str;
use crate::batch::{BuildError, BuildErrorKind, Change, Commit, TransactionBuilder};

/// Parses one line into its [`Line`].
pub(super) fn parse_line(line: &[u8]) -> Result<Line<'_>, Wal2JsonErrorKind> {
    parse::parse(object_text(line)?)
}

/// The line as text, if it is UTF-8 and starts like a JSON object.
pub(super) fn object_text(line: &[u8]) -> Result<&str, Wal2JsonErrorKind> {
    // simdutf8's fast check; std's names where invalid UTF-8 starts.
    let text = simdutf8::basic::from_utf8(line)
        .or_else(|_| std::str::from_utf8(line))
        .map_err(|e| Wal2JsonErrorKind::Malformed { offset: e.valid_up_to(), reason: "not valid UTF-8" })?;
    let start = text.find(|c| !matches!(c, ' ' | '\t' | '\n' | '\r')).unwrap_or(text.len());
    if !text[start..].starts_with('{') {
        return Err(Wal2JsonErrorKind::Malformed { offset: start, reason: "expected a JSON object" });
    }
    Ok(text)
}

/// A string field (`action`, `schema`, `table`, `lsn`), unescaped.
fn string_field<'a>(
    raw: Option<&'a str>,
    action: char,
    field: &'static str,
    hint: &'static str,
) -> Result<Cow<'a, str>, BuildErrorKind> {
    // `let … else` rather than `ok_or`: the error is built (and dropped) only when it is returned,
    // which shows on a per-line path.
    let Some(raw) = raw else { return Err(BuildErrorKind::MissingField { action, field, hint }) };
    match json_str(raw) {
        Some(s) => Ok(s),
        None => {
            let expected = if raw.starts_with('"') { "a valid string" } else { "a string" };
            Err(BuildErrorKind::WrongType { field, expected })
        }
    }
}

/// `xid` as a number; `None` when absent or null.
fn xid_field(raw: Option<&str>) -> Result<Option<u64>, BuildErrorKind> {
    match raw {
        None | Some("null") => Ok(None),
        // Only a JSON number of plain digits parses (not "7", 7.0 or -7).
        Some(text) => text
            .parse::<u64>()
            .map(Some)
            .map_err(|_| BuildErrorKind::WrongType { field: "xid", expected: "an unsigned integer" }),
    }
}

/// A line's error before the builder took it (it counts the line as a bad one of the open
/// transaction), or the builder's.
enum LineError {
    Line(Wal2JsonErrorKind),
    Built(BuildError),
}

impl From<Wal2JsonErrorKind> for LineError {
    fn from(kind: Wal2JsonErrorKind) -> Self {
        LineError::Line(kind)
    }
}

impl From<BuildErrorKind> for LineError {
    fn from(kind: BuildErrorKind) -> Self {
        LineError::Line(Wal2JsonErrorKind::Build(kind))
    }
}

impl From<BuildError> for LineError {
    fn from(e: BuildError) -> Self {
        LineError::Built(e)
    }
}

/// The wal2json reader's way in: lines.
impl TransactionBuilder {
    /// Feeds one wal2json format-version 2 line (without its newline; surrounding whitespace is
    /// allowed). `line_no` is used in errors only.
    ///
    /// Returns `Ok(Some(batch))` for a `C` line (the positioned batch of the transaction) and,
    /// with [`with_max_batch_changes`](Self::with_max_batch_changes), for the change line that
    /// fills a chunk (an unpositioned batch); `Ok(None)` for any other accepted line.
    ///
    /// # Errors
    /// A [`Wal2JsonError`] for `line_no` when the line is malformed or out of place; the builder
    /// stays usable (see the [module docs](crate::wal2json): a bad line inside a transaction makes
    /// the whole transaction fail at its `C`).
    pub fn push_line(&mut self, line_no: u64, line: &[u8]) -> Result<Option<Batch>, Wal2JsonError> {
        let pushed = match parse_line(line) {
            Ok(parsed) => self.apply(line_no, &parsed),
            Err(kind) => Err(LineError::Line(kind)),
        };
        pushed.map_err(|e| match e {
            LineError::Line(kind) => {
                self.skip_line(line_no);
                Wal2JsonError::new(line_no, kind)
            }
            LineError::Built(e) => e.into(),
        })
    }

    fn apply(&mut self, line_no: u64, f: &Line<'_>) -> Result<Option<Batch>, LineError> {
        let action = {
            let s = string_field(f.action, '?', "action", "")?;
            let mut chars = s.chars();
            match (chars.next(), chars.next()) {
                (Some(c @ ('B' | 'I' | 'U' | 'D' | 'T' | 'C' | 'M')), None) => c,
                _ => return Err(Wal2JsonErrorKind::UnknownAction(s.into_owned()).into()),
            }
        };
        match action {
            'M' => Ok(None),
            'B' => {
                let xid = xid_field(f.xid)?;
                // Only used to position chunks: an absent or invalid lsn is no error here.
                let begin_lsn = f.lsn.and_then(json_str).and_then(|l| Position::from_lsn(&l).ok());
                self.push_begin(line_no, xid, begin_lsn)?;
                Ok(None)
            }
            'C' => {
                let lsn = f.lsn.and_then(json_str);
                let position = string_field(f.lsn, 'C', "lsn", " (run wal2json with include-lsn=true)")
                    .and_then(|lsn| Position::from_lsn(&lsn).map_err(BuildErrorKind::BadLsn));
                let commit = Commit { position, lsn: lsn.as_deref(), xid: xid_field(f.xid) };
                Ok(self.push_commit(line_no, commit)?)
            }
            _ => {
                if self.open_since().is_none() {
                    return Err(BuildErrorKind::OutsideTransaction { action }.into());
                }
                let schema = string_field(f.schema, action, "schema", "")?;
                let table = string_field(f.table, action, "table", "")?;
                let change = Change {
                    action,
                    schema: &schema,
                    table: &table,
                    pk: f.pk.as_deref(),
                    columns: f.columns.as_deref(),
                    identity: f.identity.as_deref(),
                    key_from_stream: false,
                    relation: None,
                    unchanged: &[],
                    lsn: f.lsn,
                };
                Ok(self.push_change(line_no, &change)?)
            }
        }
    }
}
