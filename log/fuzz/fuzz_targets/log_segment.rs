//! Arbitrary bytes as the segment files of a log directory: opening recovers exactly the valid
//! prefix (then takes appends and reopens consistently) or refuses with `Corrupt`, never panics.
//! A thin wrapper over the harness shared with the corpus replay.
#![no_main]

#[path = "../../tests/fuzz_harness/mod.rs"]
mod fuzz_harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_harness::log_segment::log_segment(data));
