//! [`RedisStream`] and its builder: the [`Stream`] port over Redis Streams.

use std::fmt;
use std::future::{poll_fn, Future};
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use ::redis::Value;

use super::conn::{Budget, Pool, Settings};
use super::consumer::RedisConsumer;
use super::fanout::{self, RedisFanout};
use super::lane::{items, malformed, query, scripts, text, unpad, LaneDef};
use super::sender::RedisRequestSender;
use super::shared::Shared;
use super::waiter::{wait_until, Waiter};
use crate::error::{BackendError, BuildError, StreamError};
use crate::item::{LaneItem, Request};
use crate::lane::LaneStats;
use crate::name::SinkName;
use crate::port::Stream;
use crate::position::Position;
use crate::sync::lock;

/// The layout this version writes and reads, as the meta hash records it (`mode`): one log
/// written once by the fan-out, every sink lane reading it. The retired per-lane-producer
/// layout is `lanes` (and every stream made before the layout was recorded).
const LAYOUT: &str = "fanout";

/// The `about` field of every lane hash. Its value is longer than Redis's
/// `hash-max-listpack-value` (64 bytes by default), which keeps the hash in Redis's hashtable
/// encoding: the scripts read and write a dozen of its 25 or so fields per operation, and in the
/// compact listpack encoding each of those is a scan of the whole hash (3 µs of server time
/// per batch on the hot path, `INFO commandstats`).
const LANE_HASH_ABOUT: &str =
    "lanestream lane state; a value over 64 bytes, so that Redis keeps this hash in its hashtable encoding";

/// Builds a [`RedisStream`]: the server, the stream's name, the capacities and the sinks.
///
/// ```no_run
/// use lanestream::{RedisStream, Stream};
/// let stream = RedisStream::builder("redis://127.0.0.1:6379", "orders_pipeline")
///     .capacity(256)
///     .sinks(["search", "cache"])
///     .build()?;
/// assert_eq!(stream.sinks().len(), 2);
/// # Ok::<(), lanestream::BuildError>(())
/// ```
#[derive(Clone, Debug)]
pub struct RedisStreamBuilder {
    url: String,
    name: String,
    capacity: usize,
    request_capacity: usize,
    sinks: Vec<String>,
    settings: Settings,
}

impl RedisStreamBuilder {
    /// The default lane capacity, in items (batches).
    pub const DEFAULT_CAPACITY: usize = 1024;

    /// A builder for the stream `name` on the server at `url` (`redis://host:port/db`,
    /// `redis+unix:///path/to/socket`, ...), with the default capacities (1024 per lane, 64 for
    /// requests) and no sinks.
    pub fn new(url: impl Into<String>, name: impl Into<String>) -> Self {
        RedisStreamBuilder {
            url: url.into(),
            name: name.into(),
            capacity: Self::DEFAULT_CAPACITY,
            request_capacity: 64,
            sinks: Vec::new(),
            settings: Settings::default(),
        }
    }

