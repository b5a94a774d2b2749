//! One lane's keys in Redis and the operations on them: each a script (see `scripts`), with its
//! reply parsed into a plain enum for the ends.

use std::sync::OnceLock;

use ::redis::{Cmd, Connection, RedisResult, Script, ServerErrorKind, Value};

use super::conn::{Budget, Pool};
use super::scripts;
use crate::error::BackendError;
use crate::lane::LaneStats;
use crate::name::SinkName;
use crate::position::Position;

/// The compiled scripts (hashed once; loaded into the server on first use).
pub(crate) struct Scripts {
    publish: Script,
    receive: Script,
    ack: Script,
    nack: Script,
    attach: Script,
    pub(crate) claim_fanout: Script,
    pub(crate) publish_fanout: Script,
    pub(crate) publish_run: Script,
    pub(crate) release: Script,
    close: Script,
    trim: Script,
    stats: Script,
    fold: Script,
    pub(crate) watermark: Script,
    ring_watermark: Script,
}

pub(crate) fn scripts() -> &'static Scripts {
    static SCRIPTS: OnceLock<Scripts> = OnceLock::new();
    SCRIPTS.get_or_init(|| {
        let s = |body| Script::new(&scripts::source(body));
        Scripts {
            publish: s(scripts::PUBLISH),
            receive: s(scripts::RECEIVE),
            ack: s(scripts::ACK),
            nack: s(scripts::NACK),
            attach: s(scripts::ATTACH),
            claim_fanout: s(scripts::CLAIM_FANOUT),
            publish_fanout: s(scripts::PUBLISH_FANOUT),
            publish_run: s(scripts::PUBLISH_RUN),
            release: s(scripts::RELEASE_CLAIM),
            close: s(scripts::CLOSE),
            trim: s(scripts::TRIM),
            stats: s(scripts::STATS),
            fold: s(scripts::FOLD),
            watermark: s(scripts::WATERMARK),
            ring_watermark: s(scripts::RING_WATERMARK),
        }
    })
}

/// A position as Redis stores it: 20 zero-padded digits, so that string order is number order.
pub(crate) fn pad(p: Option<Position>) -> String {
    p.map_or_else(String::new, |p| format!("{:020}", p.0))
}

pub(crate) fn unpad(s: &[u8]) -> Option<Position> {
    std::str::from_utf8(s).ok().and_then(|s| s.parse::<u64>().ok()).map(Position)
}

/// The pieces of a script's reply.
pub(crate) fn items(v: &Value) -> &[Value] {
    match v {
        Value::Array(items) => items,
        _ => &[],
    }
}

pub(crate) fn text(v: &Value) -> &[u8] {
    match v {
        Value::BulkString(b) => b,
        Value::SimpleString(s) => s.as_bytes(),
        _ => b"",
    }
}

pub(crate) fn int(v: &Value) -> u64 {
    match v {
        Value::Int(i) => (*i).max(0) as u64,
        Value::BulkString(b) => std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()).unwrap_or(0),
        _ => 0,
    }
}

/// A malformed reply: a server-side failure as far as the caller is concerned.
pub(crate) fn malformed(pool: &Pool, what: &str, v: &Value) -> BackendError {
    pool.record(format!("lanestream: unexpected reply to {what}: {v:?}"));
    BackendError::Server(crate::error::ServerReason::UnexpectedReply)
}

/// What a publish did.
pub(crate) enum Published {
    /// Published (or found already published by an earlier try of the same call, whose reply
    /// was lost).
    Done,
    /// The entry for this publish count was already there on the call's first try: an earlier
    /// call's publish landed although that call ended in an error. Whether it held this item is
    /// the caller's to tell (`RedisFanout` compares the payloads).
    Duplicate,
    Full,
    Closed,
    Regressed(Position),
    /// A newer fan-out holds the stream.
    Fenced,
}

/// What a receive found.
pub(crate) enum Received {
    /// `gap`: an entry of the sink log published to another lane (see "The fan-out" in
    /// `scripts`): the consumer acks it on its way past.
    Item {
        n: u64,
        attempt: u32,
        payload: Vec<u8>,
        gap: bool,
    },
    Empty,
    Closed,
    Detached,
}

/// What an ack did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Acked {
    /// Acked (or found acked before).
    Done,
    Detached,
    /// A retried ack found the epoch changed and the item acked: maybe by the first try, maybe
    /// by the new consumer after a redelivery.
    Unknown,
}

