//! The transparent tier: listeners for connections the kernel redirected
//! (nftables `redirect` of the workload's outbound TCP, any port), so
//! interception does not depend on the client honouring proxy variables.
//!
//! One redirected connection, phase by phase ([`Transparent::redirected`]):
//!
//! 1. **accept**: ask conntrack where the client was going
//!    (`SO_ORIGINAL_DST`); a connection that did not come through the
//!    redirect, or is our own dial looping back, is closed.
//! 2. **peek** ([`Transparent::peek`]): read the first bytes, bounded in bytes
//!    and time ([`sniff`]). Any port may carry anything, so the bytes decide,
//!    not the port. A client silent for [`SERVER_FIRST_WAIT`] may be waiting
//!    for a server that speaks first (SMTP, FTP): where an opaque passthrough
//!    would be allowed anyway, the original destination is dialed then and
//!    whoever speaks first decides.
//! 3. **route and act**, by what the bytes are:
//!    - TLS ([`Transparent::tls`]): the rest of the ClientHello (bounded,
//!      reassembled across segments and records) gives the SNI; routed by it
//!      (or by the original IP without one). Vendor hosts are terminated —
//!      the buffered hello is replayed into rustls through [`Rewind`] and the
//!      connection joins the explicit tier's request lifecycle with
//!      `tier: transparent`; the rest passes through to the original
//!      destination with the exact hello bytes replayed, or is refused.
//!    - HTTP ([`Transparent::http`]): each request is routed by its Host,
//!      and a `CONNECT` (a client that thinks it talks to some other proxy)
//!      is handled as the explicit tier handles its own.
//!    - anything else ([`Transparent::opaque`]): a recorded passthrough to
//!      the original destination, or refused in strict mode.
//! 4. **record**: every passthrough line names the name the client gave
//!    beside the address its bytes went to; every refusal the address they
//!    were headed for.
//!
//! A passthrough re-dials the original destination, never a lookup of the
//! name the client claimed, so a lying SNI or Host cannot move the bytes;
//! and in strict mode a name that passes on its own say-so (loopback,
//! allowed) must stand for that destination ([`Proxy::name_mismatch`]). The
//! one exception is a `CONNECT`'s tunnel: the client named its target and
//! the original destination is the other proxy, which is never dialed, so
//! the tunnel goes where the `CONNECT` names, as in the explicit tier, and
//! its line records the address that dial reached. Our own dials are exempt
//! from the redirect by uid or mark ([`crate::outbound::dial`]). With
//! `--upstream-proxy`, the re-dial is a `CONNECT` to the original
//! destination through that proxy; when it refuses, nothing reached the
//! destination and the ledger says so as in the explicit tier: a
//! passthrough line without `dst`, closed by a `tunnel_close` carrying the
//! proxy's answer.

use std::collections::HashSet;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use http::{Method, Request};
use hyper::body::Incoming;
use hyper::service::service_fn;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, info_span, warn, Instrument};
use veris_accept::{accept_until, OnError};
use veris_receipt::BlockedLine;
use veris_receipt::{Entry, ListenerTier, Mode};

use crate::inbound::clienthello::{self, ClientHello, ClientHelloError, Parser, MAX_CLIENT_HELLO};
use crate::inbound::http::serve_auto;
use crate::inbound::sniff::{self, Protocol, Sniff};
use crate::outbound::dial;
use crate::request::route::Route;
use crate::request::screen::request_host;
use crate::request::Leg;
use crate::{sys, Proxy};
use veris_host::Host;

/// How long a redirected client may take to send its first bytes when they
/// decide everything (strict mode, vendor addresses), and then the rest of
/// its ClientHello or request line.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a silent client is taken for one that waits for its server (a
/// server-speaks-first protocol) before the original destination is dialed,
/// where an opaque passthrough is allowed.
const SERVER_FIRST_WAIT: Duration = Duration::from_secs(1);

/// A client connection: a redirected socket, or a gateway sandbox's
/// stream (over TLS with `--tls`).
pub trait Client: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Client for T {}

/// Addresses of our own passthrough dials that are still open.
type OwnDials = Arc<Mutex<HashSet<SocketAddr>>>;

/// State shared by the transparent listeners of one proxy.
struct Transparent {
    proxy: Arc<Proxy>,
    /// Local addresses of our own passthrough dials that are still open. A
    /// redirected connection arriving *from* one of them means the proxy's
    /// uid is not exempt from the redirect: refusing it breaks the loop.
    own_dials: OwnDials,
    /// Listener addresses: a connection whose original destination is one of
    /// them was not redirected at all.
    listeners: Vec<SocketAddr>,
    waits: Waits,
    /// What the ledger lines say took the connection: the transparent
    /// tier, or the gateway (a sandbox's connection to an address).
    tier: ListenerTier,
}

/// How long phases 2 and 3 wait for a client ([`HELLO_TIMEOUT`],
/// [`SERVER_FIRST_WAIT`]; shorter in tests).
#[derive(Debug, Clone, Copy)]
struct Waits {
    hello: Duration,
    server_first: Duration,
}

impl Default for Waits {
    fn default() -> Self {
        Waits {
            hello: HELLO_TIMEOUT,
            server_first: SERVER_FIRST_WAIT,
        }
    }
}

/// What to do with a redirected TLS connection once its name is known.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    /// TLS with a minted leaf, then the request lifecycle.
    Terminate,
    /// Relay to the original destination, recorded with this reason.
    Pass(&'static str),
    /// Close it, recorded as blocked with this reason.
    Refuse(String),
}

/// What phase 2 found: the protocol (or silence), the bytes read, and the
/// dial to the original destination when a silent client made us open it.
struct Peeked {
    sniff: Sniff,
    bytes: Vec<u8>,
    dial: Option<OwnDial>,
    /// Why the dial made for a silent client failed.
    unreached: Option<String>,
}

/// Accepts redirected connections on both listeners until `shutdown`
/// resolves. The ruleset sends port 80 to `http` and every other port to
/// `https`; both sniff what they receive, so the split only names the log
/// span. Shutdown of in-flight work is shared with [`crate::inbound::explicit::serve`], which
/// runs on the same [`Proxy`] for the explicit listener.
pub async fn serve(
    https: Option<TcpListener>,
    http: Option<TcpListener>,
    proxy: Arc<Proxy>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    // Our passthrough dials must leave although they target the ports the
    // workload's do: marked, they match the ruleset's `meta mark` exemption.
    dial::mark_own_dials();
    let listeners = [&https, &http]
        .into_iter()
        .flatten()
        .filter_map(|l| l.local_addr().ok())
        .collect();
    let state = Arc::new(Transparent {
        proxy: proxy.clone(),
        own_dials: OwnDials::default(),
        listeners,
        waits: Waits::default(),
        tier: ListenerTier::Transparent,
    });
    let shutdown = shutdown.shared();
    let accept = |listener: Option<TcpListener>, name: &'static str| {
        let (state, proxy, shutdown) = (state.clone(), proxy.clone(), shutdown.clone());
        async move {
            let Some(listener) = listener else {
                return Ok(());
            };
            accept_until(listener, shutdown, OnError::Retry, |stream, peer| {
                let Some(permit) = proxy.admit() else {
                    return;
                };
                let _ = stream.set_nodelay(true);
                let peer = canonical(peer);
                let span = info_span!("transparent", listener = name, %peer);
                let connection = state.clone().connection(stream, peer).instrument(span);
                proxy.tasks.spawn(async move {
                    connection.await;
                    drop(permit);
                });
            })
            .await
        }
    };
    let (https, http) = tokio::join!(accept(https, "https"), accept(http, "http"));
    https.and(http)?;
    proxy.drain().await;
    Ok(())
}