    /// Unacked items per sink lane before publishing waits (>= 1). May change between runs.
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity;
        self
    }

    /// Unacked requests in the request lane before senders wait (>= 1).
    pub fn request_capacity(mut self, capacity: usize) -> Self {
        self.request_capacity = capacity;
        self
    }

    /// Adds a sink (one lane).
    pub fn sink(mut self, name: impl Into<String>) -> Self {
        self.sinks.push(name.into());
        self
    }

    /// Adds sinks, in order.
    pub fn sinks<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.sinks.extend(names.into_iter().map(Into::into));
        self
    }

    /// How long a waiting operation keeps reconnecting after a lost connection before it returns
    /// [`BackendError::Connection`] (default 5 s). The never-waiting forms try once.
    pub fn retry_for(mut self, retry_for: Duration) -> Self {
        self.settings.retry_for = retry_for;
        self
    }

    /// The socket read/write timeout (default 10 s).
    pub fn io_timeout(mut self, timeout: Duration) -> Self {
        self.settings.io_timeout = timeout.max(self.settings.wait_slice + Duration::from_secs(1));
        self
    }

    /// Deletes every key stored in Redis under the stream's name, whatever its layout, without
    /// building it (as [`RedisStream::delete`]): for a stream in the retired layout, which
    /// [`build`](RedisStreamBuilder::build) refuses ([`BuildError::RetiredLayout`]). Stop every
    /// end of that stream first. The sinks and capacities are not used.
    ///
    /// # Errors
    /// [`BuildError::InvalidStreamName`], [`BuildError::InvalidUrl`], [`BuildError::Backend`]
    /// (Redis unreachable within the retry budget, or refusing).
    pub fn delete(self) -> Result<(), BuildError> {
        if self.name.is_empty() || self.name.contains(['{', '}']) {
            return Err(BuildError::InvalidStreamName(self.name));
        }
        let client = ::redis::Client::open(self.url.as_str())
            .map_err(|e| BuildError::InvalidUrl(format!("{}: {e}", self.url)))?;
        let pool = Pool::new(client, self.settings, &self.name);
        delete_stream(&pool, &self.name).map_err(BuildError::Backend)
    }

    /// Connects, checks or creates the stream's keys, and returns the stream. A stream of the
    /// same name already in Redis (a restarted process) is picked up where it was: its entries,
    /// pending deliveries and acked positions are kept.
    ///
    /// # Errors
    /// As [`StreamBuilder::build`](crate::StreamBuilder::build), plus
    /// [`BuildError::InvalidStreamName`] (empty, or holding `{` or `}`),
    /// [`BuildError::InvalidUrl`], [`BuildError::Backend`] (Redis unreachable, or refusing),
    /// [`BuildError::RetiredLayout`] (Redis holds a stream of that name in the retired
    /// per-lane-producer layout: nothing is changed; delete it with
    /// [`delete`](RedisStreamBuilder::delete) and build again) and [`BuildError::Mismatch`] (Redis holds a stream of that name with other
    /// sinks).
    pub fn build(self) -> Result<RedisStream, BuildError> {
        let sinks = crate::port::checked_shape(self.capacity, self.request_capacity, self.sinks)?;
        if self.name.is_empty() || self.name.contains(['{', '}']) {
            return Err(BuildError::InvalidStreamName(self.name));
        }
        let client = ::redis::Client::open(self.url.as_str())
            .map_err(|e| BuildError::InvalidUrl(format!("{}: {e}", self.url)))?;
        let pool = Pool::new(client, self.settings, &self.name);
        let prefix = format!("{{{}}}", self.name);
        let hashes: Vec<String> = sinks.iter().map(|s| LaneDef::sink_base(&prefix, s)).collect();
        let lanes: Vec<LaneDef> =
            sinks.iter().map(|s| LaneDef::sink(&prefix, s.clone(), self.capacity, hashes.clone())).collect();
        let requests = LaneDef::requests(&prefix, self.request_capacity);
        let meta = format!("{prefix}:meta");
        let names = sinks.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(",");
        let backend = BuildError::Backend;
        // The sinks and the layout, recorded by the build that makes the stream.
        let describe = ::redis::Script::new(&super::scripts::source(super::scripts::DESCRIBE));
        let fresh = pool.fresh_incarnation();
        let (stored, stored_layout, incarnation): (String, String, String) =
            query(&pool, Budget::Retry, |c| {
                describe.key(&meta).arg(&names).arg(LAYOUT).arg(&fresh).invoke(c)
            })
            .map_err(backend)?;
        if stored_layout != LAYOUT {
            return Err(BuildError::RetiredLayout(self.name));
        }
        pool.set_incarnation(incarnation);
        if stored != names {
            return Err(BuildError::Mismatch(format!(
                "stream {:?} has sinks [{stored}], this build asked for [{names}]",
                self.name
            )));
        }
        for lane in lanes.iter().chain([&requests]) {
            let _: i64 = query(&pool, Budget::Retry, |c| {
                let mut set = ::redis::cmd("HSET");
                set.arg(&lane.base).arg("cap").arg(lane.capacity).arg("about").arg(LANE_HASH_ABOUT);
                if lane.sink.is_some() {
                    // The lane's publishes are the log's entries (see "The fan-out").
                    set.arg("fan").arg("1");
                }
                set.query(c)
            })
            .map_err(backend)?;
        }
        // The logs, made empty if missing (every publish and record is `NOMKSTREAM`: an end of a
        // deleted stream does not make it again; this build does).
        let log = format!("{prefix}:log");
        let make = ::redis::Script::new(MAKE_LOGS);
        let _: i64 =
            query(&pool, Budget::Retry, |c| make.key(&log).key(&requests.log).invoke(c)).map_err(backend)?;
        pool.anchor_id().map_err(backend)?;
        let shared = Shared {
            pool,
            sinks: sinks.into(),
            lanes: lanes.into_iter().map(Arc::new).collect(),
            requests: Arc::new(requests),
            log,
            meta,
            watermark_waiters: format!("{prefix}:ww"),
            watermark: Mutex::new(None),
            request_stats: Mutex::new(None),
        };
        Ok(RedisStream { shared: Arc::new(shared), name: self.name })
    }
}

