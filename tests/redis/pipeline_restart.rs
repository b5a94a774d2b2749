//! Adversarial: the pipeline driver's restart over a Redis stream's lanes that hold published,
//! unacked items beyond the watermark ([`Pipeline::run`], "Resuming"): an ingest crashes (its
//! source fails) again and again, mid-way through large transactions published in chunks, with
//! one sink slow, and each restarted source resumes from the position it was confirmed last (as
//! a replication slot does). Every sink must apply every envelope once, in order.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lanestream::pipeline::{
    MemorySink, Pipeline, PipelineError, PipelineReport, SinkStart, Source, SourceItem, SourceStart,
};
use lanestream::{Batch, Envelope, IndexName, LaneItem, Op, Position, RedisStream, Request};

use crate::redis_support::unique_name;

/// Envelopes `offset..offset + n` of the transaction committing at `p`; positioned when `last`.
fn batch(p: u64, offset: u64, n: u64, last: bool) -> Batch {
    let envelopes: Arc<[Envelope]> = (offset..offset + n)
        .map(|k| Envelope {
            index: IndexName::new("t").unwrap(),
            id: format!("{p}-{k}"),
            op: Op::Upsert,
            position: Some(Position(p)),
            document: bytes::Bytes::from_static(b"{}"),
            built_at_micros: None,
            relation: None,
            old_id: None,
            unchanged: Vec::new(),
        })
        .collect();
    Batch { position: last.then_some(Position(p)), changes: n, offset, envelopes }
}

/// Ten transactions; 30 and 60 in three chunks.
fn workload() -> Vec<Batch> {
    let mut items = Vec::new();
    for p in (10..=100).step_by(10) {
        match p {
            30 | 60 => items.extend([batch(p, 0, 2, false), batch(p, 2, 2, false), batch(p, 4, 1, true)]),
            _ => items.push(batch(p, 0, 1 + (p / 10) % 2, true)),
        }
    }
    items
}

fn transaction_of(b: &Batch) -> Option<Position> {
    b.position.or_else(|| b.envelopes.first().and_then(|e| e.position))
}

/// Resumes at the first batch of the first transaction past its confirmed position; fails on
/// the call after handing over `crash_after` items.
struct Replaying {
    items: Vec<Batch>,
    next: usize,
    confirmed: Arc<Mutex<Option<Position>>>,
    crash_after: Option<usize>,
    handed: usize,
}

impl Source for Replaying {
    type Error = std::io::Error;

    fn next(&mut self, _: Duration) -> Result<Option<SourceItem>, Self::Error> {
        if self.crash_after.is_some_and(|n| self.handed >= n) {
            return Err(std::io::Error::other("the source crashed"));
        }
        let Some(b) = self.items.get(self.next) else { return Ok(Some(SourceItem::End)) };
        self.next += 1;
        self.handed += 1;
        Ok(Some(SourceItem::Change(b.clone())))
    }

    fn confirm(&mut self, p: Position) -> Result<(), Self::Error> {
        let mut c = self.confirmed.lock().unwrap();
        assert!(c.is_none_or(|c| p >= c), "confirmed backwards: {p:?} after {c:?}");
        *c = Some(p);
        Ok(())
    }

    fn backfill(&mut self, request: Request) -> Result<(), Self::Error> {
        Err(std::io::Error::other(format!("no backfill here: {request:?}")))
    }

