//! The writer. Callers redact their entry and encode it into the queue's
//! batch (on their own thread), and get an [`Appending`] back, a future (or
//! a blocking [`Appending::wait`]) that resolves once the line was handed
//! to the kernel. Whoever leads the queue takes every line queued at that
//! moment, gives each its seq, `ts` and `prev`, and writes them with one
//! `write(2)` (group commit); each caller still gets its own seq, or its
//! own error. The lead is a caller's when nobody holds it: awaited, its
//! [`Appending`] commits what is queued on that thread (first yielding
//! once when lines arrive densely, see [`DENSE`], so that the tasks ready on
//! its thread queue theirs too), with no
//! thread to wake and none to wake it (a leader blocks only in a `write(2)`
//! to the page cache; fsync is never on its path). Lines queued meanwhile
//! ride on its next batch; after [`LEAD_ROUNDS`] batches it hands the lead
//! to the writer thread, so that no caller writes for others without end;
//! an [`Appending`] dropped before it led hands its line over the same way. A
//! thread fsyncs at most every [`SYNC_INTERVAL`] while there are unsynced
//! writes, less often when many files are ([`SYNC_PER_FILE`]): one thread
//! for every ledger of the process ([`SYNCER`]), so a gateway's hundred
//! sandboxes cost one thread and about 200 fsyncs a second, not a hundred
//! threads each fsyncing on its own clock. An append marks its file
//! dirty and wakes that thread only when it sleeps with nothing to do,
//! never cutting its pause short; a ledger closed syncs itself one last time.
//!
//! Seals and file checks take the same write-side lock directly (they are
//! rare and need the head they sign), so a seal signs the line right before
//! it. The writer also keeps what readers ask for without reading the file:
//! the head, per-kind counters since the newest session line, and a sparse
//! seq → byte offset index (every [`INDEX_EVERY`] lines).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::entry::{Entry, LEDGER_VERSION};
use crate::hash::line_hash;
use crate::redact;
use crate::seal::{PublicKeys, Sealer};

use super::encode;
use super::read::{scan, MAX_LINE, PROBLEM_CAP};
use super::tail;
use super::{
    aside_path, file_identity, meta_identity, now_rfc3339, save_torn, sync_parent, Committed,
    LedgerError, OpenReport, SealInfo,
};

/// Batches a caller commits for others before the writer thread takes over.
const LEAD_ROUNDS: usize = 2;

/// Lines queued closer together than this make a leader yield once before
/// it commits, so that the lines its thread is about to queue share the
/// write. Further apart (a proxy answering one request at a time), the yield
/// would gather nothing and cost a scheduler round trip: it commits at once.
const DENSE: Duration = Duration::from_micros(10);

/// How long the sync thread waits between two rounds of fsyncs while
/// writes continue, at least.
const SYNC_INTERVAL: Duration = Duration::from_millis(50);

/// The pause after a round grows by this per file it fsynced, so that the
/// process makes at most about 200 fsyncs a second however many ledgers it
/// writes. A gateway whose hundred sandboxes all write made 2,000 (every
/// ledger every 50 ms), each its own block writes for a page or two, and
/// its sync thread took a fifth of the gateway's CPU (serve's: 2%); with
/// the budget a ledger is fsynced every 0.5 s then, with ten times the
/// lines per write. Lines are in the page cache before their requests are
/// answered either way: only a kernel crash or power loss can lose the
/// ones not yet synced.
const SYNC_PER_FILE: Duration = Duration::from_millis(5);

/// The longest pause between two rounds (beyond 200 busy ledgers the
/// budget gives way to this bound on what a kernel crash can lose).
const SYNC_PAUSE_MAX: Duration = Duration::from_secs(1);

/// Lines a slow live reader may fall behind before it is told it lagged
/// (it then re-reads the file from its last seq, so nothing is lost).
const SUBSCRIBER_BUFFER: usize = 4096;

/// One entry of the seq → offset index per this many lines.
pub const INDEX_EVERY: u64 = 1024;

/// Lines after the last seal that make a seal due at once, whatever the
/// seal timer's interval: a crash then leaves at most this many lines (or
/// one interval's worth) unsealed, even under load.
pub const SEAL_EVERY_LINES: u64 = 1000;