/// The gateway tier: a sandbox's connection to `dst` whose platform named
/// only the address (a SOCKS5 `CONNECT` to an IP, already answered),
/// through phases 2 to 4 as a redirected connection: routed by its SNI or
/// Host, a passthrough dialed under the gateway's dial policy, every line
/// naming the gateway tier.
pub async fn addressed<C: Client>(proxy: Arc<Proxy>, client: C, peer: SocketAddr, dst: SocketAddr) {
    let state = Arc::new(Transparent {
        proxy,
        own_dials: OwnDials::default(),
        listeners: Vec::new(),
        waits: Waits::default(),
        tier: ListenerTier::Gateway,
    });
    state.redirected(client, peer, canonical(dst)).await;
}

/// What a connection to `dst` is named by when it names nothing itself (no
/// SNI, no Host): in an isolated run the name the client looked up (the DNS
/// stub handed out `dst` for it), else the address.
fn dst_name(dst: SocketAddr) -> String {
    dial::synthetic_name(dst.ip()).unwrap_or_else(|| dst.ip().to_string())
}

/// IPv4 peers of a dual-stack listener arrive as `::ffff:a.b.c.d`.
fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// One of our own dials to an original destination, registered in
/// [`Transparent::own_dials`] for as long as it is open.
struct OwnDial {
    stream: TcpStream,
    local: Option<SocketAddr>,
    registry: OwnDials,
}

impl OwnDial {
    fn new(stream: TcpStream, registry: &OwnDials) -> OwnDial {
        let local = stream.local_addr().ok().map(canonical);
        if let (Some(local), Ok(mut set)) = (local, registry.lock()) {
            set.insert(local);
        }
        let _ = stream.set_nodelay(true);
        OwnDial {
            stream,
            local,
            registry: registry.clone(),
        }
    }
}

impl Drop for OwnDial {
    fn drop(&mut self) {
        if let (Some(local), Ok(mut set)) = (self.local, self.registry.lock()) {
            set.remove(&local);
        }
    }
}

impl Transparent {
    /// Phase 1, accept: the original destination, then the rest.
    async fn connection(self: Arc<Self>, stream: TcpStream, peer: SocketAddr) {
        let Some(dst) = self.original_dst(&stream) else {
            return;
        };
        self.redirected(stream, peer, dst).await;
    }

    /// A connection the kernel redirected from `dst`, phases 2 to 4.
    async fn redirected<C: Client>(
        self: Arc<Self>,
        mut client: C,
        peer: SocketAddr,
        dst: SocketAddr,
    ) {
        let started = Instant::now();
        let Some(Peeked {
            sniff,
            bytes,
            dial,
            unreached,
        }) = self.peek(&mut client, peer, dst).await
        else {
            return;
        };
        debug!(%dst, ?sniff, bytes = bytes.len(), "first bytes");
        match sniff {
            Sniff::Spoke(Protocol::Tls) => {
                // A dial opened for a silent client goes unused.
                drop(dial);
                self.tls(client, bytes, dst, started).await;
            }
            Sniff::Spoke(Protocol::Http | Protocol::Connect) => {
                drop(dial);
                self.http(Rewind::new(bytes, client), peer, dst).await;
            }
            Sniff::Spoke(Protocol::Opaque) => self.opaque(client, bytes, dst, dial, started).await,
            Sniff::Silent => self.silent(dst, dial, unreached, started).await,
            Sniff::Closed => match dial {
                // We reached the destination for a client that then left.
                Some(dial) => self.record_opaque_pass(dst, &dial, "opaque", started).await,
                None => debug!(%dst, "the client closed before sending anything"),
            },
        }
    }

    /// The original destination, or `None` (logged) when the connection was
    /// not redirected.
    fn original_dst(&self, stream: &TcpStream) -> Option<SocketAddr> {
        let dst = match sys::original_dst(stream) {
            Ok(dst) => canonical(dst),
            Err(e) => {
                warn!(error = %e, "no original destination for a connection on a transparent listener; closing it. Next: reach these listeners only through the nftables redirect");
                return None;
            }
        };
        if self.listeners.iter().any(|l| canonical(*l) == dst)
            || stream.local_addr().is_ok_and(|l| canonical(l) == dst)
        {
            warn!(%dst, "a connection reached a transparent listener directly, not through the redirect; closing it");
            return None;
        }
        Some(dst)
    }

    /// True (logged) when `peer` is one of our own passthrough dials, i.e. the
    /// redirect did not exempt the proxy. Asked once the first bytes are in
    /// (or the client was silent a while): our dial registers itself before
    /// it writes anything.
    fn looped(&self, peer: SocketAddr) -> bool {
        let looped = self.own_dials.lock().is_ok_and(|d| d.contains(&peer));
        if looped {
            warn!(%peer, "the proxy's own passthrough dial was redirected back to it; closing it. Next: exempt the proxy uid in the nftables rules (`meta skuid <proxy uid> return`) and run veris as that uid, or exempt its mark (`meta mark 0x76657269 return`, deploy/veris.nft)");
        }
        looped
    }

    /// Phase 2, peek: the client's first bytes ([`sniff::sniff`]), `None`
    /// for our own dial looping back. A client silent for
    /// [`SERVER_FIRST_WAIT`] may wait for a server that speaks first; where
    /// an opaque passthrough to `dst` would be allowed anyway, `dst` is
    /// dialed then and whoever speaks first decides: the server (an opaque
    /// relay over that dial) or the client, whose bytes are sniffed as
    /// usual — a ClientHello held back on purpose is still routed by its SNI.
    async fn peek<C: Client>(
        &self,
        client: &mut C,
        peer: SocketAddr,
        dst: SocketAddr,
    ) -> Option<Peeked> {
        let Waits {
            hello,
            server_first,
        } = self.waits;
        let may_pass = self.opaque_verdict(dst).is_ok();
        let first_wait = if may_pass { server_first } else { hello };
        let mut bytes = Vec::new();
        let sniffed = sniff::sniff(client, &mut bytes, first_wait, hello).await;
        if self.looped(peer) {
            return None;
        }
        if sniffed != Sniff::Silent || !may_pass {
            return Some(Peeked {
                sniff: sniffed,
                bytes,
                dial: None,
                unreached: None,
            });
        }
        let dial = match self.dial(dst).await {
            Ok(dial) => dial,
            Err(e) => {
                info!(error = %e, %dst, "the destination of a silent client is unreachable");
                return Some(Peeked {
                    sniff: Sniff::Silent,
                    bytes,
                    dial: None,
                    unreached: Some(e.to_string()),
                });
            }
        };
        let sniffed = tokio::select! {
            // The server spoke (or closed) first: opaque, relayed over this dial.
            _ = dial.stream.readable() => Sniff::Spoke(Protocol::Opaque),
            sniffed = sniff::sniff(client, &mut bytes, hello, hello) => sniffed,
        };
        Some(Peeked {
            sniff: sniffed,
            bytes,
            dial: Some(dial),
            unreached: None,
        })
    }

