//! A table that leaves the publication and rejoins it while the pipeline runs (P2, with P3 and
//! P4), adversarially, against a real PostgreSQL (a throwaway server started for this test
//! binary, or `LANESTREAM_PG_URL`): `ALTER PUBLICATION ... DROP TABLE` then `ADD TABLE` with
//! changes in between (slowly, so that a check sees the table out, and between two checks),
//! with changes after and during the resync's backfill; `DROP TABLE` and `CREATE TABLE` of the
//! same name (an explicit publication, and `FOR ALL TABLES`); a row filter and a column list
//! changed by `ALTER PUBLICATION ... SET TABLE`; a rejoin while the table's first backfill is
//! being served; two sinks; a stop between the resync and the end of its backfill, then a
//! restart on the same slot and the same sinks' state; and a table that never left, next to one
//! that rejoins.
//!
//! Every test ends by comparing every sink's **whole** content (all it applied, over every
//! run, by the sink rules: `Replica`) with the table as the publication publishes it now, and
//! checks that the sink owes no backfill any more. A table that rejoins while the pipeline is
//! stopped is not detected (a known residual): no test here does that.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::thread;
use std::time::{Duration, Instant};

use lanestream::pipeline::{
    MemorySink, MetricsHandle, OwedBackfill, PipelineError, PipelineReport, StopHandle,
};
use lanestream::{LaneItem, MemoryStream, Op};
use lanestream_postgres::live::{LiveConfig, LiveSource};
use lanestream_postgres::pipeline::{Joiners, Pipeline};
use postgres::Client;
use serde_json::{Map, Value};

mod pg_server;
use pg_server::replica::{complete, envelopes, eventually, Replica};
use pg_server::{compare, drop_slot_on, live_config, serial, sql_at, url, wal};

type Rows = BTreeMap<String, Map<String, Value>>;

/// The rejoin check's interval in these tests ([`LiveConfig::publication_check`]).
const CHECK: Duration = Duration::from_millis(200);

/// How long a test waits for its sinks to end equal to the table after the last change.
const SETTLE: Duration = Duration::from_secs(30);

/// The live source's configuration for slot `name` on publication `{name}_pub` of the database
/// of `url`: the rejoin check every [`CHECK`], backfill chunks of 200 rows.
fn config(url: &str, name: &str) -> LiveConfig {
    let mut config = live_config(url, name, &format!("{name}_pub"));
    config.publication_check = Some(CHECK);
    config.backfill_chunk_rows = 200;
    config.retry_budget = Duration::from_secs(30);
    config
}

/// Drops the slot `name` and the publication `{name}_pub`, then runs `ddl` (which makes the
/// tables and the publication again).
fn setup(c: &mut Client, name: &str, ddl: &str) {
    drop_slot_on(c, name);
    c.batch_execute(&format!("DROP PUBLICATION IF EXISTS {name}_pub; {ddl}")).expect("set-up");
}

/// What a sink should hold of a table: `SELECT columns FROM table filter` (the publication's
/// column list and row filter), in the index `public_{table}`.
#[derive(Clone, Copy)]
struct Published<'a> {
    table: &'a str,
    columns: &'a str,
    filter: &'a str,
}

impl Published<'_> {
    fn whole(table: &str) -> Published<'_> {
        Published { table, columns: "*", filter: "" }
    }

    /// `public_{table}`, or `{schema}_{table}` for a table named `schema.table`.
    fn index(&self) -> String {
        match self.table.split_once('.') {
            Some((schema, table)) => format!("{schema}_{table}"),
            None => format!("public_{}", self.table),
        }
    }

    fn rows(&self, c: &mut Client) -> Rows {
        pg_server::rows(c, self.table, self.columns, self.filter)
    }
}

/// A pipeline over `source` with the in-memory sinks `sinks` (new ones are backfilled first),
/// running in a thread until stopped.
struct Run {
    stop: StopHandle,
    metrics: MetricsHandle,
    thread: thread::JoinHandle<Result<PipelineReport, PipelineError>>,
}

/// Starts a [`Run`]. With `paced`: lanes of 4 items and runs of one item, so a slow sink
/// ([`MemorySink::with_delay`]) is slow per item and the backfill is served no faster.
fn start(source: LiveSource, sinks: &[(&str, &MemorySink)], paced: bool) -> Run {
    let builder = MemoryStream::builder().sinks(sinks.iter().map(|(name, _)| *name));
    let builder = if paced { builder.capacity(4) } else { builder };
    let mut pipeline = Pipeline::new(builder.build().expect("stream"))
        .joiners(Joiners::Backfill)
        .drain_timeout(Duration::from_secs(30));
    if paced {
        pipeline = pipeline.max_run(1);
    }
    for (name, sink) in sinks {
        let sink = (*sink).clone();
        pipeline = pipeline.sink(*name, move || Ok::<_, Infallible>(sink.clone()));
    }
    let (stop, metrics) = (pipeline.stop_handle(), pipeline.metrics());
    let thread = thread::spawn(move || {
        let mut source = source;
        pipeline.run(&mut source)
    });
    Run { stop, metrics, thread }
}

/// What `sink` holds of `index` (all it applied, by the sink rules), and how many partial
/// updates of rows it did not hold it was handed.
fn held(sink: &MemorySink, index: &str) -> (Rows, usize) {
    let items: Vec<LaneItem> = sink.applied().clone();
    let replica = Replica::apply(&items);
    (replica.rows.get(index).cloned().unwrap_or_default(), replica.unknown)
}

/// The backfills `sink`'s last commit owes.
fn owed(sink: &MemorySink) -> Vec<OwedBackfill> {
    sink.committed().as_ref().map(|s| s.owed.clone()).unwrap_or_default()
}

/// Truncates of `index` among `items` (what a sink is handed for a resync).
fn truncates(items: &[LaneItem], index: &str) -> usize {
    envelopes(items).iter().filter(|e| e.op == Op::Truncate && e.index.as_str() == index).count()
}

