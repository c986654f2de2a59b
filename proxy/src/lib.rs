//! veris-proxy moves bytes and decides routes.
//!
//! The request lifecycle, in the order it happens (each phase is one function
//! in this file):
//!
//! 1. **accept** ([`serve`]): one task per client connection, HTTP/1.1 with upgrades.
//!    The transparent tier accepts kernel-redirected connections instead
//!    ([`transparent::serve`]): original destination, then the first bytes
//!    ([`sniff`]) decide — TLS (routed by SNI) joins phase 4, HTTP (and a
//!    `CONNECT` meant for another proxy) joins phase 2, anything else passes
//!    through to the original destination or is refused — all with
//!    `tier: transparent`.
//! 2. **peek** ([`Proxy::on_proxy_request`]): a `CONNECT host:port`, an absolute-form
//!    plain-HTTP request, or a request for the proxy itself (canary).
//! 3. **route** ([`route::Router`]): a vendor service, the canary, loopback, an
//!    allowed host, or an unmapped one.
//! 4. **terminate or tunnel** ([`Proxy::connect`]): vendor and canary hosts (and, in
//!    strict mode, unmapped hosts so they can be refused in words) get TLS with a
//!    leaf minted for the name the client asked for ([`Proxy::terminate`]); the
//!    rest is a byte tunnel to the real destination ([`Proxy::tunnel`]).
//! 5. **screen** ([`Proxy::screen`]): each request inside is routed again by path;
//!    a vendor path that would reach the twin's control surface (`/veris/…`) or
//!    carries dot-segments (in any encoding, [`reserved::classify`]) is answered by
//!    the proxy and recorded as `reserved_path`, never forwarded.
//! 6. **forward** ([`Proxy::forward`]): the request goes to the service's twin
//!    upstream, bodies streamed both ways. The exchange runs in a tracked task of its
//!    own, so a client hanging up does not cancel it ([`Proxy::exchange`]).
//! 7. **record** (inside 6, and at tunnel close): one ledger [`Entry`] per decision,
//!    written before the response head reaches the client (with `client_gone` when
//!    the client left before the twin answered); if it cannot be written the client
//!    gets `503 veris_ledger_unavailable` instead of an unrecorded answer.
// `deny`, not `forbid`: the `sys` module alone allows the syscalls it needs.
#![deny(unsafe_code)]

pub mod admin;
pub mod body;
pub mod canary;
pub mod capture;
pub mod catalog;
pub mod clienthello;
pub mod config;
pub mod dial;
pub mod dns;
pub mod meter;
pub mod metrics;
pub mod quic;
pub mod recorder;
pub mod reserved;
pub mod respond;
pub mod route;
pub mod sniff;
pub mod summary;
mod sys;
pub mod tls;
pub mod transparent;
pub mod trust;
pub mod upstream;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use http::{header, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::LazyConfigAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, debug_span, info, info_span, warn, Instrument, Span};
use veris_ca::Issuer;
use veris_receipt::capture::Side;
use veris_receipt::{redact, Entry, ListenerTier, Mode};
use veris_receipt::{
    BlockedLine, PassthroughLine, ReservedPathLine, ResponseIncompleteLine, TunnelCloseLine,
    UpstreamErrorLine,
};

use crate::body::{Counted, ProxyBody, Tally};
use crate::dial::Resolve;
use crate::recorder::{RecordError, Recorder, Unrecorded};
use crate::reserved::PathClass;
use crate::route::{normalize_host, Route, Router, Service};
use crate::upstream::{
    display_origin, is_websocket, strip_hop_by_hop, Upstream, UpstreamError, UpstreamOptions,
};

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
    pub upstream: UpstreamOptions,
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
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            handshake: Duration::from_secs(10),
            request_head: Duration::from_secs(30),
            max_connections: 4096,
        }
    }
}

/// The running proxy, shared by every connection task.
pub struct Proxy {
    router: Router,
    identity: Identity,
    twin_base: String,
    twin_auth: Option<HeaderValue>,
    upstream: Upstream,
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

/// Request headers worth keeping in the ledger (values redacted by its writer).
const RECORDED_HEADERS: [HeaderName; 8] = [
    HeaderName::from_static("content-type"),
    HeaderName::from_static("content-length"),
    HeaderName::from_static("user-agent"),
    HeaderName::from_static("accept"),
    HeaderName::from_static("idempotency-key"),
    HeaderName::from_static("stripe-version"),
    HeaderName::from_static("stripe-account"),
    HeaderName::from_static("authorization"),
];

/// Where a request arrived from: the host it was for and how.
#[derive(Debug, Clone)]
struct Leg {
    host: String,
    port: u16,
    tls: bool,
    tier: ListenerTier,
    /// Transparent tier: the address the client dialed (`SO_ORIGINAL_DST`).
    /// A passthrough goes there, never to a lookup of `host`.
    origin: Option<SocketAddr>,
    /// Transparent tier: `host` is the TLS SNI, and each request's Host must agree.
    sni_host: bool,
    /// Transparent tier: a `CONNECT` the client sent to this address (a
    /// proxy outside veris). The leg then dials `host` as the explicit tier
    /// does, and its refusals name this address as their destination.
    via: Option<SocketAddr>,
}

impl Leg {
    /// Where the client's bytes were headed, for blocked lines.
    fn headed_to(&self) -> Option<String> {
        self.origin.or(self.via).map(|a| a.to_string())
    }
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
        let connect_timeout = options.upstream.connect_timeout;
        let stats = Arc::new(metrics::Stats::new(options.router.services().len()));
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
            upstream: Upstream::new(options.upstream),
            connect_timeout,
            grace: options.grace,
            issuer,
            recorder,
            resolve,
            tasks: TaskTracker::new(),
            cancel: CancellationToken::new(),
            exchanges: TaskTracker::new(),
            abandon: CancellationToken::new(),
            limits: options.limits,
            connections: Arc::new(tokio::sync::Semaphore::new(options.limits.max_connections)),
            refused_warned: std::sync::atomic::AtomicU64::new(0),
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

    /// Phase 2: what kind of request reached the proxy port.
    async fn on_proxy_request(
        self: Arc<Self>,
        req: Request<Incoming>,
        peer: SocketAddr,
    ) -> Response<ProxyBody> {
        if req.method() == Method::CONNECT {
            return self.connect(req, peer, None).await;
        }
        if let Some(authority) = req.uri().authority().cloned() {
            // Absolute-form plain HTTP (`GET http://host/path`); a port that
            // is there but not 1..=65535 is refused, never taken for 80.
            let after_host = authority
                .as_str()
                .rsplit_once(']')
                .map_or(authority.as_str(), |(_, rest)| rest);
            let port = if after_host.contains(':') {
                authority.port_u16().filter(|p| *p != 0)
            } else {
                Some(80)
            };
            let host = normalize_host(authority.host());
            let (Some(port), false) = (port, host.is_empty()) else {
                return respond::error(
                    StatusCode::BAD_REQUEST,
                    "veris_bad_request_target",
                    format!(
                        "{} {} has no valid host and port. Next: send http://host[:port]/path with a port from 1 to 65535",
                        req.method(),
                        redact::url(&req.uri().to_string())
                    ),
                    json!({}),
                );
            };
            let leg = Leg {
                host,
                port,
                tls: false,
                tier: ListenerTier::Explicit,
                origin: None,
                sni_host: false,
                via: None,
            };
            return self.handle(req, Arc::new(leg)).await;
        }
        if self.router.route("", req.uri().path()) == Route::Canary {
            return self.canary();
        }
        respond::error(
            StatusCode::BAD_REQUEST,
            "veris_not_a_proxy_request",
            "this is the veris interception proxy; send requests through it as an HTTP proxy"
                .into(),
            json!({"remedy": ["set HTTPS_PROXY/HTTP_PROXY to this address, or use `veris run -- CMD`"]}),
        )
    }

