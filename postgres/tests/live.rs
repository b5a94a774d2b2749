//! The live source against a real PostgreSQL: its errors, its confirms, its keys.
//!
//! These need a server with `wal_level = logical` and the wal2json plugin, so they are ignored by
//! a plain `cargo test`; `scripts/e2e-postgres.sh` runs them on its throwaway cluster with
//! `--ignored`, giving:
//! - `LANESTREAM_PG_URL`: a superuser connection string;
//! - `LANESTREAM_PG_PASSWORD_URL`: a user that logs in with a password, with a wrong password;
//! - `LANESTREAM_PG_BIN`: the directory of `pg_recvlogical`.

use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use lanestream::{Batch, Position};
use lanestream_postgres::live::{LiveConfig, LiveError, LiveSource};
use lanestream_postgres::wal2json::{CatalogKey, TransactionBuilder, Wal2JsonError};
use postgres::{Client, NoTls};

const NEEDS: &str = "needs a PostgreSQL with wal2json (LANESTREAM_PG_URL); run by scripts/e2e-postgres.sh";

/// The tests share one server, and one of them changes its configuration for a moment: each
/// holds this lock for its whole run.
fn serial() -> MutexGuard<'static, ()> {
    static SERVER: Mutex<()> = Mutex::new(());
    SERVER.lock().unwrap_or_else(PoisonError::into_inner)
}

fn url() -> String {
    std::env::var("LANESTREAM_PG_URL").expect("LANESTREAM_PG_URL")
}

fn sql() -> Client {
    Client::connect(&url(), NoTls).expect("connect")
}

fn config(slot: &str) -> LiveConfig {
    let mut c = LiveConfig::new(url(), slot);
    c.create_slot = true;
    c.slot_wait = Duration::from_secs(1);
    c
}

