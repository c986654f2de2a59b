//! The twin itself: one request's lifecycle, from path split to recorded row.
//!
//! `handle` runs the phases in order: split `/s/{sandbox}/{service}/{rest}`, check the
//! proxy credential (vendor surface only, when one is set), check the sandbox, then either the control surface (`/veris/…`) or the vendor surface (match a
//! fixture → read the bounded body → fault → required fields → store action → render).
//! Every request under a service is recorded exactly once by a [`Recorder`], including
//! when the client goes away mid-request (the future is dropped; the row gets status
//! `null`), which is what keeps `hang_ms` cancellation-safe.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use serde_json::{json, Map, Value};
use subtle::ConstantTimeEq;

use crate::fixtures::{self, Action, ErrorStyle, Fixtures, ListOrder, MAX_HANG_MS};
use crate::log::{self, NewRow, RequestLog, Tier};
use crate::template::{lookup_path, Context};
use crate::webhook::event::{self, Event, EventSink};
use crate::TwinError;

/// Largest request body the twin parses; bigger bodies get a 413.
pub(crate) const MAX_BODY: usize = 1024 * 1024;

/// How a twin is set up.
#[derive(Clone)]
pub struct TwinOptions {
    pub fixtures: Fixtures,
    /// When set, requests for any other sandbox get a 404 (and are not recorded).
    pub sandbox: Option<String>,
    /// JSONL request log, appended to and reloaded on start.
    pub log: Option<PathBuf>,
    /// When set, vendor requests must carry `Authorization: Bearer <credential>`
    /// (the veris proxy's per-start secret); others get a 401 and no log row,
    /// so a workload cannot write rows into the log by calling the twin
    /// directly. The control surface stays open: it only reads.
    pub credential: Option<String>,
}

impl std::fmt::Debug for TwinOptions {
    // By hand so the credential never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TwinOptions")
            .field("fixtures", &self.fixtures.len())
            .field("sandbox", &self.sandbox)
            .field("log", &self.log)
            .field(
                "credential",
                &self.credential.as_ref().map(|_| "[redacted]"),
            )
            .finish()
    }
}

/// A running twin's state: fixtures, request log and object store.
pub struct Twin {
    fixtures: Fixtures,
    sandbox: Option<String>,
    credential: Option<String>,
    state: Mutex<State>,
    ids: IdGen,
    /// Applied to each path before it reaches the request log (see
    /// [`Twin::redact_paths_with`]).
    redact_path: std::sync::OnceLock<fn(&str) -> String>,
    /// Where events for created objects go (see [`Twin::send_events_to`]).
    events: std::sync::OnceLock<EventSink>,
}

impl std::fmt::Debug for Twin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Twin")
            .field("sandbox", &self.sandbox)
            .field("fixtures", &self.fixtures.len())
            .field("credential", &self.credential.is_some())
            .finish()
    }
}

struct State {
    log: RequestLog,
    /// (sandbox, service, collection) → objects. Objects live for the twin's lifetime
    /// only; they are not reloaded from the log.
    store: HashMap<(String, String, String), Collection>,
}

#[derive(Default)]
struct Collection {
    order: Vec<String>,
    objects: HashMap<String, Value>,
}

/// Generates unguessable-enough, unique object ids (`ch_` + 24 alphanumerics).
pub(crate) struct IdGen {
    keys: RandomState,
    counter: AtomicU64,
}

impl IdGen {
    pub(crate) fn new() -> IdGen {
        IdGen {
            keys: RandomState::new(),
            counter: AtomicU64::new(0),
        }
    }

    pub(crate) fn next(&self, prefix: &str) -> String {
        const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let mut out = String::with_capacity(prefix.len() + 24);
        out.push_str(prefix);
        for part in 0..3u8 {
            let mut h = self.keys.hash_one((n, part));
            for _ in 0..8 {
                out.push(char::from(ALPHABET[(h % 62) as usize]));
                h /= 62;
            }
        }
        out
    }
}

impl Twin {
    /// Builds a twin; with a log file, reloads it so ids continue after the last row.
    pub fn new(options: TwinOptions) -> Result<Arc<Twin>, TwinError> {
        let log = match &options.log {
            Some(path) => RequestLog::open(path)?,
            None => RequestLog::in_memory(),
        };
        Ok(Arc::new(Twin {
            fixtures: options.fixtures,
            sandbox: options.sandbox,
            credential: options.credential,
            state: Mutex::new(State {
                log,
                store: HashMap::new(),
            }),
            ids: IdGen::new(),
            redact_path: std::sync::OnceLock::new(),
            events: std::sync::OnceLock::new(),
        }))
    }

