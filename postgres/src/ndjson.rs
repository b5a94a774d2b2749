//! A durable NDJSON file sink: one line per envelope, made durable and checkpointed before the
//! sink acks, cut back to its checkpoint after a restart, so that its output holds every change
//! exactly once however the process dies, while the lanes and the source deliver at least once.
//!
//! # Files
//! In a directory of the sink's own, for a sink named `NAME`:
//! - `NAME.ndjson`: the output, one [line](write_line) per envelope;
//! - `NAME.checkpoint`: replaced atomically (write, fsync, rename, fsync the directory). Its first
//!   line: `<last whole transaction's LSN or -> <output length>` and, while a transaction is half
//!   applied, ` <its LSN> <its envelopes applied> <the output length before it>`. While a backfill
//!   is in progress, a second line: `backfill <its remaining indexes, the current one first,
//!   comma-separated> <the id of the last snapshot row applied of the current index, as a JSON
//!   string, or ->`. The older forms (one line; the first two fields only) are read as well.
//!
//! # Resumable backfills
//! Snapshot rows (a [`Batch`] with no position, its envelopes with none either) are written to the
//! output like any envelope (they are upserts), and the checkpoint that covers them records how
//! far the backfill got ([`BackfillProgress`]), in the same atomic write as the output's length:
//! the two never disagree after a crash. `LaneItem::SnapshotComplete` clears the record.
//! [`Sink::resume`](crate::pipeline::Sink::resume) then asks the rest again after a restart:
//! `Request::Backfill { indexes: <remaining>, after: Some(<last id>) }`, so the backfill resumes
//! right after the last row the output holds durably, not from the start. A snapshot row the
//! sink wrote but had not committed when it died is cut off and read again, and a snapshot row
//! redelivered by the lane is written again: snapshot rows may appear more than once in the
//! output (an upsert by id applied twice leaves the same state), never one missing.
//! [`DurableNdjson::record_backfill`] records a backfill before its first row arrives, so that a
//! crash before then re-asks it too; without it, the record starts at the first snapshot row
//! (knowing only that row's index, not the request's later ones).
//!
//! # The rule it implements (contract [C1](lanestream::contract#c1))
//! A sink acks a delivery only after [`DurableNdjson::commit`], and the checkpoint then covers
//! everything acked — the last whole transaction **and** the chunks of a large transaction applied
//! so far. A chunk acked is never redelivered, while a restarted source sends the whole
//! transaction again: [`DurableNdjson::apply`] tells the two apart by the batch's
//! [`offset`](lanestream::Batch::offset) and skips what the checkpoint covers. So a large
//! transaction can be acked chunk by chunk (the lane need not hold it whole) and still be applied
//! exactly once.
//!
//! # One writer
//! [`DurableNdjson::open`] takes an exclusive advisory lock on the output (`flock`, released by
//! the kernel when the holder dies, SIGKILL included), so a second sink engine for the same lane —
//! say, one started while the first still runs — cannot write into the output the first is still
//! writing: it waits for the lock (up to the time given), which the first releases when it stops
//! (on the Redis backend, when it finds itself fenced). What the first wrote and never acked is cut
//! off by the second's open; what it checkpointed is kept and skipped when it comes again.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use lanestream::{Batch, Envelope, IndexName, Op, Position};
//! use lanestream_postgres::ndjson::DurableNdjson;
//!
//! let dir = std::env::temp_dir().join(format!("ndjson-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let envelope = Envelope {
//!     index: IndexName::new("public_users").unwrap(),
//!     id: "1".into(),
//!     op: Op::Upsert,
//!     position: Some(Position(0x10)),
//!     document: br#"{"id":1}"#.as_slice().into(),
//!     built_at_micros: None,
//! };
//! let batch = Batch::new(Some(Position(0x10)), Arc::from(vec![envelope]));
//! {
//!     let mut sink = DurableNdjson::open(&dir, "search", Duration::ZERO).unwrap();
//!     assert_eq!(sink.apply(&batch).unwrap().written, 1);
//!     sink.commit().unwrap(); // now the delivery may be acked
//! }
//! // After a restart the source sends the transaction again: it is skipped.
//! let mut sink = DurableNdjson::open(&dir, "search", Duration::ZERO).unwrap();
//! assert_eq!(sink.checkpoint().committed, Some(Position(0x10)));
//! assert_eq!(sink.apply(&batch).unwrap().skipped, 1);
//! # drop(sink);
//! # std::fs::remove_dir_all(&dir).unwrap();
//! ```

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lanestream::{Batch, Envelope, IndexName, LaneItem, Position, Request, SinkName};

