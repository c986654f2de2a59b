//! Requirements asserted against a receipt, and the exit code they give.
//!
//! A requirement counts successful answers: the twin's 2xx, unless it ends
//! in a status clause (DESIGN §7a.16). The clause is the last word of the
//! same argument: `status=402` (that code), `status=4xx` (that class) or
//! `status=any`, as in `stripe:1 status=4xx` or
//! `stripe POST /v1/charges status=402`. A request requirement's path
//! matches with or without one trailing slash.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::callbacks::counted as counted_origin;
use super::*;
use crate::quote::{quoted, token};

/// Which answers a requirement counts (` status=…`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusFilter {
    /// One status code (`status=402`).
    Code(u16),
    /// A class by its first digit (`status=4xx`).
    Class(u8),
    /// Any answer the twin gave (`status=any`).
    Any,
}

impl StatusFilter {
    /// What a requirement without a clause counts: success.
    pub const SUCCESS: StatusFilter = StatusFilter::Class(2);

    pub fn matches(self, status: u16) -> bool {
        match self {
            StatusFilter::Code(c) => status == c,
            StatusFilter::Class(d) => status / 100 == u16::from(d),
            StatusFilter::Any => true,
        }
    }

    /// `402`, `4xx` or `any`, as written after `status=`.
    fn parse(v: &str) -> Option<StatusFilter> {
        let b = v.as_bytes();
        match b {
            b"any" => Some(StatusFilter::Any),
            [d @ b'1'..=b'5', b'x', b'x'] => Some(StatusFilter::Class(d - b'0')),
            [b'1'..=b'5', b'0'..=b'9', b'0'..=b'9'] => v.parse().ok().map(StatusFilter::Code),
            _ => None,
        }
    }

    /// `answered 2xx`, `answered 402`, `with any status`.
    fn counted(self) -> String {
        match self {
            StatusFilter::Any => "with any status".into(),
            f => format!("answered {f}"),
        }
    }
}

impl std::fmt::Display for StatusFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StatusFilter::Code(c) => write!(f, "{c}"),
            StatusFilter::Class(d) => write!(f, "{d}xx"),
            StatusFilter::Any => f.write_str("any"),
        }
    }
}

/// A requirement asserted against a receipt (`--require`, `--require-host`,
/// `--require-request`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// At least `min` requests of a service answered as `status` says.
    Service {
        name: String,
        min: u64,
        status: StatusFilter,
    },
    /// At least `min` requests to a host answered as `status` says. Only
    /// requests that reached the twin count: a passthrough connection
    /// carries no answer veris saw.
    Host {
        host: String,
        min: u64,
        status: StatusFilter,
    },
    /// At least one `METHOD /path` request of a service answered as
    /// `status` says (path exact but for one trailing slash, no query).
    Request {
        service: String,
        method: String,
        path: String,
        status: StatusFilter,
    },
    /// At least `min` of veris's deliveries of the twin's own events to
    /// `path` (one trailing slash aside, no query) answered as `status`
    /// says (`--require-callback`). Deliveries another origin made
    /// (`trigger`, `replay`) never count: a callback for an object the
    /// twin never made proves nothing.
    Callback {
        path: String,
        min: u64,
        status: StatusFilter,
    },
    /// Integrity must be `verified` (`--require-verified`).
    Verified,
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
    #[error("request requirement `{0}` has a query; requirements match the method and path only. Next: drop the `?…`")]
    Query(String),
    #[error("bad status clause `{1}` in requirement `{0}`; expected status=CODE (e.g. status=402), status=Nxx (e.g. status=4xx) or status=any, as the last word")]
    Status(String, String),
    #[error("unexpected `{1}` in requirement `{0}`; after the name only a status clause may follow: status=CODE, status=Nxx or status=any")]
    Clause(String, String),
    #[error("requirement {0} has a control or invisible character. Next: write it in plain text")]
    Hidden(String),
    #[error("bad callback requirement `{0}`; expected PATH[:N], e.g. /webhook or /webhook:2, the path the app was delivered to, without a query")]
    Callback(String),
}

