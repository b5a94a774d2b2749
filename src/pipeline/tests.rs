//! The driver over a [`MemoryStream`]: resuming over lanes that hold published, unacked items
//! beyond the watermark (see [`Pipeline::run`], "Resuming").
//!
//! The in-memory backend's lanes read one ring and share one publish sequence (a
//! `publish_to` is a gap for the other lanes, and moves every lane's last published position),
//! so its lanes never differ in what they hold: the tests here are the restarts it can have.

use crate::prelude::*;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use super::{
    MemorySink, Pipeline, PipelineReport, Sink, SinkStart, SinkState, Source, SourceItem, SourceStart,
};
use crate::{Batch, Envelope, IndexName, LaneItem, MemoryStream, Op, Position, Request, Stream};

/// Hands over its items, then the end.
struct Items(VecDeque<SourceItem>);

impl Source for Items {
    type Error = std::io::Error;

    fn next(&mut self, _: Duration) -> Result<Option<SourceItem>, Self::Error> {
        Ok(Some(self.0.pop_front().unwrap_or(SourceItem::End)))
    }

    fn confirm(&mut self, _: Position) -> Result<(), Self::Error> {
        Ok(())
    }

    fn backfill(&mut self, request: Request) -> Result<(), Self::Error> {
        Err(std::io::Error::other(format!("no backfill here: {request:?}")))
    }

    fn start(&mut self, _: &[SinkStart<'_>]) -> Result<SourceStart, Self::Error> {
        Ok(SourceStart::default())
    }
}

// The sinks are `MemorySink`s: what they applied and their state outlive an instance.
impl MemorySink {
    /// The transactions applied (their positions), in order.
    fn transactions(&self) -> Vec<u64> {
        self.applied().iter().filter_map(|i| i.position()).map(|p| p.0).collect()
    }

    /// Envelopes applied, as `(commit position, offset in the transaction)`.
    fn envelopes(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for item in self.applied().iter() {
            if let LaneItem::Batch(b) = item {
                for (k, e) in b.envelopes.iter().enumerate() {
                    out.push((e.position.unwrap().0, b.offset + k as u64));
                }
            }
        }
        out
    }
}

/// Envelopes `offset..offset + n` of the transaction committing at `p`; positioned (its last
/// batch) when `last`.
fn batch(p: u64, offset: u64, n: u64, last: bool) -> Batch {
    let envelopes: Arc<[Envelope]> = (offset..offset + n)
        .map(|k| Envelope {
            index: IndexName::new("t").unwrap(),
            id: format!("{p}-{k}"),
            op: Op::Upsert,
            position: Some(Position(p)),
            document: Bytes::new(),
            built_at_micros: None,
            relation: None,
            old_id: None,
            unchanged: Vec::new(),
        })
        .collect();
    Batch { position: last.then_some(Position(p)), changes: n, offset, envelopes }
}

fn txn(p: u64) -> Batch {
    batch(p, 0, 1, true)
}

/// Runs a pipeline with a recording sink engine per lane over `items`.
fn run(stream: &MemoryStream, items: Vec<Batch>) -> (PipelineReport, Vec<MemorySink>) {
    let mut pipeline = Pipeline::new(stream.clone()).tick(Duration::from_millis(2));
    let mut recorded = Vec::new();
    for sink in stream.sinks() {
        let r = MemorySink::default();
        recorded.push(r.clone());
        pipeline = pipeline.sink(sink.as_str(), move || Ok::<_, std::convert::Infallible>(r.clone()));
    }
    let mut source = Items(items.into_iter().map(SourceItem::Change).collect());
    (pipeline.run(&mut source).expect("the pipeline runs"), recorded)
}

fn published(stream: &MemoryStream, sink: &str) -> (u64, Option<Position>) {
    let s = stream.stats(sink).unwrap();
    (s.published, s.last_published)
}

/// Every lane holds what the source sends again (a restarted ingest over a broker's lanes):
/// before per-lane publishing, the driver's fan-out publish of 10 was refused with
/// `PositionRegressed` and the pipeline stopped with an error.
#[test]
fn a_restart_over_lanes_that_hold_the_batches_is_not_refused_with_position_regressed() {
    let stream = MemoryStream::builder().capacity(16).sinks(["a", "b"]).build().unwrap();
    {
        let mut fanout = stream.fanout().unwrap();
        fanout.publish(LaneItem::Batch(txn(10))).unwrap();
        fanout.publish(LaneItem::Batch(txn(20))).unwrap();
    }
    let (report, recorded) = run(&stream, vec![txn(10), txn(20), txn(30)]);
    assert_eq!((report.skipped, report.transactions), (2, 1));
    for sink in ["a", "b"] {
        assert_eq!(published(&stream, sink), (3, Some(Position(30))), "{sink}: nothing published twice");
    }
    for r in &recorded {
        assert_eq!(r.transactions(), [10, 20, 30]);
    }
    assert!(stream.is_idle());
}

/// An earlier ingest stopped in the middle of a large transaction (30): what every lane holds is
/// skipped, chunks of a transaction the lanes hold included; the chunks of the transaction the
/// lanes lack go again (one of them a second time: its sink's state covers it, so every envelope
/// is applied once).
#[test]
fn chunks_go_by_their_transaction_to_the_lanes_that_lack_it() {
    let stream = MemoryStream::builder().capacity(16).sinks(["a", "b"]).build().unwrap();
    let earlier = [txn(10), batch(20, 0, 2, false), batch(20, 2, 1, true), batch(30, 0, 1, false)];
    {
        let mut fanout = stream.fanout().unwrap();
        for b in &earlier {
            fanout.publish(LaneItem::Batch(b.clone())).unwrap();
        }
    }
    let mut items = earlier.to_vec();
    items.extend([batch(30, 1, 1, false), batch(30, 2, 1, true)]);
    let (report, recorded) = run(&stream, items);
    assert_eq!((report.skipped, report.chunks, report.transactions), (3, 2, 1));
    assert_eq!(report.confirmed, Some(Position(30)));
    for sink in ["a", "b"] {
        assert_eq!(
            published(&stream, sink),
            (7, Some(Position(30))),
            "{sink}: 4 held, then 30's three batches"
        );
    }
    let whole = [(10, 0), (20, 0), (20, 1), (20, 2), (30, 0), (30, 1), (30, 2)];
    for r in &recorded {
        assert_eq!(r.envelopes(), whole, "every envelope applied once, in order");
        assert_eq!(r.transactions(), [10, 20, 30]);
    }
}

// ---------------------------------------------------------------------------------------------
// Adversarial restarts: a source that resumes from its confirmed position (as a replication
// slot does), crashing or stopped mid-way, over lanes that hold published, unacked items.
// ---------------------------------------------------------------------------------------------

use super::state::transaction_of;
use super::StopHandle;

/// How a [`Replaying`] run ends early.
#[derive(Clone)]
enum Halt {
    /// Fails (a crash) on the call after handing over this many items (live and snapshot).
    CrashAfter(usize),
    /// Fails on the call after handing over this many snapshot items.
    CrashAfterSnapshot(usize),
    /// Asks a stop (a pause) once it handed over this many items.
    StopAfter(usize, StopHandle),
    /// Runs to the end.
    Never,
}

/// A source over a fixed list of batches (large transactions as chunks then their positioned
/// last batch) that resumes as a real source does: at the first batch of the first transaction
/// past the position it was confirmed last (kept across instances, as a slot keeps it). It serves
/// backfills of index `t` with `rows` snapshot rows, two per batch, then `SnapshotComplete`.
struct Replaying {
    items: Vec<Batch>,
    next: usize,
    confirmed: Arc<Mutex<Option<Position>>>,
    halt: Halt,
    handed: usize,
    snapshot_handed: usize,
    snapshots: VecDeque<SourceItem>,
    rows: u64,
    /// Every request handed to `backfill`, across instances.
    requests: Arc<Mutex<Vec<Request>>>,
    /// Idle (`None`) instead of the end once its items are handed over: a live source.
    endless: bool,
    /// The indexes it says it publishes (`SourceStart::indexes`).
    indexes: Option<Vec<IndexName>>,
}

impl Replaying {
    fn resume(items: &[Batch], confirmed: &Arc<Mutex<Option<Position>>>, halt: Halt) -> Self {
        let c = *confirmed.lock().unwrap();
        let next = items.iter().position(|b| transaction_of(b) > c).unwrap_or(items.len());
        Replaying {
            items: items.to_vec(),
            next,
            confirmed: confirmed.clone(),
            halt,
            handed: 0,
            snapshot_handed: 0,
            snapshots: VecDeque::new(),
            rows: 0,
            requests: Arc::default(),
            endless: false,
            indexes: None,
        }
    }
}

impl Source for Replaying {
    type Error = std::io::Error;

