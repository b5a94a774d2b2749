//! A durable NDJSON file sink: one line per envelope, made durable together with the sink's
//! [`SinkState`] before the sink engine acks, cut back to its checkpoint after a restart, so that
//! its output holds every change exactly once however the process dies, while the lanes and the
//! source deliver at least once. It is a [`Sink`](lanestream::pipeline::Sink) like any other: the
//! engine hands it only what its state does not cover, and it stores the state it is given.
//!
//! # Files
//! In a directory of the sink's own, for a sink named `NAME`:
//! - `NAME.ndjson`: the output, one [line](write_line) per envelope;
//! - `NAME.checkpoint`: replaced atomically at each commit (written aside, fsynced, renamed over
//!   the old one, the directory fsynced), two lines: `ndjson 2 <output length>`, then the
//!   [`SinkState`] ([`SinkState::to_text`]). The output and the state never disagree after a
//!   crash: everything below the recorded length is what the state says. Checkpoints of the
//!   earlier form (`<LSN or -> <length> [<LSN> <envelopes> <start>]` and an optional `backfill
//!   <indexes> <id or ->` line) are read as the state they describe.
//!
//! Snapshot rows are written like any envelope (they are upserts): a snapshot row the sink wrote
//! but had not committed when it died is cut off and read again when the engine asks for the
//! rest of its backfill, and a snapshot batch redelivered by the lane is written again, so
//! snapshot rows may appear more than once in the output (an upsert by id applied twice leaves
//! the same state), never one missing. The chunks of a large transaction the source discards
//! before its end (a damaged transaction, which the source reports as lost) stay in the output
//! as far as they came.
//!
//! # One writer
//! [`DurableNdjson::open`] takes an exclusive advisory lock on the output (`flock`, released by
//! the kernel when the holder dies, SIGKILL included), so a second sink engine for the same lane —
//! say, one started while the first still runs — cannot write into the output the first is still
//! writing: it waits for the lock (up to the time given), which the first releases when it stops
//! (on the Redis backend, when it finds itself fenced). What the first wrote and never committed
//! is cut off by the second's open.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use lanestream::{Batch, Envelope, IndexName, LaneItem, Op, Position};
//! use lanestream_postgres::ndjson::DurableNdjson;
//! use lanestream_postgres::pipeline::SinkState;
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
//!     relation: None,
//!     old_id: None,
//!     unchanged: Vec::new(),
//! };
//! let item = LaneItem::Batch(Batch::new(Some(Position(0x10)), Arc::from(vec![envelope])));
//! {
//!     let mut sink = DurableNdjson::open(&dir, "search", Duration::ZERO).unwrap();
//!     assert!(sink.state().is_none()); // a new sink
//!     sink.apply_item(&item).unwrap();
//!     let mut state = SinkState::new();
//!     state.advance(&item);
//!     sink.commit(&state).unwrap(); // now the delivery may be acked
//!     sink.apply_item(&item).unwrap(); // written, never committed: cut off at the next open
//! }
//! let sink = DurableNdjson::open(&dir, "search", Duration::ZERO).unwrap();
//! assert_eq!(sink.state().unwrap().position, Some(Position(0x10)));
//! assert_eq!(std::fs::read_to_string(sink.path()).unwrap().lines().count(), 1);
//! # drop(sink);
//! # std::fs::remove_dir_all(&dir).unwrap();
//! ```

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lanestream::{Envelope, IndexName, LaneItem, Position};

use lanestream::pipeline::{InTransaction, OwedBackfill, SinkState};

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
    #[error("{path}: expected \"ndjson 2 LENGTH\" and a sink state line ({reason}), got {text:?}")]
    BadCheckpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// What it holds (cut to 300 bytes).
        text: String,
        /// Why it was refused.
        reason: String,
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
}