    /// Phase 4: decide terminate or tunnel for a `CONNECT`. `via` is set in
    /// the transparent tier: the client sent its `CONNECT` to that address,
    /// a proxy outside veris, and is handled as if it had asked veris.
    async fn connect(
        self: Arc<Self>,
        mut req: Request<Incoming>,
        peer: SocketAddr,
        via: Option<SocketAddr>,
    ) -> Response<ProxyBody> {
        let Some(authority) = req.uri().authority().cloned() else {
            return respond::error(
                StatusCode::BAD_REQUEST,
                "veris_bad_connect",
                "CONNECT needs host:port".into(),
                json!({}),
            );
        };
        // `host:99999`, `host:abc`, `host:` or no port: never dialed as 443.
        let port = authority
            .port_u16()
            .filter(|p| *p != 0 && !normalize_host(authority.host()).is_empty());
        let Some(port) = port else {
            return respond::error(
                StatusCode::BAD_REQUEST,
                "veris_bad_connect",
                format!(
                    "CONNECT {authority} has no valid host and port. Next: send CONNECT host:port with a port from 1 to 65535"
                ),
                json!({}),
            );
        };
        let leg = Leg {
            host: normalize_host(authority.host()),
            port,
            tls: true,
            tier: match via {
                Some(_) => ListenerTier::Transparent,
                None => ListenerTier::Explicit,
            },
            origin: None,
            sni_host: false,
            via,
        };
        if let Some(via) = via {
            info!(host = %leg.host, port = leg.port, %via, "a CONNECT meant for another proxy; handled as veris's own");
        }
        let route = self.router.route_connection(&leg.host);
        if route == Route::Loopback && dial::isolated() {
            return self
                .refuse_host_loopback(&leg, Some("CONNECT".into()), None)
                .await;
        }
        let passthrough_reason = match route {
            Route::Service(_) | Route::Canary => None,
            Route::Loopback => Some("loopback"),
            Route::Allowed => Some("allow_passthrough"),
            Route::Unmapped if self.identity.mode == Mode::Passthrough => Some("mode"),
            // Strict: terminate anyway so the refusal reaches the client as words, not a reset.
            Route::Unmapped => None,
        };
        let on_upgrade = hyper::upgrade::on(&mut req);
        match passthrough_reason {
            None => {
                let proxy = self.clone();
                // Per connection: `debug`, like the per-request span; the
                // `info` lines inside name the host themselves.
                let span = debug_span!("tls", host = %leg.host, %peer);
                self.tasks.spawn(
                    async move {
                        match on_upgrade.await {
                            Ok(upgraded) => proxy.terminate(TokioIo::new(upgraded), leg).await,
                            Err(e) => debug!(error = %e, "CONNECT upgrade failed"),
                        }
                    }
                    .instrument(span),
                );
                Response::new(body::empty())
            }
            Some(reason) => self.tunnel(on_upgrade, leg, reason).await,
        }
    }

    /// Strict mode: a `CONNECT` to a host no service routes is terminated
    /// only so its refusal reaches the client as words; a client that then
    /// speaks no TLS is refused all the same, and that refusal is recorded.
    async fn record_unmapped_without_tls(&self, leg: &Leg, why: &str) {
        if self.identity.mode != Mode::Strict
            || self.router.route_connection(&leg.host) != Route::Unmapped
        {
            return;
        }
        self.record_or_log(Entry::Blocked(BlockedLine {
            host: leg.host.clone(),
            port: leg.port,
            tier: leg.tier,
            method: Some("CONNECT".into()),
            path: None,
            reason: format!("strict mode: unmapped host, and {why}"),
            dst: leg.headed_to(),
        }))
        .await;
    }

