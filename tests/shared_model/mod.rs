//! The reference model of a stream's one array of cells as its lanes and its one `Fanout` see it,
//! and the harness that applies random operations to a stream and to the model and compares them
//! after every step ([`shared_ops`]).
//!
//! Shared, by path, by `tests/lanes/shared_ring.rs` (its proptest, and the canaries of its other
//! tests), `tests/fuzz_corpus_replay.rs` and the cargo-fuzz target
//! `fuzz/fuzz_targets/shared_ring_ops.rs` ([`run_bytes`]), so the property test, the fuzzer and
//! the corpus replay run exactly the same logic.
//!
//! Items carry a canary: one envelope whose document is a [`Bytes::from_owner`] over a
//! [`Canary`] that counts its drops in a [`Tracker`] (and panics when dropped, if told to). The
//! harness never keeps a clone of a published item, so the canary drops exactly when the stream's
//! last copy does: the count is the item's drop count ([M3]), and a handle that reads an item
//! whose count is not 0 read it after it was dropped.
//!
//! [M3]: lanestream::contract#m3
#![allow(dead_code)]

use lanestream::prelude::*;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use arbitrary::{Arbitrary, Unstructured};
use bytes::Bytes;
use lanestream::{
    AckError, Batch, Envelope, IndexName, LaneItem, MemoryStream, Op, Position, PublishError, Run, Stream,
    TryRecvError, MAX_RUN,
};

/// The capacities a scenario may pick: powers of two and not (the contract's hazards: 1, 2, 3, 5).
pub const CAPACITIES: [usize; 4] = [1, 2, 3, 5];
/// At most this many lanes.
pub const MAX_LANES: usize = 3;
/// At most this many operations per scenario (as the proptest: `1..100`).
pub const MAX_OPS: usize = 99;

// ----- canaries -----------------------------------------------------------------------------------

/// Per position: how many times its canary was dropped, and whether it panics when dropped.
pub struct Tracker {
    /// Per position, its canary's drop count (a test may reset it to 0 after dropping an item
    /// itself).
    pub drops: Vec<AtomicUsize>,
    panics: Vec<AtomicBool>,
}

impl Tracker {
    /// Positions `0..n`.
    pub fn new(n: usize) -> Arc<Tracker> {
        Arc::new(Tracker {
            drops: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            panics: (0..n).map(|_| AtomicBool::new(false)).collect(),
        })
    }

    pub fn drops(&self, p: u64) -> usize {
        self.drops[p as usize].load(Ordering::SeqCst)
    }

    /// Positions in `range` whose drop count is not `want`.
    pub fn not_dropped(&self, range: std::ops::RangeInclusive<u64>, want: usize) -> Vec<(u64, usize)> {
        range.map(|p| (p, self.drops(p))).filter(|&(_, d)| d != want).collect()
    }

    pub fn set_panics(&self, p: u64) {
        self.panics[p as usize].store(true, Ordering::SeqCst);
    }

    /// A batch at position `p` whose one envelope's document is canary `p`.
    pub fn item(self: &Arc<Tracker>, p: u64) -> LaneItem {
        self.item_at(p, p)
    }

    /// A batch at position `p` whose one envelope (id `id`) has canary `id` as its document.
    pub fn item_at(self: &Arc<Tracker>, id: u64, p: u64) -> LaneItem {
        let canary = Canary { p: id, text: format!("canary-{id}-{p}").into_bytes(), tracker: self.clone() };
        let envelope = Envelope {
            index: IndexName::new("docs").unwrap(),
            id: id.to_string(),
            op: Op::Upsert,
            position: Some(Position(p)),
            document: Bytes::from_owner(canary),
            built_at_micros: None,
            relation: None,
            old_id: None,
            unchanged: Vec::new(),
        };
        LaneItem::Batch(Batch::new(Some(Position(p)), vec![envelope].into()))
    }
}

/// The document of one item: counts its drop, panics if its tracker says so.
pub struct Canary {
    p: u64,
    text: Vec<u8>,
    tracker: Arc<Tracker>,
}

impl AsRef<[u8]> for Canary {
    fn as_ref(&self) -> &[u8] {
        &self.text
    }
}

impl Drop for Canary {
    fn drop(&mut self) {
        self.tracker.drops[self.p as usize].fetch_add(1, Ordering::SeqCst);
        if self.tracker.panics[self.p as usize].load(Ordering::SeqCst) {
            panic!("canary {} panics in Drop (on purpose)", self.p);
        }
    }
}