    /// Makes the request log keep `redact(path)` instead of the path: a
    /// vendor's path may carry a key (`/v1/keys/sk_live_…/roll`), and the log
    /// is a file others read. The veris binary passes its ledger redaction
    /// (the twin crate depends on no workspace crate); the first call wins.
    pub fn redact_paths_with(&self, redact: fn(&str) -> String) {
        let _ = self.redact_path.set(redact);
    }

    /// Makes the twin hand an [`Event`] to `sink` for every object it stores
    /// while serving a vendor request of a Stripe-style service (the first
    /// call wins). Without a sink no event is made. The twin never blocks on
    /// the sink: when it is full the event is dropped and counted.
    pub fn send_events_to(&self, sink: EventSink) {
        let _ = self.events.set(sink);
    }

    /// Hands the events `object` gives to the sink, if there is one.
    fn emit(&self, sandbox: &str, service: &str, object: &Value, headers: &HeaderMap) {
        let Some(sink) = self.events.get() else {
            return;
        };
        let kinds = event::stripe_types(object);
        if kinds.is_empty() {
            return;
        }
        let created = object
            .get("created")
            .and_then(Value::as_i64)
            .unwrap_or_else(|| time::OffsetDateTime::now_utc().unix_timestamp());
        let request_id = self.ids.next("req_");
        let origin = event::Origin {
            request_id: &request_id,
            idempotency_key: headers.get("idempotency-key").and_then(|v| v.to_str().ok()),
        };
        for kind in kinds {
            let id = self.ids.next("evt_");
            let payload = event::stripe_event(&id, kind, created, object, origin).to_string();
            let event = Event {
                sandbox: sandbox.to_string(),
                service: service.to_string(),
                id,
                kind: kind.to_string(),
                payload: Bytes::from(payload),
            };
            sink.offer(event);
        }
    }

    /// A Stripe event of type `kind` for a fresh fixture object (`veris
    /// trigger`, like `stripe trigger`): the object is what the twin's own
    /// create fixture renders for a small request (so it has the shape of
    /// the twin's objects and a fresh id), with the status the event needs.
    /// It is not stored: no request of the workload made it. `Err` says
    /// why not (a service without Stripe's events, an unknown type).
    pub fn fixture_event(&self, service: &str, kind: &str) -> Result<Event, String> {
        if self.fixtures.error_style(service) != ErrorStyle::Stripe {
            return Err(format!("the twin makes no webhook events for {service:?}"));
        }
        let Some(request) = event::stripe_fixture(kind) else {
            return Err(format!(
                "the twin makes no event {kind:?}; it makes {}",
                event::STRIPE_TYPES.join(", ")
            ));
        };
        let Some((fx, params)) = self.fixtures.find(service, "POST", request.path) else {
            return Err(format!("the twin has no fixture for POST {}", request.path));
        };
        let (Action::Store(_), Some(body)) = (&fx.action, &fx.body) else {
            return Err(format!("POST {} is not a create fixture", request.path));
        };
        let form: Map<String, Value> = request
            .form
            .iter()
            .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
            .collect();
        let sandbox = self.sandbox.as_deref().unwrap_or_default();
        let mut object = body.render(&Context {
            params: &params,
            body: &Value::Object(form),
            query: &BTreeMap::new(),
            headers: &HeaderMap::new(),
            method: "POST",
            path: request.path,
            service,
            sandbox,
            list: None,
            ids: &self.ids,
        });
        if let (Some(status), Some(fields)) = (request.status, object.as_object_mut()) {
            fields.insert("status".into(), Value::String(status.into()));
            if status != "succeeded" && fields.contains_key("paid") {
                fields.insert("paid".into(), Value::Bool(false));
            }
        }
        // The fixture file is the operator's: it must still make this event.
        if !event::stripe_types(&object).contains(&kind) {
            return Err(format!(
                "the twin's POST {} fixture does not make a {kind:?} object",
                request.path
            ));
        }
        let created = object
            .get("created")
            .and_then(Value::as_i64)
            .unwrap_or_else(|| time::OffsetDateTime::now_utc().unix_timestamp());
        let request_id = self.ids.next("req_");
        let origin = event::Origin {
            request_id: &request_id,
            idempotency_key: None,
        };
        let id = self.ids.next("evt_");
        let payload = event::stripe_event(&id, kind, created, &object, origin).to_string();
        Ok(Event {
            sandbox: sandbox.to_string(),
            service: service.to_string(),
            id,
            kind: kind.to_string(),
            payload: Bytes::from(payload),
        })
    }

