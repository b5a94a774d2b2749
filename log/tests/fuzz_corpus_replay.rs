//! Replays the log's committed fuzz corpora (`fuzz/corpus/<target>/` in this crate) through the
//! same harness functions the cargo-fuzz targets (`fuzz/fuzz_targets/`) wrap, on stable, so CI
//! checks them without nightly. Reproductions of fixed crashes live in the corpora too
//! (`fuzz/corpus/<target>/regression-*`).

mod corpus_replay;
mod fuzz_harness;

use std::path::Path;

fn replay(target: &str, harness: fn(&[u8])) {
    corpus_replay::replay(Path::new(env!("CARGO_MANIFEST_DIR")), target, harness);
}

#[test]
fn log_segment_corpus_replays() {
    replay("log_segment", fuzz_harness::log_segment::log_segment);
}

#[test]
fn log_ops_corpus_replays() {
    replay("log_ops", fuzz_harness::log_ops::log_ops);
}

/// Writes the hand-made seeds of the `log_segment` corpus: the segment bytes of real logs, whole,
/// torn, split in two segments, with and without the header the harness can add. Run once with
/// `cargo test -p lanestream-log --test fuzz_corpus_replay -- --ignored`, then let the fuzzer grow the corpus and
/// `cargo fuzz cmin` it.
#[test]
#[ignore = "writes fuzz/corpus/log_segment/seed-*; run by hand"]
fn write_log_segment_seeds() {
    use fuzz_harness::log_segment::{HEADER_LEN, TempDir};
    use lanestream_log::{AppendCondition, Event, EventLog, LogOptions, Query};

    let dir = TempDir::new("seeds");
    let log = EventLog::open(&dir.0, LogOptions::default()).unwrap();
    let e =
        |ty: &str, tags: &[&str], data: &'static [u8]| Event::new(ty, tags.iter().copied(), data).unwrap();
    log.append(vec![e("CourseDefined", &["course:1"], b"{\"capacity\":2}")], None).unwrap();
    log.append(vec![e("A", &[], b""), e("B", &["t0", "t1"], b"xy")], None).unwrap();
    let guard = AppendCondition::new(Query::tags(["course:1"]), log.head());
    log.append(vec![e("Fz", &["fz"], b"z")], Some(guard)).unwrap();
    log.close();
    let seg = std::fs::read(dir.0.join(format!("{:020}.seg", 1))).unwrap();
    let records = &seg[HEADER_LEN..];
    // The frame lengths, to split at a record boundary.
    let first_len = 8 + u32::from_le_bytes(records[..4].try_into().unwrap()) as usize;

    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/log_segment");
    std::fs::create_dir_all(&out).unwrap();
    let write = |name: &str, flags: u8, split: u16, second: u8, body: &[u8]| {
        let mut input = vec![flags];
        input.extend_from_slice(&split.to_le_bytes());
        input.push(second);
        input.extend_from_slice(body);
        std::fs::write(out.join(format!("seed-{name}")), input).unwrap();
    };
    write("whole-file", 0, 0, 0, &seg);
    write("records-with-header", 1, 0, 0, records);
    write("records-fixed-crc", 1 | 4, 0, 0, records);
    write("torn-tail", 1, 0, 0, &records[..records.len() - 3]);
    write("two-segments", 1 | 2 | 8, first_len as u16, 2, records);
    write("torn-header", 0, 0, 0, &seg[..11]);
    write("small-segments", 1 | 0x10, 0, 0, records);
}

/// The `log_segment` harness's reference reader agrees with the log on a real log, so the corpus
/// replay is not vacuous: the seed of a whole segment reads as its four events, a torn copy as
/// the prefix before the tear, and a foreign header or a damaged record before valid ones as
/// corruption.
#[test]
fn log_segment_reference_reads_the_seeds_as_written() {
    use fuzz_harness::log_segment::{Expect, expect, layout};
    let seed = |name: &str| {
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/log_segment").join(name))
            .unwrap()
    };
    let count = |data: &[u8]| match expect(&layout(data).0) {
        Expect::Opens { events, .. } => Some(events.iter().map(|e| e.ty.clone()).collect::<Vec<_>>()),
        Expect::Corrupt | Expect::Unsupported => None,
    };
    let all = Some(vec!["CourseDefined".to_string(), "A".into(), "B".into(), "Fz".into()]);
    assert_eq!(count(&seed("seed-whole-file")), all);
    assert_eq!(count(&seed("seed-records-with-header")), all);
    assert_eq!(count(&seed("seed-two-segments")), all);
    assert_eq!(count(&seed("seed-torn-tail")), Some(vec!["CourseDefined".into(), "A".into(), "B".into()]));
    let mut foreign = seed("seed-whole-file");
    foreign[4] ^= 1; // the magic's first byte (after the 4-byte harness prefix)
    assert_eq!(count(&foreign), None);
    // A damaged record followed by whole, CRC-valid ones is corruption, not a torn tail.
    assert_eq!(count(&seed("regression-flipped-bit-before-valid-records")), None);
    assert_eq!(count(&seed("regression-flipped-length-before-valid-records")), None);
}
