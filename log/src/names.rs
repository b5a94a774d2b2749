//! Names — event types and tags: the limits every one is held to ([`MAX_NAME_LEN`], [`MAX_TAGS`]:
//! what `Event::new` enforces, `EventError` names and every decoder of the log's files checks),
//! and their interning.
//!
//! **Interning.** Every distinct event type and tag the log stores is held once, in an
//! append-only table that stored events refer to by a `u32` id (4 bytes per reference instead of
//! a 16-byte pointer, and one allocation per distinct name instead of one per event). The
//! allocation is an `Arc<str>` the writer shares with its name maps (the snapshot's and its
//! own), so a name is held once however many maps know it: at hundreds of thousands of tags of a
//! few events each, copies of the names were a tenth of the index.
//!
//! Only the writer adds names; each goes into a write-once slot that never moves, so a reader
//! holding an id it got from a stored event (published after the name was added: the snapshot
//! store is a release, the reader's load an acquire) finds the slot filled. Slots live in buckets
//! of doubling size (64, 128, ... names), each allocated when its first name is added.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

/// The longest event type or tag, in bytes (UTF-8).
pub const MAX_NAME_LEN: usize = 1024;

/// The most tags one event may carry.
pub const MAX_TAGS: usize = 256;

/// log2 of the first bucket's size.
const FIRST_BITS: u32 = 6;
/// Enough buckets for every `u32` id.
const BUCKETS: usize = 32 - FIRST_BITS as usize + 1;

/// Bucket and offset of id `i`.
fn locate(i: u32) -> (usize, usize) {
    let v = u64::from(i) + (1 << FIRST_BITS);
    let b = 63 - v.leading_zeros() - FIRST_BITS;
    (b as usize, (v - ((1u64 << FIRST_BITS) << b)) as usize)
}

/// One bucket of write-once name slots.
type Bucket = Box<[OnceLock<Arc<str>>]>;

/// The table of interned names (see the module docs).
pub(crate) struct NameTable {
    buckets: [OnceLock<Bucket>; BUCKETS],
    /// Names added (written by the writer only).
    len: AtomicU32,
}

impl NameTable {
    pub(crate) fn new() -> NameTable {
        NameTable { buckets: [const { OnceLock::new() }; BUCKETS], len: AtomicU32::new(0) }
    }

    /// Adds `name` and returns its id (writer only).
    ///
    /// # Panics
    /// When the table already holds `u32::MAX` names.
    pub(crate) fn push(&self, name: Arc<str>) -> u32 {
        // Relaxed: only the writer stores `len`, and this is the writer (commits, on the writer
        // thread or inline, hold the writer's lock: its acquire orders this load after the last
        // store). Readers never load it: they reach a name through an id published with the
        // snapshot (module docs).
        let id = self.len.load(Ordering::Relaxed);
        assert!(id < u32::MAX, "the log holds under 2^32 distinct names");
        let (b, off) = locate(id);
        let bucket = self.buckets[b].get_or_init(|| {
            let size = (1usize << FIRST_BITS) << b;
            (0..size).map(|_| OnceLock::new()).collect()
        });
        let fresh = bucket[off].set(name).is_ok();
        assert!(fresh, "name id {id} written twice");
        // Relaxed: see the load above.
        self.len.store(id + 1, Ordering::Relaxed);
        id
    }

    /// The name of `id`, which a stored event published to the caller refers to.
    pub(crate) fn get(&self, id: u32) -> &str {
        let (b, off) = locate(id);
        self.buckets[b]
            .get()
            .and_then(|bucket| bucket[off].get())
            .expect("every referenced name id is filled")
    }
}

impl fmt::Debug for NameTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Relaxed: a count for display only.
        f.debug_struct("NameTable").field("len", &self.len.load(Ordering::Relaxed)).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_get_back_what_was_pushed_across_buckets() {
        let t = NameTable::new();
        for i in 0..1000u32 {
            assert_eq!(t.push(Arc::from(format!("n{i}"))), i);
        }
        for i in 0..1000u32 {
            assert_eq!(t.get(i), format!("n{i}"));
        }
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(64), (1, 0));
        assert_eq!(locate(u32::MAX).0, BUCKETS - 1);
    }
}
