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
//! Its registration record (`sandbox.json`, [`crate::tier::gateway_record`])
//! brings it back when the gateway starts again on the same state dir: same
//! credentials and read token, its ledger continued under the new run's key
//! (a new session line; `ledger.pub` keeps the earlier keys).
//!
//! A sandbox is served by the same steps whether added or restored
//! ([`start`]: [`routes`], [`open_ledger`], its proxy and admin part,
//! [`write_files`], [`seal_timer`]); at shutdown every sandbox drains at
//! once ([`close`]).
//!
//! Admin API (bearer token from `<state>/admin.token`):
//! - `POST /sandboxes` `{"id","services":[..],"mode","twin","ttl_secs",
//!   "max_connections","max_rps","max_bytes_per_sec","webhooks",
//!   "webhook_faults"}`: registers one (a limit left out is the gateway's
//!   `--sandbox-…` default, 0 a rate without limit); answers its
//!   credentials and webhook secrets (only here; [`webhooks`]);
//! - `GET /sandboxes`; `DELETE /sandboxes/{id}` (refused from then on, its
//!   record revoked, its final seal);
//! - `/sandboxes/{id}/…`: that sandbox's `/status`, `/ledger`, `/events`,
//!   `/seal`, `/receipt` ([`veris_proxy::admin`]), with the admin token or
//!   the sandbox's read token, which reads nothing else; its
//!   `/webhooks/trigger|replay` with the admin token only (they write);
//! - `GET /status`, `GET /metrics`: the gateway's own, each sandbox's
//!   publishing to NATS (`--nats`: lag in lines, refusal, fork).
//!
//! With `--nats`, each sandbox's ledger is published from when it is added
//! or restored until it is removed or the gateway stops (after a last
//! drain of what the file holds), on `veris.ledger.<sandbox>.<gateway>`
//! ([`crate::runtime::fleet::Publishing`]); and the sandboxes are the
//! fleet's, shared through a key-value bucket ([`registry`]): one added
//! through any gateway is served by every one, one removed is refused by
//! every one.

mod registry;
mod webhooks;

use std::collections::BTreeMap;
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
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use veris_ca::fsutil::write_file;
use veris_ca::{CertificateAuthority, Issuer};
use veris_proxy::body::ProxyBody;
use veris_proxy::config::{Flags, Settings};
use veris_proxy::outbound::upstream::{Upstream, UpstreamOptions};
use veris_proxy::{Identity, Limits, Proxy, ProxyOptions};
use veris_receipt::ledger::Ledger;
use veris_receipt::receipt::CheckStatus;
use veris_receipt::seal::{self, PublicKeys, Sealer, PUB_FILE};
use veris_receipt::{CheckLine, Entry, ListenerTier, Mode, SessionLine};

use crate::runtime::live::discovery::{ADDR_FILE, TOKEN_FILE};
use crate::runtime::live::ServiceRef;
use crate::tier::gateway::{self as tier, Sandbox, Sandboxes, SANDBOXES_DIR};
use crate::tier::gateway_record::{self as record, Record};

/// `veris gateway`'s settings.
pub struct GatewayConfig {
    pub state_dir: PathBuf,
    pub listen: String,
    pub admin: String,
    /// `--metrics-listen`: a scrape listener of its own.
    pub metrics_listen: Option<String>,
    /// `--metrics-open`: `/metrics` without the admin token.
    pub metrics_open: bool,
    pub ready_file: Option<PathBuf>,
    /// `--ca-dir`: a CA shared by a fleet, loaded only (else STATE/ca).
    pub ca_dir: Option<PathBuf>,
    pub twin: Option<String>,
    pub mode: Mode,
    pub allow_dial: Vec<veris_proxy::outbound::policy::Cidr>,
    pub max_connections: usize,
    /// Each sandbox's limits unless it names its own.
    pub sandbox_limits: SandboxLimits,
    /// `--tls-listen` and its certificate.
    pub tls: Option<crate::runtime::gateway_tls::TlsSettings>,
    /// `--nats`: publish every sandbox's ledger.
    pub nats: crate::runtime::fleet::NatsArgs,
    /// With `--nats`: the fleet's sandbox registry bucket.
    pub registry_bucket: String,
    /// With `--nats`: the identity that certifies each run's seal key.
    pub fleet_identity: Option<PathBuf>,
}

/// The gateway's interception CA: the fleet's shared one (`--ca-dir`),
/// which a gateway must never replace with one of its own (its sandboxes
/// trust only the shared file), else its state dir's, made on first start.
/// Either must be allowed to sign for the catalog's hosts (the gateway's
/// sandboxes route catalog services), the canary and `tls_names` (its TLS
/// listener's leaf).
fn load_ca(
    state_dir: &Path,
    shared: Option<&Path>,
    tls_names: &[String],
) -> Result<CertificateAuthority> {
    let (ca, dir) = match shared {
        Some(dir) => (
            CertificateAuthority::load(dir).with_context(|| {
                format!(
                    "loading the fleet's CA from --ca-dir {}. Next: put the fleet's veris-ca.pem and veris-ca-key.pem (0600, owned by this user) there, e.g. copied from the first gateway's STATE/ca",
                    dir.display()
                )
            })?,
            dir.to_path_buf(),
        ),
        None => {
            let dir = state_dir.join("ca");
            let scope = veris_proxy::scope::scope(None, tls_names)
                .context("the names the CA may sign for (--tls-name)")?;
            let (ca, _) = CertificateAuthority::load_or_create(&dir, &scope)
                .with_context(|| format!("loading the CA in {}", dir.display()))?;
            (ca, dir)
        }
    };
    let needed: Vec<String> = veris_proxy::scope::catalog_hosts()
        .map(str::to_owned)
        .chain([veris_proxy::canary::CANARY_HOST.to_owned()])
        .chain(tls_names.iter().cloned())
        .collect();
    crate::runtime::ca_check::check(&ca, &dir, &needed)?;
    Ok(ca)
}

