//! Segments on disk: the record framing, the event encoding, recovery on open, and the segment
//! writer that appends one group commit at a time.
//!
//! # Format
//! A log directory holds segment files named by the position of their first event
//! (`00000000000000000001.seg`, 20 digits). A segment is a 16-byte header — the magic
//! `LSLOG\0\0\x01` then the first position (u64, little-endian) — followed by records. A record is
//! one whole append, so an append is on disk entirely or not at all:
//!
//! ```text
//! record  = len: u32 | crc: u32 | payload (len bytes)         crc = CRC32C(len bytes ++ payload)
//! payload = first position: u64 | count: u32 | event * count
//! event   = type_len: u16 | type | tag_count: u16 | (tag_len: u16 | tag) * tag_count
//!           | data_len: u32 | data                              (all integers little-endian)
//! ```
//!
//! # Recovery
//! Opening reads every segment in order and validates every record: its length, its CRC32C, that
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
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::error::OpenError;
use super::event::{Event, MAX_NAME_LEN, MAX_TAGS};
use super::storage::{list_segments, Storage};

/// The segment header's magic.
pub(crate) const MAGIC: [u8; 8] = *b"LSLOG\0\0\x01";
/// The segment header's size, in bytes.
pub(crate) const HEADER_LEN: usize = 16;
/// A record's frame (length and CRC), in bytes.
pub(crate) const FRAME_LEN: usize = 8;
/// A payload's fixed part (first position and count), in bytes.
pub(crate) const PAYLOAD_FIXED: usize = 12;
/// The largest payload a record may hold, in bytes.
pub(crate) const MAX_PAYLOAD: usize = u32::MAX as usize;
/// The smallest payload a record can have, in bytes: the fixed part and one event with a
/// one-byte type, no tags and no data (`type_len | type | tag_count | data_len`).
pub(crate) const MIN_PAYLOAD: usize = PAYLOAD_FIXED + 2 + 1 + 2 + 4;

/// The header of the segment starting at `first`.
pub(crate) fn header(first: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(&MAGIC);
    h[8..].copy_from_slice(&first.to_le_bytes());
    h
}

/// Appends the record of the append `events` starting at position `first` to `buf`.
pub(crate) fn encode_record(buf: &mut Vec<u8>, first: u64, events: &[Event]) {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; FRAME_LEN]);
    buf.extend_from_slice(&first.to_le_bytes());
    buf.extend_from_slice(&(events.len() as u32).to_le_bytes());
    for e in events {
        let event_start = buf.len();
        buf.extend_from_slice(&(e.event_type().len() as u16).to_le_bytes());
        buf.extend_from_slice(e.event_type().as_bytes());
        buf.extend_from_slice(&(e.tag_slice().len() as u16).to_le_bytes());
        for t in e.tags() {
            buf.extend_from_slice(&(t.len() as u16).to_le_bytes());
            buf.extend_from_slice(t.as_bytes());
        }
        buf.extend_from_slice(&(e.data().len() as u32).to_le_bytes());
        buf.extend_from_slice(e.data());
        debug_assert_eq!(buf.len() - event_start, e.encoded_len(), "Event::encoded_len is this layout");
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

/// A cursor over the bytes of a segment (all of it in memory; event payloads are slices of it).
struct Reader<'a> {
    bytes: &'a Bytes,
    at: usize,
    end: usize,
}

impl Reader<'_> {
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

    fn name(&mut self) -> Result<Box<str>, RecordError> {
        let n = self.u16()?;
        if n == 0 || n > MAX_NAME_LEN {
            return Err(RecordError::Invalid(format!("name of {n} bytes")));
        }
        let r = self.take(n)?;
        std::str::from_utf8(&self.bytes[r])
            .map(Box::from)
            .map_err(|_| RecordError::Invalid("name is not UTF-8".into()))
    }
}

