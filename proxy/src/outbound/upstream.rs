//! The upstream leg: one shared, pooled HTTP client for twins and (in
//! passthrough) re-originated requests, and the header rewriting between legs.
//!
//! Plain-HTTP twins are probed once for HTTP/2 with prior knowledge (h2c); TLS
//! upstreams negotiate h2 by ALPN. Redirects are returned, never followed.
//! Hop-by-hop headers (RFC 9110 §7.6.1) are dropped in both directions, except
//! the `Upgrade`/`Connection: upgrade` pair of a WebSocket handshake.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::body::{empty, ProxyBody};
use crate::outbound::dial::{ChainProxy, Connector, PinnedConnector};

/// How the upstream failed, which decides the client's status.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("cannot connect to {upstream}: {source}")]
    Connect {
        upstream: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("no response head from {upstream} within {secs} s")]
    Timeout { upstream: String, secs: u64 },
    #[error("{upstream} failed: {source}")]
    Failed {
        upstream: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
}

/// Options for the upstream client.
#[derive(Clone)]
pub struct UpstreamOptions {
    /// Roots for TLS upstreams (system roots plus the veris CA for a TLS twin).
    pub roots: RootCertStore,
    /// Roots for clients' passthrough requests re-originated to real hosts:
    /// the system roots, never the veris CA (`None`: `roots`).
    pub passthrough_roots: Option<RootCertStore>,
    /// Skip certificate verification for the twin (test twins only); never
    /// for passthrough requests to real hosts, which carry the client's
    /// real credentials.
    pub insecure_skip_verify: bool,
    pub connect_timeout: Duration,
    /// Time allowed for the response head; bodies stream without a limit.
    pub response_timeout: Duration,
    /// `--upstream-proxy`: clients' passthrough dials go through it with
    /// `CONNECT`; the twin never does.
    pub upstream_proxy: Option<ChainProxy>,
}

impl Default for UpstreamOptions {
    fn default() -> Self {
        UpstreamOptions {
            roots: RootCertStore::empty(),
            passthrough_roots: None,
            insecure_skip_verify: false,
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(60),
            upstream_proxy: None,
        }
    }
}

/// The pooled clients: to the twin (`auto`, `h2c`) and for clients'
/// passthrough requests (`passthrough`: its own dials and roots).
pub struct Upstream {
    auto: Client<HttpsConnector<Connector>, ProxyBody>,
    passthrough: Client<HttpsConnector<Connector>, ProxyBody>,
    h2c: Client<Connector, ProxyBody>,
    /// Plain-HTTP authorities that answered HTTP/2 with prior knowledge.
    h2c_origins: RwLock<HashSet<String>>,
    response_timeout: Duration,
    connect_timeout: Duration,
    /// The TLS settings of `passthrough`, before ALPN, for one-off
    /// connections (a client's passthrough pinned to its destination).
    tls: rustls::ClientConfig,
    /// The upstream proxy of clients' dials, if any.
    via: Option<Arc<ChainProxy>>,
}

