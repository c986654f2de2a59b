//! Starting and running a gateway (`veris gateway`, DESIGN §13): the CA
//! and trust files, the built-in twin (serving every sandbox under its
//! `/s/{sandbox}/` prefix) unless `--twin` names one, the seal key (in
//! this process only), the dial policy, the listener ([`serve`]) and the
//! admin API through which sandboxes are added and their receipts read.
//!
//! Each sandbox gets a directory that reads like a `veris serve` state dir
//! (`<state>/sandboxes/<id>/`: `ledger.jsonl`, `ledger.pub`, `admin.addr`
//! naming its part of the admin API, `admin.token` its read token), so
//! `veris receipt`, `har` and the TUI read a sandbox as they read a serve.
//!
//! Admin API (bearer token from `<state>/admin.token`):
//! - `POST /sandboxes` `{"id","services":[..],"mode","twin","ttl_secs"}`:
//!   registers one; answers its credentials (the password only here);
//! - `GET /sandboxes`; `DELETE /sandboxes/{id}` (final seal, then refused);
//! - `/sandboxes/{id}/…`: that sandbox's `/status`, `/ledger`, `/events`,
//!   `/seal`, `/receipt` ([`veris_proxy::admin`]), with the admin token or
//!   the sandbox's read token, which reads nothing else.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use veris_ca::fsutil::write_file;
use veris_ca::{CertificateAuthority, Issuer};
use veris_proxy::body::ProxyBody;
use veris_proxy::config::{Flags, Settings};
use veris_proxy::outbound::upstream::UpstreamOptions;
use veris_proxy::{Identity, Limits, Proxy, ProxyOptions};
use veris_receipt::ledger::Ledger;
use veris_receipt::seal::{PublicKeys, Sealer, PUB_FILE};
use veris_receipt::{Entry, ListenerTier, Mode, SessionLine};

use crate::runtime::live::discovery::{ADDR_FILE, TOKEN_FILE};
use crate::tier::gateway::{self as tier, Sandbox, Sandboxes, SANDBOXES_DIR};

/// `veris gateway`'s settings.
pub struct GatewayConfig {
    pub state_dir: PathBuf,
    pub listen: String,
    pub admin: String,
    pub ready_file: Option<PathBuf>,
    pub twin: Option<String>,
    pub mode: Mode,
    pub allow_dial: Vec<veris_proxy::outbound::policy::Cidr>,
    pub max_connections: usize,
    pub per_sandbox_connections: usize,
}

/// What every sandbox's proxy shares.
struct Shared {
    state_dir: PathBuf,
    listen: SocketAddr,
    admin_addr: SocketAddr,
    twin: String,
    twin_auth: Option<String>,
    default_mode: Mode,
    sealer: Arc<Sealer>,
    issuer: Arc<Issuer>,
    roots: rustls::RootCertStore,
    passthrough_roots: rustls::RootCertStore,
    ca_pem: PathBuf,
    per_sandbox_connections: usize,
    sandboxes: Arc<Sandboxes>,
    admin_token: String,
    cancel: CancellationToken,
}

