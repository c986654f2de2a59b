//! The ledger line: the serialized boundary between the proxy that writes it and
//! every reader (receipt, TUI, CI). Changing a field is an API change: bump
//! `LEDGER_VERSION` and keep a test that reads the old form.
//!
//! # File format (version 1)
//!
//! `ledger.jsonl` is UTF-8 JSON Lines: one JSON object per line, each line
//! terminated by a single `\n`, appended only. Fields in written order:
//!
//! - `v`: the format version, [`LEDGER_VERSION`] (`1`);
//! - `seq`: 1 for the first line, then exactly one more than the previous
//!   line, across proxy restarts (a restarted proxy continues the file after a
//!   `session` line);
//! - `ts`: RFC 3339 UTC with milliseconds (`2026-11-29T07:28:19.123Z`);
//! - `kind`: `session`, `request`, `passthrough`, `blocked`, `upstream_error`
//!   (later versions add `trust_failure`, `ech`, `quic`, `seal`), followed by
//!   that kind's fields (see [`Entry`]);
//! - `prev`: lower-case hex SHA-256 of the previous line's exact bytes without
//!   its `\n`; [`GENESIS_PREV`] (64 zeros) on the first line.
//!
//! Readers ignore unknown fields; an unknown `kind` is reported as a problem,
//! not a crash. A last line without its `\n` is torn (a crash mid-write): it is
//! reported and never counted. Secrets never reach the file (see `redact`).

use serde::{Deserialize, Serialize};

/// Version written in every line's `v` field.
pub const LEDGER_VERSION: u32 = 1;

/// `prev` of the first line of a ledger.
pub const GENESIS_PREV: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// An unterminated last line: what a crash mid-write leaves behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TornTail {
    /// 1-based line number the torn line occupied in the file.
    pub line: usize,
    /// Its length in bytes (no newline was ever written).
    pub bytes: usize,
}

/// Proxy mode for hosts no service claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Unmapped hosts are tunneled to their real destination and recorded.
    Passthrough,
    /// Unmapped hosts are refused with 421 and recorded as blocked.
    Strict,
}

/// How traffic reached the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ListenerTier {
    /// The client was told about the proxy (`HTTPS_PROXY`, `CONNECT`).
    Explicit,
    /// The kernel redirected the connection (nftables).
    Transparent,
}

/// One ledger line as it appears on disk: `{"v":1,"seq":..,"ts":..,"kind":..,<kind fields>,"prev":..}`.
///
/// `prev` is the SHA-256 (lower-case hex) of the previous line's bytes, without
/// its trailing newline; the first line has [`GENESIS_PREV`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Line {
    pub v: u32,
    pub seq: u64,
    /// RFC 3339 UTC with milliseconds, e.g. `2026-11-29T07:28:19.123Z`.
    pub ts: String,
    #[serde(flatten)]
    pub entry: Entry,
    pub prev: String,
}

/// What was decided. Every text field is redacted before it is built (see the
/// `redact` module); the writer redacts again as a last line of defence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Entry {
    /// A proxy started writing to this ledger.
    Session {
        run_id: String,
        sandbox_id: String,
        mode: Mode,
        tier: ListenerTier,
        /// Twin base URL (no credentials).
        twin: String,
        pid: u32,
        /// veris version that wrote the session.
        version: String,
        /// Host:port the proxy listens on.
        listen: String,
        /// A torn last line this proxy found when it opened the ledger; it was
        /// moved aside to `ledger.jsonl.torn-<seq>` (never deleted) before
        /// this session line continued the chain.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        recovered_torn_tail: Option<TornTail>,
    },
    /// A vendor request forwarded to the twin; written when the twin's
    /// response head arrived, before the client sees it.
    Request {
        service: String,
        host: String,
        method: String,
        path: String,
        /// Redacted query string without the leading `?`, absent when empty.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        query: Option<String>,
        status: u16,
        /// Client-leg HTTP version: `HTTP/1.1` or `HTTP/2`.
        http: String,
        tier: ListenerTier,
        /// Request body bytes forwarded when the response head arrived.
        bytes_in: u64,
        /// Response body length when the twin declared it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bytes_out: Option<u64>,
        /// Time from the request head to the twin's response head.
        duration_ms: u64,
        /// Upstream URL without query.
        upstream: String,
        /// Recorded request headers (names lower-case, secrets redacted).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        headers: Vec<(String, String)>,
        /// True for a WebSocket upgrade relayed to the twin.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        websocket: bool,
    },
    /// A connection to an unmapped host tunneled to its real destination;
    /// written when the tunnel closes.
    Passthrough {
        host: String,
        port: u16,
        tier: ListenerTier,
        bytes_in: u64,
        bytes_out: u64,
        duration_ms: u64,
        /// Why it was let through: `allow_passthrough`, `loopback`, `mode`.
        reason: String,
    },
    /// A request to an unmapped host refused in strict mode (421).
    Blocked {
        host: String,
        port: u16,
        tier: ListenerTier,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        method: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<String>,
        reason: String,
    },
    /// A vendor request whose twin upstream failed; the client got `status`.
    UpstreamError {
        service: String,
        host: String,
        method: String,
        path: String,
        upstream: String,
        status: u16,
        /// `veris_upstream_unreachable` or `veris_upstream_timeout`.
        error: String,
        tier: ListenerTier,
        duration_ms: u64,
    },
    /// A client aborted the TLS handshake after the proxy offered its minted
    /// leaf: the client does not trust the veris CA for this host.
    TrustFailure {
        host: String,
        port: u16,
        tier: ListenerTier,
        /// The service the host is routed to, when it is a vendor host.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        service: Option<String>,
        /// `unknown_ca`, `bad_certificate`, `certificate_unknown`,
        /// `certificate_expired`, `unsupported_certificate`, `other:<alert>`
        /// or `no_alert` (the client closed right after the server flight).
        alert: String,
    },
    /// A signature over the chain head: `sealed_seq` is the seq of the line
    /// this seal's `prev` hashes; the Ed25519 signature covers
    /// `veris-seal-v1 {sealed_seq} {prev}` and verifies with `ledger.pub`.
    Seal {
        sealed_seq: u64,
        /// Lower-case hex of the 64-byte signature.
        signature: String,
        /// Lower-case hex SHA-256 of the public key that signed.
        key_id: String,
        /// `interval`, `shutdown` or `demand`.
        reason: String,
    },
    /// QUIC (UDP 443) attempts caught by the proxy's silent UDP sink, so the
    /// client fell back to TCP.
    Quic {
        /// SNI decrypted from the QUIC Initial, when it could be read.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host: Option<String>,
        /// Original destination address.
        dst: String,
        attempts: u64,
    },
    /// A passthrough ClientHello carried the Encrypted Client Hello extension
    /// (0xfe0d): its real destination may be hidden behind `host`.
    Ech {
        host: String,
        port: u16,
        tier: ListenerTier,
    },
}

impl Entry {
    /// The `kind` tag as written.
    pub fn kind(&self) -> &'static str {
        match self {
            Entry::Session { .. } => "session",
            Entry::Request { .. } => "request",
            Entry::Passthrough { .. } => "passthrough",
            Entry::Blocked { .. } => "blocked",
            Entry::UpstreamError { .. } => "upstream_error",
            Entry::TrustFailure { .. } => "trust_failure",
            Entry::Seal { .. } => "seal",
            Entry::Quic { .. } => "quic",
            Entry::Ech { .. } => "ech",
        }
    }
}