/// What the gateway's `/metrics` serves: the process, and each sandbox's
/// publishing to NATS.
fn metrics_registry(shared: &Arc<Shared>) -> veris_proxy::admin::metrics::Registry {
    let sandboxes = shared.sandboxes.clone();
    let mut registry = veris_proxy::admin::metrics::registry();
    registry.register_collector(Box::new(veris_fleet::metrics::Collect::each(move || {
        sandboxes
            .all()
            .iter()
            .filter_map(|s| Some(s.publishing.as_ref()?.watch().clone()))
            .collect()
    })));
    registry
}

/// A sandbox's limits, as its record keeps them.
pub use crate::tier::gateway_record::RecordLimits as SandboxLimits;

/// What every sandbox's proxy shares.
struct Shared {
    /// The built-in twin, when it runs: it renders `veris trigger`'s
    /// fixture events for a sandbox.
    builtin_twin: Option<Arc<veris_twin::Twin>>,
    state_dir: PathBuf,
    listen: SocketAddr,
    admin_addr: SocketAddr,
    twin: String,
    twin_auth: Option<String>,
    default_mode: Mode,
    sealer: Arc<Sealer>,
    issuer: Arc<Issuer>,
    /// The roots a sandbox's `https://` webhook URL must chain to (the
    /// system's, as for passthrough).
    webhook_roots: rustls::RootCertStore,
    /// One upstream client for every sandbox: its root stores, session
    /// caches and pooled connections (to the twin, and to the hosts of
    /// passthrough requests) would otherwise be held per sandbox. Requests
    /// stay each sandbox's own; only connections are reused.
    upstream: Arc<Upstream>,
    ca_pem: PathBuf,
    sandbox_limits: SandboxLimits,
    /// The TLS listener's address and the CA file that verifies it, if any.
    tls: Option<(SocketAddr, Option<PathBuf>)>,
    sandboxes: Arc<Sandboxes>,
    /// Ids being added or removed right now ([`reserve`]).
    busy: std::sync::Mutex<std::collections::BTreeSet<String>>,
    admin_token: String,
    /// `--metrics-open`.
    metrics_open: bool,
    cancel: CancellationToken,
    /// The NATS connection every sandbox's publisher shares (`--nats`).
    fleet: Option<veris_fleet::Fleet>,
    /// The fleet's sandbox registry (`--nats`).
    registry: Option<Arc<registry::Fleet>>,
}

