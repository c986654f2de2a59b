//! The ingress for an external twin (`serve --twin URL --webhook
//! SERVICE=URL`): the twin the proxy routes to makes and signs its own
//! events and POSTs each to `/ingress/{service}` on the admin listener with
//! the ingress token (made per start, printed by `serve`, never in the
//! workload's environment or state dir). Each is forwarded once, body and
//! vendor signature header unchanged, to the service's `--webhook` URLs
//! through the same attempt as the engine's ([`super::deliver::post`]:
//! bounded in time and answer bytes), recorded as a `callback` line with
//! origin `ingress`, and the app's status is passed back: the external twin
//! retries on its own, so the ingress never does.
//!
//! A request without the token is refused `401` and logged, never
//! recorded: only the ingress and the engine write `callback` lines.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, USER_AGENT};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use tracing::warn;
use veris_receipt::ledger::Ledger;
use veris_receipt::{CallbackLine, Entry};
use veris_twin::webhook::SIGNATURE_HEADER;

use super::{Reach, Webhook};
use crate::body::ProxyBody;
use crate::request::respond;

/// The most bytes of an event body the ingress takes (Stripe's events are
/// well under it).
pub const MAX_EVENT: usize = 1 << 20;

/// Deliveries forwarded at once; more are answered `503` (the external
/// twin retries).
const CONCURRENT: u32 = 32;

/// The longest an event type or id read from a body may be.
const MAX_NAME: usize = 256;

/// The ingress of one proxy (or one gateway sandbox).
pub struct Ingress {
    token: String,
    webhooks: Vec<Webhook>,
    ledger: Arc<Ledger>,
    reach: Reach,
    timeout: Duration,
    slots: Arc<Semaphore>,
    closed: AtomicBool,
}

impl Ingress {
    /// An ingress that takes deliveries bearing `token` for the services of
    /// `webhooks`, recording into `ledger`.
    pub fn new(
        token: String,
        webhooks: Vec<Webhook>,
        ledger: Arc<Ledger>,
        reach: Reach,
        timeout: Duration,
    ) -> Ingress {
        Ingress {
            token,
            webhooks,
            ledger,
            reach,
            timeout,
            slots: Arc::new(Semaphore::new(CONCURRENT as usize)),
            closed: AtomicBool::new(false),
        }
    }

