use std::borrow::Cow;

use bytes::Bytes;

use super::table::{plan_relation, PlanColumn};
use super::*;
use crate::batch::{decode_id, snapshot_row, Column};

fn index(name: &str) -> IndexName {
    IndexName::new(name).unwrap()
}

fn env(ix: &str, id: &str, op: Op) -> Envelope {
    Envelope {
        index: index(ix),
        id: id.into(),
        op,
        position: None,
        document: Bytes::from(format!("{{\"id\":{id}}}")),
        built_at_micros: None,
        relation: None,
        old_id: None,
        unchanged: Vec::new(),
    }
}

fn ids(batch: &Batch) -> Vec<&str> {
    batch.envelopes.iter().map(|e| e.id.as_str()).collect()
}

/// xmin 100, xmax 110, 103 and 107 in progress.
fn snapshot() -> XidSnapshot {
    XidSnapshot::parse("100:110:103,107").unwrap()
}

#[test]
fn snapshots_parse_and_tell_visibility() {
    let s = snapshot();
    assert!(s.visible(99) && s.visible(100) && s.visible(109));
    assert!(!s.visible(103) && !s.visible(107) && !s.visible(110) && !s.visible(4000));
    assert_eq!(XidSnapshot::parse("5:5:"), Some(XidSnapshot { xmin: 5, xmax: 5, xip: vec![] }));
    assert_eq!(XidSnapshot::parse("5:x:"), None);
    assert_eq!(XidSnapshot::parse("5:6"), None);
    // Epoch 1: a 32-bit xid just below the wrap is of epoch 0, visible; one just past xmax is not.
    let s = XidSnapshot::parse("4294967396:4294967396:").unwrap(); // 2^32 + 100
    assert!(s.visible(u32::MAX - 5));
    assert!(s.visible(99));
    assert!(!s.visible(100));
}

#[test]
fn changes_between_the_marks_drop_their_keys_from_the_chunk() {
    let rows = ["1", "2", "3", "4", "5"].map(|id| env("t", id, Op::Upsert)).to_vec();
    let mut c = PendingChunk::new(1, index("t"), snapshot(), rows);
    // Before the low mark: a visible transaction's change is in the rows read: kept.
    c.observe(Some(105), &[env("t", "1", Op::Upsert)]);
    // ...one not visible (in progress at the snapshot) is not: dropped.
    c.observe(Some(103), &[env("t", "2", Op::Delete)]);
    c.observe(Some(120), &[env("t", "3", Op::Upsert)]);
    c.low();
    // Between the marks: any change drops its key, another table's does not.
    c.observe(Some(50), &[env("t", "4", Op::Delete), env("u", "5", Op::Delete), env("t", "9", Op::Upsert)]);
    assert_eq!(c.dropped(), 3);
    assert_eq!(ids(&c.finish()), ["1", "5"]);
}

#[test]
fn a_truncate_empties_the_chunk_and_unknown_xids_count_as_not_visible() {
    let rows = ["1", "2"].map(|id| env("t", id, Op::Upsert)).to_vec();
    let mut c = PendingChunk::new(1, index("t"), snapshot(), rows.clone());
    c.observe(None, &[env("t", "1", Op::Upsert)]);
    assert_eq!(ids(&c.finish()), ["2"]);
    let mut c = PendingChunk::new(1, index("t"), snapshot(), rows);
    c.low();
    c.observe(Some(1), &[env("t", "", Op::Truncate)]);
    let b = c.finish();
    assert!(b.envelopes.is_empty() && b.position.is_none());
}

fn col(name: &str, type_oid: u32, type_sql: &str, type_name: &str) -> PlanColumn {
    PlanColumn {
        name: name.into(),
        type_oid,
        type_sql: type_sql.into(),
        type_name: type_name.into(),
        type_modifier: -1,
    }
}

