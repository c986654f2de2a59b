//! The proxy's own outbound TCP dials (passthrough re-dials, CONNECT tunnels,
//! the upstream client's connections), the name resolution they use, and the
//! mark that exempts them from the transparent tier's redirect.
//!
//! In an isolated run the child's DNS is answered by veris's stub
//! ([`crate::inbound::dns`]) with synthetic addresses; once [`answer_synthetic_with`]
//! registers its table, a dial to a synthetic address goes to the name it
//! stands for, resolved here on the proxy's side, which is where the
//! passthrough really goes.
//!
//! Loopback names (`localhost`, `*.localhost`) are loopback by definition
//! (RFC 6761 §6.3) and never reach a resolver: [`resolve`] answers them
//! itself, so a workload cannot point them elsewhere through DNS.
//!
//! The redirect (deploy/veris.nft) lets a socket leave when its owner is the
//! proxy uid (`meta skuid`) or when it carries [`EXEMPT_MARK`] (`meta mark`).
//! The uid rule is the root path: veris installs the rules, then drops to the
//! proxy uid. In a rootless network namespace (`unshare -rn`) only uid 0 is
//! mapped, so proxy and workload share a uid and only the mark tells them
//! apart; there veris keeps CAP_NET_ADMIN of the namespace, which `SO_MARK`
//! needs. After the root path's privilege drop the mark is refused (`EPERM`),
//! which is fine: the uid rule covers it, so the refusal is logged at debug
//! once and marking stops.
//!
//! With `--upstream-proxy` ([`ChainProxy`]), a dial made for a client (a
//! passthrough) goes through that HTTP proxy with `CONNECT host:port`
//! instead of straight to its destination: the name (or the address the
//! client dialed) is handed to the upstream proxy, which resolves it (from
//! an isolated run, a name that resolves here to this host is refused
//! first). The proxy's own dials (the twin) and loopback destinations never
//! use it.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::Uri;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpSocket, TcpStream};
use tracing::debug;

use crate::sys;
use veris_host::is_loopback;

/// An HTTP proxy that clients' passthrough dials are chained through with
/// `CONNECT` (a corporate proxy in front of the sandbox's egress). Its
/// credentials, from the URL's userinfo, travel as `Proxy-Authorization:
/// Basic` and are never shown ([`fmt::Display`] leaves them out).
#[derive(Clone, PartialEq, Eq)]
pub struct ChainProxy {
    host: String,
    port: u16,
    authorization: Option<String>,
}

