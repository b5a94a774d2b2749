//! M2: publish, recv, ack and nack allocate nothing once the stream is built (redelivery and the
//! blocking and async entry points included, when they need not wait). M1: memory stays flat
//! over 10^6 operations (live bytes before == after).
//!
//! The test binary's global allocator counts allocations and live bytes **per thread** (a
//! const thread-local, which itself never allocates), so tests running in parallel in this
//! binary do not see each other's allocations. Each measured section runs on one thread.

use lanestream::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};
use std::time::Duration;

use bytes::Bytes;
use lanestream::{
    Batch, Envelope, IndexName, LaneItem, MemoryStream, Op, Position, Request, SinkName, Stream,
};

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

fn note(allocs: u64, bytes: i64) {
    // `try_with`: the allocator may run while this thread's locals are being torn down.
    let _ = ALLOCS.try_with(|c| c.set(c.get() + allocs));
    let _ = LIVE.try_with(|c| c.set(c.get() + bytes));
}

// SAFETY: every call is forwarded to `System` unchanged; the bookkeeping touches only
// const-initialised thread-locals without destructors, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(1, layout.size() as i64);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(1, layout.size() as i64);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(0, -(layout.size() as i64));
        // SAFETY: forwarded; `ptr` came from `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(1, new_size as i64 - layout.size() as i64);
        // SAFETY: forwarded; `ptr` came from `System` with this layout.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// (allocations, live bytes) made by this thread so far.
fn snapshot() -> (u64, i64) {
    (ALLOCS.with(Cell::get), LIVE.with(Cell::get))
}

/// Runs `f` and returns how many allocations it made on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    let before = snapshot().0;
    f();
    snapshot().0 - before
}

fn envelopes(n: usize) -> Arc<[Envelope]> {
    let index = IndexName::new("users").unwrap();
    (0..n)
        .map(|i| Envelope {
            index: index.clone(),
            id: i.to_string(),
            op: Op::Upsert,
            position: Some(Position(1)),
            document: Bytes::from_static(br#"{"id":1}"#),
            built_at_micros: None,
            relation: None,
            old_id: None,
            unchanged: Vec::new(),
        })
        .collect::<Vec<_>>()
        .into()
}

fn batch(env: &Arc<[Envelope]>, pos: u64) -> LaneItem {
    LaneItem::Batch(Batch::new(Some(Position(pos)), env.clone()))
}

fn noop_waker() -> Waker {
    const VTABLE: RawWakerVTable = RawWakerVTable::new(|_| RAW, |_| {}, |_| {}, |_| {});
    const RAW: RawWaker = RawWaker::new(std::ptr::null(), &VTABLE);
    // SAFETY: every vtable function ignores the (null) data pointer.
    unsafe { Waker::from_raw(RAW) }
}

/// Polls `fut` once; it must be ready (nothing to wait for).
fn ready<F: Future>(fut: F) -> F::Output {
    let waker = noop_waker();
    let mut cx = Context::from_waker(&waker);
    match pin!(fut).poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("future was not ready"),
    }
}

#[test]
fn counting_allocator_sees_allocations() {
    // Guards the other tests against a vacuous pass.
    let n = allocations(|| drop(std::hint::black_box(vec![1u8; 100])));
    assert_eq!(n, 1);
}

