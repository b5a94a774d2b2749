//! Reading events back from the segment files: [`SegmentFile`] (one segment, open for
//! positioned reads), [`Loc`] (where an event's payload is) and the log's bounded cache of
//! frames ([`FrameCache`]).
//!
//! **What one read reads.** A *frame* is the bytes one CRC32C covers and a read fetches and
//! checks as one. In format version 2 it is one event (its own checksum, then its encoding), so
//! a cold read of one event reads and verifies that event's bytes only — about 300 bytes for a
//! 256-byte payload, however large the append it came in. In version 1 (still read: a log
//! written before keeps opening) it is the whole record of the append, so a cold read of one
//! event of an append of 512 reads and checks all 512.
//!
//! **Why positioned reads (`pread`), not a memory map.** (The one map the log makes is the
//! writer's 20-byte commit marker, see `marker.rs`.) A read is one `pread(2)` of one frame into
//! a buffer the event's payload then shares (`Bytes`), with
//! [`std::os::unix::fs::FileExt::read_exact_at`] (`seek_read` on Windows): no `unsafe`, and an
//! error — a failing disk, a file cut short by someone else — comes back as an error of that
//! read. A memory map (`memmap2`) would be `unsafe` to create, turn the same failures into
//! `SIGBUS` in whichever thread touches the page, and count every page it touched in the
//! process's resident set, which is what the cache budget is meant to bound; a cold read
//! through a map would also fault in whole pages (and the kernel's read-ahead around them)
//! where a `pread` of an event's range copies just that range out of the page cache. The page
//! cache still serves repeated reads of hot files; [`FrameCache`] keeps checked frames so a hot
//! event costs no system call at all.
//!
//! Every frame read is checked before any of it is handed out: in version 2 the event's
//! CRC32C, which covers its position too (so a frame read at a wrong offset, or the event of
//! another position, fails it), and that the payload ends the frame with the length its prefix
//! says; in version 1 the record's length field, its CRC32C and that the record holds the
//! position asked for. A mismatch is [`ReadError::Corrupt`], naming the segment and the offset,
//! never a wrong event.

use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use super::format::{EVENT_CRC_LEN, FRAME_LEN, PAYLOAD_FIXED, event_crc};
use crate::error::ReadError;

/// Where one event's payload is in its segment: the frame holding it (the event's own in format
/// version 2, its append's record in version 1; see the module docs) and the payload's place
/// inside that frame. 20 bytes (the frame's offset kept as two `u32` halves, so the struct needs
/// no 8-byte alignment: it is kept once per event).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Loc {
    /// The frame's first byte, from the start of the segment file: low and high halves.
    frame_at: [u32; 2],
    /// The whole frame's length, in bytes (its checksum included: the event's 4 bytes in
    /// version 2, the record's 8-byte length and checksum in version 1).
    pub(crate) frame_len: u32,
    /// The payload's first byte, from the frame's first byte.
    pub(crate) data_at: u32,
    /// The payload's length, in bytes.
    pub(crate) data_len: u32,
}

const _: () = assert!(std::mem::size_of::<Loc>() == 20);

impl Loc {
    /// The location of a payload of `data_len` bytes at `data_at` in the frame of `frame_len`
    /// bytes at byte `frame_at` of its segment.
    pub(crate) fn new(frame_at: u64, frame_len: u32, data_at: u32, data_len: u32) -> Loc {
        Loc { frame_at: [frame_at as u32, (frame_at >> 32) as u32], frame_len, data_at, data_len }
    }

    /// The frame's first byte, from the start of the segment file.
    pub(crate) fn frame_at(&self) -> u64 {
        u64::from(self.frame_at[0]) | u64::from(self.frame_at[1]) << 32
    }

    /// Moves the frame `by` bytes further into the file (a group commit's locations are taken
    /// relative to its buffer, then placed where the buffer was written).
    pub(crate) fn shift(&mut self, by: u64) {
        *self = Loc::new(self.frame_at() + by, self.frame_len, self.data_at, self.data_len);
    }
}

/// The log's cache of frames read from the segments, bounded by bytes
/// ([`LogOptions::cache_bytes`](crate::LogOptions::cache_bytes)); keyed by segment (its first
/// position) and frame offset. Shared by every segment of a log and every reader; `quick_cache`
/// (sharded, scan-resistant CLOCK-Pro) does the bookkeeping.
pub(crate) struct FrameCache(quick_cache::sync::Cache<(u64, u64), Bytes, FrameWeight>);

/// A frame's weight in the cache: its length plus [`ENTRY_BYTES`], in bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FrameWeight;

/// What one cached frame costs beyond its bytes, counted in its weight so that the budget
/// bounds the memory the cache holds, not only the frames' bytes: the cache's entry (key,
/// `Bytes` handle, bookkeeping), the `Bytes` buffer's shared header and the allocator's
/// rounding. It matters for frames of one event (a few hundred bytes; version 2), where it is
/// a third of the cost; `tests/footprint.rs` checks the budget holds with 256-byte payloads.
pub(crate) const ENTRY_BYTES: u64 = 192;

impl quick_cache::Weighter<(u64, u64), Bytes> for FrameWeight {
    fn weight(&self, _key: &(u64, u64), frame: &Bytes) -> u64 {
        frame.len() as u64 + ENTRY_BYTES
    }
}

impl FrameCache {
    /// A cache of at most `bytes` bytes of frames (at least 1).
    pub(crate) fn new(bytes: u64) -> FrameCache {
        // The estimate only sizes the cache's tables: frames of about 512 bytes (an event of a
        // few hundred bytes in version 2).
        let items = usize::try_from((bytes / 512).clamp(16, 1 << 24)).unwrap_or(1 << 24);
        FrameCache(quick_cache::sync::Cache::with_weighter(items, bytes, FrameWeight))
    }
}

