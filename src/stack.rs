//! Starting and stopping the proxy stack shared by `serve`, `run` and `demo`:
//! CA and trust material, the built-in twin when none is given, the seal key,
//! the ledger and its session line, the proxy listener, the env and ready
//! files; and ending a session with its checks recorded and its final seal.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};
use veris_ca::env::{EnvFormat, EnvSpec};
use veris_ca::trust::TrustFiles;
use veris_ca::{CertificateAuthority, Issuer, LoadOutcome};
use veris_proxy::capture::{Capture, CaptureOptions};
use veris_proxy::config::{Flags, Overrides, Settings};
use veris_proxy::upstream::UpstreamOptions;
use veris_proxy::{Identity, Proxy, ProxyOptions};
use veris_receipt::ledger::{Ledger, OpenReport, SealInfo};
use veris_receipt::receipt::{Check, CheckStatus};
use veris_receipt::seal::{PublicKeys, Sealer, PUB_FILE};
use veris_receipt::{CheckLine, SessionLine};
use veris_receipt::{Coverage, Entry, ListenerTier, Mode};

use crate::live::ServiceRef;

/// Sandbox id used with the built-in twin when none is given.
pub const DEFAULT_SANDBOX: &str = "sbx_local";

/// The proxy's flags, shared by every command that starts one (`serve`,
/// `run`, `demo`): routing, where state lives, client and twin timeouts.
#[derive(Args, Clone, Debug)]
pub struct ProxyArgs {
    /// JSON config file (format: docs/config.md). Flags given with it override the
    /// file's field of the same meaning (--listen, --sandbox, --mode,
    /// --allow-passthrough, --ca-dir); --twin, --services and --route are
    /// errors with it (the routes live in the file).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Proxy listen address [serve: 127.0.0.1:8080, run/demo: 127.0.0.1:0].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Twin base URL; without it the built-in twin runs in-process on loopback.
    #[arg(long, value_name = "URL")]
    pub twin: Option<String>,
    /// Twin sandbox id.
    #[arg(long, value_name = "ID")]
    pub sandbox: Option<String>,
    /// Catalog services to route (comma-separated); default: the whole catalog.
    #[arg(long, value_delimiter = ',', value_name = "A,B")]
    pub services: Vec<String>,
    /// Route, repeatable: SERVICE=HOST[/PREFIX], added to the catalog
    /// services (all of them, or --services). A route for a host (and
    /// prefix) the catalog claims takes that claim over; the catalog's other
    /// hosts and prefixes stay.
    #[arg(long = "route", value_name = "SERVICE=HOST[/PREFIX]")]
    pub routes: Vec<String>,
    /// What happens to hosts no service claims.
    #[arg(long, value_enum)]
    pub mode: Option<ModeArg>,
    /// Host pattern tunneled even in strict mode (repeatable; `@build` = package registries).
    #[arg(long = "allow-passthrough", value_name = "HOST")]
    pub allow_passthrough: Vec<String>,
    /// State dir [default: $VERIS_STATE_DIR, else ~/.veris].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// CA dir [default: <state>/ca].
    #[arg(long, value_name = "DIR")]
    pub ca_dir: Option<PathBuf>,
    /// Seconds in-flight requests get after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    pub grace: u64,
    /// Seconds a client may take for a TLS handshake.
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    pub handshake_timeout: u64,
    /// Seconds a client may take to send a request head; an idle HTTP/1
    /// keep-alive connection is closed after as long (HTTP/2: the ping
    /// interval and deadline).
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    pub client_timeout: u64,
    /// Client connections open at once (all listeners); more are closed on
    /// accept. Default: half the open-file limit, at most 16384.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Seconds to wait for the twin's response head before answering 504.
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    pub upstream_timeout: u64,
    /// HTTP proxy that passthrough traffic (hosts not routed to a twin) is
    /// chained through with CONNECT, e.g. a corporate proxy:
    /// http://[user:password@]host:port. Twin traffic and loopback never
    /// go through it.
    #[arg(long, value_name = "URL")]
    pub upstream_proxy: Option<String>,
    /// Store the redacted request and response bodies of twin traffic in
    /// DIR (created if missing) for `veris har --bodies DIR`; each stored
    /// body's SHA-256 goes into the sealed ledger. Off by default.
    #[arg(long, value_name = "DIR")]
    pub capture_bodies: Option<PathBuf>,
    /// With --capture-bodies: bytes kept of each body (the rest is cut, and
    /// the cut is recorded).
    #[arg(long, value_name = "BYTES", default_value_t = 64 * 1024, requires = "capture_bodies")]
    pub capture_max_body: usize,
    /// With --capture-bodies: bytes stored in all; then nothing more is
    /// stored (and each later body is recorded as `total_cap`).
    #[arg(long, value_name = "BYTES", default_value_t = 64 * 1024 * 1024, requires = "capture_bodies")]
    pub capture_max_total: u64,
}

/// `veris serve`: the proxy's flags plus what only a long-running service
/// has (its announcements, the transparent tier, the admin API). `run`
/// takes [`ProxyArgs`] alone, so its `--help` lists only what it uses.
#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub proxy: ProxyArgs,
    /// Written last, atomically, once the proxy accepts connections (JSON:
    /// proxy_url, pid, sandbox_id, twin, state_dir, ledger, ca, admin,
    /// key_id, https_listen, http_listen; see docs/cli.md).
    #[arg(long, value_name = "FILE")]
    pub ready_file: Option<PathBuf>,
    /// Write the client env file (proxy and trust variables) here.
    #[arg(long, value_name = "FILE")]
    pub write_env: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "posix")]
    pub env_format: EnvFormatArg,
    /// Leave every routing variable out of the env file (trust only).
    #[arg(long)]
    pub env_trust_only: bool,
    #[command(flatten)]
    pub transparent: crate::transparent::TransparentArgs,
    /// Admin API listen address (address written to <state>/admin.addr and the ready file).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub admin: String,
    /// Serve the admin API's GET /metrics (Prometheus) without the bearer
    /// token, for a scraper that cannot be given it; every other endpoint
    /// still needs the token.
    #[arg(long)]
    pub metrics_open: bool,
}

