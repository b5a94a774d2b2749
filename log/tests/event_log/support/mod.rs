//! Helpers shared by the log's integration tests (the modules of `tests/event_log/`).
#![allow(dead_code)]

/// The name libtest gives the test `name` of the module at `module_path` (`module_path!()`):
/// its path below the binary's root, which `--exact` matches (a test that runs itself again in a
/// child process passes it).
pub fn test_name(module_path: &str, name: &str) -> String {
    match module_path.split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    }
}

use lanestream::prelude::*;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use lanestream_log::{Event, LogPosition, Query, ReadHandle, SequencedEvent};

/// An event of type `ty` with `tags` and a payload naming both.
pub fn ev(ty: &str, tags: &[&str]) -> Event {
    Event::new(ty, tags.iter().copied(), Bytes::from(format!("{ty}{tags:?}"))).unwrap()
}

/// An event with an explicit payload.
pub fn ev_data(ty: &str, tags: &[&str], data: impl Into<Bytes>) -> Event {
    Event::new(ty, tags.iter().copied(), data).unwrap()
}

/// Position `n` (at least 1).
pub fn pos(n: u64) -> LogPosition {
    LogPosition::new(n).unwrap()
}

/// The positions of `events`, as numbers.
pub fn positions(events: &[SequencedEvent]) -> Vec<u64> {
    events.iter().map(|s| s.position.get()).collect()
}

/// Every event of the log.
pub fn all(log: &ReadHandle) -> Vec<SequencedEvent> {
    log.read(&Query::All, None, usize::MAX).unwrap().into_events()
}

/// A fresh, empty directory for one test; it and everything in it are removed when the value
/// drops (also when the test fails), so runs leave nothing behind in the temp space.
pub struct TestDir(tempfile::TempDir);

impl std::ops::Deref for TestDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.0.path()
    }
}

impl AsRef<Path> for TestDir {
    fn as_ref(&self) -> &Path {
        self.0.path()
    }
}

/// A fresh, empty directory named after `name`, removed on drop.
pub fn temp_dir(name: &str) -> TestDir {
    TestDir(tempfile::Builder::new().prefix(&format!("lanestream-log-{name}-")).tempdir().unwrap())
}

/// The longest any test waits for something that should happen at once.
pub const LIMIT: Duration = Duration::from_secs(20);

/// Runs a [`LogSource`](lanestream_log::LogSource) over `log` into `stream`'s lanes with the
/// pipeline driver on its own thread until the log closes; the thread returns the source's stats
/// (the driver closes the lanes once the sinks acked everything).
pub fn spawn_source(
    log: &ReadHandle,
    stream: &lanestream::MemoryStream,
) -> std::thread::JoinHandle<lanestream_log::SourceStats> {
    let mut source = lanestream_log::LogSource::builder(log.clone()).build(stream).unwrap();
    let pipeline = lanestream::pipeline::Pipeline::new(stream.clone());
    std::thread::spawn(move || {
        pipeline.run(&mut source).unwrap();
        source.stats().clone()
    })
}

/// Drives `source` with the pipeline driver (no local sink engine: the test's consumers are
/// the sinks) on a thread of its own until `done` holds, then stops it: a stop is a pause, the
/// lanes stay open (it does not wait for acks). Returns the source and the run's report.
pub fn drive(
    stream: &lanestream::MemoryStream,
    mut source: lanestream_log::LogSource,
    done: impl Fn() -> bool,
) -> (lanestream_log::LogSource, lanestream::pipeline::PipelineReport) {
    let pipeline = lanestream::pipeline::Pipeline::new(stream.clone())
        .tick(Duration::from_millis(1))
        .drain_timeout(Duration::ZERO);
    let stop = pipeline.stop_handle();
    let runner = std::thread::spawn(move || {
        let report = pipeline.run(&mut source);
        (source, report)
    });
    let deadline = std::time::Instant::now() + LIMIT;
    while !done() && !runner.is_finished() {
        assert!(std::time::Instant::now() < deadline, "the driver did not get there in {LIMIT:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.stop();
    let (source, report) = runner.join().unwrap();
    (source, report.unwrap())
}

/// One thread per lane of `stream`: receives every item until the lane closes, acking each;
/// returns what `keep` made of the items, in order.
pub fn spawn_sinks<R: Send + 'static>(
    stream: &lanestream::MemoryStream,
    keep: fn(&lanestream::LaneItem) -> Option<R>,
) -> Vec<std::thread::JoinHandle<Vec<R>>> {
    stream
        .lanes()
        .map(|lane| {
            let mut consumer = lane.attach().unwrap();
            std::thread::spawn(move || {
                let mut got = Vec::new();
                while let Some(d) = consumer.recv().unwrap() {
                    got.extend(keep(d.item()));
                    d.ack().unwrap();
                }
                got
            })
        })
        .collect()
}

/// Where the records of a segment's bytes start, walked by the documented frame (`len: u32 |
/// crc: u32 | payload (len bytes)`, after the 16-byte header), and where the walk ends: the
/// segment's length for a whole one.
pub fn record_starts(segment: &[u8]) -> (Vec<usize>, usize) {
    let mut starts = Vec::new();
    let mut at = 16;
    while at < segment.len() {
        starts.push(at);
        at += 8 + u32::from_le_bytes(segment[at..at + 4].try_into().unwrap()) as usize;
    }
    (starts, at)
}

/// CRC32C, bitwise (the tests share no code with the log's reader).
pub fn crc32c_of(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 { (c >> 1) ^ 0x82F6_3B78 } else { c >> 1 };
        }
    }
    !c
}
