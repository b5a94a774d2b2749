//! Adversarial tests of the Redis backend's hot path on a stream with one sink lane (and on the
//! request lane): no pending list (delivered, unacked entries are `an + 1 ..= rd` less the
//! out-of-order acked set, redeliveries counted in `B:att`), the receive script with a plain
//! `XRANGE` beside it, the plain delivery-log and ack-log records, and the publish (the gate
//! script, a plain `XADD`). The publisher is the stream's fan-out, its only publisher since the
//! per-lane producers retired (issue 20); "producer" in the names and texts below is that
//! fan-out, and "the plain path" the script-free one, which every lane runs now.
//!
//! They hunt for breaks of the contract (`src/docs/contract.md`): out-of-order acks with gaps
//! then re-attach, nacks after partial out-of-order acks, stale acks racing a re-attach, fenced
//! producers, full lanes, trimming against the watermark, restarts at each point of the life
//! cycle, many request senders, huge batches, a flushed script cache, killed connections, and
//! a proptest of random operation sequences against a model of at-least-once delivery.
//!
//! Needs a server: `LANESTREAM_REDIS_URL` (as `tests/redis/contract.rs`; unset, every test is
//! skipped with a message, or fails under `CI=true`). Each stream has its own name and its keys
//! are deleted when the test ends, passed or failed.
#![cfg(feature = "redis")]

use crate::{common, redis_support};
use lanestream::prelude::*;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::{backfill, batch, snapshot};
use lanestream::{
    AckError, BackendError, Batch, Envelope, IndexName, LaneConsumer, LaneItem, Op, Position, PublishError,
    RedisDelivery, RedisStream, RequestPublisher, Stream, StreamFanout, TryRecvError,
};
use proptest::prelude::*;
use redis_support::{delete_keys, drain_ack, kill_connections, log_ids, pos, unique_name, url};

/// Deletes the stream's keys when dropped (also on a panic); holds the test's share of
/// [`SCRIPT_CACHE`] until then.
struct Cleanup {
    url: String,
    name: String,
    _cache: CacheGuard,
}

/// The server's script cache: tests that flush it hold it alone, so that the other tests' calls
/// never meet a flush (a call that does is sent again a few times, see
/// `a_script_cache_flushed_in_a_loop_fails_no_call`; the lock keeps them independent of that).
static SCRIPT_CACHE: std::sync::RwLock<()> = std::sync::RwLock::new(());

#[allow(dead_code)] // held for its drop only
enum CacheGuard {
    Shared(std::sync::RwLockReadGuard<'static, ()>),
    Alone(std::sync::RwLockWriteGuard<'static, ()>),
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let Ok(mut conn) = redis::Client::open(self.url.as_str()).and_then(|c| c.get_connection()) else {
            return;
        };
        let _ = delete_keys(&mut conn, &self.name);
    }
}

/// A test's stream name, its cleanup guard and an admin connection.
fn setup(url: &str) -> (String, Cleanup, redis::Connection) {
    setup_with(url, CacheGuard::Shared(SCRIPT_CACHE.read().unwrap_or_else(|p| p.into_inner())))
}

/// [`setup`] for a test that flushes the server's script cache.
fn setup_flushing(url: &str) -> (String, Cleanup, redis::Connection) {
    setup_with(url, CacheGuard::Alone(SCRIPT_CACHE.write().unwrap_or_else(|p| p.into_inner())))
}

fn setup_with(url: &str, cache: CacheGuard) -> (String, Cleanup, redis::Connection) {
    let name = unique_name("lsa");
    let cleanup = Cleanup { url: url.to_owned(), name: name.clone(), _cache: cache };
    let admin = redis::Client::open(url).unwrap().get_connection().unwrap();
    (name, cleanup, admin)
}

fn open(url: &str, name: &str, capacity: usize) -> RedisStream {
    RedisStream::builder(url, name)
        .capacity(capacity)
        .request_capacity(capacity)
        .sink("search")
        .build()
        .unwrap_or_else(|e| panic!("building stream {name} on {url}: {e}"))
}

/// Frees the stream's fan-out claim as if its holder had died without a word (its handle lives
/// on: a zombie).
fn free_producer_claim(admin: &mut redis::Connection, name: &str) {
    let _: i64 = redis::cmd("HSET").arg(format!("{{{name}}}:meta")).arg("fh").arg("").query(admin).unwrap();
}

fn log_len(admin: &mut redis::Connection, name: &str) -> usize {
    redis::cmd("XLEN").arg(format!("{{{name}}}:log")).query(admin).unwrap()
}

/// Publishes the batches at positions `range`, in order.
fn publish_all(p: &mut impl StreamFanout, range: std::ops::RangeInclusive<u64>) {
    for i in range {
        p.publish(batch(i)).unwrap();
    }
}

/// Receives `n` deliveries and holds them by position.
fn hold(
    c: &mut impl LaneConsumer<LaneItem, Delivery = RedisDelivery<LaneItem>>,
    n: usize,
) -> BTreeMap<u64, RedisDelivery<LaneItem>> {
    (0..n).map(|_| c.try_recv().unwrap()).map(|d| (pos(&d), d)).collect()
}

// ----- Out-of-order acks, nacks, re-attach ------------------------------------------------------

#[test]
fn out_of_order_acks_with_gaps_then_reattach_redeliver_exactly_the_unacked_with_next_attempts() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url);
    let s = open(&url, &name, 16);
    let mut p = s.fanout().unwrap();
    publish_all(&mut p, 1..=10);
    let mut c = s.reattach("search").unwrap();
    let mut held = hold(&mut c, 8);
    // Acked: 2, 3, 5, 8 (gaps at 1, 4, 6, 7); 9 and 10 never received.
    for k in [8, 3, 5, 2] {
        held.remove(&k).unwrap().ack().unwrap();
    }
    assert_eq!(s.acked("search").unwrap(), None, "1 is out: no acked prefix");
    std::mem::forget(held); // the old consumer's deliveries stay in its hands
    let mut c2 = s.reattach("search").unwrap();
    let mut got = Vec::new();
    let mut second: BTreeMap<u64, RedisDelivery<LaneItem>> = BTreeMap::new();
    for _ in 0..6 {
        let d = c2.try_recv().unwrap();
        got.push((pos(&d), d.attempt()));
        second.insert(pos(&d), d);
    }
    assert_eq!(got, [(1, 2), (4, 2), (6, 2), (7, 2), (9, 1), (10, 1)], "the unacked again, then the new");
    assert!(matches!(c2.try_recv(), Err(TryRecvError::Empty)));
    // Ack 1: the prefix runs over 2 and 3 to 3, not past the gap at 4.
    second.remove(&1).unwrap().ack().unwrap();
    assert_eq!(s.acked("search").unwrap(), Some(Position(3)));
    // A second re-attach: 4, 6, 7, 9, 10 again, each one attempt more.
    std::mem::forget(second);
    let mut c3 = s.reattach("search").unwrap();
    assert_eq!(drain_ack(&mut c3), [(4, 3), (6, 3), (7, 3), (9, 2), (10, 2)]);
    assert_eq!(s.acked("search").unwrap(), Some(Position(10)));
    let st = s.stats("search").unwrap();
    assert_eq!((st.published, st.acked_items, st.in_flight, st.released), (10, 10, 0, 0), "{st:?}");
    // Nothing left over in the attempts hash once everything is acked.
    let mut admin = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
    let att: usize = redis::cmd("HLEN").arg(format!("{{{name}}}:l:search:att")).query(&mut admin).unwrap();
    assert_eq!(att, 0, "B:att keeps counts only until the entry is acked");
}

#[test]
fn nack_after_a_partial_out_of_order_ack_set_redelivers_only_the_nacked_and_fences_stale_nacks() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url);
    let s = open(&url, &name, 16);
    let mut p = s.fanout().unwrap();
    publish_all(&mut p, 1..=6);
    let mut c = s.reattach("search").unwrap();
    let mut held = hold(&mut c, 6);
    for k in [2, 4, 6] {
        held.remove(&k).unwrap().ack().unwrap();
    }
    // Nack 3 and drop 5; 1 stays in hand.
    held.remove(&3).unwrap().nack();
    drop(held.remove(&5).unwrap());
    let r1 = c.try_recv().unwrap();
    let r2 = c.try_recv().unwrap();
    assert_eq!([(pos(&r1), r1.attempt()), (pos(&r2), r2.attempt())], [(3, 2), (5, 2)]);
    assert!(matches!(c.try_recv(), Err(TryRecvError::Empty)), "2, 4, 6 acked: never again");
    // Nack the redelivery of 3 again: attempt 3 next.
    r1.nack();
    let r3 = c.try_recv().unwrap();
    assert_eq!((pos(&r3), r3.attempt()), (3, 3));
    // 1 acked: prefix to 2 (3 is out).
    held.remove(&1).unwrap().ack().unwrap();
    assert_eq!(s.acked("search").unwrap(), Some(Position(2)));
    r3.ack().unwrap();
    assert_eq!(s.acked("search").unwrap(), Some(Position(4)));
    r2.ack().unwrap();
    assert_eq!(s.acked("search").unwrap(), Some(Position(6)));
    assert!(matches!(c.try_recv(), Err(TryRecvError::Empty)));
    let st = s.stats("search").unwrap();
    assert_eq!((st.acked_items, st.redelivered, st.delivered), (6, 3, 9), "{st:?}");
}

#[test]
fn a_stale_consumers_ack_racing_a_reattach_lands_xor_is_redelivered() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url);
    let s = open(&url, &name, 64);
    let mut p = s.fanout().unwrap();
    let rounds = 40u64;
    let mut acked_by_old = 0;
    let mut redelivered = 0;
    for next in 1..=rounds {
        p.publish(batch(next)).unwrap();
        let mut old = s.reattach("search").unwrap();
        let d = old.try_recv().unwrap();
        assert_eq!(pos(&d), next);
        let barrier = Arc::new(Barrier::new(2));
        let b2 = barrier.clone();
        let acker = std::thread::spawn(move || {
            b2.wait();
            d.ack()
        });
        barrier.wait();
        let mut new = s.reattach("search").unwrap();
        let ack = acker.join().unwrap();
        let again = match new.try_recv() {
            Ok(d) => Some(d),
            Err(TryRecvError::Empty) => None,
            Err(e) => panic!("{e:?}"),
        };
        match (&ack, &again) {
            (Ok(()), None) => {
                acked_by_old += 1;
                assert_eq!(s.acked("search").unwrap(), Some(Position(next)));
            }
            (Err(AckError::Detached), Some(d)) => {
                redelivered += 1;
                assert_eq!((pos(d), d.attempt()), (next, 2));
                assert_eq!(s.acked("search").unwrap(), next.checked_sub(1).filter(|&k| k > 0).map(Position));
            }
            other => {
                panic!("round {next}: the stale ack must land xor be refused with a redelivery: {other:?}")
            }
        }
        if let Some(d) = again {
            d.ack().unwrap();
        }
        assert_eq!(s.acked("search").unwrap(), Some(Position(next)));
        drop((old, new));
    }
    assert_eq!(acked_by_old + redelivered, rounds);
    let st = s.stats("search").unwrap();
    assert_eq!((st.published, st.acked_items), (rounds, rounds), "nothing acked twice: {st:?}");
}

/// Consumers in three threads keep taking the lane from one another (re-attach) while a
/// producer publishes: every entry is acked exactly once across all of them (an ack from a
/// taken-over consumer is refused, and its entry comes to someone else).
#[test]
fn consumers_stealing_the_lane_from_one_another_ack_every_entry_exactly_once() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url);
    let total = 300u64;
    let s = open(&url, &name, 16);
    let acked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producer = {
        let mut p = s.fanout().unwrap();
        std::thread::spawn(move || {
            publish_all(&mut p, 1..=total);
        })
    };
    let workers: Vec<_> = (0..3)
        .map(|t| {
            let (s, acked, done) = (s.clone(), acked.clone(), done.clone());
            std::thread::spawn(move || {
                let mut refused = 0;
                while !done.load(Ordering::Relaxed) {
                    let mut c = s.reattach("search").unwrap();
                    let mut held = Vec::new();
                    for _ in 0..(3 + t) {
                        match c.try_recv() {
                            Ok(d) => held.push(d),
                            Err(TryRecvError::Empty | TryRecvError::Detached) => break,
                            Err(e) => panic!("{e:?}"),
                        }
                    }
                    // Out of order: the newest first.
                    while let Some(d) = held.pop() {
                        let k = pos(&d);
                        match d.ack() {
                            Ok(()) => acked.lock().unwrap().push(k),
                            Err(AckError::Detached) => refused += 1,
                            Err(e) => panic!("{e:?}"),
                        }
                    }
                    if s.acked("search").unwrap() == Some(Position(total)) {
                        done.store(true, Ordering::Relaxed);
                    }
                }
                refused
            })
        })
        .collect();
    producer.join().unwrap();
    let refused: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let mut acked = std::mem::take(&mut *acked.lock().unwrap());
    let n = acked.len();
    acked.sort_unstable();
    acked.dedup();
    assert_eq!(acked.len(), n, "an entry acked twice");
    assert_eq!(acked, (1..=total).collect::<Vec<_>>());
    let st = s.stats("search").unwrap();
    assert_eq!((st.published, st.acked_items, st.in_flight, st.released), (total, total, 0, 0), "{st:?}");
    assert!(refused > 0, "no consumer was ever taken over: the race did not happen");
}

