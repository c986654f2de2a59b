//! The live proxy, from both sides: starting its admin API and seal timer
//! (and announcing them in `<state>/admin.addr` and `<state>/admin.token`),
//! and, for readers, finding a live proxy through those files, talking to it,
//! and running the integrity checks that need the network (the canary and
//! the twin cross-check).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};
use veris_ca::fsutil::write_file;
use veris_proxy::admin::{Admin, ReceiptWindow};
use veris_proxy::recorder::UnrecordedCounts;
use veris_proxy::Proxy;
use veris_receipt::ledger::{Ledger, LedgerRead, SealInfo};
use veris_receipt::receipt::{Check, CheckStatus};
use veris_receipt::seal::Sealer;
use veris_receipt::{redact, Entry, ListenerTier};
use veris_receipt::{RequestLine, SessionLine, UpstreamErrorLine};

use crate::check::{ProbePath, DEFAULT_PROBE_ADDR};

/// Where the admin API's address is announced.
pub const ADDR_FILE: &str = "admin.addr";
/// Where the admin API's bearer token is kept (0600).
pub const TOKEN_FILE: &str = "admin.token";
/// Seals while traffic flows come at most this often.
const SEAL_INTERVAL: Duration = Duration::from_secs(1);
/// Bound on one admin or twin HTTP exchange.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on one answer read by [`http`] (a page of 1000 twin rows is ~150 KB).
const MAX_BODY: usize = 8 << 20;
/// Bound on the twin rows read per service (pages of 1000).
const TWIN_MAX_PAGES: usize = 100;

/// The admin API's listener, bound with its token and files written before
/// the session line (so a start that cannot bind it leaves the ledger as it
/// was); `None` inside for none (a run: no token exists that a same-uid
/// child could read).
pub struct AdminListener {
    bound: Option<(TcpListener, SocketAddr, String)>,
    files: Vec<PathBuf>,
}

impl AdminListener {
    pub fn addr(&self) -> Option<SocketAddr> {
        self.bound.as_ref().map(|b| b.1)
    }
}

/// Binds the admin listener and writes `admin.token` (0600, new each start)
/// then `admin.addr`.
pub async fn bind_admin(listen: Option<&str>, state_dir: &Path) -> Result<AdminListener> {
    let Some(listen) = listen else {
        return Ok(AdminListener {
            bound: None,
            files: Vec::new(),
        });
    };
    let listener = TcpListener::bind(listen).await.with_context(|| {
        format!(
            "binding the admin API to {listen}. Next: pick a free address with --admin (port 0 picks one)"
        )
    })?;
    let addr = listener.local_addr()?;
    let token = crate::random_hex(32)?;
    let token_path = state_dir.join(TOKEN_FILE);
    let addr_path = state_dir.join(ADDR_FILE);
    write_file(&token_path, format!("{token}\n").as_bytes(), 0o600)
        .with_context(|| format!("writing {}", token_path.display()))?;
    write_file(&addr_path, format!("{addr}\n").as_bytes(), 0o644)
        .with_context(|| format!("writing {}", addr_path.display()))?;
    Ok(AdminListener {
        bound: Some((listener, addr, token)),
        files: vec![addr_path, token_path],
    })
}

/// What [`start_admin`] needs.
pub struct AdminStart<'a> {
    pub listener: AdminListener,
    pub state_dir: &'a Path,
    pub proxy: &'a Arc<Proxy>,
    pub proxy_url: &'a str,
    pub twin: &'a str,
    pub session_seq: u64,
    pub ledger: Arc<Ledger>,
    pub sealer: Arc<Sealer>,
    pub shutdown: watch::Receiver<bool>,
    /// `/metrics` without the token (`serve --metrics-open`).
    pub metrics_open: bool,
}

/// The running admin API and seal timer.
pub struct AdminHandle {
    sealer: Arc<Sealer>,
    server: Option<JoinHandle<std::io::Result<()>>>,
    timer: JoinHandle<()>,
    files: Vec<PathBuf>,
}

fn seal_interval(ledger: &Ledger, sealer: &Sealer) {
    if let Err(e) = ledger.seal_if_unsealed(sealer, "interval") {
        warn!(error = %e, "cannot append an interval seal");
    }
}

