//! The reader's tests: its line parse, its errors, the bundled capture. (The
//! builder's behaviour on wal2json lines is tested in `batch/tests.rs`.)

use lanestream::{Batch, Op, Position};
use proptest::strategy::Strategy;

use super::parse::Line;
use super::*;
use crate::batch::tests::{doc as document, insert_id, PK_ID};
use crate::batch::{BuildErrorKind, TransactionBuilder};
#[test]
fn a_line_too_long_discards_its_whole_transaction() {
    let i = insert_id;
    let long = format!(
        r#"{{"action":"I","schema":"s","table":"t","columns":[{{"name":"id","value":3}},{{"name":"x","value":"{}"}}],{PK_ID}}}"#,
        "x".repeat(300)
    );
    let input = [
        r#"{"action":"B","lsn":"0/1"}"#.to_owned(),
        i(1),
        long,
        i(2),
        r#"{"action":"C","lsn":"0/1"}"#.to_owned(),
        r#"{"action":"B","lsn":"0/2"}"#.to_owned(),
        i(4),
        r#"{"action":"C","lsn":"0/2"}"#.to_owned(),
    ]
    .join("\n");
    let mut r = Wal2JsonReader::new(input.as_bytes()).with_max_line_len(200);
    let e = r.next().unwrap().unwrap_err();
    assert!(matches!(e.kind(), Wal2JsonErrorKind::LineTooLong { limit: 200 }) && e.line() == 3);
    assert_eq!(e.lost_changes(), 0);
    let e = r.next().unwrap().unwrap_err();
    assert!(
        matches!(
            e.kind(),
            Wal2JsonErrorKind::Build(BuildErrorKind::DamagedTransaction {
                begun: 1,
                first_bad: 3,
                bad_lines: 1,
                changes: 2,
                ..
            })
        ),
        "{e}"
    );
    assert_eq!((e.line(), e.lost_changes()), (5, 3));
    let batch = r.next().unwrap().unwrap();
    assert_eq!((batch.position, batch.changes, batch.envelopes[0].id.as_str()), (Some(Position(2)), 1, "4"));
    assert!(r.next().is_none());
}
fn kind_of(r: Result<Option<Batch>, Wal2JsonError>) -> Wal2JsonErrorKind {
    *r.expect_err("an error").kind
}