// ----- The producer fence ----------------------------------------------------------------------

#[test]
fn a_producer_reclaimed_while_the_old_one_publishes_lands_nothing_after_the_claim() {
    // The old producer stops on its own after this many items, well inside the capacity: nothing
    // acks here, so a producer that filled the lane before the claim would wait for room forever
    // (a CI run hung exactly so, its publishes outrunning a descheduled main thread).
    const CAPACITY: usize = 1024;
    const BOUND: u64 = 1000;
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url);
    let s = open(&url, &name, CAPACITY);
    let mut old = s.fanout().unwrap();
    old.publish(batch(1)).unwrap();
    let s_old = s.clone();
    let claimed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let claimed2 = claimed.clone();
    // The old producer publishes as fast as it can until it is fenced (or reaches the bound).
    let t = std::thread::spawn(move || {
        let _s = s_old;
        let mut k = 2u64;
        let mut landed = vec![1u64];
        while k <= BOUND {
            match old.publish(batch(k)) {
                Ok(()) => {
                    landed.push(k);
                    k += 1;
                }
                Err(PublishError::Backend { error: BackendError::Fenced, .. }) => break,
                Err(e) => panic!("old producer: {e:?}"),
            }
        }
        // Fenced, or the claim is under way: once it is taken the old producer keeps trying (a
        // zombie) and must land nothing.
        while !claimed2.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        for _ in 0..20 {
            assert!(matches!(
                old.publish(batch(k)),
                Err(PublishError::Backend { error: BackendError::Fenced, .. })
            ));
        }
        landed
    });
    std::thread::sleep(Duration::from_millis(30));
    free_producer_claim(&mut admin, &name);
    let s2 = open(&url, &name, CAPACITY);
    let mut new = s2.fanout().expect("the claim was freed");
    // Release: the zombie's publishes after this flag must meet the claim just taken.
    claimed.store(true, Ordering::Release);
    let landed = t.join().unwrap();
    let last = *landed.last().unwrap();
    let st = s2.stats("search").unwrap();
    assert_eq!(st.published, last, "every publish the old producer saw succeed, and no other");
    new.publish(batch(last + 1)).unwrap();
    let mut c = s.reattach("search").unwrap();
    let got: Vec<u64> = drain_ack(&mut c).into_iter().map(|(p, _)| p).collect();
    assert_eq!(got, (1..=last + 1).collect::<Vec<_>>(), "no gap, no duplicate, nothing of the zombie's");
    assert_eq!(log_ids(&mut admin, &name), (1..=last + 1).collect::<Vec<_>>());
}

/// Two zombie producers (fenced, still publishing) of different ages and a fresh one.
///
/// The publish `MULTI` ends with `XSETID log (n+1)-0` whatever its gate said, with `n` the
/// publisher's own idea of its next entry. A zombie that is behind can thereby *lower* the log's
/// last id (Redis allows an `XSETID` down to the newest entry, or anywhere on an empty log), and
/// the next zombie's plain `XADD` then lands: an entry from a fenced producer is in the log, and
/// the live producer's gate (`XSETID last`) fails from then on, below that entry.
#[test]
fn two_zombie_producers_of_different_ages_add_nothing_and_do_not_wedge_the_live_one() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url);
    let s = open(&url, &name, 64);
    // Generation 1 publishes 1; generation 2 publishes 2 and 3; generation 3 takes over.
    let mut z1 = s.fanout().unwrap();
    z1.publish(batch(1)).unwrap();
    free_producer_claim(&mut admin, &name);
    let s2 = open(&url, &name, 64);
    let mut z2 = s2.fanout().unwrap();
    z2.publish(batch(2)).unwrap();
    z2.publish(batch(3)).unwrap();
    free_producer_claim(&mut admin, &name);
    let s3 = open(&url, &name, 64);
    let mut live = s3.fanout().unwrap();
    // The zombies publish on (each is told it is fenced).
    for z in [&mut z1, &mut z2] {
        assert!(matches!(
            z.publish(batch(4)),
            Err(PublishError::Backend { error: BackendError::Fenced, .. })
        ));
    }
    assert_eq!(log_ids(&mut admin, &name), [1, 2, 3], "a fenced publish adds no entry");
    live.publish(batch(4)).expect("the live producer publishes on");
    live.publish(batch(5)).unwrap();
    let mut c = s3.reattach("search").unwrap();
    assert_eq!(drain_ack(&mut c), [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1)]);
}

/// The same on an emptied (trimmed) log, where `XSETID` may go down anywhere.
#[test]
fn zombie_producers_on_a_trimmed_empty_log_add_nothing() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url);
    let s = open(&url, &name, 64);
    let mut z1 = s.fanout().unwrap();
    z1.publish(batch(1)).unwrap();
    free_producer_claim(&mut admin, &name);
    let s2 = open(&url, &name, 64);
    let mut z2 = s2.fanout().unwrap();
    for i in 2..=6 {
        z2.publish(batch(i)).unwrap();
    }
    free_producer_claim(&mut admin, &name);
    let s3 = open(&url, &name, 64);
    let mut live = s3.fanout().unwrap();
    live.publish(batch(7)).unwrap();
    let mut c = s3.reattach("search").unwrap();
    assert_eq!(drain_ack(&mut c).len(), 7);
    assert_eq!(s3.trim().unwrap(), 7);
    assert_eq!(log_len(&mut admin, &name), 0);
    for z in [&mut z1, &mut z2] {
        assert!(matches!(
            z.publish(batch(8)),
            Err(PublishError::Backend { error: BackendError::Fenced, .. })
        ));
    }
    assert_eq!(log_len(&mut admin, &name), 0, "a fenced publish adds no entry");
    live.publish(batch(8)).expect("the live producer publishes on");
    assert_eq!(drain_ack(&mut c), [(8, 1)]);
    assert_eq!(log_ids(&mut admin, &name), [8]);
}

// ----- Bounds, trimming ------------------------------------------------------------------------

#[test]
fn a_full_lane_refuses_until_the_acked_prefix_moves_and_positions_stay_contiguous() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url);
    let cap = 4;
    let s = open(&url, &name, cap);
    let mut p = s.fanout().unwrap();
    let mut c = s.reattach("search").unwrap();
    for i in 1..=4 {
        p.try_publish(batch(i)).unwrap();
    }
    assert!(matches!(p.try_publish(batch(5)), Err(PublishError::Full(_))));
    let mut held = hold(&mut c, 4);
    // Out-of-order acks make no room: the bound is over the acked prefix.
    for k in [2, 3, 4] {
        held.remove(&k).unwrap().ack().unwrap();
    }
    for _ in 0..3 {
        assert!(matches!(p.try_publish(batch(5)), Err(PublishError::Full(_))));
    }
    assert_eq!(log_len(&mut admin, &name), 4, "a refused publish adds nothing");
    // A publisher blocked on the full lane gets through when 1 is acked.
    let s2 = s.clone();
    let t = std::thread::spawn(move || {
        let _s = s2;
        p.publish(batch(5)).unwrap();
        for i in 6..=8 {
            p.publish(batch(i)).unwrap();
        }
        p
    });
    std::thread::sleep(Duration::from_millis(50));
    held.remove(&1).unwrap().ack().unwrap();
    let mut p = t.join().unwrap();
    assert!(matches!(p.try_publish(batch(9)), Err(PublishError::Full(_))));
    assert_eq!(drain_ack(&mut c), [(5, 1), (6, 1), (7, 1), (8, 1)]);
    p.try_publish(batch(9)).unwrap();
    assert_eq!(drain_ack(&mut c), [(9, 1)]);
    assert_eq!(log_ids(&mut admin, &name), (1..=9).collect::<Vec<_>>(), "no gap, no duplicate entry");
    let st = s.stats("search").unwrap();
    assert_eq!((st.published, st.acked_items), (9, 9));
}

#[test]
fn trimming_never_passes_the_watermark_also_on_the_publish_path() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url);
    let s = open(&url, &name, 256);
    let mut p = s.fanout().unwrap();
    let mut c = s.reattach("search").unwrap();
    // Hold 10 and ack everything else out of order around it, over several 64-entry trims.
    let mut held10 = None;
    for i in 1..=200u64 {
        p.publish(batch(i)).unwrap();
        let d = c.try_recv().unwrap();
        if i == 10 {
            held10 = Some(d);
        } else {
            d.ack().unwrap();
        }
        let first = log_ids(&mut admin, &name).first().copied();
        assert!(first.is_some_and(|f| f <= 10), "entry {first:?} first at {i}: an unacked entry was trimmed");
    }
    assert_eq!(s.watermark(), Some(Position(9)));
    assert_eq!(s.trim().unwrap(), 9);
    assert_eq!(log_ids(&mut admin, &name).first(), Some(&10));
    // Re-attach: 10 comes back (its payload is still there), then the prefix runs to 200.
    std::mem::forget(held10);
    let mut c2 = s.reattach("search").unwrap();
    assert_eq!(drain_ack(&mut c2), [(10, 2)]);
    assert_eq!(s.watermark(), Some(Position(200)));
    assert_eq!(s.trim().unwrap(), 200);
    assert_eq!(log_len(&mut admin, &name), 0);
    p.publish(batch(201)).unwrap();
    assert_eq!(drain_ack(&mut c2), [(201, 1)]);
}

// ----- Restarts ----------------------------------------------------------------------------------

/// A restart at each point of a lane's life: every handle dropped without a word (deliveries
/// forgotten, connections killed), the stream opened again by name.
#[test]
fn a_restart_at_each_point_of_the_life_cycle_loses_nothing_and_repeats_nothing_acked() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url);
    let restart = |admin: &mut redis::Connection, s: RedisStream| {
        std::mem::forget(s);
        kill_connections(admin, &name);
        open(&url, &name, 8)
    };
    // 0: before anything was published.
    let s = open(&url, &name, 8);
    let s = restart(&mut admin, s);
    // 1: published, nothing received.
    let mut p = s.fanout().expect("free");
    publish_all(&mut p, 1..=6);
    std::mem::forget(p);
    let s = restart(&mut admin, s);
    // 2: received, acked out of order (2, 4), one released (3 nacked, not redelivered), the rest
    // unacked.
    let mut c = s.attach("search").expect("nobody held the lane");
    let mut held = hold(&mut c, 5);
    assert_eq!(held.keys().copied().collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
    held.remove(&2).unwrap().ack().unwrap();
    held.remove(&4).unwrap().ack().unwrap();
    held.remove(&3).unwrap().nack();
    std::mem::forget((held, c));
    let s = restart(&mut admin, s);
    // 3: the restarted sink gets 1, 3, 5 again (attempt 2), then 6; it acks 1 and 6 and holds
    // 3 and 5, and the process dies again.
    let mut c = s.attach("search").expect("the dead consumer's claim is free");
    let got: Vec<_> = (0..4).map(|_| c.try_recv().unwrap()).collect();
    assert_eq!(
        got.iter().map(|d| (pos(d), d.attempt())).collect::<Vec<_>>(),
        [(1, 2), (3, 2), (5, 2), (6, 1)]
    );
    assert!(matches!(c.try_recv(), Err(TryRecvError::Empty)));
    let mut got: BTreeMap<u64, _> = got.into_iter().map(|d| (pos(&d), d)).collect();
    got.remove(&1).unwrap().ack().unwrap();
    got.remove(&6).unwrap().ack().unwrap();
    assert_eq!(s.acked("search").unwrap(), Some(Position(2)));
    // A producer of the new process publishes 7 meanwhile.
    let mut p = s.fanout().expect("the dead producer's claim is free");
    assert!(matches!(p.publish(batch(6)), Err(PublishError::PositionRegressed { last: Position(6), .. })));
    p.publish(batch(7)).unwrap();
    std::mem::forget((got, c, p));
    let s = restart(&mut admin, s);
    // 4: 3 and 5 come back a third time, then 7.
    let mut c = s.attach("search").expect("free");
    assert_eq!(drain_ack(&mut c), [(3, 3), (5, 3), (7, 1)]);
    assert_eq!(s.acked("search").unwrap(), Some(Position(7)));
    std::mem::forget(c);
    let s = restart(&mut admin, s);
    // 5: everything acked: nothing comes back; the producer resumes after 7.
    let mut c = s.attach("search").expect("free");
    assert!(matches!(c.try_recv(), Err(TryRecvError::Empty)));
    let mut p = s.fanout().expect("free");
    p.publish(batch(8)).unwrap();
    assert_eq!(drain_ack(&mut c), [(8, 1)]);
    let st = s.stats("search").unwrap();
    assert_eq!((st.published, st.acked_items, st.in_flight, st.released), (8, 8, 0, 0), "{st:?}");
    assert_eq!(s.trim().unwrap(), 8);
    assert_eq!(log_len(&mut admin, &name), 0);
}

