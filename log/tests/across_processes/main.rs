//! The event log across processes, one binary of its own: [`lock`] (one writer per directory
//! across processes) and [`follow`] (read-only followers in other processes). Each re-runs this
//! binary as a child process. They are kept apart from the other integration tests
//! (`tests/event_log/`) because a process forked by one test briefly holds a copy of every open
//! file of the parent until it execs — the directory lock (`flock`) of a log that another test
//! just closed included — so a test that closes a log and reopens it at once could find it
//! still locked by a child of a test running beside it.

#[path = "../event_log/support/mod.rs"]
mod log_support;

mod follow;
mod lock;
