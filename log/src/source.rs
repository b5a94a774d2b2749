//! [`LogSource`]: the log as a [`Source`] of the pipeline driver
//! ([`lanestream::pipeline::Pipeline`]) — every append handed over as one [`Batch`] for every
//! lane, backfills served from the log's index — over any stream backend.
//!
//! The mapping, the restart rule and the backfill protocol are documented on [`LogSource`].

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lanestream::pipeline::{SinkStart, Source, SourceItem, SourceStart};
use lanestream::{
    Batch, Envelope, IndexName, LaneItem, Op, Position, Request, SinkName, Stream, StreamError,
};

use super::error::ReadError;
use super::position::{LogPosition, PositionRange};
use super::query::Query;
use super::read::ReadHandle;
use super::snapshot::{Dir, Shared, View};

/// The default most envelopes per snapshot batch.
pub const DEFAULT_SNAPSHOT_BATCH: usize = 256;

/// Why a [`LogSource`] could not be built or could not go on.
///
/// A build error claims nothing (the source claims nothing at all: the driver holds the
/// stream's ends). An error while running stops the driver ([`PipelineError::Source`](
/// lanestream::pipeline::PipelineError::Source)) with the lanes left open: the log still holds
/// every event, so a source built again resumes from the stream's watermark and loses nothing.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The stream's lane counters could not be read at build ([`Stream::stats`]: an unknown
    /// lane, or a broker's error past its retry budget).
    #[error("reading the stream's lanes: {0}")]
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
    /// A request of a kind this source does not serve (`Request` is non-exhaustive); the
    /// driver stops with it, the request unacked.
    #[error("a request the log source does not serve: {0:?}")]
    UnknownRequest(Request),
    /// The log's writer failed; every append published before the failure was handed over.
    #[error("the log failed: {0}")]
    LogFailed(Arc<std::io::Error>),
    /// An append's events (or a backfill's) could not be read back from the log's segments;
    /// nothing of that batch was handed over (the driver stops; a source built again tries it
    /// again).
    #[error(transparent)]
    Read(#[from] ReadError),
}

fn show(p: Option<LogPosition>) -> String {
    p.map_or_else(|| "empty".to_owned(), |p| p.to_string())
}

/// What a [`LogSource`] has handed to the driver since it was built (counts, not positions).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SourceStats {
    /// Appends handed over (one batch each; the driver publishes each to the lanes that lack
    /// it, see [`PipelineReport::skipped`](lanestream::pipeline::PipelineReport::skipped)).
    pub appends: u64,
    /// Events in those appends.
    pub events: u64,
    /// Backfill requests answered (snapshot batches, then `SnapshotComplete`: the driver acks
    /// the request once it published that).
    pub backfills: u64,
    /// Snapshot batches handed over.
    pub snapshot_batches: u64,
    /// Envelopes in those snapshot batches.
    pub snapshot_rows: u64,
    /// Backfill requests naming an index this source does not define: answered with no rows
    /// (the log has no event of it), their `SnapshotComplete` alone.
    pub refused: u64,
}

/// Builds a [`LogSource`]; from [`LogSource::builder`].
#[derive(Clone, Debug)]
pub struct LogSourceBuilder {
    log: ReadHandle,
    indexes: Vec<(IndexName, Query)>,
    after: Option<Option<LogPosition>>,
    snapshot_batch: usize,
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

    /// Checks the start position against the log and the stream `stream` feeds (any backend),
    /// and returns the source. It claims nothing: run it with the pipeline driver
    /// ([`Pipeline::run`](lanestream::pipeline::Pipeline::run)) over the same stream, which
    /// claims the stream's fan-out and its request lane.
    ///
    /// # Errors
    /// [`SourceError::StartBeyondHead`], [`SourceError::NotAnAppendEnd`] (a start that is not
    /// an append's end of this log), [`SourceError::LaneAhead`] (a lane holding a position the
    /// log does not have), [`SourceError::Stream`] (the lanes' counters could not be read).
    pub fn build<St: Stream>(self, stream: &St) -> Result<LogSource, SourceError> {
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
        for sink in stream.sinks() {
            if let Some(held) = stream.stats(sink.as_str())?.last_published {
                if held.0 > head {
                    return Err(SourceError::LaneAhead {
                        sink: sink.clone(),
                        last_published: held,
                        head: LogPosition::new(head),
                    });
                }
            }
        }
        let indexes = if self.indexes.is_empty() {
            vec![(IndexName::new("events").expect("a valid name"), Query::All)]
        } else {
            self.indexes
        };
        Ok(LogSource {
            shared,
            indexes,
            after: after.map_or(0, LogPosition::get),
            snapshot_batch: self.snapshot_batch,
            backfills: VecDeque::new(),
            ends: VecDeque::new(),
            stats: SourceStats::default(),
        })
    }
}

