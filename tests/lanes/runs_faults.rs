//! Adversarial tests of runs (`Consumer::recv_run` and its siblings, [`Run`]) and of the
//! fan-out producer ([`lanestream::Fanout`]): each test tries to make them break a rule of the
//! contract (`lanestream::contract`) — runs mixed with single receives, cumulative acks at the
//! edges, releases of partly acked runs, re-attach mid-run, the ring's wrap-around, the holder
//! bound, close, a fan-out meeting full, closed and detached lanes, and the watermark under
//! concurrent runs. Each test is named after the rule it attacks.

use crate::common;
use lanestream::prelude::*;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{
    batch, pos, publish_range, run_positions, shared_envelopes, snapshot, stream, tracked, within, Tick,
};
use lanestream::{
    AckError, Item, Lane, LaneItem, Position, PublishError, Run, SinkName, Stream, StreamError, TryRecvError,
    MAX_RUN,
};
use rand::{Rng, SeedableRng};

// ----- cumulative acks at the edges ---------------------------------------------------------------

/// `ack_through` with a sequence above the run acks all of it ("all if above"), also for the
/// largest sequence there is.
#[test]
fn runs_l5_ack_through_the_largest_sequence_acks_the_whole_run() {
    let s = stream(8, &["a"]);
    publish_range(&s, 1..=4);
    let mut consumer = s.attach("a").unwrap();
    let mut run = consumer.try_recv_run(8).unwrap();
    assert_eq!(run.sequences(), 0..4);
    let acked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run.ack_through(u64::MAX)));
    match acked {
        Ok(r) => assert_eq!(r, Ok(4)),
        Err(_) => panic!("Run::ack_through(u64::MAX) panicked instead of acking the whole run"),
    }
    assert!(run.is_empty());
    drop(run);
    assert_eq!(s.watermark(), Some(Position(4)));
    assert!(s.is_idle());
}

/// Below the run, twice, beyond it, and after it is all acked: each cumulative ack acks exactly
/// the outstanding prefix it names, never an item twice, and the acked position follows.
#[test]
fn runs_l5_ack_through_below_twice_and_beyond_acks_each_item_once() {
    let s = stream(8, &["a"]);
    publish_range(&s, 1..=2);
    let mut consumer = s.attach("a").unwrap();
    // Items 1..2 are acked through a first run, so the second run starts at sequence 2.
    consumer.try_recv_run(8).unwrap().ack().unwrap();
    publish_range(&s, 3..=7);
    let mut run = consumer.try_recv_run(8).unwrap();
    assert_eq!(run.sequences(), 2..7);
    assert_eq!(run.ack_through(0), Ok(0), "below the run");
    assert_eq!(run.ack_through(1), Ok(0), "just below the run");
    assert_eq!(s.watermark(), Some(Position(2)));
    assert_eq!(run.ack_through(3), Ok(2));
    assert_eq!(run.sequences(), 4..7);
    assert_eq!(run_positions(&run), [5, 6, 7]);
    assert_eq!(s.watermark(), Some(Position(4)));
    assert_eq!(run.ack_through(3), Ok(0), "the same sequence twice");
    assert_eq!(run.ack_through(2), Ok(0), "a sequence already acked");
    assert_eq!(run.ack_through_position(Position(4)), Ok(0), "a position already acked");
    assert_eq!(s.stats("a").unwrap().acked_items, 4);
    assert_eq!(run.ack_through(1_000), Ok(3), "beyond the run");
    assert!(run.is_empty());
    assert_eq!(run.ack_through(1_000), Ok(0), "an empty run acks nothing");
    assert_eq!(run.get(0), None);
    assert_eq!(run.iter().count(), 0);
    run.ack().unwrap();
    assert_eq!(s.watermark(), Some(Position(7)));
    assert_eq!(s.stats("a").unwrap().acked_items, 7);
    assert!(s.is_idle());
}

/// `ack_through_position` with a position between two items acks up to the lower one; with a
/// position below the run acks nothing; unpositioned items at the front go with the first
/// positioned one.
#[test]
fn runs_l5_ack_through_position_between_below_and_with_snapshots_in_front() {
    let s = stream(8, &["a"]);
    let mut producer = s.fanout().unwrap();
    producer.try_publish(snapshot()).unwrap();
    producer.try_publish(batch(10)).unwrap();
    producer.try_publish(batch(20)).unwrap();
    producer.try_publish(snapshot()).unwrap();
    producer.try_publish(batch(30)).unwrap();
    let mut consumer = s.attach("a").unwrap();
    let mut run = consumer.try_recv_run(8).unwrap();
    assert_eq!(run.len(), 5);
    assert_eq!(run.ack_through_position(Position(9)), Ok(0));
    assert_eq!(s.stats("a").unwrap().acked_items, 0);
    assert_eq!(run.ack_through_position(Position(25)), Ok(3), "snapshot, 10, 20");
    assert_eq!(s.watermark(), Some(Position(20)));
    assert_eq!(run.len(), 2);
    assert_eq!(run.get(0).unwrap().position(), None);
    assert_eq!(run.last_position(), Some(Position(30)));
    run.nack();
    // The snapshot item comes back before 30, each alone, attempt 2.
    let again = consumer.try_recv_run(8).unwrap();
    assert_eq!((again.len(), again.get(0).unwrap().position(), again.attempt()), (1, None, 2));
    again.ack().unwrap();
    assert_eq!(s.watermark(), Some(Position(20)), "an unpositioned ack moves nothing (W2)");
    let last = consumer.try_recv_run(8).unwrap();
    assert_eq!((run_positions(&last), last.attempt()), (vec![30], 2));
    last.ack().unwrap();
    assert_eq!(s.watermark(), Some(Position(30)));
}

// ----- runs mixed with single receives ------------------------------------------------------------

/// Single receives and runs interleave in publish order; acks in any order (runs last-first,
/// singles in between) never move the acked position past an unacked item.
#[test]
fn runs_l2_l5_runs_and_single_receives_interleave_in_order_and_out_of_order_acks_keep_the_prefix() {
    let s = stream(16, &["a"]);
    publish_range(&s, 1..=10);
    let mut c = s.attach("a").unwrap();
    let d1 = c.try_recv().unwrap();
    let mut r2 = c.try_recv_run(3).unwrap();
    let d5 = c.try_recv().unwrap();
    let r6 = c.try_recv_run(64).unwrap();
    assert_eq!(pos(&d1), 1);
    assert_eq!(run_positions(&r2), [2, 3, 4]);
    assert_eq!(pos(&d5), 5);
    assert_eq!(run_positions(&r6), [6, 7, 8, 9, 10]);
    assert_eq!(c.try_recv_run(64).unwrap_err(), TryRecvError::Empty);
    assert!(c.is_empty());
    r6.ack().unwrap();
    assert_eq!(s.watermark(), None);
    d5.ack().unwrap();
    assert_eq!(s.watermark(), None);
    assert_eq!(r2.ack_through_position(Position(3)), Ok(2));
    assert_eq!(s.watermark(), None, "item 1 is still out");
    d1.ack().unwrap();
    assert_eq!(s.watermark(), Some(Position(3)), "item 4 is still out");
    // Item 4 is out; 5..10 are acked but wait behind it (both count as in flight).
    assert_eq!(s.stats("a").unwrap().in_flight, 7);
    assert_eq!(s.stats("a").unwrap().acked_items, 3);
    r2.ack().unwrap();
    assert_eq!(s.watermark(), Some(Position(10)));
    assert!(s.is_idle());
}

