//! The port's contract on the Redis backend: every generic test of `tests/port_contract`,
//! instantiated for [`RedisStream`] under the same names, plus the Redis-only behaviour (state
//! that survives the process, shared entries, trimming, lost connections).
//!
//! Needs a server: `LANESTREAM_REDIS_URL` (e.g. `redis://127.0.0.1:6399` or
//! `redis+unix:///tmp/x/redis.sock`), or a throwaway `redis-server` the binary starts when one is
//! installed. With neither, every test fails under `CI=true` and is skipped with a message
//! otherwise. Each stream lives under its own name (`lst_<pid>_<n>_<nanos>`), and
//! its keys are deleted when the test ends, passed or failed ([`Cleanup`]).
#![cfg(feature = "redis")]

use crate::{common, port_contract, redis_support};

use std::time::Duration;

use common::{backfill, batch, snapshot};
use lanestream::{
    AckError, LaneConsumer, LaneDelivery, LaneItem, Position, PublishError, RedisDelivery, RedisStream,
    RequestPublisher, Stream, StreamError, StreamFanout, TryRecvError,
};
use port_contract::{port_contract_tests, Backend};
use redis_support::{delete_keys, keys_of, kill_connections, unique_name, url};

/// Deletes every key of the streams it was given when dropped, also when the test panicked, so
/// that a run leaves the server as it found it.
struct Cleanup {
    url: String,
    names: std::sync::Mutex<Vec<String>>,
}

impl Cleanup {
    fn new(url: &str) -> Cleanup {
        Cleanup { url: url.to_owned(), names: std::sync::Mutex::new(Vec::new()) }
    }

    /// A guard for one stream.
    fn of(url: &str, name: &str) -> Cleanup {
        let c = Cleanup::new(url);
        c.add(name);
        c
    }

    fn add(&self, name: &str) {
        self.names.lock().unwrap_or_else(|p| p.into_inner()).push(name.to_owned());
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let names = std::mem::take(&mut *self.names.lock().unwrap_or_else(|p| p.into_inner()));
        if names.is_empty() {
            return;
        }
        // Best effort: a test that failed because the server went away cannot clean up either.
        let Ok(mut conn) = redis::Client::open(self.url.as_str()).and_then(|c| c.get_connection()) else {
            return;
        };
        for name in names {
            let _ = delete_keys(&mut conn, &name);
        }
    }
}

fn open(url: &str, name: &str, capacity: usize, request_capacity: usize, sinks: &[&str]) -> RedisStream {
    RedisStream::builder(url, name)
        .capacity(capacity)
        .request_capacity(request_capacity)
        .sinks(sinks.iter().copied())
        .build()
        .unwrap_or_else(|e| panic!("building stream {name} on {url}: {e}"))
}

/// The Redis backend under the generic contract tests; the streams it built are deleted when it
/// is dropped (after the test, passed or failed).
struct Redis {
    cleanup: Cleanup,
}

impl Backend for Redis {
    type Stream = RedisStream;
    type Handle = RedisDelivery<LaneItem>;

    fn name(&self) -> &'static str {
        "redis"
    }

    fn build(&self, capacity: usize, request_capacity: usize, sinks: &[&str]) -> RedisStream {
        let url = url().expect("checked by the macro's guard");
        let name = unique_name("lst");
        self.cleanup.add(&name);
        open(&url, &name, capacity, request_capacity, sinks)
    }

    /// No split on this backend: the worker holds the delivery itself.
    fn worker_handle(&self, delivery: RedisDelivery<LaneItem>) -> RedisDelivery<LaneItem> {
        delivery
    }

    /// Full size against a local server (the whole file takes about 10 s); a slower or remote
    /// server can run the long tests smaller with `LANESTREAM_REDIS_SCALE` (e.g. `0.1`).
    fn scale(&self) -> f64 {
        std::env::var("LANESTREAM_REDIS_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0)
    }

    /// A delivery holds its own decoded copy of the item.
    fn stale_deliveries_pin_slots(&self) -> bool {
        false
    }
}

impl port_contract::WorkerHandle for RedisDelivery<LaneItem> {
    fn attempt(&self) -> u32 {
        LaneDelivery::attempt(self)
    }

    fn ack(self) -> Result<(), AckError> {
        LaneDelivery::ack(self)
    }
}

// Without a server (and outside CI), each test returns at once, after `url` said why.
port_contract_tests!({
    let Some(url) = url() else { return };
    Redis { cleanup: Cleanup::new(&url) }
});

// ----- Redis only ------------------------------------------------------------------------------

