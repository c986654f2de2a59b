//! The receipt: a summary of one window of the ledger that says what reached
//! the twin, how traffic was intercepted, how far the record can be trusted
//! (integrity) and where traffic could have escaped it (leaks). It is built
//! from a verified read of the ledger ([`build`]), printed as text
//! ([`render_text`]) or JSON (serde, versioned by [`RECEIPT_VERSION`]), and
//! asserted by requirements ([`evaluate`]) with exit codes.
//!
//! Integrity is `verified` only when every DESIGN §8 check ran and passed
//! against a reference the workload could not touch ([`Anchor`]: the live
//! proxy's own chain head, or a seal key the reader pinned): the chain, the
//! seals up to that head or the session's final seal, the canary and the twin
//! cross-check. The last two need the network: a live reader runs them and
//! hands their results in ([`Options::external_checks`]); offline, the ones
//! the proxy recorded before its final seal count when the key is pinned.
//!
//! Modules: the model and options here, `build` (the window and what
//! reached the twin, trust failures), `leaks`, `integrity`, `text`, `require`,
//! `junit` (the verdict as a JUnit XML report). The window as a HAR
//! document is the crate's `har` module.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::entry::{ListenerTier, Mode};
use crate::ledger::SealInfo;
use crate::seal::PublicKeys;

mod build;
mod callbacks;
mod integrity;
mod junit;
mod leaks;
mod require;
mod text;
mod tls;

pub use build::{build, build_file, build_file_with, Builder};
pub use callbacks::{CallbackEntry, Callbacks};
pub use integrity::{NO_SANDBOX_PROBE, PROXY_NOT_LIVE, SANDBOX_PROBE_HINT};
pub use junit::{render_junit, render_junit_error, CommandRan, JunitContext};
pub use require::{
    evaluate, split_status, Assertion, Outcome, Requirement, RequirementError, RequirementResult,
    StatusFilter, Verdict,
};
pub use text::{integrity_text, render_text};

/// Version of the receipt JSON, written in its `version` field.
///
/// Version 2 added `seal_key`, `window.scope`, `reserved_paths`, the
/// `client_gone` flag of a request, the `timeout` split of upstream errors
/// and the `destinations` of passthrough and blocked hosts; a version-1
/// receipt still deserializes (every addition has a default).
///
/// Version 3 added `tls_abandoned` (connections closed after our leaf
/// with no alert naming it: notes, never failures; `trust_failures` then
/// holds only refusals, an alert that names the certificate), and the
/// `incomplete` of a request and a service (a response body that did not
/// reach the client whole).
///
/// Still version 3, with additions only: `host_statuses` and
/// `call_statuses` of a service (what requirements count), and
/// `requirements` (each requirement's status filter, count and the
/// statuses seen), `dns_refused` (names the DNS stub refused) and
/// `bundles` (the CA bundle files an isolated run covered).
///
/// Version 4 names how the run's traffic was intercepted `interception`
/// (`isolated`, `transparent`, `explicit`, `confined`: the words of the
/// text receipt, the TUI and the docs) where version 3 gave the listener's
/// `tier`, which read `transparent` for an isolated run.
///
/// Still version 4, with additions only: the interception `gateway` (and
/// the listener tier `gateway` of a request entry), for a gateway
/// sandbox's window; `callbacks` (webhook deliveries to the app).
pub const RECEIPT_VERSION: u32 = 4;

/// Requests listed per service in the text receipt.
pub const TEXT_ENTRY_CAP: usize = 20;

/// Requests listed per service in the JSON receipt (`capped` says when more
/// were counted than listed; counts stay exact).
pub const JSON_ENTRY_CAP: usize = 1000;

/// The sentence for a window in which nothing reached the twin.
pub const EMPTY_SENTENCE: &str =
    "0 requests reached the twin: the code never reached its dependency";

/// Exit code for an unmet requirement, an empty receipt or failed integrity.
pub const EXIT_UNMET: i32 = 3;

