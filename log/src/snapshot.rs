//! The in-memory state readers see: a [`Snapshot`] (the head and the name maps of the index),
//! published whole by the writer with `arc-swap`, over the shared append-only event slots and
//! posting lists; and [`View`], which answers queries over one head.
//!
//! A view never looks above its head, so what it answers is fixed at the moment its snapshot was
//! loaded: an immutable prefix of the log, even while the writer appends behind it.

use std::sync::Arc;

use std::collections::HashMap;

use super::disk::file::SegmentFile;
use super::disk::segindex::SegmentIndex;
use super::error::ReadError;
use super::event::{Block, Event, Payloads, SequencedEvent};
use super::index::{KeyMap, Postings, PostingsView};
use super::names::NameTable;
use super::position::LogPosition;
use super::query::{Query, QueryItem};
use super::slots::EventSlots;

/// One published state of the log.
#[derive(Clone, Debug)]
pub(crate) struct Snapshot {
    /// The highest position published (0: empty log).
    pub(crate) head: u64,
    /// Event type -> positions.
    pub(crate) types: KeyMap<Arc<Postings>>,
    /// Tag -> positions.
    pub(crate) tags: KeyMap<Arc<Postings>>,
}

/// The index being built by the writer: the maps of its next snapshot, the list of where each
/// append ends, and the writer's own interning tables.
///
/// The writer looks each name up once per event in a hash map of its own (one lookup, no
/// reference-count traffic) that gives the name's interned id and its posting list; a name
/// goes into the snapshot's persistent [`KeyMap`] only the first time it is seen. Positions are
/// staged per list and pushed in one run per list ([`IndexWriter::flush`]): once per group
/// commit, or before a condition is evaluated against the staged appends.
#[derive(Debug)]
pub(crate) struct IndexWriter {
    pub(crate) types: KeyMap<Arc<Postings>>,
    pub(crate) tags: KeyMap<Arc<Postings>>,
    /// The position of each append's last event, ascending (shared with [`Shared::appends`]:
    /// append-only, and readers bound every walk by their head like any posting list).
    pub(crate) appends: Arc<Postings>,
    /// Every distinct type and tag, interned (shared with the stored blocks).
    names: Arc<NameTable>,
    type_lists: Lists,
    tag_lists: Lists,
    /// Staged appends' last positions, not yet in `appends`.
    staged_ends: Vec<u64>,
    /// The interned names of the events staged since the last [`IndexWriter::take_block`]: per
    /// event, its type's list id, its tag count, then its tags' list ids.
    staged_names: Vec<u32>,
    /// Events staged since the last [`IndexWriter::take_block`], and their tags.
    staged_events: usize,
    staged_tags: usize,
}

/// The writer's table of one kind of name (types or tags): name -> list id, and per list its
/// interned name, its posting list and the positions staged for it.
/// How many tag indexes [`Lists::last`] remembers.
const LAST: usize = 4;

#[derive(Debug, Default)]
struct Lists {
    /// Name -> list id; the key is the name's one allocation, shared with the snapshot's map
    /// and the [`NameTable`].
    ids: HashMap<Arc<str>, u32>,
    entries: Vec<ListEntry>,
    /// `(list id, position)` in staging order (so ascending per list).
    staged: Vec<(u32, u64)>,
    /// Lists with staged positions, each once.
    touched: Vec<u32>,
    /// Scratch: the staged positions grouped by list.
    sorted: Vec<u64>,
    /// The list last looked up at each index of an event's tags (the type at index 0 of its
    /// own table): consecutive events often share a name there (one type, a writer's tag), and
    /// one comparison is cheaper than hashing.
    last: [Option<u32>; LAST],
}

#[derive(Debug)]
struct ListEntry {
    /// The list's name, as an id in the [`NameTable`].
    name: u32,
    postings: Arc<Postings>,
    /// Staged positions of this list (counting-sort scratch; 0 between flushes).
    count: u32,
    /// Where this list's run starts in `Lists::sorted` during a flush.
    start: u32,
}

