//! What happens to a request once it is read: routed ([`route`]), screened
//! ([`reserved`]), forwarded to its twin or answered by the proxy itself
//! ([`respond`]), and recorded ([`recorder`]).

pub mod forward;
pub mod record;
pub mod recorder;
pub mod reserved;
pub mod respond;
pub mod route;
pub mod screen;

use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use tracing::{debug_span, Instrument};
use veris_receipt::{redact, ListenerTier, Mode};

use crate::body::ProxyBody;
use crate::outbound::dial;
use crate::request::route::Route;
use crate::Proxy;

/// Where a request arrived from: the host it was for and how.
#[derive(Debug, Clone)]
pub(crate) struct Leg {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) tls: bool,
    pub(crate) tier: ListenerTier,
    /// Transparent tier: the address the client dialed (`SO_ORIGINAL_DST`).
    /// A passthrough goes there, never to a lookup of `host`.
    pub(crate) origin: Option<SocketAddr>,
    /// Transparent tier: `host` is the TLS SNI, and each request's Host must agree.
    pub(crate) sni_host: bool,
    /// Transparent tier: a `CONNECT` the client sent to this address (a
    /// proxy outside veris). The leg then dials `host` as the explicit tier
    /// does, and its refusals name this address as their destination.
    pub(crate) via: Option<SocketAddr>,
}

impl Leg {
    /// Where the client's bytes were headed, for blocked lines.
    pub(crate) fn headed_to(&self) -> Option<String> {
        self.origin.or(self.via).map(|a| a.to_string())
    }
}

impl Proxy {
    /// Phase 3 again, per request: a terminated connection or plain HTTP may
    /// carry requests for several services (path prefixes on a shared host).
    pub(crate) async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        leg: Arc<Leg>,
    ) -> Response<ProxyBody> {
        // A gateway sandbox over its requests a second: refused, unread.
        if let Err(wait) = self.limiter.request() {
            return crate::limit::too_many_requests(&self.limits, wait);
        }
        if leg.sni_host {
            if let Some(refusal) = self.sni_host_mismatch(&req, &leg).await {
                return refusal;
            }
        }
        let path = req.uri().path().to_string();
        match self.router.route(&leg.host, &path) {
            Route::Canary => self.canary().await,
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
                self.refuse_host_loopback(&leg, Some(method), Some(path), None)
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
}
