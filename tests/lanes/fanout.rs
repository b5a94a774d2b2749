//! The fan-out publisher (`MemoryStream::fanout`, [`Fanout`]): the lane rules for a publisher
//! that publishes to every lane at once, named after the rule each test shows.

use crate::common;
use lanestream::prelude::*;

use std::future::Future;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::{batch, shared_envelopes, snapshot, stream, tracked, within};
use lanestream::{LaneItem, Position, PublishError, Stream, TryRecvError};

#[test]
fn fanout_l2_publishes_each_item_to_every_lane_in_order() {
    let s = stream(8, &["a", "b", "c"]);
    let mut fanout = s.fanout().unwrap();
    assert_eq!(fanout.lanes(), 3);
    fanout.publish(batch(1)).unwrap();
    fanout.try_publish(snapshot()).unwrap();
    assert_eq!(fanout.publish_run(&mut vec![batch(2), batch(3)]), Ok(()));
    assert_eq!(fanout.try_publish_run(&mut vec![batch(4)]), Ok(1));
    for sink in ["a", "b", "c"] {
        let mut consumer = s.attach(sink).unwrap();
        let run = consumer.try_recv_run(8).unwrap();
        let got: Vec<_> = run.iter().map(|i| i.position().map(|p| p.0)).collect();
        assert_eq!(got, [Some(1), None, Some(2), Some(3), Some(4)], "lane {sink}");
        run.ack().unwrap();
    }
    assert_eq!(s.watermark(), Some(Position(4)));
    assert!(s.is_idle());
}

#[test]
fn fanout_l3_an_item_goes_to_every_lane_or_none_full_hands_it_back() {
    let s = stream(2, &["a", "b"]);
    let mut fanout = s.fanout().unwrap();
    fanout.try_publish(batch(1)).unwrap();
    fanout.try_publish(batch(2)).unwrap();
    // Lane "a" makes room, lane "b" does not: nothing is published anywhere.
    let mut a = s.attach("a").unwrap();
    a.try_recv_run(8).unwrap().ack().unwrap();
    let err = fanout.try_publish(batch(3)).unwrap_err();
    assert!(err.is_full());
    assert_eq!(err.into_inner().position(), Some(Position(3)));
    assert_eq!(s.stats("a").unwrap().published, 2);
    // A run publishes the prefix every lane has room for: none here.
    assert_eq!(fanout.try_publish_run(&mut vec![batch(3), batch(4)]), Err(PublishError::Full(0)));
    // The blocking publish waits for lane "b".
    let sb = s.clone();
    let acker = thread::spawn(move || {
        thread::sleep(Duration::from_millis(20));
        let mut b = sb.attach("b").unwrap();
        b.try_recv_run(1).unwrap().ack().unwrap();
        b
    });
    within(10, "fan-out publish waiting for room", move || {
        fanout.publish(batch(3)).unwrap();
        fanout
    });
    let b = acker.join().unwrap();
    drop(b);
    assert_eq!(s.stats("a").unwrap().published, 3);
    assert_eq!(s.stats("b").unwrap().published, 3);
}

#[test]
fn fanout_l3_publish_run_fills_what_fits_then_waits() {
    let s = stream(3, &["a", "b"]);
    let mut fanout = s.fanout().unwrap();
    let mut items: Vec<_> = (1..=7).map(batch).collect();
    assert_eq!(fanout.try_publish_run(&mut items), Ok(3));
    assert_eq!(items.iter().map(|i| i.position().unwrap().0).collect::<Vec<_>>(), [4, 5, 6, 7]);
    let consumers: Vec<_> = ["a", "b"]
        .iter()
        .map(|n| {
            let mut c = s.attach(n).unwrap();
            thread::spawn(move || {
                let mut got = Vec::new();
                while let Some(run) = c.recv_run(8).unwrap() {
                    got.extend(run.iter().map(|i| i.position().unwrap().0));
                    run.ack().unwrap();
                }
                got
            })
        })
        .collect();
    let t = thread::spawn(move || {
        fanout.publish_run(&mut items).unwrap();
        assert!(items.is_empty());
        fanout.close();
    });
    for c in consumers {
        let got = within(10, "a sink draining a fan-out run", move || c.join().unwrap());
        assert_eq!(got, (1..=7).collect::<Vec<_>>());
    }
    t.join().unwrap();
    assert_eq!(s.watermark(), Some(Position(7)));
}