/// Closed with unacked, out-of-order acked and released entries, then restarted: the
/// restarted sink gets what is left, then `Closed`; the producer's publishes are refused and add
/// nothing to the log.
#[test]
fn a_closed_lane_drains_its_unacked_entries_across_a_restart_then_reports_closed() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url);
    let s = open(&url, &name, 8);
    let mut p = s.fanout().unwrap();
    publish_all(&mut p, 1..=6);
    let mut c = s.reattach("search").unwrap();
    let mut held = hold(&mut c, 4);
    held.remove(&3).unwrap().ack().unwrap();
    held.remove(&2).unwrap().nack();
    p.close();
    assert!(matches!(p.try_publish(batch(7)), Err(PublishError::Closed(_))));
    assert_eq!(log_len(&mut admin, &name), 6, "a refused publish adds nothing");
    std::mem::forget((held, c, p));
    std::mem::forget(s);
    kill_connections(&mut admin, &name);
    let s = open(&url, &name, 8);
    let mut c = s.attach("search").expect("free");
    let mut got = Vec::new();
    loop {
        match c.try_recv() {
            Ok(d) => {
                got.push((pos(&d), d.attempt()));
                d.ack().unwrap();
            }
            Err(TryRecvError::Closed) => break,
            Err(e) => panic!("{e:?} after {got:?}"),
        }
    }
    assert_eq!(got, [(1, 2), (2, 2), (4, 2), (5, 1), (6, 1)]);
    assert_eq!(s.acked("search").unwrap(), Some(Position(6)));
    let mut p = s.fanout().expect("free");
    assert!(matches!(p.try_publish(batch(7)), Err(PublishError::Closed(_))));
    assert_eq!(log_len(&mut admin, &name), 6);
}

// ----- The request lane ---------------------------------------------------------------------------

#[test]
fn a_lone_request_lane_with_many_senders_delivers_each_request_once_within_its_bound() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url);
    let cap = 4;
    let s = open(&url, &name, cap);
    let senders = 6;
    let per = 25;
    let mut ingest = s.reattach_requests();
    let threads: Vec<_> = (0..senders)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                let tx = s.request_sender();
                for i in 0..per {
                    tx.publish(backfill("search", &format!("t{t}_{i}"))).unwrap();
                }
            })
        })
        .collect();
    let mut seen = BTreeSet::new();
    let mut per_sender: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let mut nacked_once = BTreeSet::new();
    while seen.len() < senders * per {
        let r = ingest.recv_timeout(Duration::from_secs(10)).unwrap().expect("not closed");
        let st = s.request_stats();
        assert!(st.published - st.acked_items <= cap as u64, "the bound: {st:?}");
        let lanestream::Request::Backfill { indexes, .. } = r.item() else { panic!() };
        let key = indexes[0].as_str().to_owned();
        // Every 7th is nacked once: it comes back, then is acked.
        if seen.len() % 7 == 0 && nacked_once.insert(key.clone()) {
            assert_eq!(r.attempt(), 1);
            r.nack();
            continue;
        }
        assert!(seen.insert(key.clone()), "{key} acked twice");
        let (t, i) = key[1..].split_once('_').unwrap();
        per_sender.entry(t.parse().unwrap()).or_default().push(i.parse().unwrap());
        r.ack().unwrap();
    }
    threads.into_iter().for_each(|t| t.join().unwrap());
    assert!(matches!(ingest.try_recv(), Err(TryRecvError::Empty)));
    for (t, is) in per_sender {
        let mut sorted = is.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..per).collect::<Vec<_>>(), "sender {t}: each request once");
    }
    let st = s.request_stats();
    assert_eq!(st.acked_items, (senders * per) as u64);
    assert_eq!(st.published, (senders * per) as u64, "nothing published twice");
}

/// The request lane alone on its log: out-of-order acks around a held request, the log trimmed
/// every 64 entries below it (never past it), a restart that gives the held and released
/// requests back, and no request twice.
#[test]
fn the_request_lane_trims_below_its_acked_prefix_and_gives_unacked_requests_back_after_a_restart() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url);
    let req_ids = |admin: &mut redis::Connection| -> Vec<u64> {
        let v: Vec<(String, redis::Value)> =
            redis::cmd("XRANGE").arg(format!("{{{name}}}:req")).arg("-").arg("+").query(admin).unwrap();
        v.into_iter().map(|(id, _)| id.split('-').next().unwrap().parse().unwrap()).collect()
    };
    let s = open(&url, &name, 256);
    let tx = s.request_sender();
    let mut ingest = s.reattach_requests();
    let index = |r: &lanestream::Request| {
        let lanestream::Request::Backfill { indexes, .. } = r else { panic!("{r:?}") };
        indexes[0].as_str()[1..].parse::<u64>().unwrap()
    };
    let mut held = Vec::new();
    for i in 1..=150u64 {
        tx.publish(backfill("search", &format!("i{i}"))).unwrap();
        let r = ingest.try_recv().unwrap();
        assert_eq!((index(r.item()), r.attempt()), (i, 1));
        match i {
            20 | 90 => held.push(r),
            30 => {
                r.nack();
                let again = ingest.try_recv().unwrap();
                assert_eq!((index(again.item()), again.attempt()), (30, 2), "released first");
                held.push(again);
            }
            _ => r.ack().unwrap(),
        }
        let first = req_ids(&mut admin).first().copied();
        assert!(first.is_none_or(|f| f <= 20), "request {first:?} first at {i}: an unacked one was trimmed");
    }
    assert_eq!(s.request_stats().acked_items, 19, "the prefix stops at 20");
    std::mem::forget((held, ingest, tx));
    std::mem::forget(s);
    kill_connections(&mut admin, &name);
    let s = open(&url, &name, 256);
    let mut ingest = s.reattach_requests();
    let mut got = Vec::new();
    while let Ok(r) = ingest.try_recv() {
        got.push((index(r.item()), r.attempt()));
        r.ack().unwrap();
    }
    assert_eq!(got, [(20, 2), (30, 3), (90, 2)]);
    let st = s.request_stats();
    assert_eq!((st.published, st.acked_items), (150, 150), "{st:?}");
    assert_eq!(s.trim().unwrap(), 0, "the sink log's floor (nothing in it)");
    assert_eq!(req_ids(&mut admin), Vec::<u64>::new(), "the request log trimmed to its acked prefix");
}

// ----- Huge batches, a flushed script cache, killed connections -----------------------------------

fn huge(position: u64, envelopes: usize, doc: &'static [u8]) -> LaneItem {
    let env: Vec<Envelope> = (0..envelopes)
        .map(|i| Envelope {
            index: IndexName::new("docs").unwrap(),
            id: format!("{position}-{i}"),
            op: Op::Upsert,
            position: Some(Position(position)),
            document: bytes::Bytes::from_static(doc),
            built_at_micros: None,
            relation: None,
            old_id: None,
            unchanged: Vec::new(),
        })
        .collect();
    LaneItem::Batch(Batch::new(Some(Position(position)), env.into()))
}

#[test]
fn huge_batches_go_through_the_plain_xadd_and_xrange_intact() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url);
    static DOC: [u8; 4096] = [b'x'; 4096];
    let s = open(&url, &name, 4);
    let mut p = s.fanout().unwrap();
    let mut c = s.reattach("search").unwrap();
    // ~8 MB and ~16 MB: a payload far over any listpack/XADD fast path.
    let items = [huge(1, 2000, &DOC), huge(2, 4000, &DOC), huge(3, 1, &DOC)];
    for it in &items {
        p.publish(it.clone()).unwrap();
    }
    let d1 = c.try_recv().unwrap();
    assert_eq!(d1.item(), &items[0]);
    // Released and redelivered (the script's own XRANGE, not the pipelined one).
    d1.nack();
    let again = c.try_recv().unwrap();
    assert_eq!((again.item(), again.attempt()), (&items[0], 2));
    again.ack().unwrap();
    for it in &items[1..] {
        let d = c.try_recv().unwrap();
        assert_eq!(d.item(), it);
        d.ack().unwrap();
    }
    assert_eq!(s.acked("search").unwrap(), Some(Position(3)));
}

#[test]
fn a_script_flush_mid_run_reloads_and_lands_each_operation_once() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup_flushing(&url);
    let s = open(&url, &name, 64);
    let mut p = s.fanout().unwrap();
    let mut c = s.reattach("search").unwrap();
    let flush = |admin: &mut redis::Connection| {
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(admin).unwrap();
    };
    let mut held = Vec::new();
    for i in 1..=30u64 {
        if i % 2 == 0 {
            flush(&mut admin);
        }
        p.publish(batch(i)).unwrap();
        if i % 3 == 0 {
            flush(&mut admin);
        }
        let d = c.try_recv().unwrap();
        assert_eq!((pos(&d), d.attempt()), (i, 1));
        if i % 5 == 0 {
            flush(&mut admin);
        }
        if i % 4 == 0 {
            held.push(d); // acked later, out of order
        } else {
            d.ack().unwrap();
        }
        if i % 8 == 0 {
            flush(&mut admin);
            let d = held.remove(0);
            d.nack();
            flush(&mut admin);
            let r = c.try_recv().unwrap();
            assert_eq!(r.attempt(), 2);
            flush(&mut admin);
            r.ack().unwrap();
        }
    }
    flush(&mut admin);
    held.into_iter().for_each(|d| d.ack().unwrap());
    assert!(matches!(c.try_recv(), Err(TryRecvError::Empty)));
    assert_eq!(log_ids(&mut admin, &name), (1..=30).collect::<Vec<_>>());
    let st = s.stats("search").unwrap();
    assert_eq!((st.published, st.acked_items, st.delivered), (30, 30, 33), "{st:?}");
}

#[test]
fn killed_connections_between_operations_give_clear_errors_then_nothing_twice() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url);
    // No retry: a lost connection is an error at once.
    let s = RedisStream::builder(url.as_str(), name.as_str())
        .capacity(8)
        .retry_for(Duration::ZERO)
        .sink("search")
        .build()
        .unwrap();
    let mut p = s.fanout().unwrap();
    let mut c = s.reattach("search").unwrap();
    let mut published = 0u64;
    let mut errors = 0;
    let mut acked = BTreeSet::new();
    for i in 1..=40u64 {
        // Publish `published + 1` until it lands (a lost reply is retried as the same publish).
        loop {
            if i % 3 == 0 {
                kill_connections(&mut admin, &name);
            }
            match p.try_publish(batch(published + 1)) {
                Ok(()) => break,
                Err(PublishError::Backend { error: BackendError::Connection, .. }) => errors += 1,
                Err(PublishError::PositionRegressed { last, .. }) => {
                    // Landed by an attempt whose reply was lost: never a second time.
                    panic!("publish {} landed twice? last {last:?}", published + 1)
                }
                Err(e) => panic!("publish: {e:?}"),
            }
            if i % 3 == 0 {
                break;
            }
        }
        if s.stats("search").unwrap().published > published {
            published += 1;
        }
        if i % 4 == 0 {
            kill_connections(&mut admin, &name);
        }
        let d = match c.try_recv() {
            Ok(d) => d,
            Err(TryRecvError::Backend(BackendError::Connection)) => {
                errors += 1;
                match c.try_recv() {
                    Ok(d) => d,
                    Err(TryRecvError::Empty) => continue,
                    Err(e) => panic!("recv after reconnect: {e:?}"),
                }
            }
            Err(TryRecvError::Empty) => continue,
            Err(e) => panic!("recv: {e:?}"),
        };
        assert_eq!(d.attempt(), 1, "delivered once on one connection or another: {d:?}");
        if i % 5 == 0 {
            kill_connections(&mut admin, &name);
        }
        assert!(acked.insert(pos(&d)), "{} delivered after its ack", pos(&d));
        d.ack().unwrap();
    }
    acked.extend(drain_ack(&mut c).into_iter().map(|(p, a)| {
        assert_eq!(a, 1);
        p
    }));
    let st = s.stats("search").unwrap();
    assert_eq!(st.published, published);
    assert_eq!(acked, (1..=published).collect(), "every publish delivered and acked once");
    assert_eq!(log_ids(&mut admin, &name), (1..=published).collect::<Vec<_>>(), "no entry twice");
    assert_eq!((st.acked_items, st.delivered), (published, published), "{st:?}");
    // A pooled connection found dead gets one fresh retry even without a retry budget: the
    // kills surface in the stream's count of connection errors and its last error, not as
    // failed calls (those that did fail are counted too).
    assert!(s.connection_errors() > errors, "{} counted, {errors} calls failed", s.connection_errors());
    let last = s.last_error().expect("the lost connections were seen");
    assert!(last.contains("connection"), "{last}");
}

