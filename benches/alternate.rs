//! Alternating harness: lanestream and one peer in short interleaved rounds (ours, peer, peer,
//! ours, ours, peer, …: the order flips every round so neither side always runs first), for W1
//! (one lane, batch of 1) and W2 (fan-out to 4 and 8 lanes). Criterion runs contenders one after
//! another, minutes apart on a shared machine; here both sides of every ratio are measured
//! within milliseconds of each other. Prints, per pair, the median of the per-round ratios
//! (peer time / lanestream time: above 1 means lanestream is faster) and their spread.
//!
//! `cargo bench --bench alternate [-- --rounds N --messages M --only TEXT]` (at least 200,000 messages per round:
//! waking the parked partner is a fixed cost per round that flattens the ratios of short rounds)

mod common;

use std::time::Duration;

use common::*;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn per_msg(d: Duration, n: u64) -> f64 {
    d.as_nanos() as f64 / n as f64
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Runs `rounds` interleaved rounds of `n` messages and prints one line.
fn pair(label: &str, rounds: u64, n: u64, ours: &mut dyn Fixture, peer: &mut dyn Fixture) {
    // `--only TEXT`: run just the pairs whose label contains TEXT (for profiling one of them).
    let args: Vec<String> = std::env::args().collect();
    if let Some(only) = args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1)) {
        if !label.contains(only.as_str()) {
            return;
        }
    }
    // One untimed round each: page in the rings, wake the partners once.
    ours.run(n);
    peer.run(n);
    let mut ratios = Vec::new();
    let (mut ours_ns, mut peer_ns) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let (o, p) = if r % 2 == 0 {
            let o = ours.run(n);
            (o, peer.run(n))
        } else {
            let p = peer.run(n);
            (ours.run(n), p)
        };
        let (o, p) = (per_msg(o, n), per_msg(p, n));
        ours_ns.push(o);
        peer_ns.push(p);
        ratios.push(p / o);
    }
    for v in [&mut ratios, &mut ours_ns, &mut peer_ns] {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    }
    println!(
        "{label:<44} {:>8.1} {:>8.1} {:>7.2}x  [{:.2} .. {:.2}]  p10-p90 [{:.2} .. {:.2}]",
        quantile(&ours_ns, 0.5),
        quantile(&peer_ns, 0.5),
        quantile(&ratios, 0.5),
        ratios[0],
        ratios[ratios.len() - 1],
        quantile(&ratios, 0.1),
        quantile(&ratios, 0.9),
    );
}