/// Snapshot (backfill) rows of `index` among `items`.
fn snapshot_rows(items: &[LaneItem], index: &str) -> usize {
    envelopes(items).iter().filter(|e| e.position.is_none() && e.index.as_str() == index).count()
}

/// Waits until every sink completed its first backfill and holds `published` whole: the sinks
/// hold the table before the test makes it leave.
fn wait_held(sinks: &[(&str, &MemorySink)], c: &mut Client, published: Published) {
    let index = published.index();
    eventually("the sinks hold the table", Duration::from_secs(30), || {
        let expected = published.rows(c);
        sinks.iter().all(|(_, s)| complete(s) && compare(&held(s, &index).0, &expected) == (0, 0, 0))
    });
}

/// One sink's content at the end.
struct Outcome {
    sink: String,
    rows: Rows,
    unknown: usize,
    truncates: usize,
    snapshot_rows: usize,
    owed: Vec<OwedBackfill>,
}

/// Ends the run: lets the rejoin check run at least twice after the last change (3 intervals),
/// takes the server's WAL position, waits (up to [`SETTLE`]) until the pipeline confirmed it
/// and every sink owes nothing and holds `published` whole, then stops the pipeline (heartbeats
/// on `c` meanwhile, so the slot follows). Returns the report and each sink's whole content.
fn finish(
    run: Run,
    sinks: &[(&str, &MemorySink)],
    c: &mut Client,
    published: Published,
) -> (PipelineReport, Vec<Outcome>) {
    thread::sleep(CHECK * 3);
    let end = wal(c);
    let index = published.index();
    let started = Instant::now();
    let deadline = started + SETTLE;
    let mut said = started;
    loop {
        let expected = published.rows(c);
        if said.elapsed() >= Duration::from_secs(1) {
            // Progress, shown with a failure: what each sink holds and owes, second by second.
            said = Instant::now();
            for (name, s) in sinks {
                let items: Vec<LaneItem> = s.applied().clone();
                eprintln!(
                    "{:?} after the end was taken: sink {name}: {} items, {} snapshot rows and {} truncates of {index}, {:?} of {} rows; owed {:?}; confirmed {:?} (end {end})",
                    started.elapsed(),
                    items.len(),
                    snapshot_rows(&items, &index),
                    truncates(&items, &index),
                    compare(&held(s, &index).0, &expected),
                    expected.len(),
                    owed(s),
                    run.metrics.snapshot().confirmed,
                );
            }
        }
        let caught_up = run.metrics.snapshot().confirmed.is_some_and(|p| p >= end);
        let settled = sinks
            .iter()
            .all(|(_, s)| owed(s).is_empty() && compare(&held(s, &index).0, &expected) == (0, 0, 0));
        if (caught_up && settled) || run.thread.is_finished() || Instant::now() >= deadline {
            break;
        }
        c.execute("SELECT pg_logical_emit_message(false, 'lanestream_heartbeat', '')", &[])
            .expect("heartbeat");
        thread::sleep(Duration::from_millis(100));
    }
    run.stop.stop();
    let report = run.thread.join().expect("the pipeline thread").expect("the pipeline runs");
    let outcomes = sinks
        .iter()
        .map(|(name, sink)| {
            let items: Vec<LaneItem> = sink.applied().clone();
            let replica = Replica::apply(&items);
            Outcome {
                sink: (*name).to_owned(),
                rows: replica.rows.get(&index).cloned().unwrap_or_default(),
                unknown: replica.unknown,
                truncates: truncates(&items, &index),
                snapshot_rows: snapshot_rows(&items, &index),
                owed: owed(sink),
            }
        })
        .collect();
    (report, outcomes)
}

/// Every sink holds exactly `expected` (its whole content: (missing, wrong, extra) rows), was
/// handed no partial update of a row it did not hold, and owes nothing.
fn assert_equal(outcomes: &[Outcome], index: &str, expected: &Rows) {
    for o in outcomes {
        assert_eq!(
            (compare(&o.rows, expected), o.unknown, o.owed.is_empty()),
            ((0, 0, 0), 0, true),
            "sink {}, {index}: ((missing, wrong, extra) of {} rows, partial updates of rows not held, \
             nothing owed); the sink holds {} rows, was handed {} truncates of the index (resyncs) \
             and {} snapshot rows of it; owed: {:?}",
            o.sink,
            expected.len(),
            o.rows.len(),
            o.truncates,
            o.snapshot_rows,
            o.owed
        );
    }
}

/// The shape most tests here share: one sink `search` (`sink`; with `paced`, see [`start`])
/// over a source of `config`; once it holds `published` whole, `change` on `c`; then
/// [`finish`], and the sink's whole content asserted equal to `published` ([`assert_equal`]).
/// Returns the report and the sink's outcome, for the test's own assertions.
fn held_then(
    c: &mut Client,
    config: LiveConfig,
    sink: &MemorySink,
    paced: bool,
    published: Published,
    change: impl FnOnce(&mut Client),
) -> (PipelineReport, Outcome) {
    let sinks = [("search", sink)];
    let run = start(LiveSource::connect(config).expect("source"), &sinks, paced);
    wait_held(&sinks, c, published);
    change(c);
    let (report, mut outcomes) = finish(run, &sinks, c, published);
    assert_equal(&outcomes, &published.index(), &published.rows(c));
    (report, outcomes.remove(0))
}

