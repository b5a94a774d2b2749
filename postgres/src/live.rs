//! The live source: a logical replication slot of the built-in **pgoutput** plugin, streamed
//! with `START_REPLICATION` and confirmed by standby status updates only up to what every sink
//! has applied.
//!
//! [`LiveSource::connect`] checks the server on an ordinary connection (the [`postgres`] crate):
//! `wal_level = logical`, the `REPLICATION` role attribute, the publication
//! ([`LiveConfig::publication`]); with [`LiveConfig::create_slot`] it creates the publication
//! **`FOR ALL TABLES`** if it is missing (publish fewer tables by creating it yourself first),
//! then the slot with the `pgoutput` plugin (in this order: a slot decodes its changes with the
//! publications that existed when they were written). It refuses a slot of another plugin, and
//! takes the slot for this process: an advisory lock keyed by the slot name keeps a second
//! lanestream source off it, and a slot that another client streams (`active_pid`) is waited
//! for, then refused. [`LiveSource::start`] opens the stream.
//!
//! # Which client, and why
//! The stream runs on [`pgwire_replication`] (0.5), a Tokio client of the replication protocol
//! that hands over each `XLogData` payload as the server sent it (and Begin / Commit / logical
//! messages as parsed events), which the [`PgOutputDecoder`] reads into the batch builder. It
//! keeps replying to the server's keepalives while its consumer is busy, and the flush position
//! of its standby status updates is only ever what we gave it (`update_applied_lsn`, starting at
//! `ack_lsn`). `pg_walstream` 0.10 decodes pgoutput into its own event types (we would decode
//! twice, or not through our builder), and its connection needs libpq or a TLS stack built from
//! C (aws-lc). The runtime is a Tokio runtime of one worker thread owned by the source; the
//! core crate stays runtime-free.
//!
//! # How it confirms
//! [`confirm`](LiveSource::confirm) gets the stream's watermark and hands it to the client,
//! which sends it as the flush (and write, and apply) position of a standby status update within
//! [`LiveConfig::status_interval`] when it moves, and at least that often otherwise; the slot's
//! `confirmed_flush_lsn` follows. It is never more than the watermark, with one exception that
//! holds nothing back: when every transaction handed over is acked (the stream is idle up to
//! there) and the server said, in a keepalive, a Commit or a non-transactional logical message
//! outside any transaction, how far it has sent (every transaction committed before that
//! position was handed over), the source confirms that position, so an idle slot follows the
//! server's WAL (written by other databases, say) and does not retain it. A transaction still in
//! progress at that position is not skipped: PostgreSQL sends every transaction whose commit is
//! at or after the confirmed position. [`read_confirmed`](LiveSource::read_confirmed) waits for
//! the last position given to reach the server, then reads the slot, so a caller that confirms
//! the final watermark at shutdown and reads it back knows it was sent.
//!
//! PostgreSQL re-sends, after a reconnect or a restart, every transaction whose commit LSN is at
//! or after the confirmed position: the transaction *at* the watermark comes again (at least
//! once). Within one run the decoder skips the transactions already handed over
//! ([`PgOutputDecoder::resume_after`]); after a restart the sinks' checkpoints absorb it.
//!
//! # Heartbeats
//! With [`LiveConfig::heartbeat`], the source writes `pg_logical_emit_message(false,
//! 'lanestream_heartbeat', '')` every so often on its second connection: WAL of this database
//! that the stream decodes and sends, so the idle advance above moves the slot even when the
//! server writes nothing else (a database where nothing happens is the slot's only source of
//! feedback positions otherwise).
//!
//! # Reconnecting
//! When the stream ends abnormally (the server restarted or crashed, the network dropped it),
//! the source tells why on its second connection (reconnected within
//! [`LiveConfig::retry_budget`]): a slot that no longer exists is [`LiveError::SlotDropped`]; a
//! connection ended by `pg_terminate_backend` (SQLSTATE 57P01 while the server kept running: its
//! `pg_postmaster_start_time()` did not change) is [`LiveError::TerminatedByAdmin`] (lanestream
//! does not reconnect against an administrator's will); otherwise it opens the stream again from
//! the slot's confirmed position, with backoff, within the budget, or returns
//! [`LiveError::ServerGone`]. A transaction open when the stream broke is discarded (it comes
//! again whole), unless chunks of it were already returned: then
//! [`LiveError::LostInsideChunkedTransaction`] (the lanes hold its first chunks; a restart of the
//! pipeline resumes the sinks by chunk offset).
//!
//! # A slot created over sinks that are behind it
//! A slot created now decodes only transactions that commit after its *consistent point*
//! ([`SlotPositions::consistent_point`]). Sinks whose durable checkpoints are older (the slot
//! was dropped and is being re-created for them) would silently miss everything committed in
//! between: [`check_resume`](LiveSource::check_resume) refuses that with
//! [`LiveError::SlotGap`], dropping the slot it just created (so that a second try is refused
//! too, rather than carrying on over the gap). Such sinks need a backfill.
//!
//! # Keys of the catalog
//! pgoutput's Relation messages give each relation's replica identity columns, so ids need no
//! catalog look-up, except under `REPLICA IDENTITY FULL` (every column is flagged there; the
//! primary key comes from the catalog). [`key_lookup`](LiveSource::key_lookup) reads it on the
//! second connection, reconnecting it when it is lost and retrying within
//! [`SIDE_RETRY_BUDGET`]; a look-up that still fails is an error ([`LiveError::Side`]), which
//! the builder turns into an error of the change's transaction, never into "no key".
//!
//! # Backfill
//! [`backfill`](LiveSource::backfill) serves a [`Request::Backfill`] while the stream flows:
//! the tables are read in key order, in chunks, by a reader thread (on a connection of its own,
//! so the stream does not wait for the reads) and turned into documents by another, each chunk
//! between a low and a high mark written into the WAL, and its rows published (as
//! [`LiveItem::Snapshot`] from [`next_item`](LiveSource::next_item)) once the stream reached
//! its high mark, without the keys the stream changed meanwhile: see [`crate::backfill`].
//!
//! # Errors
//! Every misconfiguration a user hits first has its own [`LiveError`] with what to do: a wrong
//! password, `wal_level` not `logical`, a user without `REPLICATION`, the publication missing or
//! publishing no table, the slot missing (and creating it not asked for), a slot of another
//! plugin, a slot held by another client, a slot created after the sinks' checkpoints, a slot
//! dropped while running, the connection terminated by an administrator, a server that does not
//! come back within the retry budget. Any other server error ([`LiveError::Db`],
//! [`LiveError::Replication`]) shows the server's message and SQLSTATE.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{mpsc, Arc, Mutex};
use std::task::Poll;
use std::thread;
use std::time::{Duration, Instant};

use lanestream::{Batch, LaneItem, Position, Request, SinkName};
use pgwire_replication::{Lsn, PgWireError, ReplicationClient, ReplicationConfig, ReplicationEvent};
use postgres::error::SqlState;
use postgres::{Client, NoTls, SimpleQueryRow};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::backfill::{
    chunk_end, chunk_rows, query_chunk, BackfillProgress, Backfiller, NextRead, ReadChunk, ReadFrom,
    TablePlan, XidSnapshot, DEFAULT_CHUNK_ROWS,
};
use crate::pgoutput::{PgOutputDecoder, PgOutputError};
use crate::wal2json::{CatalogKey, KeyLookup};

/// How long the second connection (checks, catalog look-ups, heartbeats) is reconnected and its
/// statement retried after the connection was lost, before the error is returned.
pub const SIDE_RETRY_BUDGET: Duration = Duration::from_secs(10);

/// The prefix of the heartbeat messages ([`LiveConfig::heartbeat`]).
pub const HEARTBEAT_PREFIX: &str = "lanestream_heartbeat";

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
    /// publication, `FOR ALL TABLES`, if that does not exist.
    pub create_slot: bool,
    /// How long to wait for a slot that another client holds before giving up.
    pub slot_wait: Duration,
    /// How often standby status updates go to the server (at most this long after the
    /// confirmed position moves, and at least this often).
    pub status_interval: Duration,
    /// Write a heartbeat message (see the module docs) this often; `None`: none.
    pub heartbeat: Option<Duration>,
    /// How long to try to get the stream back after it broke (a server restart), with backoff.
    pub retry_budget: Duration,
    /// Rows per chunk of a backfill ([`crate::backfill`]): the source holds at most
    /// [`CHUNKS_HELD`](crate::backfill::CHUNKS_HELD) chunks at a time for a backfill, and a
    /// resumed backfill reads at most that many again.
    pub backfill_chunk_rows: usize,
}