    /// Rows of one (sandbox, service), oldest first (all of them).
    pub fn requests(&self, sandbox: &str, service: &str) -> Vec<log::RequestRow> {
        let q = log::RequestsQuery {
            limit: usize::MAX,
            descending: false,
            since_id: 0,
            tier: None,
        };
        self.state().log.query(sandbox, service, &q)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // No code path panics while holding the lock; if one did, the log and store are
        // still consistent row by row, so keep serving rather than poisoning the twin.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Answers one request. Never fails: every problem becomes a JSON error
    /// response. Public for the fuzz target that drives it in-process.
    #[doc(hidden)]
    pub async fn handle<B>(self: Arc<Self>, req: Request<B>) -> Response<Full<Bytes>>
    where
        B: hyper::body::Body<Data = Bytes>,
        B::Error: std::error::Error + Send + Sync + 'static,
    {
        let path = req.uri().path().to_string();
        if path == "/healthz" {
            return json_response(StatusCode::OK, &json!({"status": "ok"}), None);
        }
        let Some((sandbox, service, rest)) = split_service_path(&path) else {
            let body = fixtures::vendor_error(
                ErrorStyle::Generic,
                404,
                &format!("not a twin path: {path} (expected /s/{{sandbox}}/{{service}}/…)"),
                None,
                None,
            );
            return json_response(StatusCode::NOT_FOUND, &body, None);
        };
        let control = rest == "/veris" || rest.starts_with("/veris/");
        // Before anything else about a vendor request, so a caller without the
        // credential learns nothing (not even whether the sandbox exists) and
        // leaves no row behind.
        if !control && !self.authorized(req.headers()) {
            return unauthorized();
        }
        if self.sandbox.as_deref().is_some_and(|s| s != sandbox) {
            let body = fixtures::vendor_error(
                ErrorStyle::Generic,
                404,
                &format!("unknown sandbox {sandbox:?}"),
                None,
                None,
            );
            return json_response(StatusCode::NOT_FOUND, &body, None);
        }
        let mut recorder = Recorder {
            twin: Arc::clone(&self),
            sandbox: sandbox.to_string(),
            service: service.to_string(),
            method: req.method().to_string(),
            path: rest.to_string(),
            tier: if control {
                Tier::Control
            } else {
                Tier::Handler
            },
            start: Instant::now(),
            done: false,
        };
        let response = if control {
            self.control(req, &recorder.sandbox, &recorder.service, &recorder.path)
        } else {
            let (sandbox, service, rest) = (
                recorder.sandbox.clone(),
                recorder.service.clone(),
                recorder.path.clone(),
            );
            self.vendor(req, &sandbox, &service, &rest, &mut recorder)
                .await
        };
        recorder.finish(response.status().as_u16());
        response
    }

    /// True when no credential is configured, or the request carries it as
    /// `Authorization: Bearer <credential>` (compared in constant time).
    fn authorized(&self, headers: &HeaderMap) -> bool {
        let Some(expected) = &self.credential else {
            return true;
        };
        let Some(presented) = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
        else {
            return false;
        };
        // `ct_eq` on slices of unequal length is false without comparing bytes:
        // the length of a fixed-size credential is no secret.
        bool::from(presented.as_bytes().ct_eq(expected.as_bytes()))
    }

    /// The headers a fixture's templates see: with a credential, the proxy
    /// sent its own `Authorization` and moved the client's to
    /// `X-Veris-Original-Authorization`, so put the client's back (and never
    /// let a template echo the credential).
    fn client_headers<'h>(&self, headers: &'h HeaderMap) -> std::borrow::Cow<'h, HeaderMap> {
        if self.credential.is_none() {
            return std::borrow::Cow::Borrowed(headers);
        }
        let mut view = headers.clone();
        view.remove(http::header::AUTHORIZATION);
        if let Some(original) = view.remove(ORIGINAL_AUTHORIZATION) {
            view.insert(http::header::AUTHORIZATION, original);
        }
        std::borrow::Cow::Owned(view)
    }

    fn control<B>(
        &self,
        req: Request<B>,
        sandbox: &str,
        service: &str,
        rest: &str,
    ) -> Response<Full<Bytes>> {
        let detail =
            |status: StatusCode, d: String| json_response(status, &json!({"detail": d}), None);
        let endpoint = rest.trim_end_matches('/');
        if !matches!(endpoint, "/veris/health" | "/veris/requests") {
            return detail(StatusCode::NOT_FOUND, format!("no control endpoint {rest}"));
        }
        if req.method() != Method::GET {
            let mut resp = detail(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{endpoint} only answers GET"),
            );
            resp.headers_mut()
                .insert(http::header::ALLOW, HeaderValue::from_static("GET"));
            return resp;
        }
        if endpoint == "/veris/health" {
            return json_response(
                StatusCode::OK,
                &json!({"status": "ok", "service": service}),
                None,
            );
        }
        let query = parse_query(req.uri().query());
        match log::parse_requests_query(&query) {
            Ok(q) => {
                let rows = self.state().log.query(sandbox, service, &q);
                json_response(StatusCode::OK, &json!({"requests": rows}), None)
            }
            Err(d) => detail(StatusCode::UNPROCESSABLE_ENTITY, d),
        }
    }

    async fn vendor<B>(
        &self,
        req: Request<B>,
        sandbox: &str,
        service: &str,
        rest: &str,
        recorder: &mut Recorder,
    ) -> Response<Full<Bytes>>
    where
        B: hyper::body::Body<Data = Bytes>,
        B::Error: std::error::Error + Send + Sync + 'static,
    {
        let style = self.fixtures.error_style(service);
        let method = req.method().as_str().to_string();
        let error = |status: StatusCode, body: Value| json_response(status, &body, None);
        let Some((fx, params)) = self.fixtures.find(service, &method, rest) else {
            return error(
                StatusCode::NOT_FOUND,
                fixtures::unknown_route(style, &method, rest),
            );
        };
        if fx.fault.is_some() {
            recorder.tier = Tier::Fault;
        }

        let (parts, body) = req.into_parts();
        let too_large = parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .is_some_and(|n| n > MAX_BODY as u64);
        let bytes = if too_large {
            None
        } else {
            match Limited::new(body, MAX_BODY).collect().await {
                Ok(c) => Some(c.to_bytes()),
                Err(e)
                    if e.downcast_ref::<http_body_util::LengthLimitError>()
                        .is_some() =>
                {
                    None
                }
                Err(_) => {
                    let msg = "the request body could not be read";
                    return error(
                        StatusCode::BAD_REQUEST,
                        fixtures::vendor_error(style, 400, msg, None, None),
                    );
                }
            }
        };
        let Some(bytes) = bytes else {
            let msg = format!("request body larger than {MAX_BODY} bytes");
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                fixtures::vendor_error(style, 413, &msg, None, None),
            );
        };
        let body = match parse_body(&parts.headers, &bytes) {
            Ok(v) => v,
            Err(msg) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    fixtures::vendor_error(style, 400, &msg, None, None),
                )
            }
        };
        let query = parse_query(parts.uri.query());
        let client_headers = self.client_headers(&parts.headers);
        let cx = Context {
            params: &params,
            body: &body,
            query: &query,
            headers: &client_headers,
            method: &method,
            path: rest,
            service,
            sandbox,
            list: None,
            ids: &self.ids,
        };
        // The fixture's body, or `{}` (the list itself for a list fixture without a body).
        let render_body = |cx: &Context<'_>| -> Value {
            match (&fx.body, cx.list) {
                (Some(node), _) => node.render(cx),
                (None, Some(list)) => Value::Array(list.to_vec()),
                (None, None) => json!({}),
            }
        };
        let render_str = |t: &crate::template::StrTemplate| t.render_string(&cx);
        let headers: Vec<(http::HeaderName, HeaderValue)> = fx
            .headers
            .iter()
            .filter_map(|(name, t)| {
                Some((name.clone(), HeaderValue::from_str(&render_str(t)).ok()?))
            })
            .collect();
        let respond = |status: u16, body: &Value| {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            json_response(status, body, Some(&headers))
        };

        if let Some(fault) = fx.fault {
            if let Some(ms) = fault.hang_ms {
                // Dropping this future (client gone, shutdown) ends the hang; the recorder
                // still writes the row.
                tokio::time::sleep(Duration::from_millis(ms.min(MAX_HANG_MS))).await;
            }
            if let Some(status) = fault.status {
                let body = if fx.body.is_some() {
                    render_body(&cx)
                } else {
                    fixtures::fault_error(style, status)
                };
                return respond(status, &body);
            }
        }

        if let Some(field) = fx.required.iter().find(|f| {
            let path: Vec<&str> = f.split('.').collect();
            matches!(lookup_path(&body, &path), None | Some(Value::Null))
                || lookup_path(&body, &path) == Some(&json!(""))
        }) {
            let msg = match style {
                ErrorStyle::Stripe => format!("Missing required param: {field}."),
                _ => format!("Missing required field: {field}."),
            };
            return error(
                StatusCode::BAD_REQUEST,
                fixtures::vendor_error(style, 400, &msg, Some("parameter_missing"), Some(field)),
            );
        }

        match &fx.action {
            Action::Respond => respond(fx.status, &render_body(&cx)),
            Action::Store(collection) => {
                let object = render_body(&cx);
                let name = render_str(collection);
                match object.get("id").and_then(Value::as_str) {
                    Some(id) => {
                        let mut state = self.state();
                        let coll = state
                            .store
                            .entry((sandbox.to_string(), service.to_string(), name))
                            .or_default();
                        if coll
                            .objects
                            .insert(id.to_string(), object.clone())
                            .is_none()
                        {
                            coll.order.push(id.to_string());
                        }
                    }
                    None => tracing::warn!(
                        service,
                        path = rest,
                        "store fixture rendered an object without a string id; not stored"
                    ),
                }
                if style == ErrorStyle::Stripe && (200..300).contains(&fx.status) {
                    self.emit(sandbox, service, &object, &client_headers);
                }
                respond(fx.status, &object)
            }
            Action::Lookup {
                collection,
                key,
                missing,
            } => {
                let name = render_str(collection);
                let id = params.get(key).cloned().unwrap_or_default();
                let found = self
                    .state()
                    .store
                    .get(&(sandbox.to_string(), service.to_string(), name))
                    .and_then(|c| c.objects.get(&id).cloned());
                match found {
                    Some(object) => respond(fx.status, &object),
                    None => {
                        let body = match missing {
                            Some(node) => node.render(&cx),
                            None => fixtures::vendor_error(
                                style,
                                404,
                                &format!("No such object: '{id}'"),
                                Some("resource_missing"),
                                Some(key),
                            ),
                        };
                        error(StatusCode::NOT_FOUND, body)
                    }
                }
            }
            Action::List { collection, order } => {
                let name = render_str(collection);
                let mut items: Vec<Value> = {
                    let state = self.state();
                    state
                        .store
                        .get(&(sandbox.to_string(), service.to_string(), name))
                        .map(|c| {
                            c.order
                                .iter()
                                .filter_map(|id| c.objects.get(id).cloned())
                                .collect()
                        })
                        .unwrap_or_default()
                };
                if *order == ListOrder::Desc {
                    items.reverse();
                }
                respond(
                    fx.status,
                    &render_body(&Context {
                        list: Some(&items),
                        ..cx
                    }),
                )
            }
        }
    }
}