/// Starts the seal timer and, when the listener is bound, the API.
pub fn start_admin(a: AdminStart<'_>) -> AdminHandle {
    let (ledger, sealer, mut rx) = (a.ledger.clone(), a.sealer.clone(), a.shutdown.clone());
    let timer = tokio::spawn(async move {
        let mut tick = tokio::time::interval(SEAL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = rx.wait_for(|s| *s) => return,
                // Every second while traffic flows, and at once when a
                // thousand lines wait: a crash leaves little unsealed.
                _ = tick.tick() => seal_interval(&ledger, &sealer),
                () = ledger.seal_due() => seal_interval(&ledger, &sealer),
            }
        }
    });
    let Some((listener, addr, token)) = a.listener.bound else {
        return AdminHandle {
            sealer: a.sealer,
            server: None,
            timer,
            files: Vec::new(),
        };
    };
    let services = service_refs(a.proxy.router());
    let admin = Arc::new(Admin {
        token: token.clone(),
        identity: a.proxy.identity().clone(),
        proxy_url: a.proxy_url.to_string(),
        twin: a.twin.to_string(),
        services: services
            .iter()
            .map(|s| (s.name.clone(), s.upstream.clone()))
            .collect(),
        session_seq: a.session_seq,
        ledger: a.ledger.clone(),
        sealer: a.sealer.clone(),
        public_keys: a.state_dir.join(veris_receipt::seal::PUB_FILE),
        started: Instant::now(),
        metrics: Some(veris_proxy::metrics::Scrape::of(a.proxy, a.ledger.clone()).registry()),
        metrics_open: a.metrics_open,
        unrecorded: a.proxy.unrecorded().clone(),
        // In the explicit tier the canary travels through the proxy URL from
        // anywhere; in the transparent tier only the workload's own traffic is
        // redirected (the proxy's uid is exempt), so the admin API leaves the
        // canary to `veris receipt` run in the sandbox. The twin it can ask.
        after_read: Some(crate::sys::trim_heap),
        receipt_checks: Some({
            let path = a.ledger.path().to_path_buf();
            let identity = a.proxy.identity().clone();
            let proxy_url = a.proxy_url.to_string();
            let services = Arc::new(services);
            let unrecorded = a.proxy.unrecorded().clone();
            Arc::new(move |w: ReceiptWindow| {
                let path = path.clone();
                let unrecorded = unrecorded.clone();
                let identity = identity.clone();
                let proxy_url = proxy_url.clone();
                let services = services.clone();
                Box::pin(async move {
                    let mut checks = Vec::new();
                    if identity.tier == ListenerTier::Explicit {
                        let probe = ProbePath::Explicit(proxy_url);
                        checks.push(
                            crate::check::canary_check(
                                &probe,
                                &identity.canary,
                                &identity.run_id,
                                Duration::from_secs(5),
                            )
                            .await,
                        );
                    }
                    // Streamed: the ledger is read a line at a time, never held.
                    if let Ok(facts) = SessionFacts::of_file(&path, w.until) {
                        let since = w.since.max(facts.since);
                        checks.push(
                            twin_cross_check_file(
                                &path,
                                since,
                                w.until,
                                &services,
                                facts.twin_heads.as_ref(),
                                true,
                                Some(&unrecorded.counts()),
                            )
                            .await,
                        );
                    }
                    checks
                })
            })
        }),
    });
    let mut rx = a.shutdown.clone();
    let server = tokio::spawn(veris_proxy::admin::serve_admin(
        listener,
        admin,
        async move {
            let _ = rx.wait_for(|s| *s).await;
        },
    ));
    info!(%addr, "admin API listening");
    AdminHandle {
        sealer: a.sealer,
        server: Some(server),
        timer,
        files: a.listener.files,
    }
}

impl AdminHandle {
    /// After the shutdown signal: waits for the API and timer, appends the
    /// shutdown seal (after the last traffic line) and removes the files
    /// that announce a live proxy. `Err` says why the seal could not be
    /// written (the ledger's write error, with its path and cause).
    pub async fn stop(self, ledger: &Ledger) -> Result<SealInfo, String> {
        let _ = self.timer.await;
        if let Some(server) = self.server {
            let _ = server.await;
        }
        let seal = ledger.seal(&self.sealer, "shutdown").map_err(|e| {
            let why = format!("{:#}", anyhow::Error::from(e));
            warn!(error = %why, "cannot append the shutdown seal");
            why
        });
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
        seal
    }
}

