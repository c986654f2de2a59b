//! The gateway tier's listener (DESIGN §13): one port where a sandbox
//! platform sends its sandboxes' TCP egress, as SOCKS5 (RFC 1928 with RFC
//! 1929 username/password, [`socks5`]) or as HTTP proxy requests with
//! `Proxy-Authorization: Basic` ([`proxy_auth`]), told apart by the first
//! byte, or the same inside TLS on a listener of its own (`--tls-listen`).
//!
//! One connection, phase by phase ([`serve`]):
//!
//! 1. **accept**, bounded by a gateway-wide connection cap;
//! 2. **protocol**: the first byte (on the TLS listener, `--tls-listen`,
//!    a TLS handshake and nothing else, then the byte inside);
//! 3. **authenticate**: the credential names the sandbox ([`Tenants`]). An
//!    unknown, wrong, revoked or expired one is refused before any byte is
//!    forwarded and never reaches a sandbox's ledger (the binary logs it);
//! 4. **hand over** to that sandbox's [`Proxy`], within its own limits
//!    ([`crate::limit`]: connections open, requests and bytes a second; an
//!    HTTP proxy connection belongs to the sandbox its first request
//!    names, and a switch is refused): a SOCKS5 target named by a host is
//!    the explicit tier's `CONNECT` (vendor hosts terminated, the rest
//!    tunneled or refused);
//!    one named only by its address — a platform tunnel that knows nothing
//!    else — is a redirected connection, routed by its SNI or Host
//!    ([`crate::inbound::transparent::addressed`]); an HTTP proxy request
//!    is the explicit tier's, per request. `BIND` and `UDP ASSOCIATE` are
//!    recorded as blocked and answered 0x07.
//!
//! Every dial made for a sandbox obeys the gateway's dial policy
//! ([`crate::outbound::dial::enforce`]), whichever path makes it.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{header, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};
use veris_accept::{accept_until, OnError};
use veris_receipt::{BlockedLine, Entry, ListenerTier, Mode};

use crate::body::{self, meter, ProxyBody};
use crate::inbound::http::serve_http1;
use crate::inbound::proxy_auth;
use crate::inbound::socks5::{self, Credentials, Inbound, Reply, Request as SocksRequest, Target};
use crate::inbound::transparent::{self, Client, Rewind};
use crate::limit::throttle::{Tenancy, Throttled};
use crate::limit::{self, Limit};
use crate::outbound::dial;
use crate::request::respond;
use crate::request::route::Route;
use crate::request::Leg;
use crate::Proxy;

/// The sandboxes a gateway serves, as its listener asks for them.
pub trait Tenants: Send + Sync + 'static {
    /// The proxy of the sandbox `credentials` name, or `None` when they
    /// name none: unknown, wrong password, revoked or expired (the
    /// implementation logs why, rate-limited, in the gateway's own log).
    fn authenticate(&self, credentials: &Credentials, peer: SocketAddr) -> Option<Arc<Proxy>>;
}

/// How the listener treats its clients.
pub struct Options {
    /// `--tls-listen`: SOCKS5 and HTTP proxy requests inside TLS with this
    /// config, and nothing else: a plaintext client is closed at its first
    /// byte, before it could send (SOCKS5) or have checked (HTTP) a
    /// credential.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// How long a client may take for its first byte, TLS handshake, and
    /// SOCKS5 handshake each.
    pub handshake: Duration,
    /// How long an HTTP proxy connection may wait for a request head.
    pub request_head: Duration,
    /// Connections open at once over all sandboxes and both listeners
    /// (each sandbox has its own cap besides,
    /// [`crate::Limits::max_connections`]).
    pub connections: Connections,
}

/// The gateway's cap on open connections, one for its listeners together.
#[derive(Clone)]
pub struct Connections {
    slots: Arc<tokio::sync::Semaphore>,
    max: usize,
}

impl Connections {
    pub fn new(max: usize) -> Connections {
        let max = max.max(1);
        Connections {
            slots: Arc::new(tokio::sync::Semaphore::new(max)),
            max,
        }
    }
}