/// Records exactly one row per request, even when the request future is dropped.
struct Recorder {
    twin: Arc<Twin>,
    sandbox: String,
    service: String,
    method: String,
    path: String,
    tier: Tier,
    start: Instant,
    done: bool,
}

impl Recorder {
    fn finish(&mut self, status: u16) {
        self.write(Some(status));
    }

    fn write(&mut self, status: Option<u16>) {
        if self.done {
            return;
        }
        self.done = true;
        let duration_ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let path = std::mem::take(&mut self.path);
        let row = NewRow {
            method: std::mem::take(&mut self.method),
            path: match self.twin.redact_path.get() {
                Some(redact) => redact(&path),
                None => path,
            },
            status,
            tier: self.tier,
            duration_ms,
        };
        self.twin
            .state()
            .log
            .record(&self.sandbox, &self.service, row);
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.write(None);
    }
}

/// Where the veris proxy puts the client's own `Authorization` when it sends
/// the twin credential in its place.
const ORIGINAL_AUTHORIZATION: &str = "x-veris-original-authorization";

/// The token of a `Bearer` authorization value (the scheme is case-insensitive,
/// RFC 9110 §11.1).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The answer to a vendor request without the proxy's credential.
fn unauthorized() -> Response<Full<Bytes>> {
    json_response(
        StatusCode::UNAUTHORIZED,
        &json!({
            "error": "twin_unauthorized",
            "message": "this twin only answers vendor requests sent by the veris proxy that started it; \
                        the request was not executed and not logged. Next: send it through the proxy \
                        (HTTPS_PROXY from the veris env file, or `veris run -- CMD`) using the vendor's \
                        own URL, not the twin's",
        }),
        None,
    )
}

