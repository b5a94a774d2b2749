//! [`LogSource`]: the log as the ingest engine of a [`MemoryStream`] — every append published
//! to every lane as one [`Batch`], backfills served from the log's index.
//!
//! The mapping, the restart rule and the backfill protocol are documented on [`LogSource`].

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Instant;

use lanestream::{
    Batch, Consumer, Delivery, Envelope, Fanout, IndexName, Lane, LaneItem, LaneStats, MemoryStream, Op,
    Position, PublishError, Request, SinkName, Stream, StreamError, TryRecvError,
};

use crate::sync::{self, Thread};

use super::error::ReadError;
use super::position::{LogPosition, PositionRange};
use super::query::Query;
use super::read::ReadHandle;
use super::snapshot::{Dir, Shared, View};

/// The default most envelopes per snapshot batch.
pub const DEFAULT_SNAPSHOT_BATCH: usize = 256;

/// Why a [`LogSource`] could not be built or could not go on.
///
/// A build error leaves nothing claimed. A publish error leaves the source usable: appends
/// already published stay published (each lane remembers its own progress), and the next
/// [`pump`](LogSource::pump) tries the rest again; the log still holds every event, so nothing
/// is lost.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The stream's fan-out or the request lane's consumer could not be had (another live
    /// fan-out or lane producer, another attached request consumer).
    #[error("claiming the stream's ends: {0}")]
    Stream(#[from] StreamError),
    /// The start position lies beyond the log's head: the stream was fed by another log (or by
    /// a longer-lived one).
    #[error("cannot start after position {after}: the log's head is {}", show(*head))]
    StartBeyondHead {
        /// The start asked for (or the stream's watermark).
        after: LogPosition,
        /// The log's head when the source was built.
        head: Option<LogPosition>,
    },
    /// The start position lies inside an append rather than at its end; a batch is a whole
    /// append, so a watermark is always an append's end. The stream was fed by another log.
    #[error("cannot start after position {after}: it lies inside the append {append}")]
    NotAnAppendEnd {
        /// The start asked for (or the stream's watermark).
        after: LogPosition,
        /// The append holding it.
        append: PositionRange,
    },
    /// A lane already holds a batch beyond the log's head: the stream was fed by another log.
    #[error("lane {sink} already holds position {last_published}, beyond the log's head {}", show(*head))]
    LaneAhead {
        /// The lane.
        sink: SinkName,
        /// Its last published position.
        last_published: Position,
        /// The log's head when the source was built.
        head: Option<LogPosition>,
    },
    /// A lane was closed (by [`LogSource::close`] or from elsewhere); nothing more can be
    /// published to it. The batch was not published there.
    #[error("lane {sink} is closed")]
    LaneClosed {
        /// The lane.
        sink: SinkName,
    },
    /// A lane refused a batch as not above its last position: something else published to it
    /// while the source did not hold its producer. The batch was not published there.
    #[error("lane {sink} refused position {position}: it already holds {last}")]
    PositionRegressed {
        /// The lane.
        sink: SinkName,
        /// The batch's position.
        position: Position,
        /// The lane's last position.
        last: Position,
    },
    /// Another request consumer took the request lane over (`reattach_requests`); this source
    /// no longer serves backfills. A request it was serving is redelivered to the new consumer.
    #[error("the request lane was taken over by another consumer")]
    RequestsDetached,
    /// The log's writer failed; every append published before the failure was published to
    /// the lanes.
    #[error("the log failed: {0}")]
    LogFailed(Arc<std::io::Error>),
    /// An append's events (or a backfill's) could not be read back from the log's segments;
    /// nothing of that batch was published, and the next pump tries it again.
    #[error(transparent)]
    Read(#[from] ReadError),
}

fn show(p: Option<LogPosition>) -> String {
    p.map_or_else(|| "empty".to_owned(), |p| p.to_string())
}

/// What a [`LogSource`] has done since it was built (counts, not positions).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SourceStats {
    /// Appends published to every lane (one batch each).
    pub appends: u64,
    /// Events in those appends.
    pub events: u64,
    /// Backfill requests answered (snapshot batches, `SnapshotComplete`, ack).
    pub backfills: u64,
    /// Snapshot batches published.
    pub snapshot_batches: u64,
    /// Envelopes in those snapshot batches.
    pub snapshot_rows: u64,
    /// Requests acked unanswered: they named a sink or an index the source does not know.
    pub refused: u64,
}

