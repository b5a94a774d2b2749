//! Workloads shared by the criterion suite (`benches/peers.rs`) and the alternating harness
//! (`benches/alternate.rs`): lanestream and its peers, each behind the same fixture shape.
//!
//! Every contender carries the same payload, a [`LaneItem`] whose batch is an `Arc<[Envelope]>`
//! of 1, 64 or 1024 envelopes (publishing clones the `Arc`, never the envelopes), and every
//! bounded queue has capacity [`CAPACITY`].
//!
//! A fixture owns the queue and one [`Partner`] thread (the consumer side). The partner parks
//! between runs, so holding several fixtures never puts more spinning threads on the machine
//! than the two a run needs (the bench thread and its partner). `run(n)` wakes the partner,
//! waits for it to be awake, then times `n` messages from the first publish until the consumer
//! side is done with the last one; that time is what criterion's `iter_custom` receives.
//!
//! Waiting classes, shown in every bench id: `spin` (busy-polls with `try_*` and
//! `spin_loop`), `spin-then-park` (blocking calls that spin briefly, then park), `park` (the
//! waiter is parked, or its task is pending in an idle runtime, when the message arrives).
#![allow(dead_code)] // each bench binary uses part of the module

use lanestream::prelude::*;
use std::cell::Cell;
use std::hint::{black_box, spin_loop};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_utils::CachePadded;
use disruptor::{BusySpin, Polling, Producer as _};
use lanestream::{
    Batch, Consumer, Envelope, Fanout, IndexName, LaneItem, MemoryStream, Op, Position, PublishError, Stream,
    TryRecvError,
};

/// Slots in every bounded queue, for every contender.
pub const CAPACITY: usize = 1024;

/// `n` envelopes of a small JSON document, shared by every message of a run.
pub fn envelopes(n: usize) -> Arc<[Envelope]> {
    let index = IndexName::new("bench_users").unwrap();
    (0..n)
        .map(|i| Envelope {
            index: index.clone(),
            id: i.to_string(),
            op: Op::Upsert,
            position: Some(Position(1)),
            document: Bytes::from_static(br#"{"id":1,"name":"a user","email":"user@example.com"}"#),
            built_at_micros: None,
            relation: None,
            old_id: None,
            unchanged: Vec::new(),
        })
        .collect::<Vec<_>>()
        .into()
}

/// The payload: a positioned batch over the shared envelopes (one `Arc` clone).
#[inline]
pub fn item(env: &Arc<[Envelope]>, pos: u64) -> LaneItem {
    LaneItem::Batch(Batch::new(Some(Position(pos)), env.clone()))
}

/// What a consumer does with a message: read its position (the batch stays shared).
#[inline]
fn apply(item: &LaneItem) {
    black_box(item.position());
}

/// One step of a busy wait, used by every spinning contender (and W0): `spin_loop` hints, and
/// every 64th step a `yield_now`. Pure spinning on a shared, oversubscribed 2-core machine
/// measures the scheduler (a descheduled partner costs a whole time slice, milliseconds); the
/// yield keeps the waiting class "spin" (never parks) while letting a preempted partner run.
#[inline]
pub fn relax() {
    thread_local! { static STEPS: Cell<u32> = const { Cell::new(0) }; }
    STEPS.with(|s| {
        let n = s.get().wrapping_add(1);
        s.set(n);
        if n % 64 == 0 {
            thread::yield_now();
        } else {
            spin_loop();
        }
    });
}

// ----- the partner thread ------------------------------------------------------------------------

/// Control block shared by a fixture and its partner thread.
pub struct Ctl {
    /// Total messages the partner must have consumed when the current run ends.
    target: CachePadded<AtomicU64>,
    /// `target` of the run the partner is working on (set when it wakes).
    awake: CachePadded<AtomicU64>,
    /// `target` of the last run the partner finished.
    done: CachePadded<AtomicU64>,
    /// Consumer progress published during a run (used by contenders without backpressure).
    pub progress: CachePadded<AtomicU64>,
    stop: AtomicBool,
}

/// The consumer-side thread of a fixture: parked between runs; during a run, `body(ctl, from,
/// to)` consumes messages `from..to` (totals over the fixture's life).
pub struct Partner {
    ctl: Arc<Ctl>,
    handle: Option<JoinHandle<()>>,
    target: u64,
}

impl Partner {
    pub fn spawn(mut body: impl FnMut(&Ctl, u64, u64) + Send + 'static) -> Partner {
        let ctl = Arc::new(Ctl {
            target: CachePadded::new(AtomicU64::new(0)),
            awake: CachePadded::new(AtomicU64::new(0)),
            done: CachePadded::new(AtomicU64::new(0)),
            progress: CachePadded::new(AtomicU64::new(0)),
            stop: AtomicBool::new(false),
        });
        let c = ctl.clone();
        let handle = thread::spawn(move || {
            let mut done = 0;
            loop {
                let target = c.target.load(Ordering::Acquire);
                if target > done {
                    c.awake.store(target, Ordering::Release);
                    body(&c, done, target);
                    done = target;
                    c.done.store(target, Ordering::Release);
                } else if c.stop.load(Ordering::Acquire) {
                    return;
                } else {
                    thread::park();
                }
            }
        });
        Partner { ctl, handle: Some(handle), target: 0 }
    }

    /// Starts a run of `n` messages; returns once the partner is awake and working on it.
    pub fn start(&mut self, n: u64) -> (u64, u64) {
        let from = self.target;
        self.target += n;
        self.ctl.target.store(self.target, Ordering::Release);
        self.handle.as_ref().unwrap().thread().unpark();
        while self.ctl.awake.load(Ordering::Acquire) != self.target {
            thread::yield_now();
        }
        (from, self.target)
    }

    /// Times `body` (the producer's side of a run of `n` messages) from the moment the partner
    /// is awake, then waits for the partner to finish the run (untimed).
    pub fn timed(&mut self, n: u64, body: impl FnOnce(&Ctl)) -> Duration {
        self.start(n);
        let t0 = Instant::now();
        body(&self.ctl);
        let t = t0.elapsed();
        self.wait_done();
        t
    }

    /// Times a whole run of `n` messages: from the moment the partner is awake, through `body`
    /// (the producer's side), until the partner has consumed the last message.
    pub fn timed_through(&mut self, n: u64, body: impl FnOnce(&Ctl)) -> Duration {
        self.start(n);
        let t0 = Instant::now();
        body(&self.ctl);
        self.wait_done();
        t0.elapsed()
    }

    /// Spins until the partner finished the current run.
    pub fn wait_done(&self) {
        while self.ctl.done.load(Ordering::Acquire) != self.target {
            relax();
        }
    }

    pub fn ctl(&self) -> &Ctl {
        &self.ctl
    }
}

impl Drop for Partner {
    fn drop(&mut self) {
        self.ctl.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            h.thread().unpark();
            let _ = h.join();
        }
    }
}

