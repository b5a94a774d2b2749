//! The reader's tests: its parser against serde_json, its errors, the bundled capture. (The
//! builder's behaviour on wal2json lines is tested in `batch/tests.rs`.)

use lanestream::{Batch, Op, Position};
use proptest::strategy::Strategy;

use super::line::{object_text, parse_line_into};
use super::scan::Line;
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

/// The reader's parse of `line`, into a fresh [`Line`].
fn parse_line(line: &[u8]) -> Result<Line<'_>, Wal2JsonErrorKind> {
    let mut parsed = Line::default();
    parse_line_into(line, &mut parsed).map(|()| parsed)
}

/// The reader's parse gives exactly what serde_json gives (reading the line into the same
/// fields, and naming its errors as the reader did when serde_json was its parser: see
/// [`serde_reference`]): the same fields, or the same error. So the reader never lets through
/// bytes that serde_json refuses (they would end up in documents), and never refuses a line
/// serde_json reads.
fn parsers_agree(text: &str) -> Result<(), String> {
    let got = format!("{:?}", parse_line(text.as_bytes()));
    let want = format!("{:?}", object_text(text.as_bytes()).and_then(serde_reference::parse));
    if got == want {
        Ok(())
    } else {
        Err(format!("{text:?}: read {got}, serde_json alone {want}"))
    }
}