#[test]
fn publish_recv_ack_nack_allocate_nothing_after_build_m2() {
    let stream = MemoryStream::builder().capacity(8).sink("search").build().unwrap();
    let lane = stream.lane("search").unwrap();
    let mut producer = stream.fanout().unwrap();
    let mut consumer = lane.reattach();
    let env = envelopes(3);
    let mut pos = 0;
    let mut next = || {
        pos += 1;
        batch(&env, pos)
    };
    // Warm up once outside the count (nothing should be lazy, but be fair to one-time setup).
    producer.try_publish(next()).unwrap();
    consumer.try_recv().unwrap().ack().unwrap();

    let items: Vec<LaneItem> = (0..40).map(|_| next()).collect();
    let mut items = items.into_iter();
    let n = allocations(|| {
        for _ in 0..4 {
            // try_publish / try_recv / ack.
            producer.try_publish(items.next().unwrap()).unwrap();
            let d = consumer.try_recv().unwrap();
            assert_eq!(d.attempt(), 1);
            d.ack().unwrap();

            // nack, then redelivery (attempt 2), then ack.
            producer.try_publish(items.next().unwrap()).unwrap();
            consumer.try_recv().unwrap().nack();
            let again = consumer.try_recv().unwrap();
            assert_eq!(again.attempt(), 2);
            // Dropping an AckHandle releases too: redelivery attempt 3.
            drop(again.into_handle());
            let third = consumer.try_recv().unwrap();
            assert_eq!(third.attempt(), 3);
            third.ack().unwrap();

            // Several outstanding, acked out of order.
            producer.try_publish(items.next().unwrap()).unwrap();
            producer.try_publish(items.next().unwrap()).unwrap();
            let a = consumer.try_recv().unwrap();
            let b = consumer.try_recv().unwrap();
            b.ack().unwrap();
            a.ack().unwrap();

            // Blocking entry points that need not wait.
            producer.publish(items.next().unwrap()).unwrap();
            producer.publish_timeout(items.next().unwrap(), Duration::from_secs(1)).unwrap();
            consumer.recv().unwrap().unwrap().ack().unwrap();
            consumer.recv_timeout(Duration::from_secs(1)).unwrap().unwrap().ack().unwrap();

            // Async entry points that need not wait.
            ready(producer.publish_async(items.next().unwrap())).unwrap();
            ready(consumer.recv_async()).unwrap().unwrap().ack().unwrap();

            // Watermark and the caught-up / idle hints.
            assert!(consumer.is_empty());
            std::hint::black_box(stream.watermark());
            std::hint::black_box(stream.is_idle());
        }
    });
    assert_eq!(n, 0, "hot path allocated {n} times");
    assert_eq!(lane.acked(), Some(Position(pos_of(&lane))));
}

fn pos_of(lane: &lanestream::Lane) -> u64 {
    lane.stats().last_published.unwrap().0
}

/// M2 for runs: receiving a run (every form that need not wait), iterating it, acking it
/// whole or cumulatively, releasing its remainder and receiving the redeliveries allocate
/// nothing.
#[test]
fn runs_receive_ack_nack_allocate_nothing_after_build_m2() {
    let stream = MemoryStream::builder().capacity(16).sink("search").build().unwrap();
    let lane = stream.lane("search").unwrap();
    let mut producer = stream.fanout().unwrap();
    let mut consumer = lane.reattach();
    let env = envelopes(3);
    let mut pos = 0;
    let mut next = || {
        pos += 1;
        batch(&env, pos)
    };
    producer.try_publish(next()).unwrap();
    consumer.try_recv_run(8).unwrap().ack().unwrap();

    let items: Vec<LaneItem> = (0..4 * 16).map(|_| next()).collect();
    let mut items = items.into_iter();
    let n = allocations(|| {
        for _ in 0..4 {
            for _ in 0..8 {
                producer.try_publish(items.next().unwrap()).unwrap();
            }
            // A run of 8: iterate, ack the first 3 cumulatively, release the rest.
            let mut run = consumer.try_recv_run(16).unwrap();
            assert_eq!(run.len(), 8);
            assert!(run.iter().all(|item| item.position().is_some()));
            let first = run.sequences().start;
            run.ack_through(first + 2).unwrap();
            drop(run);
            // The 5 redeliveries, one run each, through every receive form that need not wait.
            consumer.try_recv_run(16).unwrap().ack().unwrap();
            consumer.recv_run(16).unwrap().unwrap().ack().unwrap();
            consumer.recv_run_timeout(16, Duration::from_secs(1)).unwrap().unwrap().ack().unwrap();
            ready(consumer.recv_run_async(16)).unwrap().unwrap().ack().unwrap();
            let mut last = consumer.try_recv_run(16).unwrap();
            let p = last.last_position().unwrap();
            last.ack_through_position(p).unwrap();
            drop(last);
            for _ in 0..8 {
                producer.try_publish(items.next().unwrap()).unwrap();
            }
            consumer.try_recv_run(4).unwrap().nack();
            for _ in 0..4 {
                consumer.try_recv_run(4).unwrap().ack().unwrap();
            }
            consumer.try_recv_run(16).unwrap().ack().unwrap();
            assert!(consumer.is_empty());
        }
    });
    assert_eq!(n, 0, "run path allocated {n} times");
    assert!(lane.is_idle());
    assert_eq!(lane.acked(), Some(Position(pos_of(&lane))));
}

