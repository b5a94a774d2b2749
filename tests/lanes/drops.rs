//! M3: every item is dropped exactly once — by the producer's (the fan-out's) next publish after
//! its final ack, or the producer's drop, or when the last handle on its lane goes (stream dropped
//! with items queued, delivered, released or acked out of order), also after a re-attach and after
//! a panic in an item's `Drop`.
//!
//! Generic lanes ([`Lane::standalone`]) carry [`Counted`] items, each with its own drop counter;
//! stream lanes carry [`LaneItem`]s whose shared envelopes' `Arc::strong_count` counts live copies.

use crate::common;
use lanestream::prelude::*;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{bomb, counted_lane as lane, counters, shared_envelopes, stream, tracked, Counted};
use lanestream::{Envelope, Position, Stream};

struct Counter {
    drops: Arc<Vec<AtomicUsize>>,
}

impl Counter {
    fn new(n: usize) -> Counter {
        Counter { drops: counters(n) }
    }

    fn item(&self, id: usize) -> Counted {
        Counted::new(id, &self.drops)
    }

    fn panicking(&self, id: usize) -> Counted {
        let mut item = Counted::new(id, &self.drops);
        item.panics = true;
        item
    }

    fn get(&self, id: usize) -> usize {
        self.drops[id].load(Ordering::SeqCst)
    }

    fn all(&self) -> Vec<usize> {
        self.drops.iter().map(|d| d.load(Ordering::SeqCst)).collect()
    }
}

#[test]
fn m3_each_item_dropped_once_by_the_publish_after_its_final_ack_and_not_before() {
    for cap in [1, 2, 3, 5, 7] {
        let n = 20 * cap + 3;
        let counter = Counter::new(n);
        let lane = lane(cap);
        let (mut p, mut c) = (lane.producer().unwrap(), lane.reattach());
        let mut id = 0;
        let mut acked = 0..0;
        while id < n {
            let fill = (n - id).min(cap);
            for k in 0..fill {
                p.try_publish(counter.item(id + k)).unwrap();
                if k == 0 {
                    let dropped = acked.clone().all(|i| counter.get(i) == 1);
                    assert!(dropped, "capacity {cap}: not dropped by the next publish: {:?}", counter.all());
                }
            }
            let mut held = Vec::new();
            for k in 0..fill {
                let d = c.try_recv().unwrap();
                if k % 2 == 0 {
                    d.nack(); // released, redelivered: not dropped
                    held.push(c.try_recv().unwrap());
                } else {
                    held.push(d);
                }
                assert_eq!(counter.get(id + k), 0, "capacity {cap}: dropped before its ack");
            }
            // Ack back to front: nothing is dropped until the prefix completes, then all at once.
            let first = held.remove(0);
            for d in held.into_iter().rev() {
                d.ack().unwrap();
            }
            assert!((id..id + fill).all(|i| counter.get(i) == 0), "capacity {cap}: dropped out of prefix");
            first.ack().unwrap();
            let kept = (id..id + fill).all(|i| counter.get(i) == 0);
            assert!(kept, "capacity {cap}: dropped before the next publish: {:?}", counter.all());
            acked = id..id + fill;
            id += fill;
        }
        drop(p);
        assert!(
            acked.clone().all(|i| counter.get(i) == 1),
            "capacity {cap}: the producer's drop drops the last"
        );
        drop((c, lane));
        assert!(counter.all().iter().all(|&d| d == 1), "capacity {cap}: {:?}", counter.all());
    }
}

#[test]
fn m3_lane_drop_drops_queued_delivered_released_and_out_of_order_acked_items_once() {
    let counter = Counter::new(7);
    let lane = lane(7);
    let (mut p, mut c) = (lane.producer().unwrap(), lane.reattach());
    for id in 0..7 {
        p.publish(counter.item(id)).unwrap();
    }
    let d0 = c.try_recv().unwrap(); // delivered, held
    let d1 = c.try_recv().unwrap();
    d1.ack().unwrap(); // acked out of order: stays in its slot
    c.try_recv().unwrap().nack(); // item 2 released
    let (h3, h4) = (c.try_recv().unwrap().into_handle(), c.try_recv().unwrap());
    // items 5, 6 queued
    assert_eq!(counter.all(), [0; 7]);
    drop((p, c, lane));
    assert_eq!(counter.all(), [0; 7], "live handles keep the lane");
    drop(h3);
    drop(d0);
    assert_eq!(counter.all(), [0; 7]);
    drop(h4);
    assert_eq!(counter.all(), [1; 7]);
}

#[test]
fn m3_items_dropped_once_across_reattach_with_stale_handles() {
    let counter = Counter::new(5);
    let lane = lane(3);
    let mut p = lane.producer().unwrap();
    for id in 0..3 {
        p.publish(counter.item(id)).unwrap();
    }
    let mut c1 = lane.reattach();
    let stale: Vec<_> = (0..3).map(|_| c1.try_recv().unwrap()).collect();
    let mut c2 = lane.reattach();
    let fresh: Vec<_> = (0..3).map(|_| c2.try_recv().unwrap()).collect();
    assert!(fresh.iter().all(|d| d.attempt() == 2));
    for d in fresh {
        d.ack().unwrap();
    }
    assert_eq!(counter.all(), [0; 5], "the stale deliveries still read the items");
    let mut stale = stale.into_iter();
    assert!(stale.next().unwrap().ack().is_err());
    assert_eq!(counter.all(), [0; 5], "item 0 is freed: dropped by the next publish");
    p.publish(counter.item(3)).unwrap();
    assert_eq!(counter.all(), [1, 0, 0, 0, 0]);
    drop(stale);
    assert_eq!(counter.all(), [1, 0, 0, 0, 0]);
    p.publish(counter.item(4)).unwrap();
    assert_eq!(counter.all(), [1, 1, 1, 0, 0]);
    let mut c3 = lane.reattach();
    let _stale = c2.try_recv(); // detached: nothing
    c3.try_recv().unwrap().ack().unwrap();
    assert_eq!(counter.all(), [1, 1, 1, 0, 0]);
    drop(p);
    assert_eq!(counter.all(), [1, 1, 1, 1, 0], "the producer's drop dropped the freed item 3");
    drop((c1, c2, c3, lane));
    assert_eq!(counter.all(), [1; 5]);
}

