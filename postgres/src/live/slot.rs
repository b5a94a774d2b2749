//! The slot: taking it at connect (the server's checks, the publication, the slot created or
//! found, the advisory lock, waiting for a holder to let go), the start-up check against the
//! sinks' states, and reading it back (its confirmed position, its lag).

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use lanestream::{IndexName, Position};
use postgres::Client;

use super::error::{classify, LiveError};
use super::reader::instance_id;
use super::side::{connect_one, lsn_of, origin_of, try_lock, Side};
use super::{LiveConfig, LiveMetrics, LiveSource, SlotPositions, HEARTBEAT_PREFIX, SIDE_RETRY_BUDGET};
use crate::pipeline::Joiners;
use std::collections::VecDeque;

use crate::backfill::Backfiller;
use crate::batch::index_name;
use crate::batch::TransactionBuilder;
use crate::pgoutput::PgOutputDecoder;
use crate::pipeline::{SinkStart, SourceStart};

/// Creates `publication` for every table of the database that can be published, `FOR TABLE`
/// (tables created later are not in it until added: the pipeline then backfills them), or
/// refuses, naming them, while a table has no replica identity ([P9](crate::pipeline::state)):
/// publishing its updates would make PostgreSQL refuse the application's own `UPDATE` and
/// `DELETE` on it. Partitions are checked (each needs an identity of its own) and published
/// through their parent.
fn create_publication(client: &mut Client, publication: &str) -> Result<(), LiveError> {
    let rows = client.query(
        "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname), n.nspname || '.' || c.relname, \
         c.relispartition, c.relkind::text, \
         c.relreplident = 'f' OR EXISTS (SELECT FROM pg_index i WHERE i.indrelid = c.oid \
           AND CASE WHEN c.relreplident = 'i' THEN i.indisreplident \
                    WHEN c.relreplident = 'd' THEN i.indisprimary ELSE false END) \
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relkind IN ('r', 'p') AND c.relpersistence = 'p' \
         AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_toast%' \
         ORDER BY 2",
        &[],
    )?;
    let mut publish = Vec::new();
    let mut refused = Vec::new();
    for row in &rows {
        let (quoted, name, partition, kind, identity): (String, String, bool, String, bool) =
            (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
        // A partitioned table's rows live in its partitions, checked one by one.
        if !identity && kind == "r" {
            refused.push(name.clone());
        }
        if !partition {
            publish.push((quoted, name));
        }
    }
    let quoted = format!("\"{}\"", publication.replace('"', "\"\""));
    if !refused.is_empty() {
        let usable: Vec<&str> =
            publish.iter().filter(|(_, name)| !refused.contains(name)).map(|(q, _)| q.as_str()).collect();
        let suggestion = if usable.is_empty() {
            "(no table can be published as it is)".to_owned()
        } else {
            format!("CREATE PUBLICATION {quoted} FOR TABLE {}", usable.join(", "))
        };
        return Err(LiveError::UnpublishableTables {
            publication: publication.to_owned(),
            tables: refused,
            suggestion,
        });
    }
    if publish.is_empty() {
        return Err(LiveError::PublicationEmpty(publication.to_owned()));
    }
    let tables: Vec<&str> = publish.iter().map(|(q, _)| q.as_str()).collect();
    client.batch_execute(&format!("CREATE PUBLICATION {quoted} FOR TABLE {}", tables.join(", ")))?;
    Ok(())
}

impl LiveSource {
    /// Connects, checks the server and the publication, and takes the slot (creating the
    /// publication and the slot if `config.create_slot`). Does not start streaming: see
    /// [`open`](Self::open).
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
                create_publication(&mut client, &publication)?
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
        let origin = origin_of(&mut client)?;
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
            sent: None,
            origin,
            positions,
            postmaster_start,
            last_heartbeat: Instant::now(),
            metrics: LiveMetrics::default(),
            open_xid: None,
            backfiller,
            unheld: Default::default(),
            seen: None,
            rejoins: Default::default(),
            open_check: None,
            unheld_plans: Default::default(),
            reader: None,
            out: VecDeque::new(),
            decoder: PgOutputDecoder::new(TransactionBuilder::new()),
            opened: false,
            end: None,
            naps: 0,
            forwarded: None,
            invisible: None,
            published: None,
            last_idle: None,
        };
        source.wait_until_free(deadline)?;
        // The decoder asks the catalog on the second connection for a table's key (REPLICA
        // IDENTITY FULL).
        Ok(source
            .with_builder(TransactionBuilder::new().with_max_batch_changes(Some(super::MAX_BATCH_CHANGES))))
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

    /// Drops the slot this source created at connect (a start refused over sinks that hold
    /// data); does nothing for a slot it did not create.
    ///
    /// # Errors
    /// [`LiveError`] from the server.
    pub fn drop_created_slot(&mut self) -> Result<(), LiveError> {
        if !self.positions.created {
            return Ok(());
        }
        self.stop();
        let slot = self.config.slot.clone();
        self.side()?.run(
            SIDE_RETRY_BUDGET,
            || "dropping the slot created over sinks that hold data".into(),
            |c| c.execute("SELECT pg_drop_replication_slot($1::text)", &[&slot]),
        )?;
        self.positions.created = false;
        Ok(())
    }

    /// The index names ([`index_name`]) of the tables the
    /// publication publishes now (`pg_publication_tables`), in order, without repeats.
    ///
    /// # Errors
    /// [`LiveError`] from the second connection.
    pub fn published_indexes(&mut self) -> Result<Vec<IndexName>, LiveError> {
        let publication = self.config.publication.clone();
        let rows = self.side()?.run(
            SIDE_RETRY_BUDGET,
            || "listing the publication's tables".into(),
            |c| {
                c.query(
                    "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1::text \
                     ORDER BY 1, 2",
                    &[&publication],
                )
            },
        )?;
        let mut indexes: Vec<IndexName> = Vec::with_capacity(rows.len());
        for row in rows {
            let index = index_name(row.get(0), row.get(1));
            if !indexes.contains(&index) {
                indexes.push(index);
            }
        }
        Ok(indexes)
    }

    /// [`Source::start`](crate::pipeline::Source::start) of the live source: refuses
    /// ([`LiveError::SlotGap`]) to resume the slot past a sink's data — a slot this source
    /// created now, over sinks that hold data (it is dropped again), or a slot whose confirmed
    /// position is past a sink's [`SinkState::applied`](crate::pipeline::SinkState::applied)
    /// position (dropped and created again, or advanced by hand) — and gives the driver its
    /// origin (the database), its history (always: the tables may hold rows) and the indexes of
    /// the publication's tables.
    pub(super) fn check_start(&mut self, sinks: &[SinkStart<'_>]) -> Result<SourceStart, LiveError> {
        let positions = self.positions;
        let resumes_from = positions.confirmed_flush.or(positions.consistent_point);
        for s in sinks {
            let Some(state) = s.state.filter(|state| state.holds_data()) else { continue };
            let applied = state.applied();
            let gap = match (applied, resumes_from) {
                (_, _) if positions.created => true,
                (Some(applied), Some(resume)) => resume > applied,
                _ => false,
            };
            if gap {
                let dropped = positions.created;
                if dropped {
                    self.drop_created_slot()?;
                }
                return Err(LiveError::SlotGap {
                    slot: self.config.slot.clone(),
                    sink: s.sink.to_string(),
                    applied,
                    resumes_from: resumes_from.unwrap_or(Position(0)),
                    dropped,
                });
            }
        }
        let indexes = self.published_indexes()?;
        // P5: what each local sink may not hold yet (its backfill is asked after this).
        self.unheld.clear();
        for s in sinks {
            let mut missing: Vec<&IndexName> = match s.state {
                None if s.joiners == Joiners::Backfill => indexes.iter().collect(),
                None => Vec::new(),
                Some(state) => state
                    .owed
                    .iter()
                    .flat_map(|o| o.indexes.iter())
                    .chain(
                        indexes
                            .iter()
                            .filter(|i| state.indexes.as_ref().is_some_and(|held| !held.contains(*i))),
                    )
                    .collect(),
            };
            missing.sort_unstable();
            missing.dedup();
            for index in missing {
                *self.unheld.entry(index.clone()).or_default() += 1;
            }
        }
        // What each local sink applied: a check's message of an earlier source of the slot at
        // or before it is one that sink applied already (see `rejoin.rs`).
        self.rejoins.applied =
            sinks.iter().map(|s| (s.sink.clone(), s.state.and_then(|state| state.applied()))).collect();
        let local = u32::try_from(sinks.len()).unwrap_or(u32::MAX);
        self.seen = (local > 0).then(|| (indexes.iter().cloned().collect(), local));
        Ok(SourceStart::new(Some(self.origin.clone()), true, resumes_from, Some(indexes)))
    }

    pub(super) fn heartbeat_if_due(&mut self) -> Result<(), LiveError> {
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
}