/// One lane's keys and constants.
pub(crate) struct LaneDef {
    /// The sink, or `None` for the request lane.
    pub(crate) sink: Option<SinkName>,
    /// The lane's base key (also its hash).
    pub(crate) base: String,
    rel: String,
    ack: String,
    /// The redeliveries of each released entry (`B:att`).
    att: String,
    /// The ack log (`B:al`, see "The ack log" in `scripts`).
    ack_log_key: String,
    /// The delivery log (`B:dl`, see "The delivery log" in `scripts`).
    delivery_log_key: String,
    pub(crate) log: String,
    pub(crate) meta: String,
    /// The meta field of the log's trim floor.
    trim_field: &'static str,
    /// The hashes of every lane that reads this lane's log (every sink lane for a sink lane;
    /// the lane's own for the request lane): the trim floor, and the lanes whose `ww` an ack's
    /// wake-up of the watermark waiters clears.
    pub(crate) hashes: Vec<String>,
    /// The watermark waiters' set (`{P}:ww`, see "Watermark waiters" in `scripts`).
    pub(crate) watermark_waiters: String,
    pub(crate) capacity: usize,
}

impl LaneDef {
    /// A sink lane of the stream whose hash-tagged prefix is `prefix`, one of those whose hashes
    /// are `hashes` (every sink lane's, in order).
    pub(crate) fn sink(prefix: &str, sink: SinkName, capacity: usize, hashes: Vec<String>) -> LaneDef {
        let base = LaneDef::sink_base(prefix, &sink);
        LaneDef::new(prefix, base, Some(sink), "log", "trim", hashes, capacity)
    }

    /// The base key (and hash) of sink lane `sink` of the stream whose prefix is `prefix`.
    pub(crate) fn sink_base(prefix: &str, sink: &SinkName) -> String {
        format!("{prefix}:l:{sink}")
    }

    /// The request lane of the stream whose prefix is `prefix`.
    pub(crate) fn requests(prefix: &str, capacity: usize) -> LaneDef {
        let base = format!("{prefix}:r");
        LaneDef::new(prefix, base.clone(), None, "req", "rtrim", vec![base], capacity)
    }

    fn new(
        prefix: &str,
        base: String,
        sink: Option<SinkName>,
        log: &str,
        trim_field: &'static str,
        hashes: Vec<String>,
        capacity: usize,
    ) -> LaneDef {
        LaneDef {
            rel: format!("{base}:rel"),
            ack: format!("{base}:ack"),
            att: format!("{base}:att"),
            ack_log_key: format!("{base}:al"),
            delivery_log_key: format!("{base}:dl"),
            log: format!("{prefix}:{log}"),
            meta: format!("{prefix}:meta"),
            trim_field,
            hashes,
            watermark_waiters: format!("{prefix}:ww"),
            capacity,
            sink,
            base,
        }
    }

    /// The consumer wake-up key of `epoch`.
    pub(crate) fn bell(&self, epoch: u64) -> String {
        format!("{}:bell:{epoch}", self.base)
    }

    /// The publishers' wake-up key.
    pub(crate) fn pbell(&self) -> String {
        format!("{}:pbell", self.base)
    }

    /// A request sender's publish of `payload` (at `position`) on the request lane (see "The
    /// request lane" in `scripts`).
    pub(crate) fn publish(
        &self,
        pool: &Pool,
        budget: Budget,
        payload: &[u8],
        position: Option<Position>,
    ) -> Result<Published, BackendError> {
        let pos = pad(position);
        let v: Value = pool.run(budget, |c, _| {
            let mut inv = scripts().publish.prepare_invoke();
            inv.key(&self.base).key(&self.log).key(&self.meta);
            inv.arg(&self.base).arg(payload).arg(&pos).arg(self.trim_field);
            for hash in &self.hashes {
                inv.arg(hash);
            }
            inv.invoke(c)
        })?;
        // A sender's publish is never a duplicate (a retried one may land twice: R2).
        published(pool, &self.meta, &v, false)
    }

