//! Small filesystem helpers: directories with a fixed mode and atomic file writes.
//!
//! Every file this crate publishes is written to a temp file in the same directory, fsynced,
//! given its final mode and then renamed over the target, so a reader (or a crash) sees either
//! the old file or the new one, never a torn one.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::CaError;

/// Creates `dir` (and parents) and sets its mode to exactly `mode`.
pub(crate) fn ensure_dir(dir: &Path, mode: u32) -> Result<(), CaError> {
    let err = |source| CaError::CreateDir {
        path: dir.to_path_buf(),
        source,
    };
    // Parents get the ordinary umask-derived mode: creating `<state>` as 0700 on the way to
    // `<state>/ca` would lock the workload out of `<state>/trust`.
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(err)?;
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(err)?;
    // The umask or an earlier run may have left a different mode; the mode is part of the
    // contract (0700 keeps the key private, 0755 lets an unprivileged workload read trust).
    let current = fs::metadata(dir).map_err(err)?.permissions().mode() & 0o7777;
    if current != mode {
        fs::set_permissions(dir, fs::Permissions::from_mode(mode)).map_err(err)?;
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically with permissions `mode`.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), CaError> {
    let err = |source| CaError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".to_owned());
    let tmp = dir.join(format!(".{name}.tmp.{}.{}", std::process::id(), nonce()));
    let result = (|| {
        // The temp file is created with the final mode so the content is never visible with
        // looser permissions, even for the moment before rename.
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        // The umask may have narrowed the mode at creation (e.g. 0644 under umask 077).
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        // Persist the rename itself; failure here is not fatal to correctness of the content.
        if let Ok(d) = fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(err)
}

/// A value that makes temp-file names unique between threads of one process.
fn nonce() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_atomic_sets_mode_and_leaves_no_temp_files() {
        let dir = std::env::temp_dir().join(format!("veris-ca-fsutil-{}", std::process::id()));
        ensure_dir(&dir, 0o700).unwrap();
        let f = dir.join("x.txt");
        write_atomic(&f, b"one", 0o600).unwrap();
        write_atomic(&f, b"two", 0o644).unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"two");
        assert_eq!(
            fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o644
        );
        assert_eq!(
            fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("x.txt")]);
        fs::remove_dir_all(&dir).unwrap();
    }
}
