//! The ledger file: the writer that appends hash-chained lines to
//! `ledger.jsonl`, and the reader that verifies them. The line format is
//! documented in [`crate::entry`]; in short, every line is
//! `{"v":1,"seq":N,"ts":"…","kind":"…",<fields>,"prev":"<sha256 hex of the previous line>"}\n`.
//!
//! Writer guarantees, which the proxy relies on:
//! - [`Ledger::append`] returns only after the whole line has been handed to
//!   the kernel (`write_all`), so a line the client could have seen survives a
//!   proxy crash; fsync is batched by a background thread (at most every
//!   50 ms while there are unsynced writes), or forced with [`Ledger::sync`].
//! - A failed append leaves no partial line: the file is truncated back to the
//!   last good length, the error is returned (the proxy then answers `503
//!   veris_ledger_unavailable`), and the next append retries normally.
//! - On open, a torn last line (no trailing `\n`) is moved aside to
//!   `<path>.torn-<seq>` and reported, never silently accepted or deleted.
//!
//! The reader checks every line (JSON, `v`, gapless `seq`, `prev` hash) and
//! reports problems by 1-based line number; it never panics on bad input.
//!
//! Seals ([`Ledger::seal`]) are appended under the same lock as every other
//! line, so the head they sign is the line right before them. Readers that
//! follow the ledger live ([`Ledger::subscribe`]) get every committed line,
//! in seq order, after it reached the kernel.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::entry::{Entry, Line, GENESIS_PREV, KINDS, LEDGER_VERSION, READABLE_VERSIONS};
use crate::redact;

pub use crate::hash::line_hash;
use crate::seal::Sealer;

pub use crate::entry::TornTail;

/// How long the sync thread waits between two fsyncs while writes continue.
const SYNC_INTERVAL: Duration = Duration::from_millis(50);

/// Lines a slow live reader may fall behind before it is told it lagged
/// (it then re-reads the file from its last seq, so nothing is lost).
const SUBSCRIBER_BUFFER: usize = 4096;

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
    /// Sorted by line number; the first one is "the first bad line".
    pub problems: Vec<Problem>,
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
    serde_json::to_string(line).map_err(LedgerError::Encode)
}

/// Current UTC time as RFC 3339 with milliseconds: `2026-11-29T07:28:19.123Z`.
pub fn now_rfc3339() -> String {
    format_ts(time::OffsetDateTime::now_utc())
}

