//! The Redis fan-out stream (`RedisStreamBuilder::fanout`, issue 12), attacked a second time,
//! after the log became every lane's publish record (`fold_pl` reads `pub`, `last` and `lp` from
//! the log's newest entries) and positions rose across the whole log: the fold racing publishes
//! and trims, the trim emptying the log, watermark monotony across gaps, chunks and restarts,
//! the lone-lane and per-lane paths that share the touched scripts, a busy run with a reader
//! thread, and concurrent builds in different modes.
//!
//! Needs a server (`LANESTREAM_REDIS_URL`); the lost-reply tests need it on a unix socket
//! (`redis+unix://PATH`) and are skipped (with a word) otherwise.
#![cfg(feature = "redis")]

use crate::{common, redis_support};

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{batch, snapshot};
use lanestream::{
    LaneConsumer, LaneDelivery, LaneItem, MemoryStream, Position, PublishError, RedisDelivery, RedisFanout,
    RedisStream, Stream, StreamFanout, TryRecvError,
};
use proptest::prelude::*;
use redis_support::fanout::{builder, firsts, open, open_sinks, setup, SINKS};
use redis_support::{drain_ack, log_ids, pos};

/// The newest entry number in the stream's log (0 if empty).
fn log_top(admin: &mut redis::Connection, name: &str) -> u64 {
    let v: Vec<(String, redis::Value)> = redis::cmd("XREVRANGE")
        .arg(format!("{{{name}}}:log"))
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query(admin)
        .unwrap();
    v.first().map_or(0, |(id, _)| id.split('-').next().unwrap().parse().unwrap())
}

/// A lane hash's field, as a number (0 if missing).
fn hfield(admin: &mut redis::Connection, name: &str, sink: &str, field: &str) -> u64 {
    let v: Option<String> =
        redis::cmd("HGET").arg(format!("{{{name}}}:l:{sink}")).arg(field).query(admin).unwrap();
    v.and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The log's last id (the fan-out's fence); the lanes of a fan-out stream keep no publish log.
fn assert_last_ids_equal(admin: &mut redis::Connection, name: &str, sinks: &[&str]) {
    for sink in sinks {
        let exists: i64 = redis::cmd("EXISTS").arg(format!("{{{name}}}:l:{sink}:pl")).query(admin).unwrap();
        assert_eq!(exists, 0, "lane {sink} of a fan-out stream has a publish log");
    }
}

// ----- a proxy that cuts one request ----------------------------------------------------------

use redis_support::cut_proxy::{CutProxy, APPEND, GATE};

// ----- the fold from the log, and the trim ----------------------------------------------------

/// Publishes 1 (received by every lane through the receive script, which folds the log into the
/// lane's `pub`/`last`), then 2..=4 received and acked through the consumers' plain fast paths
/// (no script: no fold of the log into the lane hashes), never polling the lanes empty.
fn fast_path_setup(s: &RedisStream) -> (lanestream::RedisFanout, Vec<lanestream::RedisConsumer<LaneItem>>) {
    let mut cs: Vec<_> = SINKS.iter().map(|sink| s.attach(sink).unwrap()).collect();
    let mut f = s.fanout().unwrap();
    f.publish(batch(1)).unwrap();
    for c in &mut cs {
        let d = c.try_recv().unwrap();
        assert_eq!(pos(&d), 1);
        d.ack().unwrap();
    }
    for p in 2..=4 {
        f.publish(batch(p)).unwrap();
    }
    for c in &mut cs {
        for p in 2..=4 {
            let d = c.try_recv().unwrap();
            assert_eq!(pos(&d), p);
            d.ack().unwrap();
        }
    }
    (f, cs)
}

/// BUG: `RedisStream::trim` (the `TRIM` script) folds each lane's ack log but not its publish
/// record (`fold_pl`, which on a fan-out stream reads the log's newest entries). Consumers that
/// received and acked through their plain fast paths (no script) leave `pub`/`last` behind; a
/// trim below their acks then removes entries no lane hash has folded, and once the log is empty
/// `fold_pl` has nothing to read: `pub` stays 1 while 4 were published and acked. Seen: `is_idle`
/// false, stats `published: 1, acked_items: 4`, and the live fan-out's next publish (which runs
/// the gate: past its room) refused as `Fenced` (the gate finds `pub = 1`, wants 5).
/// Fault: `scripts.rs` `trim` helper / `TRIM` (no `fold_pl` before the floor is taken; the
/// 64th-entry trim in `PUBLISH_FANOUT` is safe: the gate folds every lane first).
#[test]
fn l5_w5_a_trim_that_empties_the_log_keeps_every_lanes_publish_count() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url, "lsfb");
    let s = open(&url, &name, 4);
    let (mut f, mut cs) = fast_path_setup(&s);
    assert_eq!(s.trim().unwrap(), 4);
    assert_eq!(log_ids(&mut admin, &name), Vec::<u64>::new());
    for sink in SINKS {
        let st = s.stats(sink).unwrap();
        assert_eq!((st.published, st.acked_items), (4, 4), "lane {sink}: {st:?}");
        assert_eq!(st.last_published, Some(Position(4)), "lane {sink}");
    }
    assert!(s.is_idle(), "everything published was acked");
    f.try_publish(batch(5)).unwrap_or_else(|e| panic!("the live fan-out after the trim: {e:?}"));
    for (sink, c) in SINKS.iter().zip(&mut cs) {
        assert_eq!(drain_ack(c), firsts([5]), "lane {sink}");
    }
    assert!(s.is_idle());
    assert_eq!(s.watermark(), Some(Position(5)));
}

/// BUG (same fault as above): after the trim emptied the log, a new fan-out (a restart) claims
/// with `pub = 1` and numbers its entries from 2 again (the claim lowers the empty log's last id
/// to `2-<epoch>`): entries 2 and 3 (positions 5, 6) go below what the lanes have read and
/// acked. Seen: lanes cache and archive never deliver them (their `rd` folds to the log's top),
/// lane search delivers them but its acks are no-ops (`an` is 4): the lane stays un-idle.
#[test]
fn l2_a_reclaim_after_the_trim_emptied_the_log_loses_nothing() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url, "lsfb");
    let s = open(&url, &name, 4);
    let (f, mut cs) = fast_path_setup(&s);
    drop(f);
    assert_eq!(s.trim().unwrap(), 4);
    let mut g = open(&url, &name, 4).fanout().unwrap();
    g.try_publish(batch(5)).unwrap();
    g.try_publish(batch(6)).unwrap();
    assert_eq!(log_ids(&mut admin, &name), vec![5, 6], "entry numbers never go back");
    for (sink, c) in SINKS.iter().zip(&mut cs) {
        assert_eq!(drain_ack(c), firsts([5, 6]), "lane {sink}");
    }
    assert!(s.is_idle());
    assert_eq!(s.watermark(), Some(Position(6)));
}

