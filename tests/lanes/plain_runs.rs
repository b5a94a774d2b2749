//! Adversarial tests of plain runs (the ring's "Plain runs": a run taken while nothing of the
//! lane is in flight writes no state word; its acks move `plain_acked` under the seat, its
//! release or a re-attach first turns its items into ordinary `RELEASED` words). Each test tries
//! to make a plain run lose, duplicate, reorder or double-drop an item, or corrupt the acked
//! position, the statistics or the watermark, and is named after the rule it attacks.
//!
//! The first tests drive a lane through random operation sequences (seeded) against a small
//! reference model and compare everything observable after each step; the others are targeted
//! interleavings and a bounded multi-threaded stress.

use crate::common;
use lanestream::prelude::*;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::{
    batch, counted_lane, counters, publish_range, run_positions, shared_envelopes, stream, tracked, within,
    Counted,
};
use lanestream::{
    AckError, Consumer, Delivery, Lane, LaneItem, Position, PublishError, Run, SinkName, Stream,
    TryRecvError, MAX_RUN,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

// ----- the reference model ----------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Queued,
    Delivered,
    Released,
    Acked,
}

#[derive(Clone, Debug)]
struct ModelItem {
    st: St,
    deliveries: u32,
    /// Live handles of detached consumers on the item.
    stale: u32,
}

/// A live delivery or run, with the model epoch it was received in.
enum Held {
    One(Delivery<Counted>, u64, u64), // delivery, index, epoch
    Run(Box<Run<Counted>>, u64),
}

struct Model {
    items: Vec<ModelItem>,
    next: u64,
    epoch: u64,
    delivered: u64,
    redelivered: u64,
    /// Runs taken with nothing in flight (delivered plain by the engine).
    plain: u64,
}

impl Model {
    fn published(&self) -> u64 {
        self.items.len() as u64
    }
    fn acked_end(&self) -> u64 {
        self.items.iter().position(|i| i.st != St::Acked).unwrap_or(self.items.len()) as u64
    }
    fn free(&self) -> u64 {
        let acked = self.acked_end() as usize;
        self.items[..acked].iter().position(|i| i.stale > 0).unwrap_or(acked) as u64
    }
    fn released(&self) -> Vec<u64> {
        (0..self.next).filter(|&i| self.items[i as usize].st == St::Released).collect()
    }
    /// What the next receive of up to `max` items delivers: `(first, len, attempt)`.
    fn expect_take(&mut self, max: u64) -> Option<(u64, u64, u32)> {
        if let Some(&i) = self.released().first() {
            let it = &mut self.items[i as usize];
            it.st = St::Delivered;
            it.deliveries += 1;
            self.delivered += 1;
            self.redelivered += 1;
            return Some((i, 1, it.deliveries));
        }
        let len = (self.published() - self.next).min(max.clamp(1, MAX_RUN as u64));
        if len == 0 {
            return None;
        }
        let first = self.next;
        if self.acked_end() == first && self.free() == first {
            self.plain += 1;
        }
        for i in first..first + len {
            let it = &mut self.items[i as usize];
            it.st = St::Delivered;
            it.deliveries = 1;
        }
        self.next += len;
        self.delivered += len;
        Some((first, len, 1))
    }
    /// Ends the handles on `range` of a delivery of `epoch`: acked (or released) if the epoch is
    /// current, else stale handles ending. Returns whether the epoch was current.
    fn end(&mut self, range: std::ops::Range<u64>, epoch: u64, ack: bool) -> bool {
        let current = epoch == self.epoch;
        for i in range {
            let it = &mut self.items[i as usize];
            if current {
                assert_eq!(it.st, St::Delivered, "model: item {i}");
                it.st = if ack { St::Acked } else { St::Released };
            } else {
                assert!(it.stale > 0, "model: stale handle on item {i}");
                it.stale -= 1;
            }
        }
        current
    }
    fn reattach(&mut self) {
        self.epoch += 1;
        for it in &mut self.items {
            if it.st == St::Delivered {
                it.st = St::Released;
                it.stale += 1;
            }
        }
    }
}

