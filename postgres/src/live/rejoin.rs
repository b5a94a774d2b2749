//! A table that rejoins the publication (P2, P4): found by reading the publication's tables
//! every [`LiveConfig::publication_check`](super::LiveConfig::publication_check), placed in
//! the stream by a logical message, and handed over as [`Op::Resync`] there.
//!
//! Why it is needed: pgoutput publishes a table's changes only while the table is in the
//! publication, and only what the WAL logs. A table removed from the publication and added
//! again has a gap in the stream: what changed meanwhile never comes. So has a table dropped
//! and created again under the same name (its index is the same); a table renamed away and
//! back (its changes meanwhile went to another index), or moved out of a published schema and
//! back; a table set `UNLOGGED` and `LOGGED` again (a bulk load: nothing of it is in the WAL);
//! and a table whose row filter or column list changed (rows the new filter admits were never
//! sent; rows it leaves out, or a column the new list leaves out, would stay in the sinks).
//! Every sink must then drop what it holds of the table and be backfilled ([`Op::Resync`]).
//!
//! How: each published table has a **token**: its membership (the publication's OID, the
//! table's relation OID, the OIDs of the `pg_publication_rel` and, from PostgreSQL 15,
//! `pg_publication_namespace` rows that publish it, its column list and row filter), and its
//! `pg_class` row's `xmin` (the transaction that last changed the row), what the row says
//! (hashed), and its file (`relfilenode`). A check reads them all (one query on the second
//! connection); when they differ from the last check's, it writes a **transactional** logical
//! message ([`REJOIN_PREFIX`], content `<slot>:<source id>:<check number>:<indexes changed>`),
//! which commits after every catalog change the check saw. When the stream hands that
//! message's transaction over, the tokens it carried are compared with those in force before
//! it: each index that rejoined (`Token::rejoined`: a new membership; a new file that no
//! `TRUNCATE` in the stream explains; a row changed that says what it said before, the mark of
//! a round trip), or that was not published before, is resynced at that transaction's commit
//! position, in the same positioned batch (one [`Op::Resync`] envelope each, with the table's
//! relation). Everything the stream sent of the table before that point — changes from before
//! the gap included — is then emptied by the sinks, and the backfill reads the table after it,
//! so every sink ends equal to the table as the publication publishes it. A catalog change the
//! check's query did not see yet is found by the next one.
//!
//! Not a rejoin: DDL that stays (a column added, a `GRANT`: the stream's relations carry the
//! new shape), a `TRUNCATE` (the stream carries it). The price: a round trip combined with a
//! change that stays, in one interval (renamed away and back, and a column added), is not seen,
//! nor a `SET UNLOGGED` / `LOGGED` round trip in the interval of a streamed `TRUNCATE` of the
//! same table; a rewrite that loses nothing (`VACUUM FULL`, `CLUSTER`) resyncs the table.
//!
//! A message of an earlier source of the same slot (it stopped before it handed its message
//! over) is honoured with the indexes it names, by the sinks that did not apply it yet.
//!
//! What it does not see: a table that rejoined while no source ran (between the slot's
//! confirmed position and the first check): the tokens in force there are not known.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use ahash::AHashMap;
use lanestream::{Batch, Envelope, IndexName, Op, Position, SinkName};

use super::{LiveError, LiveSource};
use crate::backfill::TablePlan;
use crate::batch::index_name;

/// The prefix of the check's logical messages.
pub const REJOIN_PREFIX: &str = "lanestream.publication";

/// A published table's token (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Token {
    /// The publication's and the table's OIDs, the rows that publish it, its column list and
    /// row filter.
    membership: String,
    /// The `xmin` of the table's `pg_class` row: the transaction that last changed it.
    xmin: String,
    /// What the row says (its name, schema, persistence, number of columns, owner, ACL,
    /// options...; not its file or statistics), hashed.
    row: String,
    /// Its `relfilenode` (a `TRUNCATE` or a rewrite gives the table a new file).
    file: String,
}