// ----- A model of one lane -------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Action {
    Publish,
    Recv,
    Ack(usize),
    Nack(usize),
    Drop(usize),
    StaleAck(usize),
    /// A taken-over consumer's delivery dropped: its nack is refused, nothing changes.
    StaleDrop(usize),
    Reattach,
    Restart,
    Trim,
    /// Every connection of the stream killed (the backend reconnects on the next call).
    Kill,
    /// The server's script cache flushed.
    Flush,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => Just(Action::Publish),
        5 => Just(Action::Recv),
        3 => (0..8usize).prop_map(Action::Ack),
        1 => (0..8usize).prop_map(Action::Nack),
        1 => (0..8usize).prop_map(Action::Drop),
        1 => (0..8usize).prop_map(Action::StaleAck),
        1 => (0..8usize).prop_map(Action::StaleDrop),
        1 => Just(Action::Reattach),
        1 => Just(Action::Restart),
        1 => Just(Action::Trim),
        1 => Just(Action::Kill),
        1 => Just(Action::Flush),
    ]
}

/// The lane as the contract sees it: entries `1..=published` (entry `k` at position `k`).
#[derive(Default)]
struct Model {
    published: u64,
    /// Entries handed out for the first time so far (the next new one is `read + 1`).
    read: u64,
    acked: BTreeSet<u64>,
    /// Released, waiting for redelivery (lowest first).
    released: BTreeSet<u64>,
    /// Deliveries so far, per entry.
    deliveries: BTreeMap<u64, u32>,
}

impl Model {
    fn prefix(&self) -> u64 {
        (1..).take_while(|k| self.acked.contains(k)).last().unwrap_or(0)
    }
}

fn run_model(url: &str, actions: &[Action]) -> Result<(), TestCaseError> {
    let (name, _cleanup, mut admin) = setup_flushing(url);
    let cap = 4usize;
    let mut s = open(url, &name, cap);
    let mut p = s.fanout().unwrap();
    let mut c = s.reattach("search").unwrap();
    let mut held: Vec<RedisDelivery<LaneItem>> = Vec::new();
    let mut stale: Vec<RedisDelivery<LaneItem>> = Vec::new();
    let mut m = Model::default();
    // Every old epoch's deliveries go back to the released set.
    let take_back = |m: &mut Model, held: &mut Vec<RedisDelivery<LaneItem>>| {
        for d in held.iter() {
            m.released.insert(pos(d));
        }
        std::mem::take(held)
    };
    for a in actions {
        match a {
            Action::Publish => {
                let r = p.try_publish(batch(m.published + 1));
                if m.published - m.prefix() < cap as u64 {
                    prop_assert!(r.is_ok(), "{a:?}: {r:?}");
                    m.published += 1;
                } else {
                    prop_assert!(matches!(r, Err(PublishError::Full(_))), "bound: {r:?}");
                }
            }
            Action::Recv => {
                let want = m.released.first().copied().or((m.read < m.published).then_some(m.read + 1));
                match (c.try_recv(), want) {
                    (Ok(d), Some(k)) => {
                        let n = m.deliveries.entry(k).or_default();
                        *n += 1;
                        prop_assert_eq!((pos(&d), d.attempt()), (k, *n));
                        prop_assert!(!m.acked.contains(&k));
                        if !m.released.remove(&k) {
                            m.read += 1;
                        }
                        held.push(d);
                    }
                    (Err(TryRecvError::Empty), None) => {}
                    (got, want) => prop_assert!(false, "recv: got {got:?}, want {want:?}"),
                }
            }
            Action::Ack(i) | Action::Nack(i) | Action::Drop(i) if !held.is_empty() => {
                let d = held.remove(i % held.len());
                let k = pos(&d);
                match a {
                    Action::Ack(_) => {
                        prop_assert!(d.ack().is_ok());
                        m.acked.insert(k);
                    }
                    Action::Nack(_) => {
                        d.nack();
                        m.released.insert(k);
                    }
                    _ => {
                        drop(d);
                        m.released.insert(k);
                    }
                }
            }
            Action::StaleAck(i) if !stale.is_empty() => {
                let d = stale.remove(i % stale.len());
                let r = d.ack();
                prop_assert!(matches!(r, Err(AckError::Detached)), "a stale ack: {r:?}");
            }
            Action::StaleDrop(i) if !stale.is_empty() => drop(stale.remove(i % stale.len())),
            Action::Reattach => {
                let old = take_back(&mut m, &mut held);
                stale.extend(old);
                c = s.reattach("search").unwrap();
            }
            Action::Restart => {
                let old = take_back(&mut m, &mut held);
                std::mem::forget(old);
                for d in stale.drain(..) {
                    std::mem::forget(d);
                }
                std::mem::forget((c, p));
                drop(s);
                kill_connections(&mut admin, &name);
                s = open(url, &name, cap);
                c = s.attach("search").unwrap();
                p = s.fanout().unwrap();
            }
            Action::Trim => {
                prop_assert_eq!(s.trim().unwrap(), m.prefix());
                let first = log_ids(&mut admin, &name).first().copied();
                prop_assert!(first.is_none_or(|f| f == m.prefix() + 1), "first entry {first:?}");
            }
            Action::Kill => kill_connections(&mut admin, &name),
            Action::Flush => {
                let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut admin).unwrap();
            }
            _ => {}
        }
        let prefix = m.prefix();
        prop_assert_eq!(s.acked("search").unwrap(), (prefix > 0).then_some(Position(prefix)));
        let st = s.stats("search").unwrap();
        prop_assert_eq!((st.published, st.acked_items), (m.published, prefix));
    }
    // Drain: every unacked entry comes (back) exactly once more, then the lane is idle.
    for d in held.drain(..) {
        m.acked.insert(pos(&d));
        d.ack().unwrap();
    }
    let mut rest = BTreeSet::new();
    while let Ok(d) = c.try_recv() {
        prop_assert!(rest.insert(pos(&d)) && !m.acked.contains(&pos(&d)));
        d.ack().unwrap();
    }
    prop_assert_eq!(m.acked.len() + rest.len(), m.published as usize);
    prop_assert_eq!(s.acked("search").unwrap(), (m.published > 0).then_some(Position(m.published)));
    for d in stale {
        std::mem::forget(d);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, max_shrink_iters: 300, ..ProptestConfig::default() })]
    #[test]
    fn random_operation_sequences_keep_at_least_once_and_the_acked_prefix(
        actions in proptest::collection::vec(action(), 1..60)
    ) {
        let Some(url) = url() else { return Ok(()) };
        run_model(&url, &actions)?;
    }
}

/// The script cache flushed again right after each `SCRIPT LOAD` a call makes to recover from
/// a `NOSCRIPT` (before the call hears that the load is done), twice in a row for every publish,
/// receive and ack: each call meets `NOSCRIPT` after its reload and is sent again
/// (`Pool::run`, up to three times), so no call fails, and each lands once.
#[test]
fn a_script_cache_flushed_after_each_reload_fails_no_call() {
    let url = server!();
    let Some(proxy) = ReplyLosingProxy::start(&url) else {
        eprintln!("the server is not on a unix socket: this test needs one");
        return;
    };
    let (name, _cleanup, mut admin) = setup_flushing(&url);
    let s = RedisStream::builder(&proxy.url, &name).capacity(64).sinks(["search"]).build().unwrap();
    let mut p = s.fanout().unwrap();
    let mut c = s.reattach("search").unwrap();
    let mut lost_reloads = || {
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut admin).unwrap();
        proxy.flush_loads.store(2, Ordering::SeqCst);
    };
    for i in 1..=10u64 {
        lost_reloads();
        p.publish(batch(i)).unwrap_or_else(|e| panic!("publish {i}: {e} ({:?})", s.last_error()));
        lost_reloads();
        let mut d = c.try_recv().unwrap_or_else(|e| panic!("receive {i}: {e} ({:?})", s.last_error()));
        assert_eq!((pos(&d), d.attempt()), (i, 1));
        if i % 2 == 0 {
            // A first delivery's ack is a plain XADD to the lane's ack log: no script to load.
            // A redelivery's is a script: nacked and received again, it is acked below.
            lost_reloads();
            d.nack();
            assert_eq!(proxy.flush_loads.load(Ordering::SeqCst), 0, "nack {i} reloaded its script twice");
            lost_reloads();
            d = c.try_recv().unwrap_or_else(|e| panic!("receive {i} again: {e} ({:?})", s.last_error()));
            assert_eq!((pos(&d), d.attempt()), (i, 2));
        }
        lost_reloads();
        d.ack().unwrap_or_else(|e| panic!("ack {i}: {e} ({:?})", s.last_error()));
        let left = if i % 2 == 0 { 0 } else { 2 };
        assert_eq!(
            proxy.flush_loads.load(Ordering::SeqCst),
            left,
            "ack {i}: a script reloaded twice, or none"
        );
        proxy.flush_loads.store(0, Ordering::SeqCst);
    }
    assert_eq!(s.acked("search").unwrap(), Some(Position(10)));
}

/// A unix-socket proxy in front of the test server that can lose the reply to a publish: armed,
/// it forwards the next request that carries an `XADD` (a lone lane's publish), lets the server
/// run it, swallows the reply and closes the client's connection; then it refuses connections
/// until healed. The client sees a connection error for a publish that landed.
///
/// It can also flush the server's script cache right after a client's `SCRIPT LOAD` is done and
/// before the client hears so (`flush_loads` times): the client's next try of the script then
/// meets `NOSCRIPT` again, every time.
struct ReplyLosingProxy {
    url: String,
    /// 0: pass through; 1: armed; 2: refusing connections.
    mode: Arc<std::sync::atomic::AtomicU8>,
    /// How many more `SCRIPT LOAD`s to follow with a flush.
    flush_loads: Arc<AtomicUsize>,
    _dir: tempfile::TempDir,
}

impl ReplyLosingProxy {
    /// `None` unless the server is on a unix socket (`redis+unix://PATH`, as in CI).
    fn start(server_url: &str) -> Option<ReplyLosingProxy> {
        use std::io::{Read, Write};
        use std::os::unix::net::{UnixListener, UnixStream};
        let server = server_url.strip_prefix("redis+unix://")?.to_owned();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proxy.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let mode = Arc::new(std::sync::atomic::AtomicU8::new(0));
        let flush_loads = Arc::new(AtomicUsize::new(0));
        let (m, loads) = (mode.clone(), flush_loads.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(mut client) = client else { return };
                if m.load(Ordering::SeqCst) == 2 {
                    continue; // dropped: refused
                }
                let Ok(mut upstream) = UnixStream::connect(&server) else { return };
                let swallow = Arc::new(std::sync::atomic::AtomicBool::new(false));
                // Set when the request just forwarded is a `SCRIPT LOAD` to follow with a flush.
                let flush_next = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let (mut c2, mut u2, sw) =
                    (client.try_clone().unwrap(), upstream.try_clone().unwrap(), swallow.clone());
                let (flush, admin_url) = (flush_next.clone(), format!("redis+unix://{server}"));
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 1 << 16];
                    while let Ok(n @ 1..) = u2.read(&mut buf) {
                        if flush.swap(false, Ordering::SeqCst) {
                            // The load is done; the client does not know yet.
                            let mut admin =
                                redis::Client::open(admin_url.as_str()).unwrap().get_connection().unwrap();
                            let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut admin).unwrap();
                        }
                        if !sw.load(Ordering::SeqCst) && c2.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
                let (m, loads) = (m.clone(), loads.clone());
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 1 << 16];
                    while let Ok(n @ 1..) = client.read(&mut buf) {
                        let chunk = &buf[..n];
                        let is_load = chunk.windows(4).any(|w| w == b"LOAD")
                            && chunk.windows(6).any(|w| w == b"SCRIPT");
                        if is_load
                            && loads
                                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |k| k.checked_sub(1))
                                .is_ok()
                        {
                            flush_next.store(true, Ordering::SeqCst);
                        }
                        let cut = m.load(Ordering::SeqCst) == 1 && chunk.windows(4).any(|w| w == b"XADD");
                        if cut {
                            swallow.store(true, Ordering::SeqCst);
                        }
                        if upstream.write_all(chunk).is_err() {
                            return;
                        }
                        if cut {
                            std::thread::sleep(Duration::from_millis(100)); // the server runs it
                            m.store(2, Ordering::SeqCst);
                            let _ = client.shutdown(std::net::Shutdown::Both);
                            let _ = upstream.shutdown(std::net::Shutdown::Both);
                            return;
                        }
                    }
                });
            }
        });
        Some(ReplyLosingProxy {
            url: format!("redis+unix://{}", path.display()),
            mode,
            flush_loads,
            _dir: dir,
        })
    }
}

