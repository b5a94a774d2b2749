//! The Redis fan-out stream (`RedisStreamBuilder::fanout`, issue 12), attacked: lost replies on
//! the fan-out's publish `XADD` and on its gate, zombie fan-outs at every edge of the fence, closes
//! racing publishes, gaps at redeliveries, at the capacity edge, next to nacks and re-attaches,
//! restarts and the trim (the random-sequence model against the in-memory shared-ring `Fanout`
//! is in `tests/redis/fanout_publish_record.rs`).
//!
//! Needs a server (`LANESTREAM_REDIS_URL`); the lost-reply tests need it on a unix socket
//! (`redis+unix://PATH`), as in CI, and are skipped (with a word) otherwise.
#![cfg(feature = "redis")]

use crate::{common, redis_support};
use lanestream::prelude::*;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::batch;
use lanestream::{
    BackendError, LaneConsumer, MemoryStream, Position, PublishError, RedisFanout, RedisStream, Stream,
    StreamError, StreamFanout, TryRecvError,
};
use redis_support::fanout::{firsts, open, open_sinks, setup, SINKS};
use redis_support::{drain_ack, kill_connections, log_ids, pos};

/// `XINFO STREAM`'s `last-generated-id` of `key`.
fn last_id(admin: &mut redis::Connection, key: &str) -> String {
    let v: Vec<redis::Value> = redis::cmd("XINFO").arg("STREAM").arg(key).query(admin).unwrap();
    let mut it = v.iter();
    while let Some(k) = it.next() {
        let val = it.next().unwrap();
        if matches!(k, redis::Value::BulkString(b) if b == b"last-generated-id") {
            return match val {
                redis::Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
                redis::Value::SimpleString(s) => s.clone(),
                other => panic!("last-generated-id: {other:?}"),
            };
        }
    }
    panic!("no last-generated-id for {key}: {v:?}")
}

/// The log's last id (the fan-out's fence; the lanes of a fan-out stream keep no publish log of
/// their own: their publish record is the log). `sinks` are checked to have none.
fn assert_last_ids_equal(admin: &mut redis::Connection, name: &str, sinks: &[&str]) -> String {
    let log = last_id(admin, &format!("{{{name}}}:log"));
    for sink in sinks {
        let exists: i64 = redis::cmd("EXISTS").arg(format!("{{{name}}}:l:{sink}:pl")).query(admin).unwrap();
        assert_eq!(exists, 0, "lane {sink} of a fan-out stream has a publish log");
    }
    log
}

fn is_fenced<T: std::fmt::Debug>(r: &Result<(), PublishError<T>>) -> bool {
    matches!(r, Err(PublishError::Backend { error: BackendError::Fenced, .. }))
}

// ----- a proxy that cuts one request ----------------------------------------------------------

use redis_support::cut_proxy::{APPEND, GATE};

/// Every lane's deliveries, drained through a second handle (another process) and acked.
fn drain_all(url: &str, name: &str, capacity: usize) -> Vec<Vec<(u64, u32)>> {
    let s = open(url, name, capacity);
    SINKS.iter().map(|sink| drain_ack(&mut s.reattach(sink).unwrap())).collect()
}

// ----- lost replies -----------------------------------------------------------------------------

/// A `try_publish` whose publish `XADD` landed but whose reply was lost errs (when the pool's one
/// fresh retry cannot reach Redis either); the same item published again is that publish (lands
/// once), another item goes after it. When the fresh retry does reach Redis, the publish
/// resolves itself: `Ok`, landed once. On every lane, once each; the log holds each entry once.
#[test]
fn l2_a_lost_publish_reply_then_the_same_or_another_item_lands_once_in_order() {
    let url = server!();
    let proxy = proxy!(url);
    for (retry_same, refuse) in [(true, true), (false, true), (false, false)] {
        let (name, _cleanup, mut admin) = setup(&url, "lsfa");
        let s = open(&proxy.url, &name, 16);
        let mut f = s.fanout().unwrap();
        f.publish(batch(1)).unwrap();
        let before = proxy.cuts();
        if refuse {
            proxy.arm_refusing(APPEND, true);
        } else {
            proxy.arm(APPEND, true);
        }
        let lost = f.try_publish(batch(2));
        assert_eq!(proxy.cuts(), before + 1, "the proxy cut the publish XADD");
        proxy.heal();
        if refuse {
            assert!(
                matches!(lost, Err(PublishError::Backend { error: BackendError::Connection, .. })),
                "{lost:?}"
            );
        } else {
            assert!(lost.is_ok(), "the fresh retry finds it landed: {lost:?}");
        }
        let next = if retry_same { 2 } else { 3 };
        f.publish(batch(next)).unwrap();
        f.publish(batch(10)).unwrap();
        let want: Vec<u64> = if retry_same { vec![1, 2, 10] } else { vec![1, 2, 3, 10] };
        assert_eq!(log_ids(&mut admin, &name), (1..=want.len() as u64).collect::<Vec<_>>());
        for (sink, got) in SINKS.iter().zip(drain_all(&url, &name, 16)) {
            assert_eq!(got, firsts(want.clone()), "lane {sink}, retry_same {retry_same}, refuse {refuse}");
        }
        assert_last_ids_equal(&mut admin, &name, &SINKS);
    }
}

/// A waiting `publish` whose publish `XADD`'s reply is lost retries within its budget: the retry finds
/// the entry landed (the gate's `dup`) and returns `Ok` once; nothing lands twice.
#[test]
fn l3_a_waiting_publish_retries_a_lost_publish_reply_and_lands_once() {
    let url = server!();
    let proxy = proxy!(url);
    let (name, _cleanup, mut admin) = setup(&url, "lsfa");
    let s = open(&proxy.url, &name, 16);
    let mut f = s.fanout().unwrap();
    for p in 1..=6 {
        proxy.arm(APPEND, p % 2 == 0);
        f.publish(batch(p)).unwrap();
        proxy.disarm();
    }
    assert!(proxy.cuts() >= 5, "the proxy cut {} publish XADDs", proxy.cuts());
    assert_eq!(log_ids(&mut admin, &name), (1..=6).collect::<Vec<_>>());
    for (sink, got) in SINKS.iter().zip(drain_all(&url, &name, 16)) {
        assert_eq!(got, firsts(1..=6), "lane {sink}");
    }
    assert_last_ids_equal(&mut admin, &name, &SINKS);
}

