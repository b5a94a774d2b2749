//! Helpers shared by the integration tests (`mod common;` in each test file): item builders,
//! wakers that count, and a watchdog so a lost wake-up fails a test instead of hanging CI.
#![allow(dead_code)]

use lanestream::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Wake, Waker};
use std::thread;
use std::time::Duration;

use bytes::Bytes;
use lanestream::{
    Batch, Consumer, Delivery, Envelope, IndexName, Item, Lane, LaneItem, MemoryStream, Op, Position,
    Request, Run, SinkName, Stream,
};

/// A positioned batch with no envelopes.
pub fn batch(position: u64) -> LaneItem {
    LaneItem::Batch(Batch::new(Some(Position(position)), Vec::new().into()))
}

/// A snapshot batch (no position) with no envelopes.
pub fn snapshot() -> LaneItem {
    LaneItem::Batch(Batch::new(None, Vec::new().into()))
}

/// `SnapshotComplete` for one index.
pub fn complete(index: &str) -> LaneItem {
    LaneItem::SnapshotComplete { indexes: vec![IndexName::new(index).unwrap()] }
}

/// `Backfill { sink, indexes: [index], after: None }`.
pub fn backfill(sink: &str, index: &str) -> Request {
    Request::backfill(SinkName::new(sink).unwrap(), vec![IndexName::new(index).unwrap()])
}

/// One upsert envelope.
pub fn envelope(index: &str, id: &str, position: Option<u64>, document: &'static [u8]) -> Envelope {
    Envelope {
        index: IndexName::new(index).unwrap(),
        id: id.into(),
        op: Op::Upsert,
        position: position.map(Position),
        document: Bytes::from_static(document),
        built_at_micros: None,
        relation: None,
        old_id: None,
        unchanged: Vec::new(),
    }
}

/// A document owner whose drop counts itself in `drops`, runs `on_drop` (if any), then panics
/// with the `String` `name` as its payload: a batch whose drop panics (M3).
pub struct Bomb {
    name: &'static str,
    drops: Arc<AtomicUsize>,
    on_drop: Option<Box<dyn FnOnce() + Send>>,
}

impl AsRef<[u8]> for Bomb {
    fn as_ref(&self) -> &[u8] {
        b"{}"
    }
}

impl Drop for Bomb {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
        if let Some(f) = self.on_drop.take() {
            f();
        }
        std::panic::panic_any(self.name.to_string());
    }
}

/// A batch at `position` of one envelope (index "docs", id "1", document `{}`: charged as a
/// [`shared_envelopes`] batch of a one-digit tag) whose document's owner is a [`Bomb`].
pub fn bomb_with(
    position: u64,
    name: &'static str,
    drops: &Arc<AtomicUsize>,
    on_drop: Option<Box<dyn FnOnce() + Send>>,
) -> LaneItem {
    let mut env = envelope("docs", "1", Some(position), b"{}");
    env.document = Bytes::from_owner(Bomb { name, drops: drops.clone(), on_drop });
    LaneItem::Batch(Batch::new(Some(Position(position)), vec![env].into()))
}

/// [`bomb_with`] and nothing run at the drop but the count and the panic.
pub fn bomb(position: u64, name: &'static str, drops: &Arc<AtomicUsize>) -> LaneItem {
    bomb_with(position, name, drops, None)
}

/// The payload of a caught panic as text: a [`Bomb`]'s `String`, a `panic!` message, or a marker.
pub fn payload(caught: &Box<dyn std::any::Any + Send>) -> String {
    caught
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| caught.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "<other payload>".into())
}

/// Envelopes to share between batches; `Arc::strong_count` on them counts live copies of the
/// batches built with [`tracked`].
pub fn shared_envelopes(tag: u64) -> Arc<[Envelope]> {
    vec![envelope("docs", &tag.to_string(), Some(tag), b"{}")].into()
}

/// A batch sharing `envelopes` (one more strong count while it lives).
pub fn tracked(position: Option<u64>, envelopes: &Arc<[Envelope]>) -> LaneItem {
    LaneItem::Batch(Batch::new(position.map(Position), envelopes.clone()))
}

/// A stream of `capacity` slots per lane over `sinks`.
pub fn stream(capacity: usize, sinks: &[&str]) -> MemoryStream {
    MemoryStream::builder().capacity(capacity).sinks(sinks.iter().copied()).build().unwrap()
}

/// The position of a delivered positioned item (panics if it has none).
pub fn pos<T: Item>(delivery: &Delivery<T>) -> u64 {
    delivery.item().position().expect("a positioned item").0
}

