//! The [`PgOutputDecoder`]: a relation cache in front of the
//! [`TransactionBuilder`], one message at a time.

use std::fmt;

use ahash::AHashMap as HashMap;
use lanestream::{Batch, Position};

use super::error::{Fail, PgOutputError, PgOutputErrorKind};
use super::tuple::{column, read_relation, read_tuple, Fields, Relation, TupleKind};
use crate::batch::value::Val;
use crate::batch::{BuildError, Change, Column, Commit, TransactionBuilder};
use crate::mark::{Mark, MARK_PREFIX};

/// The decoder: a relation cache in front of a [`TransactionBuilder`]. See the
/// [module docs](super).
pub struct PgOutputDecoder {
    builder: TransactionBuilder,
    relations: HashMap<u32, Relation>,
    /// The names of the types not built in, from Type messages (`schema.name`).
    types: HashMap<u32, String>,
    messages: u64,
    resume_after: Option<Position>,
    /// Inside a transaction being skipped (see [`PgOutputDecoder::resume_after`]).
    skipping: bool,
    skipped: u64,
    /// The commit time of the last Begin, in microseconds since the Unix epoch.
    commit_time: Option<i64>,
    /// The string values of the change being decoded, JSON-escaped (see `Val`).
    scratch: String,
    /// The allocations of the change's values and columns, kept from one change to the next
    /// (empty between changes; see [`recycle`]).
    values: Vec<(usize, Val<'static>)>,
    columns: Vec<Column<'static>>,
    /// The columns of the change's new row left out as unchanged TOASTed values (indexes).
    unchanged: Vec<usize>,
    /// Backfill marks read and not yet taken ([`PgOutputDecoder::take_mark`]).
    marks: std::collections::VecDeque<Mark>,
}

impl fmt::Debug for PgOutputDecoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgOutputDecoder")
            .field("builder", &self.builder)
            .field("relations", &self.relations.len())
            .field("messages", &self.messages)
            .field("resume_after", &self.resume_after)
            .finish_non_exhaustive()
    }
}

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01 00:00:00 UTC).
pub(super) const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;

/// `v` emptied, its allocation kept for elements of another lifetime: the standard library
/// collects a vector's iterator into the same allocation when the element layouts match (as
/// they do for one type under two lifetimes), so no unsafe code is needed; were it ever to
/// allocate instead, only speed would change.
fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

impl PgOutputDecoder {
    /// A decoder that knows no relation yet, feeding `builder` (configure chunks and key
    /// look-ups on it: [`TransactionBuilder::with_max_batch_changes`],
    /// [`TransactionBuilder::with_key_lookup`]).
    pub fn new(builder: TransactionBuilder) -> Self {
        PgOutputDecoder {
            builder,
            relations: HashMap::new(),
            types: HashMap::new(),
            messages: 0,
            resume_after: None,
            skipping: false,
            skipped: 0,
            commit_time: None,
            scratch: String::new(),
            values: Vec::new(),
            columns: Vec::new(),
            unchanged: Vec::new(),
            marks: std::collections::VecDeque::new(),
        }
    }

    /// A logical message already parsed (a client such as pgwire-replication hands messages over
    /// as events; an `M` message given to [`decode`](Self::decode) comes here too): a backfill
    /// mark ([`MARK_PREFIX`], see [`crate::backfill`]) is kept for
    /// [`take_mark`](Self::take_mark), in stream order; anything else is ignored. `lsn` is the
    /// message's LSN.
    pub fn message(&mut self, lsn: u64, prefix: &str, content: &[u8]) {
        if prefix != MARK_PREFIX {
            return;
        }
        if let Some(mark) = Mark::parse(content, Position(lsn)) {
            self.marks.push_back(mark);
        }
    }

    /// The oldest backfill mark read and not yet taken (see [`message`](Self::message)). A
    /// source calls it after each message it hands the decoder, so that marks and batches keep
    /// their stream order.
    pub fn take_mark(&mut self) -> Option<Mark> {
        self.marks.pop_front()
    }

    /// Skips, whole, every transaction whose commit LSN (its Begin's) is at or before `position`:
    /// transactions already handed over, which the server sends again after a reconnect. `None`
    /// skips nothing. Relation messages inside skipped transactions are still taken.
    pub fn resume_after(&mut self, position: Option<Position>) {
        self.resume_after = position;
    }

