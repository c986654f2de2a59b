//! The admin API: a small HTTP/1.1 server on its own listener (never the
//! proxy port) through which the receipt reader, the TUI and CI talk to a
//! live proxy. It owns authentication (a bearer token generated per start)
//! and the endpoints; it reads the ledger file and follows the ledger's
//! commit stream, and appends seals on demand. It binds nothing, reads no
//! env and installs no signal handler: [`serve_admin`] takes a bound listener.
//!
//! - `GET /healthz`: open; `{"status":"ok"}`.
//! - `GET /status`: run id, canary, sandbox, twin, mode, tier, proxy URL,
//!   uptime, head seq and per-kind line counters since this run's session.
//! - `GET /ledger?since=SEQ`: the ledger lines with `seq > SEQ`, as JSONL,
//!   streamed from the file in chunks from the writer's index offset.
//! - `GET /events`: server-sent events, one per ledger line as it is
//!   committed (`id:` = seq, `event: line`, `data:` = the line), starting
//!   after `Last-Event-ID` (or `?since=`) when given, else with new lines.
//! - `POST /seal`: appends a seal (`reason: demand`) and returns it.
//! - `GET /receipt?since=SEQ`: seals the head (reusing the head seal when
//!   nothing was written since), then returns the receipt JSON for the
//!   window `(SEQ, seal]` (default: this run's lines).
//! - `GET /metrics`: Prometheus metrics in the text format ([`crate::admin::metrics`]).
//! - `POST /webhooks/trigger?service=S&event=E`, `POST
//!   /webhooks/replay?event_id=ID`: a webhook delivery on demand
//!   ([`webhooks`]; `veris trigger`, `veris replay`).
//!
//! Everything but `/healthz` (and `/metrics` when [`Admin::metrics_open`])
//! needs `Authorization: Bearer <token>` and answers 401 otherwise. The
//! token never reaches a log or a metric.

pub mod metrics;
pub mod process;
pub mod summary;
mod webhooks;

use std::convert::Infallible;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};
use veris_receipt::ledger::{Committed, Ledger, LineReader, RawLine, SealInfo};
use veris_receipt::receipt::{self, Anchor, Check, LiveChannel, Options, WindowSpec};
use veris_receipt::seal::{PublicKeys, Sealer};

use prometheus_client::registry::Registry;

use subtle::ConstantTimeEq;
use veris_accept::{accept_until, OnError};

use crate::body::{self, ProxyBody};
use crate::request::respond;
use crate::Identity;

/// How often an idle event stream gets a comment line, so intermediaries and
/// clients can tell a quiet ledger from a dead connection.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// The window a `/receipt` request asks about, handed to [`ReceiptChecks`].
#[derive(Debug, Clone)]
pub struct ReceiptWindow {
    pub since: u64,
    pub until: u64,
}

/// Checks the binary runs for `/receipt` beyond what the ledger proves
/// (the twin cross-check); their results join the receipt's integrity.
pub type ReceiptChecks = Arc<dyn Fn(ReceiptWindow) -> BoxFuture<'static, Vec<Check>> + Send + Sync>;

