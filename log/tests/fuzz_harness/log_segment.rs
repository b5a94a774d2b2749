//! `log_segment`: arbitrary bytes laid out as the segment files of a log directory and opened with
//! [`EventLog::open`], checked against an independent reading of the documented segment format
//! (the `On disk` section of `lanestream_log`, and `src/disk/format.rs`):
//!
//! - opening never panics; it either recovers exactly the valid prefix the reference reader
//!   finds (every event byte-exact, positions dense from 1, a torn tail of the last segment
//!   truncated away; a last segment of format version 1 with events sealed and a version-2
//!   segment started after it) or, where the reference finds damage recovery must not drop,
//!   fails with [`OpenError::Corrupt`] and leaves every file as it was;
//! - never truncate a valid record: checked apart from the reference, the bytes an open cut off
//!   the last segment hold no whole, CRC-valid frame (at any byte offset), since a crash never
//!   leaves one after a torn record — a bad record followed by one is corruption;
//! - a recovered log takes appends (one conditional, checked against the recovered events), and
//!   reopening it gives back the recovered prefix plus those appends, the condition state
//!   included;
//! - the sealed segments' index files are never trusted over the segments: each one cut short or
//!   with a bit flipped (where, chosen by the input), the log reopens to the same events and
//!   rewrites them byte for byte; a refused open leaves no file behind (no index it rebuilt).
//!
//! Input layout: `flags | split (u16 LE) | second segment's first position | body`.
//! `flags`: bit 0 prepends a valid header to the first segment, bit 1 splits the body into two
//! segments at `split`, bit 2 recomputes the CRC32C of every whole frame (so mutated records get
//! past the checksum and reach the decoder), bit 3 prepends a valid header to the second segment,
//! bits 4-5 pick the segment size the appends use, bit 6 names the first segment after
//! position 0 instead of 1, bit 7 writes the headers of format version 2 (each event preceded by
//! its CRC32C, which bit 2 recomputes too) instead of version 1 (whose layout the corpus from
//! before version 2 was written in).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use lanestream_log::{
    AppendCondition, AppendError, Event, EventLog, LogOptions, LogPosition, MAX_NAME_LEN, MAX_TAGS,
    OpenError, Query,
};

/// A segment header's magic, as documented, without the version byte.
pub const MAGIC: [u8; 7] = *b"LSLOG\0\0";
/// The format versions a log reads (and, the last, writes).
pub const VERSIONS: [u8; 2] = [1, 2];
/// A segment header's size, in bytes.
pub const HEADER_LEN: usize = 16;
/// The smallest payload a record has: first position, count, and one event of a one-byte type,
/// no tags and no data.
pub const MIN_PAYLOAD: usize = 8 + 4 + 2 + 1 + 2 + 4;

/// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), table-driven; written here rather than
/// taken from the library's dependency so that the reference shares no code with the reader.
pub fn crc32c(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 { (c >> 1) ^ 0x82F6_3B78 } else { c >> 1 };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    !data.iter().fold(!0u32, |c, &b| TABLE[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8))
}

/// A segment header of format `version` for a segment starting at `first`.
pub fn header(first: u64, version: u8) -> Vec<u8> {
    let mut h = MAGIC.to_vec();
    h.push(version);
    h.extend_from_slice(&first.to_le_bytes());
    h
}

/// The CRC32C of the event at `position` encoded as `event` (version 2): over the position
/// (u64 LE), then the event.
fn event_crc(position: u64, event: &[u8]) -> u32 {
    let mut checked = position.to_le_bytes().to_vec();
    checked.extend_from_slice(event);
    crc32c(&checked)
}

/// One event as the reference reader decodes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefEvent {
    /// The type.
    pub ty: String,
    /// The tags, as stored.
    pub tags: Vec<String>,
    /// The payload.
    pub data: Vec<u8>,
}

impl RefEvent {
    fn of(e: &Event) -> RefEvent {
        RefEvent {
            ty: e.event_type().to_owned(),
            tags: e.tags().map(str::to_owned).collect(),
            data: e.data().to_vec(),
        }
    }
}

