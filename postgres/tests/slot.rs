//! The slot against the sinks, with the library's pipeline on a real PostgreSQL (a throwaway
//! server started for this test binary, or `LANESTREAM_PG_URL`): the slot is confirmed no
//! further than the slowest sink's durable state (read back from `pg_replication_slots`), a
//! sink that fails holds the slot back and resumes from its state, a slot advanced by hand past
//! a sink's state is refused, and the slots a user may point the source at by mistake are
//! refused by name. Each test that checks an outcome compares every sink's whole output (applied
//! by the sink rules) with the table.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use lanestream::pipeline::{MemorySink, RetryPolicy, Sink, SinkState, StopHandle};
use lanestream::{LaneItem, MemoryStream, Position};
use lanestream_postgres::live::{LiveError, LiveSource};
use lanestream_postgres::pipeline::{Joiners, Pipeline, PipelineError, PipelineReport};
use postgres::Client;
use serde_json::{Map, Value};

mod pg_server;
use pg_server::replica::{eventually, Replica};
use pg_server::{compare, drop_slot, live_config, serial, slot_confirmed, sql, sql_at, url, wal};

/// A sink whose data and state become durable together at `commit`, as the trait asks (what an
/// instance applied and did not commit is lost with it); its store outlives its instances.
/// `applies`: the `apply` calls it may still make before it waits for more (negative: no
/// limit); `commits`: the commits that may still succeed before every later one fails (negative:
/// no limit).
#[derive(Clone)]
struct Durable {
    store: MemorySink,
    applies: Arc<AtomicI64>,
    commits: Arc<AtomicI64>,
    pending: Vec<LaneItem>,
}

impl Durable {
    fn new() -> Durable {
        Durable {
            store: MemorySink::new(),
            applies: Arc::new(AtomicI64::new(-1)),
            commits: Arc::new(AtomicI64::new(-1)),
            pending: Vec::new(),
        }
    }

    /// A new instance over the same store (what a restarted engine opens).
    fn open(&self) -> Durable {
        Durable { pending: Vec::new(), ..self.clone() }
    }

    /// The last whole transaction its durable state records.
    fn position(&self) -> Option<Position> {
        self.store.committed().as_ref().and_then(|s| s.position)
    }

    /// Its durable data applied by the sink rules: the table's rows by id.
    fn held(&self, index: &str) -> std::collections::BTreeMap<String, Map<String, Value>> {
        Replica::apply(&self.store.applied()).rows.remove(index).unwrap_or_default()
    }
}

/// Takes one from `budget`; `false` when it is spent.
fn take(budget: &AtomicI64) -> bool {
    budget
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n != 0).then(|| if n < 0 { n } else { n - 1 }))
        .is_ok()
}

impl Sink for Durable {
    type Error = std::io::Error;

    fn state(&mut self) -> Result<Option<SinkState>, std::io::Error> {
        Ok(self.store.committed().clone())
    }

    fn apply(&mut self, items: &[LaneItem]) -> Result<(), std::io::Error> {
        while !take(&self.applies) {
            thread::sleep(Duration::from_millis(5));
        }
        self.pending.extend_from_slice(items);
        Ok(())
    }

    fn commit(&mut self, state: &SinkState) -> Result<(), std::io::Error> {
        if !take(&self.commits) {
            return Err(std::io::Error::other("the sink's disk is full"));
        }
        self.store.applied().append(&mut self.pending);
        *self.store.committed() = Some(state.clone());
        Ok(())
    }
}

/// A pipeline of the sinks over `source`, run in a thread until stopped.
struct Running {
    stop: StopHandle,
    thread: thread::JoinHandle<Result<PipelineReport, PipelineError>>,
}

fn start(source: LiveSource, sinks: &[(&str, &Durable)], joiners: Joiners, retry: RetryPolicy) -> Running {
    let stream = MemoryStream::builder().sinks(sinks.iter().map(|(n, _)| *n)).build().expect("stream");
    let mut pipeline = Pipeline::new(stream).joiners(joiners).retry(retry);
    for (name, sink) in sinks {
        let sink = (*sink).clone();
        pipeline = pipeline.sink(*name, move || Ok::<_, std::io::Error>(sink.open()));
    }
    let stop = pipeline.stop_handle();
    let thread = thread::spawn(move || {
        let mut source = source.until(None);
        pipeline.run(&mut source)
    });
    Running { stop, thread }
}

impl Running {
    fn finish(self) -> Result<PipelineReport, PipelineError> {
        self.stop.stop();
        self.thread.join().expect("the pipeline thread")
    }
}

fn table(c: &mut Client, table: &str) -> std::collections::BTreeMap<String, Map<String, Value>> {
    pg_server::rows(c, table, "*", "")
}

