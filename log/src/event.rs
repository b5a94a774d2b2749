//! [`Event`]: what an append carries, validated at construction; [`SequencedEvent`]: an event and
//! the position the log gave it. And how the log keeps events: a [`Block`] per group commit or
//! recovered segment (names interned, payloads in memory or where they are in a segment, read
//! back through `disk/file.rs`), and a sealed segment's index built from its blocks.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

use super::disk::file::{Loc, SegmentFile};
use super::disk::segindex::SegmentIndex;
use super::error::{EventError, ReadError};
use super::names::{MAX_NAME_LEN, MAX_TAGS, NameTable};
use super::position::LogPosition;

/// One event: a type, a set of tags and an opaque payload.
///
/// The type and every tag are non-empty UTF-8 strings of at most [`MAX_NAME_LEN`] bytes, compared
/// byte for byte (no case folding, no trimming, no prefixes). The tags are a set: they are kept
/// sorted (byte order) with no duplicates, and a duplicate passed to [`Event::new`] is refused
/// rather than silently merged. The payload is never looked at by the log (queries match the type
/// and the tags only).
///
/// Cloning an event moves a reference count; the type, tags and payload are shared. The log keeps
/// what it stores compactly: each distinct type and tag once, shared by every event that carries
/// it, and one group commit's events in one block, so a read hands out events that share them.
///
/// ```
/// use lanestream_log::Event;
/// let e = Event::new("StudentSubscribed", ["student:7", "course:3"], &b"{}"[..])?;
/// assert_eq!(e.event_type(), "StudentSubscribed");
/// assert_eq!(e.tags().collect::<Vec<_>>(), ["course:3", "student:7"]); // sorted
/// assert!(e.has_tag("student:7"));
/// assert!(Event::new("T", ["a", "a"], bytes::Bytes::new()).is_err()); // duplicate tag
/// # Ok::<(), lanestream_log::EventError>(())
/// ```
#[derive(Clone)]
pub struct Event {
    repr: Repr,
}

#[derive(Clone)]
enum Repr {
    /// Built by a caller ([`Event::new`]): the event's own names.
    Own(Arc<Inner>),
    /// Stored by the log: record `.1` of a [`Block`], whose names are interned (stored once per
    /// distinct name, referred to by id). Handed out as is only when the block holds its
    /// payloads ([`Payloads::Memory`]); events of a block on disk leave the log as `Loaded`.
    Stored(Arc<Block>, u32),
    /// Record `i` of a block on disk with its payload, read from the segment file
    /// ([`Event::load`]): one small allocation per event read, so that an event stays two words.
    Loaded(Arc<Loaded>),
}

struct Loaded {
    block: Arc<Block>,
    i: u32,
    data: Bytes,
}

struct Inner {
    event_type: Box<str>,
    /// Sorted, unique.
    tags: Box<[Box<str>]>,
    data: Bytes,
}

/// Events as the log keeps them, at consecutive positions from [`Block::first`]: one contiguous
/// array of records and one of their tags' name ids, instead of separately allocated names per
/// event (the writer interns the names in a [`NameTable`]). The writer builds one block per group
/// commit; opening a log builds one per segment.
pub(crate) struct Block {
    /// The position of record 0.
    first: u64,
    records: Vec<Record>,
    /// The tags of every record, concatenated in record order (each record's in name order,
    /// unique).
    tags: Vec<u32>,
    names: Arc<NameTable>,
    payloads: Payloads,
}

impl fmt::Debug for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Block")
            .field("first", &self.first)
            .field("len", &self.records.len())
            .field("on_disk", &matches!(self.payloads, Payloads::Disk { .. }))
            .finish_non_exhaustive()
    }
}

/// Where a block's payloads are.
pub(crate) enum Payloads {
    /// In memory, one per record (an in-memory log).
    Memory(Vec<Bytes>),
    /// In a segment file, one location per record (a durable log): read on demand, through the
    /// log's cache.
    Disk {
        /// The segment holding every record of the block.
        file: Arc<SegmentFile>,
        /// Per record, where its append's frame and its payload are.
        at: Vec<Loc>,
    },
}

