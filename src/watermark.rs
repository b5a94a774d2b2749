//! The watermark: the minimum acked position over all lanes, computed on read.
//!
//! Each lane's acked position lives in its own cache line ([`Marks`]); only the lane's advancer
//! writes it (Release), and it only grows. [`watermark`] loads every mark (Acquire) and takes the
//! minimum. Nothing is locked, and no thread maintains the result.
//!
//! - W1: `None` while any lane has no acked positioned batch (its mark is `NO_POSITION`,
//!   `u64::MAX`, which no batch may carry), and for no lanes at all.
//! - W3: each mark only grows and loads of one atomic by one thread never go back in its
//!   modification order, so a second read from the same thread is never lower.
//! - W4: a mark holding `p` was stored with Release after the advancer acquired the ACKED words of
//!   every item up to `p`, each stored with Release by the sink after its writes; so a reader
//!   whose Acquire load sees a watermark `>= p` sees those writes.

use std::sync::atomic::Ordering;

use crate::ring::{Marks, NO_POSITION};
use crate::Position;

/// The minimum over `marks`, or `None` if any is unset or there are none.
pub(crate) fn watermark(marks: &Marks) -> Option<Position> {
    let mut min = NO_POSITION;
    for mark in marks.iter() {
        // Acquire: pairs with the advancer's Release store (W4).
        let p = mark.load(Ordering::Acquire);
        if p == NO_POSITION {
            return None;
        }
        min = min.min(p);
    }
    (min != NO_POSITION).then_some(Position(min))
}
