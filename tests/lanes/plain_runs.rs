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

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{batch, publish_range, run_positions, shared_envelopes, stream, tracked, within};
use lanestream::{
    AckError, Consumer, Delivery, Item, Lane, LaneItem, Position, Run, SinkName, Stream, TryPublishError,
    TryRecvError,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

// ----- an item that counts its drops ------------------------------------------------------------

/// An item with id `id` (position `id + 1`) that counts its drops in `drops[id]`.
#[derive(Debug)]
struct Counted {
    id: usize,
    drops: Arc<Vec<AtomicUsize>>,
}

impl Item for Counted {
    fn position(&self) -> Option<Position> {
        Some(Position(self.id as u64 + 1))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.drops[self.id].fetch_add(1, Ordering::SeqCst);
    }
}

fn counters(n: usize) -> Arc<Vec<AtomicUsize>> {
    Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect())
}

fn counted_lane(capacity: usize) -> Lane<Counted> {
    Lane::standalone(SinkName::new("plain").unwrap(), capacity).unwrap()
}

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
    Run(Run<Counted>, u64),
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
        let len = (self.published() - self.next).min(max);
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
                let r = producer.try_publish(Counted { id, drops: drops.clone() });
                log.push(format!("publish {id}"));
                match r {
                    Ok(()) => {
                        assert!(fits, "publish past the room: {}", ctx(&log));
                        m.items.push(ModelItem { st: St::Queued, deliveries: 0, stale: 0 });
                    }
                    Err(TryPublishError::Full(item)) => {
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
                            held.push(Held::Run(r, m.epoch));
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
                            0 => kept.take().unwrap().ack().map(|()| n_ack as usize),
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
                            r.nack()
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
    let want_pos = (acked > 0).then(|| Position(acked));
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