/// Splits `/s/{sandbox}/{service}/{rest}` into its parts; `rest` keeps its leading `/`.
fn split_service_path(path: &str) -> Option<(&str, &str, &str)> {
    let tail = path.strip_prefix("/s/")?;
    let (sandbox, tail) = tail.split_once('/')?;
    let (service, rest) = match tail.find('/') {
        Some(i) => (&tail[..i], &tail[i..]),
        None => (tail, "/"),
    };
    (!sandbox.is_empty() && !service.is_empty()).then_some((sandbox, service, rest))
}

fn json_response(
    status: StatusCode,
    body: &Value,
    headers: Option<&[(http::HeaderName, HeaderValue)]>,
) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for (name, value) in headers.unwrap_or_default() {
        resp.headers_mut().insert(name.clone(), value.clone());
    }
    resp
}

/// Parses a query string into a map (the last value of a repeated key wins).
pub(crate) fn parse_query(query: Option<&str>) -> BTreeMap<String, String> {
    query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (form_decode(k), form_decode(v))
        })
        .collect()
}

fn form_decode(s: &str) -> String {
    fixtures::percent_decode(&s.replace('+', " "))
}

/// Parses a request body: JSON when it says or looks so, else a (Stripe-style) form.
pub(crate) fn parse_body(headers: &HeaderMap, bytes: &[u8]) -> Result<Value, String> {
    let ctype = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let text = String::from_utf8_lossy(bytes);
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    let looks_json = trimmed.starts_with('{') || trimmed.starts_with('[');
    if ctype.contains("json") || (looks_json && !ctype.contains("x-www-form-urlencoded")) {
        return serde_json::from_str(trimmed).map_err(|e| format!("invalid JSON body: {e}"));
    }
    if ctype.is_empty() || ctype.contains("x-www-form-urlencoded") {
        let mut root = Value::Object(Map::new());
        for pair in trimmed.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            insert_form(&mut root, &form_decode(k), form_decode(v))?;
        }
        return Ok(root);
    }
    // Other bodies (multipart, binary uploads) are accepted but not parsed.
    Ok(Value::Object(Map::new()))
}

