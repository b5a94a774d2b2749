//! The Redis backend against the floor for this broker: a bare `XADD` / `XREADGROUP` / `XACK`
//! loop written with the same client, on the same server, in the same run.
//!
//! Both sides do the same work per batch: encode it with the codec, add it to a stream, read it
//! back through a consumer group, decode it (validated), ack it; one thread, one batch in flight
//! (three round trips per batch for each side: the bare loop's three commands; the backend's
//! publish `XADD`, receive (a delivery-log record with its `XRANGE`) and ack (an ack-log
//! record)). Criterion
//! measures each side; then interleaved rounds (ours, bare, bare, ours, ...) give the ratio
//! (backend batches/s over bare batches/s; the issue's goal is >= 0.8).
//!
//! Needs a server: `LANESTREAM_REDIS_URL=redis://127.0.0.1:6399 cargo bench --bench redis`
//! (without it the bench says so and exits). `LANESTREAM_BENCH_ROUNDS` and
//! `LANESTREAM_BENCH_BATCHES` set the ratio's rounds (default 9) and batches per round (2000),
//! `LANESTREAM_BENCH_ENVELOPES` the envelopes per batch (default 16, about 1.8 KB encoded),
//! `LANESTREAM_BENCH_SINKS` the sinks (default 1; more share one log, and the bare loop reads
//! and acks through as many consumer groups). Our side publishes through the stream's fan-out
//! (one publish for every lane, as the bare loop's one `XADD`), the only publisher a Redis
//! stream has.
//! `LANESTREAM_BENCH_RUN=64` publishes in runs of that many batches on both sides (ours one
//! `publish_run`, the bare loop one pipeline of as many `XADD`s: one round trip per run each),
//! then receives and acks them one at a time on both (default 1: one publish per batch).
//! `LANESTREAM_BENCH_ONLY=ours` (or `bare`) runs `LANESTREAM_BENCH_BATCHES` batches of that side
//! alone and nothing else, for the server's own accounting of one side (`CONFIG RESETSTAT`
//! before, `INFO commandstats` and `INFO cpu` after).

use lanestream::prelude::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, Throughput};
use lanestream::codec::{decode_item, encode_item, AlignedVec};
use lanestream::{
    Batch, Envelope, IndexName, LaneConsumer, LaneItem, Op, Position, RedisStream, Stream, StreamFanout,
};

/// A count from the environment (criterion owns the command line).
fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A batch of upserts of about 100 bytes each (16 by default: a small transaction), at `position`.
fn batch(envelopes: &Arc<[Envelope]>, position: u64) -> LaneItem {
    LaneItem::Batch(Batch::new(Some(Position(position)), envelopes.clone()))
}

fn envelopes() -> Arc<[Envelope]> {
    (0..env("LANESTREAM_BENCH_ENVELOPES", 16))
        .map(|i| Envelope {
            index: IndexName::new("public_users").unwrap(),
            id: format!("{i}"),
            op: Op::Upsert,
            position: Some(Position(1)),
            document: Bytes::from(format!(
                r#"{{"id":{i},"name":"user {i}","email":"user{i}@example.com","n":{i}}}"#
            )),
            built_at_micros: None,
            relation: None,
            old_id: None,
            unchanged: Vec::new(),
        })
        .collect()
}

/// A run of `n` batches through one side; returns the time it took.
trait Side {
    fn run(&mut self, n: u64) -> Duration;
}

/// The backend: the fan-out's publish, then try_recv and ack on every lane of
/// `LANESTREAM_BENCH_SINKS` (default 1).
struct Ours {
    stream: RedisStream,
    fanout: lanestream::RedisFanout,
    consumers: Vec<lanestream::RedisConsumer<LaneItem>>,
    envelopes: Arc<[Envelope]>,
    next: u64,
}

/// The sinks of both sides: `bench` alone, or `bench`, `bench_1`, ... for
/// `LANESTREAM_BENCH_SINKS` > 1.
fn sinks() -> Vec<String> {
    (0..env("LANESTREAM_BENCH_SINKS", 1).max(1))
        .map(|i| if i == 0 { "bench".to_string() } else { format!("bench_{i}") })
        .collect()
}

impl Ours {
    fn new(url: &str, name: &str) -> Ours {
        let names = sinks();
        let stream =
            RedisStream::builder(url, name).capacity(64).sinks(names.iter().cloned()).build().unwrap();
        let fanout = stream.fanout().unwrap();
        let consumers = names.iter().map(|n| stream.reattach(n).unwrap()).collect();
        Ours { stream, fanout, consumers, envelopes: envelopes(), next: 1 }
    }
}