/// Changes to `table` (`id int PRIMARY KEY, v text, n int`, rows 1..=`rows`) for `during`, one
/// small transaction at a time, `pause` after each: updates, deletes, inserts from
/// `first_new`, key changes. Returns how many.
fn churn(c: &mut Client, table: &str, rows: i32, first_new: i32, during: Duration, pause: Duration) -> i32 {
    let deadline = Instant::now() + during;
    let mut k = 0;
    while Instant::now() < deadline {
        let id = 1 + (k * 37) % rows;
        let statement = match k % 4 {
            0 => format!("UPDATE {table} SET v = 'churn {k}', n = -n WHERE id = {id}"),
            1 => format!("DELETE FROM {table} WHERE id = {id}"),
            2 => format!(
                "INSERT INTO {table} VALUES ({}, 'inserted {k}', {k}) ON CONFLICT (id) DO UPDATE SET v = excluded.v",
                first_new + k
            ),
            _ => format!("UPDATE {table} SET id = id + 1000000, v = 'moved' WHERE id = {id}"),
        };
        c.batch_execute(&statement).expect("a change");
        k += 1;
        thread::sleep(pause);
    }
    k
}

/// A table `(id int PRIMARY KEY, v text, n int)` of `rows` rows and the publication
/// `{name}_pub` of it alone (the table is named `name` too).
fn plain_table(c: &mut Client, name: &str, rows: i32) {
    setup(
        c,
        name,
        &format!(
            "DROP TABLE IF EXISTS {name}; CREATE TABLE {name} (id int PRIMARY KEY, v text, n int);
             INSERT INTO {name} SELECT g, 'v' || g, g FROM generate_series(1, {rows}) g;
             CREATE PUBLICATION {name}_pub FOR TABLE {name};"
        ),
    );
}

/// Out of the publication, changes that never reach the stream: updates, deletes, inserts.
fn changes_while_out(c: &mut Client, name: &str, rows: i32) {
    c.batch_execute(&format!(
        "UPDATE {name} SET v = 'changed while out', n = -n WHERE id % 5 = 0;
         DELETE FROM {name} WHERE id % 7 = 0;
         INSERT INTO {name} SELECT g, 'inserted while out', g FROM generate_series({rows} + 1, {rows} + 100) g;
         UPDATE {name} SET id = id + 500000 WHERE id % 11 = 0;"
    ))
    .expect("changes while out");
}

/// P2: the table leaves the publication (`DROP TABLE` from it), is updated, deleted from and
/// inserted into while out (changes the stream never carries), stays out long enough for the
/// check to see it out, and is added again; nothing changes it after. The sink, which held the
/// table (backfilled), must end equal to it: the rejoin is a resync (truncate, then backfill).
#[test]
fn p2_a_table_removed_from_the_publication_and_added_again_ends_equal() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql_at(&url);
    let name = "rj_readd";
    plain_table(&mut c, name, 1000);
    let sink = MemorySink::new();
    let published = Published::whole(name);
    held_then(&mut c, config(&url, name), &sink, false, published, |c| {
        c.batch_execute(&format!("ALTER PUBLICATION {name}_pub DROP TABLE {name}")).expect("leave");
        changes_while_out(c, name, 1000);
        thread::sleep(CHECK * 3); // a check sees it out
        c.batch_execute(&format!("ALTER PUBLICATION {name}_pub ADD TABLE {name}")).expect("rejoin");
    });
    drop_slot_on(&mut c, name);
}

/// P2, the fast path: the table leaves, is changed and rejoins within a few milliseconds (three
/// transactions, likely between two checks: no check sees it out, only its publication
/// membership row changed). The sink must end equal.
#[test]
fn p2_a_table_removed_and_added_again_between_two_checks_ends_equal() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql_at(&url);
    let name = "rj_blink";
    plain_table(&mut c, name, 1000);
    let sink = MemorySink::new();
    let published = Published::whole(name);
    held_then(&mut c, config(&url, name), &sink, false, published, |c| {
        c.batch_execute(&format!("ALTER PUBLICATION {name}_pub DROP TABLE {name}")).expect("leave");
        changes_while_out(c, name, 1000);
        c.batch_execute(&format!("ALTER PUBLICATION {name}_pub ADD TABLE {name}")).expect("rejoin");
    });
    drop_slot_on(&mut c, name);
}

/// P2 with changes after the rejoin: as the first test, then two seconds of small transactions
/// (updates, deletes, inserts, key changes; one every 15 ms or so) from the moment the table is
/// added again, so during the resync's backfill (a slow sink: 5,000 rows in chunks of 50, at
/// 3 ms an item: each chunk's two marks are items too). The sink must end equal, and its
/// output must show snapshot rows of the resync's backfill among the changes that followed the
/// rejoin.
#[test]
fn p2_changes_after_a_table_rejoins_and_during_its_resync_end_equal() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql_at(&url);
    let name = "rj_churn";
    plain_table(&mut c, name, 5000);
    let mut config = config(&url, name);
    config.backfill_chunk_rows = 50;
    let source = LiveSource::connect(config).expect("source");
    let sink = MemorySink::new().with_delay(Duration::from_millis(3));
    let sinks = [("search", &sink)];
    let run = start(source, &sinks, true);
    let published = Published::whole(name);
    wait_held(&sinks, &mut c, published);
    c.batch_execute(&format!("ALTER PUBLICATION {name}_pub DROP TABLE {name}")).expect("leave");
    changes_while_out(&mut c, name, 5000);
    thread::sleep(CHECK * 2);
    c.batch_execute(&format!("ALTER PUBLICATION {name}_pub ADD TABLE {name}")).expect("rejoin");
    let n = churn(&mut c, name, 5000, 100_000, Duration::from_secs(2), Duration::from_millis(10));
    assert!(n > 50, "{n} changes after the rejoin");
    let (_, outcomes) = finish(run, &sinks, &mut c, published);
    assert_equal(&outcomes, &published.index(), &published.rows(&mut c));
    // The premise: the resync's backfill and the changes after the rejoin interleaved (a change
    // of the churn, `v` = "churn ...", positioned, between its truncate and its last snapshot row).
    let items: Vec<LaneItem> = sink.applied().clone();
    let all = envelopes(&items);
    let index = published.index();
    let resync =
        all.iter().rposition(|e| e.op == Op::Truncate && e.index.as_str() == index).expect("a resync");
    let last_row = all.iter().rposition(|e| e.position.is_none() && e.index.as_str() == index).expect("rows");
    let interleaved = all[resync..last_row]
        .iter()
        .filter(|e| e.position.is_some() && String::from_utf8_lossy(&e.document).contains("churn"))
        .count();
    assert!(interleaved > 0, "premise: no change after the rejoin came during the resync's backfill");
    drop_slot_on(&mut c, name);
}