impl LiveConfig {
    /// A configuration with the defaults: publication `lanestream`, no slot creation, 30 s of
    /// waiting for a busy slot, status updates every second, no heartbeat, 60 s of retries,
    /// backfill chunks of [`DEFAULT_CHUNK_ROWS`] rows.
    pub fn new(url: impl Into<String>, slot: impl Into<String>) -> Self {
        LiveConfig {
            url: url.into(),
            slot: slot.into(),
            publication: "lanestream".into(),
            create_slot: false,
            slot_wait: Duration::from_secs(30),
            status_interval: Duration::from_secs(1),
            heartbeat: None,
            retry_budget: Duration::from_secs(60),
            backfill_chunk_rows: DEFAULT_CHUNK_ROWS,
        }
    }
}

/// What went wrong with the live source; each message says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LiveError {
    /// The server refused the user's password (or the user).
    #[error("PostgreSQL refused the login: {0} (check the user and password in the connection string)")]
    Auth(String),
    /// The server cannot be reached or the connection string is bad.
    #[error("cannot connect to PostgreSQL: {0}")]
    Connect(String),
    /// `wal_level` is not `logical`.
    #[error("the server's wal_level is {0:?}, logical decoding needs wal_level = logical (set it in postgresql.conf and restart the server)")]
    WalLevel(String),
    /// The user may not open a replication connection.
    #[error("the user {0:?} has no REPLICATION attribute (and is no superuser): it cannot stream a slot; ALTER ROLE {0} REPLICATION, or connect as a user that has it")]
    NoReplicationPermission(String),
    /// The server does not allow pgoutput as an output plugin (`output_plugin_libraries`).
    #[error("the server does not allow pgoutput as an output plugin ({0}); add it to output_plugin_libraries in postgresql.conf and reload the server's configuration")]
    PluginNotAllowed(String),
    /// The publication does not exist.
    #[error("publication {0:?} does not exist: create it (CREATE PUBLICATION {0} FOR TABLE ... or FOR ALL TABLES), or start with --create-slot, which creates it FOR ALL TABLES")]
    NoPublication(String),
    /// The publication publishes no table.
    #[error("publication {0:?} publishes no table: add the tables to stream (ALTER PUBLICATION {0} ADD TABLE ...)")]
    PublicationEmpty(String),
    /// The slot does not exist and creating it was not asked for. A new pipeline creates it
    /// ([`LiveConfig::create_slot`], the pipeline example's `--create-slot`); for sinks that
    /// read it before, it was dropped, and a new one would start after a gap
    /// ([`LiveError::SlotGap`]): they need a backfill.
    #[error("replication slot {0:?} does not exist (a new pipeline, whose sinks start empty, creates it: --create-slot; sinks that read it before need a backfill, since a new slot starts at the current WAL position)")]
    NoSlot(String),
    /// This source created the slot, and its consistent point (the first position it decodes)
    /// is after the sinks' durable checkpoint: the transactions committed between the two are in
    /// no slot (the slot was dropped and re-created), so carrying on would skip them. The slot
    /// this source created was dropped again.
    #[error("replication slot {slot:?} was created now, at {consistent_point}, but the sinks' checkpoint is at {checkpoint}: what was committed between the two was never decoded for them (the slot was dropped) and a new slot cannot bring it back; the new slot was dropped again. Backfill the sinks (empty them and load the tables' rows, then start them on a new slot); do not re-create the slot for these sinks")]
    SlotGap {
        /// The slot.
        slot: String,
        /// The sinks' (lowest) durable checkpoint: the last commit LSN they applied.
        checkpoint: Position,
        /// The created slot's consistent point (its `confirmed_flush_lsn` at creation).
        consistent_point: Position,
    },
    /// The slot exists but is not a logical slot of the pgoutput plugin.
    #[error("replication slot {slot:?} uses the plugin {plugin:?}, not pgoutput (use another slot name)")]
    WrongPlugin {
        /// The slot.
        slot: String,
        /// Its plugin (empty for a physical slot).
        plugin: String,
    },
    /// Another client holds the slot.
    #[error("replication slot {slot:?} is held by another client ({holder}); stop it, or use another slot")]
    SlotBusy {
        /// The slot.
        slot: String,
        /// Who holds it, as the server tells.
        holder: String,
    },
    /// The slot was invalidated by the server (it retained more WAL than
    /// `max_slot_wal_keep_size`): it can no longer be read.
    #[error("replication slot {slot:?} was invalidated by the server ({message}): it kept more WAL than max_slot_wal_keep_size allows, and what it would have decoded is gone; the sinks need a backfill on a new slot (drop this one)")]
    SlotInvalidated {
        /// The slot.
        slot: String,
        /// The server's message.
        message: String,
    },
    /// The slot was dropped while this source streamed it (after its connection was
    /// terminated): what is committed from now on is in no slot.
    #[error("replication slot {0:?} was dropped while the pipeline streamed it: the sinks need a backfill (empty them, load the tables' rows, then start a new pipeline with --create-slot)")]
    SlotDropped(String),
    /// An administrator ended the replication connection (`pg_terminate_backend`) while the
    /// server kept running. The slot keeps its confirmed position.
    #[error("the replication connection of slot {slot:?} was terminated by an administrator ({message}); lanestream does not reconnect against that: start the pipeline again when it should resume (from the slot's confirmed position)")]
    TerminatedByAdmin {
        /// The slot.
        slot: String,
        /// The server's message.
        message: String,
    },
    /// The stream broke and could not be opened again within the retry budget.
    #[error("the replication stream of slot {slot:?} broke ({cause}) and could not be opened again within {budget:?} ({attempts} attempts; last: {last}); check that the server is up, then start the pipeline again (it resumes from the slot's confirmed position)")]
    ServerGone {
        /// The slot.
        slot: String,
        /// Why the stream broke.
        cause: String,
        /// The retry budget ([`LiveConfig::retry_budget`]).
        budget: Duration,
        /// How many times it was tried.
        attempts: u32,
        /// The last error.
        last: String,
    },
    /// The stream broke inside a transaction of which chunks were already returned: it comes
    /// again whole from its Begin, and publishing it again would duplicate those chunks in the
    /// lanes. Restart the pipeline: the sinks resume the transaction by chunk offset.
    #[error("the replication stream broke ({cause}) inside the transaction at {commit_lsn} of which chunks were already published; start the pipeline again (the sinks resume it by chunk offset)")]
    LostInsideChunkedTransaction {
        /// Why the stream broke.
        cause: String,
        /// The transaction's commit LSN (`unknown` when not known).
        commit_lsn: String,
    },
    /// The stream carried a message the decoder refused (no server sends it: a bug to report).
    #[error("the replication stream: {0}")]
    Decode(#[from] PgOutputError),
    /// Any other error of the replication connection, as the server or the client tells it.
    #[error("the replication stream of slot {slot:?}: {message}")]
    Replication {
        /// The slot.
        slot: String,
        /// The error (with the server's SQLSTATE when it sent one).
        message: String,
    },
    /// Any other error from the server or the connection; the message holds the server's
    /// message, SQLSTATE, detail and hint.
    #[error("PostgreSQL: {}", describe_full(.0))]
    Db(#[from] postgres::Error),
    /// The second connection (checks, catalog look-ups, heartbeats) failed, and reconnecting
    /// and retrying within its budget did not help.
    #[error("{what} failed on the live source's second connection after {attempts} attempts within {budget:?} (reconnecting each time): {last}; check that the server is up and that nothing terminates lanestream's connections")]
    Side {
        /// The statement: `catalog key look-up of schema.table`, `heartbeat`, ...
        what: String,
        /// How many times it was tried.
        attempts: u32,
        /// The retry budget.
        budget: Duration,
        /// The last error, as [`LiveError::Db`] would show it.
        last: String,
    },
    /// A backfill request this source cannot serve, ever: an index no table of the
    /// publication has (or that two share), a table without a primary key, an `after` id that
    /// does not decode into the table's key (see [`crate::backfill`]). Nothing was queued.
    #[error("backfill of index {index:?} refused: {reason}")]
    BackfillRefused {
        /// The index (empty for a request that is no backfill).
        index: String,
        /// Why.
        reason: String,
    },
    /// A chunk read for a backfill could not be turned into documents (a value its column's
    /// type cannot have, a NULL key): the backfill cannot go on.
    #[error("backfill of index {index:?}: {reason}")]
    BackfillFailed {
        /// The index.
        index: String,
        /// What went wrong.
        reason: String,
    },
    /// An internal state that should not happen (a poisoned lock, a runtime that did not
    /// start).
    #[error("{0}")]
    Internal(String),
}

/// The text of a server error (its message and detail), or of a client error.
fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = db.message().to_owned();
            if let Some(d) = db.detail() {
                s.push_str(": ");
                s.push_str(d);
            }
            s
        }
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

