//! The receipt: a summary of one window of the ledger that says what reached
//! the twin, how traffic was intercepted, how far the record can be trusted
//! (integrity) and where traffic could have escaped it (leaks). It is built
//! from a verified read of the ledger ([`build`]), printed as text
//! ([`render_text`]) or JSON (serde, versioned by [`RECEIPT_VERSION`]), and
//! asserted by requirements ([`evaluate`]) with exit codes.
//!
//! Integrity is `verified` only when every DESIGN §8 check ran and passed:
//! the chain, every seal (and a fresh seal the live proxy appended for this
//! read), the canary and the twin cross-check. The last two need the network,
//! so the binary runs them and hands their results in ([`Options::external_checks`]);
//! without a live proxy they cannot run and the receipt says
//! `unverified (proxy not live)`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::entry::{Entry, ListenerTier, Mode, TornTail};
use crate::ledger::LedgerRead;
use crate::seal::{self, PublicKeys};

/// Version of the receipt JSON, written in its `version` field.
pub const RECEIPT_VERSION: u32 = 1;

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
    pub tier: Option<ListenerTier>,
    pub integrity: Integrity,
    /// Evidence-based notes on how traffic could bypass the proxy.
    pub leaks: Vec<String>,
    /// Requests forwarded to the twin, per service.
    pub services: BTreeMap<String, ServiceSummary>,
    pub trust_failures: Vec<TrustFailure>,
    pub passthrough: HostCounts,
    pub blocked: HostCounts,
    /// Vendor requests whose twin upstream failed: they did not reach it.
    #[serde(default)]
    pub upstream_errors: Vec<UpstreamErrorEntry>,
}

/// The ledger lines summarized: `since_seq < seq <= until_seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    pub since_seq: u64,
    pub until_seq: u64,
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

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceSummary {
    /// Requests forwarded to the twin in the window (exact).
    pub requests: u64,
    /// Request count per host (lower-case, no port), for `--require-host`.
    #[serde(default)]
    pub hosts: BTreeMap<String, u64>,
    /// Request count per `METHOD /path` (no query), for `--require-request`.
    #[serde(default)]
    pub calls: BTreeMap<String, u64>,
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
}

/// Hosts seen, with a count each (connections for passthrough, requests for
/// blocked).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostCounts {
    pub hosts: BTreeMap<String, u64>,
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
}

/// What to summarize.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Baseline: the window is `seq > since`.
    pub since: Option<u64>,
    /// Only this service's requests and upstream errors.
    pub service: Option<String>,
    /// The receipt is read while the proxy is live: the canary and twin
    /// checks are expected in `external_checks` and a fresh seal in `fresh_seal`.
    pub proxy_live: bool,
    /// Window end (inclusive); default: the last line read. A live read ends
    /// the window at its fresh seal, so every line reported is sealed.
    pub until: Option<u64>,
    /// Keys from `ledger.pub`; `None` when there is no such file to read.
    pub seal_keys: Option<PublicKeys>,
    /// Seq of the seal the live proxy appended for this read.
    pub fresh_seal: Option<u64>,
    /// Results of checks run outside this crate (`canary`,
    /// `twin_cross_check`); a check named here replaces the default one.
    pub external_checks: Vec<Check>,
}

/// The detail of a check that needs the live proxy when there is none.
pub const PROXY_NOT_LIVE: &str = "proxy not live";

impl Receipt {
    /// Requests that reached the twin in the window, over all services.
    pub fn total_requests(&self) -> u64 {
        self.services.values().map(|s| s.requests).sum()
    }
}

/// `host` lower-cased, without a `:port` suffix.
fn normalize_host(host: &str) -> String {
    let host = host.trim().to_ascii_lowercase();
    match host.rsplit_once(':') {
        Some((name, port))
            if !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && (name.ends_with(']') || !name.contains(':')) =>
        {
            name.to_string()
        }
        _ => host,
    }
}

fn strip_query(path: &str) -> &str {
    path.split_once('?').map_or(path, |(p, _)| p)
}

