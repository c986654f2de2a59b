//! One append journal for many ledgers of a process: a gateway's sandboxes.
//!
//! A ledger that uses the journal commits each batch of its lines to the
//! journal (one `write(2)`, before any of its callers is answered) and keeps
//! the same bytes in memory; its own file gets them later, in larger writes:
//! when [`FILE_BATCH`] bytes wait, at each seal (a busy ledger seals every
//! second), before it reports its head or a file position, and when it
//! closes. A process writing a hundred ledgers then appends to one hot file
//! per batch instead of a hundred cold ones, and the sync thread fsyncs one
//! file instead of a hundred (BENCHMARKS.md, "the gateway's CPU gap").
//!
//! What it changes for readers: a line is in the journal before its
//! request is answered, and in its ledger's file at most about a second
//! later, or at once for a reader that asks the live process (its head, a
//! seal, a position, its admin API). A reader of the file alone may see it
//! end up to a second behind the live chain: it says less, never more.
//!
//! After a crash, [`Journal::open`] appends to each ledger file the lines
//! the journal holds past the file's end (only lines that continue the
//! file's chain: the right seq and `prev`), before any ledger is opened.
//!
//! Files: `<dir>/journal-<n>.log`, records `J <name> <len>\n` followed by
//! `len` bytes of complete ledger lines. A new segment starts at
//! [`SEGMENT_MAX`] bytes or [`SEGMENT_AGE`]; an old one is deleted once every
//! ledger has written and fsynced what it held, so the journal stays small.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::read::MAX_LINE;
use super::write::{lock, Shared, SyncTarget, SYNCER};
use super::{sync_parent, LedgerError};
use crate::entry::GENESIS_PREV;
use crate::hash::line_hash;

/// A ledger writes what the journal holds for it to its own file once this
/// many bytes wait (else at its next seal, head or close).
pub(super) const FILE_BATCH: usize = 64 * 1024;

/// A segment this long is followed by a new one.
const SEGMENT_MAX: u64 = 64 << 20;

/// A segment this old (and not empty) is followed by a new one, so that
/// a quiet gateway's journal does not hold lines for long either.
const SEGMENT_AGE: Duration = Duration::from_secs(30);

/// The journal of a process's ledgers. Cheap to clone.
#[derive(Clone)]
pub struct Journal {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

pub(super) struct Inner {
    dir: PathBuf,
    segment: Mutex<Segment>,
    /// The current segment's handle for the sync thread, which also retires
    /// old segments after its fsync ([`Inner::after_sync`]).
    sync: Arc<SyncTarget>,
    /// The ledgers writing to it, for retiring segments.
    ledgers: Mutex<Vec<Weak<Shared>>>,
    /// Segments followed by a newer one, deleted once every ledger's file
    /// holds what they hold.
    retiring: Mutex<Vec<PathBuf>>,
}

struct Segment {
    file: File,
    number: u64,
    len: u64,
    opened: Instant,
    /// A failed write may have left bytes past `len`: cut first.
    needs_truncate: bool,
    /// The record being written, kept for its allocation.
    buf: Vec<u8>,
}

/// What [`Journal::open`] found and put back.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Per ledger name: lines appended to its file.
    pub appended: Vec<(String, u64)>,
    /// Per ledger name: why the journal's lines were not appended.
    pub refused: Vec<(String, String)>,
}

fn segment_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("journal-{n}.log"))
}

fn segment_number(name: &str) -> Option<u64> {
    name.strip_prefix("journal-")?
        .strip_suffix(".log")?
        .parse()
        .ok()
}

