//! The ledger line: the serialized boundary between the proxy that writes it and
//! every reader (receipt, TUI, CI). Changing a field is an API change: bump
//! `LEDGER_VERSION` and keep a test that reads the old form.
//!
//! # File format (version 9; versions 1 to 8 are still read)
//!
//! `ledger.jsonl` is UTF-8 JSON Lines: one JSON object per line, each line
//! terminated by a single `\n`, appended only. Fields in written order:
//!
//! - `v`: the format version, [`LEDGER_VERSION`] (`9`); readers accept every
//!   version in [`READABLE_VERSIONS`] (version 2 added the session's key,
//!   uid and twin-head fields, `client_gone`, and the kinds `reserved_path`,
//!   `tamper` and `check`; version 3 added the kinds `tls_abandoned`,
//!   `response_incomplete` and `tunnel_close`, wrote `passthrough` when a
//!   tunnel opens (bytes then 0) rather than when it closes, and
//!   stopped writing `trust_failure` for a handshake that ended without a
//!   certificate alert; no earlier field changed meaning, and a reader
//!   judges an old `trust_failure` by its alert ([`is_refusal_alert`]);
//!   version 4 added the kind `body_capture`, written only when the proxy
//!   runs with `--capture-bodies`; no earlier field changed meaning;
//!   version 5 seals sign their `reason` too (`veris-seal-v2`, see
//!   `seal`), every session seals with a key of its own that never leaves
//!   the proxy's memory (`key_storage` is then always `memory`), a
//!   session's `moved_aside` counts the requests of the file it set aside,
//!   and it added the coverage's `sockets_reachable` and `bundles`, `upstream_error`'s
//!   `bytes_in` and `declared_in` and its errors
//!   `veris_request_body_incomplete` and `veris_session_ended`, written for
//!   requests sent to the twin that got no answer because the client's body
//!   broke off or the session ended first; no earlier field changed meaning;
//!   version 6 added the kind `callback`, one line per webhook delivery
//!   attempt to the app; no earlier field changed meaning; version 7 added
//!   the callback's `fault` and the origins `trigger` and `replay`: a
//!   version-6 reader would count a fault-injected delivery as the twin's
//!   own, so it must refuse these lines rather than read them; version 8
//!   added the origin `ingress`, an external twin's event forwarded through
//!   the authenticated ingress, which counts like `twin`: a version-7
//!   reader would count none of them, so it must refuse these lines;
//!   version 9 added the kind `callback_dropped` (webhook events the
//!   delivery queue had no room for, counted), the callback's `tls`
//!   (delivered to an `https://` URL), and `duration_us` on `request` and
//!   `callback` (the same time in microseconds; `duration_ms` is whole, 0
//!   on loopback): a version-8 reader would take a run whose events were
//!   dropped for one that delivered them all);
//! - `seq`: 1 for the first line, then exactly one more than the previous
//!   line, across proxy restarts (a restarted proxy continues the file after a
//!   `session` line);
//! - `ts`: RFC 3339 UTC with milliseconds (`2026-11-29T07:28:19.123Z`);
//! - `kind`: `session`, `request`, `passthrough`, `blocked`, `upstream_error`,
//!   `trust_failure`, `ech`, `quic`, `seal`, `reserved_path`, `tamper`,
//!   `check`, `redirect_change`, `udp_dropped`, `dns`, `tls_abandoned`,
//!   `response_incomplete`, `tunnel_close`, `body_capture`, `callback`,
//!   `callback_dropped`, followed by that kind's
//!   fields (see [`Entry`]);
//! - `prev`: lower-case hex SHA-256 of the previous line's exact bytes without
//!   its `\n`; [`GENESIS_PREV`] (64 zeros) on the first line.
//!
//! Readers ignore unknown fields; an unknown `kind` is reported as a problem,
//! not a crash. A last line without its `\n` is torn (a crash mid-write): it is
//! reported and never counted. Secrets never reach the file (see `redact`).

use serde::{Deserialize, Serialize};

/// Version written in every line's `v` field.
pub const LEDGER_VERSION: u32 = 9;

/// Versions a reader accepts.
pub const READABLE_VERSIONS: &[u32] = &[1, 2, 3, 4, 5, 6, 7, 8, 9];