/// Builds a [`LogSource`]; from [`LogSource::builder`].
#[derive(Clone, Debug)]
pub struct LogSourceBuilder {
    log: ReadHandle,
    indexes: Vec<(IndexName, Query)>,
    after: Option<Option<LogPosition>>,
    snapshot_batch: usize,
    serve_requests: bool,
}

impl LogSourceBuilder {
    /// Adds the index `name`: the events matching `query`. Indexes are tried in the order
    /// added; an event matching several is in an envelope of each. Adding any index replaces
    /// the default (`events`, every event). A name given twice keeps the later query.
    pub fn index(mut self, name: IndexName, query: Query) -> Self {
        self.indexes.retain(|(n, _)| *n != name);
        self.indexes.push((name, query));
        self
    }

    /// Starts after `after` (`None`: from the log's first event) instead of after the stream's
    /// watermark. The position must be the end of an append (a watermark always is).
    pub fn after(mut self, after: Option<LogPosition>) -> Self {
        self.after = Some(after);
        self
    }

    /// The most envelopes per snapshot batch (at least 1; 0 is taken as 1). Default
    /// [`DEFAULT_SNAPSHOT_BATCH`].
    pub fn snapshot_batch(mut self, envelopes: usize) -> Self {
        self.snapshot_batch = envelopes.max(1);
        self
    }

    /// Whether the source consumes the request lane and serves backfills (default `true`).
    /// With `false` it leaves the request lane alone, for another engine to consume.
    pub fn serve_requests(mut self, serve: bool) -> Self {
        self.serve_requests = serve;
        self
    }

    /// Claims the stream's [`Fanout`](lanestream::Fanout) (its one publisher,
    /// [L9](lanestream::contract#l9)): each append is written once for every lane, and a
    /// backfill's batches go to the asking lane with
    /// [`publish_to`](lanestream::Fanout::publish_to); when serving requests, also attaches to
    /// the request lane. Checks the start position against the log and returns the source.
    /// Nothing is published yet.
    ///
    /// # Errors
    /// [`SourceError::Stream`] (another live fan-out or producer on a lane, another attached
    /// request consumer), [`SourceError::StartBeyondHead`], [`SourceError::NotAnAppendEnd`],
    /// [`SourceError::LaneAhead`]. Nothing stays claimed.
    pub fn build(self, stream: &MemoryStream) -> Result<LogSource, SourceError> {
        let shared = self.log.shared.clone();
        let head = shared.head();
        let after = match self.after {
            Some(after) => after,
            None => stream.watermark().and_then(|w| LogPosition::new(w.0)),
        };
        if let Some(a) = after {
            if a.get() > head {
                return Err(SourceError::StartBeyondHead { after: a, head: LogPosition::new(head) });
            }
            let (first, last) = shared.append_at(a.get(), head).expect("the head covers it");
            if last != a.get() {
                return Err(SourceError::NotAnAppendEnd {
                    after: a,
                    append: PositionRange::from_raw(first, last - first + 1),
                });
            }
        }
        let start = after.map_or(0, LogPosition::get);
        let mut lanes = Vec::with_capacity(stream.sinks().len());
        for lane in stream.lanes() {
            let stats: LaneStats = lane.stats();
            let held = stats.last_published.map_or(0, |p| p.0);
            if held > head {
                return Err(SourceError::LaneAhead {
                    sink: lane.name().clone(),
                    last_published: Position(held),
                    head: LogPosition::new(head),
                });
            }
            lanes.push(Feed { sink: lane.name().clone(), published: start.max(held) });
        }
        let out = Out { fanout: stream.fanout()?, lanes: stream.lanes().collect() };
        let requests = if self.serve_requests { Some(stream.requests().attach()?) } else { None };
        let indexes = if self.indexes.is_empty() {
            vec![(IndexName::new("events").expect("a valid name"), Query::All)]
        } else {
            self.indexes
        };
        Ok(LogSource {
            shared,
            lanes,
            out,
            requests,
            pending: None,
            indexes,
            after: start,
            snapshot_batch: self.snapshot_batch,
            signal_key: None,
            stats: SourceStats::default(),
        })
    }
}

/// One lane the source feeds.
struct Feed {
    sink: SinkName,
    /// Every append ending at or below this raw position is on the lane (published by this
    /// source or held from before it).
    published: u64,
}

/// How the source publishes: through the stream's fan-out (each batch written once for every
/// lane; a backfill's batches to one lane with `publish_to`).
struct Out {
    fanout: Fanout,
    /// The lanes (index = lane, as in the fan-out), to name the closed one in an error.
    lanes: Vec<Lane>,
}

