//! Segments on disk: the record framing, the event encoding, recovery on open, and the segment
//! writer that appends one group commit at a time.
//!
//! # Format
//! A log directory holds segment files named by the position of their first event
//! (`00000000000000000001.seg`, 20 digits), the persisted index of each sealed segment beside it
//! (`00000000000000000001.idx`, see `segindex.rs`) and the writer's `LOCK` file; nothing else (a
//! stray file fails the open). A segment is a 16-byte header — the magic `LSLOG\0\0`, the format
//! version (one byte: [`FORMAT_VERSION`], 2), then the first position (u64, little-endian) —
//! followed by records. A file of a version this build does not read (0, or above 2) fails the
//! open ([`OpenError::UnsupportedVersion`]) before anything is changed. A record is one whole
//! append, so an append is on disk entirely or not at all:
//!
//! ```text
//! record  = len: u32 | crc: u32 | payload (len bytes)         crc = CRC32C(len bytes ++ payload)
//! payload = first position: u64 | count: u32 | (event_crc: u32 | event) * count
//! event   = type_len: u16 | type | tag_count: u16 | (tag_len: u16 | tag) * tag_count
//!           | data_len: u32 | data                              (all integers little-endian)
//! event_crc = CRC32C(position: u64 ++ event)       position: the event's, first position + i
//! ```
//!
//! The record's CRC is what recovery checks (a torn write fails it); each event's own CRC is
//! what a read checks, so a cold read of one event reads and verifies that event's bytes only
//! (`event_crc | event`, see `file.rs`), not the whole append. The position inside the event's
//! CRC makes a read that lands on the wrong event fail it.
//!
//! **Version 1** (written before; still read) is the same without `event_crc`: a read of one of
//! its events reads and checks the whole record. A log whose last segment is of version 1 is
//! moved on at open: that segment is sealed (its index file written, of version 1) and appends
//! go on in a new segment of version 2, so a segment never mixes versions and the writer has one
//! encoding. Nothing already written is rewritten.
//!
//! # Recovery
//! Opening takes each sealed segment (every one but the last) from its index file when that can
//! be trusted (see `segindex.rs`: it is never trusted over the segment; a missing, torn or
//! corrupt one is rebuilt by the scan below and written again), and scans the others — the last
//! segment always. A scan validates every record: its length, its CRC32C, that
//! its first position is the next one expected (dense from 1) and that it decodes (UTF-8 names,
//! sorted unique tags, exact lengths). A record that is incomplete or fails its CRC is what a
//! crash leaves at the end of the last segment: the group commit being written, never
//! acknowledged since a reply waits for the fsync. It is truncated away (it and everything after
//! it), and appends resume right after the last valid record — but only if it is a genuine torn
//! tail:
//!
//! - Only in the last segment. Anywhere else a bad record is corruption of acknowledged data.
//! - Only if no whole, CRC-valid frame starts anywhere after the bad record's first byte (every
//!   byte offset is tried, not just the one the bad record's length points to, which may itself
//!   be the damaged field). Records are written in order and each group commit is synced before
//!   the next one starts, so a crash never leaves a valid record after a torn one; one found
//!   there means the bad record was written and synced before it — acknowledged data, damaged
//!   since (a flipped bit in its length, its CRC or its payload). A frame counts when its length
//!   is at least [`MIN_PAYLOAD`] (the smallest record there is), it ends inside the file and its
//!   CRC32C matches; garbage in a torn tail (zeros, a half-written record) does not pass that.
//! - A whole, CRC-valid record that does not decode, or whose position is not the next one, is
//!   corruption wherever it is (a torn write cannot pass the CRC).
//!
//! Corruption fails the open with [`OpenError::Corrupt`], naming the segment and the bad
//! record's offset, and changes nothing on disk. A damaged *last* record, with nothing valid
//! after it, cannot be told from a torn write and is truncated like one (as in LevelDB).

