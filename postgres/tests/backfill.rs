//! The live source's backfill ([`lanestream_postgres::backfill`]) against a real PostgreSQL:
//! a table backfilled through the live stream while writers update, delete and insert its rows;
//! the changes and the snapshot batches applied in stream order to a map (snapshot rows as plain
//! upserts) must equal the table, row by row. A resumed backfill re-reads at most one chunk.
//! Tables without a primary key are refused.
//!
//! Ignored by a plain `cargo test` (they need a server with `wal_level = logical`);
//! `scripts/e2e-postgres.sh` runs them with `--ignored --skip long` (the 200k-row run is by hand:
//! `--ignored long`), with `LANESTREAM_PG_URL` a superuser connection string.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use lanestream::{Batch, IndexName, LaneItem, Op, Request, SinkName};
use lanestream_postgres::live::{LiveError, LiveItem, LiveSource};
use lanestream_postgres::pgoutput::PgOutputDecoder;
use postgres::Client;
use serde_json::Value;

mod pg_server;
use pg_server::{config, decoder, drop_slot, serial, sql, NEEDS};

const INDEX: &str = "public_bf_items";

fn index(name: &str) -> IndexName {
    IndexName::new(name).unwrap()
}

fn sink_name() -> SinkName {
    SinkName::new("search").unwrap()
}

/// `bf_items` with `rows` rows (before the slot exists, so only the backfill brings them), and
/// the sentinel table the tests end the stream with.
fn load(rows: i64) {
    sql()
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS bf_items, bf_sentinel; \
             CREATE TABLE bf_items (id int8 PRIMARY KEY, grp int4 NOT NULL, name text, val numeric(12,2), flag bool); \
             CREATE TABLE bf_sentinel (k int8 PRIMARY KEY); \
             INSERT INTO bf_items SELECT i, i % 7, 'row ' || i || ' : \\ \"q\"', i * 1.5, i % 2 = 0 \
             FROM generate_series(1, {rows}) i; \
             ANALYZE bf_items"
        ))
        .expect("load");
}

/// The sink: the index's rows by id, changes and snapshot rows applied in stream order.
#[derive(Default)]
struct Sink {
    rows: BTreeMap<i64, Value>,
    /// The id of the last snapshot row applied (what a durable sink's checkpoint records).
    last_snapshot_id: Option<String>,
    snapshot_batches: u64,
    complete: Option<Vec<IndexName>>,
    sentinels: Vec<String>,
}

impl Sink {
    fn apply(&mut self, batch: &Batch, snapshot: bool) {
        for e in batch.envelopes.iter() {
            if e.index.as_str() == "public_bf_sentinel" {
                self.sentinels.push(e.id.clone());
                continue;
            }
            if e.index.as_str() != INDEX {
                continue;
            }
            match e.op {
                Op::Truncate => self.rows.clear(),
                Op::Delete => {
                    self.rows.remove(&e.id.parse::<i64>().expect("an int8 id"));
                }
                _ => {
                    let doc: Value = serde_json::from_slice(&e.document).expect("a JSON document");
                    self.rows.insert(e.id.parse().expect("an int8 id"), doc);
                }
            }
            if snapshot {
                assert!(e.position.is_none() && e.op == Op::Upsert, "{e:?}");
                self.last_snapshot_id = Some(e.id.clone());
            }
        }
        if snapshot {
            assert_eq!(batch.position, None, "snapshot batches carry no position (W2)");
            self.snapshot_batches += 1;
        }
    }

    /// Applies one item of the source; confirms the changes at once (the sink is in memory).
    fn take(&mut self, source: &mut LiveSource, item: LiveItem) {
        match item {
            LiveItem::Change(b) => {
                self.apply(&b, false);
                source.confirm(b.position).expect("confirm");
            }
            LiveItem::Snapshot { sink: to, item: LaneItem::Batch(b) } => {
                assert_eq!(to, sink_name());
                assert!(self.complete.is_none(), "a snapshot batch after SnapshotComplete");
                self.apply(&b, true);
            }
            LiveItem::Snapshot { sink: to, item: LaneItem::SnapshotComplete { indexes } } => {
                assert_eq!(to, sink_name());
                self.complete = Some(indexes);
            }
            LiveItem::Snapshot { item, .. } => panic!("unexpected {item:?}"),
        }
    }

    /// Reads the source until a sentinel row written now comes through the stream.
    fn drain(&mut self, source: &mut LiveSource, decoder: &mut PgOutputDecoder, c: &mut Client, k: i64) {
        c.execute("INSERT INTO bf_sentinel VALUES ($1)", &[&k]).expect("sentinel");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.sentinels.contains(&k.to_string()) {
            assert!(Instant::now() < deadline, "the sentinel did not come through the stream");
            if let Some(item) = source.next_item(decoder, Duration::from_millis(200)).expect("next") {
                self.take(source, item);
            }
        }
    }
}