/// Accepts connections until `shutdown` resolves, then lets the open ones
/// finish (bounded). The sandboxes' proxies are stopped by the caller
/// ([`Proxy::shutdown`]), which owns them.
pub async fn serve(
    listener: TcpListener,
    tenants: Arc<dyn Tenants>,
    options: Options,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let options = Arc::new(options);
    let tasks = TaskTracker::new();
    let cancel = CancellationToken::new();
    let warned = Arc::new(AtomicU64::new(0));
    accept_until(listener, shutdown, OnError::Retry, |stream, peer| {
        let Ok(permit) = options.connections.slots.clone().try_acquire_owned() else {
            if once_a_second(&warned) {
                warn!(max = options.connections.max, "too many gateway connections open; closing new ones until some end. Next: raise --max-connections (and the open-file limit)");
            }
            return;
        };
        let _ = stream.set_nodelay(true);
        let (tenants, options, cancel) = (tenants.clone(), options.clone(), cancel.clone());
        tasks.spawn(async move {
            connection(tenants, options, stream, peer, cancel).await;
            drop(permit);
        });
    })
    .await?;
    cancel.cancel();
    tasks.close();
    if tokio::time::timeout(Duration::from_secs(5), tasks.wait())
        .await
        .is_err()
    {
        warn!(
            open = tasks.len(),
            "gateway connections still open after the shutdown wait"
        );
    }
    Ok(())
}

/// True at most once a second per `last` (Unix seconds).
pub fn once_a_second(last: &AtomicU64) -> bool {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    last.swap(now, Ordering::Relaxed) != now
}

/// Phase 2: the first byte, inside TLS when it starts a handshake.
async fn connection(
    tenants: Arc<dyn Tenants>,
    options: Arc<Options>,
    mut stream: TcpStream,
    peer: SocketAddr,
    cancel: CancellationToken,
) {
    let Some(first) = first_byte(&mut stream, options.handshake).await else {
        return;
    };
    let stream = Rewind::new(vec![first], stream);
    match (socks5::first_byte(first), &options.tls) {
        (Inbound::Tls, Some(config)) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(config.clone());
            let tls = match tokio::time::timeout(options.handshake, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => return debug!(%peer, error = %e, "gateway TLS handshake failed"),
                Err(_) => return debug!(%peer, "gateway TLS handshake timed out"),
            };
            let mut tls = tls;
            let Some(inner) = first_byte(&mut tls, options.handshake).await else {
                return;
            };
            let tls = Rewind::new(vec![inner], tls);
            dispatch(tenants, &options, tls, inner, peer, cancel).await;
        }
        (_, Some(_)) => {
            debug!(%peer, "a plaintext client on the gateway's TLS listener; closed");
            if once_a_second(&PLAIN_ON_TLS_WARNED) {
                info!(%peer, "a plaintext client on the gateway's TLS listener; closed (its credential unread). Next: the platform must speak TLS to this address, or use the plain --listen address");
            }
        }
        (_, None) => dispatch(tenants, &options, stream, first, peer, cancel).await,
    }
}

/// When a plaintext client on the TLS listener was last logged at info.
static PLAIN_ON_TLS_WARNED: AtomicU64 = AtomicU64::new(0);

/// The first byte a client sends, within `wait`.
async fn first_byte<C: Client>(io: &mut C, wait: Duration) -> Option<u8> {
    let mut byte = [0u8; 1];
    match tokio::time::timeout(wait, io.read_exact(&mut byte)).await {
        Ok(Ok(_)) => Some(byte[0]),
        _ => None,
    }
}