/// A released single delivery comes back before a run of new items, and a released run's items
/// come back before a later single release, earliest-published first, each exactly once.
#[test]
fn runs_l2_l6_releases_of_runs_and_singles_come_back_earliest_first_each_once() {
    let s = stream(16, &["a"]);
    publish_range(&s, 1..=9);
    let mut c = s.attach("a").unwrap();
    let mut ra = c.try_recv_run(3).unwrap(); // 1 2 3
    let rb = c.try_recv_run(3).unwrap(); // 4 5 6
    let d7 = c.try_recv().unwrap(); // 7
    assert_eq!(ra.ack_through_position(Position(1)), Ok(1));
    // Release in the reverse order: 7, then 4..6, then 2..3.
    d7.nack();
    drop(rb);
    ra.nack();
    publish_range(&s, 10..=11);
    let mut got = Vec::new();
    while let Ok(run) = c.try_recv_run(64) {
        got.push((run_positions(&run), run.attempt()));
        run.ack().unwrap();
    }
    assert_eq!(
        got,
        vec![
            (vec![2], 2),
            (vec![3], 2),
            (vec![4], 2),
            (vec![5], 2),
            (vec![6], 2),
            (vec![7], 2),
            (vec![8, 9, 10, 11], 1),
        ]
    );
    assert_eq!(s.watermark(), Some(Position(11)));
    let stats = s.stats("a").unwrap();
    assert_eq!((stats.delivered, stats.redelivered), (11 + 6, 6));
    assert!(s.is_idle());
}

/// A run taken while a release is pending is the redelivery alone, and a single `try_recv`
/// right after sees the next released item, not a new one (L2 across the two APIs).
#[test]
fn runs_l2_a_run_never_carries_a_new_item_past_a_released_one() {
    let s = stream(8, &["a"]);
    publish_range(&s, 1..=6);
    let mut c = s.attach("a").unwrap();
    let r = c.try_recv_run(2).unwrap(); // 1 2
    drop(r);
    let first = c.try_recv_run(8).unwrap();
    assert_eq!((run_positions(&first), first.attempt()), (vec![1], 2));
    let single = c.try_recv().unwrap();
    assert_eq!((pos(&single), single.attempt()), (2, 2));
    let rest = c.try_recv_run(8).unwrap();
    assert_eq!((run_positions(&rest), rest.attempt()), (vec![3, 4, 5, 6], 1));
    first.ack().unwrap();
    single.ack().unwrap();
    rest.ack().unwrap();
    assert_eq!(s.watermark(), Some(Position(6)));
}

// ----- re-attach mid-run --------------------------------------------------------------------------

/// After a re-attach mid-run, the stale run's acks are refused for the items it had not acked,
/// and the new consumer's out-of-order acks never move the watermark past an unacked item.
#[test]
fn runs_l8_w3_stale_run_acks_are_refused_and_the_watermark_never_passes_an_unacked_item() {
    let s = stream(8, &["a"]);
    publish_range(&s, 1..=5);
    let mut old = s.attach("a").unwrap();
    let mut run = old.try_recv_run(8).unwrap();
    assert_eq!(run.ack_through_position(Position(1)), Ok(1));
    assert_eq!(s.watermark(), Some(Position(1)));
    let mut new = s.reattach("a").unwrap();
    assert_eq!(old.try_recv_run(8).unwrap_err(), TryRecvError::Detached);
    assert_eq!(s.stats("a").unwrap().released, 4);
    // Acking through 2 after the take-back: refused, and nothing counts.
    assert_eq!(run.ack_through_position(Position(2)), Err(AckError::Detached));
    assert_eq!(s.watermark(), Some(Position(1)));
    assert_eq!(s.stats("a").unwrap().acked_items, 1);
    let r2 = new.try_recv_run(8).unwrap();
    let r3 = new.try_recv_run(8).unwrap();
    assert_eq!((run_positions(&r2), run_positions(&r3)), (vec![2], vec![3]));
    r3.ack().unwrap();
    assert_eq!(s.watermark(), Some(Position(1)), "item 2 is still out");
    // The rest of the stale run: refused as a whole, releases nothing more.
    assert_eq!(run.len(), 3);
    assert_eq!(run.ack(), Err(AckError::Detached));
    assert_eq!(s.watermark(), Some(Position(1)));
    assert_eq!(s.stats("a").unwrap().released, 2, "items 4 and 5");
    r2.ack().unwrap();
    assert_eq!(s.watermark(), Some(Position(3)));
    let mut rest = Vec::new();
    while let Ok(r) = new.try_recv_run(8) {
        rest.push((run_positions(&r), r.attempt()));
        r.ack().unwrap();
    }
    assert_eq!(rest, vec![(vec![4], 2), (vec![5], 2)]);
    assert_eq!(s.watermark(), Some(Position(5)));
    assert!(s.is_idle());
}

/// A stale run that the new consumer has acked past keeps its slots pinned, reads its own items
/// (never a later item written into a reused slot), and lets them go when dropped.
#[test]
fn runs_l8_a_stale_run_reads_its_own_items_while_the_new_consumer_laps_the_ring() {
    let s = stream(3, &["a"]);
    let lane = s.lane("a").unwrap();
    let mut producer = s.fanout().unwrap();
    for p in 1..=3 {
        producer.try_publish(batch(p)).unwrap();
    }
    let mut old = lane.attach().unwrap();
    let stale = old.try_recv_run(3).unwrap();
    let mut new = lane.reattach();
    for _ in 0..3 {
        new.try_recv_run(3).unwrap().ack().unwrap();
    }
    assert_eq!(s.watermark(), Some(Position(3)));
    assert_eq!(lane.stats().pinned, 3);
    // Every slot is pinned: the lane is full although everything is acked.
    assert!(producer.try_publish(batch(4)).unwrap_err().is_full());
    assert_eq!(run_positions(&stale), [1, 2, 3]);
    assert!(s.is_idle(), "acked items pinned by a stale run count as done (W5)");
    drop(stale);
    assert_eq!(lane.stats().pinned, 0);
    for p in 4..=9 {
        producer.try_publish(batch(p)).unwrap();
        let r = new.try_recv_run(8).unwrap();
        assert_eq!((run_positions(&r), r.attempt()), (vec![p], 1));
        r.ack().unwrap();
    }
    assert_eq!(s.watermark(), Some(Position(9)));
}