/// BUG (same fault): the trim removes positioned entries no lane folded, and the newest entries
/// left are chunks (unpositioned): `fold_pl` pages back over them to the lane's stale `last`
/// and finds no position, so `lp` stays at 1 although positions 2 and 3 were published (and
/// acked). A restarted fan-out is then let publish position 2 (expected: `PositionRegressed`
/// with last 3), and the watermark goes back from 3 to 2 (W3).
#[test]
fn l4_w3_a_trim_below_unfolded_positions_keeps_the_last_position() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url, "lsfb");
    let s = open(&url, &name, 8);
    let mut cs: Vec<_> = SINKS.iter().map(|sink| s.attach(sink).unwrap()).collect();
    let mut f = s.fanout().unwrap();
    f.publish(batch(1)).unwrap();
    for c in &mut cs {
        c.try_recv().unwrap().ack().unwrap(); // the receive script: folds the log
    }
    f.publish(batch(2)).unwrap();
    f.publish(batch(3)).unwrap();
    for c in &mut cs {
        for p in 2..=3 {
            let d = c.try_recv().unwrap(); // the fast path: no fold
            assert_eq!(pos(&d), p);
            d.ack().unwrap();
        }
    }
    f.publish(snapshot()).unwrap(); // entry 4: a chunk
    drop(f);
    assert_eq!(s.trim().unwrap(), 3);
    assert_eq!(log_ids(&mut admin, &name), vec![4]);
    assert_eq!(s.watermark(), Some(Position(3)));
    let mut g = open(&url, &name, 8).fanout().unwrap();
    match g.try_publish(batch(2)) {
        Err(PublishError::PositionRegressed { last, .. }) => assert_eq!(last, Position(3)),
        other => panic!("position 2 after 3: {other:?}"),
    }
    for c in &mut cs {
        drain_ack(c);
    }
    assert_eq!(s.watermark(), Some(Position(3)), "W3: the watermark never goes back");
}

// ----- concurrency -----------------------------------------------------------------------------

/// Item `k` of the busy runs: its `changes` is `k` (its identity), its position `k` unless
/// `k % 5 == 0` (a chunk, unpositioned).
fn item(k: u64) -> LaneItem {
    let position = (k % 5 != 0).then_some(Position(k));
    LaneItem::Batch(lanestream::Batch { position, changes: k, offset: 0, envelopes: Vec::new().into() })
}

fn id_of(d: &RedisDelivery<LaneItem>) -> u64 {
    match d.item() {
        LaneItem::Batch(b) => b.changes,
        other => panic!("{other:?}"),
    }
}

/// The lane item `k` goes to in the busy runs (`None`: every lane).
fn busy_to(k: u64) -> Option<usize> {
    (k % 7 == 0).then_some((k / 7 % 3) as usize)
}

/// A fan-out publishing 300 items (a seventh to one lane, a fifth unpositioned) to three lanes of
/// capacity 4, each lane's consumer on its own thread (its own process's handle) nacking and
/// re-attaching now and then, and a reader thread calling stats, `acked`, the watermark,
/// `is_idle` (and, with `trim`, `RedisStream::trim`) in a loop: every lane acks each item meant
/// for it, first deliveries come in order, a lane's acked position and the watermark never go
/// back, `published` never goes back nor above the log's newest entry, the fan-out never errs,
/// and the final watermark is the last position.
fn busy_run(trim: bool) {
    use rand::{Rng, SeedableRng};
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url, "lsfb");
    let s = open(&url, &name, 4);
    let n = 300u64;
    let stop = Arc::new(AtomicBool::new(false));
    let mut consumers = Vec::new();
    for (i, sink) in SINKS.iter().enumerate() {
        let other = open(&url, &name, 4);
        let want: Vec<u64> = (1..=n).filter(|&k| busy_to(k).is_none_or(|t| t == i)).collect();
        consumers.push(thread::spawn(move || {
            let mut rng = rand::rngs::StdRng::seed_from_u64(i as u64 + 41);
            let mut c = other.attach(sink).unwrap();
            let mut acked = BTreeSet::new();
            let mut firsts = Vec::new();
            let mut last_acked: Option<Position> = None;
            let deadline = Instant::now() + Duration::from_secs(25);
            while acked.len() < want.len() {
                assert!(Instant::now() < deadline, "lane {sink}: acked {} of {}", acked.len(), want.len());
                let Some(d) = c.recv_timeout(Duration::from_millis(200)).unwrap() else { continue };
                let k = id_of(&d);
                assert!(
                    busy_to(k).is_none_or(|t| t == i),
                    "lane {sink} got item {k} of lane {:?}",
                    busy_to(k)
                );
                if d.attempt() == 1 {
                    firsts.push(k);
                }
                match rng.gen_range(0..20) {
                    0 | 1 => d.nack(),
                    2 => {
                        std::mem::forget(d);
                        c = other.reattach(sink).unwrap();
                    }
                    _ => {
                        if d.ack().is_ok() {
                            acked.insert(k);
                        }
                    }
                }
                let now = other.acked(sink).unwrap();
                assert!(now >= last_acked, "lane {sink}: acked position went back {last_acked:?} -> {now:?}");
                last_acked = now;
            }
            assert!(firsts.windows(2).all(|w| w[0] < w[1]), "lane {sink}: first deliveries {firsts:?}");
            assert_eq!(acked.into_iter().collect::<Vec<_>>(), want, "lane {sink}");
        }));
    }
    let reader = {
        let (s, stop, url, name) = (open(&url, &name, 4), stop.clone(), url.clone(), name.clone());
        thread::spawn(move || {
            let mut admin = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
            let mut published = [0u64; 3];
            let mut acked_items = [0u64; 3];
            let mut mark: Option<Position> = None;
            let mut rounds = 0;
            while !stop.load(Ordering::SeqCst) {
                for (i, sink) in SINKS.iter().enumerate() {
                    let st = s.stats(sink).unwrap();
                    let top = log_top(&mut admin, &name);
                    assert!(
                        st.published <= top || top == 0,
                        "lane {sink}: published {} > log top {top}",
                        st.published
                    );
                    assert!(
                        st.published >= published[i],
                        "lane {sink}: published went back {} -> {}",
                        published[i],
                        st.published
                    );
                    assert!(st.acked_items >= acked_items[i], "lane {sink}: acked items went back");
                    assert!(st.acked_items <= st.published, "lane {sink}: {st:?}");
                    published[i] = st.published;
                    acked_items[i] = st.acked_items;
                }
                let w = s.try_watermark().unwrap();
                assert!(w >= mark, "W3: watermark went back {mark:?} -> {w:?}");
                mark = w;
                let _ = s.try_is_idle().unwrap();
                if trim {
                    s.trim().unwrap();
                }
                rounds += 1;
            }
            rounds
        })
    };
    let mut f = s.fanout().unwrap();
    for k in 1..=n {
        let r = match busy_to(k) {
            Some(i) => f.publish_to(i, item(k)),
            None => f.publish(item(k)),
        };
        r.unwrap_or_else(|e| panic!("publish {k}: {e:?}"));
    }
    let results: Vec<_> = consumers.into_iter().map(|c| c.join()).collect();
    stop.store(true, Ordering::SeqCst);
    let rounds = reader.join();
    for r in results {
        r.unwrap();
    }
    let rounds = rounds.unwrap();
    eprintln!("reader rounds: {rounds}");
    assert!(rounds > 0);
    for sink in SINKS {
        assert_eq!(drain_ack(&mut s.reattach(sink).unwrap()), vec![], "lane {sink}");
    }
    assert!(s.is_idle());
    // Item 300 is a chunk to lane search... the last position is 299.
    assert_eq!(s.watermark(), Some(Position((1..=n).filter(|k| k % 5 != 0).max().unwrap())));
}