/// The gate's reply lost (a publish that has to ask: the first after the claim, every 64th, a
/// full lane): the publish errs (never-waiting) or retries (waiting); nothing lands twice and
/// nothing is skipped, also across the 64th entry (whose gate trims).
#[test]
fn l2_a_lost_gate_reply_neither_duplicates_nor_skips() {
    let url = server!();
    let proxy = proxy!(url);
    let (name, _cleanup, mut admin) = setup(&url, "lsfa");
    let s = open(&proxy.url, &name, 256);
    let mut f = s.fanout().unwrap();
    proxy.arm_refusing(GATE, true);
    let first = f.try_publish(batch(1));
    proxy.heal();
    assert!(matches!(first, Err(PublishError::Backend { .. })), "the gate's reply was lost: {first:?}");
    assert_eq!(proxy.cuts(), 1);
    f.try_publish(batch(1)).unwrap();
    for p in 2..=63 {
        f.try_publish(batch(p)).unwrap();
    }
    // Entry 64 runs the gate: lose its reply (waiting: retried), then 65 and 128 never-waiting.
    proxy.arm(GATE, true);
    f.publish(batch(64)).unwrap();
    assert_eq!(proxy.cuts(), 2, "the 64th entry's gate was cut");
    for p in 65..=127 {
        f.try_publish(batch(p)).unwrap();
    }
    proxy.arm_refusing(GATE, false); // the request lost this time
    assert!(f.try_publish(batch(128)).is_err());
    proxy.heal();
    f.try_publish(batch(128)).unwrap();
    assert_eq!(log_ids(&mut admin, &name), (1..=128).collect::<Vec<_>>());
    for (sink, got) in SINKS.iter().zip(drain_all(&url, &name, 256)) {
        assert_eq!(got, firsts(1..=128), "lane {sink}");
    }
    assert_last_ids_equal(&mut admin, &name, &SINKS);
}

/// A `publish_to` whose reply was lost, then the same item to every lane: the item landed on
/// lane 1 only, so a publish to every lane either lands it on the others or is refused
/// (position 2 does not rise on lane 1); an `Ok` that leaves lanes 0 and 2 without it loses it.
#[test]
fn l2_an_unsure_publish_to_is_not_taken_for_a_publish_to_every_lane() {
    let url = server!();
    let proxy = proxy!(url);
    let (name, _cleanup, _admin) = setup(&url, "lsfa");
    let s = open(&proxy.url, &name, 16);
    let mut f = s.fanout().unwrap();
    f.publish(batch(1)).unwrap();
    proxy.arm_refusing(APPEND, true);
    assert!(f.try_publish_to(1, batch(2)).is_err(), "the reply was lost");
    proxy.heal();
    let again = f.publish(batch(2));
    let got = drain_all(&url, &name, 16);
    match again {
        Ok(()) => {
            for (sink, g) in SINKS.iter().zip(&got) {
                assert_eq!(g, &firsts(1..=2), "publish(2) returned Ok: lane {sink} must have it");
            }
        }
        Err(PublishError::PositionRegressed { .. }) => {}
        Err(e) => panic!("{e:?}"),
    }
}

// ----- zombies ----------------------------------------------------------------------------------

/// Frees the fan-out's claim behind its back (as if its process had died).
fn free_claim(admin: &mut redis::Connection, name: &str) {
    let _: i64 = redis::cmd("HSET").arg(format!("{{{name}}}:meta")).arg("fh").arg("").query(admin).unwrap();
}

/// A zombie fan-out (its claim taken over) lands nothing: not on room it knew, not at the fence
/// edge (its next entry number is the new one's first), not on its 64th entry (a gate), not with
/// `publish_to`, not from a waiting `publish` (which must return, not wait forever), and not by
/// retrying an unsure publish; the live one's entries are whole on every lane.
#[test]
fn l9_a_zombie_fanout_lands_nothing_at_any_edge() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url, "lsfa");
    let s1 = open(&url, &name, 8);
    let mut consumers: Vec<_> = SINKS.iter().map(|sink| s1.attach(sink).unwrap()).collect();
    let mut old = s1.fanout().unwrap();
    for p in 1..=4 {
        old.publish(batch(p)).unwrap(); // room known up to 8
    }
    free_claim(&mut admin, &name);
    let s2 = open(&url, &name, 8);
    let mut live = s2.fanout().unwrap();
    // The fence edge: the zombie's next entry (5) is the live one's first; the zombie goes
    // first, then the live one.
    assert!(is_fenced(&old.try_publish(batch(5))), "zombie at the edge, on known room");
    assert!(is_fenced(&old.try_publish_to(0, batch(5))), "zombie publish_to");
    live.publish(batch(5)).unwrap();
    assert!(is_fenced(&old.try_publish(batch(6))));
    match old.publish_timeout(batch(6), Duration::from_secs(3)) {
        Err(PublishError::Backend { error: BackendError::Fenced, .. }) => {}
        other => panic!("a waiting zombie publish: {other:?}"),
    }
    // Fill to the brim: the zombie's waiting publish must come back fenced, not wait.
    for p in 6..=8 {
        live.publish(batch(p)).unwrap();
    }
    assert!(matches!(live.try_publish(batch(9)), Err(PublishError::Full(_))));
    let t = Instant::now();
    let r = old.publish_timeout(batch(9), Duration::from_secs(3));
    assert!(
        matches!(r, Err(PublishError::Backend { error: BackendError::Fenced, .. })),
        "a zombie on a full stream: {r:?} after {:?}",
        t.elapsed()
    );
    for (sink, c) in SINKS.iter().zip(&mut consumers) {
        assert_eq!(drain_ack(c), firsts(1..=8), "lane {sink}");
    }
    // The live one publishes up to its 64th entry and past; the zombie tries each time.
    for p in 9..=70 {
        live.publish(batch(p)).unwrap();
        assert!(is_fenced(&old.try_publish(batch(1000 + p))), "zombie publish beside {p}");
        if p % 8 == 0 {
            for c in &mut consumers {
                drain_ack(c);
            }
        }
    }
    assert_eq!(log_ids(&mut admin, &name).last(), Some(&70));
    for (sink, c) in SINKS.iter().zip(&mut consumers) {
        let rest = drain_ack(c);
        assert!(rest.iter().all(|&(p, a)| p <= 70 && a == 1), "lane {sink}: {rest:?}");
    }
    assert_last_ids_equal(&mut admin, &name, &SINKS);
    assert!(s2.is_idle());
    assert_eq!(s2.watermark(), Some(Position(70)));
}

/// A zombie whose last publish was unsure (its reply lost): once another fan-out took over,
/// its retry is fenced, never counted as the landed duplicate of someone else's entry.
#[test]
fn l9_a_zombie_retrying_an_unsure_publish_is_fenced() {
    let url = server!();
    let proxy = proxy!(url);
    let (name, _cleanup, mut admin) = setup(&url, "lsfa");
    let s1 = open(&proxy.url, &name, 16);
    let mut old = s1.fanout().unwrap();
    old.publish(batch(1)).unwrap();
    // The publish XADD is lost before it reaches the server: entry 2 did not land.
    proxy.arm_refusing(APPEND, false);
    assert!(old.try_publish(batch(2)).is_err());
    proxy.heal();
    free_claim(&mut admin, &name);
    let s2 = open(&url, &name, 16);
    let mut live = s2.fanout().unwrap();
    live.publish(batch(2)).unwrap(); // entry 2, the same bytes as the zombie's unsure one
    let r = old.try_publish(batch(2));
    assert!(is_fenced(&r), "a zombie's retry after another fan-out's entry 2: {r:?}");
    let r = old.try_publish(batch(3));
    assert!(is_fenced(&r), "{r:?}");
    live.publish(batch(3)).unwrap();
    for (sink, got) in SINKS.iter().zip(drain_all(&url, &name, 16)) {
        assert_eq!(got, firsts(1..=3), "lane {sink}");
    }
}

