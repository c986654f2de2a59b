//! The ledger file: hash-chained lines in `ledger.jsonl`. The line format is
//! documented in [`crate::entry`]; in short, every line is
//! `{"v":2,"seq":N,"ts":"…","kind":"…",<fields>,"prev":"<sha256 hex of the previous line>"}\n`.
//!
//! - `write`: the [`Ledger`] writer. [`Ledger::append_queued`] resolves only
//!   after the whole line was handed to the kernel, so a line the client
//!   could have seen survives a proxy crash; a writer thread appends (lines
//!   queued together share one `write(2)`), a sync thread fsyncs at most
//!   every 50 ms, or [`Ledger::sync`] forces it. A failed write leaves no
//!   partial line: the file is truncated back, every caller whose line was in
//!   it gets the error (the proxy then answers `503
//!   veris_ledger_unavailable`), and the next append retries normally. On
//!   open, a torn last line (no trailing `\n`) is moved aside to
//!   `<path>.torn-<seq>` and reported, never silently accepted or deleted.
//!   Seals ([`Ledger::seal`]) are appended under the writer's lock, so the
//!   head they sign is the line right before them. Live readers
//!   ([`Ledger::subscribe`]) get every committed line, in seq order, after it
//!   reached the kernel.
//! - `read`: the verifying reader, a line at a time ([`scan`]), or all of
//!   it ([`read`], [`read_bytes`]). It checks every line (JSON, `v`,
//!   gapless `seq`, `prev` hash), reports problems by 1-based line number and
//!   never panics on bad input.
//! - `tail`: the file read from its end, for a proxy that continues a
//!   ledger its own last seal vouches for without reading the history
//!   ([`Ledger::open_sealed_by`]), and a line found by seq by a binary
//!   search of the file ([`Ledger::position_after`], [`line_at`]).
//!
//! This module holds what both share: the types, the line encoding and the
//! file helpers.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::entry::Line;
use crate::seal::SealReport;

pub use crate::entry::TornTail;
pub use crate::hash::line_hash;

mod encode;
mod read;
mod tail;
mod write;

pub use read::{
    mentions, open_ledger, read, read_bytes, scan, scan_file, LineReader, RawLine, MAX_LINE,
    PROBLEM_CAP,
};
pub use tail::{last_line, line_at};
pub use write::{Appending, Ledger, INDEX_EVERY};

/// A line as committed: its seq and its exact text (without `\n`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub seq: u64,
    pub text: Arc<str>,
}

/// A seal line as appended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SealInfo {
    /// Seq of the seal line itself.
    pub seq: u64,
    /// Seq of the line it seals (`seq - 1`).
    pub sealed_seq: u64,
    /// Hash of the sealed line (the seal line's `prev`).
    pub head: String,
    pub signature: String,
    pub key_id: String,
    pub reason: String,
    /// Hash of the seal line itself: the chain head right after it. A reader
    /// who finds the line at `seq` of the file with this hash knows every
    /// line up to it is what this proxy wrote.
    #[serde(default)]
    pub line_hash: String,
    /// Set once the proxy found its file replaced, cut or extended behind its
    /// back (see [`Ledger::seal`]); sticky for the proxy's lifetime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tampered: Option<String>,
}

/// What can go wrong with the ledger file.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("opening ledger {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading ledger {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("saving torn last line of {path} to {saved}")]
    SaveTorn {
        path: PathBuf,
        saved: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing ledger {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("syncing ledger {path}")]
    Sync {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("moving the unverifiable ledger {path} aside to {to}")]
    MoveAside {
        path: PathBuf,
        to: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("encoding ledger line")]
    Encode(#[source] serde_json::Error),
    /// Another process (a second proxy on the same state dir) holds the ledger:
    /// two writers would fork the chain.
    #[error("ledger {path} is in use by another veris proxy; two writers would break its chain. Next: stop the other proxy or give this one its own --state-dir")]
    Busy { path: PathBuf },
}

/// A defect found while reading a ledger.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Problem {
    /// 1-based line number in the file.
    pub line: usize,
    /// The line's `seq` when it could be read.
    pub seq: Option<u64>,
    /// What is wrong, in words (`prev hash mismatch`, `seq gap: …`).
    pub what: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.what)
    }
}

/// The result of reading a ledger: the lines that parsed, in file order, and
/// every problem found. `problems` empty and `torn_tail` absent means the
/// chain verified from genesis to the last line.
#[derive(Debug, Clone, Default)]
pub struct LedgerRead {
    pub lines: Vec<Line>,
    /// Sorted by line number; the first one is "the first bad line". A
    /// streaming [`scan`] keeps the first few ([`PROBLEM_CAP`]).
    pub problems: Vec<Problem>,
    /// How many problems were found (kept or not).
    pub problem_count: usize,
    pub torn_tail: Option<TornTail>,
    /// `seq` and line hash of the last complete line (0 and
    /// [`GENESIS_PREV`] for an empty ledger): what the next line chains to.
    pub head: (u64, String),
    /// Byte length of the file up to and including the last `\n`.
    pub good_len: u64,
}

impl LedgerRead {
    /// The first bad line, if any.
    pub fn first_problem(&self) -> Option<&Problem> {
        self.problems.first()
    }
}

/// What [`Ledger::open`] found in an existing file.
#[derive(Debug, Clone)]
pub struct OpenReport {
    /// The `seq` the next append gets.
    pub next_seq: u64,
    /// A torn last line that was cut off; record it in the session line.
    pub torn_tail: Option<TornTail>,
    /// Where the torn bytes were saved.
    pub torn_saved_to: Option<PathBuf>,
    /// Chain problems in the existing file (the writer continues after them;
    /// readers will keep reporting them).
    pub problems: Vec<Problem>,
    /// An earlier file this writer would not continue ([`Ledger::open_sealed_by`]).
    pub moved_aside: Option<Box<crate::entry::MovedAside>>,
}

