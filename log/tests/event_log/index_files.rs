//! The persisted index of each sealed segment (`<20 digits>.idx`) and the format's version: an
//! index file that is missing, cut short, damaged or not the segment's is rebuilt from the
//! segment and never trusted over it; stray files and files of another format version are
//! refused with a clear error and nothing changed; the checked-in fixtures (`tests/fixtures/v2/`:
//! segments, index files and the commit marker), written by this version of the format, open to
//! exactly their events from their index files (as a writer and as a follower), and a new log
//! given the same appends writes them byte for byte; the fixtures of version 1
//! (`tests/fixtures/v1/`, written by the previous build) still open to the same events, take
//! appends (in a new segment of version 2) and reopen.

use crate::log_support;

use std::fs;
use std::path::{Path, PathBuf};

use lanestream_log::{EventLog, LogOptions, OpenError, Query, SequencedEvent};
use log_support::{all, crc32c_of, ev_data, record_starts, temp_dir};

/// Small segments, so a few appends seal several.
fn options() -> LogOptions {
    LogOptions::default().segment_bytes(256)
}

/// The files of `dir` ending in `.ext`, sorted.
fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    v.sort();
    v
}

/// A directory's files: each one's name and bytes.
type DirFiles = Vec<(String, Vec<u8>)>;

/// Every file of `dir` with its bytes, sorted by name.
fn snapshot(dir: &Path) -> DirFiles {
    let mut v: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), fs::read(&p).unwrap()))
        .collect();
    v.sort();
    v
}

/// The appends of the fixture log and of the tests here: 48 events in 24 appends (some of
/// several events), three types, tags shared and not, payloads of every small length.
fn write_appends(log: &lanestream_log::WriteHandle) {
    for i in 0..24u32 {
        let n = 1 + (i % 3) as usize;
        let events = (0..n)
            .map(|j| {
                let k = i * 3 + j as u32;
                let ty = ["Opened", "Deposited", "Closed"][(k % 3) as usize];
                let account = format!("account:{}", k % 4);
                let data: Vec<u8> = (0..(k % 37)).map(|b| (b * 7 + k) as u8).collect();
                if k % 5 == 0 {
                    ev_data(ty, &[&account, "audit"], data)
                } else {
                    ev_data(ty, &[&account], data)
                }
            })
            .collect();
        log.append(events, None).unwrap();
    }
}

/// A closed log of [`write_appends`] in `dir`, with its events.
fn written_log(dir: &Path) -> Vec<SequencedEvent> {
    let log = EventLog::open(dir, options()).unwrap();
    write_appends(&log);
    let events = all(&log.reader());
    log.close();
    assert_eq!(events.len(), 48);
    assert!(files(dir, "idx").len() >= 3, "the test needs several sealed segments");
    events
}

#[test]
fn sealed_segments_get_an_index_file_and_the_last_one_none() {
    let dir = temp_dir("idx-sealed");
    written_log(&dir);
    let segs = files(&dir, "seg");
    let idxs = files(&dir, "idx");
    assert_eq!(idxs.len(), segs.len() - 1, "every segment but the last is sealed");
    for (s, i) in segs.iter().zip(&idxs) {
        assert_eq!(s.with_extension("idx"), *i);
    }
}

#[test]
fn an_index_file_cut_at_every_byte_offset_is_rebuilt_from_the_segment() {
    let dir = temp_dir("idx-cut");
    let events = written_log(&dir);
    let victim = files(&dir, "idx")[1].clone();
    let whole = fs::read(&victim).unwrap();
    for cut in 0..whole.len() {
        fs::write(&victim, &whole[..cut]).unwrap();
        let log = EventLog::open(&dir, options()).unwrap();
        assert_eq!(all(&log.reader()), events, "index cut at byte {cut}");
        log.close();
        assert_eq!(fs::read(&victim).unwrap(), whole, "index cut at byte {cut} was not rebuilt as it was");
    }
}

