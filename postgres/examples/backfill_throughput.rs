//! The live source's backfill throughput: backfills one table through a live source (pgoutput
//! slot, DBLog chunks: see `lanestream_postgres::backfill`) and prints the rows per second, for
//! `scripts/backfill-bench.sh`, which runs it side by side with `COPY (SELECT ...) TO STDOUT`
//! of the same table.
//!
//! ```text
//! cargo run --release -p lanestream-postgres --example backfill_throughput -- \
//!     postgres://postgres@127.0.0.1:5432/postgres public_bf_bench [chunk rows] [slot] [probe]
//! ```
//! Creates the slot (and the publication `lanestream` FOR ALL TABLES) when missing; prints one
//! line: `rows <n> seconds <s> rows_per_s <r> batches <b>`. With `probe`, a thread inserts a
//! row into the table `bf_probe` (`id serial PRIMARY KEY`, created if missing) every 2 ms, and
//! the line ends with the live stream's latency (commit to `next_item`, median, ms) for one
//! second before the backfill and during it: `idle_latency_ms <a> backfill_latency_ms <b>`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lanestream::{IndexName, LaneItem, Request, SinkName};
use lanestream_postgres::backfill::DEFAULT_CHUNK_ROWS;
use lanestream_postgres::live::{LiveConfig, LiveSource};
use lanestream_postgres::pgoutput::PgOutputDecoder;
use lanestream_postgres::pipeline::{Source, SourceItem};

// The allocator the harness and the benches run on (a dev-dependency of the crate): the backfill
// allocates per row on one thread and frees on another, where the system allocator costs more.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(url), Some(index)) = (args.first(), args.get(1)) else {
        return Err("usage: backfill_throughput <url> <index> [chunk rows] [slot]".into());
    };
    let chunk_rows = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(DEFAULT_CHUNK_ROWS);
    let slot = args.get(3).map_or("lanestream_backfill_bench", String::as_str);
    let probe = args.get(4).is_some_and(|a| a == "probe");
    let stop = Arc::new(AtomicBool::new(false));
    let prober = probe
        .then(|| -> Result<_, postgres::Error> {
            let mut c = postgres::Client::connect(url, postgres::NoTls)?;
            c.batch_execute("CREATE TABLE IF NOT EXISTS bf_probe (id serial PRIMARY KEY)")?;
            let stop = stop.clone();
            Ok(std::thread::spawn(move || {
                // Relaxed: a stop flag polled in a loop; nothing is published through it.
                while !stop.load(Ordering::Relaxed) {
                    let _ = c.batch_execute("INSERT INTO bf_probe DEFAULT VALUES");
                    std::thread::sleep(Duration::from_millis(2));
                }
            }))
        })
        .transpose()?;
    let mut config = LiveConfig::new(url.clone(), slot);
    config.create_slot = true;
    config.backfill_chunk_rows = chunk_rows;
    let mut source = LiveSource::connect(config)?;
    source.open()?;
    let sink = SinkName::new("bench")?;
    let (mut idle, mut busy) = (Vec::new(), Vec::new());
    // The live stream's latency while nothing else happens.
    let idle_until = Instant::now() + if probe { Duration::from_secs(1) } else { Duration::ZERO };
    while Instant::now() < idle_until {
        if let Some(SourceItem::Change(b)) = source.next(Duration::from_millis(100))? {
            probe_latency(source.decoder(), &b, &mut idle);
            if let Some(p) = b.position {
                source.confirm(p)?;
            }
        }
    }
    let started = Instant::now();
    source.backfill(Request::backfill(sink, vec![IndexName::new(index.as_str())?]))?;
    let (mut rows, mut batches) = (0u64, 0u64);
    loop {
        match source.next(Duration::from_millis(100))? {
            Some(SourceItem::Snapshot { item: LaneItem::Batch(b), .. }) => {
                rows += b.envelopes.len() as u64;
                batches += 1;
            }
            Some(SourceItem::Snapshot { item: LaneItem::SnapshotComplete { .. }, .. }) => break,
            Some(SourceItem::Change(b)) => {
                probe_latency(source.decoder(), &b, &mut busy);
                if let Some(p) = b.position {
                    source.confirm(p)?;
                }
            }
            _ => {}
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    if let Some(p) = prober {
        let _ = p.join();
    }
    let latency = if probe {
        format!(" idle_latency_ms {:.2} backfill_latency_ms {:.2}", median(&mut idle), median(&mut busy))
    } else {
        String::new()
    };
    println!(
        "rows {rows} seconds {seconds:.3} rows_per_s {:.0} batches {batches}{latency}",
        rows as f64 / seconds
    );
    Ok(())
}

/// For a transaction of the probe table: now minus its commit time, in ms.
fn probe_latency(decoder: &PgOutputDecoder, batch: &lanestream::Batch, out: &mut Vec<f64>) {
    if batch.position.is_none() || !batch.envelopes.iter().any(|e| e.index.as_str() == "public_bf_probe") {
        return;
    }
    let (Some(commit), Ok(now)) =
        (decoder.commit_time_micros(), SystemTime::now().duration_since(UNIX_EPOCH))
    else {
        return;
    };
    out.push((now.as_micros() as f64 - commit as f64) / 1000.0);
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}