/// The exact bytes of a line (without `\n`), as the writer produces them.
pub fn encode(line: &Line) -> Result<String, LedgerError> {
    let mut fields = Vec::with_capacity(512);
    encode::fields(&mut fields, &line.entry).map_err(LedgerError::Encode)?;
    let mut out = Vec::with_capacity(fields.len() + 160);
    encode::line(&mut out, line.v, line.seq, &line.ts, &fields, &line.prev);
    // Every piece is UTF-8 text or ASCII punctuation.
    String::from_utf8(out)
        .map_err(|e| LedgerError::Encode(<serde_json::Error as serde::ser::Error>::custom(e)))
}

/// Current UTC time as RFC 3339 with milliseconds: `2026-11-29T07:28:19.123Z`.
pub fn now_rfc3339() -> String {
    format_ts(time::OffsetDateTime::now_utc())
}

pub(crate) fn format_ts(t: time::OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

/// `<path>.moved-<n>` for the first `n` not taken.
fn aside_path(path: &Path) -> PathBuf {
    let mut n = 1u32;
    loop {
        let candidate = PathBuf::from(format!("{}.moved-{n}", path.display()));
        if !candidate.exists() || n == u32::MAX {
            return candidate;
        }
        n += 1;
    }
}

pub(crate) fn meta_identity(meta: &std::fs::Metadata) -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some((meta.dev(), meta.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        None
    }
}

fn file_identity(file: &File) -> Option<(u64, u64)> {
    file.metadata().ok().as_ref().and_then(meta_identity)
}

/// Why a proxy holding `own` could not vouch for this ledger, if it could not.
pub fn unverifiable(read: &LedgerRead, own: &crate::seal::PublicKeys) -> Option<String> {
    if let Some(p) = read.first_problem() {
        return Some(format!("chain broken at {p}"));
    }
    let report = crate::seal::verify_lines(&read.lines, own);
    unsealed_tail(&report, read.lines.last().map(|l| l.seq))
}

/// Why seals verified as `report` do not vouch for a chain (already found
/// intact) whose last line has seq `last`: a bad seal, none, or lines after
/// the last one.
fn unsealed_tail(report: &SealReport, last: Option<u64>) -> Option<String> {
    let last = last?;
    if let Some((seq, fault)) = report.faults.first() {
        return Some(format!("seal at seq {seq} {fault}"));
    }
    match report.last_valid {
        None => Some("no seals".into()),
        Some(v) if v != last => Some(format!(
            "{} line(s) after the last seal (seq {v})",
            last - v
        )),
        Some(_) => None,
    }
}

/// Makes a newly created file's directory entry durable, so a crash right
/// after creation cannot lose the whole ledger. Best effort: some
/// filesystems refuse to fsync a directory, and the data itself is synced.
fn sync_parent(path: &Path) {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
        tracing::debug!(dir = %dir.display(), error = %e, "could not fsync ledger directory");
    }
}

