//! The sink threads: apply (discard, NDJSON, or durable NDJSON), ack, and the harness's faults: --chaos (nacks, dropped handles, out-of-order acks, re-attaches, one backfill request), --slow-sink, --kill-sink-after.

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

/// A delivery processed and not acked yet: its handle, its kind, and its commit time (µs since
/// the Unix epoch; see [`commit_micros`]) for the commit → ack latency.
pub(crate) type Held = (AckHandle<LaneItem>, Kind, Option<u64>);

/// What one sink did with the deliveries of one [`Kind`] of lane item. These count deliveries: an
/// item delivered three times (first delivery and two redeliveries) counts three times.
#[derive(Default, Clone, Copy)]
pub(crate) struct Deliveries {
    /// Received from the lane, redeliveries included.
    pub(crate) delivered: u64,
    /// Of `delivered`, redeliveries (attempt > 1) — every one the lane made.
    pub(crate) redelivered: u64,
    /// Of `delivered`, nacked on receipt (--chaos) without being processed.
    pub(crate) nacked: u64,
    /// Of `delivered`, processed (recorded, and written unless --discard): `delivered - nacked`.
    pub(crate) processed: u64,
    /// Of `processed`, redeliveries: items processed again.
    pub(crate) processed_again: u64,
    /// Of `processed`, whose handle was dropped un-acked (--chaos): redelivered.
    pub(crate) dropped: u64,
    /// Of `processed`, whose ack was refused because a consumer re-attach took the item back
    /// first (`AckError::Detached`): redelivered.
    pub(crate) acks_refused: u64,
}

/// What a sink thread did.
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
    pub(crate) reattaches: u64,
    /// Rounds of held acks sent in an order other than the delivery order.
    pub(crate) out_of_order_ack_rounds: u64,
    pub(crate) backfill_requested: bool,
    /// Envelopes of unpositioned (snapshot) batches processed, per processed delivery.
    pub(crate) snapshot_envelopes: u64,
    pub(crate) error: Option<String>,
    /// When the sink saw the end of its lane.
    pub(crate) finished: Option<Instant>,
    /// Live mode: transactions received again after a restart and skipped, being at or before
    /// the sink's checkpoint.
    pub(crate) transactions_skipped: u64,
    /// Live mode: the sink's checkpoint at the end.
    pub(crate) checkpoint: Option<Position>,
    /// --kill-sink-after: what the engine's death showed.
    pub(crate) kill: Option<KillReport>,
    /// From each transaction's commit to this sink's ack of it (live mode: the commit time the
    /// decoder records on the envelopes).
    pub(crate) commit_to_ack: CommitLatency,
}

/// One kill of a sink engine (--kill-sink-after) and its re-attach.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct KillReport {
    /// Deliveries the dead engine held without acking (taken back by the re-attach).
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
    /// Batches delivered again to the new engine (attempt > 1).
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
    pub(crate) lanes: Vec<Lane>,
    /// The live-mode output directory, to reopen the durable output from its checkpoint.
    pub(crate) out_dir: Option<PathBuf>,
}

pub(crate) struct Sink {
    pub(crate) lane: Lane,
    /// File mode: the output, flushed before each ack (no checkpoint).
    pub(crate) out: Option<BufWriter<File>>,
    /// Live mode (and file mode with --kill-sink-after): the durable output (fsync and
    /// checkpoint before ack, resume after a restart; contract C1).
    pub(crate) durable: Option<DurableNdjson>,
    pub(crate) slow: Option<Duration>,
    pub(crate) chaos: Option<StdRng>,
    pub(crate) requests: lanestream::RequestSender,
    pub(crate) report: SinkReport,
    pub(crate) line: Vec<u8>,
    /// --kill-sink-after (the first sink only); taken when it fires.
    pub(crate) kill: Option<Kill>,
}

