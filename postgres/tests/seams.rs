//! The pipeline's seams against a real PostgreSQL (a throwaway server started for this test
//! binary, or `LANESTREAM_PG_URL`): the rules P1-P4 and P9, each test named after its rule, each
//! comparing every sink's whole output with the source tables.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use lanestream::{IndexName, MemoryStream, Position};
use lanestream_postgres::live::{LiveError, LiveSource};
use lanestream_postgres::ndjson::DurableNdjson;
use lanestream_postgres::pipeline::{Joiners, Pipeline, PipelineError, PipelineReport, Source};
use postgres::Client;
use serde_json::Value;

mod pg_server;
use pg_server::{compare, drop_slot_on as drop_slot, live_config as config, serial, sql_at as sql, url, wal};

/// A pipeline of durable NDJSON sinks in `dir` over the slot, run until everything committed
/// before `end` is published and acked (and the backfills asked meanwhile are served).
fn run(
    source: LiveSource,
    dir: &Path,
    sinks: &[&str],
    joiners: Joiners,
    backfill: &[&str],
    end: Position,
) -> Result<PipelineReport, PipelineError> {
    let stream = MemoryStream::builder().sinks(sinks.iter().copied()).build().expect("stream");
    let mut pipeline = Pipeline::new(stream)
        .joiners(joiners)
        .backfill(backfill.iter().map(|i| IndexName::new(*i).expect("an index")));
    for &name in sinks {
        let (out, owned) = (dir.to_path_buf(), name.to_owned());
        pipeline = pipeline.sink(name, move || DurableNdjson::open(&out, &owned, Duration::from_secs(5)));
    }
    pipeline.run(&mut source.until(Some(end)))
}

/// A sink's durable output replayed in order: index → id → document (upserts replace, deletes
/// remove, truncates clear).
fn replay(dir: &Path, sink: &str) -> BTreeMap<String, BTreeMap<String, Value>> {
    let mut indexes: BTreeMap<String, BTreeMap<String, Value>> = BTreeMap::new();
    let text = std::fs::read_to_string(dir.join(format!("{sink}.ndjson"))).unwrap_or_default();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).expect("a JSON line");
        let rows = indexes.entry(v["index"].as_str().expect("index").to_owned()).or_default();
        let id = v["id"].as_str().expect("id").to_owned();
        match v["op"].as_str().expect("op") {
            "upsert" => {
                rows.insert(id, v["document"].clone());
            }
            "delete" => {
                rows.remove(&id);
            }
            _ => rows.clear(),
        }
    }
    indexes
}

/// A table's rows as the sinks should hold them: id (its `id` column as text) → the row as JSON.
fn table(c: &mut Client, table: &str, columns: &str, filter: &str) -> BTreeMap<String, Value> {
    pg_server::rows(c, table, columns, filter)
}

fn assert_equal(dir: &Path, sinks: &[&str], index: &str, expected: &BTreeMap<String, Value>) {
    for sink in sinks {
        let held = replay(dir, sink).remove(index).unwrap_or_default();
        assert_eq!(
            compare(&held, expected),
            (0, 0, 0),
            "sink {sink}, {index}: (missing, wrong, extra) of {} rows",
            expected.len()
        );
    }
}