/// What the admin API serves.
pub struct Admin {
    /// The bearer token (32 random bytes, hex) every endpoint but `/healthz` needs.
    pub token: String,
    pub identity: Identity,
    /// The proxy listener's URL (explicit tier).
    pub proxy_url: String,
    /// Twin base URL (no credentials).
    pub twin: String,
    /// Routed services: `(name, upstream base URL)`.
    pub services: Vec<(String, String)>,
    /// Seq of this run's session line.
    pub session_seq: u64,
    pub ledger: Arc<Ledger>,
    pub sealer: Arc<Sealer>,
    /// `ledger.pub`, read for every receipt (a key added by a restart counts).
    pub public_keys: PathBuf,
    pub started: Instant,
    pub receipt_checks: Option<ReceiptChecks>,
    /// Called on the blocking thread after a receipt read, so the memory it
    /// freed can be handed back (the binary trims the allocator's arenas).
    pub after_read: Option<fn()>,
    /// What `/metrics` encodes (`None`: it answers 404).
    pub metrics: Option<Registry>,
    /// `/metrics` answers without the token (`serve --metrics-open`), for a
    /// scraper that cannot be given it; the rest still needs it.
    pub metrics_open: bool,
    /// Requests the proxy sent to the twin but could not record, for a
    /// reader's twin cross-check (`/status`).
    pub unrecorded: Arc<crate::request::recorder::Unrecorded>,
    /// Where publishing the ledger to NATS stands (`--nats`), for `/status`.
    pub publishing: Option<StatusFn>,
    /// The webhook engine's on-demand deliveries (`--webhook`), for
    /// `/webhooks/*`.
    pub webhooks: Option<crate::callback::Control>,
    /// The ingress for an external twin's deliveries (`POST
    /// /ingress/{service}`, its own token).
    pub ingress: Option<Arc<crate::callback::Ingress>>,
}

/// A part of `/status` the binary supplies.
pub type StatusFn = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// Serves the admin API until `shutdown` resolves; open event streams end then.
pub async fn serve_admin(
    listener: TcpListener,
    admin: Arc<Admin>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let cancel = CancellationToken::new();
    let tasks = TaskTracker::new();
    accept_until(listener, shutdown, OnError::Retry, |stream, peer| {
        let admin = admin.clone();
        let cancel = cancel.clone();
        tasks.spawn(async move {
            let conn_cancel = cancel.clone();
            let service = service_fn(move |req: Request<Incoming>| {
                let admin = admin.clone();
                let cancel = cancel.clone();
                async move { Ok::<_, Infallible>(handle(admin, req, cancel).await) }
            });
            if let Err(e) = crate::inbound::http::serve_http1(
                stream,
                service,
                &conn_cancel,
                crate::Limits::default().request_head,
            )
            .await
            {
                debug!(error = %e, %peer, "admin connection ended with an error");
            }
        });
    })
    .await?;
    cancel.cancel();
    tasks.close();
    // Streams stop at the cancel; a stuck client must not hold shutdown.
    let _ = tokio::time::timeout(Duration::from_secs(2), tasks.wait()).await;
    Ok(())
}

/// One admin request: what [`serve_admin`] answers, for a server that
/// routes to several (a gateway's sandboxes, each an [`Admin`] of its own).
pub async fn handle(
    admin: Arc<Admin>,
    req: Request<Incoming>,
    cancel: CancellationToken,
) -> Response<ProxyBody> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    if path == "/healthz" && method == Method::GET {
        return respond::json(StatusCode::OK, json!({"status": "ok"}));
    }
    if path == "/metrics" && method == Method::GET && admin.metrics_open {
        return metrics(&admin, req.headers());
    }
    // The ingress checks its own token: the external twin never holds the
    // admin token.
    if let Some(service) = path.strip_prefix("/ingress/") {
        return match &admin.ingress {
            Some(ingress) => ingress.handle(service, req).await,
            None => respond::error(
                StatusCode::NOT_FOUND,
                "veris_no_ingress",
                "this proxy has no webhook ingress: it takes an external twin's deliveries only when started with --twin and --webhook".into(),
                json!({}),
            ),
        };
    }
    if !authorized(req.headers(), &admin.token) {
        return unauthorized();
    }
    let since = match query_u64(req.uri().query(), "since") {
        Ok(since) => since,
        // A typo must not widen a receipt's window to the whole ledger.
        Err(bad) => {
            return respond::error(
                StatusCode::BAD_REQUEST,
                "veris_bad_since",
                format!(
                    "`since` must be a line number (0 to {}), not {bad:?}",
                    u64::MAX
                ),
                json!({}),
            )
        }
    };
    match (method, path.as_str()) {
        (Method::GET, "/status") => status(&admin).await,
        (Method::GET, "/ledger") => ledger_lines(&admin, since.unwrap_or(0)).await,
        (Method::GET, "/events") => {
            let last = last_event_id(req.headers()).or(since);
            events(admin, last, cancel)
        }
        (Method::POST, "/seal") => match seal(&admin, false).await {
            Ok(info) => respond::json(StatusCode::OK, json!(info)),
            Err(resp) => resp,
        },
        (Method::GET, "/receipt") => receipt_json(&admin, since).await,
        (Method::GET, "/metrics") => metrics(&admin, req.headers()),
        (Method::POST, "/webhooks/trigger") => webhooks::trigger(&admin, req.uri().query()),
        (Method::POST, "/webhooks/replay") => webhooks::replay(&admin, req.uri().query()),
        (
            _,
            "/status" | "/ledger" | "/events" | "/seal" | "/receipt" | "/metrics"
            | "/webhooks/trigger" | "/webhooks/replay",
        ) => respond::error(
            StatusCode::METHOD_NOT_ALLOWED,
            "veris_method_not_allowed",
            format!("{} does not take this method", path),
            json!({}),
        ),
        _ => respond::error(
            StatusCode::NOT_FOUND,
            "veris_not_found",
            format!("no admin endpoint {path}; see /status, /ledger, /events, /seal, /receipt, /metrics"),
            json!({}),
        ),
    }
}