/// Makes each log stream given (KEYS) that does not exist, empty (an entry `0-1` added and
/// trimmed: every entry's id is above it).
const MAKE_LOGS: &str = r#"
for _, K in ipairs(KEYS) do
  if redis.call('EXISTS', K) == 0 then
    redis.call('XADD', K, '0-1', 'p', '')
    redis.call('XTRIM', K, 'MAXLEN', 0)
  end
end
return 1
"#;

/// The [`Stream`] port over Redis Streams (feature `redis`): one Redis stream per pipeline
/// (its log), written once by the stream's one [`RedisFanout`] and read by every sink lane, and
/// a second stream for the request lane. Cheap to clone; every clone is the same stream. Several
/// processes may open the same stream (by name) and hold its ends: an ingest engine in one, each
/// sink engine in its own.
///
/// See the [`redis`](crate::redis) module page for the layout in Redis and for every difference
/// from [`MemoryStream`](crate::MemoryStream); [`last_error`](RedisStream::last_error) has the
/// message behind the last [`BackendError`].
///
/// ```no_run
/// use lanestream::{Batch, LaneConsumer, LaneDelivery, LaneItem, Position, RedisStream, Stream, StreamFanout};
/// let stream = RedisStream::builder("redis://127.0.0.1:6379", "orders").sink("search").build()?;
/// let mut fanout = stream.fanout()?;
/// fanout.publish(LaneItem::Batch(Batch::new(Some(Position(7)), Vec::new().into()))).unwrap();
/// // ...in the sink process (a restarted one re-attaches and gets its unacked batches again):
/// let mut consumer = stream.reattach("search")?;
/// consumer.recv()?.unwrap().ack()?;
/// // ...in the ingest process: confirm once every sink has acked it.
/// assert_eq!(stream.wait_watermark(Position(7), None), Some(Position(7)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct RedisStream {
    shared: Arc<Shared>,
    name: String,
}

impl RedisStream {
    /// A [`RedisStreamBuilder`] for the stream `name` on the server at `url`.
    pub fn builder(url: impl Into<String>, name: impl Into<String>) -> RedisStreamBuilder {
        RedisStreamBuilder::new(url, name)
    }

    /// The stream's name (its keys are `{name}:...`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The message of the last error any end of this stream met, if any: the one behind the
    /// last [`BackendError`] returned, or a lost connection that a retry recovered from (which
    /// returned no error). It is history, not status: a later success does not clear it.
    pub fn last_error(&self) -> Option<String> {
        self.shared.pool.last_error()
    }

    /// How many times a connection of this stream (its ends' and clones' included) was found
    /// lost or could not be made, since the stream was built: a count that only grows, for
    /// monitoring.
    ///
    /// A call whose lost connection a retry recovered from returns what it would have returned
    /// without the loss (every script is safe to run twice: a publish lands once, an ack counts
    /// once), so the loss shows here and in [`last_error`](RedisStream::last_error), not as an
    /// error of the call. What does surface as an error: a call whose retry budget ran out
    /// ([`BackendError::Connection`]; the next call reconnects), an ack whose retry cannot tell
    /// whether it landed ([`AckError::Backend`](crate::AckError)`(Connection)`), and an end
    /// whose claim another process took while this process's connections were down
    /// ([`BackendError::Fenced`] on publish, `Detached` on receive and ack). A request sent again
    /// after a connection lost mid-call may land twice ([R2](crate::contract#r2)).
    pub fn connection_errors(&self) -> u64 {
        self.shared.pool.connection_errors()
    }

    fn lane(&self, sink: &str) -> Result<&Arc<LaneDef>, StreamError> {
        self.shared
            .lanes
            .iter()
            .find(|l| l.sink.as_ref().is_some_and(|s| s.as_str() == sink))
            .ok_or_else(|| StreamError::UnknownLane(sink.to_owned()))
    }