/// The table's rows as the stream's documents would be (compared as JSON values).
fn table(c: &mut Client) -> BTreeMap<i64, Value> {
    c.query("SELECT id, row_to_json(t)::text FROM bf_items t", &[])
        .expect("select")
        .iter()
        .map(|r| (r.get::<_, i64>(0), serde_json::from_str(r.get::<_, &str>(1)).expect("json")))
        .collect()
}

fn assert_equal(sink: &BTreeMap<i64, Value>, table: &BTreeMap<i64, Value>) {
    let missing: Vec<_> = table.keys().filter(|k| !sink.contains_key(k)).take(10).collect();
    let extra: Vec<_> = sink.keys().filter(|k| !table.contains_key(k)).take(10).collect();
    let stale: Vec<_> =
        table.iter().filter(|(k, v)| sink.get(k).is_some_and(|s| s != *v)).map(|(k, _)| k).take(10).collect();
    assert!(
        missing.is_empty() && extra.is_empty() && stale.is_empty(),
        "sink vs table ({} vs {} rows): missing {missing:?}, resurrected {extra:?}, stale {stale:?}",
        sink.len(),
        table.len()
    );
}

/// Writers that update, delete and insert rows of `bf_items` in small transactions until
/// stopped, mostly around `hot` (the key the backfill is at, so that changes fall between a
/// chunk's marks), sometimes anywhere in `1..=rows`.
struct Writers {
    stop: Arc<AtomicBool>,
    hot: Arc<AtomicI64>,
    threads: Vec<thread::JoinHandle<u64>>,
}

impl Writers {
    fn start(n: usize, rows: i64, spread: i64) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let hot = Arc::new(AtomicI64::new(0));
        let threads = (0..n)
            .map(|w| {
                let (stop, hot) = (stop.clone(), hot.clone());
                thread::spawn(move || {
                    let mut c = sql();
                    let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ (w as u64 + 1);
                    let mut next = move || {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        seed
                    };
                    let mut done = 0u64;
                    // Relaxed: a flag polled in a loop; nothing is published through it.
                    while !stop.load(Ordering::Relaxed) {
                        let r = next();
                        let id = if r % 4 == 0 {
                            1 + (next() % rows as u64) as i64
                        } else {
                            // Relaxed: a hint of where to write, not a synchronisation.
                            hot.load(Ordering::Relaxed) + (next() % spread as u64) as i64
                        };
                        let statement = match next() % 10 {
                            0..=4 => format!(
                                "UPDATE bf_items SET name = 'upd {r}', val = val + 1, flag = NOT flag WHERE id = {id}"
                            ),
                            5..=6 => format!("DELETE FROM bf_items WHERE id = {id}"),
                            7..=8 => format!(
                                "INSERT INTO bf_items VALUES ({id}, 1, 'ins {r}', 2.25, true) \
                                 ON CONFLICT (id) DO UPDATE SET name = 'ups {r}'"
                            ),
                            _ => format!(
                                "BEGIN; UPDATE bf_items SET grp = grp + 1 WHERE id = {id}; \
                                 DELETE FROM bf_items WHERE id = {}; COMMIT",
                                id + 1
                            ),
                        };
                        if c.batch_execute(&statement).is_err() {
                            let _ = c.batch_execute("ROLLBACK");
                        } else {
                            done += 1;
                        }
                    }
                    done
                })
            })
            .collect();
        Writers { stop, hot, threads }
    }

    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.threads.into_iter().map(|t| t.join().expect("writer")).sum()
    }
}