/// A backfill being served: its indexes in order, the next row after `cursor` of index `next`.
struct Backfill {
    sink: SinkName,
    /// The indexes asked for, as asked: its `SnapshotComplete`'s.
    indexes: Vec<IndexName>,
    /// The ones this source defines, with their queries.
    queries: Vec<(IndexName, Query)>,
    next: usize,
    cursor: u64,
    /// The log as it was when the request came (the appends handed over up to then).
    view: OwnedView,
}

/// The log as a [`Source`] of the pipeline driver ([`Pipeline`](lanestream::pipeline::Pipeline));
/// from [`LogSource::builder`].
///
/// # Mapping
/// - **One append, one batch.** The batch's position is the append's last position (as a stream
///   [`Position`], the same number), its `changes` the append's event count. Appends are handed
///   over in log order, so positions are strictly increasing on every lane
///   ([L4](lanestream::contract#l4)), and the stream's watermark is always the end of an append.
/// - **Indexes are named queries.** The source is built with a list of `(IndexName, Query)`
///   pairs (by default one index, `events`, of [`Query::All`]). An event becomes one
///   [`Envelope`] per index whose query matches it: `index` that index, `id` the event's own log
///   position in decimal (events are immutable, so an upsert by id is idempotent), `op`
///   [`Op::Upsert`], `position` the batch's position, `document` the event's payload (the same
///   `Bytes`, not a copy). An event no index matches is in no envelope; its append still gets its
///   batch, which carries its position ([I2](lanestream::contract#i2)). The event's type and tags are
///   not carried: give each type its own index when sinks need to tell them apart.
/// - **Backfill.** The driver hands each [`Request::Backfill`] `{ sink, indexes }` of the
///   request lane to [`Source::backfill`]; the source answers on that sink's lane with snapshot
///   batches (no position; envelopes without a position) holding every event of each index up
///   to the last append handed over — read from the index, so a selective index costs its
///   matches, not the log — then `SnapshotComplete { indexes }`, after which the driver acks
///   the request ([R2](lanestream::contract#r2)). Live batches after that append follow on the
///   lane, so the snapshot and the live tail leave no gap (a lane may hold appends past it from
///   before a restart: their rows come twice, an idempotent upsert of an immutable event). An
///   index the source does not define has no event: it is answered with its `SnapshotComplete`
///   alone (counted in [`SourceStats::refused`]); a request for a sink the stream has no lane
///   for is acked unanswered by the driver. The request's `after` is not used: every index is
///   answered from its first matching event (the sink applies the rows it already had again,
///   idempotently, [R2](lanestream::contract#r2)). Snapshot batches are handed over before the
///   next live append.
///
/// # Restart
/// The source starts after a position: by default the stream's watermark when it is built
/// (everything up to it was acked by every lane), or the one given to
/// [`LogSourceBuilder::after`] (a durable sink's checkpoint when the stream itself is new). The
/// driver publishes each append only to the lanes that do not hold it already
/// ([`Pipeline::run`](lanestream::pipeline::Pipeline::run), "Resuming"), so a source restarted
/// over a live stream publishes nothing twice and loses nothing: what a lane held is
/// redelivered by the lane itself.
///
/// # Driving it
/// [`Pipeline::run`](lanestream::pipeline::Pipeline::run) on a thread of its own, over the
/// stream the source was built for (in-process [`MemoryStream`](lanestream::MemoryStream), or a
/// broker's: a `RedisStream` feeds sinks in other processes): it claims the stream's fan-out and
/// request lane, publishes, serves backfills, confirms at the watermark (the log keeps every
/// event: a confirm only records), and at the log's close ([`SourceItem::End`], once every
/// append is handed over) waits for the sinks' acks and closes the lanes. A failed log stops
/// it with [`SourceError::LogFailed`] after every append published before the failure.
/// Publishing waits while a lane is full (backpressure from the slowest sink).
///
/// ```
/// use lanestream::prelude::*;
/// use lanestream_log::{Event, EventLog, LogOptions, LogSource};
/// use lanestream::pipeline::Pipeline;
/// use lanestream::{LaneItem, MemoryStream, Position, Stream};
///
/// let log = EventLog::in_memory(LogOptions::default())?;
/// let stream = MemoryStream::builder().capacity(16).sinks(["projection"]).build()?;
/// let mut sink = stream.attach("projection")?;
/// let mut source = LogSource::builder(log.reader()).build(&stream)?;
/// log.append(vec![Event::untagged("Paid", &b"1"[..])?, Event::untagged("Paid", &b"2"[..])?], None)?;
/// log.close(); // the source's end: the driver hands over what the log holds, then ends
///
/// let ingest = std::thread::spawn({
///     let stream = stream.clone();
///     move || Pipeline::new(stream).run(&mut source)
/// });
/// let delivery = sink.recv()?.expect("one batch");
/// let LaneItem::Batch(batch) = delivery.item() else { unreachable!() };
/// assert_eq!(batch.position, Some(Position(2))); // the append's last position
/// assert_eq!(batch.envelopes.len(), 2);
/// assert_eq!(batch.envelopes[1].id, "2"); // the event's own position
/// assert_eq!(&batch.envelopes[1].document[..], b"2");
/// delivery.ack()?;
/// let report = ingest.join().unwrap()?; // acked: confirmed, the lanes closed
/// assert_eq!(report.confirmed, Some(Position(2)));
/// assert!(sink.recv()?.is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct LogSource {
    shared: Arc<Shared>,
    indexes: Vec<(IndexName, Query)>,
    /// Every append ending at or below this raw position was handed over.
    after: u64,
    snapshot_batch: usize,
    /// The backfills being served, in the order they were asked.
    backfills: VecDeque<Backfill>,
    /// The ends of the next appends, read ahead (at most [`READ_AHEAD`]).
    ends: VecDeque<u64>,
    stats: SourceStats,
}

