//! The helpers of the tests against a real PostgreSQL (`live.rs`, `backfill.rs`, `seams.rs`):
//! the server (a throwaway one the test binary starts, `temp.rs`, or `LANESTREAM_PG_URL`), a live
//! source's configuration, a slot dropped even while its killed holder lets go.
#![allow(dead_code)]

pub mod temp;

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

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
    Client::connect(&url(), NoTls).expect("connect")
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

pub fn drop_slot(slot: &str) {
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
