//! `POST /webhooks/trigger` and `POST /webhooks/replay`: deliveries on
//! demand through the webhook engine ([`crate::callback::control`]). The
//! answer is `202` with what was queued; the delivery itself is recorded
//! in the ledger as it happens, with its origin. Each refusal says what to
//! do next.

use http::{Response, StatusCode};
use serde_json::json;

use super::{query_param, Admin};
use crate::body::ProxyBody;
use crate::callback::Refusal;
use crate::request::respond;

/// `?service=S&event=E`: an event for a fresh fixture object.
pub(super) fn trigger(admin: &Admin, query: Option<&str>) -> Response<ProxyBody> {
    let (Some(service), Some(event)) = (param(query, "service"), param(query, "event")) else {
        return bad("this endpoint needs ?service=SERVICE&event=TYPE, e.g. ?service=stripe&event=customer.created");
    };
    let Some(control) = &admin.webhooks else {
        return no_webhooks();
    };
    answer(control.trigger(service, event))
}

/// `?event_id=ID`: an event delivered earlier in this session, again.
pub(super) fn replay(admin: &Admin, query: Option<&str>) -> Response<ProxyBody> {
    let Some(id) = param(query, "event_id") else {
        return bad("this endpoint needs ?event_id=evt_…");
    };
    let Some(control) = &admin.webhooks else {
        return no_webhooks();
    };
    answer(control.replay(id))
}

/// A parameter whose value is a plain name (letters, digits, `._-`): event
/// types, services and ids are; anything else is refused, not decoded.
fn param<'q>(query: Option<&'q str>, name: &str) -> Option<&'q str> {
    query_param(query, name).filter(|v| {
        !v.is_empty()
            && v.len() <= 200
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    })
}

fn bad(message: &str) -> Response<ProxyBody> {
    respond::error(
        StatusCode::BAD_REQUEST,
        "veris_bad_request",
        message.to_string(),
        json!({}),
    )
}

fn no_webhooks() -> Response<ProxyBody> {
    respond::error(
        StatusCode::NOT_FOUND,
        "veris_no_webhooks",
        "this proxy delivers no webhooks: it was started without --webhook. Next: restart it with --webhook stripe=http://HOST:PORT/PATH".into(),
        json!({}),
    )
}

fn answer(result: Result<crate::callback::Queued, Refusal>) -> Response<ProxyBody> {
    let refusal = match result {
        Ok(queued) => return respond::json(StatusCode::ACCEPTED, json!(queued)),
        Err(r) => r,
    };
    let (status, code, next) = match &refusal {
        Refusal::NoWebhook(_) => (
            StatusCode::NOT_FOUND,
            "veris_no_webhook",
            "restart the proxy with --webhook SERVICE=http://HOST:PORT/PATH for it",
        ),
        Refusal::UnknownEvent(_) => (
            StatusCode::BAD_REQUEST,
            "veris_unknown_event",
            "name one of the event types listed",
        ),
        Refusal::UnknownId(_) => (
            StatusCode::NOT_FOUND,
            "veris_unknown_event_id",
            "pick an event_id from this session's callback lines (`veris receipt --json`)",
        ),
        Refusal::Busy => (
            StatusCode::SERVICE_UNAVAILABLE,
            "veris_busy",
            "try again in a moment",
        ),
        Refusal::Stopped => (
            StatusCode::SERVICE_UNAVAILABLE,
            "veris_stopping",
            "start the proxy again",
        ),
    };
    respond::error(status, code, format!("{refusal}. Next: {next}"), json!({}))
}
