//! Routing from `--config` or flags, the built-in twin when none is named,
//! and the roots the proxy verifies TLS upstreams with.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};
use veris_ca::CertificateAuthority;
use veris_proxy::config::{Flags, Overrides, Settings};
use veris_receipt::Mode;

use crate::runtime::live::ServiceRef;

use super::*;

/// Routing and the built-in twin, from a config file or flags.
pub(super) struct Routing {
    pub(super) settings: Settings,
    pub(super) twin_task: Option<JoinHandle<()>>,
    pub(super) twin_auth: Option<String>,
    /// `--webhook`: the built-in twin's events and where they go.
    pub(super) webhooks: Option<super::webhooks::Webhooks>,
}

/// Routing from `--config` or from flags; starts the built-in twin (with its
/// per-start credential) when no twin is named.
pub(super) async fn routing(
    args: &ProxyArgs,
    default_listen: &str,
    shutdown_rx: watch::Receiver<bool>,
) -> Result<Routing> {
    let mut twin_task = None;
    // The built-in twin's per-start credential: only this proxy can make
    // it execute (and log) a vendor request.
    let mut builtin_twin_credential = None;
    let mut builtin_url = None;
    let builtin = args.config.is_none() && args.twin.is_none();
    let mut webhooks = super::webhooks::Webhooks::from_args(
        &args.webhooks,
        &args.webhook_faults,
        args.webhook_ca.as_deref(),
        builtin,
    )?;
    if builtin {
        let sandbox = args.sandbox.as_deref().unwrap_or(DEFAULT_SANDBOX);
        let events = webhooks.as_ref().map(|w| w.sink());
        let (url, task, credential, twin) =
            start_builtin_twin(Some(sandbox), events, shutdown_rx).await?;
        if let Some(w) = webhooks.as_mut() {
            w.twin = Some(twin);
        }
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
        webhooks,
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
pub(super) fn settings(
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
pub(super) async fn warn_unreachable_twins(services: &[ServiceRef]) {
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
pub(super) const TWIN_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Upstream roots: the system's plus ours (a TLS twin may use a veris leaf).
/// Roots for TLS upstreams: for the twin, the system roots and the veris CA
/// (a twin served with a veris leaf); for passthrough to real hosts, the
/// system roots alone.
pub(crate) fn upstream_roots(
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

/// Starts the built-in twin on loopback with a fresh credential, which the
/// caller hands the proxy as its `twin_auth`: the twin executes and logs only
/// vendor requests that carry it, so a workload calling the twin's port
/// directly can neither fake a call nor add a row to the log the receipt's
/// cross-check reads. With `events`, the twin hands its webhook events
/// there (their engine also asks the returned twin for `veris trigger`'s
/// fixture events). Returns (base URL, task, credential, the twin).
pub(crate) async fn start_builtin_twin(
    sandbox: Option<&str>,
    events: Option<veris_twin::webhook::EventSink>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(String, JoinHandle<()>, String, Arc<veris_twin::Twin>)> {
    let credential =
        crate::util::random_hex(32).context("minting the built-in twin's credential")?;
    let twin = veris_twin::Twin::new(veris_twin::TwinOptions {
        fixtures: veris_twin::Fixtures::builtin(),
        sandbox: sandbox.map(str::to_string),
        log: None,
        credential: Some(credential.clone()),
    })?;
    twin.redact_paths_with(veris_receipt::redact::text);
    if let Some(events) = events {
        twin.send_events_to(events);
    }
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding the built-in twin")?;
    let url = format!("http://{}", listener.local_addr()?);
    let served = Arc::clone(&twin);
    let task = tokio::spawn(async move {
        let stop = async move {
            let _ = shutdown.wait_for(|s| *s).await;
        };
        if let Err(e) = veris_twin::serve(listener, served, None, stop).await {
            warn!(error = %e, "built-in twin stopped with an error");
        }
    });
    info!(%url, "built-in twin listening");
    Ok((url, task, credential, twin))
}