/// Runs a gateway until `stop` resolves; then every sandbox's ledger gets
/// its final seal.
pub async fn run(config: GatewayConfig, stop: impl std::future::Future<Output = ()>) -> Result<()> {
    if let Err(e) = crate::os::prctl::set_non_dumpable() {
        warn!(error = %e, "cannot make the gateway non-dumpable");
    }
    let _ = crate::os::fd::raise_open_file_limit();
    let state_dir = config.state_dir.clone();
    // Connects in the background: a NATS server that is down delays nothing.
    let fleet = config.nats.connect().await?;
    // Refused before anything is served: a gateway whose seal keys no
    // reader could verify is a misconfiguration, not a degraded mode.
    let identity = match (&config.fleet_identity, &fleet) {
        (Some(dir), Some(f)) => Some(
            crate::runtime::fleet_identity::Identity::load(dir, &f.settings().gateway)
                .context("loading the gateway's fleet identity (--fleet-identity)")?,
        ),
        _ => None,
    };
    std::fs::create_dir_all(state_dir.join(SANDBOXES_DIR))
        .with_context(|| format!("creating state dir {}", state_dir.display()))?;
    let (shutdown, shutdown_rx) = watch::channel(false);
    // The built-in twin's webhook events, each routed to its sandbox's
    // deliveries ([`webhooks::route`]).
    // The router only hands events on (never waiting), so this queue fills
    // only if the router is starved; its drops, like those of each
    // sandbox's own queue, are recorded by the sandbox's engine.
    let (event_sink, events, dropped) =
        veris_twin::webhook::channel(veris_twin::webhook::EVENT_QUEUE);
    let (twin, twin_task, twin_auth, builtin_twin) = match &config.twin {
        Some(url) => (url.trim_end_matches('/').to_string(), None, None, None),
        None => {
            let (url, task, credential, builtin) = crate::runtime::stack::start_builtin_twin(
                None,
                Some(event_sink),
                shutdown_rx.clone(),
            )
            .await?;
            (url, Some(task), Some(credential), Some(builtin))
        }
    };
    let tls_names = match &config.tls {
        Some(settings) => crate::runtime::gateway_tls::minted_names(settings)?,
        None => Vec::new(),
    };
    let ca = Arc::new(load_ca(&state_dir, config.ca_dir.as_deref(), &tls_names)?);
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

    let tls = match &config.tls {
        Some(settings) => {
            Some(crate::runtime::gateway_tls::bind(settings, &ca, trust.ca_pem.clone()).await?)
        }
        None => None,
    };
    let mut own = veris_proxy::outbound::policy::own_addresses().unwrap_or_default();
    own.extend(tls.as_ref().map(|t| t.addr.ip()));
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
    let metrics_listener =
        crate::runtime::live::bind_metrics(config.metrics_listen.as_deref()).await?;
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
    let registry = match &fleet {
        Some(f) => Some(Arc::new(registry::Fleet::new(f, &config.registry_bucket)?)),
        None => None,
    };
    let shared = Arc::new(Shared {
        builtin_twin,
        state_dir: state_dir.clone(),
        listen,
        admin_addr,
        twin,
        twin_auth,
        default_mode: config.mode,
        sealer,
        issuer: Arc::new(Issuer::new(ca, Issuer::DEFAULT_CAPACITY)),
        webhook_roots: passthrough_roots.clone(),
        upstream: Arc::new(Upstream::new(UpstreamOptions {
            roots,
            passthrough_roots: Some(passthrough_roots),
            ..UpstreamOptions::default()
        })),
        ca_pem: trust.ca_pem.clone(),
        sandbox_limits: config.sandbox_limits,
        tls: tls.as_ref().map(|t| (t.addr, t.ca.clone())),
        sandboxes: sandboxes.clone(),
        busy: std::sync::Mutex::default(),
        admin_token,
        metrics_open: config.metrics_open,
        cancel: CancellationToken::new(),
        fleet,
        registry,
    });
    if let (Some(identity), Some(fleet)) = (&identity, &shared.fleet) {
        crate::runtime::fleet_identity::publish(
            fleet,
            identity,
            &shared.sealer,
            shared.cancel.clone(),
        )?;
    }
    let router = tokio::spawn(webhooks::route(
        events,
        dropped,
        shared.sandboxes.clone(),
        shared.cancel.clone(),
    ));
    // Before the first connection is served: a sandbox the platform holds
    // is never refused for having been restarted.
    restore_all(&shared).await;
    // Then the fleet's: what the bucket says, followed until the stop.
    let follow = shared
        .registry
        .clone()
        .map(|r| tokio::spawn(registry::follow(shared.clone(), r)));
    let (stop_tx, stop_rx) = watch::channel(false);
    let admin = tokio::spawn(serve_admin(admin_listener, shared.clone(), stop_rx.clone()));
    let metrics = metrics_listener.map(|l| {
        let of = shared.clone();
        crate::runtime::live::serve_metrics(
            l,
            Arc::new(move |headers| {
                veris_proxy::admin::metrics::response(&metrics_registry(&of), headers)
            }),
            (!config.metrics_open).then(|| shared.admin_token.clone()),
            stop_rx.clone(),
        )
    });
    // One cap for both listeners: --max-connections is the gateway's.
    let connections = veris_proxy::inbound::gateway::Connections::new(config.max_connections);
    let options = |tls| veris_proxy::inbound::gateway::Options {
        tls,
        handshake: Duration::from_secs(10),
        request_head: Limits::default().request_head,
        connections: connections.clone(),
    };
    let gateway = tokio::spawn(veris_proxy::inbound::gateway::serve(
        listener,
        sandboxes.clone(),
        options(None),
        crate::util::until(&stop_rx),
    ));
    // The TLS listener: the same sandboxes, TLS only.
    let tls_gateway = tls.map(|t| {
        tokio::spawn(veris_proxy::inbound::gateway::serve(
            t.listener,
            sandboxes.clone(),
            options(Some(t.config)),
            crate::util::until(&stop_rx),
        ))
    });
    if let Some(ready) = &config.ready_file {
        let body = json!({
            "listen": listen.to_string(),
            "admin": admin_addr.to_string(),
            "ca": trust.ca_pem.display().to_string(),
            "bundle": trust.bundle.display().to_string(),
            "twin": shared.twin,
            "seal_key": shared.sealer.key_id(),
            "pid": std::process::id(),
            "tls_address": shared.tls.as_ref().map(|(addr, _)| addr.to_string()),
            "tls_ca": shared.tls.as_ref().and_then(|(_, ca)| ca.as_ref()).map(|p| p.display().to_string()),
        });
        write_file(ready, format!("{body}\n").as_bytes(), 0o644)
            .with_context(|| format!("writing the ready file {}", ready.display()))?;
    }
    crate::logging::announce(&format!(
        "gateway {listen} (admin {admin_addr}, twin {}); CA {}",
        shared.twin,
        trust.ca_pem.display()
    ));
    crate::outln!("{listen}");
    // The ready file is written: the listeners accept.
    crate::os::notify::ready();
    stop.await;
    crate::os::notify::stopping();
    info!("shutting down");
    let _ = stop_tx.send(true);
    shared.cancel.cancel();
    let _ = gateway.await;
    if let Some(t) = tls_gateway {
        let _ = t.await;
    }
    let _ = admin.await;
    if let Some(metrics) = metrics {
        let _ = metrics.await;
    }
    if let Some(f) = follow {
        let _ = f.await;
    }
    // Every sandbox drains at once: a stop takes one grace, not one each.
    let all = sandboxes.all();
    futures_util::future::join_all(all.iter().map(|s| close(s, &shared.sealer, seal::SHUTDOWN)))
        .await;
    let _ = router.await;
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

/// Ends a sandbox's session, once: its connections drain, the twin
/// cross-check of its session is recorded, then the final seal — `reason`
/// [`seal::SHUTDOWN`] when the gateway stops holding it, [`seal::REMOVED`]
/// when it leaves for good (removed, expired: nothing follows on its
/// chain, and a stream reader can tell a cut chain from an ended one). As
/// at the end of a `serve`, the check line is what a reader finds once the
/// gateway is gone (`veris receipt --sandbox ID --key <seal_key>`): without
/// it the window could never read verified.
async fn close(sandbox: &Sandbox, sealer: &Sealer, reason: &str) {
    let mut closed = sandbox.closed.lock().await;
    if std::mem::replace(&mut *closed, true) {
        return;
    }
    sandbox.timer.abort();
    sandbox.proxy.shutdown().await;
    // No request makes an event now: what was queued gets its attempt,
    // recorded before the check and the final seal; retries not yet due
    // are not made.
    if let Some(deliveries) = &sandbox.webhooks {
        if let Some(engine) = deliveries.engine.lock().await.take() {
            engine.stop().await;
        }
        if let Some(ingress) = &deliveries.ingress {
            ingress.close().await;
        }
    }
    // No traffic can arrive now: the window is exact.
    let since = sandbox.admin.session_seq.saturating_sub(1);
    let head = sandbox.ledger.head().0;
    let services: Vec<ServiceRef> = sandbox
        .admin
        .services
        .iter()
        .map(|(name, upstream)| ServiceRef {
            name: name.clone(),
            upstream: upstream.clone(),
        })
        .collect();
    let unrecorded = sandbox.admin.unrecorded.counts();
    let twin = crate::runtime::live::twin_cross_check_file(
        sandbox.ledger.path(),
        since,
        head,
        &services,
        Some(&sandbox.twin_heads),
        false,
        Some(&unrecorded),
    )
    .await;
    let line = Entry::Check(CheckLine {
        name: twin.name,
        status: match twin.status {
            CheckStatus::Ok => "ok",
            CheckStatus::Failed => "failed",
            _ => "unverified",
        }
        .into(),
        detail: twin.detail,
        since_seq: since,
        until_seq: head,
    });
    if let Err(e) = sandbox.ledger.append(line) {
        warn!(sandbox = %sandbox.id, error = %e, "cannot record the sandbox's twin cross-check");
    }
    if let Some(p) = &sandbox.publishing {
        p.record_refusal(&sandbox.ledger, since);
    }
    if let Err(e) = sandbox.ledger.seal(sealer, reason) {
        warn!(sandbox = %sandbox.id, error = %e, "cannot append the sandbox's final seal");
    }
    // What the file holds, the final seal included, goes to the stream
    // before the sandbox is gone (what does not is in the file, and a
    // restart of the gateway publishes it).
    if let Some(p) = &sandbox.publishing {
        if !p.finish().await {
            warn!(sandbox = %sandbox.id, "the sandbox's last ledger lines did not reach the NATS stream; they are in its ledger file");
        }
    }
    let dir = sandbox.ledger.path().parent().map(Path::to_path_buf);
    if let Some(dir) = dir {
        for f in [ADDR_FILE, TOKEN_FILE] {
            let _ = std::fs::remove_file(dir.join(f));
        }
    }
}

/// Sets `path`'s mode to exactly `mode`.
fn private(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {} to {mode:o}", path.display()))
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
    #[serde(default)]
    pub max_connections: Option<usize>,
    #[serde(default)]
    pub max_rps: Option<u32>,
    #[serde(default)]
    pub max_bytes_per_sec: Option<u64>,
    /// `SERVICE=URL`: where the built-in twin's events for it go.
    #[serde(default)]
    pub webhooks: Vec<String>,
    /// Faults on its deliveries, as `--webhook-faults`.
    #[serde(default)]
    pub webhook_faults: Vec<String>,
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
    /// Its limits, its own or the gateway's defaults.
    #[serde(default)]
    pub limits: Option<SandboxLimits>,
    /// `HOST:PORT` of the TLS listener (`--tls-listen`), where SOCKS5 and
    /// HTTP proxy requests are served inside TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_address: Option<String>,
    /// `https://USER:PASS@HOST:PORT`: HTTP CONNECT inside TLS (curl's
    /// `--proxy https://…`). SOCKS5 inside TLS has no URL scheme: give the
    /// platform `tls_address`, `username` and `password`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub https_proxy_url: Option<String>,
    /// The CA file that verifies the TLS listener (the gateway's CA); absent
    /// with an operator's certificate, which the client's usual roots verify.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<String>,
    /// Its webhook signing secret per service (`--webhook`), only here:
    /// the app verifies deliveries with it (`STRIPE_WEBHOOK_SECRET`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub webhook_secrets: BTreeMap<String, String>,
    /// With `--webhook` and an external twin: where that twin POSTs its
    /// events (`SERVICE` replaced by the service) and the token it must
    /// present, only here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_token: Option<String>,
}

/// Registers a sandbox from `POST /sandboxes`: its credentials (the
/// password only in the answer, its digest in the record), its record
/// (written before the credentials are answered, so a sandbox the
/// platform holds survives a restart) and, with `--nats`, in the fleet's
/// registry; then [`start`].
async fn add(shared: &Arc<Shared>, new: NewSandbox) -> Result<Registered> {
    tier::valid_id(&new.id)?;
    let _reserved = reserve(shared, &new.id)?;
    let password = crate::util::random_hex(24)?;
    let read_token = crate::util::random_hex(32)?;
    let now = SystemTime::now();
    let record = Record {
        v: record::RECORD_VERSION,
        id: new.id.clone(),
        password_sha256: record::hex(&tier::digest(&password)),
        read_token_sha256: record::hex(&tier::digest(&read_token)),
        services: new
            .services
            .iter()
            .flat_map(|s| s.split(','))
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        mode: new.mode.unwrap_or(shared.default_mode),
        twin: new.twin.clone(),
        limits: SandboxLimits {
            max_connections: new
                .max_connections
                .unwrap_or(shared.sandbox_limits.max_connections)
                .max(1),
            max_rps: new.max_rps.unwrap_or(shared.sandbox_limits.max_rps),
            max_bytes_per_sec: new
                .max_bytes_per_sec
                .unwrap_or(shared.sandbox_limits.max_bytes_per_sec),
        },
        created_ms: record::unix_ms(now),
        expires_ms: new
            .ttl_secs
            .map(|s| record::unix_ms(now + Duration::from_secs(s))),
        revoked_ms: None,
        webhooks: new.webhooks.clone(),
        webhook_faults: new.webhook_faults.clone(),
    };
    let dir = sandbox_dir(shared, &new.id);
    let registration = webhooks::register(
        &dir,
        webhooks::Ask {
            webhooks: &new.webhooks,
            faults: &new.webhook_faults,
            builtin_twin: new.twin.is_none() && shared.twin_auth.is_some(),
            fleet: shared.registry.is_some(),
        },
    )
    .await?;
    // The sandbox's dir reads as a live serve's: at registration its
    // admin.token is the read token itself.
    let sandbox = match start(shared, record, read_token.clone()).await {
        Ok(s) => s,
        Err(e) => {
            webhooks::forget(&dir);
            return Err(e);
        }
    };
    // The fleet's first (`--nats`): refused there, refused here.
    let fleet = match &shared.registry {
        Some(r) => r.register(&sandbox.record).await,
        None => Ok(()),
    };
    let saved = fleet.and_then(|()| sandbox.record.save(&sandbox_dir(shared, &sandbox.id)));
    if let Err(e) = saved.and_then(|()| shared.sandboxes.insert(sandbox.clone())) {
        close(&sandbox, &shared.sealer, seal::SHUTDOWN).await;
        let _ = std::fs::remove_file(dir.join(record::RECORD_FILE));
        webhooks::forget(&dir);
        return Err(e);
    }
    info!(sandbox = %new.id, services = ?sandbox.services, mode = ?sandbox.mode, "sandbox registered");
    let expires = sandbox.expires.map(|e| {
        time::OffsetDateTime::from(e)
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default()
    });
    let https_proxy_url = shared
        .tls
        .as_ref()
        .map(|(addr, _)| format!("https://{}:{password}@{addr}", new.id));
    Ok(Registered {
        username: new.id.clone(),
        proxy_url: format!("socks5h://{}:{password}@{}", new.id, shared.listen),
        http_proxy_url: format!("http://{}:{password}@{}", new.id, shared.listen),
        address: shared.listen.to_string(),
        id: new.id,
        password,
        read_token,
        canary: sandbox.admin.identity.canary.clone(),
        ca: shared.ca_pem.display().to_string(),
        services: sandbox.services.clone(),
        mode: sandbox.mode,
        expires,
        limits: Some(sandbox.record.limits),
        tls_address: shared.tls.as_ref().map(|(addr, _)| addr.to_string()),
        https_proxy_url,
        tls_ca: shared
            .tls
            .as_ref()
            .and_then(|(_, ca)| ca.as_ref())
            .map(|p| p.display().to_string()),
        webhook_secrets: registration.secrets,
        ingress_url: registration.ingress_token.as_ref().map(|_| {
            format!(
                "http://{}/sandboxes/{}/ingress/SERVICE",
                shared.admin_addr, sandbox.id
            )
        }),
        ingress_token: registration.ingress_token,
    })
}

/// Serves every stored record again at start ([`record::load_all`] skips,
/// with a log line, the removed, the expired and the unreadable). The read
/// token is kept as a digest only, so the sandbox's `admin.token` is a token
/// of this run that reads only it; the platform's read token still reads it.
/// An ended sandbox whose chain lacks its `removed` seal (it expired while
/// the gateway was down, or the gateway died mid-removal) gets it now.
async fn restore_all(shared: &Arc<Shared>) {
    let stored = record::load_all(&shared.state_dir.join(SANDBOXES_DIR), SystemTime::now());
    for record in stored.ended {
        end_chain(shared, record).await;
    }
    let mut restored = 0usize;
    for record in stored.live {
        let id = record.id.clone();
        let started = match crate::util::random_hex(32) {
            Ok(local) => start(shared, record, local).await,
            Err(e) => Err(e),
        };
        match started.and_then(|s| shared.sandboxes.insert(s)) {
            Ok(()) => restored += 1,
            Err(e) => {
                warn!(sandbox = %id, error = %format!("{e:#}"), "cannot restore a stored sandbox; it stays refused")
            }
        }
    }
    if restored > 0 {
        info!(restored, "sandboxes restored from their records");
    }
}

/// Writes an ended sandbox's final `removed` seal (after this run's session
/// line, published like any) unless its chain has it, never serving it.
async fn end_chain(shared: &Arc<Shared>, record: Record) {
    let id = record.id.clone();
    let ledger = sandbox_dir(shared, &id).join("ledger.jsonl");
    let ended = std::fs::File::open(&ledger)
        .ok()
        .map(|f| veris_receipt::ledger::last_line(&f).ok().flatten());
    match ended {
        // No ledger: nothing to end.
        None => return,
        Some(Some(l)) if matches!(&l.entry, Entry::Seal { reason, .. } if reason == seal::REMOVED) => {
            return
        }
        Some(_) => {}
    }
    let started = match crate::util::random_hex(32) {
        Ok(token) => start(shared, record, token).await,
        Err(e) => Err(e),
    };
    match started {
        Ok(s) => {
            close(&s, &shared.sealer, seal::REMOVED).await;
            info!(sandbox = %id, "an ended sandbox's chain lacked its final seal; it has it now");
        }
        Err(e) => {
            warn!(sandbox = %id, error = %format!("{e:#}"), "cannot end an ended sandbox's chain; a stream reader takes it as cut")
        }
    }
}

/// Whether `id` is being added or removed right now: such an id is busy
/// until the guard drops, so that one ledger has one writer.
struct Reserved<'a> {
    shared: &'a Shared,
    id: String,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if let Ok(mut busy) = self.shared.busy.lock() {
            busy.remove(&self.id);
        }
    }
}

