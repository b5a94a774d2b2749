//! Where the segment writer's bytes go: a small trait over the file operations, so that tests
//! can put a faulty storage (failing syncs, short writes) in front of the real files.

use std::collections::HashSet;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};

use super::marker::COMMIT_FILE;
use crate::error::OpenError;

/// The file operations of the segment writer.
pub(crate) trait Storage: Send + fmt::Debug {
    /// Creates the segment whose first position is `first`, writes `header` and makes both the
    /// file and its directory entry durable; later writes go to it.
    fn create_segment(&mut self, first: u64, header: &[u8]) -> io::Result<()>;
    /// Writes a prefix of `bytes` to the end of the current segment; returns how many bytes.
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize>;
    /// Makes everything written to the current segment durable (`fdatasync`).
    fn sync(&mut self) -> io::Result<()>;
}

/// The file name of the segment starting at `first`: 20 decimal digits and `.seg`.
pub(crate) fn segment_name(first: u64) -> String {
    format!("{first:020}.seg")
}

/// The first position a segment file name stands for, if it is one.
pub(crate) fn parse_segment_name(name: &str) -> Option<u64> {
    parse_name(name, ".seg")
}

/// Syncs a directory, so that a file created or renamed in it survives a crash.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The directories this process has a log open in.
fn open_dirs() -> &'static Mutex<HashSet<PathBuf>> {
    static DIRS: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    DIRS.get_or_init(Default::default)
}

/// The file in a log directory whose exclusive advisory lock (`flock(2)`; `LockFileEx` on
/// Windows) the writer holds while the log is open. Created on first open and never removed
/// (removing it would let two processes lock two different files of one name).
pub(crate) const LOCK_FILE: &str = "LOCK";

/// The writer's claim on a log directory: this process's entry in its set of open directories
/// and the exclusive lock on the directory's [`LOCK_FILE`] against other processes. Released on
/// drop; the lock also goes with the process, however it ends (the kernel drops it with the
/// last descriptor, SIGKILL included).
#[derive(Debug)]
pub(crate) struct DirClaim {
    dir: PathBuf,
    /// The locked file; `None` only while dropping.
    lock_file: Option<File>,
}

impl DirClaim {
    /// Claims `dir` (canonical): first in this process, then across processes. Taken before
    /// recovery reads or truncates anything, so that a second writer changes nothing.
    ///
    /// # Errors
    /// [`OpenError::AlreadyOpen`] while another log of this process has it;
    /// [`OpenError::Locked`] while another process has it open; [`OpenError::Io`] if the lock
    /// file cannot be created or locked. Nothing stays claimed on an error.
    pub(crate) fn claim(dir: &Path) -> Result<DirClaim, OpenError> {
        if !open_dirs().lock().unwrap_or_else(PoisonError::into_inner).insert(dir.to_path_buf()) {
            return Err(OpenError::AlreadyOpen(dir.to_path_buf()));
        }
        // From here on, dropping `claim` takes the entry out again on every early return.
        let mut claim = DirClaim { dir: dir.to_path_buf(), lock_file: None };
        let path = dir.join(LOCK_FILE);
        let io = |op| {
            let path = path.clone();
            move |source| OpenError::Io { op, path, source }
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io("creating the lock file"))?;
        // Through the trait, not `file.try_lock()`: that would be std's `File::try_lock`
        // (Rust 1.89, above the library's MSRV) on newer compilers.
        match fs4::FileExt::try_lock(&file) {
            Ok(()) => {}
            Err(fs4::TryLockError::WouldBlock) => {
                return Err(OpenError::Locked { dir: dir.to_path_buf(), lock_file: path });
            }
            Err(fs4::TryLockError::Error(e)) => return Err(io("locking")(e)),
        }
        claim.lock_file = Some(file);
        Ok(claim)
    }
}

impl Drop for DirClaim {
    fn drop(&mut self) {
        // Unlock (close) before leaving the set, so that a log of this process that claims the
        // directory next never finds its own old lock still held.
        drop(self.lock_file.take());
        open_dirs().lock().unwrap_or_else(PoisonError::into_inner).remove(&self.dir);
    }
}

/// Segment files in a directory.
#[derive(Debug)]
pub(crate) struct FileStorage {
    dir: PathBuf,
    current: File,
    _claim: DirClaim,
}

impl FileStorage {
    /// Appends to the existing segment `path` (already truncated to its valid length).
    pub(crate) fn resume(dir: &Path, path: &Path, claim: DirClaim) -> io::Result<FileStorage> {
        let current = OpenOptions::new().append(true).open(path)?;
        Ok(FileStorage { dir: dir.to_path_buf(), current, _claim: claim })
    }

    /// Creates the first segment of a log.
    pub(crate) fn create(dir: &Path, first: u64, header: &[u8], claim: DirClaim) -> io::Result<FileStorage> {
        let current = create_segment_file(dir, first, header)?;
        Ok(FileStorage { dir: dir.to_path_buf(), current, _claim: claim })
    }
}

/// Creates (or empties) the segment file of `first` in `dir` with `header` in it, syncs the file
/// and the directory, and returns it open for appends.
pub(crate) fn create_segment_file(dir: &Path, first: u64, header: &[u8]) -> io::Result<File> {
    let path = dir.join(segment_name(first));
    let mut file = OpenOptions::new().create(true).truncate(true).write(true).open(&path)?;
    file.write_all(header)?;
    file.sync_all()?;
    sync_dir(dir)?;
    drop(file);
    OpenOptions::new().append(true).open(&path)
}

impl Storage for FileStorage {
    fn create_segment(&mut self, first: u64, header: &[u8]) -> io::Result<()> {
        self.current = create_segment_file(&self.dir, first, header)?;
        Ok(())
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.current.write(bytes)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.current.sync_data()
    }
}

/// What a log directory holds.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// The segment files, by first position (ascending).
    pub(crate) segments: Vec<(u64, PathBuf)>,
    /// The first positions of the segments that have an index file (ascending).
    pub(crate) indexes: Vec<u64>,
    /// Index files a crash left half-written (`.idx.tmp`).
    pub(crate) tmp: Vec<PathBuf>,
}

/// The first position a `<20 digits><suffix>` file name stands for, if it is one.
fn parse_name(name: &str, suffix: &str) -> Option<u64> {
    let digits = name.strip_suffix(suffix)?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit())).then(|| digits.parse().ok()).flatten()
}

/// Lists the files of the log directory `dir`.
///
/// # Errors
/// [`OpenError::StrayFile`] for a file (or directory) that is not one of the log's: segments,
/// index files, their temporary files, [`LOCK_FILE`] and the commit marker (`COMMIT`). [`OpenError::Io`] if the directory
/// cannot be read.
pub(crate) fn list_dir(dir: &Path) -> Result<Listing, OpenError> {
    let io = |source| OpenError::Io { op: "listing", path: dir.to_path_buf(), source };
    let mut out = Listing::default();
    for entry in fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { return Err(OpenError::StrayFile(entry.path())) };
        if name == LOCK_FILE || name == COMMIT_FILE {
            continue;
        }
        if let Some(first) = parse_segment_name(name) {
            out.segments.push((first, entry.path()));
        } else if let Some(first) = parse_name(name, ".idx") {
            out.indexes.push(first);
        } else if parse_name(name, ".idx.tmp").is_some() {
            out.tmp.push(entry.path());
        } else {
            return Err(OpenError::StrayFile(entry.path()));
        }
    }
    out.segments.sort();
    out.indexes.sort();
    Ok(out)
}