    /// Dials the original destination, bounded, registered as our own.
    async fn dial(&self, dst: SocketAddr) -> io::Result<OwnDial> {
        match tokio::time::timeout(
            self.proxy.connect_timeout,
            dial::connect_for_client(dst, self.proxy.upstream.upstream_proxy()),
        )
        .await
        {
            Ok(Ok(stream)) => Ok(OwnDial::new(stream, &self.own_dials)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer within {:?}", self.proxy.connect_timeout),
            )),
        }
    }

    /// Dials `dst`, or with `by_name` the name a gateway sandbox's client
    /// gave; bounded, registered as our own.
    async fn dial_for(&self, leg: &Leg, dst: SocketAddr, by_name: bool) -> io::Result<OwnDial> {
        if !by_name {
            return self.dial(dst).await;
        }
        match tokio::time::timeout(
            self.proxy.connect_timeout,
            dial::connect_host_for_client(&leg.host, leg.port, None),
        )
        .await
        {
            Ok(Ok(stream)) => Ok(OwnDial::new(stream, &self.own_dials)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer within {:?}", self.proxy.connect_timeout),
            )),
        }
    }

    /// Phase 3 for TLS: the rest of the ClientHello, then route by its SNI
    /// (or the original IP without one) and terminate, pass or refuse. A
    /// hello that turns out unusable is opaque after all.
    async fn tls<C: Client>(
        self: Arc<Self>,
        mut client: C,
        first: Vec<u8>,
        dst: SocketAddr,
        started: Instant,
    ) {
        let hello = match self.read_hello(&mut client, first).await {
            Ok(hello) => hello,
            Err(Some(bytes)) => return self.opaque(client, bytes, dst, None, started).await,
            Err(None) => return,
        };
        let leg = Leg {
            host: hello.sni.clone().unwrap_or_else(|| dst_name(dst)),
            port: dst.port(),
            tls: true,
            tier: self.tier,
            origin: Some(dst),
            sni_host: hello.sni.is_some(),
            via: None,
        };
        match self.route_tls(&leg).await {
            Verdict::Terminate => {
                debug!(host = %leg.host, %dst, "terminating a redirected connection");
                let io = Rewind::new(hello.raw, client);
                self.proxy.clone().terminate(io, leg).await;
            }
            Verdict::Pass(reason) => self.pass_tls(client, hello, leg, reason, started).await,
            Verdict::Refuse(reason) => {
                info!(host = %leg.host, %dst, %reason, "refused a redirected TLS connection (recorded as blocked). Next: route the host to a twin service, allow it, or connect to an address its name stands for; passthrough mode lets it through, recorded");
                self.proxy
                    .record_or_log(Entry::Blocked(BlockedLine {
                        host: leg.host.clone(),
                        port: leg.port,
                        tier: leg.tier,
                        method: None,
                        path: None,
                        reason,
                        dst: leg.headed_to(),
                    }))
                    .await;
            }
        }
    }

    /// The rest of a ClientHello that began with `first`, bounded in bytes
    /// ([`MAX_CLIENT_HELLO`]) and time. `Err(Some)` gives back every byte
    /// read when they make no usable hello (they are opaque after all),
    /// `Err(None)` means the client left.
    async fn read_hello<C: Client>(
        &self,
        client: &mut C,
        first: Vec<u8>,
    ) -> Result<ClientHello, Option<Vec<u8>>> {
        let mut parser = Parser::new(MAX_CLIENT_HELLO);
        let read = match parser.push(&first) {
            Ok(Some(hello)) => return Ok(hello),
            Ok(None) => {
                let rest = clienthello::read_with(client, &mut parser);
                tokio::time::timeout(self.waits.hello, rest).await
            }
            Err(e) => Ok(Err(e)),
        };
        match read {
            Ok(Ok(hello)) => Ok(hello),
            Ok(Err(e @ (ClientHelloError::Closed { .. } | ClientHelloError::Io(_)))) => {
                info!(error = %e, "the client left during its ClientHello");
                Err(None)
            }
            Ok(Err(e)) => {
                info!(error = %e, "not a usable TLS ClientHello; taking the connection as opaque");
                Err(Some(parser.buffered().to_vec()))
            }
            Err(_) => {
                info!(
                    "no complete ClientHello within {:?}; taking the connection as opaque",
                    self.waits.hello
                );
                Err(Some(parser.buffered().to_vec()))
            }
        }
    }

    /// Phase 3's decision for a TLS connection, by the name it gave.
    async fn route_tls(&self, leg: &Leg) -> Verdict {
        let proxy = &self.proxy;
        let strict = proxy.identity.mode == Mode::Strict;
        let route = proxy.router.route_connection(&leg.host);
        match route {
            Route::Service(_) | Route::Canary => Verdict::Terminate,
            Route::Loopback | Route::Allowed => {
                let reason = if route == Route::Loopback {
                    "loopback"
                } else {
                    "allow_passthrough"
                };
                match proxy.name_mismatch(leg, route).await {
                    None => Verdict::Pass(reason),
                    Some(why) if strict => Verdict::Refuse(format!(
                        "strict mode: name does not match the destination: {why}"
                    )),
                    // Let through by the mode, not by the name.
                    Some(_) => Verdict::Pass("mode"),
                }
            }
            Route::Unmapped if !strict => {
                Verdict::Pass(if leg.sni_host { "mode" } else { "no_sni" })
            }
            // Strict without a name: no leaf the client could accept, so the
            // refusal is the closed connection, recorded.
            Route::Unmapped if !leg.sni_host => Verdict::Refuse(
                "strict mode: TLS without SNI to an address no service routes".into(),
            ),
            // Strict with a name: terminate so the refusal reaches the client as words.
            Route::Unmapped => Verdict::Terminate,
        }
    }

    /// A TLS passthrough: noted when the hello carries ECH, then relayed to
    /// the original destination with the hello replayed.
    async fn pass_tls<C: Client>(
        &self,
        client: C,
        hello: ClientHello,
        leg: Leg,
        reason: &str,
        started: Instant,
    ) {
        if hello.ech {
            self.proxy
                .record_or_log(Entry::Ech {
                    host: leg.host.clone(),
                    port: leg.port,
                    tier: leg.tier,
                    dst: leg.origin.map(|o| o.to_string()),
                })
                .await;
        }
        self.relay(client, hello.raw, &leg, reason, None, started)
            .await;
    }

    /// Phase 3 for HTTP: each request is routed by its Host (else its URI
    /// authority, else the original IP), and a passthrough goes back to the
    /// address the client dialed. A `CONNECT` — the client thinks `dst` is a
    /// proxy — is handled as the explicit tier's own: vendor hosts
    /// terminated and served by the twin, the rest tunneled or refused.
    async fn http<IO>(self: Arc<Self>, io: IO, peer: SocketAddr, dst: SocketAddr)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let head_timeout = self.proxy.limits.request_head;
        let tier = self.tier;
        let proxy = self.proxy.clone();
        let cancel = proxy.cancel.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            let proxy = proxy.clone();
            async move {
                if req.method() == Method::CONNECT {
                    return Ok::<_, Infallible>(proxy.connect(req, peer, Some(dst)).await);
                }
                let named = request_host(&req)
                    .map(|h| Host::new(&h).into_string())
                    .filter(|h| !h.is_empty());
                // A gateway sandbox's request that names its host is passed
                // to that name (resolved here, checked by the dial policy),
                // never to an address the name does not resolve to.
                let origin = match (&named, tier) {
                    (Some(_), ListenerTier::Gateway) => None,
                    _ => Some(dst),
                };
                let leg = Leg {
                    host: named.unwrap_or_else(|| dst_name(dst)),
                    port: dst.port(),
                    tls: false,
                    tier,
                    origin,
                    sni_host: false,
                    via: None,
                };
                Ok(proxy.handle(req, Arc::new(leg)).await)
            }
        });
        if let Err(e) = serve_auto(io, service, &cancel, head_timeout).await {
            debug!(error = %e, "redirected HTTP connection ended with an error");
        }
    }

    /// What opaque bytes (neither TLS nor HTTP) to `dst` may do: `Ok` with
    /// the passthrough reason for an allowed or unmapped address in
    /// passthrough mode; `Err` with the refusal's reason for an address a
    /// service routes (the twin stands in for it and cannot serve them) and
    /// in strict mode.
    fn opaque_verdict(&self, dst: SocketAddr) -> Result<&'static str, String> {
        let proxy = &self.proxy;
        match proxy.router.route_connection(&dst_name(dst)) {
            Route::Service(_) | Route::Canary => Err(format!(
                "opaque TCP (neither TLS nor HTTP) to {dst}, an address routed to a twin, which cannot serve it"
            )),
            Route::Allowed => Ok("allow_passthrough"),
            Route::Loopback => Ok("loopback"),
            Route::Unmapped if proxy.identity.mode == Mode::Passthrough => Ok("opaque"),
            Route::Unmapped => Err(
                "strict mode: opaque TCP (neither TLS nor HTTP) to an address no service routes"
                    .into(),
            ),
        }
    }

    /// Phase 3 for opaque bytes: relayed to the original destination
    /// (replaying `first`, over `dial` when a silent client made us open
    /// it), or refused.
    async fn opaque<C: Client>(
        &self,
        client: C,
        first: Vec<u8>,
        dst: SocketAddr,
        dial: Option<OwnDial>,
        started: Instant,
    ) {
        match self.opaque_verdict(dst) {
            Ok(reason) => {
                let leg = opaque_leg(dst, self.tier);
                self.relay(client, first, &leg, reason, dial, started).await;
            }
            Err(reason) => {
                info!(%dst, %reason, "refused a redirected opaque connection");
                self.record_opaque_block(dst, reason).await;
            }
        }
    }

    /// A client that sent nothing in time: refused (strict mode, vendor
    /// addresses), or — passthrough, nobody spoke on the dial we opened
    /// either — closed and recorded, so an idle pair holds no task forever.
    async fn silent(
        &self,
        dst: SocketAddr,
        dial: Option<OwnDial>,
        unreached: Option<String>,
        started: Instant,
    ) {
        match self.opaque_verdict(dst) {
            Err(reason) => {
                let reason = format!(
                    "{reason} (the client sent nothing within {:?})",
                    self.waits.hello
                );
                info!(%dst, %reason, "refused a silent redirected connection");
                self.record_opaque_block(dst, reason).await;
            }
            Ok(reason) => {
                info!(%dst, reached = dial.is_some(), "neither side spoke; closing");
                match dial {
                    Some(dial) => self.record_opaque_pass(dst, &dial, reason, started).await,
                    // The destination did not answer.
                    None => {
                        let why = unreached.unwrap_or_else(|| "not dialed".into());
                        self.proxy
                            .record_unreached(&opaque_leg(dst, self.tier), reason, started, why)
                            .await
                    }
                }
            }
        }
    }

    async fn record_opaque_block(&self, dst: SocketAddr, reason: String) {
        self.proxy
            .record_or_log(Entry::Blocked(BlockedLine {
                host: dst_name(dst),
                port: dst.port(),
                tier: self.tier,
                method: None,
                path: None,
                reason,
                dst: Some(dst.to_string()),
            }))
            .await;
    }

    /// A passthrough that moved nothing: the destination was dialed for a
    /// client that never spoke.
    async fn record_opaque_pass(
        &self,
        dst: SocketAddr,
        dial: &OwnDial,
        reason: &str,
        started: Instant,
    ) {
        let leg = opaque_leg(dst, self.tier);
        let _ = self
            .proxy
            .record_passthrough(&leg, reason, Some(reached(dst, dial)), (0, 0), started)
            .await;
    }

    /// Phase 4 of a passthrough: dial the original destination (or use the
    /// dial a silent client made us open), replay the bytes read so far,
    /// relay both ways, and record the address dialed with the bytes moved.
    async fn relay<C: Client>(
        &self,
        client: C,
        first: Vec<u8>,
        leg: &Leg,
        reason: &str,
        dial: Option<OwnDial>,
        started: Instant,
    ) {
        let proxy = &self.proxy;
        // Invariant: every transparent leg that reaches here carries its
        // original destination; without one there is nowhere to go.
        let Some(dst) = leg.origin else {
            return;
        };
        // The gateway tier, a client that named its host: the platform gave
        // only an address, and the name is what is dialed (resolved here,
        // each address checked by the dial policy), never an address the
        // name does not resolve to.
        let by_name = self.tier == ListenerTier::Gateway && leg.sni_host;
        let mut origin = match dial {
            Some(dial) => dial,
            None => match self.dial_for(leg, dst, by_name).await {
                Ok(dial) => dial,
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                    // Refused by policy (the host's loopback from an
                    // isolated run): nothing passed, so it is a refusal.
                    info!(error = %e, %dst, "refused a passthrough destination");
                    proxy
                        .record_or_log(Entry::Blocked(BlockedLine {
                            host: leg.host.clone(),
                            port: leg.port,
                            tier: leg.tier,
                            method: None,
                            path: None,
                            reason: e.to_string(),
                            // Dialed by name: the platform's address was
                            // never a destination (the reason names the
                            // one the name resolved to).
                            dst: (!by_name).then(|| dst.to_string()),
                        }))
                        .await;
                    return;
                }
                Err(e) => {
                    // The upstream proxy refused or failed: nothing reached
                    // `dst`, and the ledger says why, as in the explicit tier
                    // (the client's connection just closes: no status line
                    // can be sent inside its TLS).
                    if let Some(chain) = dial::ChainError::find(&e) {
                        proxy
                            .record_upstream_proxy_failure(leg, reason, started, chain)
                            .await;
                        return;
                    }
                    info!(error = %e, %dst, "passthrough destination unreachable");
                    proxy
                        .record_unreached(leg, reason, started, e.to_string())
                        .await;
                    return;
                }
            },
        };
        let at = match by_name {
            true => origin.stream.peer_addr().map(canonical).unwrap_or(dst),
            false => reached(dst, &origin),
        };
        // The address the bytes go to: for a synthetic destination (or a
        // gateway's dial by name), the real one its name resolved to. Recorded when the tunnel opens (a
        // tunnel still open when the proxy stops is in the ledger too); no
        // byte passes unrecorded.
        let Ok(open) = proxy
            .record_passthrough(leg, reason, Some(at), (0, 0), started)
            .await
        else {
            return;
        };
        let (mut client, meter) = crate::body::meter::Metered::new(client);
        let (replayed, error) = match origin.stream.write_all(&first).await {
            Ok(()) => (
                first.len() as u64,
                tokio::io::copy_bidirectional(&mut client, &mut origin.stream)
                    .await
                    .err()
                    .map(|e| e.to_string()),
            ),
            Err(e) => (0, Some(format!("replaying the first bytes failed: {e}"))),
        };
        let up = replayed + meter.read();
        drop(origin);
        proxy
            .record_tunnel_close(open, (up, meter.written()), started, error)
            .await;
    }
}

