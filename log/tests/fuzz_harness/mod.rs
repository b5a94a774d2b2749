//! The log's byte-level fuzz harnesses, shared by path by the cargo-fuzz targets
//! (`fuzz/fuzz_targets/` in this crate) and the stable corpus replay
//! (`tests/fuzz_corpus_replay.rs`), so CI runs exactly what the fuzzer ran.
#![allow(dead_code)]

pub mod log_ops;
pub mod log_segment;
