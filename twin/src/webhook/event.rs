//! Stripe events for objects the twin created (DESIGN §15).
//!
//! An event is made only from an object the twin itself stored while
//! serving a vendor request (never from anything a request claims about
//! itself), so a delivered `charge.succeeded` always stands for a charge
//! the twin really created for that sandbox. Which events an object gives
//! follows Stripe: a customer is `customer.created`; a charge is
//! `charge.succeeded`, `charge.failed` or `charge.pending` by its status; a
//! payment intent is `payment_intent.created`, and also
//! `payment_intent.succeeded` when it was created succeeded.

use bytes::Bytes;
use serde_json::{json, Value};

/// The `api_version` the twin's events say they follow.
pub const API_VERSION: &str = "2024-06-20";

/// Events waiting for delivery at most; past it the twin drops events (with
/// a warning): a workload making objects faster than the app takes its
/// deliveries must not grow the proxy's memory without bound.
pub const EVENT_QUEUE: usize = 4096;

/// Where the twin hands out its events.
pub type EventSink = tokio::sync::mpsc::Sender<Event>;

/// One event for one sandbox and service, its JSON payload made once: every
/// delivery attempt sends the same bytes (signed afresh each time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub sandbox: String,
    pub service: String,
    /// `evt_…`.
    pub id: String,
    /// `charge.succeeded`, …
    pub kind: String,
    /// The JSON body as delivered.
    pub payload: Bytes,
}

/// What the request that made the object carried that Stripe repeats in
/// the event's `request` field.
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    pub request_id: &'a str,
    pub idempotency_key: Option<&'a str>,
}

/// The event types a stored Stripe object gives, in the order Stripe sends
/// them; none for objects it has no event for.
pub fn stripe_types(object: &Value) -> Vec<&'static str> {
    let status = object.get("status").and_then(Value::as_str);
    match object.get("object").and_then(Value::as_str) {
        Some("customer") => vec!["customer.created"],
        Some("charge") => match status {
            Some("succeeded") => vec!["charge.succeeded"],
            Some("failed") => vec!["charge.failed"],
            Some("pending") => vec!["charge.pending"],
            _ => Vec::new(),
        },
        Some("payment_intent") => match status {
            Some("succeeded") => vec!["payment_intent.created", "payment_intent.succeeded"],
            _ => vec!["payment_intent.created"],
        },
        _ => Vec::new(),
    }
}

/// Every event type [`stripe_types`] can give, for `veris trigger`.
pub const STRIPE_TYPES: &[&str] = &[
    "customer.created",
    "charge.succeeded",
    "charge.failed",
    "charge.pending",
    "payment_intent.created",
    "payment_intent.succeeded",
];

/// How `veris trigger` makes the object of an event `kind` (like `stripe
/// trigger`): the twin's own create fixture (`POST path`) rendered with
/// `form`, then `status` set when the event needs another than the
/// fixture's. `None` for a type [`stripe_types`] never gives.
pub fn stripe_fixture(kind: &str) -> Option<FixtureRequest> {
    const NOTE: (&str, &str) = ("description", "(created by veris trigger)");
    const PAYMENT: [(&str, &str); 3] = [("amount", "2000"), ("currency", "usd"), NOTE];
    let (path, form, status): (_, &[(&str, &str)], _) = match kind {
        "customer.created" => ("/v1/customers", &[NOTE], None),
        "charge.succeeded" => ("/v1/charges", &PAYMENT, Some("succeeded")),
        "charge.failed" => ("/v1/charges", &PAYMENT, Some("failed")),
        "charge.pending" => ("/v1/charges", &PAYMENT, Some("pending")),
        "payment_intent.created" => ("/v1/payment_intents", &PAYMENT, None),
        "payment_intent.succeeded" => ("/v1/payment_intents", &PAYMENT, Some("succeeded")),
        _ => return None,
    };
    Some(FixtureRequest { path, form, status })
}

/// The request whose create fixture makes a triggered event's object.
#[derive(Debug, Clone, Copy)]
pub struct FixtureRequest {
    pub path: &'static str,
    pub form: &'static [(&'static str, &'static str)],
    pub status: Option<&'static str>,
}

/// The Stripe event `kind` for `object`, as Stripe shapes it.
pub fn stripe_event(
    id: &str,
    kind: &str,
    created: i64,
    object: &Value,
    origin: Origin<'_>,
) -> Value {
    json!({
        "id": id,
        "object": "event",
        "api_version": API_VERSION,
        "created": created,
        "data": {"object": object},
        "livemode": false,
        "pending_webhooks": 1,
        "request": {"id": origin.request_id, "idempotency_key": origin.idempotency_key},
        "type": kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_give_the_event_of_their_status() {
        let charge = |s: &str| json!({"object": "charge", "status": s});
        assert_eq!(stripe_types(&charge("succeeded")), ["charge.succeeded"]);
        assert_eq!(stripe_types(&charge("failed")), ["charge.failed"]);
        assert!(stripe_types(&charge("made-up")).is_empty());
        assert_eq!(
            stripe_types(&json!({"object": "payment_intent", "status": "succeeded"})),
            ["payment_intent.created", "payment_intent.succeeded"]
        );
        assert_eq!(
            stripe_types(&json!({"object": "payment_intent", "status": "requires_payment_method"})),
            ["payment_intent.created"]
        );
        assert_eq!(
            stripe_types(&json!({"object": "customer"})),
            ["customer.created"]
        );
        assert!(stripe_types(&json!({"object": "refund"})).is_empty());
        assert!(stripe_types(&json!({})).is_empty());
    }

    /// Every type the twin gives can be triggered, and nothing else.
    #[test]
    fn every_event_type_has_a_fixture() {
        for kind in STRIPE_TYPES {
            assert!(stripe_fixture(kind).is_some(), "{kind}");
        }
        assert!(stripe_fixture("charge.refunded").is_none());
    }

    #[test]
    fn the_event_has_stripes_shape() {
        let object = json!({"id": "ch_1", "object": "charge"});
        let origin = Origin {
            request_id: "req_1",
            idempotency_key: Some("k"),
        };
        let e = stripe_event("evt_1", "charge.succeeded", 1_700_000_000, &object, origin);
        assert_eq!(e["object"], "event");
        assert_eq!(e["type"], "charge.succeeded");
        assert_eq!(e["data"]["object"], object);
        assert_eq!(e["request"], json!({"id": "req_1", "idempotency_key": "k"}));
        assert_eq!(e["livemode"], false);
        assert_eq!(e["created"], 1_700_000_000);
    }
}
