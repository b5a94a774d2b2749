use lanestream::{Batch, Position};

use super::decoder::PG_EPOCH_UNIX_MICROS;
use super::*;
use crate::batch::TransactionBuilder;

use lanestream::Op;

use crate::batch::BuildErrorKind;
use crate::wal2json::Wal2JsonReader;

// --- messages built by hand (the protocol's layout, protocol version 1) -----------------------

pub(super) fn begin(lsn: u64, xid: u32) -> Vec<u8> {
    let mut m = vec![b'B'];
    m.extend(lsn.to_be_bytes());
    m.extend(0i64.to_be_bytes());
    m.extend(xid.to_be_bytes());
    m
}

pub(super) fn commit(lsn: u64) -> Vec<u8> {
    let mut m = vec![b'C', 0];
    m.extend(lsn.to_be_bytes());
    m.extend((lsn + 0x30).to_be_bytes());
    m.extend(0i64.to_be_bytes());
    m
}

/// A Relation message: `columns` as (key flag, name, type OID).
pub(super) fn relation(
    oid: u32,
    schema: &str,
    table: &str,
    identity: u8,
    columns: &[(bool, &str, u32)],
) -> Vec<u8> {
    let mut m = vec![b'R'];
    m.extend(oid.to_be_bytes());
    for s in [schema, table] {
        m.extend(s.as_bytes());
        m.push(0);
    }
    m.push(identity);
    m.extend((columns.len() as u16).to_be_bytes());
    for (key, name, type_oid) in columns {
        m.push(u8::from(*key));
        m.extend(name.as_bytes());
        m.push(0);
        m.extend(type_oid.to_be_bytes());
        m.extend((-1i32).to_be_bytes());
    }
    m
}

/// A tuple: `Some(text)` a text value, `None` NULL, `Some("\u{0}u")` an unchanged TOAST value.
pub(super) fn tuple(m: &mut Vec<u8>, values: &[Option<&str>]) {
    m.extend((values.len() as u16).to_be_bytes());
    for v in values {
        match v {
            None => m.push(b'n'),
            Some("\u{0}u") => m.push(b'u'),
            Some(t) => {
                m.push(b't');
                m.extend((t.len() as u32).to_be_bytes());
                m.extend(t.as_bytes());
            }
        }
    }
}

pub(super) fn insert(oid: u32, values: &[Option<&str>]) -> Vec<u8> {
    let mut m = vec![b'I'];
    m.extend(oid.to_be_bytes());
    m.push(b'N');
    tuple(&mut m, values);
    m
}

pub(super) fn update(oid: u32, old: Option<(u8, &[Option<&str>])>, new: &[Option<&str>]) -> Vec<u8> {
    let mut m = vec![b'U'];
    m.extend(oid.to_be_bytes());
    if let Some((marker, old)) = old {
        m.push(marker);
        tuple(&mut m, old);
    }
    m.push(b'N');
    tuple(&mut m, new);
    m
}

pub(super) fn delete(oid: u32, marker: u8, old: &[Option<&str>]) -> Vec<u8> {
    let mut m = vec![b'D'];
    m.extend(oid.to_be_bytes());
    m.push(marker);
    tuple(&mut m, old);
    m
}

pub(super) fn truncate(oids: &[u32]) -> Vec<u8> {
    let mut m = vec![b'T'];
    m.extend((oids.len() as u32).to_be_bytes());
    m.push(0);
    for o in oids {
        m.extend(o.to_be_bytes());
    }
    m
}

pub(super) const INT4: u32 = 23;
pub(super) const TEXT: u32 = 25;

pub(super) fn users() -> Vec<u8> {
    relation(1, "public", "users", b'd', &[(true, "id", INT4), (false, "name", TEXT)])
}

pub(super) fn run(d: &mut PgOutputDecoder, messages: &[Vec<u8>]) -> Result<Vec<Batch>, PgOutputError> {
    let mut out = Vec::new();
    for m in messages {
        if let Some(b) = d.decode(m)? {
            out.push(b);
        }
    }
    Ok(out)
}

pub(super) fn decoder() -> PgOutputDecoder {
    PgOutputDecoder::new(TransactionBuilder::new())
}

pub(super) fn doc(e: &lanestream::Envelope) -> &str {
    std::str::from_utf8(&e.document).expect("utf-8 document")
}

pub(super) fn ops(batches: &[Batch]) -> Vec<(Op, String, String)> {
    batches.iter().flat_map(|b| b.envelopes.iter()).map(|e| (e.op, e.id.clone(), doc(e).to_owned())).collect()
}

// --- the mapping ------------------------------------------------------------------------------

