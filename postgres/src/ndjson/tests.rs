//! The durable sink's tests: restarts, checkpoints, the one writer, and the lines it writes.

use std::sync::Arc;

use lanestream::{Batch, Op};

use super::*;

fn envelope(id: u64, position: Option<Position>) -> Envelope {
    Envelope {
        index: IndexName::new("public_t").unwrap(),
        id: id.to_string(),
        op: Op::Upsert,
        position,
        document: format!("{{\"id\":{id}}}").into_bytes().into(),
        built_at_micros: None,
        relation: None,
        old_id: None,
        unchanged: Vec::new(),
    }
}

fn batch(position: Option<Position>, ids: std::ops::Range<u64>) -> LaneItem {
    LaneItem::Batch(Batch::new(position, ids.map(|i| envelope(i, position)).collect::<Arc<[_]>>()))
}

fn lines(sink: &DurableNdjson) -> usize {
    std::fs::read_to_string(sink.path()).unwrap().lines().count()
}

fn open(dir: &Path) -> DurableNdjson {
    DurableNdjson::open(dir, "s", Duration::ZERO).unwrap()
}

/// What is committed comes back with its state; what was written after is cut back.
#[test]
fn a_restart_cuts_back_to_the_checkpoint_and_reads_its_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = open(dir.path());
    assert_eq!(sink.state(), None);
    let mut state = SinkState::new();
    for item in [batch(Some(Position(3)), 0..2), batch(None, 10..12)] {
        sink.apply_item(&item).unwrap();
        state.advance(&item);
    }
    sink.commit(&state).unwrap();
    sink.apply_item(&batch(Some(Position(4)), 2..5)).unwrap(); // never committed
    drop(sink);
    let sink = open(dir.path());
    assert_eq!(sink.state(), Some(&state));
    assert_eq!(lines(&sink), 4);
    let len = std::fs::metadata(dir.path().join("s.ndjson")).unwrap().len();
    assert_eq!(DurableNdjson::read_checkpoint(dir.path(), "s").unwrap(), Some((len, state)));
}

/// A commit with nothing applied records a new state (a backfill owed before it is
/// asked); the same state again writes nothing.
#[test]
fn a_state_alone_is_committed() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = open(dir.path());
    let mut state = SinkState::new();
    state.owe(&[IndexName::new("a").unwrap()], true);
    sink.commit(&state).unwrap();
    let checkpoint = dir.path().join("s.checkpoint");
    let modified = std::fs::metadata(&checkpoint).unwrap().modified().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    sink.commit(&state).unwrap();
    assert_eq!(std::fs::metadata(&checkpoint).unwrap().modified().unwrap(), modified);
    drop(sink);
    assert_eq!(open(dir.path()).state(), Some(&state));
}

/// One writer: a second open of the same output is refused while the first holds it, and
/// succeeds once the first is gone.
#[test]
fn one_writer_per_output() {
    let dir = tempfile::tempdir().unwrap();
    let first = open(dir.path());
    let e = DurableNdjson::open(dir.path(), "s", Duration::from_millis(30)).unwrap_err();
    assert!(matches!(e, NdjsonError::Locked { .. }), "{e}");
    assert!(e.to_string().contains("held by another sink engine"), "{e}");
    drop(first);
    DurableNdjson::open(dir.path(), "s", Duration::ZERO).unwrap();
}

/// An output shorter than its checkpoint is refused: acked lines are missing.
#[test]
fn a_short_output_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = open(dir.path());
    sink.apply_item(&batch(Some(Position(3)), 0..2)).unwrap();
    sink.commit(&SinkState { position: Some(Position(3)), ..SinkState::new() }).unwrap();
    drop(sink);
    std::fs::write(dir.path().join("s.ndjson"), b"{}\n").unwrap();
    let e = DurableNdjson::open(dir.path(), "s", Duration::ZERO).unwrap_err();
    assert!(matches!(e, NdjsonError::ShortOutput { on_disk: 3, .. }), "{e}");
}

/// The checkpoint's forms: this one, the earlier one (read as the state it describes), and
/// what is refused.
#[test]
fn checkpoint_forms() {
    let state = SinkState { position: Some(Position(16)), ..SinkState::new() };
    let text = format!("ndjson 2 42\n{}\n", state.to_text());
    assert_eq!(parse_checkpoint(&text), Ok((42, state.clone())));
    assert_eq!(parse_checkpoint("0/10 42\n"), Ok((42, state)));
    let (len, old) = parse_checkpoint("- 9 1/20 3 1\nbackfill public_t,public_u \"a \\\"b\\\"\"\n").unwrap();
    assert_eq!(len, 9);
    assert_eq!(old.in_transaction, Some(InTransaction { position: Position(0x1_0000_0020), envelopes: 3 }));
    assert_eq!(
        old.owed,
        [OwedBackfill {
            indexes: vec![IndexName::new("public_t").unwrap(), IndexName::new("public_u").unwrap()],
            after: Some("a \"b\"".into())
        }]
    );
    for bad in [
        "",
        "ndjson 2 x\n{\"v\":1}\n",
        "ndjson 2 4\n",
        "ndjson 2 4\n{\"v\":9}\n",
        "ndjson 2 4\n{\"v\":1}\nx\n",
        "0/10",
        "0/10 x",
        "0/10 1 0/20 3",
        "- 0\nbackfill T -\n",
    ] {
        assert!(parse_checkpoint(bad).is_err(), "{bad:?}");
    }
}