/// Once the backfill is past `after`: a transaction that locks the table (`ACCESS EXCLUSIVE`),
/// updates (even ids) and deletes (odd ids) the rows of the `span` ids after the last snapshot
/// row applied, and commits 300 ms later. Meanwhile the source reads its next chunk: it writes
/// the low mark, takes its snapshot and waits for the lock in its `SELECT`, so these changes
/// commit between that chunk's marks and are not visible in its snapshot: the rows they touched
/// in that chunk come back old from the `SELECT` and must be dropped (the deleted ones would be
/// resurrected otherwise). That chunk starts at most one chunk (`span / 2`) after the last row
/// applied, so it holds at least a quarter of the rows changed. Returns that quarter.
fn lock_and_change(hot: Arc<AtomicI64>, after: i64, span: i64) -> thread::JoinHandle<u64> {
    thread::spawn(move || {
        let mut c = sql();
        // Relaxed: a hint of where the backfill is.
        while hot.load(Ordering::Relaxed) < after {
            thread::sleep(Duration::from_millis(1));
        }
        let mut t = c.transaction().expect("begin");
        t.batch_execute("LOCK TABLE bf_items IN ACCESS EXCLUSIVE MODE").expect("lock");
        let (from, to) = (hot.load(Ordering::Relaxed), hot.load(Ordering::Relaxed) + span);
        let range = "id > $1 AND id <= $2";
        let updated = t
            .execute(
                &format!("UPDATE bf_items SET name = 'locked' WHERE {range} AND id % 2 = 0"),
                &[&from, &to],
            )
            .expect("update");
        let deleted = t
            .execute(&format!("DELETE FROM bf_items WHERE {range} AND id % 2 = 1"), &[&from, &to])
            .expect("delete");
        thread::sleep(Duration::from_millis(300));
        t.commit().expect("commit");
        (updated + deleted) / 4
    })
}

/// One backfill of `rows` rows in chunks of `chunk_rows`, under concurrent writers, checked
/// row by row against the table.
fn backfill_under_writers(slot: &str, rows: i64, chunk_rows: usize) {
    let _server = serial();
    let _ = NEEDS;
    drop_slot(slot);
    load(rows);
    let mut cfg = config(slot);
    cfg.backfill_chunk_rows = chunk_rows;
    let mut source = LiveSource::connect(cfg).expect("source");
    source.start().expect("start");
    let mut decoder = decoder(&source);
    let mut sink = Sink::default();
    let writers = Writers::start(2, rows, 2 * chunk_rows as i64);
    let locker = lock_and_change(writers.hot.clone(), 3 * chunk_rows as i64, 2 * chunk_rows as i64);
    // Live changes flow before the request too.
    thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    source.backfill(Request::backfill(sink_name(), vec![index(INDEX)])).expect("backfill");
    let deadline = Instant::now() + Duration::from_secs(600);
    while sink.complete.is_none() {
        assert!(Instant::now() < deadline, "the backfill did not complete");
        if let Some(item) = source.next_item(&mut decoder, Duration::from_millis(200)).expect("next") {
            sink.take(&mut source, item);
            if let Some(id) = &sink.last_snapshot_id {
                // Relaxed: a hint for the writers.
                writers.hot.store(id.parse().expect("id"), Ordering::Relaxed);
            }
        }
    }
    let took = started.elapsed();
    let writes = writers.stop();
    let locked = locker.join().expect("locker");
    assert_eq!(sink.complete.as_deref(), Some(&[index(INDEX)][..]));
    let mut c = sql();
    sink.drain(&mut source, &mut decoder, &mut c, 1);
    let metrics = source.metrics().expect("metrics");
    let progress = source.backfill_progress();
    eprintln!(
        "{rows} rows in chunks of {chunk_rows}: {} snapshot batches, {} rows published, {} dropped by the marks, \
         {writes} concurrent writes, {took:?}; progress {progress:?}",
        metrics.snapshot_batches, metrics.snapshot_rows, metrics.snapshot_rows_dropped
    );
    assert_equal(&sink.rows, &table(&mut c));
    assert_eq!(metrics.snapshot_batches, sink.snapshot_batches);
    assert!(
        metrics.snapshot_rows_dropped >= locked,
        "the rows changed while a chunk's SELECT waited are dropped from it ({locked} changed)"
    );
    assert_eq!(progress.len(), 1);
    assert!(progress[0].done && progress[0].table == "public.bf_items", "{progress:?}");
    // ANALYZE samples: the estimate is near the count, not always equal.
    let estimate = (rows * 9 / 10)..=(rows * 11 / 10);
    assert!(progress[0].rows_read >= metrics.snapshot_rows, "{progress:?}");
    assert!(estimate.contains(&progress[0].estimated_rows), "{progress:?}");
    drop(source);
    drop_slot(slot);
    sql().batch_execute("DROP TABLE bf_items, bf_sentinel").expect("drop");
}

#[test]
#[ignore = "needs a PostgreSQL with wal_level = logical (LANESTREAM_PG_URL); run by scripts/e2e-postgres.sh"]
fn a_backfill_under_concurrent_updates_deletes_and_inserts_equals_the_table() {
    backfill_under_writers("t_backfill", 20_000, 1024);
}

#[test]
#[ignore = "200k rows: by hand, cargo test -p lanestream-postgres --test backfill -- --ignored long"]
fn a_backfill_of_200k_rows_under_concurrent_writers_equals_the_table_long() {
    backfill_under_writers("t_backfill_long", 200_000, 1024);
}

