//! The one value codec: PostgreSQL text-format values as the JSON values of documents and ids,
//! for the pgoutput decoder ([`crate::pgoutput`]) and the backfill's rows
//! ([`crate::backfill`]); and the JSON string escapes that every document name and id goes
//! through, for every decoder.
//!
//! **Typing** ([`push_json_value`], [`JsonType`]): a text value becomes JSON by its column's
//! type OID, as wal2json writes it: `int2`, `int4`, `int8`, `oid`, `float4`, `float8` and
//! `numeric` values are JSON numbers, except `NaN`, `Infinity` and `-Infinity`, which JSON has no
//! numbers for: they are the JSON strings `"NaN"`, `"Infinity"` and `"-Infinity"`, so that they
//! stay distinct from SQL NULL (`null`) and from each other, in documents and in ids; `bool` is
//! `true` / `false`; `bytea` is a string of its hex digits without the `\x`; every other type is
//! a JSON string of its text (`json` and `jsonb` too).
//!
//! **Escapes**: strings are written escaped as PostgreSQL's `escape_json` (and so wal2json)
//! escapes them ([`push_json_string`]); [`json_str`] reads a JSON string's text back.

use std::borrow::Cow;

/// The type OID of `bytea`, whose values are written as their hex digits.
pub(crate) const BYTEA_OID: u32 = 17;

/// Type OIDs whose text values are JSON numbers (as wal2json): int8, int2, int4, oid, float4,
/// float8, numeric.
const NUMBER_TYPES: [u32; 7] = [20, 21, 23, 26, 700, 701, 1700];
const BOOL_OID: u32 = 16;

/// Whether `s` needs no JSON escaping.
pub(crate) fn plain(s: &str) -> bool {
    !s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\')
}

/// Appends `s` as a JSON string, escaped as PostgreSQL's `escape_json` (and so wal2json) does:
/// `\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, other control characters as `\u00xx`.
pub(crate) fn push_json_string(out: &mut String, s: &str) {
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

/// Whether `s` is a JSON number (`-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`).
pub(crate) fn is_json_number(s: &str) -> bool {
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
pub(crate) enum Val<'m> {
    Text(&'m str),
    Scratch(usize, usize),
}

/// How the text values of a column type become JSON (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JsonType {
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
    pub(crate) fn of(type_oid: u32) -> Self {
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
pub(crate) fn json_value<'m>(
    json: JsonType,
    text: &'m str,
    scratch: &mut String,
) -> Result<Val<'m>, &'static str> {
    match json {
        JsonType::Number => {
            if is_json_number(text) {
                return Ok(Val::Text(text));
            }
            // JSON has no such numbers: strings, distinct from SQL NULL (`null`) and from each
            // other, so that a key holding them keys one row each (P9).
            for special in [r#""NaN""#, r#""Infinity""#, r#""-Infinity""#] {
                if text.eq_ignore_ascii_case(&special[1..special.len() - 1]) {
                    return Ok(Val::Text(special));
                }
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

/// The text of a JSON string, unescaped only when it has escapes; `None` if `text` is not a
/// string or does not unescape (a lone surrogate).
pub(crate) fn json_str(text: &str) -> Option<Cow<'_, str>> {
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    if inner.contains('\\') {
        serde_json::from_str(text).ok().map(Cow::Owned)
    } else {
        Some(Cow::Borrowed(inner))
    }
}

/// The `pg_type.typname` of a built-in type (`int4`, `text`, `_int4` for `int4[]`,
/// `timestamptz`...), from the `postgres` crate's table of PostgreSQL's built-in types; empty
/// for a type that is not built in (a source names those from the catalog or from pgoutput's
/// Type messages).
pub(crate) fn type_name(type_oid: u32) -> String {
    postgres::types::Type::from_oid(type_oid).map(|t| t.name().to_owned()).unwrap_or_default()
}
