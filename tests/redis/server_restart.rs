//! The Redis backend across a restart of the server itself, with persistence (`appendonly yes`):
//! each test runs a redis-server of its own (`redis_support::server`) and stops and starts it
//! on the same socket and dir.
//!
//! - L9: a dead process's claim stays dead after a restart, although Redis numbers its clients
//!   from 1 again (a claim is not tied to a reusable client id), and a live one stays alive.
//! - A server still loading its data (`LOADING`) is a transient state, retried within
//!   `retry_for`; the ends ride a restart out without an error.
//!
//! Needs `redis-server` on PATH and `LANESTREAM_REDIS_URL` set (as every Redis test: the
//! switch that says a server may be run; the tests do not use that server).
#![cfg(feature = "redis")]

use crate::{common, redis_support};
use lanestream::prelude::*;

use std::time::Duration;

use common::batch;
use lanestream::{LaneConsumer, Position, RedisStream, Stream, StreamError, StreamFanout};
use redis_support::fanout::SINKS;
use redis_support::server::Server;

/// The test's own server, or an early return when the Redis tests are to be skipped.
macro_rules! own_server {
    () => {{
        let _ = server!();
        match Server::start() {
            Some(s) => s,
            None => return,
        }
    }};
}

fn open(url: &str, name: &str) -> RedisStream {
    RedisStream::builder(url, name)
        .capacity(64)
        .sinks(SINKS)
        .retry_for(Duration::from_secs(10))
        .build()
        .unwrap_or_else(|e| panic!("building stream {name}: {e}"))
}

/// The client id in the claim `field` of hash `key` (`<client id>:...`).
fn claim_id(admin: &mut redis::Connection, key: &str, field: &str) -> u64 {
    let claim: String = redis::cmd("HGET").arg(key).arg(field).query(admin).unwrap();
    claim.split(':').next().unwrap().parse().unwrap()
}

/// L9: the fan-out claim of a process that died (here: its ends leaked, its connections gone
/// with the server's restart, never reconnected) is taken by a new fan-out, although after the
/// restart an unrelated connection holds the dead anchor's client id (Redis numbers clients
/// from 1 again); a live fan-out's claim, moved to its new connection, is still refused to
/// another process. The same for a consumer's attachment.
#[test]
fn redis_restart_l9_a_dead_holders_claim_stays_dead_after_a_restart_although_its_client_id_is_reused() {
    let mut server = own_server!();
    let url = server.url.clone();
    let name = redis_support::unique_name("rst");
    let meta = format!("{{{name}}}:meta");
    let lane = format!("{{{name}}}:l:search");

    // The process that dies: a fan-out and an attached consumer, never dropped (no release),
    // its anchor's client id above those a restarted server gives its own clients.
    let earlier: Vec<redis::Connection> = (0..8).map(|_| server.admin()).collect();
    let dead = open(&url, &name);
    let mut fanout = dead.fanout().unwrap();
    fanout.publish(batch(1)).unwrap();
    let consumer = dead.attach("search").unwrap();
    let mut admin = server.admin();
    let dead_ids = [claim_id(&mut admin, &meta, "fh"), claim_id(&mut admin, &lane, "holder")];
    drop(admin);
    std::mem::forget((fanout, consumer, dead));
    drop(earlier);

    server.restart();
    // Unrelated connections take the low client ids again, the dead anchor's among them.
    let mut others = Vec::new();
    loop {
        let mut conn = server.admin();
        let id: u64 = redis::cmd("CLIENT").arg("ID").query(&mut conn).unwrap();
        others.push(conn);
        if id > dead_ids[0].max(dead_ids[1]) {
            break;
        }
    }
    let mut admin = server.admin();
    for id in dead_ids {
        let listed: String = redis::cmd("CLIENT").arg("LIST").arg("ID").arg(id).query(&mut admin).unwrap();
        assert!(
            !listed.trim().is_empty(),
            "client id {id} is some other connection's now (dead: {dead_ids:?})"
        );
    }

    // The new process: takes the dead one's claims.
    let live = open(&url, &name);
    let mut fanout = live.fanout().unwrap_or_else(|e| panic!("the dead fan-out's claim looked alive: {e}"));
    let mut consumer =
        live.attach("search").unwrap_or_else(|e| panic!("the dead consumer looked alive: {e}"));
    fanout.publish(batch(2)).unwrap();
    let got: Vec<_> = (0..2)
        .map(|_| {
            let d = consumer.recv().unwrap().unwrap();
            let p = d.position().unwrap().0;
            d.ack().unwrap();
            p
        })
        .collect();
    assert_eq!(got, [1, 2], "the data survived the restart");

    // Restarted again while that process lives: its ends reconnect (and move their claims to
    // their new client id); another process is refused.
    server.restart();
    fanout.publish(batch(3)).unwrap();
    assert_eq!(consumer.recv().unwrap().unwrap().position(), Some(Position(3)));
    let more: Vec<redis::Connection> = (0..8).map(|_| server.admin()).collect();
    let other = open(&url, &name);
    assert!(matches!(other.fanout(), Err(StreamError::ProducerBusy(_))), "a live fan-out's claim was taken");
    assert!(
        matches!(other.attach("search"), Err(StreamError::ConsumerAttached(_))),
        "a live consumer's claim was taken"
    );
    drop((others, more, other));
    let _ = redis_support::delete_keys(&mut server.admin(), &name);
}