#[test]
fn redis_state_survives_the_process_a_restarted_sink_gets_its_unacked_batches_again() {
    let url = server!();
    let name = unique_name("lst");
    let _cleanup = Cleanup::of(&url, &name);
    let mut admin = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
    {
        // Process 1: ingest publishes 1..=5; the sink applies and acks 1 and 3, holds 2, 4 and 5.
        let s = open(&url, &name, 8, 4, &["search"]);
        let mut p = s.fanout().unwrap();
        for i in 1..=5 {
            p.publish(batch(i)).unwrap();
        }
        let mut c = s.reattach("search").unwrap();
        let d: Vec<_> = (0..5).map(|_| c.try_recv().unwrap()).collect();
        let mut d = d.into_iter();
        d.next().unwrap().ack().unwrap();
        let held = d.next().unwrap();
        d.next().unwrap().ack().unwrap();
        assert_eq!(s.acked("search").unwrap(), Some(Position(1)));
        // Killed: nothing is dropped politely (no nack, no claim given up), and its connections
        // close.
        std::mem::forget((held, d.collect::<Vec<_>>(), c, p, s));
        kill_connections(&mut admin, &name);
    }
    // Process 2: the same stream by name. The sink re-attaches and gets 2, 4, 5 again, in order.
    let s = open(&url, &name, 8, 4, &["search"]);
    let mut c = s.attach("search").expect("the dead consumer's claim is free");
    let got: Vec<_> = (0..3).map(|_| c.try_recv().unwrap()).collect();
    assert_eq!(
        got.iter().map(|d| (d.position().unwrap().0, d.attempt())).collect::<Vec<_>>(),
        [(2, 2), (4, 2), (5, 2)]
    );
    assert!(matches!(c.try_recv(), Err(TryRecvError::Empty)));
    got.into_iter().for_each(|d| d.ack().unwrap());
    assert_eq!(s.acked("search").unwrap(), Some(Position(5)));
    // The restarted ingest takes the dead producer's claim and resumes after position 5.
    let mut p = s.fanout().expect("the dead producer's claim is free");
    assert!(matches!(p.publish(batch(5)), Err(PublishError::PositionRegressed { last: Position(5), .. })));
    p.publish(batch(6)).unwrap();
    assert_eq!(c.try_recv().unwrap().position(), Some(Position(6)));
    s.delete().unwrap();
}

#[test]
fn redis_a_restarted_ingest_resumes_after_the_last_published_position() {
    let url = server!();
    let name = unique_name("lst");
    let _cleanup = Cleanup::of(&url, &name);
    {
        let s = open(&url, &name, 8, 4, &["a", "b"]);
        let mut p = s.fanout().unwrap();
        for i in 1..=3 {
            p.publish(batch(i)).unwrap();
        }
        // Dropped: the stream's anchor connection closes, as when the process dies.
    }
    let s = open(&url, &name, 8, 4, &["a", "b"]);
    let mut p = s.fanout().expect("the dead fan-out's claim is free");
    assert!(matches!(p.publish(batch(3)), Err(PublishError::PositionRegressed { last: Position(3), .. })));
    p.publish(batch(4)).unwrap();
    for sink in ["a", "b"] {
        let st = s.stats(sink).unwrap();
        assert_eq!((st.published, st.last_published), (4, Some(Position(4))));
    }
    s.delete().unwrap();
}

#[test]
fn redis_a_batch_published_to_every_lane_is_stored_once_and_trimmed_once_all_lanes_acked_it() {
    let url = server!();
    let name = unique_name("lst");
    let _cleanup = Cleanup::of(&url, &name);
    let s = open(&url, &name, 8, 4, &["a", "b", "c"]);
    let mut f = s.fanout().unwrap();
    let mut cs: Vec<_> = ["a", "b", "c"].iter().map(|n| s.reattach(n).unwrap()).collect();
    for i in 1..=4 {
        f.publish(batch(i)).unwrap();
    }
    // A lane-only item (a snapshot row for "b") in between: a gap for a and c.
    f.publish_to(1, snapshot()).unwrap();
    f.publish(batch(5)).unwrap();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut con = client.get_connection().unwrap();
    let log = format!("{{{name}}}:log");
    let len = |con: &mut redis::Connection| -> usize { redis::cmd("XLEN").arg(&log).query(con).unwrap() };
    assert_eq!(len(&mut con), 6, "5 shared batches and one snapshot row");
    // Lanes a and b ack everything; c acks up to 2: only entries 1 and 2 may go.
    for c in &mut cs[..2] {
        while let Ok(d) = c.try_recv() {
            d.ack().unwrap();
        }
    }
    assert_eq!(s.trim().unwrap(), 0, "nothing acked by every lane yet");
    assert_eq!(len(&mut con), 6);
    for _ in 0..2 {
        cs[2].try_recv().unwrap().ack().unwrap();
    }
    assert_eq!(s.trim().unwrap(), 2);
    assert_eq!(len(&mut con), 4, "trimmed below every lane's acked prefix, not further");
    assert_eq!(s.watermark(), Some(Position(2)));
    while let Ok(d) = cs[2].try_recv() {
        d.ack().unwrap();
    }
    assert_eq!(s.trim().unwrap(), 6);
    assert_eq!(len(&mut con), 0);
    assert_eq!(s.watermark(), Some(Position(5)));
    assert!(s.is_idle());
    // No consumer group: each lane's hash holds its deliveries.
    let groups: Vec<redis::Value> = redis::cmd("XINFO").arg("GROUPS").arg(&log).query(&mut con).unwrap();
    assert_eq!(groups.len(), 0);
    s.delete().unwrap();

    // Publishing trims by itself every 64 entries, below the slowest lane: b stops acking at 100.
    let name = unique_name("lst");
    let _cleanup2 = Cleanup::of(&url, &name);
    let log = format!("{{{name}}}:log");
    let s = open(&url, &name, 64, 4, &["a", "b"]);
    let mut f = s.fanout().unwrap();
    let mut cs: Vec<_> = ["a", "b"].iter().map(|n| s.reattach(n).unwrap()).collect();
    for i in 1..=130 {
        f.publish(batch(i)).unwrap();
        for (k, c) in cs.iter_mut().enumerate() {
            if k == 0 || i <= 100 {
                c.try_recv().unwrap().ack().unwrap();
            }
        }
    }
    let left: usize = redis::cmd("XLEN").arg(&log).query(&mut con).unwrap();
    assert!((30..=30 + 64).contains(&left), "{left} entries left: 30 unacked by b, at most 64 more");
    let first: Vec<redis::Value> =
        redis::cmd("XRANGE").arg(&log).arg("-").arg("+").arg("COUNT").arg(1).query(&mut con).unwrap();
    let redis::Value::Array(entry) = &first[0] else { panic!("{first:?}") };
    let redis::Value::BulkString(id) = &entry[0] else { panic!("{first:?}") };
    let first: u64 = String::from_utf8_lossy(id).split('-').next().unwrap().parse().unwrap();
    assert!(first <= 101, "entry {first} first: an entry lane b has not acked was trimmed");
    assert_eq!(s.watermark(), Some(Position(100)));
    s.delete().unwrap();
}

