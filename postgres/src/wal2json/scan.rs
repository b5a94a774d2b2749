//! The first path of [`parse_line_into`](super::parse_line_into): a single-pass scanner for
//! lines shaped as wal2json writes them, which builds the [`Line`] directly (no generic map
//! visiting, no value tree).
//!
//! It is a *partial* parser: it accepts a line only when the line is valid JSON and every part of
//! it is of the shape it knows (top-level values that are scalars or, for `columns`, `identity`
//! and `pk`, arrays of flat objects; names and keys without escapes; no field twice), and then
//! gives exactly the [`Line`] the generic path gives. Anything else — invalid JSON, a nested
//! value where a scalar is expected, an escaped key, a duplicate, a missing `name` — gives
//! `None`, and the line goes through the generic path, which reads it or names its error. So
//! the scanner never decides an error; the tests check that the reader agrees with serde_json
//! on every line of the capture, the fuzz corpus and generated lines.
//!
//! For speed it reads what wal2json writes first: a key is told by its first letters and matched
//! as a whole token (`"columns":`), and a column or `pk` object written exactly as wal2json
//! writes it (`{"name":"…","type":"…","value":…}`, no whitespace) by fixed-token compares; any
//! other object of the accepted shape goes through the generic member loop, with the same result.
//!
//! What it checks is the JSON grammar (RFC 8259) for what it accepts: strings without raw
//! control characters and with valid escapes (`\uXXXX` with four hex digits; lone surrogates
//! are accepted, as serde_json and sonic-rs accept them in a value they keep raw), numbers
//! `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, the literals, whitespace between tokens,
//! nothing after the object but whitespace. UTF-8 is checked by the caller (the input is a
//! `&str`). It never recurses, so no input can exhaust the stack.

use std::borrow::Cow;

use super::{Column, Key, Line, Raw};

/// The line as the generic path would read it, or `None` when the scanner does not accept it
/// (see the module docs).
#[cfg(test)]
pub(super) fn parse(text: &str) -> Option<Line<'_>> {
    let mut line = Line::default();
    parse_into(text, &mut line).then_some(line)
}

/// Reads `text` into `line` (which must come in empty): `true` when the scanner accepts the text
/// (see the module docs); when it does not, `line` holds whatever was read before it stopped.
pub(super) fn parse_into<'a>(text: &'a str, line: &mut Line<'a>) -> bool {
    let mut s = Scanner { text, at: 0 };
    if s.line(line).is_none() {
        return false;
    }
    s.ws();
    s.at == text.len()
}

struct Scanner<'a> {
    text: &'a str,
    /// The next byte to read.
    at: usize,
}