impl ServeArgs {
    /// `proxy` with every serve-only flag at its default (`run` has none of
    /// them). The defaults come from clap itself, so they cannot drift.
    pub fn with_defaults(proxy: ProxyArgs) -> ServeArgs {
        #[derive(clap::Parser)]
        struct Defaults {
            #[command(flatten)]
            serve: ServeArgs,
        }
        use clap::Parser;
        // No flag of ServeArgs is required and none reads the environment,
        // so parsing no arguments cannot fail.
        let mut serve = Defaults::try_parse_from(["veris"])
            .expect("serve flags without arguments parse")
            .serve;
        serve.proxy = proxy;
        serve
    }
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ModeArg {
    Passthrough,
    Strict,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Self {
        match m {
            ModeArg::Strict => Mode::Strict,
            ModeArg::Passthrough => Mode::Passthrough,
        }
    }
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum EnvFormatArg {
    Posix,
    Docker,
}

impl From<EnvFormatArg> for EnvFormat {
    fn from(f: EnvFormatArg) -> Self {
        match f {
            EnvFormatArg::Posix => EnvFormat::Posix,
            EnvFormatArg::Docker => EnvFormat::Docker,
        }
    }
}

/// Which command the stack serves; it decides where the ledger and the seal
/// key live and who may talk to the proxy (DESIGN §7a.2).
/// How `veris run` confines its child (DESIGN §4); `serve` and `demo` confine nothing.
pub enum Confinement {
    /// Nothing: the explicit tier as such (or `serve`'s transparent flags).
    None,
    /// Namespaces of its own: the proxy serves the sockets made inside them.
    Isolated(crate::isolate::Sockets),
    /// The explicit tier, with Landlock allowing the child TCP connects to
    /// the proxy's port only.
    Landlock,
}

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
    pub file_limit: crate::sys::FileLimit,
    /// Stops the listeners (traffic) first, then everything else.
    stop_traffic: watch::Sender<bool>,
    shutdown: watch::Sender<bool>,
    proxy_task: JoinHandle<std::io::Result<()>>,
    transparent_task: Option<JoinHandle<std::io::Result<()>>>,
    redirect: Option<crate::transparent::Redirect>,
    twin_task: Option<JoinHandle<()>>,
    /// Admin API (serve only), seal timer and the files that announce them.
    pub admin: crate::live::AdminHandle,
    /// Body capture (`--capture-bodies`), flushed before the final seal.
    capture: Option<Arc<Capture>>,
    /// Requests the proxy sent to the twin but could not record.
    unrecorded: Arc<veris_proxy::recorder::Unrecorded>,
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

/// Routing and the built-in twin, from a config file or flags.
struct Routing {
    settings: Settings,
    twin_task: Option<JoinHandle<()>>,
    twin_auth: Option<String>,
}

impl Stack {
    /// Starts everything; `default_listen` applies when `--listen` is absent.
    /// The phases, in order: routing (and the built-in twin), CA and trust,
    /// seal key and ledger, listeners, session line, proxy, transparent
    /// redirect, admin API, env and ready files.
    pub async fn start(
        args: &ServeArgs,
        default_listen: &str,
        role: Role,
        confinement: Confinement,
    ) -> Result<Stack> {
        crate::transparent::preflight(&args.transparent)?;
        let upstream_proxy = args
            .proxy
            .upstream_proxy
            .as_deref()
            .map(|url| {
                veris_proxy::dial::ChainProxy::parse(url).map_err(|why| {
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
        if let Err(e) = crate::sys::set_non_dumpable() {
            warn!(error = %e, "cannot make the proxy non-dumpable; a same-uid workload could read its memory");
        }
        let (file_limit, raised) = crate::sys::raise_open_file_limit();
        let limit_word = |v: Option<u64>| v.map_or("unlimited".to_string(), |n| n.to_string());
        info!(
            soft = %limit_word(raised.0),
            was = %limit_word(file_limit.0),
            "open-file limit (every client connection holds one or two)"
        );
        let state_dir = crate::state_dir(args.proxy.state_dir.clone());
        std::fs::create_dir_all(&state_dir)
            .with_context(|| format!("creating state dir {}", state_dir.display()))?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (stop_traffic, traffic_rx) = watch::channel(false);

        let Routing {
            settings,
            twin_task,
            twin_auth,
        } = routing(&args.proxy, default_listen, shutdown_rx.clone()).await?;
        let services = crate::live::service_refs(&settings.router);
        let routed_hosts = settings.router.routed_hosts();

        // CA, leaves and published trust material.
        let ca_dir = args
            .proxy
            .ca_dir
            .clone()
            .or_else(|| settings.ca_dir.clone())
            .unwrap_or_else(|| state_dir.join("ca"));
        let (ca, outcome) = CertificateAuthority::load_or_create(&ca_dir)
            .with_context(|| format!("loading the CA in {}", ca_dir.display()))?;
        if let LoadOutcome::Created { reason } = &outcome {
            info!(dir = %ca_dir.display(), %reason, "created the interception CA");
        }
        let ca = Arc::new(ca);
        let system_bundle = veris_ca::trust::find_system_bundle(
            std::env::var_os("VERIS_SYSTEM_CA_BUNDLE")
                .as_deref()
                .map(Path::new),
        );
        let trust =
            veris_ca::trust::publish(&state_dir.join("trust"), &ca, system_bundle.as_deref())
                .context("publishing trust material")?;
        let issuer = Arc::new(Issuer::new(ca.clone(), Issuer::DEFAULT_CAPACITY));
        let (roots, passthrough_roots) = upstream_roots(system_bundle.as_deref(), &ca);

        // Seal key and ledger.
        let run_id = crate::random_hex(8)?;
        let (sealer, ledger, report) = open_ledger(&state_dir, role, &run_id)?;
        let ledger = Arc::new(ledger);
        if role == Role::Serve {
            // The operator's pin: the key exists only in this process, so
            // this line (not a file the workload can write) is where its
            // fingerprint comes from.
            info!(seal_key = %sealer.key_id(), "this session's seal key; pin it to verify the session later: veris receipt --key <seal_key>");
        }

        let listener = TcpListener::bind(&settings.listen)
            .await
            .with_context(|| format!("binding the proxy to {}. Next: pick a free address with --listen (port 0 picks one)", settings.listen))?;
        let proxy_addr = listener.local_addr()?;
        let (transparent_listeners, mut confined_coverage) =
            confined_listeners(confinement, &args.transparent).await?;
        if let Some(c) = confined_coverage.as_mut() {
            c.upstream_proxy = upstream_proxy.is_some();
        }
        let isolated = transparent_listeners
            .as_ref()
            .is_some_and(|l| l.dns.is_some());
        let proxy_url = format!("http://{proxy_addr}");

        let identity = Identity {
            run_id,
            sandbox_id: settings.sandbox_id.clone(),
            canary: match &settings.canary_token {
                Some(t) => t.clone(),
                None => format!("cnry_{}", crate::random_hex(16)?),
            },
            mode: settings.mode,
            tier: if transparent_listeners.is_some() {
                ListenerTier::Transparent
            } else {
                ListenerTier::Explicit
            },
        };

        // Transparent tier: the rules go in (as root) before the session line,
        // which records what they cover.
        let transparent_addrs = match &transparent_listeners {
            Some(l) if !isolated => Some((l.https.local_addr()?, l.http.local_addr()?)),
            _ => None,
        };
        let quic_addr = transparent_listeners
            .as_ref()
            .and_then(|l| l.quic.as_ref())
            .map(|q| q.local_addr())
            .transpose()?;
        let mut redirect = match transparent_addrs {
            Some((https, http)) => {
                crate::transparent::install_redirect(&args.transparent, https, http, quic_addr)?
            }
            None => None,
        };
        let coverage = confined_coverage.or_else(|| {
            transparent_addrs
                .and_then(|_| crate::transparent::coverage(&args.transparent, redirect.as_ref()))
        });

        // The twin's log position now: the cross-check counts rows after it.
        let (twin_heads, ()) = tokio::join!(
            crate::live::twin_newest_ids(&services),
            warn_unreachable_twins(&services)
        );
        let euid = crate::sys::euid();

        // Everything that can fail comes before the session line, so a start
        // that fails leaves the ledger as it was: the admin listener and its
        // files, then the files named on the command line (written while
        // still root, as they may sit in root-owned dirs, after the rules
        // are in: a workload that starts on the ready file is caught from its
        // first byte), then the hand-over to the proxy uid.
        let admin_listener = crate::live::bind_admin(
            match role {
                Role::Serve => Some(&args.admin),
                Role::Run => None,
            },
            &state_dir,
        )
        .await?;
        let announce = Announce {
            proxy_url: &proxy_url,
            identity: &identity,
            twin_base: &settings.twin_base,
            state_dir: &state_dir,
            ledger: &ledger,
            trust: &trust,
            routed_hosts: &routed_hosts,
            admin: admin_listener.addr(),
            key_id: sealer.key_id(),
            transparent: transparent_addrs,
        };
        announce.write(args)?;
        if transparent_addrs.is_some() {
            crate::transparent::drop_privileges(&args.transparent, &[&state_dir, &ca_dir])?;
        }

        let session = session_entry(SessionFacts {
            args,
            role,
            identity: &identity,
            twin: &settings.twin_base,
            listen: proxy_addr,
            report: &report,
            sealer: &sealer,
            twin_heads: &twin_heads,
            euid,
            coverage,
        });
        let session_seq = match ledger.append(session) {
            Ok(seq) => seq,
            Err(e) => {
                if let Some(ready) = &args.ready_file {
                    let _ = std::fs::remove_file(ready);
                }
                return Err(anyhow::Error::new(e).context("writing the session line to the ledger"));
            }
        };
        if let Some(r) = redirect.as_mut() {
            r.watch(ledger.clone());
        }

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
                upstream: UpstreamOptions {
                    roots,
                    passthrough_roots: Some(passthrough_roots),
                    insecure_skip_verify: settings.insecure_skip_verify,
                    response_timeout: Duration::from_secs(args.proxy.upstream_timeout),
                    upstream_proxy,
                    ..UpstreamOptions::default()
                },
                grace: Duration::from_secs(args.proxy.grace),
                limits: client_limits(&args.proxy, raised.0),
                capture: capture.clone(),
            },
            issuer,
            ledger.clone(),
        );
        let unrecorded = proxy.unrecorded().clone();
        let h2c = proxy.probe_twin().await;
        info!(twin = %twin_base, h2c, "twin upstream");

        let admin = crate::live::start_admin(crate::live::AdminStart {
            listener: admin_listener,
            state_dir: &state_dir,
            proxy: &proxy,
            proxy_url: &proxy_url,
            twin: &twin_base,
            session_seq,
            ledger: ledger.clone(),
            sealer: sealer.clone(),
            shutdown: shutdown_rx.clone(),
            metrics_open: args.metrics_open,
        });

        if let Some(r) = redirect.as_mut() {
            r.serving();
        }
        let transparent_task = transparent_listeners.map(|listeners| {
            let words = |a: Option<SocketAddr>| a.map_or("none".to_string(), |a| a.to_string());
            info!(
                https = %words(transparent_addrs.map(|a| a.0)),
                http = %words(transparent_addrs.map(|a| a.1)),
                quic = %words(quic_addr),
                isolated,
                "transparent listeners"
            );
            serve_transparent(listeners, proxy.clone(), ledger.clone(), &traffic_rx)
        });
        let proxy_task = tokio::spawn(veris_proxy::serve(listener, proxy, until(&traffic_rx)));

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
            file_limit,
            stop_traffic,
            shutdown,
            proxy_task,
            transparent_task,
            redirect,
            twin_task,
            admin,
            capture,
            unrecorded,
        })
    }

    /// The env spec for clients of this stack; `base` holds the values of
    /// the caller's environment that veris appends to.
    pub fn env_spec<'a>(
        &'a self,
        no_proxy: &'a [String],
        trust_only: bool,
        base: &'a EnvBase,
    ) -> EnvSpec<'a> {
        EnvSpec {
            proxy_url: &self.proxy_url,
            no_proxy,
            sandbox_id: &self.identity.sandbox_id,
            canary: &self.identity.canary,
            trust: &self.trust,
            trust_only,
            java_tool_options_base: base.java_tool_options.as_deref(),
            php_ini_scan_dir_base: base.php_ini_scan_dir.as_deref(),
        }
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
        let canary = match (probed_canary, self.identity.tier) {
            (Some(probed), _) => probed,
            (None, ListenerTier::Explicit) => {
                let probe = crate::check::ProbePath::Explicit(self.proxy_url.clone());
                crate::check::canary_check(
                    &probe,
                    &self.identity.canary,
                    &self.identity.run_id,
                    CANARY_TIMEOUT,
                )
                .await
            }
            // The proxy's own uid is exempt from the redirect: only a reader
            // in the sandbox can probe the transparent path.
            (None, ListenerTier::Transparent) => Check {
                name: "canary".into(),
                status: CheckStatus::Unverified,
                detail: "the transparent canary is probed by `veris receipt` inside the sandbox"
                    .into(),
            },
        };

        let _ = self.stop_traffic.send(true);
        match self.proxy_task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "proxy ended with an error"),
            Err(e) => warn!(error = %e, "proxy task failed"),
        }
        if let Some(t) = self.transparent_task {
            match t.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => warn!(error = %e, "transparent listeners ended with an error"),
                Err(e) => warn!(error = %e, "transparent listener task failed"),
            }
        }

        // Every captured body's line goes in before the checks and the
        // final seal, which then covers them.
        if let Some(capture) = self.capture.clone() {
            let _ = tokio::task::spawn_blocking(move || capture.flush()).await;
        }

        // No traffic can arrive now: the window is exact.
        let since = self.session_seq.saturating_sub(1);
        let head = self.ledger.head().0;
        let twin = crate::live::twin_cross_check_file(
            self.ledger.path(),
            since,
            head,
            &self.services,
            self.twin_heads.as_ref(),
            false,
            Some(&self.unrecorded.counts()),
        )
        .await;
        let mut checks = vec![canary, twin];
        checks.extend(more);
        for c in &checks {
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
            if let Err(e) = self.ledger.append(entry) {
                warn!(error = %e, check = %c.name, "cannot record a check in the ledger");
            }
        }

        let _ = self.shutdown.send(true);
        let (seal, seal_error) = match self.admin.stop(&self.ledger).await {
            Ok(seal) => (Some(seal), None),
            Err(why) => (None, Some(why)),
        };
        if let Some(t) = self.twin_task {
            let _ = t.await;
        }
        // A failed fsync (a full disk) must not cost the receipt: the
        // lines were written, and the seal's own error says the rest.
        if let Err(e) = self.ledger.sync() {
            warn!(error = %format!("{:#}", anyhow::Error::from(e)), "cannot sync the ledger to disk");
        }
        if let Some(redirect) = self.redirect {
            // Waits (bounded) for the root helper to delete the table.
            let _ = tokio::task::spawn_blocking(move || redirect.remove()).await;
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

/// What `--write-env` and `--ready-file` announce.
struct Announce<'a> {
    proxy_url: &'a str,
    identity: &'a Identity,
    twin_base: &'a str,
    state_dir: &'a Path,
    ledger: &'a Ledger,
    trust: &'a TrustFiles,
    routed_hosts: &'a [String],
    admin: Option<SocketAddr>,
    key_id: &'a str,
    transparent: Option<(SocketAddr, SocketAddr)>,
}

