//! Route matching (DESIGN §3): which service, if any, owns a (host, path).
//!
//! Hosts are lower-cased and stripped of their port. A pattern is an exact host
//! or one leading `*.`; `*.stripe.com` also matches `stripe.com`. Exact beats
//! wildcard and, among wildcards, the longer suffix wins. Within the chosen host
//! a service's `paths` narrow it to prefixes on a segment boundary; the longest
//! prefix wins and a service without `paths` claims the rest of the host. A more
//! specific host that has no claim for the path falls back to the next host
//! pattern. Loopback names and literals always pass through. This module is pure:
//! no I/O, so every rule has a unit test below.

use std::collections::HashMap;

use crate::canary::{CANARY_HOST, CANARY_PATH};
use veris_host::{is_loopback, Host};

/// A service as routing sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub name: String,
    /// Base URL the request path is appended to (no trailing slash).
    pub upstream: String,
}

/// A host pattern from a config: exact host or `*.suffix`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    Exact(String),
    /// The suffix after `*.`, e.g. `stripe.com`.
    Wildcard(String),
}

impl HostPattern {
    /// Parses a pattern; `*` is allowed only as one leading `*.`.
    pub fn parse(raw: &str) -> Result<HostPattern, String> {
        let lower = raw.trim().to_ascii_lowercase();
        let (wild, rest) = match lower.strip_prefix("*.") {
            Some(rest) => (true, rest.to_string()),
            None => (false, lower.clone()),
        };
        if rest.is_empty() {
            return Err(format!("host pattern {raw:?} is empty"));
        }
        if rest.contains('*') {
            return Err(format!(
                "host pattern {raw:?}: `*` is only allowed as a single leading `*.`"
            ));
        }
        if rest.contains(['/', ':', ' ']) || rest.starts_with('.') || rest.ends_with('.') {
            return Err(format!(
                "host pattern {raw:?} must be a bare host name (no scheme, port, path or stray dots)"
            ));
        }
        Ok(if wild {
            HostPattern::Wildcard(rest)
        } else {
            HostPattern::Exact(rest)
        })
    }
}

impl std::fmt::Display for HostPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostPattern::Exact(h) => f.write_str(h),
            HostPattern::Wildcard(s) => write!(f, "*.{s}"),
        }
    }
}

/// One claim: service `service` owns `host` (and `prefixes`, or the whole host when empty).
#[derive(Debug, Clone)]
pub struct Claim {
    pub service: String,
    pub host: HostPattern,
    pub prefixes: Vec<String>,
}

/// Why a host was let through or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    /// A vendor service: terminate TLS and forward to its twin upstream.
    Service(&'a Service),
    /// The reserved canary host or path: the proxy answers itself.
    Canary,
    /// Loopback names and literals: always tunneled, never intercepted.
    Loopback,
    /// Listed in `allow_passthrough`.
    Allowed,
    /// Nobody claims it: tunneled in passthrough mode, refused in strict mode.
    Unmapped,
}

#[derive(Debug, Default)]
struct HostClaims {
    /// (prefix, service index), longest prefix first.
    prefixes: Vec<(String, usize)>,
    whole: Option<usize>,
}

/// Why a routing table could not be built: the field of the config it
/// concerns, what is wrong with it and how to fix it (the config reports
/// it as one of its own errors).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}. Next: {fix}")]
pub struct RouteError {
    pub field: String,
    pub message: String,
    pub fix: String,
}

/// The routing table, built once from validated claims.
#[derive(Debug)]
pub struct Router {
    services: Vec<Service>,
    exact: HashMap<String, HostClaims>,
    /// (suffix, claims), longest suffix first.
    wildcard: Vec<(String, HostClaims)>,
    allow_exact: Vec<String>,
    allow_wildcard: Vec<String>,
}

