//! The capture dir (`--capture-bodies DIR`): where the proxy stores the
//! redacted bodies of the requests it forwards, one file per body, and how
//! a reader gets one back. The dir is not sealed (whoever can write it can
//! edit it, the workload included), so a body counts only when its bytes
//! hash to the SHA-256 that the sealed `body_capture` line names
//! ([`load`]); anything else is reported, never shown.
//!
//! Files are created new (`O_EXCL`), never through a symlink (`O_NOFOLLOW`):
//! something planted at a name makes that one body `store_failed`, and the
//! proxy moves on. Files are read as regular files only, without blocking
//! (a FIFO cannot stall the reader) and bounded by the size the line names.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::entry::CapturedBody;

/// The file name of one body: `<run>-<seq>-<side>.txt`, with `run` reduced
/// to ASCII letters, digits, `-` and `_` (it is a run id, but a name must
/// never reach outside the dir).
pub fn file_name(run_id: &str, seq: u64, side: Side) -> String {
    let run: String = run_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(64)
        .collect();
    format!("{run}-{seq}-{}.txt", side.as_str())
}

/// Which body of an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Request,
    Response,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Request => "request",
            Side::Response => "response",
        }
    }
}

/// Creates `dir/name` with `bytes`: a new regular file (0644), never
/// through a link, never over anything that stands at the name.
pub fn store(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let path = dir.join(name);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)?;
    let written = f.write_all(bytes);
    if written.is_err() {
        let _ = std::fs::remove_file(&path);
    }
    written
}

/// What a reader gets for one body named in a `body_capture` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loaded {
    /// The stored text; its SHA-256 matches the sealed line.
    Text(String),
    /// Nothing was stored; the line says why (`binary`, `total_cap`, …).
    NotCaptured(String),
    /// The line names a file that is not there (or not a regular file).
    Missing,
    /// The file's bytes are not the ones the line's SHA-256 names.
    Altered,
}

/// The body `b` names, read from `dir` and checked against its SHA-256.
/// A name that is not a bare file name (a line the writer did not write)
/// is `Missing`: nothing outside `dir` is ever opened.
pub fn load(dir: &Path, b: &CapturedBody) -> Loaded {
    let (Some(name), Some(sha256), Some(stored)) = (&b.file, &b.sha256, b.stored) else {
        return Loaded::NotCaptured(b.skipped.clone().unwrap_or_else(|| "unknown".into()));
    };
    let bare = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !bare {
        return Loaded::Missing;
    }
    let path = dir.join(name);
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path);
    let Ok(f) = opened else {
        return Loaded::Missing;
    };
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        return Loaded::Missing;
    }
    // One byte more than the line names: a longer file is altered, and is
    // never read whole.
    let mut bytes = Vec::new();
    if f.take(stored.saturating_add(1))
        .read_to_end(&mut bytes)
        .is_err()
    {
        return Loaded::Missing;
    }
    if bytes.len() as u64 != stored || crate::hash::line_hash(&bytes) != *sha256 {
        return Loaded::Altered;
    }
    match String::from_utf8(bytes) {
        Ok(text) => Loaded::Text(text),
        Err(_) => Loaded::Altered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(std::path::PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            use std::sync::atomic::{AtomicU32, Ordering};
            static N: AtomicU32 = AtomicU32::new(0);
            let dir = std::env::temp_dir().join(format!(
                "veris-receipt-capture-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn stored(name: &str, text: &str) -> CapturedBody {
        CapturedBody {
            bytes: text.len() as u64,
            mime: Some("application/json".into()),
            file: Some(name.into()),
            sha256: Some(crate::hash::line_hash(text.as_bytes())),
            stored: Some(text.len() as u64),
            truncated_at: None,
            skipped: None,
        }
    }

    #[test]
    fn a_stored_body_reads_back_and_an_edited_one_does_not() {
        let dir = TempDir::new();
        let name = file_name("run/../x", 7, Side::Request);
        assert_eq!(name, "runx-7-request.txt");
        store(dir.path(), &name, b"{\"a\":1}").unwrap();
        let b = stored(&name, "{\"a\":1}");
        assert_eq!(load(dir.path(), &b), Loaded::Text("{\"a\":1}".into()));
        // Never over what stands at the name.
        assert!(store(dir.path(), &name, b"other").is_err());

        std::fs::write(dir.path().join(&name), "{\"a\":2}").unwrap();
        assert_eq!(load(dir.path(), &b), Loaded::Altered);
        std::fs::write(dir.path().join(&name), "{\"a\":1} and more").unwrap();
        assert_eq!(load(dir.path(), &b), Loaded::Altered);
        std::fs::remove_file(dir.path().join(&name)).unwrap();
        assert_eq!(load(dir.path(), &b), Loaded::Missing);
        // A name that leaves the dir is never opened.
        assert_eq!(load(dir.path(), &stored("../x", "")), Loaded::Missing);
    }

    #[test]
    fn links_and_fifos_are_neither_followed_nor_waited_on() {
        let dir = TempDir::new();
        let target = dir.path().join("target");
        std::fs::write(&target, "{\"a\":1}").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("r-1-request.txt")).unwrap();
        assert!(store(dir.path(), "r-1-request.txt", b"x").is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "{\"a\":1}");
        // A link to a file with the right bytes is still not read.
        assert_eq!(
            load(dir.path(), &stored("r-1-request.txt", "{\"a\":1}")),
            Loaded::Missing
        );
        let fifo = dir.path().join("r-2-request.txt");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            assert!(store(dir.path(), "r-2-request.txt", b"x").is_err());
            assert_eq!(
                load(dir.path(), &stored("r-2-request.txt", "x")),
                Loaded::Missing
            );
        }
    }
}