const PATIENT: RetryPolicy = RetryPolicy {
    attempts: 3,
    initial_backoff: Duration::from_millis(10),
    max_backoff: Duration::from_millis(50),
};

/// Two sinks, one of which stops applying after a few runs: while the fast one has every change
/// durable, `pg_replication_slots.confirmed_flush_lsn` stays at or below the slow one's durable
/// position (what PostgreSQL would re-send from after a crash), sampled for a second; released,
/// the slow one catches up, the slot follows, and both end equal to the table.
#[test]
fn the_slot_is_never_confirmed_past_the_slowest_sinks_durable_state() {
    let Some(_server) = serial() else { return };
    let mut c = sql();
    drop_slot("sl_slowest");
    c.batch_execute(
        "DROP TABLE IF EXISTS sl_slowest; CREATE TABLE sl_slowest (id int PRIMARY KEY, v int);
         DROP PUBLICATION IF EXISTS sl_slowest_pub; CREATE PUBLICATION sl_slowest_pub FOR TABLE sl_slowest;",
    )
    .expect("set-up");
    let source = LiveSource::connect(live_config(&url(), "sl_slowest", "sl_slowest_pub")).expect("source");
    let (fast, slow) = (Durable::new(), Durable::new());
    // The table was empty when the slot was made: the sinks need only the stream.
    let running = start(source, &[("fast", &fast), ("slow", &slow)], Joiners::LiveOnly, PATIENT);
    for id in 1..=20 {
        c.execute("INSERT INTO sl_slowest VALUES ($1, $1)", &[&id]).expect("a transaction");
    }
    eventually("the slow sink holds the first rows", Duration::from_secs(20), || {
        slow.held("public_sl_slowest").len() == 20
    });
    // From now on the slow sink applies nothing.
    slow.applies.store(0, Ordering::SeqCst);
    for id in 21..=40 {
        c.execute("INSERT INTO sl_slowest VALUES ($1, $1)", &[&id]).expect("a transaction");
    }
    c.batch_execute("UPDATE sl_slowest SET v = -v WHERE id % 3 = 0; DELETE FROM sl_slowest WHERE id % 7 = 0")
        .expect("changes");
    let expected = table(&mut c, "sl_slowest");
    eventually("the fast sink holds the table", Duration::from_secs(20), || {
        compare(&fast.held("public_sl_slowest"), &expected) == (0, 0, 0)
    });
    let (fast_at, slow_at) = (fast.position().expect("fast"), slow.position().expect("slow"));
    assert!(slow_at < fast_at, "the slow sink is behind: {slow_at} vs {fast_at}");
    assert_ne!(compare(&slow.held("public_sl_slowest"), &expected), (0, 0, 0), "the slow sink lacks rows");
    for _ in 0..20 {
        let confirmed = slot_confirmed(&mut c, "sl_slowest").expect("confirmed");
        assert!(confirmed <= slow_at, "the slot is confirmed at {confirmed}, past the slow sink's {slow_at}");
        thread::sleep(Duration::from_millis(50));
    }
    slow.applies.store(-1, Ordering::SeqCst);
    eventually("the slot follows both", Duration::from_secs(20), || {
        slot_confirmed(&mut c, "sl_slowest").is_some_and(|p| p >= fast_at)
    });
    running.finish().expect("the pipeline runs");
    for sink in [&fast, &slow] {
        assert_eq!(compare(&sink.held("public_sl_slowest"), &expected), (0, 0, 0));
    }
    drop_slot("sl_slowest");
}

