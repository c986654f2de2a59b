//! Body capture (`--capture-bodies DIR`, off by default): the request and
//! response bodies of each exchange with the twin, tee'd as they stream
//! ([`Tee`], beside the counting wrappers; at most the per-body cap is kept
//! in memory, the body itself is never held back), handed to one writer
//! thread when both have ended, which redacts them (`redact::body`), stores
//! them in the capture dir and appends a `body_capture` line naming the
//! request's seq and each stored file's SHA-256, so a reader can tell a
//! stored body from one the workload edited.
//!
//! The request path never waits for a capture: the hand-over is a
//! `try_send` on a bounded queue, and an exchange that finds it full is not
//! captured (counted, and logged at the end). Once the stored bytes reach
//! the total cap, nothing more is stored: later bodies are recorded as
//! `total_cap` and no longer buffered at all.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body::Body;
use tracing::warn;
use veris_receipt::capture::{self, Side};
use veris_receipt::redact::{self, BodyText};
use veris_receipt::{CapturedBody, Entry};

use crate::body::{End, Watch, Watched};
use crate::request::recorder::Recorder;

/// Exchanges waiting for the writer thread; more are dropped, not waited for.
const QUEUE: usize = 64;

/// Where and how much to capture.
#[derive(Debug, Clone)]
pub struct CaptureOptions {
    /// The capture dir (created when missing).
    pub dir: PathBuf,
    /// Bytes kept of each body; the rest is counted, not kept.
    pub max_body: usize,
    /// Bytes stored in all; then nothing more.
    pub max_total: u64,
}

/// The running capture: the writer thread's queue and the shared caps.
pub struct Capture {
    max_body: usize,
    queue: SyncSender<Job>,
    /// Set by the writer once the total cap is reached.
    full: Arc<AtomicBool>,
    /// Exchanges not captured because the queue was full.
    dropped: AtomicU64,
}

enum Job {
    Exchange(Done),
    /// Answered once every job queued before it is written and recorded.
    Flush(std::sync::mpsc::Sender<()>),
}

/// Both bodies of a recorded request.
struct Done {
    seq: u64,
    request: Part,
    response: Part,
}

/// One body as the tee saw it.
#[derive(Debug, Default)]
pub struct Part {
    kept: Vec<u8>,
    seen: u64,
    mime: Option<String>,
    /// Not captured, and why.
    skipped: Option<&'static str>,
}

impl Part {
    /// A body that was not tee'd (`client_gone`, `websocket`).
    pub fn skipped(why: &'static str) -> Part {
        Part {
            skipped: Some(why),
            ..Part::default()
        }
    }
}