/// Builds the receipt for a window of a verified read. Mode, tier and twin
/// come from the newest session line at or before the window end.
pub fn build(read: &LedgerRead, options: &Options) -> Receipt {
    let since = options.since.unwrap_or(0);
    let last = read.lines.iter().map(|l| l.seq).max().unwrap_or(0);
    let until = options.until.map_or(last, |u| u.min(last));
    let wanted = |service: &str| options.service.as_deref().is_none_or(|s| s == service);

    let mut receipt = Receipt {
        version: RECEIPT_VERSION,
        twin: None,
        window: Window {
            since_seq: since,
            until_seq: until,
        },
        mode: None,
        tier: None,
        integrity: integrity(read, options, until),
        leaks: Vec::new(),
        services: BTreeMap::new(),
        trust_failures: Vec::new(),
        passthrough: HostCounts::default(),
        blocked: HostCounts::default(),
        upstream_errors: Vec::new(),
    };

    for line in &read.lines {
        if let Entry::Session {
            sandbox_id,
            mode,
            tier,
            ..
        } = &line.entry
        {
            if line.seq <= until {
                receipt.twin = Some(sandbox_id.clone());
                receipt.mode = Some(*mode);
                receipt.tier = Some(*tier);
            }
        }
        if line.seq <= since || line.seq > until {
            continue;
        }
        match &line.entry {
            Entry::Request {
                service,
                host,
                method,
                path,
                status,
                tier,
                ..
            } if wanted(service) => {
                let summary = receipt.services.entry(service.clone()).or_default();
                summary.requests += 1;
                *summary.hosts.entry(normalize_host(host)).or_default() += 1;
                let path = strip_query(path);
                *summary.calls.entry(format!("{method} {path}")).or_default() += 1;
                if summary.entries.len() < JSON_ENTRY_CAP {
                    summary.entries.push(RequestEntry {
                        seq: line.seq,
                        method: method.clone(),
                        path: path.to_string(),
                        status: *status,
                        tier: *tier,
                    });
                } else {
                    summary.capped = true;
                }
            }
            Entry::UpstreamError {
                service,
                host,
                method,
                path,
                status,
                error,
                tier,
                ..
            } if wanted(service) => receipt.upstream_errors.push(UpstreamErrorEntry {
                seq: line.seq,
                service: service.clone(),
                host: normalize_host(host),
                method: method.clone(),
                path: strip_query(path).to_string(),
                status: *status,
                error: error.clone(),
                tier: *tier,
            }),
            Entry::Passthrough { host, .. } => {
                *receipt
                    .passthrough
                    .hosts
                    .entry(normalize_host(host))
                    .or_default() += 1;
            }
            Entry::Blocked { host, .. } => {
                *receipt
                    .blocked
                    .hosts
                    .entry(normalize_host(host))
                    .or_default() += 1;
            }
            _ => {}
        }
    }

    receipt.leaks = leaks(read, since, until, receipt.tier);
    receipt.trust_failures = trust_failures(read, since, until, &receipt.services);
    receipt
}