/// What one [`pump`](LogSource::pump) did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pumped {
    /// Appends published (to every lane that did not hold them already).
    pub appends: u64,
    /// Backfill requests answered.
    pub backfills: u64,
    /// Requests acked unanswered (unknown sink or index).
    pub refused: u64,
}

impl Pumped {
    /// Whether the pump did nothing.
    pub fn is_empty(&self) -> bool {
        *self == Pumped::default()
    }
}

/// The log as the ingest engine of a [`MemoryStream`]; from [`LogSource::builder`].
///
/// # Mapping
/// - **One append, one batch.** The batch's position is the append's last position (as a stream
///   [`Position`], the same number), its `changes` the append's event count. Appends are published
///   in log order, so positions are strictly increasing on every lane ([L4](lanestream::contract#l4)),
///   and the stream's watermark is always the end of an append.
/// - **Indexes are named queries.** The source is built with a list of `(IndexName, Query)`
///   pairs (by default one index, `events`, of [`Query::All`]). An event becomes one
///   [`Envelope`] per index whose query matches it: `index` that index, `id` the event's own log
///   position in decimal (events are immutable, so an upsert by id is idempotent), `op`
///   [`Op::Upsert`], `position` the batch's position, `document` the event's payload (the same
///   `Bytes`, not a copy). An event no index matches is in no envelope; its append still gets its
///   batch, which carries its position ([I2](lanestream::contract#i2)). The event's type and tags are
///   not carried: give each type its own index when sinks need to tell them apart.
/// - **Backfill.** A [`Request::Backfill`] `{ sink, indexes }` is answered on that sink's lane
///   with snapshot batches (no position; envelopes without a position) holding every event of
///   each index up to the last append already published on that lane — read from the index, so
///   a selective index costs its matches, not the log — then `SnapshotComplete { indexes }`;
///   only then is the request acked ([R2](lanestream::contract#r2)). Live batches after that append
///   follow on the lane, so the snapshot and the live tail neither overlap nor leave a gap. A
///   request naming a sink or an index the source does not know is acked unanswered (it could
///   never be served) and counted in [`SourceStats::refused`]. The request's `after` is not
///   used: every index is answered from its first matching event (the sink applies the rows it
///   already had again, idempotently, [R2](lanestream::contract#r2)).
///
/// # Restart
/// The source starts after a position: by default the stream's watermark (everything up to it
/// was acked by every lane), or the one given to [`LogSourceBuilder::after`] (a durable sink's
/// checkpoint when the stream itself is new). On each lane it also skips the appends already
/// published there and still held by the lane ([`LaneStats::last_published`]), so a source
/// restarted over a live stream publishes nothing twice and loses nothing: what the lane held
/// is redelivered by the lane itself.
///
/// # Driving it
/// The source holds the stream's fan-out and the request lane's consumer; dropping it releases
/// them (a successor can be built at once, [L9](lanestream::contract#l9)) and leaves the lanes open.
///
/// Drive it with [`run`](LogSource::run) on a thread of its own (until the log closes), or call
/// [`pump`](LogSource::pump) and [`wait`](LogSource::wait) yourself. Publishing waits while a
/// lane is full (backpressure from the slowest sink); a backfill request waits meanwhile.
///
/// ```
/// use lanestream_log::{Event, EventLog, LogOptions, LogSource};
/// use lanestream::{LaneItem, MemoryStream, Position, Stream};
///
/// let log = EventLog::in_memory(LogOptions::default())?;
/// let stream = MemoryStream::builder().capacity(16).sinks(["projection"]).build()?;
/// let mut sink = stream.attach("projection")?;
/// let mut source = LogSource::builder(log.reader()).build(&stream)?;
///
/// log.append(vec![Event::untagged("Paid", &b"1"[..])?, Event::untagged("Paid", &b"2"[..])?], None)?;
/// source.pump()?; // one append, one batch
/// let delivery = sink.try_recv()?;
/// let LaneItem::Batch(batch) = delivery.item() else { unreachable!() };
/// assert_eq!(batch.position, Some(Position(2))); // the append's last position
/// assert_eq!(batch.envelopes.len(), 2);
/// assert_eq!(batch.envelopes[1].id, "2"); // the event's own position
/// assert_eq!(&batch.envelopes[1].document[..], b"2");
/// delivery.ack()?;
/// assert_eq!(stream.watermark(), Some(Position(2)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct LogSource {
    shared: Arc<Shared>,
    lanes: Vec<Feed>,
    out: Out,
    requests: Option<Consumer<Request>>,
    /// A request received while waiting, served by the next pump.
    pending: Option<Delivery<Request>>,
    indexes: Vec<(IndexName, Query)>,
    /// Every append ending at or below this raw position is on every lane.
    after: u64,
    snapshot_batch: usize,
    /// The waker key registered with the log's signal while waiting.
    signal_key: Option<u64>,
    stats: SourceStats,
}