/// A publish whose reply was lost landed all the same. Publishing *another* item next must not
/// be taken for a retry of the lost one (the script's "already published" answer): both land,
/// in order. Publishing the *same* item again is a retry: it lands once.
#[test]
fn a_publish_whose_reply_was_lost_is_told_apart_from_the_next_item() {
    let url = server!();
    let Some(proxy) = ReplyLosingProxy::start(&url) else {
        eprintln!("the server is not on a unix socket: this test needs one");
        return;
    };
    for retry_same in [false, true] {
        let (name, _cleanup, _admin) = setup(&url);
        let s = RedisStream::builder(&proxy.url, &name)
            .capacity(8)
            .sinks(["search"])
            .build()
            .unwrap_or_else(|e| panic!("building {name}: {e}"));
        let mut p = s.fanout().unwrap();
        p.publish(batch(1)).unwrap();
        proxy.mode.store(1, Ordering::SeqCst);
        let lost = p.try_publish(batch(2));
        assert!(matches!(lost, Err(PublishError::Backend { .. })), "the reply was lost: {lost:?}");
        proxy.mode.store(0, Ordering::SeqCst);
        let next = if retry_same { 2 } else { 3 };
        p.publish(batch(next)).unwrap();
        let mut c = s.reattach("search").unwrap();
        let mut got = Vec::new();
        while let Ok(d) = c.try_recv() {
            got.push(pos(&d));
            d.ack().unwrap();
        }
        let want: &[u64] = if retry_same { &[1, 2] } else { &[1, 2, 3] };
        assert_eq!(got, want, "retry_same: {retry_same}");
    }
}

// ----- The plain-XADD hot path of a lone lane, from two processes (issue 12) ------------------
//
// A sink lane alone on its log publishes (`MULTI` of two `XADD`s of `<n>-<producer epoch>`),
// receives (`XADD B:dl <epoch>-<n>` + `XRANGE`) and acks (`XADD B:al <epoch>-<n>`) without a
// script; the stream ids are the fences. Two `RedisStream` handles on one stream stand for two
// processes: the second one re-claims the producer or re-attaches the consumer while the first
// one's ends live on (zombies).

/// The lone sink lane's hash.
fn lane_key(name: &str) -> String {
    format!("{{{name}}}:l:search")
}

fn is_fenced<T: std::fmt::Debug>(r: &Result<(), PublishError<T>>) -> bool {
    matches!(r, Err(PublishError::Backend { error: BackendError::Fenced, .. }))
}

/// A zombie producer that still "knows" it has room (its last gate reported plenty) publishes
/// after another process claimed the lane: its plain `MULTI` is refused by the ids, at the exact
/// edge (its next id `<pub + 1>-<E - 1>` equals the claim's fence) and far past it (after the new
/// producer published more), and it lands nothing, also on its 64th entry (the gate's turn).
#[test]
fn a_zombie_producer_on_known_room_after_a_reclaim_by_another_process_lands_nothing() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url);
    let s1 = open(&url, &name, 1024);
    let mut zombie = s1.fanout().unwrap();
    publish_all(&mut zombie, 1..=5); // room 1024 proven by the first gate: 2..=5 are plain MULTIs
    free_producer_claim(&mut admin, &name);
    let s2 = open(&url, &name, 1024);
    let mut live = s2.fanout().unwrap();
    // Before the live producer publishes: the zombie's next id is the fence itself.
    let r = zombie.try_publish(batch(6));
    assert!(is_fenced(&r), "the zombie's publish at the fence: {r:?}");
    publish_all(&mut live, 6..=60);
    // The zombie keeps going (its count stays 5): ids `6-1`, below the live producer's.
    for k in 6..=70 {
        let r = zombie.try_publish(batch(1000 + k));
        assert!(is_fenced(&r), "zombie publish {k}: {r:?}");
    }
    publish_all(&mut live, 61..=70); // 64 is the gate's (trim) turn
    let st = s2.stats("search").unwrap();
    assert_eq!((st.published, st.last_published), (70, Some(Position(70))), "{st:?}");
    assert_eq!(log_ids(&mut admin, &name), (1..=70).collect::<Vec<_>>(), "nothing of the zombie's");
    let mut c = s2.reattach("search").unwrap();
    let got = drain_ack(&mut c);
    assert_eq!(got, (1..=70).map(|k| (k, 1)).collect::<Vec<_>>());
    assert_eq!(s1.acked("search").unwrap(), Some(Position(70)), "seen from the zombie's process too");
    assert!(s1.is_idle() && s2.is_idle());
    // A third process claims again: both older producers stay fenced, the newest goes on.
    drop(live);
    let s3 = open(&url, &name, 1024);
    let mut third = s3.fanout().unwrap();
    let r = zombie.try_publish(batch(2000));
    assert!(is_fenced(&r), "{r:?}");
    third.publish(batch(71)).unwrap();
    assert_eq!(log_ids(&mut admin, &name).last(), Some(&71));
    assert_eq!(s1.stats("search").unwrap().published, 71);
}

/// A zombie consumer (another process re-attached the lane) acks and receives on the plain
/// path: its ack `XADD`s (in order and out of order) and delivery-log records are refused, it
/// gets `Detached`, and the new consumer gets exactly the old one's unacked entries back first.
#[test]
fn a_zombie_consumers_plain_acks_and_receives_after_a_reattach_by_another_process_are_refused() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url);
    let s1 = open(&url, &name, 16);
    let mut p = s1.fanout().unwrap();
    publish_all(&mut p, 1..=8);
    let mut old = s1.reattach("search").unwrap();
    let mut held = hold(&mut old, 5); // 1 by the script, 2..=5 by the delivery log
    held.remove(&1).unwrap().ack().unwrap(); // a plain ack-log XADD
    held.remove(&3).unwrap().ack().unwrap(); // out of order, still a plain XADD (id above)
    let s2 = open(&url, &name, 16);
    assert_eq!(s2.acked("search").unwrap(), Some(Position(1)), "folded by the reader of another process");
    let st = s2.stats("search").unwrap();
    assert_eq!((st.published, st.acked_items, st.in_flight, st.delivered), (8, 1, 4, 5), "{st:?}"); // 3 acked waits for 2
    let mut new = s2.reattach("search").unwrap();
    // The zombie: its next plain receive (entry 6 expected) and its acks are refused.
    assert!(matches!(old.try_recv(), Err(TryRecvError::Detached)));
    assert!(matches!(held.remove(&5).unwrap().ack(), Err(AckError::Detached)), "an ack above the last");
    assert!(matches!(held.remove(&2).unwrap().ack(), Err(AckError::Detached)), "an ack below the last");
    drop(held.remove(&4).unwrap()); // a stale nack: nothing
    let mut got = Vec::new();
    let mut again = Vec::new();
    for _ in 0..6 {
        let d = new.try_recv().unwrap();
        got.push((pos(&d), d.attempt()));
        again.push(d);
    }
    assert_eq!(got, [(2, 2), (4, 2), (5, 2), (6, 1), (7, 1), (8, 1)], "the unacked first, once each");
    assert!(matches!(new.try_recv(), Err(TryRecvError::Empty)));
    assert_eq!(s1.acked("search").unwrap(), Some(Position(1)));
    for d in again.into_iter().rev() {
        d.ack().unwrap(); // 8, 7, 6 plain (out of order: refused, then the script), the rest scripts
    }
    assert_eq!(s1.acked("search").unwrap(), Some(Position(8)));
    let st = s1.stats("search").unwrap();
    assert_eq!(
        (st.published, st.acked_items, st.in_flight, st.released, st.delivered, st.redelivered),
        (8, 8, 0, 0, 11, 3),
        "{st:?}"
    );
    assert!(s1.is_idle());
    assert_eq!(s2.watermark(), Some(Position(8)));
}

/// Acks in flight on the plain path (in and out of order) while another process re-attaches:
/// each lands before the re-attach (and counts) or is refused after (and its entry comes back);
/// never both, never neither. Right after the re-attach the acked prefix is exactly the
/// contiguous prefix of the acks that were answered `Ok`.
#[test]
fn plain_acks_in_flight_at_a_reattach_by_another_process_land_xor_come_back() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url);
    let s1 = open(&url, &name, 64);
    let s2 = open(&url, &name, 64);
    let mut p = s1.fanout().unwrap();
    let per_round = 12u64;
    let mut both = 0;
    for round in 0..12u64 {
        let base = round * per_round;
        publish_all(&mut p, base + 1..=base + per_round);
        let mut old = s1.reattach("search").unwrap();
        let mut held: Vec<_> = (0..per_round).map(|_| old.try_recv().unwrap()).collect();
        // Mostly in order, some swapped: out-of-order acks are refused by the ack log, then
        // run the script.
        if round % 2 == 1 {
            held.swap(2, 5);
            held.swap(7, 8);
        }
        let barrier = Arc::new(Barrier::new(2));
        let b2 = barrier.clone();
        let acker = std::thread::spawn(move || {
            b2.wait();
            held.into_iter()
                .map(|d| {
                    let k = pos(&d);
                    (k, d.ack())
                })
                .collect::<Vec<_>>()
        });
        barrier.wait();
        if round % 3 == 1 {
            std::thread::sleep(Duration::from_micros(300 * round));
        }
        let mut new = s2.reattach("search").unwrap();
        let acks = acker.join().unwrap();
        let landed: BTreeSet<u64> = acks.iter().filter(|(_, r)| r.is_ok()).map(|(k, _)| *k).collect();
        for (k, r) in &acks {
            assert!(matches!(r, Ok(()) | Err(AckError::Detached)), "ack of {k}: {r:?}");
        }
        let prefix = (base + 1..).take_while(|k| landed.contains(k)).last().unwrap_or(base);
        assert_eq!(
            s2.acked("search").unwrap(),
            (prefix > 0).then_some(Position(prefix)),
            "round {round}: landed {landed:?}"
        );
        let back: Vec<(u64, u32)> = drain_ack(&mut new);
        let back_set: BTreeSet<u64> = back.iter().map(|(k, _)| *k).collect();
        assert!(back.iter().all(|&(_, a)| a == 2), "round {round}: {back:?}");
        assert!(landed.is_disjoint(&back_set), "round {round}: acked and redelivered: {landed:?} {back:?}");
        let all: BTreeSet<u64> = landed.union(&back_set).copied().collect();
        assert_eq!(all, (base + 1..=base + per_round).collect(), "round {round}: lost entries");
        if !landed.is_empty() && !back.is_empty() {
            both += 1;
        }
        assert_eq!(s1.acked("search").unwrap(), Some(Position(base + per_round)));
        let st = s1.stats("search").unwrap();
        assert_eq!((st.published, st.acked_items), (base + per_round, base + per_round), "{st:?}");
    }
    eprintln!("rounds with acks on both sides of the re-attach: {both}");
}

/// Waits until the proxy has cut a connection (mode 2), then runs `between` (another process's
/// step while this one cannot reach Redis) and heals the proxy.
fn heal_after_cut<T: Send + 'static>(
    proxy: &ReplyLosingProxy,
    between: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let mode = proxy.mode.clone();
    std::thread::spawn(move || {
        let start = std::time::Instant::now();
        while mode.load(Ordering::SeqCst) != 2 {
            assert!(start.elapsed() < Duration::from_secs(5), "the proxy never cut");
            std::thread::sleep(Duration::from_millis(1));
        }
        let out = between();
        mode.store(0, Ordering::SeqCst);
        out
    })
}

/// A plain ack (`XADD B:al`) whose reply is lost: retried, it counts once (`Ok`); when another
/// process re-attached the lane meanwhile, the retry cannot tell (`Backend(Connection)`), and the
/// entry, which did land, is not redelivered.
#[test]
fn a_plain_ack_whose_reply_was_lost_counts_once_and_is_never_also_redelivered() {
    let url = server!();
    let Some(proxy) = ReplyLosingProxy::start(&url) else {
        eprintln!("the server is not on a unix socket: this test needs one");
        return;
    };
    for reattach in [false, true] {
        let (name, _cleanup, _admin) = setup(&url);
        let s = RedisStream::builder(&proxy.url, &name).capacity(8).sinks(["search"]).build().unwrap();
        let direct = open(&url, &name, 8);
        let mut p = direct.fanout().unwrap();
        publish_all(&mut p, 1..=4);
        let mut c = s.reattach("search").unwrap();
        let d1 = c.try_recv().unwrap();
        let d2 = c.try_recv().unwrap();
        assert_eq!((pos(&d1), pos(&d2)), (1, 2));
        d1.ack().unwrap();
        proxy.mode.store(1, Ordering::SeqCst);
        let other = direct.clone();
        let healer = heal_after_cut(&proxy, move || reattach.then(|| other.reattach("search").unwrap()));
        let r = d2.ack();
        let c2 = healer.join().unwrap();
        assert_eq!(direct.acked("search").unwrap(), Some(Position(2)), "reattach {reattach}: the ack landed");
        match c2 {
            None => {
                assert!(r.is_ok(), "a retried ack that landed: {r:?} ({:?})", s.last_error());
                assert_eq!(drain_ack(&mut c), [(3, 1), (4, 1)]);
            }
            Some(mut c2) => {
                assert!(
                    matches!(r, Err(AckError::Backend(BackendError::Connection))),
                    "landed, then re-attached: unknown to the acker: {r:?}"
                );
                assert!(matches!(c.try_recv(), Err(TryRecvError::Detached)));
                assert_eq!(drain_ack(&mut c2), [(3, 1), (4, 1)], "2 landed: never redelivered");
            }
        }
        let st = direct.stats("search").unwrap();
        assert_eq!((st.published, st.acked_items, st.redelivered), (4, 4, 0), "reattach {reattach}: {st:?}");
        assert!(s.connection_errors() > 0);
    }
}

