//! Contract tests of the pipeline library's driver and `Sink` side, each named after its rule,
//! on the in-memory stream with a fake in-memory source (no PostgreSQL).

use std::collections::{BTreeSet, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use lanestream::{Batch, Envelope, IndexName, LaneItem, MemoryStream, Op, Position, Request, Stream};
use lanestream_postgres::ndjson::DurableNdjson;
use lanestream_postgres::pipeline::{
    OwedBackfill, Pipeline, PipelineError, RetryPolicy, Sink, SinkState, Source, SourceItem, StopHandle,
};

const SINKS: [&str; 3] = ["search", "cache", "archive"];

fn batch(lsn: u64, envelopes: usize) -> Batch {
    let envelopes: Vec<Envelope> = (0..envelopes)
        .map(|i| Envelope {
            index: IndexName::new("public_t").unwrap(),
            id: format!("{lsn}-{i}"),
            op: Op::Upsert,
            position: Some(Position(lsn)),
            document: format!("{{\"id\":{i}}}").into_bytes().into(),
            built_at_micros: None,
            relation: None,
            old_id: None,
            unchanged: Vec::new(),
        })
        .collect();
    Batch::new(Some(Position(lsn)), Arc::from(envelopes))
}

fn snapshot_batch(rows: usize) -> LaneItem {
    let envelopes: Vec<Envelope> = (0..rows)
        .map(|i| Envelope {
            index: IndexName::new("public_t").unwrap(),
            id: format!("s{i}"),
            op: Op::Upsert,
            position: None,
            document: b"{}".as_slice().into(),
            built_at_micros: None,
            relation: None,
            old_id: None,
            unchanged: Vec::new(),
        })
        .collect();
    LaneItem::Batch(Batch::new(None, Arc::from(envelopes)))
}

/// A fake source: hands out its changes (then `End`, or idles when `endless`), checks every
/// confirm against the stream's watermark, and answers a backfill with `snapshot_batches`
/// batches then `SnapshotComplete`.
struct FakeSource {
    stream: MemoryStream,
    changes: VecDeque<Batch>,
    next_lsn: u64,
    endless: bool,
    snapshots: VecDeque<SourceItem>,
    snapshot_batches: usize,
    /// Backfill requests the driver handed to `backfill`.
    backfills_asked: u32,
    confirms: Vec<Position>,
    /// Set when `next` hands out a `SnapshotComplete` (before the driver publishes it).
    complete_handed_out: Arc<AtomicBool>,
}

impl FakeSource {
    fn new(stream: &MemoryStream, transactions: u64) -> Self {
        FakeSource {
            stream: stream.clone(),
            changes: (1..=transactions).map(|lsn| batch(lsn * 10, 2)).collect(),
            next_lsn: transactions * 10 + 10,
            endless: false,
            snapshots: VecDeque::new(),
            snapshot_batches: 0,
            backfills_asked: 0,
            confirms: Vec::new(),
            complete_handed_out: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl Source for FakeSource {
    type Error = io::Error;

    fn next(&mut self, timeout: Duration) -> Result<Option<SourceItem>, io::Error> {
        if let Some(item) = self.snapshots.pop_front() {
            if matches!(item, SourceItem::Snapshot { item: LaneItem::SnapshotComplete { .. }, .. }) {
                self.complete_handed_out.store(true, Ordering::SeqCst);
            }
            return Ok(Some(item));
        }
        if let Some(b) = self.changes.pop_front() {
            return Ok(Some(SourceItem::Change(b)));
        }
        if self.endless {
            thread::sleep(timeout.min(Duration::from_millis(1)));
            let lsn = self.next_lsn;
            self.next_lsn += 10;
            return Ok(Some(SourceItem::Change(batch(lsn, 1))));
        }
        if self.snapshot_batches > 0 {
            // A backfill may still be asked: idle rather than end (the test ends it).
            thread::sleep(timeout);
            return Ok(None);
        }
        Ok(Some(SourceItem::End))
    }

    fn confirm(&mut self, position: Position) -> Result<(), io::Error> {
        let watermark = self.stream.watermark();
        assert!(Some(position) <= watermark, "confirmed {position} past the watermark {watermark:?}");
        assert!(self.confirms.last().is_none_or(|&c| position > c), "confirms go forward");
        self.confirms.push(position);
        Ok(())
    }

    fn lag_bytes(&mut self) -> Option<u64> {
        Some(self.changes.len() as u64)
    }

    /// A fake with nothing to check (as a file read from its start).
    fn start(
        &mut self,
        _sinks: &[lanestream_postgres::pipeline::SinkStart<'_>],
    ) -> Result<lanestream_postgres::pipeline::SourceStart, io::Error> {
        Ok(lanestream_postgres::pipeline::SourceStart::default())
    }

    fn backfill(&mut self, request: Request) -> Result<(), io::Error> {
        let Request::Backfill { sink, indexes, .. } = request else { panic!("unknown request") };
        self.backfills_asked += 1;
        for _ in 0..self.snapshot_batches {
            self.snapshots.push_back(SourceItem::Snapshot { sink: sink.clone(), item: snapshot_batch(3) });
        }
        self.snapshots.push_back(SourceItem::Snapshot { sink, item: LaneItem::SnapshotComplete { indexes } });
        // This test's backfill is the last thing: end after it.
        self.snapshot_batches = 0;
        Ok(())
    }
}

/// What a fake sink's instances share: its durable state and its failure plan.
#[derive(Default)]
struct Shared {
    /// Positions committed, in order (a redelivery may repeat one).
    durable: Vec<Position>,
    /// Every item committed, in order.
    items: Vec<LaneItem>,
    /// Fail this many more applies (then succeed).
    fail_times: u32,
    /// Panic this many more applies.
    panic_times: u32,
    /// Fail every apply of a run holding this position.
    fail_at: Option<Position>,
    /// Sleep per apply.
    slow: Duration,
    /// The state committed with the items (what the engine reads back at open).
    state: Option<SinkState>,
    /// Keeps no state: `state()` is `None` at every open (a plain file never cut back).
    stateless: bool,
    /// Fail the apply of this number (1-based; 0: none), once.
    fail_nth: u32,
    /// Applies so far.
    applies: u32,
    /// Instances opened.
    opened: u32,
}

struct FakeSink {
    shared: Arc<Mutex<Shared>>,
    staged: Vec<LaneItem>,
    gate: Option<Arc<AtomicBool>>,
}

impl Sink for FakeSink {
    type Error = io::Error;

    fn state(&mut self) -> Result<Option<SinkState>, io::Error> {
        let s = self.shared.lock().unwrap();
        Ok(if s.stateless { None } else { s.state.clone() })
    }

    fn apply(&mut self, items: &[LaneItem]) -> Result<(), io::Error> {
        if let Some(gate) = &self.gate {
            while !gate.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(1));
            }
        }
        let (slow, fail) = {
            let mut s = self.shared.lock().unwrap();
            if s.panic_times > 0 {
                s.panic_times -= 1;
                drop(s);
                panic!("the fake sink panics");
            }
            s.applies += 1;
            let fail = if s.applies == s.fail_nth {
                true
            } else if s.fail_times > 0 {
                s.fail_times -= 1;
                true
            } else {
                s.fail_at.is_some_and(|p| items.iter().any(|i| i.position() == Some(p)))
            };
            (s.slow, fail)
        };
        thread::sleep(slow);
        if fail {
            return Err(io::Error::other("the fake sink refuses"));
        }
        self.staged.extend_from_slice(items);
        Ok(())
    }

    fn commit(&mut self, state: &SinkState) -> Result<(), io::Error> {
        let mut s = self.shared.lock().unwrap();
        for item in self.staged.drain(..) {
            if let Some(p) = item.position() {
                s.durable.push(p);
            }
            s.items.push(item);
        }
        s.state = Some(state.clone());
        Ok(())
    }
}

fn stream(capacity: usize) -> MemoryStream {
    MemoryStream::builder().capacity(capacity).request_capacity(8).sinks(SINKS).build().unwrap()
}

fn shared_sinks() -> Vec<Arc<Mutex<Shared>>> {
    SINKS.iter().map(|_| Arc::new(Mutex::new(Shared::default()))).collect()
}

fn pipeline(
    stream: &MemoryStream,
    shared: &[Arc<Mutex<Shared>>],
    gate: Option<Arc<AtomicBool>>,
) -> Pipeline<MemoryStream> {
    let mut p = Pipeline::new(stream.clone()).retry(RetryPolicy {
        attempts: 3,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(4),
    });
    for (name, shared) in SINKS.iter().zip(shared) {
        let (shared, gate) = (shared.clone(), gate.clone().filter(|_| *name == "search"));
        p = p.sink(*name, move || {
            shared.lock().unwrap().opened += 1;
            Ok::<_, io::Error>(FakeSink { shared: shared.clone(), staged: Vec::new(), gate: gate.clone() })
        });
    }
    p
}

fn positions(shared: &Arc<Mutex<Shared>>) -> BTreeSet<u64> {
    shared.lock().unwrap().durable.iter().map(|p| p.0).collect()
}

fn expected(transactions: u64) -> BTreeSet<u64> {
    (1..=transactions).map(|t| t * 10).collect()
}

/// C1 for a sink that keeps no state (its `state()` is `None` at every open): a run failed
/// after the first chunks of a large transaction were committed and acked gets the rest from
/// the next instance, from the state the engine committed last. Before, the engine started the
/// new instance from nothing and refused the next chunk as a gap (the CI's `--chaos` run).
#[test]
fn c1_a_sink_that_keeps_no_state_gets_the_rest_of_a_transaction_after_a_failed_run() {
    let stream = stream(16);
    let shared = shared_sinks();
    {
        let mut s = shared[0].lock().unwrap();
        s.stateless = true;
        s.fail_nth = 3; // the third run: a chunk after two committed ones
    }
    let mut source = FakeSource::new(&stream, 0);
    let p = Position(70);
    let envelope = |i: u64| Envelope {
        index: IndexName::new("public_t").unwrap(),
        id: i.to_string(),
        op: Op::Upsert,
        position: Some(p),
        document: b"{}".as_slice().into(),
        built_at_micros: None,
        relation: None,
        old_id: None,
        unchanged: Vec::new(),
    };
    for (k, offset) in [0u64, 2, 4, 6, 8].into_iter().enumerate() {
        let envelopes: Arc<[Envelope]> = (offset..offset + 2).map(envelope).collect();
        let position = (k == 4).then_some(p);
        source.changes.push_back(Batch { position, changes: 2, offset, envelopes });
    }
    let report = pipeline(&stream, &shared, None).max_run(1).run(&mut source).unwrap();
    assert_eq!(report.confirmed, Some(p));
    let search = report.sinks.iter().find(|s| s.sink == "search").unwrap();
    assert_eq!(search.retries, 1, "{search:?}");
    let items = shared[0].lock().unwrap().items.clone();
    let ids: Vec<String> = items
        .iter()
        .flat_map(|i| match i {
            LaneItem::Batch(b) => b.envelopes.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
            _ => Vec::new(),
        })
        .collect();
    assert_eq!(ids, (0..10).map(|i| i.to_string()).collect::<Vec<_>>(), "each envelope once, in order");
}

#[test]
fn apply_error_is_retried_then_succeeds() {
    let stream = stream(64);
    let shared = shared_sinks();
    shared[1].lock().unwrap().fail_times = 2; // within the budget of 3 tries
    let mut source = FakeSource::new(&stream, 100);
    let report = pipeline(&stream, &shared, None).run(&mut source).unwrap();
    assert_eq!(report.transactions, 100);
    for s in &shared {
        assert_eq!(positions(s), expected(100), "every transaction applied and committed");
    }
    let cache = report.sinks.iter().find(|s| s.sink == "cache").unwrap();
    assert_eq!(cache.retries, 2);
    assert_eq!(shared[1].lock().unwrap().opened, 3, "a new sink instance per retry");
    assert_eq!(report.confirmed, Some(Position(1000)));
    assert_eq!(source.confirms.last(), Some(&Position(1000)));
}

#[test]
fn spent_budget_stops_the_pipeline_naming_the_sink_and_acks_nothing_unapplied() {
    let stream = stream(16);
    let shared = shared_sinks();
    shared[1].lock().unwrap().fail_at = Some(Position(500));
    let mut source = FakeSource::new(&stream, 100);
    let err = pipeline(&stream, &shared, None).run(&mut source).unwrap_err();
    match &err {
        PipelineError::Sink { sink, attempts, error } => {
            assert_eq!(sink.as_str(), "cache");
            assert_eq!(*attempts, 3);
            assert!(error.to_string().contains("refuses"), "{error}");
        }
        other => panic!("expected the sink's error, got {other}"),
    }
    assert!(err.to_string().contains("sink cache"), "{err}");
    // Nothing acked that was not committed: the lane's acked position is within what the sink
    // holds, and before the run it could not apply.
    let acked = stream.acked("cache").unwrap().unwrap();
    let held = positions(&shared[1]);
    assert!(acked < Position(500), "acked {acked}");
    assert!(held.contains(&acked.0) && !held.contains(&500));
    assert!(source.confirms.iter().all(|&c| c <= acked), "the source confirmed past the failed sink");
}

#[test]
fn a_sink_that_panics_is_retried_like_an_error() {
    let stream = stream(64);
    let shared = shared_sinks();
    shared[2].lock().unwrap().panic_times = 1;
    let report = pipeline(&stream, &shared, None).run(&mut FakeSource::new(&stream, 50)).unwrap();
    assert_eq!(positions(&shared[2]), expected(50));
    assert_eq!(report.sinks.iter().find(|s| s.sink == "archive").unwrap().retries, 1);
}

#[test]
fn a_sink_that_keeps_panicking_stops_the_pipeline_naming_it() {
    let stream = stream(64);
    let shared = shared_sinks();
    shared[2].lock().unwrap().panic_times = u32::MAX;
    let err = pipeline(&stream, &shared, None).run(&mut FakeSource::new(&stream, 50)).unwrap_err();
    match err {
        PipelineError::Sink { sink, error, .. } => {
            assert_eq!(sink.as_str(), "archive");
            assert!(error.to_string().contains("panicked: the fake sink panics"), "{error}");
        }
        other => panic!("expected the sink's error, got {other}"),
    }
    assert_eq!(stream.acked("archive").unwrap(), None, "nothing acked");
    assert!(positions(&shared[2]).is_empty());
}

#[test]
fn driver_confirm_never_passes_the_watermark() {
    // FakeSource::confirm asserts each confirm against the watermark read at that moment.
    let stream = stream(8);
    let shared = shared_sinks();
    shared[0].lock().unwrap().slow = Duration::from_micros(300);
    let mut source = FakeSource::new(&stream, 300);
    let report = pipeline(&stream, &shared, None).max_run(4).run(&mut source).unwrap();
    assert!(source.confirms.len() > 1, "confirmed while running, not only at the end");
    assert_eq!(source.confirms.last(), Some(&Position(3000)));
    assert_eq!(report.confirmed, stream.watermark());
}

#[test]
fn r2_request_acked_only_after_its_snapshot_complete_is_published() {
    let stream = stream(2);
    let shared = shared_sinks();
    shared[0].lock().unwrap().state = Some(SinkState {
        owed: vec![OwedBackfill { indexes: vec![IndexName::new("public_t").unwrap()], after: None }],
        ..SinkState::new()
    });
    let gate = Arc::new(AtomicBool::new(false));
    let mut source = FakeSource::new(&stream, 0);
    source.snapshot_batches = 2;
    let handed_out = source.complete_handed_out.clone();
    let watcher = {
        let (stream, gate) = (stream.clone(), gate.clone());
        thread::spawn(move || {
            // The search sink is stuck: its lane (2 slots) is full of snapshot batches, so the
            // SnapshotComplete the source handed out cannot be published yet.
            let deadline = Instant::now() + Duration::from_secs(10);
            while !handed_out.load(Ordering::SeqCst) {
                assert!(Instant::now() < deadline, "the source never handed out SnapshotComplete");
                thread::sleep(Duration::from_millis(1));
            }
            thread::sleep(Duration::from_millis(100));
            let acked_before = stream.request_stats().acked_items;
            gate.store(true, Ordering::SeqCst);
            acked_before
        })
    };
    let report = pipeline(&stream, &shared, Some(gate)).run(&mut source).unwrap();
    assert_eq!(watcher.join().unwrap(), 0, "the request was acked before its SnapshotComplete was published");
    assert_eq!(report.backfills_served, 1);
    assert_eq!(report.snapshot_batches, 2);
    assert_eq!(stream.request_stats().acked_items, 1);
    let items = shared[0].lock().unwrap().items.clone();
    assert_eq!(items.len(), 3);
    assert!(
        matches!(items[2], LaneItem::SnapshotComplete { .. }),
        "SnapshotComplete after the snapshot batches"
    );
    assert!(shared[1].lock().unwrap().items.is_empty(), "the snapshot went to the asking sink only");
}

#[test]
fn clean_shutdown_drains_and_confirms() {
    let stream = stream(32);
    let shared = shared_sinks();
    shared[2].lock().unwrap().slow = Duration::from_millis(1);
    let mut source = FakeSource::new(&stream, 0);
    source.endless = true;
    let pipeline = pipeline(&stream, &shared, None);
    let stop: StopHandle = pipeline.stop_handle();
    let stopper = thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        stop.stop();
    });
    let report = pipeline.run(&mut source).unwrap();
    stopper.join().unwrap();
    assert!(report.stopped && !report.drain_timed_out);
    let last = report.last_position.expect("something was published");
    assert_eq!(report.confirmed, Some(last), "confirmed up to everything published");
    assert_eq!(source.confirms.last(), Some(&last));
    for (name, s) in SINKS.iter().zip(&shared) {
        assert_eq!(stream.acked(name).unwrap(), Some(last));
        assert_eq!(positions(s).last(), Some(&last.0));
    }
    assert!(stream.is_idle());
}

#[test]
fn durable_ndjson_sink_holds_each_envelope_once_across_a_resend() {
    let dir = tempfile::tempdir().unwrap();
    let run = |transactions: u64| {
        let stream = stream(16);
        let mut p = Pipeline::new(stream.clone());
        for name in SINKS {
            let out = dir.path().to_path_buf();
            p = p.sink(name, move || DurableNdjson::open(&out, name, Duration::ZERO));
        }
        p.run(&mut FakeSource::new(&stream, transactions)).unwrap()
    };
    let first = run(40);
    assert_eq!(first.sinks.iter().map(|s| s.position).collect::<Vec<_>>(), vec![Some(Position(400)); 3]);
    // A source restarted before it could confirm sends everything again, and more: the
    // sinks skip what their checkpoints cover.
    run(60);
    for name in SINKS {
        let text = std::fs::read_to_string(dir.path().join(format!("{name}.ndjson"))).unwrap();
        let ids: Vec<&str> = text.lines().collect();
        assert_eq!(ids.len(), 120, "{name}: 60 transactions of 2 envelopes, each once");
        let unique: BTreeSet<&str> = ids.iter().copied().collect();
        assert_eq!(unique.len(), 120);
    }
}

#[test]
fn each_sink_reports_its_commit_to_ack_latency_and_changes_acked() {
    let stream = stream(64);
    let shared = shared_sinks();
    let mut source = FakeSource::new(&stream, 100);
    // Each transaction "committed" 30 ms before it is handed out; one more without a commit
    // time, which is not counted.
    let committed = lanestream_postgres::pipeline::metrics::unix_micros_now() - 30_000;
    for b in source.changes.iter_mut() {
        let envelopes: Vec<Envelope> =
            b.envelopes.iter().map(|e| Envelope { built_at_micros: Some(committed), ..e.clone() }).collect();
        b.envelopes = Arc::from(envelopes);
    }
    source.changes.push_back(batch(1010, 1));
    let report = pipeline(&stream, &shared, None).run(&mut source).unwrap();
    assert_eq!(report.transactions, 101);
    assert!(report.elapsed > Duration::ZERO && report.changes_per_second() > 0.0);
    for s in &report.sinks {
        assert_eq!(s.changes_acked, 201, "{}", s.sink);
        let l = s.commit_to_ack;
        assert_eq!(l.samples, 100, "{}: only the stamped transactions", s.sink);
        // At least the 30 ms before the hand-out (the histogram keeps values within 1%).
        assert!(
            l.p50_micros >= 29_700 && l.p50_micros <= l.p99_micros && l.p99_micros <= l.max_micros,
            "{l:?}"
        );
    }
}

#[test]
fn r2_a_sink_engine_reopened_after_a_failed_run_does_not_ask_its_backfill_again() {
    // The first instance re-asks the backfill its state owes; its first run fails and the
    // engine opens a second instance, whose request is the one still pending: asking again
    // would have the backfill served twice.
    let stream = stream(64);
    let shared = shared_sinks();
    shared[0].lock().unwrap().state = Some(SinkState {
        owed: vec![OwedBackfill { indexes: vec![IndexName::new("public_t").unwrap()], after: None }],
        ..SinkState::new()
    });
    shared[0].lock().unwrap().fail_times = 1;
    let mut source = FakeSource::new(&stream, 0);
    source.endless = true;
    source.snapshot_batches = 1;
    let pipeline = pipeline(&stream, &shared, None);
    let stop: StopHandle = pipeline.stop_handle();
    let stopper = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        stop.stop();
    });
    let report = pipeline.run(&mut source).unwrap();
    stopper.join().unwrap();
    assert!(shared[0].lock().unwrap().opened >= 2, "the failed run opened a second instance");
    assert_eq!(source.backfills_asked, 1, "the backfill was asked once");
    let search = report.sinks.iter().find(|s| s.sink == "search").unwrap();
    assert_eq!(search.backfills_asked, 1);
    assert_eq!(report.backfills_served, 1);
}

