//! The one array of cells every lane of a stream reads (published to by its one fan-out) and the
//! seat-held run ack, attacked.
//!
//! Items here carry a canary (`shared_model::Tracker`, `shared_model::Canary`): one envelope
//! whose document counts its drops in a tracker (and panics when dropped, if told to). The test
//! never keeps a clone of a published item, so the canary drops exactly when the stream's last
//! copy does: the count is the item's drop count ([M3]), and a handle that reads an item whose
//! count is not 0 read it after it was dropped. The random-sequence model (`shared_model`) is
//! shared with the `shared_ring_ops` fuzz target and its corpus replay.
//!
//! [M3]: lanestream::contract#m3

use crate::{common, shared_model};
use lanestream::prelude::*;

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use common::{batch, run_positions, within};
use lanestream::{
    AckError, Batch, Envelope, LaneItem, Position, PublishError, Run, Stream, TryRecvError, MAX_RUN,
};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use shared_model::{read_alive, shared, shared_ops, SOp, Tracker};

// ----- M2/M3: one copy per item, dropped once, never while readable ----------------------------------

/// The stream holds one copy of an item for every lane (the strong count of its envelopes is the
/// caller's plus one); the copy outlives every lane's ack and goes at the fan-out's next publish,
/// only once every lane freed it; `memory()` counts it until then.
#[test]
fn shared_m2_one_copy_per_item_for_every_lane_until_the_publish_after_every_lane_freed_it() {
    let envelopes: Arc<[Envelope]> = vec![common::envelope("docs", "1", Some(1), b"{}")].into();
    let item = LaneItem::Batch(Batch::new(Some(Position(1)), envelopes.clone()));
    let s = shared(4, &["a", "b", "c"]);
    let mut fanout = s.fanout().unwrap();
    let mut consumers: Vec<_> = s.lanes().map(|l| l.attach().unwrap()).collect();
    fanout.publish(item.clone()).unwrap();
    // `envelopes` and `item` are ours.
    assert_eq!(Arc::strong_count(&envelopes), 3, "one copy for the three lanes");
    let deliveries: Vec<_> = consumers.iter_mut().map(|c| c.try_recv().unwrap()).collect();
    assert_eq!(Arc::strong_count(&envelopes), 3, "receiving copies nothing");
    let mut deliveries = deliveries.into_iter();
    deliveries.next().unwrap().ack().unwrap();
    deliveries.next().unwrap().ack().unwrap();
    fanout.publish(batch(2)).unwrap();
    // One lane still reads it: the publish must keep it.
    assert_eq!(Arc::strong_count(&envelopes), 3);
    deliveries.next().unwrap().ack().unwrap();
    // Acked everywhere, but the cell still holds it until the next publish.
    assert_eq!(Arc::strong_count(&envelopes), 3);
    assert_eq!(s.memory().held_items, 2);
    fanout.publish(batch(3)).unwrap();
    assert_eq!(Arc::strong_count(&envelopes), 2, "dropped by the publish");
    fanout.publish(batch(4)).unwrap();
    assert_eq!(Arc::strong_count(&envelopes), 2, "a second publish drops nothing more");
    assert_eq!(s.memory().held_items, 3);
    for c in &mut consumers {
        c.try_recv_run(8).unwrap().ack().unwrap();
    }
    assert!(s.is_idle());
}

/// M3, item by item: over many laps of an array of 1, 2, 3 and 5 cells and
/// three lanes acking in different orders (one lane always lagging by a full ring), an item is
/// dropped exactly at the fan-out's first publish after the last lane acked it (never while any
/// lane reads it: every read checks its canary), the rest at the fan-out's drop, and nothing
/// twice when the stream goes.
#[test]
fn shared_m3_each_item_dropped_once_at_the_publish_after_its_last_ack_never_while_read() {
    for cap in [1u64, 2, 3, 5] {
        let n = 12 * cap + 1;
        let t = Tracker::new(n as usize + 1);
        let s = shared(cap as usize, &["fast", "mid", "slow"]);
        let mut fanout = s.fanout().unwrap();
        let mut cs: Vec<_> = s.lanes().map(|l| l.attach().unwrap()).collect();
        let mut slow_held: Vec<lanestream::Delivery<LaneItem>> = Vec::new();
        for p in 1..=n {
            // Room: the slow lane holds `cap` deliveries; publishing now must be refused and drop
            // nothing.
            if slow_held.len() as u64 == cap {
                let before: Vec<usize> = (1..p).map(|q| t.drops(q)).collect();
                assert!(matches!(fanout.try_publish(t.item(p)), Err(PublishError::Full(_))));
                assert_eq!(t.drops(p), 1, "the refused item is handed back (and dropped by us)");
                t.drops[p as usize].store(0, Ordering::SeqCst);
                assert_eq!(before, (1..p).map(|q| t.drops(q)).collect::<Vec<_>>(), "Full dropped something");
                // The slow lane acks in reverse order.
                for d in slow_held.drain(..).rev() {
                    read_alive(&t, &d);
                    d.ack().unwrap();
                }
            }
            fanout.try_publish(t.item(p)).unwrap();
            // The slow lane acked items up to the last multiple of `cap` below `p`, before this
            // publish: dropped now, once; none later.
            for q in 1..=p {
                let want = usize::from(q <= cap * ((p - 1) / cap));
                assert_eq!(t.drops(q), want, "cap {cap}: item {q} after publishing {p}");
            }
            // fast: receives and acks at once; mid: run of what is there, acked cumulatively.
            let d = cs[0].try_recv().unwrap();
            assert_eq!(read_alive(&t, &d), p);
            d.ack().unwrap();
            let mut run = cs[1].try_recv_run(MAX_RUN).unwrap();
            let ps: Vec<u64> = run.iter().map(|it| read_alive(&t, it)).collect();
            assert_eq!(ps, [p]);
            assert_eq!(run.ack_through(run.sequences().start), Ok(1));
            let d = cs[2].try_recv().unwrap();
            assert_eq!(read_alive(&t, &d), p);
            slow_held.push(d);
        }
        for d in slow_held.drain(..) {
            read_alive(&t, &d);
            d.ack().unwrap();
        }
        assert_eq!(s.watermark(), Some(Position(n)));
        // The last item is acked everywhere, still in its cell (n - 1 is a multiple of `cap`).
        assert_eq!(t.not_dropped(1..=n - 1, 1), vec![]);
        assert_eq!(t.not_dropped(n..=n, 0), vec![]);
        drop(fanout);
        assert_eq!(t.not_dropped(1..=n, 1), vec![], "cap {cap}: after the fan-out's drop");
        drop(cs);
        drop(s);
        assert_eq!(t.not_dropped(1..=n, 1), vec![], "cap {cap}: after the stream went");
    }
}