    fn consumer(&self, sink: &str, polite: bool) -> Result<RedisConsumer<LaneItem>, StreamError> {
        let lane = self.lane(sink)?;
        let token = self.shared.pool.token();
        let epoch = self.shared.attach_lane(lane, polite, token)?;
        Ok(RedisConsumer::new(self.shared.clone(), lane.clone(), Some(epoch), token))
    }

    /// The watermark, or the error that kept it from being read ([`watermark`](Stream::watermark)
    /// falls back to the last one read).
    ///
    /// # Errors
    /// [`BackendError`] if Redis could not be reached.
    pub fn try_watermark(&self) -> Result<Option<Position>, BackendError> {
        self.read_watermark(None).map(|(w, _)| w)
    }

    /// One run of `WATERMARK` (one round trip): the watermark (never below one this stream read
    /// before: [W3](crate::contract#w3)) and whether it is final (every lane closed, everything
    /// published acked); with `waiter`, its wake-up key registered first (see "Watermark
    /// waiters" in `scripts`).
    fn read_watermark(&self, waiter: Option<&str>) -> Result<(Option<Position>, bool), BackendError> {
        let shared = &self.shared;
        if shared.lanes.is_empty() {
            return Ok((None, true));
        }
        let v: Value = shared.pool.run(Budget::Once, |c, _| {
            let mut inv = scripts().watermark.prepare_invoke();
            inv.key(&shared.meta).key(&shared.watermark_waiters);
            for lane in shared.lanes.iter() {
                inv.key(&lane.base);
            }
            inv.arg(waiter.unwrap_or(""));
            inv.invoke(c)
        })?;
        let r = items(&v);
        if r.len() != 2 {
            return Err(malformed(&shared.pool, "watermark", &v));
        }
        let w = unpad(text(&r[0]));
        let mut seen = lock(&shared.watermark);
        if w > *seen {
            *seen = w;
        }
        Ok((*seen, text(&r[1]) == b"1"))
    }

    /// A wake-up key of its own for one watermark wait (see "Watermark waiters" in `scripts`).
    fn watermark_bell(&self) -> WatermarkBell {
        let token = self.shared.pool.token();
        let key = format!(
            "{}:wbell:{}:{token}",
            self.shared.meta.trim_end_matches(":meta"),
            self.shared.pool.nonce()
        );
        WatermarkBell { shared: self.shared.clone(), key }
    }

    /// Whether the stream is idle, or the error that kept it from being read
    /// ([`is_idle`](Stream::is_idle) answers `false` then).
    ///
    /// # Errors
    /// [`BackendError`] if Redis could not be reached.
    pub fn try_is_idle(&self) -> Result<bool, BackendError> {
        let lanes = self.shared.lanes.iter().chain([&self.shared.requests]).map(|l| &**l);
        LaneDef::fold(&self.shared.pool, Budget::Once, lanes)?;
        let counts: Vec<(Option<u64>, Option<u64>)> = query(&self.shared.pool, Budget::Once, |c| {
            let mut pipe = ::redis::pipe();
            for lane in self.shared.lanes.iter().chain([&self.shared.requests]) {
                pipe.cmd("HMGET").arg(&lane.base).arg("pub").arg("ai");
            }
            pipe.query(c)
        })?;
        Ok(counts.iter().all(|(p, a)| p.unwrap_or(0) == a.unwrap_or(0)))
    }

    /// The request lane's counters, or the error that kept them from being read.
    ///
    /// # Errors
    /// [`BackendError`] if Redis could not be reached.
    pub fn try_request_stats(&self) -> Result<LaneStats, BackendError> {
        let st = self.shared.requests.stats(&self.shared.pool, Budget::Once)?;
        *lock(&self.shared.request_stats) = Some(st.clone());
        Ok(st)
    }

    /// Closes the request lane, reporting a backend failure.
    ///
    /// # Errors
    /// [`BackendError`] if Redis could not be reached within the retry budget.
    pub fn try_close_requests(&self) -> Result<(), BackendError> {
        self.shared.requests.close(&self.shared.pool, Budget::Retry)
    }

