//! The tokens of the reader's one JSON parser ([`scan`](super::scan) reads a line's structure
//! with them): whitespace, strings, numbers, literals, and any value skipped whole.
//!
//! What it accepts is the JSON grammar (RFC 8259): strings without raw control characters and
//! with valid escapes, numbers `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, the literals,
//! whitespace between tokens. A string the line keeps as a value may hold a lone surrogate
//! escape (`"\ud800"`, as serde_json accepts it in a value it keeps raw); a string read as text
//! (a key, a column name) may not. UTF-8 is checked by the caller (the input is a `&str`). Nested
//! values are skipped without recursion, so no input can exhaust the stack.
//!
//! **Errors** are serde_json's: each token fails where serde_json's reader of the same token
//! fails, with its message, at the byte its line and column name, so that the reader refuses
//! exactly the lines serde_json refuses and says so in the same words (the tests check it on the
//! capture, the fuzz corpus and generated lines). A token that fails stops the scan ([`Stop`]);
//! the reason is kept in [`Json::stopped`].

use std::borrow::Cow;

/// serde_json's messages for the syntax errors a line can have.
pub(super) mod reason {
    pub(crate) const EOF_LIST: &str = "EOF while parsing a list";
    pub(crate) const EOF_OBJECT: &str = "EOF while parsing an object";
    pub(crate) const EOF_STRING: &str = "EOF while parsing a string";
    pub(crate) const EOF_VALUE: &str = "EOF while parsing a value";
    pub(crate) const EXPECTED_COLON: &str = "expected `:`";
    pub(crate) const EXPECTED_LIST_COMMA_OR_END: &str = "expected `,` or `]`";
    pub(crate) const EXPECTED_OBJECT_COMMA_OR_END: &str = "expected `,` or `}`";
    pub(crate) const EXPECTED_IDENT: &str = "expected ident";
    pub(crate) const EXPECTED_VALUE: &str = "expected value";
    pub(crate) const INVALID_ESCAPE: &str = "invalid escape";
    pub(crate) const INVALID_NUMBER: &str = "invalid number";
    pub(crate) const NUMBER_OUT_OF_RANGE: &str = "number out of range";
    pub(crate) const CONTROL_CHARACTER: &str =
        "control character (\\u0000-\\u001F) found while parsing a string";
    pub(crate) const KEY_MUST_BE_A_STRING: &str = "key must be a string";
    pub(crate) const LONE_SURROGATE: &str = "lone leading surrogate in hex escape";
    pub(crate) const TRAILING_COMMA: &str = "trailing comma";
    pub(crate) const TRAILING_CHARACTERS: &str = "trailing characters";
    pub(crate) const UNEXPECTED_END_OF_HEX_ESCAPE: &str = "unexpected end of hex escape";
    /// A field twice (a data error).
    pub(crate) const DUPLICATE_FIELD: &str = "duplicate field";
    /// Any other data error: a value of the wrong type, a field missing (see `scan::explain`).
    pub(crate) const INVALID_JSON: &str = "invalid JSON";
}
use reason::*;

/// The scan stopped: why is in [`Json::stopped`]. (An empty error keeps every token's result as
/// small as an `Option`.)
#[derive(Clone, Copy, Debug)]
pub(super) struct Stop;

/// A token's result.
pub(super) type Scan<T> = Result<T, Stop>;

/// Why the scan stopped.
#[derive(Clone, Copy, Debug)]
pub(super) struct Stopped {
    /// The byte offset in the line (serde_json's line and column, as an offset).
    pub(super) offset: usize,
    /// serde_json's message ([`reason`]).
    pub(super) reason: &'static str,
    /// A data error (a well-formed value of the wrong shape, a field twice or missing), which
    /// serde_json reports only once the line's syntax held up to there.
    pub(super) data: bool,
}

/// A scan over one line.
pub(super) struct Json<'a> {
    pub(super) text: &'a str,
    /// The next byte to read.
    pub(super) at: usize,
    /// Why the scan stopped, once it has.
    pub(super) stopped: Option<Stopped>,
    /// The arrays (`[`) and objects (`{`) a skipped value is inside, outermost first.
    frames: Vec<u8>,
}

