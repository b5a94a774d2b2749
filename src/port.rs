//! The port: what an ingest engine and its sink engines need from a stream, whatever backs it.
//!
//! A backend supplies its own lane ends as associated types, so the in-memory hot path is
//! statically dispatched (no boxing, no virtual calls) and another backend (a broker, say) can
//! bring ends of its own. Every end offers the same method families on every backend:
//!
//! | family | blocking | never blocks | bounded wait | async |
//! |---|---|---|---|---|
//! | publish (the fan-out) | `publish`, `publish_run`, `publish_to` | `try_publish`, `try_publish_run`, `try_publish_to` | `publish_timeout`, `publish_deadline` | `publish_async` |
//! | receive | `recv` | `try_recv` | `recv_timeout`, `recv_deadline` | `recv_async` |
//! | receive a run ([`LaneRun`]) | `recv_run` | `try_recv_run` | `recv_run_timeout`, `recv_run_deadline` | — |
//! | watermark | `wait_watermark(p, None)` | `watermark` | `wait_watermark(p, Some(deadline))` | `wait_watermark_async` |
//!
//! A backend implements a few primitives per end: the form that never waits (`try_`), the
//! deadline form (`deadline: Option<Instant>`, `None` waiting for as long as it takes), the
//! async form, and the run pair. Every other form is a provided method over them, the same on
//! every backend (as crossbeam-channel's `send` and `send_timeout` over one
//! `send(msg, Option<deadline>)`): `publish` is `publish_deadline(item, None)`,
//! `publish_timeout(item, t)` is `publish_deadline(item, Some(now + t))`, `recv` is
//! `recv_deadline(None)`, and so on. On a concrete end these are statically dispatched.
//!
//! Attaching a consumer comes in two forms: [`Stream::attach`] refuses while another consumer
//! of the lane is attached ([`StreamError::ConsumerAttached`]); [`Stream::reattach`] detaches it
//! and takes its unacked deliveries over ([L8](crate::contract#l8)).

use std::future::Future;
use std::time::{Duration, Instant};

use crate::error::{
    AckError, BuildError, PublishError, RecvError, RecvTimeoutError, StreamError, TryRecvError,
};
use crate::item::{Item, LaneItem, Request};
use crate::lane::limits::check_capacity;
use crate::lane::stats::LaneStats;
use crate::name::SinkName;
use crate::position::Position;

/// The stream port: one publisher into the lanes, the lanes to the sinks, the request lane
/// back, and the watermark.
///
/// Implemented by [`MemoryStream`](crate::MemoryStream) (and `RedisStream` with the `redis`
/// feature). Code written against `S: Stream` runs on any backend; see [the
/// contract](crate::contract) for the rules every backend keeps.
///
/// ```
/// use lanestream::{Batch, LaneConsumer, LaneDelivery, LaneItem, MemoryStream, Position, Stream, StreamFanout};
///
/// fn one_round<S: Stream>(stream: &S) -> Option<Position> {
///     let mut fanout = stream.fanout().unwrap();
///     let mut consumer = stream.attach("search").unwrap();
///     fanout.publish(LaneItem::Batch(Batch::new(Some(Position(9)), Vec::new().into()))).unwrap();
///     consumer.try_recv().unwrap().ack().unwrap();
///     stream.wait_watermark(Position(9), None)
/// }
/// let stream = MemoryStream::builder().sink("search").build().unwrap();
/// assert_eq!(one_round(&stream), Some(Position(9)));
/// ```
pub trait Stream: Send + Sync {
    /// The stream's one publisher: every lane at once, or one lane ([L9](crate::contract#l9)).
    type Fanout: StreamFanout;
    /// The receiving end of one sink lane.
    type Consumer: LaneConsumer<LaneItem>;
    /// A publisher of requests (any number, on any threads: [R1](crate::contract#r1)).
    type RequestSender: RequestPublisher;
    /// The ingest engine's receiving end of the request lane.
    type RequestConsumer: LaneConsumer<Request>;

    /// The sinks, in build order (fixed at build: [L1](crate::contract#l1)).
    fn sinks(&self) -> &[SinkName];

    /// The stream's one publisher ([L9](crate::contract#l9)): writes each item once and
    /// publishes it to every lane. Dropping it (or its process dying, on a broker) lets a
    /// restarted ingest engine take the stream at once, publishing after what was published.
    ///
    /// # Errors
    /// [`StreamError::ProducerBusy`] (naming the first lane) while another fan-out of the stream
    /// is alive.
    fn fanout(&self) -> Result<Self::Fanout, StreamError>;

