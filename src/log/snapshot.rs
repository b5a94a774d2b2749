//! The in-memory state readers see: a [`Snapshot`] (the head and the name maps of the index),
//! published whole by the writer with `arc-swap`, over the shared append-only event slots and
//! posting lists; and [`View`], which answers queries over one head.
//!
//! A view never looks above its head, so what it answers is fixed at the moment its snapshot was
//! loaded: an immutable prefix of the log, even while the writer appends behind it.

use std::sync::Arc;

use super::event::{Event, SequencedEvent};
use super::index::{KeyMap, Postings, PostingsView};
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

/// The index being built by the writer: the maps of its next snapshot, and the list of where
/// each append ends.
#[derive(Debug)]
pub(crate) struct IndexWriter {
    pub(crate) types: KeyMap<Arc<Postings>>,
    pub(crate) tags: KeyMap<Arc<Postings>>,
    /// The position of each append's last event, ascending (shared with [`Shared::appends`]:
    /// append-only, and readers bound every walk by their head like any posting list).
    pub(crate) appends: Arc<Postings>,
}

impl IndexWriter {
    /// An empty index.
    pub(crate) fn new() -> IndexWriter {
        IndexWriter { types: KeyMap::new(), tags: KeyMap::new(), appends: Arc::new(Postings::new()) }
    }

    /// Stores and indexes the events of one append, the first at `first`, and records where
    /// the append ends (not visible to readers until published).
    pub(crate) fn add_append(&mut self, events: &EventSlots, first: u64, appended: Vec<Event>) {
        let n = appended.len() as u64;
        debug_assert!(n > 0, "appends are never empty");
        for (i, e) in appended.into_iter().enumerate() {
            self.add(events, first + i as u64, e);
        }
        self.appends.push(first + n - 1);
    }

    /// Stores `event` at `position` and indexes it (not visible to readers until published).
    pub(crate) fn add(&mut self, events: &EventSlots, position: u64, event: Event) {
        self.types.get_or_insert_with(event.event_type(), || Arc::new(Postings::new())).push(position);
        for tag in event.tag_slice() {
            self.tags.get_or_insert_with(tag, || Arc::new(Postings::new())).push(position);
        }
        events.set(position, event);
    }
}

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
                Some(item) if !item.matches(self.events.at(p)) => continue,
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

    /// Up to `limit` matching events in `(lo, hi]` in `dir` order, and whether more matched.
    pub(crate) fn collect(
        &self,
        query: &'a Query,
        lo: u64,
        hi: u64,
        dir: Dir,
        limit: usize,
    ) -> (Vec<SequencedEvent>, bool) {
        let mut out = Vec::new();
        let mut more = false;
        self.scan(query, lo, hi, dir, |p| {
            if out.len() == limit {
                more = true;
                return false;
            }
            let position = LogPosition::new(p).expect("positions start at 1");
            out.push(SequencedEvent { position, event: self.events.at(p).clone() });
            true
        });
        (out, more)
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
