//! The helpers of the tests against a real PostgreSQL (`live.rs`, `backfill.rs`): the server
//! named by `LANESTREAM_PG_URL` (see `scripts/e2e-postgres.sh`), a live source's configuration,
//! a slot dropped even while its killed holder lets go.
#![allow(dead_code)]

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use lanestream_postgres::live::{LiveConfig, LiveSource};
use lanestream_postgres::pgoutput::PgOutputDecoder;
use lanestream_postgres::wal2json::TransactionBuilder;
use postgres::{Client, NoTls};

pub const NEEDS: &str =
    "needs a PostgreSQL with wal_level = logical (LANESTREAM_PG_URL); run by scripts/e2e-postgres.sh";

/// The tests share one server, and some change its configuration for a moment: each holds this
/// lock for its whole run.
pub fn serial() -> MutexGuard<'static, ()> {
    static SERVER: Mutex<()> = Mutex::new(());
    SERVER.lock().unwrap_or_else(PoisonError::into_inner)
}

pub fn url() -> String {
    std::env::var("LANESTREAM_PG_URL").expect("LANESTREAM_PG_URL")
}

pub fn sql() -> Client {
    Client::connect(&url(), NoTls).expect("connect")
}

pub fn config(slot: &str) -> LiveConfig {
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

pub fn decoder(source: &LiveSource) -> PgOutputDecoder {
    PgOutputDecoder::new(TransactionBuilder::new().with_key_lookup(source.key_lookup()))
}
