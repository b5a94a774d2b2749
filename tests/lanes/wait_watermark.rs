//! W6: a watermark you can wait on, blocking and async.

use crate::common;
use lanestream::prelude::*;

use std::future::Future;
use std::task::Context;
use std::time::{Duration, Instant};

use common::{batch, within, CountingWaker};
use lanestream::{MemoryStream, Position, Stream};

#[test]
fn w6_returns_at_once_when_the_watermark_is_already_there() {
    let stream = MemoryStream::builder().sinks(["a", "b"]).build().unwrap();
    let mut consumers: Vec<_> = stream.lanes().map(|lane| lane.attach().unwrap()).collect();
    stream.fanout().unwrap().publish_run(&mut vec![batch(3), batch(5)]).unwrap();
    for c in &mut consumers {
        c.try_recv_run(8).unwrap().ack().unwrap();
    }
    assert_eq!(stream.wait_watermark(Position(4), Some(Instant::now())), Some(Position(5)));
}

#[test]
fn w6_a_blocking_wait_is_woken_by_the_ack_that_moves_the_watermark() {
    let stream = MemoryStream::builder().sinks(["a", "b"]).build().unwrap();
    let mut consumers: Vec<_> = stream.lanes().map(|lane| lane.attach().unwrap()).collect();
    stream.fanout().unwrap().publish(batch(7)).unwrap();
    consumers[0].try_recv().unwrap().ack().unwrap();
    let waiter = {
        let stream = stream.clone();
        std::thread::spawn(move || stream.wait_watermark(Position(7), None))
    };
    std::thread::sleep(Duration::from_millis(20)); // let it park: lane b has not acked
    assert!(!waiter.is_finished(), "returned before the watermark reached 7");
    consumers[1].try_recv().unwrap().ack().unwrap();
    assert_eq!(within(10, "wait_watermark", move || waiter.join().unwrap()), Some(Position(7)));
}

#[test]
fn w6_a_deadline_returns_the_watermark_below_the_target() {
    let stream = MemoryStream::builder().sink("a").build().unwrap();
    let mut consumer = stream.attach("a").unwrap();
    stream.fanout().unwrap().publish_run(&mut vec![batch(1), batch(2)]).unwrap();
    consumer.try_recv().unwrap().ack().unwrap();
    let got = stream.wait_watermark(Position(2), Some(Instant::now() + Duration::from_millis(20)));
    assert_eq!(got, Some(Position(1)));
}

#[test]
fn w6_a_closed_and_drained_stream_ends_the_wait_below_the_target() {
    let stream = MemoryStream::builder().sinks(["a", "b"]).build().unwrap();
    let mut consumers: Vec<_> = stream.lanes().map(|lane| lane.attach().unwrap()).collect();
    let mut fanout = stream.fanout().unwrap();
    fanout.publish(batch(1)).unwrap();
    let waiter = {
        let stream = stream.clone();
        std::thread::spawn(move || stream.wait_watermark(Position(100), None))
    };
    fanout.close();
    for c in &mut consumers {
        c.recv().unwrap().unwrap().ack().unwrap();
    }
    // Closed, every lane idle: the watermark can no longer reach 100.
    assert_eq!(
        within(10, "wait_watermark on a settled stream", move || waiter.join().unwrap()),
        Some(Position(1))
    );
}

#[test]
fn w6_a_stream_with_no_lanes_never_waits() {
    let stream = MemoryStream::builder().build().unwrap();
    assert_eq!(
        within(10, "wait_watermark with no lanes", move || stream.wait_watermark(Position(1), None)),
        None
    );
}

#[test]
fn w6_an_async_wait_is_woken_by_the_ack_and_cancelled_when_dropped() {
    let stream = MemoryStream::builder().sink("a").build().unwrap();
    let mut consumer = stream.attach("a").unwrap();
    stream.fanout().unwrap().publish(batch(9)).unwrap();
    let (counter, waker) = CountingWaker::new();
    let mut cx = Context::from_waker(&waker);
    {
        let mut dropped = std::pin::pin!(stream.wait_watermark_async(Position(9)));
        assert!(dropped.as_mut().poll(&mut cx).is_pending());
    }
    let mut wait = std::pin::pin!(stream.wait_watermark_async(Position(9)));
    assert!(wait.as_mut().poll(&mut cx).is_pending());
    assert!(wait.as_mut().poll(&mut cx).is_pending(), "re-polling replaces the registration");
    consumer.try_recv().unwrap().ack().unwrap();
    assert_eq!(counter.wakes(), 1, "the ack wakes the one live registration once");
    assert_eq!(wait.as_mut().poll(&mut cx), std::task::Poll::Ready(Some(Position(9))));
}
