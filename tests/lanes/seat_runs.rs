//! Adversarial tests of runs acked and released under their consumer's seat (`ack_run`,
//! `release_run`: the run keeps no delivery generation per item; its acks and releases hold the
//! seat from the run's epoch, wait out a receive step on another thread, and, if a re-attach or a
//! drop-and-attach took the epoch, wait for its take-back and end the items as stale handles).
//!
//! Each test tries to make a run lose, duplicate, reorder or corrupt an item, pin a slot, hang or
//! panic: runs acked and released on other threads while the consumer receives, re-attaches and
//! consumer drops racing those acks, partial acks across a re-attach, stale handles alive while a
//! new consumer acks runs (the compare-and-swap under the seat), redeliveries, small capacities,
//! several runs outstanding, gaps of a shared ring. Names follow the rules attacked. The threaded
//! races run a few seeds; `LANESTREAM_HUNT=N` runs N seeds each (use `--release`).

use crate::common;
use lanestream::prelude::*;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::{batch, counted_lane, counters, hunt, within, Counted};
use lanestream::{
    AckError, Consumer, Delivery, Item, Lane, Position, RecvTimeoutError, Run, Stream, TryRecvError,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn positions<T: Item>(run: &Run<T>) -> Vec<u64> {
    run.iter().map(|i| i.position().unwrap().0).collect()
}

/// Every slot of the lane is free again (no holder count left behind): the lane is idle,
/// nothing pinned, and `capacity` new items fit without waiting.
fn assert_all_slots_free(lane: &Lane<Counted>, drops: &Arc<Vec<AtomicUsize>>, first_id: usize, what: &str) {
    assert!(lane.is_idle(), "{what}: lane not idle: {:?}", lane.stats());
    assert_eq!(lane.stats().pinned, 0, "{what}: pinned slots: {:?}", lane.stats());
    let mut producer = lane.producer().unwrap();
    let capacity = lane.stats().capacity;
    for id in first_id..first_id + capacity {
        producer
            .try_publish(Counted::new(id, drops))
            .unwrap_or_else(|_| panic!("{what}: slot {} of {capacity} still held", id - first_id));
    }
}

/// Spawns `f` on a thread that spins at a start line with the caller: returns once both are
/// there and `f` is starting, so the caller's next step races it (closer than a `Barrier`'s wake).
fn race_with<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> thread::JoinHandle<R> {
    let (ready, go) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let handle = {
        let (ready, go) = (ready.clone(), go.clone());
        thread::spawn(move || {
            ready.store(true, Ordering::Release);
            while !go.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            f()
        })
    };
    while !ready.load(Ordering::Acquire) {
        std::hint::spin_loop();
    }
    go.store(true, Ordering::Release);
    handle
}

// ----- the threaded race: receive here, ack elsewhere, re-attach meanwhile ----------------------

/// A live delivery or run sent to an acker, with the positions the receiver read.
enum Held<T> {
    One(Delivery<T>, u64),
    Run(Run<T>, Vec<u64>),
}

#[derive(Default, Debug)]
struct Entry {
    /// Acks that returned `Ok` (must end at exactly 1: landed once, L8).
    ok: u32,
    /// The attempt of the delivery whose ack landed.
    ok_attempt: u32,
    /// The highest attempt delivered: nothing is delivered again after it landed.
    max_attempt: u32,
}

#[derive(Default)]
struct Ledger {
    entries: Mutex<HashMap<u64, Entry>>,
    landed: AtomicUsize,
}

impl Ledger {
    fn delivered(&self, position: u64, attempt: u32, ctx: &str) {
        let mut e = self.entries.lock().unwrap();
        let e = e.entry(position).or_default();
        assert_eq!(
            e.ok, 0,
            "L8: position {position} delivered again (attempt {attempt}) after it landed: {ctx}"
        );
        assert!(
            attempt > e.max_attempt,
            "L6: position {position} attempt {attempt} after {}: {ctx}",
            e.max_attempt
        );
        e.max_attempt = attempt;
    }
    fn landed(&self, ps: &[u64], attempt: u32, ctx: &str) {
        let mut e = self.entries.lock().unwrap();
        for &p in ps {
            let e = e.get_mut(&p).unwrap_or_else(|| panic!("acked {p} never delivered: {ctx}"));
            assert_eq!(e.ok, 0, "L8: position {p} landed twice: {ctx}");
            e.ok = 1;
            e.ok_attempt = attempt;
        }
        self.landed.fetch_add(ps.len(), Ordering::SeqCst);
    }
}

/// Acks, partly acks, nacks or drops what it receives; records every ack that landed.
fn acker<T: Item + Send + Sync + 'static>(
    rx: mpsc::Receiver<Held<T>>,
    ledger: Arc<Ledger>,
    seed: u64,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut rng = StdRng::seed_from_u64(seed);
        let ctx = format!("acker seed {seed}");
        while let Ok(h) = rx.recv() {
            match h {
                Held::One(d, p) => {
                    assert_eq!(d.position().map(|q| q.0), Some(p), "a handle reads another item: {ctx}");
                    let attempt = d.attempt();
                    match rng.gen_range(0..4) {
                        0 | 1 => match d.ack() {
                            Ok(()) => ledger.landed(&[p], attempt, &ctx),
                            Err(AckError::Detached) => {}
                            Err(e) => panic!("{e:?}"),
                        },
                        2 => d.nack(),
                        _ => drop(d),
                    }
                }
                Held::Run(mut r, ps) => {
                    // The run still reads its own items (no slot reused under it).
                    assert_eq!(positions(&r), ps, "a run reads other items: {ctx}");
                    let attempt = r.attempt();
                    let mut acked = 0usize;
                    let step = |r: &mut Run<T>, n: usize, acked: &mut usize, how: u32| {
                        let seqs = r.sequences();
                        let res = match how {
                            0 => r.ack_through(seqs.start + n as u64 - 1),
                            _ => r.ack_through_position(Position(ps[*acked + n - 1])),
                        };
                        match res {
                            Ok(got) => {
                                assert_eq!(got, n, "{ctx}");
                                ledger.landed(&ps[*acked..*acked + n], attempt, &ctx);
                            }
                            Err(AckError::Detached) => {}
                            Err(e) => panic!("{e:?}"),
                        }
                        *acked += n;
                        assert_eq!(r.len(), ps.len() - *acked, "{ctx}");
                    };
                    match rng.gen_range(0..6) {
                        0 | 1 => match r.ack() {
                            Ok(()) => ledger.landed(&ps, attempt, &ctx),
                            Err(AckError::Detached) => {}
                            Err(e) => panic!("{e:?}"),
                        },
                        2 | 3 => {
                            // A prefix, maybe a second one, then the rest acked or released.
                            while acked < ps.len() && rng.gen_bool(0.6) {
                                let n = rng.gen_range(1..=ps.len() - acked);
                                step(&mut r, n, &mut acked, rng.gen_range(0..2));
                                if acked < ps.len() {
                                    assert_eq!(positions(&r), ps[acked..], "the rest stays readable: {ctx}");
                                }
                                thread::yield_now();
                            }
                            if acked < ps.len() && rng.gen_bool(0.5) {
                                let n = ps.len() - acked;
                                step(&mut r, n, &mut acked, 0);
                            }
                            drop(r);
                        }
                        4 => r.nack(),
                        _ => drop(r),
                    }
                }
            }
        }
    })
}