/// A live proxy found through its state dir.
#[derive(Debug, Clone)]
pub struct LiveProxy {
    pub base: String,
    token: String,
}

/// What `GET /status` answers (the fields readers use).
#[derive(Debug, Clone, Deserialize)]
pub struct LiveStatus {
    pub run_id: String,
    pub canary: String,
    pub tier: ListenerTier,
    pub proxy_url: String,
    pub head_seq: u64,
    #[serde(default)]
    pub session_seq: u64,
    #[serde(default)]
    pub services: Vec<ServiceRef>,
    /// The raw public key the proxy seals with (hex): with a fresh seal,
    /// the anchor of a live verdict.
    #[serde(default)]
    pub public_key: Option<String>,
    /// Requests the proxy sent to the twin but could not record (absent
    /// from a proxy before this field): the cross-check's explanation for
    /// twin rows with no ledger line.
    #[serde(default)]
    pub unrecorded: Option<UnrecordedCounts>,
}

impl LiveStatus {
    /// Whether this proxy is the one writing the ledger at `path`: the
    /// file's line at the proxy's `session_seq` must be a session line with
    /// its run id and (when both name one) its public key. `admin.addr` and
    /// `admin.token` copied from another state dir reach a proxy that
    /// answers `/status` to the token but writes another file. Reads a few
    /// blocks of the file (found by seq), opened without blocking; `Err`
    /// says what does not match.
    pub fn writes_ledger(&self, path: &Path) -> Result<(), String> {
        let shown = path.display();
        let file = veris_receipt::ledger::open_ledger(path)
            .map_err(|e| format!("cannot read its ledger {shown} ({e})"))?;
        let line = veris_receipt::ledger::line_at(&file, self.session_seq)
            .map_err(|e| format!("cannot read its ledger {shown} ({e})"))?;
        let Some(line) = line else {
            return Err(format!(
                "it says its session line is seq {}, but {shown} has no such line",
                self.session_seq
            ));
        };
        let Entry::Session(SessionLine {
            run_id, public_key, ..
        }) = &line.entry
        else {
            return Err(format!(
                "it says its session line is seq {}, but that line of {shown} is a {} line",
                self.session_seq,
                line.entry.kind()
            ));
        };
        if *run_id != self.run_id {
            return Err(format!(
                "it is run {}, but the session line at seq {} of {shown} is run {run_id}",
                self.run_id, self.session_seq
            ));
        }
        if let (Some(file_key), Some(live_key)) = (public_key, &self.public_key) {
            if file_key != live_key {
                return Err(format!(
                    "it seals with another key than the session line at seq {} of {shown} names",
                    self.session_seq
                ));
            }
        }
        Ok(())
    }
}

/// The routed services and their twin upstreams.
pub fn service_refs(router: &veris_proxy::route::Router) -> Vec<ServiceRef> {
    router
        .services()
        .iter()
        .map(|s| ServiceRef {
            name: s.name.clone(),
            upstream: s.upstream.clone(),
        })
        .collect()
}

#[derive(Debug, Clone, serde::Serialize, Deserialize)]
pub struct ServiceRef {
    pub name: String,
    pub upstream: String,
}

/// What [`discover`] found.
#[derive(Debug)]
pub enum Discovery {
    /// A proxy answers `/status` to the token.
    Live(LiveProxy),
    /// No proxy announced, or the announced one is gone (read the file).
    NotLive,
    /// A proxy is announced and answers, but this process cannot use it.
    Unusable(String),
}