#[test]
fn redis_a_lost_connection_reconnects_and_nothing_is_published_or_acked_twice() {
    let url = server!();
    let name = unique_name("lst");
    let _cleanup = Cleanup::of(&url, &name);
    let s = open(&url, &name, 4, 4, &["search"]);
    let mut p = s.fanout().unwrap();
    let mut c = s.reattach("search").unwrap();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut admin = client.get_connection().unwrap();
    let kill = |admin: &mut redis::Connection| kill_connections(admin, &name);
    for i in 1..=20u64 {
        if i % 5 == 0 {
            kill(&mut admin);
        }
        p.publish(batch(i)).unwrap();
        if i % 7 == 0 {
            kill(&mut admin);
        }
        let d = c.recv_timeout(Duration::from_secs(5)).unwrap().unwrap();
        assert_eq!((d.position(), d.attempt()), (Some(Position(i)), 1));
        if i % 3 == 0 {
            kill(&mut admin);
        }
        d.ack().unwrap();
    }
    let st = s.stats("search").unwrap();
    assert_eq!((st.published, st.acked_items, st.delivered), (20, 20, 20), "{st:?}");
    assert_eq!(s.watermark(), Some(Position(20)));
    // The claims moved to the new anchor: this process's producer is still the lane's.
    assert!(matches!(s.fanout(), Err(StreamError::ProducerBusy(_))));
    s.delete().unwrap();
}

#[test]
fn redis_an_unreachable_server_is_a_clear_error() {
    let _ = server!();
    // Nothing listens on port 1.
    let err = RedisStream::builder("redis://127.0.0.1:1", unique_name("lst"))
        .retry_for(Duration::from_millis(50))
        .sink("search")
        .build()
        .unwrap_err();
    assert!(matches!(err, lanestream::BuildError::Backend(lanestream::BackendError::Connection)), "{err:?}");
}

#[test]
fn redis_a_different_set_of_sinks_under_the_same_name_is_refused() {
    let url = server!();
    let name = unique_name("lst");
    let _cleanup = Cleanup::of(&url, &name);
    let s = open(&url, &name, 4, 4, &["a", "b"]);
    let err = RedisStream::builder(url.as_str(), name.as_str()).sinks(["a"]).build().unwrap_err();
    assert!(matches!(err, lanestream::BuildError::Mismatch(_)), "{err:?}");
    s.delete().unwrap();
}

#[test]
fn redis_async_receive_and_request_publish_wait_without_a_runtime_of_our_own() {
    let url = server!();
    let name = unique_name("lst");
    let _cleanup = Cleanup::of(&url, &name);
    let s = open(&url, &name, 1, 1, &["search"]);
    let mut p = s.fanout().unwrap();
    let mut c = s.reattach("search").unwrap();
    let s2 = s.clone();
    let publisher = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        p.publish(batch(1)).unwrap();
        let sender = s2.request_sender();
        sender.publish(backfill("search", "users")).unwrap();
        futures_executor::block_on(sender.publish_async(backfill("search", "orders"))).unwrap();
    });
    let d = futures_executor::block_on(c.recv_async()).unwrap().unwrap();
    assert_eq!(d.position(), Some(Position(1)));
    d.ack().unwrap();
    let mut ingest = s.reattach_requests();
    for index in ["users", "orders"] {
        let r = futures_executor::block_on(ingest.recv_async()).unwrap().unwrap();
        assert_eq!(r.item(), &backfill("search", index));
        r.ack().unwrap();
    }
    publisher.join().unwrap();
    s.delete().unwrap();
}