fn main() {
    // `cargo bench` passes `--bench`; ignore it and anything else we do not know.
    let rounds = arg("--rounds", 9);
    let n = arg("--messages", 200_000);
    println!("alternating rounds: {rounds} x {n} messages per side; times in ns per message");
    println!(
        "{:<44} {:>8} {:>8} {:>8}  [min .. max] of per-round ratios",
        "workload: lanestream vs peer", "ours", "peer", "ratio"
    );
    let env1 = envelopes(1);
    {
        let mut ours = LaneW1::new(env1.clone(), false);
        let mut rtrb = RtrbW1::new(env1.clone());
        pair("w1 batch_1: lanestream[spin] vs rtrb[spin]", rounds, n, &mut ours, &mut rtrb);
        let mut cb = CrossbeamW1::new(env1.clone());
        pair("w1 batch_1: lanestream[spin] vs crossbeam[stp]", rounds, n, &mut ours, &mut cb);
    }
    {
        let mut ours = LaneW1::new(env1.clone(), true);
        let mut cb = CrossbeamW1::new(env1.clone());
        pair("w1 batch_1: lanestream[stp] vs crossbeam[stp]", rounds, n, &mut ours, &mut cb);
    }
    {
        // W1 through the run API (one lane: the fan-out producer's `publish_run` in chunks of
        // 64, `try_recv_run(64)`, one ack per run) against the SPSC floor.
        let mut ours = LaneFanRun::new(env1.clone(), 1, false, FanPublish::Run);
        let mut rtrb = RtrbW1::new(env1.clone());
        pair("w1 batch_1: lanestream run API[spin] vs rtrb[spin]", rounds, n, &mut ours, &mut rtrb);
        drop(ours);
        // The same over a one-lane shared ring (the fan-out drops items on the producer's side).
        let mut ours = LaneFanRun::with_ring(env1.clone(), 1, false, FanPublish::Run, true, FanRecv::Run);
        pair("w1 batch_1: shared ring, run API[spin] vs rtrb[spin]", rounds, n, &mut ours, &mut rtrb);
        drop(ours);
        let mut ours = LaneFanRun::with_ring(env1.clone(), 1, false, FanPublish::Item, true, FanRecv::Item);
        pair("w1 batch_1: shared ring, per-item API[spin] vs rtrb[spin]", rounds, n, &mut ours, &mut rtrb);
    }
    {
        // W3: one batch there and its ack back (the producer waits for the watermark), against an
        // rtrb pair doing the same hand-off both ways; fewer messages, each is a round trip.
        let mut ours = LaneRoundTrip::new(env1.clone(), false);
        let mut rtrb = RtrbRoundTrip::new(env1.clone());
        pair("w3 batch_1: lanestream[spin] vs rtrb-pair[spin]", rounds, n / 10, &mut ours, &mut rtrb);
    }
    let env64 = envelopes(64);
    for (batch, env) in [("batch_1", &env1), ("batch_64", &env64)] {
        for lanes in [4usize, 8] {
            let m = n / 4;
            let mut dis = DisruptorFan::new(env.clone(), lanes);
            let mut per_item = LaneFan::new(env.clone(), lanes);
            let label = format!("w2 lanes_{lanes} {batch}: per-item API[spin] vs disruptor[spin]");
            pair(&label, rounds, m, &mut per_item, &mut dis);
            drop(per_item);
            let mut run = LaneFanRun::new(env.clone(), lanes, false, FanPublish::Run);
            let label = format!("w2 lanes_{lanes} {batch}: run API[spin] vs disruptor[spin]");
            pair(&label, rounds, m, &mut run, &mut dis);
            drop(run);
            for (blocking, mode) in [(false, "spin"), (true, "stp")] {
                let mut run =
                    LaneFanRun::with_ring(env.clone(), lanes, blocking, FanPublish::Run, true, FanRecv::Run);
                let label =
                    format!("w2 lanes_{lanes} {batch}: shared ring, run API[{mode}] vs disruptor[spin]");
                pair(&label, rounds, m, &mut run, &mut dis);
                drop(run);
                let mut items = LaneFanRun::with_ring(
                    env.clone(),
                    lanes,
                    blocking,
                    FanPublish::Item,
                    true,
                    FanRecv::Item,
                );
                let label =
                    format!("w2 lanes_{lanes} {batch}: shared ring, per-item API[{mode}] vs disruptor[spin]");
                pair(&label, rounds, m, &mut items, &mut dis);
                drop(items);
            }
            let mut item_run = LaneFanRun::new(env.clone(), lanes, false, FanPublish::Item);
            let label = format!("w2 lanes_{lanes} {batch}: fanout publish+recv_run[spin] vs disruptor[spin]");
            pair(&label, rounds, m, &mut item_run, &mut dis);
            drop(item_run);
            let mut stp = LaneFanRun::new(env.clone(), lanes, true, FanPublish::Run);
            let label = format!("w2 lanes_{lanes} {batch}: run API[stp] vs disruptor[spin]");
            pair(&label, rounds, m, &mut stp, &mut dis);
        }
    }
    {
        // Reference counting: every lane's batches over one shared `Arc` (one count line that
        // every lane's drop touches) vs over one `Arc` per lane.
        let mut shared = LaneFan::new(env64.clone(), 8);
        let mut distinct = LaneFan::distinct(env64.clone(), 8);
        pair(
            "w2 lanes_8 batch_64: one shared Arc vs one Arc per lane",
            rounds,
            n / 4,
            &mut shared,
            &mut distinct,
        );
    }
}
