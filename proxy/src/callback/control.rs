//! Deliveries asked for on demand, through the admin API: `veris trigger`
//! (an event for a fresh fixture object the twin renders) and `veris
//! replay` (an event this engine already delivered, sent again). Both go
//! through the engine like the twin's own events, with their origin in
//! every line, and never count toward a callback requirement by default.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use veris_twin::webhook::Event;
use veris_twin::Twin;

use super::Webhook;

/// Events kept for `replay`, newest last; older ones are forgotten.
pub const RECENT: usize = 1024;

/// Who asked for a delivery (the line's `origin`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The twin, for an object it created serving a request.
    Twin,
    /// `veris trigger`.
    Trigger,
    /// `veris replay`.
    Replay,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Twin => "twin",
            Origin::Trigger => "trigger",
            Origin::Replay => "replay",
        }
    }
}

/// One event to deliver to every URL of its service.
#[derive(Debug, Clone)]
pub(super) struct Job {
    pub event: Arc<Event>,
    pub origin: Origin,
}

/// The events delivered lately, by id, bounded by [`RECENT`].
#[derive(Default)]
pub(super) struct Recent {
    by_id: HashMap<String, Arc<Event>>,
    order: VecDeque<String>,
}

impl Recent {
    pub(super) fn keep(&mut self, event: &Arc<Event>) {
        if self
            .by_id
            .insert(event.id.clone(), Arc::clone(event))
            .is_none()
        {
            self.order.push_back(event.id.clone());
        }
        while self.order.len() > RECENT {
            if let Some(old) = self.order.pop_front() {
                self.by_id.remove(&old);
            }
        }
    }
}

/// Why an on-demand delivery was not queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no --webhook names {0:?}; events for it go nowhere")]
    NoWebhook(String),
    #[error("{0}")]
    UnknownEvent(String),
    #[error("no event {0:?} among the last {RECENT} this proxy delivered (an id from another session, or one long gone)")]
    UnknownId(String),
    #[error("the delivery queue is full; try again in a moment")]
    Busy,
    #[error("the session is ending; deliveries are no longer taken")]
    Stopped,
}

/// What was queued: the event and where it goes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Queued {
    pub service: String,
    pub event: String,
    pub event_id: String,
    pub origin: &'static str,
    /// The URLs it is delivered to.
    pub urls: Vec<String>,
}

/// The handle the admin API asks for deliveries through.
#[derive(Clone)]
pub struct Control {
    pub(super) jobs: mpsc::Sender<Job>,
    pub(super) recent: Arc<Mutex<Recent>>,
    pub(super) webhooks: Vec<Webhook>,
    /// Renders triggered events' objects (the built-in twin).
    pub(super) twin: Option<Arc<Twin>>,
}

impl Control {
    /// Queues an event of type `kind` for a fresh fixture object of
    /// `service`'s twin.
    pub fn trigger(&self, service: &str, kind: &str) -> Result<Queued, Refusal> {
        let urls = self.urls(service)?;
        let twin = self
            .twin
            .as_ref()
            .ok_or_else(|| Refusal::UnknownEvent("no built-in twin makes events here".into()))?;
        let event = twin
            .fixture_event(service, kind)
            .map_err(Refusal::UnknownEvent)?;
        self.queue(Arc::new(event), Origin::Trigger, urls)
    }

    /// Queues the event `id` again, unchanged (signed afresh).
    pub fn replay(&self, id: &str) -> Result<Queued, Refusal> {
        let event = self
            .recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_id
            .get(id)
            .cloned()
            .ok_or_else(|| Refusal::UnknownId(id.to_string()))?;
        let urls = self.urls(&event.service)?;
        self.queue(event, Origin::Replay, urls)
    }

    fn urls(&self, service: &str) -> Result<Vec<String>, Refusal> {
        let urls: Vec<String> = self
            .webhooks
            .iter()
            .filter(|w| w.service == service)
            .map(Webhook::url)
            .collect();
        if urls.is_empty() {
            return Err(Refusal::NoWebhook(service.to_string()));
        }
        Ok(urls)
    }

    fn queue(
        &self,
        event: Arc<Event>,
        origin: Origin,
        urls: Vec<String>,
    ) -> Result<Queued, Refusal> {
        let queued = Queued {
            service: event.service.clone(),
            event: event.kind.clone(),
            event_id: event.id.clone(),
            origin: origin.as_str(),
            urls,
        };
        self.jobs
            .try_send(Job { event, origin })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => Refusal::Busy,
                mpsc::error::TrySendError::Closed(_) => Refusal::Stopped,
            })?;
        Ok(queued)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str) -> Arc<Event> {
        Arc::new(Event {
            sandbox: "sbx".into(),
            service: "stripe".into(),
            id: id.into(),
            kind: "customer.created".into(),
            payload: bytes::Bytes::from_static(b"{}"),
        })
    }

    #[test]
    fn recent_events_are_bounded_and_the_oldest_go_first() {
        let mut recent = Recent::default();
        for n in 0..RECENT + 5 {
            recent.keep(&event(&format!("evt_{n}")));
        }
        assert_eq!(recent.by_id.len(), RECENT);
        assert!(!recent.by_id.contains_key("evt_4"));
        assert!(recent.by_id.contains_key("evt_5"));
        // Kept again (a replay): not a second entry.
        recent.keep(&event("evt_5"));
        assert_eq!(recent.order.len(), RECENT);
    }

    #[tokio::test]
    async fn replay_of_an_unknown_id_and_trigger_without_a_webhook_are_refused() {
        let (jobs, _rx) = mpsc::channel(1);
        let control = Control {
            jobs,
            recent: Arc::default(),
            webhooks: vec![Webhook::parse("stripe=http://127.0.0.1:9/hook").unwrap()],
            twin: None,
        };
        assert_eq!(
            control.replay("evt_nope"),
            Err(Refusal::UnknownId("evt_nope".into()))
        );
        assert_eq!(
            control.trigger("github", "push"),
            Err(Refusal::NoWebhook("github".into()))
        );
        control.recent.lock().unwrap().keep(&event("evt_1"));
        let q = control.replay("evt_1").unwrap();
        assert_eq!(
            (q.origin, q.urls.as_slice()),
            ("replay", &["http://127.0.0.1:9/hook".to_string()][..])
        );
        assert_eq!(control.replay("evt_1"), Err(Refusal::Busy));
    }
}
