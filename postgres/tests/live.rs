//! The live source against a real PostgreSQL: its errors, its confirms, its keys, its
//! reconnects and heartbeats, on the pgoutput stream.
//!
//! They run against a throwaway server the test binary starts from the installed server
//! binaries (`pg_server/temp.rs`: `initdb` in a temp dir, a unix socket, a password user, a
//! restart command), or against `LANESTREAM_PG_URL` (a superuser connection string) with
//! `LANESTREAM_PG_PASSWORD_URL` (a user that logs in with a password, given a wrong one),
//! `LANESTREAM_PG_BIN` (the directory of `pg_recvlogical`) and, optionally,
//! `LANESTREAM_PG_RESTART` (a shell command that restarts the server at once, for the reconnect
//! test). Without a server they say `SKIPPED` (a failure under `CI=true`).

use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use lanestream::{Batch, Position};
use lanestream_postgres::batch::CatalogKey;
use lanestream_postgres::live::{LiveConfig, LiveError, LiveSource};
use postgres::{Client, NoTls};

mod pg_server;
use lanestream_postgres::pipeline::{Source, SourceItem};
use pg_server::{bin, config, drop_slot, restart_command, serial, sql, url, wrong_password_url, Setting};

/// The batches the stream brings until it has been quiet for 500 ms (and at least `want`
/// positioned ones, waiting up to 20 s for them), confirming nothing; the idle source's empty
/// batches left out.
fn stream_batches(source: &mut LiveSource, want: usize) -> Result<Vec<Batch>, LiveError> {
    let mut out: Vec<Batch> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match source.next(Duration::from_millis(500))? {
            Some(SourceItem::Change(b)) if b.position.is_some() && b.envelopes.is_empty() => {}
            Some(SourceItem::Change(b)) => out.push(b),
            Some(other) => panic!("no backfill was asked: {other:?}"),
            None if out.iter().filter(|b| b.position.is_some()).count() >= want
                || Instant::now() > deadline =>
            {
                return Ok(out)
            }
            None => {}
        }
    }
}

fn commits(batches: &[Batch]) -> Vec<Position> {
    batches.iter().filter_map(|b| b.position).collect()
}

/// The ids of every envelope of `index`.
fn ids_of(batches: &[Batch], index: &str) -> Vec<String> {
    batches
        .iter()
        .flat_map(|b| b.envelopes.iter())
        .filter(|e| e.index.as_str() == index)
        .map(|e| e.id.clone())
        .collect()
}

#[test]
fn a_wrong_password_is_an_auth_error() {
    let Some(_server) = serial() else { return };
    let bad = wrong_password_url();
    let e = LiveSource::connect(LiveConfig::new(bad, "any")).unwrap_err();
    assert!(matches!(e, LiveError::Auth(_)), "{e}");
    assert!(e.to_string().contains("password authentication failed"), "{e}");
}

#[test]
fn a_missing_slot_needs_create_slot_and_a_slot_of_another_plugin_is_refused() {
    let Some(_server) = serial() else { return };
    let mut c = config("t_missing");
    c.create_slot = false;
    let e = LiveSource::connect(c).unwrap_err();
    assert!(matches!(e, LiveError::NoSlot(ref s) if s == "t_missing"), "{e}");
    assert!(e.to_string().contains("LiveConfig::create_slot") && e.to_string().contains("backfill"), "{e}");

    sql().execute("SELECT pg_create_logical_replication_slot('t_wal2json', 'wal2json')", &[]).expect("slot");
    let e = LiveSource::connect(config("t_wal2json")).unwrap_err();
    assert!(matches!(e, LiveError::WrongPlugin { ref plugin, .. } if plugin == "wal2json"), "{e}");
    drop_slot("t_wal2json");
}

