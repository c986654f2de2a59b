//! veris-proxy moves bytes and decides routes.
//!
//! The folders follow a connection through the proxy:
//!
//! - [`inbound`]: how connections arrive — the explicit listener, the
//!   transparent tier's redirected connections, the bytes that tell their
//!   protocol apart, TLS termination, the QUIC sink and the DNS stub;
//! - [`request`]: what happens to a request — routed, screened, forwarded to
//!   its twin, recorded;
//! - [`outbound`]: how veris dials out — its own dials, the upstream client,
//!   passthrough;
//! - [`body`]: the wrappers that count, meter and capture bodies;
//! - [`admin`]: the admin API, `/metrics` and the traffic summary;
//! - [`callback`]: webhook deliveries to the app, each attempt recorded;
//! - [`limit`]: a gateway sandbox's request and byte rates, and the lines
//!   that record their hits.
//!
//! This file holds the [`Proxy`] every connection shares and its wiring.
//!
//! The request lifecycle, in the order it happens (each phase in its stage's
//! module):
//!
//! 1. **accept** ([`inbound::explicit::serve`]): one task per client
//!    connection, HTTP/1.1 with upgrades. The transparent tier accepts
//!    kernel-redirected connections instead ([`inbound::transparent::serve`]):
//!    original destination, then the first bytes ([`inbound::sniff`]) decide —
//!    TLS (routed by SNI) joins phase 4, HTTP (and a `CONNECT` meant for
//!    another proxy) joins phase 2, anything else passes through to the
//!    original destination or is refused — all with `tier: transparent`.
//! 2. **peek** ([`Proxy::on_proxy_request`]): a `CONNECT host:port`, an
//!    absolute-form plain-HTTP request, or a request for the proxy itself
//!    (canary).
//! 3. **route** ([`request::route::Router`], per request [`Proxy::handle`]): a
//!    vendor service, the canary, loopback, an allowed host, or an unmapped
//!    one.
//! 4. **terminate or tunnel** ([`Proxy::connect`]): vendor and canary hosts
//!    (and, in strict mode, unmapped hosts so they can be refused in words) get
//!    TLS with a leaf minted for the name the client asked for
//!    ([`Proxy::terminate`], [`inbound::tls`]); the rest is a byte tunnel to
//!    the real destination ([`Proxy::tunnel`], [`outbound::passthrough`]).
//! 5. **screen** ([`Proxy::screen`], [`request::screen`]): each request inside
//!    is routed again by path; a vendor path that would reach the twin's
//!    control surface (`/veris/…`) or carries dot-segments (in any encoding,
//!    [`request::reserved::classify`]) is answered by the proxy and recorded as
//!    `reserved_path`, never forwarded.
//! 6. **forward** ([`Proxy::forward`], [`request::forward`]): the request goes
//!    to the service's twin upstream, bodies streamed both ways. The exchange
//!    runs in the client connection's task while the client waits, and moves
//!    to a tracked task of its own only when the client hangs up, so that
//!    does not cancel it ([`Proxy::exchange`]).
//! 7. **record** (inside 6, and at tunnel close; [`request::record`]): one
//!    ledger [`veris_receipt::Entry`] per decision, written before the
//!    response head reaches the client (with `client_gone` when the client
//!    left before the twin answered); if it cannot be written the client gets
//!    `503 veris_ledger_unavailable` instead of an unrecorded answer.
#![forbid(unsafe_code)]

pub mod admin;
pub mod body;
pub mod callback;
pub mod canary;
pub mod catalog;
pub mod config;
pub mod inbound;
pub mod limit;
pub mod outbound;
pub mod request;
pub mod scope;
mod sys;

use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::warn;
use veris_ca::Issuer;
use veris_receipt::{ListenerTier, Mode};

use crate::admin::{metrics, summary};
use crate::body::capture;
use crate::inbound::tls;
use crate::outbound::dial;
use crate::outbound::dial::Resolve;
use crate::outbound::upstream::Upstream;
use crate::request::recorder::{Recorder, Unrecorded};
use crate::request::route::Router;

pub use crate::config::{ConfigError, Settings};

/// Who this proxy is: what the canary answers and the session line records.
#[derive(Debug, Clone)]
pub struct Identity {
    pub run_id: String,
    pub sandbox_id: String,
    pub canary: String,
    pub mode: Mode,
    pub tier: ListenerTier,
}