/// Saves torn bytes to `<path>.torn-<seq>` (or `.torn-<seq>.<n>` if taken),
/// never overwriting an earlier one.
fn save_torn(path: &Path, seq: u64, tail: &mut impl Read) -> Result<PathBuf, LedgerError> {
    let base = format!("{}.torn-{seq}", path.display());
    let mut n = 0;
    loop {
        let candidate = if n == 0 {
            PathBuf::from(&base)
        } else {
            PathBuf::from(format!("{base}.{n}"))
        };
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&candidate)
        {
            Ok(mut f) => {
                let res = std::io::copy(tail, &mut f).and_then(|_| f.sync_all());
                sync_parent(&candidate);
                return res
                    .map(|()| candidate.clone())
                    .map_err(|source| LedgerError::SaveTorn {
                        path: path.to_path_buf(),
                        saved: candidate,
                        source,
                    });
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
            Err(source) => {
                return Err(LedgerError::SaveTorn {
                    path: path.to_path_buf(),
                    saved: candidate,
                    source,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{Entry, ListenerTier, GENESIS_PREV};
    use crate::entry::{RequestLine, SessionLine};
    use crate::seal::Sealer;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            static N: AtomicU32 = AtomicU32::new(0);
            let dir = std::env::temp_dir().join(format!(
                "veris-receipt-ledger-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn session() -> Entry {
        Entry::Session(SessionLine {
            run_id: "run_1".into(),
            tier: ListenerTier::Transparent,
            twin: "http://127.0.0.1:9/".into(),
            pid: 42,
            listen: "127.0.0.1:8080".into(),
            ..SessionLine::test()
        })
    }

    fn request(path: &str) -> Entry {
        Entry::Request(RequestLine {
            query: Some("api_key=abc&limit=1".into()),
            tier: ListenerTier::Transparent,
            bytes_in: 10,
            bytes_out: Some(20),
            duration_ms: 3,
            upstream: "http://127.0.0.1:9/s/sbx_a1b2c3/stripe/v1/charges".into(),
            headers: vec![
                ("authorization".into(), "Bearer sk_test_abcdefgh".into()),
                ("idempotency-key".into(), "k1".into()),
            ],
            ..RequestLine::test("stripe", "POST", path)
        })
    }

    #[test]
    fn ledger_is_send_and_sync() {
        fn assert<T: Send + Sync>() {}
        assert::<Ledger>();
    }

    /// A seal is due once a thousand lines wait, whatever the timer: a
    /// crash under load then leaves at most that many lines unsealed. A
    /// moved-aside file's request lines are counted for the session line.
    #[test]
    fn a_thousand_unsealed_lines_make_a_seal_due() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        // Ready at its first poll: a permit is waiting.
        let due = |ledger: &Ledger| {
            use std::future::Future;
            let fut = std::pin::pin!(ledger.seal_due());
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            fut.poll(&mut cx).is_ready()
        };
        for _ in 0..999 {
            ledger.append(request("/v1/charges")).unwrap();
        }
        assert!(!due(&ledger), "due before a thousand lines");
        ledger.append(request("/v1/charges")).unwrap();
        assert!(due(&ledger), "not due after a thousand lines");
        let sealer = crate::seal::Sealer::generate().unwrap();
        ledger.seal(&sealer, "interval").unwrap();
        ledger.append(request("/v1/charges")).unwrap();
        assert!(!due(&ledger), "due again right after a seal");
        drop(ledger);
        // The byte count over block boundaries: 1,001 request lines.
        assert_eq!(super::write::count_requests(&path), Some(1001));
    }

    /// The threads of this process named `name` (as the kernel keeps it:
    /// its first 15 bytes).
    fn threads_named(name: &str) -> usize {
        let name = &name[..name.len().min(15)];
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter(|t| {
                let comm = t.as_ref().unwrap().path().join("comm");
                std::fs::read_to_string(comm).is_ok_and(|c| c.trim() == name)
            })
            .count()
    }

    /// The nice value of this process's thread named `name` (field 19 of
    /// its `stat`, counted after the command name's closing parenthesis).
    fn thread_nice(name: &str) -> Option<i64> {
        let name = &name[..name.len().min(15)];
        std::fs::read_dir("/proc/self/task").ok()?.find_map(|t| {
            let path = t.ok()?.path();
            let comm = std::fs::read_to_string(path.join("comm")).ok()?;
            if comm.trim() != name {
                return None;
            }
            let stat = std::fs::read_to_string(path.join("stat")).ok()?;
            stat[stat.rfind(')')? + 1..]
                .split_whitespace()
                .nth(16)?
                .parse()
                .ok()
        })
    }

    #[test]
    fn many_ledgers_share_one_sync_thread_and_a_closed_one_reopens_at_once() {
        let dir = TempDir::new();
        let mut ledgers = Vec::new();
        for i in 0..20 {
            let (l, _) = Ledger::open(&dir.0.join(format!("l{i}.jsonl"))).unwrap();
            // Written, so queued for the sync thread's next round.
            l.append(session()).unwrap();
            ledgers.push(l);
        }
        // One sync thread for the process (other tests' ledgers share it).
        assert_eq!(threads_named("veris-ledger-sync"), 1);
        // At the lowest priority, so its wakeups do not preempt the workers
        // answering requests (it sets it first thing: wait for it, bounded).
        let nice = (0..200)
            .map(|_| {
                std::thread::sleep(std::time::Duration::from_millis(10));
                thread_nice("veris-ledger-sync")
            })
            .find(|n| *n == Some(19));
        assert_eq!(nice, Some(Some(19)), "the sync thread's nice");
        // Closed while its file waits for a round: the sync thread keeps
        // no handle (nor the file's lock) of it, so it opens again at once.
        let path = ledgers[0].path().to_path_buf();
        drop(ledgers.remove(0));
        let (again, report) = Ledger::open(&path).unwrap();
        assert_eq!(report.next_seq, 2);
        again.append(request("/v1/charges")).unwrap();
        again.sync().unwrap();
        drop(ledgers);
    }

    #[test]
    fn appends_chain_and_verify() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        let (ledger, report) = Ledger::open(&path).unwrap();
        assert_eq!(report.next_seq, 1);
        assert!(report.torn_tail.is_none() && report.problems.is_empty());
        assert_eq!(ledger.head(), (0, GENESIS_PREV.to_string()));
        assert_eq!(ledger.append(session()).unwrap(), 1);
        assert_eq!(ledger.append(request("/v1/charges")).unwrap(), 2);
        ledger.sync().unwrap();
        let read = read(&path).unwrap();
        assert!(read.problems.is_empty(), "{:?}", read.problems);
        assert!(read.torn_tail.is_none());
        assert_eq!(read.lines.len(), 2);
        assert_eq!(read.lines[0].prev, GENESIS_PREV);
        let bytes = std::fs::read(&path).unwrap();
        let first = bytes.split(|&b| b == b'\n').next().unwrap();
        assert_eq!(read.lines[1].prev, line_hash(first));
        assert_eq!(ledger.head(), read.head);
        assert_eq!(read.head.0, 2);
    }

    #[cfg(unix)]
    #[test]
    fn new_ledger_is_0644() {
        use std::os::unix::fs::PermissionsExt;
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        let _ = Ledger::open(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        // The umask can only take bits away.
        assert_eq!(mode & !0o644, 0, "mode {mode:o}");
        assert_ne!(mode & 0o600, 0);
    }

    #[test]
    fn secrets_never_reach_the_file() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        ledger
            .append(request("/v1/keys/sk_live_abcdefgh1234/roll"))
            .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("sk_live_"), "{text}");
        assert!(!text.contains("sk_test_"), "{text}");
        assert!(text.contains("api_key=[redacted]&limit=1"), "{text}");
        assert!(text.contains(r#"["authorization","[redacted]"]"#), "{text}");
        assert!(text.contains(r#"["idempotency-key","k1"]"#), "{text}");
    }

    #[test]
    fn a_second_writer_is_refused_until_the_first_is_gone() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        let (first, _) = Ledger::open(&path).unwrap();
        first.append(session()).unwrap();
        let Err(err) = Ledger::open(&path) else {
            panic!("a second writer must be refused")
        };
        assert!(matches!(err, LedgerError::Busy { .. }), "{err}");
        assert!(err.to_string().contains("--state-dir"), "{err}");
        drop(first);
        let (second, report) = Ledger::open(&path).unwrap();
        assert_eq!(report.next_seq, 2);
        drop(second);
    }

    #[test]
    fn reopen_continues_seq_and_chain() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        {
            let (ledger, _) = Ledger::open(&path).unwrap();
            ledger.append(session()).unwrap();
            ledger.append(request("/v1/charges")).unwrap();
        }
        let (ledger, report) = Ledger::open(&path).unwrap();
        assert_eq!(report.next_seq, 3);
        assert_eq!(ledger.append(session()).unwrap(), 3);
        let read = read(&path).unwrap();
        assert!(read.problems.is_empty(), "{:?}", read.problems);
        let seqs: Vec<u64> = read.lines.iter().map(|l| l.seq).collect();
        assert_eq!(seqs, [1, 2, 3]);
    }

    #[test]
    fn failed_append_leaves_no_partial_line_and_recovers() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        ledger.append(session()).unwrap();
        let before = std::fs::read(&path).unwrap();
        ledger.fail_next_write();
        let err = ledger.append(request("/v1/charges")).unwrap_err();
        assert!(matches!(err, LedgerError::Write { .. }), "{err:?}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "partial line left behind"
        );
        assert_eq!(ledger.head().0, 1);
        // The disk "recovered": the same seq is used and the chain holds.
        assert_eq!(ledger.append(request("/v1/charges")).unwrap(), 2);
        let read = read(&path).unwrap();
        assert!(read.problems.is_empty(), "{:?}", read.problems);
        assert!(read.torn_tail.is_none());
        assert_eq!(read.lines.len(), 2);
    }

    #[test]
    fn open_sets_a_torn_tail_aside() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        {
            let (ledger, _) = Ledger::open(&path).unwrap();
            ledger.append(session()).unwrap();
            ledger.append(request("/v1/charges")).unwrap();
        }
        let good = std::fs::read(&path).unwrap();
        let torn = br#"{"v":1,"seq":3,"ts":"2026-11-29T07:28:19.123Z","kind":"req"#;
        let mut bytes = good.clone();
        bytes.extend_from_slice(torn);
        std::fs::write(&path, &bytes).unwrap();

        let (ledger, report) = Ledger::open(&path).unwrap();
        assert_eq!(
            report.torn_tail,
            Some(TornTail {
                line: 3,
                bytes: torn.len()
            })
        );
        let saved = report.torn_saved_to.clone().unwrap();
        assert_eq!(saved, dir.0.join("ledger.jsonl.torn-3"));
        assert_eq!(std::fs::read(&saved).unwrap(), torn);
        assert_eq!(std::fs::read(&path).unwrap(), good);
        assert_eq!(report.next_seq, 3);
        let mut s = session();
        if let Entry::Session(SessionLine {
            recovered_torn_tail,
            ..
        }) = &mut s
        {
            *recovered_torn_tail = report.torn_tail;
        }
        assert_eq!(ledger.append(s).unwrap(), 3);
        let read = read(&path).unwrap();
        assert!(read.problems.is_empty(), "{:?}", read.problems);
        match &read.lines[2].entry {
            Entry::Session(SessionLine {
                recovered_torn_tail,
                ..
            }) => assert_eq!(*recovered_torn_tail, report.torn_tail),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_second_torn_tail_with_the_same_seq_is_kept_too() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        std::fs::write(dir.0.join("ledger.jsonl.torn-1"), b"old").unwrap();
        std::fs::write(&path, b"{\"v\":1").unwrap();
        let (_ledger, report) = Ledger::open(&path).unwrap();
        assert_eq!(
            report.torn_saved_to,
            Some(dir.0.join("ledger.jsonl.torn-1.1"))
        );
        assert_eq!(
            std::fs::read(dir.0.join("ledger.jsonl.torn-1")).unwrap(),
            b"old"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"");
    }

    #[test]
    fn sync_thread_stops_on_drop() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        for _ in 0..10 {
            ledger.append(request("/v1/charges")).unwrap();
        }
        drop(ledger); // joins the sync thread; a hang here fails the test run
        assert_eq!(read(&path).unwrap().lines.len(), 10);
    }

    #[test]
    fn concurrent_appends_stay_gapless() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        let ledger = Arc::new(ledger);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let l = Arc::clone(&ledger);
                std::thread::spawn(move || {
                    for _ in 0..25 {
                        l.append(request("/v1/charges")).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let read = read(&path).unwrap();
        assert!(read.problems.is_empty(), "{:?}", read.problems);
        assert_eq!(read.lines.len(), 100);
        assert_eq!(read.head.0, 100);
    }

    /// Polls a future to completion on this thread.
    fn block_on<F: std::future::Future>(fut: F) -> F::Output {
        struct Unpark(std::thread::Thread);
        impl std::task::Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = std::task::Context::from_waker(&waker);
        let mut fut = std::pin::pin!(fut);
        loop {
            if let std::task::Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return v;
            }
            std::thread::park();
        }
    }

    #[test]
    fn many_concurrent_appends_each_get_their_own_seq_and_stay_gapless() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        let ledger = Arc::new(ledger);
        let (tasks, each) = (64, 50);
        let threads: Vec<_> = (0..tasks)
            .map(|t| {
                let l = Arc::clone(&ledger);
                std::thread::spawn(move || {
                    // Queue them all first, so the writer sees crowds.
                    let pending: Vec<_> = (0..each)
                        .map(|i| {
                            (
                                format!("/t/{t}/{i}"),
                                l.append_queued(request(&format!("/t/{t}/{i}"))),
                            )
                        })
                        .collect();
                    pending
                        .into_iter()
                        .map(|(p, a)| (p, block_on(a).unwrap()))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut got: Vec<(String, u64)> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        let read = read(&path).unwrap();
        assert!(read.problems.is_empty(), "{:?}", read.problems);
        assert_eq!(read.lines.len(), tasks * each);
        got.sort_by_key(|(_, s)| *s);
        let seqs: Vec<u64> = got.iter().map(|(_, s)| *s).collect();
        assert_eq!(seqs, (1..=(tasks * each) as u64).collect::<Vec<_>>());
        // Each caller's seq is the line holding its own entry.
        for ((path, seq), line) in got.iter().zip(&read.lines) {
            assert_eq!(line.seq, *seq);
            match &line.entry {
                Entry::Request(RequestLine { path: p, .. }) => assert_eq!(p, path),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(ledger.counters()["request"], (tasks * each) as u64);
        // Whoever led, each thread's lines are in the order it queued them.
        for t in 0..tasks {
            let mine: Vec<u64> = (0..each)
                .map(|i| {
                    let p = format!("/t/{t}/{i}");
                    got.iter().find(|(q, _)| *q == p).unwrap().1
                })
                .collect();
            assert!(mine.windows(2).all(|w| w[0] < w[1]), "{t}: {mine:?}");
        }
    }

    #[test]
    fn an_append_dropped_before_it_led_is_written_by_the_writer_thread() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        drop(ledger.append_queued(session()));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while read(&path).unwrap().lines.is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the line was never written"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(ledger.append(request("/v1/charges")).unwrap(), 2);
    }

    #[test]
    fn a_lone_append_is_written_by_its_caller_when_it_is_polled() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        // Nobody leads the queue and no other line arrived just before: the
        // caller commits its own line at its first poll, so the answer is
        // there without any thread waking it.
        let mut appending = std::pin::pin!(ledger.append_queued(session()));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(matches!(
            std::future::Future::poll(appending.as_mut(), &mut cx),
            std::task::Poll::Ready(Ok(1))
        ));
        assert_eq!(read(&path).unwrap().lines.len(), 1);
    }

    #[test]
    fn queued_entries_reach_the_file_redacted_and_as_serde_writes_them() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        let secret = "sk_live_51HqLyjWDarjtT1zdp7dcXYZ";
        let leaky = |i: u64| {
            Entry::Request(RequestLine {
                query: Some(format!("api_key={secret}&limit=1")),
                bytes_in: 1,
                duration_ms: 1,
                upstream: "http://127.0.0.1:9/s/sbx/stripe/v1/charges".into(),
                headers: vec![
                    ("authorization".into(), format!("Bearer {secret}")),
                    ("x-note".into(), "\"quoted\"\n\u{2028}é".into()),
                ],
                ..RequestLine::test("stripe", "POST", &format!("/v1/charges/{i}"))
            })
        };
        // One batch of many, and one line on its own.
        ledger.pause_writes(true);
        let queued: Vec<_> = (0..40).map(|i| ledger.append_queued(leaky(i))).collect();
        ledger.pause_writes(false);
        for a in queued {
            a.wait().unwrap();
        }
        ledger.append(leaky(40)).unwrap();
        drop(ledger);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 41);
        assert!(!text.contains(secret), "{text}");
        assert!(!text.contains("sk_live_"), "{text}");
        assert!(text.contains(crate::redact::REDACTED));
        // Each line is the serde encoding of what it reads back as, and
        // the chain verifies.
        let read = read(&path).unwrap();
        assert!(read.problems.is_empty(), "{:?}", read.problems);
        for (line, text) in read.lines.iter().zip(text.lines()) {
            assert_eq!(serde_json::to_string(line).unwrap(), text);
        }
    }

    #[test]
    fn a_failed_batch_errors_exactly_its_callers_and_leaves_no_partial_line() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        ledger.append(session()).unwrap();
        // A batch of three that is written.
        ledger.pause_writes(true);
        let ok: Vec<_> = (0..3)
            .map(|i| ledger.append_queued(request(&format!("/ok/{i}"))))
            .collect();
        assert_eq!(ledger.queued(), 3);
        ledger.pause_writes(false);
        let ok: Vec<u64> = ok.into_iter().map(|a| a.wait().unwrap()).collect();
        assert_eq!(ok, [2, 3, 4]);
        let before = std::fs::read(&path).unwrap();
        // A batch of four whose write fails half-way.
        ledger.pause_writes(true);
        let bad: Vec<_> = (0..4)
            .map(|i| ledger.append_queued(request(&format!("/bad/{i}"))))
            .collect();
        ledger.fail_next_write();
        ledger.pause_writes(false);
        for a in bad {
            let err = a.wait().unwrap_err();
            assert!(matches!(err, LedgerError::Write { .. }), "{err:?}");
        }
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "partial line left behind"
        );
        assert_eq!(ledger.head().0, 4);
        // The next one continues the chain with the next seq.
        assert_eq!(ledger.append(request("/after")).unwrap(), 5);
        let read = read(&path).unwrap();
        assert!(
            read.problems.is_empty() && read.torn_tail.is_none(),
            "{:?}",
            read.problems
        );
        let paths: Vec<&str> = read
            .lines
            .iter()
            .filter_map(|l| match &l.entry {
                Entry::Request(RequestLine { path, .. }) => Some(path.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(paths, ["/ok/0", "/ok/1", "/ok/2", "/after"]);
    }

    #[test]
    fn the_ack_comes_after_the_bytes_are_in_the_file() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        let ledger = Arc::new(ledger);
        // Others append meanwhile, so acks arrive from crowded batches.
        let noise: Vec<_> = (0..4)
            .map(|_| {
                let l = Arc::clone(&ledger);
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        l.append(request("/noise")).unwrap();
                    }
                })
            })
            .collect();
        for i in 0..100 {
            let mine = format!("/mine/{i}");
            let seq = if i % 2 == 0 {
                ledger.append(request(&mine)).unwrap()
            } else {
                block_on(ledger.append_queued(request(&mine))).unwrap()
            };
            let text = std::fs::read_to_string(&path).unwrap();
            let line = text
                .split_inclusive('\n')
                .find(|l| l.contains(&format!("\"seq\":{seq},")))
                .unwrap_or_else(|| panic!("seq {seq} not in the file at its ack"));
            assert!(line.ends_with('\n') && line.contains(&mine), "{line}");
        }
        for t in noise {
            t.join().unwrap();
        }
    }

    #[test]
    fn the_index_points_at_its_lines_across_reopen() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        let n = INDEX_EVERY * 2 + 10;
        {
            let (ledger, _) = Ledger::open(&path).unwrap();
            for _ in 0..n {
                drop(ledger.append_queued(request("/x")));
            }
        }
        let bytes = std::fs::read(&path).unwrap();
        let (ledger, _) = Ledger::open(&path).unwrap();
        for _ in 0..5 {
            ledger.append(request("/y")).unwrap();
        }
        let bytes_now = std::fs::read(&path).unwrap();
        assert!(bytes_now.starts_with(&bytes));
        for since in [
            0,
            1,
            INDEX_EVERY - 1,
            INDEX_EVERY,
            INDEX_EVERY + 1,
            2 * INDEX_EVERY + 3,
            n + 2,
        ] {
            let (offset, len) = ledger.position_after(since);
            assert_eq!(len, bytes_now.len() as u64);
            let first: Line = serde_json::from_slice(
                bytes_now[offset as usize..]
                    .split(|&b| b == b'\n')
                    .next()
                    .unwrap(),
            )
            .unwrap();
            assert!(
                first.seq <= since + 1,
                "since {since}: offset of seq {}",
                first.seq
            );
            assert!(
                since + 1 - first.seq < INDEX_EVERY,
                "since {since}: seq {}",
                first.seq
            );
        }
    }

    /// A sealed ledger of `n` requests after a session line, closed by a
    /// `shutdown` seal, written by [`Ledger`]; seals every 100 lines.
    fn sealed(path: &Path, sealer: &Sealer, n: u64) {
        let (ledger, _) = Ledger::open(path).unwrap();
        ledger.append(session()).unwrap();
        for i in 0..n {
            ledger.append(request(&format!("/r/{i}"))).unwrap();
            if i % 100 == 99 {
                ledger.seal(sealer, "interval").unwrap();
            }
        }
        ledger.seal(sealer, "shutdown").unwrap();
    }

    fn own(sealer: &Sealer) -> crate::seal::PublicKeys {
        crate::seal::PublicKeys {
            keys: vec![sealer.public_key()],
        }
    }

    #[test]
    fn a_sealed_ledger_is_continued_from_its_tail_and_found_by_seq() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        let sealer = Sealer::generate().unwrap();
        let n = INDEX_EVERY * 3;
        sealed(&path, &sealer, n);
        let before = read(&path).unwrap();
        let (ledger, report) = Ledger::open_sealed_by(&path, &own(&sealer)).unwrap();
        assert!(report.moved_aside.is_none());
        assert_eq!(report.next_seq, before.head.0 + 1);
        assert_eq!(ledger.head(), before.head);
        // The counters start with the session line the proxy writes next.
        assert!(ledger.counters().is_empty());
        ledger.append(session()).unwrap();
        for _ in 0..INDEX_EVERY + 7 {
            ledger.append(request("/new")).unwrap();
        }
        assert_eq!(ledger.counters()["session"], 1);
        let after = read(&path).unwrap();
        assert!(after.problems.is_empty(), "{:?}", after.problems);
        let bytes = std::fs::read(&path).unwrap();
        let last = after.head.0;
        // Every `since`, in the unread history and in this writer's lines:
        // the offset is a line start at or before the line after `since`.
        for since in (0..=last + 2)
            .step_by(37)
            .chain([before.head.0 - 1, before.head.0, last])
        {
            let (offset, len) = ledger.position_after(since);
            assert_eq!(len, bytes.len() as u64);
            assert!(
                offset == 0 || bytes[offset as usize - 1] == b'\n',
                "since {since}"
            );
            let first: Line = serde_json::from_slice(
                bytes[offset as usize..]
                    .split(|&b| b == b'\n')
                    .next()
                    .unwrap(),
            )
            .unwrap();
            assert!(first.seq <= since + 1, "since {since}: seq {}", first.seq);
            assert!(
                since + 1 - first.seq < INDEX_EVERY,
                "since {since}: seq {}",
                first.seq
            );
        }
    }

    /// A line by seq, read from a few blocks of the file: each seq finds
    /// its own line, one past the end or in a file of other lines none.
    #[test]
    fn a_line_is_found_by_its_seq() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        let sealer = Sealer::generate().unwrap();
        sealed(&path, &sealer, 3000);
        let head = read(&path).unwrap().head.0;
        let file = open_ledger(&path).unwrap();
        for seq in (1..=head).step_by(97).chain([head]) {
            let line = line_at(&file, seq).unwrap().expect("a line");
            assert_eq!(line.seq, seq);
        }
        assert!(matches!(
            line_at(&file, 1).unwrap().unwrap().entry,
            Entry::Session(_)
        ));
        assert!(line_at(&file, head + 1).unwrap().is_none());
        assert!(line_at(&file, 0).unwrap().is_none());
        let empty = dir.0.join("empty.jsonl");
        std::fs::write(&empty, "").unwrap();
        assert!(line_at(&open_ledger(&empty).unwrap(), 1).unwrap().is_none());
    }

    /// The last complete line: the final seal, also behind a torn tail;
    /// none in an empty file or one holding only a torn line.
    #[test]
    fn the_last_line_is_the_last_complete_one() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        let sealer = Sealer::generate().unwrap();
        sealed(&path, &sealer, 40);
        let head = read(&path).unwrap().head.0;
        let last = |p: &Path| last_line(&open_ledger(p).unwrap()).unwrap();
        let l = last(&path).expect("a line");
        assert_eq!(l.seq, head);
        assert!(matches!(l.entry, Entry::Seal { .. }));
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut f, br#"{"v":5,"seq":99,"kind":"se"#).unwrap();
        assert_eq!(last(&path).map(|l| l.seq), Some(head));
        let torn = dir.0.join("torn.jsonl");
        std::fs::write(&torn, br#"{"v":5,"seq":1"#).unwrap();
        assert!(last(&torn).is_none());
        let empty = dir.0.join("empty.jsonl");
        std::fs::write(&empty, "").unwrap();
        assert!(last(&empty).is_none());
    }

    /// Attacks on a stopped proxy's file, then a restart: what the open
    /// does and what a reader of the whole file says.
    #[test]
    fn a_restart_reads_the_tail_and_readers_still_catch_history_edits() {
        let sealer = Sealer::generate().unwrap();
        let keys = own(&sealer);
        let fresh = |name: &str| {
            let dir = TempDir::new();
            let path = dir.0.join(name);
            sealed(&path, &sealer, 250);
            (dir, path)
        };
        let lines_of = |path: &Path| -> Vec<String> {
            std::fs::read_to_string(path)
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect()
        };
        let write = |path: &Path, lines: &[String]| {
            std::fs::write(
                path,
                lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
            )
            .unwrap()
        };

        // (a) A line in the middle edited: the tail still holds our seal,
        // so the file is continued; the reader names the edited line, and
        // any receipt of the file fails on it.
        let (_d, path) = fresh("a.jsonl");
        let mut l = lines_of(&path);
        l[40] = l[40].replace("/r/39", "/r/XX");
        assert!(l[40].contains("/r/XX"));
        write(&path, &l);
        let (ledger, report) = Ledger::open_sealed_by(&path, &keys).unwrap();
        assert!(report.moved_aside.is_none());
        drop(ledger);
        let r = read(&path).unwrap();
        assert_eq!(
            r.first_problem().map(|p| p.line),
            Some(41),
            "{:?}",
            r.problems
        );
        let receipt = crate::receipt::build_file(
            &path,
            &crate::receipt::Options {
                scope: crate::receipt::WindowSpec::All,
                anchor: crate::receipt::Anchor::Pinned(keys.clone()),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            receipt.integrity.status,
            crate::receipt::IntegrityStatus::Failed
        );

        // (b) A torn line after the final seal (a crash mid-write): set
        // aside, and the file is continued.
        let (_d, path) = fresh("b0.jsonl");
        let mut bytes = std::fs::read(&path).unwrap();
        let whole = bytes.len();
        bytes.extend_from_slice(br#"{"v":3,"seq":255,"ts":"#);
        std::fs::write(&path, &bytes).unwrap();
        let (ledger, report) = Ledger::open_sealed_by(&path, &keys).unwrap();
        assert!(report.moved_aside.is_none());
        assert_eq!(
            report.torn_tail.map(|t| (t.line, t.bytes)),
            Some((255, bytes.len() - whole))
        );
        assert_eq!(report.next_seq, 255);
        drop(ledger);
        assert_eq!(std::fs::read(&path).unwrap(), &bytes[..whole]);

        // The tail cut mid-line, lines after the last seal: the torn bytes
        // are set aside and the unsealed rest is moved aside.
        let (_d, path) = fresh("b.jsonl");
        let full = std::fs::read(&path).unwrap();
        let l = lines_of(&path);
        let keep: usize = l[..l.len() - 2].iter().map(|x| x.len() + 1).sum();
        let cut = keep + 20;
        std::fs::write(&path, &full[..cut]).unwrap();
        let (ledger, report) = Ledger::open_sealed_by(&path, &keys).unwrap();
        let torn = report.torn_tail.expect("torn tail");
        assert_eq!((torn.line, torn.bytes), (l.len() - 1, 20));
        assert_eq!(
            std::fs::read(report.torn_saved_to.unwrap()).unwrap(),
            &full[keep..cut]
        );
        let moved = report.moved_aside.expect("moved aside");
        assert_eq!(moved.why, "49 line(s) after the last seal (seq 203)");
        drop(ledger);

        // (c) Lines appended after the final seal, chained correctly.
        let (_d, path) = fresh("c.jsonl");
        let mut l = lines_of(&path);
        let mut forged: Line = serde_json::from_str(&l[5]).unwrap();
        forged.seq = l.len() as u64 + 1;
        forged.prev = line_hash(l.last().unwrap().as_bytes());
        l.push(encode(&forged).unwrap());
        write(&path, &l);
        let (_ledger, report) = Ledger::open_sealed_by(&path, &keys).unwrap();
        let moved = report.moved_aside.expect("moved aside");
        assert_eq!(
            moved.why,
            format!("1 line(s) after the last seal (seq {})", l.len() - 1)
        );
        assert_eq!(moved.head_seq, l.len() as u64);
        assert_eq!(report.next_seq, 1);

        // ... or a seal by another key at the end.
        let (_d, path) = fresh("c2.jsonl");
        let mut l = lines_of(&path);
        let other = Sealer::generate().unwrap();
        let head = line_hash(l.last().unwrap().as_bytes());
        let seal = Line {
            v: crate::entry::LEDGER_VERSION,
            seq: l.len() as u64 + 1,
            ts: now_rfc3339(),
            entry: other.seal(l.len() as u64, &head, "shutdown"),
            prev: head,
        };
        l.push(encode(&seal).unwrap());
        write(&path, &l);
        let (_ledger, report) = Ledger::open_sealed_by(&path, &keys).unwrap();
        let why = report.moved_aside.expect("moved aside").why;
        assert!(why.contains("signed by a key other than"), "{why}");

        // ... or our final seal moved after other lines: it no longer signs
        // the line before it.
        let (_d, path) = fresh("c3.jsonl");
        let mut l = lines_of(&path);
        let last = l.pop().unwrap();
        let mut extra: Line = serde_json::from_str(&l[5]).unwrap();
        extra.seq = l.len() as u64 + 1;
        extra.prev = line_hash(l.last().unwrap().as_bytes());
        l.push(encode(&extra).unwrap());
        let mut seal: Line = serde_json::from_str(&last).unwrap();
        seal.seq += 1;
        l.push(encode(&seal).unwrap());
        write(&path, &l);
        let (_ledger, report) = Ledger::open_sealed_by(&path, &keys).unwrap();
        assert!(report.moved_aside.is_some());

        // (d) The file replaced by one without seals, or by an empty one.
        let (_d, path) = fresh("d.jsonl");
        let l = lines_of(&path);
        write(&path, &l[..3]);
        let (_ledger, report) = Ledger::open_sealed_by(&path, &keys).unwrap();
        assert_eq!(report.moved_aside.expect("moved aside").why, "no seals");
        let (_d, path) = fresh("d2.jsonl");
        std::fs::write(&path, b"").unwrap();
        let (_ledger, report) = Ledger::open_sealed_by(&path, &keys).unwrap();
        assert!(report.moved_aside.is_none());
        assert_eq!(report.next_seq, 1);
    }

    #[test]
    fn subscribers_get_every_committed_line_in_order() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        let mut sub = ledger.subscribe();
        ledger.append(session()).unwrap();
        ledger.append(request("/v1/charges")).unwrap();
        let sealer = Sealer::generate().unwrap();
        let seal = ledger.seal(&sealer, "demand").unwrap();
        assert_eq!((seal.seq, seal.sealed_seq), (3, 2));
        assert_eq!(seal.head, ledger.read_head_hash_of(2));
        // Nothing new since: the head's seal is reused, not appended again.
        assert_eq!(ledger.seal_head(&sealer, "demand").unwrap(), seal);
        assert_eq!(ledger.seal_if_unsealed(&sealer, "interval").unwrap(), None);
        let text = std::fs::read_to_string(&path).unwrap();
        for (i, line) in text.lines().enumerate() {
            let c = sub.try_recv().unwrap();
            assert_eq!(c.seq, i as u64 + 1);
            assert_eq!(&*c.text, line);
        }
        assert!(sub.try_recv().is_err());
        // A failed write is never announced.
        ledger.fail_next_write();
        assert!(ledger.append(request("/v1/x")).is_err());
        assert!(sub.try_recv().is_err());
    }

    #[test]
    fn timestamps_are_utc_millis() {
        let ts = format_ts(time::macros::datetime!(2026-11-29 07:28:19.123456 UTC));
        assert_eq!(ts, "2026-11-29T07:28:19.123Z");
        let now = now_rfc3339();
        assert_eq!(now.len(), 24, "{now}");
        assert!(now.ends_with('Z'));
    }

    #[test]
    fn unknown_kind_is_a_problem_but_chain_continues() {
        let l1 = r#"{"v":1,"seq":1,"ts":"t","kind":"teleport","sig":"x","prev":"0000000000000000000000000000000000000000000000000000000000000000"}"#;
        let l2 = format!(
            r#"{{"v":1,"seq":2,"ts":"t","kind":"blocked","host":"x.test","port":443,"tier":"explicit","reason":"strict","prev":"{}"}}"#,
            line_hash(l1.as_bytes())
        );
        let read = read_bytes(format!("{l1}\n{l2}\n").as_bytes());
        assert_eq!(read.problems.len(), 1, "{:?}", read.problems);
        assert_eq!(read.problems[0].line, 1);
        assert_eq!(read.problems[0].what, "unknown kind `teleport`");
        assert_eq!(read.lines.len(), 1);
        assert_eq!(read.head.0, 2);
    }

    #[test]
    fn garbage_never_panics() {
        for bytes in [
            &b""[..],
            b"\n",
            b"\n\n",
            b"not json\n",
            b"[1,2]\n{}",
            b"{\"v\":1,\"seq\":18446744073709551615}\n{\"seq\":1}\n",
            b"\xff\xfe\n",
        ] {
            let read = read_bytes(bytes);
            if !bytes.is_empty() {
                assert!(!read.problems.is_empty() || read.torn_tail.is_some());
            }
        }
    }
}
