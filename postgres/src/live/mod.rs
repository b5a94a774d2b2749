//! The live source: a logical replication slot of the built-in **pgoutput** plugin, streamed
//! with `START_REPLICATION` and confirmed by standby status updates only up to what every sink
//! has applied.
//!
//! [`LiveSource::connect`] checks the server on an ordinary connection (the [`postgres`] crate):
//! `wal_level = logical`, the `REPLICATION` role attribute, the publication
//! ([`LiveConfig::publication`]); with [`LiveConfig::create_slot`] it creates the publication,
//! if it is missing, **for every table that can be published** (`FOR TABLE ...`; it refuses
//! while a table has no replica identity, naming it: such a publication would make PostgreSQL
//! refuse the application's own `UPDATE` and `DELETE` on that table, [`LiveError::UnpublishableTables`]),
//! then the slot with the `pgoutput` plugin (in this order: a slot decodes its changes with the
//! publications that existed when they were written). It refuses a slot of another plugin, and
//! takes the slot for this process: an advisory lock keyed by the slot name keeps a second
//! lanestream source off it, and a slot that another client streams (`active_pid`) is waited
//! for, then refused. [`LiveSource::open`] opens the stream (the first
//! [`Source::next`] does it).
//!
//! The live source **is a pipeline [`Source`]**: [`next`](Source::next) hands over each
//! transaction, decoded by its own [`PgOutputDecoder`] ([`with_builder`](LiveSource::with_builder)
//! sets its chunk size and key columns), and the items of the backfills it serves;
//! [`confirm`](Source::confirm) confirms the slot; [`start`](Source::start) checks the slot
//! against the sinks' states.
//!
//! # Threads
//! ```text
//! the caller (the pipeline's ingest) ── next() ──> LiveSource ──┬─ poll: the replication stream (a one-thread Tokio
//!                                                                │        runtime of its own: pgwire-replication's client,
//!                                                                │        replying to keepalives, sending status updates)
//!                                                                ├─ side: the second connection (checks, catalog key
//!                                                                │        look-ups, heartbeats, lag), on the caller's thread
//!                                                                └─ backfill: lanestream-backfill (reads chunks on a
//!                                                                           connection of its own) → lanestream-backfill-rows
//!                                                                           (turns them into envelopes) → back to poll
//! ```
//!
//! # Files
//! `config.rs` how to reach the slot; `error.rs` what went wrong and how errors are told apart;
//! `side.rs` the second connection and the catalog key look-up; `slot.rs` the slot at connect,
//! the start-up check, reading it back; `stream.rs` the replication stream (open, poll, decode,
//! reconnect, confirm); `fill.rs` a decoded batch handed over, its partial updates filled once
//! its transaction is visible (P5); `reader.rs` the backfill's requests and reader threads;
//! `rejoin.rs` the publication check, which finds a table that rejoined the publication.
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
//! core crate stays runtime-free. The worker keeps its own thread so that the keepalives are
//! answered while a full lane holds the caller (on a runtime driven by the caller nobody would
//! answer them). The caller takes the worker's events from its channel: while the stream is
//! busy it takes what is queued without waiting and, finding nothing, naps 50 us instead of
//! parking, so the worker does not have to wake it for every event or few (`stream.rs`, `NAP`:
//! a drain switches context a tenth as often, and the stream's latency falls with it).
//!
//! # How it confirms
//! [`confirm`](Source::confirm) gets the stream's watermark and hands it to the client,
//! which sends it as the flush (and write, and apply) position of a standby status update within
//! [`LiveConfig::status_interval`] when it moves, and at least that often otherwise; the slot's
//! `confirmed_flush_lsn` follows. It is never more than the watermark, so never more than what
//! every sink holds. An idle slot follows the server's WAL (written by other databases, say)
//! through the watermark too: [`sent_upto`](LiveSource::sent_upto) says where the server, in a
//! keepalive or a non-transactional logical message (a heartbeat) outside any transaction, said it
//! has sent everything before, and the source hands over an empty positioned batch just below it
//! (at most once a status interval), which every sink acks and records. [`read_confirmed`](LiveSource::read_confirmed) waits for the last position given to
//! reach the server, then reads the slot, so a caller that confirms the final watermark at
//! shutdown and reads it back knows it was sent.
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
//! # A slot that resumes past the sinks
//! A slot created now decodes only transactions that commit after its *consistent point*
//! ([`SlotPositions::consistent_point`]), and a slot resumes at its confirmed position. Sinks
//! whose data stands before that (the slot was dropped and is being re-created for them, or was
//! advanced by hand) would silently miss everything committed in between: the pipeline's source
//! refuses it at start with [`LiveError::SlotGap`], dropping a slot it just created (so that a
//! second try is refused too, rather than carrying on over the gap). Such sinks need a backfill:
//! reset them, and the pipeline backfills them as new sinks.
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
//! [`backfill`](Source::backfill) serves a [`Request::Backfill`] while the stream flows:
//! the tables are read in key order, in chunks, by a reader thread (on a connection of its own,
//! so the stream does not wait for the reads) and turned into documents by another, each chunk
//! between a low and a high mark written into the WAL, and its rows published (as
//! [`SourceItem::Snapshot`] from [`next`](Source::next)) once the stream reached
//! its high mark, without the keys the stream changed meanwhile: see [`crate::backfill`].
//!
//! # A table that rejoins
//! pgoutput sends a table's changes only while the table is in the publication, and only what
//! the WAL logs. A table removed from it and added again, dropped and created again under its
//! name, renamed or moved away and back, set `UNLOGGED` and `LOGGED` again, or whose row
//! filter or column list changed, has a gap in the stream that no sink could see: rows deleted
//! meanwhile would stay in the sinks, rows inserted never come. Every
//! [`LiveConfig::publication_check`] (5 s by default) the source reads the publication's tables
//! on its second connection; when one rejoined, it writes a transactional logical message,
//! and at that message's commit in the stream hands over an [`Op::Resync`] of the index:
//! every sink empties it and owes its backfill in the same commit (P2, P3), which this source
//! serves like any other. A round trip within one interval is found by the table's `pg_class`
//! row: changed, yet saying what it said before (or a new file no streamed `TRUNCATE`
//! explains). DDL that stays (a column added, a `GRANT`) is not a rejoin. Not seen: a table
//! that rejoined while no source ran. See `rejoin.rs`.
//!
//! [`Op::Resync`]: lanestream::Op::Resync
//!
//! # Errors
//! Every misconfiguration a user hits first has its own [`LiveError`] with what to do: a wrong
//! password, `wal_level` not `logical`, a user without `REPLICATION`, the publication missing or
//! publishing no table, the slot missing (and creating it not asked for), a slot of another
//! plugin, a slot held by another client, a slot created after the sinks' checkpoints, a slot
//! dropped while running, the connection terminated by an administrator, a server that does not
//! come back within the retry budget. Any other server error ([`LiveError::Db`],
//! [`LiveError::Replication`]) shows the server's message and SQLSTATE.