fn plan(name: &str) -> TablePlan {
    let columns =
        vec![col("a", 25, "text", "text"), col("b", 23, "integer", "int4"), col("c", 17, "bytea", "bytea")];
    let id_key = vec!["a".to_owned(), "b".to_owned()];
    TablePlan {
        relation: plan_relation(16384, "public", name, &columns, &id_key),
        index: index(name),
        table: format!("public.{name}"),
        quoted: format!("\"public\".\"{name}\""),
        columns,
        filter: None,
        // PRIMARY KEY (b, a): the key index's order, while ids are in column order (a:b).
        order: vec![1, 0],
        id_key,
        estimated_rows: 10,
    }
}

fn read(chunk: u64, snapshot: &str, ids: &[&str]) -> ReadChunk {
    ReadChunk {
        chunk,
        snapshot: Some(XidSnapshot::parse(snapshot).unwrap()),
        envelopes: ids.iter().map(|id| env("t", id, Op::Upsert)).collect(),
        rows: ids.len(),
    }
}

fn after_the_end(chunk: u64) -> ReadChunk {
    ReadChunk { chunk, snapshot: None, envelopes: Vec::new().into(), rows: 0 }
}

fn mark(b: &Backfiller, chunk: u64, kind: MarkKind) -> Mark {
    Mark { source: b.source_id().to_owned(), chunk, kind, lsn: Position(1) }
}

/// The whole state machine without a server: history before a chunk was read, marks of
/// another source ignored, the table's end, SnapshotComplete after the last batch.
#[test]
fn the_backfiller_publishes_reconciled_chunks_at_their_high_marks_then_snapshot_complete() {
    let sink = SinkName::new("search").unwrap();
    let mut b = Backfiller::new("src1".into(), 3);
    b.push(sink.clone(), vec![index("t")], vec![plan("t")], None);
    // A transaction handed over before the chunk is read, still finishing at its snapshot.
    b.observe(Some(103), &Batch::new(Some(Position(9)), vec![env("t", "2", Op::Delete)].into()));
    let next = b.next_read().unwrap();
    assert_eq!((next.chunk, next.from), (1, ReadFrom::First(None)));
    b.install(read(1, "100:110:103", &["1", "2", "3"]));
    // The next chunks are read while the first waits for its high mark, each after the one
    // before, three held at most.
    let next = b.next_read().unwrap();
    assert_eq!((next.chunk, next.from.clone()), (2, ReadFrom::Continue));
    let third = b.next_read().unwrap();
    assert!(b.next_read().is_none(), "three chunks held");
    b.on_mark(&Mark { source: "other".into(), ..mark(&b, 1, MarkKind::High) });
    assert!(b.out.is_empty(), "another source's mark is ignored");
    b.on_mark(&mark(&b, 1, MarkKind::Low));
    b.observe(Some(111), &Batch::new(Some(Position(10)), vec![env("t", "3", Op::Upsert)].into()));
    b.on_mark(&mark(&b, 1, MarkKind::High));
    let (to, item) = b.out.pop_front().unwrap();
    assert_eq!(to, sink);
    let LaneItem::Batch(batch) = item else { panic!("{item:?}") };
    assert_eq!(ids(&batch), ["1"]);
    assert_eq!((b.rows, b.dropped, b.batches), (1, 2, 1));
    // The second chunk is the table's last (fewer rows than asked); the third, handed out
    // before that was known, comes back empty, without a query.
    b.install(read(next.chunk, "120:120:", &["4"]));
    assert!(b.next_read().is_none());
    b.install(after_the_end(third.chunk));
    b.on_mark(&mark(&b, next.chunk, MarkKind::Low));
    b.on_mark(&mark(&b, next.chunk, MarkKind::High));
    let (_, item) = b.out.pop_front().unwrap();
    assert!(matches!(item, LaneItem::Batch(ref x) if ids(x) == ["4"]), "{item:?}");
    let (_, item) = b.out.pop_front().unwrap();
    assert_eq!(item, LaneItem::SnapshotComplete { indexes: vec![index("t")] });
    assert!(b.next_read().is_none() && b.out.is_empty());
    assert_eq!(b.progress()[0].rows_read, 4);
    assert!(b.progress()[0].done);
}