use std::fs::{self, OpenOptions};
use std::io;
use std::mem;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::OpenError;
use super::event::{Block, Event, MAX_NAME_LEN, MAX_TAGS};
use super::file::{FrameCache, Loc, SegmentFile};
use super::follow::{Marker, MarkerFile};
use super::segindex::{SegmentIndex, index_name, read_index, write_index};
use super::storage::{Storage, create_segment_file, list_dir, segment_name};

/// The version of the format this build writes (segments and index files); it reads this one
/// and version 1.
pub(crate) const FORMAT_VERSION: u8 = 2;
/// The oldest version this build reads.
pub(crate) const OLDEST_VERSION: u8 = 1;
/// The segment header's magic: `LSLOG\0\0`, then the version byte.
pub(crate) const MAGIC: [u8; 8] = *b"LSLOG\0\0\x02";
/// An event's checksum before its encoding (version 2), in bytes.
pub(crate) const EVENT_CRC_LEN: usize = 4;
/// The segment header's size, in bytes.
pub(crate) const HEADER_LEN: usize = 16;
/// A record's frame (length and CRC), in bytes.
pub(crate) const FRAME_LEN: usize = 8;
/// A payload's fixed part (first position and count), in bytes.
pub(crate) const PAYLOAD_FIXED: usize = 12;
/// The largest payload a record may hold, in bytes.
pub(crate) const MAX_PAYLOAD: usize = u32::MAX as usize;
/// The smallest payload a record can have, in bytes: the fixed part and one event with a
/// one-byte type, no tags and no data (`type_len | type | tag_count | data_len`), in version 1
/// (version 2's is [`EVENT_CRC_LEN`] more; the smaller bound serves both).
pub(crate) const MIN_PAYLOAD: usize = PAYLOAD_FIXED + 2 + 1 + 2 + 4;

const _: () = assert!(MAGIC[7] == FORMAT_VERSION);

/// The header of the segment starting at `first`.
pub(crate) fn header(first: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(&MAGIC);
    h[8..].copy_from_slice(&first.to_le_bytes());
    h
}

/// The checksum of the event at `position` whose encoding is `event` (version 2).
pub(crate) fn event_crc(position: u64, event: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&position.to_le_bytes()), event)
}

/// Appends the record (of this build's version) of the append `events` starting at position
/// `first` to `buf`, and one [`Loc`] per event to `locs` (its event's frame, at an offset in
/// `buf`).
pub(crate) fn encode_record(buf: &mut Vec<u8>, first: u64, events: &[Event], locs: &mut Vec<Loc>) {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; FRAME_LEN]);
    buf.extend_from_slice(&first.to_le_bytes());
    buf.extend_from_slice(&(events.len() as u32).to_le_bytes());
    for (i, e) in events.iter().enumerate() {
        let frame_start = buf.len();
        buf.extend_from_slice(&[0u8; EVENT_CRC_LEN]);
        let event_start = buf.len();
        buf.extend_from_slice(&(e.event_type().len() as u16).to_le_bytes());
        buf.extend_from_slice(e.event_type().as_bytes());
        buf.extend_from_slice(&(e.tag_slice().len() as u16).to_le_bytes());
        for t in e.tags() {
            buf.extend_from_slice(&(t.len() as u16).to_le_bytes());
            buf.extend_from_slice(t.as_bytes());
        }
        buf.extend_from_slice(&(e.data().len() as u32).to_le_bytes());
        let data_at = (buf.len() - frame_start) as u32;
        buf.extend_from_slice(e.data());
        debug_assert_eq!(buf.len() - event_start, e.encoded_len(), "Event::encoded_len is this layout");
        let crc = event_crc(first + i as u64, &buf[event_start..]);
        buf[frame_start..event_start].copy_from_slice(&crc.to_le_bytes());
        let frame_len = (buf.len() - frame_start) as u32;
        locs.push(Loc::new(frame_start as u64, frame_len, data_at, e.data().len() as u32));
    }
    let len = (buf.len() - start - FRAME_LEN) as u32;
    let len_bytes = len.to_le_bytes();
    let crc = crc32c::crc32c_append(crc32c::crc32c(&len_bytes), &buf[start + FRAME_LEN..]);
    buf[start..start + 4].copy_from_slice(&len_bytes);
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Why a record could not be read.
#[derive(Debug)]
pub(crate) enum RecordError {
    /// Incomplete or failing its CRC: what a torn write leaves, or damage (recovery tells the
    /// two apart by what follows, see the module docs).
    Torn(&'static str),
    /// Whole and CRC-valid, yet wrong: corruption, never a torn write.
    Invalid(String),
}

/// A cursor over the bytes of a segment.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    end: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<std::ops::Range<usize>, RecordError> {
        if self.end - self.at < n {
            return Err(RecordError::Invalid(format!("field of {n} bytes runs past the record")));
        }
        self.at += n;
        Ok(self.at - n..self.at)
    }

    fn u16(&mut self) -> Result<usize, RecordError> {
        let r = self.take(2)?;
        Ok(u16::from_le_bytes(self.bytes[r].try_into().expect("2 bytes")) as usize)
    }

    fn u32(&mut self) -> Result<usize, RecordError> {
        let r = self.take(4)?;
        Ok(u32::from_le_bytes(self.bytes[r].try_into().expect("4 bytes")) as usize)
    }

    fn name(&mut self) -> Result<&'a str, RecordError> {
        let n = self.u16()?;
        if n == 0 || n > MAX_NAME_LEN {
            return Err(RecordError::Invalid(format!("name of {n} bytes")));
        }
        let r = self.take(n)?;
        std::str::from_utf8(&self.bytes[r]).map_err(|_| RecordError::Invalid("name is not UTF-8".into()))
    }
}

