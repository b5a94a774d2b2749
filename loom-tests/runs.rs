//! Loom models 13-17 and 14b: runs — one seat step delivering several items, one advancer request for
//! a run's acks, one `released` count and one wake-up for a released run — and the fan-out
//! producer (its run publish, and its wait for room seeing any lane's close).

use lanestream::prelude::*;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use lanestream::{
    Consumer, Fanout, Lane, LaneItem, MemoryStream, Position, PublishError, Run, Stream, TryRecvError,
};
use loom::sync::Arc;
use loom::thread;

use crate::support::{self, batch, check, Cells, Flag};

/// Model 13: receiving and acking in runs across a wrap while the producer waits for room.
///
/// Capacity 2, four items: the producer publishes 1..=4 (blocking for room from item 3 on; items
/// 3 and 4 reuse the slots of 1 and 2) and writes a plain cell before each publish; the
/// consumer receives with `recv_run(2)` (blocking) and acks each run whole. Checked:
/// - every item of a run is read as published (the `tail` Release -> the run step's one
///   Acquire load of `tail` covers every slot of the run; loom checks each slot cell) and the
///   producer's writes before publishing are visible;
/// - the producer reuses a slot only after the run holding its item was acked and the advancer
///   emptied it (the `free` Release -> producer Acquire pair), and its wait for room is woken by
///   the run's single advancer request (no per-item request exists to wake it otherwise);
/// - order, attempt 1, the acked position, the watermark and idleness at the end.
///
/// Why the bound suffices: two threads, as model 1; each hand-off is one Release read by one
/// Acquire, and the producer's park needs one preemption between its room check and its
/// registration. Bound 3 covers both placements on each side.
#[test]
fn runs_across_a_wrap_while_the_producer_waits() {
    support::model("runs_across_a_wrap_while_the_producer_waits", 3, || {
        let stream = MemoryStream::builder().capacity(2).request_capacity(1).sink("a").build().unwrap();
        let lane = stream.lane("a").unwrap();
        let mut producer = stream.fanout().unwrap();
        let mut consumer = lane.reattach();
        let cells = Arc::new(Cells::new(4));
        let written = cells.clone();
        let t = thread::spawn(move || {
            for i in 0..4u64 {
                written.write(i as usize, 100 + i);
                producer.publish(batch(i + 1)).unwrap();
            }
        });
        let mut next = 1;
        while next <= 4 {
            let run = consumer.recv_run(2).unwrap().expect("lane not closed");
            assert_eq!(run.attempt(), 1);
            assert!(!run.is_empty() && run.len() <= 2);
            for item in &run {
                check(item, next);
                assert_eq!(cells.read(next as usize - 1), 99 + next, "write before publish not visible");
                next += 1;
            }
            run.ack().unwrap();
        }
        t.join().unwrap();
        assert_eq!(lane.acked(), Some(Position(4)));
        assert_eq!(stream.watermark(), Some(Position(4)));
        assert!(stream.is_idle());
    });
}

