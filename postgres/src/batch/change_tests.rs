//! The builder fed [`Change`]s directly (what the pgoutput decoder hands it), without a reader in
//! front: key changes, partial updates, chunks, the errors of commits and begins, the relation an
//! envelope carries, and the id encoding against its inverse ([`decode_id`]).

use std::borrow::Cow;
use std::sync::Arc;

use lanestream::{Batch, Envelope, Op, Position, Relation, RelationColumn};

use super::*;

static ID: [Key<'static>; 1] = [Key { name: Cow::Borrowed("id") }];

fn col<'a>(name: &'a str, value: &'a str) -> Column<'a> {
    Column { name: Cow::Borrowed(name), value }
}

/// A shape of `public.t`: `columns` as (name, type OID), `key` their indexes.
fn shape(columns: &[(&str, u32)], key: &[u16]) -> Arc<Relation> {
    Arc::new(Relation {
        id: 1,
        namespace: "public".into(),
        name: "t".into(),
        columns: columns
            .iter()
            .map(|&(name, type_id)| RelationColumn {
                name: name.into(),
                type_id,
                type_name: String::new(),
                type_modifier: -1,
            })
            .collect(),
        key: key.to_vec(),
    })
}

/// A change of `public.t` keyed by `id` (from the stream, as pgoutput's are).
fn change<'r, 'a>(
    action: char,
    columns: Option<&'r [Column<'a>]>,
    identity: Option<&'r [Column<'a>]>,
) -> Change<'r, 'a> {
    Change {
        action,
        schema: "public",
        table: "t",
        pk: Some(&ID),
        columns,
        identity,
        key_from_stream: true,
        lsn: None,
        relation: None,
        unchanged: &[],
    }
}

fn at(lsn: u64) -> Commit<'static> {
    Commit { position: Ok(Position(lsn)), lsn: None, xid: Ok(None) }
}

fn doc(e: &Envelope) -> &str {
    std::str::from_utf8(&e.document).expect("UTF-8 document")
}

/// (op, id, old_id, unchanged, document) of an envelope.
fn seen(e: &Envelope) -> (Op, &str, Option<&str>, Vec<&str>, &str) {
    (e.op, e.id.as_str(), e.old_id.as_deref(), e.unchanged.iter().map(String::as_str).collect(), doc(e))
}

/// One transaction of `changes` at `lsn` through `b`: every batch it gave.
fn transaction(b: &mut TransactionBuilder, lsn: u64, changes: &[Change<'_, '_>]) -> Vec<Batch> {
    b.push_begin(1, Some(7), Some(Position(lsn))).expect("begin");
    let mut out = Vec::new();
    for (i, c) in changes.iter().enumerate() {
        out.extend(b.push_change(i as u64 + 2, c).expect("change"));
    }
    out.extend(b.push_commit(changes.len() as u64 + 2, at(lsn)).expect("commit"));
    out
}

