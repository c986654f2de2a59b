//! Proxy configuration (DESIGN §3): the JSON file format and the flag form
//! (`--twin --sandbox --services --route`), both validated into [`Settings`].
//! Every error names the field and says how to fix it.

use std::path::PathBuf;

use serde::Deserialize;
use veris_receipt::Mode;

use crate::catalog;
use crate::request::route::{Claim, HostPattern, RouteError, Router, Service};

/// Default explicit-tier listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{source_name}: {message}. Next: fix the JSON (see README \"Config file\")")]
    Parse {
        source_name: String,
        message: String,
    },
    #[error("{field}: {message}. Next: {fix}")]
    Invalid {
        field: String,
        message: String,
        fix: String,
    },
    /// An error in a file: its name, then the error. The inner error is
    /// part of this message and deliberately not a `source()`, or a report
    /// that prints the chain (`{:#}`) would print it twice.
    #[error("{source_name}: {inner}")]
    InFile {
        source_name: String,
        inner: Box<ConfigError>,
    },
}

impl From<RouteError> for ConfigError {
    fn from(e: RouteError) -> ConfigError {
        ConfigError::Invalid {
            field: e.field,
            message: e.message,
            fix: e.fix,
        }
    }
}

fn invalid(
    field: impl Into<String>,
    message: impl Into<String>,
    fix: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        message: message.into(),
        fix: fix.into(),
    }
}