/// What the session line records, gathered by [`Stack::start`].
struct SessionFacts<'a> {
    args: &'a ServeArgs,
    role: Role,
    identity: &'a Identity,
    twin: &'a str,
    listen: SocketAddr,
    report: &'a OpenReport,
    sealer: &'a Sealer,
    twin_heads: &'a BTreeMap<String, u64>,
    /// The uid this process had before any privilege drop.
    euid: u32,
    coverage: Option<Coverage>,
}

/// The session line: who runs, how traffic is intercepted, which key seals.
fn session_entry(f: SessionFacts<'_>) -> Entry {
    let t = &f.args.transparent;
    Entry::Session(SessionLine {
        run_id: f.identity.run_id.clone(),
        sandbox_id: f.identity.sandbox_id.clone(),
        mode: f.identity.mode,
        tier: f.identity.tier,
        twin: f.twin.to_string(),
        pid: std::process::id(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        listen: f.listen.to_string(),
        recovered_torn_tail: f.report.torn_tail,
        key_id: Some(f.sealer.key_id().to_string()),
        public_key: Some(f.sealer.public_key_hex()),
        key_storage: Some("memory".into()),
        proxy_uid: Some(if t.install_redirect || t.redirect_external {
            t.proxy_uid
        } else {
            f.euid
        }),
        workload_uid: match f.role {
            // The child runs as this process's uid, but never sees the key.
            Role::Run => Some(f.euid),
            Role::Serve => t.workload_uid,
        },
        twin_heads: Some(f.twin_heads.clone()),
        moved_aside: f.report.moved_aside.clone(),
        coverage: f.coverage.map(Box::new),
    })
}

impl Announce<'_> {
    /// `--write-env` (world-readable: it holds no secret, and the workload,
    /// another uid, must source it), then `--ready-file`, last.
    fn write(&self, args: &ServeArgs) -> Result<()> {
        if let Some(path) = &args.write_env {
            // The workload sources the file in an environment like this
            // one: its NO_PROXY is merged in (minus entries that would
            // exempt a routed host); JAVA_TOOL_OPTIONS and PHP_INI_SCAN_DIR
            // are the workload's own business, so nothing is appended to.
            let no_proxy = if args.env_trust_only {
                Vec::new()
            } else {
                merged_no_proxy(self.routed_hosts)
            };
            let spec = EnvSpec {
                proxy_url: self.proxy_url,
                no_proxy: &no_proxy,
                sandbox_id: &self.identity.sandbox_id,
                canary: &self.identity.canary,
                trust: self.trust,
                trust_only: args.env_trust_only,
                java_tool_options_base: None,
                php_ini_scan_dir_base: None,
            };
            veris_ca::env::write(path, &spec, args.env_format.into()).with_context(|| {
                format!(
                    "writing env file {}. Next: name a file in a directory veris can write",
                    path.display()
                )
            })?;
        }
        if let Some(path) = &args.ready_file {
            let ready = serde_json::json!({
                "proxy_url": self.proxy_url,
                "pid": std::process::id(),
                "sandbox_id": self.identity.sandbox_id,
                "twin": self.twin_base,
                "state_dir": self.state_dir,
                "ledger": self.ledger.path(),
                "ca": self.trust.ca_pem,
                "admin": self.admin.map(|a| format!("http://{a}")),
                "key_id": self.key_id,
                "https_listen": self.transparent.map(|a| a.0.to_string()),
                "http_listen": self.transparent.map(|a| a.1.to_string()),
            });
            // 0644: no secret in it (the admin token stays in its own file).
            veris_ca::fsutil::write_file(path, format!("{ready}\n").as_bytes(), 0o644)
                .with_context(|| {
                    format!(
                        "writing ready file {}. Next: name a file in a directory veris can write",
                        path.display()
                    )
                })?;
        }
        Ok(())
    }
}