/// How the race reaches the lane under attack.
struct Target<T> {
    lane: Lane<T>,
    /// A fresh consumer after the old one was dropped (`Lane::attach` or `Stream::attach`).
    attach: Box<dyn Fn() -> Consumer<T> + Send>,
    /// How many items the lane will hold in all, once `done` is set.
    expected: Arc<AtomicUsize>,
    done: Arc<AtomicBool>,
}

/// The consumer side of the race: receives runs and single deliveries (several outstanding),
/// sends most to two ackers, acks or releases some itself, re-attaches and drops-and-attaches
/// meanwhile; checks the order rules on every receive (first deliveries strictly increasing, a
/// redelivery alone, released items first) and, at the end, that every item landed exactly once
/// with its last delivery. Returns the ledger.
fn race<T: Item + Send + Sync + 'static>(target: Target<T>, seed: u64) -> Arc<Ledger> {
    let mut rng = StdRng::seed_from_u64(seed);
    let ledger = Arc::new(Ledger::default());
    let (tx0, rx0) = mpsc::channel();
    let (tx1, rx1) = mpsc::channel();
    let ackers = [acker(rx0, ledger.clone(), seed * 2 + 1), acker(rx1, ledger.clone(), seed * 2 + 2)];
    let mut consumer = Some(target.lane.reattach());
    // Kept here, with the count of re-attaches when received (the epoch).
    let mut mine: Vec<(Held<T>, u32)> = Vec::new();
    let mut last_first = 0u64;
    let mut must_redeliver = false;
    let (mut reattaches, mut receives) = (0u32, 0u64);
    let ctx = |s: &str| format!("seed {seed}: {s}");
    loop {
        let complete = target.done.load(Ordering::SeqCst)
            && ledger.landed.load(Ordering::SeqCst) == target.expected.load(Ordering::SeqCst);
        if complete {
            break;
        }
        let op = rng.gen_range(0..100);
        match op {
            0..=59 => {
                let c = consumer.get_or_insert_with(|| (target.attach)());
                let single = rng.gen_bool(0.2);
                let held = if single {
                    match c.try_recv() {
                        Ok(d) => {
                            let p = d.position().unwrap().0;
                            Some((vec![p], d.attempt(), Held::One(d, p)))
                        }
                        Err(TryRecvError::Empty) => None,
                        Err(e) => panic!("{}", ctx(&format!("{e:?}"))),
                    }
                } else {
                    let max = rng.gen_range(1..=6);
                    // Mostly non-blocking; sometimes a short wait (parked: woken by a release or
                    // a publish on another thread).
                    let got = if rng.gen_bool(0.05) {
                        match c.recv_run_timeout(max, Duration::from_micros(500)) {
                            Ok(Some(r)) => Some(r),
                            Err(RecvTimeoutError::Timeout) => None,
                            got => panic!("{}", ctx(&format!("{:?}", got.map(|r| r.map(|r| r.sequences()))))),
                        }
                    } else {
                        match c.try_recv_run(max) {
                            Ok(r) => Some(r),
                            Err(TryRecvError::Empty) => None,
                            Err(e) => panic!("{}", ctx(&format!("{e:?}"))),
                        }
                    };
                    got.map(|r| {
                        let ps = positions(&r);
                        assert_eq!(ps.len(), r.len(), "{}", ctx("run length"));
                        (ps.clone(), r.attempt(), Held::Run(r, ps))
                    })
                };
                let Some((ps, attempt, held)) = held else {
                    thread::yield_now();
                    continue;
                };
                receives += 1;
                if attempt == 1 {
                    assert!(
                        !must_redeliver,
                        "{}",
                        ctx(&format!("L2: new items {ps:?} before a released one"))
                    );
                    // First deliveries: strictly increasing over the whole race (across re-attaches).
                    for &p in &ps {
                        assert!(p > last_first, "{}", ctx(&format!("first delivery {p} after {last_first}")));
                        last_first = p;
                    }
                } else {
                    assert_eq!(ps.len(), 1, "{}", ctx("a redelivery comes alone"));
                    assert!(ps[0] <= last_first, "{}", ctx("redelivery of an item never delivered"));
                }
                must_redeliver = false;
                for &p in &ps {
                    ledger.delivered(p, attempt, &ctx("receive"));
                }
                if mine.len() < 3 && rng.gen_bool(0.3) {
                    mine.push((held, reattaches));
                } else if rng.gen_bool(0.5) {
                    tx0.send(held).unwrap();
                } else {
                    tx1.send(held).unwrap();
                }
            }
            // Ack (whole) or release one kept here.
            60..=79 => {
                if mine.is_empty() {
                    continue;
                }
                let (h, epoch) = mine.swap_remove(rng.gen_range(0..mine.len()));
                let ack = rng.gen_bool(0.7);
                // A release of the current epoch's delivery: a redelivery comes next (L2, L6).
                let current = epoch == reattaches;
                match h {
                    Held::One(d, p) => {
                        let attempt = d.attempt();
                        if ack {
                            if d.ack().is_ok() {
                                ledger.landed(&[p], attempt, &ctx("ack here"));
                            }
                        } else {
                            drop(d);
                            must_redeliver |= current;
                        }
                    }
                    Held::Run(r, ps) => {
                        assert_eq!(positions(&r), ps, "{}", ctx("a kept run reads other items"));
                        let attempt = r.attempt();
                        if ack {
                            if r.ack().is_ok() {
                                ledger.landed(&ps, attempt, &ctx("ack here"));
                            }
                        } else {
                            drop(r);
                            must_redeliver |= current;
                        }
                    }
                }
            }
            80..=85 => {
                consumer = Some(target.lane.reattach());
                reattaches += 1;
                // Whatever was outstanding is released now (taken back): comes first.
                must_redeliver = false;
            }
            86..=88 => {
                // Drop, let the ackers race the gap, attach.
                drop(consumer.take());
                thread::yield_now();
                consumer = Some((target.attach)());
                reattaches += 1;
                must_redeliver = false;
            }
            _ => thread::yield_now(),
        }
    }
    drop((tx0, tx1));
    for a in ackers {
        a.join().unwrap();
    }
    drop(mine);
    drop(consumer);
    let entries = ledger.entries.lock().unwrap();
    assert_eq!(entries.len(), target.expected.load(Ordering::SeqCst), "{}", ctx("delivered items"));
    for (p, e) in entries.iter() {
        assert_eq!(e.ok, 1, "{}", ctx(&format!("position {p} landed {} times", e.ok)));
        assert_eq!(e.ok_attempt, e.max_attempt, "{}", ctx(&format!("position {p}: {e:?}")));
    }
    drop(entries);
    assert!(reattaches > 0 && receives > 0, "{}", ctx("the race did nothing"));
    assert!(target.lane.is_idle(), "{}", ctx(&format!("W5: {:?}", target.lane.stats())));
    assert_eq!(target.lane.stats().pinned, 0, "{}", ctx("a slot stays pinned"));
    ledger
}