/// In a child process (this test binary run again for one test, with `LANESTREAM_REDIS_CHILD`
/// set): plays `role` on stream `name`, prints `READY`, then waits to be killed.
fn child_role(url: &str, spec: &str) -> ! {
    let (name, role) = spec.split_once(':').unwrap();
    let s = RedisStream::builder(url, name).capacity(16).sink("search").build().unwrap();
    // Held until the process is killed: nothing is dropped politely.
    let mut keep: Vec<Box<dyn std::any::Any>> = Vec::new();
    match role {
        "sink" => {
            let mut c = s.attach("search").unwrap();
            let mut d: Vec<_> = (0..5).map(|_| Some(c.try_recv().unwrap())).collect();
            for i in [0, 1, 3] {
                d[i].take().unwrap().ack().unwrap();
            }
            keep.push(Box::new(d));
            keep.push(Box::new(c));
        }
        "ingest" => {
            let mut p = s.fanout().unwrap();
            for i in 11..=15 {
                p.publish(batch(i)).unwrap();
            }
            keep.push(Box::new(p));
        }
        other => panic!("unknown role {other}"),
    }
    println!("LANESTREAM-CHILD-READY");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Runs this test again in a child process playing `role`, waits for its `READY`, and SIGKILLs it.
fn run_child_and_kill(test: &str, name: &str, role: &str) {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads", "1"])
        .env("LANESTREAM_REDIS_CHILD", format!("{name}:{role}"))
        // The child runs against this test's server (not a throwaway one of its own).
        .env("LANESTREAM_REDIS_URL", crate::redis_support::url().unwrap_or_default())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let ready =
        BufReader::new(stdout).lines().map_while(Result::ok).any(|l| l.contains("LANESTREAM-CHILD-READY"));
    assert!(ready, "the {role} child process ended before it was ready");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
}

#[test]
fn redis_processes_killed_mid_run_a_restarted_sink_gets_its_unacked_batches_a_restarted_ingest_resumes() {
    const NAME: &str =
        "redis_processes_killed_mid_run_a_restarted_sink_gets_its_unacked_batches_a_restarted_ingest_resumes";
    // libtest names a test by its path below the binary's root (`contract::NAME` here), which is
    // what `--exact` matches.
    let test = match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{NAME}"),
        None => NAME.to_string(),
    };
    let url = server!();
    if let Ok(spec) = std::env::var("LANESTREAM_REDIS_CHILD") {
        child_role(&url, &spec);
    }
    let name = unique_name("lst");
    let _cleanup = Cleanup::of(&url, &name);
    let s = RedisStream::builder(url.as_str(), name.as_str()).capacity(16).sink("search").build().unwrap();
    {
        let mut p = s.fanout().unwrap();
        for i in 1..=10 {
            p.publish(batch(i)).unwrap();
        }
    }
    // The sink process receives 1..=5, acks 1, 2 and 4, and is killed.
    run_child_and_kill(&test, &name, "sink");
    assert_eq!(s.acked("search").unwrap(), Some(Position(2)));
    // Restarted: the polite attach succeeds at once (the dead process's claim went with its
    // connection), and the unacked batches come back first, in order.
    let mut c = s.attach("search").expect("the killed sink's claim is free");
    let mut got = Vec::new();
    while let Ok(d) = c.try_recv() {
        got.push((d.position().unwrap().0, d.attempt()));
        d.ack().unwrap();
    }
    assert_eq!(got, [(3, 2), (5, 2), (6, 1), (7, 1), (8, 1), (9, 1), (10, 1)]);
    assert_eq!(s.watermark(), Some(Position(10)));
    // The ingest process publishes 11..=15 and is killed; the restarted one resumes after 15.
    run_child_and_kill(&test, &name, "ingest");
    let mut p = s.fanout().expect("the killed ingest's claim is free");
    assert!(matches!(p.publish(batch(15)), Err(PublishError::PositionRegressed { last: Position(15), .. })));
    p.publish(batch(16)).unwrap();
    let got: Vec<_> = std::iter::from_fn(|| c.try_recv().ok())
        .map(|d| {
            let pos = d.position().unwrap().0;
            d.ack().unwrap();
            pos
        })
        .collect();
    assert_eq!(got, (11..=16).collect::<Vec<_>>(), "nothing lost, nothing twice");
    assert_eq!(s.watermark(), Some(Position(16)));
    assert!(s.is_idle());
    s.delete().unwrap();
}

#[test]
fn redis_the_generic_tests_leave_no_key_behind_even_when_they_fail() {
    let url = server!();
    let mut admin = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
    let backend = Redis { cleanup: Cleanup::new(&url) };
    let (a, b) = (backend.build(2, 2, &["search"]), backend.build(2, 2, &["search", "cache"]));
    let names = [a.name().to_owned(), b.name().to_owned()];
    a.fanout().unwrap().publish(batch(1)).unwrap();
    assert!(!keys_of(&mut admin, &names[0]).unwrap().is_empty(), "the stream has keys while it lives");
    // A failing test: the panic unwinds through the backend, which cleans up.
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _backend = backend;
        drop((a, b));
        panic!("a failing test");
    }));
    assert!(failed.is_err());
    for name in &names {
        assert_eq!(keys_of(&mut admin, name).unwrap(), Vec::<String>::new(), "keys of {name} left behind");
    }
}

