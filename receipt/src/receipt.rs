//! The receipt: a summary of one window of the ledger that says what reached
//! the twin, how traffic was intercepted, how far the record can be trusted
//! (integrity) and where traffic could have escaped it (leaks). It is built
//! from a verified read of the ledger ([`build`]), printed as text
//! ([`render_text`]) or JSON (serde, versioned by [`RECEIPT_VERSION`]), and
//! asserted by requirements ([`evaluate`]) with exit codes.
//!
//! Integrity is never reported `verified` here until every DESIGN §8 check
//! exists: today only the chain is checked, so a clean ledger is
//! `unverified (chain ok …; seals, canary and twin cross-check not implemented)`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::entry::{Entry, ListenerTier, Mode, TornTail};
use crate::ledger::LedgerRead;

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

/// A mapped host whose clients refused our certificate (M3 fills these in).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrustFailure {
    pub host: String,
    pub refusals: u64,
    pub completed: u64,
    pub detail: String,
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
    /// The receipt is read while the proxy is live (for the seal and canary
    /// checks of M3; informational today).
    pub proxy_live: bool,
}

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
    let until = read.lines.iter().map(|l| l.seq).max().unwrap_or(0);
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
        integrity: integrity(read),
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

    if receipt.tier == Some(ListenerTier::Explicit) {
        receipt.leaks.push("direct-egress-possible".to_string());
    }
    receipt
}

/// The checks that exist today: the chain (and a torn tail) from the read;
/// seals, canary and the twin cross-check are named as not implemented so
/// the receipt never claims more than was checked.
fn integrity(read: &LedgerRead) -> Integrity {
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
    for name in ["seals", "canary", "twin_cross_check"] {
        checks.push(Check {
            name: name.into(),
            status: CheckStatus::NotImplemented,
            detail: "not implemented".into(),
        });
    }

    if let Some(failed) = checks.iter().find(|c| c.status == CheckStatus::Failed) {
        return Integrity {
            status: IntegrityStatus::Failed,
            reason: Some(failed.detail.clone()),
            checks,
        };
    }
    let mut reason: Vec<String> = checks
        .iter()
        .filter(|c| matches!(c.status, CheckStatus::Ok | CheckStatus::Unverified))
        .filter(|c| c.name != "recovered_tail")
        .map(|c| c.detail.clone())
        .collect();
    reason.push("seals, canary and twin cross-check not implemented".into());
    Integrity {
        status: IntegrityStatus::Unverified,
        reason: Some(reason.join("; ")),
        checks,
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
    fn integrity_is_never_verified_by_build() {
        let r = build(&LedgerRead::default(), &Options::default());
        assert_eq!(r.integrity.status, IntegrityStatus::Unverified);
        assert_eq!(
            r.integrity.reason.as_deref(),
            Some("chain empty; seals, canary and twin cross-check not implemented")
        );
    }
}