/// A benchmark fixture: `run(n)` times `n` messages.
pub trait Fixture {
    fn run(&mut self, n: u64) -> Duration;
}

/// Retries `try_publish` while a lane is full (spin).
#[inline]
fn spin_publish(p: &mut Fanout, mut it: LaneItem) {
    loop {
        match p.try_publish(it) {
            Ok(()) => return,
            Err(PublishError::Full(back)) => {
                it = back;
                relax();
            }
            Err(e) => panic!("publish failed: {e}"),
        }
    }
}

/// A stream of `sinks` lanes (one array of cells every lane reads).
fn lane_stream(sinks: usize) -> MemoryStream {
    MemoryStream::builder().capacity(CAPACITY).sinks((0..sinks).map(|i| format!("sink_{i}"))).build().unwrap()
}

// ----- W0: raw atomic ping-pong ------------------------------------------------------------------

/// Two threads bouncing one cache line: the floor for any cross-core round trip.
pub struct PingPong {
    flag: Arc<CachePadded<AtomicU64>>,
    partner: Partner,
    k: u64,
}

impl PingPong {
    pub fn new() -> PingPong {
        let flag = Arc::new(CachePadded::new(AtomicU64::new(0)));
        let f = flag.clone();
        let partner = Partner::spawn(move |_, from, to| {
            for i in from..to {
                while f.load(Ordering::Acquire) != 2 * i + 1 {
                    relax();
                }
                f.store(2 * i + 2, Ordering::Release);
            }
        });
        PingPong { flag, partner, k: 0 }
    }
}

impl Fixture for PingPong {
    fn run(&mut self, n: u64) -> Duration {
        self.partner.timed(n, |_| {
            for _ in 0..n {
                let i = self.k;
                self.k += 1;
                self.flag.store(2 * i + 1, Ordering::Release);
                while self.flag.load(Ordering::Acquire) != 2 * i + 2 {
                    relax();
                }
            }
        })
    }
}

// ----- W1: one lane, publish + recv + ack ------------------------------------------------------

/// lanestream, one lane, item by item on both ends: the fan-out's `try_publish` / `try_recv` +
/// `ack` (`blocking == false`, spin) or `publish` / `recv` + `ack` (`blocking == true`,
/// spin-then-park).
pub struct LaneW1 {
    producer: Fanout,
    partner: Partner,
    env: Arc<[Envelope]>,
    pos: u64,
    blocking: bool,
    _stream: MemoryStream,
}

impl LaneW1 {
    pub fn new(env: Arc<[Envelope]>, blocking: bool) -> LaneW1 {
        let stream = lane_stream(1);
        let lane = stream.lanes().next().unwrap();
        let producer = stream.fanout().unwrap();
        let mut consumer = lane.reattach();
        let partner = Partner::spawn(move |_, from, to| {
            for _ in from..to {
                let d = if blocking {
                    consumer.recv().unwrap().expect("lane closed early")
                } else {
                    loop {
                        match consumer.try_recv() {
                            Ok(d) => break d,
                            Err(TryRecvError::Empty) => relax(),
                            Err(e) => panic!("recv failed: {e}"),
                        }
                    }
                };
                apply(&d);
                d.ack().unwrap();
            }
        });
        LaneW1 { producer, partner, env, pos: 0, blocking, _stream: stream }
    }
}

impl Fixture for LaneW1 {
    fn run(&mut self, n: u64) -> Duration {
        self.partner.timed_through(n, |_| {
            for _ in 0..n {
                self.pos += 1;
                let it = item(&self.env, self.pos);
                if self.blocking {
                    self.producer.publish(it).unwrap();
                } else {
                    spin_publish(&mut self.producer, it);
                }
            }
        })
    }
}

/// rtrb: `push` / `pop` item by item (`chunks == false`), or `write_chunk_uninit(RUN)` +
/// `fill_from_iter` / `read_chunk` + `commit_all` in chunks of up to [`RUN`] (`chunks == true`;
/// spin either way). No acks: the SPSC floor.
pub struct RtrbW1 {
    producer: rtrb::Producer<LaneItem>,
    partner: Partner,
    env: Arc<[Envelope]>,
    pos: u64,
    chunks: bool,
}