impl Router {
    /// Builds the table. Two services claiming the same (host, prefix) is an error naming both.
    pub fn new(
        services: Vec<Service>,
        claims: Vec<Claim>,
        allow_passthrough: &[HostPattern],
    ) -> Result<Router, RouteError> {
        let mut exact: HashMap<String, HostClaims> = HashMap::new();
        let mut wildcard: HashMap<String, HostClaims> = HashMap::new();
        for claim in claims {
            let idx = services
                .iter()
                .position(|s| s.name == claim.service)
                .ok_or_else(|| RouteError {
                    field: "services".into(),
                    message: format!("claim for unknown service {:?}", claim.service),
                    fix: "declare the service before routing hosts to it".into(),
                })?;
            let entry = match &claim.host {
                HostPattern::Exact(h) => exact.entry(h.clone()).or_default(),
                HostPattern::Wildcard(s) => wildcard.entry(s.clone()).or_default(),
            };
            let duplicate = |other: usize, what: String| RouteError {
                field: "services".into(),
                message: format!(
                    "services {:?} and {:?} both claim {}",
                    services[other].name, claim.service, what
                ),
                fix: "give each (host, path prefix) to exactly one service".into(),
            };
            if claim.prefixes.is_empty() {
                if let Some(other) = entry.whole {
                    if other != idx {
                        return Err(duplicate(other, format!("the whole host {}", claim.host)));
                    }
                }
                entry.whole = Some(idx);
            }
            for prefix in &claim.prefixes {
                let prefix = normalize_prefix(prefix).map_err(|message| RouteError {
                    field: format!("services[{}].paths", claim.service),
                    message,
                    fix: "write path prefixes like \"/calendar/v3\"".into(),
                })?;
                if prefix == "/" {
                    if let Some(other) = entry.whole.filter(|&o| o != idx) {
                        return Err(duplicate(other, format!("the whole host {}", claim.host)));
                    }
                    entry.whole = Some(idx);
                    continue;
                }
                if let Some((_, other)) = entry.prefixes.iter().find(|(p, _)| *p == prefix) {
                    if *other != idx {
                        return Err(duplicate(*other, format!("{}{prefix}", claim.host)));
                    }
                    continue;
                }
                entry.prefixes.push((prefix, idx));
            }
            entry.prefixes.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
        }
        let mut wildcard: Vec<(String, HostClaims)> = wildcard.into_iter().collect();
        wildcard.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        let mut allow_exact = Vec::new();
        let mut allow_wildcard = Vec::new();
        for p in allow_passthrough {
            match p {
                HostPattern::Exact(h) => allow_exact.push(h.clone()),
                HostPattern::Wildcard(s) => allow_wildcard.push(s.clone()),
            }
        }
        Ok(Router {
            services,
            exact,
            wildcard,
            allow_exact,
            allow_wildcard,
        })
    }

    /// Every service, in declaration order.
    pub fn services(&self) -> &[Service] {
        &self.services
    }

    /// The position in [`Router::services`] of `service`, a reference this
    /// router returned (compared by address: no string is hashed).
    pub fn index_of(&self, service: &Service) -> Option<usize> {
        self.services.iter().position(|s| std::ptr::eq(s, service))
    }

    /// Every host pattern a service claims, exact names first (`api.stripe.com`, then
    /// `*.stripe.com`): what a `NO_PROXY` list must not exempt.
    pub fn routed_hosts(&self) -> Vec<String> {
        let mut exact: Vec<String> = self.exact.keys().cloned().collect();
        exact.sort();
        exact.extend(self.wildcard.iter().map(|(s, _)| format!("*.{s}")));
        exact
    }

    /// Decides a request: `host` may carry a port and any case; `path` has no query.
    pub fn route(&self, host: &str, path: &str) -> Route<'_> {
        let host = Host::new(host).into_string();
        if path == CANARY_PATH || path.starts_with("/__veris/canary?") {
            return Route::Canary;
        }
        self.route_host(&host, Some(path))
    }

    /// Decides a connection before any request is seen (CONNECT, SNI): a host
    /// that any service claims, for any path, is a `Service` (the first claimant).
    pub fn route_connection(&self, host: &str) -> Route<'_> {
        self.route_host(&Host::new(host).into_string(), None)
    }

    fn route_host(&self, host: &str, path: Option<&str>) -> Route<'_> {
        if host == CANARY_HOST {
            return Route::Canary;
        }
        if is_loopback(host) {
            return Route::Loopback;
        }
        for claims in self.candidates(host) {
            let found = match path {
                Some(path) => claims
                    .prefixes
                    .iter()
                    .find(|(p, _)| on_segment_boundary(path, p))
                    .map(|(_, i)| *i)
                    .or(claims.whole),
                None => claims
                    .whole
                    .or_else(|| claims.prefixes.first().map(|(_, i)| *i)),
            };
            if let Some(i) = found {
                return Route::Service(&self.services[i]);
            }
        }
        if self.allow_exact.iter().any(|h| h == host)
            || self.allow_wildcard.iter().any(|s| suffix_match(host, s))
        {
            return Route::Allowed;
        }
        Route::Unmapped
    }

    /// Host claims in specificity order: exact first, then wildcards by suffix length.
    fn candidates<'a>(&'a self, host: &'a str) -> impl Iterator<Item = &'a HostClaims> + 'a {
        self.exact.get(host).into_iter().chain(
            self.wildcard
                .iter()
                .filter(move |(s, _)| suffix_match(host, s))
                .map(|(_, c)| c),
        )
    }
}

