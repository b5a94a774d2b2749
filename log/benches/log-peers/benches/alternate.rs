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
//! [--scale X] [FILTER]`: FILTER keeps the rows whose name contains it; `--scale` multiplies the
//! work per measurement (default 1: about 10-50 ms per contender on this machine). Run by
//! `scripts/bench-ratios.sh --log`.

use std::time::Duration;

use lanestream_log_bench::{
    durable_contenders, fanout_run, filled, run_appends, Store, ACCOUNTS, READ_LOG,
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
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => rounds = args.next().and_then(|v| v.parse().ok()).expect("--rounds N"),
            "--scale" => scale = args.next().and_then(|v| v.parse().ok()).expect("--scale X"),
            "--bench" => {} // passed by `cargo bench`
            other if other.starts_with('-') => panic!("unknown argument {other}"),
            other => filter = other.to_string(),
        }
    }
    let n = |base: u64| ((base as f64 * scale).ceil() as u64).max(1);

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
    let ours = contenders.iter().position(|(id, _)| *id == OURS).expect("lanestream[durable] runs");
    for (i, (id, _)) in contenders.iter().enumerate() {
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