/// Splits a trailing ` status=…` clause off `s` (2xx when there is none),
/// refusing control and invisible characters: the grammar every
/// requirement flag shares (a callback requirement's too).
pub fn split_status(s: &str) -> Result<(&str, StatusFilter), RequirementError> {
    if s.chars()
        .any(|c| crate::quote::hidden(c) && !c.is_ascii_whitespace())
    {
        return Err(RequirementError::Hidden(quoted(s)));
    }
    let s = s.trim();
    let Some((head, last)) = s.rsplit_once(|c: char| c.is_ascii_whitespace()) else {
        return Ok((s, StatusFilter::SUCCESS));
    };
    match last.strip_prefix("status=") {
        Some(v) => match StatusFilter::parse(v) {
            Some(f) => Ok((head.trim_end(), f)),
            None => Err(RequirementError::Status(s.into(), last.into())),
        },
        None if last.starts_with("status") => Err(RequirementError::Status(s.into(), last.into())),
        None => Ok((s, StatusFilter::SUCCESS)),
    }
}

/// `NAME` or `NAME:N`, then an optional status clause.
fn parse_counted(
    s: &str,
    what: &'static str,
) -> Result<(String, u64, StatusFilter), RequirementError> {
    let (head, status) = split_status(s)?;
    if let Some((_, extra)) = head.split_once(|c: char| c.is_ascii_whitespace()) {
        return Err(RequirementError::Clause(
            s.trim().into(),
            extra.trim().into(),
        ));
    }
    let (name, min) = match head.rsplit_once(':') {
        Some((name, n)) => {
            let min: u64 = n
                .parse()
                .map_err(|_| RequirementError::Count(s.trim().into()))?;
            if min == 0 {
                return Err(RequirementError::Count(s.trim().into()));
            }
            (name, min)
        }
        None => (head, 1),
    };
    if name.is_empty() {
        return Err(RequirementError::Empty(what, s.trim().into()));
    }
    Ok((name.to_string(), min, status))
}

impl Requirement {
    /// `stripe` (at least 1), `stripe:2`, `stripe:1 status=4xx`.
    pub fn parse_service(s: &str) -> Result<Requirement, RequirementError> {
        let (name, min, status) = parse_counted(s, "service")?;
        Ok(Requirement::Service { name, min, status })
    }

    /// `api.stripe.com` (at least 1), `api.stripe.com:2`, `… status=any`.
    pub fn parse_host(s: &str) -> Result<Requirement, RequirementError> {
        let (host, min, status) = parse_counted(s, "host")?;
        Ok(Requirement::Host {
            host: host.to_ascii_lowercase(),
            min,
            status,
        })
    }

    /// `/webhook` (at least 1), `/webhook:3`, `/webhook:1 status=4xx`.
    pub fn parse_callback(s: &str) -> Result<Requirement, RequirementError> {
        let (path, min, status) = parse_counted(s, "path")?;
        if !path.starts_with('/') || path.contains(['?', '#']) {
            return Err(RequirementError::Callback(s.trim().into()));
        }
        Ok(Requirement::Callback { path, min, status })
    }

    /// `stripe POST /v1/charges`, `stripe POST /v1/charges status=402`.
    pub fn parse_request(s: &str) -> Result<Requirement, RequirementError> {
        let (head, status) = split_status(s)?;
        let parts: Vec<&str> = head.split_whitespace().collect();
        if parts.len() == 4 && parts[2].starts_with('/') {
            return Err(RequirementError::Clause(s.trim().into(), parts[3].into()));
        }
        let [service, method, path] = parts[..] else {
            return Err(RequirementError::Request(s.into()));
        };
        if !path.starts_with('/') || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(RequirementError::Request(s.into()));
        }
        // The receipt lists paths without their (redacted) queries, so a
        // query here could never be checked: refused, not silently dropped.
        if path.contains(['?', '#']) {
            return Err(RequirementError::Query(s.into()));
        }
        // Methods are matched as written in upper case (`post` is POST).
        Ok(Requirement::Request {
            service: service.to_string(),
            method: method.to_ascii_uppercase(),
            path: path.to_string(),
            status,
        })
    }
}