fn format_ts(t: time::OffsetDateTime) -> String {
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

/// Reads and verifies a ledger file. A missing file is an empty ledger.
pub fn read(path: &Path) -> Result<LedgerRead, LedgerError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(read_bytes(&bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(read_bytes(&[])),
        Err(source) => Err(LedgerError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// What one complete line told the chain check.
struct Link {
    line: usize,
    seq: Option<u64>,
    prev: Option<String>,
    hash: String,
    /// `seq` differs from the expected one (a gap explains a prev mismatch).
    gap: bool,
}

/// Reads and verifies ledger bytes: JSON, `v`, gapless `seq` from 1, and
/// `prev` against the previous line's hash. Unknown kinds and malformed
/// lines are problems, never panics.
pub fn read_bytes(bytes: &[u8]) -> LedgerRead {
    let mut out = LedgerRead {
        head: (0, GENESIS_PREV.to_string()),
        ..LedgerRead::default()
    };
    let (complete, tail) = match bytes.iter().rposition(|&b| b == b'\n') {
        Some(i) => (&bytes[..=i], &bytes[i + 1..]),
        None => (&bytes[..0], bytes),
    };
    out.good_len = complete.len() as u64;

    let mut links: Vec<Link> = Vec::new();
    let mut expected_seq: u64 = 1;
    let mut line_no = 0;
    // `split` on a text ending in '\n' yields a final empty piece: skip it.
    let pieces = complete.split(|&b| b == b'\n');
    let count = complete.iter().filter(|&&b| b == b'\n').count();
    for raw in pieces.take(count) {
        line_no += 1;
        let hash = line_hash(raw);
        let mut link = Link {
            line: line_no,
            seq: None,
            prev: None,
            hash,
            gap: false,
        };
        if raw.is_empty() {
            out.problems.push(Problem {
                line: line_no,
                seq: None,
                what: "empty line".into(),
            });
        } else {
            match serde_json::from_slice::<Line>(raw) {
                Ok(line) => {
                    link.seq = Some(line.seq);
                    link.prev = Some(line.prev.clone());
                    if !READABLE_VERSIONS.contains(&line.v) {
                        out.problems.push(Problem {
                            line: line_no,
                            seq: Some(line.seq),
                            what: format!("unsupported version v={}", line.v),
                        });
                    }
                    out.lines.push(line);
                }
                Err(err) => {
                    // Keep the chain check going with whatever fields exist.
                    let value = serde_json::from_slice::<serde_json::Value>(raw).ok();
                    let obj = value.as_ref().and_then(|v| v.as_object());
                    link.seq = obj.and_then(|o| o.get("seq")).and_then(|s| s.as_u64());
                    link.prev = obj
                        .and_then(|o| o.get("prev"))
                        .and_then(|p| p.as_str())
                        .map(str::to_string);
                    let what = match obj.and_then(|o| o.get("kind")).and_then(|k| k.as_str()) {
                        None if obj.is_none() => "not a JSON object".to_string(),
                        Some(kind) if !KINDS.contains(&kind) => format!("unknown kind `{kind}`"),
                        _ => format!("malformed line: {err}"),
                    };
                    out.problems.push(Problem {
                        line: line_no,
                        seq: link.seq,
                        what,
                    });
                }
            }
        }
        match link.seq {
            Some(seq) if seq != expected_seq => {
                link.gap = true;
                let what = if seq > expected_seq {
                    format!(
                        "seq gap: expected {expected_seq}, found {seq} ({} line(s) missing)",
                        seq - expected_seq
                    )
                } else {
                    format!("seq out of order: expected {expected_seq}, found {seq}")
                };
                out.problems.push(Problem {
                    line: line_no,
                    seq: Some(seq),
                    what,
                });
                expected_seq = seq.saturating_add(1);
            }
            Some(seq) => expected_seq = seq.saturating_add(1),
            None => expected_seq = expected_seq.saturating_add(1),
        }
        links.push(link);
    }

    chain_problems(&links, &mut out.problems);
    out.problems.sort_by_key(|p| p.line);

    if let Some(last) = links.last() {
        out.head = (last.seq.unwrap_or(expected_seq - 1), last.hash.clone());
    }
    if !tail.is_empty() {
        out.torn_tail = Some(TornTail {
            line: line_no + 1,
            bytes: tail.len(),
        });
    }
    out
}

/// Compares each line's `prev` with the previous line's hash and says which
/// line is to blame. An edit to line k changes its hash, so line k+1's `prev`
/// no longer matches; line k is named ("altered"). If line k's own `prev` was
/// edited too, both links break and line k is still the one named. A broken
/// link at a seq gap is explained by the gap (lines deleted).
fn chain_problems(links: &[Link], problems: &mut Vec<Problem>) {
    let broken: Vec<bool> = links
        .iter()
        .enumerate()
        .map(|(i, link)| {
            let expected = if i == 0 {
                GENESIS_PREV
            } else {
                links[i - 1].hash.as_str()
            };
            link.prev.as_deref().is_some_and(|p| p != expected)
        })
        .collect();
    let mut i = 0;
    while i < links.len() {
        if !broken[i] {
            i += 1;
            continue;
        }
        let link = &links[i];
        if i == 0 {
            problems.push(Problem {
                line: link.line,
                seq: link.seq,
                what: "prev hash mismatch: first line does not start the chain".into(),
            });
        } else if link.gap {
            problems.push(Problem {
                line: link.line,
                seq: link.seq,
                what: "prev hash mismatch after the seq gap".into(),
            });
        } else if broken.get(i + 1).copied().unwrap_or(false) && !links[i + 1].gap {
            problems.push(Problem {
                line: link.line,
                seq: link.seq,
                what:
                    "prev hash mismatch (line altered: next line's prev does not match it either)"
                        .into(),
            });
            i += 2;
            continue;
        } else {
            let before = &links[i - 1];
            problems.push(Problem {
                line: before.line,
                seq: before.seq,
                what: format!(
                    "prev hash mismatch (line altered: its hash does not match line {}'s prev)",
                    link.line
                ),
            });
        }
        i += 1;
    }
}

/// Write-side state, behind the append mutex.
struct Writer {
    file: File,
    next_seq: u64,
    head_hash: String,
    /// Length of the file up to the last complete line we know of.
    good_len: u64,
    /// The newest seal line written by this writer.
    last_seal: Option<SealInfo>,
    /// A failed append may have left bytes past `good_len` that could not
    /// be truncated yet; the next append truncates first.
    needs_truncate: bool,
    /// Device and inode of the file this writer appends to, to notice the
    /// path being pointed at another file.
    identity: Option<(u64, u64)>,
    /// What the writer found done to its file behind its back (sticky).
    tampered: Option<String>,
    #[cfg(test)]
    fail_next_write: bool,
}

#[derive(Default)]
struct SyncState {
    dirty: bool,
    shutdown: bool,
}

struct Shared {
    writer: Mutex<Writer>,
    sync_state: Mutex<SyncState>,
    wake: Condvar,
    /// A second handle to the same file, so fsync never holds the append lock.
    sync_file: File,
    path: PathBuf,
    /// Every committed line, for live readers (admin `/events`).
    committed: tokio::sync::broadcast::Sender<Committed>,
}

impl Shared {
    fn writer(&self) -> MutexGuard<'_, Writer> {
        // A panic while holding the lock cannot leave the writer in a state
        // worse than a failed append, which the next append repairs.
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sync_state(&self) -> MutexGuard<'_, SyncState> {
        self.sync_state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sync_now(&self) -> Result<(), LedgerError> {
        self.sync_file
            .sync_data()
            .map_err(|source| LedgerError::Sync {
                path: self.path.clone(),
                source,
            })
    }
}

/// The append-only writer. `Send + Sync`; appends are serialized internally.
pub struct Ledger {
    shared: Arc<Shared>,
    syncer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("path", &self.shared.path)
            .finish_non_exhaustive()
    }
}

impl Ledger {
    /// Opens or creates the ledger (mode 0644), finds the head (last seq and
    /// line hash), moves a torn last line aside into `<path>.torn-<seq>`
    /// (kept, never deleted) and reports it, and starts the sync thread.
    pub fn open(path: &Path) -> Result<(Ledger, OpenReport), LedgerError> {
        let open_err = |source| LedgerError::Open {
            path: path.to_path_buf(),
            source,
        };
        let mut opts = OpenOptions::new();
        opts.read(true).append(true).create(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o644);
        }
        let existed = path.exists();
        let mut file = opts.open(path).map_err(open_err)?;
        // One writer per ledger: an advisory lock held for the writer's lifetime
        // (released by the kernel if the process dies).
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(LedgerError::Busy {
                    path: path.to_path_buf(),
                })
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(open_err(e)),
        }
        if !existed {
            sync_parent(path);
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|source| LedgerError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        let read = read_bytes(&bytes);
        let next_seq = read.head.0.saturating_add(1);
        let mut torn_saved_to = None;
        if read.torn_tail.is_some() {
            let tail = &bytes[read.good_len as usize..];
            let saved = save_torn(path, next_seq, tail)?;
            file.set_len(read.good_len).map_err(open_err)?;
            file.sync_all().map_err(open_err)?;
            tracing::warn!(
                ledger = %path.display(),
                saved = %saved.display(),
                bytes = tail.len(),
                "ledger had a torn last line; moved it aside"
            );
            torn_saved_to = Some(saved);
        }
        if let Some(p) = read.first_problem() {
            tracing::warn!(ledger = %path.display(), problem = %p, problems = read.problems.len(), "existing ledger does not verify");
        }
        let sync_file = file.try_clone().map_err(open_err)?;
        let identity = file_identity(&file);
        let shared = Arc::new(Shared {
            writer: Mutex::new(Writer {
                file,
                next_seq,
                head_hash: read.head.1.clone(),
                good_len: read.good_len,
                last_seal: None,
                needs_truncate: false,
                identity,
                tampered: None,
                #[cfg(test)]
                fail_next_write: false,
            }),
            sync_state: Mutex::new(SyncState::default()),
            wake: Condvar::new(),
            sync_file,
            path: path.to_path_buf(),
            committed: tokio::sync::broadcast::channel(SUBSCRIBER_BUFFER).0,
        });
        let bg = Arc::clone(&shared);
        let syncer = std::thread::Builder::new()
            .name("veris-ledger-sync".into())
            .spawn(move || sync_loop(&bg))
            .map_err(open_err)?;
        let report = OpenReport {
            next_seq,
            torn_tail: read.torn_tail,
            torn_saved_to,
            problems: read.problems,
            moved_aside: None,
        };
        Ok((
            Ledger {
                shared,
                syncer: Some(syncer),
            },
            report,
        ))
    }

    /// Opens the ledger like [`Ledger::open`], but continues an existing file
    /// only when this proxy can vouch for all of it: an intact chain whose
    /// seals all verify with `own` and whose last line is such a seal.
    /// Anything else (a chain break, an unsealed tail, no seals, another
    /// key) is moved aside to `<path>.moved-<n>` (kept, readable) and a new
    /// chain starts; the report names the moved file and its head, for the
    /// session line (DESIGN §7a.4). A proxy never seals over history it did
    /// not write.
    pub fn open_sealed_by(
        path: &Path,
        own: &crate::seal::PublicKeys,
    ) -> Result<(Ledger, OpenReport), LedgerError> {
        let (ledger, report) = Ledger::open(path)?;
        let existing = read(path)?;
        let Some(why) = unverifiable(&existing, own) else {
            return Ok((ledger, report));
        };
        drop(ledger);
        let to = aside_path(path);
        std::fs::rename(path, &to).map_err(|source| LedgerError::MoveAside {
            path: path.to_path_buf(),
            to: to.clone(),
            source,
        })?;
        sync_parent(path);
        tracing::warn!(ledger = %path.display(), moved_to = %to.display(), %why, "existing ledger cannot be verified with this proxy's key; moved it aside and starting a new chain");
        let (ledger, mut fresh) = Ledger::open(path)?;
        fresh.torn_tail = report.torn_tail;
        fresh.torn_saved_to = report.torn_saved_to;
        fresh.moved_aside = Some(Box::new(crate::entry::MovedAside {
            file: to.display().to_string(),
            head_seq: existing.head.0,
            head_hash: existing.head.1,
            why,
        }));
        Ok((ledger, fresh))
    }

    /// Redacts the entry, assigns `seq`, `ts` and `prev`, and writes the line
    /// plus `\n` in one `write_all`. Returns the line's seq once the kernel
    /// has it. On failure the file is truncated back to the last good length
    /// and the error returned; the next append retries normally.
    pub fn append(&self, entry: Entry) -> Result<u64, LedgerError> {
        // Redaction needs no lock; seq, ts and prev are assigned under it so
        // that file order, seq order and time order agree.
        let entry = redact::entry(entry);
        let mut w = self.shared.writer();
        self.append_locked(&mut w, entry)
    }

    /// Appends a seal over the current head (whatever line is last, a seal
    /// included) and returns it. `reason`: `interval`, `shutdown`, `demand`.
    pub fn seal(&self, sealer: &Sealer, reason: &str) -> Result<SealInfo, LedgerError> {
        let w = self.shared.writer();
        self.seal_locked(w, sealer, reason)
    }

    /// Appends a seal only when lines were written since this writer's last
    /// seal (or it never sealed and the ledger is not empty): the interval
    /// timer's call, so an idle proxy writes nothing.
    pub fn seal_if_unsealed(
        &self,
        sealer: &Sealer,
        reason: &str,
    ) -> Result<Option<SealInfo>, LedgerError> {
        let w = self.shared.writer();
        let head = w.next_seq - 1;
        if head == 0 || w.last_seal.as_ref().is_some_and(|s| s.seq == head) {
            return Ok(None);
        }
        self.seal_locked(w, sealer, reason).map(Some)
    }

    fn seal_locked(
        &self,
        mut w: MutexGuard<'_, Writer>,
        sealer: &Sealer,
        reason: &str,
    ) -> Result<SealInfo, LedgerError> {
        self.check_file(&mut w)?;
        let sealed_seq = w.next_seq - 1;
        let head = w.head_hash.clone();
        let signature = sealer.sign(sealed_seq, &head);
        let entry = Entry::Seal {
            sealed_seq,
            signature: signature.clone(),
            key_id: sealer.key_id().to_string(),
            reason: reason.to_string(),
        };
        let seq = self.append_locked(&mut w, entry)?;
        let info = SealInfo {
            seq,
            sealed_seq,
            head,
            signature,
            key_id: sealer.key_id().to_string(),
            reason: reason.to_string(),
            line_hash: w.head_hash.clone(),
            tampered: w.tampered.clone(),
        };
        w.last_seal = Some(info.clone());
        Ok(info)
    }

    /// A seal over the current head: the last one this writer appended when
    /// nothing was written since, else a new one. As strong as a new seal
    /// for a reader (the file must still hold a valid seal at `seq`, and a
    /// file cut before it fails), without growing an idle ledger each time a
    /// dashboard polls.
    pub fn seal_head(&self, sealer: &Sealer, reason: &str) -> Result<SealInfo, LedgerError> {
        let mut w = self.shared.writer();
        self.check_file(&mut w)?;
        let head = w.next_seq - 1;
        if let Some(last) = w.last_seal.as_ref().filter(|s| s.seq == head) {
            return Ok(last.clone());
        }
        self.seal_locked(w, sealer, reason)
    }

    /// What this writer found done to its file behind its back, if anything.
    pub fn tampered(&self) -> Option<String> {
        self.shared.writer().tampered.clone()
    }

    /// Looks for the file being replaced, cut or extended by someone else
    /// (the workload may share the proxy's uid). A finding is recorded once
    /// as a `tamper` line in this writer's own chain, kept for every later
    /// seal ([`SealInfo::tampered`]) and logged; the reader of a live proxy
    /// then fails the receipt even where the file looks whole.
    fn check_file(&self, w: &mut Writer) -> Result<(), LedgerError> {
        let path = &self.shared.path;
        let finding = match std::fs::metadata(path) {
            Err(e) => Some((
                "replaced",
                format!(
                    "the ledger path no longer names the proxy's file ({})",
                    e.kind()
                ),
            )),
            Ok(meta) if w.identity.is_some() && meta_identity(&meta) != w.identity => Some((
                "replaced",
                "another file was put at the ledger path while the proxy wrote to its own".into(),
            )),
            Ok(_) => match w.file.metadata().map(|m| m.len()) {
                Ok(len) if len < w.good_len => Some((
                    "cut",
                    format!(
                        "the ledger file was cut to {len} bytes; the proxy had written {}",
                        w.good_len
                    ),
                )),
                Ok(len) if len > w.good_len && !w.needs_truncate => Some((
                    "extended",
                    format!(
                        "{} byte(s) the proxy did not write were added to the ledger file",
                        len - w.good_len
                    ),
                )),
                _ => None,
            },
        };
        let Some((what, detail)) = finding else {
            return Ok(());
        };
        if w.tampered.is_some() {
            return Ok(());
        }
        tracing::error!(ledger = %path.display(), what, %detail, "the ledger file was changed behind the proxy's back");
        w.tampered = Some(format!("{what}: {detail}"));
        if what != "replaced" {
            // Appends land at the file's end (O_APPEND): track that end, so
            // a failed write truncates back to it and nothing else.
            w.good_len = w.file.metadata().map(|m| m.len()).unwrap_or(w.good_len);
        }
        let entry = Entry::Tamper {
            what: what.to_string(),
            detail,
        };
        self.append_locked(w, entry).map(|_| ())
    }

    /// Every line committed from now on, in seq order. A receiver that falls
    /// more than a few thousand lines behind gets `Lagged` and should re-read
    /// the file from the last seq it saw.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Committed> {
        self.shared.committed.subscribe()
    }

    fn append_locked(&self, w: &mut Writer, entry: Entry) -> Result<u64, LedgerError> {
        let write_err = |source| LedgerError::Write {
            path: self.shared.path.clone(),
            source,
        };
        if w.needs_truncate {
            let len = w.good_len;
            w.file.set_len(len).map_err(write_err)?;
            w.needs_truncate = false;
            tracing::info!(ledger = %self.shared.path.display(), "ledger writable again");
        }
        let line = Line {
            v: LEDGER_VERSION,
            seq: w.next_seq,
            ts: now_rfc3339(),
            entry,
            prev: w.head_hash.clone(),
        };
        let text = encode(&line)?;
        let mut buf = Vec::with_capacity(text.len() + 1);
        buf.extend_from_slice(text.as_bytes());
        buf.push(b'\n');
        if let Err(source) = w.write_line(&buf) {
            let len = w.good_len;
            if let Err(e) = w.file.set_len(len) {
                w.needs_truncate = true;
                tracing::error!(ledger = %self.shared.path.display(), error = %e, "could not truncate ledger after a failed write; will retry");
            }
            tracing::error!(ledger = %self.shared.path.display(), error = %source, seq = line.seq, "ledger write failed");
            return Err(write_err(source));
        }
        w.good_len += buf.len() as u64;
        w.head_hash = line_hash(text.as_bytes());
        w.next_seq = w.next_seq.saturating_add(1);
        // Sent under the lock so live readers see lines in seq order; no
        // receiver is not an error.
        let _ = self.shared.committed.send(Committed {
            seq: line.seq,
            text: Arc::from(text.as_str()),
        });
        self.shared.sync_state().dirty = true;
        self.shared.wake.notify_all();
        Ok(line.seq)
    }

    /// Fsyncs now.
    pub fn sync(&self) -> Result<(), LedgerError> {
        self.shared.sync_now()
    }

    /// The ledger file.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Last written seq (0 when empty) and that line's hash.
    pub fn head(&self) -> (u64, String) {
        let w = self.shared.writer();
        (w.next_seq - 1, w.head_hash.clone())
    }

    /// The hash of line `seq` as read back from the file.
    #[cfg(test)]
    fn read_head_hash_of(&self, seq: u64) -> String {
        let bytes = std::fs::read(&self.shared.path).unwrap_or_default();
        let line = bytes
            .split(|&b| b == b'\n')
            .nth(seq as usize - 1)
            .unwrap_or(&[]);
        line_hash(line)
    }

    /// Makes the next write fail after writing half its bytes.
    #[cfg(test)]
    fn fail_next_write(&self) {
        self.shared.writer().fail_next_write = true;
    }
}

impl Writer {
    fn write_line(&mut self, buf: &[u8]) -> std::io::Result<()> {
        #[cfg(test)]
        if std::mem::take(&mut self.fail_next_write) {
            self.file.write_all(&buf[..buf.len() / 2])?;
            return Err(std::io::Error::other("injected write failure"));
        }
        self.file.write_all(buf)
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        self.shared.sync_state().shutdown = true;
        self.shared.wake.notify_all();
        if let Some(handle) = self.syncer.take() {
            let _ = handle.join();
        }
    }
}

/// Fsyncs while there are unsynced writes, at most once per
/// [`SYNC_INTERVAL`]; a final fsync on shutdown.
fn sync_loop(shared: &Shared) {
    loop {
        let mut st = shared.sync_state();
        while !st.dirty && !st.shutdown {
            st = shared.wake.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        let shutdown = st.shutdown;
        let dirty = std::mem::take(&mut st.dirty);
        drop(st);
        if dirty {
            if let Err(e) = shared.sync_now() {
                tracing::error!(ledger = %shared.path.display(), error = %e, "ledger fsync failed");
                // Try again on the next round rather than forget the writes.
                shared.sync_state().dirty = true;
            }
        }
        if shutdown {
            return;
        }
        // Batch: writes arriving during the pause share the next fsync. The
        // wait ends early on shutdown.
        let st = shared.sync_state();
        let _ = shared
            .wake
            .wait_timeout_while(st, SYNC_INTERVAL, |s| !s.shutdown);
    }
}

/// Why a proxy holding `own` could not vouch for this ledger, if it could not.
pub fn unverifiable(read: &LedgerRead, own: &crate::seal::PublicKeys) -> Option<String> {
    if let Some(p) = read.first_problem() {
        return Some(format!("chain broken at {p}"));
    }
    let last = read.lines.last()?;
    let report = crate::seal::verify_lines(&read.lines, own);
    if let Some((seq, fault)) = report.faults.first() {
        return Some(format!("seal at seq {seq} {fault}"));
    }
    match report.last_valid {
        None => Some("no seals".into()),
        Some(v) if v != last.seq => Some(format!(
            "{} line(s) after the last seal (seq {v})",
            last.seq - v
        )),
        Some(_) => None,
    }
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

fn meta_identity(meta: &std::fs::Metadata) -> Option<(u64, u64)> {
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
fn save_torn(path: &Path, seq: u64, tail: &[u8]) -> Result<PathBuf, LedgerError> {
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
                let res = f.write_all(tail).and_then(|()| f.sync_all());
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
    use crate::entry::{ListenerTier, Mode};
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
        Entry::Session {
            run_id: "run_1".into(),
            sandbox_id: "sbx_a1b2c3".into(),
            mode: Mode::Passthrough,
            tier: ListenerTier::Transparent,
            twin: "http://127.0.0.1:9/".into(),
            pid: 42,
            version: "0.1.0".into(),
            listen: "127.0.0.1:8080".into(),
            recovered_torn_tail: None,
            key_id: None,
            public_key: None,
            key_storage: None,
            proxy_uid: None,
            workload_uid: None,
            twin_heads: None,
            moved_aside: None,
            coverage: None,
        }
    }

    fn request(path: &str) -> Entry {
        Entry::Request {
            service: "stripe".into(),
            host: "api.stripe.com".into(),
            method: "POST".into(),
            path: path.into(),
            query: Some("api_key=abc&limit=1".into()),
            status: 200,
            http: "HTTP/1.1".into(),
            tier: ListenerTier::Transparent,
            bytes_in: 10,
            bytes_out: Some(20),
            duration_ms: 3,
            upstream: "http://127.0.0.1:9/s/sbx_a1b2c3/stripe/v1/charges".into(),
            headers: vec![
                ("authorization".into(), "Bearer sk_test_abcdefgh".into()),
                ("idempotency-key".into(), "k1".into()),
            ],
            websocket: false,
            client_gone: false,
        }
    }

    #[test]
    fn ledger_is_send_and_sync() {
        fn assert<T: Send + Sync>() {}
        assert::<Ledger>();
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
        if let Entry::Session {
            recovered_torn_tail,
            ..
        } = &mut s
        {
            *recovered_torn_tail = report.torn_tail;
        }
        assert_eq!(ledger.append(s).unwrap(), 3);
        let read = read(&path).unwrap();
        assert!(read.problems.is_empty(), "{:?}", read.problems);
        match &read.lines[2].entry {
            Entry::Session {
                recovered_torn_tail,
                ..
            } => assert_eq!(*recovered_torn_tail, report.torn_tail),
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

    #[test]
    fn subscribers_get_every_committed_line_in_order() {
        let dir = TempDir::new();
        let path = dir.0.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        let mut sub = ledger.subscribe();
        ledger.append(session()).unwrap();
        ledger.append(request("/v1/charges")).unwrap();
        let sealer = Sealer::ephemeral().unwrap();
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