/// A late run ack racing a re-attach, many times: item by item (`ack_through` one sequence at a
/// time), each item either lands (and is never redelivered) or is refused (and comes to the new
/// consumer exactly once) — never lost, never both.
#[test]
fn runs_l8_late_run_acks_racing_a_reattach_land_xor_are_redelivered() {
    const ITEMS: u64 = 8;
    for round in 0..300u64 {
        let s = stream(ITEMS as usize, &["a"]);
        let base = round * 100;
        publish_range(&s, base + 1..=base + ITEMS);
        let lane = s.lane("a").unwrap();
        let mut old = lane.attach().unwrap();
        let mut run = old.try_recv_run(MAX_RUN).unwrap();
        assert_eq!(run.len(), ITEMS as usize);
        let start = run.sequences().start;
        let go = Arc::new(AtomicBool::new(false));
        let acker = {
            let go = go.clone();
            thread::spawn(move || {
                while !go.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                let mut landed = Vec::new();
                for k in 0..ITEMS {
                    let p = run.get(0).unwrap().position().unwrap().0;
                    match run.ack_through(start + k) {
                        Ok(1) => landed.push(p),
                        Ok(n) => panic!("ack_through of one item acked {n}"),
                        Err(AckError::Detached) => {}
                        Err(e) => panic!("{e:?}"),
                    }
                }
                assert!(run.is_empty());
                landed
            })
        };
        go.store(true, Ordering::Release);
        if round % 2 == 0 {
            thread::yield_now();
        }
        let mut new = lane.reattach();
        let landed = acker.join().unwrap();
        let mut redelivered = Vec::new();
        while let Ok(r) = new.try_recv_run(MAX_RUN) {
            assert_eq!(r.attempt(), 2, "only released items come back, with attempt 2");
            redelivered.extend(run_positions(&r));
            r.ack().unwrap();
        }
        let mut all: Vec<u64> = landed.iter().chain(&redelivered).copied().collect();
        all.sort_unstable();
        assert_eq!(
            all,
            (base + 1..=base + ITEMS).collect::<Vec<_>>(),
            "round {round}: landed {landed:?}, redelivered {redelivered:?}"
        );
        let mut sorted = redelivered.clone();
        sorted.sort_unstable();
        assert_eq!(redelivered, sorted, "redeliveries in publish order (L8)");
        assert_eq!(s.watermark(), Some(Position(base + ITEMS)));
        assert!(s.is_idle());
    }
}

// ----- wrap-around, capacity 1, MAX_RUN -----------------------------------------------------------

/// Capacity 1: a run holds one item; nack, re-attach and close all behave as for singles.
#[test]
fn runs_l2_l6_l10_capacity_1_runs_of_one_through_nack_reattach_and_close() {
    let s = stream(1, &["a"]);
    let lane = s.lane("a").unwrap();
    let mut producer = s.fanout().unwrap();
    let mut c = lane.attach().unwrap();
    for p in 1..=50u64 {
        producer.try_publish(batch(p)).unwrap();
        assert!(producer.try_publish(batch(p + 1_000)).unwrap_err().is_full());
        let r = c.try_recv_run(MAX_RUN).unwrap();
        assert_eq!((run_positions(&r), r.attempt()), (vec![p], 1));
        match p % 3 {
            0 => r.ack().unwrap(),
            1 => {
                r.nack();
                let again = c.try_recv_run(MAX_RUN).unwrap();
                assert_eq!((run_positions(&again), again.attempt()), (vec![p], 2));
                again.ack().unwrap();
            }
            _ => {
                c = lane.reattach();
                assert_eq!(r.ack(), Err(AckError::Detached));
                let again = c.try_recv_run(MAX_RUN).unwrap();
                assert_eq!((run_positions(&again), again.attempt()), (vec![p], 2));
                again.ack().unwrap();
            }
        }
        assert_eq!(lane.acked(), Some(Position(p)));
    }
    producer.try_publish(batch(51)).unwrap();
    let out = c.try_recv_run(4).unwrap();
    producer.close();
    assert!(c.recv_run(4).unwrap().is_none());
    drop(out);
    let back = c.recv_run(4).unwrap().expect("a run released after None comes back");
    assert_eq!((run_positions(&back), back.attempt()), (vec![51], 2));
    back.ack().unwrap();
    assert!(c.recv_run(4).unwrap().is_none());
    assert!(s.is_idle());
}

/// Runs of `MAX_RUN` items over capacities just above and below it, so that runs straddle the
/// ring's wrap-around at every offset; partial acks and nacks in between.
#[test]
fn runs_l2_max_runs_straddle_the_wrap_for_capacities_around_max_run() {
    for capacity in [MAX_RUN - 1, MAX_RUN, MAX_RUN + 1, 2 * MAX_RUN + 3] {
        let s = stream(capacity, &["a"]);
        let lane = s.lane("a").unwrap();
        let mut producer = s.fanout().unwrap();
        let mut c = lane.attach().unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(capacity as u64);
        let (mut next_pub, mut expect) = (1u64, 1u64);
        for _ in 0..200 {
            while producer.try_publish(batch(next_pub)).is_ok() {
                next_pub += 1;
            }
            let Ok(mut run) = c.try_recv_run(rng.gen_range(1..=MAX_RUN + 5)) else { continue };
            assert!(run.len() <= MAX_RUN);
            assert_eq!(run.get(0).unwrap().position(), Some(Position(expect)), "capacity {capacity}");
            let ps = run_positions(&run);
            assert!(ps.windows(2).all(|w| w[1] == w[0] + 1), "not contiguous: {ps:?}");
            if run.attempt() > 1 {
                assert_eq!(run.len(), 1, "a redelivery comes alone");
            }
            let keep = rng.gen_range(0..=run.len());
            if keep > 0 {
                assert_eq!(run.ack_through(run.sequences().start + keep as u64 - 1), Ok(keep));
            }
            expect += keep as u64;
            // The rest is released and comes back first, in order.
            drop(run);
            assert_eq!(lane.acked(), (expect > 1).then(|| Position(expect - 1)));
        }
        while let Ok(run) = c.try_recv_run(MAX_RUN) {
            assert_eq!(run.get(0).unwrap().position(), Some(Position(expect)));
            expect += run.len() as u64;
            run.ack().unwrap();
        }
        assert_eq!(expect, next_pub, "capacity {capacity}: items lost or duplicated");
        assert!(lane.is_idle());
    }
}

// ----- the holder bound ---------------------------------------------------------------------------

