//! The events themselves: an append-only array of write-once slots, indexed by position, that
//! readers share with the writer without a lock.
//!
//! Slots live in buckets of doubling size (64, 128, 256, ... slots), each allocated once, when the
//! first position that falls in it is written, and never moved: a reader holding `&Event` keeps
//! it while the writer goes on appending. Each slot is a `OnceLock`: the writer fills it before it
//! publishes a head that covers it (the snapshot store is a release, a reader's load an acquire),
//! so every slot at or below a reader's head is filled. A slot above the head may be filled too
//! (staged by the writer, or left by a group commit whose write failed): readers never look there.

use std::fmt;
use std::sync::OnceLock;

use super::event::Event;

/// log2 of the first bucket's size.
const FIRST_BITS: u32 = 6;
/// Enough buckets for every position below 2^64.
const BUCKETS: usize = 64 - FIRST_BITS as usize;

/// Bucket and offset of slot `i` (0-based).
fn locate(i: u64) -> (usize, usize) {
    let v = i + (1 << FIRST_BITS);
    let b = 63 - v.leading_zeros() - FIRST_BITS;
    (b as usize, (v - ((1u64 << FIRST_BITS) << b)) as usize)
}

/// Every event of the log, slot `position - 1` holding the event at `position`.
pub(crate) struct EventSlots {
    buckets: [OnceLock<Box<[OnceLock<Event>]>>; BUCKETS],
}

impl EventSlots {
    pub(crate) fn new() -> EventSlots {
        EventSlots { buckets: [const { OnceLock::new() }; BUCKETS] }
    }

    /// Fills the slot of `position` (writer only, each position once).
    pub(crate) fn set(&self, position: u64, event: Event) {
        let (b, off) = locate(position - 1);
        let bucket = self.buckets[b].get_or_init(|| {
            let size = (1usize << FIRST_BITS) << b;
            (0..size).map(|_| OnceLock::new()).collect()
        });
        let fresh = bucket[off].set(event).is_ok();
        assert!(fresh, "log position {position} written twice");
    }

    /// The event at `position`, if its slot was filled.
    pub(crate) fn get(&self, position: u64) -> Option<&Event> {
        if position == 0 {
            return None;
        }
        let (b, off) = locate(position - 1);
        self.buckets.get(b)?.get()?.get(off)?.get()
    }

    /// The event at `position`, which the caller's head covers (so it is filled).
    pub(crate) fn at(&self, position: u64) -> &Event {
        self.get(position).expect("every position at or below a published head is filled")
    }
}

impl fmt::Debug for EventSlots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let allocated = self.buckets.iter().filter(|b| b.get().is_some()).count();
        f.debug_struct("EventSlots").field("buckets_allocated", &allocated).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_covers_every_index_once_in_order() {
        let mut expect = (0usize, 0usize);
        for i in 0..10_000u64 {
            let got = locate(i);
            assert_eq!(got, expect, "index {i}");
            expect.1 += 1;
            if expect.1 == (1usize << FIRST_BITS) << expect.0 {
                expect = (expect.0 + 1, 0);
            }
        }
        assert_eq!(locate(u64::MAX - 64).0, BUCKETS - 1);
    }
}