#[test]
fn an_empty_request_completes_at_once_and_an_empty_last_chunk_needs_no_mark() {
    let sink = SinkName::new("s").unwrap();
    let mut b = Backfiller::new("x".into(), 2);
    b.push(sink.clone(), vec![], vec![], None);
    assert_eq!(b.out.pop_front(), Some((sink.clone(), LaneItem::SnapshotComplete { indexes: vec![] })));
    b.push(sink, vec![index("t")], vec![plan("t")], None);
    let next = b.next_read().unwrap();
    b.install(read(next.chunk, "1:1:", &[]));
    assert!(matches!(b.out.pop_front(), Some((_, LaneItem::SnapshotComplete { .. }))));
}

#[test]
fn ids_decode_into_key_values_in_the_key_order() {
    assert_eq!(decode_id("a\\:b\\\\:c", 2).unwrap(), ["a:b\\", "c"]);
    assert_eq!(decode_id("7", 1).unwrap(), ["7"]);
    assert!(decode_id("7:8", 1).unwrap_err().contains("2 key values"));
    assert!(decode_id("\\N", 1).unwrap_err().contains("NULL"));
    assert!(decode_id("a\\x", 1).unwrap_err().contains("backslash"));
    // Column order a:b, key order (b, a); a bytea value gets its \x back.
    let p = plan("t");
    assert_eq!(p.cursor_of_id("x\\:y:42").unwrap(), ["42", "x:y"]);
    let sql = p.select(Some(&["42".to_owned(), "it's".to_owned()]), 5);
    assert_eq!(
        sql,
        "SELECT \"a\", \"b\", \"c\" FROM \"public\".\"t\" WHERE (\"b\", \"a\") > (E'42'::integer, E'it\\'s'::text) ORDER BY \"b\", \"a\" LIMIT 5"
    ); // P4: the publication's row filter bounds every chunk, the first included.
    let filtered = TablePlan { filter: Some("(b > 3)".into()), ..plan("t") };
    assert_eq!(
        filtered.select(None, 5),
        "SELECT \"a\", \"b\", \"c\" FROM \"public\".\"t\" WHERE ((b > 3)) ORDER BY \"b\", \"a\" LIMIT 5"
    );
    assert!(filtered
        .select(Some(&["42".to_owned(), "x".to_owned()]), 5)
        .contains("WHERE ((b > 3)) AND (\"b\", \"a\") > "));
}

#[test]
fn ids_built_by_the_reader_decode_back() {
    // The builder's id encoding (batch::snapshot_row) and decode_id are inverse.
    let values = ["plain", "with:colon", "back\\slash", "both\\:"];
    for a in values {
        let text = serde_json::to_string(a).unwrap();
        let row = [
            Column { name: Cow::Borrowed("a"), value: &text },
            Column { name: Cow::Borrowed("b"), value: "12" },
        ];
        let (id, _) = snapshot_row(&row, &["a".into(), "b".into()], &mut Vec::new()).unwrap();
        assert_eq!(decode_id(&id, 2).unwrap(), [a, "12"], "{id}");
    }
}

#[test]
fn marks_round_trip_and_foreign_content_is_no_mark() {
    let content = Mark::content("ab:c", 7, MarkKind::High);
    let m = Mark::parse(content.as_bytes(), Position(5)).unwrap();
    assert_eq!(m, Mark { source: "ab:c".into(), chunk: 7, kind: MarkKind::High, lsn: Position(5) });
    assert_eq!(Mark::parse(b"x:1:middle", Position(1)), None);
    assert_eq!(Mark::parse(b"x:y:low", Position(1)), None);
    assert_eq!(Mark::parse(&[0xff, b':', b'1', b':', b'l'], Position(1)), None);
}