impl Lists {
    /// The id of `name`'s list, creating the list (and adding it to `map`) the first time;
    /// `at` is the name's index among the event's tags (0 for a type).
    fn id(&mut self, name: &str, at: usize, map: &mut KeyMap<Arc<Postings>>, names: &NameTable) -> u32 {
        let at = at.min(LAST - 1);
        if let Some(last) = self.last[at] {
            if names.get(self.entries[last as usize].name) == name {
                return last;
            }
        }
        if let Some(&id) = self.ids.get(name) {
            self.last[at] = Some(id);
            return id;
        }
        let id = u32::try_from(self.entries.len()).expect("under 2^32 distinct names");
        let name: Arc<str> = Arc::from(name);
        let postings = map.get_or_insert_with(&name, || Arc::new(Postings::new()));
        self.ids.insert(name.clone(), id);
        self.entries.push(ListEntry { name: names.push(name), postings, count: 0, start: 0 });
        self.last[at] = Some(id);
        id
    }

    fn stage(&mut self, id: u32, position: u64) {
        let e = &mut self.entries[id as usize];
        if e.count == 0 {
            self.touched.push(id);
        }
        e.count += 1;
        self.staged.push((id, position));
    }

    /// Pushes the staged positions, one run per list (a counting sort by list keeps each run
    /// ascending).
    fn flush(&mut self) {
        if self.staged.is_empty() {
            return;
        }
        let mut offset = 0u32;
        for &id in &self.touched {
            let e = &mut self.entries[id as usize];
            e.start = offset;
            offset += e.count;
            e.count = 0;
        }
        self.sorted.resize(self.staged.len(), 0);
        for &(id, p) in &self.staged {
            let e = &mut self.entries[id as usize];
            self.sorted[(e.start + e.count) as usize] = p;
            e.count += 1;
        }
        for &id in &self.touched {
            let e = &mut self.entries[id as usize];
            e.postings.push_many(&self.sorted[e.start as usize..(e.start + e.count) as usize]);
            e.count = 0;
        }
        self.touched.clear();
        self.staged.clear();
    }

    /// Gives the staging scratch's memory back (after recovery, which staged whole segments).
    fn shrink(&mut self) {
        self.staged = Vec::new();
        self.touched = Vec::new();
        self.sorted = Vec::new();
    }

    /// The name id of list `id`.
    fn name(&self, id: u32) -> u32 {
        self.entries[id as usize].name
    }
}

impl IndexWriter {
    /// An empty index.
    pub(crate) fn new() -> IndexWriter {
        IndexWriter {
            types: KeyMap::new(),
            tags: KeyMap::new(),
            appends: Arc::new(Postings::new()),
            names: Arc::new(NameTable::new()),
            type_lists: Lists::default(),
            tag_lists: Lists::default(),
            staged_ends: Vec::new(),
            staged_names: Vec::new(),
            staged_events: 0,
            staged_tags: 0,
        }
    }

    /// Stages the events of one append, the first at `first`, for the index and the next block:
    /// interns their names and records where the append ends. Readers see none of it until
    /// [`flush`](IndexWriter::flush) and a publish; the writer's own condition checks see it
    /// after [`flush`](IndexWriter::flush).
    pub(crate) fn stage_append(&mut self, first: u64, appended: &[Event]) {
        let n = appended.len() as u64;
        debug_assert!(n > 0, "appends are never empty");
        for (i, e) in appended.iter().enumerate() {
            let position = first + i as u64;
            let t = self.type_lists.id(e.event_type(), 0, &mut self.types, &self.names);
            self.type_lists.stage(t, position);
            self.staged_names.push(t);
            let tags = e.tag_slice();
            self.staged_names.push(tags.len() as u32);
            for (at, tag) in tags.iter().enumerate() {
                let id = self.tag_lists.id(tag, at, &mut self.tags, &self.names);
                self.tag_lists.stage(id, position);
                self.staged_names.push(id);
            }
            self.staged_tags += tags.len();
        }
        self.staged_events += appended.len();
        self.staged_ends.push(first + n - 1);
    }