    /// Takes no more deliveries and waits until every one on its way is
    /// recorded (each is bounded by the attempt's timeout): after this no
    /// `callback` line is written, so the final seal can follow.
    pub async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _ = self.slots.acquire_many(CONCURRENT).await;
    }

    /// `POST /ingress/{service}`: checks the token, forwards the event to
    /// the service's URLs, records each attempt, answers the app's status.
    pub async fn handle(&self, service: &str, req: Request<Incoming>) -> Response<ProxyBody> {
        if !crate::admin::authorized(req.headers(), &self.token) {
            let shown: String = service.chars().take(64).collect();
            warn!(service = ?shown, "refused a webhook ingress delivery without the ingress token (not recorded)");
            let mut resp = respond::error(
                StatusCode::UNAUTHORIZED,
                "veris_unauthorized",
                "the ingress needs `Authorization: Bearer <ingress token>`, the token `serve` printed at start (not the admin token)".into(),
                json!({}),
            );
            resp.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"veris-ingress\""),
            );
            return resp;
        }
        if req.method() != http::Method::POST {
            return respond::error(
                StatusCode::METHOD_NOT_ALLOWED,
                "veris_method_not_allowed",
                "the ingress takes POST".into(),
                json!({}),
            );
        }
        let targets: Vec<&Webhook> = self
            .webhooks
            .iter()
            .filter(|w| w.service == service)
            .collect();
        if targets.is_empty() {
            return respond::error(
                StatusCode::NOT_FOUND,
                "veris_no_webhook",
                format!("no --webhook names {service:?}; its events go nowhere"),
                json!({}),
            );
        }
        let Ok(_permit) = self.slots.try_acquire() else {
            return busy("too many deliveries on their way; retry");
        };
        if self.closed.load(Ordering::SeqCst) {
            return busy("the session is ending; deliveries are no longer taken");
        }
        let headers = forwarded(req.headers());
        let body = match Limited::new(req.into_body(), MAX_EVENT).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e)
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some() =>
            {
                return respond::error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "veris_event_too_large",
                    format!("an event body of at most {MAX_EVENT} bytes is forwarded"),
                    json!({}),
                )
            }
            Err(e) => {
                return respond::error(
                    StatusCode::BAD_REQUEST,
                    "veris_bad_body",
                    format!("cannot read the event body: {e}"),
                    json!({}),
                )
            }
        };
        let (kind, id) = event_of(&body);
        let mut answer: Option<u16> = None;
        let mut failure: Option<String> = None;
        for webhook in targets {
            let outcome = super::deliver::post(
                &self.reach,
                webhook,
                body.clone(),
                headers.clone(),
                self.timeout,
            )
            .await;
            match outcome.status {
                // The first non-2xx answer is what the twin hears.
                Some(s) if answer.is_none_or(|a| (200..300).contains(&a)) => answer = Some(s),
                Some(_) => {}
                None => {
                    failure.get_or_insert_with(|| outcome.error.clone().unwrap_or_default());
                }
            }
            let entry = Entry::Callback(CallbackLine {
                service: service.to_string(),
                event: kind.clone(),
                event_id: id.clone(),
                target: webhook.authority.clone(),
                method: "POST".into(),
                path: webhook.path.clone(),
                query: webhook.query.clone(),
                status: outcome.status,
                error: outcome.error,
                duration_ms: u64::try_from(outcome.duration.as_millis()).unwrap_or(u64::MAX),
                duration_us: Some(u64::try_from(outcome.duration.as_micros()).unwrap_or(u64::MAX)),
                attempt: 1,
                origin: "ingress".into(),
                fault: None,
                tls: webhook.tls,
            });
            super::append(&self.ledger, entry).await;
        }
        match (answer, failure) {
            (Some(s), None) => respond::json(
                StatusCode::from_u16(s).unwrap_or(StatusCode::BAD_GATEWAY),
                json!({"delivered": true, "status": s}),
            ),
            (answer, failure) => respond::error(
                StatusCode::BAD_GATEWAY,
                "veris_app_unreachable",
                format!(
                    "the app did not answer every delivery: {}",
                    failure.unwrap_or_default()
                ),
                json!({"status": answer}),
            ),
        }
    }
}

fn busy(why: &str) -> Response<ProxyBody> {
    respond::error(
        StatusCode::SERVICE_UNAVAILABLE,
        "veris_busy",
        why.into(),
        json!({}),
    )
}

/// The headers forwarded unchanged: the vendor's signature, the body's
/// type, the sender's name.
fn forwarded(headers: &http::HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = Vec::new();
    for name in [
        HeaderName::from_static(SIGNATURE_HEADER),
        CONTENT_TYPE,
        USER_AGENT,
    ] {
        for value in headers.get_all(&name) {
            out.push((name.clone(), value.clone()));
        }
    }
    out
}

/// The event's `type` and `id` from a JSON body (bounded), empty when the
/// body is not JSON or has none.
fn event_of(body: &Bytes) -> (String, String) {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return (String::new(), String::new());
    };
    let field = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .map(|s| s.chars().take(MAX_NAME).collect())
            .unwrap_or_default()
    };
    (field("type"), field("id"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_is_read_from_json_and_bounded() {
        let (k, i) = event_of(&Bytes::from_static(
            br#"{"id":"evt_1","type":"charge.succeeded"}"#,
        ));
        assert_eq!((k.as_str(), i.as_str()), ("charge.succeeded", "evt_1"));
        assert_eq!(
            event_of(&Bytes::from_static(b"not json")),
            (String::new(), String::new())
        );
        let long = format!(r#"{{"type":"{}"}}"#, "x".repeat(1000));
        assert_eq!(event_of(&Bytes::from(long)).0.len(), MAX_NAME);
    }
}