    /// A consumer of `sink`'s lane, refusing while another consumer of it is attached.
    ///
    /// # Errors
    /// [`StreamError::UnknownLane`]; [`StreamError::ConsumerAttached`] while another consumer of
    /// the lane is alive (use [`reattach`](Stream::reattach) to take the lane over).
    fn attach(&self, sink: &str) -> Result<Self::Consumer, StreamError>;

    /// A consumer of `sink`'s lane that detaches whoever is attached ([L8](crate::contract#l8)):
    /// the previous consumer's receives return `Detached` from then on and every unacked item is
    /// redelivered to the new one, in order. For a restarted sink engine.
    ///
    /// # Errors
    /// [`StreamError::UnknownLane`].
    fn reattach(&self, sink: &str) -> Result<Self::Consumer, StreamError>;

    /// Closes `sink`'s lane from outside the publisher (a supervisor shutting down while the
    /// publisher waits): the lane's consumer drains, then ends, and the fan-out publishes to no
    /// lane from then on ([L10](crate::contract#l10)).
    ///
    /// # Errors
    /// [`StreamError::UnknownLane`].
    fn close(&self, sink: &str) -> Result<(), StreamError>;

    /// `sink`'s acked position ([L5](crate::contract#l5)).
    ///
    /// # Errors
    /// [`StreamError::UnknownLane`].
    fn acked(&self, sink: &str) -> Result<Option<Position>, StreamError>;

    /// `sink`'s lane counters: queued, released, in flight, pinned, published, acked...
    /// `stats.acked_items == stats.published` says the lane is idle ([W5](crate::contract#w5)).
    ///
    /// # Errors
    /// [`StreamError::UnknownLane`].
    fn stats(&self, sink: &str) -> Result<LaneStats, StreamError>;

    /// The request lane's counters.
    fn request_stats(&self) -> LaneStats;

    /// A sender on the request lane; clone it freely.
    fn request_sender(&self) -> Self::RequestSender;

    /// The ingest engine's consumer of the request lane, refusing while another is attached.
    ///
    /// # Errors
    /// [`StreamError::RequestConsumerAttached`] while another request consumer is alive.
    fn attach_requests(&self) -> Result<Self::RequestConsumer, StreamError>;

    /// The ingest engine's consumer of the request lane, detaching whoever is attached (a
    /// restarted ingest engine: [R2](crate::contract#r2)).
    fn reattach_requests(&self) -> Self::RequestConsumer;

    /// Closes the request lane: senders get `Closed`, the consumer drains, then ends.
    fn close_requests(&self);

    /// The minimum acked position over all lanes ([W1](crate::contract#w1)): `None` until every
    /// lane has acked a positioned batch, and for a stream with no lanes. Never decreases as seen
    /// from one thread ([W3](crate::contract#w3)).
    fn watermark(&self) -> Option<Position>;

    /// Waits until the watermark is at least `at_least` ([W6](crate::contract#w6)), `deadline`
    /// passes (`None`: no deadline), or the watermark can no longer move (the stream closed and
    /// every lane idle; or no lanes); returns the watermark read last, which the caller compares
    /// with `at_least`. Spins briefly, then parks; an ack that moves the watermark always wakes
    /// it. For a source confirming as soon as the sinks have acked, instead of sleep-polling
    /// [`watermark`](Stream::watermark).
    fn wait_watermark(&self, at_least: Position, deadline: Option<Instant>) -> Option<Position>;

    /// The async form of [`wait_watermark`](Stream::wait_watermark), without a deadline (wrap
    /// it in the executor's timeout); any executor.
    fn wait_watermark_async(&self, at_least: Position) -> impl Future<Output = Option<Position>> + Send + '_;

    /// Whether every lane and the request lane have nothing queued, released, or
    /// delivered-but-unacked ([W5](crate::contract#w5)).
    fn is_idle(&self) -> bool;
}