/// Reads the record at `at` in `bytes` (a whole segment) into `index` (whose version says the
/// record's layout): its events' names and payload locations, every checksum checked. Returns
/// its first position, its event count and its total length; on an error `index` is as it was
/// (but for names added).
pub(crate) fn decode_record(
    bytes: &[u8],
    at: usize,
    index: &mut SegmentIndex,
) -> Result<(u64, usize, usize), RecordError> {
    let rest = bytes.len() - at;
    if rest < FRAME_LEN {
        return Err(RecordError::Torn("incomplete record frame"));
    }
    let len_bytes: [u8; 4] = bytes[at..at + 4].try_into().expect("4 bytes");
    let len = u32::from_le_bytes(len_bytes) as usize;
    let crc = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().expect("4 bytes"));
    if rest - FRAME_LEN < len {
        return Err(RecordError::Torn("record runs past the end of the segment"));
    }
    let payload = &bytes[at + FRAME_LEN..at + FRAME_LEN + len];
    if crc32c::crc32c_append(crc32c::crc32c(&len_bytes), payload) != crc {
        return Err(RecordError::Torn("record fails its CRC32C"));
    }
    let before = index.events.len();
    let result = decode_events(bytes, at, len, index);
    if result.is_err() {
        index.truncate(before);
    }
    result
}