/// P2 (fault 2 of the seams issue): two sinks run; the pipeline restarts with a third. Before,
/// the third started at the others' position and held 101 of 1,001 rows; now it is a joiner,
/// backfilled beside the stream, and holds every row; `Joiners::Refuse` names it instead.
#[test]
fn p2_a_sink_added_to_a_pipeline_with_history_gets_that_history() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql(&url);
    drop_slot(&mut c, "s_p2");
    c.batch_execute(
        "DROP TABLE IF EXISTS p2_t; CREATE TABLE p2_t (id int PRIMARY KEY, name text, v int);
         DROP PUBLICATION IF EXISTS p2_pub; CREATE PUBLICATION p2_pub FOR TABLE p2_t;",
    )
    .expect("set-up");
    let dir = tempfile::tempdir().expect("dir");
    let source = LiveSource::connect(config(&url, "s_p2", "p2_pub")).expect("source");
    c.batch_execute("INSERT INTO p2_t SELECT g, 'row ' || g, g FROM generate_series(1, 900) g")
        .expect("rows");
    let end = wal(&mut c);
    // The first two: new sinks on a new slot, the tables hold rows: backfilled (the default).
    run(source, dir.path(), &["search", "cache"], Joiners::default(), &[], end).expect("first run");
    c.batch_execute("INSERT INTO p2_t SELECT g, 'row ' || g, g FROM generate_series(901, 1001) g")
        .expect("rows");
    c.batch_execute("UPDATE p2_t SET v = v + 1 WHERE id % 10 = 0; DELETE FROM p2_t WHERE id % 7 = 0")
        .expect("changes");
    // A third sink joins: refused when asked to be, backfilled by default.
    let source = LiveSource::connect(config(&url, "s_p2", "p2_pub")).expect("source");
    let end = wal(&mut c);
    let e = run(source, dir.path(), &["search", "cache", "archive"], Joiners::Refuse, &[], end).unwrap_err();
    assert!(matches!(&e, PipelineError::Refused { sink, .. } if sink.as_str() == "archive"), "{e}");
    assert!(e.to_string().contains("Joiners::Backfill"), "{e}");
    assert!(!dir.path().join("archive.checkpoint").exists(), "a refused start writes nothing");
    let source = LiveSource::connect(config(&url, "s_p2", "p2_pub")).expect("source");
    let report =
        run(source, dir.path(), &["search", "cache", "archive"], Joiners::default(), &[], end).expect("run");
    assert_eq!(report.backfills_served, 1, "the joiner's backfill only: {report:?}");
    let expected = table(&mut c, "p2_t", "*", "");
    assert_eq!(expected.len(), 1001 - 1001 / 7);
    assert_equal(dir.path(), &["search", "cache", "archive"], "public_p2_t", &expected);
    drop_slot(&mut c, "s_p2");
}

/// P2 (fault 2, its second half): a table added to the publication while the pipeline runs, and
/// one added while it is down, are backfilled: before, only the changes after the addition
/// reached the sinks (100 of 150 rows).
#[test]
fn p2_a_table_that_joins_the_publication_is_backfilled() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql(&url);
    drop_slot(&mut c, "s_p2t");
    c.batch_execute(
        "DROP TABLE IF EXISTS p2_a, p2_b, p2_c;
         CREATE TABLE p2_a (id int PRIMARY KEY, v int); CREATE TABLE p2_b (id int PRIMARY KEY, v int);
         CREATE TABLE p2_c (id int PRIMARY KEY, v int);
         DROP PUBLICATION IF EXISTS p2t_pub; CREATE PUBLICATION p2t_pub FOR TABLE p2_a;
         INSERT INTO p2_b SELECT g, g FROM generate_series(1, 50) g;
         INSERT INTO p2_c SELECT g, g FROM generate_series(1, 70) g;",
    )
    .expect("set-up");
    let dir = tempfile::tempdir().expect("dir");
    let source = LiveSource::connect(config(&url, "s_p2t", "p2t_pub")).expect("source");
    c.batch_execute("INSERT INTO p2_a VALUES (1, 1)").expect("row");
    let end = wal(&mut c);
    run(source, dir.path(), &["search"], Joiners::default(), &[], end).expect("first run");
    // While running: p2_b joins, then 100 more rows of it (the pipeline runs in a thread).
    let mut source = LiveSource::connect(config(&url, "s_p2t", "p2t_pub")).expect("source");
    let url2 = url.clone();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        let mut c = sql(&url2);
        c.batch_execute("ALTER PUBLICATION p2t_pub ADD TABLE p2_b").expect("add");
        c.batch_execute("INSERT INTO p2_b SELECT g, g FROM generate_series(51, 150) g").expect("rows");
    });
    let stream = MemoryStream::builder().sinks(["search"]).build().expect("stream");
    let pipeline = Pipeline::new(stream);
    let stop = pipeline.stop_handle();
    let out = dir.path().to_path_buf();
    let pipeline =
        pipeline.sink("search", move || DurableNdjson::open(&out, "search", Duration::from_secs(5)));
    let (url3, dir3) = (url.clone(), dir.path().to_path_buf());
    let stopper = std::thread::spawn(move || {
        writer.join().expect("writer");
        let expected = table(&mut sql(&url3), "p2_b", "*", "");
        // Until the sink holds the table whole (its backfill and the stream), then stop.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while compare(&replay(&dir3, "search").remove("public_p2_b").unwrap_or_default(), &expected)
            != (0, 0, 0)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.stop();
    });
    let report = pipeline.run(&mut source).expect("second run");
    drop(source); // lets the slot go
    stopper.join().expect("stopper");
    assert_eq!(report.sinks[0].backfills_asked, 1, "{report:?}");
    assert_equal(dir.path(), &["search"], "public_p2_b", &table(&mut c, "p2_b", "*", ""));
    // While down: p2_c joins, with no change of it after (only the start can tell).
    c.batch_execute("ALTER PUBLICATION p2t_pub ADD TABLE p2_c; INSERT INTO p2_a VALUES (2, 2)").expect("add");
    let source = LiveSource::connect(config(&url, "s_p2t", "p2t_pub")).expect("source");
    let end = wal(&mut c);
    let report = run(source, dir.path(), &["search"], Joiners::default(), &[], end).expect("third run");
    assert_eq!(report.backfills_served, 1, "{report:?}");
    assert_equal(dir.path(), &["search"], "public_p2_c", &table(&mut c, "p2_c", "*", ""));
    assert_equal(dir.path(), &["search"], "public_p2_a", &table(&mut c, "p2_a", "*", ""));
    drop_slot(&mut c, "s_p2t");
}