/// M2 for the fan-out producer: publishing an item, or a run of items, to every lane allocates
/// nothing (each item is moved into its one cell, which every lane reads in place).
#[test]
fn fanout_publish_and_publish_run_allocate_nothing_after_build_m2() {
    let stream = MemoryStream::builder().capacity(16).sinks(["search", "cache", "archive"]).build().unwrap();
    let mut fanout = stream.fanout().unwrap();
    let mut consumers: Vec<_> = stream.lanes().map(|lane| lane.reattach()).collect();
    let env = envelopes(3);
    // Round r: one item at position 9r + 1, then a run of the next 8.
    let rounds: Vec<(LaneItem, Vec<LaneItem>)> = (0..4u64)
        .map(|r| (batch(&env, 9 * r + 1), (2..=9).map(|k| batch(&env, 9 * r + k)).collect()))
        .collect();
    let mut rounds = rounds.into_iter();
    let n = allocations(|| {
        for _ in 0..4 {
            let (single, mut run) = rounds.next().unwrap();
            fanout.try_publish(single).unwrap();
            assert_eq!(fanout.try_publish_run(&mut run), Ok(8));
            assert!(run.is_empty(), "the run's items are moved in, not cloned");
            drop(run); // frees the caller's Vec: count it out below
            for c in consumers.iter_mut() {
                let r = c.try_recv_run(16).unwrap();
                assert_eq!(r.len(), 9);
                r.ack().unwrap();
            }
        }
    });
    // The four `Vec`s of the runs were allocated before the count and freed inside it; freeing
    // is not an allocation.
    assert_eq!(n, 0, "fan-out path allocated {n} times");
    assert!(stream.is_idle());
}

#[test]
fn request_lane_allocates_nothing_after_build_m2() {
    let stream = MemoryStream::builder().sink("search").request_capacity(4).build().unwrap();
    let sender = stream.requests().sender();
    let mut ingest = stream.requests().reattach();
    let requests: Vec<Request> =
        (0..8).map(|_| Request::backfill(SinkName::new("search").unwrap(), Vec::new())).collect();
    let mut requests = requests.into_iter();
    // Warm-up, uncounted.
    sender.publish(requests.next().unwrap()).unwrap();
    ingest.try_recv().unwrap().ack().unwrap();
    let n = allocations(|| {
        for _ in 0..3 {
            sender.try_publish(requests.next().unwrap()).unwrap();
            ingest.try_recv().unwrap().nack();
            ingest.recv().unwrap().unwrap().ack().unwrap();
        }
    });
    assert_eq!(n, 0, "request lane allocated {n} times");
}

#[test]
fn memory_stays_flat_over_a_million_operations_m1() {
    let stream = MemoryStream::builder().capacity(7).sinks(["a", "b"]).build().unwrap();
    let mut fanout = stream.fanout().unwrap();
    let mut consumers: Vec<_> = stream.lanes().map(|l| l.reattach()).collect();
    let env = envelopes(2);
    let mut held = Vec::with_capacity(8);
    let (before_allocs, before_live) = snapshot();
    let mut ops = 0u64;
    let mut pos = 0u64;
    while ops < 1_000_000 {
        pos += 1;
        fanout.try_publish(batch(&env, pos)).unwrap();
        ops += 1;
        for c in consumers.iter_mut() {
            let d = c.try_recv().unwrap();
            ops += 1;
            match pos % 3 {
                0 => {
                    d.nack();
                    let again = c.try_recv().unwrap();
                    again.ack().unwrap();
                    ops += 3;
                }
                1 => {
                    // Hold a few deliveries, then ack them out of order.
                    held.push(d.into_handle());
                    if held.len() == 6 {
                        while let Some(h) = held.pop() {
                            h.ack().unwrap();
                            ops += 1;
                        }
                    }
                }
                _ => {
                    d.ack().unwrap();
                    ops += 1;
                }
            }
        }
        std::hint::black_box(stream.watermark());
    }
    for h in held.drain(..) {
        h.ack().unwrap();
    }
    let (after_allocs, after_live) = snapshot();
    assert_eq!(after_allocs - before_allocs, 0, "allocated during {ops} operations");
    assert_eq!(after_live, before_live, "live bytes changed over {ops} operations");
    assert!(stream.is_idle());
    assert_eq!(stream.watermark(), Some(Position(pos)));
}