/// The publishing end of a stream ([`Stream::fanout`]): every lane at once, or one lane
/// ([`publish_to`](StreamFanout::publish_to)). **Runs are the fast path**; the per-item forms
/// are the run of one.
///
/// An item goes to every lane or to none. Every error hands the item back (for runs, the items
/// not published stay in the caller's `Vec`, and the error carries how many were); nothing of
/// it was enqueued. Every form returns [`PublishError`], with the variants its table lists.
///
/// A backend implements the primitives (`lanes`, `try_publish`, `publish_deadline`,
/// `publish_async`, the run pair, the one-lane pair, `close`); `publish` and `publish_timeout`
/// are provided over `publish_deadline`.
pub trait StreamFanout: Send {
    /// How many lanes it publishes to.
    fn lanes(&self) -> usize;

    /// Publishes `item` to every lane if there is room now; never waits.
    ///
    /// # Errors
    /// [`PublishError`]: `Full` (some lane has `capacity` unacked items, or the memory budget is
    /// spent), `Closed`, `PositionRegressed`, `InvalidPosition`, `Backend`.
    fn try_publish(&mut self, item: LaneItem) -> Result<(), PublishError<LaneItem>>;

    /// Publishes `item` to every lane, waiting while some lane is full ([L3](crate::contract#l3))
    /// until `deadline` at most (`None`: for as long as it takes).
    ///
    /// # Errors
    /// [`PublishError`]: `Timeout` (only with a deadline: it passed while a lane stayed full),
    /// `Closed`, `PositionRegressed`, `InvalidPosition`, `Backend`. Never `Full`.
    fn publish_deadline(
        &mut self,
        item: LaneItem,
        deadline: Option<Instant>,
    ) -> Result<(), PublishError<LaneItem>>;

    /// Publishes `item` to every lane, waiting while some lane is full ([L3](crate::contract#l3)):
    /// [`publish_deadline`](StreamFanout::publish_deadline) without a deadline.
    ///
    /// # Errors
    /// [`PublishError`]: `Closed`, `PositionRegressed`, `InvalidPosition`, `Backend`.
    #[inline]
    fn publish(&mut self, item: LaneItem) -> Result<(), PublishError<LaneItem>> {
        self.publish_deadline(item, None)
    }

    /// Publishes `item` to every lane, waiting `timeout` at most:
    /// [`publish_deadline`](StreamFanout::publish_deadline) with the deadline `now + timeout`.
    ///
    /// # Errors
    /// As [`publish_deadline`](StreamFanout::publish_deadline) with a deadline.
    fn publish_timeout(&mut self, item: LaneItem, timeout: Duration) -> Result<(), PublishError<LaneItem>> {
        self.publish_deadline(item, Some(Instant::now() + timeout))
    }

    /// Publishes `item` to every lane, waiting asynchronously while some lane is full; any
    /// executor. Dropping the future drops the item it holds.
    ///
    /// # Errors
    /// As [`publish`](StreamFanout::publish).
    fn publish_async(
        &mut self,
        item: LaneItem,
    ) -> impl Future<Output = Result<(), PublishError<LaneItem>>> + Send + '_;

    /// Publishes the longest prefix of `items` that can go now, in one step, moving it out of
    /// the front of `items` (which keeps the rest, in order, and its capacity); its length
    /// (>= 1; 0 for no items). Never waits.
    ///
    /// # Errors
    /// When not even the first item can go: as [`try_publish`](StreamFanout::try_publish),
    /// carrying 0 (how many were published); `items` is handed back untouched, the refused
    /// item first.
    fn try_publish_run(&mut self, items: &mut Vec<LaneItem>) -> Result<usize, PublishError<usize>>;

    /// Publishes every item of `items`, in order, waiting for room, moving them out of `items`
    /// as they go: empty on `Ok`.
    ///
    /// # Errors
    /// As [`publish`](StreamFanout::publish), carrying how many items were published (they
    /// reached every lane); `items` holds exactly the rest (none reached any lane), the refused
    /// one first.
    fn publish_run(&mut self, items: &mut Vec<LaneItem>) -> Result<(), PublishError<usize>>;

    /// Publishes `item` to lane `lane` only (its index in [`Stream::sinks`] order), waiting for
    /// room: a reply for one sink, such as a [backfill](crate::Request::Backfill)'s batches.
    /// Every other lane skips it.
    ///
    /// # Errors
    /// As [`publish`](StreamFanout::publish).
    ///
    /// # Panics
    /// If `lane` is not below [`lanes`](StreamFanout::lanes).
    fn publish_to(&mut self, lane: usize, item: LaneItem) -> Result<(), PublishError<LaneItem>>;