/// P1 (fault 4): the slot dropped and created again after the sinks' state, by the library
/// (`create_slot`) or by hand, while a change was committed in between: the pipeline itself
/// refuses to start, naming both positions (before, only the harness checked it, and a library
/// user lost the row).
#[test]
fn p1_a_slot_that_resumes_past_a_sinks_state_is_refused_by_the_pipeline() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql(&url);
    drop_slot(&mut c, "s_p1");
    c.batch_execute(
        "DROP TABLE IF EXISTS p1_t; CREATE TABLE p1_t (id int PRIMARY KEY, v int);
         DROP PUBLICATION IF EXISTS p1_pub; CREATE PUBLICATION p1_pub FOR TABLE p1_t;",
    )
    .expect("set-up");
    let dir = tempfile::tempdir().expect("dir");
    let source = LiveSource::connect(config(&url, "s_p1", "p1_pub")).expect("source");
    c.batch_execute("INSERT INTO p1_t VALUES (1, 1)").expect("row");
    let end = wal(&mut c);
    run(source, dir.path(), &["search"], Joiners::default(), &[], end).expect("first run");
    let before = std::fs::read(dir.path().join("search.ndjson")).expect("output");
    for by_hand in [false, true] {
        drop_slot(&mut c, "s_p1");
        c.batch_execute("INSERT INTO p1_t VALUES (2, 2) ON CONFLICT (id) DO UPDATE SET v = p1_t.v + 1")
            .expect("a change no slot decodes");
        if by_hand {
            c.batch_execute("SELECT pg_create_logical_replication_slot('s_p1', 'pgoutput')").expect("slot");
        }
        let source = LiveSource::connect(config(&url, "s_p1", "p1_pub")).expect("source");
        let end = wal(&mut c);
        let e = run(source, dir.path(), &["search"], Joiners::default(), &[], end).unwrap_err();
        let PipelineError::Source(inner) = &e else { panic!("{e}") };
        let live = inner.downcast_ref::<LiveError>().expect("the live source's error");
        assert!(matches!(live, LiveError::SlotGap { dropped, .. } if *dropped != by_hand), "{e}");
        assert!(e.to_string().contains("Reset the sink"), "{e}");
        assert_eq!(
            std::fs::read(dir.path().join("search.ndjson")).expect("output"),
            before,
            "nothing written"
        );
        let slots: i64 = c
            .query_one("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 's_p1'", &[])
            .expect("slots")
            .get(0);
        assert_eq!(slots, i64::from(by_hand), "a slot the pipeline created over a gap is dropped again");
    }
    drop_slot(&mut c, "s_p1");
}