impl fmt::Debug for FrameCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameCache")
            .field("bytes", &self.0.weight())
            .field("capacity", &self.0.capacity())
            .finish()
    }
}

/// One segment file, open for reads.
pub(crate) struct SegmentFile {
    path: PathBuf,
    /// The segment's first position (its name; half of each cache key).
    first: u64,
    /// The format version of its header: how its frames are laid out and checked.
    version: u8,
    file: File,
    cache: Option<Arc<FrameCache>>,
}

impl SegmentFile {
    /// Opens the segment `path` (whose first position is `first`, whose header says format
    /// `version`, checked by the caller) for reads.
    pub(crate) fn open(
        path: &Path,
        first: u64,
        version: u8,
        cache: Option<Arc<FrameCache>>,
    ) -> io::Result<SegmentFile> {
        Ok(SegmentFile { path: path.to_path_buf(), first, version, file: File::open(path)?, cache })
    }

    /// The format version of the segment.
    pub(crate) fn version(&self) -> u8 {
        self.version
    }

    /// Bytes `offset..offset + len` of the file.
    pub(crate) fn read_at(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        read_exact_at(&self.file, &mut buf, offset)?;
        Ok(buf)
    }

    /// The payload at `loc`, of the event at `position`: from the cache, or read from the file
    /// and checked (see the module docs).
    ///
    /// # Errors
    /// [`ReadError::Io`] when the read fails, [`ReadError::Corrupt`] when the frame read is not
    /// the whole, CRC-valid frame of `position` (see the module docs).
    pub(crate) fn payload(&self, loc: &Loc, position: u64) -> Result<Bytes, ReadError> {
        let frame = self.frame(loc, position)?;
        let (at, len) = (loc.data_at as usize, loc.data_len as usize);
        Ok(frame.slice(at..at + len))
    }

    fn frame(&self, loc: &Loc, position: u64) -> Result<Bytes, ReadError> {
        let key = (self.first, loc.frame_at());
        if let Some(frame) = self.cache.as_ref().and_then(|c| c.0.get(&key)) {
            return Ok(frame);
        }
        let mut buf = vec![0u8; loc.frame_len as usize];
        read_exact_at(&self.file, &mut buf, loc.frame_at()).map_err(|source| ReadError::Io {
            segment: self.path.clone(),
            offset: loc.frame_at(),
            source: Arc::new(source),
        })?;
        self.check(&buf, loc, position)?;
        let frame = Bytes::from(buf);
        if let Some(cache) = &self.cache {
            cache.0.insert(key, frame.clone());
        }
        Ok(frame)
    }

    /// Checks a frame read at `loc` for the event at `position` (see the module docs).
    fn check(&self, frame: &[u8], loc: &Loc, position: u64) -> Result<(), ReadError> {
        let corrupt = |reason: String| ReadError::Corrupt {
            segment: self.path.clone(),
            offset: loc.frame_at(),
            reason,
        };
        if self.version == 1 {
            return check_record(frame, loc, position).map_err(corrupt);
        }
        let (data_at, data_len) = (loc.data_at as usize, loc.data_len as usize);
        if frame.len() < EVENT_CRC_LEN || data_at < EVENT_CRC_LEN + 4 || data_at + data_len != frame.len() {
            return Err(corrupt(format!(
                "event frame of {} bytes cannot hold a payload of {data_len} at byte {data_at}",
                frame.len()
            )));
        }
        let crc = u32::from_le_bytes(frame[..EVENT_CRC_LEN].try_into().expect("4 bytes"));
        if event_crc(position, &frame[EVENT_CRC_LEN..]) != crc {
            return Err(corrupt(format!("the event at position {position} fails its CRC32C")));
        }
        let len = u32::from_le_bytes(frame[data_at - 4..data_at].try_into().expect("4 bytes")) as usize;
        if len != data_len {
            return Err(corrupt(format!("payload of {len} bytes where the index says {data_len}")));
        }
        Ok(())
    }
}

/// Checks a version-1 frame (a whole record) read at `loc` for the event at `position`.
fn check_record(frame: &[u8], loc: &Loc, position: u64) -> Result<(), String> {
    if frame.len() < FRAME_LEN {
        return Err(format!("record frame of {} bytes", frame.len()));
    }
    let len_bytes: [u8; 4] = frame[..4].try_into().expect("4 bytes");
    let len = u32::from_le_bytes(len_bytes) as usize;
    if len + FRAME_LEN != frame.len() || len < PAYLOAD_FIXED {
        return Err(format!("record of {len} bytes where the index says {}", frame.len()));
    }
    let crc = u32::from_le_bytes(frame[4..8].try_into().expect("4 bytes"));
    if crc32c::crc32c_append(crc32c::crc32c(&len_bytes), &frame[FRAME_LEN..]) != crc {
        return Err("record fails its CRC32C".into());
    }
    let first = u64::from_le_bytes(frame[8..16].try_into().expect("8 bytes"));
    let count = u64::from(u32::from_le_bytes(frame[16..20].try_into().expect("4 bytes")));
    if position < first || position - first >= count {
        return Err(format!(
            "record holds positions {first}..{}, not {position}",
            first.saturating_add(count)
        ));
    }
    let end = loc.data_at as usize + loc.data_len as usize;
    if end > frame.len() || (loc.data_at as usize) < FRAME_LEN + PAYLOAD_FIXED {
        return Err("payload outside its record".into());
    }
    Ok(())
}

impl fmt::Debug for SegmentFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SegmentFile").field("path", &self.path).finish_non_exhaustive()
    }
}

#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(windows)]
fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match std::os::windows::fs::FileExt::seek_read(file, buf, offset) {
            Ok(0) => {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "segment ends before the record"));
            }
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