fn suffix_match(host: &str, suffix: &str) -> bool {
    host == suffix
        || (host.len() > suffix.len()
            && host.ends_with(suffix)
            && host.as_bytes()[host.len() - suffix.len() - 1] == b'.')
}

fn on_segment_boundary(path: &str, prefix: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/') || prefix.ends_with('/'),
        None => false,
    }
}

fn normalize_prefix(raw: &str) -> Result<String, String> {
    if !raw.starts_with('/') {
        return Err(format!("path prefix {raw:?} must start with '/'"));
    }
    if raw.contains(['?', '#', '*']) {
        return Err(format!(
            "path prefix {raw:?} must be a plain path (no query, fragment or wildcard)"
        ));
    }
    let trimmed = raw.trim_end_matches('/');
    Ok(if trimmed.is_empty() {
        "/".to_string()
    } else {
        trimmed.to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str) -> Service {
        Service {
            name: name.into(),
            upstream: format!("http://twin/s/sbx/{name}"),
        }
    }

    fn claim(service: &str, host: &str, prefixes: &[&str]) -> Claim {
        Claim {
            service: service.into(),
            host: HostPattern::parse(host).unwrap(),
            prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
        }
    }

    fn router(claims: Vec<Claim>) -> Router {
        let mut names: Vec<String> = claims.iter().map(|c| c.service.clone()).collect();
        names.dedup();
        let mut services: Vec<Service> = Vec::new();
        for n in names {
            if !services.iter().any(|s| s.name == n) {
                services.push(svc(&n));
            }
        }
        Router::new(services, claims, &[]).unwrap()
    }

    fn name(r: Route<'_>) -> String {
        match r {
            Route::Service(s) => s.name.clone(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn exact_beats_wildcard_and_longer_suffix_wins() {
        let r = router(vec![
            claim("wide", "*.example.com", &[]),
            claim("narrow", "*.api.example.com", &[]),
            claim("exact", "v1.api.example.com", &[]),
        ]);
        assert_eq!(name(r.route("v1.api.example.com", "/")), "exact");
        assert_eq!(name(r.route("v2.api.example.com", "/")), "narrow");
        assert_eq!(name(r.route("api.example.com", "/")), "narrow");
        assert_eq!(name(r.route("www.example.com", "/")), "wide");
        assert_eq!(name(r.route("example.com", "/x")), "wide");
        assert_eq!(name(r.route("badexample.com", "/")), "Unmapped");
        assert_eq!(name(r.route("example.org", "/")), "Unmapped");
    }

    #[test]
    fn host_is_lowercased_and_port_stripped() {
        let r = router(vec![claim("stripe", "api.stripe.com", &[])]);
        assert_eq!(name(r.route("API.Stripe.COM:443", "/v1")), "stripe");
        assert_eq!(name(r.route("api.stripe.com.", "/v1")), "stripe");
    }

    #[test]
    fn prefixes_respect_segment_boundaries_and_longest_wins() {
        let r = router(vec![
            claim("calendar", "www.googleapis.com", &["/calendar/v3"]),
            claim(
                "drive",
                "www.googleapis.com",
                &["/drive/v3", "/upload/drive/v3/files"],
            ),
            claim("deep", "www.googleapis.com", &["/calendar/v3/special"]),
        ]);
        assert_eq!(
            name(r.route("www.googleapis.com", "/calendar/v3")),
            "calendar"
        );
        assert_eq!(
            name(r.route("www.googleapis.com", "/calendar/v3/x")),
            "calendar"
        );
        assert_eq!(
            name(r.route("www.googleapis.com", "/calendar/v3x")),
            "Unmapped"
        );
        assert_eq!(
            name(r.route("www.googleapis.com", "/calendar/v3/special/1")),
            "deep"
        );
        assert_eq!(
            name(r.route("www.googleapis.com", "/calendar/v3/specialx")),
            "calendar"
        );
        assert_eq!(
            name(r.route("www.googleapis.com", "/drive/v3/files")),
            "drive"
        );
        assert_eq!(
            name(r.route("www.googleapis.com", "/upload/drive/v3/files")),
            "drive"
        );
        assert_eq!(
            name(r.route("www.googleapis.com", "/youtube/v3")),
            "Unmapped"
        );
    }

    #[test]
    fn whole_host_service_loses_to_explicit_prefix() {
        let r = router(vec![
            claim("generic", "www.googleapis.com", &[]),
            claim("calendar", "www.googleapis.com", &["/calendar/v3"]),
        ]);
        assert_eq!(
            name(r.route("www.googleapis.com", "/calendar/v3/a")),
            "calendar"
        );
        assert_eq!(name(r.route("www.googleapis.com", "/other")), "generic");
    }

    #[test]
    fn host_specificity_outranks_prefix_length_but_falls_back() {
        let r = router(vec![
            claim("wild", "*.googleapis.com", &["/calendar/v3/very/long"]),
            claim("exact", "www.googleapis.com", &["/calendar"]),
        ]);
        assert_eq!(
            name(r.route("www.googleapis.com", "/calendar/v3/very/long/x")),
            "exact"
        );
        // The exact host has no claim for this path: the wildcard may take it.
        let r = router(vec![
            claim("wild", "*.googleapis.com", &[]),
            claim("exact", "www.googleapis.com", &["/calendar/v3"]),
        ]);
        assert_eq!(name(r.route("www.googleapis.com", "/drive")), "wild");
        assert_eq!(name(r.route("www.googleapis.com", "/calendar/v3")), "exact");
    }

    #[test]
    fn loopback_always_passes_through() {
        let r = router(vec![
            claim("greedy", "*.localhost", &[]),
            claim("greedy2", "localhost", &[]),
        ]);
        for h in [
            "localhost",
            "a.localhost",
            "127.0.0.1",
            "127.1.2.3:80",
            "[::1]:443",
            "::1",
        ] {
            assert_eq!(r.route(h, "/"), Route::Loopback, "{h}");
            assert_eq!(r.route_connection(h), Route::Loopback, "{h}");
        }
        assert_eq!(r.route("128.0.0.1", "/"), Route::Unmapped);
    }

    #[test]
    fn canary_host_and_path() {
        let r = router(vec![claim("stripe", "api.stripe.com", &[])]);
        assert_eq!(r.route(CANARY_HOST, "/anything"), Route::Canary);
        assert_eq!(
            r.route_connection("CANARY.veris.internal:443"),
            Route::Canary
        );
        assert_eq!(r.route("api.stripe.com", CANARY_PATH), Route::Canary);
        assert_eq!(r.route("example.org", CANARY_PATH), Route::Canary);
    }

    #[test]
    fn connection_routing_claims_hosts_with_only_prefixes() {
        let r = router(vec![claim(
            "calendar",
            "www.googleapis.com",
            &["/calendar/v3"],
        )]);
        assert_eq!(
            name(r.route_connection("www.googleapis.com:443")),
            "calendar"
        );
        assert_eq!(r.route_connection("gmail.googleapis.com"), Route::Unmapped);
    }

    #[test]
    fn allow_passthrough_patterns() {
        let allow = [
            HostPattern::parse("pypi.org").unwrap(),
            HostPattern::parse("*.crates.io").unwrap(),
        ];
        let r = Router::new(vec![], vec![], &allow).unwrap();
        assert_eq!(r.route_connection("pypi.org"), Route::Allowed);
        assert_eq!(r.route_connection("files.pypi.org"), Route::Unmapped);
        assert_eq!(r.route_connection("crates.io"), Route::Allowed);
        assert_eq!(r.route_connection("index.crates.io"), Route::Allowed);
    }

    #[test]
    fn duplicate_claims_name_both_services() {
        let services = vec![svc("a"), svc("b")];
        let err = Router::new(
            services.clone(),
            vec![
                claim("a", "x.com", &["/v1"]),
                claim("b", "x.com", &["/v1/"]),
            ],
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("\"a\"") && err.contains("\"b\"") && err.contains("x.com/v1"),
            "{err}"
        );
        let err = Router::new(
            services,
            vec![claim("a", "*.x.com", &[]), claim("b", "*.x.com", &[])],
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("whole host *.x.com"), "{err}");
    }

    #[test]
    fn host_pattern_validation() {
        assert!(HostPattern::parse("*.stripe.com").is_ok());
        assert!(HostPattern::parse("a.*.com").is_err());
        assert!(HostPattern::parse("**.com").is_err());
        assert!(HostPattern::parse("*").is_err());
        assert!(HostPattern::parse("https://x.com").is_err());
        assert!(HostPattern::parse("x.com:443").is_err());
        assert_eq!(
            HostPattern::parse("API.Stripe.com").unwrap(),
            HostPattern::Exact("api.stripe.com".into())
        );
    }

    #[test]
    fn prefix_validation() {
        assert_eq!(normalize_prefix("/a/b/").unwrap(), "/a/b");
        assert_eq!(normalize_prefix("/").unwrap(), "/");
        assert!(normalize_prefix("a").is_err());
        assert!(normalize_prefix("/a?b").is_err());
    }
}