/// Why the durable sink could not go on. Each variant names the file involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NdjsonError {
    /// An I/O error on `path`; nothing acked is lost (what was not committed is cut off at the
    /// next open).
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Another sink engine (in this process or another) holds the output: only one may write
    /// it. Stop the other engine, or wait longer.
    #[error(
        "{path} is held by another sink engine (waited {waited:?}); stop it, or let it notice it was fenced"
    )]
    Locked {
        /// The output file.
        path: PathBuf,
        /// How long the open waited for the lock.
        waited: Duration,
    },
    /// The checkpoint file does not read as a checkpoint: it was not written by this sink.
    #[error("{path}: expected \"LSN LENGTH [LSN ENVELOPES LENGTH]\" and optionally a second line \"backfill INDEX[,INDEX...] ID|-\", got {text:?}")]
    BadCheckpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// What it holds.
        text: String,
    },
    /// The output is shorter than its checkpoint says: acked output is missing (the file was
    /// cut or replaced by something else). Nothing is written.
    #[error(
        "{path} holds {on_disk} bytes, less than its checkpoint's {checkpoint}: acked output is missing"
    )]
    ShortOutput {
        /// The output file.
        path: PathBuf,
        /// Its length on disk.
        on_disk: u64,
        /// The length the checkpoint recorded.
        checkpoint: u64,
    },
    /// A batch of a large transaction starts after envelopes that were never applied: a chunk is
    /// missing (the lanes deliver in order, so this means the source skipped one).
    #[error("transaction {position}: a batch starts at envelope {offset}, but only {applied} of its envelopes were applied: a chunk is missing")]
    ChunkGap {
        /// The transaction's commit position.
        position: Position,
        /// The batch's [`Batch::offset`].
        offset: u64,
        /// Envelopes of the transaction applied so far.
        applied: u64,
    },
}

/// What a checkpoint records: what the sink has made durable, and so may have acked.
///
/// Not `Copy` (the backfill record holds index names and an id): clone it when you need it
/// owned; the fields other than [`backfill`](Checkpoint::backfill) are `Copy`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checkpoint {
    /// The last whole transaction applied (its commit position); `None` before the first.
    pub committed: Option<Position>,
    /// The output's length in bytes, everything below it durable.
    pub len: u64,
    /// A large transaction applied in part (some of its chunks), if any.
    pub partial: Option<Partial>,
    /// A backfill in progress, if any (see the [module docs](self#resumable-backfills)).
    pub backfill: Option<BackfillProgress>,
}

/// How far a backfill in progress got, as its checkpoint records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackfillProgress {
    /// The indexes still to be served, the current one first (never empty).
    pub indexes: Vec<IndexName>,
    /// The envelope id of the last snapshot row of the current index the output holds; `None`
    /// before its first.
    pub after: Option<String>,
}

/// A large transaction of which some chunks are applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partial {
    /// Its commit position (carried by its chunks' envelopes).
    pub position: Position,
    /// Its envelopes applied so far: the [`Batch::offset`] the next chunk starts at.
    pub envelopes: u64,
    /// The output's length before its first envelope (where it is cut back to if the source
    /// drops the transaction).
    pub start: u64,
}

impl Checkpoint {
    /// Reads `<dir>/<name>.checkpoint`; the default (nothing applied) if there is none.
    ///
    /// # Errors
    /// [`NdjsonError::Io`], [`NdjsonError::BadCheckpoint`].
    pub fn read(dir: &Path, name: &str) -> Result<Checkpoint, NdjsonError> {
        let path = dir.join(format!("{name}.checkpoint"));
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Checkpoint::default()),
            Err(source) => return Err(NdjsonError::Io { path, source }),
        };
        Checkpoint::parse(&text).ok_or(NdjsonError::BadCheckpoint { path, text })
    }

    fn parse(text: &str) -> Option<Checkpoint> {
        let mut lines = text.lines();
        let first = lines.next()?;
        let backfill = match lines.next() {
            None => None,
            Some(line) => Some(BackfillProgress::parse(line)?),
        };
        if lines.next().is_some() {
            return None;
        }
        Some(Checkpoint { backfill, ..Checkpoint::parse_first(first)? })
    }

    fn parse_first(text: &str) -> Option<Checkpoint> {
        let fields: Vec<&str> = text.split_whitespace().collect();
        let lsn = |t: &str| Position::from_lsn(t).ok();
        let committed = match *fields.first()? {
            "-" => None,
            t => Some(lsn(t)?),
        };
        let len = fields.get(1)?.parse().ok()?;
        let partial = match fields.len() {
            2 => None,
            5 => Some(Partial {
                position: lsn(fields[2])?,
                envelopes: fields[3].parse().ok()?,
                start: fields[4].parse().ok()?,
            }),
            _ => return None,
        };
        let checkpoint = Checkpoint { committed, len, partial, backfill: None };
        // A half-applied transaction starts within the output and after the last whole one.
        let consistent = partial.is_none_or(|t| t.start <= len && committed.is_none_or(|c| t.position > c));
        consistent.then_some(checkpoint)
    }

    fn line(&self) -> String {
        let mut line = match self.committed {
            Some(p) => format!("{p} {}", self.len),
            None => format!("- {}", self.len),
        };
        if let Some(t) = self.partial {
            line.push_str(&format!(" {} {} {}", t.position, t.envelopes, t.start));
        }
        line.push('\n');
        if let Some(b) = &self.backfill {
            let indexes: Vec<&str> = b.indexes.iter().map(IndexName::as_str).collect();
            line.push_str(&format!("backfill {} ", indexes.join(",")));
            match &b.after {
                // A String always serializes.
                Some(id) => line.push_str(&serde_json::to_string(id).expect("a string serializes")),
                None => line.push('-'),
            }
            line.push('\n');
        }
        line
    }
}

