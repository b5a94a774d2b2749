//! [`RedisFanout`]: the one publisher of a fan-out stream over Redis, which writes each entry
//! once into the log and publishes it to every lane (see "A fan-out stream" in `scripts`).

use std::fmt;
use std::future::{poll_fn, Future};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread;
use std::time::{Duration, Instant};

use ::redis::{Connection, RedisResult, Value};

use super::conn::{Budget, Pool};
use super::lane::{int, items, malformed, pad, published, scripts, text, unpad, LaneDef, Published};
use super::producer::{encoded, timeout_error, waitable, Progress};
use super::scripts::LOG_FENCE_ID;
use super::shared::Shared;
use super::waiter::Waiter;
use crate::error::{BackendError, PublishError, PublishTimeoutError, StreamError, TryPublishError};
use crate::item::LaneItem;
use crate::position::Position;

/// The keys of a fan-out stream that the fan-out writes: the log, the meta hash (the fan-out's
/// epoch `fe` and claim `fh`), every lane's hash.
struct Keys {
    log: String,
    meta: String,
    hashes: Vec<String>,
    sinks: Vec<String>,
}

impl Keys {
    fn new(lanes: &[Arc<LaneDef>]) -> Keys {
        Keys {
            log: lanes[0].log.clone(),
            meta: lanes[0].meta.clone(),
            hashes: lanes.iter().map(|l| l.base.clone()).collect(),
            sinks: lanes.iter().map(|l| l.sink.as_ref().map_or("", |s| s.as_str()).to_owned()).collect(),
        }
    }
}

/// What the fan-out learnt from one publish attempt besides its outcome.
#[derive(Default)]
struct Learnt {
    /// The publish count up to which every lane has room (from the gate).
    room: Option<u64>,
    /// The lane (0-based) the gate found full.
    full: Option<usize>,
    /// The last position published before this entry (from the gate).
    last: Option<Option<Position>>,
}

/// What a claim of the fan-out returns: its epoch, the publish count, the last position published
/// (the highest of the lanes').
type Claimed = (u64, u64, Option<Position>);

/// Claims the fan-out of the stream in `shared` under claim `token`.
pub(crate) fn claim(shared: &Arc<Shared>, token: u64) -> Result<RedisFanout, StreamError> {
    let keys = Keys::new(&shared.lanes);
    let (epoch, published, last) = shared.claim_fanout(token, &keys.meta, |expected, claim| {
        claim_once(&shared.pool, &keys, expected, claim)
    })?;
    Ok(RedisFanout {
        shared: shared.clone(),
        keys,
        epoch,
        progress: Progress::new(published, last),
        token,
        waiter: None,
    })
}

/// One run of `CLAIM_FANOUT`: `None` if the holder is no longer `expected`.
fn claim_once(
    pool: &Pool,
    keys: &Keys,
    expected: &str,
    claim: &str,
) -> Result<Option<Claimed>, BackendError> {
    let v: Value = pool.run(Budget::Retry, |c, _| {
        let mut inv = scripts().claim_fanout.prepare_invoke();
        inv.key(&keys.meta).key(&keys.log);
        for h in &keys.hashes {
            inv.key(h);
        }
        inv.arg(expected).arg(claim).arg(LOG_FENCE_ID);
        inv.invoke(c)
    })?;
    let r = items(&v);
    match r.first().map(text) {
        Some(b"ok") if r.len() == 3 + keys.hashes.len() => {
            let last = r[3..].iter().filter_map(|v| unpad(text(v))).max();
            Ok(Some((int(&r[1]), int(&r[2]), last)))
        }
        Some(b"busy") => Ok(None),
        _ => Err(malformed(pool, "fan-out claim", &v)),
    }
}

