//! The publisher copies items into their cells and the caller forgets its copies only once the
//! publish succeeded; reclaim passes store their progress once; plain runs scan for gaps only
//! past `gaps_end`; `RunIter` is computed at `iter()` time. Attacked here:
//!
//! - [M3], [L10]: a close or a panicking `Item::position` inside the publish (between admission
//!   and the cursor's compare-and-swap, through a hook the item calls), panicking drops in the
//!   middle of a reclaim pass, a drop panic whose payload panics too;
//! - [L2], [L4], [L5], [M3], [I1]: a seeded random walk on a standalone lane of [`Probe`] items
//!   (each with its own drop counter) against a simple reference (sequence -> item);
//! - [M4]: `try_publish_run` on a budgeted stream keeps the rest in the caller's `Vec`;
//! - [L2], [L8], [L10], [W1]: a fan-out publishing, `publish_to` (gaps) and `publish_run` on one
//!   thread, a closer racing it, and a consumer per lane receiving runs on its own thread.
//!
//! [`Probe`] items own no heap memory, so a double drop shows as a count of 2, not as corruption.

use crate::common;
use lanestream::prelude::*;

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use common::{batch, hunt};
use lanestream::{
    Consumer, Item, Lane, LaneItem, MemoryStream, Position, Producer, PublishError, Run, SinkName, Stream,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const IDS: usize = 1 << 20;
static NEXT_ID: AtomicUsize = AtomicUsize::new(0);
static DROPS: [AtomicU32; IDS] = [const { AtomicU32::new(0) }; IDS];
static CALLS: [AtomicU32; IDS] = [const { AtomicU32::new(0) }; IDS];

/// A hook `Probe::position` calls with the item's id and its call number (1 = first call).
type Hook = Box<dyn FnMut(u32, u32)>;

thread_local! {
    static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
}

fn hook(f: impl FnMut(u32, u32) + 'static) {
    HOOK.with(|h| *h.borrow_mut() = Some(Box::new(f)));
}

fn unhook() {
    HOOK.with(|h| *h.borrow_mut() = None);
}

/// How a probe's first drop behaves.
#[derive(Clone, Copy, PartialEq)]
enum OnDrop {
    Quiet,
    Panic,
    /// Panics with a payload whose own drop panics (once, the first time it is dropped).
    PanicWithBomb,
}

/// A payload that panics when dropped.
struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        if !thread::panicking() {
            panic!("the payload of a drop panic panics when dropped (on purpose)");
        }
    }
}

/// An item with a drop counter and a position-call counter (statics indexed by `id`).
#[derive(Debug)]
struct Probe {
    id: u32,
    position: Option<u64>,
    on_drop: u8,
}

impl Probe {
    fn new(position: Option<u64>) -> Probe {
        Probe::with(position, OnDrop::Quiet)
    }

    fn with(position: Option<u64>, on_drop: OnDrop) -> Probe {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed) as u32;
        assert!((id as usize) < IDS, "raise IDS");
        Probe { id, position, on_drop: on_drop as u8 }
    }
}

impl Item for Probe {
    fn position(&self) -> Option<Position> {
        let call = CALLS[self.id as usize].fetch_add(1, Ordering::SeqCst) + 1;
        HOOK.with(|h| {
            if let Some(f) = h.borrow_mut().as_mut() {
                f(self.id, call);
            }
        });
        self.position.map(Position)
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let before = DROPS[self.id as usize].fetch_add(1, Ordering::SeqCst);
        if before == 0 && self.on_drop == OnDrop::Panic as u8 {
            panic!("probe {} panics in Drop (on purpose)", self.id);
        }
        if before == 0 && self.on_drop == OnDrop::PanicWithBomb as u8 {
            std::panic::panic_any(Bomb);
        }
    }
}

fn drops(id: u32) -> u32 {
    DROPS[id as usize].load(Ordering::SeqCst)
}

fn ids(items: &[Probe]) -> Vec<u32> {
    items.iter().map(|p| p.id).collect()
}

fn probe_lane(capacity: usize) -> Lane<Probe> {
    Lane::standalone(SinkName::new("probe").unwrap(), capacity).unwrap()
}

/// A lane of `capacity` with its producer and a consumer.
fn probe_ends(capacity: usize) -> (Lane<Probe>, Producer<Probe>, Consumer<Probe>) {
    let lane = probe_lane(capacity);
    let (producer, consumer) = (lane.producer().unwrap(), lane.reattach());
    (lane, producer, consumer)
}

fn run_ids(run: &Run<Probe>) -> Vec<u32> {
    run.iter().map(|p| p.id).collect()
}

