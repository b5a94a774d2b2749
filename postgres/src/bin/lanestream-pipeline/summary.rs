//! The summary: one value rendered as text (stdout) and as JSON (--summary-json).

use crate::prelude::*;

/// An LSN as PostgreSQL writes it (`0/1D84F00`); `None` when there is none.
pub(crate) fn lsn(p: Option<Position>) -> Option<String> {
    p.map(|p| p.to_string())
}

/// An LSN in the text: unquoted, `none` when there is none (`null` in the JSON).
pub(crate) fn lsn_text(lsn: &Option<String>) -> &str {
    lsn.as_deref().unwrap_or("none")
}

/// The run's summary. The text on stdout (`Display`) and the JSON of `--summary-json`
/// (`Serialize`) both render this one value: the same numbers under the same names.
///
/// Units: a *change* is one I/U/D/T action of the input; an *envelope* is one row operation
/// delivered to a sink (one per change, two for an update that changes the key); a *transaction*
/// is one positioned batch (its envelopes, at its commit LSN); a *batch* is a lane item carrying
/// envelopes: a transaction or a chunk of snapshot rows; a *snapshot marker* is the
/// `SnapshotComplete` lane item that ends a backfill.
#[derive(Serialize)]
pub(crate) struct Summary {
    /// The layout of this JSON: bumped when a field is renamed, removed or changes meaning.
    pub(crate) schema_version: u32,
    /// `PASS` or `FAIL`: the exit status is 0 on PASS, non-zero on FAIL.
    pub(crate) result: &'static str,
    /// Why, in one line.
    pub(crate) reason: String,
    pub(crate) input: String,
    /// Live mode: the slot's `confirmed_flush_lsn` after the final confirm (never past the
    /// final watermark).
    pub(crate) slot_confirmed_lsn: Option<String>,
    /// Live mode: `pg_current_wal_lsn() - confirmed_flush_lsn` of the slot after the final
    /// confirm, in bytes (the WAL the server still keeps for it).
    pub(crate) slot_lag_bytes: Option<u64>,
    /// Live mode: how many times the replication stream was opened again after it broke.
    pub(crate) reconnects: Option<u64>,
    /// Live mode: heartbeat messages written (`--heartbeat-secs`).
    pub(crate) heartbeats: Option<u64>,
    /// Live mode: indexes resynced, their tables having rejoined the publication
    /// (`--publication-check-ms`).
    pub(crate) resyncs: Option<u64>,
    /// The directory of the sinks' `<sink>.ndjson` files; `null` with `--discard`.
    pub(crate) output_dir: Option<String>,
    pub(crate) sink_count: u16,
    pub(crate) discard: bool,
    /// The input was read into memory before the clock started (`--preload`).
    pub(crate) preload: bool,
    pub(crate) chaos: bool,
    pub(crate) slow_sink: bool,
    /// Published to every sink, each as one positioned batch (after its chunks, if any).
    pub(crate) transactions_published: u64,
    /// Unpositioned chunks of transactions over `--max-batch-changes` changes, published to every
    /// sink before their transaction's positioned batch.
    pub(crate) chunks_published: u64,
    pub(crate) changes_published: u64,
    /// Per sink: every sink's lane got all of them.
    pub(crate) envelopes_published: u64,
    /// Malformed input lines skipped (`--skip-bad-lines`).
    pub(crate) bad_lines_skipped: u64,
    /// Transactions discarded whole because they had bad lines (`--skip-bad-lines`): lost, so
    /// the run FAILs.
    pub(crate) transactions_discarded: u64,
    /// Their changes, each bad line counted as one lost change.
    pub(crate) changes_discarded: u64,
    pub(crate) last_commit_lsn: Option<String>,
    pub(crate) final_watermark_lsn: Option<String>,
    /// Nothing queued or unacked on any lane at the end.
    pub(crate) stream_idle: bool,
    pub(crate) backfill_requests_served: u64,
    /// Snapshot rows published in answer to the backfill requests (each to one sink).
    pub(crate) snapshot_envelopes_published: u64,
    /// The sinks' `batches_redelivered`, summed.
    pub(crate) batches_redelivered: u64,
    /// The sinks' `envelopes_received_again`, summed.
    pub(crate) envelopes_received_again: u64,
    /// The sinks' `transactions_lost`, summed.
    pub(crate) transactions_lost: u64,
    /// The sinks' `envelopes_lost`, summed.
    pub(crate) envelopes_lost: u64,
    /// From the start to the last sink's end, to the millisecond.
    pub(crate) elapsed_seconds: f64,
    pub(crate) changes_per_second: u64,
    /// The process's peak resident set size when the pipeline's run ended, in bytes (Linux's
    /// `VmHWM`, `PipelineReport::peak_rss_bytes`; `null` where it cannot be read): the
    /// pipeline's memory, not the check against the tables that follows a live run.
    pub(crate) peak_rss_bytes: Option<u64>,
    /// Live mode: commit → last sink's ack (the slowest sink's percentiles; see `per_sink`).
    pub(crate) commit_to_last_ack: Option<LatencyMs>,
    /// Live mode: commit → decoded (before the publish): the source's share of the latency.
    pub(crate) commit_to_decode: Option<LatencyMs>,
    /// Why the ingest stopped early (input or publish error), if it did.
    pub(crate) ingest_error: Option<String>,
    pub(crate) per_sink: Vec<SinkSummary>,
}

