//! One ledger's publisher: a task that follows the ledger file by seq and
//! publishes its committed lines, in order, to the ledger subject, and its
//! newest seal line to the checkpoint subject.
//!
//! Why from the file: the file is the source of truth and the spool. The
//! writer's broadcast only wakes the task (and tells it of new seals); the
//! lines themselves are read back from the file up to the writer's own
//! committed length, so an outage of any length, or a crash, leaves nothing
//! to hold in memory: the backlog is read again, in order, when the server
//! is back. Where publishing stands is never kept in a local file the
//! workload could edit: it is the last message on the subject, asked of the
//! stream at start and after every failure.
//!
//! One publish per subject is in flight at a time, each carrying
//! `Nats-Expected-Last-Subject-Sequence`: a second writer on the subject (a
//! cloned state dir, two gateways with one name) fails that check (error
//! 10071), and the stream's last message then shows whose it is. Ours (a
//! publish whose answer was lost) and the publisher goes on; anyone
//! else's, or a line of this chain that differs from the file, is a fork:
//! recorded in [`State::refused`] and logged, and this ledger is not
//! published again by this process (never retried blindly). Lines are
//! batched into messages of up to [`BATCH_BYTES`] (what is waiting when the
//! previous publish was acknowledged), which keeps a ledger's rate well
//! above what one line per round trip would allow. A publish that caught up
//! (its message not full) is followed by [`LINGER`] before the next read, so
//! that a busy ledger sends a few messages a second rather than one per
//! round trip: a gateway's hundred busy sandboxes then cost the gateway
//! and the server a few hundred publishes a second, not thousands. The
//! writer's wakeups are drained before each read, so lines already read do
//! not wake the task again.
//!
//! A ledger moved aside when this chain started (a crash, an unverifiable
//! file; its session line names it) is finished first: its lines up to the
//! head the proxy saw are published on the same subject, then the new chain.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use bytes::Bytes;
use tokio::sync::{broadcast, watch};
use veris_receipt::ledger::{line_hash, Ledger, LineReader, RawLine};

use crate::{
    check_token, checkpoint_subject, ledger_subject, Fleet, FleetError, HEADER_FIRST, HEADER_LAST,
    HEADER_LEDGER,
};

/// Bytes of lines per message at most (a single longer line goes alone).
pub const BATCH_BYTES: usize = 256 * 1024;
/// The pause after a publish that was not full (see the module doc): what
/// the stream may trail a busy ledger by, on top of a round trip.
const LINGER: Duration = Duration::from_millis(200);
/// Hex digits of a ledger id.
const LEDGER_ID_LEN: usize = 16;
/// Wait after a failure that may pass (server down, timeout), doubling up
/// to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);
/// Wait after a refusal the server will repeat until someone changes
/// something (a full stream, a message over its size limit).
const REFUSED_RETRY: Duration = Duration::from_secs(30);

/// Where a ledger's publishing stands: what `/status` and the metrics show.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct State {
    pub subject: String,
    /// The chain being published (first 16 hex digits of its first line's
    /// hash); absent until the ledger has a line.
    pub ledger_id: Option<String>,
    /// Last seq of this chain the stream acknowledged.
    pub published_seq: u64,
    /// The writer's last seq when last looked at.
    pub head_seq: u64,
    /// Lines written but not yet in the stream.
    pub lag: u64,
    /// Messages and lines acknowledged since start (duplicates included).
    pub messages: u64,
    pub lines: u64,
    /// Seq of the newest seal line published on the checkpoint subject.
    pub checkpoint_seq: u64,
    /// The latest failure that may pass (cleared by the next success).
    pub last_error: Option<String>,
    /// A refusal that will not pass by retrying: a fork (another writer on
    /// the subject, or a line of this chain that differs from the file), a
    /// full stream, a line over the message size limit. Sticky for forks.
    pub refused: Option<String>,
    /// A fork was found: this ledger is no longer published.
    pub fork: bool,
    /// A ledger moved aside when this chain started, being published first.
    pub backlog_file: Option<String>,
}

