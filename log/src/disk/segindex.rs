//! The persisted index of a sealed segment: `<20 digits>.idx` beside `<20 digits>.seg`, so that
//! opening a log reads each sealed segment's index instead of every record in it.
//!
//! A [`SegmentIndex`] is what a segment holds without the payloads: per event its type and tags
//! (as ids into the index's own name list) and where its payload is ([`Loc`]). It is built from a
//! scan of the segment (recovery, or a rebuild) or from the blocks the writer appended to the
//! segment (`SegmentIndex::from_blocks`, beside `Block` in `event.rs`), and written when the
//! writer seals the segment (starts the next one), before the next segment is created: to
//! `<name>.idx.tmp`, fsynced, renamed over `<name>.idx`, and the directory fsynced, so an index
//! file is whole or absent (a crash leaves at most a `.tmp`, which the next open removes).
//!
//! # Format (versions 1 and 2, all integers little-endian)
//! ```text
//! index   = magic "LSIDX\0\0" | version: u8 | first position: u64 | segment length: u64
//!           | name_count: u32 | (name_len: u16 | name) * name_count
//!           | record_count: u64 | record * record_count | crc: u32
//! record  = frame_at: u64 | frame_len: u32 | count: u32 | event * count
//! event   = type: u32 | tag_count: u16 | tag: u32 * tag_count | data_at: u32 | data_len: u32
//! crc     = CRC32C of every byte before it
//! ```
//! `type` and `tag` are ids into the names; `frame_at` and `frame_len` place the record's frame
//! in the segment, `data_at` and `data_len` the event's payload. An index file's version is its
//! segment's (one of an older segment is still written as that version): in version 1
//! `data_at` counts from the record's frame; in version 2 from the event's own frame
//! (`event_crc | event`, see `format.rs`), the events' frames lying back to back after the
//! record's 20-byte head (frame and fixed payload part), so each event's frame is where the
//! previous one ends and is `data_at + data_len` long.
//!
//! # Never trusted over the segment
//! An index file is used only if its CRC32C checks, its version is its segment's, it names the
//! segment's first position and exact length, and it describes a valid layout: frames back to
//! back from the end of the header to the end of the file, every payload inside its frame, every
//! name valid, every event's tags sorted and unique. Anything else — missing, torn, corrupt, of
//! another version or of an older, shorter segment — and the segment is scanned (every record
//! checked, as recovery does) and the index file written again. What opening cannot check
//! without reading every record (a payload byte damaged since) is checked on every read: each
//! frame read is CRC-checked before anything in it is handed out.

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::file::Loc;
use super::format::{
    EVENT_CRC_LEN, FORMAT_VERSION, FRAME_LEN, HEADER_LEN, MIN_PAYLOAD, OLDEST_VERSION, PAYLOAD_FIXED,
};
use super::storage::sync_dir;
use crate::names::{MAX_NAME_LEN, MAX_TAGS};

/// The index file's magic (then the format version byte).
pub(crate) const INDEX_MAGIC: [u8; 7] = *b"LSIDX\0\0";

/// A record's bytes before its first event's frame: its frame (length and CRC) and the fixed
/// part of its payload (first position and count).
const RECORD_HEAD: usize = FRAME_LEN + PAYLOAD_FIXED;

/// The smallest event encoding: a one-byte type, no tags, no data
/// (`type_len | type | tag_count | data_len`).
const MIN_EVENT: usize = 2 + 1 + 2 + 4;

/// One event of a segment, without its payload.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EventMeta {
    /// The type, as an id into [`SegmentIndex::names`].
    pub(crate) ty: u32,
    /// Where this event's tags end in [`SegmentIndex::tags`].
    pub(crate) tags_end: u32,
    pub(crate) loc: Loc,
}

/// What one segment holds, without the payloads (see the module docs).
#[derive(Debug)]
pub(crate) struct SegmentIndex {
    /// The position of the segment's first event.
    pub(crate) first: u64,
    /// The segment's length in bytes (header included) that the index covers.
    pub(crate) len: u64,
    /// The segment's format version (the index file's too).
    pub(crate) version: u8,
    pub(crate) names: Vec<Box<str>>,
    /// The events, at positions `first..`, in order.
    pub(crate) events: Vec<EventMeta>,
    /// Every event's tags, concatenated, as ids into `names` (each event's in name order).
    pub(crate) tags: Vec<u32>,
    /// Name -> id, while the index is being built.
    ids: HashMap<Box<str>, u32>,
}

impl SegmentIndex {
    /// An empty index of the segment starting at `first`, of format `version`.
    pub(crate) fn new(first: u64, version: u8) -> SegmentIndex {
        SegmentIndex {
            first,
            len: HEADER_LEN as u64,
            version,
            names: Vec::new(),
            events: Vec::new(),
            tags: Vec::new(),
            ids: HashMap::new(),
        }
    }

