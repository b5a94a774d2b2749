//! Where the segment writer's bytes go: a small trait over the file operations, so that tests
//! can put a faulty storage (failing syncs, short writes) in front of the real files.

use std::collections::HashSet;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use super::error::OpenError;

/// Locks the process-wide set of open directories (std's mutex in every build: it is a
/// `static`, which loom's cannot be, and the loom models use in-memory logs only).
fn lock(m: &Mutex<HashSet<PathBuf>>) -> std::sync::MutexGuard<'_, HashSet<PathBuf>> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

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
    let digits = name.strip_suffix(".seg")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit())).then(|| digits.parse().ok()).flatten()
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

/// This process's claim on a log directory, released on drop.
#[derive(Debug)]
pub(crate) struct DirClaim(PathBuf);

impl DirClaim {
    /// Claims `dir` (canonical).
    ///
    /// # Errors
    /// [`OpenError::AlreadyOpen`] while another log of this process has it.
    pub(crate) fn claim(dir: &Path) -> Result<DirClaim, OpenError> {
        if lock(open_dirs()).insert(dir.to_path_buf()) {
            Ok(DirClaim(dir.to_path_buf()))
        } else {
            Err(OpenError::AlreadyOpen(dir.to_path_buf()))
        }
    }
}

impl Drop for DirClaim {
    fn drop(&mut self) {
        lock(open_dirs()).remove(&self.0);
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

fn create_segment_file(dir: &Path, first: u64, header: &[u8]) -> io::Result<File> {
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

/// Lists the segment files of `dir`, sorted by first position.
pub(crate) fn list_segments(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if let Some(first) = entry.file_name().to_str().and_then(parse_segment_name) {
            out.push((first, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}
