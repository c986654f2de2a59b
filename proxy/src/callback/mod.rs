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
//! Besides the twin's events, the engine delivers what the admin API asks
//! for ([`control`]: `veris trigger`, `veris replay`) and puts the faults
//! of `--webhook-faults` on deliveries ([`faults`]); each line says its
//! origin and fault.
//!
//! For an external twin, which makes and signs its own events, the
//! [`ingress`] forwards each delivery it is given (with its token) the same
//! way, once, and records it with origin `ingress`.
//!
//! Events the twin could not queue (the queue full: a workload making
//! objects faster than the app takes their deliveries) are counted by the
//! sink and put on record as `callback_dropped` lines, at most one a
//! second per service and one more before the engine stops, so a receipt
//! never reads as if every event was delivered.
//!
//! Only this engine and the ingress write `callback` lines: nothing a
//! workload sends (a request to its own app, a header that looks like a
//! callback) can become one.

pub mod control;
pub mod deliver;
pub mod dial;
pub mod faults;
pub mod ingress;
pub mod target;
pub mod tls;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::warn;
use veris_receipt::entry::CallbackDroppedLine;
use veris_receipt::ledger::Ledger;
use veris_receipt::{CallbackLine, Entry};
use veris_twin::webhook::{Dropped, Event, Secret};
use veris_twin::Twin;

pub use control::{Control, Origin, Queued, Refusal};
use control::{Job, Recent};
pub use deliver::Reach;
pub use dial::{Dialer, SocketSource};
pub use faults::Faults;
pub use ingress::Ingress;
pub use target::Webhook;
pub use tls::WebhookTls;

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

/// Events whose deliveries (to every URL, retries included) are under way
/// at once; past it the engine stops taking events, the twin's queue fills
/// and new events are dropped (and counted) rather than growing memory
/// without bound.
pub const PENDING: usize = 4096;

/// The least time between two `callback_dropped` lines.
const DROP_LINE_EVERY: Duration = Duration::from_secs(1);

/// Attempts in flight at once.
const CONCURRENT: usize = 32;

/// On-demand deliveries (trigger, replay) waiting to be taken at most.
const ON_DEMAND: usize = 64;

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
    /// `--webhook-faults`.
    pub faults: Faults,
    /// Renders `veris trigger`'s fixture events (the built-in twin).
    pub twin: Option<Arc<Twin>>,
    /// How attempts reach the app (the host's network, or an isolated
    /// run's namespace; TLS for `https://`).
    pub reach: Reach,
    /// Events under way at most ([`PENDING`]).
    pub pending: usize,
    /// The drops of the sink `events` comes from, put on record.
    pub dropped: Option<Arc<Dropped>>,
}

/// A running delivery engine.
pub struct Engine {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    control: Control,
}

impl Engine {
    /// Starts delivering the events `events` yields, and those asked for
    /// through [`Engine::control`].
    pub fn start(events: mpsc::Receiver<Event>, options: EngineOptions) -> Engine {
        let (stop, stopped) = watch::channel(false);
        let (jobs, on_demand) = mpsc::channel(ON_DEMAND);
        let recent = Arc::new(Mutex::new(Recent::default()));
        let control = Control {
            jobs,
            recent: Arc::clone(&recent),
            webhooks: options.webhooks.clone(),
            twin: options.twin.clone(),
        };
        let wrong_key = if options.faults.bad_signature {
            match Secret::generate() {
                Ok(k) => Some(k),
                // Without a random source no secret would have been made
                // either; sign with a fixed wrong key rather than the right one.
                Err(_) => Some(Secret::from_text("whsec_veris_bad_signature")),
            }
        } else {
            None
        };
        let engine = Run {
            options: Arc::new(options),
            recent,
            wrong_key,
        };
        let task = tokio::spawn(engine.run(events, on_demand, stopped));
        Engine {
            stop,
            task,
            control,
        }
    }