/// Write-side state, behind the write lock.
struct Writer {
    file: File,
    next_seq: u64,
    head_hash: String,
    /// Length of the file up to the last complete line we know of.
    good_len: u64,
    /// The newest seal line written by this writer.
    last_seal: Option<SealInfo>,
    /// Lines written since the last seal (or the open).
    unsealed: u64,
    /// A failed append may have left bytes past `good_len` that could not
    /// be truncated yet; the next append truncates first.
    needs_truncate: bool,
    /// Device and inode of the file this writer appends to, to notice the
    /// path being pointed at another file.
    identity: Option<(u64, u64)>,
    /// What the writer found done to its file behind its back (sticky).
    tampered: Option<String>,
    /// `(seq, offset)` of every [`INDEX_EVERY`]th line, ascending (from
    /// the open's scan, or only this writer's lines after `history`).
    index: Vec<(u64, u64)>,
    /// Last seq and length of a history the open did not read
    /// ([`Ledger::open_sealed_by`]): its lines are found by seq on demand.
    history: Option<(u64, u64)>,
    /// Lines per kind since (and with) the newest session line.
    counters: BTreeMap<&'static str, u64>,
    /// The batch being written, kept to reuse its allocation.
    buf: Vec<u8>,
    /// A caller leading the queue swaps these with the queue's (so both
    /// keep their allocations).
    spare: (Vec<u8>, Vec<Job>),
    #[cfg(test)]
    fail_next_write: bool,
}

/// Lines waiting for the writer thread: each entry already redacted and
/// encoded by [`Queue::push_redacted`], on the caller's thread, so the
/// writer only frames, hashes and writes them (and nothing the caller
/// allocated is freed on the writer thread).
#[derive(Default)]
struct Queue {
    /// The entries' parts of their lines (`"kind":…,<fields>`), one after
    /// another; `jobs` says where each ends.
    fields: Vec<u8>,
    jobs: Vec<Job>,
    /// A caller or the writer thread takes batches from the queue and
    /// commits them: lines queued meanwhile are left for it.
    leading: bool,
    /// A caller gave the lead to the writer thread.
    handoff: bool,
    /// When the last line was queued: a leader yields to gather others
    /// only when lines arrive closer together than [`DENSE`].
    last_push: Option<Instant>,
    shutdown: bool,
    /// Tests hold the writer thread back to queue a known batch.
    #[cfg(test)]
    paused: bool,
}

/// A line waiting for its seq, `ts` and `prev`.
struct Job {
    /// Where its entry's encoded part ends in the batch's `fields`.
    end: usize,
    kind: &'static str,
    ack: Arc<AckSlot>,
}

/// Why an entry was not queued.
enum Refused {
    Stopped,
    Encode(serde_json::Error),
}

impl Queue {
    /// Redacts the entry and queues its encoded part, with its answer: the
    /// only way a line from traffic enters the queue, so none is written
    /// unredacted. `Some` when nobody leads the queue, so the caller is to:
    /// whether lines arrive densely (it then yields once before leading).
    fn push_redacted(
        queue: &Mutex<Queue>,
        entry: Entry,
        ack: &Arc<AckSlot>,
    ) -> Result<Option<bool>, Refused> {
        let entry = redact::entry(entry);
        let kind = entry.kind();
        // Encoded under the lock, straight into the batch: a few hundred
        // nanoseconds, against a lock the writer takes once per batch.
        let mut q = lock(queue);
        if q.shutdown {
            return Err(Refused::Stopped);
        }
        let start = q.fields.len();
        if let Err(e) = encode::fields(&mut q.fields, &entry) {
            q.fields.truncate(start);
            return Err(Refused::Encode(e));
        }
        let end = q.fields.len();
        q.jobs.push(Job {
            end,
            kind,
            ack: Arc::clone(ack),
        });
        let now = Instant::now();
        let dense = q
            .last_push
            .is_some_and(|last| now.saturating_duration_since(last) < DENSE);
        q.last_push = Some(now);
        Ok((!q.leading).then_some(dense))
    }
}

/// The one sync thread of the process and the files waiting for it.
struct Syncer {
    queue: Mutex<SyncQueue>,
    /// Wakes the thread when it waits for a dirty file.
    dirty: Condvar,
}

struct SyncQueue {
    /// Files written since their last fsync, each once.
    files: Vec<Arc<SyncTarget>>,
    /// The thread waits for a dirty file (only then is it woken).
    idle: bool,
    running: bool,
}

static SYNCER: Syncer = Syncer {
    queue: Mutex::new(SyncQueue {
        files: Vec::new(),
        idle: false,
        running: false,
    }),
    dirty: Condvar::new(),
};

impl Syncer {
    /// Starts the thread unless it runs: the first ledger opened does.
    fn start(&'static self) -> std::io::Result<()> {
        let mut q = lock(&self.queue);
        if !q.running {
            std::thread::Builder::new()
                .name("veris-ledger-sync".into())
                .spawn(move || {
                    background_priority();
                    self.run()
                })?;
            q.running = true;
        }
        Ok(())
    }