/// How many batches each publish carries on both sides (`LANESTREAM_BENCH_RUN`, at least 1).
fn run_len() -> u64 {
    env("LANESTREAM_BENCH_RUN", 1).max(1)
}

impl Side for Ours {
    fn run(&mut self, n: u64) -> Duration {
        let k = run_len();
        if k > 1 {
            return self.runs(n, k);
        }
        let start = Instant::now();
        for _ in 0..n {
            self.fanout.publish(batch(&self.envelopes, self.next)).unwrap();
            for consumer in &mut self.consumers {
                let d = consumer.try_recv().unwrap();
                assert_eq!(d.position(), Some(Position(self.next)));
                d.ack().unwrap();
            }
            self.next += 1;
        }
        start.elapsed()
    }
}

impl Ours {
    /// `n` batches (rounded up to whole runs) in runs of `k`: one `publish_run` each, then every
    /// lane receives and acks them one at a time.
    fn runs(&mut self, n: u64, k: u64) -> Duration {
        let start = Instant::now();
        for _ in 0..n.div_ceil(k) {
            let mut run: Vec<LaneItem> =
                (self.next..self.next + k).map(|p| batch(&self.envelopes, p)).collect();
            self.fanout.publish_run(&mut run).unwrap();
            for consumer in &mut self.consumers {
                for p in self.next..self.next + k {
                    let d = consumer.try_recv().unwrap();
                    assert_eq!(d.position(), Some(Position(p)));
                    d.ack().unwrap();
                }
            }
            self.next += k;
        }
        start.elapsed()
    }
}

/// The floor: XADD (with an approximate MAXLEN so the stream stays small, as trimming does on
/// our side), then for each of as many consumer groups as our side has sinks XREADGROUP COUNT 1
/// and XACK.
struct Bare {
    conn: redis::Connection,
    key: String,
    groups: Vec<String>,
    envelopes: Arc<[Envelope]>,
    next: u64,
}

impl Bare {
    fn new(url: &str, name: &str) -> Bare {
        let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
        let key = format!("{{{name}}}:bare");
        let groups: Vec<String> = sinks();
        for g in &groups {
            let _: () = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(&key)
                .arg(g)
                .arg("0")
                .arg("MKSTREAM")
                .query(&mut conn)
                .unwrap();
        }
        Bare { conn, key, groups, envelopes: envelopes(), next: 1 }
    }
}

impl Side for Bare {
    fn run(&mut self, n: u64) -> Duration {
        let k = run_len();
        if k > 1 {
            return self.runs(n, k);
        }
        let start = Instant::now();
        for _ in 0..n {
            let bytes = encode_item(&batch(&self.envelopes, self.next)).unwrap();
            let _: String = redis::cmd("XADD")
                .arg(&self.key)
                .arg("MAXLEN")
                .arg("~")
                .arg(1000)
                .arg("*")
                .arg("d")
                .arg(bytes.as_slice())
                .query(&mut self.conn)
                .unwrap();
            for g in &self.groups {
                let reply: redis::Value = redis::cmd("XREADGROUP")
                    .arg("GROUP")
                    .arg(g)
                    .arg("c")
                    .arg("COUNT")
                    .arg(1)
                    .arg("STREAMS")
                    .arg(&self.key)
                    .arg(">")
                    .query(&mut self.conn)
                    .unwrap();
                let (id, payload) = entry(&reply);
                let mut aligned: AlignedVec = AlignedVec::with_capacity(payload.len());
                aligned.extend_from_slice(payload);
                let item = decode_item(&aligned).unwrap();
                assert_eq!(item.position(), Some(Position(self.next)));
                let _: i64 = redis::cmd("XACK").arg(&self.key).arg(g).arg(id).query(&mut self.conn).unwrap();
            }
            self.next += 1;
        }
        start.elapsed()
    }
}

impl Bare {
    /// `n` batches (rounded up to whole runs) in runs of `k`: one pipeline of `k` `XADD`s each,
    /// then for each group `k` times `XREADGROUP COUNT 1` and `XACK`.
    fn runs(&mut self, n: u64, k: u64) -> Duration {
        let start = Instant::now();
        for _ in 0..n.div_ceil(k) {
            let mut pipe = redis::pipe();
            for p in self.next..self.next + k {
                let bytes = encode_item(&batch(&self.envelopes, p)).unwrap();
                pipe.cmd("XADD")
                    .arg(&self.key)
                    .arg("MAXLEN")
                    .arg("~")
                    .arg(1000)
                    .arg("*")
                    .arg("d")
                    .arg(bytes.as_slice());
            }
            let _: Vec<String> = pipe.query(&mut self.conn).unwrap();
            for g in &self.groups {
                for p in self.next..self.next + k {
                    let reply: redis::Value = redis::cmd("XREADGROUP")
                        .arg("GROUP")
                        .arg(g)
                        .arg("c")
                        .arg("COUNT")
                        .arg(1)
                        .arg("STREAMS")
                        .arg(&self.key)
                        .arg(">")
                        .query(&mut self.conn)
                        .unwrap();
                    let (id, payload) = entry(&reply);
                    let mut aligned: AlignedVec = AlignedVec::with_capacity(payload.len());
                    aligned.extend_from_slice(payload);
                    let item = decode_item(&aligned).unwrap();
                    assert_eq!(item.position(), Some(Position(p)));
                    let _: i64 =
                        redis::cmd("XACK").arg(&self.key).arg(g).arg(id).query(&mut self.conn).unwrap();
                }
            }
            self.next += k;
        }
        start.elapsed()
    }
}