    fn next(&mut self, _: Duration) -> Result<Option<SourceItem>, Self::Error> {
        let crash = || Err(std::io::Error::other("the source crashed"));
        match &self.halt {
            Halt::CrashAfter(n) if self.handed >= *n => return crash(),
            Halt::CrashAfterSnapshot(n) if self.snapshot_handed >= *n => {
                // Lets the sinks make what they got durable first.
                std::thread::sleep(Duration::from_millis(100));
                return crash();
            }
            Halt::StopAfter(n, stop) if self.handed >= *n => stop.stop(),
            _ => {}
        }
        if let Some(item) = self.snapshots.pop_front() {
            self.handed += 1;
            self.snapshot_handed += 1;
            return Ok(Some(item));
        }
        let Some(batch) = self.items.get(self.next) else {
            return Ok(if self.endless { None } else { Some(SourceItem::End) });
        };
        self.next += 1;
        self.handed += 1;
        Ok(Some(SourceItem::Change(batch.clone())))
    }

    fn confirm(&mut self, p: Position) -> Result<(), Self::Error> {
        let mut c = self.confirmed.lock().unwrap();
        assert!(c.is_none_or(|c| p >= c), "confirmed backwards: {p:?} after {c:?}");
        *c = Some(p);
        Ok(())
    }

    fn backfill(&mut self, request: Request) -> Result<(), Self::Error> {
        self.requests.lock().unwrap().push(request.clone());
        let Request::Backfill { sink, indexes, after } = request;
        let t = indexes[0].clone();
        // R2: resumes after the row `after` names.
        let mut k = after.map_or(0, |id| id[1..].parse::<u64>().unwrap() + 1);
        while k < self.rows {
            let envelopes: Arc<[Envelope]> = (k..(k + 2).min(self.rows))
                .map(|r| Envelope {
                    index: t.clone(),
                    id: format!("r{r}"),
                    op: Op::Upsert,
                    position: None,
                    document: Bytes::new(),
                    built_at_micros: None,
                    relation: None,
                    old_id: None,
                    unchanged: Vec::new(),
                })
                .collect();
            self.snapshots.push_back(SourceItem::Snapshot {
                sink: sink.clone(),
                item: LaneItem::Batch(Batch::new(None, envelopes)),
            });
            k += 2;
        }
        self.snapshots.push_back(SourceItem::Snapshot { sink, item: LaneItem::SnapshotComplete { indexes } });
        Ok(())
    }

