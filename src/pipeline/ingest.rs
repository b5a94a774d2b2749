//! The ingest loop of a [`Pipeline`](super::Pipeline) run: the source's items published to the
//! lanes that lack them ([`Pipeline::run`](super::Pipeline::run), "Resuming"), the source
//! confirmed at the watermark, the request lane handed to the source and each request acked
//! after its `SnapshotComplete` (R2), and the drain at the end or at a stop.

use std::collections::{HashMap, VecDeque};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::{
    LaneConsumer, LaneDelivery, LaneItem, Position, PublishError, RecvTimeoutError, SinkName, Stream,
    StreamFanout, TryRecvError,
};

use super::error::PipelineError;
use super::metrics::{MetricsHandle, PipelineReport, SinkReport};
use super::source::{Source, SourceItem};
use super::state::transaction_of;
use super::stop::StopHandle;

/// The ingest loop's state.
pub(crate) struct Ingest<'a, St: Stream> {
    pub(crate) stream: &'a St,
    pub(crate) fanout: &'a mut St::Fanout,
    pub(crate) requests: &'a mut St::RequestConsumer,
    /// Each lane's last published position (index = lane, as in the fan-out): read at start,
    /// then moved by every positioned batch published.
    pub(crate) published: Vec<Option<Position>>,
    /// The lanes an unpositioned chunk whose envelopes carry no position either goes to: those
    /// not skipped for the last positioned batch handed over in this run (every lane before
    /// the first).
    pub(crate) chunk_lanes: Vec<bool>,
    /// Requests handed to the source whose `SnapshotComplete` is not published yet, per sink,
    /// in arrival order: acked when it is ([R2](crate::contract#r2)).
    pub(crate) pending:
        HashMap<SinkName, VecDeque<<St::RequestConsumer as LaneConsumer<crate::Request>>::Delivery>>,
    pub(crate) report: PipelineReport,
    pub(crate) tick: Duration,
    pub(crate) metrics: MetricsHandle,
    /// When the source's lag is read next (about once a second: it may cost a query).
    pub(crate) next_lag: Instant,
}