    /// The id of `name`, adding it the first time.
    pub(crate) fn name(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = u32::try_from(self.names.len()).expect("a segment holds under 2^32 names");
        self.names.push(Box::from(name));
        self.ids.insert(Box::from(name), id);
        id
    }

    /// Adds one event (its tags as ids, in name order).
    pub(crate) fn push(&mut self, ty: u32, tags: &[u32], loc: Loc) {
        self.tags.extend_from_slice(tags);
        let tags_end = u32::try_from(self.tags.len()).expect("a segment holds under 2^32 tags");
        self.events.push(EventMeta { ty, tags_end, loc });
    }

    /// Drops the events from index `events` on (a record that turned out bad half-way).
    pub(crate) fn truncate(&mut self, events: usize) {
        self.events.truncate(events);
        self.tags.truncate(self.events.last().map_or(0, |e| e.tags_end as usize));
    }

    /// The position after the segment's last event.
    pub(crate) fn next(&self) -> u64 {
        self.first + self.events.len() as u64
    }

    /// Event `i`'s tags.
    pub(crate) fn tags_of(&self, i: usize) -> &[u32] {
        let start = if i == 0 { 0 } else { self.events[i - 1].tags_end as usize };
        &self.tags[start..self.events[i].tags_end as usize]
    }

    /// The records (appends): per record, the range of its events' indexes. In version 1 a
    /// record's events share its frame; in version 2 their frames lie back to back, the next
    /// record's first one [`RECORD_HEAD`] bytes after the previous record's last.
    pub(crate) fn records(&self) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
        let mut start = 0;
        let per_event = self.version >= 2;
        std::iter::from_fn(move || {
            let first = self.events.get(start)?;
            let mut prev = first.loc;
            let end = start
                + 1
                + self.events[start + 1..]
                    .iter()
                    .take_while(|e| {
                        let same = if per_event {
                            e.loc.frame_at() == prev.frame_at() + u64::from(prev.frame_len)
                        } else {
                            e.loc.frame_at() == first.loc.frame_at()
                        };
                        prev = e.loc;
                        same
                    })
                    .count();
            let range = start..end;
            start = end;
            Some(range)
        })
    }

    /// The index file's bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.events.len() * 28 + self.tags.len() * 4);
        out.extend_from_slice(&INDEX_MAGIC);
        out.push(self.version);
        out.extend_from_slice(&self.first.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&(self.names.len() as u32).to_le_bytes());
        for n in &self.names {
            out.extend_from_slice(&(n.len() as u16).to_le_bytes());
            out.extend_from_slice(n.as_bytes());
        }
        let records: Vec<_> = self.records().collect();
        out.extend_from_slice(&(records.len() as u64).to_le_bytes());
        for r in records {
            let (frame_at, frame_len) = if self.version >= 2 {
                let (head, last) = (self.events[r.start].loc, self.events[r.end - 1].loc);
                let at = head.frame_at() - RECORD_HEAD as u64;
                (at, (last.frame_at() + u64::from(last.frame_len) - at) as u32)
            } else {
                let loc = self.events[r.start].loc;
                (loc.frame_at(), loc.frame_len)
            };
            out.extend_from_slice(&frame_at.to_le_bytes());
            out.extend_from_slice(&frame_len.to_le_bytes());
            out.extend_from_slice(&(r.len() as u32).to_le_bytes());
            for i in r {
                let e = &self.events[i];
                out.extend_from_slice(&e.ty.to_le_bytes());
                let tags = self.tags_of(i);
                out.extend_from_slice(&(tags.len() as u16).to_le_bytes());
                for t in tags {
                    out.extend_from_slice(&t.to_le_bytes());
                }
                out.extend_from_slice(&e.loc.data_at.to_le_bytes());
                out.extend_from_slice(&e.loc.data_len.to_le_bytes());
            }
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Reads an index file's bytes, checking everything the module docs list but the segment's
    /// first position and length (the caller compares those with the segment).
    ///
    /// # Errors
    /// Why the bytes are not a valid index (the caller rebuilds it from the segment).
    pub(crate) fn decode(bytes: &[u8]) -> Result<SegmentIndex, String> {
        let body_len = bytes.len().checked_sub(4).ok_or("shorter than its checksum")?;
        let (body, crc) = bytes.split_at(body_len);
        if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            return Err("fails its CRC32C".into());
        }
        let mut r = Cursor { bytes: body, at: 0 };
        if r.take(7)? != INDEX_MAGIC {
            return Err("not a lanestream log index".into());
        }
        let version = r.take(1)?[0];
        if !(OLDEST_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(format!("format version {version}, not {OLDEST_VERSION} to {FORMAT_VERSION}"));
        }
        let per_event = version >= 2;
        let mut index = SegmentIndex::new(r.u64()?, version);
        index.len = r.u64()?;
        let names = r.u32()? as usize;
        if names > body.len() {
            return Err("more names than bytes".into());
        }
        for _ in 0..names {
            let n = r.u16()? as usize;
            if n == 0 || n > MAX_NAME_LEN {
                return Err(format!("name of {n} bytes"));
            }
            let name = std::str::from_utf8(r.take(n)?).map_err(|_| "name is not UTF-8")?;
            index.names.push(Box::from(name));
        }
        let records = r.u64()?;
        let mut frame_at = HEADER_LEN as u64;
        let mut tags = Vec::new();
        for _ in 0..records {
            let at = r.u64()?;
            let frame_len = r.u32()?;
            let count = r.u32()?;
            if at != frame_at {
                return Err(format!("a record at byte {at} where the previous one ends at {frame_at}"));
            }
            if (frame_len as usize) < FRAME_LEN + MIN_PAYLOAD || count == 0 {
                return Err(format!("a record of {frame_len} bytes and {count} events at byte {at}"));
            }
            let record_end = at + u64::from(frame_len);
            // Version 2: where the next event's frame starts.
            let mut event_at = at + RECORD_HEAD as u64;
            for _ in 0..count {
                let ty = r.id(index.names.len())?;
                let ntags = r.u16()? as usize;
                if ntags > MAX_TAGS {
                    return Err(format!("{ntags} tags"));
                }
                tags.clear();
                for _ in 0..ntags {
                    let t = r.id(index.names.len())?;
                    if tags
                        .last()
                        .is_some_and(|&prev: &u32| index.names[prev as usize] >= index.names[t as usize])
                    {
                        return Err("tags not sorted and unique".into());
                    }
                    tags.push(t);
                }
                let (data_at, data_len) = (r.u32()?, r.u32()?);
                let loc = if per_event {
                    let len = u64::from(data_at) + u64::from(data_len);
                    if (data_at as usize) < EVENT_CRC_LEN + MIN_EVENT || event_at + len > record_end {
                        return Err(format!("an event outside its record at byte {at}"));
                    }
                    let loc = Loc::new(event_at, len as u32, data_at, data_len);
                    event_at += len;
                    loc
                } else {
                    if (data_at as usize) < FRAME_LEN + PAYLOAD_FIXED
                        || u64::from(data_at) + u64::from(data_len) > u64::from(frame_len)
                    {
                        return Err(format!("a payload outside its record at byte {at}"));
                    }
                    Loc::new(at, frame_len, data_at, data_len)
                };
                index.push(ty, &tags, loc);
            }
            if per_event && event_at != record_end {
                return Err(format!("the events of the record at byte {at} do not fill it"));
            }
            frame_at = record_end;
        }
        if r.at != body.len() {
            return Err("bytes left over after the last record".into());
        }
        if frame_at != index.len {
            return Err(format!("records end at byte {frame_at}, the segment at {}", index.len));
        }
        Ok(index)
    }
}