    /// Whether positions are staged but not yet in the posting lists.
    pub(crate) fn has_unflushed(&self) -> bool {
        !self.staged_ends.is_empty()
    }

    /// Pushes every staged position into its posting lists (not visible to readers until the
    /// head that covers them is published).
    pub(crate) fn flush(&mut self) {
        self.type_lists.flush();
        self.tag_lists.flush();
        self.appends.push_many(&self.staged_ends);
        self.staged_ends.clear();
    }

    /// The events staged since the last call, the first at `first`, as one block with interned
    /// names and `payloads` (one per event, in position order).
    pub(crate) fn take_block(&mut self, first: u64, payloads: Payloads) -> Block {
        let mut block = Block::with_capacity(first, self.staged_events, self.staged_tags, self.names.clone());
        let mut names = self.staged_names.iter().copied();
        for _ in 0..self.staged_events {
            let t = names.next().expect("a type per staged event");
            let k = names.next().expect("a tag count per staged event") as usize;
            let tag_lists = &self.tag_lists;
            let tags = names.by_ref().take(k).map(|id| tag_lists.name(id));
            block.push(self.type_lists.name(t), tags);
        }
        debug_assert!(names.next().is_none() && block.len() == self.staged_events);
        self.staged_names.clear();
        self.staged_events = 0;
        self.staged_tags = 0;
        block.seal(payloads)
    }

    /// Gives back the scratch memory recovery's staging of whole segments took (the writer's
    /// group commits grow it again only to their own size).
    pub(crate) fn shrink_scratch(&mut self) {
        self.type_lists.shrink();
        self.tag_lists.shrink();
        self.staged_ends = Vec::new();
        self.staged_names = Vec::new();
    }

    /// Indexes and stores one recovered segment (recovery only: no conditions, so it is flushed
    /// and stored at once), its payloads left in `file`; returns the block holding its events.
    pub(crate) fn add_segment(
        &mut self,
        events: &EventSlots,
        index: &SegmentIndex,
        file: Arc<SegmentFile>,
    ) -> Arc<Block> {
        let first = index.first;
        let mut block = Block::with_capacity(first, index.events.len(), index.tags.len(), self.names.clone());
        // The segment's own name ids -> list ids, per kind (a name may be a type and a tag).
        let mut type_ids: Vec<Option<u32>> = vec![None; index.names.len()];
        let mut tag_ids: Vec<Option<u32>> = vec![None; index.names.len()];
        let mut tags = Vec::new();
        for (i, e) in index.events.iter().enumerate() {
            let position = first + i as u64;
            let t = *type_ids[e.ty as usize].get_or_insert_with(|| {
                self.type_lists.id(&index.names[e.ty as usize], 0, &mut self.types, &self.names)
            });
            self.type_lists.stage(t, position);
            tags.clear();
            for (at, &local) in index.tags_of(i).iter().enumerate() {
                let id = *tag_ids[local as usize].get_or_insert_with(|| {
                    self.tag_lists.id(&index.names[local as usize], at, &mut self.tags, &self.names)
                });
                self.tag_lists.stage(id, position);
                tags.push(self.tag_lists.name(id));
            }
            block.push(self.type_lists.name(t), tags.iter().copied());
            if (i + 1) % RECOVERY_FLUSH == 0 {
                // Bounds the staging scratch (16 bytes per staged position, and as much again
                // to sort them) by this many events rather than by a whole segment's.
                self.type_lists.flush();
                self.tag_lists.flush();
            }
        }
        for r in index.records() {
            self.staged_ends.push(first + r.end as u64 - 1);
        }
        self.flush();
        let at = index.events.iter().map(|e| e.loc).collect();
        let block = Arc::new(block.seal(Payloads::Disk { file, at }));
        for i in 0..block.len() {
            events.set(first + i as u64, Event::stored(block.clone(), i as u32));
        }
        block
    }
}

/// How many events of a recovered segment are staged before their positions are pushed into
/// the posting lists.
const RECOVERY_FLUSH: usize = 1 << 16;

/// Which way a read walks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    Up,
    Down,
}