    /// Trims the sink log now, below every sink lane's acked prefix (never above: the
    /// entries before each lane's first unacked one), as publishing does every 64 entries;
    /// returns the entry number up to which entries are gone. The request lane's log is trimmed
    /// too.
    ///
    /// # Errors
    /// [`BackendError`] if Redis could not be reached.
    pub fn trim(&self) -> Result<u64, BackendError> {
        self.shared.requests.trim(&self.shared.pool, Budget::Retry)?;
        match self.shared.lanes.first() {
            Some(lane) => lane.trim(&self.shared.pool, Budget::Retry),
            None => Ok(0),
        }
    }

    /// Deletes every key of this stream from Redis (entries, lane state): for tests, for
    /// retiring a pipeline, and for a stream stored in the retired layout
    /// ([`BuildError::RetiredLayout`]). Ends still alive get errors or empty lanes afterwards, and do not
    /// make the stream again. A stream built again under the same name starts its epochs at the
    /// server's clock, so the old consumers' acks and receives are refused there; but stop every
    /// fan-out of the old stream before building it again: one still publishing on room it knew
    /// could add entries to the new stream.
    ///
    /// # Errors
    /// [`BackendError`] if Redis could not be reached.
    pub fn delete(&self) -> Result<(), BackendError> {
        delete_stream(&self.shared.pool, &self.name)
    }
}