/// A restart whose loading takes a while (`LOADING` for about a second): a publish of the
/// fan-out, one of a lane producer alone on its log (a `MULTI`/`EXEC`, refused whole), a receive,
/// an ack and a read of the stream, sent meanwhile from threads of their own, are retried within
/// `retry_for` and succeed; the deliveries held across the restart are still acknowledgeable.
#[test]
fn redis_restart_loading_is_a_transient_state_retried_within_retry_for() {
    use lanestream::StreamFanout;
    let mut server = own_server!();
    let url = server.url.clone();
    let name = redis_support::unique_name("rsl");
    let stream = open(&url, &name);
    let mut consumer = stream.attach("search").unwrap();
    let mut fanout = stream.fanout().unwrap();
    for p in 1..=3 {
        fanout.publish(batch(p)).unwrap();
    }
    let held = consumer.recv().unwrap().unwrap();
    let alone_name = redis_support::unique_name("rsla");
    let alone = RedisStream::builder(&url, &alone_name)
        .capacity(8)
        .sink("search")
        .retry_for(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut producer = alone.fanout().unwrap();
    producer.publish(batch(1)).unwrap();
    // Enough keys that loading them, slowed down, takes about a second.
    let mut admin = server.admin();
    let _: i64 = redis::cmd("EVAL")
        .arg("for i = 1, 3000 do redis.call('SET', 'fill:' .. i, i) end return 1")
        .arg(0)
        .query(&mut admin)
        .unwrap();
    drop(admin);

    server.stop();
    server.start_again(&["--key-load-delay", "300", "--loading-process-events-interval-bytes", "1024"]);
    let loading = redis::cmd("PING").query::<String>(&mut server.admin());
    assert!(
        loading.as_ref().is_err_and(|e| e.code() == Some("LOADING")),
        "the server answers LOADING while it loads: {loading:?}"
    );
    std::thread::scope(|s| {
        s.spawn(|| {
            producer.publish(batch(2)).unwrap_or_else(|e| panic!("a producer's publish during LOADING: {e}"))
        });
        s.spawn(|| {
            // Before or after the producer's publish (on its own thread) lands.
            let published =
                alone.stats("search").unwrap_or_else(|e| panic!("a read during LOADING: {e}")).published;
            assert!(published == 1 || published == 2, "{published}");
        });
        s.spawn(|| fanout.publish(batch(4)).unwrap_or_else(|e| panic!("a publish during LOADING: {e}")));
        s.spawn(|| {
            held.ack().unwrap_or_else(|e| panic!("an ack during LOADING: {e} ({:?})", stream.last_error()));
            let positions: Vec<u64> = (0..3)
                .map(|_| {
                    let d =
                        consumer.recv().unwrap_or_else(|e| panic!("a receive during LOADING: {e}")).unwrap();
                    let p = d.position().unwrap().0;
                    d.ack().unwrap();
                    p
                })
                .collect();
            assert_eq!(positions, [2, 3, 4]);
        });
    });
    assert_eq!(stream.acked("search").unwrap(), Some(Position(4)));
    assert_eq!(alone.stats("search").unwrap().published, 2);
    server.wait_ready();
    let _ = redis_support::delete_keys(&mut server.admin(), &name);
}

/// The stream's state lost (here: its keys deleted, as a restart without persistence leaves
/// it): the ends are told the state is gone ([`BackendError::StateLost`]), not that another
/// process took the lane over, which none did: the fan-out's publish, the consumer's receive
/// and a held delivery's ack. Also after a new build made the stream afresh.
#[test]
fn redis_restart_a_lost_state_is_reported_as_state_lost_not_as_a_take_over() {
    use lanestream::{AckError, BackendError, PublishError, RecvError};
    let server = own_server!();
    let url = server.url.clone();
    let name = redis_support::unique_name("rsg");
    let stream = open(&url, &name);
    let mut consumer = stream.attach("search").unwrap();
    let mut fanout = stream.fanout().unwrap();
    fanout.publish(batch(1)).unwrap();
    fanout.publish(batch(2)).unwrap();
    let held = consumer.recv().unwrap().unwrap();
    redis_support::delete_keys(&mut server.admin(), &name).unwrap();

    match fanout.publish(batch(3)) {
        Err(PublishError::Backend { error: BackendError::StateLost, .. }) => {}
        other => panic!("a publish after the state loss: {:?}", other.map_err(|e| e.to_string())),
    }
    match held.ack() {
        Err(AckError::Backend(BackendError::StateLost)) => {}
        other => panic!("an ack after the state loss: {other:?}"),
    }
    // A new process builds the stream afresh: the old ends still learn their state is gone.
    let _fresh = open(&url, &name);
    match consumer.recv() {
        Err(RecvError::Backend(BackendError::StateLost)) => {}
        other => panic!("a receive after the state loss: {:?}", other.map(|d| d.map(|d| d.position()))),
    }
    assert!(BackendError::StateLost.to_string().contains("state in the backend is gone"));
}

/// A refused command carries the server's reason: a server out of memory (`maxmemory` reached,
/// `noeviction`) refuses a publish with `Server(OutOfMemory)`, item handed back, and the
/// message says what to do; the stream's last error has the server's own words.
#[test]
fn redis_restart_a_refusal_carries_the_servers_reason() {
    use lanestream::{BackendError, PublishError, ServerReason};
    let server = own_server!();
    let url = server.url.clone();
    let name = redis_support::unique_name("rso");
    let stream = open(&url, &name);
    let mut fanout = stream.fanout().unwrap();
    fanout.publish(batch(1)).unwrap();
    let mut admin = server.admin();
    let _: () =
        redis::cmd("CONFIG").arg("SET").arg("maxmemory-policy").arg("noeviction").query(&mut admin).unwrap();
    let _: () = redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(1).query(&mut admin).unwrap();
    match fanout.publish(batch(2)) {
        Err(e @ PublishError::Backend { error: BackendError::Server(ServerReason::OutOfMemory), .. }) => {
            assert!(e.to_string().contains("OOM"), "{e}");
            assert_eq!(e.into_inner().position(), Some(Position(2)));
        }
        other => panic!("a publish over maxmemory: {:?}", other.map_err(|e| e.to_string())),
    }
    assert!(stream.last_error().is_some_and(|m| m.contains("OOM")), "{:?}", stream.last_error());
    let _: () = redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(0).query(&mut admin).unwrap();
    fanout.publish(batch(2)).unwrap();
}
