//! The driver: a [`Source`] into a [`Stream`] (any backend, through the port) into sink engines
//! on threads of their own.

use std::collections::HashMap;
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::{
    IndexName, LaneConsumer, LaneDelivery, MemoryStream, SinkName, Stream, StreamBuilder, StreamFanout,
};

use super::engine::{run_engine, EngineConfig, EnginePlan, Gate};
use super::error::{panic_message, PipelineError};
use super::ingest::{next_request, Ingest};
use super::metrics::{MetricsHandle, PipelineReport, SinkReport};
use super::sink::{RetryPolicy, Sink};
use super::source::{SinkStart, Source, SourceStart};
use super::state::SinkState;
use super::stop::StopHandle;

type EngineFn<St> = Box<dyn FnOnce(St, EngineConfig, Gate) -> Result<SinkReport, PipelineError> + Send>;

/// The stream a pipeline publishes into: given, or built at [`Pipeline::run`] with one lane per
/// local sink engine ([`Pipeline::in_memory`]).
enum StreamOf<St> {
    Given(St),
    FromSinks(BuildFn<St>),
}

/// Builds a pipeline's stream from its local sink engines' names.
type BuildFn<St> = Box<dyn FnOnce(&[String]) -> Result<St, PipelineError> + Send>;

/// What a pipeline does with a **joiner**: a sink that starts with no state (a new sink, or one
/// whose storage was reset) on a source with history ([`SourceStart::history`]: a replication
/// slot that resumes mid-stream, tables that hold rows). Without its history such a sink would
/// hold only the changes from where the stream resumes: rows committed before are missing from
/// it and updates of them arrive for rows it never had ([P2](super::state#the-rules)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Joiners {
    /// Owe it a backfill of every index the source publishes ([`SourceStart::indexes`]),
    /// durably, then ask for it: the backfill runs beside the live stream (DBLog: a snapshot row
    /// is never older than a change the sink applied), and the sink is whole once its
    /// `SnapshotComplete` arrives. A source that cannot list its indexes, or cannot backfill,
    /// makes the pipeline stop with its error.
    #[default]
    Backfill,
    /// Refuse to start: [`PipelineError::Refused`] naming the sink.
    Refuse,
    /// Start it with the live stream only: the caller says the sink needs nothing from before
    /// (the tables were empty when the slot was created, or the sink wants only changes from
    /// now on). It is then taken to hold every index the source publishes.
    LiveOnly,
}

/// A source → stream → sink engines pipeline; see the [module docs](super).
pub struct Pipeline<St: Stream + Clone + 'static> {
    stream: StreamOf<St>,
    engines: Vec<(String, EngineFn<St>)>,
    joiners: Joiners,
    backfills: Vec<IndexName>,
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
            .field("joiners", &self.joiners)
            .field("backfills", &self.backfills)
            .finish_non_exhaustive()
    }
}

impl Pipeline<MemoryStream> {
    /// A pipeline on an in-process [`MemoryStream`] whose lanes are its local sink engines:
    /// each sink is named once, by [`sink`](Self::sink), and the stream is built by
    /// [`run`](Self::run) from `builder` (its capacity, memory budget...) with one lane per sink,
    /// in the order they were added (sinks already on `builder` stay, first).
    ///
    /// ```
    /// use lanestream::pipeline::{MemorySink, Pipeline};
    /// use lanestream::MemoryStream;
    /// let search = MemorySink::new();
    /// let pipeline = Pipeline::in_memory(MemoryStream::builder().capacity(64)).sink("search", {
    ///     let search = search.clone();
    ///     move || Ok::<_, std::convert::Infallible>(search.clone())
    /// });
    /// # let _ = pipeline;
    /// ```
    ///
    /// # Errors
    /// [`run`](Self::run) returns [`PipelineError::Stream`] when the stream cannot be built (an
    /// invalid or repeated sink name, a capacity of 0: [`StreamBuilder::build`]).
    pub fn in_memory(builder: StreamBuilder) -> Self {
        Self::with(StreamOf::FromSinks(Box::new(move |names: &[String]| {
            builder.sinks(names.iter().cloned()).build().map_err(|e| PipelineError::Stream(e.to_string()))
        })))
    }
}

