//! Helpers every layer uses: the state dir, command output that survives a
//! closed pipe (`outln!`, `out!`), random ids, bounded reads of files a
//! workload may have planted, and temp names beside a file.

use std::path::{Path, PathBuf};

/// Exit code for usage and configuration errors.
pub const EXIT_USAGE: u8 = 1;

/// `--state-dir`, else `$VERIS_STATE_DIR`, else `~/.veris`.
pub fn state_dir(flag: Option<PathBuf>) -> PathBuf {
    let dir = flag
        .or_else(|| std::env::var_os("VERIS_STATE_DIR").map(PathBuf::from))
        .unwrap_or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/tmp"))
                .join(".veris")
        });
    // Absolute, so the paths written into env and ready files still work
    // when they are read from another directory.
    std::path::absolute(&dir).unwrap_or(dir)
}

/// `println!` for command output: a reader that closed the pipe early
/// (`veris receipt | head -1`) ends the output quietly instead of panicking.
#[macro_export]
macro_rules! outln {
    () => { $crate::util::emit(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::util::emit(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` with the same treatment of a closed pipe as [`outln!`].
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::util::emit(format_args!($($arg)*)) };
}

/// Writes to stdout; a broken pipe is not an error, anything else is reported on stderr.
pub fn emit(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("veris: writing to stdout: {e}");
        }
    }
}

/// Random lower-case hex from the kernel's CSPRNG.
pub fn random_hex(bytes: usize) -> anyhow::Result<String> {
    use std::io::Read;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| anyhow::anyhow!("reading /dev/urandom: {e}"))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Reads a small text file that someone else may have planted: only a regular file
/// (a FIFO would block the reader forever, `/dev/zero` would fill its memory), opened
/// without blocking and, unless `follow`, not through a symlink; at most `cap` bytes, more
/// is an error.
pub fn read_bounded(path: &Path, cap: u64, follow: bool) -> std::io::Result<String> {
    String::from_utf8(read_bounded_bytes(path, cap, follow)?).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is not UTF-8 text", path.display()),
        )
    })
}

/// [`read_bounded`], for a file that need not be text.
pub fn read_bounded_bytes(path: &Path, cap: u64, follow: bool) -> std::io::Result<Vec<u8>> {
    use rustix::fs::OFlags;
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut flags = OFlags::NONBLOCK;
    if !follow {
        flags |= OFlags::NOFOLLOW;
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits() as i32)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is not a regular file", path.display()),
        ));
    }
    let mut bytes = Vec::new();
    f.take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is larger than {cap} bytes", path.display()),
        ));
    }
    Ok(bytes)
}

/// A name beside `path` for a file of this process (`.<name>.<tag>-<pid>-<nanos>`), not
/// guessable ahead of time; create it with `create_new`.
pub fn temp_beside(path: &Path, tag: &str) -> PathBuf {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    dir.join(format!(
        ".{}.{tag}-{}-{nanos}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("veris"),
        std::process::id()
    ))
}

/// A future that resolves once `rx` reads true.
pub fn until(
    rx: &tokio::sync::watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut rx = rx.clone();
    async move {
        let _ = rx.wait_for(|stop| *stop).await;
    }
}
