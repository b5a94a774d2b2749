//! Replays every committed file of the `wal2json_lines` fuzz corpus (`fuzz/corpus/wal2json_lines/`
//! at the workspace root) through the same harness function the cargo-fuzz target wraps, on
//! stable, so CI checks it without nightly. Reproductions of fixed crashes live in the corpus too
//! (`regression-*`). The core's corpora are replayed by the root's `tests/fuzz_corpus_replay.rs`.

mod fuzz_harness;

use std::fs;
use std::path::{Path, PathBuf};

fn replay(target: &str, harness: fn(&[u8])) {
    // The corpora live in the workspace root's fuzz/ crate, one level above this package.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target);
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|entry| entry.expect("corpus entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "corpus {} is empty", dir.display());
    for file in &files {
        let data = fs::read(file).expect("corpus file");
        let result = std::panic::catch_unwind(|| harness(&data));
        if let Err(panic) = result {
            eprintln!("corpus file {} failed", file.display());
            std::panic::resume_unwind(panic);
        }
    }
}

#[test]
fn wal2json_lines_corpus_replays() {
    replay("wal2json_lines", fuzz_harness::wal2json_lines);
}
