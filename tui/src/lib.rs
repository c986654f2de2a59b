//! veris-tui renders the live view of twin traffic: which vendor, which
//! call, what answer, and whether interception is intact.
//!
//! The pieces, in the order data flows through them:
//! - [`source`] turns a ledger file ([`follow`]) or the proxy's admin API
//!   ([`admin`]) into [`app::Event`]s, resuming after the last seq it delivered;
//! - [`app::App`] is the one state, changed only by [`app::App::update`];
//! - [`render::render`] draws it, reading nothing but the state;
//! - [`fleet::FleetApp`] is the fleet view's state (`veris tui --nats`): a
//!   row per sandbox from the stream's messages, and an [`app::App`] for
//!   the sandbox drilled into; [`fleet_render`] draws it;
//! - [`run()`] is the event loop that ties them to a terminal: it coalesces
//!   events and draws at most [`run::FPS`] times a second.
//!
//! The binary sets the terminal up, restores it, and sends logs to a file.
#![forbid(unsafe_code)]

pub mod admin;
pub mod app;
pub mod filter;
pub mod fleet;
pub mod fleet_render;
pub mod follow;
pub mod layout;
pub mod render;
pub mod run;
pub mod source;

pub use app::{Action, App, ConnState, Connection, Event, DEFAULT_CAPACITY};
pub use fleet::{FleetApp, FleetEvent, Message};
pub use run::{enter_terminal, leave_terminal, run, run_fleet, FleetOptions, RunOptions, TuiError};
pub use source::{ReceiptHook, SourceSpec};