/// Every `kind` a reader knows.
pub const KINDS: &[&str] = &[
    "session",
    "request",
    "passthrough",
    "blocked",
    "upstream_error",
    "trust_failure",
    "seal",
    "quic",
    "ech",
    "reserved_path",
    "tamper",
    "check",
    "redirect_change",
    "udp_dropped",
    "dns",
    "tls_abandoned",
    "response_incomplete",
    "tunnel_close",
    "body_capture",
    "callback",
    "callback_dropped",
];

/// TLS alerts that name the certificate: a client that sends one after our
/// leaf refused it (a `trust_failure`). rustls's `AlertDescription` names,
/// in the ledger's spelling. `access_denied` is among them (the peer got a
/// certificate and decided not to proceed); `certificate_required` is not
/// (it is about client certificates, which the proxy never asks for).
pub const REFUSAL_ALERTS: &[&str] = &[
    "unknown_ca",
    "bad_certificate",
    "unsupported_certificate",
    "certificate_revoked",
    "certificate_expired",
    "certificate_unknown",
    "access_denied",
    "bad_certificate_status_response",
    "bad_certificate_hash_value",
    "certificate_unobtainable",
];

/// True when `alert` (a `trust_failure`'s `alert`) is evidence that the
/// client refused the certificate; `no_alert` and `other:…` are not.
pub fn is_refusal_alert(alert: &str) -> bool {
    REFUSAL_ALERTS.contains(&alert)
}

/// `upstream_error` errors after which the twin may have executed the
/// request (DESIGN §7a.8): no answer in time, a request body the client
/// never finished (the twin got the head and part of the body), or a
/// session that ended while the request waited. Only
/// `veris_upstream_unreachable` says it did not reach the twin.
pub const MAY_HAVE_REACHED_TWIN: &[&str] = &[
    "veris_upstream_timeout",
    "veris_request_body_incomplete",
    "veris_session_ended",
];

/// True when an `upstream_error` with `error` may have been executed by
/// the twin ([`MAY_HAVE_REACHED_TWIN`]).
pub fn may_have_reached_twin(error: &str) -> bool {
    MAY_HAVE_REACHED_TWIN.contains(&error)
}

/// Refused DNS lookups (`dns` lines with `refused`) recorded per session at
/// most: the first ones name the stub as the cause; more would only let a
/// flood of made-up names fill the ledger.
pub const DNS_REFUSED_LINES: u64 = 20;

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

/// A ledger file set aside because this proxy could not verify it with its
/// own key (a chain break, an unsealed tail, no seals, another key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MovedAside {
    /// Where it is now.
    pub file: String,
    /// Its last seq and that line's hash.
    pub head_seq: u64,
    pub head_hash: String,
    /// Why it could not be continued.
    pub why: String,
    /// Complete `request` lines found in it when it was moved (version 5):
    /// what a reader of the new chain would otherwise never see. Counted
    /// from a file the workload could have edited, so a hint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<u64>,
}

/// What the transparent tier's kernel rules cover (DESIGN §7a.9).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    /// Outbound TCP redirected to the proxy: every port (`None`) or these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_ports: Option<Vec<u16>>,
    /// UDP 443: `sink` (the proxy's silent QUIC sink) or `open`.
    pub quic: String,
    /// DNS: `stub` (answered by veris), `resolvers` (only to the configured
    /// resolvers: a channel out by itself) or `open`.
    pub dns: String,
    /// Other UDP: `dropped` (and counted) or `open`.
    pub udp_other: String,
    /// Pings and protocols other than TCP and UDP: `dropped` or `open`
    /// (absent from rules that did not say: `unknown`).
    #[serde(default = "unknown")]
    pub ip_other: String,
    /// IPv6 covered as IPv4 is.
    pub ipv6: bool,
    /// How the proxy's own dials are exempted: `uid <n>`, `mark <hex>`.
    pub exempt: Vec<String>,
    /// `veris` (installed and watched by the proxy's helper) or `external`
    /// (declared by the operator; veris cannot check it).
    pub installed_by: String,
    /// How `veris run` confined its child, when it did: `netns` (its own
    /// user, network, mount and PID namespaces, every capability dropped,
    /// no_new_privs: it can neither change the rules nor leave them) or
    /// `landlock` (the explicit tier, with the child's TCP `connect()`
    /// allowed only to the proxy's port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<String>,
    /// Isolated runs (version 5): where the command can still reach a
    /// host daemon's unix socket, a path a network namespace does not
    /// separate — home directories always, `/tmp`, `/var/tmp` and
    /// `/dev/shm` when shared (`--share-tmp`). `/run` is always fresh.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sockets_reachable: Vec<String>,
    /// Isolated runs (version 5): the CA bundle files, besides the system
    /// trust stores, that held the veris bundle (a Java keystore: its
    /// truststore) before the command started — those its runtimes ship
    /// (found in the site-packages and JDK of the `python3`, `python` and
    /// `java` on its PATH) and any `--trust-file`. The command starts only
    /// once each is covered. A bundle installed during the run is not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bundles: Vec<String>,
    /// Passthroughs went through an upstream HTTP proxy
    /// (`--upstream-proxy`), which resolves their names itself: what it
    /// dialed for a name is beyond veris's checks.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub upstream_proxy: bool,
}