/// The 401 of every endpoint that needs the token.
fn unauthorized() -> Response<ProxyBody> {
    let mut resp = respond::error(
        StatusCode::UNAUTHORIZED,
        "veris_unauthorized",
        "this endpoint needs `Authorization: Bearer <token>`. Next: read the token from <state>/admin.token".into(),
        json!({}),
    );
    resp.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"veris\""),
    );
    resp
}

/// Constant-time comparison of the presented bearer token with ours.
pub(crate) fn authorized(headers: &HeaderMap, token: &str) -> bool {
    let Some(presented) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    // `ct_eq` on slices of unequal length is false without comparing bytes.
    bool::from(presented.trim().as_bytes().ct_eq(token.as_bytes()))
}

/// The parameter `name`'s raw value, when the query has it.
fn query_param<'q>(query: Option<&'q str>, name: &str) -> Option<&'q str> {
    query
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The parameter `name` as a number: `Ok(None)` when absent, `Err` with the
/// value when it is there but not a `u64`.
fn query_u64(query: Option<&str>, name: &str) -> Result<Option<u64>, String> {
    let Some(value) = query_param(query, name) else {
        return Ok(None);
    };
    value
        .parse()
        .map(Some)
        .map_err(|_| value.chars().take(40).collect())
}

fn last_event_id(headers: &HeaderMap) -> Option<u64> {
    headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// Bytes of lines gathered before they are sent as one chunk of a body.
const CHUNK: usize = 64 * 1024;

/// How a streamed line is framed.
#[derive(Clone, Copy)]
enum Framing {
    /// JSONL, as in the file.
    Lines,
    /// One server-sent event per line.
    Events,
}

/// Opens the ledger file for [`send_lines`]; a missing file has no lines.
fn open_ledger(admin: &Admin) -> std::io::Result<Option<std::fs::File>> {
    match std::fs::File::open(admin.ledger.path()) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Sends the complete lines of `file` with `seq > since` to `tx`, framed,
/// in chunks of about [`CHUNK`] bytes, and returns the last seq sent (or
/// `since`). It starts at the writer's index offset for `since` (falling
/// back to the start when what is there is not the line expected: a file
/// changed behind the writer's back) and stops at the file's length when it
/// started (a partial last line is left out), so memory stays at one chunk
/// whatever the ledger's size.
/// Runs on a blocking thread; stops early when the receiver is gone.
fn send_lines(
    ledger: &Ledger,
    mut file: std::fs::File,
    since: u64,
    framing: Framing,
    tx: &mpsc::Sender<Bytes>,
) -> std::io::Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    #[derive(serde::Deserialize)]
    struct SeqOnly {
        seq: u64,
    }
    let seq_of = |raw: &[u8]| serde_json::from_slice::<SeqOnly>(raw).ok().map(|s| s.seq);
    let (mut offset, written) = ledger.position_after(since);
    // What the file holds now (a file changed behind the writer's back may
    // be longer than what it wrote); lines appended later are not waited for.
    let end = written.max(file.metadata()?.len());
    let mut buf = Vec::new();
    if offset > 0 {
        file.seek(SeekFrom::Start(offset))?;
        let mut probe = LineReader::at((&file).take(end.saturating_sub(offset)), offset);
        let fits = matches!(probe.next_into(&mut buf)?, Some(RawLine::Line))
            && seq_of(&buf).is_some_and(|s| s <= since.saturating_add(1));
        if !fits {
            offset = 0;
        }
        file.seek(SeekFrom::Start(offset))?;
    }
    let mut lines = LineReader::at((&file).take(end.saturating_sub(offset)), offset);
    let mut chunk = Vec::with_capacity(CHUNK + 1024);
    let mut last = since;
    while let Some(raw) = lines.next_into(&mut buf)? {
        if raw != RawLine::Line {
            continue;
        }
        let Some(seq) = seq_of(&buf).filter(|s| *s > since) else {
            continue;
        };
        match framing {
            Framing::Lines => {
                chunk.extend_from_slice(&buf);
                chunk.push(b'\n');
            }
            Framing::Events => {
                chunk.extend_from_slice(format!("id: {seq}\nevent: line\ndata: ").as_bytes());
                chunk.extend_from_slice(&buf);
                chunk.extend_from_slice(b"\n\n");
            }
        }
        last = last.max(seq);
        if chunk.len() >= CHUNK {
            let full = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK + 1024));
            if tx.blocking_send(Bytes::from(full)).is_err() {
                return Ok(last);
            }
        }
    }
    if !chunk.is_empty() {
        let _ = tx.blocking_send(Bytes::from(chunk));
    }
    Ok(last)
}

