//! Small filesystem helpers: directories with a fixed mode and atomic file writes.
//!
//! Every file veris publishes ([`write_file`], also the binary's reports) is written to a temp
//! file in the same directory, fsynced, given its final mode and then renamed over the target,
//! so a reader (or a crash) sees either the old file or the new one, never a torn one, and
//! whatever another process left at the target is replaced, never written through.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt, PermissionsExt};
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

/// Writes `bytes` to `path` atomically with permissions `mode` (the crate's own files).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), CaError> {
    write_file(path, bytes, mode).map_err(|source| CaError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes `bytes` to `path` as a fresh file of this process: a new inode, owned by this uid,
/// with exactly `mode`, renamed into place (DESIGN §7a.15). The one writer of every file veris
/// publishes or reports to (trust material, env files, receipts, JUnit, HAR, ready files).
///
/// Whoever else can write the directory (the workload, same uid) may have planted anything at
/// `path`; none of it is opened: a symlink or FIFO there is replaced by the rename, never
/// followed or blocked on, and an old file's owner and mode go with it. The temp file beside
/// it has an unpredictable name and is created `O_EXCL` (never through a link planted at that
/// name) with the final mode, so the content is never visible with looser permissions; it is
/// fsynced before the rename and removed if anything fails. A directory or a device at `path`
/// is refused with an error that says so, and so is a path under `/dev`, `/proc` or `/sys`
/// (`--receipt /dev/stdout` would replace the system's link, not write to stdout).
pub fn write_file(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let refuse = |kind, what: &str| {
        Err(io::Error::new(
            kind,
            format!(
                "{} {what}; veris writes its reports as regular files of their own (name a file path)",
                path.display()
            ),
        ))
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let Some(name) = path.file_name() else {
        return refuse(io::ErrorKind::InvalidInput, "names no file");
    };
    let name = name.to_string_lossy();
    if let Ok(real) = fs::canonicalize(&dir) {
        if ["/dev", "/proc", "/sys"]
            .iter()
            .any(|d| real.starts_with(d))
        {
            return refuse(io::ErrorKind::InvalidInput, "is a system path");
        }
    }
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => return refuse(io::ErrorKind::IsADirectory, "is a directory"),
        Ok(m) if m.file_type().is_block_device() || m.file_type().is_char_device() => {
            return refuse(io::ErrorKind::InvalidInput, "is a device")
        }
        _ => {}
    }
    let tmp = dir.join(format!(".{name}.{}.tmp", random_hex()?));
    let result = (|| {
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
        fs::rename(&tmp, path).map_err(|e| match e.kind() {
            // A directory planted after the check above.
            io::ErrorKind::IsADirectory | io::ErrorKind::DirectoryNotEmpty => io::Error::new(
                io::ErrorKind::IsADirectory,
                format!(
                    "{} is a directory; veris writes its reports as regular files of their own (name a file path)",
                    path.display()
                ),
            ),
            _ => e,
        })?;
        // Persist the rename itself; failure here is not fatal to correctness of the content.
        if let Ok(d) = fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// 128 random bits as hex: a temp name nobody can plant a file at ahead of time.
fn random_hex() -> io::Result<String> {
    use aws_lc_rs::rand::{SecureRandom, SystemRandom};
    let mut bytes = [0u8; 16];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| io::Error::other("no random bytes for a temp file name"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
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

    #[test]
    fn write_file_replaces_what_was_planted_and_never_writes_through_it() {
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("veris-ca-planted-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        ensure_dir(&dir, 0o700).unwrap();
        let victim = dir.join("victim");
        fs::write(&victim, "keep").unwrap();
        let target = dir.join("report");
        // A symlink: replaced, the file it named untouched.
        std::os::unix::fs::symlink(&victim, &target).unwrap();
        write_file(&target, b"one", 0o600).unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "keep");
        assert!(fs::symlink_metadata(&target).unwrap().is_file());
        // A FIFO: replaced without opening it (an open would block here).
        fs::remove_file(&target).unwrap();
        let status = std::process::Command::new("mkfifo")
            .arg(&target)
            .status()
            .unwrap();
        assert!(status.success());
        write_file(&target, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"two");
        // A loose old file: a new inode with the mode asked for.
        fs::set_permissions(&target, fs::Permissions::from_mode(0o666)).unwrap();
        let old = fs::metadata(&target).unwrap().ino();
        write_file(&target, b"three", 0o600).unwrap();
        let new = fs::metadata(&target).unwrap();
        assert_ne!(new.ino(), old);
        assert_eq!(new.mode() & 0o7777, 0o600);
        // A directory: refused in words, nothing left behind.
        fs::remove_file(&target).unwrap();
        fs::create_dir(&target).unwrap();
        let e = write_file(&target, b"four", 0o600).unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
        let e = write_file(Path::new("/dev/null"), b"x", 0o600).unwrap_err();
        assert!(e.to_string().contains("system path"), "{e}");
        let mut names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["report", "victim"]);
        fs::remove_dir_all(&dir).unwrap();
    }
}