impl RtrbW1 {
    pub fn new(env: Arc<[Envelope]>) -> RtrbW1 {
        RtrbW1::with_chunks(env, false)
    }

    pub fn with_chunks(env: Arc<[Envelope]>, chunks: bool) -> RtrbW1 {
        let (producer, mut consumer) = rtrb::RingBuffer::new(CAPACITY);
        let partner = Partner::spawn(move |_, from, to| {
            let mut left = to - from;
            while left > 0 {
                if chunks {
                    let n = consumer.slots().min(RUN).min(left as usize);
                    if n == 0 {
                        relax();
                        continue;
                    }
                    let chunk = consumer.read_chunk(n).unwrap();
                    let (a, b) = chunk.as_slices();
                    a.iter().chain(b).for_each(apply);
                    chunk.commit_all();
                    left -= n as u64;
                    continue;
                }
                let it = loop {
                    match consumer.pop() {
                        Ok(it) => break it,
                        Err(_) => relax(),
                    }
                };
                apply(&it);
                left -= 1;
            }
        });
        RtrbW1 { producer, partner, env, pos: 0, chunks }
    }
}

impl Fixture for RtrbW1 {
    fn run(&mut self, n: u64) -> Duration {
        self.partner.timed_through(n, |_| {
            let mut left = n;
            while left > 0 {
                if self.chunks {
                    let k = self.producer.slots().min(RUN).min(left as usize);
                    if k == 0 {
                        relax();
                        continue;
                    }
                    let (env, pos) = (&self.env, self.pos);
                    let chunk = self.producer.write_chunk_uninit(k).unwrap();
                    chunk.fill_from_iter((1..=k as u64).map(|i| item(env, pos + i)));
                    self.pos += k as u64;
                    left -= k as u64;
                    continue;
                }
                self.pos += 1;
                left -= 1;
                let mut it = item(&self.env, self.pos);
                loop {
                    match self.producer.push(it) {
                        Ok(()) => break,
                        Err(rtrb::PushError::Full(back)) => {
                            it = back;
                            relax();
                        }
                    }
                }
            }
        })
    }
}

/// crossbeam-channel `bounded(CAPACITY)`: `send` / `recv` (spin-then-park).
pub struct CrossbeamW1 {
    tx: crossbeam_channel::Sender<LaneItem>,
    partner: Partner,
    env: Arc<[Envelope]>,
    pos: u64,
}

impl CrossbeamW1 {
    pub fn new(env: Arc<[Envelope]>) -> CrossbeamW1 {
        let (tx, rx) = crossbeam_channel::bounded(CAPACITY);
        let partner = Partner::spawn(move |_, from, to| {
            for _ in from..to {
                apply(&rx.recv().unwrap());
            }
        });
        CrossbeamW1 { tx, partner, env, pos: 0 }
    }
}

impl Fixture for CrossbeamW1 {
    fn run(&mut self, n: u64) -> Duration {
        self.partner.timed_through(n, |_| {
            for _ in 0..n {
                self.pos += 1;
                self.tx.send(item(&self.env, self.pos)).unwrap();
            }
        })
    }
}

// ----- W1/W2: the disruptor ----------------------------------------------------------------------

/// The disruptor's slot type: the factory fills the ring with `None`.
pub type DSlot = Option<LaneItem>;

enum DProducer {
    One(disruptor::SingleProducer<DSlot, disruptor::SingleConsumerBarrier>),
    Many(disruptor::SingleProducer<DSlot, disruptor::MultiConsumerBarrier>),
}

/// disruptor, single producer, `consumers` event pollers polled round-robin by one thread
/// (BusySpin: spin). The producer writes each message once into the shared ring and is gated on
/// the slowest poller's cursor; pollers read the slot in place.
pub struct DisruptorFan {
    producer: DProducer,
    partner: Partner,
    env: Arc<[Envelope]>,
    pos: u64,
    /// `try_batch_publish` of [`RUN`] slots at a time instead of `try_publish` per item.
    batch: bool,
}

impl DisruptorFan {
    pub fn new(env: Arc<[Envelope]>, consumers: usize) -> DisruptorFan {
        DisruptorFan::with_batch(env, consumers, false)
    }

    /// As `new`, publishing with `try_batch_publish(RUN, ..)` when `batch` (the peer's batch
    /// API, against lanestream's `publish_run`).
    pub fn with_batch(env: Arc<[Envelope]>, consumers: usize, batch: bool) -> DisruptorFan {
        let (first, b) =
            disruptor::build_single_producer(CAPACITY, || None::<LaneItem>, BusySpin).new_event_poller();
        let mut pollers = vec![first];
        let producer = if consumers == 1 {
            DProducer::One(b.build())
        } else {
            let (second, mut b) = b.new_event_poller();
            pollers.push(second);
            for _ in 2..consumers {
                let (p, next) = b.new_event_poller();
                pollers.push(p);
                b = next;
            }
            DProducer::Many(b.build())
        };
        let partner = Partner::spawn(move |_, from, to| {
            let want = to - from;
            let mut seen = vec![0u64; pollers.len()];
            while seen.iter().any(|&s| s < want) {
                for (poller, seen) in pollers.iter_mut().zip(seen.iter_mut()) {
                    match poller.poll() {
                        Ok(mut events) => {
                            for e in &mut events {
                                apply(e.as_ref().unwrap());
                                *seen += 1;
                            }
                        }
                        Err(Polling::NoEvents) => relax(),
                        Err(Polling::Shutdown) => panic!("disruptor shut down early"),
                    }
                }
            }
        });
        DisruptorFan { producer, partner, env, pos: 0, batch }
    }
}