/// Evidence-based leak notes (DESIGN §8), in a fixed order. Nothing is
/// claimed without a session line: the tier is unknown then.
fn leaks(read: &LedgerRead, since: u64, until: u64, tier: Option<ListenerTier>) -> Vec<String> {
    let mut out = Vec::new();
    if tier == Some(ListenerTier::Explicit) {
        // Clients that ignore the proxy variables go straight out, and
        // nothing redirects UDP in this tier.
        out.push("direct-egress-possible".to_string());
        out.push("udp-quic-possible".to_string());
    }
    // Open egress, evidenced by tunnels in the window: an ECH client shows
    // only its public front name, so a tunnel may hide its real destination.
    // (The transparent tier's kernel rules send UDP 443 to the proxy's silent
    // QUIC sink, which records each attempt as a `quic` line: see below.)
    let tunnels = read
        .lines
        .iter()
        .any(|l| l.seq > since && l.seq <= until && matches!(l.entry, Entry::Passthrough { .. }));
    if tunnels {
        out.push("ech-possible".to_string());
    }
    let mut ech_hosts: Vec<String> = Vec::new();
    let mut quic_attempts: u64 = 0;
    let mut quic_hosts: Vec<String> = Vec::new();
    for line in read
        .lines
        .iter()
        .filter(|l| l.seq > since && l.seq <= until)
    {
        match &line.entry {
            Entry::Ech { host, .. } => {
                let host = normalize_host(host);
                if !ech_hosts.contains(&host) {
                    ech_hosts.push(host);
                }
            }
            Entry::Quic { attempts, host, .. } => {
                quic_attempts = quic_attempts.saturating_add(*attempts);
                if let Some(host) = host.as_deref().map(normalize_host) {
                    if !quic_hosts.contains(&host) {
                        quic_hosts.push(host);
                    }
                }
            }
            _ => {}
        }
    }
    if !ech_hosts.is_empty() {
        ech_hosts.sort();
        out.push(format!("ech-observed {}", ech_hosts.join(",")));
    }
    if quic_attempts > 0 {
        // The SNI read from the decrypted Initial, when the sink could read it.
        quic_hosts.sort();
        out.push(if quic_hosts.is_empty() {
            format!("quic-attempts {quic_attempts}")
        } else {
            format!("quic-attempts {quic_attempts} ({})", quic_hosts.join(","))
        });
    }
    out
}

/// Every integrity check: the chain and a torn tail from the read, the seals
/// against `ledger.pub` (and the fresh seal of a live read), and the canary
/// and twin cross-check handed in by the caller.
fn integrity(read: &LedgerRead, options: &Options, until: u64) -> Integrity {
    let mut checks = Vec::new();
    let head_seq = read.head.0;
    let chain = match read.first_problem() {
        Some(p) => Check {
            name: "chain".into(),
            status: CheckStatus::Failed,
            detail: format!("chain broken at line {}: {}", p.line, p.what),
        },
        None if head_seq == 0 => Check {
            name: "chain".into(),
            status: CheckStatus::Ok,
            detail: "chain empty".into(),
        },
        None => Check {
            name: "chain".into(),
            status: CheckStatus::Ok,
            detail: format!("chain ok through seq {head_seq}"),
        },
    };
    checks.push(chain);
    if let Some(TornTail { line, bytes }) = read.torn_tail {
        checks.push(Check {
            name: "tail".into(),
            status: CheckStatus::Unverified,
            detail: format!("torn last line {line} ({bytes} bytes) not counted"),
        });
    }
    let recovered: Vec<String> = read
        .lines
        .iter()
        .filter_map(|l| match &l.entry {
            Entry::Session {
                recovered_torn_tail: Some(t),
                ..
            } => Some(format!(
                "torn line {} ({} bytes) set aside at restart (seq {})",
                t.line, t.bytes, l.seq
            )),
            _ => None,
        })
        .collect();
    if !recovered.is_empty() {
        checks.push(Check {
            name: "recovered_tail".into(),
            status: CheckStatus::Ok,
            detail: recovered.join("; "),
        });
    }
    checks.push(seals_check(read, options, until));
    for name in ["canary", "twin_cross_check"] {
        let check = match options.external_checks.iter().find(|c| c.name == name) {
            Some(c) => c.clone(),
            None => Check {
                name: name.into(),
                status: CheckStatus::Unverified,
                detail: if options.proxy_live {
                    format!("{} not run", name.replace('_', " "))
                } else {
                    PROXY_NOT_LIVE.into()
                },
            },
        };
        checks.push(check);
    }

    if let Some(failed) = checks.iter().find(|c| c.status == CheckStatus::Failed) {
        return Integrity {
            status: IntegrityStatus::Failed,
            reason: Some(failed.detail.clone()),
            checks,
        };
    }
    let mut reason: Vec<&str> = Vec::new();
    for c in &checks {
        if matches!(
            c.status,
            CheckStatus::Unverified | CheckStatus::NotImplemented
        ) && !reason.contains(&c.detail.as_str())
        {
            reason.push(&c.detail);
        }
    }
    if reason.is_empty() {
        return Integrity {
            status: IntegrityStatus::Verified,
            reason: None,
            checks,
        };
    }
    let reason = reason.join("; ");
    Integrity {
        status: IntegrityStatus::Unverified,
        reason: Some(reason),
        checks,
    }
}

