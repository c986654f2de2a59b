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
use veris_proxy::admin::{Admin, ReceiptWindow};
use veris_proxy::Proxy;
use veris_receipt::ledger::{Ledger, LedgerRead, SealInfo};
use veris_receipt::receipt::{Check, CheckStatus};
use veris_receipt::seal::Sealer;
use veris_receipt::{redact, Entry, ListenerTier};

use crate::check::{ProbePath, DEFAULT_PROBE_ADDR};

/// Where the admin API's address is announced.
pub const ADDR_FILE: &str = "admin.addr";
/// Where the admin API's bearer token is kept (0600).
pub const TOKEN_FILE: &str = "admin.token";
/// Seals while traffic flows come at most this often.
const SEAL_INTERVAL: Duration = Duration::from_secs(1);
/// Bound on one admin or twin HTTP exchange.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on the twin rows read per service (pages of 1000).
const TWIN_MAX_PAGES: usize = 100;

/// What [`start_admin`] needs.
pub struct AdminStart<'a> {
    pub listen: &'a str,
    pub state_dir: &'a Path,
    pub proxy: &'a Arc<Proxy>,
    pub proxy_url: &'a str,
    pub twin: &'a str,
    pub session_seq: u64,
    pub ledger: Arc<Ledger>,
    pub sealer: Arc<Sealer>,
    pub shutdown: watch::Receiver<bool>,
}

/// The running admin API and seal timer.
pub struct AdminHandle {
    pub addr: SocketAddr,
    sealer: Arc<Sealer>,
    server: JoinHandle<std::io::Result<()>>,
    timer: JoinHandle<()>,
    files: Vec<PathBuf>,
}

/// Binds the admin listener, starts the API and the seal timer, and writes
/// `admin.token` (0600, new each start) then `admin.addr`.
pub async fn start_admin(a: AdminStart<'_>) -> Result<AdminHandle> {
    let listener = TcpListener::bind(a.listen).await.with_context(|| {
        format!(
            "binding the admin API to {}. Next: pick a free address with --admin (port 0 picks one)",
            a.listen
        )
    })?;
    let addr = listener.local_addr()?;
    let token = crate::random_hex(32)?;
    let admin = Arc::new(Admin {
        token: token.clone(),
        identity: a.proxy.identity().clone(),
        proxy_url: a.proxy_url.to_string(),
        twin: a.twin.to_string(),
        services: a
            .proxy
            .router()
            .services()
            .iter()
            .map(|s| (s.name.clone(), s.upstream.clone()))
            .collect(),
        session_seq: a.session_seq,
        ledger: a.ledger.clone(),
        sealer: a.sealer.clone(),
        public_keys: a.state_dir.join(veris_receipt::seal::PUB_FILE),
        started: Instant::now(),
        // In the explicit tier the canary travels through the proxy URL from
        // anywhere; in the transparent tier only the workload's own traffic is
        // redirected (the proxy's uid is exempt), so the admin API leaves the
        // canary to `veris receipt` run in the sandbox. The twin it can ask.
        receipt_checks: Some({
            let path = a.ledger.path().to_path_buf();
            let identity = a.proxy.identity().clone();
            let proxy_url = a.proxy_url.to_string();
            Arc::new(move |w: ReceiptWindow| {
                let path = path.clone();
                let identity = identity.clone();
                let proxy_url = proxy_url.clone();
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
                    if let Ok(read) = veris_receipt::ledger::read(&path) {
                        let none = BTreeMap::new();
                        checks.push(twin_cross_check(&read, w.since, w.until, &none).await);
                    }
                    checks
                })
            })
        }),
    });
    let token_path = a.state_dir.join(TOKEN_FILE);
    let addr_path = a.state_dir.join(ADDR_FILE);
    write_file(&token_path, format!("{token}\n").as_bytes(), 0o600)
        .with_context(|| format!("writing {}", token_path.display()))?;
    write_file(&addr_path, format!("{addr}\n").as_bytes(), 0o644)
        .with_context(|| format!("writing {}", addr_path.display()))?;

    let mut rx = a.shutdown.clone();
    let server = tokio::spawn(veris_proxy::admin::serve_admin(
        listener,
        admin,
        async move {
            let _ = rx.wait_for(|s| *s).await;
        },
    ));
    let (ledger, sealer, mut rx) = (a.ledger, a.sealer.clone(), a.shutdown);
    let timer = tokio::spawn(async move {
        let mut tick = tokio::time::interval(SEAL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = rx.wait_for(|s| *s) => return,
                _ = tick.tick() => {
                    if let Err(e) = ledger.seal_if_unsealed(&sealer, "interval") {
                        warn!(error = %e, "cannot append an interval seal");
                    }
                }
            }
        }
    });
    info!(%addr, "admin API listening");
    Ok(AdminHandle {
        addr,
        sealer: a.sealer,
        server,
        timer,
        files: vec![addr_path, token_path],
    })
}

