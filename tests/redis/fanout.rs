//! The Redis backend's fan-out (`Stream::fanout`, the only publisher of a Redis stream): it writes
//! each item once into the log, every lane reads every entry. The rules it shares with the in-memory
//! fan-out over a shared ring (`tests/lanes/fanout.rs`): every lane gets every item, in order, once
//! (L2); the slowest lane bounds the publisher (L3); positions rise on every lane (L4);
//! `publish_to` reaches one lane, the others pass a gap (W5); a closed lane refuses the fan-out
//! (L10); one fan-out lives at a time, an older one is fenced (L9); state survives a restart.
//!
//! Needs a server (`LANESTREAM_REDIS_URL`), as `tests/redis/contract.rs`.
#![cfg(feature = "redis")]

use crate::{common, redis_support};
use lanestream::prelude::*;

use std::thread;
use std::time::{Duration, Instant};

use common::batch;
use lanestream::{
    AckError, BackendError, BuildError, LaneConsumer, LaneItem, Position, PublishError, RedisDelivery,
    RedisStream, Stream, StreamError, StreamFanout, TryRecvError,
};
use redis_support::fanout::{firsts, open, setup, SINKS};
use redis_support::{drain_ack, log_ids, pos};

#[test]
fn redis_fanout_l2_every_lane_gets_every_item_once_in_order_and_the_log_holds_each_once() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url, "lsf");
    let stream = open(&url, &name, 64);
    let mut consumers: Vec<_> = SINKS.iter().map(|s| stream.attach(s).unwrap()).collect();
    let mut fanout = stream.fanout().unwrap();
    assert_eq!(fanout.lanes(), 3);
    for p in 1..=20 {
        fanout.publish(batch(p)).unwrap();
    }
    assert_eq!(log_ids(&mut admin, &name), (1..=20).collect::<Vec<_>>(), "one entry per item");
    for (sink, c) in SINKS.iter().zip(&mut consumers) {
        assert_eq!(drain_ack(c), firsts(1..=20), "lane {sink}");
        let st = stream.stats(sink).unwrap();
        assert_eq!((st.published, st.acked_items, st.acked), (20, 20, Some(Position(20))), "{st:?}");
    }
    assert_eq!(stream.watermark(), Some(Position(20)));
    assert!(stream.is_idle());
}

/// L1: the layout is stored with the stream. A stream stored in the retired
/// per-lane-producer layout (recorded as `lanes`, or made before the layout was recorded) is
/// refused at build with `RetiredLayout`, which says what to do, and is left untouched; deleted,
/// it is built again in the one layout.
#[test]
fn redis_fanout_l1_a_stream_in_the_retired_layout_is_refused_at_build_and_can_be_deleted() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url, "lsf");
    let stream = open(&url, &name, 8);
    let other = RedisStream::builder(&url, &name).sinks(SINKS[..2].iter().copied()).build();
    assert!(matches!(other, Err(BuildError::Mismatch(_))), "other sinks: {other:?}");
    RedisStream::builder(&url, &name).sinks(SINKS).build().expect("the same sinks, the one layout");
    let meta = format!("{{{name}}}:meta");
    let layout = |admin: &mut redis::Connection| -> Option<String> {
        redis::cmd("HGET").arg(&meta).arg("mode").query(admin).unwrap()
    };
    assert_eq!(layout(&mut admin).as_deref(), Some("fanout"));
    let mut fanout = stream.fanout().unwrap();
    fanout.publish(batch(1)).unwrap();
    drop(fanout);
    for retired in [Some("lanes"), None] {
        match retired {
            Some(mode) => {
                let _: i64 = redis::cmd("HSET").arg(&meta).arg("mode").arg(mode).query(&mut admin).unwrap();
            }
            None => {
                let _: i64 = redis::cmd("HDEL").arg(&meta).arg("mode").query(&mut admin).unwrap();
            }
        }
        let keys_before = redis_support::keys_of(&mut admin, &name).unwrap().len();
        match open_retired(&url, &name) {
            Err(BuildError::RetiredLayout(stored)) => assert_eq!(stored, name),
            other => panic!("a stream in the retired layout ({retired:?}): {other:?}"),
        }
        let message = open_retired(&url, &name).unwrap_err().to_string();
        assert!(message.contains("retired") && message.contains("delete"), "{message}");
        assert_eq!(
            layout(&mut admin).as_deref(),
            Some("lanes"),
            "recorded as the retired layout, nothing else"
        );
        assert_eq!(redis_support::keys_of(&mut admin, &name).unwrap().len(), keys_before, "no key made");
    }
    RedisStream::builder(&url, &name).delete().unwrap();
    assert!(redis_support::keys_of(&mut admin, &name).unwrap().is_empty());
    let again = open(&url, &name, 8);
    assert_eq!(layout(&mut admin).as_deref(), Some("fanout"));
    let mut fanout = again.fanout().unwrap();
    fanout.publish(batch(1)).unwrap();
    assert_eq!(drain_ack(&mut again.attach("cache").unwrap()), firsts(1..=1));
}

