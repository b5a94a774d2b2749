//! The codec's tests: round trips, old formats refused, hostile bytes.

use super::*;

fn envelope(index: &str, id: &str, op: Op, position: Option<u64>, document: &'static [u8]) -> Envelope {
    Envelope {
        index: IndexName::new(index).unwrap(),
        id: id.into(),
        op,
        position: position.map(Position),
        document: Bytes::from_static(document),
        built_at_micros: position.map(|p| p * 10),
        relation: None,
        old_id: None,
        unchanged: Vec::new(),
    }
}

fn samples() -> Vec<LaneItem> {
    vec![
        LaneItem::Batch(Batch::new(Some(Position(7)), Arc::from([]))),
        LaneItem::Batch(Batch::new(None, Arc::from([envelope("snap", "1", Op::Upsert, None, b"{}")]))),
        LaneItem::Batch(Batch {
            position: Some(Position(u64::MAX - 1)),
            changes: 2,
            offset: 5,
            envelopes: vec![
                Envelope {
                    relation: Some(users(vec![0])),
                    old_id: Some("40".into()),
                    unchanged: vec!["bio".into()],
                    ..envelope("public_users", "42", Op::Upsert, Some(9), br#"{"id":42,"name":"x"}"#)
                },
                envelope("public_users", "41", Op::Delete, Some(9), b""),
                envelope("public_orders", "", Op::Truncate, Some(9), b""),
                envelope("public_items", "", Op::Resync, Some(9), b""),
            ]
            .into(),
        }),
        LaneItem::SnapshotComplete { indexes: vec![] },
        LaneItem::SnapshotComplete {
            indexes: vec![IndexName::new("a").unwrap(), IndexName::new("_b9").unwrap()],
        },
    ]
}

fn request() -> Request {
    Request::Backfill {
        sink: SinkName::new("search").unwrap(),
        indexes: vec![IndexName::new("users").unwrap()],
        after: Some("42:a\\:b".into()),
    }
}

/// Bytes at an aligned address, as an `AlignedVec` would hand them over.
fn aligned(bytes: &[u8]) -> AlignedVec {
    let mut v = AlignedVec::new();
    v.extend_from_slice(bytes);
    v
}

#[test]
fn items_and_requests_round_trip() {
    for item in samples() {
        let bytes = encode_item(&item).unwrap();
        assert_eq!(decode_item(&bytes).unwrap(), item);
    }
    let bytes = encode_request(&request()).unwrap();
    assert_eq!(decode_request(&bytes).unwrap(), request());
    let fresh = Request::backfill(SinkName::new("search").unwrap(), vec![]);
    assert_eq!(decode_request(&encode_request(&fresh).unwrap()).unwrap(), fresh);
}

fn users(key: Vec<u16>) -> Arc<Relation> {
    let col = |name: &str, type_id, type_name: &str| RelationColumn {
        name: name.into(),
        type_id,
        type_name: type_name.into(),
        type_modifier: -1,
    };
    Arc::new(Relation {
        id: 16384,
        namespace: "public".into(),
        name: "Users".into(),
        columns: vec![col("id", 23, "int4"), col("bio", 25, "text")],
        key,
    })
}

/// P5, P6 on the wire: relations, old ids and unchanged columns round-trip; the envelopes of
/// one relation share one decoded `Arc`, and each relation is written once per batch.
#[test]
fn p6_relations_old_ids_and_unchanged_columns_round_trip_shared() {
    let (a, b) = (users(vec![0]), users(vec![1]));
    let mut moved = envelope("public_users", "2", Op::Upsert, Some(9), br#"{"id":2}"#);
    moved.relation = Some(a.clone());
    moved.old_id = Some("1".into());
    moved.unchanged = vec!["bio".into()];
    let mut gone = envelope("public_users", "1", Op::Delete, Some(9), br#"{"id":1}"#);
    gone.relation = Some(a.clone());
    let mut other = envelope("public_users", "x", Op::Upsert, Some(9), br#"{"id":3,"bio":"x"}"#);
    other.relation = Some(b);
    let same_value = Envelope { relation: Some(users(vec![0])), ..gone.clone() };
    let envelopes: Arc<[Envelope]> = vec![moved, gone, other, same_value].into();
    let item = LaneItem::Batch(Batch { position: Some(Position(9)), changes: 3, offset: 0, envelopes });
    let bytes = encode_item(&item).unwrap();
    let LaneItem::Batch(back) = decode_item(&bytes).unwrap() else { panic!("a batch") };
    assert_eq!(LaneItem::Batch(back.clone()), item);
    let rel = |i: usize| back.envelopes[i].relation.clone().unwrap();
    assert!(Arc::ptr_eq(&rel(0), &rel(1)) && Arc::ptr_eq(&rel(0), &rel(3)), "one relation, one Arc");
    assert!(!Arc::ptr_eq(&rel(0), &rel(2)));
    let view = view_batch(&bytes).unwrap();
    let e = view.envelope(0).unwrap();
    assert_eq!((e.old_id(), e.unchanged().collect::<Vec<_>>()), (Some("1"), vec!["bio"]));
    // Written once each: two relations in the table, not four.
    let ArchivedWireItem::Batch(wire) = access_item(&bytes).unwrap() else { panic!("a batch") };
    assert_eq!(wire.relations.len(), 2);
}

/// A lane item of format version 2 (`LSI2`, no relations) is refused, never misread.
#[test]
fn i3_version_2_items_are_refused_never_misread() {
    #[derive(rkyv::Archive, rkyv::Serialize)]
    struct V2Envelope {
        index: String,
        id: String,
        op: WireOp,
        position: Option<u64>,
        document: Vec<u8>,
        built_at_micros: Option<u64>,
    }
    #[derive(rkyv::Archive, rkyv::Serialize)]
    enum V2Item {
        Batch { position: Option<u64>, changes: u64, offset: u64, envelopes: Vec<V2Envelope> },
    }
    #[derive(rkyv::Archive, rkyv::Serialize)]
    struct V2Frame {
        magic: u32,
        item: V2Item,
    }
    let e = V2Envelope {
        index: "public_users".into(),
        id: "1".into(),
        op: WireOp::Upsert,
        position: Some(9),
        document: b"{}".to_vec(),
        built_at_micros: None,
    };
    let v2 = V2Frame {
        magic: u32::from_le_bytes(*b"LSI2"),
        item: V2Item::Batch { position: Some(9), changes: 1, offset: 0, envelopes: vec![e] },
    };
    let bytes = rkyv::to_bytes::<rancor::Error>(&v2).unwrap();
    let err = decode_item(&bytes).unwrap_err();
    assert!(
        matches!(err, CodecError::Invalid { .. } | CodecError::WrongMagic { expected: "lane item", .. }),
        "{err}"
    );
}

/// A request of format version 1 (`LSR1`, no `after`) is refused, never misread.
#[test]
fn i3_version_1_requests_are_refused_never_misread() {
    #[derive(rkyv::Archive, rkyv::Serialize)]
    enum V1Request {
        Backfill { sink: String, indexes: Vec<String> },
    }
    #[derive(rkyv::Archive, rkyv::Serialize)]
    struct V1Frame {
        magic: u32,
        request: V1Request,
    }
    let v1 = V1Frame {
        magic: u32::from_le_bytes(*b"LSR1"),
        request: V1Request::Backfill { sink: "search".into(), indexes: vec!["users".into()] },
    };
    let bytes = rkyv::to_bytes::<rancor::Error>(&v1).unwrap();
    let err = decode_request(&bytes).unwrap_err();
    assert!(
        matches!(err, CodecError::Invalid { .. } | CodecError::WrongMagic { expected: "request", .. }),
        "{err}"
    );
}

#[test]
fn the_view_reads_the_batch_in_place() {
    let item = &samples()[2];
    let LaneItem::Batch(batch) = item else { unreachable!() };
    let bytes = encode_item(item).unwrap();
    let view = view_batch(&bytes).unwrap();
    assert_eq!(view.position(), batch.position);
    assert_eq!(view.changes(), batch.changes);
    assert_eq!(view.offset(), batch.offset);
    assert_eq!(view.len(), batch.envelopes.len());
    for (v, e) in view.envelopes().zip(batch.envelopes.iter()) {
        assert_eq!(v.index(), e.index.as_str());
        assert_eq!(v.id(), e.id);
        assert_eq!(v.op(), e.op);
        assert_eq!(v.position(), e.position);
        assert_eq!(v.document(), &e.document[..]);
        assert_eq!(v.built_at_micros(), e.built_at_micros);
        // Borrowed from the buffer: no copy.
        let range = bytes.as_ptr() as usize..bytes.as_ptr() as usize + bytes.len();
        assert!(v.document().is_empty() || range.contains(&(v.document().as_ptr() as usize)));
    }
    assert!(view.envelope(batch.envelopes.len()).is_none());
    assert!(matches!(view_batch(&encode_item(&samples()[4]).unwrap()), Err(CodecError::NotABatch)));
    match view_item(&encode_item(&samples()[4]).unwrap()).unwrap() {
        ItemView::SnapshotComplete(names) => assert_eq!(names.iter().collect::<Vec<_>>(), ["a", "_b9"]),
        ItemView::Batch(_) => panic!("a snapshot_complete viewed as a batch"),
    }
}

/// Every truncation of every sample: an error or a valid value, never a panic.
#[test]
fn truncated_buffers_are_refused() {
    for item in samples() {
        let bytes = encode_item(&item).unwrap();
        for len in 0..bytes.len() {
            let cut = aligned(&bytes[..len]);
            if let Ok(decoded) = decode_item(&cut) {
                // The root is read from the end, so a prefix could in principle be another
                // valid item; it must then re-encode to itself.
                assert_eq!(decode_item(&encode_item(&decoded).unwrap()).unwrap(), decoded);
            }
            let _ = view_item(&cut);
            let _ = decode_request(&cut);
        }
    }
    assert!(matches!(decode_item(&[]), Err(CodecError::Invalid { len: 0, .. })));
}

/// Every single-bit flip of small encodings: an error or a valid value, never a panic; and a
/// value that decodes re-encodes to itself.
#[test]
fn bit_flipped_buffers_decode_to_valid_values_or_errors() {
    let mut encodings: Vec<AlignedVec> = samples().iter().map(|i| encode_item(i).unwrap()).collect();
    encodings.push(encode_request(&request()).unwrap());
    let (mut ok, mut err) = (0, 0);
    for bytes in &encodings {
        for bit in 0..bytes.len() * 8 {
            let mut flipped = aligned(bytes);
            flipped[bit / 8] ^= 1 << (bit % 8);
            match decode_item(&flipped) {
                Ok(item) => {
                    ok += 1;
                    assert_eq!(decode_item(&encode_item(&item).unwrap()).unwrap(), item);
                    assert!(view_item(&flipped).is_ok(), "decode and view disagree");
                }
                Err(_) => {
                    err += 1;
                    assert!(view_item(&flipped).is_err(), "decode and view disagree");
                }
            }
            if let Ok(r) = decode_request(&flipped) {
                assert_eq!(decode_request(&encode_request(&r).unwrap()).unwrap(), r);
            }
        }
    }
    assert!(ok > 0 && err > 0, "flips should both survive (in documents) and fail ({ok} ok, {err} err)");
}

#[test]
fn misaligned_buffers_are_refused() {
    let bytes = encode_item(&samples()[2]).unwrap();
    let mut shifted = AlignedVec::<16>::new();
    shifted.push(0);
    shifted.extend_from_slice(&bytes);
    for err in [decode_item(&shifted[1..]).unwrap_err(), view_item(&shifted[1..]).unwrap_err()] {
        assert!(matches!(err, CodecError::Misaligned { required: REQUIRED_ALIGN, .. }), "{err}");
    }
    assert!(matches!(decode_request(&shifted[1..]), Err(CodecError::Misaligned { .. })));
}

#[test]
fn a_request_is_not_a_lane_item() {
    let bytes = encode_request(&request()).unwrap();
    assert!(decode_item(&bytes).is_err());
    let bytes = encode_item(&samples()[4]).unwrap();
    assert!(decode_request(&bytes).is_err());
}

/// Names are re-validated on decode: patch a valid name into an invalid one in place.
#[test]
fn invalid_names_are_refused_on_decode() {
    let item = LaneItem::SnapshotComplete { indexes: vec![IndexName::new("abcdefghijklmnopq").unwrap()] };
    let mut bytes = encode_item(&item).unwrap();
    let at = bytes.windows(17).position(|w| w == b"abcdefghijklmnopq").unwrap();
    bytes[at] = b'A';
    let err = decode_item(&bytes).unwrap_err();
    assert!(
        matches!(err, CodecError::InvalidName { field: "index", source: NameError::Invalid(_) }),
        "{err}"
    );
    assert!(view_item(&bytes).is_err());

    let r = Request::backfill(SinkName::new("sinkname_long_enough").unwrap(), vec![]);
    let mut bytes = encode_request(&r).unwrap();
    let at = bytes.windows(20).position(|w| w == b"sinkname_long_enough").unwrap();
    bytes[at] = b'9';
    let err = decode_request(&bytes).unwrap_err();
    assert!(matches!(err, CodecError::InvalidName { field: "sink", .. }), "{err}");
}

#[test]
fn the_fast_name_check_agrees_with_the_name_types() {
    let alphabet = ["", "a", "z", "_", "0", "9", "A", "-", "é", " ", "\0"];
    let mut names: Vec<String> = vec!["x".repeat(63), "x".repeat(64), "_".repeat(63), "9".repeat(63)];
    for a in alphabet {
        for b in alphabet {
            for c in alphabet {
                names.push(format!("{a}{b}{c}"));
            }
        }
    }
    for name in names {
        assert_eq!(name_is_valid(&name), IndexName::new(name.as_str()).is_ok(), "{name:?}");
        assert_eq!(name_is_valid(&name), SinkName::new(name.as_str()).is_ok(), "{name:?}");
    }
}
