//! A host as veris compares it: the one rule every crate normalizes by
//! (routing, leaf certificates, the DNS stub, receipts), so a name a client
//! sent, a config named and a ledger line holds compare equal when, and
//! only when, they mean the same host.
//!
//! The rule, in order:
//! 1. Surrounding whitespace goes.
//! 2. A port goes: `[v6]:port` keeps the bracketed part, `name:port` (one
//!    colon) the name. A bare IPv6 literal (two or more colons) has none.
//! 3. Brackets come off an IPv6 literal only. `[:x.localhost]` is neither a
//!    name nor an address and stays as written: it routes nowhere, where
//!    `:x.localhost` would read as a name under `localhost` (loopback).
//! 4. An address literal is written as `IpAddr` writes it (`2001:DB8:0::1`
//!    is `2001:db8::1`).
//! 5. Trailing dots (the DNS root; `api.stripe.com.` is `api.stripe.com`)
//!    and whitespace before them go, and ASCII letters are lower-cased.
//!
//! The rule is idempotent: a host normalized twice is the host normalized
//! once (the proxy normalizes a leg's host, and routing does it again).

#![forbid(unsafe_code)]

use std::fmt;
use std::net::IpAddr;

/// A normalized host: a lower-case name or an address literal, with no
/// port, no brackets and no trailing dot.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Host(String);

impl Host {
    /// `raw` by the rule above: a `Host` header, an authority, an SNI, a
    /// config's host or a user's `--require-host`.
    pub fn new(raw: &str) -> Host {
        let raw = raw.trim();
        let bare = if raw.starts_with('[') {
            match raw.find(']') {
                Some(end) => match raw[1..end].parse::<std::net::Ipv6Addr>() {
                    Ok(ip) => return Host(ip.to_string()),
                    // Up to and including the closing bracket; a port after it goes.
                    Err(_) => &raw[..=end],
                },
                // No closing bracket: not an address, kept as written.
                None => raw,
            }
        } else if raw.matches(':').count() == 1 {
            raw.split(':').next().unwrap_or(raw)
        } else {
            raw
        };
        let bare = bare.trim_end_matches(|c: char| c == '.' || c.is_whitespace());
        match bare.parse::<IpAddr>() {
            Ok(ip) => Host(ip.to_string()),
            Err(_) => Host(bare.to_ascii_lowercase()),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }

    /// The address, when the host is a literal.
    pub fn ip(&self) -> Option<IpAddr> {
        self.0.parse().ok()
    }

    /// `localhost`, a name under it (RFC 6761 §6.3), or a loopback literal.
    pub fn is_loopback(&self) -> bool {
        is_loopback(&self.0)
    }
}

/// [`Host::is_loopback`] for a host already normalized.
pub fn is_loopback(host: &str) -> bool {
    is_localhost(host) || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// `localhost` or a name under it, which resolve to loopback (RFC 6761
/// §6.3), for a name already normalized.
pub fn is_localhost(name: &str) -> bool {
    name == "localhost" || name.ends_with(".localhost")
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Host {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<Host> for String {
    fn from(h: Host) -> String {
        h.0
    }
}

impl PartialEq<str> for Host {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for Host {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_form_of_a_host_is_written_one_way() {
        for (raw, host) in [
            ("Example.COM:8443", "example.com"),
            ("api.stripe.com.", "api.stripe.com"),
            ("API.Stripe.com.:443", "api.stripe.com"),
            ("  api.stripe.com  ", "api.stripe.com"),
            ("[2001:DB8:0::1]:443", "2001:db8::1"),
            ("[2001:db8::1]", "2001:db8::1"),
            ("2001:DB8::1", "2001:db8::1"),
            ("203.0.113.9:80", "203.0.113.9"),
            ("[::1]:443", "::1"),
            ("[fe80::1%25eth0]:443", "[fe80::1%25eth0]"),
            ("[:51.localhost]:99", "[:51.localhost]"),
            ("[x", "[x"),
        ] {
            assert_eq!(Host::new(raw), host, "{raw:?}");
        }
    }

    /// Found by the connect_target fuzz target: `CONNECT [:51.localhost]:99`
    /// was `:51.localhost` to the dialer (loopback) and, normalized a second
    /// time by routing, the empty name (unmapped, so passed through by mode
    /// rather than as loopback).
    #[test]
    fn the_rule_is_idempotent_and_brackets_only_come_off_addresses() {
        for raw in [
            "[:51.localhost]:99",
            "[:api.stripe.com]",
            "[x",
            "[::1.]",
            "[::1.",
            "[fe80::1%25eth0]:443",
            "a :80",
            "A.B.:1",
            "x. .",
            ":51.localhost",
            "[2001:db8::1]:443",
            "2001:DB8:0::1",
            "::FFFF:10.0.0.1",
        ] {
            let once = Host::new(raw);
            assert_eq!(Host::new(once.as_str()), once, "{raw:?}");
        }
        assert!(!Host::new("[:51.localhost]:99").is_loopback());
    }

    #[test]
    fn loopback_is_localhost_names_and_loopback_literals() {
        for h in [
            "localhost",
            "LOCALHOST.",
            "a.localhost:80",
            "127.0.0.2",
            "[::1]:8080",
        ] {
            assert!(Host::new(h).is_loopback(), "{h}");
        }
        for h in [
            "localhost.example",
            "mylocalhost",
            "10.0.0.1",
            "[:x.localhost]",
        ] {
            assert!(!Host::new(h).is_loopback(), "{h}");
        }
    }
}