/// Reads `item` as a live handle sees it: its position, and its canary's id, text and drop
/// count (all must say the item is alive and whole). Returns the position.
pub fn read_alive(tracker: &Tracker, item: &LaneItem) -> u64 {
    let p = item.position().expect("a positioned item").0;
    let LaneItem::Batch(b) = item else { panic!("not a batch") };
    assert_eq!(b.envelopes.len(), 1, "item {p}: envelopes");
    let id: u64 = b.envelopes[0].id.parse().expect("a canary id");
    assert_eq!(&b.envelopes[0].document[..], format!("canary-{id}-{p}").as_bytes(), "item {p}: document");
    assert_eq!(b.envelopes[0].position, Some(Position(p)), "item {p}: envelope position");
    assert_eq!(
        tracker.drops(id),
        0,
        "item {p} (canary {id}) read through a live handle after it was dropped"
    );
    p
}

/// A stream of `capacity` cells read by the lanes of `sinks`.
pub fn shared(capacity: usize, sinks: &[&str]) -> MemoryStream {
    MemoryStream::builder().capacity(capacity).sinks(sinks.iter().copied()).build().unwrap()
}

// ----- the model ------------------------------------------------------------------------------------
//
// One sink lane as the model sees it.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MState {
    Queued,
    /// Another lane's item (`Fanout::try_publish_to`): passed (acked) by this lane's next
    /// receive step that reaches it, never delivered.
    Gap,
    Delivered(u32),
    Released,
    Acked,
}

#[derive(Clone, Debug)]
pub struct MItem {
    pub position: u64,
    pub state: MState,
    pub attempts: u32,
}

/// A model lane: every item published, by sequence (small runs: nothing is forgotten).
#[derive(Default, Debug)]
pub struct MLane {
    pub items: Vec<MItem>,
    pub next: usize,
    pub generation: u32,
    pub closed: bool,
}

impl MLane {
    /// A run of up to `max` items: the lowest released alone, else (past the gaps at the
    /// front, which the step acks) queued items up to the next gap.
    pub fn take_run(&mut self, max: usize) -> Option<(Vec<(usize, u32)>, u32)> {
        self.generation += 1;
        let g = self.generation;
        if let Some(i) = self.items.iter().position(|it| it.state == MState::Released) {
            let it = &mut self.items[i];
            it.state = MState::Delivered(g);
            it.attempts += 1;
            return Some((vec![(i, g)], it.attempts));
        }
        while self.next < self.items.len() && self.items[self.next].state == MState::Gap {
            self.items[self.next].state = MState::Acked;
            self.next += 1;
        }
        let mut end = self.items.len().min(self.next + max.clamp(1, MAX_RUN));
        if let Some(gap) = (self.next..end).find(|&i| self.items[i].state == MState::Gap) {
            end = gap;
        }
        if end == self.next {
            return None;
        }
        let run = (self.next..end)
            .map(|i| {
                self.items[i].state = MState::Delivered(g);
                self.items[i].attempts = 1;
                (i, g)
            })
            .collect();
        self.next = end;
        Some((run, 1))
    }

    pub fn ack(&mut self, i: usize, g: u32) -> bool {
        let landed = self.items[i].state == MState::Delivered(g);
        if landed {
            self.items[i].state = MState::Acked;
        }
        landed
    }

    /// Acks every `(sequence, generation)` of a run in the model, recording each landed item's
    /// position in `landed` (an item landing twice fails the test); whether any was refused (a
    /// stale generation: the engine must refuse the run's ack too).
    pub fn ack_all(
        &mut self,
        items: impl IntoIterator<Item = (usize, u32)>,
        landed: &mut std::collections::BTreeSet<u64>,
    ) -> bool {
        let mut any_refused = false;
        for (i, g) in items {
            if self.ack(i, g) {
                assert!(landed.insert(self.items[i].position), "acked twice");
            } else {
                any_refused = true;
            }
        }
        any_refused
    }

    pub fn release(&mut self, i: usize, g: u32) {
        if self.items[i].state == MState::Delivered(g) {
            self.items[i].state = MState::Released;
        }
    }

    pub fn reattach(&mut self) {
        for it in &mut self.items {
            if matches!(it.state, MState::Delivered(_)) {
                it.state = MState::Released;
            }
        }
    }

    pub fn acked(&self) -> Option<u64> {
        self.items.iter().take_while(|it| it.state == MState::Acked).map(|it| it.position).last()
    }