#[test]
fn an_index_file_with_any_byte_damaged_is_never_trusted() {
    let dir = temp_dir("idx-flip");
    let events = written_log(&dir);
    let victim = files(&dir, "idx")[0].clone();
    let whole = fs::read(&victim).unwrap();
    for at in 0..whole.len() {
        let mut bad = whole.clone();
        bad[at] ^= 0x5A;
        fs::write(&victim, &bad).unwrap();
        let log = EventLog::open(&dir, options()).unwrap();
        assert_eq!(all(&log.reader()), events, "index byte {at} damaged");
        log.close();
        assert_eq!(fs::read(&victim).unwrap(), whole, "index byte {at} damaged: not rebuilt");
    }
}

#[test]
fn a_missing_index_or_another_segments_index_is_rebuilt() {
    let dir = temp_dir("idx-swap");
    let events = written_log(&dir);
    let idxs = files(&dir, "idx");
    let originals: Vec<Vec<u8>> = idxs.iter().map(|p| fs::read(p).unwrap()).collect();
    // Missing.
    fs::remove_file(&idxs[0]).unwrap();
    // Whole and CRC-valid, but another segment's (it names another first position and length).
    fs::write(&idxs[1], &originals[2]).unwrap();
    let log = EventLog::open(&dir, options()).unwrap();
    assert_eq!(all(&log.reader()), events);
    log.close();
    for (p, original) in idxs.iter().zip(&originals) {
        assert_eq!(&fs::read(p).unwrap(), original, "{} not rebuilt", p.display());
    }
}

#[test]
fn a_half_written_index_left_by_a_crash_is_removed_and_the_index_rebuilt() {
    let dir = temp_dir("idx-tmp");
    let events = written_log(&dir);
    let idx = files(&dir, "idx")[0].clone();
    let whole = fs::read(&idx).unwrap();
    // A crash between writing the temporary file and renaming it: no index, half a temp file.
    fs::remove_file(&idx).unwrap();
    let tmp = PathBuf::from(format!("{}.tmp", idx.display()));
    fs::write(&tmp, &whole[..whole.len() / 2]).unwrap();
    let log = EventLog::open(&dir, options()).unwrap();
    assert_eq!(all(&log.reader()), events);
    log.close();
    assert!(!tmp.exists(), "the temporary file stays behind");
    assert_eq!(fs::read(&idx).unwrap(), whole);
}

#[test]
fn a_stray_file_in_the_directory_is_refused_naming_it_and_nothing_changes() {
    let dir = temp_dir("idx-stray");
    written_log(&dir);
    let stray = dir.join("notes.txt");
    fs::write(&stray, b"not a log file").unwrap();
    let before = snapshot(&dir);
    let err = EventLog::open(&dir, options()).unwrap_err();
    assert!(matches!(&err, OpenError::StrayFile(p) if p.ends_with("notes.txt")), "{err}");
    assert!(err.to_string().contains("notes.txt"), "{err}");
    assert_eq!(snapshot(&dir), before, "a refused open changed the directory");
    // A file that looks like a segment but is not named like one is stray too.
    fs::remove_file(&stray).unwrap();
    fs::write(dir.join("1.seg"), b"").unwrap();
    assert!(matches!(EventLog::open(&dir, options()), Err(OpenError::StrayFile(p)) if p.ends_with("1.seg")));
}

#[test]
fn an_index_whose_segment_is_gone_is_corruption_and_nothing_changes() {
    let dir = temp_dir("idx-orphan");
    written_log(&dir);
    let segs = files(&dir, "seg");
    // A sealed segment deleted, its index left: acknowledged events are gone.
    let gone = &segs[1];
    fs::remove_file(gone).unwrap();
    let before = snapshot(&dir);
    let err = EventLog::open(&dir, options()).unwrap_err();
    assert!(
        matches!(&err, OpenError::Corrupt { segment, offset: 0, .. } if segment.ends_with(gone.file_name().unwrap())),
        "{err}"
    );
    assert_eq!(snapshot(&dir), before);
}