impl ChainProxy {
    /// `http://[user[:password]@]host[:port][/]`; the port defaults to 80.
    pub fn parse(url: &str) -> Result<ChainProxy, String> {
        let rest = match url.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
            Some((scheme, _)) => {
                return Err(format!(
                "the upstream proxy must be an http:// URL (a {scheme}:// proxy is not supported)"
            ))
            }
            None => url,
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains(['/', '?', '#']) {
            return Err("the upstream proxy URL takes no path, query or fragment".into());
        }
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let parsed: http::uri::Authority = hostport.parse().map_err(|e| {
            format!("the upstream proxy address {hostport:?} is not host[:port]: {e}")
        })?;
        let host = parsed.host().to_string();
        if host.is_empty() {
            return Err("the upstream proxy URL has no host".into());
        }
        let port = match parsed.port() {
            Some(p) => p.as_u16(),
            None if hostport.ends_with(':') => {
                return Err("the upstream proxy URL has an empty port".into())
            }
            None => 80,
        };
        if port == 0 {
            return Err("the upstream proxy's port must be 1 to 65535".into());
        }
        let authorization = userinfo.map(|u| {
            use base64::Engine as _;
            let decoded = crate::request::reserved::percent_decode(u.as_bytes())
                .unwrap_or_else(|| u.as_bytes().to_vec());
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(decoded)
            )
        });
        Ok(ChainProxy {
            host,
            port,
            authorization,
        })
    }

    /// `CONNECT target` through this proxy; the stream is the tunnel once
    /// the proxy said 2xx, with nothing of the destination's read yet.
    async fn connect(&self, target: &str) -> io::Result<TcpStream> {
        let mut stream = connect_host(&self.host, self.port)
            .await
            .map_err(|e| chain_error(self, target, ChainFailure::Unreachable(e.to_string())))?;
        let mut head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
        if let Some(auth) = &self.authorization {
            head.push_str(&format!("Proxy-Authorization: {auth}\r\n"));
        }
        head.push_str("\r\n");
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        stream
            .write_all(head.as_bytes())
            .await
            .map_err(|e| chain_error(self, target, ChainFailure::Unreachable(e.to_string())))?;
        // The reply head, a byte at a time: a server that speaks first may
        // send its greeting right behind it, and those bytes are the
        // client's. The head is small and this happens once per tunnel.
        let mut reply = Vec::with_capacity(128);
        let mut byte = [0u8; 1];
        while !reply.ends_with(b"\r\n\r\n") {
            if reply.len() >= MAX_CONNECT_REPLY {
                return Err(chain_error(
                    self,
                    target,
                    ChainFailure::BadReply(format!("a reply head over {MAX_CONNECT_REPLY} bytes")),
                ));
            }
            match stream.read(&mut byte).await {
                Ok(0) => {
                    return Err(chain_error(
                        self,
                        target,
                        ChainFailure::BadReply("it closed the connection without a reply".into()),
                    ))
                }
                Ok(_) => reply.push(byte[0]),
                Err(e) => {
                    return Err(chain_error(
                        self,
                        target,
                        ChainFailure::Unreachable(e.to_string()),
                    ))
                }
            }
        }
        let status_line = String::from_utf8_lossy(&reply);
        let status_line = status_line.lines().next().unwrap_or("").trim().to_string();
        let mut words = status_line.splitn(3, ' ');
        let (version, code) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        match code.parse::<u16>() {
            Ok(code) if version.starts_with("HTTP/1.") && (200..300).contains(&code) => Ok(stream),
            Ok(code) if version.starts_with("HTTP/1.") => Err(chain_error(
                self,
                target,
                ChainFailure::Refused {
                    status: code,
                    line: status_line.clone(),
                },
            )),
            _ => Err(chain_error(
                self,
                target,
                ChainFailure::BadReply(format!("{status_line:?} is not an HTTP/1.x status line")),
            )),
        }
    }
}

impl fmt::Display for ChainProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') && !self.host.starts_with('[') {
            write!(f, "http://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "http://{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Debug for ChainProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChainProxy({self})")
    }
}

/// The longest `CONNECT` reply head read from an upstream proxy.
const MAX_CONNECT_REPLY: usize = 16 * 1024;

/// What went wrong with the upstream proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainFailure {
    /// No connection to it (refused, reset, unreachable).
    Unreachable(String),
    /// It answered the `CONNECT` with a status other than 2xx.
    Refused { status: u16, line: String },
    /// Its answer was not an HTTP/1.x reply head.
    BadReply(String),
}

/// A dial through the upstream proxy that failed: which proxy, for which
/// destination, and how. Carried inside an `io::Error` (find it with
/// [`ChainError::find`]) so every dial path keeps its signature.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", self.describe())]
pub struct ChainError {
    pub proxy: String,
    pub target: String,
    pub failure: ChainFailure,
}

impl ChainError {
    fn describe(&self) -> String {
        let (proxy, target) = (&self.proxy, &self.target);
        match &self.failure {
            ChainFailure::Unreachable(e) => {
                format!("cannot reach the upstream proxy {proxy} (for {target}): {e}")
            }
            ChainFailure::Refused { line, .. } => {
                format!("the upstream proxy {proxy} answered CONNECT {target} with {line:?}")
            }
            ChainFailure::BadReply(why) => {
                format!(
                    "the upstream proxy {proxy} gave no usable answer to CONNECT {target}: {why}"
                )
            }
        }
    }

    /// The chain failure somewhere in `e`'s sources (an `io::Error` from a
    /// dial, or a client error wrapping one).
    pub fn find<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a ChainError> {
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(err) = next {
            if let Some(chain) = err.downcast_ref::<ChainError>() {
                return Some(chain);
            }
            if let Some(io) = err.downcast_ref::<io::Error>() {
                if let Some(chain) = io.get_ref().and_then(|i| i.downcast_ref::<ChainError>()) {
                    return Some(chain);
                }
            }
            next = err.source();
        }
        None
    }
}

fn chain_error(proxy: &ChainProxy, target: &str, failure: ChainFailure) -> io::Error {
    io::Error::other(ChainError {
        proxy: proxy.to_string(),
        target: target.to_string(),
        failure,
    })
}