/// A sink whose commits fail (its disk is full) stops the pipeline after its retries, naming
/// it; the slot stays at or below what it made durable, though the other sink got further.
/// Started again with a working disk it resumes from its state: every
/// transaction reaches it once, and it ends equal to the table, like the sink that never failed.
#[test]
fn a_sink_that_fails_holds_the_slot_back_and_resumes_from_its_state() {
    let Some(_server) = serial() else { return };
    let mut c = sql();
    drop_slot("sl_fails");
    c.batch_execute(
        "DROP TABLE IF EXISTS sl_fails; CREATE TABLE sl_fails (id int PRIMARY KEY, v text);
         INSERT INTO sl_fails SELECT g, 'before ' || g FROM generate_series(1, 300) g;
         DROP PUBLICATION IF EXISTS sl_fails_pub; CREATE PUBLICATION sl_fails_pub FOR TABLE sl_fails;",
    )
    .expect("set-up");
    let config = live_config(&url(), "sl_fails", "sl_fails_pub");
    let source = LiveSource::connect(config.clone()).expect("source");
    let (good, failing) = (Durable::new(), Durable::new());
    let running = start(source, &[("good", &good), ("failing", &failing)], Joiners::Backfill, PATIENT);
    for id in 1..=10 {
        c.execute("UPDATE sl_fails SET v = 'changed' WHERE id = $1", &[&id]).expect("a transaction");
    }
    let first = table(&mut c, "sl_fails");
    eventually("both hold the table", Duration::from_secs(20), || {
        [&good, &failing].iter().all(|s| compare(&s.held("public_sl_fails"), &first) == (0, 0, 0))
    });
    // The disk fills: the failing sink's next run waits until the good one got it, then fails.
    failing.applies.store(0, Ordering::SeqCst);
    failing.commits.store(0, Ordering::SeqCst);
    for id in 11..=30 {
        c.execute("UPDATE sl_fails SET v = 'changed' WHERE id = $1", &[&id]).expect("a transaction");
    }
    let second = table(&mut c, "sl_fails");
    eventually("the good sink holds the table", Duration::from_secs(20), || {
        compare(&good.held("public_sl_fails"), &second) == (0, 0, 0)
    });
    failing.applies.store(-1, Ordering::SeqCst);
    eventually("the pipeline stops", Duration::from_secs(20), || running.thread.is_finished());
    let e = running.finish().unwrap_err();
    assert!(matches!(&e, PipelineError::Sink { sink, attempts: 3, .. } if sink.as_str() == "failing"), "{e}");
    assert!(e.to_string().contains("disk is full"), "{e}");
    let confirmed = slot_confirmed(&mut c, "sl_fails").expect("confirmed");
    let held = failing.position().expect("the failing sink's state");
    assert!(confirmed <= held, "the slot at {confirmed}, past the failing sink's {held}");
    assert!(good.position().is_some_and(|p| p > held), "the good sink got further: {:?}", good.position());
    // Restarted: both resume from their durable states.
    c.batch_execute("DELETE FROM sl_fails WHERE id % 10 = 0; INSERT INTO sl_fails VALUES (1000, 'late')")
        .expect("changes while down");
    failing.commits.store(-1, Ordering::SeqCst);
    let source = LiveSource::connect(config).expect("source");
    let running = start(source, &[("good", &good), ("failing", &failing)], Joiners::Backfill, PATIENT);
    let expected = table(&mut c, "sl_fails");
    eventually("both hold the table", Duration::from_secs(30), || {
        [&good, &failing].iter().all(|s| compare(&s.held("public_sl_fails"), &expected) == (0, 0, 0))
    });
    running.finish().expect("the second run");
    for sink in [&good, &failing] {
        let applied = sink.store.applied();
        let mut positions: Vec<Position> = applied
            .iter()
            .filter_map(|i| match i {
                LaneItem::Batch(b) if !b.envelopes.is_empty() => b.position,
                _ => None,
            })
            .collect();
        let n = positions.len();
        positions.dedup();
        assert_eq!(positions.len(), n, "a transaction applied twice");
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "in commit order");
    }
    drop_slot("sl_fails");
}