impl<St: Stream> Ingest<'_, St> {
    /// Copies the ingest's figures into the [`MetricsHandle`], and the source's lag when due.
    fn refresh_metrics<Src: Source>(&mut self, source: &mut Src) {
        self.update_metrics();
        if Instant::now() >= self.next_lag {
            self.next_lag = Instant::now() + Duration::from_secs(1);
            let lag = source.lag_bytes();
            self.metrics.set_ingest(|m| m.source_lag_bytes = lag);
        }
    }

    /// Copies the ingest's figures into the [`MetricsHandle`].
    pub(crate) fn update_metrics(&self) {
        let r = &self.report;
        self.metrics.set_ingest(|m| {
            (m.transactions, m.changes) = (r.transactions, r.changes);
            (m.last_position, m.confirmed) = (r.last_position, r.confirmed);
        });
    }

    pub(crate) fn run<Src: Source>(
        &mut self,
        source: &mut Src,
        stop: &StopHandle,
        engines: &[(String, JoinHandle<Result<SinkReport, PipelineError>>)],
        drain_timeout: Duration,
    ) -> Result<(), PipelineError> {
        let mut next_tick = Instant::now();
        loop {
            if stop.is_stopped() {
                self.report.stopped = true;
                return self.drain(source, engines, Some(Instant::now() + drain_timeout), false);
            }
            if Instant::now() >= next_tick {
                next_tick = Instant::now() + self.tick;
                self.housekeeping(source, engines)?;
            }
            match source.next(self.tick).map_err(|e| PipelineError::Source(e.into()))? {
                Some(SourceItem::End) => return self.drain(source, engines, None, true),
                Some(item) => self.publish(item, source, stop, engines)?,
                None => self.confirm(source)?,
            }
        }
    }

    /// Confirms the watermark, hands new requests to the source, and checks the engines.
    fn housekeeping<Src: Source>(
        &mut self,
        source: &mut Src,
        engines: &[(String, JoinHandle<Result<SinkReport, PipelineError>>)],
    ) -> Result<(), PipelineError> {
        self.confirm(source)?;
        self.take_requests(source)?;
        self.refresh_metrics(source);
        // An engine ends before the lanes close only when it gave up: stop with its error
        // (the caller joins it).
        if engines.iter().any(|(_, t)| t.is_finished()) {
            return Err(PipelineError::Stream("a sink engine stopped (its error follows)".into()));
        }
        Ok(())
    }

    fn confirm<Src: Source>(&mut self, source: &mut Src) -> Result<(), PipelineError> {
        if let Some(w) = self.stream.watermark() {
            if self.report.confirmed.is_none_or(|c| w > c) {
                source.confirm(w).map_err(|e| PipelineError::Source(e.into()))?;
                self.report.confirmed = Some(w);
            }
        }
        Ok(())
    }

    fn take_requests<Src: Source>(&mut self, source: &mut Src) -> Result<(), PipelineError> {
        while let Some(delivery) = next_request(self.requests)? {
            self.serve_request(delivery, source)?;
        }
        Ok(())
    }

    /// Hands one request to the source and keeps its delivery until its `SnapshotComplete` is
    /// published (R2); a request for a sink with no lane is acked unanswered.
    pub(crate) fn serve_request<Src: Source>(
        &mut self,
        delivery: <St::RequestConsumer as LaneConsumer<crate::Request>>::Delivery,
        source: &mut Src,
    ) -> Result<(), PipelineError> {
        let request = delivery.item().clone();
        // `Request` has one kind today; a later kind gets its own arm here.
        let sink = match &request {
            crate::Request::Backfill { sink, .. } => sink.clone(),
        };
        if !self.stream.sinks().contains(&sink) {
            // No lane to answer on: it could never be served, and left unacked it would
            // come back for ever.
            if delivery.ack().is_ok() {
                self.report.requests_refused += 1;
            }
            return Ok(());
        }
        source.backfill(request).map_err(|e| PipelineError::Source(e.into()))?;
        self.pending.entry(sink).or_default().push_back(delivery);
        Ok(())
    }

    fn lane(&self, sink: &SinkName) -> Result<usize, PipelineError> {
        self.stream
            .sinks()
            .iter()
            .position(|s| s == sink)
            .ok_or_else(|| PipelineError::UnknownSink(sink.clone()))
    }

    /// Publishes `item` to every lane with the fan-out, waiting for room while confirming and
    /// checking the engines; `false` when a stop came first (the item was not published).
    fn publish_everywhere<Src: Source>(
        &mut self,
        mut item: LaneItem,
        source: &mut Src,
        stop: &StopHandle,
        engines: &[(String, JoinHandle<Result<SinkReport, PipelineError>>)],
    ) -> Result<bool, PipelineError> {
        // Room now (no clock read): the common case. Any refusal (full, or a broker's blip,
        // which only the waiting form retries, P8) goes on to the waiting form below.
        item = match self.fanout.try_publish(item) {
            Ok(()) => return Ok(true),
            Err(e) => e.into_inner(),
        };
        // Wait for room, confirming meanwhile (slow sinks' progress reaches the source).
        loop {
            match self.fanout.publish_timeout(item, self.tick.max(Duration::from_millis(50))) {
                Ok(()) => return Ok(true),
                Err(PublishError::Timeout(back)) => {
                    item = back;
                    self.housekeeping(source, engines)?;
                    if stop.is_stopped() {
                        return Ok(false);
                    }
                }
                Err(e) => return Err(publish_error(e)),
            }
        }
    }

    /// Publishes `item` to lane `lane` only, waiting for room as
    /// [`publish_everywhere`](Self::publish_everywhere) does: confirming, taking requests and
    /// checking the engines meanwhile, and giving up at a stop (`false`: not published). The
    /// port has no deadline form of `publish_to`, so the wait is a sleep between tries, from
    /// 1 ms doubling to the tick.
    fn publish_to_lane<Src: Source>(
        &mut self,
        lane: usize,
        mut item: LaneItem,
        source: &mut Src,
        stop: &StopHandle,
        engines: &[(String, JoinHandle<Result<SinkReport, PipelineError>>)],
    ) -> Result<bool, PipelineError> {
        let mut pause = Duration::from_millis(1);
        let mut next_housekeeping = Instant::now() + self.tick;
        loop {
            item = match self.fanout.try_publish_to(lane, item) {
                Ok(()) => return Ok(true),
                // A broker's blip: tried again, as the waiting forms do (P8).
                Err(PublishError::Backend { item: back, .. } | PublishError::Full(back)) => back,
                Err(e) => return Err(publish_error(e)),
            };
            if stop.is_stopped() {
                return Ok(false);
            }
            if Instant::now() >= next_housekeeping {
                next_housekeeping = Instant::now() + self.tick;
                self.housekeeping(source, engines)?;
            }
            thread::sleep(pause);
            pause = (pause * 2).min(self.tick.max(Duration::from_millis(1)));
        }
    }

    fn publish<Src: Source>(
        &mut self,
        item: SourceItem,
        source: &mut Src,
        stop: &StopHandle,
        engines: &[(String, JoinHandle<Result<SinkReport, PipelineError>>)],
    ) -> Result<(), PipelineError> {
        match item {
            SourceItem::Change(batch) => {
                let (position, changes, envelopes) =
                    (batch.position, batch.changes, batch.envelopes.len() as u64);
                // The lanes that lack it (see `Pipeline::run`, "Resuming"): by its position, a
                // chunk by its transaction's (its envelopes'), else as the last positioned batch.
                let key = position.or_else(|| transaction_of(&batch));
                let lacks = |lane: usize| match key {
                    Some(p) => self.published[lane].is_none_or(|last| last < p),
                    None => self.chunk_lanes[lane],
                };
                let lanes = self.published.len();
                let (all, any) = ((0..lanes).all(lacks), (0..lanes).any(lacks));
                let item = LaneItem::Batch(batch);
                if all {
                    // Every lane lacks it (always, but for a restart over lanes holding items
                    // beyond the watermark): written once for all.
                    if !self.publish_everywhere(item, source, stop, engines)? {
                        // Stopped: not published, so never confirmed; the source sends it again.
                        return Ok(());
                    }
                } else if any {
                    // Some lanes hold it already: to the others only.
                    let targets: Vec<usize> = (0..lanes).filter(|&lane| lacks(lane)).collect();
                    for lane in targets {
                        if !self.publish_to_lane(lane, item.clone(), source, stop, engines)? {
                            // Stopped: not confirmed past it; the source sends it again.
                            return Ok(());
                        }
                    }
                } else {
                    // Every lane holds it: published by an earlier ingest, not acked yet.
                    self.report.skipped += 1;
                }
                if any {
                    self.report.changes += changes;
                    self.report.envelopes += envelopes;
                    match position {
                        Some(_) => self.report.transactions += 1,
                        None => self.report.chunks += 1,
                    }
                }
                if let Some(p) = position {
                    // On every lane now (published here, or held before): the drain waits for it.
                    self.report.last_position = Some(p);
                    for (lane, last) in self.published.iter_mut().enumerate() {
                        // Taken by the lanes it was published to: those that lacked it.
                        self.chunk_lanes[lane] = last.is_none_or(|last| last < p);
                        *last = (*last).max(Some(p));
                    }
                }
            }
            SourceItem::Snapshot { sink, item } => {
                let lane = self.lane(&sink)?;
                let complete = matches!(item, LaneItem::SnapshotComplete { .. });
                if let LaneItem::Batch(b) = &item {
                    self.report.snapshot_batches += 1;
                    self.report.snapshot_envelopes += b.envelopes.len() as u64;
                }
                if !self.publish_to_lane(lane, item, source, stop, engines)? {
                    // Stopped: its request stays unacked, and is served again after a restart.
                    return Ok(());
                }
                if complete {
                    // R2: the request is acked only now that its SnapshotComplete is published.
                    if let Some(delivery) = self.pending.get_mut(&sink).and_then(VecDeque::pop_front) {
                        if delivery.ack().is_ok() {
                            self.report.backfills_served += 1;
                        }
                    }
                }
            }
            SourceItem::End => {}
        }
        Ok(())
    }

    /// Waits until the sinks acked everything published (the waitable watermark), up to
    /// `deadline`; at a finite input's end (`serve`) it also serves the backfills asked
    /// meanwhile until none is pending, at a stop it does not wait for them.
    fn drain<Src: Source>(
        &mut self,
        source: &mut Src,
        engines: &[(String, JoinHandle<Result<SinkReport, PipelineError>>)],
        deadline: Option<Instant>,
        serve: bool,
    ) -> Result<(), PipelineError> {
        loop {
            if serve {
                self.take_requests(source)?;
                // The snapshot items of those requests (a live source reads its stream on to
                // their chunks' marks: its changes are published too).
                while self.pending.values().any(|q| !q.is_empty()) {
                    match source.next(self.tick).map_err(|e| PipelineError::Source(e.into()))? {
                        Some(SourceItem::End) | None => break,
                        Some(item) => self.publish(item, source, &StopHandle::new(), engines)?,
                    }
                }
            }
            self.confirm(source)?;
            self.refresh_metrics(source);
            let caught_up = match self.report.last_position {
                Some(last) => self.report.confirmed.is_some_and(|c| c >= last),
                None => true,
            };
            // A stop does not wait for the backfills being served: it reads the source no more,
            // so they would never complete. Their requests stay unacked, and each sink owes them
            // durably (P3), resuming after the last row it applied.
            if caught_up && !serve {
                return Ok(());
            }
            if caught_up && self.pending.values().all(VecDeque::is_empty) {
                // A finite source's end: every request asked before the acks just read is on
                // the request lane by now (an engine asks before it acks the run whose commit
                // made the backfill owed), and one the lane was too full to take is counted in
                // `unasked` until asked. Done when none is waiting, after a last look.
                if self.metrics.unasked() == 0 {
                    self.take_requests(source)?;
                    if self.pending.values().all(VecDeque::is_empty) {
                        return Ok(());
                    }
                    continue;
                }
            }
            if engines.iter().any(|(_, t)| t.is_finished()) {
                return Err(PipelineError::Stream("a sink engine stopped (its error follows)".into()));
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                self.report.drain_timed_out = true;
                return Ok(());
            }
            let wait = deadline.map_or(now + self.tick, |d| d.min(now + self.tick));
            if let Some(last) = self.report.last_position {
                self.stream.wait_watermark(last, Some(wait));
            } else {
                thread::sleep(wait.saturating_duration_since(now));
            }
        }
    }
}

