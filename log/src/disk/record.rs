//! Reading a segment's records back (LevelDB's log reader; the writer's side is
//! `segment_writer.rs`, beside this folder): [`decode_record`] checks one record — its frame,
//! its CRC32C, its events' layout (`format.rs`) and, in version 2, each event's own CRC32C — and
//! takes its events into a [`SegmentIndex`]. A record that fails says whether a torn write could
//! have left it ([`RecordError::Torn`]: incomplete, or failing its CRC) or not
//! ([`RecordError::Invalid`]: whole and CRC-valid, yet wrong), and [`valid_frame_after`] is the
//! test that tells a torn tail from damage: a whole, CRC-valid frame after a bad record, which a
//! crash never leaves. What a failure means is the caller's to say: recovery truncates a torn
//! tail of the last segment and refuses anything else (`recovery.rs`), a follower stops at any
//! (`follow.rs`).

use super::file::Loc;
use super::format::{EVENT_CRC_LEN, FRAME_LEN, MIN_PAYLOAD, event_crc};
use super::segindex::SegmentIndex;
use crate::names::{MAX_NAME_LEN, MAX_TAGS};

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