/// Queries over positions `1..=head`.
pub(crate) struct View<'a> {
    pub(crate) head: u64,
    pub(crate) types: &'a KeyMap<Arc<Postings>>,
    pub(crate) tags: &'a KeyMap<Arc<Postings>>,
    pub(crate) events: &'a EventSlots,
    /// The writer's staged events, not yet in `events`: `staged[0]` at position `staged_from`
    /// (empty for readers).
    pub(crate) staged: &'a [Event],
    pub(crate) staged_from: u64,
}

/// Positions of one list (or of the whole log) between two bounds, walked one way.
enum Driver<'a> {
    /// Every position in `lo..=hi`.
    Range { lo: u64, hi: u64 },
    /// The entries `lo..hi` (indices) of each list, merged.
    Lists(Vec<ListCursor<'a>>),
}

struct ListCursor<'a> {
    list: PostingsView<'a>,
    lo: usize,
    hi: usize,
}

impl ListCursor<'_> {
    fn peek(&self, dir: Dir) -> Option<u64> {
        (self.lo < self.hi).then(|| self.list.get(if dir == Dir::Up { self.lo } else { self.hi - 1 }))
    }

    fn advance(&mut self, dir: Dir) {
        if dir == Dir::Up {
            self.lo += 1;
        } else {
            self.hi -= 1;
        }
    }
}

/// The matching positions of one query item, in order.
struct ItemCursor<'a> {
    driver: Driver<'a>,
    /// Candidates from the driver must still be checked against the whole item.
    filter: Option<&'a QueryItem>,
}

