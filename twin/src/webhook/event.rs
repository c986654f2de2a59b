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

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde_json::{json, Value};

/// The `api_version` the twin's events say they follow.
pub const API_VERSION: &str = "2024-06-20";

/// Events waiting for delivery at most; past it the twin drops events
/// (counted, and recorded by the deliverer): a workload making objects
/// faster than the app takes its deliveries must not grow the proxy's
/// memory without bound.
pub const EVENT_QUEUE: usize = 4096;

/// Where the twin hands out its events: a bounded queue that never blocks
/// the twin, and counts (per service) every event it had no room for, so
/// the deliverer can put the drops on record ([`Dropped`]).
#[derive(Debug, Clone)]
pub struct EventSink {
    tx: tokio::sync::mpsc::Sender<Event>,
    dropped: Arc<Dropped>,
}

/// The events a full [`EventSink`] refused, per sandbox and service, not
/// yet taken.
#[derive(Debug, Default)]
pub struct Dropped {
    counts: Mutex<BTreeMap<(String, String), u64>>,
    news: tokio::sync::Notify,
}

impl Dropped {
    /// Resolves once an event was dropped since the last take (at once if
    /// one was dropped while nobody waited).
    pub async fn wait(&self) {
        self.news.notified().await;
    }

    /// The drops counted since the last take, per service, and resets them.
    pub fn take(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for ((_, service), n) in self.take_by_sandbox() {
            *out.entry(service).or_default() += n;
        }
        out
    }

    /// The drops counted since the last take, per (sandbox, service), and
    /// resets them (a gateway hands each sandbox its own).
    pub fn take_by_sandbox(&self) -> BTreeMap<(String, String), u64> {
        std::mem::take(&mut *self.counts.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn count(&self, sandbox: &str, service: &str, n: u64) {
        *self
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((sandbox.to_string(), service.to_string()))
            .or_default() += n;
        self.news.notify_one();
    }
}

/// A sink holding `capacity` events, the receiver its deliverer takes them
/// from, and the drop count the deliverer records.
pub fn channel(capacity: usize) -> (EventSink, tokio::sync::mpsc::Receiver<Event>, Arc<Dropped>) {
    let (tx, rx) = tokio::sync::mpsc::channel(capacity.max(1));
    let dropped = Arc::new(Dropped::default());
    let sink = EventSink {
        tx,
        dropped: Arc::clone(&dropped),
    };
    (sink, rx, dropped)
}

impl EventSink {
    /// Queues `event` without waiting. When the queue is full the event is
    /// dropped and counted (and logged); when its deliverer is gone (a
    /// session ending) it is dropped with a log line: there is nothing
    /// left to record it in. `false` when it was dropped.
    pub fn offer(&self, event: Event) -> bool {
        match self.tx.try_send(event) {
            Ok(()) => true,
            Err(tokio::sync::mpsc::error::TrySendError::Full(e)) => {
                self.dropped.count(&e.sandbox, &e.service, 1);
                tracing::warn!(service = %e.service, kind = %e.kind, "webhook event dropped: the delivery queue is full (counted in the ledger)");
                false
            }
            Err(tokio::sync::mpsc::error::TrySendError::Closed(e)) => {
                tracing::warn!(service = %e.service, kind = %e.kind, "webhook event dropped: no deliverer (the session is ending)");
                false
            }
        }
    }

    /// Counts `n` events of `service` dropped before they reached this
    /// sink (a gateway's shared queue, full), so this sink's deliverer puts
    /// them on record with its own.
    pub fn count_dropped(&self, service: &str, n: u64) {
        self.dropped.count("", service, n);
    }
}

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

    #[tokio::test]
    async fn a_full_sink_counts_what_it_drops_per_service() {
        let (sink, mut rx, dropped) = channel(1);
        let event = |service: &str| Event {
            sandbox: "sbx".into(),
            service: service.into(),
            id: "evt_1".into(),
            kind: "customer.created".into(),
            payload: Bytes::from_static(b"{}"),
        };
        assert!(sink.offer(event("stripe")));
        assert!(!sink.offer(event("stripe")));
        assert!(!sink.offer(event("other")));
        dropped.wait().await;
        assert_eq!(
            dropped.take().into_iter().collect::<Vec<_>>(),
            [("other".to_string(), 1), ("stripe".to_string(), 1)]
        );
        assert!(dropped.take().is_empty());
        // Per sandbox for a gateway's router; counted elsewhere, added here.
        assert!(!sink.offer(event("stripe")));
        assert_eq!(
            dropped.take_by_sandbox().into_iter().collect::<Vec<_>>(),
            [(("sbx".to_string(), "stripe".to_string()), 1)]
        );
        sink.count_dropped("stripe", 3);
        assert_eq!(dropped.take().get("stripe"), Some(&3));
        assert_eq!(rx.recv().await.map(|e| e.service), Some("stripe".into()));
    }

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