fn unknown() -> String {
    "unknown".into()
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
    /// A sandbox platform tunneled the connection to a gateway outside the
    /// sandbox (SOCKS5 or HTTP CONNECT, a credential per sandbox). Added
    /// within ledger version 5: no earlier line changes meaning.
    Gateway,
}

impl ListenerTier {
    /// The word a line's `tier` is written as.
    pub fn word(self) -> &'static str {
        match self {
            ListenerTier::Explicit => "explicit",
            ListenerTier::Transparent => "transparent",
            ListenerTier::Gateway => "gateway",
        }
    }
}

/// One ledger line as it appears on disk: `{"v":1,"seq":..,"ts":..,"kind":..,<kind fields>,"prev":..}`.
///
/// `prev` is the SHA-256 (lower-case hex) of the previous line's bytes, without
/// its trailing newline; the first line has [`GENESIS_PREV`].
///
/// Its serde form (written and read in one pass, without an intermediate
/// tree) is in the `wire` module: the entry's variant name goes under
/// `kind`, its fields beside the line's own.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub v: u32,
    pub seq: u64,
    /// RFC 3339 UTC with milliseconds, e.g. `2026-11-29T07:28:19.123Z`.
    pub ts: String,
    pub entry: Entry,
    pub prev: String,
}