/// Another process claims the fan-out after the holder's connections were killed (its
/// process is taken for dead); the old one reconnects and is fenced, also on its 64th entry.
#[test]
fn l9_a_fanout_claimed_after_killing_its_connections_fences_the_reconnecting_one() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url, "lsfa");
    let s1 = open(&url, &name, 256);
    let mut old = s1.fanout().unwrap();
    for p in 1..=63 {
        old.publish(batch(p)).unwrap();
    }
    kill_connections(&mut admin, &name);
    let s2 = open(&url, &name, 256);
    let mut live = match s2.fanout() {
        Ok(f) => f,
        Err(e) => panic!("the holder's connections are dead, yet: {e:?}"),
    };
    // The old one's 64th entry (a gate) and a publish_to.
    let r = old.try_publish(batch(64));
    assert!(is_fenced(&r) || matches!(r, Err(PublishError::Backend { .. })), "{r:?}");
    assert!(is_fenced(&old.try_publish(batch(64))));
    assert!(is_fenced(&old.try_publish_to(2, batch(64))));
    live.publish(batch(64)).unwrap();
    assert!(is_fenced(&old.try_publish(batch(65))));
    // And the live one still holds it: a third claim is refused.
    let s3 = open(&url, &name, 256);
    assert!(matches!(s3.fanout(), Err(StreamError::ProducerBusy(_))));
    for (sink, got) in SINKS.iter().zip(drain_all(&url, &name, 256)) {
        assert_eq!(got, firsts(1..=64), "lane {sink}");
    }
    assert_last_ids_equal(&mut admin, &name, &SINKS);
}

/// `RedisStream::delete` under a live fan-out that knows it has room: its next plain publish `XADD`
/// must not bring the deleted stream back (NOMKSTREAM), and a stream built again under the
/// name starts empty.
#[test]
fn l9_a_fanout_publish_after_delete_does_not_resurrect_the_stream() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url, "lsfa");
    let s1 = open(&url, &name, 64);
    let mut old = s1.fanout().unwrap();
    for p in 1..=3 {
        old.publish(batch(p)).unwrap();
    }
    s1.delete().unwrap();
    let after = old.try_publish(batch(4));
    let left = redis_support::keys_of(&mut admin, &name).unwrap();
    assert!(after.is_err() && left.is_empty(), "after delete: {after:?}, keys left {left:?}");
}

/// `RedisStream::delete`, the stream built again and its fan-out claimed, while the deleted
/// stream's fan-out lives on in another process and knows it has room (64 places, 5 used):
/// its next plain publish `XADD` carries id `<6>-<old epoch>`, above the new stream's fence
/// `<1>-<new epoch - 1>` (the entry number is the id's major part), so it must be refused some
/// other way; else it writes entry 6 into the new stream, the new fan-out's gate finds the
/// lanes' count at 6 and answers `fenced` to the live fan-out, and the lanes' consumers look for
/// entry 1, which is not there.
#[test]
#[ignore = "known limitation, documented (README, RedisStream::delete): a fan-out (or producer) \
            of a deleted stream still publishing on known room lands its XADD in the stream built \
            again (the fence orders ids by entry number first, and a new stream starts at 1)"]
fn l9_a_deleted_streams_fanout_does_not_publish_into_the_stream_built_again() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url, "lsfa");
    let s1 = open(&url, &name, 64);
    let mut old = s1.fanout().unwrap();
    for p in 1..=5 {
        old.publish(batch(p)).unwrap();
    }
    s1.delete().unwrap();
    let s2 = open(&url, &name, 64);
    let mut live = s2.fanout().unwrap();
    let zombie = old.try_publish(batch(100));
    let ids = log_ids(&mut admin, &name);
    let first = live.try_publish(batch(1));
    let mut c = s2.attach("search").unwrap();
    let got = c.try_recv().map(|d| pos(&d));
    assert!(
        zombie.is_err() && ids.is_empty() && first.is_ok() && matches!(got, Ok(1)),
        "the deleted stream's fan-out: {zombie:?}; the new log holds {ids:?}; the new fan-out's \
         first publish: {first:?}; the new lane's first receive: {got:?} ({:?})",
        s2.last_error()
    );
}

/// A fan-out stream of one sink: `publish_to(0)` is a publish (no gap), the field `t` names the
/// lane itself and is delivered; the trim and a restart work as with more lanes.
#[test]
fn w5_a_fanout_of_one_lane_has_no_gaps() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url, "lsfa");
    {
        let s = open_sinks(&url, &name, 8, &["only"]);
        let mut f = s.fanout().unwrap();
        let mut c = s.attach("only").unwrap();
        for p in 1..=70 {
            if p % 2 == 0 {
                f.publish_to(0, batch(p)).unwrap();
            } else {
                f.publish(batch(p)).unwrap();
            }
            assert_eq!(drain_ack(&mut c), firsts(p..=p));
        }
        f.publish_to(0, batch(71)).unwrap();
    }
    let s = open_sinks(&url, &name, 8, &["only"]);
    let mut f = s.fanout().unwrap();
    assert!(matches!(f.try_publish_to(0, batch(71)), Err(PublishError::PositionRegressed { .. })));
    f.publish(batch(72)).unwrap();
    assert_eq!(drain_ack(&mut s.reattach("only").unwrap()), firsts(71..=72));
    assert!(log_ids(&mut admin, &name).first().is_some_and(|&n| n >= 64), "trimmed at entry 64");
    assert_last_ids_equal(&mut admin, &name, &["only"]);
    assert_eq!(s.watermark(), Some(Position(72)));
}

/// A close of the very lane a waiting publish waits on (full) wakes it at once with `Closed`.
#[test]
fn l10_a_close_of_the_full_lane_wakes_a_waiting_publish() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url, "lsfa");
    let s = open(&url, &name, 2);
    let mut f = s.fanout().unwrap();
    f.publish(batch(1)).unwrap();
    f.publish(batch(2)).unwrap();
    let waiting = thread::spawn(move || {
        let t = Instant::now();
        let r = f.publish_timeout(batch(3), Duration::from_secs(5));
        (matches!(r, Err(PublishError::Closed(_))), t.elapsed())
    });
    thread::sleep(Duration::from_millis(100));
    s.close("search").unwrap();
    let (closed, waited) = waiting.join().unwrap();
    assert!(closed, "the waiting publish ends Closed");
    assert!(waited < Duration::from_millis(500), "woken by the close's ring, not a wait slice: {waited:?}");
}

// ----- close racing publishes -------------------------------------------------------------------