/// A sink that checks C1 itself: at its `apply` and its `commit`, nothing of the run in hand is
/// acked on its lane yet. Its first apply waits until `pile_up` items were published to its lane,
/// so that the engine then finds more than one backend run waiting.
struct RunCheckingSink {
    stream: MemoryStream,
    pile_up: u64,
    staged: Vec<Position>,
    /// The length of every run applied.
    applies: Arc<Mutex<Vec<usize>>>,
    durable: Arc<Mutex<Vec<Position>>>,
}

impl RunCheckingSink {
    fn assert_nothing_staged_is_acked(&self) {
        let acked = self.stream.acked("search").unwrap();
        if let Some(&first) = self.staged.first() {
            assert!(acked < Some(first), "acked {acked:?} before the run from {first} was committed");
        }
    }
}

impl Sink for RunCheckingSink {
    type Error = io::Error;

    fn state(&mut self) -> Result<Option<SinkState>, io::Error> {
        Ok(None)
    }

    fn apply(&mut self, items: &[LaneItem]) -> Result<(), io::Error> {
        if self.pile_up > 0 {
            while self.stream.stats("search").unwrap().published < self.pile_up {
                thread::sleep(Duration::from_millis(1));
            }
            self.pile_up = 0;
        }
        self.applies.lock().unwrap().push(items.len());
        self.staged.extend(items.iter().filter_map(LaneItem::position));
        self.assert_nothing_staged_is_acked();
        Ok(())
    }