#[test]
fn w3_a_busy_fanout_with_a_stats_and_watermark_reader_loses_nothing() {
    busy_run(false);
}

#[test]
fn w3_a_busy_fanout_with_a_trimming_reader_loses_nothing() {
    busy_run(true);
}

// ----- the mode ----------------------------------------------------------------------------------

/// Two processes build the same new stream at once, over and over on fresh names: both builds
/// succeed in the one layout (the meta hash records `fanout`, every lane hash carries `fan`),
/// and the stream works through either handle: one fan-out between them, every lane gets its
/// item.
#[test]
fn l1_racing_builds_of_a_new_stream_give_the_one_layout() {
    let url = server!();
    for round in 0..16 {
        let (name, _cleanup, mut admin) = setup(&url, "lsfb");
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let build = || {
            let (url, name, barrier) = (url.clone(), name.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                builder(&url, &name, 8, &SINKS).build()
            })
        };
        let (a, b) = (build(), build());
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        let (a, b) = match (a, b) {
            (Ok(a), Ok(b)) => (a, b),
            other => panic!("round {round}: {other:?}"),
        };
        let mode: Option<String> =
            redis::cmd("HGET").arg(format!("{{{name}}}:meta")).arg("mode").query(&mut admin).unwrap();
        assert_eq!(mode.as_deref(), Some("fanout"), "round {round}");
        let fans: Vec<Option<String>> = SINKS
            .iter()
            .map(|sink| {
                redis::cmd("HGET").arg(format!("{{{name}}}:l:{sink}")).arg("fan").query(&mut admin).unwrap()
            })
            .collect();
        assert!(fans.iter().all(|f| f.as_deref() == Some("1")), "round {round}: {fans:?}");
        let mut f = a.fanout().unwrap();
        assert!(b.fanout().is_err(), "round {round}: one fan-out between the two handles");
        f.publish(batch(1)).unwrap();
        for sink in SINKS {
            assert_eq!(drain_ack(&mut b.attach(sink).unwrap()), firsts([1]), "round {round}");
        }
    }
}

// ----- positions ---------------------------------------------------------------------------------

/// A positioned entry, then `k` chunks (unpositioned) on either side of the 16-entry page
/// `fold_pl` looks back by, none folded into any lane (no gate runs: the room is known, and no
/// lane receives), then a restart: the new fan-out knows the last position (7, not the older
/// 5), refuses 7 as regressed and takes 8; every lane gets every item once.
#[test]
fn i1_l4_a_run_of_chunks_keeps_the_last_position_across_a_restart() {
    let url = server!();
    for k in [0usize, 1, 14, 15, 16, 17, 31, 32, 33, 48, 60] {
        let (name, _cleanup, mut admin) = setup(&url, "lsfb");
        let s = open(&url, &name, 128);
        {
            let mut f = s.fanout().unwrap();
            f.publish(batch(5)).unwrap();
            f.publish(batch(7)).unwrap();
            for _ in 0..k {
                f.publish(snapshot()).unwrap();
            }
        }
        for sink in SINKS {
            assert_eq!(hfield(&mut admin, &name, sink, "last"), 0, "k {k}: lane {sink} folded already");
        }
        let mut f = open(&url, &name, 128).fanout().unwrap();
        match f.try_publish(batch(7)) {
            Err(PublishError::PositionRegressed { last, .. }) => assert_eq!(last, Position(7), "k {k}"),
            other => panic!("k {k}: position 7 again: {other:?}"),
        }
        match f.try_publish_to(1, batch(6)) {
            Err(PublishError::PositionRegressed { last, .. }) => assert_eq!(last, Position(7), "k {k}"),
            other => panic!("k {k}: position 6 to one lane: {other:?}"),
        }
        f.try_publish(batch(8)).unwrap();
        for sink in SINKS {
            let st = s.stats(sink).unwrap();
            assert_eq!(
                (st.published, st.last_published),
                (k as u64 + 3, Some(Position(8))),
                "k {k}: lane {sink}"
            );
        }
        let mut want = vec![(5, 1), (7, 1)];
        want.extend(std::iter::repeat_n((0, 1), k));
        want.push((8, 1));
        for sink in SINKS {
            assert_eq!(drain_ack(&mut s.attach(sink).unwrap()), want, "k {k}: lane {sink}");
        }
        assert_eq!(s.watermark(), Some(Position(8)), "k {k}");
        assert!(s.is_idle(), "k {k}");
    }
}

