//! What a run did ([`PipelineReport`], [`SinkReport`]) and its figures while it runs
//! ([`MetricsHandle`]).
//!
//! Commit → ack latency: how long after its transaction committed at the source a sink acked a
//! positioned batch.
//!
//! The source stamps each envelope with its transaction's commit time
//! ([`Envelope::built_at_micros`](crate::Envelope::built_at_micros), µs since the Unix
//! epoch: a replication decoder records the transaction's commit timestamp there, converted to
//! that epoch). A sink engine, when the ack of a positioned batch lands, records
//! `now − commit time` into its lane's [`CommitLatency`], a fixed-size histogram; its
//! [`summary`](CommitLatency::summary) gives the p50 / p99 ([`LatencySummary`]).
//!
//! The clocks are the source server's and this process's: on another host, their skew is part
//! of the figure (a negative difference is recorded as 0).
//!
//! ```
//! use lanestream::pipeline::CommitLatency;
//! let mut h = CommitLatency::new();
//! for ms in 1..=100 {
//!     h.record(1_000_000, 1_000_000 + ms * 1_000); // acked `ms` milliseconds after the commit
//! }
//! let s = h.summary();
//! assert_eq!(s.samples, 100);
//! assert!((49_000..=51_000).contains(&s.p50_micros));
//! assert!((98_000..=100_000).contains(&s.p99_micros));
//! ```

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::{LaneItem, Position};
use hdrhistogram::Histogram;

/// What one sink engine did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SinkReport {
    /// The sink.
    pub sink: String,
    /// Lane items applied and acked (a redelivered item counts each time).
    pub items_acked: u64,
    /// Deliveries that were redeliveries (attempt > 1): after a nack, a failed run, a restart.
    pub redelivered: u64,
    /// Runs whose apply or commit failed (or panicked) and were retried.
    pub retries: u64,
    /// Items whose ack was refused because a re-attach took them back first (they came again);
    /// counted per received run: a refused run counts all its items.
    pub acks_refused: u64,
    /// The last whole transaction the sink's state records at the end
    /// ([`SinkState::position`](super::SinkState::position)).
    pub position: Option<Position>,
    /// Backfill requests its engine published: the backfills its state owes, asked once per
    /// engine (at start, and when a change of an index it does not hold makes one owed).
    pub backfills_asked: u64,
    /// Items its state covered already (a transaction the source sent again after a restart,
    /// chunks applied before): acked without reaching the sink.
    pub covered: u64,
    /// Changes of the batches acked (their [`Batch::changes`](crate::Batch::changes); a
    /// redelivered batch counts each time).
    pub changes_acked: u64,
    /// From each transaction's commit at the source to this sink's ack of its positioned batch,
    /// in µs (see [`CommitLatency`]); batches without a commit time are not counted.
    pub commit_to_ack: LatencySummary,
}

/// The largest latency kept apart, in µs (one hour); longer ones count as one hour.
const MAX_MICROS: u64 = 3_600_000_000;

/// A fixed-size histogram of commit → ack latencies, in microseconds (log-linear buckets with 2
/// significant digits: each recorded value is kept to within 1%; from 1 µs to one hour, about
/// 22 KiB, whatever the number of samples).
#[derive(Clone, Debug)]
pub struct CommitLatency {
    histogram: Histogram<u64>,
}

impl Default for CommitLatency {
    fn default() -> Self {
        Self::new()
    }
}

impl CommitLatency {
    /// An empty histogram.
    pub fn new() -> Self {
        CommitLatency {
            histogram: Histogram::new_with_bounds(1, MAX_MICROS, 2).expect("valid constant bounds"),
        }
    }

    /// Records one ack at `ack_micros` of a change committed at `commit_micros` (both µs since the
    /// Unix epoch). A negative difference (clock skew) counts as 0, one over an hour as an hour.
    pub fn record(&mut self, commit_micros: u64, ack_micros: u64) {
        self.histogram.saturating_record(ack_micros.saturating_sub(commit_micros).min(MAX_MICROS));
    }

    /// Records the ack at `ack_micros` of `item` if it is a positioned batch whose envelopes carry
    /// a commit time ([`commit_micros`]); anything else is not recorded.
    pub fn record_item(&mut self, item: &LaneItem, ack_micros: u64) {
        if let Some(commit) = commit_micros(item) {
            self.record(commit, ack_micros);
        }
    }

