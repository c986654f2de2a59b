//! The live proxy, from both sides: its admin API and seal timer
//! (`admin`), and for readers, finding a live proxy through its state dir
//! (`discovery`), talking to it (`client`), what a ledger's session lines
//! say (`session`) and the twin cross-check (`twin_check`).

pub mod admin;
pub mod client;
pub mod discovery;
pub mod session;
pub mod twin_check;

pub use admin::{
    bind_admin, bind_metrics, serve_metrics, start_admin, AdminHandle, AdminListener, AdminStart,
};
pub use client::LiveStatus;
pub use discovery::{
    discover, require_gateway_sandbox, require_live, Discovery, ADDR_FILE, TOKEN_FILE,
};
pub use session::SessionFacts;
pub use twin_check::{service_refs, twin_cross_check_file, twin_newest_ids, ServiceRef};
