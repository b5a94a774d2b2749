//! Arbitrary lines into the wal2json reader (`lanestream-postgres`): batches or errors, never a
//! panic. A thin wrapper over the harness shared with the corpus replay
//! (`postgres/tests/fuzz_corpus_replay.rs`).
#![no_main]

#[path = "../../postgres/tests/fuzz_harness/mod.rs"]
mod fuzz_harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_harness::wal2json_lines(data));