#[test]
fn l10_m3_a_close_inside_the_publish_hands_back_the_item_and_the_run_intact() {
    // A single item: its second `position` call is the push's, after admission.
    let (lane, mut producer, mut consumer) = probe_ends(8);
    let a = Probe::new(Some(1));
    let a_id = a.id;
    producer.try_publish(a).unwrap();
    let b = Probe::new(Some(2));
    let b_id = b.id;
    let closer = lane.clone();
    hook(move |id, call| {
        if id == b_id && call == 2 {
            closer.close();
        }
    });
    let back = match producer.try_publish(b) {
        Err(PublishError::Closed(back)) => back,
        other => panic!("expected Closed with the item, got {other:?}"),
    };
    unhook();
    assert_eq!((back.id, back.position, drops(b_id)), (b_id, Some(2), 0));
    let got = consumer.recv().unwrap().expect("the item published before the close");
    assert_eq!(got.item().id, a_id);
    got.ack().unwrap();
    assert!(consumer.recv().unwrap().is_none(), "closed and drained: the refused item never lands");
    assert_eq!(lane.stats().published, 1);
    drop(back);
    drop((producer, consumer, lane));
    assert_eq!((drops(a_id), drops(b_id)), (1, 1));

    // The blocking and async forms, through the one blocking body and the future's step.
    for form in 0..3 {
        let lane = probe_lane(2);
        let mut producer = lane.producer().unwrap();
        let b = Probe::new(Some(1));
        let (b_id, closer) = (b.id, lane.clone());
        hook(move |id, call| {
            if id == b_id && call == 2 {
                closer.close();
            }
        });
        let back = match form {
            0 => producer.publish(b).unwrap_err().into_inner(),
            1 => producer.publish_timeout(b, std::time::Duration::from_secs(5)).unwrap_err().into_inner(),
            _ => futures_executor::block_on(producer.publish_async(b)).unwrap_err().into_inner(),
        };
        unhook();
        assert_eq!((back.id, drops(b_id), lane.stats().published), (b_id, 0, 0), "form {form}");
        drop(back);
        drop((producer, lane));
        assert_eq!(drops(b_id), 1, "form {form}");
    }

    // A run, blocking: the first step publishes what fits (capacity 3), a helper acks it, and the
    // close lands inside the push of the step that goes next: item 3's first position call after
    // that step's reclaim dropped item 0 (steps refused with `Full` reclaim nothing).
    let (lane, mut producer, consumer) = probe_ends(3);
    let mut items: Vec<Probe> = (1..=5).map(|p| Probe::new(Some(p))).collect();
    let all = ids(&items);
    let acker = thread::spawn(move || {
        let mut consumer = consumer;
        let run = consumer.recv_run(64).unwrap().unwrap();
        let got = run_ids(&run);
        run.ack().unwrap();
        (consumer, got)
    });
    let closer = lane.clone();
    let (x0, x3) = (all[0], all[3]);
    hook(move |id, _| {
        if id == x3 && drops(x0) == 1 {
            closer.close();
        }
    });
    let err = producer.publish_run(&mut items).expect_err("closed inside the second step");
    unhook();
    assert_eq!(err.into_inner(), 3, "three published before the close");
    assert_eq!(ids(&items), all[3..], "the rest stays in the Vec, in order");
    let (mut consumer, got) = acker.join().unwrap();
    assert_eq!(got, all[..3]);
    assert!(consumer.recv_run(64).unwrap().is_none());
    assert!(all.iter().all(|&id| drops(id) == 0 || all[..3].contains(&id)));
    drop(items);
    drop((producer, consumer, lane));
    assert!(all.iter().all(|&id| drops(id) == 1), "each item dropped exactly once");
}

#[test]
fn m3_a_position_panic_inside_the_publish_leaves_the_item_or_the_run_with_the_caller() {
    let (lane, mut producer, mut consumer) = probe_ends(4);
    // A single item panicking in the push: it is the caller's, dropped once by the unwind.
    let b = Probe::new(Some(1));
    let b_id = b.id;
    hook(move |id, call| assert!(!(id == b_id && call == 2), "position panics in the push (on purpose)"));
    assert!(catch_unwind(AssertUnwindSafe(|| producer.try_publish(b))).is_err());
    assert_eq!(drops(b_id), 1);
    assert!(consumer.try_recv().is_err(), "nothing was published");
    // A run panicking in the push at its third item, then one panicking in admission at its
    // fourth: the Vec keeps every item, in order, and the abandoned cell copies never surface.
    let mut items: Vec<Probe> = (1..=6).map(|p| Probe::new(Some(p))).collect();
    let all = ids(&items);
    let (x2, x3) = (all[2], all[3]);
    hook(move |id, call| assert!(!(id == x2 && call == 2), "position panics in the push (on purpose)"));
    assert!(catch_unwind(AssertUnwindSafe(|| producer.try_publish_run(&mut items))).is_err());
    assert_eq!(ids(&items), all);
    hook(move |id, call| assert!(!(id == x3 && call == 2), "position panics in admission (on purpose)"));
    assert!(catch_unwind(AssertUnwindSafe(|| producer.try_publish_run(&mut items))).is_err());
    assert_eq!(ids(&items), all);
    unhook();
    assert!(all.iter().all(|&id| drops(id) == 0));
    assert_eq!(lane.stats().published, 0);
    // Now it goes: 4 fit, 2 stay.
    assert_eq!(producer.try_publish_run(&mut items).unwrap(), 4);
    assert_eq!(ids(&items), all[4..]);
    let mut run = consumer.try_recv_run(64).unwrap();
    assert_eq!((run_ids(&run), run.sequences()), (all[..4].to_vec(), 0..4));
    assert_eq!(run.ack_through(1).unwrap(), 2);
    assert_eq!(run_ids(&run), all[2..4], "the iterator reads only what is outstanding");
    run.ack().unwrap();
    assert_eq!(producer.try_publish_run(&mut items).unwrap(), 2);
    assert!(all[..4].iter().all(|&id| drops(id) == 1), "reclaimed by the publish after the acks");
    drop((producer, consumer, lane));
    assert!(all.iter().all(|&id| drops(id) == 1));
}

