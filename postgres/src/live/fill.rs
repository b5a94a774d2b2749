//! P5 at the seams: a partial update (unchanged TOASTed values left out) of a table a local sink
//! may not hold yet goes out whole, its unchanged values read from the table on the second
//! connection, once its transaction is visible there; until then its batch waits, and the
//! stream behind it ([`LiveSource::invisible`](super::LiveSource)).

use std::thread;
use std::time::{Duration, Instant};

use lanestream::Batch;

use super::error::LiveError;
use super::{Invisible, LiveSource};
use crate::pipeline::SourceItem;

/// How often [`wait_visible`](LiveSource::wait_visible) looks again whether a waiting batch's
/// transaction is visible (the first second; 25 times that after).
const INVISIBLE_RETRY: Duration = Duration::from_millis(2);

/// What [`wait_visible`](LiveSource::wait_visible) found.
pub(super) enum Hold {
    /// No batch waits.
    None,
    /// The waiting batch's transaction is visible: it is filled and queued.
    Released,
    /// It still waits, a retry interval later.
    Waiting,
    /// It still waits, and the caller's deadline passed.
    Timeout,
}

impl LiveSource {
    /// One look at the batch waiting to be visible, if any: released (filled and queued) once
    /// its transaction is; else a retry interval's sleep (2 ms the first second, 50 ms after),
    /// or [`Hold::Timeout`] past `deadline`.
    ///
    /// # Errors
    /// [`LiveError::SynchronousStandby`] when it waited [`SIDE_RETRY_BUDGET`](super::SIDE_RETRY_BUDGET)
    /// and this source's own walsender is a synchronous standby (the commit waits for this
    /// source, which waits for the commit); the second connection's errors.
    pub(super) fn wait_visible(&mut self, deadline: Instant) -> Result<Hold, LiveError> {
        let Some((xid, since)) = self.invisible.as_ref().map(|held| (held.xid, held.since)) else {
            return Ok(Hold::None);
        };
        if self.visible(xid)? {
            if let Some(held) = self.invisible.take() {
                self.queue(held.batch, Some(held.xid), true)?;
            }
            return Ok(Hold::Released);
        }
        let held = since.elapsed();
        if held >= super::SIDE_RETRY_BUDGET && self.synchronous_standby()? {
            return Err(LiveError::SynchronousStandby { slot: self.config.slot.clone(), xid });
        }
        if Instant::now() >= deadline {
            return Ok(Hold::Timeout);
        }
        // Every 2 ms at first (a commit's visibility usually follows its flush within one),
        // then every 50 ms.
        thread::sleep(if held < Duration::from_secs(1) { INVISIBLE_RETRY } else { INVISIBLE_RETRY * 25 });
        Ok(Hold::Waiting)
    }

    /// A batch decoded: its partial updates of tables being backfilled are filled in, the
    /// backfill sees it (its keys leave a waiting chunk), then it is queued. A batch with
    /// updates to fill waits, whole, until its transaction is visible on the second connection
    /// ([`LiveSource::invisible`]).
    pub(super) fn hand_over(&mut self, batch: Batch) -> Result<(), LiveError> {
        self.note_joined(&batch);
        self.note_truncates(&batch);
        let xid = self.open_xid;
        if !self.fills(&batch) {
            return self.queue(batch, xid, false);
        }
        if let Some(id) = xid {
            if !self.visible(id)? {
                let commit = batch.position.or(self.open_commit);
                self.invisible = Some(Invisible { batch, xid: id, since: Instant::now(), commit });
                return Ok(());
            }
        }
        self.queue(batch, xid, true)
    }

    /// The rest of [`hand_over`](Self::hand_over), once the batch's transaction `xid` (the one
    /// open when it was decoded) is visible; `fill`: it has partial updates to fill.
    fn queue(&mut self, batch: Batch, xid: Option<u32>, fill: bool) -> Result<(), LiveError> {
        let batch = if fill { self.fill_partial(batch)? } else { batch };
        self.backfiller.observe(xid, &batch);
        self.out.push_back(SourceItem::Change(batch));
        Ok(())
    }

    /// A table that joined while running (its index neither published at start nor seen
    /// since): every local sink owes its backfill from this change on (the sink engines detect
    /// it, P2), so its partial updates go out whole until each sink's backfill of it completes.
    fn note_joined(&mut self, batch: &Batch) {
        let Some((seen, sinks)) = &mut self.seen else { return };
        let mut last = None;
        for e in batch.envelopes.iter() {
            if last == Some(&e.index) {
                continue; // a batch's envelopes mostly share their index: one look-up each
            }
            last = Some(&e.index);
            if !seen.contains(&e.index) {
                seen.insert(e.index.clone());
                *self.unheld.entry(e.index.clone()).or_default() += *sinks;
            }
        }
    }