/// Reads the record at `at` in `bytes`: its first position, its events and its total length.
pub(crate) fn decode_record(bytes: &Bytes, at: usize) -> Result<(u64, Vec<Event>, usize), RecordError> {
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
    let mut r = Reader { bytes, at: at + FRAME_LEN, end: at + FRAME_LEN + len };
    let first_r = r.take(8)?;
    let first = u64::from_le_bytes(bytes[first_r].try_into().expect("8 bytes"));
    let count = r.u32()?;
    if count == 0 {
        return Err(RecordError::Invalid("record of no events".into()));
    }
    let mut events = Vec::with_capacity(count.min(len / 8));
    for _ in 0..count {
        let event_type = r.name()?;
        let ntags = r.u16()?;
        if ntags > MAX_TAGS {
            return Err(RecordError::Invalid(format!("{ntags} tags")));
        }
        let mut tags: Vec<Box<str>> = Vec::with_capacity(ntags);
        for _ in 0..ntags {
            let t = r.name()?;
            if tags.last().is_some_and(|prev| **prev >= *t) {
                return Err(RecordError::Invalid("tags not sorted and unique".into()));
            }
            tags.push(t);
        }
        let n = r.u32()?;
        let data = bytes.slice(r.take(n)?);
        events.push(Event::from_parts(event_type, tags.into_boxed_slice(), data));
    }
    if r.at != r.end {
        return Err(RecordError::Invalid("bytes left over after the last event".into()));
    }
    Ok((first, events, FRAME_LEN + len))
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

/// What recovery found.
#[derive(Debug)]
pub(crate) struct Recovered {
    /// The next position to assign (recovered max + 1).
    pub(crate) next: u64,
    /// The segment appends go on in, and whether it still has to be created.
    pub(crate) last: Option<PathBuf>,
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> OpenError + 'a {
    move |source| OpenError::Io { op, path: path.to_path_buf(), source }
}

/// Recovers the log in `dir`, calling `on_append(first, events)` for every record (one append)
/// in order, `first` being the position of its first event.
pub(crate) fn recover(
    dir: &Path,
    mut on_append: impl FnMut(u64, Vec<Event>),
) -> Result<Recovered, OpenError> {
    let segments = list_segments(dir).map_err(io_err("listing", dir))?;
    let mut next = 1u64;
    let n = segments.len();
    for (i, (first, path)) in segments.iter().enumerate() {
        let is_last = i + 1 == n;
        let corrupt = |offset: usize, reason: String| OpenError::Corrupt {
            segment: path.clone(),
            offset: offset as u64,
            reason,
        };
        let bytes = Bytes::from(fs::read(path).map_err(io_err("reading", path))?);
        if *first != next {
            return Err(corrupt(0, format!("segment starts at position {first}, expected {next}")));
        }
        if bytes.len() < HEADER_LEN {
            if is_last && MAGIC.starts_with(&bytes[..bytes.len().min(8)]) {
                // A header torn while the segment was being created: write it again.
                let h = header(*first);
                fs::write(path, h).map_err(io_err("rewriting header of", path))?;
                OpenOptions::new()
                    .write(true)
                    .open(path)
                    .and_then(|f| f.sync_all())
                    .map_err(io_err("syncing", path))?;
                continue;
            }
            return Err(corrupt(0, "segment shorter than its header".into()));
        }
        if bytes[..8] != MAGIC || bytes[8..16] != first.to_le_bytes() {
            return Err(corrupt(
                0,
                "not a lanestream log segment header, or a header naming another position".into(),
            ));
        }
        let mut at = HEADER_LEN;
        while at < bytes.len() {
            match decode_record(&bytes, at) {
                Ok((rec_first, events, len)) => {
                    if rec_first != next {
                        return Err(corrupt(
                            at,
                            format!("record starts at position {rec_first}, expected {next}"),
                        ));
                    }
                    next += events.len() as u64;
                    on_append(rec_first, events);
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
    }
    Ok(Recovered { next, last: segments.last().map(|(_, p)| p.clone()) })
}

/// Appends group commits to the segments, starting a new segment when the current one is full.
#[derive(Debug)]
pub(crate) struct SegmentWriter {
    storage: Box<dyn Storage>,
    /// Bytes in the current segment, header included.
    current_len: u64,
    /// The size at which a segment is closed and the next group commit starts a new one.
    segment_bytes: u64,
}

impl SegmentWriter {
    pub(crate) fn new(storage: Box<dyn Storage>, current_len: u64, segment_bytes: u64) -> SegmentWriter {
        SegmentWriter { storage, current_len, segment_bytes }
    }

    /// Writes the records in `records` (whose first position is `first`) and syncs them: the
    /// one fsync of a group commit.
    pub(crate) fn commit(&mut self, records: &[u8], first: u64) -> io::Result<()> {
        if self.current_len >= self.segment_bytes && self.current_len > HEADER_LEN as u64 {
            self.storage.create_segment(first, &header(first))?;
            self.current_len = HEADER_LEN as u64;
        }
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
        self.storage.sync()
    }
}