/// M3 when the stream goes: items queued on every lane, delivered on some, acked on some, a
/// stale delivery alive, a half-way close; the fan-out, the consumers, the lanes and the
/// deliveries dropped in every order: every item dropped exactly once, and only after the last
/// handle that reads it.
#[test]
fn shared_m3_items_in_every_state_are_dropped_once_whatever_goes_last() {
    for order in 0..4 {
        let t = Tracker::new(16);
        let s = shared(6, &["a", "b"]);
        let mut fanout = s.fanout().unwrap();
        for p in 1..=5 {
            fanout.try_publish(t.item(p)).unwrap();
        }
        let lanes: Vec<_> = s.lanes().collect();
        let mut a = lanes[0].attach().unwrap();
        let mut b = lanes[1].attach().unwrap();
        // a: 1 acked, 2 delivered (goes stale on re-attach), 3 released, 4 and 5 queued.
        a.try_recv().unwrap().ack().unwrap();
        let stale = a.try_recv().unwrap();
        a.try_recv().unwrap().nack();
        let detached = std::mem::replace(&mut a, lanes[0].reattach());
        assert!(detached.is_detached());
        drop(detached);
        let again = a.try_recv().unwrap();
        assert_eq!((read_alive(&t, &again), again.attempt()), (2, 2));
        again.ack().unwrap();
        // b: a run of 1..=3, 1 acked.
        let mut run = b.try_recv_run(3).unwrap();
        assert_eq!(run.ack_through(0), Ok(1));
        // Every lane acked item 1; the next publish drops it (nothing else: 2 is read by a stale
        // handle).
        fanout.try_publish(t.item(6)).unwrap();
        assert_eq!(t.not_dropped(1..=1, 1), vec![]);
        assert_eq!(t.not_dropped(2..=6, 0), vec![]);
        let mut held = (Some(fanout), Some(stale), Some(run), Some(a), Some(b), Some(s), Some(lanes));
        let check_alive =
            |t: &Tracker, stale: &Option<lanestream::Delivery<LaneItem>>, run: &Option<Run<LaneItem>>| {
                if let Some(d) = stale {
                    read_alive(t, d);
                }
                if let Some(r) = run {
                    r.iter().for_each(|it| {
                        read_alive(t, it);
                    });
                }
            };
        match order {
            0 => {
                held.0 = None;
                check_alive(&t, &held.1, &held.2);
                held.5 = None;
                held.6 = None;
                check_alive(&t, &held.1, &held.2);
                held.3 = None;
                held.4 = None;
                check_alive(&t, &held.1, &held.2);
                held.1 = None;
                check_alive(&t, &held.1, &held.2);
                held.2 = None;
            }
            1 => {
                held.2 = None;
                held.1 = None;
                held.3 = None;
                held.4 = None;
                held.6 = None;
                held.5 = None;
                held.0 = None;
            }
            2 => {
                // A half-way close, then everything but the stale handle goes first.
                held.5.as_ref().unwrap().lane("b").unwrap().close();
                let r = held.0.as_mut().unwrap().try_publish(t.item(7));
                assert!(matches!(r, Err(PublishError::Closed(_))));
                drop(r);
                assert_eq!(t.drops(7), 1, "refused before anything was written");
                t.drops[7].store(0, Ordering::SeqCst); // the handed-back item, dropped by us
                held.0 = None;
                held.2 = None;
                held.3 = None;
                held.4 = None;
                held.5 = None;
                held.6 = None;
                check_alive(&t, &held.1, &held.2);
                held.1 = None;
            }
            _ => {
                held.6 = None;
                held.5 = None;
                held.4 = None;
                check_alive(&t, &held.1, &held.2);
                held.1 = None;
                held.3 = None;
                check_alive(&t, &held.1, &held.2);
                held.0 = None;
                held.2 = None;
            }
        }
        drop(held);
        assert_eq!(t.not_dropped(1..=6, 1), vec![], "order {order}");
        assert_eq!(t.drops(7), 0, "order {order}: never published");
    }
}

