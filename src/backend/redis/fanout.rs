//! [`RedisFanout`]: the one publisher of a Redis stream, which writes each entry once into the
//! log and publishes it to every lane (see "The fan-out" in `scripts`).

use std::fmt;
use std::future::{poll_fn, Future};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use ::redis::{Connection, RedisResult, Value};

use super::conn::{Budget, Pool};
use super::item::RedisItem;
use super::lane::{int, items as parts, malformed, pad, published, scripts, text, unpad, Published};
use super::scripts::LOG_FENCE_ID;
use super::sender::{encoded, publish_until};
use super::shared::Shared;
use super::waiter::Waiter;
use crate::codec::AlignedVec;
use crate::error::{BackendError, PublishError, StreamError};
use crate::item::LaneItem;
use crate::port::StreamFanout;
use crate::position::Position;

/// The most entries one run script publishes (a longer run goes in several; each script's
/// arguments are held in the server's memory while it runs).
const RUN_MAX: usize = 64;

/// The keys of the stream that the fan-out writes: the log, the meta hash (the fan-out's epoch
/// `fe` and claim `fh`), every lane's hash.
struct Keys {
    log: String,
    meta: String,
    hashes: Vec<String>,
    sinks: Vec<String>,
}

impl Keys {
    fn new(shared: &Shared) -> Keys {
        Keys {
            log: shared.log.clone(),
            meta: shared.meta.clone(),
            hashes: shared.lanes.iter().map(|l| l.base.clone()).collect(),
            sinks: shared
                .lanes
                .iter()
                .map(|l| l.sink.as_ref().map_or("", |s| s.as_str()).to_owned())
                .collect(),
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

/// Claims the fan-out of the stream in `shared` under claim `token`. A stream with no lanes has
/// nothing to claim: its fan-out publishes to no lane (every publish succeeds, as in memory).
pub(crate) fn claim(shared: &Arc<Shared>, token: u64) -> Result<RedisFanout, StreamError> {
    let keys = Keys::new(shared);
    let (epoch, published, last) = if keys.hashes.is_empty() {
        (0, 0, None)
    } else {
        shared.claim_fanout(token, &keys.meta, |expected, claim| {
            claim_once(&shared.pool, &keys, expected, claim)
        })?
    };
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
    let r = parts(&v);
    match r.first().map(text) {
        Some(b"ok") if r.len() == 3 + keys.hashes.len() => {
            let last = r[3..].iter().filter_map(|v| unpad(text(v))).max();
            Ok(Some((int(&r[1]), int(&r[2]), last)))
        }
        Some(b"busy") => Ok(None),
        _ => Err(malformed(pool, "fan-out claim", &v)),
    }
}

/// The one publisher of a [`RedisStream`](crate::RedisStream), from
/// [`Stream::fanout`](crate::Stream::fanout): each item is written once into the stream's Redis
/// log (its payload crosses the network once) and published to every lane in the same round
/// trip, with no script on the hot path of a single publish while it knows there is room; every
/// lane's consumer then reads it from the log. A run
/// ([`publish_run`](StreamFanout::publish_run)) is one script and one round trip for up to 64
/// items. At most one lives per stream across processes ([L9](crate::contract#l9)): claiming it
/// starts a new fan-out epoch that fences the previous one's publishes off
/// ([`BackendError::Fenced`]).
///
/// As the in-memory [`Fanout`](crate::Fanout) ([`StreamFanout`]): an item goes to every lane or
/// to none (a publish waits, or `try_` refuses with `Full`, until every lane has room:
/// [L3](crate::contract#l3)), its position must rise on every lane it goes to
/// ([L4](crate::contract#l4)), a closed lane refuses every publish, and
/// [`publish_to`](StreamFanout::publish_to) sends an item to one lane (the others pass it as a
/// gap: one round trip of their consumer, no delivery; the entry takes a place in every lane
/// until passed). A [`BackendError::Connection`] leaves a publish unsure (it may have landed):
/// publishing the same item(s) again lands them once.
///
/// ```no_run
/// use lanestream::{Batch, LaneConsumer, LaneDelivery, LaneItem, Position, RedisStream, Stream, StreamFanout};
/// let stream = RedisStream::builder("redis://127.0.0.1:6379", "orders").sinks(["search", "cache"]).build()?;
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
    progress: Progress,
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

/// What Redis says when it refuses an `XADD` id that is not above the stream's last one (`ERR The
/// ID specified in XADD is equal or smaller than the target stream top item`, or `... must be
/// greater than 0-0`): the fence of a publish ([`RedisFanout::append`]).
const XADD_ID_REFUSED: &str = "The ID specified in XADD";

impl RedisFanout {
    /// Closes every lane ([L10](crate::contract#l10)), reporting a backend failure
    /// ([`close`](StreamFanout::close) cannot); retried within the retry budget. The close is
    /// stored in Redis and final for every later fan-out of any process: close at the stream's
    /// end only, never on an error (a fan-out let go without a close, as a crashed process's,
    /// leaves the next one free to publish, [L9](crate::contract#l9)).
    ///
    /// # Errors
    /// [`BackendError`] if Redis could not be reached.
    pub fn try_close(&self) -> Result<(), BackendError> {
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
            Err((PublishError::Full(back), full)) => {
                *item = Some(back);
                let bell = self.shared.lanes[full].pbell();
                let shared = self.shared.clone();
                self.waiter.get_or_insert_with(|| Waiter::new(shared, Waiter::PUBLISH)).arm(bell, cx.waker());
                Poll::Pending
            }
            Err((e, _)) => Poll::Ready(Err(e)),
        }
    }

    /// Publishes, waiting on the full lane's publishers' bell while a lane is full, until
    /// `deadline` if any (the backend's one blocking body, `sender::publish_until`).
    fn until(
        &mut self,
        to: Option<usize>,
        item: LaneItem,
        deadline: Option<Instant>,
    ) -> Result<(), PublishError<LaneItem>> {
        let shared = self.shared.clone();
        publish_until(&shared, item, deadline, |item| {
            self.step(to, item, Budget::Retry).map_err(|(e, full)| (e, shared.lanes[full].pbell()))
        })
    }

    /// One publish attempt, never waiting; on `Full`, the full lane too.
    fn step(
        &mut self,
        to: Option<usize>,
        item: LaneItem,
        budget: Budget,
    ) -> Result<(), (PublishError<LaneItem>, usize)> {
        let (item, encoded) = encoded(&self.shared, item).map_err(|e| (e, 0))?;
        if self.keys.hashes.is_empty() {
            return Ok(()); // to no lane: published to every lane there is
        }
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
                Ok(Published::Full) => PublishError::Full(item),
                Ok(Published::Closed) => PublishError::Closed(item),
                Ok(Published::Regressed(last)) => PublishError::PositionRegressed {
                    position: position.expect("only positioned items regress"),
                    last,
                    item,
                },
                Ok(Published::Fenced) => PublishError::Backend { item, error: BackendError::Fenced },
                Err(error) => {
                    self.progress.failed(vec![encoded.bytes], to);
                    return Err((PublishError::Backend { item, error }, 0));
                }
            };
            return Err((error, learnt.full.unwrap_or(0)));
        }
    }

