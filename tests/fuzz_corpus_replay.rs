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
        relation: None,
        old_id: None,
        unchanged: Vec::new(),
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
    let request = Request::backfill(SinkName::new("search").unwrap(), vec![name("users")]);
    std::fs::write(dir.join("seed-request"), encode_request(&request).unwrap()).unwrap();
    let resumed = Request::Backfill {
        sink: SinkName::new("search").unwrap(),
        indexes: vec![name("users"), name("orders")],
        after: Some("42:a\\:b".into()),
    };
    std::fs::write(dir.join("seed-request-after"), encode_request(&resumed).unwrap()).unwrap();
}