    /// Receives the lane's next item. `expect` is the entry number the consumer expects next
    /// (0: none): when the lane delivers that entry, its payload comes from a plain `XRANGE`
    /// pipelined after the script (see `scripts::RECEIVE`). `fast`: no entry of the consumer's
    /// epoch waits for redelivery as far as it knows, so the expected entry is first taken
    /// through the delivery log, without a script (`receive_logged`).
    pub(crate) fn receive(
        &self,
        pool: &Pool,
        budget: Budget,
        epoch: u64,
        request: u64,
        expect: u64,
        fast: bool,
    ) -> Result<Received, BackendError> {
        let (v, range): (Value, Option<Value>) = pool.run(budget, |c, tries| {
            if fast && expect > 0 && tries == 0 {
                if let Some(payload) = self.receive_logged(c, epoch, expect)? {
                    return Ok((Value::Nil, Some(payload)));
                }
            }
            let mut eval = evalsha(&scripts().receive, &[&self.base, &self.rel, &self.log, &self.att]);
            eval.arg(epoch).arg(request).arg(expect);
            if expect == 0 {
                return run_script(c, &scripts().receive, &eval, None).map(|mut v| (v.remove(0), None));
            }
            let mut range = ::redis::cmd("XRANGE");
            range.arg(&self.log).arg(expect).arg(expect);
            let mut v = run_script(c, &scripts().receive, &eval, Some(range))?;
            let range = v.pop();
            Ok((v.remove(0), range))
        })?;
        if v == Value::Nil {
            // The fast path's: the expected entry, delivered by the delivery log.
            return match range.as_ref().and_then(range_entry) {
                Some((payload, target)) => {
                    Ok(Received::Item { n: expect, attempt: 1, payload, gap: self.is_gap(target) })
                }
                None => Err(malformed(pool, "receive (XRANGE)", &v)),
            };
        }
        let r = items(&v);
        Ok(match r.first().map(text) {
            Some(b"item") if (3..=5).contains(&r.len()) => {
                let n = int(&r[1]);
                let (payload, target) = match r.get(3) {
                    Some(Value::BulkString(b)) => (b.clone(), r.get(4).map(|t| text(t).to_vec())),
                    // The expected entry: its payload is the pipelined XRANGE's.
                    None if n == expect => match range.as_ref().and_then(range_entry) {
                        Some(entry) => entry,
                        None => return Err(malformed(pool, "receive (XRANGE)", &v)),
                    },
                    _ => return Err(malformed(pool, "receive", &v)),
                };
                let attempt = int(&r[2]).min(u32::MAX as u64) as u32;
                Received::Item { n, attempt, payload, gap: self.is_gap(target) }
            }
            Some(b"empty") => Received::Empty,
            Some(b"closed") => Received::Closed,
            Some(b"detached") => {
                pool.check_state(&self.meta)?;
                Received::Detached
            }
            _ => return Err(malformed(pool, "receive", &v)),
        })
    }

    /// Whether an entry published to `target` (`None`: to every lane) is a gap on this lane.
    fn is_gap(&self, target: Option<Vec<u8>>) -> bool {
        match (target, &self.sink) {
            (Some(t), Some(sink)) => t != sink.as_str().as_bytes(),
            _ => false,
        }
    }

    /// The receive of new entry `n`, the one the consumer of `epoch` expects, without a script: a plain `XADD` of `<epoch>-<n>` to the lane's delivery log
    /// (refused once a re-attach raised its last id, or if `n` was recorded before) and an
    /// `XRANGE` of the entry, in one round trip (see "The delivery log" in `scripts`). The
    /// `XRANGE` reply when both did their part; `None` otherwise, and the caller runs `RECEIVE`,
    /// which tells a detached consumer, an entry not published yet, and a lost reply apart.
    fn receive_logged(&self, c: &mut Connection, epoch: u64, n: u64) -> RedisResult<Option<Value>> {
        let mut pipe = ::redis::pipe();
        // Atomic: no fold of the delivery log may run between the record and the read (a fold
        // then could drop the record of an entry published just after it, leaving `rd` below an
        // entry the consumer holds). NOMKSTREAM: a deleted stream is not made again. MAXLEN 1:
        // a fold reads only the newest record, and a consumer that never finds its lane empty
        // (so never runs the script that folds) must not grow the log.
        pipe.atomic().ignore_errors();
        pipe.cmd("XADD")
            .arg(&self.delivery_log_key)
            .arg("NOMKSTREAM")
            .arg("MAXLEN")
            .arg(1)
            .arg(format!("{epoch}-{n}"))
            .arg("p")
            .arg("");
        pipe.cmd("XRANGE").arg(&self.log).arg(n).arg(n);
        let mut replies: Vec<Value> = pipe.query(c)?;
        let range = replies.pop();
        let logged = matches!(replies.first(), Some(Value::BulkString(_)));
        Ok(range.filter(|r| logged && range_entry(r).is_some()))
    }

