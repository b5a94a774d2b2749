//! The slot and its state word: `gen:24 | holders:16 | attempt:16 | tag:8` (see the ring's
//! module docs).

use std::mem::MaybeUninit;

use crate::sync::{AtomicU64, UnsafeCell};

pub(super) const TAG_MASK: u64 = 0xFF;
pub(super) const ATTEMPT_SHIFT: u32 = 8;
pub(super) const ATTEMPT_MASK: u64 = 0xFFFF << ATTEMPT_SHIFT;
pub(super) const HOLDER_SHIFT: u32 = 24;
pub(super) const HOLDER_ONE: u64 = 1 << HOLDER_SHIFT;
pub(super) const HOLDER_MASK: u64 = 0xFFFF << HOLDER_SHIFT;
/// The most live handles one item may have: a redelivery that would pass it waits instead
/// (`take_released`), so the 16-bit count never overflows into `gen`.
pub(super) const MAX_HOLDERS: u64 = 0xFFFF;
pub(super) const GEN_SHIFT: u32 = 40;
pub(super) const GEN_ONE: u64 = 1 << GEN_SHIFT;
pub(super) const GEN_MASK: u64 = !(GEN_ONE - 1);

pub(super) const EMPTY: u64 = 0;
pub(super) const DELIVERED: u64 = 1;
pub(super) const RELEASED: u64 = 2;
pub(super) const ACKED: u64 = 3;

#[inline]
pub(super) fn tag(word: u64) -> u64 {
    word & TAG_MASK
}

#[inline]
pub(super) fn with_tag(word: u64, t: u64) -> u64 {
    (word & !TAG_MASK) | t
}

/// The attempt number (1 = first delivery) recorded in a state word.
#[inline]
pub(crate) fn attempt(word: u64) -> u32 {
    ((word & ATTEMPT_MASK) >> ATTEMPT_SHIFT) as u32
}

#[inline]
pub(super) fn holders(word: u64) -> u64 {
    (word & HOLDER_MASK) >> HOLDER_SHIFT
}

#[inline]
pub(super) fn gen(word: u64) -> u64 {
    word & GEN_MASK
}

/// The word of the next delivery of a slot whose current word is `word`: next generation, one
/// more holder, `attempt` (saturating at 16 bits), `DELIVERED`.
#[inline]
pub(super) fn delivered_word(word: u64, attempt: u32) -> u64 {
    // Guaranteed by `take_released` (redeliveries) and by first deliveries starting at 0.
    debug_assert!(holders(word) < MAX_HOLDERS, "too many live handles on one item");
    gen(word).wrapping_add(GEN_ONE)
        | ((word & HOLDER_MASK) + HOLDER_ONE)
        | (u64::from(attempt.min(0xFFFF)) << ATTEMPT_SHIFT)
        | DELIVERED
}

/// One slot, on a cache line of its own (a `LaneItem` slot is exactly 64 bytes): the consumer
/// writes the state word of slot `i` while the producer fills slot `i + 1`, and without the
/// alignment the two would share a line and bounce it between the cores on every item.
#[repr(align(64))]
pub(super) struct Slot<T> {
    /// `gen | holders | attempt | tag` (module docs).
    pub(super) state: AtomicU64,
    /// The item's position, or `NO_POSITION`. Written by the producer with the item.
    pub(super) position: UnsafeCell<u64>,
    /// Initialised for items in `free..tail`.
    pub(super) item: UnsafeCell<MaybeUninit<T>>,
}