#[test]
fn m3_panicking_drops_in_a_reclaim_pass_surface_once_and_every_item_drops_once() {
    let (lane, mut producer, mut consumer) = probe_ends(8);
    let items: Vec<Probe> = (1..=7)
        .map(|p| Probe::with(Some(p), if p % 3 == 2 { OnDrop::Panic } else { OnDrop::Quiet }))
        .collect();
    let all = ids(&items);
    let mut items = items;
    assert_eq!(producer.try_publish_run(&mut items).unwrap(), 7);
    consumer.try_recv_run(64).unwrap().ack().unwrap();
    let next = Probe::new(Some(8));
    let next_id = next.id;
    let panic = catch_unwind(AssertUnwindSafe(|| producer.try_publish(next))).expect_err("a drop panicked");
    assert!(panic.downcast_ref::<String>().is_some_and(|m| m.contains("panics in Drop")));
    assert!(all.iter().all(|&id| drops(id) == 1), "every item of the pass dropped once");
    assert_eq!(drops(next_id), 0, "the publish was done before the panic surfaced");
    let stats = lane.stats();
    assert_eq!((stats.published, stats.acked_items, stats.lag()), (8, 7, 1));
    let d = consumer.try_recv().unwrap();
    assert_eq!((d.item().id, d.attempt()), (next_id, 1));
    d.ack().unwrap();
    producer.try_publish(Probe::new(Some(9))).expect("no panic left over");
    drop((producer, consumer, lane));
    assert!(all.iter().chain([&next_id]).all(|&id| drops(id) == 1));
}

/// A lane whose producer published three items, not dropped yet: item 1's drop panics, item
/// 2's panics with a payload whose own drop panics, item 3's is quiet. Returns the lane, its
/// producer and consumer, and the three items' ids.
fn three_with_a_payload_bomb() -> (Lane<Probe>, Producer<Probe>, Consumer<Probe>, Vec<u32>) {
    let (lane, mut producer, consumer) = probe_ends(8);
    let mut items = vec![
        Probe::with(Some(1), OnDrop::Panic),
        Probe::with(Some(2), OnDrop::PanicWithBomb),
        Probe::new(Some(3)),
    ];
    let all = ids(&items);
    assert_eq!(producer.try_publish_run(&mut items).unwrap(), 3);
    (lane, producer, consumer, all)
}

/// [`three_with_a_payload_bomb`], the three items acked (they wait for the next publish's pass).
fn three_acked_with_a_payload_bomb() -> (Lane<Probe>, Producer<Probe>, Consumer<Probe>, Vec<u32>) {
    let (lane, producer, mut consumer, all) = three_with_a_payload_bomb();
    consumer.try_recv_run(64).unwrap().ack().unwrap();
    (lane, producer, consumer, all)
}

#[test]
fn m3_a_drop_panic_whose_payload_panics_still_drops_every_item_once() {
    let (lane, mut producer, consumer, all) = three_acked_with_a_payload_bomb();
    // The pass drops item 1 (its panic is kept), then item 2, whose panic's payload is dropped
    // (only the first panic is kept) and panics in turn.
    let _ = catch_unwind(AssertUnwindSafe(|| producer.try_publish(Probe::new(Some(4)))));
    let _ = catch_unwind(AssertUnwindSafe(|| producer.try_publish(Probe::new(Some(5)))));
    let _ = catch_unwind(AssertUnwindSafe(move || drop((producer, consumer, lane))));
    let counts: Vec<u32> = all.iter().map(|&id| drops(id)).collect();
    assert_eq!(counts, [1, 1, 1], "each item dropped exactly once");
}