impl Sink {
    pub(crate) fn counts(&mut self, kind: Kind) -> &mut Deliveries {
        match kind {
            Kind::Batch => &mut self.report.batches,
            Kind::Marker => &mut self.report.markers,
        }
    }

    /// Counts one delivery received from the lane.
    pub(crate) fn delivered(&mut self, kind: Kind, attempt: u32) {
        let counts = self.counts(kind);
        counts.delivered += 1;
        if attempt > 1 {
            counts.redelivered += 1;
        }
    }

    /// After a --kill-sink-after re-attach: counts a delivery that came again.
    pub(crate) fn redelivered_after_kill(&mut self, attempt: u32) {
        if let (Some(k), true) = (self.report.kill.as_mut(), attempt > 1) {
            k.redelivered_after_reattach += 1;
        }
    }

    /// Records (and writes) one delivered item.
    pub(crate) fn apply(&mut self, item: &LaneItem, attempt: u32, sequence: u64) -> Result<(), BoxError> {
        let counts = self.counts(Kind::of(item));
        counts.processed += 1;
        if attempt > 1 {
            counts.processed_again += 1;
        }
        let LaneItem::Batch(batch) = item else { return Ok(()) };
        let envelopes = u32::try_from(batch.envelopes.len())?;
        match (batch.position, batch.envelopes.first().and_then(|e| e.position)) {
            (Some(p), _) => {
                self.report.envelopes_received_again += self.report.received.record_last(p.0, envelopes);
            }
            // A chunk of a large transaction: its envelopes carry the commit LSN.
            (None, Some(p)) => {
                self.report.envelopes_received_again +=
                    self.report.received.record_chunk(sequence, p.0, envelopes);
            }
            (None, None) => self.report.snapshot_envelopes += batch.envelopes.len() as u64,
        }
        if let Some(d) = &mut self.durable {
            let applied = d.apply(batch)?;
            self.report.bytes_written += applied.bytes;
            if batch.position.is_some() && applied.written == 0 && applied.skipped > 0 {
                // Applied before a restart (PostgreSQL re-sends from the confirmed position).
                self.report.transactions_skipped += 1;
            }
        } else if let Some(out) = &mut self.out {
            let mut written = 0;
            for e in batch.envelopes.iter() {
                self.line.clear();
                write_line(&mut self.line, e);
                out.write_all(&self.line)?;
                written += self.line.len() as u64;
            }
            self.report.bytes_written += written;
            out.flush()?; // flushed before the ack
        }
        if let Some(d) = self.slow {
            thread::sleep(d);
        }
        Ok(())
    }

    pub(crate) fn ack(&mut self, (handle, kind, commit): Held, now_micros: u64) {
        match handle.ack() {
            Ok(()) => {
                if let Some(commit) = commit {
                    self.report.commit_to_ack.record(commit, now_micros);
                }
            }
            // A re-attach took it back first: it is redelivered to the new consumer (L8).
            Err(AckError::Detached) => self.counts(kind).acks_refused += 1,
            Err(_) => {}
        }
    }

    pub(crate) fn run(mut self) -> SinkReport {
        if let Err(e) = self.consume() {
            self.report.error = Some(e.to_string());
            // Nobody will drain this lane now: closing it wakes the ingest's waiting publish
            // (Closed, L10) instead of leaving it waiting for room forever.
            self.lane.close();
        }
        self.report.checkpoint = self.durable.as_ref().and_then(|d| d.checkpoint().committed);
        self.report.finished = Some(Instant::now());
        self.report
    }

