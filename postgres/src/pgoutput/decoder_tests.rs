//! The decoder's edge cases, message by message: old tuples (`K`, `O`) and unchanged TOAST values
//! (`u`), truncates of several relations, the shapes Relation and Type messages give, and every
//! way a message can be malformed (the messages are built by the helpers of `tests.rs`).

use std::sync::Arc;

use lanestream::{Op, Position};

use super::tests::{
    begin, commit, decoder, delete, doc, insert, kind_of, relation, run, tuple, update, users, INT4, TEXT,
};
use super::*;
use crate::batch::{BuildErrorKind, CatalogKey, KeyLookup, TransactionBuilder};

/// `public.docs (id int4 key, title text, body text)` under `identity`.
fn docs(identity: u8) -> Vec<u8> {
    let key = identity != b'f';
    relation(
        3,
        "public",
        "docs",
        identity,
        &[(true, "id", INT4), (!key, "title", TEXT), (!key, "body", TEXT)],
    )
}

const UNCHANGED: Option<&str> = Some("\u{0}u");

/// (op, id, old_id, unchanged, document) of an envelope.
type Seen = (Op, String, Option<String>, Vec<String>, String);

/// [`Seen`] of every envelope.
fn seen(batches: &[lanestream::Batch]) -> Vec<Seen> {
    batches
        .iter()
        .flat_map(|b| b.envelopes.iter())
        .map(|e| (e.op, e.id.clone(), e.old_id.clone(), e.unchanged.clone(), doc(e).to_owned()))
        .collect()
}

fn s(x: &str) -> String {
    x.to_owned()
}

