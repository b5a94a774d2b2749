//! The in-memory lanes' tests, one binary (one link of the crate with every feature), a module per
//! subject:
//!
//! - [`contract`]: the crate's contract, a test (or a few) per rule, the generic port tests
//!   (`tests/port_contract`) instantiated for `MemoryStream`;
//! - [`fanout`], [`shared_ring`]: the one fan-out over the stream's one array of cells;
//! - [`runs`]: runs (`recv_run` and its siblings); [`runs_faults`]: runs and the fan-out attacked
//!   (mixed receives, cumulative acks, releases, re-attach mid-run, wrap-around, close);
//!   [`seat_runs`]: runs acked and released under the seat, attacked on other threads;
//!   [`plain_runs`]: runs delivered plain (nothing in flight) attacked against a model, in
//!   races with re-attaches, consumer drops, gaps and acks on other threads;
//! - [`bounds`], [`memory_budget`]: capacity, holder and byte limits;
//! - [`drops`]: when items are dropped (M3); [`kept_panic`]: a drop panic kept by a refused
//!   publish, attacked through every publishing form (M3); [`async_waits`], [`wait_watermark`]: the waits;
//! - [`publish_copies`]: items copied into their cells, attacked (close or panic inside the push,
//!   panicking reclaim passes, budgeted runs, gaps under threads);
//! - [`model_proptest`]: random operation sequences against the reference model (`tests/model`).
//!
//! Not here: `tests/alloc.rs` (a counting global allocator: a binary of its own),
//! `tests/stress.rs` (the long multi-threaded run) and `tests/fuzz_corpus_replay.rs`.

#[path = "../common/mod.rs"]
mod common;
#[path = "../model/mod.rs"]
mod model;
#[path = "../port_contract/mod.rs"]
mod port_contract;
#[path = "../shared_model/mod.rs"]
mod shared_model;

mod async_waits;
mod bounds;
mod contract;
mod drops;
mod fanout;
mod kept_panic;
mod memory_budget;
mod model_proptest;
mod plain_runs;
mod publish_copies;
mod runs;
mod runs_faults;
mod seat_runs;
mod shared_ring;
mod wait_watermark;