impl Capture {
    /// Creates the dir and starts the writer thread, which appends its
    /// lines through `recorder` under `run_id`'s file names.
    pub fn start(
        options: CaptureOptions,
        run_id: &str,
        recorder: Arc<dyn Recorder>,
    ) -> std::io::Result<Arc<Capture>> {
        std::fs::create_dir_all(&options.dir)?;
        if !std::fs::metadata(&options.dir)?.is_dir() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a directory",
            ));
        }
        let (queue, jobs) = sync_channel::<Job>(QUEUE);
        let full = Arc::new(AtomicBool::new(false));
        let writer = Writer {
            dir: options.dir,
            run_id: run_id.to_string(),
            max_total: options.max_total,
            total: 0,
            full: full.clone(),
            recorder,
        };
        std::thread::Builder::new()
            .name("veris-capture".into())
            .spawn(move || {
                let mut writer = writer;
                for job in jobs {
                    match job {
                        Job::Exchange(done) => writer.write(done),
                        Job::Flush(ack) => {
                            let _ = ack.send(());
                        }
                    }
                }
            })?;
        Ok(Arc::new(Capture {
            max_body: options.max_body,
            queue,
            full,
            dropped: AtomicU64::new(0),
        }))
    }

    /// A new exchange's slot, which its two tees and its seq fill.
    pub fn slot(self: &Arc<Self>) -> Arc<Slot> {
        Arc::new(Slot {
            capture: self.clone(),
            state: Mutex::new(SlotState::default()),
        })
    }

    /// Waits until every exchange handed over so far is stored and its line
    /// appended (blocking: call it off the async workers), so the final
    /// seal covers them. Logs how many were dropped.
    pub fn flush(&self) {
        let (ack, done) = std::sync::mpsc::channel();
        if self.queue.send(Job::Flush(ack)).is_ok() {
            let _ = done.recv();
        }
        let dropped = self.dropped.load(Ordering::Relaxed);
        if dropped > 0 {
            warn!(
                dropped,
                "body capture: exchanges not captured because the writer fell behind"
            );
        }
    }

    fn hand_over(&self, done: Done) {
        match self.queue.try_send(Job::Exchange(done)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// One exchange's capture, filled from three places in any order: the
/// request's tee, the response's tee and the request line's seq. Handed
/// to the writer once all three are in; an exchange that never got a line
/// (the twin failed) is never handed over.
pub struct Slot {
    capture: Arc<Capture>,
    state: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    seq: Option<u64>,
    request: Option<Part>,
    response: Option<Part>,
}

impl Slot {
    /// A tee for one body of this exchange: `mime` is its `Content-Type`,
    /// `encoded` true when a `Content-Encoding` other than identity makes
    /// it bytes that are not text.
    pub fn tee<B>(
        self: &Arc<Self>,
        inner: B,
        side: Side,
        mime: Option<String>,
        encoded: bool,
    ) -> Tee<B>
    where
        B: Body,
    {
        let skipped = if self.capture.full.load(Ordering::Relaxed) {
            Some("total_cap")
        } else if encoded {
            Some("binary")
        } else {
            None
        };
        let sink = Sink {
            part: Part {
                kept: Vec::new(),
                seen: 0,
                mime,
                skipped,
            },
            cap: self.capture.max_body,
            slot: self.clone(),
            side,
        };
        Watched::watch(inner, Some(sink))
    }

    /// The request's ledger line was written as `seq`.
    pub fn recorded(&self, seq: u64) {
        self.update(|s| s.seq = Some(seq));
    }

    /// The body on `side` was not tee'd, for `why`.
    pub fn skip(&self, side: Side, why: &'static str) {
        self.put(side, Part::skipped(why));
    }

    fn put(&self, side: Side, part: Part) {
        self.update(|s| match side {
            Side::Request => s.request = Some(part),
            Side::Response => s.response = Some(part),
        });
    }

    fn update(&self, f: impl FnOnce(&mut SlotState)) {
        let done = {
            let Ok(mut s) = self.state.lock() else {
                return;
            };
            f(&mut s);
            match (s.seq, s.request.is_some(), s.response.is_some()) {
                (Some(seq), true, true) => Some(Done {
                    seq,
                    request: s.request.take().unwrap_or_default(),
                    response: s.response.take().unwrap_or_default(),
                }),
                _ => None,
            }
        };
        if let Some(done) = done {
            self.capture.hand_over(done);
        }
    }
}

/// Where a [`Tee`] keeps its copy, and the slot it hands the copy to.
pub struct Sink {
    part: Part,
    cap: usize,
    slot: Arc<Slot>,
    side: Side,
}

/// A body that keeps a copy of its first bytes (up to the per-body cap) as
/// they pass, counts the rest, and hands the part to its [`Slot`] when the
/// body ends, fails or is dropped. Without a sink it is the body as is.
pub type Tee<B> = Watched<B, Option<Sink>>;

impl<B: Body> Tee<B> {
    /// A body that captures nothing.
    pub fn off(inner: B) -> Tee<B> {
        Watched::watch(inner, None)
    }
}

impl Watch for Option<Sink> {
    fn data(&mut self, data: &Bytes) {
        let Some(sink) = self else { return };
        sink.part.seen += data.len() as u64;
        if sink.part.skipped.is_none() {
            let room = sink.cap.saturating_sub(sink.part.kept.len());
            sink.part
                .kept
                .extend_from_slice(&data[..room.min(data.len())]);
        }
    }
    fn end(&mut self, _: End) {
        if let Some(sink) = self.take() {
            sink.slot.put(sink.side, sink.part);
        }
    }
}

/// The writer thread's state: the dir and the bytes stored so far.
struct Writer {
    dir: PathBuf,
    run_id: String,
    max_total: u64,
    total: u64,
    full: Arc<AtomicBool>,
    recorder: Arc<dyn Recorder>,
}

impl Writer {
    fn write(&mut self, done: Done) {
        let request = self.store(done.seq, Side::Request, done.request);
        let response = self.store(done.seq, Side::Response, done.response);
        let entry = Entry::BodyCapture {
            of: done.seq,
            request,
            response,
        };
        if let Err(e) = self.recorder.record(entry).wait() {
            warn!(error = %e, of = done.seq, "body capture could not be recorded");
        }
    }

    fn store(&mut self, seq: u64, side: Side, part: Part) -> CapturedBody {
        let mut b = CapturedBody {
            bytes: part.seen,
            mime: part.mime.clone(),
            file: None,
            sha256: None,
            stored: None,
            truncated_at: None,
            skipped: None,
        };
        let skip = |mut b: CapturedBody, why: &str| {
            b.skipped = Some(why.to_string());
            b
        };
        if let Some(why) = part.skipped {
            return skip(b, why);
        }
        if part.seen == 0 {
            return skip(b, "empty");
        }
        if self.full.load(Ordering::Relaxed) {
            return skip(b, "total_cap");
        }
        let truncated = part.seen > part.kept.len() as u64;
        let text = match redact::body(part.mime.as_deref(), &part.kept, truncated) {
            BodyText::Text(text) => text,
            BodyText::Binary => return skip(b, "binary"),
            BodyText::Unstructured => return skip(b, "unstructured_text"),
        };
        if self.total.saturating_add(text.len() as u64) > self.max_total {
            self.full.store(true, Ordering::Relaxed);
            return skip(b, "total_cap");
        }
        let name = capture::file_name(&self.run_id, seq, side);
        if let Err(e) = capture::store(&self.dir, &name, text.as_bytes()) {
            // The error names the file, never its content.
            warn!(error = %e, file = %name, "body capture: the file could not be created; this body is not stored");
            return skip(b, "store_failed");
        }
        self.total += text.len() as u64;
        b.sha256 = Some(veris_receipt::hash::line_hash(text.as_bytes()));
        b.stored = Some(text.len() as u64);
        b.file = Some(name);
        b.truncated_at = truncated.then_some(part.kept.len() as u64);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::recorder::MemoryRecorder;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_tee_keeps_the_cap_passes_everything_and_is_recorded_after_its_seq() {
        let dir = std::env::temp_dir().join(format!("veris-capture-tee-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let recorder = Arc::new(MemoryRecorder::default());
        let capture = Capture::start(
            CaptureOptions {
                dir: dir.clone(),
                max_body: 8,
                max_total: 1000,
            },
            "run1",
            recorder.clone(),
        )
        .unwrap();
        let slot = capture.slot();
        let request = slot.tee(
            crate::body::full("password=hunter2&amount=1"),
            Side::Request,
            Some("application/x-www-form-urlencoded".into()),
            false,
        );
        // The body reaches its reader whole; only the copy is cut.
        let sent = request.collect().await.unwrap().to_bytes();
        assert_eq!(sent, "password=hunter2&amount=1");
        let response = slot.tee(crate::body::empty(), Side::Response, None, false);
        drop(response);
        // Nothing is handed over before the request line's seq is known.
        capture.flush();
        assert!(recorder.entries().is_empty());
        slot.recorded(7);
        capture.flush();
        let entries = recorder.entries();
        let [Entry::BodyCapture {
            of,
            request,
            response,
        }] = &entries[..]
        else {
            panic!("{entries:?}");
        };
        assert_eq!(*of, 7);
        assert_eq!((request.bytes, request.truncated_at), (25, Some(8)));
        assert_eq!(response.skipped.as_deref(), Some("empty"));
        let stored = std::fs::read_to_string(dir.join(request.file.as_ref().unwrap())).unwrap();
        // `password=` cut to 8 bytes is `password`, a name with no value.
        assert!(!stored.contains("hunter2"), "{stored}");
        assert_eq!(
            request.sha256.as_deref(),
            Some(veris_receipt::hash::line_hash(stored.as_bytes()).as_str())
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
