//! The driver: a [`Source`] into a [`Stream`] (any backend, through the port) into sink engines
//! on threads of their own.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use lanestream::{
    LaneConsumer, LaneDelivery, LaneItem, LaneRun, Position, PublishTimeoutError, RequestPublisher, SinkName,
    Stream, StreamError, StreamFanout, TryRecvError,
};

use super::metrics::{commit_micros, lock, unix_micros_now, MetricsHandle, SinkLive, SinkReport};
use super::sink::{RetryPolicy, Sink};
use super::source::{Source, SourceItem};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a pipeline stopped with an error. Each names the part that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// The source failed (reading, confirming, or serving a backfill).
    #[error("the source: {0}")]
    Source(#[source] BoxError),
    /// A sink's engine gave up: its `apply`/`commit` failed or panicked on the same run
    /// `attempts` times in a row (or its instance could not be opened). Nothing of that run was
    /// acked; its lane was closed, and the pipeline stopped.
    #[error("sink {sink}: gave up after {attempts} attempts: {error}")]
    Sink {
        /// The sink.
        sink: SinkName,
        /// Tries made of the last run.
        attempts: u32,
        /// The last failure (a panic's message reads `panicked: ...`).
        #[source]
        error: BoxError,
    },
    /// The stream refused (a lane unknown, the publisher busy, a publish refused).
    #[error("the stream: {0}")]
    Stream(String),
    /// The source handed over a snapshot item for a sink the stream has no lane for.
    #[error("the source sent a snapshot item for sink {0}, which has no lane")]
    UnknownSink(SinkName),
}

impl From<StreamError> for PipelineError {
    fn from(e: StreamError) -> Self {
        PipelineError::Stream(e.to_string())
    }
}

/// Asks a running pipeline (or sink engine) to stop: the driver stops reading the source, waits
/// (up to the drain timeout) until the sinks acked what was published, confirms the source at
/// the watermark, closes the lanes and returns `Ok`. Clone it freely; hand
/// [`flag`](StopHandle::flag) to a signal handler (`signal_hook::flag::register`).
#[derive(Clone, Debug, Default)]
pub struct StopHandle(Arc<AtomicBool>);

impl StopHandle {
    /// A handle not stopped yet.
    pub fn new() -> Self {
        StopHandle::default()
    }

    /// Asks to stop.
    pub fn stop(&self) {
        // Release: pairs with the Acquire in `is_stopped`; the flag carries no other data, so
        // Relaxed would do, but a stopper's writes before it are then visible to the driver.
        self.0.store(true, Ordering::Release);
    }

    /// Whether a stop was asked.
    pub fn is_stopped(&self) -> bool {
        // Acquire: pairs with `stop`'s Release.
        self.0.load(Ordering::Acquire)
    }

    /// The flag itself, for a signal handler that sets it.
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.0.clone()
    }
}

/// What a pipeline run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PipelineReport {
    /// Positioned batches (transactions) published to every lane.
    pub transactions: u64,
    /// Unpositioned chunks of large transactions published to every lane.
    pub chunks: u64,
    /// Changes published (the batches' `changes`).
    pub changes: u64,
    /// Envelopes published to every lane.
    pub envelopes: u64,
    /// Snapshot batches published to one lane each, and their envelopes.
    pub snapshot_batches: u64,
    /// Envelopes of those snapshot batches.
    pub snapshot_envelopes: u64,
    /// Backfill requests served: `SnapshotComplete` published, then the request acked.
    pub backfills_served: u64,
    /// The last positioned batch published.
    pub last_position: Option<Position>,
    /// The last position confirmed to the source.
    pub confirmed: Option<Position>,
    /// Whether the run ended by a [`StopHandle`] (otherwise the source ended).
    pub stopped: bool,
    /// Whether a stop's drain timed out before the sinks acked everything published.
    pub drain_timed_out: bool,
    /// The local sink engines, in the order they were added.
    pub sinks: Vec<SinkReport>,
    /// From the start of [`Pipeline::run`] to the engines joined.
    pub elapsed: Duration,
}

impl PipelineReport {
    /// Changes published per second of [`elapsed`](Self::elapsed) (0 for a run of no time).
    pub fn changes_per_second(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.changes as f64 / secs
        } else {
            0.0
        }
    }
}

type EngineFn<St> = Box<dyn FnOnce(St, EngineConfig) -> Result<SinkReport, PipelineError> + Send>;