/// P3 (fault 1): a backfill asked for and stopped before its sink made any of it durable (the
/// request lane of a `MemoryStream` dies with the process): the next start asks again by
/// itself, and the sink ends equal to the table. Before, the request died with the stream and
/// nothing asked again (40,791 of 85,073 rows missing in the run).
#[test]
fn p3_a_backfill_is_owed_durably_before_it_is_asked_and_asked_again_after_a_restart() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql(&url);
    drop_slot(&mut c, "s_p3");
    c.batch_execute(
        "DROP TABLE IF EXISTS p3_t; CREATE TABLE p3_t (id int PRIMARY KEY, v text);
         INSERT INTO p3_t SELECT g, md5(g::text) FROM generate_series(1, 3000) g;
         DROP PUBLICATION IF EXISTS p3_pub; CREATE PUBLICATION p3_pub FOR TABLE p3_t;",
    )
    .expect("set-up");
    let dir = tempfile::tempdir().expect("dir");
    // A new sink told it needs nothing from before; then an explicit backfill, stopped at once.
    let source = LiveSource::connect(config(&url, "s_p3", "p3_pub")).expect("source");
    let end = wal(&mut c);
    run(source, dir.path(), &["search"], Joiners::LiveOnly, &[], end).expect("first run");
    let stream = MemoryStream::builder().sinks(["search"]).build().expect("stream");
    let out = dir.path().to_path_buf();
    let pipeline = Pipeline::new(stream)
        .backfill([IndexName::new("public_p3_t").expect("index")])
        .sink("search", move || DurableNdjson::open(&out, "search", Duration::from_secs(5)));
    pipeline.stop_handle().stop(); // stopped before it read anything
    let mut source = LiveSource::connect(config(&url, "s_p3", "p3_pub")).expect("source");
    pipeline.run(&mut source).expect("stopped run");
    drop(source); // lets the slot go
    let (_, state) =
        DurableNdjson::read_checkpoint(dir.path(), "search").expect("read").expect("a checkpoint");
    assert_eq!(state.owed.len(), 1, "owed durably: {state:?}");
    assert!(replay(dir.path(), "search").get("public_p3_t").is_none_or(BTreeMap::is_empty));
    // Restarted without asking: the owed backfill is asked by the engine itself.
    c.batch_execute("UPDATE p3_t SET v = 'changed' WHERE id % 3 = 0; DELETE FROM p3_t WHERE id % 5 = 0")
        .expect("changes");
    let source = LiveSource::connect(config(&url, "s_p3", "p3_pub")).expect("source");
    let end = wal(&mut c);
    let report = run(source, dir.path(), &["search"], Joiners::default(), &[], end).expect("restart");
    assert_eq!(report.backfills_served, 1, "{report:?}");
    let (_, state) =
        DurableNdjson::read_checkpoint(dir.path(), "search").expect("read").expect("a checkpoint");
    assert!(state.owed.is_empty(), "complete: {state:?}");
    assert_equal(dir.path(), &["search"], "public_p3_t", &table(&mut c, "p3_t", "*", ""));
    drop_slot(&mut c, "s_p3");
}

