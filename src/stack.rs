//! Starting and stopping the proxy stack shared by `serve`, `run` and `demo`:
//! CA and trust material, the built-in twin when none is given, the ledger and
//! its session line, the proxy listener, the env and ready files.

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
use veris_proxy::config::{Flags, Settings};
use veris_proxy::upstream::UpstreamOptions;
use veris_proxy::{Identity, Proxy, ProxyOptions};
use veris_receipt::ledger::Ledger;
use veris_receipt::{Entry, ListenerTier, Mode};

/// Sandbox id used with the built-in twin when none is given.
pub const DEFAULT_SANDBOX: &str = "sbx_local";

#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    /// JSON config file (DESIGN §3); excludes --twin/--services/--route.
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
    /// Extra route, repeatable: SERVICE=HOST[/PREFIX].
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
    /// Written last, atomically, once the proxy accepts connections (JSON: proxy_url, pid, ...).
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
    /// Seconds in-flight requests get after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    pub grace: u64,
    /// Seconds to wait for the twin's response head before answering 504.
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    pub upstream_timeout: u64,
    #[command(flatten)]
    pub transparent: crate::transparent::TransparentArgs,
    /// Admin API listen address (address written to <state>/admin.addr and the ready file).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub admin: String,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ModeArg {
    Passthrough,
    Strict,
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

/// A running stack.
pub struct Stack {
    pub proxy_url: String,
    pub proxy_addr: SocketAddr,
    pub twin_base: String,
    pub state_dir: PathBuf,
    pub ledger: Arc<Ledger>,
    /// Seq of this run's session line: the receipt window starts there.
    pub session_seq: u64,
    pub identity: Identity,
    pub trust: TrustFiles,
    pub ca: Arc<CertificateAuthority>,
    shutdown: watch::Sender<bool>,
    proxy_task: JoinHandle<std::io::Result<()>>,
    /// Transparent tier: the (TLS, plain HTTP) listener addresses.
    pub transparent_addrs: Option<(SocketAddr, SocketAddr)>,
    transparent_task: Option<JoinHandle<std::io::Result<()>>>,
    redirect: Option<crate::transparent::Redirect>,
    twin_task: Option<JoinHandle<()>>,
    /// Admin API, seal timer and the files that announce them.
    pub admin: crate::live::AdminHandle,
}