/// `host:port` as a `CONNECT` target (an IPv6 literal bracketed).
fn connect_target(host: &str, port: u16) -> String {
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Name resolution as the proxy's checks use it: `(host, port)` to the
/// addresses it stands for. A function value so tests answer without DNS.
pub type Resolve =
    Arc<dyn Fn(String, u16) -> BoxFuture<'static, io::Result<Vec<SocketAddr>>> + Send + Sync>;

/// [`resolve`], as a [`Resolve`].
pub fn system_resolver() -> Resolve {
    Arc::new(|host, port| Box::pin(async move { resolve(&host, port).await }))
}

/// The packet mark of the proxy's own dials in the transparent tier: "veri",
/// the first four bytes of "veris" in ASCII (a mark is 32 bits). The ruleset
/// returns on it (`meta mark 0x76657269 return`).
pub const EXEMPT_MARK: u32 = 0x7665_7269;

/// Whether dials are marked: set once a transparent listener serves.
static MARKING: AtomicBool = AtomicBool::new(false);
/// Set when the kernel refused the mark (no CAP_NET_ADMIN): stop asking.
static MARK_REFUSED: AtomicBool = AtomicBool::new(false);

/// From now on this process's dials carry [`EXEMPT_MARK`] (when the kernel
/// lets us set it). One proxy runs per process, and the redirect exempts the
/// process's dials as a whole, so this is process-wide.
pub fn mark_own_dials() {
    MARKING.store(true, Ordering::Relaxed);
}

/// Whether this process may mark its dials: `SO_MARK` on a fresh socket
/// (CAP_NET_ADMIN in the user namespace owning our network namespace).
pub fn check_mark() -> io::Result<()> {
    let socket = TcpSocket::new_v4()?;
    sys::set_mark(&socket, EXEMPT_MARK)
}

/// The gateway's rule for every dial made for a sandbox ([`enforce`]).
static POLICY: OnceLock<crate::outbound::policy::DialPolicy> = OnceLock::new();

/// From now on every dial made for a client (a passthrough, in any form)
/// must pass `policy` (the gateway tier: one policy per process, for every
/// sandbox). The address is checked after the name is resolved, and that
/// checked address is what is dialed: no second lookup can move it.
pub fn enforce(policy: crate::outbound::policy::DialPolicy) {
    let _ = POLICY.set(policy);
}

/// Whether a dial policy is enforced (a gateway).
pub fn policy_enforced() -> bool {
    POLICY.get().is_some()
}

/// The DNS stub's names, once an isolated run registered them.
static SYNTHETIC: OnceLock<Arc<crate::inbound::dns::Names>> = OnceLock::new();

/// From now on dials and lookups of synthetic addresses go to the names
/// `names` handed them out for (one isolated run per process), and dials
/// made for a client never reach this host's loopback: an isolated run's
/// loopback is its own, so a client asking the proxy for "loopback" (a
/// `CONNECT 127.0.0.1:…`, a name that resolves there) is asking for the
/// host's.
pub fn answer_synthetic_with(names: Arc<crate::inbound::dns::Names>) {
    let _ = SYNTHETIC.set(names);
}

/// True in an isolated run (the DNS stub's table is registered).
pub fn isolated() -> bool {
    SYNTHETIC.get().is_some()
}

/// True when `ip` is this host itself: loopback, the unspecified address
/// (which connects to the local host), or an address of any of its
/// interfaces, IPv4 or IPv6 (a v4-mapped IPv6 address as its IPv4 one).
/// The interfaces are read when asked, so an address added later counts.
pub fn is_this_host(ip: std::net::IpAddr) -> bool {
    let ip = ip.to_canonical();
    if ip.is_loopback() || ip.is_unspecified() {
        return true;
    }
    match sys::interface_addresses() {
        Ok(own) => own.iter().any(|a| a.to_canonical() == ip),
        // Unknown: refuse rather than let the host be reached.
        Err(_) => true,
    }
}

/// Refuses a client's dial to `addr` where it would reach this host itself
/// from an isolated run ([`is_this_host`]): the run's own loopback is its
/// own, and the host is never reachable through veris.
fn refuse_host_for_client(addr: SocketAddr) -> io::Result<()> {
    if let Some(policy) = POLICY.get() {
        policy
            .check(addr.ip())
            .map_err(|refusal| io::Error::new(io::ErrorKind::PermissionDenied, refusal))?;
    }
    if SYNTHETIC.get().is_some() && is_this_host(addr.ip()) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{addr} is this host (its loopback or an address of one of its interfaces): an isolated run's loopback is its own, and veris does not reach the host for it"),
        ));
    }
    Ok(())
}