/// Reserves `id` for an add: refused when it is registered or busy.
fn reserve<'a>(shared: &'a Shared, id: &str) -> Result<Reserved<'a>> {
    let mut busy = shared
        .busy
        .lock()
        .map_err(|_| anyhow::anyhow!("the busy table is poisoned"))?;
    if busy.contains(id) || shared.sandboxes.get(id).is_some() {
        bail!("sandbox {id} is registered already. Next: pick another id (an id is served once)");
    }
    busy.insert(id.to_string());
    Ok(Reserved {
        shared,
        id: id.to_string(),
    })
}

/// Removes `id`: refused from now on, its record rewritten `revoked` (so a
/// restart never serves it again; deleted when it cannot be rewritten),
/// then its final seal. With `to_fleet`, revoked in the fleet's registry
/// too (before its connections drain: every gateway refuses it at once).
/// None: no such sandbox (or one being added or removed); Err: its record
/// may bring it back after a restart, or other gateways still serve it.
async fn remove(shared: &Arc<Shared>, id: &str, to_fleet: bool) -> Option<Result<()>> {
    let _reserved = {
        let mut busy = shared.busy.lock().ok()?;
        // Being added (not registered yet) or being removed: no such sandbox.
        if !busy.insert(id.to_string()) {
            return None;
        }
        Reserved {
            shared,
            id: id.to_string(),
        }
    };
    let sandbox = shared.sandboxes.remove(id)?;
    let dir = sandbox_dir(shared, id);
    let mut revoked = sandbox.record.clone();
    revoked.revoked_ms = Some(record::unix_ms(SystemTime::now()));
    let stored = revoked.save(&dir).or_else(|e| {
        std::fs::remove_file(dir.join(record::RECORD_FILE))
            .with_context(|| format!("{e:#}; deleting the record instead"))
    });
    let fleet = match (&shared.registry, to_fleet) {
        (Some(r), true) => r.revoke(revoked).await.context(
            "removed here, but the fleet's registry could not be written: other gateways still serve it. Retried until it is written",
        ),
        _ => Ok(()),
    };
    close(&sandbox, &shared.sealer, seal::REMOVED).await;
    webhooks::forget(&dir);
    let stored = stored.context("the sandbox is refused now, but its record could not be revoked: a restart would serve it again. Next: delete that file");
    Some(stored.and(fleet))
}