/// Every seal line must verify; the lines up to the window end must be
/// covered by a seal. A live read demands a fresh seal: if the file was cut
/// after an older seal, the fresh one is missing or follows a seq gap.
fn seals_check(read: &LedgerRead, options: &Options, until: u64) -> Check {
    let check = |status, detail: String| Check {
        name: "seals".into(),
        status,
        detail,
    };
    let has_seals = read
        .lines
        .iter()
        .any(|l| matches!(l.entry, Entry::Seal { .. }));
    let keys = match &options.seal_keys {
        Some(keys) if !keys.is_empty() => keys,
        _ if !has_seals && options.fresh_seal.is_none() => {
            return check(CheckStatus::Unverified, "ledger has no seals".into())
        }
        _ => {
            return check(
                CheckStatus::Unverified,
                "no public key (ledger.pub) to check the seals with".into(),
            )
        }
    };
    let report = seal::verify_lines(&read.lines, keys);
    if let Some((seq, fault)) = report.faults.first() {
        return check(
            CheckStatus::Failed,
            format!(
                "seal at seq {seq} {fault}: the ledger was altered at or before seq {}",
                seq.saturating_sub(1)
            ),
        );
    }
    if let Some(fresh) = options.fresh_seal {
        let found = read.lines.iter().any(|l| {
            l.seq == fresh
                && matches!(l.entry, Entry::Seal { .. })
                && report.last_valid.is_some_and(|v| v >= fresh)
        });
        if !found {
            return check(
                CheckStatus::Failed,
                format!("the fresh seal (seq {fresh}) from the live proxy is not in the ledger file: the file was cut or replaced"),
            );
        }
        return check(
            CheckStatus::Ok,
            format!("{} seal(s) valid; fresh seal at seq {fresh}", report.valid),
        );
    }
    match report.last_valid {
        None => check(CheckStatus::Unverified, "ledger has no seals".into()),
        Some(last) if last < until => check(
            CheckStatus::Unverified,
            format!("{} line(s) after the last seal (seq {last})", until - last),
        ),
        Some(last) => check(
            CheckStatus::Ok,
            format!("{} seal(s) valid through seq {last}", report.valid),
        ),
    }
}

fn integrity_text(i: &Integrity) -> String {
    let word = match i.status {
        IntegrityStatus::Verified => "verified",
        IntegrityStatus::Unverified => "unverified",
        IntegrityStatus::Failed => "failed",
    };
    match &i.reason {
        Some(reason) if i.status != IntegrityStatus::Verified => format!("{word} ({reason})"),
        _ => word.to_string(),
    }
}

fn tier_word(t: ListenerTier) -> &'static str {
    match t {
        ListenerTier::Explicit => "explicit",
        ListenerTier::Transparent => "transparent",
    }
}