/// What was decided. Its text fields are redacted when it is appended
/// (`redact::entry`, in the ledger's queue: the one door into the record);
/// seal and tamper lines, the ledger's own words, are written as built.
///
/// On its own it serializes externally tagged (`{"request":{...}}`); in a
/// ledger line ([`Line`]) the tag is the line's `kind` field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Entry {
    /// A proxy started writing to this ledger.
    Session(SessionLine),
    /// A vendor request forwarded to the twin; written when the twin's
    /// response head arrived, before the client sees it.
    Request(RequestLine),
    /// A connection to an unmapped host tunneled to its real destination;
    /// written when the tunnel opens (bytes 0; its `tunnel_close` line says
    /// what moved), or when the destination could not be reached. Lines
    /// before version 3 were written at the close, with the bytes.
    Passthrough(PassthroughLine),
    /// A request to an unmapped host refused in strict mode (421).
    Blocked(BlockedLine),
    /// A vendor request sent to the twin that got no answer from it; the
    /// client got `status` (when it was still there).
    UpstreamError(UpstreamErrorLine),
    /// A client aborted the TLS handshake after the proxy offered its minted
    /// leaf with an alert that names the certificate ([`REFUSAL_ALERTS`]):
    /// the client does not trust the veris CA for this host. (Lines written
    /// before version 3 may carry `no_alert` or `other:<alert>`: readers
    /// take those as [`Entry::TlsAbandoned`] handshakes.)
    TrustFailure(TrustFailureLine),
    /// A signature over the chain head: `sealed_seq` is the seq of the line
    /// this seal's `prev` hashes; the Ed25519 signature covers
    /// `veris-seal-v2 {sealed_seq} {prev} {reason}` (before version 5:
    /// `veris-seal-v1 {sealed_seq} {prev}`, the reason unsigned) and
    /// verifies with the key its session line names.
    Seal {
        sealed_seq: u64,
        /// Lower-case hex of the 64-byte signature.
        signature: String,
        /// Lower-case hex SHA-256 of the public key that signed.
        key_id: String,
        /// `interval`, `demand`, `shutdown` (the proxy stopped) or `removed`
        /// (a gateway's sandbox left it for good): [`crate::seal::is_final`].
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
    /// A request on a vendor host for a path the proxy answers itself and
    /// never forwards: the twin's control surface (`/veris/…`, 404) or a
    /// path with dot-segments (raw or percent-encoded, 400). Never counted
    /// as a vendor call.
    ReservedPath(ReservedPathLine),
    /// The proxy found its ledger file changed behind its back: `replaced`
    /// (the path names another inode) or `cut` (shorter than what it wrote).
    /// Written into the proxy's own chain; a window holding one fails.
    Tamper { what: String, detail: String },
    /// The result of an integrity check the proxy ran itself (the canary
    /// through the interception path, the twin cross-check) before sealing,
    /// so an offline reader who pins the seal key can rely on it.
    Check(CheckLine),
    /// A passthrough ClientHello carried the Encrypted Client Hello extension
    /// (0xfe0d): its real destination may be hidden behind `host`.
    Ech {
        host: String,
        port: u16,
        tier: ListenerTier,
        /// The address actually dialed (`ip:port`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dst: Option<String>,
    },
    /// The root-side helper saw the kernel rules (`table inet veris`)
    /// change while the proxy ran: the redirect cannot be trusted for the
    /// window that holds this line.
    RedirectChange { detail: String },
    /// Datagrams the rules dropped (UDP other than QUIC and DNS), counted by
    /// the root-side helper since the rules were installed.
    UdpDropped { packets: u64 },
    /// Isolated run: the first lookup of a name, answered by veris's DNS
    /// stub with a synthetic address (nothing was forwarded). Later lookups
    /// of the same name are not repeated. With `refused`, a lookup the stub
    /// answered SERVFAIL because its table of names was full (at most
    /// [`DNS_REFUSED_LINES`] such lines a session): the name did not resolve
    /// because of veris's stub, not the workload's code.
    Dns {
        name: String,
        /// Query type (`A`, `AAAA`, `TXT`, or the number).
        qtype: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        refused: bool,
    },
    /// A TLS connection the proxy terminated that ended after our leaf was
    /// sent with no request and no alert naming the certificate: not
    /// evidence of a refusal (a client that gave up closes the same way),
    /// so it never fails a receipt by itself; the receipt lists it.
    TlsAbandoned(TlsAbandonedLine),
    /// The response body of a recorded request did not reach the client
    /// whole. The `request` line (written when the head arrived, before the
    /// client saw it) keeps its status; this line, written when the body
    /// ended short, says what the client actually got.
    ResponseIncomplete(ResponseIncompleteLine),
    /// A tunnel whose `passthrough` line was written when it opened has
    /// closed: the bytes counted on the client's side, also when the copy
    /// ended with an error. A tunnel still open when the proxy stopped has
    /// none.
    TunnelClose(TunnelCloseLine),
    /// The bodies of a recorded request as the proxy stored them in its
    /// capture dir (`--capture-bodies`): redacted, cut at the per-body cap,
    /// and named here with their SHA-256, so a reader can tell a stored file
    /// from one the workload edited (the dir is not sealed, this line is).
    /// Written once both bodies ended, after the request's own line. Never
    /// evidence for a receipt's verdict and never counted as a request.
    BodyCapture {
        /// The `seq` of the `request` line whose bodies these are.
        of: u64,
        request: CapturedBody,
        response: CapturedBody,
    },
    /// One attempt of veris's to deliver a webhook event to the app (DESIGN
    /// §15), written when the attempt ended. Only veris's own deliveries
    /// are these lines: nothing the workload sends can become one.
    Callback(CallbackLine),
    /// Webhook events of one service that were never delivered because the
    /// delivery queue was full (a workload making objects faster than the
    /// app takes their deliveries), counted: at most one line a second per
    /// service, each with every drop since the previous one, and one more
    /// before the session's final seal, so no drop goes uncounted (version 9).
    CallbackDropped(CallbackDroppedLine),
}