/// The durable NDJSON sink of one lane (see the [module docs](self)).
#[derive(Debug)]
pub struct DurableNdjson {
    dir: PathBuf,
    name: String,
    path: PathBuf,
    out: BufWriter<File>,
    /// The output's length with everything applied.
    len: u64,
    /// The length the checkpoint records.
    durable_len: u64,
    /// The state the checkpoint records (`None`: no checkpoint yet).
    state: Option<SinkState>,
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
        let (durable_len, state) = read_checkpoint(dir, name)?;
        let on_disk = file.metadata().map_err(io)?.len();
        if on_disk < durable_len {
            return Err(NdjsonError::ShortOutput { path, on_disk, checkpoint: durable_len });
        }
        file.set_len(durable_len).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(DurableNdjson {
            dir: dir.to_path_buf(),
            name: name.to_owned(),
            path,
            out: BufWriter::with_capacity(1 << 16, file),
            len: durable_len,
            durable_len,
            state,
            line: Vec::with_capacity(4096),
        })
    }

    /// The state the checkpoint records (the last [`commit`](Self::commit)); `None` before
    /// the first.
    pub fn state(&self) -> Option<&SinkState> {
        self.state.as_ref()
    }

    /// What `<dir>/<name>.checkpoint` records, read without opening the sink (for tools and
    /// checks; a running sink may replace it at any moment): the output's durable length and
    /// the state. `None` without a checkpoint.
    ///
    /// # Errors
    /// [`NdjsonError::Io`], [`NdjsonError::BadCheckpoint`].
    pub fn read_checkpoint(dir: &Path, name: &str) -> Result<Option<(u64, SinkState)>, NdjsonError> {
        read_checkpoint(dir, name).map(|(len, state)| state.map(|s| (len, s)))
    }

    /// The sink's name (its files' stem).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The output file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes one lane item's envelopes (buffered: durable at the next
    /// [`commit`](Self::commit)); `SnapshotComplete` and items of later kinds write nothing.
    /// Returns the bytes written. The sink engine hands it only what its state does not cover.
    ///
    /// # Errors
    /// [`NdjsonError::Io`]. After an error the sink is to be dropped and opened again (what it
    /// holds is then its checkpoint's).
    pub fn apply_item(&mut self, item: &LaneItem) -> Result<u64, NdjsonError> {
        let LaneItem::Batch(batch) = item else { return Ok(0) };
        let mut bytes = 0;
        for e in batch.envelopes.iter() {
            self.line.clear();
            write_line(&mut self.line, e);
            self.out.write_all(&self.line).map_err(|e| self.io(e))?;
            bytes += self.line.len() as u64;
        }
        self.len += bytes;
        Ok(bytes)
    }

    /// Makes everything applied durable (flush, fsync) and records it with `state` in the
    /// checkpoint (written aside, fsynced, renamed over the old one, the directory fsynced).
    /// After it returns, every delivery applied so far may be acked. Does nothing when nothing
    /// was applied and the state is the one recorded.
    ///
    /// # Errors
    /// [`NdjsonError::Io`]: nothing new may be acked (the checkpoint is the previous one).
    pub fn commit(&mut self, state: &SinkState) -> Result<(), NdjsonError> {
        if self.len == self.durable_len && self.state.as_ref() == Some(state) {
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
        let text = format!("ndjson 2 {}\n{}\n", self.len, state.to_text());
        let mut f = File::create(&tmp).map_err(at(&tmp))?;
        f.write_all(text.as_bytes()).map_err(at(&tmp))?;
        f.sync_all().map_err(at(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(at(&path))?;
        File::open(&self.dir).and_then(|d| d.sync_all()).map_err(at(&self.dir))?;
        self.durable_len = self.len;
        self.state = Some(state.clone());
        Ok(())
    }

    fn io(&self, source: io::Error) -> NdjsonError {
        NdjsonError::Io { path: self.path.clone(), source }
    }
}

/// Reads `<dir>/<name>.checkpoint`: the output length and the state; `(0, None)` without one.
fn read_checkpoint(dir: &Path, name: &str) -> Result<(u64, Option<SinkState>), NdjsonError> {
    let path = dir.join(format!("{name}.checkpoint"));
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((0, None)),
        Err(source) => return Err(NdjsonError::Io { path, source }),
    };
    parse_checkpoint(&text)
        .map(|(len, state)| (len, Some(state)))
        .map_err(|reason| NdjsonError::BadCheckpoint { path, text: text.chars().take(300).collect(), reason })
}

/// `ndjson 2 <len>` then the state; or the earlier form (see the module docs).
fn parse_checkpoint(text: &str) -> Result<(u64, SinkState), String> {
    let mut lines = text.lines();
    let first = lines.next().ok_or("empty")?;
    if let Some(len) = first.strip_prefix("ndjson 2 ") {
        let len = len.parse().map_err(|_| format!("length {len:?}"))?;
        let state = SinkState::parse(lines.next().ok_or("no state line")?).map_err(|e| e.to_string())?;
        if lines.next().is_some() {
            return Err("more than two lines".into());
        }
        return Ok((len, state));
    }
    parse_first_form(first, lines.next())
        .filter(|_| lines.next().is_none())
        .ok_or_else(|| "not a checkpoint".into())
}

/// The earlier checkpoint form: `<LSN or -> <len> [<LSN> <envelopes> <start>]`, then optionally
/// `backfill <index,...> <"id" or ->`.
fn parse_first_form(first: &str, backfill: Option<&str>) -> Option<(u64, SinkState)> {
    let fields: Vec<&str> = first.split_whitespace().collect();
    let lsn = |t: &str| Position::from_lsn(t).ok();
    let position = match *fields.first()? {
        "-" => None,
        t => Some(lsn(t)?),
    };
    let len = fields.get(1)?.parse().ok()?;
    let in_transaction = match fields.len() {
        2 => None,
        5 => Some(InTransaction { position: lsn(fields[2])?, envelopes: fields[3].parse().ok()? }),
        _ => return None,
    };
    let owed = match backfill {
        None => Vec::new(),
        Some(line) => {
            let (indexes, after) = line.strip_prefix("backfill ")?.split_once(' ')?;
            let indexes = indexes.split(',').map(|i| IndexName::new(i).ok()).collect::<Option<Vec<_>>>()?;
            let after = match after {
                "-" => None,
                json => Some(serde_json::from_str::<String>(json).ok()?),
            };
            vec![OwedBackfill { indexes, after }]
        }
    };
    Some((len, SinkState { position, in_transaction, owed, ..SinkState::default() }))
}

/// Appends one envelope's output line to `line`:
/// `{"position":"X/Y"|null,"index":…,"id":…,"op":"upsert"|"delete"|"truncate","document":<the row JSON or null>}\n`,
/// with `"old_id":…` after the id when the upsert moved its row from another id
/// ([`Envelope::old_id`]) and `"unchanged":[…]` after the op for a partial update
/// ([`Envelope::unchanged`]: the columns the document leaves out, whose values are the held
/// row's). The relation ([`Envelope::relation`]) is not written. The document is written as it
/// is (the readers of this crate hand out validated JSON).
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
    if let Some(old_id) = &e.old_id {
        line.extend_from_slice(b",\"old_id\":");
        serde_json::to_writer(&mut *line, old_id).expect("a string serializes");
    }
    line.extend_from_slice(b",\"op\":");
    serde_json::to_writer(&mut *line, &e.op).expect("an op serializes");
    if e.is_partial() {
        line.extend_from_slice(b",\"unchanged\":");
        serde_json::to_writer(&mut *line, &e.unchanged).expect("strings serialize");
    }
    line.extend_from_slice(b",\"document\":");
    if e.document.is_empty() {
        line.extend_from_slice(b"null");
    } else {
        line.extend_from_slice(&e.document);
    }
    line.extend_from_slice(b"}\n");
}

#[cfg(test)]
mod tests;