/// Issue 33, fault 9: an open refused with `Corrupt` had already changed the directory — it
/// removed the last segment's index file (one a crash leaves between a seal's rename and the
/// next segment) and the `.idx.tmp` a crash leaves in a seal, and it rewrote an untrusted index
/// file and then removed it. The rule (`OpenError`'s docs): an open that fails changes nothing
/// on disk; the repairs (a torn tail truncated, a stale index removed, an index rebuilt) are
/// made only once the open has nothing left to refuse, and a follower never writes at all.
///
/// The cut points: every state a crash of the writer of [`written_log`] leaves — the segment
/// being written cut in its header, inside each record and between records, a seal's
/// temporary index file cut, the seal's rename done before the next segment exists — each with
/// one byte of the last segment's first record damaged (with a whole record after it, that is
/// corruption), and again with the first segment's index file cut in half too where that
/// segment is sealed (an index the open must rebuild). Each is opened by a follower, then by the
/// writer; an open that fails must leave every file as it was, name for name and byte for byte.
/// Before the fix, 120 of these 378 cut points failed (the report's test: 2 of 282): 13 lost the
/// last segment's index file, 65 the `.idx.tmp`, 78 the rebuilt first index file (some two).
#[test]
fn a_corrupt_open_changes_nothing_on_disk() {
    let source = temp_dir("refused-source");
    written_log(&source);
    let whole = snapshot(&source);
    let segments: Vec<&(String, Vec<u8>)> = whole.iter().filter(|(n, _)| n.ends_with(".seg")).collect();
    // The commit marker the writer had published in each state (`COMMIT`: the segment appended
    // to, its durable length, a CRC32C of both); 20 zero bytes (no marker) before the first.
    let marker = |segment: &str, len: usize| {
        let first: u64 = segment.trim_end_matches(".seg").parse().unwrap();
        let mut m = [first.to_le_bytes(), (len as u64).to_le_bytes()].concat();
        m.extend_from_slice(&crc32c_of(&m).to_le_bytes());
        ("COMMIT".to_string(), m)
    };
    let mut published = ("COMMIT".to_string(), vec![0u8; 20]);
    // The states a crash leaves, in the writer's order: (what, files).
    let mut states: Vec<(String, DirFiles)> = Vec::new();
    let mut done: DirFiles = whole.iter().filter(|(n, _)| n == "LOCK").cloned().collect();
    for (name, bytes) in &segments {
        let (starts, end) = record_starts(bytes);
        let mut cuts = vec![0, 1, 8, 15];
        for (i, &s) in starts.iter().enumerate() {
            let e = starts.get(i + 1).copied().unwrap_or(end);
            cuts.extend([s, s + 1, s + 8, (s + e) / 2, e - 1]);
        }
        cuts.push(end);
        for cut in cuts {
            if cut >= 16 {
                // Durable: the header and every whole record below the cut.
                let durable = starts.iter().copied().chain([end]).take_while(|&s| s <= cut).last().unwrap();
                published = marker(name, durable);
            }
            let mut files = done.clone();
            files.push((name.clone(), bytes[..cut].to_vec()));
            files.push(published.clone());
            states.push((format!("{name} cut at byte {cut}"), files));
        }
        done.push(((*name).clone(), bytes.clone()));
        let idx = name.replace(".seg", ".idx");
        if let Some((_, index)) = whole.iter().find(|(n, _)| *n == idx) {
            for cut in [0, 1, index.len() / 2, index.len() - 1, index.len()] {
                let mut files = done.clone();
                files.push((format!("{idx}.tmp"), index[..cut].to_vec()));
                files.push(published.clone());
                states.push((format!("{idx}.tmp cut at byte {cut}"), files));
            }
            done.push((idx.clone(), index.clone()));
            let mut files = done.clone();
            files.push(published.clone());
            states.push((format!("{idx} renamed into place, the next segment not created"), files));
        }
    }
    let (first_segment, _) = segments[0];
    let first_index = first_segment.replace(".seg", ".idx");
    let dir = temp_dir("refused");
    let (mut cut_points, mut corrupt, mut opened) = (0, 0, 0);
    let mut changed = Vec::new();
    for (what, files) in &states {
        // One byte in the middle of the first record of the state's last segment.
        let last = files.iter().rposition(|(n, _)| n.ends_with(".seg")).unwrap();
        let (_, last_whole) = segments.iter().find(|(n, _)| *n == files[last].0).unwrap();
        let (starts, end) = record_starts(last_whole);
        let damaged = (starts[0] + starts.get(1).copied().unwrap_or(end)) / 2;
        // With a whole record after the damaged one, it is corruption; without, a torn tail.
        let refused = starts.len() >= 2 && files[last].1.len() >= starts.get(2).copied().unwrap_or(end);
        for index_cut in [false, true] {
            let mut files = files.clone();
            if let Some(byte) = files[last].1.get_mut(damaged) {
                *byte ^= 0x5A;
            }
            if index_cut {
                // Where the first segment is sealed: its index is read before the last segment.
                let sealed = files[last].0 != *first_segment;
                match files.iter_mut().find(|(n, _)| *n == first_index) {
                    Some((_, index)) if sealed => index.truncate(index.len() / 2),
                    _ => continue,
                }
            }
            cut_points += 1;
            let what = format!("{what}{}", if index_cut { ", the first index file cut in half" } else { "" });
            for entry in fs::read_dir(&dir).unwrap() {
                fs::remove_file(entry.unwrap().path()).unwrap();
            }
            for (name, bytes) in &files {
                fs::write(dir.join(name), bytes).unwrap();
            }
            let before = snapshot(&dir);
            // A follower writes nothing, whatever it finds.
            drop(EventLog::open_read_only(&dir, options()));
            let after = snapshot(&dir);
            if after != before {
                changed.push(format!("{what}: a follower's open changed {}", difference(&before, &after)));
            }
            match EventLog::open(&dir, options()) {
                Ok(log) => {
                    assert!(!refused, "{what}: opened, though a whole record follows the damaged one");
                    opened += 1;
                    log.close();
                }
                Err(e) => {
                    assert!(refused && matches!(e, OpenError::Corrupt { .. }), "{what}: {e}");
                    corrupt += 1;
                    let after = snapshot(&dir);
                    if after != before {
                        changed.push(format!("{what}: refused ({e}), yet {}", difference(&before, &after)));
                    }
                }
            }
        }
    }
    let shown: Vec<_> = changed.iter().take(12).map(String::as_str).collect();
    assert!(
        changed.is_empty(),
        "{} of {cut_points} cut points ({corrupt} refused as Corrupt, {opened} opened) changed the directory; \
         the first ones:\n{}",
        changed.len(),
        shown.join("\n")
    );
    // Both kinds of cut point are there (today: 168 refused, 210 opened).
    assert!(corrupt > 100 && opened > 100, "{cut_points} cut points: {corrupt} refused, {opened} opened");
}