/// The one publisher of a stream built with
/// [`RedisStreamBuilder::fanout`](crate::RedisStreamBuilder::fanout), from
/// [`RedisStream::fanout`](crate::RedisStream::fanout): each item is written once into the
/// stream's Redis log (its payload crosses the network once) and published to every lane in the
/// same round trip, with no script on the hot path; every lane's consumer then reads it as a
/// lane alone on its log does. At most one lives per stream across processes, as a lane's
/// producer ([L9](crate::contract#l9)): claiming it starts a new fan-out epoch that fences the
/// previous one's publishes off ([`BackendError::Fenced`]).
///
/// As the in-memory [`Fanout`](crate::Fanout): an item goes to every lane or to none (a publish
/// waits, or `try_` refuses with `Full`, until every lane has room: [L3](crate::contract#l3)),
/// its position must rise on every lane it goes to ([L4](crate::contract#l4)), a closed lane
/// refuses every publish, and [`publish_to`](RedisFanout::publish_to) sends an item to one lane
/// (the others pass it as a gap: one round trip of their consumer, no delivery).
///
/// ```no_run
/// use lanestream::{Batch, LaneConsumer, LaneDelivery, LaneItem, Position, RedisStream, Stream};
/// let stream = RedisStream::builder("redis://127.0.0.1:6379", "orders")
///     .sinks(["search", "cache"])
///     .fanout(true)
///     .build()?;
/// let mut fanout = stream.fanout()?;
/// fanout.publish(LaneItem::Batch(Batch::new(Some(Position(7)), Vec::new().into()))).unwrap();
/// for sink in ["search", "cache"] {
///     stream.reattach(sink)?.recv()?.unwrap().ack()?;
/// }
/// assert_eq!(stream.watermark(), Some(Position(7)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RedisFanout {
    shared: Arc<Shared>,
    keys: Keys,
    epoch: u64,
    /// The stream's publish count (entries in its log, gaps included) and what the fan-out
    /// knows besides; a publish's target is its lane, or every lane (`None`). The last position
    /// is the last published to any lane: positions rise across the log (a lane passes a gap at
    /// its position).
    progress: Progress<Option<usize>>,
    token: u64,
    waiter: Option<Waiter>,
}

/// One publish, as [`RedisFanout::publish_once`] takes it: entry `n`, to lane `to` (or every
/// lane), the encoded item and its position, the last position as the fan-out knows it, and
/// whether it may skip the gate.
#[derive(Clone, Copy)]
struct Publish<'a> {
    n: u64,
    to: Option<usize>,
    payload: &'a [u8],
    position: Option<Position>,
    known: Option<Option<Position>>,
    proven: bool,
}

impl RedisFanout {
    /// How many lanes it publishes to.
    pub fn lanes(&self) -> usize {
        self.keys.hashes.len()
    }

    /// Publishes `item` to every lane if every lane has room now; never waits.
    ///
    /// # Errors
    /// [`TryPublishError`]: `Full` (no lane got it), `Closed` (a lane is closed),
    /// `PositionRegressed`, `InvalidPosition`, `Backend` (`Fenced`: another fan-out was claimed
    /// since; `Connection`: the publish may have landed, and a next publish of the same item
    /// lands it once); the item handed back.
    pub fn try_publish(&mut self, item: LaneItem) -> Result<(), TryPublishError<LaneItem>> {
        self.step(None, item, Budget::Once).map_err(|(e, _)| e)
    }

    /// Publishes `item` to every lane, waiting while a lane is full ([L3](crate::contract#l3)).
    ///
    /// # Errors
    /// [`PublishError`]: `Closed`, `PositionRegressed`, `InvalidPosition`, `Backend`; the item
    /// handed back.
    pub fn publish(&mut self, item: LaneItem) -> Result<(), PublishError<LaneItem>> {
        self.until(None, item, None).map_err(waitable)
    }

    /// [`publish`](RedisFanout::publish) until `deadline`.
    ///
    /// # Errors
    /// As [`publish`](RedisFanout::publish), plus `Timeout` with the item.
    pub fn publish_deadline(
        &mut self,
        item: LaneItem,
        deadline: Instant,
    ) -> Result<(), PublishTimeoutError<LaneItem>> {
        self.until(None, item, Some(deadline))
    }

