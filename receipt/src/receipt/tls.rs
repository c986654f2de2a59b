//! What clients did with the leaves the proxy presented, judged by evidence:
//! an alert that names the certificate is a refusal (`trust_failures`, fatal
//! for a vendor host that completed nothing); a close without one — during
//! the handshake, or right after it with no request — is only a note
//! (`tls_abandoned`), since a client that gave up closes the same way.
//! `trust_failure` lines written before ledger version 3 are judged by the
//! same rule, so an old `no_alert` line is a note too.

use std::collections::BTreeMap;

use crate::entry::{is_refusal_alert, Entry};
use crate::entry::{TlsAbandonedLine, TrustFailureLine};

use super::*;

/// Folds a window's `trust_failure` and `tls_abandoned` lines, one at a time.
#[derive(Debug, Default)]
pub(super) struct TlsTally {
    refused: BTreeMap<String, TrustFailure>,
    abandoned: BTreeMap<String, AbandonedTls>,
}

impl TlsTally {
    /// Takes one in-window entry; other kinds are ignored.
    pub(super) fn add(&mut self, entry: &Entry) {
        match entry {
            Entry::TrustFailure(TrustFailureLine {
                host,
                service,
                alert,
                ..
            }) if is_refusal_alert(alert) => {
                let host = normalize_host(host);
                let f = self
                    .refused
                    .entry(host.clone())
                    .or_insert_with(|| TrustFailure {
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
            // An old line without evidence of a refusal.
            Entry::TrustFailure(TrustFailureLine {
                host,
                service,
                alert,
                ..
            }) => {
                let alert = alert.strip_prefix("other:").unwrap_or(alert);
                let alert = (alert != "no_alert").then_some(alert);
                self.abandon(host, service, "handshake", alert);
            }
            // An HTTP/2 connection closed unused: how an HTTP/2 client
            // that dialed several at once drops the extras (Go does). Not
            // trust evidence when the host completed requests (`finish`).
            Entry::TlsAbandoned(TlsAbandonedLine {
                host,
                service,
                stage,
                alpn: Some(alpn),
                ..
            }) if stage == "no_request" && alpn == "h2" => {
                self.entry(host, service).unused_h2 += 1;
            }
            Entry::TlsAbandoned(TlsAbandonedLine {
                host,
                service,
                stage,
                alert,
                ..
            }) => self.abandon(host, service, stage, alert.as_deref()),
            _ => {}
        }
    }

    fn entry(&mut self, host: &str, service: &Option<String>) -> &mut AbandonedTls {
        let host = normalize_host(host);
        let a = self
            .abandoned
            .entry(host.clone())
            .or_insert_with(|| AbandonedTls {
                host,
                ..AbandonedTls::default()
            });
        if a.service.is_none() {
            a.service = service.clone();
        }
        a
    }

    fn abandon(&mut self, host: &str, service: &Option<String>, stage: &str, alert: Option<&str>) {
        let a = self.entry(host, service);
        if stage == "no_request" {
            a.no_request += 1;
        } else {
            a.handshakes += 1;
            *a.alerts
                .entry(alert.unwrap_or(NO_ALERT).to_string())
                .or_default() += 1;
        }
    }

    /// The refusals and the abandoned connections per host, each with the
    /// requests that completed to the same host.
    pub(super) fn finish(
        self,
        services: &BTreeMap<String, ServiceSummary>,
    ) -> (Vec<TrustFailure>, Vec<AbandonedTls>) {
        let completed =
            |host: &str| -> u64 { services.values().filter_map(|s| s.hosts.get(host)).sum() };
        let refused = self
            .refused
            .into_values()
            .map(|mut f| {
                f.completed = completed(&f.host);
                let alerts: Vec<String> = f
                    .alerts
                    .iter()
                    .map(|(a, n)| format!("{} ({n})", crate::quote::token(a)))
                    .collect();
                f.detail = format!(
                    "alerts {}. Next: {}",
                    alerts.join(", "),
                    trust_next_step(&f.alerts)
                );
                f
            })
            .collect();
        let abandoned = self
            .abandoned
            .into_values()
            .map(|mut a| {
                a.completed = completed(&a.host);
                // With nothing completed, an unused HTTP/2 connection is a
                // close right after our certificate like any other.
                if a.completed == 0 {
                    a.no_request += std::mem::take(&mut a.unused_h2);
                }
                a
            })
            .collect();
        (refused, abandoned)
    }
}

/// The `alerts` key of a close with no alert at all.
pub const NO_ALERT: &str = "none";

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
             own CA (stripe-python, certifi copies) need their own setting — an isolated `veris run` covers \
             the copies it finds at start in the site-packages and JDK of the python3, python and java on \
             the command's PATH, not one installed during the run or kept elsewhere: name that one with \
             `veris run --trust-file FILE`; real certificate pinning cannot be fixed"
        }
    }
}