/// A stale handle (a delivery a re-attach took back) pins its item's cell: after the new
/// consumer and every other lane acked it, the fan-out refuses with `Full` rather than write over
/// it, and drops nothing, and the stale handle (a single delivery and a run) still reads the
/// original item. Once the stale handles end, the next publish drops the item, once.
#[test]
fn shared_l8_m3_a_stale_handle_pins_its_cell_for_every_lane() {
    for stale_run in [false, true] {
        let t = Tracker::new(8);
        let s = shared(2, &["a", "b"]);
        let mut fanout = s.fanout().unwrap();
        fanout.try_publish(t.item(1)).unwrap();
        fanout.try_publish(t.item(2)).unwrap();
        let lanes: Vec<_> = s.lanes().collect();
        let mut old = lanes[0].attach().unwrap();
        let (stale_one, stale_many) = if stale_run {
            (None, Some(old.try_recv_run(2).unwrap()))
        } else {
            (Some(old.try_recv().unwrap()), None)
        };
        let mut a = lanes[0].reattach();
        let mut b = lanes[1].attach().unwrap();
        // The new consumer of a gets both again; b gets both; all acked (the seat-held path:
        // a's run must fall back, a stale handle lives).
        let again = a.try_recv_run(2).unwrap();
        assert_eq!((run_positions(&again), again.attempt()), (vec![1], 2));
        again.ack().unwrap();
        let rest = a.try_recv_run(2).unwrap();
        assert_eq!(run_positions(&rest), [2]);
        rest.ack().unwrap();
        b.try_recv_run(2).unwrap().ack().unwrap();
        assert_eq!(s.watermark(), Some(Position(2)), "acked at once, pinned or not (L5)");
        assert_eq!(lanes[0].stats().pinned, 2, "item 1 pinned, item 2 behind it");
        // Item 1's cell is pinned by lane a's stale handle.
        let refused = fanout.try_publish(t.item(3));
        assert!(matches!(refused, Err(PublishError::Full(_))), "{refused:?}");
        drop(refused);
        t.drops[3].store(0, Ordering::SeqCst);
        assert_eq!(t.drops(1), 0, "the refused publish dropped an item a stale handle reads");
        if let Some(d) = &stale_one {
            assert_eq!(read_alive(&t, d), 1);
        }
        if let Some(r) = &stale_many {
            assert_eq!(r.iter().map(|it| read_alive(&t, it)).collect::<Vec<_>>(), [1, 2]);
        }
        // Late acks of the stale handles are refused (L8) and end them.
        match (stale_one, stale_many) {
            (Some(d), None) => assert_eq!(d.ack(), Err(AckError::Detached)),
            (None, Some(r)) => assert_eq!(r.ack(), Err(AckError::Detached)),
            _ => unreachable!(),
        }
        assert_eq!(lanes[0].stats().pinned, 0);
        // Now the cells are free: the next publish drops 1 and 2 and reuses item 1's cell.
        assert_eq!(t.not_dropped(1..=2, 0), vec![], "dropped before the next publish");
        fanout.try_publish(t.item(3)).unwrap();
        assert_eq!(t.not_dropped(1..=2, 1), vec![]);
        fanout.try_publish(t.item(4)).unwrap();
        assert_eq!(t.not_dropped(1..=2, 1), vec![], "dropped items are not dropped again on reuse");
        for c in [&mut a, &mut b] {
            let run = c.try_recv_run(8).unwrap();
            assert_eq!(run.iter().map(|it| read_alive(&t, it)).collect::<Vec<_>>(), [3, 4]);
            run.ack().unwrap();
        }
        drop((fanout, a, b, old, lanes, s));
        assert_eq!(t.not_dropped(1..=4, 1), vec![]);
    }
}

/// The seat-held ack uses per-item compare-and-swaps while a stale handle lives, and plain
/// stores again once it ended: a run acked while a stale handle of *another* item of the
/// lane lives must not overwrite that handle's holder count (the stale handle's end must still
/// free its slot), and acks of runs received before and after the re-attach keep the watermark
/// exact. Checked by the slot being reused (and dropped) exactly when the stale handle ends.
#[test]
fn shared_l8_seat_held_acks_around_a_live_stale_handle_keep_holder_counts() {
    let t = Tracker::new(32);
    let s = shared(4, &["a"]);
    let lane = s.lane("a").unwrap();
    let mut fanout = s.fanout().unwrap();
    for p in 1..=4 {
        fanout.try_publish(t.item(p)).unwrap();
    }
    let mut old = lane.attach().unwrap();
    let stale = old.try_recv().unwrap(); // item 1
    let mut c = lane.reattach();
    // Item 1 again (a run of one, attempt 2), then 2..=4 as one run: both acked while `stale`
    // lives (the ack must not take the plain-store path over item 1's word, which has two
    // holders; and item 2..=4's words have one each).
    let r1 = c.try_recv_run(MAX_RUN).unwrap();
    assert_eq!((run_positions(&r1), r1.attempt()), (vec![1], 2));
    let r2 = c.try_recv_run(MAX_RUN).unwrap();
    assert_eq!(run_positions(&r2), [2, 3, 4]);
    r2.ack().unwrap();
    r1.ack().unwrap();
    assert_eq!(lane.acked(), Some(Position(4)));
    assert_eq!(lane.stats().pinned, 4, "item 1 pinned by the stale handle, 2..=4 behind it");
    assert!(matches!(fanout.try_publish(t.item(5)), Err(PublishError::Full(_))));
    t.drops[5].store(0, Ordering::SeqCst);
    assert_eq!(read_alive(&t, &stale), 1);
    drop(stale); // a nack of a stale handle: ends it, releases nothing
    assert_eq!(lane.stats().pinned, 0, "the stale handle's end freed its slot");
    assert_eq!(lane.stats().released, 0);
    // Seat-held acks from here on (no stale handle): a full lap, in runs acked out of order.
    for p in 5..=8 {
        fanout.try_publish(t.item(p)).unwrap();
    }
    assert_eq!(t.not_dropped(1..=4, 1), vec![]);
    let a = c.try_recv_run(2).unwrap();
    let b = c.try_recv_run(2).unwrap();
    b.ack().unwrap();
    assert_eq!(lane.acked(), Some(Position(4)), "7 and 8 wait for 5 and 6 (L5)");
    a.ack().unwrap();
    assert_eq!(lane.acked(), Some(Position(8)));
    assert!(lane.is_idle());
    assert!(matches!(c.try_recv(), Err(TryRecvError::Empty)));
}