/// A close of one lane (from another thread, or another process's handle) racing a publishing
/// thread: every publish that returned `Ok` is delivered on every lane it went to, none that
/// returned `Closed` is; every lane drains, only the closed one reports closed; the log's and
/// the publish logs' last ids stay equal (at the close fence).
#[test]
fn l10_a_close_racing_publishes_loses_nothing_and_delivers_nothing_refused() {
    let url = server!();
    for round in 0..6u64 {
        let (name, _cleanup, mut admin) = setup(&url, "lsfa");
        let s = open(&url, &name, 4096);
        let other = open(&url, &name, 4096); // the closer, as another process
        let mut f = s.fanout().unwrap();
        let publisher = thread::spawn(move || {
            // (position, target lane or every lane, landed)
            let mut log = Vec::new();
            for p in 1..=3000u64 {
                let to = if p % 5 == 0 { Some((p / 5 % 3) as usize) } else { None };
                let r = match to {
                    Some(i) => f.publish_to(i, batch(p)),
                    None => f.publish(batch(p)),
                };
                match r {
                    Ok(()) => log.push((p, to, true)),
                    Err(PublishError::Closed(item)) => {
                        assert_eq!(item.position(), Some(Position(p)));
                        log.push((p, to, false));
                        if log.iter().filter(|e| !e.2).count() > 3 {
                            break;
                        }
                    }
                    Err(e) => panic!("publish {p}: {e:?}"),
                }
            }
            log
        });
        thread::sleep(Duration::from_millis(2 + round * 7));
        let closed = (round % 3) as usize;
        if round % 2 == 0 {
            other.close(SINKS[closed]).unwrap();
        } else {
            s.close(SINKS[closed]).unwrap();
        }
        let log = publisher.join().unwrap();
        let refused = log.iter().filter(|e| !e.2).count();
        assert!(refused > 0, "round {round}: the close came after 3000 publishes; {} landed", log.len());
        let first_refused = log.iter().position(|e| !e.2).unwrap();
        assert!(log[first_refused..].iter().all(|e| !e.2), "a publish landed after a refused one");
        for (i, sink) in SINKS.iter().enumerate() {
            let want: Vec<u64> =
                log.iter().filter(|(_, to, ok)| *ok && to.is_none_or(|t| t == i)).map(|e| e.0).collect();
            let mut c = other.reattach(sink).unwrap();
            let got: Vec<u64> = drain_ack(&mut c).into_iter().map(|(p, _)| p).collect();
            assert_eq!(got, want, "round {round}, lane {sink} (closed: {})", SINKS[closed]);
            let end = c.try_recv();
            if i == closed {
                assert!(matches!(end, Err(TryRecvError::Closed)), "{end:?}");
            } else {
                assert!(matches!(end, Err(TryRecvError::Empty)), "{end:?}");
            }
        }
        let last = assert_last_ids_equal(&mut admin, &name, &SINKS);
        assert_eq!(last, "18446744073709551615-0", "the close fence");
        assert!(other.is_idle(), "round {round}");
    }
}

/// A closed lane refuses every later publish of any fan-out: a new claim, `publish_to` another
/// lane, and a publish on room the fan-out knew; the log and publish logs stay fenced.
#[test]
fn l10_a_closed_lane_refuses_a_new_fanout_and_known_room() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url, "lsfa");
    let s = open(&url, &name, 64);
    let mut f = s.fanout().unwrap();
    f.publish(batch(1)).unwrap();
    s.close("archive").unwrap();
    assert!(matches!(f.try_publish(batch(2)), Err(PublishError::Closed(_))));
    assert!(matches!(f.try_publish_to(0, batch(2)), Err(PublishError::Closed(_))));
    drop(f);
    let s2 = open(&url, &name, 64);
    let mut g = s2.fanout().unwrap();
    assert!(matches!(g.try_publish_to(1, batch(2)), Err(PublishError::Closed(_))));
    assert_eq!(log_ids(&mut admin, &name), vec![1]);
    assert_eq!(assert_last_ids_equal(&mut admin, &name, &SINKS), "18446744073709551615-0");
}

/// L10 as the in-memory fan-out: a closed lane refuses the publish even while another lane is
/// full (rather than the publish waiting for room). The Redis gate checks the lanes in order
/// and answers `full` for a full lane before it looks at a later, closed one: a waiting publish
/// then waits on the full lane's bell, which the close does not ring.
#[test]
fn l3_l10_a_full_stream_with_a_closed_lane_refuses_as_closed() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url, "lsfa");
    let s = open(&url, &name, 2);
    let mut f = s.fanout().unwrap();
    f.publish(batch(1)).unwrap();
    f.publish(batch(2)).unwrap();
    s.close("cache").unwrap();
    let r = f.try_publish(batch(3));
    assert!(matches!(r, Err(PublishError::Closed(_))), "try_publish: {r:?}");
    let t = Instant::now();
    let r = f.publish_timeout(batch(3), Duration::from_secs(2));
    assert!(matches!(r, Err(PublishError::Closed(_))), "publish: {r:?} after {:?}", t.elapsed());
}

/// A position that does not rise on lane 1 is refused at once by the in-memory fan-out, whatever
/// the room; the Redis gate answers `full` for a full lane 0 first, so a waiting publish of an
/// item that can never land waits for lane 0's consumer, and only then learns it regressed.
#[test]
fn l4_a_full_lane_hides_a_regressed_position_on_a_later_lane() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url, "lsfa");
    let s = open(&url, &name, 2);
    let mut f = s.fanout().unwrap();
    f.publish(batch(1)).unwrap();
    f.publish_to(1, batch(5)).unwrap();
    let r = f.try_publish(batch(3));
    assert!(matches!(r, Err(PublishError::PositionRegressed { .. })), "try_publish: {r:?}");
    let t = Instant::now();
    let r = f.publish_timeout(batch(3), Duration::from_secs(2));
    assert!(
        matches!(r, Err(PublishError::PositionRegressed { .. })),
        "publish: {r:?} after {:?}",
        t.elapsed()
    );
}

// ----- gaps -------------------------------------------------------------------------------------

/// A gap whose plain ack was lost (the request never reached Redis, on a never-waiting receive)
/// must still be acked: the lane's consumer goes on receiving and acking everything it gets, so
/// the lane must come back to idle, its acked prefix must pass the gap, and the fan-out must not
/// stay full. Else the lane's acked prefix stops below the gap for good (until a re-attach).
#[test]
fn w5_a_gap_whose_ack_was_lost_is_acked_later() {
    let url = server!();
    let proxy = proxy!(url);
    let (name, _cleanup, _admin) = setup(&url, "lsfa");
    let s = open(&url, &name, 4);
    let via = open(&proxy.url, &name, 4); // lane 0's consumer's process talks through the proxy
    let mut c0 = via.attach("search").unwrap();
    let mut others: Vec<_> = SINKS[1..].iter().map(|sink| s.attach(sink).unwrap()).collect();
    let mut f = s.fanout().unwrap();
    f.publish(batch(1)).unwrap();
    f.publish_to(1, batch(2)).unwrap();
    f.publish(batch(3)).unwrap();
    let d = c0.try_recv().unwrap();
    assert_eq!(pos(&d), 1);
    d.ack().unwrap();
    proxy.arm_refusing(b":l:search:al\r\n", false); // the gap's ack never reaches Redis
    let r = c0.try_recv();
    proxy.heal();
    assert_eq!(proxy.cuts(), 1, "the gap's ack was cut");
    assert!(matches!(r, Err(TryRecvError::Backend(_))), "{r:?}");
    let d = c0.try_recv().unwrap();
    assert_eq!((pos(&d), d.attempt()), (3, 1));
    d.ack().unwrap();
    for c in &mut others {
        drain_ack(c);
    }
    assert!(matches!(c0.try_recv(), Err(TryRecvError::Empty)));
    let st = s.stats("search").unwrap();
    assert_eq!(st.acked_items, 3, "every entry of lane search was acked by its consumer: {st:?}");
    assert!(s.is_idle(), "lane search passed and acked everything it received");
    // The stream has room again: 4 more publishes fit.
    for p in 4..=7 {
        f.try_publish(batch(p)).unwrap_or_else(|e| panic!("publish {p}: {e:?}"));
    }
}

