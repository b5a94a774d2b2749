//! Loom model 8: the request lane — two senders, one consumer, with redelivery (R1, R2).

use lanestream::prelude::*;
use lanestream::{MemoryStream, Request, SinkName, Stream};
use loom::thread;

use crate::support;

fn backfill(sink: &str) -> Request {
    Request::backfill(SinkName::new(sink).unwrap(), Vec::new())
}

fn sink_of(r: &Request) -> String {
    match r {
        Request::Backfill { sink, .. } => sink.as_str().to_owned(),
        other => panic!("the model sends only backfill requests, got {other:?}"),
    }
}

/// Model 8: two sink engines send backfill requests concurrently (sender 1 sends `s1` then
/// `s3`, sender 2 sends `s2`) into a request lane of capacity 2, so a sender may wait for room;
/// the ingest engine receives the first request, nacks it (a crash mid-snapshot), must get it
/// again at once (attempt 2, before any other request: L2, even when the other requests are
/// already queued), acks it, then receives and acks the other two. Checked: every request
/// arrives exactly once as sent (plus the one redelivery), each sender's requests in its order,
/// the senders' shared producer state (behind its lock) never loses or duplicates a request,
/// requests never move the watermark (W2), and the lane ends idle.
///
/// Why the bound suffices: three threads; the races are sender vs sender on the producer lock
/// (ordered by the lock, one preemption to swap them), the nack's release vs a publish landing
/// behind it, and a waiting sender vs the ack that makes room (one store-buffer race). Each
/// needs one preemption; bound 2 covers any two of them together (bound 3 passes too:
/// 289,687 executions, about 25 s, which would double the run time of all models).
#[test]
fn request_lane_two_senders_one_consumer_with_redelivery() {
    support::model("request_lane_two_senders_one_consumer_with_redelivery", 2, || {
        let stream = MemoryStream::builder().capacity(1).request_capacity(2).sink("a").build().unwrap();
        let requests = stream.requests();
        let senders: Vec<_> = [&["s1", "s3"][..], &["s2"][..]]
            .into_iter()
            .map(|names| {
                let sender = requests.sender();
                thread::spawn(move || {
                    for name in names {
                        sender.publish(backfill(name)).unwrap();
                    }
                })
            })
            .collect();
        let mut ingest = requests.reattach();

        let first = ingest.recv().unwrap().expect("not closed");
        assert_eq!(first.attempt(), 1);
        let name = sink_of(&first);
        first.nack();
        let again = ingest.recv().unwrap().expect("not closed");
        assert_eq!(sink_of(&again), name, "the released request comes back before anything new");
        assert_eq!(again.attempt(), 2);
        again.ack().unwrap();

        let mut seen = vec![name];
        for _ in 0..2 {
            let next = ingest.recv().unwrap().expect("not closed");
            assert_eq!(next.attempt(), 1);
            seen.push(sink_of(&next));
            next.ack().unwrap();
        }
        let pos = |n: &str| seen.iter().position(|s| s == n).expect("every request arrives");
        assert!(pos("s1") < pos("s3"), "one sender's requests arrive in its order: {seen:?}");
        seen.sort();
        assert_eq!(seen, ["s1", "s2", "s3"], "each request exactly once");

        for s in senders {
            s.join().unwrap();
        }
        let stats = requests.stats();
        assert_eq!((stats.published, stats.acked_items, stats.redelivered), (3, 3, 1));
        assert!(stream.is_idle());
        assert_eq!(stream.watermark(), None, "requests never move the watermark (W2)");
    });
}