impl Fixture for DisruptorFan {
    fn run(&mut self, n: u64) -> Duration {
        if self.batch {
            return self.partner.timed_through(n, |_| {
                let mut left = n;
                while left > 0 {
                    let k = (RUN as u64).min(left) as usize;
                    let (env, pos) = (&self.env, self.pos);
                    // (The batch iterator's type is not nameable outside the crate: one closure
                    // per arm.)
                    macro_rules! fill {
                        () => {
                            |iter| {
                                for (i, slot) in iter.enumerate() {
                                    *slot = Some(item(env, pos + 1 + i as u64));
                                }
                            }
                        };
                    }
                    let published = match &mut self.producer {
                        DProducer::One(p) => p.try_batch_publish(k, fill!()).is_ok(),
                        DProducer::Many(p) => p.try_batch_publish(k, fill!()).is_ok(),
                    };
                    if published {
                        self.pos += k as u64;
                        left -= k as u64;
                    } else {
                        relax();
                    }
                }
            });
        }
        self.partner.timed_through(n, |_| {
            for _ in 0..n {
                self.pos += 1;
                // `try_publish` + `relax` rather than `publish` (which spins without yielding); a
                // failed attempt leaves the item in `it` (the closure runs only on success).
                let mut it = Some(item(&self.env, self.pos));
                match &mut self.producer {
                    DProducer::One(p) => {
                        while p.try_publish(|slot| *slot = it.take()).is_err() {
                            relax();
                        }
                    }
                    DProducer::Many(p) => {
                        while p.try_publish(|slot| *slot = it.take()).is_err() {
                            relax();
                        }
                    }
                }
            }
        })
    }
}

// ----- W2: fan-out -------------------------------------------------------------------------------

/// lanestream item by item on both ends: the fan-out's `try_publish` (spin) writes each batch
/// once for every lane; one thread drains every consumer in turn (`try_recv` + `ack`); the run
/// ends when the consumer thread acked the last item (the stream's watermark is checked after).
pub struct LaneFan {
    stream: MemoryStream,
    fanout: Fanout,
    partner: Partner,
    env: Arc<[Envelope]>,
    pos: u64,
}

impl LaneFan {
    pub fn new(env: Arc<[Envelope]>, lanes: usize) -> LaneFan {
        let stream = lane_stream(lanes);
        let fanout = stream.fanout().unwrap();
        let mut consumers: Vec<Consumer<LaneItem>> = stream.lanes().map(|l| l.reattach()).collect();
        let partner = Partner::spawn(move |_, from, to| {
            let want = to - from;
            let mut seen = vec![0u64; consumers.len()];
            while seen.iter().any(|&s| s < want) {
                for (c, seen) in consumers.iter_mut().zip(seen.iter_mut()) {
                    loop {
                        match c.try_recv() {
                            Ok(d) => {
                                apply(&d);
                                d.ack().unwrap();
                                *seen += 1;
                            }
                            Err(TryRecvError::Empty) => break,
                            Err(e) => panic!("recv failed: {e}"),
                        }
                    }
                }
                relax();
            }
        });
        LaneFan { stream, fanout, partner, env, pos: 0 }
    }
}

impl Fixture for LaneFan {
    fn run(&mut self, n: u64) -> Duration {
        // Timed until the consumer thread is done (it acks every item before it counts it), as
        // the disruptor's side is: polling the watermark meanwhile would read every lane's mark
        // line while the consumer writes them, a cost the peer's side does not pay.
        let t = self.partner.timed_through(n, |_| {
            for _ in 0..n {
                self.pos += 1;
                spin_publish(&mut self.fanout, item(&self.env, self.pos));
            }
        });
        assert_eq!(self.stream.watermark(), Some(Position(self.pos)), "every item acked");
        t
    }
}

/// tokio broadcast `channel(CAPACITY)`, one receiver per consumer drained in turn by one thread
/// (`try_recv`, spin; each receive clones the value). broadcast has no backpressure (a slow
/// receiver lags), so the producer is gated on the consumer thread's published progress.
pub struct BroadcastFan {
    tx: tokio::sync::broadcast::Sender<LaneItem>,
    partner: Partner,
    env: Arc<[Envelope]>,
    pos: u64,
}

impl BroadcastFan {
    pub fn new(env: Arc<[Envelope]>, consumers: usize) -> BroadcastFan {
        let (tx, first) = tokio::sync::broadcast::channel(CAPACITY);
        let mut rxs = vec![first];
        rxs.extend((1..consumers).map(|_| tx.subscribe()));
        let partner = Partner::spawn(move |ctl, from, to| {
            let want = to - from;
            let mut seen = vec![0u64; rxs.len()];
            loop {
                for (rx, seen) in rxs.iter_mut().zip(seen.iter_mut()) {
                    loop {
                        match rx.try_recv() {
                            Ok(it) => {
                                apply(&it);
                                *seen += 1;
                            }
                            Err(tokio::sync::broadcast::error::TryRecvError::Empty) => break,
                            Err(e) => panic!("broadcast recv failed: {e}"),
                        }
                    }
                }
                let min = *seen.iter().min().unwrap();
                ctl.progress.store(from + min, Ordering::Release);
                if min >= want {
                    return;
                }
                relax();
            }
        });
        BroadcastFan { tx, partner, env, pos: 0 }
    }
}