/// A gap whose ack landed but whose reply was lost: the same lane's later receives go on, the
/// gap is not delivered, nothing is delivered twice.
#[test]
fn w5_a_gap_whose_ack_reply_was_lost_is_passed_once() {
    let url = server!();
    let proxy = proxy!(url);
    let (name, _cleanup, _admin) = setup(&url, "lsfa");
    let s = open(&url, &name, 4);
    let via = open(&proxy.url, &name, 4);
    let mut c0 = via.attach("search").unwrap();
    let mut f = s.fanout().unwrap();
    f.publish_to(2, batch(1)).unwrap();
    f.publish(batch(2)).unwrap();
    proxy.arm_refusing(b":l:search:al\r\n", true);
    let r = c0.try_recv();
    proxy.heal();
    assert_eq!(proxy.cuts(), 1);
    let mut got: Vec<(u64, u32)> = Vec::new();
    if let Ok(d) = r {
        got.push((pos(&d), d.attempt()));
        d.ack().unwrap();
    }
    got.extend(drain_ack(&mut c0));
    assert_eq!(got, firsts(2..=2));
    assert_eq!(s.stats("search").unwrap().acked_items, 2);
}

/// A gap at a redelivery: the consumer received the gap's entry (its delivery recorded) but
/// died before its ack reached Redis; the re-attached consumer gets it again as a gap (attempt 2),
/// passes and acks it without a delivery, and delivers the unacked item around it again.
#[test]
fn l8_a_gap_redelivered_after_a_reattach_is_passed_not_delivered() {
    let url = server!();
    let proxy = proxy!(url);
    let (name, _cleanup, _admin) = setup(&url, "lsfa");
    let s = open(&url, &name, 8);
    let via = open(&proxy.url, &name, 8);
    let mut c0 = via.attach("search").unwrap();
    let mut f = s.fanout().unwrap();
    f.publish(batch(1)).unwrap();
    f.publish_to(1, batch(2)).unwrap();
    f.publish(batch(3)).unwrap();
    let held = c0.try_recv().unwrap(); // 1: delivered, never acked
    assert_eq!(pos(&held), 1);
    proxy.arm_refusing(b":l:search:al\r\n", false);
    assert!(c0.try_recv().is_err(), "the gap's ack was cut");
    std::mem::forget(held);
    drop(c0);
    proxy.heal();
    // Another process re-attaches: 1 again (attempt 2), the gap passed, 3 first delivery.
    let mut c = s.reattach("search").unwrap();
    assert_eq!(drain_ack(&mut c), vec![(1, 2), (3, 1)]);
    let st = s.stats("search").unwrap();
    assert_eq!((st.acked_items, st.acked), (3, Some(Position(3))), "{st:?}");
    let mut cache = s.attach("cache").unwrap();
    assert_eq!(drain_ack(&mut cache), firsts(1..=3));
    assert_eq!(drain_ack(&mut s.attach("archive").unwrap()), vec![(1, 1), (3, 1)]);
    assert!(s.is_idle());
    assert_eq!(s.watermark(), Some(Position(3)));
}

/// Gaps at the capacity edge: `publish_to` one lane fills every lane's room (each gap holds a
/// place until passed); the fan-out is full until every other lane's consumer passed them, and
/// a receive that only passes gaps (finding nothing to deliver) wakes a waiting publish.
#[test]
fn l3_gaps_fill_every_lane_and_passing_them_makes_room_and_wakes() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url, "lsfa");
    let s = open(&url, &name, 4);
    let mut cs: Vec<_> = SINKS.iter().map(|sink| s.attach(sink).unwrap()).collect();
    let mut f = s.fanout().unwrap();
    for p in 1..=4 {
        f.try_publish_to(1, batch(p)).unwrap();
    }
    assert!(matches!(f.try_publish(batch(5)), Err(PublishError::Full(_))));
    assert!(matches!(f.try_publish_to(1, batch(5)), Err(PublishError::Full(_))));
    assert!(!s.is_idle());
    assert_eq!(drain_ack(&mut cs[1]), firsts(1..=4));
    assert!(matches!(f.try_publish_to(1, batch(5)), Err(PublishError::Full(_))), "lanes 0, 2 hold gaps");
    assert!(matches!(cs[0].try_recv(), Err(TryRecvError::Empty)));
    assert!(matches!(f.try_publish(batch(5)), Err(PublishError::Full(_))), "lane 2 holds gaps");
    // A publish waits for lane 2; lane 2's consumer only passes gaps. The wake must come from
    // the gap acks (not the wait slice of 500 ms).
    let stream = s.clone();
    let passer = thread::spawn(move || {
        let mut c = stream.reattach("archive").unwrap();
        thread::sleep(Duration::from_millis(100));
        // Empty, or entry 5 if the woken publish landed it while this receive went on.
        let r = c.try_recv();
        let five = match r {
            Err(TryRecvError::Empty) => false,
            Ok(d) if pos(&d) == 5 => d.ack().is_ok(),
            other => panic!("{other:?}"),
        };
        (c, five)
    });
    let t = Instant::now();
    f.publish_timeout(batch(5), Duration::from_secs(5)).unwrap();
    let waited = t.elapsed();
    let (mut c2, five) = passer.join().unwrap();
    assert!(waited < Duration::from_millis(450), "waited {waited:?}: woken by the wait slice only");
    assert_eq!(drain_ack(&mut cs[0]), firsts(5..=5));
    assert_eq!(drain_ack(&mut cs[1]), firsts(5..=5));
    assert_eq!(drain_ack(&mut c2), if five { vec![] } else { firsts(5..=5) });
    for sink in SINKS {
        let st = s.stats(sink).unwrap();
        assert_eq!((st.published, st.acked_items), (5, 5), "{sink}: {st:?}");
    }
    assert!(s.is_idle());
    assert_eq!(s.watermark(), Some(Position(5)));
}

/// A nack right before a gap: the nacked item comes again first, then the gap is passed (not
/// delivered), then the next item; and a nack of an item after a passed gap likewise.
#[test]
fn l6_a_nack_next_to_a_gap_redelivers_the_item_and_passes_the_gap_once() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url, "lsfa");
    let s = open(&url, &name, 8);
    let mut c = s.attach("search").unwrap();
    let mut f = s.fanout().unwrap();
    f.publish(batch(1)).unwrap();
    f.publish_to(2, batch(2)).unwrap();
    f.publish(batch(3)).unwrap();
    f.publish_to(1, batch(4)).unwrap();
    f.publish(batch(5)).unwrap();
    let d = c.try_recv().unwrap();
    assert_eq!(pos(&d), 1);
    d.nack();
    let d = c.try_recv().unwrap();
    assert_eq!((pos(&d), d.attempt()), (1, 2));
    let d3 = c.try_recv().unwrap(); // passes gap 2; 1 is still held (not acked)
    assert_eq!((pos(&d3), d3.attempt()), (3, 1));
    d3.nack();
    d.ack().unwrap();
    let d = c.try_recv().unwrap();
    assert_eq!((pos(&d), d.attempt()), (3, 2));
    d.ack().unwrap();
    assert_eq!(drain_ack(&mut c), firsts(5..=5));
    let st = s.stats("search").unwrap();
    assert_eq!((st.published, st.acked_items, st.acked), (5, 5, Some(Position(5))), "{st:?}");
    assert!(matches!(c.try_recv(), Err(TryRecvError::Empty)));
}