    /// The p50, p99 and maximum of what was recorded.
    pub fn summary(&self) -> LatencySummary {
        let h = &self.histogram;
        LatencySummary {
            samples: h.len(),
            p50_micros: h.value_at_quantile(0.50),
            p99_micros: h.value_at_quantile(0.99),
            max_micros: h.max(),
        }
    }
}

/// Commit → ack latency of one sink, in microseconds. All zero when nothing was recorded.
/// Each value is the histogram's (within 1% of a recorded value).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencySummary {
    /// Positioned batches recorded (each ack once; a redelivered batch counts at each ack).
    pub samples: u64,
    /// The median, µs.
    pub p50_micros: u64,
    /// The 99th percentile, µs.
    pub p99_micros: u64,
    /// The largest, µs.
    pub max_micros: u64,
}

/// The commit time of a positioned batch (its first envelope's
/// [`built_at_micros`](crate::Envelope::built_at_micros), µs since the Unix epoch); `None`
/// for snapshot batches, `SnapshotComplete`, an empty transaction and envelopes without one.
pub fn commit_micros(item: &LaneItem) -> Option<u64> {
    match item {
        LaneItem::Batch(b) if b.position.is_some() => b.envelopes.first()?.built_at_micros,
        _ => None,
    }
}

/// Now, in µs since the Unix epoch (0 if the clock is before it).
pub fn unix_micros_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// What a pipeline run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PipelineReport {
    /// Positioned batches (transactions) published, to every lane that lacked them (every lane,
    /// but for a restart over lanes holding items beyond the watermark: see
    /// [`Pipeline::run`](super::Pipeline::run), "Resuming").
    pub transactions: u64,
    /// Unpositioned chunks of large transactions published, to every lane that lacked them.
    pub chunks: u64,
    /// Batches and chunks the source handed over that every lane held already (published by an
    /// earlier ingest, not acked yet): not published again.
    pub skipped: u64,
    /// Changes published (the batches' `changes`).
    pub changes: u64,
    /// Envelopes published to every lane.
    pub envelopes: u64,
    /// Snapshot batches published to one lane each, and their envelopes.
    pub snapshot_batches: u64,
    /// Envelopes of those snapshot batches.
    pub snapshot_envelopes: u64,
    /// Backfill requests served: `SnapshotComplete` published, then the request acked.
    pub backfills_served: u64,
    /// Backfill requests for a sink the stream has no lane for: acked unanswered (they could
    /// never be served), never handed to the source.
    pub requests_refused: u64,
    /// Backfill requests left on the request lane from before this run, for a backfill the
    /// state of a sink whose engine runs in this pipeline owes: acked unanswered at start, since
    /// that engine asks again from its durable state (see [`Pipeline::run`](super::Pipeline::run),
    /// "Resuming").
    pub requests_superseded: u64,
    /// The last positioned batch published (or held by every lane already).
    pub last_position: Option<Position>,
    /// The last position confirmed to the source.
    pub confirmed: Option<Position>,
    /// Whether the run ended by a [`StopHandle`](super::StopHandle) (otherwise the source ended).
    pub stopped: bool,
    /// Whether a stop's drain timed out before the sinks acked everything published.
    pub drain_timed_out: bool,
    /// The local sink engines, in the order they were added.
    pub sinks: Vec<SinkReport>,
    /// From the start of [`Pipeline::run`](super::Pipeline::run) to the engines joined.
    pub elapsed: Duration,
    /// The process's peak resident set size at the end of the run, in bytes
    /// ([`peak_rss_bytes`]); `None` where it cannot be read.
    pub peak_rss_bytes: Option<u64>,
}

