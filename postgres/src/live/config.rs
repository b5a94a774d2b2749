//! How to reach the slot ([`LiveConfig`]), and the replication client's configuration made from
//! it.

use std::time::Duration;

use lanestream::Position;
use pgwire_replication::{Lsn, ReplicationConfig};

use super::error::LiveError;
use crate::backfill::DEFAULT_CHUNK_ROWS;

/// How to reach the slot.
#[derive(Clone, Debug)]
pub struct LiveConfig {
    /// A libpq-style connection string or URL (`postgres://user:password@host:port/db`; a
    /// `host` starting with `/` is a unix socket directory).
    pub url: String,
    /// The logical replication slot (plugin `pgoutput`).
    pub slot: String,
    /// The publication naming the tables to stream.
    pub publication: String,
    /// Create the slot (with the pgoutput plugin) if it does not exist, and before it the
    /// publication, if that does not exist, for every table that can be published (see the
    /// module docs). A pipeline refuses a slot created now over sinks that hold data
    /// ([`LiveError::SlotGap`]).
    pub create_slot: bool,
    /// How long to wait for a slot that another client holds before giving up.
    pub slot_wait: Duration,
    /// How often standby status updates go to the server (at most this long after the
    /// confirmed position moves, and at least this often).
    pub status_interval: Duration,
    /// Write a heartbeat message (see the module docs) this often; `None`: none.
    pub heartbeat: Option<Duration>,
    /// Read the publication's tables this often, to find a table that rejoined it — removed
    /// and added again, dropped and created again, renamed or moved away and back, set
    /// `UNLOGGED` and `LOGGED` again, its row filter or column list changed — whose rows the
    /// sinks then get again ([`Op::Resync`](lanestream::Op::Resync); see the module docs, *A
    /// table that rejoins*). A rewrite (`ALTER COLUMN ... TYPE`, `VACUUM FULL`) resyncs it
    /// too; DDL that stays (a column added, a `GRANT`) and a `TRUNCATE` do not. One catalog
    /// query on the second connection per interval, and a transactional logical message when
    /// the tables changed. `None`: never (a table that rejoins then keeps, in every sink, what
    /// it held when it left).
    pub publication_check: Option<Duration>,
    /// How long to try to get the stream back after it broke (a server restart), with backoff.
    pub retry_budget: Duration,
    /// Rows per chunk of a backfill ([`crate::backfill`]): the source holds at most
    /// [`CHUNKS_HELD`](crate::backfill::CHUNKS_HELD) chunks at a time for a backfill, and a
    /// resumed backfill reads at most that many again.
    pub backfill_chunk_rows: usize,
}

impl LiveConfig {
    /// A configuration with the defaults: publication `lanestream`, no slot creation, 30 s of
    /// waiting for a busy slot, status updates every second, no heartbeat, the publication's
    /// tables checked every 5 s, 60 s of retries, backfill chunks of [`DEFAULT_CHUNK_ROWS`]
    /// rows.
    pub fn new(url: impl Into<String>, slot: impl Into<String>) -> Self {
        LiveConfig {
            url: url.into(),
            slot: slot.into(),
            publication: "lanestream".into(),
            create_slot: false,
            slot_wait: Duration::from_secs(30),
            status_interval: Duration::from_secs(1),
            heartbeat: None,
            publication_check: Some(Duration::from_secs(5)),
            retry_budget: Duration::from_secs(60),
            backfill_chunk_rows: DEFAULT_CHUNK_ROWS,
        }
    }
}

/// The replication client's configuration from the connection string.
pub(super) fn replication_config(
    config: &LiveConfig,
    ack: Option<Position>,
) -> Result<ReplicationConfig, LiveError> {
    let pg: postgres::Config =
        config.url.parse().map_err(|e: postgres::Error| LiveError::Connect(e.to_string()))?;
    let user = pg.get_user().unwrap_or("postgres").to_owned();
    let password = pg.get_password().map(|p| String::from_utf8_lossy(p).into_owned()).unwrap_or_default();
    let database = pg.get_dbname().map_or_else(|| user.clone(), str::to_owned);
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    let host = match pg.get_hosts().first() {
        Some(postgres::config::Host::Tcp(h)) => h.clone(),
        Some(postgres::config::Host::Unix(dir)) => dir.display().to_string(),
        None => "localhost".to_owned(),
    };
    let rc = if host.starts_with('/') {
        ReplicationConfig::unix(
            host,
            port,
            user,
            password,
            database,
            config.slot.clone(),
            config.publication.clone(),
        )
    } else {
        ReplicationConfig::new(
            host,
            user,
            password,
            database,
            config.slot.clone(),
            config.publication.clone(),
        )
        .with_port(port)
    };
    // Start where the slot is confirmed (0/0: the server's confirmed_flush_lsn), and report that
    // as flushed until the watermark says more (never the start position the server picks).
    let mut rc = rc
        .with_start_lsn(Lsn(0))
        .with_status_interval(config.status_interval)
        .with_wakeup_interval(config.status_interval)
        .with_application_name("lanestream");
    if let Some(ack) = ack {
        rc = rc.with_ack_lsn(Lsn(ack.0));
    }
    Ok(rc)
}