    /// The builder (its last commit, its transaction count).
    pub fn builder(&self) -> &TransactionBuilder {
        &self.builder
    }

    /// How many messages were decoded (or refused) so far.
    pub fn messages(&self) -> u64 {
        self.messages
    }

    /// How many transactions were skipped as already handed over (see
    /// [`resume_after`](Self::resume_after)).
    pub fn skipped_transactions(&self) -> u64 {
        self.skipped
    }

    /// Whether a transaction is open (begun, not yet committed), skipped ones included.
    pub fn in_transaction(&self) -> bool {
        self.skipping || self.builder.open_since().is_some()
    }

    /// The commit time of the last transaction begun, in microseconds since the Unix epoch
    /// (from its Begin message); `None` before the first.
    pub fn commit_time_micros(&self) -> Option<i64> {
        self.commit_time
    }

    /// Decodes one pgoutput message (an `XLogData` payload).
    ///
    /// Returns `Ok(Some(batch))` for a Commit (the transaction's positioned batch) and, with
    /// [`TransactionBuilder::with_max_batch_changes`], for the change that fills a chunk (an
    /// unpositioned batch); `Ok(None)` for every other message.
    ///
    /// # Errors
    /// A [`PgOutputError`] naming the message when it is malformed, unsupported, or refused by
    /// the builder; the decoder stays usable (see the [module docs](super), *Errors*).
    pub fn decode(&mut self, message: &[u8]) -> Result<Option<Batch>, PgOutputError> {
        self.messages += 1;
        let seq = self.messages;
        match self.decode_inner(seq, message) {
            Ok(b) => Ok(b),
            Err(Fail::Builder(e)) => {
                let (kind, lost) = e.into_parts();
                Err(PgOutputError { message: seq, kind: Box::new(PgOutputErrorKind::Build(kind)), lost })
            }
            Err(Fail::Message(kind)) => {
                // A bad message inside a transaction: the builder discards it whole at its
                // commit (nothing of it is ever published).
                self.builder.skip_line(seq);
                Err(PgOutputError { message: seq, kind, lost: 0 })
            }
        }
    }

    /// Opens a transaction from a Begin already parsed (a client such as pgwire-replication
    /// hands Begin and Commit over as events): `commit_lsn` is the Begin's final LSN (the commit
    /// LSN), `commit_time_micros` its time in microseconds since PostgreSQL's epoch (2000-01-01).
    ///
    /// # Errors
    /// As [`decode`](Self::decode) for a Begin.
    pub fn begin(&mut self, commit_lsn: u64, xid: u32, commit_time_micros: i64) -> Result<(), PgOutputError> {
        self.messages += 1;
        let seq = self.messages;
        self.on_begin(seq, commit_lsn, xid, commit_time_micros).map_err(|e| {
            let (kind, lost) = e.into_parts();
            PgOutputError { message: seq, kind: Box::new(PgOutputErrorKind::Build(kind)), lost }
        })
    }

    /// Ends the transaction from a Commit already parsed (see [`begin`](Self::begin)); returns
    /// its positioned batch (`None` for a skipped transaction).
    ///
    /// # Errors
    /// As [`decode`](Self::decode) for a Commit.
    pub fn commit(&mut self, commit_lsn: u64) -> Result<Option<Batch>, PgOutputError> {
        self.messages += 1;
        let seq = self.messages;
        self.on_commit(seq, commit_lsn).map_err(|e| {
            let (kind, lost) = e.into_parts();
            PgOutputError { message: seq, kind: Box::new(PgOutputErrorKind::Build(kind)), lost }
        })
    }

    /// An error of this decoder's input itself (a capture that could not be read), numbered
    /// as the next message.
    pub(crate) fn input_error(&self, e: std::io::Error) -> PgOutputError {
        PgOutputError { message: self.messages + 1, kind: Box::new(PgOutputErrorKind::Io(e)), lost: 0 }
    }

    /// Ends the input: a transaction left open is discarded.
    ///
    /// # Errors
    /// [`BuildErrorKind::Truncated`](crate::batch::BuildErrorKind::Truncated) (in [`PgOutputErrorKind::Build`]) when one was open.
    pub fn finish(&mut self) -> Result<(), PgOutputError> {
        self.skipping = false;
        self.builder.finish(self.messages).map_err(|e| {
            let (kind, lost) = e.into_parts();
            PgOutputError { message: self.messages, kind: Box::new(PgOutputErrorKind::Build(kind)), lost }
        })
    }