#[test]
fn each_change_maps_as_the_wal2json_reader_maps_it() {
    let mut d = decoder();
    let batches = run(
        &mut d,
        &[
            begin(0x100, 5),
            users(),
            insert(1, &[Some("1"), Some("Ann")]),
            update(1, None, &[Some("1"), Some("Anna")]),
            update(1, Some((b'K', &[Some("1"), None])), &[Some("2"), Some("Anna")]),
            delete(1, b'K', &[Some("2"), None]),
            truncate(&[1]),
            commit(0x100),
        ],
    )
    .expect("decodes");
    assert_eq!(batches.len(), 1);
    let b = &batches[0];
    assert_eq!(b.position, Some(Position(0x100)));
    assert_eq!(b.changes, 5, "the key change is one change of two envelopes");
    assert!(b
        .envelopes
        .iter()
        .all(|e| e.position == Some(Position(0x100)) && e.index.as_str() == "public_users"));
    assert_eq!(
        ops(&batches),
        [
            (Op::Upsert, "1".into(), r#"{"id":1,"name":"Ann"}"#.into()),
            (Op::Upsert, "1".into(), r#"{"id":1,"name":"Anna"}"#.into()),
            (Op::Upsert, "2".into(), r#"{"id":2,"name":"Anna"}"#.into()),
            (Op::Delete, "1".into(), r#"{"id":1}"#.into()),
            (Op::Delete, "2".into(), r#"{"id":2}"#.into()),
            (Op::Truncate, String::new(), String::new()),
        ]
    );
}

#[test]
fn values_are_typed_by_their_column_type_oid() {
    let cols: Vec<(bool, &str, u32)> = vec![
        (true, "id", INT4),
        (false, "i8", 20),
        (false, "i2", 21),
        (false, "o", 26),
        (false, "f4", 700),
        (false, "f8", 701),
        (false, "num", 1700),
        (false, "nan", 1700),
        (false, "inf", 701),
        (false, "b", 16),
        (false, "raw", 17),
        (false, "t", TEXT),
        (false, "j", 3802),
        (false, "nul", TEXT),
    ];
    let mut d = decoder();
    let batches = run(
        &mut d,
        &[
            begin(0x10, 1),
            relation(2, "s", "types", b'd', &cols),
            insert(
                2,
                &[
                    Some("7"),
                    Some("9007199254740993"),
                    Some("-3"),
                    Some("26"),
                    Some("1.5"),
                    Some("1e+300"),
                    Some("12.50"),
                    Some("NaN"),
                    Some("-Infinity"),
                    Some("t"),
                    Some("\\x00ff"),
                    Some("q\"b\\\n\t\u{1}é"),
                    Some("{\"k\": 1}"),
                    None,
                ],
            ),
            commit(0x10),
        ],
    )
    .expect("decodes");
    assert_eq!(
        doc(&batches[0].envelopes[0]),
        r#"{"id":7,"i8":9007199254740993,"i2":-3,"o":26,"f4":1.5,"f8":1e+300,"num":12.50,"nan":"NaN","inf":"-Infinity","b":true,"raw":"00ff","t":"q\"b\\\n\t\u0001é","j":"{\"k\": 1}","nul":null}"#
    );
    let parsed: serde_json::Value =
        serde_json::from_slice(&batches[0].envelopes[0].document).expect("valid JSON");
    assert_eq!(parsed["t"], "q\"b\\\n\t\u{1}é");
}

/// P9: a key holding `NaN`, `Infinity` or `-Infinity` keys one row each, distinct from each
/// other and from the text of a string key (before: the values were `null`, the transaction
/// failed on a NULL key and the pipeline stopped for good).
#[test]
fn p9_nan_and_infinite_keys_are_distinct_values_not_null() {
    let mut d = decoder();
    let batches = run(
        &mut d,
        &[
            begin(0x10, 1),
            relation(3, "s", "m", b'd', &[(true, "k", 1700), (false, "v", TEXT)]),
            insert(3, &[Some("NaN"), Some("a")]),
            insert(3, &[Some("Infinity"), Some("b")]),
            insert(3, &[Some("-Infinity"), Some("c")]),
            insert(3, &[Some("1.5"), None]),
            commit(0x10),
        ],
    )
    .expect("decodes");
    let ids: Vec<&str> = batches[0].envelopes.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["NaN", "Infinity", "-Infinity", "1.5"]);
    assert_eq!(doc(&batches[0].envelopes[0]), r#"{"k":"NaN","v":"a"}"#);
    assert_eq!(doc(&batches[0].envelopes[2]), r#"{"k":"-Infinity","v":"c"}"#);
}

#[test]
fn unchanged_toast_columns_are_left_out_of_an_update() {
    let mut d = decoder();
    let batches = run(
        &mut d,
        &[
            begin(0x10, 1),
            relation(
                3,
                "public",
                "docs",
                b'd',
                &[(true, "id", INT4), (false, "title", TEXT), (false, "body", TEXT)],
            ),
            update(3, None, &[Some("1"), Some("new title"), Some("\u{0}u")]),
            commit(0x10),
        ],
    )
    .expect("decodes");
    assert_eq!(doc(&batches[0].envelopes[0]), r#"{"id":1,"title":"new title"}"#);
}

#[test]
fn keys_follow_the_replica_identity_of_the_relation_message() {
    let mut d = decoder();
    let batches = run(
        &mut d,
        &[
            begin(0x10, 1),
            // USING INDEX on (code): pgoutput flags code, so ids need no catalog.
            relation(4, "public", "by_index", b'i', &[(false, "id", INT4), (true, "code", TEXT)]),
            insert(4, &[Some("1"), Some("a:b")]),
            delete(4, b'K', &[None, Some("a:b")]),
            // FULL: every column flagged; no key look-up here, so every column, as wal2json
            // without a pk.
            relation(5, "public", "full_rows", b'f', &[(true, "a", INT4), (true, "b", TEXT)]),
            insert(5, &[Some("1"), Some("one")]),
            delete(5, b'O', &[Some("1"), Some("one")]),
            // No identity at all: every column.
            relation(6, "public", "no_key", b'd', &[(false, "a", INT4), (false, "b", TEXT)]),
            insert(6, &[Some("1"), None]),
            commit(0x10),
        ],
    )
    .expect("decodes");
    assert_eq!(
        ops(&batches),
        [
            (Op::Upsert, "a\\:b".into(), r#"{"id":1,"code":"a:b"}"#.into()),
            (Op::Delete, "a\\:b".into(), r#"{"code":"a:b"}"#.into()),
            (Op::Upsert, "1:one".into(), r#"{"a":1,"b":"one"}"#.into()),
            (Op::Delete, "1:one".into(), r#"{"a":1,"b":"one"}"#.into()),
            (Op::Upsert, "1:\\N".into(), r#"{"a":1,"b":null}"#.into()),
        ]
    );
}

#[test]
fn a_full_identity_table_with_a_primary_key_is_keyed_by_the_key_lookup() {
    let lookup: crate::batch::KeyLookup =
        Box::new(|_, _| Ok(Some(crate::batch::CatalogKey::PrimaryKey(vec!["a".into()]))));
    let mut d = PgOutputDecoder::new(TransactionBuilder::new().with_key_lookup(lookup));
    let batches = run(
        &mut d,
        &[
            begin(0x10, 1),
            relation(5, "public", "full_rows", b'f', &[(true, "a", INT4), (true, "b", TEXT)]),
            update(5, Some((b'O', &[Some("1"), Some("one")])), &[Some("1"), Some("uno")]),
            commit(0x10),
        ],
    )
    .expect("decodes");
    assert_eq!(ops(&batches), [(Op::Upsert, "1".into(), r#"{"a":1,"b":"uno"}"#.into())]);
}

#[test]
fn a_relation_message_mid_stream_gives_the_following_rows_the_new_shape() {
    let mut d = decoder();
    let batches = run(
        &mut d,
        &[
            begin(0x10, 1),
            users(),
            insert(1, &[Some("1"), Some("Ann")]),
            commit(0x10),
            begin(0x20, 2),
            // ADD COLUMN, then a key redefined to (id, name) and a column renamed.
            relation(
                1,
                "public",
                "users",
                b'd',
                &[(true, "id", INT4), (false, "name", TEXT), (false, "age", INT4)],
            ),
            insert(1, &[Some("2"), Some("Bo"), Some("40")]),
            relation(
                1,
                "public",
                "users",
                b'd',
                &[(true, "id", INT4), (true, "full_name", TEXT), (false, "age", TEXT)],
            ),
            insert(1, &[Some("3"), Some("Cy"), Some("41")]),
            commit(0x20),
        ],
    )
    .expect("decodes");
    assert_eq!(
        ops(&batches),
        [
            (Op::Upsert, "1".into(), r#"{"id":1,"name":"Ann"}"#.into()),
            (Op::Upsert, "2".into(), r#"{"id":2,"name":"Bo","age":40}"#.into()),
            (Op::Upsert, "3:Cy".into(), r#"{"id":3,"full_name":"Cy","age":"41"}"#.into()),
        ]
    );
    // A tuple of the old shape after the new Relation message is refused, not misread.
    let err = run(&mut d, &[begin(0x30, 3), insert(1, &[Some("4"), Some("Di")])]).unwrap_err();
    assert!(matches!(err.kind(), PgOutputErrorKind::ColumnCount { expected: 3, got: 2, .. }), "{err}");
}

#[test]
fn names_that_need_escaping_are_escaped_in_documents() {
    let mut d = decoder();
    let batches = run(
        &mut d,
        &[
            begin(0x10, 1),
            relation(
                7,
                "Inventory",
                "Stock \"Items\"",
                b'd',
                &[(true, "SKU", TEXT), (false, "a\"b\\c", INT4)],
            ),
            insert(7, &[Some("x"), Some("1")]),
            commit(0x10),
        ],
    )
    .expect("decodes");
    let e = &batches[0].envelopes[0];
    assert_eq!(e.index.as_str(), "inventory_stock__items_");
    assert_eq!(doc(e), r#"{"SKU":"x","a\"b\\c":1}"#);
}

#[test]
fn origin_type_and_logical_messages_are_read_and_ignored() {
    let mut origin = vec![b'O'];
    origin.extend(0x5u64.to_be_bytes());
    origin.extend(b"upstream\0");
    let mut ty = vec![b'Y'];
    ty.extend(16400u32.to_be_bytes());
    ty.extend(b"public\0mood\0");
    let mut msg = vec![b'M', 0];
    msg.extend(0x7u64.to_be_bytes());
    msg.extend(b"lanestream\0");
    msg.extend(3u32.to_be_bytes());
    msg.extend(b"abc");
    let mut d = decoder();
    // A non-transactional message outside any transaction, then the others inside one.
    let batches =
        run(&mut d, &[msg.clone(), begin(0x10, 1), origin, ty, msg, users(), commit(0x10)]).expect("decodes");
    assert_eq!(batches.len(), 1);
    assert!(batches[0].envelopes.is_empty());
    assert_eq!(batches[0].changes, 0);
}

#[test]
fn backfill_marks_are_kept_for_the_source_in_stream_order() {
    use crate::mark::{Mark, MarkKind, MARK_PREFIX};
    let message = |lsn: u64, prefix: &str, content: &str| {
        let mut m = vec![b'M', 1];
        m.extend(lsn.to_be_bytes());
        m.extend(prefix.as_bytes());
        m.push(0);
        m.extend((content.len() as u32).to_be_bytes());
        m.extend(content.as_bytes());
        m
    };
    let mut d = decoder();
    let batches = run(
        &mut d,
        &[
            begin(0x10, 1),
            message(0x8, MARK_PREFIX, &Mark::content("src", 3, MarkKind::Low)),
            message(0x9, "lanestream", "3:low"),
            message(0xA, MARK_PREFIX, "not a mark"),
            commit(0x10),
            begin(0x20, 2),
            message(0x18, MARK_PREFIX, &Mark::content("src", 3, MarkKind::High)),
            commit(0x20),
        ],
    )
    .expect("decodes");
    assert_eq!(batches.len(), 2, "a mark's transaction is an empty transaction");
    let low = d.take_mark().expect("the low mark");
    assert_eq!((low.source.as_str(), low.chunk, low.kind, low.lsn), ("src", 3, MarkKind::Low, Position(0x8)));
    assert_eq!(d.take_mark().map(|m| (m.kind, m.lsn)), Some((MarkKind::High, Position(0x18))));
    assert_eq!(d.take_mark(), None, "other prefixes and foreign content are no marks");
}

#[test]
fn large_transactions_come_in_chunks_and_only_the_last_is_positioned() {
    let mut d = PgOutputDecoder::new(TransactionBuilder::new().with_max_batch_changes(Some(2)));
    let mut messages = vec![begin(0x40, 1), users()];
    for i in 0..5 {
        messages.push(insert(1, &[Some(&i.to_string()), Some("x")]));
    }
    messages.push(commit(0x40));
    let batches = run(&mut d, &messages).expect("decodes");
    let shape: Vec<_> =
        batches.iter().map(|b| (b.position, b.changes, b.offset, b.envelopes.len())).collect();
    assert_eq!(
        shape,
        [(None, 2, 0, 2), (None, 2, 2, 2), (Some(Position(0x40)), 1, 4, 1)],
        "chunks of 2, the rest at the commit"
    );
    assert!(batches.iter().flat_map(|b| b.envelopes.iter()).all(|e| e.position == Some(Position(0x40))));
}

#[test]
fn transactions_at_or_before_resume_after_are_skipped_whole_but_their_relations_kept() {
    let mut d = decoder();
    d.resume_after(Some(Position(0x20)));
    let batches = run(
        &mut d,
        &[
            begin(0x20, 1),
            users(),
            insert(1, &[Some("1"), Some("Ann")]),
            commit(0x20),
            begin(0x30, 2),
            insert(1, &[Some("2"), Some("Bo")]),
            commit(0x30),
        ],
    )
    .expect("decodes");
    assert_eq!(d.skipped_transactions(), 1);
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].position, Some(Position(0x30)));
    assert_eq!(ops(&batches), [(Op::Upsert, "2".into(), r#"{"id":2,"name":"Bo"}"#.into())]);
}

#[test]
fn the_parsed_begin_and_commit_of_a_client_drive_the_same_builder() {
    let mut d = decoder();
    d.begin(0x50, 9, 0).expect("begin");
    assert!(d.in_transaction());
    assert!(d.decode(&users()).expect("relation").is_none());
    assert!(d.decode(&insert(1, &[Some("1"), Some("Ann")])).expect("insert").is_none());
    let batch = d.commit(0x50).expect("commit").expect("a batch");
    assert_eq!(batch.position, Some(Position(0x50)));
    assert_eq!(batch.changes, 1);
    assert_eq!(d.commit_time_micros(), Some(PG_EPOCH_UNIX_MICROS));
    assert_eq!(batch.envelopes[0].built_at_micros, Some(PG_EPOCH_UNIX_MICROS as u64));
}

#[test]
fn every_envelope_carries_its_transactions_commit_time_in_unix_micros() {
    // A transaction of 3 changes in chunks of 2, committed 1.5 s after PostgreSQL's epoch; then
    // one committed a day later.
    let mut d = PgOutputDecoder::new(TransactionBuilder::new().with_max_batch_changes(Some(2)));
    d.begin(0x50, 9, 1_500_000).expect("begin");
    d.decode(&users()).expect("relation");
    let mut batches = Vec::new();
    for id in ["1", "2", "3"] {
        batches.extend(d.decode(&insert(1, &[Some(id), Some("Ann")])).expect("insert"));
    }
    batches.extend(d.commit(0x50).expect("commit"));
    d.begin(0x60, 10, 86_400_000_000).expect("begin");
    batches.extend(d.decode(&insert(1, &[Some("4"), Some("Bo")])).expect("insert"));
    batches.extend(d.commit(0x60).expect("commit"));
    let times: Vec<Vec<Option<u64>>> =
        batches.iter().map(|b| b.envelopes.iter().map(|e| e.built_at_micros).collect()).collect();
    let first = Some(PG_EPOCH_UNIX_MICROS as u64 + 1_500_000);
    let second = Some(PG_EPOCH_UNIX_MICROS as u64 + 86_400_000_000);
    assert_eq!(times, [vec![first, first], vec![first], vec![second]]);
}

// --- errors -------------------------------------------------------------------------------------

pub(super) fn kind_of(r: Result<Option<Batch>, PgOutputError>) -> PgOutputErrorKind {
    *r.expect_err("an error").kind
}

#[test]
fn malformed_messages_are_named_errors() {
    let mut d = decoder();
    assert!(matches!(kind_of(d.decode(b"")), PgOutputErrorKind::Empty));
    assert!(matches!(
        kind_of(d.decode(b"B\0\0")),
        PgOutputErrorKind::Truncated { tag: 'B', field: "final LSN", .. }
    ));
    let mut long = begin(0x10, 1);
    long.push(0);
    assert!(matches!(kind_of(d.decode(&long)), PgOutputErrorKind::TrailingBytes { tag: 'B', extra: 1 }));
    assert!(matches!(kind_of(d.decode(b"Z")), PgOutputErrorKind::UnknownMessage(b'Z')));
    assert!(matches!(kind_of(d.decode(b"S\0\0\0\x01\x01")), PgOutputErrorKind::UnsupportedMessage('S')));
    assert!(matches!(kind_of(d.decode(&insert(99, &[]))), PgOutputErrorKind::UnknownRelation(99)));
    let mut bad_name = relation(8, "public", "t", b'd', &[]);
    bad_name[6] = 0xff;
    assert!(matches!(kind_of(d.decode(&bad_name)), PgOutputErrorKind::NotUtf8 { field: "schema" }));
    let mut negative = vec![b'T'];
    negative.extend((-1i32).to_be_bytes());
    negative.push(0);
    assert!(matches!(kind_of(d.decode(&negative)), PgOutputErrorKind::Negative { value: -1, .. }));

    d.decode(&users()).expect("relation");
    let mut binary = vec![b'I'];
    binary.extend(1u32.to_be_bytes());
    binary.extend(b"N\0\x02b\0\0\0\x04\0\0\0\x01n");
    assert!(matches!(kind_of(d.decode(&binary)), PgOutputErrorKind::BinaryValue { .. }));
    assert!(matches!(
        kind_of(d.decode(&insert(1, &[Some("one"), Some("x")]))),
        PgOutputErrorKind::BadValue { type_oid: 23, expected: "a number", .. }
    ));
    let mut marker = insert(1, &[Some("1"), Some("x")]);
    marker[5] = b'X';
    assert!(matches!(
        kind_of(d.decode(&marker)),
        PgOutputErrorKind::BadTupleMarker { tag: 'I', marker: b'X' }
    ));
    let mut value_kind = insert(1, &[Some("1"), None]);
    *value_kind.last_mut().expect("a byte") = b'q';
    assert!(matches!(kind_of(d.decode(&value_kind)), PgOutputErrorKind::BadValueKind { kind: b'q', .. }));
    let err = d.decode(&insert(1, &[Some("1"), Some("x")])).expect_err("outside a transaction");
    assert!(matches!(
        err.kind(),
        PgOutputErrorKind::Build(BuildErrorKind::OutsideTransaction { action: 'I' })
    ));
    assert_eq!(err.to_string(), "pgoutput message 14: I outside a transaction (no B before it)");
}

#[test]
fn a_bad_message_inside_a_transaction_discards_it_whole_at_its_commit() {
    let mut d = decoder();
    run(&mut d, &[begin(0x10, 1), users(), insert(1, &[Some("1"), Some("Ann")])]).expect("fine so far");
    let bad = d.decode(&insert(1, &[Some("x"), Some("Bo")])).expect_err("bad number");
    assert_eq!(bad.lost_changes(), 0, "reported at the commit");
    let err = d.decode(&commit(0x10)).expect_err("damaged");
    assert!(
        matches!(
            err.kind(),
            PgOutputErrorKind::Build(BuildErrorKind::DamagedTransaction { bad_lines: 1, changes: 1, .. })
        ),
        "{err}"
    );
    assert_eq!(err.lost_changes(), 2, "its readable change and its bad message");
    // The decoder goes on with the next transaction.
    let next =
        run(&mut d, &[begin(0x20, 2), insert(1, &[Some("2"), Some("Cy")]), commit(0x20)]).expect("decodes");
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].position, Some(Position(0x20)));
}

#[test]
fn a_malformed_relation_message_forgets_every_relation_instead_of_using_an_old_shape() {
    let mut d = decoder();
    run(&mut d, &[users()]).expect("relation");
    let mut bad = relation(
        1,
        "public",
        "users",
        b'd',
        &[(true, "id", INT4), (false, "name", TEXT), (false, "x", TEXT)],
    );
    bad.truncate(bad.len() - 3);
    assert!(matches!(kind_of(d.decode(&bad)), PgOutputErrorKind::Truncated { tag: 'R', .. }));
    d.decode(&begin(0x10, 1)).expect("begin");
    assert!(matches!(
        kind_of(d.decode(&insert(1, &[Some("1"), Some("Ann")]))),
        PgOutputErrorKind::UnknownRelation(1)
    ));
}

#[test]
fn a_commit_lsn_not_after_the_previous_one_is_refused() {
    let mut d = decoder();
    run(&mut d, &[begin(0x20, 1), commit(0x20)]).expect("first");
    d.decode(&begin(0x20, 2)).expect("begin");
    assert!(matches!(
        kind_of(d.decode(&commit(0x20))),
        PgOutputErrorKind::Build(BuildErrorKind::LsnRegressed { .. })
    ));
}

proptest::proptest! {
    #[test]
    fn no_bytes_make_the_decoder_panic(messages in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..64), 0..16)) {
        let mut d = decoder();
        d.decode(&users()).ok();
        for m in &messages {
            let _ = d.decode(m);
        }
        let _ = d.finish();
    }
}

// --- the capture: real pgoutput bytes of a server, against wal2json of the same transactions ---

fn data(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

/// The captured messages (scripts/capture-pgoutput.sh): one a line, `LSN HEX`.
fn captured_messages() -> Vec<Vec<u8>> {
    let text = std::fs::read_to_string(data("pgoutput-capture.hex")).expect("the capture");
    text.lines()
        .map(|l| {
            let hex = l.split_once(' ').expect("LSN HEX").1;
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect()
        })
        .collect()
}

/// The wal2json reader's batches over the wal2json capture of the same transactions, told the
/// key of the `USING INDEX` table as the live source's catalog look-up would, without the empty
/// transactions that pgoutput does not send.
fn wal2json_batches(max: Option<u64>) -> Vec<Batch> {
    let file = std::fs::File::open(data("pgoutput-capture.wal2json.jsonl")).expect("the capture");
    let mut builder = TransactionBuilder::new().with_max_batch_changes(max);
    builder.set_key_columns("public", "by_index", Some(vec!["code".into()]));
    Wal2JsonReader::new(std::io::BufReader::new(file))
        .with_builder(builder)
        .map(|r| r.expect("the wal2json capture reads"))
        .filter(|b| !(b.envelopes.is_empty() && b.changes == 0))
        .collect()
}

/// The decoder's batches of the capture, their commit times checked (every envelope has one, the
/// same across its batch, after 2020) and then cleared: the wal2json capture has none. Its
/// numeric `NaN`, `Infinity` and `-Infinity` (JSON strings, P9) are made `null`, as wal2json
/// writes them; the capture holds one row of them.
fn pgoutput_batches(max: Option<u64>) -> Vec<Batch> {
    pgoutput_batches_as_decoded(max).1
}

/// [`pgoutput_batches`] before the special values are made null, and how many documents held
/// them.
fn pgoutput_batches_as_decoded(max: Option<u64>) -> (usize, Vec<Batch>) {
    let mut specials = 0;
    let batches = pgoutput_batches_raw(max)
        .into_iter()
        .map(|mut b| {
            let envelopes: Vec<lanestream::Envelope> = b
                .envelopes
                .iter()
                .map(|e| {
                    let text = String::from_utf8(e.document.to_vec()).expect("UTF-8");
                    let nulled = ["NaN", "Infinity", "-Infinity"]
                        .iter()
                        .fold(text.clone(), |t, s| t.replace(&format!("\":\"{s}\""), "\":null"));
                    specials += usize::from(nulled != text);
                    // wal2json's lines carry no shape and no unchanged columns (P5, P6 are
                    // pgoutput's: checked in `p6_...` below).
                    lanestream::Envelope {
                        document: nulled.into_bytes().into(),
                        relation: None,
                        unchanged: Vec::new(),
                        ..e.clone()
                    }
                })
                .collect();
            b.envelopes = envelopes.into();
            b
        })
        .collect();
    assert!(specials > 0, "the capture holds numeric NaN and infinities, as JSON strings");
    (specials, batches)
}

fn pgoutput_batches_raw(max: Option<u64>) -> Vec<Batch> {
    let mut d = PgOutputDecoder::new(TransactionBuilder::new().with_max_batch_changes(max));
    let batches = run(&mut d, &captured_messages()).expect("the pgoutput capture decodes");
    d.finish().expect("ends with a commit");
    batches
        .into_iter()
        .map(|mut b| {
            let first = b.envelopes.first().map(|e| e.built_at_micros.expect("a commit time"));
            let envelopes: Vec<lanestream::Envelope> = b
                .envelopes
                .iter()
                .map(|e| {
                    assert_eq!(e.built_at_micros, first, "one commit time per batch");
                    assert!(first.is_some_and(|t| t > 1_577_836_800_000_000), "after 2020: {first:?}");
                    lanestream::Envelope { built_at_micros: None, ..e.clone() }
                })
                .collect();
            b.envelopes = envelopes.into();
            b
        })
        .collect()
}

#[test]
fn the_captured_pgoutput_gives_the_batches_wal2json_gives_for_the_same_transactions() {
    for max in [None, Some(7)] {
        let (ours, theirs) = (pgoutput_batches(max), wal2json_batches(max));
        assert!(ours.len() >= 20, "the capture holds the workload's transactions ({})", ours.len());
        assert_eq!(ours.len(), theirs.len(), "max {max:?}");
        for (a, b) in ours.iter().zip(&theirs) {
            assert_eq!(a, b, "max {max:?}");
        }
    }
}

/// The expected batches, checked in beside the capture: the wal2json reader's batches of the
/// same transactions, one JSON line each (`LANESTREAM_BLESS=1` writes them again from the
/// wal2json capture after a new capture).
#[test]
fn the_captured_pgoutput_gives_exactly_the_checked_in_batches() {
    let path = data("pgoutput-capture.batches.jsonl");
    if std::env::var_os("LANESTREAM_BLESS").is_some() {
        let mut text = String::new();
        for b in wal2json_batches(None) {
            text.push_str(&serde_json::to_string(&b).expect("serializes"));
            text.push('\n');
        }
        std::fs::write(&path, text).expect("write the expected batches");
    }
    let text = std::fs::read_to_string(&path).expect("the expected batches");
    let expected: Vec<Batch> =
        text.lines().map(|l| serde_json::from_str(l).expect("an expected batch")).collect();
    assert_eq!(pgoutput_batches(None), expected);
    assert_eq!(wal2json_batches(None), expected, "the wal2json capture still gives them");
    // The capture covers what the decoder must handle: DDL between rows, a key change, an
    // unchanged TOAST value, a two-table truncate, every identity.
    let all: Vec<&lanestream::Envelope> = expected.iter().flat_map(|b| b.envelopes.iter()).collect();
    assert!(all.iter().any(|e| e.index.as_str() == "public_pair" && doc(e).contains("\"bonus\":\"ten\"")));
    assert!(all
        .iter()
        .any(|e| e.index.as_str() == "public_docs" && doc(e) == r#"{"id":1,"title":"renamed"}"#));
    assert_eq!(all.iter().filter(|e| e.op == Op::Truncate).count(), 2);
    assert!(all.iter().any(|e| e.index.as_str() == "public_by_index" && e.op == Op::Delete && e.id == "y"));
}

#[test]
fn the_relation_messages_key_beats_the_catalogs_which_may_tell_of_later_ddl() {
    // The catalog, read now, already has the identity of a later ALTER TABLE (the index on k);
    // the stream's Relation messages tell the key each change was written under.
    let lookup: crate::batch::KeyLookup =
        Box::new(|_, _| Ok(Some(crate::batch::CatalogKey::IdentityIndex(vec!["k".into()]))));
    let mut d = PgOutputDecoder::new(TransactionBuilder::new().with_key_lookup(lookup));
    let rekey = |key_id: bool, key_k: bool, identity: u8| {
        relation(9, "public", "rekey", identity, &[(key_id, "id", INT4), (key_k, "k", INT4)])
    };
    let batches = run(
        &mut d,
        &[
            begin(0x10, 1),
            rekey(true, false, b'd'),
            insert(9, &[Some("7"), Some("7")]),
            commit(0x10),
            begin(0x20, 2),
            rekey(true, true, b'd'),
            insert(9, &[Some("1"), Some("2")]),
            commit(0x20),
            begin(0x30, 3),
            rekey(false, true, b'i'),
            delete(9, b'K', &[None, Some("2")]),
            // REPLICA IDENTITY FULL: now the catalog is asked (here: the index on k).
            rekey(true, true, b'f'),
            delete(9, b'O', &[Some("1"), Some("2")]),
            commit(0x30),
        ],
    )
    .expect("decodes");
    let ids: Vec<String> = batches.iter().flat_map(|b| b.envelopes.iter()).map(|e| e.id.clone()).collect();
    assert_eq!(ids, ["7", "1:2", "2", "2"]);
}

#[test]
fn numbers_keep_their_digits_even_past_the_range_of_f64() {
    // numeric has up to 131,072 digits before the point; wal2json writes them as they are.
    let big = format!("1{}", "0".repeat(400));
    let mut d = decoder();
    let batches = run(
        &mut d,
        &[
            begin(0x10, 1),
            relation(10, "public", "n", b'd', &[(true, "id", INT4), (false, "v", 1700), (false, "f", 701)]),
            insert(10, &[Some("1"), Some(&big), Some("1e+308")]),
            commit(0x10),
        ],
    )
    .expect("decodes");
    let document = doc(&batches[0].envelopes[0]);
    assert_eq!(document, format!(r#"{{"id":1,"v":{big},"f":1e+308}}"#));
    let raw: &serde_json::value::RawValue =
        serde_json::from_str(document).expect("valid JSON by the grammar");
    assert!(raw.get().starts_with('{'));
}

/// P5, P6 on the real capture: every change carries its table's shape (schema, name, columns
/// with their types, key), a shape changed by DDL reaches the changes after it in order, and the
/// update that left a TOASTed value unchanged names it.
#[test]
fn p6_the_captured_pgoutput_types_every_change_and_p5_names_unchanged_toast() {
    let batches = pgoutput_batches_raw(None);
    let all: Vec<&lanestream::Envelope> = batches.iter().flat_map(|b| b.envelopes.iter()).collect();
    assert!(all.iter().all(|e| e.relation.is_some()), "every change has its shape");
    let rel = |e: &lanestream::Envelope| e.relation.clone().expect("a shape");
    let items = rel(all.iter().find(|e| e.index.as_str() == "public_items").expect("items"));
    assert_eq!((items.namespace.as_str(), items.name.as_str()), ("public", "items"));
    let types: Vec<(&str, u32, &str)> =
        items.columns.iter().map(|c| (c.name.as_str(), c.type_id, c.type_name.as_str())).collect();
    assert_eq!(types[0], ("id", 23, "int4"));
    assert!(types.contains(&("n", 20, "int8")) && types.contains(&("ok", 16, "bool")), "{types:?}");
    assert_eq!(items.key_columns().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["id"]);
    // Ids are the key's values: the key column of a document holds the id.
    for e in all.iter().filter(|e| e.index.as_str() == "public_items" && !e.document.is_empty()) {
        let doc: serde_json::Value = serde_json::from_slice(&e.document).unwrap();
        assert_eq!(doc["id"].to_string(), e.id);
    }
    // DDL between rows (`pair` gains `bonus`): the changes after it carry the new shape.
    let pair: Vec<_> = all.iter().filter(|e| e.index.as_str() == "public_pair").collect();
    let with_bonus = pair.iter().position(|e| doc(e).contains("\"bonus\"")).expect("a row with bonus");
    assert!(rel(pair[with_bonus]).column("bonus").is_some());
    assert!(pair[..with_bonus].iter().any(|e| rel(e).column("bonus").is_none()), "the old shape came first");
    // The unchanged TOAST value: named, and left out of the document.
    let partial: Vec<_> = all.iter().filter(|e| e.is_partial()).collect();
    assert!(!partial.is_empty(), "the capture holds an update with an unchanged TOAST value");
    for e in partial {
        assert_eq!(e.op, Op::Upsert);
        let doc: serde_json::Value = serde_json::from_slice(&e.document).unwrap();
        for col in &e.unchanged {
            assert!(doc.get(col).is_none(), "{col} is left out of {doc}");
            assert!(rel(e).column(col).is_some());
        }
    }
}
