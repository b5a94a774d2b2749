//! The sink engine: one lane into one [`Sink`], with the sink's [`SinkState`] kept on its
//! behalf (what to skip, what is owed, what to ask again), acks only after the sink's commit,
//! and retries within a [`RetryPolicy`].

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::Duration;

use crate::{
    Batch, Envelope, IndexName, LaneConsumer, LaneItem, LaneRun, Op, PublishError, RequestPublisher,
    SinkName, Stream,
};

use super::error::{panic_message, PipelineError};
use super::metrics::{commit_micros, lock, unix_micros_now, MetricsHandle, SinkLive, SinkReport};
use super::sink::{RetryPolicy, Sink};
use super::state::{SinkState, Uncovered};
use super::stop::StopHandle;
use super::BoxError;

/// How an engine runs.
#[derive(Clone)]
pub(crate) struct EngineConfig {
    pub(crate) retry: RetryPolicy,
    pub(crate) max_run: usize,
    pub(crate) stop: Option<StopHandle>,
    /// Where the engine keeps its live figures ([`Pipeline::metrics`](super::Pipeline::metrics));
    /// `None`: its own.
    pub(crate) metrics: Option<MetricsHandle>,
    /// Whether the engine closes its lane when it gives up: only an engine of a
    /// [`Pipeline`](super::Pipeline), whose ingest in the same process may be waiting in a
    /// publish to that lane (and stops with the engine's error). A [`run_sink`] engine leaves its
    /// lane open, as a crash would (P8): a close is permanent (L10), and would refuse every later
    /// ingest.
    pub(crate) close_on_give_up: bool,
}

/// What the driver tells an engine at start, once it has read every local sink's state and
/// heard the source ([`Source::start`](super::Source::start)).
#[derive(Clone, Debug, Default)]
pub(crate) struct EnginePlan {
    /// The source's origin, recorded in a state that has none.
    pub(crate) origin: Option<String>,
    /// The indexes the sink holds, for a state that does not track them yet.
    pub(crate) held: Option<Vec<IndexName>>,
    /// Backfills to owe, leaving out what the sink holds or is owed (a joiner's history, tables
    /// that joined while the pipeline was down).
    pub(crate) owe_missing: Vec<IndexName>,
    /// Backfills asked for explicitly ([`Pipeline::backfill`](super::Pipeline::backfill)): owed
    /// unless owed already, held or not.
    pub(crate) owe_again: Vec<IndexName>,
    /// Owe a backfill of an index a change brings that the sink neither holds nor is owed (a
    /// table that joined the source while running).
    pub(crate) detect: bool,
}

impl EnginePlan {
    /// The state after this plan, from the durable one.
    pub(crate) fn apply(&self, durable: Option<&SinkState>) -> SinkState {
        let mut state = durable.cloned().unwrap_or_default();
        if state.origin.is_none() {
            state.origin.clone_from(&self.origin);
        }
        if state.indexes.is_none() {
            state.indexes = self.held.as_ref().map(|h| h.iter().cloned().collect());
        }
        state.owe(&self.owe_missing, true);
        state.owe(&self.owe_again, false);
        state
    }
}

/// The start-up hand-shake of an engine of a [`Pipeline`](super::Pipeline): its sink's durable
/// state goes to the driver, the plan comes back (`None` from a closed channel: the pipeline
/// does not start).
pub(crate) struct Gate {
    pub(crate) index: usize,
    pub(crate) ready: mpsc::Sender<(usize, Option<SinkState>)>,
    pub(crate) plan: mpsc::Receiver<EnginePlan>,
}