    /// One publish of entry `p.n`: the gate (`PUBLISH_FANOUT`) first unless `p.proven` (and
    /// after a refused `XADD`), then the entry's `XADD` to the log with every lane's
    /// receive-waiting flag in the same round trip (see "The fan-out" in `scripts`).
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
        // The entry's `p`: the last position published as of it (see "The fan-out"); for an
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
                    let r = parts(&gate);
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
        inv.arg(self.epoch).arg(n).arg(pos).arg(to.map_or(0, |i| i + 1)).arg("trim");
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
        match replies.first() {
            Some(Value::BulkString(_)) => {}
            // NOMKSTREAM: the log is gone (the stream was deleted).
            Some(Value::Nil) => return Ok(false),
            // The fence: Redis refuses an id that is not above the log's last one.
            Some(Value::ServerError(e)) if e.details().is_some_and(|d| d.contains(XADD_ID_REFUSED)) => {
                return Ok(false);
            }
            // Anything else did not run the `XADD` and is no verdict on the entry's id: a
            // transient state (`LOADING` after a restart...) is retried as such, the rest is the
            // caller's error.
            Some(Value::ServerError(e)) => return Err(e.clone().into()),
            other => {
                return Err(::redis::RedisError::from((
                    ::redis::ErrorKind::UnexpectedReturnType,
                    "XADD answered neither an id nor a refusal",
                    format!("{other:?}"),
                )));
            }
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
            let w = parts(w);
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

impl RedisFanout {
    /// One run attempt, never waiting: publishes a leading part of `items` (at most
    /// [`RUN_MAX`]), moving it out of the front of `items`, and returns its length; on `Full`,
    /// the full lane too, and on any error `items` as it was. One item, or an unsure earlier
    /// publish to tell apart from this run's items, takes the single publish's path.
    fn run_step(
        &mut self,
        items: &mut Vec<LaneItem>,
        budget: Budget,
    ) -> Result<usize, (PublishError<usize>, usize)> {
        if items.is_empty() {
            return Ok(0);
        }
        if self.keys.hashes.is_empty() {
            let n = items.len();
            items.clear(); // to no lane: published to every lane there is
            return Ok(n);
        }
        if items.len() == 1 || self.progress.unsure.is_some() {
            return self.head_step(items, budget);
        }
        let mut run: Vec<(Option<Position>, AlignedVec)> = Vec::with_capacity(items.len().min(RUN_MAX));
        for item in items.iter().take(RUN_MAX) {
            let position = item.position();
            match item.encode() {
                Ok(bytes) if position != Some(Position::RESERVED) => run.push((position, bytes)),
                _ => break, // refused on its own: the single publish tells why
            }
        }
        if run.len() < 2 {
            return self.head_step(items, budget);
        }
        loop {
            let first = self.progress.published + 1;
            let mut tries = 0;
            let v: Result<Value, BackendError> = self.shared.pool.run(budget, |c, t| {
                tries = t;
                let mut inv = scripts().publish_run.prepare_invoke();
                inv.key(&self.keys.meta).key(&self.keys.log);
                for h in &self.keys.hashes {
                    inv.key(h);
                }
                inv.arg(self.epoch).arg(first).arg(run.len());
                for (position, bytes) in &run {
                    inv.arg(bytes.as_slice()).arg(pad(*position));
                }
                for h in &self.keys.hashes {
                    inv.arg(h);
                }
                inv.invoke(c)
            });
            let v = match v {
                Ok(v) => v,
                Err(error) => {
                    // Some of the run may have landed: the next publish tells (see `Progress`).
                    self.progress.failed(run.into_iter().map(|(_, b)| b).collect(), None);
                    return Err((PublishError::Backend { item: 0, error }, 0));
                }
            };
            let r = parts(&v);
            let refused = match r.first().map(text) {
                Some(b"ok") if r.len() == 4 => {
                    let n = int(&r[1]) as usize;
                    self.progress.learnt(Some(int(&r[2])), None);
                    let last = run[..n].iter().filter_map(|(p, _)| *p).next_back();
                    self.progress.landed_run(n as u64, last);
                    if n == 0 {
                        // The first item's position did not rise after all (the gate's checks
                        // passed it): the single publish refuses it with the last position.
                        return self.head_step(items, budget);
                    }
                    items.drain(..n);
                    return Ok(n);
                }
                Some(b"landed") if r.len() == 2 => {
                    let m = int(&r[1]);
                    if tries > 0 {
                        // This call's own first try landed them; its reply was lost.
                        let last = run[..m as usize].iter().filter_map(|(p, _)| *p).next_back();
                        self.progress.landed_run(m, last);
                        items.drain(..m as usize);
                        return Ok(m as usize);
                    }
                    // Entries nobody here is unsure of: published past this fan-out's count
                    // (not by another fan-out: that one's claim fenced this one). Skipped over,
                    // as the single publish does.
                    self.progress.published += m;
                    self.progress.last = None;
                    continue;
                }
                Some(b"full") if r.len() == 2 => {
                    let lane = (int(&r[1]) as usize).saturating_sub(1);
                    return Err((PublishError::Full(0), lane));
                }
                Some(b"closed") => PublishError::Closed(0),
                Some(b"regressed") => match r.get(1).and_then(|v| unpad(text(v))) {
                    Some(last) => PublishError::PositionRegressed {
                        item: 0,
                        position: run[0].0.expect("only positioned items regress"),
                        last,
                    },
                    None => {
                        let error = malformed(&self.shared.pool, "publish run", &v);
                        PublishError::Backend { item: 0, error }
                    }
                },
                Some(b"fenced") => match self.shared.pool.check_state(&self.keys.meta) {
                    Ok(()) => PublishError::Backend { item: 0, error: BackendError::Fenced },
                    Err(error) => PublishError::Backend { item: 0, error },
                },
                _ => {
                    let error = malformed(&self.shared.pool, "publish run", &v);
                    PublishError::Backend { item: 0, error }
                }
            };
            return Err((refused, 0));
        }
    }
}

impl RedisFanout {
    /// The single publish of the first of `items`, moved out of it; on an error it goes back
    /// in front.
    fn head_step(
        &mut self,
        items: &mut Vec<LaneItem>,
        budget: Budget,
    ) -> Result<usize, (PublishError<usize>, usize)> {
        let head = items.remove(0);
        self.step(None, head, budget).map(|()| 1).map_err(|(e, full)| (handed_back(e, items), full))
    }
}

impl StreamFanout for RedisFanout {
    fn lanes(&self) -> usize {
        self.keys.hashes.len()
    }

    /// Publishes `item` to every lane if every lane has room now; never waits (one try, no
    /// reconnecting).
    ///
    /// # Errors
    /// [`PublishError`]: `Full` (no lane got it), `Closed` (a lane is closed),
    /// `PositionRegressed`, `InvalidPosition`, `Backend` (`Fenced`: another fan-out was claimed
    /// since; `Connection`: the publish may have landed, and a next publish of the same item
    /// lands it once); the item handed back.
    fn try_publish(&mut self, item: LaneItem) -> Result<(), PublishError<LaneItem>> {
        self.step(None, item, Budget::Once).map_err(|(e, _)| e)
    }

    fn publish_deadline(
        &mut self,
        item: LaneItem,
        deadline: Option<Instant>,
    ) -> Result<(), PublishError<LaneItem>> {
        self.until(None, item, deadline)
    }

    /// Waits as a task: the wait runs on a helper thread of this fan-out
    /// (`lanestream-redis-publish-wait`, started on the first wait), which wakes the task; no
    /// runtime.
    fn publish_async(
        &mut self,
        item: LaneItem,
    ) -> impl Future<Output = Result<(), PublishError<LaneItem>>> + Send + '_ {
        let mut item = Some(item);
        poll_fn(move |cx| self.poll_publish(&mut item, cx))
    }

    /// One script and one round trip for up to 64 items (two or more; one item takes the single
    /// publish's path), one try.
    fn try_publish_run(&mut self, items: &mut Vec<LaneItem>) -> Result<usize, PublishError<usize>> {
        self.run_step(items, Budget::Once).map_err(|(e, _)| e)
    }

    /// One script and one round trip per 64 items while every lane has room; waits on the full
    /// lane's bell (the one blocking body of the backend) while one is full.
    fn publish_run(&mut self, items: &mut Vec<LaneItem>) -> Result<(), PublishError<usize>> {
        let mut done = 0;
        let shared = self.shared.clone();
        while !items.is_empty() {
            let mut went = 0;
            let waited =
                publish_until(&shared, 0usize, None, |_| match self.run_step(items, Budget::Retry) {
                    Ok(n) => {
                        went = n;
                        Ok(())
                    }
                    Err((e, full)) => Err((e, shared.lanes[full].pbell())),
                });
            match waited {
                Ok(()) => done += went,
                Err(e) => return Err(e.map(|i| done + i)),
            }
        }
        Ok(())
    }

    fn publish_to(&mut self, lane: usize, item: LaneItem) -> Result<(), PublishError<LaneItem>> {
        assert!(lane < self.lanes(), "publish_to: lane {lane} of {}", self.lanes());
        self.until(Some(lane), item, None)
    }

    fn try_publish_to(&mut self, lane: usize, item: LaneItem) -> Result<(), PublishError<LaneItem>> {
        assert!(lane < self.lanes(), "try_publish_to: lane {lane} of {}", self.lanes());
        self.step(Some(lane), item, Budget::Once).map_err(|(e, _)| e)
    }

    /// Closes every lane; retried within the retry budget, then given up silently (see
    /// [`try_close`](RedisFanout::try_close)).
    fn close(&self) {
        let _ = self.try_close();
    }
}

/// A run's error: `e`'s item put back in front of `items`, and 0 (none of this step's items
/// published) in its place.
fn handed_back(e: PublishError<LaneItem>, items: &mut Vec<LaneItem>) -> PublishError<usize> {
    let mut item = None;
    let e = e.map(|back| {
        item = Some(back);
        0
    });
    items.insert(0, item.expect("every publish error holds its item"));
    e
}

/// What the fan-out knows between its publishes: what lets a publish skip the gate script, and
/// what tells a retried publish from the next item. A publish's target is its lane, or every
/// lane (`None`).
struct Progress {
    /// The stream's publish count (entries in its log, gaps included), as of the last publish.
    published: u64,
    /// The payloads and target of the last publish that ended in an error (one item, or a
    /// run's items in order): they may have landed all the same (a lost reply), the first ones
    /// of a run at least. A next publish that finds its entry already there is a retry of the
    /// first of them if both are equal, else that one landed and the new item goes after it.
    unsure: Option<(Vec<AlignedVec>, Option<usize>)>,
    /// The publish count up to which every lane has room, as the gate last saw it (the acked
    /// prefix only grows): publishes up to it skip the gate.
    room: u64,
    /// The last position published as the fan-out knows it (from its claim, then its own
    /// publishes; `None` when it does not know: after finding an earlier call's publish landed).
    /// A publish not above it takes the gate (which refuses it). Positions rise across the log
    /// (a lane passes a gap at its position).
    last: Option<Option<Position>>,
}

impl Progress {
    /// A claimed fan-out's: the publish count and the last position, as the claim read them.
    fn new(published: u64, last: Option<Position>) -> Self {
        Progress { published, unsure: None, room: 0, last: Some(last) }
    }