/// How many append ends [`LogSource`] reads from the log's list at one look.
const READ_AHEAD: usize = 256;

impl LogSource {
    /// A builder over the log `log` (a [`WriteHandle::reader`](super::WriteHandle::reader)).
    pub fn builder(log: ReadHandle) -> LogSourceBuilder {
        LogSourceBuilder { log, indexes: Vec::new(), after: None, snapshot_batch: DEFAULT_SNAPSHOT_BATCH }
    }

    /// Every append at or before this position was handed over (`None`: nothing yet).
    pub fn position(&self) -> Option<LogPosition> {
        LogPosition::new(self.after)
    }

    /// What the source has handed over so far.
    pub fn stats(&self) -> &SourceStats {
        &self.stats
    }

    /// The indexes, in the order they are tried.
    pub fn indexes(&self) -> impl ExactSizeIterator<Item = (&IndexName, &Query)> + '_ {
        self.indexes.iter().map(|(n, q)| (n, q))
    }

    /// The next append's batch, if the log has one past what was handed over.
    fn next_append(&mut self) -> Result<Option<Batch>, ReadError> {
        if self.ends.is_empty() {
            let head = self.shared.head();
            if self.after >= head {
                return Ok(None);
            }
            // One look at the list of append ends for a run of appends (not a search per
            // append): entry `i` is where the `i + 1`-th append ends; the cursor sits at an
            // append's end, and the ends cover every published position.
            let view = self.shared.appends.view();
            let (from, to) = (view.rank(self.after), view.rank(head));
            self.ends.extend((from..to.min(from + READ_AHEAD)).map(|i| view.get(i)));
        }
        let Some(last) = self.ends.pop_front() else { return Ok(None) };
        let first = self.after + 1;
        let batch = self.live_batch(first, last)?;
        self.after = last;
        self.stats.appends += 1;
        self.stats.events += last - first + 1;
        Ok(Some(batch))
    }

    /// The batch of the append `first..=last`.
    fn live_batch(&self, first: u64, last: u64) -> Result<Batch, ReadError> {
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
                        relation: None,
                        old_id: None,
                        unchanged: Vec::new(),
                    });
                }
            }
        }
        Ok(Batch { position, changes: last - first + 1, offset: 0, envelopes: Arc::from(envelopes) })
    }

    /// The next item of the first backfill being served: a snapshot batch, or its
    /// `SnapshotComplete` (which ends it).
    fn next_snapshot(&mut self) -> Result<Option<SourceItem>, ReadError> {
        let limit = self.snapshot_batch;
        let Some(b) = self.backfills.front_mut() else { return Ok(None) };
        let mut rows = Vec::new();
        while b.next < b.queries.len() && rows.len() < limit {
            let (index, query) = &b.queries[b.next];
            let (events, more) = b.view.collect(query, b.cursor, Dir::Up, limit - rows.len())?;
            rows.extend(events.iter().map(|e| Envelope {
                index: index.clone(),
                id: e.position.to_string(),
                op: Op::Upsert,
                position: None,
                document: e.event.data().clone(),
                built_at_micros: None,
                relation: None,
                old_id: None,
                unchanged: Vec::new(),
            }));
            match events.last() {
                Some(e) if more => b.cursor = e.position.get(),
                _ => (b.next, b.cursor) = (b.next + 1, 0),
            }
        }
        if !rows.is_empty() {
            let sink = b.sink.clone();
            self.stats.snapshot_batches += 1;
            self.stats.snapshot_rows += rows.len() as u64;
            let item = LaneItem::Batch(Batch::new(None, Arc::from(rows)));
            return Ok(Some(SourceItem::Snapshot { sink, item }));
        }
        let b = self.backfills.pop_front().expect("the front backfill");
        self.stats.backfills += 1;
        Ok(Some(SourceItem::Snapshot {
            sink: b.sink,
            item: LaneItem::SnapshotComplete { indexes: b.indexes },
        }))
    }

    /// A view of the log up to `head` (at most the published head).
    fn view(&self, head: u64) -> OwnedView {
        OwnedView { snapshot: self.shared.snapshot.load_full(), shared: self.shared.clone(), head }
    }
}

