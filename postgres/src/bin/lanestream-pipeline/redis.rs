//! `--backend redis://...`: the pipeline as separate processes over [`RedisStream`](lanestream::RedisStream), one role
//! each (`--role ingest`, `--role sink --lane NAME`, `--role delete`).
//!
//! - **ingest** is the pipeline library's driver ([`Pipeline`]) with no local sink engine: it
//!   reads the input (the bundled capture by default), publishes each transaction once to every
//!   sink's lane of the Redis stream `--stream-name` through the stream's fan-out (written once
//!   into the Redis log), waits (the whole run at most `--wait-secs`) until the sinks acked it,
//!   closes the lanes, then checks every
//!   sink's output in `--out` (unless `--discard`): each published transaction's envelopes are
//!   there exactly once. A restarted ingest publishes nothing twice: it resumes after the
//!   batches the log already holds (the publish count is in Redis; the input must be the same).
//! - **sink** re-attaches to its lane (a restarted sink gets its unacked batches again, in
//!   order), writes each batch's envelopes as NDJSON to `--out/<lane>.ndjson` and acks only after
//!   the output and its checkpoint are on disk (the live mode's durable sink: after a restart it
//!   cuts the output back to its checkpoint and skips what it already applied, so the output
//!   holds every change exactly once however the process dies). It ends when its lane is closed
//!   and drained.
//! - **delete** removes every key of the stream.
//!
//! The sinks' outputs must be readable by the ingest for its check (one machine, or a shared
//! directory); with `--discard` it checks the watermark only. `scripts/e2e-redis.sh` runs the
//! three sinks and the ingest as processes and SIGKILLs one sink mid-run.

use std::thread;
use std::time::{Duration, Instant};

use lanestream::{Position, RedisStream, Stream};

use lanestream_postgres::ndjson::{DurableNdjson, NdjsonError};
use lanestream_postgres::pipeline::{run_sink, RetryPolicy, Sink, SinkState, StopHandle};

use crate::prelude::*;

/// What a process of the multi-process pipeline does.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Publish the input to every lane, then wait for the watermark and check the outputs.
    Ingest,
    /// Apply one lane (`--lane NAME`) to `--out/NAME.ndjson`, durably, until it is closed.
    Sink,
    /// Remove every key of the stream.
    Delete,
}

/// Runs this process's role; `Ok(true)` on PASS.
pub(crate) fn run(args: &Args, url: &str) -> Result<bool, BoxError> {
    let role = args.role.ok_or("--backend needs --role ingest, --role sink --lane NAME, or --role delete")?;
    if args.source.is_some() || args.chaos {
        return Err(
            "--backend runs the file input without --chaos (--source and --chaos are in-process modes)"
                .into(),
        );
    }
    let names = sink_names(args.sinks);
    let stream = RedisStream::builder(url, &args.stream_name)
        .capacity(args.capacity)
        .request_capacity(usize::from(args.sinks).max(1) * 2)
        .sinks(names.iter().cloned())
        .build()?;
    match role {
        Role::Ingest => ingest(args, &stream, &names),
        Role::Sink => {
            let lane = args.lane.as_deref().ok_or("--role sink needs --lane NAME")?;
            if !names.iter().any(|n| n == lane) {
                return Err(format!(
                    "--lane {lane}: not one of this pipeline's sinks ({})",
                    names.join(", ")
                )
                .into());
            }
            sink(args, &stream, lane)
        }
        Role::Delete => {
            stream.delete()?;
            println!("deleted the Redis stream {}", args.stream_name);
            Ok(true)
        }
    }
}