/// What differs between two [`snapshot`]s of a directory: the files gone, new, and changed.
fn difference(before: &[(String, Vec<u8>)], after: &[(String, Vec<u8>)]) -> String {
    let names = |s: &[(String, Vec<u8>)]| s.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    let gone: Vec<_> = names(before).into_iter().filter(|n| !after.iter().any(|(a, _)| a == n)).collect();
    let new: Vec<_> = names(after).into_iter().filter(|n| !before.iter().any(|(b, _)| b == n)).collect();
    let rewritten: Vec<_> = before
        .iter()
        .filter(|(n, b)| after.iter().any(|(a, ab)| a == n && ab != b))
        .map(|(n, _)| n.clone())
        .collect();
    format!("gone {gone:?}, new {new:?}, changed {rewritten:?}")
}

#[test]
fn a_segment_of_another_format_version_is_refused_naming_it_and_nothing_changes() {
    for which in [0usize, usize::MAX] {
        let dir = temp_dir("idx-version");
        written_log(&dir);
        let segs = files(&dir, "seg");
        let victim = if which == 0 { segs[0].clone() } else { segs.last().unwrap().clone() };
        let mut bytes = fs::read(&victim).unwrap();
        assert_eq!(&bytes[..8], b"LSLOG\0\0\x02", "the header carries the version (2)");
        bytes[7] = 3;
        fs::write(&victim, &bytes).unwrap();
        // Without its index, so the open must read the header (the last one has none anyway).
        let _ = fs::remove_file(victim.with_extension("idx"));
        let before = snapshot(&dir);
        let err = EventLog::open(&dir, options()).unwrap_err();
        assert!(
            matches!(&err, OpenError::UnsupportedVersion { file, found: 3, supported: 2 } if *file == fs::canonicalize(&victim).unwrap()),
            "{err}"
        );
        assert_eq!(snapshot(&dir), before);
    }
}

