//! Loom model 7: close racing the last publish, close waking waiters, and a close from another
//! thread racing a publish (L3, L10).

use lanestream::prelude::*;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use lanestream::{MemoryStream, Position, PublishError, Stream};
use loom::thread;

use crate::support::{self, batch, check, Flag};

/// Model 7a: close racing the last publish.
///
/// The producer publishes item 1 and closes at once; the consumer receives in a blocking loop.
/// Checked: the consumer gets item 1 and only then `None` — a close it sees brings every item
/// published before it (`CLOSED` and the published count are one word, `tail`: the consumer's
/// one Acquire load of it sees both or neither); publishing after close fails with `Closed`,
/// item handed back.
///
/// Why the bound suffices: two threads; the race is the consumer's load of `tail` against the
/// producer's publish compare-and-swap and `close`'s RMW, a window one preemption enters.
/// Bound 3 is cheap and also covers the consumer parking between the two.
#[test]
fn close_racing_the_last_publish() {
    support::model("close_racing_the_last_publish", 3, || {
        let stream = MemoryStream::builder().capacity(1).request_capacity(1).sink("a").build().unwrap();
        let lane = stream.lane("a").unwrap();
        let mut producer = stream.fanout().unwrap();
        let mut consumer = lane.reattach();
        let p = thread::spawn(move || {
            producer.publish(batch(1)).unwrap();
            producer.close();
            assert!(matches!(producer.try_publish(batch(2)), Err(PublishError::Closed(_))));
        });
        let d = consumer.recv().unwrap().expect("item 1 is delivered before the end");
        check(&d, 1);
        d.ack().unwrap();
        assert!(consumer.recv().unwrap().is_none());
        p.join().unwrap();
        assert_eq!(lane.acked(), Some(Position(1)));
        assert!(lane.stats().closed);
    });
}

/// Model 7b: closing wakes every waiter: a blocked `recv` (thread), a pending `recv_async`, and
/// a producer blocked in `publish` on a full lane, each woken by a close, each returning the end
/// (`None`, or `Closed` with the item handed back).
///
/// A lane has one consumer and one producer, so the three waiters are three runs of the same
/// scenario inside one model (one `#[test]` each would add builds and nothing else). The
/// producer is closed through `Lane::close` (a supervisor's close), since `Producer::close`
/// cannot overlap a publish (which holds `&mut Producer`).
///
/// Why the bound suffices: two threads per run and one store-buffer race each (the `CLOSED`
/// RMW on `tail` and notification against the waiter's register -> re-check); bound 3 is cheap
/// here.
#[test]
fn close_wakes_blocked_and_async_consumers() {
    support::model("close_wakes_blocked_and_async_consumers", 3, || {
        // Blocking waiter.
        let stream = MemoryStream::builder().capacity(1).request_capacity(1).sink("a").build().unwrap();
        let lane = stream.lane("a").unwrap();
        let producer = stream.fanout().unwrap();
        let mut consumer = lane.reattach();
        let c = thread::spawn(move || assert!(consumer.recv().unwrap().is_none()));
        producer.close();
        c.join().unwrap();

        // Async waiter.
        let stream = MemoryStream::builder().capacity(1).request_capacity(1).sink("a").build().unwrap();
        let lane = stream.lane("a").unwrap();
        let producer = stream.fanout().unwrap();
        let mut consumer = lane.reattach();
        let closer = thread::spawn(move || producer.close());
        let (flag, waker) = Flag::new();
        let mut cx = Context::from_waker(&waker);
        let mut fut = consumer.recv_async();
        loop {
            match Pin::new(&mut fut).poll(&mut cx) {
                Poll::Ready(r) => {
                    assert!(r.unwrap().is_none());
                    break;
                }
                Poll::Pending => flag.wait(),
            }
        }
        closer.join().unwrap();

        // Producer blocked on a full lane.
        let stream = MemoryStream::builder().capacity(1).request_capacity(1).sink("a").build().unwrap();
        let lane = stream.lane("a").unwrap();
        let mut producer = stream.fanout().unwrap();
        producer.try_publish(batch(1)).unwrap();
        let p = thread::spawn(move || match producer.publish(batch(2)) {
            Err(PublishError::Closed(item)) => check(&item, 2),
            other => panic!("expected Closed with the item back, got {other:?}"),
        });
        lane.close();
        p.join().unwrap();
    });
}

/// Model 7c: a close from another thread racing a publish (L3, L10).
///
/// The producer thread publishes item 1 into an empty lane of capacity 1 while a supervisor
/// thread closes the lane through the port (`Stream::close`), and the consumer receives in a
/// blocking loop until `None`, then once more after both threads are done. Checked, for every
/// interleaving:
/// - the publish either returns `Ok` and the consumer receives item 1 before `None`, or returns
///   `Closed` with item 1 handed back intact and the consumer never sees it — never both, never
///   neither (the publish is a compare-and-swap on `tail` that fails once `close`'s RMW set
///   `CLOSED` in the same word, so the two are totally ordered);
/// - no item after `None`: the receive after both threads ended still says `None` (a publish
///   that checked for the close and only then bumped the count could land after the consumer
///   saw the end);
/// - the consumer reads the item the producer wrote (the compare-and-swap's Release, acquired
///   by the consumer's load of `tail`; loom checks the slot cell), and the item is dropped
///   exactly once whichever way it went (leak-tracked document).
///
/// Why the bound suffices: three threads, and the decisive race is one RMW against one RMW on
/// `tail` (the publish's compare-and-swap and `close`'s `fetch_or`) with the consumer's load of
/// `tail` between or around them; placing the close inside the producer's window (between its
/// slot write and its compare-and-swap) takes one preemption, and the consumer's end check
/// inside that window a second. Bound 3 also covers the consumer parking and being woken by
/// either the publish or the close, and still runs in about a second (bound 4 passes too: about
/// 42,000 executions, 3 s).
#[test]
fn close_racing_a_publish_from_another_thread() {
    support::model("close_racing_a_publish_from_another_thread", 3, || {
        let stream = MemoryStream::builder().capacity(1).request_capacity(1).sink("a").build().unwrap();
        let lane = stream.lane("a").unwrap();
        let mut producer = stream.fanout().unwrap();
        let mut consumer = lane.attach().unwrap();

        let p = thread::spawn(move || match producer.publish(batch(1)) {
            Ok(()) => true,
            Err(PublishError::Closed(item)) => {
                check(&item, 1);
                false
            }
            Err(e) => panic!("publish: {e:?}"),
        });
        let supervisor = stream.clone();
        let closer = thread::spawn(move || supervisor.close("a").unwrap());

        let mut received = 0;
        while let Some(d) = consumer.recv().unwrap() {
            check(&d, 1);
            d.ack().unwrap();
            received += 1;
        }
        let published = p.join().unwrap();
        closer.join().unwrap();
        if let Some(d) = consumer.recv().unwrap() {
            panic!("item {:?} delivered after the end (publish returned Ok: {published})", d.position());
        }
        assert_eq!(received, usize::from(published), "publish Ok: {published}, items received: {received}");
        assert_eq!(lane.acked(), published.then_some(Position(1)));
        assert!(lane.stats().closed);
        assert!(lane.is_idle());
    });
}
