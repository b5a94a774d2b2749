//! The event log against its peers in **interleaved rounds**: every round runs each contender
//! once on the same workload (in an order rotated by round), so a load change on a shared machine
//! hits every contender alike; the figure reported per row is the median over rounds of
//! `peer time / lanestream[durable] time` (> 1: lanestream is faster), with the range.
//!
//! Criterion (`benches/log.rs`) measures each contender for a second or more before the next
//! starts; on this project's 2-core machine, shared with builds, that alone moved a ratio by 2x
//! between runs. The contenders and workloads are the same (`src/lib.rs`).
//!
//! `cargo bench --manifest-path log/benches/log-peers/Cargo.toml --bench alternate -- [--rounds N]
//! [--scale X] [--cold-events N] [--cold-batch N] [--cold-reads N] [--cold-dir PATH] [--cold-rss]
//! [--no-cold] [FILTER]`:
//! FILTER keeps the rows whose name contains it; `--scale` multiplies the work per measurement
//! (default 1: about 10-50 ms per contender on this machine). Run by
//! `scripts/bench-ratios.sh --log`.
//!
//! The **cold row** (`log_read/cold_selective/readers_16`): a log of `--cold-events` events
//! (default `LOGBENCH_COLD_EVENTS`, else 8,000,000) of 256-byte payloads, one `entity:{k}` tag
//! each, 10 events per entity spread across the whole log, written by 16 threads in appends of
//! `--cold-batch` events (default 512), and a cache budget of 512 MiB at 8M events (in proportion
//! for other sizes: the log about 3.8x the budget): lanestream's `cache_bytes`, umadb's
//! `page_cache_max_mb`; tephra has no cache of its own. Each contender's log is written once into
//! `--cold-dir` (default `LOGBENCH_COLD_DIR`, else `logbench-cold` in cargo's target tmp
//! directory: the real disk, not tmpfs), kept across runs (delete it when done), then opened once
//! and kept open; every round drops the page cache (`sync; echo 3 >
//! /proc/sys/vm/drop_caches`: root only, else the row says the cache stayed warm) before each
//! contender's turn, and 16 reader threads each read `--cold-reads` (default 32) entities picked
//! at random (the same ones for every contender of a round), each read returning all of that
//! entity's events. `--cold-rss` instead opens only lanestream's log (written by an earlier run)
//! in this process, runs the row's reads for `--rounds` rounds and prints the process's peak RSS
//! against the bound (cache budget + the index's bytes per event at the row's shape × events
//! + 64 MiB; [`INDEX_BYTES_PER_EVENT`]).

use std::path::PathBuf;
use std::time::Duration;

use lanestream_log_bench::{
    cold_contenders, cold_reads, disk_read_bytes, drop_page_cache, durable_contenders, fanout_run, filled,
    peak_rss_bytes, rss_bytes, run_appends, ColdSpec, Store, ACCOUNTS, COLD_READERS, READ_LOG,
};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The contender every ratio is taken against.
const OURS: &str = "lanestream[durable]";

/// One measurement: a contender's store and the workload's time on it.
type Measure = dyn Fn(&dyn Store) -> Duration;