    /// Phase 4a: TLS with a minted leaf, then HTTP/1.1 or HTTP/2 by ALPN.
    async fn terminate<IO>(self: Arc<Self>, io: IO, leg: Leg)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        // The handshake and the HTTP server each run in a future of their
        // own on the heap: an idle connection's task then holds the server
        // alone, not also the slots of the handshake's values (its task was
        // 11.8 KB with them inline, 4.6 KB boxed in place).
        let Some((tls, name)) = Box::pin(self.accept_tls(io, &leg)).await else {
            return;
        };
        // Plaintext bytes the client sent: none at all, and then its close,
        // is how a client that rejects our leaf after the handshake (GnuTLS)
        // leaves.
        let alpn = tls
            .get_ref()
            .1
            .alpn_protocol()
            .map(|p| String::from_utf8_lossy(p).into_owned());
        let (tls, meter) = meter::Metered::new(tls);
        let leg = Arc::new(leg);
        let proxy = self.clone();
        let served = leg.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            let proxy = proxy.clone();
            let leg = served.clone();
            async move { Ok::<_, Infallible>(proxy.handle(req, leg).await) }
        });
        let served = serve_auto(tls, service, &self.cancel, self.limits.request_head);
        if let Err(e) = Box::pin(served).await {
            debug!(error = %e, "intercepted connection ended with an error");
        }
        if meter.read() == 0 && meter.peer_closed() {
            self.record_tls_abandoned(&name, &leg, trust::Stage::NoRequest, None, alpn)
                .await;
        }
    }

    /// Phase 4a, first half: the client's ClientHello, a leaf for the name
    /// it will verify, the handshake. `None` (recorded where it says
    /// something) when the client sent no TLS, was too slow, or refused.
    async fn accept_tls<IO>(
        &self,
        io: IO,
        leg: &Leg,
    ) -> Option<(tokio_rustls::server::TlsStream<IO>, String)>
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let handshake = self.limits.handshake;
        let hello = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io);
        let start = match tokio::time::timeout(handshake, hello).await {
            Ok(Ok(start)) => start,
            Ok(Err(e)) => {
                info!(error = %e, host = %leg.host, "client sent no TLS ClientHello after CONNECT");
                self.record_unmapped_without_tls(leg, "it sent no TLS ClientHello")
                    .await;
                return None;
            }
            Err(_) => {
                info!(host = %leg.host, "no TLS ClientHello within {handshake:?}; closing");
                self.record_unmapped_without_tls(leg, "no TLS ClientHello came in time")
                    .await;
                return None;
            }
        };
        // Mint for the name the client will verify (SNI), else the CONNECT host.
        let name = start
            .client_hello()
            .server_name()
            .map(str::to_owned)
            .unwrap_or_else(|| leg.host.clone());
        let key = match self.issuer.certified_key(&name) {
            Ok(key) => key,
            Err(e) => {
                warn!(error = %e, host = %name, "cannot mint a leaf; closing the connection");
                return None;
            }
        };
        let config = self.tls.for_leaf(&name, key);
        match tokio::time::timeout(handshake, start.into_stream(config)).await {
            Ok(Ok(tls)) => Some((tls, name)),
            // A client too slow to finish is not one that refused our leaf.
            Err(_) => {
                info!(host = %name, "TLS handshake not finished within {handshake:?}; closing");
                None
            }
            Ok(Err(e)) => {
                info!(error = %e, host = %name, "TLS handshake with the client failed");
                // Our leaf was on its way: an alert naming it is a refusal,
                // a close or another alert only an abandoned handshake.
                if let Some(how) = trust::classify(&e) {
                    self.record_handshake_failure(&name, leg, how).await;
                }
                None
            }
        }
    }

    /// Phase 4b: a byte tunnel to the real destination, recorded (with the
    /// address the dial reached) when it closes.
    async fn tunnel(
        self: Arc<Self>,
        on_upgrade: hyper::upgrade::OnUpgrade,
        leg: Leg,
        reason: &'static str,
    ) -> Response<ProxyBody> {
        let started = Instant::now();
        let dial = tokio::time::timeout(
            self.connect_timeout,
            dial::connect_host_for_client(&leg.host, leg.port, self.upstream.upstream_proxy()),
        )
        .await;
        let mut origin = match dial {
            Ok(Ok(stream)) => stream,
            // Refused by policy (the host's loopback from an isolated run).
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return self
                    .refuse_host_loopback(&leg, Some("CONNECT".into()), None)
                    .await;
            }
            Ok(Err(e)) => {
                if let Some(chain) = dial::ChainError::find(&e) {
                    return self
                        .upstream_proxy_failed(&leg, reason, started, chain)
                        .await;
                }
                return self
                    .tunnel_failed(&leg, reason, started, e.to_string())
                    .await;
            }
            Err(_) => {
                let waited = format!("no answer within {:?}", self.connect_timeout);
                return self.tunnel_failed(&leg, reason, started, waited).await;
            }
        };
        let dst = origin.peer_addr().ok();
        // Recorded when it opens: a tunnel still open when the proxy stops
        // is in the ledger too; its `tunnel_close` line adds the bytes.
        let open = match self
            .record_passthrough(&leg, reason, dst, (0, 0), started)
            .await
        {
            Ok(seq) => seq,
            Err(e) => return ledger_unavailable(&e, "passthrough"),
        };
        let proxy = self.clone();
        let span = info_span!("tunnel", host = %leg.host, port = leg.port);
        self.tasks.spawn(
            async move {
                let (bytes, error) = match on_upgrade.await {
                    Ok(upgraded) => {
                        let (mut client, meter) = meter::Metered::new(TokioIo::new(upgraded));
                        let error = tokio::io::copy_bidirectional(&mut client, &mut origin)
                            .await
                            .err()
                            .map(|e| e.to_string());
                        ((meter.read(), meter.written()), error)
                    }
                    Err(e) => ((0, 0), Some(format!("CONNECT upgrade failed: {e}"))),
                };
                proxy.record_tunnel_close(open, bytes, started, error).await;
            }
            .instrument(span),
        );
        Response::new(body::empty())
    }

    /// The `tunnel_close` line of the tunnel whose `passthrough` line is `of`.
    pub(crate) async fn record_tunnel_close(
        &self,
        of: u64,
        (bytes_in, bytes_out): (u64, u64),
        started: Instant,
        error: Option<String>,
    ) {
        if let Some(e) = &error {
            debug!(error = %e, "tunnel closed with an error");
        }
        self.record_or_log(Entry::TunnelClose(TunnelCloseLine {
            of,
            bytes_in,
            bytes_out,
            duration_ms: started.elapsed().as_millis() as u64,
            error,
        }))
        .await;
    }

    async fn tunnel_failed(
        &self,
        leg: &Leg,
        reason: &str,
        started: Instant,
        error: String,
    ) -> Response<ProxyBody> {
        self.record_unreached(leg, reason, started, error.clone())
            .await;
        respond::error(
            StatusCode::BAD_GATEWAY,
            "veris_passthrough_unreachable",
            format!("cannot reach {}:{} ({error})", leg.host, leg.port),
            json!({"host": leg.host}),
        )
    }

    /// The upstream proxy (`--upstream-proxy`) could not give a passthrough
    /// its tunnel: the client gets a 502 that names the proxy and what it
    /// said, and the ledger a `passthrough` line (no destination reached)
    /// closed at once by a `tunnel_close` line carrying the same words.
    async fn upstream_proxy_failed(
        &self,
        leg: &Leg,
        reason: &str,
        started: Instant,
        chain: &dial::ChainError,
    ) -> Response<ProxyBody> {
        self.record_upstream_proxy_failure(leg, reason, started, chain)
            .await;
        let status = match &chain.failure {
            dial::ChainFailure::Refused { status, .. } => Some(*status),
            _ => None,
        };
        respond::error(
            StatusCode::BAD_GATEWAY,
            "veris_upstream_proxy_failed",
            format!(
                "{chain}. Next: check --upstream-proxy (address, credentials) and that it lets this host through"
            ),
            json!({"host": leg.host, "upstream_proxy": chain.proxy, "upstream_proxy_status": status}),
        )
    }

    /// What both tiers record when the upstream proxy failed a passthrough:
    /// a `passthrough` line with no destination (none was reached), closed
    /// at once by a `tunnel_close` line carrying what the proxy said.
    pub(crate) async fn record_upstream_proxy_failure(
        &self,
        leg: &Leg,
        reason: &str,
        started: Instant,
        chain: &dial::ChainError,
    ) {
        warn!(host = %leg.host, port = leg.port, error = %chain, "the upstream proxy failed a passthrough");
        self.record_unreached(leg, reason, started, chain.to_string())
            .await;
    }

    /// A passthrough whose dial never connected: a `passthrough` line with
    /// no destination (none was reached), closed at once by a
    /// `tunnel_close` line whose error says why and which addresses were
    /// dialed, so a failure never reads as a tunnel that worked.
    pub(crate) async fn record_unreached(
        &self,
        leg: &Leg,
        reason: &str,
        started: Instant,
        error: String,
    ) {
        if let Ok(open) = self
            .record_passthrough(leg, reason, None, (0, 0), started)
            .await
        {
            self.record_tunnel_close(open, (0, 0), started, Some(error))
                .await;
        }
    }

    /// Records a passthrough: the name the client gave (`leg.host`) beside
    /// `dst`, the address actually dialed (DESIGN §7a.11; `None` when no
    /// dial connected), and the bytes `(in, out)` moved.
    async fn record_passthrough(
        &self,
        leg: &Leg,
        reason: &str,
        dst: Option<SocketAddr>,
        (bytes_in, bytes_out): (u64, u64),
        started: Instant,
    ) -> Result<u64, RecordError> {
        let entry = Entry::Passthrough(PassthroughLine {
            host: leg.host.clone(),
            port: leg.port,
            tier: leg.tier,
            bytes_in,
            bytes_out,
            duration_ms: started.elapsed().as_millis() as u64,
            reason: reason.to_string(),
            dst: dst.map(|d| d.to_string()),
        });
        let recorded = self.recorder.record(entry).await;
        if let Err(e) = &recorded {
            warn!(error = %e, host = %leg.host, "passthrough could not be recorded");
        }
        recorded
    }

    /// Phase 3 again, per request: a terminated connection or plain HTTP may
    /// carry requests for several services (path prefixes on a shared host).
    async fn handle(self: Arc<Self>, req: Request<Incoming>, leg: Arc<Leg>) -> Response<ProxyBody> {
        if leg.sni_host {
            if let Some(refusal) = self.sni_host_mismatch(&req, &leg).await {
                return refusal;
            }
        }
        let path = req.uri().path().to_string();
        match self.router.route(&leg.host, &path) {
            Route::Canary => self.canary(),
            Route::Service(service) => {
                // Its counters' slot, found once (a pointer compare per service).
                let index = self.router.index_of(service).unwrap_or(usize::MAX);
                let service = service.clone();
                // Per-request context is for `debug`: at `info` the span's
                // fields were formatted for every request. Logs are not the
                // ledger, but they must not carry secrets either.
                let span = debug_span!("request", service = %service.name, host = %leg.host, method = %req.method(), path = tracing::field::Empty);
                if !span.is_disabled() {
                    span.record("path", tracing::field::display(redact::text(&path)));
                }
                if let Some(refusal) = self
                    .screen(&service, &req, &leg)
                    .instrument(span.clone())
                    .await
                {
                    return refusal;
                }
                self.forward(service, index, req, &leg)
                    .instrument(span)
                    .await
            }
            Route::Loopback if dial::isolated() => {
                let method = req.method().to_string();
                let path = req.uri().path().to_string();
                self.refuse_host_loopback(&leg, Some(method), Some(path))
                    .await
            }
            route @ (Route::Loopback | Route::Allowed) => {
                let reason = if route == Route::Loopback {
                    "loopback"
                } else {
                    "allow_passthrough"
                };
                // A name that passes on its own say-so must stand for the
                // address the bytes were headed to (DESIGN §7a.11).
                match self.name_mismatch(&leg, route).await {
                    None => self.pass(req, &leg, reason).await,
                    Some(why) if self.identity.mode == Mode::Strict => {
                        self.refuse_mismatch(req, &leg, why).await
                    }
                    // Let through by the mode, not by the name.
                    Some(_) => self.pass(req, &leg, "mode").await,
                }
            }
            Route::Unmapped if self.identity.mode == Mode::Passthrough => {
                self.pass(req, &leg, "mode").await
            }
            Route::Unmapped => self.refuse(req, &leg).await,
        }
    }

    /// Phase 5: vendor paths the proxy answers itself and never forwards
    /// (DESIGN §7a.7): the twin's control surface sits beside every service
    /// (`…/s/{sandbox}/{service}/veris/…`), and dot-segments could be resolved
    /// out of the service's prefix. Each refusal is recorded as its own kind,
    /// never as a vendor call; `None` lets the request through.
    async fn screen(
        &self,
        service: &Service,
        req: &Request<Incoming>,
        leg: &Leg,
    ) -> Option<Response<ProxyBody>> {
        let (status, code, message) = match reserved::classify(req.uri().path()) {
            PathClass::Vendor => return None,
            PathClass::DotSegment => (
                StatusCode::BAD_REQUEST,
                "veris_bad_path",
                format!(
                    "the path has a `.` or `..` segment (possibly percent-encoded); veris does not forward it because the twin could resolve it outside the {} service. Next: send the resolved path (most clients resolve dot-segments themselves; curl does unless --path-as-is is given)",
                    service.name
                ),
            ),
            PathClass::Reserved => (
                StatusCode::NOT_FOUND,
                "veris_reserved_path",
                format!(
                    "paths under /veris on {} are reserved for the twin's control surface and are never forwarded. Next: call the vendor's own API paths; read what reached the twin with `veris receipt`",
                    leg.host
                ),
            ),
        };
        let entry = Entry::ReservedPath(ReservedPathLine {
            service: service.name.clone(),
            host: leg.host.clone(),
            method: req.method().to_string(),
            path: redact::text(req.uri().path()),
            status: status.as_u16(),
            error: code.to_string(),
            tier: leg.tier,
        });
        if let Err(e) = self.recorder.record(entry).await {
            warn!(error = %e, "ledger unavailable: refusing vendor traffic until it recovers");
            return Some(ledger_unavailable(&e, &service.name));
        }
        info!(
            status = status.as_u16(),
            error = code,
            "reserved path answered by the proxy"
        );
        Some(respond::error(
            status,
            code,
            message,
            json!({"service": service.name}),
        ))
    }

    /// Phase 6: a vendor request to its twin. The exchange and its ledger line
    /// run in the client connection's task while the client waits for them,
    /// and move to a tracked task of their own when hyper drops the service
    /// future because the client hung up ([`Detachable`]): a request the twin
    /// executed is recorded even when nobody is left to read the answer
    /// (DESIGN §7a.8), and shutdown waits for it.
    async fn forward(
        self: Arc<Self>,
        service: Service,
        index: usize,
        req: Request<Incoming>,
        leg: &Leg,
    ) -> Response<ProxyBody> {
        let outbound = match self.outbound(&service, index, req, leg) {
            Ok(outbound) => outbound,
            Err(path) => {
                return respond::error(
                    StatusCode::BAD_REQUEST,
                    "veris_bad_request",
                    format!("cannot forward path {path:?}"),
                    json!({}),
                )
            }
        };
        let gone = Arc::new(AtomicBool::new(false));
        let proxy = Arc::clone(&self);
        let exchange = {
            let gone = Arc::clone(&gone);
            async move { proxy.exchange(outbound, &gone).await }
        };
        let exchange = self.exchanges.track_future(exchange);
        let exchange = AssertUnwindSafe(exchange.instrument(Span::current())).catch_unwind();
        let detachable = Detachable {
            exchange: Some(Box::pin(exchange)),
            gone,
            tasks: self.tasks.clone(),
        };
        match detachable.await {
            Ok(resp) => resp,
            Err(_) => respond::error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "veris_internal_error",
                "the proxy lost this request's exchange with the twin. Next: retry; if it repeats, report it with the proxy's log".into(),
                json!({"service": service.name}),
            ),
        }
    }

    /// Phase 6, first half: the request as the twin gets it (its URL under the
    /// service's upstream, the veris headers, the twin credential) and the
    /// fields of its ledger line that are known before the answer. `Err` is a
    /// path that makes no valid URL under the upstream.
    fn outbound(
        &self,
        service: &Service,
        index: usize,
        mut req: Request<Incoming>,
        leg: &Leg,
    ) -> Result<Outbound, String> {
        let started = Instant::now();
        let websocket = req.version() == Version::HTTP_11 && is_websocket(req.headers());
        let client_upgrade = websocket.then(|| hyper::upgrade::on(&mut req));
        let (parts, incoming) = req.into_parts();
        let path = parts.uri.path().to_string();
        let query = parts.uri.query().map(str::to_string);
        let target = match query.as_deref() {
            Some(q) => format!("{}{path}?{q}", service.upstream),
            None => format!("{}{path}", service.upstream),
        };
        let Ok(uri) = target.parse::<Uri>() else {
            return Err(path);
        };
        let line = RequestLine {
            service: service.name.clone(),
            host: leg.host.clone(),
            method: parts.method.to_string(),
            path,
            // Redacted with every other field by the ledger's writer, the one
            // door into the record (`redact::entry`).
            query,
            http: http_version(parts.version),
            tier: leg.tier,
            upstream: display_origin(&uri),
            headers: recorded_headers(&parts.headers),
        };

        let slot = self.capture.as_ref().map(|c| c.slot());
        let incoming = match &slot {
            Some(slot) => slot.tee(
                incoming,
                Side::Request,
                content_type(&parts.headers),
                encoded(&parts.headers),
            ),
            None => capture::Tee::off(incoming),
        };

        let mut headers = parts.headers;
        strip_hop_by_hop(&mut headers, websocket);
        headers.remove(header::HOST);
        // Only the proxy speaks in `X-Veris-*` headers: whatever the client
        // sent under that prefix (its own sandbox, service, original
        // authorization...) never reaches the twin.
        strip_veris_headers(&mut headers);
        let original_host = if (leg.tls && leg.port == 443) || (!leg.tls && leg.port == 80) {
            leg.host.clone()
        } else {
            format!("{}:{}", leg.host, leg.port)
        };
        if let Ok(v) = HeaderValue::from_str(&original_host) {
            headers.insert(HeaderName::from_static("x-veris-original-host"), v);
        }
        if let Ok(v) = HeaderValue::from_str(&service.name) {
            headers.insert(HeaderName::from_static("x-veris-service"), v);
        }
        if let Ok(v) = HeaderValue::from_str(&self.identity.sandbox_id) {
            headers.insert(HeaderName::from_static("x-veris-sandbox"), v);
        }
        if let Some(auth) = &self.twin_auth {
            if let Some(original) = headers.remove(header::AUTHORIZATION) {
                headers.insert(ORIGINAL_AUTHORIZATION, original);
            }
            headers.insert(header::AUTHORIZATION, auth.clone());
        }

        let declared_in = content_length(&headers);
        let (counted, tally) = Counted::new(incoming);
        let mut request = Request::new(counted.boxed());
        *request.method_mut() = parts.method;
        *request.uri_mut() = uri;
        *request.headers_mut() = headers;
        Ok(Outbound {
            request,
            declared_in,
            websocket,
            client_upgrade,
            tally,
            started,
            line,
            index,
            slot,
        })
    }

    /// Phases 6 to 8: send to the twin, record, then return the answer for
    /// the client. The ledger line is written before the response head is
    /// handed over; when the client has already gone (`gone`, set when the
    /// exchange was detached from its connection), the line says so
    /// (`client_gone`) and the answer goes nowhere.
    async fn exchange(&self, outbound: Outbound, gone: &AtomicBool) -> Response<ProxyBody> {
        let Outbound {
            request,
            declared_in,
            websocket,
            client_upgrade,
            tally,
            started,
            line,
            index,
            slot,
        } = outbound;
        // Once sent, the request has a line whatever happens: the twin's
        // answer, its failure, the client's body breaking off, or the
        // session ending first (`abandon`, after the grace period).
        let result = tokio::select! {
            result = self.upstream.send(request, websocket) => Some(result),
            () = self.abandon.cancelled() => None,
        };
        let elapsed = started.elapsed();
        let duration_ms = elapsed.as_millis() as u64;
        let body = (tally.bytes(), declared_in);
        let resp = match result {
            Some(Ok(resp)) => resp,
            Some(Err(e)) if tally.failed() => {
                // The client's body broke off mid-request: the client left,
                // or its body ended short or with an error (hyper's body
                // errors on both). The twin got the head and part of the
                // body, and may have acted on them.
                debug!(error = %e, "client body failed mid-request");
                let unanswered = Unanswered {
                    status: StatusCode::BAD_REQUEST,
                    code: "veris_request_body_incomplete",
                    body: Some(body),
                };
                self.record_unanswered(&line, &unanswered, duration_ms)
                    .await;
                self.stats.request(index, unanswered.status.as_u16());
                return respond::error(
                    StatusCode::BAD_REQUEST,
                    "veris_client_body_error",
                    "the request body ended with an error before it was forwarded".into(),
                    json!({}),
                );
            }
            None => {
                let code = if tally.ended() {
                    "veris_session_ended"
                } else {
                    "veris_request_body_incomplete"
                };
                warn!(service = %line.service, method = %line.method, code, "the session ended before the twin answered a request");
                let unanswered = Unanswered {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    code,
                    body: Some(body),
                };
                self.record_unanswered(&line, &unanswered, duration_ms)
                    .await;
                self.stats.request(index, unanswered.status.as_u16());
                return respond::error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    code,
                    "the veris session ended before the twin answered this request".into(),
                    json!({"service": line.service}),
                );
            }
            Some(Err(e)) => {
                self.stats.upstream_latency(elapsed);
                let refusal = self.upstream_failed(e, line, duration_ms).await;
                self.stats.request(index, refusal.status().as_u16());
                // Recorded either way; only a client still there gets the answer.
                return refusal;
            }
        };

        let status = resp.status();
        self.stats.upstream_latency(elapsed);
        let client_gone = gone.load(Ordering::Acquire);
        let service = line.service.clone();
        let declared = content_length(resp.headers());
        let entry = line.into_entry(
            status,
            tally.bytes(),
            declared,
            duration_ms,
            websocket && status == StatusCode::SWITCHING_PROTOCOLS,
            client_gone,
        );
        let seq = match self.record(entry, &service).await {
            Ok(seq) => seq,
            Err(refusal) => return refusal,
        };
        // Counted once recorded, so the counts agree with the ledger.
        self.stats.request(index, status.as_u16());
        if let Some(slot) = &slot {
            slot.recorded(seq);
        }
        if client_gone {
            if let Some(slot) = &slot {
                slot.skip(Side::Response, "client_gone");
            }
            self.summary.note(summary::Outcome::ClientGone);
            debug!(
                status = status.as_u16(),
                duration_ms, "forwarded; the client left before the twin answered"
            );
            return Response::new(body::empty());
        }
        self.summary
            .note(summary::Outcome::Answered(status.as_u16()));
        debug!(status = status.as_u16(), duration_ms, "forwarded");
        let answer = Answer {
            of: seq,
            service,
            declared,
        };
        // Should the client leave between the check above and now, its line
        // says the answer was handed over, which it was, to a closing
        // connection.
        self.relay(resp, client_upgrade, answer, slot)
    }

    /// Phase 7: a vendor request's ledger line (its seq), before its answer
    /// goes out. `Err` is the answer instead (503): the proxy does not serve
    /// vendor traffic unrecorded.
    async fn record(&self, entry: Entry, service: &str) -> Result<u64, Response<ProxyBody>> {
        self.recorder.record(entry).await.map_err(|e| {
            warn!(error = %e, service, "ledger unavailable: refusing vendor traffic until it recovers");
            // The twin executed it: its log will hold a row with no line.
            self.unrecorded.note(service, &e);
            ledger_unavailable(&e, service)
        })
    }

    /// The twin failed: record it (the twin may still have executed the
    /// request, DESIGN §7a.8) and say so in words.
    async fn upstream_failed(
        &self,
        e: UpstreamError,
        line: RequestLine,
        duration_ms: u64,
    ) -> Response<ProxyBody> {
        let (status, code) = match e {
            UpstreamError::Timeout { .. } => {
                (StatusCode::GATEWAY_TIMEOUT, "veris_upstream_timeout")
            }
            _ => (StatusCode::BAD_GATEWAY, "veris_upstream_unreachable"),
        };
        warn!(error = %e, service = %line.service, method = %line.method, path = %redact::text(&line.path), "twin upstream failed");
        let unanswered = Unanswered {
            status,
            code,
            body: None,
        };
        self.record_unanswered(&line, &unanswered, duration_ms)
            .await;
        respond::error(
            status,
            code,
            format!("{e}. Next: check that the twin is running and reachable from the proxy"),
            json!({"upstream": line.upstream, "service": line.service}),
        )
    }

    /// The `upstream_error` line of a request sent to the twin that got no
    /// answer from it.
    async fn record_unanswered(&self, line: &RequestLine, why: &Unanswered, duration_ms: u64) {
        self.summary.note(summary::Outcome::UpstreamError);
        let entry = Entry::UpstreamError(UpstreamErrorLine {
            service: line.service.clone(),
            host: line.host.clone(),
            method: line.method.clone(),
            path: line.path.clone(),
            upstream: line.upstream.clone(),
            status: why.status.as_u16(),
            error: why.code.to_string(),
            tier: line.tier,
            duration_ms,
            bytes_in: why.body.map(|(sent, _)| sent),
            declared_in: why.body.and_then(|(_, declared)| declared),
        });
        if let Err(e) = self.recorder.record(entry).await {
            warn!(error = %e, "upstream error could not be recorded");
            if veris_receipt::entry::may_have_reached_twin(why.code) {
                self.unrecorded.note(&line.service, &e);
            }
        }
    }

    /// Phase 8: the twin's answer as the client gets it: hop-by-hop headers
    /// dropped, the body streamed (and watched: a body that ends short adds a
    /// `response_incomplete` line after the request's, so the record says
    /// what the client got), or for a WebSocket handshake both upgraded
    /// connections spliced together in a tracked task.
    fn relay(
        &self,
        mut resp: Response<Incoming>,
        client_upgrade: Option<hyper::upgrade::OnUpgrade>,
        answer: Answer,
        slot: Option<Arc<capture::Slot>>,
    ) -> Response<ProxyBody> {
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            if let Some(client_upgrade) = client_upgrade {
                if let Some(slot) = &slot {
                    slot.skip(Side::Response, "websocket");
                }
                let twin_upgrade = hyper::upgrade::on(&mut resp);
                self.tasks.spawn(async move {
                    match (client_upgrade.await, twin_upgrade.await) {
                        (Ok(client), Ok(twin)) => {
                            let _ = tokio::io::copy_bidirectional(
                                &mut TokioIo::new(client),
                                &mut TokioIo::new(twin),
                            )
                            .await;
                        }
                        (Err(e), _) | (_, Err(e)) => debug!(error = %e, "websocket upgrade failed"),
                    }
                });
                let (mut parts, _) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers, true);
                return Response::from_parts(parts, body::empty());
            }
        }
        let (mut parts, incoming) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers, false);
        parts.version = Version::default();
        let incoming = match &slot {
            Some(slot) => slot.tee(
                incoming,
                Side::Response,
                content_type(&parts.headers),
                encoded(&parts.headers),
            ),
            None => capture::Tee::off(incoming),
        };
        let body = meter::Delivered::new(incoming, self.on_short(answer));
        Response::from_parts(parts, body.boxed())
    }

    /// What to do when a relayed body ends short: record it (handed over at
    /// once, so it follows its request line), its ack awaited in a tracked
    /// task (this runs in a body's poll or drop, which cannot wait).
    fn on_short(&self, answer: Answer) -> meter::OnShort {
        let recorder = self.recorder.clone();
        let tasks = self.tasks.clone();
        Box::new(move |bytes, cut| {
            let reason = match cut {
                meter::Cut::Source => "twin_cut",
                meter::Cut::Dropped => "client_gone",
            };
            warn!(of = answer.of, bytes, declared = ?answer.declared, reason, "the response reached the client incomplete");
            let entry = Entry::ResponseIncomplete(ResponseIncompleteLine {
                of: answer.of,
                service: answer.service,
                bytes,
                declared: answer.declared,
                reason: reason.to_string(),
            });
            let ack = recorder.record(entry);
            if tokio::runtime::Handle::try_current().is_ok() {
                tasks.spawn(async move {
                    if let Err(e) = ack.await {
                        warn!(error = %e, "an incomplete response could not be recorded");
                    }
                });
            }
        })
    }

    /// Unmapped or allowed host seen as an HTTP request (plain HTTP, or inside a
    /// connection we terminated): re-originate it to the real destination —
    /// in the transparent tier the address the client dialed (the name
    /// travels as Host and SNI only), in the explicit tier a lookup of the
    /// name — and record the address the request went to.
    async fn pass(
        &self,
        req: Request<Incoming>,
        leg: &Leg,
        reason: &'static str,
    ) -> Response<ProxyBody> {
        let started = Instant::now();
        let (parts, incoming) = req.into_parts();
        let scheme = if leg.tls { "https" } else { "http" };
        let pq = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        // Redirected plain HTTP goes back to the address the client dialed
        // (the Host header travels unchanged); TLS keeps the name for SNI.
        let (host, port) = match leg.origin {
            Some(origin) if !leg.tls => (origin.ip().to_string(), origin.port()),
            _ => (leg.host.clone(), leg.port),
        };
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        let Ok(uri) = format!("{scheme}://{host}:{port}{pq}").parse::<Uri>() else {
            return respond::error(
                StatusCode::BAD_REQUEST,
                "veris_bad_request",
                "cannot rebuild the request URL".into(),
                json!({}),
            );
        };
        let (method, path) = (parts.method.to_string(), parts.uri.path().to_string());
        let mut headers = parts.headers;
        strip_hop_by_hop(&mut headers, false);
        let (counted, tally) = Counted::new(incoming);
        let mut up_req = Request::new(counted.boxed());
        *up_req.method_mut() = parts.method;
        *up_req.uri_mut() = uri;
        *up_req.headers_mut() = headers;
        let sent = match leg.origin {
            Some(origin) if leg.tls => self.upstream.send_via(origin, up_req).await,
            _ => self.upstream.send_passthrough(up_req).await,
        };
        match sent {
            Ok(resp) => {
                let bytes_out = content_length(resp.headers()).unwrap_or(0);
                let dst = resp
                    .extensions()
                    .get::<hyper_util::client::legacy::connect::HttpInfo>()
                    .map(|info| info.remote_addr())
                    .or(leg.origin);
                let bytes = (tally.bytes(), bytes_out);
                let _ = self
                    .record_passthrough(leg, reason, dst, bytes, started)
                    .await;
                let (mut parts, incoming) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers, false);
                parts.version = Version::default();
                Response::from_parts(parts, incoming.map_err(Into::into).boxed())
            }
            // Refused by policy (this host, from an isolated run): nothing
            // passed, so it is a refusal, not a passthrough.
            Err(e) if refused_by_policy(&e) => {
                self.refuse_host_loopback(leg, Some(method), Some(path))
                    .await
            }
            Err(e) => match dial::ChainError::find(&e) {
                Some(chain) => {
                    self.upstream_proxy_failed(leg, reason, started, chain)
                        .await
                }
                None => {
                    self.tunnel_failed(leg, reason, started, error_text(&e))
                        .await
                }
            },
        }
    }

    /// Strict mode: 421 in words, recorded as blocked.
    async fn refuse(&self, req: Request<Incoming>, leg: &Leg) -> Response<ProxyBody> {
        let entry = Entry::Blocked(BlockedLine {
            host: leg.host.clone(),
            port: leg.port,
            tier: leg.tier,
            method: Some(req.method().to_string()),
            path: Some(req.uri().path().to_string()),
            reason: "strict mode: no service claims this host and path".into(),
            dst: leg.headed_to(),
        });
        if let Err(e) = self.recorder.record(entry).await {
            warn!(error = %e, "blocked request could not be recorded");
        }
        let known: Vec<&str> = self
            .router
            .services()
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        respond::json(
            StatusCode::MISDIRECTED_REQUEST,
            json!({
                "error": "veris_unmapped_host",
                "message": format!("veris is in strict mode and no service is routed for {}{}", leg.host, req.uri().path()),
                "host": leg.host,
                "remedy": [
                    format!("route it to a twin service: --route SERVICE={}", leg.host),
                    format!("or allow it through: add \"{}\" to allow_passthrough", leg.host),
                    "or run in passthrough mode (--mode passthrough)",
                ],
                "sandbox_id": self.identity.sandbox_id,
                "known_services": known,
            }),
        )
    }

    /// An isolated run's client asking for loopback through the proxy: its
    /// own loopback it reaches directly, so this can only mean the host's,
    /// which veris never reaches for it. 403, recorded as blocked.
    async fn refuse_host_loopback(
        &self,
        leg: &Leg,
        method: Option<String>,
        path: Option<String>,
    ) -> Response<ProxyBody> {
        info!(host = %leg.host, port = leg.port, "refused a destination on this host from an isolated run");
        let reason = "isolated run: the host's loopback and every address of its interfaces are not reachable through veris (the run's own loopback is reached directly)";
        self.record_or_log(Entry::Blocked(BlockedLine {
            host: leg.host.clone(),
            port: leg.port,
            tier: leg.tier,
            method,
            path,
            reason: reason.into(),
            dst: leg.headed_to(),
        }))
        .await;
        respond::error(
            StatusCode::FORBIDDEN,
            "veris_host_loopback",
            format!("{}:{} is this host: {reason}. Next: connect to the service on the run's own loopback, or give it a routed name", leg.host, leg.port),
            json!({"host": leg.host}),
        )
    }

    /// Strict mode, transparent tier: a request whose Host is a loopback or
    /// allowed name but whose connection was headed elsewhere (`why`).
    /// 421 in words, recorded as blocked with that destination.
    async fn refuse_mismatch(
        &self,
        req: Request<Incoming>,
        leg: &Leg,
        why: String,
    ) -> Response<ProxyBody> {
        warn!(host = %leg.host, dst = ?leg.origin, "{why}; refused");
        self.record_or_log(Entry::Blocked(BlockedLine {
            host: leg.host.clone(),
            port: leg.port,
            tier: leg.tier,
            method: Some(req.method().to_string()),
            path: Some(req.uri().path().to_string()),
            reason: format!("strict mode: name does not match the destination: {why}"),
            dst: leg.headed_to(),
        }))
        .await;
        respond::json(
            StatusCode::MISDIRECTED_REQUEST,
            json!({
                "error": "veris_name_mismatch",
                "message": format!("veris is in strict mode and refuses this request: {why}"),
                "host": leg.host,
                "dst": leg.headed_to(),
                "remedy": [
                    format!("connect to an address {} stands for (loopback for a loopback name; for an allowed host, one the proxy's resolver also returns)", leg.host),
                    "or run in passthrough mode (--mode passthrough), where it is let through and recorded with its destination",
                ],
                "sandbox_id": self.identity.sandbox_id,
            }),
        )
    }

    /// The canary: proves a request went through this run's proxy.
    fn canary(&self) -> Response<ProxyBody> {
        respond::json(
            StatusCode::OK,
            json!({
                "veris_proxy": true,
                "canary": self.identity.canary,
                "run_id": self.identity.run_id,
                "sandbox_id": self.identity.sandbox_id,
                "mode": self.identity.mode,
                "tier": self.identity.tier,
            }),
        )
    }
}