enum Record {
    /// A whole, valid record: its first position, its events, its length with the frame.
    Valid(u64, Vec<RefEvent>, usize),
    /// Incomplete, or failing its CRC.
    Torn,
    /// Whole and CRC-valid, but not a valid record.
    Invalid,
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
    }
    fn u32(&mut self) -> Option<usize> {
        self.take(4).map(|b| u32::from_le_bytes(b.try_into().unwrap()) as usize)
    }
    fn name(&mut self) -> Option<String> {
        let n = self.u16()?;
        if n == 0 || n > MAX_NAME_LEN {
            return None;
        }
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
}

fn payload(p: &[u8], version: u8) -> Option<(u64, Vec<RefEvent>)> {
    let mut c = Cursor(p);
    let first = u64::from_le_bytes(c.take(8)?.try_into().unwrap());
    let count = c.u32()?;
    if count == 0 {
        return None;
    }
    let mut events = Vec::new();
    for i in 0..count {
        let crc = if version >= 2 { Some(c.u32()? as u32) } else { None };
        let event_start = c.0;
        let ty = c.name()?;
        let ntags = c.u16()?;
        if ntags > MAX_TAGS {
            return None;
        }
        let mut tags: Vec<String> = Vec::new();
        for _ in 0..ntags {
            let t = c.name()?;
            if tags.last().is_some_and(|prev| prev.as_bytes() >= t.as_bytes()) {
                return None;
            }
            tags.push(t);
        }
        let n = c.u32()?;
        let data = c.take(n)?.to_vec();
        let event = &event_start[..event_start.len() - c.0.len()];
        if crc.is_some_and(|crc| event_crc(first.wrapping_add(i as u64), event) != crc) {
            return None;
        }
        events.push(RefEvent { ty, tags, data });
    }
    c.0.is_empty().then_some((first, events))
}

fn record(b: &[u8], version: u8) -> Record {
    if b.len() < 8 {
        return Record::Torn;
    }
    let len = u32::from_le_bytes(b[..4].try_into().unwrap()) as usize;
    let crc = u32::from_le_bytes(b[4..8].try_into().unwrap());
    if b.len() - 8 < len {
        return Record::Torn;
    }
    let mut checked = b[..4].to_vec();
    checked.extend_from_slice(&b[8..8 + len]);
    if crc32c(&checked) != crc {
        return Record::Torn;
    }
    match payload(&b[8..8 + len], version) {
        Some((first, events)) => Record::Valid(first, events, 8 + len),
        None => Record::Invalid,
    }
}

/// Whether `b` starts with a whole frame of at least [`MIN_PAYLOAD`] bytes whose CRC32C checks
/// (whatever its payload decodes to).
fn crc_valid_frame(b: &[u8]) -> bool {
    if b.len() < 8 {
        return false;
    }
    let len = u32::from_le_bytes(b[..4].try_into().unwrap()) as usize;
    if len < MIN_PAYLOAD || b.len() - 8 < len {
        return false;
    }
    let mut checked = b[..4].to_vec();
    checked.extend_from_slice(&b[8..8 + len]);
    crc32c(&checked) == u32::from_le_bytes(b[4..8].try_into().unwrap())
}

/// Whether a whole, CRC-valid frame starts at any byte offset of `b` from `from` on.
pub fn any_crc_valid_frame(b: &[u8], from: usize) -> bool {
    (from..b.len()).any(|at| crc_valid_frame(&b[at..]))
}

/// What the reference expects of opening a directory of segments.
#[derive(Debug, PartialEq, Eq)]
pub enum Expect {
    /// Opens with these events at positions 1, 2, ...; the last segment ends up `last_len`
    /// bytes long (truncated, or its torn header rewritten).
    Opens {
        /// The recovered events, in order.
        events: Vec<RefEvent>,
        /// The last segment's length after recovery.
        last_len: usize,
        /// Whether the last segment is of version 1 with events: sealed, and a segment of
        /// version 2 (its header alone) started after it.
        sealed_v1: bool,
    },
    /// Refused as corrupt, nothing changed.
    Corrupt,
    /// A segment header of this magic but another format version: refused as such.
    Unsupported,
}