/// `try_recv`, again while it fails with `Connection` (the pool's reconnect backoff: a
/// `Budget::Once` call gives up at once while the backoff of an earlier failure runs).
fn recv_through_backoff(
    c: &mut impl LaneConsumer<LaneItem, Delivery = RedisDelivery<LaneItem>>,
) -> Result<RedisDelivery<LaneItem>, TryRecvError> {
    let start = std::time::Instant::now();
    loop {
        match c.try_recv() {
            Err(TryRecvError::Backend(BackendError::Connection))
                if start.elapsed() < Duration::from_secs(3) =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

/// A plain receive (`XADD B:dl` + `XRANGE`) whose reply is lost: the entry was recorded as
/// delivered. The consumer's next receive gets it (attempt 1, once), or, when another process
/// re-attached meanwhile, the new consumer gets it back first (attempt 2) and the old one is
/// detached.
#[test]
fn a_plain_receive_whose_reply_was_lost_is_delivered_once_or_redelivered_after_a_reattach() {
    let url = server!();
    let Some(proxy) = ReplyLosingProxy::start(&url) else {
        eprintln!("the server is not on a unix socket: this test needs one");
        return;
    };
    for reattach in [false, true] {
        let (name, _cleanup, _admin) = setup(&url);
        let s = RedisStream::builder(&proxy.url, &name).capacity(8).sinks(["search"]).build().unwrap();
        let direct = open(&url, &name, 8);
        let mut p = direct.fanout().unwrap();
        publish_all(&mut p, 1..=4);
        let mut c = s.reattach("search").unwrap();
        let d1 = c.try_recv().unwrap(); // the script; 2 is the delivery log's
        assert_eq!(pos(&d1), 1);
        proxy.mode.store(1, Ordering::SeqCst);
        let other = direct.clone();
        let healer = heal_after_cut(&proxy, move || reattach.then(|| other.reattach("search").unwrap()));
        let lost = c.try_recv();
        let c2 = healer.join().unwrap();
        // Recorded in the delivery log: the stats count 2 as delivered.
        let st = direct.stats("search").unwrap();
        assert_eq!((st.delivered, st.queued), (2, 2), "reattach {reattach}: {lost:?} {st:?}");
        match c2 {
            None => {
                let mut got = Vec::new();
                if let Ok(d) = lost {
                    got.push((pos(&d), d.attempt()));
                    d.ack().unwrap();
                } else {
                    assert!(matches!(lost, Err(TryRecvError::Backend(BackendError::Connection))), "{lost:?}");
                }
                // The pool waits out its backoff: `try_recv` says `Connection` until then.
                if let Ok(d) = recv_through_backoff(&mut c) {
                    got.push((pos(&d), d.attempt()));
                    d.ack().unwrap();
                }
                got.extend(drain_ack(&mut c));
                assert_eq!(got, [(2, 1), (3, 1), (4, 1)]);
                d1.ack().unwrap();
            }
            Some(mut c2) => {
                assert!(
                    matches!(lost, Err(TryRecvError::Backend(_)) | Err(TryRecvError::Detached)),
                    "{lost:?}"
                );
                let r = recv_through_backoff(&mut c);
                assert!(matches!(r, Err(TryRecvError::Detached)), "{:?}", r.map(|d| pos(&d)));
                assert!(matches!(c.try_recv(), Err(TryRecvError::Detached)));
                assert!(matches!(d1.ack(), Err(AckError::Detached)));
                assert_eq!(drain_ack(&mut c2), [(1, 2), (2, 2), (3, 1), (4, 1)]);
            }
        }
        let st = direct.stats("search").unwrap();
        assert_eq!((st.published, st.acked_items, st.in_flight, st.released), (4, 4, 0, 0), "{st:?}");
    }
}

/// A close from another process races the live producer's plain publishes: every publish that
/// returned `Ok` arrives (in order), none that returned an error does, and then the consumer
/// sees `Closed`.
#[test]
fn a_close_from_another_process_racing_plain_publishes_keeps_exactly_the_ok_ones() {
    let url = server!();
    for round in 0..8u64 {
        let (name, _cleanup, mut admin) = setup(&url);
        let s1 = open(&url, &name, 4096);
        let s2 = open(&url, &name, 4096);
        let mut p = s1.fanout().unwrap();
        let publisher = std::thread::spawn(move || {
            let mut ok = Vec::new();
            for k in 1..=3000u64 {
                match p.try_publish(batch(k)) {
                    Ok(()) => ok.push(k),
                    Err(PublishError::Closed(_)) => {
                        // Closed is final: every later publish too.
                        for j in k + 1..k + 70 {
                            assert!(matches!(p.try_publish(batch(j)), Err(PublishError::Closed(_))));
                        }
                        return ok;
                    }
                    Err(e) => panic!("publish {k}: {e:?}"),
                }
            }
            ok
        });
        std::thread::sleep(Duration::from_millis(2 + 3 * round));
        s2.close("search").unwrap();
        let ok = publisher.join().unwrap();
        assert!(ok.len() < 3000, "the close came after every publish: no race");
        let n = ok.len() as u64;
        assert_eq!(ok, (1..=n).collect::<Vec<_>>());
        let mut c = s2.reattach("search").unwrap();
        let mut got = Vec::new();
        loop {
            match c.try_recv() {
                Ok(d) => {
                    got.push(pos(&d));
                    d.ack().unwrap();
                }
                Err(TryRecvError::Closed) => break,
                Err(e) => panic!("drain: {e:?}"),
            }
        }
        assert_eq!(got, ok, "round {round}");
        assert_eq!(log_ids(&mut admin, &name).last().copied(), ok.last().copied());
        let st = s1.stats("search").unwrap();
        assert_eq!((st.published, st.acked_items, st.closed), (n, n, true), "{st:?}");
    }
}

/// The room proof at the bound's edge: `capacity` plain publishes while nothing is acked, then
/// one more is `Full` (its gate runs); a plain ack (not folded yet) makes exactly one slot.
#[test]
fn the_room_proof_stops_exactly_at_capacity_and_a_plain_ack_frees_exactly_one_slot() {
    let url = server!();
    // One `setup` at a time: each holds a read lock of `SCRIPT_CACHE`, and a second one taken
    // while a flushing test waits for the write lock would deadlock.
    for cap in [1u64, 2, 5] {
        let (name, _cleanup, _admin) = setup(&url);
        let s = open(&url, &name, cap as usize);
        let mut p = s.fanout().unwrap();
        let mut c = s.reattach("search").unwrap();
        publish_all(&mut p, 1..=cap);
        assert!(matches!(p.try_publish(batch(cap + 1)), Err(PublishError::Full(_))), "cap {cap}");
        let mut next = cap + 1;
        for k in 1..=3 * cap {
            let d = c.try_recv().unwrap();
            assert_eq!((pos(&d), d.attempt()), (k, 1));
            d.ack().unwrap();
            p.try_publish(batch(next)).unwrap_or_else(|e| panic!("cap {cap}, after ack {k}: {e:?}"));
            next += 1;
            assert!(matches!(p.try_publish(batch(next)), Err(PublishError::Full(_))), "cap {cap} ack {k}");
            let st = s.stats("search").unwrap();
            assert_eq!(st.published - st.acked_items, cap, "{st:?}");
        }
    }
}

/// A capacity lowered by another process's build: the running producer's room proof is from the
/// old capacity, and it picks the new one up at its next gate, at most 64 publishes later (the
/// 64th entry always runs the gate). From then on the lower bound holds exactly.
#[test]
fn a_capacity_lowered_by_another_process_binds_the_running_producer_within_64_publishes() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url);
    let s1 = open(&url, &name, 500);
    let mut p = s1.fanout().unwrap();
    publish_all(&mut p, 1..=10);
    let s2 = open(&url, &name, 4);
    let mut k = 11;
    while p.try_publish(batch(k)).is_ok() {
        k += 1;
        assert!(k < 200, "the lowered capacity never applied");
    }
    let published = k - 1;
    assert!(published - 10 <= 64, "applied more than 64 publishes later: {published}");
    assert_eq!(published, 63, "the gate of entry 64 is the first check after the rebuild");
    // From here on the lane holds at most 4 unacked entries.
    let mut c = s2.reattach("search").unwrap();
    for a in 1..=published {
        let d = c.try_recv().unwrap();
        assert_eq!(pos(&d), a);
        d.ack().unwrap();
        while p.try_publish(batch(k)).is_ok() {
            k += 1;
        }
        let st = s2.stats("search").unwrap();
        let unacked = st.published - st.acked_items;
        assert!(unacked <= (published - a).max(4), "after ack {a}: {st:?}");
        if published - a < 4 {
            assert_eq!(unacked, 4, "after ack {a}: room left unused: {st:?}");
        }
    }
}

/// The 64th-publish trim (the gate's) with unfolded plain acks and gaps: it removes every
/// entry below the first unacked one and nothing else; the unacked ones come back intact.
#[test]
fn the_64th_publish_trim_never_removes_an_unacked_entry() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url);
    let s = open(&url, &name, 256);
    let mut p = s.fanout().unwrap();
    let mut c = s.reattach("search").unwrap();
    let keep = [5u64, 70, 130];
    let mut held = Vec::new();
    for k in 1..=200u64 {
        p.publish(batch(k)).unwrap();
        let d = c.try_recv().unwrap();
        assert_eq!((pos(&d), d.attempt()), (k, 1));
        if keep.contains(&k) {
            held.push(d);
        } else {
            d.ack().unwrap();
        }
        let ids = log_ids(&mut admin, &name);
        assert!(ids.first().is_none_or(|&f| f <= 5), "after {k}: an unacked entry trimmed: {ids:?}");
        if k >= 64 {
            assert_eq!(ids.first(), Some(&5), "after {k}: the 64th trimmed below the first unacked");
        }
        assert_eq!(ids.len() as u64, k - ids[0] + 1, "after {k}: a hole in the log");
    }
    held.remove(0).ack().unwrap(); // 5: the prefix runs to 69
    assert_eq!(s.acked("search").unwrap(), Some(Position(69)));
    publish_all(&mut p, 201..=256); // 256 trims
    assert_eq!(log_ids(&mut admin, &name).first(), Some(&70));
    std::mem::forget(held);
    let mut c2 = s.reattach("search").unwrap();
    let back = hold(&mut c2, 2);
    assert_eq!(back.iter().map(|(&k, d)| (k, d.attempt())).collect::<Vec<_>>(), [(70, 2), (130, 2)]);
    for (_, d) in back {
        d.ack().unwrap();
    }
    let rest = drain_ack(&mut c2);
    assert_eq!(rest, (201..=256).map(|k| (k, 1)).collect::<Vec<_>>());
    assert_eq!(s.trim().unwrap(), 256);
    assert_eq!(log_len(&mut admin, &name), 0);
}

/// Every handle dropped and rebuilt from Redis while the ack and delivery logs (and the log, the
/// lane's publish record) hold records not folded yet (plain acks in and out of order, plain receives): the new process
/// sees the right counters, acked position, watermark and idleness, gets back exactly the
/// unacked entries, and its producer goes on after the last published one.
#[test]
fn a_restart_with_unfolded_plain_records_keeps_counters_and_delivers_the_unacked_once() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url);
    {
        let s = open(&url, &name, 16);
        let mut p = s.fanout().unwrap();
        publish_all(&mut p, 1..=10); // 2..=10 plain XADDs
        let mut c = s.reattach("search").unwrap();
        let mut held = hold(&mut c, 7); // 2..=7 through the delivery log
        for k in [1, 2, 3, 6] {
            held.remove(&k).unwrap().ack().unwrap(); // plain XADDs; 6 out of order
        }
        // The logs hold records no script folded yet.
        for log in ["al", "dl"] {
            let n: usize =
                redis::cmd("XLEN").arg(format!("{}:{log}", lane_key(&name))).query(&mut admin).unwrap();
            assert!(n > 0, "{log} is folded already: the test does not test the fold");
        }
        std::mem::forget(held);
        std::mem::forget((c, p));
        drop(s);
        kill_connections(&mut admin, &name);
    }
    let s = open(&url, &name, 16);
    assert_eq!(s.acked("search").unwrap(), Some(Position(3)));
    assert_eq!(s.watermark(), Some(Position(3)));
    assert!(!s.is_idle());
    let st = s.stats("search").unwrap();
    assert_eq!(
        (st.published, st.acked_items, st.delivered, st.queued, st.in_flight, st.last_published),
        (10, 3, 7, 3, 4, Some(Position(10))),
        "{st:?}"
    );
    let mut p = s.fanout().unwrap();
    let mut c = s.attach("search").unwrap();
    let got = drain_ack(&mut c);
    assert_eq!(got, [(4, 2), (5, 2), (7, 2), (8, 1), (9, 1), (10, 1)]);
    let r = p.try_publish(batch(10));
    assert!(matches!(r, Err(PublishError::PositionRegressed { .. })), "L4 after the restart: {r:?}");
    p.publish(batch(11)).unwrap();
    assert_eq!(drain_ack(&mut c), [(11, 1)]);
    assert!(s.is_idle());
    assert_eq!(s.watermark(), Some(Position(11)));
    let st = s.stats("search").unwrap();
    assert_eq!(
        (st.published, st.acked_items, st.in_flight, st.released, st.redelivered),
        (11, 11, 0, 0, 3),
        "{st:?}"
    );
}