/// Runs one sink engine for lane `sink` on the calling thread until its lane is closed and
/// drained, or `stop` is asked: for a process of its own on a broker backend (the ingest runs
/// elsewhere). `open` makes the sink instance, at start and after each failure; see [`Sink`]
/// for the retry and [`Pipeline::max_run`](super::Pipeline::max_run) for `max_run`.
///
/// The engine keeps the sink's [`SinkState`] as in a pipeline: it skips what the state covers,
/// commits the state with the data, and asks again for the backfills the state owes. The
/// start-up checks of a [`Pipeline`](super::Pipeline) (the source's origin, joiners) need the
/// source, which runs in another process: a new sink started here gets no automatic backfill;
/// ask for one from the ingest ([`Pipeline::backfill`](super::Pipeline::backfill)) or start
/// the sink with a [`Pipeline`](super::Pipeline) of its own process.
///
/// # Errors
/// [`PipelineError::Sink`] naming the sink when its budget is spent; its lane is left open, as a
/// crash would leave it (P8: a close is final for every later ingest, [L10](crate::contract#l10)),
/// so that the ingest waits for the engine restarted after this one, which carries on from the
/// sink's state. [`PipelineError::Stream`] for an unknown lane.
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
    let config = EngineConfig {
        retry,
        max_run: max_run.max(1),
        stop: Some(stop.clone()),
        metrics: None,
        close_on_give_up: false,
    };
    run_engine(stream, sink, open, &config, None)
}

/// What a run did to the state, and the requests it owes.
struct Prepared {
    items: Vec<LaneItem>,
    next: SinkState,
    asks: Vec<Vec<IndexName>>,
    /// The indexes resynced ([`Op::Resync`](crate::Op::Resync)), in order.
    resynced: Vec<IndexName>,
    covered: u64,
}

/// The items of `runs` that `state` does not cover (cut where it covers their start), the state
/// past them, and the backfills a change of an unknown index makes owed (`detect`). A
/// transaction with [`Op::Resync`](crate::Op::Resync) envelopes reaches the sink with
/// [`Op::Truncate`](crate::Op::Truncate) in their place, and makes their backfills owed
/// ([`SinkState::resync`]), whatever `detect` says.
fn prepare<R: LaneRun<LaneItem>>(runs: &[R], state: &SinkState, detect: bool) -> Result<Prepared, BoxError> {
    let mut out = Prepared {
        items: Vec::new(),
        next: state.clone(),
        asks: Vec::new(),
        resynced: Vec::new(),
        covered: 0,
    };
    for item in runs.iter().flat_map(|run| (0..run.len()).map_while(|i| run.get(i))) {
        let item = match out.next.uncovered(item)? {
            Uncovered::Nothing => {
                out.covered += 1;
                continue;
            }
            Uncovered::All => item.clone(),
            Uncovered::From(n) => SinkState::trim(item, n),
        };
        if let LaneItem::Batch(b) = &item {
            let change = b.position.is_some() || b.envelopes.first().is_some_and(|e| e.position.is_some());
            if detect && change {
                let mut last: Option<&IndexName> = None;
                for e in b.envelopes.iter() {
                    if last == Some(&e.index) {
                        continue; // a batch's envelopes mostly share their index: one look-up each
                    }
                    last = Some(&e.index);
                    if !out.next.knows(&e.index) {
                        if let Some(owed) = out.next.owe(std::slice::from_ref(&e.index), true) {
                            out.asks.push(owed.indexes);
                        }
                    }
                }
            }
        }
        let resynced = out.next.advance_resyncing(&item);
        let item = match item {
            LaneItem::Batch(b) if resynced => {
                let envelopes: Arc<[Envelope]> = b
                    .envelopes
                    .iter()
                    .map(|e| match e.op {
                        Op::Resync => {
                            out.resynced.push(e.index.clone());
                            out.asks.push(vec![e.index.clone()]);
                            Envelope { op: Op::Truncate, ..e.clone() }
                        }
                        _ => e.clone(),
                    })
                    .collect();
                LaneItem::Batch(Batch { envelopes, ..b })
            }
            item => item,
        };
        out.items.push(item);
    }
    Ok(out)
}

