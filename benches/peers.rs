//! lanestream against its peers, workload by workload, contenders of one workload in one
//! criterion group so their ratios come from one run (the README's performance table). Bench ids name
//! each contender's waiting class: `name[spin]`, `name[spin-then-park]`, `name[park]`.
//!
//! Groups, in run order: `w0_start` (calibration), `w1_*` one lane, `w2_*` fan-out, `w3_*` round
//! trip, `w4_*` watermark reads, `w5_async_wake`, `w6_blocking_wake`, `w0_end` (calibration
//! again: the spread between the two is how much the machine drifted during the run).
//!
//! `scripts/bench-ratios.sh` runs this in a quick mode and prints the ratio table.

mod common;

use std::hint::black_box;
use std::time::Duration;

use common::*;
use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Benchmarks `make()`'s fixture under `id`; the fixture (queue + partner thread) is built only
/// if the id passes criterion's filter, and lives across every sample.
fn fixture<F: Fixture>(g: &mut BenchmarkGroup<'_, WallTime>, id: &str, make: impl Fn() -> F) {
    let mut fx: Option<F> = None;
    g.bench_function(id, |b| {
        let fx = fx.get_or_insert_with(&make);
        b.iter_custom(|n| fx.run(n));
    });
}

fn w0(c: &mut Criterion, when: &str) {
    let mut g = c.benchmark_group(format!("w0_{when}"));
    fixture(&mut g, "atomic_pingpong[spin]", PingPong::new);
    g.finish();
}

fn w0_start(c: &mut Criterion) {
    w0(c, "start");
}

fn w0_end(c: &mut Criterion) {
    w0(c, "end");
}

fn w1(c: &mut Criterion) {
    for size in [1usize, 64, 1024] {
        let env = envelopes(size);
        let mut g = c.benchmark_group(format!("w1_one_lane/batch_{size}"));
        g.throughput(Throughput::Elements(size as u64));
        fixture(&mut g, "lanestream[spin]", || LaneW1::new(env.clone(), false));
        fixture(&mut g, "lanestream[spin-then-park]", || LaneW1::new(env.clone(), true));
        fixture(&mut g, "rtrb[spin]", || RtrbW1::new(env.clone()));
        fixture(&mut g, "crossbeam-channel[spin-then-park]", || CrossbeamW1::new(env.clone()));
        fixture(&mut g, "lanestream-runs[spin]", || LaneFanRun::new(env.clone(), 1, false, FanPublish::Run));
        fixture(&mut g, "rtrb-chunks[spin]", || RtrbW1::with_chunks(env.clone(), true));
        fixture(&mut g, "disruptor[spin]", || DisruptorFan::new(env.clone(), 1));
        g.finish();
    }
}

/// W2 at batches of 64 envelopes (`w2_fan_out/lanes_N`, the README's table) and of 1
/// (`w2_fan_out_batch_1/lanes_N`). Every lanestream contender publishes through the stream's one
/// fan-out: `lanestream-items[spin]` per item on both ends (`try_publish`, `try_recv` + `ack`);
/// `lanestream-item+runs[...]` per-item `try_publish` / `publish` with `try_recv_run(64)` /
/// `recv_run(64)` and one ack per run (against `disruptor[spin]`, per-item `try_publish`);
/// `lanestream-runs[...]` `publish_run` in chunks of 64 with runs on the receiving side (against
/// `disruptor-batch64[spin]`, `try_batch_publish(64)`).
fn w2(c: &mut Criterion) {
    for (suffix, size) in [("", 64usize), ("_batch_1", 1)] {
        let env = envelopes(size);
        for lanes in [4usize, 8] {
            let mut g = c.benchmark_group(format!("w2_fan_out{suffix}/lanes_{lanes}"));
            fixture(&mut g, "lanestream-items[spin]", || LaneFan::new(env.clone(), lanes));
            for (blocking, mode) in [(false, "spin"), (true, "spin-then-park")] {
                fixture(&mut g, &format!("lanestream-item+runs[{mode}]"), || {
                    LaneFanRun::new(env.clone(), lanes, blocking, FanPublish::Item)
                });
                fixture(&mut g, &format!("lanestream-runs[{mode}]"), || {
                    LaneFanRun::new(env.clone(), lanes, blocking, FanPublish::Run)
                });
            }
            fixture(&mut g, "disruptor[spin]", || DisruptorFan::new(env.clone(), lanes));
            fixture(&mut g, "disruptor-batch64[spin]", || DisruptorFan::with_batch(env.clone(), lanes, true));
            if size == 64 {
                fixture(&mut g, "tokio-broadcast[spin]", || BroadcastFan::new(env.clone(), lanes));
                fixture(&mut g, "bus[spin]", || BusFan::new(env.clone(), lanes));
            }
            g.finish();
        }
    }
}

