//! A gateway sandbox's limits besides its connection cap (DESIGN §13), so
//! that one sandbox cannot starve the others: requests a second (a token
//! bucket every request takes from, [`Limiter::request`]) and bytes a
//! second (one bucket over both directions of everything the sandbox moves,
//! paced by [`throttle::Throttled`]). Over the request limit a request is
//! refused; over the byte limit bytes wait, never dropped.
//!
//! Every hit of a limit (the connection cap's too) is a `blocked` line in
//! the sandbox's ledger, at most one a second per limit, counting every hit
//! since the last line: the first hit after a quiet second is written at
//! once, later ones are counted and written a second after the previous
//! line, so no hit goes uncounted and a flood is one line a second.

pub mod bucket;
pub mod throttle;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::{header, HeaderValue, Response, StatusCode};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::warn;
use veris_receipt::{BlockedLine, Entry, ListenerTier};

use crate::body::ProxyBody;
use crate::request::recorder::Recorder;
use crate::request::respond;
use crate::Limits;
use bucket::TokenBucket;

/// The limits whose hits a sandbox's ledger records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// [`Limits::max_connections`]: a connection refused.
    Connections,
    /// [`Limits::max_rps`]: a request (or tunnel open) refused.
    Requests,
    /// [`Limits::max_bytes_per_sec`]: a read or write made to wait.
    Bytes,
}

impl Limit {
    const ALL: [Limit; 3] = [Limit::Connections, Limit::Requests, Limit::Bytes];

    fn index(self) -> usize {
        self as usize
    }
}

/// The hits of one limit not yet in a line.
#[derive(Debug, Default)]
struct Tally {
    hits: AtomicU64,
    /// Milliseconds waited ([`Limit::Bytes`]).
    waited_ms: AtomicU64,
    /// A line is due (its writer is scheduled).
    pending: AtomicBool,
    /// When the last line was written.
    last: Mutex<Option<Instant>>,
}

/// One proxy's (a gateway sandbox's) rate limits and the lines that record
/// their hits.
pub struct Limiter {
    limits: Limits,
    requests: Option<TokenBucket>,
    bytes: Option<TokenBucket>,
    tallies: [Tally; 3],
    recorder: Arc<dyn Recorder>,
    /// The proxy's connection tasks: a line due at shutdown is written
    /// before the proxy's drain ends (and its ledger's final seal).
    tasks: TaskTracker,
    cancel: CancellationToken,
    sandbox_id: String,
}

impl Limiter {
    pub(crate) fn new(
        limits: Limits,
        recorder: Arc<dyn Recorder>,
        tasks: TaskTracker,
        cancel: CancellationToken,
        sandbox_id: String,
    ) -> Arc<Limiter> {
        // A second's worth at once: a client that opens a page of
        // requests together is not refused, one that keeps it up is.
        let bucket = |rate: u64| (rate > 0).then(|| TokenBucket::new(rate, rate));
        Arc::new(Limiter {
            limits,
            requests: bucket(u64::from(limits.max_rps)),
            bytes: bucket(limits.max_bytes_per_sec),
            tallies: Default::default(),
            recorder,
            tasks,
            cancel,
            sandbox_id,
        })
    }

    /// One request (or tunnel open) of the sandbox: `Err` with how long
    /// until the next would be served when it is over its limit, the hit
    /// counted for its ledger line.
    pub(crate) fn request(self: &Arc<Self>) -> Result<(), Duration> {
        let Some(bucket) = &self.requests else {
            return Ok(());
        };
        bucket
            .take()
            .inspect_err(|_| self.hit(Limit::Requests, Duration::ZERO))
    }

    /// The bucket bytes are paced by, if the sandbox has a byte limit.
    pub(crate) fn bytes(&self) -> Option<&TokenBucket> {
        self.bytes.as_ref()
    }

    /// Counts a hit of `limit` (and, for bytes, the time it made a move
    /// wait) and makes sure a line will say so.
    pub(crate) fn hit(self: &Arc<Self>, limit: Limit, waited: Duration) {
        let tally = &self.tallies[limit.index()];
        tally.hits.fetch_add(1, Ordering::Relaxed);
        let ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
        tally.waited_ms.fetch_add(ms, Ordering::Relaxed);
        if tally.pending.swap(true, Ordering::AcqRel) {
            return;
        }
        let limiter = self.clone();
        self.tasks
            .spawn(async move { limiter.write_line(limit).await });
    }

    /// Waits until a second after `limit`'s last line (or the shutdown),
    /// then writes one line with every hit counted since.
    async fn write_line(&self, limit: Limit) {
        let tally = &self.tallies[limit.index()];
        let due = lock(&tally.last).map(|last| last + Duration::from_secs(1));
        if let Some(due) = due {
            tokio::select! {
                () = tokio::time::sleep_until(due) => {}
                () = self.cancel.cancelled() => {}
            }
        }
        let (hits, waited_ms) = {
            // Under the lock, so a writer scheduled by the next hit reads
            // this line's time, never the one before.
            let mut last = lock(&tally.last);
            tally.pending.store(false, Ordering::Release);
            let hits = tally.hits.swap(0, Ordering::AcqRel);
            let waited = tally.waited_ms.swap(0, Ordering::AcqRel);
            if hits > 0 {
                *last = Some(Instant::now());
            }
            (hits, waited)
        };
        if hits == 0 {
            return;
        }
        let reason = self.reason(limit, hits, waited_ms);
        warn!(sandbox = %self.sandbox_id, %reason, "a sandbox hit its limit");
        let entry = Entry::Blocked(BlockedLine {
            host: String::new(),
            port: 0,
            tier: ListenerTier::Gateway,
            method: None,
            path: None,
            reason,
            dst: None,
        });
        if let Err(e) = self.recorder.record(entry).await {
            warn!(error = %e, "a sandbox's limit line could not be recorded");
        }
    }