/// Finds a live proxy for `state_dir`: `admin.addr` names it and `/status`
/// answers to the token from `admin.token` (0600, so readable by the proxy
/// uid and root), else to `$VERIS_ADMIN_TOKEN`.
pub async fn discover(state_dir: &Path) -> Discovery {
    // Bounded, regular files only: the workload may have planted a FIFO or
    // a link to /dev/zero here, and a reader (an MCP tool call) must not hang.
    let read = |name: &str| crate::stack::read_bounded(&state_dir.join(name), 4096, false);
    let Ok(addr) = read(ADDR_FILE) else {
        return Discovery::NotLive;
    };
    let base = format!("http://{}", addr.trim());
    let token = match read(TOKEN_FILE) {
        Ok(t) => t.trim().to_string(),
        Err(e) => match std::env::var("VERIS_ADMIN_TOKEN") {
            Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
            _ => {
                // Only worth saying if something answers at the address.
                return match http("GET", &format!("{base}/healthz"), None).await {
                    Ok((200, _)) => Discovery::Unusable(format!(
                        "proxy live but {TOKEN_FILE} is unreadable ({}): run as the proxy uid or root, or set VERIS_ADMIN_TOKEN",
                        e.kind()
                    )),
                    _ => Discovery::NotLive,
                };
            }
        },
    };
    let live = LiveProxy { base, token };
    // Ask with the token, not just /healthz: after a crash the announced
    // port may belong to something else, or to a proxy with a new token.
    match live.status().await {
        Ok(_) => Discovery::Live(live),
        Err(e) => {
            tracing::debug!(error = %e, "no usable proxy behind admin.addr");
            Discovery::NotLive
        }
    }
}

impl LiveProxy {
    async fn call(&self, method: &str, path: &str) -> Result<Bytes> {
        let url = format!("{}{path}", self.base);
        let (status, body) = http(method, &url, Some(&self.token)).await?;
        if status != 200 {
            bail!(
                "{method} {url} answered {status}: {}",
                String::from_utf8_lossy(&body)
            );
        }
        Ok(body)
    }

    pub async fn status(&self) -> Result<LiveStatus> {
        let body = self.call("GET", "/status").await?;
        serde_json::from_slice(&body).context("reading the admin /status answer")
    }

    pub async fn seal(&self) -> Result<SealInfo> {
        let body = self.call("POST", "/seal").await?;
        serde_json::from_slice(&body).context("reading the admin /seal answer")
    }
}