/// The reference reading of `segments` (first position from the file name, bytes), in order.
pub fn expect(segments: &[(u64, Vec<u8>)]) -> Expect {
    let mut events = Vec::new();
    let mut last_len = 0;
    let mut sealed_v1 = false;
    for (i, (first, bytes)) in segments.iter().enumerate() {
        let is_last = i + 1 == segments.len();
        sealed_v1 = false;
        if *first != events.len() as u64 + 1 {
            return Expect::Corrupt;
        }
        if bytes.len() < HEADER_LEN {
            // A header torn while the segment was created, of a version the log reads.
            let torn = MAGIC.starts_with(&bytes[..bytes.len().min(7)])
                && bytes.get(7).is_none_or(|v| VERSIONS.contains(v));
            if is_last && torn {
                last_len = HEADER_LEN;
                continue;
            }
            return Expect::Corrupt;
        }
        if bytes[..7] == MAGIC && !VERSIONS.contains(&bytes[7]) {
            return Expect::Unsupported;
        }
        let version = bytes[7];
        if bytes[..HEADER_LEN] != header(*first, version)[..] {
            return Expect::Corrupt;
        }
        let before = events.len();
        let mut at = HEADER_LEN;
        while at < bytes.len() {
            match record(&bytes[at..], version) {
                Record::Valid(rec_first, evs, len) => {
                    if rec_first != events.len() as u64 + 1 {
                        return Expect::Corrupt;
                    }
                    events.extend(evs);
                    at += len;
                }
                // A torn tail only if nothing whole and CRC-valid follows the bad record.
                Record::Torn if is_last && !any_crc_valid_frame(bytes, at + 1) => break,
                Record::Torn | Record::Invalid => return Expect::Corrupt,
            }
        }
        last_len = at;
        sealed_v1 = version == 1 && events.len() > before;
    }
    Expect::Opens { events, last_len, sealed_v1 }
}