impl Fixture for BroadcastFan {
    fn run(&mut self, n: u64) -> Duration {
        self.partner.timed_through(n, |ctl| {
            for _ in 0..n {
                while self.pos - ctl.progress.load(Ordering::Acquire) >= CAPACITY as u64 {
                    relax();
                }
                self.pos += 1;
                self.tx.send(item(&self.env, self.pos)).unwrap();
            }
        })
    }
}

/// bus `Bus::new(CAPACITY)`, one reader per consumer drained in turn by one thread
/// (`try_broadcast` / `try_recv`, spin; each receive clones the value).
pub struct BusFan {
    bus: bus::Bus<LaneItem>,
    partner: Partner,
    env: Arc<[Envelope]>,
    pos: u64,
}

impl BusFan {
    pub fn new(env: Arc<[Envelope]>, consumers: usize) -> BusFan {
        let mut bus = bus::Bus::new(CAPACITY);
        let mut readers: Vec<_> = (0..consumers).map(|_| bus.add_rx()).collect();
        let partner = Partner::spawn(move |_, from, to| {
            let want = to - from;
            let mut seen = vec![0u64; readers.len()];
            while seen.iter().any(|&s| s < want) {
                for (rx, seen) in readers.iter_mut().zip(seen.iter_mut()) {
                    while let Ok(it) = rx.try_recv() {
                        apply(&it);
                        *seen += 1;
                    }
                }
                relax();
            }
        });
        BusFan { bus, partner, env, pos: 0 }
    }
}

impl Fixture for BusFan {
    fn run(&mut self, n: u64) -> Duration {
        self.partner.timed_through(n, |_| {
            for _ in 0..n {
                self.pos += 1;
                let mut it = item(&self.env, self.pos);
                while let Err(back) = self.bus.try_broadcast(it) {
                    it = back;
                    relax();
                }
            }
        })
    }
}

/// How a lanestream fan-out contender publishes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FanPublish {
    /// `Fanout::try_publish` / `publish`: one item to every lane per call.
    Item,
    /// `Fanout::try_publish_run` / `publish_run` over chunks of [`RUN`] items: one publication
    /// step for every lane per chunk.
    Run,
}

/// How the consumers of [`LaneFanRun`] receive.
#[derive(Clone, Copy)]
pub enum FanRecv {
    /// `try_recv_run(RUN)` / `recv_run(RUN)`, one ack per run.
    Run,
    /// `try_recv` / `recv` and `ack`, item by item (the per-item API).
    Item,
}

/// Items per run on both sides of the run API contenders (the most a `Run` holds).
pub const RUN: usize = lanestream::MAX_RUN;

/// lanestream through the run API: one [`lanestream::Fanout`] publishes each batch to every
/// lane (`publish` per item, or `publish_run` per chunk of [`RUN`]); one thread drains every
/// consumer in turn with `try_recv_run(RUN)` (spin) or `recv_run(RUN)` (spin-then-park) and
/// acks each run whole; the run ends when the consumer thread acked the last run (the
/// watermark is checked after, untimed).
pub struct LaneFanRun {
    stream: MemoryStream,
    fanout: lanestream::Fanout,
    partner: Partner,
    env: Arc<[Envelope]>,
    pos: u64,
    blocking: bool,
    mode: FanPublish,
    chunk: Vec<LaneItem>,
}

impl LaneFanRun {
    pub fn new(env: Arc<[Envelope]>, lanes: usize, blocking: bool, mode: FanPublish) -> LaneFanRun {
        LaneFanRun::with_recv(env, lanes, blocking, mode, FanRecv::Run)
    }

    /// As `new`, the consumers receiving as `recv` says.
    pub fn with_recv(
        env: Arc<[Envelope]>,
        lanes: usize,
        blocking: bool,
        mode: FanPublish,
        recv: FanRecv,
    ) -> LaneFanRun {
        let stream = lane_stream(lanes);
        let fanout = stream.fanout().unwrap();
        let mut consumers: Vec<Consumer<LaneItem>> = stream.lanes().map(|l| l.reattach()).collect();
        let partner = Partner::spawn(move |_, from, to| {
            let want = to - from;
            let mut seen = vec![0u64; consumers.len()];
            while seen.iter().any(|&s| s < want) {
                for (c, seen) in consumers.iter_mut().zip(seen.iter_mut()) {
                    if let FanRecv::Item = recv {
                        if blocking {
                            if *seen < want {
                                let d = c.recv().unwrap().expect("lane closed early");
                                apply(&d);
                                *seen += 1;
                                d.ack().unwrap();
                            }
                            continue;
                        }
                        loop {
                            match c.try_recv() {
                                Ok(d) => {
                                    apply(&d);
                                    *seen += 1;
                                    d.ack().unwrap();
                                }
                                Err(TryRecvError::Empty) => break,
                                Err(e) => panic!("recv failed: {e}"),
                            }
                        }
                        continue;
                    }
                    if blocking {
                        if *seen < want {
                            let run = c.recv_run(RUN).unwrap().expect("lane closed early");
                            run.iter().for_each(apply);
                            *seen += run.len() as u64;
                            run.ack().unwrap();
                        }
                        continue;
                    }
                    loop {
                        match c.try_recv_run(RUN) {
                            Ok(run) => {
                                run.iter().for_each(apply);
                                *seen += run.len() as u64;
                                run.ack().unwrap();
                            }
                            Err(TryRecvError::Empty) => break,
                            Err(e) => panic!("recv failed: {e}"),
                        }
                    }
                }
                if !blocking {
                    relax();
                }
            }
        });
        LaneFanRun { stream, fanout, partner, env, pos: 0, blocking, mode, chunk: Vec::with_capacity(RUN) }
    }