fn http_version(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_2 => "HTTP/2",
        Version::HTTP_3 => "HTTP/3",
        _ => "HTTP/1.1",
    }
}

fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// Removes every `X-Veris-*` header (the prefix is the proxy's to the twin).
fn strip_veris_headers(headers: &mut http::HeaderMap) {
    let names: Vec<header::HeaderName> = headers
        .keys()
        .filter(|n| n.as_str().starts_with("x-veris-"))
        .cloned()
        .collect();
    for name in names {
        headers.remove(name);
    }
}

/// Where the client's own `Authorization` travels when the proxy sends the
/// twin credential in its place.
const ORIGINAL_AUTHORIZATION: HeaderName =
    HeaderName::from_static("x-veris-original-authorization");

/// A vendor request ready for its twin, with what its ledger line needs.
struct Outbound {
    request: Request<ProxyBody>,
    /// The body length the client declared (`Content-Length`).
    declared_in: Option<u64>,
    websocket: bool,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    tally: Arc<Tally>,
    started: Instant,
    line: RequestLine,
    /// The service's slot in [`metrics::Stats`].
    index: usize,
    /// Its body capture, when the proxy captures bodies.
    slot: Option<Arc<capture::Slot>>,
}

/// An exchange with the twin (or its panic), run by whoever polls it: the
/// client connection's task while the client waits, or, once hyper drops it
/// because the client hung up, a tracked task of its own that runs it to its
/// ledger line. Detaching only when the client leaves spares every request a
/// task and a channel.
struct Detachable {
    exchange: Option<Pin<Box<dyn Future<Output = Exchanged> + Send>>>,
    /// Set before the exchange is detached: nobody will read its answer.
    gone: Arc<AtomicBool>,
    tasks: TaskTracker,
}