impl<St: Stream + Clone + 'static> Pipeline<St> {
    /// A pipeline publishing into `stream`, with no local sink engine yet (lanes without one
    /// are served elsewhere: another process on a broker). Every local engine's sink
    /// ([`sink`](Self::sink)) must be one of the stream's lanes ([`run`](Self::run) refuses
    /// otherwise, before it starts anything); [`in_memory`](Pipeline::in_memory) makes the lanes
    /// from the engines instead.
    pub fn new(stream: St) -> Self {
        Self::with(StreamOf::Given(stream))
    }

    fn with(stream: StreamOf<St>) -> Self {
        Pipeline {
            stream,
            engines: Vec::new(),
            joiners: Joiners::default(),
            backfills: Vec::new(),
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
        let engine: EngineFn<St> = Box::new(move |stream: St, config: EngineConfig, gate: Gate| {
            run_engine(&stream, &lane, open, &config, Some(gate))
        });
        self.engines.push((name, engine));
        self
    }

    /// What to do with a sink that starts with no state on a source with history (default:
    /// [`Joiners::Backfill`]).
    pub fn joiners(mut self, joiners: Joiners) -> Self {
        self.joiners = joiners;
        self
    }

    /// Asks, at start, a backfill of `indexes` for every local sink (served in this order, beside
    /// the live stream): owed durably in each sink's state before it is asked, so that a crash
    /// asks again, after the last row applied. An index already owed is not asked twice; one
    /// the sink holds is backfilled again (pass it once: a later start with the same call
    /// backfills it once more). An index the source does not have (by
    /// [`SourceStart`]'s list, when the source gives one) is refused at start.
    pub fn backfill(mut self, indexes: impl IntoIterator<Item = IndexName>) -> Self {
        for index in indexes {
            if !self.backfills.contains(&index) {
                self.backfills.push(index);
            }
        }
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
    /// A stop does not wait for backfills being served: each sink owes them durably and asks
    /// again at its next start, resuming after the last row it applied.
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

    /// Runs until the source ends ([`SourceItem::End`](super::SourceItem::End): every published batch acked, every
    /// backfill asked meanwhile served) or a stop is asked (drained up to the drain timeout);
    /// then confirms the source at the final watermark, closes the lanes at the source's end
    /// (not at a stop: a pause leaves them open, see [`StopHandle`]) and joins the sink engines.
    /// The ingest runs on the calling thread.
    ///
    /// # Resuming
    /// A source resumes from the watermark (what every lane acked), but a lane may hold
    /// published, unacked items beyond it: a restarted ingest over a broker's lanes, or over a
    /// stream that outlived its source. Once it has claimed the fan-out, the driver reads each
    /// lane's last published position ([`LaneStats::last_published`](crate::LaneStats::last_published),
    /// through [`Stream::stats`]) and publishes what the source sends again only to the lanes
    /// that lack it, so no lane gets a batch twice and none is refused for a position it holds
    /// ([L4](crate::contract#l4)):
    /// - a positioned batch at `p` goes to the lanes whose last published position is below
    ///   `p`: with the one fan-out publish when every lane lacks it (always, once past what the
    ///   lanes held), with [`publish_to`](crate::StreamFanout::publish_to) to each of them when
    ///   only some do (waiting for room as the fan-out publish does: confirming, taking
    ///   requests, and giving up at a stop), to none when every lane holds it
    ///   ([`PipelineReport::skipped`]);
    /// - an unpositioned chunk of a large transaction goes, by its envelopes' position (the
    ///   transaction's commit position), to the lanes that lack that transaction: a lane that
    ///   holds some of its chunks but not its last batch gets them again, which its sink's
    ///   state covers ([`SinkState::uncovered`](super::SinkState::uncovered));
    /// - the edge: a chunk whose envelopes carry no position goes to the lanes that were not
    ///   skipped for the last positioned batch handed over in this run (every lane before the
    ///   first).
    ///
    /// The items a lane held are redelivered by the lane itself. (This crate's backends share
    /// one publish sequence across a stream's lanes, the in-memory ring and the Redis log, so
    /// there every lane lacks a batch or none does.)
    ///
    /// Requests pending on the request lane from before this run are taken before the local
    /// engines get their plans: one for a backfill that a local engine's state owes is acked
    /// unanswered ([`PipelineReport::requests_superseded`]), since that engine asks again from
    /// its durable state, with the last snapshot row it made durable (serving both would send
    /// the backfill twice, R2); the others (a sink whose engine runs elsewhere, a request no
    /// state owes) are served first. An engine never waits to ask: what the request lane (a
    /// bounded one) cannot take now is asked after its next run or receive timeout, and a
    /// finite source's end waits for those asks before its last look at the request lane.
    ///
    /// # Errors
    /// The first failure: the source's, a sink engine's (named), the stream's, a refusal at start
    /// ([`PipelineError::Refused`], or the source's). The local sink engines are stopped and
    /// joined before it returns, and the lanes are left open (as a crash would leave them, P8):
    /// a close is the stream's end, final for every later publisher
    /// ([L10](crate::contract#l10)), which an error is not; a restarted ingest publishes
    /// again at once, after what was published ([L9](crate::contract#l9)), and a broker's
    /// sink engines in other processes keep waiting for it. The source was confirmed only up to
    /// the watermark.
    pub fn run<Src: Source>(self, source: &mut Src) -> Result<PipelineReport, PipelineError> {
        let Pipeline {
            stream,
            engines,
            joiners,
            backfills,
            retry,
            max_run,
            tick,
            drain_timeout,
            stop,
            metrics,
        } = self;
        let started = Instant::now();
        let names: Vec<String> = engines.iter().map(|(name, _)| name.clone()).collect();
        let stream = match stream {
            StreamOf::Given(stream) => stream,
            StreamOf::FromSinks(build) => build(&names)?,
        };
        if let Some(name) = names.iter().find(|n| !stream.sinks().iter().any(|s| s.as_str() == n.as_str())) {
            let lanes: Vec<&str> = stream.sinks().iter().map(|s| s.as_str()).collect();
            return Err(PipelineError::Stream(format!(
                "Pipeline::sink({name:?}) names no lane of the stream (its lanes: {lanes:?}); name it when \
                 building the stream, or let Pipeline::in_memory make the lanes from the sinks"
            )));
        }
        metrics.start();
        let mut fanout = stream.fanout()?;
        // Each lane's last published position, read once the fan-out is ours (its claim fences
        // an older ingest, L9): a lane may hold published, unacked items beyond the watermark
        // (a restarted ingest), which are not published to it again.
        let published = stream
            .sinks()
            .iter()
            .map(|sink| stream.stats(sink.as_str()).map(|s| s.last_published))
            .collect::<Result<Vec<_>, _>>()?;
        let mut requests = stream.reattach_requests();
        // Ends the local engines on an error, without closing the lanes (see "Errors").
        let engines_stop = StopHandle::new();
        let config = EngineConfig {
            retry,
            max_run,
            stop: Some(engines_stop.clone()),
            metrics: Some(metrics.clone()),
            close_on_give_up: true,
        };
        let mut threads: Vec<(String, JoinHandle<Result<SinkReport, PipelineError>>)> = Vec::new();
        let (ready, states) = mpsc::channel();
        let mut plans = Vec::with_capacity(engines.len());
        for (index, (name, engine)) in engines.into_iter().enumerate() {
            let (stream, config) = (stream.clone(), config.clone());
            let (plan, plan_in) = mpsc::channel();
            plans.push(plan);
            let gate = Gate { index, ready: ready.clone(), plan: plan_in };
            let spawned = thread::Builder::new()
                .name(format!("sink-{name}"))
                .spawn(move || engine(stream, config, gate))
                .map_err(|e| PipelineError::Stream(format!("cannot start sink engine {name}: {e}")));
            match spawned {
                Ok(handle) => threads.push((name, handle)),
                Err(e) => {
                    drop(plans);
                    engines_stop.stop();
                    join_all(threads);
                    return Err(e);
                }
            }
        }
        drop(ready);
        // P1, P2: every local sink's durable state, then the source's start, then each engine's
        // plan. A refusal starts nothing: the engines end without touching their sinks.
        let started_up = start_up(source, &stream, &threads, &states, joiners, &backfills);
        // R2 across a restart: requests still pending from before this run, taken before the
        // engines get their plans (and ask for what their states owe).
        let started_up = started_up.and_then(|(plans, owed)| {
            let owing: Vec<(&str, OwedLists)> =
                threads.iter().map(|(name, _)| name.as_str()).zip(owed).collect();
            left_over_requests(&mut requests, &owing).map(|left| (plans, left))
        });
        let (carried, superseded) = match started_up {
            Ok((engine_plans, left)) => {
                for (plan, engine_plan) in plans.iter().zip(engine_plans) {
                    let _ = plan.send(engine_plan);
                }
                left
            }
            Err(e) => {
                drop(plans);
                let joined = join_all(threads);
                // An engine that could not open its sink says why first.
                return Err(joined.into_iter().find_map(Result::err).unwrap_or(e));
            }
        };
        drop(plans);
        let mut ingest = Ingest {
            stream: &stream,
            fanout: &mut fanout,
            requests: &mut requests,
            pending: HashMap::new(),
            chunk_lanes: vec![true; published.len()],
            published,
            report: PipelineReport::default(),
            tick,
            metrics: metrics.clone(),
            next_lag: Instant::now(),
        };
        ingest.report.requests_superseded = superseded;
        let mut result = Ok(());
        for delivery in carried {
            result = ingest.serve_request(delivery, source);
            if result.is_err() {
                break;
            }
        }
        let result = result.and_then(|()| ingest.run(source, &stop, &threads, drain_timeout));
        ingest.update_metrics();
        let mut report = std::mem::take(&mut ingest.report);
        if result.is_ok() && !report.stopped {
            // The source's end: close every lane; the engines drain what is queued, ack it, and
            // end.
            fanout.close();
        } else {
            // A stop is a pause, and an error is not the stream's end either (P8): the lanes stay
            // open (a close is final, L10: on a broker every later ingest would be refused); the
            // local engines stop at their next receive (what they hold unacked is redelivered to
            // the next engine), and the fan-out is let go as a crash would.
            engines_stop.stop();
        }
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
        report.peak_rss_bytes = super::peak_rss_bytes();
        for e in [result.err(), last_confirm.err()].into_iter().flatten() {
            first_error.get_or_insert(e);
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }
}

/// The index lists of the backfills a sink's state owes ([`OwedBackfill::indexes`](super::OwedBackfill::indexes)).
type OwedLists = Vec<Vec<IndexName>>;

/// Takes what the request lane holds at start, before the local engines ask. A request for a
/// sink whose engine runs here, for a backfill that engine's state owes (its indexes end with
/// the owed ones: the same backfill, maybe further on), is left over from before this run: the
/// engine asks for it again from its durable state, with the last snapshot row it made durable
/// ([P3](super::state#the-rules)), and serving the old request too would send the backfill
/// twice and re-send rows the sink holds (R2); it is acked unanswered (the count is returned).
/// Every other request (for a sink whose engine runs elsewhere, on a broker, or one no state
/// owes, such as a request published by hand) is returned, to be served first.
fn left_over_requests<C: LaneConsumer<crate::Request>>(
    requests: &mut C,
    owing: &[(&str, OwedLists)],
) -> Result<(Vec<C::Delivery>, u64), PipelineError> {
    let (mut carried, mut acked) = (Vec::new(), 0);
    while let Some(delivery) = next_request(requests)? {
        let crate::Request::Backfill { sink, indexes, .. } = delivery.item();
        let superseded = owing
            .iter()
            .any(|(name, owed)| *name == sink.as_str() && owed.iter().any(|o| indexes.ends_with(o)));
        if superseded {
            if delivery.ack().is_ok() {
                acked += 1;
            }
        } else {
            carried.push(delivery);
        }
    }
    Ok((carried, acked))
}

/// Reads every local sink's durable state (from its engine), starts the source with them, and
/// makes each engine's plan: the origin to record, the indexes held, the backfills owed (a
/// joiner's history, tables that joined while the pipeline was down, explicit ones); and, per
/// engine, the index lists its state owes after the plan (see [`left_over_requests`]).
fn start_up<Src: Source, St: Stream>(
    source: &mut Src,
    stream: &St,
    engines: &[(String, JoinHandle<Result<SinkReport, PipelineError>>)],
    ready: &mpsc::Receiver<(usize, Option<SinkState>)>,
    joiners: Joiners,
    backfills: &[IndexName],
) -> Result<(Vec<EnginePlan>, Vec<OwedLists>), PipelineError> {
    let mut states: Vec<Option<Option<SinkState>>> = vec![None; engines.len()];
    while states.iter().any(Option::is_none) {
        match ready.recv_timeout(Duration::from_millis(50)) {
            Ok((i, state)) => states[i] = Some(state),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let waiting = states.iter().enumerate().filter(|(_, s)| s.is_none()).map(|(i, _)| i);
                if waiting.clone().any(|i| engines[i].1.is_finished()) {
                    return Err(PipelineError::Stream(
                        "a sink engine stopped at start (its error follows)".into(),
                    ));
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(PipelineError::Stream(
                    "a sink engine stopped at start (its error follows)".into(),
                ));
            }
        }
    }
    let names: Vec<SinkName> = engines
        .iter()
        .map(|(n, _)| SinkName::new(n).map_err(|e| PipelineError::Stream(format!("sink {n:?}: {e}"))))
        .collect::<Result<_, _>>()?;
    let states: Vec<Option<SinkState>> = states.into_iter().map(Option::unwrap_or_default).collect();
    let sinks: Vec<SinkStart<'_>> = names
        .iter()
        .zip(&states)
        .map(|(sink, state)| SinkStart { sink, state: state.as_ref(), joiners })
        .collect();
    let start: SourceStart = source.start(&sinks).map_err(|e| PipelineError::Source(e.into()))?;
    for name in &names {
        if !stream.sinks().contains(name) {
            return Err(PipelineError::Stream(format!("sink {name}: the stream has no lane of this name")));
        }
    }
    // An explicit backfill of an index the source does not have is a mistake of the caller's:
    // refused here, before anything is owed (an owed backfill of an index the source no longer
    // has, its table dropped or renamed since, is the source's to complete with nothing).
    if let Some(known) = &start.indexes {
        if let Some(unknown) = backfills.iter().find(|i| !known.contains(i)) {
            return Err(PipelineError::Source(
                format!(
                    "Pipeline::backfill names index {unknown}, which the source does not have (it has {} indexes{}): \
                     name one of its indexes",
                    known.len(),
                    known.first().map(|i| format!(", e.g. {i}")).unwrap_or_default()
                )
                .into(),
            ));
        }
    }
    let mut plans = Vec::with_capacity(sinks.len());
    for s in &sinks {
        plans.push(plan_for(s, &start, joiners, backfills)?);
    }
    // What each engine's state owes once its plan is applied: what it asks for first.
    let owed = plans
        .iter()
        .zip(&states)
        .map(|(plan, state)| plan.apply(state.as_ref()).owed.into_iter().map(|o| o.indexes).collect())
        .collect();
    Ok((plans, owed))
}

/// One engine's plan (see [`start_up`]).
fn plan_for(
    sink: &SinkStart<'_>,
    start: &SourceStart,
    joiners: Joiners,
    backfills: &[IndexName],
) -> Result<EnginePlan, PipelineError> {
    let refuse = |reason: String| PipelineError::Refused { sink: sink.sink.clone(), reason };
    if let (Some(theirs), Some(ours)) = (sink.state.and_then(|s| s.origin.as_ref()), &start.origin) {
        if theirs != ours {
            return Err(refuse(format!(
                "its state says it was filled from {theirs}, not from this source ({ours}): its data does not \
                 follow this stream. Point the pipeline at its own source, or reset the sink (clear its data \
                 and state) to have it backfilled from this one"
            )));
        }
    }
    let mut plan = EnginePlan {
        origin: start.origin.clone(),
        owe_again: backfills.to_vec(),
        detect: start.indexes.is_some(),
        ..EnginePlan::default()
    };
    match sink.state {
        None if start.history => match joiners {
            Joiners::Backfill => match &start.indexes {
                Some(indexes) => {
                    plan.held = Some(Vec::new());
                    plan.owe_missing.clone_from(indexes);
                }
                None => {
                    return Err(refuse(
                        "it starts with no state on a source with history, and the source does not say which \
                         indexes to backfill it with; start it on a source that does, or with \
                         Pipeline::joiners(Joiners::LiveOnly) if it needs nothing from before"
                            .into(),
                    ))
                }
            },
            Joiners::Refuse => {
                return Err(refuse(format!(
                    "it starts with no state on a source with history{}: it would hold only the changes from \
                     there on. Let the pipeline backfill it (Pipeline::joiners(Joiners::Backfill), the default), \
                     or start it with Joiners::LiveOnly if it needs nothing from before",
                    start.resumes_from.map(|p| format!(" (the stream resumes at {p})")).unwrap_or_default()
                )))
            }
            Joiners::LiveOnly => plan.held.clone_from(&start.indexes),
        },
        None => plan.held.clone_from(&start.indexes),
        Some(state) => match (&state.indexes, &start.indexes) {
            // Tracked from now on: what the source publishes is taken as held.
            (None, indexes) => plan.held.clone_from(indexes),
            // Tables that joined while the pipeline was down: owed.
            (Some(_), Some(indexes)) => plan.owe_missing.clone_from(indexes),
            (Some(_), None) => {}
        },
    }
    Ok(plan)
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
