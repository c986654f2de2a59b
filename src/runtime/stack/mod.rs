//! Starting and stopping the proxy stack shared by `serve`, `run` and `demo`:
//! CA and trust material, the built-in twin when none is given, the seal key,
//! the ledger and its session line, the proxy listener, the env and ready
//! files; and ending a session with its checks recorded and its final seal.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};
use veris_ca::env::EnvSpec;
use veris_ca::trust::TrustFiles;
use veris_ca::{CertificateAuthority, Issuer, LoadOutcome};
use veris_proxy::body::capture::{Capture, CaptureOptions};
use veris_proxy::config::Settings;
use veris_proxy::outbound::upstream::{Upstream, UpstreamOptions};
use veris_proxy::{Identity, Proxy, ProxyOptions};
use veris_receipt::ledger::{Ledger, OpenReport, SealInfo};
use veris_receipt::receipt::{Check, CheckStatus};
use veris_receipt::seal::Sealer;
use veris_receipt::{CheckLine, Coverage, Entry, ListenerTier};

use crate::runtime::checks::{self, LiveRun, Reader};
use crate::runtime::live::{AdminHandle, AdminListener, ServiceRef};
use crate::tier::{Tier, TransparentListeners};
use crate::util::until;

mod announce;
mod args;
mod ledger;
mod routing;
pub(crate) mod webhooks;

use announce::Announce;
pub use announce::{merged_no_proxy, EnvBase};
pub use args::{EnvFormatArg, ModeArg, ProxyArgs, ServeArgs, DEFAULT_SANDBOX};
use ledger::{open_ledger, session_entry, SessionFacts};
pub use routing::routed_services;
use routing::{routing, warn_unreachable_twins, Routing};
pub(crate) use routing::{start_builtin_twin, upstream_roots};
pub use webhooks::parse as parse_webhook;

/// Which command the stack serves; it decides where the ledger and the seal
/// key live and who may talk to the proxy (DESIGN §7a.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `veris serve`: `<state>/ledger.jsonl` continued across restarts when
    /// its tail is a seal by an earlier session's key, a fresh in-memory key
    /// each session (like a run's), the admin API announced
    /// in `<state>/admin.addr` and `admin.token`.
    Serve,
    /// `veris run` and `veris demo`: a ledger of its own,
    /// `<state>/runs/<run_id>/ledger.jsonl`, sealed by a key that exists
    /// only in this process's memory; no admin API, so no token a child of
    /// the same uid could read.
    Run,
}

/// Where the runs of `veris run` keep their ledgers.
pub const RUNS_DIR: &str = "runs";

/// A running stack.
pub struct Stack {
    pub proxy_url: String,
    pub proxy_addr: SocketAddr,
    pub twin_base: String,
    pub ledger: Arc<Ledger>,
    /// Seq of this run's session line: the receipt window starts there.
    pub session_seq: u64,
    pub identity: Identity,
    pub trust: TrustFiles,
    pub sealer: Arc<Sealer>,
    /// Routed services and their twin upstreams (for the cross-check).
    pub services: Vec<ServiceRef>,
    /// Every routed host pattern: what a user's `NO_PROXY` must not exempt.
    pub routed_hosts: Vec<String>,
    /// Newest twin log id per service when the session started.
    pub twin_heads: Option<BTreeMap<String, u64>>,
    /// The open-file limit before the start raised it, for a child.
    pub file_limit: crate::os::fd::FileLimit,
    /// Stops the listeners (traffic) first, then everything else.
    stop_traffic: watch::Sender<bool>,
    shutdown: watch::Sender<bool>,
    proxy_task: JoinHandle<std::io::Result<()>>,
    transparent_task: Option<JoinHandle<std::io::Result<()>>>,
    /// How the workload's traffic reaches the proxy ([`Stack::run_workload`]).
    tier: Box<dyn Tier>,
    twin_task: Option<JoinHandle<()>>,
    /// Admin API (serve only), seal timer and the files that announce them.
    pub admin: crate::runtime::live::AdminHandle,
    /// Body capture (`--capture-bodies`), flushed before the final seal.
    capture: Option<Arc<Capture>>,
    /// Requests the proxy sent to the twin but could not record.
    unrecorded: Arc<veris_proxy::request::recorder::Unrecorded>,
    /// Publishing the ledger to NATS (`--nats`), flushed after the final seal.
    publisher: Option<Arc<crate::runtime::fleet::Publishing>>,
    /// `--webhook`: the delivery engine, stopped before the final seal.
    webhook_engine: Option<veris_proxy::callback::Engine>,
    /// The variables that give the command its webhook secrets.
    pub webhook_env: Vec<(String, String)>,
    /// Where webhooks go, a line each, for a person.
    pub webhooks_described: Vec<String>,
    /// The ingress for an external twin (`--twin` with `--webhook`),
    /// closed before the final seal.
    ingress: Option<Arc<veris_proxy::callback::Ingress>>,
    /// Its address and token, for the person who points the external twin
    /// at it (serve prints it; never in the workload's environment).
    pub ingress_described: Option<String>,
}