    /// Queues a file for the next round; wakes the thread only if it
    /// sleeps idle.
    fn mark(&self, target: &Arc<SyncTarget>) {
        if target.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut q = lock(&self.queue);
        q.files.push(Arc::clone(target));
        // Once: until it runs again, it has been told.
        if std::mem::take(&mut q.idle) {
            self.dirty.notify_one();
        }
    }

    /// Fsyncs every file written since the last round, then pauses
    /// [`SYNC_PER_FILE`] per file synced (from [`SYNC_INTERVAL`] to
    /// [`SYNC_PAUSE_MAX`]), so that the writes meanwhile share the next round.
    fn run(&self) {
        loop {
            let files = {
                let mut q = lock(&self.queue);
                while q.files.is_empty() {
                    q.idle = true;
                    q = self.dirty.wait(q).unwrap_or_else(|e| e.into_inner());
                }
                q.idle = false;
                std::mem::take(&mut q.files)
            };
            let pause = round_pause(files.len());
            for target in files {
                // Cleared first: a write during this fsync queues it again.
                target.queued.store(false, Ordering::Release);
                if let Err(e) = target.sync() {
                    tracing::error!(ledger = %target.path.display(), error = %e, "ledger fsync failed");
                    // Try again on the next round rather than forget the writes.
                    self.mark(&target);
                }
            }
            std::thread::sleep(pause);
        }
    }
}

/// Gives the calling thread the lowest priority (nice 19). The sync thread
/// wakes several times per fsync (each block write it waits for), hundreds
/// of times a second in a gateway; at the workers' priority each wakeup
/// preempted a worker in the middle of a request (the gateway's workers
/// were switched out twice as often as serve's). At nice 19 the scheduler
/// lets it wait for a free moment; it needs little CPU, and its rounds are
/// paced by its own pause, not by how fast it is scheduled. A failure (a
/// sandbox forbidding it) only leaves the thread as it was.
fn background_priority() {
    let me = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(me), 19) {
        tracing::debug!(error = %e, "the ledger sync thread keeps its priority");
    }
}

/// The sync thread's pause after a round that fsynced `files` files.
fn round_pause(files: usize) -> Duration {
    let n = u32::try_from(files).unwrap_or(u32::MAX);
    SYNC_PER_FILE
        .saturating_mul(n)
        .clamp(SYNC_INTERVAL, SYNC_PAUSE_MAX)
}

/// A ledger's handle for fsync, its own (so fsync never holds the write
/// lock); `None` once the ledger is closed, so the sync thread never keeps
/// a closed ledger's file (and its lock) open.
struct SyncTarget {
    file: Mutex<Option<File>>,
    path: PathBuf,
    /// Waiting in [`SYNCER`]'s queue.
    queued: AtomicBool,
}

impl SyncTarget {
    fn sync(&self) -> Result<(), LedgerError> {
        match &*lock(&self.file) {
            Some(file) => file.sync_data().map_err(|source| LedgerError::Sync {
                path: self.path.clone(),
                source,
            }),
            None => Ok(()),
        }
    }

    /// The final fsync, then the handle is closed.
    fn close(&self) {
        let mut file = lock(&self.file);
        if let Some(f) = file.take() {
            if let Err(e) = f.sync_data() {
                tracing::error!(ledger = %self.path.display(), error = %e, "ledger fsync failed");
            }
        }
    }
}

struct Shared {
    writer: Mutex<Writer>,
    queue: Mutex<Queue>,
    work: Condvar,
    sync: Arc<SyncTarget>,
    /// A second handle to the same file, to read it without the write lock.
    read_file: File,
    path: PathBuf,
    /// Every committed line, for live readers (admin `/events`); made by
    /// the first [`Ledger::subscribe`]: its buffer is `SUBSCRIBER_BUFFER`
    /// slots allocated at once (about 200 KB), which a gateway's idle
    /// sandboxes would each hold for nothing.
    committed: std::sync::OnceLock<tokio::sync::broadcast::Sender<Committed>>,
    /// Notified when [`SEAL_EVERY_LINES`] lines wait for a seal.
    seal_due: tokio::sync::Notify,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a lock cannot leave the state worse than a
    // failed append, which the next append repairs.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn writer(&self) -> MutexGuard<'_, Writer> {
        lock(&self.writer)
    }

    fn sync_now(&self) -> Result<(), LedgerError> {
        self.sync.sync()
    }

    /// Takes the lead of the queue when nobody holds it and lines wait.
    fn take_lead(&self) -> bool {
        let mut q = lock(&self.queue);
        if q.leading || q.held() || q.jobs.is_empty() {
            return false;
        }
        q.leading = true;
        true
    }

    /// Commits what is queued, on this thread, until the queue is empty or
    /// [`LEAD_ROUNDS`] batches were written; then gives the lead back, or to
    /// the writer thread when lines are still waiting.
    fn lead(&self) {
        for _ in 0..LEAD_ROUNDS {
            let mut w = self.writer();
            let (mut fields, mut jobs) = std::mem::take(&mut w.spare);
            {
                let mut q = lock(&self.queue);
                if q.jobs.is_empty() || q.held() {
                    q.leading = false;
                    w.spare = (fields, jobs);
                    return;
                }
                std::mem::swap(&mut fields, &mut q.fields);
                std::mem::swap(&mut jobs, &mut q.jobs);
            }
            w.commit(self, &fields, &mut jobs);
            fields.clear();
            w.spare = (fields, jobs);
        }
        let mut q = lock(&self.queue);
        if q.jobs.is_empty() || q.held() {
            q.leading = false;
            return;
        }
        q.handoff = true;
        drop(q);
        self.work.notify_one();
    }

    /// Marks the file dirty for the sync thread.
    fn mark_dirty(&self) {
        SYNCER.mark(&self.sync);
    }
}

