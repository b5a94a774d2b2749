//! The live source: a logical replication slot with the wal2json plugin, read over SQL, confirmed
//! only up to what every sink has applied.
//!
//! [`LiveSource::connect`] connects with the [`postgres`] crate (a synchronous client), checks the
//! server (`wal_level = logical`), creates the slot with the `wal2json` plugin if asked to (or
//! reuses it, refusing a slot of another plugin), and takes it for this process: an advisory lock
//! keyed by the slot name keeps a second lanestream source off it, and a slot that another client
//! streams (`pg_replication_slots.active_pid`, e.g. a `pg_recvlogical`) is waited for, then refused.
//!
//! # How it reads and confirms
//! [`poll`](LiveSource::poll) calls `pg_logical_slot_peek_changes` (format-version 2, with
//! `include-lsn`, `include-xids`, `include-timestamp` and `include-pk`) and hands each row — one
//! wal2json line — to the caller as it arrives. Peeking confirms nothing: the slot's
//! `confirmed_flush_lsn` moves only when [`confirm`](LiveSource::confirm) calls
//! `pg_replication_slot_advance`, and the caller passes the stream's watermark there, so the slot
//! is never confirmed past what every sink has acked. PostgreSQL re-sends, on the next peek or
//! after a restart, every transaction whose commit LSN is at or after the confirmed position: the
//! transaction *at* the watermark comes again (at least once), and
//! [`poll`](LiveSource::poll) skips, within one run, the transactions it already handed over (by
//! the `B` line's `lsn`, the commit LSN), so only a restart shows it again — which the sinks'
//! checkpoints absorb.
//!
//! Each peek decodes from the confirmed position again, so its cost grows with what is published
//! but not yet confirmed (bounded by the lanes' capacity); a peek returns whole transactions, at
//! least `max_rows` rows when there are that many (doubled when a peek brings nothing new, so a
//! backlog of unconfirmed transactions never stalls it). The server materialises a peek's rows
//! (spilling to disk past `work_mem`) before sending them; this client reads them one at a time,
//! so its memory stays bounded by the lanes.
//!
//! # How an idle slot keeps moving
//! A slot pins the WAL from its `restart_lsn` on, and the WAL of *every* database of the server
//! counts: a quiet database next to a busy one decodes nothing (no commit of ours, so no
//! watermark to confirm), and with `max_slot_wal_keep_size` set the server would invalidate the
//! slot. So [`poll`](LiveSource::poll) remembers, when a peek came to the end of the WAL
//! ([`PollOutcome::caught_up`]), the WAL flush position read just before it
//! ([`PollOutcome::flushed`]): every transaction that committed before it has been handed over.
//! Once the position given to [`confirm`](LiveSource::confirm) covers the last transaction
//! handed over (every lane acked it: the stream is idle up to there), nothing before that flush
//! position is pending, and `confirm` advances the slot to it, past WAL that held nothing for us.
//! A transaction still in progress at that position is not skipped: PostgreSQL re-sends every
//! transaction whose commit comes at or after the confirmed position, and keeps the WAL of its
//! start (the slot's `restart_lsn` follows the decoded `xl_running_xacts` records, which the
//! server logs at checkpoints and every 15 s while WAL is written). So the confirmed position is
//! either the watermark (a commit LSN: that transaction comes again after a restart) or, when
//! idle, a WAL position past the last commit handed over (nothing comes again).
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
//! [`key_lookup`](LiveSource::key_lookup) reads a table's replica identity from the catalog on
//! the second connection, reconnecting it when it is lost (a terminated backend, a restarted
//! server) and retrying within [`SIDE_RETRY_BUDGET`]; a look-up that still fails is an error
//! ([`LiveError::Side`]), which the reader turns into an error of the change's transaction, never
//! into "no key". The reader asks again whenever a table's shape changes (its columns or its
//! primary key), and prefers the key each change carries (`pk`) to the catalog's primary key, so
//! keys follow the stream across `ALTER TABLE` (see [`crate::wal2json`], *Ids*).
//!
//! # Why SQL polling rather than streaming replication
//! The standard (`START_REPLICATION` in CopyBoth mode with standby status updates) needs a client
//! that speaks CopyBoth; no released version of the well-kept Rust clients does (rust-postgres
//! has had it as open pull requests for years; Materialize keeps a fork). SQL polling needs only
//! the released `postgres` crate, and it makes the one promise easy to keep and to check: the
//! only statement that moves `confirmed_flush_lsn` is our `pg_replication_slot_advance` with the
//! watermark, where a streaming client must take care that its status updates never report more
//! (`pg_recvlogical` reports what it has written, which is how the loss this source fixes
//! happened). The price: latency of one poll interval, re-decoding the unconfirmed window on
//! each peek, and a transaction materialised on the server before its first row comes.
//!
//! # Errors
//! Every misconfiguration a user hits first has its own [`LiveError`] with what to do: a wrong
//! password, `wal_level` not `logical`, the wal2json plugin not installed, the slot missing (and
//! creating it not asked for), the slot of another plugin, the slot held by another client, a
//! slot created after the sinks' checkpoints ([`LiveError::SlotGap`]). Any other server error
//! ([`LiveError::Db`]) shows the server's message, SQLSTATE, detail and hint (an invalidated
//! slot, for one: SQLSTATE 55000, "This slot has been invalidated because it exceeded the
//! maximum reserved size").

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::fallible_iterator::FallibleIterator;
use postgres::{Client, NoTls};

