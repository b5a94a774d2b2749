//! [`Run`]: a contiguous run of deliveries received in one step and acked (or released) as one.

use std::fmt;
use std::iter::FusedIterator;
use std::ops::Range;

use super::ring::Ring;
use crate::error::AckError;
use crate::item::Item;
use crate::position::Position;
use crate::sync::Arc;

/// The most items one [`Run`] holds: `recv_run(max)` and its siblings deliver at most
/// `max.clamp(1, MAX_RUN)` items. A run's bookkeeping is its range, whatever its length (it
/// allocates nothing, [M2](crate::contract#m2)); the bound keeps one receive step, and the
/// span of slots a lagging sink holds at once, as short as a disruptor's batch of 64.
pub const MAX_RUN: usize = 64;

/// A run of deliveries from one lane, received in one step by
/// [`Consumer::recv_run`](crate::LaneConsumer::recv_run) and its siblings: consecutive items of
/// the lane (sequences `first..first + len`), each read in place in its slot.
///
/// A run is the fast path for sinks that apply items in order: receiving it takes the
/// consumer's seat once, and [`ack`](Run::ack) (or the cumulative
/// [`ack_through`](Run::ack_through)) acks its items with one pass of the lane's advancer, not
/// one per item. The per-item rules do not change ([the contract](crate::contract#runs)):
///
/// - Dropping a run, or [`nack`](Run::nack), releases its un-acked remainder: those items are
///   redelivered before anything new, each with `attempt()` one higher
///   ([L6](crate::contract#l6)).
/// - A re-attach takes back the items not acked yet ([L8](crate::contract#l8)); acking them
///   afterwards is refused with [`AckError::Detached`] and they go to the new consumer, while the
///   items acked before the re-attach count. Each item lands xor is redelivered.
/// - A released item is redelivered in a run of its own (`len() == 1`, with its attempt), so a
///   run is always contiguous and all its items share one [`attempt`](Run::attempt).
///
/// Several runs (and single deliveries) may be outstanding at once; a run may be sent to
/// another thread and acked there. `Run<T>` is `Send` and `Sync` only when `T: Send + Sync`.
///
/// ```
/// use lanestream::prelude::*;
/// use lanestream::{Batch, LaneItem, MemoryStream, Position};
/// let stream = MemoryStream::builder().capacity(8).sink("search").build().unwrap();
/// let lane = stream.lane("search").unwrap();
/// let (mut producer, mut consumer) = (stream.fanout().unwrap(), lane.attach().unwrap());
/// for p in 1..=5 {
///     producer.publish(LaneItem::Batch(Batch::new(Some(Position(p)), Vec::new().into()))).unwrap();
/// }
/// let mut run = consumer.try_recv_run(4).unwrap();
/// assert_eq!(run.len(), 4);
/// assert_eq!(run.sequences(), 0..4);
/// let positions: Vec<_> = run.iter().map(|item| item.position()).collect();
/// assert_eq!(positions, [1, 2, 3, 4].map(|p| Some(Position(p))));
/// run.ack_through_position(Position(2)).unwrap(); // items 1 and 2
/// assert_eq!(stream.watermark(), Some(Position(2)));
/// drop(run); // releases items 3 and 4: they come back first, one run each
/// let again = consumer.try_recv_run(4).unwrap();
/// assert_eq!((again.len(), again.attempt()), (1, 2));
/// again.ack().unwrap();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Run<T> {
    /// `None` once acked or released as a whole.
    ring: Option<Arc<Ring<T>>>,
    /// The epoch of the consumer that received the run (for the seat-held ack).
    epoch: u64,
    /// The sequence of the run's first item.
    start: u64,
    /// Items `done..len` are outstanding; items below `done` were acked or released.
    done: usize,
    len: usize,
    attempt: u32,
    /// Delivered plain (no state word written: the ring's "Plain runs").
    plain: bool,
}