/// How a session ended: its final seal and the checks recorded before it.
pub struct Finished {
    pub ledger_path: PathBuf,
    /// The final (`shutdown`) seal, as the proxy wrote it.
    pub seal: Option<SealInfo>,
    /// Why the final seal could not be written, when it could not (a full
    /// disk, say): the receipt names it instead of a missing key.
    pub seal_error: Option<String>,
    /// The sealing key, raw hex: with `seal`, the anchor of a live verdict.
    pub public_key: String,
    pub key_id: String,
    /// The canary and twin cross-check, as recorded in the ledger.
    pub checks: Vec<Check>,
}

impl Stack {
    /// Starts everything; `default_listen` applies when `--listen` is absent.
    /// The phases, in order (one function each): the host (privileges, file
    /// limit, state dir), routing (and the built-in twin), CA and trust, seal
    /// key and ledger, listeners (the proxy's and the tier's), the redirect,
    /// the twin's log position, the admin listener with the env and ready
    /// files, the session line, the proxy, the admin API, then serving.
    /// Everything that can fail comes before the session line, so a start
    /// that fails leaves the ledger as it was.
    pub async fn start(
        args: &ServeArgs,
        default_listen: &str,
        role: Role,
        mut tier: Box<dyn Tier>,
    ) -> Result<Stack> {
        let mut host = prepare_host(args, &*tier)?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (stop_traffic, traffic_rx) = watch::channel(false);
        let Routing {
            settings,
            twin_task,
            twin_auth,
            webhooks,
        } = routing(&args.proxy, default_listen, shutdown_rx.clone()).await?;
        let services = crate::runtime::live::service_refs(&settings.router);
        let routed_hosts = settings.router.routed_hosts();
        let (ca_dir, trust, tls) = ca_and_trust(args, &settings, &host.state_dir)?;
        let (sealer, ledger, report, run_id) = seal_key_and_ledger(&host.state_dir, role)?;
        let mut bound = bind_listeners(&settings, &mut *tier).await?;
        if let Some(c) = bound.coverage.as_mut() {
            c.upstream_proxy = host.upstream_proxy.is_some();
        }
        let identity = identity(run_id, &settings, bound.tier.is_some())?;
        let fleet = args.nats.connect().await?;
        if fleet.is_some() {
            veris_fleet::check_token("the sandbox id", &identity.sandbox_id)?;
        }
        let coverage = bound.coverage.take();
        // The twin's log position now: the cross-check counts rows after it.
        let (twin_heads, ()) = tokio::join!(
            crate::runtime::live::twin_newest_ids(&services),
            warn_unreachable_twins(&services)
        );
        let euid = crate::os::prctl::euid();
        let webhook_env = webhooks.as_ref().map(|w| w.env()).unwrap_or_default();
        let webhooks_described = webhooks.as_ref().map(|w| w.described()).unwrap_or_default();
        let announced = Announce {
            webhook_env: &webhook_env,
            proxy_url: &bound.proxy_url,
            identity: &identity,
            twin_base: &settings.twin_base,
            state_dir: &host.state_dir,
            ledger: &ledger,
            trust: &trust,
            routed_hosts: &routed_hosts,
            admin: None,
            key_id: sealer.key_id(),
            transparent: bound.transparent_addrs,
        };
        let admin_listener = announce(args, role, announced, &ca_dir, &mut *tier).await?;
        let session = session_entry(SessionFacts {
            args,
            role,
            identity: &identity,
            twin: &settings.twin_base,
            listen: bound.proxy_addr,
            report: &report,
            sealer: &sealer,
            twin_heads: &twin_heads,
            euid,
            coverage,
        });
        let session_seq = append_session(args, &ledger, session)?;
        let app_dialer = bound.app_dialer.take().unwrap_or_default();
        let ingress_token = webhooks
            .as_ref()
            .and_then(|w| w.ingress_token())
            .map(str::to_string);
        let webhooks::Started {
            engine: webhook_engine,
            ingress,
        } = match webhooks {
            Some(w) => w.start(
                Arc::clone(&ledger),
                app_dialer,
                tls.passthrough_roots.clone(),
            ),
            None => webhooks::Started {
                engine: None,
                ingress: None,
            },
        };
        // The external twin's way in: `POST http://ADMIN/ingress/SERVICE`.
        let ingress_described = match (&ingress_token, admin_listener.addr()) {
            (Some(token), Some(addr)) => Some(format!(
                "webhook ingress for the external twin: POST http://{addr}/ingress/SERVICE with Authorization: Bearer {token}"
            )),
            _ => None,
        };
        let publisher = fleet
            .as_ref()
            .map(|f| crate::runtime::fleet::Publishing::start(f, &ledger, &identity.sandbox_id))
            .transpose()?
            .map(Arc::new);
        let twin_base = settings.twin_base.clone();
        let (proxy, capture) = proxy(
            args, settings, twin_auth, &identity, tls, &mut host, &ledger,
        )
        .await?;
        let admin = crate::runtime::live::start_admin(crate::runtime::live::AdminStart {
            listener: admin_listener,
            state_dir: &host.state_dir,
            proxy: &proxy,
            proxy_url: &bound.proxy_url,
            twin: &twin_base,
            session_seq,
            ledger: ledger.clone(),
            sealer: sealer.clone(),
            shutdown: shutdown_rx.clone(),
            metrics_open: args.metrics_open,
            publishing: publisher.clone(),
            webhooks: webhook_engine.as_ref().map(|e| e.control()),
            ingress: ingress.clone(),
        });
        tier.serving(&ledger);
        let unrecorded = proxy.unrecorded().clone();
        let (proxy_url, proxy_addr) = (bound.proxy_url.clone(), bound.proxy_addr);
        let (proxy_task, transparent_task) = serve_traffic(bound, proxy, &ledger, &traffic_rx);
        Ok(Stack {
            proxy_url,
            proxy_addr,
            twin_base,
            ledger,
            session_seq,
            identity,
            trust,
            sealer,
            services,
            routed_hosts,
            twin_heads: Some(twin_heads),
            file_limit: host.file_limit,
            stop_traffic,
            shutdown,
            proxy_task,
            transparent_task,
            tier,
            twin_task,
            admin,
            capture,
            unrecorded,
            publisher,
            webhook_engine,
            ingress,
            webhook_env,
            webhooks_described,
            ingress_described,
        })
    }