/// How long the canary probe at the end of a session may take.
const CANARY_TIMEOUT: Duration = Duration::from_secs(5);

/// A future that resolves once `rx` reads true.
fn until(rx: &watch::Receiver<bool>) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut rx = rx.clone();
    async move {
        let _ = rx.wait_for(|stop| *stop).await;
    }
}

/// Routing from `--config` or from flags; starts the built-in twin (with its
/// per-start credential) when no twin is named.
async fn routing(
    args: &ProxyArgs,
    default_listen: &str,
    shutdown_rx: watch::Receiver<bool>,
) -> Result<Routing> {
    let mut twin_task = None;
    // The built-in twin's per-start credential: only this proxy can make
    // it execute (and log) a vendor request.
    let mut builtin_twin_credential = None;
    let mut builtin_url = None;
    if args.config.is_none() && args.twin.is_none() {
        let sandbox = args.sandbox.as_deref().unwrap_or(DEFAULT_SANDBOX);
        let (url, task, credential) = start_builtin_twin(sandbox, shutdown_rx).await?;
        twin_task = Some(task);
        builtin_twin_credential = Some(credential);
        builtin_url = Some(url);
    }
    let settings = settings(args, default_listen, builtin_url.as_deref())?;
    let twin_auth = match &settings.auth_value_env {
        Some(var) => Some(std::env::var(var).with_context(|| {
            format!("upstream.auth_value_env names {var}, which is not set. Next: export {var}=<twin credential>")
        })?),
        // A named twin gets nothing it was not configured with.
        None => builtin_twin_credential,
    };
    Ok(Routing {
        settings,
        twin_task,
        twin_auth,
    })
}