/// A response body fed by a channel of chunks.
fn channel_body(rx: mpsc::Receiver<Bytes>) -> ProxyBody {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, body::BoxError>(Frame::data(b)), rx))
    });
    http_body_util::StreamBody::new(stream).boxed()
}

fn unreadable(e: std::io::Error) -> Response<ProxyBody> {
    respond::error(
        StatusCode::SERVICE_UNAVAILABLE,
        "veris_ledger_unavailable",
        format!("cannot read the ledger file ({e}). Next: check the state dir's permissions and free space"),
        json!({}),
    )
}

async fn status(admin: &Admin) -> Response<ProxyBody> {
    // Kept by the writer since this run's session line: no file read.
    let counters = admin.ledger.counters();
    let id = &admin.identity;
    respond::json(
        StatusCode::OK,
        json!({
            "veris_proxy": true,
            "run_id": id.run_id,
            "canary": id.canary,
            "sandbox_id": id.sandbox_id,
            "twin": admin.twin,
            "mode": id.mode,
            "tier": id.tier,
            "proxy_url": admin.proxy_url,
            "pid": std::process::id(),
            "uptime_s": admin.started.elapsed().as_secs(),
            "session_seq": admin.session_seq,
            "head_seq": admin.ledger.head().0,
            "key_id": admin.sealer.key_id(),
            "public_key": admin.sealer.public_key_hex(),
            "tampered": admin.ledger.tampered(),
            "services": admin.services.iter().map(|(name, upstream)| json!({"name": name, "upstream": upstream})).collect::<Vec<_>>(),
            "counters": counters,
            "unrecorded": admin.unrecorded.counts(),
            "publishing": admin.publishing.as_ref().map(|f| f()),
        }),
    )
}