fn w3(c: &mut Criterion) {
    for size in [1usize, 64] {
        let env = envelopes(size);
        let mut g = c.benchmark_group(format!("w3_round_trip/batch_{size}"));
        fixture(&mut g, "lanestream[spin]", || LaneRoundTrip::new(env.clone(), false));
        fixture(&mut g, "lanestream[spin-then-park]", || LaneRoundTrip::new(env.clone(), true));
        fixture(&mut g, "rtrb-pair[spin]", || RtrbRoundTrip::new(env.clone()));
        fixture(&mut g, "crossbeam-pair[spin-then-park]", || CrossbeamRoundTrip::new(env.clone()));
        g.finish();
    }
}

/// Builds a W4 reader: `(lanes, racing)`.
type MakeMarks = fn(usize, bool) -> Marks;

fn w4(c: &mut Criterion) {
    for racing in [false, true] {
        for lanes in [1usize, 8, 64] {
            let state = if racing { "racing" } else { "idle" };
            let mut g = c.benchmark_group(format!("w4_watermark/{state}/lanes_{lanes}"));
            // Reads take nanoseconds: short samples suffice.
            g.warm_up_time(Duration::from_millis(300));
            let contenders: [(&str, MakeMarks); 3] = [
                ("lanestream[none]", Marks::lanestream),
                ("relaxed-min[none]", Marks::bare),
                ("mutex-vec-min[none]", Marks::locked),
            ];
            for (id, make) in contenders {
                let mut marks: Option<Marks> = None;
                g.bench_function(id, |b| {
                    let m = marks.get_or_insert_with(|| make(lanes, racing));
                    b.iter(|| black_box(m.read()));
                });
                drop(marks); // stops the racer before the next contender
            }
            g.finish();
        }
    }
}

fn w5(c: &mut Criterion) {
    let env = envelopes(1);
    let mut g = c.benchmark_group("w5_async_wake");
    // Every wake-up also costs `IDLE` (100 µs) of wall time: keep the timed total small.
    g.sample_size(10).warm_up_time(Duration::from_millis(100)).measurement_time(Duration::from_millis(200));
    fixture(&mut g, "lanestream[park]", || Wake::new(env.clone(), WakeKind::LaneAsync));
    fixture(&mut g, "tokio-mpsc[park]", || Wake::new(env.clone(), WakeKind::TokioMpsc));
    g.finish();
}

fn w6(c: &mut Criterion) {
    let env = envelopes(1);
    let mut g = c.benchmark_group("w6_blocking_wake");
    // Every wake-up also costs `IDLE` (100 µs) of wall time: keep the timed total small.
    g.sample_size(10).warm_up_time(Duration::from_millis(100)).measurement_time(Duration::from_millis(200));
    fixture(&mut g, "lanestream[spin-then-park]", || Wake::new(env.clone(), WakeKind::LaneBlocking));
    fixture(&mut g, "crossbeam-channel[spin-then-park]", || Wake::new(env.clone(), WakeKind::Crossbeam));
    g.finish();
}

criterion_group!(benches, w0_start, w1, w2, w3, w4, w5, w6, w0_end);
criterion_main!(benches);