fn open_retired(url: &str, name: &str) -> Result<RedisStream, BuildError> {
    RedisStream::builder(url, name).capacity(8).sinks(SINKS).build()
}

/// L3: the slowest lane bounds the fan-out; an ack of that lane makes room, also for a publish
/// waiting on another thread.
#[test]
fn redis_fanout_l3_the_slowest_lane_bounds_the_fanout_and_its_ack_wakes_a_waiting_publish() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url, "lsf");
    let stream = open(&url, &name, 4);
    let mut consumers: Vec<_> = SINKS.iter().map(|s| stream.attach(s).unwrap()).collect();
    let mut fanout = stream.fanout().unwrap();
    for p in 1..=4 {
        fanout.try_publish(batch(p)).unwrap();
    }
    // Lanes 0 and 2 ack everything; lane 1 acks nothing: still full.
    assert_eq!(drain_ack(&mut consumers[0]), firsts(1..=4));
    assert_eq!(drain_ack(&mut consumers[2]), firsts(1..=4));
    match fanout.try_publish(batch(5)) {
        Err(PublishError::Full(item)) => assert_eq!(item.position(), Some(Position(5))),
        other => panic!("a full lane: {other:?}"),
    }
    let slow = thread::spawn({
        let stream = stream.clone();
        move || {
            let mut c = stream.reattach("cache").unwrap();
            thread::sleep(Duration::from_millis(200));
            let d = c.recv().unwrap().unwrap();
            assert_eq!((pos(&d), d.attempt()), (1, 1));
            d.ack().unwrap();
            c
        }
    });
    // Waits for the slow lane's ack (bounded: a failing slow thread must not hang the test).
    fanout.publish_timeout(batch(5), Duration::from_secs(20)).unwrap();
    let mut cache = slow.join().unwrap();
    assert_eq!(drain_ack(&mut cache), firsts(2..=5));
    assert_eq!(drain_ack(&mut consumers[0]), firsts(5..=5));
    assert_eq!(drain_ack(&mut consumers[2]), firsts(5..=5));
    assert_eq!(stream.watermark(), Some(Position(5)));
}

/// W5 and L4: an item published to one lane reaches it alone (the others pass the gap without
/// a delivery, acked at its position, as the in-memory shared ring's), and positions rise
/// across the log, for items to one lane too.
#[test]
fn redis_fanout_l4_w5_publish_to_reaches_one_lane_and_the_others_pass_the_gap() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url, "lsf");
    let stream = open(&url, &name, 8);
    let mut consumers: Vec<_> = SINKS.iter().map(|s| stream.attach(s).unwrap()).collect();
    let mut fanout = stream.fanout().unwrap();
    fanout.publish(batch(1)).unwrap();
    fanout.publish_to(1, batch(2)).unwrap();
    // Position 2 went to lane 1 only; the other lanes pass it at 2, so no lane may take 2 again.
    for lane in 0..3 {
        match fanout.try_publish_to(lane, batch(2)) {
            Err(PublishError::PositionRegressed { position, last, .. }) => {
                assert_eq!((position, last), (Position(2), Position(2)), "lane {lane}")
            }
            other => panic!("a position not above the last, to lane {lane}: {other:?}"),
        }
    }
    assert!(matches!(fanout.publish(batch(2)), Err(PublishError::PositionRegressed { .. })));
    fanout.publish_to(0, batch(3)).unwrap();
    fanout.publish(batch(4)).unwrap();
    assert_eq!(drain_ack(&mut consumers[0]), vec![(1, 1), (3, 1), (4, 1)], "the gaps are not delivered");
    assert_eq!(drain_ack(&mut consumers[1]), vec![(1, 1), (2, 1), (4, 1)]);
    assert_eq!(drain_ack(&mut consumers[2]), vec![(1, 1), (4, 1)]);
    for sink in SINKS {
        let st = stream.stats(sink).unwrap();
        assert_eq!((st.published, st.acked_items, st.acked), (4, 4, Some(Position(4))), "{sink}: {st:?}");
    }
    assert!(stream.is_idle());
    // A trailing gap is passed by the next receive, which then finds the lane empty.
    fanout.publish_to(2, batch(5)).unwrap();
    assert!(!stream.is_idle());
    assert!(matches!(consumers[0].try_recv(), Err(TryRecvError::Empty)));
    assert!(matches!(consumers[1].try_recv(), Err(TryRecvError::Empty)));
    assert_eq!(stream.acked("search").unwrap(), Some(Position(5)), "passed at its position");
    assert_eq!(stream.watermark(), Some(Position(4)), "lane 2 has not acked 5 yet");
    assert_eq!(drain_ack(&mut consumers[2]), firsts(5..=5));
    assert!(stream.is_idle());
    assert_eq!(stream.watermark(), Some(Position(5)));
}