/// The holder bound with a multi-item stale run: item 1 reaches 65,535 live deliveries (one of
/// them inside a stale run of three first deliveries); the next redelivery waits, and neither
/// the released items 2 and 3 nor a new item overtakes it. Dropping the three-item stale run
/// frees one holder of item 1: then 1, 2, 3, 4 come in order.
#[test]
fn runs_l2_l8_holder_bound_with_a_multi_item_stale_run_nothing_overtakes() {
    const BOUND: usize = 0xFFFF;
    let lane: Lane<Tick> = Lane::standalone(SinkName::new("ticks").unwrap(), 8).unwrap();
    let mut producer = lane.producer().unwrap();
    for p in 1..=3 {
        producer.publish(Tick(p)).unwrap();
    }
    let first = lane.attach().unwrap().try_recv_run(8).unwrap();
    assert_eq!(first.len(), 3);
    let mut kept = Vec::with_capacity(BOUND);
    for _ in 1..BOUND {
        let run = lane.reattach().try_recv_run(8).unwrap();
        assert_eq!((run.len(), run.get(0)), (1, Some(&Tick(1))));
        kept.push(run);
    }
    let mut consumer = lane.reattach();
    producer.publish(Tick(4)).unwrap();
    assert_eq!(consumer.try_recv_run(8).unwrap_err(), TryRecvError::Empty);
    assert_eq!(consumer.try_recv().unwrap_err(), TryRecvError::Empty, "a single receive overtook");
    assert!(!consumer.is_empty(), "items are released (L11)");
    drop(first);
    let mut got = Vec::new();
    while let Ok(run) = consumer.try_recv_run(8) {
        got.push((run.iter().map(|t| t.0).collect::<Vec<_>>(), run.attempt()));
        run.ack().unwrap();
    }
    assert_eq!(got, vec![(vec![1], BOUND as u32), (vec![2], 2), (vec![3], 2), (vec![4], 1)]);
    drop(kept);
    assert!(lane.is_idle());
}

// ----- close while a run is outstanding -----------------------------------------------------------

/// A close racing a blocked `recv_run` while another run is out: the blocked receive returns
/// `None`; the outstanding run, nacked afterwards, still comes back, then `None` again; publishing
/// hands the item back.
#[test]
fn runs_l10_close_with_a_run_outstanding_and_a_recv_run_blocked() {
    let s = stream(4, &["a"]);
    publish_range(&s, 1..=3);
    let mut c = s.attach("a").unwrap();
    let out = c.try_recv_run(8).unwrap();
    let mut producer = s.fanout().unwrap();
    let s2 = s.clone();
    let closer = thread::spawn(move || {
        thread::sleep(Duration::from_millis(30));
        s2.close("a").unwrap();
    });
    let (c, none) = within(10, "recv_run blocked over a close", move || {
        let r = c.recv_run(8).unwrap().map(|r| r.len());
        (c, r)
    });
    closer.join().unwrap();
    assert_eq!(none, None);
    let mut c = c;
    let refused = producer.try_publish(batch(4)).unwrap_err();
    assert!(matches!(refused, PublishError::Closed(_)));
    assert_eq!(refused.into_inner().position(), Some(Position(4)));
    let mut out = out;
    assert_eq!(out.ack_through_position(Position(1)), Ok(1));
    out.nack();
    let mut got = Vec::new();
    while let Some(r) = c.recv_run(8).unwrap() {
        got.push((run_positions(&r), r.attempt()));
        r.ack().unwrap();
    }
    assert_eq!(got, vec![(vec![2], 2), (vec![3], 2)]);
    assert_eq!(s.watermark(), Some(Position(3)));
    assert!(s.is_idle());
}

// ----- fan-out ------------------------------------------------------------------------------------

/// One lane full: every publish form refuses (or times out) with the very item handed back and
/// no lane gets it; a run publishes only what the fullest lane has room for.
#[test]
fn fanout_l3_one_full_lane_keeps_the_item_from_every_lane_and_hands_it_back() {
    let s = stream(3, &["a", "b", "c"]);
    let envelopes = shared_envelopes(1);
    let mut fanout = s.fanout().unwrap();
    fanout.try_publish(batch(1)).unwrap();
    fanout.try_publish(batch(2)).unwrap();
    fanout.try_publish(batch(3)).unwrap();
    // Lanes a and c make room; b stays full.
    for sink in ["a", "c"] {
        s.attach(sink).unwrap().try_recv_run(8).unwrap().ack().unwrap();
    }
    let item = tracked(Some(4), &envelopes);
    let back = fanout.try_publish(item).unwrap_err();
    assert!(back.is_full());
    let back = back.into_inner();
    assert_eq!(Arc::strong_count(&envelopes), 2, "the item came back and no lane kept a copy");
    let timed = fanout.publish_timeout(back, Duration::from_millis(20)).unwrap_err();
    let PublishError::Timeout(back) = timed else { panic!("{timed:?}") };
    assert_eq!(Arc::strong_count(&envelopes), 2);
    drop(back);
    for sink in ["a", "b", "c"] {
        assert_eq!(s.stats(sink).unwrap().published, 3, "lane {sink}");
    }
    // b acks one item: a run of two goes out as one item to every lane.
    let mut b = s.attach("b").unwrap();
    let mut rb = b.try_recv_run(8).unwrap();
    assert_eq!(rb.ack_through_position(Position(1)), Ok(1));
    assert_eq!(fanout.try_publish_run(&mut vec![batch(4), batch(5)]), Ok(1));
    for sink in ["a", "b", "c"] {
        assert_eq!(s.stats(sink).unwrap().last_published, Some(Position(4)), "lane {sink}");
    }
    rb.ack().unwrap();
    assert_eq!(s.watermark(), Some(Position(3)));
}

/// A closed lane and a full lane at once: the publish must end with `Closed` (the lane is
/// closed, L10), not wait for the full lane's room (and time out, or hang).
#[test]
fn fanout_l10_a_closed_lane_refuses_the_publish_even_while_another_lane_is_full() {
    // The full lane comes first in the fan-out's order, the closed one after it.
    let s = stream(1, &["a", "b"]);
    let mut fanout = s.fanout().unwrap();
    fanout.try_publish(batch(1)).unwrap();
    s.attach("b").unwrap().try_recv_run(1).unwrap().ack().unwrap();
    s.lane("b").unwrap().close();
    let started = Instant::now();
    let r = fanout.publish_timeout(batch(2), Duration::from_millis(500));
    assert!(
        matches!(r, Err(PublishError::Closed(_))),
        "publish_timeout with lane a full and lane b closed gave {r:?} after {:?}",
        started.elapsed()
    );
}

/// A fan-out publish waiting for room on one lane while a supervisor closes *another* lane:
/// closing wakes every waiter and the publish returns `Closed` with its item (L10).
#[test]
fn fanout_l10_closing_another_lane_wakes_a_publish_waiting_for_room() {
    let s = stream(1, &["a", "b"]);
    let mut fanout = s.fanout().unwrap();
    fanout.try_publish(batch(1)).unwrap();
    let (tx, rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let r = fanout.publish(batch(2));
        let _ = tx.send(());
        (fanout, r)
    });
    thread::sleep(Duration::from_millis(50));
    s.lane("b").unwrap().close();
    let woke = rx.recv_timeout(Duration::from_secs(3)).is_ok();
    if !woke {
        // Unblock the waiter so the test ends: closing the lane it waits on wakes it.
        s.lane("a").unwrap().close();
    }
    let (_fanout, r) = waiter.join().unwrap();
    assert!(woke, "fan-out publish still waiting 3 s after lane b was closed (it waits on lane a only)");
    assert!(matches!(r, Err(PublishError::Closed(ref i)) if i.position() == Some(Position(2))), "{r:?}");
}