/// `GET /metrics`: the registry encoded now (its collector reads the
/// counters as they are), in the format the scraper accepts.
fn metrics(admin: &Admin, headers: &HeaderMap) -> Response<ProxyBody> {
    match &admin.metrics {
        Some(registry) => crate::admin::metrics::response(registry, headers),
        None => respond::error(
            StatusCode::NOT_FOUND,
            "veris_not_found",
            "this admin API serves no metrics".into(),
            json!({}),
        ),
    }
}

async fn ledger_lines(admin: &Arc<Admin>, since: u64) -> Response<ProxyBody> {
    let file = match open_ledger(admin) {
        Ok(f) => f,
        Err(e) => return unreadable(e),
    };
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    if let Some(file) = file {
        let admin = admin.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = send_lines(&admin.ledger, file, since, Framing::Lines, &tx) {
                // The status is gone already: the body ends short.
                warn!(error = %e, "reading the ledger for /ledger failed");
            }
        });
    }
    let mut resp = Response::new(channel_body(rx));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// Appends a seal (`reuse`: unless the head is already this proxy's seal)
/// off the async threads, since the append waits on the ledger's lock.
async fn seal(admin: &Admin, reuse: bool) -> Result<SealInfo, Response<ProxyBody>> {
    let ledger = admin.ledger.clone();
    let sealer = admin.sealer.clone();
    let result = tokio::task::spawn_blocking(move || {
        if reuse {
            ledger.seal_head(&sealer, "demand")
        } else {
            ledger.seal(&sealer, "demand")
        }
    })
    .await;
    match result {
        Ok(Ok(info)) => Ok(info),
        Ok(Err(e)) => Err(respond::error(
            StatusCode::SERVICE_UNAVAILABLE,
            "veris_ledger_unavailable",
            format!("cannot append a seal ({e}). Next: check the state dir's free space and permissions"),
            json!({}),
        )),
        Err(e) => Err(respond::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "veris_internal",
            format!("seal task failed: {e}"),
            json!({}),
        )),
    }
}

async fn receipt_json(admin: &Admin, since: Option<u64>) -> Response<ProxyBody> {
    // A dashboard polls this: an idle ledger keeps its one head seal.
    let fresh = match seal(admin, true).await {
        Ok(info) => info,
        Err(resp) => return resp,
    };
    let since = since.unwrap_or(admin.session_seq.saturating_sub(1));
    let keys_path = admin.public_keys.clone();
    let keys = tokio::task::spawn_blocking(move || PublicKeys::load(&keys_path).ok())
        .await
        .ok()
        .flatten();
    let external_checks = match &admin.receipt_checks {
        Some(hook) => {
            hook(ReceiptWindow {
                since,
                until: fresh.seq,
            })
            .await
        }
        None => Vec::new(),
    };
    let options = Options {
        scope: WindowSpec::Since(since),
        service: None,
        proxy_live: true,
        until: Some(fresh.seq),
        // The reader found this API through state-dir files, which a
        // workload of this uid could point at a stand-in.
        anchor: Anchor::Live {
            seal: fresh,
            public_key: admin.sealer.public_key_hex(),
            channel: LiveChannel::StateDir,
        },
        hint_keys: keys,
        external_checks,
        pinned_key_file: None,
        seal_failure: None,
    };
    // A fold over the file, a line at a time: memory does not grow with
    // the ledger, and nothing of it is kept after the answer.
    let path = admin.ledger.path().to_path_buf();
    // Serialized here too, so that everything the read allocated is freed
    // before `after_read` hands it back; only the text leaves.
    let after_read = admin.after_read;
    let built = tokio::task::spawn_blocking(move || {
        let text = receipt::build_file(&path, &options).map(|r| json!(r).to_string());
        if let Some(release) = after_read {
            release();
        }
        text
    })
    .await;
    match built {
        Ok(Ok(text)) => respond::json_text(StatusCode::OK, text),
        Ok(Err(e)) => unreadable(std::io::Error::other(e.to_string())),
        Err(e) => unreadable(std::io::Error::other(e.to_string())),
    }
}

/// One SSE event for a ledger line.
fn event(seq: u64, text: &str) -> Bytes {
    Bytes::from(format!("id: {seq}\nevent: line\ndata: {text}\n\n"))
}