/// P2: `DROP TABLE` and `CREATE TABLE` of the same name with other columns and other rows (some
/// ids of the old table's, some new), added to the explicit publication again, then changed.
/// The sink must hold the new table exactly: no row, and no column, of the old one.
#[test]
fn p2_a_table_dropped_and_created_again_ends_equal_to_the_new_table() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql_at(&url);
    let name = "rj_recreate";
    setup(
        &mut c,
        name,
        "DROP TABLE IF EXISTS rj_recreate; CREATE TABLE rj_recreate (id int PRIMARY KEY, v text, old_col int);
         INSERT INTO rj_recreate SELECT g, 'old ' || g, g FROM generate_series(1, 500) g;
         CREATE PUBLICATION rj_recreate_pub FOR TABLE rj_recreate;",
    );
    let source = LiveSource::connect(config(&url, name)).expect("source");
    let sink = MemorySink::new();
    let sinks = [("search", &sink)];
    let run = start(source, &sinks, false);
    wait_held(&sinks, &mut c, Published::whole(name));
    c.batch_execute(
        "DROP TABLE rj_recreate;
         CREATE TABLE rj_recreate (id int PRIMARY KEY, w text, v text);
         INSERT INTO rj_recreate SELECT g, 'w', 'new ' || g FROM generate_series(250, 600) g;
         ALTER PUBLICATION rj_recreate_pub ADD TABLE rj_recreate;
         UPDATE rj_recreate SET w = 'after' WHERE id % 10 = 0;
         DELETE FROM rj_recreate WHERE id % 9 = 0;
         INSERT INTO rj_recreate SELECT g, 'late', 'new ' || g FROM generate_series(601, 650) g;",
    )
    .expect("dropped, created, added, changed");
    let published = Published::whole(name);
    let (_, outcomes) = finish(run, &sinks, &mut c, published);
    for o in &outcomes {
        let old = o.rows.values().filter(|r| r.contains_key("old_col")).count();
        assert_eq!(old, 0, "sink {}: rows with the old table's column", o.sink);
    }
    assert_equal(&outcomes, &published.index(), &published.rows(&mut c));
    drop_slot_on(&mut c, name);
}

/// P2 under a `FOR ALL TABLES` publication (in a database of its own, so that it publishes this
/// table only): `DROP TABLE` and `CREATE TABLE` of the same name with other rows, in one
/// transaction, the table rejoining by itself; then changes. The sink must hold the new table
/// exactly.
#[test]
fn p2_a_table_dropped_and_created_again_under_for_all_tables_ends_equal() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql_at(&url);
    let name = "rj_all";
    drop_slot_on(&mut c, name);
    c.batch_execute("DROP DATABASE IF EXISTS rj_all_db WITH (FORCE)").expect("drop");
    c.batch_execute("CREATE DATABASE rj_all_db").expect("create");
    let url_db = format!("{url} dbname=rj_all_db");
    let mut d = sql_at(&url_db);
    d.batch_execute(
        "CREATE TABLE rj_all (id int PRIMARY KEY, v text);
         INSERT INTO rj_all SELECT g, 'old ' || g FROM generate_series(1, 400) g;
         CREATE PUBLICATION rj_all_pub FOR ALL TABLES;",
    )
    .expect("set-up");
    let source = LiveSource::connect(config(&url_db, name)).expect("source");
    let sink = MemorySink::new();
    let sinks = [("search", &sink)];
    let run = start(source, &sinks, false);
    let published = Published::whole(name);
    wait_held(&sinks, &mut d, published);
    d.batch_execute(
        "BEGIN;
         DROP TABLE rj_all;
         CREATE TABLE rj_all (id int PRIMARY KEY, v text, extra int);
         INSERT INTO rj_all SELECT g, 'new ' || g, g FROM generate_series(300, 700) g;
         COMMIT;
         UPDATE rj_all SET extra = -extra WHERE id % 10 = 0;
         DELETE FROM rj_all WHERE id % 9 = 0;",
    )
    .expect("dropped, created, changed");
    let (_, outcomes) = finish(run, &sinks, &mut d, published);
    assert_equal(&outcomes, &published.index(), &published.rows(&mut d));
    drop_slot_on(&mut d, name);
    drop(d);
    c.batch_execute("DROP DATABASE rj_all_db WITH (FORCE)").expect("drop");
}

/// A database of its own, `{name}_db` (made again), for a publication `FOR ALL TABLES` that
/// publishes the test's tables only: its connection string and a connection.
fn own_database(c: &mut Client, url: &str, name: &str) -> (String, Client) {
    drop_slot_on(c, name);
    c.batch_execute(&format!("DROP DATABASE IF EXISTS {name}_db WITH (FORCE)")).expect("drop");
    c.batch_execute(&format!("CREATE DATABASE {name}_db")).expect("create");
    let url_db = format!("{url} dbname={name}_db");
    let d = sql_at(&url_db);
    (url_db, d)
}