    /// As [`publish_to`](StreamFanout::publish_to), never waiting.
    ///
    /// # Errors
    /// As [`try_publish`](StreamFanout::try_publish).
    ///
    /// # Panics
    /// If `lane` is not below [`lanes`](StreamFanout::lanes).
    fn try_publish_to(&mut self, lane: usize, item: LaneItem) -> Result<(), PublishError<LaneItem>>;

    /// Closes every lane ([L10](crate::contract#l10)); idempotent.
    fn close(&self);
}

/// The receiving end of a lane carrying `T`.
///
/// A backend implements the primitives (`try_recv`, `recv_deadline`, `recv_async`, the run
/// pair `try_recv_run` and `recv_run_deadline`, and the two hints); `recv`, `recv_timeout`,
/// `recv_run` and `recv_run_timeout` are provided over the deadline forms.
pub trait LaneConsumer<T>: Send {
    /// One received item and the right to ack or nack it.
    type Delivery: LaneDelivery<T>;
    /// A run of items received in one step, acked or released together.
    type Run: LaneRun<T>;

    /// Receives the next item if one is queued or released; never blocks ([L12](crate::contract#l12)).
    ///
    /// # Errors
    /// [`TryRecvError`]: `Empty`, `Closed` (closed and drained), `Detached`, `Backend`.
    fn try_recv(&mut self) -> Result<Self::Delivery, TryRecvError>;

    /// Receives the next item, waiting while the lane is empty until `deadline` at most
    /// (`None`: for as long as it takes); `Ok(None)` once it is closed and drained
    /// ([L10](crate::contract#l10)).
    ///
    /// # Errors
    /// [`RecvTimeoutError`]: `Timeout` (only with a deadline; nothing changed), `Detached` (a
    /// newer consumer took the lane, including while waiting), `Backend`.
    fn recv_deadline(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<Option<Self::Delivery>, RecvTimeoutError>;

    /// Receives the next item, waiting while the lane is empty:
    /// [`recv_deadline`](LaneConsumer::recv_deadline) without a deadline. `Ok(None)` once the
    /// lane is closed and drained ([L10](crate::contract#l10)).
    ///
    /// # Errors
    /// [`RecvError`]: `Detached`, `Backend`.
    #[inline]
    fn recv(&mut self) -> Result<Option<Self::Delivery>, RecvError> {
        self.recv_deadline(None).map_err(RecvTimeoutError::untimed)
    }

    /// As [`recv`](LaneConsumer::recv), waiting `timeout` at most.
    ///
    /// # Errors
    /// As [`recv_deadline`](LaneConsumer::recv_deadline) with a deadline.
    fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<Self::Delivery>, RecvTimeoutError> {
        self.recv_deadline(Some(Instant::now() + timeout))
    }

    /// As [`recv`](LaneConsumer::recv), waiting asynchronously; any executor.
    ///
    /// # Errors
    /// As [`recv`](LaneConsumer::recv).
    fn recv_async(&mut self) -> impl Future<Output = Result<Option<Self::Delivery>, RecvError>> + Send + '_;

    /// The caught-up hint ([L11](crate::contract#l11)).
    fn is_empty(&self) -> bool;

    /// Whether a newer consumer of the lane detached this one.
    fn is_detached(&self) -> bool;

    /// Receives a run of up to `max` items queued now, in lane order
    /// ([runs](crate::contract#runs)); never blocks ([L12](crate::contract#l12)). `max` is at
    /// least 1; a backend may deliver fewer than it allows (the memory backend at most
    /// [`MAX_RUN`](crate::MAX_RUN)).
    ///
    /// # Errors
    /// As [`try_recv`](LaneConsumer::try_recv), when not even one item is there.
    fn try_recv_run(&mut self, max: usize) -> Result<Self::Run, TryRecvError>;

    /// Receives a run (as [`try_recv_run`](LaneConsumer::try_recv_run)), waiting while the lane
    /// is empty until `deadline` at most (`None`: for as long as it takes); it returns as soon
    /// as one item is there, with what is queued then. `Ok(None)` once the lane is closed and
    /// drained ([L10](crate::contract#l10)).
    ///
    /// # Errors
    /// As [`recv_deadline`](LaneConsumer::recv_deadline).
    fn recv_run_deadline(
        &mut self,
        max: usize,
        deadline: Option<Instant>,
    ) -> Result<Option<Self::Run>, RecvTimeoutError>;

    /// Receives a run, waiting while the lane is empty:
    /// [`recv_run_deadline`](LaneConsumer::recv_run_deadline) without a deadline.
    ///
    /// # Errors
    /// As [`recv`](LaneConsumer::recv).
    #[inline]
    fn recv_run(&mut self, max: usize) -> Result<Option<Self::Run>, RecvError> {
        self.recv_run_deadline(max, None).map_err(RecvTimeoutError::untimed)
    }

    /// As [`recv_run`](LaneConsumer::recv_run), waiting `timeout` at most.
    ///
    /// # Errors
    /// As [`recv_deadline`](LaneConsumer::recv_deadline) with a deadline.
    fn recv_run_timeout(
        &mut self,
        max: usize,
        timeout: Duration,
    ) -> Result<Option<Self::Run>, RecvTimeoutError> {
        self.recv_run_deadline(max, Some(Instant::now() + timeout))
    }
}

/// A run of deliveries received in one step ([`LaneConsumer::recv_run`] and its siblings):
/// consecutive items of one lane, acked or released together. Each item keeps the per-delivery
/// rules ([runs](crate::contract#runs)): acking the run acks every item (an item a re-attach
/// took back first is refused and redelivered, the others count); releasing it, or dropping it
/// un-acked, releases every item for redelivery before anything new
/// ([L6](crate::contract#l6)).
///
/// The memory backend's is [`Run`](crate::Run) (one step and one ack pass for the whole run);
/// a backend without a native form uses [`DeliveryRun`], its deliveries one by one.
pub trait LaneRun<T>: Send {
    /// How many items the run holds.
    fn len(&self) -> usize;