impl<'a> Json<'a> {
    pub(super) fn new(text: &'a str) -> Self {
        Json { text, at: 0, stopped: None, frames: Vec::new() }
    }

    pub(super) fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    /// Skips JSON whitespace.
    #[inline(always)]
    pub(super) fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// The next byte after whitespace, not consumed.
    pub(super) fn ws_peek(&mut self) -> Option<u8> {
        self.ws();
        self.peek()
    }

    // --- errors, where serde_json puts them -------------------------------------------------

    /// Stops at serde_json's position `index` (bytes consumed when it noticed): its 1-based
    /// column there, as a byte offset.
    #[cold]
    #[inline(never)]
    fn stop(&mut self, index: usize, reason: &'static str, data: bool) -> Stop {
        let index = index.min(self.text.len());
        let offset = match index.checked_sub(1) {
            None => 0,
            // Column 0 of a line (just after a newline): the line's start.
            Some(last) if self.text.as_bytes().get(last) == Some(&b'\n') => index,
            Some(last) => last,
        };
        self.stopped = Some(Stopped { offset, reason, data });
        Stop
    }

    /// A syntax error at the byte just read (serde_json's `error`).
    pub(super) fn at_last(&mut self, reason: &'static str) -> Stop {
        self.stop(self.at, reason, false)
    }

    /// A syntax error at the next byte, not read (serde_json's `peek_error`).
    pub(super) fn at_next(&mut self, reason: &'static str) -> Stop {
        self.stop(self.at + 1, reason, false)
    }

    /// A data error where the scan stands.
    pub(super) fn data(&mut self, reason: &'static str) -> Stop {
        self.stop(self.at, reason, true)
    }

    // --- punctuation ---------------------------------------------------------------------------

    /// An object's `:` after a key.
    #[inline(always)]
    pub(super) fn colon(&mut self) -> Scan<()> {
        if self.peek() == Some(b':') {
            self.at += 1;
            return Ok(());
        }
        match self.ws_peek() {
            Some(b':') => {
                self.at += 1;
                Ok(())
            }
            Some(_) => Err(self.at_next(EXPECTED_COLON)),
            None => Err(self.at_next(EOF_OBJECT)),
        }
    }

    /// Before an object's member (the scan after its `{` or its last member): `true` at the
    /// next key (its opening quote not consumed), `false` at the closing `}` (not consumed).
    #[inline(always)]
    pub(super) fn next_key(&mut self, first: bool) -> Scan<bool> {
        // What wal2json writes between members.
        if !first && self.text.as_bytes().get(self.at..self.at + 2) == Some(b",\"") {
            self.at += 1;
            return Ok(true);
        }
        match self.ws_peek() {
            Some(b'}') => Ok(false),
            Some(b'"') if first => Ok(true),
            Some(_) if first => Err(self.at_next(KEY_MUST_BE_A_STRING)),
            Some(b',') => {
                self.at += 1;
                match self.ws_peek() {
                    Some(b'"') => Ok(true),
                    Some(b'}') => Err(self.at_next(TRAILING_COMMA)),
                    Some(_) => Err(self.at_next(KEY_MUST_BE_A_STRING)),
                    None => Err(self.at_next(EOF_VALUE)),
                }
            }
            Some(_) => Err(self.at_next(EXPECTED_OBJECT_COMMA_OR_END)),
            None => Err(self.at_next(EOF_OBJECT)),
        }
    }

    /// Before an array's element: `true` at the next element, `false` at the closing `]` (not
    /// consumed).
    #[inline(always)]
    pub(super) fn next_element(&mut self, first: bool) -> Scan<bool> {
        // What wal2json writes between the objects of a list.
        if !first && self.text.as_bytes().get(self.at..self.at + 2) == Some(b",{") {
            self.at += 1;
            return Ok(true);
        }
        match self.ws_peek() {
            Some(b']') => Ok(false),
            Some(_) if first => Ok(true),
            Some(b',') => {
                self.at += 1;
                match self.ws_peek() {
                    Some(b']') => Err(self.at_next(TRAILING_COMMA)),
                    Some(_) => Ok(true),
                    None => Err(self.at_next(EOF_VALUE)),
                }
            }
            Some(_) => Err(self.at_next(EXPECTED_LIST_COMMA_OR_END)),
            None => Err(self.at_next(EOF_LIST)),
        }
    }