/// P2, in one transaction (no check can see the table out): removed from the publication,
/// changed, added again. Its `pg_publication_rel` row is new: the sink must end equal.
#[test]
fn p2_a_table_removed_and_added_again_in_one_transaction_ends_equal() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql_at(&url);
    let name = "rj_onetx";
    plain_table(&mut c, name, 1000);
    let sink = MemorySink::new();
    let published = Published::whole(name);
    held_then(&mut c, config(&url, name), &sink, false, published, |c| {
        c.batch_execute(&format!(
            "BEGIN;
             ALTER PUBLICATION {name}_pub DROP TABLE {name};
             UPDATE {name} SET v = 'changed while out', n = -n WHERE id % 5 = 0;
             DELETE FROM {name} WHERE id % 7 = 0;
             INSERT INTO {name} SELECT g, 'inserted while out', g FROM generate_series(1001, 1100) g;
             ALTER PUBLICATION {name}_pub ADD TABLE {name};
             COMMIT;"
        ))
        .expect("out and back in one transaction");
    });
    drop_slot_on(&mut c, name);
}

/// P2: a table renamed away and back (one transaction: no check sees the other name), changed
/// under its other name. Its index was not published while it had the other name (the changes
/// went to the other name's index), and came back with the same relation, the same
/// publication row: the sink's index of the table must still end equal to it.
#[test]
fn p2_a_table_renamed_away_and_back_ends_equal() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql_at(&url);
    let name = "rj_rename";
    c.batch_execute("DROP TABLE IF EXISTS rj_rename_tmp").expect("clean");
    plain_table(&mut c, name, 1000);
    let sink = MemorySink::new();
    let published = Published::whole(name);
    held_then(&mut c, config(&url, name), &sink, false, published, |c| {
        c.batch_execute(
            "BEGIN;
             ALTER TABLE rj_rename RENAME TO rj_rename_tmp;
             UPDATE rj_rename_tmp SET v = 'changed while renamed', n = -n WHERE id % 5 = 0;
             DELETE FROM rj_rename_tmp WHERE id % 7 = 0;
             INSERT INTO rj_rename_tmp SELECT g, 'inserted while renamed', g FROM generate_series(1001, 1100) g;
             ALTER TABLE rj_rename_tmp RENAME TO rj_rename;
             COMMIT;",
        )
        .expect("renamed away and back");
    });
    drop_slot_on(&mut c, name);
}

/// P2 under `FOR TABLES IN SCHEMA` (PostgreSQL 15): a table moved to another schema and back
/// (one transaction), changed while away (not published there). It comes back with the same
/// relation and the same `pg_publication_namespace` row: the sink must still end equal.
#[test]
fn p2_a_table_moved_out_of_a_published_schema_and_back_ends_equal() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql_at(&url);
    let name = "rj_moved";
    setup(
        &mut c,
        name,
        "DROP SCHEMA IF EXISTS rj_s CASCADE; DROP SCHEMA IF EXISTS rj_away CASCADE;
         CREATE SCHEMA rj_s; CREATE SCHEMA rj_away;
         CREATE TABLE rj_s.rj_moved (id int PRIMARY KEY, v text, n int);
         INSERT INTO rj_s.rj_moved SELECT g, 'v' || g, g FROM generate_series(1, 1000) g;
         CREATE PUBLICATION rj_moved_pub FOR TABLES IN SCHEMA rj_s;",
    );
    let sink = MemorySink::new();
    let published = Published::whole("rj_s.rj_moved");
    held_then(&mut c, config(&url, name), &sink, false, published, |c| {
        c.batch_execute(
            "BEGIN;
             ALTER TABLE rj_s.rj_moved SET SCHEMA rj_away;
             UPDATE rj_away.rj_moved SET v = 'changed while away', n = -n WHERE id % 5 = 0;
             DELETE FROM rj_away.rj_moved WHERE id % 7 = 0;
             INSERT INTO rj_away.rj_moved SELECT g, 'inserted while away', g FROM generate_series(1001, 1100) g;
             ALTER TABLE rj_away.rj_moved SET SCHEMA rj_s;
             COMMIT;",
        )
        .expect("moved away and back");
    });
    drop_slot_on(&mut c, name);
}

/// P2 under `FOR ALL TABLES`: a table made `UNLOGGED` (no longer published: its changes are
/// not in the WAL), changed, and made `LOGGED` again (one transaction; a bulk-load pattern).
/// Same relation, no publication row: the sink must still end equal.
#[test]
fn p2_a_table_set_unlogged_and_logged_again_under_for_all_tables_ends_equal() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql_at(&url);
    let name = "rj_unlogged";
    let (url_db, mut d) = own_database(&mut c, &url, name);
    d.batch_execute(
        "CREATE TABLE rj_unlogged (id int PRIMARY KEY, v text, n int);
         INSERT INTO rj_unlogged SELECT g, 'v' || g, g FROM generate_series(1, 1000) g;
         CREATE PUBLICATION rj_unlogged_pub FOR ALL TABLES;",
    )
    .expect("set-up");
    let sink = MemorySink::new();
    let published = Published::whole(name);
    held_then(&mut d, config(&url_db, name), &sink, false, published, |d| {
        d.batch_execute(
            "BEGIN;
             ALTER TABLE rj_unlogged SET UNLOGGED;
             UPDATE rj_unlogged SET v = 'changed while unlogged', n = -n WHERE id % 5 = 0;
             DELETE FROM rj_unlogged WHERE id % 7 = 0;
             INSERT INTO rj_unlogged SELECT g, 'inserted while unlogged', g FROM generate_series(1001, 1100) g;
             ALTER TABLE rj_unlogged SET LOGGED;
             COMMIT;",
        )
        .expect("unlogged and back");
    });
    drop_slot_on(&mut d, name);
    drop(d);
    c.batch_execute(&format!("DROP DATABASE {name}_db WITH (FORCE)")).expect("drop");
}