#[test]
fn redis_delete_removes_its_own_keys_only_whatever_glob_characters_the_name_holds() {
    let url = server!();
    let base = unique_name("lst");
    let (globby, other) = (format!("{base}_a*"), format!("{base}_ab"));
    let _cleanup = Cleanup::of(&url, &other);
    let mut admin = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
    let (g, o) = (open(&url, &globby, 2, 2, &["search"]), open(&url, &other, 2, 2, &["search"]));
    g.fanout().unwrap().publish(batch(1)).unwrap();
    o.fanout().unwrap().publish(batch(1)).unwrap();
    let before = keys_of(&mut admin, &other).unwrap().len();
    assert!(before > 0);
    g.delete().unwrap();
    // `keys_of` does not escape: its pattern for `..._a*` also matches `..._ab`'s keys.
    let left: Vec<String> = keys_of(&mut admin, &globby)
        .unwrap()
        .into_iter()
        .filter(|k| k.starts_with(&format!("{{{globby}}}")))
        .collect();
    assert_eq!(left, Vec::<String>::new(), "the stream's own keys are gone");
    assert_eq!(keys_of(&mut admin, &other).unwrap().len(), before, "the other stream's keys are untouched");
}

#[test]
fn redis_a_lane_alone_on_its_log_keeps_no_ids_set_and_acks_and_trims_from_its_acked_prefix() {
    let url = server!();
    let name = unique_name("lst");
    let _cleanup = Cleanup::of(&url, &name);
    let mut con = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
    let (log, ids) = (format!("{{{name}}}:log"), format!("{{{name}}}:l:search:ids"));
    let len = |con: &mut redis::Connection| -> usize { redis::cmd("XLEN").arg(&log).query(con).unwrap() };
    let s = open(&url, &name, 8, 4, &["search"]);
    let mut p = s.fanout().unwrap();
    let mut c = s.reattach("search").unwrap();
    for i in 1..=5 {
        p.publish(batch(i * 10)).unwrap();
    }
    p.publish(snapshot()).unwrap(); // entry 6: no position
    let mut held: Vec<_> = (0..6).map(|_| c.try_recv().unwrap()).collect();
    assert_eq!(held.iter().map(RedisDelivery::entry).collect::<Vec<_>>(), [1, 2, 3, 4, 5, 6], "no gaps");
    let exists: i64 = redis::cmd("EXISTS").arg(&ids).query(&mut con).unwrap();
    assert_eq!(exists, 0, "no ids set for a lane alone on its log");
    // Out of order: 6, 4, 2 first; the prefix does not move.
    for k in [5, 3, 1] {
        held.remove(k).ack().unwrap();
    }
    assert_eq!(s.acked("search").unwrap(), None);
    assert_eq!(s.trim().unwrap(), 0);
    // Entry 1 acked: the prefix runs over 2 (acked before) to 2's position.
    held.remove(0).ack().unwrap();
    assert_eq!(s.acked("search").unwrap(), Some(Position(20)));
    assert_eq!(s.trim().unwrap(), 2);
    assert_eq!(len(&mut con), 4, "trimmed below the acked prefix, not further");
    // 3 then 5: through 4 and 6 (no position: the acked position stays 5's).
    held.remove(0).ack().unwrap();
    assert_eq!(s.acked("search").unwrap(), Some(Position(40)));
    held.remove(0).ack().unwrap();
    assert_eq!(s.acked("search").unwrap(), Some(Position(50)));
    assert!(held.is_empty());
    assert_eq!(s.trim().unwrap(), 6);
    assert_eq!(len(&mut con), 0);
    assert_eq!(s.watermark(), Some(Position(50)));
    assert!(s.is_idle());
    // The numbering goes on after the trim.
    p.publish(batch(60)).unwrap();
    let d = c.try_recv().unwrap();
    assert_eq!((d.entry(), d.position()), (7, Some(Position(60))));
    d.ack().unwrap();
    assert_eq!(s.watermark(), Some(Position(60)));
}