mod config;
mod error;
mod fill;
mod reader;
mod rejoin;
mod side;
mod slot;
mod stream;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lanestream::{Batch, Position, Request};

pub use config::LiveConfig;
pub use error::LiveError;
pub use rejoin::REJOIN_PREFIX;

use crate::backfill::Backfiller;
use crate::batch::TransactionBuilder;
use crate::pgoutput::PgOutputDecoder;
use crate::pipeline::{SinkStart, Source, SourceItem, SourceStart};
use pgwire_replication::ReplicationClient;
use reader::ChunkReader;
use side::Side;

/// How long the second connection (checks, catalog look-ups, heartbeats) is reconnected and its
/// statement retried after the connection was lost, before the error is returned.
pub const SIDE_RETRY_BUDGET: Duration = Duration::from_secs(10);

/// The prefix of the heartbeat messages ([`LiveConfig::heartbeat`]).
pub const HEARTBEAT_PREFIX: &str = "lanestream_heartbeat";

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
    /// Transactions handed over (positioned batches returned by [`next`](Source::next)).
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
    /// Partial updates (unchanged TOASTed values) of tables being backfilled or owed to a local
    /// sink whose unchanged values were read from the table so that they went out whole (P5: a
    /// sink may not hold the row yet), or that went out as a delete (the row gone since).
    pub partial_filled: u64,
    /// Indexes resynced ([`Op::Resync`](lanestream::Op::Resync)): their tables rejoined the
    /// publication (see the module docs, *A table that rejoins*).
    pub resyncs: u64,
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
    /// How far the server has sent (see [`decoded`](LiveSource::decoded)).
    decoded: Option<Position>,
    /// How far the server has sent, as a keepalive or a heartbeat outside a transaction said
    /// ([`sent_upto`](LiveSource::sent_upto)).
    sent: Option<Position>,
    /// Names the database ([`origin`](LiveSource::origin)).
    origin: String,
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
    /// P5: the indexes a local sink may not hold yet (a joiner's, a backfill its state owes,
    /// tables that joined while it was down), by how many sinks, until their `SnapshotComplete`:
    /// their partial updates go out whole ([`fill_partial`](LiveSource::fill_partial)), even
    /// before the request is served.
    unheld: ahash::AHashMap<lanestream::IndexName, u32>,
    /// P5 for tables that join while running: the indexes published at
    /// [`Source::start`](crate::pipeline::Source::start) and those seen since, and how many
    /// local sinks started. A change of an index not among them (a table added to the
    /// publication or renamed) makes every local sink owe its backfill at that change, so the
    /// index is `unheld` by all of them from there on (`None`: not started by a pipeline).
    seen: Option<(ahash::AHashSet<lanestream::IndexName>, u32)>,
    /// The publication checks ([`LiveConfig::publication_check`]).
    rejoins: rejoin::Rejoins,
    /// The check whose message the open transaction carries.
    open_check: Option<rejoin::Check>,
    /// The plans of `unheld` indexes that are not being backfilled (`None`: not readable).
    unheld_plans: ahash::AHashMap<lanestream::IndexName, Option<crate::backfill::TablePlan>>,
    /// The thread that reads backfill chunks (started with the first request).
    reader: Option<ChunkReader>,
    /// Items decoded and not yet returned, in stream order.
    out: VecDeque<SourceItem>,
    /// The decoder of the stream's messages (its builder: chunk size, key columns, the catalog
    /// key look-up on the second connection).
    decoder: PgOutputDecoder,
    /// Whether the stream was opened ([`open`](LiveSource::open); the first `next` does it).
    opened: bool,
    /// [`until`](LiveSource::until)'s position.
    end: Option<Position>,
    /// The last positioned batch handed over (a transaction or an idle batch).
    published: Option<Position>,
    /// When the last idle batch was handed over.
    last_idle: Option<Instant>,
    /// Naps left before the stream's next wait parks (`poll`: the stream is busy while some are).
    naps: u32,
    /// The replication client's metrics (how many events its worker forwarded) and how many
    /// events were taken from it: `poll` takes without waiting only what is queued.
    forwarded: Option<(Arc<pgwire_replication::ReplicationMetrics>, u64)>,
    /// A batch with partial updates to fill whose transaction (this xid) is not yet visible on
    /// the second connection, and since when: it waits, holding up the stream after it, for as
    /// long as it takes (a commit waiting for a synchronous standby is visible to nobody
    /// meanwhile; [`LiveError::SynchronousStandby`] when that standby is this source's own
    /// walsender), and `next` returns `None` at each timeout, hands over no idle batch and does
    /// not end (but at an [`until`](LiveSource::until) position at or before its commit).
    invisible: Option<Invisible>,
}

