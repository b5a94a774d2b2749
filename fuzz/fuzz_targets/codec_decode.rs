//! Arbitrary bytes into the rkyv decoders and views: an error or a value that round-trips. A thin
//! wrapper over the harness shared with the corpus replay.
#![no_main]

#[path = "../../tests/fuzz_harness/mod.rs"]
mod fuzz_harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_harness::codec_decode(data));
