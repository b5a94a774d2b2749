//! Replays a committed fuzz corpus through a harness function, on stable: every file of
//! `fuzz/corpus/<target>/` at the workspace root, in name order. A file whose run panics is named
//! before the panic is resumed. Shared by the core's and `lanestream-postgres`'s replay tests.

use std::fs;
use std::path::{Path, PathBuf};

/// Runs `harness` on every file of the `target` corpus under `workspace_root`.
///
/// # Panics
/// If the corpus is missing or empty, or `harness` panics on a file.
pub fn replay(workspace_root: &Path, target: &str, harness: fn(&[u8])) {
    let dir = workspace_root.join("fuzz/corpus").join(target);
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
