//! Recovery tells a torn tail from corruption (issue 19, fault 8): a crash leaves no whole,
//! CRC-valid record after a torn one, so a bad record of the last segment followed by a valid
//! one is damage to acknowledged data — refused with `OpenError::Corrupt` naming the file and the
//! bad record's offset, with nothing truncated — while a genuine torn tail (cut mid-record,
//! garbage after it) is still truncated and the log opens.

use crate::log_support;

use std::fs;
use std::path::{Path, PathBuf};

use lanestream_log::{EventLog, LogOptions, OpenError};
use log_support::{all, crc32c_of, ev_data, positions, record_starts, temp_dir};

/// The one segment of `dir`.
fn only_segment(dir: &Path) -> PathBuf {
    let segs: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    assert_eq!(segs.len(), 1, "{segs:?}");
    segs.into_iter().next().unwrap()
}

/// A log in `dir` of `n` one-event appends (distinct types, tags and payloads); returns its
/// segment's path, its bytes and the offsets at which its records start
/// ([`record_starts`]).
fn log_of(dir: &Path, n: usize) -> (PathBuf, Vec<u8>, Vec<usize>) {
    let log = EventLog::open(dir, LogOptions::default()).unwrap();
    for i in 0..n {
        log.append(vec![ev_data(&format!("Type{i}"), &[&format!("k:{i}")], format!("payload {i}"))], None)
            .unwrap();
    }
    log.close();
    drop(log);
    let seg = only_segment(dir);
    let bytes = fs::read(&seg).unwrap();
    let (starts, end) = record_starts(&bytes);
    assert_eq!((starts.len(), end), (n, bytes.len()));
    (seg, bytes, starts)
}

/// Opens `dir` expecting `Corrupt` for `seg` at `offset`, and checks that the segment's bytes
/// are still `bytes`.
fn assert_corrupt_untouched(dir: &Path, seg: &Path, bytes: &[u8], offset: usize, what: &str) {
    match EventLog::open(dir, LogOptions::default()) {
        Err(OpenError::Corrupt { segment, offset: at, reason }) => {
            assert!(segment.ends_with(seg.file_name().unwrap()), "{what}: names {segment:?}");
            assert_eq!(at, offset as u64, "{what}: offset ({reason})");
        }
        Err(e) => panic!("{what}: expected Corrupt, got {e}"),
        Ok(log) => panic!("{what}: opened with positions {:?}", positions(&all(&log.reader()))),
    }
    assert!(fs::read(seg).unwrap() == bytes, "{what}: a refused open changed the segment");
}

#[test]
fn a_flipped_bit_before_valid_records_of_the_last_segment_is_corruption_and_nothing_is_truncated() {
    let dir = temp_dir("flip-middle");
    let (seg, good, starts) = log_of(&dir, 3);
    // The operator's case: one bit of the first record's type name (after len, crc, first
    // position, count and the type's length).
    let mut bytes = good.clone();
    bytes[starts[0] + 8 + 12 + 2] ^= 0x04;
    fs::write(&seg, &bytes).unwrap();
    assert_corrupt_untouched(&dir, &seg, &bytes, starts[0], "type name of record 1");
    // A middle record's payload and CRC.
    for at in [starts[1] + 30, starts[1] + 5] {
        let mut bytes = good.clone();
        bytes[at] ^= 0x01;
        fs::write(&seg, &bytes).unwrap();
        assert_corrupt_untouched(&dir, &seg, &bytes, starts[1], &format!("byte {at} of record 2"));
    }
    // Put back, it opens whole: the refusals changed nothing.
    fs::write(&seg, &good).unwrap();
    let log = EventLog::open(&dir, LogOptions::default()).unwrap();
    assert_eq!(positions(&all(&log.reader())), [1, 2, 3]);
}

#[test]
fn a_flipped_bit_in_a_record_length_before_valid_records_is_corruption_whichever_way_it_points() {
    let dir = temp_dir("flip-len");
    let (seg, good, starts) = log_of(&dir, 4);
    // High bit: the record "runs past the end of the segment"; low bits: shorter or longer,
    // the CRC fails; either way the length no longer leads to the next record.
    for (byte, bit) in [(3, 0x80), (0, 0x01), (0, 0x08), (1, 0x01)] {
        let mut bytes = good.clone();
        bytes[starts[1] + byte] ^= bit;
        fs::write(&seg, &bytes).unwrap();
        assert_corrupt_untouched(&dir, &seg, &bytes, starts[1], &format!("length byte {byte} ^ {bit:#x}"));
    }
}