#[test]
fn two_thread_traffic_allocates_nothing_on_either_side_m2() {
    let stream = MemoryStream::builder().capacity(16).sink("s").build().unwrap();
    let mut producer = stream.fanout().unwrap();
    let mut consumer = stream.lane("s").unwrap().reattach();
    const N: u64 = 100_000;
    let consumer_side = std::thread::spawn(move || {
        allocations(|| {
            let mut n = 0;
            while n < N {
                match consumer.try_recv() {
                    Ok(d) => {
                        if n % 5 == 0 && d.attempt() == 1 {
                            d.nack();
                            continue;
                        }
                        d.ack().unwrap();
                        n += 1;
                    }
                    Err(_) => std::hint::spin_loop(),
                }
            }
        })
    });
    let env = envelopes(1);
    let producer_side = allocations(|| {
        for pos in 1..=N {
            let mut item = batch(&env, pos);
            loop {
                match producer.try_publish(item) {
                    Ok(()) => break,
                    Err(e) => {
                        item = e.into_inner();
                        std::hint::spin_loop();
                    }
                }
            }
        }
    });
    let consumer_side = consumer_side.join().unwrap();
    assert_eq!((producer_side, consumer_side), (0, 0));
    assert_eq!(stream.watermark(), Some(Position(N)));
}

/// M2 for the one array of cells: fan-out publishes (single and runs, reusing cells, and
/// dropping the items every lane freed), runs received and acked with the seat-held ack and
/// cumulatively, released and redelivered, a re-attach with a stale run acked late (refused,
/// its items ended as stale handles) and single deliveries allocate nothing; M1: live bytes are back where they started
/// once the items' own storage is accounted for; M3: the fan-out's drop drops the last items.
#[test]
fn fanout_runs_redeliveries_and_reattach_allocate_nothing_and_the_fanout_drop_frees_the_rest_m2() {
    for capacity in [16, 5] {
        let stream =
            MemoryStream::builder().capacity(capacity).sinks(["search", "cache", "archive"]).build().unwrap();
        let lanes: Vec<_> = stream.lanes().collect();
        let mut fanout = stream.fanout().unwrap();
        let mut consumers: Vec<_> = lanes.iter().map(|lane| lane.attach().unwrap()).collect();
        let env = envelopes(3);
        // Round r: one item at position 5r + 1, then a run of the next 4.
        let rounds: Vec<(LaneItem, Vec<LaneItem>)> = (0..40u64)
            .map(|r| (batch(&env, 5 * r + 1), (2..=5).map(|k| batch(&env, 5 * r + k)).collect()))
            .collect();
        let mut rounds = rounds.into_iter();
        let live_before = snapshot().1;
        let n = allocations(|| {
            for r in 0..40 {
                let (single, mut run) = rounds.next().unwrap();
                fanout.try_publish(single).unwrap();
                assert_eq!(fanout.try_publish_run(&mut run), Ok(4));
                drop(run);
                for (l, c) in consumers.iter_mut().enumerate() {
                    match (r + l) % 4 {
                        // Whole run, seat-held.
                        0 => c.try_recv_run(16).unwrap().ack().unwrap(),
                        // Cumulative, then the rest released and redelivered one by one.
                        1 => {
                            let mut run = c.try_recv_run(16).unwrap();
                            let first = run.sequences().start;
                            run.ack_through(first + 1).unwrap();
                            drop(run);
                            for _ in 0..3 {
                                c.try_recv().unwrap().ack().unwrap();
                            }
                        }
                        // A re-attach with the run outstanding: its late ack is refused item
                        // by item; the new consumer gets the five again.
                        2 => {
                            let stale = c.try_recv_run(16).unwrap();
                            *c = lanes[l].reattach();
                            assert!(stale.ack().is_err());
                            for _ in 0..5 {
                                c.recv_run(16).unwrap().unwrap().ack().unwrap();
                            }
                        }
                        _ => {
                            let run = ready(c.recv_run_async(16)).unwrap().unwrap();
                            assert_eq!(run.len(), 5);
                            run.ack().unwrap();
                        }
                    }
                    assert!(c.is_empty());
                }
            }
        });
        assert_eq!(n, 0, "capacity {capacity}: shared-ring path allocated {n} times");
        // The run `Vec`s (freed inside) were the only live bytes to go.
        let freed_vecs = 40 * (4 * std::mem::size_of::<LaneItem>()) as i64;
        assert_eq!(snapshot().1, live_before - freed_vecs, "capacity {capacity}: live bytes");
        assert!(stream.is_idle());
        assert_eq!(stream.watermark(), Some(Position(200)));
        // The last round's items, acked everywhere, wait for a publish; the fan-out's drop drops them.
        assert_eq!(stream.memory().held_items, 5);
        assert_eq!(Arc::strong_count(&env), 1 + 5);
        drop(fanout);
        assert_eq!((stream.memory().held_items, Arc::strong_count(&env)), (0, 1), "every copy went");
    }
}