/// The fields of an [`Entry::Session`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionLine {
    pub run_id: String,
    pub sandbox_id: String,
    pub mode: Mode,
    pub tier: ListenerTier,
    /// Twin base URL (no credentials).
    pub twin: String,
    pub pid: u32,
    /// veris version that wrote the session.
    pub version: String,
    /// Host:port the proxy listens on.
    pub listen: String,
    /// A torn last line this proxy found when it opened the ledger; it was
    /// moved aside to `ledger.jsonl.torn-<seq>` (never deleted) before
    /// this session line continued the chain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered_torn_tail: Option<TornTail>,
    /// Fingerprint (`key_id`) of the key that seals this session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    /// That key's raw Ed25519 public key, lower-case hex: a reader who
    /// pins the fingerprint (`veris receipt --key`) verifies the seals
    /// with it. Not a trust anchor by itself: anyone can write a session
    /// line naming their own key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
    /// Where the private key lives: `memory` (this process only; every
    /// session from version 5) or `file` (`<state>/seal.key` of an
    /// earlier `serve`, readable by `proxy_uid`). The proxy's word, so a
    /// reader believes `file` and never takes `memory` as proof: custody
    /// comes from how the reader got its pin (DESIGN §7a.13).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_storage: Option<String>,
    /// The uid the proxy runs as once it serves traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_uid: Option<u32>,
    /// The workload's uid when the proxy knows it (`veris run`: its own
    /// child; `--workload-uid`); absent when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_uid: Option<u32>,
    /// Newest request id per service in the twin's own log when this
    /// session started: the twin cross-check counts rows after it.
    /// Absent when the twin's log could not be read at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub twin_heads: Option<std::collections::BTreeMap<String, u64>>,
    /// An earlier ledger this proxy could not verify with its own key,
    /// moved aside before this session started a new chain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_aside: Option<Box<MovedAside>>,
    /// Transparent tier: what the installed kernel rules send to the
    /// proxy; the receipt's leaks are computed from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage: Option<Box<Coverage>>,
}

/// The fields of an [`Entry::Request`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestLine {
    pub service: String,
    pub host: String,
    pub method: String,
    pub path: String,
    /// Redacted query string without the leading `?`, absent when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    pub status: u16,
    /// Client-leg HTTP version: `HTTP/1.1` or `HTTP/2`.
    pub http: String,
    pub tier: ListenerTier,
    /// Request body bytes forwarded when the response head arrived.
    pub bytes_in: u64,
    /// Response body length when the twin declared it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_out: Option<u64>,
    /// Time from the request head to the twin's response head.
    pub duration_ms: u64,
    /// The same time in microseconds (version 9; absent before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_us: Option<u64>,
    /// Upstream URL without query.
    pub upstream: String,
    /// Recorded request headers (names lower-case, secrets redacted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<(String, String)>,
    /// True for a WebSocket upgrade relayed to the twin.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub websocket: bool,
    /// The client had gone when the twin's answer arrived: the twin
    /// executed the request, the client never saw the answer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub client_gone: bool,
}

/// The fields of an [`Entry::Callback`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallbackLine {
    /// The service whose twin made the event (`stripe`).
    pub service: String,
    /// The event's type (`charge.succeeded`).
    pub event: String,
    /// The event's id (`evt_…`): attempts of one delivery share it.
    pub event_id: String,
    /// Where the delivery went: the URL's `host:port`.
    pub target: String,
    pub method: String,
    /// The URL's path, and its query (redacted) when it had one.
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// The app's answer, when a response head arrived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Why there is no status, or why the answer was cut (`connect: …`,
    /// `timeout`, `body_too_long`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Time from the dial to the end of the answer (or the error).
    pub duration_ms: u64,
    /// The same time in microseconds (version 9; absent before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_us: Option<u64>,
    /// 1 for the first attempt of an event, then one more per retry.
    pub attempt: u32,
    /// Who asked for the delivery: `twin` (an object the twin created for
    /// a request it served), `trigger` (`veris trigger`: a fixture object),
    /// `replay` (`veris replay`) or `ingress` (an external twin's event,
    /// forwarded unchanged through the ingress with its token; version 8).
    /// Only `twin` and `ingress` deliveries without a `fault` count toward
    /// a callback requirement by default.
    pub origin: String,
    /// The faults `--webhook-faults` put on this delivery, comma-separated
    /// (`duplicate`, `reorder`, `delay=30s`, `stale-signature`,
    /// `bad-signature`); absent for a faithful one (and in version 6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
    /// Delivered to an `https://` URL: over TLS, the app's certificate
    /// verified (version 9; absent for `http://`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tls: bool,
}

/// The fields of an [`Entry::CallbackDropped`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallbackDroppedLine {
    /// The service whose events were dropped (`stripe`).
    pub service: String,
    /// Events dropped since the previous such line.
    pub events: u64,
    /// `queue_full`.
    pub reason: String,
}