    /// Starts the workload the tier's way ([`Tier::run`]) and waits for it.
    pub async fn run_workload(
        &mut self,
        command: &[String],
        started: std::time::Instant,
    ) -> Result<crate::tier::Ran> {
        let base = EnvBase::from_env();
        let no_proxy = merged_no_proxy(&self.routed_hosts);
        let workload = crate::tier::Workload {
            command,
            env: EnvSpec {
                proxy_url: &self.proxy_url,
                no_proxy: &[],
                sandbox_id: &self.identity.sandbox_id,
                canary: &self.identity.canary,
                trust: &self.trust,
                trust_only: false,
                java_tool_options_base: base.java_tool_options.as_deref(),
                php_ini_scan_dir_base: base.php_ini_scan_dir.as_deref(),
                extra: &self.webhook_env,
            },
            no_proxy: &no_proxy,
            trust: &self.trust,
            ledger: &self.ledger,
            proxy_addr: self.proxy_addr,
            file_limit: self.file_limit,
            started,
        };
        self.tier.run(workload).await
    }

    /// Ends the session (DESIGN §7a.3, §7a.6): probes the canary while the
    /// proxy still answers, stops accepting and lets in-flight requests
    /// finish (each is recorded, client gone or not), cross-checks the twin's
    /// log while the twin still answers, records both checks in the ledger,
    /// appends the final seal over all of it, then stops the rest.
    pub async fn finish(self) -> Result<Finished> {
        self.finish_with(None, Vec::new()).await
    }