/// The stream may reach a chunk's high mark before the reader hands the chunk over: the stream
/// goes on, and installing the chunk publishes it at once, without the rows changed by what the
/// stream handed over meanwhile (after the high mark too: none of it is in the snapshot).
#[test]
fn a_high_mark_before_the_read_is_installed_publishes_at_install() {
    let sink = SinkName::new("s").unwrap();
    let mut b = Backfiller::new("x".into(), 3);
    b.push(sink, vec![index("t")], vec![plan("t")], None);
    let next = b.next_read().unwrap();
    let _ahead = b.next_read().unwrap();
    b.on_mark(&mark(&b, next.chunk, MarkKind::Low));
    assert!(!b.high_before_read());
    // A transaction the snapshot did not see, handed over before the install.
    b.observe(Some(200), &Batch::new(Some(Position(3)), vec![env("t", "2", Op::Delete)].into()));
    b.on_mark(&mark(&b, next.chunk, MarkKind::High));
    assert!(b.high_before_read() && b.out.is_empty());
    // A transaction committed after the high mark, handed over before the install.
    b.observe(Some(201), &Batch::new(Some(Position(4)), vec![env("t", "3", Op::Upsert)].into()));
    b.install(read(next.chunk, "100:110:", &["1", "2", "3"]));
    assert!(!b.high_before_read());
    let (_, item) = b.out.pop_front().unwrap();
    assert!(matches!(item, LaneItem::Batch(ref x) if ids(x) == ["1"]), "{item:?}");
}

/// Chunks handed out ahead: each is reconciled against the changes in its own window and
/// published at its own high mark; the ones after the table's end come back empty, and the
/// table completes only after the chunk still waiting is published.
#[test]
fn chunks_read_ahead_are_published_in_order_and_the_table_completes_after_the_last() {
    let sink = SinkName::new("s").unwrap();
    let mut b = Backfiller::new("x".into(), 2);
    b.push(sink.clone(), vec![index("t")], vec![plan("t")], None);
    let first = b.next_read().unwrap();
    let second = b.next_read().unwrap();
    let third = b.next_read().unwrap();
    assert!(b.next_read().is_none(), "three chunks held: no fourth read");
    assert_eq!((second.from, third.from), (ReadFrom::Continue, ReadFrom::Continue));
    b.on_mark(&mark(&b, first.chunk, MarkKind::Low));
    b.install(read(first.chunk, "100:110:", &["1", "2"]));
    b.install(read(second.chunk, "100:110:", &["3", "4"]));
    assert!(b.next_read().is_none(), "three chunks held: no fourth read");
    // Between the first chunk's marks: drops its key 2, and the second's key 3 (not visible in
    // the second's snapshot).
    b.observe(
        Some(150),
        &Batch::new(Some(Position(5)), vec![env("t", "2", Op::Upsert), env("t", "3", Op::Delete)].into()),
    );
    b.on_mark(&mark(&b, first.chunk, MarkKind::High));
    let fourth = b.next_read().expect("two held: the next is read");
    b.install(read(third.chunk, "150:150:", &[]));
    assert!(b.next_read().is_none(), "the table was read to its end");
    b.install(after_the_end(fourth.chunk));
    b.on_mark(&mark(&b, second.chunk, MarkKind::Low));
    assert_eq!(b.out.len(), 1, "the table is not complete before its last chunk is published");
    b.on_mark(&mark(&b, second.chunk, MarkKind::High));
    let items: Vec<LaneItem> = b.out.drain(..).map(|(_, item)| item).collect();
    assert!(matches!(&items[0], LaneItem::Batch(x) if ids(x) == ["1"]), "{items:?}");
    assert!(matches!(&items[1], LaneItem::Batch(x) if ids(x) == ["4"]), "{items:?}");
    assert_eq!(items[2], LaneItem::SnapshotComplete { indexes: vec![index("t")] });
    assert_eq!(items.len(), 3);
    assert_eq!((b.rows, b.dropped, b.batches), (2, 2, 2));
}