/// A batch waiting for its transaction to be visible ([`LiveSource::invisible`]).
#[derive(Debug)]
struct Invisible {
    batch: Batch,
    xid: u32,
    /// When it began to wait.
    since: Instant,
    /// Its transaction's commit LSN (a chunk's, from its Begin), when known: an
    /// [`until`](LiveSource::until) position at or before it ends the input without it.
    commit: Option<Position>,
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

/// The live source's default chunk size ([`LiveSource::with_builder`]): a transaction of more
/// changes comes in unpositioned chunks of this many (see [`crate::batch`], *huge
/// transactions*), so the source holds at most this many changes of it, whatever its size: the
/// pipeline's memory stays flat (a 2,000,000-row transaction through three durable sinks: about
/// 20 MiB peak RSS; `scripts/e2e-million.sh`). The harness's `--max-batch-changes` default.
pub const MAX_BATCH_CHANGES: u64 = 10_000;

impl LiveSource {
    /// This source with its decoder's batch builder made from `builder` (its chunk size, key
    /// columns), given the source's catalog key look-up ([`key_lookup`](Self::key_lookup)).
    /// Default: `TransactionBuilder::new()` with chunks of [`MAX_BATCH_CHANGES`] changes and the
    /// look-up (`with_max_batch_changes(None)` holds a transaction whole, however large).
    pub fn with_builder(mut self, builder: TransactionBuilder) -> Self {
        self.decoder = PgOutputDecoder::new(builder.with_key_lookup(self.key_lookup()));
        self
    }

