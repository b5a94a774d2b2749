//! [`MemoryStream`]: the in-memory, lock-free backend of the [`Stream`] port.

use std::fmt;
use std::sync::Arc as StdArc;

use std::future::Future;
use std::time::{Duration, Instant};

use super::port::{LaneConsumer, LaneDelivery, LaneProducer, Stream, StreamFanout};
use super::requests::{RequestLane, RequestSender};
use super::watermark::Marks;
use crate::error::{
    AckError, BuildError, PublishError, PublishTimeoutError, RecvError, RecvTimeoutError, StreamError,
    TryPublishError, TryRecvError,
};
use crate::item::{Item, LaneItem, Request};
use crate::lane::{Cells, Consumer, Delivery, Fanout, Lane, LaneStats, Producer, Ring};
use crate::name::SinkName;
use crate::position::Position;
use crate::sync::Arc;

/// Builds a [`MemoryStream`]: a capacity per lane, a request-lane capacity, the sinks.
///
/// ```
/// use lanestream::{BuildError, MemoryStream, Stream};
/// let stream = MemoryStream::builder().capacity(256).sinks(["search", "cache"]).build().unwrap();
/// assert_eq!(stream.sinks().len(), 2);
/// assert!(matches!(MemoryStream::builder().capacity(0).sink("a").build(), Err(BuildError::ZeroCapacity(_))));
/// assert!(matches!(MemoryStream::builder().sinks(["a", "a"]).build(), Err(BuildError::DuplicateSink(_))));
/// assert!(matches!(MemoryStream::builder().sink("Not-A-Name").build(), Err(BuildError::InvalidSink(_))));
/// ```
#[derive(Clone, Debug)]
pub struct StreamBuilder {
    capacity: usize,
    request_capacity: usize,
    sinks: Vec<String>,
    shared_ring: bool,
}

impl Default for StreamBuilder {
    fn default() -> Self {
        StreamBuilder {
            capacity: StreamBuilder::DEFAULT_CAPACITY,
            request_capacity: 64,
            sinks: Vec::new(),
            shared_ring: false,
        }
    }
}

impl StreamBuilder {
    /// The default lane capacity, in items (batches).
    pub const DEFAULT_CAPACITY: usize = 1024;

    /// A builder with the default capacities (1024 per lane, 64 for requests) and no sinks.
    pub fn new() -> StreamBuilder {
        StreamBuilder::default()
    }

    /// Slots per sink lane, in items: how many unacked batches a lane holds before publishing
    /// waits. Any value >= 1 (powers of two index slightly faster).
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity;
        self
    }

    /// Slots in the request lane (>= 1).
    pub fn request_capacity(mut self, capacity: usize) -> Self {
        self.request_capacity = capacity;
        self
    }

    /// Whether the lanes share one ring of items (default `false`: every lane has a ring of its
    /// own).
    ///
    /// With a shared ring, the stream's [`Fanout`] writes each item once into one array of
    /// `capacity` cells and publishes it to every lane with one step per lane; each lane keeps
    /// its own cursors and per-slot states (so every rule of the contract holds per lane as
    /// before: acks in any order, nack, re-attach, the acked position), and reads the items in
    /// place. No item is cloned per lane and no lane drops one: the fan-out drops an item when it
    /// reuses its cell (every lane emptied that slot), so the cross-lane traffic per item is the
    /// one cell the producer writes, as in the LMAX Disruptor's ring. The costs: only the
    /// fan-out publishes (a lane's [`producer`](Lane::producer) is refused with
    /// [`StreamError::SharedRing`](crate::StreamError::SharedRing), and so is
    /// [`MemoryStream::producer`]); the slowest lane holds every lane's room; and up to `capacity`
    /// acked items stay alive until their cells are reused ([`Fanout::reclaim`] drops them
    /// sooner).
    pub fn shared_ring(mut self, shared: bool) -> Self {
        self.shared_ring = shared;
        self
    }

    /// Adds a sink (one lane).
    pub fn sink(mut self, name: impl Into<String>) -> Self {
        self.sinks.push(name.into());
        self
    }

    /// Adds sinks (one lane each), in order.
    pub fn sinks<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.sinks.extend(names.into_iter().map(Into::into));
        self
    }

    /// Builds the stream, allocating every lane's slots now ([M1](crate::contract#m1)).
    ///
    /// # Errors
    /// [`BuildError::ZeroCapacity`], [`BuildError::InvalidSink`], [`BuildError::DuplicateSink`].
    pub fn build(self) -> Result<MemoryStream, BuildError> {
        let sinks = super::checked_shape(self.capacity, self.request_capacity, self.sinks)?;
        let marks = Marks::new(sinks.len());
        let cells = self.shared_ring.then(|| Arc::new(Cells::new(self.capacity, true)));
        let lanes = sinks
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let ring = match &cells {
                    Some(cells) => Ring::with_cells(cells.clone(), marks.mark(i)),
                    None => Ring::new(self.capacity, marks.mark(i)),
                };
                Lane::new(name.clone(), ring)
            })
            .collect();
        let requests = RequestLane::new(self.request_capacity);
        Ok(MemoryStream { marks, inner: StdArc::new(Inner { sinks: sinks.into(), lanes, requests }) })
    }
}