    fn start(&mut self, _: &[SinkStart<'_>]) -> Result<SourceStart, Self::Error> {
        Ok(SourceStart::new(None, false, None, self.indexes.clone()))
    }
}

/// Ten transactions, 30 and 60 large (three chunks of 2, 2, 1 envelopes), the others of one
/// or two envelopes.
fn workload() -> (Vec<Batch>, Vec<(u64, u64)>, Vec<u64>) {
    let mut items = Vec::new();
    for p in (10..=100).step_by(10) {
        match p {
            30 | 60 => items.extend([batch(p, 0, 2, false), batch(p, 2, 2, false), batch(p, 4, 1, true)]),
            _ => items.push(batch(p, 0, 1 + (p / 10) % 2, true)),
        }
    }
    let mut whole = Vec::new();
    for b in &items {
        whole.extend(
            (0..b.envelopes.len() as u64).map(|k| (b.envelopes[0].position.unwrap().0, b.offset + k)),
        );
    }
    let positions = items.iter().filter_map(|b| b.position).map(|p| p.0).collect();
    (items, whole, positions)
}

/// Runs one pipeline over `stream` with the sinks `recorded` (sink `i` taking `delays[i]` per
/// apply) and a source resumed from `confirmed`.
#[allow(clippy::too_many_arguments)]
fn run_once(
    stream: &MemoryStream,
    items: &[Batch],
    confirmed: &Arc<Mutex<Option<Position>>>,
    recorded: &[MemorySink],
    delays: &[Duration],
    halt: impl FnOnce(StopHandle) -> Halt,
    configure: impl FnOnce(Pipeline<MemoryStream>) -> Pipeline<MemoryStream>,
    rows: u64,
) -> (Result<PipelineReport, super::PipelineError>, Vec<Request>) {
    let mut pipeline =
        Pipeline::new(stream.clone()).tick(Duration::from_millis(2)).max_run(2).drain_timeout(Duration::ZERO);
    for ((sink, r), delay) in stream.sinks().iter().zip(recorded).zip(delays) {
        let (r, delay) = (r.clone(), *delay);
        pipeline = pipeline
            .sink(sink.as_str(), move || Ok::<_, std::convert::Infallible>(r.clone().with_delay(delay)));
    }
    let pipeline = configure(pipeline);
    let mut source = Replaying::resume(items, confirmed, halt(pipeline.stop_handle()));
    source.rows = rows;
    let result = pipeline.run(&mut source);
    let requests = source.requests.lock().unwrap().clone();
    (result, requests)
}

/// Crashes (or stops) an ingest after `halts[i]` items, again and again, each restarted source
/// resuming from its confirmed position over the same lanes (one sink slow: its lane holds
/// published, unacked items beyond the watermark, chunks of a large transaction among them),
/// then runs one to the end: every sink applied every envelope once, in order.
fn restarts(halts: &[usize], stop: bool, delays: [Duration; 2]) {
    let (items, whole, positions) = workload();
    let stream = MemoryStream::builder().capacity(8).sinks(["fast", "slow"]).build().unwrap();
    let recorded = [MemorySink::default(), MemorySink::default()];
    let confirmed = Arc::new(Mutex::new(None));
    let mut ended = None;
    for &n in halts {
        let (result, _) = run_once(
            &stream,
            &items,
            &confirmed,
            &recorded,
            &delays,
            |handle| if stop { Halt::StopAfter(n, handle) } else { Halt::CrashAfter(n) },
            |p| p,
            0,
        );
        match (stop, result) {
            (true, Ok(report)) if report.stopped => {}
            (false, Err(super::PipelineError::Source(e))) => assert!(e.to_string().contains("crashed")),
            // A resumed source with fewer than `n` items left reaches its end: the lanes are
            // closed (final), so this was the last run.
            (_, Ok(report)) if !report.stopped => {
                ended = Some(report);
                break;
            }
            (_, other) => panic!("halt after {n} (stop: {stop}): {other:?}"),
        }
    }
    let report = match ended {
        Some(report) => report,
        None => {
            let (result, _) =
                run_once(&stream, &items, &confirmed, &recorded, &delays, |_| Halt::Never, |p| p, 0);
            result.expect("the last run ends")
        }
    };
    assert!(!report.stopped);
    assert_eq!(report.confirmed, Some(Position(100)));
    assert_eq!(*confirmed.lock().unwrap(), Some(Position(100)));
    for (sink, r) in ["fast", "slow"].iter().zip(&recorded) {
        assert_eq!(r.envelopes(), whole, "{sink}: every envelope applied once, in order (halts {halts:?})");
        assert_eq!(r.transactions(), positions, "{sink}: every transaction once, in order");
        assert_eq!(r.committed().as_ref().unwrap().position, Some(Position(100)));
    }
    assert!(stream.is_idle());
}

#[test]
fn adv_crashed_ingests_restarted_over_lanes_holding_unacked_items_apply_everything_once() {
    let delays = [Duration::ZERO, Duration::from_millis(3)];
    // Single crashes at every point (mid-chunked transactions 30 (items 3..=5) and 60 included).
    for n in 0..=items_len() {
        restarts(&[n], false, delays);
    }
    // Crash after crash, each before the slow sink caught up.
    restarts(&[4, 5, 7, 9, 12], false, delays);
}

#[test]
fn adv_stopped_ingests_restarted_over_lanes_holding_unacked_items_apply_everything_once() {
    let delays = [Duration::from_millis(1), Duration::from_millis(4)];
    for n in [1, 3, 4, 5, 8, 10, 13] {
        restarts(&[n], true, delays);
    }
    restarts(&[2, 4, 4, 9, 11], true, delays);
}

/// The slow sink and the fast one swapped: the lane of the first sink lags.
#[test]
fn adv_a_restart_where_the_first_sink_acked_less_than_the_second_applies_everything_once() {
    for n in [2, 4, 6, 9] {
        restarts(&[n], false, [Duration::from_millis(4), Duration::ZERO]);
    }
}

fn items_len() -> usize {
    workload().0.len()
}

/// A backfill (explicit, `Pipeline::backfill`) whose serving the ingest crashes in: its request
/// is unacked (R2), so the restarted ingest gets it again; every sink ends with every row, one
/// `SnapshotComplete` at least, owing nothing, and every transaction once in order.
fn backfill_restart(crash_after_snapshot: usize) -> (Vec<Request>, Vec<MemorySink>, PipelineReport) {
    let (items, whole, positions) = workload();
    let stream = MemoryStream::builder().capacity(8).sinks(["fast", "slow"]).build().unwrap();
    let recorded = vec![MemorySink::default(), MemorySink::default()];
    let confirmed = Arc::new(Mutex::new(None));
    let delays = [Duration::ZERO, Duration::from_millis(2)];
    let t = IndexName::new("t").unwrap();
    let (first, mut requests) = run_once(
        &stream,
        &items,
        &confirmed,
        &recorded,
        &delays,
        |_| Halt::CrashAfterSnapshot(crash_after_snapshot),
        |p| p.backfill([t.clone()]),
        5,
    );
    assert!(matches!(first, Err(super::PipelineError::Source(_))), "{first:?}");
    let (last, more) = run_once(&stream, &items, &confirmed, &recorded, &delays, |_| Halt::Never, |p| p, 5);
    requests.extend(more);
    let report = last.expect("the restarted pipeline ends");
    for (sink, r) in ["fast", "slow"].iter().zip(&recorded) {
        let applied = r.applied().clone();
        let live: Vec<(u64, u64)> = r.envelopes_of(&applied, true);
        assert_eq!(live, whole, "{sink}: every change once, in order");
        assert_eq!(r.transactions(), positions);
        let mut rows: Vec<String> = Vec::new();
        for item in &applied {
            if let LaneItem::Batch(b) = item {
                rows.extend(b.envelopes.iter().filter(|e| e.position.is_none()).map(|e| e.id.clone()));
            }
        }
        rows.sort();
        rows.dedup();
        assert_eq!(rows, ["r0", "r1", "r2", "r3", "r4"], "{sink}: every snapshot row at least once");
        let completes = applied.iter().filter(|i| matches!(i, LaneItem::SnapshotComplete { .. })).count();
        assert!(completes >= 1, "{sink}: its SnapshotComplete");
        let state = r.committed().clone().unwrap();
        assert!(state.owed.is_empty(), "{sink}: owes nothing: {state:?}");
    }
    assert!(stream.is_idle(), "every request acked");
    (requests, recorded, report)
}

impl MemorySink {
    /// `(commit position, offset)` of the change envelopes of `items` (`changes`: those with a
    /// position).
    fn envelopes_of(&self, items: &[LaneItem], changes: bool) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for item in items {
            if let LaneItem::Batch(b) = item {
                for (k, e) in b.envelopes.iter().enumerate() {
                    if e.position.is_some() == changes {
                        out.push((e.position.map_or(0, |p| p.0), b.offset + k as u64));
                    }
                }
            }
        }
        out
    }
}

#[test]
fn adv_a_backfill_interrupted_by_a_crash_is_served_again_after_the_restart() {
    for n in [0, 1, 2, 3, 4, 5] {
        backfill_restart(n);
    }
}

/// R2: "a resumed snapshot re-sends at most what the sink had not made durable". An ingest
/// crashes while serving the backfills (each sink has rows of it durable, `after` in its
/// state); after the restart the stale request (`after: None`, unacked, so redelivered) is
/// served as well as the restarted engine's (`after` its last row): rows the sink had made
/// durable are sent again, and each sink gets two `SnapshotComplete`s.
#[test]
fn adv_r2_a_backfill_resumed_after_a_crash_re_sends_no_row_the_sink_made_durable() {
    let (items, _, positions) = workload();
    let stream = MemoryStream::builder().capacity(8).sinks(["fast", "slow"]).build().unwrap();
    let recorded = vec![MemorySink::default(), MemorySink::default()];
    let confirmed = Arc::new(Mutex::new(None));
    let delays = [Duration::ZERO, Duration::from_millis(2)];
    let t = IndexName::new("t").unwrap();
    // Five snapshot items handed over: the first sink served has its whole backfill, the other
    // its first two rows (durable before the crash: `after` r1 in its state).
    let (first, _) = run_once(
        &stream,
        &items,
        &confirmed,
        &recorded,
        &delays,
        |_| Halt::CrashAfterSnapshot(5),
        |p| p.backfill([t.clone()]),
        5,
    );
    assert!(matches!(first, Err(super::PipelineError::Source(_))), "{first:?}");
    let split: Vec<usize> = recorded.iter().map(|r| r.applied().len()).collect();
    let durable: Vec<Option<u64>> = recorded
        .iter()
        .map(|r| {
            let state = r.committed().clone().unwrap();
            state.owed.first().and_then(|o| o.after.as_ref()).map(|id| id[1..].parse().unwrap())
        })
        .collect();
    assert!(
        durable.iter().any(Option::is_some),
        "some rows were durable at the crash: {durable:?} {:?} {:?}",
        recorded.iter().map(|r| r.committed().clone()).collect::<Vec<_>>(),
        recorded.iter().map(|r| r.applied().clone()).collect::<Vec<_>>()
    );
    let (last, requests) =
        run_once(&stream, &items, &confirmed, &recorded, &delays, |_| Halt::Never, |p| p, 5);
    last.expect("the restarted pipeline ends");
    for (i, r) in recorded.iter().enumerate() {
        assert_eq!(r.transactions(), positions);
        assert!(r.committed().as_ref().unwrap().owed.is_empty());
        if durable[i].is_none() {
            continue; // its backfill completed before the crash
        }
        let applied = r.applied()[split[i]..].to_vec();
        let again: Vec<String> = applied
            .iter()
            .filter_map(|item| match item {
                LaneItem::Batch(b) if b.position.is_none() => Some(b.envelopes.iter()),
                _ => None,
            })
            .flatten()
            .filter(|e| e.position.is_none())
            .map(|e| e.id.clone())
            .filter(|id| durable[i].is_some_and(|d| id[1..].parse::<u64>().unwrap() <= d))
            .collect();
        assert_eq!(
            again,
            Vec::<String>::new(),
            "sink {i}: rows it had made durable (up to r{:?}) sent again; requests served after the restart: {requests:?}",
            durable[i]
        );
        let completes = applied.iter().filter(|i| matches!(i, LaneItem::SnapshotComplete { .. })).count();
        assert_eq!(completes, 1, "sink {i}: one SnapshotComplete; requests: {requests:?}");
    }
}

/// The stop ([`StopHandle`]) of a live pipeline whose ingest is publishing a backfill's snapshot
/// while the ring is full: the lane `remote` is served by another process (no local engine), now
/// down, so its gaps are never passed and the ring (capacity 2) fills. A live batch's publish
/// waits in slices, confirming and checking the stop; a snapshot item's `publish_to`
/// (ingest.rs, `SourceItem::Snapshot`) blocks with no deadline, so the stop is never seen and
/// `run` never returns.
#[test]
fn adv_a_stop_ends_a_pipeline_blocked_publishing_a_snapshot() {
    let stream = MemoryStream::builder().capacity(2).sinks(["local", "remote"]).build().unwrap();
    stream
        .request_sender()
        .publish(Request::backfill(
            crate::SinkName::new("local").unwrap(),
            vec![IndexName::new("t").unwrap()],
        ))
        .unwrap();
    let local = MemorySink::default();
    let pipeline = Pipeline::new(stream.clone())
        .tick(Duration::from_millis(2))
        .drain_timeout(Duration::ZERO)
        .sink("local", {
            let r = local.clone();
            move || Ok::<_, std::convert::Infallible>(r.clone())
        });
    let stop = pipeline.stop_handle();
    let confirmed = Arc::new(Mutex::new(None));
    let mut source = Replaying::resume(&[], &confirmed, Halt::Never);
    (source.rows, source.endless) = (10, true);
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(pipeline.run(&mut source));
    });
    // The snapshot's first rows reach `local`; then the ring is full.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while local.applied().len() < 2 {
        assert!(std::time::Instant::now() < deadline, "the backfill's first rows never arrived");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50));
    stop.stop();
    let report = ended.recv_timeout(Duration::from_secs(5)).expect("the stop ends the pipeline within 5 s");
    assert!(report.expect("a stop is Ok").stopped);
}