/// The id and the `d` field of the one entry in an XREADGROUP reply.
fn entry(reply: &redis::Value) -> (&[u8], &[u8]) {
    use redis::Value::{Array, BulkString};
    let Array(streams) = reply else { panic!("{reply:?}") };
    let Array(stream) = &streams[0] else { panic!() };
    let Array(entries) = &stream[1] else { panic!() };
    let Array(e) = &entries[0] else { panic!() };
    let (BulkString(id), Array(fields)) = (&e[0], &e[1]) else { panic!() };
    let BulkString(payload) = &fields[1] else { panic!() };
    (id, payload)
}

fn main() {
    let Ok(url) = std::env::var("LANESTREAM_REDIS_URL") else {
        println!(
            "redis bench: LANESTREAM_REDIS_URL is not set (e.g. redis://127.0.0.1:6399); nothing measured"
        );
        return;
    };
    let name = format!("lsbench_{}", std::process::id());
    let mut ours = Ours::new(&url, &name);
    let mut bare = Bare::new(&url, &name);

    if let Ok(only) = std::env::var("LANESTREAM_BENCH_ONLY") {
        let n = env("LANESTREAM_BENCH_BATCHES", 2000);
        let took = match only.as_str() {
            "ours" => ours.run(n),
            "bare" => bare.run(n),
            other => panic!("LANESTREAM_BENCH_ONLY is `ours` or `bare`, not {other:?}"),
        };
        println!(
            "redis bench, {only} alone: {n} batches in {took:?}, {:.0} batches/s",
            n as f64 / took.as_secs_f64()
        );
        ours.stream.delete().unwrap();
        let _: i64 = redis::cmd("DEL").arg(&bare.key).query(&mut bare.conn).unwrap();
        return;
    }

    // 5 s per side unless the command line says otherwise (`--measurement-time 3`).
    let mut c = Criterion::default().measurement_time(Duration::from_secs(5)).configure_from_args();
    {
        let mut g = c.benchmark_group("redis_one_batch_in_flight");
        g.throughput(Throughput::Elements(1));
        g.bench_function("lanestream_redis", |b| b.iter_custom(|n| ours.run(n)));
        g.bench_function("bare_xadd_xreadgroup_xack", |b| b.iter_custom(|n| bare.run(n)));
        g.finish();
    }

    // The ratio, from interleaved rounds.
    let (rounds, n) = (env("LANESTREAM_BENCH_ROUNDS", 9), env("LANESTREAM_BENCH_BATCHES", 2000));
    ours.run(n / 10);
    bare.run(n / 10);
    let mut ratios = Vec::new();
    let (mut ours_rate, mut bare_rate) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let (o, b) = if r % 2 == 0 {
            let o = ours.run(n);
            (o, bare.run(n))
        } else {
            let b = bare.run(n);
            (ours.run(n), b)
        };
        let (o, b) = (n as f64 / o.as_secs_f64(), n as f64 / b.as_secs_f64());
        ours_rate.push(o);
        bare_rate.push(b);
        ratios.push(o / b);
    }
    let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
    println!("redis ratio of each round, in order: {}", each.join(" "));
    for v in [&mut ratios, &mut ours_rate, &mut bare_rate] {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    }
    let mid = |v: &[f64]| v[v.len() / 2];
    println!(
        "redis ratio over {rounds} rounds of {n} batches: lanestream {:.0} batches/s, bare loop {:.0} batches/s, \
         ratio {:.2}x (median; range {:.2} .. {:.2})",
        mid(&ours_rate),
        mid(&bare_rate),
        mid(&ratios),
        ratios[0],
        ratios[ratios.len() - 1]
    );
    c.final_summary();
    ours.stream.delete().unwrap();
    let _: i64 = redis::cmd("DEL").arg(&bare.key).query(&mut bare.conn).unwrap();
}