/// Phases 3 and 4 by the protocol the first byte names.
async fn dispatch<C: Client>(
    tenants: Arc<dyn Tenants>,
    options: &Options,
    io: C,
    first: u8,
    peer: SocketAddr,
    cancel: CancellationToken,
) {
    match socks5::first_byte(first) {
        Inbound::Socks5 => socks(tenants, options, io, peer).await,
        Inbound::Http => http(tenants, options, io, peer, cancel).await,
        Inbound::Tls => {
            debug!(%peer, "a TLS handshake on a plain listener, or inside TLS; closed")
        }
        Inbound::Other => debug!(
            %peer,
            first = %format_args!("{first:#04x}"),
            "neither SOCKS5 nor an HTTP proxy request; closed"
        ),
    }
}

/// A SOCKS5 client: handshake, credentials, then its request.
async fn socks<C: Client>(
    tenants: Arc<dyn Tenants>,
    options: &Options,
    mut io: C,
    peer: SocketAddr,
) {
    let handshake = match tokio::time::timeout(options.handshake, socks5::handshake(&mut io)).await
    {
        Ok(Ok(handshake)) => handshake,
        Ok(Err(e)) => return debug!(%peer, error = %e, "SOCKS5 handshake failed"),
        Err(_) => return debug!(%peer, "SOCKS5 handshake timed out"),
    };
    let Some(proxy) = tenants.authenticate(handshake.credentials(), peer) else {
        let _ = handshake.refuse(&mut io).await;
        return;
    };
    let request = match tokio::time::timeout(options.handshake, handshake.accept(&mut io)).await {
        Ok(Ok(request)) => request,
        Ok(Err(e)) => return debug!(%peer, error = %e, "SOCKS5 request unreadable"),
        Err(_) => return debug!(%peer, "SOCKS5 request timed out"),
    };
    match request {
        SocksRequest::Unsupported { command, target } => {
            info!(%peer, %command, %target, "refused a SOCKS5 command the gateway does not serve");
            proxy
                .record_or_log(Entry::Blocked(BlockedLine {
                    host: target_host(&target),
                    port: target.port(),
                    tier: ListenerTier::Gateway,
                    method: Some(format!("SOCKS5 {command}")),
                    path: None,
                    reason: format!("gateway: SOCKS5 {command} is not served (only CONNECT is)"),
                    dst: None,
                }))
                .await;
            let _ = socks5::refuse_command(&mut io).await;
        }
        SocksRequest::Connect(target) => {
            let Some(permit) = proxy.admit() else {
                proxy.limiter().hit(Limit::Connections, Duration::ZERO);
                let _ = socks5::reply(&mut io, Reply::GeneralFailure, socks5::UNSPECIFIED).await;
                return;
            };
            // A tunnel opened is one of the sandbox's requests.
            if proxy.limiter().request().is_err() {
                let _ = socks5::reply(&mut io, Reply::NotAllowed, socks5::UNSPECIFIED).await;
                return;
            }
            let tenancy = Tenancy {
                limiter: proxy.limiter().clone(),
                _permit: permit,
            };
            proxy
                .socks_connect(Throttled::seated(io, tenancy), peer, target)
                .await;
        }
    }
}

/// The host a SOCKS5 target names, as ledger lines write it.
fn target_host(target: &Target) -> String {
    match target {
        Target::Name { host, .. } => host.as_str().to_string(),
        Target::Addr(addr) => addr.ip().to_string(),
    }
}