// ----- A proptest of the lone lane's plain path against the in-memory backend -----------------

/// One step of [`run_against_memory`]. Indexes pick a held delivery (modulo how many).
#[derive(Clone, Debug)]
enum Step {
    Publish,
    Recv,
    Ack(usize),
    Nack(usize),
    Drop(usize),
    /// A taken-over consumer's delivery acked (Redis only: the memory backend's stale deliveries
    /// pin slots, its documented difference, so they are dropped there at the take-over).
    StaleAck(usize),
    /// Re-attach from process `0` or `1`.
    Reattach(usize),
    /// The producer re-claimed by the other process; the old one (a zombie) tries once more.
    Reclaim,
    /// Every Redis handle dropped and rebuilt (the memory lane re-attaches).
    Restart,
    /// The next plain ack's reply lost (the consumer's process talks through the proxy).
    LostAck(usize),
    /// The next receive's reply lost.
    LostRecv,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => Just(Step::Publish),
        5 => Just(Step::Recv),
        4 => (0..8usize).prop_map(Step::Ack),
        1 => (0..8usize).prop_map(Step::Nack),
        1 => (0..8usize).prop_map(Step::Drop),
        1 => (0..8usize).prop_map(Step::StaleAck),
        1 => (0..2usize).prop_map(Step::Reattach),
        1 => Just(Step::Reclaim),
        1 => Just(Step::Restart),
        1 => (0..8usize).prop_map(Step::LostAck),
        1 => Just(Step::LostRecv),
    ]
}

/// Heals the proxy after a cut, or disarms it if the step sent no `XADD` (a script took it).
fn disarm(proxy: &ReplyLosingProxy) {
    let _ = proxy.mode.compare_exchange(1, 0, Ordering::SeqCst, Ordering::SeqCst);
    proxy.mode.store(0, Ordering::SeqCst);
}

/// Runs `f` with the proxy armed: the next `XADD` it sends loses its reply; a thread heals the
/// proxy once it cut (or gives up when `f` returned without a cut).
static CUTS: AtomicUsize = AtomicUsize::new(0);

fn with_lost_reply<R>(proxy: &ReplyLosingProxy, f: impl FnOnce() -> R) -> R {
    let mode = proxy.mode.clone();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d2 = done.clone();
    mode.store(1, Ordering::SeqCst);
    let healer = std::thread::spawn(move || loop {
        if mode.load(Ordering::SeqCst) == 2 {
            CUTS.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(20));
            mode.store(0, Ordering::SeqCst);
            return;
        }
        if d2.load(Ordering::SeqCst) {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    });
    let r = f();
    done.store(true, Ordering::SeqCst);
    healer.join().unwrap();
    disarm(proxy);
    r
}

/// The same steps on a one-sink `RedisStream` (two handles: process 1 talks through the
/// reply-losing proxy and holds the consumer after a `Reattach(1)`) and a `MemoryStream`: the
/// same publishes refused for room, the same deliveries (position, attempt), the same acked
/// position, counters, watermark and idleness after every step.
fn run_against_memory(url: &str, proxy: &ReplyLosingProxy, steps: &[Step]) -> Result<(), TestCaseError> {
    use lanestream::{Delivery, MemoryStream};
    let (name, _cleanup, mut admin) = setup(url);
    let cap = 3usize;
    let build = |u: &str| RedisStream::builder(u, &name).capacity(cap).sinks(["search"]).build().unwrap();
    let mut rs = [build(url), build(&proxy.url)];
    let mem = MemoryStream::builder().capacity(cap).sinks(["search"]).build().unwrap();
    let mut rp = rs[0].fanout().unwrap();
    let mut producer_at = 0usize;
    let mut mp = mem.fanout().unwrap();
    let mut rc = rs[1].reattach("search").unwrap();
    let mut mc = mem.reattach("search").unwrap();
    let mut rheld: Vec<RedisDelivery<LaneItem>> = Vec::new();
    let mut mheld: Vec<Delivery<LaneItem>> = Vec::new();
    let mut stale: Vec<RedisDelivery<LaneItem>> = Vec::new();
    let mut next = 1u64;
    for (i, st) in steps.iter().enumerate() {
        match st {
            Step::Publish => {
                let r = rp.try_publish(batch(next));
                let m = mp.try_publish(batch(next));
                match (&r, &m) {
                    (Ok(()), Ok(())) => next += 1,
                    (Err(PublishError::Full(_)), Err(PublishError::Full(_))) => {}
                    _ => prop_assert!(false, "step {i} publish {next}: redis {r:?}, memory {m:?}"),
                }
            }
            Step::Recv | Step::LostRecv => {
                let r = if matches!(st, Step::LostRecv) {
                    with_lost_reply(proxy, || rc.try_recv())
                } else {
                    rc.try_recv()
                };
                let r = match r {
                    Err(TryRecvError::Backend(BackendError::Connection)) => recv_through_backoff(&mut rc),
                    r => r,
                };
                let m = mc.try_recv();
                match (r, m) {
                    (Ok(r), Ok(m)) => {
                        prop_assert_eq!(
                            (pos(&r), r.attempt()),
                            (m.position().unwrap().0, m.attempt()),
                            "step {} {:?}",
                            i,
                            st
                        );
                        rheld.push(r);
                        mheld.push(m);
                    }
                    (Err(TryRecvError::Empty), Err(TryRecvError::Empty)) => {}
                    (r, m) => prop_assert!(
                        false,
                        "step {i} {st:?}: redis {:?}, memory {:?}",
                        r.map(|d| (pos(&d), d.attempt())),
                        m.map(|d| (d.position(), d.attempt()))
                    ),
                }
            }
            Step::Ack(k) | Step::Nack(k) | Step::Drop(k) | Step::LostAck(k) if !rheld.is_empty() => {
                let j = k % rheld.len();
                let (r, m) = (rheld.remove(j), mheld.remove(j));
                match st {
                    Step::Ack(_) => {
                        let a = r.ack();
                        prop_assert!(a.is_ok(), "step {}: {:?}", i, a);
                        m.ack().unwrap();
                    }
                    Step::LostAck(_) => {
                        let a = with_lost_reply(proxy, || r.ack());
                        prop_assert!(a.is_ok(), "step {}: a lost ack reply, retried: {:?}", i, a);
                        m.ack().unwrap();
                    }
                    Step::Nack(_) => {
                        r.nack();
                        m.nack();
                    }
                    _ => drop((r, m)),
                }
            }
            Step::StaleAck(k) if !stale.is_empty() => {
                let d = stale.remove(k % stale.len());
                let a = d.ack();
                prop_assert!(matches!(a, Err(AckError::Detached)), "step {}: a stale ack: {:?}", i, a);
            }
            Step::Reattach(h) => {
                stale.append(&mut rheld);
                mheld.clear(); // stale in memory: dropped (they would pin slots there)
                rc = rs[*h].reattach("search").unwrap();
                mc = mem.reattach("search").unwrap();
            }
            Step::Reclaim => {
                free_producer_claim(&mut admin, &name);
                producer_at = 1 - producer_at;
                let mut zombie = std::mem::replace(&mut rp, rs[producer_at].fanout().unwrap());
                let z = zombie.try_publish(batch(next));
                prop_assert!(is_fenced(&z), "step {}: the zombie producer: {:?}", i, z);
                std::mem::forget(zombie); // its drop would not free the new claim anyway
                drop(mp);
                mp = mem.fanout().unwrap();
            }
            Step::Restart => {
                for d in rheld.drain(..).chain(stale.drain(..)) {
                    std::mem::forget(d);
                }
                std::mem::forget(rp);
                std::mem::forget(rc);
                // Rebuilt before the old connections are killed: the new handles' first
                // connections die too, and they reconnect.
                rs = [build(url), build(&proxy.url)];
                kill_connections(&mut admin, &name);
                rp = rs[0].fanout().unwrap();
                producer_at = 0;
                rc = rs[1].attach("search").unwrap();
                mheld.clear();
                mc = mem.reattach("search").unwrap();
            }
            _ => {}
        }
        let (r, m) = (rs[0].stats("search").unwrap(), mem.stats("search").unwrap());
        prop_assert_eq!(
            (r.published, r.acked_items, r.acked, r.last_published),
            (m.published, m.acked_items, m.acked, m.last_published),
            "step {} {:?}",
            i,
            st
        );
        prop_assert_eq!(rs[1].acked("search").unwrap(), mem.acked("search").unwrap());
        prop_assert_eq!(rs[i % 2].watermark(), mem.watermark());
        prop_assert_eq!(rs[0].try_is_idle().unwrap(), mem.is_idle(), "step {} {:?}", i, st);
    }
    // Drain: both hand out the same rest, then both are idle.
    for (r, m) in rheld.drain(..).zip(mheld.drain(..)) {
        r.ack().unwrap();
        m.ack().unwrap();
    }
    loop {
        match (rc.try_recv(), mc.try_recv()) {
            (Ok(r), Ok(m)) => {
                prop_assert_eq!((pos(&r), r.attempt()), (m.position().unwrap().0, m.attempt()));
                r.ack().unwrap();
                m.ack().unwrap();
            }
            (Err(TryRecvError::Empty), Err(TryRecvError::Empty)) => break,
            (r, m) => prop_assert!(
                false,
                "drain: redis {:?}, memory {:?}",
                r.map(|d| pos(&d)),
                m.map(|d| d.position())
            ),
        }
    }
    prop_assert!(rs[0].try_is_idle().unwrap() && mem.is_idle());
    prop_assert_eq!(rs[0].acked("search").unwrap(), (next > 1).then_some(Position(next - 1)));
    for d in stale {
        std::mem::forget(d);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, max_shrink_iters: 200, ..ProptestConfig::default() })]
    #[test]
    fn the_lone_lanes_plain_path_matches_the_memory_backend(steps in proptest::collection::vec(step(), 1..50)) {
        let Some(url) = url() else { return Ok(()) };
        let Some(proxy) = ReplyLosingProxy::start(&url) else {
            eprintln!("the server is not on a unix socket: this test needs one");
            return Ok(());
        };
        run_against_memory(&url, &proxy, &steps)?;
        eprintln!("replies lost so far: {}", CUTS.load(Ordering::Relaxed));
    }
}

/// A plain publish whose reply is lost while another process claims the producer: the entry
/// landed (the claim counts it), the old producer's retry is fenced, and the new producer goes
/// on right after it: no gap, no duplicate.
#[test]
fn a_plain_publish_whose_reply_was_lost_during_a_reclaim_is_counted_and_fenced() {
    let url = server!();
    let Some(proxy) = ReplyLosingProxy::start(&url) else {
        eprintln!("the server is not on a unix socket: this test needs one");
        return;
    };
    let (name, _cleanup, mut admin) = setup(&url);
    let s1 = RedisStream::builder(&proxy.url, &name).capacity(64).sinks(["search"]).build().unwrap();
    let mut old = s1.fanout().unwrap();
    publish_all(&mut old, 1..=5); // 2..=5 plain, on known room
    proxy.mode.store(1, Ordering::SeqCst);
    let (u, n) = (url.clone(), name.clone());
    let healer = heal_after_cut(&proxy, move || {
        let mut admin = redis::Client::open(u.as_str()).unwrap().get_connection().unwrap();
        free_producer_claim(&mut admin, &n);
        let s2 = open(&u, &n, 64);
        let mut live = s2.fanout().unwrap();
        live.publish(batch(7)).unwrap();
        (s2, live)
    });
    let lost = old.publish(batch(6));
    let (s2, mut live) = healer.join().unwrap();
    assert!(
        matches!(
            lost,
            Err(PublishError::Backend { error: BackendError::Fenced | BackendError::Connection, .. })
        ),
        "{lost:?}"
    );
    assert!(is_fenced(&old.try_publish(batch(8))), "the old producer stays fenced");
    live.publish(batch(8)).unwrap();
    assert_eq!(log_ids(&mut admin, &name), (1..=8).collect::<Vec<_>>());
    let mut c = s2.reattach("search").unwrap();
    assert_eq!(drain_ack(&mut c), (1..=8).map(|k| (k, 1)).collect::<Vec<_>>());
}