/// P1 by hand: an administrator advances the slot (`pg_replication_slot_advance`) past a
/// sink's state, over changes nobody decoded. The pipeline refuses to start, naming the sink,
/// both positions and the reset; the slot is kept (not created by it) and not moved; the sink is
/// untouched. Reset (a new sink), it is backfilled and ends equal to the table.
#[test]
fn a_slot_advanced_by_hand_past_a_sinks_state_is_refused_until_the_sink_is_reset() {
    let Some(_server) = serial() else { return };
    let mut c = sql();
    drop_slot("sl_advanced");
    c.batch_execute(
        "DROP TABLE IF EXISTS sl_advanced; CREATE TABLE sl_advanced (id int PRIMARY KEY, v int);
         INSERT INTO sl_advanced SELECT g, g FROM generate_series(1, 100) g;
         DROP PUBLICATION IF EXISTS sl_advanced_pub; CREATE PUBLICATION sl_advanced_pub FOR TABLE sl_advanced;",
    )
    .expect("set-up");
    let config = live_config(&url(), "sl_advanced", "sl_advanced_pub");
    let sink = MemorySink::new();
    let source = LiveSource::connect(config.clone()).expect("source");
    let end = wal(&mut c);
    pg_server::replica::run_to(source, &sink, end, Joiners::Backfill);
    let state = sink.committed().clone().expect("a state");
    let applied = sink.applied().len();
    c.batch_execute("UPDATE sl_advanced SET v = 0 WHERE id <= 10").expect("a change nobody decodes");
    // (The walsender of the run just ended may hold the slot for a moment.)
    let mut advanced = None;
    eventually("the slot advanced", Duration::from_secs(10), || {
        let row = c.query_one(
            "SELECT end_lsn::text FROM pg_replication_slot_advance('sl_advanced', pg_current_wal_lsn())",
            &[],
        );
        advanced = row.ok().map(|r| Position::from_lsn(&r.get::<_, String>(0)).expect("an LSN"));
        advanced.is_some()
    });
    let advanced = advanced.expect("advanced");
    for _ in 0..2 {
        let source = LiveSource::connect(config.clone()).expect("source");
        let stream = MemoryStream::builder().sinks(["replica"]).build().expect("stream");
        let held = sink.clone();
        let e = Pipeline::new(stream)
            .sink("replica", move || Ok::<_, std::convert::Infallible>(held.clone()))
            .run(&mut source.until(Some(advanced)))
            .unwrap_err();
        let PipelineError::Source(inner) = &e else { panic!("{e}") };
        let live = inner.downcast_ref::<LiveError>().expect("the live source's error");
        assert!(
            matches!(live, LiveError::SlotGap { sink, applied: Some(a), resumes_from, dropped: false, .. }
                if sink == "replica" && Some(*a) == state.applied() && *resumes_from == advanced),
            "{e}"
        );
        let text = e.to_string();
        assert!(text.contains(&advanced.to_string()) && text.contains("advanced by hand"), "{text}");
        assert!(text.contains("Reset the sink"), "{text}");
        assert_eq!((sink.applied().len(), sink.committed().as_ref()), (applied, Some(&state)), "untouched");
        assert_eq!(slot_confirmed(&mut c, "sl_advanced"), Some(advanced), "the slot is kept where it was");
    }
    // Reset: a new sink is backfilled from the tables and holds every row, the skipped change too.
    let reset = MemorySink::new();
    let source = LiveSource::connect(config).expect("source");
    let end = wal(&mut c);
    let items = pg_server::replica::run_to(source, &reset, end, Joiners::Backfill);
    let expected = table(&mut c, "sl_advanced");
    assert_eq!(compare(&Replica::apply(&items).rows["public_sl_advanced"], &expected), (0, 0, 0));
    drop_slot("sl_advanced");
}

/// Slots the source must not stream, each refused with what to do: a physical slot (no
/// plugin), a pgoutput slot of another database (the server refuses it at `START_REPLICATION`,
/// and the error carries its words), a slot another client streams.
#[test]
fn slots_that_are_not_this_databases_pgoutput_slot_are_refused_by_name() {
    let Some(_server) = serial() else { return };
    let mut c = sql();
    c.batch_execute("DROP DATABASE IF EXISTS sl_other WITH (FORCE)").expect("drop");
    c.batch_execute("CREATE DATABASE sl_other").expect("create");
    c.batch_execute(
        "DROP TABLE IF EXISTS sl_refused; CREATE TABLE sl_refused (id int PRIMARY KEY);
         DROP PUBLICATION IF EXISTS sl_refused_pub; CREATE PUBLICATION sl_refused_pub FOR TABLE sl_refused;",
    )
    .expect("set-up");
    let other_url = format!("{} dbname=sl_other", url());
    let mut other = sql_at(&other_url);
    for slot in ["sl_physical", "sl_of_other_db"] {
        drop_slot(slot);
    }
    c.batch_execute("SELECT pg_create_physical_replication_slot('sl_physical')").expect("physical");
    other
        .batch_execute("SELECT pg_create_logical_replication_slot('sl_of_other_db', 'pgoutput')")
        .expect("other");
    let connect = |slot: &str| {
        let mut config = live_config(&url(), slot, "sl_refused_pub");
        config.create_slot = false;
        config.slot_wait = Duration::from_millis(300);
        LiveSource::connect(config).and_then(|mut s| s.open().map(|()| s))
    };
    let e = connect("sl_physical").unwrap_err();
    assert!(matches!(&e, LiveError::WrongPlugin { plugin, .. } if plugin.is_empty()), "{e}");
    assert!(e.to_string().contains("use another slot name"), "{e}");
    let e = connect("sl_of_other_db").unwrap_err();
    assert!(matches!(&e, LiveError::Replication { .. }), "{e}");
    assert!(e.to_string().contains("was not created in this database"), "{e}");
    // A slot another lanestream source holds, refused after the wait, naming the holder's PID.
    let holder = LiveSource::connect(live_config(&url(), "sl_held", "sl_refused_pub")).expect("holder");
    let e = connect("sl_held").unwrap_err();
    assert!(matches!(&e, LiveError::SlotBusy { holder, .. } if holder.contains("PID")), "{e}");
    drop(holder);
    for slot in ["sl_physical", "sl_held"] {
        drop_slot(slot);
    }
    pg_server::drop_slot_on(&mut other, "sl_of_other_db");
    drop(other);
    c.batch_execute("DROP DATABASE sl_other WITH (FORCE)").expect("drop");
}