struct Inner {
    sinks: Box<[SinkName]>,
    lanes: Box<[Lane]>,
    requests: RequestLane,
}

/// The in-memory, lock-free engine behind the [`Stream`] port: one bounded ring per sink, the
/// request lane, and the watermark over the lanes' acked positions. Cheap to clone (a reference
/// count); every clone is the same stream.
///
/// ```
/// use lanestream::{MemoryStream, Stream, LaneItem, Batch, Position};
/// let stream = MemoryStream::builder().capacity(8).sinks(["search", "cache"]).build().unwrap();
/// let batch = LaneItem::Batch(Batch::new(Some(Position(42)), Vec::new().into()));
/// for sink in stream.sinks() {
///     let lane = stream.lane(sink.as_str()).unwrap();
///     lane.producer().unwrap().publish(batch.clone()).unwrap(); // one Arc, shared
/// }
/// assert_eq!(stream.watermark(), None); // nobody acked yet
/// for sink in stream.sinks() {
///     let mut consumer = stream.lane(sink.as_str()).unwrap().reattach();
///     consumer.try_recv().unwrap().ack().unwrap();
/// }
/// assert_eq!(stream.watermark(), Some(Position(42)));
/// assert!(stream.is_idle());
/// ```
#[derive(Clone)]
pub struct MemoryStream {
    inner: StdArc<Inner>,
    /// The lanes' acked marks (each ring holds them too), here so that `watermark` is one
    /// pointer away.
    marks: Marks,
}

impl MemoryStream {
    /// A [`StreamBuilder`].
    pub fn builder() -> StreamBuilder {
        StreamBuilder::new()
    }

    /// The lanes, in sink order (handles: cloning one moves a reference count).
    pub fn lanes(&self) -> impl ExactSizeIterator<Item = Lane> + '_ {
        self.inner.lanes.iter().cloned()
    }

    /// The lane of `sink`.
    ///
    /// # Errors
    /// [`StreamError::UnknownLane`] if no sink has that name ([L1](crate::contract#l1)).
    pub fn lane(&self, sink: &str) -> Result<Lane, StreamError> {
        self.lane_ref(sink).cloned()
    }

    fn lane_ref(&self, sink: &str) -> Result<&Lane, StreamError> {
        self.inner
            .lanes
            .iter()
            .find(|lane| lane.name().as_str() == sink)
            .ok_or_else(|| StreamError::UnknownLane(sink.to_owned()))
    }

    /// One publisher for every lane ([`Fanout`]): publishes each item to every lane in one
    /// pass, and runs of items with one publication step per lane. It holds every lane's
    /// producer role ([L9](crate::contract#l9)) until it is dropped.
    ///
    /// # Errors
    /// [`StreamError::ProducerBusy`] (naming the first such lane) while a producer of some lane
    /// is alive; no lane is claimed then.
    pub fn fanout(&self) -> Result<Fanout, StreamError> {
        Fanout::claim(&self.inner.lanes)
    }

    /// The request lane (sink engines to the ingest engine).
    pub fn requests(&self) -> RequestLane {
        self.inner.requests.clone()
    }
}