/// P2 and P5: a table with a TOASTed column (`big`, stored out of line) rejoins, and is at once
/// updated partially (`big` unchanged, so pgoutput leaves it out) while the resync's backfill
/// is served to a slow sink: the sink emptied the table at the resync, so those updates must
/// go out whole (never an update whose unchanged values the sink cannot know), and the sink
/// must end equal.
#[test]
fn p5_partial_updates_of_a_table_that_rejoined_go_out_whole_and_end_equal() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql_at(&url);
    let name = "rj_toast";
    setup(
        &mut c,
        name,
        "DROP TABLE IF EXISTS rj_toast; CREATE TABLE rj_toast (id int PRIMARY KEY, big text, n int);
         ALTER TABLE rj_toast ALTER COLUMN big SET STORAGE EXTERNAL;
         INSERT INTO rj_toast SELECT g, repeat(md5(g::text), 100), g FROM generate_series(1, 2000) g;
         CREATE PUBLICATION rj_toast_pub FOR TABLE rj_toast;",
    );
    let mut config = config(&url, name);
    config.backfill_chunk_rows = 50;
    let sink = MemorySink::new().with_delay(Duration::from_millis(2));
    let published = Published::whole(name);
    held_then(&mut c, config, &sink, true, published, |c| {
        c.batch_execute(
            "ALTER PUBLICATION rj_toast_pub DROP TABLE rj_toast;
             UPDATE rj_toast SET big = 'changed while out' WHERE id % 10 = 0;
             DELETE FROM rj_toast WHERE id % 7 = 0;",
        )
        .expect("out");
        thread::sleep(CHECK * 2);
        c.batch_execute("ALTER PUBLICATION rj_toast_pub ADD TABLE rj_toast").expect("rejoin");
        for k in 0..40 {
            c.batch_execute(&format!("UPDATE rj_toast SET n = n + 1000 WHERE id % 40 = {k}"))
                .expect("partial update");
            thread::sleep(Duration::from_millis(25));
        }
    });
    drop_slot_on(&mut c, name);
}

/// P4 and P2: the publication's row filter changed while running (`ALTER PUBLICATION ... SET
/// TABLE x WHERE (...)`, the filter on the key), nothing changed after: the sink must hold
/// exactly the rows the new filter admits (the ones it admits that the old one did not were
/// never sent; the ones it no longer admits must go).
#[test]
fn p4_a_row_filter_changed_while_running_ends_equal_to_the_rows_the_new_filter_admits() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql_at(&url);
    let name = "rj_filter";
    setup(
        &mut c,
        name,
        "DROP TABLE IF EXISTS rj_filter; CREATE TABLE rj_filter (id int PRIMARY KEY, v text);
         INSERT INTO rj_filter SELECT g, 'v' || g FROM generate_series(1, 1200) g;
         CREATE PUBLICATION rj_filter_pub FOR TABLE rj_filter WHERE (id % 3 <> 0);",
    );
    let source = LiveSource::connect(config(&url, name)).expect("source");
    let sink = MemorySink::new();
    let sinks = [("search", &sink)];
    let run = start(source, &sinks, false);
    wait_held(&sinks, &mut c, Published { table: name, columns: "*", filter: "WHERE id % 3 <> 0" });
    c.batch_execute("ALTER PUBLICATION rj_filter_pub SET TABLE rj_filter WHERE (id % 2 = 0)")
        .expect("the new filter");
    let published = Published { table: name, columns: "*", filter: "WHERE id % 2 = 0" };
    let (_, outcomes) = finish(run, &sinks, &mut c, published);
    let expected = published.rows(&mut c);
    assert_eq!(expected.len(), 600);
    assert_equal(&outcomes, &published.index(), &expected);
    drop_slot_on(&mut c, name);
}

/// P4 and P2: the publication's column list changed while running (`ALTER PUBLICATION ... SET
/// TABLE x (...)`): `secret` leaves it, `extra` joins it; nothing changed after. No row in the
/// sink carries `secret` at the end, and the sink holds the table's published columns exactly
/// (`extra` with its values).
#[test]
fn p4_a_column_list_changed_while_running_leaves_no_excluded_column_in_the_sink() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql_at(&url);
    let name = "rj_cols";
    setup(
        &mut c,
        name,
        "DROP TABLE IF EXISTS rj_cols; CREATE TABLE rj_cols (id int PRIMARY KEY, v text, secret text, extra int);
         INSERT INTO rj_cols SELECT g, 'v' || g, 'secret-' || g, g FROM generate_series(1, 800) g;
         CREATE PUBLICATION rj_cols_pub FOR TABLE rj_cols (id, v, secret);",
    );
    let source = LiveSource::connect(config(&url, name)).expect("source");
    let sink = MemorySink::new();
    let sinks = [("search", &sink)];
    let run = start(source, &sinks, false);
    wait_held(&sinks, &mut c, Published { table: name, columns: "id, v, secret", filter: "" });
    c.batch_execute("ALTER PUBLICATION rj_cols_pub SET TABLE rj_cols (id, v, extra)").expect("the new list");
    let published = Published { table: name, columns: "id, v, extra", filter: "" };
    let (_, outcomes) = finish(run, &sinks, &mut c, published);
    for o in &outcomes {
        let secret = o.rows.values().filter(|r| r.contains_key("secret")).count();
        assert_eq!(
            secret, 0,
            "sink {}: rows still carrying the column the publication left out ({} truncates of the index)",
            o.sink, o.truncates
        );
    }
    assert_equal(&outcomes, &published.index(), &published.rows(&mut c));
    drop_slot_on(&mut c, name);
}