/// The whole text of an error: for a server error its message, SQLSTATE, detail and hint (and
/// where), for a client error its chain of causes.
fn describe_full(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = format!("{}: {} (SQLSTATE {})", db.severity(), db.message(), db.code().code());
            if let Some(d) = db.detail() {
                s.push_str("; detail: ");
                s.push_str(d);
            }
            if let Some(h) = db.hint() {
                s.push_str("; hint: ");
                s.push_str(h);
            }
            if let Some(w) = db.where_() {
                s.push_str("; where: ");
                s.push_str(w);
            }
            s
        }
        None => describe(e),
    }
}

/// Maps a server error to the misconfiguration it means, if it means one.
fn classify(e: postgres::Error, slot: &str) -> LiveError {
    let Some(code) = e.code() else { return LiveError::Db(e) };
    let message = describe(&e);
    if *code == SqlState::INVALID_PASSWORD || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION {
        LiveError::Auth(message)
    } else if *code == SqlState::INSUFFICIENT_PRIVILEGE
        && message.contains("may not be used as an output plugin")
    {
        LiveError::PluginNotAllowed(message)
    } else if *code == SqlState::OBJECT_IN_USE {
        LiveError::SlotBusy { slot: slot.to_owned(), holder: message }
    } else if *code == SqlState::UNDEFINED_OBJECT && message.contains("does not exist") {
        LiveError::NoSlot(slot.to_owned())
    } else if message.contains("wal_level") {
        LiveError::WalLevel(message)
    } else {
        LiveError::Db(e)
    }
}

/// What a replication client error means.
enum StreamFault {
    /// The stream is gone (the server restarted, the network, an administrator): find out
    /// which, and reconnect if that is right. `admin` when the server said 57P01.
    Lost { cause: String, admin: bool },
    /// An error reconnecting does not cure.
    Fatal(LiveError),
}

/// The SQLSTATE in a pgwire-replication server error's text (`... (SQLSTATE 57P01)`).
fn sqlstate(message: &str) -> Option<&str> {
    let at = message.find("SQLSTATE ")? + "SQLSTATE ".len();
    message.get(at..at + 5)
}

fn classify_stream(e: &PgWireError, config: &LiveConfig) -> StreamFault {
    let slot = config.slot.clone();
    let message = e.to_string();
    let code = sqlstate(&message).unwrap_or("");
    let fatal = |e| StreamFault::Fatal(e);
    match e {
        PgWireError::Io(_) | PgWireError::Task(_) => StreamFault::Lost { cause: message, admin: false },
        PgWireError::Auth(m) => fatal(LiveError::Auth(m.clone())),
        _ if code.starts_with("57P") || code.starts_with("08") => {
            StreamFault::Lost { admin: code == "57P01", cause: message }
        }
        _ if code == "28P01" || code == "28000" => fatal(LiveError::Auth(message)),
        _ if code == "42501" && message.contains("output plugin") => {
            fatal(LiveError::PluginNotAllowed(message))
        }
        _ if code == "42501" => fatal(LiveError::NoReplicationPermission(user_of(config))),
        _ if code == "55006" => fatal(LiveError::SlotBusy { slot, holder: message }),
        _ if code == "42704" && message.contains("publication") => {
            fatal(LiveError::NoPublication(config.publication.clone()))
        }
        _ if code == "42704" => fatal(LiveError::SlotDropped(slot)),
        _ if code == "55000" && message.contains("cannot read from logical replication slot") => {
            fatal(LiveError::SlotInvalidated { slot, message })
        }
        _ => fatal(LiveError::Replication { slot, message }),
    }
}

fn user_of(config: &LiveConfig) -> String {
    config
        .url
        .parse::<postgres::Config>()
        .ok()
        .and_then(|c| c.get_user().map(str::to_owned))
        .unwrap_or_else(|| "(unknown)".into())
}

/// Where the slot stood when [`LiveSource::connect`] took it (`pg_replication_slots`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotPositions {
    /// Whether this source created the slot ([`LiveConfig::create_slot`] and it did not exist).
    pub created: bool,
    /// For a slot created by this source: its consistent point, the LSN
    /// `pg_create_logical_replication_slot` returned (its `confirmed_flush_lsn` at creation):
    /// it decodes only transactions that commit at or after it. `None` for a slot that existed.
    pub consistent_point: Option<Position>,
    /// The slot's `restart_lsn`: the oldest WAL it keeps (what `max_slot_wal_keep_size` counts).
    pub restart_lsn: Option<Position>,
    /// The slot's `confirmed_flush_lsn`: it re-sends every transaction committing at or after it.
    pub confirmed_flush: Option<Position>,
}

/// The slot's lag and the source's counts ([`LiveSource::metrics`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveMetrics {
    /// `pg_current_wal_lsn() - confirmed_flush_lsn` of the slot, in bytes: the WAL the server
    /// keeps for it beyond what was confirmed. `None` when the slot has no confirmed position.
    pub slot_lag_bytes: Option<u64>,
    /// The server's `pg_current_wal_lsn()`.
    pub current_wal: Option<Position>,
    /// The slot's `confirmed_flush_lsn` as the server has it.
    pub confirmed_flush: Option<Position>,
    /// Transactions handed over (positioned batches returned by [`LiveSource::next`]).
    pub transactions: u64,
    /// Their changes (chunks included).
    pub changes: u64,
    /// How many times the stream was opened again after it broke.
    pub reconnects: u64,
    /// Heartbeat messages written.
    pub heartbeats: u64,
    /// Backfill snapshot batches returned (see [`crate::backfill`]).
    pub snapshot_batches: u64,
    /// Their rows.
    pub snapshot_rows: u64,
    /// Rows read for a backfill and dropped because the stream changed their key between the
    /// chunk's marks, or in a transaction the chunk's snapshot did not see (the change reached
    /// the sink instead).
    pub snapshot_rows_dropped: u64,
}

/// What [`LiveSource::next_item`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LiveItem {
    /// A committed transaction (positioned at its commit LSN) or a chunk of a large one: for
    /// every lane.
    Change(Batch),
    /// For one sink only: a backfill's snapshot batch (position `None`) or the
    /// `LaneItem::SnapshotComplete` that ends it (then ack the request, R2).
    Snapshot {
        /// The sink that asked.
        sink: SinkName,
        /// The snapshot batch or `SnapshotComplete`.
        item: LaneItem,
    },
}

/// How far the server has sent (everything committed before `upto` was handed over), with
/// `handed_over` the last commit handed over by then.
#[derive(Clone, Copy, Debug)]
struct Decoded {
    upto: Position,
    handed_over: Option<Position>,
}

/// The second connection, reconnected when lost; it holds the advisory lock that keeps a
/// second lanestream source off the slot, taken again on every reconnect (`lock`; the backfill
/// reader's connection, which only reads chunks, takes none).
struct Side {
    config: LiveConfig,
    client: Option<Client>,
    lock: bool,
}