impl Token {
    /// Whether the table rejoined between `self` (in force before) and `now`:
    /// - its membership changed (removed and added again, dropped and created again, its row
    ///   filter or column list changed);
    /// - or it has a new file that no `TRUNCATE` in the stream explains (`truncated`: one was
    ///   handed over meanwhile): set `UNLOGGED` and back, or rewritten (`ALTER COLUMN ... TYPE`
    ///   converts every row without streaming it);
    /// - or its `pg_class` row was changed and says what it said before: renamed away and
    ///   back, or moved out of a published schema and back (a change that stays, such as a
    ///   column added or a `GRANT`, is DDL whose new shape the stream's relations carry).
    fn rejoined(&self, now: &Token, truncated: bool) -> bool {
        self.membership != now.membership
            || (self.file != now.file && !truncated)
            || (self.xmin != now.xmin && self.row == now.row && self.file == now.file)
    }
}

/// Each published index's token.
type Tokens = AHashMap<IndexName, Token>;

/// The check whose message the open transaction carries.
#[derive(Debug)]
pub(super) enum Check {
    /// One of this source: its number.
    Own(u64),
    /// One of an earlier source of the same slot: the indexes it found changed.
    Earlier(Vec<IndexName>),
}

/// What the checks know.
#[derive(Debug, Default)]
pub(super) struct Rejoins {
    /// The tokens in force at the stream's position: read at the first check, then those of
    /// the last message handed over. `None` before the first check.
    in_force: Option<Tokens>,
    /// Those of the last check that wrote a message (or the first): what the next check
    /// compares with.
    last_read: Tokens,
    /// Messages written and not yet handed over: their number and tokens, in order.
    written: VecDeque<(u64, Tokens)>,
    /// The indexes the stream truncated since the tokens in force.
    truncated: ahash::AHashSet<IndexName>,
    /// The number of the next message.
    next: u64,
    /// When the last check was tried.
    checked: Option<Instant>,
    /// `server_version_num`, once read.
    version: Option<i32>,
    /// What each local sink had applied at [`Source::start`](crate::pipeline::Source::start).
    pub(super) applied: Vec<(SinkName, Option<Position>)>,
}

impl LiveSource {
    /// Checks the publication's tables when due
    /// ([`LiveConfig::publication_check`](super::LiveConfig::publication_check)).
    ///
    /// A check that finds the second connection lost (a server restart: the stream's
    /// reconnect deals with it) is tried again at the next interval, without waiting here: a
    /// rejoin is then found late, never missed, since each check compares with the tokens of
    /// the last message written, and a message is counted as written only once it is.
    pub(super) fn check_publication_if_due(&mut self) -> Result<(), LiveError> {
        let Some(every) = self.config.publication_check else { return Ok(()) };
        if self.rejoins.checked.is_some_and(|at| at.elapsed() < every) {
            return Ok(());
        }
        self.rejoins.checked = Some(Instant::now());
        match self.check_publication() {
            Err(LiveError::Side { .. }) => Ok(()),
            checked => checked,
        }
    }

    /// Reads the publication's tables, and writes a message when they changed since the last
    /// one written.
    fn check_publication(&mut self) -> Result<(), LiveError> {
        let version = match self.rejoins.version {
            Some(v) => v,
            None => {
                let v: i32 = self.side()?.run(
                    Duration::ZERO,
                    || "reading the server's version".into(),
                    |c| {
                        c.query_one("SELECT current_setting('server_version_num')::int", &[])
                            .map(|r| r.get(0))
                    },
                )?;
                self.rejoins.version = Some(v);
                v
            }
        };
        let tokens = self.publication_tokens(version)?;
        let rejoins = &mut self.rejoins;
        if rejoins.in_force.is_none() {
            rejoins.in_force = Some(tokens.clone());
            rejoins.last_read = tokens;
            return Ok(());
        }
        if tokens == rejoins.last_read {
            return Ok(());
        }
        let number = rejoins.next;
        rejoins.next += 1;
        let mut changed: Vec<&str> = tokens
            .iter()
            .filter(|(index, token)| rejoins.last_read.get(*index) != Some(*token))
            .map(|(index, _)| index.as_str())
            .collect();
        changed.sort_unstable();
        let content =
            format!("{}:{}:{number}:{}", self.config.slot, self.backfiller.source_id(), changed.join(","));
        self.side()?.run(
            Duration::ZERO,
            || "writing the publication check's message".into(),
            |c| {
                c.execute(
                    "SELECT pg_logical_emit_message(true, $1::text, $2::text)",
                    &[&REJOIN_PREFIX, &content],
                )
            },
        )?;
        self.rejoins.written.push_back((number, tokens.clone()));
        self.rejoins.last_read = tokens;
        Ok(())
    }