#[test]
fn fanout_l4_positions_are_checked_against_every_lane_before_anything_is_written() {
    let s = stream(8, &["a", "b"]);
    let mut fanout = s.fanout().unwrap();
    fanout.publish(batch(5)).unwrap();
    let err = fanout.try_publish(batch(5)).unwrap_err();
    assert!(matches!(err, PublishError::PositionRegressed { position: Position(5), last: Position(5), .. }));
    assert!(matches!(fanout.try_publish(batch(u64::MAX)), Err(PublishError::InvalidPosition(_))));
    // A run stops before the first item that would be refused, which stays in the caller's
    // `Vec` with the rest; an error's payload is how many were published.
    let at = |v: &Vec<LaneItem>| v.iter().map(|i| i.position().unwrap().0).collect::<Vec<_>>();
    let mut run = vec![batch(6), batch(7), batch(7), batch(8)];
    assert_eq!(fanout.try_publish_run(&mut run), Ok(2));
    assert_eq!(at(&run), [7, 8]);
    assert!(matches!(
        fanout.try_publish_run(&mut run),
        Err(PublishError::PositionRegressed { item: 0, position: Position(7), last: Position(7) })
    ));
    assert_eq!(at(&run), [7, 8], "handed back untouched");
    let mut run = vec![batch(8), batch(3), batch(9)];
    assert!(matches!(fanout.publish_run(&mut run), Err(PublishError::PositionRegressed { item: 1, .. })));
    assert_eq!(at(&run), [3, 9], "exactly the items not published");
    for sink in ["a", "b"] {
        assert_eq!(s.stats(sink).unwrap().published, 4, "lane {sink}");
    }
}

#[test]
fn fanout_l10_close_refuses_on_every_lane_and_consumers_drain() {
    let s = stream(4, &["a", "b"]);
    let mut fanout = s.fanout().unwrap();
    fanout.publish(batch(1)).unwrap();
    s.close("b").unwrap();
    let err = fanout.try_publish(batch(2)).unwrap_err();
    assert!(matches!(err, PublishError::Closed(_)));
    assert_eq!(err.into_inner().position(), Some(Position(2)));
    assert_eq!(s.stats("a").unwrap().published, 1, "a refused item reached lane a");
    assert_eq!(fanout.publish_run(&mut vec![batch(2)]), Err(PublishError::Closed(0)));
    fanout.close();
    for sink in ["a", "b"] {
        let mut c = s.attach(sink).unwrap();
        let run = c.recv_run(8).unwrap().unwrap();
        assert_eq!(run.len(), 1);
        run.ack().unwrap();
        assert!(c.recv_run(8).unwrap().is_none());
        assert_eq!(c.try_recv().unwrap_err(), TryRecvError::Closed);
    }
}

/// The async form: ready at once with room; while a lane is full it is pending (its waker
/// registered, no spinning) and an ack on the full lane wakes it; then every lane has the item.
#[test]
fn fanout_l3_publish_async_waits_for_room_on_every_lane_and_an_ack_wakes_it() {
    let s = stream(1, &["a", "b"]);
    let mut fanout = s.fanout().unwrap();
    futures_executor::block_on(fanout.publish_async(batch(1))).unwrap();
    let mut b = s.attach("b").unwrap();
    b.try_recv().unwrap().ack().unwrap(); // lane b has room, lane a is full
    let (count, waker) = common::CountingWaker::new();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut publish = fanout.publish_async(batch(2));
    assert!(std::pin::Pin::new(&mut publish).poll(&mut cx).is_pending());
    assert_eq!(count.wakes(), 0);
    let mut a = s.attach("a").unwrap();
    a.try_recv().unwrap().ack().unwrap();
    assert!(count.wakes() >= 1, "the ack on the full lane woke the publish");
    assert!(matches!(std::pin::Pin::new(&mut publish).poll(&mut cx), std::task::Poll::Ready(Ok(()))));
    drop(publish);
    for c in [&mut a, &mut b] {
        assert_eq!(c.try_recv().unwrap().position(), Some(Position(2)));
    }
}