impl MemoryStream {
    /// The producer of `sink`'s lane (the lane's own, outside the port: the port publishes
    /// through [`fanout`](MemoryStream::fanout)).
    ///
    /// # Errors
    /// [`StreamError::UnknownLane`]; [`StreamError::ProducerBusy`] while another producer of the
    /// lane (or a fan-out) is alive; [`StreamError::SharedRing`] on a shared ring.
    pub fn producer(&self, sink: &str) -> Result<Producer<LaneItem>, StreamError> {
        self.lane_ref(sink)?.producer()
    }

    /// Whether the watermark can no longer move: every lane closed with nothing left unacked
    /// (or no lane at all).
    fn watermark_final(&self) -> bool {
        self.inner.lanes.iter().all(|lane| lane.stats().closed && lane.is_idle())
    }
}

impl Stream for MemoryStream {
    type Fanout = Fanout;
    type Consumer = Consumer<LaneItem>;
    type RequestSender = RequestSender;
    type RequestConsumer = Consumer<Request>;

    fn sinks(&self) -> &[SinkName] {
        &self.inner.sinks
    }

    fn fanout(&self) -> Result<Fanout, StreamError> {
        MemoryStream::fanout(self)
    }

    fn attach(&self, sink: &str) -> Result<Consumer<LaneItem>, StreamError> {
        self.lane_ref(sink)?.attach()
    }

    fn reattach(&self, sink: &str) -> Result<Consumer<LaneItem>, StreamError> {
        Ok(self.lane_ref(sink)?.reattach())
    }

    fn close(&self, sink: &str) -> Result<(), StreamError> {
        self.lane_ref(sink)?.close();
        Ok(())
    }

    fn acked(&self, sink: &str) -> Result<Option<Position>, StreamError> {
        Ok(self.lane_ref(sink)?.acked())
    }

    fn stats(&self, sink: &str) -> Result<LaneStats, StreamError> {
        Ok(self.lane_ref(sink)?.stats())
    }

    fn request_stats(&self) -> LaneStats {
        self.inner.requests.stats()
    }

    fn request_sender(&self) -> RequestSender {
        self.inner.requests.sender()
    }

    fn attach_requests(&self) -> Result<Consumer<Request>, StreamError> {
        self.inner.requests.attach()
    }

    fn reattach_requests(&self) -> Consumer<Request> {
        self.inner.requests.reattach()
    }

    fn close_requests(&self) {
        self.inner.requests.close();
    }

    fn watermark(&self) -> Option<Position> {
        self.marks.watermark()
    }

