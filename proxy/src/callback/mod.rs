//! Webhook deliveries (DESIGN §15): the twin's events POSTed, signed the
//! vendor's way, to the URLs `--webhook SERVICE=URL` names, each attempt
//! recorded as a `callback` ledger line in the proxy's chain.
//!
//! Everything here runs off the request path: the twin only queues events
//! ([`veris_twin::webhook::EventSink`], never blocking), and the [`Engine`]
//! delivers them on tasks of its own. Per event and URL: one attempt, then
//! retries with Stripe's kind of exponential backoff while the app answers
//! anything but 2xx (bounded: [`BACKOFF`]). Each attempt is bounded in time
//! and in the answer bytes it reads ([`deliver`]), so an app that never
//! answers, answers slowly or sends an endless body costs one attempt's
//! timeout and blocks nothing else.
//!
//! Only this engine writes `callback` lines: nothing a workload sends
//! (a request to its own app, a header that looks like a callback) can
//! become one.

pub mod deliver;
pub mod dial;
pub mod target;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;
use tracing::warn;
use veris_receipt::ledger::Ledger;
use veris_receipt::{CallbackLine, Entry};
use veris_twin::webhook::{Event, Secret};

pub use dial::{Dialer, SocketSource};
pub use target::Webhook;

/// Waits before the retries of a delivery whose app did not answer 2xx,
/// at time scale 1: exponential, as Stripe's (whose test mode retries
/// three times over a few hours). Four attempts in all.
pub const BACKOFF: [Duration; 3] = [
    Duration::from_secs(60),
    Duration::from_secs(300),
    Duration::from_secs(1500),
];

/// One attempt's bound at time scale 1: dial, request, answer head and
/// the bounded answer body all within it.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an attempt in flight when the session ends may still take.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Deliveries (an event to one URL, retries included) held at once; past
/// it the engine stops taking events and the twin drops new ones (with a
/// warning) rather than growing memory without bound.
const PENDING: usize = 4096;

/// Attempts in flight at once.
const CONCURRENT: usize = 32;

/// How an engine delivers.
pub struct EngineOptions {
    pub webhooks: Vec<Webhook>,
    /// The signing secrets per service (the newest first: during a
    /// rotation each delivery carries one signature per secret).
    pub secrets: Vec<(String, Vec<Secret>)>,
    pub ledger: Arc<Ledger>,
    /// Waits between attempts ([`BACKOFF`] times this).
    pub backoff_scale: f64,
    pub attempt_timeout: Duration,
    /// How attempts reach the app (the host's network, or an isolated
    /// run's namespace).
    pub dialer: Dialer,
}

/// A running delivery engine.
pub struct Engine {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Engine {
    /// Starts delivering the events `events` yields.
    pub fn start(events: mpsc::Receiver<Event>, options: EngineOptions) -> Engine {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(events, Arc::new(options), stopped));
        Engine { stop, task }
    }

    /// Stops taking events, starts the first attempt of every event already
    /// queued, and waits for the attempts in flight to be recorded (each
    /// cut, and recorded so, [`STOP_GRACE`] after the stop at most);
    /// retries not yet due are not made.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        if let Err(e) = self.task.await {
            warn!(error = %e, "the webhook engine's task failed");
        }
    }
}

async fn run(
    mut events: mpsc::Receiver<Event>,
    options: Arc<EngineOptions>,
    mut stopped: watch::Receiver<bool>,
) {
    let pending = Arc::new(Semaphore::new(PENDING));
    let attempts = Arc::new(Semaphore::new(CONCURRENT));
    let mut deliveries = JoinSet::new();
    loop {
        let Ok(permit) = Arc::clone(&pending).acquire_owned().await else {
            break;
        };
        let next = tokio::select! {
            e = events.recv() => Some(e),
            () = stopping(&mut stopped) => None,
        };
        let event = match next {
            Some(e) => e,
            // What was queued before the stop is still delivered (once).
            None => {
                events.close();
                events.recv().await
            }
        };
        let Some(event) = event else { break };
        let event = Arc::new(event);
        for webhook in options
            .webhooks
            .iter()
            .filter(|w| w.service == event.service)
        {
            let delivery = Delivery {
                webhook: webhook.clone(),
                event: Arc::clone(&event),
                options: Arc::clone(&options),
                attempts: Arc::clone(&attempts),
                stopped: stopped.clone(),
            };
            deliveries.spawn(delivery.run());
        }
        drop(permit);
        // Finished deliveries are reaped as we go (their results are unit).
        while deliveries.try_join_next().is_some() {}
    }
    while deliveries.join_next().await.is_some() {}
}

/// Resolves once the engine is told to stop.
async fn stopping(stopped: &mut watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}

/// One event to one URL, attempts and retries.
struct Delivery {
    webhook: Webhook,
    event: Arc<Event>,
    options: Arc<EngineOptions>,
    attempts: Arc<Semaphore>,
    stopped: watch::Receiver<bool>,
}

impl Delivery {
    async fn run(mut self) {
        let secrets: &[Secret] = self
            .options
            .secrets
            .iter()
            .find(|(s, _)| *s == self.event.service)
            .map_or(&[], |(_, v)| v.as_slice());
        for attempt in 1..=(BACKOFF.len() as u32 + 1) {
            let outcome = {
                let Ok(_permit) = self.attempts.acquire().await else {
                    return;
                };
                let started = std::time::Instant::now();
                let mut stopped = self.stopped.clone();
                tokio::select! {
                    o = deliver::attempt(
                        &self.options.dialer,
                        &self.webhook,
                        &self.event,
                        secrets,
                        self.options.attempt_timeout,
                    ) => o,
                    // A session that ends waits a little for an answer on
                    // its way, not a whole attempt's timeout.
                    () = async {
                        stopping(&mut stopped).await;
                        tokio::time::sleep(STOP_GRACE.min(self.options.attempt_timeout)).await;
                    } => deliver::Outcome {
                        status: None,
                        error: Some("session ended before the app answered".into()),
                        duration: started.elapsed(),
                    },
                }
            };
            let delivered = outcome.status.is_some_and(|s| (200..300).contains(&s));
            self.record(attempt, outcome).await;
            if delivered {
                return;
            }
            let Some(wait) = BACKOFF.get(attempt as usize - 1) else {
                return;
            };
            let wait = wait.mul_f64(self.options.backoff_scale.max(0.0));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                // A stopping engine makes no retry that is not yet due.
                () = stopping(&mut self.stopped) => return,
            }
        }
    }

    async fn record(&self, attempt: u32, outcome: deliver::Outcome) {
        let entry = Entry::Callback(CallbackLine {
            service: self.event.service.clone(),
            event: self.event.kind.clone(),
            event_id: self.event.id.clone(),
            target: self.webhook.authority.clone(),
            method: "POST".into(),
            path: self.webhook.path.clone(),
            query: self.webhook.query.clone(),
            status: outcome.status,
            error: outcome.error,
            duration_ms: u64::try_from(outcome.duration.as_millis()).unwrap_or(u64::MAX),
            attempt,
            origin: "twin".into(),
        });
        let ledger = Arc::clone(&self.options.ledger);
        match tokio::task::spawn_blocking(move || ledger.append(entry)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => warn!(error = %e, "cannot record a webhook delivery in the ledger"),
            Err(e) => warn!(error = %e, "recording a webhook delivery failed"),
        }
    }
}