#[test]
fn fast_path_reads_every_line_as_serde_json_does() {
    let mut lines: Vec<String> = Vec::new();
    // The bundled capture.
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/wal2json-sample.jsonl.gz");
    let file = std::fs::File::open(path).expect("data/wal2json-sample.jsonl.gz");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(file), &mut text).expect("gunzip");
    let capture: Vec<&str> = text.lines().collect();
    lines.extend(capture.iter().map(|l| l.to_string()));
    // The fuzz corpus, line by line.
    let corpus = concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/corpus/wal2json_lines");
    for entry in std::fs::read_dir(corpus).expect("the fuzz corpus").flatten() {
        let bytes = std::fs::read(entry.path()).expect("a corpus file");
        lines.extend(
            bytes.split(|&b| b == b'\n').filter_map(|l| std::str::from_utf8(l).ok()).map(str::to_owned),
        );
    }
    // What JSON parsers disagree on, in a value that would be copied into a document.
    let head = r#"{"action":"I","schema":"s","table":"t","columns":[{"name":"a","value":"#;
    for value in [
        r#""ok""#, r#""\q""#, r#""\u12""#, r#""\ud800""#, r#""\udc00\ud800""#, r#""\ud83d\ude00""#,
        "\"\u{1}\"", "\"\t\"", "\"\u{7f}\"", r#""\/""#, "01", "-", "1.", ".5", "1e", "1e+", "-0", "1E400",
        "+1", "0x10", "NaN", "Infinity", "tru", "nul", "truex", "[1,]", "[,1]", "{\"a\":1,}", "{\"a\"}",
        "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
        "1 ", " 1", "\"a\"\u{0}", "'a'", "\"a\" \"b\"",
    ] {
        lines.push(format!("{head}{value}}}]}}"));
        lines.push(format!(r#"{{"action":"B","timestamp":{value}}}"#));
        lines.push(format!(r#"{{"action":{value},"lsn":"0/1"}}"#));
        lines.push(format!(r#"{{"action":"I","columns":[{{"name":{value},"value":1}}]}}"#));
        // The same in the objects as wal2json writes them (the scanner's fixed-token path).
        let col = |name: &str, ty: &str, v: &str| format!(r#"{{"name":{name},"type":{ty},"value":{v}}}"#);
        for c in [col("\"a\"", "\"t\"", value), col("\"a\"", value, "1"), col(value, "\"t\"", "1")] {
            lines.push(format!(r#"{{"action":"I","columns":[{c},{}]}}"#, col("\"b\"", "\"t\"", "2")));
            lines.push(format!(r#"{{"action":"U","identity":[{c}],"columns":[{c}]}}"#));
        }
        for k in [format!(r#"{{"name":{value},"type":"t"}}"#), format!(r#"{{"name":"a","type":{value}}}"#)] {
            lines.push(format!(r#"{{"action":"I","columns":[{}],"pk":[{k}]}}"#, col("\"a\"", "\"t\"", "1")));
        }
    }
    for extra in [
        r#"{"action":"B","action":"C"}"#,
        r#"{"action":"B","x":1,"x":2}"#,
        r#"{"act\u0069on":"B"}"#,
        r#"{"action":"B"} x"#,
        r#"{"action":"B"}}"#,
        "{\"action\":\"B\"}\u{0}",
        " {\"action\":\"B\"} ",
        r#"{"action":"I","columns":[{"name":"a","value":1,"name":"b"}]}"#,
        r#"{"action":"I","columns":[{"name":"a\u0000","value":1}]}"#,
        r#"{"action":"I","columns":[{"value":1}]}"#,
        r#"{"action":"I","pk":[{"type":"int"}]}"#,
        r#"{"action":"I","columns":{}}"#,
        r#"{"action":"I","columns":null}"#,
        r#"{"action":null}"#,
        // Near misses of the written forms: whitespace, another member, another order.
        r#"{"action":"I","columns":[{"name":"a","type":"t","value":1 }]}"#,
        r#"{"action":"I","columns":[ {"name" :"a","type":"t","value":1}]}"#,
        r#"{"action":"I","columns":[{"name":"a","type":"t","value":1,"x":2}]}"#,
        r#"{"action":"I","columns":[{"name":"a","type":"t","value":1,"name":"b"}]}"#,
        r#"{"action":"I","columns":[{"type":"t","name":"a","value":1}]}"#,
        r#"{"action":"I","columns":[{"name":"a","type":"t","value":1}],"pk":[{"name":"a","type":"t","x":1}]}"#,
        r#"{"action":"I","columns":[{"name":"a","type":"t\"","value":"x\u0041"}],"pk":[{"name":"a","type":"t\n"}]}"#,
        r#"{"action":"I","columns":[{"name":"a","type":"t","value":1}"#,
        r#"{"action":"I","columns":[{"name":"a","type":"t","value":"#,
        r#"{"action":"I","columns":[{"name":"a","type":"t""#,
        r#"{"action":"I","columns":[{"name":"a"#,
        r#"{"actio":"I","n":1,"nam":2,"t":3,"ta":4,"pkk":5,"schem":6}"#,
    ] {
        lines.push(extra.to_owned());
    }
    let failures: Vec<String> = lines.iter().filter_map(|l| parsers_agree(l).err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} lines: {:#?}",
        failures.len(),
        lines.len(),
        &failures[..failures.len().min(10)]
    );
    // The capture reads whole.
    assert!(capture.iter().all(|l| parse_line(l.as_bytes()).is_ok()), "a capture line refused");
    // Lines off the paths made for what wal2json writes (escaped keys and names, nested values,
    // a field twice, a column without its value, trailing bytes): read as serde_json reads them,
    // or refused with its error.
    for line in [
        r#"{"act\u0069on":"B"}"#,
        r#"{"action":"I","columns":[{"name":"a\"b","value":1}]}"#,
        r#"{"action":"B","timestamp":[1]}"#,
        r#"{"action":"B","action":"C"}"#,
        r#"{"action":"I","columns":[{"value":1}]}"#,
        r#"{"action":"B"} x"#,
        r#"{"action":"I","columns":[["a",1],{"value":[1,{"b":null}],"name":"b"}],"pk":[["a"]]}"#,
        r#"{"action":"I","columns":[{"name":"\ud83d\ude00","value":"\ud800"}]}"#,
        r#"{"action":"I","columns":[["a"]]}"#,
        r#"{"action":"I","pk":[["a",1]]}"#,
    ] {
        assert_eq!(parsers_agree(line), Ok(()));
    }
    // A column given as an array, a nested value kept as its text, an escaped name unescaped.
    let line = br#"{"action":"I","columns":[["a",1],{"value":[1, {}],"name":"\u00e9"}],"pk":[["a"]]}"#;
    let read = parse_line(line).expect("serde_json reads it");
    let columns: Vec<_> = read.columns.iter().flatten().map(|c| (c.name.as_ref(), c.value)).collect();
    assert_eq!(columns, [("a", "1"), ("\u{e9}", "[1, {}]")]);
    assert_eq!(read.pk.map(|k| k.len()), Some(1));
    assert_eq!(
        parse_line(b" {\"action\" : \"B\" , \"xid\":-0.5E+3}\r\n").map(|l| (l.action, l.xid)).ok(),
        Some((Some("\"B\""), Some("-0.5E+3")))
    );
}

#[test]
fn deep_nesting_is_read_as_serde_json_reads_it_without_overflowing() {
    for depth in [3, 64, 65, 200, 100_000] {
        let nested = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        let in_ignored = format!(r#"{{"action":"B","timestamp":{nested}}}"#);
        let in_value = format!(
            r#"{{"action":"I","schema":"s","table":"t","columns":[{{"name":"a","value":{nested}}}]}}"#
        );
        let in_string = format!(r#"{{"action":"B","timestamp":"{}"}}"#, "[".repeat(depth));
        // Whatever serde_json says (it skips nested values without recursing).
        for line in [&in_ignored, &in_value, &in_string] {
            assert_eq!(parse_line(line.as_bytes()).ok(), serde_reference::parse(line).ok(), "depth {depth}");
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]

    /// Capture-like lines with bytes replaced: the parsers still agree.
    #[test]
    fn parsers_agree_on_damaged_lines(
        at in 0usize..400,
        bytes in proptest::collection::vec(proptest::prop_oneof![
            proptest::sample::select(b"\"\\{}[],:0123456789.eE+-tfnulx \t\x01\x7f".to_vec()),
            proptest::num::u8::ANY,
        ], 1..4),
    ) {
        let base = r#"{"action":"U","xid":725,"lsn":"0/1524B20","schema":"public","table":"t","columns":[{"name":"id","type":"integer","value":1},{"name":"n","type":"numeric","value":-1.5e3},{"name":"s","type":"text","value":"a\"b\\c\u00e9"},{"name":"b","type":"boolean","value":false},{"name":"z","type":"text","value":null}],"identity":[{"name":"id","type":"integer","value":1}],"pk":[{"name":"id","type":"integer"}]}"#;
        let mut line = base.as_bytes().to_vec();
        let at = at % line.len();
        let end = (at + bytes.len()).min(line.len());
        line.splice(at..end, bytes);
        if let Ok(text) = std::str::from_utf8(&line) {
            if let Err(e) = parsers_agree(text) {
                proptest::prop_assert!(false, "{}", e);
            }
        }
    }
}

/// The reference the reader's parser is held to: serde_json reading the line into the same
/// fields (values as `RawValue`s, so kept as their raw text), and naming its errors as the reader
/// did when serde_json was its parser — the fields of the wrong shape found by reading the line
/// again into their raw text.
mod serde_reference {
    use std::borrow::Cow;

    use serde::{Deserialize, Deserializer};
    use serde_json::value::RawValue;

    use super::super::scan::Line;
    use super::super::Wal2JsonErrorKind;
    use crate::batch::{BuildErrorKind, Column, Key};

    /// A field that is present is `Some`, `null` included (a plain `Option` would make it
    /// `None`).
    fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
        T::deserialize(d).map(Some)
    }

    #[derive(Deserialize)]
    struct RefLine<'a> {
        #[serde(borrow, default, deserialize_with = "present")]
        action: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "present")]
        xid: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "present")]
        lsn: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "present")]
        schema: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "present")]
        table: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "present")]
        columns: Option<Vec<RefColumn<'a>>>,
        #[serde(borrow, default, deserialize_with = "present")]
        identity: Option<Vec<RefColumn<'a>>>,
        #[serde(borrow, default, deserialize_with = "present")]
        pk: Option<Vec<RefKey<'a>>>,
    }

    #[derive(Deserialize)]
    struct RefColumn<'a> {
        #[serde(borrow)]
        name: Cow<'a, str>,
        #[serde(borrow)]
        value: &'a RawValue,
    }

    #[derive(Deserialize)]
    struct RefKey<'a> {
        #[serde(borrow)]
        name: Cow<'a, str>,
    }

    fn columns(c: Option<Vec<RefColumn<'_>>>) -> Option<Vec<Column<'_>>> {
        c.map(|c| c.into_iter().map(|c| Column { name: c.name, value: c.value.get() }).collect())
    }

    /// Parses `text` (a JSON object's text) with serde_json.
    pub(super) fn parse(text: &str) -> Result<Line<'_>, Wal2JsonErrorKind> {
        let l: RefLine<'_> = serde_json::from_str(text).map_err(|e| {
            let shape = if e.is_data() { shape_error(text) } else { None };
            shape.map(Wal2JsonErrorKind::Build).unwrap_or_else(|| Wal2JsonErrorKind::Malformed {
                offset: byte_offset(text, e.line(), e.column()),
                reason: reason(&e),
            })
        })?;
        Ok(Line {
            action: l.action.map(RawValue::get),
            xid: l.xid.map(RawValue::get),
            lsn: l.lsn.map(RawValue::get),
            schema: l.schema.map(RawValue::get),
            table: l.table.map(RawValue::get),
            columns: columns(l.columns),
            identity: columns(l.identity),
            pk: l.pk.map(|k| k.into_iter().map(|k| Key { name: k.name }).collect()),
        })
    }

    /// The byte offset of serde_json's 1-based line and column.
    fn byte_offset(text: &str, line: usize, column: usize) -> usize {
        let line_start: usize = text.split_inclusive('\n').take(line.saturating_sub(1)).map(str::len).sum();
        (line_start + column.saturating_sub(1)).min(text.len())
    }

    /// serde_json's description of an error, as one of its fixed messages.
    fn reason(e: &serde_json::Error) -> &'static str {
        const REASONS: [&str; 21] = [
            "EOF while parsing a list",
            "EOF while parsing an object",
            "EOF while parsing a string",
            "EOF while parsing a value",
            "expected `:`",
            "expected `,` or `]`",
            "expected `,` or `}`",
            "expected ident",
            "expected value",
            "expected `\"`",
            "invalid escape",
            "invalid number",
            "number out of range",
            "invalid unicode code point",
            "control character (\\u0000-\\u001F) found while parsing a string",
            "key must be a string",
            "lone leading surrogate in hex escape",
            "trailing comma",
            "trailing characters",
            "unexpected end of hex escape",
            "recursion limit exceeded",
        ];
        let message = e.to_string();
        if let Some(r) = REASONS.iter().find(|r| message.starts_with(**r)) {
            return r;
        }
        match e.classify() {
            serde_json::error::Category::Eof => "unexpected end of line",
            serde_json::error::Category::Data if message.starts_with("duplicate field") => "duplicate field",
            _ => "invalid JSON",
        }
    }

    /// `columns`, `identity` and `pk` as raw JSON, to find which one is misshapen.
    #[derive(Deserialize)]
    struct Shape<'a> {
        #[serde(borrow, default, deserialize_with = "present")]
        columns: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "present")]
        identity: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "present")]
        pk: Option<&'a RawValue>,
    }

    /// An element of `columns`, `identity` or `pk` with its members as raw JSON.
    #[derive(Deserialize)]
    struct ElementShape<'a> {
        #[serde(borrow, default, deserialize_with = "present")]
        name: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "present")]
        value: Option<&'a RawValue>,
    }

    /// The elements of an array of objects; `None` if `raw` is not one.
    fn objects<'a>(raw: &'a RawValue) -> Option<Vec<ElementShape<'a>>> {
        let elements: Vec<&RawValue> = serde_json::from_str(raw.get()).ok()?;
        elements
            .into_iter()
            .map(|e| e.get().starts_with('{').then(|| serde_json::from_str(e.get()).ok()).flatten())
            .collect()
    }

    /// Why a syntactically valid line did not deserialize: the field with the wrong shape, or
    /// `None` (e.g. a duplicate key).
    fn shape_error(text: &str) -> Option<BuildErrorKind> {
        let shape: Shape<'_> = serde_json::from_str(text).ok()?;
        let is_str = |v: &RawValue| v.get().starts_with('"');
        for (field, raw) in [("columns", shape.columns), ("identity", shape.identity)] {
            let Some(raw) = raw else { continue };
            let Some(elements) = objects(raw) else {
                return Some(BuildErrorKind::WrongType { field, expected: "an array of column objects" });
            };
            for e in elements {
                let missing = |what| BuildErrorKind::MissingField { action: '?', field: what, hint: "" };
                match (e.name, e.value) {
                    (None, _) => return Some(missing("a column name")),
                    (_, None) => return Some(missing("a column value")),
                    (Some(name), _) if !is_str(name) => {
                        return Some(BuildErrorKind::WrongType {
                            field,
                            expected: "columns with a string name",
                        })
                    }
                    _ => {}
                }
            }
        }
        let pk = shape.pk?;
        let named = objects(pk).is_some_and(|keys| keys.iter().all(|k| k.name.is_some_and(is_str)));
        (!named).then_some(BuildErrorKind::WrongType {
            field: "pk",
            expected: "an array of {\"name\":…} objects",
        })
    }
}