impl<T: Item> Run<T> {
    pub(crate) fn new(
        ring: Arc<Ring<T>>,
        epoch: u64,
        start: u64,
        len: usize,
        attempt: u32,
        plain: bool,
    ) -> Run<T> {
        debug_assert!((1..=MAX_RUN).contains(&len));
        Run { ring: Some(ring), epoch, start, done: 0, len, attempt, plain }
    }

    fn ring(&self) -> Option<&Ring<T>> {
        self.ring.as_deref()
    }

    /// How many items of the run are outstanding (delivered, neither acked nor released).
    pub fn len(&self) -> usize {
        self.len - self.done
    }

    /// Whether every item of the run was acked (by [`ack_through`](Run::ack_through)).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sequences ([`AckHandle::sequence`](crate::AckHandle::sequence)) of the outstanding
    /// items: consecutive, the first being the lowest.
    pub fn sequences(&self) -> Range<u64> {
        self.start + self.done as u64..self.start + self.len as u64
    }

    /// Which delivery of its items this is: 1 for a run of first deliveries, higher for a
    /// redelivery (which comes in a run of its own). Saturates at 65535.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The `i`-th outstanding item (0 is the item of `sequences().start`), read in place.
    pub fn get(&self, i: usize) -> Option<&T> {
        let j = self.done.checked_add(i).filter(|&j| j < self.len)?;
        let ring = self.ring()?;
        // SAFETY: item `start + j` is outstanding: this run holds a live handle on it (its
        // holder count is > 0 until `done` passes it; for a plain run, the lane's `free` stays
        // below it until the run acks or releases it, or a re-attach gives it a holder count
        // for this run), so it stays initialised in its slot;
        // the borrow of `self` keeps the run (and the handle) alive while the reference lives.
        Some(unsafe { ring.item(self.start + j as u64) })
    }

    /// The outstanding items, in lane order, read in place.
    pub fn iter(&self) -> RunIter<'_, T> {
        let (next, end) = (self.start + self.done as u64, self.start + self.len as u64);
        match self.ring() {
            Some(ring) => RunIter { ring: Some(ring), next, end },
            None => RunIter { ring: None, next: end, end },
        }
    }

    /// The position of the last positioned outstanding item ([I1](crate::contract#i1)).
    pub fn last_position(&self) -> Option<Position> {
        self.iter().filter_map(Item::position).last()
    }

    /// Acks every outstanding item, with one advancer pass for all of them. Once every earlier
    /// item of the lane is acked too, their slots are reused and the lane's acked position moves
    /// to the last positioned one ([L5](crate::contract#l5)).
    ///
    /// # Errors
    /// [`AckError::Detached`] if a re-attach took back some of the items first
    /// ([L8](crate::contract#l8)): those are redelivered to the new consumer; the others count.
    ///
    /// # Panics
    /// As [`AckHandle::ack`](crate::AckHandle::ack): resumes a panic raised by an item's `Drop`
    /// when the run held the last reference to the stream's cells (the stream, its fan-out and
    /// every other delivery gone), whose drop drops the items left in them; the lane's state is
    /// updated first.
    pub fn ack(mut self) -> Result<(), AckError> {
        let all = self.len();
        self.ack_first(all).map(|_| ())
    }

    /// Cumulative ack: acks every outstanding item whose sequence is `<= sequence` (none if
    /// `sequence` is below [`sequences`](Run::sequences), all if above), with one advancer pass.
    /// The rest stay outstanding. Returns how many items it acked (including refused ones).
    ///
    /// # Errors
    /// As [`ack`](Run::ack), for the items it acked.
    pub fn ack_through(&mut self, sequence: u64) -> Result<usize, AckError> {
        let seqs = self.sequences();
        // `saturating_add`: `ack_through(u64::MAX)` means "the whole run", not a wrap to zero.
        let n = if sequence < seqs.start {
            0
        } else {
            (sequence - seqs.start).saturating_add(1).min(seqs.end - seqs.start)
        };
        self.ack_first(n as usize)
    }

    /// Cumulative ack by position: acks the outstanding items up to and including the last one
    /// whose position is `<= position` (unpositioned items before it included, those after it
    /// not), with one advancer pass. Positions grow along a lane ([L4](crate::contract#l4)), so
    /// this is a prefix. Returns how many items it acked.
    ///
    /// # Errors
    /// As [`ack`](Run::ack), for the items it acked.
    pub fn ack_through_position(&mut self, position: Position) -> Result<usize, AckError> {
        let n = self
            .iter()
            .enumerate()
            .filter(|(_, item)| item.position().is_some_and(|p| p <= position))
            .map(|(i, _)| i + 1)
            .last()
            .unwrap_or(0);
        self.ack_first(n)
    }

    /// Acks the first `n` outstanding items.
    fn ack_first(&mut self, n: usize) -> Result<usize, AckError> {
        // The ring is borrowed beside the fields the acks move (not cloned: no reference-count
        // round trip per ack), and stays in the run until every item is done.
        let Run { ring, epoch, start, done, len, plain, .. } = self;
        let Some(ring) = ring.as_deref() else { return Ok(0) };
        let end = *done + n;
        debug_assert!(end <= *len);
        let (from, to) = (*start + *done as u64, *start + end as u64);
        let acked = if n == 0 {
            Ok(0)
        } else if ring.ack_run(*epoch, from, to, *plain) {
            *done = end;
            ring.run_acked();
            Ok(n)
        } else {
            // A re-attach took the run's outstanding items back: the acked ones are stale,
            // ended here (the rest stay readable until they are acked or the run is dropped).
            *done = end;
            (from..to).for_each(|i| ring.end_stale(i));
            Err(AckError::Detached)
        };
        if self.done == self.len {
            self.ring = None;
        }
        acked
    }

    /// Releases every outstanding item for redelivery to the lane's current consumer, before any
    /// new item ([L6](crate::contract#l6)), with one wake-up. Items a re-attach took back
    /// already are not released again. Dropping the run does the same.
    pub fn nack(self) {
        drop(self);
    }
}