#[test]
fn redis_a_fenced_producer_or_a_publish_whose_script_did_not_run_adds_no_entry() {
    let url = server!();
    let name = unique_name("lst");
    let _cleanup = Cleanup::of(&url, &name);
    let mut con = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
    let log = format!("{{{name}}}:log");
    let len = |con: &mut redis::Connection| -> usize { redis::cmd("XLEN").arg(&log).query(con).unwrap() };
    // What a producer of epoch `epoch` adds for entry `n`: a plain XADD of id `n-epoch`.
    let raw = |con: &mut redis::Connection, n: u64, epoch: u64| -> redis::RedisResult<String> {
        redis::cmd("XADD").arg(&log).arg(format!("{n}-{epoch}")).arg("d").arg("x").arg("p").arg("").query(con)
    };
    let s = open(&url, &name, 8, 4, &["search"]);
    let mut p1 = s.fanout().unwrap(); // epoch 1
    let mut c = s.reattach("search").unwrap();
    p1.publish(batch(10)).unwrap();
    // Another process takes the fan-out over (this one's claim given up as if it had died).
    let _: i64 =
        redis::cmd("HSET").arg(format!("{{{name}}}:meta")).arg("fh").arg("").query(&mut con).unwrap();
    let s2 = open(&url, &name, 8, 4, &["search"]);
    let mut p2 = s2.fanout().unwrap(); // epoch 2
    assert!(raw(&mut con, 2, 1).is_err(), "the old epoch's next entry is refused from the claim on");
    match p1.publish(batch(20)) {
        Err(PublishError::Backend { error: lanestream::BackendError::Fenced, .. }) => {}
        other => panic!("the old producer must be fenced: {other:?}"),
    }
    assert_eq!(len(&mut con), 1, "a fenced publish adds no entry");
    p2.publish(batch(20)).unwrap();
    // The old producer's count stays 1 (its publishes are refused): its next id stays `2-1`.
    assert!(raw(&mut con, 2, 1).is_err(), "below the live producer's newest entry");
    assert!(raw(&mut con, 2, 2).is_err(), "an entry is added once");
    // A server that lost its scripts: the publish loads them again and lands once.
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
    p2.publish(batch(30)).unwrap();
    assert_eq!(len(&mut con), 3);
    let got: Vec<_> = (0..3)
        .map(|_| {
            let d = c.try_recv().unwrap();
            let r = (d.entry(), d.position().unwrap().0);
            d.ack().unwrap();
            r
        })
        .collect();
    assert_eq!(got, [(1, 10), (2, 20), (3, 30)]);
    assert!(matches!(c.try_recv(), Err(TryRecvError::Empty)));
    // A closed lane takes no entry, also from its live producer's plain XADD.
    s.close("search").unwrap();
    assert!(raw(&mut con, 4, 2).is_err(), "closed: the log refuses every id");
    assert!(matches!(p2.publish(batch(40)), Err(PublishError::Closed(_))));
    assert_eq!(len(&mut con), 3);
}

/// One step of [`stats_match_memory`]'s script on a backend: `Ok` carries what the port
/// returned, for comparison across the backends.
fn stats_step<S: Stream>(
    s: &S,
    p: &mut S::Fanout,
    c: &mut S::Consumer,
    held: &mut Vec<<S::Consumer as LaneConsumer<LaneItem>>::Delivery>,
    op: u64,
    next: &mut u64,
) -> String {
    match op % 5 {
        0 | 1 => match p.try_publish(batch(*next)) {
            Ok(()) => {
                *next += 1;
                "published".into()
            }
            Err(e) => format!("publish: {e:?}").chars().take(12).collect(),
        },
        2 => match c.try_recv() {
            Ok(d) => {
                let r = format!("got {:?} attempt {}", d.position(), d.attempt());
                held.push(d);
                r
            }
            Err(e) => format!("recv: {e:?}"),
        },
        3 if !held.is_empty() => {
            let i = (op / 5) as usize % held.len();
            format!("ack: {:?}", held.remove(i).ack())
        }
        _ if !held.is_empty() => {
            let i = (op / 5) as usize % held.len();
            held.remove(i).nack();
            "nacked".into()
        }
        _ => {
            let _ = s;
            "nothing held".into()
        }
    }
}

/// `LaneStats` (all but `pinned`: a stale delivery pins nothing here) match the in-memory
/// backend's after every step of a seeded mix of publishes, receives, out-of-order acks and
/// nacks, on a lane alone on its log and on a lane sharing it.
#[test]
fn redis_lane_stats_match_the_memory_backend_after_every_step() {
    let url = server!();
    for sinks in [&["search"][..], &["search", "cache"][..]] {
        let name = unique_name("lst");
        let _cleanup = Cleanup::of(&url, &name);
        let r = open(&url, &name, 6, 4, sinks);
        let m = lanestream::MemoryStream::builder().capacity(6).sinks(sinks.iter().copied()).build().unwrap();
        let (mut rp, mut rc) = (r.fanout().unwrap(), r.reattach("search").unwrap());
        let (mut mp, mut mc) = (m.fanout().unwrap(), m.reattach("search").unwrap());
        let (mut rheld, mut mheld) = (Vec::new(), Vec::new());
        let (mut rnext, mut mnext) = (1, 1);
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for step in 0..2000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let op = seed % 1000;
            let got_r;
            if op % 37 == 0 {
                // A re-attach: the held deliveries go stale (compared while still held, then
                // dropped: a stale one pins its slot in memory only).
                rc = r.reattach("search").unwrap();
                mc = m.reattach("search").unwrap();
                let (mut rs, ms) = (r.stats("search").unwrap(), m.stats("search").unwrap());
                rs.pinned = ms.pinned;
                assert_eq!(rs, ms, "{sinks:?} step {step}: re-attached, stale deliveries held");
                rheld.clear();
                mheld.clear();
                got_r = "re-attached".to_string();
            } else {
                got_r = stats_step(&r, &mut rp, &mut rc, &mut rheld, op, &mut rnext);
                let got_m = stats_step(&m, &mut mp, &mut mc, &mut mheld, op, &mut mnext);
                assert_eq!(got_r, got_m, "{sinks:?} step {step} (op {op})");
            }
            let (mut rs, ms) = (r.stats("search").unwrap(), m.stats("search").unwrap());
            rs.pinned = ms.pinned;
            assert_eq!(rs, ms, "{sinks:?} step {step} (op {op}): {got_r}");
        }
    }
}