/// A close of a lane other than the full one wakes a waiting publish at once, blocking and
/// async, and the publish returns `Closed` with its item (L10): no lane got it.
#[test]
fn fanout_l10_a_close_of_another_lane_wakes_a_waiting_publish_blocking_and_async() {
    // Blocking: the publish waits on lane a (full) when lane b is closed.
    let s = stream(1, &["a", "b"]);
    let mut fanout = s.fanout().unwrap();
    fanout.publish(batch(1)).unwrap();
    s.attach("b").unwrap().try_recv().unwrap().ack().unwrap();
    let lane_b = s.lane("b").unwrap();
    let closer = thread::spawn(move || {
        thread::sleep(Duration::from_millis(30));
        lane_b.close();
    });
    let r = within(5, "a fan-out publish waiting on lane a after lane b's close", move || {
        fanout.publish(batch(2))
    });
    closer.join().unwrap();
    assert!(matches!(r, Err(PublishError::Closed(ref i)) if i.position() == Some(Position(2))), "{r:?}");

    // Async: pending on lane a; lane b's close wakes the task.
    let s = stream(1, &["a", "b"]);
    let mut fanout = s.fanout().unwrap();
    fanout.publish(batch(1)).unwrap();
    s.attach("b").unwrap().try_recv().unwrap().ack().unwrap();
    let (count, waker) = common::CountingWaker::new();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut publish = fanout.publish_async(batch(2));
    assert!(std::pin::Pin::new(&mut publish).poll(&mut cx).is_pending());
    s.lane("b").unwrap().close();
    assert!(count.wakes() >= 1, "lane b's close woke the publish waiting on lane a");
    let r = std::pin::Pin::new(&mut publish).poll(&mut cx);
    assert!(
        matches!(r, std::task::Poll::Ready(Err(PublishError::Closed(ref i))) if i.position() == Some(Position(2))),
        "{r:?}"
    );
    drop(publish);
    let mut a = s.attach("a").unwrap();
    let first = a.try_recv().unwrap();
    assert_eq!(first.position(), Some(Position(1)));
    assert!(a.try_recv().is_err(), "lane a got nothing more");
}

#[test]
fn fanout_l3_the_slowest_lane_holds_every_lanes_room() {
    let s = stream(2, &["a", "b"]);
    let mut fanout = s.fanout().unwrap();
    let (mut a, mut b) = (s.attach("a").unwrap(), s.attach("b").unwrap());
    fanout.publish_run(&mut vec![batch(1), batch(2)]).unwrap();
    a.try_recv_run(2).unwrap().ack().unwrap();
    // Lane "a" acked both, lane "b" none: no cell is free.
    assert!(matches!(fanout.try_publish(batch(3)), Err(PublishError::Full(_))));
    let run = b.try_recv_run(1).unwrap();
    run.ack().unwrap();
    fanout.try_publish(batch(3)).unwrap();
    assert!(matches!(fanout.try_publish(batch(4)), Err(PublishError::Full(_))));
    // Each lane reads its items in place, the reused cell included.
    let got: Vec<_> = b.try_recv_run(4).unwrap().iter().map(|i| i.position().unwrap().0).collect();
    assert_eq!(got, [2, 3]);
    let got: Vec<_> = a.try_recv_run(4).unwrap().iter().map(|i| i.position().unwrap().0).collect();
    assert_eq!(got, [3]);
}

/// M2/M3: the fan-out writes one copy of each item for every lane (a clone of the item's `Arc`,
/// never of the envelopes), and drops it once: at its next publish after every lane acked it
/// (or its drop), else with the stream.
#[test]
fn fanout_m3_one_copy_for_every_lane_dropped_once_at_the_next_publish_after_every_lane_acked_it() {
    let envelopes = shared_envelopes(7);
    let owners = || Arc::strong_count(&envelopes) - 1;
    let s = stream(2, &["a", "b"]);
    let mut fanout = s.fanout().unwrap();
    let (mut a, mut b) = (s.attach("a").unwrap(), s.attach("b").unwrap());
    fanout.publish(tracked(Some(1), &envelopes)).unwrap();
    // One copy in the stream's cell, not one per lane.
    assert_eq!(owners(), 1);
    a.try_recv().unwrap().ack().unwrap();
    assert_eq!(owners(), 1, "lane b still holds it");
    b.try_recv().unwrap().ack().unwrap();
    // Acked by every lane, still in its cell until the fan-out's next publish.
    assert_eq!(owners(), 1);
    // The run's originals are temporaries, dropped after the call; the publish dropped item 1.
    fanout.publish_run(&mut vec![tracked(Some(2), &envelopes), tracked(Some(3), &envelopes)]).unwrap();
    assert_eq!(owners(), 2, "items 2 and 3; item 1 dropped by the publish");
    for c in [&mut a, &mut b] {
        c.try_recv_run(2).unwrap().ack().unwrap();
    }
    fanout.publish(tracked(Some(4), &envelopes)).unwrap(); // reuses item 2's cell, drops 2 and 3
    assert_eq!(owners(), 1);
    fanout.publish(tracked(Some(5), &envelopes)).unwrap();
    for c in [&mut a, &mut b] {
        c.try_recv().unwrap().ack().unwrap();
    }
    assert_eq!(owners(), 2);
    drop(fanout); // drops item 4 (acked by both); item 5 is not acked yet
    assert_eq!(owners(), 1);
    drop((a, b));
    drop(s);
    assert_eq!(owners(), 0);
}