/// A zombie consumer receiving on the plain path (delivery-log record + `XRANGE`) while another
/// process re-attaches: every entry the zombie got comes back to the new consumer as attempt 2,
/// every other one as attempt 1; none is lost, none comes twice.
#[test]
fn plain_receives_racing_a_reattach_by_another_process_hand_back_exactly_what_was_received() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url);
    let s1 = open(&url, &name, 256);
    let s2 = open(&url, &name, 256);
    let mut p = s1.fanout().unwrap();
    let per = 40u64;
    let mut partial = 0;
    for round in 0..10u64 {
        let base = round * per;
        publish_all(&mut p, base + 1..=base + per);
        let mut old = s1.reattach("search").unwrap();
        let first = old.try_recv().unwrap(); // the script: the rest go through the delivery log
        let barrier = Arc::new(Barrier::new(2));
        let b2 = barrier.clone();
        let t = std::thread::spawn(move || {
            let mut got = vec![pos(&first)];
            let mut keep = vec![first];
            b2.wait();
            loop {
                match old.try_recv() {
                    Ok(d) => {
                        assert_eq!(d.attempt(), 1);
                        got.push(pos(&d));
                        keep.push(d);
                    }
                    Err(TryRecvError::Detached | TryRecvError::Empty) => break,
                    Err(e) => panic!("{e:?}"),
                }
            }
            std::mem::forget(keep);
            got
        });
        barrier.wait();
        std::thread::sleep(Duration::from_micros(200 * round));
        let mut new = s2.reattach("search").unwrap();
        let got = t.join().unwrap();
        let back = drain_ack(&mut new);
        let want: Vec<(u64, u32)> =
            (base + 1..=base + per).map(|k| (k, if got.contains(&k) { 2 } else { 1 })).collect();
        assert_eq!(back, want, "round {round}: the zombie got {got:?}");
        partial += usize::from(got.len() > 1 && got.len() < per as usize);
        let st = s1.stats("search").unwrap();
        assert_eq!((st.published, st.acked_items, st.in_flight), (base + per, base + per, 0), "{st:?}");
    }
    eprintln!("rounds where the re-attach cut into the zombie's receives: {partial}");
}

/// Items without a position between positioned ones on the plain path: the publish log's fold
/// keeps the last *positioned* item as `last_published`, the ack log's fold the last positioned
/// acked one as the acked position (its fast path needs a position on its newest record), also
/// across a restart; the memory backend agrees at every step.
#[test]
fn unpositioned_items_on_the_plain_path_keep_the_positions_of_the_last_positioned_ones() {
    use lanestream::MemoryStream;
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url);
    let mem = MemoryStream::builder().capacity(16).sinks(["search"]).build().unwrap();
    let mut mp = mem.fanout().unwrap();
    let mut mc = mem.reattach("search").unwrap();
    let items = || [batch(1), snapshot(), batch(2), snapshot(), snapshot(), batch(3), snapshot()];
    let check = |s: &RedisStream, what: &str| {
        let (r, m) = (s.stats("search").unwrap(), mem.stats("search").unwrap());
        assert_eq!(
            (r.published, r.acked_items, r.last_published, r.acked),
            (m.published, m.acked_items, m.last_published, m.acked),
            "{what}"
        );
        assert_eq!(s.acked("search").unwrap(), mem.acked("search").unwrap(), "{what}");
        assert_eq!(s.watermark(), mem.watermark(), "{what}");
    };
    {
        let s = open(&url, &name, 16);
        let mut p = s.fanout().unwrap();
        let mut c = s.reattach("search").unwrap();
        for (k, (a, b)) in items().into_iter().zip(items()).enumerate() {
            p.publish(a).unwrap();
            mp.publish(b).unwrap();
            check(&s, &format!("publish {k}"));
        }
        // Ack the first five in order (plain XADDs), checking after each (every read folds).
        for k in 0..5 {
            c.try_recv().unwrap().ack().unwrap();
            mc.try_recv().unwrap().ack().unwrap();
            check(&s, &format!("ack {k}"));
        }
        // The sixth (position 3) received, not acked; the process dies.
        std::mem::forget(c.try_recv().unwrap());
        drop(mc.try_recv().unwrap()); // released in memory; taken back by the attach in Redis
        std::mem::forget((c, p));
        drop(s);
        kill_connections(&mut admin, &name);
    }
    let s = open(&url, &name, 16);
    check(&s, "after the restart");
    let mut p = s.fanout().unwrap();
    let mut c = s.attach("search").unwrap();
    p.publish(snapshot()).unwrap();
    mp.publish(snapshot()).unwrap();
    check(&s, "a snapshot published after the restart");
    let r = p.try_publish(batch(3));
    assert!(matches!(r, Err(PublishError::PositionRegressed { .. })), "L4 across the restart: {r:?}");
    loop {
        match (c.try_recv(), mc.try_recv()) {
            (Ok(r), Ok(m)) => {
                assert_eq!((r.position(), r.attempt()), (m.position(), m.attempt()));
                r.ack().unwrap();
                m.ack().unwrap();
                check(&s, "drain");
            }
            (Err(TryRecvError::Empty), Err(TryRecvError::Empty)) => break,
            (r, m) => panic!("{:?} {:?}", r.map(|d| d.position()), m.map(|d| d.position())),
        }
    }
    assert_eq!(s.acked("search").unwrap(), Some(Position(3)));
}

/// `RedisStream::delete` under a live producer that knows it has room: "ends still alive get
/// errors or empty lanes afterwards". Its next plain `MULTI` must not bring the deleted stream
/// back (a log entry and a publish-log record on keys that no longer exist are simply created
/// by `XADD`), and a stream built again under that name must start empty.
#[test]
fn a_plain_publish_after_delete_does_not_resurrect_the_stream() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url);
    let s1 = open(&url, &name, 64);
    let mut p = s1.fanout().unwrap();
    publish_all(&mut p, 1..=3); // 2 and 3 plain, on known room
    s1.delete().unwrap();
    assert!(redis_support::keys_of(&mut admin, &name).unwrap().is_empty());
    let after = p.try_publish(batch(4));
    let left = redis_support::keys_of(&mut admin, &name).unwrap();
    let s2 = open(&url, &name, 64);
    let st = s2.stats("search").unwrap();
    let mut c = s2.reattach("search").unwrap();
    let got = c.try_recv().map(|d| pos(&d));
    assert!(
        left.is_empty() && st.published == 0 && matches!(got, Err(TryRecvError::Empty)),
        "the deleted stream's producer published {after:?} and left keys {left:?}; the stream built \
         again counts {} published and delivers {got:?} ({:?})",
        st.published,
        s2.last_error()
    );
}

/// `RedisStream::delete` under a live consumer, then the stream built again under the same name:
/// the old consumer's plain acks (`XADD B:al <epoch>-<n>`) must not ack the new stream's entries.
/// The new stream's first consumer gets epoch 1 again, as the old one had, and the ack log's
/// fence is `1-0`, so the old consumer's `1-<n>` lands and counts.
#[test]
fn plain_acks_of_a_deleted_streams_consumer_do_not_ack_the_stream_built_again() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url);
    let s1 = open(&url, &name, 64);
    let mut p1 = s1.fanout().unwrap();
    publish_all(&mut p1, 1..=5);
    let mut c1 = s1.reattach("search").unwrap();
    let held = hold(&mut c1, 5);
    s1.delete().unwrap();
    drop(p1);
    let s2 = open(&url, &name, 64);
    let mut p2 = s2.fanout().unwrap();
    publish_all(&mut p2, 1..=5);
    let mut c2 = s2.reattach("search").unwrap();
    let late: Vec<_> = held.into_values().map(|d| d.ack()).collect();
    assert_eq!(
        s2.acked("search").unwrap(),
        None,
        "the new stream's consumer acked nothing; the deleted stream's consumer's acks gave {late:?}"
    );
    assert_eq!(drain_ack(&mut c2), (1..=5).map(|k| (k, 1)).collect::<Vec<_>>());
}

/// As above, for the delivery log: the deleted stream's consumer's plain receive (`XADD B:dl
/// 1-<n>`, above the new stream's fence `1-0`) must not move the new stream's read position.
#[test]
fn plain_receives_of_a_deleted_streams_consumer_do_not_move_the_stream_built_again() {
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url);
    let s1 = open(&url, &name, 64);
    let mut p1 = s1.fanout().unwrap();
    publish_all(&mut p1, 1..=5);
    let mut c1 = s1.reattach("search").unwrap();
    let held = hold(&mut c1, 2); // entry 3 expected next, on the plain path
    s1.delete().unwrap();
    drop(p1);
    let s2 = open(&url, &name, 64);
    let mut p2 = s2.fanout().unwrap();
    publish_all(&mut p2, 1..=5);
    let mut c2 = s2.reattach("search").unwrap();
    let late = c1.try_recv().map(|d| pos(&d));
    std::mem::forget(held);
    let got = drain_ack(&mut c2);
    assert_eq!(got, (1..=5).map(|k| (k, 1)).collect::<Vec<_>>(), "the old consumer's late receive: {late:?}");
}

/// The plain path's logs stay small in a steady state where the consumer is always behind (it
/// never finds the lane empty, so its receives never run the script): every record is folded
/// and trimmed by some script within a bounded number of operations, or Redis memory grows
/// with every delivery for as long as the backlog lasts (a backfill of millions of batches).
#[test]
fn the_plain_paths_logs_stay_bounded_while_the_consumer_is_always_behind() {
    let url = server!();
    let (name, _cleanup, mut admin) = setup(&url);
    let s = open(&url, &name, 8);
    let mut p = s.fanout().unwrap();
    let mut c = s.reattach("search").unwrap();
    publish_all(&mut p, 1..=8);
    for k in 1..=2000u64 {
        let d = c.try_recv().unwrap();
        assert_eq!(pos(&d), k);
        d.ack().unwrap();
        p.publish(batch(k + 8)).unwrap();
    }
    let len = |admin: &mut redis::Connection, log: &str| -> usize {
        redis::cmd("XLEN").arg(format!("{}:{log}", lane_key(&name))).query(admin).unwrap()
    };
    // The log is the publish record (no publish log any more): it is trimmed below the acked
    // prefix every 64th entry.
    let (al, dl, log) = (len(&mut admin, "al"), len(&mut admin, "dl"), log_len(&mut admin, &name));
    assert!(al <= 64 + 8 && log <= 64 + 8, "ack log {al} records, log {log} entries");
    assert!(dl <= 64 + 8, "delivery log: {dl} records after 2000 deliveries");
}

/// The wake-ups of the plain path: a publisher waiting on a full lane is rung by a plain ack
/// (`HGET pw` beside the `XADD B:al`), a consumer waiting on an empty lane by a plain publish
/// (`HMGET w ep` inside the `MULTI`). A missed ring shows as a wait of a whole wait slice
/// (500 ms) before the waiter looks again.
#[test]
fn plain_acks_and_publishes_ring_their_waiters_without_a_wait_slice() {
    use std::time::Instant;
    let url = server!();
    let (name, _cleanup, _admin) = setup(&url);
    let s = open(&url, &name, 2);
    let mut p = s.fanout().unwrap();
    let mut c = s.reattach("search").unwrap();
    let rounds = 12u64;
    let mut publisher_waits = Vec::new();
    let mut consumer_waits = Vec::new();
    let mut k = 0u64;
    for _ in 0..rounds {
        // The publisher waits on a full lane (two unacked); a plain ack frees it.
        publish_all(&mut p, k + 1..=k + 2);
        let extra = k + 3;
        k += 3;
        let t = std::thread::spawn(move || {
            p.publish(batch(extra)).unwrap_or_else(|e| panic!("{e:?}"));
            (p, Instant::now())
        });
        std::thread::sleep(Duration::from_millis(30));
        let d = c.try_recv().unwrap();
        let acked = Instant::now();
        d.ack().unwrap();
        let (back, woke) = t.join().unwrap();
        p = back;
        publisher_waits.push(woke.saturating_duration_since(acked));
        // Drain (the one left, and the extra) so that the consumer then waits on an empty lane.
        for _ in 0..2 {
            c.try_recv().unwrap().ack().unwrap();
        }
        let t = std::thread::spawn(move || {
            let d = c.recv().unwrap().unwrap();
            let woke = Instant::now();
            d.ack().unwrap();
            (c, woke)
        });
        std::thread::sleep(Duration::from_millis(30));
        let published = Instant::now();
        k += 1;
        p.publish(batch(k)).unwrap();
        let (back, woke) = t.join().unwrap();
        c = back;
        consumer_waits.push(woke.saturating_duration_since(published));
    }
    let slow = |w: &[Duration]| w.iter().filter(|d| **d >= Duration::from_millis(400)).count();
    eprintln!("publisher woken after {publisher_waits:?}\nconsumer woken after {consumer_waits:?}");
    assert_eq!(slow(&publisher_waits), 0, "publishers waited out a slice: {publisher_waits:?}");
    assert_eq!(slow(&consumer_waits), 0, "consumers waited out a slice: {consumer_waits:?}");
}
