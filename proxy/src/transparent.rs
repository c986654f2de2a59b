//! The transparent tier: listeners for connections the kernel redirected
//! (nftables `redirect` of outbound TCP 443 and 80), so interception does not
//! depend on the client honouring proxy variables.
//!
//! Per connection, in order: ask conntrack where the client was going
//! (`SO_ORIGINAL_DST`); for TLS, read the ClientHello ourselves (bounded,
//! reassembled across segments and records) to learn the SNI; route by the
//! SNI (or, without one, by the original IP); then either terminate — the
//! buffered hello is replayed into rustls through [`Rewind`] and the
//! connection joins the explicit tier's request lifecycle with
//! `tier: transparent` — or pass through by dialing the original destination
//! ourselves (the proxy uid, and our dials' mark, are exempt from the
//! redirect: [`crate::dial`]) and replaying the exact hello bytes. Plain HTTP is routed per request by its Host header.

use std::collections::HashSet;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{header, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, info_span, warn, Instrument};
use veris_receipt::{Entry, ListenerTier, Mode};

use crate::body::ProxyBody;
use crate::clienthello::{self, ClientHello, MAX_CLIENT_HELLO};
use crate::route::{normalize_host, Route};
use crate::{dial, respond, sys, Leg, Proxy};

/// How long a redirected client may take to send its ClientHello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// State shared by the transparent listeners of one proxy.
struct Transparent {
    proxy: Arc<Proxy>,
    /// Local addresses of our own passthrough dials that are still open. A
    /// redirected connection arriving *from* one of them means the proxy's
    /// uid is not exempt from the redirect: refusing it breaks the loop.
    own_dials: Mutex<HashSet<SocketAddr>>,
    /// Listener addresses: a connection whose original destination is one of
    /// them was not redirected at all.
    listeners: Vec<SocketAddr>,
}

/// Accepts redirected TLS (`https`) and plain HTTP (`http`) connections until
/// `shutdown` resolves. Shutdown of in-flight work is shared with
/// [`crate::serve`], which runs on the same [`Proxy`] for the explicit listener.
pub async fn serve(
    https: Option<TcpListener>,
    http: Option<TcpListener>,
    proxy: Arc<Proxy>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    // Our passthrough dials must leave although they target 80/443 like the
    // workload's: marked, they match the ruleset's `meta mark` exemption.
    dial::mark_own_dials();
    let listeners = [&https, &http]
        .into_iter()
        .flatten()
        .filter_map(|l| l.local_addr().ok())
        .collect();
    let state = Arc::new(Transparent {
        proxy: proxy.clone(),
        own_dials: Mutex::new(HashSet::new()),
        listeners,
    });
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = accept(https.as_ref()) => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let span = info_span!("transparent_tls", peer = %canonical(peer));
                    proxy.tasks.spawn(state.clone().tls_connection(stream, canonical(peer)).instrument(span));
                }
                Err(e) => backoff(e).await,
            },
            accepted = accept(http.as_ref()) => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let span = info_span!("transparent_http", peer = %canonical(peer));
                    proxy.tasks.spawn(state.clone().http_connection(stream).instrument(span));
                }
                Err(e) => backoff(e).await,
            },
        }
    }
    drop(https);
    drop(http);
    proxy.cancel.cancel();
    proxy.tasks.close();
    if tokio::time::timeout(proxy.grace, proxy.tasks.wait())
        .await
        .is_err()
    {
        warn!("transparent connections still open after the shutdown grace period; closing them");
    }
    Ok(())
}

async fn accept(listener: Option<&TcpListener>) -> io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