/// A gap whose lane is re-attached mid-way: the old consumer passed the gap with an earlier
/// item still unacked (its ack out of order); the new consumer gets the unacked items again,
/// not the gap; the old consumer's late ack is refused.
#[test]
fn l8_a_reattach_after_a_passed_gap_redelivers_only_the_items() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url, "lsfa");
    let s = open(&url, &name, 8);
    let mut old = s.attach("search").unwrap();
    let mut f = s.fanout().unwrap();
    f.publish(batch(1)).unwrap();
    f.publish_to(1, batch(2)).unwrap();
    f.publish_to(1, batch(3)).unwrap();
    f.publish(batch(4)).unwrap();
    f.publish_to(2, batch(5)).unwrap();
    let d1 = old.try_recv().unwrap();
    let d4 = old.try_recv().unwrap();
    assert_eq!((pos(&d1), pos(&d4)), (1, 4));
    let mut new = s.reattach("search").unwrap();
    assert!(d1.ack().is_err(), "a stale ack after the re-attach");
    let got = drain_ack(&mut new);
    assert_eq!(got, vec![(1, 2), (4, 2)]);
    assert!(d4.ack().is_err());
    let st = s.stats("search").unwrap();
    // The trailing gap (5, lane archive's) passed at its position.
    assert_eq!((st.published, st.acked_items, st.acked), (5, 5, Some(Position(5))), "{st:?}");
    // Re-attach again with nothing pending: nothing more.
    let mut again = s.reattach("search").unwrap();
    assert!(matches!(again.try_recv(), Err(TryRecvError::Empty)));
}

/// A trailing gap: the lane is not idle and its consumer not empty until a receive passed it;
/// the watermark, `acked` and the stats count it then.
#[test]
fn l11_w5_a_trailing_gap_holds_idleness_until_passed() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url, "lsfa");
    let s = open(&url, &name, 8);
    let mut cs: Vec<_> = SINKS.iter().map(|sink| s.attach(sink).unwrap()).collect();
    let mut f = s.fanout().unwrap();
    f.publish(batch(1)).unwrap();
    for c in &mut cs {
        drain_ack(c);
    }
    assert!(s.is_idle());
    f.publish_to(0, batch(2)).unwrap();
    assert!(!s.is_idle());
    assert!(!cs[1].is_empty(), "lane cache holds a gap not passed");
    let st = s.stats("cache").unwrap();
    assert_eq!((st.published, st.acked_items), (2, 1), "{st:?}");
    assert_eq!(drain_ack(&mut cs[0]), firsts(2..=2));
    assert_eq!(drain_ack(&mut cs[1]), vec![]);
    assert!(cs[1].is_empty());
    assert_eq!(s.stats("cache").unwrap().acked_items, 2);
    assert!(!s.is_idle(), "lane archive still holds the gap");
    assert_eq!(drain_ack(&mut cs[2]), vec![]);
    assert!(s.is_idle());
    // The lanes that passed the gap acked everything before it: their acked position is its own.
    assert_eq!(s.acked("search").unwrap(), Some(Position(2)));
    assert_eq!(s.acked("cache").unwrap(), Some(Position(2)));
    assert_eq!(s.watermark(), Some(Position(2)));
}

// ----- restarts ---------------------------------------------------------------------------------

/// A restart in the middle (every handle dropped, mid-gaps, some items delivered and not
/// acked): a new fan-out resumes after the last entry; the last position holds across the log
/// (an item to one lane or to all is refused at or below the highest published, whichever
/// lane that went to); every lane gets its items once (redelivered ones again).
#[test]
fn l4_a_restart_mid_way_resumes_and_keeps_the_last_position() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url, "lsfa");
    {
        let s = open(&url, &name, 16);
        let mut f = s.fanout().unwrap();
        let mut c = s.attach("cache").unwrap();
        f.publish(batch(1)).unwrap();
        f.publish_to(1, batch(10)).unwrap();
        f.publish(batch(11)).unwrap();
        f.publish_to(0, batch(20)).unwrap();
        let d = c.try_recv().unwrap();
        d.ack().unwrap();
        let held = c.try_recv().unwrap();
        assert_eq!(pos(&held), 10);
        std::mem::forget(held);
    }
    let s = open(&url, &name, 16);
    let mut f = s.fanout().unwrap();
    // The last position is 20 (lane search's), for every lane.
    match f.try_publish_to(0, batch(20)) {
        Err(PublishError::PositionRegressed { last, .. }) => assert_eq!(last, Position(20)),
        other => panic!("{other:?}"),
    }
    match f.try_publish(batch(15)) {
        Err(PublishError::PositionRegressed { last, .. }) => assert_eq!(last, Position(20)),
        other => panic!("{other:?}"),
    }
    match f.try_publish_to(2, batch(12)) {
        Err(PublishError::PositionRegressed { last, .. }) => assert_eq!(last, Position(20)),
        other => panic!("{other:?}"),
    }
    f.try_publish_to(2, batch(22)).unwrap();
    f.try_publish(batch(23)).unwrap();
    assert_eq!(log_ids(&mut admin, &name), (1..=6).collect::<Vec<_>>());
    let got: Vec<_> = SINKS.iter().map(|sink| drain_ack(&mut s.reattach(sink).unwrap())).collect();
    assert_eq!(got[0], vec![(1, 1), (11, 1), (20, 1), (23, 1)]);
    assert_eq!(got[1], vec![(10, 2), (11, 1), (23, 1)]);
    assert_eq!(got[2], vec![(1, 1), (11, 1), (22, 1), (23, 1)]);
    assert!(s.is_idle());
    assert_eq!(s.watermark(), Some(Position(23)));
    assert_last_ids_equal(&mut admin, &name, &SINKS);
}

/// The in-memory shared-ring fan-out refuses a `publish_to` whose position does not rise past
/// every lane's last (its docs: "must grow past every lane's last, as for publish"); the Redis
/// fan-out checks the target lane only. Same call sequence on both.
#[test]
fn l4_publish_to_position_rule_matches_the_in_memory_fanout() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url, "lsfa");
    let s = open(&url, &name, 8);
    let mut f = s.fanout().unwrap();
    let m = MemoryStream::builder().capacity(8).sinks(SINKS).build().unwrap();
    let mut g = m.fanout().unwrap();
    f.publish_to(1, batch(5)).unwrap();
    g.publish_to(1, batch(5)).unwrap();
    let mem = g.try_publish_to(0, batch(3));
    let red = f.try_publish_to(0, batch(3));
    assert!(matches!(mem, Err(PublishError::PositionRegressed { .. })), "memory: {mem:?}");
    assert_eq!(format!("{mem:?}"), format!("{red:?}"), "memory vs redis");
}

// ----- the trim ---------------------------------------------------------------------------------