    fn publish_chunk(&mut self) {
        // The items are moved out of `chunk` as they go; it is empty (its capacity kept) after.
        while !self.chunk.is_empty() {
            if self.blocking {
                self.fanout.publish_run(&mut self.chunk).unwrap();
            } else {
                match self.fanout.try_publish_run(&mut self.chunk) {
                    Ok(_) => {}
                    Err(PublishError::Full(_)) => relax(),
                    Err(e) => panic!("publish failed: {e}"),
                }
            }
        }
    }
}

impl Fixture for LaneFanRun {
    fn run(&mut self, n: u64) -> Duration {
        let (env, stream) = (self.env.clone(), self.stream.clone());
        self.partner.start(n);
        let t0 = Instant::now();
        match self.mode {
            // Chunks of `RUN` built from an iterator, as the peers' batch sides fill theirs
            // (rtrb's `fill_from_iter`, the disruptor's batch closure). (Pushed one by one
            // instead, each 48-byte item goes through the stack and its copy into the `Vec` stalls
            // on store forwarding: about a fifth of the publishing thread's time, `perf annotate`.)
            FanPublish::Run => {
                let mut left = n;
                while left > 0 {
                    let (k, base) = ((RUN as u64).min(left), self.pos);
                    self.chunk.extend((1..=k).map(|i| item(&env, base + i)));
                    (self.pos, left) = (base + k, left - k);
                    self.publish_chunk();
                }
            }
            FanPublish::Item => {
                for _ in 0..n {
                    self.pos += 1;
                    let mut it = item(&env, self.pos);
                    if self.blocking {
                        self.fanout.publish(it).unwrap();
                        continue;
                    }
                    loop {
                        match self.fanout.try_publish(it) {
                            Ok(()) => break,
                            Err(PublishError::Full(back)) => {
                                it = back;
                                relax();
                            }
                            Err(e) => panic!("publish failed: {e}"),
                        }
                    }
                }
            }
        }
        // Timed until the consumer thread is done (it acks each run before it counts it), as the
        // peers' sides are (`timed_through`): polling the watermark meanwhile would read every
        // lane's mark line while the consumer writes them, a cost the peers do not pay.
        self.partner.wait_done();
        let t = t0.elapsed();
        assert_eq!(stream.watermark(), Some(Position(self.pos)), "every item acked");
        t
    }
}

// ----- W3: round trip ----------------------------------------------------------------------------

/// lanestream round trip: publish one batch, the consumer receives and acks it, the producer
/// spins until the watermark reaches it. Consumer `try_recv` (spin) or `recv` (spin-then-park).
pub struct LaneRoundTrip {
    stream: MemoryStream,
    producer: Fanout,
    partner: Partner,
    env: Arc<[Envelope]>,
    pos: u64,
}

impl LaneRoundTrip {
    pub fn new(env: Arc<[Envelope]>, blocking: bool) -> LaneRoundTrip {
        let stream = lane_stream(1);
        let lane = stream.lanes().next().unwrap();
        let producer = stream.fanout().unwrap();
        let mut consumer = lane.reattach();
        let partner = Partner::spawn(move |_, from, to| {
            for _ in from..to {
                let d = if blocking {
                    consumer.recv().unwrap().unwrap()
                } else {
                    loop {
                        match consumer.try_recv() {
                            Ok(d) => break d,
                            Err(TryRecvError::Empty) => relax(),
                            Err(e) => panic!("recv failed: {e}"),
                        }
                    }
                };
                apply(&d);
                d.ack().unwrap();
            }
        });
        LaneRoundTrip { stream, producer, partner, env, pos: 0 }
    }
}

impl Fixture for LaneRoundTrip {
    fn run(&mut self, n: u64) -> Duration {
        self.partner.timed(n, |_| {
            for _ in 0..n {
                self.pos += 1;
                spin_publish(&mut self.producer, item(&self.env, self.pos));
                let want = Some(Position(self.pos));
                while self.stream.watermark() != want {
                    relax();
                }
            }
        })
    }
}

/// rtrb round trip: the item goes out on one ring, its position comes back on another (spin).
pub struct RtrbRoundTrip {
    out: rtrb::Producer<LaneItem>,
    back: rtrb::Consumer<u64>,
    partner: Partner,
    env: Arc<[Envelope]>,
    pos: u64,
}

impl RtrbRoundTrip {
    pub fn new(env: Arc<[Envelope]>) -> RtrbRoundTrip {
        let (out, mut rx) = rtrb::RingBuffer::<LaneItem>::new(CAPACITY);
        let (mut ack, back) = rtrb::RingBuffer::<u64>::new(CAPACITY);
        let partner = Partner::spawn(move |_, from, to| {
            for _ in from..to {
                let it = loop {
                    match rx.pop() {
                        Ok(it) => break it,
                        Err(_) => relax(),
                    }
                };
                apply(&it);
                ack.push(it.position().unwrap().0).unwrap();
            }
        });
        RtrbRoundTrip { out, back, partner, env, pos: 0 }
    }
}