/// Runs a gateway until `stop` resolves; then every sandbox's ledger gets
/// its final seal.
pub async fn run(config: GatewayConfig, stop: impl std::future::Future<Output = ()>) -> Result<()> {
    if let Err(e) = crate::os::prctl::set_non_dumpable() {
        warn!(error = %e, "cannot make the gateway non-dumpable");
    }
    let _ = crate::os::fd::raise_open_file_limit();
    let state_dir = config.state_dir.clone();
    std::fs::create_dir_all(state_dir.join(SANDBOXES_DIR))
        .with_context(|| format!("creating state dir {}", state_dir.display()))?;
    let (shutdown, shutdown_rx) = watch::channel(false);
    let (twin, twin_task, twin_auth) = match &config.twin {
        Some(url) => (url.trim_end_matches('/').to_string(), None, None),
        None => {
            let (url, task, credential) =
                crate::runtime::stack::start_builtin_twin(None, shutdown_rx.clone()).await?;
            (url, Some(task), Some(credential))
        }
    };
    let ca_dir = state_dir.join("ca");
    let (ca, _) = CertificateAuthority::load_or_create(&ca_dir)
        .with_context(|| format!("loading the CA in {}", ca_dir.display()))?;
    let ca = Arc::new(ca);
    let system_bundle = veris_ca::trust::find_system_bundle(
        std::env::var_os("VERIS_SYSTEM_CA_BUNDLE")
            .as_deref()
            .map(Path::new),
    );
    let trust = veris_ca::trust::publish(&state_dir.join("trust"), &ca, system_bundle.as_deref())
        .context("publishing trust material")?;
    let (roots, passthrough_roots) =
        crate::runtime::stack::upstream_roots(system_bundle.as_deref(), &ca);
    let sealer = Arc::new(Sealer::generate().context("generating the gateway's seal key")?);
    info!(seal_key = %sealer.key_id(), "the gateway's seal key for this run; pin it to verify its sandboxes later: veris receipt --key <seal_key>");

    let mut own = veris_proxy::outbound::policy::own_addresses().unwrap_or_default();
    let listener = TcpListener::bind(&config.listen).await.with_context(|| {
        format!(
            "binding the gateway to {}. Next: pick a free address with --listen (port 0 picks one)",
            config.listen
        )
    })?;
    let listen = listener.local_addr()?;
    own.push(listen.ip());
    veris_proxy::outbound::dial::enforce(veris_proxy::outbound::policy::DialPolicy::new(
        config.allow_dial.clone(),
        own,
    ));
    let admin_listener = TcpListener::bind(&config.admin).await.with_context(|| {
        format!(
            "binding the admin API to {}. Next: pick a free address with --admin",
            config.admin
        )
    })?;
    let admin_addr = admin_listener.local_addr()?;
    let admin_token = crate::util::random_hex(32)?;
    write_file(
        &state_dir.join(TOKEN_FILE),
        format!("{admin_token}\n").as_bytes(),
        0o600,
    )
    .context("writing admin.token")?;
    write_file(
        &state_dir.join(ADDR_FILE),
        format!("{admin_addr}\n").as_bytes(),
        0o644,
    )
    .context("writing admin.addr")?;

    let sandboxes = Arc::new(Sandboxes::default());
    let shared = Arc::new(Shared {
        state_dir: state_dir.clone(),
        listen,
        admin_addr,
        twin,
        twin_auth,
        default_mode: config.mode,
        sealer,
        issuer: Arc::new(Issuer::new(ca, Issuer::DEFAULT_CAPACITY)),
        roots,
        passthrough_roots,
        ca_pem: trust.ca_pem.clone(),
        per_sandbox_connections: config.per_sandbox_connections.max(1),
        sandboxes: sandboxes.clone(),
        admin_token,
        cancel: CancellationToken::new(),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let admin = tokio::spawn(serve_admin(admin_listener, shared.clone(), stop_rx.clone()));
    let gateway = tokio::spawn(veris_proxy::inbound::gateway::serve(
        listener,
        sandboxes.clone(),
        veris_proxy::inbound::gateway::Options {
            tls: None,
            handshake: Duration::from_secs(10),
            request_head: Limits::default().request_head,
            max_connections: config.max_connections.max(1),
        },
        crate::util::until(&stop_rx),
    ));
    if let Some(ready) = &config.ready_file {
        let body = json!({
            "listen": listen.to_string(),
            "admin": admin_addr.to_string(),
            "ca": trust.ca_pem.display().to_string(),
            "bundle": trust.bundle.display().to_string(),
            "twin": shared.twin,
            "seal_key": shared.sealer.key_id(),
            "pid": std::process::id(),
        });
        write_file(ready, format!("{body}\n").as_bytes(), 0o644)
            .with_context(|| format!("writing the ready file {}", ready.display()))?;
    }
    eprintln!(
        "veris: gateway {listen} (admin {admin_addr}, twin {}); CA {}",
        shared.twin,
        trust.ca_pem.display()
    );
    crate::outln!("{listen}");
    stop.await;
    info!("shutting down");
    let _ = stop_tx.send(true);
    shared.cancel.cancel();
    let _ = gateway.await;
    let _ = admin.await;
    for sandbox in sandboxes.all() {
        close(&sandbox, &shared.sealer).await;
    }
    let _ = shutdown.send(true);
    if let Some(t) = twin_task {
        let _ = t.await;
    }
    for f in [ADDR_FILE, TOKEN_FILE] {
        let _ = std::fs::remove_file(state_dir.join(f));
    }
    if let Some(ready) = &config.ready_file {
        let _ = std::fs::remove_file(ready);
    }
    Ok(())
}

/// Ends a sandbox's session: its connections drain, then the final seal.
async fn close(sandbox: &Sandbox, sealer: &Sealer) {
    sandbox.timer.abort();
    sandbox.proxy.shutdown().await;
    if let Err(e) = sandbox.ledger.seal(sealer, "shutdown") {
        warn!(sandbox = %sandbox.id, error = %e, "cannot append the sandbox's final seal");
    }
    let dir = sandbox.ledger.path().parent().map(Path::to_path_buf);
    if let Some(dir) = dir {
        for f in [ADDR_FILE, TOKEN_FILE] {
            let _ = std::fs::remove_file(dir.join(f));
        }
    }
}

/// What `POST /sandboxes` takes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewSandbox {
    pub id: String,
    #[serde(default)]
    pub services: Vec<String>,
    #[serde(default)]
    pub mode: Option<Mode>,
    #[serde(default)]
    pub twin: Option<String>,
    #[serde(default)]
    pub ttl_secs: Option<u64>,
}

/// What `POST /sandboxes` answers: everything a platform needs, once.
#[derive(Debug, Serialize, Deserialize)]
pub struct Registered {
    pub id: String,
    pub username: String,
    pub password: String,
    /// `socks5h://USER:PASS@HOST:PORT`.
    pub proxy_url: String,
    /// The same credentials for an HTTP CONNECT proxy setting.
    pub http_proxy_url: String,
    /// `HOST:PORT` of the gateway's listener (E2B's `egressProxy` address).
    pub address: String,
    pub read_token: String,
    pub canary: String,
    pub ca: String,
    pub services: Vec<String>,
    pub mode: Mode,
    pub expires: Option<String>,
}

/// Registers a sandbox: its directory, ledger, session line, proxy and
/// seal timer.
async fn add(shared: &Arc<Shared>, new: NewSandbox) -> Result<Registered> {
    tier::valid_id(&new.id)?;
    if shared.sandboxes.get(&new.id).is_some() {
        bail!(
            "sandbox {} is registered already. Next: remove it first, or pick another id",
            new.id
        );
    }
    let twin = new.twin.clone().unwrap_or_else(|| shared.twin.clone());
    let twin_auth = match &new.twin {
        Some(_) => None,
        None => shared.twin_auth.clone(),
    };
    let mode = new.mode.unwrap_or(shared.default_mode);
    let services: Vec<String> = new
        .services
        .iter()
        .flat_map(|s| s.split(','))
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    let settings = Settings::from_flags(Flags {
        listen: "127.0.0.1:0",
        twin: &twin,
        sandbox_id: &new.id,
        services: &services,
        routes: &[],
        mode,
        allow_passthrough: &[],
    })?;
    let dir = shared.state_dir.join(SANDBOXES_DIR).join(&new.id);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut own = PublicKeys::load(&dir.join(PUB_FILE))?;
    own.keys.push(shared.sealer.public_key());
    shared.sealer.publish(&dir)?;
    let (ledger, report) = Ledger::open_sealed_by(&dir.join("ledger.jsonl"), &own)?;
    let ledger = Arc::new(ledger);
    let identity = Identity {
        run_id: crate::util::random_hex(8)?,
        sandbox_id: new.id.clone(),
        canary: format!("cnry_{}", crate::util::random_hex(16)?),
        mode,
        tier: ListenerTier::Gateway,
    };
    let services_refs = crate::runtime::live::service_refs(&settings.router);
    let twin_heads = crate::runtime::live::twin_newest_ids(&services_refs).await;
    let session = Entry::Session(SessionLine {
        run_id: identity.run_id.clone(),
        sandbox_id: new.id.clone(),
        mode,
        tier: ListenerTier::Gateway,
        twin: twin.clone(),
        pid: std::process::id(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        listen: shared.listen.to_string(),
        recovered_torn_tail: report.torn_tail,
        key_id: Some(shared.sealer.key_id().to_string()),
        public_key: Some(shared.sealer.public_key_hex()),
        key_storage: Some("memory".into()),
        proxy_uid: Some(crate::os::prctl::euid()),
        workload_uid: None,
        twin_heads: Some(twin_heads),
        moved_aside: report.moved_aside.clone(),
        coverage: Some(Box::new(tier::coverage())),
    });
    let session_seq = ledger
        .append(session)
        .context("writing the sandbox's session line")?;
    let proxy = Proxy::new(
        ProxyOptions {
            router: settings.router,
            identity: identity.clone(),
            twin_base: twin.clone(),
            twin_auth,
            upstream: UpstreamOptions {
                roots: shared.roots.clone(),
                passthrough_roots: Some(shared.passthrough_roots.clone()),
                ..UpstreamOptions::default()
            },
            grace: Duration::from_secs(5),
            limits: Limits {
                max_connections: shared.per_sandbox_connections,
                ..Limits::default()
            },
            capture: None,
        },
        shared.issuer.clone(),
        ledger.clone(),
    );
    let password = crate::util::random_hex(24)?;
    let read_token = crate::util::random_hex(32)?;
    let proxy_url = format!("http://{}", shared.listen);
    let admin = Arc::new(veris_proxy::admin::Admin {
        token: read_token.clone(),
        identity: identity.clone(),
        proxy_url: proxy_url.clone(),
        twin: twin.clone(),
        services: services_refs
            .iter()
            .map(|s| (s.name.clone(), s.upstream.clone()))
            .collect(),
        session_seq,
        ledger: ledger.clone(),
        sealer: shared.sealer.clone(),
        public_keys: dir.join(PUB_FILE),
        started: Instant::now(),
        receipt_checks: None,
        after_read: Some(crate::os::prctl::trim_heap),
        metrics: None,
        metrics_open: false,
        unrecorded: proxy.unrecorded().clone(),
        publishing: None,
    });
    let timer = {
        let (ledger, sealer, cancel) =
            (ledger.clone(), shared.sealer.clone(), shared.cancel.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    _ = tick.tick() => {}
                    () = ledger.seal_due() => {}
                }
                if let Err(e) = ledger.seal_if_unsealed(&sealer, "interval") {
                    warn!(error = %e, "cannot append an interval seal");
                }
            }
        })
    };
    let expires = new
        .ttl_secs
        .map(|s| SystemTime::now() + Duration::from_secs(s));
    let sandbox = Arc::new(Sandbox {
        id: new.id.clone(),
        password: tier::digest(&password),
        read_token: read_token.clone(),
        services: services_refs.iter().map(|s| s.name.clone()).collect(),
        mode,
        expires,
        proxy,
        ledger,
        admin,
        timer,
    });
    // The sandbox's dir reads as a live serve's: its part of the admin API
    // and the token that reads only it.
    write_file(
        &dir.join(TOKEN_FILE),
        format!("{read_token}\n").as_bytes(),
        0o600,
    )?;
    write_file(
        &dir.join(ADDR_FILE),
        format!("{}/sandboxes/{}\n", shared.admin_addr, new.id).as_bytes(),
        0o644,
    )?;
    shared.sandboxes.insert(sandbox.clone())?;
    info!(sandbox = %new.id, services = ?sandbox.services, ?mode, "sandbox registered");
    let expires = expires.map(|e| {
        time::OffsetDateTime::from(e)
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default()
    });
    Ok(Registered {
        username: new.id.clone(),
        proxy_url: format!("socks5h://{}:{password}@{}", new.id, shared.listen),
        http_proxy_url: format!("http://{}:{password}@{}", new.id, shared.listen),
        address: shared.listen.to_string(),
        id: new.id,
        password,
        read_token,
        canary: identity.canary,
        ca: shared.ca_pem.display().to_string(),
        services: sandbox.services.clone(),
        mode,
        expires,
    })
}