/// How deep a form key may nest (`a[b][c]…`). The twin shares the proxy's
/// process, and a value nested without bound would overflow the stack when
/// it is dropped or rendered: one request must never take the process down.
const MAX_FORM_DEPTH: usize = 32;

/// Inserts `a[b][c]=v` as nested objects and `a[]=v` as an array push (Stripe's encoding).
fn insert_form(root: &mut Value, key: &str, value: String) -> Result<(), String> {
    let mut parts: Vec<&str> = Vec::new();
    match key.find('[') {
        Some(i) if i > 0 && key.ends_with(']') => {
            parts.push(&key[..i]);
            parts.extend(key[i + 1..key.len() - 1].split("]["));
        }
        _ => parts.push(key),
    }
    if parts.len() > MAX_FORM_DEPTH {
        return Err(format!(
            "form key nested {} levels deep; at most {MAX_FORM_DEPTH} are accepted",
            parts.len()
        ));
    }
    let mut cur = root;
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let next_is_array = parts.get(i + 1).is_some_and(|p| p.is_empty());
        let fresh = || {
            if last {
                Value::Null
            } else if next_is_array {
                Value::Array(Vec::new())
            } else {
                Value::Object(Map::new())
            }
        };
        let slot = if part.is_empty() {
            // `[]` appends to the array the previous step made sure exists.
            let Value::Array(items) = cur else {
                return Ok(());
            };
            items.push(fresh());
            let Some(slot) = items.last_mut() else {
                return Ok(());
            };
            slot
        } else {
            let Value::Object(map) = cur else {
                return Ok(());
            };
            let slot = map.entry(part.to_string()).or_insert_with(fresh);
            let fits = last
                || if next_is_array {
                    slot.is_array()
                } else {
                    slot.is_object()
                };
            if !fits {
                *slot = fresh();
            }
            slot
        };
        if last {
            *slot = Value::String(value);
            return Ok(());
        }
        cur = slot;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_key_nested_without_bound_is_refused_not_a_crash() {
        let key = format!("a{}", "[b]".repeat(300_000));
        let body = format!("{key}=1");
        let err = parse_body(&HeaderMap::new(), body.as_bytes()).unwrap_err();
        assert!(err.contains("nested"), "{err}");
        let ok = format!("a{}=1", "[b]".repeat(MAX_FORM_DEPTH - 1));
        assert!(parse_body(&HeaderMap::new(), ok.as_bytes()).is_ok());
    }

    /// JSON bodies are bounded by serde_json's nesting limit (128): deeper
    /// is a 400 with words, not a stack overflow; a body just inside parses.
    #[test]
    fn json_nested_beyond_the_limit_is_refused_with_a_message() {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let err = parse_body(&headers, deep.as_bytes()).unwrap_err();
        assert!(err.contains("recursion limit"), "{err}");
        let ok = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert!(parse_body(&headers, ok.as_bytes()).is_ok());
        // Sniffed as JSON without a content type: the same bound.
        assert!(parse_body(&HeaderMap::new(), deep.as_bytes()).is_err());
    }

    /// A form body is bounded by the 1 MiB body cap in count, and by the
    /// depth cap in nesting: 100,000 pairs parse, each key within 32 levels.
    #[test]
    fn many_form_pairs_parse_within_the_body_cap() {
        let body = "a[]=1&".repeat(100_000);
        assert!(body.len() <= MAX_BODY);
        let v = parse_body(&HeaderMap::new(), body.as_bytes()).expect("parses");
        assert_eq!(v["a"].as_array().map(Vec::len), Some(100_000));
    }

    #[tokio::test]
    async fn a_dropped_hang_still_records_its_row() {
        let fixtures = Fixtures::from_json(
            r#"[{"service":"acme","method":"GET","path":"/hang","fault":{"hang_ms":60000}}]"#,
        )
        .expect("fixtures load");
        let twin = Twin::new(TwinOptions {
            fixtures,
            sandbox: None,
            log: None,
            credential: None,
        })
        .expect("twin builds");
        let req = Request::get("/s/sbx/acme/hang")
            .body(Full::new(Bytes::new()))
            .expect("request builds");
        // A zero timeout polls the request once (it parks in the hang) and then drops it,
        // exactly what hyper does when the client goes away.
        let outcome = tokio::time::timeout(Duration::ZERO, Arc::clone(&twin).handle(req)).await;
        assert!(outcome.is_err(), "the hang must not answer at once");
        let rows = twin.requests("sbx", "acme");
        assert_eq!(rows.len(), 1);
        assert_eq!(
            (rows[0].status, rows[0].tier, rows[0].path.as_str()),
            (None, Tier::Fault, "/hang")
        );
    }

    /// The built-in twin with no sandbox or log, behind `credential`.
    fn builtin_twin(credential: Option<&str>) -> Arc<Twin> {
        Twin::new(TwinOptions {
            fixtures: Fixtures::builtin(),
            sandbox: None,
            log: None,
            credential: credential.map(str::to_string),
        })
        .expect("twin builds")
    }

    /// A triggered event carries an object of the twin's own shape with a
    /// fresh id, is not stored, and unknown types or services are refused.
    #[test]
    fn fixture_events_carry_the_twins_objects() {
        let twin = builtin_twin(None);
        for kind in event::STRIPE_TYPES {
            let e = twin.fixture_event("stripe", kind).expect(kind);
            let v: Value = serde_json::from_slice(&e.payload).unwrap();
            assert_eq!(v["type"], *kind);
            assert!(e.id.starts_with("evt_"));
            let object = &v["data"]["object"];
            assert!(event::stripe_types(object).contains(kind), "{v}");
        }
        let a = twin.fixture_event("stripe", "customer.created").unwrap();
        let b = twin.fixture_event("stripe", "customer.created").unwrap();
        let id = |e: &Event| {
            serde_json::from_slice::<Value>(&e.payload).unwrap()["data"]["object"]["id"].clone()
        };
        assert_ne!(id(&a), id(&b));
        assert!(id(&a).as_str().unwrap().starts_with("cus_"));
        // The same fields as a customer the workload creates.
        let v: Value = serde_json::from_slice(&a.payload).unwrap();
        for field in ["object", "email", "livemode", "created", "metadata"] {
            assert!(v["data"]["object"].get(field).is_some(), "{field}");
        }
        assert!(twin.state().store.is_empty(), "a trigger stores nothing");
        assert!(twin
            .fixture_event("stripe", "charge.refunded")
            .unwrap_err()
            .contains("customer.created"));
        assert!(twin.fixture_event("github", "customer.created").is_err());
    }

    #[tokio::test]
    async fn the_request_log_keeps_the_redacted_path() {
        fn hide_keys(path: &str) -> String {
            path.replace("sk_live_abc", "[redacted]")
        }
        let twin = builtin_twin(None);
        twin.redact_paths_with(hide_keys);
        let req = Request::post("/s/sbx/stripe/v1/keys/sk_live_abc/roll")
            .body(Full::new(Bytes::new()))
            .expect("request builds");
        let _ = Arc::clone(&twin).handle(req).await;
        let rows = twin.requests("sbx", "stripe");
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].path, "/v1/keys/[redacted]/roll");
    }

    /// Only objects the twin stored give events, each carrying the object;
    /// a request that fails (missing field) or only reads gives none.
    #[tokio::test]
    async fn stored_stripe_objects_give_events_with_the_object() {
        let twin = builtin_twin(None);
        let (tx, mut rx, _) = crate::webhook::channel(16);
        twin.send_events_to(tx);
        let post = |path: &str, body: &'static str| {
            Request::post(format!("/s/sbx/stripe{path}"))
                .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                .header("idempotency-key", "key-1")
                .body(Full::new(Bytes::from_static(body.as_bytes())))
                .expect("request builds")
        };
        let resp = Arc::clone(&twin)
            .handle(post(
                "/v1/charges",
                "amount=2000&currency=usd&source=tok_visa",
            ))
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        let charge: Value =
            serde_json::from_slice(&resp.into_body().collect().await.expect("body").to_bytes())
                .expect("json");
        let event = rx.try_recv().expect("one event");
        assert_eq!(
            (event.service.as_str(), event.kind.as_str()),
            ("stripe", "charge.succeeded")
        );
        let payload: Value = serde_json::from_slice(&event.payload).expect("json payload");
        assert_eq!(payload["id"], event.id.as_str());
        assert_eq!(payload["data"]["object"], charge);
        assert_eq!(payload["request"]["idempotency_key"], "key-1");
        assert!(rx.try_recv().is_err(), "one charge, one event");

        let _ = Arc::clone(&twin)
            .handle(
                Request::get("/s/sbx/stripe/v1/charges")
                    .body(Full::new(Bytes::new()))
                    .expect("builds"),
            )
            .await;
        let _ = Arc::clone(&twin)
            .handle(post("/v1/test/fault/500", ""))
            .await;
        assert!(rx.try_recv().is_err(), "reads and faults give no event");
    }

    /// Attack: a workload that calls the built-in twin's port itself
    /// (without the proxy's credential) makes no object, so no event: only
    /// requests the twin served for the proxy give webhooks.
    #[tokio::test]
    async fn a_direct_call_without_the_credential_gives_no_event() {
        let twin = builtin_twin(Some("proxy-secret"));
        let (tx, mut rx, _) = crate::webhook::channel(16);
        twin.send_events_to(tx);
        let charge = |auth: Option<&str>| {
            let mut req = Request::post("/s/sbx/stripe/v1/charges")
                .header(CONTENT_TYPE, "application/x-www-form-urlencoded");
            if let Some(a) = auth {
                req = req.header(http::header::AUTHORIZATION, a);
            }
            req.body(Full::new(Bytes::from_static(b"amount=100&currency=usd")))
                .expect("request builds")
        };
        let resp = Arc::clone(&twin).handle(charge(None)).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        let resp = Arc::clone(&twin).handle(charge(Some("Bearer guess"))).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        assert!(rx.try_recv().is_err(), "no event without the credential");
        let resp = Arc::clone(&twin)
            .handle(charge(Some("Bearer proxy-secret")))
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(rx.try_recv().expect("an event").kind, "charge.succeeded");
    }

    #[test]
    fn bearer_tokens_parse_with_any_case_scheme() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("BEARER abc"), Some("abc"));
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearerabc"), None);
    }

    #[test]
    fn service_paths_split() {
        assert_eq!(
            split_service_path("/s/sbx/stripe/v1/charges"),
            Some(("sbx", "stripe", "/v1/charges"))
        );
        assert_eq!(
            split_service_path("/s/sbx/stripe"),
            Some(("sbx", "stripe", "/"))
        );
        assert_eq!(split_service_path("/s/sbx"), None);
        assert_eq!(split_service_path("/x/sbx/stripe"), None);
    }

    #[test]
    fn stripe_form_bodies_nest() {
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        let body = b"amount=2000&currency=usd&metadata[order_id]=6735&expand[]=customer&expand[]=invoice&description=a+b%21";
        let v = parse_body(&headers, body).expect("parses");
        assert_eq!(
            v,
            json!({"amount": "2000", "currency": "usd", "metadata": {"order_id": "6735"},
                   "expand": ["customer", "invoice"], "description": "a b!"})
        );
    }

    #[test]
    fn json_bodies_parse_and_bad_json_is_an_error() {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        assert_eq!(
            parse_body(&headers, br#"{"a":{"b":1}}"#),
            Ok(json!({"a": {"b": 1}}))
        );
        assert!(parse_body(&headers, b"{nope").is_err());
        assert_eq!(
            parse_body(&HeaderMap::new(), br#"{"x":1}"#),
            Ok(json!({"x": 1}))
        );
    }
}
