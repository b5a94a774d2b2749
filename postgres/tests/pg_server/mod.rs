//! The helpers of the tests against a real PostgreSQL (`live.rs`, `backfill.rs`, `seams.rs`,
//! `changes.rs`, ...): the server (a throwaway one the test binary starts, `temp.rs`, or
//! `LANESTREAM_PG_URL`), one test at a time on it, a live source's configuration, a slot
//! dropped even while its killed holder lets go, the WAL position, a table's rows as JSON, and
//! a sink that applies changes by the documented rules (`replica.rs`).
#![allow(dead_code)]

pub mod replica;
pub mod temp;

use std::collections::BTreeMap;

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use lanestream::Position;
use lanestream_postgres::live::LiveConfig;
use postgres::{Client, NoTls};

/// The tests share one server, and some change its configuration for a moment: each holds this
/// lock for its whole run. `None` (after a loud `SKIPPED` line) when there is no server: the
/// test returns.
pub fn serial() -> Option<MutexGuard<'static, ()>> {
    static SERVER: Mutex<()> = Mutex::new(());
    let guard = SERVER.lock().unwrap_or_else(PoisonError::into_inner);
    temp::server(std::thread::current().name().unwrap_or("a test"))?;
    Some(guard)
}

fn server() -> &'static temp::Server {
    temp::server("a test").expect("the server (a test calls serial() first)")
}

pub fn url() -> String {
    server().url.clone()
}

/// The directory of `pg_recvlogical`.
pub fn bin() -> std::path::PathBuf {
    server().bin.clone().expect("the server's programs (LANESTREAM_PG_BIN)")
}

/// A shell command that restarts the server at once, if it can be restarted here.
pub fn restart_command() -> Option<String> {
    server().restart.clone()
}

/// A user that logs in with a password, given the wrong one.
pub fn wrong_password_url() -> String {
    server().wrong_password_url.clone().expect("a password user (LANESTREAM_PG_PASSWORD_URL)")
}

pub fn sql() -> Client {
    sql_at(&url())
}

/// A connection to `url` (another database of the server, say).
pub fn sql_at(url: &str) -> Client {
    Client::connect(url, NoTls).expect("connect")
}

/// The slot's `confirmed_flush_lsn` (`None`: never confirmed).
pub fn slot_confirmed(c: &mut Client, slot: &str) -> Option<Position> {
    c.query_one(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1::text",
        &[&slot],
    )
    .expect("the slot")
    .get::<_, Option<String>>(0)
    .map(|t| Position::from_lsn(&t).expect("an LSN"))
}

/// The server's current WAL position: everything committed before it is in the WAL.
pub fn wal(c: &mut Client) -> Position {
    Position::from_lsn(
        &c.query_one("SELECT pg_current_wal_lsn()::text", &[]).expect("lsn").get::<_, String>(0),
    )
    .expect("an LSN")
}

/// The tests' publication, `lanestream`, `FOR ALL TABLES` (the tables each test creates are
/// published as they are created), made once if missing: as a user would before the first start
/// (the live source itself creates one only `FOR TABLE`, never over a table without an identity).
fn publication() {
    static MADE: std::sync::Once = std::sync::Once::new();
    MADE.call_once(|| {
        sql()
            .batch_execute(
                "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_publication WHERE pubname = 'lanestream') THEN \
                 CREATE PUBLICATION lanestream FOR ALL TABLES; END IF; END $$",
            )
            .expect("the tests' publication");
    });
}

pub fn config(slot: &str) -> LiveConfig {
    publication();
    let mut c = LiveConfig::new(url(), slot);
    c.create_slot = true;
    c.slot_wait = Duration::from_secs(1);
    c.status_interval = Duration::from_millis(100);
    c.retry_budget = Duration::from_secs(30);
    c
}

/// A live source's configuration for `slot` on the database of `url`, streaming `publication`
/// (the test makes it; with `create_slot` the source creates it if missing): the slot created if
/// missing, a 5 s wait for a busy slot, status updates every 100 ms, backfill chunks of 200 rows.
pub fn live_config(url: &str, slot: &str, publication: &str) -> LiveConfig {
    let mut c = LiveConfig::new(url, slot);
    c.create_slot = true;
    c.publication = publication.into();
    c.slot_wait = Duration::from_secs(5);
    c.status_interval = Duration::from_millis(100);
    c.backfill_chunk_rows = 200;
    c
}

/// Drops `slot` if it exists, waiting (up to 10 s) for a walsender that still holds it to let
/// go (a source just dropped, or killed, ends its stream a moment later).
pub fn drop_slot(slot: &str) {
    drop_slot_on(&mut sql(), slot);
}

/// [`drop_slot`] on the connection `c` (of the slot's database).
pub fn drop_slot_on(c: &mut Client, slot: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: i64 = c
            .query_one("SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1::text", &[&slot])
            .expect("slots")
            .get(0);
        if left == 0 {
            return;
        }
        let dropped = c.execute("SELECT pg_drop_replication_slot($1::text)", &[&slot]).is_ok();
        assert!(dropped || Instant::now() < deadline, "slot {slot} was not let go in 10 s");
        thread::sleep(Duration::from_millis(50));
    }
}

/// The rows of `SELECT columns FROM table filter` as JSON (`row_to_json`), by their `id` column
/// as text: what a sink should hold of the table.
pub fn rows<T: serde::de::DeserializeOwned>(
    c: &mut Client,
    table: &str,
    columns: &str,
    filter: &str,
) -> BTreeMap<String, T> {
    c.query(
        &format!("SELECT id::text, row_to_json(x)::text FROM (SELECT {columns} FROM {table} {filter}) x"),
        &[],
    )
    .expect("the table")
    .iter()
    .map(|r| (r.get::<_, String>(0), serde_json::from_str(&r.get::<_, String>(1)).expect("JSON")))
    .collect()
}

/// (missing, wrong, extra) rows of `held` against `expected`.
pub fn compare<V: PartialEq>(
    held: &BTreeMap<String, V>,
    expected: &BTreeMap<String, V>,
) -> (usize, usize, usize) {
    let missing = expected.keys().filter(|k| !held.contains_key(*k)).count();
    let wrong = expected.iter().filter(|(k, v)| held.get(*k).is_some_and(|h| h != *v)).count();
    let extra = held.keys().filter(|k| !expected.contains_key(*k)).count();
    (missing, wrong, extra)
}

/// Sets a server setting (ALTER SYSTEM, reload) until dropped, waiting until a new session sees it.
pub struct Setting(&'static str);

impl Setting {
    pub fn set(name: &'static str, value: &str) -> Setting {
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
        thread::sleep(Duration::from_millis(200));
    }
}