impl Side {
    /// Runs `f` on the connection; when the connection is lost (or the server ends the session,
    /// SQLSTATE class 57P or 08), reconnects and tries again, within `budget`.
    fn run<T>(
        &mut self,
        budget: Duration,
        what: impl FnOnce() -> String,
        mut f: impl FnMut(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, LiveError> {
        let deadline = Instant::now() + budget;
        let mut attempts = 0u32;
        let mut backoff = Duration::from_millis(50);
        loop {
            attempts += 1;
            let last = match self.client.as_mut() {
                Some(client) => match f(client) {
                    Ok(v) => return Ok(v),
                    Err(e) if lost(&e) || client.is_closed() => {
                        self.client = None;
                        describe_full(&e)
                    }
                    Err(e) => return Err(classify(e, &self.config.slot)),
                },
                None => match self.reconnect() {
                    Ok(()) => {
                        attempts -= 1; // connecting is not an attempt of the statement
                        continue;
                    }
                    Err(e @ LiveError::SlotBusy { .. }) => return Err(e),
                    Err(e) => e.to_string(),
                },
            };
            if Instant::now() + backoff > deadline {
                return Err(LiveError::Side { what: what(), attempts, budget, last });
            }
            thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    fn reconnect(&mut self) -> Result<(), LiveError> {
        let mut client = connect_one(&self.config, "lanestream side")?;
        if self.lock && !try_lock(&mut client, &self.config.slot)? {
            return Err(LiveError::SlotBusy {
                slot: self.config.slot.clone(),
                holder: "another lanestream source (it took the slot while this one reconnected)".into(),
            });
        }
        self.client = Some(client);
        Ok(())
    }
}

/// Takes the session advisory lock of `slot` (one lanestream source per slot), without waiting.
fn try_lock(client: &mut Client, slot: &str) -> Result<bool, postgres::Error> {
    Ok(client
        .query_one("SELECT pg_try_advisory_lock(hashtext('lanestream slot ' || $1::text))", &[&slot])?
        .get(0))
}

/// Whether an error means the connection is gone (rather than the statement failed).
fn lost(e: &postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(code) => code.code().starts_with("57P") || code.code().starts_with("08"),
        // A client-side error without a server code: I/O on the socket.
        None => e.as_db_error().is_none(),
    }
}

fn lsn_of(text: Option<String>) -> Option<Position> {
    text.and_then(|t| Position::from_lsn(&t).ok())
}

fn connect_one(config: &LiveConfig, application_name: &str) -> Result<Client, LiveError> {
    let mut pg: postgres::Config =
        config.url.parse().map_err(|e: postgres::Error| LiveError::Connect(e.to_string()))?;
    if pg.get_application_name().is_none() {
        pg.application_name(application_name);
    }
    pg.connect(NoTls).map_err(|e| match classify(e, &config.slot) {
        LiveError::Db(e) => LiveError::Connect(describe(&e)),
        other => other,
    })
}

/// The replication client's configuration from the connection string.
fn replication_config(config: &LiveConfig, ack: Option<Position>) -> Result<ReplicationConfig, LiveError> {
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

/// A pgoutput slot streamed with `START_REPLICATION`; see the [module docs](self).
pub struct LiveSource {
    config: LiveConfig,
    runtime: tokio::runtime::Runtime,
    /// The replication stream, once started (and while it is not broken).
    stream: Option<ReplicationClient>,
    /// The second connection, for checks, catalog look-ups, heartbeats, lag.
    side: Arc<Mutex<Side>>,
    /// The position last handed to the replication client as flushed (or read at connect).
    confirmed: Option<Position>,
    /// The commit LSN of the last transaction handed over in this run.
    handed_over: Option<Position>,
    /// Chunks of the open transaction were returned.
    chunks_out: bool,
    /// The open transaction's commit LSN (from its Begin).
    open_commit: Option<Position>,
    /// How far the server has sent (see the module docs, *How it confirms*).
    decoded: Option<Decoded>,
    /// The slot as found at connect.
    positions: SlotPositions,
    /// `pg_postmaster_start_time()` when last seen: a restart changes it.
    postmaster_start: String,
    last_heartbeat: Instant,
    metrics: LiveMetrics,
    /// The xid of the open transaction (from its Begin), for the backfill's reconciliation.
    open_xid: Option<u32>,
    /// Backfill requests, the chunk waiting for its high mark.
    backfiller: Backfiller,
    /// The thread that reads backfill chunks (started with the first request).
    reader: Option<ChunkReader>,
    /// Items decoded and not yet returned, in stream order.
    out: VecDeque<LiveItem>,
}

impl std::fmt::Debug for LiveSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveSource")
            .field("slot", &self.config.slot)
            .field("publication", &self.config.publication)
            .field("confirmed", &self.confirmed)
            .field("handed_over", &self.handed_over)
            .field("streaming", &self.stream.is_some())
            .finish_non_exhaustive()
    }
}

impl LiveSource {
    /// Connects, checks the server and the publication, and takes the slot (creating the
    /// publication and the slot if `config.create_slot`). Does not start streaming: see
    /// [`start`](Self::start).
    ///
    /// # Errors
    /// A [`LiveError`] naming the misconfiguration.
    pub fn connect(config: LiveConfig) -> Result<LiveSource, LiveError> {
        let slot = config.slot.clone();
        let publication = config.publication.clone();
        let mut client = connect_one(&config, "lanestream side")?;
        let wal_level: String = client.query_one("SHOW wal_level", &[])?.get(0);
        if wal_level != "logical" {
            return Err(LiveError::WalLevel(wal_level));
        }
        let row = client.query_one(
            "SELECT current_user::text, rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )?;
        if !row.get::<_, bool>(1) {
            return Err(LiveError::NoReplicationPermission(row.get(0)));
        }
        // One lanestream source per slot: a session advisory lock, held as long as the second
        // connection lives, released by the server when this process dies.
        let deadline = Instant::now() + config.slot_wait;
        while !try_lock(&mut client, &slot)? {
            if Instant::now() >= deadline {
                let holder = client
                    .query_opt(
                        "SELECT 'another lanestream source, PID ' || l.pid || coalesce(', ' || a.client_addr::text, '') \
                         FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
                         WHERE l.locktype = 'advisory' AND l.granted AND l.objid::bigint = \
                         (hashtext('lanestream slot ' || $1::text)::bigint & 4294967295) LIMIT 1",
                        &[&slot],
                    )?
                    .map_or_else(|| "another lanestream source".to_owned(), |r| r.get(0));
                return Err(LiveError::SlotBusy { slot, holder });
            }
            thread::sleep(Duration::from_millis(200));
        }
        let slot_row = client.query_opt(
            "SELECT coalesce(plugin::text, '') FROM pg_replication_slots WHERE slot_name = $1::text",
            &[&slot],
        )?;
        if let Some(row) = &slot_row {
            let plugin: String = row.get(0);
            if plugin != "pgoutput" {
                return Err(LiveError::WrongPlugin { slot, plugin });
            }
        } else if !config.create_slot {
            return Err(LiveError::NoSlot(slot));
        }
        // The publication before the slot: changes are decoded with the publications that
        // existed when they were written.
        let publication_row = client.query_opt(
            "SELECT puballtables, (SELECT count(*) FROM pg_publication_tables t WHERE t.pubname = p.pubname) \
             FROM pg_publication p WHERE pubname = $1::text",
            &[&publication],
        )?;
        match publication_row {
            None if config.create_slot && slot_row.is_none() => {
                let quoted = format!("\"{}\"", publication.replace('"', "\"\""));
                client.batch_execute(&format!("CREATE PUBLICATION {quoted} FOR ALL TABLES"))?;
            }
            None => return Err(LiveError::NoPublication(publication)),
            Some(row) if !row.get::<_, bool>(0) && row.get::<_, i64>(1) == 0 => {
                return Err(LiveError::PublicationEmpty(publication))
            }
            Some(_) => {}
        }
        let mut positions = SlotPositions::default();
        if slot_row.is_none() {
            let created = client
                .query_one(
                    "SELECT lsn::text FROM pg_create_logical_replication_slot($1::text, 'pgoutput')",
                    &[&slot],
                )
                .map_err(|e| classify(e, &slot))?;
            positions.created = true;
            positions.consistent_point = lsn_of(created.get(0));
        }
        let postmaster_start: String =
            client.query_one("SELECT pg_postmaster_start_time()::text", &[])?.get(0);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("lanestream-replication")
            .enable_all()
            .build()
            .map_err(|e| LiveError::Internal(format!("the replication client's runtime: {e}")))?;
        let side = Side { client: Some(client), config: config.clone(), lock: true };
        let backfiller = Backfiller::new(instance_id(), config.backfill_chunk_rows);
        let mut source = LiveSource {
            config,
            runtime,
            stream: None,
            side: Arc::new(Mutex::new(side)),
            confirmed: None,
            handed_over: None,
            chunks_out: false,
            open_commit: None,
            decoded: None,
            positions,
            postmaster_start,
            last_heartbeat: Instant::now(),
            metrics: LiveMetrics::default(),
            open_xid: None,
            backfiller,
            reader: None,
            out: VecDeque::new(),
        };
        source.wait_until_free(deadline)?;
        Ok(source)
    }

    fn side(&self) -> Result<std::sync::MutexGuard<'_, Side>, LiveError> {
        self.side
            .lock()
            .map_err(|_| LiveError::Internal("the live source's second connection: lock poisoned".into()))
    }

    /// Waits until no other client streams the slot (a killed predecessor's walsender may still
    /// hold it for a moment), or refuses at `deadline`; reads the slot's positions.
    fn wait_until_free(&mut self, deadline: Instant) -> Result<(), LiveError> {
        loop {
            let slot = self.config.slot.clone();
            let row = self.side()?.run(
                SIDE_RETRY_BUDGET,
                || "reading the slot".to_owned(),
                |c| {
                    c.query_opt(
                        "SELECT active_pid, confirmed_flush_lsn::text, \
                         (SELECT coalesce(application_name, '') FROM pg_stat_activity WHERE pid = active_pid), \
                         restart_lsn::text \
                         FROM pg_replication_slots WHERE slot_name = $1::text",
                        &[&slot],
                    )
                },
            )?;
            let Some(row) = row else { return Err(LiveError::NoSlot(slot)) };
            let pid: Option<i32> = row.get(0);
            self.confirmed = lsn_of(row.get(1));
            self.positions.confirmed_flush = self.confirmed;
            self.positions.restart_lsn = lsn_of(row.get(3));
            let Some(pid) = pid else { return Ok(()) };
            if Instant::now() >= deadline {
                let app: Option<String> = row.get(2);
                let holder = format!("PID {pid}, application_name {:?}", app.unwrap_or_default());
                return Err(LiveError::SlotBusy { slot, holder });
            }
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// The slot's name.
    pub fn slot(&self) -> &str {
        &self.config.slot
    }

    /// The position last handed to the server as flushed (the slot's `confirmed_flush_lsn` once
    /// the status update carrying it arrives), or read at connect.
    pub fn confirmed(&self) -> Option<Position> {
        self.confirmed
    }

    /// How far the server has sent: every transaction committed before it was handed over
    /// (from its last keepalive, Commit or heartbeat outside a transaction); `None` before.
    pub fn decoded(&self) -> Option<Position> {
        self.decoded.map(|d| d.upto)
    }

    /// Where the slot stood when this source took it: whether this source created it, its
    /// consistent point then, its `restart_lsn` and `confirmed_flush_lsn`.
    pub fn slot_positions(&self) -> SlotPositions {
        self.positions
    }

    /// Checks that sinks whose durable checkpoint is `checkpoint` (the lowest last applied
    /// commit LSN over the sinks; `None` when no sink has one, a new pipeline) can resume on this
    /// slot without a gap: when this source created the slot and its consistent point is after
    /// `checkpoint`, the transactions committed in between were never decoded for the sinks.
    ///
    /// # Errors
    /// [`LiveError::SlotGap`] naming both positions, after dropping the slot this source created
    /// (so a second try is refused too); [`LiveError`] from the server if dropping it fails.
    pub fn check_resume(&mut self, checkpoint: Option<Position>) -> Result<(), LiveError> {
        let (Some(checkpoint), Some(consistent_point)) = (checkpoint, self.positions.consistent_point) else {
            return Ok(());
        };
        if !self.positions.created || checkpoint >= consistent_point {
            return Ok(());
        }
        let slot = self.config.slot.clone();
        self.side()?.run(
            SIDE_RETRY_BUDGET,
            || "dropping the slot created over a gap".into(),
            |c| c.execute("SELECT pg_drop_replication_slot($1::text)", &[&slot]),
        )?;
        Err(LiveError::SlotGap { slot, checkpoint, consistent_point })
    }

    /// A key lookup for [`TransactionBuilder::with_key_lookup`](crate::wal2json::TransactionBuilder::with_key_lookup)
    /// that reads a table's replica identity from the catalog (on the second connection):
    /// [`CatalogKey::IdentityIndex`] with the columns of its identity index under
    /// `REPLICA IDENTITY USING INDEX`, else [`CatalogKey::PrimaryKey`] with those of its primary
    /// key, in column order; `None` for a table without either. With pgoutput the builder asks
    /// it only for tables under `REPLICA IDENTITY FULL` (see the module docs).
    ///
    /// # Errors
    /// The look-up fails with [`LiveError::Side`] when the second connection is lost and cannot
    /// be restored within [`SIDE_RETRY_BUDGET`], or with another [`LiveError`] from the server:
    /// never `Ok(None)` for a look-up that did not happen.
    pub fn key_lookup(&self) -> KeyLookup {
        // Weak: the look-up does not keep the second connection (and the slot's advisory lock)
        // alive after the source is dropped.
        let side = Arc::downgrade(&self.side);
        Box::new(move |schema, table| {
            let side = side.upgrade().ok_or("the live source was dropped: its catalog look-up is gone")?;
            let mut side = side.lock().map_err(|_| "the live source's second connection: lock poisoned")?;
            let row = side.run(
                SIDE_RETRY_BUDGET,
                || format!("the catalog key look-up of {schema}.{table}"),
                |client| {
                    client.query_opt(
                        "SELECT array_agg(a.attname::text ORDER BY a.attnum), bool_or(c.relreplident = 'i') \
                         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                         JOIN pg_index i ON i.indrelid = c.oid \
                         JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY (i.indkey) \
                         WHERE n.nspname = $1::text AND c.relname = $2::text \
                         AND CASE WHEN c.relreplident = 'i' THEN i.indisreplident ELSE i.indisprimary END",
                        &[&schema, &table],
                    )
                },
            )?;
            let Some(row) = row else { return Ok(None) };
            let columns = row.get::<_, Option<Vec<String>>>(0).filter(|c| !c.is_empty());
            let index: Option<bool> = row.get(1);
            Ok(columns.map(|c| {
                if index == Some(true) {
                    CatalogKey::IdentityIndex(c)
                } else {
                    CatalogKey::PrimaryKey(c)
                }
            }))
        })
    }

    /// Opens the replication stream (`START_REPLICATION SLOT ... LOGICAL 0/0 (proto_version
    /// '1', publication_names '...', messages 'true')`) from the slot's confirmed position.
    ///
    /// # Errors
    /// A [`LiveError`]: the slot held by another client, the permission missing, the
    /// publication missing, or the server's error.
    pub fn start(&mut self) -> Result<(), LiveError> {
        let config = replication_config(&self.config, self.confirmed)?;
        let started = self.runtime.block_on(async {
            let mut client = ReplicationClient::connect(config).await?;
            match tokio::time::timeout(Duration::from_secs(30), client.wait_started()).await {
                Ok(Ok(())) => Ok(client),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(PgWireError::Task("START_REPLICATION not accepted within 30 s".into())),
            }
        });
        match started {
            Ok(client) => {
                self.stream = Some(client);
                Ok(())
            }
            Err(e) => Err(match classify_stream(&e, &self.config) {
                StreamFault::Fatal(e) => e,
                StreamFault::Lost { cause, .. } => LiveError::Connect(cause),
            }),
        }
    }

    /// Receives from the stream for at most `timeout` and returns the first batch `decoder`
    /// builds: a committed transaction (positioned at its commit LSN) or a chunk of a large one.
    /// `Ok(None)` when none came within `timeout`. Writes the heartbeat when it is due, and opens
    /// the stream again when it broke (see the module docs, *Reconnecting*). Call
    /// [`start`](Self::start) first; give it the same decoder every time.
    ///
    /// A source serving a backfill ([`backfill`](Self::backfill)) is read with
    /// [`next_item`](Self::next_item), which returns its snapshot items too.
    ///
    /// # Errors
    /// [`LiveError::Decode`] for a message the decoder refused, the errors of *Reconnecting*, a
    /// failed heartbeat; [`LiveError::Internal`] when the next item is a backfill's (it stays
    /// first: read it with [`next_item`](Self::next_item)).
    pub fn next(
        &mut self,
        decoder: &mut PgOutputDecoder,
        timeout: Duration,
    ) -> Result<Option<Batch>, LiveError> {
        match self.next_item(decoder, timeout)? {
            None => Ok(None),
            Some(LiveItem::Change(batch)) => Ok(Some(batch)),
            Some(item) => {
                self.out.push_front(item);
                Err(LiveError::Internal(
                    "a backfill is being served: read the source with next_item, which returns its snapshot items".into(),
                ))
            }
        }
    }

    /// As [`next`](Self::next), with the items of the backfills being served
    /// ([`backfill`](Self::backfill)) interleaved in stream order: a snapshot batch comes when
    /// the stream reaches its chunk's high mark, `SnapshotComplete` after a request's last one.
    /// While a backfill is served, its reader thread reads the next chunk when none waits for
    /// its high mark; a chunk read is taken in here (waiting for it only when the stream reached
    /// its high mark first).
    ///
    /// # Errors
    /// As [`next`](Self::next); [`LiveError::BackfillFailed`] for a chunk whose rows cannot be
    /// turned into documents; [`LiveError::Side`] when reading a chunk fails within
    /// [`SIDE_RETRY_BUDGET`] (the reader reconnects in between); [`LiveError::Internal`] when
    /// the reader thread could not start. After `BackfillFailed` or `Side` the request being
    /// served is given up (it gets no `SnapshotComplete`: ask again, with `after` set to the last
    /// row applied), the next one is served, and the stream goes on.
    pub fn next_item(
        &mut self,
        decoder: &mut PgOutputDecoder,
        timeout: Duration,
    ) -> Result<Option<LiveItem>, LiveError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(item) = self.out.pop_front() {
                return Ok(Some(item));
            }
            self.heartbeat_if_due()?;
            if self.stream.is_none() {
                return Err(LiveError::Internal("LiveSource::next before start".into()));
            }
            if self.backfill_reads()? {
                continue;
            }
            let Some(stream) = self.stream.as_mut() else {
                return Err(LiveError::Internal("LiveSource::next before start".into()));
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            // The stream's next event, or the reader's next chunk, whichever comes first (a
            // chunk read while the stream is quiet is installed at once, not at the next event).
            let mut done = self.reader.as_mut().map(|r| &mut r.done);
            let received = self.runtime.block_on(async {
                let mut recv = std::pin::pin!(stream.recv());
                let next = std::future::poll_fn(|cx| {
                    if let Some(done) = done.as_mut() {
                        if let Poll::Ready(read) = done.poll_recv(cx) {
                            return Poll::Ready(Woken::Read(read));
                        }
                    }
                    recv.as_mut().poll(cx).map(Woken::Stream)
                });
                tokio::time::timeout(left, next).await
            });
            match received {
                Err(_elapsed) => return Ok(None),
                Ok(Woken::Read(Some(read))) => {
                    self.install(read)?;
                    self.next_read()?;
                }
                Ok(Woken::Read(None)) => return Err(ChunkReader::gone()),
                Ok(Woken::Stream(Ok(Some(event)))) => self.on_event(decoder, event)?,
                Ok(Woken::Stream(Ok(None))) => self.recover(
                    decoder,
                    StreamFault::Lost {
                        cause: "the server ended the replication stream".into(),
                        admin: false,
                    },
                )?,
                Ok(Woken::Stream(Err(e))) => {
                    let fault = classify_stream(&e, &self.config);
                    self.recover(decoder, fault)?;
                }
            }
        }
    }

    /// Starts serving a backfill request (see [`crate::backfill`]): its indexes' tables are
    /// found in the publication and checked now; their chunks then come out of
    /// [`next_item`](Self::next_item) as [`LiveItem::Snapshot`], interleaved with the changes,
    /// then the request's `SnapshotComplete`. Requests are served one after the other.
    ///
    /// # Errors
    /// [`LiveError::BackfillRefused`] for a request that can never be served (the request is not
    /// queued: ack it unanswered); [`LiveError::Side`] / [`LiveError::Db`] from the catalog
    /// look-up.
    pub fn backfill(&mut self, request: Request) -> Result<(), LiveError> {
        let Request::Backfill { sink, indexes, after } = request else {
            return Err(LiveError::BackfillRefused {
                index: String::new(),
                reason: format!("{request:?} is not a backfill request"),
            });
        };
        let publication = self.config.publication.clone();
        let mut plans = Vec::with_capacity(indexes.len());
        for index in &indexes {
            let plan = self.side()?.run(
                SIDE_RETRY_BUDGET,
                || format!("finding the table of index {index}"),
                |c| TablePlan::resolve(c, &publication, index),
            )?;
            let plan = plan
                .map_err(|reason| LiveError::BackfillRefused { index: index.as_str().to_owned(), reason })?;
            plans.push(plan);
        }
        let cursor = match (after, plans.first()) {
            (Some(id), Some(first)) => Some(first.cursor_of_id(&id).map_err(|reason| {
                LiveError::BackfillRefused { index: first.index.as_str().to_owned(), reason }
            })?),
            _ => None,
        };
        self.backfiller.push(sink, indexes, plans, cursor);
        self.drain_backfill();
        Ok(())
    }

    /// Per table of the backfills asked so far: rows read and the table's row estimate.
    pub fn backfill_progress(&self) -> Vec<BackfillProgress> {
        self.backfiller.progress().to_vec()
    }

    /// Installs the chunk the reader thread read, if it is there, and hands the reader the next
    /// chunk when one is due. Whether a chunk was installed.
    fn backfill_reads(&mut self) -> Result<bool, LiveError> {
        let mut installed = false;
        if let Some(reader) = self.reader.as_mut() {
            let read = match reader.done.try_recv() {
                Ok(read) => Some(read),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => return Err(ChunkReader::gone()),
            };
            if let Some(read) = read {
                self.install(read)?;
                installed = true;
            }
        }
        self.next_read()?;
        Ok(installed)
    }

    /// A chunk the reader thread read (or its failure) is taken in: it waits for its high mark,
    /// or is published at once when the stream passed it.
    /// A failed read ends the request being served (its chunks read ahead are dropped with the
    /// reader, which is started again for the next request): the error is returned once, and
    /// the stream goes on.
    fn install(&mut self, read: Result<ReadChunk, LiveError>) -> Result<(), LiveError> {
        match read {
            Ok(read) => {
                self.backfiller.install(read);
                self.drain_backfill();
                Ok(())
            }
            Err(e) => {
                self.reader = None;
                self.backfiller.abandon();
                self.drain_backfill();
                Err(e)
            }
        }
    }

    /// Hands the reader the next chunk when one is due (starting the reader with the first).
    fn next_read(&mut self) -> Result<(), LiveError> {
        if let Some(next) = self.backfiller.next_read() {
            if self.reader.is_none() {
                let source = self.backfiller.source_id().to_owned();
                self.reader =
                    Some(ChunkReader::start(self.config.clone(), source, self.backfiller.chunk_rows())?);
            }
            if let Some(reader) = &self.reader {
                reader.jobs.send(next).map_err(|_| ChunkReader::gone())?;
            }
        }
        Ok(())
    }

    /// Moves the backfill's ready items to the output, in order.
    fn drain_backfill(&mut self) {
        self.metrics.snapshot_batches = self.backfiller.batches;
        self.metrics.snapshot_rows = self.backfiller.rows;
        self.metrics.snapshot_rows_dropped = self.backfiller.dropped;
        while let Some((sink, item)) = self.backfiller.out.pop_front() {
            self.out.push_back(LiveItem::Snapshot { sink, item });
        }
    }

    /// A batch decoded: the backfill sees it (its keys leave a waiting chunk), then it is queued.
    fn hand_over(&mut self, batch: Batch) {
        self.backfiller.observe(self.open_xid, &batch);
        self.out.push_back(LiveItem::Change(batch));
    }

    /// The marks the decoder read reach the backfill, whose ready items are queued. A high mark
    /// of the chunk the reader is still reading (the stream got there first) does not hold the
    /// stream up: the chunk is published when it is installed (see
    /// [`Backfiller::install`](crate::backfill)).
    fn take_marks(&mut self, decoder: &mut PgOutputDecoder) {
        let mut any = false;
        while let Some(mark) = decoder.take_mark() {
            self.backfiller.on_mark(&mark);
            any = true;
        }
        if any {
            self.drain_backfill();
        }
    }

    fn on_event(&mut self, decoder: &mut PgOutputDecoder, event: ReplicationEvent) -> Result<(), LiveError> {
        let idle = |source: &mut Self, decoder: &PgOutputDecoder, upto: u64| {
            if !decoder.in_transaction() && upto != 0 {
                let upto = Position(upto);
                if source.decoded.is_none_or(|d| d.upto < upto) {
                    source.decoded = Some(Decoded { upto, handed_over: source.handed_over });
                }
            }
        };
        match event {
            ReplicationEvent::KeepAlive { wal_end, .. } => idle(self, decoder, wal_end.0),
            ReplicationEvent::Message { transactional, lsn, prefix, content } => {
                decoder.message(lsn.0, &prefix, &content);
                self.take_marks(decoder);
                if !transactional {
                    idle(self, decoder, lsn.0);
                }
            }
            ReplicationEvent::StoppedAt { .. } => {}
            ReplicationEvent::Begin { final_lsn, xid, commit_time_micros } => {
                decoder.begin(final_lsn.0, xid, commit_time_micros)?;
                self.open_commit = Some(Position(final_lsn.0));
                self.open_xid = Some(xid);
            }
            ReplicationEvent::XLogData { data, .. } => {
                let chunk = decoder.decode(&data)?;
                self.take_marks(decoder);
                if let Some(chunk) = chunk {
                    self.chunks_out = true;
                    self.metrics.changes += chunk.changes;
                    self.hand_over(chunk);
                }
            }
            ReplicationEvent::Commit { lsn, end_lsn, .. } => {
                self.open_commit = None;
                let batch = decoder.commit(lsn.0)?;
                if let Some(b) = batch {
                    self.chunks_out = false;
                    self.handed_over = b.position;
                    self.metrics.transactions += 1;
                    self.metrics.changes += b.changes;
                    self.hand_over(b);
                }
                self.open_xid = None;
                idle(self, decoder, end_lsn.0);
            }
        }
        Ok(())
    }

    /// The stream broke: find out why, and open it again when that is right.
    fn recover(&mut self, decoder: &mut PgOutputDecoder, fault: StreamFault) -> Result<(), LiveError> {
        if let Some(mut stream) = self.stream.take() {
            stream.abort();
        }
        let (cause, admin) = match fault {
            StreamFault::Fatal(e) => return Err(e),
            StreamFault::Lost { cause, admin } => (cause, admin),
        };
        if decoder.in_transaction() {
            if self.chunks_out {
                let commit_lsn = self.open_commit.map_or_else(|| "unknown".into(), |p| p.to_string());
                return Err(LiveError::LostInsideChunkedTransaction { cause, commit_lsn });
            }
            // Nothing of it was published: it comes again whole.
            let _ = decoder.finish();
        }
        decoder.resume_after(self.handed_over);
        let slot = self.config.slot.clone();
        let budget = self.config.retry_budget;
        let deadline = Instant::now() + budget;
        let mut attempts = 0u32;
        let mut backoff = Duration::from_millis(100);
        loop {
            attempts += 1;
            let last = match self.probe(budget, &slot) {
                Err(e @ (LiveError::SlotDropped(_) | LiveError::SlotBusy { .. })) => return Err(e),
                Err(e) => e.to_string(),
                Ok(restarted) => {
                    if admin && !restarted {
                        return Err(LiveError::TerminatedByAdmin { slot, message: cause });
                    }
                    match self.start() {
                        Ok(()) => {
                            self.metrics.reconnects += 1;
                            return Ok(());
                        }
                        // Our previous walsender may hold the slot for a moment.
                        Err(LiveError::SlotBusy { holder, .. }) => holder,
                        Err(e @ (LiveError::Connect(_) | LiveError::Replication { .. })) => e.to_string(),
                        Err(e) => return Err(e),
                    }
                }
            };
            if Instant::now() + backoff > deadline {
                return Err(LiveError::ServerGone { slot, cause, budget, attempts, last });
            }
            thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    /// After the stream broke: whether the server restarted since last seen (its
    /// `pg_postmaster_start_time()` changed), reconnecting the second connection within `budget`.
    ///
    /// # Errors
    /// [`LiveError::SlotDropped`] when the slot is gone; [`LiveError::Side`] when the server
    /// does not answer within `budget`.
    fn probe(&mut self, budget: Duration, slot: &str) -> Result<bool, LiveError> {
        let row = self.side()?.run(
            budget,
            || "finding out why the replication stream broke".into(),
            |c| {
                c.query_one(
                    "SELECT pg_postmaster_start_time()::text, \
                     EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1::text)",
                    &[&slot],
                )
            },
        )?;
        if !row.get::<_, bool>(1) {
            return Err(LiveError::SlotDropped(slot.to_owned()));
        }
        let start: String = row.get(0);
        let restarted = start != self.postmaster_start;
        self.postmaster_start = start;
        Ok(restarted)
    }

    fn heartbeat_if_due(&mut self) -> Result<(), LiveError> {
        let Some(every) = self.config.heartbeat else { return Ok(()) };
        if self.last_heartbeat.elapsed() < every {
            return Ok(());
        }
        self.last_heartbeat = Instant::now();
        self.heartbeat()
    }

    /// Writes one heartbeat message now (see the module docs, *Heartbeats*).
    ///
    /// # Errors
    /// [`LiveError`] from the second connection.
    pub fn heartbeat(&mut self) -> Result<(), LiveError> {
        self.side()?.run(
            SIDE_RETRY_BUDGET,
            || "the heartbeat".into(),
            |c| c.execute("SELECT pg_logical_emit_message(false, $1::text, ''::text)", &[&HEARTBEAT_PREFIX]),
        )?;
        self.metrics.heartbeats += 1;
        Ok(())
    }

    /// Confirms the slot up to `upto` (the stream's watermark: never more) when that is past the
    /// confirmed position: hands it to the replication client, whose next standby status update
    /// (within [`LiveConfig::status_interval`]) carries it as the flush position. Returns the
    /// position confirmed. Cheap: call it as often as the watermark may have moved.
    ///
    /// When `upto` covers the last transaction handed over (every lane acked everything: the
    /// stream is idle) and the server told how far it has sent, the slot is confirmed up to
    /// there instead (see the module docs, *How it confirms*).
    ///
    /// # Errors
    /// None today (the signature leaves room for a client that can fail here).
    pub fn confirm(&mut self, upto: Option<Position>) -> Result<Option<Position>, LiveError> {
        let idle = self
            .decoded
            .filter(|d| d.handed_over.is_none_or(|h| upto.is_some_and(|u| u >= h)))
            .map(|d| d.upto);
        let Some(target) = upto.max(idle) else { return Ok(self.confirmed) };
        if self.confirmed.is_some_and(|c| c >= target) {
            return Ok(self.confirmed);
        }
        self.confirmed = Some(target);
        if let Some(stream) = &self.stream {
            stream.update_applied_lsn(Lsn(target.0));
        }
        Ok(self.confirmed)
    }

    /// The slot's `confirmed_flush_lsn` read from the server, once the status update carrying the
    /// last confirmed position has reached it (waiting up to three status intervals plus two
    /// seconds).
    ///
    /// # Errors
    /// [`LiveError`] from the server; [`LiveError::NoSlot`] when the slot is gone.
    pub fn read_confirmed(&mut self) -> Result<Option<Position>, LiveError> {
        let deadline = Instant::now() + self.config.status_interval * 3 + Duration::from_secs(2);
        loop {
            let read = self.read_slot_confirmed()?;
            if self.stream.is_none() || read >= self.confirmed || Instant::now() >= deadline {
                return Ok(read);
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    fn read_slot_confirmed(&mut self) -> Result<Option<Position>, LiveError> {
        let slot = self.config.slot.clone();
        let row = self.side()?.run(
            SIDE_RETRY_BUDGET,
            || "reading the slot's confirmed_flush_lsn".to_owned(),
            |c| {
                c.query_opt(
                    "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1::text",
                    &[&slot],
                )
            },
        )?;
        match row {
            Some(row) => Ok(lsn_of(row.get(0))),
            None => Err(LiveError::NoSlot(slot)),
        }
    }

    /// The slot's byte lag (`pg_current_wal_lsn() - confirmed_flush_lsn`) and this source's
    /// counts.
    ///
    /// # Errors
    /// [`LiveError`] from the second connection.
    pub fn metrics(&mut self) -> Result<LiveMetrics, LiveError> {
        let slot = self.config.slot.clone();
        let row = self.side()?.run(
            SIDE_RETRY_BUDGET,
            || "reading the slot's lag".to_owned(),
            |c| {
                c.query_opt(
                    "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::int8, pg_current_wal_lsn()::text, \
                     confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1::text",
                    &[&slot],
                )
            },
        )?;
        let mut m = self.metrics;
        if let Some(row) = row {
            m.slot_lag_bytes = row.get::<_, Option<i64>>(0).map(|l| l.max(0).unsigned_abs());
            m.current_wal = lsn_of(row.get(1));
            m.confirmed_flush = lsn_of(row.get(2));
        }
        Ok(m)
    }

    /// Ends the stream (a `CopyDone` to the server); the slot keeps the last position the
    /// server received. Dropping the source does the same.
    pub fn stop(&mut self) {
        if let Some(mut stream) = self.stream.take() {
            let _ = self
                .runtime
                .block_on(async { tokio::time::timeout(Duration::from_secs(2), stream.shutdown()).await });
        }
    }
}

/// The backfill's reader: two threads. The first, on a connection of its own (reconnected
/// within [`SIDE_RETRY_BUDGET`] when lost), reads the chunks it is handed one after the other
/// (marks and rows, one round trip each: [`query_chunk`]), keeping where the table's last chunk ended for the
/// next ([`ReadFrom::Continue`]); the second turns each chunk's text into snapshot envelopes
/// ([`chunk_rows`]) while the first reads the next, and hands them over in order. So the stream
/// goes on while a chunk is read, and neither the server nor the conversion waits for the
/// other. Both end when the source is dropped (after the chunk in hand).
struct ChunkReader {
    jobs: mpsc::Sender<NextRead>,
    /// A Tokio channel, so that [`LiveSource::next_item`] waits for the stream and for it at
    /// once (sent to from a plain thread: an unbounded send never blocks; what it holds is
    /// bounded by the chunks handed out, [`crate::backfill`]).
    done: UnboundedReceiver<Result<ReadChunk, LiveError>>,
}

/// What woke [`LiveSource::next_item`] up: the stream or the backfill's reader.
enum Woken<S> {
    Stream(S),
    Read(Option<Result<ReadChunk, LiveError>>),
}

/// A chunk's rows on their way from the reading thread to the converting one.
struct Copied {
    next: NextRead,
    /// `None`: after the table's end (no query, no rows).
    snapshot: Option<XidSnapshot>,
    rows: Vec<SimpleQueryRow>,
}

impl ChunkReader {
    fn start(config: LiveConfig, source: String, rows: usize) -> Result<ChunkReader, LiveError> {
        let (jobs, jobs_in) = mpsc::channel::<NextRead>();
        let (copied_out, copied_in) = mpsc::channel::<Result<Copied, LiveError>>();
        let (done_out, done) = unbounded_channel();
        thread::Builder::new()
            .name("lanestream-backfill".into())
            .spawn(move || {
                let mut side = Side { config, client: None, lock: false };
                // The key values the last chunk read ended at, and whether it was its table's last.
                let (mut last, mut ended): (Option<Vec<String>>, bool) = (None, false);
                for next in jobs_in {
                    let cursor = match &next.from {
                        ReadFrom::First(cursor) => {
                            ended = false;
                            cursor.clone()
                        }
                        ReadFrom::Continue if ended => {
                            let copied = Copied { next, snapshot: None, rows: Vec::new() };
                            if copied_out.send(Ok(copied)).is_err() {
                                break;
                            }
                            continue;
                        }
                        ReadFrom::Continue => last.clone(),
                    };
                    let index = next.plan.index.as_str().to_owned();
                    let copied = side
                        .run(
                            SIDE_RETRY_BUDGET,
                            || format!("reading a backfill chunk of {}", next.plan.table),
                            |c| query_chunk(c, &next.plan, &source, next.chunk, cursor.as_deref(), rows),
                        )
                        .and_then(|read| read.map_err(|reason| LiveError::BackfillFailed { index, reason }))
                        .map(|(snapshot, read)| {
                            ended = read.len() < rows;
                            if let Some(end) = chunk_end(&next.plan, &read) {
                                last = Some(end);
                            }
                            Copied { snapshot: Some(snapshot), rows: read, next }
                        });
                    let stop = copied.is_err();
                    if copied_out.send(copied).is_err() || stop {
                        break;
                    }
                }
            })
            .map_err(|e| LiveError::Internal(format!("the backfill reader thread: {e}")))?;
        thread::Builder::new()
            .name("lanestream-backfill-rows".into())
            .spawn(move || {
                for copied in copied_in {
                    let read = copied.and_then(|Copied { next, snapshot, rows }| {
                        let envelopes = chunk_rows(&next.plan, &rows).map_err(|reason| {
                            LiveError::BackfillFailed { index: next.plan.index.as_str().to_owned(), reason }
                        })?;
                        Ok(ReadChunk { chunk: next.chunk, snapshot, rows: envelopes.len(), envelopes })
                    });
                    if done_out.send(read).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| LiveError::Internal(format!("the backfill conversion thread: {e}")))?;
        Ok(ChunkReader { jobs, done })
    }

    fn gone() -> LiveError {
        LiveError::Internal("the backfill reader thread ended".into())
    }
}

/// A random id for this source's backfill marks (so that marks of another source on the same
/// database, or of an earlier run, are never taken for this one's).
fn instance_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

impl Drop for LiveSource {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_give_their_sqlstate() {
        assert_eq!(sqlstate("server error: FATAL: terminating connection (SQLSTATE 57P01)"), Some("57P01"));
        assert_eq!(sqlstate("no code"), None);
    }

    #[test]
    fn stream_errors_are_told_apart_by_sqlstate() {
        let config = LiveConfig::new("postgres://u@localhost/db", "s");
        let server = |m: &str| PgWireError::Server(m.to_owned());
        let fault = |e: PgWireError| classify_stream(&e, &config);
        assert!(matches!(
            fault(server("FATAL: terminating connection due to administrator command (SQLSTATE 57P01)")),
            StreamFault::Lost { admin: true, .. }
        ));
        assert!(matches!(
            fault(server("FATAL: crash (SQLSTATE 57P02)")),
            StreamFault::Lost { admin: false, .. }
        ));
        assert!(matches!(
            fault(PgWireError::Io(Arc::new(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)))),
            StreamFault::Lost { admin: false, .. }
        ));
        assert!(matches!(
            fault(server("ERROR: replication slot \"s\" is active for PID 7 (SQLSTATE 55006)")),
            StreamFault::Fatal(LiveError::SlotBusy { .. })
        ));
        assert!(matches!(
            fault(server("ERROR: publication \"p\" does not exist (SQLSTATE 42704)")),
            StreamFault::Fatal(LiveError::NoPublication(_))
        ));
        assert!(matches!(
            fault(server("ERROR: replication slot \"s\" does not exist (SQLSTATE 42704)")),
            StreamFault::Fatal(LiveError::SlotDropped(_))
        ));
        assert!(matches!(
            fault(server("FATAL: must be superuser or replication role to start walsender (SQLSTATE 42501)")),
            StreamFault::Fatal(LiveError::NoReplicationPermission(u)) if u == "u"
        ));
    }
}