/// A running publisher. Dropping it stops the task.
pub struct Publisher {
    watch: Watch,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads a publisher's [`State`].
#[derive(Clone)]
pub struct Watch {
    state: Arc<Mutex<State>>,
    ledger: Arc<Ledger>,
}

impl Watch {
    pub fn state(&self) -> State {
        let mut s = lock(&self.state).clone();
        s.head_seq = self.ledger.head().0;
        if s.ledger_id.is_some() {
            s.lag = s.head_seq.saturating_sub(s.published_seq);
        } else {
            s.lag = s.head_seq;
        }
        s
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl Publisher {
    /// Starts publishing `ledger` as sandbox `sandbox`'s.
    pub fn start(
        fleet: &Fleet,
        ledger: Arc<Ledger>,
        sandbox: &str,
    ) -> Result<Publisher, FleetError> {
        check_token("the sandbox id", sandbox)?;
        let gateway = &fleet.settings().gateway;
        let state = Arc::new(Mutex::new(State {
            subject: ledger_subject(sandbox, gateway),
            ..State::default()
        }));
        let (stop, stop_rx) = watch::channel(false);
        let task = Task {
            fleet: fleet.clone(),
            ledger: ledger.clone(),
            subject: ledger_subject(sandbox, gateway),
            checkpoint_subject: checkpoint_subject(sandbox, gateway),
            state: state.clone(),
            stop: stop_rx,
            sub: ledger.subscribe(),
            live_id: String::new(),
            newest_seal: None,
            batch_bytes: BATCH_BYTES,
            caught_up: false,
        };
        let task = tokio::spawn(task.run());
        Ok(Publisher {
            watch: Watch { state, ledger },
            stop,
            task,
        })
    }

    pub fn state(&self) -> State {
        self.watch.state()
    }

    /// A handle that reads the state (for `/status` and the metrics).
    pub fn watch(&self) -> Watch {
        self.watch.clone()
    }
}

impl Publisher {
    /// Waits up to `grace` for every line written so far to be in the
    /// stream, then stops. True when nothing was left behind (what was is
    /// in the file, and the next start publishes it).
    pub async fn finish(self, grace: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + grace;
        let done = loop {
            let s = self.state();
            if s.ledger_id.is_some() && s.lag == 0 {
                break true;
            }
            if s.fork || tokio::time::Instant::now() >= deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let _ = self.stop.send(true);
        done
    }
}

/// A file being published: the live ledger, or one moved aside before it.
struct Source {
    path: PathBuf,
    id: String,
    /// The last seq to publish: the moved-aside file's head as the proxy saw
    /// it; `None` for the live ledger (its writer's head, read each time).
    end: Option<u64>,
    /// Read position: the seq of the next line and its byte offset.
    cursor: (u64, u64),
}

/// Where the subject stands, as the stream said.
struct Position {
    /// Next seq of the source to publish.
    next: u64,
    /// Stream sequence of the subject's last message (0: none).
    subject_seq: u64,
}

/// Lines read for one message.
struct Batch {
    first: u64,
    last: u64,
    bytes: Vec<u8>,
}

enum Failure {
    /// May pass: wait and ask the stream where the subject stands.
    Transient(String),
    /// Will be refused again until someone changes something.
    Refused(String),
    /// Another writer, or a differing line: stop publishing this ledger.
    Fork(String),
}

struct Task {
    fleet: Fleet,
    ledger: Arc<Ledger>,
    subject: String,
    checkpoint_subject: String,
    state: Arc<Mutex<State>>,
    stop: watch::Receiver<bool>,
    sub: broadcast::Receiver<veris_receipt::ledger::Committed>,
    /// The live chain's id, once known.
    live_id: String,
    /// The newest seal line of the live chain seen (seq, text).
    newest_seal: Option<(u64, Arc<str>)>,
    batch_bytes: usize,
    /// The last message published carried fewer than half of
    /// `batch_bytes`: the publisher has caught up with the writer.
    caught_up: bool,
}

impl Task {
    async fn run(mut self) {
        let Some(live) = self.live_source().await else {
            return;
        };
        let mut sources = Vec::new();
        if let Some(moved) = moved_aside(&live.path) {
            sources.push(moved);
        }
        self.live_id = live.id.clone();
        sources.push(live);
        for mut source in sources {
            let live = source.end.is_none();
            {
                let mut s = lock(&self.state);
                s.ledger_id = live.then(|| source.id.clone());
                s.backlog_file = (!live).then(|| source.path.display().to_string());
            }
            if !self.publish_source(&mut source).await {
                return;
            }
        }
    }

    /// The live ledger, once it has a first line (its id); `None` when
    /// stopped first.
    async fn live_source(&mut self) -> Option<Source> {
        let path = self.ledger.path().to_path_buf();
        loop {
            if self.ledger.head().0 >= 1 {
                let first = tokio::task::spawn_blocking({
                    let path = path.clone();
                    move || first_line(&path)
                })
                .await
                .ok()
                .and_then(|r| r.ok())
                .flatten();
                if let Some(first) = first {
                    return Some(Source {
                        path,
                        id: ledger_id(&first),
                        end: None,
                        cursor: (1, 0),
                    });
                }
            }
            if !self.wait_for_lines(Duration::from_millis(500)).await {
                return None;
            }
        }
    }

    /// Publishes `source` to its end (a moved-aside file) or until stopped
    /// (the live ledger). `then_live`: a newer chain follows on the subject,
    /// so finding that chain's lines there means this one is done. False
    /// when stopped or after a fork.
    async fn publish_source(&mut self, source: &mut Source) -> bool {
        let then_live = source.end.is_some();
        let mut published_any = false;
        let mut pos: Option<Position> = None;
        let mut retry = RETRY_MIN;
        loop {
            if *self.stop.borrow() {
                return false;
            }
            let step = match pos.as_mut() {
                None => match self.resync(source, then_live, published_any).await {
                    Ok(Some(p)) => {
                        pos = Some(p);
                        continue;
                    }
                    // The next chain is already on the subject.
                    Ok(None) => return true,
                    Err(f) => Err(f),
                },
                Some(p) => self.step(source, p, &mut published_any).await,
            };
            match step {
                Ok(true) => {
                    retry = RETRY_MIN;
                    lock(&self.state).last_error = None;
                    if !then_live && self.caught_up && !self.pause(LINGER).await {
                        return false;
                    }
                }
                Ok(false) => {
                    // Nothing to publish now.
                    if then_live {
                        // The moved-aside file has no more lines.
                        return true;
                    }
                    self.publish_checkpoint().await;
                    if !self.wait_for_lines(Duration::from_secs(1)).await {
                        return false;
                    }
                }
                Err(Failure::Transient(e)) => {
                    tracing::debug!(subject = %self.subject, error = %e, "publishing the ledger: will retry");
                    lock(&self.state).last_error = Some(e);
                    pos = None;
                    if !self.pause(retry).await {
                        return false;
                    }
                    retry = (retry * 2).min(RETRY_MAX);
                }
                Err(Failure::Refused(e)) => {
                    tracing::error!(subject = %self.subject, error = %e, "the stream refused the ledger's lines; retrying in 30 s");
                    lock(&self.state).refused = Some(e);
                    pos = None;
                    if !self.pause(REFUSED_RETRY).await {
                        return false;
                    }
                }
                Err(Failure::Fork(e)) => {
                    tracing::error!(subject = %self.subject, error = %e, "fork on the ledger subject: no longer publishing this ledger");
                    let mut s = lock(&self.state);
                    s.refused = Some(format!("fork: {e}"));
                    s.fork = true;
                    return false;
                }
            }
        }
    }

    /// Publishes the next batch. `Ok(false)`: nothing waits.
    async fn step(
        &mut self,
        source: &mut Source,
        pos: &mut Position,
        published_any: &mut bool,
    ) -> Result<bool, Failure> {
        // Wakeups for lines about to be read: they need no wake later.
        self.drain_wakeups();
        let end = source.end.unwrap_or_else(|| self.ledger.head().0);
        if pos.next > end {
            return Ok(false);
        }
        let batch = self.read(source, pos.next, end).await?;
        let Some(batch) = batch else {
            return Ok(false);
        };
        let live = source.end.is_none();
        if live {
            self.note_seals(&batch);
            self.publish_checkpoint().await;
        }
        let lines = batch.last - batch.first + 1;
        self.caught_up = batch.bytes.len() < self.batch_bytes / 2;
        let msg = PublishMessage::build()
            .payload(Bytes::from(batch.bytes))
            .message_id(format!("{}.{}-{}", source.id, batch.first, batch.last))
            .expected_last_subject_sequence(pos.subject_seq)
            .header(HEADER_LEDGER, source.id.as_str())
            .header(HEADER_FIRST, batch.first.to_string().as_str())
            .header(HEADER_LAST, batch.last.to_string().as_str());
        let ack = self
            .fleet
            .jetstream()
            .send_publish(self.subject.clone(), msg)
            .await
            .map_err(|e| classify(e.kind(), &e))?
            .await
            .map_err(|e| classify(e.kind(), &e))?;
        if ack.duplicate {
            // Stored before (an answer lost): where the subject stands is
            // the stream's to say.
            return Err(Failure::Transient("duplicate publish: resyncing".into()));
        }
        *published_any = true;
        pos.next = batch.last + 1;
        pos.subject_seq = ack.sequence;
        let mut s = lock(&self.state);
        if live {
            s.published_seq = batch.last;
        }
        s.messages += 1;
        s.lines += lines;
        if s.refused.is_some() && !s.fork {
            s.refused = None;
        }
        Ok(true)
    }

    /// Asks the stream where the subject stands for `source`. `Ok(None)`:
    /// the subject already carries the newer chain (`then_live`).
    async fn resync(
        &mut self,
        source: &mut Source,
        then_live: bool,
        published_any: bool,
    ) -> Result<Option<Position>, Failure> {
        let stream = self.fleet.stream().await.map_err(Failure::Transient)?;
        let last = match stream.get_last_raw_message_by_subject(&self.subject).await {
            Ok(m) => m,
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {
                return Ok(Some(Position {
                    next: 1,
                    subject_seq: 0,
                }))
            }
            Err(e) => {
                return Err(Failure::Transient(format!(
                    "reading the subject's last message: {e}"
                )))
            }
        };
        let header = |name: &str| last.headers.get(name).map(|v| v.as_str().to_string());
        let id = header(HEADER_LEDGER).unwrap_or_default();
        let last_seq = header(HEADER_LAST).and_then(|v| v.parse::<u64>().ok());
        if id != source.id && last_seq.is_none() {
            // Not a veris ledger message at all: someone else writes here.
            return Err(Failure::Fork(format!(
                "stream message {} on {} is not a veris ledger message (no {HEADER_LEDGER} and {HEADER_LAST} headers): another writer on the subject",
                last.sequence, self.subject
            )));
        }
        if id != source.id {
            if then_live || !published_any {
                // An older chain (or, for a moved-aside file, maybe the
                // newer one: then this file is done).
                let live_first = then_live && last_seq.is_some() && id == self.live_id;
                if live_first {
                    return Ok(None);
                }
                return Ok(Some(Position {
                    next: 1,
                    subject_seq: last.sequence,
                }));
            }
            return Err(Failure::Fork(format!(
                "stream message {} on {} belongs to chain {id:?}, published after this chain ({})",
                last.sequence, self.subject, source.id
            )));
        }
        let Some(last_seq) = last_seq else {
            return Err(Failure::Fork(format!(
                "stream message {} on {} names this chain without a seq",
                last.sequence, self.subject
            )));
        };
        // The stream's last line of this chain must be the file's.
        let theirs = last
            .payload
            .strip_suffix(b"\n")
            .unwrap_or(&last.payload)
            .rsplit(|b| *b == b'\n')
            .next()
            .unwrap_or_default()
            .to_vec();
        let end = source.end.unwrap_or_else(|| self.ledger.head().0);
        if last_seq > end {
            return Err(Failure::Fork(format!(
                "the stream has line {last_seq} of chain {}; the file ends at {end}",
                source.id
            )));
        }
        let ours = self.read(source, last_seq, last_seq).await?;
        if ours
            .as_ref()
            .map(|b| b.bytes.strip_suffix(b"\n").unwrap_or(&b.bytes))
            != Some(&theirs[..])
        {
            return Err(Failure::Fork(format!(
                "line {last_seq} of chain {} in the stream (message {}) differs from the file's",
                source.id, last.sequence
            )));
        }
        if source.end.is_none() {
            lock(&self.state).published_seq = last_seq;
        }
        Ok(Some(Position {
            next: last_seq + 1,
            subject_seq: last.sequence,
        }))
    }

    /// Lines `from..=to` of the source (as many as fit a batch).
    async fn read(
        &self,
        source: &mut Source,
        from: u64,
        to: u64,
    ) -> Result<Option<Batch>, Failure> {
        let start = if source.cursor.0 == from {
            source.cursor.1
        } else if source.end.is_none() {
            self.ledger.position_after(from - 1).0
        } else {
            0
        };
        let limit = match source.end {
            Some(_) => u64::MAX,
            None => self.ledger.position_after(to).1,
        };
        let (path, max) = (source.path.clone(), self.batch_bytes);
        let read =
            tokio::task::spawn_blocking(move || read_lines(&path, start, limit, from, to, max))
                .await
                .map_err(|e| Failure::Transient(format!("reading the ledger: {e}")))?;
        match read {
            Ok(Some((batch, next_offset))) => {
                source.cursor = (batch.last + 1, next_offset);
                Ok(Some(batch))
            }
            Ok(None) => Ok(None),
            Err(e) if start != 0 && e.kind() == std::io::ErrorKind::InvalidData => {
                // The offset did not hold the line expected: read from the start.
                source.cursor = (0, 0);
                let (path, max) = (source.path.clone(), self.batch_bytes);
                let again =
                    tokio::task::spawn_blocking(move || read_lines(&path, 0, limit, from, to, max))
                        .await
                        .map_err(|e| Failure::Transient(format!("reading the ledger: {e}")))?;
                match again {
                    Ok(Some((batch, next_offset))) => {
                        source.cursor = (batch.last + 1, next_offset);
                        Ok(Some(batch))
                    }
                    Ok(None) => Ok(None),
                    Err(e) => Err(Failure::Refused(format!(
                        "reading {}: {e}",
                        source.path.display()
                    ))),
                }
            }
            Err(e) => Err(Failure::Refused(format!(
                "reading {}: {e}",
                source.path.display()
            ))),
        }
    }

    /// Remembers the newest seal line among `batch`'s.
    fn note_seals(&mut self, batch: &Batch) {
        let lines = batch.bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty());
        for (seq, line) in (batch.first..).zip(lines) {
            if is_seal(line) && self.newest_seal.as_ref().is_none_or(|(s, _)| *s < seq) {
                let text: Arc<str> = String::from_utf8_lossy(line).into();
                self.newest_seal = Some((seq, text));
            }
        }
    }

    /// Publishes the newest seal line seen, when newer than the last one
    /// published: the chain head a reader compares the stream with.
    async fn publish_checkpoint(&mut self) {
        let Some((seq, text)) = self.newest_seal.clone() else {
            return;
        };
        if seq <= lock(&self.state).checkpoint_seq {
            return;
        }
        let id = self.live_id.clone();
        let msg = PublishMessage::build()
            .payload(Bytes::from(format!("{text}\n")))
            .message_id(format!("{id}.{seq}.head"))
            .header(HEADER_LEDGER, id.as_str())
            .header(HEADER_FIRST, seq.to_string().as_str())
            .header(HEADER_LAST, seq.to_string().as_str());
        let sent = match self
            .fleet
            .jetstream()
            .send_publish(self.checkpoint_subject.clone(), msg)
            .await
        {
            Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match sent {
            Ok(()) => lock(&self.state).checkpoint_seq = seq,
            Err(e) => lock(&self.state).last_error = Some(format!("checkpoint: {e}")),
        }
    }

    /// Waits for the writer to commit something (or `max`). False when
    /// stopped.
    async fn wait_for_lines(&mut self, max: Duration) -> bool {
        tokio::select! {
            _ = self.stop.changed() => false,
            _ = tokio::time::sleep(max) => true,
            got = self.sub.recv() => {
                match got {
                    Ok(c) => self.note_committed(c),
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => {
                        // The writer is gone: what it wrote is in the file.
                        tokio::time::sleep(max).await;
                    }
                }
                !*self.stop.borrow()
            }
        }
    }

    /// Remembers a committed line's text when it is a seal of the live chain.
    fn note_committed(&mut self, c: veris_receipt::ledger::Committed) {
        if is_seal(c.text.as_bytes()) && !self.live_id.is_empty() {
            self.newest_seal = Some((c.seq, c.text));
        }
    }

    /// Takes the writer's queued wakeups without waiting.
    fn drain_wakeups(&mut self) {
        loop {
            match self.sub.try_recv() {
                Ok(c) => self.note_committed(c),
                Err(broadcast::error::TryRecvError::Lagged(_)) => {}
                Err(_) => return,
            }
        }
    }

    async fn pause(&mut self, d: Duration) -> bool {
        tokio::select! {
            _ = self.stop.changed() => false,
            _ = tokio::time::sleep(d) => true,
        }
    }
}

/// Sorts a publish failure: 10071 (wrong last sequence) means the subject
/// moved under us (resync decides whether it was us); other answers from
/// the server are refusals; no answer may pass.
fn classify(kind: PublishErrorKind, e: &dyn std::error::Error) -> Failure {
    match kind {
        PublishErrorKind::WrongLastSequence => {
            Failure::Transient(format!("{e} (10071): resyncing"))
        }
        PublishErrorKind::MaxPayloadExceeded => Failure::Refused(e.to_string()),
        PublishErrorKind::Other => {
            let api = std::error::Error::source(e)
                .and_then(|s| s.downcast_ref::<async_nats::jetstream::Error>());
            match api {
                Some(api) => Failure::Refused(format!("{api} ({})", api.code())),
                None => Failure::Transient(e.to_string()),
            }
        }
        _ => Failure::Transient(e.to_string()),
    }
}

/// A seal line, by the writer's one spelling of its kind.
fn is_seal(line: &[u8]) -> bool {
    memfind(line, br#","kind":"seal","#)
}

fn memfind(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The first 16 hex digits of the hash of a chain's first line.
pub fn ledger_id(first_line: &[u8]) -> String {
    let mut h = line_hash(first_line);
    h.truncate(LEDGER_ID_LEN);
    h
}

fn first_line(path: &std::path::Path) -> std::io::Result<Option<Vec<u8>>> {
    let file = File::open(path)?;
    let mut lines = LineReader::at(file, 0);
    let mut buf = Vec::new();
    Ok(match lines.next_into(&mut buf)? {
        Some(RawLine::Line) => Some(buf),
        _ => None,
    })
}

/// The ledger the live one's session line says was moved aside, as a
/// source to finish first (up to the head the proxy saw when it moved it).
fn moved_aside(live: &std::path::Path) -> Option<Source> {
    #[derive(serde::Deserialize)]
    struct Session {
        moved_aside: Option<veris_receipt::entry::MovedAside>,
    }
    let first = first_line(live).ok()??;
    let moved = serde_json::from_slice::<Session>(&first)
        .ok()?
        .moved_aside?;
    let path = PathBuf::from(&moved.file);
    let id = ledger_id(&first_line(&path).ok()??);
    Some(Source {
        path,
        id,
        end: Some(moved.head_seq),
        cursor: (1, 0),
    })
}

/// The seq a line names (the writer spells `{"v":N,"seq":M,` first).
fn seq_of(line: &[u8]) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct SeqOnly {
        seq: u64,
    }
    serde_json::from_slice::<SeqOnly>(line).ok().map(|s| s.seq)
}

/// Reads the lines `from..=to` of `path` starting at byte `start` (at or
/// before line `from`), up to byte `limit`, at most `max` bytes of them
/// (at least one line). Returns the batch and the offset after its last
/// line. `InvalidData` when the lines found do not run gapless from `from`.
fn read_lines(
    path: &std::path::Path,
    start: u64,
    limit: u64,
    from: u64,
    to: u64,
    max: usize,
) -> std::io::Result<Option<(Batch, u64)>> {
    let mut file = File::open(path)?;
    file.seek(SeekFrom::Start(start))?;
    let len = file.metadata()?.len().min(limit);
    let mut lines = LineReader::at(file.take(len.saturating_sub(start)), start);
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let mut offset = start;
    let mut expect = from;
    while expect <= to {
        let Some(raw) = lines.next_into(&mut buf)? else {
            break;
        };
        let Some(seq) = seq_of(&buf) else {
            // Only a complete line parses; a line too long to keep cannot
            // be published either.
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a line at byte {offset} has no readable seq"),
            ));
        };
        offset += buf.len() as u64 + 1;
        if raw != RawLine::Line {
            return Err(std::io::Error::other(format!(
                "line {seq} is too long to publish"
            )));
        }
        if seq < expect {
            continue;
        }
        if seq != expect {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("expected line {expect}, found {seq}"),
            ));
        }
        if !out.is_empty() && out.len() + buf.len() + 1 > max {
            offset -= buf.len() as u64 + 1;
            break;
        }
        out.extend_from_slice(&buf);
        out.push(b'\n');
        expect += 1;
    }
    if out.is_empty() {
        return Ok(None);
    }
    Ok(Some((
        Batch {
            first: from,
            last: expect - 1,
            bytes: out,
        },
        offset,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_gapless_lines_in_batches() {
        let dir = std::env::temp_dir().join(format!("veris-fleet-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ledger.jsonl");
        let text: String = (1..=5)
            .map(|i| format!("{{\"v\":5,\"seq\":{i},\"kind\":\"x\",\"prev\":\"p\"}}\n"))
            .collect();
        std::fs::write(&path, &text).unwrap();
        let one = text.lines().next().unwrap().len() + 1;
        let (b, off) = read_lines(&path, 0, u64::MAX, 2, 5, one * 2)
            .unwrap()
            .unwrap();
        assert_eq!((b.first, b.last), (2, 3));
        let (b2, _) = read_lines(&path, off, u64::MAX, 4, 5, 1 << 20)
            .unwrap()
            .unwrap();
        assert_eq!((b2.first, b2.last), (4, 5));
        assert_eq!(
            String::from_utf8(b.bytes).unwrap() + &String::from_utf8(b2.bytes).unwrap(),
            text.lines()
                .skip(1)
                .map(|l| format!("{l}\n"))
                .collect::<String>()
        );
        // A gap is found, never papered over.
        let gapped = text.replace("\"seq\":3,", "\"seq\":9,");
        std::fs::write(&path, gapped).unwrap();
        assert!(read_lines(&path, 0, u64::MAX, 1, 5, 1 << 20).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
