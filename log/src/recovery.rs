//! Recovery: what opening a durable log finds in its directory — the segments and their events,
//! the segment appends go on in — and the repairs its files need. It reads each segment's records
//! with `disk/record.rs` or takes them from its index file (`disk/segindex.rs`), and hands every
//! segment to its caller, which indexes and stores it (the open passes
//! `IndexWriter::add_segment`, `snapshot.rs`).
//!
//! # Recovery
//! Opening takes each sealed segment (every one but the last) from its index file when that can
//! be trusted (see `disk/segindex.rs`: it is never trusted over the segment; a missing, torn or
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
//!
//! Recovery only reads: what it finds the files need — a torn tail truncated, a torn header
//! written again, a half-written `.idx.tmp` or the last segment's stale index file removed, a
//! sealed segment's missing or untrusted index file written, a last segment of version 1 sealed
//! and the next one created — it returns as repairs ([`Recovery`]), which the open makes only
//! once nothing is left to refuse. An open that fails (a corrupt segment found after a repair
//! was decided on, say) therefore changes nothing on disk.
//!
//! [`MIN_PAYLOAD`]: crate::disk::format::MIN_PAYLOAD

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::disk::file::{FrameCache, SegmentFile};
use super::disk::format::{
    FORMAT_VERSION, HEADER_LEN, MAGIC, OLDEST_VERSION, check_header, header, read_header,
};
use super::disk::record::{RecordError, decode_record, valid_frame_after};
use super::disk::segindex::{SegmentIndex, index_name, read_index, write_index};
use super::disk::storage::{create_segment_file, list_dir, segment_name};
use super::error::{OpenError, io_err};
use super::event::Block;

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

/// A change to the log's files that recovery found needed. Recovery only decides on it;
/// [`Recovery::repair`] makes it, once the open has nothing left to refuse (an open that fails
/// changes nothing on disk).
#[derive(Debug)]
enum Repair {
    /// Remove an index file a crash left half-written (`.idx.tmp`): its segment's index is
    /// rebuilt if it has none.
    RemoveTmp(PathBuf),
    /// Remove the index file of the last segment: appends go on in it, so it would go stale (a
    /// seal that a crash cut short before the next segment was created wrote it); it is written
    /// again when the segment is sealed.
    RemoveStale(PathBuf),
    /// Write the index file of the sealed segment starting at `first` (`len` bytes long, of
    /// format `version`, its events in `block`), which had none or one not to be trusted.
    /// Best effort, as any seal: without it the next open scans the segment again.
    WriteIndex { first: u64, len: u64, version: u8, block: Arc<Block> },
    /// Cut a torn tail off the last segment: `path` truncated to `len` bytes, and synced.
    Truncate { path: PathBuf, len: u64 },
    /// Write the segment starting at `first` again as its header alone: a header torn while
    /// the segment was being created, or an empty last segment of an older version.
    Rewrite { first: u64 },
    /// Create the segment starting at `first`, where appends go on after a last segment of an
    /// older version (sealed by a [`Repair::WriteIndex`] before).
    Create { first: u64 },
}

/// What recovery decided, nothing on disk changed yet: the recovered log, and the repairs its
/// files need before the writer appends ([`Recovery::repair`]).
#[derive(Debug)]
pub(crate) struct Recovery {
    dir: PathBuf,
    cache: Option<Arc<FrameCache>>,
    recovered: Recovered,
    repairs: Vec<Repair>,
}

impl Recovery {
    /// Makes the repairs recovery decided on, in the order recovery found them (the order a
    /// writer's own crash leaves them in: a crash among them leaves a directory the next open
    /// recovers alike), and returns the recovered log. To be called once the open has nothing
    /// left to refuse: from here on only I/O can fail it.
    ///
    /// # Errors
    /// [`OpenError::Io`] when a repair fails. The repairs made before it stay made: each is one
    /// the next open would make too.
    pub(crate) fn repair(self) -> Result<Recovered, OpenError> {
        let Recovery { dir, cache, mut recovered, repairs } = self;
        for repair in repairs {
            match repair {
                Repair::RemoveTmp(path) | Repair::RemoveStale(path) => {
                    fs::remove_file(&path).map_err(io_err("removing", &path))?;
                }
                Repair::WriteIndex { first, len, version, block } => {
                    let _ = write_index(&dir, &SegmentIndex::from_blocks(first, len, version, &[block]));
                }
                Repair::Truncate { path, len } => {
                    let file =
                        OpenOptions::new().write(true).open(&path).map_err(io_err("opening", &path))?;
                    file.set_len(len).map_err(io_err("truncating", &path))?;
                    file.sync_all().map_err(io_err("syncing", &path))?;
                }
                Repair::Rewrite { first } => {
                    let path = dir.join(segment_name(first));
                    create_segment_file(&dir, first, &header(first)).map_err(io_err("rewriting", &path))?;
                }
                Repair::Create { first } => {
                    let path = dir.join(segment_name(first));
                    create_segment_file(&dir, first, &header(first)).map_err(io_err("creating", &path))?;
                    let file = SegmentFile::open(&path, first, FORMAT_VERSION, cache.clone())
                        .map_err(io_err("opening", &path))?;
                    let len = HEADER_LEN as u64;
                    let file = Arc::new(file);
                    recovered.last = Some(LastSegment { path, first, len, file, blocks: Vec::new() });
                }
            }
        }
        Ok(recovered)
    }
}

