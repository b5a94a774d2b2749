//! The type/tag index: for each event type and each tag, the ascending list of the positions of
//! the events that carry it (a posting list), and the maps from names to lists.
//!
//! A selective read or a condition check walks the most selective posting list of each query
//! item instead of the log, so it costs O(log n) to find its start plus O(candidates) to walk it.
//!
//! **Posting lists** ([`Postings`]) are append-only chains of chunks of doubling size (4, 8, 16,
//! ... positions), so a tag used once costs one small chunk and a list of n positions has
//! O(log n) chunks. Only the writer appends; it stores a position, then raises `len` (release), so
//! a reader that loads `len` (acquire) finds every slot below it filled. Positions above a
//! reader's head may be in the list already; readers bound every walk by their head.
//!
//! **Name maps** ([`KeyMap`]) are persistent hash array mapped tries: a snapshot holds a root,
//! and the writer adds a name by copying the O(log32 n) nodes on its path (`Arc::make_mut`, so a
//! node already copied in the same group commit is changed in place). Readers of an older
//! snapshot keep the old root; nothing is ever locked.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Size of a list's first chunk (log2).
const FIRST_CHUNK_BITS: u32 = 2;

struct Chunk {
    slots: Box<[AtomicU64]>,
    next: OnceLock<Box<Chunk>>,
}

impl Chunk {
    fn new(k: usize) -> Chunk {
        let size = (1usize << FIRST_CHUNK_BITS) << k;
        Chunk { slots: (0..size).map(|_| AtomicU64::new(0)).collect(), next: OnceLock::new() }
    }
}

/// Chunk and offset of entry `i`.
fn locate(i: usize) -> (usize, usize) {
    let v = i + (1 << FIRST_CHUNK_BITS);
    let k = (usize::BITS - 1 - v.leading_zeros() - FIRST_CHUNK_BITS) as usize;
    (k, v - ((1usize << FIRST_CHUNK_BITS) << k))
}

/// One posting list: the positions of the events carrying one type or one tag, ascending.
pub(crate) struct Postings {
    first: Chunk,
    /// Entries written; raised (release) after each entry is stored.
    len: AtomicUsize,
}

impl Postings {
    pub(crate) fn new() -> Postings {
        Postings { first: Chunk::new(0), len: AtomicUsize::new(0) }
    }

    /// Appends `position` (writer only; strictly above every entry so far): one entry at a time,
    /// the reference [`push_many`](Postings::push_many) is tested against.
    #[cfg(test)]
    pub(crate) fn push(&self, position: u64) {
        // Relaxed: only the writer stores `len`, and this is the writer (commits, on the writer
        // thread or inline, hold the writer's lock: its acquire orders this load after the
        // last store).
        let i = self.len.load(Ordering::Relaxed);
        let (k, off) = locate(i);
        let mut chunk = &self.first;
        for j in 0..k {
            chunk = chunk.next.get_or_init(|| Box::new(Chunk::new(j + 1)));
        }
        // Relaxed: published by the Release store of `len` below.
        chunk.slots[off].store(position, Ordering::Relaxed);
        // Release: pairs with `view`'s Acquire load, so a reader that sees `i + 1` entries sees
        // the slot written above (and every chunk `get_or_init` linked in).
        self.len.store(i + 1, Ordering::Release);
    }

    /// Appends `positions` (writer only; ascending, each strictly above every entry so far),
    /// walking the chunk chain once and publishing them with one Release store of `len`.
    pub(crate) fn push_many(&self, positions: &[u64]) {
        if positions.is_empty() {
            return;
        }
        // Relaxed: only the writer stores `len`, and this is the writer (commits, on the writer
        // thread or inline, hold the writer's lock: its acquire orders this load after the
        // last store).
        let start = self.len.load(Ordering::Relaxed);
        let (mut k, mut off) = locate(start);
        let mut chunk = &self.first;
        for j in 0..k {
            chunk = chunk.next.get_or_init(|| Box::new(Chunk::new(j + 1)));
        }
        for &p in positions {
            if off == chunk.slots.len() {
                chunk = chunk.next.get_or_init(|| Box::new(Chunk::new(k + 1)));
                k += 1;
                off = 0;
            }
            // Relaxed: published by the Release store of `len` below.
            chunk.slots[off].store(p, Ordering::Relaxed);
            off += 1;
        }
        // Release: pairs with `view`'s Acquire load, so a reader that sees the new `len` sees
        // every slot written above (and every chunk `get_or_init` linked in).
        self.len.store(start + positions.len(), Ordering::Release);
    }