    /// A simple loop for now (it reads the watermark every millisecond).
    fn wait_watermark(&self, at_least: Position, deadline: Option<Instant>) -> Option<Position> {
        loop {
            let w = self.watermark();
            if w >= Some(at_least) || self.watermark_final() || deadline.is_some_and(|d| Instant::now() >= d)
            {
                return w;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// For now the blocking wait on a thread of its own, which wakes the task when it returns.
    fn wait_watermark_async(&self, at_least: Position) -> impl Future<Output = Option<Position>> + Send + '_ {
        let mut done: Option<std::sync::mpsc::Receiver<Option<Position>>> = None;
        std::future::poll_fn(move |cx| {
            let w = self.watermark();
            if w >= Some(at_least) || self.watermark_final() {
                return std::task::Poll::Ready(w);
            }
            if let Some(rx) = &done {
                if let Ok(w) = rx.try_recv() {
                    return std::task::Poll::Ready(w);
                }
            }
            let (tx, rx) = std::sync::mpsc::channel();
            let (stream, waker) = (self.clone(), cx.waker().clone());
            std::thread::spawn(move || {
                let _ = tx.send(stream.wait_watermark(at_least, None));
                waker.wake();
            });
            done = Some(rx);
            std::task::Poll::Pending
        })
    }

    fn is_idle(&self) -> bool {
        self.inner.lanes.iter().all(Lane::is_idle) && self.inner.requests.is_idle()
    }
}

impl StreamFanout for Fanout {
    fn lanes(&self) -> usize {
        Fanout::lanes(self)
    }

    fn try_publish(&mut self, item: LaneItem) -> Result<(), TryPublishError<LaneItem>> {
        Fanout::try_publish(self, item)
    }

    fn publish(&mut self, item: LaneItem) -> Result<(), PublishError<LaneItem>> {
        Fanout::publish(self, item)
    }

    fn publish_deadline(
        &mut self,
        item: LaneItem,
        deadline: Instant,
    ) -> Result<(), PublishTimeoutError<LaneItem>> {
        Fanout::publish_deadline(self, item, deadline)
    }

    fn publish_timeout(
        &mut self,
        item: LaneItem,
        timeout: Duration,
    ) -> Result<(), PublishTimeoutError<LaneItem>> {
        Fanout::publish_timeout(self, item, timeout)
    }

    fn publish_async(
        &mut self,
        item: LaneItem,
    ) -> impl Future<Output = Result<(), PublishError<LaneItem>>> + Send + '_ {
        Fanout::publish_async(self, item)
    }

    fn try_publish_run(&mut self, items: &[LaneItem]) -> Result<usize, TryPublishError<usize>> {
        Fanout::try_publish_run(self, items)
    }

    fn publish_run(&mut self, items: &[LaneItem]) -> Result<(), PublishError<usize>> {
        Fanout::publish_run(self, items)
    }

    fn publish_to(&mut self, lane: usize, item: LaneItem) -> Result<(), PublishError<LaneItem>> {
        Fanout::publish_to(self, lane, item)
    }

    fn try_publish_to(&mut self, lane: usize, item: LaneItem) -> Result<(), TryPublishError<LaneItem>> {
        Fanout::try_publish_to(self, lane, item)
    }

    fn close(&self) {
        Fanout::close(self)
    }
}

impl fmt::Debug for MemoryStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStream")
            .field("sinks", &self.inner.sinks)
            .field("watermark", &self.watermark())
            .finish_non_exhaustive()
    }
}

// The in-memory lane ends are the port's ends for every item type, statically dispatched.

impl<T: Item + Send + Sync> LaneProducer<T> for Producer<T> {
    #[inline]
    fn try_publish(&mut self, item: T) -> Result<(), TryPublishError<T>> {
        Producer::try_publish(self, item)
    }

    #[inline]
    fn publish(&mut self, item: T) -> Result<(), PublishError<T>> {
        Producer::publish(self, item)
    }

    fn publish_deadline(&mut self, item: T, deadline: Instant) -> Result<(), PublishTimeoutError<T>> {
        Producer::publish_deadline(self, item, deadline)
    }

    fn publish_async(&mut self, item: T) -> impl Future<Output = Result<(), PublishError<T>>> + Send + '_ {
        Producer::publish_async(self, item)
    }

    fn close(&self) {
        Producer::close(self)
    }

    fn is_closed(&self) -> bool {
        Producer::is_closed(self)
    }

    fn capacity(&self) -> usize {
        Producer::capacity(self)
    }
}

impl<T: Item + Send + Sync> LaneConsumer<T> for Consumer<T> {
    type Delivery = Delivery<T>;

    #[inline]
    fn try_recv(&mut self) -> Result<Delivery<T>, TryRecvError> {
        Consumer::try_recv(self)
    }

    #[inline]
    fn recv(&mut self) -> Result<Option<Delivery<T>>, RecvError> {
        Consumer::recv(self)
    }

    fn recv_deadline(&mut self, deadline: Instant) -> Result<Option<Delivery<T>>, RecvTimeoutError> {
        Consumer::recv_deadline(self, deadline)
    }

    fn recv_async(&mut self) -> impl Future<Output = Result<Option<Delivery<T>>, RecvError>> + Send + '_ {
        Consumer::recv_async(self)
    }

    fn is_empty(&self) -> bool {
        Consumer::is_empty(self)
    }

    fn is_detached(&self) -> bool {
        Consumer::is_detached(self)
    }
}

impl<T: Item + Send + Sync> LaneDelivery<T> for Delivery<T> {
    #[inline]
    fn item(&self) -> &T {
        Delivery::item(self)
    }

    fn attempt(&self) -> u32 {
        Delivery::attempt(self)
    }

    #[inline]
    fn ack(self) -> Result<(), AckError> {
        Delivery::ack(self)
    }

    fn nack(self) {
        Delivery::nack(self)
    }
}