    pub(crate) fn consume(&mut self) -> Result<(), BoxError> {
        let mut consumer = self.lane.reattach();
        let mut held: Vec<Held> = Vec::new();
        let mut commits: Vec<u64> = Vec::new();
        loop {
            if self.chaos.is_none() && self.durable.is_none() && self.kill.is_none() {
                // The fast path (no chaos, not durable, no --kill-sink-after pending): receive
                // in runs, apply each item in order, ack the run with one pass of the lane's
                // advancer.
                let run = match consumer.recv_run(lanestream::MAX_RUN) {
                    Ok(Some(run)) => run,
                    Ok(None) => return Ok(()),
                    Err(_detached) => {
                        consumer = self.lane.reattach();
                        continue;
                    }
                };
                let (attempt, first) = (run.attempt(), run.sequences().start);
                let mut kinds = [0u64; 2];
                commits.clear();
                commits.extend(run.iter().filter_map(commit_micros));
                for (k, item) in run.iter().enumerate() {
                    let kind = Kind::of(item);
                    kinds[kind as usize] += 1;
                    self.delivered(kind, attempt);
                    self.redelivered_after_kill(attempt);
                    self.apply(item, attempt, first + k as u64)?;
                }
                match run.ack() {
                    Ok(()) => {
                        let now = unix_micros_now();
                        for &commit in &commits {
                            self.report.commit_to_ack.record(commit, now);
                        }
                    }
                    Err(AckError::Detached) => {
                        // A re-attach took (some of) the run back first: redelivered (L8).
                        // Which items is not known here; count the run's.
                        self.counts(Kind::Batch).acks_refused += kinds[Kind::Batch as usize];
                        self.counts(Kind::Marker).acks_refused += kinds[Kind::Marker as usize];
                    }
                    Err(_) => {}
                }
                continue;
            }
            // Never wait while holding deliveries: the producer may be waiting for their slots.
            let delivery = if held.is_empty() {
                match consumer.recv() {
                    Ok(Some(d)) => d,
                    Ok(None) => return Ok(()),
                    Err(_detached) => {
                        consumer = self.lane.reattach();
                        continue;
                    }
                }
            } else {
                match consumer.try_recv() {
                    Ok(d) => d,
                    Err(TryRecvError::Empty | TryRecvError::Closed) => {
                        self.ack_held(&mut held)?;
                        continue;
                    }
                    Err(_detached) => {
                        self.ack_held(&mut held)?;
                        consumer = self.lane.reattach();
                        continue;
                    }
                }
            };
            let attempt = delivery.attempt();
            let kind = Kind::of(delivery.item());
            let commit = commit_micros(delivery.item());
            self.delivered(kind, attempt);
            self.redelivered_after_kill(attempt);
            let Some(rng) = self.chaos.as_mut() else {
                let (item, handle) = delivery.into_parts();
                self.apply(&item, attempt, handle.sequence())?;
                if self.kill.as_ref().is_some_and(|k| self.report.batches.processed >= k.after) {
                    held.push((handle, kind, commit));
                    consumer = self.die_and_reattach(consumer, std::mem::take(&mut held))?;
                    continue;
                }
                if self.durable.is_some() {
                    // Group commit: one fsync and checkpoint for what arrived together.
                    held.push((handle, kind, commit));
                    if held.len() >= 256 {
                        self.ack_held(&mut held)?;
                    }
                } else {
                    self.ack((handle, kind, commit), unix_micros_now());
                }
                continue;
            };
            // --chaos
            let roll: f64 = rng.gen();
            let hold_limit = rng.gen_range(1..=4usize);
            let reattach = rng.gen_bool(0.01);
            let drop_after = rng.gen_bool(0.02);
            if !self.report.backfill_requested {
                self.request_backfill(delivery.item())?;
            }
            if roll < 0.03 {
                self.counts(kind).nacked += 1;
                delivery.nack(); // redelivered before anything new (L6)
                continue;
            }
            let (item, handle) = delivery.into_parts();
            self.apply(&item, attempt, handle.sequence())?;
            if drop_after {
                self.counts(kind).dropped += 1;
                drop(handle); // dropping an unacked handle nacks it: a duplicate will follow
            } else {
                held.push((handle, kind, commit));
            }
            if reattach {
                // Re-attach while holding deliveries: their acks below may land or be refused
                // with Detached (then they come again to the new consumer).
                self.report.reattaches += 1;
                consumer = self.lane.reattach();
                self.ack_held(&mut held)?;
            } else if held.len() >= hold_limit {
                self.ack_held(&mut held)?;
            }
        }
    }