fn drop_slot(slot: &str) {
    let mut c = sql();
    // A killed holder may keep it for a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    while c
        .query_one("SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1::text", &[&slot])
        .expect("slots")
        .get::<_, i64>(0)
        > 0
    {
        if c.execute("SELECT pg_drop_replication_slot($1::text)", &[&slot]).is_ok()
            || Instant::now() > deadline
        {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Every line a poll hands over.
fn poll_lines(source: &mut LiveSource) -> Vec<String> {
    let mut lines = Vec::new();
    source
        .poll(|line, _| -> Result<(), String> {
            lines.push(String::from_utf8(line.to_vec()).expect("UTF-8"));
            Ok(())
        })
        .expect("poll");
    lines
}

/// The commit LSNs of the B lines.
fn commits(lines: &[String]) -> Vec<Position> {
    lines
        .iter()
        .filter(|l| l.starts_with(r#"{"action":"B""#))
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("JSON");
            Position::from_lsn(v["lsn"].as_str().expect("lsn")).expect("LSN")
        })
        .collect()
}

#[test]
#[ignore = "needs a PostgreSQL with wal2json (LANESTREAM_PG_URL); run by scripts/e2e-postgres.sh"]
fn a_wrong_password_is_an_auth_error() {
    let _server = serial();
    let _ = NEEDS;
    let bad = std::env::var("LANESTREAM_PG_PASSWORD_URL").expect("LANESTREAM_PG_PASSWORD_URL");
    let e = LiveSource::connect(LiveConfig::new(bad, "any")).unwrap_err();
    assert!(matches!(e, LiveError::Auth(_)), "{e}");
    assert!(e.to_string().contains("password authentication failed"), "{e}");
}

#[test]
#[ignore = "needs a PostgreSQL with wal2json (LANESTREAM_PG_URL); run by scripts/e2e-postgres.sh"]
fn a_missing_slot_needs_create_slot_and_a_slot_of_another_plugin_is_refused() {
    let _server = serial();
    let mut c = config("t_missing");
    c.create_slot = false;
    let e = LiveSource::connect(c).unwrap_err();
    assert!(matches!(e, LiveError::NoSlot(ref s) if s == "t_missing"), "{e}");
    assert!(e.to_string().contains("--create-slot") && e.to_string().contains("backfill"), "{e}");

    sql().execute("SELECT pg_create_logical_replication_slot('t_pgoutput', 'pgoutput')", &[]).expect("slot");
    let e = LiveSource::connect(config("t_pgoutput")).unwrap_err();
    assert!(matches!(e, LiveError::WrongPlugin { ref plugin, .. } if plugin == "pgoutput"), "{e}");
    drop_slot("t_pgoutput");
}

#[test]
#[ignore = "needs a PostgreSQL with wal2json (LANESTREAM_PG_URL); run by scripts/e2e-postgres.sh"]
fn a_slot_held_by_another_client_is_refused_after_the_wait() {
    let _server = serial();
    // Another lanestream source.
    let first = LiveSource::connect(config("t_held")).expect("first source");
    let started = Instant::now();
    let e = LiveSource::connect(config("t_held")).unwrap_err();
    assert!(
        matches!(e, LiveError::SlotBusy { ref holder, .. } if holder.contains("another lanestream source")),
        "{e}"
    );
    assert!(started.elapsed() >= Duration::from_secs(1), "refused before the wait");
    drop(first);

    // pg_recvlogical streaming it.
    let bin = std::env::var("LANESTREAM_PG_BIN").expect("LANESTREAM_PG_BIN");
    let mut recv: Child = Command::new(format!("{bin}/pg_recvlogical"))
        .args(["--start", "--slot", "t_held", "-f", "/dev/null", "--dbname", &url()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("pg_recvlogical");
    let mut c = sql();
    let deadline = Instant::now() + Duration::from_secs(10);
    while c
        .query_one("SELECT active_pid IS NULL FROM pg_replication_slots WHERE slot_name = 't_held'", &[])
        .expect("slot")
        .get::<_, bool>(0)
    {
        assert!(Instant::now() < deadline, "pg_recvlogical never took the slot");
        thread::sleep(Duration::from_millis(50));
    }
    // The wait covers a killed predecessor; the slot is refused after it.
    let e = LiveSource::connect(config("t_held")).unwrap_err();
    assert!(matches!(e, LiveError::SlotBusy { ref holder, .. } if holder.contains("pg_recvlogical")), "{e}");
    recv.kill().ok();
    recv.wait().ok();
    drop_slot("t_held");
}

#[test]
#[ignore = "needs a PostgreSQL with wal2json (LANESTREAM_PG_URL); run by scripts/e2e-postgres.sh"]
fn confirming_a_commit_lsn_resends_that_transaction_and_never_more() {
    let _server = serial();
    let mut c = sql();
    c.batch_execute("DROP TABLE IF EXISTS t_confirm; CREATE TABLE t_confirm (id int PRIMARY KEY)")
        .expect("table");
    let mut source = LiveSource::connect(config("t_confirm")).expect("source");
    let created = source.confirmed().expect("a new slot is confirmed at its creation");
    for id in 1..=3 {
        c.execute("INSERT INTO t_confirm VALUES ($1)", &[&id]).expect("insert");
    }
    let lines = poll_lines(&mut source);
    let txns = commits(&lines);
    assert_eq!(txns.len(), 3, "{lines:?}");
    // Peeking confirms nothing.
    assert_eq!(source.read_confirmed().expect("read"), Some(created));
    // A second poll in the same run hands over nothing again.
    assert!(poll_lines(&mut source).is_empty());
    // Confirm the second transaction's commit LSN: the slot is there, not further.
    assert_eq!(source.confirm(Some(txns[1])).expect("confirm"), Some(txns[1]));
    assert_eq!(source.read_confirmed().expect("read"), Some(txns[1]));
    // Confirming less is a no-op, never a step back.
    assert_eq!(source.confirm(Some(txns[0])).expect("confirm"), Some(txns[1]));
    drop(source);
    // After a restart PostgreSQL re-sends from the confirmed position: the transaction AT it
    // comes again (at least once), then the next.
    let mut source = LiveSource::connect(config("t_confirm")).expect("restart");
    assert_eq!(source.confirmed(), Some(txns[1]));
    assert_eq!(commits(&poll_lines(&mut source)), txns[1..]);
    drop(source);
    drop_slot("t_confirm");
}

#[test]
#[ignore = "needs a PostgreSQL with wal2json (LANESTREAM_PG_URL); run by scripts/e2e-postgres.sh"]
fn the_key_lookup_reads_the_replica_identity_from_the_catalog() {
    let _server = serial();
    sql()
        .batch_execute(
            "DROP TABLE IF EXISTS t_keys_pk, t_keys_index, t_keys_both, t_keys_full;
             CREATE TABLE t_keys_pk (b int, a int, v text, PRIMARY KEY (a, b));
             CREATE TABLE t_keys_index (email text NOT NULL, v text);
             CREATE UNIQUE INDEX t_keys_index_email ON t_keys_index (email);
             ALTER TABLE t_keys_index REPLICA IDENTITY USING INDEX t_keys_index_email;
             CREATE TABLE t_keys_both (id int PRIMARY KEY, email text NOT NULL);
             CREATE UNIQUE INDEX t_keys_both_email ON t_keys_both (email);
             ALTER TABLE t_keys_both REPLICA IDENTITY USING INDEX t_keys_both_email;
             CREATE TABLE t_keys_full (a text, b int);
             ALTER TABLE t_keys_full REPLICA IDENTITY FULL;",
        )
        .expect("tables");
    let source = LiveSource::connect(config("t_keys")).expect("source");
    let mut lookup = source.key_lookup();
    let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let mut key = |table: &str| lookup("public", table).expect("look-up");
    // Column order, as wal2json's pk.
    assert_eq!(key("t_keys_pk"), Some(CatalogKey::PrimaryKey(owned(&["b", "a"]))));
    assert_eq!(key("t_keys_index"), Some(CatalogKey::IdentityIndex(owned(&["email"]))));
    assert_eq!(key("t_keys_both"), Some(CatalogKey::IdentityIndex(owned(&["email"]))));
    assert_eq!(key("t_keys_full"), None);
    assert_eq!(key("no_such_table"), None);
    drop(lookup);
    drop(source);
    drop_slot("t_keys");
}

#[test]
#[ignore = "needs a PostgreSQL with wal2json (LANESTREAM_PG_URL); run by scripts/e2e-postgres.sh"]
fn a_server_that_does_not_allow_wal2json_as_an_output_plugin_is_a_clear_error() {
    let _server = serial();
    let mut c = sql();
    let known: i64 = c
        .query_one("SELECT count(*) FROM pg_settings WHERE name = 'output_plugin_libraries'", &[])
        .expect("pg_settings")
        .get(0);
    if known == 0 {
        // Older builds have no such setting, and every installed plugin is allowed.
        eprintln!("this server has no output_plugin_libraries: the refusal cannot happen here");
        return;
    }
    let set = |c: &mut Client, value: Option<&str>| {
        match value {
            Some(v) => c.batch_execute(&format!("ALTER SYSTEM SET output_plugin_libraries = '{v}'")),
            None => c.batch_execute("ALTER SYSTEM RESET output_plugin_libraries"),
        }
        .expect("ALTER SYSTEM");
        c.batch_execute("SELECT pg_reload_conf()").expect("reload");
        // The reload is a signal: wait until a new session sees the value.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now: String = sql().query_one("SHOW output_plugin_libraries", &[]).expect("SHOW").get(0);
            if value.is_none_or(|v| now == v) && (value.is_some() || now.contains("wal2json")) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not reload output_plugin_libraries (it shows {now:?})"
            );
            thread::sleep(Duration::from_millis(50));
        }
    };
    set(&mut c, Some("pgoutput"));
    let e = LiveSource::connect(config("t_not_allowed"));
    set(&mut c, None);
    let e = e.unwrap_err();
    assert!(matches!(e, LiveError::PluginNotAllowed(_)), "{e}");
    assert!(e.to_string().contains("output_plugin_libraries"), "{e}");
    drop_slot("t_not_allowed");
}

/// Polls once and pushes every line into `builder` (with `source`'s key look-up): the batches,
/// and the errors, in order.
fn poll_batches(
    source: &mut LiveSource,
    builder: &mut TransactionBuilder,
) -> Vec<Result<Batch, Wal2JsonError>> {
    let mut out = Vec::new();
    let mut line_no = 0;
    source
        .poll(|line, _| -> Result<(), String> {
            line_no += 1;
            match builder.push_line(line_no, line) {
                Ok(Some(b)) => out.push(Ok(b)),
                Ok(None) => {}
                Err(e) => out.push(Err(e)),
            }
            Ok(())
        })
        .expect("poll");
    out
}

/// The (id, op) of every envelope of `index`, or the first error.
fn ids_of(results: Vec<Result<Batch, Wal2JsonError>>, index: &str) -> Result<Vec<String>, String> {
    let mut ids = Vec::new();
    for r in results {
        let b = r.map_err(|e| e.to_string())?;
        ids.extend(b.envelopes.iter().filter(|e| e.index.as_str() == index).map(|e| e.id.clone()));
    }
    Ok(ids)
}

fn keyed_builder(source: &LiveSource) -> TransactionBuilder {
    TransactionBuilder::new().with_key_lookup(source.key_lookup())
}

#[test]
#[ignore = "needs a PostgreSQL with wal2json (LANESTREAM_PG_URL); run by scripts/e2e-postgres.sh"]
fn keys_follow_the_stream_when_the_key_column_is_renamed_while_running() {
    let _server = serial();
    let mut c = sql();
    c.batch_execute(
        "DROP TABLE IF EXISTS t_rename_live; CREATE TABLE t_rename_live (id int PRIMARY KEY, v int)",
    )
    .expect("table");
    drop_slot("t_rename_live");
    let mut source = LiveSource::connect(config("t_rename_live")).expect("source");
    let mut builder = keyed_builder(&source);
    c.batch_execute("INSERT INTO t_rename_live VALUES (1, 1)").expect("insert");
    assert_eq!(
        ids_of(poll_batches(&mut source, &mut builder), "public_t_rename_live"),
        Ok(vec!["1".to_owned()])
    );
    c.batch_execute(
        "ALTER TABLE t_rename_live RENAME COLUMN id TO uid; INSERT INTO t_rename_live VALUES (2, 1);
         UPDATE t_rename_live SET v = 2 WHERE uid = 1; DELETE FROM t_rename_live WHERE uid = 2",
    )
    .expect("rename");
    assert_eq!(
        ids_of(poll_batches(&mut source, &mut builder), "public_t_rename_live"),
        Ok(vec!["2".to_owned(), "1".to_owned(), "2".to_owned()])
    );
    drop(source);
    drop_slot("t_rename_live");
}

#[test]
#[ignore = "needs a PostgreSQL with wal2json (LANESTREAM_PG_URL); run by scripts/e2e-postgres.sh"]
fn keys_follow_the_stream_when_the_key_column_was_renamed_while_down() {
    let _server = serial();
    let mut c = sql();
    c.batch_execute(
        "DROP TABLE IF EXISTS t_rename_down; CREATE TABLE t_rename_down (id int PRIMARY KEY, v int)",
    )
    .expect("table");
    drop_slot("t_rename_down");
    drop(LiveSource::connect(config("t_rename_down")).expect("slot"));
    // While no source runs: changes under the old name, the rename, changes under the new one.
    c.batch_execute(
        "INSERT INTO t_rename_down VALUES (1, 1); DELETE FROM t_rename_down WHERE id = 1;
         ALTER TABLE t_rename_down RENAME COLUMN id TO uid; INSERT INTO t_rename_down VALUES (2, 2)",
    )
    .expect("changes");
    let mut source = LiveSource::connect(config("t_rename_down")).expect("source");
    let mut builder = keyed_builder(&source);
    assert_eq!(
        ids_of(poll_batches(&mut source, &mut builder), "public_t_rename_down"),
        Ok(vec!["1".to_owned(), "1".to_owned(), "2".to_owned()])
    );
    drop(source);
    drop_slot("t_rename_down");
}

#[test]
#[ignore = "needs a PostgreSQL with wal2json (LANESTREAM_PG_URL); run by scripts/e2e-postgres.sh"]
fn keys_follow_the_stream_when_the_key_is_redefined_with_more_columns() {
    let _server = serial();
    let mut c = sql();
    c.batch_execute(
        "DROP TABLE IF EXISTS t_rekey; CREATE TABLE t_rekey (id int PRIMARY KEY, k int NOT NULL)",
    )
    .expect("table");
    drop_slot("t_rekey");
    let mut source = LiveSource::connect(config("t_rekey")).expect("source");
    let mut builder = keyed_builder(&source);
    c.batch_execute("INSERT INTO t_rekey VALUES (7, 7)").expect("insert");
    assert_eq!(ids_of(poll_batches(&mut source, &mut builder), "public_t_rekey"), Ok(vec!["7".to_owned()]));
    c.batch_execute(
        "ALTER TABLE t_rekey DROP CONSTRAINT t_rekey_pkey, ADD PRIMARY KEY (id, k);
         INSERT INTO t_rekey VALUES (1, 1), (1, 2); DELETE FROM t_rekey WHERE id = 1 AND k = 2",
    )
    .expect("rekey");
    assert_eq!(
        ids_of(poll_batches(&mut source, &mut builder), "public_t_rekey"),
        Ok(vec!["1:1".to_owned(), "1:2".to_owned(), "1:2".to_owned()]),
        "rows (1,1) and (1,2) must keep their own ids"
    );
    drop(source);
    drop_slot("t_rekey");
}

#[test]
#[ignore = "needs a PostgreSQL with wal2json (LANESTREAM_PG_URL); run by scripts/e2e-postgres.sh"]
fn a_key_lookup_whose_connection_was_terminated_reconnects_and_never_keys_by_every_column() {
    let _server = serial();
    let mut c = sql();
    c.batch_execute(
        "DROP TABLE IF EXISTS t_side; CREATE TABLE t_side (email text NOT NULL, v int);
         CREATE UNIQUE INDEX t_side_email ON t_side (email);
         ALTER TABLE t_side REPLICA IDENTITY USING INDEX t_side_email;",
    )
    .expect("table");
    drop_slot("t_side");
    let mut source = LiveSource::connect(config("t_side")).expect("source");
    let mut builder = keyed_builder(&source);
    assert!(poll_batches(&mut source, &mut builder).is_empty());
    // The source's second connection: the one of its two that did not peek last.
    let terminated: i64 = c
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name LIKE 'lanestream%' AND pid <> pg_backend_pid() \
             AND query NOT LIKE '%pg_logical_slot_peek_changes%'",
            &[],
        )
        .expect("terminate")
        .get(0);
    assert_eq!(terminated, 1, "the side connection");
    c.batch_execute("INSERT INTO t_side VALUES ('a@x', 1); UPDATE t_side SET v = 2 WHERE email = 'a@x'")
        .expect("changes");
    // The look-up reconnects: the rows are keyed by the index, never by every column.
    assert_eq!(
        ids_of(poll_batches(&mut source, &mut builder), "public_t_side"),
        Ok(vec!["a@x".to_owned(), "a@x".to_owned()])
    );
    drop(source);
    drop_slot("t_side");
}

#[test]
#[ignore = "needs a PostgreSQL with wal2json (LANESTREAM_PG_URL); run by scripts/e2e-postgres.sh"]
fn a_nan_or_infinite_key_fails_its_transaction_instead_of_sharing_one_id() {
    let _server = serial();
    let mut c = sql();
    c.batch_execute("DROP TABLE IF EXISTS t_nan; CREATE TABLE t_nan (id numeric PRIMARY KEY, v int)")
        .expect("table");
    drop_slot("t_nan");
    let mut source = LiveSource::connect(config("t_nan")).expect("source");
    let mut builder = keyed_builder(&source);
    c.batch_execute("INSERT INTO t_nan VALUES ('NaN', 1), ('Infinity', 2), ('-Infinity', 3)")
        .expect("insert");
    let e = ids_of(poll_batches(&mut source, &mut builder), "public_t_nan")
        .expect_err("three rows must not get one id");
    assert!(e.contains("public.t_nan") && e.contains("\"id\"") && e.contains("is null"), "{e}");
    drop(source);
    drop_slot("t_nan");
}

/// Sets a server setting (ALTER SYSTEM, reload) until dropped, waiting until a new session sees it.
struct Setting(&'static str);

impl Setting {
    fn set(name: &'static str, value: &str) -> Setting {
        let mut c = sql();
        c.batch_execute(&format!("ALTER SYSTEM SET {name} = '{value}'")).expect("set");
        c.batch_execute("SELECT pg_reload_conf()").expect("reload");
        let deadline = Instant::now() + Duration::from_secs(10);
        while sql().query_one(&format!("SHOW {name}"), &[]).expect("SHOW").get::<_, String>(0) != value {
            assert!(Instant::now() < deadline, "the server did not reload {name}");
            thread::sleep(Duration::from_millis(20));
        }
        Setting(name)
    }
}

impl Drop for Setting {
    fn drop(&mut self) {
        let mut c = sql();
        let _ = c.batch_execute(&format!("ALTER SYSTEM RESET {}", self.0));
        let _ = c.batch_execute("SELECT pg_reload_conf()");
    }
}

fn slot_state(c: &mut Client, slot: &str) -> (String, Option<Position>) {
    let row = c
        .query_one(
            "SELECT coalesce(wal_status, 'none'), confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1::text",
            &[&slot],
        )
        .expect("slot");
    (row.get(0), row.get::<_, Option<String>>(1).map(|t| Position::from_lsn(&t).expect("LSN")))
}

#[test]
#[ignore = "needs a PostgreSQL with wal2json (LANESTREAM_PG_URL); run by scripts/e2e-postgres.sh"]
fn an_idle_slot_follows_the_wal_of_a_busy_neighbour_database_within_max_slot_wal_keep_size() {
    let _server = serial();
    let mut c = sql();
    c.batch_execute("DROP DATABASE IF EXISTS t_neighbour").expect("drop db");
    c.batch_execute("CREATE DATABASE t_neighbour").expect("create db");
    let mut neighbour_url: postgres::Config = url().parse().expect("url");
    neighbour_url.dbname("t_neighbour");
    let mut neighbour = neighbour_url.connect(NoTls).expect("neighbour");
    neighbour.batch_execute("CREATE TABLE w (a int)").expect("table");
    drop_slot("t_idle_control");
    drop_slot("t_idle");
    let mut source = LiveSource::connect(config("t_idle")).expect("source");
    // A slot nothing reads or confirms: what max_slot_wal_keep_size does to a stuck slot.
    c.batch_execute("SELECT pg_create_logical_replication_slot('t_idle_control', 'wal2json')")
        .expect("control");
    let keep = Setting::set("max_slot_wal_keep_size", "32MB");
    // 10 steps of 16 MB of WAL (a segment switch each) in the other database, 160 MB in all,
    // while this database is idle; a checkpoint after each (where the server invalidates slots).
    for step in 0..10 {
        neighbour.batch_execute("INSERT INTO w VALUES (1); SELECT pg_switch_wal()").expect("WAL");
        let written: String =
            c.query_one("SELECT pg_current_wal_flush_lsn()::text", &[]).expect("lsn").get(0);
        let written = Position::from_lsn(&written).expect("LSN");
        assert!(poll_lines(&mut source).is_empty(), "nothing of ours to decode");
        source.confirm(source.confirmed()).expect("confirm");
        let (status, confirmed) = slot_state(&mut c, "t_idle");
        assert!(
            confirmed.is_some_and(|p| p >= written),
            "step {step}: the idle slot is confirmed at {confirmed:?}, behind the WAL written before the peek ({written})"
        );
        c.batch_execute("CHECKPOINT").expect("checkpoint");
        assert_ne!(status, "lost", "step {step}: the idle slot was invalidated");
    }
    let (status, _) = slot_state(&mut c, "t_idle");
    assert_ne!(status, "lost", "the idle slot was invalidated");
    let (control, _) = slot_state(&mut c, "t_idle_control");
    assert_eq!(control, "lost", "the WAL written was enough to invalidate a slot that does not move");
    // And reading an invalidated slot is an error that says why (not just "db error").
    let mut lost = LiveSource::connect(config("t_idle_control")).expect("connect");
    let e = lost.poll(|_, _| -> Result<(), String> { Ok(()) }).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("SQLSTATE 55000") && text.contains("invalidated"), "{text}");
    drop(keep);
    drop((lost, source, neighbour));
    drop_slot("t_idle_control");
    drop_slot("t_idle");
    c.batch_execute("DROP DATABASE IF EXISTS t_neighbour").expect("drop db");
}

#[test]
#[ignore = "needs a PostgreSQL with wal2json (LANESTREAM_PG_URL); run by scripts/e2e-postgres.sh"]
fn a_slot_created_after_the_sinks_checkpoint_is_a_gap_refused_and_dropped() {
    let _server = serial();
    let mut c = sql();
    c.batch_execute("DROP TABLE IF EXISTS t_gap; CREATE TABLE t_gap (id int PRIMARY KEY)").expect("table");
    drop_slot("t_gap");
    drop(LiveSource::connect(config("t_gap")).expect("slot"));
    let mut source = LiveSource::connect(config("t_gap")).expect("source");
    c.batch_execute("INSERT INTO t_gap VALUES (1)").expect("insert");
    let checkpoint = commits(&poll_lines(&mut source))[0];
    // A slot that existed: no check.
    assert!(!source.slot_positions().created);
    source.check_resume(Some(checkpoint)).expect("an existing slot resumes");
    drop(source);
    // The admin drops it; meanwhile a change nobody decodes; the slot is created again.
    drop_slot("t_gap");
    c.batch_execute("INSERT INTO t_gap VALUES (2)").expect("insert");
    let mut source = LiveSource::connect(config("t_gap")).expect("source");
    let positions = source.slot_positions();
    assert!(positions.created);
    let consistent_point = positions.consistent_point.expect("the consistent point");
    assert!(consistent_point > checkpoint);
    assert_eq!(positions.confirmed_flush, Some(consistent_point));
    // A new pipeline (no checkpoint) is fine...
    source.check_resume(None).expect("no checkpoint, no gap");
    // ...sinks behind the consistent point are not.
    let e = source.check_resume(Some(checkpoint)).unwrap_err();
    assert!(
        matches!(e, LiveError::SlotGap { checkpoint: cp, consistent_point: p, .. } if cp == checkpoint && p == consistent_point),
        "{e}"
    );
    let text = e.to_string();
    assert!(text.contains(&checkpoint.to_string()) && text.contains(&consistent_point.to_string()), "{text}");
    assert!(text.contains("Backfill") && text.contains("do not re-create"), "{text}");
    drop(source);
    // The slot it created is gone again, so that a second start is refused too.
    let mut c2 = config("t_gap");
    c2.create_slot = false;
    assert!(matches!(LiveSource::connect(c2), Err(LiveError::NoSlot(_))));
}