/// The control of the test above: the same full ring (a `remote` lane nobody serves), filled by
/// live batches: the publish waits in slices and sees the stop; what `local` applied is what
/// was published, in order, and the source is confirmed no further than the watermark (none:
/// `remote` acked nothing).
#[test]
fn adv_a_stop_ends_a_pipeline_waiting_for_room_for_a_live_batch() {
    let stream = MemoryStream::builder().capacity(2).sinks(["local", "remote"]).build().unwrap();
    let local = MemorySink::default();
    let pipeline = Pipeline::new(stream.clone())
        .tick(Duration::from_millis(2))
        .drain_timeout(Duration::ZERO)
        .sink("local", {
            let r = local.clone();
            move || Ok::<_, std::convert::Infallible>(r.clone())
        });
    let stop = pipeline.stop_handle();
    let confirmed = Arc::new(Mutex::new(None));
    let (items, _, positions) = workload();
    let mut source = Replaying::resume(&items, &confirmed, Halt::Never);
    source.endless = true;
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(pipeline.run(&mut source));
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while local.applied().len() < 2 {
        assert!(std::time::Instant::now() < deadline, "the first batches never arrived");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50));
    stop.stop();
    let report = ended.recv_timeout(Duration::from_secs(5)).expect("the stop ends the pipeline");
    let report = report.expect("a stop is Ok");
    assert!(report.stopped && report.drain_timed_out, "{report:?}");
    assert_eq!(report.confirmed, None, "`remote` acked nothing");
    assert_eq!(*confirmed.lock().unwrap(), None);
    let applied = local.transactions();
    assert_eq!(applied, positions[..applied.len()], "a prefix, in order");
    assert_eq!(stream.stats("local").unwrap().published, 2, "the ring's two cells, nothing more");
}