impl std::fmt::Display for Requirement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Requirement::Service { name, min, status } => {
                write!(f, "{name}:{min} status={status}")
            }
            Requirement::Host { host, min, status } => {
                write!(f, "host {host}:{min} status={status}")
            }
            Requirement::Request {
                service,
                method,
                path,
                status,
            } => write!(f, "{service} {method} {path} status={status}"),
            Requirement::Callback { path, min, status } => {
                write!(f, "callback {path}:{min} status={status}")
            }
            Requirement::Verified => f.write_str("integrity verified"),
        }
    }
}

/// `/v1/charges/` and `/v1/charges` are the same path to a requirement.
fn same_path(a: &str, b: &str) -> bool {
    let trim = |p: &str| -> usize {
        if p.len() > 1 && p.ends_with('/') {
            p.len() - 1
        } else {
            p.len()
        }
    };
    a[..trim(a)] == b[..trim(b)]
}

/// How one requirement came out, for the JSON receipt and the MCP tool: what
/// it counts and what was seen, the statuses among them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequirementResult {
    /// The requirement in the flags' words, its status clause spelled out.
    pub requirement: String,
    /// `service`, `host`, `request` or `verified`.
    pub kind: String,
    /// The answers counted: `2xx` (without a clause), a code, a class, `any`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// At least this many must have been counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<u64>,
    /// Requests it names whose answer it counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counted: Option<u64>,
    /// Every request it names, per status of the answer, counted or not.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub seen_statuses: BTreeMap<u16, u64>,
    pub holds: bool,
}

/// `saw 1, with status 400`; `saw 3, with statuses 200 (1), 400 (2)`.
fn seen_text(statuses: &BTreeMap<u16, u64>) -> String {
    let total: u64 = statuses.values().sum();
    match statuses.len() {
        0 => format!("saw {total}"),
        1 => format!(
            "saw {total}, with status {}",
            statuses.keys().next().copied().unwrap_or(0)
        ),
        _ => {
            let each: Vec<String> = statuses.iter().map(|(s, n)| format!("{s} ({n})")).collect();
            format!("saw {total}, with statuses {}", each.join(", "))
        }
    }
}

fn add_statuses(into: &mut BTreeMap<u16, u64>, from: &BTreeMap<u16, u64>) {
    for (s, n) in from {
        *into.entry(*s).or_default() += n;
    }
}

/// The statuses of what a requirement names (not `verified`).
fn seen_for(r: &Receipt, req: &Requirement) -> BTreeMap<u16, u64> {
    let mut seen = BTreeMap::new();
    match req {
        Requirement::Service { name, .. } => {
            for by_status in r
                .services
                .get(name)
                .into_iter()
                .flat_map(|s| s.call_statuses.values())
            {
                add_statuses(&mut seen, by_status);
            }
        }
        Requirement::Host { host, .. } => {
            let host = normalize_host(host);
            for s in r.services.values() {
                if let Some(by_status) = s.host_statuses.get(&host) {
                    add_statuses(&mut seen, by_status);
                }
            }
        }
        Requirement::Request {
            service,
            method,
            path,
            ..
        } => {
            let calls = r
                .services
                .get(service)
                .into_iter()
                .flat_map(|s| s.call_statuses.iter());
            for (call, by_status) in calls {
                let matches = call
                    .split_once(' ')
                    .is_some_and(|(m, p)| m == method && same_path(p, path));
                if matches {
                    add_statuses(&mut seen, by_status);
                }
            }
        }
        Requirement::Callback { path, .. } => {
            let by_path = r
                .callbacks
                .statuses
                .iter()
                .filter(|(bucket, _)| counted_origin(bucket))
                .flat_map(|(_, by_path)| by_path);
            for (p, by_status) in by_path {
                if same_path(p, path) {
                    add_statuses(&mut seen, by_status);
                }
            }
        }
        Requirement::Verified => {}
    }
    seen
}

/// What one [`Outcome`] of [`evaluate`] asserts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assertion {
    /// Integrity is not `failed`.
    Integrity,
    /// At least one request reached the twin (waived by `allow_empty`).
    NonEmpty,
    /// No vendor host refused the veris certificate without completing a request.
    Trust,
    /// A requirement the reader gave.
    Requirement(Requirement),
}