/// The address the bytes to `dst` go to over `dial`: for a synthetic
/// destination, the real one its name resolved to, never veris's own
/// DNS answer.
fn reached(dst: SocketAddr, dial: &OwnDial) -> SocketAddr {
    match dial::synthetic_name(dst.ip()) {
        Some(_) => dial.stream.peer_addr().map(canonical).unwrap_or(dst),
        None => dst,
    }
}

/// The leg of an opaque connection: named by its original IP.
fn opaque_leg(dst: SocketAddr, tier: ListenerTier) -> Leg {
    Leg {
        host: dst_name(dst),
        port: dst.port(),
        tls: false,
        tier,
        origin: Some(dst),
        sni_host: false,
        via: None,
    }
}

/// An IO that first yields bytes already read from `inner` (the ClientHello),
/// then reads from `inner`; writes go straight to `inner`.
pub struct Rewind<IO> {
    prefix: Vec<u8>,
    pos: usize,
    inner: IO,
}

impl<IO> Rewind<IO> {
    pub fn new(prefix: Vec<u8>, inner: IO) -> Rewind<IO> {
        Rewind {
            prefix,
            pos: 0,
            inner,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Rewind<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pos < this.prefix.len() {
            let n = buf.remaining().min(this.prefix.len() - this.pos);
            buf.put_slice(&this.prefix[this.pos..this.pos + n]);
            this.pos += n;
            if this.pos == this.prefix.len() {
                this.prefix = Vec::new();
                this.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Rewind<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// Hands out one byte per read, like a ClientHello in one-byte segments.
    struct OneByte<IO>(IO);

    impl<IO: AsyncRead + Unpin> AsyncRead for OneByte<IO> {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let mut one = [0u8; 1];
            let mut small = ReadBuf::new(&mut one);
            let this = self.get_mut();
            match Pin::new(&mut this.0).poll_read(cx, &mut small) {
                Poll::Ready(Ok(())) => {
                    buf.put_slice(small.filled());
                    Poll::Ready(Ok(()))
                }
                other => other,
            }
        }
    }

    #[tokio::test]
    async fn a_real_post_quantum_hello_read_byte_by_byte_is_replayed_into_rustls() {
        let dir = std::env::temp_dir().join(format!("veris-rewind-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (ca, _) = veris_ca::CertificateAuthority::load_or_create(
            &dir,
            &crate::scope::scope(None, &["example".into()]).unwrap(),
        )
        .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert_der().clone()).unwrap();
        let issuer = veris_ca::Issuer::new(Arc::new(ca), 8);
        // A hybrid post-quantum key share first, as current browsers and curl builds send.
        let mut provider = rustls::crypto::aws_lc_rs::default_provider();
        provider.kx_groups = vec![
            rustls::crypto::aws_lc_rs::kx_group::X25519MLKEM768,
            rustls::crypto::aws_lc_rs::kx_group::X25519,
        ];
        let client_config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();

        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let client = tokio::spawn(async move {
            let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config));
            let name = rustls::pki_types::ServerName::try_from("api.stripe.com").unwrap();
            let mut tls = connector.connect(name, client_io).await.unwrap();
            tls.write_all(b"ping").await.unwrap();
            let mut pong = [0u8; 4];
            tls.read_exact(&mut pong).await.unwrap();
            pong
        });

        let mut server_io = server_io;
        let hello = clienthello::read(&mut OneByte(&mut server_io), MAX_CLIENT_HELLO)
            .await
            .unwrap();
        assert_eq!(hello.sni.as_deref(), Some("api.stripe.com"));
        // X25519MLKEM768's key share alone is 1216 bytes.
        assert!(hello.raw.len() > 1216, "hello of {} bytes", hello.raw.len());
        let start = tokio_rustls::LazyConfigAcceptor::new(
            rustls::server::Acceptor::default(),
            Rewind::new(hello.raw, server_io),
        )
        .await
        .unwrap();
        let key = issuer.certified_key("api.stripe.com").unwrap();
        let mut tls = start
            .into_stream(crate::inbound::tls::server_config(key))
            .await
            .unwrap();
        let mut ping = [0u8; 4];
        tls.read_exact(&mut ping).await.unwrap();
        assert_eq!(&ping, b"ping");
        tls.write_all(b"pong").await.unwrap();
        tls.flush().await.unwrap();
        assert_eq!(&client.await.unwrap(), b"pong");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn rewind_yields_the_prefix_then_the_stream() {
        let (mut a, b) = tokio::io::duplex(64);
        a.write_all(b" world").await.unwrap();
        drop(a);
        let mut r = Rewind::new(b"hello".to_vec(), b);
        let mut out = String::new();
        r.read_to_string(&mut out).await.unwrap();
        assert_eq!(out, "hello world");
    }
}

/// The transparent lifecycle driven in process: a connection accepted on
/// loopback is handed to [`Transparent::redirected`] with the original
/// destination the test names, as `SO_ORIGINAL_DST` would have given it.
/// Destinations that must look non-loopback are `0.0.0.0:port`, which Linux
/// delivers to a listener on 127.0.0.1: nothing leaves the machine.
#[cfg(test)]
mod lifecycle_tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use rustls::pki_types::{CertificateDer, ServerName};
    use tokio::io::AsyncReadExt;
    use tokio::sync::mpsc;
    use veris_receipt::{Entry, PassthroughLine, RequestLine, TlsAbandonedLine, TunnelCloseLine};

    use crate::config::{Flags, Settings};
    use crate::outbound::upstream::{Upstream, UpstreamOptions};
    use crate::request::recorder::MemoryRecorder;
    use crate::{Identity, ProxyOptions};

    /// The allowed host of these tests; the fake resolver puts it on 127.0.0.1.
    const ALLOWED: &str = "pkg.example";

    struct Fixture {
        state: Arc<Transparent>,
        recorder: Arc<MemoryRecorder>,
        ca: CertificateDer<'static>,
        dir: std::path::PathBuf,
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    async fn twin() -> String {
        let twin = veris_twin::Twin::new(veris_twin::TwinOptions {
            fixtures: veris_twin::Fixtures::builtin(),
            sandbox: None,
            log: None,
            credential: None,
        })
        .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(veris_twin::serve(
            listener,
            twin,
            None,
            std::future::pending(),
        ));
        url
    }

    /// A proxy in `mode` routing stripe to the built-in twin, allowing
    /// [`ALLOWED`], with short waits and a resolver that knows only
    /// [`ALLOWED`] (no DNS).
    async fn fixture(mode: Mode, tag: &str) -> Fixture {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "veris-transparent-{tag}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let (ca, _) = veris_ca::CertificateAuthority::load_or_create(
            &dir,
            &crate::scope::scope(None, &["example".into()]).unwrap(),
        )
        .unwrap();
        let ca_der = ca.cert_der().clone();
        let issuer = Arc::new(veris_ca::Issuer::new(Arc::new(ca), 16));
        let twin = twin().await;
        let settings = Settings::from_flags(Flags {
            listen: "127.0.0.1:0",
            twin: &twin,
            sandbox_id: "sbx",
            services: &["stripe".to_string()],
            routes: &[],
            mode,
            allow_passthrough: &[ALLOWED.to_string()],
        })
        .unwrap();
        let recorder = Arc::new(MemoryRecorder::default());
        let resolve: dial::Resolve = Arc::new(|host: String, port| {
            Box::pin(async move {
                if host == ALLOWED {
                    Ok(vec![SocketAddr::from(([127, 0, 0, 1], port))])
                } else {
                    Err(io::Error::new(io::ErrorKind::NotFound, "no such name"))
                }
            })
        });
        let proxy = Proxy::with_resolver(
            ProxyOptions {
                router: settings.router,
                identity: Identity {
                    run_id: "run1".into(),
                    sandbox_id: "sbx".into(),
                    canary: "cnry_00112233445566778899aabbccddeeff".into(),
                    mode,
                    tier: ListenerTier::Transparent,
                },
                twin_base: twin,
                twin_auth: None,
                upstream: Arc::new(Upstream::new(UpstreamOptions::default())),
                grace: Duration::from_secs(1),
                limits: crate::Limits::default(),
                capture: None,
            },
            issuer,
            recorder.clone(),
            resolve,
        );
        let state = Arc::new(Transparent {
            proxy,
            own_dials: OwnDials::default(),
            listeners: Vec::new(),
            waits: Waits {
                hello: Duration::from_millis(300),
                server_first: Duration::from_millis(50),
            },
            tier: ListenerTier::Transparent,
        });
        Fixture {
            state,
            recorder,
            ca: ca_der,
            dir,
        }
    }

    impl Fixture {
        /// A client connection the proxy takes as redirected from `dst`.
        async fn redirect(&self, dst: SocketAddr) -> TcpStream {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let client = TcpStream::connect(listener.local_addr().unwrap())
                .await
                .unwrap();
            let (server, peer) = listener.accept().await.unwrap();
            tokio::spawn(self.state.clone().redirected(server, peer, dst));
            client
        }

        /// TLS to `name` over a redirected connection, trusting only the veris CA.
        async fn tls(
            &self,
            tcp: TcpStream,
            name: &str,
        ) -> tokio_rustls::client::TlsStream<TcpStream> {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(self.ca.clone()).unwrap();
            let mut config = rustls::ClientConfig::builder()
                .with_root_certificates(roots)
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            let name = ServerName::try_from(name.to_string()).unwrap();
            tokio_rustls::TlsConnector::from(Arc::new(config))
                .connect(name, tcp)
                .await
                .expect("TLS verifies against the veris CA")
        }

        /// The entries once `n` are in.
        async fn entries(&self, n: usize) -> Vec<Entry> {
            tokio::time::timeout(Duration::from_secs(10), self.recorder.wait_for(n))
                .await
                .expect("the ledger lines arrive")
        }
    }

    /// A destination nothing may reach: a listener whose backlog is checked
    /// with a non-blocking accept (a dial completes in the kernel before the
    /// proxy records anything, so after the line a dial would be queued).
    struct Untouched(std::net::TcpListener);

    impl Untouched {
        fn new() -> Untouched {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.set_nonblocking(true).unwrap();
            Untouched(l)
        }
        /// As a non-loopback original destination.
        fn dst(&self) -> SocketAddr {
            SocketAddr::from(([0, 0, 0, 0], self.0.local_addr().unwrap().port()))
        }
        fn assert_untouched(&self) {
            match self.0.accept() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                other => panic!("the destination was reached: {other:?}"),
            }
        }
    }