impl PipelineReport {
    /// Changes published per second of [`elapsed`](Self::elapsed) (0 for a run of no time).
    pub fn changes_per_second(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.changes as f64 / secs
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::{Batch, Envelope, IndexName, Op, Position};
    use bytes::Bytes;

    use super::*;

    /// The peak covers memory the process touched: 48 MiB written here (the whole test
    /// process's peak, so at least that).
    #[cfg(target_os = "linux")]
    #[test]
    fn peak_rss_covers_memory_touched() {
        let touched = vec![1u8; 48 << 20];
        let peak = super::peak_rss_bytes().expect("VmHWM in /proc/self/status");
        assert!(peak >= 48 << 20, "peak {peak} bytes with 48 MiB touched");
        assert_eq!(std::hint::black_box(&touched)[(48 << 20) - 1], 1);
    }

    #[test]
    fn percentiles_of_a_known_distribution() {
        let mut h = CommitLatency::new();
        assert_eq!(h.summary(), LatencySummary::default());
        // 990 acks at 2 ms, 10 at 80 ms: the p50 is 2 ms, the p99 still 2 ms, the max 80 ms.
        for _ in 0..990 {
            h.record(10_000_000, 10_002_000);
        }
        for _ in 0..10 {
            h.record(10_000_000, 10_080_000);
        }
        let s = h.summary();
        assert_eq!(s.samples, 1000);
        assert!((1_980..=2_020).contains(&s.p50_micros), "{s:?}");
        assert!((1_980..=2_020).contains(&s.p99_micros), "{s:?}");
        assert!((79_200..=80_800).contains(&s.max_micros), "{s:?}");
        // 20 more at 80 ms: now over 1% of the samples, so the p99 moves to 80 ms.
        for _ in 0..20 {
            h.record(10_000_000, 10_080_000);
        }
        let s = h.summary();
        assert!((79_200..=80_800).contains(&s.p99_micros), "{s:?}");
        assert!((1_980..=2_020).contains(&s.p50_micros), "{s:?}");
    }

    #[test]
    fn skew_and_overflow_are_clamped_not_lost() {
        let mut h = CommitLatency::new();
        h.record(5_000, 1_000); // acked "before" the commit: 0
        h.record(0, u64::MAX); // beyond an hour: an hour
        let s = h.summary();
        assert_eq!(s.samples, 2);
        assert_eq!(s.p50_micros, 0);
        assert!(s.max_micros >= MAX_MICROS, "{s:?}");
    }

    fn envelope(at: Option<u64>) -> Envelope {
        Envelope {
            index: IndexName::new("public_t").unwrap(),
            id: "1".into(),
            op: Op::Upsert,
            position: Some(Position(9)),
            document: Bytes::new(),
            built_at_micros: at,
            relation: None,
            old_id: None,
            unchanged: Vec::new(),
        }
    }

    #[test]
    fn only_positioned_batches_with_a_commit_time_count() {
        let stamped = LaneItem::Batch(Batch::new(Some(Position(9)), Arc::from(vec![envelope(Some(7))])));
        let snapshot = LaneItem::Batch(Batch::new(None, Arc::from(vec![envelope(Some(7))])));
        let unstamped = LaneItem::Batch(Batch::new(Some(Position(9)), Arc::from(vec![envelope(None)])));
        let empty = LaneItem::Batch(Batch::new(Some(Position(9)), Arc::from(Vec::new())));
        assert_eq!(commit_micros(&stamped), Some(7));
        for item in [&snapshot, &unstamped, &empty] {
            assert_eq!(commit_micros(item), None);
        }
        let mut h = CommitLatency::new();
        for item in [&stamped, &snapshot, &unstamped, &empty] {
            h.record_item(item, 1_007);
        }
        let s = h.summary();
        assert_eq!(s.samples, 1);
        assert!((990..=1_010).contains(&s.p50_micros), "{s:?}");
    }
}

/// What a running [`Pipeline`](super::Pipeline) has done so far, read while it runs
/// ([`MetricsHandle::snapshot`]); the same figures as its [`PipelineReport`]
/// and [`SinkReport`]s at the end.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PipelineMetrics {
    /// Since [`Pipeline::run`](super::Pipeline::run) started (zero before).
    pub elapsed: Duration,
    /// Positioned batches (transactions) published to every lane.
    pub transactions: u64,
    /// Changes published.
    pub changes: u64,
    /// `changes` per second of `elapsed` (0 before the run).
    pub changes_per_second: f64,
    /// The last positioned batch published.
    pub last_position: Option<Position>,
    /// The last position confirmed to the source (the watermark it was allowed).
    pub confirmed: Option<Position>,
    /// How far the source's upstream is ahead of what was confirmed, in bytes
    /// ([`Source::lag_bytes`](super::Source::lag_bytes): for a replication slot,
    /// the server's log position minus the slot's confirmed one), read about once a second; `None` when the
    /// source does not say.
    pub source_lag_bytes: Option<u64>,
    /// The process's peak resident set size so far, in bytes ([`peak_rss_bytes`]: the whole
    /// process's, not this pipeline's alone); `None` where it cannot be read.
    pub peak_rss_bytes: Option<u64>,
    /// The local sink engines, in the order they started.
    pub sinks: Vec<SinkMetrics>,
}

