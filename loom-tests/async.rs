//! Loom model 6: async waits — a registered waker, a re-poll with a different waker, and a
//! future dropped right after being woken.

use lanestream::prelude::*;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use lanestream::{MemoryStream, Position, Stream};
use loom::thread;

use crate::support::{self, batch, check, Flag};

/// Model 6a: `recv_async` re-polled with a different waker, then dropped right after being
/// woken; the next receive gets the item at once.
///
/// The main thread polls a receive future with waker 1 (empty lane: Pending, waker 1
/// registered), re-polls it with waker 2 (the registration must now wake waker 2, not the stale
/// waker 1), waits until waker 2 is woken, and drops the future without polling it again. The
/// producer publishes concurrently, so the publish lands before, between or after the polls.
/// Checked: whenever the future is still pending after the second poll, waker 2 is woken (else
/// the main thread parks forever: loom reports a deadlock), and after the drop a non-blocking
/// `try_recv` gets the item (the future took nothing; dropping it lost nothing).
///
/// Why the bound suffices: two threads; the races are the publish against each poll's
/// register -> re-check (one store-buffer race per poll), so two preemptions place the publish
/// inside either poll's window. Bound 3 is cheap here and adds the replacement of the waker
/// racing the notifier's removal of the entry.
#[test]
fn recv_async_repolled_with_a_new_waker_then_dropped_after_wake() {
    support::model("recv_async_repolled_with_a_new_waker_then_dropped_after_wake", 3, || {
        let stream = MemoryStream::builder().capacity(1).request_capacity(1).sink("a").build().unwrap();
        let lane = stream.lane("a").unwrap();
        let mut producer = stream.fanout().unwrap();
        let mut consumer = lane.reattach();
        let p = thread::spawn(move || producer.publish(batch(1)).unwrap());

        let (_flag1, waker1) = Flag::new();
        let (flag2, waker2) = Flag::new();
        let mut fut = consumer.recv_async();
        let mut got = match Pin::new(&mut fut).poll(&mut Context::from_waker(&waker1)) {
            Poll::Ready(r) => Some(r),
            Poll::Pending => None,
        };
        if got.is_none() {
            match Pin::new(&mut fut).poll(&mut Context::from_waker(&waker2)) {
                Poll::Ready(r) => got = Some(r),
                // Woken, then dropped without another poll.
                Poll::Pending => flag2.wait(),
            }
        }
        drop(fut);
        let d = match got {
            Some(r) => r.unwrap().expect("not closed"),
            None => consumer.try_recv().expect("the item is there at once after the wake-up"),
        };
        check(&d, 1);
        assert_eq!(d.attempt(), 1);
        d.ack().unwrap();
        p.join().unwrap();
        assert_eq!(lane.acked(), Some(Position(1)));
    });
}

/// Model 6b: `publish_async` waiting for room, re-polled with a different waker, while another
/// thread acks.
///
/// The lane (capacity 1) holds delivered item 1. The main thread polls a publish of item 2 with
/// waker 1 (full: Pending), re-polls it with waker 2, waits for waker 2, and polls to
/// completion; the acker thread acks item 1 concurrently. Checked: waker 2 is woken whenever
/// the future is pending (else deadlock), the publish completes, and item 2 is delivered.
///
/// Why the bound suffices: as 6a, with the room list and `free` in place of the item list and
/// `tail`.
#[test]
fn publish_async_repolled_with_a_new_waker_while_acked() {
    support::model("publish_async_repolled_with_a_new_waker_while_acked", 3, || {
        let stream = MemoryStream::builder().capacity(1).request_capacity(1).sink("a").build().unwrap();
        let lane = stream.lane("a").unwrap();
        let mut producer = stream.fanout().unwrap();
        let mut consumer = lane.reattach();
        producer.try_publish(batch(1)).unwrap();
        let d1 = consumer.try_recv().unwrap();
        let acker = thread::spawn(move || d1.ack().unwrap());

        let (_flag1, waker1) = Flag::new();
        let (flag2, waker2) = Flag::new();
        let mut fut = producer.publish_async(batch(2));
        let mut done =
            matches!(Pin::new(&mut fut).poll(&mut Context::from_waker(&waker1)), Poll::Ready(Ok(())));
        if !done {
            done = matches!(Pin::new(&mut fut).poll(&mut Context::from_waker(&waker2)), Poll::Ready(Ok(())));
        }
        if !done {
            flag2.wait();
            match Pin::new(&mut fut).poll(&mut Context::from_waker(&waker2)) {
                Poll::Ready(r) => r.unwrap(),
                Poll::Pending => panic!("woken for room, but still no room"),
            }
        }
        drop(fut);
        acker.join().unwrap();
        let d2 = consumer.try_recv().unwrap();
        check(&d2, 2);
        d2.ack().unwrap();
        assert_eq!(lane.acked(), Some(Position(2)));
    });
}