/// Connects to the first of `addrs` that answers. Otherwise an error of the
/// last one's kind whose words name every address tried and why each
/// failed: what a passthrough's ledger line says was really dialed.
async fn connect_first(addrs: Vec<SocketAddr>, for_client: bool) -> io::Result<TcpStream> {
    let mut tried = Vec::new();
    let mut kind = io::ErrorKind::NotFound;
    for addr in addrs {
        let dialed = match for_client {
            true => refuse_host_for_client(addr),
            false => Ok(()),
        };
        let (failed, text) = match dialed {
            Ok(()) => match connect_addr(addr).await {
                Ok(stream) => return Ok(stream),
                Err(e) => (e.kind(), format!("dialed {addr}: {e}")),
            },
            // It names the address itself.
            Err(e) => (e.kind(), e.to_string()),
        };
        kind = failed;
        tried.push(text);
    }
    Err(match tried.is_empty() {
        true => io::Error::new(kind, "the name resolved to no address"),
        false => io::Error::new(kind, tried.join("; ")),
    })
}

/// A dial made for a client (a passthrough): [`connect`], except that from
/// an isolated run it never reaches this host itself. With `via`, anything
/// but loopback goes through the upstream proxy: to the name a synthetic
/// address stands for, else to the address itself.
pub async fn connect_for_client(
    addr: SocketAddr,
    via: Option<&ChainProxy>,
) -> io::Result<TcpStream> {
    refuse_host_for_client(addr)?;
    if let Some(via) = via {
        let ip = addr.ip().to_canonical();
        if !(ip.is_loopback() || ip.is_unspecified()) {
            let host = if SYNTHETIC.get().is_some() && crate::inbound::dns::is_synthetic(ip) {
                match synthetic_name(ip).filter(|n| n.parse::<std::net::IpAddr>().is_err()) {
                    Some(name) => name,
                    None => {
                        return Err(io::Error::new(
                            io::ErrorKind::NotFound,
                            format!(
                                "{ip} is a synthetic address veris's DNS stub never handed out"
                            ),
                        ))
                    }
                }
            } else {
                ip.to_string()
            };
            refuse_host_name_for_client(&host, addr.port()).await?;
            return via.connect(&connect_target(&host, addr.port())).await;
        }
    }
    let addrs = unsynthesize(addr).await?.unwrap_or_else(|| vec![addr]);
    connect_first(addrs, true).await
}

/// [`connect_host`] for a client (a tunnel): from an isolated run it never
/// reaches this host itself. With `via`, a name that is not loopback goes
/// to the upstream proxy unresolved (it resolves it).
pub async fn connect_host_for_client(
    host: &str,
    port: u16,
    via: Option<&ChainProxy>,
) -> io::Result<TcpStream> {
    if let Some(via) = via {
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        // A literal (a redirected request's destination, maybe synthetic):
        // the address, or the name a synthetic one stands for.
        if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
            return Box::pin(connect_for_client(SocketAddr::new(ip, port), Some(via))).await;
        }
        if !goes_direct(host) {
            refuse_host_name_for_client(host, port).await?;
            return via.connect(&connect_target(host, port)).await;
        }
    }
    connect_first(resolve(host, port).await?, true).await
}

/// Whether a dial made for a client to `host:port` would pass the dial
/// policy ([`enforce`]): every address the name resolves to now, checked as
/// [`connect_host_for_client`] checks each one it dials. For refusing a
/// target up front (a gateway sandbox's webhook URL at registration); the
/// dial itself checks again, on the address it dials.
pub async fn check_host_for_client(host: &str, port: u16) -> io::Result<()> {
    for addr in resolve(host, port).await? {
        refuse_host_for_client(addr)?;
    }
    Ok(())
}