/// A panic in an item's `Drop` while the fan-out's own `Drop` reclaims the cells: the panic
/// reaches the dropper (M3: every item still dropped once), and the stream's producer role is
/// given back all the same, so the stream can be published to again (L9). (Failed before
/// 655b80c: the drop's reclaim panicked before any role was given back: `ProducerBusy` forever.)
#[test]
fn shared_l9_m3_a_panicking_drop_in_the_fanouts_drop_still_gives_every_lane_back() {
    let t = Tracker::new(8);
    let s = shared(4, &["a", "b"]);
    let mut fanout = s.fanout().unwrap();
    fanout.try_publish(t.item(1)).unwrap();
    fanout.try_publish(t.item(2)).unwrap();
    t.set_panics(1);
    for lane in s.lanes() {
        let mut c = lane.attach().unwrap();
        c.try_recv_run(8).unwrap().ack().unwrap();
    }
    let r = catch_unwind(AssertUnwindSafe(move || drop(fanout)));
    assert!(r.is_err(), "the item's Drop panic reaches the dropper");
    assert_eq!(t.not_dropped(1..=2, 1), vec![]);
    let mut again = s.fanout().expect("the dropped fan-out gave every lane's producer role back");
    again.try_publish(t.item(3)).unwrap();
}

/// A panic in the `Drop` of the item whose cell a publish reuses: the panic reaches the
/// publisher, but the fan-out must stay in step with its lanes: the item of that publish either
/// reached every lane or none, and the next publish delivers exactly its own item everywhere
/// (never an item of the panicked call, never into a cell a lane still reads). (Failed before
/// 655b80c: `Cells::write` resumed the panic before any lane was published to, leaving the
/// cells' count ahead of every lane's tail; debug builds then tripped `push`'s assertion, and
/// release builds delivered the panicked call's item in place of the next one and later rewrote,
/// and dropped, a cell a live delivery still read.)
#[test]
fn shared_m3_a_panicking_drop_of_an_overwritten_item_keeps_the_fanout_in_step() {
    let t = Tracker::new(8);
    let s = shared(2, &["a", "b"]);
    let mut fanout = s.fanout().unwrap();
    let mut cs: Vec<_> = s.lanes().map(|l| l.attach().unwrap()).collect();
    fanout.try_publish(t.item(1)).unwrap();
    fanout.try_publish(t.item(2)).unwrap();
    t.set_panics(1);
    for c in &mut cs {
        c.try_recv_run(8).unwrap().ack().unwrap();
    }
    let r = catch_unwind(AssertUnwindSafe(|| fanout.try_publish(t.item(3)).is_ok()));
    assert!(r.is_err(), "item 1's Drop panic reaches the publisher");
    assert_eq!(t.drops(1), 1);
    let r = catch_unwind(AssertUnwindSafe(|| fanout.try_publish(t.item(4)).map_err(|e| format!("{e:?}"))));
    assert!(matches!(r, Ok(Ok(()))), "the next publish after the panic: {:?}", r.map_err(|_| "panicked"));
    let got: Vec<Vec<u64>> = cs
        .iter_mut()
        .map(|c| {
            let mut ps = Vec::new();
            while let Ok(run) = c.try_recv_run(8) {
                ps.extend(run.iter().map(|it| read_alive(&t, it)));
                run.ack().unwrap();
            }
            ps
        })
        .collect();
    assert!(got[0] == [3, 4] || got[0] == [4], "lane a got {:?}", got[0]);
    assert_eq!(got[0], got[1], "every lane or none got item 3");
}

/// Panicking item drops where the stream drops items itself: in a publish (the panic reaches the
/// publisher after every freed item was dropped and the publish was done, and the fan-out stays
/// in step: the freed cells are reused without dropping anything twice) and in the last owner's
/// drop of the cells (every item still in them dropped once, the first panic resumed).
#[test]
fn shared_m3_panicking_drops_in_a_publish_and_in_the_last_owners_drop_drop_every_item_once() {
    let t = Tracker::new(9);
    let s = shared(4, &["a", "b"]);
    let lanes: Vec<_> = s.lanes().collect();
    let mut cs: Vec<_> = lanes.iter().map(|l| l.attach().unwrap()).collect();
    let mut fanout = s.fanout().unwrap();
    for p in 1..=4 {
        fanout.try_publish(t.item(p)).unwrap();
    }
    t.set_panics(2);
    t.set_panics(3);
    for c in &mut cs {
        c.try_recv_run(8).unwrap().ack().unwrap();
    }
    let r = catch_unwind(AssertUnwindSafe(|| fanout.try_publish(t.item(5)).unwrap()));
    assert!(r.is_err(), "the first drop panic reaches the publisher");
    assert_eq!(t.not_dropped(1..=4, 1), vec![], "the publish went on past the panics");
    assert_eq!(s.lanes().next().unwrap().stats().published, 5, "and was done");
    for p in 6..=8 {
        fanout.try_publish(t.item(p)).unwrap();
    }
    assert_eq!(t.not_dropped(1..=4, 1), vec![], "reused cells drop nothing twice");
    for c in &mut cs {
        let run = c.try_recv_run(8).unwrap();
        assert_eq!(run.iter().map(|it| read_alive(&t, it)).collect::<Vec<_>>(), [5, 6, 7, 8]);
        // Released again: the items stay queued in the cells.
    }
    // 5..=8 are unacked: the fan-out's drop drops nothing; the last owner drops them.
    t.set_panics(6);
    t.set_panics(7);
    drop(fanout);
    assert_eq!(t.not_dropped(5..=8, 0), vec![]);
    drop((cs, lanes));
    let r = catch_unwind(AssertUnwindSafe(move || drop(s)));
    assert!(r.is_err(), "the first drop panic reaches the last owner");
    assert_eq!(t.not_dropped(1..=8, 1), vec![]);
}