impl Fixture for RtrbRoundTrip {
    fn run(&mut self, n: u64) -> Duration {
        self.partner.timed(n, |_| {
            for _ in 0..n {
                self.pos += 1;
                assert!(self.out.push(item(&self.env, self.pos)).is_ok());
                loop {
                    match self.back.pop() {
                        Ok(p) => {
                            debug_assert_eq!(p, self.pos);
                            break;
                        }
                        Err(_) => relax(),
                    }
                }
            }
        })
    }
}

/// crossbeam-channel round trip: item out on one channel, its position back on another
/// (spin-then-park on both sides).
pub struct CrossbeamRoundTrip {
    out: crossbeam_channel::Sender<LaneItem>,
    back: crossbeam_channel::Receiver<u64>,
    partner: Partner,
    env: Arc<[Envelope]>,
    pos: u64,
}

impl CrossbeamRoundTrip {
    pub fn new(env: Arc<[Envelope]>) -> CrossbeamRoundTrip {
        let (out, rx) = crossbeam_channel::bounded::<LaneItem>(CAPACITY);
        let (ack, back) = crossbeam_channel::bounded::<u64>(CAPACITY);
        let partner = Partner::spawn(move |_, from, to| {
            for _ in from..to {
                let it = rx.recv().unwrap();
                apply(&it);
                ack.send(it.position().unwrap().0).unwrap();
            }
        });
        CrossbeamRoundTrip { out, back, partner, env, pos: 0 }
    }
}

impl Fixture for CrossbeamRoundTrip {
    fn run(&mut self, n: u64) -> Duration {
        self.partner.timed(n, |_| {
            for _ in 0..n {
                self.pos += 1;
                self.out.send(item(&self.env, self.pos)).unwrap();
                black_box(self.back.recv().unwrap());
            }
        })
    }
}

// ----- W4: watermark reads -----------------------------------------------------------------------

/// A thread that calls `step` in a loop until dropped (the acks racing the watermark reads).
pub struct Racer {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Racer {
    pub fn spawn(mut step: impl FnMut() + Send + 'static) -> Racer {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                step();
            }
        });
        Racer { stop, handle: Some(handle) }
    }
}

impl Drop for Racer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// One lanestream ack cycle on a private one-lane stream: publish, receive, ack. Every W4
/// racer does one of these per mark write, so all variants see marks written at the same rate.
pub fn ack_cycle() -> impl FnMut() + Send + 'static {
    let stream = lane_stream(1);
    let lane = stream.lanes().next().unwrap();
    let (mut p, mut c) = (stream.fanout().unwrap(), lane.reattach());
    let env = envelopes(1);
    let mut pos = 0;
    move || {
        let _keep = &stream;
        pos += 1;
        spin_publish(&mut p, item(&env, pos));
        c.try_recv().unwrap().ack().unwrap();
    }
}

/// A watermark reader over `lanes` lanes, every lane primed with one acked batch (so the read
/// walks every mark), optionally with a racer acking on every lane in turn.
pub enum Marks {
    Lanestream { stream: MemoryStream, _racer: Option<Racer> },
    Bare { marks: Arc<[CachePadded<AtomicU64>]>, _racer: Option<Racer> },
    Locked { marks: Arc<Mutex<Vec<u64>>>, _racer: Option<Racer> },
}

impl Marks {
    pub fn lanestream(lanes: usize, racing: bool) -> Marks {
        let stream = lane_stream(lanes);
        let env = envelopes(1);
        let mut fanout = stream.fanout().unwrap();
        let mut consumers: Vec<_> = stream.lanes().map(|l| l.reattach()).collect();
        spin_publish(&mut fanout, item(&env, 1));
        for c in &mut consumers {
            c.try_recv().unwrap().ack().unwrap();
        }
        assert_eq!(stream.watermark(), Some(Position(1)));
        let racer = racing.then(|| {
            let (mut i, mut pos) = (0, 1);
            // One publish for every lane, then one ack per lane in turn: one mark write per step.
            Racer::spawn(move || {
                if i == 0 {
                    pos += 1;
                    spin_publish(&mut fanout, item(&env, pos));
                }
                consumers[i].try_recv().unwrap().ack().unwrap();
                i = (i + 1) % lanes;
            })
        });
        Marks::Lanestream { stream, _racer: racer }
    }

    pub fn bare(lanes: usize, racing: bool) -> Marks {
        let marks: Arc<[CachePadded<AtomicU64>]> =
            (0..lanes).map(|_| CachePadded::new(AtomicU64::new(1))).collect();
        let racer = racing.then(|| {
            let m = marks.clone();
            let mut cycle = ack_cycle();
            let (mut i, mut pos) = (0, 1);
            Racer::spawn(move || {
                cycle();
                m[i].store(pos, Ordering::Release);
                i = (i + 1) % lanes;
                if i == 0 {
                    pos += 1;
                }
            })
        });
        Marks::Bare { marks, _racer: racer }
    }

    pub fn locked(lanes: usize, racing: bool) -> Marks {
        let marks = Arc::new(Mutex::new(vec![1u64; lanes]));
        let racer = racing.then(|| {
            let m = marks.clone();
            let mut cycle = ack_cycle();
            let (mut i, mut pos) = (0, 1);
            Racer::spawn(move || {
                cycle();
                m.lock().unwrap()[i] = pos;
                i = (i + 1) % lanes;
                if i == 0 {
                    pos += 1;
                }
            })
        });
        Marks::Locked { marks, _racer: racer }
    }