use lanestream::Position;

use crate::wal2json::{CatalogKey, KeyLookup};

/// How long the second connection (confirms, catalog look-ups) is reconnected and its statement
/// retried after the connection was lost, before the error is returned.
pub const SIDE_RETRY_BUDGET: Duration = Duration::from_secs(10);

/// The wal2json options of every peek (the same as `pg_recvlogical -o ...` in the scripts).
pub const WAL2JSON_OPTIONS: [(&str, &str); 5] = [
    ("format-version", "2"),
    ("include-lsn", "true"),
    ("include-xids", "true"),
    ("include-timestamp", "true"),
    ("include-pk", "true"),
];

/// How to reach the slot.
#[derive(Clone, Debug)]
pub struct LiveConfig {
    /// A libpq-style connection string or URL (`postgres://user:password@host:port/db`).
    pub url: String,
    /// The logical replication slot.
    pub slot: String,
    /// Create the slot (with the wal2json plugin) if it does not exist.
    pub create_slot: bool,
    /// Rows asked of one peek (whole transactions: a peek may return more).
    pub max_rows: u32,
    /// How long to wait for a slot that another client holds before giving up.
    pub slot_wait: Duration,
}

impl LiveConfig {
    /// A configuration with the defaults: no slot creation, 10,000 rows a peek, 30 s of
    /// waiting for a busy slot.
    pub fn new(url: impl Into<String>, slot: impl Into<String>) -> Self {
        LiveConfig {
            url: url.into(),
            slot: slot.into(),
            create_slot: false,
            max_rows: 10_000,
            slot_wait: Duration::from_secs(30),
        }
    }
}

