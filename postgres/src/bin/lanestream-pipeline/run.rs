//! One in-process run on the library's driver (`Pipeline`): the stream, the harness's source and sinks, the progress bar, the checks and the summary.

use crate::prelude::*;

pub(crate) fn run(args: &Args) -> Result<bool, BoxError> {
    if let Some(url) = &args.backend {
        return crate::redis::run(args, url);
    }
    let names = sink_names(args.sinks);
    let mut builder = MemoryStream::builder()
        .capacity(args.capacity)
        .request_capacity(usize::from(args.sinks).max(1) * 2)
        .sinks(names.iter().cloned());
    if let Some(bytes) = args.memory_budget {
        builder = builder.memory_budget(bytes);
    }
    let stream = builder.build()?;
    let lanes: Vec<Lane> = names.iter().map(|n| stream.lane(n)).collect::<Result<_, _>>()?;
    let live = args.source.is_some();
    let input = match &args.source {
        Some(url) => {
            if args.chaos {
                return Err("--chaos is for the file input; the live source's sinks are durable".into());
            }
            let mut config = LiveConfig::new(url.clone(), args.slot.clone());
            config.create_slot = args.create_slot;
            config.slot_wait = Duration::from_secs(args.slot_wait_secs);
            config.publication = args.publication.clone();
            config.heartbeat = args.heartbeat_secs.map(Duration::from_secs);
            config.publication_check =
                (args.publication_check_ms > 0).then(|| Duration::from_millis(args.publication_check_ms));
            config.status_interval = Duration::from_millis(args.status_interval_ms.max(1));
            if let Some(rows) = args.backfill_chunk_rows {
                config.backfill_chunk_rows = usize::try_from(rows).unwrap_or(usize::MAX);
            }
            // The start-up checks (the slot against the sinks' states, joiners) are the
            // pipeline's, when it starts (P1, P2).
            let source = LiveSource::connect(config)?;
            // Until SIGTERM/SIGINT or, with --end-lsn, until everything committed before it was published.
            let end = args.end_lsn.as_deref().map(Position::from_lsn).transpose()?;
            Input::Live(Box::new(source.with_builder(HarnessSource::builder(args)?).until(end)))
        }
        None => {
            let file = FileSource::new(open_input(&args.input, args.preload)?, HarnessSource::builder(args)?);
            // --chaos: the sinks' backfills are answered from the rows seen so far.
            Input::File(Box::new(if args.chaos { file.serve_backfills() } else { file }))
        }
    };
    if !args.discard {
        std::fs::create_dir_all(&args.out)
            .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    }

    // Durable sinks: always on the live source; on the file input with --kill-sink-after, so that
    // a sink engine killed mid-transaction resumes from its checkpoint (contract C1). A file
    // run starts afresh: an earlier run's checkpoints are for another input.
    let durable_sinks = live || args.kill_sink_after.is_some();
    if durable_sinks && !live && !args.discard {
        for name in &names {
            for file in [format!("{name}.ndjson"), format!("{name}.checkpoint")] {
                match std::fs::remove_file(args.out.join(&file)) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e.into()),
                    _ => {}
                }
            }
        }
    }

    let counters = Arc::new(Counters::default());
    let started = Instant::now();

    // The library's driver: the ingest on a thread of its own (the progress bar is drawn here),
    // one sink engine per sink.
    let backfill: Vec<IndexName> =
        args.backfill.iter().map(|i| IndexName::new(i.as_str())).collect::<Result<_, _>>()?;
    let mut pipeline = Pipeline::new(stream.clone())
        .tick(Duration::from_millis(args.poll_interval_ms.max(1)))
        .joiners(args.joiners.into())
        .backfill(backfill);
    let stop = pipeline.stop_handle();
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, stop.flag())?;
    }
    let mut states = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let lane = SinkName::new(name.as_str())?;
        let mut state = SinkShared::new(lane, stream.requests().sender());
        if !args.discard {
            if durable_sinks {
                // Durable: resume after the checkpoint, fsync before every ack.
                state.durable_dir = Some(args.out.clone());
            } else {
                let path = args.out.join(format!("{name}.ndjson"));
                let file =
                    File::create(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
                state.plain = Some(BufWriter::with_capacity(1 << 16, file));
            }
        }
        state.slow =
            (args.slow_sink && i + 1 == names.len()).then(|| Duration::from_micros(args.slow_sink_micros));
        state.chaos = args.chaos.then(|| StdRng::seed_from_u64(args.seed.wrapping_add(i as u64)));
        state.kill = args.kill_sink_after.filter(|_| i == 0).map(|after| Kill {
            after,
            down: Duration::from_millis(args.sink_down_ms),
            stream: stream.clone(),
            others: names.iter().filter(|n| *n != name).cloned().collect(),
        });
        let state = Arc::new(Mutex::new(state));
        let opened = state.clone();
        pipeline = pipeline.sink(name.as_str(), move || SinkShared::open(&opened));
        states.push(state);
    }
    let expected_backfills = if args.chaos { u64::from(args.sinks) } else { 0 };
    let mut source = HarnessSource::new(input, args, counters.clone(), expected_backfills);
    // --backfill (live mode): owed by every sink, durably, then asked (Pipeline::backfill); the
    // driver serves the requests through the source and acks each after its SnapshotComplete (R2).
    let ingest_thread = thread::Builder::new().name("ingest".into()).spawn(move || {
        let result = pipeline.run(&mut source);
        (result, source)
    })?;

    // Progress until the pipeline is done: the stream's bar, and one per table being backfilled.
    // On stderr, drawn only when it is a terminal (indicatif's stderr target hides itself
    // otherwise).
    let bars = if args.quiet {
        MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::hidden())
    } else {
        MultiProgress::new()
    };
    let bar = bars.add(ProgressBar::new_spinner());
    bar.set_style(ProgressStyle::with_template(
        "{spinner} {elapsed_precise} {human_pos} changes ({per_sec}) {msg}",
    )?);
    let mut backfill_bars = BackfillBars::default();
    while !ingest_thread.is_finished() {
        if let Ok(progress) = counters.backfill.lock() {
            backfill_bars.update(&bars, &progress)?;
        }
        bar.set_position(counters.changes.load(Ordering::Relaxed));
        let lags: Vec<String> = lanes.iter().map(|l| format!("{}:{}", l.name(), l.stats().lag())).collect();
        bar.set_message(format!(
            "{} txns, watermark {}, lag {}",
            counters.transactions.load(Ordering::Relaxed),
            stream.watermark().map_or_else(|| "-".to_owned(), |p| p.to_string()),
            lags.join(" ")
        ));
        bar.tick();
        thread::sleep(Duration::from_millis(20));
    }
    backfill_bars.clear();
    bar.finish_and_clear();
    let (result, mut source) = ingest_thread.join().map_err(|_| "the ingest thread panicked")?;
    let elapsed = started.elapsed().as_secs_f64();
    let mut sinks: Vec<SinkReport> = states
        .iter()
        .map(|s| std::mem::take(&mut s.lock().unwrap_or_else(std::sync::PoisonError::into_inner).report))
        .collect();
    let mut ingest_error = None;
    let pipeline_report = match result {
        Ok(report) => {
            // What the driver published (a batch handed over while a stop came is not).
            source.published.retain(|&(p, _)| report.last_position.is_some_and(|last| p <= last.0));
            for (s, r) in sinks.iter_mut().zip(&report.sinks) {
                s.batches.redelivered = r.redelivered;
                s.batches.acks_refused = r.acks_refused;
                s.commit_to_ack = r.commit_to_ack;
                s.checkpoint = r.position;
                s.covered = r.covered;
            }
            Some(report)
        }
        Err(PipelineError::Sink { sink, error, attempts }) => {
            if let Some(s) = sinks.iter_mut().find(|s| s.name == sink.as_str()) {
                s.error = Some(format!("gave up after {attempts} attempts: {error}"));
            }
            None
        }
        Err(e) => {
            ingest_error = Some(e.to_string());
            None
        }
    };
    let last_commit = source.last_commit();
    // The live source's last read of the slot: the driver confirmed it at the final watermark.
    let mut slot_confirmed = None;
    let mut live_metrics = None;
    if let Input::Live(live) = &mut source.input {
        match live.read_confirmed() {
            Ok(c) => {
                slot_confirmed = c;
                live_metrics = live.metrics().ok();
            }
            Err(e) => {
                ingest_error.get_or_insert(format!("final confirm: {e}"));
            }
        }
    }

    // Every sink must have received every positioned batch and every envelope at least once;
    // the checks' verdict is part of the summary, so the text and the JSON say the same.
    let mut failures: Vec<String> = Vec::new();
    if let Some(e) = &ingest_error {
        eprintln!("error: {e}");
        failures.push(format!("ingest: {e}"));
    }
    let mut per_sink = Vec::with_capacity(sinks.len());
    for (s, lane) in sinks.iter().zip(&lanes) {
        // What the source sent again up to the sink's state at start is covered by that state:
        // the engine acked it without handing it to the sink (its output check below reads it).
        let published: Vec<(u64, u32)> = match s.started_at {
            Some(p) => source.published.iter().copied().filter(|&(q, _)| q > p.0).collect(),
            None => source.published.clone(),
        };
        let (transactions_lost, envelopes_lost) = s.received.lost(&published);
        if let Some(e) = &s.error {
            eprintln!("error: sink {}: {e}", s.name);
            failures.push(format!("sink {}: {e}", s.name));
        }
        if transactions_lost > 0 || envelopes_lost > 0 {
            let what = format!(
                "sink {} never received {transactions_lost} transactions / {envelopes_lost} envelopes",
                s.name
            );
            eprintln!("error: {what}");
            failures.push(what);
        }
        if let Some(k) = &s.kill {
            if k.max_watermark_while_down > k.acked_at_death {
                failures.push(format!(
                    "sink {} was dead at {} and the watermark reached {} meanwhile",
                    s.name,
                    lsn_text(&lsn(k.acked_at_death)),
                    lsn_text(&lsn(k.max_watermark_while_down))
                ));
            }
            if k.redelivered_after_reattach < k.held_unacked {
                failures.push(format!(
                    "sink {} died holding {} unacked batches; only {} came again",
                    s.name, k.held_unacked, k.redelivered_after_reattach
                ));
            }
        }
        if durable_sinks && !args.discard {
            // The sink's output itself, read back, against what the source published: each
            // transaction's envelopes exactly once (what the sink says it received is not
            // enough: acked chunks were once cut off by a restart while the counts said PASS).
            let path = args.out.join(format!("{}.ndjson", s.name));
            let since = live.then(|| source.published.first().map_or(u64::MAX, |&(p, _)| p));
            let (lost, duplicates) = check_output(&path, &source.published, since)?;
            if lost.1 > 0 || duplicates > 0 {
                let what = format!(
                    "sink {}'s output lacks {} transactions / {} envelopes and holds {duplicates} envelopes twice",
                    s.name, lost.0, lost.1
                );
                eprintln!("error: {what}");
                failures.push(what);
            }
        }
        per_sink.push(SinkSummary::new(s, lsn(lane.stats().acked), transactions_lost, envelopes_lost));
    }
    let (transactions_discarded, changes_discarded) = (
        counters.transactions_discarded.load(Ordering::Relaxed),
        counters.changes_discarded.load(Ordering::Relaxed),
    );
    if changes_discarded > 0 || transactions_discarded > 0 {
        let what = format!(
            "{transactions_discarded} transactions ({changes_discarded} changes, bad lines included) were discarded whole because of bad input lines: lost"
        );
        eprintln!("error: {what}");
        failures.push(what);
    }
    if let Some(after) = args.kill_sink_after {
        if sinks.first().is_some_and(|s| s.kill.is_none()) {
            failures.push(format!("--kill-sink-after {after}: the sink never processed that many batches"));
        }
    }
    let final_watermark = stream.watermark();
    if final_watermark != last_commit {
        let what = format!(
            "final watermark {} is not the last commit LSN {}",
            lsn_text(&lsn(final_watermark)),
            lsn_text(&lsn(last_commit))
        );
        eprintln!("error: {what}");
        failures.push(what);
    }

    // What was published: the driver's count, or (it stopped with an error) what was handed over.
    let (transactions, chunks, changes, envelopes) = match &pipeline_report {
        Some(r) => (r.transactions, r.chunks, r.changes, r.envelopes),
        None => (
            counters.transactions.load(Ordering::Relaxed),
            counters.chunks.load(Ordering::Relaxed),
            counters.changes.load(Ordering::Relaxed),
            counters.envelopes.load(Ordering::Relaxed),
        ),
    };
    // Never past the watermark: what every sink holds (an idle slot follows the server's WAL
    // through empty positioned batches every sink acks).
    if let (Some(confirmed), Some(watermark)) = (slot_confirmed, final_watermark) {
        if confirmed > watermark {
            let what = format!("the slot was confirmed at {confirmed}, past the final watermark {watermark}");
            eprintln!("error: {what}");
            failures.push(what);
        }
    }
    // Live mode: every sink's whole output against the tables, when the run ended at --end-lsn
    // (a run stopped mid-stream cannot be compared with tables that moved on).
    let mut rows_compared = None;
    let ended = pipeline_report.as_ref().is_some_and(|r| !r.stopped);
    if let (Some(url), true, false) = (&args.source, ended, args.discard) {
        if failures.is_empty() {
            match crate::tables::compare(url, &args.publication, &args.out, &names) {
                Ok((differ, rows)) => {
                    for what in differ {
                        eprintln!("error: {what}");
                        failures.push(what);
                    }
                    rows_compared = Some(rows);
                }
                Err(e) => failures.push(format!("cannot compare the outputs with the tables: {e}")),
            }
        }
    }
    let verdict = match (failures.is_empty(), live, rows_compared) {
        (false, _, _) => "FAIL",
        (true, true, None) => "UNCOMPARED",
        (true, _, _) => "PASS",
    };
    let reason = if failures.is_empty() {
        let compared = match (live, rows_compared) {
            (false, _) if durable_sinks && !args.discard => {
                "; every sink's output, read back, holds the whole input's changes exactly once".to_owned()
            }
            (false, _) => "; counted as each sink received them, against the whole input".to_owned(),
            (true, Some(rows)) => format!("; every sink's whole output, replayed, equals the publication's tables ({rows} rows)"),
            (true, None) => "; the outputs were not compared with the tables (the run was stopped mid-stream, or --discard): run to --end-lsn with the writes stopped for that".to_owned(),
        };
        format!(
            "each of the {} sinks received all {transactions} transactions ({envelopes} envelopes) at least once, and the final watermark {} is the last commit LSN{compared}",
            args.sinks,
            lsn_text(&lsn(final_watermark)),
        )
    } else {
        one_line(&failures.join("; "))
    };
    let mut summary = Summary {
        schema_version: 1,
        result: verdict,
        reason,
        input: match &args.source {
            Some(url) => format!("slot {} on {}", args.slot, redact(url)),
            None => args.input.display().to_string(),
        },
        slot_confirmed_lsn: lsn(slot_confirmed),
        slot_lag_bytes: live_metrics.and_then(|m| m.slot_lag_bytes),
        reconnects: live_metrics.map(|m| m.reconnects),
        heartbeats: live_metrics.map(|m| m.heartbeats),
        resyncs: live_metrics.map(|m| m.resyncs),
        output_dir: (!args.discard).then(|| args.out.display().to_string()),
        sink_count: args.sinks,
        discard: args.discard,
        preload: args.preload,
        chaos: args.chaos,
        slow_sink: args.slow_sink,
        transactions_published: transactions,
        chunks_published: chunks,
        changes_published: changes,
        envelopes_published: envelopes,
        bad_lines_skipped: counters.bad_lines.load(Ordering::Relaxed),
        transactions_discarded,
        changes_discarded,
        last_commit_lsn: lsn(last_commit),
        final_watermark_lsn: lsn(final_watermark),
        stream_idle: stream.is_idle(),
        backfill_requests_served: pipeline_report.as_ref().map_or(0, |r| r.backfills_served),
        snapshot_envelopes_published: pipeline_report.as_ref().map_or(0, |r| r.snapshot_envelopes),
        batches_redelivered: per_sink.iter().map(|s| s.batches_redelivered).sum(),
        envelopes_received_again: per_sink.iter().map(|s| s.envelopes_received_again).sum(),
        transactions_lost: per_sink.iter().map(|s| s.transactions_lost).sum(),
        envelopes_lost: per_sink.iter().map(|s| s.envelopes_lost).sum(),
        // Rounded to what the text shows, so that both show the same numbers.
        elapsed_seconds: (elapsed * 1000.0).round() / 1000.0,
        changes_per_second: if elapsed > 0.0 { (changes as f64 / elapsed).round() as u64 } else { 0 },
        commit_to_decode: LatencyMs::of(source.commit_to_decode.summary()),
        commit_to_last_ack: LatencyMs::slowest(per_sink.iter().filter_map(|s| s.commit_to_ack.as_ref())),
        // The pipeline's own peak, read when its run ended: not the check against the tables
        // after it, which holds every sink's replayed output.
        peak_rss_bytes: pipeline_report
            .as_ref()
            .and_then(|r| r.peak_rss_bytes)
            .or_else(lanestream_postgres::pipeline::peak_rss_bytes),
        ingest_error: ingest_error.as_deref().map(one_line),
        per_sink,
    };

    // The JSON first: if it cannot be written, the run fails and the text says so.
    if let Some(path) = &args.summary_json {
        let written = serde_json::to_string_pretty(&summary)
            .map_err(BoxError::from)
            .and_then(|text| std::fs::write(path, text + "\n").map_err(BoxError::from));
        if let Err(e) = written {
            let what = format!("cannot write {}: {e}", path.display());
            eprintln!("error: {what}");
            summary.fail(what);
        }
    }
    // The summary goes to stdout; a closed stdout (e.g. `| head`) is not an error of the run.
    let _ = write!(io::stdout().lock(), "{summary}");
    Ok(summary.result != "FAIL")
}