#[test]
fn m3_a_panicking_drop_at_the_next_publish_is_resumed_after_the_publish() {
    let counter = Counter::new(4);
    let lane = lane(2);
    let (mut p, mut c) = (lane.producer().unwrap(), lane.reattach());
    p.publish(counter.item(0)).unwrap();
    p.publish(counter.panicking(1)).unwrap();
    let d0 = c.try_recv().unwrap();
    c.try_recv().unwrap().ack().unwrap(); // out of order: nothing dropped yet
                                          // This ack completes the prefix 0, 1: the acker drops nothing.
    d0.ack().unwrap();
    assert_eq!(counter.all(), [0; 4]);
    assert_eq!(lane.acked(), Some(Position(2)));
    assert!(lane.is_idle());
    // The next publish drops items 0 and 1: item 1's Drop panics in the publishing thread.
    let r = catch_unwind(AssertUnwindSafe(|| p.publish(counter.item(2))));
    assert!(r.is_err(), "the panic is resumed to the publisher");
    assert_eq!(counter.all(), [1, 1, 0, 0]);
    assert_eq!(lane.stats().published, 3, "the publish was done before the panic surfaced");
    // The lane keeps working.
    p.publish(counter.item(3)).unwrap();
    c.try_recv().unwrap().ack().unwrap();
    c.try_recv().unwrap().ack().unwrap();
    assert_eq!(lane.acked(), Some(Position(4)));
    drop(p);
    assert_eq!(counter.all(), [1; 4]);
}

#[test]
fn m3_a_panicking_drop_on_lane_drop_still_drops_every_other_item_once() {
    let counter = Counter::new(5);
    let lane = lane(5);
    let (mut p, mut c) = (lane.producer().unwrap(), lane.reattach());
    for id in 0..5 {
        let item = if id == 2 { counter.panicking(id) } else { counter.item(id) };
        p.publish(item).unwrap();
    }
    c.try_recv().unwrap().nack();
    let held = c.try_recv().unwrap();
    drop((p, c, lane));
    let r = catch_unwind(AssertUnwindSafe(move || drop(held)));
    assert!(r.is_err(), "the last handle's drop drops the ring, which resumes the panic");
    assert_eq!(counter.all(), [1; 5]);
}

#[test]
fn m3_stream_drop_releases_every_copy_of_every_shared_batch() {
    let envs: Vec<Arc<[Envelope]>> = (0..6).map(shared_envelopes).collect();
    let s = stream(7, &["a", "b", "c"]);
    let lanes: Vec<_> = s.lanes().collect();
    let mut p = s.fanout().unwrap();
    for (i, env) in envs.iter().enumerate() {
        p.publish(tracked(Some(i as u64 + 1), env)).unwrap();
    }
    assert!(envs.iter().all(|e| Arc::strong_count(e) == 2), "one copy for every lane, and ours");
    // Lane a: all acked. Lane b: some delivered and released, split items kept. Lane c: queued.
    let mut ca = lanes[0].reattach();
    while let Ok(d) = ca.try_recv() {
        d.ack().unwrap();
    }
    let mut cb = lanes[1].reattach();
    let (item, handle) = cb.try_recv().unwrap().into_parts();
    cb.try_recv().unwrap().nack();
    let held = cb.try_recv().unwrap();
    assert_eq!(Arc::strong_count(&envs[0]), 3, "the stream's copy, the split-off clone, ours");
    assert!(envs[1..].iter().all(|e| Arc::strong_count(e) == 2), "lane a's acks drop nothing");
    drop(item); // the split-off clone
    assert_eq!(Arc::strong_count(&envs[0]), 2);
    drop((s, p, ca, cb, lanes));
    assert!(envs.iter().all(|e| Arc::strong_count(e) == 2), "the cells live on through lane b's handles");
    drop(handle);
    drop(held);
    let counts: Vec<_> = envs.iter().map(Arc::strong_count).collect();
    assert_eq!(counts, [1; 6], "every copy dropped exactly once");
}

#[test]
fn m3_stream_drop_survives_a_lane_item_whose_drop_panics() {
    let dropped = Arc::new(AtomicUsize::new(0));
    let bomb = bomb(2, "a document owner panics in Drop (on purpose)", &dropped);
    let envs: Vec<Arc<[Envelope]>> = (0..4).map(shared_envelopes).collect();
    let s = stream(6, &["a"]);
    let lane = s.lane("a").unwrap();
    let mut p = s.fanout().unwrap();
    p.publish(tracked(Some(1), &envs[0])).unwrap();
    p.publish(bomb).unwrap();
    for (i, env) in envs.iter().enumerate().skip(1) {
        p.publish(tracked(Some(i as u64 + 2), env)).unwrap();
    }
    let mut c = lane.reattach();
    c.try_recv().unwrap().ack().unwrap();
    let r = catch_unwind(AssertUnwindSafe(move || drop((s, p, c, lane))));
    assert!(r.is_err(), "the panic of the bomb's Drop is resumed");
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    assert!(envs.iter().all(|e| Arc::strong_count(e) == 1), "the rest still dropped once");
}