/// The fields of an [`Entry::Passthrough`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PassthroughLine {
    pub host: String,
    pub port: u16,
    pub tier: ListenerTier,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub duration_ms: u64,
    /// Why it was let through: `allow_passthrough`, `loopback`, `mode`.
    pub reason: String,
    /// The address actually dialed (`ip:port`), beside the name the
    /// client gave in `host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<String>,
}

/// The fields of an [`Entry::Blocked`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockedLine {
    pub host: String,
    pub port: u16,
    pub tier: ListenerTier,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub reason: String,
    /// The destination the client's bytes were headed for (`ip:port`),
    /// when known (transparent tier: the original destination).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<String>,
}

/// The fields of an [`Entry::UpstreamError`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpstreamErrorLine {
    pub service: String,
    pub host: String,
    pub method: String,
    pub path: String,
    pub upstream: String,
    pub status: u16,
    /// `veris_upstream_unreachable` (did not reach the twin),
    /// `veris_upstream_timeout` (no answer in time), and from version
    /// 5 `veris_request_body_incomplete` (the client's body broke off:
    /// it left, or its body ended short or with an error, or had not
    /// ended when the session did) and `veris_session_ended` (the
    /// session ended before the twin answered). All but the first may
    /// have been executed by the twin ([`may_have_reached_twin`]).
    pub error: String,
    pub tier: ListenerTier,
    pub duration_ms: u64,
    /// Request body bytes forwarded to the twin (version 5; written
    /// with the errors version 5 added).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_in: Option<u64>,
    /// The request body length the client declared (`Content-Length`),
    /// when it did (version 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared_in: Option<u64>,
}

/// The fields of an [`Entry::TrustFailure`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrustFailureLine {
    pub host: String,
    pub port: u16,
    pub tier: ListenerTier,
    /// The service the host is routed to, when it is a vendor host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// One of [`REFUSAL_ALERTS`] (`unknown_ca`, `bad_certificate`, ...).
    pub alert: String,
}

/// The fields of an [`Entry::ReservedPath`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReservedPathLine {
    pub service: String,
    pub host: String,
    pub method: String,
    pub path: String,
    pub status: u16,
    /// `veris_reserved_path` or `veris_bad_path`.
    pub error: String,
    pub tier: ListenerTier,
}

/// The fields of an [`Entry::Check`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckLine {
    pub name: String,
    /// `ok`, `failed` or `unverified`.
    pub status: String,
    pub detail: String,
    /// The window the check covered: `since_seq < seq <= until_seq`.
    pub since_seq: u64,
    pub until_seq: u64,
}

/// The fields of an [`Entry::TlsAbandoned`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TlsAbandonedLine {
    pub host: String,
    pub port: u16,
    pub tier: ListenerTier,
    /// The service the host is routed to, when it is a vendor host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// `handshake`: the client closed (or reset, or sent an alert that
    /// names no certificate) before finishing the handshake;
    /// `no_request`: the handshake finished and the client closed
    /// without sending one byte (GnuTLS clients such as wget refuse a
    /// certificate this way).
    pub stage: String,
    /// The alert the client sent, when it sent one (`handshake_failure`,
    /// `close_notify`, ...); absent for a bare close or reset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert: Option<String>,
    /// `no_request`: the protocol the handshake agreed (ALPN, `h2`,
    /// `http/1.1`), when it agreed one (version 5). An HTTP/2 client
    /// that dialed several connections at once closes the ones it
    /// does not need this way, trusting the certificate all along.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alpn: Option<String>,
}

/// The fields of an [`Entry::ResponseIncomplete`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseIncompleteLine {
    /// The `seq` of the `request` line it completes.
    pub of: u64,
    /// That request's service.
    pub service: String,
    /// Body bytes handed to the client's connection.
    pub bytes: u64,
    /// The length the twin declared (`Content-Length`), when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared: Option<u64>,
    /// `twin_cut`: the twin's body ended early or with an error (the
    /// client got a broken response); `client_gone`: the client left
    /// before the body ended.
    pub reason: String,
}