/// P4 (fault 3): a backfill sends exactly what the publication publishes: its column list (a
/// PII column never leaves the database) and its row filter (rows outside it are not copied).
/// Before, the excluded column reached every sink in every snapshot line, and rows outside the
/// filter were copied and never updated or deleted afterwards. (PostgreSQL wants a row filter's
/// columns in the replica identity, and the identity in the column list, for a publication of
/// updates: the filter here is on the key.)
#[test]
fn p4_a_backfill_follows_the_publications_column_list_and_row_filter() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql(&url);
    drop_slot(&mut c, "s_p4");
    c.batch_execute(
        "DROP TABLE IF EXISTS p4_people, p4_rows;
         CREATE TABLE p4_people (id int PRIMARY KEY, name text, ssn text);
         INSERT INTO p4_people SELECT g, 'n' || g, 'secret-' || g FROM generate_series(1, 1500) g;
         CREATE TABLE p4_rows (id int PRIMARY KEY, v text);
         INSERT INTO p4_rows SELECT g, 'v' || g FROM generate_series(1, 1500) g;
         DROP PUBLICATION IF EXISTS p4_pub;
         CREATE PUBLICATION p4_pub FOR TABLE p4_people (id, name), p4_rows WHERE (id % 3 <> 0);",
    )
    .expect("set-up");
    let dir = tempfile::tempdir().expect("dir");
    let source = LiveSource::connect(config(&url, "s_p4", "p4_pub")).expect("source");
    c.batch_execute(
        "INSERT INTO p4_people VALUES (5000, 'late', 'secret-late'); UPDATE p4_people SET name = 'x' WHERE id = 7;
         UPDATE p4_rows SET v = 'changed' WHERE id IN (1, 3); UPDATE p4_rows SET id = 3000 WHERE id = 6;
         DELETE FROM p4_rows WHERE id = 2;",
    )
    .expect("changes");
    let end = wal(&mut c);
    let report = run(source, dir.path(), &["search", "cache"], Joiners::default(), &[], end).expect("run");
    assert_eq!(report.backfills_served, 2, "each new sink backfilled: {report:?}");
    for sink in ["search", "cache"] {
        let text = std::fs::read_to_string(dir.path().join(format!("{sink}.ndjson"))).expect("output");
        assert!(!text.contains("secret"), "{sink}: a column the publication excludes left the database");
        assert!(text.contains("\"position\":null"), "{sink}: backfilled");
    }
    let people = table(&mut c, "p4_people", "id, name", "");
    assert_equal(dir.path(), &["search", "cache"], "public_p4_people", &people);
    let rows = table(&mut c, "p4_rows", "*", "WHERE id % 3 <> 0");
    assert_eq!(rows.len(), 999, "1,000 in the filter, one deleted, one moved out of it by its key");
    assert_equal(dir.path(), &["search", "cache"], "public_p4_rows", &rows);
    drop_slot(&mut c, "s_p4");
}

/// P9 (fault 5): creating the publication never breaks the application's writes: with a table
/// that has no replica identity, `create_slot` refuses, naming it and the statement to use, and
/// creates nothing; the application's UPDATE still works. Before, it created `FOR ALL TABLES`
/// and PostgreSQL then refused the UPDATE.
#[test]
fn p9_a_publication_is_never_created_over_a_table_without_a_replica_identity() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql(&url);
    // The other tests' tables stay: this test's database is another one.
    c.batch_execute("DROP DATABASE IF EXISTS p9_db WITH (FORCE)").expect("drop");
    c.batch_execute("CREATE DATABASE p9_db").expect("create");
    let url9 = format!("{url} dbname=p9_db");
    let mut d = sql(&url9);
    d.batch_execute(
        "CREATE TABLE keyed (id int PRIMARY KEY, v int); CREATE TABLE log (at timestamptz, what text);
         INSERT INTO log VALUES (now(), 'a');",
    )
    .expect("set-up");
    let e = LiveSource::connect(config(&url9, "s_p9", "p9_pub")).unwrap_err();
    assert!(matches!(&e, LiveError::UnpublishableTables { tables, .. } if tables == &["public.log"]), "{e}");
    assert!(e.to_string().contains("CREATE PUBLICATION \"p9_pub\" FOR TABLE public.keyed"), "{e}");
    let publications: i64 = d.query_one("SELECT count(*) FROM pg_publication", &[]).expect("count").get(0);
    assert_eq!(publications, 0, "nothing created");
    d.batch_execute("UPDATE log SET what = 'b'; DELETE FROM log")
        .expect("the application's writes still work");
    // With a replica identity, the publication names every table.
    d.batch_execute("ALTER TABLE log REPLICA IDENTITY FULL").expect("identity");
    let source = LiveSource::connect(config(&url9, "s_p9", "p9_pub")).expect("created");
    drop(source);
    let tables: Vec<String> = d
        .query("SELECT tablename::text FROM pg_publication_tables WHERE pubname = 'p9_pub' ORDER BY 1", &[])
        .expect("tables")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(tables, ["keyed", "log"]);
    d.batch_execute("UPDATE log SET what = 'c'").expect("still works");
    drop_slot(&mut d, "s_p9");
    drop(d);
    c.batch_execute("DROP DATABASE p9_db WITH (FORCE)").expect("drop");
}