    /// Whether the run holds no item.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `i`-th item (0 is the first in lane order); `None` past the last.
    fn get(&self, i: usize) -> Option<&T>;

    /// How many of the run's items are redeliveries (attempt > 1). On the memory backend a
    /// redelivered item comes in a run of its own, so this is 0 or `len()`.
    fn redelivered(&self) -> usize;

    /// Acknowledges every item of the run ([L5](crate::contract#l5)).
    ///
    /// # Errors
    /// [`AckError::Detached`] if a re-attach took back some of the items first
    /// ([L8](crate::contract#l8)): those are redelivered to the new consumer; the others count.
    fn ack(self) -> Result<(), AckError>;

    /// Releases every item of the run for redelivery before any new item ([L6](crate::contract#l6)).
    fn nack(self);
}

/// The run of a backend that receives one item at a time (Redis): up to `max` deliveries taken
/// with the backend's own receive, acked (or released) one by one. Its constructors are the
/// [`LaneConsumer`] run methods of such a backend.
#[derive(Debug)]
pub struct DeliveryRun<D>(Vec<D>);

impl<D> DeliveryRun<D> {
    /// Takes what is queued now, up to `max` (at least 1) deliveries, with `try_recv`.
    ///
    /// # Errors
    /// `try_recv`'s, when not even one item is there.
    pub fn try_recv<T, C>(consumer: &mut C, max: usize) -> Result<Self, TryRecvError>
    where
        C: LaneConsumer<T, Delivery = D> + ?Sized,
        D: LaneDelivery<T>,
    {
        let first = consumer.try_recv()?;
        Ok(Self::fill(consumer, first, max))
    }

    /// Waits until `deadline` (`None`: for as long as it takes) for one delivery, then takes
    /// what is queued behind it, up to `max` (at least 1) in all.
    ///
    /// # Errors
    /// The waiting receive's; a blocking one (`deadline` `None`) never times out.
    pub fn recv_deadline<T, C>(
        consumer: &mut C,
        max: usize,
        deadline: Option<Instant>,
    ) -> Result<Option<Self>, RecvTimeoutError>
    where
        C: LaneConsumer<T, Delivery = D> + ?Sized,
        D: LaneDelivery<T>,
    {
        let first = consumer.recv_deadline(deadline)?;
        Ok(first.map(|first| Self::fill(consumer, first, max)))
    }

    fn fill<T, C>(consumer: &mut C, first: D, max: usize) -> Self
    where
        C: LaneConsumer<T, Delivery = D> + ?Sized,
        D: LaneDelivery<T>,
    {
        let mut run = vec![first];
        // Stops at the first miss: empty, closed, detached, or a broker's blip (the next
        // receive sees it again and says what it is).
        while run.len() < max {
            match consumer.try_recv() {
                Ok(d) => run.push(d),
                Err(_) => break,
            }
        }
        DeliveryRun(run)
    }
}

impl<T, D: LaneDelivery<T>> LaneRun<T> for DeliveryRun<D> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn get(&self, i: usize) -> Option<&T> {
        self.0.get(i).map(LaneDelivery::item)
    }