#[test]
#[ignore = "needs a PostgreSQL with wal_level = logical (LANESTREAM_PG_URL); run by scripts/e2e-postgres.sh"]
fn an_interrupted_backfill_resumes_after_the_last_applied_row_re_reading_at_most_one_chunk() {
    let _server = serial();
    let slot = "t_backfill_resume";
    drop_slot(slot);
    let (rows, chunk) = (5_000i64, 200usize);
    load(rows);
    let mut cfg = config(slot);
    cfg.backfill_chunk_rows = chunk;
    let mut c = sql();
    let mut sink = Sink::default();
    // The first source: interrupted (dropped) after four snapshot batches were applied.
    let read_first = {
        let mut source = LiveSource::connect(cfg.clone()).expect("source");
        source.start().expect("start");
        let mut decoder = decoder(&source);
        source.backfill(Request::backfill(sink_name(), vec![index(INDEX)])).expect("backfill");
        while sink.snapshot_batches < 4 {
            if let Some(item) = source.next_item(&mut decoder, Duration::from_millis(200)).expect("next") {
                sink.take(&mut source, item);
            }
        }
        // The next chunk is read, then the source dies before the sink applies anything more
        // (what it returned is lost; the changes among it were not confirmed: they come again).
        while source.backfill_progress()[0].rows_read == 4 * chunk as u64 {
            let _lost = source.next_item(&mut decoder, Duration::from_millis(50)).expect("next");
        }
        source.backfill_progress()[0].rows_read
    };
    let applied = sink.rows.len() as u64;
    let after = sink.last_snapshot_id.clone().expect("a snapshot row applied");
    assert_eq!(applied, 4 * chunk as u64);
    assert_eq!(
        read_first - applied,
        chunk as u64,
        "one chunk in flight: read {read_first}, applied {applied}"
    );
    // While it is down: rows before and after the resume point change.
    c.batch_execute(
        "UPDATE bf_items SET name = 'while down' WHERE id IN (3, 4000); DELETE FROM bf_items WHERE id = 4001",
    )
    .expect("writes");
    // The second source resumes after the last applied row.
    let mut source = LiveSource::connect(cfg).expect("source again");
    source.start().expect("start again");
    let mut decoder = decoder(&source);
    let resumed =
        Request::Backfill { sink: sink_name(), indexes: vec![index(INDEX)], after: Some(after.clone()) };
    source.backfill(resumed).expect("resumed backfill");
    let first_batch_at = sink.snapshot_batches;
    let mut first_resumed: Option<i64> = None;
    while sink.complete.is_none() {
        if let Some(item) = source.next_item(&mut decoder, Duration::from_millis(200)).expect("next") {
            if let LiveItem::Snapshot { item: LaneItem::Batch(b), .. } = &item {
                if sink.snapshot_batches == first_batch_at {
                    first_resumed = b.envelopes.first().map(|e| e.id.parse().expect("id"));
                }
            }
            sink.take(&mut source, item);
        }
    }
    let read_second = source.backfill_progress()[0].rows_read;
    let after: i64 = after.parse().expect("id");
    assert_eq!(first_resumed, Some(after + 1), "the resumed backfill starts right after the id given");
    // Every row after the resume point once (one was deleted meanwhile), none before it again.
    assert_eq!(read_second, rows as u64 - applied - 1, "read again: {read_second}");
    eprintln!(
        "interrupted after {applied} rows applied ({read_first} read: {} re-read, bounded by one chunk of {chunk}); resumed: {read_second} read",
        read_first - applied
    );
    sink.drain(&mut source, &mut decoder, &mut c, 2);
    assert_equal(&sink.rows, &table(&mut c));
    drop(source);
    drop_slot(slot);
    sql().batch_execute("DROP TABLE bf_items, bf_sentinel").expect("drop");
}