    /// The count a publish of an item at `position` would take, and whether it may skip the
    /// gate: room proven, its position rises (or it has none), nothing unsure, and not every
    /// 64th entry (the gate trims the log then).
    fn next(&self, position: Option<Position>) -> (u64, bool) {
        let after = self.published + 1;
        let rises = match (position, self.last) {
            (_, None) => false,
            (Some(p), Some(Some(last))) => p > last,
            _ => true,
        };
        (after, self.unsure.is_none() && after <= self.room && rises && after % 64 != 0)
    }

    /// What a gate answered: the room, and the last position before this publish.
    fn learnt(&mut self, room: Option<u64>, last: Option<Option<Position>>) {
        if let Some(room) = room {
            self.room = room;
        }
        if last.is_some() {
            self.last = last;
        }
    }

    /// The publish of an item at `position` landed (nothing is unsure any more: it went after
    /// whatever had landed).
    fn landed(&mut self, position: Option<Position>) {
        self.landed_run(1, position);
    }

    /// A run of `n` items landed, the last positioned of them at `last` (if any).
    fn landed_run(&mut self, n: u64, last: Option<Position>) {
        if n == 0 {
            return;
        }
        self.published += n;
        self.unsure = None;
        if last.is_some() {
            self.last = Some(last);
        }
    }

    /// The entry for the next count was there already: an earlier call's, whose error hid that it
    /// landed (and moved the last position, which only the gate knows now). `true` if it was
    /// this very publish (`bytes` to `target`) again: it landed once.
    fn found_landed(&mut self, bytes: &[u8], target: &Option<usize>) -> bool {
        self.published += 1;
        self.last = None;
        let Some((earlier, to)) = &mut self.unsure else { return false };
        let same = !earlier.is_empty() && earlier[0].as_slice() == bytes && to == target;
        if !earlier.is_empty() {
            earlier.remove(0);
        }
        if earlier.is_empty() {
            self.unsure = None;
        }
        same
    }

    /// The publish of `bytes` (one item, or a run's in order) to `target` ended in an error that
    /// leaves it unsure: it may have landed.
    fn failed(&mut self, bytes: Vec<AlignedVec>, target: Option<usize>) {
        self.unsure = Some((bytes, target));
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