fn decode_events(
    bytes: &[u8],
    at: usize,
    len: usize,
    index: &mut SegmentIndex,
) -> Result<(u64, usize, usize), RecordError> {
    let mut r = Reader { bytes, at: at + FRAME_LEN, end: at + FRAME_LEN + len };
    let first_r = r.take(8)?;
    let first = u64::from_le_bytes(bytes[first_r].try_into().expect("8 bytes"));
    let count = r.u32()?;
    if count == 0 {
        return Err(RecordError::Invalid("record of no events".into()));
    }
    let frame_len =
        u32::try_from(FRAME_LEN + len).map_err(|_| RecordError::Invalid("record too long".into()))?;
    let per_event = index.version >= 2;
    let mut tags: Vec<u32> = Vec::new();
    for i in 0..count {
        let frame_start = r.at;
        let crc = if per_event { Some(r.u32()? as u32) } else { None };
        let ty = r.name()?;
        let ty = index.name(ty);
        let ntags = r.u16()?;
        if ntags > MAX_TAGS {
            return Err(RecordError::Invalid(format!("{ntags} tags")));
        }
        tags.clear();
        let mut prev: Option<&str> = None;
        for _ in 0..ntags {
            let t = r.name()?;
            if prev.is_some_and(|p| p >= t) {
                return Err(RecordError::Invalid("tags not sorted and unique".into()));
            }
            prev = Some(t);
            tags.push(index.name(t));
        }
        let n = r.u32()?;
        let data = r.take(n)?;
        let loc = match crc {
            Some(crc) => {
                let position = first.wrapping_add(i as u64);
                if event_crc(position, &bytes[frame_start + EVENT_CRC_LEN..data.end]) != crc {
                    return Err(RecordError::Invalid(format!(
                        "the event at position {position} fails its CRC32C"
                    )));
                }
                let len = (data.end - frame_start) as u32;
                Loc::new(frame_start as u64, len, (data.start - frame_start) as u32, n as u32)
            }
            None => Loc::new(at as u64, frame_len, (data.start - at) as u32, n as u32),
        };
        index.push(ty, &tags, loc);
    }
    if r.at != r.end {
        return Err(RecordError::Invalid("bytes left over after the last event".into()));
    }
    Ok((first, count, FRAME_LEN + len))
}