    fn start(&mut self, _: &[SinkStart<'_>]) -> Result<SourceStart, Self::Error> {
        Ok(SourceStart::default())
    }
}

fn run_once(
    stream: &RedisStream,
    items: &[Batch],
    confirmed: &Arc<Mutex<Option<Position>>>,
    recorded: &[MemorySink; 2],
    delays: [Duration; 2],
    crash_after: Option<usize>,
) -> Result<PipelineReport, PipelineError> {
    let mut pipeline = Pipeline::new(stream.clone()).tick(Duration::from_millis(2)).max_run(2);
    for ((sink, r), delay) in ["first", "second"].into_iter().zip(recorded).zip(delays) {
        let r = r.clone();
        pipeline =
            pipeline.sink(sink, move || Ok::<_, std::convert::Infallible>(r.clone().with_delay(delay)));
    }
    let c = *confirmed.lock().unwrap();
    let next = items.iter().position(|b| transaction_of(b) > c).unwrap_or(items.len());
    let mut source =
        Replaying { items: items.to_vec(), next, confirmed: confirmed.clone(), crash_after, handed: 0 };
    pipeline.run(&mut source)
}

fn crash_and_restart(url: &str, crashes: &[usize], delays: [Duration; 2]) {
    let items = workload();
    let stream = RedisStream::builder(url, unique_name("adv_restart"))
        .capacity(8)
        .request_capacity(4)
        .sinks(["first", "second"])
        .build()
        .unwrap();
    let recorded = [MemorySink::default(), MemorySink::default()];
    let confirmed = Arc::new(Mutex::new(None));
    let mut ended = None;
    for &n in crashes {
        match run_once(&stream, &items, &confirmed, &recorded, delays, Some(n)) {
            Err(PipelineError::Source(e)) => assert!(e.to_string().contains("crashed"), "{e}"),
            Ok(report) => {
                ended = Some(report); // fewer than `n` items left: the end (lanes closed)
                break;
            }
            Err(e) => panic!("crash after {n}: {e}"),
        }
    }
    let report = match ended {
        Some(r) => r,
        None => run_once(&stream, &items, &confirmed, &recorded, delays, None).expect("the last run ends"),
    };
    assert_eq!(report.confirmed, Some(Position(100)), "{report:?}");
    let mut whole = Vec::new();
    for b in &items {
        whole.extend((0..b.envelopes.len() as u64).map(|k| (transaction_of(b).unwrap().0, b.offset + k)));
    }
    let positions: Vec<u64> = items.iter().filter_map(|b| b.position).map(|p| p.0).collect();
    for (sink, r) in ["first", "second"].iter().zip(&recorded) {
        let applied = r.applied().clone();
        let mut envelopes = Vec::new();
        for item in &applied {
            if let LaneItem::Batch(b) = item {
                for (k, e) in b.envelopes.iter().enumerate() {
                    envelopes.push((e.position.unwrap().0, b.offset + k as u64));
                }
            }
        }
        assert_eq!(envelopes, whole, "{sink}: every envelope once, in order (crashes {crashes:?})");
        let txns: Vec<u64> = applied.iter().filter_map(|i| i.position()).map(|p| p.0).collect();
        assert_eq!(txns, positions, "{sink}: every transaction once, in order");
    }
}

#[test]
fn adv_redis_crashed_ingests_restarted_over_lanes_holding_unacked_items_apply_everything_once() {
    let url = server!();
    let slow = Duration::from_millis(3);
    for n in [1, 3, 4, 5, 7, 9, 10] {
        crash_and_restart(&url, &[n], [Duration::ZERO, slow]);
    }
    crash_and_restart(&url, &[2, 4, 5, 8, 12], [slow, Duration::ZERO]);
}

/// A broker deployment: the sink engines run on (`run_sink`, as in processes of their own)
/// while the ingest (a `Pipeline` with no local sink) crashes and restarts again and again
/// over their lanes, each source resuming from its confirmed position; at the source's end the
/// lanes close and the engines drain and end. Every envelope once, in order, on both sinks.
#[test]
fn adv_redis_an_ingest_restarted_under_running_sink_engines_feeds_each_every_envelope_once() {
    let url = server!();
    for crashes in [&[3usize, 4, 5][..], &[1, 2, 6, 2], &[9, 1, 1, 1, 4]] {
        let items = workload();
        let stream = RedisStream::builder(&url, unique_name("adv_remote"))
            .capacity(4)
            .request_capacity(4)
            .sinks(["first", "second"])
            .build()
            .unwrap();
        let recorded = [MemorySink::default(), MemorySink::default()];
        let engines: Vec<_> = ["first", "second"]
            .into_iter()
            .zip(recorded.iter().cloned())
            .zip([Duration::ZERO, Duration::from_millis(3)])
            .map(|((sink, r), delay)| {
                let stream = stream.clone();
                std::thread::spawn(move || {
                    lanestream::pipeline::run_sink(
                        &stream,
                        sink,
                        move || Ok::<_, std::convert::Infallible>(r.clone().with_delay(delay)),
                        lanestream::pipeline::RetryPolicy::default(),
                        2,
                        &lanestream::pipeline::StopHandle::new(),
                    )
                })
            })
            .collect();
        let confirmed = Arc::new(Mutex::new(None));
        let run = |crash_after: Option<usize>| {
            let c = *confirmed.lock().unwrap();
            let next = items.iter().position(|b| transaction_of(b) > c).unwrap_or(items.len());
            let mut source = Replaying {
                items: items.clone(),
                next,
                confirmed: confirmed.clone(),
                crash_after,
                handed: 0,
            };
            Pipeline::new(stream.clone()).tick(Duration::from_millis(2)).run(&mut source)
        };
        let mut ended = None;
        for &n in crashes {
            match run(Some(n)) {
                Err(PipelineError::Source(e)) => assert!(e.to_string().contains("crashed"), "{e}"),
                Ok(report) => {
                    ended = Some(report);
                    break;
                }
                Err(e) => panic!("crash after {n}: {e}"),
            }
            std::thread::sleep(Duration::from_millis(5)); // the engines go on meanwhile
        }
        let report = match ended {
            Some(r) => r,
            None => run(None).expect("the last run ends"),
        };
        assert_eq!(report.confirmed, Some(Position(100)), "{report:?}");
        for engine in engines {
            engine.join().unwrap().expect("the engine drains its closed lane and ends");
        }
        let mut whole = Vec::new();
        for b in &items {
            whole.extend((0..b.envelopes.len() as u64).map(|k| (transaction_of(b).unwrap().0, b.offset + k)));
        }
        for (sink, r) in ["first", "second"].iter().zip(&recorded) {
            let mut envelopes = Vec::new();
            for item in r.applied().iter() {
                if let LaneItem::Batch(b) = item {
                    for (k, e) in b.envelopes.iter().enumerate() {
                        envelopes.push((e.position.unwrap().0, b.offset + k as u64));
                    }
                }
            }
            assert_eq!(envelopes, whole, "{sink}: every envelope once, in order (crashes {crashes:?})");
        }
    }
}