#[test]
fn a_missing_or_empty_publication_is_refused_and_create_slot_creates_one_for_its_tables() {
    let Some(_server) = serial() else { return };
    let mut c = sql();
    c.batch_execute("DROP PUBLICATION IF EXISTS t_nopub; DROP PUBLICATION IF EXISTS t_emptypub; CREATE PUBLICATION t_emptypub")
        .expect("publications");
    drop_slot("t_pub");
    // Without --create-slot: a missing publication is named.
    sql().execute("SELECT pg_create_logical_replication_slot('t_pub', 'pgoutput')", &[]).expect("slot");
    let mut cfg = config("t_pub");
    cfg.create_slot = false;
    cfg.publication = "t_nopub".into();
    let e = LiveSource::connect(cfg.clone()).unwrap_err();
    assert!(matches!(e, LiveError::NoPublication(ref p) if p == "t_nopub"), "{e}");
    assert!(e.to_string().contains("CREATE PUBLICATION"), "{e}");
    cfg.publication = "t_emptypub".into();
    let e = LiveSource::connect(cfg).unwrap_err();
    assert!(matches!(e, LiveError::PublicationEmpty(_)), "{e}");
    drop_slot("t_pub");
    // With it, and no slot yet: the publication is created for every table that can be
    // published (FOR TABLE: never FOR ALL TABLES, which a later table without a replica
    // identity would break the writes of), then the slot.
    let mut cfg = config("t_pub");
    cfg.publication = "t_nopub".into();
    match LiveSource::connect(cfg) {
        Ok(source) => drop(source),
        // The other tests' tables: one without a replica identity is named, nothing created.
        Err(LiveError::UnpublishableTables { tables, .. }) => {
            assert!(!tables.is_empty());
            let n: i64 = c
                .query_one("SELECT count(*) FROM pg_publication WHERE pubname = 't_nopub'", &[])
                .expect("pub")
                .get(0);
            assert_eq!(n, 0, "nothing created");
            drop_slot("t_pub");
            c.batch_execute("DROP PUBLICATION t_emptypub").expect("drop");
            return;
        }
        Err(e) => panic!("{e}"),
    }
    let all: bool = c
        .query_one("SELECT puballtables FROM pg_publication WHERE pubname = 't_nopub'", &[])
        .expect("pub")
        .get(0);
    assert!(!all, "the publication created names its tables");
    drop_slot("t_pub");
    c.batch_execute("DROP PUBLICATION t_nopub; DROP PUBLICATION t_emptypub").expect("drop");
}

#[test]
fn a_user_without_replication_is_told_to_get_it() {
    let Some(_server) = serial() else { return };
    let mut c = sql();
    c.batch_execute(
        "DROP ROLE IF EXISTS t_norepl; CREATE ROLE t_norepl LOGIN; GRANT pg_read_all_data TO t_norepl",
    )
    .expect("role");
    let mut u: postgres::Config = url().parse().expect("url");
    u.user("t_norepl");
    let mut cfg = config("t_norepl");
    // The libpq key=value form of the same server with another user.
    let host = match u.get_hosts().first() {
        Some(postgres::config::Host::Unix(d)) => d.display().to_string(),
        Some(postgres::config::Host::Tcp(h)) => h.clone(),
        None => "localhost".into(),
    };
    cfg.url = format!(
        "host={host} port={} user=t_norepl dbname={}",
        u.get_ports().first().copied().unwrap_or(5432),
        u.get_dbname().unwrap_or("postgres")
    );
    let e = LiveSource::connect(cfg).unwrap_err();
    assert!(matches!(e, LiveError::NoReplicationPermission(ref u) if u == "t_norepl"), "{e}");
    assert!(e.to_string().contains("ALTER ROLE t_norepl REPLICATION"), "{e}");
    c.batch_execute("DROP ROLE t_norepl").expect("drop role");
}