/// The trim (every 64th entry, and `trim`) never removes an entry a lane has not acked, gaps not
/// yet passed included: one lane receives nothing for 200 entries (a third of them gaps for
/// it), then everything is still there for it, in order.
#[test]
fn l5_the_trim_keeps_unpassed_gaps_and_unacked_entries() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url, "lsfa");
    let s = open(&url, &name, 256);
    let mut cs: Vec<_> = SINKS.iter().map(|sink| s.attach(sink).unwrap()).collect();
    let mut f = s.fanout().unwrap();
    let mut want: Vec<Vec<u64>> = vec![Vec::new(); 3];
    for p in 1..=200u64 {
        let to = match p % 3 {
            0 => Some(0),
            1 => None,
            _ => Some(2),
        };
        match to {
            Some(i) => f.publish_to(i, batch(p)).unwrap(),
            None => f.publish(batch(p)).unwrap(),
        }
        for (i, w) in want.iter_mut().enumerate() {
            if to.is_none_or(|t| t == i) {
                w.push(p);
            }
        }
        if p % 10 == 0 {
            // Lanes 0 and 2 keep up; lane 1 (which gets gaps for 2 of every 3) does not.
            for i in [0, 2] {
                drain_ack(&mut cs[i]);
            }
        }
    }
    assert_eq!(s.trim().unwrap(), 0, "lane cache acked nothing");
    assert_eq!(log_ids(&mut admin, &name), (1..=200).collect::<Vec<_>>());
    // Lane 1 acks up to entry 100 (passing its gaps), holds 101 unacked, acks the rest.
    let mut got = Vec::new();
    let mut held = None;
    while let Ok(d) = cs[1].try_recv() {
        let p = pos(&d);
        got.push(p);
        if p == 103 {
            held = Some(d);
        } else {
            d.ack().unwrap();
        }
    }
    assert_eq!(got, want[1]);
    let floor = s.trim().unwrap();
    assert_eq!(floor, 102, "the floor is below the held entry 103");
    assert_eq!(log_ids(&mut admin, &name), (103..=200).collect::<Vec<_>>());
    held.unwrap().nack();
    let d = cs[1].try_recv().unwrap();
    assert_eq!((pos(&d), d.attempt()), (103, 2));
    d.ack().unwrap();
    for i in [0, 2] {
        drain_ack(&mut cs[i]);
    }
    // Entry 256 (a gate that trims): every lane acked all, so the log empties up to it.
    for p in 201..=256 {
        f.publish(batch(p)).unwrap();
    }
    for c in &mut cs {
        assert_eq!(drain_ack(c), firsts(201..=256));
    }
    for p in 257..=320 {
        f.publish(batch(p)).unwrap();
    }
    let ids = log_ids(&mut admin, &name);
    assert!(ids.first().is_some_and(|&n| n > 200 && n <= 257), "trimmed at entry 320: {:?}", ids.first());
    for c in &mut cs {
        assert_eq!(drain_ack(c), firsts(257..=320));
    }
    assert!(s.is_idle());
}

// ----- concurrency -------------------------------------------------------------------------------

/// The fan-out on one thread (small capacity, a fifth of its items to one lane), each lane's
/// consumer on its own thread nacking now and then and re-attached now and then from another
/// process's handle: every lane gets each item meant for it (and no other) and acks it; first
/// deliveries come in order; the fan-out never errs; the log and publish logs stay in step.
#[test]
fn l2_l8_a_fanout_and_three_wobbly_consumers_lose_nothing() {
    use rand::{Rng, SeedableRng};
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url, "lsfa");
    let s = open(&url, &name, 4);
    let n = 240u64;
    let to = |p: u64| if p % 5 == 0 { Some((p / 5 % 3) as usize) } else { None };
    let mut consumers = Vec::new();
    for (i, sink) in SINKS.iter().enumerate() {
        let other = open(&url, &name, 4); // the re-attaching process
        let want: Vec<u64> = (1..=n).filter(|&p| to(p).is_none_or(|t| t == i)).collect();
        consumers.push(thread::spawn(move || {
            let mut rng = rand::rngs::StdRng::seed_from_u64(i as u64 + 7);
            let mut c = other.attach(sink).unwrap();
            let mut acked = BTreeSet::new();
            let mut firsts = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(20);
            while acked.len() < want.len() {
                assert!(Instant::now() < deadline, "lane {sink}: acked {} of {}", acked.len(), want.len());
                let Some(d) = c.recv_timeout(Duration::from_millis(200)).unwrap() else { continue };
                let p = pos(&d);
                if d.attempt() == 1 {
                    firsts.push(p);
                }
                match rng.gen_range(0..20) {
                    0 | 1 => d.nack(),
                    2 => {
                        std::mem::forget(d);
                        c = other.reattach(sink).unwrap();
                    }
                    _ => {
                        if d.ack().is_ok() {
                            acked.insert(p);
                        }
                    }
                }
            }
            assert!(firsts.windows(2).all(|w| w[0] < w[1]), "lane {sink}: first deliveries {firsts:?}");
            assert_eq!(acked.into_iter().collect::<Vec<_>>(), want, "lane {sink}");
        }));
    }
    let mut f = s.fanout().unwrap();
    for p in 1..=n {
        let r = match to(p) {
            Some(i) => f.publish_to(i, batch(p)),
            None => f.publish(batch(p)),
        };
        r.unwrap_or_else(|e| panic!("publish {p}: {e:?}"));
    }
    for c in consumers {
        c.join().unwrap();
    }
    assert_eq!(log_ids(&mut admin, &name).last(), Some(&n));
    assert_last_ids_equal(&mut admin, &name, &SINKS);
    // Trailing gaps (entry 240 went to one lane) are passed by a last receive.
    for sink in SINKS {
        let mut c = s.reattach(sink).unwrap();
        assert_eq!(drain_ack(&mut c), vec![], "lane {sink}");
    }
    assert!(s.is_idle());
    // The other lanes passed entry n's gap at its position.
    assert_eq!(s.watermark(), Some(Position(n)), "entry {n} went to lane {:?} only", to(n));
}

// ----- claims, wakes, stats -------------------------------------------------------------------

/// Two processes claim the fan-out at once, over and over: exactly one gets it each time, and
/// the one that got it publishes while the other is refused.
#[test]
fn l9_racing_claims_give_the_fanout_to_exactly_one() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url, "lsfa");
    let a = open(&url, &name, 64);
    let b = open(&url, &name, 64);
    for round in 1..=10u64 {
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let claim = |s: RedisStream, barrier: Arc<std::sync::Barrier>| {
            thread::spawn(move || {
                barrier.wait();
                s.fanout()
            })
        };
        let (ta, tb) = (claim(a.clone(), barrier.clone()), claim(b.clone(), barrier));
        let (ra, rb) = (ta.join().unwrap(), tb.join().unwrap());
        let mut won: Vec<RedisFanout> = [ra, rb]
            .into_iter()
            .filter_map(|r| match r {
                Ok(f) => Some(f),
                Err(StreamError::ProducerBusy(_)) => None,
                Err(e) => panic!("round {round}: {e:?}"),
            })
            .collect();
        assert_eq!(won.len(), 1, "round {round}: exactly one claim wins");
        won[0].publish(batch(round)).unwrap();
    }
    assert_eq!(log_ids(&mut admin, &name), (1..=10).collect::<Vec<_>>());
    for (sink, got) in SINKS.iter().zip(drain_all(&url, &name, 64)) {
        assert_eq!(got, firsts(1..=10), "lane {sink}");
    }
}

