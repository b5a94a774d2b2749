//! Replays a committed fuzz corpus through a harness function, on stable: every file of
//! `fuzz/corpus/<target>/` under the crate's root, in name order. A file whose run panics is named
//! when the panic starts (by a panic hook), so it is named even if a second panic while
//! unwinding (a `Drop` that panics) aborts the test process. (The log's copy of the core's
//! `tests/corpus_replay/mod.rs`: a crate's tests reach no file outside it.)

use std::cell::RefCell;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Once;

thread_local! {
    /// The corpus file this thread is replaying, if any.
    static CURRENT: RefCell<Option<PathBuf>> = const { RefCell::new(None) };
}

/// Installs, once per process, a panic hook that names the corpus file the panicking thread is
/// replaying, then runs the hook it replaced.
fn name_failing_files() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // `try_with`: a panic while the thread-local is being destroyed names nothing.
            let _ = CURRENT.try_with(|current| {
                if let Some(file) = &*current.borrow() {
                    eprintln!("corpus file {} failed", file.display());
                }
            });
            previous(info);
        }));
    });
}

/// Runs `harness` on every file of the `target` corpus under `crate_root`.
///
/// # Panics
/// If the corpus is missing or empty, or `harness` panics on a file.
pub fn replay(crate_root: &Path, target: &str, harness: fn(&[u8])) {
    let dir = crate_root.join("fuzz/corpus").join(target);
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|entry| entry.expect("corpus entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "corpus {} is empty", dir.display());
    name_failing_files();
    for file in &files {
        let data = fs::read(file).expect("corpus file");
        CURRENT.with(|current| *current.borrow_mut() = Some(file.clone()));
        harness(&data);
    }
    CURRENT.with(|current| *current.borrow_mut() = None);
}