/// A closed lane refuses a fan-out publish and a run on every lane: nothing reaches the open
/// lanes, and each refusal hands back the item (or the index of the first item not published).
#[test]
fn fanout_l10_a_closed_lane_refuses_for_every_lane_nothing_reaches_the_open_ones() {
    let s = stream(4, &["a", "b", "c"]);
    let envelopes = shared_envelopes(7);
    let mut fanout = s.fanout().unwrap();
    fanout.publish(batch(1)).unwrap();
    s.lane("c").unwrap().close();
    let r = fanout.try_publish(tracked(Some(2), &envelopes));
    assert!(matches!(r, Err(PublishError::Closed(_))), "{r:?}");
    drop(r);
    assert_eq!(fanout.publish(batch(2)).unwrap_err().into_inner().position(), Some(Position(2)));
    assert_eq!(fanout.try_publish_run(&mut vec![batch(2), batch(3)]), Err(PublishError::Closed(0)));
    assert_eq!(fanout.publish_run(&mut vec![batch(2), batch(3)]), Err(PublishError::Closed(0)));
    assert_eq!(Arc::strong_count(&envelopes), 1, "a refused copy was kept");
    for sink in ["a", "b", "c"] {
        assert_eq!(s.stats(sink).unwrap().published, 1, "lane {sink}");
    }
}

/// A lane whose consumer is detached (re-attached) mid-stream is no different for the fan-out:
/// every lane gets every item; the new consumer gets the old one's unacked items first.
#[test]
fn fanout_l8_a_detached_consumer_changes_nothing_for_the_publisher() {
    let s = stream(4, &["a", "b"]);
    let mut fanout = s.fanout().unwrap();
    let mut a = s.attach("a").unwrap();
    let mut b = s.attach("b").unwrap();
    let mut got_b = Vec::new();
    for chunk in 0..10u64 {
        let mut items: Vec<_> = (1..=3).map(|k| batch(chunk * 3 + k)).collect();
        assert_eq!(fanout.publish_run(&mut items), Ok(()));
        let ra = a.try_recv_run(8).unwrap();
        assert_eq!(ra.len(), 3);
        ra.ack().unwrap();
        let mut rb = b.try_recv_run(2).unwrap();
        assert_eq!(rb.len(), 2);
        got_b.push(rb.get(0).unwrap().position().unwrap().0);
        assert_eq!(rb.ack_through(rb.sequences().start), Ok(1));
        if chunk % 2 == 0 {
            b = s.reattach("b").unwrap(); // rb is now stale
            assert_eq!(rb.ack(), Err(AckError::Detached));
        } else {
            drop(rb);
        }
        while let Ok(r) = b.try_recv_run(8) {
            got_b.extend(run_positions(&r));
            r.ack().unwrap();
        }
    }
    assert_eq!(got_b, (1..=30).collect::<Vec<_>>());
    assert_eq!(s.watermark(), Some(Position(30)));
    assert!(s.is_idle());
}

/// Positions are checked against the last published by any fan-out of the stream, also after a
/// restarted fan-out published: a refused item is refused on every lane, a run stops before its
/// first refused item, and a new fan-out continues after the last position.
#[test]
fn fanout_l4_a_refused_position_is_refused_on_every_lane_and_a_new_fanout_continues_after_the_last() {
    let s = stream(8, &["a", "b"]);
    {
        let mut fanout = s.fanout().unwrap();
        fanout.publish_run(&mut vec![batch(1), batch(2)]).unwrap();
    }
    s.fanout().unwrap().publish(batch(5)).unwrap();
    let mut fanout = s.fanout().unwrap();
    // 3 is past the first fan-out's last (2) but not the restarted one's (5).
    let r = fanout.try_publish(batch(3));
    assert!(matches!(r, Err(PublishError::PositionRegressed { last: Position(5), .. })), "{r:?}");
    assert_eq!(fanout.try_publish_run(&mut vec![batch(4), batch(6)]).unwrap_err().into_inner(), 0);
    assert_eq!(s.stats("b").unwrap().published, 3);
    assert_eq!(s.stats("a").unwrap().published, 3);
    // A run whose second item regresses publishes the first only.
    assert_eq!(fanout.try_publish_run(&mut vec![batch(6), batch(6)]), Ok(1));
    assert_eq!(
        fanout.try_publish(batch(u64::MAX)).unwrap_err().into_inner().position(),
        Some(Position(u64::MAX))
    );
    for sink in ["a", "b"] {
        assert_eq!(s.stats(sink).unwrap().last_published, Some(Position(6)), "lane {sink}");
    }
    drop(fanout);
    // A new fan-out after the dropped one continues after 6.
    let mut again = s.fanout().unwrap();
    assert!(matches!(again.try_publish(batch(6)), Err(PublishError::PositionRegressed { .. })));
    again.try_publish(batch(7)).unwrap();
    assert_eq!((s.stats("a").unwrap().published, s.stats("b").unwrap().published), (5, 5));
}

/// A fan-out claim refused while another fan-out lives takes nothing: refused again and again,
/// and no lane hands out a producer of its own; once the live fan-out is gone, the next claim
/// gets every lane.
#[test]
fn fanout_l9_a_refused_claim_takes_nothing_and_the_next_claim_gets_every_lane() {
    let s = stream(2, &["a", "b", "c"]);
    let held = s.fanout().unwrap();
    for _ in 0..3 {
        assert_eq!(s.fanout().unwrap_err(), StreamError::ProducerBusy(SinkName::new("a").unwrap()));
    }
    for lane in s.lanes() {
        assert_eq!(lane.producer().unwrap_err(), StreamError::ProducerBusy(lane.name().clone()));
    }
    drop(held);
    let mut fanout = s.fanout().unwrap();
    assert_eq!(fanout.lanes(), 3);
    fanout.try_publish(batch(1)).unwrap();
    assert!(s.lanes().all(|lane| lane.stats().published == 1));
}

// ----- the watermark under concurrent runs on several lanes ----------------------------------------

/// Per lane, the positions handed to an ack call (before the call) and the contiguous prefix of
/// them: a watermark above it would count an item no one has acked yet.
struct Submitted {
    set: Mutex<(BTreeSet<u64>, u64)>,
    prefix: AtomicU64,
    landed: Vec<AtomicU8>,
}

impl Submitted {
    fn new(n: u64) -> Submitted {
        Submitted {
            set: Mutex::new((BTreeSet::new(), 0)),
            prefix: AtomicU64::new(0),
            landed: (0..=n).map(|_| AtomicU8::new(0)).collect(),
        }
    }

