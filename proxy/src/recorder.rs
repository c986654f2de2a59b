//! Where decisions go. The proxy emits one [`Entry`] per decision to a
//! [`Recorder`]; the ledger implements it, tests use [`MemoryRecorder`]. A
//! recorder error means the decision could not be made durable: the proxy then
//! refuses vendor traffic (503) instead of serving it unrecorded.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use veris_receipt::ledger::Ledger;
use veris_receipt::Entry;

#[derive(Debug, thiserror::Error)]
#[error("recording failed: {0}")]
pub struct RecordError(pub String);

/// Receives every decision; `record` returns once the entry is handed to durable storage.
pub trait Recorder: Send + Sync + 'static {
    fn record(&self, entry: Entry) -> Result<u64, RecordError>;
}

impl Recorder for Ledger {
    fn record(&self, entry: Entry) -> Result<u64, RecordError> {
        self.append(entry).map_err(|e| RecordError(e.to_string()))
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
    fn record(&self, entry: Entry) -> Result<u64, RecordError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(RecordError("memory recorder set to fail".into()));
        }
        let mut entries = self
            .entries
            .lock()
            .map_err(|_| RecordError("memory recorder poisoned".into()))?;
        entries.push(entry);
        let seq = entries.len() as u64;
        drop(entries);
        self.changed.notify_waiters();
        Ok(seq)
    }
}