/// An unpositioned item published to one lane: the other lanes pass its gap without moving
/// their acked position; a positioned one to one lane moves the others' acked positions to it
/// once passed (the watermark follows the slowest lane, never going back); every lane's
/// acked position and the watermark are checked after each step.
#[test]
fn w2_w3_unpositioned_and_positioned_gaps_move_acked_positions_as_the_shared_ring() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url, "lsfb");
    let s = open(&url, &name, 16);
    let mut cs: Vec<_> = SINKS.iter().map(|sink| s.attach(sink).unwrap()).collect();
    let mut f = s.fanout().unwrap();
    let acked = |s: &RedisStream| SINKS.map(|sink| s.acked(sink).unwrap().map(|p| p.0));
    f.publish(batch(1)).unwrap();
    f.publish_to(0, snapshot()).unwrap();
    for c in &mut cs {
        drain_ack(c);
    }
    assert_eq!(acked(&s), [Some(1); 3], "a passed unpositioned gap moves nothing");
    assert_eq!(s.watermark(), Some(Position(1)));
    f.publish_to(1, batch(3)).unwrap();
    f.publish_to(1, snapshot()).unwrap();
    assert_eq!(drain_ack(&mut cs[0]), vec![]);
    assert_eq!(acked(&s), [Some(3), Some(1), Some(1)], "lane search passed both gaps");
    assert_eq!(s.watermark(), Some(Position(1)));
    assert_eq!(drain_ack(&mut cs[1]), vec![(3, 1), (0, 1)]);
    assert_eq!(acked(&s), [Some(3), Some(3), Some(1)]);
    assert_eq!(s.watermark(), Some(Position(1)));
    // Lane archive: holds the gap's neighbour, a nack, a re-attach.
    f.publish(batch(4)).unwrap();
    let d = cs[2].try_recv().unwrap(); // passes gaps 3 and the chunk, delivers 4
    assert_eq!(pos(&d), 4);
    assert_eq!(acked(&s), [Some(3), Some(3), Some(3)]);
    assert_eq!(s.watermark(), Some(Position(3)));
    d.nack();
    cs[2] = s.reattach("archive").unwrap();
    assert_eq!(acked(&s)[2], Some(3), "a re-attach keeps the passed gaps acked");
    assert_eq!(drain_ack(&mut cs[2]), vec![(4, 2)]);
    for c in &mut cs[..2] {
        assert_eq!(drain_ack(c), vec![(4, 1)]);
    }
    assert_eq!(s.watermark(), Some(Position(4)));
    assert!(s.is_idle());
}

/// The 64th entry's gate trims the log (after folding every lane): with every lane caught up
/// through its fast paths, the trim leaves only the newest entries, and a restart's claim
/// counts on from the lanes' folded `pub` (entry numbers never go back); the log never holds an
/// entry twice.
#[test]
fn l5_the_64th_gate_trims_after_folding_and_a_restart_counts_on() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url, "lsfb");
    let s = open(&url, &name, 128);
    let mut cs: Vec<_> = SINKS.iter().map(|sink| s.attach(sink).unwrap()).collect();
    {
        let mut f = s.fanout().unwrap();
        f.publish(batch(1)).unwrap();
        for c in &mut cs {
            c.try_recv().unwrap().ack().unwrap();
        }
        for p in 2..=63 {
            f.publish(batch(p)).unwrap();
            for c in &mut cs {
                let d = c.try_recv().unwrap(); // fast path: no fold
                assert_eq!(pos(&d), p);
                d.ack().unwrap();
            }
        }
        f.publish(batch(64)).unwrap(); // the gate trims below every lane's acked 63
    }
    assert_eq!(log_ids(&mut admin, &name), vec![64]);
    let mut g = open(&url, &name, 128).fanout().unwrap();
    match g.try_publish(batch(64)) {
        Err(PublishError::PositionRegressed { last, .. }) => assert_eq!(last, Position(64)),
        other => panic!("{other:?}"),
    }
    g.try_publish(batch(65)).unwrap();
    assert_eq!(log_ids(&mut admin, &name), vec![64, 65]);
    for (sink, c) in SINKS.iter().zip(&mut cs) {
        assert_eq!(drain_ack(c), firsts([64, 65]), "lane {sink}");
    }
    assert!(s.is_idle());
    assert_eq!(s.watermark(), Some(Position(65)));
}

/// A publish waiting on the full lane's bell is woken by the close of another lane (the close
/// rings every lane's publishers), and ends `Closed` well within a wait slice (500 ms).
#[test]
fn l10_a_close_of_a_lane_that_is_not_full_wakes_a_waiting_publish() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url, "lsfb");
    let s = open(&url, &name, 2);
    let mut cs: Vec<_> = SINKS.iter().map(|sink| s.attach(sink).unwrap()).collect();
    let mut f = s.fanout().unwrap();
    f.publish(batch(1)).unwrap();
    f.publish(batch(2)).unwrap();
    for c in &mut cs[..2] {
        assert_eq!(drain_ack(c), firsts([1, 2]));
    }
    // Only lane archive is full.
    let waiting = thread::spawn(move || {
        let t = Instant::now();
        let r = f.publish_timeout(batch(3), Duration::from_secs(5));
        (format!("{r:?}"), t.elapsed())
    });
    thread::sleep(Duration::from_millis(150));
    s.close("search").unwrap();
    let (r, waited) = waiting.join().unwrap();
    assert!(r.starts_with("Err(Closed"), "the waiting publish ends Closed: {r}");
    assert!(waited < Duration::from_millis(450), "woken by the close's ring, not a wait slice: {waited:?}");
    assert_eq!(drain_ack(&mut cs[2]), firsts([1, 2]));
}

// ----- lost replies next to the trim -------------------------------------------------------------

/// A lane alone on its log's ack `XADD` (the consumer's fast-path ack, to `B:al`).
const ACK_LOG: &[u8] = b":al\r\n$10\r\nNOMKSTREAM";