/// After each error, a good transaction still goes through.
fn assert_recovers(b: &mut TransactionBuilder, lsn: &str) {
    if b.open_since().is_some() {
        b.push_line(99, br#"{"action":"C","lsn":"0/0"}"#).ok();
        b.finish(99).ok();
    }
    b.push_line(100, br#"{"action":"B"}"#).expect("B");
    let i = format!(
        r#"{{"action":"I","schema":"s","table":"t","columns":[{{"name":"id","type":"integer","value":1}}],{PK_ID}}}"#
    );
    b.push_line(101, i.as_bytes()).expect("I");
    let c = format!(r#"{{"action":"C","lsn":"{lsn}"}}"#);
    let batch = b.push_line(102, c.as_bytes()).expect("C").expect("batch");
    assert_eq!(batch.changes, 1);
}

#[test]
fn errors_name_the_line_and_the_builder_recovers() {
    use Wal2JsonErrorKind as K;
    let mut b = TransactionBuilder::new();
    let e = b.push_line(7, b"{not json").unwrap_err();
    assert_eq!(e.line(), 7);
    assert!(e.to_string().starts_with("wal2json line 7: malformed JSON at byte 1"), "{e}");
    assert_recovers(&mut b, "0/1");

    assert!(matches!(kind_of(b.push_line(1, br#"{"action":"X"}"#)), K::UnknownAction(a) if a == "X"));
    assert!(matches!(kind_of(b.push_line(1, br#"{"action":"BB"}"#)), K::UnknownAction(_)));
    assert!(matches!(
        kind_of(b.push_line(1, br#"{"xid":1}"#)),
        K::Build(BuildErrorKind::MissingField { field: "action", .. })
    ));
    assert!(matches!(
        kind_of(b.push_line(1, br#"{"action":1}"#)),
        K::Build(BuildErrorKind::WrongType { field: "action", .. })
    ));
    assert!(matches!(kind_of(b.push_line(1, br#"[1]"#)), K::Malformed { .. }));
    assert!(matches!(kind_of(b.push_line(1, br#"{"action":"B"} x"#)), K::Malformed { .. }));
    assert!(matches!(kind_of(b.push_line(1, b"{\"action\":\"B\xff\"}")), K::Malformed { .. }));
    assert!(matches!(
        kind_of(b.push_line(1, br#"{"action":"I","schema":"s","table":"t","columns":[]}"#)),
        K::Build(BuildErrorKind::OutsideTransaction { action: 'I' })
    ));
    assert!(matches!(
        kind_of(b.push_line(1, br#"{"action":"C","lsn":"0/9"}"#)),
        K::Build(BuildErrorKind::OutsideTransaction { action: 'C' })
    ));
    assert_recovers(&mut b, "0/2");

    // Inside a transaction: each bad line is reported, and the transaction is discarded whole
    // at its C, counting its readable changes and its bad lines as lost.
    b.push_line(1, br#"{"action":"B"}"#).unwrap();
    assert!(matches!(
        kind_of(b.push_line(2, br#"{"action":"I","table":"t","columns":[]}"#)),
        K::Build(BuildErrorKind::MissingField { field: "schema", .. })
    ));
    assert!(matches!(
        kind_of(b.push_line(3, br#"{"action":"D","schema":"s","table":"t"}"#)),
        K::Build(BuildErrorKind::MissingField { field: "identity", .. })
    ));
    assert!(matches!(
        kind_of(b.push_line(4, br#"{"action":"I","schema":"s","table":"t","columns":[{"name":"a","value":1}],"pk":[{"name":"id"}]}"#)),
        K::Build(BuildErrorKind::MissingKeyColumn { column, side: "columns" }) if column == "id"
    ));
    assert!(matches!(
        kind_of(b.push_line(5, br#"{"action":"I","schema":"s","table":"t","columns":{}}"#)),
        K::Build(BuildErrorKind::WrongType { field: "columns", .. })
    ));
    assert!(matches!(
        kind_of(b.push_line(6, br#"{"action":"I","schema":"s","table":"t","columns":[{"value":1}]}"#)),
        K::Build(BuildErrorKind::MissingField { .. })
    ));
    let ok =
        format!(r#"{{"action":"I","schema":"s","table":"t","columns":[{{"name":"id","value":1}}],{PK_ID}}}"#);
    assert!(b.push_line(7, ok.as_bytes()).unwrap().is_none());
    let e = b.push_line(8, br#"{"action":"C","lsn":"0/3"}"#).unwrap_err();
    assert!(
        matches!(e.kind(), K::Build(BuildErrorKind::DamagedTransaction { begun: 1, first_bad: 2, bad_lines: 5, changes: 1, chunks: 0, lsn }) if lsn == "0/3"),
        "{e}"
    );
    assert_eq!(e.lost_changes(), 6);
    assert_eq!(
        e.to_string(),
        "wal2json line 8: the transaction begun at line 1 (commit LSN 0/3) had 5 bad lines, the first at line 2; it was discarded whole with its 1 readable changes"
    );
    assert_eq!((b.open_since(), b.last_commit()), (None, Some(Position(2))));

    // C problems discard the transaction.
    for (c, check) in [
        (
            r#"{"action":"C"}"#,
            &(|k: &K| matches!(k, K::Build(BuildErrorKind::MissingField { field: "lsn", .. })))
                as &dyn Fn(&K) -> bool,
        ),
        (r#"{"action":"C","lsn":"nope"}"#, &|k: &K| matches!(k, K::Build(BuildErrorKind::BadLsn(_)))),
        (r#"{"action":"C","lsn":"FFFFFFFF/FFFFFFFF"}"#, &|k: &K| {
            matches!(k, K::Build(BuildErrorKind::BadLsn(_)))
        }),
        (r#"{"action":"C","lsn":"0/2"}"#, &|k: &K| {
            matches!(k, K::Build(BuildErrorKind::LsnRegressed { .. }))
        }),
        (r#"{"action":"C","lsn":"0/4","xid":2}"#, &|k: &K| {
            matches!(k, K::Build(BuildErrorKind::XidMismatch { begin: 1, commit: 2 }))
        }),
        (r#"{"action":"C","lsn":"0/4","xid":"2"}"#, &|k: &K| {
            matches!(k, K::Build(BuildErrorKind::WrongType { field: "xid", .. }))
        }),
    ] {
        b.push_line(10, br#"{"action":"B","xid":1}"#).unwrap();
        let k = kind_of(b.push_line(11, c.as_bytes()));
        assert!(check(&k), "{c}: {k}");
        assert_eq!(b.open_since(), None, "{c}: transaction not discarded");
    }
    assert_recovers(&mut b, "0/4");

    // B inside a transaction: the open one is discarded, the new one begun.
    b.push_line(20, br#"{"action":"B"}"#).unwrap();
    b.push_line(21, ok.as_bytes()).unwrap();
    let e = b.push_line(22, br#"{"action":"B"}"#).unwrap_err();
    assert!(
        matches!(e.kind(), K::Build(BuildErrorKind::BeginInsideTransaction { begun: 20, dropped: 1 })),
        "{e}"
    );
    assert_eq!(e.lost_changes(), 1);
    assert_eq!(b.open_since(), Some(22));
    let e = b.finish(23).unwrap_err();
    assert!(matches!(e.kind(), BuildErrorKind::Truncated { begun: 22 }));
    assert_eq!(e.lost_changes(), 0);
    assert_eq!(b.open_since(), None);
    assert_recovers(&mut b, "0/5");
}

#[test]
fn fields_are_checked_only_where_used_and_errors_name_them() {
    use Wal2JsonErrorKind as K;
    let mut b = TransactionBuilder::new();
    // B reads only xid; columns, identity and pk must have their shape on every line.
    b.push_line(1, br#"{"action":"B","lsn":5,"schema":null,"table":[]}"#).expect("B");
    let bad = |b: &mut TransactionBuilder, line: &str| kind_of(b.push_line(2, line.as_bytes()));
    assert!(matches!(
        bad(&mut b, r#"{"action":"M","columns":null}"#),
        K::Build(BuildErrorKind::WrongType { field: "columns", .. })
    ));
    assert!(matches!(
        bad(&mut b, r#"{"action":"M","identity":[1]}"#),
        K::Build(BuildErrorKind::WrongType { field: "identity", .. })
    ));
    assert!(matches!(
        bad(&mut b, r#"{"action":"M","pk":[{"name":1}]}"#),
        K::Build(BuildErrorKind::WrongType { field: "pk", .. })
    ));
    assert!(matches!(
        bad(&mut b, r#"{"action":"I","schema":"s","table":"t","columns":[{"name":1,"value":1}]}"#),
        K::Build(BuildErrorKind::WrongType { field: "columns", expected: "columns with a string name" })
    ));
    assert!(matches!(
        bad(&mut b, r#"{"action":"I","schema":"s","table":"t","columns":[{"name":"a"}]}"#),
        K::Build(BuildErrorKind::MissingField { field: "a column value", .. })
    ));
    let e = b.push_line(3, br#"{"action":"M",}"#).unwrap_err();
    assert_eq!(e.to_string(), "wal2json line 3: malformed JSON at byte 14: trailing comma");
    // Those bad lines discard their transaction.
    let e = b.push_line(4, br#"{"action":"C","lsn":"0/1"}"#).unwrap_err();
    assert!(matches!(e.kind(), K::Build(BuildErrorKind::DamagedTransaction { bad_lines: 6, .. })), "{e}");
    // An escaped column name matches its key unescaped and is written escaped by serde_json.
    b.push_line(3, br#"{"action":"B"}"#).expect("B");
    let i = r#"{"action":"I","schema":"s","table":"t","columns":[{"name":"i\u0064","value":1}],"pk":[{"name":"id"}]}"#;
    b.push_line(4, i.as_bytes()).expect("I");
    let batch = b.push_line(5, br#"{"action":"C","lsn":"0/1"}"#).unwrap().unwrap();
    assert_eq!((batch.envelopes[0].id.as_str(), document(&batch.envelopes[0])), ("1", r#"{"id":1}"#));
}

#[test]
fn reader_counts_lines_skips_blanks_and_limits_length() {
    let input = b"\n{\"action\":\"B\"}\n\n{\"action\":\"C\",\"lsn\":\"0/1\"}\n{\"action\":\"B\"}\n";
    let mut r = Wal2JsonReader::new(&input[..]);
    assert_eq!(r.next().unwrap().unwrap().position, Some(Position(1)));
    let e = r.next().unwrap().unwrap_err();
    assert_eq!((e.line(), e.is_recoverable()), (5, true));
    assert!(matches!(e.kind(), Wal2JsonErrorKind::Build(BuildErrorKind::Truncated { begun: 5 })));
    assert!(r.next().is_none());

    let long = format!(
        "{{\"action\":\"M\",\"content\":\"{}\"}}\n{{\"action\":\"B\"}}\n{{\"action\":\"C\",\"lsn\":\"0/1\"}}",
        "x".repeat(100)
    );
    let mut r =
        Wal2JsonReader::new(std::io::BufReader::with_capacity(8, long.as_bytes())).with_max_line_len(50);
    let e = r.next().unwrap().unwrap_err();
    assert!(matches!(e.kind(), Wal2JsonErrorKind::LineTooLong { limit: 50 }) && e.line() == 1);
    assert_eq!(r.next().unwrap().unwrap().position, Some(Position(1))); // no final newline
    assert!(r.next().is_none());
    assert_eq!(r.lines_read(), 3);
}

#[test]
fn io_errors_end_the_iteration() {
    struct Broken;
    impl std::io::Read for Broken {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("boom"))
        }
    }
    let mut r = Wal2JsonReader::new(std::io::BufReader::new(Broken));
    let e = r.next().unwrap().unwrap_err();
    assert!(!e.is_recoverable() && e.to_string().contains("boom"));
    assert!(r.next().is_none());
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

    /// Arbitrary lines never panic the builder, and it keeps working afterwards.
    #[test]
    fn arbitrary_lines_never_panic(lines in proptest::collection::vec(
        proptest::prop_oneof![
            proptest::collection::vec(proptest::num::u8::ANY, 0..40),
            r#"\{"action":"[BIUDTCMX]"(,"(lsn|xid|schema|table|columns|identity|pk)":("0/[0-9A-F]{1,3}"|[0-9]{1,3}|"s"|\[\{"name":"id","value":[0-9]\}\]|\[\]|null))*\}"#
                .prop_map(String::into_bytes),
        ], 0..20)) {
        let mut b = TransactionBuilder::new();
        for (n, l) in lines.iter().enumerate() {
            let _ = b.push_line(n as u64 + 1, l);
        }
        let _ = b.finish(lines.len() as u64);
        let last = b.last_commit().map_or(0, |p| p.0);
        let begin = b.push_line(1000, br#"{"action":"B"}"#);
        proptest::prop_assert!(begin.is_ok());
        let c = format!(r#"{{"action":"C","lsn":"{}"}}"#, Position(last + 1));
        let commit = b.push_line(1001, c.as_bytes());
        proptest::prop_assert!(matches!(commit, Ok(Some(_))));
    }
}

/// Counts of the bundled capture, checked independently with serde_json.
#[test]
fn bundled_capture_parses_completely() {
    use std::io::BufReader;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/wal2json-sample.jsonl.gz");
    let file = std::fs::File::open(path).expect("data/wal2json-sample.jsonl.gz");
    let text = {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(file), &mut s).expect("gunzip");
        s
    };
    // Expected: per transaction, the commit LSN and the number of I/U/D/T lines.
    let mut expected = Vec::new();
    let mut count = 0u64;
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("capture line is JSON");
        match v["action"].as_str().expect("action") {
            "B" => count = 0,
            "I" | "U" | "D" | "T" => count += 1,
            "C" => expected.push((Position::from_lsn(v["lsn"].as_str().expect("lsn")).unwrap(), count)),
            _ => {}
        }
    }
    let batches: Vec<Batch> = Wal2JsonReader::new(BufReader::new(text.as_bytes()))
        .collect::<Result<_, _>>()
        .expect("every line of the capture parses");
    let got: Vec<_> = batches.iter().map(|b| (b.position.unwrap(), b.changes)).collect();
    assert_eq!(got, expected);
    assert!(batches.windows(2).all(|w| w[0].position < w[1].position), "positions strictly increase");
    assert!(batches.iter().any(|b| b.changes == 0), "an empty transaction");
    assert!(batches.iter().any(|b| b.changes > 10_000), "a large transaction");
    assert!(batches.iter().any(|b| b.envelopes.len() as u64 > b.changes), "a key change");
    let mut indexes = std::collections::BTreeSet::new();
    for e in batches.iter().flat_map(|b| b.envelopes.iter()) {
        indexes.insert(e.index.as_str());
        match e.op {
            Op::Truncate => assert!(e.id.is_empty() && e.document.is_empty()),
            _ => {
                let doc: serde_json::Value = serde_json::from_slice(&e.document).expect("document is JSON");
                assert!(doc.is_object() && !e.id.is_empty());
            }
        }
    }
    for name in ["public_customers", "public_audit_log", "inventory_stock_items", "public_order_lines"] {
        assert!(indexes.contains(name), "{name} missing from {indexes:?}");
    }
    assert!(
        batches.iter().flat_map(|b| b.envelopes.iter()).any(|e| e.document.len() > 2048),
        "the TOASTed document"
    );
}

/// The reader's parse of `line`.
fn parse_line(line: &[u8]) -> Result<Line<'_>, Wal2JsonErrorKind> {
    super::line::parse_line(line)
}

#[test]
fn lines_are_read_into_their_fields_as_wal2json_and_other_writers_write_them() {
    // A column given as an array, a nested value kept as its text, an escaped name unescaped,
    // other members skipped.
    let line = br#"{"action":"I","x":[1,{"y":2}],"columns":[["a",1],{"value":[1, {}],"type":"t","name":"\u00e9"}],"pk":[["a"]]}"#;
    let read = parse_line(line).expect("well-formed");
    let columns: Vec<_> = read.columns.iter().flatten().map(|c| (c.name.as_ref(), c.value)).collect();
    assert_eq!(columns, [("a", "1"), ("\u{e9}", "[1, {}]")]);
    assert_eq!(
        read.pk.map(|k| k.iter().map(|k| k.name.to_string()).collect::<Vec<_>>()),
        Some(vec!["a".into()])
    );
    // Scalars kept raw, whitespace around the object and its tokens allowed, null is present.
    let read = parse_line(b" {\"action\" : \"B\" , \"xid\":-0.5E+3, \"lsn\":null}\r\n").expect("well-formed");
    assert_eq!(
        (read.action, read.xid, read.lsn, read.schema),
        (Some("\"B\""), Some("-0.5E+3"), Some("null"), None)
    );
}

#[test]
fn malformed_lines_are_refused_at_the_byte_with_the_reason() {
    let malformed = |line: &str| match parse_line(line.as_bytes()) {
        Err(Wal2JsonErrorKind::Malformed { offset, reason }) => (offset, reason),
        other => panic!("{line}: {other:?}"),
    };
    assert_eq!(malformed(r#"{"action":"B"} x"#), (15, "trailing characters"));
    assert_eq!(malformed(r#"{"action":"B","action":"C"}"#).1, "duplicate field");
    assert_eq!(malformed(r#"{"action":"I","columns":[{"name":"a","value":01}]}"#).1, "invalid number");
    assert_eq!(malformed(r#"{"action":"\q"}"#).1, "invalid escape");
    assert_eq!(
        malformed("{\"action\":\"\u{1}\"}").1,
        "control character (\\u0000-\\u001F) found while parsing a string"
    );
    assert_eq!(malformed(r#"{"action":"I","columns":[{"name":"a"#).1, "EOF while parsing a string");
    assert_eq!(malformed(r#"["action"]"#), (0, "expected a JSON object"));
    // Deep nesting is skipped or kept whole without recursing: no stack overflow.
    for depth in [200, 100_000] {
        let nested = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        assert!(parse_line(format!(r#"{{"action":"B","timestamp":{nested}}}"#).as_bytes()).is_ok());
        let value = format!(r#"{{"action":"I","columns":[{{"name":"a","value":{nested}}}]}}"#);
        let read = parse_line(value.as_bytes()).expect("a nested value");
        assert_eq!(read.columns.as_ref().map(|c| c[0].value.len()), Some(nested.len()));
        assert_eq!(malformed(&value[..value.len() - 4]).1, "EOF while parsing a list");
    }
    // Shallow nesting is a value like any other.
    assert!(parse_line(format!(r#"{{"action":"B","t":{}1{}}}"#, "[".repeat(64), "]".repeat(64)).as_bytes())
        .is_ok());
}

#[test]
fn misshapen_lists_name_their_field() {
    let build = |line: &str| match parse_line(line.as_bytes()) {
        Err(Wal2JsonErrorKind::Build(kind)) => kind.to_string(),
        other => panic!("{line}: {other:?}"),
    };
    assert!(build(r#"{"action":"I","columns":{}}"#).contains("columns"));
    assert!(build(r#"{"action":"I","columns":null}"#).contains("columns"));
    assert!(build(r#"{"action":"I","identity":[{"name":1,"value":1}]}"#).contains("identity"));
    assert!(build(r#"{"action":"I","columns":[{"value":1}]}"#).contains("column name"));
    assert!(build(r#"{"action":"I","columns":[{"name":"a"}]}"#).contains("column value"));
    assert!(build(r#"{"action":"I","pk":[{"type":"int"}]}"#).contains("pk"));
}