#[test]
fn a_key_change_upserts_the_new_id_naming_the_old_then_deletes_the_old_and_only_the_upsert_is_partial() {
    // REPLICA IDENTITY DEFAULT: the old key (K) and a new row that left `body` (a TOASTed value)
    // out as unchanged.
    let rel = shape(&[("id", 23), ("body", 25), ("v", 23)], &[0]);
    let new = [col("id", "2"), col("v", "5")];
    let old = [col("id", "1")];
    let c = Change { relation: Some(&rel), unchanged: &[1], ..change('U', Some(&new), Some(&old)) };
    let batches = transaction(&mut TransactionBuilder::new(), 0x10, &[c]);
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].changes, 1, "one change, two envelopes");
    let e = &batches[0].envelopes;
    assert_eq!(
        e.iter().map(seen).collect::<Vec<_>>(),
        [
            (Op::Upsert, "2", Some("1"), vec!["body"], r#"{"id":2,"v":5}"#),
            (Op::Delete, "1", None, vec![], r#"{"id":1}"#),
        ]
    );
    assert!(e.iter().all(|e| e.relation.as_ref().is_some_and(|r| Arc::ptr_eq(r, &rel))));
}

#[test]
fn an_update_names_as_unchanged_only_the_columns_its_old_row_could_not_fill() {
    let rel = shape(&[("id", 23), ("body", 25), ("v", 23)], &[0]);
    let new = [col("id", "1"), col("v", "2")];
    // (old row, unchanged the envelope names, document)
    let full_old = [col("id", "1"), col("body", r#""B""#), col("v", "1")];
    let key_old = [col("id", "1")];
    type Case<'r, 'a> = (Option<&'r [Column<'a>]>, &'r [&'r str], &'r str);
    let cases: [Case<'_, '_>; 3] = [
        // REPLICA IDENTITY FULL: the old row holds `body`, so the update is whole.
        (Some(&full_old), &[], r#"{"id":1,"body":"B","v":2}"#),
        // Only the old key: `body` is unknown here, the sink keeps its own.
        (Some(&key_old), &["body"], r#"{"id":1,"v":2}"#),
        (None, &["body"], r#"{"id":1,"v":2}"#),
    ];
    for (old, unchanged, document) in cases {
        let c = Change { relation: Some(&rel), unchanged: &[1], ..change('U', Some(&new), old) };
        let batches = transaction(&mut TransactionBuilder::new(), 0x10, &[c]);
        let e = &batches[0].envelopes;
        assert_eq!(e.len(), 1, "{old:?}");
        assert_eq!(e[0].unchanged, unchanged, "{old:?}");
        assert_eq!(doc(&e[0]), document, "{old:?}");
        assert_eq!(e[0].is_partial(), !unchanged.is_empty());
    }
}

#[test]
fn chunks_count_changes_not_envelopes_so_a_key_change_is_never_split_between_chunks() {
    let (i1, u_new, u_old, d) = ([col("id", "1")], [col("id", "2")], [col("id", "3")], [col("id", "1")]);
    let changes = [
        change('I', Some(&i1), None),
        change('U', Some(&u_new), Some(&u_old)),
        change('D', None, Some(&d)),
        Change { pk: None, ..change('T', None, None) },
    ];
    let mut b = TransactionBuilder::new().with_max_batch_changes(Some(1));
    let batches = transaction(&mut b, 0x30, &changes);
    let p = Some(Position(0x30));
    let shape: Vec<_> = batches
        .iter()
        .map(|b| {
            let ids: Vec<_> = b.envelopes.iter().map(|e| (e.op, e.id.as_str())).collect();
            (b.position, b.changes, b.offset, ids)
        })
        .collect();
    assert_eq!(
        shape,
        [
            (None, 1, 0, vec![(Op::Upsert, "1")]),
            (None, 1, 1, vec![(Op::Upsert, "2"), (Op::Delete, "3")]),
            (None, 1, 3, vec![(Op::Delete, "1")]),
            (None, 1, 4, vec![(Op::Truncate, "")]),
            (p, 0, 5, vec![]),
        ]
    );
    assert!(batches.iter().flat_map(|b| b.envelopes.iter()).all(|e| e.position == p));
    // 0 means no chunks: one positioned batch.
    let mut b = TransactionBuilder::new().with_max_batch_changes(Some(0));
    let batches = transaction(&mut b, 0x30, &changes);
    assert_eq!(
        batches.iter().map(|b| (b.position, b.changes, b.envelopes.len())).collect::<Vec<_>>(),
        [(p, 4, 5)]
    );
}

#[test]
fn every_refused_commit_discards_its_transaction_and_the_builder_goes_on() {
    let row = [col("id", "1")];
    type Check = fn(&BuildErrorKind) -> bool;
    let cases: [(Commit<'static>, Check); 5] = [
        (at(u64::MAX), |k| matches!(k, BuildErrorKind::BadLsn(e) if e.0 == "FFFFFFFF/FFFFFFFF")),
        (
            at(0x10),
            |k| matches!(k, BuildErrorKind::LsnRegressed { lsn, previous } if *lsn == Position(0x10) && *previous == Position(0x10)),
        ),
        (Commit { xid: Ok(Some(8)), ..at(0x20) }, |k| {
            matches!(k, BuildErrorKind::XidMismatch { begin: 7, commit: 8 })
        }),
        (
            Commit { xid: Err(BuildErrorKind::WrongType { field: "xid", expected: "a number" }), ..at(0x20) },
            |k| matches!(k, BuildErrorKind::WrongType { field: "xid", .. }),
        ),
        (
            Commit {
                position: Err(BuildErrorKind::MissingField { action: 'C', field: "lsn", hint: "" }),
                ..at(0)
            },
            |k| matches!(k, BuildErrorKind::MissingField { action: 'C', field: "lsn", .. }),
        ),
    ];
    for (n, (commit, check)) in cases.into_iter().enumerate() {
        let mut b = TransactionBuilder::new();
        transaction(&mut b, 0x10, &[change('I', Some(&row), None)]);
        b.push_begin(10, Some(7), Some(Position(0x20))).expect("begin");
        for seq in [11, 12] {
            assert!(b.push_change(seq, &change('I', Some(&row), None)).expect("change").is_none());
        }
        let e = b.push_commit(13, commit).expect_err("refused");
        assert!(check(e.kind()), "case {n}: {e}");
        assert_eq!((e.record(), e.lost_changes()), (13, 2), "case {n}");
        assert!(e.open_transaction_discarded() && e.is_recoverable(), "case {n}");
        assert_eq!((b.open_since(), b.last_commit(), b.transactions()), (None, Some(Position(0x10)), 1));
        // Nothing of it lingers: the next transaction holds only its own change.
        let next = transaction(&mut b, 0x40, &[change('I', Some(&row), None)]);
        assert_eq!((next[0].position, next[0].changes), (Some(Position(0x40)), 1), "case {n}");
    }
}

#[test]
fn a_begin_inside_a_transaction_discards_the_open_one_and_the_new_one_is_not_damaged_by_it() {
    let row = [col("id", "1")];
    let mut b = TransactionBuilder::new();
    b.push_begin(1, Some(1), Some(Position(0x10))).expect("begin");
    b.push_change(2, &change('I', Some(&row), None)).expect("change");
    b.push_change(3, &change('I', Some(&row), None)).expect("change");
    let e = b.push_begin(4, Some(2), Some(Position(0x20))).expect_err("its commit was lost");
    assert!(matches!(e.kind(), BuildErrorKind::BeginInsideTransaction { begun: 1, dropped: 2 }), "{e}");
    assert_eq!(e.lost_changes(), 2);
    assert_eq!(b.open_since(), Some(4));
    b.push_change(5, &change('I', Some(&row), None)).expect("change");
    let batch = b.push_commit(6, at(0x20)).expect("the new one commits").expect("a batch");
    assert_eq!((batch.position, batch.changes, batch.envelopes.len()), (Some(Position(0x20)), 1, 1));
}

#[test]
fn records_outside_a_transaction_are_refused_without_loss_and_an_open_one_is_truncated_at_the_end() {
    let row = [col("id", "1")];
    let mut b = TransactionBuilder::new();
    let e = b.push_change(1, &change('D', None, Some(&row))).expect_err("no begin");
    assert!(matches!(e.kind(), BuildErrorKind::OutsideTransaction { action: 'D' }), "{e}");
    let e = b.push_commit(2, at(0x10)).expect_err("no begin");
    assert!(matches!(e.kind(), BuildErrorKind::OutsideTransaction { action: 'C' }), "{e}");
    assert!(!e.open_transaction_discarded() && e.lost_changes() == 0);
    assert_eq!((b.last_commit(), b.transactions()), (None, 0));
    b.finish(2).expect("nothing open");
    b.push_begin(3, None, None).expect("begin");
    b.push_change(4, &change('I', Some(&row), None)).expect("change");
    let e = b.finish(4).expect_err("left open");
    assert!(matches!(e.kind(), BuildErrorKind::Truncated { begun: 3 }), "{e}");
    assert!(e.open_transaction_discarded());
    assert_eq!(b.open_since(), None);
    b.finish(4).expect("it was discarded");
}

#[test]
fn a_change_without_the_row_its_action_needs_is_refused_and_damages_its_transaction() {
    let row = [col("id", "1")];
    let cases = [
        (change('D', Some(&row), None), 'D', "identity"),
        (change('I', None, Some(&row)), 'I', "columns"),
        (change('U', None, Some(&row)), 'U', "columns"),
    ];
    for (c, action, field) in cases {
        let mut b = TransactionBuilder::new();
        b.push_begin(1, None, Some(Position(0x10))).expect("begin");
        b.push_change(2, &change('I', Some(&row), None)).expect("a good change first");
        let e = b.push_change(3, &c).expect_err("refused");
        assert!(
            matches!(e.kind(), BuildErrorKind::MissingField { action: a, field: f, .. } if *a == action && *f == field),
            "{e}"
        );
        let e = b.push_commit(4, at(0x10)).expect_err("damaged");
        assert!(
            matches!(e.kind(), BuildErrorKind::DamagedTransaction { begun: 1, first_bad: 3, bad_lines: 1, changes: 1, lsn, .. } if lsn == "0/10"),
            "{e}"
        );
        assert_eq!(e.lost_changes(), 2);
    }
}

#[test]
fn a_null_key_names_the_changes_lsn_else_its_transactions_else_unknown() {
    let row = [col("id", "null")];
    let cases = [
        (Some(r#""0/AB""#), Some(Position(0x1_0000_00CD)), "0/AB"),
        (None, Some(Position(0x1_0000_00CD)), "1/CD"),
        (None, None, "unknown"),
    ];
    for (lsn, begin, named) in cases {
        let mut b = TransactionBuilder::new();
        b.push_begin(1, None, begin).expect("begin");
        let e = b.push_change(2, &Change { lsn, ..change('I', Some(&row), None) }).expect_err("null key");
        assert!(
            matches!(e.kind(), BuildErrorKind::NullKey { table, column, lsn } if table == "public.t" && column == "id" && lsn == named),
            "{e}"
        );
    }
}

#[test]
fn the_relation_an_envelope_carries_names_the_columns_its_id_was_built_from() {
    let rel = shape(&[("id", 23), ("name", 25), ("code", 25)], &[0]);
    let row = [col("id", "1"), col("name", r#""n""#), col("code", r#""c""#)];
    let keyed = |b: &mut TransactionBuilder, pk: Option<&'static [Key<'static>]>| {
        let c = Change { pk, relation: Some(&rel), ..change('I', Some(&row), None) };
        let batches = transaction(b, 0x10, &[c, c]);
        batches[0]
            .envelopes
            .iter()
            .map(|e| (e.id.clone(), e.relation.clone().expect("a shape")))
            .collect::<Vec<_>>()
    };
    // The decoder's key: its own Arc, untouched.
    let got = keyed(&mut TransactionBuilder::new(), Some(&ID));
    assert_eq!(got[0].0, "1");
    assert!(Arc::ptr_eq(&got[0].1, &rel));
    // Key columns given to the builder, in their own order: a relation keyed so, made once.
    let mut b = TransactionBuilder::new();
    b.set_key_columns("public", "t", Some(vec!["code".into(), "id".into()]));
    let got = keyed(&mut b, Some(&ID));
    assert_eq!(got[0].0, "c:1");
    assert_eq!(got[0].1.key, [2, 0]);
    assert_eq!(got[0].1.columns, rel.columns);
    assert!(Arc::ptr_eq(&got[0].1, &got[1].1), "one relation for both changes");
    assert_eq!(rel.key, [0], "the decoder's relation is not changed");
    // No key at all: every column makes the id, and the relation names no key column.
    let got = keyed(&mut TransactionBuilder::new(), Some(&[]));
    assert_eq!(got[0].0, "1:n:c");
    assert!(got[0].1.key.is_empty());
}

#[test]
fn a_snapshot_row_gets_the_id_and_document_a_change_of_the_same_row_gets() {
    let row = [col("id", "1"), col("code", r#""a:b\\c""#), col("n", "null")];
    let key = ["code".to_owned(), "id".to_owned()];
    let mut docs = b"earlier".to_vec();
    let (id, range) = snapshot_row(&row, &key, &mut docs).expect("keyed");
    let mut b = TransactionBuilder::new();
    b.set_key_columns("public", "t", Some(key.to_vec()));
    let batches = transaction(&mut b, 0x10, &[change('I', Some(&row), None)]);
    let e = &batches[0].envelopes[0];
    assert_eq!(id, e.id);
    assert_eq!(id, r"a\:b\\c:1");
    assert_eq!(&docs[range.clone()], &e.document[..]);
    assert_eq!(&docs[..range.start], b"earlier", "appended after what the buffer held");
    // And it fails as a change does.
    let missing = ["nope".to_owned()];
    assert!(matches!(
        snapshot_row(&row, &missing, &mut docs),
        Err(BuildErrorKind::MissingKeyColumn { column, side: "columns" }) if column == "nope"
    ));
    let null = ["n".to_owned()];
    assert!(
        matches!(snapshot_row(&row, &null, &mut docs), Err(BuildErrorKind::NullKey { column, .. }) if column == "n")
    );
}

#[test]
fn decode_id_refuses_what_no_key_encodes() {
    let cases: [(&str, usize, &str); 5] = [
        (r"a:\N", 2, "holds a NULL"),
        (r"a\x", 1, "backslash before"),
        ("a\\", 1, "backslash before"),
        ("a:b:c", 2, "has 3 key values"),
        ("a", 2, "has 1 key values"),
    ];
    for (id, columns, why) in cases {
        let e = decode_id(id, columns).expect_err(id);
        assert!(e.contains(why), "{id:?}: {e}");
    }
    // An empty id is one empty value.
    assert_eq!(decode_id("", 1), Ok(vec![String::new()]));
}

proptest::proptest! {
    /// Ids of string keys decode back to their values: the encoding is one-to-one, whatever the
    /// values hold of its escapes.
    #[test]
    fn string_key_ids_decode_back_to_their_values(values in proptest::collection::vec("[ab:\\\\N]{0,5}|.{0,8}", 1..4)) {
        let texts: Vec<String> = values.iter().map(|v| serde_json::to_string(v).unwrap_or_default()).collect();
        let names: Vec<String> = (0..values.len()).map(|i| format!("k{i}")).collect();
        let row: Vec<Column<'_>> = names.iter().zip(&texts).map(|(n, t)| col(n, t)).collect();
        let (id, _) = snapshot_row(&row, &names, &mut Vec::new()).expect("keyed");
        proptest::prop_assert_eq!(decode_id(&id, values.len()), Ok(values));
    }
}

/// A transaction whose begin gave no LSN is held whole. (Before, its chunks went out with
/// unpositioned envelopes, read as snapshot batches, and the sink state refused the
/// transaction's last batch: `ChunkGap`.)
#[test]
fn chunks_of_a_transaction_whose_begin_gave_no_lsn_are_never_taken_for_snapshot_rows() {
    let row = [col("id", "1")];
    let mut b = TransactionBuilder::new().with_max_batch_changes(Some(1));
    b.push_begin(1, None, None).expect("begin");
    let mut batches = Vec::new();
    for seq in [2, 3] {
        batches.extend(b.push_change(seq, &change('I', Some(&row), None)).expect("change"));
    }
    batches.extend(b.push_commit(4, at(0x10)).expect("commit"));
    let mut state = lanestream::pipeline::SinkState::new();
    for batch in batches {
        assert_ne!(batch.kind(), lanestream::BatchKind::Snapshot, "{batch:?}");
        let item = lanestream::LaneItem::Batch(batch);
        state.uncovered(&item).expect("the sink state takes the transaction's batches in order");
        state.advance(&item);
    }
    assert_eq!(state.position, Some(Position(0x10)));
}