/// One seeded random walk of `steps` operations on a lane of `capacity` slots; returns how many
/// receives were plain and how many re-attaches found a plain run outstanding.
fn walk(seed: u64, capacity: usize, steps: usize) -> (u64, u64) {
    let mut plain_reattached = 0;
    let n = steps + 8;
    let drops = counters(n);
    let lane = counted_lane(capacity);
    let mut producer = lane.producer().unwrap();
    let mut consumer: Option<Consumer<Counted>> = Some(lane.attach().unwrap());
    let mut detached: Vec<Consumer<Counted>> = Vec::new();
    let mut held: Vec<Held> = Vec::new();
    let mut m = Model { items: Vec::new(), next: 0, epoch: 0, delivered: 0, redelivered: 0, plain: 0 };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut log: Vec<String> = Vec::new();
    let ctx = |log: &Vec<String>| format!("seed {seed}, capacity {capacity}: {}", log.join("; "));
    for _ in 0..steps {
        let op = rng.gen_range(0..100);
        match op {
            // Publish (the room follows the model's free slots).
            0..=24 => {
                let id = m.items.len();
                if id >= n {
                    continue;
                }
                let fits = m.published() - m.free() < capacity as u64;
                let r = producer.try_publish(Counted::new(id, &drops));
                log.push(format!("publish {id}"));
                match r {
                    Ok(()) => {
                        assert!(fits, "publish past the room: {}", ctx(&log));
                        m.items.push(ModelItem { st: St::Queued, deliveries: 0, stale: 0 });
                    }
                    Err(PublishError::Full(item)) => {
                        assert!(!fits, "Full with room left: {}", ctx(&log));
                        // Handed back untouched (L3): dropped here, then its id is reused.
                        drop(item);
                        drops[id].store(0, Ordering::SeqCst);
                    }
                    Err(e) => panic!("publish: {e:?}: {}", ctx(&log)),
                }
                // Everything the lane freed before this publish was dropped by it (M3).
                let free = m.free() as usize;
                for (i, d) in drops.iter().enumerate().take(m.items.len()) {
                    let want = usize::from(i < free);
                    assert_eq!(d.load(Ordering::SeqCst), want, "item {i} drops: {}", ctx(&log));
                }
            }
            // Receive a run or a single delivery.
            25..=54 => {
                let Some(c) = consumer.as_mut() else { continue };
                let single = rng.gen_bool(0.25);
                let max = if rng.gen_bool(0.3) { 1 } else { rng.gen_range(1..=capacity as u64 + 2) };
                let want = m.expect_take(if single { 1 } else { max });
                log.push(format!("recv {} max {max} -> {want:?}", if single { "one" } else { "run" }));
                if single {
                    match (c.try_recv(), want) {
                        (Ok(d), Some((i, 1, a))) => {
                            assert_eq!((d.item().id as u64, d.attempt()), (i, a), "{}", ctx(&log));
                            held.push(Held::One(d, i, m.epoch));
                        }
                        (Err(TryRecvError::Empty), None) => {}
                        (got, want) => panic!("recv {:?} want {want:?}: {}", got.err(), ctx(&log)),
                    }
                } else {
                    match (c.try_recv_run(max as usize), want) {
                        (Ok(r), Some((i, len, a))) => {
                            assert_eq!(
                                (r.sequences(), r.attempt()),
                                (i..i + len, a),
                                "run shape: {}",
                                ctx(&log)
                            );
                            let ids: Vec<u64> = r.iter().map(|x| x.id as u64).collect();
                            assert_eq!(ids, (i..i + len).collect::<Vec<_>>(), "{}", ctx(&log));
                            held.push(Held::Run(Box::new(r), m.epoch));
                        }
                        (Err(TryRecvError::Empty), None) => {}
                        (got, want) => panic!("run {:?} want {want:?}: {}", got.err(), ctx(&log)),
                    }
                }
            }
            // Ack (whole, cumulative or by position) a random live delivery or run.
            55..=74 => {
                if held.is_empty() {
                    continue;
                }
                let k = rng.gen_range(0..held.len());
                match held.swap_remove(k) {
                    Held::One(d, i, e) => {
                        log.push(format!("ack one {i} (epoch {e})"));
                        let current = m.end(i..i + 1, e, true);
                        let r = d.ack();
                        assert_eq!(r.is_ok(), current, "ack one {r:?}: {}", ctx(&log));
                    }
                    Held::Run(run, e) => {
                        let seqs = run.sequences();
                        let mut kept = Some(run);
                        let r = kept.as_mut().unwrap();
                        let how = rng.gen_range(0..3);
                        let n_ack = match how {
                            0 => seqs.end - seqs.start,
                            _ => rng.gen_range(0..=seqs.end - seqs.start),
                        };
                        log.push(format!("ack run {seqs:?} ({how}) n {n_ack} (epoch {e})"));
                        let current = m.end(seqs.start..seqs.start + n_ack, e, true);
                        let res = match how {
                            0 => (*kept.take().unwrap()).ack().map(|()| n_ack as usize),
                            1 => {
                                // Just below the item after the prefix; `seqs.start - 1` (n = 0)
                                // wraps only when `start == 0`.
                                let seq = (seqs.start + n_ack).wrapping_sub(1);
                                if n_ack == 0 && seqs.start == 0 {
                                    Ok(0)
                                } else {
                                    r.ack_through(seq)
                                }
                            }
                            _ => {
                                if n_ack == 0 {
                                    r.ack_through_position(Position(seqs.start))
                                // below the run
                                } else {
                                    r.ack_through_position(Position(seqs.start + n_ack))
                                }
                            }
                        };
                        match res {
                            Ok(got) => {
                                assert!(current || n_ack == 0, "stale ack landed: {}", ctx(&log));
                                assert_eq!(got as u64, n_ack, "{}", ctx(&log));
                            }
                            Err(AckError::Detached) => {
                                assert!(!current && n_ack > 0, "ack refused: {}", ctx(&log))
                            }
                            Err(e) => panic!("{e:?}"),
                        }
                        if let Some(r) = kept.filter(|r| !r.is_empty()) {
                            held.push(Held::Run(r, e));
                        }
                    }
                }
            }
            // Nack or drop a random live delivery or run.
            75..=84 => {
                if held.is_empty() {
                    continue;
                }
                let k = rng.gen_range(0..held.len());
                match held.swap_remove(k) {
                    Held::One(d, i, e) => {
                        log.push(format!("nack one {i} (epoch {e})"));
                        m.end(i..i + 1, e, false);
                        if rng.gen_bool(0.5) {
                            d.nack()
                        } else {
                            drop(d)
                        }
                    }
                    Held::Run(r, e) => {
                        log.push(format!("nack run {:?} (epoch {e})", r.sequences()));
                        m.end(r.sequences(), e, false);
                        if rng.gen_bool(0.5) {
                            (*r).nack()
                        } else {
                            drop(r)
                        }
                    }
                }
            }
            // Re-attach (keeping the old consumer alive, or not), or drop and attach.
            85..=91 => {
                log.push("reattach".into());
                plain_reattached += u64::from(m.items.iter().any(|i| i.st == St::Delivered));
                m.reattach();
                let new = lane.reattach();
                if let Some(old) = consumer.replace(new) {
                    if rng.gen_bool(0.5) {
                        detached.push(old);
                    }
                }
            }
            92..=95 => {
                if consumer.is_some() {
                    log.push("drop consumer".into());
                    consumer = None;
                } else {
                    log.push("attach".into());
                    m.reattach();
                    consumer = Some(lane.attach().unwrap());
                }
            }
            // A detached consumer only ever sees Detached.
            _ => {
                if let Some(old) = detached.last_mut() {
                    assert_eq!(old.try_recv_run(4).unwrap_err(), TryRecvError::Detached, "{}", ctx(&log));
                    let single = old.try_recv().err();
                    assert_eq!(single, Some(TryRecvError::Detached), "{}", ctx(&log));
                }
            }
        }
        check(&lane, &m, &held, &drops, &ctx(&log));
    }
    // Finish: end every handle, re-attach, drain; everything lands once and is dropped once.
    log.push("finish".into());
    for h in held.drain(..) {
        match h {
            Held::One(d, i, e) => {
                m.end(i..i + 1, e, false);
                drop(d);
            }
            Held::Run(r, e) => {
                m.end(r.sequences(), e, false);
                drop(r);
            }
        }
    }
    m.reattach();
    let mut c = lane.reattach();
    drop(detached);
    while let Ok(r) = c.try_recv_run(64) {
        let seqs = r.sequences();
        let want = m.expect_take(64).expect("model has more");
        assert_eq!((seqs.start, seqs.end - seqs.start, r.attempt()), want, "{}", ctx(&log));
        m.end(seqs, m.epoch, true);
        r.ack().unwrap();
    }
    assert_eq!(m.acked_end(), m.published(), "{}", ctx(&log));
    check(&lane, &m, &held, &drops, &ctx(&log));
    assert!(lane.is_idle());
    let published = m.items.len();
    drop((c, consumer, producer, lane));
    for (i, d) in drops.iter().enumerate().take(published) {
        assert_eq!(d.load(Ordering::SeqCst), 1, "M3: item {i}: {}", ctx(&log));
    }
    (m.plain, plain_reattached)
}

