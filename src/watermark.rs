//! The watermark: the minimum acked position over all lanes, computed on read.
//!
//! Each lane's acked position lives in its own cache line ([`Marks`]); only the lane's advancer
//! writes it (Release), and it only grows. [`watermark`] loads every mark (Acquire) and takes the
//! minimum. Nothing is locked, and no thread maintains the result.
//!
//! - W1: `None` while any lane has no acked positioned batch (its mark is `NO_MARK`, 0; a set
//!   mark holds position + 1), and for no lanes at all. So the loop is a plain minimum with one
//!   check at the end, which the compiler can vectorise.
//! - W3: each mark only grows and loads of one atomic by one thread never go back in its
//!   modification order, so a second read from the same thread is never lower.
//! - W4: a mark holding `p + 1` was stored with Release after the advancer acquired the ACKED
//!   words of every item up to `p`, each stored with Release by the sink after its writes; so a
//!   reader whose Acquire load sees a watermark `>= p` sees those writes.

use std::sync::atomic::Ordering;

use crate::ring::{Marks, NO_MARK};
use crate::Position;

/// The minimum over `marks`, or `None` if any is unset or there are none.
#[inline]
pub(crate) fn watermark(marks: &Marks) -> Option<Position> {
    if marks.is_empty() {
        return None;
    }
    // Acquire: pairs with the advancer's Release store (W4).
    let min = marks.iter().map(|mark| mark.load(Ordering::Acquire)).min().unwrap_or(NO_MARK);
    (min != NO_MARK).then(|| Position(min - 1))
}