    fn redelivered(&self) -> usize {
        self.0.iter().filter(|d| d.attempt() > 1).count()
    }

    fn ack(self) -> Result<(), AckError> {
        // Every item is acked; the first refusal is the run's.
        let mut first_error = Ok(());
        for d in self.0 {
            if let Err(e) = d.ack() {
                if first_error.is_ok() {
                    first_error = Err(e);
                }
            }
        }
        first_error
    }

    fn nack(self) {
        for d in self.0 {
            d.nack();
        }
    }
}

/// One delivered item: read it, then ack or nack it. Dropping it un-acked nacks it
/// ([L6](crate::contract#l6)).
pub trait LaneDelivery<T>: Send {
    /// The delivered item.
    fn item(&self) -> &T;

    /// Which delivery of the item this is: 1 for the first.
    fn attempt(&self) -> u32;

    /// The item's position ([I1](crate::contract#i1)).
    fn position(&self) -> Option<Position>
    where
        T: Item,
    {
        self.item().position()
    }

    /// Acknowledges the item ([L5](crate::contract#l5)).
    ///
    /// # Errors
    /// [`AckError::Detached`] if a re-attach took the delivery back first ([L8](crate::contract#l8)).
    fn ack(self) -> Result<(), AckError>;

    /// Releases the item for redelivery before any new item ([L6](crate::contract#l6)).
    fn nack(self);
}

/// Publishes [`Request`]s on the request lane; any number, concurrently ([R1](crate::contract#r1)).
///
/// A backend implements `try_publish`, `publish_deadline` and `publish_async`; `publish` and
/// `publish_timeout` are provided over `publish_deadline`.
pub trait RequestPublisher: Clone + Send + Sync {
    /// Publishes `request` if there is room now; never waits.
    ///
    /// # Errors
    /// [`PublishError`]: `Full`, `Closed`, `Backend`; the request handed back.
    fn try_publish(&self, request: Request) -> Result<(), PublishError<Request>>;

    /// Publishes `request`, waiting while the lane is full until `deadline` at most (`None`:
    /// for as long as it takes).
    ///
    /// # Errors
    /// [`PublishError`]: `Timeout` (only with a deadline), `Closed`, `Backend`; the request
    /// handed back.
    fn publish_deadline(
        &self,
        request: Request,
        deadline: Option<Instant>,
    ) -> Result<(), PublishError<Request>>;

    /// Publishes `request`, waiting while the lane is full:
    /// [`publish_deadline`](RequestPublisher::publish_deadline) without a deadline.
    ///
    /// # Errors
    /// [`PublishError`]: `Closed`, `Backend`; the request handed back.
    fn publish(&self, request: Request) -> Result<(), PublishError<Request>> {
        self.publish_deadline(request, None)
    }

    /// Publishes `request`, waiting `timeout` at most.
    ///
    /// # Errors
    /// As [`publish_deadline`](RequestPublisher::publish_deadline) with a deadline.
    fn publish_timeout(&self, request: Request, timeout: Duration) -> Result<(), PublishError<Request>> {
        self.publish_deadline(request, Some(Instant::now() + timeout))
    }

    /// Publishes `request`, waiting asynchronously while the lane is full; any executor.
    ///
    /// # Errors
    /// As [`publish`](RequestPublisher::publish).
    fn publish_async(
        &self,
        request: Request,
    ) -> impl Future<Output = Result<(), PublishError<Request>>> + Send + '_;
}

/// Checks what every backend's builder is given ([L1](crate::contract#l1)): both capacities
/// (`1..=MAX_CAPACITY`) and the sink names (valid, none twice), in that order.
pub(crate) fn checked_shape(
    capacity: usize,
    request_capacity: usize,
    names: Vec<String>,
) -> Result<Vec<SinkName>, BuildError> {
    check_capacity(capacity, "sink lanes")?;
    check_capacity(request_capacity, "the request lane")?;
    let mut sinks: Vec<SinkName> = Vec::with_capacity(names.len());
    for name in names {
        let name = SinkName::new(name)?;
        if sinks.contains(&name) {
            return Err(BuildError::DuplicateSink(name));
        }
        sinks.push(name);
    }
    Ok(sinks)
}
