//! Phase 6: a vendor request to its twin and the twin's answer back, bodies
//! streamed both ways, the exchange detached from a client that hung up so
//! it still reaches its ledger line ([`Detachable`]).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use futures_util::FutureExt;
use http::{header, HeaderName, HeaderValue, Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn, Instrument, Span};
use veris_receipt::capture::Side;
use veris_receipt::ResponseIncompleteLine;
use veris_receipt::{redact, Entry};

use crate::admin::summary;
use crate::body::{self, capture, meter, Counted, ProxyBody, Tally};
use crate::outbound::upstream::{display_origin, is_websocket, strip_hop_by_hop, UpstreamError};
use crate::request::record::{recorded_headers, RequestLine, Unanswered};
use crate::request::respond;
use crate::request::route::Service;
use crate::request::Leg;
use crate::Proxy;

impl Proxy {
    /// Phase 6: a vendor request to its twin. The exchange and its ledger line
    /// run in the client connection's task while the client waits for them,
    /// and move to a tracked task of their own when hyper drops the service
    /// future because the client hung up ([`Detachable`]): a request the twin
    /// executed is recorded even when nobody is left to read the answer
    /// (DESIGN §7a.8), and shutdown waits for it.
    pub(crate) async fn forward(
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
    pub(crate) fn outbound(
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
    pub(crate) async fn exchange(
        &self,
        outbound: Outbound,
        gone: &AtomicBool,
    ) -> Response<ProxyBody> {
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
                warn!(service = %line.service, host = %line.host, method = %line.method, path = %redact::text(&line.path), code, "the session ended before the twin answered a request");
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
            elapsed,
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

    /// The twin failed: record it (the twin may still have executed the
    /// request, DESIGN §7a.8) and say so in words.
    pub(crate) async fn upstream_failed(
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
        warn!(error = %e, service = %line.service, host = %line.host, method = %line.method, path = %redact::text(&line.path), "twin upstream failed");
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

    /// Phase 8: the twin's answer as the client gets it: hop-by-hop headers
    /// dropped, the body streamed (and watched: a body that ends short adds a
    /// `response_incomplete` line after the request's, so the record says
    /// what the client got), or for a WebSocket handshake both upgraded
    /// connections spliced together in a tracked task.
    pub(crate) fn relay(
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
    pub(crate) fn on_short(&self, answer: Answer) -> meter::OnShort {
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
}

/// A vendor request ready for its twin, with what its ledger line needs.
pub(crate) struct Outbound {
    pub(crate) request: Request<ProxyBody>,
    /// The body length the client declared (`Content-Length`).
    pub(crate) declared_in: Option<u64>,
    pub(crate) websocket: bool,
    pub(crate) client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    pub(crate) tally: Arc<Tally>,
    pub(crate) started: Instant,
    pub(crate) line: RequestLine,
    /// The service's slot in [`metrics::Stats`].
    pub(crate) index: usize,
    /// Its body capture, when the proxy captures bodies.
    pub(crate) slot: Option<Arc<capture::Slot>>,
}

/// An exchange with the twin (or its panic), run by whoever polls it: the
/// client connection's task while the client waits, or, once hyper drops it
/// because the client hung up, a tracked task of its own that runs it to its
/// ledger line. Detaching only when the client leaves spares every request a
/// task and a channel.
pub(crate) struct Detachable {
    pub(crate) exchange: Option<Pin<Box<dyn Future<Output = Exchanged> + Send>>>,
    /// Set before the exchange is detached: nobody will read its answer.
    pub(crate) gone: Arc<AtomicBool>,
    pub(crate) tasks: TaskTracker,
}

/// The answer for the client, or the panic that lost it.
pub(crate) type Exchanged = std::thread::Result<Response<ProxyBody>>;

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

/// Which recorded request a relayed answer belongs to.
pub(crate) struct Answer {
    /// The seq of its `request` line.
    pub(crate) of: u64,
    pub(crate) service: String,
    /// The body length the twin declared.
    pub(crate) declared: Option<u64>,
}

pub(crate) fn http_version(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_2 => "HTTP/2",
        Version::HTTP_3 => "HTTP/3",
        _ => "HTTP/1.1",
    }
}

pub(crate) fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// Removes every `X-Veris-*` header (the prefix is the proxy's to the twin).
pub(crate) fn strip_veris_headers(headers: &mut http::HeaderMap) {
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
pub(crate) const ORIGINAL_AUTHORIZATION: HeaderName =
    HeaderName::from_static("x-veris-original-authorization");

/// A body's `Content-Type`, for its capture.
pub(crate) fn content_type(headers: &http::HeaderMap) -> Option<String> {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// True when a `Content-Encoding` other than identity makes a body bytes
/// that are not its text (its capture stores nothing).
pub(crate) fn encoded(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .any(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
}