#[derive(Clone)]
struct EngineConfig {
    retry: RetryPolicy,
    max_run: usize,
    stop: Option<StopHandle>,
    /// Where the engine keeps its live figures ([`Pipeline::metrics`]); `None`: its own.
    metrics: Option<MetricsHandle>,
}

/// A source → stream → sink engines pipeline; see the [module docs](super).
pub struct Pipeline<St: Stream + Clone + 'static> {
    stream: St,
    engines: Vec<(String, EngineFn<St>)>,
    retry: RetryPolicy,
    max_run: usize,
    tick: Duration,
    drain_timeout: Duration,
    stop: StopHandle,
    metrics: MetricsHandle,
}

impl<St: Stream + Clone + 'static> std::fmt::Debug for Pipeline<St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("sinks", &self.engines.iter().map(|(n, _)| n).collect::<Vec<_>>())
            .field("retry", &self.retry)
            .field("max_run", &self.max_run)
            .finish_non_exhaustive()
    }
}

impl<St: Stream + Clone + 'static> Pipeline<St> {
    /// A pipeline publishing into `stream`, with no local sink engine yet (lanes without one
    /// are served elsewhere: another process on a broker).
    pub fn new(stream: St) -> Self {
        Pipeline {
            stream,
            engines: Vec::new(),
            retry: RetryPolicy::default(),
            max_run: 256,
            tick: Duration::from_millis(10),
            drain_timeout: Duration::from_secs(30),
            stop: StopHandle::new(),
            metrics: MetricsHandle::default(),
        }
    }

    /// Runs a sink engine for lane `sink` on a thread of its own; `open` makes the sink
    /// instance, at start and again after each failure (see [`Sink`]).
    pub fn sink<S, F>(mut self, sink: impl Into<String>, open: F) -> Self
    where
        S: Sink + 'static,
        F: FnMut() -> Result<S, S::Error> + Send + 'static,
    {
        let name = sink.into();
        let lane = name.clone();
        let engine: EngineFn<St> =
            Box::new(move |stream: St, config: EngineConfig| run_engine(&stream, &lane, open, &config));
        self.engines.push((name, engine));
        self
    }

    /// The retry policy of every sink engine (default: [`RetryPolicy::default`]).
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The most lane items a sink engine applies and commits as one run (group commit; default
    /// 256; at least 1).
    pub fn max_run(mut self, items: usize) -> Self {
        self.max_run = items.max(1);
        self
    }

    /// How long the driver waits for the source in one call, and how often it confirms the
    /// watermark and reads the request lane while busy (default 10 ms).
    pub fn tick(mut self, tick: Duration) -> Self {
        self.tick = tick.max(Duration::from_millis(1));
        self
    }

    /// How long a stop waits for the sinks to ack what was published before it closes the
    /// lanes anyway (default 30 s; what is not acked is not confirmed: the source sends it again).
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// The handle that stops this pipeline.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// A handle on this pipeline's figures while it runs (and after): changes published and
    /// their rate, the confirmed position, the source's lag, and per local sink engine the
    /// items acked and the commit → ack latency ([`MetricsHandle::snapshot`]).
    pub fn metrics(&self) -> MetricsHandle {
        self.metrics.clone()
    }

    /// Runs until the source ends ([`SourceItem::End`]: every published batch acked, every
    /// backfill asked meanwhile served) or a stop is asked (drained up to the drain timeout);
    /// then confirms the source at the final watermark, closes the lanes and joins the sink
    /// engines. The ingest runs on the calling thread.
    ///
    /// # Errors
    /// The first failure: the source's, a sink engine's (named), the stream's. The lanes are
    /// closed and the engines joined before it returns; the source was confirmed only up to
    /// the watermark.
    pub fn run<Src: Source>(self, source: &mut Src) -> Result<PipelineReport, PipelineError> {
        let Pipeline { stream, engines, retry, max_run, tick, drain_timeout, stop, metrics } = self;
        let started = Instant::now();
        metrics.start();
        let mut fanout = stream.fanout()?;
        let mut requests = stream.reattach_requests();
        let config = EngineConfig { retry, max_run, stop: None, metrics: Some(metrics.clone()) };
        let mut threads: Vec<(String, JoinHandle<Result<SinkReport, PipelineError>>)> = Vec::new();
        for (name, engine) in engines {
            let (stream, config) = (stream.clone(), config.clone());
            let spawned = thread::Builder::new()
                .name(format!("sink-{name}"))
                .spawn(move || engine(stream, config))
                .map_err(|e| PipelineError::Stream(format!("cannot start sink engine {name}: {e}")));
            match spawned {
                Ok(handle) => threads.push((name, handle)),
                Err(e) => {
                    fanout.close();
                    join_all(threads);
                    return Err(e);
                }
            }
        }
        let mut ingest = Ingest {
            stream: &stream,
            fanout: &mut fanout,
            requests: &mut requests,
            pending: HashMap::new(),
            report: PipelineReport::default(),
            tick,
            metrics: metrics.clone(),
            next_lag: Instant::now(),
        };
        let result = ingest.run(source, &stop, &threads, drain_timeout);
        ingest.update_metrics();
        let mut report = std::mem::take(&mut ingest.report);
        // Close every lane: the engines drain what is queued, ack it, and end.
        fanout.close();
        let joined = join_all(threads);
        // The engines' last acks: confirm up to them, never past the watermark.
        let last_confirm = match stream.watermark() {
            Some(w) if report.confirmed.is_none_or(|c| w > c) => source
                .confirm(w)
                .map(|()| report.confirmed = Some(w))
                .map_err(|e| PipelineError::Source(e.into())),
            _ => Ok(()),
        };
        metrics.set_ingest(|m| m.confirmed = report.confirmed);
        // A sink engine's own error first: the ingest's then only says an engine stopped.
        let mut first_error = None;
        for r in joined {
            match r {
                Ok(s) => report.sinks.push(s),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        report.elapsed = started.elapsed();
        for e in [result.err(), last_confirm.err()].into_iter().flatten() {
            first_error.get_or_insert(e);
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }
}

fn join_all(
    threads: Vec<(String, JoinHandle<Result<SinkReport, PipelineError>>)>,
) -> Vec<Result<SinkReport, PipelineError>> {
    threads
        .into_iter()
        .map(|(name, t)| {
            t.join().unwrap_or_else(|panic| {
                Err(PipelineError::Sink {
                    sink: SinkName::new(&name).unwrap_or_else(|_| SinkName::new("unnamed").expect("valid")),
                    attempts: 1,
                    error: format!("the engine thread panicked: {}", panic_message(&*panic)).into(),
                })
            })
        })
        .collect()
}

/// The ingest loop's state.
struct Ingest<'a, St: Stream> {
    stream: &'a St,
    fanout: &'a mut St::Fanout,
    requests: &'a mut St::RequestConsumer,
    /// Requests handed to the source whose `SnapshotComplete` is not published yet, per sink,
    /// in arrival order: acked when it is ([R2](lanestream::contract#r2)).
    pending:
        HashMap<SinkName, VecDeque<<St::RequestConsumer as LaneConsumer<lanestream::Request>>::Delivery>>,
    report: PipelineReport,
    tick: Duration,
    metrics: MetricsHandle,
    /// When the source's lag is read next (about once a second: it may cost a query).
    next_lag: Instant,
}

impl<St: Stream> Ingest<'_, St> {
    /// Copies the ingest's figures into the [`MetricsHandle`], and the source's lag when due.
    fn refresh_metrics<Src: Source>(&mut self, source: &mut Src) {
        self.update_metrics();
        if Instant::now() >= self.next_lag {
            self.next_lag = Instant::now() + Duration::from_secs(1);
            let lag = source.lag_bytes();
            self.metrics.set_ingest(|m| m.source_lag_bytes = lag);
        }
    }

    /// Copies the ingest's figures into the [`MetricsHandle`].
    fn update_metrics(&self) {
        let r = &self.report;
        self.metrics.set_ingest(|m| {
            (m.transactions, m.changes) = (r.transactions, r.changes);
            (m.last_position, m.confirmed) = (r.last_position, r.confirmed);
        });
    }

    fn run<Src: Source>(
        &mut self,
        source: &mut Src,
        stop: &StopHandle,
        engines: &[(String, JoinHandle<Result<SinkReport, PipelineError>>)],
        drain_timeout: Duration,
    ) -> Result<(), PipelineError> {
        let mut next_tick = Instant::now();
        loop {
            if stop.is_stopped() {
                self.report.stopped = true;
                return self.drain(source, engines, Some(Instant::now() + drain_timeout), false);
            }
            if Instant::now() >= next_tick {
                next_tick = Instant::now() + self.tick;
                self.housekeeping(source, engines)?;
            }
            match source.next(self.tick).map_err(|e| PipelineError::Source(e.into()))? {
                Some(SourceItem::End) => return self.drain(source, engines, None, true),
                Some(item) => self.publish(item, source, stop, engines)?,
                None => self.confirm(source)?,
            }
        }
    }

    /// Confirms the watermark, hands new requests to the source, and checks the engines.
    fn housekeeping<Src: Source>(
        &mut self,
        source: &mut Src,
        engines: &[(String, JoinHandle<Result<SinkReport, PipelineError>>)],
    ) -> Result<(), PipelineError> {
        self.confirm(source)?;
        self.take_requests(source)?;
        self.refresh_metrics(source);
        // An engine ends before the lanes close only when it gave up: stop with its error
        // (the caller joins it).
        if engines.iter().any(|(_, t)| t.is_finished()) {
            return Err(PipelineError::Stream("a sink engine stopped (its error follows)".into()));
        }
        Ok(())
    }

    fn confirm<Src: Source>(&mut self, source: &mut Src) -> Result<(), PipelineError> {
        if let Some(w) = self.stream.watermark() {
            if self.report.confirmed.is_none_or(|c| w > c) {
                source.confirm(w).map_err(|e| PipelineError::Source(e.into()))?;
                self.report.confirmed = Some(w);
            }
        }
        Ok(())
    }

    fn take_requests<Src: Source>(&mut self, source: &mut Src) -> Result<(), PipelineError> {
        loop {
            let delivery = match self.requests.try_recv() {
                Ok(d) => d,
                Err(TryRecvError::Empty | TryRecvError::Closed) => return Ok(()),
                Err(e) => return Err(PipelineError::Stream(format!("the request lane: {e}"))),
            };
            let request = delivery.item().clone();
            let sink = match &request {
                lanestream::Request::Backfill { sink, .. } => sink.clone(),
                other => {
                    return Err(PipelineError::Source(
                        format!("a request the driver does not know: {other:?}").into(),
                    ))
                }
            };
            source.backfill(request).map_err(|e| PipelineError::Source(e.into()))?;
            self.pending.entry(sink).or_default().push_back(delivery);
        }
    }

    fn lane(&self, sink: &SinkName) -> Result<usize, PipelineError> {
        self.stream
            .sinks()
            .iter()
            .position(|s| s == sink)
            .ok_or_else(|| PipelineError::UnknownSink(sink.clone()))
    }

    fn publish<Src: Source>(
        &mut self,
        item: SourceItem,
        source: &mut Src,
        stop: &StopHandle,
        engines: &[(String, JoinHandle<Result<SinkReport, PipelineError>>)],
    ) -> Result<(), PipelineError> {
        match item {
            SourceItem::Change(batch) => {
                let (position, changes, envelopes) =
                    (batch.position, batch.changes, batch.envelopes.len() as u64);
                let mut item = LaneItem::Batch(batch);
                // Wait for room, confirming meanwhile (slow sinks' progress reaches the source).
                loop {
                    match self.fanout.publish_timeout(item, self.tick.max(Duration::from_millis(50))) {
                        Ok(()) => break,
                        Err(PublishTimeoutError::Timeout(back)) => {
                            item = back;
                            self.housekeeping(source, engines)?;
                            if stop.is_stopped() {
                                // Not published, so never confirmed: the source sends it again.
                                return Ok(());
                            }
                        }
                        Err(e) => return Err(publish_error(e)),
                    }
                }
                self.report.changes += changes;
                self.report.envelopes += envelopes;
                match position {
                    Some(p) => {
                        self.report.transactions += 1;
                        self.report.last_position = Some(p);
                    }
                    None => self.report.chunks += 1,
                }
            }
            SourceItem::Snapshot { sink, item } => {
                let lane = self.lane(&sink)?;
                let complete = matches!(item, LaneItem::SnapshotComplete { .. });
                if let LaneItem::Batch(b) = &item {
                    self.report.snapshot_batches += 1;
                    self.report.snapshot_envelopes += b.envelopes.len() as u64;
                }
                self.fanout.publish_to(lane, item).map_err(|e| publish_error(e.into()))?;
                if complete {
                    // R2: the request is acked only now that its SnapshotComplete is published.
                    if let Some(delivery) = self.pending.get_mut(&sink).and_then(VecDeque::pop_front) {
                        if delivery.ack().is_ok() {
                            self.report.backfills_served += 1;
                        }
                    }
                }
            }
            SourceItem::End => {}
        }
        Ok(())
    }

    /// Waits until the sinks acked everything published (the waitable watermark), serving the
    /// backfills asked meanwhile when `serve` (a finite input's end), up to `deadline`.
    fn drain<Src: Source>(
        &mut self,
        source: &mut Src,
        engines: &[(String, JoinHandle<Result<SinkReport, PipelineError>>)],
        deadline: Option<Instant>,
        serve: bool,
    ) -> Result<(), PipelineError> {
        loop {
            if serve {
                self.take_requests(source)?;
                // The snapshot items of those requests (the source has ended otherwise).
                while self.pending.values().any(|q| !q.is_empty()) {
                    match source.next(Duration::ZERO).map_err(|e| PipelineError::Source(e.into()))? {
                        Some(SourceItem::End) | None => break,
                        Some(item) => self.publish(item, source, &StopHandle::new(), engines)?,
                    }
                }
            }
            self.confirm(source)?;
            self.refresh_metrics(source);
            let caught_up = match self.report.last_position {
                Some(last) => self.report.confirmed.is_some_and(|c| c >= last),
                None => true,
            };
            if caught_up && self.pending.values().all(VecDeque::is_empty) {
                return Ok(());
            }
            if engines.iter().any(|(_, t)| t.is_finished()) {
                return Err(PipelineError::Stream("a sink engine stopped (its error follows)".into()));
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                self.report.drain_timed_out = true;
                return Ok(());
            }
            let wait = deadline.map_or(now + self.tick, |d| d.min(now + self.tick));
            if let Some(last) = self.report.last_position {
                self.stream.wait_watermark(last, Some(wait));
            } else {
                thread::sleep(wait.saturating_duration_since(now));
            }
        }
    }
}

fn publish_error(e: PublishTimeoutError<LaneItem>) -> PipelineError {
    match e {
        PublishTimeoutError::Closed(_) => {
            PipelineError::Stream("a lane was closed (its sink engine stopped: its error follows)".into())
        }
        e => PipelineError::Stream(format!("publish: {e}")),
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// Runs one sink engine for lane `sink` on the calling thread until its lane is closed and
/// drained, or `stop` is asked: for a process of its own on a broker backend (the ingest runs
/// elsewhere). `open` makes the sink instance, at start and after each failure; see [`Sink`]
/// for the retry and [`Pipeline::max_run`] for `max_run`.
///
/// # Errors
/// [`PipelineError::Sink`] naming the sink when its budget is spent (its lane is then closed);
/// [`PipelineError::Stream`] for an unknown lane.
pub fn run_sink<St, S, F>(
    stream: &St,
    sink: &str,
    open: F,
    retry: RetryPolicy,
    max_run: usize,
    stop: &StopHandle,
) -> Result<SinkReport, PipelineError>
where
    St: Stream,
    S: Sink,
    F: FnMut() -> Result<S, S::Error>,
{
    let config = EngineConfig { retry, max_run: max_run.max(1), stop: Some(stop.clone()), metrics: None };
    run_engine(stream, sink, open, &config)
}

fn run_engine<St, S, F>(
    stream: &St,
    lane: &str,
    mut open: F,
    config: &EngineConfig,
) -> Result<SinkReport, PipelineError>
where
    St: Stream,
    S: Sink,
    F: FnMut() -> Result<S, S::Error>,
{
    let name = SinkName::new(lane).map_err(|e| PipelineError::Stream(format!("sink {lane:?}: {e}")))?;
    // Its acked counts and commit → ack histogram are kept in `live` (read by the pipeline's
    // metrics handle while it runs), the rest here; `SinkLive::finish` joins them at the end.
    let mut report = SinkReport { sink: lane.to_owned(), ..SinkReport::default() };
    let live = match &config.metrics {
        Some(m) => m.add_sink(lane),
        None => Arc::new(Mutex::new(SinkLive { sink: lane.to_owned(), ..SinkLive::default() })),
    };
    let mut failures = 0u32;
    let mut resumed = false;
    let give_up = |failures: u32, error: BoxError| {
        // Nobody drains this lane now: closing it wakes a publish waiting for its room (L10).
        let _ = stream.close(lane);
        PipelineError::Sink { sink: name.clone(), attempts: failures, error }
    };
    'engine: loop {
        // A new engine: first a re-attach, which takes back every unacked delivery of the
        // previous one (L8) and, on a broker, fences an older engine of the lane still running;
        // then a new sink instance (from its durable checkpoint: an older engine's instance lets
        // its output go when it notices the fence).
        let mut consumer = stream.reattach(lane)?;
        let mut sink = loop {
            let error: BoxError = match catch_unwind(AssertUnwindSafe(&mut open)) {
                Ok(Ok(sink)) => break sink,
                Ok(Err(e)) => format!("opening the sink: {e}").into(),
                Err(panic) => format!("opening the sink panicked: {}", panic_message(&*panic)).into(),
            };
            failures += 1;
            if failures >= config.retry.attempts.max(1) {
                return Err(give_up(failures, error));
            }
            thread::sleep(config.retry.backoff(failures));
        };
        // Only the engine's first instance re-asks: after a failed run the backfill it would
        // repeat is still pending on this stream (its request unacked until `SnapshotComplete`
        // is published, R2), and asking again would have it served twice.
        if !resumed {
            resumed = true;
            if let Some(request) = sink.resume() {
                stream
                    .request_sender()
                    .publish(request)
                    .map_err(|e| give_up(failures, format!("re-sending its backfill: {e}").into()))?;
                report.resumed_backfills += 1;
            }
        }
        // The runs received for one apply (a backend's run may be shorter than `max_run`: the
        // memory backend's holds at most `MAX_RUN`), their items, and per run its items' commit
        // times and changes (read before the ack, which gives the run up).
        let mut runs: Vec<<St::Consumer as LaneConsumer<LaneItem>>::Run> = Vec::new();
        let mut items: Vec<LaneItem> = Vec::with_capacity(config.max_run);
        let mut commits: Vec<u64> = Vec::new();
        loop {
            let first = match &config.stop {
                None => consumer.recv_run(config.max_run).map_err(|e| e.to_string()),
                Some(stop) => loop {
                    if stop.is_stopped() {
                        report.checkpoint = sink.checkpoint();
                        return Ok(SinkLive::finish(&live, report));
                    }
                    match consumer.recv_run_timeout(config.max_run, Duration::from_millis(100)) {
                        Ok(r) => break Ok(r),
                        Err(e) if e.is_timeout() => {}
                        Err(e) => break Err(e.to_string()),
                    }
                },
            };
            let first = match first {
                Ok(Some(r)) => r,
                Ok(None) => {
                    report.checkpoint = sink.checkpoint();
                    return Ok(SinkLive::finish(&live, report));
                }
                // Another engine took the lane over (or the receive failed for good): this one
                // ends with an error, leaving the lane open for the engine that carries on.
                Err(e) => {
                    return Err(PipelineError::Sink {
                        sink: name.clone(),
                        attempts: failures.max(1),
                        error: format!("receiving: {e}").into(),
                    })
                }
            };
            let mut received = first.len();
            runs.push(first);
            while received < config.max_run {
                // Nothing more now (or a blip of a broker: the blocking receive retries).
                match consumer.try_recv_run(config.max_run - received) {
                    Ok(r) => {
                        received += r.len();
                        runs.push(r);
                    }
                    Err(_) => break,
                }
            }
            for run in &runs {
                report.redelivered += run.redelivered() as u64;
                items.extend((0..run.len()).map_while(|i| run.get(i)).cloned());
            }
            let applied = catch_unwind(AssertUnwindSafe(|| sink.apply(&items).and_then(|()| sink.commit())));
            items.clear();
            let error: BoxError = match applied {
                Ok(Ok(())) => {
                    failures = 0;
                    // C1: acked only now that the sink committed. One clock read for all: the
                    // runs are acked together.
                    let now = unix_micros_now();
                    for run in runs.drain(..) {
                        let (len, mut changes) = (run.len() as u64, 0);
                        commits.clear();
                        for item in (0..run.len()).map_while(|i| run.get(i)) {
                            if let LaneItem::Batch(b) = item {
                                changes += b.changes;
                                commits.extend(commit_micros(item));
                            }
                        }
                        match run.ack() {
                            Ok(()) => {
                                let mut live = lock(&live);
                                live.items_acked += len;
                                live.changes_acked += changes;
                                for &commit in &commits {
                                    live.latency.record(commit, now);
                                }
                            }
                            // A re-attach took (some of) the run back first: redelivered (L8).
                            // Which items is not known here; the run's count.
                            Err(_) => report.acks_refused += len,
                        }
                    }
                    continue;
                }
                Ok(Err(e)) => Box::new(e),
                Err(panic) => format!("panicked: {}", panic_message(&*panic)).into(),
            };
            // Nothing of the runs is acked: released, and redelivered to the next engine.
            runs.clear();
            drop(consumer);
            drop(sink);
            failures += 1;
            report.retries += 1;
            if failures >= config.retry.attempts.max(1) {
                return Err(give_up(failures, error));
            }
            thread::sleep(config.retry.backoff(failures));
            continue 'engine;
        }
    }
}