/// A gap received through the receive script (which records it as the lane's last receive,
/// `lq`) whose ack landed but whose reply was lost: the consumer's next receive is the same
/// request, which the script answers by reading that entry again. If a trim removed the entry
/// meanwhile (every lane had acked it), that read finds nothing.
/// BUG: the script indexes the missing entry (`e[1][2][2]` on an empty `XRANGE`) and errs, and
/// every later receive is the same request: the lane is stuck (entry 2 never delivered) until a
/// re-attach. Fault: `scripts.rs` `RECEIVE`, the retried-request branch (`lq`), and
/// `consumer.rs` `step` (a gap whose ack failed keeps the request number, relying on that
/// branch).
/// `fast`: the gap is the consumer's expected entry, taken by the plain fast path (a
/// delivery-log record): its next receive then goes to the script's branch for an expected
/// entry recorded but not received (`expect <= rd`), which hands the payload over from a
/// pipelined `XRANGE` that finds nothing (`malformed`), and records `lq`, after which the first
/// case applies.
fn gap_ack_lost_then_trimmed(fast: bool) {
    let url = server!();
    let proxy = proxy!(url);
    let (name, _cleanup, _admin) = setup(&url, "lsfb");
    let s = open(&url, &name, 16);
    let via = open(&proxy.url, &name, 16);
    let mut f = s.fanout().unwrap();
    let mut c = via.attach("cache").unwrap();
    let first = if fast {
        f.publish(batch(1)).unwrap();
        c.try_recv().unwrap().ack().unwrap();
        2
    } else {
        1
    };
    f.publish_to(0, batch(first)).unwrap();
    f.publish(batch(first + 1)).unwrap();
    proxy.arm_refusing(ACK_LOG, true);
    // The gap's ack lands, its reply is lost, the fresh retry cannot connect.
    let r = c.try_recv();
    assert!(matches!(r, Err(TryRecvError::Backend(_))), "{r:?}");
    assert_eq!(proxy.cuts(), 1);
    proxy.disarm();
    assert_eq!(s.acked("cache").unwrap(), Some(Position(first)), "the gap's ack landed");
    for sink in ["search", "archive"] {
        let mut other = s.attach(sink).unwrap();
        while let Ok(d) = other.try_recv() {
            if pos(&d) == first + 1 && sink == "archive" {
                std::mem::forget(d); // archive holds the last entry: the trim stops below it
                break;
            }
            d.ack().unwrap();
        }
    }
    assert_eq!(s.trim().unwrap(), first, "every lane acked the gap's entry");
    let d = c.try_recv().unwrap_or_else(|e| panic!("cache after the trim: {e:?} ({:?})", via.last_error()));
    assert_eq!((pos(&d), d.attempt()), (first + 1, 1));
    d.ack().unwrap();
}

#[test]
fn w5_a_gap_whose_ack_reply_was_lost_and_then_trimmed_does_not_stick_the_lane() {
    gap_ack_lost_then_trimmed(false);
}

#[test]
fn w5_a_fast_path_gap_whose_ack_reply_was_lost_and_then_trimmed_does_not_stick_the_lane() {
    gap_ack_lost_then_trimmed(true);
}

// ----- one lane and many lanes, through a long run with trims and a restart --------------------

/// A stream of `sinks` (one sink, or several): the fan-out publishes 130 items (a fifth
/// unpositioned; the trim runs at entries 64 and 128, and through `RedisStream::trim` from
/// another handle every 10 items) while each lane's consumer takes them through its fast paths,
/// nacking now and then; then a restart of the fan-out, which must know the last position; every
/// item arrives once first on every lane, in order, and is acked; stats, `is_idle` and the
/// watermark agree. (Until the fan-out became the only publisher, this ran each lane's own
/// producer.)
fn per_lane_run(sinks: &[&str]) {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url, "lsfb");
    let s = builder(&url, &name, 8, sinks).build().unwrap();
    let trimmer = builder(&url, &name, 8, sinks).build().unwrap();
    let mut f = s.fanout().unwrap();
    let mut cs: Vec<_> = sinks.iter().map(|sink| s.attach(sink).unwrap()).collect();
    let mut got: Vec<Vec<(u64, u32)>> = vec![Vec::new(); sinks.len()];
    let take = |c: &mut lanestream::RedisConsumer<LaneItem>, got: &mut Vec<(u64, u32)>, nack_every: u64| {
        let mut i = 0;
        while let Ok(d) = c.try_recv() {
            i += 1;
            got.push((id_of(&d), d.attempt()));
            if nack_every > 0 && i % nack_every == 0 && d.attempt() == 1 {
                d.nack();
            } else {
                d.ack().unwrap();
            }
        }
    };
    for k in 1..=130u64 {
        // Each lane's consumer drains every round: never full.
        f.try_publish(item(k)).unwrap_or_else(|e| panic!("publish {k}: {e:?}"));
        for (i, c) in cs.iter_mut().enumerate() {
            take(c, &mut got[i], 7);
        }
        if k % 10 == 0 {
            trimmer.trim().unwrap();
        }
    }
    drop(f);
    let restarted = open_lanes(&url, &name, sinks);
    let mut f = restarted.fanout().unwrap();
    match f.try_publish(batch(129)) {
        Err(PublishError::PositionRegressed { last, .. }) => assert_eq!(last, Position(129)),
        other => panic!("position 129 again after a restart: {other:?}"),
    }
    f.try_publish(item(131)).unwrap();
    for (i, c) in cs.iter_mut().enumerate() {
        take(c, &mut got[i], 0);
    }
    for (i, sink) in sinks.iter().enumerate() {
        let firsts: Vec<u64> = got[i].iter().filter(|(_, a)| *a == 1).map(|(k, _)| *k).collect();
        assert_eq!(firsts, (1..=131).collect::<Vec<_>>(), "lane {sink}: first deliveries");
        let mut all: Vec<u64> = got[i].iter().map(|(k, _)| *k).collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 131, "lane {sink}");
        let st = s.stats(sink).unwrap();
        assert_eq!(
            (st.published, st.acked_items, st.last_published),
            (131, 131, Some(Position(131))),
            "lane {sink}"
        );
        assert_eq!(s.acked(sink).unwrap(), Some(Position(131)), "lane {sink}");
    }
    assert!(s.is_idle());
    assert_eq!(s.watermark(), Some(Position(131)));
}

