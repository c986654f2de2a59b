//! Fixtures: the declarative description of what the twin answers, and vendor-shaped errors.
//!
//! A fixture file is JSON:
//!
//! ```json
//! {
//!   "services": { "stripe": { "errors": "stripe" }, "google-calendar": { "errors": "google" } },
//!   "fixtures": [
//!     { "service": "stripe", "method": "POST", "path": "/v1/customers",
//!       "body": { "id": "{{id \"cus_\"}}", "object": "customer", "email": "{{form.email}}" },
//!       "store": "customers" },
//!     { "service": "stripe", "method": "GET", "path": "/v1/customers/{id}", "lookup": "customers",
//!       "missing": { "error": { "message": "No such customer: '{{param.id}}'" } } },
//!     { "service": "stripe", "method": "GET", "path": "/v1/customers", "list": "customers",
//!       "list_order": "desc", "body": { "object": "list", "data": "{{list}}" } }
//!   ]
//! }
//! ```
//!
//! (A bare array of fixtures is accepted too.) Fields of a fixture:
//! - `service`: the service name from the URL (`*` matches any service); `method`: upper
//!   case (`*` matches any); `path`: segments matched exactly, `{name}` matches one
//!   segment and binds `param.name`. The most specific match wins (exact service over
//!   `*`, then more literal segments, then exact method, then the earlier fixture).
//! - `status` (default 200), `headers` (string templates), `body` (a JSON template, see
//!   the `template` module; default `{}`). Responses are always `application/json`.
//! - `required`: body fields that must be present, else a vendor-shaped 400.
//! - at most one store action, each naming a collection (a string template, e.g.
//!   `"events:{{param.id}}"`) in the per-(sandbox, service) in-memory store:
//!   - `store`: the rendered body is the created object; it is saved under its `id`
//!     (re-posting the same id replaces it);
//!   - `lookup`: answers the stored object whose id is the path parameter `key` (default:
//!     the last `{param}`), else 404 with the `missing` body template (default: a
//!     vendor-shaped "no such object");
//!   - `list`: renders `body` with `{{list}}` bound to the stored objects in creation
//!     order (`list_order: "desc"` for newest first); without a body, answers the array.
//! - `fault`: `{ "status": 429|500|503, "hang_ms": N }` (either or both). The row gets
//!   tier `fault`. `hang_ms` waits (capped at 60 s; dropped with the request when the
//!   client goes away) before answering; with `status` the answer is that status with
//!   `body` if given, else a vendor-shaped error; without it the fixture answers
//!   normally after the hang.
//!
//! `services.NAME.errors` picks the error shape for unknown routes and failures:
//! `stripe`, `google` or `generic` (the default for undeclared services). The built-in
//! set (`fixtures/default.json`) also carries test-only fault routes on stripe:
//! `POST /v1/test/fault/429`, `…/500`, `…/503` and `POST /v1/test/hang` (hangs 2 s, then 200).

use std::collections::BTreeMap;
use std::path::Path;

use http::header::HeaderName;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::template::{Node, StrTemplate};
use crate::TwinError;

/// Longest hang a fault may ask for.
pub(crate) const MAX_HANG_MS: u64 = 60_000;

/// The error shape a service answers with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrorStyle {
    /// `{error:{type, message, code?, param?}}`
    Stripe,
    /// `{error:{code, message, status}}`
    Google,
    /// `{error:{message, type}}`
    #[default]
    Generic,
}