/// The config file as written (`version: 1`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub version: u32,
    #[serde(default)]
    pub listen: Option<String>,
    pub sandbox_id: String,
    #[serde(default)]
    pub mode: Option<Mode>,
    #[serde(default)]
    pub ca_dir: Option<PathBuf>,
    #[serde(default)]
    pub upstream: Option<UpstreamFile>,
    #[serde(default)]
    pub services: Vec<ServiceFile>,
    #[serde(default)]
    pub allow_passthrough: Vec<String>,
    #[serde(default)]
    pub canary_token: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamFile {
    pub base_url: String,
    #[serde(default)]
    pub auth_value_env: Option<String>,
    #[serde(default)]
    pub insecure_skip_verify: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceFile {
    pub name: String,
    pub hosts: Vec<String>,
    #[serde(default)]
    pub paths: Option<Vec<String>>,
    #[serde(default)]
    pub upstream: Option<String>,
}

/// Validated settings the proxy runs with.
#[derive(Debug)]
pub struct Settings {
    pub listen: String,
    pub sandbox_id: String,
    pub mode: Mode,
    pub ca_dir: Option<PathBuf>,
    /// Twin base URL (`{base}/s/{sandbox}/{service}` per service).
    pub twin_base: String,
    /// Name of the env var holding the bearer value for the twin (read by the binary).
    pub auth_value_env: Option<String>,
    pub insecure_skip_verify: bool,
    pub router: Router,
    pub canary_token: Option<String>,
}

impl Settings {
    /// Parses and validates a config file's text; `source_name` (the path) prefixes every error.
    pub fn from_json(text: &str, source_name: &str) -> Result<Settings, ConfigError> {
        Settings::from_json_with(text, source_name, Overrides::default())
    }

    /// [`Settings::from_json`], with flags overriding the file's fields.
    pub fn from_json_with(
        text: &str,
        source_name: &str,
        overrides: Overrides<'_>,
    ) -> Result<Settings, ConfigError> {
        let mut file: ConfigFile = serde_json::from_str(text).map_err(|e| ConfigError::Parse {
            source_name: source_name.to_string(),
            message: e.to_string(),
        })?;
        // A flag's value is checked under the flag's name, before the file's
        // name prefixes the rest.
        if let Some(listen) = overrides.listen {
            validate_listen("--listen", listen)?;
            file.listen = Some(listen.to_string());
        }
        if let Some(sandbox) = overrides.sandbox_id {
            validate_sandbox("--sandbox", sandbox)?;
            file.sandbox_id = sandbox.to_string();
        }
        if let Some(mode) = overrides.mode {
            file.mode = Some(mode);
        }
        if let Some(allow) = overrides.allow_passthrough {
            parse_allow(allow)?;
            file.allow_passthrough = allow.to_vec();
        }
        Settings::from_file(file).map_err(|inner| ConfigError::InFile {
            source_name: source_name.to_string(),
            inner: Box::new(inner),
        })
    }

    fn from_file(file: ConfigFile) -> Result<Settings, ConfigError> {
        if file.version != 1 {
            return Err(invalid(
                "version",
                format!("unsupported version {}", file.version),
                "set \"version\": 1",
            ));
        }
        let listen = file.listen.unwrap_or_else(|| DEFAULT_LISTEN.to_string());
        validate_listen("listen", &listen)?;
        validate_sandbox("sandbox_id", &file.sandbox_id)?;
        let upstream = file.upstream.ok_or_else(|| {
            invalid(
                "upstream",
                "missing",
                "add \"upstream\": {\"base_url\": \"http://127.0.0.1:PORT\"} pointing at the twin",
            )
        })?;
        let twin_base = validate_base_url("upstream.base_url", &upstream.base_url)?;
        if file.services.is_empty() {
            return Err(invalid(
                "services",
                "no services",
                "list at least one {\"name\", \"hosts\"} entry",
            ));
        }
        let mut services = Vec::new();
        let mut claims = Vec::new();
        for (i, s) in file.services.iter().enumerate() {
            let field = format!("services[{i}]");
            validate_service_name(&format!("{field}.name"), &s.name)?;
            if services.iter().any(|x: &Service| x.name == s.name) {
                return Err(invalid(
                    format!("{field}.name"),
                    format!("service {:?} is declared twice", s.name),
                    "merge the two entries",
                ));
            }
            if s.hosts.is_empty() {
                return Err(invalid(
                    format!("{field}.hosts"),
                    "empty",
                    "list the vendor host names the service answers, e.g. [\"api.stripe.com\"]",
                ));
            }
            let upstream = match &s.upstream {
                Some(u) => validate_base_url(&format!("{field}.upstream"), u)?,
                None => format!("{twin_base}/s/{}/{}", file.sandbox_id, s.name),
            };
            services.push(Service {
                name: s.name.clone(),
                upstream,
            });
            if let Some(paths) = &s.paths {
                if paths.is_empty() {
                    return Err(invalid(
                        format!("{field}.paths"),
                        "empty list",
                        "omit \"paths\" to claim the whole host, or list prefixes",
                    ));
                }
            }
            for h in &s.hosts {
                let host = HostPattern::parse(h).map_err(|m| {
                    invalid(
                        format!("{field}.hosts"),
                        m,
                        "write hosts like \"api.stripe.com\" or \"*.stripe.com\"",
                    )
                })?;
                claims.push(Claim {
                    service: s.name.clone(),
                    host,
                    prefixes: s.paths.clone().unwrap_or_default(),
                });
            }
        }
        let allow = parse_allow(&file.allow_passthrough)?;
        let router = Router::new(services, claims, &allow)?;
        if let Some(token) = &file.canary_token {
            validate_canary(token)?;
        }
        Ok(Settings {
            listen,
            sandbox_id: file.sandbox_id,
            mode: file.mode.unwrap_or(Mode::Passthrough),
            ca_dir: file.ca_dir,
            twin_base,
            auth_value_env: upstream.auth_value_env,
            insecure_skip_verify: upstream.insecure_skip_verify,
            router,
            canary_token: file.canary_token,
        })
    }

    /// Settings from flags: catalog services (`--services a,b`, empty = the whole
    /// catalog) plus `--route SERVICE=HOST[/PREFIX]` claims, which add to the
    /// catalog: a route for a host and prefix a catalog service claims takes
    /// that claim over (a route without a prefix takes over the catalog's
    /// whole-host claim on that host; the catalog's other prefixes stay).
    pub fn from_flags(flags: Flags<'_>) -> Result<Settings, ConfigError> {
        validate_listen("--listen", flags.listen)?;
        validate_sandbox("--sandbox", flags.sandbox_id)?;
        let twin_base = validate_base_url("--twin", flags.twin)?;
        let mut services: Vec<Service> = Vec::new();
        let mut catalog_claims = Vec::new();
        let add = |name: &str, services: &mut Vec<Service>| {
            if !services.iter().any(|s| s.name == name) {
                services.push(Service {
                    name: name.to_string(),
                    upstream: format!("{twin_base}/s/{}/{name}", flags.sandbox_id),
                });
            }
        };
        let names: Vec<&str> = if flags.services.is_empty() {
            catalog::names()
        } else {
            flags.services.iter().map(String::as_str).collect()
        };
        for name in names {
            let entry = catalog::lookup(name).ok_or_else(|| {
                invalid(
                    "--services",
                    format!("unknown service {name:?}"),
                    format!(
                        "use one of {} or add --route {name}=HOST[/PREFIX]",
                        catalog::names().join(", ")
                    ),
                )
            })?;
            add(name, &mut services);
            for (host, prefixes) in entry.claims {
                catalog_claims.push(Claim {
                    service: name.to_string(),
                    host: HostPattern::Exact((*host).to_string()),
                    prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
                });
            }
        }
        let mut route_claims = Vec::new();
        for raw in flags.routes {
            let (name, target) = raw.split_once('=').ok_or_else(|| {
                invalid(
                    "--route",
                    format!("{raw:?} has no '='"),
                    "write --route SERVICE=HOST[/PREFIX]",
                )
            })?;
            validate_service_name("--route", name)?;
            let (host, prefix) = match target.find('/') {
                Some(i) => (&target[..i], Some(&target[i..])),
                None => (target, None),
            };
            let host = HostPattern::parse(host)
                .map_err(|m| invalid("--route", m, "write --route SERVICE=HOST[/PREFIX]"))?;
            add(name, &mut services);
            take_over(&mut catalog_claims, &host, prefix);
            route_claims.push(Claim {
                service: name.to_string(),
                host,
                prefixes: prefix.map(|p| vec![p.to_string()]).unwrap_or_default(),
            });
        }
        let mut claims = catalog_claims;
        claims.append(&mut route_claims);
        let allow = parse_allow(flags.allow_passthrough)?;
        let router = Router::new(services, claims, &allow)?;
        Ok(Settings {
            listen: flags.listen.to_string(),
            sandbox_id: flags.sandbox_id.to_string(),
            mode: flags.mode,
            ca_dir: None,
            twin_base,
            auth_value_env: None,
            insecure_skip_verify: false,
            router,
            canary_token: None,
        })
    }
}

/// Removes from the catalog's claims what a `--route` for `host` (and
/// `prefix`, or the whole host) claims, so the route takes it over; a claim
/// left without prefixes is dropped (an empty list would mean the whole host).
fn take_over(catalog_claims: &mut Vec<Claim>, host: &HostPattern, prefix: Option<&str>) {
    // "" stands for the whole host, as "/" does.
    let key = |p: &str| p.trim_end_matches('/').to_string();
    let wanted = prefix.map(key).unwrap_or_default();
    catalog_claims.retain_mut(|claim| {
        if &claim.host != host {
            return true;
        }
        if claim.prefixes.is_empty() {
            return !wanted.is_empty();
        }
        claim.prefixes.retain(|p| key(p) != wanted);
        !claim.prefixes.is_empty()
    });
}

/// Flags given together with a config file. Each one overrides the file's
/// field of the same meaning (flags win, for every field they share).
#[derive(Debug, Default, Clone, Copy)]
pub struct Overrides<'a> {
    /// `--listen` over `listen`.
    pub listen: Option<&'a str>,
    /// `--sandbox` over `sandbox_id` (and so over the service upstreams built from it).
    pub sandbox_id: Option<&'a str>,
    /// `--mode` over `mode`.
    pub mode: Option<Mode>,
    /// `--allow-passthrough` (when given) over `allow_passthrough`.
    pub allow_passthrough: Option<&'a [String]>,
}