    /// End ([`SourceItem::End`]) once every transaction committed before `end` was decoded and
    /// no more arrive within one `next` timeout (or a transaction committed at or after `end`
    /// waits to be visible: see [`next`](Source::next)); `None` (the default): run until stopped.
    pub fn until(mut self, end: Option<Position>) -> Self {
        self.end = end;
        self
    }

    /// The decoder (its builder's counters: transactions, the last commit built).
    pub fn decoder(&self) -> &PgOutputDecoder {
        &self.decoder
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
        self.decoded
    }

    /// Where the slot stood when this source took it: whether this source created it, its
    /// consistent point then, its `restart_lsn` and `confirmed_flush_lsn`.
    pub fn slot_positions(&self) -> SlotPositions {
        self.positions
    }

    /// Names the database this source streams (its system identifier and name): the origin a
    /// sink's state records ([`SourceStart::origin`](crate::pipeline::SourceStart::origin)).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// How often status updates go to the server ([`LiveConfig::status_interval`]).
    pub fn status_interval(&self) -> Duration {
        self.config.status_interval
    }

    /// Where the server said, in its last keepalive or heartbeat outside a transaction, it has
    /// sent everything before: every transaction that commits before it was handed over (or
    /// published nothing of ours). `None` before the first.
    pub fn sent_upto(&self) -> Option<Position> {
        self.sent
    }

    /// An empty positioned batch just below where the server says it sent everything, when one
    /// is due ([`idle_position`]; see the module docs, *How it confirms*). After a reconnect the
    /// decoder skips what is at or before it.
    fn idle_batch(&mut self) -> Option<Batch> {
        let at = idle_position(
            self.sent,
            self.published,
            self.decoder.in_transaction(),
            self.last_idle.map(|t| t.elapsed()),
            self.config.status_interval,
        )?;
        self.last_idle = Some(Instant::now());
        self.handed_over = self.handed_over.max(Some(at));
        Some(Batch::new(Some(at), Arc::from(Vec::new())))
    }
}

/// Where an idle batch goes, if one is due: just below `sent` (where the server said it sent
/// everything), past the last positioned batch handed over (`published`), at most once an
/// `interval` (`since_last`: the time since the last one), and **never while a transaction is
/// open**: its chunks may be out, and a positioned batch between them would end the transaction
/// for the sinks (their state's in-transaction count goes with it), which then refuse its next
/// chunk (a 2M-row transaction under load did: `sent` had come from a keepalive while the server
/// was still reading the transaction's WAL, before its Begin).
fn idle_position(
    sent: Option<Position>,
    published: Option<Position>,
    in_transaction: bool,
    since_last: Option<Duration>,
    interval: Duration,
) -> Option<Position> {
    let at = Position(sent?.0.checked_sub(1)?);
    let due = !in_transaction
        && published.is_none_or(|p| at > p)
        && since_last.is_none_or(|elapsed| elapsed >= interval);
    due.then_some(at)
}

/// The live source as a pipeline's [`Source`]: opened at the first [`next`](Source::next),
/// confirmed never past the watermark, backfills served from the tables beside the stream
/// ([`crate::backfill`]), the slot checked against the sinks' states at
/// [`start`](Source::start) (see the module docs, *A slot that resumes past the sinks*).
impl Source for LiveSource {
    type Error = LiveError;

