//! Requirements asserted against a receipt, and the exit code they give.

use super::*;

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
            Requirement::Verified => f.write_str("integrity verified"),
        }
    }
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
            f.host, f.refusals
        ));
    }
    outcomes.push(Outcome::new(Assertion::Trust, std::mem::take(&mut lines)));
    for req in reqs {
        match req {
            Requirement::Verified => {
                // A failed integrity already has its own line above.
                if r.integrity.status == IntegrityStatus::Unverified {
                    lines.push(format!(
                        "required verified integrity (--require-verified), got {}",
                        super::text::integrity_text(&r.integrity)
                    ));
                }
            }
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
        outcomes.push(Outcome::new(
            Assertion::Requirement(req.clone()),
            std::mem::take(&mut lines),
        ));
    }
    let lines: Vec<String> = outcomes
        .iter()
        .flat_map(|o| o.failures.iter().cloned())
        .collect();
    Verdict {
        exit_code: if lines.is_empty() { 0 } else { EXIT_UNMET },
        lines,
        outcomes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_requirement_is_service_method_and_path_and_nothing_else() {
        assert_eq!(
            Requirement::parse_request("stripe post /v1/charges").unwrap(),
            Requirement::Request {
                service: "stripe".into(),
                method: "POST".into(),
                path: "/v1/charges".into(),
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