    /// A reader's view: the chunks covering the entries written so far.
    pub(crate) fn view(&self) -> PostingsView<'_> {
        // Acquire: pairs with `push`'s Release store (the first `len` slots are written).
        let len = self.len.load(Ordering::Acquire);
        let mut chunks = Vec::new();
        if len > 0 {
            let (last, _) = locate(len - 1);
            let mut chunk = &self.first;
            chunks.push(&*chunk.slots);
            for _ in 0..last {
                chunk = chunk.next.get().expect("chunks below len are allocated");
                chunks.push(&*chunk.slots);
            }
        }
        PostingsView { chunks, len }
    }
}

impl fmt::Debug for Postings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Relaxed: a count for display only.
        f.debug_struct("Postings").field("len", &self.len.load(Ordering::Relaxed)).finish()
    }
}

/// A posting list as seen at one moment: entries `0..len`, each filled, ascending.
pub(crate) struct PostingsView<'a> {
    chunks: Vec<&'a [AtomicU64]>,
    len: usize,
}

impl PostingsView<'_> {
    /// Entry `i` (`i < len`).
    pub(crate) fn get(&self, i: usize) -> u64 {
        let (k, off) = locate(i);
        // Acquire is not needed for the value itself (the len load ordered it); Relaxed suffices.
        self.chunks[k][off].load(Ordering::Relaxed)
    }

    /// How many entries are at most `x`.
    pub(crate) fn rank(&self, x: u64) -> usize {
        let (mut lo, mut hi) = (0, self.len);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.get(mid) <= x {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

/// The hasher of a map, random per process and shared by every version of the map.
type Hasher = RandomState;

/// A persistent map from names to `V` (see the module docs).
pub(crate) struct KeyMap<V> {
    root: Arc<Node<V>>,
    len: usize,
    hasher: Hasher,
}

impl<V> Clone for KeyMap<V> {
    fn clone(&self) -> Self {
        KeyMap { root: self.root.clone(), len: self.len, hasher: self.hasher.clone() }
    }
}

struct Node<V> {
    bitmap: u32,
    entries: Vec<Entry<V>>,
}

impl<V: Clone> Clone for Node<V> {
    fn clone(&self) -> Self {
        Node { bitmap: self.bitmap, entries: self.entries.clone() }
    }
}

#[derive(Clone)]
enum Entry<V> {
    Leaf { hash: u64, key: Arc<str>, value: V },
    Collision { hash: u64, items: Vec<(Arc<str>, V)> },
    Node(Arc<Node<V>>),
}

const BITS: u32 = 5;
const MASK: u64 = (1 << BITS) - 1;

impl<V: Clone> KeyMap<V> {
    pub(crate) fn new() -> KeyMap<V> {
        KeyMap { root: Arc::new(Node { bitmap: 0, entries: Vec::new() }), len: 0, hasher: Hasher::new() }
    }

    /// How many names the map holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The value of `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&V> {
        let hash = self.hasher.hash_one(key);
        let mut node = &*self.root;
        let mut shift = 0;
        loop {
            let bit = 1u32 << ((hash >> shift) & MASK);
            if node.bitmap & bit == 0 {
                return None;
            }
            let pos = (node.bitmap & (bit - 1)).count_ones() as usize;
            match &node.entries[pos] {
                Entry::Leaf { hash: h, key: k, value } => {
                    return (*h == hash && **k == *key).then_some(value);
                }
                Entry::Collision { hash: h, items } => {
                    return if *h == hash {
                        items.iter().find(|(k, _)| **k == *key).map(|(_, v)| v)
                    } else {
                        None
                    };
                }
                Entry::Node(child) => {
                    node = child;
                    shift += BITS;
                }
            }
        }
    }

    /// The value of `key`, inserting `make()` first if absent; copies the nodes on the path that
    /// an older version of the map still shares.
    pub(crate) fn get_or_insert_with(&mut self, key: &Arc<str>, make: impl FnOnce() -> V) -> V {
        if let Some(v) = self.get(key) {
            return v.clone();
        }
        let hash = self.hasher.hash_one(&**key);
        let value = make();
        insert(&mut self.root, 0, hash, key.clone(), value.clone());
        self.len += 1;
        value
    }
}

/// Inserts an absent key below `node` (at depth `shift`).
fn insert<V: Clone>(node: &mut Arc<Node<V>>, shift: u32, hash: u64, key: Arc<str>, value: V) {
    let node = Arc::make_mut(node);
    let bit = 1u32 << ((hash >> shift) & MASK);
    let pos = (node.bitmap & (bit - 1)).count_ones() as usize;
    if node.bitmap & bit == 0 {
        node.bitmap |= bit;
        node.entries.insert(pos, Entry::Leaf { hash, key, value });
        return;
    }
    match &mut node.entries[pos] {
        Entry::Node(child) => insert(child, shift + BITS, hash, key, value),
        Entry::Collision { hash: h, items } if *h == hash => items.push((key, value)),
        Entry::Leaf { hash: h, .. } if *h == hash => {
            let Entry::Leaf { key: k0, value: v0, .. } =
                std::mem::replace(&mut node.entries[pos], Entry::Collision { hash, items: Vec::new() })
            else {
                unreachable!()
            };
            node.entries[pos] = Entry::Collision { hash, items: vec![(k0, v0), (key, value)] };
        }
        entry => {
            // A leaf or collision of another hash shares this slot: push it one level down.
            let old =
                std::mem::replace(entry, Entry::Node(Arc::new(Node { bitmap: 0, entries: Vec::new() })));
            let old_hash = match &old {
                Entry::Leaf { hash, .. } | Entry::Collision { hash, .. } => *hash,
                Entry::Node(_) => unreachable!(),
            };
            let Entry::Node(child) = entry else { unreachable!() };
            let c = Arc::make_mut(child);
            c.bitmap = 1u32 << ((old_hash >> (shift + BITS)) & MASK);
            c.entries.push(old);
            insert(child, shift + BITS, hash, key, value);
        }
    }
}

impl<V> fmt::Debug for KeyMap<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyMap").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postings_rank_and_get_over_many_chunks() {
        let p = Postings::new();
        for i in 1..=5000u64 {
            p.push(i * 3);
        }
        let v = p.view();
        assert_eq!(v.len, 5000);
        for i in 0..5000 {
            assert_eq!(v.get(i), (i as u64 + 1) * 3);
        }
        assert_eq!(v.rank(0), 0);
        assert_eq!(v.rank(3), 1);
        assert_eq!(v.rank(5), 1);
        assert_eq!(v.rank(15_000), 5000);
        assert_eq!(v.rank(u64::MAX), 5000);
    }

    #[test]
    fn postings_push_many_equals_pushes_across_chunk_boundaries() {
        let (one, many) = (Postings::new(), Postings::new());
        let mut next = 1u64;
        for run in [0usize, 1, 3, 4, 5, 11, 1, 40, 200, 7] {
            let positions: Vec<u64> = (0..run as u64).map(|i| next + 2 * i).collect();
            next += 2 * run as u64 + 1;
            for &p in &positions {
                one.push(p);
            }
            many.push_many(&positions);
            let (a, b) = (one.view(), many.view());
            assert_eq!(a.len, b.len);
            assert!((0..a.len).all(|i| a.get(i) == b.get(i)));
        }
        assert_eq!(many.view().len, 272);
    }

    #[test]
    fn keymap_versions_are_independent_and_find_every_key() {
        let mut m: KeyMap<u32> = KeyMap::new();
        let mut versions = Vec::new();
        for i in 0..3000u32 {
            assert_eq!(m.get_or_insert_with(&Arc::from(format!("k{i}")), || i), i);
            assert_eq!(m.get_or_insert_with(&Arc::from(format!("k{i}")), || 99_999), i);
            if i % 500 == 0 {
                versions.push((i, m.clone()));
            }
        }
        assert_eq!(m.len(), 3000);
        for i in 0..3000u32 {
            assert_eq!(m.get(&format!("k{i}")), Some(&i));
        }
        assert_eq!(m.get("absent"), None);
        for (upto, v) in versions {
            assert_eq!(v.len(), upto as usize + 1);
            assert_eq!(v.get(&format!("k{upto}")), Some(&upto));
            assert_eq!(v.get(&format!("k{}", upto + 1)), None);
        }
    }
}
