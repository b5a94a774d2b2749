//! [`Delivery`] and [`AckHandle`]: one delivered item and the right to ack or nack it.

use std::fmt;
use std::ops::Deref;

use super::ring::{attempt, Ring};
use crate::error::AckError;
use crate::item::Item;
use crate::sync::Arc;

/// The right to ack or nack one delivery. Acking consumes it, so acking twice is impossible
/// ([L7](crate::contract#l7)); dropping it nacks ([L6](crate::contract#l6)).
///
/// `AckHandle<T>` is `Send` and `Sync` only when `T: Send + Sync`. It can be sent to a worker
/// thread and acked there, in any order relative to other handles ([L5](crate::contract#l5)).
pub struct AckHandle<T> {
    /// `None` once acked or nacked.
    ring: Option<Arc<Ring<T>>>,
    index: u64,
    word: u64,
}

impl<T: Item> AckHandle<T> {
    pub(crate) fn new(ring: Arc<Ring<T>>, index: u64, word: u64) -> AckHandle<T> {
        AckHandle { ring: Some(ring), index, word }
    }

    fn ring(&self) -> &Ring<T> {
        self.ring.as_deref().expect("live handle has its ring")
    }

    /// Acknowledges the item: once every earlier item of the lane is acked too, its slot is
    /// reused and, if it is positioned, the lane's acked position moves to it ([L5](crate::contract#l5)).
    ///
    /// # Errors
    /// [`AckError::Detached`] if a consumer re-attach took the delivery back first ([L8](crate::contract#l8)): the item
    /// is redelivered to the new consumer and the ack did not count.
    ///
    /// # Panics
    /// Resumes a panic raised by an item's `Drop` if this ack completed that item's prefix (the
    /// lane's state is updated first; nothing is lost).
    pub fn ack(mut self) -> Result<(), AckError> {
        let ring = self.ring.take().expect("live handle has its ring");
        ring.ack(self.index, self.word)
    }

    /// Releases the item for redelivery to the lane's current consumer, before any new item
    /// ([L6](crate::contract#l6)). If a re-attach already took it back, does nothing more.
    pub fn nack(mut self) {
        if let Some(ring) = self.ring.take() {
            ring.nack(self.index, self.word);
        }
    }

    /// Which delivery of the item this is: 1 for the first, 2 for the first redelivery, ...
    /// (saturates at 65535).
    pub fn attempt(&self) -> u32 {
        attempt(self.word)
    }

    /// The item's sequence number in its lane: 0 for the first item ever published, counting
    /// every item (positioned or not).
    pub fn sequence(&self) -> u64 {
        self.index
    }
}

impl<T> Drop for AckHandle<T> {
    /// Dropping an un-acked handle nacks it ([L6](crate::contract#l6)).
    fn drop(&mut self) {
        if let Some(ring) = self.ring.take() {
            ring.nack(self.index, self.word);
        }
    }
}

impl<T> fmt::Debug for AckHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AckHandle")
            .field("sequence", &self.index)
            .field("attempt", &attempt(self.word))
            .finish()
    }
}

/// One delivered item: read it with [`item`](Delivery::item) (or deref), then [`ack`](Delivery::ack)
/// or [`nack`](Delivery::nack). Dropping it un-acked nacks it ([L6](crate::contract#l6)). The item is read in place,
/// in the lane's slot: no copy, no reference count.
///
/// ```
/// use lanestream::prelude::*;
/// use lanestream::{MemoryStream, LaneItem, Batch, Position};
/// let stream = MemoryStream::builder().capacity(2).sink("s").build().unwrap();
/// let lane = stream.lane("s").unwrap();
/// let (mut producer, mut consumer) = (stream.fanout().unwrap(), lane.reattach());
/// producer.publish(LaneItem::Batch(Batch::new(Some(Position(1)), Vec::new().into()))).unwrap();
/// let first = consumer.try_recv().unwrap();
/// assert_eq!(first.attempt(), 1);
/// first.nack(); // released: redelivered before anything new
/// let again = consumer.try_recv().unwrap();
/// assert_eq!(again.attempt(), 2);
/// again.ack().unwrap();
/// assert_eq!(lane.stats().acked, Some(Position(1)));
/// ```
pub struct Delivery<T> {
    handle: AckHandle<T>,
}

impl<T: Item> Delivery<T> {
    pub(crate) fn new(handle: AckHandle<T>) -> Delivery<T> {
        Delivery { handle }
    }

    /// The delivered item, read in place.
    pub fn item(&self) -> &T {
        // SAFETY: the handle is live (it is only taken by consuming `self`), so the item stays
        // initialised in its slot until the handle ends.
        unsafe { self.handle.ring().item(self.handle.index) }
    }

    /// Which delivery of the item this is: 1 for the first (see [`AckHandle::attempt`]).
    pub fn attempt(&self) -> u32 {
        self.handle.attempt()
    }

    /// Acknowledges the item; see [`AckHandle::ack`].
    ///
    /// # Errors
    /// [`AckError::Detached`] if a re-attach took the delivery back first.
    pub fn ack(self) -> Result<(), AckError> {
        self.handle.ack()
    }

    /// Releases the item for redelivery; see [`AckHandle::nack`].
    pub fn nack(self) {
        self.handle.nack()
    }

    /// Splits the delivery into a clone of the item and its [`AckHandle`], e.g. to keep the item
    /// while a worker acks. For [`LaneItem`](crate::LaneItem) the clone moves a reference count;
    /// the envelopes are not copied. Dropping the item part releases nothing; dropping the handle
    /// nacks.
    pub fn into_parts(self) -> (T, AckHandle<T>)
    where
        T: Clone,
    {
        let item = self.item().clone();
        (item, self.handle)
    }

    /// The handle alone, without cloning the item.
    pub fn into_handle(self) -> AckHandle<T> {
        self.handle
    }
}

impl<T: Item> Deref for Delivery<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.item()
    }
}

impl<T: Item + fmt::Debug> fmt::Debug for Delivery<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery").field("item", self.item()).field("attempt", &self.attempt()).finish()
    }
}
