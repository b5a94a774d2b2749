//! `lanestream-pipeline`, the harness of the main job: PostgreSQL changes (wal2json format-version 2) through lanestream into sinks.
//!
//! It runs on the pipeline library's driver ([`Pipeline`]): the harness's source (`ingest.rs`)
//! reads wal2json lines (`--input`, plain or gzip, `-` for stdin; by default the bundled capture
//! `data/wal2json-sample.jsonl.gz`) through the library's `FileSource`, each transaction one
//! [`Batch`] published to every sink's lane; one library sink engine per sink applies runs to
//! the harness's sink (`sink.rs`), which appends the envelopes as NDJSON to
//! `--out DIR/<sink>.ndjson` (or discards them with `--discard`) and flushes before the engine
//! acks. `--slow-sink` makes one sink sleep per batch; `--chaos` makes the sinks fail runs at
//! random (released, redelivered to a re-attached engine) and ask once for a backfill (answered
//! on their lane with snapshot batches and `SnapshotComplete`). The main thread draws a progress
//! bar (changes/s, watermark, per-lane lag), and in live mode with `--backfill`, one per table
//! being backfilled (rows read / estimated rows); indicatif draws them on stderr only when it is
//! a terminal.
//!
//! At the end it checks that every sink received every change at least once — tracked in memory
//! per sink as how many envelopes of each batch position arrived, so it also holds with
//! `--discard` — and that the final watermark is the last commit LSN. It prints a summary whose
//! last line is `PASS: <reason>`, `UNCOMPARED: <reason>` or `FAIL: <reason>` (and writes the same
//! summary as JSON with `--summary-json`: both come from one [`Summary`]), and exits non-zero on
//! FAIL: a check failed, or the input (or a sink) had an error. `PASS` is printed only where every
//! sink's whole output was compared with the source: the whole input file (file mode), or the
//! publication's tables at the end of a live run to `--end-lsn` (`tables.rs`); a live run stopped
//! mid-stream, or with `--discard`, whose own checks held, is `UNCOMPARED`.
//!
//! **Live mode** (`--source postgres://... --slot NAME [--create-slot]`): the ingest reads the
//! logical replication slot (pgoutput, `--publication`) through [`lanestream_postgres::live`]
//! (streaming replication) instead of a file; the library's pipeline checks the slot against the
//! sinks' states at start (a slot that resumes past a sink's data is refused), backfills new
//! sinks (`--joiners`) and tables that joined the publication, and confirms the slot up to the
//! stream's watermark, never more, as it moves, while a full lane keeps it waiting, while idle
//! and at shutdown (SIGTERM/SIGINT, or `--end-lsn`). `--create-slot` also creates the
//! publication when it is missing, for every table that can be published. Its sinks are durable
//! ([`lanestream_postgres::ndjson::DurableNdjson`]): before acking they fsync `<sink>.ndjson` and
//! atomically replace `<sink>.checkpoint` (the output length and the sink's state); at start they
//! cut the output back to the checkpoint and the engine skips what the state covers, so however
//! the process dies the outputs hold every committed change exactly once
//! (`scripts/e2e-postgres.sh` SIGKILLs it). With `--kill-sink-after` the file input's sinks are
//! durable too, and the summary reads every output back against what was published.
//!
//! **Over Redis** (`--backend redis://... --role ingest|sink|delete`): the ingest and each sink
//! run as separate processes on a [`lanestream::RedisStream`]; see `redis.rs` and
//! `scripts/e2e-redis.sh`, which SIGKILLs a sink mid-run.
//!
//! Without `--out` or `--discard` the sinks write `target/pipeline-out/<sink>.ndjson` under the
//! workspace root (the parent of this crate's `postgres/` directory, where the workspace's
//! `Cargo.toml` is), whatever the working directory or `CARGO_TARGET_DIR`.
//!
//! ```text
//! cargo run --release -p lanestream-postgres --bin lanestream-pipeline -- --discard --summary-json target/summary.json
//! cargo run --release -p lanestream-postgres --bin lanestream-pipeline -- --chaos --slow-sink
//! pg_recvlogical ... -f - | cargo run --release -p lanestream-postgres --bin lanestream-pipeline -- --input -
//! cargo run --release -p lanestream-postgres --bin lanestream-pipeline -- --source postgres://u:p@host/db --slot s --create-slot --out DIR
//! ```

mod args;
mod check;
mod ingest;
/// `--backend redis://...`: the ingest and each sink as separate processes.
mod redis;
mod run;
mod sink;
mod summary;
mod tables;

use prelude::*;

mod prelude {
    //! What every role's file uses.
    pub(crate) use std::collections::HashMap;
    pub(crate) use std::fs::File;
    pub(crate) use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
    pub(crate) use std::path::{Path, PathBuf};
    pub(crate) use std::process::ExitCode;
    pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
    pub(crate) use std::sync::{Arc, Mutex};
    pub(crate) use std::thread;
    pub(crate) use std::time::{Duration, Instant};

    pub(crate) use clap::Parser;
    pub(crate) use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
    pub(crate) use lanestream::{
        Batch, IndexName, Lane, LaneItem, MemoryStream, Position, Request, SinkName, Stream,
    };
    pub(crate) use lanestream_postgres::backfill::BackfillProgress;
    pub(crate) use lanestream_postgres::batch::TransactionBuilder;
    pub(crate) use lanestream_postgres::live::{LiveConfig, LiveSource};
    pub(crate) use lanestream_postgres::ndjson::{write_line, DurableNdjson};
    pub(crate) use lanestream_postgres::pipeline::metrics::{unix_micros_now, CommitLatency, LatencySummary};
    pub(crate) use lanestream_postgres::pipeline::{FileSource, Pipeline, PipelineError};
    pub(crate) use lanestream_postgres::wal2json::{Wal2JsonError, Wal2JsonReader};
    pub(crate) use rand::rngs::StdRng;
    pub(crate) use rand::{Rng, SeedableRng};
    pub(crate) use serde::Serialize;

    pub(crate) use crate::args::*;
    pub(crate) use crate::check::*;
    pub(crate) use crate::ingest::*;
    pub(crate) use crate::run::*;
    pub(crate) use crate::sink::*;
    pub(crate) use crate::summary::*;
    pub(crate) use crate::{sink_names, BoxError};
}

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub(crate) fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub(crate) fn sink_names(n: u16) -> Vec<String> {
    const NAMED: [&str; 3] = ["search", "cache", "archive"];
    (0..usize::from(n))
        .map(|i| NAMED.get(i).map_or_else(|| format!("sink_{i}"), |s| (*s).to_owned()))
        .collect()
}