#[test]
fn a_slot_held_by_another_client_is_refused_after_the_wait() {
    let Some(_server) = serial() else { return };
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
    let mut recv: Child = Command::new(bin().join("pg_recvlogical"))
        .args([
            "--start",
            "--slot",
            "t_held",
            "-f",
            "/dev/null",
            "-o",
            "proto_version=1",
            "-o",
            "publication_names=lanestream",
            "--dbname",
            &url(),
        ])
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
fn confirming_a_commit_lsn_resends_that_transaction_and_never_more() {
    let Some(_server) = serial() else { return };
    let mut c = sql();
    c.batch_execute("DROP TABLE IF EXISTS t_confirm; CREATE TABLE t_confirm (id int PRIMARY KEY)")
        .expect("table");
    drop_slot("t_confirm");
    let mut source = LiveSource::connect(config("t_confirm")).expect("source");
    let created = source.confirmed().expect("a new slot is confirmed at its creation");
    source.open().expect("start");
    for id in 1..=3 {
        c.execute("INSERT INTO t_confirm VALUES ($1)", &[&id]).expect("insert");
    }
    let txns = commits(&stream_batches(&mut source, 3).expect("stream"));
    assert_eq!(txns.len(), 3, "{txns:?}");
    // Receiving confirms nothing: the status updates carry the slot's own position.
    assert_eq!(source.read_confirmed().expect("read"), Some(created));
    // Confirm the second transaction's commit LSN: the slot is there, not further.
    source.confirm(txns[1]).expect("confirm");
    assert_eq!(source.confirmed(), Some(txns[1]));
    assert_eq!(source.read_confirmed().expect("read"), Some(txns[1]));
    // Confirming less is a no-op, never a step back.
    source.confirm(txns[0]).expect("confirm");
    assert_eq!(source.confirmed(), Some(txns[1]));
    thread::sleep(Duration::from_millis(300));
    assert_eq!(source.read_confirmed().expect("read"), Some(txns[1]));
    drop(source);
    // After a restart PostgreSQL re-sends from the confirmed position: the transaction AT it
    // comes again (at least once), then the next.
    let mut source = LiveSource::connect(config("t_confirm")).expect("restart");
    assert_eq!(source.confirmed(), Some(txns[1]));
    source.open().expect("start");
    assert_eq!(commits(&stream_batches(&mut source, 2).expect("stream")), txns[1..]);
    drop(source);
    drop_slot("t_confirm");
}

#[test]
fn the_key_lookup_reads_the_replica_identity_from_the_catalog() {
    let Some(_server) = serial() else { return };
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
    drop_slot("t_keys");
    let source = LiveSource::connect(config("t_keys")).expect("source");
    let mut lookup = source.key_lookup();
    let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let mut key = |table: &str| lookup("public", table).expect("look-up");
    // Column order.
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
fn a_server_that_does_not_allow_pgoutput_as_an_output_plugin_is_a_clear_error() {
    let Some(_server) = serial() else { return };
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
    drop_slot("t_not_allowed");
    let setting = Setting::set("output_plugin_libraries", "wal2json");
    let e = LiveSource::connect(config("t_not_allowed"));
    drop(setting);
    let e = e.unwrap_err();
    assert!(matches!(e, LiveError::PluginNotAllowed(_)), "{e}");
    assert!(e.to_string().contains("output_plugin_libraries"), "{e}");
    drop_slot("t_not_allowed");
}

/// A source on `slot` (created afresh), streaming.
fn started(slot: &str) -> LiveSource {
    drop_slot(slot);
    let mut source = LiveSource::connect(config(slot)).expect("source");
    source.open().expect("start");
    source
}

#[test]
fn keys_and_documents_follow_the_stream_across_ddl_while_running() {
    let Some(_server) = serial() else { return };
    let mut c = sql();
    c.batch_execute(
        "DROP TABLE IF EXISTS t_rename_live; CREATE TABLE t_rename_live (id int PRIMARY KEY, v int)",
    )
    .expect("table");
    let mut source = started("t_rename_live");
    c.batch_execute("INSERT INTO t_rename_live VALUES (1, 1)").expect("insert");
    let b = stream_batches(&mut source, 1).expect("stream");
    assert_eq!(ids_of(&b, "public_t_rename_live"), ["1"]);
    // Writers with DDL between them: each change takes the shape it was written with.
    c.batch_execute(
        "ALTER TABLE t_rename_live RENAME COLUMN id TO uid; INSERT INTO t_rename_live VALUES (2, 1);
         ALTER TABLE t_rename_live ADD COLUMN note text; UPDATE t_rename_live SET v = 2, note = 'x' WHERE uid = 1;
         ALTER TABLE t_rename_live ALTER COLUMN v TYPE text; UPDATE t_rename_live SET v = 'three' WHERE uid = 1;
         ALTER TABLE t_rename_live DROP COLUMN note; DELETE FROM t_rename_live WHERE uid = 2",
    )
    .expect("ddl");
    // One simple query: one transaction, with Relation messages between its changes.
    let b = stream_batches(&mut source, 1).expect("stream");
    assert_eq!(ids_of(&b, "public_t_rename_live"), ["2", "1", "1", "2"]);
    let docs: Vec<String> = b
        .iter()
        .flat_map(|b| b.envelopes.iter())
        .map(|e| String::from_utf8(e.document.to_vec()).expect("utf-8"))
        .collect();
    assert_eq!(
        docs,
        [
            r#"{"uid":2,"v":1}"#,
            r#"{"uid":1,"v":2,"note":"x"}"#,
            r#"{"uid":1,"v":"three","note":"x"}"#,
            r#"{"uid":2}"#
        ]
    );
    drop(source);
    drop_slot("t_rename_live");
}

#[test]
fn keys_follow_the_stream_when_the_key_column_was_renamed_while_down() {
    let Some(_server) = serial() else { return };
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
    source.open().expect("start");
    let b = stream_batches(&mut source, 1).expect("stream");
    assert_eq!(ids_of(&b, "public_t_rename_down"), ["1", "1", "2"]);
    drop(source);
    drop_slot("t_rename_down");
}

#[test]
fn keys_follow_the_stream_when_the_key_is_redefined_with_more_columns_or_the_identity_changes() {
    let Some(_server) = serial() else { return };
    let mut c = sql();
    c.batch_execute(
        "DROP TABLE IF EXISTS t_rekey; CREATE TABLE t_rekey (id int PRIMARY KEY, k int NOT NULL)",
    )
    .expect("table");
    let mut source = started("t_rekey");
    c.batch_execute("INSERT INTO t_rekey VALUES (7, 7)").expect("insert");
    assert_eq!(ids_of(&stream_batches(&mut source, 1).expect("stream"), "public_t_rekey"), ["7"]);
    // One transaction each (a simple query of several statements would be one).
    for statement in [
        "ALTER TABLE t_rekey DROP CONSTRAINT t_rekey_pkey, ADD PRIMARY KEY (id, k)",
        "INSERT INTO t_rekey VALUES (1, 1), (1, 2)",
        "DELETE FROM t_rekey WHERE id = 1 AND k = 2",
        "CREATE UNIQUE INDEX t_rekey_k ON t_rekey (k)",
        "ALTER TABLE t_rekey REPLICA IDENTITY USING INDEX t_rekey_k",
        "DELETE FROM t_rekey WHERE k = 1",
    ] {
        c.batch_execute(statement).expect("rekey");
    }
    assert_eq!(
        ids_of(&stream_batches(&mut source, 3).expect("stream"), "public_t_rekey"),
        ["1:1", "1:2", "1:2", "1"],
        "rows (1,1) and (1,2) keep their own ids; under the index identity the key is k"
    );
    drop(source);
    drop_slot("t_rekey");
}

#[test]
fn a_key_lookup_whose_connection_was_terminated_reconnects_and_never_keys_by_every_column() {
    let Some(_server) = serial() else { return };
    let mut c = sql();
    // FULL identity with a primary key: the key comes from the catalog.
    c.batch_execute(
        "DROP TABLE IF EXISTS t_side; CREATE TABLE t_side (id int PRIMARY KEY, v int);
         ALTER TABLE t_side REPLICA IDENTITY FULL;",
    )
    .expect("table");
    let mut source = started("t_side");
    let terminated: i64 = c
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = 'lanestream side' AND pid <> pg_backend_pid()",
            &[],
        )
        .expect("terminate")
        .get(0);
    assert_eq!(terminated, 1, "the side connection");
    c.batch_execute("INSERT INTO t_side VALUES (1, 1); UPDATE t_side SET v = 2 WHERE id = 1")
        .expect("changes");
    // The look-up reconnects: the rows are keyed by the primary key, never by every column.
    assert_eq!(ids_of(&stream_batches(&mut source, 2).expect("stream"), "public_t_side"), ["1", "1"]);
    drop(source);
    drop_slot("t_side");
}

#[test]
fn p9_nan_and_infinite_keys_give_one_id_each_never_null() {
    let Some(_server) = serial() else { return };
    let mut c = sql();
    c.batch_execute("DROP TABLE IF EXISTS t_nan; CREATE TABLE t_nan (id numeric PRIMARY KEY, v int)")
        .expect("table");
    let mut source = started("t_nan");
    c.batch_execute("INSERT INTO t_nan VALUES ('NaN', 1), ('Infinity', 2), ('-Infinity', 3)")
        .expect("insert");
    let batches = stream_batches(&mut source, 1).expect("the stream");
    assert_eq!(ids_of(&batches, "public_t_nan"), ["NaN", "Infinity", "-Infinity"]);
    drop(source);
    drop_slot("t_nan");
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

/// Streams (confirming the watermark a caller with no lanes has: everything handed over, and
/// where the server said it sent everything before, less one, as the pipeline's idle batches
/// do) until the slot is confirmed at `at_least` less one or `within` passed; returns the slot's
/// confirmed position, plus one.
fn follow(
    source: &mut LiveSource,
    c: &mut Client,
    slot: &str,
    at_least: Position,
    within: Duration,
) -> Option<Position> {
    let deadline = Instant::now() + within;
    loop {
        let handed = source.decoder().builder().last_commit();
        let idle = source.sent_upto().map(|p| Position(p.0 - 1));
        if let Some(p) = handed.max(idle) {
            source.confirm(p).expect("confirm");
        }
        let (_, confirmed) = slot_state(c, slot);
        let confirmed = confirmed.map(|p| Position(p.0 + 1));
        if confirmed.is_some_and(|p| p >= at_least) || Instant::now() > deadline {
            return confirmed;
        }
        source.next(Duration::from_millis(100)).expect("stream");
    }
}

#[test]
fn an_idle_slot_follows_the_wal_of_a_busy_neighbour_database_within_max_slot_wal_keep_size() {
    let Some(_server) = serial() else { return };
    let mut c = sql();
    c.batch_execute("DROP DATABASE IF EXISTS t_neighbour").expect("drop db");
    c.batch_execute("CREATE DATABASE t_neighbour").expect("create db");
    let mut neighbour_url: postgres::Config = url().parse().expect("url");
    neighbour_url.dbname("t_neighbour");
    let mut neighbour = neighbour_url.connect(NoTls).expect("neighbour");
    neighbour.batch_execute("CREATE TABLE w (a int)").expect("table");
    drop_slot("t_idle_control");
    let mut source = started("t_idle");
    // A slot nothing reads or confirms: what max_slot_wal_keep_size does to a stuck slot.
    c.batch_execute("SELECT pg_create_logical_replication_slot('t_idle_control', 'pgoutput')")
        .expect("control");
    let keep = Setting::set("max_slot_wal_keep_size", "32MB");
    // 10 steps of 16 MB of WAL (a segment switch each) in the other database, 160 MB in all,
    // while this database is idle; a checkpoint after each (where the server invalidates slots).
    for step in 0..10 {
        neighbour.batch_execute("INSERT INTO w VALUES (1); SELECT pg_switch_wal()").expect("WAL");
        let written: String =
            c.query_one("SELECT pg_current_wal_flush_lsn()::text", &[]).expect("lsn").get(0);
        let written = Position::from_lsn(&written).expect("LSN");
        let confirmed = follow(&mut source, &mut c, "t_idle", written, Duration::from_secs(20));
        assert!(
            confirmed.is_some_and(|p| p >= written),
            "step {step}: the idle slot is confirmed at {confirmed:?}, behind the WAL written ({written})"
        );
        c.batch_execute("CHECKPOINT").expect("checkpoint");
        let (status, _) = slot_state(&mut c, "t_idle");
        assert_ne!(status, "lost", "step {step}: the idle slot was invalidated");
    }
    assert!(source.decoder().builder().transactions() == 0, "nothing of ours was decoded");
    let (control, _) = slot_state(&mut c, "t_idle_control");
    assert_eq!(control, "lost", "the WAL written was enough to invalidate a slot that does not move");
    // And streaming an invalidated slot is an error that says why.
    let mut lost = LiveSource::connect(config("t_idle_control")).expect("connect");
    let e = lost.open().unwrap_err();
    assert!(matches!(e, LiveError::SlotInvalidated { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("SQLSTATE 55000")
            && text.contains("max_slot_wal_keep_size")
            && text.contains("backfill"),
        "{text}"
    );
    drop(keep);
    drop((lost, source, neighbour));
    drop_slot("t_idle_control");
    drop_slot("t_idle");
    c.batch_execute("DROP DATABASE IF EXISTS t_neighbour").expect("drop db");
}

#[test]
fn with_a_heartbeat_an_idle_slot_follows_pg_current_wal_lsn() {
    let Some(_server) = serial() else { return };
    let mut c = sql();
    drop_slot("t_heartbeat");
    let mut cfg = config("t_heartbeat");
    cfg.heartbeat = Some(Duration::from_millis(200));
    let mut source = LiveSource::connect(cfg).expect("source");
    source.open().expect("start");
    // An idle hour compressed: rounds of WAL written elsewhere in the server (a checkpoint, a
    // segment switch, no change of any table), each followed by the slot.
    for round in 0..5 {
        c.batch_execute("CHECKPOINT; SELECT pg_switch_wal()").expect("WAL");
        let current: String = c.query_one("SELECT pg_current_wal_lsn()::text", &[]).expect("lsn").get(0);
        let current = Position::from_lsn(&current).expect("LSN");
        let confirmed = follow(&mut source, &mut c, "t_heartbeat", current, Duration::from_secs(10));
        assert!(
            confirmed.is_some_and(|p| p >= current),
            "round {round}: confirmed {confirmed:?} behind pg_current_wal_lsn {current}"
        );
    }
    let m = source.metrics().expect("metrics");
    assert!(m.heartbeats >= 3, "{m:?}");
    assert!(m.slot_lag_bytes.is_some_and(|l| l < 1 << 20), "the lag of a followed idle slot: {m:?}");
    drop(source);
    drop_slot("t_heartbeat");
}

/// The walsender streaming `slot`.
fn walsender(c: &mut Client, slot: &str) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pid: Option<i32> = c
            .query_one("SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1::text", &[&slot])
            .expect("slot")
            .get(0);
        if let Some(pid) = pid {
            return pid;
        }
        assert!(Instant::now() < deadline, "nobody streams {slot}");
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_connection_terminated_by_an_admin_is_a_clear_error_and_a_dropped_slot_another() {
    let Some(_server) = serial() else { return };
    let mut c = sql();
    c.batch_execute("DROP TABLE IF EXISTS t_admin; CREATE TABLE t_admin (id int PRIMARY KEY)")
        .expect("table");
    let mut source = started("t_admin");
    c.batch_execute("INSERT INTO t_admin VALUES (1)").expect("insert");
    assert_eq!(commits(&stream_batches(&mut source, 1).expect("stream")).len(), 1);
    let pid = walsender(&mut c, "t_admin");
    c.execute("SELECT pg_terminate_backend($1)", &[&pid]).expect("terminate");
    let e = stream_batches(&mut source, 1).unwrap_err();
    assert!(matches!(e, LiveError::TerminatedByAdmin { .. }), "{e}");
    assert!(e.to_string().contains("administrator"), "{e}");
    drop(source);

    // Terminated, and the slot dropped at once: the source says the slot is gone.
    let mut source = LiveSource::connect(config("t_admin")).expect("source");
    source.open().expect("start");
    let pid = walsender(&mut c, "t_admin");
    c.execute("SELECT pg_terminate_backend($1)", &[&pid]).expect("terminate");
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.execute("SELECT pg_drop_replication_slot('t_admin')", &[]).is_err() {
        assert!(Instant::now() < deadline, "cannot drop the slot");
        thread::sleep(Duration::from_millis(20));
    }
    let e = stream_batches(&mut source, 1).unwrap_err();
    assert!(matches!(e, LiveError::SlotDropped(_)), "{e}");
    assert!(e.to_string().contains("backfill"), "{e}");
}

#[test]
fn a_server_restarted_mid_stream_is_reconnected_from_the_confirmed_position() {
    let Some(_server) = serial() else { return };
    let Some(restart) = restart_command() else {
        eprintln!("SKIPPED: the server cannot be restarted here (LANESTREAM_PG_RESTART)");
        return;
    };
    let mut c = sql();
    c.batch_execute("DROP TABLE IF EXISTS t_restart; CREATE TABLE t_restart (id int PRIMARY KEY)")
        .expect("table");
    let mut source = started("t_restart");
    for id in 1..=3 {
        c.execute("INSERT INTO t_restart VALUES ($1)", &[&id]).expect("insert");
    }
    let first = commits(&stream_batches(&mut source, 3).expect("stream"));
    source.confirm(first[1]).expect("confirm");
    assert_eq!(source.read_confirmed().expect("read"), Some(first[1]));
    drop(c);
    let status = Command::new("sh").arg("-c").arg(&restart).status().expect("restart");
    assert!(status.success(), "{restart}");
    let mut c = sql();
    for id in 4..=5 {
        c.execute("INSERT INTO t_restart VALUES ($1)", &[&id]).expect("insert");
    }
    // The stream comes back by itself: the transaction at the confirmed position and the one
    // after it were handed over already (skipped), then the new ones, once each.
    let after = stream_batches(&mut source, 2).expect("reconnected");
    assert_eq!(ids_of(&after, "public_t_restart"), ["4", "5"]);
    let m = source.metrics().expect("metrics");
    assert_eq!(m.reconnects, 1, "{m:?}");
    // At least the two at and after the confirmed position come again (an immediate shutdown
    // may lose the slot's last confirmed position: it is saved at checkpoints), skipped whole.
    assert!(
        source.decoder().skipped_transactions() >= 2,
        "{} re-sent transactions skipped",
        source.decoder().skipped_transactions()
    );
    drop(source);
    drop_slot("t_restart");
}

#[test]
fn a_slot_created_after_the_sinks_checkpoint_is_a_gap_refused_and_dropped() {
    use lanestream::SinkName;
    use lanestream_postgres::pipeline::{SinkStart, SinkState};

    let Some(_server) = serial() else { return };
    let mut c = sql();
    c.batch_execute("DROP TABLE IF EXISTS t_gap; CREATE TABLE t_gap (id int PRIMARY KEY)").expect("table");
    let mut source = started("t_gap");
    c.batch_execute("INSERT INTO t_gap VALUES (1)").expect("insert");
    let checkpoint = commits(&stream_batches(&mut source, 1).expect("stream"))[0];
    drop(source);
    let sink = SinkName::new("s").expect("name");
    let state = SinkState { position: Some(checkpoint), ..SinkState::new() };
    let start = |source: LiveSource, state: Option<&SinkState>| {
        let mut source = source;
        source.start(&[SinkStart { sink: &sink, state, joiners: Default::default() }])
    };
    // A slot that existed, confirmed no further than the sink: resumed.
    let source = LiveSource::connect(config("t_gap")).expect("source");
    assert!(!source.slot_positions().created);
    start(source, Some(&state)).expect("an existing slot resumes");
    // The admin drops it; meanwhile a change nobody decodes; the slot is created again.
    drop_slot("t_gap");
    c.batch_execute("INSERT INTO t_gap VALUES (2)").expect("insert");
    let source = LiveSource::connect(config("t_gap")).expect("source");
    let positions = source.slot_positions();
    assert!(positions.created);
    let consistent_point = positions.consistent_point.expect("the consistent point");
    assert!(consistent_point > checkpoint);
    assert_eq!(positions.confirmed_flush, Some(consistent_point));
    // A new sink (no state) is fine...
    start(source, None).expect("no state, no gap");
    // ...a sink behind the consistent point is not (a second source: the first kept the slot).
    let source = LiveSource::connect(config("t_gap")).expect("source");
    let e = start(source, Some(&state)).unwrap_err();
    assert!(
        matches!(e, LiveError::SlotGap { applied: Some(a), resumes_from: r, .. } if a == checkpoint && r == consistent_point),
        "{e}"
    );
    let text = e.to_string();
    assert!(text.contains(&checkpoint.to_string()) && text.contains(&consistent_point.to_string()), "{text}");
    assert!(text.contains("Reset the sink"), "{text}");
    // A slot it did not create is left: the refusal stands on every start until the sink is
    // reset.
    let mut c2 = config("t_gap");
    c2.create_slot = false;
    let source = LiveSource::connect(c2).expect("source");
    assert!(matches!(start(source, Some(&state)), Err(LiveError::SlotGap { dropped: false, .. })));
    drop_slot("t_gap");
}

#[test]
fn the_library_driver_streams_a_slot_into_durable_sinks_and_confirms_at_the_watermark() {
    use lanestream::{MemoryStream, Stream};
    use lanestream_postgres::ndjson::DurableNdjson;
    use lanestream_postgres::pipeline::Pipeline;

    let Some(_server) = serial() else { return };
    let mut c = sql();
    c.batch_execute("DROP TABLE IF EXISTS t_driver; CREATE TABLE t_driver (id int PRIMARY KEY, v text)")
        .expect("table");
    drop_slot("t_driver");
    let source = LiveSource::connect(config("t_driver")).expect("source");
    for id in 1..=20 {
        c.execute("INSERT INTO t_driver VALUES ($1, 'x')", &[&id]).expect("insert");
    }
    let end: String = c.query_one("SELECT pg_current_wal_lsn()::text", &[]).expect("lsn").get(0);
    let end = Position::from_lsn(&end).expect("LSN");
    let dir = tempfile::tempdir().expect("dir");
    let stream = MemoryStream::builder().sinks(["search", "cache"]).build().expect("stream");
    // The table is new and empty when the slot is made: the new sinks need nothing from before.
    let mut pipeline =
        Pipeline::new(stream.clone()).joiners(lanestream_postgres::pipeline::Joiners::LiveOnly);
    for name in ["search", "cache"] {
        let out = dir.path().to_path_buf();
        pipeline = pipeline.sink(name, move || DurableNdjson::open(&out, name, Duration::ZERO));
    }
    let mut source = source.until(Some(end));
    let report = pipeline.run(&mut source).expect("the pipeline");
    // The 20 transactions, and the empty batches the idle source may hand over between them.
    assert!(report.transactions >= 20, "{report:?}");
    assert_eq!(stream.watermark(), report.last_position);
    assert!(report.confirmed >= report.last_position, "{report:?}");
    for name in ["search", "cache"] {
        let text = std::fs::read_to_string(dir.path().join(format!("{name}.ndjson"))).expect("output");
        assert_eq!(text.lines().count(), 20, "{name}: every row once");
    }
    // The slot was confirmed (status updates) no further than where the source decoded.
    let live = &mut source;
    let confirmed = live.read_confirmed().expect("read").expect("confirmed");
    assert!(report.last_position.is_some_and(|l| confirmed >= l), "slot at {confirmed}");
    assert!(live.decoded().is_some_and(|d| confirmed <= d), "slot at {confirmed}");
    drop(source);
    drop_slot("t_driver");
}
