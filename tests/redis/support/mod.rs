//! What the Redis test files share: the server to run against, unique stream names, the keys
//! of a test stream (found and deleted), and killing a stream's connections.

#![allow(dead_code)] // each test binary uses what it needs

use std::sync::atomic::{AtomicUsize, Ordering};

#[macro_use]
pub mod cut_proxy;
pub mod fanout;
pub mod server;

/// The server's URL (`LANESTREAM_REDIS_URL`), or `None` (after saying so once) when the tests
/// are to be skipped. Under CI (`CI=true`) a missing URL fails the test instead: CI must run
/// the Redis tests against a server.
pub fn url() -> Option<String> {
    match std::env::var("LANESTREAM_REDIS_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") => {
            panic!("LANESTREAM_REDIS_URL is not set: CI must run the Redis tests against a server")
        }
        _ => {
            // Once, and past the test harness's capture (which only takes `print!`s), so that it shows.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: LANESTREAM_REDIS_URL is not set (e.g. redis://127.0.0.1:6399): no Redis test ran"
                );
            });
            None
        }
    }
}

/// The server's URL, or an early return (skipped) from the test when none is configured.
macro_rules! server {
    () => {
        match $crate::redis_support::url() {
            Some(url) => url,
            None => return,
        }
    };
}

/// A stream name no other stream of this run (or an earlier one) uses, starting with `prefix`
/// (which tells the test files' streams apart on a shared server).
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{prefix}_{}_{}_{nanos}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Kills every connection of stream `name` (named `lanestream:<name>{<nonce>}`), as if its
/// process had died or the network had dropped it; other tests' connections are left alone.
pub fn kill_connections(admin: &mut redis::Connection, name: &str) {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(admin).unwrap();
    let tag = format!("name=lanestream:{name}{{");
    for line in list.lines().filter(|l| l.contains(&tag)) {
        let id = line.split(' ').find_map(|f| f.strip_prefix("id=")).unwrap();
        let _: redis::Value = redis::cmd("CLIENT").arg("KILL").arg("ID").arg(id).query(admin).unwrap();
    }
}

/// The keys of stream `name` (`{name}:*`; the test names hold no glob characters).
pub fn keys_of(conn: &mut redis::Connection, name: &str) -> redis::RedisResult<Vec<String>> {
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{{{name}}}:*"))
            .arg("COUNT")
            .arg(1000)
            .query(conn)?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// Deletes every key of stream `name`.
pub fn delete_keys(conn: &mut redis::Connection, name: &str) -> redis::RedisResult<()> {
    let keys = keys_of(conn, name)?;
    if !keys.is_empty() {
        redis::cmd("UNLINK").arg(&keys).query::<i64>(conn)?;
    }
    Ok(())
}

/// The entry numbers in stream `name`'s sink log, in order.
pub fn log_ids(admin: &mut redis::Connection, name: &str) -> Vec<u64> {
    let v: Vec<(String, redis::Value)> =
        redis::cmd("XRANGE").arg(format!("{{{name}}}:log")).arg("-").arg("+").query(admin).unwrap();
    v.into_iter().map(|(id, _)| id.split('-').next().unwrap().parse().unwrap()).collect()
}

/// A delivery's position (the test batches all have one).
pub fn pos(d: &lanestream::RedisDelivery<lanestream::LaneItem>) -> u64 {
    d.position().unwrap().0
}

/// (position, attempt) of every delivery `try_recv` gives until the lane is empty or closed;
/// each is acked (an unpositioned item counts as position 0).
pub fn drain_ack(
    c: &mut impl lanestream::LaneConsumer<
        lanestream::LaneItem,
        Delivery = lanestream::RedisDelivery<lanestream::LaneItem>,
    >,
) -> Vec<(u64, u32)> {
    let mut got = Vec::new();
    loop {
        match c.try_recv() {
            Ok(d) => {
                got.push((d.position().map_or(0, |p| p.0), d.attempt()));
                d.ack().unwrap();
            }
            Err(lanestream::TryRecvError::Empty | lanestream::TryRecvError::Closed) => return got,
            Err(e) => panic!("drain: {e:?}"),
        }
    }
}