/// `<state>/sandboxes/<id>`.
fn sandbox_dir(shared: &Shared, id: &str) -> PathBuf {
    shared.state_dir.join(SANDBOXES_DIR).join(id)
}

/// Starts serving `record`: routes, ledger and session line, proxy, admin
/// part (read with `admin_token` or the record's read token), files, seal
/// timer. Shared by [`add`] and [`restore_all`]; the caller registers it.
async fn start(shared: &Arc<Shared>, record: Record, admin_token: String) -> Result<Arc<Sandbox>> {
    record.check(&record.id)?;
    let (password, read_token) = record
        .password()
        .zip(record.read_token())
        .context("the record's digests are not hex")?;
    let route = routes(shared, &record)?;
    let dir = sandbox_dir(shared, &record.id);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // A sandbox's ledger holds one tenant's request paths and hosts: only
    // the gateway's uid reads it on this host (other tenants read theirs
    // through the admin API with their read token). Unlike serve's state
    // dir, no workload on this host needs to read it.
    private(&dir, 0o700)?;
    let identity = Identity {
        run_id: crate::util::random_hex(8)?,
        sandbox_id: record.id.clone(),
        canary: format!("cnry_{}", crate::util::random_hex(16)?),
        mode: record.mode,
        tier: ListenerTier::Gateway,
    };
    let services_refs = crate::runtime::live::service_refs(&route.settings.router);
    let (ledger, session_seq, twin_heads) =
        open_ledger(shared, &dir, &identity, &route.twin, &services_refs).await?;
    let publishing = match &shared.fleet {
        Some(fleet) => Some(Arc::new(crate::runtime::fleet::Publishing::start(
            fleet, &ledger, &record.id,
        )?)),
        None => None,
    };
    let proxy = Proxy::new(
        ProxyOptions {
            router: route.settings.router,
            identity: identity.clone(),
            twin_base: route.twin.clone(),
            twin_auth: route.twin_auth,
            upstream: shared.upstream.clone(),
            grace: Duration::from_secs(5),
            limits: Limits {
                max_connections: record.limits.max_connections,
                max_rps: record.limits.max_rps,
                max_bytes_per_sec: record.limits.max_bytes_per_sec,
                ..Limits::default()
            },
            capture: None,
        },
        shared.issuer.clone(),
        ledger.clone(),
    );
    let builtin_twin = record.twin.is_none() && shared.twin_auth.is_some();
    let twin = shared.builtin_twin.as_ref().filter(|_| builtin_twin);
    let deliveries = webhooks::start(&dir, &record, &ledger, twin, &shared.webhook_roots);
    let admin = Arc::new(veris_proxy::admin::Admin {
        token: admin_token.clone(),
        identity,
        proxy_url: format!("http://{}", shared.listen),
        twin: route.twin,
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
        publishing: publishing
            .as_ref()
            .map(|p| crate::runtime::fleet::status_of(p.watch().clone())),
        // `veris trigger|replay --sandbox`: the gateway's token only (below).
        webhooks: deliveries.as_ref().and_then(|d| d.control.clone()),
        ingress: deliveries.as_ref().and_then(|d| d.ingress.clone()),
    });
    let sandbox = Arc::new(Sandbox {
        webhooks: deliveries,
        id: record.id.clone(),
        password,
        read_token_sha256: read_token,
        services: services_refs.iter().map(|s| s.name.clone()).collect(),
        mode: record.mode,
        expires: record.expires(),
        twin_heads,
        proxy,
        timer: seal_timer(shared, &ledger, publishing.clone(), session_seq),
        ledger,
        admin,
        record,
        publishing,
        closed: Default::default(),
    });
    expiry_timer(shared, &sandbox);
    if let Err(e) = write_files(shared, &dir, &sandbox.id, &admin_token) {
        close(&sandbox, &shared.sealer, seal::SHUTDOWN).await;
        return Err(e);
    }
    Ok(sandbox)
}

