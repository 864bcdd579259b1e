//! Crash-safe file writes: temp file in the same directory, fsync, rename.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::Error;

/// File mode for private keys (owner read/write only).
pub(super) const KEY_MODE: u32 = 0o600;
/// File mode for certificates (public material).
pub(super) const CERT_MODE: u32 = 0o644;

/// A file staged next to its destination; `commit` renames it into place.
///
/// Dropping an uncommitted `Staged` removes the temp file, so a failed run
/// leaves no litter and never a half-written destination.
struct Staged {
    tmp: PathBuf,
    dest: PathBuf,
    committed: bool,
}

impl Staged {
    /// Writes `contents` to a fresh temp file beside `dest` (created with
    /// `mode`, so a key is never readable by others, not even briefly) and
    /// fsyncs it.
    fn write(dest: &Path, contents: &[u8], mode: u32) -> Result<Self, Error> {
        let dir = parent_dir(dest);
        fs::create_dir_all(dir).map_err(|source| Error::Write {
            path: dir.to_path_buf(),
            source,
        })?;
        let tmp = temp_path(dest);
        let staged = Staged {
            tmp: tmp.clone(),
            dest: dest.to_path_buf(),
            committed: false,
        };
        let io_err = |source| Error::Write {
            path: tmp.clone(),
            source,
        };
        let mut file = create_new(&tmp, mode).map_err(io_err)?;
        file.write_all(contents).map_err(io_err)?;
        file.sync_all().map_err(io_err)?;
        Ok(staged)
    }

    /// Atomically replaces the destination with the staged file.
    fn commit(mut self) -> Result<(), Error> {
        fs::rename(&self.tmp, &self.dest).map_err(|source| Error::Write {
            path: self.dest.clone(),
            source,
        })?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// Stages all files first, then renames them back to back, then fsyncs the
/// directories so the renames survive a crash. Readers polling the files
/// can still observe a moment where one file is new and the other old; the
/// TLS reloader treats that as a mismatched pair and keeps the old one.
pub(super) fn write_all(files: &[(&Path, &[u8], u32)]) -> Result<(), Error> {
    let staged = files
        .iter()
        .map(|(dest, contents, mode)| Staged::write(dest, contents, *mode))
        .collect::<Result<Vec<_>, _>>()?;
    for file in staged {
        file.commit()?;
    }
    for (dest, _, _) in files {
        sync_dir(parent_dir(dest))?;
    }
    Ok(())
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// `.<name>.tmp-<pid>-<counter>` beside `dest`: unique within and across
/// processes, and hidden from globbing tools.
fn temp_path(dest: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    parent_dir(dest).join(format!(".{name}.tmp-{}-{n}", std::process::id()))
}

fn create_new(path: &Path, mode: u32) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    options.open(path)
}

fn sync_dir(dir: &Path) -> Result<(), Error> {
    #[cfg(unix)]
    {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| Error::Write {
                path: dir.to_path_buf(),
                source,
            })?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}
