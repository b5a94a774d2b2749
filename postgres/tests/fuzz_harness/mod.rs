//! The `wal2json_lines` fuzz harness, shared by path by the cargo-fuzz target
//! (`fuzz/fuzz_targets/wal2json_lines.rs`) and the stable corpus replay
//! (`postgres/tests/fuzz_corpus_replay.rs`), so CI runs exactly what the fuzzer ran. The core's
//! harnesses (`lane_ops`, `codec_decode`) live in the workspace root's `tests/`.
#![allow(dead_code)]

use lanestream::Op;
use lanestream_postgres::batch::TransactionBuilder;
use lanestream_postgres::wal2json::Wal2JsonReader;

/// `wal2json_lines`: arbitrary lines into the reader, line by line and as one stream. Every line
/// gives a batch, nothing, or an error; never a panic. What the module docs promise of the
/// batches is checked too.
pub fn wal2json_lines(data: &[u8]) {
    let mut builder = TransactionBuilder::new();
    let mut line_no = 0;
    let mut last = None;
    for line in data.split(|&b| b == b'\n') {
        line_no += 1;
        match builder.push_line(line_no, line) {
            Ok(Some(batch)) => {
                check_batch(&batch, &mut last);
                assert_eq!(builder.last_commit(), batch.position);
            }
            Ok(None) => {}
            Err(e) => {
                assert_eq!(e.line(), line_no, "error names another line: {e}");
                let _ = e.to_string();
            }
        }
    }
    let _ = builder.finish(line_no + 1);
    assert_eq!(builder.open_since(), None, "finish leaves no open transaction");

    // The same bytes through the reader, with a small line limit so long lines are skipped too.
    let mut last = None;
    let mut errors = 0u64;
    let reader = Wal2JsonReader::new(data).with_max_line_len(256);
    for result in reader {
        match result {
            Ok(batch) => check_batch(&batch, &mut last),
            Err(e) => {
                errors += 1;
                assert!(e.line() >= 1, "error without a line number: {e}");
                let _ = e.to_string();
            }
        }
        assert!(errors <= data.len() as u64 + 1, "more errors than lines");
    }
}

/// What the wal2json module docs promise of every batch.
fn check_batch(batch: &lanestream::Batch, last: &mut Option<lanestream::Position>) {
    let position = batch.position.expect("a wal2json batch is positioned");
    if let Some(last) = *last {
        assert!(position > last, "batch positions must strictly increase ({last} then {position})");
    }
    *last = Some(position);
    assert!(batch.envelopes.len() as u64 >= batch.changes, "fewer envelopes than changes");
    for e in batch.envelopes.iter() {
        assert_eq!(e.position, batch.position, "an envelope carries another position than its batch");
        if e.op == Op::Truncate {
            assert!(e.id.is_empty() && e.document.is_empty(), "a truncate with an id or document");
        }
    }
}

/// `pgoutput_decode`: arbitrary bytes as pgoutput messages (each a 2-byte big-endian length,
/// then that many bytes; a short tail is the last message) into the decoder, with chunks of 3
/// changes and a key look-up that answers, fails or knows nothing by table. Every message gives
/// a batch, nothing, or a named error naming that message; never a panic. Positioned batches
/// strictly increase, every envelope carries its transaction's commit LSN, and every document is
/// a JSON object (valid by the grammar; its numbers keep their digits, even past f64's range).
pub fn pgoutput_decode(data: &[u8]) {
    use lanestream_postgres::batch::CatalogKey;
    use lanestream_postgres::pgoutput::PgOutputDecoder;

    let lookup: lanestream_postgres::batch::KeyLookup = Box::new(|_schema, table| match table.len() % 3 {
        0 => Ok(Some(CatalogKey::PrimaryKey(vec![table.to_owned()]))),
        1 => Ok(None),
        _ => Err("the look-up failed".into()),
    });
    let builder = TransactionBuilder::new().with_max_batch_changes(Some(3)).with_key_lookup(lookup);
    let mut decoder = PgOutputDecoder::new(builder);
    let mut last = None;
    let mut rest = data;
    while !rest.is_empty() {
        let (message, tail) = match rest {
            [a, b, tail @ ..] => {
                let n = usize::from(u16::from_be_bytes([*a, *b])).min(tail.len());
                tail.split_at(n)
            }
            _ => (rest, &[][..]),
        };
        rest = tail;
        let before = decoder.messages();
        match decoder.decode(message) {
            Ok(Some(batch)) => {
                if batch.position.is_some() {
                    check_batch(&batch, &mut last);
                    assert_eq!(decoder.builder().last_commit(), batch.position);
                } else {
                    assert!(decoder.in_transaction(), "a chunk outside a transaction");
                }
                for e in batch.envelopes.iter() {
                    assert!(e.position.is_some(), "an envelope without its commit LSN");
                    if e.op != Op::Truncate && !e.document.is_empty() {
                        // Valid JSON by the grammar (a RawValue: numbers keep their digits, also
                        // past f64's range, which serde_json::Value would refuse).
                        let v: &serde_json::value::RawValue =
                            serde_json::from_slice(&e.document).expect("a document is valid JSON");
                        assert!(v.get().starts_with('{'), "a document is a JSON object");
                    }
                }
            }
            Ok(None) => {}
            Err(e) => {
                assert_eq!(e.message(), before + 1, "error names another message: {e}");
                let _ = e.to_string();
            }
        }
    }
    let _ = decoder.finish();
    assert!(!decoder.in_transaction(), "finish leaves no open transaction");
}