pub(crate) fn run_engine<St, S, F>(
    stream: &St,
    lane: &str,
    mut open: F,
    config: &EngineConfig,
    mut gate: Option<Gate>,
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
    // The start-up plan, until a commit made it durable; then whether changes are checked for
    // unknown indexes.
    let mut plan: Option<EnginePlan> = None;
    let mut detect = false;
    // The owed backfills asked for by this engine (their index lists as asked): asked once per
    // engine, since a request stays pending on the stream until its `SnapshotComplete` is
    // published (R2), and asking again would have it served twice.
    let mut asked: Vec<Vec<IndexName>> = Vec::new();
    // The state of the last commit of this engine: what a sink that keeps none (its `state`
    // says `None` again after a failure, as a plain file that is never cut back does) holds.
    let mut committed: Option<SinkState> = None;
    let give_up = |failures: u32, error: BoxError| {
        // Nobody drains this lane now. In a pipeline, closing it wakes the ingest's publish
        // waiting for its room (L10), and the pipeline stops with this error. Alone (another
        // process's ingest), the lane is left open, as a crash would leave it (P8): a close is
        // final for every later ingest; the engine restarted after this one carries on.
        if config.close_on_give_up {
            let _ = stream.close(lane);
        }
        PipelineError::Sink { sink: name.clone(), attempts: failures, error }
    };
    // One more failure in a row: give up after the policy's attempts, else wait its backoff.
    let failed = |failures: &mut u32, error: BoxError| -> Result<(), PipelineError> {
        *failures += 1;
        if *failures >= config.retry.attempts.max(1) {
            return Err(give_up(*failures, error));
        }
        thread::sleep(config.retry.backoff(*failures));
        Ok(())
    };
    'engine: loop {
        // A new engine: first a re-attach, which takes back every unacked delivery of the
        // previous one (L8) and, on a broker, fences an older engine of the lane still running;
        // then a new sink instance, from its durable state.
        let mut consumer = stream.reattach(lane)?;
        let (mut sink, durable) = loop {
            let opened = catch_unwind(AssertUnwindSafe(|| {
                let mut sink = open().map_err(|e| format!("opening the sink: {}", e.into()))?;
                let state = sink.state().map_err(|e| format!("reading the sink's state: {}", e.into()))?;
                Ok::<_, String>((sink, state))
            }));
            let error: BoxError = match opened {
                Ok(Ok(opened)) => break opened,
                Ok(Err(e)) => e.into(),
                Err(panic) => format!("opening the sink panicked: {}", panic_message(&*panic)).into(),
            };
            failed(&mut failures, error)?;
        };
        if let Some(g) = gate.take() {
            // The driver reads every sink's state before the source starts; a closed channel:
            // the pipeline does not start (its error is the driver's).
            let _ = g.ready.send((g.index, durable.clone()));
            match g.plan.recv() {
                Ok(p) => {
                    detect = p.detect;
                    plan = Some(p);
                }
                Err(_) => return Ok(SinkLive::finish(&live, report)),
            }
        }
        let mut state = match &plan {
            Some(p) => p.apply(durable.as_ref()),
            None => durable.clone().or_else(|| committed.clone()).unwrap_or_default(),
        };
        // P3: what the plan owes is durable before it is asked for.
        if plan.is_some() {
            if durable.as_ref() != Some(&state) {
                let result: Result<(), BoxError> =
                    match catch_unwind(AssertUnwindSafe(|| sink.commit(&state))) {
                        Ok(r) => r.map_err(Into::into),
                        Err(panic) => {
                            Err(format!("committing its state panicked: {}", panic_message(&*panic)).into())
                        }
                    };
                if let Err(error) = result {
                    drop(consumer);
                    drop(sink);
                    report.retries += 1;
                    failed(&mut failures, error)?;
                    continue 'engine;
                }
                committed = Some(state.clone());
            }
            plan = None;
        }
        // Owed backfills the request lane had no room for (asked at the next run or receive
        // timeout).
        let mut deferred =
            ask(stream, &name, &state, &mut asked, &mut report, &live).map_err(|e| give_up(failures, e))? > 0;
        // The runs received for one apply (a backend's run may be shorter than `max_run`: the
        // memory backend's holds at most `MAX_RUN`), and per run its items' commit times and
        // changes (read before the ack, which gives the run up).
        let mut runs: Vec<<St::Consumer as LaneConsumer<LaneItem>>::Run> = Vec::new();
        let mut commits: Vec<u64> = Vec::new();
        loop {
            let first = match &config.stop {
                None => consumer.recv_run(config.max_run).map_err(|e| e.to_string()),
                Some(stop) => loop {
                    if stop.is_stopped() {
                        report.position = state.position;
                        return Ok(SinkLive::finish(&live, report));
                    }
                    match consumer.recv_run_timeout(config.max_run, Duration::from_millis(100)) {
                        Ok(r) => break Ok(r),
                        Err(e) if e.is_timeout() => {
                            // Owed backfills the full request lane could not take yet.
                            if deferred {
                                deferred = ask(stream, &name, &state, &mut asked, &mut report, &live)
                                    .map_err(|e| give_up(failures, e))?
                                    > 0;
                            }
                        }
                        Err(e) => break Err(e.to_string()),
                    }
                },
            };
            let first = match first {
                Ok(Some(r)) => r,
                Ok(None) => {
                    report.position = state.position;
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
            }
            let applied = catch_unwind(AssertUnwindSafe(|| -> Result<Prepared, BoxError> {
                let prepared = prepare(&runs, &state, detect)?;
                if !prepared.items.is_empty() {
                    sink.apply(&prepared.items).map_err(Into::into)?;
                }
                if prepared.next != state || !prepared.items.is_empty() {
                    sink.commit(&prepared.next).map_err(Into::into)?;
                }
                Ok(prepared)
            }));
            let error: BoxError = match applied {
                Ok(Ok(prepared)) => {
                    failures = 0;
                    report.covered += prepared.covered;
                    state = prepared.next;
                    committed = Some(state.clone());
                    // A resynced index is owed on its own now (`SinkState::resync`): the lists
                    // asked before lose it, as the state's owed backfills did, so that a
                    // request still being served is known by what it has left, and the new
                    // backfill is asked.
                    for index in &prepared.resynced {
                        for a in &mut asked {
                            a.retain(|i| i != index);
                        }
                    }
                    asked.retain(|a| !a.is_empty());
                    // P3: the backfills a change made owed are durable now: ask for them (and
                    // forget the ones completed).
                    if !prepared.asks.is_empty() || !asked.is_empty() || deferred {
                        deferred = ask(stream, &name, &state, &mut asked, &mut report, &live)
                            .map_err(|e| give_up(failures, e))?
                            > 0;
                    }
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
                            // Or the backend could not confirm it within its retry budget: it
                            // sends the ack again before the next receive, or the item comes back
                            // to the next engine, which the state covers (P8). Which items is not
                            // known here; the run's count.
                            Err(_) => report.acks_refused += len,
                        }
                    }
                    continue;
                }
                Ok(Err(e)) => e,
                Err(panic) => format!("panicked: {}", panic_message(&*panic)).into(),
            };
            // Nothing of the runs is acked: released, and redelivered to the next engine.
            runs.clear();
            drop(consumer);
            drop(sink);
            report.retries += 1;
            failed(&mut failures, error)?;
            continue 'engine;
        }
    }
}

