//! The sinks the library's engines run: the library's durable NDJSON sink (or a plain NDJSON file, or nothing with --discard), with the harness's faults: --chaos (runs failed at random, so that the engine releases them, re-attaches and gets them again; one backfill request), --slow-sink, --kill-sink-after (the engine dies holding an applied, unacked run, and its new instance opens from the checkpoint after --sink-down-ms); and what the checks need: what each sink received.

use lanestream::prelude::*;
use lanestream_postgres::ndjson::NdjsonError;
use lanestream_postgres::pipeline::{LatencySummary, Sink, SinkState};

use crate::prelude::*;

/// The two kinds of lane item a sink is delivered.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    /// A [`Batch`]: a transaction (positioned) or a chunk of snapshot rows (unpositioned).
    Batch,
    /// A `SnapshotComplete` marker, ending a backfill.
    Marker,
}

impl Kind {
    pub(crate) fn of(item: &LaneItem) -> Kind {
        match item {
            LaneItem::Batch(_) => Kind::Batch,
            LaneItem::SnapshotComplete { .. } => Kind::Marker,
            other => unreachable!("a lane item this harness does not know: {other:?}"),
        }
    }
}

/// What one sink did with the deliveries of one [`Kind`] of lane item. These count deliveries: an
/// item delivered three times (first delivery and two redeliveries) counts three times.
#[derive(Default, Clone, Copy)]
pub(crate) struct Deliveries {
    /// Received from the lane, redeliveries included.
    pub(crate) delivered: u64,
    /// Of `delivered`, redeliveries (attempt > 1), as the sink engine counts them (for the
    /// batches: every item kind, markers included).
    pub(crate) redelivered: u64,
    /// Of `processed`, released un-acked because --chaos failed their run (or the engine was
    /// killed holding them): redelivered to the re-attached engine.
    pub(crate) nacked: u64,
    /// Of `delivered`, processed (recorded, and written unless --discard).
    pub(crate) processed: u64,
    /// Of `processed`, seen before by this sink: items processed again.
    pub(crate) processed_again: u64,
    /// Of `processed`, whose ack was refused because a consumer re-attach took the item back
    /// first (`AckError::Detached`), as the engine counts them (for the batches: every kind).
    pub(crate) acks_refused: u64,
}

/// What a sink did (over every instance its engine opened).
#[derive(Default)]
pub(crate) struct SinkReport {
    pub(crate) name: String,
    /// Every positioned batch received at least once, and how many of its envelopes.
    pub(crate) received: Received,
    /// Envelopes of positioned batches received again after a first receipt.
    pub(crate) envelopes_received_again: u64,
    pub(crate) batches: Deliveries,
    pub(crate) markers: Deliveries,
    pub(crate) bytes_written: u64,
    /// Re-attaches of the sink engine (one per failed run: --chaos, --kill-sink-after).
    pub(crate) reattaches: u64,
    pub(crate) backfill_requested: bool,
    /// Envelopes of unpositioned (snapshot) batches processed, per processed delivery.
    pub(crate) snapshot_envelopes: u64,
    pub(crate) error: Option<String>,
    /// Items the sink's state covered (received again after a restart, acked without reaching
    /// the sink: the engine's count).
    pub(crate) covered: u64,
    /// The last transaction the sink's state records at the end.
    pub(crate) checkpoint: Option<Position>,
    /// The last transaction its durable state recorded when its engine first opened it (live
    /// mode): the transactions the source sends again up to there are covered by the state, so
    /// the engine acks them without handing them to the sink.
    pub(crate) started_at: Option<Position>,
    /// Whether `started_at` was read.
    pub(crate) state_read: bool,
    /// --kill-sink-after: what the engine's death showed.
    pub(crate) kill: Option<KillReport>,
    /// From each transaction's commit to this sink's ack of it (live mode: the commit time the
    /// decoder records on the envelopes).
    pub(crate) commit_to_ack: LatencySummary,
}

/// One kill of a sink engine (--kill-sink-after) and its re-attach.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct KillReport {
    /// Batches the dead engine held without acking (its run in hand, applied, not committed;
    /// taken back by the re-attach).
    pub(crate) held_unacked: u64,
    /// The lane's acked position when the engine died.
    #[serde(serialize_with = "ser_lsn")]
    pub(crate) acked_at_death: Option<Position>,
    /// The highest watermark read while it was dead (every 5 ms): never past `acked_at_death`.
    #[serde(serialize_with = "ser_lsn")]
    pub(crate) max_watermark_while_down: Option<Position>,
    /// The highest acked position of another lane read meanwhile: past `acked_at_death` when
    /// the other sinks went on, so the dead sink is what held the watermark back.
    #[serde(serialize_with = "ser_lsn")]
    pub(crate) others_acked_while_down: Option<Position>,
    /// Of those, delivered again to the new engine.
    pub(crate) redelivered_after_reattach: u64,
}