/// The same drops at the producer's own drop (its last pass): the panic reaches whoever drops
/// it, and the producer role is given back all the same (L9), so a new producer can be claimed.
#[test]
fn l9_m3_a_payload_panic_in_the_producers_last_pass_gives_the_role_back() {
    let (lane, producer, mut consumer, all) = three_acked_with_a_payload_bomb();
    assert!(
        catch_unwind(AssertUnwindSafe(move || drop(producer))).is_err(),
        "the drop panic reaches the dropper"
    );
    let mut again = lane.producer().expect("the role was given back");
    again.try_publish(Probe::new(Some(4))).expect("no panic left over");
    consumer.try_recv().unwrap().ack().unwrap();
    drop((again, consumer, lane));
    let counts: Vec<u32> = all.iter().map(|&id| drops(id)).collect();
    assert_eq!(counts, [1, 1, 1], "each item dropped exactly once");
}

/// The same drops when the lane goes with the items still unacked (the cells' own drop): every
/// item is dropped once, the quiet one after the two panicking ones included.
#[test]
fn m3_a_payload_panic_in_the_lanes_last_drop_leaks_no_item() {
    let (lane, producer, consumer, all) = three_with_a_payload_bomb();
    assert!(
        catch_unwind(AssertUnwindSafe(move || drop((producer, consumer, lane)))).is_err(),
        "the first panic surfaces"
    );
    let counts: Vec<u32> = all.iter().map(|&id| drops(id)).collect();
    assert_eq!(counts, [1, 1, 1], "each item dropped exactly once");
}

#[test]
fn m4_a_budgeted_publish_run_keeps_what_does_not_fit_in_the_vec_in_order() {
    let charge = batch(1).charge();
    let stream =
        MemoryStream::builder().capacity(16).sink("a").memory_budget(3 * charge + charge / 2).build();
    let stream = stream.unwrap();
    let (mut fanout, mut consumer) = (stream.fanout().unwrap(), stream.lane("a").unwrap().attach().unwrap());
    let positions = |v: &[LaneItem]| v.iter().map(|i| i.position().unwrap().0).collect::<Vec<_>>();
    let mut items: Vec<LaneItem> = (1..=6).map(batch).collect();
    assert_eq!(fanout.try_publish_run(&mut items).unwrap(), 3);
    assert_eq!(positions(&items), [4, 5, 6]);
    assert_eq!((stream.memory().held_items, stream.memory().held_bytes), (3, 3 * charge));
    assert!(matches!(fanout.try_publish_run(&mut items), Err(PublishError::Full(0))));
    assert_eq!(positions(&items), [4, 5, 6], "a refused step leaves the Vec as it was");
    let mut run = consumer.try_recv_run(64).unwrap();
    assert_eq!(run.ack_through_position(Position(2)).unwrap(), 2);
    assert_eq!(fanout.try_publish_run(&mut items).unwrap(), 2, "the two acked items' charges left");
    assert_eq!(positions(&items), [6]);
    assert_eq!((stream.memory().held_items, stream.memory().held_bytes), (3, 3 * charge));
    run.ack().unwrap();
    let mut run = consumer.try_recv_run(64).unwrap();
    assert_eq!(run_positions_of(&run), [4, 5]);
    assert_eq!(run.ack_through(u64::MAX).unwrap(), 2);
    assert_eq!(run.iter().len(), 0, "a fully acked run iterates nothing");
    assert_eq!(fanout.try_publish_run(&mut items).unwrap(), 1);
    assert_eq!((stream.memory().held_items, stream.memory().held_bytes), (1, charge));
    assert_eq!(stream.watermark(), Some(Position(5)));
}

#[test]
fn m3_m4_a_panicking_pass_on_a_budgeted_stream_releases_every_charge_once() {
    let dropped = Arc::new(AtomicUsize::new(0));
    let bomb = |p: u64| common::bomb(p, "a document owner panics in Drop (on purpose)", &dropped);
    let mut items: Vec<LaneItem> = (1..=6).map(|p| if p % 2 == 0 { bomb(p) } else { batch(p) }).collect();
    let charges: Vec<u64> = items.iter().map(Item::charge).collect();
    let total: u64 = charges.iter().sum();
    let stream = MemoryStream::builder().capacity(8).sink("a").memory_budget(total).build().unwrap();
    let (mut fanout, mut consumer) = (stream.fanout().unwrap(), stream.lane("a").unwrap().attach().unwrap());
    assert_eq!(fanout.try_publish_run(&mut items).unwrap(), 6);
    assert_eq!((stream.memory().held_items, stream.memory().held_bytes), (6, total));
    assert!(fanout.try_publish(batch(7)).unwrap_err().is_full(), "M4: the budget is spent");
    let mut run = consumer.try_recv_run(64).unwrap();
    assert_eq!(run.ack_through_position(Position(4)).unwrap(), 4);
    let panic = catch_unwind(AssertUnwindSafe(|| fanout.try_publish(batch(7)))).expect_err("two drops panic");
    assert!(common::payload(&panic).contains("panics in Drop"));
    let held = total - charges[..4].iter().sum::<u64>() + batch(7).charge();
    assert_eq!((stream.memory().held_items, stream.memory().held_bytes), (3, held), "the pass is counted");
    run.ack().unwrap();
    let panic = catch_unwind(AssertUnwindSafe(|| fanout.try_publish(batch(8)))).expect_err("item 6 panics");
    assert!(common::payload(&panic).contains("panics in Drop"));
    assert_eq!(stream.memory().held_items, 2);
    let rest = consumer.try_recv_run(64).unwrap();
    assert_eq!(run_positions_of(&rest), [7, 8]);
    rest.ack().unwrap();
    fanout.try_publish(batch(9)).expect("no panic left over");
    assert_eq!((stream.memory().held_items, stream.memory().held_bytes), (1, batch(9).charge()));
    assert_eq!(stream.watermark(), Some(Position(8)));
}