/// L3 wake-ups: a fan-out publish waiting for room pinned by a stale handle
/// (every lane acked the item; only the detached consumer's delivery still reads it) is woken
/// when that handle ends, blocking and async.
#[test]
fn shared_l3_a_publish_waiting_on_a_cell_pinned_by_a_stale_handle_wakes_when_it_ends() {
    for asynchronous in [false, true] {
        let t = Tracker::new(4);
        let s = shared(1, &["a", "b"]);
        let lanes: Vec<_> = s.lanes().collect();
        let mut fanout = s.fanout().unwrap();
        fanout.try_publish(t.item(1)).unwrap();
        let mut old = lanes[0].attach().unwrap();
        let stale = old.try_recv().unwrap();
        let mut a = lanes[0].reattach();
        a.try_recv().unwrap().ack().unwrap();
        let mut b = lanes[1].attach().unwrap();
        b.try_recv().unwrap().ack().unwrap();
        assert_eq!(s.watermark(), Some(Position(1)));
        if asynchronous {
            let (wakes, waker) = common::CountingWaker::new();
            let mut cx = std::task::Context::from_waker(&waker);
            let mut publish = Box::pin(fanout.publish_async(t.item(2)));
            assert!(publish.as_mut().poll(&mut cx).is_pending());
            assert_eq!(wakes.wakes(), 0);
            assert_eq!(read_alive(&t, &stale), 1);
            drop(stale);
            assert!(wakes.wakes() > 0, "the stale handle's end woke nobody");
            assert!(matches!(publish.as_mut().poll(&mut cx), std::task::Poll::Ready(Ok(()))));
        } else {
            let (tx, rx) = mpsc::channel();
            let publisher = {
                let t = t.clone();
                thread::spawn(move || {
                    let r = fanout.publish(t.item(2)).is_ok();
                    tx.send(()).unwrap();
                    r
                })
            };
            assert!(rx.recv_timeout(Duration::from_millis(50)).is_err(), "published over a pinned cell");
            assert_eq!(read_alive(&t, &stale), 1);
            drop(stale);
            assert!(rx.recv_timeout(Duration::from_secs(5)).is_ok(), "the stale handle's end woke nobody");
            assert!(publisher.join().unwrap());
        }
        assert_eq!(t.drops(1), 1);
        for c in [&mut a, &mut b] {
            let d = c.try_recv().unwrap();
            assert_eq!(read_alive(&t, &d), 2);
            d.ack().unwrap();
        }
        drop(old);
    }
}

/// L4: a publish refused for its position (regressed, or the reserved `u64::MAX`) is refused
/// before anything else, so it writes no cell and drops nothing a cell held; a run stops before
/// the first refused item and writes only the items before it.
#[test]
fn shared_l4_a_refused_position_writes_no_cell_and_drops_nothing() {
    let t = Tracker::new(8);
    let s = shared(2, &["a", "b"]);
    let mut fanout = s.fanout().unwrap();
    let mut cs: Vec<_> = s.lanes().map(|l| l.attach().unwrap()).collect();
    fanout.try_publish(t.item(1)).unwrap();
    fanout.try_publish(t.item(2)).unwrap();
    for c in &mut cs {
        c.try_recv_run(8).unwrap().ack().unwrap();
    }
    // Item 1's cell is free to reuse, and still holds it.
    let r = fanout.try_publish(t.item_at(5, 2));
    assert!(matches!(
        r,
        Err(PublishError::PositionRegressed { position: Position(2), last: Position(2), .. })
    ));
    drop(r);
    let huge = LaneItem::Batch(Batch::new(Some(Position(u64::MAX)), Vec::new().into()));
    assert!(matches!(fanout.try_publish(huge), Err(PublishError::InvalidPosition(_))));
    assert_eq!(t.not_dropped(1..=2, 0), vec![], "a refused publish reused a cell");
    let mut run = vec![t.item(3), t.item_at(6, 3)];
    assert_eq!(fanout.try_publish_run(&mut run), Ok(1));
    assert_eq!(run.len(), 1, "the refused item 6 is handed back");
    drop(run);
    // The publish of the run dropped the freed items 1 and 2; the refused item 6 was ours.
    assert_eq!((t.drops(1), t.drops(2), t.drops(3), t.drops(6)), (1, 1, 0, 1));
    for c in &mut cs {
        let run = c.try_recv_run(8).unwrap();
        assert_eq!(run.iter().map(|it| read_alive(&t, it)).collect::<Vec<_>>(), [3]);
        run.ack().unwrap();
    }
    assert_eq!(s.watermark(), Some(Position(3)));
}

