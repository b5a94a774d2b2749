//! The event log's integration tests, one binary (one link of the crate), a module per subject:
//! [`semantics`] (append and read rules), [`subscribe`], [`source`] (the log feeding the lanes),
//! [`index`] (the type/tag index against a full scan), [`index_files`] (the persisted indexes and
//! the format version), [`durability`], [`corruption`] (a torn tail told from corruption),
//! [`inline_commit`] (the blocking append's inline commit racing the writer thread) and
//! [`full_disk`] (run by `scripts/log-full-disk.sh`). Helpers: `support/`. Two kinds are
//! binaries of their own: the tests across processes (`tests/across_processes/`: the directory
//! lock, read-only followers), whose forked children would briefly hold this binary's open
//! files, and the memory footprint tests (`tests/footprint.rs`), which count every allocation of
//! the process.

#[path = "support/mod.rs"]
mod log_support;

mod corruption;
mod durability;
mod full_disk;
mod index;
mod index_files;
mod inline_commit;
mod semantics;
mod source;
mod subscribe;