fn run_positions_of(run: &Run<LaneItem>) -> Vec<u64> {
    run.iter().map(|i| i.position().unwrap().0).collect()
}

/// Runs `f`; `None` if it panicked with a probe's drop panic (any other panic goes on).
fn guard<R>(f: impl FnOnce() -> R) -> Option<R> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => Some(r),
        Err(p) if p.downcast_ref::<String>().is_some_and(|m| m.contains("panics in Drop")) => None,
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// A position for the next item: mostly the next one up, sometimes none, a regression or the
/// invalid `u64::MAX`.
fn next_position(rng: &mut StdRng, next: &mut u64) -> Option<u64> {
    match rng.gen_range(0..20) {
        0..=1 => None,
        2 if *next > 1 => Some(rng.gen_range(1..*next)),
        3 => Some(u64::MAX),
        _ => {
            *next += rng.gen_range(1..3);
            Some(*next)
        }
    }
}

/// Checks a received run against the reference (`published[seq]` is the id of item `seq`):
/// its items, `get` against `iter`, the iterator's length, nothing dropped while outstanding,
/// and first deliveries in lane order (L2).
fn check_run(run: &Run<Probe>, published: &[u32], first_end: &mut u64) {
    let want: Vec<u32> = run.sequences().map(|s| published[s as usize]).collect();
    assert_eq!(run_ids(run), want, "the run's items are the lane's items at its sequences");
    let via_get: Vec<u32> = (0..run.len()).map(|i| run.get(i).unwrap().id).collect();
    assert_eq!(via_get, want);
    assert!(run.get(run.len()).is_none());
    let mut iter = run.iter();
    assert_eq!((iter.len(), iter.size_hint()), (want.len(), (want.len(), Some(want.len()))));
    iter.next();
    assert_eq!(iter.len(), want.len().saturating_sub(1));
    assert!(want.iter().all(|&id| drops(id) == 0), "an outstanding item was dropped");
    if run.attempt() == 1 {
        assert!(run.sequences().start >= *first_end, "L2: a first delivery went back in lane order");
        *first_end = run.sequences().end;
    }
}