/// An HTTP proxy client: every request carries the sandbox's credentials
/// (`Proxy-Authorization: Basic`), which never travel further. The
/// connection belongs to the sandbox its first authenticated request names
/// ([`Tenancy`]): it counts against that sandbox's connection cap and its
/// bytes against its byte limit for as long as it lives, and a later
/// request naming another sandbox is refused — riding on A's connection,
/// B would escape its own limits and spend A's.
async fn http<C: Client>(
    tenants: Arc<dyn Tenants>,
    options: &Options,
    io: C,
    peer: SocketAddr,
    cancel: CancellationToken,
) {
    let (io, seat) = Throttled::unseated(io);
    let service = service_fn(move |mut req: Request<Incoming>| {
        let (tenants, seat) = (tenants.clone(), seat.clone());
        async move {
            let credentials = match proxy_auth::basic_credentials(req.headers()) {
                Ok(credentials) => credentials,
                Err(e) => {
                    debug!(%peer, error = %e, "HTTP proxy request without usable credentials");
                    return Ok::<_, Infallible>(challenge());
                }
            };
            let Some(proxy) = tenants.authenticate(&credentials, peer) else {
                return Ok(challenge());
            };
            match seat.get() {
                Some(tenancy) if Arc::ptr_eq(&tenancy.limiter, proxy.limiter()) => {}
                Some(_) => {
                    info!(%peer, "an HTTP proxy connection's request named another sandbox than its first; refused and closed");
                    return Ok(closing(respond::error(
                        StatusCode::FORBIDDEN,
                        "veris_sandbox_switch",
                        "this connection belongs to the sandbox its first request named; a request with another sandbox's credentials needs a connection of its own. Next: open a new connection for it".into(),
                        json!({}),
                    )));
                }
                None => {
                    let Some(permit) = proxy.admit() else {
                        proxy.limiter().hit(Limit::Connections, Duration::ZERO);
                        return Ok(closing(respond::error(
                            StatusCode::TOO_MANY_REQUESTS,
                            "veris_sandbox_connections",
                            format!(
                                "this sandbox has {} connections open through the veris gateway, its limit; this one is closed. Next: close idle connections, or raise the limit (`add-sandbox --max-connections`, `veris gateway --sandbox-connections`)",
                                proxy.limits().max_connections
                            ),
                            json!({}),
                        )));
                    };
                    let _ = seat.set(Tenancy {
                        limiter: proxy.limiter().clone(),
                        _permit: permit,
                    });
                }
            }
            // A CONNECT is one of the sandbox's requests (the requests
            // inside a terminated one count on their own, as every other
            // request does where it is handled).
            if req.method() == Method::CONNECT {
                if let Err(wait) = proxy.limiter().request() {
                    return Ok(limit::too_many_requests(proxy.limits(), wait));
                }
            }
            req.headers_mut().remove(header::PROXY_AUTHORIZATION);
            Ok(proxy.on_proxy_request(req, peer).await)
        }
    });
    if let Err(e) = serve_http1(io, service, &cancel, options.request_head).await {
        debug!(error = %e, %peer, "gateway HTTP connection ended with an error");
    }
}

/// `response`, after which the connection closes.
fn closing(mut response: Response<ProxyBody>) -> Response<ProxyBody> {
    response
        .headers_mut()
        .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
    response
}

