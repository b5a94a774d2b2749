//! Read-only followers: [`EventLog::open_read_only`](crate::EventLog::open_read_only) in any
//! process, beside the one writer of a directory, reading and subscribing to what the writer
//! has made durable.
//!
//! **The commit marker.** After each group commit's fsync (and after recovery, on open) the
//! writer writes the directory's `COMMIT` file: the first position of the segment it appends
//! to, the length of that segment that is durable, and a CRC32C of both (20 bytes, no fsync: it
//! tells other processes what is on disk, through the page cache they share; after a machine
//! crash the restarted writer writes it again). The writer writes it into a shared memory map of
//! the file (`memmap2`): a 20-byte copy, no system call; followers read the file (`read`, no
//! map), and a read that catches the copy half-way fails the CRC. Everything
//! below the marker is durable, so a follower never reads a record that could still be lost —
//! what a writer killed before its reply had fsynced, recovery keeps. A torn read of the marker
//! (its CRC fails) is retried at the next poll.
//!
//! **Why a memory map.** Written with one `pwrite` per group commit instead, the marker cost a
//! lone durable appender on tmpfs 10-12 µs per append against 7-9 µs without it (measured once by
//! hand on the shared 2-core VM at load ~9: best of 5 rounds of 20,000 appends, two runs each
//! way); with the copy into the map, 7.4-8.4 µs (three runs, load ~6).
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

use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::thread;
use std::time::Duration;

use super::error::OpenError;
use super::file::{FrameCache, SegmentFile};
use super::segindex::{SegmentIndex, read_index};
use super::segment::{HEADER_LEN, RecordError, decode_record, read_header};
use super::slots::EventSlots;
use super::snapshot::{IndexWriter, Shared, Snapshot};
use super::storage::segment_name;

/// The commit marker's file name in a log directory.
pub(crate) const COMMIT_FILE: &str = "COMMIT";
/// The commit marker's size, in bytes.
const MARKER_LEN: usize = 20;

/// What the writer has made durable: the segment it appends to and that segment's durable
/// length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Marker {
    pub(crate) segment: u64,
    pub(crate) len: u64,
}

impl Marker {
    fn encode(self) -> [u8; MARKER_LEN] {
        let mut b = [0u8; MARKER_LEN];
        b[..8].copy_from_slice(&self.segment.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        let crc = crc32c::crc32c(&b[..16]);
        b[16..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Marker> {
        let b: &[u8; MARKER_LEN] = b.try_into().ok()?;
        (crc32c::crc32c(&b[..16]) == u32::from_le_bytes(b[16..].try_into().ok()?)).then(|| Marker {
            segment: u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
            len: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
        })
    }
}

/// The writer's handle on the commit marker: a shared, writable memory map of the file.
#[derive(Debug)]
pub(crate) struct MarkerFile(memmap2::MmapMut);

impl MarkerFile {
    /// Opens (creating) the marker of the log in `dir`, the caller being the directory's one
    /// writer (it holds the directory's lock).
    pub(crate) fn open(dir: &Path) -> io::Result<MarkerFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(COMMIT_FILE))?;
        if file.metadata()?.len() != MARKER_LEN as u64 {
            file.set_len(MARKER_LEN as u64)?;
        }
        // SAFETY: `MmapMut::map_mut` is unsafe because the mapped file could be changed or
        // truncated by someone else while mapped (the `&mut [u8]` would then change under us, or
        // touching it would fault). `COMMIT` is written by the directory's one writer only — this
        // process, which holds the directory's exclusive lock for as long as the map lives (the
        // segment writer owns both) — and never truncated while a writer runs: followers only
        // read it, and the log's files are not for anything else to change (crate docs).
        let map = unsafe { memmap2::MmapMut::map_mut(&file)? };
        Ok(MarkerFile(map))
    }

    /// Says that `marker` is durable: a copy into the shared map (see the module docs).
    pub(crate) fn publish(&mut self, marker: Marker) {
        self.0[..MARKER_LEN].copy_from_slice(&marker.encode());
    }
}

/// Reads the marker of the log in `dir`: `None` if there is none yet, or a torn one.
fn read_marker(dir: &Path) -> io::Result<Option<Marker>> {
    match std::fs::read(dir.join(COMMIT_FILE)) {
        Ok(b) => Ok(Marker::decode(&b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

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