/// Whether a whole frame whose CRC32C checks starts at `at` in `bytes`, with a payload of at
/// least [`MIN_PAYLOAD`] bytes: what only a completed write of a record leaves.
fn crc_valid_frame_at(bytes: &[u8], at: usize) -> bool {
    let Some(frame) = bytes.get(at..at + FRAME_LEN) else { return false };
    let len = u32::from_le_bytes(frame[..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(frame[4..].try_into().expect("4 bytes"));
    if len < MIN_PAYLOAD || bytes.len() - at - FRAME_LEN < len {
        return false;
    }
    let payload = &bytes[at + FRAME_LEN..at + FRAME_LEN + len];
    crc32c::crc32c_append(crc32c::crc32c(&frame[..4]), payload) == crc
}

/// The first offset after `bad` (the start of a record that failed) at which a whole,
/// CRC-valid frame starts, if any: the proof that `bad` is damage, not a torn tail (see the
/// module docs). Tries every byte offset, since the bad record's own length may be what is
/// damaged.
pub(crate) fn valid_frame_after(bytes: &[u8], bad: usize) -> Option<usize> {
    let last_start = bytes.len().checked_sub(FRAME_LEN + MIN_PAYLOAD)?;
    (bad + 1..=last_start).find(|&at| crc_valid_frame_at(bytes, at))
}

/// The segment appends go on in after recovery.
#[derive(Debug)]
pub(crate) struct LastSegment {
    pub(crate) path: PathBuf,
    pub(crate) first: u64,
    /// Its length after recovery (a torn tail truncated away).
    pub(crate) len: u64,
    pub(crate) file: Arc<SegmentFile>,
    /// What recovery made of its records (for its index when the writer seals it).
    pub(crate) blocks: Vec<Arc<Block>>,
}

/// What recovery found.
#[derive(Debug)]
pub(crate) struct Recovered {
    /// The next position to assign (recovered max + 1).
    pub(crate) next: u64,
    /// The segment appends go on in; `None` for a directory with no segment yet.
    pub(crate) last: Option<LastSegment>,
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> OpenError + 'a {
    move |source| OpenError::Io { op, path: path.to_path_buf(), source }
}

/// Checks a segment's header (`bytes`, its first bytes): magic, version, first position.
/// Returns its version.
pub(crate) fn check_header(path: &Path, bytes: &[u8], first: u64) -> Result<u8, OpenError> {
    if bytes[..7] == MAGIC[..7] && !(OLDEST_VERSION..=FORMAT_VERSION).contains(&bytes[7]) {
        return Err(OpenError::UnsupportedVersion {
            file: path.to_path_buf(),
            found: bytes[7],
            supported: FORMAT_VERSION,
        });
    }
    if bytes[..7] != MAGIC[..7] || bytes[8..16] != first.to_le_bytes() {
        return Err(OpenError::Corrupt {
            segment: path.to_path_buf(),
            offset: 0,
            reason: "not a lanestream log segment header, or a header naming another position".into(),
        });
    }
    Ok(bytes[7])
}

/// Reads and checks the header of the segment `path` (first position `first`): its version.
pub(crate) fn read_header(path: &Path, first: u64) -> Result<u8, OpenError> {
    use std::io::Read;
    let mut head = [0u8; HEADER_LEN];
    fs::File::open(path).and_then(|mut f| f.read_exact(&mut head)).map_err(io_err("reading", path))?;
    check_header(path, &head, first)
}

/// Recovers the log in `dir`, calling `on_segment(index, file)` for every segment in order (its
/// events at positions `index.first..index.next()`), which returns the blocks it stored them in.
/// Sealed segments come from their index files when those can be trusted, and are scanned (and
/// their index files written again) otherwise; the last segment is always scanned.
pub(crate) fn recover(
    dir: &Path,
    cache: Option<Arc<FrameCache>>,
    on_segment: impl FnMut(&SegmentIndex, Arc<SegmentFile>) -> Arc<Block>,
) -> Result<Recovered, OpenError> {
    let mut written = Vec::new();
    let result = recover_into(dir, cache, on_segment, &mut written);
    if result.is_err() {
        // A refused open leaves the directory as it was: the index files it rebuilt go again.
        for path in written {
            let _ = fs::remove_file(path);
        }
    }
    result
}

fn recover_into(
    dir: &Path,
    cache: Option<Arc<FrameCache>>,
    mut on_segment: impl FnMut(&SegmentIndex, Arc<SegmentFile>) -> Arc<Block>,
    written: &mut Vec<PathBuf>,
) -> Result<Recovered, OpenError> {
    let listing = list_dir(dir)?;
    for tmp in &listing.tmp {
        // An index file a crash left half-written: its segment's index is rebuilt below if it
        // has none.
        fs::remove_file(tmp).map_err(io_err("removing", tmp))?;
    }
    let segments = listing.segments;
    if let Some(first) =
        listing.indexes.iter().find(|f| segments.binary_search_by_key(*f, |(s, _)| *s).is_err())
    {
        return Err(OpenError::Corrupt {
            segment: dir.join(segment_name(*first)),
            offset: 0,
            reason: format!(
                "the segment is missing, yet its index {} is there: acknowledged events may have \
                 been deleted; restore the segment from a backup or a replica",
                index_name(*first)
            ),
        });
    }
    let mut next = 1u64;
    let n = segments.len();
    let mut out = Recovered { next, last: None };
    for (i, (first, path)) in segments.iter().enumerate() {
        let is_last = i + 1 == n;
        if *first != next {
            return Err(OpenError::Corrupt {
                segment: path.clone(),
                offset: 0,
                reason: format!("segment starts at position {first}, expected {next}"),
            });
        }
        let open = |path: &Path, first: u64, version: u8| {
            SegmentFile::open(path, first, version, cache.clone())
                .map(Arc::new)
                .map_err(io_err("opening", path))
        };
        if !is_last {
            let len = fs::metadata(path).map_err(io_err("reading", path))?.len();
            if len >= HEADER_LEN as u64 {
                let version = read_header(path, *first)?;
                if let Some(index) =
                    read_index(dir, *first, len, version).map_err(io_err("reading the index of", path))?
                {
                    next = index.next();
                    on_segment(&index, open(path, *first, version)?);
                    continue;
                }
            }
            let index = scan(path, *first, false)?.0;
            let file = open(path, *first, index.version)?;
            // Best effort: without it the next open scans this segment again.
            if write_index(dir, &index).is_ok() {
                written.push(dir.join(index_name(*first)));
            }
            next = index.next();
            on_segment(&index, file);
            continue;
        }
        // The last segment: appends go on in it, so an index file of it (written by a seal that
        // a crash cut short before the next segment was created) would go stale; it is rebuilt
        // when the segment is sealed.
        let stale = dir.join(index_name(*first));
        if stale.exists() {
            fs::remove_file(&stale).map_err(io_err("removing", &stale))?;
        }
        let (index, len) = scan(path, *first, true)?;
        next = index.next();
        if index.version != FORMAT_VERSION && index.events.is_empty() {
            // An empty segment of an older version: written again, empty, in this one.
            create_segment_file(dir, *first, &header(*first)).map_err(io_err("rewriting", path))?;
        } else if index.version != FORMAT_VERSION {
            // A last segment of an older version is sealed (its index file written, best effort
            // as any seal), and appends go on in a new segment of this version (module docs).
            on_segment(&index, open(path, *first, index.version)?);
            if write_index(dir, &index).is_ok() {
                written.push(dir.join(index_name(*first)));
            }
            let path = dir.join(segment_name(next));
            create_segment_file(dir, next, &header(next)).map_err(io_err("creating", &path))?;
            let file = open(&path, next, FORMAT_VERSION)?;
            let len = HEADER_LEN as u64;
            out.last = Some(LastSegment { path, first: next, len, file, blocks: Vec::new() });
            break;
        }
        let file = open(path, *first, FORMAT_VERSION)?;
        let block = on_segment(&index, file.clone());
        let blocks = if index.events.is_empty() { Vec::new() } else { vec![block] };
        out.last = Some(LastSegment { path: path.clone(), first: *first, len, file, blocks });
    }
    out.next = next;
    Ok(out)
}

/// Scans the segment `path` (first position `first`): every record validated (module docs). In
/// the last segment (`is_last`) a torn tail is truncated away and a torn header written again.
/// Returns its index and its length after that.
fn scan(path: &Path, first: u64, is_last: bool) -> Result<(SegmentIndex, u64), OpenError> {
    let corrupt = |offset: usize, reason: String| OpenError::Corrupt {
        segment: path.to_path_buf(),
        offset: offset as u64,
        reason,
    };
    let bytes = fs::read(path).map_err(io_err("reading", path))?;
    if bytes.len() < HEADER_LEN {
        let index = SegmentIndex::new(first, FORMAT_VERSION);
        let torn_header = MAGIC[..7].starts_with(&bytes[..bytes.len().min(7)])
            && bytes.get(7).is_none_or(|v| (OLDEST_VERSION..=FORMAT_VERSION).contains(v));
        if is_last && torn_header {
            // A header torn while the segment was being created: write it again.
            let h = header(first);
            fs::write(path, h).map_err(io_err("rewriting header of", path))?;
            OpenOptions::new()
                .write(true)
                .open(path)
                .and_then(|f| f.sync_all())
                .map_err(io_err("syncing", path))?;
            return Ok((index, HEADER_LEN as u64));
        }
        return Err(corrupt(0, "segment shorter than its header".into()));
    }
    let version = check_header(path, &bytes[..HEADER_LEN], first)?;
    let mut index = SegmentIndex::new(first, version);
    let mut next = first;
    let mut at = HEADER_LEN;
    while at < bytes.len() {
        match decode_record(&bytes, at, &mut index) {
            Ok((rec_first, count, len)) => {
                if rec_first != next {
                    index.truncate(index.events.len() - count);
                    return Err(corrupt(
                        at,
                        format!("record starts at position {rec_first}, expected {next}"),
                    ));
                }
                next += count as u64;
                at += len;
            }
            Err(RecordError::Torn(why)) if is_last => {
                if let Some(valid) = valid_frame_after(&bytes, at) {
                    return Err(corrupt(
                        at,
                        format!(
                            "{why}, yet a whole CRC-valid record follows at byte {valid}: a crash \
                             never leaves a valid record after a torn one, so this is damage to \
                             acknowledged records, not a torn tail; nothing was truncated — \
                             restore the segment from a backup or a replica"
                        ),
                    ));
                }
                let file = OpenOptions::new().write(true).open(path).map_err(io_err("opening", path))?;
                file.set_len(at as u64).map_err(io_err("truncating", path))?;
                file.sync_all().map_err(io_err("syncing", path))?;
                break;
            }
            Err(RecordError::Torn(why)) => return Err(corrupt(at, why.into())),
            Err(RecordError::Invalid(why)) => return Err(corrupt(at, why)),
        }
    }
    index.len = at as u64;
    Ok((index, at as u64))
}

/// The files of a durable log, for reading back what the writer appends and indexing each
/// segment it seals.
#[derive(Debug)]
pub(crate) struct Files {
    pub(crate) dir: PathBuf,
    pub(crate) cache: Option<Arc<FrameCache>>,
    /// The segment being appended to: its first position, its read handle, the blocks written
    /// to it so far.
    pub(crate) first: u64,
    pub(crate) file: Arc<SegmentFile>,
    pub(crate) blocks: Vec<Arc<Block>>,
    /// The commit marker read-only followers poll (see `follow.rs`).
    pub(crate) marker: MarkerFile,
}

impl Files {
    /// Tells followers that the current segment is durable up to `len` bytes.
    pub(crate) fn publish(&mut self, len: u64) {
        self.marker.publish(Marker { segment: self.first, len });
    }
}

/// Appends group commits to the segments, starting a new segment when the current one is full.
#[derive(Debug)]
pub(crate) struct SegmentWriter {
    storage: Box<dyn Storage>,
    /// Bytes in the current segment, header included.
    current_len: u64,
    /// The size at which a segment is closed and the next group commit starts a new one.
    segment_bytes: u64,
    /// `None` for a storage with no files (the loom models' failing one): the payloads stay in
    /// memory.
    files: Option<Files>,
}

impl SegmentWriter {
    pub(crate) fn new(
        storage: Box<dyn Storage>,
        current_len: u64,
        segment_bytes: u64,
        files: Option<Files>,
    ) -> SegmentWriter {
        SegmentWriter { storage, current_len, segment_bytes, files }
    }

    /// Writes the records in `records` (whose first position is `first`) and syncs them: the
    /// one fsync of a group commit. Returns where they went: the segment (open for reads) and
    /// the offset of `records[0]` in it (`None` without files).
    ///
    /// A full segment is sealed first: its index file written (best effort: if that fails, the
    /// next open scans the segment instead), then the next segment created.
    pub(crate) fn commit(
        &mut self,
        records: &[u8],
        first: u64,
    ) -> io::Result<Option<(Arc<SegmentFile>, u64)>> {
        if self.current_len >= self.segment_bytes && self.current_len > HEADER_LEN as u64 {
            if let Some(files) = &mut self.files {
                let blocks = mem::take(&mut files.blocks);
                let version = files.file.version();
                let index = SegmentIndex::from_blocks(files.first, self.current_len, version, &blocks);
                let _ = write_index(&files.dir, &index);
            }
            self.storage.create_segment(first, &header(first))?;
            self.current_len = HEADER_LEN as u64;
            if let Some(files) = &mut self.files {
                let path = files.dir.join(segment_name(first));
                files.file = Arc::new(SegmentFile::open(&path, first, FORMAT_VERSION, files.cache.clone())?);
                files.first = first;
            }
        }
        let base = self.current_len;
        let mut rest = records;
        while !rest.is_empty() {
            match self.storage.write(rest) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "segment write wrote nothing")),
                Ok(n) => {
                    rest = &rest[n..];
                    self.current_len += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.storage.sync()?;
        if let Some(files) = &mut self.files {
            files.publish(self.current_len);
        }
        Ok(self.files.as_ref().map(|f| (f.file.clone(), base)))
    }

    /// Remembers a block written to the current segment (for its index when it is sealed).
    pub(crate) fn add_block(&mut self, block: Arc<Block>) {
        if let Some(files) = &mut self.files {
            files.blocks.push(block);
        }
    }
}
