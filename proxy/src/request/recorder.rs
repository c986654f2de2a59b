//! Where decisions go. The proxy emits one [`Entry`] per decision to a
//! [`Recorder`]; the ledger implements it, tests use [`MemoryRecorder`]. A
//! recorder error means the decision could not be made durable: the proxy then
//! refuses vendor traffic (503) instead of serving it unrecorded.
//!
//! `record` hands the entry over and returns an [`Ack`]: async code awaits
//! it (the ledger's writer thread does the `write(2)`, so no worker blocks on
//! the file), code that is not async calls [`Ack::wait`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::task::{Context, Poll};

use veris_receipt::ledger::{Appending, Ledger};
use veris_receipt::Entry;

#[derive(Debug, thiserror::Error)]
#[error("recording failed: {0}")]
pub struct RecordError(pub String);

/// Receives every decision.
pub trait Recorder: Send + Sync + 'static {
    /// Hands the entry over; the [`Ack`] resolves once it is handed to
    /// durable storage (the kernel has the ledger line), with its seq.
    fn record(&self, entry: Entry) -> Ack;
}

/// The answer to one [`Recorder::record`]: a future, or [`Ack::wait`] on a
/// thread that may block. The entry is recorded whether or not it is awaited.
#[must_use = "await the ack (or wait) before answering the client"]
#[derive(Debug)]
pub struct Ack(AckInner);

#[derive(Debug)]
enum AckInner {
    Done(Option<Result<u64, RecordError>>),
    Ledger(Appending),
}

impl Ack {
    /// An ack already answered.
    pub fn ready(result: Result<u64, RecordError>) -> Ack {
        Ack(AckInner::Done(Some(result)))
    }

    /// Blocks this thread until the entry is recorded. For code that is not
    /// async; an async caller awaits the ack instead.
    pub fn wait(self) -> Result<u64, RecordError> {
        match self.0 {
            AckInner::Done(r) => r.unwrap_or_else(|| Err(RecordError("ack already taken".into()))),
            AckInner::Ledger(a) => a.wait().map_err(ledger_error),
        }
    }
}

impl Future for Ack {
    type Output = Result<u64, RecordError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().0 {
            AckInner::Done(r) => Poll::Ready(
                r.take()
                    .unwrap_or_else(|| Err(RecordError("ack already taken".into()))),
            ),
            AckInner::Ledger(a) => Pin::new(a).poll(cx).map(|r| r.map_err(ledger_error)),
        }
    }
}

/// The error with its causes (`writing ledger …: No space left on device`),
/// so whoever reads it learns the real reason.
fn ledger_error(e: veris_receipt::LedgerError) -> RecordError {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    RecordError(text)
}

/// Requests the twin was sent (and may have executed) whose ledger line
/// could not be written, counted per service in memory, with the last
/// write error: the twin cross-check then knows that a twin row without a
/// ledger line may be veris's own failure to write, not a direct call.
#[derive(Debug, Default)]
pub struct Unrecorded {
    inner: Mutex<UnrecordedCounts>,
}

/// What [`Unrecorded`] holds (also in the admin API's `/status`).
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UnrecordedCounts {
    /// Per service, how many of its requests went unrecorded.
    #[serde(default)]
    pub by_service: std::collections::BTreeMap<String, u64>,
    /// The last write error, with its cause.
    #[serde(default)]
    pub last_error: Option<String>,
}

impl Unrecorded {
    /// One request of `service` the twin may have executed could not be
    /// recorded, because of `error`.
    pub fn note(&self, service: &str, error: &RecordError) {
        let mut c = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        *c.by_service.entry(service.to_string()).or_default() += 1;
        c.last_error = Some(error.0.clone());
    }

    pub fn counts(&self) -> UnrecordedCounts {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Recorder for Ledger {
    fn record(&self, entry: Entry) -> Ack {
        Ack(AckInner::Ledger(self.append_queued(entry)))
    }
}

/// Keeps entries in memory; can be told to fail, to test the 503 path.
#[derive(Default)]
pub struct MemoryRecorder {
    entries: Mutex<Vec<Entry>>,
    failing: AtomicBool,
    changed: tokio::sync::Notify,
}

impl MemoryRecorder {
    /// Waits until at least `n` entries were recorded (entries written by
    /// background tasks, such as a tunnel closing, arrive asynchronously).
    pub async fn wait_for(&self, n: usize) -> Vec<Entry> {
        loop {
            let changed = self.changed.notified();
            let entries = self.entries();
            if entries.len() >= n {
                return entries;
            }
            changed.await;
        }
    }

    pub fn entries(&self) -> Vec<Entry> {
        self.entries.lock().map(|e| e.clone()).unwrap_or_default()
    }
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }
}

impl Recorder for MemoryRecorder {
    fn record(&self, entry: Entry) -> Ack {
        Ack::ready(self.push(entry))
    }
}

impl MemoryRecorder {
    fn push(&self, entry: Entry) -> Result<u64, RecordError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(RecordError("memory recorder set to fail".into()));
        }
        let mut entries = self
            .entries
            .lock()
            .map_err(|_| RecordError("memory recorder poisoned".into()))?;
        // Redacted as the ledger's writer redacts: the proxy hands entries
        // over as sent.
        entries.push(veris_receipt::redact::entry(entry));
        let seq = entries.len() as u64;
        drop(entries);
        self.changed.notify_waiters();
        Ok(seq)
    }
}