/// L9 across processes: a second process takes the fan-out over only from a dead holder, and
/// the older fan-out's publishes (on room it knew) land nothing afterwards.
#[test]
fn redis_fanout_l9_a_fanout_claimed_by_another_process_fences_the_old_one() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url, "lsf");
    let s1 = open(&url, &name, 1024);
    let mut old = s1.fanout().unwrap();
    for p in 1..=5 {
        old.publish(batch(p)).unwrap();
    }
    let s2 = open(&url, &name, 1024);
    assert!(matches!(s2.fanout(), Err(StreamError::ProducerBusy(_))), "the holder is alive");
    // The old holder's claim is gone without a word (as if its process died; its handle lives).
    let _: i64 =
        redis::cmd("HSET").arg(format!("{{{name}}}:meta")).arg("fh").arg("").query(&mut admin).unwrap();
    let mut live = s2.fanout().unwrap();
    let fenced = |r: Result<(), PublishError<LaneItem>>| {
        matches!(r, Err(PublishError::Backend { error: BackendError::Fenced, .. }))
    };
    assert!(fenced(old.try_publish(batch(6))), "the old fan-out at the fence");
    for p in 6..=70 {
        live.publish(batch(p)).unwrap();
    }
    for k in 0..70 {
        assert!(fenced(old.try_publish(batch(1000 + k))), "old publish {k}");
    }
    assert_eq!(log_ids(&mut admin, &name), (1..=70).collect::<Vec<_>>(), "nothing of the old fan-out's");
    for sink in SINKS {
        let mut c = s2.reattach(sink).unwrap();
        assert_eq!(drain_ack(&mut c), firsts(1..=70), "{sink}");
    }
    assert!(s1.is_idle() && s2.is_idle());
}

/// State survives the process: a fan-out built again resumes after the last entry, refuses a
/// position that does not rise, and the consumers re-attach to their unacked entries.
#[test]
fn redis_fanout_l4_l8_a_restarted_fanout_resumes_and_reattached_lanes_get_their_unacked_entries() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url, "lsf");
    {
        let stream = open(&url, &name, 16);
        let mut fanout = stream.fanout().unwrap();
        for p in 1..=3 {
            fanout.publish(batch(p)).unwrap();
        }
        let mut c = stream.attach("search").unwrap();
        c.try_recv().unwrap().ack().unwrap();
        let _held = c.try_recv().unwrap(); // delivered, never acked: the process dies
        std::mem::forget(_held);
    }
    let stream = open(&url, &name, 16);
    let mut fanout = stream.fanout().unwrap();
    assert!(matches!(fanout.try_publish(batch(3)), Err(PublishError::PositionRegressed { .. })));
    fanout.publish(batch(4)).unwrap();
    let mut search = stream.reattach("search").unwrap();
    assert_eq!(drain_ack(&mut search), vec![(2, 2), (3, 1), (4, 1)]);
    let mut cache = stream.reattach("cache").unwrap();
    assert_eq!(drain_ack(&mut cache), firsts(1..=4));
    assert_eq!(stream.acked("search").unwrap(), Some(Position(4)));
}