    /// --kill-sink-after: the engine dies holding `held` (processed, written, not acked) and
    /// `consumer`; a new engine re-attaches after the down time and gets every unacked batch
    /// again (L8). Meanwhile the watermark is watched: it must not pass this lane's last ack.
    pub(crate) fn die_and_reattach(
        &mut self,
        consumer: lanestream::Consumer<LaneItem>,
        held: Vec<Held>,
    ) -> Result<lanestream::Consumer<LaneItem>, BoxError> {
        let Some(kill) = self.kill.take() else { return Ok(consumer) };
        let mine = self.lane.name().clone();
        let acked_at_death = self.lane.stats().acked;
        let mut report =
            KillReport { held_unacked: held.len() as u64, acked_at_death, ..KillReport::default() };
        // A crashed process loses its unflushed output and never acks: keep the handles (and
        // the consumer) un-dropped until the new engine has re-attached, so that nothing is
        // released by a drop; the re-attach takes every unacked batch back.
        let unflushed = self.out.take().map(BufWriter::into_parts);
        // Its durable output dies with it: unflushed lines lost, the output's lock released.
        let had_durable = self.durable.take().is_some();
        let zombie = (consumer, held, unflushed);
        let until = Instant::now() + kill.down;
        while Instant::now() < until {
            let watermark = kill.stream.watermark();
            report.max_watermark_while_down = report.max_watermark_while_down.max(watermark);
            let others =
                kill.lanes.iter().filter(|l| *l.name() != mine).filter_map(|l| l.stats().acked).max();
            report.others_acked_while_down = report.others_acked_while_down.max(others);
            thread::sleep(Duration::from_millis(5));
        }
        // The new engine: the durable output reopened from its checkpoint (what was written
        // after it is cut off and comes again), then a fresh consumer over the same lane.
        match (&kill.out_dir, had_durable) {
            (Some(dir), true) => {
                self.durable = Some(DurableNdjson::open(dir, mine.as_str(), Duration::ZERO)?)
            }
            _ => self.out = zombie.2.map(|(file, _lost)| BufWriter::with_capacity(1 << 16, file)),
        }
        let consumer = self.lane.reattach();
        drop((zombie.0, zombie.1)); // late drops of a detached consumer's handles: refused, no release
        self.report.reattaches += 1;
        self.report.kill = Some(report);
        Ok(consumer)
    }

    /// Acks the held deliveries in a random order (L5: any order is fine), after making their
    /// output durable (live mode).
    pub(crate) fn ack_held(&mut self, held: &mut Vec<Held>) -> Result<(), BoxError> {
        if let Some(d) = &mut self.durable {
            d.commit()?;
        }
        if let Some(rng) = self.chaos.as_mut() {
            held.shuffle(rng);
            if held.windows(2).any(|w| w[0].0.sequence() > w[1].0.sequence()) {
                self.report.out_of_order_ack_rounds += 1;
            }
        }
        let now = unix_micros_now();
        for h in held.drain(..) {
            self.ack(h, now);
        }
        Ok(())
    }

    /// Asks once for a backfill of the first index this sink sees.
    pub(crate) fn request_backfill(&mut self, item: &LaneItem) -> Result<(), BoxError> {
        let LaneItem::Batch(b) = item else { return Ok(()) };
        let Some(e) = b.envelopes.first() else { return Ok(()) };
        let request = Request::backfill(self.lane.name().clone(), vec![e.index.clone()]);
        self.requests.publish(request).map_err(|e| format!("backfill request: {e}"))?;
        self.report.backfill_requested = true;
        Ok(())
    }
}