/// A summary of one ledger window (DESIGN §8 JSON shape).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    pub version: u32,
    /// Twin sandbox id from the session line; absent without one.
    pub twin: Option<String>,
    pub window: Window,
    pub mode: Option<Mode>,
    /// How the window's session intercepted traffic; absent without a
    /// session line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interception: Option<Interception>,
    /// How the run confined its workload (`netns`, `landlock`; `gateway`
    /// for a sandbox the platform sends through a gateway), from the
    /// session's coverage; absent when nothing confined it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<String>,
    /// Isolated runs: the CA bundle files, besides the system trust
    /// stores, that held the veris bundle before the command started (its
    /// runtimes' and SDKs', and `--trust-file`), from the session's
    /// coverage. One installed during the run is not covered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bundles: Vec<String>,
    pub integrity: Integrity,
    /// Evidence-based notes on how traffic could bypass the proxy.
    pub leaks: Vec<String>,
    /// Requests forwarded to the twin, per service.
    pub services: BTreeMap<String, ServiceSummary>,
    pub trust_failures: Vec<TrustFailure>,
    /// Hosts whose clients closed after our leaf without a refusal alert
    /// (during the handshake, or right after it with no request).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tls_abandoned: Vec<AbandonedTls>,
    pub passthrough: HostCounts,
    pub blocked: HostCounts,
    /// Vendor requests whose twin upstream failed (unreachable: it did not
    /// reach the twin; timeout: the twin may have processed it).
    #[serde(default)]
    pub upstream_errors: Vec<UpstreamErrorEntry>,
    /// Fingerprint of the key that sealed the window's session (pin it with
    /// `veris receipt --key` to verify this ledger offline later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seal_key: Option<String>,
    /// Requests on vendor hosts the proxy answered itself (the twin's control
    /// surface, dot-segment paths), per `service METHOD /path`: never vendor calls.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reserved_paths: BTreeMap<String, u64>,
    /// Ledgers a restarting proxy could not verify and moved aside (a crash
    /// leaves one), named by the window's session lines: their requests are
    /// in no window of this file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set_aside: Vec<SetAside>,
    /// Names the isolated run's DNS stub refused because its table of
    /// names was full (ledger `dns` lines with `refused`; at most
    /// [`crate::entry::DNS_REFUSED_LINES`] a session are recorded): those
    /// names did not resolve because of veris, not the code.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns_refused: Vec<String>,
    /// veris's webhook deliveries to the app (`--webhook`), apart from
    /// the requests that reached the twin; absent when there were none.
    #[serde(default, skip_serializing_if = "Callbacks::is_empty")]
    pub callbacks: Callbacks,
    /// Publishing the window's ledger lines to a NATS stream (`--nats`,
    /// G2) was refused (a fork: another writer on the sandbox's subject,
    /// for good; a full stream, until it takes lines again), as the proxy
    /// recorded it (a `publish` check line); absent when nothing was
    /// refused or the refusal passed. It never says the stream is
    /// complete: that is the stream reader's to tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publishing: Option<PublishRefused>,
    /// The requirements it was judged against and how each came out
    /// (`veris receipt --json`, `veris run --receipt`); absent when none
    /// were given. Not part of the summary: [`evaluate`] fills it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<RequirementResult>,
}

/// How a session's traffic reached the proxy: the one vocabulary of every
/// report (text, JSON, JUnit, HAR, TUI, MCP) and the docs. Not the twin's
/// log tiers, nor the listener a line arrived on (a ledger line's `tier`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Interception {
    /// `veris run` in its own namespaces; the kernel sends all its traffic
    /// to the proxy.
    Isolated,
    /// nftables on the host send every other uid's traffic to the proxy.
    Transparent,
    /// Clients use the proxy because their environment says so.
    Explicit,
    /// Explicit, with TCP connects confined to the proxy by Landlock.
    Confined,
    /// A gateway outside the sandbox, to which the sandbox platform sends
    /// the sandbox's TCP (SOCKS5 or HTTP CONNECT): what went around it is
    /// the platform's word.
    Gateway,
}

