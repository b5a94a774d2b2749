//! The live source against a real PostgreSQL: its errors and its confirms.
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

use lanestream::Position;
use lanestream_postgres::live::{LiveConfig, LiveError, LiveSource};
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
    assert!(e.to_string().contains("--create-slot"), "{e}");

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
    let owned = |v: &[&str]| Some(v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
    // Column order, as wal2json's pk.
    assert_eq!(lookup("public", "t_keys_pk"), owned(&["b", "a"]));
    assert_eq!(lookup("public", "t_keys_index"), owned(&["email"]));
    assert_eq!(lookup("public", "t_keys_both"), owned(&["email"]));
    assert_eq!(lookup("public", "t_keys_full"), None);
    assert_eq!(lookup("public", "no_such_table"), None);
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