impl Journal {
    /// Opens the journal in `dir` (made 0700 if missing). Lines left in it
    /// by a process that stopped without writing them to their files are
    /// appended there first: `file_of(name)` says which file a name's lines
    /// belong to (`None`: none any more, they are dropped with the journal).
    /// Then the old segments are deleted and a new one starts.
    pub fn open(
        dir: &Path,
        file_of: impl Fn(&str) -> Option<PathBuf>,
    ) -> Result<(Journal, Recovered), LedgerError> {
        let open_err = |source| LedgerError::Open {
            path: dir.to_path_buf(),
            source,
        };
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(open_err)?;
        }
        let mut old: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
            .map_err(open_err)?
            .flatten()
            .filter_map(|e| {
                let n = segment_number(e.file_name().to_str()?)?;
                Some((n, e.path()))
            })
            .collect();
        old.sort();
        let mut recovered = Recovered::default();
        let mut by_name: Vec<(String, Vec<u8>)> = Vec::new();
        for (_, path) in &old {
            let bytes = std::fs::read(path).map_err(|source| LedgerError::Read {
                path: path.clone(),
                source,
            })?;
            for (name, lines) in records(&bytes) {
                match by_name.iter_mut().find(|(n, _)| n == name) {
                    Some((_, all)) => all.extend_from_slice(lines),
                    None => by_name.push((name.to_string(), lines.to_vec())),
                }
            }
        }
        for (name, lines) in by_name {
            let Some(file) = file_of(&name) else {
                continue;
            };
            match replay(&file, &lines)? {
                Ok(0) => {}
                Ok(n) => recovered.appended.push((name, n)),
                Err(why) => recovered.refused.push((name, why)),
            }
        }
        let number = old.last().map_or(1, |(n, _)| n + 1);
        let segment = Segment::create(dir, number)?;
        for (_, path) in &old {
            if let Err(e) = std::fs::remove_file(path) {
                tracing::warn!(path = %path.display(), error = %e, "could not delete a replayed journal segment");
            }
        }
        sync_parent(&segment_path(dir, number));
        let inner = Arc::new_cyclic(|me: &Weak<Inner>| Inner {
            dir: dir.to_path_buf(),
            sync: Arc::new(SyncTarget::new(
                segment.file.try_clone().ok(),
                segment_path(dir, number),
                Some(me.clone()),
            )),
            segment: Mutex::new(segment),
            ledgers: Mutex::new(Vec::new()),
            retiring: Mutex::new(Vec::new()),
        });
        SYNCER.start().map_err(open_err)?;
        Ok((Journal { inner }, recovered))
    }

    /// The journal's directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    pub(super) fn register(&self, ledger: Weak<Shared>) {
        let mut ledgers = lock(&self.inner.ledgers);
        ledgers.retain(|l| l.strong_count() > 0);
        ledgers.push(ledger);
    }

    /// Appends one batch of `name`'s complete lines as one record, with
    /// one `write(2)`. On failure nothing of the record is left for a
    /// replay to find (the segment is cut back, or cut before the next).
    pub(super) fn append(&self, name: &str, lines: &[u8]) -> std::io::Result<()> {
        let mut s = lock(&self.inner.segment);
        if s.len >= SEGMENT_MAX || (s.len > 0 && s.opened.elapsed() >= SEGMENT_AGE) {
            self.inner.rotate(&mut s);
        }
        if s.needs_truncate {
            s.file.set_len(s.len)?;
            s.needs_truncate = false;
        }
        let mut buf = std::mem::take(&mut s.buf);
        buf.clear();
        buf.extend_from_slice(format!("J {name} {}\n", lines.len()).as_bytes());
        buf.extend_from_slice(lines);
        let wrote = s.file.write_all(&buf);
        match &wrote {
            Ok(()) => s.len += buf.len() as u64,
            Err(_) => {
                if s.file.set_len(s.len).is_err() {
                    s.needs_truncate = true;
                }
            }
        }
        s.buf = buf;
        drop(s);
        if wrote.is_ok() {
            SYNCER.mark(&self.inner.sync);
        }
        wrote
    }

    /// Starts the next segment and retires the current one now.
    #[cfg(test)]
    pub(super) fn rotate_and_retire(&self) {
        self.inner.rotate(&mut lock(&self.inner.segment));
        self.inner.after_sync();
    }
}

impl Inner {
    /// Starts the next segment; the current one waits to be retired. A
    /// failure keeps the current one (and is tried again at the next append).
    fn rotate(&self, s: &mut Segment) {
        let next = match Segment::create(&self.dir, s.number + 1) {
            Ok(next) => next,
            Err(e) => {
                tracing::error!(journal = %self.dir.display(), error = %e, "could not start a new journal segment; the current one grows");
                return;
            }
        };
        sync_parent(&segment_path(&self.dir, next.number));
        self.sync.replace(next.file.try_clone().ok());
        let old = std::mem::replace(s, next);
        lock(&self.retiring).push(segment_path(&self.dir, old.number));
    }

    /// Called by the sync thread after it fsynced the current segment:
    /// retires the segments followed by a newer one once every ledger has
    /// written what it holds to its file and fsynced it.
    pub(super) fn after_sync(&self) {
        let retiring = std::mem::take(&mut *lock(&self.retiring));
        if retiring.is_empty() {
            return;
        }
        let ledgers: Vec<Arc<Shared>> = {
            let mut all = lock(&self.ledgers);
            all.retain(|l| l.strong_count() > 0);
            all.iter().filter_map(Weak::upgrade).collect()
        };
        let mut ok = true;
        for ledger in &ledgers {
            if let Err(e) = ledger.flush().and_then(|()| ledger.sync_now()) {
                tracing::error!(error = %e, "a ledger could not take the journal's lines; the journal keeps them");
                ok = false;
            }
        }
        if !ok {
            lock(&self.retiring).extend(retiring);
            return;
        }
        for path in &retiring {
            if let Err(e) = std::fs::remove_file(path) {
                tracing::warn!(path = %path.display(), error = %e, "could not delete a retired journal segment");
            }
        }
        if let Some(path) = retiring.last() {
            sync_parent(path);
        }
    }
}

impl Segment {
    fn create(dir: &Path, number: u64) -> Result<Segment, LedgerError> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = segment_path(dir, number);
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|source| LedgerError::Open { path, source })?;
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(Segment {
            file,
            number,
            len,
            opened: Instant::now(),
            needs_truncate: false,
            buf: Vec::new(),
        })
    }
}