/// Connections killed between calls: every call still succeeds (a retry on a fresh connection,
/// exactly once), and the losses show in `connection_errors` (and `last_error`), which calls
/// that met no loss leave alone.
#[test]
fn redis_connections_killed_between_calls_are_recovered_silently_and_counted() {
    let url = server!();
    let name = unique_name("lst");
    let _cleanup = Cleanup::of(&url, &name);
    let s = open(&url, &name, 4, 4, &["search"]);
    let mut p = s.fanout().unwrap();
    let mut c = s.reattach("search").unwrap();
    let mut admin = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
    let round = |p: &mut lanestream::RedisFanout, c: &mut lanestream::RedisConsumer<LaneItem>, i: u64| {
        p.try_publish(batch(i)).unwrap();
        let d = c.try_recv().unwrap();
        assert_eq!((d.position(), d.attempt()), (Some(Position(i)), 1));
        d.ack().unwrap();
    };
    round(&mut p, &mut c, 1);
    let (quiet, last) = (s.connection_errors(), s.last_error());
    for i in 2..=4 {
        round(&mut p, &mut c, i);
    }
    assert_eq!((s.connection_errors(), s.last_error()), (quiet, last), "no loss, nothing counted");
    for i in 5..=7 {
        let before = s.connection_errors();
        kill_connections(&mut admin, &name);
        round(&mut p, &mut c, i);
        assert!(s.connection_errors() > before, "round {i}: the killed connections were not counted");
        assert!(s.last_error().is_some_and(|e| e.contains("connection")), "{:?}", s.last_error());
    }
    let st = s.stats("search").unwrap();
    assert_eq!((st.published, st.acked_items, st.delivered), (7, 7, 7), "{st:?}");
    // The clones share the count.
    assert_eq!(s.clone().connection_errors(), s.connection_errors());
}

/// A lane alone on its log: acks in increasing order are plain `XADD`s to its ack log (a gap
/// left open), a lower one after them is refused there and acked by the script; the acked
/// position follows the contiguous prefix through every mix, and reading it empties the log.
#[test]
fn redis_acks_through_the_ack_log_keep_the_acked_prefix_with_gaps_and_late_acks() {
    let url = server!();
    let name = unique_name("lst");
    let _cleanup = Cleanup::of(&url, &name);
    let mut con = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
    let al = format!("{{{name}}}:l:search:al");
    let s = open(&url, &name, 8, 4, &["search"]);
    let mut p = s.fanout().unwrap();
    let mut c = s.reattach("search").unwrap();
    for i in 1..=6 {
        p.publish(batch(i * 10)).unwrap();
    }
    let mut held: Vec<Option<_>> = (0..6).map(|_| Some(c.try_recv().unwrap())).collect();
    let mut ack = |i: usize| held[i - 1].take().unwrap().ack().unwrap();
    let len = |con: &mut redis::Connection| -> usize { redis::cmd("XLEN").arg(&al).query(con).unwrap() };
    ack(2);
    ack(4);
    assert_eq!(len(&mut con), 2, "acks 2 and 4 are records of the ack log");
    assert_eq!(s.acked("search").unwrap(), None, "1 is out");
    assert_eq!(len(&mut con), 0, "read after a fold");
    ack(1); // below 4: refused by the log, acked by the script
    assert_eq!(s.acked("search").unwrap(), Some(Position(20)));
    ack(3);
    assert_eq!(s.acked("search").unwrap(), Some(Position(40)));
    ack(6);
    assert_eq!(s.acked("search").unwrap(), Some(Position(40)), "5 is out");
    ack(5);
    assert_eq!(s.acked("search").unwrap(), Some(Position(60)));
    let st = s.stats("search").unwrap();
    assert_eq!((st.acked_items, st.in_flight, st.published), (6, 0, 6), "{st:?}");
    // A re-attach moves the log's fence above the old epoch: the old consumer's ack is refused
    // (and does not count), the new consumer's lands.
    p.publish(batch(70)).unwrap();
    let stale = c.try_recv().unwrap();
    let mut c2 = s.reattach("search").unwrap();
    assert_eq!(stale.ack(), Err(AckError::Detached));
    assert_eq!(s.acked("search").unwrap(), Some(Position(60)));
    let d = c2.try_recv().unwrap();
    assert_eq!((d.position(), d.attempt()), (Some(Position(70)), 2));
    d.ack().unwrap();
    assert_eq!(s.acked("search").unwrap(), Some(Position(70)));
    assert!(s.is_idle());
}