/// One sink's part of the [`Summary`]. The `batches_*` and `snapshot_markers_*` counts are of
/// deliveries (see [`Deliveries`]): an item delivered twice counts twice.
#[derive(Serialize)]
pub(crate) struct SinkSummary {
    pub(crate) name: String,
    /// The lane's acked position: the last transaction of its contiguous acked prefix.
    pub(crate) acked_lsn: Option<String>,
    /// NDJSON bytes appended to `<sink>.ndjson` (redelivered envelopes written again included).
    pub(crate) bytes_written: u64,
    /// Distinct transactions received at least once.
    pub(crate) transactions_received: u64,
    /// Distinct envelopes of transactions received at least once.
    pub(crate) envelopes_received: u64,
    /// Envelopes of transactions received again after their first receipt.
    pub(crate) envelopes_received_again: u64,
    /// Transactions published and never received.
    pub(crate) transactions_lost: u64,
    /// Envelopes of transactions published and never received (a lost transaction's included).
    pub(crate) envelopes_lost: u64,
    /// Batch deliveries received from the lane, redeliveries included.
    pub(crate) batches_delivered: u64,
    /// Redeliveries (attempt > 1) as the sink engine counts them, every item kind.
    pub(crate) batches_redelivered: u64,
    /// Of `batches_processed`, released un-acked because `--chaos` failed their run (or
    /// `--kill-sink-after` killed the engine holding them): redelivered.
    pub(crate) batches_nacked: u64,
    /// Of `batches_delivered`, processed: recorded, and written unless `--discard`.
    pub(crate) batches_processed: u64,
    /// Of `batches_processed`, batches this sink had seen before: processed again.
    pub(crate) batches_processed_again: u64,
    /// Acks refused because a re-attach took the item back first, as the sink engine counts
    /// them (every item kind): redelivered.
    pub(crate) batch_acks_refused: u64,
    /// Snapshot rows in the processed snapshot batches (redeliveries included).
    pub(crate) snapshot_envelopes_processed: u64,
    /// As the `batches_*` counts, for `SnapshotComplete` markers.
    pub(crate) snapshot_markers_delivered: u64,
    pub(crate) snapshot_markers_redelivered: u64,
    pub(crate) snapshot_markers_nacked: u64,
    pub(crate) snapshot_markers_processed: u64,
    pub(crate) snapshot_markers_processed_again: u64,
    pub(crate) snapshot_marker_acks_refused: u64,
    /// Sink engine re-attaches after a failed run (`--chaos`, `--kill-sink-after`).
    pub(crate) consumer_reattaches: u64,
    /// Items the sink's state already covered (a transaction received again after a restart,
    /// chunks applied before): acked by the engine without reaching the sink.
    pub(crate) items_covered: u64,
    /// Live mode: the sink's durable checkpoint at the end (last applied commit LSN).
    pub(crate) checkpoint_lsn: Option<String>,
    /// --kill-sink-after: the engine's death and re-attach, if it happened to this sink.
    pub(crate) sink_kill: Option<KillReport>,
    /// Live mode: from each transaction's commit (its timestamp at the server) to this sink's
    /// ack of it, in milliseconds; `null` when no acked transaction carried a commit time.
    pub(crate) commit_to_ack: Option<LatencyMs>,
    /// Why the sink stopped early, if it did.
    pub(crate) error: Option<String>,
}