/// The complete records of a segment, in order; a torn last record (a
/// crash in its write) ends the list.
fn records(bytes: &[u8]) -> Vec<(&str, &[u8])> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
        let Some((name, len)) = std::str::from_utf8(&rest[..nl])
            .ok()
            .and_then(|h| h.strip_prefix("J "))
            .and_then(|h| h.split_once(' '))
            .and_then(|(name, len)| Some((name, len.parse::<usize>().ok()?)))
        else {
            break;
        };
        let body = &rest[nl + 1..];
        if body.len() < len {
            break;
        }
        out.push((name, &body[..len]));
        rest = &body[len..];
    }
    out
}

/// Names and line counts of a segment's records, for tests.
#[cfg(test)]
pub(super) fn records_of(bytes: &[u8]) -> Vec<(String, usize)> {
    records(bytes)
        .into_iter()
        .map(|(n, l)| (n.to_string(), l.iter().filter(|&&b| b == b'\n').count()))
        .collect()
}

#[derive(Deserialize)]
struct SeqPrev {
    seq: u64,
    prev: String,
}

/// Appends to `path` the lines of `lines` that continue its chain (the
/// first with the seq after the file's last complete line and its hash as
/// `prev`, then each continuing the one before), cutting a torn last line
/// the journal holds whole. The count appended, or why none could be.
fn replay(path: &Path, lines: &[u8]) -> Result<Result<u64, String>, LedgerError> {
    let read_err = |source| LedgerError::Read {
        path: path.to_path_buf(),
        source,
    };
    let write_err = |source| LedgerError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut file = match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Err("its ledger file is gone".into()))
        }
        Err(source) => {
            return Err(LedgerError::Open {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let (good_len, last) = last_complete_line(&mut file).map_err(read_err)?;
    let (mut seq, mut head) = match &last {
        Some(line) => match serde_json::from_slice::<SeqPrev>(line) {
            Ok(l) => (l.seq, line_hash(line)),
            Err(_) => return Ok(Err("its file's last line is not a ledger line".into())),
        },
        None => (0, GENESIS_PREV.to_string()),
    };
    let mut from = None;
    let mut to = 0;
    let mut at = 0;
    for raw in lines.split_inclusive(|&b| b == b'\n') {
        let start = at;
        at += raw.len();
        let line = raw.strip_suffix(b"\n").unwrap_or(raw);
        let Ok(l) = serde_json::from_slice::<SeqPrev>(line) else {
            break;
        };
        if from.is_none() && l.seq <= seq {
            continue;
        }
        if l.seq != seq + 1 || l.prev != head {
            if from.is_none() {
                return Ok(Err(format!(
                    "the journal's next line (seq {}) does not continue the file's chain (ends at seq {seq})",
                    l.seq
                )));
            }
            break;
        }
        from.get_or_insert(start);
        to = at;
        seq = l.seq;
        head = line_hash(line);
    }
    let Some(from) = from else {
        return Ok(Ok(0));
    };
    let take = &lines[from..to];
    file.set_len(good_len).map_err(write_err)?;
    file.seek(SeekFrom::End(0)).map_err(write_err)?;
    file.write_all(take).map_err(write_err)?;
    file.sync_data().map_err(|source| LedgerError::Sync {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(Ok(take.iter().filter(|&&b| b == b'\n').count() as u64))
}

/// The length of `file` up to its last `\n`, and the line before it (read
/// from the end: at most one line's bytes).
fn last_complete_line(file: &mut File) -> std::io::Result<(u64, Option<Vec<u8>>)> {
    let len = file.metadata()?.len();
    let window = len.min(2 * MAX_LINE as u64 + 2);
    let mut buf = vec![0; window as usize];
    file.seek(SeekFrom::Start(len - window))?;
    file.read_exact(&mut buf)?;
    let Some(end) = buf.iter().rposition(|&b| b == b'\n') else {
        if window < len {
            return Err(std::io::Error::other(
                "no line end in the file's last two lines' worth of bytes",
            ));
        }
        return Ok((0, None));
    };
    let start = buf[..end]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |p| p + 1);
    let good_len = len - window + end as u64 + 1;
    Ok((good_len, Some(buf[start..end].to_vec())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_stop_at_a_torn_one() {
        let mut bytes = b"J a 4\nxyz\nJ b 2\nq\n".to_vec();
        assert_eq!(
            records(&bytes),
            vec![("a", &b"xyz\n"[..]), ("b", &b"q\n"[..])]
        );
        bytes.extend_from_slice(b"J a 9\nshort");
        assert_eq!(records(&bytes).len(), 2);
        bytes.truncate(bytes.len() - 11);
        bytes.extend_from_slice(b"J a");
        assert_eq!(records(&bytes).len(), 2);
    }

    #[test]
    fn segment_names_parse() {
        assert_eq!(segment_number("journal-12.log"), Some(12));
        assert_eq!(segment_number("journal-x.log"), None);
        assert_eq!(segment_number("ledger.jsonl"), None);
    }
}