/// Deletes every key of stream `name` (`{name}:*`) through `pool`.
fn delete_stream(pool: &Pool, name: &str) -> Result<(), BackendError> {
    // The name goes into a SCAN pattern: its glob characters are escaped, so that a stream
    // named `a*` deletes its own keys, not those of every stream whose name starts with `a`.
    let mut pattern = String::with_capacity(name.len() + 4);
    pattern.push('{');
    for c in name.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^' | '-') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push_str("}:*");
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = query(pool, Budget::Retry, |c| {
            ::redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(&pattern).arg("COUNT").arg(1000).query(c)
        })?;
        if !keys.is_empty() {
            query(pool, Budget::Retry, |c| ::redis::cmd("UNLINK").arg(&keys).query::<i64>(c))?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

impl Stream for RedisStream {
    type Fanout = RedisFanout;
    type Consumer = RedisConsumer<LaneItem>;
    type RequestSender = RedisRequestSender;
    type RequestConsumer = RedisConsumer<Request>;

    fn sinks(&self) -> &[SinkName] {
        &self.shared.sinks
    }

    /// Claims the fan-out across processes (one lives at a time; a claim of a dead process's is
    /// taken over at once, and the older fan-out's publishes are refused from then on with
    /// [`BackendError::Fenced`]).
    fn fanout(&self) -> Result<RedisFanout, StreamError> {
        let token = self.shared.pool.token();
        fanout::claim(&self.shared, token)
    }

    fn attach(&self, sink: &str) -> Result<RedisConsumer<LaneItem>, StreamError> {
        self.consumer(sink, true)
    }

    fn reattach(&self, sink: &str) -> Result<RedisConsumer<LaneItem>, StreamError> {
        self.consumer(sink, false)
    }

    fn close(&self, sink: &str) -> Result<(), StreamError> {
        self.lane(sink)?.close(&self.shared.pool, Budget::Retry).map_err(StreamError::Backend)
    }

    fn acked(&self, sink: &str) -> Result<Option<Position>, StreamError> {
        let lane = self.lane(sink)?;
        LaneDef::fold(&self.shared.pool, Budget::Retry, [&**lane].into_iter())
            .map_err(StreamError::Backend)?;
        let ap = lane.field(&self.shared.pool, Budget::Retry, "ap").map_err(StreamError::Backend)?;
        Ok(ap.and_then(|p| p.parse::<u64>().ok()).map(Position))
    }

    fn stats(&self, sink: &str) -> Result<LaneStats, StreamError> {
        self.lane(sink)?.stats(&self.shared.pool, Budget::Retry).map_err(StreamError::Backend)
    }

    /// The request lane's counters; while Redis cannot be reached, the last ones read (or zeros).
    fn request_stats(&self) -> LaneStats {
        self.try_request_stats().unwrap_or_else(|_| {
            lock(&self.shared.request_stats).clone().unwrap_or(LaneStats {
                capacity: self.shared.requests.capacity,
                queued: 0,
                released: 0,
                in_flight: 0,
                delivered: 0,
                redelivered: 0,
                published: 0,
                acked_items: 0,
                pinned: 0,
                last_published: None,
                acked: None,
                closed: false,
            })
        })
    }

    fn request_sender(&self) -> RedisRequestSender {
        RedisRequestSender::new(self.shared.clone(), self.shared.requests.clone())
    }

    fn attach_requests(&self) -> Result<RedisConsumer<Request>, StreamError> {
        let token = self.shared.pool.token();
        let epoch = self.shared.attach_lane(&self.shared.requests, true, token)?;
        Ok(RedisConsumer::new(self.shared.clone(), self.shared.requests.clone(), Some(epoch), token))
    }

    /// Re-attaches now; if Redis cannot be reached, the consumer re-attaches on its first
    /// receive (and reports the error there).
    fn reattach_requests(&self) -> RedisConsumer<Request> {
        let token = self.shared.pool.token();
        let epoch = self.shared.attach_lane(&self.shared.requests, false, token).ok();
        RedisConsumer::new(self.shared.clone(), self.shared.requests.clone(), epoch, token)
    }

    /// Closes the request lane; retried within the retry budget, then given up silently (see
    /// [`try_close_requests`](RedisStream::try_close_requests)).
    fn close_requests(&self) {
        let _ = self.try_close_requests();
    }

    /// The watermark; while Redis cannot be reached, the highest one this stream read before
    /// (never more than what was acked: safe to confirm).
    fn watermark(&self) -> Option<Position> {
        self.try_watermark().unwrap_or_else(|_| *lock(&self.shared.watermark))
    }

    /// Blocks on a wake-up key of this wait's own, which every ack that finds a watermark
    /// waiter registered rings (see "Watermark waiters" in `scripts`): no polling. Each wait
    /// lasts at most the stream's wait slice, after which it reads again (a wake-up lost with a
    /// connection costs that much); while Redis cannot be reached it keeps trying until the
    /// deadline and returns the highest watermark read before.
    fn wait_watermark(&self, at_least: Position, deadline: Option<Instant>) -> Option<Position> {
        if self.shared.lanes.is_empty() {
            return None;
        }
        let bell = self.watermark_bell();
        let answer = wait_until(&self.shared, deadline, || match self.read_watermark(Some(&bell.key)) {
            Ok((w, done)) if done || w >= Some(at_least) => ControlFlow::Break(w),
            Ok(_) => ControlFlow::Continue(Some(bell.key.clone())),
            // Redis not reached: the loop sleeps the backoff and reads again.
            Err(_) => ControlFlow::Continue(None),
        });
        // At the deadline: the highest watermark read before.
        answer.unwrap_or_else(|| *lock(&self.shared.watermark))
    }

    /// The wait runs on a helper thread of this future (`lanestream-redis-watermark-wait`,
    /// started on its first wait), which wakes the task; no runtime.
    fn wait_watermark_async(&self, at_least: Position) -> impl Future<Output = Option<Position>> + Send + '_ {
        let bell = self.watermark_bell();
        let mut waiter: Option<Waiter> = None;
        poll_fn(move |cx| {
            if self.shared.lanes.is_empty() {
                return Poll::Ready(None);
            }
            match self.read_watermark(Some(&bell.key)) {
                Ok((w, done)) if done || w >= Some(at_least) => return Poll::Ready(w),
                _ => {}
            }
            // On an error the waiter's wait (one wait slice at most) runs all the same.
            let shared = self.shared.clone();
            waiter
                .get_or_insert_with(|| Waiter::new(shared, Waiter::WATERMARK))
                .arm(bell.key.clone(), cx.waker());
            Poll::Pending
        })
    }

    /// Whether everything is acked; `false` while Redis cannot be reached.
    fn is_idle(&self) -> bool {
        self.try_is_idle().unwrap_or(false)
    }
}

/// One watermark wait's wake-up key; dropped, it leaves the waiters' set (a token pushed after
/// that expires with its key).
struct WatermarkBell {
    shared: Arc<Shared>,
    key: String,
}

impl Drop for WatermarkBell {
    fn drop(&mut self) {
        let _ = self.shared.pool.run(Budget::Once, |c, _| {
            ::redis::pipe()
                .cmd("SREM")
                .arg(&self.shared.watermark_waiters)
                .arg(&self.key)
                .ignore()
                .cmd("DEL")
                .arg(&self.key)
                .ignore()
                .query::<()>(c)
        });
    }
}

impl fmt::Debug for RedisStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStream")
            .field("name", &self.name)
            .field("sinks", &self.shared.sinks)
            .finish_non_exhaustive()
    }
}