impl AdminHandle {
    /// After the shutdown signal: waits for the API and timer, appends the
    /// shutdown seal (after the last traffic line) and removes the files
    /// that announce a live proxy.
    pub async fn stop(self, ledger: &Ledger) -> Option<SealInfo> {
        let _ = self.server.await;
        let _ = self.timer.await;
        let seal = match ledger.seal(&self.sealer, "shutdown") {
            Ok(info) => Some(info),
            Err(e) => {
                warn!(error = %e, "cannot append the shutdown seal");
                None
            }
        };
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
        seal
    }
}

/// Writes via a temp file created with `mode` and a rename.
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
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
    pub services: Vec<ServiceRef>,
}

#[derive(Debug, Clone, Deserialize)]
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
    let Ok(addr) = std::fs::read_to_string(state_dir.join(ADDR_FILE)) else {
        return Discovery::NotLive;
    };
    let base = format!("http://{}", addr.trim());
    let token = match std::fs::read_to_string(state_dir.join(TOKEN_FILE)) {
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
        let body = resp.into_body().collect().await?.to_bytes();
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

/// Forwarded requests of one twin log in a window: `(method, path)` counts.
#[derive(Debug, Default)]
struct Forwarded {
    service: String,
    calls: BTreeMap<(String, String), u64>,
    total: u64,
}

/// Twin cross-check (DESIGN §8): every request the ledger says was forwarded
/// in `(since, until]` must appear in the twin's own log. Twin rows from
/// before the window may be there too (counts are compared with ≥); with a
/// baseline, rows up to its twin ids are skipped. A twin whose log cannot be
/// read is not a contradiction: the check is skipped and says so.
pub async fn twin_cross_check(
    read: &LedgerRead,
    since: u64,
    until: u64,
    twin_since: &BTreeMap<String, u64>,
) -> Check {
    let mut logs: BTreeMap<String, Forwarded> = BTreeMap::new();
    for line in read
        .lines
        .iter()
        .filter(|l| l.seq > since && l.seq <= until)
    {
        if let Entry::Request {
            service,
            method,
            path,
            upstream,
            ..
        } = &line.entry
        {
            // The service's log lives at the upstream base: the upstream URL
            // minus the request path the proxy appended.
            let Some(base) = upstream.strip_suffix(path.as_str()) else {
                continue;
            };
            let f = logs.entry(base.to_string()).or_default();
            f.service = service.clone();
            *f.calls.entry((method.clone(), path.clone())).or_default() += 1;
            f.total += 1;
        }
    }
    let check = |status, detail: String| Check {
        name: "twin_cross_check".into(),
        status,
        detail,
    };
    if logs.is_empty() {
        return check(
            CheckStatus::Ok,
            "no forwarded requests in the window to cross-check".into(),
        );
    }
    let mut accounted = Vec::new();
    let mut skipped = Vec::new();
    for (base, f) in &logs {
        let after = twin_since.get(&f.service).copied().unwrap_or(0);
        let rows = match twin_rows(base, after).await {
            Ok(rows) => rows,
            Err(e) => {
                skipped.push(format!("{}: {e:#}", f.service));
                continue;
            }
        };
        let mut missing = Vec::new();
        for ((method, path), n) in &f.calls {
            let seen = rows
                .get(&(method.clone(), path.clone()))
                .copied()
                .unwrap_or(0);
            if seen < *n {
                missing.push(format!("{method} {path} (ledger {n}, twin {seen})"));
            }
        }
        if !missing.is_empty() {
            return check(
                CheckStatus::Failed,
                format!(
                    "the twin's log for {} lacks request(s) the ledger says were forwarded: {}",
                    f.service,
                    missing.join(", ")
                ),
            );
        }
        accounted.push(format!("{} {}", f.service, f.total));
    }
    if accounted.is_empty() {
        return check(
            CheckStatus::Ok,
            format!(
                "twin log not reachable, cross-check skipped ({})",
                skipped.join("; ")
            ),
        );
    }
    let mut detail = format!(
        "twin log accounts for every forwarded request ({})",
        accounted.join(", ")
    );
    if !skipped.is_empty() {
        detail.push_str(&format!("; skipped: {}", skipped.join("; ")));
    }
    check(CheckStatus::Ok, detail)
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
async fn twin_rows(base: &str, after: u64) -> Result<BTreeMap<(String, String), u64>> {
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
            since_id = since_id.max(row.id);
            if row.tier == "handler" || row.tier == "fault" {
                *out.entry((row.method, redact::text(&row.path)))
                    .or_default() += 1;
            }
        }
        if n < 1000 {
            return Ok(out);
        }
    }
    Ok(out)
}

/// The newest request id of each service's twin log (for a baseline).
pub async fn twin_newest_ids(services: &[ServiceRef]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for s in services {
        let url = format!("{}/veris/requests?order=desc&limit=1", s.upstream);
        if let Ok((200, body)) = http("GET", &url, None).await {
            if let Ok(page) = serde_json::from_slice::<TwinPage>(&body) {
                out.insert(s.name.clone(), page.requests.first().map_or(0, |r| r.id));
            }
        }
    }
    out
}