    fn commit(&mut self, _state: &SinkState) -> Result<(), io::Error> {
        self.assert_nothing_staged_is_acked();
        self.durable.lock().unwrap().append(&mut self.staged);
        Ok(())
    }
}

#[test]
fn c1_the_engine_applies_several_backend_runs_as_one_and_acks_them_only_after_the_commit() {
    let stream = MemoryStream::builder().capacity(512).sinks(["search"]).build().unwrap();
    let (applies, durable) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
    let (s, a, d) = (stream.clone(), applies.clone(), durable.clone());
    let mut first = true;
    let report = Pipeline::new(stream.clone())
        .max_run(200)
        .sink("search", move || {
            let pile_up = if std::mem::take(&mut first) { 400 } else { 0 };
            Ok::<_, io::Error>(RunCheckingSink {
                stream: s.clone(),
                pile_up,
                staged: Vec::new(),
                applies: a.clone(),
                durable: d.clone(),
            })
        })
        .run(&mut FakeSource::new(&stream, 400))
        .unwrap();
    let applies = applies.lock().unwrap();
    assert!(applies.iter().all(|&n| (1..=200).contains(&n)), "runs within max_run: {applies:?}");
    assert!(
        applies.iter().any(|&n| n > lanestream::MAX_RUN),
        "the backend's runs (at most {}) were grouped up to max_run: {applies:?}",
        lanestream::MAX_RUN
    );
    assert_eq!(*durable.lock().unwrap(), (1..=400).map(|t| Position(t * 10)).collect::<Vec<_>>());
    let search = &report.sinks[0];
    assert_eq!((search.items_acked, search.acks_refused, search.redelivered), (400, 0, 0));
    assert_eq!(report.confirmed, Some(Position(4000)));
}

