//! What went wrong with the live source ([`LiveError`]), and how a server's error on the second
//! connection is told apart: a misconfiguration with its own variant, or any other error with the
//! server's words. (A replication client's error is told apart where the stream is read:
//! `stream.rs`, `classify_stream`.)

use std::time::Duration;

use postgres::error::SqlState;

use lanestream::Position;

use crate::pgoutput::PgOutputError;

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
    #[error("publication {0:?} does not exist: create it (CREATE PUBLICATION {0} FOR TABLE ...), or set LiveConfig::create_slot, which creates it for every table that can be published")]
    NoPublication(String),
    /// The publication publishes no table.
    #[error("publication {0:?} publishes no table: add the tables to stream (ALTER PUBLICATION {0} ADD TABLE ...)")]
    PublicationEmpty(String),
    /// Creating the publication ([`LiveConfig::create_slot`](super::LiveConfig::create_slot)) was refused: these tables have no
    /// replica identity (no primary key, no `REPLICA IDENTITY USING INDEX` or `FULL`), and a
    /// publication of them makes PostgreSQL refuse the application's own `UPDATE` and `DELETE`
    /// on them. Nothing was created.
    #[error("publication {publication:?} was not created: {} cannot be published without breaking the application's UPDATE and DELETE on them (no primary key, no replica identity index, not REPLICA IDENTITY FULL). Give them a primary key (or ALTER TABLE ... REPLICA IDENTITY FULL), or create the publication for the other tables yourself: {suggestion}", tables.join(", "))]
    UnpublishableTables {
        /// The publication it would have created.
        publication: String,
        /// The tables without a replica identity, `schema.table`.
        tables: Vec<String>,
        /// A `CREATE PUBLICATION ... FOR TABLE ...` of the tables that can be published.
        suggestion: String,
    },
    /// The slot does not exist and creating it was not asked for. A new pipeline creates it
    /// ([`LiveConfig::create_slot`](super::LiveConfig::create_slot)); for sinks that read it before, it was dropped, and a new
    /// one would start after a gap ([`LiveError::SlotGap`]): they need a backfill.
    #[error("replication slot {0:?} does not exist: a new pipeline creates it (LiveConfig::create_slot); sinks that read it before need a backfill, since a new slot starts at the current WAL position (reset them: the pipeline backfills new sinks)")]
    NoSlot(String),
    /// The slot resumes past a sink's data (the live source's
    /// [`Source::start`](crate::pipeline::Source::start), [P1](crate::pipeline::state#the-rules)): it was created now over a sink that holds
    /// data, or its confirmed position is past the sink's last applied transaction (the slot
    /// was dropped and created again, or advanced by hand). The transactions committed between
    /// the two are in no slot, so carrying on would skip them for that sink.
    #[error("replication slot {slot:?} resumes at {resumes_from}, past the data of sink {sink} (applied up to {}): what was committed between the two was never streamed to it{}, and no slot can bring it back. Reset the sink (clear its data and its state: it is then a new sink, which the pipeline backfills), then start again", applied.map_or_else(|| "snapshot rows only".to_owned(), |p| p.to_string()), if *dropped { " (the slot was created now, and dropped again)" } else { " (the slot was dropped and created again, or advanced by hand)" })]
    SlotGap {
        /// The slot.
        slot: String,
        /// The first sink found behind it.
        sink: String,
        /// Where that sink's data stands ([`SinkState::applied`](crate::pipeline::SinkState::applied)).
        applied: Option<Position>,
        /// Where the slot resumes (its `confirmed_flush_lsn`, or its consistent point when
        /// created now).
        resumes_from: Position,
        /// Whether this source created the slot now and dropped it again.
        dropped: bool,
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
    #[error("replication slot {slot:?} was invalidated by the server ({message}): it kept more WAL than max_slot_wal_keep_size allows, and what it would have decoded is gone, so it can never resume; the sinks need a backfill on a new slot: drop this one (SELECT pg_drop_replication_slot('{slot}')), reset the sinks, and start with LiveConfig::create_slot (the pipeline backfills new sinks)")]
    SlotInvalidated {
        /// The slot.
        slot: String,
        /// The server's message.
        message: String,
    },
    /// The slot was dropped while this source streamed it (after its connection was
    /// terminated): what is committed from now on is in no slot.
    #[error("replication slot {0:?} was dropped while the pipeline streamed it: what is committed from now on is in no slot; the sinks need a backfill on a new slot (reset them, then start with LiveConfig::create_slot: the pipeline backfills new sinks)")]
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
        /// The retry budget ([`LiveConfig::retry_budget`](super::LiveConfig::retry_budget)).
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
    /// The slot's own walsender is a synchronous standby (`synchronous_standby_names` names its
    /// `application_name`, `lanestream`, or is `*`), and a transaction with a partial update the
    /// source must fill (P5: a table a sink does not hold yet) waits for it: its commit is
    /// visible to nobody until this source confirms it, and the source confirms it only after
    /// handing it over, which needs it visible. Returned after the transaction stayed invisible
    /// for [`SIDE_RETRY_BUDGET`](super::SIDE_RETRY_BUDGET); nothing of it was handed over.
    #[error(
        "the walsender of slot {slot:?} is a synchronous standby (synchronous_standby_names), and          transaction {xid} waits for this source to confirm it while the source waits for it to be          visible (to read the unchanged values of a partial update); leave application_name          'lanestream' out of synchronous_standby_names"
    )]
    SynchronousStandby {
        /// The slot.
        slot: String,
        /// The transaction held.
        xid: u32,
    },
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
pub(super) fn describe(e: &postgres::Error) -> String {
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
pub(super) fn describe_full(e: &postgres::Error) -> String {
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
pub(super) fn classify(e: postgres::Error, slot: &str) -> LiveError {
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