/// The backfill's bars: one per table being backfilled (per sink that asked), rows read against
/// the table's estimate, both from the source's progress ([`LiveSource::backfill_progress`]);
/// a bar is cleared when its table is done.
#[derive(Default)]
pub(crate) struct BackfillBars {
    bars: Vec<ProgressBar>,
}

impl BackfillBars {
    pub(crate) fn update(
        &mut self,
        bars: &MultiProgress,
        progress: &[BackfillProgress],
    ) -> Result<(), BoxError> {
        for (i, p) in progress.iter().enumerate() {
            if i == self.bars.len() {
                // `reltuples` is -1 for a table never analysed: then a count without a length.
                let bar = match u64::try_from(p.estimated_rows) {
                    Ok(estimate) => {
                        let bar = ProgressBar::new(estimate);
                        bar.set_style(ProgressStyle::with_template(
                            "  backfill {prefix} {wide_bar} {human_pos}/~{human_len} rows ({eta})",
                        )?);
                        bar
                    }
                    Err(_) => {
                        let bar = ProgressBar::new_spinner();
                        bar.set_style(ProgressStyle::with_template(
                            "  backfill {prefix} {spinner} {human_pos} rows",
                        )?);
                        bar
                    }
                };
                bar.set_prefix(format!("{} → {}", p.table, p.sink));
                self.bars.push(bars.add(bar));
            }
            let bar = &self.bars[i];
            if bar.is_finished() {
                continue;
            }
            // The estimate is an estimate: a table grown since its last ANALYZE runs past it.
            if bar.length().is_some_and(|len| p.rows_read > len) {
                bar.set_length(p.rows_read);
            }
            bar.set_position(p.rows_read);
            if p.done {
                bar.finish_and_clear();
            }
        }
        Ok(())
    }

    pub(crate) fn clear(&self) {
        for bar in &self.bars {
            bar.finish_and_clear();
        }
    }
}