/// L10: closing any lane stops the fan-out (as the in-memory one); every lane still drains
/// what was published, and only the closed lane reports closed.
#[test]
fn redis_fanout_l10_a_closed_lane_refuses_the_fanout_and_every_lane_drains() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url, "lsf");
    let stream = open(&url, &name, 16);
    let mut fanout = stream.fanout().unwrap();
    fanout.publish(batch(1)).unwrap();
    fanout.publish(batch(2)).unwrap();
    stream.close("cache").unwrap();
    assert!(matches!(fanout.try_publish(batch(3)), Err(PublishError::Closed(_))));
    assert!(matches!(fanout.publish_to(0, batch(3)), Err(PublishError::Closed(_))));
    let mut search = stream.attach("search").unwrap();
    assert_eq!(drain_ack(&mut search), firsts(1..=2));
    let mut cache = stream.attach("cache").unwrap();
    assert_eq!(drain_ack_until_closed(&mut cache), firsts(1..=2));
    assert!(matches!(search.try_recv(), Err(TryRecvError::Empty)), "search is not closed");
    // A fan-out built again stays refused.
    drop(fanout);
    let mut again = stream.fanout().unwrap();
    assert!(matches!(again.try_publish(batch(3)), Err(PublishError::Closed(_))));
}

fn drain_ack_until_closed(
    c: &mut impl LaneConsumer<LaneItem, Delivery = RedisDelivery<LaneItem>>,
) -> Vec<(u64, u32)> {
    let mut got = Vec::new();
    while let Some(d) = c.recv_timeout(Duration::from_secs(5)).unwrap() {
        got.push((pos(&d), d.attempt()));
        d.ack().unwrap();
    }
    got
}

/// The trim (every 64th publish, and `trim`) keeps every entry some lane has not acked.
#[test]
fn redis_fanout_l5_l6_l8_the_trim_keeps_what_the_slowest_lane_has_not_acked() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url, "lsf");
    let stream = open(&url, &name, 256);
    let mut consumers: Vec<_> = SINKS.iter().map(|s| stream.attach(s).unwrap()).collect();
    let mut fanout = stream.fanout().unwrap();
    for p in 1..=130 {
        fanout.publish(batch(p)).unwrap();
    }
    assert_eq!(drain_ack(&mut consumers[0]).len(), 130);
    assert_eq!(drain_ack(&mut consumers[2]).len(), 130);
    for _ in 0..10 {
        consumers[1].try_recv().unwrap().ack().unwrap();
    }
    assert_eq!(stream.trim().unwrap(), 10, "the floor is the slowest lane's acked prefix");
    assert_eq!(log_ids(&mut admin, &name), (11..=130).collect::<Vec<_>>());
    // A receive past the trim still finds its entries; a nack redelivers first.
    let d = consumers[1].try_recv().unwrap();
    assert_eq!(pos(&d), 11);
    d.nack();
    let d = consumers[1].try_recv().unwrap();
    assert_eq!((pos(&d), d.attempt()), (11, 2));
    d.ack().unwrap();
    assert_eq!(drain_ack(&mut consumers[1]), firsts(12..=130));
    assert_eq!(stream.trim().unwrap(), 130);
    assert!(log_ids(&mut admin, &name).is_empty());
    // A stale ack after a re-attach is refused (the lane's ack log is fenced as a lone lane's).
    fanout.publish(batch(131)).unwrap();
    let d = consumers[0].try_recv().unwrap();
    let _new = stream.reattach(SINKS[0]).unwrap();
    assert_eq!(d.ack(), Err(AckError::Detached));
}

/// The last position survives a run of unpositioned entries (chunks of a large transaction)
/// longer than one page of the log's read-back: a fan-out claimed after them still refuses a
/// position at or below it (I1, L4).
#[test]
fn redis_fanout_i1_l4_the_last_position_is_found_behind_many_unpositioned_entries() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url, "lsf");
    let stream = open(&url, &name, 128);
    let chunk = || LaneItem::Batch(lanestream::Batch::new(None, Vec::new().into()));
    {
        let mut fanout = stream.fanout().unwrap();
        fanout.publish(batch(5)).unwrap();
        for _ in 0..40 {
            fanout.publish(chunk()).unwrap();
        }
    }
    let mut fanout = stream.fanout().unwrap();
    match fanout.try_publish(batch(5)) {
        Err(PublishError::PositionRegressed { last, .. }) => assert_eq!(last, Position(5)),
        other => panic!("a position not above the last, behind 40 chunks: {other:?}"),
    }
    fanout.publish(chunk()).unwrap();
    fanout.publish(batch(6)).unwrap();
    let st = stream.stats("cache").unwrap();
    assert_eq!((st.published, st.last_published), (43, Some(Position(6))), "{st:?}");
    let mut c = stream.attach("cache").unwrap();
    let mut positions = Vec::new();
    while let Ok(d) = c.try_recv() {
        positions.push(d.position());
        d.ack().unwrap();
    }
    assert_eq!(positions.len(), 43);
    assert_eq!((positions[0], positions[42]), (Some(Position(5)), Some(Position(6))));
    assert_eq!(stream.acked("cache").unwrap(), Some(Position(6)));
}