/// A failed read gives the request up with the chunks held for it (none of them is published
/// later, with a gap before it); the next request starts at its first chunk.
#[test]
fn a_failed_request_is_given_up_with_its_chunks_and_the_next_starts_afresh() {
    let (a, b2) = (SinkName::new("a").unwrap(), SinkName::new("b").unwrap());
    let mut b = Backfiller::new("x".into(), 2);
    b.push(a, vec![index("t")], vec![plan("t")], None);
    b.push(b2.clone(), vec![index("t")], vec![plan("t")], Some(vec!["7".into()]));
    let first = b.next_read().unwrap();
    let second = b.next_read().unwrap();
    b.install(read(first.chunk, "100:110:", &["1", "2"]));
    b.abandon();
    b.on_mark(&mark(&b, first.chunk, MarkKind::High));
    assert!(b.out.is_empty(), "nothing of the given-up request is published");
    let next = b.next_read().unwrap();
    assert!(next.chunk > second.chunk);
    assert_eq!(next.from, ReadFrom::First(Some(vec!["7".to_owned()])));
    b.install(read(next.chunk, "100:110:", &["8"]));
    b.on_mark(&mark(&b, next.chunk, MarkKind::High));
    let (to, item) = b.out.pop_front().unwrap();
    assert!(to == b2 && matches!(item, LaneItem::Batch(ref x) if ids(x) == ["8"]), "{item:?}");
}

/// A resync of `t` (its table rejoined: the sinks emptied it at that point of the stream): the
/// request being read publishes nothing more of `t` (its chunk held and the one being read are
/// dropped), goes on with its next table, and leaves `t` out of its `SnapshotComplete`; a
/// queued request that resumes `t` after a row, and one taken later, read it whole; a request
/// resolved while `t` was gone no longer names it.
#[test]
fn a_resync_drops_what_is_held_of_the_table_and_no_request_completes_it_unless_read_whole() {
    let (s1, s2, s3) = ["s1", "s2", "s3"].map(|s| SinkName::new(s).unwrap()).into();
    let mut b = Backfiller::new("src1".into(), 3);
    b.push(s1.clone(), vec![index("t"), index("u")], vec![plan("t"), plan("u")], None);
    b.push(s2.clone(), vec![index("t")], vec![plan("t")], Some(vec!["a".into(), "1".into()]));
    b.push(s3.clone(), vec![index("t"), index("u")], vec![plan("u")], None);
    let first = b.next_read().unwrap();
    b.install(read(first.chunk, "100:100:", &["1", "2", "3"]));
    let second = b.next_read().unwrap();
    b.on_mark(&mark(&b, first.chunk, MarkKind::Low));
    b.on_mark(&mark(&b, first.chunk, MarkKind::High));
    assert!(matches!(b.out.pop_front(), Some((_, LaneItem::Batch(ref x))) if ids(x) == ["1", "2", "3"]));
    b.install(read(second.chunk, "100:100:", &["4", "5", "6"]));
    let third = b.next_read().unwrap();
    b.resync(&index("t"), &[]);
    assert!(b.next_read().is_none(), "no more of t is read");
    for chunk in [second.chunk, third.chunk] {
        if chunk == third.chunk {
            b.install(read(chunk, "120:120:", &["7", "8", "9"]));
        }
        b.on_mark(&mark(&b, chunk, MarkKind::Low));
        b.on_mark(&mark(&b, chunk, MarkKind::High));
    }
    assert!(b.out.is_empty(), "the chunks of t held at the resync are dropped: {:?}", b.out);
    let next = b.next_read().unwrap();
    assert_eq!((next.plan.index.clone(), next.from.clone()), (index("u"), ReadFrom::First(None)));
    b.install(after_the_end(next.chunk));
    assert_eq!(b.out.pop_front(), Some((s1, LaneItem::SnapshotComplete { indexes: vec![index("u")] })));
    // The queued request resumed t after a row: read whole now.
    let next = b.next_read().unwrap();
    assert_eq!((next.plan.index.clone(), next.from.clone()), (index("t"), ReadFrom::First(None)));
    b.install(after_the_end(next.chunk));
    assert_eq!(
        b.out.pop_front(),
        Some((s2.clone(), LaneItem::SnapshotComplete { indexes: vec![index("t")] }))
    );
    // The one resolved while t was gone: without it.
    let next = b.next_read().unwrap();
    b.install(after_the_end(next.chunk));
    assert_eq!(b.out.pop_front(), Some((s3, LaneItem::SnapshotComplete { indexes: vec![index("u")] })));
    // A request taken after the resync that resumes t after a row: read whole.
    b.push(s2, vec![index("t")], vec![plan("t")], Some(vec!["a".into(), "1".into()]));
    assert_eq!(b.next_read().unwrap().from, ReadFrom::First(None));
}
