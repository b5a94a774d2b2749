//! Read-only followers: [`EventLog::open_read_only`](crate::EventLog::open_read_only) in any
//! process, beside the one writer of a directory, reading and subscribing to what the writer
//! has made durable.
//!
//! **The commit marker** (`disk/marker.rs`). After each group commit's fsync (and after recovery,
//! on open) the writer says in the directory's `COMMIT` file how much of which segment is
//! durable. Everything below the marker is durable, so a follower never reads a record that
//! could still be lost — what a writer killed before its reply had fsynced, recovery keeps. A
//! torn read of the marker (its CRC fails) is retried at the next poll.
//!
//! **Following.** A follower thread polls the marker every
//! [`LogOptions::follow_interval`](crate::LogOptions::follow_interval) (1 ms by default): when it
//! moved, the follower reads the new records of the segment it follows, up to the marker, every
//! one checked (a bad record below the marker is damage: the follower stops, failed); when the
//! marker names a later segment, the followed one is complete (the writer seals a segment only
//! after its last commit's fsync) and the follower reads it to its end, then goes on in the next.
//! It indexes the new records like the writer does and publishes a new snapshot, waking the
//! subscribers. The wake-up latency is therefore the poll interval at most (half of it on
//! average), plus the read of the new records. A restarted writer's marker is never behind the
//! old one (recovery never truncates what was fsynced), so a follower goes on across a writer's
//! crash and restart without a gap or a repeat. The thread ends when the last handle to the
//! follower's log (reader or subscription) is dropped.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::thread;
use std::time::Duration;

use super::disk::file::{FrameCache, SegmentFile};
use super::disk::format::{HEADER_LEN, read_header};
use super::disk::marker::read_marker;
use super::disk::record::{RecordError, decode_record};
use super::disk::segindex::{SegmentIndex, read_index};
use super::disk::storage::segment_name;
use super::error::OpenError;
use super::slots::EventSlots;
use super::snapshot::{IndexWriter, Shared, Snapshot};

/// A follower's state: what it took from which segment.
pub(crate) struct Follower {
    dir: PathBuf,
    cache: Option<Arc<FrameCache>>,
    pub(crate) index: IndexWriter,
    /// The published head (0: nothing yet).
    pub(crate) head: u64,
    /// The segment followed: its first position, its file, the bytes of it taken (records
    /// indexed). `None` before the first segment is there.
    current: Option<(u64, Arc<SegmentFile>, u64)>,
}

impl Follower {
    pub(crate) fn new(dir: PathBuf, cache: Option<Arc<FrameCache>>) -> Follower {
        Follower { dir, cache, index: IndexWriter::new(), head: 0, current: None }
    }

    fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> OpenError + 'a {
        move |source| OpenError::Io { op, path: path.to_path_buf(), source }
    }

    /// Takes everything the marker says is durable and the follower does not have yet into the
    /// index and `events`. Returns whether anything was taken.
    ///
    /// # Errors
    /// [`OpenError::Io`] when a file cannot be read; [`OpenError::Corrupt`] or
    /// [`OpenError::UnsupportedVersion`] when what the marker covers is not whole, valid records
    /// (damage: a follower never waits for a torn record below the marker).
    pub(crate) fn catch_up(&mut self, events: &EventSlots) -> Result<bool, OpenError> {
        let Some(marker) = read_marker(&self.dir).map_err(Self::io("reading", &self.dir))? else {
            return Ok(false);
        };
        let before = self.head;
        loop {
            let (first, file, taken) = match &self.current {
                Some(c) => c.clone(),
                None => {
                    let file = self.open_segment(1)?;
                    self.current = Some((1, file.clone(), HEADER_LEN as u64));
                    (1, file, HEADER_LEN as u64)
                }
            };
            if marker.segment < first {
                break; // an older marker (a torn one would not decode): nothing new
            }
            let sealed = marker.segment > first;
            let path = self.dir.join(segment_name(first));
            let end = if sealed {
                std::fs::metadata(&path).map_err(Self::io("reading", &path))?.len()
            } else {
                marker.len
            };
            if end > taken {
                // A sealed segment not begun yet comes from its index file when it is trusted.
                let index = match (sealed && taken == HEADER_LEN as u64)
                    .then(|| read_index(&self.dir, first, end, file.version()))
                    .transpose()
                    .map_err(Self::io("reading the index of", &path))?
                    .flatten()
                {
                    Some(index) => index,
                    None => self.read_records(&file, &path, taken, end)?,
                };
                if index.first != self.head + 1 {
                    return Err(OpenError::Corrupt {
                        segment: path,
                        offset: taken,
                        reason: format!(
                            "records start at position {}, expected {}",
                            index.first,
                            self.head + 1
                        ),
                    });
                }
                if !index.events.is_empty() {
                    self.head = index.next() - 1;
                    self.index.add_segment(events, &index, file.clone());
                }
                self.current = Some((first, file, end));
            }
            if !sealed {
                break;
            }
            let next = self.head + 1;
            let file = self.open_segment(next)?;
            self.current = Some((next, file, HEADER_LEN as u64));
        }
        Ok(self.head > before)
    }

    /// Opens the segment starting at `first` and checks its header.
    fn open_segment(&self, first: u64) -> Result<Arc<SegmentFile>, OpenError> {
        let path = self.dir.join(segment_name(first));
        let version = read_header(&path, first)?;
        let file = SegmentFile::open(&path, first, version, self.cache.clone())
            .map_err(Self::io("opening", &path))?;
        Ok(Arc::new(file))
    }

    /// Reads and checks the records in bytes `from..to` of the segment `file`, every one whole
    /// and valid.
    fn read_records(
        &self,
        file: &SegmentFile,
        path: &Path,
        from: u64,
        to: u64,
    ) -> Result<SegmentIndex, OpenError> {
        let bytes = file.read_at(from, (to - from) as usize).map_err(Self::io("reading", path))?;
        let corrupt = |at: usize, reason: String| OpenError::Corrupt {
            segment: path.to_path_buf(),
            offset: from + at as u64,
            reason: format!("{reason} (below the writer's commit marker: durable records, damaged)"),
        };
        let mut index = SegmentIndex::new(self.head + 1, file.version());
        let mut next = self.head + 1;
        let mut at = 0;
        while at < bytes.len() {
            match decode_record(&bytes, at, &mut index) {
                Ok((rec_first, count, len)) => {
                    if rec_first != next {
                        return Err(corrupt(
                            at,
                            format!("record starts at position {rec_first}, expected {next}"),
                        ));
                    }
                    next += count as u64;
                    at += len;
                }
                Err(RecordError::Torn(why)) => return Err(corrupt(at, why.into())),
                Err(RecordError::Invalid(why)) => return Err(corrupt(at, why)),
            }
        }
        for e in &mut index.events {
            e.loc.shift(from);
        }
        index.len = to;
        Ok(index)
    }
}

/// Runs `follower` for the log `shared`, polling every `interval`, until every handle to the log
/// is dropped (see the module docs).
pub(crate) fn spawn(mut follower: Follower, shared: Weak<Shared>, interval: Duration) -> io::Result<()> {
    thread::Builder::new().name("lanestream-log-follower".into()).spawn(move || {
        loop {
            thread::sleep(interval);
            let Some(shared) = shared.upgrade() else { return };
            match follower.catch_up(&shared.events) {
                Ok(false) => {}
                Ok(true) => {
                    shared.snapshot.store(Arc::new(Snapshot {
                        head: follower.head,
                        types: follower.index.types.clone(),
                        tags: follower.index.tags.clone(),
                    }));
                    follower.index.shrink_scratch();
                    shared.signal.notify();
                }
                Err(e) => {
                    let _ = shared.failure.set(Arc::new(io::Error::other(e)));
                    shared.signal.notify();
                    return;
                }
            }
        }
    })?;
    Ok(())
}
