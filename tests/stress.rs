//! A multi-threaded run over three lanes that checks the model's invariants at the end.
//!
//! One ingest thread publishes every batch to every lane through the fan-out (restarting it now and then);
//! one sink thread per lane receives, nacks or drops some deliveries, and hands the rest to two
//! worker threads that ack them in shuffled order; a chaos thread re-attaches consumers
//! mid-stream (the sinks then see `Detached` and re-attach themselves); a reader thread checks
//! that the watermark never decreases. At the end: every position acked exactly once on every
//! lane, the watermark at the last position, every batch copy dropped, the stream idle.
//!
//! Sized to take a few seconds in a debug build on two shared cores; release runs 5x more.

mod common;

use lanestream::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::envelope;
use lanestream::{AckHandle, Batch, Envelope, LaneItem, Position, Stream};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const LANES: usize = 3;
const CAPACITY: usize = 7;

/// Batch `i` (0-based): position `i + 1`, except every 50th is a snapshot row (no position).
fn position_of(i: usize) -> Option<u64> {
    (i % 50 != 25).then_some(i as u64 + 1)
}

#[test]
fn stress_three_lanes_with_nacks_drops_shuffled_acks_and_reattaches() {
    let started = Instant::now();
    let n: usize = if cfg!(debug_assertions) { 40_000 } else { 200_000 };
    let batches: Arc<Vec<LaneItem>> = Arc::new(
        (0..n)
            .map(|i| {
                let envelopes: Arc<[Envelope]> = vec![envelope("docs", "x", position_of(i), b"{}")].into();
                LaneItem::Batch(Batch::new(position_of(i).map(Position), envelopes))
            })
            .collect(),
    );
    let envelopes: Vec<Arc<[Envelope]>> = batches
        .iter()
        .map(|b| match b {
            LaneItem::Batch(b) => b.envelopes.clone(),
            other => unreachable!("{other:?}"),
        })
        .collect();
    let s = common::stream(CAPACITY, &["search", "cache", "archive"]);
    // acked[lane][i]: how many acks of item i landed on that lane (must end at exactly 1).
    let acked: Arc<Vec<Vec<AtomicU8>>> =
        Arc::new((0..LANES).map(|_| (0..n).map(|_| AtomicU8::new(0)).collect()).collect());
    let ingest_done = Arc::new(AtomicBool::new(false));
    let all_done = Arc::new(AtomicBool::new(false));
    let detached_acks = Arc::new(AtomicUsize::new(0));

    // Two workers ack handles in shuffled order (and drop a few: redelivered).
    let mut worker_txs = Vec::new();
    let mut workers = Vec::new();
    for w in 0..2u64 {
        let (tx, rx) = mpsc::channel::<(usize, AckHandle<LaneItem>)>();
        worker_txs.push(tx);
        let (acked, detached_acks) = (acked.clone(), detached_acks.clone());
        workers.push(thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(100 + w);
            let mut buf = Vec::new();
            let flush = |buf: &mut Vec<(usize, AckHandle<LaneItem>)>, rng: &mut StdRng| {
                buf.shuffle(rng);
                for (lane, h) in buf.drain(..) {
                    if rng.gen_ratio(1, 50) {
                        drop(h); // released: the sink gets it again
                        continue;
                    }
                    let seq = h.sequence() as usize;
                    match h.ack() {
                        Ok(()) => {
                            let before = acked[lane][seq].fetch_add(1, Ordering::SeqCst);
                            assert_eq!(before, 0, "lane {lane} item {seq} acked twice");
                        }
                        Err(_) => {
                            detached_acks.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            };
            loop {
                match rx.recv_timeout(Duration::from_millis(1)) {
                    Ok(x) => {
                        buf.push(x);
                        if buf.len() >= 8 {
                            flush(&mut buf, &mut rng);
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => flush(&mut buf, &mut rng),
                    Err(RecvTimeoutError::Disconnected) => {
                        flush(&mut buf, &mut rng);
                        return;
                    }
                }
            }
        }));
    }

    // One sink per lane: blocks in recv; nacks, drops, re-attaches, or hands off to a worker.
    let sinks: Vec<_> = s
        .lanes()
        .enumerate()
        .map(|(k, lane)| {
            let txs = worker_txs.clone();
            let batches = batches.clone();
            thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(k as u64);
                let mut c = lane.reattach();
                let mut last_first: Option<u64> = None;
                let (mut deliveries, mut reattaches) = (0u64, 0u64);
                loop {
                    let d = match c.recv_timeout(Duration::from_millis(50)) {
                        Ok(Some(d)) => d,
                        Ok(None) => {
                            if lane.is_idle() {
                                break;
                            }
                            // Closed and drained, but handles are still out: they may come back.
                            thread::sleep(Duration::from_millis(1));
                            continue;
                        }
                        Err(lanestream::RecvTimeoutError::Timeout) => continue,
                        Err(_detached) => {
                            c = lane.reattach();
                            reattaches += 1;
                            continue;
                        }
                    };
                    deliveries += 1;
                    let (item, h) = d.into_parts();
                    let seq = h.sequence();
                    assert_eq!(item, batches[seq as usize], "lane {k}: item {seq} is not what was published");
                    drop(item);
                    if h.attempt() == 1 {
                        if let Some(l) = last_first {
                            assert!(seq > l, "lane {k}: new items out of order");
                        }
                        last_first = Some(seq);
                    }
                    match rng.gen_range(0..100) {
                        0..=2 => h.nack(),
                        3..=4 => drop(h),
                        5 => {
                            // Re-attach ourselves while this delivery is out; its ack is then refused.
                            c = lane.reattach();
                            reattaches += 1;
                            txs[seq as usize % 2].send((k, h)).unwrap();
                        }
                        _ => txs[seq as usize % 2].send((k, h)).unwrap(),
                    }
                }
                (deliveries, reattaches)
            })
        })
        .collect();
    drop(worker_txs);

    // Chaos: re-attach some lane's consumer from outside every few milliseconds.
    let chaos = {
        let (s, ingest_done) = (s.clone(), ingest_done.clone());
        thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(7);
            let mut n = 0;
            while !ingest_done.load(Ordering::Acquire) {
                thread::sleep(Duration::from_millis(3));
                drop(s.lanes().nth(rng.gen_range(0..LANES)).unwrap().reattach());
                n += 1;
            }
            n
        })
    };

    // The reader: the watermark never decreases as seen from this thread (W3).
    let reader = {
        let (s, all_done) = (s.clone(), all_done.clone());
        thread::spawn(move || {
            let (mut last, mut reads) = (None, 0u64);
            while !all_done.load(Ordering::Acquire) {
                let w = s.watermark();
                assert!(w >= last, "watermark went from {last:?} to {w:?}");
                last = w;
                reads += 1;
                if reads % 32 == 0 {
                    thread::sleep(Duration::from_micros(100));
                }
            }
            reads
        })
    };

    // The ingest engine, restarting its fan-out every 7000 batches.
    let ingest = {
        let (s, batches, ingest_done) = (s.clone(), batches.clone(), ingest_done.clone());
        thread::spawn(move || {
            let mut fanout = Some(s.fanout().unwrap());
            for (i, b) in batches.iter().enumerate() {
                if i > 0 && i % 7000 == 0 {
                    drop(fanout.take());
                    fanout = Some(s.fanout().expect("a restarted fan-out gets the stream at once"));
                }
                fanout.as_mut().unwrap().publish(b.clone()).unwrap();
            }
            fanout.as_ref().unwrap().close();
            ingest_done.store(true, Ordering::Release);
        })
    };

    ingest.join().unwrap();
    let chaos_reattaches = chaos.join().unwrap();
    let sink_stats: Vec<_> = sinks.into_iter().map(|t| t.join().unwrap()).collect();
    workers.into_iter().for_each(|t| t.join().unwrap());
    all_done.store(true, Ordering::Release);
    let reads = reader.join().unwrap();

    let last = Position(n as u64); // batch n-1 is positioned
    assert_eq!(position_of(n - 1), Some(last.0));
    for (k, lane) in s.lanes().enumerate() {
        let missing: Vec<_> = (0..n).filter(|&i| acked[k][i].load(Ordering::SeqCst) != 1).take(5).collect();
        assert!(missing.is_empty(), "lane {k}: items not acked exactly once: {missing:?}");
        let st = lane.stats();
        assert_eq!(
            (st.published, st.acked_items, st.queued, st.released, st.in_flight),
            (n as u64, n as u64, 0, 0, 0)
        );
        assert_eq!(lane.acked(), Some(last));
        assert!(st.delivered > n as u64 && st.redelivered > 0, "lane {k}: {st:?}");
    }
    assert_eq!(s.watermark(), Some(last));
    assert!(s.is_idle());
    drop((s, batches));
    let live: Vec<_> =
        envelopes.iter().enumerate().filter(|(_, e)| Arc::strong_count(e) != 1).take(5).collect();
    assert!(live.is_empty(), "batches not dropped exactly once: {:?}", live.len());
    eprintln!(
        "stress: {n} batches x {LANES} lanes in {:?}; (deliveries, self re-attaches) per sink {sink_stats:?}; \
         {chaos_reattaches} chaos re-attaches; {} refused late acks; {reads} watermark reads",
        started.elapsed(),
        detached_acks.load(Ordering::Relaxed),
    );
}