/// The answer for the client, or the panic that lost it.
type Exchanged = std::thread::Result<Response<ProxyBody>>;

impl Future for Detachable {
    type Output = Exchanged;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(exchange) = self.exchange.as_mut() else {
            // Polled again after it finished: a caller bug, never hyper's.
            return Poll::Pending;
        };
        let out = std::task::ready!(exchange.as_mut().poll(cx));
        self.exchange = None;
        Poll::Ready(out)
    }
}

impl Drop for Detachable {
    fn drop(&mut self) {
        if let Some(exchange) = self.exchange.take() {
            self.gone.store(true, Ordering::Release);
            // Outside a runtime (it is shutting down) there is nothing left
            // to run it on, as for any task still queued then.
            if tokio::runtime::Handle::try_current().is_ok() {
                self.tasks.spawn(async move {
                    let _ = exchange.await;
                });
            }
        }
    }
}

/// Why a request sent to the twin got no answer from it, for its
/// `upstream_error` line.
struct Unanswered {
    status: StatusCode,
    code: &'static str,
    /// Request body bytes forwarded and the length the client declared,
    /// when the body is part of why.
    body: Option<(u64, Option<u64>)>,
}

/// `e` and what caused it, outermost first: hyper's own words ("client
/// error (Connect)") say nothing of which address failed, its causes do.
fn error_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        let more = err.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cur = err.source();
    }
    text
}