fn main() {
    let mut rounds = 9usize;
    let mut scale = 1.0f64;
    let mut filter = String::new();
    let env_events =
        std::env::var("LOGBENCH_COLD_EVENTS").ok().map(|v| v.parse().expect("LOGBENCH_COLD_EVENTS=N"));
    let env_dir = std::env::var_os("LOGBENCH_COLD_DIR").map(PathBuf::from);
    let mut cold = ColdSpec {
        events: env_events.unwrap_or(8_000_000),
        root: env_dir.unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("logbench-cold")),
        batch: 512,
    };
    let mut cold_reads_per_reader = 32usize;
    let mut rss_only = false;
    let mut no_cold = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => rounds = args.next().and_then(|v| v.parse().ok()).expect("--rounds N"),
            "--scale" => scale = args.next().and_then(|v| v.parse().ok()).expect("--scale X"),
            "--cold-events" => {
                cold.events = args.next().and_then(|v| v.parse().ok()).expect("--cold-events N")
            }
            "--cold-reads" => {
                cold_reads_per_reader = args.next().and_then(|v| v.parse().ok()).expect("--cold-reads N")
            }
            "--cold-dir" => cold.root = args.next().map(PathBuf::from).expect("--cold-dir PATH"),
            "--cold-rss" => rss_only = true,
            "--cold-batch" => cold.batch = args.next().and_then(|v| v.parse().ok()).expect("--cold-batch N"),
            "--no-cold" => no_cold = true,
            "--bench" => {} // passed by `cargo bench`
            other if other.starts_with('-') => panic!("unknown argument {other}"),
            other => filter = other.to_string(),
        }
    }
    let n = |base: u64| ((base as f64 * scale).ceil() as u64).max(1);
    if rss_only {
        cold_rss(&cold, cold_reads_per_reader, rounds);
        return;
    }

    println!("row | contender | median peer/ours | min..max ({rounds} rounds)");
    for conditional in [false, true] {
        for batch in [1usize, 64, 512] {
            for writers in [1usize, 16] {
                let kind = if conditional { "conditional" } else { "unconditional" };
                let row = format!("log_append/{kind}/batch_{batch}/writers_{writers}");
                let appends = n(match batch {
                    1 => 2_000,
                    64 => 250,
                    _ => 40,
                });
                let measure = move |s: &dyn Store| run_appends(s, writers, batch, conditional, appends);
                run_row(&row, &filter, rounds, false, &measure);
            }
        }
    }
    for (name, tag) in [("selective", Some("acct:7")), ("full_scan", None)] {
        let row = format!("log_read/{name}");
        let reads = n(if tag.is_some() { 200 } else { 5 });
        let expect = if tag.is_some() { READ_LOG / ACCOUNTS } else { READ_LOG };
        let measure = move |s: &dyn Store| {
            let start = std::time::Instant::now();
            for _ in 0..reads {
                assert_eq!(s.read(tag), expect, "a read returned the wrong number of events");
            }
            start.elapsed()
        };
        run_row(&row, &filter, rounds, true, &measure);
    }
    let batches = n(100);
    run_row("log_fanout/subscribers_4", &filter, rounds, false, &move |s: &dyn Store| fanout_run(s, batches));
    if !no_cold {
        cold_row(&cold, &filter, rounds, cold_reads_per_reader);
    }
}

const COLD_ROW: &str = "log_read/cold_selective/readers_16";

/// What lanestream's index holds per event at the cold row's shape (10 events per tag, appends
/// of 512), in bytes, as the crate docs state it (`log/src/lib.rs`, "Memory": 106.4 measured at
/// 8M events by `log/tests/footprint.rs`), rounded up.
const INDEX_BYTES_PER_EVENT: u64 = 107;

/// The cold row: every contender's log opened (written first if need be), then `rounds`
/// interleaved rounds, the page cache dropped before each contender's turn.
fn cold_row(spec: &ColdSpec, filter: &str, rounds: usize, reads: usize) {
    if !COLD_ROW.contains(filter) {
        return;
    }
    eprintln!(
        "cold row: {} events, {} entities, appends of {}, cache budget {} MiB, in {}",
        spec.events,
        spec.entities(),
        spec.batch,
        spec.cache_bytes() >> 20,
        spec.root.display()
    );
    let contenders: Vec<_> =
        cold_contenders().into_iter().map(|(id, make)| (id, spec.open(id, make))).collect();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
    let mut events = vec![0u64; contenders.len()];
    let mut disk = vec![0u64; contenders.len()];
    let mut dropped = true;
    for round in 0..rounds {
        for k in 0..contenders.len() {
            let i = (k + round) % contenders.len();
            dropped &= drop_page_cache();
            let before = disk_read_bytes().unwrap_or(0);
            let (t, n) = cold_reads(&*contenders[i].1, spec, reads, round as u64);
            disk[i] += disk_read_bytes().unwrap_or(0) - before;
            times[i].push(t.as_secs_f64());
            events[i] += n;
        }
    }
    let ids: Vec<&str> = contenders.iter().map(|(id, _)| *id).collect();
    print_ratios(COLD_ROW, &ids, &times);
    for (i, id) in ids.iter().enumerate() {
        let total: f64 = times[i].iter().sum();
        println!(
            "{COLD_ROW} | {id} | {:.0} events/s over all rounds \
             ({COLD_READERS} readers x {reads} reads per round), {:.0} bytes read from disk per event{}",
            events[i] as f64 / total,
            disk[i] as f64 / events[i] as f64,
            if dropped { "" } else { " | PAGE CACHE NOT DROPPED (not root): warm, not cold" }
        );
    }
}

