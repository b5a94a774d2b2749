//! [`MemoryStream`]: the in-memory, lock-free backend of the [`Stream`] port.

use std::fmt;
use std::sync::Arc as StdArc;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use crate::port::{checked_shape, LaneConsumer, LaneDelivery, LaneRun, Stream};
mod requests;

pub use self::requests::{RequestLane, RequestSender};
use crate::error::{AckError, BuildError, RecvError, RecvTimeoutError, StreamError, TryRecvError};
use crate::item::{Item, LaneItem, Request};
use crate::lane::Marks;
use crate::lane::{check_budget, Cells, Consumer, Delivery, Fanout, Lane, LaneStats, MemoryStats, Ring, Run};
use crate::name::SinkName;
use crate::position::Position;
use crate::sync::Arc;
use crate::wait;

/// Builds a [`MemoryStream`]: a capacity, a memory budget, a request-lane capacity, the sinks.
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
    memory_budget: Option<u64>,
}

impl Default for StreamBuilder {
    fn default() -> Self {
        StreamBuilder {
            capacity: StreamBuilder::DEFAULT_CAPACITY,
            request_capacity: 64,
            sinks: Vec::new(),
            memory_budget: None,
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

    /// Bounds the bytes held by published batches that are not dropped yet
    /// ([M4](crate::contract#m4)): each item is charged [`Item::charge`] bytes (for a batch, its
    /// documents' and ids' bytes plus [`ENVELOPE_OVERHEAD`](crate::ENVELOPE_OVERHEAD) per
    /// envelope), once however many lanes hold it, and released when it is dropped (acked on
    /// every lane, at the latest at the fan-out's next publish). A publish waits (blocking,
    /// async, or up to its timeout) while the budget is spent, as it waits for room; capacity
    /// stays the bound in slots. An item larger than the whole budget is admitted only when
    /// nothing else is held, so it never deadlocks. Default: no budget (capacity alone bounds).
    ///
    /// `build` refuses 0 with [`BuildError::ZeroBudget`] and more than [`MAX_BUDGET`](crate::MAX_BUDGET) with
    /// [`BuildError::BudgetTooLarge`].
    pub fn memory_budget(mut self, bytes: u64) -> Self {
        self.memory_budget = Some(bytes);
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
    /// [`BuildError::ZeroCapacity`], [`BuildError::CapacityTooLarge`], [`BuildError::InvalidSink`],
    /// [`BuildError::DuplicateSink`], [`BuildError::ZeroBudget`], [`BuildError::BudgetTooLarge`].
    pub fn build(self) -> Result<MemoryStream, BuildError> {
        let sinks = checked_shape(self.capacity, self.request_capacity, self.sinks)?;
        if let Some(bytes) = self.memory_budget {
            check_budget(bytes)?;
        }
        let marks = Marks::new(sinks.len());
        let cells = Arc::new(Cells::new(self.capacity, self.memory_budget));
        let lanes = sinks
            .iter()
            .enumerate()
            .map(|(i, name)| Lane::new(name.clone(), Ring::new(cells.clone(), marks.mark(i))))
            .collect();
        let requests = RequestLane::new(self.request_capacity);
        Ok(MemoryStream { marks, inner: StdArc::new(Inner { sinks: sinks.into(), cells, lanes, requests }) })
    }
}

struct Inner {
    sinks: Box<[SinkName]>,
    /// The one array every lane reads, with its cursor.
    cells: Arc<Cells<LaneItem>>,
    lanes: Box<[Lane]>,
    requests: RequestLane,
}

/// The in-memory, lock-free engine behind the [`Stream`] port: one bounded array of cells that
/// every sink's lane reads in place, published to by the stream's one [`Fanout`]; the request
/// lane; and the watermark over the lanes' acked positions. Cheap to clone (a reference
/// count); every clone is the same stream.
///
/// ```
/// use lanestream::prelude::*;
/// use lanestream::{MemoryStream, LaneItem, Batch, Position};
/// let stream = MemoryStream::builder().capacity(8).sinks(["search", "cache"]).build().unwrap();
/// let batch = LaneItem::Batch(Batch::new(Some(Position(42)), Vec::new().into()));
/// stream.fanout().unwrap().publish(batch).unwrap(); // written once, read by both lanes
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

    /// What the published items hold in memory now ([`MemoryStats`]): items not dropped yet and
    /// their charges against the [memory budget](StreamBuilder::memory_budget).
    pub fn memory(&self) -> MemoryStats {
        MemoryStats::of(&self.inner.cells)
    }

    /// [W6](crate::contract#w6): whether the watermark can no longer move: a lane was closed
    /// (nothing more is published) and every lane is idle (nothing left to ack).
    fn settled(&self) -> bool {
        self.inner.cells.any_closed() && self.inner.lanes.iter().all(Lane::is_idle)
    }

    /// The watermark if it is at least `at_least` or can no longer move (a wait is over).
    fn watermark_reached(&self, at_least: Position) -> Option<Option<Position>> {
        let now = self.watermark();
        (now >= Some(at_least) || self.inner.lanes.is_empty() || self.settled()).then_some(now)
    }

    /// Asks every lane's advancer to wake the watermark waiters (before the re-check).
    fn want_watermark(&self) {
        for lane in self.inner.lanes.iter() {
            lane.ring().want_watermark();
        }
    }

    /// The request lane (sink engines to the ingest engine).
    pub fn requests(&self) -> RequestLane {
        self.inner.requests.clone()
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

    /// The stream's one publisher ([`Fanout`]). It holds the producer role
    /// ([L9](crate::contract#l9)) until it is dropped.
    ///
    /// # Errors
    /// [`StreamError::ProducerBusy`] (naming the first lane) while another fan-out of the
    /// stream is alive.
    fn fanout(&self) -> Result<Fanout, StreamError> {
        Fanout::claim(&self.inner.cells, &self.inner.lanes)
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

    fn wait_watermark(&self, at_least: Position, deadline: Option<Instant>) -> Option<Position> {
        let ready = || self.watermark_reached(at_least);
        let waited = wait::block_until(self.marks.waiters(), || self.want_watermark(), deadline, ready);
        waited.unwrap_or_else(|| self.watermark())
    }

    fn wait_watermark_async(&self, at_least: Position) -> impl Future<Output = Option<Position>> + Send + '_ {
        WaitWatermark { stream: self, at_least, key: None }
    }

    fn is_idle(&self) -> bool {
        self.inner.lanes.iter().all(Lane::is_idle) && self.inner.requests.is_idle()
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

// The in-memory lane ends are the port's ends for every item type, statically dispatched. The
// fan-out and the request sender implement their traits in place (`lane/fanout.rs`,
// `requests.rs`): they have no surface of their own. The consumer, its deliveries and runs keep
// their primitives as inherent methods, which the traits call (they serve a standalone lane of
// any `Item`, one the port's `Send` bounds exclude too); the other forms are the port's.

impl<T: Item + Send + Sync> LaneConsumer<T> for Consumer<T> {
    type Delivery = Delivery<T>;
    type Run = Run<T>;

    #[inline]
    fn try_recv(&mut self) -> Result<Delivery<T>, TryRecvError> {
        Consumer::try_recv(self)
    }

    #[inline]
    fn recv_deadline(&mut self, deadline: Option<Instant>) -> Result<Option<Delivery<T>>, RecvTimeoutError> {
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

    #[inline]
    fn try_recv_run(&mut self, max: usize) -> Result<Run<T>, TryRecvError> {
        Consumer::try_recv_run(self, max)
    }

    #[inline]
    fn recv_run_deadline(
        &mut self,
        max: usize,
        deadline: Option<Instant>,
    ) -> Result<Option<Run<T>>, RecvTimeoutError> {
        Consumer::recv_run_deadline(self, max, deadline)
    }
}

/// The native run: one step of the consumer's seat, one advancer pass to ack.
impl<T: Item + Send + Sync> LaneRun<T> for Run<T> {
    fn len(&self) -> usize {
        Run::len(self)
    }

    #[inline]
    fn get(&self, i: usize) -> Option<&T> {
        Run::get(self, i)
    }

    fn redelivered(&self) -> usize {
        // A redelivered item comes in a run of its own: all of a run's items share its attempt.
        if self.attempt() > 1 {
            self.len()
        } else {
            0
        }
    }

    fn ack(self) -> Result<(), AckError> {
        Run::ack(self)
    }

    fn nack(self) {
        Run::nack(self)
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

/// The future of [`MemoryStream`]'s `wait_watermark_async`: registers the task on the
/// watermark's wait list and asks every lane's advancer to wake it, then re-checks.
struct WaitWatermark<'a> {
    stream: &'a MemoryStream,
    at_least: Position,
    key: Option<u64>,
}

impl Future for WaitWatermark<'_> {
    type Output = Option<Position>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Position>> {
        let this = &mut *self;
        let (stream, at_least) = (this.stream, this.at_least);
        let waiters = stream.marks.waiters();
        match wait::poll_until(
            waiters,
            || stream.want_watermark(),
            &mut this.key,
            cx.waker(),
            || stream.watermark_reached(at_least),
        ) {
            Some(now) => Poll::Ready(now),
            None => Poll::Pending,
        }
    }
}

impl Drop for WaitWatermark<'_> {
    fn drop(&mut self) {
        self.stream.marks.waiters().cancel(&mut self.key);
    }
}
