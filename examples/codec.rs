//! The wire form of lane items (`lanestream::codec`, feature `codec`): encode, decode, read in
//! place, and what corrupt bytes do.
//!
//! Encodes a `LaneItem::Batch` into an rkyv archive, decodes it back to an equal value, then
//! reads the same bytes in place with `view_batch` (a `BatchView` whose ids and documents borrow
//! from the buffer; nothing is deserialized). Finally it feeds the decoder truncated, garbage,
//! misaligned and bit-flipped bytes and a request's bytes: each gives a `CodecError` (or, for a
//! flip inside a document, a different but valid batch), never a panic. Every step is asserted;
//! a failed assertion exits non-zero.
//!
//! The `codec` feature is off by default: a user turns it on with
//! `lanestream = { version = "0.1", features = ["codec"] }`; this crate's examples get it through
//! its dev-dependencies.
//!
//! ```text
//! cargo run --example codec
//! ```

use std::sync::Arc;

use bytes::Bytes;
use lanestream::codec::{decode_item, encode_item, encode_request, view_batch, AlignedVec, CodecError};
use lanestream::{Batch, Envelope, IndexName, LaneItem, Op, Position, Request, SinkName};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let users = IndexName::new("public_users")?;
    let change = |id: &str, op, document: &'static [u8]| Envelope {
        index: users.clone(),
        id: id.into(),
        op,
        position: Some(Position(0x16B_3748)),
        document: Bytes::from_static(document),
        built_at_micros: None,
        relation: None,
        old_id: None,
        unchanged: Vec::new(),
    };
    let envelopes =
        vec![change("42", Op::Upsert, br#"{"id":42,"name":"Ada"}"#), change("7", Op::Delete, b"")];
    let item = LaneItem::Batch(Batch::new(Some(Position(0x16B_3748)), Arc::from(envelopes)));

    // Encode into an aligned buffer, then build the owned value back.
    let bytes: AlignedVec = encode_item(&item)?;
    println!("encoded a batch of 2 envelopes into {} bytes", bytes.len());
    assert_eq!(decode_item(&bytes)?, item);
    println!("decode_item: equal to the original");

    // Zero-copy: validate once, then read the archive where it lies.
    let view = view_batch(&bytes)?;
    println!(
        "view_batch: position {}, {} changes",
        view.position().map_or("none".into(), |p| p.to_string()),
        view.changes()
    );
    assert_eq!((view.position(), view.len()), (item.position(), 2));
    let buffer = bytes.as_ptr_range();
    for e in view.envelopes() {
        println!("  {} id {} {:?} '{}'", e.index(), e.id(), e.op(), String::from_utf8_lossy(e.document()));
        // The document is a slice of `bytes`, not a copy.
        assert!(e.document().is_empty() || buffer.contains(&e.document().as_ptr()));
    }

    // Corrupt input: an error to handle, never a panic.
    let truncated = &bytes[..bytes.len() - 1];
    let garbage = aligned(&[0xAB; 64]);
    let request = Request::backfill(SinkName::new("search")?, vec![users.clone()]);
    let a_request = encode_request(&request)?;
    for (what, input) in [("truncated", truncated), ("garbage", &garbage[..]), ("a request", &a_request[..])]
    {
        let err = decode_item(input).expect_err("corrupt input must be refused");
        println!("{what:>9}: {err}");
    }

    // Bytes cut from a larger buffer (a file, a socket read) may start at any address: the codec
    // refuses a misaligned start, and copying the bytes into an `AlignedVec` fixes that.
    let mut frame = AlignedVec::<16>::new();
    frame.push(0); // a one-byte header, say, so the archive starts one byte past an aligned address
    frame.extend_from_slice(&bytes);
    let unaligned = &frame[1..];
    let err = decode_item(unaligned).expect_err("a misaligned buffer must be refused");
    assert!(matches!(err, CodecError::Misaligned { .. }));
    println!("misaligned: {err}");
    assert_eq!(decode_item(&aligned(unaligned))?, item);

    // Flip every byte in turn: each flip gives an error or a valid batch, never a panic.
    let (mut refused, mut still_valid) = (0, 0);
    for at in 0..bytes.len() {
        let mut flipped = aligned(&bytes);
        flipped[at] ^= 0xFF;
        match decode_item(&flipped) {
            Ok(_) => still_valid += 1, // e.g. a flip inside a document's bytes
            Err(_) => refused += 1,
        }
    }
    println!("flipped each of {} bytes: {refused} refused, {still_valid} still valid", bytes.len());
    assert!(refused > 0);
    println!("ok: round trip, zero-copy view, corrupt bytes refused without a panic");
    Ok(())
}

/// `bytes` copied into a buffer aligned for the codec.
fn aligned(bytes: &[u8]) -> AlignedVec {
    let mut v = AlignedVec::new();
    v.extend_from_slice(bytes);
    v
}