/// The services a proxy started with `args` would route (for checking
/// `--require` names before anything starts).
pub fn routed_services(args: &ProxyArgs) -> Result<Vec<String>> {
    // Any twin URL will do: only the names are read.
    let settings = settings(args, "127.0.0.1:0", Some("http://127.0.0.1:1"))?;
    Ok(settings
        .router
        .services()
        .iter()
        .map(|s| s.name.clone())
        .collect())
}

/// Validated settings from `--config` (flags overriding the file's fields)
/// or from flags; `builtin_twin` is the twin URL when `--twin` is absent.
fn settings(
    args: &ProxyArgs,
    default_listen: &str,
    builtin_twin: Option<&str>,
) -> Result<Settings> {
    if let Some(path) = &args.config {
        let clashes: Vec<&str> = [
            (args.twin.is_some(), "--twin (upstream.base_url)"),
            (!args.services.is_empty(), "--services (services)"),
            (!args.routes.is_empty(), "--route (services)"),
        ]
        .into_iter()
        .filter_map(|(given, what)| given.then_some(what))
        .collect();
        if !clashes.is_empty() {
            bail!(
                "{} and --config {} both say where traffic goes. Next: put the routes in the config file, or drop --config",
                clashes.join(", "),
                path.display()
            );
        }
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        // Flags win over the file, for every field both can set.
        let overrides = Overrides {
            listen: args.listen.as_deref(),
            sandbox_id: args.sandbox.as_deref(),
            mode: args.mode.map(Mode::from),
            allow_passthrough: (!args.allow_passthrough.is_empty())
                .then_some(args.allow_passthrough.as_slice()),
        };
        return Ok(Settings::from_json_with(
            &text,
            &path.display().to_string(),
            overrides,
        )?);
    }
    let listen = args.listen.as_deref().unwrap_or(default_listen);
    let sandbox = args.sandbox.as_deref().unwrap_or(DEFAULT_SANDBOX);
    let twin = args
        .twin
        .as_deref()
        .or(builtin_twin)
        .context("no twin URL (internal: the built-in twin was not started)")?;
    Ok(Settings::from_flags(Flags {
        listen,
        twin,
        sandbox_id: sandbox,
        services: &args.services,
        routes: &args.routes,
        mode: args.mode.map_or(Mode::Passthrough, Mode::from),
        allow_passthrough: &args.allow_passthrough,
    })?)
}