/// A transactional recording sink: `apply` stages, `commit` makes the staged items and the
/// state durable together (or fails, every `fail_every`-th commit across instances, keeping
/// nothing: the engine reopens it and the run is redelivered).
struct Transactional {
    rec: MemorySink,
    staged: Vec<LaneItem>,
    delay: Duration,
    commits: Arc<std::sync::atomic::AtomicUsize>,
    fail_every: usize,
}

impl Sink for Transactional {
    type Error = std::io::Error;

    fn state(&mut self) -> Result<Option<SinkState>, Self::Error> {
        self.staged.clear();
        Ok(self.rec.committed().clone())
    }

    fn apply(&mut self, items: &[LaneItem]) -> Result<(), Self::Error> {
        std::thread::sleep(self.delay);
        self.staged.extend_from_slice(items);
        Ok(())
    }

    fn commit(&mut self, state: &SinkState) -> Result<(), Self::Error> {
        let n = self.commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if self.fail_every > 0 && n % self.fail_every == 0 {
            self.staged.clear();
            return Err(std::io::Error::other("the sink's commit failed"));
        }
        self.rec.applied().append(&mut self.staged);
        *self.rec.committed() = Some(state.clone());
        Ok(())
    }
}

/// The large transactions 30 and 60 of [`workload`] chunked otherwise (a restarted source
/// configured with another chunk size): `[3, 2]`, or whole (one positioned batch).
fn rechunked(whole: bool) -> Vec<Batch> {
    let mut items = Vec::new();
    for p in (10..=100).step_by(10) {
        match (p, whole) {
            (30 | 60, true) => items.push(batch(p, 0, 5, true)),
            (30 | 60, false) => items.extend([batch(p, 0, 3, false), batch(p, 3, 2, true)]),
            _ => items.push(batch(p, 0, 1 + (p / 10) % 2, true)),
        }
    }
    items
}

struct Adverse {
    capacity: usize,
    max_run: usize,
    /// The restarted source resumes from its start, not from its confirmed position (a
    /// confirm that did not reach it).
    forgetful: bool,
    /// What each restarted source sends (the first run sends [`workload`]).
    later: Vec<Batch>,
    fail_every: usize,
    delays: [Duration; 2],
}

/// [`restarts`] with the knobs of `cfg`: crashes after each of `halts` items, then a run to the
/// end; the sinks' committed output is every envelope once, in order.
fn adverse_restarts(cfg: &Adverse, halts: &[usize]) {
    let (first_items, whole, positions) = workload();
    let stream = MemoryStream::builder().capacity(cfg.capacity).sinks(["fast", "slow"]).build().unwrap();
    let recorded = [MemorySink::default(), MemorySink::default()];
    let confirmed = Arc::new(Mutex::new(None));
    let commits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let run = |items: &[Batch], halt: Halt| {
        let mut pipeline = Pipeline::new(stream.clone())
            .tick(Duration::from_millis(2))
            .max_run(cfg.max_run)
            .retry(super::RetryPolicy {
                attempts: 10,
                initial_backoff: Duration::from_millis(1),
                max_backoff: Duration::from_millis(5),
            });
        for ((sink, r), delay) in ["fast", "slow"].iter().zip(&recorded).zip(cfg.delays) {
            let (r, commits, fail_every) = (r.clone(), commits.clone(), cfg.fail_every);
            pipeline = pipeline.sink(*sink, move || {
                Ok::<_, std::io::Error>(Transactional {
                    rec: r.clone(),
                    staged: Vec::new(),
                    delay,
                    commits: commits.clone(),
                    fail_every,
                })
            });
        }
        let from = if cfg.forgetful { Arc::new(Mutex::new(None)) } else { confirmed.clone() };
        let mut source = Replaying::resume(items, &from, halt);
        source.confirmed = confirmed.clone();
        pipeline.run(&mut source)
    };
    let mut ended = None;
    for (i, &n) in halts.iter().enumerate() {
        let items = if i == 0 { &first_items } else { &cfg.later };
        match run(items, Halt::CrashAfter(n)) {
            Err(super::PipelineError::Source(e)) => assert!(e.to_string().contains("crashed")),
            Ok(report) => {
                ended = Some(report);
                break;
            }
            Err(e) => panic!("crash after {n}: {e}"),
        }
    }
    let report = match ended {
        Some(r) => r,
        None => run(&cfg.later, Halt::Never).expect("the last run ends"),
    };
    assert_eq!(report.confirmed, Some(Position(100)), "{report:?}");
    for (sink, r) in ["fast", "slow"].iter().zip(&recorded) {
        assert_eq!(r.envelopes(), whole, "{sink}: every envelope once, in order (halts {halts:?})");
        assert_eq!(r.transactions(), positions, "{sink}: every transaction once, in order");
    }
    assert!(stream.is_idle());
}