fn host_list(hosts: &BTreeMap<String, u64>) -> String {
    hosts
        .iter()
        .map(|(h, n)| format!("{h} ({n})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The text receipt (DESIGN §8): title with the twin id, interception and
/// integrity, leaks, the count line, then per service its count and its
/// requests `METHOD /path -> status` oldest first (newest last), at most
/// [`TEXT_ENTRY_CAP`] then `… and N more`. Upstream errors, passthrough and
/// blocked hosts follow when there are any.
pub fn render_text(r: &Receipt) -> String {
    let mut out = String::new();
    let twin = r.twin.as_deref().unwrap_or("unknown (no session line)");
    let _ = write!(out, "Veris receipt — twin {twin}");
    if r.window.since_seq > 0 {
        let _ = write!(out, " (since seq {})", r.window.since_seq);
    }
    out.push('\n');
    let interception = match (r.tier, r.mode) {
        (Some(t), Some(Mode::Strict)) => format!("proxy ({}, strict)", tier_word(t)),
        (Some(t), _) => format!("proxy ({})", tier_word(t)),
        (None, _) => "unknown (no session line)".to_string(),
    };
    let _ = writeln!(
        out,
        "  interception: {interception}   integrity: {}",
        integrity_text(&r.integrity)
    );
    let leaks = if r.leaks.is_empty() {
        "none".to_string()
    } else {
        r.leaks.join(", ")
    };
    let _ = writeln!(out, "  leaks: {leaks}");
    out.push('\n');

    let total = r.total_requests();
    if total == 0 {
        let _ = writeln!(out, "{EMPTY_SENTENCE}");
    } else {
        let _ = writeln!(out, "{total} request(s) reached the twin:");
    }
    for (name, s) in &r.services {
        let _ = writeln!(out, "  {name}: {} request(s)", s.requests);
        for e in s.entries.iter().take(TEXT_ENTRY_CAP) {
            let _ = writeln!(out, "    {} {} -> {}", e.method, e.path, e.status);
        }
        let shown = s.entries.len().min(TEXT_ENTRY_CAP) as u64;
        if s.requests > shown {
            let _ = writeln!(out, "    … and {} more", s.requests - shown);
        }
    }

    let mut extra = Vec::new();
    if !r.upstream_errors.is_empty() {
        const SHOWN: usize = 5;
        let mut list: Vec<String> = r
            .upstream_errors
            .iter()
            .take(SHOWN)
            .map(|e| {
                format!(
                    "{} {} {} -> {} {}",
                    e.service, e.method, e.path, e.status, e.error
                )
            })
            .collect();
        if r.upstream_errors.len() > SHOWN {
            list.push(format!("… and {} more", r.upstream_errors.len() - SHOWN));
        }
        extra.push(format!(
            "upstream errors (did not reach the twin): {} ({})",
            r.upstream_errors.len(),
            list.join("; ")
        ));
    }
    for f in &r.trust_failures {
        extra.push(format!(
            "trust failure: {}: {} refusal(s), {} completed: {}",
            f.host, f.refusals, f.completed, f.detail
        ));
    }
    if !r.passthrough.hosts.is_empty() {
        extra.push(format!("passthrough: {}", host_list(&r.passthrough.hosts)));
    }
    if !r.blocked.hosts.is_empty() {
        extra.push(format!("blocked: {}", host_list(&r.blocked.hosts)));
    }
    if !extra.is_empty() {
        out.push('\n');
        for l in extra {
            out.push_str(&l);
            out.push('\n');
        }
    }
    out
}

/// A requirement asserted against a receipt (`--require`, `--require-host`,
/// `--require-request`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// At least `min` requests of a service.
    Service { name: String, min: u64 },
    /// At least `min` requests to a host.
    Host { host: String, min: u64 },
    /// At least one `METHOD /path` request of a service (path exact, no query).
    Request {
        service: String,
        method: String,
        path: String,
    },
}

/// Why a requirement did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequirementError {
    #[error("empty {0} in requirement `{1}`; expected NAME or NAME:N")]
    Empty(&'static str, String),
    #[error("bad count in requirement `{0}`; expected NAME:N with N a whole number of at least 1")]
    Count(String),
    #[error("bad request requirement `{0}`; expected 'SERVICE METHOD /path', e.g. 'stripe POST /v1/charges'")]
    Request(String),
}

fn parse_counted(s: &str, what: &'static str) -> Result<(String, u64), RequirementError> {
    let s = s.trim();
    let (name, min) = match s.rsplit_once(':') {
        Some((name, n)) => {
            let min: u64 = n.parse().map_err(|_| RequirementError::Count(s.into()))?;
            if min == 0 {
                return Err(RequirementError::Count(s.into()));
            }
            (name, min)
        }
        None => (s, 1),
    };
    if name.is_empty() {
        return Err(RequirementError::Empty(what, s.into()));
    }
    Ok((name.to_string(), min))
}

impl Requirement {
    /// `stripe` (at least 1) or `stripe:2`.
    pub fn parse_service(s: &str) -> Result<Requirement, RequirementError> {
        let (name, min) = parse_counted(s, "service")?;
        Ok(Requirement::Service { name, min })
    }

    /// `api.stripe.com` (at least 1) or `api.stripe.com:2`.
    pub fn parse_host(s: &str) -> Result<Requirement, RequirementError> {
        let (host, min) = parse_counted(s, "host")?;
        Ok(Requirement::Host {
            host: host.to_ascii_lowercase(),
            min,
        })
    }

    /// `stripe POST /v1/charges` (a query on the path is ignored).
    pub fn parse_request(s: &str) -> Result<Requirement, RequirementError> {
        let parts: Vec<&str> = s.split_whitespace().collect();
        let [service, method, path] = parts[..] else {
            return Err(RequirementError::Request(s.into()));
        };
        if !path.starts_with('/') || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(RequirementError::Request(s.into()));
        }
        Ok(Requirement::Request {
            service: service.to_string(),
            method: method.to_ascii_uppercase(),
            path: strip_query(path).to_string(),
        })
    }
}

impl std::fmt::Display for Requirement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Requirement::Service { name, min } => write!(f, "{name}:{min}"),
            Requirement::Host { host, min } => write!(f, "host {host}:{min}"),
            Requirement::Request {
                service,
                method,
                path,
            } => write!(f, "{service} {method} {path}"),
        }
    }
}