    /// [`publish`](RedisFanout::publish) for at most `timeout`.
    ///
    /// # Errors
    /// As [`publish_deadline`](RedisFanout::publish_deadline).
    pub fn publish_timeout(
        &mut self,
        item: LaneItem,
        timeout: Duration,
    ) -> Result<(), PublishTimeoutError<LaneItem>> {
        self.until(None, item, Some(Instant::now() + timeout))
    }

    /// Publishes `item` to lane `lane` (in [`sinks`](crate::Stream::sinks) order) only, e.g.
    /// a backfill's reply; the other lanes pass its entry as a gap (acked at its position: they
    /// acked everything before it). Waits while any lane is full (the entry takes a place in
    /// every lane until passed). Its position must rise above every lane's last, as for
    /// [`publish`](RedisFanout::publish).
    ///
    /// # Errors
    /// As [`publish`](RedisFanout::publish).
    ///
    /// # Panics
    /// If `lane` is not below [`lanes`](RedisFanout::lanes).
    pub fn publish_to(&mut self, lane: usize, item: LaneItem) -> Result<(), PublishError<LaneItem>> {
        assert!(lane < self.lanes(), "publish_to: lane {lane} of {}", self.lanes());
        self.until(Some(lane), item, None).map_err(waitable)
    }

    /// As [`publish_to`](RedisFanout::publish_to), never waiting.
    ///
    /// # Errors
    /// As [`try_publish`](RedisFanout::try_publish).
    ///
    /// # Panics
    /// If `lane` is not below [`lanes`](RedisFanout::lanes).
    pub fn try_publish_to(&mut self, lane: usize, item: LaneItem) -> Result<(), TryPublishError<LaneItem>> {
        assert!(lane < self.lanes(), "try_publish_to: lane {lane} of {}", self.lanes());
        self.step(Some(lane), item, Budget::Once).map_err(|(e, _)| e)
    }

