//! The driver over a [`MemoryStream`]: resuming over lanes that hold published, unacked items
//! beyond the watermark (see [`Pipeline::run`], "Resuming").
//!
//! The in-memory backend's lanes read one ring and share one publish sequence (a
//! `publish_to` is a gap for the other lanes, and moves every lane's last published position),
//! so its lanes never differ in what they hold: the tests here are the restarts it can have.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use super::{Pipeline, PipelineReport, Sink, SinkStart, SinkState, Source, SourceItem, SourceStart};
use crate::{Batch, Envelope, IndexName, LaneItem, MemoryStream, Op, Position, Request, Stream};

/// Hands over its items, then the end.
struct Items(VecDeque<SourceItem>);

impl Source for Items {
    type Error = std::io::Error;

    fn next(&mut self, _: Duration) -> Result<Option<SourceItem>, Self::Error> {
        Ok(Some(self.0.pop_front().unwrap_or(SourceItem::End)))
    }

    fn confirm(&mut self, _: Position) -> Result<(), Self::Error> {
        Ok(())
    }

    fn backfill(&mut self, request: Request) -> Result<(), Self::Error> {
        Err(std::io::Error::other(format!("no backfill here: {request:?}")))
    }

    fn start(&mut self, _: &[SinkStart<'_>]) -> Result<SourceStart, Self::Error> {
        Ok(SourceStart::default())
    }
}

/// What a sink applied, and its state (kept across instances, as a durable sink's).
#[derive(Clone, Default)]
struct Recorded {
    applied: Arc<Mutex<Vec<LaneItem>>>,
    state: Arc<Mutex<Option<SinkState>>>,
}

impl Recorded {
    /// The transactions applied (their positions), in order.
    fn transactions(&self) -> Vec<u64> {
        self.applied.lock().unwrap().iter().filter_map(|i| i.position()).map(|p| p.0).collect()
    }

    /// Envelopes applied, as `(commit position, offset in the transaction)`.
    fn envelopes(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for item in self.applied.lock().unwrap().iter() {
            if let LaneItem::Batch(b) = item {
                for (k, e) in b.envelopes.iter().enumerate() {
                    out.push((e.position.unwrap().0, b.offset + k as u64));
                }
            }
        }
        out
    }
}

struct Recorder(Recorded);

impl Sink for Recorder {
    type Error = std::io::Error;

    fn state(&mut self) -> Result<Option<SinkState>, Self::Error> {
        Ok(self.0.state.lock().unwrap().clone())
    }

    fn apply(&mut self, items: &[LaneItem]) -> Result<(), Self::Error> {
        self.0.applied.lock().unwrap().extend_from_slice(items);
        Ok(())
    }

    fn commit(&mut self, state: &SinkState) -> Result<(), Self::Error> {
        *self.0.state.lock().unwrap() = Some(state.clone());
        Ok(())
    }
}

/// Envelopes `offset..offset + n` of the transaction committing at `p`; positioned (its last
/// batch) when `last`.
fn batch(p: u64, offset: u64, n: u64, last: bool) -> Batch {
    let envelopes: Arc<[Envelope]> = (offset..offset + n)
        .map(|k| Envelope {
            index: IndexName::new("t").unwrap(),
            id: format!("{p}-{k}"),
            op: Op::Upsert,
            position: Some(Position(p)),
            document: Bytes::new(),
            built_at_micros: None,
        })
        .collect();
    Batch { position: last.then_some(Position(p)), changes: n, offset, envelopes }
}

fn txn(p: u64) -> Batch {
    batch(p, 0, 1, true)
}

/// Runs a pipeline with a recording sink engine per lane over `items`.
fn run(stream: &MemoryStream, items: Vec<Batch>) -> (PipelineReport, Vec<Recorded>) {
    let mut pipeline = Pipeline::new(stream.clone()).tick(Duration::from_millis(2));
    let mut recorded = Vec::new();
    for sink in stream.sinks() {
        let r = Recorded::default();
        recorded.push(r.clone());
        pipeline = pipeline.sink(sink.as_str(), move || Ok::<_, std::io::Error>(Recorder(r.clone())));
    }
    let mut source = Items(items.into_iter().map(SourceItem::Change).collect());
    (pipeline.run(&mut source).expect("the pipeline runs"), recorded)
}

fn published(stream: &MemoryStream, sink: &str) -> (u64, Option<Position>) {
    let s = stream.stats(sink).unwrap();
    (s.published, s.last_published)
}

/// Every lane holds what the source sends again (a restarted ingest over a broker's lanes):
/// before per-lane publishing, the driver's fan-out publish of 10 was refused with
/// `PositionRegressed` and the pipeline stopped with an error.
#[test]
fn a_restart_over_lanes_that_hold_the_batches_is_not_refused_with_position_regressed() {
    let stream = MemoryStream::builder().capacity(16).sinks(["a", "b"]).build().unwrap();
    {
        let mut fanout = stream.fanout().unwrap();
        fanout.publish(LaneItem::Batch(txn(10))).unwrap();
        fanout.publish(LaneItem::Batch(txn(20))).unwrap();
    }
    let (report, recorded) = run(&stream, vec![txn(10), txn(20), txn(30)]);
    assert_eq!((report.skipped, report.transactions), (2, 1));
    for sink in ["a", "b"] {
        assert_eq!(published(&stream, sink), (3, Some(Position(30))), "{sink}: nothing published twice");
    }
    for r in &recorded {
        assert_eq!(r.transactions(), [10, 20, 30]);
    }
    assert!(stream.is_idle());
}

/// An earlier ingest stopped in the middle of a large transaction (30): what every lane holds is
/// skipped, chunks of a transaction the lanes hold included; the chunks of the transaction the
/// lanes lack go again (one of them a second time: its sink's state covers it, so every envelope
/// is applied once).
#[test]
fn chunks_go_by_their_transaction_to_the_lanes_that_lack_it() {
    let stream = MemoryStream::builder().capacity(16).sinks(["a", "b"]).build().unwrap();
    let earlier = [txn(10), batch(20, 0, 2, false), batch(20, 2, 1, true), batch(30, 0, 1, false)];
    {
        let mut fanout = stream.fanout().unwrap();
        for b in &earlier {
            fanout.publish(LaneItem::Batch(b.clone())).unwrap();
        }
    }
    let mut items = earlier.to_vec();
    items.extend([batch(30, 1, 1, false), batch(30, 2, 1, true)]);
    let (report, recorded) = run(&stream, items);
    assert_eq!((report.skipped, report.chunks, report.transactions), (3, 2, 1));
    assert_eq!(report.confirmed, Some(Position(30)));
    for sink in ["a", "b"] {
        assert_eq!(
            published(&stream, sink),
            (7, Some(Position(30))),
            "{sink}: 4 held, then 30's three batches"
        );
    }
    let whole = [(10, 0), (20, 0), (20, 1), (20, 2), (30, 0), (30, 1), (30, 2)];
    for r in &recorded {
        assert_eq!(r.envelopes(), whole, "every envelope applied once, in order");
        assert_eq!(r.transactions(), [10, 20, 30]);
    }
}
