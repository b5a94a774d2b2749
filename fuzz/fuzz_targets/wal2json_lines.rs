//! Arbitrary lines into the wal2json reader: batches or errors, never a panic. A thin wrapper over
//! the harness shared with the corpus replay.
#![no_main]

#[path = "../../tests/fuzz_harness/mod.rs"]
mod fuzz_harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_harness::wal2json_lines(data));