/// `Delivery::into_parts`: the clone of the item the consumer keeps outlives
/// the cell (acked everywhere, reused by the fan-out) and the item is dropped once, when the last
/// of the two goes.
#[test]
fn shared_m3_a_kept_clone_outlives_its_reused_cell_and_the_item_drops_once() {
    let t = Tracker::new(4);
    let s = shared(1, &["a", "b"]);
    let mut fanout = s.fanout().unwrap();
    let mut cs: Vec<_> = s.lanes().map(|l| l.attach().unwrap()).collect();
    fanout.try_publish(t.item(1)).unwrap();
    let (kept, handle) = cs[0].try_recv().unwrap().into_parts();
    handle.ack().unwrap();
    cs[1].try_recv().unwrap().ack().unwrap();
    fanout.try_publish(t.item(2)).unwrap();
    assert_eq!(t.drops(1), 0, "the kept clone still holds item 1");
    assert_eq!(read_alive(&t, &kept), 1);
    drop(kept);
    assert_eq!(t.drops(1), 1);
    for c in &mut cs {
        let d = c.try_recv().unwrap();
        assert_eq!(read_alive(&t, &d), 2);
        d.ack().unwrap();
    }
    drop((fanout, cs, s));
    assert_eq!(t.not_dropped(1..=2, 1), vec![]);
}

