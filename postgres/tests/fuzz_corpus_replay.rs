//! Replays every committed file of the `wal2json_lines` and `pgoutput_decode` fuzz corpora (`fuzz/corpus/<target>/`
//! at the workspace root) through the same harness function the cargo-fuzz target wraps, on
//! stable, so CI checks it without nightly. Reproductions of fixed crashes live in the corpus too
//! (`regression-*`). The core's corpora are replayed by the root's `tests/fuzz_corpus_replay.rs`.

mod fuzz_harness;

// The replay loop is the core's (the corpora live in the workspace root's fuzz/ crate).
#[path = "../../tests/corpus_replay/mod.rs"]
mod corpus_replay;

use std::path::Path;

fn replay(target: &str, harness: fn(&[u8])) {
    corpus_replay::replay(&Path::new(env!("CARGO_MANIFEST_DIR")).join(".."), target, harness);
}

#[test]
fn wal2json_lines_corpus_replays() {
    replay("wal2json_lines", fuzz_harness::wal2json_lines);
}

#[test]
fn pgoutput_decode_corpus_replays() {
    replay("pgoutput_decode", fuzz_harness::pgoutput_decode);
}