fn open_lanes(url: &str, name: &str, sinks: &[&str]) -> RedisStream {
    builder(url, name, 8, sinks).build().unwrap()
}

#[test]
fn l5_the_lone_lane_keeps_its_counts_positions_and_items_across_trims_and_a_restart() {
    per_lane_run(&["search"]);
}

#[test]
fn l5_every_lane_keeps_its_counts_positions_and_items_across_trims_and_a_restart() {
    per_lane_run(&SINKS);
}
/// One step of the random sequence, on both the Redis fan-out stream and an in-memory stream
/// with a shared ring and its `Fanout` (the reference).
#[derive(Clone, Debug)]
enum Op {
    /// `try_publish` of the next position.
    Publish,
    /// `try_publish_to` lane (mod lanes) of the next position.
    PublishTo(usize),
    /// `try_publish` of the last position again (refused if it landed on some lane).
    Republish,
    /// `try_publish` of a snapshot (no position).
    Snapshot,
    /// `try_recv` on a lane; a delivery is held.
    Recv(usize),
    /// Ack held delivery (mod held) of a lane.
    Ack(usize, usize),
    /// Nack held delivery (mod held) of a lane.
    Nack(usize, usize),
    /// Re-attach a lane (its held deliveries dropped after: stale).
    Reattach(usize),
    /// Every handle dropped; the stream (Redis: rebuilt from the server), its fan-out and every
    /// lane's consumer (re-attached) made again.
    Restart,
    /// Close a lane.
    Close(usize),
    /// `try_recv` on a lane, and the delivery (if any) acked at once.
    RecvAck(usize),
    /// `RedisStream::trim` on the Redis side (nothing on the in-memory side: a trim must change
    /// nothing anyone observes).
    Trim,
    /// The next step's first request that matches (0: the fan-out's publish `XADD`, 1: its gate, 2: a
    /// lane's delivery-log `XADD`, 3: its ack-log `XADD`, 4: any script) is cut, after the
    /// server ran it (`true`) or before; the pool's one fresh retry then goes through (only in
    /// the model that talks through the proxy).
    Cut(usize, usize, bool),
}

fn cut_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => op(),
        1 => (0..5usize, 0..3usize, any::<bool>()).prop_map(|(w, l, a)| Op::Cut(w, l, a)),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => Just(Op::Publish),
        3 => (0..3usize).prop_map(Op::PublishTo),
        1 => Just(Op::Republish),
        1 => Just(Op::Snapshot),
        7 => (0..3usize).prop_map(Op::Recv),
        5 => (0..3usize, 0..4usize).prop_map(|(l, i)| Op::Ack(l, i)),
        1 => (0..3usize, 0..4usize).prop_map(|(l, i)| Op::Nack(l, i)),
        1 => (0..3usize).prop_map(Op::Reattach),
        1 => Just(Op::Restart),
        1 => (0..3usize).prop_map(Op::Close),
        6 => (0..3usize).prop_map(Op::RecvAck),
        3 => Just(Op::Trim),
    ]
}

/// The outcome of a publish, as both sides tell it.
fn published<T>(r: Result<(), PublishError<T>>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(PublishError::Full(_)) => "full".into(),
        Err(PublishError::Closed(_)) => "closed".into(),
        Err(PublishError::PositionRegressed { position, last, .. }) => {
            format!("regressed {position:?} {last:?}")
        }
        Err(PublishError::InvalidPosition(_)) => "invalid".into(),
        Err(PublishError::Backend { error, .. }) => format!("backend {error:?}"),
        Err(_) => "another refusal".into(),
    }
}

fn recv_one<C: LaneConsumer<LaneItem>>(c: &mut C, held: &mut Vec<C::Delivery>) -> String {
    match c.try_recv() {
        Ok(d) => {
            let s = format!("item {:?} attempt {}", d.position(), d.attempt());
            held.push(d);
            s
        }
        Err(e) => format!("{e:?}"),
    }
}

fn settle<D: LaneDelivery<LaneItem>>(held: &mut Vec<D>, i: usize, ack: bool) -> String {
    if held.is_empty() {
        return "none held".into();
    }
    let d = held.remove(i % held.len());
    let p = d.position();
    if ack {
        format!("ack {p:?}: {:?}", d.ack())
    } else {
        d.nack();
        format!("nack {p:?}")
    }
}

/// One side of the model: a stream, its fan-out, every lane's consumer and held deliveries.
trait Side {
    fn publish(&mut self, to: Option<usize>, p: u64) -> String;
    fn recv(&mut self, lane: usize) -> String;
    fn settle(&mut self, lane: usize, i: usize, ack: bool) -> String;
    fn reattach(&mut self, lane: usize);
    fn restart(&mut self);
    fn close(&mut self, lane: usize);
    /// is_idle, the watermark, each lane's (published, acked items, acked position).
    fn observe(&self) -> (String, String);
}

struct MemSide {
    sinks: Vec<&'static str>,
    stream: MemoryStream,
    fan: Option<lanestream::Fanout>,
    cons: Vec<<MemoryStream as Stream>::Consumer>,
    held: Vec<Vec<<<MemoryStream as Stream>::Consumer as LaneConsumer<LaneItem>>::Delivery>>,
}