/// The fields of an [`Entry::TunnelClose`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TunnelCloseLine {
    /// The `seq` of the `passthrough` line it closes.
    pub of: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub duration_ms: u64,
    /// Why the copy ended early (a reset, a failed upgrade), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One body of a [`Entry::BodyCapture`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapturedBody {
    /// Body bytes that went through the proxy (all of them, also past the cap).
    pub bytes: u64,
    /// The sender's `Content-Type`, when it sent one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime: Option<String>,
    /// The file in the capture dir (a bare name, no directory), when stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Lower-case hex SHA-256 of the stored file's bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Length of the stored file (the redacted text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored: Option<u64>,
    /// The body was longer than the per-body cap and cut at this many
    /// bytes before it was redacted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated_at: Option<u64>,
    /// Why nothing was stored: `empty`, `binary` (not text, or not UTF-8:
    /// only the size is kept), `total_cap` (the dir's total was reached),
    /// `store_failed` (the file could not be created: something already
    /// stood at its name), `dropped` (the proxy's capture queue was full:
    /// the request was never slowed for a capture).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

impl Entry {
    /// The `kind` tag as written.
    pub fn kind(&self) -> &'static str {
        match self {
            Entry::Session(_) => "session",
            Entry::Request(_) => "request",
            Entry::Passthrough(_) => "passthrough",
            Entry::Blocked(_) => "blocked",
            Entry::UpstreamError(_) => "upstream_error",
            Entry::TrustFailure(_) => "trust_failure",
            Entry::Seal { .. } => "seal",
            Entry::Quic { .. } => "quic",
            Entry::Ech { .. } => "ech",
            Entry::ReservedPath(_) => "reserved_path",
            Entry::Tamper { .. } => "tamper",
            Entry::Check(_) => "check",
            Entry::RedirectChange { .. } => "redirect_change",
            Entry::UdpDropped { .. } => "udp_dropped",
            Entry::Dns { .. } => "dns",
            Entry::TlsAbandoned(_) => "tls_abandoned",
            Entry::ResponseIncomplete(_) => "response_incomplete",
            Entry::TunnelClose(_) => "tunnel_close",
            Entry::BodyCapture { .. } => "body_capture",
            Entry::Callback(_) => "callback",
            Entry::CallbackDropped(_) => "callback_dropped",
        }
    }
}

macro_rules! entry_from {
    ($($line:ident => $variant:ident),* $(,)?) => {$(
        impl From<$line> for Entry {
            fn from(line: $line) -> Entry {
                Entry::$variant(line)
            }
        }
    )*};
}

entry_from! {
    SessionLine => Session,
    RequestLine => Request,
    PassthroughLine => Passthrough,
    BlockedLine => Blocked,
    UpstreamErrorLine => UpstreamError,
    TrustFailureLine => TrustFailure,
    ReservedPathLine => ReservedPath,
    CheckLine => Check,
    TlsAbandonedLine => TlsAbandoned,
    ResponseIncompleteLine => ResponseIncomplete,
    TunnelCloseLine => TunnelClose,
    CallbackLine => Callback,
    CallbackDroppedLine => CallbackDropped,
}

// Test builders: a line with plausible values for the fields a test does
// not name (`RequestLine { status: 500, ..RequestLine::test(..) }`). The
// proxy never writes a line built here.

/// The host a test service's calls go to: `api.<service>.com`.
fn test_host(service: &str) -> String {
    format!("api.{service}.com")
}

/// The twin URL a test service's calls are forwarded to.
fn test_upstream(service: &str, path: &str) -> String {
    format!("http://127.0.0.1:41234/s/sbx_a1b2c3/{service}{path}")
}

impl SessionLine {
    /// A passthrough-mode explicit-tier session with no key, uids, twin
    /// heads, moved-aside file or coverage.
    pub fn test() -> SessionLine {
        SessionLine {
            run_id: "a1b2c3d4e5f60718".into(),
            sandbox_id: "sbx_a1b2c3".into(),
            mode: Mode::Passthrough,
            tier: ListenerTier::Explicit,
            twin: "http://127.0.0.1:41234".into(),
            pid: 4242,
            version: "0.1.0".into(),
            listen: "127.0.0.1:43210".into(),
            recovered_torn_tail: None,
            key_id: None,
            public_key: None,
            key_storage: None,
            proxy_uid: None,
            workload_uid: None,
            twin_heads: None,
            moved_aside: None,
            coverage: None,
        }
    }
}