impl BackfillProgress {
    /// `backfill INDEX[,INDEX...] "ID"|-` (the id last: it may hold spaces).
    fn parse(line: &str) -> Option<BackfillProgress> {
        let rest = line.strip_prefix("backfill ")?;
        let (indexes, after) = rest.split_once(' ')?;
        let indexes = indexes.split(',').map(|i| IndexName::new(i).ok()).collect::<Option<Vec<_>>>()?;
        let after = match after {
            "-" => None,
            json => Some(serde_json::from_str::<String>(json).ok()?),
        };
        Some(BackfillProgress { indexes, after })
    }

    /// Moves the record to a snapshot row of `index` with id `id` just applied: the current
    /// index's, a later index's of the request (the ones before it are done), or, for an index
    /// the record does not hold, that index's alone.
    fn advance(record: &mut Option<BackfillProgress>, index: &IndexName, id: &str) {
        let at = record.as_ref().and_then(|b| b.indexes.iter().position(|i| i == index));
        match (record.as_mut(), at) {
            (Some(b), Some(k)) => {
                b.indexes.drain(..k);
                b.after = Some(id.to_owned());
            }
            _ => {
                *record = Some(BackfillProgress { indexes: vec![index.clone()], after: Some(id.to_owned()) })
            }
        }
    }
}

/// What [`DurableNdjson::apply`] did with a batch's envelopes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Envelopes written.
    pub written: u64,
    /// Envelopes skipped: applied before (the checkpoint covers them).
    pub skipped: u64,
    /// Bytes written.
    pub bytes: u64,
}

/// The durable NDJSON sink of one lane (see the [module docs](self)).
#[derive(Debug)]
pub struct DurableNdjson {
    dir: PathBuf,
    name: String,
    path: PathBuf,
    out: BufWriter<File>,
    /// What the checkpoint file says now.
    durable: Checkpoint,
    /// What the next commit will record: everything applied so far.
    applied: Checkpoint,
    line: Vec<u8>,
}

impl DurableNdjson {
    /// Opens (or creates) `<dir>/<name>.ndjson` as its only writer, waiting up to `lock_wait`
    /// for another engine to let it go, and cuts it back to its checkpoint (what was written
    /// after the checkpoint was never acked: it comes again).
    ///
    /// # Errors
    /// [`NdjsonError::Locked`] if another engine holds the output after `lock_wait`;
    /// [`NdjsonError::BadCheckpoint`], [`NdjsonError::ShortOutput`], [`NdjsonError::Io`].
    pub fn open(dir: &Path, name: &str, lock_wait: Duration) -> Result<DurableNdjson, NdjsonError> {
        let path = dir.join(format!("{name}.ndjson"));
        let io = |source| NdjsonError::Io { path: path.clone(), source };
        let file = OpenOptions::new().create(true).append(true).open(&path).map_err(io)?;
        let started = Instant::now();
        loop {
            // The lock the event log takes on its directory too (fs4's flock, through the trait:
            // std's own `File::try_lock` would need Rust 1.89).
            match fs4::FileExt::try_lock(&file) {
                Ok(()) => break,
                Err(fs4::TryLockError::WouldBlock) if started.elapsed() < lock_wait => {
                    std::thread::sleep(Duration::from_millis(10).min(lock_wait));
                }
                Err(fs4::TryLockError::WouldBlock) => {
                    return Err(NdjsonError::Locked { path, waited: started.elapsed() });
                }
                Err(fs4::TryLockError::Error(e)) => return Err(io(e)),
            }
        }
        // Read under the lock: the previous writer has stopped.
        let durable = Checkpoint::read(dir, name)?;
        let on_disk = file.metadata().map_err(io)?.len();
        if on_disk < durable.len {
            return Err(NdjsonError::ShortOutput { path, on_disk, checkpoint: durable.len });
        }
        file.set_len(durable.len).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(DurableNdjson {
            dir: dir.to_path_buf(),
            name: name.to_owned(),
            path,
            out: BufWriter::with_capacity(1 << 16, file),
            applied: durable.clone(),
            durable,
            line: Vec::with_capacity(4096),
        })
    }