    /// Called before acking `ps`.
    fn submit(&self, ps: &[u64]) {
        let mut g = self.set.lock().unwrap();
        let (set, prefix) = &mut *g;
        set.extend(ps);
        while set.remove(&(*prefix + 1)) {
            *prefix += 1;
        }
        self.prefix.store(*prefix, Ordering::SeqCst);
    }
}

/// Three sink threads receive in runs and ack random prefixes (cumulatively, one item per call,
/// so each item's fate is known), nack or drop the rest, sometimes re-attach while holding a run
/// (whose acks are then refused), while a fan-out publisher publishes runs and two checker
/// threads read the watermark: it never decreases (W3) and never exceeds any lane's contiguous
/// prefix of items handed to an ack (W1, L5). At the end every item landed exactly once on every
/// lane, and the watermark is the last position.
#[test]
fn runs_w1_w3_watermark_under_concurrent_runs_never_passes_any_lanes_acked_prefix() {
    const N: u64 = 4_000;
    const LANES: usize = 3;
    let s = stream(7, &["a", "b", "c"]);
    let subs: Arc<Vec<Submitted>> = Arc::new((0..LANES).map(|_| Submitted::new(N)).collect());
    let done = Arc::new(AtomicBool::new(false));
    let mut checkers = Vec::new();
    for _ in 0..2 {
        let (s, subs, done) = (s.clone(), subs.clone(), done.clone());
        checkers.push(thread::spawn(move || {
            let mut last = None;
            let mut reads = 0u64;
            while !done.load(Ordering::Acquire) {
                let w = s.watermark();
                assert!(w >= last, "watermark went back: {last:?} -> {w:?} (W3)");
                if let Some(Position(w)) = w {
                    for (i, sub) in subs.iter().enumerate() {
                        let prefix = sub.prefix.load(Ordering::SeqCst);
                        assert!(w <= prefix, "watermark {w} passes lane {i}'s acked prefix {prefix}");
                    }
                }
                last = w;
                reads += 1;
            }
            reads
        }));
    }
    let mut sinks = Vec::new();
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        let (s, subs) = (s.clone(), subs.clone());
        sinks.push(thread::spawn(move || {
            let sub = &subs[i];
            let lane = s.lane(name).unwrap();
            let mut c = lane.attach().unwrap();
            let mut rng = rand::rngs::StdRng::seed_from_u64(0xADD + i as u64);
            loop {
                let Some(mut run) = c.recv_run(rng.gen_range(1..=16)).unwrap() else { break };
                let take = rng.gen_range(0..=run.len());
                let reattach_at = (rng.gen_range(0..20) == 0).then(|| rng.gen_range(0..=take));
                for k in 0..take {
                    if reattach_at == Some(k) {
                        c = lane.reattach();
                    }
                    let p = run.get(0).unwrap().position().unwrap().0;
                    sub.submit(&[p]);
                    match run.ack_through(run.sequences().start) {
                        Ok(1) => {
                            let before = sub.landed[p as usize].fetch_add(1, Ordering::SeqCst);
                            assert_eq!(before, 0, "lane {name}: item {p} acked twice");
                        }
                        Ok(n) => panic!("acked {n} items through one sequence"),
                        Err(AckError::Detached) => {}
                        Err(e) => panic!("{e:?}"),
                    }
                }
                match rng.gen_range(0..3) {
                    0 => run.nack(),
                    1 => drop(run),
                    _ => {
                        if !run.is_empty() {
                            let ps: Vec<u64> = run_positions(&run);
                            sub.submit(&ps);
                            if run.ack().is_ok() {
                                for p in ps {
                                    let before = sub.landed[p as usize].fetch_add(1, Ordering::SeqCst);
                                    assert_eq!(before, 0, "lane {name}: item {p} acked twice");
                                }
                            }
                        }
                    }
                }
            }
        }));
    }
    let mut fanout = s.fanout().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut p = 1;
    while p <= N {
        let k = rng.gen_range(1..=10).min(N - p + 1);
        let mut items: Vec<_> = (p..p + k).map(batch).collect();
        fanout.publish_run(&mut items).unwrap();
        p += k;
    }
    fanout.close();
    for t in sinks {
        t.join().unwrap();
    }
    done.store(true, Ordering::Release);
    for t in checkers {
        assert!(t.join().unwrap() > 0);
    }
    for (i, sub) in subs.iter().enumerate() {
        let missing: Vec<u64> =
            (1..=N).filter(|&p| sub.landed[p as usize].load(Ordering::SeqCst) != 1).collect();
        assert!(missing.is_empty(), "lane {i}: items not acked exactly once: {missing:?}");
    }
    assert_eq!(s.watermark(), Some(Position(N)));
    assert!(s.is_idle());
}

// The random op sequences of runs, fan-out publishes, re-attaches and closes against a model
// are `shared_model::shared_ops` (tests/lanes/shared_ring.rs): one model for the one layout.

/// A `recv_run_async` future polled once (pending), then dropped after items arrived, takes
/// nothing: the items are all there for the next receive, first deliveries (L12, runs).
#[test]
fn runs_l12_a_dropped_recv_run_async_future_takes_nothing() {
    use std::future::Future;
    use std::task::{Context, Poll};
    let s = stream(4, &["a"]);
    let mut c = s.attach("a").unwrap();
    let (wakes, waker) = common::CountingWaker::new();
    let mut cx = Context::from_waker(&waker);
    {
        let mut fut = Box::pin(c.recv_run_async(4));
        assert!(matches!(fut.as_mut().poll(&mut cx), Poll::Pending));
        publish_range(&s, 1..=3);
        assert!(wakes.wakes() >= 1, "publishing woke nobody");
    }
    let run = c.try_recv_run(4).unwrap();
    assert_eq!((run_positions(&run), run.attempt()), (vec![1, 2, 3], 1));
    assert_eq!(s.stats("a").unwrap().delivered, 3);
    run.ack().unwrap();
    assert!(s.is_idle());
}