impl<T> Drop for Run<T> {
    /// Releases the outstanding items ([L6](crate::contract#l6)), or, if a re-attach took them
    /// back first, ends each as a stale handle.
    fn drop(&mut self) {
        let Some(ring) = self.ring.take() else { return };
        let (from, end) = (self.start + self.done as u64, self.start + self.len as u64);
        if !ring.release_run(self.epoch, from, end, self.plain) {
            (from..end).for_each(|i| ring.end_stale(i));
        }
        self.done = self.len;
    }
}

impl<T> fmt::Debug for Run<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Run")
            .field("sequences", &(self.start + self.done as u64..self.start + self.len as u64))
            .field("attempt", &self.attempt)
            .finish()
    }
}

impl<'a, T: Item> IntoIterator for &'a Run<T> {
    type Item = &'a T;
    type IntoIter = RunIter<'a, T>;
    fn into_iter(self) -> RunIter<'a, T> {
        self.iter()
    }
}

/// The iterator of [`Run::iter`]: the outstanding items, in lane order.
pub struct RunIter<'a, T> {
    /// The run's ring (`None` once the run was acked whole: nothing to read).
    ring: Option<&'a Ring<T>>,
    /// The sequence of the next item, and the run's end.
    next: u64,
    end: u64,
}

impl<'a, T: Item> Iterator for RunIter<'a, T> {
    type Item = &'a T;

    #[inline]
    fn next(&mut self) -> Option<&'a T> {
        if self.next == self.end {
            return None;
        }
        let ring = self.ring?;
        // SAFETY: as in `Run::get`: item `next` is outstanding in the run the iterator borrows
        // (`next` is below the run's end, at or past its `done`).
        let item = unsafe { ring.item(self.next) };
        self.next += 1;
        Some(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = (self.end - self.next) as usize;
        (n, Some(n))
    }
}

impl<T: Item> ExactSizeIterator for RunIter<'_, T> {}
impl<T: Item> FusedIterator for RunIter<'_, T> {}

impl<T> fmt::Debug for RunIter<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunIter").field("next", &self.next).field("end", &self.end).finish()
    }
}