/// Model 14: a re-attach racing the late ack of a whole run (L8).
///
/// Capacity 2; the old consumer receives items 1 and 2 as one run and hands it to a thread that
/// reads both items and acks the run. Meanwhile the main thread re-attaches, receives whatever
/// the re-attach released (in runs), acks it, and tries to publish item 3 into item 1's slot.
/// Checked:
/// - each item's ack lands xor the item is redelivered: the run's ack is `Ok` exactly when
///   nothing was redelivered, every redelivery has attempt 2, and at the end nothing is released
///   or outstanding (a run ack that overwrote a taken-back item would leave it counted as
///   released and never redelivered, or acked twice);
/// - no slot is reused while the stale run reads its item (`holders`): item 3's write would
///   race the late reader (loom checks the slot cell), so `try_publish` says `Full` until the
///   run has ended.
///
/// Why the bound suffices: the decisive races are the run's ack against the re-attach, both
/// seat steps (P21: the ack's seat compare-and-swap against the re-attach's, and the refused
/// ack's wait for the re-attach to give the seat back before it ends the stale items), and the
/// stale reader against the reclaim, each needing one preemption inside the other thread's
/// window. Bound 3 covers those and the reader being preempted between its reads and its ack.
#[test]
fn reattach_racing_a_runs_late_ack() {
    support::model("reattach_racing_a_runs_late_ack", 3, || {
        let (stream, lane, mut producer, mut old, run) = a_run_of_two();

        let t = thread::spawn(move || {
            for (i, item) in run.iter().enumerate() {
                check(item, i as u64 + 1);
            }
            run.ack().is_ok()
        });

        let mut new = lane.reattach();
        let mut redelivered = 0;
        loop {
            match new.try_recv_run(2) {
                Ok(r) => {
                    assert_eq!(r.attempt(), 2, "a redelivery counts its attempt");
                    redelivered += r.len();
                    r.ack().unwrap();
                }
                Err(TryRecvError::Empty) => break,
                Err(e) => panic!("new consumer: {e:?}"),
            }
        }
        let third = producer.try_publish(batch(3));
        let landed = t.join().unwrap();
        assert_eq!(landed, redelivered == 0, "late run ack ok: {landed}, redelivered: {redelivered}");
        assert!(matches!(old.try_recv_run(2), Err(TryRecvError::Detached)));
        let stats = lane.stats();
        assert_eq!((stats.released, stats.in_flight, stats.acked_items), (0, 0, 2));
        assert_eq!(lane.acked(), Some(Position(2)));
        match third {
            Ok(()) => {}
            Err(PublishError::Full(item)) => producer.try_publish(item).unwrap(),
            Err(e) => panic!("publish: {e:?}"),
        }
        let r = new.try_recv_run(2).unwrap();
        check(r.get(0).unwrap(), 3);
        r.ack().unwrap();
        assert!(stream.is_idle());
    });
}

/// Model 14b: a plain run (P26) acked in part and released on another thread while the main
/// thread re-attaches.
///
/// Capacity 2; the old consumer receives items 1 and 2 as one run while nothing else is in
/// flight, so the run is plain (no state word written). A thread reads both items, acks item 1
/// (`ack_through`) and drops the run (releasing item 2); meanwhile the main thread re-attaches,
/// drains what it is handed (acking each), and tries to publish item 3 into item 1's slot.
/// Checked:
/// - item 1 lands xor is redelivered (the `ack_through` is `Ok` exactly when the new consumer
///   never saw item 1), item 2 is redelivered exactly once (by the release or by the
///   re-attach, never both), every redelivery has attempt 2;
/// - no slot is reused while the old run reads its item: item 3's write would race the late
///   reader (loom checks the cell), so `try_publish` says `Full` until then;
/// - the acked position and the counts at the end.
///
/// Why the bound suffices: the decisive races are the seat taken by the plain ack or the
/// release against the re-attach's seat (the old run's step preempted between its epoch check
/// and its holder decrements, or the re-attach between its epoch swap and its take-back), and
/// the late reader against the reclaim; each needs one preemption inside the other thread's
/// step, and bound 2 lets both happen in one execution. It also passed at bound 3 by hand
/// (5,374,213 executions, 451 s on the 2-core machine).
#[test]
fn reattach_racing_a_plain_runs_partial_ack_and_release() {
    support::model("reattach_racing_a_plain_runs_partial_ack_and_release", 2, || {
        let (stream, lane, mut producer, _old, mut run) = a_run_of_two();

        let t = thread::spawn(move || {
            for (i, item) in run.iter().enumerate() {
                check(item, i as u64 + 1);
            }
            let first = run.sequences().start;
            let landed = run.ack_through(first).is_ok();
            drop(run);
            landed
        });

        let mut new = lane.reattach();
        let mut seen = Vec::new();
        // Redeliveries (attempt 2) go to `seen`; item 3, once published, is a first delivery.
        let drain = |new: &mut Consumer<LaneItem>, seen: &mut Vec<u64>| loop {
            match new.try_recv_run(2) {
                Ok(r) => {
                    for item in &r {
                        let p = item.position().unwrap().0;
                        assert_eq!(r.attempt(), if p == 3 { 1 } else { 2 }, "attempt of item {p}");
                        if p == 3 {
                            check(item, 3);
                        } else {
                            seen.push(p);
                        }
                    }
                    r.ack().unwrap();
                }
                Err(TryRecvError::Empty) => break,
                Err(e) => panic!("new consumer: {e:?}"),
            }
        };
        drain(&mut new, &mut seen);
        let third = producer.try_publish(batch(3));
        let landed = t.join().unwrap();
        drain(&mut new, &mut seen);
        seen.sort_unstable();
        let expected: &[u64] = if landed { &[2] } else { &[1, 2] };
        assert_eq!(seen, expected, "item 1 acked by the old run: {landed}");
        match third {
            // Published while the old run still ran: drained above, after the redeliveries.
            Ok(()) => assert_eq!(lane.acked(), Some(Position(3))),
            Err(PublishError::Full(item)) => {
                let stats = lane.stats();
                assert_eq!((stats.released, stats.in_flight, stats.acked_items), (0, 0, 2));
                assert_eq!(lane.acked(), Some(Position(2)));
                producer.try_publish(item).unwrap();
                let r = new.try_recv_run(2).unwrap();
                check(r.get(0).unwrap(), 3);
                r.ack().unwrap();
            }
            Err(e) => panic!("publish: {e:?}"),
        }
        assert_eq!(lane.stats().acked_items, 3);
        assert!(stream.is_idle());
    });
}