    /// Acks entry `n`, whose item is at `position`, delivered as `attempt`; rings the watermark
    /// waiters if any waits (see "Watermark waiters" in `scripts`). `resent`: an ack an earlier
    /// call could not settle (every try failed), sent again as a retry (`ACK`, which finds it
    /// landed if it did).
    #[allow(clippy::too_many_arguments)] // the ack's own fields, and how to send it
    pub(crate) fn ack(
        &self,
        pool: &Pool,
        budget: Budget,
        epoch: u64,
        n: u64,
        position: Option<Position>,
        attempt: u32,
        resent: bool,
    ) -> Result<Acked, BackendError> {
        let pos = pad(position);
        let v: Value = pool.run(budget, |c, tries| {
            let retry = if tries > 0 || resent { "1" } else { "0" };
            if tries == 0 && attempt == 1 && !resent {
                if let Some(v) = self.ack_logged(c, epoch, n, &pos)? {
                    return Ok(v);
                }
            }
            let mut inv = scripts().ack.prepare_invoke();
            inv.key(&self.base).key(&self.ack).key(&self.att);
            inv.arg(epoch).arg(n).arg(&pos).arg(retry).arg(attempt);
            let v: Value = inv.invoke(c)?;
            if items(&v).get(1).map(text) == Some(b"ww") {
                self.ring_watermark(c)?;
            }
            Ok(v)
        })?;
        Ok(match items(&v).first().map(text) {
            Some(b"ok") => Acked::Done,
            Some(b"detached") => {
                pool.check_state(&self.meta)?;
                Acked::Detached
            }
            Some(b"unknown") => Acked::Unknown,
            _ => return Err(malformed(pool, "ack", &v)),
        })
    }

    /// The ack of entry `n` (a first delivery, first try): a plain `XADD` of `<epoch>-<n>` to the
    /// lane's ack log, which lands unless a re-attach raised the log's last id above the epoch or
    /// an ack of a later entry came first (see "The ack log" in `scripts`), with the `pw` and
    /// `ww` flags read in the same round trip; a publisher waiting for room is rung, and so are
    /// the watermark waiters. `None` when the `XADD` was refused: the caller runs `ACK`, which
    /// tells a detached ack from an out-of-order one (which it acks).
    fn ack_logged(&self, c: &mut Connection, epoch: u64, n: u64, pos: &str) -> RedisResult<Option<Value>> {
        let mut pipe = ::redis::pipe();
        pipe.ignore_errors();
        // NOMKSTREAM: a deleted stream is not made again by an end still alive.
        pipe.cmd("XADD")
            .arg(&self.ack_log_key)
            .arg("NOMKSTREAM")
            .arg(format!("{epoch}-{n}"))
            .arg("p")
            .arg(pos);
        pipe.cmd("HMGET").arg(&self.base).arg("pw").arg("ww");
        let replies: Vec<Value> = pipe.query(c)?;
        if !matches!(replies.first(), Some(Value::BulkString(_))) {
            return Ok(None);
        }
        let flags = replies.get(1).map_or(&[][..], items);
        if flags.first().map(text) == Some(b"1") {
            // Cleared before the token is pushed: a publisher that sets it again after this
            // waits for the next ack's token, never for a token already taken.
            let mut ring = ::redis::pipe();
            ring.cmd("HSET").arg(&self.base).arg("pw").arg("0").ignore();
            ring.cmd("LPUSH").arg(self.pbell()).arg("1").ignore();
            ring.cmd("LTRIM").arg(self.pbell()).arg(0).arg(0).ignore();
            ring.query::<()>(c)?;
        }
        if flags.get(1).map(text) == Some(b"1") {
            self.ring_watermark(c)?;
        }
        Ok(Some(Value::Array(vec![Value::SimpleString("ok".into())])))
    }

    /// Rings every watermark waiter of the stream (`RING_WATERMARK`): an ack found `ww` set.
    fn ring_watermark(&self, c: &mut Connection) -> RedisResult<()> {
        let mut inv = scripts().ring_watermark.prepare_invoke();
        inv.key(&self.watermark_waiters);
        for hash in &self.hashes {
            inv.key(hash);
        }
        inv.invoke::<i64>(c).map(drop)
    }