/// The outcome of [`evaluate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// 0 when everything holds, [`EXIT_UNMET`] (3) otherwise.
    pub exit_code: i32,
    /// One line per failure: what was wanted and what was seen.
    pub lines: Vec<String>,
}

/// Checks a receipt: failed integrity, an empty window (unless
/// `allow_empty`) and each requirement. `unverified` integrity does not fail.
pub fn evaluate(r: &Receipt, reqs: &[Requirement], allow_empty: bool) -> Verdict {
    let mut lines = Vec::new();
    if r.integrity.status == IntegrityStatus::Failed {
        lines.push(format!(
            "integrity failed: {}",
            r.integrity.reason.as_deref().unwrap_or("no reason given")
        ));
    }
    if r.total_requests() == 0 && !allow_empty {
        lines.push(EMPTY_SENTENCE.to_string());
    }
    for f in r.trust_failures.iter().filter(|f| f.is_fatal()) {
        lines.push(format!(
            "vendor host {} refused the veris certificate {} time(s) and completed no request. Next: fix the client's trust as the trust failure line says",
            f.host, f.refusals
        ));
    }
    for req in reqs {
        match req {
            Requirement::Service { name, min } => {
                let seen = r.services.get(name).map_or(0, |s| s.requests);
                if seen < *min {
                    lines.push(format!(
                        "required service {name}: at least {min} request(s), saw {seen}"
                    ));
                }
            }
            Requirement::Host { host, min } => {
                let host = normalize_host(host);
                let seen: u64 = r.services.values().filter_map(|s| s.hosts.get(&host)).sum();
                if seen < *min {
                    lines.push(format!(
                        "required host {host}: at least {min} request(s), saw {seen}"
                    ));
                }
            }
            Requirement::Request {
                service,
                method,
                path,
            } => {
                let key = format!("{method} {path}");
                let summary = r.services.get(service);
                if summary
                    .and_then(|s| s.calls.get(&key))
                    .copied()
                    .unwrap_or(0)
                    == 0
                {
                    let seen = match summary {
                        None => format!("{service} saw 0 requests"),
                        Some(s) => {
                            const SHOWN: usize = 5;
                            let mut calls: Vec<String> = s
                                .calls
                                .iter()
                                .take(SHOWN)
                                .map(|(c, n)| format!("{c} ({n})"))
                                .collect();
                            if s.calls.len() > SHOWN {
                                calls.push(format!("… and {} more", s.calls.len() - SHOWN));
                            }
                            format!(
                                "{service} saw {} request(s): {}",
                                s.requests,
                                calls.join(", ")
                            )
                        }
                    };
                    lines.push(format!(
                        "required request {service} {method} {path}: not seen; {seen}"
                    ));
                }
            }
        }
    }
    Verdict {
        exit_code: if lines.is_empty() { 0 } else { EXIT_UNMET },
        lines,
    }
}