/// W6 on Redis: a watermark waiter (blocking, and async on its helper thread) is woken by the ack
/// that moves the watermark, through a wake-up key of its own: never after waiting out a wait
/// slice (500 ms), in 12 rounds. Its key and its registration are gone once it returned.
#[test]
fn redis_fanout_w6_an_ack_wakes_a_watermark_waiter_without_a_wait_slice() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url, "lsf");
    let stream = open(&url, &name, 64);
    let mut consumers: Vec<_> = SINKS.iter().map(|s| stream.attach(s).unwrap()).collect();
    let mut fanout = stream.fanout().unwrap();
    let mut waits = Vec::new();
    for round in 0..12u64 {
        let p = round + 1;
        fanout.publish(batch(p)).unwrap();
        // Every lane but the last acks: the watermark waits on that one.
        for c in &mut consumers[..2] {
            assert_eq!(drain_ack(c), firsts(p..=p));
        }
        let waiter = {
            let s = stream.clone();
            thread::spawn(move || {
                let w = if round % 2 == 0 {
                    s.wait_watermark(Position(p), Some(Instant::now() + Duration::from_secs(20)))
                } else {
                    futures_executor::block_on(s.wait_watermark_async(Position(p)))
                };
                (w, Instant::now())
            })
        };
        thread::sleep(Duration::from_millis(30));
        let acked = Instant::now();
        assert_eq!(drain_ack(&mut consumers[2]), firsts(p..=p));
        let (w, woke) = waiter.join().unwrap();
        assert_eq!(w, Some(Position(p)), "round {round}");
        waits.push(woke.saturating_duration_since(acked));
    }
    eprintln!("watermark waiters woken after {waits:?}");
    let slow = waits.iter().filter(|d| **d >= Duration::from_millis(400)).count();
    assert_eq!(slow, 0, "watermark waiters waited out a slice: {waits:?}");
    let left: Vec<String> = redis_support::keys_of(&mut admin, &name)
        .unwrap()
        .into_iter()
        .filter(|k| k.contains(":wbell:") || k.ends_with(":ww"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Runs on Redis: one script per run of up to 64 items; a run longer than that goes in several,
/// the lanes get every item once, in order, and the log holds each once (a trim at every 64th
/// entry included); a run that starts with an unpositioned item and one with a refused item
/// in the middle stop where they must.
#[test]
fn redis_fanout_l2_runs_publish_every_item_once_in_order_across_scripts_and_trims() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url, "lsf");
    let stream = open(&url, &name, 256);
    let mut consumers: Vec<_> = SINKS.iter().map(|s| stream.attach(s).unwrap()).collect();
    let mut fanout = stream.fanout().unwrap();
    let mut items: Vec<LaneItem> = (1..=150).map(batch).collect();
    fanout.publish_run(&mut items).unwrap();
    assert!(items.is_empty(), "every item moved in");
    assert_eq!(log_ids(&mut admin, &name), (1..=150).collect::<Vec<_>>(), "one entry per item");
    let unpositioned = LaneItem::Batch(lanestream::Batch::new(None, Vec::new().into()));
    let mut stops = vec![unpositioned.clone(), batch(151), batch(3), batch(152)];
    assert_eq!(fanout.try_publish_run(&mut stops), Ok(2));
    assert_eq!(
        stops.iter().map(|i| i.position()).collect::<Vec<_>>(),
        [Some(Position(3)), Some(Position(152))]
    );
    for (sink, c) in SINKS.iter().zip(&mut consumers) {
        let got = drain_ack(c);
        let expected: Vec<(u64, u32)> = (1..=150).map(|p| (p, 1)).chain([(0, 1), (151, 1)]).collect();
        assert_eq!(got, expected, "lane {sink}");
    }
    assert_eq!(stream.watermark(), Some(Position(151)));
    assert_eq!(stream.trim().unwrap(), 152);
    // The restarted fan-out knows the last position from the log written by runs.
    drop(fanout);
    let mut fanout = stream.fanout().unwrap();
    let mut old = vec![batch(151), batch(153)];
    assert!(matches!(fanout.try_publish_run(&mut old), Err(PublishError::PositionRegressed { item: 0, .. })));
    assert_eq!(old.len(), 2, "a refused run is handed back whole");
    fanout.publish_run(&mut vec![batch(153), batch(154)]).unwrap();
    for c in &mut consumers {
        assert_eq!(drain_ack(c), firsts(153..=154));
    }
}
