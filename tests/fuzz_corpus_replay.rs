//! Replays every committed fuzz corpus file (`fuzz/corpus/<target>/`) through the same harness
//! functions the cargo-fuzz targets wrap, on stable, so CI checks them without nightly.
//! Reproductions of fixed crashes live in the corpora too (`fuzz/corpus/<target>/regression-*`).
//! The `wal2json_lines` corpus is replayed by `lanestream-postgres`
//! (`postgres/tests/fuzz_corpus_replay.rs`).
#![cfg(feature = "codec")]

mod fuzz_harness;
mod model;
mod shared_model;

mod corpus_replay;

use std::path::Path;

fn replay(target: &str, harness: fn(&[u8])) {
    corpus_replay::replay(Path::new(env!("CARGO_MANIFEST_DIR")), target, harness);
}

#[test]
fn lane_ops_corpus_replays() {
    replay("lane_ops", model::run_bytes);
}

#[test]
fn shared_ring_ops_corpus_replays() {
    replay("shared_ring_ops", shared_model::run_bytes);
}

#[test]
fn codec_decode_corpus_replays() {
    replay("codec_decode", fuzz_harness::codec_decode);
}

#[test]
fn log_segment_corpus_replays() {
    replay("log_segment", fuzz_harness::log_segment::log_segment);
}

#[test]
fn log_ops_corpus_replays() {
    replay("log_ops", fuzz_harness::log_ops::log_ops);
}

/// Writes the hand-made seeds of the `codec_decode` corpus (encodings of typical items and
/// requests). Run once with `cargo test --test fuzz_corpus_replay -- --ignored`, then let the
/// fuzzer grow the corpus and `cargo fuzz cmin` it.
#[test]
#[ignore = "writes fuzz/corpus/codec_decode/seed-*; run by hand"]
fn write_codec_seeds() {
    use bytes::Bytes;
    use lanestream::codec::{encode_item, encode_request};
    use lanestream::{Batch, Envelope, IndexName, LaneItem, Op, Position, Request, SinkName};

    let name = |s: &str| IndexName::new(s).unwrap();
    let envelope = |id: &str, op, document: &'static [u8]| Envelope {
        index: name("public_users"),
        id: id.into(),
        op,
        position: Some(Position(0x1_0000_0010)),
        document: Bytes::from_static(document),
        built_at_micros: Some(1_700_000_000_000_000),
    };
    let items = [
        LaneItem::Batch(Batch::new(Some(Position(7)), Vec::new().into())),
        LaneItem::Batch(Batch::new(
            Some(Position(0x1_0000_0010)),
            vec![
                envelope("42", Op::Upsert, br#"{"id":42,"name":"a"}"#),
                envelope("41", Op::Delete, br#"{"id":41}"#),
                envelope("", Op::Truncate, b""),
            ]
            .into(),
        )),
        LaneItem::Batch(Batch::new(None, vec![envelope("1", Op::Upsert, b"{}")].into())),
        LaneItem::SnapshotComplete { indexes: vec![name("users"), name("_orders_2")] },
    ];
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/codec_decode");
    std::fs::create_dir_all(&dir).unwrap();
    for (i, item) in items.iter().enumerate() {
        std::fs::write(dir.join(format!("seed-item-{i}")), encode_item(item).unwrap()).unwrap();
    }
    let request = Request::Backfill { sink: SinkName::new("search").unwrap(), indexes: vec![name("users")] };
    std::fs::write(dir.join("seed-request"), encode_request(&request).unwrap()).unwrap();
}

/// Writes the hand-made seeds of the `log_segment` corpus: the segment bytes of real logs, whole,
/// torn, split in two segments, with and without the header the harness can add. Run once with
/// `cargo test --test fuzz_corpus_replay -- --ignored`, then let the fuzzer grow the corpus and
/// `cargo fuzz cmin` it.
#[test]
#[ignore = "writes fuzz/corpus/log_segment/seed-*; run by hand"]
fn write_log_segment_seeds() {
    use fuzz_harness::log_segment::{TempDir, HEADER_LEN};
    use lanestream::log::{AppendCondition, Event, EventLog, LogOptions, Query};

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
    use fuzz_harness::log_segment::{expect, layout, Expect};
    let seed = |name: &str| {
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/log_segment").join(name))
            .unwrap()
    };
    let count = |data: &[u8]| match expect(&layout(data).0) {
        Expect::Opens { events, .. } => Some(events.iter().map(|e| e.ty.clone()).collect::<Vec<_>>()),
        Expect::Corrupt => None,
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