/// Compares the lane's statistics, acked position and live items with the model.
fn check(lane: &Lane<Counted>, m: &Model, held: &[Held], drops: &[AtomicUsize], ctx: &str) {
    let s = lane.stats();
    let (acked, free) = (m.acked_end(), m.free());
    let released = m.released().len() as u64;
    let got = (s.published, s.queued, s.released, s.in_flight, s.acked_items, s.pinned);
    let want =
        (m.published(), m.published() - m.next, released, m.next - acked - released, acked, acked - free);
    assert_eq!(got, want, "stats (published, queued, released, in_flight, acked_items, pinned): {ctx}");
    assert_eq!((s.delivered, s.redelivered), (m.delivered, m.redelivered), "delivery counts: {ctx}");
    let want_pos = (acked > 0).then_some(Position(acked));
    assert_eq!(lane.acked(), want_pos, "L5 acked position: {ctx}");
    assert_eq!(lane.is_idle(), acked == m.published(), "W5: {ctx}");
    // Every live handle still reads its own item, not dropped (M3, no reuse under a reader).
    for h in held {
        let ids: Vec<(u64, u64)> = match h {
            Held::One(d, i, _) => vec![(d.item().id as u64, *i)],
            Held::Run(r, _) => r.iter().zip(r.sequences()).map(|(x, i)| (x.id as u64, i)).collect(),
        };
        for (id, i) in ids {
            assert_eq!(id, i, "a live handle reads another item: {ctx}");
            assert_eq!(
                drops[id as usize].load(Ordering::SeqCst),
                0,
                "item {id} dropped under a reader: {ctx}"
            );
        }
    }
}

/// L2, L5, L6, L8, M3 and the statistics under random mixes of plain runs, non-plain runs,
/// single deliveries, cumulative acks, releases, re-attaches and consumer drops, at capacities
/// around the plain run's edges (1, 2, 3, a power of two, around 64 for the wrap), each step
/// checked against the model.
#[test]
fn l8_m3_plain_runs_random_walks_match_the_model_at_every_step() {
    let (mut plain, mut reattached) = (0, 0);
    for capacity in [1, 2, 3, 4, 5, 8, 63, 64, 65] {
        for seed in 0..40u64 {
            let (p, r) = walk(seed * 1_000 + capacity as u64, capacity, 400);
            (plain, reattached) = (plain + p, reattached + r);
        }
    }
    // The walks reach what they attack (not a test of the engine: of the walk).
    assert!(plain > 2_000 && reattached > 500, "plain receives {plain}, re-attaches {reattached}");
}

// ----- multi-threaded stress --------------------------------------------------------------------

/// What one lane's receiver saw, shared with its acker.
struct LaneLog {
    /// Deliveries of each sequence seen so far (the next attempt must be one more).
    deliveries: Vec<u32>,
    /// Sequences whose ack was reported as landed (never to be delivered again).
    landed: Vec<bool>,
    /// The highest first delivery so far (first deliveries come in publish order, L2).
    last_first: Option<u64>,
}

/// Checks a received run on lane `lane` (0 or 1): each item is its own (position = sequence +
/// 1, addressed to this lane), its attempt is one more than its deliveries so far, a landed item
/// never comes back, and first deliveries come in publish order.
fn check_received(run: &Run<LaneItem>, lane: usize, to: &[Option<usize>], log: &Mutex<LaneLog>) {
    let mut log = log.lock().unwrap();
    for (item, seq) in run.iter().zip(run.sequences()) {
        assert_eq!(item.position(), Some(Position(seq + 1)), "lane {lane}: item {seq} reads another cell");
        assert!(to[seq as usize].is_none_or(|l| l == lane), "lane {lane}: item {seq} is another lane's");
        let d = &mut log.deliveries[seq as usize];
        *d += 1;
        assert_eq!(
            run.attempt(),
            *d,
            "lane {lane}: item {seq}: attempt {} after {} deliveries",
            run.attempt(),
            *d - 1
        );
        assert!(!log.landed[seq as usize], "lane {lane}: item {seq} redelivered after its ack landed (L8)");
        if run.attempt() == 1 {
            assert!(
                log.last_first.is_none_or(|l| l < seq),
                "lane {lane}: first delivery of {seq} out of order"
            );
            log.last_first = Some(seq);
        }
    }
}

/// Marks `seqs` landed (their ack returned `Ok`); an item landing twice is a duplicate.
fn mark_landed(seqs: std::ops::Range<u64>, lane: usize, log: &Mutex<LaneLog>) {
    let mut log = log.lock().unwrap();
    for s in seqs {
        assert!(!log.landed[s as usize], "lane {lane}: item {s} landed twice");
        log.landed[s as usize] = true;
    }
}