    /// [`publish`](RedisFanout::publish), waiting as a task: the wait runs on a helper thread
    /// of this fan-out (started on the first wait), which wakes the task; no runtime.
    ///
    /// # Errors
    /// As [`publish`](RedisFanout::publish).
    pub fn publish_async(
        &mut self,
        item: LaneItem,
    ) -> impl Future<Output = Result<(), PublishError<LaneItem>>> + Send + '_ {
        let mut item = Some(item);
        poll_fn(move |cx| self.poll_publish(&mut item, cx))
    }

    /// Closes every lane ([L10](crate::contract#l10)); retried within the retry budget.
    ///
    /// # Errors
    /// [`BackendError`] if Redis could not be reached.
    pub fn close(&self) -> Result<(), BackendError> {
        for lane in self.shared.lanes.iter() {
            lane.close(&self.shared.pool, Budget::Retry)?;
        }
        Ok(())
    }

    fn poll_publish(
        &mut self,
        item: &mut Option<LaneItem>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), PublishError<LaneItem>>> {
        let Some(it) = item.take() else { return Poll::Ready(Ok(())) };
        match self.step(None, it, Budget::Retry) {
            Ok(()) => Poll::Ready(Ok(())),
            Err((TryPublishError::Full(back), full)) => {
                *item = Some(back);
                let bell = self.shared.lanes[full].pbell();
                let shared = self.shared.clone();
                self.waiter.get_or_insert_with(|| Waiter::new(shared)).arm(bell, cx.waker());
                Poll::Pending
            }
            Err((e, _)) => Poll::Ready(Err(match e.into_waitable() {
                Ok(_) => unreachable!("Full is handled above"),
                Err(e) => e,
            })),
        }
    }

    /// Publishes, waiting on the full lane's publishers' bell while a lane is full, until
    /// `deadline` if any.
    fn until(
        &mut self,
        to: Option<usize>,
        mut item: LaneItem,
        deadline: Option<Instant>,
    ) -> Result<(), PublishTimeoutError<LaneItem>> {
        loop {
            let full = match self.step(to, item, Budget::Retry) {
                Err((TryPublishError::Full(back), full)) => {
                    item = back;
                    full
                }
                other => return other.map_err(|(e, _)| timeout_error(e)),
            };
            let mut slice = self.shared.pool.settings.wait_slice;
            if let Some(deadline) = deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(PublishTimeoutError::Timeout(item));
                }
                slice = slice.min(left);
            }
            let lane = &self.shared.lanes[full];
            if lane.wait(&self.shared.pool, &lane.pbell(), slice).is_err() {
                thread::sleep(self.shared.pool.settings.backoff_min);
            }
        }
    }

    /// One publish attempt, never waiting; on `Full`, the full lane too.
    fn step(
        &mut self,
        to: Option<usize>,
        item: LaneItem,
        budget: Budget,
    ) -> Result<(), (TryPublishError<LaneItem>, usize)> {
        let (item, encoded) = encoded(&self.shared, item).map_err(|e| (e, 0))?;
        let position = encoded.position;
        loop {
            let (n, proven) = self.progress.next(position);
            let mut learnt = Learnt::default();
            let known = self.progress.last;
            let publish = Publish { n, to, payload: &encoded.bytes, position, known, proven };
            let outcome = self.publish_once(budget, &publish, &mut learnt);
            self.progress.learnt(learnt.room, learnt.last);
            let error = match outcome {
                Ok(Published::Done) => {
                    self.progress.landed(position);
                    return Ok(());
                }
                Ok(Published::Duplicate) => {
                    if self.progress.found_landed(&encoded.bytes, &to) {
                        return Ok(()); // this very item, published again: it landed once
                    }
                    continue; // another item: it goes after the one that landed
                }
                Ok(Published::Full) => TryPublishError::Full(item),
                Ok(Published::Closed) => TryPublishError::Closed(item),
                Ok(Published::Regressed(last)) => TryPublishError::PositionRegressed {
                    position: position.expect("only positioned items regress"),
                    last,
                    item,
                },
                Ok(Published::Fenced) => TryPublishError::Backend { item, error: BackendError::Fenced },
                Err(error) => {
                    self.progress.failed(encoded.bytes, to);
                    return Err((TryPublishError::Backend { item, error }, 0));
                }
            };
            return Err((error, learnt.full.unwrap_or(0)));
        }
    }

    /// One publish of entry `p.n`: the gate (`PUBLISH_FANOUT`) first unless `p.proven` (and
    /// after a refused `XADD`), then the entry's `XADD` to the log with every lane's
    /// receive-waiting flag in the same round trip (see "A fan-out stream" in `scripts`).
    fn publish_once(
        &self,
        budget: Budget,
        p: &Publish<'_>,
        learnt: &mut Learnt,
    ) -> Result<Published, BackendError> {
        let Publish { n, to, payload, position, known, proven } = *p;
        let pool = &self.shared.pool;
        let pos = pad(position);
        let id = format!("{n}-{}", self.epoch);
        // The entry's `p`: the last position published as of it (see "A fan-out stream"); for an
        // unpositioned item the one before, which the gate tells when the fan-out does not know.
        let mut record = match (position, known) {
            (Some(_), _) => Some(pos.clone()),
            (None, Some(last)) => Some(pad(last)),
            (None, None) => None,
        };
        let mut tries = 0;
        let v: Result<Value, String> = pool.run(budget, |c, t| {
            tries = t;
            let mut gated = false;
            loop {
                if gated || !proven || t > 0 {
                    let gate = self.gate(c, n, to, &pos)?;
                    let r = items(&gate);
                    match r.first().map(text) {
                        Some(b"ok") if r.len() == 3 => {
                            learnt.room = Some(int(&r[1]));
                            learnt.last = Some(unpad(text(&r[2])));
                            if record.is_none() {
                                record = Some(String::from_utf8_lossy(text(&r[2])).into_owned());
                            }
                        }
                        Some(b"full") if r.len() == 2 => {
                            learnt.full = Some((int(&r[1]) as usize).saturating_sub(1));
                            return Ok(Ok(gate));
                        }
                        Some(b"dup") => {
                            // A publish that landed (this call's first try, or an earlier
                            // call's) whose reply, and so its wake-ups, was lost: the waiting
                            // receives are rung now.
                            self.wake(c)?;
                            return Ok(Ok(gate));
                        }
                        _ => return Ok(Ok(gate)),
                    }
                    if gated {
                        // Let through twice, refused twice: not a state this backend makes.
                        return Ok(Err(format!("lanestream: the fan-out's log refused entry {id}")));
                    }
                }
                let Some(record) = record.as_deref() else {
                    return Ok(Err(format!("lanestream: fan-out entry {id}: no last position known")));
                };
                match self.append(c, &id, to, payload, record)? {
                    true => return Ok(Ok(Value::Array(vec![Value::SimpleString("ok".into())]))),
                    false if !gated => gated = true, // refused: the gate tells why
                    false => return Ok(Err(format!("lanestream: the fan-out's log refused entry {id}"))),
                }
            }
        })?;
        let v = v.map_err(|msg| {
            pool.record(msg);
            BackendError::Server(crate::error::ServerReason::UnexpectedReply)
        })?;
        published(pool, &self.keys.meta, &v, tries == 0)
    }

    /// Runs `PUBLISH_FANOUT` for entry `n` (loading it into a server that does not know it).
    fn gate(&self, c: &mut Connection, n: u64, to: Option<usize>, pos: &str) -> RedisResult<Value> {
        let mut inv = scripts().publish_fanout.prepare_invoke();
        inv.key(&self.keys.meta).key(&self.keys.log);
        for h in &self.keys.hashes {
            inv.key(h);
        }
        inv.arg(self.epoch).arg(n).arg(pos).arg(to.map_or(0, |i| i + 1)).arg("seq").arg("trim");
        for h in &self.keys.hashes {
            inv.arg(h);
        }
        inv.invoke(c)
    }

    /// The `XADD` of one publish, pipelined with a read of every lane's receive-waiting flag:
    /// `true` if it landed, `false` if it was refused (a newer fan-out, a closed lane, or this
    /// entry there already: the gate tells which). Rings the bell of each lane whose consumer
    /// waits: a receive that found the lane empty set its flag before this `XADD` (it reads the
    /// log in one script), so the read after it sees the flag.
    fn append(
        &self,
        c: &mut Connection,
        id: &str,
        to: Option<usize>,
        payload: &[u8],
        pos: &str,
    ) -> RedisResult<bool> {
        let mut pipe = ::redis::pipe();
        pipe.ignore_errors();
        // NOMKSTREAM: a deleted stream is not made again by a fan-out still alive.
        let entry = pipe.cmd("XADD").arg(&self.keys.log).arg("NOMKSTREAM").arg(id);
        entry.arg("d").arg(payload).arg("p").arg(pos);
        if let Some(i) = to {
            entry.arg("t").arg(&self.keys.sinks[i]);
        }
        for h in &self.keys.hashes {
            pipe.cmd("HMGET").arg(h).arg("w").arg("ep");
        }
        let replies: Vec<Value> = pipe.query(c)?;
        if !matches!(replies.first(), Some(Value::BulkString(_))) {
            return Ok(false);
        }
        self.ring(c, &replies[1..])?;
        Ok(true)
    }

    /// Reads every lane's receive-waiting flag and rings the lanes whose consumer waits.
    fn wake(&self, c: &mut Connection) -> RedisResult<()> {
        let mut pipe = ::redis::pipe();
        for h in &self.keys.hashes {
            pipe.cmd("HMGET").arg(h).arg("w").arg("ep");
        }
        let flags: Vec<Value> = pipe.query(c)?;
        self.ring(c, &flags)
    }

    /// Rings the bell of each lane whose flags (`HMGET w ep`, in lane order) say its consumer
    /// waits, clearing the flag first.
    fn ring(&self, c: &mut Connection, flags: &[Value]) -> RedisResult<()> {
        let mut ring = ::redis::pipe();
        let mut any = false;
        for (h, w) in self.keys.hashes.iter().zip(flags) {
            let w = items(w);
            if w.first().map(text) == Some(b"1") {
                let bell = format!("{h}:bell:{}", String::from_utf8_lossy(w.get(1).map_or(b"0", text)));
                ring.cmd("HSET").arg(h).arg("w").arg("0").ignore();
                ring.cmd("LPUSH").arg(&bell).arg("1").ignore();
                ring.cmd("LTRIM").arg(&bell).arg(0).arg(0).ignore();
                any = true;
            }
        }
        if any {
            ring.query::<()>(c)?;
        }
        Ok(())
    }
}