    pub fn unacked(&self) -> usize {
        self.items.iter().filter(|it| it.state != MState::Acked).count()
    }
}

/// One step of a scenario. The `u8`s pick a lane, a held handle or a count, modulo what exists;
/// `Publish(k)` publishes a run of `k` items (the proptest strategy and [`Scenario::ops`] keep
/// `k` in `1..=6`), `RecvRun(l, max)` receives a run of up to `max` (clamped to `1..=MAX_RUN`,
/// as the consumer does).
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum SOp {
    Publish(u8),
    PublishOne,
    PublishTo(u8),
    RecvRun(u8, u8),
    Recv(u8),
    AckThrough(u8, u8),
    AckRun(u8),
    NackRun(u8),
    AckSingle(u8),
    NackSingle(u8),
    Reattach(u8),
    DropAndAttach(u8),
    CloseLane(u8),
    /// Reads `MemoryStream::memory` (checked after every step too): the items published and
    /// not dropped yet.
    Memory,
    NewFanout,
    /// `Fanout::close`: every lane at once (L10).
    Close,
}

struct HeldRun {
    lane: usize,
    run: Run<LaneItem>,
    /// The model's (item, generation) of each outstanding item, front first.
    items: std::collections::VecDeque<(usize, u32)>,
}

struct HeldOne {
    lane: usize,
    d: lanestream::Delivery<LaneItem>,
    item: (usize, u32),
}

/// Items of lane `lane` whose slots are emptied: the acked prefix no live handle (current or
/// stale) reads.
fn freed(m: &MLane, lane: usize, runs: &[HeldRun], singles: &[HeldOne]) -> usize {
    let holders = |i: usize| {
        runs.iter().filter(|r| r.lane == lane && r.items.iter().any(|&(j, _)| j == i)).count()
            + singles.iter().filter(|d| d.lane == lane && d.item.0 == i).count()
    };
    m.items.iter().enumerate().take_while(|&(i, it)| it.state == MState::Acked && holders(i) == 0).count()
}