impl SinkSummary {
    pub(crate) fn new(
        s: &SinkReport,
        acked_lsn: Option<String>,
        transactions_lost: u64,
        envelopes_lost: u64,
    ) -> Self {
        let (b, m) = (s.batches, s.markers);
        SinkSummary {
            name: s.name.clone(),
            acked_lsn,
            bytes_written: s.bytes_written,
            transactions_received: s.received.transactions(),
            envelopes_received: s.received.envelopes(),
            envelopes_received_again: s.envelopes_received_again,
            transactions_lost,
            envelopes_lost,
            batches_delivered: b.delivered,
            batches_redelivered: b.redelivered,
            batches_nacked: b.nacked,
            batches_processed: b.processed,
            batches_processed_again: b.processed_again,
            batch_acks_refused: b.acks_refused,
            snapshot_envelopes_processed: s.snapshot_envelopes,
            snapshot_markers_delivered: m.delivered,
            snapshot_markers_redelivered: m.redelivered,
            snapshot_markers_nacked: m.nacked,
            snapshot_markers_processed: m.processed,
            snapshot_markers_processed_again: m.processed_again,
            snapshot_marker_acks_refused: m.acks_refused,
            consumer_reattaches: s.reattaches,
            items_covered: s.covered,
            checkpoint_lsn: lsn(s.checkpoint),
            sink_kill: s.kill,
            commit_to_ack: LatencyMs::of(s.commit_to_ack),
            error: s.error.as_deref().map(one_line),
        }
    }
}

/// Commit → ack latency percentiles, in milliseconds (to the microsecond), over `samples`
/// acked transactions.
#[derive(Serialize, Clone, Copy)]
pub(crate) struct LatencyMs {
    pub(crate) samples: u64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) max_ms: f64,
}

impl LatencyMs {
    pub(crate) fn of(s: LatencySummary) -> Option<LatencyMs> {
        let ms = |us: u64| us as f64 / 1000.0;
        (s.samples > 0).then(|| LatencyMs {
            samples: s.samples,
            p50_ms: ms(s.p50_micros),
            p99_ms: ms(s.p99_micros),
            max_ms: ms(s.max_micros),
        })
    }

    /// The slowest sink's, percentile by percentile: what the last sink's ack took (a lower
    /// bound of the percentiles of each transaction's last ack, equal when the sinks ack
    /// together).
    pub(crate) fn slowest<'a>(all: impl Iterator<Item = &'a LatencyMs>) -> Option<LatencyMs> {
        all.copied().reduce(|a, b| LatencyMs {
            samples: a.samples.min(b.samples),
            p50_ms: a.p50_ms.max(b.p50_ms),
            p99_ms: a.p99_ms.max(b.p99_ms),
            max_ms: a.max_ms.max(b.max_ms),
        })
    }
}

impl Summary {
    /// Turns the verdict into FAIL for `why` (added in front of the reason if it already failed).
    pub(crate) fn fail(&mut self, why: String) {
        let why = one_line(&why);
        self.reason = if self.result == "PASS" { why } else { format!("{why}; {}", self.reason) };
        self.result = "FAIL";
    }
}

/// A connection string without its password.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => format!("{}://…@{}", &url[..scheme], &url[at + 1..]),
        _ => url.split_whitespace().filter(|kv| !kv.starts_with("password=")).collect::<Vec<_>>().join(" "),
    }
}