/// `--cold-rss`: this process opens lanestream's cold log and runs the cold reads; its peak RSS
/// against the bound.
fn cold_rss(spec: &ColdSpec, reads: usize, rounds: usize) {
    let (id, make) = cold_contenders().into_iter().find(|(id, _)| *id == OURS).unwrap();
    assert!(
        spec.is_written(id),
        "no complete cold log of {} events in {}: run the cold row first",
        spec.events,
        spec.root.display()
    );
    let log = spec.open(id, make);
    let (open_peak, open_rss) = (peak_rss_bytes().unwrap_or(0), rss_bytes().unwrap_or(0));
    let mut dropped = true;
    let mut rates = Vec::new();
    let (mut events, mut disk) = (0u64, 0u64);
    for round in 0..rounds {
        dropped &= drop_page_cache();
        let before = disk_read_bytes().unwrap_or(0);
        let (t, n) = cold_reads(&*log, spec, reads, round as u64);
        disk += disk_read_bytes().unwrap_or(0) - before;
        events += n;
        rates.push(n as f64 / t.as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    let (peak, rss) = (peak_rss_bytes().unwrap_or(0), rss_bytes().unwrap_or(0));
    let bound = spec.cache_bytes() + INDEX_BYTES_PER_EVENT * spec.events + (64 << 20);
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    println!(
        "cold rss: {} events (appends of {}), cache {} MiB: after open RSS {:.0} MiB (peak {:.0}); after \
         {rounds} rounds RSS {:.0} MiB, peak {:.0} MiB; bound {:.0} MiB (cache + {INDEX_BYTES_PER_EVENT} B x \
         events + 64 MiB): {}; median {:.0} events/s{}, {:.0} bytes read from disk per event read",
        spec.events,
        spec.batch,
        spec.cache_bytes() >> 20,
        mib(open_rss),
        mib(open_peak),
        mib(rss),
        mib(peak),
        mib(bound),
        if peak <= bound { "within" } else { "OVER" },
        rates[rates.len() / 2],
        if dropped { ", page cache dropped" } else { ", PAGE CACHE NOT DROPPED" },
        disk as f64 / events as f64
    );
}

/// Runs one row: every contender `rounds` times, interleaved; prints the ratios.
fn run_row(row: &str, filter: &str, rounds: usize, prefilled: bool, measure: &Measure) {
    if !row.contains(filter) {
        return;
    }
    let fanout = row.starts_with("log_fanout");
    let contenders: Vec<_> = durable_contenders()
        .into_iter()
        // umadb-core has no embedded subscription.
        .filter(|(id, _)| !(fanout && id.starts_with("umadb")))
        .map(|(id, make)| (id, if prefilled { filled(make) } else { make() }))
        .collect();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
    for round in 0..rounds {
        for k in 0..contenders.len() {
            let i = (k + round) % contenders.len();
            times[i].push(measure(&*contenders[i].1).as_secs_f64());
        }
    }
    let ids: Vec<&str> = contenders.iter().map(|(id, _)| *id).collect();
    print_ratios(row, &ids, &times);
}

/// Prints a row's ratios (peer time / ours, per round; median and range).
fn print_ratios(row: &str, ids: &[&str], times: &[Vec<f64>]) {
    let ours = ids.iter().position(|id| *id == OURS).expect("lanestream[durable] runs");
    for (i, id) in ids.iter().enumerate() {
        if i == ours {
            let mut t = times[i].clone();
            t.sort_by(f64::total_cmp);
            println!("{row} | {id} | median {:.3} ms per measurement | ", t[t.len() / 2] * 1e3);
            continue;
        }
        let mut ratios: Vec<f64> = times[i].iter().zip(&times[ours]).map(|(p, o)| p / o).collect();
        ratios.sort_by(f64::total_cmp);
        println!(
            "{row} | {id} | {:.2}x | {:.2}..{:.2}",
            ratios[ratios.len() / 2],
            ratios[0],
            ratios[ratios.len() - 1]
        );
    }
}