/// The 407 for a request whose credentials name no sandbox.
fn challenge() -> Response<ProxyBody> {
    let body = json!({
        "error": "veris_proxy_auth_required",
        "message": "this veris gateway needs the sandbox's credentials (Proxy-Authorization: Basic). Next: use the proxy URL `veris gateway add-sandbox` printed for this sandbox",
    });
    let mut response = proxy_auth::challenge(body::full(body.to_string()));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

impl Proxy {
    /// Phase 4 for a SOCKS5 `CONNECT` of this sandbox.
    async fn socks_connect<C: Client>(
        self: Arc<Self>,
        mut io: C,
        peer: SocketAddr,
        target: Target,
    ) {
        let (host, port) = match target {
            // Only the address is known: the client's first bytes name the
            // host (SNI, Host), as in a redirected connection.
            Target::Addr(dst) => {
                if socks5::reply(&mut io, Reply::Succeeded, socks5::UNSPECIFIED)
                    .await
                    .is_ok()
                {
                    transparent::addressed(self, io, peer, dst).await;
                }
                return;
            }
            Target::Name { host, port } => (host.into_string(), port),
        };
        let leg = Leg {
            host,
            port,
            tls: true,
            tier: ListenerTier::Gateway,
            origin: None,
            sni_host: false,
            via: None,
        };
        let passthrough = match self.router.route_connection(&leg.host) {
            Route::Service(_) | Route::Canary => None,
            Route::Loopback => Some("loopback"),
            Route::Allowed => Some("allow_passthrough"),
            Route::Unmapped if self.identity.mode == Mode::Passthrough => Some("mode"),
            // Strict: terminate, so the refusal reaches the client in words.
            Route::Unmapped => None,
        };
        match passthrough {
            None => {
                if socks5::reply(&mut io, Reply::Succeeded, socks5::UNSPECIFIED)
                    .await
                    .is_ok()
                {
                    self.intercept_named(io, leg).await;
                }
            }
            Some(reason) => self.socks_tunnel(io, leg, reason).await,
        }
    }

    /// A vendor (or canary, or strict-mode) host the sandbox named: TLS is
    /// terminated with a leaf for that name; plain HTTP is served as it is,
    /// each request routed as in the explicit tier.
    async fn intercept_named<C: Client>(self: Arc<Self>, mut io: C, mut leg: Leg) {
        let Some(first) = first_byte(&mut io, self.limits.request_head).await else {
            return;
        };
        let io = Rewind::new(vec![first], io);
        if first == 0x16 {
            return self.terminate(io, leg).await;
        }
        leg.tls = false;
        let leg = Arc::new(leg);
        let proxy = self.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            let (proxy, leg) = (proxy.clone(), leg.clone());
            async move { Ok::<_, Infallible>(proxy.handle(req, leg).await) }
        });
        let served =
            crate::inbound::http::serve_auto(io, service, &self.cancel, self.limits.request_head);
        if let Err(e) = served.await {
            debug!(error = %e, "gateway plain-HTTP connection ended with an error");
        }
    }

    /// A passthrough the sandbox named: dialed under the gateway's dial
    /// policy before the client hears anything, answered with the SOCKS5
    /// reply that says what happened, recorded as the explicit tier records
    /// its tunnels.
    async fn socks_tunnel<C: Client>(&self, mut io: C, leg: Leg, reason: &'static str) {
        let started = Instant::now();
        let dialed = tokio::time::timeout(
            self.connect_timeout,
            dial::connect_host_for_client(&leg.host, leg.port, None),
        )
        .await;
        let mut origin = match dialed {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) if e.kind() == io::ErrorKind::PermissionDenied => {
                let why = e.to_string();
                let _ = self
                    .refuse_host_loopback(&leg, Some("CONNECT".into()), None, Some(why))
                    .await;
                let _ = socks5::reply(&mut io, Reply::NotAllowed, socks5::UNSPECIFIED).await;
                return;
            }
            Ok(Err(e)) => {
                let code = match e.kind() {
                    io::ErrorKind::ConnectionRefused => Reply::ConnectionRefused,
                    io::ErrorKind::NetworkUnreachable => Reply::NetworkUnreachable,
                    _ => Reply::HostUnreachable,
                };
                self.record_unreached(&leg, reason, started, e.to_string())
                    .await;
                let _ = socks5::reply(&mut io, code, socks5::UNSPECIFIED).await;
                return;
            }
            Err(_) => {
                let waited = format!("no answer within {:?}", self.connect_timeout);
                self.record_unreached(&leg, reason, started, waited).await;
                let _ = socks5::reply(&mut io, Reply::TtlExpired, socks5::UNSPECIFIED).await;
                return;
            }
        };
        let dst = origin.peer_addr().ok();
        // Recorded before the client may send a byte: nothing unrecorded passes.
        let Ok(open) = self
            .record_passthrough(&leg, reason, dst, (0, 0), started)
            .await
        else {
            let _ = socks5::reply(&mut io, Reply::GeneralFailure, socks5::UNSPECIFIED).await;
            return;
        };
        if socks5::reply(&mut io, Reply::Succeeded, socks5::UNSPECIFIED)
            .await
            .is_err()
        {
            self.record_tunnel_close(open, (0, 0), started, Some("the client left".into()))
                .await;
            return;
        }
        let (mut client, meter) = meter::Metered::new(io);
        let error = tokio::io::copy_bidirectional(&mut client, &mut origin)
            .await
            .err()
            .map(|e| e.to_string());
        self.record_tunnel_close(open, (meter.read(), meter.written()), started, error)
            .await;
    }
}