/// P9 (fault 6): `NaN`, `Infinity` and `-Infinity` keys are distinct values, in the stream and
/// in a backfill; before, the pipeline stopped for good on "key column is null".
#[test]
fn p9_nan_and_infinite_keys_are_distinct_in_the_stream_and_the_backfill() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql(&url);
    drop_slot(&mut c, "s_p9n");
    c.batch_execute(
        "DROP TABLE IF EXISTS p9_n; CREATE TABLE p9_n (id numeric PRIMARY KEY, v text);
         INSERT INTO p9_n VALUES ('NaN', 'before'), (1.5, 'before');
         DROP PUBLICATION IF EXISTS p9n_pub; CREATE PUBLICATION p9n_pub FOR TABLE p9_n;",
    )
    .expect("set-up");
    let dir = tempfile::tempdir().expect("dir");
    let source = LiveSource::connect(config(&url, "s_p9n", "p9n_pub")).expect("source");
    c.batch_execute(
        "INSERT INTO p9_n VALUES ('Infinity', 'a'), ('-Infinity', 'b');
         UPDATE p9_n SET v = 'changed' WHERE id = 'NaN';",
    )
    .expect("changes");
    let end = wal(&mut c);
    run(source, dir.path(), &["search"], Joiners::default(), &[], end).expect("run");
    let held = replay(dir.path(), "search").remove("public_p9_n").unwrap_or_default();
    let ids: Vec<&str> = held.keys().map(String::as_str).collect();
    assert_eq!(ids, ["-Infinity", "1.5", "Infinity", "NaN"]);
    assert_eq!(held["NaN"], serde_json::json!({"id": "NaN", "v": "changed"}));
    assert_eq!(held["-Infinity"], serde_json::json!({"id": "-Infinity", "v": "b"}));
    drop_slot(&mut c, "s_p9n");
}

/// Fault 7: a slot invalidated by `max_slot_wal_keep_size` while the pipeline is attached is
/// reported as invalidated (it can never resume: backfill on a new slot), not as a connection
/// an administrator terminated.
#[test]
fn a_slot_invalidated_while_attached_is_reported_as_invalidated() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql(&url);
    drop_slot(&mut c, "s_inv");
    c.batch_execute(
        "DROP TABLE IF EXISTS inv_t, inv_fill; CREATE TABLE inv_t (id int PRIMARY KEY);
         CREATE TABLE inv_fill (v text);
         DROP PUBLICATION IF EXISTS inv_pub; CREATE PUBLICATION inv_pub FOR TABLE inv_t;",
    )
    .expect("set-up");
    c.batch_execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'").expect("keep size");
    c.batch_execute("SELECT pg_reload_conf()").expect("reload");
    let mut source = LiveSource::connect(config(&url, "s_inv", "inv_pub")).expect("source");
    source.open().expect("stream");
    // WAL the slot keeps and never confirms, until the checkpointer invalidates it.
    let result = (|| {
        for _ in 0..40 {
            c.batch_execute(
                "INSERT INTO inv_fill SELECT repeat('x', 1000) FROM generate_series(1, 3000);
                 SELECT pg_switch_wal(); CHECKPOINT;",
            )
            .expect("WAL");
            for _ in 0..5 {
                source.next(Duration::from_millis(100))?;
            }
        }
        Ok::<(), LiveError>(())
    })();
    c.batch_execute("ALTER SYSTEM RESET max_slot_wal_keep_size").expect("reset");
    c.batch_execute("SELECT pg_reload_conf()").expect("reload");
    let e = result.expect_err("the slot is invalidated");
    assert!(matches!(e, LiveError::SlotInvalidated { .. }), "{e}");
    assert!(
        e.to_string().contains("can never resume") && e.to_string().contains("pg_drop_replication_slot"),
        "{e}"
    );
    drop(source);
    drop_slot(&mut c, "s_inv");
    c.batch_execute("DROP TABLE inv_fill").expect("drop");
}