#[test]
#[ignore = "needs a PostgreSQL with wal_level = logical (LANESTREAM_PG_URL); run by scripts/e2e-postgres.sh"]
fn tables_without_a_primary_key_unknown_indexes_and_bad_ids_are_refused_by_name() {
    let _server = serial();
    let slot = "t_backfill_refused";
    drop_slot(slot);
    load(10);
    sql()
        .batch_execute(
            "DROP TABLE IF EXISTS bf_nokey; CREATE TABLE bf_nokey (a int, b text); \
             ALTER TABLE bf_nokey REPLICA IDENTITY FULL",
        )
        .expect("table");
    let mut source = LiveSource::connect(config(slot)).expect("source");
    source.start().expect("start");
    let refused = |source: &mut LiveSource, request: Request| match source.backfill(request) {
        Err(e @ LiveError::BackfillRefused { .. }) => e.to_string(),
        other => panic!("not refused: {other:?}"),
    };
    let e = refused(&mut source, Request::backfill(sink_name(), vec![index("public_bf_nokey")]));
    assert!(e.contains("public.bf_nokey") && e.contains("no primary key"), "{e}");
    let e = refused(&mut source, Request::backfill(sink_name(), vec![index("public_nothing_here")]));
    assert!(e.contains("public_nothing_here") && e.contains("no table of publication"), "{e}");
    let bad = Request::Backfill { sink: sink_name(), indexes: vec![index(INDEX)], after: Some("1:2".into()) };
    let e = refused(&mut source, bad);
    assert!(e.contains("2 key values") && e.contains("1 columns"), "{e}");
    // Nothing was queued: the stream carries on, no snapshot item comes.
    let mut decoder = decoder(&source);
    sql().execute("INSERT INTO bf_items VALUES (100, 1, 'x', 1, true)", &[]).expect("insert");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match source.next_item(&mut decoder, Duration::from_millis(200)).expect("next") {
            Some(LiveItem::Change(b)) if b.envelopes.iter().any(|e| e.id == "100") => break,
            Some(LiveItem::Snapshot { item, .. }) => panic!("a refused backfill published {item:?}"),
            _ => assert!(Instant::now() < deadline, "the insert did not come"),
        }
    }
    drop(source);
    drop_slot(slot);
    sql().batch_execute("DROP TABLE bf_items, bf_sentinel").expect("drop");
    sql().batch_execute("DROP TABLE bf_nokey").expect("drop bf_nokey");
}

#[test]
#[ignore = "needs a PostgreSQL with wal_level = logical (LANESTREAM_PG_URL); run by scripts/e2e-postgres.sh"]
fn two_indexes_are_served_in_order_and_after_resumes_the_first_on_a_composite_text_key() {
    let _server = serial();
    let slot = "t_backfill_two";
    drop_slot(slot);
    load(300);
    let mut c = sql();
    // PRIMARY KEY (b, a): read in (b, a) order; ids are a:b (column order), b escaped.
    c.batch_execute(
        "DROP TABLE IF EXISTS bf_other; \
         CREATE TABLE bf_other (a int, b text, v text, PRIMARY KEY (b, a)); \
         INSERT INTO bf_other SELECT i, 'k:' || (i % 10) || E'\\\\', 'v' || i FROM generate_series(1, 500) i",
    )
    .expect("bf_other");
    let mut cfg = config(slot);
    cfg.backfill_chunk_rows = 64;
    let mut source = LiveSource::connect(cfg).expect("source");
    source.start().expect("start");
    let mut decoder = decoder(&source);
    // Resume after the row (a 7, b 'k:7\'): id 7:k\:7\\ .
    let after = "7:k\\:7\\\\".to_owned();
    let indexes = vec![index("public_bf_other"), index(INDEX)];
    let request = Request::Backfill { sink: sink_name(), indexes: indexes.clone(), after: Some(after) };
    source.backfill(request).expect("backfill");
    let mut seen: Vec<(String, String)> = Vec::new();
    let complete = loop {
        match source.next_item(&mut decoder, Duration::from_millis(200)).expect("next") {
            Some(LiveItem::Snapshot { item: LaneItem::Batch(b), .. }) => {
                seen.extend(b.envelopes.iter().map(|e| (e.index.as_str().to_owned(), e.id.clone())));
            }
            Some(LiveItem::Snapshot { item: LaneItem::SnapshotComplete { indexes }, .. }) => break indexes,
            _ => {}
        }
    };
    assert_eq!(complete, indexes);
    let expected_other: Vec<String> = c
        .query(
            "SELECT a || ':' || replace(replace(b, E'\\\\', E'\\\\\\\\'), ':', E'\\\\:') FROM bf_other \
             WHERE (b, a) > (E'k:7\\\\', 7) ORDER BY b, a",
            &[],
        )
        .expect("expected")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let expected: Vec<(String, String)> = expected_other
        .into_iter()
        .map(|id| ("public_bf_other".to_owned(), id))
        .chain((1..=300).map(|i| (INDEX.to_owned(), i.to_string())))
        .collect();
    assert!(expected.len() > 300 + 10, "rows after the resume point: {}", expected.len());
    assert_eq!(seen, expected, "every row after the id, in key order, then the second index whole");
    drop(source);
    drop_slot(slot);
    sql().batch_execute("DROP TABLE bf_items, bf_sentinel, bf_other").expect("drop");
}
