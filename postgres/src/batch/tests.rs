//! The builder's behaviour, fed wal2json lines (the reader's tests are `wal2json/tests.rs`), and
//! the value codec's.

use std::sync::Arc;

use lanestream::{Batch, Envelope, Op, Position};

use super::value::{is_json_number, plain, push_json_string};
use super::*;
use crate::wal2json::{Wal2JsonError, Wal2JsonErrorKind};

/// The builder's kind of a reader's error (every error these tests expect is one).
fn built(e: &Wal2JsonError) -> &BuildErrorKind {
    match e.kind() {
        Wal2JsonErrorKind::Build(kind) => kind,
        other => panic!("not the builder's error: {other}"),
    }
}

fn push_all(b: &mut TransactionBuilder, lines: &[&str]) -> Vec<Result<Option<Batch>, Wal2JsonError>> {
    lines.iter().enumerate().map(|(i, l)| b.push_line(i as u64 + 1, l.as_bytes())).collect()
}

fn one_batch(lines: &[&str]) -> Batch {
    let mut b = TransactionBuilder::new();
    let mut out = None;
    for r in push_all(&mut b, lines) {
        if let Some(batch) = r.expect("line accepted") {
            assert!(out.replace(batch).is_none(), "more than one batch");
        }
    }
    b.finish(lines.len() as u64).expect("no open transaction");
    out.expect("a batch")
}

pub(crate) const PK_ID: &str = r#""pk":[{"name":"id","type":"integer"}]"#;