/// A seeded walk on a standalone lane: publishes (single and runs, with regressions, invalid
/// positions and panicking drops) against receives of runs and singles that are acked whole or
/// partly, nacked, dropped or held, with re-attaches; checked against the reference at every
/// step and for exactly-once drops at the end.
fn walk(seed: u64, steps: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let capacity = [1, 2, 3, 5, 8, 13][rng.gen_range(0..6)];
    let (lane, mut producer, mut consumer) = probe_ends(capacity);
    let (mut published, mut positions, mut created) = (Vec::new(), Vec::new(), Vec::new());
    let (mut held, mut next, mut last, mut first_end) = (Vec::<Run<Probe>>::new(), 0, None, 0);
    let mut make = |rng: &mut StdRng, created: &mut Vec<u32>| {
        let on_drop = if rng.gen_ratio(1, 25) { OnDrop::Panic } else { OnDrop::Quiet };
        let p = Probe::with(next_position(rng, &mut next), on_drop);
        created.push(p.id);
        p
    };
    for step in 0..steps {
        let ctx = format!("seed {seed} step {step}");
        match rng.gen_range(0..10) {
            0..=3 => {
                let len = if rng.gen_ratio(1, 3) { 1 } else { rng.gen_range(0..12) };
                let mut items: Vec<Probe> = (0..len).map(|_| make(&mut rng, &mut created)).collect();
                let sent = ids(&items);
                let pos: Vec<Option<u64>> = items.iter().map(|p| p.position).collect();
                let single = len == 1 && rng.gen_bool(0.5);
                let r = if single {
                    let item = items.pop().unwrap();
                    guard(|| producer.try_publish(item).map(|()| 1).map_err(|e| e.map(|p| vec![p])))
                } else {
                    guard(|| producer.try_publish_run(&mut items).map_err(|e| e.map(|_| Vec::new())))
                };
                let n = match r {
                    Some(Ok(n)) => n,
                    Some(Err(e)) => {
                        let first = pos[0];
                        let regressed = first.is_some_and(|p| last.is_some_and(|l| p <= l));
                        match &e {
                            PublishError::InvalidPosition(_) => assert_eq!(first, Some(u64::MAX), "{ctx}"),
                            PublishError::PositionRegressed { .. } => assert!(regressed, "{ctx}"),
                            PublishError::Full(_) => {
                                assert!(first != Some(u64::MAX) && !regressed, "{ctx}: positions come first")
                            }
                            _ => panic!("{ctx}: unexpected refusal {e:?}"),
                        }
                        if single {
                            items = e.into_inner();
                            assert_eq!(ids(&items), sent, "{ctx}: the refused item comes back");
                        }
                        0
                    }
                    // A drop panicked in the step: a single item was published iff it was not
                    // dropped by the unwind; a run's Vec holds what was not.
                    None if single => usize::from(drops(sent[0]) == 0),
                    None => len - items.len(),
                };
                // (A single item refused in a step whose drop panicked was dropped by the unwind.)
                let want = if single && drops(sent[0]) == 1 { &[][..] } else { &sent[n..] };
                assert_eq!(ids(&items), want, "{ctx}: the rest stays with the caller, in order");
                // Ours again: each dropped once, here (one at a time: two panics in one Vec's
                // drop would abort).
                for item in items.drain(..) {
                    let _ = guard(move || drop(item));
                }
                for (k, &id) in sent[..n].iter().enumerate() {
                    let p = pos[k];
                    assert_ne!(p, Some(u64::MAX), "{ctx}: an invalid position was published");
                    if let Some(p) = p {
                        assert!(last.is_none_or(|l| p > l), "{ctx}: L4 regression published");
                        last = Some(p);
                    }
                    published.push(id);
                    positions.push(p);
                }
                assert_eq!(lane.stats().published, published.len() as u64, "{ctx}");
            }
            4..=5 => {
                let max = [1, 2, 3, 7, 64, 100][rng.gen_range(0..6)];
                if let Ok(run) = consumer.try_recv_run(max) {
                    assert!(run.len() <= max.min(64), "{ctx}");
                    check_run(&run, &published, &mut first_end);
                    held.push(run);
                }
            }
            6 if rng.gen_ratio(1, 8) => {
                consumer = lane.reattach();
            }
            _ if !held.is_empty() => {
                let mut run = held.swap_remove(rng.gen_range(0..held.len()));
                let seqs = run.sequences();
                let _ = guard(|| match rng.gen_range(0..8) {
                    0..=2 => {
                        let _ = run.ack();
                    }
                    3 => run.nack(),
                    4 => drop(run),
                    5 => {
                        let to = rng.gen_range(seqs.start.saturating_sub(1)..seqs.end + 1);
                        if run.ack_through(to).is_ok() {
                            let rest = (to + 1).max(seqs.start)..seqs.end;
                            let rest: Vec<u32> = rest.map(|s| published[s as usize]).collect();
                            assert_eq!(run_ids(&run), rest, "{ctx}: iter after ack_through");
                            assert_eq!(run.iter().len(), rest.len(), "{ctx}");
                        }
                        held.push(run);
                    }
                    _ if seqs.is_empty() => held.push(run),
                    _ => {
                        let p = positions[rng.gen_range(seqs.clone()) as usize].unwrap_or(0);
                        let _ = run.ack_through_position(Position(p));
                        let want = run.iter().filter_map(|p| p.position).last();
                        assert_eq!(run.last_position().map(|p| p.0), want, "{ctx}: I1");
                        held.push(run);
                    }
                });
            }
            _ => {}
        }
    }
    if seed % 3 == 2 {
        // M3: the lane goes with runs still outstanding (stale ones too); the runs go last.
        let _ = guard(move || drop((producer, consumer, lane)));
        for run in held {
            let _ = guard(move || drop(run));
        }
        let bad: Vec<(u32, u32)> =
            created.iter().map(|&id| (id, drops(id))).filter(|&(_, d)| d != 1).collect();
        assert!(bad.is_empty(), "seed {seed}: items not dropped exactly once (id, drops): {bad:?}");
        return;
    }
    // Drain: everything published lands, the lane's acked position is the last published.
    drop(held);
    let _ = guard(|| loop {
        match consumer.try_recv_run(64) {
            Ok(run) => {
                check_run(&run, &published, &mut first_end);
                run.ack().unwrap();
            }
            Err(e) => break assert!(e.is_empty()),
        }
    });
    while let Ok(run) = consumer.try_recv_run(64) {
        run.ack().unwrap();
    }
    let stats = lane.stats();
    assert_eq!((stats.acked_items, stats.lag()), (published.len() as u64, 0), "seed {seed}");
    assert_eq!(lane.acked().map(|p| p.0), last, "seed {seed}: L5");
    let _ = guard(move || drop((producer, consumer, lane)));
    let bad: Vec<(u32, u32)> = created.iter().map(|&id| (id, drops(id))).filter(|&(_, d)| d != 1).collect();
    assert!(bad.is_empty(), "seed {seed}: items not dropped exactly once (id, drops): {bad:?}");
}