/// What went wrong with the live source; each message says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LiveError {
    /// The server refused the user's password (or the user).
    #[error("PostgreSQL refused the login: {0} (check the user and password in the connection string, or PGPASSWORD)")]
    Auth(String),
    /// The server cannot be reached or the connection string is bad.
    #[error("cannot connect to PostgreSQL: {0}")]
    Connect(String),
    /// `wal_level` is not `logical`.
    #[error("the server's wal_level is {0:?}, logical decoding needs wal_level = logical (set it in postgresql.conf and restart the server)")]
    WalLevel(String),
    /// The wal2json output plugin is not installed on the server.
    #[error("the wal2json output plugin is not installed on the server ({0}); install it there (Debian: apt-get install postgresql-15-wal2json)")]
    PluginMissing(String),
    /// The server does not allow wal2json as an output plugin: PostgreSQL builds with the
    /// `output_plugin_libraries` setting (Debian 12's 15.20 has it) refuse every plugin it does
    /// not list.
    #[error("the server does not allow wal2json as an output plugin ({0}); add it to output_plugin_libraries in postgresql.conf and reload the server's configuration")]
    PluginNotAllowed(String),
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
    /// The slot exists but is not a logical slot of the wal2json plugin.
    #[error("replication slot {slot:?} uses the plugin {plugin:?}, not wal2json (use another slot name)")]
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
    /// Any other error from the server or the connection; the message holds the server's
    /// message, SQLSTATE, detail and hint.
    #[error("PostgreSQL: {}", describe_full(.0))]
    Db(#[from] postgres::Error),
    /// The second connection (confirms, catalog look-ups) failed, and reconnecting and retrying
    /// within [`SIDE_RETRY_BUDGET`] did not help.
    #[error("{what} failed on the live source's second connection after {attempts} attempts within {budget:?} (reconnecting each time): {last}; check that the server is up and that nothing terminates lanestream's connections")]
    Side {
        /// The statement: `catalog key look-up of schema.table`, `confirm`, ...
        what: String,
        /// How many times it was tried.
        attempts: u32,
        /// The retry budget.
        budget: Duration,
        /// The last error, as [`LiveError::Db`] would show it.
        last: String,
    },
    /// The row handler failed (the caller's error, e.g. closed lanes).
    #[error("{0}")]
    Handler(String),
}