impl Interception {
    /// From a session line's listener tier and its coverage's isolation.
    pub fn of(tier: ListenerTier, isolation: Option<&str>) -> Interception {
        match (tier, isolation) {
            (ListenerTier::Transparent, Some("netns")) => Interception::Isolated,
            (ListenerTier::Transparent, _) => Interception::Transparent,
            (ListenerTier::Explicit, Some("landlock")) => Interception::Confined,
            (ListenerTier::Explicit, _) => Interception::Explicit,
            (ListenerTier::Gateway, _) => Interception::Gateway,
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            Interception::Isolated => "isolated",
            Interception::Transparent => "transparent",
            Interception::Explicit => "explicit",
            Interception::Confined => "confined",
            Interception::Gateway => "gateway",
        }
    }
}

/// The name of the check line that records a refused publish (status
/// `refused`), and one that passed ([`PUBLISH_RESUMED`]).
pub const PUBLISH_CHECK: &str = "publish";

/// The status of a `publish` check line saying a refusal passed.
pub const PUBLISH_RESUMED: &str = "resumed";

/// A refused publish, from the window's newest `publish` check line when
/// it is not [`PUBLISH_RESUMED`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishRefused {
    /// `refused`.
    pub status: String,
    /// Why, as the proxy recorded it (the stream, the subject, the fork).
    pub reason: String,
    /// Seq of the check line.
    pub seq: u64,
}

/// A ledger moved aside at a restart, as the new session line names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAside {
    /// Where it is now.
    pub file: String,
    /// Its request lines when it was moved (a hint: the file is not sealed
    /// by this chain), absent before ledger v5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<u64>,
    /// Why the proxy could not continue it.
    pub why: String,
    /// Seq of the session line that names it.
    pub before_seq: u64,
}

/// The ledger lines summarized: `since_seq < seq <= until_seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    pub since_seq: u64,
    pub until_seq: u64,
    /// `session` (the latest session, the default), `all` or `baseline`.
    #[serde(default = "default_scope")]
    pub scope: Scope,
}

fn default_scope() -> Scope {
    Scope::All
}