/// The admin API until `stop` says true.
async fn serve_admin(listener: TcpListener, shared: Arc<Shared>, stop: watch::Receiver<bool>) {
    let tasks = tokio_util::task::TaskTracker::new();
    let accepted = veris_accept::accept_until(
        listener,
        crate::util::until(&stop),
        veris_accept::OnError::Retry,
        |stream, _peer| {
            let shared = shared.clone();
            tasks.spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let shared = shared.clone();
                    async move { Ok::<_, Infallible>(admin_request(shared, req).await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .with_upgrades();
                let _ = conn.await;
            });
        },
    )
    .await;
    if let Err(e) = accepted {
        warn!(error = %e, "the gateway's admin API stopped");
    }
    tasks.close();
    let _ = tokio::time::timeout(Duration::from_secs(2), tasks.wait()).await;
}

fn error(status: StatusCode, code: &str, message: String) -> Response<ProxyBody> {
    ok_json(status, json!({"error": code, "message": message}))
}

fn ok_json(status: StatusCode, body: serde_json::Value) -> Response<ProxyBody> {
    let mut resp = Response::new(veris_proxy::body::full(body.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

/// The bearer token of a request, if any.
fn bearer<B>(req: &Request<B>) -> Option<&str> {
    req.headers()
        .get(http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

fn same(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    bool::from(tier::digest(a).ct_eq(&tier::digest(b)))
}

async fn admin_request(shared: Arc<Shared>, mut req: Request<Incoming>) -> Response<ProxyBody> {
    let path = req.uri().path().to_string();
    if path == "/healthz" {
        return ok_json(StatusCode::OK, json!({"status": "ok"}));
    }
    let unauthorized = || {
        error(
            StatusCode::UNAUTHORIZED,
            "veris_unauthorized",
            "this endpoint needs `Authorization: Bearer <token>`: the gateway's (<state>/admin.token) or, for one sandbox's reads, its read token".into(),
        )
    };
    let is_admin = bearer(&req).is_some_and(|t| same(t, &shared.admin_token));
    let rest: Vec<&str> = path.trim_start_matches('/').splitn(3, '/').collect();
    match (req.method().clone(), rest.as_slice()) {
        (Method::GET, ["sandboxes"]) if is_admin => {
            let list: Vec<_> = shared
                .sandboxes
                .all()
                .iter()
                .map(|s| {
                    json!({
                        "id": s.id,
                        "services": s.services,
                        "mode": s.mode,
                        "open_connections": s.proxy.open_connections(),
                        "expired": s.expired(SystemTime::now()),
                    })
                })
                .collect();
            ok_json(StatusCode::OK, json!({"sandboxes": list}))
        }
        (Method::POST, ["sandboxes"]) if is_admin => {
            let body = match http_body_util::Limited::new(req.into_body(), 64 * 1024)
                .collect()
                .await
            {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "veris_bad_body",
                        format!("cannot read the request body: {e}"),
                    )
                }
            };
            let new: NewSandbox = match serde_json::from_slice(&body) {
                Ok(n) => n,
                Err(e) => {
                    return error(StatusCode::BAD_REQUEST, "veris_bad_sandbox", format!("the body is not a sandbox: {e}. Next: send {{\"id\":\"…\",\"services\":[\"stripe\"]}}"))
                }
            };
            match add(&shared, new).await {
                Ok(registered) => ok_json(StatusCode::CREATED, json!(registered)),
                Err(e) => error(
                    StatusCode::BAD_REQUEST,
                    "veris_sandbox_refused",
                    format!("{e:#}"),
                ),
            }
        }
        (Method::DELETE, ["sandboxes", id]) if is_admin => match shared.sandboxes.remove(id) {
            Some(sandbox) => {
                close(&sandbox, &shared.sealer).await;
                info!(sandbox = %id, "sandbox removed");
                ok_json(StatusCode::OK, json!({"removed": id}))
            }
            None => error(
                StatusCode::NOT_FOUND,
                "veris_no_such_sandbox",
                format!("no sandbox {id:?}"),
            ),
        },
        (_, ["sandboxes", id, tail]) => {
            let Some(sandbox) = shared.sandboxes.get(id) else {
                return error(
                    StatusCode::NOT_FOUND,
                    "veris_no_such_sandbox",
                    format!("no sandbox {id:?}"),
                );
            };
            // The gateway's token reads every sandbox: it stands in for
            // this one's read token, which alone reads nothing else.
            if is_admin {
                if let Ok(v) =
                    http::HeaderValue::from_str(&format!("Bearer {}", sandbox.read_token))
                {
                    req.headers_mut().insert(http::header::AUTHORIZATION, v);
                }
            }
            let target = match req.uri().query() {
                Some(q) => format!("/{tail}?{q}"),
                None => format!("/{tail}"),
            };
            match target.parse() {
                Ok(uri) => *req.uri_mut() = uri,
                Err(_) => {
                    return error(StatusCode::BAD_REQUEST, "veris_bad_path", "bad path".into())
                }
            }
            veris_proxy::admin::handle(sandbox.admin.clone(), req, shared.cancel.clone()).await
        }
        _ if !is_admin => unauthorized(),
        _ => error(
            StatusCode::NOT_FOUND,
            "veris_not_found",
            format!("no such endpoint {path}"),
        ),
    }
}
