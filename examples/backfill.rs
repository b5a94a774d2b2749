//! Backfill over the request lane, and what a crash mid-snapshot does.
//!
//! A sink engine asks the ingest engine for a snapshot of an index with `Request::Backfill`
//! (through `stream.requests().sender()`). The ingest engine consumes the request lane
//! (`stream.requests().attach()`), publishes the snapshot as batches without a position, then
//! `LaneItem::SnapshotComplete`, to the asking sink's lane only (`Fanout::publish_to`: the other
//! lanes pass them without a delivery), and acks the request only after that: the protocol of
//! rule R2.
//!
//! The first ingest engine crashes half-way through the snapshot, before acking; its restarted
//! successor takes the request lane over with `reattach()` and receives the same request again
//! (`attempt() == 2`), so the snapshot starts over and the sink sees some rows twice (sinks apply
//! snapshot rows idempotently). A late ack from the crashed engine's leftover worker is refused
//! (`AckError::Detached`) rather than counted. Snapshot batches and `SnapshotComplete` carry no position, so
//! acking them never moves the watermark; only the live batches do. Every step is asserted; a
//! failed assertion exits non-zero.
//!
//! ```text
//! cargo run --example backfill
//! ```

use lanestream::prelude::*;
use std::sync::Arc;

use bytes::Bytes;
use lanestream::{
    AckError, Batch, Consumer, Envelope, IndexName, LaneItem, MemoryStream, Op, Position, Request, Stream,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let stream = MemoryStream::builder().capacity(16).sinks(["search", "cache"]).build()?;
    let (mut search, mut cache) = (stream.attach("search")?, stream.attach("cache")?);
    let users = IndexName::new("users")?;
    let live = |p: u64| LaneItem::Batch(Batch::new(Some(Position(p)), Vec::new().into()));

    // The search sink's lane, by its index in the stream's sinks (for `publish_to`).
    let search_lane = stream.sinks().iter().position(|s| s.as_str() == "search").ok_or("no search lane")?;

    // Live traffic first, through the stream's one fan-out: both sinks ack position 100, so the
    // watermark is 100.
    stream.fanout()?.publish(live(100))?; // the fan-out is dropped here; a restarted engine claims it again
    apply_all("search", &mut search, &stream)?;
    apply_all("cache", &mut cache, &stream)?;
    assert_eq!(stream.watermark(), Some(Position(100)));

    // The search sink asks for a backfill of `users` (any number of senders, any thread).
    stream.requests().sender().publish(Request::backfill("search".parse()?, vec![users.clone()]))?;

    // Ingest engine #1 takes the request, hands it to a snapshot worker, publishes one snapshot
    // chunk, then crashes: its request consumer and its fan-out go away, and the worker, stuck,
    // still holds the request's ack handle. Nothing acked the request.
    let stuck_worker = {
        let mut requests = stream.requests().attach()?;
        let request = requests.try_recv()?;
        println!("ingest #1: got {:?} (attempt {})", request.item(), request.attempt());
        assert_eq!(request.attempt(), 1);
        stream.fanout()?.publish_to(search_lane, snapshot_chunk(&users, 1..=3))?;
        println!("ingest #1: crashed mid-snapshot, request not acked");
        request.into_handle()
    };
    apply_all("search", &mut search, &stream)?; // the sink applies chunk 1; the watermark stays

    // Ingest engine #2 (restarted). `reattach()` never fails and takes back every request the
    // previous consumer had not acked (`attach()` would do the same here, as #1's consumer is
    // gone, but would refuse if a hung #1 were still attached).
    let mut requests = stream.requests().reattach();
    let request = requests.try_recv()?;
    println!("ingest #2: got {:?} again (attempt {})", request.item(), request.attempt());
    assert_eq!(request.attempt(), 2, "the unacked request must be redelivered");
    // The crashed engine's worker wakes up and acks: refused, the request now belongs to #2.
    let late = stuck_worker.ack();
    println!("ingest #1's worker: late ack refused: {}", late.as_ref().unwrap_err());
    assert_eq!(late, Err(AckError::Detached));
    let Request::Backfill { sink, indexes, .. } = request.item().clone() else {
        return Err(format!("a request this example does not serve: {:?}", request.item()).into());
    };
    let lane = stream.sinks().iter().position(|s| *s == sink).ok_or("a request for an unknown sink")?;
    let mut fanout = stream.fanout()?;
    fanout.publish_to(lane, snapshot_chunk(&users, 1..=3))?; // the snapshot starts over
    fanout.publish_to(lane, snapshot_chunk(&users, 4..=5))?;
    fanout.publish_to(lane, LaneItem::SnapshotComplete { indexes })?;
    request.ack()?; // only now: SnapshotComplete is on the sink's lane
    println!("ingest #2: snapshot complete, request acked");

    // Live traffic goes on, to every lane, after the snapshot on the sink's lane.
    fanout.publish(live(200))?;
    apply_all("cache", &mut cache, &stream)?;
    apply_all("search", &mut search, &stream)?;

    assert_eq!(stream.watermark(), Some(Position(200)));
    assert!(stream.requests().is_idle() && stream.is_idle());
    println!("ok: request redelivered after the crash, snapshot batches never moved the watermark");
    Ok(())
}

/// Snapshot rows of `index` with the given ids: a batch with no position.
fn snapshot_chunk(index: &IndexName, ids: std::ops::RangeInclusive<u32>) -> LaneItem {
    let rows: Vec<Envelope> = ids
        .map(|id| Envelope {
            index: index.clone(),
            id: id.to_string(),
            op: Op::Upsert,
            position: None, // snapshot rows have no position
            document: Bytes::from(format!(r#"{{"id":{id}}}"#)),
            built_at_micros: None,
            relation: None,
            old_id: None,
            unchanged: Vec::new(),
        })
        .collect();
    LaneItem::Batch(Batch::new(None, Arc::from(rows)))
}

/// A sink engine's loop body: receive what is there, apply (print) it, ack it. Checks that only
/// positioned batches move the watermark.
fn apply_all(
    sink: &str,
    consumer: &mut Consumer<LaneItem>,
    stream: &MemoryStream,
) -> Result<(), Box<dyn std::error::Error>> {
    while let Ok(delivery) = consumer.try_recv() {
        let before = stream.watermark();
        let what = match delivery.item() {
            LaneItem::Batch(b) if b.position.is_none() => {
                let ids: Vec<&str> = b.envelopes.iter().map(|e| e.id.as_str()).collect();
                format!("snapshot rows {ids:?}")
            }
            LaneItem::Batch(b) => format!("live batch at {}", b.position.map_or(0, |p| p.0)),
            LaneItem::SnapshotComplete { indexes } => format!("SnapshotComplete {indexes:?}"),
            other => format!("{other:?}"),
        };
        let positioned = delivery.position().is_some();
        delivery.ack()?;
        let after = stream.watermark();
        println!("  {sink:>6}: applied {what:<34} watermark {} -> {}", show(before), show(after));
        if !positioned {
            assert_eq!(before, after, "an unpositioned item moved the watermark");
        }
    }
    Ok(())
}

fn show(p: Option<Position>) -> String {
    p.map_or_else(|| "none".to_owned(), |p| p.0.to_string())
}