    /// [`Stack::finish`], with the canary already probed by whoever can
    /// reach the interception path (an isolated run's init step, inside),
    /// and further checks of the caller's (`veris run`'s `descendants`),
    /// recorded with the others before the final seal.
    pub async fn finish_with(
        self,
        probed_canary: Option<Check>,
        more: Vec<Check>,
    ) -> Result<Finished> {
        let run = LiveRun {
            tier: self.identity.tier,
            proxy_url: &self.proxy_url,
            canary: &self.identity.canary,
            run_id: &self.identity.run_id,
            reader: Reader::Proxy,
            services: &self.services,
            twin_heads: self.twin_heads.as_ref(),
            ledger: self.ledger.path(),
            refresh: false,
            unrecorded: None,
        };
        let canary = match probed_canary {
            Some(probed) => probed,
            None => checks::canary(&run).await,
        };

        drain(
            &self.stop_traffic,
            self.proxy_task,
            self.transparent_task,
            self.capture.clone(),
        )
        .await;

        // No request makes an event now: what was queued gets its attempt,
        // recorded before the checks and the final seal.
        if let Some(engine) = self.webhook_engine {
            engine.stop().await;
        }
        if let Some(ingress) = &self.ingress {
            ingress.close().await;
        }

        // No traffic can arrive now: the window is exact.
        let since = self.session_seq.saturating_sub(1);
        let head = self.ledger.head().0;
        let unrecorded = self.unrecorded.counts();
        let run = LiveRun {
            tier: self.identity.tier,
            proxy_url: &self.proxy_url,
            canary: &self.identity.canary,
            run_id: &self.identity.run_id,
            reader: Reader::Proxy,
            services: &self.services,
            twin_heads: self.twin_heads.as_ref(),
            ledger: self.ledger.path(),
            refresh: false,
            unrecorded: Some(&unrecorded),
        };
        let mut checks = checks::live_checks(&run, Some(canary), since, head).await;
        checks.extend(more);
        record_checks(&self.ledger, &checks, since, head);
        if let Some(p) = &self.publisher {
            p.record_refusal(&self.ledger, since);
        }

        let _ = self.shutdown.send(true);
        let (seal, seal_error) =
            seal_and_stop(self.admin, &self.ledger, self.twin_task, self.tier).await;
        if let Some(p) = self.publisher {
            if !p.finish().await {
                warn!("the ledger's last lines did not reach the NATS stream; the next start on this state dir publishes them");
            }
        }
        Ok(Finished {
            ledger_path: self.ledger.path().to_path_buf(),
            seal,
            seal_error,
            public_key: self.sealer.public_key_hex(),
            key_id: self.sealer.key_id().to_string(),
            checks,
        })
    }
}

/// Stops the listeners and lets in-flight requests finish (each is
/// recorded, client gone or not); every captured body's line then goes in
/// before the checks and the final seal, which then cover them.
async fn drain(
    stop_traffic: &watch::Sender<bool>,
    proxy_task: JoinHandle<std::io::Result<()>>,
    transparent_task: Option<JoinHandle<std::io::Result<()>>>,
    capture: Option<Arc<Capture>>,
) {
    let _ = stop_traffic.send(true);
    match proxy_task.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!(error = %e, "proxy ended with an error"),
        Err(e) => warn!(error = %e, "proxy task failed"),
    }
    if let Some(t) = transparent_task {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "transparent listeners ended with an error"),
            Err(e) => warn!(error = %e, "transparent listener task failed"),
        }
    }

    if let Some(capture) = capture {
        let _ = tokio::task::spawn_blocking(move || capture.flush()).await;
    }
}

/// Records each check as a `check` line over the window `since..=head`.
fn record_checks(ledger: &Ledger, checks: &[Check], since: u64, head: u64) {
    for c in checks {
        let entry = Entry::Check(CheckLine {
            name: c.name.clone(),
            status: match c.status {
                CheckStatus::Ok => "ok",
                CheckStatus::Failed => "failed",
                _ => "unverified",
            }
            .into(),
            detail: c.detail.clone(),
            since_seq: since,
            until_seq: head,
        });
        if let Err(e) = ledger.append(entry) {
            warn!(error = %e, check = %c.name, "cannot record a check in the ledger");
        }
    }
}