    /// Releases entry `n` (delivered as `attempt`) for redelivery; a stale nack does nothing.
    pub(crate) fn nack(
        &self,
        pool: &Pool,
        budget: Budget,
        epoch: u64,
        n: u64,
        attempt: u32,
    ) -> Result<(), BackendError> {
        pool.run(budget, |c, _| {
            scripts()
                .nack
                .key(&self.base)
                .key(&self.rel)
                .key(&self.ack)
                .key(&self.att)
                .arg(&self.base)
                .arg(epoch)
                .arg(n)
                .arg(attempt)
                .invoke::<Value>(c)
        })
        .map(drop)
    }

    /// Attaches (`polite`: only while the holder is still `expected`) or re-attaches a consumer
    /// under claim `claim`: `Ok(Ok(epoch))`, or `Ok(Err(holder))` if another holds the lane.
    pub(crate) fn attach(
        &self,
        pool: &Pool,
        polite: bool,
        expected: &str,
        claim: &str,
    ) -> Result<Result<u64, String>, BackendError> {
        let v: Value = pool.run(Budget::Retry, |c, _| {
            scripts()
                .attach
                .key(&self.base)
                .key(&self.rel)
                .key(&self.ack)
                .arg(&self.base)
                .arg(if polite { "attach" } else { "reattach" })
                .arg(expected)
                .arg(claim)
                .invoke(c)
        })?;
        let r = items(&v);
        match r.first().map(text) {
            Some(b"ok") if r.len() == 2 => Ok(Ok(int(&r[1]))),
            Some(b"busy") if r.len() == 2 => Ok(Err(String::from_utf8_lossy(text(&r[1])).into_owned())),
            _ => Err(malformed(pool, "attach", &v)),
        }
    }

    /// Gives up claim `claim` under `field` (`holder`) if Redis still holds it.
    pub(crate) fn release(&self, pool: &Pool, field: &str, claim: &str) -> Result<(), BackendError> {
        pool.run(Budget::Once, |c, _| {
            scripts().release.key(&self.base).arg(field).arg(claim).invoke::<i64>(c)
        })
        .map(drop)
    }

    /// One field of the lane's hash.
    pub(crate) fn field(
        &self,
        pool: &Pool,
        budget: Budget,
        field: &str,
    ) -> Result<Option<String>, BackendError> {
        pool.run(budget, |c, _| ::redis::cmd("HGET").arg(&self.base).arg(field).query(c))
    }

    /// Closes the lane (see `scripts::CLOSE`): for a sink lane, the fan-out publishes no more.
    pub(crate) fn close(&self, pool: &Pool, budget: Budget) -> Result<(), BackendError> {
        let sink = self.sink.is_some();
        pool.run(budget, |c, _| {
            let mut inv = scripts().close.prepare_invoke();
            inv.key(&self.base).key(&self.log);
            if sink {
                inv.key(&self.watermark_waiters);
                for hash in &self.hashes {
                    inv.key(hash);
                }
            }
            inv.arg(&self.base).arg(if sink { "f" } else { "r" }).arg(scripts::LOG_FENCE_ID);
            inv.invoke::<i64>(c)
        })
        .map(drop)
    }

    pub(crate) fn stats(&self, pool: &Pool, budget: Budget) -> Result<LaneStats, BackendError> {
        let v: Value = pool.run(budget, |c, _| scripts().stats.key(&self.base).key(&self.rel).invoke(c))?;
        let r = items(&v);
        if r.len() != 10 {
            return Err(malformed(pool, "stats", &v));
        }
        let (published, read, acked_items) = (int(&r[1]), int(&r[2]), int(&r[3]));
        let (redelivered, released) = (int(&r[4]), int(&r[9]));
        Ok(LaneStats {
            capacity: self.capacity,
            queued: published.saturating_sub(read),
            released,
            in_flight: read.saturating_sub(acked_items).saturating_sub(released),
            delivered: read + redelivered,
            redelivered,
            published,
            acked_items,
            pinned: 0,
            last_published: unpad(text(&r[5])),
            acked: unpad(text(&r[6])),
            closed: text(&r[7]) == b"1",
        })
    }

    /// Trims this lane's log below every reading lane's acked prefix; returns the floor
    /// (entries up to it are gone).
    pub(crate) fn trim(&self, pool: &Pool, budget: Budget) -> Result<u64, BackendError> {
        pool.run(budget, |c, _| {
            let mut inv = scripts().trim.prepare_invoke();
            inv.key(&self.log).key(&self.meta).arg(self.trim_field);
            for hash in &self.hashes {
                inv.arg(hash);
            }
            inv.invoke(c)
        })
    }