/// The answer to one queued append.
#[derive(Default)]
struct AckSlot {
    state: Mutex<AckState>,
    done: Condvar,
}

#[derive(Default)]
struct AckState {
    result: Option<Result<u64, LedgerError>>,
    waker: Option<Waker>,
    /// A thread blocks in [`Appending::wait`]: only then is `done`
    /// notified (a notify is a futex syscall even with no waiter).
    blocked: bool,
}

impl AckSlot {
    fn result_pending(&self) -> bool {
        lock(&self.state).result.is_none()
    }

    fn complete(&self, result: Result<u64, LedgerError>) {
        let (waker, blocked) = {
            let mut st = lock(&self.state);
            st.result = Some(result);
            (st.waker.take(), st.blocked)
        };
        if blocked {
            self.done.notify_all();
        }
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// A queued append: resolves to the line's seq once its bytes were handed
/// to the kernel, or to the error that kept them out of the file (nothing
/// of the line is left in it then). Dropping it does not cancel the append.
#[must_use = "the line is written either way; await or wait for it to know it was"]
pub struct Appending {
    ack: Arc<AckSlot>,
    /// The queue its line joined while nobody led it: this append leads it
    /// (or hands it to the writer thread if dropped first).
    lead: Option<Arc<Shared>>,
    /// Yielded once already, or not to yield: the next poll leads.
    yielded: bool,
}

impl Appending {
    /// An answer already known.
    fn done(ack: Arc<AckSlot>) -> Appending {
        Appending {
            ack,
            lead: None,
            yielded: false,
        }
    }

    /// Leads the queue its line joined, if nobody leads it by now.
    fn lead_now(&mut self) {
        if let Some(shared) = self.lead.take() {
            if shared.take_lead() {
                shared.lead();
            }
        }
    }

    /// Blocks the calling thread until the line is written. For threads
    /// that are not async workers.
    pub fn wait(mut self) -> Result<u64, LedgerError> {
        self.lead_now();
        let mut st = lock(&self.ack.state);
        loop {
            if let Some(r) = st.result.take() {
                return r;
            }
            st.blocked = true;
            st = self.ack.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for Appending {
    fn drop(&mut self) {
        // Never led: the writer thread takes its line (a drop does not wait
        // for a write).
        if let Some(shared) = self.lead.take() {
            if shared.take_lead() {
                lock(&shared.queue).handoff = true;
                shared.work.notify_one();
            }
        }
    }
}

impl Future for Appending {
    type Output = Result<u64, LedgerError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.lead.is_some() && this.ack.result_pending() {
            if !this.yielded {
                // Lines arrive densely: let the tasks ready on this thread
                // queue theirs first, to share this batch's write (a yield
                // costs a scheduler round trip, often a worker woken).
                this.yielded = true;
                let _ = std::pin::pin!(tokio::task::yield_now()).poll(cx);
                return Poll::Pending;
            }
            this.lead_now();
        }
        let mut st = lock(&this.ack.state);
        if let Some(r) = st.result.take() {
            return Poll::Ready(r);
        }
        match &st.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => st.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl std::fmt::Debug for Appending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Appending").finish_non_exhaustive()
    }
}

/// The append-only writer. `Send + Sync`; appends are serialized by its
/// writer thread.
pub struct Ledger {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("path", &self.shared.path)
            .finish_non_exhaustive()
    }
}

/// The `request` lines of a ledger file moved aside, for the session line
/// that names it (a crash must stay visible where people read: DESIGN
/// §7a.18). A byte search, not a parse: the writer spells `"kind":"request"`
/// this one way, and inside a JSON string a quote is always escaped. `None`
/// when the file cannot be read.
pub(super) fn count_requests(path: &Path) -> Option<u64> {
    use std::io::Read;
    const NEEDLE: &[u8] = br#""kind":"request""#;
    let finder = memchr::memmem::Finder::new(NEEDLE);
    let mut file = File::open(path).ok()?;
    let mut buf = vec![0u8; 1 << 20];
    // Bytes carried over from the previous block, so a needle cut by the
    // block boundary is still found once.
    let mut keep = 0;
    let mut n = 0u64;
    loop {
        let got = match file.read(&mut buf[keep..]) {
            Ok(0) => return Some(n),
            Ok(got) => got,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        };
        let end = keep + got;
        n += finder.find_iter(&buf[..end]).count() as u64;
        keep = (NEEDLE.len() - 1).min(end);
        buf.copy_within(end - keep..end, 0);
    }
}

/// What the open found beyond [`OpenReport`]: why the keys asked about
/// cannot vouch for the file (tail mode), and its head.
struct Found {
    why: Option<String>,
    head: (u64, String),
}

impl Ledger {
    /// Opens or creates the ledger (mode 0644), finds the head (last seq and
    /// line hash), moves a torn last line aside into `<path>.torn-<seq>`
    /// (kept, never deleted) and reports it, starts its writer thread
    /// and the process's sync thread if none runs. The file is read once, a line at a time, for its problems,
    /// counters and index.
    pub fn open(path: &Path) -> Result<(Ledger, OpenReport), LedgerError> {
        Ledger::open_checking(path, None).map(|(l, r, _)| (l, r))
    }

    /// With `own`, reads only the file's end and says why `own` cannot
    /// vouch for it ([`tail::check`]); else reads all of it.
    fn open_checking(
        path: &Path,
        own: Option<&PublicKeys>,
    ) -> Result<(Ledger, OpenReport, Found), LedgerError> {
        let open_err = |source| LedgerError::Open {
            path: path.to_path_buf(),
            source,
        };
        let read_err = |source| LedgerError::Read {
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
        let mut index = Vec::new();
        let mut counters = BTreeMap::new();
        let mut history = None;
        let (read, why) = match own {
            // The whole file, a line at a time: index, counters, problems.
            None => {
                let read = scan(&file, PROBLEM_CAP, |line, _, offset| {
                    if line.seq % INDEX_EVERY == 1
                        && index.last().is_none_or(|(s, _)| *s < line.seq)
                    {
                        index.push((line.seq, offset));
                    }
                    count(&mut counters, line.entry.kind());
                })
                .map_err(read_err)?;
                (read, None)
            }
            // Its end only: the history stays unread (see `tail`).
            Some(keys) => {
                let t = tail::check(&file, keys).map_err(read_err)?;
                let (last_seq, head_hash) = t
                    .last
                    .clone()
                    .unwrap_or((0, crate::entry::GENESIS_PREV.to_string()));
                if last_seq > 0 {
                    history = Some((last_seq, t.good_len));
                }
                let read = super::LedgerRead {
                    head: (last_seq, head_hash),
                    good_len: t.good_len,
                    // In a file the writer wrote, line numbers are seqs.
                    torn_tail: (t.torn > 0).then_some(crate::entry::TornTail {
                        line: last_seq as usize + 1,
                        bytes: t.torn,
                    }),
                    ..super::LedgerRead::default()
                };
                (read, t.why)
            }
        };
        let next_seq = read.head.0.saturating_add(1);
        let mut torn_saved_to = None;
        if read.torn_tail.is_some() {
            file.seek(SeekFrom::Start(read.good_len))
                .map_err(read_err)?;
            let saved = save_torn(path, next_seq, &mut file)?;
            file.set_len(read.good_len).map_err(open_err)?;
            file.sync_all().map_err(open_err)?;
            tracing::warn!(
                ledger = %path.display(),
                saved = %saved.display(),
                "ledger had a torn last line; moved it aside"
            );
            torn_saved_to = Some(saved);
        }
        if let Some(p) = read.first_problem() {
            tracing::warn!(ledger = %path.display(), problem = %p, problems = read.problem_count, "existing ledger does not verify");
        }
        SYNCER.start().map_err(open_err)?;
        let sync = Arc::new(SyncTarget {
            file: Mutex::new(Some(file.try_clone().map_err(open_err)?)),
            path: path.to_path_buf(),
            queued: AtomicBool::new(false),
        });
        let read_file = file.try_clone().map_err(open_err)?;
        let identity = file_identity(&file);
        let shared = Arc::new(Shared {
            writer: Mutex::new(Writer {
                file,
                next_seq,
                head_hash: read.head.1.clone(),
                good_len: read.good_len,
                last_seal: None,
                unsealed: 0,
                needs_truncate: false,
                identity,
                tampered: None,
                index,
                history,
                counters,
                buf: Vec::new(),
                spare: (Vec::new(), Vec::new()),
                #[cfg(test)]
                fail_next_write: false,
            }),
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
            sync,
            read_file,
            path: path.to_path_buf(),
            committed: std::sync::OnceLock::new(),
            seal_due: tokio::sync::Notify::new(),
        });
        let mut ledger = Ledger {
            shared: Arc::clone(&shared),
            writer: None,
        };
        let bg = Arc::clone(&shared);
        ledger.writer = Some(
            std::thread::Builder::new()
                .name("veris-ledger-write".into())
                .spawn(move || write_loop(&bg))
                .map_err(open_err)?,
        );
        let found = Found {
            why,
            head: read.head.clone(),
        };
        let report = OpenReport {
            next_seq,
            torn_tail: read.torn_tail,
            torn_saved_to,
            problems: read.problems,
            moved_aside: None,
        };
        Ok((ledger, report, found))
    }

    /// Opens the ledger like [`Ledger::open`], but continues an existing file
    /// only when this proxy can vouch for it: its last line is a seal by
    /// `own` over the line right before it, which vouches (through the hash
    /// chain) for every line up to it. Anything else (an unsealed tail, no
    /// seals, another key, a seal that does not sign the line before it) is
    /// moved aside to `<path>.moved-<n>` (kept, readable) and a new chain
    /// starts; the report names the moved file and its head, for the session
    /// line (DESIGN §7a.4). A proxy never seals over a tail it did not write.
    ///
    /// Only the end of the file is read, so a start costs the same for any
    /// history (the report has no `problems`; the counters start with the
    /// session line the proxy writes next). An edit to the history before
    /// that seal is not looked for here: every reader streams the whole
    /// file and fails on any break of the chain or a seal, whatever its
    /// window, so such an edit can never read as verified.
    pub fn open_sealed_by(
        path: &Path,
        own: &PublicKeys,
    ) -> Result<(Ledger, OpenReport), LedgerError> {
        let (ledger, report, found) = Ledger::open_checking(path, Some(own))?;
        let Some(why) = found.why else {
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
            requests: count_requests(&to),
            file: to.display().to_string(),
            head_seq: found.head.0,
            head_hash: found.head.1,
            why,
        }));
        Ok((ledger, fresh))
    }

    /// Redacts the entry (on the caller's thread) and queues it for the
    /// writer thread, which assigns `seq`, `ts` and `prev` and writes it.
    /// The returned [`Appending`] resolves once the kernel has the line. On
    /// failure nothing of the line is left in the file and the error is
    /// returned; the next append retries normally.
    pub fn append_queued(&self, entry: Entry) -> Appending {
        let ack = Arc::new(AckSlot::default());
        let (lead, dense) = match Queue::push_redacted(&self.shared.queue, entry, &ack) {
            Ok(Some(dense)) => (Some(Arc::clone(&self.shared)), dense),
            Ok(None) => (None, false),
            Err(Refused::Stopped) => {
                ack.complete(Err(
                    self.write_error(std::io::Error::other("the ledger writer has stopped"))
                ));
                (None, false)
            }
            Err(Refused::Encode(e)) => {
                ack.complete(Err(LedgerError::Encode(e)));
                (None, false)
            }
        };
        Appending {
            ack,
            lead,
            // Only a dense stream has lines worth waiting for.
            yielded: !dense,
        }
    }

    /// [`Ledger::append_queued`], waiting on this thread for the line to be
    /// written. Returns its seq.
    pub fn append(&self, entry: Entry) -> Result<u64, LedgerError> {
        self.append_queued(entry).wait()
    }

    fn write_error(&self, source: std::io::Error) -> LedgerError {
        LedgerError::Write {
            path: self.shared.path.clone(),
            source,
        }
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
        let signature = sealer.sign(sealed_seq, &head, reason);
        let entry = Entry::Seal {
            sealed_seq,
            signature: signature.clone(),
            key_id: sealer.key_id().to_string(),
            reason: reason.to_string(),
        };
        let seq = w.append_now(&self.shared, entry)?;
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
        w.unsealed = 0;
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

    /// Resolves once [`SEAL_EVERY_LINES`] lines wait for a seal (the seal
    /// timer's second wake-up, beside its interval).
    pub async fn seal_due(&self) {
        self.shared.seal_due.notified().await
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
        w.append_now(&self.shared, entry).map(|_| ())
    }

    /// Every line committed from now on, in seq order. A receiver that falls
    /// more than a few thousand lines behind gets `Lagged` and should re-read
    /// the file from the last seq it saw.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Committed> {
        self.shared
            .committed
            .get_or_init(|| tokio::sync::broadcast::channel(SUBSCRIBER_BUFFER).0)
            .subscribe()
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

    /// Lines per kind since (and with) the newest session line in the file.
    pub fn counters(&self) -> BTreeMap<String, u64> {
        let w = self.shared.writer();
        w.counters
            .iter()
            .map(|(k, n)| (k.to_string(), *n))
            .collect()
    }

    /// Where to start reading for the lines after `since`: a byte offset at
    /// or before the first line with a greater seq (from the sparse index;
    /// the reader checks the seq of what it finds there), and the length of
    /// the file up to the writer's last complete line.
    ///
    /// Lines of a history the open did not read are found by a binary
    /// search of the file (a few block reads, no lock held).
    pub fn position_after(&self, since: u64) -> (u64, u64) {
        let target = since.saturating_add(1);
        let (indexed, history, len) = {
            let w = self.shared.writer();
            let i = w.index.partition_point(|(s, _)| *s <= target);
            (
                i.checked_sub(1).map(|i| w.index[i].1),
                w.history,
                w.good_len,
            )
        };
        let offset = match (indexed, history) {
            (Some(offset), _) => offset,
            // Between the history's end and this writer's first index entry.
            (None, Some((last, history_len))) if target > last => history_len,
            (None, Some((_, history_len))) => {
                tail::offset_of_seq(&self.shared.read_file, history_len, target).unwrap_or(0)
            }
            (None, None) => 0,
        };
        (offset, len)
    }

    /// The hash of line `seq` as read back from the file.
    #[cfg(test)]
    pub(super) fn read_head_hash_of(&self, seq: u64) -> String {
        let bytes = std::fs::read(&self.shared.path).unwrap_or_default();
        let line = bytes
            .split(|&b| b == b'\n')
            .nth(seq as usize - 1)
            .unwrap_or(&[]);
        line_hash(line)
    }

    /// Makes the next write fail after writing half its bytes.
    #[cfg(test)]
    pub(super) fn fail_next_write(&self) {
        self.shared.writer().fail_next_write = true;
    }

    /// Holds queued lines back from the writer thread (`true`), or lets
    /// them go as one batch (`false`).
    #[cfg(test)]
    pub(super) fn pause_writes(&self, paused: bool) {
        lock(&self.shared.queue).paused = paused;
        self.shared.work.notify_all();
    }

    /// Lines queued and not yet taken by the writer thread.
    #[cfg(test)]
    pub(super) fn queued(&self) -> usize {
        lock(&self.shared.queue).jobs.len()
    }
}

impl Queue {
    #[cfg(test)]
    fn held(&self) -> bool {
        self.paused
    }

    #[cfg(not(test))]
    fn held(&self) -> bool {
        false
    }
}

fn count(counters: &mut BTreeMap<&'static str, u64>, kind: &'static str) {
    if kind == "session" {
        counters.clear();
    }
    *counters.entry(kind).or_default() += 1;
}

impl Writer {
    /// Writes one line now, on this thread (seals and tamper lines: the
    /// writer's own words, not traffic, so not redacted).
    fn append_now(&mut self, shared: &Shared, entry: Entry) -> Result<u64, LedgerError> {
        let mut fields = Vec::new();
        encode::fields(&mut fields, &entry).map_err(LedgerError::Encode)?;
        let slot = Arc::new(AckSlot::default());
        let mut jobs = vec![Job {
            end: fields.len(),
            kind: entry.kind(),
            ack: Arc::clone(&slot),
        }];
        self.commit(shared, &fields, &mut jobs);
        Appending::done(slot).wait()
    }

    /// Gives each job its seq, `ts` and `prev`, writes them all with one
    /// `write_all`, and answers each job. A failed write truncates the file
    /// back to the last good length: none of the batch is in the file, and
    /// every job of it gets the error.
    fn commit(&mut self, shared: &Shared, fields: &[u8], jobs: &mut Vec<Job>) {
        let path = &shared.path;
        let write_err = |source: &std::io::Error| LedgerError::Write {
            path: path.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        };
        if self.needs_truncate {
            if let Err(e) = self.file.set_len(self.good_len) {
                for job in jobs.drain(..) {
                    job.ack.complete(Err(write_err(&e)));
                }
                return;
            }
            self.needs_truncate = false;
            tracing::info!(ledger = %path.display(), "ledger writable again");
        }
        let ts = now_rfc3339();
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        let (mut seq, mut head) = (self.next_seq, self.head_hash.clone());
        // (ack, seq, start in buf, end in buf, kind)
        let mut written = Vec::with_capacity(jobs.len());
        let mut from = 0;
        for job in jobs.drain(..) {
            let entry_part = &fields[from..job.end];
            from = job.end;
            // Framed straight into the batch; taken back out on a refusal.
            let start = buf.len();
            encode::line(&mut buf, LEDGER_VERSION, seq, &ts, entry_part, &head);
            let end = buf.len();
            if end - start > MAX_LINE {
                buf.truncate(start);
                job.ack
                    .complete(Err(write_err(&std::io::Error::other(format!(
                        "a line of {} bytes is longer than the {MAX_LINE}-byte limit",
                        end - start
                    )))));
                continue;
            }
            head = line_hash(&buf[start..end]);
            buf.push(b'\n');
            written.push((job.ack, seq, start, end, job.kind));
            seq = seq.saturating_add(1);
        }
        if written.is_empty() {
            self.buf = buf;
            return;
        }
        if let Err(source) = self.write_batch(&buf) {
            if let Err(e) = self.file.set_len(self.good_len) {
                self.needs_truncate = true;
                tracing::error!(ledger = %path.display(), error = %e, "could not truncate ledger after a failed write; will retry");
            }
            tracing::error!(ledger = %path.display(), error = %source, lines = written.len(), first_seq = self.next_seq, "ledger write failed");
            for (ack, ..) in written {
                ack.complete(Err(write_err(&source)));
            }
            self.buf = buf;
            return;
        }
        self.good_len += buf.len() as u64;
        self.head_hash = head;
        self.next_seq = seq;
        // A seal line is not a line waiting for one.
        let added = written.iter().filter(|w| w.4 != "seal").count() as u64;
        self.unsealed += added;
        if added > 0 && self.unsealed >= SEAL_EVERY_LINES {
            shared.seal_due.notify_one();
        }
        // Only live readers need the text of each line.
        let announce = shared.committed.get().filter(|c| c.receiver_count() > 0);
        let base = self.good_len - buf.len() as u64;
        for (ack, seq, start, end, kind) in written {
            if seq % INDEX_EVERY == 1 {
                self.index.push((seq, base + start as u64));
            }
            count(&mut self.counters, kind);
            if let Some(committed) = announce {
                // Sent under the lock so live readers see lines in seq
                // order; a receiver gone meanwhile is not an error.
                let text = String::from_utf8_lossy(&buf[start..end]);
                let _ = committed.send(Committed {
                    seq,
                    text: Arc::from(text),
                });
            }
            ack.complete(Ok(seq));
        }
        self.buf = buf;
        shared.mark_dirty();
    }

    fn write_batch(&mut self, buf: &[u8]) -> std::io::Result<()> {
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
        lock(&self.shared.queue).shutdown = true;
        self.shared.work.notify_all();
        if let Some(handle) = self.writer.take() {
            let _ = handle.join();
        }
        self.shared.sync.close();
    }
}

/// Takes every queued line and commits them as one batch, until shutdown
/// (after writing what was queued before it).
fn write_loop(shared: &Shared) {
    // Swapped with the queue's: both keep their allocations.
    let (mut fields, mut jobs) = (Vec::new(), Vec::new());
    loop {
        {
            let mut q = lock(&shared.queue);
            // Lines it was handed, or lines nobody leads (queued while the
            // tests held the writes back).
            while !q.shutdown && (q.jobs.is_empty() || q.held() || (q.leading && !q.handoff)) {
                q = shared.work.wait(q).unwrap_or_else(|e| e.into_inner());
            }
            if q.jobs.is_empty() {
                return;
            }
            q.leading = true;
            q.handoff = false;
            std::mem::swap(&mut fields, &mut q.fields);
            std::mem::swap(&mut jobs, &mut q.jobs);
        }
        shared.writer().commit(shared, &fields, &mut jobs);
        fields.clear();
        jobs.clear();
        let mut q = lock(&shared.queue);
        if q.jobs.is_empty() || q.held() {
            q.leading = false;
        } else {
            q.handoff = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One busy ledger is fsynced every 50 ms; a hundred share a budget of
    /// about 200 fsyncs a second; no file waits more than a second.
    #[test]
    fn the_sync_pause_grows_with_the_files_synced_within_bounds() {
        assert_eq!(round_pause(0), SYNC_INTERVAL);
        assert_eq!(round_pause(1), Duration::from_millis(50));
        assert_eq!(round_pause(100), Duration::from_millis(500));
        assert_eq!(round_pause(100_000), SYNC_PAUSE_MAX);
        assert_eq!(round_pause(usize::MAX), SYNC_PAUSE_MAX);
    }
}
