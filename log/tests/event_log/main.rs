//! The event log's integration tests, one binary (one link of the crate), a module per subject:
//! [`semantics`] (append and read rules), [`subscribe`], [`source`] (the log feeding the lanes),
//! [`index`] (the type/tag index against a full scan), [`index_files`] (the persisted indexes and
//! the format version), [`durability`], [`corruption`] (a torn tail told from corruption),
//! [`inline_commit`] (the blocking append's inline commit racing the writer thread), [`lock`]
//! (one writer per directory across processes), [`follow`] (read-only followers) and
//! [`full_disk`] (run by `scripts/log-full-disk.sh`). Helpers: `support/`. The memory footprint
//! tests are a binary of their own (`tests/footprint.rs`): they count every allocation of the
//! process, which other tests running beside them would add to.

#[path = "support/mod.rs"]
mod log_support;

mod corruption;
mod durability;
mod follow;
mod full_disk;
mod index;
mod index_files;
mod inline_commit;
mod lock;
mod semantics;
mod source;
mod subscribe;
