//! The explicit tier: clients that send their requests to the proxy port as
//! an HTTP proxy. Phase 1 (accept, [`serve`]), phase 2 (what kind of
//! request: [`Proxy::on_proxy_request`]) and phase 4's choice for a
//! `CONNECT` ([`Proxy::connect`]): terminate TLS ([`crate::inbound::tls`]) or
//! tunnel ([`crate::outbound::passthrough`]).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, debug_span, info, Instrument};
use veris_receipt::{redact, ListenerTier, Mode};

use veris_accept::{accept_until, OnError};

use crate::body::{self, ProxyBody};
use crate::inbound::http::serve_http1;
use crate::outbound::dial;
use crate::request::respond;
use crate::request::route::Route;
use crate::request::Leg;
use crate::Proxy;
use veris_host::Host;

impl Proxy {
    /// Phase 2: what kind of request reached the proxy port.
    pub(crate) async fn on_proxy_request(
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
            let host = Host::new(authority.host()).into_string();
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
                tier: self.proxy_tier(),
                origin: None,
                sni_host: false,
                via: None,
            };
            return self.handle(req, Arc::new(leg)).await;
        }
        if self.router.route("", req.uri().path()) == Route::Canary {
            return self.canary().await;
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
    pub(crate) async fn connect(
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
            .filter(|p| *p != 0 && !Host::new(authority.host()).into_string().is_empty());
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
            host: Host::new(authority.host()).into_string(),
            port,
            tls: true,
            tier: match via {
                Some(_) => ListenerTier::Transparent,
                None => self.proxy_tier(),
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
                .refuse_host_loopback(&leg, Some("CONNECT".into()), None, None)
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
}

/// Phase 1: accepts client connections until `shutdown` resolves, then stops
/// accepting, lets in-flight requests and tunnels finish within the grace
/// period, and returns.
pub async fn serve(
    listener: TcpListener,
    proxy: Arc<Proxy>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    accept_until(listener, shutdown, OnError::Retry, |stream, peer| {
        let Some(permit) = proxy.admit() else {
            return;
        };
        let _ = stream.set_nodelay(true);
        let connection = client_connection(proxy.clone(), stream, peer);
        proxy.tasks.spawn(async move {
            connection.await;
            drop(permit);
        });
    })
    .await?;
    proxy.summary.flush();
    proxy.drain().await;
    Ok(())
}

pub(crate) async fn client_connection(proxy: Arc<Proxy>, stream: TcpStream, peer: SocketAddr) {
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