/// Warns once per twin address that refuses a connection at start: the
/// proxy still starts (the twin may come up later), but until then every
/// vendor request is answered 502, and a user should hear why now.
async fn warn_unreachable_twins(services: &[ServiceRef]) {
    let mut bases = std::collections::BTreeSet::new();
    for s in services {
        if let Ok(uri) = s.upstream.parse::<http::Uri>() {
            if let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) {
                bases.insert((scheme.to_string(), authority.as_str().to_string()));
            }
        }
    }
    let probes = bases.into_iter().map(|(scheme, authority)| async move {
        let Ok(parsed) = authority.parse::<http::uri::Authority>() else {
            return;
        };
        let port = parsed
            .port_u16()
            .unwrap_or(if scheme == "https" { 443 } else { 80 });
        let host = parsed.host().trim_start_matches('[').trim_end_matches(']');
        let dial = tokio::net::TcpStream::connect((host, port));
        let error = match tokio::time::timeout(TWIN_PROBE_TIMEOUT, dial).await {
            Ok(Ok(_)) => return,
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {TWIN_PROBE_TIMEOUT:?}"),
        };
        warn!(
            twin = %format!("{scheme}://{authority}"),
            %error,
            "the twin is not reachable; the proxy runs anyway, and vendor requests get 502 veris_upstream_unreachable until it answers. Next: start the twin, or fix --twin / upstream.base_url"
        );
    });
    futures_util::future::join_all(probes).await;
}

/// How long the start waits for the twin to accept a connection.
const TWIN_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Upstream roots: the system's plus ours (a TLS twin may use a veris leaf).
/// Roots for TLS upstreams: for the twin, the system roots and the veris CA
/// (a twin served with a veris leaf); for passthrough to real hosts, the
/// system roots alone.
fn upstream_roots(
    system_bundle: Option<&Path>,
    ca: &CertificateAuthority,
) -> (rustls::RootCertStore, rustls::RootCertStore) {
    let mut system = rustls::RootCertStore::empty();
    if let Some(bundle) = system_bundle {
        if let Ok(iter) = CertificateDer::pem_file_iter(bundle) {
            let certs: Vec<_> = iter.filter_map(|c| c.ok()).collect();
            system.add_parsable_certificates(certs);
        }
    }
    let mut twin = system.clone();
    let _ = twin.add(ca.cert_der().clone());
    (twin, system)
}

/// The seal key and the ledger for `role` (see [`Role`]). Every session
/// seals with a fresh key held only in this process's memory (DESIGN
/// §7a.13); `ledger.pub` lists it beside the ledger as a hint. `serve`
/// continues `<state>/ledger.jsonl` when its last line is a seal by a key
/// `ledger.pub` lists (an earlier session's), and moves anything else aside;
/// a run starts a file of its own.
fn open_ledger(
    state_dir: &Path,
    role: Role,
    run_id: &str,
) -> Result<(Arc<Sealer>, Ledger, veris_receipt::OpenReport)> {
    let sealer = Sealer::generate().context("generating this session's seal key")?;
    let dir = match role {
        Role::Serve => state_dir.to_path_buf(),
        Role::Run => {
            let dir = state_dir.join(RUNS_DIR).join(run_id);
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("creating the run dir {}", dir.display()))?;
            dir
        }
    };
    let path = dir.join("ledger.jsonl");
    // The keys of the sessions before this one: the file's tail must be a
    // seal by one of them to be continued. Which one does not decide any
    // verdict (every reader checks each session's seals against its own
    // pin), so the hint file is enough here.
    let mut own = PublicKeys::load(&dir.join(PUB_FILE))
        .with_context(|| format!("reading {}", dir.join(PUB_FILE).display()))?;
    own.keys.push(sealer.public_key());
    sealer
        .publish(&dir)
        .with_context(|| {
            format!(
                "writing {}. Next: free space where the state dir lives (or fix the write error) and start again",
                dir.join(PUB_FILE).display()
            )
        })?;
    let (ledger, report) = Ledger::open_sealed_by(&path, &own)
        .with_context(|| format!("opening the ledger {}", path.display()))?;
    if let Some(torn) = &report.torn_tail {
        let saved = report
            .torn_saved_to
            .as_ref()
            .map_or("nowhere".to_string(), |p| p.display().to_string());
        warn!(line = torn.line, bytes = torn.bytes, %saved, "the ledger ended in a torn line (a crash mid-write); it was moved aside and is recorded in the session line");
    }
    if let Some(moved) = &report.moved_aside {
        warn!(to = %moved.file, why = %moved.why, "the existing ledger could not be verified with this proxy's key; it was moved aside and a new chain starts");
    }
    Ok((Arc::new(sealer), ledger, report))
}

/// The transparent tier's listeners, bound before privileges drop (or,
/// for an isolated run, made inside its namespace).
struct TransparentListeners {
    https: TcpListener,
    http: TcpListener,
    /// The QUIC sink, unless UDP 443 is let through.
    quic: Option<tokio::net::UdpSocket>,
    /// Isolated run: the DNS stub's sockets.
    dns: Option<(tokio::net::UdpSocket, TcpListener)>,
}