/// Runs shipped to worker threads that read them, ack random prefixes, nack or drop the rest,
/// while the receiving thread keeps receiving, re-attaches now and then (making the runs the
/// workers hold stale) and the producer keeps the lane full (so freed slots are reused at once):
/// every run's items read back as the contiguous positions they were delivered as (no slot
/// reused under a live or stale run), and in the end every item landed exactly once.
#[test]
fn runs_l5_l8_m3_runs_acked_on_workers_across_reattaches_lose_nothing_and_read_their_own_items() {
    const N: u64 = 6_000;
    let s = stream(5, &["a"]);
    let lane = s.lane("a").unwrap();
    let landed: Arc<Vec<AtomicU8>> = Arc::new((0..=N).map(|_| AtomicU8::new(0)).collect());
    let count = Arc::new(AtomicU64::new(0));
    let producer = {
        let mut producer = s.fanout().unwrap();
        thread::spawn(move || {
            for p in 1..=N {
                producer.publish(batch(p)).unwrap();
            }
        })
    };
    let (tx, rx) = mpsc::channel::<(Run<LaneItem>, u64)>();
    let rx = Arc::new(Mutex::new(rx));
    let workers: Vec<_> = (0..3u64)
        .map(|w| {
            let (rx, landed, count) = (rx.clone(), landed.clone(), count.clone());
            thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(w);
                loop {
                    let Ok((mut run, first)) = rx.lock().unwrap().recv() else { break };
                    thread::yield_now();
                    let ps = run_positions(&run);
                    let want: Vec<u64> = (first..first + run.len() as u64).collect();
                    assert_eq!(ps, want, "a run reads items that are not its own");
                    let k = rng.gen_range(0..=run.len());
                    for _ in 0..k {
                        let p = run.get(0).unwrap().position().unwrap().0;
                        if run.ack_through(run.sequences().start) == Ok(1) {
                            assert_eq!(
                                landed[p as usize].fetch_add(1, Ordering::SeqCst),
                                0,
                                "{p} acked twice"
                            );
                            count.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    if rng.gen_bool(0.5) {
                        run.nack();
                    } else {
                        drop(run);
                    }
                }
            })
        })
        .collect();
    let mut c = lane.attach().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    let deadline = Instant::now() + Duration::from_secs(60);
    while count.load(Ordering::SeqCst) < N {
        assert!(Instant::now() < deadline, "items lost: {} of {N} landed", count.load(Ordering::SeqCst));
        if rng.gen_range(0..50) == 0 {
            c = lane.reattach();
        }
        match c.recv_run_timeout(rng.gen_range(1..=8), Duration::from_millis(5)) {
            Ok(Some(run)) => {
                let first = run.get(0).unwrap().position().unwrap().0;
                tx.send((run, first)).unwrap();
            }
            Ok(None) => unreachable!("the lane is never closed"),
            Err(e) => assert!(e.is_timeout(), "{e:?}"),
        }
    }
    drop(tx);
    for w in workers {
        w.join().unwrap();
    }
    producer.join().unwrap();
    let twice: Vec<u64> = (1..=N).filter(|&p| landed[p as usize].load(Ordering::SeqCst) != 1).collect();
    assert!(twice.is_empty(), "not landed exactly once: {twice:?}");
    assert_eq!(s.watermark(), Some(Position(N)));
    assert!(s.is_idle());
    assert_eq!(lane.stats().pinned, 0);
}

/// A fan-out `publish_run` waiting for one lane's room while another lane is closed: it must
/// end with `Closed` and the index of the first item not published (L10), not keep waiting.
#[test]
fn fanout_l10_closing_another_lane_wakes_a_publish_run_waiting_for_room() {
    let s = stream(1, &["a", "b"]);
    let mut fanout = s.fanout().unwrap();
    let (tx, rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let r = fanout.publish_run(&mut vec![batch(1), batch(2)]);
        let _ = tx.send(());
        (fanout, r)
    });
    // Item 1 reaches both lanes; lane b makes room, lane a does not.
    let mut b = s.attach("b").unwrap();
    b.recv_run(1).unwrap().unwrap().ack().unwrap();
    s.lane("b").unwrap().close();
    let woke = rx.recv_timeout(Duration::from_secs(3)).is_ok();
    if !woke {
        s.lane("a").unwrap().close();
    }
    let (_fanout, r) = waiter.join().unwrap();
    assert!(woke, "fan-out publish_run still waiting 3 s after lane b was closed");
    assert_eq!(r, Err(PublishError::Closed(1)));
}

/// The polite form: a consumer dropped with a run outstanding, then `Lane::attach`: the run's
/// un-acked items are taken back (its acks refused) and go to the new consumer in order.
#[test]
fn runs_l8_attach_after_the_consumer_dropped_takes_back_its_outstanding_run() {
    let s = stream(8, &["a"]);
    publish_range(&s, 1..=4);
    let lane = s.lane("a").unwrap();
    let mut old = lane.attach().unwrap();
    let mut run = old.try_recv_run(8).unwrap();
    assert_eq!(run.ack_through_position(Position(1)), Ok(1));
    assert!(matches!(lane.attach(), Err(lanestream::StreamError::ConsumerAttached(_))));
    drop(old);
    // The run still acks while no consumer took the lane over.
    assert_eq!(run.ack_through_position(Position(2)), Ok(1));
    let mut new = lane.attach().unwrap();
    assert_eq!(run.ack(), Err(AckError::Detached));
    let mut got = Vec::new();
    while let Ok(r) = new.try_recv_run(8) {
        got.push((run_positions(&r), r.attempt()));
        r.ack().unwrap();
    }
    assert_eq!(got, vec![(vec![3], 2), (vec![4], 2)]);
    assert_eq!(s.watermark(), Some(Position(4)));
}

/// A deadline already past: `recv_run_deadline` still returns what is there at once, and times
/// out (taking nothing) only when nothing is.
#[test]
fn runs_l12_a_past_deadline_returns_what_is_there_and_times_out_on_nothing() {
    let s = stream(4, &["a"]);
    let mut c = s.attach("a").unwrap();
    let past = Instant::now() - Duration::from_millis(10);
    assert!(c.recv_run_deadline(4, Some(past)).unwrap_err().is_timeout());
    publish_range(&s, 1..=2);
    let run = c.recv_run_deadline(4, Some(past)).unwrap().unwrap();
    assert_eq!(run_positions(&run), [1, 2]);
    assert!(c.recv_run_timeout(4, Duration::ZERO).unwrap_err().is_timeout());
    run.ack().unwrap();
}

/// An item of a run that panics when dropped (M3): acking the run does the bookkeeping (every
/// item acked, the acked position at the end) and drops nothing; the producer's next publish
/// drops the acked items, each exactly once, is done, and then surfaces the panic; the partly
/// acked run still releases its remainder.
#[test]
fn runs_m3_a_panicking_drop_of_acked_run_items_surfaces_at_the_next_publish_after_the_bookkeeping() {
    use std::panic::{catch_unwind, AssertUnwindSafe};

    struct Boom {
        p: u64,
        drops: Arc<Vec<AtomicU8>>,
    }
    impl Item for Boom {
        fn position(&self) -> Option<Position> {
            Some(Position(self.p))
        }
    }
    impl Drop for Boom {
        fn drop(&mut self) {
            self.drops[self.p as usize].fetch_add(1, Ordering::SeqCst);
            if self.p == 2 {
                panic!("Boom 2 panics in Drop (on purpose)");
            }
        }
    }

    let drops: Arc<Vec<AtomicU8>> = Arc::new((0..=7).map(|_| AtomicU8::new(0)).collect());
    let lane: Lane<Boom> = Lane::standalone(SinkName::new("boom").unwrap(), 8).unwrap();
    let mut producer = lane.producer().unwrap();
    for p in 1..=6 {
        producer.publish(Boom { p, drops: drops.clone() }).unwrap();
    }
    let mut c = lane.attach().unwrap();
    let mut run = c.try_recv_run(8).unwrap();
    assert_eq!(run.ack_through(2), Ok(3), "the ack drops nothing");
    assert_eq!(lane.acked(), Some(Position(3)), "items 1..3 are acked");
    assert!((1..=6).all(|p| drops[p].load(Ordering::SeqCst) == 0));
    let r = catch_unwind(AssertUnwindSafe(|| producer.publish(Boom { p: 7, drops: drops.clone() })));
    assert!(r.is_err(), "the drop panic was swallowed");
    for p in 1..=3 {
        assert_eq!(drops[p].load(Ordering::SeqCst), 1, "item {p} dropped once");
    }
    assert_eq!(lane.stats().published, 7, "the publish was done before the panic surfaced");
    assert_eq!(run.sequences(), 3..6);
    drop(run); // releases 4..6
    let mut got = Vec::new();
    while let Ok(r) = c.try_recv_run(8) {
        got.extend(r.iter().map(|b| b.p));
        r.ack().unwrap();
    }
    assert_eq!(got, [4, 5, 6, 7]);
    assert_eq!(lane.acked(), Some(Position(7)));
    drop((c, producer, lane));
    for p in 1..=7 {
        assert_eq!(drops[p].load(Ordering::SeqCst), 1, "item {p} dropped once");
    }
}

