//! Callbacks in a receipt: veris's webhook deliveries to the app (ledger
//! `callback` lines, DESIGN §15), listed apart from the requests that
//! reached the twin, and what a callback requirement counts.
//!
//! Every attempt is listed (up to [`JSON_ENTRY_CAP`]) with its status or
//! error, its origin and its fault; `statuses` counts every answered
//! attempt exactly, per [`bucket`] (origin, and fault when one was put on
//! it) and path, so a requirement never depends on the cap.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::JSON_ENTRY_CAP;
use crate::entry::CallbackLine;
use crate::quote::{escaped, quoted, token};

/// The window's callback attempts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Callbacks {
    /// Attempts in the window.
    pub attempts: u64,
    /// Attempts, oldest first, at most [`JSON_ENTRY_CAP`].
    pub entries: Vec<CallbackEntry>,
    /// Per [`bucket`] (`twin`, `trigger`, `replay`, or `ORIGIN+FAULT` for a
    /// fault-injected delivery), per path, how many attempts got each
    /// status (attempts without an answer are not in it).
    pub statuses: BTreeMap<String, BTreeMap<String, BTreeMap<u16, u64>>>,
    /// Attempts that got no answer (refused, timed out, cut by the end of
    /// the session), per [`bucket`] and path.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unanswered: BTreeMap<String, BTreeMap<String, u64>>,
    /// Events never delivered because the delivery queue was full
    /// (`callback_dropped` lines, ledger version 9): no attempt was made,
    /// so they are in no count above.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropped: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One delivery attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallbackEntry {
    pub seq: u64,
    pub service: String,
    pub event: String,
    pub event_id: String,
    pub method: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub attempt: u32,
    pub origin: String,
    /// What `--webhook-faults` put on the delivery (`duplicate`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
    pub duration_ms: u64,
}

/// The origins a requirement counts by default: the built-in twin's own
/// events (`twin`), and the events an external twin delivered through the
/// authenticated ingress (`ingress`, ledger version 8): both are the
/// events of the twin the proxy routes to.
pub const COUNTED: &[&str] = &["twin", "ingress"];

/// Whether a [`bucket`] counts toward a requirement by default.
pub fn counted(bucket: &str) -> bool {
    COUNTED.contains(&bucket)
}

/// Where an attempt is counted: its origin, or `ORIGIN+FAULT` when a fault
/// was put on it, so that only the [`COUNTED`] buckets hold the faithful deliveries
/// of the twin's own events.
pub fn bucket(origin: &str, fault: Option<&str>) -> String {
    match fault {
        Some(f) => format!("{origin}+{f}"),
        None => origin.to_string(),
    }
}

impl Callbacks {
    pub fn is_empty(&self) -> bool {
        self.attempts == 0 && self.dropped == 0
    }

    /// Takes one `callback_dropped` line of the window.
    pub fn add_dropped(&mut self, events: u64) {
        self.dropped = self.dropped.saturating_add(events);
    }

    /// Takes one `callback` line of the window.
    pub fn add(&mut self, seq: u64, c: &CallbackLine) {
        self.attempts += 1;
        let path = super::strip_query(&c.path).to_string();
        let bucket = bucket(&c.origin, c.fault.as_deref());
        match c.status {
            Some(s) => {
                *self
                    .statuses
                    .entry(bucket)
                    .or_default()
                    .entry(path.clone())
                    .or_default()
                    .entry(s)
                    .or_default() += 1;
            }
            None => {
                *self
                    .unanswered
                    .entry(bucket)
                    .or_default()
                    .entry(path.clone())
                    .or_default() += 1;
            }
        }
        if self.entries.len() < JSON_ENTRY_CAP {
            self.entries.push(CallbackEntry {
                seq,
                service: c.service.clone(),
                event: c.event.clone(),
                event_id: c.event_id.clone(),
                method: c.method.clone(),
                path,
                status: c.status,
                error: c.error.clone(),
                attempt: c.attempt,
                origin: c.origin.clone(),
                fault: c.fault.clone(),
                duration_ms: c.duration_ms,
            });
        }
    }

    /// The text receipt's section: the count, then each attempt
    /// `METHOD "/path" event #attempt -> status` (or the error), and for a
    /// delivery that is not counted its origin and fault, at most `shown`. Recorded strings are quoted or escaped: an event type is
    /// the twin's word, a path the operator's, an error may quote the app.
    pub fn render(&self, out: &mut String, shown: usize) {
        let _ = writeln!(
            out,
            "{} callback attempt(s) to the app (webhook deliveries by veris):",
            self.attempts
        );
        for e in self.entries.iter().take(shown) {
            let answer = match (e.status, &e.error) {
                (Some(s), None) => s.to_string(),
                (Some(s), Some(why)) => format!("{s} ({})", escaped(why)),
                (None, Some(why)) => format!("no answer ({})", escaped(why)),
                (None, None) => "no answer".into(),
            };
            // What the delivery is, when it is not the twin's own event
            // sent faithfully: it does not count toward a requirement.
            let origin = match (e.origin.as_str(), &e.fault) {
                (origin, None) if counted(origin) => String::new(),
                (origin, None) => format!(" [{}: not counted]", token(origin)),
                (origin, Some(f)) => {
                    format!(" [{} fault {}: not counted]", token(origin), quoted(f))
                }
            };
            let _ = writeln!(
                out,
                "  {} {} {} {} #{} -> {answer}{origin}",
                token(&e.service),
                token(&e.method),
                quoted(&e.path),
                quoted(&e.event),
                e.attempt,
            );
        }
        let listed = self.entries.len().min(shown) as u64;
        if self.attempts > listed {
            let _ = writeln!(out, "  … and {} more", self.attempts - listed);
        }
        if self.dropped > 0 {
            let _ = writeln!(
                out,
                "  {} webhook event(s) dropped (queue full): never delivered, not in any count above",
                self.dropped
            );
        }
    }
}