// --- the lines ----------------------------------------------------------------------------------

fn shaped(id: &str, op: Op, position: Option<Position>, document: &str) -> Envelope {
    Envelope {
        id: id.into(),
        op,
        position,
        document: document.as_bytes().to_vec().into(),
        relation: Some(Arc::new(lanestream::Relation {
            id: 9,
            namespace: "public".into(),
            name: "t".into(),
            columns: Vec::new(),
            key: Vec::new(),
        })),
        ..envelope(0, None)
    }
}

fn line_of(e: &Envelope) -> String {
    let mut line = Vec::new();
    write_line(&mut line, e);
    String::from_utf8(line).expect("UTF-8 line")
}

#[test]
fn a_moved_partial_upsert_is_written_in_the_documented_field_order() {
    let e = Envelope {
        old_id: Some("a\\:b".into()),
        unchanged: vec!["body".into(), "big \"one\"".into()],
        ..shaped("c:d", Op::Upsert, Some(Position(0x1_0000_00AB)), r#"{"k":"c:d","v":1}"#)
    };
    assert_eq!(
        line_of(&e),
        concat!(
            r#"{"position":"1/AB","index":"public_t","id":"c:d","old_id":"a\\:b","op":"upsert","#,
            r#""unchanged":["body","big \"one\""],"document":{"k":"c:d","v":1}}"#,
            "\n"
        )
    );
}

#[test]
fn each_line_reads_back_as_the_envelope_it_was_written_from() {
    let moved = Envelope {
        old_id: Some("quote\" back\\ nl\n".into()),
        unchanged: vec!["big".into()],
        ..shaped("x\u{1}é", Op::Upsert, Some(Position(0x20)), r#"{"id":"x\u0001é"}"#)
    };
    let envelopes = [
        moved,
        shaped("2", Op::Upsert, Some(Position(0x20)), r#"{"id":2,"big":"B"}"#),
        shaped("1", Op::Delete, Some(Position(0x20)), r#"{"id":1}"#),
        shaped("1", Op::Delete, Some(Position(0x20)), ""),
        shaped("", Op::Truncate, Some(Position(0x20)), ""),
        shaped("7", Op::Upsert, None, r#"{"id":7}"#),
    ];
    for e in &envelopes {
        let line = line_of(e);
        assert_eq!(line.find('\n'), Some(line.len() - 1), "one line: {line:?}");
        let v: serde_json::Value = serde_json::from_str(&line).expect("a JSON line");
        let o = v.as_object().expect("an object");
        let position = e.position.map_or(serde_json::Value::Null, |p| p.to_string().into());
        assert_eq!(o["position"], position, "{line}");
        assert_eq!((o["index"].as_str(), o["id"].as_str()), (Some(e.index.as_str()), Some(e.id.as_str())));
        assert_eq!(o.get("old_id").and_then(|v| v.as_str()), e.old_id.as_deref(), "{line}");
        assert_eq!(o["op"], serde_json::to_value(e.op).unwrap(), "{line}");
        let unchanged: Vec<&str> = o
            .get("unchanged")
            .map_or(vec![], |u| u.as_array().unwrap().iter().filter_map(|c| c.as_str()).collect());
        assert_eq!(unchanged, e.unchanged, "{line}");
        assert_eq!(o.contains_key("unchanged"), e.is_partial(), "{line}");
        let document = match e.document.is_empty() {
            true => serde_json::Value::Null,
            false => serde_json::from_slice(&e.document).unwrap(),
        };
        assert_eq!(o["document"], document, "{line}");
        assert!(!o.contains_key("relation"), "the shape is not written: {line}");
    }
}

// --- durability and restarts --------------------------------------------------------------------

/// The bytes of `dir/s.ndjson`.
fn output(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join("s.ndjson")).unwrap()
}

#[test]
fn a_commit_puts_every_applied_line_in_the_file_before_its_checkpoint_names_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = open(dir.path());
    let mut state = SinkState::new();
    let mut written = 0;
    for item in [
        batch(Some(Position(3)), 0..2),
        LaneItem::SnapshotComplete { indexes: vec![IndexName::new("public_t").unwrap()] },
        batch(Some(Position(4)), 2..3),
    ] {
        written += sink.apply_item(&item).unwrap();
        state.advance(&item);
    }
    sink.commit(&state).unwrap();
    // Read while the sink still holds the file (its buffer is not flushed by a drop).
    let out = output(dir.path());
    assert_eq!(written, out.len() as u64, "what apply_item counted is what was written");
    let ids: Vec<String> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["0", "1", "2"], "a SnapshotComplete writes no line");
    assert_eq!(DurableNdjson::read_checkpoint(dir.path(), "s").unwrap(), Some((written, state)));
}

#[test]
fn a_torn_last_line_is_cut_off_at_the_next_open_and_writing_goes_on_after_the_last_whole_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = open(dir.path());
    let first = batch(Some(Position(3)), 0..2);
    sink.apply_item(&first).unwrap();
    let mut state = SinkState::new();
    state.advance(&first);
    sink.commit(&state).unwrap();
    drop(sink);
    let committed = output(dir.path());
    // A crash in the middle of a write: half a line after the checkpoint's length.
    let mut torn = committed.clone();
    torn.extend_from_slice(br#"{"position":"0/4","index":"public_t","id":"#);
    std::fs::write(dir.path().join("s.ndjson"), &torn).unwrap();
    let mut sink = open(dir.path());
    assert_eq!(output(dir.path()), committed, "cut back to the checkpoint at the open");
    let next = batch(Some(Position(4)), 2..3);
    sink.apply_item(&next).unwrap();
    state.advance(&next);
    sink.commit(&state).unwrap();
    let text = String::from_utf8(output(dir.path())).unwrap();
    for l in text.lines() {
        serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{l:?}: {e}"));
    }
    assert_eq!(text.lines().count(), 3);
}

#[test]
fn an_unreadable_checkpoint_refuses_the_open_and_leaves_the_output_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = open(dir.path());
    sink.apply_item(&batch(Some(Position(3)), 0..2)).unwrap();
    sink.commit(&SinkState { position: Some(Position(3)), ..SinkState::new() }).unwrap();
    sink.apply_item(&batch(Some(Position(4)), 2..3)).unwrap(); // past the checkpoint
    drop(sink);
    let before = output(dir.path());
    std::fs::write(dir.path().join("s.checkpoint"), "ndjson 2 10\nnot a state\n").unwrap();
    let e = DurableNdjson::open(dir.path(), "s", Duration::ZERO).unwrap_err();
    match &e {
        NdjsonError::BadCheckpoint { path, text, .. } => {
            assert_eq!(path, &dir.path().join("s.checkpoint"));
            assert!(text.contains("not a state"), "{e}");
        }
        other => panic!("{other}"),
    }
    assert_eq!(output(dir.path()), before, "nothing is cut by an open that failed");
    assert!(DurableNdjson::read_checkpoint(dir.path(), "s").is_err());
}

/// A chunk of a large transaction with its offset and envelopes at the transaction's position.
fn chunk(position: Position, offset: u64, ids: std::ops::Range<u64>, last: bool) -> LaneItem {
    let envelopes: Arc<[Envelope]> = ids.map(|i| envelope(i, Some(position))).collect();
    let changes = envelopes.len() as u64;
    LaneItem::Batch(Batch { position: last.then_some(position), changes, offset, envelopes })
}

#[test]
fn a_restart_inside_a_large_transaction_resumes_after_its_committed_chunks() {
    use lanestream::pipeline::Uncovered;
    let dir = tempfile::tempdir().unwrap();
    let p = Position(0x50);
    let (first, second, last) = (chunk(p, 0, 0..2, false), chunk(p, 2, 2..4, false), chunk(p, 4, 4..5, true));
    let mut sink = open(dir.path());
    let mut state = SinkState::new();
    sink.apply_item(&first).unwrap();
    state.advance(&first);
    sink.commit(&state).unwrap();
    sink.apply_item(&second).unwrap(); // never committed
    drop(sink);
    let mut sink = open(dir.path());
    let resumed = sink.state().cloned().expect("a state");
    assert_eq!(resumed.in_transaction, Some(InTransaction { position: p, envelopes: 2 }));
    assert_eq!(resumed.position, None);
    // Redelivered, the first chunk is skipped; the second is applied, then the last.
    let todo: Vec<Uncovered> = [&first, &second].map(|i| resumed.uncovered(i).unwrap()).to_vec();
    assert_eq!(todo, [Uncovered::Nothing, Uncovered::All]);
    let mut state = resumed;
    for item in [&second, &last] {
        assert_eq!(state.uncovered(item).unwrap(), Uncovered::All);
        sink.apply_item(item).unwrap();
        state.advance(item);
    }
    sink.commit(&state).unwrap();
    let ids: Vec<String> = String::from_utf8(output(dir.path()))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["0", "1", "2", "3", "4"], "every envelope exactly once");
    assert_eq!((state.position, state.in_transaction), (Some(p), None));
}

#[test]
fn a_second_engine_waiting_for_the_lock_opens_once_the_first_lets_go_and_cuts_its_uncommitted_lines() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = open(dir.path());
    first.apply_item(&batch(Some(Position(3)), 0..2)).unwrap();
    first.commit(&SinkState { position: Some(Position(3)), ..SinkState::new() }).unwrap();
    first.apply_item(&batch(Some(Position(4)), 2..3)).unwrap(); // never committed
    let held = std::time::Instant::now();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        drop(first);
    });
    let second = DurableNdjson::open(dir.path(), "s", Duration::from_secs(20)).expect("the lock comes free");
    assert!(held.elapsed() >= Duration::from_millis(150), "it waited for the first");
    releaser.join().unwrap();
    assert_eq!(lines(&second), 2);
    assert_eq!(second.state().map(|s| s.position), Some(Some(Position(3))));
}
