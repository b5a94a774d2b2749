//! The layout of a segment file — its header, its records, each event's encoding and checksum —
//! and the header built, checked and read. The records are read back by `record.rs` (recovery
//! and followers) and `file.rs` (one event at a time), and written by the segment writer
//! (`segment_writer.rs`, beside this folder).
//!
//! # Format
//! A log directory holds segment files named by the position of their first event
//! (`00000000000000000001.seg`, 20 digits), the persisted index of each sealed segment beside it
//! (`00000000000000000001.idx`, see `segindex.rs`), the writer's `LOCK` file and its commit
//! marker (`COMMIT`, see `marker.rs`); nothing else (a stray file fails the open). A segment is
//! a 16-byte header — the magic `LSLOG\0\0`, the format version (one byte: [`FORMAT_VERSION`],
//! 2), then the first position (u64, little-endian) — followed by records. A file of a version
//! this build does not read (0, or above 2) fails the open ([`OpenError::UnsupportedVersion`])
//! before anything is changed. A record is one whole append, so an append is on disk entirely or
//! not at all:
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
//! CRC makes a read that lands on the wrong event fail it. A type or tag is 1 to `MAX_NAME_LEN`
//! bytes of UTF-8 and an event carries at most `MAX_TAGS` tags, in name order, each once: the
//! limits of `names.rs`, which `Event::new` enforces and every decoder checks.
//!
//! **Version 1** (written before; still read) is the same without `event_crc`: a read of one of
//! its events reads and checks the whole record. A log whose last segment is of version 1 is
//! moved on at open: that segment is sealed (its index file written, of version 1) and appends
//! go on in a new segment of version 2, so a segment never mixes versions and the writer has one
//! encoding. Nothing already written is rewritten.

use std::fs;
use std::path::Path;

use crate::error::{OpenError, io_err};

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
