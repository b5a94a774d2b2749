//! Loom model 4: two lanes acking while a reader reads the watermark twice (W3, W4).

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
        let (mut pa, mut pb) = (a.producer().unwrap(), b.producer().unwrap());
        let (mut ca, mut cb) = (a.reattach(), b.reattach());
        pa.try_publish(batch(1)).unwrap();
        pa.try_publish(batch(2)).unwrap();
        pb.try_publish(batch(2)).unwrap();
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
            // b's only item is 2, so any watermark means b2 was acked; `>= 1` needs a1 acked.
            assert!(p == 1 || p == 2);
            assert_eq!(applied.read(0), 1, "a1 acked but its write not visible");
            assert_eq!(applied.read(2), 1, "b2 acked but its write not visible");
            if p == 2 {
                assert_eq!(applied.read(1), 1, "a2 acked but its write not visible");
            }
        }
        x.join().unwrap();
        y.join().unwrap();
        assert_eq!(stream.watermark(), Some(Position(2)));
        assert!(stream.is_idle());
    });
}