/// How models 14, 14b, 15 and 15b start: capacity 2, one lane, items 1 and 2 received by the consumer
/// `old` as one run (plain: nothing else is in flight).
fn a_run_of_two() -> (MemoryStream, Lane<LaneItem>, Fanout, Consumer<LaneItem>, Run<LaneItem>) {
    let stream = MemoryStream::builder().capacity(2).request_capacity(1).sink("a").build().unwrap();
    let lane = stream.lane("a").unwrap();
    let mut producer = stream.fanout().unwrap();
    let mut old = lane.reattach();
    producer.try_publish(batch(1)).unwrap();
    producer.try_publish(batch(2)).unwrap();
    let run = old.try_recv_run(2).unwrap();
    assert_eq!(run.len(), 2);
    (stream, lane, producer, old, run)
}

/// Model 15: a run released on another thread wakes the consumer parked in `recv_run`.
///
/// Capacity 2; items 1 and 2 are received as one run, which a thread nacks (one `released`
/// increment for both, then the two switches to `RELEASED`, then one wake-up) while the main
/// thread blocks in `recv_run`. Checked: the consumer is woken (a lost wake-up is a loom
/// deadlock) and receives both items again, in order, attempt 2, one run each; nothing
/// overtakes them (L2) and the counts end at zero.
///
/// Why the bound suffices: one notifier and one waiter, as model 5a: the lost wake-up needs one
/// preemption between the waiter's check and its registration, and the count-before-switch
/// order one between the increment and a switch. Bound 3 covers both.
#[test]
fn a_released_run_wakes_a_parked_recv_run() {
    support::model("a_released_run_wakes_a_parked_recv_run", 3, || {
        let (stream, lane, _producer, mut consumer, run) = a_run_of_two();
        let t = thread::spawn(move || run.nack());
        for p in 1..=2 {
            let again = consumer.recv_run(2).unwrap().unwrap();
            assert_eq!((again.len(), again.attempt()), (1, 2));
            check(again.get(0).unwrap(), p);
            again.ack().unwrap();
        }
        t.join().unwrap();
        let stats = lane.stats();
        assert_eq!((stats.released, stats.in_flight), (0, 0));
        assert_eq!(lane.acked(), Some(Position(2)));
        assert!(stream.is_idle());
    });
}

/// Model 15b: model 15 with `recv_run_async`: a run released on another thread while the
/// consumer's future is pending.
///
/// The future is polled with a waker that unparks the main thread, and polled again (with a new
/// waker) after each wake-up. Besides the wake-up itself, this reaches the poll that finds the
/// lane readable (the release is counted) but nothing to take (the slots are not switched yet):
/// after the second such try in one poll, the poll returns `Pending` and wakes itself instead of
/// spinning, and the next poll takes the item (the model yields between polls, as an executor
/// runs other work). Checked as model 15; a lost wake-up (or a self-wake forgotten) is a loom
/// deadlock.
///
/// Why the bound suffices: as model 15.
#[test]
fn a_released_run_wakes_a_pending_recv_run_async() {
    support::model("a_released_run_wakes_a_pending_recv_run_async", 3, || {
        let (stream, lane, _producer, mut consumer, run) = a_run_of_two();
        let t = thread::spawn(move || run.nack());
        for p in 1..=2 {
            let mut fut = std::pin::pin!(consumer.recv_run_async(2));
            let again = loop {
                let (flag, waker) = support::Flag::new();
                match fut.as_mut().poll(&mut Context::from_waker(&waker)) {
                    Poll::Ready(r) => break r.unwrap().expect("not closed"),
                    Poll::Pending => {
                        flag.wait();
                        // An executor runs other work between polls (a self-woken future
                        // included); under loom that is a yield, or a self-wake would spin.
                        thread::yield_now();
                    }
                }
            };
            assert_eq!((again.len(), again.attempt()), (1, 2));
            check(again.get(0).unwrap(), p);
            again.ack().unwrap();
        }
        t.join().unwrap();
        let stats = lane.stats();
        assert_eq!((stats.released, stats.in_flight), (0, 0));
        assert_eq!(lane.acked(), Some(Position(2)));
        assert!(stream.is_idle());
    });
}