/// A fan-out publish that gives up on a full array of cells (`publish_timeout`, a dropped
/// `publish_async` future) writes no cell: the item it held is handed back (or dropped with the
/// future) once, and the cell it would have reused still holds the item a lane reads.
#[test]
fn shared_l3_m3_a_publish_that_gives_up_writes_no_cell() {
    let t = Tracker::new(8);
    let s = shared(1, &["a", "b"]);
    let mut fanout = s.fanout().unwrap();
    let mut cs: Vec<_> = s.lanes().map(|l| l.attach().unwrap()).collect();
    fanout.try_publish(t.item(1)).unwrap();
    cs[1].try_recv().unwrap().ack().unwrap();
    let held = cs[0].try_recv().unwrap();
    match fanout.publish_timeout(t.item(2), Duration::from_millis(20)) {
        Err(lanestream::PublishError::Timeout(back)) => {
            assert_eq!(back.position(), Some(Position(2)));
            assert_eq!(t.drops(2), 0);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(t.drops(2), 1, "the handed-back item is the caller's, dropped once");
    {
        let (wakes, waker) = common::CountingWaker::new();
        let mut cx = std::task::Context::from_waker(&waker);
        let mut publish = Box::pin(fanout.publish_async(t.item(3)));
        assert!(publish.as_mut().poll(&mut cx).is_pending());
        assert_eq!(wakes.wakes(), 0);
    }
    assert_eq!(t.drops(3), 1, "the dropped future dropped its item, once");
    assert_eq!(t.drops(1), 0, "no cell was written");
    assert_eq!(read_alive(&t, &held), 1);
    held.ack().unwrap();
    fanout.try_publish(t.item(4)).unwrap();
    assert_eq!(t.drops(1), 1);
    for c in &mut cs {
        let d = c.try_recv().unwrap();
        assert_eq!(read_alive(&t, &d), 4);
        d.ack().unwrap();
    }
    assert_eq!(s.watermark(), Some(Position(4)));
}

// ----- threads --------------------------------------------------------------------------------------

/// L10: a close of one lane racing a stream of fan-out publishes (blocking, over small arrays of
/// cells, so publishes wait for room too). The publish that sees the close returns `Closed` with
/// its item, which reached no lane (an item goes to every lane or to none); every lane got every
/// earlier item exactly once, in order, each read alive; and every item, the refused one
/// included, is dropped exactly once in the end (M3).
#[test]
fn shared_l10_m3_a_close_racing_publishes_refuses_the_item_on_every_lane_and_loses_none_before_it() {
    const LANES: usize = 3;
    const MAX: u64 = 400;
    within(60, "close racing publishes", || {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for round in 0..400 {
            let t = Tracker::new(MAX as usize + 2);
            let s = shared(rng.gen_range(1..=4), &["a", "b", "c"]);
            let mut fanout = s.fanout().unwrap();
            let publisher = {
                let (t, lanes) = (t.clone(), s.lanes().collect::<Vec<_>>());
                thread::spawn(move || {
                    for p in 1..=MAX {
                        match fanout.publish(t.item(p)) {
                            Ok(()) => {}
                            Err(PublishError::Closed(item)) => {
                                assert_eq!(item.position(), Some(Position(p)));
                                return p;
                            }
                            Err(e) => panic!("{e:?}"),
                        }
                    }
                    // Every item went before the close (no race this round): item MAX + 1 is
                    // refused on every lane once the close lands.
                    while !lanes.iter().any(|l| l.stats().closed) {
                        thread::yield_now();
                    }
                    let r = fanout.try_publish(t.item(MAX + 1));
                    assert!(matches!(r, Err(PublishError::Closed(_))), "{r:?}");
                    MAX + 1
                })
            };
            let consumers: Vec<_> = s
                .lanes()
                .map(|lane| {
                    let t = t.clone();
                    let mut c = lane.attach().unwrap();
                    let max = rng.gen_range(1..=4);
                    thread::spawn(move || {
                        let mut got = Vec::new();
                        while let Some(run) = c.recv_run(max).unwrap() {
                            got.extend(run.iter().map(|it| read_alive(&t, it)));
                            run.ack().unwrap();
                        }
                        got
                    })
                })
                .collect();
            // Close lane k once the first lane saw a few items, after a short random spin, to
            // land the close inside a publish as often as before one.
            let k = rng.gen_range(0..LANES);
            let target = rng.gen_range(0..40);
            let first = s.lanes().next().unwrap();
            for i in 0u32.. {
                if first.stats().published >= target {
                    break;
                }
                if i % 64 == 63 {
                    thread::yield_now();
                }
            }
            drop(first);
            for _ in 0..rng.gen_range(0..200) {
                std::hint::spin_loop();
            }
            s.lanes().nth(k).unwrap().close();
            let f = publisher.join().unwrap();
            for lane in s.lanes() {
                lane.close();
            }
            let got: Vec<Vec<u64>> = consumers.into_iter().map(|h| h.join().unwrap()).collect();
            assert_eq!(got.len(), LANES);
            for (l, ps) in got.iter().enumerate() {
                let want: Vec<u64> = (1..f).collect();
                assert_eq!(*ps, want, "round {round} lane {l} (lane {k} closed): refused at {f}");
            }

            drop(s);
            assert_eq!(t.not_dropped(1..=f, 1), vec![], "round {round}");
            assert_eq!(t.not_dropped(f + 1..=MAX, 0), vec![], "round {round}");
        }
    });
}

/// What the stress workers do with a run.
fn work_on_run(
    rng: &mut impl Rng,
    t: &Tracker,
    landed: &[AtomicUsize],
    mut run: Run<LaneItem>,
    want: &[u64],
) -> u64 {
    let mark = |p: u64| {
        assert_eq!(landed[p as usize].fetch_add(1, Ordering::SeqCst), 0, "item {p} landed twice");
    };
    let ps: Vec<u64> = run.iter().map(|it| read_alive(t, it)).collect();
    assert_eq!(ps, want, "a run reads items that are not the ones it was delivered with");
    if rng.gen_bool(0.3) {
        thread::yield_now();
    }
    let mut count = 0;
    match rng.gen_range(0..6) {
        // The whole run, seat-held. Ok: every item landed.
        0..=2 => {
            let n = run.len() as u64;
            if run.ack().is_ok() {
                ps.iter().copied().for_each(mark);
                count += n;
            }
        }
        // Item by item (each exact), then the rest released.
        3 => {
            for _ in 0..rng.gen_range(0..=run.len()) {
                let p = run.get(0).unwrap().position().unwrap().0;
                match run.ack_through(run.sequences().start) {
                    Ok(1) => {
                        mark(p);
                        count += 1;
                    }
                    Err(AckError::Detached) => {}
                    other => panic!("{other:?}"),
                }
            }
            if rng.gen_bool(0.5) {
                run.nack();
            }
        }
        // A cumulative prefix; Ok(k): the first k landed.
        4 => {
            let start = run.sequences().start;
            let k = rng.gen_range(0..run.len() as u64);
            if let Ok(n) = run.ack_through(start + k) {
                assert_eq!(n as u64, k + 1);
                ps[..=k as usize].iter().copied().for_each(mark);
                count += k + 1;
            }
            // The rest once more, read alive, then dropped (released).
            run.iter().for_each(|it| {
                read_alive(t, it);
            });
        }
        _ => drop(run),
    }
    count
}

/// Runs acked on worker threads (the seat-held ack, waiting out the receiving thread's steps)
/// while each lane's receiving thread keeps receiving, re-attaches now and then, and now and
/// then drops its consumer and attaches a new one at once (which must never find the seat still
/// taken: `ConsumerAttached`), and the publisher keeps a small array of cells full (dropping
/// what every lane freed as it publishes), and now and then publishes an item for one lane only
/// (`publish_to`: a gap for the other lanes). No run reads an item not its own, one already
/// dropped, or one for another lane; an item whose ack was reported landed is never delivered
/// again and never lands twice; in the end every lane acked every item (watermark = last
/// position), nothing is pinned, and every item is dropped exactly once.
fn stress(capacity: usize, n: u64, seed: u64) {
    let sinks = ["a", "b", "c"];
    let t = Tracker::new(n as usize + 1);
    let s = shared(capacity, &sinks);
    let landed: Arc<Vec<Vec<AtomicUsize>>> =
        Arc::new((0..sinks.len()).map(|_| (0..=n).map(|_| AtomicUsize::new(0)).collect()).collect());
    // Per position, the one lane it was published to (`publish_to`), or `ALL`.
    const ALL: usize = usize::MAX;
    let targets: Arc<Vec<AtomicUsize>> = Arc::new((0..=n).map(|_| AtomicUsize::new(ALL)).collect());
    let mut fanout = s.fanout().unwrap();
    let publisher = {
        let (t, targets) = (t.clone(), targets.clone());
        thread::spawn(move || {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut p = 1;
            while p <= n {
                // (The last item goes to every lane, so that every lane delivers and acks it.)
                if p < n && rng.gen_range(0..5) == 0 {
                    // A reply for one lane: a gap for the others.
                    let to = rng.gen_range(0..sinks.len());
                    targets[p as usize].store(to, Ordering::SeqCst);
                    fanout.publish_to(to, t.item(p)).unwrap();
                    p += 1;
                    continue;
                }
                let k = rng.gen_range(1..=6).min(n + 1 - p);
                let mut items: Vec<LaneItem> = (p..p + k).map(|q| t.item(q)).collect();
                fanout.publish_run(&mut items).unwrap();
                p += k;
            }
            fanout
        })
    };
    let lanes: Vec<_> = s
        .lanes()
        .enumerate()
        .map(|(l, lane)| {
            let (t, landed, targets) = (t.clone(), landed.clone(), targets.clone());
            thread::spawn(move || {
                let (tx, rx) = mpsc::channel::<(Run<LaneItem>, Vec<u64>)>();
                let worker = {
                    let (t, landed) = (t.clone(), landed.clone());
                    thread::spawn(move || {
                        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (l as u64 + 100));
                        let mut count = 0;
                        for (run, ps) in rx {
                            count += work_on_run(&mut rng, &t, &landed[l], run, &ps);
                        }
                        count
                    })
                };
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (l as u64 + 1));
                let mut c = lane.attach().unwrap();
                let (mut reattaches, mut reattached_by_drop) = (0, 0);
                let deadline = Instant::now() + Duration::from_secs(30);
                while !(lane.acked() == Some(Position(n)) && lane.is_idle()) {
                    assert!(Instant::now() < deadline, "lane {l}: stuck at {:?}", lane.stats());
                    match rng.gen_range(0..40) {
                        0 => {
                            c = lane.reattach();
                            reattaches += 1;
                        }
                        1 => {
                            drop(c);
                            c = match lane.attach() {
                                Ok(c) => c,
                                Err(e) => panic!("lane {l}: attach right after the consumer dropped: {e}"),
                            };
                            reattached_by_drop += 1;
                        }
                        _ => {}
                    }
                    match c.recv_run_timeout(rng.gen_range(1..=12), Duration::from_millis(2)) {
                        Ok(Some(run)) => {
                            let ps: Vec<u64> = run.iter().map(|it| read_alive(&t, it)).collect();
                            assert!(ps.windows(2).all(|w| w[0] < w[1]), "lane {l}: run {ps:?}");
                            for &p in &ps {
                                let to = targets[p as usize].load(Ordering::SeqCst);
                                assert!(to == ALL || to == l, "lane {l}: item {p} was for lane {to} only");
                                let times = landed[l][p as usize].load(Ordering::SeqCst);
                                assert_eq!(
                                    times, 0,
                                    "lane {l}: item {p} delivered again after its ack landed"
                                );
                            }
                            // Sometimes ack right here, on the receiving thread, racing the worker's acks.
                            if rng.gen_bool(0.2) {
                                if run.ack().is_ok() {
                                    for &p in &ps {
                                        assert_eq!(landed[l][p as usize].fetch_add(1, Ordering::SeqCst), 0);
                                    }
                                }
                            } else {
                                tx.send((run, ps)).unwrap();
                            }
                        }
                        Ok(None) => unreachable!("never closed"),
                        Err(e) => assert!(e.is_timeout(), "{e:?}"),
                    }
                }
                drop(tx);
                worker.join().unwrap();
                let stats = lane.stats();
                assert_eq!((stats.pinned, stats.released, stats.in_flight, stats.queued), (0, 0, 0, 0));
                (reattaches, reattached_by_drop)
            })
        })
        .collect();
    let fanout = publisher.join().unwrap();
    let churn: Vec<(u32, u32)> = lanes.into_iter().map(|h| h.join().unwrap()).collect();
    eprintln!("churn (reattaches, attaches after drop) per lane: {churn:?}");
    assert!(churn.iter().all(|&(a, b)| a > 0 && b > 0), "no re-attach churn: {churn:?}");
    assert_eq!(s.watermark(), Some(Position(n)));
    assert!(s.is_idle());
    for (l, landed) in landed.iter().enumerate() {
        let twice: Vec<u64> = (1..=n).filter(|&p| landed[p as usize].load(Ordering::SeqCst) > 1).collect();
        assert!(twice.is_empty(), "lane {l}: landed twice: {twice:?}");
    }
    drop(fanout);
    // The fan-out's drop dropped every item: every lane acked everything.
    assert_eq!(t.not_dropped(1..=n, 1), vec![]);
    assert_eq!(s.memory().held_items, 0);
    drop(s);
    assert_eq!(t.not_dropped(1..=n, 1), vec![]);
}

