//! A sink that applies what it received by the sink rules of `lanestream_postgres::pipeline`
//! (*Applying changes*): index → id → row, the last shape per relation id; what the tests
//! compare with the tables.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lanestream::pipeline::MemorySink;
use lanestream::{Envelope, LaneItem, MemoryStream, Op, Position, Relation};
use lanestream_postgres::live::LiveSource;
use lanestream_postgres::pipeline::{Joiners, Pipeline};
use serde_json::{Map, Value};

/// Runs a pipeline with one in-memory sink (`replica`) until everything committed before `end`
/// is acked; returns what the sink applied (in all its runs). `joiners`: whether a new sink gets
/// the tables' rows as a backfill first ([`Joiners::Backfill`]) or only the changes
/// ([`Joiners::LiveOnly`], so that a check sees what the changes alone give).
pub fn run_to(source: LiveSource, sink: &MemorySink, end: Position, joiners: Joiners) -> Vec<LaneItem> {
    let stream = MemoryStream::builder().sinks(["replica"]).build().expect("stream");
    Pipeline::new(stream)
        .joiners(joiners)
        .sink("replica", {
            let sink = sink.clone();
            move || Ok::<_, std::convert::Infallible>(sink.clone())
        })
        .run(&mut source.until(Some(end)))
        .expect("the pipeline runs");
    sink.applied().clone()
}

/// Every envelope of the batches among `items` (snapshot rows and changes), in order.
pub fn envelopes(items: &[LaneItem]) -> Vec<&Envelope> {
    items
        .iter()
        .filter_map(|i| match i {
            LaneItem::Batch(b) => Some(b.envelopes.iter()),
            _ => None,
        })
        .flatten()
        .collect()
}

/// A sink following the documented rules: index → id → row; the last shape per relation id.
#[derive(Default)]
pub struct Replica {
    pub rows: BTreeMap<String, BTreeMap<String, Map<String, Value>>>,
    pub shapes: BTreeMap<u32, Arc<Relation>>,
    /// Partial updates whose unchanged values the replica did not hold.
    pub unknown: usize,
}

impl Replica {
    pub fn apply(items: &[LaneItem]) -> Replica {
        let mut r = Replica::default();
        for e in envelopes(items) {
            r.change(e);
        }
        r
    }

    pub fn change(&mut self, e: &Envelope) {
        if let Some(rel) = &e.relation {
            self.shape(e.index.as_str(), rel);
        }
        let rows = self.rows.entry(e.index.as_str().to_owned()).or_default();
        match e.op {
            Op::Upsert => {
                // Rule 1: replace, keeping the unchanged columns from the row held at `old_id`
                // (a key change) or `id`.
                let held = rows.get(e.old_id.as_ref().unwrap_or(&e.id));
                let mut row = Map::new();
                for col in &e.unchanged {
                    match held.and_then(|h| h.get(col)) {
                        Some(v) => {
                            row.insert(col.clone(), v.clone());
                        }
                        None => self.unknown += 1,
                    }
                }
                let doc: Map<String, Value> = serde_json::from_slice(&e.document).expect("a JSON object");
                row.extend(doc);
                rows.insert(e.id.clone(), row);
            }
            Op::Delete => {
                rows.remove(&e.id);
            }
            _ => rows.clear(),
        }
    }

    /// Rule 3: a shape that differs from the last of its relation is DDL: renamed columns keep
    /// their position, columns gone are dropped, new ones added (NULL).
    fn shape(&mut self, index: &str, rel: &Arc<Relation>) {
        let Some(old) = self.shapes.insert(rel.id, rel.clone()) else { return };
        if *old == **rel {
            return;
        }
        let (old_names, new_names): (Vec<&str>, Vec<&str>) = (
            old.columns.iter().map(|c| c.name.as_str()).collect(),
            rel.columns.iter().map(|c| c.name.as_str()).collect(),
        );
        let renames: Vec<(&str, &str)> = old_names
            .iter()
            .zip(&new_names)
            .filter(|(o, n)| !new_names.contains(o) && !old_names.contains(n))
            .map(|(o, n)| (*o, *n))
            .collect();
        for row in self.rows.entry(index.to_owned()).or_default().values_mut() {
            for (from, to) in &renames {
                if let Some(v) = row.remove(*from) {
                    row.insert((*to).to_owned(), v);
                }
            }
            row.retain(|k, _| new_names.contains(&k.as_str()));
            for name in &new_names {
                row.entry((*name).to_owned()).or_insert(Value::Null);
            }
        }
    }
}