/// One HTTP/1.1 exchange with a plain-HTTP server, bounded in time.
pub async fn http(method: &str, url: &str, bearer: Option<&str>) -> Result<(u16, Bytes)> {
    let work = async {
        let uri: http::Uri = url.parse().with_context(|| format!("bad URL {url}"))?;
        if uri.scheme_str() != Some("http") {
            bail!("{url}: only http:// is supported here");
        }
        let host = uri.host().context("URL without host")?;
        let port = uri.port_u16().unwrap_or(80);
        let authority = uri
            .authority()
            .map(|a| a.as_str().to_string())
            .unwrap_or_default();
        let tcp = TcpStream::connect((host.trim_matches(|c| c == '[' || c == ']'), port))
            .await
            .with_context(|| format!("connecting to {authority}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(conn);
        let mut req = http::Request::builder()
            .method(method)
            .uri(uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"))
            .header(http::header::HOST, authority);
        if let Some(token) = bearer {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let resp = sender
            .send_request(req.body(Full::new(Bytes::new()))?)
            .await?;
        let status = resp.status().as_u16();
        // A bounded read: whatever answers at a twin or admin address (a
        // misconfigured upstream serving a large file) cannot make the proxy
        // or a reader hold it all.
        let body = http_body_util::Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| anyhow::anyhow!("{url}: reading the answer: {e}"))?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(HTTP_TIMEOUT, work)
        .await
        .unwrap_or_else(|_| bail!("{url}: no answer within {HTTP_TIMEOUT:?}"))
}

/// The probe path for a run: the proxy URL in the explicit tier, the kernel
/// redirect in the transparent tier.
pub fn probe_path(tier: ListenerTier, proxy_url: &str) -> ProbePath {
    match tier {
        ListenerTier::Explicit => ProbePath::Explicit(proxy_url.to_string()),
        ListenerTier::Transparent => ProbePath::Transparent(
            std::env::var("VERIS_PROBE_ADDR")
                .ok()
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| {
                    DEFAULT_PROBE_ADDR
                        .parse()
                        .unwrap_or(SocketAddr::from(([203, 0, 113, 1], 443)))
                }),
        ),
    }
}

/// `(method, path)` → count: a multiset of calls.
type Calls = BTreeMap<(String, String), u64>;

/// What the newest session line at or before a window's end says, and the
/// public keys every session line offers.
#[derive(Debug, Default)]
pub struct SessionFacts {
    /// `seq - 1` of that session line (0 without one).
    pub since: u64,
    /// The twin log position it recorded.
    pub twin_heads: Option<BTreeMap<String, u64>>,
    /// `public_key` of every session line, in file order.
    pub public_keys: Vec<String>,
    /// The first two lines and the head: what a ledger id is read from.
    pub prefix: LedgerRead,
}

impl SessionFacts {
    fn add(&mut self, line: &veris_receipt::Line, until: u64) {
        if let Entry::Session(SessionLine {
            twin_heads,
            public_key,
            ..
        }) = &line.entry
        {
            if let Some(k) = public_key {
                self.public_keys.push(k.clone());
            }
            if line.seq <= until {
                self.since = line.seq.saturating_sub(1);
                self.twin_heads = twin_heads.clone();
            }
        }
    }

    /// Reads them from the file a line at a time: only the first two lines
    /// and lines that mention a session are parsed (any line holding a
    /// `session` line's tag holds the word).
    pub fn of_file(path: &Path, until: u64) -> Result<SessionFacts, veris_receipt::LedgerError> {
        use veris_receipt::ledger::{LineReader, RawLine};
        let mut f = SessionFacts::default();
        let file = match veris_receipt::ledger::open_ledger(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(f),
            Err(source) => {
                return Err(veris_receipt::LedgerError::Read {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        let mut lines = LineReader::new(file);
        let mut buf = Vec::new();
        let mut head_hash = None;
        let mut n = 0u64;
        let mentions_session = veris_receipt::ledger::mentions(b"session");
        while let Some(raw) =
            lines
                .next_into(&mut buf)
                .map_err(|source| veris_receipt::LedgerError::Read {
                    path: path.to_path_buf(),
                    source,
                })?
        {
            let hash = match raw {
                RawLine::Line => None,
                RawLine::Overlong { hash, .. } => Some(hash),
                RawLine::Torn(_) => break,
            };
            n += 1;
            if n <= 2 || mentions_session(&buf) {
                if let Ok(line) = serde_json::from_slice::<veris_receipt::Line>(&buf) {
                    if f.prefix.lines.len() < 2 && n <= 2 {
                        f.prefix.lines.push(line.clone());
                    }
                    f.add(&line, until);
                }
            }
            if n == 1 {
                head_hash = Some(hash.unwrap_or_else(|| veris_receipt::ledger::line_hash(&buf)));
            }
        }
        if n == 1 {
            f.prefix.head = (1, head_hash.unwrap_or_default());
        }
        Ok(f)
    }
}

/// What the ledger says per service in a window: requests forwarded to the
/// twin (`sure`), and requests the twin may or may not have executed
/// (`maybe`: a timeout, a body the client never finished, a session that
/// ended first).
#[derive(Default)]
struct Expected {
    sure: BTreeMap<String, Calls>,
    maybe: BTreeMap<String, Calls>,
}

impl Expected {
    fn add(&mut self, line: &veris_receipt::Line) {
        match &line.entry {
            Entry::Request(RequestLine {
                service,
                method,
                path,
                ..
            }) => {
                *self
                    .sure
                    .entry(service.clone())
                    .or_default()
                    .entry((method.clone(), path.clone()))
                    .or_default() += 1;
            }
            Entry::UpstreamError(UpstreamErrorLine {
                service,
                method,
                path,
                error,
                ..
            }) if veris_receipt::entry::may_have_reached_twin(error) => {
                *self
                    .maybe
                    .entry(service.clone())
                    .or_default()
                    .entry((method.clone(), path.clone()))
                    .or_default() += 1;
            }
            _ => {}
        }
    }

    /// From the file, a line at a time: lines outside the window are
    /// skipped after reading their seq.
    fn of_file(
        path: &Path,
        since: u64,
        until: u64,
    ) -> Result<Expected, veris_receipt::LedgerError> {
        let mut e = Expected::default();
        veris_receipt::ledger::scan_file(path, 0, |line, _, _| {
            if line.seq > since && line.seq <= until {
                e.add(line);
            }
        })?;
        Ok(e)
    }
}

/// Takes `n` of `(method, path)` out of `calls`; returns how many were there.
fn take(calls: &mut Calls, key: &(String, String), n: u64) -> u64 {
    let have = calls.get(key).copied().unwrap_or(0);
    let took = have.min(n);
    if have > took {
        calls.insert(key.clone(), have - took);
    } else {
        calls.remove(key);
    }
    took
}

fn describe(calls: &Calls) -> String {
    const SHOWN: usize = 5;
    let mut out: Vec<String> = calls
        .iter()
        .take(SHOWN)
        .map(|((m, p), n)| format!("{m} {p} ({n})"))
        .collect();
    if calls.len() > SHOWN {
        out.push(format!("… and {} more", calls.len() - SHOWN));
    }
    out.join(", ")
}

/// Why the twin's log holds rows the ledger has no line for, the likeliest
/// cause first (DESIGN §7a.18). The ledger's own `maybe` lines (timeouts,
/// cut bodies, a session that ended first) are matched before this is
/// asked; what is left is either a request whose line the proxy could not
/// write (it knows how many per service: `unrecorded`, when the reader is
/// the proxy's own process) or a call that never went through veris.
/// Explained by veris's own write failures → `unverified`, never a
/// direct call; anything beyond them → `failed`.
fn unexplained(
    extras: &BTreeMap<String, Calls>,
    unrecorded: Option<&UnrecordedCounts>,
) -> (CheckStatus, String) {
    let n: u64 = extras.values().flat_map(|c| c.values()).sum();
    let list: Vec<String> = extras
        .iter()
        .map(|(s, c)| format!("{s}: {}", describe(c)))
        .collect();
    let rows = format!(
        "the twin's log has {n} request(s) the ledger has no line for ({})",
        list.join("; ")
    );
    let Some(u) = unrecorded else {
        return (
            CheckStatus::Failed,
            format!(
                "{rows}: something called the twin directly, not through veris, or the proxy could not write their ledger lines (a full disk: it then answers 503 veris_ledger_unavailable and logs it; the check the proxy records when the session ends can tell which)"
            ),
        );
    };
    let explained: u64 = extras
        .iter()
        .map(|(s, c)| {
            let rows: u64 = c.values().sum();
            rows.min(u.by_service.get(s).copied().unwrap_or(0))
        })
        .sum();
    let failed_writes: u64 = u.by_service.values().sum();
    let why = u.last_error.as_deref().unwrap_or("a write error");
    if explained == n {
        return (
            CheckStatus::Unverified,
            format!(
                "{rows}: the proxy sent {failed_writes} request(s) of this session to the twin but could not write their ledger lines ({why}; it answered them 503 veris_ledger_unavailable), which most likely are these: veris's own write failure, not a direct call. Next: free space where the ledger lives (or fix the write error) and run again"
            ),
        );
    }
    let direct = n - explained;
    if explained == 0 {
        return (
            CheckStatus::Failed,
            format!(
                "{rows}: nothing on veris's side explains them (no request line of theirs failed to be written; cut bodies, timeouts and requests the session's end interrupted are accounted for): something called the twin directly, not through veris"
            ),
        );
    }
    (
        CheckStatus::Failed,
        format!(
            "{rows}: {explained} may be requests whose ledger lines the proxy could not write ({why}); the other {direct} have no explanation on veris's side: something called the twin directly, not through veris"
        ),
    )
}

/// Twin cross-check (DESIGN §7a.6): the twin's own log, after the position
/// recorded when the session started (`heads`, or a baseline's), must hold
/// exactly the requests the ledger says were forwarded in `(since, until]`,
/// by (service, method, path), in both directions:
/// - a forwarded request the twin lacks → `failed` (the ledger claims a call
///   the twin never executed);
/// - a twin row the ledger lacks → `failed` (a call the proxy never saw: the
///   workload talking to the twin directly), unless it is a request still in
///   flight at the window's edge, which `ledger` (the file, re-read a few
///   times) then shows after `until`, or a timeout the twin may have executed;
///   rows that requests the proxy could not record (`unrecorded`, known
///   only in the proxy's own process) explain make it `unverified` instead,
///   with that reason ([`unexplained`]).
///
/// A twin whose log cannot be read, or a session whose start position is
/// unknown, makes the check `unverified`, never `ok`.
///
/// The ledger file is read a line at a time; with `refresh`, it is re-read
/// for requests in flight at the window's edge.
pub async fn twin_cross_check_file(
    path: &Path,
    since: u64,
    until: u64,
    services: &[ServiceRef],
    heads: Option<&BTreeMap<String, u64>>,
    refresh: bool,
    unrecorded: Option<&UnrecordedCounts>,
) -> Check {
    match Expected::of_file(path, since, until) {
        Ok(expected) => {
            cross_check(
                expected,
                until,
                services,
                heads,
                refresh.then_some(path),
                unrecorded,
            )
            .await
        }
        Err(e) => Check {
            name: "twin_cross_check".into(),
            status: CheckStatus::Unverified,
            detail: format!("cannot read the ledger to cross-check the twin ({e})"),
        },
    }
}

/// [`twin_cross_check_file`] with the ledger's side already counted.
async fn cross_check(
    expected: Expected,
    until: u64,
    services: &[ServiceRef],
    heads: Option<&BTreeMap<String, u64>>,
    ledger: Option<&Path>,
    unrecorded: Option<&UnrecordedCounts>,
) -> Check {
    let check = |status, detail: String| Check {
        name: "twin_cross_check".into(),
        status,
        detail,
    };
    let Some(heads) = heads else {
        return check(
            CheckStatus::Unverified,
            "the twin's log position when the session started is unknown, so its rows cannot be matched to this window".into(),
        );
    };
    let mut unreadable = Vec::new();
    let mut accounted = Vec::new();
    let mut extras: BTreeMap<String, Calls> = BTreeMap::new();
    for service in services {
        let mut sure = expected
            .sure
            .get(&service.name)
            .cloned()
            .unwrap_or_default();
        let Some(after) = heads.get(&service.name) else {
            // A service the twin did not answer for at start: nothing to
            // compare with unless the ledger says it was called.
            if !sure.is_empty() {
                unreadable.push(format!(
                    "{}: its log was unreadable when the session started",
                    service.name
                ));
            }
            continue;
        };
        let mut rows = match twin_rows(&service.upstream, *after).await {
            Ok(rows) => rows,
            Err(e) => {
                unreadable.push(format!("{}: {e:#}", service.name));
                continue;
            }
        };
        let total: u64 = sure.values().sum();
        let mut missing = Calls::new();
        for (key, n) in std::mem::take(&mut sure) {
            let found = take(&mut rows, &key, n);
            if found < n {
                missing.insert(key, n - found);
            }
        }
        if !missing.is_empty() {
            return check(
                CheckStatus::Failed,
                format!(
                    "the twin's log for {} lacks request(s) the ledger says were forwarded: {}",
                    service.name,
                    describe(&missing)
                ),
            );
        }
        if let Some(maybe) = expected.maybe.get(&service.name) {
            for (key, n) in maybe {
                take(&mut rows, key, *n);
            }
        }
        if !rows.is_empty() {
            extras.insert(service.name.clone(), rows);
        }
        accounted.push(format!("{} {total}", service.name));
    }
    // Rows of requests in flight when the window closed: their ledger lines
    // follow `until` once the twin's answer reaches the proxy.
    if let Some(path) = ledger {
        for attempt in 0..5 {
            if extras.is_empty() {
                break;
            }
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            let Ok(after) = Expected::of_file(path, until, u64::MAX) else {
                break;
            };
            for (service, rows) in extras.iter_mut() {
                for calls in [after.sure.get(service), after.maybe.get(service)]
                    .into_iter()
                    .flatten()
                {
                    for (key, n) in calls {
                        take(rows, key, *n);
                    }
                }
            }
            extras.retain(|_, rows| !rows.is_empty());
        }
    }
    if !extras.is_empty() {
        let (status, detail) = unexplained(&extras, unrecorded);
        return check(status, detail);
    }
    if !unreadable.is_empty() {
        return check(
            CheckStatus::Unverified,
            format!("twin log not readable: {}", unreadable.join("; ")),
        );
    }
    check(
        CheckStatus::Ok,
        format!(
            "the twin's log matches the ledger exactly ({})",
            if accounted.is_empty() {
                "no services".to_string()
            } else {
                accounted.join(", ")
            }
        ),
    )
}

#[derive(Deserialize)]
struct TwinPage {
    requests: Vec<TwinRow>,
}

#[derive(Deserialize)]
struct TwinRow {
    id: u64,
    method: String,
    path: String,
    tier: String,
}

/// Vendor rows (`handler`, `fault`) of one twin log after id `after`,
/// counted by `(method, redacted path)` the way the ledger records them.
/// A log longer than the pages read is an error, not a partial answer.
async fn twin_rows(base: &str, after: u64) -> Result<Calls> {
    let mut out = BTreeMap::new();
    let mut since_id = after;
    for _ in 0..TWIN_MAX_PAGES {
        let url = format!("{base}/veris/requests?order=asc&limit=1000&since_id={since_id}");
        let (status, body) = http("GET", &url, None).await?;
        if status != 200 {
            bail!("GET /veris/requests answered {status}");
        }
        let page: TwinPage =
            serde_json::from_slice(&body).context("reading the twin's /veris/requests")?;
        let n = page.requests.len();
        for row in page.requests {
            if row.id <= since_id {
                bail!("the twin's /veris/requests ids are not increasing");
            }
            since_id = row.id;
            if row.tier == "handler" || row.tier == "fault" {
                *out.entry((row.method, redact::text(&row.path)))
                    .or_default() += 1;
            }
        }
        if n < 1000 {
            return Ok(out);
        }
    }
    bail!(
        "the twin's log has more than {} rows in the window",
        TWIN_MAX_PAGES * 1000
    )
}

/// The newest request id of each service's twin log, asked concurrently;
/// services whose log cannot be read are left out.
pub async fn twin_newest_ids(services: &[ServiceRef]) -> BTreeMap<String, u64> {
    let asks = services.iter().map(|s| async move {
        let url = format!("{}/veris/requests?order=desc&limit=1", s.upstream);
        match http("GET", &url, None).await {
            Ok((200, body)) => serde_json::from_slice::<TwinPage>(&body)
                .ok()
                .map(|page| (s.name.clone(), page.requests.first().map_or(0, |r| r.id))),
            _ => None,
        }
    });
    futures_util::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(service: &str, n: u64) -> BTreeMap<String, Calls> {
        let mut calls = Calls::new();
        calls.insert(("POST".into(), "/v1/customers".into()), n);
        BTreeMap::from([(service.to_string(), calls)])
    }

    fn unrecorded(service: &str, n: u64) -> UnrecordedCounts {
        UnrecordedCounts {
            by_service: BTreeMap::from([(service.to_string(), n)]),
            last_error: Some("writing ledger /s/l: No space left on device (os error 28)".into()),
        }
    }

    /// DESIGN §7a.18: twin rows that veris's own write failures explain are
    /// never called a direct call; rows beyond them are, and say so.
    #[test]
    fn rows_without_a_line_are_blamed_on_what_explains_them() {
        let (status, why) = unexplained(&rows("stripe", 2), Some(&unrecorded("stripe", 2)));
        assert_eq!(status, CheckStatus::Unverified, "{why}");
        assert!(why.contains("No space left on device"), "{why}");
        assert!(!why.contains("called the twin directly"), "{why}");

        let (status, why) = unexplained(&rows("stripe", 3), Some(&unrecorded("stripe", 1)));
        assert_eq!(status, CheckStatus::Failed, "{why}");
        assert!(
            why.contains("1 may be requests whose ledger lines"),
            "{why}"
        );
        assert!(why.contains("the other 2"), "{why}");

        // A failure for another service explains nothing here.
        let (status, why) = unexplained(&rows("stripe", 1), Some(&unrecorded("github", 4)));
        assert_eq!(status, CheckStatus::Failed, "{why}");
        assert!(
            why.contains("nothing on veris's side explains them"),
            "{why}"
        );

        // A reader outside the proxy's process cannot tell: both causes.
        let (status, why) = unexplained(&rows("stripe", 1), None);
        assert_eq!(status, CheckStatus::Failed, "{why}");
        assert!(
            why.contains("called the twin directly") && why.contains("veris_ledger_unavailable"),
            "{why}"
        );
    }
}
