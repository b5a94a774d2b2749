//! [`Wal2JsonReader`]: wal2json lines from a [`BufRead`], one batch per committed transaction.

use std::io::{self, BufRead, Read};

use lanestream::Batch;

use super::error::{Wal2JsonError, Wal2JsonErrorKind};
use crate::batch::TransactionBuilder;

/// The default longest line a [`Wal2JsonReader`] accepts: 256 MiB.
pub const DEFAULT_MAX_LINE_LEN: usize = 256 << 20;

/// Reads wal2json format-version 2 from a [`BufRead`], one batch per committed transaction.
///
/// An [`Iterator`] of `Result<Batch, Wal2JsonError>`: each `C` line yields `Ok(batch)` (and each
/// full chunk, with [`TransactionBuilder::with_max_batch_changes`]); a bad line yields `Err` and
/// iteration may go on (the line is skipped and its transaction discarded whole at its `C`, see
/// the [module docs](super));
/// an I/O error yields `Err` and ends the iteration ([`Wal2JsonError::is_recoverable`] is false).
/// At the end of the input, a transaction left open yields one
/// [`BuildErrorKind::Truncated`](crate::batch::BuildErrorKind::Truncated) error. Blank lines are skipped (but counted in line
/// numbers); a trailing `\r` is allowed.
///
/// ```
/// use lanestream_postgres::batch::BuildErrorKind;
/// use lanestream_postgres::wal2json::{Wal2JsonErrorKind, Wal2JsonReader};
/// let input = "{\"action\":\"B\"}\nnot json\n{\"action\":\"C\",\"lsn\":\"0/A\"}\n\
///              {\"action\":\"B\"}\n{\"action\":\"C\",\"lsn\":\"0/B\"}\n";
/// let mut reader = Wal2JsonReader::new(input.as_bytes());
/// let err = reader.next().unwrap().unwrap_err(); // line 2 is skipped...
/// assert_eq!(err.line(), 2);
/// assert!(matches!(err.kind(), Wal2JsonErrorKind::Malformed { .. }));
/// let err = reader.next().unwrap().unwrap_err(); // ...and its transaction discarded at its C
/// assert!(matches!(err.kind(), Wal2JsonErrorKind::Build(BuildErrorKind::DamagedTransaction { .. })));
/// assert_eq!(err.lost_changes(), 1);
/// let batch = reader.next().unwrap()?; // the next one goes through
/// assert_eq!(batch.position.map(|p| p.0), Some(0xB));
/// assert!(reader.next().is_none());
/// # Ok::<(), lanestream_postgres::wal2json::Wal2JsonError>(())
/// ```
#[derive(Debug)]
pub struct Wal2JsonReader<R> {
    input: R,
    builder: TransactionBuilder,
    line: Vec<u8>,
    line_no: u64,
    max_line_len: usize,
    done: bool,
}

impl<R: BufRead> Wal2JsonReader<R> {
    /// A reader over `input` with a fresh [`TransactionBuilder`].
    pub fn new(input: R) -> Self {
        Wal2JsonReader {
            input,
            builder: TransactionBuilder::new(),
            line: Vec::new(),
            line_no: 0,
            max_line_len: DEFAULT_MAX_LINE_LEN,
            done: false,
        }
    }

    /// Sets the longest line accepted (default [`DEFAULT_MAX_LINE_LEN`]); a longer line is
    /// skipped with [`Wal2JsonErrorKind::LineTooLong`], and its transaction is discarded at its
    /// `C` ([`BuildErrorKind::DamagedTransaction`](crate::batch::BuildErrorKind::DamagedTransaction)).
    pub fn with_max_line_len(mut self, max: usize) -> Self {
        self.max_line_len = max;
        self
    }

    /// Reads with `builder` (configured with chunking or key columns) instead of a fresh one.
    pub fn with_builder(mut self, builder: TransactionBuilder) -> Self {
        self.builder = builder;
        self
    }

    /// How many lines were read so far (the number of the last line read).
    pub fn lines_read(&self) -> u64 {
        self.line_no
    }

    /// The builder, for its counters ([`TransactionBuilder::transactions`], …).
    pub fn builder(&self) -> &TransactionBuilder {
        &self.builder
    }

    /// Reads the next line into `self.line` (without its `\n`); `Ok(false)` at the end of input.
    /// A line longer than the limit is consumed and reported as `Ok(true)` with `too_long`.
    fn read_line(&mut self, too_long: &mut bool) -> io::Result<bool> {
        self.line.clear();
        // One byte over the limit: room for the `\n`, or proof that the line is too long.
        let limit = u64::try_from(self.max_line_len).unwrap_or(u64::MAX).saturating_add(1);
        if (&mut self.input).take(limit).read_until(b'\n', &mut self.line)? == 0 {
            return Ok(false);
        }
        if self.line.last() == Some(&b'\n') {
            self.line.pop();
            *too_long = false;
            return Ok(true);
        }
        *too_long = self.line.len() > self.max_line_len;
        if *too_long {
            // Skip the rest of the line, a chunk at a time.
            while self.line.last() != Some(&b'\n') {
                self.line.clear();
                if (&mut self.input).take(1 << 16).read_until(b'\n', &mut self.line)? == 0 {
                    break;
                }
            }
            self.line.clear();
        }
        Ok(true)
    }
}

impl<R: BufRead> Iterator for Wal2JsonReader<R> {
    type Item = Result<Batch, Wal2JsonError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            // A line whole in the input's buffer is read there, without copying it out.
            if let Ok(buf) = self.input.fill_buf() {
                if let Some(n) = memchr::memchr(b'\n', buf).filter(|&n| n <= self.max_line_len) {
                    self.line_no += 1;
                    let line = &buf[..n];
                    let pushed = (!line.iter().all(u8::is_ascii_whitespace))
                        .then(|| self.builder.push_line(self.line_no, line));
                    self.input.consume(n + 1);
                    match pushed {
                        Some(Ok(Some(batch))) => return Some(Ok(batch)),
                        Some(Err(e)) => return Some(Err(e)),
                        Some(Ok(None)) | None => continue,
                    }
                }
            }
            let mut too_long = false;
            match self.read_line(&mut too_long) {
                Err(e) => {
                    self.done = true;
                    return Some(Err(Wal2JsonError::new(self.line_no + 1, Wal2JsonErrorKind::Io(e))));
                }
                Ok(false) => {
                    self.done = true;
                    return self.builder.finish(self.line_no).err().map(|e| Err(e.into()));
                }
                Ok(true) => {}
            }
            self.line_no += 1;
            if too_long {
                self.builder.skip_line(self.line_no);
                let kind = Wal2JsonErrorKind::LineTooLong { limit: self.max_line_len };
                return Some(Err(Wal2JsonError::new(self.line_no, kind)));
            }
            if self.line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match self.builder.push_line(self.line_no, &self.line) {
                Ok(Some(batch)) => return Some(Ok(batch)),
                Ok(None) => {}
                Err(e) => return Some(Err(e)),
            }
        }
        None
    }
}