/// After the shutdown signal: the final seal (by the admin API's stop), the
/// built-in twin ended, the ledger synced, the tier torn down.
async fn seal_and_stop(
    admin: AdminHandle,
    ledger: &Ledger,
    twin_task: Option<JoinHandle<()>>,
    tier: Box<dyn Tier>,
) -> (Option<SealInfo>, Option<String>) {
    let sealed = match admin.stop(ledger).await {
        Ok(seal) => (Some(seal), None),
        Err(why) => (None, Some(why)),
    };
    if let Some(t) = twin_task {
        let _ = t.await;
    }
    // A failed fsync (a full disk) must not cost the receipt: the
    // lines were written, and the seal's own error says the rest.
    if let Err(e) = ledger.sync() {
        warn!(error = %format!("{:#}", anyhow::Error::from(e)), "cannot sync the ledger to disk");
    }
    tier.teardown().await;
    sealed
}

/// What a start learns of the host before anything else.
struct Host {
    state_dir: PathBuf,
    /// `--upstream-proxy`, parsed; taken by the proxy.
    upstream_proxy: Option<veris_proxy::outbound::dial::ChainProxy>,
    /// The open-file limit before the start raised it (for a child).
    file_limit: crate::os::fd::FileLimit,
    /// The open-file limit after.
    raised: crate::os::fd::FileLimit,
}

/// The first phase: the tier's flags checked, `--upstream-proxy` parsed, the
/// process made non-dumpable before any key exists in it, the open-file
/// limit raised, the state dir created.
fn prepare_host(args: &ServeArgs, tier: &dyn Tier) -> Result<Host> {
    tier.preflight()?;
    let upstream_proxy = args
        .proxy
        .upstream_proxy
        .as_deref()
        .map(|url| {
            veris_proxy::outbound::dial::ChainProxy::parse(url).map_err(|why| {
                anyhow::anyhow!(
                    "--upstream-proxy {url:?}: {why}. Next: give it as http://[user:password@]host:port"
                )
            })
        })
        .transpose()?;
    if let Some(p) = &upstream_proxy {
        info!(upstream_proxy = %p, "passthrough traffic is chained through the upstream proxy");
    }
    // Before any key exists in this process: a same-uid workload must
    // not read it (or the admin token) through ptrace or /proc/<pid>/mem.
    if let Err(e) = crate::os::prctl::set_non_dumpable() {
        warn!(error = %e, "cannot make the proxy non-dumpable; a same-uid workload could read its memory");
    }
    let (file_limit, raised) = crate::os::fd::raise_open_file_limit();
    // Numbers as numbers (a log collector sums them); an unlimited one is
    // left out, and said.
    info!(
        soft = raised.0,
        was = file_limit.0,
        unlimited = raised.0.is_none(),
        "open-file limit (every client connection holds one or two)"
    );
    let state_dir = crate::util::state_dir(args.proxy.state_dir.clone());
    std::fs::create_dir_all(&state_dir)
        .with_context(|| format!("creating state dir {}", state_dir.display()))?;
    Ok(Host {
        state_dir,
        upstream_proxy,
        file_limit,
        raised,
    })
}

/// What the proxy terminates and verifies TLS with.
struct Tls {
    issuer: Arc<Issuer>,
    /// Roots for a TLS twin.
    roots: rustls::RootCertStore,
    /// Roots for passthrough to real hosts.
    passthrough_roots: rustls::RootCertStore,
}

/// CA, leaves and published trust material: the CA dir, the files clients
/// trust, and the proxy's TLS side.
fn ca_and_trust(
    args: &ServeArgs,
    settings: &Settings,
    state_dir: &Path,
) -> Result<(PathBuf, TrustFiles, Tls)> {
    let ca_dir = args
        .proxy
        .ca_dir
        .clone()
        .or_else(|| settings.ca_dir.clone())
        .unwrap_or_else(|| state_dir.join("ca"));
    let scope = veris_proxy::scope::scope(Some(&settings.router), &[])
        .context("the names the CA may sign for")?;
    let (ca, outcome) = CertificateAuthority::load_or_create(&ca_dir, &scope)
        .with_context(|| format!("loading the CA in {}", ca_dir.display()))?;
    if let LoadOutcome::Created { reason } = &outcome {
        info!(dir = %ca_dir.display(), %reason, "created the interception CA");
    }
    crate::runtime::ca_check::check(&ca, &ca_dir, &veris_proxy::scope::needed(&settings.router))?;
    let ca = Arc::new(ca);
    let system_bundle = veris_ca::trust::find_system_bundle(
        std::env::var_os("VERIS_SYSTEM_CA_BUNDLE")
            .as_deref()
            .map(Path::new),
    );
    let trust = veris_ca::trust::publish(&state_dir.join("trust"), &ca, system_bundle.as_deref())
        .context("publishing trust material")?;
    let issuer = Arc::new(Issuer::new(ca.clone(), Issuer::DEFAULT_CAPACITY));
    let (roots, passthrough_roots) = upstream_roots(system_bundle.as_deref(), &ca);
    Ok((
        ca_dir,
        trust,
        Tls {
            issuer,
            roots,
            passthrough_roots,
        },
    ))
}