    /// What the checkpoint file records (the last [`commit`](Self::commit)).
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.durable
    }

    /// The sink's name (its files' stem).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Records, durably (it commits), that a backfill of `indexes` (served in this order) is
    /// asked for this sink, before any of its rows arrive:
    /// [`Sink::resume`](crate::pipeline::Sink::resume) then returns its request — the sink
    /// engine publishes it when it opens the sink, and again after any crash, resuming after the
    /// last row applied, until its `SnapshotComplete`. To start a backfill: open the sink, call
    /// this, drop the sink, run the pipeline. Replaces a backfill recorded before.
    ///
    /// # Errors
    /// [`NdjsonError::Io`] (nothing recorded). Does nothing for an empty `indexes`.
    pub fn record_backfill(&mut self, indexes: Vec<IndexName>) -> Result<(), NdjsonError> {
        if indexes.is_empty() {
            return Ok(());
        }
        self.applied.backfill = Some(BackfillProgress { indexes, after: None });
        self.commit()
    }

    /// The request that resumes the backfill the checkpoint records, if any: its remaining
    /// indexes, after the last row applied. `None` also when the sink's name is not a valid
    /// [`SinkName`].
    pub fn resume_request(&self) -> Option<Request> {
        let b = self.durable.backfill.as_ref()?;
        let sink = SinkName::new(self.name.as_str()).ok()?;
        Some(Request::Backfill { sink, indexes: b.indexes.clone(), after: b.after.clone() })
    }

    /// Applies one lane item: a [`Batch`] as [`apply`](Self::apply) does; a
    /// `SnapshotComplete` clears the backfill record when its indexes include the record's
    /// current one (durable at the next [`commit`](Self::commit)); it writes nothing, and
    /// neither does an item of a kind added later.
    ///
    /// # Errors
    /// As [`apply`](Self::apply).
    pub fn apply_item(&mut self, item: &LaneItem) -> Result<Applied, NdjsonError> {
        match item {
            LaneItem::Batch(batch) => self.apply(batch),
            LaneItem::SnapshotComplete { indexes } => {
                let current = self.applied.backfill.as_ref().map(|b| &b.indexes[0]);
                if current.is_some_and(|c| indexes.contains(c)) {
                    self.applied.backfill = None;
                }
                Ok(Applied::default())
            }
            // Items of later kinds carry nothing for this output.
            _ => Ok(Applied::default()),
        }
    }

    /// The output file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the envelopes of `batch` that the output does not hold yet (buffered: durable at
    /// the next [`commit`](Self::commit)). A batch is placed by its transaction's position — its
    /// own, or for a chunk its envelopes' — and its [`offset`](Batch::offset): a transaction at
    /// or before the last whole one is skipped, and so is the part of a chunk already applied.
    /// A batch with no position anywhere (snapshot rows) is written as it is: snapshot rows are
    /// applied at least once (a redelivered snapshot batch is written again; their upserts are
    /// idempotent by id, and [R2](lanestream::contract#r2) already has a sink see some twice);
    /// its last row moves the backfill record (see the [module docs](self#resumable-backfills)).
    ///
    /// A chunk of another transaction than the one half applied means that one was dropped by
    /// the source (a damaged transaction): its envelopes are cut off the output first.
    ///
    /// # Errors
    /// [`NdjsonError::ChunkGap`] (nothing changed), [`NdjsonError::Io`]. After an error the sink
    /// is to be dropped and opened again (what it holds is then its checkpoint's).
    pub fn apply(&mut self, batch: &Batch) -> Result<Applied, NdjsonError> {
        let envelopes = &batch.envelopes[..];
        let Some(position) = batch.position.or_else(|| envelopes.first().and_then(|e| e.position)) else {
            let applied = self.write(envelopes)?;
            if let Some(last) = envelopes.last() {
                BackfillProgress::advance(&mut self.applied.backfill, &last.index, &last.id);
            }
            return Ok(applied);
        };
        let n = envelopes.len() as u64;
        let end = batch.offset.checked_add(n).ok_or(NdjsonError::ChunkGap {
            position,
            offset: batch.offset,
            applied: self.applied.partial.map_or(0, |t| t.envelopes),
        })?;
        if self.applied.committed.is_some_and(|c| position <= c) {
            return Ok(Applied { skipped: n, ..Applied::default() });
        }
        // Where this transaction stands: half applied, or new (after a half-applied other one,
        // which will then never complete, or after whole ones).
        let (done, start) = match self.applied.partial {
            Some(t) if t.position == position => (t.envelopes, t.start),
            Some(t) => (0, t.start),
            None => (0, self.applied.len),
        };
        if batch.offset > done {
            return Err(NdjsonError::ChunkGap { position, offset: batch.offset, applied: done });
        }
        if let Some(t) = self.applied.partial.filter(|t| t.position != position) {
            self.drop_partial(t)?;
        }
        let skip = (done - batch.offset).min(n);
        let mut applied = self.write(&envelopes[skip as usize..])?;
        applied.skipped = skip;
        if batch.position.is_some() {
            self.applied.committed = Some(position);
            self.applied.partial = None;
        } else {
            let envelopes = done.max(end);
            self.applied.partial = Some(Partial { position, envelopes, start });
        }
        Ok(applied)
    }

    /// Drops a half-applied transaction the source will never complete (it discarded it): what
    /// is applied so far is committed first, then a checkpoint that leaves the transaction out,
    /// and only then is the output cut, so a crash anywhere in between reopens on a checkpoint
    /// no longer than the output (the cut may have been acked before: it must not come back).
    fn drop_partial(&mut self, t: Partial) -> Result<(), NdjsonError> {
        self.commit()?;
        self.applied.len = t.start;
        self.applied.partial = None;
        self.commit()?;
        self.out.get_ref().set_len(t.start).map_err(|e| self.io(e))?;
        Ok(())
    }

    fn write(&mut self, envelopes: &[Envelope]) -> Result<Applied, NdjsonError> {
        let mut bytes = 0;
        for e in envelopes {
            self.line.clear();
            write_line(&mut self.line, e);
            self.out.write_all(&self.line).map_err(|e| self.io(e))?;
            bytes += self.line.len() as u64;
        }
        self.applied.len += bytes;
        Ok(Applied { written: envelopes.len() as u64, skipped: 0, bytes })
    }

    /// Makes everything applied durable (flush, fsync) and records it in the checkpoint (written
    /// aside, fsynced, renamed over the old one, the directory fsynced). Call it before acking:
    /// after it returns, every delivery applied so far may be acked. Does nothing if nothing
    /// changed.
    ///
    /// # Errors
    /// [`NdjsonError::Io`]: nothing new may be acked (the checkpoint is the previous one).
    pub fn commit(&mut self) -> Result<(), NdjsonError> {
        if self.applied == self.durable {
            return Ok(());
        }
        self.out.flush().map_err(|e| self.io(e))?;
        self.out.get_ref().sync_data().map_err(|e| self.io(e))?;
        let path = self.dir.join(format!("{}.checkpoint", self.name));
        let tmp = self.dir.join(format!("{}.checkpoint.tmp", self.name));
        let at = |path: &Path| {
            let path = path.to_path_buf();
            move |source| NdjsonError::Io { path, source }
        };
        let mut f = File::create(&tmp).map_err(at(&tmp))?;
        f.write_all(self.applied.line().as_bytes()).map_err(at(&tmp))?;
        f.sync_all().map_err(at(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(at(&path))?;
        File::open(&self.dir).and_then(|d| d.sync_all()).map_err(at(&self.dir))?;
        self.durable.clone_from(&self.applied);
        Ok(())
    }

    fn io(&self, source: io::Error) -> NdjsonError {
        NdjsonError::Io { path: self.path.clone(), source }
    }
}

/// Appends one envelope's output line to `line`:
/// `{"position":"X/Y"|null,"index":…,"id":…,"op":"upsert"|"delete"|"truncate","document":<the row JSON or null>}\n`.
/// The document is written as it is (the readers of this crate hand out validated JSON).
pub fn write_line(line: &mut Vec<u8>, e: &Envelope) {
    line.extend_from_slice(b"{\"position\":");
    match e.position {
        Some(p) => line.extend_from_slice(format!("\"{p}\"").as_bytes()),
        None => line.extend_from_slice(b"null"),
    }
    line.extend_from_slice(b",\"index\":\"");
    line.extend_from_slice(e.index.as_str().as_bytes());
    line.extend_from_slice(b"\",\"id\":");
    // A String and an Op always serialize.
    serde_json::to_writer(&mut *line, &e.id).expect("a string serializes");
    line.extend_from_slice(b",\"op\":");
    serde_json::to_writer(&mut *line, &e.op).expect("an op serializes");
    line.extend_from_slice(b",\"document\":");
    if e.document.is_empty() {
        line.extend_from_slice(b"null");
    } else {
        line.extend_from_slice(&e.document);
    }
    line.extend_from_slice(b"}\n");
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use lanestream::Op;

    use super::*;
    use crate::pipeline::Sink;

    fn envelope(id: u64, position: Position) -> Envelope {
        Envelope {
            index: IndexName::new("public_t").unwrap(),
            id: id.to_string(),
            op: Op::Upsert,
            position: Some(position),
            document: format!("{{\"id\":{id}}}").into_bytes().into(),
            built_at_micros: None,
        }
    }

    /// A transaction of `n` envelopes at `lsn`, in chunks of `chunk` (only the last positioned),
    /// as the wal2json builder makes them.
    fn transaction(lsn: u64, n: u64, chunk: u64) -> Vec<Batch> {
        let p = Position(lsn);
        let ids: Vec<u64> = (0..n).map(|i| lsn * 1000 + i).collect();
        let mut out = Vec::new();
        let mut offset = 0;
        let parts: Vec<&[u64]> = ids.chunks(chunk as usize).collect();
        for (k, part) in parts.iter().enumerate() {
            let envelopes: Arc<[Envelope]> = part.iter().map(|&i| envelope(i, p)).collect();
            let last = k + 1 == parts.len();
            let len = envelopes.len() as u64;
            out.push(Batch { position: last.then_some(p), changes: len, offset, envelopes });
            offset += len;
        }
        out
    }

    fn ids(dir: &Path) -> Vec<String> {
        std::fs::read_to_string(dir.join("s.ndjson"))
            .unwrap()
            .lines()
            .map(|l| l.split("\"id\":").nth(1).unwrap().split(',').next().unwrap().to_owned())
            .collect()
    }

    fn expected(txns: &[(u64, u64)]) -> Vec<String> {
        txns.iter().flat_map(|&(lsn, n)| (0..n).map(move |i| format!("\"{}\"", lsn * 1000 + i))).collect()
    }

    fn open(dir: &Path) -> DurableNdjson {
        DurableNdjson::open(dir, "s", Duration::ZERO).unwrap()
    }

    /// C1: a sink engine acks the first chunks of a large transaction (committed first), dies,
    /// and its successor gets only the unacked rest redelivered (the lane is done with the acked
    /// chunks): the output holds the whole transaction once. Before the checkpoint recorded the
    /// half-applied transaction, the reopen cut the acked chunks off and they were lost.
    #[test]
    fn c1_acked_chunks_survive_a_sink_restart() {
        let dir = tempfile::tempdir().unwrap();
        let txn = transaction(7, 10, 3); // chunks at offsets 0, 3, 6 and the last at 9
        let mut sink = open(dir.path());
        sink.apply(&transaction(5, 2, 3)[0]).unwrap();
        sink.apply(&txn[0]).unwrap();
        sink.apply(&txn[1]).unwrap();
        sink.commit().unwrap(); // the three batches are acked now
        sink.apply(&txn[2]).unwrap(); // written, not committed, not acked
        drop(sink); // dies
        let mut sink = open(dir.path());
        let partial = sink.checkpoint().partial.unwrap();
        assert_eq!((partial.position, partial.envelopes), (Position(7), 6));
        // Redelivered: what was not acked.
        for b in &txn[2..] {
            assert_eq!(sink.apply(b).unwrap().skipped, 0);
        }
        sink.commit().unwrap();
        assert_eq!(ids(dir.path()), expected(&[(5, 2), (7, 10)]));
        assert_eq!(
            sink.checkpoint(),
            &Checkpoint { committed: Some(Position(7)), partial: None, ..sink.checkpoint().clone() }
        );
    }

    /// C1: after the source restarts, the whole half-applied transaction comes again from its
    /// start: what the checkpoint covers is skipped, even with chunks cut at other places.
    #[test]
    fn c1_a_resent_transaction_skips_what_the_checkpoint_covers() {
        let dir = tempfile::tempdir().unwrap();
        let mut sink = open(dir.path());
        for b in &transaction(7, 10, 4)[..2] {
            sink.apply(b).unwrap(); // envelopes 0..8
        }
        sink.commit().unwrap();
        drop(sink);
        let mut sink = open(dir.path());
        let skipped: Vec<u64> =
            transaction(7, 10, 3).iter().map(|b| sink.apply(b).unwrap().skipped).collect();
        assert_eq!(skipped, [3, 3, 2, 0]); // 0..3, 3..6, 6..8 of 6..9, nothing of 9..10
        sink.commit().unwrap();
        drop(sink);
        // And once more from the start, after the commit: all skipped.
        let mut sink = open(dir.path());
        for b in transaction(7, 10, 5) {
            assert_eq!(sink.apply(&b).unwrap().written, 0);
        }
        assert_eq!(ids(dir.path()), expected(&[(7, 10)]));
    }

    /// A restart cuts back what was written after the last commit (never acked), whole
    /// transactions and chunks alike.
    #[test]
    fn what_was_not_committed_is_cut_back_and_comes_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut sink = open(dir.path());
        sink.apply(&transaction(3, 2, 5)[0]).unwrap();
        sink.commit().unwrap();
        sink.apply(&transaction(4, 2, 5)[0]).unwrap();
        sink.apply(&transaction(6, 4, 2)[0]).unwrap();
        drop(sink);
        let mut sink = open(dir.path());
        assert_eq!(sink.checkpoint().committed, Some(Position(3)));
        for b in [transaction(3, 2, 5), transaction(4, 2, 5), transaction(6, 4, 2)].concat() {
            sink.apply(&b).unwrap();
        }
        sink.commit().unwrap();
        assert_eq!(ids(dir.path()), expected(&[(3, 2), (4, 2), (6, 4)]));
    }

    /// A chunk past the applied envelopes is a gap, refused before anything is written.
    #[test]
    fn a_missing_chunk_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut sink = open(dir.path());
        let txn = transaction(9, 6, 2);
        sink.apply(&txn[0]).unwrap();
        let e = sink.apply(&txn[2]).unwrap_err();
        assert!(matches!(e, NdjsonError::ChunkGap { offset: 4, applied: 2, .. }), "{e}");
        sink.commit().unwrap();
        assert_eq!(ids(dir.path()).len(), 2);
    }

    /// A transaction the source dropped half-way (its chunks out, no last batch) is cut off the
    /// output when the next transaction begins.
    #[test]
    fn a_dropped_transactions_chunks_are_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let mut sink = open(dir.path());
        sink.apply(&transaction(2, 4, 2)[0]).unwrap();
        sink.commit().unwrap();
        drop(sink);
        let mut sink = open(dir.path());
        sink.apply(&transaction(3, 1, 2)[0]).unwrap();
        sink.commit().unwrap();
        assert_eq!(ids(dir.path()), expected(&[(3, 1)]));
        assert_eq!(sink.checkpoint().partial, None);
    }

    /// Dropping a discarded transaction's committed chunks is durable before the cut: a crash
    /// right after it reopens (the checkpoint is no longer than the output), without the chunks.
    #[test]
    fn a_crash_after_dropping_a_discarded_transaction_reopens_without_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut sink = open(dir.path());
        sink.apply(&transaction(1, 1, 5)[0]).unwrap();
        for b in &transaction(2, 6, 2)[..2] {
            sink.apply(b).unwrap();
        }
        sink.commit().unwrap(); // acked: the chunks of 2 are in the checkpoint
        sink.apply(&transaction(3, 1, 5)[0]).unwrap(); // 2 was discarded: cut, not committed
        drop(sink); // dies before the next commit
        let mut sink = DurableNdjson::open(dir.path(), "s", Duration::ZERO).unwrap();
        assert_eq!(sink.checkpoint().partial, None);
        sink.apply(&transaction(3, 1, 5)[0]).unwrap();
        sink.commit().unwrap();
        assert_eq!(ids(dir.path()), expected(&[(1, 1), (3, 1)]));
    }

    /// One writer: a second open of the same output is refused while the first holds it (fault
    /// 7 of the faults issue: a second sink engine's writes landed in the first's output), and
    /// succeeds once the first is gone.
    #[test]
    fn one_writer_per_output() {
        let dir = tempfile::tempdir().unwrap();
        let first = open(dir.path());
        let e = DurableNdjson::open(dir.path(), "s", Duration::from_millis(30)).unwrap_err();
        assert!(matches!(e, NdjsonError::Locked { .. }), "{e}");
        assert!(e.to_string().contains("held by another sink engine"), "{e}");
        drop(first);
        DurableNdjson::open(dir.path(), "s", Duration::ZERO).unwrap();
    }

    /// The checkpoint's text forms, old and new, and what is refused.
    #[test]
    fn checkpoint_forms() {
        let p = |t: &str| Checkpoint::parse(t);
        assert_eq!(
            p("0/10 42\n"),
            Some(Checkpoint { committed: Some(Position(16)), len: 42, partial: None, backfill: None })
        );
        let c = Checkpoint {
            committed: None,
            len: 9,
            partial: Some(Partial { position: Position(0x1_0000_0020), envelopes: 3, start: 1 }),
            backfill: None,
        };
        assert_eq!(c.line(), "- 9 1/20 3 1\n");
        assert_eq!(p(&c.line()), Some(c.clone()));
        // Malformed, or inconsistent: a partial starting past the output's end, or at or before
        // the last whole transaction.
        for bad in [
            "",
            "0/10",
            "0/10 x",
            "x 1",
            "0/10 1 0/20 3",
            "0/10 1 0/20 3 1 2",
            "0/10 1 0/20 3 2",
            "0/20 9 0/20 3 1",
        ] {
            assert_eq!(p(bad), None, "{bad:?}");
        }
    }

    fn snapshot(index: &str, ids: std::ops::Range<u64>) -> LaneItem {
        let envelopes: Arc<[Envelope]> = ids
            .map(|id| Envelope {
                position: None,
                index: IndexName::new(index).unwrap(),
                ..envelope(id, Position(0))
            })
            .collect();
        LaneItem::Batch(Batch::new(None, envelopes))
    }

    fn names(names: &[&str]) -> Vec<IndexName> {
        names.iter().map(|n| IndexName::new(*n).unwrap()).collect()
    }

    fn progress(indexes: &[&str], after: Option<&str>) -> Option<BackfillProgress> {
        Some(BackfillProgress { indexes: names(indexes), after: after.map(str::to_owned) })
    }

    /// A backfill's progress is written with the checkpoint that covers its rows (not before
    /// the commit), survives a reopen, moves on to the next index, and is cleared by
    /// `SnapshotComplete`; the resume request carries the remaining indexes and the last id.
    #[test]
    fn backfill_progress_is_checkpointed_with_its_rows_and_cleared_at_snapshot_complete() {
        let dir = tempfile::tempdir().unwrap();
        let mut sink = open(dir.path());
        sink.record_backfill(names(&["a", "b"])).unwrap();
        assert_eq!(sink.checkpoint().backfill, progress(&["a", "b"], None));
        sink.apply_item(&snapshot("a", 0..3)).unwrap();
        sink.apply(&transaction(5, 1, 5)[0]).unwrap(); // a live change between chunks
        sink.apply_item(&snapshot("a", 3..5)).unwrap();
        assert_eq!(sink.checkpoint().backfill, progress(&["a", "b"], None), "not before the commit");
        sink.commit().unwrap();
        assert_eq!(sink.checkpoint().backfill, progress(&["a", "b"], Some("4")));
        sink.apply_item(&snapshot("a", 5..7)).unwrap(); // not committed: cut, comes again
        drop(sink);
        let mut sink = open(dir.path());
        assert_eq!(sink.checkpoint().backfill, progress(&["a", "b"], Some("4")));
        assert_eq!(ids(dir.path()).len(), 6, "the output is cut back to the rows the record covers");
        let request = Sink::resume(&sink).unwrap();
        assert_eq!(
            request,
            Request::Backfill {
                sink: SinkName::new("s").unwrap(),
                indexes: names(&["a", "b"]),
                after: Some("4".into())
            }
        );
        sink.apply_item(&snapshot("a", 5..7)).unwrap();
        sink.apply_item(&snapshot("b", 0..2)).unwrap();
        sink.commit().unwrap();
        assert_eq!(sink.checkpoint().backfill, progress(&["b"], Some("1")));
        // Another backfill's completion leaves the record alone; this one's clears it.
        sink.apply_item(&LaneItem::SnapshotComplete { indexes: names(&["c"]) }).unwrap();
        sink.commit().unwrap();
        assert!(sink.checkpoint().backfill.is_some());
        sink.apply_item(&LaneItem::SnapshotComplete { indexes: names(&["a", "b"]) }).unwrap();
        sink.commit().unwrap();
        assert_eq!(sink.checkpoint().backfill, None);
        drop(sink);
        let sink = open(dir.path());
        assert_eq!(sink.checkpoint().backfill, None);
        assert_eq!(Sink::resume(&sink), None);
        assert_eq!(std::fs::read_to_string(dir.path().join("s.checkpoint")).unwrap().lines().count(), 1);
    }

    /// Snapshot rows that arrive without a recorded request start a record of their index.
    #[test]
    fn snapshot_rows_without_a_recorded_request_start_a_record() {
        let dir = tempfile::tempdir().unwrap();
        let mut sink = open(dir.path());
        sink.apply_item(&snapshot("a", 0..2)).unwrap();
        sink.commit().unwrap();
        assert_eq!(sink.checkpoint().backfill, progress(&["a"], Some("1")));
    }

    /// The checkpoint's second line: ids with spaces and quotes round-trip, the old one-line
    /// form still reads (no backfill), and a bad second line is refused.
    #[test]
    fn checkpoint_backfill_line_forms() {
        let c = Checkpoint {
            committed: Some(Position(16)),
            len: 42,
            partial: None,
            backfill: progress(&["public_t", "public_u"], Some("a \"b\"\n c")),
        };
        assert_eq!(c.line(), "0/10 42\nbackfill public_t,public_u \"a \\\"b\\\"\\n c\"\n");
        assert_eq!(Checkpoint::parse(&c.line()), Some(c));
        let none = Checkpoint { backfill: progress(&["t"], None), ..Checkpoint::default() };
        assert_eq!(none.line(), "- 0\nbackfill t -\n");
        assert_eq!(Checkpoint::parse(&none.line()), Some(none));
        assert_eq!(Checkpoint::parse("0/10 42\n").unwrap().backfill, None);
        for bad in [
            "- 0\nbackfill\n",
            "- 0\nbackfill t\n",
            "- 0\nbackfill T -\n",
            "- 0\nbackfill t x\n",
            "- 0\nbackfill t -\nx\n",
            "- 0\nfill t -\n",
        ] {
            assert_eq!(Checkpoint::parse(bad), None, "{bad:?}");
        }
    }
}
