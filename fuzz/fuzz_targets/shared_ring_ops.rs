//! Operation sequences over 1-3 lanes reading a stream's one array of 1, 2, 3 or 5 cells
//! (fan-out publishes, runs and single receives, acks, nacks, re-attaches, closes, memory reads,
//! fan-out replacements), applied to a `MemoryStream` and to the reference model, compared after
//! every step, with the exact drop count of every item. A thin wrapper: the logic is shared with
//! the proptest test (`tests/lanes/shared_ring.rs`) and the corpus replay.
#![no_main]

#[path = "../../tests/shared_model/mod.rs"]
mod shared_model;

libfuzzer_sys::fuzz_target!(|data: &[u8]| shared_model::run_bytes(data));