fn events(
    admin: Arc<Admin>,
    last_id: Option<u64>,
    cancel: CancellationToken,
) -> Response<ProxyBody> {
    // Subscribe before reading the file: a line committed in between is then
    // in the subscription, and the seq filter drops what the file already gave.
    let mut sub = admin.ledger.subscribe();
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    tokio::spawn(async move {
        let mut last = match last_id {
            Some(id) => id,
            None => admin.ledger.head().0,
        };
        if last_id.is_some() && !backlog(&admin, &mut last, &tx).await {
            return;
        }
        let mut keepalive = tokio::time::interval(KEEPALIVE);
        keepalive.tick().await;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tx.closed() => return,
                _ = keepalive.tick() => {
                    if tx.send(Bytes::from_static(b": keepalive\n\n")).await.is_err() {
                        return;
                    }
                }
                msg = sub.recv() => match msg {
                    Ok(Committed { seq, text }) => {
                        if seq > last {
                            if tx.send(event(seq, &text)).await.is_err() {
                                return;
                            }
                            last = seq;
                        }
                    }
                    // Fell behind the buffer: the file has every line.
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        if !backlog(&admin, &mut last, &tx).await {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    });
    let mut resp = Response::new(channel_body(rx));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// Sends the file's lines after `last`; false when the client is gone or the
/// file cannot be read (the stream then ends; the client resumes).
async fn backlog(admin: &Arc<Admin>, last: &mut u64, tx: &mpsc::Sender<Bytes>) -> bool {
    let file = match open_ledger(admin) {
        Ok(Some(f)) => f,
        Ok(None) => return true,
        Err(e) => {
            warn!(error = %e, "event stream cannot read the ledger");
            return false;
        }
    };
    let (admin, tx2, since) = (admin.clone(), tx.clone(), *last);
    let sent = tokio::task::spawn_blocking(move || {
        send_lines(&admin.ledger, file, since, Framing::Events, &tx2)
    })
    .await;
    match sent {
        Ok(Ok(seq)) => {
            *last = seq;
            !tx.is_closed()
        }
        Ok(Err(e)) => {
            warn!(error = %e, "event stream cannot read the ledger");
            false
        }
        Err(e) => {
            warn!(error = %e, "event stream backlog task failed");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_token_must_match_exactly() {
        let mut h = HeaderMap::new();
        assert!(!authorized(&h, "abc"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer abd"),
        );
        assert!(!authorized(&h, "abc"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer ab"));
        assert!(!authorized(&h, "abc"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert!(!authorized(&h, "abc"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer abc"),
        );
        assert!(authorized(&h, "abc"));
    }

    /// A live admin API over a real ledger of `n` request lines (after a
    /// session line), and its address.
    async fn admin_over(dir: &std::path::Path, n: u64) -> (Arc<Admin>, std::net::SocketAddr) {
        use veris_receipt::{BlockedLine, SessionLine};
        use veris_receipt::{Entry, ListenerTier, Mode};
        let (ledger, _) = Ledger::open(&dir.join("ledger.jsonl")).unwrap();
        let ledger = Arc::new(ledger);
        ledger
            .append(Entry::Session(SessionLine {
                run_id: "run_1".into(),
                sandbox_id: "sbx_1".into(),
                twin: "http://127.0.0.1:9/".into(),
                pid: 1,
                version: "0".into(),
                listen: "127.0.0.1:1".into(),
                ..SessionLine::test()
            }))
            .unwrap();
        let pending: Vec<_> = (0..n)
            .map(|i| {
                ledger.append_queued(Entry::Blocked(BlockedLine {
                    method: Some("GET".into()),
                    path: Some(format!("/{}", "p".repeat(200))),
                    reason: "strict".into(),
                    ..BlockedLine::test(&format!("host-{i}.example"))
                }))
            })
            .collect();
        for p in pending {
            p.await.unwrap();
        }
        let admin = Arc::new(Admin {
            token: "tok".into(),
            identity: Identity {
                run_id: "run_1".into(),
                sandbox_id: "sbx_1".into(),
                canary: "c".into(),
                mode: Mode::Passthrough,
                tier: ListenerTier::Explicit,
            },
            proxy_url: "http://127.0.0.1:1".into(),
            twin: "http://127.0.0.1:9".into(),
            services: Vec::new(),
            session_seq: 1,
            ledger,
            sealer: Arc::new(Sealer::generate().unwrap()),
            public_keys: dir.join("ledger.pub"),
            started: Instant::now(),
            receipt_checks: None,
            after_read: None,
            metrics: None,
            metrics_open: false,
            unrecorded: Arc::default(),
            publishing: None,
            webhooks: None,
            ingress: None,
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_admin(listener, admin.clone(), std::future::pending()));
        (admin, addr)
    }

    /// `curl` against the admin API; the body as bytes.
    async fn curl(addr: std::net::SocketAddr, path: &str) -> Vec<u8> {
        let url = format!("http://{addr}{path}");
        let out = tokio::process::Command::new("curl")
            .args(["-sS", "--fail", "-H", "Authorization: Bearer tok", &url])
            .env_remove("SSL_CERT_FILE")
            .env_remove("REQUESTS_CA_BUNDLE")
            .env_remove("CURL_CA_BUNDLE")
            .env_remove("NODE_EXTRA_CA_CERTS")
            .env("NO_PROXY", "*")
            .output()
            .await
            .expect("curl runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ledger_since_streams_from_the_middle_of_a_multi_chunk_ledger() {
        let dir = std::env::temp_dir().join(format!("veris-admin-ledger-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // ~300 bytes a line: several index entries and many 64 KiB chunks.
        let n = 3 * veris_receipt::ledger::INDEX_EVERY + 100;
        let (admin, addr) = admin_over(&dir, n).await;
        let file = std::fs::read(admin.ledger.path()).unwrap();
        assert!(file.len() > 10 * CHUNK, "{}", file.len());
        let all: Vec<&[u8]> = file.split_inclusive(|&b| b == b'\n').collect();
        for since in [
            0,
            1,
            1500,
            veris_receipt::ledger::INDEX_EVERY * 2,
            n,
            n + 1,
            n + 50,
        ] {
            let body = curl(addr, &format!("/ledger?since={since}")).await;
            let skip = (since as usize).min(all.len());
            let want = all[skip..].concat();
            assert!(
                body == want,
                "since={since}: {} bytes, want {}",
                body.len(),
                want.len()
            );
        }
        // A file rewritten behind the writer's back (offsets moved): still
        // the lines the file holds after `since`, found from the start.
        let mut shifted = b"{\"v\":2,\"seq\":0}\n".repeat(50);
        shifted.extend_from_slice(&file);
        std::fs::write(admin.ledger.path(), &shifted).unwrap();
        let body = curl(addr, "/ledger?since=2500").await;
        let want = all[2500..].concat();
        assert!(
            body == want,
            "shifted: {} bytes, want {}",
            body.len(),
            want.len()
        );
        // The counters come from the writer.
        let status: serde_json::Value =
            serde_json::from_slice(&curl(addr, "/status").await).unwrap();
        assert_eq!(status["counters"]["blocked"], n);
        assert_eq!(status["counters"]["session"], 1);
        assert_eq!(status["head_seq"], n + 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn since_is_read_from_the_query() {
        assert_eq!(query_u64(Some("since=12&x=1"), "since"), Ok(Some(12)));
        assert_eq!(query_u64(Some("x=1"), "since"), Ok(None));
        assert_eq!(query_u64(None, "since"), Ok(None));
        for bad in ["abc", "-1", "99999999999999999999999", ""] {
            assert_eq!(
                query_u64(Some(&format!("since={bad}")), "since"),
                Err(bad.to_string())
            );
        }
    }
}