/// Everything the proxy needs besides its listener, CA issuer and recorder.
pub struct ProxyOptions {
    pub router: Router,
    pub identity: Identity,
    /// Twin base URL, probed for h2c at start.
    pub twin_base: String,
    /// Bearer value sent to the twin as `Authorization` (the client's own
    /// `Authorization` then travels as `X-Veris-Original-Authorization`).
    pub twin_auth: Option<String>,
    /// The pooled clients to the twin and for passthrough: one per proxy
    /// (`Arc::new(Upstream::new(options))`), or one a gateway's sandboxes
    /// share (their root stores, TLS session caches and pooled connections
    /// to the twin, which each sandbox's own would hold for nothing).
    pub upstream: Arc<Upstream>,
    /// How long in-flight requests may run after shutdown is asked for.
    pub grace: Duration,
    /// Client timeouts and the connection cap.
    pub limits: Limits,
    /// Body capture for `veris har --bodies` (`--capture-bodies`); off when `None`.
    pub capture: Option<Arc<capture::Capture>>,
}

/// How long a client may take, and how many may be connected at once: one
/// slow or idle client must not hold what the others need (file
/// descriptors, memory, the admin API's reachability).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A TLS handshake with a client (after CONNECT or a redirect). Running
    /// out is not a refusal of our certificate: nothing is recorded.
    pub handshake: Duration,
    /// A request head, from the first byte the connection waits for; this
    /// also ends an idle HTTP/1 keep-alive connection between requests. For
    /// HTTP/2 it is the keep-alive ping's interval and deadline.
    pub request_head: Duration,
    /// Client connections open at once, over every listener; more are
    /// closed as soon as they are accepted.
    pub max_connections: usize,
    /// A gateway sandbox's requests (and tunnel opens) a second, with a
    /// second's worth as a burst; 0 is unlimited ([`limit`]).
    pub max_rps: u32,
    /// A gateway sandbox's bytes a second, both directions of every
    /// connection together; 0 is unlimited ([`limit::throttle`]).
    pub max_bytes_per_sec: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            handshake: Duration::from_secs(10),
            request_head: Duration::from_secs(30),
            max_connections: 4096,
            max_rps: 0,
            max_bytes_per_sec: 0,
        }
    }
}

/// The running proxy, shared by every connection task.
pub struct Proxy {
    router: Router,
    identity: Identity,
    twin_base: String,
    twin_auth: Option<HeaderValue>,
    upstream: Arc<Upstream>,
    connect_timeout: Duration,
    grace: Duration,
    issuer: Arc<Issuer>,
    recorder: Arc<dyn Recorder>,
    /// Resolves allowed names in strict mode, to check them against the
    /// address a redirected connection was headed to.
    resolve: Resolve,
    tasks: TaskTracker,
    cancel: CancellationToken,
    /// Every exchange with the twin not yet recorded, wherever it runs
    /// (a connection's task or a detached one of its own).
    exchanges: TaskTracker,
    /// Cancelled when the grace period ran out: exchanges still waiting (on
    /// a client's body, or on the twin) stop and record that they did.
    abandon: CancellationToken,
    limits: Limits,
    /// One permit per open client connection ([`Limits::max_connections`]).
    connections: Arc<tokio::sync::Semaphore>,
    /// When the last "too many connections" warning was logged (Unix secs).
    refused_warned: std::sync::atomic::AtomicU64,
    /// When a gateway sandbox's canary probe was last recorded (Unix secs).
    canary_recorded: std::sync::atomic::AtomicU64,
    /// A gateway sandbox's rate limits and the lines of every limit's hits.
    limiter: Arc<limit::Limiter>,
    /// Counts for the periodic `info` line (the per-request one is `debug`).
    summary: summary::Summary,
    /// Counts for `/metrics` (atomics; the rest is read when scraped).
    stats: Arc<metrics::Stats>,
    /// One server config per minted leaf, sharing a ticket key.
    tls: tls::ServerConfigs,
    /// Tees vendor request and response bodies into the capture dir.
    capture: Option<Arc<capture::Capture>>,
    /// Requests sent to the twin whose line could not be written.
    unrecorded: Arc<Unrecorded>,
}

impl Proxy {
    pub fn new(
        options: ProxyOptions,
        issuer: Arc<Issuer>,
        recorder: Arc<dyn Recorder>,
    ) -> Arc<Proxy> {
        Proxy::with_resolver(options, issuer, recorder, dial::system_resolver())
    }

