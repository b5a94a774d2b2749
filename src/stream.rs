//! The port ([`Stream`]) and its in-memory engine ([`MemoryStream`]): lanes, the request lane,
//! the watermark.

use std::fmt;
use std::sync::Arc as StdArc;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::ring::{Marks, ProducerState, Ring, NO_MARK};
use crate::sync::{lock, Arc, AtomicU64, Mutex};
use crate::{
    watermark, BuildError, Consumer, Item, LaneItem, LaneStats, Position, Producer, PublishError, Request,
    SinkName, StreamError,
};

/// The stream port: what a sink engine and an ingest engine need from a stream, whatever backs
/// it. Object-safe, so a backend can be chosen at run time (`Box<dyn Stream>`).
pub trait Stream: Send + Sync {
    /// The sinks, in build order (fixed at build, L1).
    fn sinks(&self) -> &[SinkName];

    /// The lane of `sink`.
    ///
    /// # Errors
    /// [`StreamError::UnknownLane`] if no sink has that name (L1).
    fn lane(&self, sink: &str) -> Result<Lane, StreamError>;

    /// The request lane (sink engines to ingest engine).
    fn requests(&self) -> RequestLane;

    /// The minimum acked position over all lanes (W1): `None` until every lane has acked a
    /// positioned batch, and `None` for a stream with no lanes. Lock-free; never decreases as
    /// seen from one thread (W3).
    fn watermark(&self) -> Option<Position>;

    /// Whether every lane and the request lane have nothing queued, released, or
    /// delivered-but-unacked (W5).
    fn is_idle(&self) -> bool;
}

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
}

impl Default for StreamBuilder {
    fn default() -> Self {
        StreamBuilder { capacity: StreamBuilder::DEFAULT_CAPACITY, request_capacity: 64, sinks: Vec::new() }
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

    /// Builds the stream, allocating every lane's slots now (M1).
    ///
    /// # Errors
    /// [`BuildError::ZeroCapacity`], [`BuildError::InvalidSink`], [`BuildError::DuplicateSink`].
    pub fn build(self) -> Result<MemoryStream, BuildError> {
        if self.capacity == 0 {
            return Err(BuildError::ZeroCapacity("sink lanes"));
        }
        if self.request_capacity == 0 {
            return Err(BuildError::ZeroCapacity("the request lane"));
        }
        let mut sinks: Vec<SinkName> = Vec::with_capacity(self.sinks.len());
        for name in self.sinks {
            let name = SinkName::new(name)?;
            if sinks.contains(&name) {
                return Err(BuildError::DuplicateSink(name));
            }
            sinks.push(name);
        }
        let marks: Marks = (0..sinks.len()).map(|_| CachePadded::new(AtomicU64::new(NO_MARK))).collect();
        let lanes = (0..sinks.len()).map(|i| Arc::new(Ring::new(self.capacity, marks.clone(), i))).collect();
        let request_marks: Marks = StdArc::new([CachePadded::new(AtomicU64::new(NO_MARK))]);
        let request_ring = Arc::new(Ring::new(self.request_capacity, request_marks, 0));
        let request_producer = request_ring.claim_producer().expect("a new ring has no producer");
        let requests =
            StdArc::new(RequestShared { ring: request_ring, producer: Mutex::new(request_producer) });
        Ok(MemoryStream { marks, inner: StdArc::new(Inner { sinks: sinks.into(), lanes, requests }) })
    }
}

struct Inner {
    sinks: Box<[SinkName]>,
    lanes: Box<[Arc<Ring<LaneItem>>]>,
    requests: StdArc<RequestShared>,
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
///     let mut consumer = stream.lane(sink.as_str()).unwrap().consumer();
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

    /// The lanes, in sink order.
    pub fn lanes(&self) -> impl Iterator<Item = Lane> + '_ {
        self.inner
            .sinks
            .iter()
            .zip(self.inner.lanes.iter())
            .map(|(name, ring)| Lane { name: name.clone(), ring: ring.clone() })
    }
}

impl Stream for MemoryStream {
    fn sinks(&self) -> &[SinkName] {
        &self.inner.sinks
    }

    fn lane(&self, sink: &str) -> Result<Lane, StreamError> {
        let i = self
            .inner
            .sinks
            .iter()
            .position(|s| s.as_str() == sink)
            .ok_or_else(|| StreamError::UnknownLane(sink.to_owned()))?;
        Ok(Lane { name: self.inner.sinks[i].clone(), ring: self.inner.lanes[i].clone() })
    }