impl Upstream {
    pub fn new(options: UpstreamOptions) -> Upstream {
        // Our own connector, not hyper's: in the transparent tier these dials
        // carry the redirect's exemption mark (crate::outbound::dial).
        let http = Connector {
            timeout: options.connect_timeout,
            for_client: false,
            via: None,
        };
        let via = options.upstream_proxy.clone().map(Arc::new);
        let tls = if options.insecure_skip_verify {
            rustls::ClientConfig::builder()
                .dangerous()
                .with_custom_certificate_verifier(AcceptAnyCert::new())
                .with_no_client_auth()
        } else {
            rustls::ClientConfig::builder()
                .with_root_certificates(options.roots.clone())
                .with_no_client_auth()
        };
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls.clone())
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http.clone());
        let auto = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(https);
        let passthrough_tls = rustls::ClientConfig::builder()
            .with_root_certificates(
                options
                    .passthrough_roots
                    .clone()
                    .unwrap_or_else(|| options.roots.clone()),
            )
            .with_no_client_auth();
        let passthrough = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(
                hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(passthrough_tls.clone())
                    .https_or_http()
                    .enable_http1()
                    .enable_http2()
                    .wrap_connector(Connector {
                        timeout: options.connect_timeout,
                        for_client: true,
                        via: via.clone(),
                    }),
            );
        let h2c = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .pool_idle_timeout(Duration::from_secs(30))
            .build(http);
        Upstream {
            auto,
            passthrough,
            h2c,
            h2c_origins: RwLock::new(HashSet::new()),
            response_timeout: options.response_timeout,
            connect_timeout: options.connect_timeout,
            tls: passthrough_tls,
            via,
        }
    }

    /// Tries HTTP/2 with prior knowledge against a plain-HTTP base URL and, if
    /// it answers, uses h2c for that origin from now on. Returns whether it did.
    pub async fn probe_h2c(&self, base: &str) -> bool {
        let Ok(uri) = base.parse::<Uri>() else {
            return false;
        };
        if uri.scheme_str() != Some("http") {
            return false;
        }
        let Some(authority) = uri.authority().map(|a| a.to_string()) else {
            return false;
        };
        let probe = Request::get(format!("http://{authority}/veris/health"))
            .body(empty())
            .ok();
        let Some(probe) = probe else { return false };
        let ok = matches!(
            tokio::time::timeout(Duration::from_secs(2), self.h2c.request(probe)).await,
            Ok(Ok(_))
        );
        if ok {
            if let Ok(mut set) = self.h2c_origins.write() {
                set.insert(authority);
            }
        }
        ok
    }

    /// The upstream proxy clients' dials go through, if any.
    /// How long a dial may take.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    pub fn upstream_proxy(&self) -> Option<&ChainProxy> {
        self.via.as_deref()
    }

    /// Sends a request and waits (bounded) for the response head.
    pub async fn send(
        &self,
        req: Request<ProxyBody>,
        websocket: bool,
    ) -> Result<Response<hyper::body::Incoming>, UpstreamError> {
        let upstream = display_origin(req.uri());
        let use_h2c = !websocket
            && req.uri().scheme_str() == Some("http")
            && req.uri().authority().is_some_and(|a| {
                self.h2c_origins
                    .read()
                    .is_ok_and(|s| s.contains(a.as_str()))
            });
        let fut = if use_h2c {
            self.h2c.request(req)
        } else {
            self.auto.request(req)
        };
        self.response_head(upstream, fut).await
    }

    /// Sends a client's passthrough request to the real host its URI names
    /// (dials for a client, verified against the passthrough roots).
    pub async fn send_passthrough(
        &self,
        req: Request<ProxyBody>,
    ) -> Result<Response<hyper::body::Incoming>, UpstreamError> {
        let upstream = display_origin(req.uri());
        let fut = self.passthrough.request(req);
        self.response_head(upstream, fut).await
    }

    /// Sends a request over a connection of its own to `addr`, whatever its
    /// URI names: the URI's host still gives the TLS server name (verified
    /// as [`Upstream::send_passthrough`] verifies) and the Host header. Not pooled: it
    /// serves the rare re-originated request of a transparent passthrough,
    /// whose bytes must go where the client's were headed.
    pub async fn send_via(
        &self,
        addr: SocketAddr,
        req: Request<ProxyBody>,
    ) -> Result<Response<hyper::body::Incoming>, UpstreamError> {
        let upstream = display_origin(req.uri());
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(self.tls.clone())
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(PinnedConnector {
                addr,
                timeout: self.connect_timeout,
                via: self.via.clone(),
            });
        let client: Client<_, ProxyBody> = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(https);
        self.response_head(upstream, client.request(req)).await
    }

    /// Waits (bounded) for the response head of a request in flight.
    async fn response_head(
        &self,
        upstream: String,
        fut: hyper_util::client::legacy::ResponseFuture,
    ) -> Result<Response<hyper::body::Incoming>, UpstreamError> {
        match tokio::time::timeout(self.response_timeout, fut).await {
            Err(_) => Err(UpstreamError::Timeout {
                upstream,
                secs: self.response_timeout.as_secs(),
            }),
            Ok(Err(source)) if source.is_connect() => {
                Err(UpstreamError::Connect { upstream, source })
            }
            Ok(Err(source)) => Err(UpstreamError::Failed { upstream, source }),
            Ok(Ok(resp)) => Ok(resp),
        }
    }
}

/// `scheme://authority/path` without query, for messages and the ledger.
pub fn display_origin(uri: &Uri) -> String {
    format!(
        "{}://{}{}",
        uri.scheme_str().unwrap_or("http"),
        uri.authority().map(|a| a.as_str()).unwrap_or(""),
        uri.path()
    )
}

/// Headers that belong to one connection (RFC 9110 §7.6.1), plus legacy proxy ones.
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers, including those listed in `Connection`. A
/// WebSocket handshake keeps `Upgrade` and `Connection: upgrade`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    let upgrade = headers.get(header::UPGRADE).cloned();
    for name in listed {
        headers.remove(name);
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    if keep_upgrade {
        if let Some(up) = upgrade {
            headers.insert(header::UPGRADE, up);
            headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        }
    }
}

/// True for an HTTP/1.1 WebSocket handshake.
pub fn is_websocket(headers: &HeaderMap) -> bool {
    let upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let connection = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    upgrade && connection
}

/// Accepts any certificate but still checks handshake signatures: for
/// `insecure_skip_verify` twins, and for probes whose answer authenticates
/// itself (the canary token).
#[derive(Debug)]
pub struct AcceptAnyCert(Arc<rustls::crypto::CryptoProvider>);

impl AcceptAnyCert {
    pub fn new() -> Arc<AcceptAnyCert> {
        Arc::new(AcceptAnyCert(
            rustls::crypto::CryptoProvider::get_default()
                .cloned()
                .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider())),
        ))
    }
}

impl ServerCertVerifier for AcceptAnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_removed_including_listed_ones() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-private"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("proxy-authorization", HeaderValue::from_static("Basic x"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("content-type", HeaderValue::from_static("application/json"));
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("content-type"));
    }

    #[test]
    fn websocket_handshake_keeps_upgrade() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("Upgrade"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert("sec-websocket-key", HeaderValue::from_static("abc"));
        assert!(is_websocket(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h.get("upgrade").unwrap(), "websocket");
        assert_eq!(h.get("connection").unwrap(), "upgrade");
        assert!(h.contains_key("sec-websocket-key"));
    }
}
