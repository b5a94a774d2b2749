//! The writer's side of the segment files (LevelDB's log writer; the reader's side is
//! `disk/record.rs`): [`encode_record`] lays each accepted append out as a record
//! (`disk/format.rs`), and [`SegmentWriter`] appends a group commit's records to the current
//! segment through the [`Storage`], with one fsync, then moves the commit marker
//! (`disk/marker.rs`). A full segment is sealed before the next group commit — its index file
//! written (`disk/segindex.rs`), best effort — and the next one started. The writer thread
//! (`writer.rs`) drives it; recovery (`recovery.rs`) says where it resumes.

use std::io;
use std::mem;
use std::path::PathBuf;
use std::sync::Arc;

use super::disk::file::{FrameCache, Loc, SegmentFile};
use super::disk::format::{EVENT_CRC_LEN, FORMAT_VERSION, FRAME_LEN, HEADER_LEN, event_crc, header};
use super::disk::marker::{Marker, MarkerFile};
use super::disk::segindex::{SegmentIndex, write_index};
use super::disk::storage::{Storage, segment_name};
use super::event::{Block, Event};

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
    /// The commit marker read-only followers poll (see `disk/marker.rs`).
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