    /// [`Proxy::new`] with the name resolution of its own choosing (tests).
    pub(crate) fn with_resolver(
        options: ProxyOptions,
        issuer: Arc<Issuer>,
        recorder: Arc<dyn Recorder>,
        resolve: Resolve,
    ) -> Arc<Proxy> {
        let connect_timeout = options.upstream.connect_timeout();
        let stats = Arc::new(metrics::Stats::new(options.router.services().len()));
        let (tasks, cancel) = (TaskTracker::new(), CancellationToken::new());
        let limiter = limit::Limiter::new(
            options.limits,
            recorder.clone(),
            tasks.clone(),
            cancel.clone(),
            options.identity.sandbox_id.clone(),
        );
        Arc::new(Proxy {
            router: options.router,
            identity: options.identity,
            twin_base: options.twin_base,
            twin_auth: options
                .twin_auth
                .and_then(|v| HeaderValue::from_str(&format!("Bearer {v}")).ok())
                .map(|mut v| {
                    v.set_sensitive(true);
                    v
                }),
            upstream: options.upstream,
            connect_timeout,
            grace: options.grace,
            issuer,
            recorder,
            resolve,
            tasks,
            cancel,
            exchanges: TaskTracker::new(),
            abandon: CancellationToken::new(),
            limits: options.limits,
            connections: Arc::new(tokio::sync::Semaphore::new(options.limits.max_connections)),
            refused_warned: std::sync::atomic::AtomicU64::new(0),
            canary_recorded: std::sync::atomic::AtomicU64::new(0),
            limiter,
            summary: summary::Summary::default(),
            stats,
            tls: tls::ServerConfigs::new(Issuer::DEFAULT_CAPACITY),
            capture: options.capture,
            unrecorded: Arc::default(),
        })
    }

    /// Shutdown, once no listener accepts: in-flight requests and tunnels
    /// get the grace period; then every exchange with the twin still
    /// waiting (on a client's body that never ends, or on the twin) stops
    /// and records an `upstream_error` line, so nothing the twin may have
    /// executed goes unrecorded. Returns when those lines are in (bounded).
    pub(crate) async fn drain(&self) {
        self.cancel.cancel();
        self.tasks.close();
        self.exchanges.close();
        if tokio::time::timeout(self.grace, self.tasks.wait())
            .await
            .is_err()
        {
            warn!(
                open = self.tasks.len(),
                "connections still open after the shutdown grace period; closing them"
            );
        }
        self.abandon.cancel();
        if tokio::time::timeout(Duration::from_secs(5), self.exchanges.wait())
            .await
            .is_err()
        {
            warn!(
                open = self.exchanges.len(),
                "requests to the twin still unrecorded after the shutdown"
            );
        }
    }

    /// A permit for one more client connection, or `None` (logged at most
    /// once a second) when [`Limits::max_connections`] are open: the caller
    /// closes the new one, and those already open go on undisturbed.
    pub(crate) fn admit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        use std::sync::atomic::Ordering;
        let permit = self.connections.clone().try_acquire_owned().ok();
        if permit.is_none() {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            if self.refused_warned.swap(now, Ordering::Relaxed) != now {
                warn!(
                    max = self.limits.max_connections,
                    "too many client connections open; closing new ones until some end. Next: raise --max-connections (and the open-file limit)"
                );
            }
        }
        permit
    }

    /// The tier a request sent to this proxy as a proxy names in its
    /// lines: the gateway's for a sandbox's proxy, else the explicit tier.
    pub(crate) fn proxy_tier(&self) -> ListenerTier {
        match self.identity.tier {
            ListenerTier::Gateway => ListenerTier::Gateway,
            _ => ListenerTier::Explicit,
        }
    }

    /// Stops this proxy's connections as [`inbound::explicit::serve`] does
    /// when its listener closes: in-flight requests get the grace period and
    /// every exchange still waiting is recorded (a gateway's sandboxes,
    /// whose connections arrive on a listener the proxy does not own).
    pub async fn shutdown(&self) {
        self.summary.flush();
        self.drain().await;
    }

    /// Its limits, as configured.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub(crate) fn limiter(&self) -> &Arc<limit::Limiter> {
        &self.limiter
    }

    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Requests sent to the twin whose ledger line could not be written.
    pub fn unrecorded(&self) -> &Arc<Unrecorded> {
        &self.unrecorded
    }

    /// What this proxy counted per request, for `/metrics`.
    pub fn stats(&self) -> &Arc<metrics::Stats> {
        &self.stats
    }

    /// Client connections open now, over every listener: the permits of
    /// the connection cap that are handed out.
    pub fn open_connections(&self) -> usize {
        self.limits
            .max_connections
            .saturating_sub(self.connections.available_permits())
    }

    pub fn router(&self) -> &Router {
        &self.router
    }

    /// Probes the twin for HTTP/2 with prior knowledge; later requests use it if so.
    pub async fn probe_twin(&self) -> bool {
        self.upstream.probe_h2c(&self.twin_base).await
    }
}
