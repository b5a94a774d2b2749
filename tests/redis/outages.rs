//! The pipeline's rule P8 on the Redis backend (issue 33, fault 8): a transient backend error
//! inside the retry budget is retried, never surfaced; an ack whose outcome a lost connection hid
//! is sent again (or its item redelivered), so that a lane never stays full behind an item its
//! sink already applied. Each test runs a redis-server of its own (`redis_support::server`), which
//! it stops and starts again, or makes refuse every write (`maxmemory` below the memory used,
//! `noeviction`: `OOM`).
//!
//! Needs `redis-server` on PATH and `LANESTREAM_REDIS_URL` set (as every Redis test: the switch
//! that says a server may be run; the tests do not use that server).
#![cfg(feature = "redis")]

use crate::{common, redis_support};
use lanestream::prelude::*;

use std::thread;
use std::time::Duration;

use common::batch;
use lanestream::{
    AckError, BackendError, LaneConsumer, Position, PublishError, RedisStream, Stream, StreamFanout,
};
use redis_support::cut_proxy::CutProxy;
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

/// A one-lane stream (`search`) of capacity `capacity` with the default retry budget (5 s).
fn open(url: &str, name: &str, capacity: usize) -> RedisStream {
    RedisStream::builder(url, name)
        .capacity(capacity)
        .sinks(["search"])
        .build()
        .unwrap_or_else(|e| panic!("building stream {name}: {e}"))
}

/// Runs `op` on another thread while the server is down: stopped (`SHUTDOWN`) before `op`
/// starts, started again `down` later on the same socket and dir (its data kept: `appendonly
/// yes`); returns what `op` returned.
fn during_outage<R: Send>(server: &mut Server, down: Duration, op: impl FnOnce() -> R + Send) -> R {
    server.stop();
    thread::scope(|s| {
        let op = s.spawn(op);
        thread::sleep(down);
        server.start_again(&[]);
        server.wait_ready();
        op.join().unwrap()
    })
}

/// Runs `op` on another thread while the server refuses every write (`maxmemory` 1 byte, below
/// the memory it uses, with the `noeviction` policy: `OOM`), lifted `refused` later.
fn during_oom<R: Send>(server: &Server, refused: Duration, op: impl FnOnce() -> R + Send) -> R {
    let mut admin = server.admin();
    let set = |admin: &mut redis::Connection, bytes: &str| {
        redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(bytes).query::<()>(admin).unwrap();
    };
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query::<()>(&mut admin)
        .unwrap();
    set(&mut admin, "1");
    let probe = redis::cmd("SET").arg("oom_probe").arg("1").query::<()>(&mut admin);
    assert!(probe.is_err_and(|e| e.code() == Some("OOM")), "maxmemory 1 refuses writes");
    thread::scope(|s| {
        let op = s.spawn(op);
        thread::sleep(refused);
        set(&mut admin, "0");
        op.join().unwrap()
    })
}

/// P8: a transient backend error inside the retry budget is retried, never surfaced nor turned
/// into a close. A publish, a blocking receive and an ack each made while the server is down
/// (0.3 s, then started again with its data) return what they would have returned without the
/// outage; the lane is still open and its counts are exact.
#[test]
fn p8_a_transient_error_inside_the_retry_budget_is_retried_across_a_server_outage() {
    let mut server = own_server!();
    let url = server.url.clone();
    let name = redis_support::unique_name("p8out");
    let s = open(&url, &name, 8);
    let mut f = s.fanout().unwrap();
    let mut c = s.reattach("search").unwrap();
    f.publish(batch(1)).unwrap();
    let d1 = c.recv().unwrap().unwrap();
    let down = Duration::from_millis(300);

    during_outage(&mut server, down, || f.publish(batch(2))).expect("a publish rides a 0.3 s outage out");
    during_outage(&mut server, down, || d1.ack()).expect("an ack rides a 0.3 s outage out");
    let d2 = during_outage(&mut server, down, || c.recv()).expect("a receive rides a 0.3 s outage out");
    let d2 = d2.expect("the lane is not closed");
    assert_eq!((d2.position(), d2.attempt()), (Some(Position(2)), 1));
    during_outage(&mut server, down, || d2.ack()).expect("an ack rides a 0.3 s outage out");

    let st = s.stats("search").unwrap();
    assert_eq!((st.published, st.acked_items, st.closed), (2, 2, false), "{st:?}");
    assert_eq!(s.watermark(), Some(Position(2)));
    assert!(s.connection_errors() > 0, "the outages were met (and retried)");
}

