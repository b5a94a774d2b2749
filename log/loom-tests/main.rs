//! The loom models of the event log's waits, linked as one test binary (`cargo test -p
//! lanestream-log --test loom`). Compiled to nothing unless built with `--cfg lanestream_loom`;
//! run them with the workspace's `scripts/loom.sh`. The models say which interleavings they cover
//! and with which preemption bound; the argument they check is
//! `lanestream_log::docs::memory_ordering`.
#![cfg(lanestream_loom)]

mod support;

mod log;
