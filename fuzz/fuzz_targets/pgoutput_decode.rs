//! Arbitrary bytes as pgoutput messages into the decoder (`lanestream-postgres`): batches or
//! named errors, never a panic, and documents that are JSON objects. A thin wrapper over the
//! harness shared with the corpus replay (`postgres/tests/fuzz_corpus_replay.rs`).
#![no_main]

#[path = "../../postgres/tests/fuzz_harness/mod.rs"]
mod fuzz_harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_harness::pgoutput_decode(data));