/// The transparent listeners (and the coverage to record) for how the
/// run confines its child: made inside an isolated run's namespace, none
/// for Landlock, else `serve`'s own (`--transparent`).
async fn confined_listeners(
    confinement: Confinement,
    transparent: &crate::transparent::TransparentArgs,
) -> Result<(
    Option<TransparentListeners>,
    Option<veris_receipt::Coverage>,
)> {
    Ok(match confinement {
        Confinement::Isolated(sockets) => {
            let coverage = sockets.coverage();
            (Some(isolated_listeners(sockets)?), Some(coverage))
        }
        Confinement::Landlock => (None, Some(landlock_coverage())),
        Confinement::None => (bind_transparent(transparent).await?, None),
    })
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
    }
}

/// An isolated run's sockets, as the transparent tier serves them.
fn isolated_listeners(s: crate::isolate::Sockets) -> Result<TransparentListeners> {
    let tcp = |l: std::net::TcpListener| {
        l.set_nonblocking(true)?;
        TcpListener::from_std(l)
    };
    let udp = |u: std::net::UdpSocket| {
        u.set_nonblocking(true)?;
        tokio::net::UdpSocket::from_std(u)
    };
    Ok(TransparentListeners {
        https: tcp(s.https)?,
        http: tcp(s.http)?,
        quic: Some(udp(s.quic)?),
        dns: Some((udp(s.dns_udp)?, tcp(s.dns_tcp)?)),
    })
}

/// What Landlock's confinement of an explicit-tier child covers: TCP only
/// (to the proxy's port); UDP and ICMP are not its business.
fn landlock_coverage() -> veris_receipt::Coverage {
    veris_receipt::Coverage {
        tcp_ports: None,
        quic: "open".into(),
        dns: "open".into(),
        udp_other: "open".into(),
        ip_other: "open".into(),
        ipv6: true,
        exempt: Vec::new(),
        installed_by: "veris".into(),
        isolation: Some("landlock".into()),
        sockets_reachable: Vec::new(),
        bundles: Vec::new(),
        upstream_proxy: false,
    }
}

async fn bind_transparent(
    t: &crate::transparent::TransparentArgs,
) -> Result<Option<TransparentListeners>> {
    if !t.transparent {
        return Ok(None);
    }
    let https = TcpListener::bind(&t.https_listen).await.with_context(|| {
        format!("binding the transparent TLS listener to {}. Next: pick a free address with --https-listen", t.https_listen)
    })?;
    let http = TcpListener::bind(&t.http_listen).await.with_context(|| {
        format!("binding the transparent HTTP listener to {}. Next: pick a free address with --http-listen", t.http_listen)
    })?;
    let quic = if t.allow_quic {
        None
    } else {
        Some(tokio::net::UdpSocket::bind(&t.quic_listen).await.with_context(|| {
            format!("binding the QUIC sink (UDP) to {}. Next: pick a free address with --quic-listen, or pass --allow-quic", t.quic_listen)
        })?)
    };
    Ok(Some(TransparentListeners {
        https,
        http,
        quic,
        dns: None,
    }))
}

/// Serves the transparent listeners and the QUIC sink in one task: stopping
/// them also writes the sink's pending attempts, before the final seal.
fn serve_transparent(
    listeners: TransparentListeners,
    proxy: Arc<Proxy>,
    ledger: Arc<Ledger>,
    stop: &watch::Receiver<bool>,
) -> JoinHandle<std::io::Result<()>> {
    let tcp = veris_proxy::transparent::serve(
        Some(listeners.https),
        Some(listeners.http),
        proxy.clone(),
        until(stop),
    );
    let recorder: Arc<dyn veris_proxy::recorder::Recorder> = ledger.clone();
    let stop_sink = until(stop);
    let sink = async move {
        match listeners.quic {
            Some(socket) => veris_proxy::quic::serve(socket, recorder, stop_sink).await,
            None => Ok(()),
        }
    };
    let dns = listeners.dns.map(|(udp, tcp)| {
        use veris_proxy::dns;
        use veris_proxy::route::Route;
        // Vendor, allowed and canary names resolve even once a flood of
        // made-up names filled the table.
        // Weak: the table outlives the session (dials look names up in it).
        let router = Arc::downgrade(&proxy);
        let routed: dns::Routed = Box::new(move |name: &str| {
            router.upgrade().is_some_and(|p| {
                matches!(
                    p.router().route_connection(name),
                    Route::Service(_) | Route::Allowed | Route::Canary
                )
            })
        });
        let names = Arc::new(dns::Names::new(dns::DEFAULT_CAPACITY).routing(routed));
        // Dials to the stub's addresses go to the names they stand for.
        veris_proxy::dial::answer_synthetic_with(names.clone());
        let counted = names.clone();
        let record: dns::OnLookup = Arc::new(move |lookup: &dns::Lookup| {
            if lookup.refused {
                // The first refusals are said: the receipt then names the
                // stub, not the code, for a name that did not resolve.
                if counted.refused() > veris_receipt::entry::DNS_REFUSED_LINES {
                    return;
                }
                warn!(name = %veris_receipt::quote::quoted(&lookup.name), "the DNS stub's table of names is full: a lookup was refused (SERVFAIL)");
            } else if !lookup.first {
                return;
            }
            let entry = Entry::Dns {
                name: lookup.name.clone(),
                qtype: qtype_name(lookup.qtype),
                refused: lookup.refused,
            };
            if let Err(e) = ledger.append(entry) {
                warn!(error = %e, "cannot record a DNS lookup");
            }
        });
        let udp = dns::serve_udp(udp, names.clone(), record.clone(), until(stop));
        let tcp = dns::serve_tcp(tcp, names, record, until(stop));
        async move {
            tokio::join!(udp, tcp);
        }
    });
    tokio::spawn(async move {
        let dns = async move {
            if let Some(dns) = dns {
                dns.await;
            }
        };
        let (tcp, sink, ()) = tokio::join!(tcp, sink, dns);
        tcp.and(sink)
    })
}