    /// After the elements a fixed-length array (a struct read from an array) was read for: its
    /// closing `]`, consumed.
    pub(super) fn end_array(&mut self) -> Scan<()> {
        match self.ws_peek() {
            Some(b']') => {
                self.at += 1;
                Ok(())
            }
            Some(b',') => {
                self.at += 1;
                match self.ws_peek() {
                    Some(b']') => Err(self.at_next(TRAILING_COMMA)),
                    _ => Err(self.at_next(TRAILING_CHARACTERS)),
                }
            }
            Some(_) => Err(self.at_next(TRAILING_CHARACTERS)),
            None => Err(self.at_next(EOF_LIST)),
        }
    }

    // --- values --------------------------------------------------------------------------------

    /// Any value after whitespace, skipped: its raw text.
    #[inline(always)]
    pub(super) fn raw_value(&mut self) -> Scan<&'a str> {
        self.ws();
        let start = self.at;
        self.skip_value_here()?;
        // Both ends are at token boundaries (ASCII bytes, or the end), so char boundaries.
        Ok(self.text.get(start..self.at).unwrap_or_default())
    }

    /// Skips any value (after whitespace).
    #[inline(always)]
    pub(super) fn skip_value(&mut self) -> Scan<()> {
        self.ws();
        self.skip_value_here()
    }

    /// Skips the value that starts here: a scalar here, a nested one in
    /// [`skip_nested`](Self::skip_nested).
    #[inline(always)]
    fn skip_value_here(&mut self) -> Scan<()> {
        match self.peek() {
            Some(b'"') => {
                self.at += 1;
                self.skip_str().map(|_| ())
            }
            Some(b'[' | b'{') => self.skip_nested(),
            Some(first) => self.skip_scalar(first),
            None => Err(self.at_next(EOF_VALUE)),
        }
    }

    /// A literal or a number (`first` its first byte, not consumed), skipped.
    #[inline(always)]
    fn skip_scalar(&mut self, first: u8) -> Scan<()> {
        match first {
            b'n' => self.literal(b"null"),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'-' => {
                self.at += 1;
                self.skip_number()
            }
            b'0'..=b'9' => self.skip_number(),
            _ => Err(self.at_next(EXPECTED_VALUE)),
        }
    }

    /// An array or object (its `[` or `{` next), skipped whole, without recursion.
    #[inline(never)]
    fn skip_nested(&mut self) -> Scan<()> {
        let mut frames = std::mem::take(&mut self.frames);
        frames.clear();
        let skipped = self.skip_frames(&mut frames);
        self.frames = frames;
        skipped
    }

    fn skip_frames(&mut self, frames: &mut Vec<u8>) -> Scan<()> {
        loop {
            // A value: a scalar, or the start of an array or object.
            let opened = match self.ws_peek() {
                Some(open @ (b'[' | b'{')) => {
                    self.at += 1;
                    frames.push(open);
                    true
                }
                Some(b'"') => {
                    self.at += 1;
                    self.skip_str()?;
                    false
                }
                Some(first) => {
                    self.skip_scalar(first)?;
                    false
                }
                None => return Err(self.at_next(EOF_VALUE)),
            };
            // After it: the next element or member, or the end of the frames that end here.
            let mut more = !opened;
            loop {
                let Some(&frame) = frames.last() else { return Ok(()) };
                match self.ws_peek() {
                    Some(b',') if more => {
                        self.at += 1;
                        break;
                    }
                    Some(b']') if frame == b'[' => {}
                    Some(b'}') if frame == b'{' => {}
                    Some(_) if more => {
                        let reason = if frame == b'[' {
                            EXPECTED_LIST_COMMA_OR_END
                        } else {
                            EXPECTED_OBJECT_COMMA_OR_END
                        };
                        return Err(self.at_next(reason));
                    }
                    Some(_) => break,
                    None => return Err(self.at_next(if frame == b'[' { EOF_LIST } else { EOF_OBJECT })),
                }
                self.at += 1;
                frames.pop();
                more = true;
            }
            if frames.last() == Some(&b'{') {
                match self.ws_peek() {
                    Some(b'"') => self.at += 1,
                    Some(_) => return Err(self.at_next(KEY_MUST_BE_A_STRING)),
                    None => return Err(self.at_next(EOF_OBJECT)),
                }
                self.skip_str()?;
                self.colon()?;
            }
        }
    }

    /// `word` (its first byte next), consumed.
    #[inline(always)]
    fn literal(&mut self, word: &[u8]) -> Scan<()> {
        if self.text.as_bytes().get(self.at..self.at + word.len()) == Some(word) {
            self.at += word.len();
            return Ok(());
        }
        self.at += 1;
        self.rest_of_literal(&word[1..])
    }

    /// The rest of a literal whose first byte was consumed, byte by byte (serde_json's
    /// `parse_ident`): where it goes wrong.
    #[cold]
    fn rest_of_literal(&mut self, rest: &[u8]) -> Scan<()> {
        for &want in rest {
            match self.peek() {
                None => return Err(self.at_last(EOF_VALUE)),
                Some(got) => {
                    self.at += 1;
                    if got != want {
                        return Err(self.at_last(EXPECTED_IDENT));
                    }
                }
            }
        }
        Ok(())
    }

    fn digits(&mut self) -> usize {
        let from = self.at;
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
        self.at - from
    }

    /// A number's digits (after its `-`), skipped (serde_json's `ignore_integer`).
    #[inline(always)]
    fn skip_number(&mut self) -> Scan<()> {
        match self.peek() {
            Some(b'0') => {
                self.at += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return Err(self.at_next(INVALID_NUMBER));
                }
            }
            Some(b'1'..=b'9') => {
                self.digits();
            }
            Some(_) => {
                self.at += 1;
                return Err(self.at_last(INVALID_NUMBER));
            }
            None => return Err(self.at_last(INVALID_NUMBER)),
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if self.digits() == 0 {
                return Err(self.at_next(INVALID_NUMBER));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            match self.peek() {
                Some(b'0'..=b'9') => {
                    self.digits();
                }
                Some(_) => {
                    self.at += 1;
                    return Err(self.at_last(INVALID_NUMBER));
                }
                None => return Err(self.at_last(INVALID_NUMBER)),
            }
        }
        Ok(())
    }

    /// The rest of a string whose opening quote was consumed, skipped (serde_json's
    /// `ignore_str`): whether it has escapes.
    #[inline(always)]
    pub(super) fn skip_str(&mut self) -> Scan<bool> {
        let bytes = self.text.as_bytes();
        let mut escaped = false;
        loop {
            self.at += plain_run(bytes.get(self.at..).unwrap_or_default());
            match bytes.get(self.at) {
                Some(b'"') => {
                    self.at += 1;
                    return Ok(escaped);
                }
                Some(b'\\') => {
                    self.at += 1;
                    escaped = true;
                    self.skip_escape()?;
                }
                Some(0..=0x1f) => return Err(self.at_last(CONTROL_CHARACTER)),
                Some(_) => self.at += 1,
                None => return Err(self.at_last(EOF_STRING)),
            }
        }
    }

    /// An escape after its `\`, skipped: its syntax checked, not what it stands for.
    #[inline(always)]
    fn skip_escape(&mut self) -> Scan<()> {
        let Some(c) = self.peek() else { return Err(self.at_last(EOF_STRING)) };
        self.at += 1;
        match c {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Ok(()),
            b'u' => self.hex4().map(|_| ()),
            _ => Err(self.at_last(INVALID_ESCAPE)),
        }
    }

    /// The four hex digits of a `\u` escape.
    fn hex4(&mut self) -> Scan<u16> {
        let Some(digits) = self.text.as_bytes().get(self.at..self.at + 4) else {
            self.at = self.text.len();
            return Err(self.at_last(EOF_STRING));
        };
        self.at += 4;
        let mut n = 0u16;
        for &d in digits {
            let Some(v) = (d as char).to_digit(16) else { return Err(self.at_last(INVALID_ESCAPE)) };
            n = (n << 4) | v as u16;
        }
        Ok(n)
    }

    /// The rest of a string whose opening quote was consumed, read as text (serde_json's
    /// `parse_str`): borrowed from the line without escapes, unescaped otherwise; a lone
    /// surrogate escape is an error here.
    pub(super) fn text_str(&mut self) -> Scan<Cow<'a, str>> {
        let bytes = self.text.as_bytes();
        let mut from = self.at;
        let mut owned: Option<String> = None;
        loop {
            self.at += plain_run(bytes.get(self.at..).unwrap_or_default());
            match bytes.get(self.at) {
                Some(b'"') => {
                    // Both ends are next to ASCII bytes, so they are char boundaries.
                    let piece = &self.text[from..self.at];
                    self.at += 1;
                    return Ok(match owned {
                        None => Cow::Borrowed(piece),
                        Some(mut s) => {
                            s.push_str(piece);
                            Cow::Owned(s)
                        }
                    });
                }
                Some(b'\\') => {
                    let s = owned.get_or_insert_with(String::new);
                    s.push_str(&self.text[from..self.at]);
                    self.at += 1;
                    self.unescape(s)?;
                    from = self.at;
                }
                Some(0..=0x1f) => {
                    self.at += 1;
                    return Err(self.at_last(CONTROL_CHARACTER));
                }
                Some(_) => self.at += 1,
                None => return Err(self.at_last(EOF_STRING)),
            }
        }
    }

    /// An escape after its `\`, its character pushed onto `out`.
    #[cold]
    fn unescape(&mut self, out: &mut String) -> Scan<()> {
        let Some(c) = self.peek() else { return Err(self.at_last(EOF_STRING)) };
        self.at += 1;
        let plain = match c {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => return self.unescape_unicode(out),
            _ => return Err(self.at_last(INVALID_ESCAPE)),
        };
        out.push(plain);
        Ok(())
    }

    /// A `\u` escape after its `u`: a character, or a surrogate pair written as two escapes.
    fn unescape_unicode(&mut self, out: &mut String) -> Scan<()> {
        let first = self.hex4()?;
        let c = match first {
            0xDC00..=0xDFFF => return Err(self.at_last(LONE_SURROGATE)),
            0xD800..=0xDBFF => {
                for want in [b'\\', b'u'] {
                    match self.peek() {
                        None => return Err(self.at_last(EOF_STRING)),
                        Some(got) => {
                            self.at += 1;
                            if got != want {
                                return Err(self.at_last(UNEXPECTED_END_OF_HEX_ESCAPE));
                            }
                        }
                    }
                }
                let second = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&second) {
                    return Err(self.at_last(LONE_SURROGATE));
                }
                0x1_0000 + ((u32::from(first) - 0xD800) << 10 | (u32::from(second) - 0xDC00))
            }
            _ => u32::from(first),
        };
        // Every value outside the surrogates, and every pair, is a character.
        out.push(char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER));
        Ok(())
    }

    /// A value of the wrong type where a value of another was expected (serde_json's
    /// `peek_invalid_type`): a data error once the value is read far enough to be well formed
    /// (a scalar whole, an array or object at its first byte), or the syntax error it has.
    #[cold]
    pub(super) fn wrong_type(&mut self) -> Stop {
        let read = match self.peek() {
            Some(b'n') => self.typed_literal(b"ull"),
            Some(b't') => self.typed_literal(b"rue"),
            Some(b'f') => self.typed_literal(b"alse"),
            Some(b'-') => {
                self.at += 1;
                self.typed_number()
            }
            Some(b'0'..=b'9') => self.typed_number(),
            Some(b'"') => {
                self.at += 1;
                self.text_str().map(|_| ())
            }
            Some(b'[' | b'{') => Ok(()),
            _ => return self.at_next(EXPECTED_VALUE),
        };
        match read {
            Ok(()) => self.data(INVALID_JSON),
            Err(stop) => stop,
        }
    }

    /// A literal read as a value (its first byte next): `rest`, the bytes after the first.
    fn typed_literal(&mut self, rest: &[u8]) -> Scan<()> {
        self.at += 1;
        self.rest_of_literal(rest)
    }

    /// A number read as a value (after its `-`), as serde_json parses one (`parse_integer`
    /// and what it calls): its syntax, and its range as an `f64`.
    fn typed_number(&mut self) -> Scan<()> {
        let Some(first) = self.peek() else { return Err(self.at_last(EOF_VALUE)) };
        self.at += 1;
        let mut significand = match first {
            b'0' if matches!(self.peek(), Some(b'0'..=b'9')) => return Err(self.at_next(INVALID_NUMBER)),
            b'0'..=b'9' => u64::from(first - b'0'),
            _ => return Err(self.at_last(INVALID_NUMBER)),
        };
        let push = |s: u64, d: u8| s.checked_mul(10).and_then(|s| s.checked_add(u64::from(d - b'0')));
        // Integer digits past what a u64 holds only scale it (`parse_long_integer`).
        let (mut exponent, mut float) = (0i32, false);
        while let Some(d @ b'0'..=b'9') = self.peek() {
            self.at += 1;
            match push(significand, d) {
                Some(s) if !float => significand = s,
                _ => {
                    float = true;
                    exponent = exponent.saturating_add(1);
                }
            }
        }
        if self.peek() == Some(b'.') {
            float = true;
            self.at += 1;
            // Fraction digits past what a u64 holds are dropped (`parse_decimal_overflow`).
            let (mut fraction, mut dropping) = (0usize, false);
            while let Some(d @ b'0'..=b'9') = self.peek() {
                self.at += 1;
                fraction += 1;
                match push(significand, d) {
                    Some(s) if !dropping => {
                        significand = s;
                        exponent = exponent.saturating_sub(1);
                    }
                    _ => dropping = true,
                }
            }
            if fraction == 0 {
                let reason = if self.peek().is_some() { INVALID_NUMBER } else { EOF_VALUE };
                return Err(self.at_next(reason));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            float = true;
            self.at += 1;
            let positive = match self.peek() {
                Some(sign @ (b'+' | b'-')) => {
                    self.at += 1;
                    sign == b'+'
                }
                _ => true,
            };
            let mut exp = match self.peek() {
                Some(d @ b'0'..=b'9') => i32::from(d - b'0'),
                Some(_) => {
                    self.at += 1;
                    return Err(self.at_last(INVALID_NUMBER));
                }
                None => return Err(self.at_last(EOF_VALUE)),
            };
            self.at += 1;
            while let Some(d @ b'0'..=b'9') = self.peek() {
                self.at += 1;
                match exp.checked_mul(10).and_then(|e| e.checked_add(i32::from(d - b'0'))) {
                    Some(e) => exp = e,
                    // An exponent past i32 (`parse_exponent_overflow`): infinite, or zero.
                    None if significand != 0 && positive => return Err(self.at_last(NUMBER_OUT_OF_RANGE)),
                    None => {
                        self.digits();
                        return Ok(());
                    }
                }
            }
            exponent = if positive { exponent.saturating_add(exp) } else { exponent.saturating_sub(exp) };
        }
        if float && f64_overflows(significand, exponent) {
            return Err(self.at_last(NUMBER_OUT_OF_RANGE));
        }
        Ok(())
    }
}

