//! veris-receipt owns the ledger format (one versioned JSON line per decision,
//! hash-chained), the writer that appends to it, the reader that verifies it,
//! redaction of secrets before anything is written, and the receipt model that
//! summarizes a window of the ledger. It knows nothing of sockets.
#![forbid(unsafe_code)]

pub mod capture;
pub mod entry;
pub mod fleet_cert;
pub mod har;
pub mod hash;
pub mod ledger;
pub mod quote;
pub mod receipt;
pub mod redact;
pub mod seal;
mod wire;

pub use entry::{
    BlockedLine, CallbackLine, CapturedBody, CheckLine, Coverage, Entry, Line, ListenerTier, Mode,
    MovedAside, PassthroughLine, RequestLine, ReservedPathLine, ResponseIncompleteLine,
    SessionLine, TlsAbandonedLine, TornTail, TrustFailureLine, TunnelCloseLine, UpstreamErrorLine,
    GENESIS_PREV, LEDGER_VERSION, READABLE_VERSIONS,
};
pub use ledger::{Ledger, LedgerError, LedgerRead, OpenReport, Problem};
pub use receipt::{Receipt, Requirement, Verdict};