    /// The token of each table of the publication (see the module docs).
    fn publication_tokens(&mut self, version: i32) -> Result<Tokens, LiveError> {
        let publication = self.config.publication.clone();
        // From 15: the column list and row filter, and the schemas a publication names.
        let (list, schema) = if version >= 150000 {
            (
                "coalesce(r.prattrs::text, '') || ':' || coalesce(r.prqual::text, '')",
                "coalesce((SELECT n.oid::text FROM pg_publication_namespace n \
                 WHERE n.pnpubid = p.oid AND n.pnnspid = c.relnamespace), '')",
            )
        } else {
            ("''", "''")
        };
        let sql = format!(
            "SELECT t.schemaname::text, t.tablename::text, \
             p.oid::text || ':' || c.oid::text || ':' || coalesce(r.oid::text, '') || ':' || {list} || ':' || {schema}, \
             c.xmin::text, \
             md5(row(c.relname, c.relnamespace, c.reltype, c.relowner, c.relam, c.relpersistence, \
             c.relkind, c.relnatts, c.relchecks, c.relhasrules, c.relhastriggers, c.relrowsecurity, \
             c.relforcerowsecurity, c.relreplident, c.relispartition, c.relacl, c.reloptions)::text), \
             c.relfilenode::text \
             FROM pg_publication p \
             JOIN pg_publication_tables t ON t.pubname = p.pubname \
             JOIN pg_namespace s ON s.nspname = t.schemaname \
             JOIN pg_class c ON c.relnamespace = s.oid AND c.relname = t.tablename \
             LEFT JOIN pg_publication_rel r ON r.prpubid = p.oid AND r.prrelid = c.oid \
             WHERE p.pubname = $1::text"
        );
        let rows = self.side()?.run(
            Duration::ZERO,
            || "reading the publication's tables".into(),
            |c| c.query(sql.as_str(), &[&publication]),
        )?;
        Ok(rows
            .iter()
            .map(|row| {
                let token =
                    Token { membership: row.get(2), xmin: row.get(3), row: row.get(4), file: row.get(5) };
                (index_name(row.get(0), row.get(1)), token)
            })
            .collect())
    }

    /// The stream hands `batch` over: its truncates, which explain a new file of their table
    /// at the next check's message ([`Token::rejoined`]).
    pub(super) fn note_truncates(&mut self, batch: &Batch) {
        if self.config.publication_check.is_none() {
            return;
        }
        for e in batch.envelopes.iter().filter(|e| e.op == Op::Truncate) {
            self.rejoins.truncated.insert(e.index.clone());
        }
    }

    /// A logical message of the open transaction with [`REJOIN_PREFIX`], kept for its commit
    /// ([`rejoined_at`](Self::rejoined_at)) when it is of this slot: a check of this source
    /// (its number), or of an earlier source of the slot (the indexes it found changed: that
    /// source stopped before it handed the message over).
    pub(super) fn on_rejoin_message(&mut self, content: &[u8]) {
        let Some(text) = std::str::from_utf8(content).ok() else { return };
        let mut parts = text.splitn(4, ':');
        let (Some(slot), Some(source), Some(number), Some(changed)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return;
        };
        if slot != self.config.slot {
            return;
        }
        self.open_check = if source == self.backfiller.source_id() {
            number.parse().ok().map(Check::Own)
        } else {
            Some(Check::Earlier(changed.split(',').filter_map(|i| IndexName::new(i).ok()).collect()))
        };
    }