/// Which lines a receipt summarizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// The newest session at or before the window end (DESIGN §7a.5).
    Session,
    /// The whole file.
    All,
    /// After a baseline (`--since`).
    Baseline,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Integrity {
    pub status: IntegrityStatus,
    /// Why it is not `verified`; absent when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub checks: Vec<Check>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IntegrityStatus {
    /// Every check ran and passed.
    Verified,
    /// A check could not run (or does not exist yet).
    Unverified,
    /// A check contradicted the receipt.
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// `chain`, `tail`, `seals`, `canary`, `twin_cross_check`.
    pub name: String,
    pub status: CheckStatus,
    pub detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckStatus {
    Ok,
    Failed,
    Unverified,
    NotImplemented,
}

impl CheckStatus {
    /// The status as the JSON receipt spells it (`ok`, `not_implemented`).
    pub fn word(self) -> &'static str {
        match self {
            CheckStatus::Ok => "ok",
            CheckStatus::Failed => "failed",
            CheckStatus::Unverified => "unverified",
            CheckStatus::NotImplemented => "not_implemented",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceSummary {
    /// Requests forwarded to the twin in the window (exact).
    pub requests: u64,
    /// Request count per host (lower-case, no port), for `--require-host`.
    #[serde(default)]
    pub hosts: BTreeMap<String, u64>,
    /// Request count per `METHOD /path` (no query), any status.
    #[serde(default)]
    pub calls: BTreeMap<String, u64>,
    /// Per host, the count of each status the twin answered: what
    /// `--require-host` counts (2xx unless its status clause says otherwise).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub host_statuses: BTreeMap<String, BTreeMap<u16, u64>>,
    /// Per `METHOD /path`, the count of each status the twin answered:
    /// what `--require` and `--require-request` count.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub call_statuses: BTreeMap<String, BTreeMap<u16, u64>>,
    /// Requests among `requests` whose response body did not reach the
    /// client whole (still counted: the twin got them).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub incomplete: u64,
    /// Oldest first, at most [`JSON_ENTRY_CAP`].
    pub entries: Vec<RequestEntry>,
    /// True when `requests` exceeds the entries listed.
    pub capped: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestEntry {
    pub seq: u64,
    pub method: String,
    pub path: String,
    pub status: u16,
    pub tier: ListenerTier,
    /// The client left before the twin's answer arrived (the twin executed it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub client_gone: bool,
    /// The response body did not reach the client whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<Incomplete>,
}

/// How much of a response body reached the client, when not all of it did
/// (ledger `response_incomplete`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Incomplete {
    /// Body bytes handed to the client's connection.
    pub bytes: u64,
    /// The length the twin declared, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared: Option<u64>,
    /// `twin_cut` or `client_gone`.
    pub reason: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Hosts seen, with a count each (connections for passthrough, requests for
/// blocked).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostCounts {
    /// Count per name the client gave (lower-case, no port).
    pub hosts: BTreeMap<String, u64>,
    /// Count per name and destination: the address the bytes went to
    /// (passthrough) or were headed for (blocked), so one name sent to
    /// several addresses stays distinguishable (DESIGN §7a.11). Sorted by
    /// host, then destination; lines without a destination have none.
    /// Absent from receipts written before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub destinations: Vec<Destination>,
    /// Passthroughs whose dial never connected (nothing passed), per name:
    /// how many and why the last one failed, with the addresses dialed.
    /// Not in `destinations`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreached: Vec<Unreached>,
}

/// A name whose passthrough dials all failed, with the last reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unreached {
    pub host: String,
    pub count: u64,
    pub error: String,
}

/// One name and the destination it went to, with a count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Destination {
    pub host: String,
    /// `ip:port`; absent when the ledger line named none (an older proxy,
    /// or a dial that never connected).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<String>,
    pub count: u64,
}

/// A host whose clients refused our certificate in the window (ledger
/// `trust_failure` lines), with the requests that did complete to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrustFailure {
    pub host: String,
    pub refusals: u64,
    /// Requests to this host that reached the twin in the window.
    pub completed: u64,
    /// The alerts seen and the next step, in words.
    pub detail: String,
    /// The vendor service the host is routed to; absent for unmapped hosts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// Refusals per alert (`unknown_ca`, `no_alert`, ...).
    #[serde(default)]
    pub alerts: BTreeMap<String, u64>,
}

impl TrustFailure {
    /// A vendor host whose every client refused us: the code under test
    /// never reached its dependency, and the receipt fails.
    pub fn is_fatal(&self) -> bool {
        self.service.is_some() && self.refusals > 0 && self.completed == 0
    }
}

/// A host whose clients closed TLS connections after our leaf without an
/// alert that names the certificate: not evidence of a refusal, never a
/// failure by itself (ledger `tls_abandoned` lines, and `trust_failure`
/// lines of older proxies without such an alert).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbandonedTls {
    pub host: String,
    /// The vendor service the host is routed to; absent for unmapped hosts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// Handshakes the client left before finishing.
    pub handshakes: u64,
    /// Connections closed right after the handshake without one request byte.
    pub no_request: u64,
    /// Requests to this host that reached the twin in the window.
    pub completed: u64,
    /// HTTP/2 connections closed right after the handshake, unused, while
    /// requests to the host completed: an HTTP/2 client dropping the extra
    /// connections it dialed at once, not trust evidence (with none
    /// completed they count in `no_request`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unused_h2: u64,
    /// Handshakes left per alert the client sent (`none` for a bare close
    /// or reset).
    #[serde(default)]
    pub alerts: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpstreamErrorEntry {
    pub seq: u64,
    pub service: String,
    pub host: String,
    pub method: String,
    pub path: String,
    pub status: u16,
    pub error: String,
    pub tier: ListenerTier,
    /// Request body bytes forwarded, when the line says (a body the
    /// client never finished).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_in: Option<u64>,
    /// The body length the client declared, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared_in: Option<u64>,
}

/// What to summarize, and what the verdict may rely on.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Which lines: by default the latest session (DESIGN §7a.5).
    pub scope: WindowSpec,
    /// Only this service's requests and upstream errors.
    pub service: Option<String>,
    /// Window end (inclusive); default: the last line read. A live read ends
    /// the window at its fresh seal, so every line reported is sealed.
    pub until: Option<u64>,
    /// The reference the workload could not touch (DESIGN §7a.1).
    pub anchor: Anchor,
    /// Keys from `ledger.pub` beside the file: a hint that can show a seal is
    /// broken, never the anchor of a `verified`.
    pub hint_keys: Option<PublicKeys>,
    /// The receipt is read while the proxy is live: the canary and twin
    /// checks are expected in `external_checks`.
    pub proxy_live: bool,
    /// Results of checks run outside this crate (`canary`,
    /// `twin_cross_check`); a check named here replaces the recorded one.
    pub external_checks: Vec<Check>,
    /// A private key file that holds a pinned key (the pin was read from
    /// it, or it lies beside the ledger): that key was where the workload
    /// could read it, so the pin vouches for nothing (DESIGN §7a.13).
    pub pinned_key_file: Option<String>,
    /// Why the session's final seal could not be written (the writer's own
    /// error: a full disk, say), when the reader is the process that tried.
    /// The seals check then names it, not a missing key.
    pub seal_failure: Option<String>,
}

