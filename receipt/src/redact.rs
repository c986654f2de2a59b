//! Redaction: the only gate between observed traffic and the ledger. Every
//! text that is recorded passes through here first, so secrets (credentials
//! in headers, keys and tokens in query strings, well-known key shapes
//! anywhere) never reach the disk. Rules are deliberate and narrow: ordinary
//! vendor object ids (`cus_123`, `ch_…`, `pk_test_…` publishable keys) stay
//! readable, because a receipt nobody can read proves nothing.
//!
//! Every function is idempotent: redacting redacted text changes nothing.

use crate::entry::Entry;

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Header names whose whole value is a credential.
const SECRET_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "api-key",
    "apikey",
    "x-auth-token",
    "x-access-token",
    "x-refresh-token",
    "x-goog-api-key",
    "x-amz-security-token",
    "x-csrf-token",
    "x-xsrf-token",
    "stripe-signature",
    "x-hub-signature",
    "x-hub-signature-256",
    "x-veris-token",
];

/// Fragments that make a header name a credential wherever they appear
/// (`x-custom-api-key`, `x-service-token`). Bare `key` is not one of them:
/// `Idempotency-Key` is an ordinary request id worth keeping.
const SECRET_HEADER_FRAGMENTS: &[&str] = &[
    "token",
    "secret",
    "password",
    "api-key",
    "apikey",
    "api_key",
    "signature",
    "credential",
    "session",
];

/// Returns the value to record for header `name`: [`REDACTED`] for
/// credential-carrying headers, otherwise the value with [`text`] applied.
pub fn header_value(name: &str, value: &str) -> String {
    let name = name.trim().to_ascii_lowercase();
    if SECRET_HEADERS.contains(&name.as_str())
        || SECRET_HEADER_FRAGMENTS.iter().any(|f| name.contains(f))
    {
        REDACTED.to_string()
    } else {
        text(value)
    }
}