#[test]
fn l6_a_failed_run_is_released_whole_and_its_redeliveries_are_counted() {
    let stream = stream(64);
    let shared = shared_sinks();
    shared[0].lock().unwrap().fail_times = 2; // the first run fails twice, of 3 tries
    let report = pipeline(&stream, &shared, None).run(&mut FakeSource::new(&stream, 100)).unwrap();
    let search = report.sinks.iter().find(|s| s.sink == "search").unwrap();
    assert_eq!(search.retries, 2);
    assert!(search.redelivered >= 2, "the failed run came again, twice, as redeliveries: {search:?}");
    assert_eq!((search.items_acked, search.acks_refused), (100, 0), "each transaction acked once");
    assert_eq!(
        shared[0].lock().unwrap().durable,
        expected(100).into_iter().map(Position).collect::<Vec<_>>()
    );
}

/// `Pipeline::metrics` while it runs: the ingest's progress and each local sink engine's acks
/// and latency as they happen (a sink held back shows nothing acked, and the confirmed position
/// waits for it: W1), the source's lag as the source says; at the end, the report's figures.
#[test]
fn w1_metrics_of_a_running_pipeline_follow_the_ingest_and_each_sink_then_equal_the_report() {
    let stream = stream(256);
    let shared = shared_sinks();
    let gate = Arc::new(AtomicBool::new(false));
    let p = pipeline(&stream, &shared, Some(gate.clone()));
    let metrics = p.metrics();
    assert_eq!(metrics.snapshot().elapsed, Duration::ZERO, "not started");
    let mut source = FakeSource::new(&stream, 100);
    let run = thread::spawn(move || (p.run(&mut source), source));
    // Running, "search" held: the others ack everything, nothing is confirmed.
    let deadline = Instant::now() + Duration::from_secs(20);
    let held = loop {
        let m = metrics.snapshot();
        let acked = |name: &str| m.sinks.iter().find(|s| s.sink == name).map_or(0, |s| s.items_acked);
        // The source's lag is read about once a second: 100 at the start, 0 once all handed out.
        if m.transactions == 100
            && acked("cache") == 100
            && acked("archive") == 100
            && m.source_lag_bytes == Some(0)
        {
            break m;
        }
        assert!(Instant::now() < deadline, "no progress: {m:?}");
        thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(held.changes, 200);
    assert!(held.elapsed > Duration::ZERO && held.changes_per_second > 0.0, "{held:?}");
    assert_eq!(held.sinks.iter().find(|s| s.sink == "search").map(|s| s.items_acked), Some(0));
    assert_eq!(held.confirmed, None, "W1: the held sink holds the watermark");
    gate.store(true, Ordering::SeqCst);
    let (report, _source) = run.join().unwrap();
    let report = report.unwrap();
    let end = metrics.snapshot();
    assert_eq!((end.transactions, end.changes), (report.transactions, report.changes));
    assert_eq!((end.last_position, end.confirmed), (report.last_position, report.confirmed));
    assert_eq!(end.confirmed, Some(Position(1000)));
    assert_eq!(end.sinks.len(), report.sinks.len());
    for s in &report.sinks {
        let m = end.sinks.iter().find(|m| m.sink == s.sink).expect("every engine listed");
        assert_eq!(
            (m.items_acked, m.changes_acked, m.commit_to_ack),
            (s.items_acked, s.changes_acked, s.commit_to_ack)
        );
    }
}