    /// One read of the minimum.
    #[inline]
    pub fn read(&self) -> Option<u64> {
        match self {
            Marks::Lanestream { stream, .. } => stream.watermark().map(|p| p.0),
            Marks::Bare { marks, .. } => marks.iter().map(|m| m.load(Ordering::Relaxed)).min(),
            Marks::Locked { marks, .. } => marks.lock().unwrap().iter().copied().min(),
        }
    }
}

// ----- W5/W6: wake-up latency --------------------------------------------------------------------

/// How long the consumer is left idle before each publish, so that it is parked (its spin
/// phase long over) when the message arrives. Each wake-up costs this much wall time on top of
/// the latency measured, so the W5/W6 groups use short criterion times (see benches/peers.rs).
pub const IDLE: Duration = Duration::from_micros(100);

/// Shared between the publishing bench thread and the woken consumer.
pub struct Stamps {
    base: Instant,
    sent: AtomicU64,
    latency: AtomicU64,
    got: AtomicU64,
}

impl Stamps {
    fn new() -> Arc<Stamps> {
        Arc::new(Stamps {
            base: Instant::now(),
            sent: AtomicU64::new(0),
            latency: AtomicU64::new(0),
            got: AtomicU64::new(0),
        })
    }

    fn now(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    /// Consumer side: the message arrived.
    fn received(&self) {
        let lat = self.now() - self.sent.load(Ordering::Acquire);
        self.latency.store(lat, Ordering::Relaxed);
        self.got.fetch_add(1, Ordering::Release);
    }

    /// Bench side: `n` wake-ups through `publish`; the sum of their latencies.
    fn measure(&self, n: u64, mut publish: impl FnMut()) -> Duration {
        let mut total = 0u64;
        for _ in 0..n {
            thread::sleep(IDLE);
            let got = self.got.load(Ordering::Acquire);
            self.sent.store(self.now(), Ordering::Release);
            publish();
            while self.got.load(Ordering::Acquire) == got {
                relax();
            }
            total += self.latency.load(Ordering::Relaxed);
        }
        Duration::from_nanos(total)
    }
}

/// What waits: lanestream `recv_async` or tokio mpsc `recv` in a current-thread runtime (W5),
/// lanestream `recv` or crossbeam-channel `recv` (W6).
pub enum WakeKind {
    LaneAsync,
    TokioMpsc,
    LaneBlocking,
    Crossbeam,
}

/// W5/W6: an idle consumer, one publish; the time from just before the publish until the
/// consumer holds the message.
pub struct Wake {
    send: Box<dyn FnMut(LaneItem)>,
    stamps: Arc<Stamps>,
    partner: Partner,
    env: Arc<[Envelope]>,
    pos: u64,
    _stream: Option<MemoryStream>,
}

impl Wake {
    pub fn new(env: Arc<[Envelope]>, kind: WakeKind) -> Wake {
        let stamps = Stamps::new();
        let st = stamps.clone();
        let rt = || tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (send, partner, stream): (Box<dyn FnMut(LaneItem)>, Partner, _) = match kind {
            WakeKind::LaneAsync | WakeKind::LaneBlocking => {
                let stream = lane_stream(1);
                let lane = stream.lanes().next().unwrap();
                let mut producer = stream.fanout().unwrap();
                let mut consumer = lane.reattach();
                let partner = if matches!(kind, WakeKind::LaneAsync) {
                    let rt = rt();
                    Partner::spawn(move |_, from, to| {
                        rt.block_on(async {
                            for _ in from..to {
                                let d = consumer.recv_async().await.unwrap().unwrap();
                                st.received();
                                d.ack().unwrap();
                            }
                        })
                    })
                } else {
                    Partner::spawn(move |_, from, to| {
                        for _ in from..to {
                            let d = consumer.recv().unwrap().unwrap();
                            st.received();
                            d.ack().unwrap();
                        }
                    })
                };
                (Box::new(move |it| producer.try_publish(it).unwrap()), partner, Some(stream))
            }
            WakeKind::TokioMpsc => {
                let (tx, mut rx) = tokio::sync::mpsc::channel::<LaneItem>(CAPACITY);
                let rt = rt();
                let partner = Partner::spawn(move |_, from, to| {
                    rt.block_on(async {
                        for _ in from..to {
                            let it = rx.recv().await.unwrap();
                            st.received();
                            drop(it);
                        }
                    })
                });
                (Box::new(move |it| tx.try_send(it).unwrap()), partner, None)
            }
            WakeKind::Crossbeam => {
                let (tx, rx) = crossbeam_channel::bounded::<LaneItem>(CAPACITY);
                let partner = Partner::spawn(move |_, from, to| {
                    for _ in from..to {
                        let it = rx.recv().unwrap();
                        st.received();
                        drop(it);
                    }
                });
                (Box::new(move |it| tx.try_send(it).unwrap()), partner, None)
            }
        };
        Wake { send, stamps, partner, env, pos: 0, _stream: stream }
    }
}

impl Fixture for Wake {
    fn run(&mut self, n: u64) -> Duration {
        self.partner.start(n);
        let (send, env, pos) = (&mut self.send, &self.env, &mut self.pos);
        let t = self.stamps.measure(n, || {
            *pos += 1;
            send(item(env, *pos));
        });
        self.partner.wait_done();
        t
    }
}