/// The text of a server error (its message, detail and hint), or of a client error.
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
    } else if *code == SqlState::UNDEFINED_FILE
        || message.contains("wal2json") && message.contains("could not access")
    {
        LiveError::PluginMissing(message)
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

/// What one [`LiveSource::poll`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollOutcome {
    /// Rows the peek returned (lines, already handed over ones included).
    pub rows: u64,
    /// Lines handed to the handler (of transactions not handed over before in this run).
    pub lines: u64,
    /// Whether the peek reached the end of the WAL as it was when it began (it returned fewer
    /// rows than asked): then everything committed before [`PollOutcome::flushed`] was read.
    pub caught_up: bool,
    /// The server's WAL flush position when the peek began.
    pub flushed: Option<Position>,
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

/// What the last caught-up peek decoded: up to `upto` (the WAL flush position read before it),
/// with `handed_over` the last commit handed over by then.
#[derive(Clone, Copy, Debug)]
struct Decoded {
    upto: Position,
    handed_over: Option<Position>,
}

/// A wal2json slot read by SQL polling; see the [module docs](self).
pub struct LiveSource {
    config: LiveConfig,
    /// The connection that peeks.
    client: Client,
    /// A second connection, for confirms while a peek streams and for catalog look-ups.
    side: Arc<Mutex<Side>>,
    /// The slot's confirmed position as last set or read.
    confirmed: Option<Position>,
    /// The commit LSN of the last transaction handed over in this run.
    handed_over: Option<Position>,
    /// What the last caught-up peek decoded (see the module docs, *How an idle slot keeps moving*).
    decoded: Option<Decoded>,
    /// The slot as found at connect.
    positions: SlotPositions,
    /// Rows asked of the next peek.
    max_rows: u32,
}

/// The second connection, reconnected when lost.
struct Side {
    config: LiveConfig,
    client: Option<Client>,
}

impl Side {
    /// Runs `f` on the connection; when the connection is lost (or the server ends the session,
    /// SQLSTATE class 57P or 08), reconnects and tries again, within [`SIDE_RETRY_BUDGET`].
    fn run<T>(
        &mut self,
        what: impl FnOnce() -> String,
        mut f: impl FnMut(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, LiveError> {
        let deadline = Instant::now() + SIDE_RETRY_BUDGET;
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
                None => match connect_one(&self.config, "lanestream side") {
                    Ok(c) => {
                        self.client = Some(c);
                        attempts -= 1; // connecting is not an attempt of the statement
                        continue;
                    }
                    Err(e) => e.to_string(),
                },
            };
            if Instant::now() + backoff > deadline {
                return Err(LiveError::Side { what: what(), attempts, budget: SIDE_RETRY_BUDGET, last });
            }
            thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }
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

impl std::fmt::Debug for LiveSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveSource")
            .field("slot", &self.config.slot)
            .field("confirmed", &self.confirmed)
            .field("handed_over", &self.handed_over)
            .finish_non_exhaustive()
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

impl LiveSource {
    /// Connects, checks the server and takes the slot (creating it if `config.create_slot`).
    ///
    /// # Errors
    /// A [`LiveError`] naming the misconfiguration.
    pub fn connect(config: LiveConfig) -> Result<LiveSource, LiveError> {
        let slot = config.slot.clone();
        let mut client = connect_one(&config, "lanestream")?;
        let wal_level: String = client.query_one("SHOW wal_level", &[])?.get(0);
        if wal_level != "logical" {
            return Err(LiveError::WalLevel(wal_level));
        }
        // One lanestream source per slot: a session advisory lock, held as long as we are
        // connected, released by the server when this process dies.
        let deadline = Instant::now() + config.slot_wait;
        loop {
            let locked: bool = client
                .query_one("SELECT pg_try_advisory_lock(hashtext('lanestream slot ' || $1::text))", &[&slot])?
                .get(0);
            if locked {
                break;
            }
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
        let row = client.query_opt(
            "SELECT coalesce(plugin::text, ''), slot_type::text, active_pid, confirmed_flush_lsn::text \
             FROM pg_replication_slots WHERE slot_name = $1::text",
            &[&slot],
        )?;
        let mut positions = SlotPositions::default();
        if row.is_none() {
            if !config.create_slot {
                return Err(LiveError::NoSlot(slot));
            }
            let created = client
                .query_one(
                    "SELECT lsn::text FROM pg_create_logical_replication_slot($1::text, 'wal2json')",
                    &[&slot],
                )
                .map_err(|e| classify(e, &slot))?;
            positions.created = true;
            positions.consistent_point = lsn_of(created.get(0));
        } else if let Some(row) = row {
            let plugin: String = row.get(0);
            if plugin != "wal2json" {
                return Err(LiveError::WrongPlugin { slot, plugin });
            }
        }
        let side = Side { client: Some(connect_one(&config, "lanestream side")?), config: config.clone() };
        let mut source = LiveSource {
            max_rows: config.max_rows.max(1),
            config,
            client,
            side: Arc::new(Mutex::new(side)),
            confirmed: None,
            handed_over: None,
            decoded: None,
            positions,
        };
        source.wait_until_free(deadline)?;
        Ok(source)
    }

    /// Waits until no other client streams the slot (a killed predecessor's backend may still
    /// hold it for a moment), or refuses at `deadline`.
    fn wait_until_free(&mut self, deadline: Instant) -> Result<(), LiveError> {
        loop {
            let row = self.client.query_one(
                "SELECT active_pid, confirmed_flush_lsn::text, \
                 (SELECT coalesce(application_name, '') FROM pg_stat_activity WHERE pid = active_pid), \
                 restart_lsn::text \
                 FROM pg_replication_slots WHERE slot_name = $1::text",
                &[&self.config.slot],
            )?;
            let pid: Option<i32> = row.get(0);
            self.confirmed = lsn_of(row.get(1));
            self.positions.confirmed_flush = self.confirmed;
            self.positions.restart_lsn = lsn_of(row.get(3));
            let Some(pid) = pid else { return Ok(()) };
            if Instant::now() >= deadline {
                let app: Option<String> = row.get(2);
                let holder = format!("PID {pid}, application_name {:?}", app.unwrap_or_default());
                return Err(LiveError::SlotBusy { slot: self.config.slot.clone(), holder });
            }
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// The slot's `confirmed_flush_lsn` as this source last set or read it.
    pub fn confirmed(&self) -> Option<Position> {
        self.confirmed
    }

    /// The WAL flush position read before the last peek that came to the end of the WAL: every
    /// transaction committed before it was handed over (see the module docs, *How an idle slot
    /// keeps moving*); `None` before such a peek.
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
        self.client
            .execute("SELECT pg_drop_replication_slot($1::text)", &[&self.config.slot])
            .map_err(|e| classify(e, &self.config.slot))?;
        Err(LiveError::SlotGap { slot: self.config.slot.clone(), checkpoint, consistent_point })
    }

    /// A key lookup for [`TransactionBuilder::with_key_lookup`](crate::wal2json::TransactionBuilder::with_key_lookup)
    /// that reads a table's replica identity from the catalog (on the second connection):
    /// [`CatalogKey::IdentityIndex`] with the columns of its identity index under
    /// `REPLICA IDENTITY USING INDEX`, else [`CatalogKey::PrimaryKey`] with those of its primary
    /// key, in column order (as wal2json's `pk`); `None` for a table without either.
    ///
    /// # Errors
    /// The look-up fails with [`LiveError::Side`] when the second connection is lost and cannot
    /// be restored within [`SIDE_RETRY_BUDGET`], or with another [`LiveError`] from the server:
    /// never `Ok(None)` for a look-up that did not happen.
    pub fn key_lookup(&self) -> KeyLookup {
        let side = self.side.clone();
        Box::new(move |schema, table| {
            let mut side = side.lock().map_err(|_| "the live source's second connection: lock poisoned")?;
            let row = side.run(
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

    /// Confirms the slot up to `upto` (the stream's watermark: never more) when that is past the
    /// confirmed position; returns the confirmed position. Safe to call while a peek streams.
    ///
    /// When `upto` covers the last transaction handed over (so every lane acked everything this
    /// source handed over: the stream is idle) and the last peek came to the end of the WAL, the
    /// slot is confirmed up to where that peek decoded instead, past WAL that held nothing for
    /// this slot (written by other databases, say): see the module docs, *How an idle slot keeps
    /// moving*.
    ///
    /// # Errors
    /// [`LiveError`] from the server; [`LiveError::Side`] when the second connection is lost and
    /// cannot be restored.
    pub fn confirm(&mut self, upto: Option<Position>) -> Result<Option<Position>, LiveError> {
        Confirmer {
            side: &self.side,
            slot: &self.config.slot,
            confirmed: &mut self.confirmed,
            decoded: self.decoded,
        }
        .confirm(upto)
    }

    /// The slot's `confirmed_flush_lsn` read from the server.
    ///
    /// # Errors
    /// [`LiveError`] from the server.
    pub fn read_confirmed(&mut self) -> Result<Option<Position>, LiveError> {
        let mut side = self.side.lock().map_err(|_| LiveError::Handler("lock poisoned".into()))?;
        let slot = self.config.slot.clone();
        let row = side.run(
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

    /// Peeks the slot and hands each line of the transactions not handed over before (in this
    /// run) to `handle`, as the rows arrive. `handle` may block (a full lane); it may confirm
    /// through `confirm` meanwhile (it gets this source's confirm function). A peek returns whole
    /// transactions.
    ///
    /// # Errors
    /// [`LiveError`] from the server, or [`LiveError::Handler`] with `handle`'s error.
    pub fn poll<E: std::fmt::Display>(
        &mut self,
        mut handle: impl FnMut(&[u8], &mut Confirmer<'_>) -> Result<(), E>,
    ) -> Result<PollOutcome, LiveError> {
        let slot = self.config.slot.clone();
        let flushed = lsn_of(self.client.query_one("SELECT pg_current_wal_flush_lsn()::text", &[])?.get(0));
        let mut sql = String::from("SELECT data FROM pg_logical_slot_peek_changes($1::text, NULL, $2::int4");
        for (k, v) in WAL2JSON_OPTIONS {
            sql.push_str(&format!(", '{k}', '{v}'"));
        }
        sql.push(')');
        let max_rows = i32::try_from(self.max_rows).unwrap_or(i32::MAX);
        let mut outcome = PollOutcome { flushed, ..PollOutcome::default() };
        let mut skipping = false;
        let mut unreadable = false;
        let mut handed_over = self.handed_over;
        let mut confirmer = Confirmer {
            side: &self.side,
            slot: &slot,
            confirmed: &mut self.confirmed,
            decoded: self.decoded,
        };
        {
            let mut rows = self
                .client
                .query_raw(sql.as_str(), [&slot as &(dyn postgres::types::ToSql + Sync), &max_rows])
                .map_err(|e| classify(e, &slot))?;
            while let Some(row) = rows.next().map_err(|e| classify(e, &slot))? {
                outcome.rows += 1;
                let line: &str = row.try_get(0)?;
                // wal2json writes "action" first: B and C are told by their first bytes.
                if line.starts_with(r#"{"action":"B""#) {
                    let commit = begin_lsn(line);
                    // A transaction whose position cannot be read cannot be told handed over
                    // and acked: no idle advance after this peek (fail closed).
                    unreadable |= commit.is_none();
                    skipping = match (commit, self.handed_over) {
                        (Some(c), Some(done)) => c <= done,
                        _ => false,
                    };
                    if !skipping {
                        handed_over = commit.or(handed_over);
                    }
                }
                if !skipping {
                    outcome.lines += 1;
                    handle(line.as_bytes(), &mut confirmer).map_err(|e| LiveError::Handler(e.to_string()))?;
                }
            }
        }
        self.handed_over = handed_over;
        // Against the limit the peek was sent (capped at i32::MAX), not the u32 asked for: a peek
        // cut off by the limit is never taken for one that reached the end of the WAL.
        outcome.caught_up = outcome.rows < u64::from(max_rows.unsigned_abs());
        if outcome.caught_up && !unreadable {
            if let Some(upto) = flushed {
                self.decoded = Some(Decoded { upto, handed_over });
            }
        }
        // A backlog of transactions already handed over filled the whole peek: ask for more.
        self.max_rows = if outcome.lines == 0 && !outcome.caught_up {
            self.max_rows.saturating_mul(2)
        } else {
            self.config.max_rows.max(1)
        };
        Ok(outcome)
    }
}

/// Confirms the slot from inside a [`LiveSource::poll`] handler (on the second connection).
pub struct Confirmer<'a> {
    side: &'a Arc<Mutex<Side>>,
    slot: &'a str,
    confirmed: &'a mut Option<Position>,
    /// What the last caught-up peek before this one decoded.
    decoded: Option<Decoded>,
}

impl std::fmt::Debug for Confirmer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Confirmer").field("slot", &self.slot).field("confirmed", &self.confirmed).finish()
    }
}

impl Confirmer<'_> {
    /// As [`LiveSource::confirm`].
    ///
    /// # Errors
    /// [`LiveError`] from the server.
    pub fn confirm(&mut self, upto: Option<Position>) -> Result<Option<Position>, LiveError> {
        // Idle: everything handed over up to the decoded position is acked, so nothing before
        // that position is pending.
        let idle = self
            .decoded
            .filter(|d| d.handed_over.is_none_or(|h| upto.is_some_and(|u| u >= h)))
            .map(|d| d.upto);
        let Some(upto) = upto.max(idle) else { return Ok(*self.confirmed) };
        if self.confirmed.is_some_and(|c| c >= upto) {
            return Ok(*self.confirmed);
        }
        let mut side = self.side.lock().map_err(|_| LiveError::Handler("confirm: lock poisoned".into()))?;
        let target = upto.to_string();
        let row = side.run(
            || format!("confirming the slot up to {target}"),
            |c| {
                c.query_one(
                    "SELECT end_lsn::text FROM pg_replication_slot_advance($1::text, ($2::text)::pg_lsn)",
                    &[&self.slot, &target],
                )
            },
        )?;
        *self.confirmed = lsn_of(row.get(0)).or(*self.confirmed);
        Ok(*self.confirmed)
    }
}

/// The `lsn` of a `B` line (the commit LSN in format-version 2).
fn begin_lsn(line: &str) -> Option<Position> {
    #[derive(serde::Deserialize)]
    struct Begin<'a> {
        #[serde(borrow)]
        lsn: Option<&'a str>,
    }
    let b: Begin<'_> = serde_json::from_str(line).ok()?;
    Position::from_lsn(b.lsn?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn begin_lines_give_their_commit_lsn() {
        let b = r#"{"action":"B","xid":724,"timestamp":"2026-11-30 18:45:58.869117+00","lsn":"0/15222D0","nextlsn":"0/1524B20"}"#;
        assert_eq!(begin_lsn(b), Some(Position(0x15222D0)));
        assert_eq!(begin_lsn(r#"{"action":"B"}"#), None);
    }
}