/// One line of text, whatever the error message held (the summary's reason and errors).
pub(crate) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub(crate) fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self;
        writeln!(
            f,
            "input {}: {} transactions, {} changes, {} envelopes published to each of {} sinks, {} bad lines skipped",
            s.input, s.transactions_published, s.changes_published, s.envelopes_published, s.sink_count,
            s.bad_lines_skipped,
        )?;
        if s.transactions_discarded > 0 || s.changes_discarded > 0 {
            writeln!(
                f,
                "lost to bad lines: {} transactions discarded whole, {} changes",
                s.transactions_discarded, s.changes_discarded
            )?;
        }
        match &s.output_dir {
            Some(dir) => write!(f, "output {dir}/<sink>.ndjson")?,
            None => write!(f, "output discarded")?,
        }
        writeln!(
            f,
            "; chaos {}, slow sink {}; {:.3} s, {} changes/s, peak RSS {}",
            yes_no(s.chaos),
            yes_no(s.slow_sink),
            s.elapsed_seconds,
            s.changes_per_second,
            s.peak_rss_bytes.map_or_else(|| "-".to_owned(), |b| format!("{:.1} MiB", b as f64 / 1048576.0)),
        )?;
        if s.chunks_published > 0 {
            writeln!(
                f,
                "large transactions: {} chunks published before their last batch",
                s.chunks_published
            )?;
        }
        writeln!(
            f,
            "last commit LSN {}, final watermark LSN {}, stream idle {}",
            lsn_text(&s.last_commit_lsn),
            lsn_text(&s.final_watermark_lsn),
            yes_no(s.stream_idle),
        )?;
        if let Some(l) = &s.commit_to_decode {
            writeln!(
                f,
                "commit to decoded: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms ({} transactions)",
                l.p50_ms, l.p99_ms, l.max_ms, l.samples
            )?;
        }
        if let Some(l) = &s.commit_to_last_ack {
            writeln!(
                f,
                "commit to last sink's ack: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms ({} transactions)",
                l.p50_ms, l.p99_ms, l.max_ms, l.samples
            )?;
        }
        if s.slot_confirmed_lsn.is_some() {
            writeln!(
                f,
                "slot confirmed at LSN {}, slot lag {} bytes, {} reconnects, {} heartbeats, {} resyncs",
                lsn_text(&s.slot_confirmed_lsn),
                s.slot_lag_bytes.map_or_else(|| "-".to_owned(), |l| l.to_string()),
                s.reconnects.unwrap_or(0),
                s.heartbeats.unwrap_or(0),
                s.resyncs.unwrap_or(0),
            )?;
        }
        writeln!(
            f,
            "backfills: {} requests served, {} snapshot envelopes published",
            s.backfill_requests_served, s.snapshot_envelopes_published,
        )?;
        writeln!(
            f,
            "all sinks: {} batches redelivered, {} envelopes received again, {} transactions lost, {} envelopes lost",
            s.batches_redelivered, s.envelopes_received_again, s.transactions_lost, s.envelopes_lost,
        )?;
        for k in &s.per_sink {
            if let Some(d) = &k.sink_kill {
                let at = |p: Option<Position>| p.map_or_else(|| "none".to_owned(), |p| p.to_string());
                writeln!(
                    f,
                    "sink {} killed holding {} unacked batches at acked LSN {}: watermark at most {} while down (other sinks acked up to {}), {} batches redelivered after the re-attach",
                    k.name,
                    d.held_unacked,
                    at(d.acked_at_death),
                    at(d.max_watermark_while_down),
                    at(d.others_acked_while_down),
                    d.redelivered_after_reattach,
                )?;
            }
            writeln!(
                f,
                "sink {}: acked LSN {}, {} bytes written, {} consumer re-attaches",
                k.name,
                lsn_text(&k.acked_lsn),
                k.bytes_written,
                k.consumer_reattaches,
            )?;
            writeln!(
                f,
                "  transactions: {} received, {} lost; their envelopes: {} received, {} received again, {} lost",
                k.transactions_received,
                k.transactions_lost,
                k.envelopes_received,
                k.envelopes_received_again,
                k.envelopes_lost,
            )?;
            writeln!(
                f,
                "  batches: {} delivered ({} redelivered), {} nacked, {} processed ({} again), {} acks refused",
                k.batches_delivered,
                k.batches_redelivered,
                k.batches_nacked,
                k.batches_processed,
                k.batches_processed_again,
                k.batch_acks_refused,
            )?;
            writeln!(
                f,
                "  snapshot: {} envelopes processed; markers: {} delivered ({} redelivered), {} nacked, {} processed ({} again), {} acks refused",
                k.snapshot_envelopes_processed,
                k.snapshot_markers_delivered,
                k.snapshot_markers_redelivered,
                k.snapshot_markers_nacked,
                k.snapshot_markers_processed,
                k.snapshot_markers_processed_again,
                k.snapshot_marker_acks_refused,
            )?;
            if let Some(l) = &k.commit_to_ack {
                writeln!(
                    f,
                    "  commit to ack: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms ({} transactions)",
                    l.p50_ms, l.p99_ms, l.max_ms, l.samples
                )?;
            }
            if k.checkpoint_lsn.is_some() {
                writeln!(
                    f,
                    "  durable: state at LSN {}, {} items its state covered skipped",
                    lsn_text(&k.checkpoint_lsn),
                    k.items_covered
                )?;
            }
            if let Some(e) = &k.error {
                writeln!(f, "  error: {e}")?;
            }
        }
        if let Some(e) = &s.ingest_error {
            writeln!(f, "ingest error: {e}")?;
        }
        writeln!(f, "{}: {}", s.result, s.reason)
    }
}