impl LogSource {
    /// A builder over the log `log` (a [`WriteHandle::reader`](super::WriteHandle::reader)).
    pub fn builder(log: ReadHandle) -> LogSourceBuilder {
        LogSourceBuilder {
            log,
            indexes: Vec::new(),
            after: None,
            snapshot_batch: DEFAULT_SNAPSHOT_BATCH,
            serve_requests: true,
        }
    }

    /// Every append at or before this position is on every lane (`None`: nothing yet).
    pub fn position(&self) -> Option<LogPosition> {
        LogPosition::new(self.after)
    }

    /// What the source has done so far.
    pub fn stats(&self) -> &SourceStats {
        &self.stats
    }

    /// The indexes, in the order they are tried.
    pub fn indexes(&self) -> impl ExactSizeIterator<Item = (&IndexName, &Query)> + '_ {
        self.indexes.iter().map(|(n, q)| (n, q))
    }

    /// Serves the backfill requests waiting on the request lane, then publishes every append the
    /// log has published and the lanes do not hold yet, one batch each, to every lane. Waits only
    /// while a lane is full.
    ///
    /// # Errors
    /// [`SourceError::LaneClosed`], [`SourceError::PositionRegressed`] (the batch was not
    /// published to that lane; lanes before it in sink order have it, and the next pump resumes
    /// from each lane's own progress), [`SourceError::RequestsDetached`], [`SourceError::Read`].
    pub fn pump(&mut self) -> Result<Pumped, SourceError> {
        let mut done = Pumped::default();
        self.serve_requests(&mut done)?;
        let shared = self.shared.clone();
        let head = shared.head();
        // One look at the list of append ends for the whole pump (not a search per append):
        // entry `i` is where the `i + 1`-th append ends, and the cursor sits at an append's end.
        let ends = shared.appends.view();
        let mut i = ends.rank(self.after);
        while self.after < head {
            let (first, last) = (self.after + 1, ends.get(i));
            debug_assert!(last >= first && last <= head, "append ends cover every published position");
            i += 1;
            let batch = self.live_batch(first, last)?;
            let Out { fanout, lanes } = &mut self.out;
            if self.lanes.iter().all(|feed| feed.published < last) {
                // Every lane lacks it (always, once the source has published anything: lanes
                // diverge only in what they held before it started): written once for all.
                fanout.publish(batch).map_err(|e| publish_error(e, None, lanes, &self.lanes))?;
            } else {
                // Some lanes held it already (a restart over a live stream): the others only.
                for (i, feed) in self.lanes.iter().enumerate() {
                    if feed.published < last {
                        let sent = fanout.publish_to(i, batch.clone());
                        sent.map_err(|e| publish_error(e, Some(i), lanes, &self.lanes))?;
                    }
                }
            }
            self.lanes.iter_mut().for_each(|feed| feed.published = feed.published.max(last));
            self.after = last;
            self.stats.appends += 1;
            self.stats.events += last - first + 1;
            done.appends += 1;
        }
        Ok(done)
    }

    /// The batch of the append `first..=last`.
    fn live_batch(&self, first: u64, last: u64) -> Result<LaneItem, ReadError> {
        let position = Some(Position(last));
        let mut envelopes = Vec::with_capacity((last - first + 1) as usize);
        for p in first..=last {
            let stored = self.shared.events.at(p);
            // Read the payload only if some index takes the event.
            if !self.indexes.iter().any(|(_, query)| query.matches(stored)) {
                continue;
            }
            let event = &stored.load(p)?;
            for (index, query) in &self.indexes {
                if query.matches(event) {
                    envelopes.push(Envelope {
                        index: index.clone(),
                        id: p.to_string(),
                        op: Op::Upsert,
                        position,
                        document: event.data().clone(),
                        built_at_micros: None,
                    });
                }
            }
        }
        Ok(LaneItem::Batch(Batch {
            position,
            changes: last - first + 1,
            offset: 0,
            envelopes: Arc::from(envelopes),
        }))
    }

    fn serve_requests(&mut self, done: &mut Pumped) -> Result<(), SourceError> {
        loop {
            let delivery = match self.pending.take() {
                Some(d) => d,
                None => {
                    let Some(requests) = &mut self.requests else { return Ok(()) };
                    match requests.try_recv() {
                        Ok(d) => d,
                        Err(TryRecvError::Empty) => return Ok(()),
                        Err(TryRecvError::Closed) => {
                            self.requests = None;
                            return Ok(());
                        }
                        Err(TryRecvError::Detached) => {
                            self.requests = None;
                            return Err(SourceError::RequestsDetached);
                        }
                        Err(_) => return Ok(()),
                    }
                }
            };
            self.serve(delivery, done)?;
        }
    }

    /// Answers one request (or refuses it), then acks it.
    fn serve(&mut self, delivery: Delivery<Request>, done: &mut Pumped) -> Result<(), SourceError> {
        // `Request` is non-exhaustive: a kind this source does not know is refused like an
        // unknown sink.
        let (sink, indexes) = match delivery.item() {
            // `after` is not used: the snapshot is read from the index whole (a sink that
            // resumes gets its first rows again and applies them idempotently, R2).
            Request::Backfill { sink, indexes, .. } => (Some(sink.clone()), indexes.clone()),
            _ => (None, Vec::new()),
        };
        let lane = sink.and_then(|sink| self.lanes.iter().position(|f| f.sink == sink));
        let queries: Option<Vec<(IndexName, Query)>> =
            indexes.iter().map(|name| self.indexes.iter().find(|(n, _)| n == name).cloned()).collect();
        let (Some(lane), Some(queries)) = (lane, queries) else {
            // It names a sink or an index this source does not have (or is a kind of request it
            // does not serve): it can never be served, and left unacked it would come back for
            // ever.
            self.stats.refused += 1;
            done.refused += 1;
            return match delivery.ack() {
                Ok(()) => Ok(()),
                Err(_) => Err(SourceError::RequestsDetached),
            };
        };
        // The snapshot covers what is already on the lane; the live batches after it follow.
        let upto = self.lanes[lane].published;
        let view = self.view(upto);
        let mut rows = Vec::with_capacity(self.snapshot_batch);
        for (index, query) in &queries {
            let mut after = 0;
            loop {
                let (events, more) = view.collect(query, after, upto, Dir::Up, self.snapshot_batch)?;
                for e in &events {
                    rows.push(Envelope {
                        index: index.clone(),
                        id: e.position.to_string(),
                        op: Op::Upsert,
                        position: None,
                        document: e.event.data().clone(),
                        built_at_micros: None,
                    });
                    if rows.len() == self.snapshot_batch {
                        let chunk = std::mem::replace(&mut rows, Vec::with_capacity(self.snapshot_batch));
                        self.publish_snapshot(lane, chunk)?;
                    }
                }
                match events.last() {
                    Some(e) if more => after = e.position.get(),
                    _ => break,
                }
            }
        }
        if !rows.is_empty() {
            self.publish_snapshot(lane, rows)?;
        }
        self.publish_to(lane, LaneItem::SnapshotComplete { indexes })?;
        // Only now (R2): a crash before this redelivers the request.
        delivery.ack().map_err(|_| SourceError::RequestsDetached)?;
        self.stats.backfills += 1;
        done.backfills += 1;
        Ok(())
    }

    fn publish_snapshot(&mut self, lane: usize, rows: Vec<Envelope>) -> Result<(), SourceError> {
        let n = rows.len() as u64;
        self.publish_to(lane, LaneItem::Batch(Batch::new(None, Arc::from(rows))))?;
        self.stats.snapshot_batches += 1;
        self.stats.snapshot_rows += n;
        Ok(())
    }

    /// Publishes a backfill's `item` to lane `lane` only.
    fn publish_to(&mut self, lane: usize, item: LaneItem) -> Result<(), SourceError> {
        let Out { fanout, lanes } = &mut self.out;
        fanout.publish_to(lane, item).map_err(|e| publish_error(e, Some(lane), lanes, &self.lanes))
    }

    /// A view of the log up to `head` (at most the published head).
    fn view(&self, head: u64) -> OwnedView {
        OwnedView { snapshot: self.shared.snapshot.load_full(), shared: self.shared.clone(), head }
    }

    /// Blocks (parked, not spinning) until the log has an append the lanes lack, the log ended,
    /// or a request is waiting — or until `deadline`. Returns whether one of those holds
    /// (`false`: the deadline passed). Call [`pump`](LogSource::pump) after.
    pub fn wait(&mut self, deadline: Option<Instant>) -> bool {
        let waker = Waker::from(Arc::new(Unpark(sync::current())));
        let mut cx = Context::from_waker(&waker);
        let woke = loop {
            if self.pending.is_some() {
                break true;
            }
            let (shared, after) = (&self.shared, self.after);
            let ready = || shared.is_ended() || shared.head() > after;
            if shared.signal.poll(ready, &mut self.signal_key, &mut cx).is_ready() {
                break true;
            }
            if let Some(requests) = &mut self.requests {
                match requests.poll_recv(&mut cx) {
                    Poll::Ready(Ok(Some(d))) => {
                        self.pending = Some(d);
                        break true;
                    }
                    // Closed, or taken over: the next pump says which.
                    Poll::Ready(_) => break true,
                    Poll::Pending => {}
                }
            }
            // Both wakers are registered: a publish, an end or a request from here on unparks
            // this thread (an unpark before the park makes the park return at once).
            match deadline {
                None => sync::park(),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        break false;
                    }
                    sync::park_timeout(d - now);
                }
            }
        };
        self.shared.signal.cancel(&mut self.signal_key);
        woke
    }

    /// Pumps and waits until the log is closed and every append it published is on every lane,
    /// serving backfills meanwhile; returns what it did. The lanes stay open ([`close`](
    /// LogSource::close) them to end the sinks' loops).
    ///
    /// # Errors
    /// As [`pump`](LogSource::pump); [`SourceError::LogFailed`] once the log's writer failed
    /// and everything published before the failure is on the lanes.
    pub fn run(&mut self) -> Result<SourceStats, SourceError> {
        loop {
            // Read the end flags before pumping: the writer publishes its last snapshot before
            // it sets them, so a pump after seeing them publishes everything.
            let failure = self.shared.failure.get().cloned();
            let closed = self.shared.is_closed();
            self.pump()?;
            if let Some(cause) = failure {
                return Err(SourceError::LogFailed(cause));
            }
            if closed {
                return Ok(self.stats.clone());
            }
            self.wait(None);
        }
    }

    /// Closes every lane: each sink receives what is queued, then the end
    /// ([L10](lanestream::contract#l10)). The request lane is left as it is.
    pub fn close(&self) {
        self.out.fanout.close();
    }
}