/// Random sequences of fan-out publishes (runs, single items, and single items for one lane with
/// `try_publish_to`, a gap for the other lanes), runs and single receives,
/// cumulative and whole-run acks (seat-held or not), nacks, drops, re-attaches, drops followed
/// by an attach, closes of one lane or of every lane (the fan-out's close), memory reads and fan-out replacements, over 1 to 3 lanes
/// reading an array of 1, 2, 3 or 5 cells; after every step the stream is compared with a naive
/// model: what is delivered (item, attempt, run length), which acks land, the room (the slowest
/// lane's, stale handles included), the watermark and each lane's acked position and counters,
/// idleness, the items held (`memory()`), and the exact drop count of every item (an item is
/// dropped by the fan-out's first publish that is not refused as closed after every lane freed
/// it, or by the fan-out's drop, and never while a handle reads it: every held handle reads its
/// item after every step). A gap is passed (acked, not delivered) by its lane's next receive step that reaches it,
/// ends a run, keeps the lane from idle and its consumer from empty until then. In the end every
/// item was acked exactly once on every lane it was for, every lane's acked position is the last
/// position (gaps included), and every item was dropped exactly once.
pub fn shared_ops(lanes_n: usize, cap: usize, ops: &[SOp]) {
    let names = ["a", "b", "c"];
    let t = Tracker::new(1 + ops.len() * 7);
    let s = shared(cap, &names[..lanes_n]);
    let lanes: Vec<_> = s.lanes().collect();
    let mut consumers: Vec<_> = lanes.iter().map(|l| l.attach().unwrap()).collect();
    let mut fanout = Some(s.fanout().unwrap());
    let mut model: Vec<MLane> = (0..lanes_n).map(|_| MLane::default()).collect();
    // The canary id of each published item, by sequence; the first sequence not dropped.
    let mut ids: Vec<u64> = Vec::new();
    let mut reclaimed = 0usize;
    let mut next_id = 1u64;
    let mut runs: Vec<HeldRun> = Vec::new();
    let mut singles: Vec<HeldOne> = Vec::new();
    let mut last_pos = 0u64;
    let mut landed = vec![BTreeSet::new(); lanes_n];
    // Per lane, the positions published to it as gaps (another lane's items).
    let mut gaps = vec![BTreeSet::new(); lanes_n];
    let mut last_watermark = None;
    for &op in ops {
        match op {
            SOp::Publish(_) | SOp::PublishOne | SOp::PublishTo(_) => {
                let k = if let SOp::Publish(k) = op { usize::from(k) } else { 1 };
                let to = if let SOp::PublishTo(l) = op { Some(usize::from(l) % lanes_n) } else { None };
                let mut items: Vec<LaneItem> =
                    (0..k as u64).map(|d| t.item_at(next_id + d, last_pos + 1 + d)).collect();
                let first_id = next_id;
                next_id += k as u64;
                if !model.iter().any(|m| m.closed) {
                    // M3: the publish first drops every item every lane freed.
                    let end = (0..lanes_n).map(|l| freed(&model[l], l, &runs, &singles)).min().unwrap();
                    reclaimed = reclaimed.max(end);
                }
                let room = (0..lanes_n)
                    .map(|l| cap - (model[l].items.len() - freed(&model[l], l, &runs, &singles)))
                    .min()
                    .unwrap();
                let f = fanout.as_mut().unwrap();
                let n = if let SOp::Publish(_) = op {
                    let r = f.try_publish_run(&mut items);
                    let n = if model.iter().any(|m| m.closed) {
                        assert_eq!(r, Err(PublishError::Closed(0)));
                        0
                    } else if room == 0 {
                        assert_eq!(r, Err(PublishError::Full(0)));
                        0
                    } else {
                        assert_eq!(r, Ok(room.min(k)));
                        room.min(k)
                    };
                    assert_eq!(items.len(), k - n, "the published prefix moved out, the rest handed back");
                    n
                } else {
                    let r = match to {
                        Some(l) => f.try_publish_to(l, items[0].clone()),
                        None => f.try_publish(items[0].clone()),
                    };
                    if model.iter().any(|m| m.closed) {
                        assert!(matches!(r, Err(PublishError::Closed(_))), "{r:?}");
                        0
                    } else if room == 0 {
                        assert!(matches!(r, Err(PublishError::Full(_))), "{r:?}");
                        0
                    } else {
                        assert!(r.is_ok(), "{r:?}");
                        1
                    }
                };
                drop(items);
                for j in 0..k as u64 {
                    let want = usize::from(j >= n as u64);
                    assert_eq!(t.drops(first_id + j), want, "publish {op:?}: item {j} of the call");
                }
                for j in 0..n as u64 {
                    ids.push(first_id + j);
                    for (l, m) in model.iter_mut().enumerate() {
                        let state = if to.is_some_and(|to| to != l) { MState::Gap } else { MState::Queued };
                        m.items.push(MItem { position: last_pos + 1 + j, state, attempts: 0 });
                    }
                }
                if let (Some(to), 1) = (to, n) {
                    (0..lanes_n).filter(|&l| l != to).for_each(|l| {
                        gaps[l].insert(last_pos + 1);
                    });
                }
                last_pos += n as u64;
            }
            SOp::RecvRun(l, _) | SOp::Recv(l) => {
                let l = usize::from(l) % lanes_n;
                let single = matches!(op, SOp::Recv(_));
                let max = if let SOp::RecvRun(_, m) = op { usize::from(m) } else { 1 };
                let taken = model[l].take_run(max);
                if single {
                    let r = consumers[l].try_recv();
                    match taken {
                        Some((items, attempt)) => {
                            let d = r.expect("the model delivers an item");
                            assert_eq!(read_alive(&t, &d), model[l].items[items[0].0].position);
                            assert_eq!(d.attempt(), attempt);
                            singles.push(HeldOne { lane: l, d, item: items[0] });
                        }
                        None => {
                            let want =
                                if model[l].closed { TryRecvError::Closed } else { TryRecvError::Empty };
                            assert_eq!(r.map(|d| read_alive(&t, &d)).unwrap_err(), want);
                        }
                    }
                } else {
                    let r = consumers[l].try_recv_run(max);
                    match taken {
                        Some((items, attempt)) => {
                            let run = r.expect("the model delivers a run");
                            assert_eq!((run.len(), run.attempt()), (items.len(), attempt));
                            let got: Vec<u64> = run.iter().map(|it| read_alive(&t, it)).collect();
                            let want: Vec<u64> =
                                items.iter().map(|&(i, _)| model[l].items[i].position).collect();
                            assert_eq!(got, want);
                            runs.push(HeldRun { lane: l, run, items: items.into() });
                        }
                        None => {
                            let want =
                                if model[l].closed { TryRecvError::Closed } else { TryRecvError::Empty };
                            assert_eq!(r.map(|r| run_positions(&r)).unwrap_err(), want);
                        }
                    }
                }
            }
            SOp::AckThrough(h, k) if !runs.is_empty() => {
                let h = usize::from(h) % runs.len();
                let held = &mut runs[h];
                let n = 1 + usize::from(k) % held.items.len();
                let seq = held.run.sequences().start + n as u64 - 1;
                let any_refused = model[held.lane].ack_all(held.items.drain(..n), &mut landed[held.lane]);
                let r = held.run.ack_through(seq);
                if any_refused {
                    assert_eq!(r, Err(AckError::Detached));
                } else {
                    assert_eq!(r, Ok(n));
                }
                if held.items.is_empty() {
                    assert!(held.run.is_empty());
                    runs.swap_remove(h);
                }
            }
            SOp::AckRun(h) if !runs.is_empty() => {
                let held = runs.swap_remove(usize::from(h) % runs.len());
                let any_refused =
                    model[held.lane].ack_all(held.items.iter().copied(), &mut landed[held.lane]);
                assert_eq!(held.run.ack().is_err(), any_refused);
            }
            SOp::NackRun(h) if !runs.is_empty() => {
                let held = runs.swap_remove(usize::from(h) % runs.len());
                for &(i, g) in &held.items {
                    model[held.lane].release(i, g);
                }
                held.run.nack();
            }
            SOp::AckSingle(h) if !singles.is_empty() => {
                let held = singles.swap_remove(usize::from(h) % singles.len());
                let m = &mut model[held.lane];
                let ok = m.ack(held.item.0, held.item.1);
                if ok {
                    assert!(landed[held.lane].insert(m.items[held.item.0].position), "acked twice");
                }
                assert_eq!(held.d.ack().is_ok(), ok);
            }
            SOp::NackSingle(h) if !singles.is_empty() => {
                let held = singles.swap_remove(usize::from(h) % singles.len());
                model[held.lane].release(held.item.0, held.item.1);
                held.d.nack();
            }
            SOp::Reattach(l) => {
                let l = usize::from(l) % lanes_n;
                consumers[l] = lanes[l].reattach();
                model[l].reattach();
            }
            SOp::DropAndAttach(l) => {
                let l = usize::from(l) % lanes_n;
                // The polite hand-over: drop the consumer, attach at once (L8: its deliveries are
                // taken back as by a re-attach).
                drop(consumers.remove(l));
                consumers.insert(l, lanes[l].attach().expect("nobody is attached"));
                model[l].reattach();
            }
            SOp::CloseLane(l) => {
                let l = usize::from(l) % lanes_n;
                lanes[l].close();
                model[l].closed = true;
            }
            SOp::Memory => {}
            SOp::Close => {
                fanout.as_ref().expect("a fan-out is always held between steps").close();
                for m in &mut model {
                    m.closed = true;
                }
            }
            SOp::NewFanout => {
                drop(fanout.take());
                fanout = Some(s.fanout().expect("the fan-out gave the stream back"));
                // M3: the dropped fan-out dropped every item every lane freed.
                let end = (0..lanes_n).map(|l| freed(&model[l], l, &runs, &singles)).min().unwrap();
                reclaimed = reclaimed.max(end);
            }
            _ => {}
        }
        // Drops: exactly the items below `reclaimed`, once; the rest held.
        for (seq, &id) in ids.iter().enumerate() {
            assert_eq!(t.drops(id), usize::from(seq < reclaimed), "item {seq} (canary {id}) after {op:?}");
        }
        let memory = s.memory();
        assert_eq!(memory.held_items as usize, ids.len() - reclaimed, "items held after {op:?}");
        assert_eq!((memory.held_bytes, memory.budget), (0, None), "no budget");
        // Every held handle, stale or not, still reads its own item.
        for held in &runs {
            let got: Vec<u64> = held.run.iter().map(|it| read_alive(&t, it)).collect();
            let want: Vec<u64> =
                held.items.iter().map(|&(i, _)| model[held.lane].items[i].position).collect();
            assert_eq!(got, want, "a held run after {op:?}");
        }
        for held in &singles {
            assert_eq!(read_alive(&t, &held.d), model[held.lane].items[held.item.0].position);
        }
        let want =
            model.iter().map(MLane::acked).collect::<Option<Vec<_>>>().and_then(|v| v.into_iter().min());
        let w = s.watermark();
        assert_eq!(w.map(|p| p.0), want, "watermark after {op:?}");
        assert!(w >= last_watermark, "W3");
        last_watermark = w;
        for (l, m) in model.iter().enumerate() {
            assert_eq!(lanes[l].acked().map(|p| p.0), m.acked(), "lane {l} acked after {op:?}");
            let stats = lanes[l].stats();
            let released = m.items.iter().filter(|i| i.state == MState::Released).count();
            let acked_items = m.items.iter().take_while(|i| i.state == MState::Acked).count();
            let free = freed(m, l, &runs, &singles);
            assert_eq!(stats.released as usize, released, "lane {l} released after {op:?}");
            assert_eq!(stats.queued as usize, m.items.len() - m.next, "lane {l} queued after {op:?}");
            assert_eq!(stats.acked_items as usize, acked_items, "lane {l} acked_items after {op:?}");
            assert_eq!(
                stats.in_flight as usize,
                m.next - acked_items - released,
                "lane {l} in_flight after {op:?}"
            );
            assert_eq!(stats.pinned as usize, acked_items - free, "lane {l} pinned after {op:?}");
            assert_eq!(stats.closed, m.closed);
            assert_eq!(consumers[l].is_empty(), released == 0 && m.next == m.items.len(), "lane {l} L11");
        }
        assert_eq!(s.is_idle(), model.iter().all(|m| m.unacked() == 0), "W5 after {op:?}");
    }
    // Drain: give everything back and receive until every item is acked.
    drop(runs);
    drop(singles);
    for (l, c) in consumers.iter_mut().enumerate() {
        while let Ok(run) = c.try_recv_run(MAX_RUN) {
            for p in run.iter().map(|it| read_alive(&t, it)) {
                assert!(landed[l].insert(p), "lane {l}: item {p} delivered again after it was acked");
            }
            run.ack().unwrap();
        }
    }
    for (l, got) in landed.iter().enumerate() {
        let want: Vec<u64> = (1..=last_pos).filter(|p| !gaps[l].contains(p)).collect();
        assert_eq!(got.iter().copied().collect::<Vec<_>>(), want, "lane {l}");
    }
    // Every lane's receive steps passed its gaps: idle, and the acked position is the last one.
    assert!(s.is_idle());
    if last_pos > 0 {
        assert_eq!(s.watermark(), Some(Position(last_pos)));
    }
    drop(fanout);
    // The fan-out's drop dropped every item: every lane acked every item.
    assert_eq!(t.not_dropped(1..=next_id - 1, 1), vec![], "after the fan-out's drop");
    drop((consumers, lanes, s));
}