async fn backoff(e: io::Error) {
    // EMFILE and friends: back off instead of spinning.
    warn!(error = %e, "accept failed");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// IPv4 peers of a dual-stack listener arrive as `::ffff:a.b.c.d`.
fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

impl Transparent {
    /// The original destination, or `None` (logged) when the connection was
    /// not redirected or loops back from our own dial.
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
    /// redirect did not exempt the proxy. Asked once the hello is in: our dial
    /// registers itself before it writes the hello it replays.
    fn looped(&self, peer: SocketAddr) -> bool {
        let looped = self.own_dials.lock().is_ok_and(|d| d.contains(&peer));
        if looped {
            warn!(%peer, "the proxy's own passthrough dial was redirected back to it; closing it. Next: exempt the proxy uid in the nftables rules (`meta skuid <proxy uid> return`) and run veris as that uid, or exempt its mark (`meta mark 0x76657269 return`, deploy/veris.nft)");
        }
        looped
    }

    async fn tls_connection(self: Arc<Self>, mut stream: TcpStream, peer: SocketAddr) {
        let Some(dst) = self.original_dst(&stream) else {
            return;
        };
        let read = clienthello::read(&mut stream, MAX_CLIENT_HELLO);
        let hello = match tokio::time::timeout(HELLO_TIMEOUT, read).await {
            Ok(Ok(hello)) => hello,
            Ok(Err(e)) => {
                info!(error = %e, %dst, "no usable TLS ClientHello on a redirected connection");
                return;
            }
            Err(_) => {
                info!(%dst, "no TLS ClientHello within {HELLO_TIMEOUT:?}");
                return;
            }
        };
        if self.looped(peer) {
            return;
        }
        let proxy = &self.proxy;
        let leg = Leg {
            host: hello.sni.clone().unwrap_or_else(|| dst.ip().to_string()),
            port: dst.port(),
            tls: true,
            tier: ListenerTier::Transparent,
            origin: Some(dst),
            sni_host: hello.sni.is_some(),
        };
        let passthrough = match proxy.router.route_connection(&leg.host) {
            Route::Service(_) | Route::Canary => None,
            Route::Loopback => Some("loopback"),
            Route::Allowed => Some("allow_passthrough"),
            Route::Unmapped if proxy.identity.mode == Mode::Passthrough => {
                Some(if leg.sni_host { "mode" } else { "no_sni" })
            }
            // Strict without a name: no leaf the client could accept, so the
            // refusal is the closed connection, recorded.
            Route::Unmapped if !leg.sni_host => {
                proxy.record_or_log(Entry::Blocked {
                    host: leg.host.clone(),
                    port: leg.port,
                    tier: leg.tier,
                    method: None,
                    path: None,
                    reason: "strict mode: TLS without SNI to an address no service routes".into(),
                    dst: leg.origin.map(|o| o.to_string()),
                });
                return;
            }
            // Strict with a name: terminate so the refusal reaches the client as words.
            Route::Unmapped => None,
        };
        match passthrough {
            None => {
                debug!(host = %leg.host, %dst, "terminating a redirected connection");
                let io = Rewind::new(hello.raw, stream);
                proxy.clone().terminate(io, leg).await;
            }
            Some(reason) => self.pass_tls(stream, hello, leg, reason).await,
        }
    }

    /// Dials the original destination and replays the hello, then relays bytes.
    async fn pass_tls(&self, mut client: TcpStream, hello: ClientHello, leg: Leg, reason: &str) {
        let proxy = &self.proxy;
        let started = Instant::now();
        if hello.ech {
            proxy.record_or_log(Entry::Ech {
                host: leg.host.clone(),
                port: leg.port,
                tier: leg.tier,
                dst: leg.origin.map(|o| o.to_string()),
            });
        }
        let Some(dst) = leg.origin else {
            return;
        };
        let dial = tokio::time::timeout(proxy.connect_timeout, dial::connect(dst)).await;
        let mut origin = match dial {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                info!(error = %e, %dst, "passthrough destination unreachable");
                proxy.record_passthrough(&leg, reason, 0, 0, started);
                return;
            }
            Err(_) => {
                info!(%dst, "passthrough destination did not answer in time");
                proxy.record_passthrough(&leg, reason, 0, 0, started);
                return;
            }
        };
        let own = origin.local_addr().ok().map(canonical);
        if let (Some(own), Ok(mut set)) = (own, self.own_dials.lock()) {
            set.insert(own);
        }
        let _ = origin.set_nodelay(true);
        let (up, down) = match origin.write_all(&hello.raw).await {
            Ok(()) => match tokio::io::copy_bidirectional(&mut client, &mut origin).await {
                Ok((up, down)) => (up + hello.raw.len() as u64, down),
                Err(e) => {
                    debug!(error = %e, "passthrough closed with an error");
                    (hello.raw.len() as u64, 0)
                }
            },
            Err(e) => {
                debug!(error = %e, "replaying the ClientHello failed");
                (0, 0)
            }
        };
        if let (Some(own), Ok(mut set)) = (own, self.own_dials.lock()) {
            set.remove(&own);
        }
        proxy.record_passthrough(&leg, reason, up, down, started);
    }

    /// Plain HTTP: each request is routed by its Host header, and passthrough
    /// goes back to the address the client dialed.
    async fn http_connection(self: Arc<Self>, stream: TcpStream) {
        let Some(dst) = self.original_dst(&stream) else {
            return;
        };
        let proxy = self.proxy.clone();
        let cancel = proxy.cancel.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            let proxy = proxy.clone();
            async move {
                let host = request_host(&req)
                    .map(|h| normalize_host(&h))
                    .filter(|h| !h.is_empty())
                    .unwrap_or_else(|| dst.ip().to_string());
                let leg = Leg {
                    host,
                    port: dst.port(),
                    tls: false,
                    tier: ListenerTier::Transparent,
                    origin: Some(dst),
                    sni_host: false,
                };
                Ok::<_, Infallible>(proxy.handle(req, Arc::new(leg)).await)
            }
        });
        if let Err(e) = crate::serve_http1(stream, service, &cancel).await {
            debug!(error = %e, "redirected HTTP connection ended with an error");
        }
    }
}