/// One stress round: a fan-out publishing `n` items to two lanes (some to one lane only: gaps
/// on the other), each lane received in runs by a thread that re-attaches now and then (or
/// drops its consumer and attaches), its runs acked, acked in part, nacked or dropped by an
/// acker thread (seat races with the receives), and a watermark reader.
fn stress(seed: u64, capacity: usize, n: u64) {
    let s = stream(capacity, &["a", "b"]);
    let mut rng = StdRng::seed_from_u64(seed);
    let to: Arc<Vec<Option<usize>>> =
        Arc::new((0..n).map(|_| if rng.gen_bool(0.2) { Some(rng.gen_range(0..2)) } else { None }).collect());
    let envelopes: Arc<Vec<_>> = Arc::new((0..n).map(shared_envelopes).collect());
    let done = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    {
        let (s, to, envelopes) = (s.clone(), to.clone(), envelopes.clone());
        threads.push(thread::spawn(move || {
            let mut fanout = s.fanout().unwrap();
            for seq in 0..n {
                let item = tracked(Some(seq + 1), &envelopes[seq as usize]);
                match to[seq as usize] {
                    Some(l) => fanout.publish_to(l, item).unwrap(),
                    None => fanout.publish(item).unwrap(),
                }
            }
            fanout.close();
        }));
    }
    for (lane, name) in ["a", "b"].into_iter().enumerate() {
        let (s, to) = (s.clone(), to.clone());
        let log = Arc::new(Mutex::new(LaneLog {
            deliveries: vec![0; n as usize],
            landed: vec![false; n as usize],
            last_first: None,
        }));
        let (tx, rx) = mpsc::sync_channel::<Run<LaneItem>>(4);
        let rx = Arc::new(Mutex::new(rx));
        // Two ackers per lane, each holding a few runs and ending them in random order: plain
        // and non-plain runs of one consumer outstanding at once, acked on two threads.
        for acker in 0..2u64 {
            let (acker_log, rx) = (log.clone(), rx.clone());
            let mut arng = StdRng::seed_from_u64(seed ^ ((lane as u64 * 2 + acker + 1) * 0x9E37));
            threads.push(thread::spawn(move || {
                let mut pending: Vec<Run<LaneItem>> = Vec::new();
                let mut open = true;
                while open || !pending.is_empty() {
                    if open {
                        let got = rx.lock().unwrap().recv_timeout(Duration::from_micros(100));
                        match got {
                            Ok(run) => pending.push(run),
                            Err(mpsc::RecvTimeoutError::Timeout) => {}
                            Err(mpsc::RecvTimeoutError::Disconnected) => open = false,
                        }
                        if open && pending.len() < arng.gen_range(1..=3) {
                            continue;
                        }
                    }
                    if pending.is_empty() {
                        continue;
                    }
                    let mut run = pending.swap_remove(arng.gen_range(0..pending.len()));
                    let seqs = run.sequences();
                    // A stale run still reads its own items (their cells are not reused).
                    for (item, seq) in run.iter().zip(seqs.clone()) {
                        assert_eq!(
                            item.position(),
                            Some(Position(seq + 1)),
                            "acker {lane}: item {seq} reused"
                        );
                    }
                    match arng.gen_range(0..10) {
                        0..=4 => {
                            if run.ack().is_ok() {
                                mark_landed(seqs, lane, &acker_log);
                            }
                        }
                        5..=7 => {
                            let k = arng.gen_range(0..=seqs.end - seqs.start);
                            let through = Position(seqs.start + k); // the position of item start + k - 1
                            if k > 0 && run.ack_through_position(through) == Ok(k as usize) {
                                mark_landed(seqs.start..seqs.start + k, lane, &acker_log);
                            }
                            if arng.gen_bool(0.5) && !run.is_empty() {
                                pending.push(run); // the rest later
                            } else {
                                drop(run); // releases the rest
                            }
                        }
                        _ => run.nack(),
                    }
                }
            }));
        }
        let lane_handle = s.lane(name).unwrap();
        let mut rrng = StdRng::seed_from_u64(seed.wrapping_mul(31) + lane as u64);
        threads.push(thread::spawn(move || {
            let mut c = Some(lane_handle.attach().unwrap());
            loop {
                let stats = lane_handle.stats();
                if stats.closed && stats.acked_items == stats.published && stats.queued == 0 {
                    break;
                }
                let Some(consumer) = c.as_mut() else {
                    c = Some(lane_handle.attach().unwrap());
                    continue;
                };
                let max = rrng.gen_range(1..=8);
                match consumer.recv_run_timeout(max, Duration::from_millis(20)) {
                    Ok(Some(run)) => {
                        check_received(&run, lane, &to, &log);
                        if rrng.gen_bool(0.2) {
                            // Acked here, while the acker thread acks other runs.
                            let seqs = run.sequences();
                            if run.ack().is_ok() {
                                mark_landed(seqs, lane, &log);
                            }
                        } else {
                            tx.send(run).unwrap();
                        }
                    }
                    Ok(None) | Err(_) => thread::yield_now(),
                }
                match rrng.gen_range(0..100) {
                    0..=2 => c = Some(lane_handle.reattach()),
                    3 => c = None,
                    _ => {}
                }
            }
            drop(tx);
            drop(c);
        }));
    }
    {
        let (s, done) = (s.clone(), done.clone());
        threads.push(thread::spawn(move || {
            let mut last = None;
            while !done.load(Ordering::SeqCst) {
                let w = s.watermark();
                assert!(w >= last, "W3: the watermark went back from {last:?} to {w:?}");
                assert!(w.is_none_or(|p| p.0 <= n), "watermark {w:?} past the last position {n}");
                last = w;
                thread::yield_now();
            }
        }));
    }
    let watcher = threads.pop().unwrap();
    for t in threads {
        t.join().unwrap();
    }
    done.store(true, Ordering::SeqCst);
    watcher.join().unwrap();
    // Every item landed on every lane it went to; the watermark is the last position.
    assert_eq!(s.watermark(), Some(Position(n)), "seed {seed}, capacity {capacity}");
    for name in ["a", "b"] {
        let st = s.stats(name).unwrap();
        assert_eq!((st.acked_items, st.published, st.released, st.in_flight, st.pinned), (n, n, 0, 0, 0));
        assert!(st.delivered >= st.redelivered);
    }
    // M3: every item is dropped once the stream goes (the fan-out dropped the freed ones).
    drop(s);
    for (seq, e) in envelopes.iter().enumerate() {
        assert_eq!(Arc::strong_count(e), 1, "M3: item {seq} of seed {seed} still alive");
    }
}

/// L2, L5, L6, L8, W3, M3 under threads: plain and non-plain runs received while other runs
/// of the same consumer are acked, partly acked and released on another thread, with
/// re-attaches and consumer drops at random points of their lives, over a fan-out with gaps,
/// at capacities 1, 2, 7 and 64.
#[test]
fn l8_w3_m3_plain_runs_acked_elsewhere_with_reattaches_and_gaps_under_threads() {
    within(60, "plain-run stress", || {
        for (i, capacity) in [1, 2, 7, 64].into_iter().enumerate() {
            for round in 0..3u64 {
                stress(round * 100 + i as u64, capacity, 500);
            }
        }
    });
}

// ----- targeted interleavings -------------------------------------------------------------------

/// L8: a plain run's cumulative acks (and, at a random point, its release) racing a re-attach
/// or a consumer drop and `Lane::attach` on another thread: every item either landed (its ack
/// returned `Ok`) or is redelivered to the new consumer, exactly once, never both, never
/// neither; and the old run, stale, still reads its items until it is dropped.
#[test]
fn l8_plain_run_acks_and_release_racing_a_reattach_land_xor_are_redelivered() {
    within(30, "plain acks racing re-attach", || {
        let mut rng = StdRng::seed_from_u64(8);
        for round in 0..600u64 {
            let capacity = [1, 2, 5, 8, 64][round as usize % 5];
            let lane = counted_lane(capacity);
            let drops = counters(capacity);
            let mut producer = lane.producer().unwrap();
            for id in 0..capacity {
                producer.try_publish(Counted::new(id, &drops)).unwrap();
            }
            let mut old = lane.attach().unwrap();
            let mut run = old.try_recv_run(64).unwrap();
            assert_eq!(run.sequences(), 0..capacity as u64);
            let step = rng.gen_range(1..=3u64);
            let release_after = rng.gen_range(0..=capacity as u64 / step + 1);
            let spin = rng.gen_range(0..300);
            let polite = rng.gen_bool(0.5);
            let acker = thread::spawn(move || {
                let mut landed = Vec::new();
                let mut acks = 0;
                while !run.is_empty() {
                    if acks == release_after {
                        drop(run); // releases the rest (or, if stale, ends it)
                        break;
                    }
                    acks += 1;
                    let seqs = run.sequences();
                    let to = (seqs.start + step - 1).min(seqs.end - 1);
                    match run.ack_through(to) {
                        Ok(k) => landed.extend(seqs.start..seqs.start + k as u64),
                        Err(AckError::Detached) => {
                            // Stale: its remaining items are still its own.
                            for (item, seq) in run.iter().zip(run.sequences()) {
                                assert_eq!(item.id as u64, seq, "a stale plain run reads a reused cell");
                            }
                        }
                        Err(e) => panic!("{e:?}"),
                    }
                }
                landed
            });
            for _ in 0..spin {
                std::hint::spin_loop();
            }
            let mut new = if polite {
                drop(old);
                lane.attach().unwrap()
            } else {
                let new = lane.reattach();
                assert_eq!(old.try_recv_run(4).unwrap_err(), TryRecvError::Detached);
                drop(old);
                new
            };
            let landed = acker.join().unwrap();
            let mut redelivered = Vec::new();
            while let Ok(r) = new.try_recv_run(64) {
                assert_eq!(
                    (r.len(), r.attempt()),
                    (1, 2),
                    "round {round}: a taken-back item alone, attempt 2"
                );
                redelivered.extend(r.sequences());
                r.ack().unwrap();
            }
            let mut all: Vec<u64> = landed.iter().chain(&redelivered).copied().collect();
            all.sort_unstable();
            assert_eq!(
                all,
                (0..capacity as u64).collect::<Vec<_>>(),
                "round {round} (capacity {capacity}): landed {landed:?}, redelivered {redelivered:?}"
            );
            let st = lane.stats();
            assert_eq!((st.acked_items, st.pinned, st.released, st.in_flight), (capacity as u64, 0, 0, 0));
            assert_eq!(lane.acked(), Some(Position(capacity as u64)));
            drop((producer, new, lane));
            assert!(drops.iter().all(|d| d.load(Ordering::SeqCst) == 1), "M3, round {round}");
        }
    });
}

