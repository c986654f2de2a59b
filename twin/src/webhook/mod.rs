//! Webhooks the twin owes the app: the vendor-shaped events for what the
//! workload really did ([`event`]) and the vendor's signature over them
//! ([`sign`]). The twin only hands events to the [`EventSink`] it was given;
//! delivering them is the proxy's job (it records every attempt).

pub mod event;
pub mod sign;

pub use event::{channel, Dropped, Event, EventSink, EVENT_QUEUE};
pub use sign::{Secret, SIGNATURE_HEADER};