/// Rewrites the CRC of every whole frame after the header, walking the frames by their lengths
/// (in version 2, first the CRC of each event the frame's payload holds, as far as its length
/// fields walk inside the frame).
fn fix_crcs(seg: &mut [u8], version: u8) {
    let mut at = HEADER_LEN;
    while at + 8 <= seg.len() {
        let len = u32::from_le_bytes(seg[at..at + 4].try_into().unwrap()) as usize;
        if seg.len() - at - 8 < len {
            break;
        }
        if version >= 2 {
            fix_event_crcs(&mut seg[at + 8..at + 8 + len]);
        }
        let mut checked = seg[at..at + 4].to_vec();
        checked.extend_from_slice(&seg[at + 8..at + 8 + len]);
        let crc = crc32c(&checked);
        seg[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
        at += 8 + len;
    }
}

/// Rewrites the CRC of each event of a version-2 record's payload `p` that lies whole in it.
fn fix_event_crcs(p: &mut [u8]) {
    let Some(head) = p.get(..12) else { return };
    let first = u64::from_le_bytes(head[..8].try_into().unwrap());
    let count = u32::from_le_bytes(head[8..12].try_into().unwrap()) as usize;
    let mut at = 12;
    for i in 0..count {
        let event_start = at + 4;
        let mut c = Cursor(p.get(event_start..).unwrap_or(&[]));
        let walked = (|| {
            let n = c.u16()?;
            c.take(n)?;
            for _ in 0..c.u16()? {
                let n = c.u16()?;
                c.take(n)?;
            }
            let n = c.u32()?;
            c.take(n)
        })();
        if walked.is_none() {
            return;
        }
        let end = p.len() - c.0.len();
        let crc = event_crc(first.wrapping_add(i as u64), &p[event_start..end]);
        p[at..event_start].copy_from_slice(&crc.to_le_bytes());
        at = end;
    }
}

/// A fresh directory (on tmpfs when there is one), removed on drop, panic or not.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A new empty directory whose name includes `what`.
    pub fn new(what: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
        let dir = base.join(format!(
            "lanestream-fuzz-{what}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("creating a temporary directory");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn segment_path(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("{first:020}.seg"))
}

/// The path of the last of `segments` in `dir`.
fn last_segment_path(dir: &Path, segments: &[(u64, Vec<u8>)]) -> PathBuf {
    segment_path(dir, segments.last().unwrap().0)
}

/// The segment files of `dir` (name's position, bytes), sorted.
fn read_segments(dir: &Path) -> Vec<(u64, Vec<u8>)> {
    let mut out: Vec<(u64, Vec<u8>)> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.strip_suffix(".seg")?.parse().ok()?;
            Some((name, fs::read(&p).unwrap()))
        })
        .collect();
    out.sort();
    out
}

const SEGMENT_SIZES: [u64; 4] = [256 << 20, 1, 64, 200];

/// Splits the input into the segments it describes (see the module docs).
pub fn layout(data: &[u8]) -> (Vec<(u64, Vec<u8>)>, u64) {
    let at = |i: usize| data.get(i).copied().unwrap_or(0);
    let flags = at(0);
    let split = u16::from_le_bytes([at(1), at(2)]) as usize;
    let second_first = at(3) as u64;
    let body = data.get(4..).unwrap_or(&[]);
    let (a, b) = if flags & 2 != 0 {
        let s = split % (body.len() + 1);
        (&body[..s], Some(&body[s..]))
    } else {
        (body, None)
    };
    let first = if flags & 64 != 0 { 0 } else { 1 };
    let version = if flags & 128 != 0 { 2 } else { 1 };
    let build = |first: u64, with_header: bool, bytes: &[u8]| {
        let mut seg = if with_header { header(first, version) } else { Vec::new() };
        seg.extend_from_slice(bytes);
        if flags & 4 != 0 {
            fix_crcs(&mut seg, version);
        }
        seg
    };
    let mut segments = vec![(first, build(first, flags & 1 != 0, a))];
    if let Some(b) = b {
        if second_first != first {
            segments.push((second_first, build(second_first, flags & 8 != 0, b)));
        }
    }
    segments.sort_by_key(|s| s.0);
    (segments, SEGMENT_SIZES[(flags >> 4 & 3) as usize])
}

fn options(segment_bytes: u64) -> LogOptions {
    LogOptions::default().segment_bytes(segment_bytes)
}

fn read_all(log: &lanestream_log::WriteHandle) -> Vec<RefEvent> {
    let reads = log.read(&Query::All, None, usize::MAX).unwrap();
    for (i, s) in reads.events().iter().enumerate() {
        assert_eq!(s.position.get(), i as u64 + 1, "positions not dense from 1");
    }
    reads.events().iter().map(|s| RefEvent::of(&s.event)).collect()
}

fn pos(n: u64) -> LogPosition {
    LogPosition::new(n).expect("above 0")
}

/// `log_segment`: see the module docs.
pub fn log_segment(data: &[u8]) {
    let (segments, segment_bytes) = layout(data);
    let dir = TempDir::new("segment");
    for (first, bytes) in &segments {
        fs::write(segment_path(&dir.0, *first), bytes).unwrap();
    }
    let expected = expect(&segments);
    let log = match (EventLog::open(&dir.0, options(segment_bytes)), &expected) {
        (Err(OpenError::Corrupt { .. }), Expect::Corrupt)
        | (Err(OpenError::UnsupportedVersion { .. }), Expect::Unsupported) => {
            assert_eq!(read_segments(&dir.0), segments, "a refused open changed the files");
            assert_eq!(
                fs::read_dir(&dir.0).unwrap().count(),
                segments.len() + 1,
                "a refused open left files behind"
            );
            return;
        }
        (Err(e), _) => panic!("open failed ({e}); the reference expected {expected:?}"),
        (Ok(_), Expect::Corrupt | Expect::Unsupported) => panic!("opened a directory the reference refuses"),
        (Ok(log), Expect::Opens { .. }) => log,
    };
    let Expect::Opens { events, last_len, sealed_v1 } = expected else { unreachable!() };
    // Never truncate a valid record (independent of the reference's walk): whatever recovery
    // cut off the last segment holds no whole, CRC-valid frame at any offset.
    let (_, last_before) = segments.last().unwrap();
    let kept = fs::metadata(last_segment_path(&dir.0, &segments)).unwrap().len() as usize;
    if kept < last_before.len() {
        assert!(
            !any_crc_valid_frame(last_before, kept),
            "recovery truncated the last segment to {kept} bytes, cutting off a whole CRC-valid record"
        );
    }
    assert_eq!(read_all(&log), events, "recovered events differ from the valid prefix");
    let n = events.len() as u64;
    assert_eq!(log.head().map_or(0, LogPosition::get), n);
    let on_disk = read_segments(&dir.0);
    let added = usize::from(sealed_v1);
    assert_eq!(on_disk.len(), segments.len() + added, "recovery added or removed a segment");
    let recovered_last = &on_disk[segments.len() - 1];
    assert_eq!(recovered_last.1.len(), last_len, "the last segment's recovered length");
    if sealed_v1 {
        // The version-1 segment sealed, appends going on in a new one of version 2.
        assert_eq!(
            on_disk.last().unwrap(),
            &(n + 1, header(n + 1, 2)),
            "the segment started after version 1"
        );
    } else if last_len == HEADER_LEN {
        // An empty last segment (or a torn header) is written again in version 2.
        let first = recovered_last.0;
        assert_eq!(recovered_last.1, header(first, 2), "the empty last segment's header");
    }

    // Appends after recovery, one of them conditional on what recovery rebuilt.
    let fz = |d: &'static [u8]| Event::new("Fz", ["fz"], d).unwrap();
    let only_fz = Query::types(["Fz"]);
    let r1 = log.append(vec![fz(b"one")], None).expect("append after recovery");
    assert_eq!((r1.first.get(), r1.last.get()), (n + 1, n + 1));
    let r2 = log
        .append(vec![fz(b"two")], Some(AppendCondition::new(only_fz.clone(), Some(pos(n + 1)))))
        .expect("a condition after the head holds");
    assert_eq!(r2.first.get(), n + 2);
    let first_fz = events.iter().position(|e| e.ty == "Fz").map_or(n + 1, |i| i as u64 + 1);
    let conflict = log.append(vec![fz(b"three")], Some(AppendCondition::new(only_fz.clone(), None)));
    assert!(
        matches!(conflict, Err(AppendError::Conflict { at }) if at.get() == first_fz),
        "conflict over the recovered and new events: {conflict:?}, expected at {first_fz}"
    );
    log.close();
    drop(log);

    let mut all = events;
    all.push(RefEvent::of(&fz(b"one")));
    all.push(RefEvent::of(&fz(b"two")));
    let log = EventLog::open(&dir.0, options(segment_bytes)).expect("reopening after appends");
    assert_eq!(read_all(&log), all, "the reopened log differs");
    let again = log.append(vec![fz(b"four")], Some(AppendCondition::new(only_fz, Some(pos(n + 1)))));
    assert!(
        matches!(again, Err(AppendError::Conflict { at }) if at.get() == n + 2),
        "the condition state after reopening: {again:?}"
    );
    log.close();
    drop(log);

    // The index files of the sealed segments are never trusted over the segments: each one cut
    // short or with a bit flipped (where, chosen by the input), the log reopens to the same
    // events and writes the index files again, byte for byte as they were.
    let mut indexes: Vec<PathBuf> = fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "idx"))
        .collect();
    indexes.sort();
    let originals: Vec<Vec<u8>> = indexes.iter().map(|p| fs::read(p).unwrap()).collect();
    let seed = data.iter().fold(0usize, |h, &b| h.wrapping_mul(31).wrapping_add(b as usize));
    for (k, (path, original)) in indexes.iter().zip(&originals).enumerate() {
        let mut b = original.clone();
        let at = seed.wrapping_add(k * 7919) % b.len();
        if seed & 1 == 0 {
            b.truncate(at);
        } else {
            b[at] ^= 1 << (seed % 8);
        }
        fs::write(path, &b).unwrap();
    }
    let log = EventLog::open(&dir.0, options(segment_bytes)).expect("reopening with damaged index files");
    assert_eq!(read_all(&log), all, "the log reopened over damaged index files differs");
    log.close();
    drop(log);
    let rebuilt: Vec<Vec<u8>> = indexes.iter().map(|p| fs::read(p).unwrap()).collect();
    assert!(rebuilt == originals, "the index files were not rebuilt as they were");
}
