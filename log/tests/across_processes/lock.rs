//! One writer per log directory across processes (issue 19, fault 9): while one process has a
//! log open, another's `EventLog::open` is refused with `OpenError::Locked` and changes nothing;
//! once the holder dies (SIGKILL here: no destructor runs) the lock is gone and the log opens.
//!
//! The holder is this test binary itself, started again with `LANESTREAM_LOG_LOCK_CHILD=DIR` to
//! run only [`lock_holder_child`]: it opens the log in DIR, appends, prints `holding HEAD` and
//! then waits for its stdin to close (so it also ends if the parent dies first).
#![cfg(unix)]

use crate::log_support;

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;

use lanestream_log::{EventLog, LogOptions, OpenError};
use log_support::{LIMIT, all, ev, positions, temp_dir};

const CHILD_ENV: &str = "LANESTREAM_LOG_LOCK_CHILD";

/// The holder's side; does nothing unless started by the parent test with [`CHILD_ENV`] set.
#[test]
#[ignore = "the child process of a_second_process_is_refused_the_log_until_the_holder_dies"]
fn lock_holder_child() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else { return };
    let log = EventLog::open(&dir, LogOptions::default()).expect("the child opens the log");
    for ty in ["A", "B", "C"] {
        log.append(vec![ev(ty, &["held"])], None).expect("the child appends");
    }
    println!("holding {}", log.head().unwrap().get());
    // Hold the log until the parent kills us (or closes our stdin).
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

fn segment_bytes(dir: &Path) -> Vec<(std::ffi::OsString, Vec<u8>)> {
    let mut v: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .map(|p| (p.file_name().unwrap().to_owned(), fs::read(&p).unwrap()))
        .collect();
    v.sort();
    v
}

#[test]
fn a_second_process_is_refused_the_log_until_the_holder_dies() {
    let dir = temp_dir("lock");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", log_support::test_name(module_path!(), "lock_holder_child").as_str()])
        .args(["--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &*dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    // Wait for the child's word that it holds the log (a real signal: its stdout line), read on
    // a thread so that a child that never says it fails the test instead of hanging it.
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let head = BufReader::new(stdout).lines().map_while(Result::ok).find_map(|line| {
            // The harness may have printed `test lock_holder_child ... ` on the same line.
            line.split_once("holding ").map(|(_, head)| head.trim().parse::<u64>().unwrap())
        });
        let _ = tx.send(head);
    });
    match rx.recv_timeout(LIMIT) {
        Ok(Some(head)) => assert_eq!(head, 3),
        outcome => {
            let _ = child.kill();
            panic!("the child did not report holding the log ({outcome:?}): {:?}", child.wait());
        }
    }

    let before = segment_bytes(&dir);
    match EventLog::open(&dir, LogOptions::default()) {
        Err(e @ OpenError::Locked { .. }) => {
            let OpenError::Locked { dir: locked, lock_file } = &e else { unreachable!() };
            assert_eq!(*locked, fs::canonicalize(&dir).unwrap());
            assert_eq!(*lock_file, locked.join("LOCK"));
            let message = e.to_string();
            assert!(message.contains("another process"), "{message}");
        }
        Err(e) => panic!("expected Locked while the child holds the log, got {e}"),
        Ok(log) => panic!("a second process opened the log (head {:?})", log.head()),
    }
    assert_eq!(segment_bytes(&dir), before, "the refused open changed the segments");

    // SIGKILL: the child runs no destructor; the kernel drops its lock with its descriptors.
    child.kill().unwrap();
    child.wait().unwrap();
    let log = EventLog::open(&dir, LogOptions::default()).expect("opens once the holder is dead");
    assert_eq!(positions(&all(&log.reader())), [1, 2, 3]);
    assert_eq!(log.append(vec![ev("D", &[])], None).unwrap().first.get(), 4);
}

#[test]
fn the_lock_is_released_when_the_log_closes_and_when_its_open_fails() {
    let dir = temp_dir("lock-release");
    let log = EventLog::open(&dir, LogOptions::default()).unwrap();
    assert!(matches!(EventLog::open(&dir, LogOptions::default()), Err(OpenError::AlreadyOpen(_))));
    log.close();
    drop(log);
    // Corrupt a segment so recovery fails after the claim; the failure must release it.
    let seg = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "seg"))
        .unwrap();
    let good = fs::read(&seg).unwrap();
    fs::write(&seg, b"not a segment").unwrap();
    assert!(matches!(EventLog::open(&dir, LogOptions::default()), Err(OpenError::Corrupt { .. })));
    fs::write(&seg, &good).unwrap();
    EventLog::open(&dir, LogOptions::default()).expect("nothing stayed claimed").close();
}