#[test]
fn adv_restarts_with_tight_rings_big_runs_forgetful_sources_rechunking_and_failing_commits() {
    let slow = [Duration::ZERO, Duration::from_millis(2)];
    let cases = [
        Adverse {
            capacity: 1,
            max_run: 1,
            forgetful: false,
            later: workload().0,
            fail_every: 0,
            delays: slow,
        },
        Adverse {
            capacity: 16,
            max_run: 256,
            forgetful: false,
            later: workload().0,
            fail_every: 0,
            delays: slow,
        },
        Adverse {
            capacity: 8,
            max_run: 3,
            forgetful: true,
            later: workload().0,
            fail_every: 0,
            delays: slow,
        },
        Adverse {
            capacity: 8,
            max_run: 2,
            forgetful: false,
            later: rechunked(true),
            fail_every: 0,
            delays: slow,
        },
        Adverse {
            capacity: 8,
            max_run: 2,
            forgetful: true,
            later: rechunked(false),
            fail_every: 0,
            delays: slow,
        },
        Adverse {
            capacity: 4,
            max_run: 2,
            forgetful: false,
            later: workload().0,
            fail_every: 3,
            delays: slow,
        },
        Adverse {
            capacity: 8,
            max_run: 256,
            forgetful: true,
            later: rechunked(false),
            fail_every: 4,
            delays: slow,
        },
    ];
    for (c, cfg) in cases.iter().enumerate() {
        for halts in [&[3][..], &[4], &[5], &[8], &[4, 2, 3], &[5, 6, 1, 9]] {
            let result = std::panic::catch_unwind(|| adverse_restarts(cfg, halts));
            assert!(result.is_ok(), "case {c}, halts {halts:?}");
        }
    }
}

/// Tables that join while running (P2): one transaction touches 65 indexes the sink neither
/// holds nor is owed, so its engine owes 65 backfills and asks for each (engine.rs `ask`, a
/// blocking publish on the request lane) after the run's commit and before its ack. The request
/// lane holds 64 (the default); requests stay unacked until their `SnapshotComplete` is
/// published (R2), and the ingest publishes the snapshots with a blocking `publish_to`. The
/// ring (8) fills with the first snapshot while the engine, blocked on the 65th ask, never acks
/// its run: each waits for the other.
#[test]
fn adv_p2_more_joining_tables_than_the_request_lane_holds_are_all_backfilled() {
    joining_tables(65);
}

/// The control: 40 joining tables, whose requests the request lane holds.
#[test]
fn adv_p2_tables_joining_while_running_are_all_backfilled() {
    joining_tables(40);
}

fn joining_tables(n: usize) {
    let stream = MemoryStream::builder().capacity(8).sinks(["a"]).build().unwrap();
    let joined: Vec<IndexName> = (0..n).map(|i| IndexName::new(format!("u{i}")).unwrap()).collect();
    let envelopes: Arc<[Envelope]> = joined
        .iter()
        .map(|index| Envelope {
            index: index.clone(),
            id: "1".into(),
            op: Op::Upsert,
            position: Some(Position(10)),
            document: Bytes::new(),
            built_at_micros: None,
            relation: None,
            old_id: None,
            unchanged: Vec::new(),
        })
        .collect();
    let items = vec![Batch::new(Some(Position(10)), envelopes)];
    let a = MemorySink::default();
    let pipeline = Pipeline::new(stream.clone()).tick(Duration::from_millis(2)).sink("a", {
        let r = a.clone();
        move || Ok::<_, std::convert::Infallible>(r.clone())
    });
    let stop = pipeline.stop_handle();
    let confirmed = Arc::new(Mutex::new(None));
    let mut source = Replaying::resume(&items, &confirmed, Halt::Never);
    (source.rows, source.indexes) = (20, Some(vec![IndexName::new("t").unwrap()]));
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(pipeline.run(&mut source));
    });
    let report = match ended.recv_timeout(Duration::from_secs(20)) {
        Ok(r) => r.expect("the pipeline ends"),
        Err(_) => {
            stop.stop();
            panic!(
                "no end in 20 s: the sink applied {} items, its state {:?}",
                a.applied().len(),
                a.committed()
            );
        }
    };
    assert_eq!(report.backfills_served, n as u64, "{report:?}");
    let state = a.committed().clone().unwrap();
    assert!(state.owed.is_empty(), "{state:?}");
    let held = state.indexes.unwrap();
    assert!(joined.iter().all(|i| held.contains(i)), "every joined table held: {held:?}");
    let completes = a.applied().iter().filter(|i| matches!(i, LaneItem::SnapshotComplete { .. })).count();
    assert_eq!(completes, n);
}

/// The state the deadlock above leaves (65 backfills owed, each of its own) is durable: a
/// restarted pipeline's engine asks for them all at start (engine.rs `ask`, before it receives
/// anything), blocks on the 65th, and the ingest's snapshot `publish_to` waits for room that
/// engine never frees: every restart deadlocks again. Control: 40 owed.
#[test]
fn adv_p3_a_restart_owing_more_backfills_than_the_request_lane_holds_serves_them_all() {
    restart_owing(65);
}

#[test]
fn adv_p3_a_restart_owing_backfills_serves_them_all() {
    restart_owing(40);
}

fn restart_owing(n: usize) {
    let stream = MemoryStream::builder().capacity(8).sinks(["a"]).build().unwrap();
    let t = IndexName::new("t").unwrap();
    let joined: Vec<IndexName> = (0..n).map(|i| IndexName::new(format!("u{i}")).unwrap()).collect();
    let mut state = SinkState::new();
    state.indexes = Some([t.clone()].into_iter().collect());
    for index in &joined {
        state.owe(std::slice::from_ref(index), true);
    }
    assert_eq!(state.owed.len(), n);
    let a = MemorySink::default();
    *a.committed() = Some(state);
    let pipeline = Pipeline::new(stream.clone()).tick(Duration::from_millis(2)).sink("a", {
        let r = a.clone();
        move || Ok::<_, std::convert::Infallible>(r.clone())
    });
    let stop = pipeline.stop_handle();
    let confirmed = Arc::new(Mutex::new(None));
    let mut source = Replaying::resume(&[txn(10)], &confirmed, Halt::Never);
    (source.rows, source.indexes) = (20, Some(vec![t]));
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(pipeline.run(&mut source));
    });
    let report = match ended.recv_timeout(Duration::from_secs(20)) {
        Ok(r) => r.expect("the pipeline ends"),
        Err(_) => {
            stop.stop();
            panic!("no end in 20 s: the sink applied {} items", a.applied().len());
        }
    };
    assert_eq!(report.backfills_served, n as u64, "{report:?}");
    let state = a.committed().clone().unwrap();
    assert!(state.owed.is_empty(), "{state:?}");
    assert_eq!(state.position, Some(Position(10)));
    let applied = a.applied().clone();
    assert_eq!(applied.iter().filter(|i| matches!(i, LaneItem::SnapshotComplete { .. })).count(), n);
    let rows = applied
        .iter()
        .filter_map(|i| match i {
            LaneItem::Batch(b) if b.position.is_none() => Some(b.envelopes.len()),
            _ => None,
        })
        .sum::<usize>();
    assert_eq!(rows, 20 * n, "every row of every joined table");
}