/// One assertion of [`evaluate`] and how it came out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub assertion: Assertion,
    /// Why it does not hold, one line each (the `FAIL:` lines); empty when it holds.
    pub failures: Vec<String>,
    /// Not asserted: an empty window with `allow_empty`.
    pub waived: bool,
}

impl Outcome {
    fn new(assertion: Assertion, failures: Vec<String>) -> Outcome {
        Outcome {
            assertion,
            failures,
            waived: false,
        }
    }

    pub fn holds(&self) -> bool {
        self.failures.is_empty()
    }
}

/// The outcome of [`evaluate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// 0 when everything holds, [`EXIT_UNMET`] (3) otherwise.
    pub exit_code: i32,
    /// One line per failure: what was wanted and what was seen.
    pub lines: Vec<String>,
    /// Every assertion made, in the order of `lines`: integrity, non-empty,
    /// trust, then each requirement. `exit_code` and `lines` are derived
    /// from these, so every rendering of the verdict (text, JUnit) agrees.
    pub outcomes: Vec<Outcome>,
    /// Each requirement's result, in the order given (the JSON receipt's
    /// `requirements`).
    pub requirements: Vec<RequirementResult>,
}

/// Checks a receipt: failed integrity, an empty window (unless
/// `allow_empty`) and each requirement. `unverified` integrity does not fail.
pub fn evaluate(r: &Receipt, reqs: &[Requirement], allow_empty: bool) -> Verdict {
    let mut outcomes = Vec::new();
    let mut lines = Vec::new();
    if r.integrity.status == IntegrityStatus::Failed {
        lines.push(format!(
            "integrity failed: {}",
            r.integrity.reason.as_deref().unwrap_or("no reason given")
        ));
    }
    outcomes.push(Outcome::new(
        Assertion::Integrity,
        std::mem::take(&mut lines),
    ));
    let empty = r.total_requests() == 0;
    if empty && !allow_empty {
        lines.push(EMPTY_SENTENCE.to_string());
    }
    outcomes.push(Outcome {
        assertion: Assertion::NonEmpty,
        failures: std::mem::take(&mut lines),
        waived: empty && allow_empty,
    });
    for f in r.trust_failures.iter().filter(|f| f.is_fatal()) {
        lines.push(format!(
            "vendor host {} refused the veris certificate {} time(s) and completed no request. Next: fix the client's trust as the trust failure line says",
            quoted(&f.host), f.refusals
        ));
    }
    outcomes.push(Outcome::new(Assertion::Trust, std::mem::take(&mut lines)));
    let mut results = Vec::new();
    for req in reqs {
        let (lines, result) = judge_requirement(r, req);
        outcomes.push(Outcome::new(Assertion::Requirement(req.clone()), lines));
        results.push(result);
    }
    let lines: Vec<String> = outcomes
        .iter()
        .flat_map(|o| o.failures.iter().cloned())
        .collect();
    Verdict {
        exit_code: if lines.is_empty() { 0 } else { EXIT_UNMET },
        lines,
        outcomes,
        requirements: results,
    }
}