impl Payloads {
    fn len(&self) -> usize {
        match self {
            Payloads::Memory(v) => v.len(),
            Payloads::Disk { at, .. } => at.len(),
        }
    }
}

struct Record {
    /// Name id.
    event_type: u32,
    /// Where this record's tags end in [`Block::tags`] (they start where the previous record's end).
    tags_end: u32,
}

impl Block {
    /// A block for `events` events from position `first`, carrying `tags` tags in all; its
    /// payloads come with [`Block::seal`].
    pub(crate) fn with_capacity(first: u64, events: usize, tags: usize, names: Arc<NameTable>) -> Block {
        Block {
            first,
            records: Vec::with_capacity(events),
            tags: Vec::with_capacity(tags),
            names,
            payloads: Payloads::Memory(Vec::new()),
        }
    }

    /// Adds one record (type and tags as ids in the block's names, the tags in name order,
    /// unique); returns its index.
    pub(crate) fn push(&mut self, event_type: u32, tags: impl IntoIterator<Item = u32>) -> u32 {
        self.tags.extend(tags);
        let tags_end = u32::try_from(self.tags.len()).expect("a block holds under 2^32 tags");
        debug_assert!({
            let start = self.records.last().map_or(0, |r| r.tags_end as usize);
            self.tags[start..].windows(2).all(|w| self.names.get(w[0]) < self.names.get(w[1]))
        });
        self.records.push(Record { event_type, tags_end });
        u32::try_from(self.records.len() - 1).expect("a block holds under 2^32 events")
    }

    /// Gives the block its payloads, one per record.
    ///
    /// # Panics
    /// If `payloads` does not hold one per record.
    pub(crate) fn seal(mut self, payloads: Payloads) -> Block {
        assert_eq!(payloads.len(), self.records.len(), "one payload per record");
        self.payloads = payloads;
        self
    }

    /// How many records the block holds.
    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    /// The position of record 0.
    pub(crate) fn first(&self) -> u64 {
        self.first
    }

    /// Record `i`'s type name id and tag name ids.
    pub(crate) fn names_of(&self, i: usize) -> (u32, &[u32]) {
        let start = if i == 0 { 0 } else { self.records[i - 1].tags_end as usize };
        (self.records[i].event_type, &self.tags[start..self.records[i].tags_end as usize])
    }

    /// The names the ids refer to.
    pub(crate) fn names(&self) -> &NameTable {
        &self.names
    }

    /// The payload locations, for a block on disk.
    pub(crate) fn locations(&self) -> Option<&[Loc]> {
        match &self.payloads {
            Payloads::Memory(_) => None,
            Payloads::Disk { at, .. } => Some(at),
        }
    }

    fn tags_of(&self, i: usize) -> TagSlice<'_> {
        let start = if i == 0 { 0 } else { self.records[i - 1].tags_end as usize };
        TagSlice::Stored(&self.tags[start..self.records[i].tags_end as usize], &self.names)
    }
}

impl SegmentIndex {
    /// The index of the segment starting at `first`, `len` bytes long, from the blocks the writer
    /// appended to it (every block on disk, in position order, covering the whole segment).
    pub(crate) fn from_blocks(first: u64, len: u64, version: u8, blocks: &[Arc<Block>]) -> SegmentIndex {
        let mut index = SegmentIndex::new(first, version);
        index.len = len;
        // Global name id -> the index's own.
        let mut local: HashMap<u32, u32> = HashMap::new();
        let mut tags = Vec::new();
        for block in blocks {
            debug_assert_eq!(block.first(), index.next(), "blocks cover the segment in order");
            let locs = block.locations().expect("a segment's blocks are on disk");
            for (i, loc) in locs.iter().enumerate() {
                let (ty, tag_ids) = block.names_of(i);
                let mut id = |global: u32| {
                    *local.entry(global).or_insert_with(|| {
                        let name = block.names().get(global);
                        index.names.push(Box::from(name));
                        (index.names.len() - 1) as u32
                    })
                };
                let ty = id(ty);
                tags.clear();
                tags.extend(tag_ids.iter().map(|&t| id(t)));
                index.push(ty, &tags, *loc);
            }
        }
        index
    }
}

