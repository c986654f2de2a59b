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

/// `5s`, `500ms`, `2m` or plain seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    use std::time::Duration;
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("bad duration {s:?}; expected e.g. 5s or 500ms"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n.saturating_mul(60))),
        _ => Err(format!("bad duration {s:?}; expected e.g. 5s or 500ms")),
    }
}

/// Random lower-case hex (`bytes` random bytes) from the TLS provider's
/// CSPRNG (aws-lc, seeded by the kernel).
pub fn random_hex(bytes: usize) -> anyhow::Result<String> {
    let mut buf = vec![0u8; bytes];
    aws_lc_rs::rand::fill(&mut buf).map_err(|_| anyhow::anyhow!("no random bytes"))?;
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

/// A name beside `path` for a file of this process (`.<name>.<tag>-<128 random
/// bits>`), not guessable ahead of time (a same-uid workload knows the pid and
/// can guess a clock); create it with `create_new`, so a link planted at it
/// is never followed.
pub fn temp_beside(path: &Path, tag: &str) -> std::io::Result<PathBuf> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let random = random_hex(16).map_err(std::io::Error::other)?;
    Ok(dir.join(format!(
        ".{}.{tag}-{random}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("veris"),
    )))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        use std::time::Duration;
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("5h").is_err());
        assert!(parse_duration("s").is_err());
    }

    #[test]
    fn random_hex_is_hex_of_the_length_asked_and_differs() {
        let a = random_hex(16).unwrap();
        assert_eq!(a.len(), 32);
        assert!(a
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_ne!(a, random_hex(16).unwrap());
    }

    #[test]
    fn a_link_planted_at_the_old_temp_name_is_never_followed() {
        let dir = std::env::temp_dir().join(format!("veris-util-plant-{}", random_hex(4).unwrap()));
        std::fs::create_dir_all(&dir).unwrap();
        let victim = dir.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let report = dir.join("report.xml");
        // The old name, `.<name>.<tag>-<pid>-<nanos>`, was known but for the
        // clock: a same-uid workload plants links for every nanosecond it
        // guesses. Here: every name with this pid and a nanosecond below 1000.
        let pid = std::process::id();
        for nanos in 0..1000 {
            let planted = dir.join(format!(".report.xml.probe-{pid}-{nanos}"));
            std::os::unix::fs::symlink(&victim, planted).unwrap();
        }
        let tmp = temp_beside(&report, "probe").unwrap();
        let name = tmp.file_name().unwrap().to_str().unwrap().to_string();
        assert!(!name.contains(&pid.to_string()), "{name}");
        assert!(name.starts_with(".report.xml.probe-"), "{name}");
        assert_eq!(name.len(), ".report.xml.probe-".len() + 32, "{name}");
        assert_ne!(tmp, temp_beside(&report, "probe").unwrap());
        // Created new (O_EXCL: a link there would be refused, never
        // followed), written, renamed: it lands, the victim is untouched.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .unwrap();
        std::io::Write::write_all(&mut f, b"report").unwrap();
        drop(f);
        std::fs::rename(&tmp, &report).unwrap();
        assert_eq!(std::fs::read_to_string(&report).unwrap(), "report");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