/// A sandbox's routes and twin.
struct Route {
    settings: Settings,
    twin: String,
    twin_auth: Option<String>,
}

/// Its services' routes to its twin (its own, or the gateway's with the
/// gateway's credential).
fn routes(shared: &Shared, record: &Record) -> Result<Route> {
    let twin = record.twin.clone().unwrap_or_else(|| shared.twin.clone());
    let twin_auth = match &record.twin {
        Some(_) => None,
        None => shared.twin_auth.clone(),
    };
    let settings = Settings::from_flags(Flags {
        listen: "127.0.0.1:0",
        twin: &twin,
        sandbox_id: &record.id,
        services: &record.services,
        routes: &[],
        mode: record.mode,
        allow_passthrough: &[],
    })?;
    Ok(Route {
        settings,
        twin,
        twin_auth,
    })
}

/// Opens (or continues) the sandbox's ledger in `dir` under this run's seal
/// key — `ledger.pub` keeps the keys of earlier runs, so their seals still
/// verify — and appends this run's session line; its seq.
async fn open_ledger(
    shared: &Shared,
    dir: &Path,
    identity: &Identity,
    twin: &str,
    services: &[crate::runtime::live::ServiceRef],
) -> Result<(Arc<Ledger>, u64, BTreeMap<String, u64>)> {
    let mut own = PublicKeys::load(&dir.join(PUB_FILE))?;
    own.keys.push(shared.sealer.public_key());
    shared.sealer.publish(dir)?;
    let (ledger, report) = Ledger::open_sealed_by(&dir.join("ledger.jsonl"), &own)?;
    private(ledger.path(), 0o600)?;
    ended_for_good(&ledger, &identity.sandbox_id)?;
    let ledger = Arc::new(ledger);
    let twin_heads = crate::runtime::live::twin_newest_ids(services).await;
    let session = Entry::Session(SessionLine {
        run_id: identity.run_id.clone(),
        sandbox_id: identity.sandbox_id.clone(),
        mode: identity.mode,
        tier: ListenerTier::Gateway,
        twin: twin.to_string(),
        pid: std::process::id(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        listen: shared.listen.to_string(),
        recovered_torn_tail: report.torn_tail,
        key_id: Some(shared.sealer.key_id().to_string()),
        public_key: Some(shared.sealer.public_key_hex()),
        key_storage: Some("memory".into()),
        proxy_uid: Some(crate::os::prctl::euid()),
        workload_uid: None,
        twin_heads: Some(twin_heads.clone()),
        moved_aside: report.moved_aside.clone(),
        coverage: Some(Box::new(tier::coverage())),
    });
    let seq = ledger
        .append(session)
        .context("writing the sandbox's session line")?;
    Ok((ledger, seq, twin_heads))
}

/// Refuses to continue a chain that ends in its [`seal::REMOVED`] seal: a
/// sandbox id is served once (a stream reader takes that seal as the
/// chain's end; lines after it would make a cut chain read complete).
fn ended_for_good(ledger: &Ledger, id: &str) -> Result<()> {
    let file = std::fs::File::open(ledger.path())
        .with_context(|| format!("reading {}", ledger.path().display()))?;
    let last = veris_receipt::ledger::last_line(&file)
        .with_context(|| format!("reading {}", ledger.path().display()))?;
    if let Some(l) = last {
        if matches!(&l.entry, Entry::Seal { reason, .. } if reason == seal::REMOVED) {
            bail!("sandbox {id} was removed (or expired) here at {}: its chain ended in its final seal, and an id is served once so that its receipt stays its own. Next: add it under another id", l.ts);
        }
    }
    Ok(())
}

/// Seals the ledger's unsealed lines once a second (or when due) until the
/// gateway stops; and records, under the next seal, a refusal of its
/// publishing for good (a fork).
fn seal_timer(
    shared: &Shared,
    ledger: &Arc<Ledger>,
    publishing: Option<Arc<crate::runtime::fleet::Publishing>>,
    session_seq: u64,
) -> tokio::task::JoinHandle<()> {
    let (ledger, sealer, cancel) = (ledger.clone(), shared.sealer.clone(), shared.cancel.clone());
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => {}
                () = ledger.seal_due() => {}
            }
            if let Some(p) = &publishing {
                p.record_refusal(&ledger, session_seq.saturating_sub(1));
            }
            if let Err(e) = ledger.seal_if_unsealed(&sealer, "interval") {
                warn!(error = %e, "cannot append an interval seal");
            }
        }
    })
}