/// An event's tags, however the event is stored (sorted, unique).
#[derive(Clone, Copy)]
pub(crate) enum TagSlice<'a> {
    Own(&'a [Box<str>]),
    Stored(&'a [u32], &'a NameTable),
}

impl<'a> TagSlice<'a> {
    pub(crate) fn len(self) -> usize {
        match self {
            TagSlice::Own(t) => t.len(),
            TagSlice::Stored(t, _) => t.len(),
        }
    }

    /// Tag `i` (`i < len`).
    pub(crate) fn get(self, i: usize) -> &'a str {
        match self {
            TagSlice::Own(t) => &t[i],
            TagSlice::Stored(t, names) => names.get(t[i]),
        }
    }

    pub(crate) fn iter(self) -> impl ExactSizeIterator<Item = &'a str> + DoubleEndedIterator + 'a {
        (0..self.len()).map(move |i| self.get(i))
    }

    fn contains(self, tag: &str) -> bool {
        match self {
            TagSlice::Own(t) => t.binary_search_by(|x| (**x).cmp(tag)).is_ok(),
            TagSlice::Stored(t, names) => t.binary_search_by(|&x| names.get(x).cmp(tag)).is_ok(),
        }
    }
}

fn check_name(name: &str, what: fn(String) -> EventError) -> Result<(), EventError> {
    if name.is_empty() {
        return Err(what(String::new()));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(EventError::NameTooLong { name: name.chars().take(32).collect(), len: name.len() });
    }
    Ok(())
}

