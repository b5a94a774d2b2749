//! The loom models of the lane engine, linked as one test binary (`cargo test --test loom`; the
//! event log's are the crate `lanestream-log`'s own).
//! Compiled to nothing unless built with `--cfg lanestream_loom`; run them with
//! `scripts/loom.sh`. Each module holds the models of one protocol step and says which
//! interleavings it covers and with which preemption bound.
#![cfg(lanestream_loom)]

mod support;

mod r#async;
mod attach;
mod budget;
mod close;
mod leaks;
mod reattach;
mod requests;
mod ring;
mod runs;
mod shared;
mod shared_races;
mod wait;
mod watermark;