impl<'a> View<'a> {
    /// A reader's view of `1..=head`.
    pub(crate) fn published(
        head: u64,
        types: &'a KeyMap<Arc<Postings>>,
        tags: &'a KeyMap<Arc<Postings>>,
        events: &'a EventSlots,
    ) -> View<'a> {
        View { head, types, tags, events, staged: &[], staged_from: u64::MAX }
    }

    /// The event at `position` (at most `head`).
    fn event(&self, position: u64) -> &'a Event {
        if position >= self.staged_from {
            &self.staged[(position - self.staged_from) as usize]
        } else {
            self.events.at(position)
        }
    }

    fn list(&self, map: &'a KeyMap<Arc<Postings>>, name: &str, lo: u64, hi: u64) -> Option<ListCursor<'a>> {
        let list = map.get(name)?.view();
        let (l, h) = (list.rank(lo), list.rank(hi));
        Some(ListCursor { list, lo: l, hi: h })
    }

    /// The cursor of `item` over positions `(lo, hi]`, or `None` when nothing there can match.
    fn item_cursor(&self, item: &'a QueryItem, lo: u64, hi: u64) -> Option<ItemCursor<'a>> {
        if item.is_any() {
            return Some(ItemCursor { driver: Driver::Range { lo: lo + 1, hi }, filter: None });
        }
        let mut best_tag: Option<ListCursor<'a>> = None;
        for tag in item.tag_slice() {
            let c = self.list(self.tags, tag, lo, hi)?; // an unknown tag: nothing matches
            if best_tag.as_ref().is_none_or(|b| c.hi - c.lo < b.hi - b.lo) {
                best_tag = Some(c);
            }
        }
        let by_type: Vec<ListCursor<'a>> =
            item.type_slice().iter().filter_map(|t| self.list(self.types, t, lo, hi)).collect();
        if !item.type_slice().is_empty() && by_type.is_empty() {
            return None; // only unknown types
        }
        let type_count: usize = by_type.iter().map(|c| c.hi - c.lo).sum();
        let single_tag = item.tag_slice().len() == 1;
        Some(match best_tag {
            Some(tag) if item.type_slice().is_empty() || tag.hi - tag.lo <= type_count => ItemCursor {
                driver: Driver::Lists(vec![tag]),
                filter: (!single_tag || !item.type_slice().is_empty()).then_some(item),
            },
            _ => ItemCursor {
                driver: Driver::Lists(by_type),
                filter: (!item.tag_slice().is_empty()).then_some(item),
            },
        })
    }

    fn next_of(&self, cursor: &mut ItemCursor<'a>, dir: Dir) -> Option<u64> {
        loop {
            let p = match &mut cursor.driver {
                Driver::Range { lo, hi } => {
                    if lo > hi {
                        return None;
                    }
                    if dir == Dir::Up {
                        *lo += 1;
                        *lo - 1
                    } else {
                        *hi -= 1;
                        *hi + 1
                    }
                }
                Driver::Lists(lists) => {
                    // The lists of one driver are disjoint (one type per event), so the next
                    // position is the extreme head among them.
                    let mut best: Option<(usize, u64)> = None;
                    for (i, c) in lists.iter().enumerate() {
                        if let Some(p) = c.peek(dir) {
                            let better = match best {
                                None => true,
                                Some((_, b)) => (dir == Dir::Up && p < b) || (dir == Dir::Down && p > b),
                            };
                            if better {
                                best = Some((i, p));
                            }
                        }
                    }
                    let (i, p) = best?;
                    lists[i].advance(dir);
                    p
                }
            };
            match cursor.filter {
                Some(item) if !item.matches(self.event(p)) => continue,
                _ => return Some(p),
            }
        }
    }

    /// Calls `f` with each position in `(lo, hi]` that matches `query`, in `dir` order, until
    /// `f` returns `false`.
    pub(crate) fn scan(&self, query: &'a Query, lo: u64, hi: u64, dir: Dir, mut f: impl FnMut(u64) -> bool) {
        let hi = hi.min(self.head);
        if lo >= hi {
            return;
        }
        let items: Vec<&QueryItem> = match query {
            Query::All => {
                let mut c = ItemCursor { driver: Driver::Range { lo: lo + 1, hi }, filter: None };
                while let Some(p) = self.next_of(&mut c, dir) {
                    if !f(p) {
                        return;
                    }
                }
                return;
            }
            Query::Items(items) => items.iter().collect(),
        };
        let mut cursors: Vec<ItemCursor<'a>> =
            items.into_iter().filter_map(|i| self.item_cursor(i, lo, hi)).collect();
        if cursors.len() == 1 {
            while let Some(p) = self.next_of(&mut cursors[0], dir) {
                if !f(p) {
                    return;
                }
            }
            return;
        }
        // Several items: merge their streams, each position once.
        let mut heads: Vec<Option<u64>> = Vec::with_capacity(cursors.len());
        for c in cursors.iter_mut() {
            heads.push(self.next_of(c, dir));
        }
        loop {
            let next = match dir {
                Dir::Up => heads.iter().flatten().min().copied(),
                Dir::Down => heads.iter().flatten().max().copied(),
            };
            let Some(p) = next else { return };
            if !f(p) {
                return;
            }
            for (h, c) in heads.iter_mut().zip(cursors.iter_mut()) {
                if *h == Some(p) {
                    *h = self.next_of(c, dir);
                }
            }
        }
    }

    /// The lowest position in `(after, head]` whose event matches `query`.
    pub(crate) fn first_match(&self, query: &'a Query, after: u64) -> Option<u64> {
        let mut found = None;
        self.scan(query, after, self.head, Dir::Up, |p| {
            found = Some(p);
            false
        });
        found
    }

    /// Up to `limit` matching events in `(lo, hi]` in `dir` order (their payloads read from
    /// the segments for a log on disk), and whether more matched.
    ///
    /// # Errors
    /// [`ReadError`] if a payload cannot be read back.
    pub(crate) fn collect(
        &self,
        query: &'a Query,
        lo: u64,
        hi: u64,
        dir: Dir,
        limit: usize,
    ) -> Result<(Vec<SequencedEvent>, bool), ReadError> {
        let mut out = Vec::new();
        let mut more = false;
        let mut failed = None;
        self.scan(query, lo, hi, dir, |p| {
            if out.len() == limit {
                more = true;
                return false;
            }
            let position = LogPosition::new(p).expect("positions start at 1");
            match self.event(p).load(p) {
                Ok(event) => out.push(SequencedEvent { position, event }),
                Err(e) => {
                    failed = Some(e);
                    return false;
                }
            }
            true
        });
        match failed {
            Some(e) => Err(e),
            None => Ok((out, more)),
        }
    }
}

/// Where the writer publishes each snapshot: `arc-swap` (lock-free loads).
#[cfg(not(lanestream_loom))]
pub(crate) type Published<T> = arc_swap::ArcSwap<T>;

/// Where the writer publishes each snapshot. Under loom, `arc-swap` (whose atomics and
/// thread-local debt lists loom cannot see) is stood in for by a loom mutex around the `Arc`:
/// a load is then an Acquire and a store a Release of the whole snapshot, which is what the log's
/// protocols rely on (`arc-swap` gives at least that), and loom sees every publish.
#[cfg(lanestream_loom)]
pub(crate) struct Published<T>(crate::sync::Mutex<Arc<T>>);

#[cfg(lanestream_loom)]
impl<T> Published<T> {
    pub(crate) fn from_pointee(value: T) -> Self {
        Published(crate::sync::Mutex::new(Arc::new(value)))
    }

    pub(crate) fn load(&self) -> Arc<T> {
        crate::sync::lock(&self.0).clone()
    }

    pub(crate) fn load_full(&self) -> Arc<T> {
        self.load()
    }

    pub(crate) fn store(&self, value: Arc<T>) {
        *crate::sync::lock(&self.0) = value;
    }
}

/// What readers, subscriptions and the writer share.
pub(crate) struct Shared {
    /// The latest published snapshot (stored by the writer after each group commit, before it
    /// replies).
    pub(crate) snapshot: Published<Snapshot>,
    /// The events, by position.
    pub(crate) events: EventSlots,
    /// The position of each append's last event, ascending (the writer's
    /// [`IndexWriter::appends`]); entries above the published head are not yet visible.
    pub(crate) appends: Arc<Postings>,
    /// Woken after each publish, on close and on failure (subscribers wait on it).
    pub(crate) signal: super::signal::Signal,
    /// Set (release) once the writer has published its last snapshot and stopped.
    pub(crate) closed: crate::sync::AtomicBool,
    /// Set once a write or sync failed; the writer refuses writes from then on.
    pub(crate) failure: std::sync::OnceLock<Arc<std::io::Error>>,
    /// The default most events per subscription batch.
    pub(crate) subscription_batch: usize,
}

impl Shared {
    pub(crate) fn new(
        snapshot: Snapshot,
        events: EventSlots,
        appends: Arc<Postings>,
        subscription_batch: usize,
    ) -> Shared {
        Shared {
            snapshot: Published::from_pointee(snapshot),
            events,
            appends,
            signal: super::signal::Signal::new(),
            closed: crate::sync::AtomicBool::new(false),
            failure: std::sync::OnceLock::new(),
            subscription_batch,
        }
    }

    /// The published head (0: empty).
    pub(crate) fn head(&self) -> u64 {
        self.snapshot.load().head
    }

    /// The append holding `position`, as raw `(first, last)`, if `head` covers it.
    pub(crate) fn append_at(&self, position: u64, head: u64) -> Option<(u64, u64)> {
        if position == 0 || position > head {
            return None;
        }
        let ends = self.appends.view();
        // The appends ending before `position`; the next one holds it.
        let i = ends.rank(position - 1);
        let first = if i == 0 { 1 } else { ends.get(i - 1) + 1 };
        Some((first, ends.get(i)))
    }

    /// Whether the writer stopped.
    pub(crate) fn is_closed(&self) -> bool {
        // Acquire: pairs with the writer's Release store when it stops (its last snapshot and
        // replies happen before).
        self.closed.load(crate::sync::Ordering::Acquire)
    }

    /// Whether no event will ever be published again (closed or failed).
    pub(crate) fn is_ended(&self) -> bool {
        self.is_closed() || self.failure.get().is_some()
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("head", &self.head())
            .field("closed", &self.is_closed())
            .field("failure", &self.failure.get())
            .finish_non_exhaustive()
    }
}