/// How long an isolated run's passthrough waits to resolve a name here
/// before handing it to the upstream proxy unchecked.
const NAME_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// From an isolated run, a name handed to the upstream proxy is first
/// resolved here, and refused where it names this host, as a direct dial
/// would be. The upstream proxy resolves it again, maybe to another answer,
/// and a name this host cannot resolve (in time) is left to it: the
/// session's coverage says an upstream proxy was used, and the receipt
/// names that in its leaks (`upstream-proxy-resolves-names`).
async fn refuse_host_name_for_client(host: &str, port: u16) -> io::Result<()> {
    if SYNTHETIC.get().is_none() || host.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    let Ok(Ok(addrs)) = tokio::time::timeout(NAME_CHECK_TIMEOUT, resolve(host, port)).await else {
        return Ok(());
    };
    for addr in addrs {
        if let Err(e) = refuse_host_for_client(addr) {
            return Err(io::Error::new(e.kind(), format!("{host} resolves to {e}")));
        }
    }
    Ok(())
}

/// Loopback destinations (names and literals) are dialed directly even
/// with an upstream proxy: it could not reach this host's loopback.
fn goes_direct(host: &str) -> bool {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let name = bare.trim_end_matches('.').to_ascii_lowercase();
    if is_loopback(&name) {
        return true;
    }
    name.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.to_canonical().is_loopback() || ip.is_unspecified())
}

/// The name a synthetic address stands for, when the stub handed it out.
pub fn synthetic_name(ip: std::net::IpAddr) -> Option<String> {
    SYNTHETIC.get()?.name_of(ip)
}

/// A synthetic address is dialed as its name: `Ok(None)` for any other
/// address, an error for one the stub never handed out.
async fn unsynthesize(addr: SocketAddr) -> io::Result<Option<Vec<SocketAddr>>> {
    if SYNTHETIC.get().is_none() || !crate::inbound::dns::is_synthetic(addr.ip()) {
        return Ok(None);
    }
    let Some(name) = synthetic_name(addr.ip()).filter(|n| n.parse::<std::net::IpAddr>().is_err())
    else {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{} is a synthetic address veris's DNS stub never handed out",
                addr.ip()
            ),
        ));
    };
    let real: Vec<SocketAddr> = resolve(&name, addr.port())
        .await?
        .into_iter()
        // A resolver answering inside the synthetic ranges would loop.
        .filter(|a| !crate::inbound::dns::is_synthetic(a.ip()))
        .collect();
    Ok(Some(real))
}

/// Connects to `addr` (a synthetic address: to its name), marked when
/// marking is on.
pub async fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let addrs = unsynthesize(addr).await?.unwrap_or_else(|| vec![addr]);
    connect_first(addrs, false).await
}

async fn connect_addr(addr: SocketAddr) -> io::Result<TcpStream> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    if MARKING.load(Ordering::Relaxed) && !MARK_REFUSED.load(Ordering::Relaxed) {
        if let Err(e) = sys::set_mark(&socket, EXEMPT_MARK) {
            if e.raw_os_error() == Some(libc::EPERM) {
                // The root path: the privilege drop took CAP_NET_ADMIN, and the
                // proxy uid's own rule exempts this dial instead.
                if !MARK_REFUSED.swap(true, Ordering::Relaxed) {
                    debug!(error = %e, "cannot mark own dials (SO_MARK); relying on the proxy uid's exemption");
                }
            } else {
                return Err(e);
            }
        }
    }
    socket.connect(addr).await
}

/// The addresses `host` stands for: loopback names are answered here (IPv4
/// first, as `/etc/hosts` lists them), IP literals are themselves, other
/// names go to the system resolver.
pub async fn resolve(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    // A URI's IPv6 literal comes bracketed.
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let name = host.trim_end_matches('.').to_ascii_lowercase();
    if is_loopback(&name) && name.parse::<std::net::IpAddr>().is_err() {
        return Ok(vec![
            SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port)),
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)),
        ]);
    }
    // A synthetic literal (a redirected plain-HTTP passthrough's URI) is its name.
    if let Ok(ip) = name.parse::<std::net::IpAddr>() {
        if let Some(real) = Box::pin(unsynthesize(SocketAddr::new(ip, port))).await? {
            return Ok(real);
        }
    }
    match tokio::net::lookup_host((host, port)).await {
        Ok(addrs) => Ok(addrs.collect()),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("cannot resolve {host}: {e}"),
        )),
    }
}

/// Resolves `host` ([`resolve`]) and connects to each address in turn until
/// one answers; the last error otherwise.
pub async fn connect_host(host: &str, port: u16) -> io::Result<TcpStream> {
    connect_first(resolve(host, port).await?, false).await
}