impl Event {
    /// An event of type `event_type` carrying `tags` (in any order) and `data`.
    ///
    /// # Errors
    /// [`EventError::EmptyType`], [`EventError::EmptyTag`], [`EventError::NameTooLong`] (a type or
    /// tag above [`MAX_NAME_LEN`] bytes), [`EventError::TooManyTags`] (above [`MAX_TAGS`]),
    /// [`EventError::DuplicateTag`].
    pub fn new<T, I>(
        event_type: impl Into<String>,
        tags: I,
        data: impl Into<Bytes>,
    ) -> Result<Event, EventError>
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        let event_type = event_type.into();
        check_name(&event_type, |_| EventError::EmptyType)?;
        let mut sorted: Vec<Box<str>> = Vec::new();
        for tag in tags {
            let tag: String = tag.into();
            check_name(&tag, |_| EventError::EmptyTag)?;
            sorted.push(tag.into_boxed_str());
            if sorted.len() > MAX_TAGS {
                return Err(EventError::TooManyTags { max: MAX_TAGS });
            }
        }
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(EventError::DuplicateTag(w[0].to_string()));
        }
        Ok(Event::from_parts(event_type.into_boxed_str(), sorted.into_boxed_slice(), data.into()))
    }

    /// An event with no tags.
    ///
    /// # Errors
    /// As [`Event::new`].
    pub fn untagged(event_type: impl Into<String>, data: impl Into<Bytes>) -> Result<Event, EventError> {
        Event::new(event_type, std::iter::empty::<String>(), data)
    }

    /// Builds an event from parts already validated (sorted unique tags).
    pub(crate) fn from_parts(event_type: Box<str>, tags: Box<[Box<str>]>, data: Bytes) -> Event {
        debug_assert!(tags.windows(2).all(|w| w[0] < w[1]));
        Event { repr: Repr::Own(Arc::new(Inner { event_type, tags, data })) }
    }

    /// Record `i` of `block` (`i < block.len()`), as the log stores it.
    pub(crate) fn stored(block: Arc<Block>, i: u32) -> Event {
        debug_assert!((i as usize) < block.len());
        Event { repr: Repr::Stored(block, i) }
    }

    /// The event as it leaves the log: itself, or, for one stored in a block on disk, a copy
    /// carrying its payload read from the segment (through the cache). `position` is the
    /// event's (checked against the record read).
    ///
    /// # Errors
    /// [`ReadError`] when the segment cannot be read or the record read is not the one the
    /// index says is there.
    pub(crate) fn load(&self, position: u64) -> Result<Event, ReadError> {
        let Repr::Stored(block, i) = &self.repr else { return Ok(self.clone()) };
        let Payloads::Disk { file, at } = &block.payloads else { return Ok(self.clone()) };
        let data = file.payload(&at[*i as usize], position)?;
        Ok(Event { repr: Repr::Loaded(Arc::new(Loaded { block: block.clone(), i: *i, data })) })
    }

    /// The block and record index of a stored event.
    fn stored_parts(&self) -> Option<(&Block, usize)> {
        match &self.repr {
            Repr::Own(_) => None,
            Repr::Stored(block, i) => Some((block, *i as usize)),
            Repr::Loaded(l) => Some((&l.block, l.i as usize)),
        }
    }

    /// The event's type.
    pub fn event_type(&self) -> &str {
        match (&self.repr, self.stored_parts()) {
            (Repr::Own(inner), _) => &inner.event_type,
            (_, Some((block, i))) => block.names.get(block.records[i].event_type),
            (_, None) => unreachable!("stored_parts covers the stored forms"),
        }
    }

    /// The event's tags, sorted in byte order, each once.
    pub fn tags(&self) -> impl ExactSizeIterator<Item = &str> + DoubleEndedIterator + '_ {
        self.tag_slice().iter()
    }

    /// The tags as stored (sorted, unique).
    pub(crate) fn tag_slice(&self) -> TagSlice<'_> {
        match (&self.repr, self.stored_parts()) {
            (Repr::Own(inner), _) => TagSlice::Own(&inner.tags),
            (_, Some((block, i))) => block.tags_of(i),
            (_, None) => unreachable!("stored_parts covers the stored forms"),
        }
    }

    /// Whether the event carries `tag` (exact comparison; O(log tags)).
    pub fn has_tag(&self, tag: &str) -> bool {
        self.tag_slice().contains(tag)
    }

    /// The payload, never interpreted by the log.
    pub fn data(&self) -> &Bytes {
        match &self.repr {
            Repr::Own(inner) => &inner.data,
            Repr::Loaded(l) => &l.data,
            Repr::Stored(block, i) => match &block.payloads {
                Payloads::Memory(v) => &v[*i as usize],
                // The log loads every event of a block on disk (`Event::load`) before it hands
                // it out, and looks only at the names of the ones it keeps.
                Payloads::Disk { .. } => {
                    unreachable!("an event on disk is loaded before its payload is read")
                }
            },
        }
    }

    /// The bytes this event takes in an append's size budget (and, give or take a few bytes of
    /// framing, on disk): type, tags and payload plus their length prefixes — a `u16` before
    /// the type, a `u16` tag count, a `u16` before each tag and a `u32` before the payload, the
    /// layout a segment record stores each event in.
    pub fn encoded_len(&self) -> usize {
        2 + self.event_type().len()
            + 2
            + self.tags().map(|t| 2 + t.len()).sum::<usize>()
            + 4
            + self.data().len()
    }
}

impl PartialEq for Event {
    /// Equal when type, tags and payload are (however each event is stored).
    fn eq(&self, other: &Event) -> bool {
        if let (Some((a, i)), Some((b, j))) = (self.stored_parts(), other.stored_parts()) {
            if std::ptr::eq(a, b) && i == j {
                return true;
            }
        }
        self.event_type() == other.event_type() && self.tags().eq(other.tags()) && self.data() == other.data()
    }
}

impl Eq for Event {}

impl fmt::Debug for Event {
    /// Type, tags and the payload's length (not its bytes).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Tags<'a>(&'a Event);
        impl fmt::Debug for Tags<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_list().entries(self.0.tags()).finish()
            }
        }
        f.debug_struct("Event")
            .field("event_type", &self.event_type())
            .field("tags", &Tags(self))
            .field("data_len", &self.data().len())
            .finish()
    }
}

/// An event as read from the log: the event and the position the log gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequencedEvent {
    /// Where the event sits in the log.
    pub position: LogPosition,
    /// The event, exactly as appended.
    pub event: Event,
}
