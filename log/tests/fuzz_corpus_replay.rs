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
/// torn, split in two segments, with and without the header the harness can add. This build
/// writes format version 2 (`seed-v2-*`, the harness's flag bit 7); the `seed-*` of version 1
/// were written by the build before it and stay as they are. Run once with
/// `cargo test -p lanestream-log --test fuzz_corpus_replay -- --ignored`, then let the fuzzer grow the corpus and
/// `cargo fuzz cmin` it.
#[test]
#[ignore = "writes fuzz/corpus/log_segment/seed-v2-*; run by hand"]
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
        let mut input = vec![flags | 0x80];
        input.extend_from_slice(&split.to_le_bytes());
        input.push(second);
        input.extend_from_slice(body);
        std::fs::write(out.join(format!("seed-v2-{name}")), input).unwrap();
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
    // Format version 1 (`seed-*`) and 2 (`seed-v2-*`).
    for v in ["", "v2-"] {
        assert_eq!(count(&seed(&format!("seed-{v}whole-file"))), all, "{v}");
        assert_eq!(count(&seed(&format!("seed-{v}records-with-header"))), all, "{v}");
        assert_eq!(count(&seed(&format!("seed-{v}records-fixed-crc"))), all, "{v}");
        assert_eq!(count(&seed(&format!("seed-{v}two-segments"))), all, "{v}");
        assert_eq!(
            count(&seed(&format!("seed-{v}torn-tail"))),
            Some(vec!["CourseDefined".into(), "A".into(), "B".into()]),
            "{v}"
        );
        let mut foreign = seed(&format!("seed-{v}whole-file"));
        foreign[4] ^= 1; // the magic's first byte (after the 4-byte harness prefix)
        assert_eq!(count(&foreign), None, "{v}");
    }
    // Version 2: a bit flipped in an event whose record's CRC is then recomputed fails the
    // event's own CRC: corruption, wherever it is.
    let mut flipped = seed("seed-v2-records-with-header");
    flipped[4 + 8 + 12 + 4 + 2] ^= 1; // the first event's type (prefix, frame, record head, crc, type_len)
    let (mut segments, _) = layout(&flipped);
    let seg = &mut segments[0].1;
    let len = u32::from_le_bytes(seg[16..20].try_into().unwrap()) as usize;
    let mut checked = seg[16..20].to_vec();
    checked.extend_from_slice(&seg[24..24 + len]);
    let crc = fuzz_harness::log_segment::crc32c(&checked);
    seg[20..24].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(expect(&segments), Expect::Corrupt);
    // A damaged record followed by whole, CRC-valid ones is corruption, not a torn tail.
    assert_eq!(count(&seed("regression-flipped-bit-before-valid-records")), None);
    assert_eq!(count(&seed("regression-flipped-length-before-valid-records")), None);
}
