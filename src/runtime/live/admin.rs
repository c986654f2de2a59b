//! The live proxy's admin API and seal timer: the listener bound with its
//! token, announced in `<state>/admin.addr` and `<state>/admin.token`, the
//! checks its receipt endpoint runs, and the shutdown seal.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};
use veris_ca::fsutil::write_file;
use veris_proxy::admin::{Admin, ReceiptWindow};
use veris_proxy::Proxy;
use veris_receipt::ledger::{Ledger, SealInfo};
use veris_receipt::seal::Sealer;

use super::discovery::{ADDR_FILE, TOKEN_FILE};
use super::session::SessionFacts;
use super::twin_check::service_refs;
use crate::runtime::checks::{canary, live_checks, LiveRun, Reader};

/// Seals while traffic flows come at most this often.
const SEAL_INTERVAL: Duration = Duration::from_secs(1);

/// The admin API's listener, bound with its token and files written before
/// the session line (so a start that cannot bind it leaves the ledger as it
/// was); `None` inside for none (a run: no token exists that a same-uid
/// child could read).
pub struct AdminListener {
    bound: Option<(TcpListener, SocketAddr, String)>,
    files: Vec<PathBuf>,
    /// `--metrics-listen`: the scrape listener, served with the API.
    metrics: Option<TcpListener>,
}

impl AdminListener {
    pub fn addr(&self) -> Option<SocketAddr> {
        self.bound.as_ref().map(|b| b.1)
    }
}

/// Binds the admin listener and writes `admin.token` (0600, new each start)
/// then `admin.addr`; and the scrape listener of `--metrics-listen`.
pub async fn bind_admin(
    listen: Option<&str>,
    metrics_listen: Option<&str>,
    state_dir: &Path,
) -> Result<AdminListener> {
    let Some(listen) = listen else {
        return Ok(AdminListener {
            bound: None,
            files: Vec::new(),
            metrics: None,
        });
    };
    let metrics = bind_metrics(metrics_listen).await?;
    let listener = TcpListener::bind(listen).await.with_context(|| {
        format!(
            "binding the admin API to {listen}. Next: pick a free address with --admin (port 0 picks one)"
        )
    })?;
    let addr = listener.local_addr()?;
    let token = crate::util::random_hex(32)?;
    let token_path = state_dir.join(TOKEN_FILE);
    let addr_path = state_dir.join(ADDR_FILE);
    write_file(&token_path, format!("{token}\n").as_bytes(), 0o600)
        .with_context(|| format!("writing {}", token_path.display()))?;
    write_file(&addr_path, format!("{addr}\n").as_bytes(), 0o644)
        .with_context(|| format!("writing {}", addr_path.display()))?;
    Ok(AdminListener {
        bound: Some((listener, addr, token)),
        files: vec![addr_path, token_path],
        metrics,
    })
}

/// Binds `--metrics-listen`'s address, if given.
pub async fn bind_metrics(listen: Option<&str>) -> Result<Option<TcpListener>> {
    let Some(listen) = listen else {
        return Ok(None);
    };
    let listener = TcpListener::bind(listen).await.with_context(|| {
        format!(
            "binding the metrics listener to {listen}. Next: another veris or exporter may hold it; pick a free address with --metrics-listen ADDR"
        )
    })?;
    info!(addr = %listener.local_addr()?, "metrics listening (GET /metrics)");
    Ok(Some(listener))
}

/// Serves `registry` to scrapers on `listener` until `shutdown` is set.
pub fn serve_metrics(
    listener: TcpListener,
    scrape: veris_proxy::admin::metrics::ScrapeFn,
    token: Option<String>,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<std::io::Result<()>> {
    tokio::spawn(veris_proxy::admin::metrics::serve(
        listener,
        scrape,
        token,
        async move {
            let _ = shutdown.wait_for(|s| *s).await;
        },
    ))
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
    /// Publishing to NATS (`--nats`): its `/status` part and metrics, and
    /// its refusals recorded on the seal timer.
    pub publishing: Option<Arc<crate::runtime::fleet::Publishing>>,
    /// `--webhook`'s on-demand deliveries (`veris trigger`, `veris replay`).
    pub webhooks: Option<veris_proxy::callback::Control>,
    /// The webhook ingress for an external twin (`--twin` with `--webhook`).
    pub ingress: Option<Arc<veris_proxy::callback::Ingress>>,
}

/// The running admin API and seal timer.
pub struct AdminHandle {
    sealer: Arc<Sealer>,
    server: Option<JoinHandle<std::io::Result<()>>>,
    /// The `--metrics-listen` server.
    metrics: Option<JoinHandle<std::io::Result<()>>>,
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
    let (publishing, since) = (a.publishing.clone(), a.session_seq.saturating_sub(1));
    let seal_interval = move |ledger: &Ledger, sealer: &Sealer| {
        if let Some(p) = &publishing {
            p.record_refusal(ledger, since);
        }
        seal_interval(ledger, sealer);
    };
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
    let metrics_listener = a.listener.metrics;
    let Some((listener, addr, token)) = a.listener.bound else {
        return AdminHandle {
            sealer: a.sealer,
            server: None,
            metrics: None,
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
        metrics: Some({
            let mut registry =
                veris_proxy::admin::metrics::Scrape::of(a.proxy, a.ledger.clone()).registry();
            if let Some(p) = &a.publishing {
                registry.register_collector(Box::new(veris_fleet::metrics::Collect::one(
                    p.watch().clone(),
                )));
            }
            registry
        }),
        metrics_open: a.metrics_open,
        unrecorded: a.proxy.unrecorded().clone(),
        publishing: a
            .publishing
            .map(|p| crate::runtime::fleet::status_of(p.watch().clone())),
        webhooks: a.webhooks,
        ingress: a.ingress,
        // The checks every live reader runs (`checks::live_checks`), as the
        // proxy's own process can run them: in the transparent tier only the
        // workload's traffic is redirected (the proxy's uid is exempt), so
        // the canary is left to `veris receipt` run in the sandbox.
        after_read: Some(crate::os::prctl::trim_heap),
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
                    let mut run = LiveRun {
                        tier: identity.tier,
                        proxy_url: &proxy_url,
                        canary: &identity.canary,
                        run_id: &identity.run_id,
                        reader: Reader::Proxy,
                        services: &services,
                        twin_heads: None,
                        ledger: &path,
                        refresh: true,
                        unrecorded: None,
                    };
                    // Streamed: the ledger is read a line at a time, never held.
                    match SessionFacts::of_file(&path, w.until) {
                        Ok(facts) => {
                            let since = w.since.max(facts.since);
                            let unrecorded = unrecorded.counts();
                            run.twin_heads = facts.twin_heads.as_ref();
                            run.unrecorded = Some(&unrecorded);
                            live_checks(&run, None, since, w.until).await
                        }
                        Err(_) => vec![canary(&run).await],
                    }
                })
            })
        }),
    });
    let metrics = metrics_listener.map(|l| {
        let (of, token) = (admin.clone(), admin.token.clone());
        let scrape: veris_proxy::admin::metrics::ScrapeFn =
            Arc::new(move |headers| match &of.metrics {
                Some(registry) => veris_proxy::admin::metrics::response(registry, headers),
                None => veris_proxy::admin::metrics::response(&Default::default(), headers),
            });
        serve_metrics(
            l,
            scrape,
            (!a.metrics_open).then_some(token),
            a.shutdown.clone(),
        )
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
        metrics,
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
        for server in [self.server, self.metrics].into_iter().flatten() {
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