    /// A destination that takes each connection, optionally greets first,
    /// reads until the client's end, answers `reply` and reports what it got.
    async fn vendor(
        greeting: Option<&'static [u8]>,
        reply: &'static [u8],
    ) -> (
        u16,
        mpsc::UnboundedReceiver<Vec<u8>>,
        Arc<tokio::sync::Notify>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = mpsc::unbounded_channel();
        let accepted = Arc::new(tokio::sync::Notify::new());
        let notify = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                notify.notify_one();
                let tx = tx.clone();
                tokio::spawn(async move {
                    if let Some(g) = greeting {
                        let _ = s.write_all(g).await;
                    }
                    let mut got = Vec::new();
                    let _ = s.read_to_end(&mut got).await;
                    let _ = s.write_all(reply).await;
                    let _ = tx.send(got);
                });
            }
        });
        (port, rx, accepted)
    }

    /// The first flight of a real TLS client for `name` (rustls).
    fn hello_for(name: &str) -> Vec<u8> {
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let name = ServerName::try_from(name.to_string()).unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        out
    }

    async fn read_all(s: &mut (impl AsyncRead + Unpin)) -> Vec<u8> {
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
        out
    }

    fn text(bytes: &[u8]) -> String {
        String::from_utf8_lossy(bytes).into_owned()
    }

    /// `(host, dst, reason)` of each passthrough line.
    fn passes(entries: &[Entry]) -> Vec<(String, Option<String>, String)> {
        entries
            .iter()
            .filter_map(|e| match e {
                Entry::Passthrough(PassthroughLine {
                    host, dst, reason, ..
                }) => Some((host.clone(), dst.clone(), reason.clone())),
                _ => None,
            })
            .collect()
    }

    /// `(host, dst, reason)` of each blocked line.
    fn blocks(entries: &[Entry]) -> Vec<(String, Option<String>, String)> {
        entries
            .iter()
            .filter_map(|e| match e {
                Entry::Blocked(BlockedLine {
                    host, dst, reason, ..
                }) => Some((host.clone(), dst.clone(), reason.clone())),
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn opaque_bytes_pass_to_the_original_destination_recorded() {
        let f = fixture(Mode::Passthrough, "opaque").await;
        let (port, mut got, _) = vendor(None, b"pong").await;
        let dst = SocketAddr::from(([0, 0, 0, 0], port));
        let mut client = f.redirect(dst).await;
        client.write_all(b"\x00\x01opaque").await.unwrap();
        client.shutdown().await.unwrap();
        assert_eq!(read_all(&mut client).await, b"pong");
        assert_eq!(got.recv().await.unwrap(), b"\x00\x01opaque");
        let entries = f.entries(2).await;
        match &entries[..2] {
            [Entry::Passthrough(PassthroughLine {
                host,
                port: p,
                tier,
                bytes_in: 0,
                bytes_out: 0,
                reason,
                dst: d,
                ..
            }), Entry::TunnelClose(TunnelCloseLine {
                of,
                bytes_in,
                bytes_out,
                error: None,
                ..
            })] => {
                assert_eq!(host, "0.0.0.0");
                assert_eq!(*p, port);
                assert_eq!(*tier, ListenerTier::Transparent);
                assert_eq!(reason, "opaque");
                assert_eq!(d.as_deref(), Some(dst.to_string().as_str()));
                // The close line counts what moved, the replayed first bytes too.
                assert_eq!(*of, 1);
                assert_eq!((*bytes_in, *bytes_out), (8, 4));
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn strict_mode_refuses_opaque_bytes_and_records_where_they_were_headed() {
        let f = fixture(Mode::Strict, "opaque-strict").await;
        let sink = Untouched::new();
        let mut client = f.redirect(sink.dst()).await;
        client
            .write_all(b"SSH-2.0-OpenSSH_9.2 x\r\n")
            .await
            .unwrap();
        assert_eq!(read_all(&mut client).await, b"", "closed, nothing relayed");
        let entries = f.entries(1).await;
        let (host, dst, reason) = &blocks(&entries)[0];
        assert_eq!(host, "0.0.0.0");
        assert_eq!(dst.as_deref(), Some(sink.dst().to_string().as_str()));
        assert!(reason.contains("opaque"), "{reason}");
        sink.assert_untouched();
    }

    #[tokio::test]
    async fn strict_mode_refuses_a_silent_client_after_the_wait() {
        let f = fixture(Mode::Strict, "silent-strict").await;
        let sink = Untouched::new();
        let mut client = f.redirect(sink.dst()).await;
        assert_eq!(read_all(&mut client).await, b"");
        let entries = f.entries(1).await;
        let (_, dst, reason) = &blocks(&entries)[0];
        assert_eq!(dst.as_deref(), Some(sink.dst().to_string().as_str()));
        assert!(reason.contains("sent nothing"), "{reason}");
        sink.assert_untouched();
    }

    #[tokio::test]
    async fn a_server_that_speaks_first_is_reached_after_a_short_silence() {
        let f = fixture(Mode::Passthrough, "server-first").await;
        let (port, mut got, _) = vendor(Some(b"220 ready\r\n"), b"221 bye\r\n").await;
        let dst = SocketAddr::from(([0, 0, 0, 0], port));
        let mut client = f.redirect(dst).await;
        // Waits for the greeting, as an SMTP client does.
        let mut greeting = [0u8; 11];
        client.read_exact(&mut greeting).await.unwrap();
        assert_eq!(&greeting, b"220 ready\r\n");
        client.write_all(b"QUIT\r\n").await.unwrap();
        client.shutdown().await.unwrap();
        assert_eq!(read_all(&mut client).await, b"221 bye\r\n");
        assert_eq!(got.recv().await.unwrap(), b"QUIT\r\n");
        let entries = f.entries(1).await;
        assert_eq!(
            passes(&entries),
            [("0.0.0.0".into(), Some(dst.to_string()), "opaque".into())]
        );
    }

    #[tokio::test]
    async fn a_client_hello_held_back_past_the_silence_is_still_intercepted() {
        let f = fixture(Mode::Passthrough, "held-back").await;
        let (port, mut got, accepted) = vendor(None, b"").await;
        let dst = SocketAddr::from(([0, 0, 0, 0], port));
        let client = f.redirect(dst).await;
        // The proxy dialed the destination for a silent client...
        accepted.notified().await;
        // ...and the hello that follows still decides: terminated, served by the twin.
        let mut tls = f.tls(client, "api.stripe.com").await;
        tls.write_all(
            b"GET /v1/customers HTTP/1.1\r\nHost: api.stripe.com\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        let resp = text(&read_all(&mut tls).await);
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
        assert!(resp.contains("\"list\""), "{resp}");
        // The destination got a connection and not one byte.
        assert_eq!(got.recv().await.unwrap(), b"");
        let entries = f.entries(1).await;
        assert!(
            matches!(&entries[0], Entry::Request(RequestLine { service, tier, .. })
                if service == "stripe" && *tier == ListenerTier::Transparent),
            "{entries:?}"
        );
        assert!(passes(&entries).is_empty(), "{entries:?}");
    }

    #[tokio::test]
    async fn a_connect_meant_for_another_proxy_is_served_by_the_twin() {
        let f = fixture(Mode::Strict, "connect").await;
        let outside_proxy = Untouched::new();
        let mut client = f.redirect(outside_proxy.dst()).await;
        client
            .write_all(b"CONNECT api.stripe.com:443 HTTP/1.1\r\nHost: api.stripe.com:443\r\n\r\n")
            .await
            .unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            assert_eq!(client.read(&mut b).await.unwrap(), 1, "{head:?}");
            head.push(b[0]);
        }
        assert!(head.starts_with(b"HTTP/1.1 200"), "{}", text(&head));
        let mut tls = f.tls(client, "api.stripe.com").await;
        tls.write_all(
            b"GET /v1/customers HTTP/1.1\r\nHost: api.stripe.com\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        let resp = text(&read_all(&mut tls).await);
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
        let entries = f.entries(1).await;
        assert!(
            matches!(&entries[0], Entry::Request(RequestLine { service, host, tier, .. })
                if service == "stripe" && host == "api.stripe.com" && *tier == ListenerTier::Transparent),
            "{entries:?}"
        );
        outside_proxy.assert_untouched();
    }

    #[tokio::test]
    async fn plain_http_on_any_port_is_routed_by_its_host() {
        let f = fixture(Mode::Strict, "http-any-port").await;
        let sink = Untouched::new();
        let mut client = f.redirect(sink.dst()).await;
        client
            .write_all(
                b"GET /v1/customers HTTP/1.1\r\nHost: api.stripe.com\r\nConnection: close\r\n\r\n",
            )
            .await
            .unwrap();
        let resp = text(&read_all(&mut client).await);
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
        let entries = f.entries(1).await;
        assert!(
            matches!(&entries[0], Entry::Request(RequestLine { service, .. }) if service == "stripe"),
            "{entries:?}"
        );
        sink.assert_untouched();
    }

    #[tokio::test]
    async fn strict_mode_refuses_loopback_and_allowed_names_on_other_destinations() {
        let f = fixture(Mode::Strict, "lying-strict").await;
        let sink = Untouched::new();
        for (i, name) in ["x.localhost", "localhost", ALLOWED]
            .into_iter()
            .enumerate()
        {
            let mut client = f.redirect(sink.dst()).await;
            client.write_all(&hello_for(name)).await.unwrap();
            assert_eq!(read_all(&mut client).await, b"", "{name}: closed");
            let entries = f.entries(i + 1).await;
            let (host, dst, reason) = &blocks(&entries)[i];
            assert_eq!(host, name);
            assert_eq!(dst.as_deref(), Some(sink.dst().to_string().as_str()));
            assert!(
                reason.contains("name does not match the destination"),
                "{reason}"
            );
        }
        // Plain HTTP naming a loopback host: refused in words, per request.
        let mut client = f.redirect(sink.dst()).await;
        client
            .write_all(b"GET /admin HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let resp = text(&read_all(&mut client).await);
        assert!(resp.starts_with("HTTP/1.1 421"), "{resp}");
        assert!(resp.contains("veris_name_mismatch"), "{resp}");
        let entries = f.entries(4).await;
        match &entries[3] {
            Entry::Blocked(BlockedLine {
                host,
                method,
                path,
                dst,
                ..
            }) => {
                assert_eq!(host, "localhost");
                assert_eq!(method.as_deref(), Some("GET"));
                assert_eq!(path.as_deref(), Some("/admin"));
                assert_eq!(dst.as_deref(), Some(sink.dst().to_string().as_str()));
            }
            other => panic!("{other:?}"),
        }
        sink.assert_untouched();
    }

    #[tokio::test]
    async fn strict_mode_passes_an_allowed_name_on_its_own_address() {
        let f = fixture(Mode::Strict, "allowed-strict").await;
        let (port, mut got, _) = vendor(None, b"").await;
        let dst = SocketAddr::from(([127, 0, 0, 1], port));
        let mut client = f.redirect(dst).await;
        let hello = hello_for(ALLOWED);
        client.write_all(&hello).await.unwrap();
        client.shutdown().await.unwrap();
        let _ = read_all(&mut client).await;
        assert_eq!(
            got.recv().await.unwrap(),
            hello,
            "the exact hello is replayed"
        );
        let entries = f.entries(1).await;
        assert_eq!(
            passes(&entries),
            [(
                ALLOWED.into(),
                Some(dst.to_string()),
                "allow_passthrough".into()
            )]
        );
    }

    #[tokio::test]
    async fn passthrough_mode_records_the_destination_a_lying_name_went_to() {
        let f = fixture(Mode::Passthrough, "lying-open").await;
        let (port, mut got, _) = vendor(None, b"").await;
        let dst = SocketAddr::from(([0, 0, 0, 0], port));
        let mut client = f.redirect(dst).await;
        let hello = hello_for("x.localhost");
        client.write_all(&hello).await.unwrap();
        client.shutdown().await.unwrap();
        let _ = read_all(&mut client).await;
        // Dialed by its original address, never by the name.
        assert_eq!(got.recv().await.unwrap(), hello);
        let entries = f.entries(1).await;
        assert_eq!(
            passes(&entries),
            [("x.localhost".into(), Some(dst.to_string()), "mode".into())]
        );
    }

    /// The `(stage, alert)` of each `tls_abandoned` line, and how many
    /// `trust_failure` lines there are.
    fn abandoned(entries: &[Entry]) -> (Vec<(String, Option<String>)>, usize) {
        let stages = entries
            .iter()
            .filter_map(|e| match e {
                Entry::TlsAbandoned(TlsAbandonedLine {
                    host,
                    stage,
                    alert,
                    tier,
                    service,
                    ..
                }) => {
                    assert_eq!(host, "api.stripe.com");
                    assert_eq!(*tier, ListenerTier::Transparent);
                    assert_eq!(service.as_deref(), Some("stripe"));
                    Some((stage.clone(), alert.clone()))
                }
                _ => None,
            })
            .collect();
        let refusals = entries
            .iter()
            .filter(|e| matches!(e, Entry::TrustFailure(_)))
            .count();
        (stages, refusals)
    }

    #[tokio::test]
    async fn a_hello_then_a_close_is_an_abandoned_handshake_not_a_refusal() {
        let f = fixture(Mode::Strict, "abandoned").await;
        let sink = Untouched::new();
        let mut client = f.redirect(sink.dst()).await;
        client
            .write_all(&hello_for("api.stripe.com"))
            .await
            .unwrap();
        // Our flight arrives; the client leaves without a word.
        let mut first = [0u8; 1];
        client.read_exact(&mut first).await.unwrap();
        drop(client);
        let entries = f.entries(1).await;
        assert_eq!(
            abandoned(&entries),
            (vec![("handshake".to_string(), None)], 0),
            "{entries:?}"
        );
        sink.assert_untouched();
    }

    #[tokio::test]
    async fn a_finished_handshake_closed_without_a_request_is_recorded() {
        let f = fixture(Mode::Strict, "no-request").await;
        let sink = Untouched::new();
        let client = f.redirect(sink.dst()).await;
        let mut tls = f.tls(client, "api.stripe.com").await;
        tls.shutdown().await.unwrap();
        drop(tls);
        let entries = f.entries(1).await;
        assert_eq!(
            abandoned(&entries),
            (vec![("no_request".to_string(), None)], 0),
            "{entries:?}"
        );
        // A connection that did send its request is not flagged.
        let client = f.redirect(sink.dst()).await;
        let mut tls = f.tls(client, "api.stripe.com").await;
        tls.write_all(
            b"GET /v1/customers HTTP/1.1\r\nHost: api.stripe.com\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        let resp = text(&read_all(&mut tls).await);
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
        drop(tls);
        let entries = f.entries(2).await;
        assert!(matches!(entries[1], Entry::Request(_)), "{entries:?}");
        // Give a wrongly recorded close a chance to arrive before counting.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(abandoned(&f.recorder.entries()).0.len(), 1);
        sink.assert_untouched();
    }

    #[tokio::test]
    async fn garbage_after_a_tls_record_header_is_opaque() {
        let f = fixture(Mode::Strict, "bad-hello").await;
        let sink = Untouched::new();
        let mut client = f.redirect(sink.dst()).await;
        // A handshake record whose message is not a ClientHello.
        client
            .write_all(b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00")
            .await
            .unwrap();
        assert_eq!(read_all(&mut client).await, b"");
        let entries = f.entries(1).await;
        let (_, _, reason) = &blocks(&entries)[0];
        assert!(reason.contains("opaque"), "{reason}");
        sink.assert_untouched();
    }
}