/// The flag form of a config.
pub struct Flags<'a> {
    pub listen: &'a str,
    pub twin: &'a str,
    pub sandbox_id: &'a str,
    pub services: &'a [String],
    pub routes: &'a [String],
    pub mode: Mode,
    pub allow_passthrough: &'a [String],
}

fn parse_allow(raw: &[String]) -> Result<Vec<HostPattern>, ConfigError> {
    let mut out = Vec::new();
    for entry in raw {
        if entry == "@build" {
            out.extend(
                catalog::BUILD_PRESET
                    .iter()
                    .map(|h| HostPattern::Exact((*h).to_string())),
            );
        } else if entry.starts_with('@') {
            return Err(invalid(
                "allow_passthrough",
                format!("unknown preset {entry:?}"),
                "the only preset is \"@build\"",
            ));
        } else {
            out.push(HostPattern::parse(entry).map_err(|m| {
                invalid(
                    "allow_passthrough",
                    m,
                    "write hosts like \"pypi.org\" or \"*.example.com\"",
                )
            })?);
        }
    }
    Ok(out)
}

fn validate_listen(field: &str, listen: &str) -> Result<(), ConfigError> {
    listen
        .parse::<std::net::SocketAddr>()
        .map(|_| ())
        .map_err(|_| {
            invalid(
                field,
                format!("{listen:?} is not an IP:port address"),
                "write e.g. \"127.0.0.1:8080\" (port 0 picks a free port)",
            )
        })
}