/// The text receipt's line for a host whose connections were abandoned.
/// The note for `a`; `None` when it holds only HTTP/2 connections closed
/// unused beside completed requests, which say nothing about trust.
pub(super) fn abandoned_text(a: &AbandonedTls) -> Option<String> {
    if a.handshakes == 0 && a.no_request == 0 {
        return None;
    }
    let mut parts = Vec::new();
    if a.handshakes > 0 {
        let alerts: Vec<String> = a
            .alerts
            .iter()
            .map(|(alert, n)| format!("{} ({n})", crate::quote::token(alert)))
            .collect();
        parts.push(format!(
            "{} handshake(s) closed after our certificate with no alert naming it (alerts: {}) — a client that gave up closes like this, and so does one that rejects the veris CA without saying so (Node does)",
            a.handshakes,
            alerts.join(", ")
        ));
    }
    if a.no_request > 0 {
        parts.push(format!(
            "{} connection(s) closed right after our certificate, no request — a client that doesn't trust the veris CA closes like this (wget does)",
            a.no_request
        ));
    }
    Some(format!(
        "tls note: {}: {}; {} completed (not a failure by itself)",
        crate::quote::quoted(&a.host),
        parts.join("; "),
        a.completed
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{Line, ListenerTier};
    use crate::ledger::LedgerRead;

    fn line(seq: u64, v: u32, entry: Entry) -> Line {
        Line {
            v,
            seq,
            ts: "2026-11-29T07:28:19.123Z".into(),
            entry,
            prev: String::new(),
        }
    }

    fn trust(seq: u64, alert: &str) -> Line {
        line(
            seq,
            2,
            Entry::TrustFailure(TrustFailureLine {
                service: Some("stripe".into()),
                alert: alert.into(),
                ..TrustFailureLine::test("api.stripe.com")
            }),
        )
    }

    fn abandoned(seq: u64, stage: &str, alert: Option<&str>) -> Line {
        line(
            seq,
            3,
            Entry::TlsAbandoned(TlsAbandonedLine {
                tier: ListenerTier::Transparent,
                service: Some("stripe".into()),
                stage: stage.into(),
                alert: alert.map(str::to_string),
                ..TlsAbandonedLine::test("api.stripe.com")
            }),
        )
    }

    fn receipt(lines: Vec<Line>) -> Receipt {
        let n = lines.len() as u64;
        let read = LedgerRead {
            lines,
            head: (n, String::new()),
            ..LedgerRead::default()
        };
        super::super::build(&read, &Options::default())
    }

    #[test]
    fn closes_without_a_certificate_alert_are_notes_not_failures() {
        let r = receipt(vec![
            abandoned(1, "handshake", None),
            abandoned(2, "handshake", Some("handshake_failure")),
            abandoned(3, "no_request", None),
            // Written by a proxy before version 3: no evidence either.
            trust(4, "no_alert"),
            trust(5, "other:decrypt_error"),
        ]);
        assert!(r.trust_failures.is_empty(), "{:?}", r.trust_failures);
        let a = &r.tls_abandoned[0];
        assert_eq!((a.handshakes, a.no_request, a.completed), (4, 1, 0));
        assert_eq!(a.service.as_deref(), Some("stripe"));
        assert_eq!(a.alerts["none"], 2);
        assert_eq!(a.alerts["handshake_failure"], 1);
        assert_eq!(a.alerts["decrypt_error"], 1);
        let verdict = evaluate(&r, &[], true);
        assert_eq!(verdict.exit_code, 0, "{:?}", verdict.lines);
        let text = render_text(&r);
        assert!(
            text.contains(
                "tls note: \"api.stripe.com\": 4 handshake(s) closed after our certificate"
            ),
            "{text}"
        );
        assert!(
            text.contains("1 connection(s) closed right after our certificate, no request — a client that doesn't trust the veris CA closes like this"),
            "{text}"
        );
        assert!(!text.contains("trust failure"), "{text}");
        // The JSON field reads back.
        let back: Receipt = serde_json::from_value(serde_json::to_value(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn an_alert_naming_the_certificate_is_a_refusal_beside_the_notes() {
        let r = receipt(vec![
            trust(1, "unknown_ca"),
            trust(2, "access_denied"),
            abandoned(3, "handshake", None),
        ]);
        let f = &r.trust_failures[0];
        assert_eq!(f.refusals, 2);
        assert!(f.is_fatal());
        assert_eq!(r.tls_abandoned[0].handshakes, 1);
        assert_eq!(evaluate(&r, &[], true).exit_code, EXIT_UNMET);
    }

    #[test]
    fn a_receipt_without_the_field_still_reads() {
        let mut json = serde_json::to_value(receipt(vec![trust(1, "unknown_ca")])).unwrap();
        json.as_object_mut().unwrap().remove("tls_abandoned");
        let back: Receipt = serde_json::from_value(json).unwrap();
        assert!(back.tls_abandoned.is_empty());
    }
}
