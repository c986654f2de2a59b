//! The `/` filter: space-separated terms that must all match a row.
//!
//! - `2xx` … `5xx`: the status class the client got (blocked counts as 4xx);
//! - `service:NAME` (or `s:NAME`): the service column, exactly;
//! - `kind:KIND` (or `k:KIND`): `request`, `passthrough`, `blocked`,
//!   `upstream_error`, `trust_failure`, `session`, `quic`, `ech`;
//! - anything else: case-insensitive text in the service, host, method,
//!   path, query or status.

use veris_receipt::Entry;
use veris_receipt::{
    BlockedLine, PassthroughLine, RequestLine, TrustFailureLine, UpstreamErrorLine,
};

use crate::app::Row;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Term {
    Class(u16),
    Service(String),
    Kind(String),
    Text(String),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    text: String,
    terms: Vec<Term>,
}

impl Filter {
    pub fn parse(text: &str) -> Filter {
        let terms = text
            .split_whitespace()
            .map(|t| {
                let lower = t.to_ascii_lowercase();
                let b = lower.as_bytes();
                if b.len() == 3 && (b'1'..=b'5').contains(&b[0]) && &lower[1..] == "xx" {
                    return Term::Class(u16::from(b[0] - b'0'));
                }
                if let Some(v) = lower
                    .strip_prefix("service:")
                    .or_else(|| lower.strip_prefix("s:"))
                {
                    return Term::Service(v.to_string());
                }
                if let Some(v) = lower
                    .strip_prefix("kind:")
                    .or_else(|| lower.strip_prefix("k:"))
                {
                    return Term::Kind(v.replace('-', "_"));
                }
                Term::Text(lower)
            })
            .collect();
        Filter {
            text: text.to_string(),
            terms,
        }
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    pub fn matches(&self, row: &Row) -> bool {
        self.terms.iter().all(|t| match t {
            Term::Class(c) => row.status().is_some_and(|s| s / 100 == *c),
            Term::Service(s) => row.label().eq_ignore_ascii_case(s),
            Term::Kind(k) => row.entry.kind() == k,
            Term::Text(x) => haystack(row).contains(x.as_str()),
        })
    }
}

/// The text a free-text term searches, lower-cased.
fn haystack(row: &Row) -> String {
    let mut s = String::with_capacity(96);
    s.push_str(row.label());
    s.push(' ');
    if let Some(h) = row.host() {
        s.push_str(h);
        s.push(' ');
    }
    match &row.entry {
        Entry::Request(RequestLine {
            method,
            path,
            query,
            status,
            ..
        }) => {
            s.push_str(&format!("{method} {path}"));
            if let Some(q) = query {
                s.push('?');
                s.push_str(q);
            }
            s.push_str(&format!(" {status}"));
        }
        Entry::UpstreamError(UpstreamErrorLine {
            method,
            path,
            status,
            error,
            ..
        }) => s.push_str(&format!("{method} {path} {status} {error}")),
        Entry::Blocked(BlockedLine {
            method,
            path,
            reason,
            ..
        }) => s.push_str(&format!(
            "{} {} 421 {reason}",
            method.as_deref().unwrap_or(""),
            path.as_deref().unwrap_or("")
        )),
        Entry::Passthrough(PassthroughLine { reason, .. }) => s.push_str(reason),
        Entry::TrustFailure(TrustFailureLine { alert, .. }) => s.push_str(alert),
        Entry::Quic { dst, .. } => s.push_str(dst),
        _ => {}
    }
    s.make_ascii_lowercase();
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(service: &str, path: &str, status: u16) -> Row {
        Row {
            seq: 1,
            ts: "2026-11-29T07:28:19.123Z".into(),
            entry: Entry::Request(RequestLine {
                host: "api.stripe.com".into(),
                query: Some("limit=3".into()),
                status,
                duration_ms: 3,
                upstream: "http://127.0.0.1:1/s/x/stripe/v1/charges".into(),
                ..RequestLine::test(service, "POST", path)
            }),
        }
    }

    #[test]
    fn terms_combine() {
        let row = request("stripe", "/v1/Charges", 402);
        assert!(Filter::parse("").matches(&row));
        assert!(Filter::parse("4xx").matches(&row));
        assert!(!Filter::parse("2xx").matches(&row));
        assert!(Filter::parse("service:stripe 4xx charges").matches(&row));
        assert!(Filter::parse("s:Stripe limit=3").matches(&row));
        assert!(!Filter::parse("service:stripe-x").matches(&row));
        assert!(Filter::parse("kind:request").matches(&row));
        assert!(!Filter::parse("kind:blocked").matches(&row));
        assert!(Filter::parse("API.STRIPE").matches(&row));
    }

    #[test]
    fn blocked_is_a_4xx_and_a_kind() {
        let row = Row {
            seq: 2,
            ts: "2026-11-29T07:28:19.123Z".into(),
            entry: Entry::Blocked(BlockedLine {
                reason: "strict".into(),
                ..BlockedLine::test("evil.example")
            }),
        };
        assert!(Filter::parse("4xx").matches(&row));
        assert!(Filter::parse("kind:blocked evil").matches(&row));
        assert!(Filter::parse("blocked").matches(&row));
        assert!(!Filter::parse("kind:passthrough").matches(&row));
    }
}