/// A reader over an index file's bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.bytes.len() - self.at < n {
            return Err("ends in the middle of a field".into());
        }
        self.at += n;
        Ok(&self.bytes[self.at - n..self.at])
    }

    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    /// A name id below `names`.
    fn id(&mut self, names: usize) -> Result<u32, String> {
        let id = self.u32()?;
        if id as usize >= names {
            return Err(format!("name id {id} of {names}"));
        }
        Ok(id)
    }
}

/// The file name of the index of the segment starting at `first`: 20 decimal digits and `.idx`.
pub(crate) fn index_name(first: u64) -> String {
    format!("{first:020}.idx")
}

/// The path an index is written to before it is renamed into place.
pub(crate) fn index_tmp_path(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("{first:020}.idx.tmp"))
}

/// Writes `index` as the index file of its segment in `dir`: to a temporary file, fsynced,
/// renamed into place, the directory fsynced (see the module docs). A failure leaves no index
/// file (the next open rebuilds it) and at most the temporary one.
pub(crate) fn write_index(dir: &Path, index: &SegmentIndex) -> io::Result<()> {
    let tmp = index_tmp_path(dir, index.first);
    let result = (|| {
        let mut file = OpenOptions::new().create(true).truncate(true).write(true).open(&tmp)?;
        file.write_all(&index.encode())?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, dir.join(index_name(index.first)))?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Reads the index file of the segment starting at `first` (`len` bytes long, of format
/// `version`) in `dir`, if there is one and it can be trusted (module docs); `Ok(None)` when it
/// must be rebuilt.
///
/// # Errors
/// Only an error reading an index file that is there (not a missing or bad one).
pub(crate) fn read_index(dir: &Path, first: u64, len: u64, version: u8) -> io::Result<Option<SegmentIndex>> {
    let path = dir.join(index_name(first));
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(SegmentIndex::decode(&bytes)
        .ok()
        .filter(|index| index.first == first && index.len == len && index.version == version))
}