pub(crate) fn ser_lsn<S: serde::Serializer>(p: &Option<Position>, s: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&p.map(|p| p.to_string()), s)
}

/// What the sink engine to kill needs: when, for how long, and the stream to watch meanwhile.
pub(crate) struct Kill {
    pub(crate) after: u64,
    pub(crate) down: Duration,
    pub(crate) stream: MemoryStream,
    pub(crate) others: Vec<String>,
}

/// Why a harness sink's run failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SinkError {
    #[error(transparent)]
    Ndjson(#[from] NdjsonError),
    #[error("{0}")]
    Io(#[from] io::Error),
    /// A fault the harness injected (the engine retries it).
    #[error("{0}")]
    Injected(&'static str),
    #[error("backfill request: {0}")]
    Request(String),
}

/// A sink's state over its engine's instances.
pub(crate) struct SinkShared {
    pub(crate) report: SinkReport,
    pub(crate) lane: SinkName,
    /// The plain output (no checkpoint): flushed at each commit, kept across instances.
    pub(crate) plain: Option<BufWriter<File>>,
    /// Durable outputs are reopened per instance from here (from the checkpoint).
    pub(crate) durable_dir: Option<PathBuf>,
    pub(crate) slow: Option<Duration>,
    pub(crate) chaos: Option<StdRng>,
    /// --chaos failed the last run: the next one goes through (the engine's retry budget is
    /// for the sink's own failures).
    chaos_failed_last: bool,
    pub(crate) requests: lanestream::RequestSender,
    /// --kill-sink-after (the first sink only): pending until it fires.
    pub(crate) kill: Option<Kill>,
    /// The kill fired: the next instance waits the down time first.
    pub(crate) killed: Option<Kill>,
    /// The dead engine's run: (position, offset) of its batches, to count them when they come again.
    pub(crate) dead_run: Vec<(u64, u64)>,
    line: Vec<u8>,
}

/// A batch's key: its transaction's position and its offset in it (`None` for snapshot rows).
fn key(item: &LaneItem) -> Option<(u64, u64)> {
    let LaneItem::Batch(b) = item else { return None };
    let position = b.position.or_else(|| b.envelopes.first().and_then(|e| e.position))?;
    Some((position.0, b.offset))
}

impl SinkShared {
    pub(crate) fn new(lane: SinkName, requests: lanestream::RequestSender) -> Self {
        SinkShared {
            report: SinkReport { name: lane.to_string(), ..SinkReport::default() },
            lane,
            plain: None,
            durable_dir: None,
            slow: None,
            chaos: None,
            chaos_failed_last: false,
            requests,
            kill: None,
            killed: None,
            dead_run: Vec::new(),
            line: Vec::with_capacity(4096),
        }
    }

    /// Opens an instance: at the engine's start, and after each failed run (after the down time
    /// and a watch of the watermark if the engine was killed).
    pub(crate) fn open(shared: &Arc<Mutex<SinkShared>>) -> Result<HarnessSink, SinkError> {
        let mut st = lock(shared);
        if let Some(kill) = st.killed.take() {
            let report = st.report.kill.get_or_insert_with(KillReport::default);
            let until = Instant::now() + kill.down;
            while Instant::now() < until {
                report.max_watermark_while_down =
                    report.max_watermark_while_down.max(kill.stream.watermark());
                let others = kill.others.iter().filter_map(|o| kill.stream.acked(o).ok().flatten()).max();
                report.others_acked_while_down = report.others_acked_while_down.max(others);
                thread::sleep(Duration::from_millis(5));
            }
        }
        let durable = match &st.durable_dir {
            Some(dir) => Some(DurableNdjson::open(dir, st.lane.as_str(), Duration::ZERO)?),
            None => None,
        };
        Ok(HarnessSink { shared: shared.clone(), durable })
    }

    fn counts(&mut self, kind: Kind) -> &mut Deliveries {
        match kind {
            Kind::Batch => &mut self.report.batches,
            Kind::Marker => &mut self.report.markers,
        }
    }

    /// Records (and writes) one delivered item.
    fn apply(&mut self, item: &LaneItem, durable: Option<&mut DurableNdjson>) -> Result<(), SinkError> {
        let kind = Kind::of(item);
        let LaneItem::Batch(batch) = item else {
            let counts = self.counts(kind);
            counts.delivered += 1;
            counts.processed += 1;
            if let Some(d) = durable {
                d.apply_item(item)?;
            }
            return Ok(());
        };
        let envelopes = u32::try_from(batch.envelopes.len()).unwrap_or(u32::MAX);
        let again = match (batch.position, batch.envelopes.first().and_then(|e| e.position)) {
            (Some(p), _) => self.report.received.record_last(p.0, envelopes),
            // A chunk of a large transaction: its envelopes carry the commit LSN.
            (None, Some(p)) => self.report.received.record_chunk((p.0, batch.offset), p.0, envelopes),
            (None, None) => {
                self.report.snapshot_envelopes += batch.envelopes.len() as u64;
                0
            }
        };
        self.report.envelopes_received_again += again;
        let counts = self.counts(kind);
        counts.delivered += 1;
        counts.processed += 1;
        counts.processed_again += u64::from(again > 0);
        if let Some(d) = durable {
            self.report.bytes_written += d.apply_item(item)?;
        } else if let Some(out) = &mut self.plain {
            let mut written = 0;
            for e in batch.envelopes.iter() {
                self.line.clear();
                write_line(&mut self.line, e);
                out.write_all(&self.line)?;
                written += self.line.len() as u64;
            }
            self.report.bytes_written += written;
        }
        if let Some(d) = self.slow {
            thread::sleep(d);
        }
        Ok(())
    }

    /// --chaos: asks once for a backfill of the first index this sink sees.
    fn request_backfill(&mut self, items: &[LaneItem]) -> Result<(), SinkError> {
        let first = items.iter().find_map(|i| match i {
            LaneItem::Batch(b) => b.envelopes.first(),
            _ => None,
        });
        let Some(e) = first else { return Ok(()) };
        let request = Request::backfill(self.lane.clone(), vec![e.index.clone()]);
        self.requests.publish(request).map_err(|e| SinkError::Request(e.to_string()))?;
        self.report.backfill_requested = true;
        Ok(())
    }
}

fn lock(shared: &Mutex<SinkShared>) -> std::sync::MutexGuard<'_, SinkShared> {
    // A panic while it was held (the engine catches it and retries the run) leaves the counts
    // of that run counted: the summary still reads them.
    shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One instance of a harness sink, as the library's engine opens it.
pub(crate) struct HarnessSink {
    shared: Arc<Mutex<SinkShared>>,
    durable: Option<DurableNdjson>,
}

impl Sink for HarnessSink {
    type Error = SinkError;

    fn state(&mut self) -> Result<Option<SinkState>, SinkError> {
        let state = self.durable.as_ref().and_then(|d| d.state().cloned());
        let mut st = lock(&self.shared);
        if !std::mem::replace(&mut st.report.state_read, true) {
            st.report.started_at = state.as_ref().and_then(|s| s.position);
        }
        Ok(state)
    }

    fn apply(&mut self, items: &[LaneItem]) -> Result<(), SinkError> {
        let mut st = lock(&self.shared);
        let st = &mut *st;
        if st.chaos.is_some() && !st.report.backfill_requested {
            st.request_backfill(items)?;
        }
        if !st.dead_run.is_empty() {
            let came_again = items.iter().filter_map(key).filter(|k| st.dead_run.contains(k)).count();
            if let Some(k) = &mut st.report.kill {
                k.redelivered_after_reattach += came_again as u64;
            }
            st.dead_run.clear();
        }
        for item in items {
            st.apply(item, self.durable.as_mut())?;
            if st.kill.as_ref().is_some_and(|k| st.report.batches.processed >= k.after) {
                // The engine dies holding its run: applied (written, not made durable), unacked.
                let kill = st.kill.take().expect("checked");
                st.dead_run = items.iter().filter_map(key).collect();
                let acked_at_death = kill.stream.acked(st.lane.as_str()).ok().flatten();
                st.report.kill = Some(KillReport {
                    held_unacked: st.dead_run.len() as u64,
                    acked_at_death,
                    ..KillReport::default()
                });
                st.killed = Some(kill);
                count_released(st, items);
                return Err(SinkError::Injected("killed (--kill-sink-after)"));
            }
        }
        if let Some(rng) = st.chaos.as_mut() {
            let fail = !st.chaos_failed_last && rng.gen_bool(0.05);
            st.chaos_failed_last = fail;
            if fail {
                count_released(st, items);
                return Err(SinkError::Injected("a run failed on purpose (--chaos)"));
            }
        }
        Ok(())
    }

    fn commit(&mut self, state: &SinkState) -> Result<(), SinkError> {
        match &mut self.durable {
            Some(d) => d.commit(state)?,
            None => {
                if let Some(out) = &mut lock(&self.shared).plain {
                    out.flush()?; // flushed before the ack
                }
            }
        }
        Ok(())
    }
}

/// Counts a failed run's items as released (redelivered to the next instance).
fn count_released(st: &mut SinkShared, items: &[LaneItem]) {
    st.report.reattaches += 1;
    for item in items {
        st.counts(Kind::of(item)).nacked += 1;
    }
}
