//! [`ConsumerStream`]: a consumer as a `futures_core::Stream` (feature `futures`).

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::consumer::Consumer;
use super::delivery::Delivery;
use crate::error::RecvError;
use crate::item::Item;

/// A [`Consumer`] as a [`futures_core::Stream`] of deliveries: each item is what
/// [`Consumer::recv_async`] would return (`Ok(delivery)` or `Err(RecvError::Detached)`), and the
/// stream ends when the lane is closed and drained ([L10](crate::contract#l10)). After
/// `Detached` it ends too: a detached consumer never receives again.
///
/// As with `recv`, an end is not final while deliveries are outstanding: one nacked after the
/// end comes back from a new receive ([`into_inner`](ConsumerStream::into_inner) gives the
/// consumer back).
///
/// ```
/// use futures_core::Stream;
/// use lanestream::prelude::*;
/// use lanestream::{Batch, LaneItem, MemoryStream, Position, Stream as _};
/// use std::pin::pin;
///
/// let stream = MemoryStream::builder().capacity(4).sink("search").build().unwrap();
/// let lane = stream.lane("search").unwrap();
/// let mut producer = stream.fanout().unwrap();
/// producer.publish(LaneItem::Batch(Batch::new(Some(Position(3)), Vec::new().into()))).unwrap();
/// producer.close();
/// let mut deliveries = pin!(lane.attach().unwrap().into_stream());
/// futures_executor::block_on(async {
///     while let Some(delivery) = std::future::poll_fn(|cx| deliveries.as_mut().poll_next(cx)).await {
///         delivery.unwrap().ack().unwrap();
///     }
/// });
/// assert_eq!(lane.acked(), Some(Position(3)));
/// ```
pub struct ConsumerStream<T> {
    consumer: Consumer<T>,
    done: bool,
}

impl<T: Item> ConsumerStream<T> {
    pub(crate) fn new(consumer: Consumer<T>) -> ConsumerStream<T> {
        ConsumerStream { consumer, done: false }
    }

    /// The consumer back.
    pub fn into_inner(self) -> Consumer<T> {
        self.consumer
    }
}

impl<T: Item> futures_core::Stream for ConsumerStream<T> {
    type Item = Result<Delivery<T>, RecvError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // `ConsumerStream` is `Unpin` (the consumer holds no self-references).
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match this.consumer.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(Some(delivery))) => Poll::Ready(Some(Ok(delivery))),
            Poll::Ready(Ok(None)) => {
                this.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Err(e)) => {
                this.done = true;
                Poll::Ready(Some(Err(e)))
            }
        }
    }
}

impl<T> fmt::Debug for ConsumerStream<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsumerStream").field("consumer", &self.consumer).field("done", &self.done).finish()
    }
}