/// Trust failures per host in the window, with the requests that completed
/// to the same host, each with its prescription.
fn trust_failures(
    read: &LedgerRead,
    since: u64,
    until: u64,
    services: &BTreeMap<String, ServiceSummary>,
) -> Vec<TrustFailure> {
    let mut by_host: BTreeMap<String, TrustFailure> = BTreeMap::new();
    for line in read
        .lines
        .iter()
        .filter(|l| l.seq > since && l.seq <= until)
    {
        if let Entry::TrustFailure {
            host,
            service,
            alert,
            ..
        } = &line.entry
        {
            let host = normalize_host(host);
            let f = by_host.entry(host.clone()).or_insert_with(|| TrustFailure {
                host,
                refusals: 0,
                completed: 0,
                detail: String::new(),
                service: None,
                alerts: BTreeMap::new(),
            });
            f.refusals += 1;
            if f.service.is_none() {
                f.service = service.clone();
            }
            *f.alerts.entry(alert.clone()).or_default() += 1;
        }
    }
    for f in by_host.values_mut() {
        f.completed = services.values().filter_map(|s| s.hosts.get(&f.host)).sum();
        let alerts: Vec<String> = f.alerts.iter().map(|(a, n)| format!("{a} ({n})")).collect();
        f.detail = format!(
            "alerts {}. Next: {}",
            alerts.join(", "),
            trust_next_step(&f.alerts)
        );
    }
    by_host.into_values().collect()
}