#[test]
fn l2_l4_l5_m3_i1_random_walks_on_a_probe_lane_match_the_reference() {
    let seeds = hunt(24);
    for seed in 0..seeds {
        walk(seed, 600);
    }
}

/// What a lane's consumer thread saw: the positions it acked, each once.
fn consume(
    lane: Lane,
    me: usize,
    seed: u64,
    targets: Arc<Mutex<HashMap<u64, Option<usize>>>>,
) -> HashSet<u64> {
    let mut rng = StdRng::seed_from_u64(seed ^ ((me as u64 + 1) * 0x9e37_79b9));
    let mut consumer = lane.attach().unwrap();
    let (mut landed, mut pending, mut first_max) = (HashSet::new(), BTreeSet::new(), 0);
    let mut held: Option<Run<LaneItem>> = None;
    loop {
        let max = [1, 2, 5, 64][rng.gen_range(0..4)];
        // A held run may pin the room the publisher waits for: only `try_recv_run` while holding
        // one, and the held run goes once nothing is there.
        let run = if held.is_none() && rng.gen_bool(0.7) {
            match consumer.recv_run(max).unwrap() {
                Some(run) => run,
                None => break,
            }
        } else {
            match consumer.try_recv_run(max) {
                Ok(run) => run,
                Err(e) if e.is_closed() && held.is_none() => break,
                Err(_) => {
                    if let Some(h) = held.take() {
                        pending.extend(h.iter().map(|i| i.position().unwrap().0));
                    }
                    thread::yield_now();
                    continue;
                }
            }
        };
        let ps: Vec<u64> = run.iter().map(|i| i.position().unwrap().0).collect();
        {
            let targets = targets.lock().unwrap();
            for p in &ps {
                let to = targets.get(p).copied().flatten();
                assert!(to.is_none_or(|to| to == me), "lane {me} got item {p} addressed to lane {to:?}");
            }
        }
        if run.attempt() == 1 {
            assert!(pending.is_empty(), "L2: lane {me} got new items {ps:?} before its released {pending:?}");
            assert!(ps[0] > first_max, "L2: lane {me} first deliveries out of order");
            first_max = *ps.last().unwrap();
        } else {
            assert_eq!(ps.len(), 1, "a redelivery comes alone");
            assert_eq!(pending.pop_first(), Some(ps[0]), "L2: lane {me} redelivers earliest first");
        }
        let mut run = run;
        let land = |ps: &[u64], landed: &mut HashSet<u64>| {
            for &p in ps {
                assert!(landed.insert(p), "lane {me}: item {p} landed twice");
            }
        };
        match rng.gen_range(0..10) {
            0..=3 => {
                run.ack().unwrap();
                land(&ps, &mut landed);
            }
            4..=5 => {
                let n = rng.gen_range(0..=ps.len());
                let by_position = rng.gen_bool(0.5);
                let acked = match n.checked_sub(1) {
                    Some(k) if by_position => run.ack_through_position(Position(ps[k])).unwrap(),
                    Some(k) => run.ack_through(run.sequences().start + k as u64).unwrap(),
                    None => match run.sequences().start.checked_sub(1) {
                        Some(below) => run.ack_through(below).unwrap(),
                        None => 0,
                    },
                };
                assert_eq!(acked, n, "lane {me}: a cumulative ack acks the prefix");
                land(&ps[..acked], &mut landed);
                let rest: Vec<u64> = run.iter().map(|i| i.position().unwrap().0).collect();
                assert_eq!(rest, ps[acked..], "lane {me}: iter after a partial ack");
                if rng.gen_bool(0.5) {
                    run.ack().unwrap();
                    land(&rest, &mut landed);
                } else {
                    run.nack();
                    pending.extend(rest);
                }
            }
            6 => {
                pending.extend(&ps);
                run.nack();
            }
            7 => {
                pending.extend(&ps);
                drop(run);
            }
            8 if held.is_none() => held = Some(run),
            _ => {
                run.ack().unwrap();
                land(&ps, &mut landed);
            }
        }
        if let Some(h) = held.take_if(|_| rng.gen_bool(0.3)) {
            pending.extend(h.iter().map(|i| i.position().unwrap().0));
            drop(h);
        }
        if held.is_none() && rng.gen_ratio(1, 30) {
            drop(consumer);
            consumer = lane.reattach();
        }
    }
    assert!(held.is_none() && pending.is_empty(), "lane {me}: closed with items held or released");
    landed
}