/// Which lines a receipt covers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WindowSpec {
    /// The newest session at or before the window end.
    #[default]
    LatestSession,
    /// Every line.
    All,
    /// `seq > since` (a baseline).
    Since(u64),
}

/// What a `verified` verdict is anchored on.
#[derive(Debug, Clone, Default)]
pub enum Anchor {
    /// Nothing the workload could not have written: at best `unverified`.
    #[default]
    None,
    /// The live proxy's own chain head: the seal it appended for this read
    /// (with the hash of that seal line) and the raw public key (hex) it
    /// reported, and how the reader reached it.
    Live {
        seal: SealInfo,
        public_key: String,
        channel: LiveChannel,
    },
    /// Keys the reader pinned (`--key`), already selected by fingerprint.
    Pinned(PublicKeys),
}

/// How a live reader reached the proxy whose chain head anchors its read:
/// what decides whether the workload could have answered in its place.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LiveChannel {
    /// The proxy judges its own session in its own process (`veris run`).
    InProcess,
    /// Through `admin.addr` and `admin.token` in the state dir: a workload
    /// that can write them could answer as the proxy. A pin does not lift
    /// this: the seal would be genuine, but the live checks (canary, twin
    /// cross-check) go to the endpoints the answer names. Offline, the
    /// checks the proxy recorded before its final seal count instead.
    #[default]
    StateDir,
    /// Through a gateway's state dir, named as such by the reader
    /// (`veris receipt --sandbox`): the workload runs in a sandbox on
    /// other infrastructure, out of reach of the gateway's files. Counts
    /// only for a gateway session; any other reads as [`LiveChannel::StateDir`].
    Gateway,
}

impl Receipt {
    /// Requests that reached the twin in the window, over all services.
    pub fn total_requests(&self) -> u64 {
        self.services.values().map(|s| s.requests).sum()
    }
}

/// A host as receipts compare it: the one rule ([`veris_host::Host`]), so a
/// `--require-host` and a ledger line's host match when they name the same
/// host.
fn normalize_host(host: &str) -> String {
    veris_host::Host::new(host).into_string()
}

fn strip_query(path: &str) -> &str {
    path.split_once('?').map_or(path, |(p, _)| p)
}