impl Stack {
    /// Starts everything; `default_listen` applies when `--listen` is absent.
    pub async fn start(args: &ServeArgs, default_listen: &str) -> Result<Stack> {
        crate::transparent::preflight(&args.transparent)?;
        let state_dir = crate::state_dir(args.state_dir.clone());
        std::fs::create_dir_all(&state_dir)
            .with_context(|| format!("creating state dir {}", state_dir.display()))?;

        let listen = args
            .listen
            .clone()
            .unwrap_or_else(|| default_listen.to_string());
        let mode = match args.mode {
            Some(ModeArg::Strict) => Mode::Strict,
            _ => Mode::Passthrough,
        };
        let (shutdown, shutdown_rx) = watch::channel(false);

        // Routing, and the built-in twin when no twin is named.
        let mut twin_task = None;
        let settings = if let Some(path) = &args.config {
            if args.twin.is_some() || !args.services.is_empty() || !args.routes.is_empty() {
                bail!("--config cannot be combined with --twin, --services or --route. Next: put the routes in the config file");
            }
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading config {}", path.display()))?;
            let mut settings = Settings::from_json(&text, &path.display().to_string())?;
            if let Some(l) = &args.listen {
                settings.listen = l.clone();
            }
            if let Some(m) = args.mode {
                settings.mode = match m {
                    ModeArg::Strict => Mode::Strict,
                    ModeArg::Passthrough => Mode::Passthrough,
                };
            }
            settings
        } else {
            let sandbox = args
                .sandbox
                .clone()
                .unwrap_or_else(|| DEFAULT_SANDBOX.to_string());
            let twin_url = match &args.twin {
                Some(url) => url.clone(),
                None => {
                    let (url, task) = start_builtin_twin(&sandbox, shutdown_rx.clone()).await?;
                    twin_task = Some(task);
                    url
                }
            };
            Settings::from_flags(Flags {
                listen: &listen,
                twin: &twin_url,
                sandbox_id: &sandbox,
                services: &args.services,
                routes: &args.routes,
                mode,
                allow_passthrough: &args.allow_passthrough,
            })?
        };

        // CA, leaves and published trust material.
        let ca_dir = args
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

        // Upstream roots: the system's plus ours (a TLS twin may use a veris leaf).
        let mut roots = rustls::RootCertStore::empty();
        if let Some(bundle) = &system_bundle {
            if let Ok(iter) = CertificateDer::pem_file_iter(bundle) {
                let certs: Vec<_> = iter.filter_map(|c| c.ok()).collect();
                roots.add_parsable_certificates(certs);
            }
        }
        let _ = roots.add(ca.cert_der().clone());

        let twin_auth = match &settings.auth_value_env {
            Some(var) => Some(std::env::var(var).with_context(|| {
                format!("upstream.auth_value_env names {var}, which is not set. Next: export {var}=<twin credential>")
            })?),
            None => None,
        };

        // Ledger and this run's session line.
        let ledger_path = state_dir.join("ledger.jsonl");
        let (ledger, report) = Ledger::open(&ledger_path)
            .with_context(|| format!("opening the ledger {}", ledger_path.display()))?;
        if let Some(torn) = &report.torn_tail {
            warn!(line = torn.line, bytes = torn.bytes, saved = ?report.torn_saved_to, "the ledger ended in a torn line (a crash mid-write); it was moved aside and is recorded in the session line");
        }
        let ledger = Arc::new(ledger);
        let sealer = Arc::new(
            veris_receipt::seal::Sealer::load_or_create(&state_dir).with_context(|| {
                format!("loading the ledger seal key in {}", state_dir.display())
            })?,
        );

        let listener = TcpListener::bind(&settings.listen)
            .await
            .with_context(|| format!("binding the proxy to {}. Next: pick a free address with --listen (port 0 picks one)", settings.listen))?;
        let proxy_addr = listener.local_addr()?;
        let transparent_listeners = if args.transparent.transparent {
            let t = &args.transparent;
            let https = TcpListener::bind(&t.https_listen).await.with_context(|| {
                format!("binding the transparent TLS listener to {}. Next: pick a free address with --https-listen", t.https_listen)
            })?;
            let http = TcpListener::bind(&t.http_listen).await.with_context(|| {
                format!("binding the transparent HTTP listener to {}. Next: pick a free address with --http-listen", t.http_listen)
            })?;
            // The QUIC sink, unless UDP 443 is let through.
            let quic = if t.allow_quic {
                None
            } else {
                Some(tokio::net::UdpSocket::bind(&t.quic_listen).await.with_context(|| {
                    format!("binding the QUIC sink (UDP) to {}. Next: pick a free address with --quic-listen, or pass --allow-quic", t.quic_listen)
                })?)
            };
            Some((https, http, quic))
        } else {
            None
        };
        let proxy_url = format!("http://{proxy_addr}");

        let identity = Identity {
            run_id: crate::random_hex(8)?,
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
        let session_seq = ledger
            .append(Entry::Session {
                run_id: identity.run_id.clone(),
                sandbox_id: identity.sandbox_id.clone(),
                mode: identity.mode,
                tier: identity.tier,
                twin: settings.twin_base.clone(),
                pid: std::process::id(),
                version: env!("CARGO_PKG_VERSION").to_string(),
                listen: proxy_addr.to_string(),
                recovered_torn_tail: report.torn_tail,
            })
            .context("writing the session line to the ledger")?;

        let twin_base = settings.twin_base.clone();
        let proxy = Proxy::new(
            ProxyOptions {
                router: settings.router,
                identity: identity.clone(),
                twin_base: twin_base.clone(),
                twin_auth,
                upstream: UpstreamOptions {
                    roots,
                    insecure_skip_verify: settings.insecure_skip_verify,
                    response_timeout: Duration::from_secs(args.upstream_timeout),
                    ..UpstreamOptions::default()
                },
                grace: Duration::from_secs(args.grace),
            },
            issuer,
            ledger.clone(),
        );
        let h2c = proxy.probe_twin().await;
        info!(twin = %twin_base, h2c, "twin upstream");

        // Transparent tier: rules in and root gone before any client byte is read.
        let (mut transparent_addrs, mut transparent_task, mut redirect) = (None, None, None);
        if let Some((https, http, quic)) = transparent_listeners {
            let addrs = (https.local_addr()?, http.local_addr()?);
            let quic_addr = quic.as_ref().map(|q| q.local_addr()).transpose()?;
            redirect = crate::transparent::engage(
                &args.transparent,
                addrs.0,
                addrs.1,
                quic_addr,
                &[&state_dir, &ca_dir],
            )?;
            let mut rx = shutdown_rx.clone();
            let stop = async move {
                let _ = rx.wait_for(|stop| *stop).await;
            };
            let tcp = veris_proxy::transparent::serve(Some(https), Some(http), proxy.clone(), stop);
            // The sink shares the listeners' task: stopping them also writes
            // its pending attempts, before the shutdown seal.
            let mut rx = shutdown_rx.clone();
            let recorder: Arc<dyn veris_proxy::recorder::Recorder> = ledger.clone();
            let sink = async move {
                match quic {
                    Some(socket) => {
                        let stop = async move {
                            let _ = rx.wait_for(|stop| *stop).await;
                        };
                        veris_proxy::quic::serve(socket, recorder, stop).await
                    }
                    None => Ok(()),
                }
            };
            transparent_task = Some(tokio::spawn(async move {
                let (tcp, sink) = tokio::join!(tcp, sink);
                tcp.and(sink)
            }));
            transparent_addrs = Some(addrs);
            info!(https = %addrs.0, http = %addrs.1, quic = ?quic_addr, "transparent listeners");
        }

        let admin = crate::live::start_admin(crate::live::AdminStart {
            listen: &args.admin,
            state_dir: &state_dir,
            proxy: &proxy,
            proxy_url: &proxy_url,
            twin: &twin_base,
            session_seq,
            ledger: ledger.clone(),
            sealer,
            shutdown: shutdown_rx.clone(),
        })
        .await?;

        let mut rx = shutdown_rx.clone();
        let proxy_task = tokio::spawn(veris_proxy::serve(listener, proxy, async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }));

        let stack = Stack {
            proxy_url,
            proxy_addr,
            twin_base,
            state_dir,
            ledger,
            session_seq,
            identity,
            trust,
            ca,
            shutdown,
            proxy_task,
            transparent_addrs,
            transparent_task,
            redirect,
            twin_task,
            admin,
        };
        if let Some(path) = &args.write_env {
            let no_proxy = no_proxy();
            let spec = stack.env_spec(&no_proxy, args.env_trust_only, None);
            veris_ca::env::write(path, &spec, args.env_format.into())
                .with_context(|| format!("writing env file {}", path.display()))?;
        }
        if let Some(path) = &args.ready_file {
            let ready = serde_json::json!({
                "proxy_url": stack.proxy_url,
                "pid": std::process::id(),
                "sandbox_id": stack.identity.sandbox_id,
                "twin": stack.twin_base,
                "state_dir": stack.state_dir,
                "ca": stack.trust.ca_pem,
                "admin": format!("http://{}", stack.admin.addr),
                "https_listen": stack.transparent_addrs.map(|a| a.0.to_string()),
                "http_listen": stack.transparent_addrs.map(|a| a.1.to_string()),
            });
            write_atomic(path, format!("{ready}\n").as_bytes())
                .with_context(|| format!("writing ready file {}", path.display()))?;
        }
        Ok(stack)
    }