/// A snapshot of the log kept alive for a backfill's reads.
struct OwnedView {
    snapshot: Arc<super::snapshot::Snapshot>,
    shared: Arc<Shared>,
    head: u64,
}

impl OwnedView {
    fn collect(
        &self,
        query: &Query,
        after: u64,
        upto: u64,
        dir: Dir,
        limit: usize,
    ) -> Result<(Vec<super::event::SequencedEvent>, bool), ReadError> {
        let view = View::published(
            self.head.min(self.snapshot.head),
            &self.snapshot.types,
            &self.snapshot.tags,
            &self.shared.events,
        );
        view.collect(query, after, upto, dir, limit)
    }
}

/// A fan-out's refusal as the source's error, for a publish to lane `to` (`None`: to every
/// lane): a regressed position names that lane (the first, for every lane), a close the closed
/// lane.
fn publish_error(
    e: PublishError<LaneItem>,
    to: Option<usize>,
    lanes: &[Lane],
    feeds: &[Feed],
) -> SourceError {
    let named = || feeds[to.unwrap_or(0)].sink.clone();
    match e {
        PublishError::PositionRegressed { position, last, .. } => {
            SourceError::PositionRegressed { sink: named(), position, last }
        }
        _ => SourceError::LaneClosed {
            sink: lanes
                .iter()
                .find(|lane| lane.stats().closed)
                .map_or_else(named, |lane| lane.name().clone()),
        },
    }
}

/// Wakes a parked thread (the source's own [`wait`](LogSource::wait)).
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

impl fmt::Debug for LogSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogSource")
            .field("after", &self.after)
            .field("sinks", &self.lanes.iter().map(|l| &l.sink).collect::<Vec<_>>())
            .field("indexes", &self.indexes)
            .field("serving_requests", &self.requests.is_some())
            .field("stats", &self.stats)
            .finish()
    }
}
