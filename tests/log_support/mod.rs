//! Helpers shared by the log's integration tests (`mod log_support;` in each `log_*` file).
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use lanestream::log::{Event, LogPosition, Query, ReadHandle, SequencedEvent};

/// An event of type `ty` with `tags` and a payload naming both.
pub fn ev(ty: &str, tags: &[&str]) -> Event {
    Event::new(ty, tags.iter().copied(), Bytes::from(format!("{ty}{tags:?}"))).unwrap()
}

/// An event with an explicit payload.
pub fn ev_data(ty: &str, tags: &[&str], data: impl Into<Bytes>) -> Event {
    Event::new(ty, tags.iter().copied(), data).unwrap()
}

/// Position `n` (at least 1).
pub fn pos(n: u64) -> LogPosition {
    LogPosition::new(n).unwrap()
}

/// The positions of `events`, as numbers.
pub fn positions(events: &[SequencedEvent]) -> Vec<u64> {
    events.iter().map(|s| s.position.get()).collect()
}

/// Every event of the log.
pub fn all(log: &ReadHandle) -> Vec<SequencedEvent> {
    log.read(&Query::All, None, usize::MAX).into_events()
}

/// A fresh, empty directory for one test (removed first if a previous run left it).
pub fn temp_dir(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "lanestream-log-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The longest any test waits for something that should happen at once.
pub const LIMIT: Duration = Duration::from_secs(20);