/// Recovers the log in `dir`, calling `on_segment(index, file)` for every segment in order (its
/// events at positions `index.first..index.next()`), which returns the blocks it stored them in.
/// Sealed segments come from their index files when those can be trusted, and are scanned
/// otherwise; the last segment is always scanned.
///
/// Only reads: the repairs the files need (a torn tail truncated, index files rebuilt or
/// removed, see [`Repair`]) are returned, to be made by [`Recovery::repair`] once the open has
/// nothing left to refuse. So an open that fails here leaves the directory as it was.
pub(crate) fn recover(
    dir: &Path,
    cache: Option<Arc<FrameCache>>,
    mut on_segment: impl FnMut(&SegmentIndex, Arc<SegmentFile>) -> Arc<Block>,
) -> Result<Recovery, OpenError> {
    let listing = list_dir(dir)?;
    let mut repairs: Vec<Repair> = listing.tmp.into_iter().map(Repair::RemoveTmp).collect();
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
            let index = scan(path, *first, false, &mut repairs)?.0;
            let file = open(path, *first, index.version)?;
            next = index.next();
            let block = on_segment(&index, file);
            let (len, version) = (index.len, index.version);
            repairs.push(Repair::WriteIndex { first: *first, len, version, block });
            continue;
        }
        // The last segment: appends go on in it, so an index file of it goes (see `Repair`).
        if listing.indexes.binary_search(first).is_ok() {
            repairs.push(Repair::RemoveStale(dir.join(index_name(*first))));
        }
        let (index, len) = scan(path, *first, true, &mut repairs)?;
        next = index.next();
        if index.version != FORMAT_VERSION && index.events.is_empty() {
            // An empty segment of an older version: written again, empty, in this one.
            repairs.push(Repair::Rewrite { first: *first });
        } else if index.version != FORMAT_VERSION {
            // A last segment of an older version is sealed (its index file written, best effort
            // as any seal), and appends go on in a new segment of this version (module docs),
            // which the repairs create (and make the last).
            let block = on_segment(&index, open(path, *first, index.version)?);
            repairs.push(Repair::WriteIndex { first: *first, len, version: index.version, block });
            repairs.push(Repair::Create { first: next });
            break;
        }
        let file = open(path, *first, FORMAT_VERSION)?;
        let block = on_segment(&index, file.clone());
        let blocks = if index.events.is_empty() { Vec::new() } else { vec![block] };
        out.last = Some(LastSegment { path: path.clone(), first: *first, len, file, blocks });
    }
    out.next = next;
    Ok(Recovery { dir: dir.to_path_buf(), cache, recovered: out, repairs })
}

/// Scans the segment `path` (first position `first`): every record validated (module docs). In
/// the last segment (`is_last`) a torn tail is cut off and a torn header written again — by the
/// repair pushed onto `repairs`; the scan only reads. Returns its index and its length after
/// that repair.
fn scan(
    path: &Path,
    first: u64,
    is_last: bool,
    repairs: &mut Vec<Repair>,
) -> Result<(SegmentIndex, u64), OpenError> {
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
            // A header torn while the segment was being created: written again.
            repairs.push(Repair::Rewrite { first });
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
                repairs.push(Repair::Truncate { path: path.to_path_buf(), len: at as u64 });
                break;
            }
            Err(RecordError::Torn(why)) => return Err(corrupt(at, why.into())),
            Err(RecordError::Invalid(why)) => return Err(corrupt(at, why)),
        }
    }
    index.len = at as u64;
    Ok((index, at as u64))
}