impl MemSide {
    fn new(sinks: &[&'static str], capacity: usize) -> MemSide {
        let stream = MemoryStream::builder().capacity(capacity).sinks(sinks.iter().copied()).build().unwrap();
        let fan = Some(stream.fanout().unwrap());
        let cons = sinks.iter().map(|s| Stream::attach(&stream, s).unwrap()).collect();
        MemSide { sinks: sinks.to_vec(), stream, fan, cons, held: sinks.iter().map(|_| Vec::new()).collect() }
    }
}

impl MemSide {
    /// Acks the newest held delivery of `lane` (the one a `RecvAck` just received), if any.
    fn settle_last(&mut self, lane: usize) -> String {
        match self.held[lane].pop() {
            Some(d) => format!("{:?}", d.ack()),
            None => String::new(),
        }
    }
}

impl Side for MemSide {
    fn publish(&mut self, to: Option<usize>, p: u64) -> String {
        let f = self.fan.as_mut().unwrap();
        let item = if p == 0 { common::snapshot() } else { batch(p) };
        published(match to {
            Some(i) => f.try_publish_to(i, item),
            None => f.try_publish(item),
        })
    }
    fn recv(&mut self, lane: usize) -> String {
        recv_one(&mut self.cons[lane], &mut self.held[lane])
    }
    fn settle(&mut self, lane: usize, i: usize, ack: bool) -> String {
        settle(&mut self.held[lane], i, ack)
    }
    fn reattach(&mut self, lane: usize) {
        self.cons[lane] = Stream::reattach(&self.stream, self.sinks[lane]).unwrap();
        self.held[lane].clear();
    }
    fn restart(&mut self) {
        self.held.iter_mut().for_each(Vec::clear);
        self.fan = None;
        self.fan = Some(self.stream.fanout().unwrap());
        for (i, sink) in self.sinks.iter().enumerate() {
            self.cons[i] = Stream::reattach(&self.stream, sink).unwrap();
        }
    }
    fn close(&mut self, lane: usize) {
        Stream::close(&self.stream, self.sinks[lane]).unwrap();
    }
    fn observe(&self) -> (String, String) {
        observe(&self.stream, &self.sinks)
    }
}

/// Idleness and each lane's counts; then the watermark and each lane's acked position (which
/// may differ once a gap was passed: the in-memory lane's acked position may move to a gap's,
/// see the contract's shared-ring section).
fn observe<S: Stream>(s: &S, sinks: &[&str]) -> (String, String) {
    let stats: Vec<_> = sinks.iter().map(|sink| (sink, s.stats(sink).unwrap())).collect();
    let counts: Vec<String> = stats
        .iter()
        .map(|(sink, st)| {
            format!(
                "{sink}: published {} acked_items {} queued {} in_flight {} released {}",
                st.published, st.acked_items, st.queued, st.in_flight, st.released
            )
        })
        .collect();
    let acked: Vec<String> = stats.iter().map(|(sink, st)| format!("{sink}: acked {:?}", st.acked)).collect();
    (
        format!("idle {}; {}", s.is_idle(), counts.join("; ")),
        format!("watermark {:?}; {}", s.watermark(), acked.join("; ")),
    )
}

struct RedisSide {
    url: String,
    name: String,
    capacity: usize,
    sinks: Vec<&'static str>,
    stream: RedisStream,
    fan: Option<RedisFanout>,
    cons: Vec<lanestream::RedisConsumer<LaneItem>>,
    held: Vec<Vec<RedisDelivery<LaneItem>>>,
}

impl RedisSide {
    fn new(url: &str, name: &str, sinks: &[&'static str], capacity: usize) -> RedisSide {
        let stream = open_sinks(url, name, capacity, sinks);
        let fan = Some(stream.fanout().unwrap());
        let cons = sinks.iter().map(|s| stream.attach(s).unwrap()).collect();
        RedisSide {
            url: url.to_owned(),
            name: name.to_owned(),
            capacity,
            sinks: sinks.to_vec(),
            stream,
            fan,
            cons,
            held: sinks.iter().map(|_| Vec::new()).collect(),
        }
    }
}

impl RedisSide {
    /// As `MemSide::settle_last`.
    fn settle_last(&mut self, lane: usize) -> String {
        match self.held[lane].pop() {
            Some(d) => format!("{:?}", d.ack()),
            None => String::new(),
        }
    }
}

impl Side for RedisSide {
    fn publish(&mut self, to: Option<usize>, p: u64) -> String {
        let f = self.fan.as_mut().unwrap();
        let item = if p == 0 { common::snapshot() } else { batch(p) };
        published(match to {
            Some(i) => f.try_publish_to(i, item),
            None => f.try_publish(item),
        })
    }
    fn recv(&mut self, lane: usize) -> String {
        recv_one(&mut self.cons[lane], &mut self.held[lane])
    }
    fn settle(&mut self, lane: usize, i: usize, ack: bool) -> String {
        settle(&mut self.held[lane], i, ack)
    }
    fn reattach(&mut self, lane: usize) {
        self.cons[lane] = self.stream.reattach(self.sinks[lane]).unwrap();
        self.held[lane].clear();
    }
    fn restart(&mut self) {
        self.held.iter_mut().for_each(Vec::clear);
        self.cons.clear();
        self.fan = None;
        self.stream = open_sinks(&self.url, &self.name, self.capacity, &self.sinks);
        self.fan = Some(self.stream.fanout().unwrap());
        self.cons = self.sinks.iter().map(|s| self.stream.reattach(s).unwrap()).collect();
    }
    fn close(&mut self, lane: usize) {
        self.stream.close(self.sinks[lane]).unwrap();
    }
    fn observe(&self) -> (String, String) {
        observe(&self.stream, &self.sinks)
    }
}

/// Runs `ops` on both sides; the first step whose outcome differs fails, with the trace.
fn run_model(
    url: &str,
    lanes: usize,
    capacity: usize,
    ops: &[Op],
    compare_observed: bool,
) -> Result<(), TestCaseError> {
    run_model_via(url, None, lanes, capacity, ops, compare_observed)
}

/// [`run_model`], the Redis side talking through `via` (which the `Cut` steps arm).
fn run_model_via(
    url: &str,
    via: Option<&CutProxy>,
    lanes: usize,
    capacity: usize,
    ops: &[Op],
    compare_observed: bool,
) -> Result<(), TestCaseError> {
    let sinks = &SINKS[..lanes];
    let (name, _cleanup, mut admin) = setup(url, "lsfb");
    let mut mem = MemSide::new(sinks, capacity);
    let mut red = RedisSide::new(via.map_or(url, |p| p.url.as_str()), &name, sinks, capacity);
    let mut cut: Option<(Vec<u8>, bool)> = None;
    let mut next = 0u64;
    let mut gaps = false;
    let mut closed = false;
    let mut trace = Vec::new();
    for op in ops {
        if let Op::Cut(what, lane, after) = *op {
            let sink = sinks[lane % lanes];
            let pattern = match what {
                0 => APPEND.to_vec(),
                1 => GATE.to_vec(),
                2 => format!(":l:{sink}:dl\r\n").into_bytes(),
                3 => format!(":l:{sink}:al\r\n").into_bytes(),
                _ => b"EVALSHA".to_vec(),
            };
            cut = via.is_some().then_some((pattern, after));
            trace.push(format!("{op:?}"));
            continue;
        }
        if let (Some(proxy), Some((pattern, after))) = (via, cut.take()) {
            proxy.arm(&pattern, after);
        }
        let (m, r) = match *op {
            Op::Publish | Op::PublishTo(_) => {
                next += 1;
                let to = match *op {
                    Op::PublishTo(i) => Some(i % lanes),
                    _ => None,
                };
                (mem.publish(to, next), red.publish(to, next))
            }
            Op::Republish => {
                if next == 0 {
                    next = 1;
                }
                (mem.publish(None, next), red.publish(None, next))
            }
            Op::Snapshot => (mem.publish(None, 0), red.publish(None, 0)),
            Op::Recv(l) => (mem.recv(l % lanes), red.recv(l % lanes)),
            Op::Ack(l, i) => (mem.settle(l % lanes, i, true), red.settle(l % lanes, i, true)),
            Op::Nack(l, i) => (mem.settle(l % lanes, i, false), red.settle(l % lanes, i, false)),
            Op::Reattach(l) => {
                mem.reattach(l % lanes);
                red.reattach(l % lanes);
                (String::new(), String::new())
            }
            Op::Restart => {
                mem.restart();
                red.restart();
                (String::new(), String::new())
            }
            Op::Close(l) => {
                mem.close(l % lanes);
                red.close(l % lanes);
                (String::new(), String::new())
            }
            Op::RecvAck(l) => {
                let (m, r) = (mem.recv(l % lanes), red.recv(l % lanes));
                // Ack what this receive delivered (nothing when it found none).
                let ma = if m.starts_with("item") { mem.settle_last(l % lanes) } else { String::new() };
                let ra = if r.starts_with("item") { red.settle_last(l % lanes) } else { String::new() };
                (format!("{m}; {ma}"), format!("{r}; {ra}"))
            }
            Op::Trim => {
                red.stream.trim().unwrap();
                (String::new(), String::new())
            }
            Op::Cut(..) => unreachable!("handled above"),
        };
        if let Some(proxy) = via {
            proxy.disarm();
        }
        trace.push(format!("{op:?}: {r}"));
        // The known bug of `l3_l10_a_full_stream_with_a_closed_lane_refuses_as_closed`: left aside here
        // so that the model looks further.
        let r = if m == "closed" && r == "full" { m.clone() } else { r };
        // Likewise `l4_a_full_lane_hides_a_regressed_position_on_a_later_lane`.
        let r = if m.starts_with("regressed") && r == "full" { m.clone() } else { r };
        // The order of the refusals: the in-memory fan-out checks the position before the
        // lanes' close, the Redis gate each lane's close before its position.
        closed |= matches!(op, Op::Close(_));
        let r = if closed && m.starts_with("regressed") && r == "closed" { m.clone() } else { r };
        prop_assert_eq!(&m, &r, "step {} diverged; trace:\n{}", trace.len(), trace.join("\n"));
        gaps |= matches!(op, Op::PublishTo(_)) && r == "ok";
        if compare_observed {
            let (mo, ro) = (mem.observe(), red.observe());
            prop_assert_eq!(&mo.0, &ro.0, "after step {}; trace:\n{}", trace.len(), trace.join("\n"));
            if !gaps {
                prop_assert_eq!(&mo.1, &ro.1, "after step {}; trace:\n{}", trace.len(), trace.join("\n"));
            }
        }
    }
    // The log's and the publish logs' last ids never diverge.
    assert_last_ids_equal(&mut admin, &name, sinks);
    if std::env::var_os("FANOUT_MODEL_TRACE").is_some() {
        eprintln!("model: {} lanes, capacity {capacity}:\n{}", lanes, trace.join("\n"));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, max_shrink_iters: 400, failure_persistence: None, ..ProptestConfig::default() })]

