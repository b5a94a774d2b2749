//! The live source's backfill throughput: backfills one table through a live source (pgoutput
//! slot, DBLog chunks: see `lanestream_postgres::backfill`) and prints the rows per second, for
//! `scripts/backfill-bench.sh`, which runs it side by side with `COPY (SELECT ...) TO STDOUT`
//! of the same table.
//!
//! ```text
//! cargo run --release -p lanestream-postgres --example backfill_throughput -- \
//!     postgres://postgres@127.0.0.1:5432/postgres public_bf_bench [chunk rows] [slot]
//! ```
//! Creates the slot (and the publication `lanestream` FOR ALL TABLES) when missing; prints one
//! line: `rows <n> seconds <s> rows_per_s <r> batches <b>`.

use std::time::{Duration, Instant};

use lanestream::{IndexName, LaneItem, Request, SinkName};
use lanestream_postgres::backfill::DEFAULT_CHUNK_ROWS;
use lanestream_postgres::live::{LiveConfig, LiveItem, LiveSource};
use lanestream_postgres::pgoutput::PgOutputDecoder;
use lanestream_postgres::wal2json::TransactionBuilder;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(url), Some(index)) = (args.first(), args.get(1)) else {
        return Err("usage: backfill_throughput <url> <index> [chunk rows] [slot]".into());
    };
    let chunk_rows = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(DEFAULT_CHUNK_ROWS);
    let slot = args.get(3).map_or("lanestream_backfill_bench", String::as_str);
    let mut config = LiveConfig::new(url.clone(), slot);
    config.create_slot = true;
    config.backfill_chunk_rows = chunk_rows;
    let mut source = LiveSource::connect(config)?;
    source.start()?;
    let mut decoder = PgOutputDecoder::new(TransactionBuilder::new().with_key_lookup(source.key_lookup()));
    let sink = SinkName::new("bench")?;
    let started = Instant::now();
    source.backfill(Request::backfill(sink, vec![IndexName::new(index.as_str())?]))?;
    let (mut rows, mut batches) = (0u64, 0u64);
    loop {
        match source.next_item(&mut decoder, Duration::from_millis(100))? {
            Some(LiveItem::Snapshot { item: LaneItem::Batch(b), .. }) => {
                rows += b.envelopes.len() as u64;
                batches += 1;
            }
            Some(LiveItem::Snapshot { item: LaneItem::SnapshotComplete { .. }, .. }) => break,
            Some(LiveItem::Change(b)) => {
                source.confirm(b.position)?;
            }
            _ => {}
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!("rows {rows} seconds {seconds:.3} rows_per_s {:.0} batches {batches}", rows as f64 / seconds);
    Ok(())
}