/// L8 step by step: a plain run acked in part, then a re-attach, then a refused cumulative
/// ack of the stale run: the acked part counts, the rest comes back alone with attempt 2; the
/// stale run pins exactly the items it still holds (L3: the publisher sees no room for them)
/// until it is dropped, and dropping it releases nothing more.
#[test]
fn l8_l3_reattach_between_a_plain_runs_partial_ack_and_its_drop_pins_only_what_it_holds() {
    let drops = counters(12);
    let lane = counted_lane(6);
    let mut producer = lane.producer().unwrap();
    for id in 0..6 {
        producer.try_publish(Counted::new(id, &drops)).unwrap();
    }
    let mut c1 = lane.attach().unwrap();
    let mut run = c1.try_recv_run(64).unwrap();
    assert_eq!(run.sequences(), 0..6);
    assert_eq!(run.ack_through(1), Ok(2));
    assert_eq!(lane.acked(), Some(Position(2)));
    let st = lane.stats();
    assert_eq!((st.acked_items, st.in_flight, st.released, st.pinned), (2, 4, 0, 0));
    let mut c2 = lane.reattach();
    let st = lane.stats();
    assert_eq!((st.acked_items, st.in_flight, st.released, st.pinned), (2, 0, 4, 0));
    // The stale run's cumulative ack is refused and ends its handles on items 2 and 3.
    assert_eq!(run.ack_through(3), Err(AckError::Detached));
    assert_eq!(run.sequences(), 4..6);
    assert_eq!(run.iter().map(|c| c.id).collect::<Vec<_>>(), [4, 5]);
    let mut got = Vec::new();
    while let Ok(r) = c2.try_recv_run(64) {
        got.push((r.sequences(), r.attempt()));
        r.ack().unwrap();
    }
    assert_eq!(got, vec![(2..3, 2), (3..4, 2), (4..5, 2), (5..6, 2)]);
    assert_eq!(lane.acked(), Some(Position(6)), "acked at once (L5)");
    let st = lane.stats();
    assert_eq!((st.acked_items, st.in_flight, st.released, st.pinned), (6, 0, 0, 2), "items 4, 5 pinned");
    // Two slots are pinned: four publishes fit, the fifth does not.
    for id in 6..10 {
        producer.try_publish(Counted::new(id, &drops)).unwrap();
    }
    assert!((0..4).all(|i| drops[i].load(Ordering::SeqCst) == 1), "freed items dropped by the publish");
    assert!((4..6).all(|i| drops[i].load(Ordering::SeqCst) == 0), "pinned items kept");
    assert!(matches!(producer.try_publish(Counted::new(10, &drops)), Err(PublishError::Full(_))));
    drops[10].store(0, Ordering::SeqCst);
    drop(run); // releases nothing more
    let st = lane.stats();
    assert_eq!((st.pinned, st.released, st.queued), (0, 0, 4));
    let r = c2.try_recv_run(64).unwrap();
    assert_eq!((r.sequences(), r.attempt()), (6..10, 1), "no redelivery of the stale run's items");
    r.ack().unwrap();
    assert!(lane.is_idle());
    drop((producer, c1, c2, lane));
    assert!((0..10).all(|i| drops[i].load(Ordering::SeqCst) == 1), "M3");
}

/// L8 after a consumer drop: its plain run still acks until `Lane::attach` takes the rest back;
/// then the run's acks are refused and the rest goes to the new consumer.
#[test]
fn l8_a_dropped_consumers_plain_run_acks_until_attach_then_is_refused() {
    let s = stream(8, &["a"]);
    publish_range(&s, 1..=6);
    let lane = s.lane("a").unwrap();
    let mut c1 = lane.attach().unwrap();
    let mut run = c1.try_recv_run(8).unwrap();
    drop(c1);
    assert_eq!(run.ack_through(1), Ok(2), "the dropped consumer's run still acks");
    assert_eq!(s.watermark(), Some(Position(2)));
    let mut c2 = lane.attach().unwrap();
    assert_eq!(run.ack_through(2), Err(AckError::Detached));
    assert_eq!(run_positions(&run), [4, 5, 6], "the stale rest still reads its items");
    let mut got = Vec::new();
    while let Ok(r) = c2.try_recv_run(8) {
        got.push((run_positions(&r), r.attempt()));
        r.ack().unwrap();
    }
    assert_eq!(got, vec![(vec![3], 2), (vec![4], 2), (vec![5], 2), (vec![6], 2)]);
    assert_eq!(s.watermark(), Some(Position(6)));
    assert_eq!(s.stats("a").unwrap().pinned, 3);
    assert_eq!(run.ack(), Err(AckError::Detached));
    assert_eq!(s.stats("a").unwrap().pinned, 0);
    assert!(s.is_idle());
}

/// L2 with gaps: a plain run stops at a gap (an item for the other lane), the gap is passed,
/// and each lane's acked position and the watermark follow.
#[test]
fn l2_w1_a_plain_run_stops_at_a_gap_and_the_watermark_follows_both_lanes() {
    let s = stream(8, &["a", "b"]);
    let mut f = s.fanout().unwrap();
    f.try_publish(batch(1)).unwrap();
    f.try_publish(batch(2)).unwrap();
    f.try_publish_to(1, batch(3)).unwrap(); // lane b only: a gap on lane a
    f.try_publish(batch(4)).unwrap();
    f.try_publish_to(0, batch(5)).unwrap(); // lane a only: a gap on lane b
    let (mut a, mut b) = (s.attach("a").unwrap(), s.attach("b").unwrap());
    let ra = a.try_recv_run(8).unwrap();
    assert_eq!((run_positions(&ra), ra.sequences()), (vec![1, 2], 0..2), "stops at the gap");
    let rb = b.try_recv_run(8).unwrap();
    assert_eq!(run_positions(&rb), [1, 2, 3, 4], "stops at its own gap");
    rb.ack().unwrap();
    assert_eq!(s.watermark(), None, "lane a acked nothing");
    ra.ack().unwrap();
    assert_eq!(s.watermark(), Some(Position(2)));
    let ra = a.try_recv_run(8).unwrap();
    assert_eq!((run_positions(&ra), ra.sequences()), (vec![4, 5], 3..5), "the gap passed");
    assert_eq!(s.stats("a").unwrap().acked_items, 3, "the gap counts as acked");
    assert_eq!(s.watermark(), Some(Position(3)), "the gap's position counts on lane a");
    ra.ack().unwrap();
    assert_eq!(s.watermark(), Some(Position(4)), "lane b has not passed its gap");
    assert_eq!(b.try_recv_run(8).unwrap_err(), TryRecvError::Empty);
    assert_eq!(s.watermark(), Some(Position(5)));
    assert!(s.is_idle());
}

