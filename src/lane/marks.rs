//! The watermark: the minimum acked position over all lanes, computed on read.
//!
//! Each lane's acked position lives in its own cache line, an [`AckedMark`] into the stream's
//! [`Marks`]; only the lane's advancer writes it (Release), and it only grows. [`watermark`]
//! loads every mark (Acquire) and takes the minimum. Nothing is locked, and no thread maintains
//! the result.
//!
//! # Encoding
//! A mark holds the acked position plus one, and [`NO_MARK`] (0) before the lane's first
//! positioned ack. `u64::MAX` is never a position ([`Position::RESERVED`]), so `+ 1` never
//! overflows, and the watermark is a plain minimum: any unset lane makes it 0.
//!
//! - [W1](crate::contract#w1): `None` while any lane has no acked positioned batch, and for no lanes at all. The loop
//!   is a plain minimum with one check at the end, which the compiler can vectorise.
//! - [W3](crate::contract#w3): each mark only grows and loads of one atomic by one thread never go back in its
//!   modification order, so a second read from the same thread is never lower.
//! - [W4](crate::contract#w4): a mark holding `p + 1` was stored with Release after the advancer acquired the ACKED
//!   words of every item up to `p`, each stored with Release by the sink after its writes; so a
//!   reader whose Acquire load sees a watermark `>= p` sees those writes.

use std::sync::Arc as StdArc;

use crossbeam_utils::CachePadded;

use crate::position::Position;
use crate::sync::{AtomicU64, Ordering};
use crate::wait::WaitList;

/// A mark with no acked position yet.
const NO_MARK: u64 = 0;

/// The acked marks of a set of lanes, one cache line each, read together by [`watermark`], and
/// the list of threads and tasks waiting for the watermark to move ([W6](crate::contract#w6)).
#[derive(Clone)]
pub(crate) struct Marks(StdArc<MarksInner>);

struct MarksInner {
    marks: Box<[CachePadded<AtomicU64>]>,
    /// Confirmers waiting in `wait_watermark`; notified by an advancer that sees the
    /// `WATERMARK_WANTED` wish in its lane's `advance` word, and by closes.
    waiters: WaitList,
}

impl Marks {
    /// `lanes` unset marks.
    pub(crate) fn new(lanes: usize) -> Marks {
        Marks(StdArc::new(MarksInner {
            marks: (0..lanes).map(|_| CachePadded::new(AtomicU64::new(NO_MARK))).collect(),
            waiters: WaitList::new(1),
        }))
    }

    /// The list a watermark waiter registers on.
    pub(crate) fn waiters(&self) -> &WaitList {
        &self.0.waiters
    }

    /// The mark of lane `index`, for the lane to publish its acked position to.
    ///
    /// # Panics
    /// If `index` is not below the number of lanes.
    pub(crate) fn mark(&self, index: usize) -> AckedMark {
        assert!(index < self.0.marks.len(), "mark {index} out of {} lanes", self.0.marks.len());
        AckedMark { marks: self.clone(), index }
    }

    /// The minimum over the marks, or `None` if any is unset or there are none ([W1](crate::contract#w1)).
    #[inline]
    pub(crate) fn watermark(&self) -> Option<Position> {
        if self.0.marks.is_empty() {
            return None;
        }
        // Acquire: pairs with `AckedMark::publish`'s Release store (W4).
        let min = self.0.marks.iter().map(|mark| mark.load(Ordering::Acquire)).min().unwrap_or(NO_MARK);
        (min != NO_MARK).then(|| Position(min - 1))
    }
}

/// One lane's acked mark.
pub(crate) struct AckedMark {
    marks: Marks,
    index: usize,
}

impl AckedMark {
    /// A mark of its own, counted in no watermark (a standalone lane, the request lane).
    pub(crate) fn standalone() -> AckedMark {
        Marks::new(1).mark(0)
    }

    #[inline]
    fn cell(&self) -> &AtomicU64 {
        // The index was checked in `Marks::mark`.
        &self.marks.0.marks[self.index]
    }

    /// Wakes every watermark waiter (the lane's advancer saw a `WATERMARK_WANTED` wish after
    /// publishing the mark, or the lane was closed).
    pub(crate) fn notify(&self) {
        self.marks.0.waiters.notify();
    }

    /// Publishes `position` as the lane's acked position. Called only by the lane's advancer,
    /// with positions that grow along the lane, so the mark only grows ([W3](crate::contract#w3)).
    #[inline]
    pub(crate) fn publish(&self, position: u64) {
        debug_assert!(position != u64::MAX, "the reserved position is never published");
        // Release: pairs with the Acquire loads in `Marks::watermark` and `load` (W4).
        self.cell().store(position + 1, Ordering::Release);
    }

    /// The lane's acked position.
    #[inline]
    pub(crate) fn load(&self) -> Option<Position> {
        // Acquire: pairs with `publish`'s Release.
        match self.cell().load(Ordering::Acquire) {
            NO_MARK => None,
            mark => Some(Position(mark - 1)),
        }
    }
}