#[test]
fn a_genuine_torn_tail_cut_mid_record_with_garbage_after_is_still_truncated() {
    let dir = temp_dir("torn-garbage");
    let (seg, good, starts) = log_of(&dir, 4);
    let last = starts[3];
    let garbage: [&[u8]; 4] = [
        &[0u8; 300],
        &[0xAB; 77],
        &[0xFF; 9],
        // a frame header claiming a small length, its payload never written
        &[40, 0, 0, 0, 0xDE, 0xAD, 0xBE, 0xEF, 1, 2, 3],
    ];
    for cut in [last + 1, last + 7, last + 8, last + 20, good.len() - 1] {
        for g in garbage {
            fs::write(&seg, [&good[..cut], g].concat()).unwrap();
            let log = EventLog::open(&dir, LogOptions::default()).unwrap();
            assert_eq!(positions(&all(&log.reader())), [1, 2, 3], "cut at {cut}");
            drop(log);
            assert_eq!(
                fs::read(&seg).unwrap(),
                &good[..last],
                "cut at {cut}: truncated to the last valid record"
            );
        }
    }
}

#[test]
fn every_single_byte_flip_before_the_last_record_is_refused_as_corrupt_never_opened_short() {
    let dir = temp_dir("flip-every");
    let n = 6;
    let (seg, good, starts) = log_of(&dir, n);
    let mut refused = 0;
    for at in starts[0]..starts[n - 1] {
        let record = starts.iter().rposition(|&s| s <= at).unwrap();
        for bit in [0x01, 0x80, 0xFF] {
            let mut bytes = good.clone();
            bytes[at] ^= bit;
            fs::write(&seg, &bytes).unwrap();
            match EventLog::open(&dir, LogOptions::default()) {
                Ok(log) => {
                    // Allowed only with every record intact (not the case for CRC32C, which
                    // catches every one-byte change; kept so the rule reads as stated).
                    let events = all(&log.reader());
                    assert_eq!(positions(&events).len(), n, "byte {at} ^ {bit:#x}: opened short");
                    drop(log);
                    fs::write(&seg, &good).unwrap();
                }
                Err(OpenError::Corrupt { offset, .. }) => {
                    assert_eq!(
                        offset, starts[record] as u64,
                        "byte {at} ^ {bit:#x}: names the flipped record"
                    );
                    assert!(
                        fs::read(&seg).unwrap() == bytes,
                        "byte {at} ^ {bit:#x}: the segment was changed"
                    );
                    refused += 1;
                }
                Err(e) => panic!("byte {at} ^ {bit:#x}: {e}"),
            }
        }
    }
    assert_eq!(refused, (starts[n - 1] - starts[0]) * 3);
    // A flip in the last record cannot be told from a torn write of it: truncated, the rest kept.
    let mut bytes = good.clone();
    bytes[starts[n - 1] + 20] ^= 0x01;
    fs::write(&seg, &bytes).unwrap();
    let log = EventLog::open(&dir, LogOptions::default()).unwrap();
    assert_eq!(positions(&all(&log.reader())), (1..n as u64).collect::<Vec<_>>());
}

#[test]
fn an_event_failing_its_own_crc_in_a_record_whose_crc_holds_is_corruption_wherever_it_is() {
    // Format version 2: `record = len | crc | first | count | (event_crc | event)*`. A byte of
    // an event changed and the record's CRC made to match again (what no torn write leaves):
    // the event's own CRC32C still fails, so the open refuses it — even as the last record,
    // which a record failing its own CRC there would not be — and nothing is truncated.
    for victim in [0usize, 3, 5] {
        let dir = temp_dir("event-crc");
        let (seg, mut bytes, starts) = log_of(&dir, 6);
        let at = starts[victim];
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        // The last payload byte: inside the record's one event, past its own checksum.
        bytes[at + 8 + len - 1] ^= 0x10;
        let mut checked = bytes[at..at + 4].to_vec();
        checked.extend_from_slice(&bytes[at + 8..at + 8 + len]);
        let crc = crc32c_of(&checked);
        bytes[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
        fs::write(&seg, &bytes).unwrap();
        assert_corrupt_untouched(&dir, &seg, &bytes, at, &format!("event of record {victim}"));
    }
}