    fn on_begin(&mut self, seq: u64, commit_lsn: u64, xid: u32, time: i64) -> Result<(), BuildError> {
        self.commit_time = Some(time.saturating_add(PG_EPOCH_UNIX_MICROS));
        if self.resume_after.is_some_and(|p| commit_lsn <= p.0) && self.builder.open_since().is_none() {
            self.skipping = true;
            return Ok(());
        }
        self.skipping = false;
        self.builder.push_begin(seq, Some(u64::from(xid)), Some(Position(commit_lsn)))?;
        // The envelopes carry the commit time: the pipeline's commit → ack latency starts there.
        self.builder.set_commit_time(self.commit_time.and_then(|t| u64::try_from(t).ok()));
        Ok(())
    }

    fn on_commit(&mut self, seq: u64, commit_lsn: u64) -> Result<Option<Batch>, BuildError> {
        if std::mem::take(&mut self.skipping) {
            self.skipped += 1;
            return Ok(None);
        }
        let commit = Commit { position: Ok(Position(commit_lsn)), lsn: None, xid: Ok(None) };
        self.builder.push_commit(seq, commit)
    }

    fn decode_inner(&mut self, seq: u64, message: &[u8]) -> Result<Option<Batch>, Fail> {
        let Some(&tag) = message.first() else { return Err(PgOutputErrorKind::Empty.into()) };
        let mut f = Fields { buf: message, at: 1, tag: tag as char, text: None };
        match tag {
            b'B' => {
                let lsn = f.u64("final LSN")?;
                let time = f.u64("commit time")? as i64;
                let xid = f.u32("xid")?;
                f.end()?;
                self.on_begin(seq, lsn, xid, time).map_err(Fail::Builder)?;
                Ok(None)
            }
            b'C' => {
                let _flags = f.u8("flags")?;
                let lsn = f.u64("commit LSN")?;
                let _end = f.u64("end LSN")?;
                let _time = f.u64("commit time")?;
                f.end()?;
                self.on_commit(seq, lsn).map_err(Fail::Builder)
            }
            b'R' => {
                let parsed = read_relation(&mut f, &self.types);
                match parsed {
                    Ok((oid, rel)) => {
                        self.relations.insert(oid, rel);
                        Ok(None)
                    }
                    Err(e) => {
                        // A relation whose new shape could not be read must not be decoded
                        // with its old one: forget them all (their changes fail loudly).
                        self.relations.clear();
                        Err(e.into())
                    }
                }
            }
            b'Y' => {
                let oid = f.u32("type OID")?;
                let schema = f.cstr("type's schema")?;
                let name = f.cstr("type's name")?;
                f.end()?;
                // Named as `format_type` would: qualified unless in pg_catalog or public.
                let name = match schema {
                    "" | "pg_catalog" | "public" => name.to_owned(),
                    _ => format!("{schema}.{name}"),
                };
                self.types.insert(oid, name);
                Ok(None)
            }
            b'O' => {
                let _lsn = f.u64("origin LSN")?;
                let _name = f.cstr("origin's name")?;
                f.end()?;
                Ok(None)
            }
            b'M' => {
                let _flags = f.u8("flags")?;
                let lsn = f.u64("message LSN")?;
                let prefix = f.cstr("prefix")?;
                let len = f.count32("content's length")?;
                let content = f.take(len, "content")?;
                f.end()?;
                self.message(lsn, prefix, content);
                Ok(None)
            }
            b'I' | b'U' | b'D' => self.change(seq, tag, f),
            b'T' => {
                let n = f.count32("relation count")?;
                let _options = f.u8("options")?;
                let mut oids = Vec::with_capacity(n.min(message.len() / 4));
                for _ in 0..n {
                    oids.push(f.u32("relation OID")?);
                }
                f.end()?;
                let mut out = None;
                for oid in oids {
                    let rel = self.relations.get(&oid).ok_or(PgOutputErrorKind::UnknownRelation(oid))?;
                    if self.skipping {
                        continue;
                    }
                    let change = Change {
                        action: 'T',
                        schema: &rel.schema,
                        table: &rel.table,
                        pk: None,
                        columns: None,
                        identity: None,
                        key_from_stream: false,
                        lsn: None,
                        relation: Some(&rel.shape),
                        unchanged: &[],
                    };
                    // A chunk may fill in the middle of a multi-table truncate: return the last
                    // one (with max_batch_changes >= 2 only one can fill per message... but a
                    // chunk of 1 fills at each relation: keep them all).
                    if let Some(b) = self.builder.push_change(seq, &change).map_err(Fail::Builder)? {
                        out = merge_chunks(out, b);
                    }
                }
                Ok(out)
            }
            b'S' | b'E' | b'c' | b'A' | b'b' | b'P' | b'K' | b'r' | b'p' => {
                Err(PgOutputErrorKind::UnsupportedMessage(tag as char).into())
            }
            other => Err(PgOutputErrorKind::UnknownMessage(other).into()),
        }
    }

