//! Loom model 4: two lanes acking while a reader reads the watermark twice (W3, W4).

use lanestream::prelude::*;
use lanestream::{MemoryStream, Position, Stream};
use loom::sync::Arc;
use loom::thread;

use crate::support::{self, batch, Cells};

/// Model 4: the watermark under concurrent acks.
///
/// Lane `a` holds items 1 and 2, lane `b` item 2, all delivered. Thread X applies a1 (writes a
/// plain cell) and acks it; thread Y applies and acks a2, then applies and acks b2. So lane
/// `a`'s acks race (out of order, either thread may advance both) and the watermark
/// `min(a, b)` goes `None -> Some(1) -> Some(2)` or `None -> Some(2)`. The main thread reads
/// the watermark twice. Checked:
/// - W3: the second read is never lower than the first;
/// - W4: a reader that sees a watermark `>= p` sees every write the sinks made before acking up
///   to `p` (the plain cells: a loom causality violation if the Release/Acquire chain
///   sink -> ack -> advancer -> mark -> watermark is broken anywhere);
/// - at the end the watermark is 2.
///
/// Why the bound suffices: the reader's two loads and each ack's chain are short; a violation
/// of W4 needs the reader to run between an ack and the visibility of the sink's write (one
/// preemption), and a W3 violation needs two advancers to interleave their mark stores (two
/// preemptions). Bound 2 covers both; three threads is the fewest that give two racing ackers
/// plus a reader.
///
/// What loom cannot reach: each mark is a single atomic, and W3 rests on per-location coherence
/// (read-read coherence), which loom enforces but cannot violate; the model can only fail W3
/// if the engine stored marks out of order (two advancers at once).
#[test]
fn watermark_under_concurrent_acks() {
    support::model("watermark_under_concurrent_acks", 3, || {
        let stream =
            MemoryStream::builder().capacity(2).request_capacity(1).sinks(["a", "b"]).build().unwrap();
        let (a, b) = (stream.lane("a").unwrap(), stream.lane("b").unwrap());
        let mut fanout = stream.fanout().unwrap();
        let (mut ca, mut cb) = (a.reattach(), b.reattach());
        // Item 1 to lane a only (b passes it as a gap, acked on the way past), item 2 to both.
        fanout.try_publish_to(0, batch(1)).unwrap();
        fanout.try_publish(batch(2)).unwrap();
        let (a1, a2, b2) = (ca.try_recv().unwrap(), ca.try_recv().unwrap(), cb.try_recv().unwrap());
        // Cells: 0 = a1 applied, 1 = a2 applied, 2 = b2 applied.
        let applied = Arc::new(Cells::new(3));

        let sink = applied.clone();
        let x = thread::spawn(move || {
            sink.write(0, 1);
            a1.ack().unwrap();
        });
        let sink = applied.clone();
        let y = thread::spawn(move || {
            sink.write(1, 1);
            a2.ack().unwrap();
            sink.write(2, 1);
            b2.ack().unwrap();
        });

        let first = stream.watermark();
        let second = stream.watermark();
        assert!(second >= first, "watermark went back: {first:?} then {second:?}");
        if let Some(Position(p)) = second {
            // `>= 1` needs a1 acked (b's gap at 1 was passed before the threads started); `2`
            // needs a2 and b2 acked too.
            assert!(p == 1 || p == 2);
            assert_eq!(applied.read(0), 1, "a1 acked but its write not visible");
            if p == 2 {
                assert_eq!(applied.read(1), 1, "a2 acked but its write not visible");
                assert_eq!(applied.read(2), 1, "b2 acked but its write not visible");
            }
        }
        x.join().unwrap();
        y.join().unwrap();
        assert_eq!(stream.watermark(), Some(Position(2)));
        assert!(stream.is_idle());
    });
}

/// Model 24: `wait_watermark` ([W6](lanestream::contract#w6)) woken by the acks that move the
/// watermark.
///
/// Two lanes, one item published to both; a thread per lane acks its delivery while the main
/// thread blocks in `wait_watermark(1, None)`. The waiter registers on the watermark's list,
/// raises the `WATERMARK_WANTED` wish on every lane's `advance` word, then re-checks; each lane's
/// advancer publishes its mark and then swaps `advance`, seeing the wish and notifying. Checked:
/// the wait returns `Some(1)` (a lost wake-up is a loom deadlock), and the sinks' writes before
/// their acks are visible to the waiter (W4).
///
/// Fails when its protection is removed (weakening row 53): an advancer that reads the wish with
/// a plain load before its mark store, or a waiter that re-checks before raising its wishes,
/// parks for ever in some interleaving.
///
/// Why the bound suffices: three threads; the race is each acker's mark store and `advance` swap
/// against the waiter's wish RMWs and re-check of both marks; one preemption per acker places it
/// anywhere against the waiter, so bound 2 covers both; bound 3 is used for the wait list's lock.
#[test]
fn wait_watermark_is_woken_by_the_ack_that_moves_it() {
    support::model("wait_watermark_is_woken_by_the_ack_that_moves_it", 3, || {
        let stream =
            MemoryStream::builder().capacity(1).request_capacity(1).sinks(["a", "b"]).build().unwrap();
        let mut fanout = stream.fanout().unwrap();
        let mut consumers: Vec<_> = stream.lanes().map(|lane| lane.reattach()).collect();
        fanout.try_publish(batch(1)).unwrap();
        let applied = Arc::new(Cells::new(2));
        let ackers: Vec<_> = consumers
            .iter_mut()
            .enumerate()
            .map(|(i, c)| {
                let d = c.try_recv().unwrap();
                let sink = applied.clone();
                thread::spawn(move || {
                    sink.write(i, 1);
                    d.ack().unwrap();
                })
            })
            .collect();
        assert_eq!(stream.wait_watermark(Position(1), None), Some(Position(1)));
        assert_eq!((applied.read(0), applied.read(1)), (1, 1), "an ack's write not visible to the waiter");
        for t in ackers {
            t.join().unwrap();
        }
    });
}