/// P2 and P3: the table rejoins while its first backfill is being served to the sink (20,000
/// rows in chunks of 200, a slow, paced sink), with changes while it is out and after it
/// rejoined, over the rows already backfilled and those not yet. The sink must end equal.
#[test]
fn p2_a_table_that_rejoins_while_its_backfill_is_served_ends_equal() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql_at(&url);
    let name = "rj_during";
    plain_table(&mut c, name, 20_000);
    let source = LiveSource::connect(config(&url, name)).expect("source");
    let sink = MemorySink::new().with_delay(Duration::from_millis(5));
    let sinks = [("search", &sink)];
    let run = start(source, &sinks, true);
    let index = format!("public_{name}");
    eventually("the first backfill started", Duration::from_secs(20), || {
        snapshot_rows(&sink.applied(), &index) >= 2000
    });
    c.batch_execute(&format!("ALTER PUBLICATION {name}_pub DROP TABLE {name}")).expect("leave");
    c.batch_execute(&format!(
        "UPDATE {name} SET v = 'changed while out', n = -n WHERE id % 97 = 0;
         DELETE FROM {name} WHERE id % 101 = 0;
         INSERT INTO {name} SELECT g, 'inserted while out', g FROM generate_series(20001, 20100) g;"
    ))
    .expect("changes while out");
    c.batch_execute(&format!("ALTER PUBLICATION {name}_pub ADD TABLE {name}")).expect("rejoin");
    assert!(!complete(&sink), "premise: the first backfill was still being served when the table rejoined");
    c.batch_execute(&format!(
        "UPDATE {name} SET v = 'changed after' WHERE id % 89 = 0;
         DELETE FROM {name} WHERE id % 83 = 0;
         INSERT INTO {name} SELECT g, 'inserted after', g FROM generate_series(20101, 20200) g;"
    ))
    .expect("changes after");
    let published = Published::whole(name);
    let (_, outcomes) = finish(run, &sinks, &mut c, published);
    assert_equal(&outcomes, &index, &published.rows(&mut c));
    drop_slot_on(&mut c, name);
}

/// P2 with two sinks (one fast, one slow): one rejoin, with changes while out and after; both
/// sinks must end equal to the table.
#[test]
fn p2_a_rejoin_reaches_every_sink_and_both_end_equal() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql_at(&url);
    let name = "rj_two";
    plain_table(&mut c, name, 3000);
    let source = LiveSource::connect(config(&url, name)).expect("source");
    let (search, cache) = (MemorySink::new(), MemorySink::new().with_delay(Duration::from_millis(2)));
    let sinks = [("search", &search), ("cache", &cache)];
    let run = start(source, &sinks, false);
    let published = Published::whole(name);
    wait_held(&sinks, &mut c, published);
    c.batch_execute(&format!("ALTER PUBLICATION {name}_pub DROP TABLE {name}")).expect("leave");
    changes_while_out(&mut c, name, 3000);
    thread::sleep(CHECK * 2);
    c.batch_execute(&format!("ALTER PUBLICATION {name}_pub ADD TABLE {name}")).expect("rejoin");
    churn(&mut c, name, 3000, 100_000, Duration::from_millis(500), Duration::from_millis(5));
    let (_, outcomes) = finish(run, &sinks, &mut c, published);
    assert_eq!(outcomes.len(), 2);
    assert_equal(&outcomes, &published.index(), &published.rows(&mut c));
    drop_slot_on(&mut c, name);
}

/// P2 and P3, durability: the rejoin is detected (the sink was handed the resync's truncate),
/// then the pipeline is stopped before the resync's backfill completes (a slow, paced sink;
/// 20,000 rows); the table changes while the pipeline is down; a new pipeline over the same
/// sink's durable state and the same slot must serve the owed backfill and end equal.
#[test]
fn p3_a_resync_stopped_before_its_backfill_completes_is_owed_and_served_after_a_restart() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql_at(&url);
    let name = "rj_durable";
    plain_table(&mut c, name, 20_000);
    let index = format!("public_{name}");
    let source = LiveSource::connect(config(&url, name)).expect("source");
    let slow = MemorySink::new().with_delay(Duration::from_millis(5));
    let run = start(source, &[("search", &slow)], true);
    let published = Published::whole(name);
    wait_held(&[("search", &slow)], &mut c, published);
    let mark = slow.applied().len();
    c.batch_execute(&format!("ALTER PUBLICATION {name}_pub DROP TABLE {name}")).expect("leave");
    changes_while_out(&mut c, name, 20_000);
    c.batch_execute(&format!("ALTER PUBLICATION {name}_pub ADD TABLE {name}")).expect("rejoin");
    eventually("the sink handed the resync's truncate", Duration::from_secs(15), || {
        truncates(&slow.applied()[mark..], &index) > 0
    });
    run.stop.stop();
    run.thread.join().expect("the pipeline thread").expect("the stopped run");
    let owed_at_stop = owed(&slow);
    assert!(
        owed_at_stop.iter().any(|o| o.indexes.iter().any(|i| i.as_str() == index)),
        "premise: the resync's backfill is owed durably at the stop: {owed_at_stop:?} (committed: {:?})",
        slow.committed()
    );
    // While down: more changes (no change of the publication).
    c.batch_execute(&format!(
        "UPDATE {name} SET v = 'changed while down' WHERE id % 13 = 0;
         DELETE FROM {name} WHERE id % 17 = 0;
         INSERT INTO {name} SELECT g, 'inserted while down', g FROM generate_series(30001, 30050) g;"
    ))
    .expect("changes while down");
    let fast = slow.clone().with_delay(Duration::ZERO);
    let source = LiveSource::connect(config(&url, name)).expect("source again");
    let run = start(source, &[("search", &fast)], false);
    let (report, outcomes) = finish(run, &[("search", &fast)], &mut c, published);
    assert_equal(&outcomes, &index, &published.rows(&mut c));
    assert!(report.backfills_served >= 1, "the owed backfill was served: {report:?}");
    drop_slot_on(&mut c, name);
}