/// The ingest crashes and restarts again and again under sink engines that keep running
/// (`run_sink`, as a broker's sink processes), over a `MemoryStream`: each restarted ingest
/// claims the fan-out while an engine is mid-run. Every envelope once, in order.
#[test]
fn adv_an_ingest_restarted_under_running_sink_engines_feeds_each_every_envelope_once() {
    for crashes in [&[3usize, 4, 5][..], &[1, 2, 6, 2], &[9, 1, 1, 1, 4], &[0, 0, 13]] {
        let (items, whole, positions) = workload();
        let stream = MemoryStream::builder().capacity(4).sinks(["fast", "slow"]).build().unwrap();
        let recorded = [MemorySink::default(), MemorySink::default()];
        let engines: Vec<_> = ["fast", "slow"]
            .into_iter()
            .zip(recorded.iter().cloned())
            .zip([Duration::ZERO, Duration::from_millis(3)])
            .map(|((sink, r), delay)| {
                let stream = stream.clone();
                std::thread::spawn(move || {
                    super::run_sink(
                        &stream,
                        sink,
                        move || Ok::<_, std::convert::Infallible>(r.clone().with_delay(delay)),
                        super::RetryPolicy::default(),
                        2,
                        &StopHandle::new(),
                    )
                })
            })
            .collect();
        let confirmed = Arc::new(Mutex::new(None));
        let mut ended = None;
        for &n in crashes {
            let mut source = Replaying::resume(&items, &confirmed, Halt::CrashAfter(n));
            match Pipeline::new(stream.clone()).tick(Duration::from_millis(2)).run(&mut source) {
                Err(super::PipelineError::Source(e)) => assert!(e.to_string().contains("crashed")),
                Ok(report) => {
                    ended = Some(report);
                    break;
                }
                Err(e) => panic!("crash after {n}: {e}"),
            }
            std::thread::sleep(Duration::from_millis(3));
        }
        let report = ended.unwrap_or_else(|| {
            let mut source = Replaying::resume(&items, &confirmed, Halt::Never);
            Pipeline::new(stream.clone())
                .tick(Duration::from_millis(2))
                .run(&mut source)
                .expect("the last run")
        });
        assert_eq!(report.confirmed, Some(Position(100)), "{report:?}");
        for engine in engines {
            engine.join().unwrap().expect("the engine drains its closed lane and ends");
        }
        for (sink, r) in ["fast", "slow"].iter().zip(&recorded) {
            assert_eq!(r.envelopes(), whole, "{sink}: every envelope once, in order (crashes {crashes:?})");
            assert_eq!(r.transactions(), positions);
        }
    }
}

/// A sink is named once: `Pipeline::in_memory` builds the stream's lanes from the sink engines,
/// and every engine gets every transaction.
#[test]
fn in_memory_makes_one_lane_per_sink_named_once() {
    let (search, cache) = (MemorySink::new(), MemorySink::new());
    let mut pipeline =
        Pipeline::in_memory(MemoryStream::builder().capacity(4)).tick(Duration::from_millis(2));
    for (name, sink) in [("search", &search), ("cache", &cache)] {
        let sink = sink.clone();
        pipeline = pipeline.sink(name, move || Ok::<_, std::convert::Infallible>(sink.clone()));
    }
    let mut source = Items((1..=10).map(|p| SourceItem::Change(txn(p))).collect());
    let report = pipeline.run(&mut source).expect("the pipeline runs");
    assert_eq!((report.transactions, report.confirmed), (10, Some(Position(10))));
    for sink in [&search, &cache] {
        let positions: Vec<_> = sink.applied().iter().filter_map(LaneItem::position).collect();
        assert_eq!(positions, (1..=10).map(Position).collect::<Vec<_>>());
    }
}

/// A sink engine whose name is no lane of the given stream is refused by `run` before anything
/// starts, naming the sink and the lanes (before: the engine failed at attach, mid-start).
#[test]
fn a_sink_named_for_no_lane_of_the_stream_is_refused_before_anything_starts() {
    let stream = MemoryStream::builder().sinks(["search"]).build().unwrap();
    let typo = MemorySink::new();
    let pipeline = Pipeline::new(stream.clone()).sink("serach", {
        let typo = typo.clone();
        move || Ok::<_, std::convert::Infallible>(typo.clone())
    });
    let mut source = Items([SourceItem::Change(txn(1))].into_iter().collect());
    let e = pipeline.run(&mut source).unwrap_err();
    assert!(e.to_string().contains("\"serach\"") && e.to_string().contains("[\"search\"]"), "{e}");
    assert!(typo.applied().is_empty() && typo.committed().is_none());
    assert_eq!(published(&stream, "search"), (0, None), "nothing was published");
}

/// `Pipeline::backfill` of an index the source does not have (by its `SourceStart` list) is
/// refused at start, naming the index, before anything is owed: a typo must not be completed as
/// "nothing to backfill" (which a source does for an owed index whose table went away).
#[test]
fn p2_an_explicit_backfill_of_an_index_the_source_does_not_have_is_refused_at_start() {
    let stream = MemoryStream::builder().sinks(["a"]).build().unwrap();
    let a = MemorySink::default();
    let pipeline = Pipeline::new(stream)
        .tick(Duration::from_millis(2))
        .backfill([IndexName::new("public_typo").unwrap()])
        .sink("a", {
            let a = a.clone();
            move || Ok::<_, std::convert::Infallible>(a.clone())
        });
    let confirmed = Arc::new(Mutex::new(None));
    let mut source = Replaying::resume(&[txn(10)], &confirmed, Halt::Never);
    source.indexes = Some(vec![IndexName::new("public_t").unwrap()]);
    let e = pipeline.run(&mut source).expect_err("refused").to_string();
    assert!(e.contains("public_typo") && e.contains("Pipeline::backfill"), "{e}");
    assert!(source.requests.lock().unwrap().is_empty(), "nothing asked");
    assert!(a.committed().as_ref().is_none_or(|s| s.owed.is_empty()), "nothing owed: {:?}", a.committed());
}