    /// The next transaction (or chunk, or idle batch), or an item of a backfill being served:
    /// a snapshot batch when the stream reaches its chunk's high mark, `SnapshotComplete` after
    /// a request's last one; `Ok(None)` when nothing came within `timeout`, or while a
    /// transaction with partial updates to fill is not yet visible to other sessions (a commit
    /// waiting for a synchronous standby: it is handed over once it is, nothing after it before;
    /// [`LiveError::SynchronousStandby`] when that standby is this source's own walsender);
    /// [`SourceItem::End`]
    /// at [`until`](LiveSource::until)'s position. Writes the heartbeat when it is due, and opens
    /// the stream again when it broke (see the module docs, *Reconnecting*).
    ///
    /// # Errors
    /// [`LiveError::Decode`] for a message the decoder refused, the errors of *Reconnecting*, a
    /// failed heartbeat; [`LiveError::BackfillFailed`] for a chunk whose rows cannot be turned
    /// into documents, [`LiveError::Side`] when reading a chunk fails within
    /// [`SIDE_RETRY_BUDGET`]: the request being served is then given up (it gets no
    /// `SnapshotComplete`: ask again, with `after` set to the last row applied), the next one
    /// is served, and the stream goes on.
    fn next(&mut self, timeout: Duration) -> Result<Option<SourceItem>, LiveError> {
        if !self.opened {
            self.open()?;
        }
        let item = match self.poll(timeout)? {
            Some(item) => item,
            // Held back: the input ends without it when it commits at or after `until`'s end
            // (every transaction before that end came before it in the stream).
            None if self.invisible.as_ref().is_some_and(|held| {
                self.end.is_some_and(|end| held.commit.is_some_and(|commit| commit >= end))
            }) =>
            {
                SourceItem::End
            }
            None if self.invisible.is_some() => return Ok(None),
            None if self.end.is_some_and(|end| self.decoded.is_some_and(|d| d >= end)) => SourceItem::End,
            None => match self.idle_batch() {
                Some(batch) => SourceItem::Change(batch),
                None => return Ok(None),
            },
        };
        match &item {
            SourceItem::Change(Batch { position: Some(p), .. }) => {
                self.published = self.published.max(Some(*p))
            }
            SourceItem::Snapshot { item: lanestream::LaneItem::SnapshotComplete { indexes }, .. } => {
                for index in indexes {
                    if let Some(n) = self.unheld.get_mut(index) {
                        *n -= 1;
                        if *n == 0 {
                            self.unheld.remove(index);
                            self.unheld_plans.remove(index);
                        }
                    }
                }
            }
            _ => {}
        }
        Ok(Some(item))
    }

    fn confirm(&mut self, position: Position) -> Result<(), LiveError> {
        self.confirm_upto(position);
        Ok(())
    }

    /// Starts serving a backfill request (see [`crate::backfill`]): its indexes' tables are
    /// found in the publication and checked now; their chunks then come out of
    /// [`next`](Source::next) as [`SourceItem::Snapshot`], interleaved with the changes, then
    /// the request's `SnapshotComplete`. Requests are served one after the other.
    ///
    /// # Errors
    /// [`LiveError::BackfillRefused`] for a request that can never be served (the request is not
    /// queued); [`LiveError::Side`] / [`LiveError::Db`] from the catalog look-up.
    fn backfill(&mut self, request: Request) -> Result<(), LiveError> {
        self.serve_backfill(request)
    }

    /// The slot's byte lag (`pg_current_wal_lsn() - confirmed_flush_lsn`, one query on the
    /// source's second connection); `None` when it cannot be read now.
    fn lag_bytes(&mut self) -> Option<u64> {
        self.metrics().ok().and_then(|m| m.slot_lag_bytes)
    }

    fn start(&mut self, sinks: &[SinkStart<'_>]) -> Result<SourceStart, LiveError> {
        self.check_start(sinks)
    }
}

impl Drop for LiveSource {
    fn drop(&mut self) {
        self.stop();
    }
}