    fn requests(&self) -> RequestLane {
        RequestLane { shared: self.inner.requests.clone() }
    }

    fn watermark(&self) -> Option<Position> {
        watermark::watermark(&self.marks)
    }

    fn is_idle(&self) -> bool {
        self.inner.lanes.iter().all(|r| r.is_idle()) && self.inner.requests.ring.is_idle()
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

/// A handle on one lane: get its [`Producer`] and [`Consumer`], read its statistics. Cheap to
/// clone.
///
/// A stream's lanes carry [`LaneItem`]s. [`Lane::standalone`] builds a lane outside any stream,
/// for any [`Item`] type (its acked position counts for no watermark).
pub struct Lane<T = LaneItem> {
    name: SinkName,
    ring: Arc<Ring<T>>,
}

impl<T> Clone for Lane<T> {
    fn clone(&self) -> Self {
        Lane { name: self.name.clone(), ring: self.ring.clone() }
    }
}

impl<T: Item> Lane<T> {
    /// A lane of `capacity` slots outside any stream, carrying `T`.
    ///
    /// ```
    /// use lanestream::{Item, Lane, Position, SinkName};
    /// #[derive(Debug)]
    /// struct Tick(u64);
    /// impl Item for Tick {
    ///     fn position(&self) -> Option<Position> { Some(Position(self.0)) }
    /// }
    /// let lane = Lane::standalone(SinkName::new("ticks").unwrap(), 3).unwrap();
    /// let (mut tx, mut rx) = (lane.producer().unwrap(), lane.consumer());
    /// tx.publish(Tick(5)).unwrap();
    /// rx.try_recv().unwrap().ack().unwrap();
    /// assert_eq!(lane.acked(), Some(Position(5)));
    /// ```
    ///
    /// # Errors
    /// [`BuildError::ZeroCapacity`] for a capacity of 0.
    pub fn standalone(name: SinkName, capacity: usize) -> Result<Lane<T>, BuildError> {
        if capacity == 0 {
            return Err(BuildError::ZeroCapacity("a standalone lane"));
        }
        let marks: Marks = StdArc::new([CachePadded::new(AtomicU64::new(NO_MARK))]);
        Ok(Lane { name, ring: Arc::new(Ring::new(capacity, marks, 0)) })
    }

    /// The sink this lane feeds.
    pub fn name(&self) -> &SinkName {
        &self.name
    }

    /// The lane's producer (L9).
    ///
    /// # Errors
    /// [`StreamError::ProducerBusy`] while another producer of this lane is alive. Once it is
    /// dropped (a restarted ingest engine), this succeeds at once and publishing continues after
    /// the last published item and position.
    pub fn producer(&self) -> Result<Producer<T>, StreamError> {
        let state = self.ring.claim_producer().ok_or_else(|| StreamError::ProducerBusy(self.name.clone()))?;
        Ok(Producer::new(self.ring.clone(), state))
    }

    /// A consumer of the lane. Never fails: if a consumer is already attached, it is detached
    /// and every unacked item is redelivered to the new one, in order (L8).
    pub fn consumer(&self) -> Consumer<T> {
        Consumer::attach(self.ring.clone())
    }

    /// Closes the lane, as [`Producer::close`] does, without holding the producer: for a
    /// supervisor shutting a pipeline down while the producer waits in `publish` (L10). Wakes
    /// every waiter; a waiting publish returns `Closed` with its item.
    pub fn close(&self) {
        self.ring.close();
    }

    /// The lane's acked position (L5): the position of the last positioned item in the
    /// contiguous acked prefix.
    pub fn acked(&self) -> Option<Position> {
        self.ring.acked()
    }

    /// The lane's counters, read lock-free.
    pub fn stats(&self) -> LaneStats {
        self.ring.stats()
    }

    /// Whether the lane has nothing queued, released or unacked.
    pub fn is_idle(&self) -> bool {
        self.ring.is_idle()
    }
}

impl<T: Item> fmt::Debug for Lane<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lane").field("name", &self.name).field("stats", &self.stats()).finish()
    }
}