    /// The transaction of a check's message commits at `position` (its batch is handed over
    /// now: the check's message, once): the batch of the indexes it resyncs, if any, each
    /// already resynced in the backfills being served and `unheld` by every local sink (P5).
    pub(super) fn rejoined_at(&mut self, position: Position) -> Option<Batch> {
        let number = match self.open_check.take()? {
            Check::Own(number) => number,
            Check::Earlier(mut resynced) => {
                resynced.sort_unstable();
                resynced.dedup();
                // The local sinks that applied it before skip it again: their backfills stay.
                let applied: Vec<SinkName> = (self.rejoins.applied.iter())
                    .filter(|(_, at)| at.is_some_and(|at| at >= position))
                    .map(|(sink, _)| sink.clone())
                    .collect();
                return self.resync_at(position, resynced, &applied);
            }
        };
        let rejoins = &mut self.rejoins;
        // Messages come in the order they were written; one not come is not coming (its
        // transaction was handed over before this source saw it).
        while rejoins.written.front().is_some_and(|(n, _)| *n < number) {
            rejoins.written.pop_front();
        }
        if rejoins.written.front().is_none_or(|(n, _)| *n != number) {
            return None; // written by this source, but not counted: its write's reply was lost
        }
        let (_, tokens) = rejoins.written.pop_front()?;
        let mut resynced: Vec<IndexName> = tokens
            .iter()
            .filter(|(index, token)| {
                rejoins.in_force.as_ref().is_some_and(|in_force| {
                    in_force
                        .get(*index)
                        .is_none_or(|old| old.rejoined(token, rejoins.truncated.contains(*index)))
                })
            })
            .map(|(index, _)| index.clone())
            .collect();
        rejoins.in_force = Some(tokens);
        rejoins.truncated.clear();
        resynced.sort_unstable();
        self.resync_at(position, resynced, &[])
    }

    /// The batch at `position` that resyncs `resynced` (`None` for none), each resynced in the
    /// backfills being served but those of `applied` (sinks that applied it before: they skip
    /// it) and `unheld` by every other local sink (P5).
    fn resync_at(
        &mut self,
        position: Position,
        resynced: Vec<IndexName>,
        applied: &[SinkName],
    ) -> Option<Batch> {
        if resynced.is_empty() {
            return None;
        }
        let applied_count = u32::try_from(applied.len()).unwrap_or(u32::MAX);
        // P6: each resync carries its table's shape, as every change does (a sink finds its
        // table by it: the SQLite example does): the table as the backfill will read it.
        let mut relations = Vec::with_capacity(resynced.len());
        for index in &resynced {
            let publication = self.config.publication.clone();
            let plan = self.side().ok().and_then(|mut side| {
                side.run(
                    super::SIDE_RETRY_BUDGET,
                    || format!("finding the table of index {index}"),
                    |c| TablePlan::resolve(c, &publication, index),
                )
                .ok()
            });
            relations.push(plan.and_then(Result::ok).map(|plan| plan.relation));
        }
        for index in &resynced {
            self.backfiller.resync(index, applied);
            if let Some((seen, sinks)) = &mut self.seen {
                seen.insert(index.clone());
                *self.unheld.entry(index.clone()).or_default() += sinks.saturating_sub(applied_count);
            }
        }
        self.metrics.resyncs += resynced.len() as u64;
        let envelopes: std::sync::Arc<[Envelope]> = resynced
            .into_iter()
            .zip(relations)
            .map(|(index, relation)| Envelope {
                index,
                id: String::new(),
                op: Op::Resync,
                position: Some(position),
                document: bytes::Bytes::new(),
                built_at_micros: None,
                relation,
                old_id: None,
                unchanged: Vec::new(),
            })
            .collect();
        Some(Batch::new(Some(position), envelopes))
    }
}