/// Whether `significand` × 10^`exponent` is past `f64`'s range, computed as serde_json computes
/// it (its `f64_from_parts` without the `float_roundtrip` feature; powers of ten as the compiler
/// reads `1eN`).
#[cold]
fn f64_overflows(significand: u64, mut exponent: i32) -> bool {
    let mut f = significand as f64;
    loop {
        match exponent.unsigned_abs() {
            e @ 0..=308 => {
                let pow: f64 = format!("1e{e}").parse().unwrap_or(f64::INFINITY);
                return exponent >= 0 && (f * pow).is_infinite();
            }
            _ if f == 0.0 => return false,
            _ if exponent >= 0 => return true,
            _ => {
                f /= 1e308;
                exponent += 308;
            }
        }
    }
}

/// How many bytes at the start of `bytes` need no look in a string: neither `"`, `\\` nor a
/// control character (< 0x20). Eight bytes at a time (SWAR, "Bit Twiddling Hacks",
/// *Determine if a word has a byte less than n*): in each word, a byte's high bit is set in
/// `flags` when that byte is one of them; a borrow can only set false flags in bytes above a
/// flagged one, so the lowest flag is exact. May stop short of the last (< 8) bytes: the caller
/// reads them one by one.
pub(super) fn plain_run(bytes: &[u8]) -> usize {
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