/// L10: closing while a plain run is outstanding: the consumer ends (`None`), the run's release
/// comes back (attempt 2) and only then is the lane drained for good.
#[test]
fn l10_close_with_a_plain_run_outstanding_drains_its_release_then_ends() {
    let s = stream(4, &["a"]);
    publish_range(&s, 1..=4);
    let mut c = s.attach("a").unwrap();
    let mut run = c.try_recv_run(8).unwrap();
    assert_eq!(run.sequences(), 0..4);
    s.close("a").unwrap();
    assert!(c.recv_run(8).unwrap().is_none(), "nothing queued or released: None");
    assert_eq!(run.ack_through(0), Ok(1));
    run.nack();
    let mut got = Vec::new();
    while let Some(r) = c.recv_run(8).unwrap() {
        got.push((run_positions(&r), r.attempt()));
        r.ack().unwrap();
    }
    assert_eq!(got, vec![(vec![2], 2), (vec![3], 2), (vec![4], 2)]);
    assert_eq!(s.watermark(), Some(Position(4)));
    assert!(s.is_idle());
}

/// M3: the stream, its fan-out, its lanes and the consumer dropped while plain runs are
/// outstanding (one acked in part, one stale after a re-attach): the runs still read their
/// items, and every item is dropped exactly once, when the last run goes.
#[test]
fn m3_stream_dropped_with_plain_runs_outstanding_drops_each_item_once() {
    let s = stream(8, &["a"]);
    let envelopes: Vec<_> = (1..=8).map(shared_envelopes).collect();
    let mut f = s.fanout().unwrap();
    for (p, e) in envelopes.iter().enumerate() {
        f.try_publish(tracked(Some(p as u64 + 1), e)).unwrap();
    }
    let lane = s.lane("a").unwrap();
    let mut c1 = lane.attach().unwrap();
    let mut stale = c1.try_recv_run(3).unwrap(); // plain: 1..3
    assert_eq!(stale.ack_through(0), Ok(1));
    let mut c2 = lane.reattach();
    let r2 = c2.try_recv_run(8).unwrap(); // item 2, redelivered alone
    assert_eq!((run_positions(&r2), r2.attempt()), (vec![2], 2));
    r2.ack().unwrap();
    let r3 = c2.try_recv_run(8).unwrap();
    assert_eq!(run_positions(&r3), [3]);
    r3.ack().unwrap();
    let mut live = c2.try_recv_run(8).unwrap(); // 4..8, plain? (items 2, 3 pinned: not plain)
    assert_eq!(run_positions(&live), [4, 5, 6, 7, 8]);
    assert_eq!(live.ack_through(4), Ok(2));
    drop((f, c1, c2, lane, s));
    assert_eq!(run_positions(&stale), [2, 3]);
    assert_eq!(run_positions(&live), [6, 7, 8]);
    // The fan-out's drop dropped what the lane freed (item 1); nothing under the runs.
    let counts = |e: &[Arc<[lanestream::Envelope]>]| e.iter().map(Arc::strong_count).collect::<Vec<_>>();
    assert_eq!(counts(&envelopes), [1, 2, 2, 2, 2, 2, 2, 2], "nothing dropped under the runs");
    drop(stale);
    assert_eq!(counts(&envelopes), [1, 2, 2, 2, 2, 2, 2, 2], "items 2, 3 stay until the last owner");
    drop(live);
    for (p, e) in envelopes.iter().enumerate() {
        assert_eq!(Arc::strong_count(e), 1, "M3: item {} dropped once", p + 1);
    }
}

/// W1/W2 on a plain run whose acked prefix ends in (or is only) unpositioned items: the acked
/// position is the last positioned item of the prefix, and a prefix of snapshots moves nothing.
#[test]
fn w2_a_plain_runs_unpositioned_prefix_moves_the_acked_position_only_to_a_positioned_item() {
    let s = stream(16, &["a"]);
    let mut f = s.fanout().unwrap();
    for item in
        [common::snapshot(), common::snapshot(), batch(5), common::snapshot(), batch(9), common::snapshot()]
    {
        f.try_publish(item).unwrap();
    }
    let mut c = s.attach("a").unwrap();
    let mut run = c.try_recv_run(16).unwrap();
    assert_eq!(run.len(), 6);
    assert_eq!(run.ack_through(1), Ok(2));
    assert_eq!((s.watermark(), s.stats("a").unwrap().acked_items), (None, 2), "W2");
    assert_eq!(run.ack_through(3), Ok(2));
    assert_eq!(s.watermark(), Some(Position(5)));
    run.ack().unwrap();
    assert_eq!(s.watermark(), Some(Position(9)));
    // A next plain run of snapshots only: the position stays.
    f.try_publish(common::snapshot()).unwrap();
    f.try_publish(common::snapshot()).unwrap();
    let run = c.try_recv_run(16).unwrap();
    assert_eq!(run.sequences(), 6..8);
    run.ack().unwrap();
    assert_eq!((s.watermark(), s.stats("a").unwrap().acked_items), (Some(Position(9)), 8));
    assert!(s.is_idle());
}

// ----- wake-ups -----------------------------------------------------------------------------------

/// L6/L2: a consumer parked in `recv_run` (no deadline) is woken by a plain run released on
/// another thread, and receives its items first, each alone with attempt 2; repeated so that
/// the release lands before, during and after the park.
#[test]
fn l6_a_plain_runs_release_wakes_a_consumer_parked_in_recv_run() {
    within(30, "parked recv_run", || {
        for round in 0..200u64 {
            let s = stream(4, &["a"]);
            publish_range(&s, 1..=3);
            let mut c = s.attach("a").unwrap();
            let mut run = c.try_recv_run(8).unwrap();
            assert_eq!(run.ack_through(round % 3), Ok((round % 3 + 1) as usize));
            let releaser = thread::spawn(move || {
                for _ in 0..round % 7 * 50 {
                    std::hint::spin_loop();
                }
                drop(run);
            });
            let mut got = Vec::new();
            let want = 3 - (round % 3 + 1);
            while (got.len() as u64) < want {
                let r = c.recv_run(8).unwrap().expect("not closed");
                got.push((run_positions(&r), r.attempt()));
                r.ack().unwrap();
            }
            releaser.join().unwrap();
            let expect: Vec<_> = (round % 3 + 2..=3).map(|p| (vec![p], 2)).collect();
            assert_eq!(got, expect, "round {round}");
            assert!(s.is_idle());
        }
    });
}

