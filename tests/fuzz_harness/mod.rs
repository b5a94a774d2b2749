//! The byte-level fuzz harnesses, shared by path by the cargo-fuzz targets (`fuzz/fuzz_targets/`)
//! and the stable corpus replay (`tests/fuzz_corpus_replay.rs`), so CI runs exactly what the fuzzer
//! ran. The event log's harnesses are the crate `lanestream-log`'s own. The
//! `lane_ops` harness lives with the model, in `tests/model/mod.rs`; the `wal2json_lines`
//! harness with the reader, in `postgres/tests/fuzz_harness/mod.rs`.
#![allow(dead_code)]

use lanestream::codec::{self, AlignedVec, ItemView};
use lanestream::LaneItem;

fn aligned(bytes: &[u8]) -> AlignedVec {
    let mut v = AlignedVec::new();
    v.extend_from_slice(bytes);
    v
}

/// `codec_decode`: arbitrary bytes into the decoders and the view. Never a panic; a value that
/// decodes re-encodes and decodes to itself, and the view agrees with it.
pub fn codec_decode(data: &[u8]) {
    let bytes = aligned(data);
    let decoded = codec::decode_item(&bytes);
    let viewed = codec::view_item(&bytes);
    assert_eq!(decoded.is_ok(), viewed.is_ok(), "decode and view disagree on validity");
    if let (Ok(item), Ok(view)) = (&decoded, &viewed) {
        check_view(item, view);
        let again = codec::encode_item(item).expect("a decoded item encodes");
        let round = codec::decode_item(&again).expect("an encoded item decodes");
        assert_eq!(&round, item, "decode -> encode -> decode changed the item");
        check_view(item, &codec::view_item(&again).expect("an encoded item views"));
    }
    if let Ok(request) = codec::decode_request(&bytes) {
        let again = codec::encode_request(&request).expect("a decoded request encodes");
        assert_eq!(codec::decode_request(&again).expect("an encoded request decodes"), request);
    }
    // The same bytes one byte off alignment: refused as misaligned, never read.
    if !data.is_empty() {
        let mut shifted = AlignedVec::<16>::new();
        shifted.push(0);
        shifted.extend_from_slice(data);
        assert!(matches!(codec::decode_item(&shifted[1..]), Err(codec::CodecError::Misaligned { .. })));
        assert!(matches!(codec::view_item(&shifted[1..]), Err(codec::CodecError::Misaligned { .. })));
    }
}

fn check_view(item: &LaneItem, view: &ItemView<'_>) {
    match (item, view) {
        (LaneItem::Batch(b), ItemView::Batch(v)) => {
            assert_eq!(v.position(), b.position);
            assert_eq!(v.changes(), b.changes);
            assert_eq!(v.len(), b.envelopes.len());
            for (v, e) in v.envelopes().zip(b.envelopes.iter()) {
                assert_eq!(v.index(), e.index.as_str());
                assert_eq!(v.id(), e.id);
                assert_eq!(v.op(), e.op);
                assert_eq!(v.position(), e.position);
                assert_eq!(v.document(), &e.document[..]);
                assert_eq!(v.built_at_micros(), e.built_at_micros);
            }
        }
        (LaneItem::SnapshotComplete { indexes }, ItemView::SnapshotComplete(names)) => {
            assert!(names.iter().eq(indexes.iter().map(|n| n.as_str())));
        }
        _ => panic!("decode and view disagree on the kind of item"),
    }
}