impl RequestLine {
    /// An explicit-tier HTTP/1.1 call to `api.<service>.com` the twin
    /// answered 200, no query, headers or body, 0 ms.
    pub fn test(service: &str, method: &str, path: &str) -> RequestLine {
        RequestLine {
            service: service.into(),
            host: test_host(service),
            method: method.into(),
            path: path.into(),
            query: None,
            status: 200,
            http: "HTTP/1.1".into(),
            tier: ListenerTier::Explicit,
            bytes_in: 0,
            bytes_out: None,
            duration_ms: 0,
            duration_us: None,
            upstream: test_upstream(service, path),
            headers: Vec::new(),
            websocket: false,
            client_gone: false,
        }
    }
}

impl PassthroughLine {
    /// An explicit-tier tunnel to `host:443` let through by the mode, as
    /// written when it opens (bytes 0, no `dst`).
    pub fn test(host: &str) -> PassthroughLine {
        PassthroughLine {
            host: host.into(),
            port: 443,
            tier: ListenerTier::Explicit,
            bytes_in: 0,
            bytes_out: 0,
            duration_ms: 0,
            reason: "mode".into(),
            dst: None,
        }
    }
}

impl BlockedLine {
    /// An explicit-tier connection to `host:443` refused in strict mode,
    /// no request seen, no `dst`.
    pub fn test(host: &str) -> BlockedLine {
        BlockedLine {
            host: host.into(),
            port: 443,
            tier: ListenerTier::Explicit,
            method: None,
            path: None,
            reason: "strict mode: no service claims this host".into(),
            dst: None,
        }
    }
}

impl UpstreamErrorLine {
    /// An explicit-tier call to `api.<service>.com` that did not reach the
    /// twin (`veris_upstream_unreachable`, 502), 0 ms, no body counts.
    pub fn test(service: &str, method: &str, path: &str) -> UpstreamErrorLine {
        UpstreamErrorLine {
            service: service.into(),
            host: test_host(service),
            method: method.into(),
            path: path.into(),
            upstream: test_upstream(service, path),
            status: 502,
            error: "veris_upstream_unreachable".into(),
            tier: ListenerTier::Explicit,
            duration_ms: 0,
            bytes_in: None,
            declared_in: None,
        }
    }
}

impl TrustFailureLine {
    /// An explicit-tier `unknown_ca` refusal on `host:443`, no service.
    pub fn test(host: &str) -> TrustFailureLine {
        TrustFailureLine {
            host: host.into(),
            port: 443,
            tier: ListenerTier::Explicit,
            service: None,
            alert: "unknown_ca".into(),
        }
    }
}

impl ReservedPathLine {
    /// An explicit-tier `GET` of `path` on `api.<service>.com` answered
    /// 404 `veris_reserved_path`.
    pub fn test(service: &str, path: &str) -> ReservedPathLine {
        ReservedPathLine {
            service: service.into(),
            host: test_host(service),
            method: "GET".into(),
            path: path.into(),
            status: 404,
            error: "veris_reserved_path".into(),
            tier: ListenerTier::Explicit,
        }
    }
}

impl CheckLine {
    /// The check `name` with `status`, no detail, over the window `0 < seq <= 0`.
    pub fn test(name: &str, status: &str) -> CheckLine {
        CheckLine {
            name: name.into(),
            status: status.into(),
            detail: String::new(),
            since_seq: 0,
            until_seq: 0,
        }
    }
}

impl TlsAbandonedLine {
    /// An explicit-tier handshake on `host:443` closed without an alert,
    /// no service, no ALPN.
    pub fn test(host: &str) -> TlsAbandonedLine {
        TlsAbandonedLine {
            host: host.into(),
            port: 443,
            tier: ListenerTier::Explicit,
            service: None,
            stage: "handshake".into(),
            alert: None,
            alpn: None,
        }
    }
}

impl ResponseIncompleteLine {
    /// The body of request `of` (of `service`) cut by the twin
    /// (`twin_cut`) before a byte reached the client, no declared length.
    pub fn test(of: u64, service: &str) -> ResponseIncompleteLine {
        ResponseIncompleteLine {
            of,
            service: service.into(),
            bytes: 0,
            declared: None,
            reason: "twin_cut".into(),
        }
    }
}

impl TunnelCloseLine {
    /// The close of tunnel `of` with no bytes moved, 0 ms, no error.
    pub fn test(of: u64) -> TunnelCloseLine {
        TunnelCloseLine {
            of,
            bytes_in: 0,
            bytes_out: 0,
            duration_ms: 0,
            error: None,
        }
    }
}
