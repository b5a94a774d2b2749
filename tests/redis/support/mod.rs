//! What the Redis test files share: the server to run against, unique stream names, the keys
//! of a test stream (found and deleted), and killing a stream's connections.

#![allow(dead_code)] // each test binary uses what it needs

use lanestream::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

#[macro_use]
pub mod cut_proxy;
pub mod fanout;
pub mod server;

/// The server's URL: `LANESTREAM_REDIS_URL`, or else a throwaway `redis-server` this test
/// binary starts at the first call (a unix socket in a temp dir, no persistence, stopped by a
/// watchdog when the test process exits), or `None` (after saying so once, naming the package)
/// when there is no `redis-server` to run. Under CI (`CI=true`) that fails the test instead: CI
/// must run the Redis tests against a server.
pub fn url() -> Option<String> {
    static THROWAWAY: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    if let Ok(url) = std::env::var("LANESTREAM_REDIS_URL") {
        if !url.is_empty() {
            return Some(url);
        }
    }
    match THROWAWAY.get_or_init(throwaway) {
        Ok(url) => Some(url.clone()),
        Err(_) if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") => {
            panic!("no Redis server: CI must run the Redis tests against one (LANESTREAM_REDIS_URL, or redis-server on PATH)")
        }
        Err(why) => {
            // Once, and past the test harness's capture (which only takes `print!`s), so that it shows.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: no Redis server ({why}): install the Debian package redis-server, or set \
                     LANESTREAM_REDIS_URL (e.g. redis://127.0.0.1:6399): no Redis test ran"
                );
            });
            None
        }
    }
}

/// Starts the throwaway server of [`url`].
fn throwaway() -> Result<String, String> {
    use std::process::{Command, Stdio};
    let dir = std::env::temp_dir().join(format!("lanestream-test-redis-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let socket = dir.join("redis.sock");
    let status = Command::new("redis-server")
        .args(["--port", "0", "--unixsocket"])
        .arg(&socket)
        .args(["--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--daemonize", "yes"])
        .arg("--pidfile")
        .arg(dir.join("redis.pid"))
        .arg("--logfile")
        .arg(dir.join("redis.log"))
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("redis-server: {e}"))?;
    if !status.success() {
        return Err(format!("redis-server exited with {status}"));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !socket.exists() {
        if std::time::Instant::now() > deadline {
            return Err("redis-server did not open its socket in 10 s".into());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The watchdog: when this test process is gone, stop the server and remove its dir.
    let watchdog = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; kill $(cat '{dir}/redis.pid') 2>/dev/null; \
         sleep 1; rm -rf '{dir}'",
        pid = std::process::id(),
        dir = dir.display()
    );
    Command::new("sh")
        .args(["-c", &watchdog])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("the watchdog: {e}"))?;
    Ok(format!("redis+unix://{}", socket.display()))
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