/// When the sandbox's `--ttl` runs out, its session ends for good ([`close`]
/// with [`seal::REMOVED`]): its open connections are closed and its final
/// seal written (new connections are refused from then on by the credential
/// check); on every gateway of a fleet at once, as each holds the same
/// expiry. It stays listed, expired.
fn expiry_timer(shared: &Shared, sandbox: &Arc<Sandbox>) {
    let Some(expires) = sandbox.expires else {
        return;
    };
    let (weak, cancel, sealer) = (
        Arc::downgrade(sandbox),
        shared.cancel.clone(),
        shared.sealer.clone(),
    );
    tokio::spawn(async move {
        let left = expires
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(left) => {}
        }
        if let Some(sandbox) = weak.upgrade() {
            info!(sandbox = %sandbox.id, "the sandbox's --ttl ran out; closing its open connections and its ledger");
            close(&sandbox, &sealer, seal::REMOVED).await;
        }
    });
}

/// The sandbox's dir reads as a live serve's: its part of the admin API
/// (`admin.addr`) and a token that reads only it (`admin.token`).
fn write_files(shared: &Shared, dir: &Path, id: &str, token: &str) -> Result<()> {
    write_file(
        &dir.join(TOKEN_FILE),
        format!("{token}\n").as_bytes(),
        0o600,
    )?;
    write_file(
        &dir.join(ADDR_FILE),
        format!("{}/sandboxes/{id}\n", shared.admin_addr).as_bytes(),
        0o644,
    )?;
    Ok(())
}