/// W6: a confirmer waiting for the watermark is woken by the plain run's cumulative ack that
/// moves it, on both lanes (one plain, one not: a single delivery is out before its run).
#[test]
fn w6_a_plain_runs_cumulative_ack_wakes_a_watermark_waiter() {
    let s = stream(8, &["a", "b"]);
    publish_range(&s, 1..=4);
    let (mut a, mut b) = (s.attach("a").unwrap(), s.attach("b").unwrap());
    let first_b = b.try_recv().unwrap(); // lane b's run below is not plain
    let mut run_a = a.try_recv_run(8).unwrap();
    let mut run_b = b.try_recv_run(8).unwrap();
    first_b.ack().unwrap();
    assert_eq!(run_b.ack_through(2), Ok(2));
    let waiter = {
        let s = s.clone();
        thread::spawn(move || s.wait_watermark(Position(3), None))
    };
    thread::sleep(Duration::from_millis(20));
    assert!(!waiter.is_finished(), "returned before lane a acked");
    assert_eq!(run_a.ack_through(2), Ok(3));
    assert_eq!(within(10, "wait_watermark", move || waiter.join().unwrap()), Some(Position(3)));
    run_a.ack().unwrap();
    run_b.ack().unwrap();
    assert_eq!(s.watermark(), Some(Position(4)));
}

/// L3: a publisher waiting for room on a full lane is woken by the plain run's ack that frees
/// it (one advancer pass for the whole run), at capacity 1 and 3.
#[test]
fn l3_a_publisher_waiting_for_room_is_woken_by_a_plain_runs_ack() {
    for capacity in [1usize, 3] {
        let lane: Lane<common::Tick> = Lane::standalone(SinkName::new("t").unwrap(), capacity).unwrap();
        let mut p = lane.producer().unwrap();
        for t in 1..=capacity as u64 {
            p.try_publish(common::Tick(t)).unwrap();
        }
        let mut c = lane.attach().unwrap();
        let mut run = c.try_recv_run(8).unwrap();
        assert_eq!(run.len(), capacity);
        let publisher = thread::spawn(move || {
            p.publish(common::Tick(100)).unwrap();
            p
        });
        thread::sleep(Duration::from_millis(20));
        assert!(!publisher.is_finished(), "published into a full lane");
        let rest = if capacity > 1 {
            assert_eq!(run.ack_through(0), Ok(1));
            Some(run)
        } else {
            run.ack().unwrap();
            None
        };
        let _p = within(10, "publish waiting for room", move || publisher.join().unwrap());
        drop(rest);
        let mut got = Vec::new();
        while let Ok(r) = c.try_recv_run(8) {
            got.extend(r.iter().map(|t| (t.0, r.attempt())));
            r.ack().unwrap();
        }
        let mut want: Vec<_> = (2..=capacity as u64).map(|t| (t, 2)).collect();
        want.push((100, 1));
        assert_eq!(got, want, "capacity {capacity}");
        assert_eq!(lane.acked(), Some(Position(100)));
    }
}

/// L8, holder bound: a plain run's stale holder (given by the first re-attach) counts toward
/// the 65,535 live deliveries of its item like any other; at the bound the redelivery waits and
/// nothing overtakes it; ending exactly the plain run's stale handle lets it through.
#[test]
fn l8_a_stale_plain_run_counts_toward_the_holder_bound_and_its_end_unblocks_the_redelivery() {
    const BOUND: usize = 0xFFFF;
    let lane: Lane<common::Tick> = Lane::standalone(SinkName::new("t").unwrap(), 2).unwrap();
    let mut producer = lane.producer().unwrap();
    producer.try_publish(common::Tick(1)).unwrap();
    let mut kept = Vec::with_capacity(BOUND);
    for k in 0..BOUND {
        let run = lane.reattach().try_recv_run(8).unwrap();
        assert_eq!((run.len(), run.attempt()), (1, k as u32 + 1));
        kept.push(run);
    }
    let mut consumer = lane.reattach();
    producer.try_publish(common::Tick(2)).unwrap();
    assert_eq!(consumer.try_recv_run(8).unwrap_err(), TryRecvError::Empty, "at the bound");
    assert_eq!(lane.stats().released, 1);
    drop(kept.swap_remove(0)); // the plain run, stale since the second re-attach
    let again = consumer.try_recv_run(8).unwrap();
    // The attempt saturates at 65,535 (L6).
    assert_eq!((again.get(0), again.attempt()), (Some(&common::Tick(1)), 0xFFFF));
    again.ack().unwrap();
    assert_eq!(lane.stats().pinned, 1);
    assert!(kept.iter().all(|r| r.get(0) == Some(&common::Tick(1))), "a stale run reads another item");
    drop(kept);
    assert_eq!(lane.stats().pinned, 0);
    let last = consumer.try_recv_run(8).unwrap();
    assert_eq!((last.get(0), last.attempt()), (Some(&common::Tick(2)), 1));
    last.ack().unwrap();
    assert!(lane.is_idle());
}

/// L8, L6, M3 with re-attaches racing the receive steps: three threads take the lane from each
/// other (`reattach`, or `attach` after a drop) while receiving plain and non-plain runs, acking
/// them there, or handing them to a fourth thread that acks, acks in part or releases them
/// later (stale or not). Afterwards each item's deliveries carry the attempts 1, 2, ..., k
/// exactly once each (no duplicate, no skipped delivery), no item landed twice, every item is
/// acked, and every item is dropped exactly once; statistics read meanwhile stay consistent.
#[test]
fn l8_l6_m3_reattaches_racing_receive_steps_and_plain_acks_deliver_each_attempt_once() {
    within(60, "re-attach tug of war", || {
        let mut redelivered = 0;
        for round in 0..12u64 {
            let capacity = [1usize, 3, 8, 64][round as usize % 4];
            redelivered += tug_of_war(round, capacity, 2_000);
        }
        assert!(redelivered > 1_000, "the threads took the lane from each other: {redelivered}");
    });
}