/// A fresh run id, and the seal key and ledger for `role` ([`open_ledger`]).
fn seal_key_and_ledger(
    state_dir: &Path,
    role: Role,
) -> Result<(Arc<Sealer>, Arc<Ledger>, OpenReport, String)> {
    let run_id = crate::util::random_hex(8)?;
    let (sealer, ledger, report) = open_ledger(state_dir, role, &run_id)?;
    if role == Role::Serve {
        // The operator's pin: the key exists only in this process, so
        // this line (not a file the workload can write) is where its
        // fingerprint comes from.
        info!(seal_key = %sealer.key_id(), "this session's seal key; pin it to verify the session later: veris receipt --key <seal_key>");
    }
    Ok((sealer, Arc::new(ledger), report, run_id))
}

/// The proxy's listener and the tier's, bound before the session line.
struct Bound {
    listener: TcpListener,
    proxy_addr: SocketAddr,
    proxy_url: String,
    /// The tier's listeners, when it has any ([`Tier::bind`]).
    tier: Option<TransparentListeners>,
    /// What the tier covers, when it says so itself (isolated, Landlock).
    coverage: Option<Coverage>,
    /// The transparent listeners the host redirects to (not an isolated run's).
    transparent_addrs: Option<(SocketAddr, SocketAddr)>,
    quic_addr: Option<SocketAddr>,
    isolated: bool,
    /// How webhook deliveries reach the app (the host's network if `None`).
    app_dialer: Option<veris_proxy::callback::Dialer>,
}

/// Binds the proxy's listener, then the tier's ([`Tier::bind`]).
async fn bind_listeners(settings: &Settings, tier: &mut dyn Tier) -> Result<Bound> {
    let listener = TcpListener::bind(&settings.listen).await.with_context(|| {
        format!(
            "binding the proxy to {}. Next: pick a free address with --listen (port 0 picks one)",
            settings.listen
        )
    })?;
    let proxy_addr = listener.local_addr()?;
    let crate::tier::Bound {
        listeners,
        coverage,
        redirected,
        app_dialer,
    } = tier.bind().await?;
    let isolated = listeners.as_ref().is_some_and(|l| l.dns.is_some());
    let quic_addr = listeners
        .as_ref()
        .and_then(|l| l.quic.as_ref())
        .map(|q| q.local_addr())
        .transpose()?;
    Ok(Bound {
        listener,
        proxy_addr,
        proxy_url: format!("http://{proxy_addr}"),
        tier: listeners,
        coverage,
        transparent_addrs: redirected,
        quic_addr,
        isolated,
        app_dialer,
    })
}

/// Who this session is: run, sandbox, canary, mode and listener tier.
fn identity(run_id: String, settings: &Settings, transparent: bool) -> Result<Identity> {
    Ok(Identity {
        run_id,
        sandbox_id: settings.sandbox_id.clone(),
        canary: match &settings.canary_token {
            Some(t) => t.clone(),
            None => format!("cnry_{}", crate::util::random_hex(16)?),
        },
        mode: settings.mode,
        tier: if transparent {
            ListenerTier::Transparent
        } else {
            ListenerTier::Explicit
        },
    })
}

/// The admin listener and its files, then the files named on the command
/// line (written while still root, as they may sit in root-owned dirs,
/// after the rules are in: a workload that starts on the ready file is
/// caught from its first byte), then the hand-over to the proxy uid.
async fn announce(
    args: &ServeArgs,
    role: Role,
    mut announced: Announce<'_>,
    ca_dir: &Path,
    tier: &mut dyn Tier,
) -> Result<AdminListener> {
    let admin_listener = crate::runtime::live::bind_admin(
        match role {
            Role::Serve => Some(&args.admin),
            Role::Run => None,
        },
        args.metrics_listen.as_deref(),
        announced.state_dir,
    )
    .await?;
    announced.admin = admin_listener.addr();
    announced.write(args)?;
    tier.announced(&[announced.state_dir, ca_dir])?;
    Ok(admin_listener)
}