/// Model 15c: a run released on another thread while a newer item is queued: the released
/// items come back before it ([L2](lanestream::contract#l2)), even while the release is half-way.
///
/// Capacity 3, items 1, 2 and 3 published; items 1 and 2 are received as one run, which a thread
/// nacks (under the consumer's seat: one `released` increment for both, then the two switches to
/// `RELEASED`). The main thread receives three times with `recv_run(1)`, and only counts what it
/// got after it has seen a redelivery (before that, item 3 may legitimately come first: the nack
/// has not started). Checked: once item 1 came back, item 2 comes back before item 3.
///
/// Why the bound suffices: the race is the consumer's step against the nack's seat step (a
/// receive that took the seat first, one that waits for the nack's); one preemption inside the
/// nack places the receive there, and bound 3 also covers the consumer being preempted inside
/// its scan. Since the run's release holds the seat, no receive sees it half-way; the model
/// passes without the receive's half-way guard too (row 53).
#[test]
fn l2_a_half_released_run_is_not_overtaken_by_a_queued_item() {
    support::model("l2_a_half_released_run_is_not_overtaken_by_a_queued_item", 3, || {
        let stream = MemoryStream::builder().capacity(3).request_capacity(1).sink("a").build().unwrap();
        let lane = stream.lane("a").unwrap();
        let mut producer = stream.fanout().unwrap();
        let mut consumer = lane.reattach();
        for p in 1..=3 {
            producer.try_publish(batch(p)).unwrap();
        }
        let run = consumer.try_recv_run(2).unwrap();
        assert_eq!(run.len(), 2);
        let t = thread::spawn(move || run.nack());
        let mut got = Vec::new();
        while got.len() < 3 {
            let r = consumer.recv_run(1).unwrap().expect("not closed");
            let p = support::envelopes(r.get(0).unwrap())[0].position.unwrap().0;
            got.push((p, r.attempt()));
            r.ack().unwrap();
        }
        t.join().unwrap();
        // Either item 3 came before the nack started, or the redeliveries came first, in order.
        let ok = got == [(3, 1), (1, 2), (2, 2)] || got == [(1, 2), (2, 2), (3, 1)];
        assert!(ok, "received {got:?}");
        assert!(stream.is_idle());
    });
}

/// Model 16: the fan-out producer publishing a run to two lanes with one publication step per
/// lane, while each lane's consumer receives a run on its own thread.
///
/// Capacity 2, two lanes: `publish_run(&mut vec![1, 2])` writes items 1 and 2 into each lane and
/// publishes both with one compare-and-swap of the cells' one cursor (for every lane); lane "a" is consumed on the main
/// thread, lane "b" on another, each with blocking `recv_run(2)` and one ack per run. Checked:
/// - each consumer reads every item of a run as written (the lane's one Release
///   compare-and-swap covers both slots; loom checks the slot cells), and the producer's write
///   before publishing is visible;
/// - a consumer that parked before the publish is woken by it (one `ITEMS_WANTED` check per
///   lane per run);
/// - order, and the watermark at the end.
///
/// The fan-out's wait for room in every lane is the lanes' own wait (models 2, 5b, 13) and is
/// checked natively (`tests/lanes/fanout.rs`); a third consumer thread plus that wait makes a model
/// that does not finish in minutes.
///
/// Why the bound suffices: three threads; each hand-off is one Release read by one Acquire, and
/// a consumer's park needs one preemption between its check and its registration; bound 2 places
/// one preemption on each side of either, and bound 3 (8,546 executions, about a second) is used.
#[test]
fn fanout_run_to_two_lanes_while_consumers_receive_runs() {
    support::model("fanout_run_to_two_lanes_while_consumers_receive_runs", 3, || {
        let stream =
            MemoryStream::builder().capacity(2).request_capacity(1).sinks(["a", "b"]).build().unwrap();
        let mut fanout = stream.fanout().unwrap();
        let mut consumers: Vec<_> = stream.lanes().map(|lane| lane.reattach()).collect();
        let cells = Arc::new(Cells::new(1));
        let written = cells.clone();
        let p = thread::spawn(move || {
            written.write(0, 7);
            fanout.publish_run(&mut vec![batch(1), batch(2)]).unwrap();
        });
        let drain = |consumer: &mut Consumer<LaneItem>, cells: &Cells| {
            let mut next = 1;
            while next <= 2 {
                let run = consumer.recv_run(2).unwrap().unwrap();
                for item in &run {
                    check(item, next);
                    next += 1;
                }
                assert_eq!(cells.read(0), 7, "write before publish not visible");
                run.ack().unwrap();
            }
        };
        let mut b = consumers.pop().unwrap();
        let cells_b = cells.clone();
        let tb = thread::spawn(move || drain(&mut b, &cells_b));
        drain(&mut consumers[0], &cells);
        tb.join().unwrap();
        p.join().unwrap();
        assert_eq!(stream.watermark(), Some(Position(2)));
        assert!(stream.is_idle());
    });
}