impl Drop for RedisFanout {
    fn drop(&mut self) {
        if let Some(claim) = self.shared.pool.claim_value(self.token) {
            let _ = self.shared.pool.run(Budget::Once, |c, _| {
                scripts().release.key(&self.keys.meta).arg("fh").arg(&claim).invoke::<i64>(c)
            });
        }
        self.shared.pool.forget(self.token);
    }
}

impl fmt::Debug for RedisFanout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisFanout")
            .field("log", &self.keys.log)
            .field("lanes", &self.keys.sinks)
            .field("epoch", &self.epoch)
            .field("published", &self.progress.published)
            .finish_non_exhaustive()
    }
}

// A stop-gap while the Redis backend moves to one layout: runs publish item by item.
impl crate::stream::port::StreamFanout for RedisFanout {
    fn lanes(&self) -> usize {
        RedisFanout::lanes(self)
    }

    fn try_publish(&mut self, item: LaneItem) -> Result<(), TryPublishError<LaneItem>> {
        RedisFanout::try_publish(self, item)
    }

    fn publish(&mut self, item: LaneItem) -> Result<(), PublishError<LaneItem>> {
        RedisFanout::publish(self, item)
    }

    fn publish_deadline(&mut self, item: LaneItem, deadline: Instant) -> Result<(), PublishTimeoutError<LaneItem>> {
        RedisFanout::publish_deadline(self, item, deadline)
    }

    fn publish_async(&mut self, item: LaneItem) -> impl Future<Output = Result<(), PublishError<LaneItem>>> + Send + '_ {
        RedisFanout::publish_async(self, item)
    }

    fn try_publish_run(&mut self, items: &[LaneItem]) -> Result<usize, TryPublishError<usize>> {
        match items.first() {
            None => Ok(0),
            Some(item) => RedisFanout::try_publish(self, item.clone()).map(|()| 1).map_err(|e| e.map(|_| 0)),
        }
    }

    fn publish_run(&mut self, items: &[LaneItem]) -> Result<(), PublishError<usize>> {
        for (i, item) in items.iter().enumerate() {
            RedisFanout::publish(self, item.clone()).map_err(|e| e.map(|_| i))?;
        }
        Ok(())
    }

    fn publish_to(&mut self, lane: usize, item: LaneItem) -> Result<(), PublishError<LaneItem>> {
        RedisFanout::publish_to(self, lane, item)
    }

    fn try_publish_to(&mut self, lane: usize, item: LaneItem) -> Result<(), TryPublishError<LaneItem>> {
        RedisFanout::try_publish_to(self, lane, item)
    }

    fn close(&self) {
        let _ = RedisFanout::close(self);
    }
}
