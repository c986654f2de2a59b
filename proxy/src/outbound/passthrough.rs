//! Passthrough: traffic veris lets through to its real destination instead
//! of a twin — a `CONNECT` byte tunnel ([`Proxy::tunnel`]) or a
//! re-originated HTTP request ([`Proxy::pass`]) — and what its ledger lines
//! say: the name the client gave beside the address dialed, the bytes moved,
//! and a failure to reach it as a tunnel that closed at once with why.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tracing::{debug, info_span, warn, Instrument};
use veris_receipt::Entry;
use veris_receipt::{PassthroughLine, TunnelCloseLine};

use crate::body::{self, meter, Counted, ProxyBody};
use crate::outbound::dial;
use crate::outbound::upstream::strip_hop_by_hop;
use crate::request::forward::content_length;
use crate::request::record::ledger_unavailable;
use crate::request::recorder::RecordError;
use crate::request::respond;
use crate::request::Leg;
use crate::Proxy;

impl Proxy {
    /// Phase 4b: a byte tunnel to the real destination, recorded (with the
    /// address the dial reached) when it closes.
    pub(crate) async fn tunnel(
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

    /// Unmapped or allowed host seen as an HTTP request (plain HTTP, or inside a
    /// connection we terminated): re-originate it to the real destination —
    /// in the transparent tier the address the client dialed (the name
    /// travels as Host and SNI only), in the explicit tier a lookup of the
    /// name — and record the address the request went to.
    pub(crate) async fn pass(
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

    pub(crate) async fn tunnel_failed(
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
    pub(crate) async fn upstream_proxy_failed(
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

    /// Records a passthrough: the name the client gave (`leg.host`) beside
    /// `dst`, the address actually dialed (DESIGN §7a.11; `None` when no
    /// dial connected), and the bytes `(in, out)` moved.
    pub(crate) async fn record_passthrough(
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
}

/// `e` and what caused it, outermost first: hyper's own words ("client
/// error (Connect)") say nothing of which address failed, its causes do.
pub(crate) fn error_text(e: &(dyn std::error::Error + 'static)) -> String {
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
pub(crate) fn refused_by_policy(e: &(dyn std::error::Error + 'static)) -> bool {
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