/// Model 17: a fan-out publish waiting for room on one lane while another thread closes a
/// *different* lane, blocking (17a) and async (17b).
///
/// Capacity 1, lanes "a" and "b": item 1 is published to both and acked on "b" only, so "a" is
/// full and "b" has room. The main thread publishes item 2 (`publish`, or `publish_async` polled
/// with a waker that unparks it) while a second thread closes lane "b". Checked: the publish
/// ends with `Closed` and its item whichever way the close and the wait interleave — the wait
/// registers on the cells' one room list before it re-checks the cursor's `CLOSED`, and a close
/// of any lane notifies that list after setting it (register-then-check against
/// change-then-notify, P20 of the memory-ordering chapter).
///
/// Fails when its protection is removed (section 9, row 43): without the close's notify of the
/// room list (`Cells::close`), the publish parks waiting for lane "a" for ever and loom reports
/// the deadlock.
///
/// Why the bound suffices: two threads; the race is the closer's flag-then-notify against the
/// waiter's register-then-check, which one preemption can interleave any way; bound 2 covers a
/// second preemption inside the waiter's loop (a wake-up left over from an earlier round).
#[test]
fn fanout_wait_for_room_sees_another_lanes_close_blocking() {
    support::model("fanout_wait_for_room_sees_another_lanes_close_blocking", 2, || {
        let (stream, mut fanout) = fanout_with_lane_a_full();
        let lane_b = stream.lane("b").unwrap();
        let closer = thread::spawn(move || lane_b.close());
        let r = fanout.publish(batch(2));
        assert!(matches!(r, Err(PublishError::Closed(ref i)) if i.position() == Some(Position(2))), "{r:?}");
        closer.join().unwrap();
    });
}

/// Model 17b: as 17a, with `publish_async`.
#[test]
fn fanout_wait_for_room_sees_another_lanes_close_async() {
    support::model("fanout_wait_for_room_sees_another_lanes_close_async", 2, || {
        let (stream, mut fanout) = fanout_with_lane_a_full();
        let lane_b = stream.lane("b").unwrap();
        let closer = thread::spawn(move || lane_b.close());
        let mut publish = fanout.publish_async(batch(2));
        let r = loop {
            let (flag, waker) = Flag::new();
            match Pin::new(&mut publish).poll(&mut Context::from_waker(&waker)) {
                Poll::Ready(r) => break r,
                Poll::Pending => flag.wait(),
            }
        };
        assert!(matches!(r, Err(PublishError::Closed(ref i)) if i.position() == Some(Position(2))), "{r:?}");
        drop(publish);
        closer.join().unwrap();
    });
}

/// A stream of capacity 1 with lanes "a" and "b" and its fan-out producer, item 1 published to
/// both and acked on "b": lane "a" full, lane "b" with room.
fn fanout_with_lane_a_full() -> (MemoryStream, Fanout) {
    let stream = MemoryStream::builder().capacity(1).request_capacity(1).sinks(["a", "b"]).build().unwrap();
    let mut fanout = stream.fanout().unwrap();
    fanout.try_publish(batch(1)).unwrap();
    let mut b = stream.lane("b").unwrap().reattach();
    b.try_recv().unwrap().ack().unwrap();
    drop(b);
    (stream, fanout)
}