/// A connector that dials one address whatever the URI names (the URI still
/// gives the TLS server name and the Host header): a transparent passthrough
/// goes where the client's bytes were headed, never where a lookup of the
/// name it claimed leads.
#[derive(Clone, Debug)]
pub struct PinnedConnector {
    pub addr: SocketAddr,
    pub timeout: Duration,
    /// The upstream proxy a client's dial goes through, if any.
    pub via: Option<Arc<ChainProxy>>,
}

impl tower_service::Service<Uri> for PinnedConnector {
    type Response = TokioIo<TcpStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<TcpStream>>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let (addr, timeout, via) = (self.addr, self.timeout, self.via.clone());
        Box::pin(async move {
            // Only a client's passthrough is pinned to an address.
            let stream = tokio::time::timeout(timeout, connect_for_client(addr, via.as_deref()))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
            stream.set_nodelay(true)?;
            Ok(TokioIo::new(stream))
        })
    }
}

/// The upstream client's connector: [`connect_host`] with a timeout and
/// TCP_NODELAY, for `http` and `https` URIs alike (TLS is layered on top).
#[derive(Clone, Debug)]
pub struct Connector {
    pub timeout: Duration,
    /// Dials for clients' passthrough requests ([`connect_host_for_client`]),
    /// not for the proxy's own (the twin).
    pub for_client: bool,
    /// The upstream proxy clients' dials go through, if any (never used
    /// for the proxy's own).
    pub via: Option<Arc<ChainProxy>>,
}

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<TcpStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<TcpStream>>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let (timeout, for_client, via) = (self.timeout, self.for_client, self.via.clone());
        Box::pin(async move {
            let host = uri.host().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("no host in {uri}"))
            })?;
            let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
                Some("https") => 443,
                _ => 80,
            });
            let dial = async {
                if for_client {
                    connect_host_for_client(host, port, via.as_deref()).await
                } else {
                    connect_host(host, port).await
                }
            };
            let stream = tokio::time::timeout(timeout, dial)
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
            stream.set_nodelay(true)?;
            Ok(TokioIo::new(stream))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dials_connect_marked_or_not_and_resolve_hosts() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let plain = connect(addr).await.unwrap();
        assert_eq!(plain.peer_addr().unwrap(), addr);
        // Marking on: as an unprivileged user the mark is refused and the dial
        // still goes out; with CAP_NET_ADMIN it is set.
        mark_own_dials();
        let marked = connect(addr).await.unwrap();
        assert_eq!(marked.peer_addr().unwrap(), addr);
        let by_name = connect_host("localhost", addr.port()).await;
        // localhost may resolve to ::1 first, where nothing listens; the
        // IPv4 address is tried next.
        assert_eq!(by_name.unwrap().peer_addr().unwrap(), addr);
        let bracketed = connect_host("[127.0.0.1]", addr.port()).await.unwrap();
        assert_eq!(bracketed.peer_addr().unwrap(), addr);
    }

    #[tokio::test]
    async fn loopback_names_are_answered_without_a_resolver() {
        // RFC 6761: a resolver is never asked, so no DNS answer can move them.
        for name in ["localhost", "x.localhost", "A.B.LOCALHOST.", "[localhost]"] {
            let addrs = resolve(name, 8443).await.unwrap();
            assert_eq!(
                addrs,
                [
                    "127.0.0.1:8443".parse::<SocketAddr>().unwrap(),
                    "[::1]:8443".parse().unwrap()
                ],
                "{name}"
            );
        }
        // Literals are themselves; `localhostx` is no loopback name.
        assert_eq!(
            resolve("127.0.0.2", 1).await.unwrap(),
            ["127.0.0.2:1".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(
            resolve("[::1]", 1).await.unwrap(),
            ["[::1]:1".parse::<SocketAddr>().unwrap()]
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stream = connect_host("api.localhost", addr.port()).await.unwrap();
        assert_eq!(stream.peer_addr().unwrap(), addr);
    }

    /// A one-connection CONNECT proxy on loopback that answers `reply` and
    /// hands back the request head it read.
    async fn one_shot_proxy(reply: &'static str) -> (ChainProxy, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://user:p%40ss@{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                if s.read(&mut b).await.unwrap() == 0 {
                    break;
                }
                head.push(b[0]);
            }
            // The reply and, right behind it, what the destination said first.
            s.write_all(reply.as_bytes()).await.unwrap();
            s.write_all(b"banner").await.unwrap();
            String::from_utf8(head).unwrap()
        });
        (ChainProxy::parse(&url).unwrap(), task)
    }

    #[tokio::test]
    async fn a_chained_dial_sends_connect_and_leaves_the_destinations_bytes() {
        use tokio::io::AsyncReadExt;
        let (via, task) = one_shot_proxy("HTTP/1.1 200 Connection established\r\n\r\n").await;
        let mut s = connect_host_for_client("Example.test", 443, Some(&via))
            .await
            .unwrap();
        let head = task.await.unwrap();
        // user:p@ss, percent-decoded, in base64.
        assert_eq!(
            head,
            "CONNECT Example.test:443 HTTP/1.1\r\nHost: Example.test:443\r\nProxy-Authorization: Basic dXNlcjpwQHNz\r\n\r\n"
        );
        let mut banner = [0u8; 6];
        s.read_exact(&mut banner).await.unwrap();
        assert_eq!(&banner, b"banner");
        // Credentials never show.
        assert!(!format!("{via} {via:?}").contains("p@ss"));
    }

    #[tokio::test]
    async fn a_refusing_or_absent_upstream_proxy_is_a_chain_error() {
        let (via, _task) = one_shot_proxy("HTTP/1.1 403 Forbidden\r\n\r\n").await;
        let e = connect_host_for_client("denied.test", 443, Some(&via))
            .await
            .unwrap_err();
        let chain = ChainError::find(&e).expect("a chain error");
        assert_eq!(
            chain.failure,
            ChainFailure::Refused {
                status: 403,
                line: "HTTP/1.1 403 Forbidden".into()
            }
        );
        assert!(
            e.to_string().contains("answered CONNECT denied.test:443"),
            "{e}"
        );

        // Nothing listens there any more.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let via = ChainProxy::parse(&url).unwrap();
        let e = connect_host_for_client("x.test", 80, Some(&via))
            .await
            .unwrap_err();
        assert!(matches!(
            ChainError::find(&e).map(|c| &c.failure),
            Some(ChainFailure::Unreachable(_))
        ));
    }

    #[tokio::test]
    async fn loopback_is_dialed_directly_even_with_an_upstream_proxy() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // A proxy that does not exist: any use of it would fail.
        let via = ChainProxy::parse("http://127.0.0.1:1").unwrap();
        let s = connect_host_for_client("localhost", addr.port(), Some(&via))
            .await
            .unwrap();
        assert_eq!(s.peer_addr().unwrap(), addr);
        let s = connect_for_client(addr, Some(&via)).await.unwrap();
        assert_eq!(s.peer_addr().unwrap(), addr);
    }

    #[test]
    fn upstream_proxy_urls_parse_or_say_why() {
        let p = ChainProxy::parse("http://proxy.corp:3128/").unwrap();
        assert_eq!(p.to_string(), "http://proxy.corp:3128");
        assert_eq!(
            ChainProxy::parse("proxy.corp").unwrap().to_string(),
            "http://proxy.corp:80"
        );
        assert_eq!(
            ChainProxy::parse("http://[::1]:8080").unwrap().to_string(),
            "http://[::1]:8080"
        );
        for bad in [
            "https://p:1",
            "socks5://p:1",
            "http://p:1/x",
            "http://:1",
            "http://p:0",
            "http://p:",
        ] {
            assert!(ChainProxy::parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn the_pinned_connector_ignores_the_uri_authority() {
        use tower_service::Service as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut c = PinnedConnector {
            addr,
            timeout: Duration::from_secs(5),
            via: None,
        };
        // A name no resolver is asked about: the pinned address is dialed.
        let io = c
            .call("https://api.stripe.com/v1".parse().unwrap())
            .await
            .unwrap();
        assert_eq!(io.inner().peer_addr().unwrap(), addr);
    }

    #[tokio::test]
    async fn the_connector_dials_the_uri_authority_and_needs_a_host() {
        use tower_service::Service as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut c = Connector {
            timeout: Duration::from_secs(5),
            for_client: false,
            via: None,
        };
        let io = c
            .call(
                format!("http://127.0.0.1:{}/x", addr.port())
                    .parse()
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(io.inner().peer_addr().unwrap(), addr);
        let err = c.call("/relative".parse().unwrap()).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