/// A pipeline with one in-memory sink (`replica`) over `source`, running in a thread until
/// [`stop`](Running::stop)ped.
pub struct Running {
    pub stop: lanestream::pipeline::StopHandle,
    pub metrics: lanestream::pipeline::MetricsHandle,
    pub thread: std::thread::JoinHandle<
        Result<lanestream::pipeline::PipelineReport, lanestream::pipeline::PipelineError>,
    >,
}

impl Running {
    pub fn start(source: LiveSource, sink: &MemorySink, joiners: Joiners) -> Running {
        Running::paced(source, sink, joiners, false)
    }

    /// [`start`](Running::start) at the sink's pace: with `paced`, a lane of 4 items and runs
    /// of one item (a slow sink, [`MemorySink::with_delay`], is then slow per item, and the
    /// source is read, the backfill served, no faster).
    pub fn paced(source: LiveSource, sink: &MemorySink, joiners: Joiners, paced: bool) -> Running {
        Running::start_with(source, sink, joiners, paced, None, Duration::from_secs(30))
    }

    /// [`paced`](Running::paced), the source ending at `end` ([`LiveSource::until`]), a stop
    /// draining for up to `drain` ([`Pipeline::drain_timeout`]).
    pub fn start_with(
        source: LiveSource,
        sink: &MemorySink,
        joiners: Joiners,
        paced: bool,
        end: Option<Position>,
        drain: Duration,
    ) -> Running {
        let builder = MemoryStream::builder().sinks(["replica"]);
        let builder = if paced { builder.capacity(4) } else { builder };
        let mut pipeline =
            Pipeline::new(builder.build().expect("stream")).joiners(joiners).drain_timeout(drain);
        if paced {
            pipeline = pipeline.max_run(1);
        }
        let pipeline = pipeline.sink("replica", {
            let sink = sink.clone();
            move || Ok::<_, std::convert::Infallible>(sink.clone())
        });
        let (stop, metrics) = (pipeline.stop_handle(), pipeline.metrics());
        let thread = std::thread::spawn(move || pipeline.run(&mut source.until(end)));
        Running { stop, metrics, thread }
    }

    /// Whether the pipeline ended (with an error: nothing stopped it).
    pub fn finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Waits until the sink acked everything committed before `end`, then stops.
    pub fn stop_at(
        self,
        end: Position,
    ) -> Result<lanestream::pipeline::PipelineReport, lanestream::pipeline::PipelineError> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut c = super::sql();
        while self.metrics.snapshot().confirmed.is_none_or(|p| p < end) && !self.thread.is_finished() {
            assert!(std::time::Instant::now() < deadline, "the pipeline did not catch up with {end}");
            // A heartbeat (WAL the stream sends): the server then says it sent everything
            // before it, without waiting for its next keepalive.
            c.execute("SELECT pg_logical_emit_message(false, 'lanestream_heartbeat', '')", &[])
                .expect("heartbeat");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        self.stop.stop();
        self.thread.join().expect("the pipeline thread")
    }
}

/// Waits (up to `within`) until `done`.
pub fn eventually(what: &str, within: std::time::Duration, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Whether `sink` got a backfill's `SnapshotComplete`.
pub fn complete(sink: &MemorySink) -> bool {
    sink.applied().iter().any(|i| matches!(i, LaneItem::SnapshotComplete { .. }))
}