/// The positions of a run's items, in order (panics on an unpositioned item).
pub fn run_positions(run: &Run<LaneItem>) -> Vec<u64> {
    run.iter().map(|item| item.position().expect("a positioned item").0).collect()
}

/// Publishes `batch(p)` for each `p` of `range` to every lane of `stream`, through a fan-out of
/// its own, with `try_publish`, so a lane without room fails the test rather than waiting.
pub fn publish_range(stream: &MemoryStream, range: std::ops::RangeInclusive<u64>) {
    let mut fanout = stream.fanout().unwrap();
    for p in range {
        fanout.try_publish(batch(p)).unwrap();
    }
}

/// A positioned item without envelopes, for lanes of another item type than `LaneItem`
/// (standalone lanes, the holder bound).
#[derive(Debug, PartialEq, Eq)]
pub struct Tick(pub u64);

impl Item for Tick {
    fn position(&self) -> Option<Position> {
        Some(Position(self.0))
    }
}

/// A waker that counts its wake-ups.
#[derive(Default)]
pub struct CountingWaker {
    wakes: AtomicUsize,
}

impl CountingWaker {
    pub fn new() -> (Arc<CountingWaker>, Waker) {
        let w = Arc::new(CountingWaker::default());
        (w.clone(), Waker::from(w))
    }

    pub fn wakes(&self) -> usize {
        self.wakes.load(Ordering::SeqCst)
    }
}

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
    }
}

/// Runs `f` on its own thread and returns its result, failing the test if it takes longer than
/// `secs` seconds (a lost wake-up would otherwise hang the test run). Panics in `f` propagate.
pub fn within<R: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    let handle = thread::spawn(move || {
        let r = f();
        let _ = tx.send(());
        r
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Ok(r) => r,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: still running after {secs} s (lost wake-up?)")
        }
    }
}

/// Waits until `cond` holds, polling every millisecond, for at most 10 s.
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if cond() {
            return;
        }
        thread::sleep(Duration::from_millis(1));
    }
    panic!("{what}: not reached within 10 s");
}

/// Receives with `try_recv` until the lane has nothing more, acking each delivery; returns the
/// positions in delivery order.
pub fn drain_try<T: Item>(consumer: &mut Consumer<T>) -> Vec<Option<u64>> {
    let mut got = Vec::new();
    while let Ok(d) = consumer.try_recv() {
        got.push(d.item().position().map(|p| p.0));
        d.ack().unwrap();
    }
    got
}

/// Receives with `recv` until it returns `None` (closed and drained), acking each delivery;
/// returns the positions and attempts in delivery order.
pub fn drain_closed<T: Item + Send + Sync>(consumer: &mut Consumer<T>) -> Vec<(Option<u64>, u32)> {
    let mut got = Vec::new();
    while let Some(d) = consumer.recv().unwrap() {
        got.push((d.item().position().map(|p| p.0), d.attempt()));
        d.ack().unwrap();
    }
    got
}

/// An item of a generic lane that counts its drops in `drops[id]` (M3), and panics when dropped
/// if `panics`.
#[derive(Debug)]
pub struct Counted {
    pub id: usize,
    pub position: Option<u64>,
    pub drops: Arc<Vec<AtomicUsize>>,
    pub panics: bool,
}

impl Counted {
    /// Item `id` at position `id + 1`, dropped quietly.
    pub fn new(id: usize, drops: &Arc<Vec<AtomicUsize>>) -> Counted {
        Counted { id, position: Some(id as u64 + 1), drops: drops.clone(), panics: false }
    }
}

impl Item for Counted {
    fn position(&self) -> Option<Position> {
        self.position.map(Position)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.drops[self.id].fetch_add(1, Ordering::SeqCst);
        if self.panics {
            panic!("Counted {} panics in Drop (on purpose)", self.id);
        }
    }
}

/// `n` drop counters for [`Counted`] items `0..n`.
pub fn counters(n: usize) -> Arc<Vec<AtomicUsize>> {
    Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect())
}

/// A standalone lane of [`Counted`] items.
pub fn counted_lane(capacity: usize) -> Lane<Counted> {
    Lane::standalone(SinkName::new("counted").unwrap(), capacity).unwrap()
}

/// How many seeds (or rounds) a randomized test runs: `LANESTREAM_HUNT` if set, else `default`.
pub fn hunt(default: u64) -> u64 {
    std::env::var("LANESTREAM_HUNT").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}