/// A fan-out publishing (`publish`, `publish_to`, `publish_run`) against a consumer thread per
/// lane receiving runs, and, for odd seeds, a closer racing it: every lane lands exactly its
/// own items (never one addressed to another lane), the refused ones come back intact, and the
/// watermark ends at the last position published (passed gaps count, L5).
fn fanout_race(seed: u64, n: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let capacity = [2, 4, 8, 16][rng.gen_range(0..4)];
    let stream = common::stream(capacity, &["a", "b", "c"]);
    let targets = Arc::new(Mutex::new(HashMap::new()));
    let consumers: Vec<_> = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(me, sink)| {
            let (lane, targets) = (stream.lane(sink).unwrap(), targets.clone());
            thread::spawn(move || {
                // A failing consumer closes the stream, so the publisher stops instead of waiting
                // for room for ever.
                let r = catch_unwind(AssertUnwindSafe(|| consume(lane.clone(), me, seed, targets)));
                r.unwrap_or_else(|p| {
                    lane.close();
                    std::panic::resume_unwind(p)
                })
            })
        })
        .collect();
    let progress = Arc::new(AtomicUsize::new(0));
    let closer = (seed % 2 == 1).then(|| {
        let (lane, progress, at) =
            (stream.lane("b").unwrap(), progress.clone(), rng.gen_range(0..n as usize));
        thread::spawn(move || {
            while progress.load(Ordering::Relaxed) < at {
                thread::yield_now();
            }
            lane.close();
        })
    });
    let mut fanout = stream.fanout().unwrap();
    let mut expected = [Vec::new(), Vec::new(), Vec::new()];
    let mut p = 0;
    while p < n {
        let kind = if p + 1 >= n { 0 } else { rng.gen_range(0..4) };
        let len = if kind == 3 { rng.gen_range(1..9).min(n - p) } else { 1 };
        let to = (kind == 1 || kind == 2).then(|| rng.gen_range(0..3));
        let sent: Vec<u64> = (p + 1..=p + len).collect();
        targets.lock().unwrap().extend(sent.iter().map(|&q| (q, to)));
        let done = if kind == 3 {
            let mut items: Vec<LaneItem> = sent.iter().map(|&q| batch(q)).collect();
            match fanout.publish_run(&mut items) {
                Ok(()) => len as usize,
                Err(e) => {
                    assert!(e.is_closed());
                    let done = e.into_inner();
                    let rest: Vec<u64> = items.iter().map(|i| i.position().unwrap().0).collect();
                    assert_eq!(rest, sent[done..], "seed {seed}: a closed run keeps its rest in order");
                    done
                }
            }
        } else {
            let r = match to {
                Some(to) if kind == 1 => fanout.publish_to(to, batch(p + 1)),
                Some(to) => match fanout.try_publish_to(to, batch(p + 1)) {
                    Err(PublishError::Full(item)) => fanout.publish_to(to, item),
                    Err(e) => {
                        assert!(e.is_closed(), "seed {seed}: {e:?}");
                        Err(PublishError::Closed(e.into_inner()))
                    }
                    Ok(()) => Ok(()),
                },
                None => fanout.publish(batch(p + 1)),
            };
            match r {
                Ok(()) => 1,
                Err(e) => {
                    assert!(e.is_closed());
                    assert_eq!(
                        e.into_inner().position(),
                        Some(Position(p + 1)),
                        "seed {seed}: the item comes back"
                    );
                    0
                }
            }
        };
        for &q in &sent[..done] {
            for (lane, list) in expected.iter_mut().enumerate() {
                if to.is_none_or(|to| to == lane) {
                    list.push(q);
                }
            }
        }
        p += len;
        progress.store(p as usize, Ordering::Relaxed);
        if done < sent.len() {
            break;
        }
    }
    fanout.close();
    if let Some(closer) = closer {
        closer.join().unwrap();
    }
    for (lane, consumer) in consumers.into_iter().enumerate() {
        let landed = consumer.join().unwrap();
        let want: HashSet<u64> = expected[lane].iter().copied().collect();
        assert_eq!(landed, want, "seed {seed}: lane {lane} landed exactly its items");
    }
    // Each lane passed its trailing gaps while draining, and a passed gap's position counts.
    let last = expected.iter().filter_map(|l| l.last().copied()).max();
    assert_eq!(stream.watermark().map(|p| p.0), last, "seed {seed}: W1 at the last position published");
}

#[test]
fn l2_l8_l10_w1_gaps_runs_and_a_racing_close_under_threads_land_each_lanes_items_once() {
    let seeds = hunt(6);
    for seed in 0..seeds {
        common::within(60, &format!("fanout race, seed {seed}"), move || fanout_race(seed, 600));
    }
}
