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