    /// The first pass's model against the in-memory shared-ring fan-out (same publish outcomes,
    /// deliveries, ack results, and after every step the same idleness, counts, watermark and
    /// acked positions), with `RedisStream::trim` between the steps.
    #[test]
    fn l2_l5_the_redis_fanout_follows_the_in_memory_shared_ring_through_trims(
        lanes in 2..=3usize,
        capacity in 2..=4usize,
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let Some(url) = redis_support::url() else { return Ok(()) };
        run_model(&url, lanes, capacity, &ops, true)?;
    }

    /// As above without the observations between the steps (each is a fold of every lane,
    /// which hides a trim that runs before the lanes folded). It did not find the bug of
    /// `l5_w5_a_trim_that_empties_the_log_keeps_every_lanes_publish_count` in 700 cases (that needs
    /// every lane to take a whole room's worth of entries through its fast paths, then the trim,
    /// then a gated publish or a restart): that bug has its own tests.
    #[test]
    fn l2_l5_the_redis_fanout_follows_the_in_memory_shared_ring_through_trims_unobserved(
        lanes in 2..=3usize,
        capacity in 2..=4usize,
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let Some(url) = redis_support::url() else { return Ok(()) };
        run_model(&url, lanes, capacity, &ops, false)?;
    }
}

proptest! {
    // Each cut costs a reconnect (and 80 ms when the server runs the request first): fewer cases.
    #![proptest_config(ProptestConfig { cases: 64, max_shrink_iters: 200, failure_persistence: None, ..ProptestConfig::default() })]

    /// As above (observed), the Redis side talking through a proxy that cuts one request now and
    /// then (the fan-out's publish `XADD`, its gate, a lane's plain receive or ack, any script),
    /// with trims and receive-and-ack steps between.
    #[test]
    fn l2_l5_the_redis_fanout_follows_the_in_memory_shared_ring_through_lost_replies_and_trims(
        lanes in 2..=3usize,
        capacity in 2..=4usize,
        ops in proptest::collection::vec(cut_op(), 1..60),
    ) {
        let Some(url) = redis_support::url() else { return Ok(()) };
        static PROXY: std::sync::OnceLock<Option<CutProxy>> = std::sync::OnceLock::new();
        let Some(proxy) = PROXY.get_or_init(|| CutProxy::start(&url)).as_ref() else { return Ok(()) };
        run_model_via(&url, Some(proxy), lanes, capacity, &ops, true)?;
    }
}