/// The positions of a run's items, in order (panics on an unpositioned item).
fn run_positions(run: &Run<LaneItem>) -> Vec<u64> {
    run.iter().map(|item| item.position().expect("a positioned item").0).collect()
}

/// A scenario built by `arbitrary` from the fuzzer's bytes: the lane count, the capacity and the
/// operations, each brought into the ranges the proptest strategy draws from (see the getters).
#[derive(Arbitrary, Debug)]
pub struct Scenario {
    lanes: u8,
    capacity: u8,
    ops: Vec<SOp>,
}

impl Scenario {
    /// `1..=MAX_LANES` lanes.
    pub fn lane_count(&self) -> usize {
        1 + usize::from(self.lanes) % MAX_LANES
    }

    /// One of [`CAPACITIES`].
    pub fn capacity(&self) -> usize {
        CAPACITIES[usize::from(self.capacity) % CAPACITIES.len()]
    }

    /// The first [`MAX_OPS`] operations, a `Publish(k)` with `k` in `1..=6` as in the proptest
    /// (`k % 6 + 1`). `RecvRun`'s `max` keeps its whole `u8` range (the proptest's `1..10` is a
    /// part of it): the consumer clamps it to `1..=MAX_RUN` and so does the model.
    pub fn ops(&self) -> Vec<SOp> {
        self.ops
            .iter()
            .take(MAX_OPS)
            .map(|&op| match op {
                SOp::Publish(k) => SOp::Publish(k % 6 + 1),
                op => op,
            })
            .collect()
    }
}

/// The `shared_ring_ops` fuzz target: bytes -> [`Scenario`] (via `arbitrary`) -> [`shared_ops`].
/// Bytes too short for a scenario, or with no operation, run nothing.
pub fn run_bytes(data: &[u8]) {
    if let Ok(scenario) = Scenario::arbitrary_take_rest(Unstructured::new(data)) {
        let ops = scenario.ops();
        if !ops.is_empty() {
            shared_ops(scenario.lane_count(), scenario.capacity(), &ops);
        }
    }
}