/// The admin API until `stop` says true. As serve's ([`veris_proxy::admin`]):
/// a client that takes longer than [`Limits::request_head`] for a request
/// head (a slowloris, or an idle connection) is closed; and at most
/// [`Limits::max_connections`] are open at once (a new one over that is
/// closed), so a flood of idle connections cannot take the descriptors the
/// sandboxes' listener needs.
async fn serve_admin(listener: TcpListener, shared: Arc<Shared>, stop: watch::Receiver<bool>) {
    let tasks = tokio_util::task::TaskTracker::new();
    let limits = Limits::default();
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let warned = std::sync::atomic::AtomicU64::new(0);
    let head_timeout = limits.request_head;
    let accepted = veris_accept::accept_until(
        listener,
        crate::util::until(&stop),
        veris_accept::OnError::Retry,
        |stream, peer| {
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                if veris_proxy::inbound::gateway::once_a_second(&warned) {
                    warn!(
                        max = limits.max_connections,
                        "too many admin API connections open; closing new ones until some end"
                    );
                }
                return;
            };
            let shared = shared.clone();
            tasks.spawn(async move {
                let cancel = shared.cancel.clone();
                let service = hyper::service::service_fn(move |req| {
                    let shared = shared.clone();
                    async move { Ok::<_, Infallible>(admin_request(shared, req).await) }
                });
                let served =
                    veris_proxy::inbound::http::serve_http1(stream, service, &cancel, head_timeout)
                        .await;
                if let Err(e) = served {
                    tracing::debug!(error = %e, %peer, "admin connection ended with an error");
                }
                drop(permit);
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
                        "max_connections": s.proxy.limits().max_connections,
                        "max_rps": s.proxy.limits().max_rps,
                        "max_bytes_per_sec": s.proxy.limits().max_bytes_per_sec,
                        "expired": s.expired(SystemTime::now()),
                        "webhooks": s.record.webhooks,
                        "publishing": s.publishing.as_ref().map(|p| json!(p.watch().state())),
                    })
                })
                .collect();
            ok_json(StatusCode::OK, json!({"sandboxes": list}))
        }
        // The gateway's own: its sandboxes' publishing (`--nats`).
        (Method::GET, ["status"]) if is_admin => {
            let publishing: BTreeMap<String, serde_json::Value> = shared
                .sandboxes
                .all()
                .iter()
                .filter_map(|s| {
                    let p = s.publishing.as_ref()?;
                    Some((s.id.clone(), json!(p.watch().state())))
                })
                .collect();
            ok_json(
                StatusCode::OK,
                json!({
                    "listen": shared.listen.to_string(),
                    "sandboxes": shared.sandboxes.all().len(),
                    "nats": shared.fleet.as_ref().map(|f| json!({
                        "stream": f.settings().stream,
                        "name": f.settings().gateway,
                    })),
                    "publishing": publishing,
                    "registry": shared.registry.as_ref().map(|r| r.status()),
                }),
            )
        }
        (Method::GET, ["metrics"]) if is_admin || shared.metrics_open => {
            veris_proxy::admin::metrics::response(&metrics_registry(&shared), req.headers())
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
        (Method::DELETE, ["sandboxes", id]) if is_admin => match remove(&shared, id, true).await {
            Some(Ok(())) => {
                info!(sandbox = %id, "sandbox removed");
                ok_json(StatusCode::OK, json!({"removed": id}))
            }
            // The fleet's: revoked in its registry (this gateway may not
            // serve it, or not yet).
            None => match &shared.registry {
                Some(r) => match r.remove_unserved(id).await {
                    Ok(true) => {
                        info!(sandbox = %id, "sandbox removed from the fleet's registry");
                        ok_json(StatusCode::OK, json!({"removed": id}))
                    }
                    Ok(false) => error(
                        StatusCode::NOT_FOUND,
                        "veris_no_such_sandbox",
                        format!("no sandbox {id:?}"),
                    ),
                    Err(e) => error(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "veris_sandbox_not_revoked",
                        format!("{e:#}"),
                    ),
                },
                None => error(
                    StatusCode::NOT_FOUND,
                    "veris_no_such_sandbox",
                    format!("no sandbox {id:?}"),
                ),
            },
            Some(Err(e)) => {
                warn!(sandbox = %id, error = %format!("{e:#}"), "sandbox removed, its record not revoked");
                error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "veris_sandbox_not_revoked",
                    format!("{e:#}"),
                )
            }
        },
        (_, ["sandboxes", id, tail]) => {
            let Some(sandbox) = shared.sandboxes.get(id) else {
                return error(
                    StatusCode::NOT_FOUND,
                    "veris_no_such_sandbox",
                    format!("no sandbox {id:?}"),
                );
            };
            // The gateway's token reads every sandbox, and the read token
            // (kept as its digest) reads this one: each stands in for the
            // token of its admin part, which alone reads nothing else.
            let is_reader = bearer(&req).is_some_and(|t| {
                bool::from(tier::digest(t.trim()).ct_eq(&sandbox.read_token_sha256))
            });
            // Deliveries on demand write to the sandbox's ledger: the
            // gateway's token alone asks for them, never a read token.
            if tail.starts_with("webhooks") && !is_admin {
                return error(
                    StatusCode::FORBIDDEN,
                    "veris_admin_only",
                    "delivering a sandbox's webhook events on demand needs the gateway's admin token (<state>/admin.token); a sandbox's read token only reads. Next: run `veris trigger … --sandbox ID --state-dir GATEWAY_STATE` as the gateway's operator".into(),
                );
            }
            if is_admin || is_reader {
                if let Ok(v) =
                    http::HeaderValue::from_str(&format!("Bearer {}", sandbox.admin.token))
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
