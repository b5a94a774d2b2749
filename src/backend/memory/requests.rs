//! The request lane: sink engines publish [`Request`]s, one ingest engine consumes them.

use std::fmt;
use std::sync::Arc as StdArc;
use std::time::Instant;

use crate::error::{PublishError, StreamError};
use crate::item::Request;
use crate::lane::AckedMark;
use crate::lane::{publish_until, Cells, Consumer, LaneStats, Publish, Publisher, Ring, Target};
use crate::port::RequestPublisher;
use crate::sync::{Arc, Mutex};

struct RequestShared {
    ring: Arc<Ring<Request>>,
    /// The lane's one publisher, shared by every [`RequestSender`]: each publish step takes
    /// this lock for its non-blocking part only; waiting for room happens outside it.
    publisher: Mutex<Publisher<Request>>,
}

/// The request lane: sink engines publish [`Request`]s with a [`RequestSender`] (any number,
/// concurrently: [R1](crate::contract#r1)), one ingest engine consumes them with the same
/// at-least-once ack/nack/redelivery/re-attach rules as a sink lane ([R2](crate::contract#r2)).
/// Its acked position counts for no watermark. Cheap to clone.
///
/// ```
/// use lanestream::prelude::*;
/// use lanestream::{IndexName, MemoryStream, Request, RequestPublisher, SinkName};
/// let stream = MemoryStream::builder().sink("search").build().unwrap();
/// let sender = stream.requests().sender();
/// sender.publish(Request::backfill(
///     SinkName::new("search").unwrap(),
///     vec![IndexName::new("users").unwrap()],
/// )).unwrap();
/// let mut ingest = stream.requests().attach().unwrap();
/// let request = ingest.try_recv().unwrap();
/// // ... publish the snapshot batches and SnapshotComplete, then:
/// request.ack().unwrap();
/// ```
#[derive(Clone)]
pub struct RequestLane {
    shared: StdArc<RequestShared>,
}

impl RequestLane {
    /// A request lane of `capacity` (already checked) slots.
    pub(crate) fn new(capacity: usize) -> RequestLane {
        let cells = Arc::new(Cells::new(capacity, None));
        let ring = Arc::new(Ring::new(cells.clone(), AckedMark::standalone()));
        let publisher =
            Publisher::claim(cells, Box::new([ring.clone()])).expect("a new lane has no publisher");
        RequestLane { shared: StdArc::new(RequestShared { ring, publisher: Mutex::new(publisher) }) }
    }

    /// A sender; clone it freely.
    pub fn sender(&self) -> RequestSender {
        RequestSender { shared: self.shared.clone() }
    }

    /// The ingest engine's consumer, refusing while another is alive.
    ///
    /// # Errors
    /// [`StreamError::RequestConsumerAttached`] while another consumer of the request lane is alive.
    pub fn attach(&self) -> Result<Consumer<Request>, StreamError> {
        Consumer::attach(self.shared.ring.clone(), false).ok_or(StreamError::RequestConsumerAttached)
    }

    /// The ingest engine's consumer, detaching whoever is attached; its unacked requests are
    /// redelivered to the new one ([L8](crate::contract#l8), [R2](crate::contract#r2)).
    pub fn reattach(&self) -> Consumer<Request> {
        Consumer::attach(self.shared.ring.clone(), true).expect("a re-attach never refuses")
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

    /// Whether nothing is queued, released, or delivered-but-unacked.
    pub fn is_idle(&self) -> bool {
        self.shared.ring.is_idle()
    }
}

impl fmt::Debug for RequestLane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestLane").field("stats", &self.stats()).finish()
    }
}

/// Publishes requests on the request lane; any number of senders, on any threads
/// ([R1](crate::contract#r1)). Cheap to clone. Its surface is the port's [`RequestPublisher`].
#[derive(Clone)]
pub struct RequestSender {
    shared: StdArc<RequestShared>,
}

impl RequestSender {
    /// The shared publisher, stepped under its lock, waited for outside it.
    fn target(&self) -> Target<'_, Request> {
        Target::Shared(&self.shared.publisher, &self.shared.ring)
    }
}

impl fmt::Debug for RequestSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestSender").field("closed", &self.shared.ring.is_closed()).finish()
    }
}

/// The memory backend's request sender: `publish` and `publish_timeout` are the port's, over
/// `publish_deadline`.
impl RequestPublisher for RequestSender {
    /// Publishes `request` if there is room now; never waits (it may briefly take the senders'
    /// lock, held only for a non-blocking step).
    ///
    /// # Errors
    /// Hands `request` back: [`PublishError::Full`] or [`PublishError::Closed`].
    fn try_publish(&self, request: Request) -> Result<(), PublishError<Request>> {
        self.target().step(request).map_err(|(request, refusal)| refusal.error(request))
    }

    /// Publishes `request`, waiting while the lane is full, until `deadline` at most (`None`: for
    /// as long as it takes).
    ///
    /// # Errors
    /// [`PublishError::Timeout`] (with a deadline) or [`PublishError::Closed`], request handed
    /// back.
    fn publish_deadline(
        &self,
        request: Request,
        deadline: Option<Instant>,
    ) -> Result<(), PublishError<Request>> {
        publish_until(&mut self.target(), request, deadline)
    }

    /// Publishes `request`, waiting asynchronously while the lane is full; any executor. The
    /// future is a [`Publish`], named here so that it can be stored.
    ///
    /// # Errors
    /// [`PublishError::Closed`], request handed back.
    #[allow(refining_impl_trait)]
    fn publish_async(&self, request: Request) -> Publish<'_, Request> {
        Publish::shared(&self.shared.publisher, &self.shared.ring, request)
    }
}