#[test]
fn shared_l5_l8_m3_seat_held_run_acks_on_workers_racing_reattaches_and_drops_lose_nothing() {
    within(120, "stress", || {
        stress(8, 50_000, 1);
        stress(2, 15_000, 3);
        stress(5, 30_000, 2);
    });
}

// ----- random op sequences against a model ---------------------------------------------------------

/// The proptest strategy of one step (the fuzz target draws them with `arbitrary` instead).
fn sop() -> impl Strategy<Value = SOp> {
    prop_oneof![
        3 => (1u8..7).prop_map(SOp::Publish),
        1 => Just(SOp::PublishOne),
        2 => any::<u8>().prop_map(SOp::PublishTo),
        3 => (any::<u8>(), 1u8..10).prop_map(|(l, m)| SOp::RecvRun(l, m)),
        1 => any::<u8>().prop_map(SOp::Recv),
        2 => (any::<u8>(), any::<u8>()).prop_map(|(h, k)| SOp::AckThrough(h, k)),
        2 => any::<u8>().prop_map(SOp::AckRun),
        1 => any::<u8>().prop_map(SOp::NackRun),
        1 => any::<u8>().prop_map(SOp::AckSingle),
        1 => any::<u8>().prop_map(SOp::NackSingle),
        1 => any::<u8>().prop_map(SOp::Reattach),
        1 => any::<u8>().prop_map(SOp::DropAndAttach),
        1 => prop_oneof![Just(None), Just(None), Just(None), any::<u8>().prop_map(Some)]
            .prop_map(|l| l.map_or(SOp::Memory, SOp::CloseLane)),
        1 => Just(SOp::NewFanout),
        1 => prop_oneof![Just(SOp::Memory), Just(SOp::Memory), Just(SOp::Memory), Just(SOp::Close)],
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 384, ..ProptestConfig::default() })]

    #[test]
    fn shared_model_random_sequences_match_the_model_and_drop_each_item_once(
        lanes_n in 1usize..=3,
        cap in prop_oneof![Just(1usize), Just(2), Just(3), Just(5)],
        ops in proptest::collection::vec(sop(), 1..100),
    ) {
        shared_ops(lanes_n, cap, &ops);
    }
}