/// The ingest process: the library's driver ([`Pipeline`]) with no local sink engine (the sinks
/// are other processes). A restarted ingest reads the input from its start: the driver skips
/// what the lanes hold already (see `Pipeline::run`, "Resuming").
fn ingest(args: &Args, stream: &RedisStream, names: &[String]) -> Result<bool, BoxError> {
    let started = Instant::now();
    let file = FileSource::new(open_input(&args.input, args.preload)?, HarnessSource::builder(args)?);
    let input = Input::File(Box::new(file));
    let harness = HarnessSource::new(input, args, Arc::new(Counters::default()), 0);
    let mut source = harness;
    // --wait-secs bounds the whole run (the driver's drain at the input's end waits for every
    // sink's ack; a stop makes it wait at most its drain timeout, then close the lanes).
    let pipeline = Pipeline::new(stream.clone()).drain_timeout(Duration::ZERO);
    let stop = pipeline.stop_handle();
    let wait = Duration::from_secs(args.wait_secs);
    let deadline = started + wait;
    thread::Builder::new().name("ingest-deadline".into()).spawn({
        let stop = stop.clone();
        move || {
            thread::sleep(wait);
            stop.stop();
        }
    })?;
    let report = pipeline.run(&mut source).map_err(|e| format!("ingest: {e}"))?;
    let published = source.published;
    let skipped = report.skipped;
    let last_commit = published.last().map(|&(p, _)| Position(p));
    println!(
        "ingest: {} transactions read, {} batches published once to each of {} lanes ({skipped} published by an earlier run) in {:.2} s; lanes closed{}",
        published.len(),
        report.transactions + report.chunks,
        names.len(),
        started.elapsed().as_secs_f64(),
        if report.drain_timed_out { " (the sinks' acks were not all in by --wait-secs)" } else { "" }
    );

    // The sinks ack up to the last commit (the watermark is read from Redis).
    // Woken by the acks (a blip of Redis is waited out, up to the deadline, as an unmoved
    // watermark); it returns early once every lane is closed and acked.
    let watermark = match last_commit {
        Some(at_least) => stream.wait_watermark(at_least, Some(deadline)),
        None => stream.watermark(),
    };
    let mut failures = Vec::new();
    if watermark != last_commit {
        failures.push(format!(
            "final watermark {} is not the last commit LSN {} after {} s",
            lsn_text(&lsn(watermark)),
            lsn_text(&lsn(last_commit)),
            args.wait_secs
        ));
    }
    let (mut lost_total, mut duplicates_total) = (0u64, 0u64);
    for name in names {
        let acked = stream.acked(name)?;
        if args.discard {
            println!("sink {name}: acked {}", lsn_text(&lsn(acked)));
            continue;
        }
        let (lost, duplicates) = check_output(&args.out.join(format!("{name}.ndjson")), &published, None)?;
        println!(
            "sink {name}: acked {}, output lost {} transactions / {} envelopes, {duplicates} envelopes written twice",
            lsn_text(&lsn(acked)),
            lost.0,
            lost.1
        );
        lost_total += lost.1;
        duplicates_total += duplicates;
        if lost.1 > 0 || duplicates > 0 {
            failures.push(format!("sink {name}: {} envelopes lost, {duplicates} duplicated", lost.1));
        }
    }
    println!(
        "final watermark {}, last commit LSN {}, idle {}",
        lsn_text(&lsn(watermark)),
        lsn_text(&lsn(last_commit)),
        stream.try_is_idle()?
    );
    if !args.discard {
        println!("lost {lost_total}, duplicated {duplicates_total}");
    }
    if failures.is_empty() {
        println!(
            "PASS: every sink acked all {} transactions over Redis and the final watermark is the last commit LSN {}{}",
            published.len(),
            lsn_text(&lsn(last_commit)),
            if args.discard { "" } else { "; each output holds every envelope exactly once" }
        );
        Ok(true)
    } else {
        println!("FAIL: {}", failures.join("; "));
        Ok(false)
    }
}

/// A sink process: the pipeline library's sink engine ([`run_sink`]) on the lane, until it is
/// closed and drained (or SIGTERM/SIGINT).
///
/// The engine claims the lane first (fencing any older engine of it), then opens the output as
/// its only writer: an older engine still running holds the output's lock until it notices the
/// fence (its next receive fails: it stops with an error) and exits, so nothing it writes can land
/// after this engine's open has cut the output back to the checkpoint
/// ([C1](lanestream::contract#c1)).
fn sink(args: &Args, stream: &RedisStream, lane: &str) -> Result<bool, BoxError> {
    let started = Instant::now();
    if !args.discard {
        std::fs::create_dir_all(&args.out)
            .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    }
    let stop = StopHandle::new();
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, stop.flag())?;
    }
    let mut resumed_at = None;
    let open = || -> Result<RoleSink, NdjsonError> {
        let out =
            if args.discard { None } else { Some(DurableNdjson::open(&args.out, lane, OUTPUT_LOCK_WAIT)?) };
        resumed_at = resumed_at.or(out.as_ref().and_then(|d| d.state()).and_then(|s| s.position));
        Ok(RoleSink { out, slow: args.slow_sink.then(|| Duration::from_micros(args.slow_sink_micros)) })
    };
    let report = run_sink(stream, lane, open, RetryPolicy::default(), 256, &stop)?;
    println!(
        "sink {lane}: {} deliveries acked ({} redeliveries, {} failed runs retried{}) in {:.2} s; lane closed and drained, acked {}",
        report.items_acked,
        report.redelivered,
        report.retries,
        resumed_at.map_or_else(String::new, |p| format!(", resumed after checkpoint {p}")),
        started.elapsed().as_secs_f64(),
        lsn_text(&lsn(stream.acked(lane)?))
    );
    Ok(true)
}

/// How long a sink engine waits for an older engine of its lane to let the output go (it does
/// when it notices it was fenced).
const OUTPUT_LOCK_WAIT: Duration = Duration::from_secs(30);

/// A sink process's sink: the durable NDJSON output (none with `--discard`), slowed down per
/// batch with `--slow-sink`.
struct RoleSink {
    out: Option<DurableNdjson>,
    slow: Option<Duration>,
}

impl Sink for RoleSink {
    type Error = NdjsonError;

    fn state(&mut self) -> Result<Option<SinkState>, NdjsonError> {
        self.out.as_mut().map_or(Ok(None), Sink::state)
    }

    fn apply(&mut self, items: &[LaneItem]) -> Result<(), NdjsonError> {
        if let Some(out) = &mut self.out {
            Sink::apply(out, items)?;
        }
        if let Some(d) = self.slow {
            thread::sleep(d * u32::try_from(items.len()).unwrap_or(u32::MAX));
        }
        Ok(())
    }

    fn commit(&mut self, state: &SinkState) -> Result<(), NdjsonError> {
        self.out.as_mut().map_or(Ok(()), |out| Sink::commit(out, state))
    }
}