    /// Folds the publish records and ack logs of `lanes` into their counters and acked
    /// prefixes, before a plain read of them.
    pub(crate) fn fold<'a>(
        pool: &Pool,
        budget: Budget,
        lanes: impl Iterator<Item = &'a LaneDef>,
    ) -> Result<(), BackendError> {
        let hashes: Vec<&str> = lanes.map(|l| l.base.as_str()).collect();
        if hashes.is_empty() {
            return Ok(());
        }
        pool.run(budget, |c, _| {
            let mut inv = scripts().fold.prepare_invoke();
            for key in &hashes {
                inv.key(*key);
            }
            inv.invoke::<i64>(c)
        })
        .map(drop)
    }
}

/// An `EVALSHA` of `script` with `keys`; the caller adds the arguments.
fn evalsha(script: &Script, keys: &[&str]) -> Cmd {
    let mut cmd = ::redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys.len()).arg(keys);
    cmd
}

/// A publish script's reply (`PUBLISH` and `PUBLISH_FANOUT` answer alike);
/// `first_try`: the reply is to the call's first try (a `dup` then is an earlier call's entry;
/// `false` for a sender, whose publish is never a duplicate).
/// A fenced publish is [`BackendError::StateLost`] when the stream's state (its meta hash
/// `meta`) is gone.
pub(crate) fn published(
    pool: &Pool,
    meta: &str,
    v: &Value,
    first_try: bool,
) -> Result<Published, BackendError> {
    let r = items(v);
    Ok(match r.first().map(text) {
        Some(b"ok") => Published::Done,
        Some(b"dup") if first_try => Published::Duplicate,
        Some(b"dup") => Published::Done,
        Some(b"full") => Published::Full,
        Some(b"closed") => Published::Closed,
        Some(b"fenced") => {
            pool.check_state(meta)?;
            Published::Fenced
        }
        Some(b"regressed") => match r.get(1).and_then(|v| unpad(text(v))) {
            Some(last) => Published::Regressed(last),
            None => return Err(malformed(pool, "publish", v)),
        },
        _ => return Err(malformed(pool, "publish", v)),
    })
}

/// Runs `eval` (an [`evalsha`] of `script`), then `then` if any, in one round trip; returns
/// their replies in that order. A server that does not know the script yet (`NOSCRIPT`: a new
/// or restarted server) gets it loaded, and the whole round trip is sent again: `then` must be
/// a read that may run twice.
fn run_script(c: &mut Connection, script: &Script, eval: &Cmd, then: Option<Cmd>) -> RedisResult<Vec<Value>> {
    let mut pipe = ::redis::pipe();
    pipe.ignore_errors().add_command(eval.clone());
    if let Some(then) = then {
        pipe.add_command(then);
    }
    let mut replies: Vec<Value> = pipe.query(c)?;
    if matches!(replies.first(), Some(Value::ServerError(e)) if e.kind() == Some(ServerErrorKind::NoScript)) {
        script.load(c)?;
        replies = pipe.query(c)?;
    }
    for r in &replies {
        if let Value::ServerError(e) = r {
            return Err(e.clone().into());
        }
    }
    Ok(replies)
}

/// The `d` field (the payload) of the one entry in an `XRANGE` reply, and its `t` field (the
/// one lane a fan-out's entry was published to), if any.
fn range_entry(v: &Value) -> Option<(Vec<u8>, Option<Vec<u8>>)> {
    let entry = items(items(v).first()?);
    let fields = items(entry.get(1)?);
    let payload = match (fields.first().map(text), fields.get(1)?) {
        (Some(b"d"), Value::BulkString(b)) => b.clone(),
        _ => return None,
    };
    let target = match (fields.get(4).map(text), fields.get(5)) {
        (Some(b"t"), Some(t)) => Some(text(t).to_vec()),
        _ => None,
    };
    Some((payload, target))
}

/// Runs a plain command, for the stream's set-up and reads.
pub(crate) fn query<T: ::redis::FromRedisValue>(
    pool: &Pool,
    budget: Budget,
    mut f: impl FnMut(&mut ::redis::Connection) -> RedisResult<T>,
) -> Result<T, BackendError> {
    pool.run(budget, |c, _| f(c))
}