/// True when `e` (or what caused it) is a dial refused by policy
/// ([`dial`]'s `PermissionDenied`: this host, from an isolated run).
fn refused_by_policy(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Which recorded request a relayed answer belongs to.
struct Answer {
    /// The seq of its `request` line.
    of: u64,
    service: String,
    /// The body length the twin declared.
    declared: Option<u64>,
}

/// The fields of an [`Entry::Request`] known before the twin answers.
struct RequestLine {
    service: String,
    host: String,
    method: String,
    path: String,
    /// Already redacted.
    query: Option<String>,
    http: &'static str,
    tier: ListenerTier,
    upstream: String,
    headers: Vec<(String, String)>,
}

impl RequestLine {
    fn into_entry(
        self,
        status: StatusCode,
        bytes_in: u64,
        bytes_out: Option<u64>,
        duration_ms: u64,
        websocket: bool,
        client_gone: bool,
    ) -> Entry {
        Entry::Request(veris_receipt::RequestLine {
            service: self.service,
            host: self.host,
            method: self.method,
            path: self.path,
            query: self.query,
            status: status.as_u16(),
            http: self.http.to_string(),
            tier: self.tier,
            bytes_in,
            bytes_out,
            duration_ms,
            upstream: self.upstream,
            headers: self.headers,
            websocket,
            client_gone,
        })
    }
}

/// The answer when a vendor request's ledger line could not be written: the
/// proxy does not serve vendor traffic unrecorded (DESIGN §7).
fn ledger_unavailable(e: &RecordError, service: &str) -> Response<ProxyBody> {
    respond::error(
        StatusCode::SERVICE_UNAVAILABLE,
        "veris_ledger_unavailable",
        format!("the proxy could not record this request ({e}) and does not serve vendor traffic unrecorded. Next: check free space and permissions of the veris state dir"),
        json!({"service": service}),
    )
}

/// The request headers the ledger keeps, as sent: the writer redacts them
/// (`redact::entry`) like every field of every line.
/// A body's `Content-Type`, for its capture.
fn content_type(headers: &http::HeaderMap) -> Option<String> {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// True when a `Content-Encoding` other than identity makes a body bytes
/// that are not its text (its capture stores nothing).
fn encoded(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .any(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
}

fn recorded_headers(headers: &http::HeaderMap) -> Vec<(String, String)> {
    RECORDED_HEADERS
        .iter()
        .filter_map(|name| {
            let value = headers.get(name)?.to_str().ok()?;
            Some((name.as_str().to_string(), value.to_string()))
        })
        .collect()
}

/// A rustls server config presenting one minted leaf, offering h2 and
/// http/1.1 (the built-in twin's; the proxy keeps one per leaf in [`tls`]).
pub fn server_config(key: Arc<rustls::sign::CertifiedKey>) -> Arc<rustls::ServerConfig> {
    Arc::new(tls::leaf_config(key))
}

/// Phase 1: accepts client connections until `shutdown` resolves, then stops
/// accepting, lets in-flight requests and tunnels finish within the grace
/// period, and returns.
pub async fn serve(
    listener: TcpListener,
    proxy: Arc<Proxy>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let Some(permit) = proxy.admit() else {
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let connection = client_connection(proxy.clone(), stream, peer);
                    proxy.tasks.spawn(async move {
                        connection.await;
                        drop(permit);
                    });
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
    drop(listener);
    proxy.summary.flush();
    proxy.drain().await;
    Ok(())
}

async fn client_connection(proxy: Arc<Proxy>, stream: TcpStream, peer: SocketAddr) {
    let cancel = proxy.cancel.clone();
    let head_timeout = proxy.limits.request_head;
    let service = service_fn(move |req: Request<Incoming>| {
        let proxy = proxy.clone();
        async move { Ok::<_, Infallible>(proxy.on_proxy_request(req, peer).await) }
    });
    if let Err(e) = serve_http1(stream, service, &cancel, head_timeout).await {
        debug!(error = %e, %peer, "client connection ended with an error");
    }
}

/// Largest request head a client may send (HTTP/1.1 read buffer, HTTP/2
/// header list): more gets `431` from the proxy itself, instead of a twin
/// that refuses it being reported as unreachable.
pub const MAX_REQUEST_HEAD: usize = 64 * 1024;

/// Requests in flight on one connection, and when the last one ended: a
/// connection that carries none for the idle time is closed. HTTP/1.1 has
/// its head timeout for that, but neither HTTP/2 (a client that answers
/// pings stays) nor the moment before the protocol is known (after a TLS
/// handshake, nothing sent) has one.
struct Activity {
    start: Instant,
    in_flight: std::sync::atomic::AtomicUsize,
    /// Milliseconds from `start` to the end of the last request.
    last_end_ms: std::sync::atomic::AtomicU64,
}

impl Activity {
    /// When the connection becomes idle for `idle`, or `None` while a
    /// request is in flight.
    fn idle_at(&self, idle: Duration) -> Option<Instant> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.in_flight.load(SeqCst) > 0 {
            return None;
        }
        Some(self.start + Duration::from_millis(self.last_end_ms.load(SeqCst)) + idle)
    }
}

/// Counts a request in flight until dropped.
struct Busy(Arc<Activity>);

impl Busy {
    fn new(a: &Arc<Activity>) -> Busy {
        a.in_flight
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Busy(a.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering::SeqCst;
        let ms = u64::try_from(self.0.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.last_end_ms.store(ms, SeqCst);
        self.0.in_flight.fetch_sub(1, SeqCst);
    }
}

/// Serves one connection as HTTP/1.1 (upgrades allowed) or HTTP/2 (by its
/// preface) until it ends, or until it carries no request for
/// `head_timeout` (closed gracefully: a response still streaming finishes);
/// once `cancel` fires, in-flight requests finish and the connection closes.
pub(crate) async fn serve_auto<IO, S, B>(
    io: IO,
    service: S,
    cancel: &CancellationToken,
    head_timeout: Duration,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(head_timeout)
        .max_buf_size(MAX_REQUEST_HEAD);
    // A peer that stops answering pings is closed; one that answers them but
    // sends no request is closed by the idle check below.
    builder
        .http2()
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(head_timeout)
        .keep_alive_timeout(head_timeout)
        .max_header_list_size(u32::try_from(MAX_REQUEST_HEAD).unwrap_or(u32::MAX));
    let activity = Arc::new(Activity {
        start: Instant::now(),
        in_flight: 0.into(),
        last_end_ms: 0.into(),
    });
    let counted = activity.clone();
    let service = service_fn(move |req| {
        let busy = Busy::new(&counted);
        let answer = hyper::service::Service::call(&service, req);
        async move {
            let _busy = busy;
            answer.await
        }
    });
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(conn);
    loop {
        let idle_at = activity.idle_at(head_timeout);
        tokio::select! {
            r = conn.as_mut() => return r,
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep_until(idle_at.unwrap_or_else(|| Instant::now() + head_timeout).into()) => {
                if activity.idle_at(head_timeout).is_some_and(|at| at <= Instant::now()) {
                    break;
                }
            }
        }
    }
    conn.as_mut().graceful_shutdown();
    conn.await
}

/// Serves one HTTP/1.1 connection (upgrades allowed) until it ends, or
/// until a request head (or the next one, on an idle keep-alive
/// connection) takes longer than `head_timeout`; once `cancel` fires,
/// in-flight requests finish and the connection closes.
pub(crate) async fn serve_http1<IO, S, B>(
    stream: IO,
    service: S,
    cancel: &CancellationToken,
    head_timeout: Duration,
) -> Result<(), hyper::Error>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::Future: 'static,
    B: http_body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(head_timeout)
        .max_buf_size(MAX_REQUEST_HEAD)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => r,
        _ = cancel.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Duration = Duration::from_secs(5);

    fn serve(io: tokio::io::DuplexStream) -> tokio::task::JoinHandle<()> {
        let service = service_fn(|_req: Request<Incoming>| async {
            Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
                bytes::Bytes::from_static(b"ok"),
            )))
        });
        tokio::spawn(async move {
            let _ = serve_auto(io, service, &CancellationToken::new(), IDLE).await;
        })
    }

    /// Time is paused: the runtime jumps to the next timer whenever every
    /// task waits, so these run at once however long the idle time is.
    #[tokio::test(start_paused = true)]
    async fn a_connection_that_sends_nothing_is_closed_after_the_idle_time() {
        let (_client, server) = tokio::io::duplex(1 << 16);
        let started = tokio::time::Instant::now();
        tokio::time::timeout(IDLE * 10, serve(server))
            .await
            .expect("the connection was held past the idle time")
            .unwrap();
        assert!(started.elapsed() >= IDLE, "closed before the idle time");
    }

    #[tokio::test(start_paused = true)]
    async fn an_http2_connection_that_answers_pings_but_sends_nothing_is_closed() {
        let (client, server) = tokio::io::duplex(1 << 16);
        let server = serve(server);
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(client))
                .await
                .unwrap();
        // The client side answers the server's pings for as long as it runs.
        let client_conn = tokio::spawn(conn);
        let resp = send
            .send_request(
                Request::get("http://twin/")
                    .body(http_body_util::Empty::<bytes::Bytes>::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        drop(resp);
        tokio::time::timeout(IDLE * 10, server)
            .await
            .expect("an idle HTTP/2 connection was held")
            .unwrap();
        let _ = client_conn.await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_oversized_request_head_gets_431() {
        let (client, server) = tokio::io::duplex(1 << 20);
        let _server = serve(server);
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client))
            .await
            .unwrap();
        tokio::spawn(conn);
        let resp = send
            .send_request(
                Request::get("http://twin/")
                    .header("x-big", "a".repeat(MAX_REQUEST_HEAD + 1))
                    .body(http_body_util::Empty::<bytes::Bytes>::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    }
}
