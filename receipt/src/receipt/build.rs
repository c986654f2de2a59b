//! Building a receipt from a ledger window: what reached the twin, leaks,
//! trust failures. Integrity is computed in `integrity`.

use std::collections::BTreeMap;

use crate::entry::Entry;
use crate::ledger::LedgerRead;

use super::*;

/// Builds the receipt for a window of a verified read. Mode, tier and twin
/// come from the newest session line at or before the window end.
pub fn build(read: &LedgerRead, options: &Options) -> Receipt {
    let window = window(read, options);
    let (since, until) = (window.since_seq, window.until_seq);
    let wanted = |service: &str| options.service.as_deref().is_none_or(|s| s == service);

    let mut receipt = Receipt {
        version: RECEIPT_VERSION,
        twin: None,
        window,
        mode: None,
        tier: None,
        isolation: None,
        integrity: integrity::integrity(read, options, &window),
        leaks: Vec::new(),
        services: BTreeMap::new(),
        trust_failures: Vec::new(),
        tls_abandoned: Vec::new(),
        passthrough: HostCounts::default(),
        blocked: HostCounts::default(),
        upstream_errors: Vec::new(),
        seal_key: None,
        reserved_paths: BTreeMap::new(),
    };

    // (host, destination) -> count, for passthrough and blocked lines.
    let mut passed = BTreeMap::new();
    let mut blocked = BTreeMap::new();
    let mut tls = super::tls::TlsTally::default();
    for line in &read.lines {
        if let Entry::Session {
            sandbox_id,
            mode,
            tier,
            key_id,
            coverage,
            ..
        } = &line.entry
        {
            if line.seq <= until {
                receipt.twin = Some(sandbox_id.clone());
                receipt.mode = Some(*mode);
                receipt.tier = Some(*tier);
                receipt.isolation = coverage.as_ref().and_then(|c| c.isolation.clone());
                receipt.seal_key = key_id.clone();
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
                client_gone,
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
                        client_gone: *client_gone,
                        incomplete: None,
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
            Entry::ReservedPath {
                service,
                method,
                path,
                ..
            } if wanted(service) => {
                *receipt
                    .reserved_paths
                    .entry(format!("{service} {method} {}", strip_query(path)))
                    .or_default() += 1;
            }
            Entry::Passthrough { host, dst, .. } => {
                let host = normalize_host(host);
                *receipt.passthrough.hosts.entry(host.clone()).or_default() += 1;
                *passed.entry((host, dst.clone())).or_default() += 1;
            }
            Entry::Blocked { host, dst, .. } => {
                let host = normalize_host(host);
                *receipt.blocked.hosts.entry(host.clone()).or_default() += 1;
                *blocked.entry((host, dst.clone())).or_default() += 1;
            }
            Entry::TrustFailure { .. } | Entry::TlsAbandoned { .. } => tls.add(&line.entry),
            // Follows its request line; one whose request is before the
            // window is not this window's.
            Entry::ResponseIncomplete {
                of,
                service,
                bytes,
                declared,
                reason,
            } if wanted(service) => {
                if let Some(summary) = receipt.services.get_mut(service) {
                    let listed = summary.entries.binary_search_by_key(of, |e| e.seq);
                    if let Ok(i) = listed {
                        summary.entries[i].incomplete = Some(Incomplete {
                            bytes: *bytes,
                            declared: *declared,
                            reason: reason.clone(),
                        });
                    }
                    if listed.is_ok() || summary.entries.last().is_some_and(|e| e.seq < *of) {
                        summary.incomplete += 1;
                    }
                }
            }
            _ => {}
        }
    }
    receipt.passthrough.destinations = destinations(passed);
    receipt.blocked.destinations = destinations(blocked);

    receipt.leaks = super::leaks::leaks(read, since, until);
    (receipt.trust_failures, receipt.tls_abandoned) = tls.finish(&receipt.services);
    receipt
}

fn destinations(counts: BTreeMap<(String, Option<String>), u64>) -> Vec<Destination> {
    counts
        .into_iter()
        .map(|((host, dst), count)| Destination { host, dst, count })
        .collect()
}

/// The window `(since, until]` the options ask for: until the given end or
/// the last line; from the latest session at or before it (the default),
/// the whole file, or a baseline.
fn window(read: &LedgerRead, options: &Options) -> Window {
    let last = read.lines.last().map_or(0, |l| l.seq);
    let until = options.until.map_or(last, |u| u.min(last));
    let (since_seq, scope) = match options.scope {
        WindowSpec::All => (0, Scope::All),
        WindowSpec::Since(s) => (s, Scope::Baseline),
        WindowSpec::LatestSession => {
            let session = read
                .lines
                .iter()
                .rev()
                .filter(|l| l.seq <= until)
                .find(|l| matches!(l.entry, Entry::Session { .. }));
            (
                session.map_or(0, |l| l.seq.saturating_sub(1)),
                Scope::Session,
            )
        }
    };
    Window {
        since_seq,
        until_seq: until,
        scope,
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
                client_gone: false,
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

    fn pass(seq: u64, host: &str, dst: Option<&str>) -> Line {
        Line {
            v: 2,
            seq,
            ts: "2026-11-29T07:28:19.123Z".into(),
            entry: Entry::Passthrough {
                host: host.into(),
                port: 443,
                tier: ListenerTier::Transparent,
                bytes_in: 1,
                bytes_out: 1,
                duration_ms: 1,
                reason: "mode".into(),
                dst: dst.map(str::to_string),
            },
            prev: String::new(),
        }
    }

    fn block(seq: u64, host: &str, dst: Option<&str>) -> Line {
        Line {
            v: 2,
            seq,
            ts: "2026-11-29T07:28:19.123Z".into(),
            entry: Entry::Blocked {
                host: host.into(),
                port: 443,
                tier: ListenerTier::Transparent,
                method: None,
                path: None,
                reason: "strict mode: name does not match the destination".into(),
                dst: dst.map(str::to_string),
            },
            prev: String::new(),
        }
    }

    #[test]
    fn one_name_sent_to_two_destinations_stays_two() {
        let read = LedgerRead {
            lines: vec![
                pass(1, "example.org", Some("203.0.113.10:443")),
                pass(2, "Example.ORG", Some("198.51.100.7:443")),
                pass(3, "example.org", Some("203.0.113.10:443")),
                pass(4, "registry.npmjs.org", None),
                block(5, "x.localhost", Some("203.0.113.10:443")),
            ],
            head: (5, String::new()),
            ..LedgerRead::default()
        };
        let r = build(&read, &Options::default());
        // By name, as before: the count the name's lines add up to.
        assert_eq!(r.passthrough.hosts["example.org"], 3);
        let d: Vec<(&str, Option<&str>, u64)> = r
            .passthrough
            .destinations
            .iter()
            .map(|d| (d.host.as_str(), d.dst.as_deref(), d.count))
            .collect();
        assert_eq!(
            d,
            [
                ("example.org", Some("198.51.100.7:443"), 1),
                ("example.org", Some("203.0.113.10:443"), 2),
                ("registry.npmjs.org", None, 1),
            ]
        );
        let text = render_text(&r);
        assert!(
            text.contains("passthrough: example.org → 198.51.100.7:443 (1), example.org → 203.0.113.10:443 (2), registry.npmjs.org (1)\n"),
            "{text}"
        );
        assert!(
            text.contains("blocked: x.localhost → 203.0.113.10:443 (1)\n"),
            "{text}"
        );
        // JSON adds the field beside `hosts`, and reads back.
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["passthrough"]["hosts"]["example.org"], 3);
        assert_eq!(
            json["blocked"]["destinations"],
            serde_json::json!([{"host": "x.localhost", "dst": "203.0.113.10:443", "count": 1}])
        );
        let back: Receipt = serde_json::from_value(json).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn a_receipt_without_destinations_still_reads() {
        let counts: HostCounts = serde_json::from_str(r#"{"hosts":{"example.org":2}}"#).unwrap();
        assert_eq!(counts.hosts["example.org"], 2);
        assert!(counts.destinations.is_empty());
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
                trust(4, "api.github.com", Some("github"), "bad_certificate"),
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
        assert_eq!(github.alerts["bad_certificate"], 1);
        assert!(github.is_fatal());
        assert!(github
            .detail
            .starts_with("alerts bad_certificate (1), unknown_ca (1). Next: "));
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