    /// The line's words; the count comes last in the same form for every
    /// limit, so a reader can add them up.
    fn reason(&self, limit: Limit, hits: u64, waited_ms: u64) -> String {
        match limit {
            Limit::Connections => format!(
                "gateway: sandbox limit of {} open connections reached ({hits} refused since the last such line)",
                self.limits.max_connections
            ),
            Limit::Requests => format!(
                "gateway: sandbox limit of {} requests a second reached ({hits} refused since the last such line)",
                self.limits.max_rps
            ),
            Limit::Bytes => format!(
                "gateway: sandbox limit of {} bytes a second reached: its traffic was slowed, nothing dropped ({hits} waits, {waited_ms} ms in all, since the last such line)",
                self.limits.max_bytes_per_sec
            ),
        }
    }
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pending: Vec<u64> = Limit::ALL
            .iter()
            .map(|l| self.tallies[l.index()].hits.load(Ordering::Relaxed))
            .collect();
        f.debug_struct("Limiter")
            .field("limits", &self.limits)
            .field("pending", &pending)
            .finish_non_exhaustive()
    }
}

/// The answer to a request over its sandbox's requests a second: `429`
/// with `Retry-After` (whole seconds, at least 1).
pub(crate) fn too_many_requests(limits: &Limits, wait: Duration) -> Response<ProxyBody> {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let secs = secs.max(1);
    let mut response = respond::error(
        StatusCode::TOO_MANY_REQUESTS,
        "veris_rate_limited",
        format!(
            "this sandbox sent more than {} requests a second through the veris gateway; this one was refused and reached nothing. Next: retry after {secs} s, or raise its limit (`veris gateway add-sandbox --max-rps`, `veris gateway --sandbox-rps`)",
            limits.max_rps
        ),
        json!({"retry_after_secs": secs}),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    response
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::recorder::MemoryRecorder;

    fn limiter(limits: Limits, recorder: Arc<MemoryRecorder>) -> (Arc<Limiter>, TaskTracker) {
        let tasks = TaskTracker::new();
        let limiter = Limiter::new(
            limits,
            recorder,
            tasks.clone(),
            CancellationToken::new(),
            "sbx".into(),
        );
        (limiter, tasks)
    }

    fn counts(recorder: &MemoryRecorder) -> Vec<u64> {
        recorder
            .entries()
            .iter()
            .filter_map(|e| match e {
                Entry::Blocked(b) => b
                    .reason
                    .rsplit_once('(')
                    .and_then(|(_, n)| n.split(' ').next()?.parse().ok()),
                _ => None,
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_refusals_is_one_line_a_second_and_all_are_counted() {
        let recorder = Arc::new(MemoryRecorder::default());
        let limits = Limits {
            max_rps: 5,
            ..Limits::default()
        };
        let (limiter, tasks) = limiter(limits, recorder.clone());
        let mut refused = 0;
        // 2.5 s of 100 requests a second.
        for _ in 0..250 {
            if limiter.request().is_err() {
                refused += 1;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tasks.close();
        tasks.wait().await;
        let counts = counts(&recorder);
        assert_eq!(counts.iter().sum::<u64>(), refused, "{counts:?}");
        assert!(
            (2..=4).contains(&counts.len()),
            "2.5 s of refusals: {counts:?}"
        );
        assert!(refused > 200, "{refused}");
    }

    #[tokio::test(start_paused = true)]
    async fn unlimited_is_never_refused_nor_recorded() {
        let recorder = Arc::new(MemoryRecorder::default());
        let (limiter, _) = limiter(Limits::default(), recorder.clone());
        for _ in 0..10_000 {
            assert!(limiter.request().is_ok());
        }
        assert!(limiter.bytes().is_none());
        assert!(recorder.entries().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_line_due_at_shutdown_is_written_at_once() {
        let recorder = Arc::new(MemoryRecorder::default());
        let tasks = TaskTracker::new();
        let cancel = CancellationToken::new();
        let limiter = Limiter::new(
            Limits::default(),
            recorder.clone(),
            tasks.clone(),
            cancel.clone(),
            "sbx".into(),
        );
        limiter.hit(Limit::Connections, Duration::ZERO);
        recorder.wait_for(1).await;
        limiter.hit(Limit::Connections, Duration::ZERO);
        limiter.hit(Limit::Connections, Duration::ZERO);
        cancel.cancel();
        tasks.close();
        tokio::time::timeout(Duration::from_millis(10), tasks.wait())
            .await
            .expect("no wait for the next second once shut down");
        assert_eq!(counts(&recorder), [1, 2]);
    }
}