    fn change(&mut self, seq: u64, tag: u8, mut f: Fields<'_>) -> Result<Option<Batch>, Fail> {
        let oid = f.u32("relation OID")?;
        let Self { relations, builder, skipping, scratch, values, columns, unchanged, .. } = self;
        let Some(rel) = relations.get(&oid) else {
            return Err(PgOutputErrorKind::UnknownRelation(oid).into());
        };
        scratch.clear();
        // The values are slices of the message: checked as UTF-8 once, not one by one.
        f.text = simdutf8::basic::from_utf8(f.buf).ok();
        let mut vals: Vec<(usize, Val<'_>)> = recycle(std::mem::take(values));
        unchanged.clear();
        let mut marker = f.u8("tuple marker")?;
        let old_kind = |marker: u8| if marker == b'K' { TupleKind::Key } else { TupleKind::Row };
        // `vals` holds the old tuple's values (if any) before `split`, the new one's after.
        let (split, has_old, has_new) = match tag {
            b'I' => {
                if marker != b'N' {
                    return Err(PgOutputErrorKind::BadTupleMarker { tag: 'I', marker }.into());
                }
                read_tuple(&mut f, rel, TupleKind::Row, scratch, &mut vals, unchanged)?;
                (0, false, true)
            }
            b'U' => {
                let has_old = marker == b'K' || marker == b'O';
                if has_old {
                    read_tuple(&mut f, rel, old_kind(marker), scratch, &mut vals, &mut Vec::new())?;
                    marker = f.u8("tuple marker")?;
                }
                if marker != b'N' {
                    return Err(PgOutputErrorKind::BadTupleMarker { tag: 'U', marker }.into());
                }
                let split = vals.len();
                read_tuple(&mut f, rel, TupleKind::Row, scratch, &mut vals, unchanged)?;
                (split, has_old, true)
            }
            _ => {
                if marker != b'K' && marker != b'O' {
                    return Err(PgOutputErrorKind::BadTupleMarker { tag: 'D', marker }.into());
                }
                read_tuple(&mut f, rel, old_kind(marker), scratch, &mut vals, &mut Vec::new())?;
                (vals.len(), true, false)
            }
        };
        f.end()?;
        let scratch = scratch.as_str();
        let mut cols: Vec<Column<'_>> = recycle(std::mem::take(columns));
        cols.extend(vals.iter().map(|&v| column(rel, v, scratch)));
        *values = recycle(vals);
        if *skipping {
            *columns = recycle(cols);
            return Ok(None);
        }
        let (old, new) = cols.split_at(split);
        let change = Change {
            action: tag as char,
            schema: &rel.schema,
            table: &rel.table,
            pk: rel.key.as_deref(),
            columns: has_new.then_some(new),
            identity: has_old.then_some(old),
            key_from_stream: rel.key.is_some(),
            lsn: None,
            relation: Some(&rel.shape),
            unchanged: if has_new { unchanged.as_slice() } else { &[] },
        };
        let out = builder.push_change(seq, &change).map_err(Fail::Builder);
        *columns = recycle(cols);
        out
    }
}

/// Two chunks filled by one message (a multi-table truncate with chunks of one change): one
/// batch holding both, its changes summed. Only unpositioned chunks fill inside a message.
fn merge_chunks(first: Option<Batch>, next: Batch) -> Option<Batch> {
    match first {
        None => Some(next),
        Some(a) => {
            let envelopes: std::sync::Arc<[lanestream::Envelope]> =
                a.envelopes.iter().chain(next.envelopes.iter()).cloned().collect();
            Some(Batch { position: None, changes: a.changes + next.changes, offset: a.offset, envelopes })
        }
    }
}