/// P2, no collateral: a table that rejoins next to one that never left; the one that rejoined
/// ends equal, the other is never resynced (no truncate of it) and ends equal.
#[test]
fn p2_a_table_that_never_left_is_not_resynced_when_another_rejoins() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql_at(&url);
    let name = "rj_pair";
    setup(
        &mut c,
        name,
        "DROP TABLE IF EXISTS rj_pair, rj_stay; CREATE TABLE rj_pair (id int PRIMARY KEY, v text, n int);
         CREATE TABLE rj_stay (id int PRIMARY KEY, v text, n int);
         INSERT INTO rj_pair SELECT g, 'v' || g, g FROM generate_series(1, 500) g;
         INSERT INTO rj_stay SELECT g, 'v' || g, g FROM generate_series(1, 500) g;
         CREATE PUBLICATION rj_pair_pub FOR TABLE rj_pair, rj_stay;",
    );
    let source = LiveSource::connect(config(&url, name)).expect("source");
    let sink = MemorySink::new();
    let sinks = [("search", &sink)];
    let run = start(source, &sinks, false);
    wait_held(&sinks, &mut c, Published::whole("rj_stay"));
    wait_held(&sinks, &mut c, Published::whole(name));
    c.batch_execute("ALTER PUBLICATION rj_pair_pub DROP TABLE rj_pair").expect("leave");
    changes_while_out(&mut c, name, 500);
    c.batch_execute("UPDATE rj_stay SET v = 'stayed' WHERE id % 4 = 0").expect("the other table changes");
    thread::sleep(CHECK * 2);
    c.batch_execute("ALTER PUBLICATION rj_pair_pub ADD TABLE rj_pair").expect("rejoin");
    let published = Published::whole(name);
    let (_, outcomes) = finish(run, &sinks, &mut c, published);
    assert_equal(&outcomes, &published.index(), &published.rows(&mut c));
    let items: Vec<LaneItem> = sink.applied().clone();
    let stay = Replica::apply(&items).rows.remove("public_rj_stay").unwrap_or_default();
    assert_eq!(compare(&stay, &Published::whole("rj_stay").rows(&mut c)), (0, 0, 0), "rj_stay");
    assert_eq!(truncates(&items, "public_rj_stay"), 0, "the table that never left was resynced");
    drop_slot_on(&mut c, name);
}

/// P2 from one source to the next: a rejoin found by an earlier source of the slot, which
/// stopped before its check's message reached the sinks (written here by hand, with another
/// source id: the table left, changed and rejoined while no source ran). The next source
/// honours the message: the sink, which does not cover it, gets the resync and ends equal. A
/// message of another slot is ignored (its index is not resynced: one truncate only).
#[test]
fn p2_a_check_message_of_an_earlier_source_of_the_slot_is_honoured_by_the_next() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql_at(&url);
    let name = "rj_earlier";
    plain_table(&mut c, name, 600);
    let sink = MemorySink::new();
    let sinks = [("search", &sink)];
    let published = Published::whole(name);
    let run = start(LiveSource::connect(config(&url, name)).expect("source"), &sinks, false);
    wait_held(&sinks, &mut c, published);
    let (_, outcomes) = finish(run, &sinks, &mut c, published);
    assert_equal(&outcomes, &published.index(), &published.rows(&mut c));
    // Stopped: the table leaves, changes and rejoins; the earlier source's message says so.
    c.batch_execute(&format!("ALTER PUBLICATION {name}_pub DROP TABLE {name}")).expect("leave");
    changes_while_out(&mut c, name, 600);
    c.batch_execute(&format!("ALTER PUBLICATION {name}_pub ADD TABLE {name}")).expect("rejoin");
    for slot in ["rj_other_slot", name] {
        c.execute(
            "SELECT pg_logical_emit_message(true, 'lanestream.publication', $1::text)",
            &[&format!("{slot}:00000000deadbeef:3:public_{name}")],
        )
        .expect("the earlier source's message");
    }
    let run = start(LiveSource::connect(config(&url, name)).expect("source"), &sinks, false);
    let (_, outcomes) = finish(run, &sinks, &mut c, published);
    assert_equal(&outcomes, &published.index(), &published.rows(&mut c));
    assert_eq!(outcomes[0].truncates, 1, "one resync: the other slot's message is not this one's");
    drop_slot_on(&mut c, name);
}

/// What is not a rejoin: a `TRUNCATE` gives the table a new file (a new `pg_class` row), but
/// the stream carries it and the sinks applied it, so the check does not resync the table (its
/// rows are not read again): one truncate (the streamed one), one backfill (the first), and the
/// sink ends equal.
#[test]
fn p2_a_truncate_while_running_is_not_a_rejoin() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql_at(&url);
    let name = "rj_truncate";
    plain_table(&mut c, name, 300);
    let sink = MemorySink::new();
    let published = Published::whole(name);
    let (report, outcome) = held_then(&mut c, config(&url, name), &sink, false, published, |c| {
        c.batch_execute(&format!(
            "TRUNCATE {name}; INSERT INTO {name} SELECT g, 'after', g FROM generate_series(1, 50) g"
        ))
        .expect("truncate");
    });
    assert_eq!((outcome.truncates, report.backfills_served), (1, 1), "{report:?}");
    drop_slot_on(&mut c, name);
}

/// Nor is DDL that stays: a column added and a `GRANT` change the table's `pg_class` row, but
/// what the row says changed with it (the stream's relations carry the new shape), so the table
/// is not resynced: no truncate, one backfill (the first), and the sink ends equal.
#[test]
fn p2_a_column_added_and_a_grant_while_running_are_not_a_rejoin() {
    let Some(_server) = serial() else { return };
    let url = url();
    let mut c = sql_at(&url);
    let name = "rj_ddl";
    plain_table(&mut c, name, 300);
    let sink = MemorySink::new();
    let published = Published::whole(name);
    let (report, outcome) = held_then(&mut c, config(&url, name), &sink, false, published, |c| {
        c.batch_execute(&format!(
            "ALTER TABLE {name} ADD COLUMN extra int; GRANT SELECT ON {name} TO PUBLIC;
             UPDATE {name} SET extra = id WHERE id <= 300"
        ))
        .expect("ddl");
    });
    assert_eq!((outcome.truncates, report.backfills_served), (0, 1), "{report:?}");
    drop_slot_on(&mut c, name);
}