    /// The handle that asks for deliveries on demand (the admin API's).
    pub fn control(&self) -> Control {
        self.control.clone()
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

/// The engine's task: takes events, holds them for `reorder`, and starts
/// one [`Delivery`] per event and URL (two with `duplicate`).
struct Run {
    options: Arc<EngineOptions>,
    recent: Arc<Mutex<Recent>>,
    /// `bad-signature`'s key: not the app's secret.
    wrong_key: Option<Secret>,
}

impl Run {
    async fn run(
        self,
        mut events: mpsc::Receiver<Event>,
        mut on_demand: mpsc::Receiver<Job>,
        mut stopped: watch::Receiver<bool>,
    ) {
        let pending = Arc::new(Semaphore::new(self.options.pending.max(1)));
        let attempts = Arc::new(Semaphore::new(CONCURRENT));
        let mut deliveries = JoinSet::new();
        // `reorder`'s hold: events in order of creation, sent newest first.
        let mut held: Vec<Held> = Vec::new();
        let mut hold_until = tokio::time::Instant::now();
        let mut twin_open = true;
        // The permit the next event takes: none while `pending` are under way.
        let mut permit: Option<OwnedSemaphorePermit> = None;
        let mut drops = DropLines::default();
        let no_drops = Arc::new(Dropped::default());
        let dropped = Arc::clone(self.options.dropped.as_ref().unwrap_or(&no_drops));
        loop {
            let holding = !held.is_empty();
            let ready = permit.is_some();
            let next = tokio::select! {
                p = Arc::clone(&pending).acquire_owned(), if !ready => {
                    permit = p.ok();
                    continue;
                }
                e = events.recv(), if twin_open && ready => match e {
                    Some(event) => Some(Job { event: Arc::new(event), origin: Origin::Twin }),
                    // The twin is gone: on-demand jobs still come.
                    None => {
                        twin_open = false;
                        continue;
                    }
                },
                // `None` only once the engine itself is dropped: a stop.
                j = on_demand.recv(), if ready => j,
                () = tokio::time::sleep_until(hold_until), if holding => {
                    self.dispatch_held(&mut held, &mut deliveries, &attempts, &stopped);
                    continue;
                }
                () = dropped.wait(), if drops.due.is_none() => {
                    drops.due = Some(drops.next_line());
                    continue;
                }
                () = sleep_until_due(drops.due) => {
                    drops.write(&dropped, &self.options.ledger).await;
                    continue;
                }
                () = stopping(&mut stopped) => None,
            };
            let last = next.is_none();
            let mut jobs: Vec<(Job, Option<Arc<OwnedSemaphorePermit>>)> = Vec::new();
            match next {
                Some(job) => jobs.push((job, permit.take().map(Arc::new))),
                // What was queued before the stop is still delivered (once).
                None => {
                    events.close();
                    on_demand.close();
                    while let Some(e) = events.recv().await {
                        let event = Arc::new(e);
                        jobs.push((
                            Job {
                                event,
                                origin: Origin::Twin,
                            },
                            None,
                        ));
                    }
                    while let Some(j) = on_demand.recv().await {
                        jobs.push((j, None));
                    }
                }
            }
            for (job, permit) in jobs {
                if job.origin != Origin::Replay {
                    self.recent
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .keep(&job.event);
                }
                if self.options.faults.reorder {
                    if held.is_empty() {
                        hold_until = tokio::time::Instant::now() + faults::REORDER_HOLD;
                    }
                    held.push((job, permit));
                    if held.len() >= faults::REORDER_BATCH {
                        self.dispatch_held(&mut held, &mut deliveries, &attempts, &stopped);
                    }
                } else {
                    self.dispatch(job, permit, &mut deliveries, &attempts, &stopped);
                }
            }
            if last {
                break;
            }
            // Finished deliveries are reaped as we go (their results are unit).
            while deliveries.try_join_next().is_some() {}
        }
        self.dispatch_held(&mut held, &mut deliveries, &attempts, &stopped);
        // Every drop so far is on record before the final seal.
        drops.write(&dropped, &self.options.ledger).await;
        while deliveries.join_next().await.is_some() {}
    }

    /// Sends what `reorder` holds, newest first: each event's first
    /// attempts are answered (or fail) before the next event is sent, so
    /// the app sees them in that order; retries run on their own.
    fn dispatch_held(
        &self,
        held: &mut Vec<Held>,
        deliveries: &mut JoinSet<()>,
        attempts: &Arc<Semaphore>,
        stopped: &watch::Receiver<bool>,
    ) {
        if held.is_empty() {
            return;
        }
        let batch: Vec<Vec<Delivery>> = held
            .drain(..)
            .rev()
            .map(|(job, permit)| self.deliveries_of(&job, permit, attempts, stopped))
            .collect();
        deliveries.spawn(async move {
            let mut running = JoinSet::new();
            for group in batch {
                let mut firsts = Vec::new();
                for mut delivery in group {
                    let (done, first) = oneshot::channel();
                    delivery.first_done = Some(done);
                    firsts.push(first);
                    running.spawn(delivery.run());
                }
                for first in firsts {
                    let _ = first.await;
                }
            }
            while running.join_next().await.is_some() {}
        });
    }

    /// Starts the deliveries of one event.
    fn dispatch(
        &self,
        job: Job,
        permit: Option<Arc<OwnedSemaphorePermit>>,
        deliveries: &mut JoinSet<()>,
        attempts: &Arc<Semaphore>,
        stopped: &watch::Receiver<bool>,
    ) {
        for delivery in self.deliveries_of(&job, permit, attempts, stopped) {
            deliveries.spawn(delivery.run());
        }
    }

    /// One delivery per URL of the event's service, and a marked second
    /// one each with `duplicate`; each holds the event's `permit` until it
    /// ends.
    fn deliveries_of(
        &self,
        job: &Job,
        permit: Option<Arc<OwnedSemaphorePermit>>,
        attempts: &Arc<Semaphore>,
        stopped: &watch::Receiver<bool>,
    ) -> Vec<Delivery> {
        let faults = &self.options.faults;
        let copies: &[bool] = if faults.duplicate {
            &[false, true]
        } else {
            &[false]
        };
        let mut out = Vec::new();
        for webhook in self
            .options
            .webhooks
            .iter()
            .filter(|w| w.service == job.event.service)
        {
            for &copy in copies {
                out.push(Delivery {
                    webhook: webhook.clone(),
                    event: Arc::clone(&job.event),
                    origin: job.origin,
                    fault: faults.label(copy),
                    wrong_key: self.wrong_key.clone(),
                    options: Arc::clone(&self.options),
                    attempts: Arc::clone(attempts),
                    stopped: stopped.clone(),
                    first_done: None,
                    _pending: permit.clone(),
                });
            }
        }
        out
    }
}

/// A job `reorder` holds, with its [`PENDING`] permit.
type Held = (Job, Option<Arc<OwnedSemaphorePermit>>);

/// When `callback_dropped` lines are written: one a second at most.
#[derive(Default)]
struct DropLines {
    /// When the last lines were written.
    last: Option<tokio::time::Instant>,
    /// When the next are due (drops were counted since).
    due: Option<tokio::time::Instant>,
}

impl DropLines {
    /// Now after a quiet second, else a second after the last lines.
    fn next_line(&self) -> tokio::time::Instant {
        let now = tokio::time::Instant::now();
        self.last
            .map_or(now, |last| (last + DROP_LINE_EVERY).max(now))
    }

    /// One line per service with the drops counted since the last.
    async fn write(&mut self, dropped: &Dropped, ledger: &Arc<Ledger>) {
        self.due = None;
        let counts = dropped.take();
        if counts.is_empty() {
            return;
        }
        self.last = Some(tokio::time::Instant::now());
        for (service, events) in counts {
            warn!(%service, events, "webhook events dropped: the delivery queue was full");
            let entry = Entry::CallbackDropped(CallbackDroppedLine {
                service,
                events,
                reason: "queue_full".into(),
            });
            append(ledger, entry).await;
        }
    }
}

/// Resolves at `due`, never without one.
async fn sleep_until_due(due: Option<tokio::time::Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Resolves once the engine is told to stop.
async fn stopping(stopped: &mut watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}

/// One event to one URL, attempts and retries.
struct Delivery {
    webhook: Webhook,
    event: Arc<Event>,
    origin: Origin,
    /// The line's `fault`, when `--webhook-faults` touched this delivery.
    fault: Option<String>,
    wrong_key: Option<Secret>,
    options: Arc<EngineOptions>,
    attempts: Arc<Semaphore>,
    stopped: watch::Receiver<bool>,
    /// Told once the first attempt is recorded (`reorder`'s sequencing).
    first_done: Option<oneshot::Sender<()>>,
    /// The event's [`PENDING`] permit, shared by its deliveries.
    _pending: Option<Arc<OwnedSemaphorePermit>>,
}

impl Delivery {
    async fn run(mut self) {
        let faults = &self.options.faults;
        let right: &[Secret] = self
            .options
            .secrets
            .iter()
            .find(|(s, _)| *s == self.event.service)
            .map_or(&[], |(_, v)| v.as_slice());
        let secrets: &[Secret] = match &self.wrong_key {
            Some(wrong) => std::slice::from_ref(wrong),
            None => right,
        };
        let backdate = if faults.stale_signature {
            faults::STALE_BY
        } else {
            Duration::ZERO
        };
        if let Some(delay) = faults.delay {
            let wait = delay.mul_f64(self.options.backoff_scale.max(0.0));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                // A stopping engine delivers what it holds now, still marked.
                () = stopping(&mut self.stopped) => {}
            }
        }
        for attempt in 1..=(BACKOFF.len() as u32 + 1) {
            let outcome = {
                let Ok(_permit) = self.attempts.acquire().await else {
                    return;
                };
                let started = std::time::Instant::now();
                let mut stopped = self.stopped.clone();
                tokio::select! {
                    o = deliver::attempt(
                        &self.options.reach,
                        &self.webhook,
                        &self.event,
                        secrets,
                        backdate,
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
            if let Some(done) = self.first_done.take() {
                let _ = done.send(());
            }
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
            duration_us: Some(u64::try_from(outcome.duration.as_micros()).unwrap_or(u64::MAX)),
            attempt,
            origin: self.origin.as_str().into(),
            fault: self.fault.clone(),
            tls: self.webhook.tls,
        });
        append(&self.options.ledger, entry).await;
    }
}

/// Appends a `callback` line off the async threads (a failure is logged:
/// the delivery happened either way).
async fn append(ledger: &Arc<Ledger>, entry: Entry) {
    let ledger = Arc::clone(ledger);
    match tokio::task::spawn_blocking(move || ledger.append(entry)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => warn!(error = %e, "cannot record a webhook delivery in the ledger"),
        Err(e) => warn!(error = %e, "recording a webhook delivery failed"),
    }
}