/// Redacts a query string (without the leading `?`): a parameter whose name
/// looks like a credential becomes `name=[redacted]`; every other value still
/// passes through [`text`]. Order, separators and names are kept.
pub fn query(q: &str) -> String {
    q.split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if secret_param(name) => format!("{name}={REDACTED}"),
            Some((name, value)) => format!("{name}={}", text(value)),
            None => text(pair),
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// True when a query parameter name looks like it carries a credential.
/// Names are percent-decoded, lower-cased and stripped of separators first,
/// so `api_key`, `apiKey`, `api-key` and `api%5Fkey` are one name.
fn secret_param(name: &str) -> bool {
    let norm: String = percent_decode(name)
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .collect();
    const EXACT: &[&str] = &[
        "key",
        "auth",
        "authorization",
        "code",
        "codeverifier",
        "sig",
        "jwt",
        "pass",
        "passwd",
        "pwd",
        "session",
        "sessionid",
        "assertion",
    ];
    const CONTAINS: &[&str] = &[
        "token",
        "secret",
        "password",
        "apikey",
        "signature",
        "credential",
        "accesskey",
        "privatekey",
    ];
    EXACT.contains(&norm.as_str())
        || CONTAINS.iter().any(|f| norm.contains(f))
        // `x-goog-api-key`, `subscription-key`, `access_key`: a name ending
        // in "key" is a key in a query string often enough to err this way.
        || norm.ends_with("key")
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Known secret shapes: (prefix, minimum body length). A match needs a token
/// boundary before the prefix (start of text or a non-alphanumeric byte), so
/// `task_live_…` is not taken for `sk_live_…`.
const SECRET_PREFIXES: &[(&str, usize)] = &[
    // Stripe secret and restricted keys, webhook signing secrets.
    ("sk_live_", 6),
    ("sk_test_", 6),
    ("rk_live_", 6),
    ("rk_test_", 6),
    ("whsec_", 6),
    // GitHub tokens.
    ("ghp_", 20),
    ("gho_", 20),
    ("ghu_", 20),
    ("ghs_", 20),
    ("ghr_", 20),
    ("github_pat_", 20),
    // Slack tokens.
    ("xoxb-", 10),
    ("xoxp-", 10),
    ("xoxa-", 10),
    ("xoxr-", 10),
    ("xoxs-", 10),
    // Google OAuth access tokens and API keys.
    ("ya29.", 20),
    ("AIza", 30),
    // SendGrid API keys.
    ("SG.", 20),
];

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.'
}

/// Redacts secrets found anywhere in free text: known key shapes
/// (`sk_live_…`, `sk_test_…`, `rk_live_…`, `rk_test_…`, `whsec_…`, GitHub,
/// Slack, Google and SendGrid tokens) become [`REDACTED`]; `Bearer <token>`
/// becomes `Bearer [redacted]`; a password in a URL (`https://u:p@host`)
/// becomes `https://u:[redacted]@host`.
pub fn text(s: &str) -> String {
    let s = redact_prefixed(s);
    let s = redact_bearer(&s);
    redact_userinfo(&s)
}

fn redact_prefixed(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut copied = 0;
    let mut i = 0;
    while i < b.len() {
        let boundary = i == 0 || !b[i - 1].is_ascii_alphanumeric();
        let hit = boundary
            .then(|| {
                SECRET_PREFIXES.iter().find_map(|(prefix, min)| {
                    if !b[i..].starts_with(prefix.as_bytes()) {
                        return None;
                    }
                    let body_start = i + prefix.len();
                    let body = b[body_start..]
                        .iter()
                        .take_while(|&&c| is_token_byte(c))
                        .count();
                    (body >= *min).then_some(body_start + body)
                })
            })
            .flatten();
        match hit {
            Some(end) => {
                out.push_str(&s[copied..i]);
                out.push_str(REDACTED);
                copied = end;
                i = end;
            }
            None => i += 1,
        }
    }
    out.push_str(&s[copied..]);
    out
}

fn redact_bearer(s: &str) -> String {
    const WORD: &str = "bearer ";
    let lower = s.to_ascii_lowercase();
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut copied = 0;
    let mut from = 0;
    while let Some(pos) = lower[from..].find(WORD) {
        let start = from + pos;
        let boundary = start == 0 || !b[start - 1].is_ascii_alphanumeric();
        let mut tok = start + WORD.len();
        while tok < b.len() && b[tok] == b' ' {
            tok += 1;
        }
        let end = tok
            + b[tok..]
                .iter()
                .take_while(|&&c| is_token_byte(c) || matches!(c, b'~' | b'+' | b'/' | b'='))
                .count();
        if boundary && end > tok && &s[tok..end] != REDACTED {
            out.push_str(&s[copied..tok]);
            out.push_str(REDACTED);
            copied = end;
        }
        from = end.max(start + WORD.len());
    }
    out.push_str(&s[copied..]);
    out
}

fn redact_userinfo(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find("://") {
        let (head, tail) = rest.split_at(pos + 3);
        out.push_str(head);
        // The authority ends at the first '/', '?', '#' or whitespace.
        let auth_end = tail
            .find(|c: char| matches!(c, '/' | '?' | '#') || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..auth_end];
        match authority.rfind('@') {
            Some(at) => {
                let userinfo = &authority[..at];
                match userinfo.split_once(':') {
                    Some((user, pass)) if pass != REDACTED => {
                        out.push_str(user);
                        out.push(':');
                        out.push_str(REDACTED);
                    }
                    _ => out.push_str(userinfo),
                }
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[auth_end..];
    }
    out.push_str(rest);
    out
}

/// Applies the rules above to every recorded text field of an entry. The
/// proxy builds entries from redacted parts already; the writer calls this
/// again as the last line of defence.
pub fn entry(entry: Entry) -> Entry {
    match entry {
        Entry::Session {
            mut run_id,
            mut sandbox_id,
            mut twin,
            mut version,
            mut listen,
            mode,
            tier,
            pid,
            recovered_torn_tail,
            key_id,
            public_key,
            key_storage,
            proxy_uid,
            workload_uid,
            twin_heads,
            moved_aside,
            coverage,
        } => {
            for field in [
                &mut run_id,
                &mut sandbox_id,
                &mut twin,
                &mut version,
                &mut listen,
            ] {
                *field = text(field);
            }
            Entry::Session {
                run_id,
                sandbox_id,
                mode,
                tier,
                twin,
                pid,
                version,
                listen,
                recovered_torn_tail,
                key_id,
                public_key,
                key_storage,
                proxy_uid,
                workload_uid,
                twin_heads,
                moved_aside,
                coverage,
            }
        }
        Entry::Request {
            service,
            host,
            method,
            path,
            query: q,
            status,
            http,
            tier,
            bytes_in,
            bytes_out,
            duration_ms,
            upstream,
            headers,
            websocket,
            client_gone,
        } => Entry::Request {
            service: text(&service),
            host: text(&host),
            method: text(&method),
            path: text(&path),
            query: q.map(|q| query(&q)),
            status,
            http: text(&http),
            tier,
            bytes_in,
            bytes_out,
            duration_ms,
            upstream: url(&upstream),
            headers: headers
                .into_iter()
                .map(|(n, v)| {
                    let v = header_value(&n, &v);
                    (n, v)
                })
                .collect(),
            websocket,
            client_gone,
        },
        Entry::ReservedPath {
            service,
            host,
            method,
            path,
            status,
            error,
            tier,
        } => Entry::ReservedPath {
            service: text(&service),
            host: text(&host),
            method: text(&method),
            path: url(&path),
            status,
            error: text(&error),
            tier,
        },
        Entry::Tamper { what, detail } => Entry::Tamper {
            what: text(&what),
            detail: text(&detail),
        },
        Entry::Check {
            name,
            status,
            detail,
            since_seq,
            until_seq,
        } => Entry::Check {
            name: text(&name),
            status: text(&status),
            detail: text(&detail),
            since_seq,
            until_seq,
        },
        Entry::Passthrough {
            host,
            port,
            tier,
            bytes_in,
            bytes_out,
            duration_ms,
            reason,
            dst,
        } => Entry::Passthrough {
            host: text(&host),
            port,
            tier,
            bytes_in,
            bytes_out,
            duration_ms,
            reason: text(&reason),
            dst: dst.map(|d| text(&d)),
        },
        Entry::Blocked {
            host,
            port,
            tier,
            method,
            path,
            reason,
            dst,
        } => Entry::Blocked {
            host: text(&host),
            port,
            tier,
            method: method.map(|m| text(&m)),
            path: path.map(|p| url(&p)),
            reason: text(&reason),
            dst: dst.map(|d| text(&d)),
        },
        Entry::UpstreamError {
            service,
            host,
            method,
            path,
            upstream,
            status,
            error,
            tier,
            duration_ms,
        } => Entry::UpstreamError {
            service: text(&service),
            host: text(&host),
            method: text(&method),
            path: url(&path),
            upstream: url(&upstream),
            status,
            error: text(&error),
            tier,
            duration_ms,
        },
        Entry::TrustFailure {
            host,
            port,
            tier,
            service,
            alert,
        } => Entry::TrustFailure {
            host: text(&host),
            port,
            tier,
            service: service.map(|s| text(&s)),
            alert: text(&alert),
        },
        Entry::Quic {
            host,
            dst,
            attempts,
        } => Entry::Quic {
            host: host.map(|h| text(&h)),
            dst: text(&dst),
            attempts,
        },
        Entry::Ech {
            host,
            port,
            tier,
            dst,
        } => Entry::Ech {
            host: text(&host),
            port,
            tier,
            dst: dst.map(|d| text(&d)),
        },
        Entry::RedirectChange { detail } => Entry::RedirectChange {
            detail: text(&detail),
        },
        drops @ Entry::UdpDropped { .. } => drops,
        Entry::Dns { name, qtype } => Entry::Dns {
            name: text(&name),
            qtype,
        },
        // Hex digests and a fixed vocabulary: nothing to redact, and
        // rewriting a signature would break it.
        seal @ Entry::Seal { .. } => seal,
    }
}

/// A URL or path that may still carry a query: the query part is redacted
/// with [`query`], the rest with [`text`].
pub fn url(s: &str) -> String {
    match s.split_once('?') {
        Some((base, q)) => format!("{}?{}", text(base), query(q)),
        None => text(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_headers_are_redacted_whole() {
        for name in [
            "Authorization",
            "authorization",
            "Proxy-Authorization",
            "Cookie",
            "Set-Cookie",
            "X-Api-Key",
            "api-key",
            "Stripe-Signature",
            "X-Custom-Token",
            "X-Client-Secret",
        ] {
            assert_eq!(header_value(name, "Basic dXNlcjpwYXNz"), REDACTED, "{name}");
        }
    }

    #[test]
    fn ordinary_headers_are_kept_but_scanned() {
        assert_eq!(header_value("Idempotency-Key", "abc-123"), "abc-123");
        assert_eq!(
            header_value("Content-Type", "application/json"),
            "application/json"
        );
        assert_eq!(header_value("Stripe-Account", "acct_1ABC"), "acct_1ABC");
        assert_eq!(
            header_value("X-Debug", "key=sk_test_4eC39HqLyjWDarjtT1zdp7dc"),
            "key=[redacted]"
        );
    }

    #[test]
    fn query_params_named_like_secrets_are_redacted() {
        assert_eq!(
            query("api_key=abc&limit=3&access_token=xyz&client_secret=s&password=p"),
            "api_key=[redacted]&limit=3&access_token=[redacted]&client_secret=[redacted]&password=[redacted]"
        );
        assert_eq!(
            query("apiKey=1&key=2&X-Amz-Signature=3&sig=4"),
            "apiKey=[redacted]&key=[redacted]&X-Amz-Signature=[redacted]&sig=[redacted]"
        );
        assert_eq!(query("code=4%2F0Ab&state=xyz"), "code=[redacted]&state=xyz");
        assert_eq!(query("api%5Fkey=abc"), "api%5Fkey=[redacted]");
        assert_eq!(query("auth=abc&authuser=0"), "auth=[redacted]&authuser=0");
    }

    #[test]
    fn query_keeps_ordinary_params_and_scans_values() {
        assert_eq!(
            query("customer=cus_123&expand[]=data"),
            "customer=cus_123&expand[]=data"
        );
        assert_eq!(query("q=sk_live_51HqLyjWDarjtT1zdp7dc"), "q=[redacted]");
        assert_eq!(query("a&&b="), "a&&b=");
        assert_eq!(query(""), "");
    }

    #[test]
    fn form_bodies_go_through_query() {
        assert_eq!(
            query("amount=2000&currency=usd&source=tok_visa&customer=cus_123&client_secret=pi_123_secret_abc"),
            "amount=2000&currency=usd&source=tok_visa&customer=cus_123&client_secret=[redacted]"
        );
        assert_eq!(
            query("grant_type=refresh_token&refresh_token=1//0gabc&client_id=123.apps"),
            "grant_type=refresh_token&refresh_token=[redacted]&client_id=123.apps"
        );
    }

    #[test]
    fn stripe_key_shapes_are_redacted_anywhere() {
        assert_eq!(text("sk_live_51HqLyjWDarjtT1zdp7dc"), REDACTED);
        assert_eq!(
            text("{\"key\":\"sk_test_4eC39HqLyjWDarjtT1zdp7dc\",\"id\":\"ch_3Mx\"}"),
            "{\"key\":\"[redacted]\",\"id\":\"ch_3Mx\"}"
        );
        assert_eq!(
            text("rk_live_abcdef123 and rk_test_abcdef123"),
            "[redacted] and [redacted]"
        );
        assert_eq!(text("whsec_abcdef123456"), REDACTED);
        assert_eq!(
            text("/v1/keys/sk_test_abcdef12/roll"),
            "/v1/keys/[redacted]/roll"
        );
    }

    #[test]
    fn ordinary_ids_are_not_redacted() {
        for s in [
            "cus_123",
            "ch_3MmlLrLkdIwHu7ix0snN0B15",
            "pk_test_TYooMQauvdEDq54NiTphI7jx",
            "task_live_abcdefgh",
            "/v1/customers/cus_NffrFeUfNV2Hib/sources",
            "sk_test_",
            "disk_test_abcdefgh",
        ] {
            assert_eq!(text(s), s);
        }
    }

    #[test]
    fn bearer_tokens_are_redacted() {
        assert_eq!(text("Bearer abc.def-ghi_jkl"), "Bearer [redacted]");
        assert_eq!(
            text("auth: bearer eyJhbGciOi+/=="),
            "auth: bearer [redacted]"
        );
        assert_eq!(text("Bearer [redacted]"), "Bearer [redacted]");
    }

    #[test]
    fn other_token_shapes_are_redacted() {
        assert_eq!(text("ghp_0123456789abcdefghijABCDEFGHIJ"), REDACTED);
        assert_eq!(text("xoxb-1234567890-abcdef"), REDACTED);
        assert_eq!(text("ya29.a0AfH6SMBx0123456789abcdef"), REDACTED);
        assert_eq!(text("AIzaSyA1234567890abcdefghijklmnopqrstu"), REDACTED);
    }

    #[test]
    fn url_passwords_are_redacted() {
        assert_eq!(
            text("https://user:hunter2@twin.example/s/x"),
            "https://user:[redacted]@twin.example/s/x"
        );
        assert_eq!(text("https://twin.example/a@b"), "https://twin.example/a@b");
        assert_eq!(text("http://user@host/"), "http://user@host/");
    }

    #[test]
    fn url_redacts_query_and_path() {
        assert_eq!(
            url("https://twin/s/sbx/stripe/v1/charges?api_key=x&limit=2"),
            "https://twin/s/sbx/stripe/v1/charges?api_key=[redacted]&limit=2"
        );
    }

    #[test]
    fn redaction_is_idempotent() {
        for s in [
            "Bearer abc",
            "sk_live_abcdefgh",
            "https://u:p@h/",
            "token=abc&x=sk_test_abcdefgh",
        ] {
            let once = text(&query(s));
            assert_eq!(text(&query(&once)), once);
        }
    }
}