/// P8 with refused writes: a server at its `maxmemory` with `noeviction` refuses every write
/// (`OOM`) without running it, a state that passes (acks let the log be trimmed, an operator
/// raises the limit). Inside the retry budget it is retried like a lost connection: a publish, a
/// receive and an ack made while writes are refused (for 0.4 s) land once the refusal is lifted,
/// with no error.
#[test]
fn p8_a_transient_error_inside_the_retry_budget_is_retried_while_writes_are_refused_oom() {
    let server = own_server!();
    let url = server.url.clone();
    let name = redis_support::unique_name("p8oom");
    let s = open(&url, &name, 8);
    let mut f = s.fanout().unwrap();
    let mut c = s.reattach("search").unwrap();
    f.publish(batch(1)).unwrap();
    let d1 = c.recv().unwrap().unwrap();
    let refused = Duration::from_millis(400);

    let r = during_oom(&server, refused, || f.publish(batch(2)));
    assert!(r.is_ok(), "a publish refused (OOM) for 0.4 s lands once writes are let through: {r:?}");
    let r = during_oom(&server, refused, || d1.ack());
    assert!(r.is_ok(), "an ack refused (OOM) for 0.4 s lands once writes are let through: {r:?}");
    let r = during_oom(&server, refused, || c.recv());
    let d2 = match r {
        Ok(Some(d)) => d,
        other => panic!("a receive refused (OOM) for 0.4 s delivers once writes are let through: {other:?}"),
    };
    assert_eq!((d2.position(), d2.attempt()), (Some(Position(2)), 1));
    let r = during_oom(&server, refused, || d2.ack());
    assert!(r.is_ok(), "{r:?}");

    let st = s.stats("search").unwrap();
    assert_eq!((st.published, st.acked_items, st.closed), (2, 2, false), "{st:?}");
    assert_eq!(s.watermark(), Some(Position(2)));
}

/// The ack log's `XADD` of lane `search` (a first delivery's ack: see "The ack log" in the
/// backend's scripts); the ack's retries run the ack script, which the proxy lets through but
/// cannot reach while it refuses connections.
const ACK_APPEND: &[u8] = b":l:search:al\r\n";

/// P8: an ack whose outcome a lost connection hid (its request lost, or the server ran it and
/// its reply was lost, and every retry failed until the budget ran out) never leaves the lane
/// holding an item its sink applied: the consumer sends the ack again before its next receive,
/// so the acked prefix moves and the lane has room again (capacity 2 here: full before). If the
/// consumer is gone before it could (its process exited), the item is redelivered to the next
/// consumer, which acks it (a sink skips what its checkpoint holds).
#[test]
fn p8_an_ack_whose_reply_was_lost_is_retried_or_redelivered_so_the_lane_never_stays_full() {
    let server = own_server!();
    let proxy = CutProxy::start(&server.url).expect("the own server is on a unix socket");
    for (round, ran) in [false, true].into_iter().enumerate() {
        let name = redis_support::unique_name("p8ack");
        let direct = open(&server.url, &name, 2);
        let through = RedisStream::builder(&proxy.url, &name)
            .capacity(2)
            .sinks(["search"])
            .retry_for(Duration::from_millis(500))
            .build()
            .unwrap();
        let mut f = direct.fanout().unwrap();
        f.publish(batch(1)).unwrap();
        f.publish(batch(2)).unwrap();
        let mut c = through.reattach("search").unwrap();
        let d1 = c.recv().unwrap().unwrap();
        assert_eq!(d1.position(), Some(Position(1)));

        // Retried: the consumer's next receive sends it first.
        proxy.arm_refusing(ACK_APPEND, ran);
        let acked = d1.ack();
        assert_eq!(
            acked,
            Err(AckError::Backend(BackendError::Connection)),
            "round {round}: every try failed"
        );
        proxy.heal();
        if !ran {
            assert!(
                matches!(f.try_publish(batch(3)), Err(PublishError::Full(_))),
                "round {round}: the lost ack did not land, so the lane is full"
            );
        }
        let d2 = c.recv().unwrap().expect("not closed");
        assert_eq!(d2.position(), Some(Position(2)));
        assert_eq!(
            direct.acked("search").unwrap(),
            Some(Position(1)),
            "round {round} (the server ran it: {ran}): the ack was sent again before the next receive"
        );
        f.try_publish(batch(3)).expect("the lane has room again");

        // Redelivered: the consumer is gone (with its unsent ack) before it could send it again.
        proxy.arm_refusing(ACK_APPEND, ran);
        assert_eq!(d2.ack(), Err(AckError::Backend(BackendError::Connection)), "round {round}");
        drop(c);
        proxy.heal();
        let mut c = through.reattach("search").unwrap();
        let again = c.recv().unwrap().expect("not closed");
        if ran {
            // It had landed: nothing comes back, the next item comes.
            assert_eq!((again.position(), again.attempt()), (Some(Position(3)), 1), "round {round}");
        } else {
            assert_eq!((again.position(), again.attempt()), (Some(Position(2)), 2), "round {round}");
            again.ack().unwrap();
            let next = c.recv().unwrap().expect("not closed");
            assert_eq!(next.position(), Some(Position(3)));
            next.ack().unwrap();
        }
        assert!(direct.acked("search").unwrap() >= Some(Position(2)), "round {round}");
        drop(c);
        through.delete().ok();
    }
}