/// A loaded, validated fixture set.
#[derive(Debug, Clone)]
pub struct Fixtures {
    styles: BTreeMap<String, ErrorStyle>,
    fixtures: Vec<Fixture>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum FileForm {
    Full(FixtureFile),
    List(Vec<FixtureSpec>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FixtureFile {
    #[serde(default)]
    services: BTreeMap<String, ServiceSpec>,
    #[serde(default)]
    fixtures: Vec<FixtureSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceSpec {
    #[serde(default)]
    errors: ErrorStyle,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FixtureSpec {
    service: String,
    method: String,
    path: String,
    #[serde(default = "default_status")]
    status: u16,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    body: Option<Value>,
    #[serde(default)]
    required: Vec<String>,
    #[serde(default)]
    store: Option<String>,
    #[serde(default)]
    lookup: Option<String>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    missing: Option<Value>,
    #[serde(default)]
    list: Option<String>,
    #[serde(default)]
    list_order: ListOrder,
    #[serde(default)]
    fault: Option<FaultSpec>,
}

fn default_status() -> u16 {
    200
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ListOrder {
    #[default]
    Asc,
    Desc,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FaultSpec {
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub hang_ms: Option<u64>,
}

#[derive(Debug, Clone)]
enum Segment {
    Literal(String),
    Param(String),
}

#[derive(Debug, Clone)]
pub(crate) enum Action {
    Respond,
    Store(StrTemplate),
    Lookup {
        collection: StrTemplate,
        key: String,
        missing: Option<Node>,
    },
    List {
        collection: StrTemplate,
        order: ListOrder,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct Fixture {
    service: String,
    method: String,
    segments: Vec<Segment>,
    pub status: u16,
    pub headers: Vec<(HeaderName, StrTemplate)>,
    pub body: Option<Node>,
    pub required: Vec<String>,
    pub action: Action,
    pub fault: Option<FaultSpec>,
}

impl Fixtures {
    /// The default set embedded in the binary (`twin/fixtures/default.json`).
    pub fn builtin() -> Fixtures {
        // The embedded file is checked by a unit test; an empty set is the safe fallback.
        Fixtures::from_json(include_str!("../fixtures/default.json")).unwrap_or_else(|e| {
            tracing::error!(error = %e, "built-in fixtures are invalid");
            Fixtures {
                styles: BTreeMap::new(),
                fixtures: Vec::new(),
            }
        })
    }

    /// Parses and validates a fixture file's text.
    pub fn from_json(text: &str) -> Result<Fixtures, TwinError> {
        let (services, specs) = match serde_json::from_str::<FileForm>(text) {
            Ok(FileForm::Full(f)) => (f.services, f.fixtures),
            Ok(FileForm::List(l)) => (BTreeMap::new(), l),
            // Untagged errors say nothing useful; re-parse as the full form for the message.
            Err(_) => match serde_json::from_str::<FixtureFile>(text) {
                Ok(f) => (f.services, f.fixtures),
                Err(e) => return Err(TwinError::ParseFixtures(e)),
            },
        };
        let fixtures = specs
            .into_iter()
            .enumerate()
            .map(|(index, spec)| {
                let (service, method, path) =
                    (spec.service.clone(), spec.method.clone(), spec.path.clone());
                compile(spec).map_err(|reason| TwinError::InvalidFixture {
                    index,
                    service,
                    method,
                    path,
                    reason,
                })
            })
            .collect::<Result<_, _>>()?;
        let styles = services.into_iter().map(|(k, v)| (k, v.errors)).collect();
        Ok(Fixtures { styles, fixtures })
    }

    /// Reads and validates a fixture file.
    pub fn load(path: &Path) -> Result<Fixtures, TwinError> {
        let text = std::fs::read_to_string(path).map_err(|source| TwinError::ReadFixtures {
            path: path.to_path_buf(),
            source,
        })?;
        Fixtures::from_json(&text)
    }

    /// Adds `other`'s fixtures and service styles; on an equally specific match, `other` wins.
    pub fn extend(&mut self, other: Fixtures) {
        let mut fixtures = other.fixtures;
        fixtures.append(&mut self.fixtures);
        self.fixtures = fixtures;
        self.styles.extend(other.styles);
    }

    /// Number of fixtures in the set.
    pub fn len(&self) -> usize {
        self.fixtures.len()
    }

    /// Whether the set has no fixtures.
    pub fn is_empty(&self) -> bool {
        self.fixtures.is_empty()
    }

    /// The error shape of a service.
    pub fn error_style(&self, service: &str) -> ErrorStyle {
        self.styles.get(service).copied().unwrap_or_default()
    }

    /// The most specific fixture for a request, with its bound path parameters.
    pub(crate) fn find(
        &self,
        service: &str,
        method: &str,
        path: &str,
    ) -> Option<(&Fixture, BTreeMap<String, String>)> {
        let segs = split_path(path);
        let mut best: Option<(Specificity, &Fixture, Params)> = None;
        for fx in &self.fixtures {
            let service_exact = fx.service == service;
            if !(service_exact || fx.service == "*") {
                continue;
            }
            let method_exact = fx.method == method;
            if !(method_exact || fx.method == "*") || fx.segments.len() != segs.len() {
                continue;
            }
            let mut params = BTreeMap::new();
            let mut literals = 0;
            let matched = fx.segments.iter().zip(&segs).all(|(pat, seg)| match pat {
                Segment::Literal(l) => {
                    literals += 1;
                    l == seg
                }
                Segment::Param(name) => {
                    params.insert(name.clone(), percent_decode(seg));
                    !seg.is_empty()
                }
            });
            let score = (service_exact, literals, method_exact);
            if matched && best.as_ref().is_none_or(|(s, _, _)| score > *s) {
                best = Some((score, fx, params));
            }
        }
        best.map(|(_, fx, params)| (fx, params))
    }
}

/// Bound path parameters of a match.
pub(crate) type Params = BTreeMap<String, String>;

/// How specific a match is: exact service, literal segments, exact method (greater wins).
type Specificity = (bool, usize, bool);

fn compile(spec: FixtureSpec) -> Result<Fixture, String> {
    let method = spec.method.trim().to_string();
    if method.is_empty() || (method != "*" && !method.bytes().all(|b| b.is_ascii_uppercase())) {
        return Err("method must be an upper-case HTTP method or *".into());
    }
    if spec.service.is_empty() || spec.service.contains('/') {
        return Err("service must be a non-empty name without '/'".into());
    }
    if !spec.path.starts_with('/') {
        return Err("path must start with '/'".into());
    }
    let mut segments = Vec::new();
    for seg in split_path(&spec.path) {
        if let Some(name) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            if name.is_empty()
                || segments
                    .iter()
                    .any(|s| matches!(s, Segment::Param(n) if n == name))
            {
                return Err(format!("path parameter {seg:?} is empty or repeated"));
            }
            segments.push(Segment::Param(name.to_string()));
        } else if seg.contains(['{', '}']) {
            return Err(format!("segment {seg:?} mixes text and a parameter"));
        } else {
            segments.push(Segment::Literal(seg.to_string()));
        }
    }
    if segments
        .first()
        .is_some_and(|s| matches!(s, Segment::Literal(l) if l == "veris"))
    {
        return Err("paths under /veris belong to the control surface".into());
    }
    let param_names: Vec<&str> = segments
        .iter()
        .filter_map(|s| match s {
            Segment::Param(n) => Some(n.as_str()),
            Segment::Literal(_) => None,
        })
        .collect();
    if !(100..=599).contains(&spec.status) {
        return Err(format!("status {} is not an HTTP status", spec.status));
    }
    let headers = spec
        .headers
        .iter()
        .map(|(k, v)| {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| format!("bad header name {k:?}"))?;
            Ok((name, StrTemplate::compile(v)?))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let body = spec.body.as_ref().map(Node::compile).transpose()?;
    let missing = spec.missing.as_ref().map(Node::compile).transpose()?;
    let mut used = Vec::new();
    for node in body.iter().chain(missing.iter()) {
        node.params(&mut used);
    }
    if let Some(p) = used.iter().find(|p| !param_names.contains(&p.as_str())) {
        return Err(format!(
            "template uses param.{p} but the path has no {{{p}}}"
        ));
    }
    let actions = [
        spec.store.is_some(),
        spec.lookup.is_some(),
        spec.list.is_some(),
    ];
    if actions.iter().filter(|a| **a).count() > 1 {
        return Err("use at most one of store, lookup, list".into());
    }
    if spec.missing.is_some() && spec.lookup.is_none() {
        return Err("missing only applies to lookup fixtures".into());
    }
    let action = if let Some(c) = &spec.store {
        Action::Store(StrTemplate::compile(c)?)
    } else if let Some(c) = &spec.lookup {
        let key = match &spec.key {
            Some(k) if param_names.contains(&k.as_str()) => k.clone(),
            Some(k) => return Err(format!("key {k:?} is not a parameter of the path")),
            None => param_names
                .last()
                .ok_or("lookup needs a {param} in the path")?
                .to_string(),
        };
        Action::Lookup {
            collection: StrTemplate::compile(c)?,
            key,
            missing,
        }
    } else if let Some(c) = &spec.list {
        Action::List {
            collection: StrTemplate::compile(c)?,
            order: spec.list_order,
        }
    } else {
        Action::Respond
    };
    if let Some(f) = &spec.fault {
        if f.status.is_none() && f.hang_ms.is_none() {
            return Err("fault needs a status or hang_ms".into());
        }
        if let Some(s) = f.status {
            if ![429, 500, 503].contains(&s) {
                return Err(format!("fault status must be 429, 500 or 503, got {s}"));
            }
        }
        if f.hang_ms.is_some_and(|ms| ms > MAX_HANG_MS) {
            return Err(format!("hang_ms is capped at {MAX_HANG_MS}"));
        }
    }
    Ok(Fixture {
        service: spec.service,
        method,
        segments,
        status: spec.status,
        headers,
        body,
        required: spec.required,
        action,
        fault: spec.fault,
    })
}

/// Splits a path into segments, ignoring one trailing slash (`/v1/x/` is `/v1/x`).
pub(crate) fn split_path(path: &str) -> Vec<&str> {
    let trimmed = path.strip_prefix('/').unwrap_or(path);
    let trimmed = trimmed.strip_suffix('/').unwrap_or(trimmed);
    if trimmed.is_empty() {
        Vec::new()
    } else {
        trimmed.split('/').collect()
    }
}

/// Decodes `%XX` escapes (invalid escapes stay as written; bytes decode lossily).
pub(crate) fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(b) = hex {
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

/// A vendor-shaped error body for `status`.
pub(crate) fn vendor_error(
    style: ErrorStyle,
    status: u16,
    message: &str,
    code: Option<&str>,
    param: Option<&str>,
) -> Value {
    match style {
        ErrorStyle::Stripe => {
            let kind = match status {
                500..=599 => "api_error",
                _ => "invalid_request_error",
            };
            let mut err = json!({"type": kind, "message": message});
            if let Some(c) = code {
                err["code"] = json!(c);
            }
            if let Some(p) = param {
                err["param"] = json!(p);
            }
            json!({"error": err})
        }
        ErrorStyle::Google => {
            let status_name = match status {
                400 | 413 | 422 => "INVALID_ARGUMENT",
                401 => "UNAUTHENTICATED",
                403 => "PERMISSION_DENIED",
                404 => "NOT_FOUND",
                409 => "ALREADY_EXISTS",
                429 => "RESOURCE_EXHAUSTED",
                503 => "UNAVAILABLE",
                _ => "INTERNAL",
            };
            json!({"error": {"code": status, "message": message, "status": status_name}})
        }
        ErrorStyle::Generic => {
            let kind = match status {
                400 => "invalid_request",
                404 => "not_found",
                413 => "payload_too_large",
                429 => "rate_limited",
                503 => "unavailable",
                _ => "internal_error",
            };
            json!({"error": {"message": message, "type": kind}})
        }
    }
}

/// The 404 for a route no fixture answers.
pub(crate) fn unknown_route(style: ErrorStyle, method: &str, path: &str) -> Value {
    let message = match style {
        ErrorStyle::Stripe => format!(
            "Unrecognized request URL ({method}: {path}). Please see https://stripe.com/docs or we can help at https://support.stripe.com/."
        ),
        ErrorStyle::Google => format!("The requested URL {path} was not found on this server."),
        ErrorStyle::Generic => format!("no route for {method} {path}"),
    };
    vendor_error(style, 404, &message, None, None)
}

/// The default body of a fault answer.
pub(crate) fn fault_error(style: ErrorStyle, status: u16) -> Value {
    match (style, status) {
        (ErrorStyle::Stripe, 429) => vendor_error(
            style,
            429,
            "Too many requests hit the API too quickly. We recommend an exponential backoff of your requests.",
            Some("rate_limit"),
            None,
        ),
        (_, 429) => vendor_error(style, 429, "Rate limit exceeded.", None, None),
        (_, 503) => vendor_error(style, 503, "The service is currently unavailable.", None, None),
        _ => vendor_error(style, status, "An unknown error occurred.", None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_set_is_valid() {
        let text = include_str!("../fixtures/default.json");
        let fx = Fixtures::from_json(text).expect("default fixtures load");
        assert!(fx.len() >= 10);
        assert_eq!(fx.error_style("stripe"), ErrorStyle::Stripe);
        assert_eq!(fx.error_style("google-calendar"), ErrorStyle::Google);
        assert_eq!(fx.error_style("hubspot"), ErrorStyle::Generic);
    }

    #[test]
    fn most_specific_fixture_wins() {
        let fx = Fixtures::from_json(
            r#"[{"service":"*","method":"*","path":"/v1/{a}/{b}"},
                {"service":"s","method":"GET","path":"/v1/{a}/{b}","status":201},
                {"service":"s","method":"GET","path":"/v1/x/{b}","status":202}]"#,
        )
        .expect("loads");
        let status = |m: &str, p: &str| fx.find("s", m, p).map(|(f, _)| f.status);
        assert_eq!(status("GET", "/v1/x/y"), Some(202));
        assert_eq!(status("GET", "/v1/z/y/"), Some(201));
        assert_eq!(status("POST", "/v1/z/y"), Some(200));
        assert_eq!(status("GET", "/v1/z"), None);
        let (_, params) = fx.find("s", "GET", "/v1/x/a%20b").expect("matches");
        assert_eq!(params.get("b").map(String::as_str), Some("a b"));
    }

    #[test]
    fn invalid_fixtures_are_rejected_with_reason() {
        for bad in [
            r#"[{"service":"s","method":"get","path":"/x"}]"#,
            r#"[{"service":"s","method":"GET","path":"x"}]"#,
            r#"[{"service":"s","method":"GET","path":"/x","lookup":"c"}]"#,
            r#"[{"service":"s","method":"GET","path":"/x/{id}","body":"{{param.nope}}"}]"#,
            r#"[{"service":"s","method":"GET","path":"/x","fault":{"status":404}}]"#,
            r#"[{"service":"s","method":"GET","path":"/x","fault":{"hang_ms":600000}}]"#,
            r#"[{"service":"s","method":"GET","path":"/x","store":"a","list":"a"}]"#,
            r#"[{"service":"s","method":"GET","path":"/veris/x"}]"#,
            r#"[{"service":"s","method":"GET","path":"/x","bogus":1}]"#,
        ] {
            assert!(
                Fixtures::from_json(bad).is_err(),
                "{bad} should be rejected"
            );
        }
    }

    #[test]
    fn load_names_the_missing_file() {
        let path = Path::new("/nonexistent/veris-fixtures.json");
        let err = Fixtures::load(path).expect_err("missing file");
        assert!(matches!(&err, TwinError::ReadFixtures { path: p, .. } if p == path));
        assert!(err.to_string().contains("/nonexistent/veris-fixtures.json"));
    }

    #[test]
    fn extended_fixtures_win_ties() {
        let mut base =
            Fixtures::from_json(r#"[{"service":"s","method":"GET","path":"/x","status":200}]"#)
                .expect("loads");
        let extra = Fixtures::from_json(r#"{"services":{"s":{"errors":"stripe"}},"fixtures":[{"service":"s","method":"GET","path":"/x","status":204}]}"#)
            .expect("loads");
        base.extend(extra);
        assert_eq!(
            base.find("s", "GET", "/x").map(|(f, _)| f.status),
            Some(204)
        );
        assert_eq!(base.error_style("s"), ErrorStyle::Stripe);
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%20b%zz%4"), "a b%zz%4");
        assert_eq!(percent_decode("%E2%9C%93"), "✓");
    }
}