#[test]
fn an_index_file_of_another_format_version_is_rebuilt() {
    // 1: a version this build reads, but not its segment's; 3: one it does not read.
    for version in [1u8, 3] {
        let dir = temp_dir("idx-iversion");
        let events = written_log(&dir);
        let idx = files(&dir, "idx")[0].clone();
        let whole = fs::read(&idx).unwrap();
        assert_eq!(&whole[..8], b"LSIDX\0\0\x02", "the index carries the version (2)");
        let mut other = whole.clone();
        other[7] = version;
        // A valid checksum over the other version, so only the version refuses it.
        let body = other.len() - 4;
        let crc = crc32c_of(&other[..body]);
        other[body..].copy_from_slice(&crc.to_le_bytes());
        fs::write(&idx, &other).unwrap();
        let log = EventLog::open(&dir, options()).unwrap();
        assert_eq!(all(&log.reader()), events);
        log.close();
        assert_eq!(fs::read(&idx).unwrap(), whole, "version {version}");
    }
}

/// Where the checked-in fixtures of format `version` are.
fn fixtures(version: u8) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/v{version}"))
}

/// Copies the fixture log of format `version` into a fresh directory (opening writes its `LOCK`
/// file).
fn fixture_copy(name: &str, version: u8) -> log_support::TestDir {
    let dir = temp_dir(name);
    for entry in fs::read_dir(fixtures(version)).unwrap() {
        let p = entry.unwrap().path();
        fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    dir
}

/// The fixture log of format `version` opens to its events from its index files, as a writer
/// and as a follower, and leaves its index files as they were.
fn fixtures_open_from_their_index_files(version: u8) {
    let dir = fixture_copy("fixture-open", version);
    let idx_before: Vec<(PathBuf, Vec<u8>, u64)> = files(&dir, "idx")
        .into_iter()
        .map(|p| {
            let ino = inode(&p);
            let b = fs::read(&p).unwrap();
            (p, b, ino)
        })
        .collect();
    assert!(idx_before.len() >= 3, "the fixtures hold sealed segments with index files");
    let log = EventLog::open(&dir, options()).unwrap();
    let events = all(&log.reader());
    assert_eq!(events.len(), 48);
    // The events, checked against their construction rather than against another log.
    let fresh = EventLog::in_memory(options()).unwrap();
    write_appends(&fresh);
    assert_eq!(events, all(&fresh.reader()));
    // Selective reads through the index agree too.
    let q = Query::tags(["audit"]);
    assert_eq!(
        log.read(&q, None, usize::MAX).unwrap().events(),
        fresh.read(&q, None, usize::MAX).unwrap().events()
    );
    log.close();
    // A follower reads the same from them (through the commit marker, `COMMIT`).
    let follower = EventLog::open_read_only(&dir, options()).unwrap();
    assert_eq!(all(&follower), events);
    drop(follower);
    // The index files were taken as they were: not rewritten (same file, same bytes).
    for (p, b, ino) in idx_before {
        assert_eq!(fs::read(&p).unwrap(), b, "{} changed", p.display());
        assert_eq!(inode(&p), ino, "{} was rewritten: the open did not trust it", p.display());
    }
}

#[test]
fn the_fixtures_of_format_version_2_open_to_their_events_from_their_index_files() {
    fixtures_open_from_their_index_files(2);
}

#[test]
fn the_fixtures_of_format_version_1_open_to_their_events_from_their_index_files() {
    fixtures_open_from_their_index_files(1);
}

#[test]
fn a_log_of_format_version_1_takes_appends_in_a_new_segment_of_version_2_and_reopens() {
    let dir = fixture_copy("fixture-v1-append", 1);
    let v1_segments: Vec<(PathBuf, Vec<u8>)> =
        files(&dir, "seg").into_iter().map(|p| (p.clone(), fs::read(&p).unwrap())).collect();
    let log = EventLog::open(&dir, options()).unwrap();
    let mut events = all(&log.reader());
    assert_eq!(events.len(), 48);
    // The last segment of version 1 is sealed (its index written), a segment of version 2 started.
    let (last_v1, _) = v1_segments.last().unwrap();
    assert!(last_v1.with_extension("idx").exists(), "the last version-1 segment was not sealed");
    let new = dir.join(format!("{:020}.seg", 49));
    assert_eq!(&fs::read(&new).unwrap()[..8], b"LSLOG\0\0\x02");
    for i in 0..30u8 {
        log.append(vec![ev_data("After", &["account:1"], vec![i; usize::from(i)])], None).unwrap();
    }
    events = all(&log.reader());
    log.close();
    // Nothing of version 1 was rewritten.
    for (p, b) in &v1_segments {
        assert_eq!(&fs::read(p).unwrap(), b, "{} changed", p.display());
    }
    let log = EventLog::open(&dir, options()).unwrap();
    assert_eq!(all(&log.reader()), events);
    assert_eq!(events.len(), 78);
    let q = Query::tags(["account:1"]);
    assert_eq!(log.read(&q, None, usize::MAX).unwrap().len(), 12 + 30);
    log.close();
    // Without any index file, every segment (of either version) is scanned to the same events.
    for p in files(&dir, "idx") {
        fs::remove_file(p).unwrap();
    }
    let log = EventLog::open(&dir, options()).unwrap();
    assert_eq!(all(&log.reader()), events);
    log.close();
}

#[test]
fn a_new_log_writes_the_fixtures_byte_for_byte() {
    // If this fails, the format changed: bump FORMAT_VERSION, keep reading versions 1 and 2
    // (the fixtures above must still open), and add fixtures of the new version beside these.
    let dir = temp_dir("fixture-write");
    written_log(&dir);
    let mut written = snapshot(&dir);
    written.retain(|(name, _)| name != "LOCK");
    let mut fixture = snapshot(&fixtures(2));
    fixture.retain(|(name, _)| name != "LOCK");
    assert_eq!(written.len(), fixture.len(), "file count");
    for ((wn, wb), (fname, fb)) in written.iter().zip(&fixture) {
        assert_eq!(wn, fname);
        assert!(wb == fb, "{wn} differs from the fixture");
    }
}

/// Writes the fixtures of this format version (`tests/fixtures/v2/`). Run by hand, once per
/// format version: `cargo test -p lanestream-log --test event_log -- --ignored index_files::write_fixtures`.
#[test]
#[ignore = "writes tests/fixtures/v2; run by hand"]
fn write_fixtures() {
    let dir = temp_dir("fixture-gen");
    written_log(&dir);
    let out = fixtures(2);
    fs::create_dir_all(&out).unwrap();
    for (name, bytes) in snapshot(&dir) {
        if name != "LOCK" {
            fs::write(out.join(name), bytes).unwrap();
        }
    }
}

#[cfg(unix)]
fn inode(p: &Path) -> u64 {
    std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap())
}

#[cfg(not(unix))]
fn inode(_: &Path) -> u64 {
    0
}