    /// The env spec for clients of this stack.
    pub fn env_spec<'a>(
        &'a self,
        no_proxy: &'a [String],
        trust_only: bool,
        java_base: Option<&'a str>,
    ) -> EnvSpec<'a> {
        EnvSpec {
            proxy_url: &self.proxy_url,
            no_proxy,
            sandbox_id: &self.identity.sandbox_id,
            canary: &self.identity.canary,
            trust: &self.trust,
            trust_only,
            java_tool_options_base: java_base,
        }
    }

    /// Stops accepting, lets in-flight requests finish (bounded), stops the
    /// built-in twin and syncs the ledger.
    pub async fn stop(self) -> Result<()> {
        self.stop_sealed().await.map(|_| ())
    }

    /// [`Stack::stop`], returning the shutdown seal the proxy appended (a
    /// fresh seal over everything this run wrote).
    pub async fn stop_sealed(self) -> Result<Option<veris_receipt::ledger::SealInfo>> {
        let _ = self.shutdown.send(true);
        match self.proxy_task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "proxy ended with an error"),
            Err(e) => warn!(error = %e, "proxy task failed"),
        }
        if let Some(t) = self.twin_task {
            let _ = t.await;
        }
        if let Some(t) = self.transparent_task {
            match t.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => warn!(error = %e, "transparent listeners ended with an error"),
                Err(e) => warn!(error = %e, "transparent listener task failed"),
            }
        }
        let seal = self.admin.stop(&self.ledger).await;
        self.ledger.sync().context("syncing the ledger")?;
        if let Some(redirect) = self.redirect {
            // Waits (bounded) for the root helper to delete the table.
            let _ = tokio::task::spawn_blocking(move || redirect.remove()).await;
        }
        Ok(seal)
    }
}

/// Hosts clients must reach directly.
pub fn no_proxy() -> Vec<String> {
    vec!["localhost".into(), "127.0.0.1".into(), "::1".into()]
}

async fn start_builtin_twin(
    sandbox: &str,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(String, JoinHandle<()>)> {
    let twin = veris_twin::Twin::new(veris_twin::TwinOptions {
        fixtures: veris_twin::Fixtures::builtin(),
        sandbox: Some(sandbox.to_string()),
        log: None,
    })?;
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
    Ok((url, task))
}

/// Writes via a temp file in the same dir and a rename, so readers never see a partial file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("veris"),
        std::process::id()
    ));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// `veris serve`: runs until SIGINT or SIGTERM.
pub async fn serve(args: ServeArgs) -> Result<u8> {
    let stack = Stack::start(&args, veris_proxy::config::DEFAULT_LISTEN).await?;
    eprintln!(
        "veris: proxy {} (sandbox {}, twin {}); CA {}",
        stack.proxy_url,
        stack.identity.sandbox_id,
        stack.twin_base,
        stack.trust.ca_pem.display()
    );
    crate::outln!("{}", stack.proxy_url);
    wait_for_signal().await?;
    info!("shutting down");
    stack.stop().await?;
    Ok(0)
}

async fn wait_for_signal() -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