/// A run dropped on another thread while the consumer keeps receiving: its items come back in
/// lane order (a released run's second item never before its first, L2), each exactly once,
/// with attempt 2.
#[test]
fn runs_l2_a_run_released_on_another_thread_comes_back_in_order_while_the_consumer_races_it() {
    for round in 0..400u64 {
        let s = stream(16, &["a"]);
        publish_range(&s, 1..=8);
        let mut c = s.attach("a").unwrap();
        let run = c.try_recv_run(8).unwrap();
        let go = Arc::new(AtomicBool::new(false));
        let dropper = {
            let go = go.clone();
            thread::spawn(move || {
                while !go.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                drop(run);
            })
        };
        go.store(true, Ordering::Release);
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.len() < 8 {
            assert!(Instant::now() < deadline, "round {round}: released items lost: {got:?}");
            if let Ok(d) = c.try_recv() {
                got.push((pos(&d), d.attempt()));
                d.ack().unwrap();
            }
        }
        dropper.join().unwrap();
        assert_eq!(got, (1..=8).map(|p| (p, 2)).collect::<Vec<_>>(), "round {round}");
        assert!(s.is_idle());
    }
}

/// The same race with new items queued behind the run: once the run's release has begun, is a
/// new item ever handed out between two of its redeliveries? (L2/L6: a released run is
/// "redelivered before anything new"; the release counts every item before switching any, so
/// a receive in the middle of the switches could take a new item.) Every item still arrives
/// exactly once.
#[test]
fn runs_l2_l6_no_new_item_between_the_redeliveries_of_a_run_released_on_another_thread() {
    let mut interleaved = Vec::new();
    for round in 0..400u64 {
        let s = stream(16, &["a"]);
        publish_range(&s, 1..=8);
        let mut c = s.attach("a").unwrap();
        let run = c.try_recv_run(8).unwrap();
        publish_range(&s, 9..=12);
        let go = Arc::new(AtomicBool::new(false));
        let dropper = {
            let go = go.clone();
            thread::spawn(move || {
                while !go.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                drop(run);
            })
        };
        go.store(true, Ordering::Release);
        let mut got = Vec::new();
        while got.len() < 12 {
            if let Ok(d) = c.try_recv() {
                got.push(pos(&d));
                d.ack().unwrap();
            }
        }
        dropper.join().unwrap();
        let mut sorted = got.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (1..=12).collect::<Vec<_>>(), "round {round}: {got:?}");
        // After the first redelivery, nothing new until the last one.
        let first = got.iter().position(|&p| p <= 8).unwrap();
        let last = got.iter().rposition(|&p| p <= 8).unwrap();
        if got[first..=last].iter().any(|&p| p > 8) {
            interleaved.push((round, got));
        }
    }
    assert!(interleaved.is_empty(), "new items between a released run's redeliveries: {interleaved:?}");
}

/// A fan-out publishing runs while a supervisor closes every lane (`Stream::close`, lane by
/// lane): every item a publish reported as published reaches every lane's consumer (L10: an item
/// published before the close always arrives); a refused item is reported with its index, and
/// lanes that got it anyway (the documented half-way close) got it in order, after all the
/// earlier ones, never a gap.
#[test]
fn fanout_l10_a_close_racing_publish_runs_loses_no_item_reported_as_published() {
    for round in 0..200u64 {
        let s = stream(64, &["a", "b", "c"]);
        let publisher = {
            let s = s.clone();
            thread::spawn(move || {
                let mut fanout = s.fanout().unwrap();
                let mut p = 1u64;
                loop {
                    let mut items: Vec<_> = (p..p + 3).map(batch).collect();
                    match fanout.try_publish_run(&mut items) {
                        Ok(n) => p += n as u64,
                        Err(PublishError::Closed(0)) => return p - 1,
                        Err(PublishError::Full(0)) => return p - 1,
                        Err(e) => panic!("{e:?}"),
                    }
                }
            })
        };
        if round % 2 == 1 {
            thread::yield_now();
        }
        for sink in ["a", "b", "c"] {
            s.close(sink).unwrap();
        }
        let published = publisher.join().unwrap();
        for sink in ["a", "b", "c"] {
            let mut c = s.attach(sink).unwrap();
            let mut got = Vec::new();
            while let Some(run) = c.recv_run(MAX_RUN).unwrap() {
                got.extend(run_positions(&run));
                run.ack().unwrap();
            }
            assert!(
                got.len() as u64 >= published,
                "round {round}, lane {sink}: {} of {published}",
                got.len()
            );
            assert_eq!(got, (1..=got.len() as u64).collect::<Vec<_>>(), "round {round}, lane {sink}");
        }
    }
}

/// `publish_deadline` is `publish_timeout` with the instant given: a full lane makes it hand the
/// item back at the deadline, and no lane keeps a copy.
#[test]
fn fanout_l3_publish_deadline_hands_the_item_back_at_the_deadline() {
    use lanestream::{Batch, LaneItem, MemoryStream, Position};
    use std::time::{Duration, Instant};
    let stream = MemoryStream::builder().capacity(1).sink("a").sink("b").build().unwrap();
    let mut fan = stream.fanout().unwrap();
    let item = |p: u64| LaneItem::Batch(Batch::new(Some(Position(p)), Vec::new().into()));
    fan.publish(item(1)).unwrap();
    let start = Instant::now();
    let err = fan.publish_deadline(item(2), Some(start + Duration::from_millis(50))).unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    assert!(start.elapsed() >= Duration::from_millis(50));
    assert_eq!(err.into_inner().position(), Some(Position(2)));
    for sink in ["a", "b"] {
        assert_eq!(stream.lane(sink).unwrap().stats().published, 1, "lane {sink} got only the first item");
    }
}