/// The host a request names: its Host header, else the URI authority (HTTP/2).
fn request_host<B>(req: &Request<B>) -> Option<String> {
    req.headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_string()))
}

impl Proxy {
    /// Transparent TLS: the Host a request names must be the SNI the
    /// connection was routed by, or a client could reach one vendor's twin
    /// under another vendor's certificate. `Some` is the 502 refusal.
    pub(crate) fn sni_host_mismatch<B>(
        &self,
        req: &Request<B>,
        leg: &Leg,
    ) -> Option<Response<ProxyBody>> {
        let named = request_host(req)?;
        let host = normalize_host(&named);
        if host.eq_ignore_ascii_case(&leg.host) {
            return None;
        }
        warn!(sni = %leg.host, %host, "Host header disagrees with the TLS SNI");
        self.record_or_log(Entry::Blocked {
            host: leg.host.clone(),
            port: leg.port,
            tier: leg.tier,
            method: Some(req.method().to_string()),
            path: Some(req.uri().path().to_string()),
            reason: format!("Host {host} disagrees with the TLS SNI"),
            dst: leg.origin.map(|o| o.to_string()),
        });
        Some(respond::error(
            StatusCode::BAD_GATEWAY,
            "veris_sni_host_mismatch",
            format!(
                "the request names host {host} but the TLS connection was opened for {}. Next: send requests for {host} on a connection to {host}",
                leg.host
            ),
            json!({"sni": leg.host, "host": host}),
        ))
    }

    /// Records an entry whose loss only costs a log line (the connection has
    /// no response on which to refuse service).
    pub(crate) fn record_or_log(&self, entry: Entry) {
        let kind = entry.kind();
        if let Err(e) = self.recorder.record(entry) {
            warn!(error = %e, kind, "ledger entry could not be recorded");
        }
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
        let (ca, _) = veris_ca::CertificateAuthority::load_or_create(&dir).unwrap();
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
        let mut tls = start.into_stream(crate::server_config(key)).await.unwrap();
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