/// The request lane's next request if one is there now; `None` when it is empty or closed.
///
/// # Errors
/// The request lane's error past the backend's retry budget. (P8: the never-waiting receive
/// tries once; a backend error is tried again by a receive that retries within the budget, with
/// a deadline of now: it waits for nothing else.)
pub(crate) fn next_request<C: LaneConsumer<crate::Request>>(
    requests: &mut C,
) -> Result<Option<C::Delivery>, PipelineError> {
    let lane_error = |e: &dyn std::fmt::Display| PipelineError::Stream(format!("the request lane: {e}"));
    match requests.try_recv() {
        Ok(d) => Ok(Some(d)),
        Err(TryRecvError::Empty | TryRecvError::Closed) => Ok(None),
        Err(TryRecvError::Backend(_)) => match requests.recv_timeout(Duration::ZERO) {
            Ok(d) => Ok(d),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(e) => Err(lane_error(&e)),
        },
        Err(e) => Err(lane_error(&e)),
    }
}

fn publish_error(e: PublishError<LaneItem>) -> PipelineError {
    match e {
        PublishError::Closed(_) => {
            PipelineError::Stream("a lane was closed (its sink engine stopped: its error follows)".into())
        }
        e => PipelineError::Stream(format!("publish: {e}")),
    }
}