/// A lane alone on its log: the receive of the expected new entry is a plain `XADD` to its
/// delivery log and an `XRANGE`. A record whose reply never came back (or whose entry was not
/// published yet) is delivered by the next receive, once; after a re-attach the old consumer's
/// records are refused, and the entries it was given come again.
#[test]
fn redis_receives_through_the_delivery_log_lose_nothing_and_deliver_once() {
    let url = server!();
    let name = unique_name("lst");
    let _cleanup = Cleanup::of(&url, &name);
    let mut con = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
    let (hash, dl) = (format!("{{{name}}}:l:search"), format!("{{{name}}}:l:search:dl"));
    let s = open(&url, &name, 8, 4, &["search"]);
    let mut p = s.fanout().unwrap();
    let mut c = s.reattach("search").unwrap();
    p.publish(batch(10)).unwrap();
    c.try_recv().unwrap().ack().unwrap(); // the first receive of an epoch is the script's
    assert!(matches!(c.try_recv(), Err(TryRecvError::Empty)), "entry 2 is not published");
    p.publish(batch(20)).unwrap();
    let d = c.try_recv().unwrap();
    assert_eq!((d.entry(), d.position(), d.attempt()), (2, Some(Position(20)), 1));
    d.ack().unwrap();
    p.publish(batch(30)).unwrap();
    let d = c.try_recv().unwrap(); // through the delivery log
    assert_eq!((d.entry(), d.attempt()), (3, 1));
    d.ack().unwrap();
    // A receive of entry 4 whose record landed but whose reply was lost: 4 comes, once.
    p.publish(batch(40)).unwrap();
    let ep: String = redis::cmd("HGET").arg(&hash).arg("ep").query(&mut con).unwrap();
    let _: String =
        redis::cmd("XADD").arg(&dl).arg(format!("{ep}-4")).arg("p").arg("").query(&mut con).unwrap();
    let d = c.try_recv().unwrap();
    assert_eq!((d.entry(), d.attempt()), (4, 1));
    assert!(matches!(c.try_recv(), Err(TryRecvError::Empty)));
    let st = s.stats("search").unwrap();
    assert_eq!((st.delivered, st.in_flight, st.queued), (4, 1, 0), "{st:?}");
    // Entry 5 taken through the log, then the lane re-attached: the old consumer is refused,
    // the new one gets 4 and 5 again (attempt 2) and then 6.
    p.publish(batch(50)).unwrap();
    let d5 = c.try_recv().unwrap();
    assert_eq!((d5.entry(), d5.attempt()), (5, 1));
    let mut c2 = s.reattach("search").unwrap();
    p.publish(batch(60)).unwrap();
    assert!(matches!(c.try_recv(), Err(TryRecvError::Detached)));
    let got: Vec<_> = (0..3)
        .map(|_| {
            let d = c2.try_recv().unwrap();
            let r = (d.entry(), d.attempt());
            d.ack().unwrap();
            r
        })
        .collect();
    assert_eq!(got, [(4, 2), (5, 2), (6, 1)]);
    assert_eq!(d.ack(), Err(AckError::Detached));
    assert_eq!(d5.ack(), Err(AckError::Detached));
    assert_eq!(s.acked("search").unwrap(), Some(Position(60)));
    let st = s.stats("search").unwrap();
    assert_eq!((st.delivered, st.redelivered, st.acked_items, st.in_flight), (8, 2, 6, 0), "{st:?}");
}

/// A lane alone on its log: the producer publishes without a script while the room the last
/// script reported lasts; the bound holds at its edge (full with `capacity` unacked, room again
/// after an ack, learnt by the script), and a position that does not rise is refused.
#[test]
fn redis_a_producer_publishing_on_known_room_keeps_the_bound_and_the_positions() {
    let url = server!();
    let name = unique_name("lst");
    let _cleanup = Cleanup::of(&url, &name);
    let s = open(&url, &name, 3, 4, &["search"]);
    let mut p = s.fanout().unwrap();
    let mut c = s.reattach("search").unwrap();
    for i in 1..=3 {
        p.try_publish(batch(i * 10)).unwrap(); // the first runs the script, which reports room for 3
    }
    assert!(matches!(p.try_publish(batch(40)), Err(PublishError::Full(_))));
    let d1 = c.try_recv().unwrap();
    assert!(matches!(p.try_publish(batch(40)), Err(PublishError::Full(_))), "delivered is not acked");
    d1.ack().unwrap();
    p.try_publish(batch(40)).unwrap();
    assert!(matches!(p.try_publish(batch(50)), Err(PublishError::Full(_))));
    let st = s.stats("search").unwrap();
    assert_eq!(
        (st.published, st.acked_items, st.lag(), st.last_published),
        (4, 1, 3, Some(Position(40))),
        "{st:?}"
    );
    for _ in 0..3 {
        c.try_recv().unwrap().ack().unwrap();
    }
    assert!(matches!(p.try_publish(batch(40)), Err(PublishError::PositionRegressed { .. })));
    p.try_publish(snapshot()).unwrap();
    assert!(matches!(p.try_publish(batch(35)), Err(PublishError::PositionRegressed { .. })));
    p.try_publish(batch(50)).unwrap();
    let got: Vec<_> = (0..2)
        .map(|_| {
            let d = c.try_recv().unwrap();
            let r = (d.entry(), d.position(), d.attempt());
            d.ack().unwrap();
            r
        })
        .collect();
    assert_eq!(got, [(5, None, 1), (6, Some(Position(50)), 1)]);
    assert_eq!(s.stats("search").unwrap().last_published, Some(Position(50)));
}
