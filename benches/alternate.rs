//! Alternating harness: lanestream and one peer in short interleaved rounds (ours, peer, peer,
//! ours, ours, peer, …: the order flips every round so neither side always runs first), for W1
//! (one lane, batch of 1) and W2 (fan-out to 4 and 8 lanes). Criterion runs contenders one after
//! another, minutes apart on a shared machine; here both sides of every ratio are measured
//! within milliseconds of each other. Prints, per pair, the median of the per-round ratios
//! (peer time / lanestream time: above 1 means lanestream is faster) and their spread.
//!
//! `cargo bench --bench alternate [-- --rounds N --messages M --only TEXT --side ours|peer]` (at
//! least 200,000 messages per round: waking the parked partner is a fixed cost per round that
//! flattens the ratios of short rounds). `--side` runs one side of each pair only (no ratio), so
//! that `perf stat` counts (instructions, cycles per message) belong to one contender.

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
    // `--side ours|peer`: one side only, for `perf stat` / `perf record` of one contender.
    if let Some(side) = args.iter().position(|a| a == "--side").and_then(|i| args.get(i + 1)) {
        let one: &mut dyn Fixture = if side == "peer" { peer } else { ours };
        let mut ns: Vec<f64> = (0..=rounds).map(|_| per_msg(one.run(n), n)).collect();
        ns.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!("{label:<44} {side}: {:>8.1} ns/msg (median of {})", quantile(&ns, 0.5), ns.len());
        return;
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
    // Every row is like for like, and its label says how each side publishes and receives:
    // `publish=item` one item per call (lanestream `Fanout::try_publish`, rtrb `push`, the
    // disruptor's `try_publish`), `publish=run64` chunks of 64 (lanestream `try_publish_run`, rtrb
    // `write_chunk_uninit`, the disruptor's `try_batch_publish(64)`); `receive=item` one item per
    // call and its ack (lanestream `try_recv` + `ack`, rtrb `pop`), `receive=run` what is there, up
    // to 64, in one step (lanestream `try_recv_run(64)` + one ack, rtrb `read_chunk`, the
    // disruptor's poller, which always hands out what is available).
    let env1 = envelopes(1);
    {
        let mut ours = LaneW1::new(env1.clone(), false);
        let mut rtrb = RtrbW1::new(env1.clone());
        pair(
            "w1 batch_1 publish=item receive=item: lanestream[spin] vs rtrb[spin]",
            rounds,
            n,
            &mut ours,
            &mut rtrb,
        );
        let mut cb = CrossbeamW1::new(env1.clone());
        pair(
            "w1 batch_1 publish=item receive=item: lanestream[spin] vs crossbeam[stp]",
            rounds,
            n,
            &mut ours,
            &mut cb,
        );
    }
    {
        let mut ours = LaneW1::new(env1.clone(), true);
        let mut cb = CrossbeamW1::new(env1.clone());
        pair(
            "w1 batch_1 publish=item receive=item: lanestream[stp] vs crossbeam[stp]",
            rounds,
            n,
            &mut ours,
            &mut cb,
        );
    }
    {
        let mut rtrb = RtrbW1::new(env1.clone());
        let mut ours = LaneFanRun::new(env1.clone(), 1, false, FanPublish::Item);
        pair(
            "w1 batch_1 publish=item receive=run: lanestream[spin] vs rtrb item[spin]",
            rounds,
            n,
            &mut ours,
            &mut rtrb,
        );
        drop(ours);
        let mut chunks = RtrbW1::with_chunks(env1.clone(), true);
        let mut ours = LaneFanRun::new(env1.clone(), 1, false, FanPublish::Run);
        pair(
            "w1 batch_1 publish=run64 receive=run: lanestream[spin] vs rtrb chunks[spin]",
            rounds,
            n,
            &mut ours,
            &mut chunks,
        );
    }
    {
        // W3: one batch there and its ack back (the producer waits for the watermark), against an
        // rtrb pair doing the same hand-off both ways; fewer messages, each is a round trip.
        let mut ours = LaneRoundTrip::new(env1.clone(), false);
        let mut rtrb = RtrbRoundTrip::new(env1.clone());
        pair(
            "w3 batch_1 publish=item receive=item: lanestream[spin] vs rtrb-pair[spin]",
            rounds,
            n / 10,
            &mut ours,
            &mut rtrb,
        );
    }
    let env64 = envelopes(64);
    for (batch, env) in [("batch_1", &env1), ("batch_64", &env64)] {
        for lanes in [4usize, 8] {
            let m = n / 4;
            let mut dis = DisruptorFan::new(env.clone(), lanes);
            for (blocking, mode) in [(false, "spin"), (true, "stp")] {
                let mut ours = LaneFanRun::new(env.clone(), lanes, blocking, FanPublish::Item);
                let label =
                    format!("w2 lanes_{lanes} {batch} publish=item receive=run: lanestream[{mode}] vs disruptor[spin]");
                pair(&label, rounds, m, &mut ours, &mut dis);
            }
            let mut ours = LaneFan::new(env.clone(), lanes);
            let label = format!(
                "w2 lanes_{lanes} {batch} publish=item receive=item: lanestream[spin] vs disruptor[spin]"
            );
            pair(&label, rounds, m, &mut ours, &mut dis);
            drop((ours, dis));
            let mut dis = DisruptorFan::with_batch(env.clone(), lanes, true);
            for (blocking, mode) in [(false, "spin"), (true, "stp")] {
                let mut ours = LaneFanRun::new(env.clone(), lanes, blocking, FanPublish::Run);
                let label =
                    format!("w2 lanes_{lanes} {batch} publish=run64 receive=run: lanestream[{mode}] vs disruptor[spin]");
                pair(&label, rounds, m, &mut ours, &mut dis);
            }
        }
    }
}