/// What to do about refusals, judged by the most frequent alert.
fn trust_next_step(alerts: &BTreeMap<String, u64>) -> &'static str {
    let top = alerts
        .iter()
        .max_by_key(|(_, n)| **n)
        .map_or("", |(a, _)| a.as_str());
    match top {
        "certificate_expired" => {
            "the client thinks the veris leaf is expired: check the sandbox clock, or delete the CA dir so a fresh CA is minted"
        }
        "unsupported_certificate" => {
            "the client rejects the veris leaf's key or usage (ECDSA P-256, serverAuth): configure it to accept ECDSA certificates"
        }
        _ => {
            "the client does not trust the veris CA: point its CA setting at the veris bundle \
             (SSL_CERT_FILE, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, NODE_EXTRA_CA_CERTS: see the env file \
             written by --write-env) or install the CA into the system store; SDKs that bundle their \
             own CA (stripe-python, certifi copies) need their own setting; real certificate pinning cannot be fixed"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::Line;

    fn req(seq: u64, path: &str) -> Line {
        Line {
            v: 1,
            seq,
            ts: "2026-11-29T07:28:19.123Z".into(),
            entry: Entry::Request {
                service: "stripe".into(),
                host: "API.Stripe.com:443".into(),
                method: "GET".into(),
                path: path.into(),
                query: None,
                status: 200,
                http: "HTTP/2".into(),
                tier: ListenerTier::Transparent,
                bytes_in: 0,
                bytes_out: None,
                duration_ms: 1,
                upstream: "http://twin/".into(),
                headers: Vec::new(),
                websocket: false,
            },
            prev: String::new(),
        }
    }

    #[test]
    fn json_entries_are_capped_but_counts_stay_exact() {
        let read = LedgerRead {
            lines: (1..=JSON_ENTRY_CAP as u64 + 5)
                .map(|s| req(s, "/v1/x?limit=1"))
                .collect(),
            head: (JSON_ENTRY_CAP as u64 + 5, String::new()),
            ..LedgerRead::default()
        };
        let r = build(&read, &Options::default());
        let s = &r.services["stripe"];
        assert_eq!(s.requests, JSON_ENTRY_CAP as u64 + 5);
        assert_eq!(s.entries.len(), JSON_ENTRY_CAP);
        assert!(s.capped);
        assert_eq!(s.calls["GET /v1/x"], JSON_ENTRY_CAP as u64 + 5);
        assert_eq!(s.hosts["api.stripe.com"], JSON_ENTRY_CAP as u64 + 5);
        assert!(render_text(&r).contains(&format!("    … and {} more\n", JSON_ENTRY_CAP + 5 - 20)));
        // No session line: nothing is claimed about interception or leaks.
        assert_eq!(r.tier, None);
        assert!(r.leaks.is_empty());
    }

    #[test]
    fn hosts_are_normalized() {
        assert_eq!(normalize_host("API.stripe.com:443"), "api.stripe.com");
        assert_eq!(normalize_host("api.stripe.com"), "api.stripe.com");
        assert_eq!(normalize_host("[::1]:8443"), "[::1]");
        assert_eq!(normalize_host("::1"), "::1");
    }

    #[test]
    fn a_file_alone_is_never_verified() {
        let r = build(&LedgerRead::default(), &Options::default());
        assert_eq!(r.integrity.status, IntegrityStatus::Unverified);
        assert_eq!(
            r.integrity.reason.as_deref(),
            Some("ledger has no seals; proxy not live")
        );
    }

    fn trust(seq: u64, host: &str, service: Option<&str>, alert: &str) -> Line {
        Line {
            v: 1,
            seq,
            ts: "2026-11-29T07:28:19.123Z".into(),
            entry: Entry::TrustFailure {
                host: host.into(),
                port: 443,
                tier: ListenerTier::Transparent,
                service: service.map(str::to_string),
                alert: alert.into(),
            },
            prev: String::new(),
        }
    }

    #[test]
    fn a_vendor_host_that_only_refused_fails_the_receipt() {
        let read = LedgerRead {
            lines: vec![
                req(1, "/v1/customers"),
                trust(2, "api.stripe.com", Some("stripe"), "unknown_ca"),
                trust(3, "api.github.com", Some("github"), "unknown_ca"),
                trust(4, "api.github.com", Some("github"), "no_alert"),
                trust(5, "example.org", None, "unknown_ca"),
            ],
            head: (5, String::new()),
            ..LedgerRead::default()
        };
        let r = build(&read, &Options::default());
        let by_host: BTreeMap<&str, &TrustFailure> = r
            .trust_failures
            .iter()
            .map(|f| (f.host.as_str(), f))
            .collect();
        // Stripe also completed a request: listed, not fatal.
        assert_eq!(by_host["api.stripe.com"].completed, 1);
        assert!(!by_host["api.stripe.com"].is_fatal());
        let github = by_host["api.github.com"];
        assert_eq!((github.refusals, github.completed), (2, 0));
        assert_eq!(github.alerts["no_alert"], 1);
        assert!(github.is_fatal());
        assert!(github
            .detail
            .starts_with("alerts no_alert (1), unknown_ca (1). Next: "));
        // An unmapped host is not a vendor: never fatal.
        assert!(!by_host["example.org"].is_fatal());
        let text = render_text(&r);
        assert!(text.contains("trust failure: api.github.com: 2 refusal(s), 0 completed: alerts"));
        let verdict = evaluate(&r, &[], false);
        assert_eq!(verdict.exit_code, EXIT_UNMET);
        let fatal: Vec<&String> = verdict
            .lines
            .iter()
            .filter(|l| l.contains("refused the veris certificate"))
            .collect();
        assert_eq!(fatal.len(), 1, "{:?}", verdict.lines);
        assert!(fatal[0].contains("api.github.com") && fatal[0].contains("Next:"));
    }
}