/// The failure lines of one requirement (none when it holds) and its result.
fn judge_requirement(r: &Receipt, req: &Requirement) -> (Vec<String>, RequirementResult) {
    let mut lines = Vec::new();
    let (kind, status, min) = match req {
        Requirement::Service { min, status, .. } => ("service", Some(*status), Some(*min)),
        Requirement::Host { min, status, .. } => ("host", Some(*status), Some(*min)),
        Requirement::Request { status, .. } => ("request", Some(*status), Some(1)),
        Requirement::Callback { min, status, .. } => ("callback", Some(*status), Some(*min)),
        Requirement::Verified => ("verified", None, None),
    };
    let seen = seen_for(r, req);
    let counted: u64 = match status {
        Some(f) => seen
            .iter()
            .filter(|(s, _)| f.matches(**s))
            .map(|(_, n)| n)
            .sum(),
        None => 0,
    };
    match req {
        // A failed integrity already has its own line above.
        Requirement::Verified if r.integrity.status == IntegrityStatus::Unverified => {
            lines.push(format!(
                "required verified integrity (--require-verified), got {}",
                super::text::integrity_text(&r.integrity)
            ));
        }
        Requirement::Service { name, min, status } if counted < *min => {
            lines.push(format!(
                "required service {}: at least {min} request(s) {}; {}",
                token(name),
                status.counted(),
                seen_text(&seen)
            ));
        }
        Requirement::Host { host, min, status } if counted < *min => {
            lines.push(format!(
                "required host {}: at least {min} request(s) {}; {}",
                quoted(&normalize_host(host)),
                status.counted(),
                seen_text(&seen)
            ));
        }
        Requirement::Callback { path, min, status } if counted < *min => {
            let unanswered: u64 = r
                .callbacks
                .unanswered
                .iter()
                .filter(|(bucket, _)| counted_origin(bucket))
                .flat_map(|(_, by_path)| by_path)
                .filter(|(p, _)| same_path(p, path))
                .map(|(_, n)| n)
                .sum();
            let no_answer = match unanswered {
                0 => String::new(),
                n => format!(", and {n} attempt(s) got no answer"),
            };
            // Deliveries that would have matched but prove nothing about the
            // app's integration: said, so a reader is not left guessing.
            let uncounted: u64 = r
                .callbacks
                .statuses
                .iter()
                .filter(|(bucket, _)| !counted_origin(bucket))
                .flat_map(|(_, by_path)| by_path)
                .filter(|(p, _)| same_path(p, path))
                .flat_map(|(_, by_status)| by_status)
                .filter(|(s, _)| status.matches(**s))
                .map(|(_, n)| n)
                .sum();
            let not_counted = match uncounted {
                0 => String::new(),
                n => format!(" ({n} more were triggered, replayed or fault-injected: not counted)"),
            };
            lines.push(format!(
                "required callback {}: at least {min} delivery(ies) of the twin's events {}; {}{no_answer}{not_counted}",
                quoted(path),
                status.counted(),
                seen_text(&seen)
            ));
        }
        Requirement::Request {
            service,
            method,
            path,
            status,
        } if counted == 0 => {
            let wanted = format!(
                "required request {} {} {} {}",
                token(service),
                token(method),
                quoted(path),
                status.counted()
            );
            let summary = r.services.get(service);
            let line = match summary {
                _ if !seen.is_empty() => format!("{wanted}: {}", seen_text(&seen)),
                None => format!("{wanted}: saw 0; {} saw 0 requests", token(service)),
                Some(s) => {
                    const SHOWN: usize = 5;
                    let mut calls: Vec<String> = s
                        .calls
                        .iter()
                        .take(SHOWN)
                        .map(|(c, n)| {
                            let (m, p) = c.split_once(' ').unwrap_or((c, ""));
                            format!("{} {} ({n})", token(m), quoted(p))
                        })
                        .collect();
                    if s.calls.len() > SHOWN {
                        calls.push(format!("… and {} more", s.calls.len() - SHOWN));
                    }
                    format!(
                        "{wanted}: saw 0; {} saw {} request(s): {}",
                        token(service),
                        s.requests,
                        calls.join(", ")
                    )
                }
            };
            lines.push(line);
        }
        _ => {}
    }
    let result = RequirementResult {
        requirement: req.to_string(),
        kind: kind.into(),
        status: status.map(|f| f.to_string()),
        min,
        counted: status.map(|_| counted),
        seen_statuses: seen,
        holds: lines.is_empty(),
    };
    (lines, result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(path: &str, status: Option<u16>, origin: &str) -> crate::entry::CallbackLine {
        crate::entry::CallbackLine {
            service: "stripe".into(),
            event: "charge.succeeded".into(),
            event_id: "evt_1".into(),
            target: "127.0.0.1:1".into(),
            method: "POST".into(),
            path: path.into(),
            query: None,
            status,
            error: status.is_none().then(|| "timeout".into()),
            duration_ms: 1,
            duration_us: None,
            attempt: 1,
            origin: origin.into(),
            fault: None,
            tls: false,
        }
    }

    /// The request requirements' grammar; only the twin's own deliveries
    /// count, answered 2xx (one trailing slash aside).
    #[test]
    fn callback_requirements_share_the_grammar_and_count_twin_deliveries_only() {
        assert_eq!(
            Requirement::parse_callback("/webhook:2 status=4xx").unwrap(),
            Requirement::Callback {
                path: "/webhook".into(),
                min: 2,
                status: StatusFilter::Class(4),
            }
        );
        for bad in ["webhook", "/webhook?x=1", "/webhook:0", ":2", "/a b"] {
            assert!(Requirement::parse_callback(bad).is_err(), "{bad}");
        }
        let mut r = crate::receipt::build(
            &crate::ledger::LedgerRead::default(),
            &crate::receipt::Options::default(),
        );
        r.callbacks
            .add(1, &delivery("/webhook/", Some(500), "twin"));
        r.callbacks.add(2, &delivery("/webhook", None, "twin"));
        r.callbacks
            .add(3, &delivery("/webhook", Some(200), "trigger"));
        r.callbacks.add(4, &delivery("/other", Some(200), "twin"));
        let req = Requirement::parse_callback("/webhook").unwrap();
        let v = evaluate(&r, std::slice::from_ref(&req), true);
        assert_eq!(v.exit_code, EXIT_UNMET);
        let line = v.lines.last().unwrap();
        assert!(
            line.contains("saw 1, with status 500, and 1 attempt(s) got no answer (1 more were triggered, replayed or fault-injected: not counted)"),
            "{line}"
        );
        // A fault-injected delivery of the twin's own event proves nothing
        // either.
        let faulted = crate::entry::CallbackLine {
            fault: Some("duplicate".into()),
            ..delivery("/webhook", Some(200), "twin")
        };
        r.callbacks.add(6, &faulted);
        assert_eq!(
            r.callbacks.entries.last().unwrap().fault.as_deref(),
            Some("duplicate")
        );
        let v = evaluate(&r, std::slice::from_ref(&req), true);
        assert_eq!(v.exit_code, EXIT_UNMET);
        assert!(
            v.lines.last().unwrap().contains("(2 more were"),
            "{:?}",
            v.lines
        );
        r.callbacks.add(5, &delivery("/webhook", Some(204), "twin"));
        assert_eq!(evaluate(&r, &[req], true).exit_code, 0);
    }

    /// An external twin's event forwarded through the ingress counts like
    /// the built-in twin's own; a faulted one does not.
    #[test]
    fn ingress_deliveries_count_like_the_twins_own() {
        let req = Requirement::parse_callback("/webhook").unwrap();
        let mut r = crate::receipt::build(
            &crate::ledger::LedgerRead::default(),
            &crate::receipt::Options::default(),
        );
        r.callbacks
            .add(1, &delivery("/webhook", Some(400), "ingress"));
        let v = evaluate(&r, std::slice::from_ref(&req), true);
        assert_eq!(v.exit_code, EXIT_UNMET);
        assert!(
            v.lines.last().unwrap().contains("with status 400"),
            "{:?}",
            v.lines
        );
        r.callbacks
            .add(2, &delivery("/webhook", Some(200), "ingress"));
        assert_eq!(evaluate(&r, &[req], true).exit_code, 0);
        let mut text = String::new();
        r.callbacks.render(&mut text, 10);
        assert!(!text.contains("not counted"), "{text}");
    }

    #[test]
    fn a_request_requirement_is_service_method_and_path_and_nothing_else() {
        assert_eq!(
            Requirement::parse_request("stripe post /v1/charges").unwrap(),
            Requirement::Request {
                service: "stripe".into(),
                method: "POST".into(),
                path: "/v1/charges".into(),
                status: StatusFilter::SUCCESS,
            }
        );
        for bad in [
            "stripe POST /v1/charges?limit=3",
            "stripe POST /v1/charges#x",
        ] {
            let e = Requirement::parse_request(bad).unwrap_err();
            assert_eq!(e, RequirementError::Query(bad.into()));
            assert!(e.to_string().contains("Next:"), "{e}");
        }
        for bad in [
            "stripe POST",
            "stripe POST v1/charges",
            "stripe P0ST /x",
            "a b c d",
        ] {
            assert_eq!(
                Requirement::parse_request(bad),
                Err(RequirementError::Request(bad.into()))
            );
        }
    }
}