impl Source for LogSource {
    type Error = SourceError;

    /// A backfill's next snapshot item if one is being served; else the next append's batch;
    /// else, once the log is closed and every append handed over, [`SourceItem::End`]; else
    /// waits (parked) up to `timeout` for an append or the log's end.
    ///
    /// # Errors
    /// [`SourceError::LogFailed`] once the log's writer failed and every append published
    /// before the failure was handed over; [`SourceError::Read`].
    fn next(&mut self, timeout: Duration) -> Result<Option<SourceItem>, SourceError> {
        // Read the clock only when there is nothing to hand over (the hot path does not wait).
        let mut deadline = None;
        loop {
            if let Some(item) = self.next_snapshot()? {
                return Ok(Some(item));
            }
            // Read the end flags before the head: the writer publishes its last snapshot before
            // it sets them, so an end seen here comes after every append.
            let failure = self.shared.failure.get().cloned();
            let closed = self.shared.is_closed();
            if let Some(batch) = self.next_append()? {
                return Ok(Some(SourceItem::Change(batch)));
            }
            if let Some(cause) = failure {
                return Err(SourceError::LogFailed(cause));
            }
            if closed {
                return Ok(Some(SourceItem::End));
            }
            let (shared, after) = (&self.shared, self.after);
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + timeout);
            if !shared.signal.wait(|| shared.is_ended() || shared.head() > after, Some(deadline)) {
                return Ok(None);
            }
        }
    }

    /// The log keeps every event: nothing to confirm to (the position is the stream's
    /// watermark, acked by every lane).
    fn confirm(&mut self, _position: Position) -> Result<(), SourceError> {
        Ok(())
    }

    /// Serves `request` from the log as it is now, up to the last append handed over (see
    /// the type's docs, "Backfill").
    ///
    /// # Errors
    /// [`SourceError::UnknownRequest`] for a kind of request other than a backfill.
    fn backfill(&mut self, request: Request) -> Result<(), SourceError> {
        let (sink, indexes) = match request {
            Request::Backfill { sink, indexes, .. } => (sink, indexes),
            other => return Err(SourceError::UnknownRequest(other)),
        };
        let queries: Vec<(IndexName, Query)> =
            indexes.iter().filter_map(|name| self.indexes.iter().find(|(n, _)| n == name).cloned()).collect();
        if queries.len() < indexes.len() {
            self.stats.refused += 1;
        }
        let view = self.view(self.after);
        self.backfills.push_back(Backfill { sink, indexes, queries, next: 0, cursor: 0, view });
        Ok(())
    }

    /// The log has nothing to check against the sinks' states; it says which indexes it
    /// publishes (a joining sink's backfill, the indexes a sink tracks) and whether the stream
    /// starts mid-log (then a sink with no state is a joiner, [P2](lanestream::pipeline::state#the-rules)).
    fn start(&mut self, _sinks: &[SinkStart<'_>]) -> Result<SourceStart, SourceError> {
        let indexes = self.indexes.iter().map(|(n, _)| n.clone()).collect();
        let resumes_from = (self.after > 0).then(|| Position(self.after + 1));
        Ok(SourceStart::new(None, self.after > 0, resumes_from, Some(indexes)))
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
        dir: Dir,
        limit: usize,
    ) -> Result<(Vec<super::event::SequencedEvent>, bool), ReadError> {
        let upto = self.head;
        let view = View::published(
            self.head.min(self.snapshot.head),
            &self.snapshot.types,
            &self.snapshot.tags,
            &self.shared.events,
        );
        view.collect(query, after, upto, dir, limit)
    }
}

impl fmt::Debug for LogSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogSource")
            .field("after", &self.after)
            .field("indexes", &self.indexes)
            .field("backfills", &self.backfills.len())
            .field("stats", &self.stats)
            .finish()
    }
}