/// The claim's reply lost: the retried claim is the same claim (not a second epoch that fences
/// its own fan-out); the fan-out publishes.
#[test]
fn l9_a_claim_whose_reply_was_lost_still_publishes() {
    let url = server!();
    let proxy = proxy!(url);
    let (name, _cleanup, _admin) = setup(&url, "lsfa");
    let s = open(&proxy.url, &name, 16);
    proxy.arm(b"18446744073709551615-0", true); // the claim's last argument
    let mut f = s.fanout().unwrap();
    assert_eq!(proxy.cuts(), 1, "the claim was cut");
    for p in 1..=3 {
        f.try_publish(batch(p)).unwrap_or_else(|e| panic!("publish {p}: {e:?}"));
    }
    for (sink, got) in SINKS.iter().zip(drain_all(&url, &name, 16)) {
        assert_eq!(got, firsts(1..=3), "lane {sink}");
    }
}

/// A consumer waiting in `recv` is woken by the publish (its bell rung after the publish `XADD`),
/// also when the ring's request was lost and the publish retried: the retry finds the entry
/// landed and returns, and the waiting consumer must not be left to its wait slice (500 ms).
#[test]
fn a_waiting_consumer_is_woken_although_the_ring_was_lost() {
    let url = server!();
    let proxy = proxy!(url);
    let (name, _cleanup, _admin) = setup(&url, "lsfa");
    let s = open(&url, &name, 16);
    let via = open(&proxy.url, &name, 16); // the fan-out's process talks through the proxy
    let mut f = via.fanout().unwrap();
    f.publish(batch(1)).unwrap();
    let mut c = s.attach("search").unwrap();
    assert_eq!(drain_ack(&mut c), firsts(1..=1));
    let waiter = thread::spawn(move || {
        let d = c.recv_timeout(Duration::from_secs(5)).unwrap().expect("woken with entry 2");
        let at = Instant::now();
        d.ack().unwrap();
        at
    });
    thread::sleep(Duration::from_millis(50)); // the consumer waits (its `w` set)
    proxy.arm(b":bell:", false);
    let t = Instant::now();
    f.publish(batch(2)).unwrap();
    assert_eq!(proxy.cuts(), 1, "the ring was cut");
    let woken = waiter.join().unwrap();
    let latency = woken.saturating_duration_since(t);
    assert!(latency < Duration::from_millis(200), "the consumer woke {latency:?} after the publish");
}

/// Runs `fut` to its end on this thread (a waker that unparks it).
fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    struct Unpark(thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let std::task::Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        thread::park_timeout(Duration::from_millis(50));
    }
}

/// A consumer waiting (blocking, and as a task) while only gaps arrive passes them and keeps
/// waiting; the next item meant for it wakes it at once.
#[test]
fn w5_a_waiting_consumer_passes_gaps_and_wakes_for_its_item() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url, "lsfa");
    let s = open(&url, &name, 8);
    let mut f = s.fanout().unwrap();
    for asynchronous in [false, true] {
        let base = if asynchronous { 10 } else { 0 };
        let stream = s.clone();
        let waiter = thread::spawn(move || {
            let mut c = stream.reattach("search").unwrap();
            let d = if asynchronous {
                block_on(c.recv_async()).unwrap().unwrap()
            } else {
                c.recv_timeout(Duration::from_secs(5)).unwrap().unwrap()
            };
            let at = Instant::now();
            let got = (pos(&d), d.attempt());
            d.ack().unwrap();
            (got, at)
        });
        thread::sleep(Duration::from_millis(100));
        f.publish_to(1, batch(base + 1)).unwrap();
        thread::sleep(Duration::from_millis(50));
        f.publish_to(2, batch(base + 2)).unwrap();
        thread::sleep(Duration::from_millis(50));
        let t = Instant::now();
        f.publish(batch(base + 3)).unwrap();
        let (got, at) = waiter.join().unwrap();
        assert_eq!(got, (base + 3, 1), "async: {asynchronous}");
        let latency = at.saturating_duration_since(t);
        assert!(latency < Duration::from_millis(250), "async {asynchronous}: woken {latency:?} after");
    }
    assert_eq!(s.stats("search").unwrap().acked_items, 6);
}

/// `publish_async` waits as a task for the slowest lane's ack, then lands once.
#[test]
fn l3_publish_async_waits_for_the_slowest_lane() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url, "lsfa");
    let s = open(&url, &name, 2);
    let mut f = s.fanout().unwrap();
    f.publish(batch(1)).unwrap();
    f.publish_to(0, batch(2)).unwrap();
    let stream = s.clone();
    let acker = thread::spawn(move || {
        thread::sleep(Duration::from_millis(150));
        let mut got = Vec::new();
        for sink in SINKS {
            got.push(drain_ack(&mut stream.attach(sink).unwrap()));
        }
        got
    });
    let t = Instant::now();
    block_on(f.publish_async(batch(3))).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(100), "it waited for room");
    let got = acker.join().unwrap();
    assert_eq!(got[0], firsts(1..=2));
    assert_eq!(got[1], firsts(1..=1));
    // Lane archive (drained last) may get 3 in the acker's drain: 3 lands as soon as it passed
    // its gap.
    let late: Vec<_> = SINKS.iter().map(|sink| drain_ack(&mut s.reattach(sink).unwrap())).collect();
    assert_eq!(late[0], firsts(3..=3));
    assert_eq!(late[1], firsts(3..=3));
    assert_eq!([&got[2][..], &late[2][..]].concat(), firsts([1, 3]), "lane archive");
}

/// Contract `LaneStats::delivered` ("deliveries made"): a gap passed on the way is no delivery;
/// the in-memory shared ring does not count it, the Redis lane does (its `nread` moves over
/// the gap).
#[test]
#[ignore = "documented difference (README, Redis backend): a passed gap counts in the Redis lane's \
            stats.delivered (nread = rd on a lane alone on its log), not in the in-memory shared ring's"]
fn w5_a_passed_gap_is_not_counted_as_a_delivery() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url, "lsfa");
    let s = open(&url, &name, 8);
    let mut f = s.fanout().unwrap();
    let mut c = s.attach("search").unwrap();
    f.publish_to(1, batch(1)).unwrap();
    f.publish(batch(2)).unwrap();
    assert_eq!(drain_ack(&mut c), firsts(2..=2));
    let m = MemoryStream::builder().capacity(8).sinks(SINKS).build().unwrap();
    let mut g = m.fanout().unwrap();
    let mut mc = Stream::attach(&m, "search").unwrap();
    g.publish_to(1, batch(1)).unwrap();
    g.publish(batch(2)).unwrap();
    mc.try_recv().unwrap().ack().unwrap();
    let (rs, ms) = (s.stats("search").unwrap(), Stream::stats(&m, "search").unwrap());
    assert_eq!((rs.delivered, rs.redelivered), (ms.delivered, ms.redelivered), "redis {rs:?}, memory {ms:?}");
}

// The model against the in-memory shared-ring fan-out (random publish, `publish_to`, receive,
// ack, nack, re-attach, restart, close and trim steps, also through the cutting proxy) is in
// `tests/redis/fanout_publish_record.rs`, which extends the one this file had.
