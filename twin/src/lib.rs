//! veris-twin: a small built-in twin that speaks the twin contract (DESIGN §6).
//!
//! The twin is the embedded default that lets veris run offline, and the reference
//! implementation of the contract the proxy and the receipt rely on:
//!
//! - vendor traffic at `/s/{sandbox}/{service}/{path…}` is answered from [`Fixtures`]
//!   (declarative method + path pattern → status + templated JSON body, with an
//!   in-memory object store so create-then-read flows work);
//! - the control surface at `/s/{sandbox}/{service}/veris/…` serves `health` and the
//!   request log (`requests`), whose rows carry a tier (`handler`, `fault`, `control`,
//!   `delivery`) and ids strictly increasing per (sandbox, service);
//! - with a log file, every row is appended as JSONL and reloaded on start so ids
//!   continue across restarts;
//! - with a credential ([`TwinOptions::credential`], the veris proxy's per-start
//!   secret), vendor requests without `Authorization: Bearer <credential>` get a 401
//!   and no row: only the proxy can make the twin execute, and log, a vendor call.
//!   The control surface stays open (it only reads).
//!
//! The crate binds nothing and reads no environment: [`serve`] takes a bound listener,
//! an optional rustls config and a shutdown future.
#![forbid(unsafe_code)]

mod fixtures;
#[doc(hidden)]
pub mod fuzzing;
mod log;
mod server;
mod template;
mod twin;
pub mod webhook;

use std::path::PathBuf;

pub use fixtures::{ErrorStyle, Fixtures};
pub use log::{RequestRow, Tier};
pub use server::serve;
pub use twin::{Twin, TwinOptions};

/// Everything that can fail while loading fixtures, opening the request log or serving.
#[derive(Debug, thiserror::Error)]
pub enum TwinError {
    /// The fixture file could not be read.
    #[error("reading fixtures {path}")]
    ReadFixtures {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The fixture text is not valid JSON of the fixture format.
    #[error("parsing fixtures")]
    ParseFixtures(#[source] serde_json::Error),
    /// A fixture parsed but is not usable (bad pattern, template, status, …).
    #[error("fixture {index} ({service} {method} {path}): {reason}")]
    InvalidFixture {
        index: usize,
        service: String,
        method: String,
        path: String,
        reason: String,
    },
    /// The request log file could not be opened or read.
    #[error("opening request log {path}")]
    OpenLog {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Accepting connections failed in a way that is not transient.
    #[error("accepting connections")]
    Accept(#[source] std::io::Error),
}