/// The race on a standalone lane of 1..=4 slots with `n` counted items: every item lands once,
/// the acked position reaches the last one, every item is dropped exactly once.
fn standalone_race(seed: u64, n: usize) {
    let capacity = 1 + (seed % 4) as usize;
    let lane = counted_lane(capacity);
    let drops = counters(n);
    let (expected, done) = (Arc::new(AtomicUsize::new(n)), Arc::new(AtomicBool::new(false)));
    let publisher = {
        let (mut producer, drops, done) = (lane.producer().unwrap(), drops.clone(), done.clone());
        thread::spawn(move || {
            for id in 0..n {
                producer.publish(Counted::new(id, &drops)).unwrap();
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    let attach_lane = lane.clone();
    let target = Target {
        lane: lane.clone(),
        attach: Box::new(move || attach_lane.attach().unwrap()),
        expected,
        done,
    };
    race(target, seed);
    publisher.join().unwrap();
    assert_eq!(lane.acked(), Some(Position(n as u64)), "seed {seed}: L5");
    drop(lane);
    for (id, d) in drops.iter().enumerate() {
        assert_eq!(d.load(Ordering::SeqCst), 1, "seed {seed}: M3 item {id}");
    }
}

#[test]
fn l2_l6_l8_m3_runs_acked_on_other_threads_race_receives_and_reattaches_on_small_lanes() {
    for seed in 0..hunt(16) {
        within(30, &format!("standalone race, seed {seed}"), move || standalone_race(seed, 1000));
    }
}

/// The race on lane "a" of a two-lane stream (capacity 2..=4) fed by a fan-out with `publish`
/// and `publish_to` (gaps on lane "a" for items of lane "b"); lane "b" is drained on its own
/// thread; re-attaches use `Stream::attach` after a drop. Lane "a" lands exactly its items.
fn shared_race(seed: u64, n: u64) {
    let capacity = 2 + (seed % 3) as usize;
    let stream = common::stream(capacity, &["a", "b"]);
    let (expected, done) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    let stop_b = Arc::new(AtomicBool::new(false));
    let drain_b = {
        let (mut b, stop) = (stream.attach("b").unwrap(), stop_b.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match b.try_recv_run(8) {
                    Ok(r) => r.ack().unwrap(),
                    Err(_) => thread::yield_now(),
                }
            }
        })
    };
    let publisher = {
        let (mut fanout, expected, done) = (stream.fanout().unwrap(), expected.clone(), done.clone());
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
        thread::spawn(move || {
            let mut for_a = 0;
            for p in 1..=n {
                // The last item goes to "a", so its acked position ends at `n`.
                let to = if p == n { Some(0) } else { [None, Some(0), Some(1)][rng.gen_range(0..3)] };
                match to {
                    None => fanout.publish(batch(p)).unwrap(),
                    Some(to) => fanout.publish_to(to, batch(p)).unwrap(),
                }
                for_a += usize::from(to != Some(1));
            }
            expected.store(for_a, Ordering::SeqCst);
            done.store(true, Ordering::SeqCst);
            for_a
        })
    };
    let attach_stream = stream.clone();
    let target = Target {
        lane: stream.lane("a").unwrap(),
        attach: Box::new(move || attach_stream.attach("a").unwrap()),
        expected,
        done,
    };
    let ledger = race(target, seed);
    let for_a = publisher.join().unwrap();
    assert_eq!(ledger.landed.load(Ordering::SeqCst), for_a, "seed {seed}");
    stop_b.store(true, Ordering::SeqCst);
    drain_b.join().unwrap();
    assert_eq!(stream.lane("a").unwrap().acked(), Some(Position(n)), "seed {seed}: L5");
}

#[test]
fn l8_l10_w1_runs_acked_elsewhere_across_gaps_and_stream_attaches_land_each_item_once() {
    for seed in 0..hunt(8) {
        within(30, &format!("shared race, seed {seed}"), move || shared_race(seed, 600));
    }
}

// ----- targeted interleavings --------------------------------------------------------------------

/// A lane of `capacity` with items `0..n` published (ids = sequences) and a consumer.
fn published(capacity: usize, n: usize) -> (Lane<Counted>, Arc<Vec<AtomicUsize>>, Consumer<Counted>) {
    let lane = counted_lane(capacity);
    let drops = counters(n + capacity);
    let mut producer = lane.producer().unwrap();
    for id in 0..n {
        producer.try_publish(Counted::new(id, &drops)).unwrap();
    }
    let consumer = lane.attach().unwrap();
    (lane, drops, consumer)
}

fn ids(run: &Run<Counted>) -> Vec<usize> {
    run.iter().map(|c| c.id).collect()
}

/// Receives everything left with runs of up to 8, acking each; returns `(id, attempt)` per item.
fn drain(consumer: &mut Consumer<Counted>) -> Vec<(usize, u32)> {
    let mut got = Vec::new();
    while let Ok(r) = consumer.try_recv_run(8) {
        got.extend(ids(&r).into_iter().map(|id| (id, r.attempt())));
        r.ack().unwrap();
    }
    got
}

/// A partial ack, a re-attach, then further acks of the same run (plain, or not plain because a
/// single delivery of item 0 is outstanding): the acks before the re-attach count, the later ones
/// are refused and only their items end; the rest stays readable; the refused and the rest come
/// back to the new consumer, first and in order, with attempt 2 (L5, L6, L8).
#[test]
fn l6_l8_ack_through_then_reattach_then_more_acks_end_only_what_they_acked() {
    for plain in [true, false] {
        let (lane, drops, mut old) = published(8, 7);
        let single = (!plain).then(|| old.try_recv().unwrap());
        let mut run = old.try_recv_run(8).unwrap();
        let first = usize::from(!plain);
        assert_eq!(ids(&run), (first..7).collect::<Vec<_>>(), "plain {plain}");
        assert_eq!(run.ack_through(first as u64 + 1), Ok(2), "plain {plain}");
        let mut new = lane.reattach();
        assert_eq!(run.ack_through(first as u64 + 2), Err(AckError::Detached), "plain {plain}");
        // The rest is still the run's, readable in place, not dropped.
        assert_eq!(ids(&run), (first + 3..7).collect::<Vec<_>>(), "plain {plain}");
        assert!(run.iter().all(|c| drops[c.id].load(Ordering::SeqCst) == 0), "plain {plain}");
        assert_eq!(run.ack_through_position(Position(first as u64 + 4)), Err(AckError::Detached));
        assert_eq!(ids(&run), (first + 4..7).collect::<Vec<_>>(), "plain {plain}");
        // The new consumer gets the taken-back items first, one run each, while the old run and
        // the single delivery (stale) still live.
        let mut want: Vec<(usize, u32)> = (0..first).map(|id| (id, 2)).collect();
        want.extend((first + 2..7).map(|id| (id, 2)));
        let mut got = Vec::new();
        while let Ok(r) = new.try_recv_run(8) {
            assert_eq!(r.len(), 1, "plain {plain}: a redelivery alone");
            got.push((r.get(0).unwrap().id, r.attempt()));
            r.ack().unwrap();
        }
        assert_eq!(got, want, "plain {plain}");
        // Everything landed, but the stale holders keep their slots.
        assert_eq!(lane.acked(), Some(Position(7)), "plain {plain}");
        assert!(lane.stats().pinned > 0, "plain {plain}: {:?}", lane.stats());
        drop(run);
        if let Some(d) = single {
            assert_eq!(d.ack(), Err(AckError::Detached));
        }
        assert_all_slots_free(&lane, &drops, 7, &format!("plain {plain}"));
        for id in 0..7 {
            assert_eq!(drops[id].load(Ordering::SeqCst), 1, "plain {plain}: M3 item {id}");
        }
    }
}

/// A stale handle (single delivery or plain run of a detached consumer) and the new consumer's
/// run of the same redelivered items, acked (or released) on two threads at once: the run's ack
/// is the compare-and-swap under the seat and must not overwrite the stale handle's holder count
/// (P21): the run lands, the stale one is refused, and the slots free afterwards.
#[test]
fn l8_p21_stale_handles_ending_race_the_new_consumers_run_acks_on_the_same_items() {
    for round in 0..hunt(200) {
        let stale_run = round % 2 == 0;
        let release = round % 3 == 0;
        let (lane, drops, mut old) = published(4, 3);
        // Old consumer: a single delivery of item 0 and a (plain if first) run of 1..3, or a run 0..3.
        enum Stale {
            One(Delivery<Counted>),
            Run(Run<Counted>),
        }
        let stale = if stale_run {
            vec![Stale::Run(old.try_recv_run(3).unwrap())]
        } else {
            vec![Stale::One(old.try_recv().unwrap()), Stale::Run(old.try_recv_run(2).unwrap())]
        };
        let mut new = lane.reattach();
        // The redeliveries of 0 and 1, one run each; a third stays queued as released.
        let runs = vec![new.try_recv_run(4).unwrap(), new.try_recv_run(4).unwrap()];
        assert_eq!(
            runs.iter().map(|r| (ids(r), r.attempt())).collect::<Vec<_>>(),
            [(vec![0], 2), (vec![1], 2)]
        );
        let ender = race_with(move || {
            for s in stale {
                match s {
                    Stale::One(d) => assert_eq!(d.ack(), Err(AckError::Detached)),
                    Stale::Run(r) => assert_eq!(r.ack(), Err(AckError::Detached)),
                }
            }
        });
        for r in runs {
            if release {
                r.nack();
            } else {
                r.ack().unwrap();
            }
        }
        ender.join().unwrap();
        let mut want = if release { vec![(0, 3), (1, 3)] } else { vec![] };
        want.push((2, 2));
        assert_eq!(drain(&mut new), want, "round {round}");
        assert_all_slots_free(&lane, &drops, 3, &format!("round {round}"));
        drop((new, old, lane));
        for id in 0..3 {
            assert_eq!(drops[id].load(Ordering::SeqCst), 1, "round {round}: M3 item {id}");
        }
    }
}

/// A run acked (whole or in part) or released on another thread at the moment the consumer is
/// re-attached, or dropped and attached again: the ack lands xor the items come back (attempt 2),
/// never both, never neither; a refused ack waits for the take-back before ending the items as
/// stale, so no holder count is lost or ends twice and every slot frees (L8, P26).
#[test]
fn l8_p26_run_acks_and_releases_race_reattach_and_drop_then_attach() {
    for round in 0..hunt(300) {
        let mut rng = StdRng::seed_from_u64(round);
        let capacity = [1, 2, 3, 4, 32][rng.gen_range(0..5)];
        let (lane, drops, mut old) = published(capacity, capacity);
        // Plain (nothing else in flight) or not (a single delivery of item 0 kept here).
        let single = rng.gen_bool(0.5).then(|| old.try_recv().ok()).flatten();
        let first = usize::from(single.is_some());
        let Ok(mut run) = old.try_recv_run(capacity) else { continue };
        let ids_run = ids(&run);
        let how = rng.gen_range(0..3);
        let by_drop = rng.gen_bool(0.5);
        let acker = {
            race_with(move || match how {
                0 => run.ack().map(|()| ids_run.len()),
                1 => {
                    let n = run.ack_through(run.sequences().start);
                    drop(run);
                    n
                }
                _ => {
                    run.nack();
                    Ok(0)
                }
            })
        };
        let mut new = if by_drop {
            drop(old);
            lane.attach().unwrap()
        } else {
            let new = lane.reattach();
            drop(old);
            new
        };
        let landed = acker.join().unwrap();
        drop(single);
        let got = drain(&mut new);
        // What the new consumer got: item 0 (if single) and every run item that did not land.
        let landed = match landed {
            Ok(n) => n,
            Err(AckError::Detached) => 0,
            Err(e) => panic!("{e:?}"),
        };
        let want: Vec<usize> = (0..first).chain(first + landed..capacity).collect();
        let got_ids: Vec<usize> = got.iter().map(|&(id, _)| id).collect();
        assert_eq!(got_ids, want, "round {round} how {how} by_drop {by_drop}: landed xor redelivered");
        for &(id, attempt) in &got {
            // Released before the re-attach: attempt 2 too (one delivery before).
            assert_eq!(attempt, 2, "round {round}: item {id}");
        }
        assert_eq!(lane.acked(), Some(Position(capacity as u64)), "round {round}");
        assert_all_slots_free(&lane, &drops, capacity, &format!("round {round} how {how}"));
        drop((new, lane));
        for id in 0..capacity {
            assert_eq!(drops[id].load(Ordering::SeqCst), 1, "round {round}: M3 item {id}");
        }
    }
}

/// A consumer blocked in `recv_run` (nothing queued: its only items are in a run on another
/// thread) wakes when that thread drops the run, plain or not, and gets the items back first.
#[test]
fn l6_a_run_released_on_another_thread_wakes_the_blocked_consumer() {
    for plain in [true, false] {
        let (lane, drops, mut consumer) = published(4, 3);
        let single = (!plain).then(|| consumer.try_recv().unwrap());
        let run = consumer.try_recv_run(4).unwrap();
        let (tx, rx) = mpsc::channel::<Run<Counted>>();
        let releaser = thread::spawn(move || {
            let run = rx.recv().unwrap();
            thread::sleep(Duration::from_millis(50));
            drop(run);
        });
        tx.send(run).unwrap();
        let got = within(5, &format!("recv_run after a release elsewhere (plain {plain})"), move || {
            let r = consumer.recv_run(4).unwrap().unwrap();
            let got = (ids(&r), r.attempt());
            r.ack().unwrap();
            (got, consumer)
        });
        releaser.join().unwrap();
        let ((got_ids, attempt), mut consumer) = got;
        assert_eq!((got_ids, attempt), (vec![usize::from(!plain)], 2), "plain {plain}");
        if let Some(d) = single {
            d.ack().unwrap();
        }
        let rest = drain(&mut consumer);
        assert_eq!(rest.len(), 2 - usize::from(!plain), "plain {plain}: {rest:?}");
        assert_all_slots_free(&lane, &drops, 3, &format!("plain {plain}"));
    }
}

/// Runs acked and released on another thread while the consumer keeps taking runs: each such step
/// waits out the receive step (the seat), so the acks land once and the redeliveries come back in
/// order, with nothing taken twice, on a lane of one or two slots wrapping many times (L2, L8).
#[test]
fn l2_l8_acks_spinning_on_the_seat_during_receives_across_ring_wraps() {
    for capacity in [1usize, 2] {
        let n = 400;
        let lane = counted_lane(capacity);
        let drops = counters(n);
        let publisher = {
            let (mut producer, drops) = (lane.producer().unwrap(), drops.clone());
            thread::spawn(move || {
                for id in 0..n {
                    producer.publish(Counted::new(id, &drops)).unwrap();
                }
            })
        };
        let mut consumer = lane.attach().unwrap();
        let (tx, rx) = mpsc::channel::<Run<Counted>>();
        let acked = Arc::new(AtomicU64::new(0));
        let acker = {
            let acked = acked.clone();
            thread::spawn(move || {
                let mut k = 0u32;
                while let Ok(r) = rx.recv() {
                    k += 1;
                    // Every third run released once (attempt 1), the others acked.
                    if k % 3 == 0 && r.attempt() == 1 {
                        drop(r);
                    } else {
                        acked.fetch_add(r.len() as u64, Ordering::SeqCst);
                        r.ack().unwrap();
                    }
                }
            })
        };
        let mut seen: Vec<(usize, u32)> = Vec::new();
        within(20, &format!("receive with acks elsewhere (capacity {capacity})"), move || {
            while acked.load(Ordering::SeqCst) < n as u64 {
                match consumer.try_recv_run(2) {
                    Ok(r) => {
                        seen.extend(ids(&r).into_iter().map(|id| (id, r.attempt())));
                        tx.send(r).unwrap();
                    }
                    Err(TryRecvError::Empty) => thread::yield_now(),
                    Err(e) => panic!("{e:?}"),
                }
            }
            drop(tx);
            acker.join().unwrap();
            // Each id delivered once with attempt 1, maybe once more with attempt 2, never more.
            let mut count: HashMap<usize, Vec<u32>> = HashMap::new();
            for &(id, a) in &seen {
                count.entry(id).or_default().push(a);
            }
            for id in 0..n {
                let a = count.get(&id).cloned().unwrap_or_default();
                assert!(a == [1] || a == [1, 2], "capacity {capacity}: item {id} attempts {a:?}");
            }
            let firsts: Vec<usize> = seen.iter().filter(|s| s.1 == 1).map(|s| s.0).collect();
            assert_eq!(firsts, (0..n).collect::<Vec<_>>(), "capacity {capacity}: first deliveries in order");
        });
        publisher.join().unwrap();
        assert_eq!(lane.acked(), Some(Position(n as u64)));
        assert!(lane.is_idle());
        drop(lane);
        for (id, d) in drops.iter().enumerate() {
            assert_eq!(d.load(Ordering::SeqCst), 1, "capacity {capacity}: M3 item {id}");
        }
    }
}

/// The same race, wide: a detached consumer's run of 32 items (plain, so its take-back gives each
/// item a holder) ends item by item on one thread while the new consumer acks its 32 single-item
/// redelivery runs of the same items, in the opposite order, on another: the two cross somewhere,
/// and a seat-held ack that stored its word over a stale handle's holder decrement would pin that
/// slot for ever (P21). Every slot must free, every item land once.
#[test]
fn p21_a_wide_stale_run_ending_crosses_the_new_consumers_run_acks() {
    const N: usize = 32;
    for round in 0..hunt(100) {
        let (lane, drops, mut old) = published(2 * N, N);
        let stale = old.try_recv_run(N).unwrap();
        let mut new = lane.reattach();
        let runs: Vec<Run<Counted>> = (0..N).map(|_| new.try_recv_run(N).unwrap()).collect();
        assert!(runs.iter().enumerate().all(|(i, r)| ids(r) == [i] && r.attempt() == 2), "round {round}");
        let ender = race_with(move || drop(stale));
        for r in runs.into_iter().rev() {
            r.ack().unwrap();
        }
        ender.join().unwrap();
        assert_eq!(drain(&mut new), [], "round {round}");
        assert_eq!(lane.acked(), Some(Position(N as u64)), "round {round}");
        assert_all_slots_free(&lane, &drops, N, &format!("round {round}"));
    }
}