/// One string token: where its contents are (between the quotes) and whether it has escapes.
struct Str {
    start: usize,
    end: usize,
    escaped: bool,
}

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    /// Skips JSON whitespace.
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// The next token after whitespace, consumed.
    fn next_byte(&mut self) -> Option<u8> {
        self.ws();
        let b = self.peek()?;
        self.at += 1;
        Some(b)
    }

    fn expect(&mut self, want: u8) -> Option<()> {
        (self.next_byte()? == want).then_some(())
    }

    /// A string token (after whitespace), its escapes checked.
    fn string(&mut self) -> Option<Str> {
        self.expect(b'"')?;
        let start = self.at;
        let escaped = self.string_body()?;
        Some(Str { start, end: self.at - 1, escaped })
    }

    /// The rest of a string token whose opening quote was just consumed, its escapes checked:
    /// whether it has escapes. Its contents end before `self.at - 1` (the closing quote).
    #[inline(always)]
    fn string_body(&mut self) -> Option<bool> {
        let bytes = self.text.as_bytes();
        let mut i = self.at;
        let mut escaped = false;
        loop {
            i += plain_run(bytes.get(i..)?);
            match *bytes.get(i)? {
                b'"' => {
                    self.at = i + 1;
                    return Some(escaped);
                }
                b'\\' => {
                    escaped = true;
                    match *bytes.get(i + 1)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i += 2,
                        b'u' if bytes.get(i + 2..i + 6)?.iter().all(u8::is_ascii_hexdigit) => i += 6,
                        _ => return None,
                    }
                }
                0..=0x1f => return None,
                _ => i += 1,
            }
        }
    }

    /// A string without escapes: its contents, borrowed.
    fn plain_string(&mut self) -> Option<&'a str> {
        let s = self.string()?;
        if s.escaped {
            return None;
        }
        // Both ends are next to an ASCII quote, so they are char boundaries.
        self.text.get(s.start..s.end)
    }

    /// A scalar value (string, number, `true`, `false`, `null`): its raw JSON text.
    #[inline(always)]
    fn scalar(&mut self) -> Option<Raw<'a>> {
        self.ws();
        let start = self.at;
        match self.peek()? {
            b'"' => {
                self.at += 1;
                self.string_body()?;
            }
            b't' => self.literal("true")?,
            b'f' => self.literal("false")?,
            b'n' => self.literal("null")?,
            b'-' | b'0'..=b'9' => self.number()?,
            _ => return None,
        }
        self.text.get(start..self.at).map(Cow::Borrowed)
    }

    fn literal(&mut self, word: &str) -> Option<()> {
        if self.text.as_bytes().get(self.at..)?.starts_with(word.as_bytes()) {
            self.at += word.len();
            Some(())
        } else {
            None
        }
    }

    fn digits(&mut self) -> usize {
        let from = self.at;
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
        self.at - from
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`. What follows is checked by the caller
    /// (`01` leaves `1`, which no caller accepts).
    fn number(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek()? {
            b'0' => self.at += 1,
            b'1'..=b'9' => {
                self.digits();
            }
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if self.digits() == 0 {
                return None;
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            if self.digits() == 0 {
                return None;
            }
        }
        Some(())
    }

    /// After a member: `true` if another follows (`,`), `false` at the closing `close`.
    fn more(&mut self, close: u8) -> Option<bool> {
        match self.next_byte()? {
            b',' => Some(true),
            b if b == close => Some(false),
            _ => None,
        }
    }

    /// Whether the object or array just opened is empty (then its `close` is consumed).
    fn empty(&mut self, close: u8) -> bool {
        self.ws();
        if self.peek() == Some(close) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    /// Reads an object key and its `:`, as the field it names. A key written as wal2json writes
    /// it (`"name":`, no whitespace) is told by its first letters and matched whole; any other
    /// goes through [`plain_string`](Self::plain_string).
    fn key(&mut self) -> Option<Field> {
        self.ws();
        let rest = self.text.as_bytes().get(self.at..)?;
        // Each arm compares with a literal, so that the compare is inlined at its length.
        let whole = |token: &[u8], field| rest.starts_with(token).then_some((token.len(), field));
        let known = match rest.get(1..3) {
            Some([b'a', _]) => whole(b"\"action\":", Field::Action),
            Some([b'x', _]) => whole(b"\"xid\":", Field::Xid),
            Some([b'l', _]) => whole(b"\"lsn\":", Field::Lsn),
            Some([b's', _]) => whole(b"\"schema\":", Field::Schema),
            Some([b't', b'a']) => whole(b"\"table\":", Field::Table),
            Some([b't', b'i']) => whole(b"\"timestamp\":", Field::Other),
            Some([b't', b'y']) => whole(b"\"type\":", Field::Other),
            Some([b'c', _]) => whole(b"\"columns\":", Field::Columns),
            Some([b'i', _]) => whole(b"\"identity\":", Field::Identity),
            Some([b'p', _]) => whole(b"\"pk\":", Field::Pk),
            Some([b'n', b'a']) => whole(b"\"name\":", Field::Name),
            Some([b'n', b'e']) => whole(b"\"nextlsn\":", Field::Other),
            Some([b'v', _]) => whole(b"\"value\":", Field::Value),
            _ => None,
        };
        if let Some((len, field)) = known {
            self.at += len;
            return Some(field);
        }
        let key = self.plain_string()?;
        self.expect(b':')?;
        Some(match key {
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
        })
    }

    /// The object's members, into `line` (written in place: a [`Line`] is a few hundred bytes).
    fn line(&mut self, line: &mut Line<'a>) -> Option<()> {
        self.expect(b'{')?;
        if self.empty(b'}') {
            return Some(());
        }
        loop {
            match self.key()? {
                Field::Action => once(&mut line.action, self.scalar()?)?,
                Field::Xid => once(&mut line.xid, self.scalar()?)?,
                Field::Lsn => once(&mut line.lsn, self.scalar()?)?,
                Field::Schema => once(&mut line.schema, self.scalar()?)?,
                Field::Table => once(&mut line.table, self.scalar()?)?,
                Field::Columns => once(&mut line.columns, self.columns()?)?,
                Field::Identity => once(&mut line.identity, self.columns()?)?,
                Field::Pk => once(&mut line.pk, self.keys()?)?,
                Field::Name | Field::Value | Field::Other => {
                    self.scalar()?;
                }
            }
            if !self.more(b'}')? {
                return Some(());
            }
        }
    }

    /// The start of a column or key object as wal2json writes it, `{"name":"…","type":"…"` with
    /// no whitespace and a name without escapes: the name's byte range. `None` for any other
    /// shape (where the scanner then stands is the caller's to undo).
    #[inline(always)]
    fn written_name_and_type(&mut self) -> Option<std::ops::Range<usize>> {
        let bytes = self.text.as_bytes();
        if bytes.get(self.at..self.at + 9)? != b"{\"name\":\"" {
            return None;
        }
        self.at += 9;
        let start = self.at;
        if self.string_body()? {
            return None;
        }
        let name = start..self.at - 1;
        if bytes.get(self.at..self.at + 9)? != b",\"type\":\"" {
            return None;
        }
        self.at += 9;
        self.string_body()?;
        Some(name)
    }

    /// One column object as wal2json writes it, `{"name":"…","type":"…","value":…}` with no
    /// whitespace and a name without escapes; `None` (nothing consumed) for any other shape,
    /// which [`column`](Self::column) then reads.
    #[inline]
    fn written_column(&mut self) -> Option<Column<'a>> {
        let from = self.at;
        let bytes = self.text.as_bytes();
        let column = (|| {
            let name = self.written_name_and_type()?;
            if bytes.get(self.at..self.at + 9)? != b",\"value\":" {
                return None;
            }
            self.at += 9;
            let value = self.scalar()?;
            if bytes.get(self.at)? != &b'}' {
                return None;
            }
            self.at += 1;
            // Both ends are next to an ASCII quote, so they are char boundaries.
            Some(Column { name: Cow::Borrowed(self.text.get(name)?), value })
        })();
        if column.is_none() {
            self.at = from;
        }
        column
    }

    /// One column object: `name` a string without escapes, `value` a scalar, other members
    /// scalars (ignored).
    fn column(&mut self) -> Option<Column<'a>> {
        self.expect(b'{')?;
        let (mut name, mut value) = (None, None);
        if !self.empty(b'}') {
            loop {
                match self.key()? {
                    Field::Name => once(&mut name, self.plain_string()?)?,
                    Field::Value => once(&mut value, self.scalar()?)?,
                    _ => {
                        self.scalar()?;
                    }
                }
                if !self.more(b'}')? {
                    break;
                }
            }
        }
        Some(Column { name: Cow::Borrowed(name?), value: value? })
    }

    /// `[{"name":…,"value":…,…},…]`: see [`column`](Self::column).
    fn columns(&mut self) -> Option<Vec<Column<'a>>> {
        self.expect(b'[')?;
        let mut out = Vec::with_capacity(8);
        if self.empty(b']') {
            return Some(out);
        }
        loop {
            self.ws();
            let column = match self.written_column() {
                Some(c) => c,
                None => self.column()?,
            };
            out.push(column);
            if !self.more(b']')? {
                return Some(out);
            }
        }
    }

    /// One key object as wal2json writes it, `{"name":"…","type":"…"}` with no whitespace and a
    /// name without escapes; `None` (nothing consumed) for any other shape, which
    /// [`key_object`](Self::key_object) then reads.
    #[inline]
    fn written_key(&mut self) -> Option<Key<'a>> {
        let from = self.at;
        let bytes = self.text.as_bytes();
        let key = (|| {
            let name = self.written_name_and_type()?;
            if bytes.get(self.at)? != &b'}' {
                return None;
            }
            self.at += 1;
            // Both ends are next to an ASCII quote, so they are char boundaries.
            Some(Key { name: Cow::Borrowed(self.text.get(name)?) })
        })();
        if key.is_none() {
            self.at = from;
        }
        key
    }

    /// One key object: `name` a string without escapes, other members scalars (ignored).
    fn key_object(&mut self) -> Option<Key<'a>> {
        self.expect(b'{')?;
        let mut name = None;
        if !self.empty(b'}') {
            loop {
                match self.key()? {
                    Field::Name => once(&mut name, self.plain_string()?)?,
                    _ => {
                        self.scalar()?;
                    }
                }
                if !self.more(b'}')? {
                    break;
                }
            }
        }
        Some(Key { name: Cow::Borrowed(name?) })
    }

    /// `[{"name":…,…},…]`: see [`key_object`](Self::key_object).
    fn keys(&mut self) -> Option<Vec<Key<'a>>> {
        self.expect(b'[')?;
        let mut out = Vec::with_capacity(2);
        if self.empty(b']') {
            return Some(out);
        }
        loop {
            self.ws();
            let key = match self.written_key() {
                Some(k) => k,
                None => self.key_object()?,
            };
            out.push(key);
            if !self.more(b']')? {
                return Some(out);
            }
        }
    }
}

/// The object keys the scanner tells apart (any other is [`Field::Other`]).
#[derive(Clone, Copy)]
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

/// How many bytes at the start of `bytes` need no look in a string: neither `"`, `\\` nor a
/// control character (< 0x20). Eight bytes at a time (SWAR, "Bit Twiddling Hacks",
/// *Determine if a word has a byte less than n*): in each word, a byte's high bit is set in
/// `flags` when that byte is one of them; a borrow can only set false flags in bytes above a
/// flagged one, so the lowest flag is exact.
fn plain_run(bytes: &[u8]) -> usize {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let below = |x: u64, n: u8| x.wrapping_sub(ONES * u64::from(n)) & !x & HIGH;
    let mut done = 0;
    for chunk in bytes.chunks_exact(8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word);
        let flags =
            below(x, 0x20) | below(x ^ (ONES * u64::from(b'"')), 1) | below(x ^ (ONES * u64::from(b'\\')), 1);
        if flags != 0 {
            // Little-endian: the lowest bits are the first byte.
            return done + (flags.trailing_zeros() / 8) as usize;
        }
        done += 8;
    }
    done
}

/// Sets a field read once; `None` (give the line to the generic path, which names the
/// duplicate) if it was already set.
fn once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value);
    Some(())
}

#[cfg(test)]
mod tests {
    use super::plain_run;

    #[test]
    fn plain_run_stops_at_the_first_quote_backslash_or_control_byte() {
        let naive = |b: &[u8]| b.iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20).unwrap_or(b.len());
        let base = "abcdefgh\u{e9}ijklmnopq\u{7f}rstuvwxyz0123456789".as_bytes();
        for special in [b'"', b'\\', 0x00, 0x01, 0x1f] {
            for at in 0..=base.len() {
                let mut line = base.to_vec();
                line.insert(at, special);
                // A second special byte later: the first one must be found.
                line.push(b'"');
                for start in 0..line.len() {
                    let got = plain_run(&line[start..]);
                    // plain_run may stop short of the last < 8 bytes (the caller reads them one by one).
                    let want = naive(&line[start..]);
                    assert!(
                        got == want || (got < want && line.len() - start - got < 8),
                        "{special} at {at} from {start}"
                    );
                }
            }
        }
        assert_eq!(
            plain_run(b" !#[]^_`{|}~\x7f\xc3\xa9 !#[]"),
            16,
            "no false stops on neighbours of the special bytes"
        );
    }
}