#[test]
fn an_old_key_or_row_moves_the_row_only_when_it_gives_another_id() {
    let mut d = decoder();
    let batches = run(
        &mut d,
        &[
            begin(0x10, 1),
            users(),
            // The old key (K) of the same id: one upsert.
            update(1, Some((b'K', &[Some("1"), None])), &[Some("1"), Some("Ann")]),
            // REPLICA IDENTITY FULL of a table without a key: every column is the id, so an old
            // row (O) with other values moves the row.
            relation(5, "public", "pairs", b'f', &[(true, "a", INT4), (true, "b", TEXT)]),
            update(5, Some((b'O', &[Some("1"), Some("one")])), &[Some("1"), Some("uno")]),
            commit(0x10),
        ],
    )
    .expect("decodes");
    assert_eq!(batches[0].changes, 2);
    assert_eq!(
        seen(&batches),
        [
            (Op::Upsert, s("1"), None, vec![], s(r#"{"id":1,"name":"Ann"}"#)),
            (Op::Upsert, s("1:uno"), Some(s("1:one")), vec![], s(r#"{"a":1,"b":"uno"}"#)),
            (Op::Delete, s("1:one"), None, vec![], s(r#"{"a":1,"b":"one"}"#)),
        ]
    );
}

#[test]
fn unchanged_toast_values_are_named_on_the_upsert_unless_an_old_row_holds_them() {
    let lookup: KeyLookup = Box::new(|_, _| Ok(Some(CatalogKey::PrimaryKey(vec!["id".into()]))));
    let mut d = PgOutputDecoder::new(TransactionBuilder::new().with_key_lookup(lookup));
    let batches = run(
        &mut d,
        &[
            begin(0x10, 1),
            docs(b'd'),
            update(3, None, &[Some("1"), Some("t"), UNCHANGED]),
            // A key change: the upsert names the old id and the unchanged column, the delete
            // neither.
            update(3, Some((b'K', &[Some("1"), None, None])), &[Some("2"), UNCHANGED, UNCHANGED]),
            // FULL: the old row holds the value, so the new row is whole.
            docs(b'f'),
            update(3, Some((b'O', &[Some("2"), Some("T"), Some("B")])), &[Some("2"), Some("t2"), UNCHANGED]),
            commit(0x10),
        ],
    )
    .expect("decodes");
    assert_eq!(
        seen(&batches),
        [
            (Op::Upsert, s("1"), None, vec![s("body")], s(r#"{"id":1,"title":"t"}"#)),
            (Op::Upsert, s("2"), Some(s("1")), vec![s("title"), s("body")], s(r#"{"id":2}"#)),
            (Op::Delete, s("1"), None, vec![], s(r#"{"id":1}"#)),
            (Op::Upsert, s("2"), None, vec![], s(r#"{"id":2,"title":"t2","body":"B"}"#)),
        ]
    );
}

/// A Truncate message of `oids` with its options byte (1: CASCADE, 2: RESTART IDENTITY).
fn truncate_with(oids: &[u32], options: u8) -> Vec<u8> {
    let mut m = vec![b'T'];
    m.extend((oids.len() as u32).to_be_bytes());
    m.push(options);
    for o in oids {
        m.extend(o.to_be_bytes());
    }
    m
}

fn items() -> Vec<u8> {
    relation(2, "shop", "items", b'd', &[(true, "sku", TEXT)])
}

#[test]
fn a_truncate_of_several_relations_is_one_change_per_relation_whatever_its_options() {
    for options in [0, 1, 2, 3] {
        let mut d = decoder();
        let batches =
            run(&mut d, &[begin(0x10, 1), users(), items(), truncate_with(&[2, 1], options), commit(0x10)])
                .expect("decodes");
        assert_eq!(batches[0].changes, 2);
        let e = &batches[0].envelopes;
        let got: Vec<_> =
            e.iter().map(|e| (e.op, e.index.as_str(), e.id.as_str(), e.document.len())).collect();
        assert_eq!(got, [(Op::Truncate, "shop_items", "", 0), (Op::Truncate, "public_users", "", 0)]);
        let names: Vec<_> = e.iter().map(|e| e.relation.as_ref().map(|r| r.name.as_str())).collect();
        assert_eq!(names, [Some("items"), Some("users")]);
    }
}

#[test]
fn a_truncate_naming_an_unknown_relation_publishes_none_of_its_truncates() {
    let mut d = decoder();
    run(&mut d, &[begin(0x10, 1), users()]).expect("fine so far");
    let e = d.decode(&truncate_with(&[1, 99], 0)).expect_err("99 is unknown");
    assert!(matches!(e.kind(), PgOutputErrorKind::UnknownRelation(99)), "{e}");
    let e = d.decode(&commit(0x10)).expect_err("damaged");
    assert!(
        matches!(e.kind(), PgOutputErrorKind::Build(BuildErrorKind::DamagedTransaction { bad_lines: 1, .. })),
        "{e}"
    );
}

#[test]
fn chunks_filled_inside_one_truncate_come_out_as_one_batch_and_offsets_go_on_after_it() {
    let mut d = PgOutputDecoder::new(TransactionBuilder::new().with_max_batch_changes(Some(1)));
    let batches = run(
        &mut d,
        &[begin(0x10, 1), users(), items(), truncate_with(&[1, 2], 0), insert(2, &[Some("x")]), commit(0x10)],
    )
    .expect("decodes");
    let shape: Vec<_> = batches
        .iter()
        .map(|b| {
            let indexes: Vec<_> = b.envelopes.iter().map(|e| e.index.as_str()).collect();
            (b.position, b.changes, b.offset, indexes)
        })
        .collect();
    assert_eq!(
        shape,
        [
            (None, 2, 0, vec!["public_users", "shop_items"]),
            (None, 1, 2, vec!["shop_items"]),
            (Some(Position(0x10)), 0, 3, vec![]),
        ]
    );
}

/// A Relation message (`REPLICA IDENTITY DEFAULT`) whose columns carry type modifiers: (key,
/// name, type OID, typmod).
fn typed_relation(oid: u32, schema: &str, table: &str, columns: &[(bool, &str, u32, i32)]) -> Vec<u8> {
    let mut m = vec![b'R'];
    m.extend(oid.to_be_bytes());
    for s in [schema, table] {
        m.extend(s.as_bytes());
        m.push(0);
    }
    m.push(b'd');
    m.extend((columns.len() as u16).to_be_bytes());
    for &(key, name, type_oid, typmod) in columns {
        m.push(u8::from(key));
        m.extend(name.as_bytes());
        m.push(0);
        m.extend(type_oid.to_be_bytes());
        m.extend(typmod.to_be_bytes());
    }
    m
}

/// A Type message.
fn type_message(oid: u32, schema: &str, name: &str) -> Vec<u8> {
    let mut m = vec![b'Y'];
    m.extend(oid.to_be_bytes());
    for s in [schema, name] {
        m.extend(s.as_bytes());
        m.push(0);
    }
    m
}

#[test]
fn a_relation_message_gives_its_changes_one_typed_shape_named_by_the_type_messages_before_it() {
    let columns = [
        (true, "id", INT4, -1),
        (false, "name", 1043, 4 + 10), // varchar(10)
        (false, "mood", 16_400, -1),
        (false, "tag", 16_401, -1),
        (false, "other", 16_402, -1),
        (true, "at", 1184, 3), // timestamptz(3)
    ];
    let row = [Some("1"), Some("n"), Some("happy"), Some("t"), Some("o"), Some("2024-01-01 00:00:00+00")];
    let mut d = decoder();
    let batches = run(
        &mut d,
        &[
            type_message(16_400, "app", "mood"),
            type_message(16_401, "public", "tag"),
            begin(0x10, 1),
            // pgoutput writes pg_catalog's namespace empty.
            typed_relation(7, "", "t", &columns),
            insert(7, &row),
            insert(7, &row),
            typed_relation(7, "", "t", &columns[..5]),
            insert(7, &row[..5]),
            commit(0x10),
        ],
    )
    .expect("decodes");
    let e = &batches[0].envelopes;
    let rel = e[0].relation.clone().expect("a shape");
    assert_eq!((rel.id, rel.namespace.as_str(), rel.name.as_str()), (7, "pg_catalog", "t"));
    assert_eq!(e[0].index.as_str(), "pg_catalog_t");
    let types: Vec<_> = rel
        .columns
        .iter()
        .map(|c| (c.name.as_str(), c.type_id, c.type_name.as_str(), c.type_modifier))
        .collect();
    assert_eq!(
        types,
        [
            ("id", INT4, "int4", -1),
            ("name", 1043, "varchar", 14),
            ("mood", 16_400, "app.mood", -1),
            ("tag", 16_401, "tag", -1),
            ("other", 16_402, "", -1),
            ("at", 1184, "timestamptz", 3),
        ]
    );
    assert_eq!(rel.key, [0, 5]);
    // The key's text value has its `:` escaped in the id.
    assert_eq!(e[0].id, r"1:2024-01-01 00\:00\:00+00");
    // Values of types the codec does not know are their text.
    assert!(doc(&e[0]).contains(r#""mood":"happy""#), "{}", doc(&e[0]));
    // One Arc per Relation message: shared by its changes, a new one after the next.
    let third = e[2].relation.clone().expect("a shape");
    assert!(Arc::ptr_eq(&rel, e[1].relation.as_ref().expect("a shape")));
    assert!(!Arc::ptr_eq(&rel, &third));
    assert_eq!((third.columns.len(), third.key.as_slice()), (5, &[0u16][..]));
}

/// One well-formed message of each kind that a decoder knowing [`users`] reads outside a
/// transaction, or whose prefixes it would (the Begin and Commit are never decoded whole).
fn one_of_each() -> Vec<Vec<u8>> {
    let mut origin = vec![b'O'];
    origin.extend(5u64.to_be_bytes());
    origin.extend(b"upstream\0");
    let mut message = vec![b'M', 1];
    message.extend(7u64.to_be_bytes());
    message.extend(b"p\0");
    message.extend(3u32.to_be_bytes());
    message.extend(b"abc");
    vec![
        begin(0x10, 1),
        commit(0x10),
        users(),
        type_message(16_400, "app", "mood"),
        origin,
        message,
        insert(1, &[Some("1"), None]),
        update(1, Some((b'K', &[Some("1"), None])), &[Some("2"), UNCHANGED]),
        delete(1, b'O', &[Some("2"), Some("Ann")]),
        truncate_with(&[1, 1], 0),
    ]
}

#[test]
fn every_message_cut_short_is_truncated_naming_its_tag_and_the_field_it_ends_in() {
    let mut d = decoder();
    for m in one_of_each() {
        for len in 1..m.len() {
            // A cut Relation message forgets the relations: learn them again each time.
            d.decode(&users()).expect("relation");
            let cut = &m[..len];
            match kind_of(d.decode(cut)) {
                PgOutputErrorKind::Truncated { tag, at, len: l, field } => {
                    assert_eq!((tag, l), (m[0] as char, len), "{m:?} cut at {len}: {field}");
                    assert!(at <= len, "{m:?} cut at {len}: {field} at {at}");
                }
                other => panic!("{m:?} cut at {len}: {other}"),
            }
        }
        assert!(!d.in_transaction(), "no cut message opened a transaction");
    }
    // Where: the field the message ends in, and the byte it starts at.
    let ins = insert(1, &[Some("1"), Some("Ann")]);
    let cases: [(&[u8], &str, usize); 4] = [
        (&begin(0x10, 1)[..19], "xid", 17),
        (&commit(0x10)[..12], "end LSN", 10),
        (&ins[..21], "value", 19),
        (&ins[..14], "column's value kind", 14),
    ];
    for (cut, field, at) in cases {
        assert!(
            matches!(kind_of(d.decode(cut)), PgOutputErrorKind::Truncated { field: f, at: a, .. } if f == field && a == at),
            "{field}"
        );
    }
}

#[test]
fn every_message_with_bytes_after_its_last_field_is_refused() {
    let mut d = decoder();
    for mut m in one_of_each() {
        d.decode(&users()).expect("relation");
        m.extend(b"xy");
        assert!(
            matches!(kind_of(d.decode(&m)), PgOutputErrorKind::TrailingBytes { tag, extra: 2 } if tag == m[0] as char),
            "{m:?}"
        );
        assert!(!d.in_transaction());
    }
}

#[test]
fn every_tag_is_a_message_version_1_reads_a_later_versions_or_unknown() {
    // A tag alone: too short for every message of version 1.
    for tag in 0..=u8::MAX {
        let mut d = decoder();
        let kind = kind_of(d.decode(&[tag]));
        match tag {
            b'B' | b'C' | b'R' | b'Y' | b'O' | b'M' | b'I' | b'U' | b'D' | b'T' => {
                assert!(
                    matches!(kind, PgOutputErrorKind::Truncated { tag: t, at: 1, .. } if t == tag as char),
                    "{kind}"
                )
            }
            b'S' | b'E' | b'c' | b'A' | b'b' | b'P' | b'K' | b'r' | b'p' => {
                assert!(
                    matches!(kind, PgOutputErrorKind::UnsupportedMessage(t) if t == tag as char),
                    "{kind}"
                );
                assert!(kind.to_string().contains("proto_version '1'"), "{kind}");
            }
            _ => assert!(matches!(kind, PgOutputErrorKind::UnknownMessage(t) if t == tag), "{kind}"),
        }
    }
}

#[test]
fn malformed_tuples_and_fields_are_refused_by_name() {
    let mut update_cut_marker = vec![b'U'];
    update_cut_marker.extend(1u32.to_be_bytes());
    update_cut_marker.push(b'K');
    tuple(&mut update_cut_marker, &[Some("1"), None]);
    update_cut_marker.push(b'K');
    tuple(&mut update_cut_marker, &[Some("2"), None]);
    let mut negative_value = insert(1, &[Some("1"), Some("x")]);
    let at = negative_value.len() - 5;
    negative_value[at..at + 4].copy_from_slice(&(-1i32).to_be_bytes());
    let mut negative_columns = users();
    let at = 1 + 4 + b"public\0users\0".len() + 1;
    negative_columns[at..at + 2].copy_from_slice(&(-1i16).to_be_bytes());
    let mut negative_tuple = insert(1, &[]);
    let at = negative_tuple.len() - 2;
    negative_tuple[at..].copy_from_slice(&(-3i16).to_be_bytes());
    let mut not_utf8 = insert(1, &[Some("1"), Some("x")]);
    *not_utf8.last_mut().expect("a byte") = 0xff;
    let mut bad_column_name = users();
    let at = bad_column_name.windows(5).position(|w| w == b"name\0").expect("the column");
    bad_column_name[at] = 0xff;
    type Check = fn(&PgOutputErrorKind) -> bool;
    let cases: [(Vec<u8>, Check); 10] = [
        (update(1, Some((b'X', &[Some("1"), None])), &[Some("1"), None]), |k| {
            matches!(k, PgOutputErrorKind::BadTupleMarker { tag: 'U', marker: b'X' })
        }),
        (update_cut_marker, |k| matches!(k, PgOutputErrorKind::BadTupleMarker { tag: 'U', marker: b'K' })),
        (delete(1, b'N', &[Some("1"), None]), |k| {
            matches!(k, PgOutputErrorKind::BadTupleMarker { tag: 'D', marker: b'N' })
        }),
        (
            insert(1, &[Some("1"), None, None]),
            |k| matches!(k, PgOutputErrorKind::ColumnCount { table, expected: 2, got: 3 } if table == "public.users"),
        ),
        (update(1, Some((b'O', &[Some("1")])), &[Some("1"), None]), |k| {
            matches!(k, PgOutputErrorKind::ColumnCount { expected: 2, got: 1, .. })
        }),
        (negative_value, |k| matches!(k, PgOutputErrorKind::Negative { field: "value's length", value: -1 })),
        (negative_columns, |k| matches!(k, PgOutputErrorKind::Negative { field: "column count", value: -1 })),
        (negative_tuple, |k| {
            matches!(k, PgOutputErrorKind::Negative { field: "tuple's column count", value: -3 })
        }),
        (not_utf8, |k| matches!(k, PgOutputErrorKind::NotUtf8 { field: "value" })),
        (bad_column_name, |k| matches!(k, PgOutputErrorKind::NotUtf8 { field: "column name" })),
    ];
    let mut d = decoder();
    for (n, (m, check)) in cases.into_iter().enumerate() {
        d.decode(&users()).expect("relation");
        let kind = kind_of(d.decode(&m));
        assert!(check(&kind), "case {n}: {kind}");
    }
}

#[test]
fn a_null_key_value_fails_naming_the_transactions_commit_lsn() {
    let mut d = decoder();
    run(&mut d, &[begin(0x1_0000_0010, 1), users()]).expect("fine so far");
    let e = d.decode(&insert(1, &[None, Some("Ann")])).expect_err("a NULL key");
    assert!(
        matches!(e.kind(), PgOutputErrorKind::Build(BuildErrorKind::NullKey { table, column, lsn })
            if table == "public.users" && column == "id" && lsn == "1/10"),
        "{e}"
    );
}

#[test]
fn a_skipped_transaction_publishes_none_of_its_changes_and_an_input_ending_inside_it_loses_nothing() {
    let mut d = decoder();
    d.resume_after(Some(Position(0x30)));
    let batches = run(
        &mut d,
        &[
            users(),
            begin(0x30, 1),
            insert(1, &[Some("1"), Some("Ann")]),
            update(1, Some((b'K', &[Some("1"), None])), &[Some("2"), Some("Ann")]),
            delete(1, b'K', &[Some("2"), None]),
            truncate_with(&[1], 0),
            commit(0x30),
            begin(0x31, 2),
            insert(1, &[Some("3"), Some("Cy")]),
            commit(0x31),
            begin(0x20, 3),
        ],
    )
    .expect("decodes");
    assert_eq!(ops_of(&batches), [(Some(Position(0x31)), Op::Upsert, s("3"))]);
    assert!(d.in_transaction(), "inside a skipped transaction");
    assert_eq!(d.skipped_transactions(), 1, "counted at its commit");
    d.finish().expect("a skipped transaction is no loss");
    assert!(!d.in_transaction());
}

fn ops_of(batches: &[lanestream::Batch]) -> Vec<(Option<Position>, Op, String)> {
    batches.iter().flat_map(|b| b.envelopes.iter()).map(|e| (e.position, e.op, e.id.clone())).collect()
}
