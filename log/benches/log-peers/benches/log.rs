//! The event log (`lanestream_log`) against the embedded event stores users would pick instead,
//! contenders of one workload in one criterion group so that their ratios come from one run.
//!
//! Contenders, each bench id naming its mode:
//! - `lanestream[durable]`: [`EventLog::open`] on tmpfs (`/dev/shm`, else the temporary
//!   directory), a reply after the group commit's fsync; `lanestream[memory]`:
//!   [`EventLog::in_memory`].
//! - `tephra[durable]`: tephra 0.4.1's `WriteCoordinator` / `WriteHandle` (default `WriterConfig`:
//!   batches of 2,048, a queue of 16,384) on tmpfs.
//! - `umadb-core[durable]`: umadb-core 0.7's embedded store on tmpfs, appends through its own
//!   group-commit writer thread (`writer_thread_blocking`, what its server runs), reads through
//!   `DcbEventStoreSync::read`. It has no embedded subscription, so it is not in `log_fanout`.
//! - `mutex-vec[memory]`: a `Mutex<Vec<event>>` plus a `Condvar`, conditions and reads by a
//!   scan: the floor any in-memory design has to beat.
//!
//! Groups (events are 256-byte payloads with a type and two tags, built on the caller's thread in
//! every contender's own form):
//! - `log_append/{unconditional,conditional}/batch_{1,64,512}/writers_{1,16}`: appends of
//!   `batch` events per call from 1 or 16 threads; time per append call, throughput in events.
//!   A conditional append carries the DCB guard "no event tagged with this decision's own key
//!   after the position I last saw" (never matching, so every append goes in), `after` being the
//!   writer's previous append's last position.
//! - `log_read/selective`: the 1% of a 50,000-event log carrying one tag; `log_read/full_scan`:
//!   all of it; throughput in events read.
//! - `log_fanout/subscribers_4`: one writer appends batches of 64 while 4 live subscriptions
//!   (`Query::All`) receive them; time per batch received by all four.
//!
//! The cold row (a log 4x its cache budget on the real disk, the page cache dropped between
//! rounds) is only in `benches/alternate.rs`: criterion's repeated samples would read a warm
//! cache after the first.
//!
//! `scripts/bench-ratios.sh --log` runs it in a quick mode and prints the ratio table.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lanestream_log_bench::{
    durable_contenders, fanout_run, filled, run_appends, Store, ACCOUNTS, FANOUT_BATCH, READ_LOG, SUBSCRIBERS,
};
use std::hint::black_box;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn appends(c: &mut Criterion) {
    for conditional in [false, true] {
        for batch in [1usize, 64, 512] {
            for writers in [1usize, 16] {
                let kind = if conditional { "conditional" } else { "unconditional" };
                let mut g = c.benchmark_group(format!("log_append/{kind}/batch_{batch}/writers_{writers}"));
                g.throughput(Throughput::Elements(batch as u64));
                g.sample_size(10);
                for (id, make) in durable_contenders() {
                    let mut store: Option<Box<dyn Store>> = None;
                    g.bench_function(id, |b| {
                        let s = &**store.get_or_insert_with(make);
                        b.iter_custom(|n| run_appends(s, writers, batch, conditional, n));
                    });
                }
                g.finish();
            }
        }
    }
}

fn reads(c: &mut Criterion) {
    for (name, tag, events) in
        [("selective", Some("acct:7"), READ_LOG / ACCOUNTS), ("full_scan", None, READ_LOG)]
    {
        let mut g = c.benchmark_group(format!("log_read/{name}"));
        g.throughput(Throughput::Elements(events as u64));
        g.sample_size(10);
        for (id, make) in durable_contenders() {
            let mut store: Option<Box<dyn Store>> = None;
            g.bench_function(id, |b| {
                let s = &**store.get_or_insert_with(|| filled(make));
                assert_eq!(s.read(tag), events, "{id} read the wrong number of events");
                b.iter(|| black_box(s.read(tag)));
            });
        }
        g.finish();
    }
}

fn fanout(c: &mut Criterion) {
    let mut g = c.benchmark_group(format!("log_fanout/subscribers_{SUBSCRIBERS}"));
    g.throughput(Throughput::Elements(FANOUT_BATCH as u64));
    g.sample_size(10);
    // umadb-core has no embedded subscription (its server builds one on a head watch).
    for (id, make) in durable_contenders().into_iter().filter(|(id, _)| !id.starts_with("umadb")) {
        let mut store: Option<Box<dyn Store>> = None;
        g.bench_function(id, |b| {
            let s = &**store.get_or_insert_with(make);
            b.iter_custom(|n| fanout_run(s, n));
        });
    }
    g.finish();
}

criterion_group!(benches, appends, reads, fanout);
criterion_main!(benches);