/// Appends the session line; a start that cannot takes its ready file back.
fn append_session(args: &ServeArgs, ledger: &Ledger, session: Entry) -> Result<u64> {
    match ledger.append(session) {
        Ok(seq) => Ok(seq),
        Err(e) => {
            if let Some(ready) = &args.ready_file {
                let _ = std::fs::remove_file(ready);
            }
            Err(anyhow::Error::new(e).context("writing the session line to the ledger"))
        }
    }
}

/// The proxy (and its body capture, `--capture-bodies`), with its twin
/// upstream probed for h2c.
async fn proxy(
    args: &ServeArgs,
    settings: Settings,
    twin_auth: Option<String>,
    identity: &Identity,
    tls: Tls,
    host: &mut Host,
    ledger: &Arc<Ledger>,
) -> Result<(Arc<Proxy>, Option<Arc<Capture>>)> {
    let capture = match &args.proxy.capture_bodies {
        Some(dir) => Some(
            Capture::start(
                CaptureOptions {
                    dir: dir.clone(),
                    max_body: args.proxy.capture_max_body,
                    max_total: args.proxy.capture_max_total,
                },
                &identity.run_id,
                ledger.clone(),
            )
            .with_context(|| {
                format!(
                    "opening the capture dir {}. Next: pass --capture-bodies a directory the proxy can create and write",
                    dir.display()
                )
            })?,
        ),
        None => None,
    };
    let twin_base = settings.twin_base.clone();
    let proxy = Proxy::new(
        ProxyOptions {
            router: settings.router,
            identity: identity.clone(),
            twin_base: twin_base.clone(),
            twin_auth,
            upstream: Arc::new(Upstream::new(UpstreamOptions {
                roots: tls.roots,
                passthrough_roots: Some(tls.passthrough_roots),
                insecure_skip_verify: settings.insecure_skip_verify,
                response_timeout: Duration::from_secs(args.proxy.upstream_timeout),
                upstream_proxy: host.upstream_proxy.take(),
                ..UpstreamOptions::default()
            })),
            grace: Duration::from_secs(args.proxy.grace),
            limits: client_limits(&args.proxy, host.raised.0),
            capture: capture.clone(),
        },
        tls.issuer,
        ledger.clone(),
    );
    let h2c = proxy.probe_twin().await;
    info!(twin = %twin_base, h2c, "twin upstream");
    Ok((proxy, capture))
}

/// The last phase: the proxy serves its listener, and the tier's listeners
/// are served ([`crate::tier::transparent::serve`]), until `stop` says true.
fn serve_traffic(
    bound: Bound,
    proxy: Arc<Proxy>,
    ledger: &Arc<Ledger>,
    stop: &watch::Receiver<bool>,
) -> (
    JoinHandle<std::io::Result<()>>,
    Option<JoinHandle<std::io::Result<()>>>,
) {
    let Bound {
        listener,
        tier,
        transparent_addrs,
        quic_addr,
        isolated,
        ..
    } = bound;
    let transparent_task = tier.map(|listeners| {
        let words = |a: Option<SocketAddr>| a.map_or("none".to_string(), |a| a.to_string());
        info!(
            https = %words(transparent_addrs.map(|a| a.0)),
            http = %words(transparent_addrs.map(|a| a.1)),
            quic = %words(quic_addr),
            isolated,
            "transparent listeners"
        );
        crate::tier::transparent::serve(listeners, proxy.clone(), ledger.clone(), stop)
    });
    let proxy_task = tokio::spawn(veris_proxy::inbound::explicit::serve(
        listener,
        proxy,
        until(stop),
    ));
    (proxy_task, transparent_task)
}

/// Client timeouts and the connection cap from the flags; the cap defaults
/// to half the open-file limit (a proxied connection holds two: client and
/// upstream), within 64..=16384.
fn client_limits(args: &ProxyArgs, open_files: Option<u64>) -> veris_proxy::Limits {
    veris_proxy::Limits {
        handshake: Duration::from_secs(args.handshake_timeout.max(1)),
        request_head: Duration::from_secs(args.client_timeout.max(1)),
        max_connections: args
            .max_connections
            .unwrap_or_else(|| {
                let files = open_files.unwrap_or(u64::MAX);
                usize::try_from(files / 2)
                    .unwrap_or(usize::MAX)
                    .clamp(64, 16384)
            })
            .max(1),
        ..veris_proxy::Limits::default()
    }
}