/// Hands over its transactions, takes backfill requests and never serves them (a live
/// source's backfill waits for its stream), then has nothing more.
struct Unserved {
    items: VecDeque<SourceItem>,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl Source for Unserved {
    type Error = std::io::Error;

    fn next(&mut self, timeout: Duration) -> Result<Option<SourceItem>, Self::Error> {
        match self.items.pop_front() {
            Some(item) => Ok(Some(item)),
            None => {
                std::thread::sleep(timeout);
                Ok(None)
            }
        }
    }

    fn confirm(&mut self, _: Position) -> Result<(), Self::Error> {
        Ok(())
    }

    fn backfill(&mut self, request: Request) -> Result<(), Self::Error> {
        self.requests.lock().unwrap().push(request);
        Ok(())
    }

    fn start(&mut self, _: &[SinkStart<'_>]) -> Result<SourceStart, Self::Error> {
        Ok(SourceStart::default())
    }
}

/// P3 at a stop: a stop while a backfill is being served returns once everything published is
/// acked, not at the drain timeout (it reads the source no more, so the backfill could never
/// complete: before, it waited the whole timeout, spinning), and the sink still owes the
/// backfill, durably, to ask for it again at its next start.
#[test]
fn p3_a_stop_while_a_backfill_is_served_returns_once_acked_and_the_backfill_stays_owed() {
    let stream = MemoryStream::builder().sinks(["a"]).build().unwrap();
    let a = MemorySink::default();
    let t = IndexName::new("t").unwrap();
    let pipeline = Pipeline::new(stream)
        .tick(Duration::from_millis(2))
        .drain_timeout(Duration::from_secs(20))
        .backfill([t.clone()])
        .sink("a", {
            let a = a.clone();
            move || Ok::<_, std::convert::Infallible>(a.clone())
        });
    let stop = pipeline.stop_handle();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let mut source = Unserved {
        items: [txn(10), txn(20)].into_iter().map(SourceItem::Change).collect(),
        requests: requests.clone(),
    };
    let running = std::thread::spawn(move || pipeline.run(&mut source));
    let asked_by = std::time::Instant::now() + Duration::from_secs(10);
    while requests.lock().unwrap().is_empty() || a.transactions() != [10, 20] {
        assert!(std::time::Instant::now() < asked_by, "the backfill asked and both transactions applied");
        std::thread::sleep(Duration::from_millis(2));
    }
    let asked = std::time::Instant::now();
    stop.stop();
    let report = running.join().unwrap().expect("the pipeline stops");
    assert!(asked.elapsed() < Duration::from_secs(5), "the stop took {:?}", asked.elapsed());
    assert!(!report.drain_timed_out, "drained, not timed out");
    let state = a.committed().clone().expect("a state");
    assert_eq!(state.owed.len(), 1, "the backfill still owed: {state:?}");
    assert_eq!(state.owed[0].indexes, [t]);
}

/// P2, a table that rejoins the source: a transaction's [`Op::Resync`] envelopes reach the sink
/// as truncates, and the commit that applies them owes each index a backfill of its own, from
/// its first row: the index is no longer held, an owed backfill that named it goes on without
/// it, and the engine asks for each new backfill once, and not again for the one it asked
/// before (the last index of which was resynced: its asked list is known by what it has left).
#[test]
fn p2_a_resync_reaches_the_sink_as_a_truncate_and_is_owed_again_in_the_same_commit() {
    use super::state::OwedBackfill;
    let stream = MemoryStream::builder().sinks(["a"]).build().unwrap();
    let a = MemorySink::default();
    let [t, u, v] = ["t", "u", "v"].map(|n| IndexName::new(n).unwrap());
    *a.committed() = Some(SinkState {
        position: Some(Position(5)),
        owed: vec![OwedBackfill { indexes: vec![u.clone(), t.clone()], after: Some("7".into()) }],
        indexes: Some([v.clone()].into_iter().collect()),
        ..SinkState::new()
    });
    let resync = |index: &IndexName| Envelope {
        index: index.clone(),
        id: String::new(),
        op: Op::Resync,
        position: Some(Position(20)),
        document: Bytes::new(),
        built_at_micros: None,
        relation: None,
        old_id: None,
        unchanged: Vec::new(),
    };
    let pipeline = Pipeline::new(stream).tick(Duration::from_millis(2)).sink("a", {
        let a = a.clone();
        move || Ok::<_, std::convert::Infallible>(a.clone())
    });
    let stop = pipeline.stop_handle();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let mut source = Unserved {
        items: [txn(10), Batch::new(Some(Position(20)), vec![resync(&t), resync(&v)].into())]
            .into_iter()
            .map(SourceItem::Change)
            .collect(),
        requests: requests.clone(),
    };
    let running = std::thread::spawn(move || pipeline.run(&mut source));
    let by = std::time::Instant::now() + Duration::from_secs(10);
    while requests.lock().unwrap().len() < 3 || a.transactions() != [10, 20] {
        assert!(
            std::time::Instant::now() < by,
            "asked {:?}, applied {:?}",
            requests.lock().unwrap(),
            a.transactions()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(50)); // a request asked twice would come by now
    stop.stop();
    running.join().unwrap().expect("the pipeline stops");
    let applied = a.applied().clone();
    let LaneItem::Batch(b) = applied.iter().find(|i| i.position() == Some(Position(20))).unwrap() else {
        panic!("a batch")
    };
    let ops: Vec<(IndexName, Op)> = b.envelopes.iter().map(|e| (e.index.clone(), e.op)).collect();
    assert_eq!(ops, [(t.clone(), Op::Truncate), (v.clone(), Op::Truncate)], "the sink sees truncates only");
    let state = a.committed().clone().unwrap();
    assert_eq!(state.position, Some(Position(20)));
    assert_eq!(
        state.owed,
        [
            OwedBackfill { indexes: vec![u.clone()], after: Some("7".into()) },
            OwedBackfill { indexes: vec![t.clone()], after: None },
            OwedBackfill { indexes: vec![v.clone()], after: None },
        ]
    );
    assert_eq!(state.indexes, Some(Default::default()), "v is held no more");
    let asked: Vec<(Vec<IndexName>, Option<String>)> = requests
        .lock()
        .unwrap()
        .iter()
        .map(|Request::Backfill { indexes, after, .. }| (indexes.clone(), after.clone()))
        .collect();
    assert_eq!(asked, [(vec![u, t.clone()], Some("7".into())), (vec![t], None), (vec![v], None)]);
}