/// The process's peak resident set size so far, in bytes: Linux's `VmHWM` ("high water mark")
/// from `/proc/self/status` (kB there), the figure `/usr/bin/time -v` prints as "Maximum resident
/// set size". `None` on other systems or when the file cannot be read. It covers the whole
/// process (every pipeline in it, and the caller's own memory), mapped code and thread stacks
/// included: what an operator plans a host or a container limit with.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?;
    let kb: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kb * 1024)
}

/// One local sink engine's figures in a [`PipelineMetrics`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SinkMetrics {
    /// The sink.
    pub sink: String,
    /// Lane items applied and acked (a redelivered item counts each time).
    pub items_acked: u64,
    /// Changes of the batches acked.
    pub changes_acked: u64,
    /// Commit → ack latency of its acked positioned batches, µs.
    pub commit_to_ack: LatencySummary,
}

/// A handle on a [`Pipeline`](super::Pipeline)'s figures, from
/// [`Pipeline::metrics`](super::Pipeline::metrics): cheap to clone, readable from any thread
/// while the pipeline runs and after. The driver updates the ingest's figures at each tick, a
/// sink engine its own at each commit (one uncontended lock per acked group of runs).
#[derive(Clone, Debug, Default)]
pub struct MetricsHandle {
    shared: Arc<Mutex<Shared>>,
}

#[derive(Debug, Default)]
struct Shared {
    started: Option<Instant>,
    ingest: PipelineMetrics,
    sinks: Vec<Arc<Mutex<SinkLive>>>,
}

/// A sink engine's live figures (its latency histogram is here, not copied).
#[derive(Debug, Default)]
pub(crate) struct SinkLive {
    pub(crate) sink: String,
    pub(crate) items_acked: u64,
    pub(crate) changes_acked: u64,
    pub(crate) latency: CommitLatency,
    /// Backfills its state owes that the engine could not ask for yet (the request lane full).
    pub(crate) unasked: u64,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Figures only: a panicking holder leaves them as they were, still worth reading.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl MetricsHandle {
    /// Backfills the local engines' states owe that they could not ask for yet (the request
    /// lane was full), over all of them.
    pub(crate) fn unasked(&self) -> u64 {
        lock(&self.shared).sinks.iter().map(|s| lock(s).unasked).sum()
    }

    /// The figures now.
    pub fn snapshot(&self) -> PipelineMetrics {
        let shared = lock(&self.shared);
        let mut m = shared.ingest.clone();
        m.elapsed = shared.started.map_or(Duration::ZERO, |s| s.elapsed());
        let secs = m.elapsed.as_secs_f64();
        m.changes_per_second = if secs > 0.0 { m.changes as f64 / secs } else { 0.0 };
        m.peak_rss_bytes = peak_rss_bytes();
        m.sinks = shared
            .sinks
            .iter()
            .map(|s| {
                let s = lock(s);
                SinkMetrics {
                    sink: s.sink.clone(),
                    items_acked: s.items_acked,
                    changes_acked: s.changes_acked,
                    commit_to_ack: s.latency.summary(),
                }
            })
            .collect();
        m
    }

    pub(crate) fn start(&self) {
        lock(&self.shared).started = Some(Instant::now());
    }

    /// The ingest's figures (`sinks`, `elapsed` and the rate are the snapshot's own).
    pub(crate) fn set_ingest(&self, update: impl FnOnce(&mut PipelineMetrics)) {
        update(&mut lock(&self.shared).ingest);
    }

    /// A sink engine's live figures, listed in this handle.
    pub(crate) fn add_sink(&self, sink: &str) -> Arc<Mutex<SinkLive>> {
        let live = Arc::new(Mutex::new(SinkLive { sink: sink.to_owned(), ..SinkLive::default() }));
        lock(&self.shared).sinks.push(live.clone());
        live
    }
}

impl SinkLive {
    /// The engine's report at its end: `report`'s own counts, the acked counts and latency from
    /// here (kept once, here, while it runs).
    pub(crate) fn finish(live: &Mutex<SinkLive>, mut report: SinkReport) -> SinkReport {
        let live = lock(live);
        (report.items_acked, report.changes_acked) = (live.items_acked, live.changes_acked);
        report.commit_to_ack = live.latency.summary();
        report
    }
}