#[test]
fn fanout_l8_a_stale_run_keeps_reading_its_item_while_the_other_lane_moves_on() {
    let s = stream(1, &["a", "b"]);
    let mut fanout = s.fanout().unwrap();
    let mut a = s.attach("a").unwrap();
    let mut b = s.attach("b").unwrap();
    fanout.publish(batch(1)).unwrap();
    let stale = a.try_recv_run(1).unwrap();
    let mut a2 = s.reattach("a").unwrap();
    b.try_recv().unwrap().ack().unwrap();
    a2.try_recv().unwrap().ack().unwrap();
    // Both lanes acked item 1, but the stale run still reads it: its cell is not reused.
    assert!(matches!(fanout.try_publish(batch(2)), Err(PublishError::Full(_))));
    assert_eq!(stale.get(0).unwrap().position(), Some(Position(1)));
    assert_eq!(stale.ack(), Err(lanestream::AckError::Detached));
    fanout.try_publish(batch(2)).unwrap();
    assert_eq!(a2.try_recv().unwrap().item().position(), Some(Position(2)));
}

#[test]
fn fanout_l11_w5_publish_to_reaches_one_lane_and_its_gaps_are_passed() {
    let s = stream(4, &["a", "b", "c"]);
    let mut fanout = s.fanout().unwrap();
    let mut consumers: Vec<_> = ["a", "b", "c"].iter().map(|n| s.attach(n).unwrap()).collect();
    fanout.publish(batch(1)).unwrap();
    fanout.publish_to(1, snapshot()).unwrap();
    fanout.try_publish_to(1, snapshot()).unwrap();
    fanout.publish(batch(2)).unwrap();
    for (i, c) in consumers.iter_mut().enumerate() {
        let mut got = Vec::new();
        while let Ok(run) = c.try_recv_run(8) {
            got.extend(run.iter().map(|item| item.position().map(|p| p.0)));
            run.ack().unwrap();
        }
        let want: &[Option<u64>] = if i == 1 { &[Some(1), None, None, Some(2)] } else { &[Some(1), Some(2)] };
        assert_eq!(got, want, "lane {i}");
        assert!(c.is_empty(), "lane {i} passed its gaps");
    }
    assert_eq!(s.watermark(), Some(Position(2)));
    assert!(s.is_idle());
    // The gaps took cells of every lane and were acked on the way past: the cells are free.
    for p in 3..7 {
        fanout.try_publish(batch(p)).unwrap();
    }
}

#[test]
fn fanout_l11_publish_to_single_receives_pass_gaps_and_wake_a_parked_consumer() {
    let s = stream(2, &["a", "b"]);
    let mut fanout = s.fanout().unwrap();
    let mut a = s.attach("a").unwrap();
    let mut b = s.attach("b").unwrap();
    let parked = thread::spawn(move || {
        // Wakes for each gap, passes it, parks again, and gets item 1.
        let d = a.recv().unwrap().unwrap();
        assert_eq!(d.item().position(), Some(Position(1)));
        d.ack().unwrap();
        a
    });
    thread::sleep(Duration::from_millis(20));
    let fanout = within(10, "gap publishes", move || {
        // Three gaps through a ring of two: lane "a"'s parked consumer must pass them.
        for _ in 0..3 {
            fanout.publish_to(1, snapshot()).unwrap();
            let d = b.try_recv().unwrap();
            assert!(d.item().position().is_none());
            d.ack().unwrap();
        }
        fanout.publish(batch(1)).unwrap();
        fanout
    });
    let _a = within(10, "parked consumer", move || parked.join().unwrap());
    drop(fanout);
}
