//! Append (some conditional, some in one group commit) / read / read_back / subscribe / close /
//! reopen sequences against a full-scan reference model, compared after every step. A thin
//! wrapper over the harness shared with the corpus replay.
#![no_main]

#[path = "../../tests/fuzz_harness/mod.rs"]
mod fuzz_harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_harness::log_ops::log_ops(data));