struct RequestShared {
    ring: Arc<Ring<Request>>,
    /// The single producer state, shared by every [`RequestSender`]: each publish step takes
    /// this lock for its non-blocking part only; waiting for room happens outside it.
    producer: Mutex<ProducerState>,
}

/// The request lane: sink engines publish [`Request`]s with a [`RequestSender`] (any number,
/// concurrently: R1), one ingest engine consumes them with the same at-least-once
/// ack/nack/redelivery/re-attach rules as a sink lane (R2).
///
/// ```
/// use lanestream::{IndexName, MemoryStream, Request, SinkName, Stream};
/// let stream = MemoryStream::builder().sink("search").build().unwrap();
/// let sender = stream.requests().sender();
/// sender.publish(Request::Backfill {
///     sink: SinkName::new("search").unwrap(),
///     indexes: vec![IndexName::new("users").unwrap()],
/// }).unwrap();
/// let mut ingest = stream.requests().consumer();
/// let request = ingest.try_recv().unwrap();
/// // ... publish the snapshot batches and SnapshotComplete, then:
/// request.ack().unwrap();
/// ```
#[derive(Clone)]
pub struct RequestLane {
    shared: StdArc<RequestShared>,
}

impl RequestLane {
    /// A sender; clone it freely.
    pub fn sender(&self) -> RequestSender {
        RequestSender { shared: self.shared.clone() }
    }

    /// The ingest engine's consumer; asking again re-attaches, as for a sink lane (L8).
    pub fn consumer(&self) -> Consumer<Request> {
        Consumer::attach(self.shared.ring.clone())
    }

    /// Closes the request lane: senders get `Closed` (request handed back), the consumer drains
    /// what is queued or released, then receives `None`. Wakes every waiter.
    pub fn close(&self) {
        self.shared.ring.close();
    }

    /// The request lane's counters.
    pub fn stats(&self) -> LaneStats {
        self.shared.ring.stats()
    }
}

/// Publishes requests on the request lane; any number of senders, on any threads (R1).
#[derive(Clone)]
pub struct RequestSender {
    shared: StdArc<RequestShared>,
}

impl RequestSender {
    /// Publishes `request` if there is room now; never waits (it may briefly take the senders'
    /// lock, held only for a non-blocking step).
    ///
    /// # Errors
    /// Hands `request` back: [`PublishError::Full`] or [`PublishError::Closed`].
    pub fn try_publish(&self, request: Request) -> Result<(), PublishError<Request>> {
        let mut state = lock(&self.shared.producer);
        self.shared.ring.try_push(&mut state, request)
    }

    /// Publishes `request`, waiting while the lane is full.
    ///
    /// # Errors
    /// As [`try_publish`](RequestSender::try_publish), except never `Full`.
    pub fn publish(&self, request: Request) -> Result<(), PublishError<Request>> {
        self.publish_until(request, None)
    }

    /// Publishes `request`, waiting at most `timeout` for room.
    ///
    /// # Errors
    /// As [`publish`](RequestSender::publish), plus [`PublishError::Timeout`].
    pub fn publish_timeout(&self, request: Request, timeout: Duration) -> Result<(), PublishError<Request>> {
        self.publish_until(request, Some(Instant::now() + timeout))
    }

    fn publish_until(
        &self,
        request: Request,
        deadline: Option<Instant>,
    ) -> Result<(), PublishError<Request>> {
        self.shared.ring.publish_until(request, deadline, |request| self.try_publish(request))
    }

    /// Publishes `request`, waiting asynchronously while the lane is full; any executor.
    ///
    /// # Errors
    /// As [`publish`](RequestSender::publish).
    pub async fn publish_async(&self, request: Request) -> Result<(), PublishError<Request>> {
        let mut request = request;
        loop {
            match self.try_publish(request) {
                Err(PublishError::Full(back)) => request = back,
                done => return done,
            }
            RoomFuture { ring: &self.shared.ring, key: None }.await;
        }
    }
}

/// Waits until the request lane has room (or is closed).
struct RoomFuture<'a> {
    ring: &'a Ring<Request>,
    key: Option<u64>,
}

impl std::future::Future for RoomFuture<'_> {
    type Output = ();
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        let this = &mut *self;
        if this.ring.poll_writable(&mut this.key, cx.waker()) {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    }
}

impl Drop for RoomFuture<'_> {
    fn drop(&mut self) {
        self.ring.room.cancel(&mut self.key);
    }
}