/// Publishes a request for every backfill `state` owes that this engine has not asked for
/// (one whose remaining indexes end a list asked before is in progress: asked). A list asked
/// before that the state no longer owes is forgotten (its backfill completed), so that the same
/// indexes owed again later are asked again.
///
/// Never waits: the request lane holds a bounded number of pending requests, each acked only
/// when its `SnapshotComplete` is published (R2) into this engine's lane, which only this
/// engine drains: waiting here for room would wait for itself. What the lane cannot take now
/// (full, or a broker's blip) is asked at the next call, after the next run or receive timeout;
/// it is owed durably meanwhile (P3).
///
/// Returns how many owed backfills it could not ask for now; the count also goes to `live`
/// (`unasked`), where a pipeline's drain at the source's end waits for it to reach 0 before its
/// last look at the request lane.
fn ask<St: Stream>(
    stream: &St,
    sink: &SinkName,
    state: &SinkState,
    asked: &mut Vec<Vec<IndexName>>,
    report: &mut SinkReport,
    live: &Mutex<SinkLive>,
) -> Result<u64, BoxError> {
    asked.retain(|a| state.owed.iter().any(|o| a.ends_with(&o.indexes)));
    let sender = stream.request_sender();
    let mut unasked = 0;
    for owed in &state.owed {
        if asked.iter().any(|a| a.ends_with(&owed.indexes)) {
            continue;
        }
        if unasked == 0 {
            match sender.try_publish(SinkState::request(sink, owed)) {
                Ok(()) => {
                    asked.push(owed.indexes.clone());
                    report.backfills_asked += 1;
                    continue;
                }
                Err(PublishError::Full(_) | PublishError::Backend { .. }) => {}
                Err(e) => return Err(format!("asking for its backfill of {:?}: {e}", owed.indexes).into()),
            }
        }
        unasked += 1;
    }
    lock(live).unasked = unasked;
    Ok(unasked)
}
