//! What the Redis fan-out test files share: their sinks, a stream of the test's own that is
//! deleted when the test ends, and its build.

use std::time::Duration;

use lanestream::RedisStream;

/// The sinks of the fan-out tests' streams, in build order.
pub const SINKS: [&str; 3] = ["search", "cache", "archive"];

/// Deletes the test stream's keys when dropped, also when the test panicked.
pub struct Cleanup {
    url: String,
    name: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Ok(mut conn) = redis::Client::open(self.url.as_str()).and_then(|c| c.get_connection()) {
            let _ = super::delete_keys(&mut conn, &self.name);
        }
    }
}

/// A test's stream name (starting with `prefix`), its cleanup guard and an admin connection.
pub fn setup(url: &str, prefix: &str) -> (String, Cleanup, redis::Connection) {
    let name = super::unique_name(prefix);
    let admin = redis::Client::open(url).unwrap().get_connection().unwrap();
    (name.clone(), Cleanup { url: url.to_owned(), name }, admin)
}

/// The builder of the fan-out tests' streams, retrying a lost connection for 2 s.
pub fn builder(url: &str, name: &str, capacity: usize, sinks: &[&str]) -> lanestream::RedisStreamBuilder {
    RedisStream::builder(url, name)
        .capacity(capacity)
        .sinks(sinks.iter().copied())
        .retry_for(Duration::from_secs(2))
}

/// A stream of `sinks`.
pub fn open_sinks(url: &str, name: &str, capacity: usize, sinks: &[&str]) -> RedisStream {
    builder(url, name, capacity, sinks).build().unwrap_or_else(|e| panic!("building stream {name}: {e}"))
}

/// A fan-out stream of [`SINKS`].
pub fn open(url: &str, name: &str, capacity: usize) -> RedisStream {
    open_sinks(url, name, capacity, &SINKS)
}

/// First deliveries (attempt 1) of the positions in `range`, as `drain_ack` lists them.
pub fn firsts(range: impl IntoIterator<Item = u64>) -> Vec<(u64, u32)> {
    range.into_iter().map(|p| (p, 1)).collect()
}