/// A wal2json insert line of table `s.t` keyed by `id`.
pub(crate) fn insert_id(id: u32) -> String {
    format!(r#"{{"action":"I","schema":"s","table":"t","columns":[{{"name":"id","value":{id}}}],{PK_ID}}}"#)
}

pub(crate) fn doc(e: &Envelope) -> &str {
    std::str::from_utf8(&e.document).expect("UTF-8 document")
}

#[test]
fn maps_each_action() {
    let i = format!(
        r#"{{"action":"I","xid":9,"lsn":"0/1","schema":"public","table":"users","columns":[{{"name":"id","type":"integer","value":1}},{{"name":"name","type":"text","value":"Zoë \"Z\""}},{{"name":"n","type":"numeric","value":12345678901234567890.123456789}},{{"name":"e","type":"text","value":null}}],{PK_ID}}}"#
    );
    let u = format!(
        r#"{{"action":"U","schema":"public","table":"users","columns":[{{"name":"id","type":"integer","value":1}},{{"name":"name","type":"text","value":"Z"}}],{PK_ID}}}"#
    );
    let d = format!(
        r#"{{"action":"D","schema":"public","table":"users","identity":[{{"name":"id","type":"integer","value":2}}],{PK_ID}}}"#
    );
    let t = r#"{"action":"T","schema":"public","table":"users"}"#;
    let batch = one_batch(&[
        r#"{"action":"B","xid":9,"lsn":"1/2","nextlsn":"1/3"}"#,
        &i,
        r#"{"action":"M","xid":9,"transactional":true,"prefix":"p","content":"c"}"#,
        &u,
        &d,
        t,
        r#"{"action":"C","xid":9,"lsn":"1/2","nextlsn":"1/3"}"#,
    ]);
    let pos = Position((1 << 32) | 2);
    assert_eq!(batch.position, Some(pos));
    assert_eq!(batch.changes, 4);
    let e = &batch.envelopes;
    assert_eq!(e.len(), 4);
    assert!(e.iter().all(|e| e.position == Some(pos) && e.index.as_str() == "public_users"));
    assert_eq!((e[0].op, e[0].id.as_str()), (Op::Upsert, "1"));
    assert_eq!(doc(&e[0]), r#"{"id":1,"name":"Zoë \"Z\"","n":12345678901234567890.123456789,"e":null}"#);
    assert_eq!((e[1].op, e[1].id.as_str(), doc(&e[1])), (Op::Upsert, "1", r#"{"id":1,"name":"Z"}"#));
    assert_eq!((e[2].op, e[2].id.as_str(), doc(&e[2])), (Op::Delete, "2", r#"{"id":2}"#));
    assert_eq!((e[3].op, e[3].id.as_str(), doc(&e[3])), (Op::Truncate, "", ""));
    // All documents of the transaction live in one buffer, back to back.
    let end0 = e[0].document.as_ptr() as usize + e[0].document.len();
    assert_eq!(end0, e[1].document.as_ptr() as usize);
}

#[test]
fn p5_key_change_is_an_upsert_naming_the_old_id_then_its_delete_and_one_change() {
    let u = format!(
        r#"{{"action":"U","schema":"public","table":"users","columns":[{{"name":"id","type":"integer","value":7}},{{"name":"v","type":"text","value":"x"}}],"identity":[{{"name":"id","type":"integer","value":3}}],{PK_ID}}}"#
    );
    let batch = one_batch(&[r#"{"action":"B"}"#, &u, r#"{"action":"C","lsn":"0/5"}"#]);
    assert_eq!(batch.changes, 1);
    let e = &batch.envelopes;
    assert_eq!(e.len(), 2);
    assert_eq!((e[0].op, e[0].id.as_str(), doc(&e[0])), (Op::Upsert, "7", r#"{"id":7,"v":"x"}"#));
    assert_eq!(e[0].old_id.as_deref(), Some("3"));
    assert_eq!((e[1].op, e[1].id.as_str(), doc(&e[1])), (Op::Delete, "3", r#"{"id":3}"#));
    assert_eq!(e[1].old_id, None);
}

#[test]
fn update_with_same_key_identity_is_one_upsert() {
    // REPLICA IDENTITY FULL with a primary key: identity is the whole old row, same key.
    let u = format!(
        r#"{{"action":"U","schema":"s","table":"t","columns":[{{"name":"id","type":"integer","value":7}},{{"name":"v","type":"text","value":"new"}}],"identity":[{{"name":"id","type":"integer","value":7}},{{"name":"v","type":"text","value":"old"}}],{PK_ID}}}"#
    );
    let batch = one_batch(&[r#"{"action":"B"}"#, &u, r#"{"action":"C","lsn":"0/5"}"#]);
    assert_eq!(batch.envelopes.len(), 1);
    assert_eq!(batch.envelopes[0].op, Op::Upsert);
}

#[test]
fn composite_keys_and_id_escaping() {
    let i = r#"{"action":"I","schema":"s","table":"t","columns":[{"name":"a","type":"text","value":"x:y\\z"},{"name":"b","type":"integer","value":5},{"name":"c","type":"text","value":"\u00e9"}],"pk":[{"name":"c","type":"text"},{"name":"a","type":"text"},{"name":"b","type":"integer"}]}"#;
    let batch = one_batch(&[r#"{"action":"B"}"#, i, r#"{"action":"C","lsn":"0/5"}"#]);
    assert_eq!(batch.envelopes[0].id, r"é:x\:y\\z:5");
}

#[test]
fn tables_without_a_key_use_every_value() {
    let i = r#"{"action":"I","schema":"public","table":"log","columns":[{"name":"at","type":"text","value":"t1"},{"name":"n","type":"integer","value":null}],"pk":[]}"#;
    let u = r#"{"action":"U","schema":"public","table":"log","columns":[{"name":"at","type":"text","value":"t1"},{"name":"n","type":"integer","value":2}],"identity":[{"name":"at","type":"text","value":"t1"},{"name":"n","type":"integer","value":null}],"pk":[]}"#;
    let d = r#"{"action":"D","schema":"public","table":"log","identity":[{"name":"at","type":"text","value":"t1"},{"name":"n","type":"integer","value":2}],"pk":[]}"#;
    let batch = one_batch(&[r#"{"action":"B"}"#, i, u, d, r#"{"action":"C","lsn":"0/5"}"#]);
    let ids: Vec<_> = batch.envelopes.iter().map(|e| (e.op, e.id.as_str())).collect();
    assert_eq!(
        ids,
        [(Op::Upsert, r"t1:\N"), (Op::Upsert, "t1:2"), (Op::Delete, r"t1:\N"), (Op::Delete, "t1:2")]
    );
    assert_eq!(batch.changes, 3);
}

/// Every batch of `lines` (one builder), or the first error.
fn batches(b: &mut TransactionBuilder, lines: &[&str]) -> Result<Vec<Batch>, Wal2JsonError> {
    let mut out = Vec::new();
    for r in push_all(b, lines) {
        out.extend(r?);
    }
    Ok(out)
}

/// (op, id, document) of every envelope.
fn ops(batches: &[Batch]) -> Vec<(Op, String, String)> {
    batches.iter().flat_map(|b| b.envelopes.iter()).map(|e| (e.op, e.id.clone(), doc(e).to_owned())).collect()
}

fn txn(lsn: &str, lines: &[&str]) -> Vec<String> {
    let mut v = vec![format!(r#"{{"action":"B","lsn":"{lsn}"}}"#)];
    v.extend(lines.iter().map(|l| (*l).to_owned()));
    v.push(format!(r#"{{"action":"C","lsn":"{lsn}"}}"#));
    v
}

/// The issue's `accounts` table (no primary key, `REPLICA IDENTITY USING INDEX accounts_email`),
/// as wal2json 2.5 wrote it: insert, update of the balance, change of the email, delete.
const ACCOUNTS: [&str; 4] = [
    r#"{"action":"I","schema":"public","table":"accounts","columns":[{"name":"email","type":"text","value":"a@x"},{"name":"name","type":"text","value":"Ann"},{"name":"balance","type":"integer","value":10}],"pk":[]}"#,
    r#"{"action":"U","schema":"public","table":"accounts","columns":[{"name":"email","type":"text","value":"a@x"},{"name":"name","type":"text","value":"Ann"},{"name":"balance","type":"integer","value":20}],"identity":[{"name":"email","type":"text","value":"a@x"}],"pk":[]}"#,
    r#"{"action":"U","schema":"public","table":"accounts","columns":[{"name":"email","type":"text","value":"b@x"},{"name":"name","type":"text","value":"Ann"},{"name":"balance","type":"integer","value":20}],"identity":[{"name":"email","type":"text","value":"a@x"}],"pk":[]}"#,
    r#"{"action":"D","schema":"public","table":"accounts","identity":[{"name":"email","type":"text","value":"b@x"}],"pk":[]}"#,
];

fn accounts_lines() -> Vec<String> {
    let mut lines = Vec::new();
    for (i, l) in ACCOUNTS.iter().enumerate() {
        lines.extend(txn(&format!("0/{}", i + 1), &[l]));
    }
    lines
}

#[test]
fn index_identity_keys_rows_by_the_index_columns_when_told() {
    let lines = accounts_lines();
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let mut b = TransactionBuilder::new();
    b.set_key_columns("public", "accounts", Some(vec!["email".into()]));
    let got = ops(&batches(&mut b, &lines).expect("no error"));
    let s = |x: &str| x.to_owned();
    assert_eq!(
        got,
        [
            (Op::Upsert, s("a@x"), s(r#"{"email":"a@x","name":"Ann","balance":10}"#)),
            (Op::Upsert, s("a@x"), s(r#"{"email":"a@x","name":"Ann","balance":20}"#)),
            (Op::Upsert, s("b@x"), s(r#"{"email":"b@x","name":"Ann","balance":20}"#)),
            (Op::Delete, s("a@x"), s(r#"{"email":"a@x"}"#)),
            (Op::Delete, s("b@x"), s(r#"{"email":"b@x"}"#)),
        ]
    );
    // The same through a lookup (what the live source does with the catalog), asked once.
    // Relaxed throughout these tests: the look-up runs on this thread, inside the builder's
    // calls; the atomics are there only because the look-up must be `Send`, and order nothing.
    let asked = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counter = asked.clone();
    let mut b = TransactionBuilder::new().with_key_lookup(Box::new(move |schema, table| {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok((schema == "public" && table == "accounts")
            .then(|| CatalogKey::IdentityIndex(vec!["email".to_owned()])))
    }));
    assert_eq!(ops(&batches(&mut b, &lines).expect("no error")), got);
    assert_eq!(asked.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[test]
fn index_identity_not_told_fails_loudly_then_uses_the_index() {
    let lines = accounts_lines();
    let mut b = TransactionBuilder::new();
    // The insert can only use every column...
    let first = one_of(b.push_line(1, lines[0].as_bytes()), b.push_line(2, lines[1].as_bytes()));
    assert!(first.is_none());
    let batch = b.push_line(3, lines[2].as_bytes()).unwrap().unwrap();
    assert_eq!(batch.envelopes[0].id, "a@x:Ann:10");
    // ...the first identity shows the index: reported, and its transaction discarded.
    b.push_line(4, lines[3].as_bytes()).unwrap();
    let e = b.push_line(5, lines[4].as_bytes()).unwrap_err();
    assert!(
        matches!(built(&e), BuildErrorKind::UnknownReplicaIdentity { table, columns } if table == "public.accounts" && columns == &["email"]),
        "{e}"
    );
    let e = b.push_line(6, lines[5].as_bytes()).unwrap_err();
    assert!(matches!(built(&e), BuildErrorKind::DamagedTransaction { .. }), "{e}");
    assert_eq!(e.lost_changes(), 1);
    // From then on the index columns are the key.
    let rest: Vec<&str> = lines[6..].iter().map(String::as_str).collect();
    let got: Vec<_> = ops(&batches(&mut b, &rest).unwrap()).into_iter().map(|(op, id, _)| (op, id)).collect();
    assert_eq!(got, [(Op::Upsert, "b@x".into()), (Op::Delete, "a@x".into()), (Op::Delete, "b@x".into())]);
}

/// An insert into `public.t` with columns `(name, value)` and `pk` names.
fn keyed_insert(columns: &[(&str, &str)], pk: &[&str]) -> String {
    let cols: Vec<String> =
        columns.iter().map(|(n, v)| format!(r#"{{"name":"{n}","type":"numeric","value":{v}}}"#)).collect();
    let pk: Vec<String> = pk.iter().map(|n| format!(r#"{{"name":"{n}","type":"numeric"}}"#)).collect();
    format!(
        r#"{{"action":"I","schema":"public","table":"t","columns":[{}],"pk":[{}],"lsn":"0/AB"}}"#,
        cols.join(","),
        pk.join(",")
    )
}

#[test]
fn keys_follow_the_pk_each_change_carries_across_key_ddl() {
    // The catalog says (today) the key is `uid`; the stream's changes carry their own `pk`:
    // before a rename (`id`), after it (`uid`), after the key was redefined as (uid, k).
    let asked = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counter = asked.clone();
    let mut b = TransactionBuilder::new().with_key_lookup(Box::new(move |_, _| {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Some(CatalogKey::PrimaryKey(vec!["uid".to_owned()])))
    }));
    let lines = [
        txn("0/1", &[&keyed_insert(&[("id", "1"), ("k", "1")], &["id"])]),
        txn("0/2", &[&keyed_insert(&[("uid", "2"), ("k", "1")], &["uid"])]),
        txn("0/3", &[&keyed_insert(&[("uid", "3"), ("k", "1")], &["uid", "k"])]),
        txn("0/4", &[&keyed_insert(&[("uid", "3"), ("k", "2")], &["uid", "k"])]),
    ]
    .concat();
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let ids: Vec<String> = ops(&batches(&mut b, &lines).expect("keys follow the stream"))
        .into_iter()
        .map(|(_, id, _)| id)
        .collect();
    assert_eq!(ids, ["1", "2", "3:1", "3:2"]);
    // Asked again only when the key the stream carries changed (id → uid → (uid, k)).
    assert_eq!(asked.load(std::sync::atomic::Ordering::Relaxed), 3);
}

#[test]
fn an_identity_index_is_looked_up_again_when_the_rows_no_longer_have_its_columns() {
    // REPLICA IDENTITY USING INDEX on `email`, renamed to `mail` while running.
    let answers = Arc::new(std::sync::Mutex::new(vec!["mail", "email"]));
    let next = answers.clone();
    let mut b = TransactionBuilder::new().with_key_lookup(Box::new(move |_, _| {
        let column = next.lock().expect("lock").pop().expect("asked too often");
        Ok(Some(CatalogKey::IdentityIndex(vec![column.to_owned()])))
    }));
    let insert = |col: &str, v: &str| {
        format!(
            r#"{{"action":"I","schema":"public","table":"t","columns":[{{"name":"{col}","type":"text","value":"{v}"}},{{"name":"n","type":"integer","value":1}}],"pk":[]}}"#
        )
    };
    let lines = [txn("0/1", &[&insert("email", "a")]), txn("0/2", &[&insert("mail", "b")])].concat();
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let ids: Vec<String> =
        ops(&batches(&mut b, &lines).expect("looked up again")).into_iter().map(|(_, id, _)| id).collect();
    assert_eq!(ids, ["a", "b"]);
    assert!(answers.lock().expect("lock").is_empty());
}

#[test]
fn a_failed_key_lookup_fails_the_transaction_and_never_keys_by_every_column() {
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let failing = fail.clone();
    let mut b = TransactionBuilder::new().with_key_lookup(Box::new(move |_, _| {
        if failing.load(std::sync::atomic::Ordering::Relaxed) {
            return Err("the side connection was terminated".into());
        }
        Ok(Some(CatalogKey::IdentityIndex(vec!["email".to_owned()])))
    }));
    let lines = accounts_lines();
    b.push_line(1, lines[0].as_bytes()).expect("B");
    let e = b.push_line(2, lines[1].as_bytes()).unwrap_err();
    assert!(
        matches!(built(&e), BuildErrorKind::KeyLookupFailed { table, .. } if table == "public.accounts"),
        "{e}"
    );
    assert!(!e.is_recoverable(), "reading on after a failed look-up would lose the transaction");
    assert!(e.to_string().contains("the side connection was terminated"), "{e}");
    // Its transaction is never published...
    let e = b.push_line(3, lines[2].as_bytes()).unwrap_err();
    assert!(matches!(built(&e), BuildErrorKind::DamagedTransaction { .. }), "{e}");
    // ...and nothing was cached as "no key": once the look-up works, the index keys the rows.
    fail.store(false, std::sync::atomic::Ordering::Relaxed);
    let rest: Vec<&str> = lines[3..].iter().map(String::as_str).collect();
    let ids: Vec<String> =
        ops(&batches(&mut b, &rest).expect("ok")).into_iter().map(|(_, id, _)| id).collect();
    assert_eq!(ids, ["a@x", "b@x", "a@x", "b@x"]);
}

#[test]
fn a_null_in_a_key_column_fails_the_transaction_naming_table_column_and_lsn() {
    // wal2json writes numeric NaN, Infinity and -Infinity as null: three rows, one id.
    for (pk, key) in [(&["id"][..], None), (&[][..], Some(vec!["id".to_owned()]))] {
        let mut b = TransactionBuilder::new();
        if let Some(key) = key {
            b.set_key_columns("public", "t", Some(key));
        }
        let lines = txn("0/10", &[&keyed_insert(&[("id", "null"), ("v", "1")], pk)]);
        b.push_line(1, lines[0].as_bytes()).expect("B");
        let e = b.push_line(2, lines[1].as_bytes()).unwrap_err();
        assert!(
            matches!(built(&e), BuildErrorKind::NullKey { table, column, lsn }
                if table == "public.t" && column == "id" && lsn == "0/AB"),
            "{e}"
        );
        assert!(e.to_string().contains("NaN"), "{e}");
        let e = b.push_line(3, lines[2].as_bytes()).unwrap_err();
        assert!(matches!(built(&e), BuildErrorKind::DamagedTransaction { .. }), "{e}");
    }
    // Without a key, NULL is a value like any other (REPLICA IDENTITY FULL tables).
    let mut b = TransactionBuilder::new();
    let lines = txn("0/10", &[&keyed_insert(&[("id", "null"), ("v", "1")], &[])]);
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    assert_eq!(ops(&batches(&mut b, &lines).expect("ok"))[0].1, "\\N:1");
}

fn one_of<T>(a: Result<Option<T>, Wal2JsonError>, b: Result<Option<T>, Wal2JsonError>) -> Option<T> {
    a.unwrap().or(b.unwrap())
}

#[test]
fn index_identity_beside_a_primary_key() {
    // `pki`: primary key id, REPLICA IDENTITY USING INDEX on email: the identity lacks the pk.
    let d = r#"{"action":"D","schema":"public","table":"pki","identity":[{"name":"email","type":"text","value":"e"}],"pk":[{"name":"id","type":"integer"}]}"#;
    let i = r#"{"action":"I","schema":"public","table":"pki","columns":[{"name":"id","type":"integer","value":1},{"name":"email","type":"text","value":"e"},{"name":"b","type":"integer","value":1}],"pk":[{"name":"id","type":"integer"}]}"#;
    let lines = [txn("0/1", &[i]), txn("0/2", &[d])].concat();
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let e = batches(&mut TransactionBuilder::new(), &lines).unwrap_err();
    assert!(
        matches!(built(&e), BuildErrorKind::MissingKeyColumn { column, side: "identity" } if column == "id")
    );
    let mut b = TransactionBuilder::new();
    b.set_key_columns("public", "pki", Some(vec!["email".into()]));
    let got: Vec<_> =
        ops(&batches(&mut b, &lines).unwrap()).into_iter().map(|(op, id, _)| (op, id)).collect();
    assert_eq!(got, [(Op::Upsert, "e".into()), (Op::Delete, "e".into())]);
}

#[test]
fn full_identity_without_a_key_keeps_one_id_and_fills_toasted_columns() {
    // `tf`: no primary key, REPLICA IDENTITY FULL, `big` stored externally; the update of `v`
    // leaves `big` out of its columns (unchanged TOAST) but the identity has the whole old row.
    let i = r#"{"action":"I","schema":"public","table":"tf","columns":[{"name":"k","type":"text","value":"k"},{"name":"big","type":"text","value":"BIG"},{"name":"v","type":"integer","value":1}],"pk":[]}"#;
    let u = r#"{"action":"U","schema":"public","table":"tf","columns":[{"name":"k","type":"text","value":"k"},{"name":"v","type":"integer","value":2}],"identity":[{"name":"k","type":"text","value":"k"},{"name":"big","type":"text","value":"BIG"},{"name":"v","type":"integer","value":1}],"pk":[]}"#;
    let d = r#"{"action":"D","schema":"public","table":"tf","identity":[{"name":"k","type":"text","value":"k"},{"name":"big","type":"text","value":"BIG"},{"name":"v","type":"integer","value":2}],"pk":[]}"#;
    let lines = txn("0/1", &[i, u, d]);
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let s = |x: &str| x.to_owned();
    assert_eq!(
        ops(&batches(&mut TransactionBuilder::new(), &lines).unwrap()),
        [
            (Op::Upsert, s("k:BIG:1"), s(r#"{"k":"k","big":"BIG","v":1}"#)),
            (Op::Upsert, s("k:BIG:2"), s(r#"{"k":"k","big":"BIG","v":2}"#)),
            (Op::Delete, s("k:BIG:1"), s(r#"{"k":"k","big":"BIG","v":1}"#)),
            (Op::Delete, s("k:BIG:2"), s(r#"{"k":"k","big":"BIG","v":2}"#)),
        ]
    );
    // With a primary key and the default identity, the update's document lacks the column
    // (sinks merge) and its id is the key.
    let u = format!(
        r#"{{"action":"U","schema":"public","table":"t","columns":[{{"name":"id","type":"integer","value":1}},{{"name":"v","type":"integer","value":2}}],{PK_ID}}}"#
    );
    let batch = one_batch(&[r#"{"action":"B"}"#, &u, r#"{"action":"C","lsn":"0/5"}"#]);
    assert_eq!((batch.envelopes[0].id.as_str(), doc(&batch.envelopes[0])), ("1", r#"{"id":1,"v":2}"#));
}

#[test]
fn null_and_the_text_null_get_different_ids() {
    // `f`: no key, REPLICA IDENTITY FULL, rows (NULL, 1) and ('null', 1); then the NULL row's
    // b is set to 2 and the 'null' row is deleted.
    let rows = [
        r#"{"action":"I","schema":"public","table":"f","columns":[{"name":"a","type":"text","value":null},{"name":"b","type":"integer","value":1}],"pk":[]}"#,
        r#"{"action":"I","schema":"public","table":"f","columns":[{"name":"a","type":"text","value":"null"},{"name":"b","type":"integer","value":1}],"pk":[]}"#,
        r#"{"action":"U","schema":"public","table":"f","columns":[{"name":"a","type":"text","value":null},{"name":"b","type":"integer","value":2}],"identity":[{"name":"a","type":"text","value":null},{"name":"b","type":"integer","value":1}],"pk":[]}"#,
        r#"{"action":"D","schema":"public","table":"f","identity":[{"name":"a","type":"text","value":"null"},{"name":"b","type":"integer","value":1}],"pk":[]}"#,
        // Strings that look like the escapes stay apart: the text `\N` and `a:b`.
        r#"{"action":"I","schema":"public","table":"f","columns":[{"name":"a","type":"text","value":"\\N"},{"name":"b","type":"integer","value":null}],"pk":[]}"#,
        r#"{"action":"I","schema":"public","table":"f","columns":[{"name":"a","type":"jsonb","value":"null"},{"name":"b","type":"text","value":"a:b"}],"pk":[]}"#,
    ];
    let lines = txn("0/1", &rows);
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let got: Vec<_> = ops(&batches(&mut TransactionBuilder::new(), &lines).unwrap())
        .into_iter()
        .map(|(op, id, _)| (op, id))
        .collect();
    let s = |x: &str| x.to_owned();
    assert_eq!(
        got,
        [
            (Op::Upsert, s(r"\N:1")),
            (Op::Upsert, s("null:1")),
            (Op::Upsert, s(r"\N:2")),
            (Op::Delete, s(r"\N:1")),
            (Op::Delete, s("null:1")),
            (Op::Upsert, s(r"\\N:\N")),
            (Op::Upsert, s(r"null:a\:b")),
        ]
    );
}

#[test]
fn huge_transactions_come_in_chunks_and_only_the_last_is_positioned() {
    let i = insert_id;
    let u = format!(
        r#"{{"action":"U","schema":"s","table":"t","columns":[{{"name":"id","value":9}}],"identity":[{{"name":"id","value":5}}],{PK_ID}}}"#
    );
    let mut lines = vec![r#"{"action":"B","xid":3,"lsn":"0/A0"}"#.to_owned()];
    lines.extend((1..=4).map(i));
    lines.push(u);
    lines.push(r#"{"action":"C","xid":3,"lsn":"0/A0"}"#.to_owned());
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let mut b = TransactionBuilder::new().with_max_batch_changes(Some(2));
    let got = batches(&mut b, &lines).unwrap();
    let shape: Vec<_> = got
        .iter()
        .map(|b| {
            let ids: Vec<_> = b.envelopes.iter().map(|e| (e.op, e.id.as_str(), e.position)).collect();
            (b.position, b.changes, b.offset, ids)
        })
        .collect();
    let p = Some(Position(0xA0));
    // Each batch's offset: the envelopes of the transaction before it (I4).
    assert_eq!(
        shape,
        [
            (None, 2, 0, vec![(Op::Upsert, "1", p), (Op::Upsert, "2", p)]),
            (None, 2, 2, vec![(Op::Upsert, "3", p), (Op::Upsert, "4", p)]),
            (p, 1, 4, vec![(Op::Upsert, "9", p), (Op::Delete, "5", p)]),
        ]
    );
    assert_eq!(b.transactions(), 1);
    // The next transaction starts at offset 0 again.
    let again: Vec<String> = lines.iter().map(|l| l.replace("0/A0", "0/B0")).collect();
    let got = batches(&mut b, &again.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    assert_eq!(got.iter().map(|b| b.offset).collect::<Vec<_>>(), [0, 2, 4]);
    // A multiple of the chunk size: the C gives an empty positioned batch.
    let mut b = TransactionBuilder::new().with_max_batch_changes(Some(5));
    let got = batches(&mut b, &lines).unwrap();
    assert_eq!(
        got.iter().map(|b| (b.position, b.changes, b.offset)).collect::<Vec<_>>(),
        [(None, 5, 0), (p, 0, 6)]
    );
    // A bad line after a chunk: the C says how many chunks are out.
    let mut damaged = lines.clone();
    damaged.insert(4, "not json");
    let mut b = TransactionBuilder::new().with_max_batch_changes(Some(2));
    let results = push_all(&mut b, &damaged);
    assert!(matches!(&results[2], Ok(Some(chunk)) if chunk.position.is_none()));
    assert!(results[4].is_err());
    let e = results.last().unwrap().as_ref().unwrap_err();
    assert!(
        matches!(built(e), BuildErrorKind::DamagedTransaction { chunks: 1, changes: 5, bad_lines: 1, .. }),
        "{e}"
    );
    assert_eq!(e.lost_changes(), 6);
}

#[test]
fn index_names_are_normalised() {
    assert_eq!(index_name("public", "users").as_str(), "public_users");
    assert_eq!(index_name("Inventory", "Stock Items").as_str(), "inventory_stock_items");
    assert_eq!(index_name("1s", "t-é").as_str(), "_1s_t__");
    let long = index_name("s", &"x".repeat(100));
    assert_eq!(long.as_str().len(), lanestream::MAX_NAME_LEN);
}

#[test]
fn empty_transactions_and_messages() {
    let mut b = TransactionBuilder::new();
    assert!(b
        .push_line(1, br#"{"action":"M","xid":null,"transactional":false,"prefix":"p","content":"c"}"#)
        .unwrap()
        .is_none());
    assert!(b.push_line(2, br#"  {"action":"B","xid":1}  "#).unwrap().is_none());
    let batch = b.push_line(3, b"{\"action\":\"C\",\"xid\":1,\"lsn\":\"0/10\"}\r").unwrap().unwrap();
    assert_eq!((batch.position, batch.changes, batch.envelopes.len()), (Some(Position(16)), 0, 0));
    assert_eq!(b.transactions(), 1);
}

// --- the value codec ------------------------------------------------------------------------

fn json_string(s: &str) -> String {
    let mut out = String::new();
    push_json_string(&mut out, s);
    out
}

#[test]
fn json_strings_are_escaped_as_serde_json_reads_them() {
    for s in ["", "plain", "q\"b\\", "\u{0}\u{1f}\u{7f}", "\n\r\t\u{8}\u{c}", "é🚀", "a\u{2028}b"] {
        let j = json_string(s);
        assert_eq!(serde_json::from_str::<String>(&j).expect("valid JSON"), s, "{j}");
        assert_eq!(plain(s), !j[1..j.len() - 1].contains('\\'), "{s:?}");
    }
}

#[test]
fn every_byte_to_escape_is_found_at_every_position() {
    // The clean prefix is skipped 8 bytes at a time: each escaped byte, in each word position,
    // before and after the first word, is escaped as serde_json does.
    for special in ['"', '\\', '\u{0}', '\n', '\u{1f}'] {
        for at in 0..20 {
            let mut s: String = "abcdefghijklmnopqrstuvwx".into();
            s.replace_range(at..=at, &special.to_string());
            assert_eq!(json_string(&s), serde_json::to_string(&s).unwrap_or_default(), "{s:?}");
        }
    }
    // Bytes that sit next to the escaped ones (0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80+) are not.
    let s = " !#[]\u{7f}é abcdefgh";
    assert_eq!(json_string(s), format!("\"{s}\""));
}

#[test]
fn numbers_are_checked_against_the_json_grammar() {
    for ok in ["0", "-0", "12.50", "1e+300", "1E-5", "-0.01", "9007199254740993"] {
        assert!(is_json_number(ok), "{ok}");
    }
    for bad in ["", "-", "01", "1.", ".5", "1e", "+1", "1e+", "0x10", "1 ", "NaN"] {
        assert!(!is_json_number(bad), "{bad}");
    }
}

#[test]
fn text_values_become_json_by_their_columns_type() {
    use super::value::push_json_value;
    // (type OID, text, JSON or what it should have been)
    let cases: [(u32, &str, Result<&str, &str>); 14] = [
        (16, "t", Ok("true")),
        (16, "f", Ok("false")),
        (16, "true", Err("a bool (t or f)")),
        // The specials are matched without regard to case, and written as PostgreSQL spells them.
        (1700, "nan", Ok(r#""NaN""#)),
        (701, "-INFINITY", Ok(r#""-Infinity""#)),
        (700, "inf", Err("a number")),
        (20, "1_000", Err("a number")),
        (21, "", Err("a number")),
        (26, "4294967295", Ok("4294967295")),
        // bytea: hex digits without `\x`; the escape format's text is kept as it is.
        (17, r"\x0aFF", Ok(r#""0aFF""#)),
        (17, r"ab\000", Ok(r#""ab\\000""#)),
        (25, "a\"b", Ok(r#""a\"b""#)),
        (3802, r#"{"k":[1]}"#, Ok(r#""{\"k\":[1]}""#)),
        // A type the codec does not know (a user-defined one): its text.
        (16_400, "happy", Ok(r#""happy""#)),
    ];
    for (type_oid, text, expected) in cases {
        let mut out = String::from("[");
        let got = push_json_value(type_oid, text, &mut out).map(|()| &out[1..]);
        assert_eq!(got, expected, "{type_oid} {text:?}");
        if expected.is_err() {
            assert_eq!(out, "[", "nothing written for {text:?}");
        }
    }
}

#[test]
fn json_str_reads_a_strings_text_borrowing_it_unless_it_has_escapes() {
    use super::value::json_str;
    use std::borrow::Cow;
    assert!(matches!(json_str(r#""a:b""#), Some(Cow::Borrowed("a:b"))));
    assert!(matches!(json_str(r#""a\nb\u00e9""#), Some(Cow::Owned(s)) if s == "a\nbé"));
    // Not strings, or strings that do not unescape.
    for text in ["1", "null", r#""a"#, "a\"", r#""\ud800""#, r#""\q""#] {
        assert_eq!(json_str(text), None, "{text}");
    }
}

#[test]
fn a_damaged_transaction_says_to_drop_its_chunks_only_when_some_were_returned() {
    let damaged = |chunks| BuildErrorKind::DamagedTransaction {
        begun: 1,
        lsn: "0/10".into(),
        first_bad: 3,
        bad_lines: 1,
        changes: 4,
        chunks,
    };
    assert!(!damaged(0).to_string().contains("chunks"), "{}", damaged(0));
    assert!(damaged(2)
        .to_string()
        .ends_with("(2 chunks of it were already returned unpositioned: drop them)"));
    // Which kinds discard the open transaction (a caller drops its chunks on them).
    let kinds: [(BuildErrorKind, bool); 5] = [
        (damaged(0), true),
        (BuildErrorKind::Truncated { begun: 1 }, true),
        (BuildErrorKind::XidMismatch { begin: 1, commit: 2 }, true),
        (BuildErrorKind::OutsideTransaction { action: 'I' }, false),
        (BuildErrorKind::MissingKeyColumn { column: "id".into(), side: "columns" }, false),
    ];
    for (kind, discards) in kinds {
        let text = kind.to_string();
        assert_eq!(BuildError::new(1, kind).open_transaction_discarded(), discards, "{text}");
    }
}

proptest::proptest! {
    #[test]
    fn any_string_is_written_as_the_json_string_of_itself(s in ".*") {
        let j = json_string(&s);
        proptest::prop_assert_eq!(serde_json::from_str::<String>(&j).ok(), Some(s.clone()));
        // The same bytes as serde_json writes (and PostgreSQL's escape_json, which wal2json uses).
        proptest::prop_assert_eq!(j, serde_json::to_string(&s).unwrap_or_default());
    }

}