fn validate_sandbox(field: &str, id: &str) -> Result<(), ConfigError> {
    if id.is_empty()
        || id.len() > 128
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(invalid(
            field,
            format!("{id:?} is not a valid sandbox id"),
            "use 1-128 characters from [A-Za-z0-9_-], e.g. \"sbx_a1b2c3\"",
        ));
    }
    Ok(())
}

fn validate_service_name(field: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
    {
        return Err(invalid(
            field,
            format!("{name:?} is not a valid service name"),
            "use lower-case letters, digits, '-' and '_', e.g. \"google-calendar\"",
        ));
    }
    Ok(())
}

fn validate_canary(token: &str) -> Result<(), ConfigError> {
    let hex = token.strip_prefix("cnry_").unwrap_or("");
    if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(invalid(
            "canary_token",
            "must be \"cnry_\" followed by 32 hex digits",
            "omit it to have one minted per run",
        ));
    }
    Ok(())
}

fn validate_base_url(field: &str, url: &str) -> Result<String, ConfigError> {
    let parsed: http::Uri = url.parse().map_err(|_| {
        invalid(
            field,
            format!("{url:?} is not a URL"),
            "write e.g. \"http://127.0.0.1:9000\"",
        )
    })?;
    match parsed.scheme_str() {
        Some("http") | Some("https") => {}
        _ => {
            return Err(invalid(
                field,
                format!("{url:?} must start with http:// or https://"),
                "write e.g. \"http://127.0.0.1:9000\"",
            ))
        }
    }
    if parsed.authority().is_none() || parsed.query().is_some() {
        return Err(invalid(
            field,
            format!("{url:?} needs a host and no query"),
            "write e.g. \"http://127.0.0.1:9000\"",
        ));
    }
    if parsed.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(invalid(
            field,
            "credentials in the URL would reach logs and the ledger",
            "put the twin credential in an env var and name it in upstream.auth_value_env",
        ));
    }
    Ok(url.trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::route::Route;

    const GOOD: &str = r#"{
        "version": 1, "sandbox_id": "sbx_1", "mode": "strict",
        "upstream": {"base_url": "http://127.0.0.1:9000/"},
        "services": [
            {"name": "stripe", "hosts": ["api.stripe.com", "*.stripe.com"]},
            {"name": "google-calendar", "hosts": ["www.googleapis.com"], "paths": ["/calendar/v3"]},
            {"name": "custom", "hosts": ["api.custom.dev"], "upstream": "http://127.0.0.1:9100"}
        ],
        "allow_passthrough": ["@build", "*.internal.dev"]
    }"#;

    #[test]
    fn parses_a_full_file() {
        let s = Settings::from_json(GOOD, "veris.json").unwrap();
        assert_eq!(s.mode, Mode::Strict);
        assert_eq!(s.listen, DEFAULT_LISTEN);
        match s.router.route("files.stripe.com", "/v1/files") {
            Route::Service(svc) => {
                assert_eq!(svc.name, "stripe");
                assert_eq!(svc.upstream, "http://127.0.0.1:9000/s/sbx_1/stripe");
            }
            other => panic!("{other:?}"),
        }
        match s.router.route("api.custom.dev", "/") {
            Route::Service(svc) => assert_eq!(svc.upstream, "http://127.0.0.1:9100"),
            other => panic!("{other:?}"),
        }
        assert_eq!(s.router.route_connection("pypi.org"), Route::Allowed);
        assert_eq!(s.router.route_connection("a.internal.dev"), Route::Allowed);
    }

    fn err(text: &str) -> String {
        Settings::from_json(text, "cfg.json")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn errors_name_file_field_and_fix() {
        let e = err(
            r#"{"version":1,"sandbox_id":"s","upstream":{"base_url":"http://x"},"services":[],"bogus":1}"#,
        );
        assert!(
            e.starts_with("cfg.json: ") && e.contains("bogus") && e.contains("Next:"),
            "{e}"
        );
        let e = err(
            r#"{"version":2,"sandbox_id":"s","upstream":{"base_url":"http://x"},"services":[{"name":"a","hosts":["a.com"]}]}"#,
        );
        assert!(
            e.contains("cfg.json: version: unsupported version 2") && e.contains("Next:"),
            "{e}"
        );
        let e = err(
            r#"{"version":1,"sandbox_id":"s s","upstream":{"base_url":"http://x"},"services":[{"name":"a","hosts":["a.com"]}]}"#,
        );
        assert!(e.contains("sandbox_id"), "{e}");
        let e = err(
            r#"{"version":1,"sandbox_id":"s","upstream":{"base_url":"ftp://x"},"services":[{"name":"a","hosts":["a.com"]}]}"#,
        );
        assert!(e.contains("upstream.base_url"), "{e}");
        let e = err(
            r#"{"version":1,"sandbox_id":"s","upstream":{"base_url":"http://x"},"services":[{"name":"a","hosts":["a.*.com"]}]}"#,
        );
        assert!(
            e.contains("services[0].hosts") && e.contains("leading"),
            "{e}"
        );
        let e = err(
            r#"{"version":1,"sandbox_id":"s","upstream":{"base_url":"http://x"},"services":[{"name":"a","hosts":["a.com"]},{"name":"b","hosts":["A.com"]}]}"#,
        );
        assert!(
            e.contains("\"a\" and \"b\" both claim the whole host a.com"),
            "{e}"
        );
        let e = err(
            r#"{"version":1,"sandbox_id":"s","upstream":{"base_url":"http://x"},"services":[{"name":"a","hosts":["a.com"]}],"allow_passthrough":["@nope"]}"#,
        );
        assert!(e.contains("@nope"), "{e}");
        let e = err(
            r#"{"version":1,"sandbox_id":"s","upstream":{"base_url":"http://u:p@x"},"services":[{"name":"a","hosts":["a.com"]}]}"#,
        );
        assert!(e.contains("auth_value_env"), "{e}");
        let e = err(
            r#"{"version":1,"sandbox_id":"s","upstream":{"base_url":"http://x"},"services":[{"name":"a","hosts":["a.com"]}],"canary_token":"x"}"#,
        );
        assert!(e.contains("canary_token"), "{e}");
        let e = err(
            r#"{"version":1,"listen":"localhost","sandbox_id":"s","upstream":{"base_url":"http://x"},"services":[{"name":"a","hosts":["a.com"]}]}"#,
        );
        assert!(e.contains("listen"), "{e}");
    }

    #[test]
    fn a_file_error_prints_its_message_once() {
        let e = Settings::from_json(
            r#"{"version":2,"sandbox_id":"s","upstream":{"base_url":"http://x"},"services":[{"name":"a","hosts":["a.com"]}]}"#,
            "cfg.json",
        )
        .unwrap_err();
        // What `anyhow`'s `{:#}` prints: each error of the chain, joined.
        let mut chain = e.to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            chain.push_str(&format!(": {c}"));
            cause = c.source();
        }
        assert_eq!(chain.matches("unsupported version 2").count(), 1, "{chain}");
        assert_eq!(chain.matches("Next:").count(), 1, "{chain}");
    }

    fn flags<'a>(services: &'a [String], routes: &'a [String]) -> Flags<'a> {
        Flags {
            listen: "127.0.0.1:0",
            twin: "http://127.0.0.1:1",
            sandbox_id: "sbx",
            services,
            routes,
            mode: Mode::Passthrough,
            allow_passthrough: &[],
        }
    }

    #[test]
    fn flags_use_the_catalog() {
        let s =
            Settings::from_flags(flags(&["stripe".into(), "google-calendar".into()], &[])).unwrap();
        assert!(
            matches!(s.router.route("api.stripe.com", "/v1"), Route::Service(x) if x.name == "stripe")
        );
        assert!(
            matches!(s.router.route("www.googleapis.com", "/calendar/v3/c"), Route::Service(x) if x.name == "google-calendar")
        );
        assert_eq!(
            s.router.route("www.googleapis.com", "/drive/v3"),
            Route::Unmapped
        );
        let all = Settings::from_flags(flags(&[], &[])).unwrap();
        assert_eq!(all.router.services().len(), catalog::CATALOG.len());
        assert!(
            matches!(all.router.route("www.googleapis.com", "/drive/v3/files"), Route::Service(x) if x.name == "google-drive")
        );
        assert!(
            matches!(all.router.route("www.googleapis.com", "/oauth2/v3/userinfo"), Route::Service(x) if x.name == "google-identity")
        );
        let e = Settings::from_flags(flags(&["nope".into()], &[]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown service \"nope\"") && e.contains("--route"),
            "{e}"
        );
    }

    #[test]
    fn route_flags() {
        let s = Settings::from_flags(flags(
            &[],
            &["acme=api.acme.test/v2".into(), "acme=*.acme.dev".into()],
        ))
        .unwrap();
        assert!(
            matches!(s.router.route("api.acme.test", "/v2/x"), Route::Service(x) if x.name == "acme" && x.upstream == "http://127.0.0.1:1/s/sbx/acme")
        );
        assert_eq!(s.router.route("api.acme.test", "/v1"), Route::Unmapped);
        assert!(matches!(s.router.route("acme.dev", "/"), Route::Service(_)));
        assert!(Settings::from_flags(flags(&[], &["acme".into()])).is_err());
        // A route adds to the catalog, it does not replace it (M7): without
        // --services the whole catalog is still routed.
        assert!(
            matches!(s.router.route("api.stripe.com", "/v1/charges"), Route::Service(x) if x.name == "stripe")
        );
        assert_eq!(s.router.services().len(), catalog::CATALOG.len() + 1);
    }

    #[test]
    fn a_route_takes_over_the_catalog_claim_on_its_host() {
        let s = Settings::from_flags(flags(
            &[],
            &[
                "mystripe=api.stripe.com".into(),
                "mydrive=www.googleapis.com/drive/v3/".into(),
            ],
        ))
        .unwrap();
        let service = |host: &str, path: &str| match s.router.route(host, path) {
            Route::Service(x) => x.name.clone(),
            other => format!("{other:?}"),
        };
        assert_eq!(service("api.stripe.com", "/v1/charges"), "mystripe");
        // The rest of the catalog's entries stay, on that host and others.
        assert_eq!(service("files.stripe.com", "/v1/files"), "stripe");
        assert_eq!(service("www.googleapis.com", "/drive/v3/files"), "mydrive");
        assert_eq!(
            service("www.googleapis.com", "/upload/drive/v3/files"),
            "google-drive"
        );
        assert_eq!(
            service("www.googleapis.com", "/calendar/v3/x"),
            "google-calendar"
        );
        // A route for a new prefix on a catalog host sits beside the catalog.
        let s = Settings::from_flags(flags(
            &["stripe".into()],
            &["acme=api.stripe.com/acme".into()],
        ))
        .unwrap();
        assert!(
            matches!(s.router.route("api.stripe.com", "/acme/x"), Route::Service(x) if x.name == "acme")
        );
        assert!(
            matches!(s.router.route("api.stripe.com", "/v1"), Route::Service(x) if x.name == "stripe")
        );
    }

    #[test]
    fn flags_override_the_file_for_every_field_they_share() {
        let s = Settings::from_json_with(
            GOOD,
            "veris.json",
            Overrides {
                listen: Some("127.0.0.1:0"),
                sandbox_id: Some("sbx_flag"),
                mode: Some(Mode::Passthrough),
                allow_passthrough: Some(&["pypi.org".to_string()]),
            },
        )
        .unwrap();
        assert_eq!(s.listen, "127.0.0.1:0");
        assert_eq!(s.sandbox_id, "sbx_flag");
        assert_eq!(s.mode, Mode::Passthrough);
        match s.router.route("api.stripe.com", "/v1") {
            Route::Service(svc) => {
                assert_eq!(svc.upstream, "http://127.0.0.1:9000/s/sbx_flag/stripe")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s.router.route_connection("pypi.org"), Route::Allowed);
        assert_ne!(s.router.route_connection("a.internal.dev"), Route::Allowed);
        let e = Settings::from_json_with(
            GOOD,
            "veris.json",
            Overrides {
                sandbox_id: Some("bad id"),
                ..Overrides::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("--sandbox: "), "{e}");
    }

    #[test]
    fn the_catalog_itself_has_no_conflicting_claims() {
        let names: Vec<String> = catalog::names().iter().map(|s| s.to_string()).collect();
        Settings::from_flags(flags(&names, &[])).unwrap();
    }
}