/// A DNS query type as people write it.
fn qtype_name(qtype: u16) -> String {
    match qtype {
        1 => "A".into(),
        5 => "CNAME".into(),
        15 => "MX".into(),
        16 => "TXT".into(),
        28 => "AAAA".into(),
        33 => "SRV".into(),
        64 => "SVCB".into(),
        65 => "HTTPS".into(),
        255 => "ANY".into(),
        n => n.to_string(),
    }
}

/// Hosts clients must reach directly.
pub fn no_proxy() -> Vec<String> {
    vec!["localhost".into(), "127.0.0.1".into(), "::1".into()]
}

/// The values of this process's environment that the client variables
/// append to rather than replace.
#[derive(Debug, Default, Clone)]
pub struct EnvBase {
    pub java_tool_options: Option<String>,
    pub php_ini_scan_dir: Option<String>,
}

impl EnvBase {
    pub fn from_env() -> EnvBase {
        EnvBase {
            java_tool_options: std::env::var("JAVA_TOOL_OPTIONS").ok(),
            php_ini_scan_dir: std::env::var("PHP_INI_SCAN_DIR").ok(),
        }
    }
}

/// veris's `NO_PROXY` with the user's (`NO_PROXY` and `no_proxy` of this
/// process) merged in: the union, each entry once. An entry that would
/// exempt a routed host (`*`, `.stripe.com`) is dropped with a warning on
/// stderr: a client honouring it would call the vendor directly, unseen.
pub fn merged_no_proxy(routed_hosts: &[String]) -> Vec<String> {
    let user: Vec<String> = ["NO_PROXY", "no_proxy"]
        .iter()
        .filter_map(|k| std::env::var(k).ok())
        .collect();
    let user: Vec<&str> = user.iter().map(String::as_str).collect();
    let merged = veris_ca::env::merge_no_proxy(&no_proxy(), &user, routed_hosts);
    for (entry, pattern) in &merged.dropped {
        warn!(
            "ignoring a NO_PROXY entry {entry:?}: it would send {pattern} (routed to the twin) around the proxy, and the receipt would miss those calls. Next: take it out of NO_PROXY (veris keeps the rest)"
        );
    }
    merged.entries
}

/// Starts the built-in twin on loopback with a fresh credential, which the
/// caller hands the proxy as its `twin_auth`: the twin executes and logs only
/// vendor requests that carry it, so a workload calling the twin's port
/// directly can neither fake a call nor add a row to the log the receipt's
/// cross-check reads. Returns (base URL, task, credential).
async fn start_builtin_twin(
    sandbox: &str,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(String, JoinHandle<()>, String)> {
    let credential = crate::random_hex(32).context("minting the built-in twin's credential")?;
    let twin = veris_twin::Twin::new(veris_twin::TwinOptions {
        fixtures: veris_twin::Fixtures::builtin(),
        sandbox: Some(sandbox.to_string()),
        log: None,
        credential: Some(credential.clone()),
    })?;
    twin.redact_paths_with(veris_receipt::redact::text);
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding the built-in twin")?;
    let url = format!("http://{}", listener.local_addr()?);
    let task = tokio::spawn(async move {
        let stop = async move {
            let _ = shutdown.wait_for(|s| *s).await;
        };
        if let Err(e) = veris_twin::serve(listener, twin, None, stop).await {
            warn!(error = %e, "built-in twin stopped with an error");
        }
    });
    info!(%url, "built-in twin listening");
    Ok((url, task, credential))
}

/// Reads a small text file that someone else may have planted: only a regular file
/// (a FIFO would block the reader forever, `/dev/zero` would fill its memory), opened
/// without blocking and, unless `follow`, not through a symlink; at most `cap` bytes, more
/// is an error.
pub fn read_bounded(path: &Path, cap: u64, follow: bool) -> std::io::Result<String> {
    String::from_utf8(read_bounded_bytes(path, cap, follow)?).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is not UTF-8 text", path.display()),
        )
    })
}

/// [`read_bounded`], for a file that need not be text.
pub fn read_bounded_bytes(path: &Path, cap: u64, follow: bool) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut flags = libc::O_NONBLOCK;
    if !follow {
        flags |= libc::O_NOFOLLOW;
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is not a regular file", path.display()),
        ));
    }
    let mut bytes = Vec::new();
    f.take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is larger than {cap} bytes", path.display()),
        ));
    }
    Ok(bytes)
}

/// A name beside `path` for a file of this process (`.<name>.<tag>-<pid>-<nanos>`), not
/// guessable ahead of time; create it with `create_new`.
pub fn temp_beside(path: &Path, tag: &str) -> PathBuf {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    dir.join(format!(
        ".{}.{tag}-{}-{nanos}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("veris"),
        std::process::id()
    ))
}

/// `veris serve`: runs until SIGINT or SIGTERM.
pub async fn serve(args: ServeArgs) -> Result<u8> {
    // Before anything is announced: a SIGTERM that arrives right after the
    // ready file must end the session cleanly (final seal, admin files
    // removed), never by the default action.
    let signals = Signals::install()?;
    let stack = Stack::start(
        &args,
        veris_proxy::config::DEFAULT_LISTEN,
        Role::Serve,
        Confinement::None,
    )
    .await?;
    eprintln!(
        "veris: proxy {} (sandbox {}, twin {}); CA {}",
        stack.proxy_url,
        stack.identity.sandbox_id,
        stack.twin_base,
        stack.trust.ca_pem.display()
    );
    crate::outln!("{}", stack.proxy_url);
    signals.wait().await;
    info!("shutting down");
    let finished = stack.finish().await?;
    if let Some(seal) = &finished.seal {
        info!(seq = seal.seq, key_id = %finished.key_id, "final seal written");
    }
    Ok(0)
}

/// SIGTERM and SIGINT, caught from the moment they are installed.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    async fn wait(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