/// One round of the tug of war; returns the lane's redeliveries.
fn tug_of_war(seed: u64, capacity: usize, n: usize) -> u64 {
    let lane = counted_lane(capacity);
    let drops = counters(n);
    let attempts: Arc<Mutex<Vec<Vec<u32>>>> = Arc::new(Mutex::new(vec![Vec::new(); n]));
    let landed: Arc<Vec<AtomicUsize>> = counters(n);
    let pool: Arc<Mutex<Vec<Run<Counted>>>> = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicBool::new(false));
    let mut producer = lane.producer().unwrap();
    let publisher = {
        let drops = drops.clone();
        thread::spawn(move || {
            for id in 0..n {
                producer.publish(Counted::new(id, &drops)).unwrap();
            }
            producer
        })
    };
    // Ends a run one way or another; records what landed for sure.
    fn end_run(mut run: Run<Counted>, rng: &mut StdRng, landed: &[AtomicUsize]) -> Option<Run<Counted>> {
        let seqs = run.sequences();
        for (c, seq) in run.iter().zip(seqs.clone()) {
            assert_eq!(c.id as u64, seq, "a run reads another item");
        }
        let mark = |r: std::ops::Range<u64>| {
            r.for_each(|s| {
                assert_eq!(landed[s as usize].fetch_add(1, Ordering::SeqCst), 0, "item {s} landed twice")
            })
        };
        match rng.gen_range(0..10) {
            0..=5 => {
                if run.ack().is_ok() {
                    mark(seqs);
                }
                None
            }
            6..=7 => {
                let k = rng.gen_range(1..=seqs.end - seqs.start);
                if run.ack_through(seqs.start + k - 1) == Ok(k as usize) {
                    mark(seqs.start..seqs.start + k);
                }
                (!run.is_empty()).then_some(run)
            }
            _ => {
                run.nack();
                None
            }
        }
    }
    let mut threads = Vec::new();
    for t in 0..3u64 {
        let (lane, attempts, landed, pool, done) =
            (lane.clone(), attempts.clone(), landed.clone(), pool.clone(), done.clone());
        threads.push(thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(seed * 10 + t);
            let mut c: Option<Consumer<Counted>> = None;
            while !done.load(Ordering::SeqCst) {
                if c.is_none() || rng.gen_range(0..30) == 0 {
                    c = if rng.gen_bool(0.7) {
                        Some(lane.reattach())
                    } else {
                        drop(c.take());
                        lane.attach().ok()
                    };
                    continue;
                }
                let consumer = c.as_mut().unwrap();
                match consumer.try_recv_run(rng.gen_range(1..=6)) {
                    Ok(run) => {
                        {
                            let mut a = attempts.lock().unwrap();
                            for seq in run.sequences() {
                                a[seq as usize].push(run.attempt());
                            }
                        }
                        if rng.gen_bool(0.4) {
                            pool.lock().unwrap().push(run);
                        } else if let Some(rest) = end_run(run, &mut rng, &landed) {
                            pool.lock().unwrap().push(rest);
                        }
                    }
                    Err(TryRecvError::Detached) => c = None,
                    Err(_) => thread::yield_now(),
                }
            }
        }));
    }
    {
        // Statistics read lock-free while plain runs jump the acked prefix: consistent, and
        // the acked position and the acked count never go back.
        let (lane, done) = (lane.clone(), done.clone());
        threads.push(thread::spawn(move || {
            let (mut last_acked, mut last_items) = (None, 0);
            while !done.load(Ordering::SeqCst) {
                // (`stats` subtracts its counters: an inconsistent read panics there in debug.)
                let st = lane.stats();
                assert!(st.acked_items <= st.published && st.pinned <= st.acked_items, "{st:?}");
                assert!(st.acked_items >= last_items, "the acked count went back: {st:?}");
                assert!(st.acked >= last_acked, "the acked position went back: {st:?}");
                (last_acked, last_items) = (st.acked, st.acked_items);
                thread::yield_now();
            }
        }));
    }
    {
        let (landed, pool, done) = (landed.clone(), pool.clone(), done.clone());
        threads.push(thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(seed * 10 + 9);
            while !done.load(Ordering::SeqCst) {
                let run = {
                    let mut p = pool.lock().unwrap();
                    let len = p.len();
                    (len > 0).then(|| p.swap_remove(rng.gen_range(0..len)))
                };
                match run {
                    Some(run) => {
                        if let Some(rest) = end_run(run, &mut rng, &landed) {
                            pool.lock().unwrap().push(rest);
                        }
                    }
                    None => thread::yield_now(),
                }
            }
        }));
    }
    while lane.stats().acked_items < n as u64 {
        thread::sleep(Duration::from_millis(1));
    }
    done.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    let producer = publisher.join().unwrap();
    pool.lock().unwrap().clear();
    let st = lane.stats();
    assert_eq!(
        (st.acked_items, st.published, st.pinned, st.released),
        (n as u64, n as u64, 0, 0),
        "seed {seed}"
    );
    assert_eq!(lane.acked(), Some(Position(n as u64)));
    for (seq, a) in attempts.lock().unwrap().iter_mut().enumerate() {
        a.sort_unstable();
        let want: Vec<u32> = (1..=a.len() as u32).collect();
        assert_eq!(*a, want, "item {seq}: attempts of its deliveries (capacity {capacity})");
        assert!(landed[seq].load(Ordering::SeqCst) <= 1);
    }
    assert_eq!(st.delivered, attempts.lock().unwrap().iter().map(|a| a.len() as u64).sum::<u64>());

    drop((producer, lane));
    for (id, d) in drops.iter().enumerate() {
        assert_eq!(d.load(Ordering::SeqCst), 1, "M3: item {id} (capacity {capacity})");
    }
    st.redelivered
}

/// L8 and W1 over a fan-out with gaps: on lane a, plain runs end at gaps (items for lane b
/// only); a run's cumulative acks race a re-attach of lane a; every lane-a item lands xor comes
/// back once, the gaps are passed, and the watermark ends at the last position on both lanes.
#[test]
fn l8_w1_plain_runs_between_gaps_racing_a_reattach_land_xor_are_redelivered() {
    within(30, "plain runs between gaps racing re-attach", || {
        let mut rng = StdRng::seed_from_u64(23);
        for round in 0..300u64 {
            let s = stream(8, &["a", "b"]);
            let mut f = s.fanout().unwrap();
            let mut for_a = Vec::new();
            for p in 1..=8u64 {
                if rng.gen_bool(0.3) {
                    f.try_publish_to(1, batch(p)).unwrap();
                } else {
                    f.try_publish(batch(p)).unwrap();
                    for_a.push(p);
                }
            }
            let lane_a = s.lane("a").unwrap();
            let mut old = lane_a.attach().unwrap();
            let mut runs = Vec::new();
            while let Ok(r) = old.try_recv_run(8) {
                runs.push(r);
            }
            let got: Vec<u64> = runs.iter().flat_map(run_positions).collect();
            assert_eq!(got, for_a, "round {round}: lane a's items, gaps passed");
            let spin = rng.gen_range(0..300);
            let acker = thread::spawn(move || {
                let mut landed = Vec::new();
                for mut run in runs {
                    while !run.is_empty() {
                        let next = run_positions(&run)[0];
                        match run.ack_through_position(Position(next)) {
                            Ok(1) => landed.push(next),
                            Ok(k) => panic!("acked {k} items through one position"),
                            Err(_) => {
                                drop(run);
                                break;
                            }
                        }
                    }
                }
                landed
            });
            for _ in 0..spin {
                std::hint::spin_loop();
            }
            let mut new = lane_a.reattach();
            let landed = acker.join().unwrap();
            let mut redelivered = Vec::new();
            while let Ok(r) = new.try_recv_run(8) {
                assert_eq!(r.attempt(), 2, "round {round}");
                redelivered.extend(run_positions(&r));
                r.ack().unwrap();
            }
            let mut all: Vec<u64> = landed.iter().chain(&redelivered).copied().collect();
            all.sort_unstable();
            assert_eq!(all, for_a, "round {round}: landed {landed:?}, redelivered {redelivered:?}");
            let mut b = s.attach("b").unwrap();
            while let Ok(r) = b.try_recv_run(8) {
                r.ack().unwrap();
            }
            assert_eq!(s.watermark(), Some(Position(8)), "round {round}");
            assert!(s.is_idle(), "round {round}");
        }
    });
}
