//! Operation sequences over 1-3 lanes of small capacities and their one fan-out (publishes,
//! single receives, acks, nacks, splits, re-attaches, closes, fan-out drops and claims), applied
//! to a `MemoryStream` and to the reference model, compared after every step. A thin wrapper: the
//! logic is shared with the proptest test and the corpus replay.
#![no_main]

#[path = "../../tests/model/mod.rs"]
mod model;

libfuzzer_sys::fuzz_target!(|data: &[u8]| model::run_bytes(data));