    /// P5 during a backfill: a partial update (unchanged TOASTed values left out) of a table a
    /// local sink may not hold yet — one still to be backfilled, one a sink's state owes or
    /// lacks ([`LiveSource::unheld`], from [`Source::start`](crate::pipeline::Source::start),
    /// before its request is served), or one that joined while running — may reach a sink that
    /// does not hold its row, and the backfill then leaves that row out of its chunk (a newer
    /// change of it was handed over), or has already passed its new key. So its unchanged values
    /// are read from the table, by the row's key on the second connection, once its transaction
    /// is visible there, and the update goes out whole. The values read may be newer than the
    /// update: every later change of the row follows it in the stream, so the sink ends equal to
    /// the table. A row gone meanwhile (a later change deleted it or moved it to another key)
    /// goes out as a delete of its id, which that later change agrees with; a value that does
    /// not convert leaves the update partial.
    ///
    /// Called for a batch that [`fills`](Self::fills), once its transaction is visible there
    /// ([`hand_over`](Self::hand_over)):
    /// PostgreSQL sends a transaction (with the protocol version 1 the source asks for: whole,
    /// its chunks too) once its commit record is flushed, a moment before other sessions see it
    /// (longer when its commit waits for a synchronous standby), and read before, a row it moved
    /// to a new key would look gone (and go out as a delete).
    fn fill_partial(&mut self, batch: Batch) -> Result<Batch, LiveError> {
        // The plans of unheld tables that are not being backfilled, looked up once.
        let mut missing: Vec<lanestream::IndexName> = batch
            .envelopes
            .iter()
            .filter(|e| {
                e.is_partial()
                    && self.unheld.contains_key(&e.index)
                    && self.backfiller.plan_of(&e.index).is_none()
                    && !self.unheld_plans.contains_key(&e.index)
            })
            .map(|e| e.index.clone())
            .collect();
        missing.dedup();
        let publication = self.config.publication.clone();
        for index in missing {
            let plan = self.side()?.run(
                super::SIDE_RETRY_BUDGET,
                || format!("finding the table of index {index}"),
                |c| crate::backfill::TablePlan::resolve(c, &publication, &index),
            )?;
            self.unheld_plans.insert(index, plan.ok());
        }
        let mut envelopes = batch.envelopes.to_vec();
        let mut filled = 0;
        let mut stale = Vec::new();
        for e in &mut envelopes {
            if !e.is_partial() {
                continue;
            }
            let from_job = self.backfiller.plan_of(&e.index);
            let Some(plan) = from_job.or_else(|| self.unheld_plans.get(&e.index).and_then(Option::as_ref))
            else {
                continue;
            };
            let sql = plan.select_row(&e.id, &e.unchanged).map_err(|reason| LiveError::BackfillRefused {
                index: e.index.as_str().to_owned(),
                reason,
            })?;
            let Some(sql) = sql else {
                // A column the plan does not know: the table changed since (DDL); look it up
                // again next time.
                if from_job.is_none() {
                    stale.push(e.index.clone());
                }
                continue;
            };
            let rows = self.side()?.run(
                super::SIDE_RETRY_BUDGET,
                || format!("reading the unchanged values of row {:?} of {}", e.id, plan.table),
                |c| c.simple_query(&sql),
            )?;
            let row = rows.iter().find_map(|m| match m {
                postgres::SimpleQueryMessage::Row(r) => Some(r),
                _ => None,
            });
            match row {
                Some(r) => {
                    if let Some(document) = plan.fill_document(&e.document, &e.unchanged, r) {
                        e.document = document.into();
                        e.unchanged.clear();
                        filled += 1;
                    }
                }
                // Gone since: a later change in the stream deleted the row or moved it to
                // another key. The sink must not hold it here then: a delete of its id (the
                // move's own delete, if this was one, follows as before).
                None => {
                    e.op = lanestream::Op::Delete;
                    e.old_id = None;
                    e.unchanged.clear();
                    filled += 1;
                }
            }
        }
        for index in stale {
            self.unheld_plans.remove(&index);
        }
        self.metrics.partial_filled += filled;
        Ok(Batch { envelopes: envelopes.into(), ..batch })
    }

    /// Whether `batch` has a partial update to fill ([`fill_partial`](Self::fill_partial)).
    fn fills(&self, batch: &Batch) -> bool {
        batch.envelopes.iter().any(|e| {
            e.is_partial()
                && (self.unheld.contains_key(&e.index) || self.backfiller.plan_of(&e.index).is_some())
        })
    }

    /// Whether the slot's walsender is a synchronous standby now (`pg_stat_replication`'s
    /// `sync_state` of the slot's active PID is `sync` or `quorum`; one query).
    fn synchronous_standby(&mut self) -> Result<bool, LiveError> {
        let slot = self.config.slot.clone();
        let state: Option<String> = self.side()?.run(
            super::SIDE_RETRY_BUDGET,
            || "reading the slot's walsender's sync_state".into(),
            |c| {
                c.query_opt(
                    "SELECT r.sync_state::text FROM pg_stat_replication r \
                     JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1::text",
                    &[&slot],
                )
                .map(|row| row.map(|r| r.get(0)))
            },
        )?;
        Ok(matches!(state.as_deref(), Some("sync" | "quorum")))
    }

    /// Whether the committed transaction `xid` is visible to a new snapshot of the second
    /// connection (one query).
    fn visible(&mut self, xid: u32) -> Result<bool, LiveError> {
        let snapshot: String = self.side()?.run(
            super::SIDE_RETRY_BUDGET,
            || "reading the current snapshot".into(),
            |c| c.query_one("SELECT pg_current_snapshot()::text", &[]).map(|r| r.get(0)),
        )?;
        Ok(crate::backfill::XidSnapshot::parse(&snapshot).is_none_or(|s| s.visible(xid)))
    }
}
