//! A gateway sandbox's webhooks (`add-sandbox --webhook SERVICE=URL`,
//! DESIGN §15): the gateway's built-in twin makes events for every sandbox
//! it serves, each naming its sandbox (`event.sandbox`, the `/s/{sandbox}/`
//! prefix the sandbox's own routes put on its requests); [`route`] hands
//! each to that sandbox's own engine only, which delivers it to that
//! sandbox's URLs and records every attempt as a `callback` line in that
//! sandbox's ledger, sealed by the gateway's key.
//!
//! Secrets: each sandbox gets its own `whsec_` secret per service, made at
//! registration, answered once (like its password) and kept in
//! `<state>/sandboxes/<id>/webhook.secrets` (0600, in the sandbox's 0700
//! directory; never in the record, which the fleet's bucket copies, nor in
//! a log or a ledger), so a restarted gateway signs with the secret the
//! app was given. A sandbox whose secrets file is gone or unreadable is
//! served with its webhooks off, said in the log. Removing a sandbox stops
//! its engine before its final seal (retries not yet due are not made) and
//! deletes the file.
//!
//! A sandbox whose twin is not the built-in one (its own `--twin`, or the
//! gateway's) gets an ingress instead ([`veris_proxy::callback::Ingress`]):
//! its twin POSTs signed events to `/sandboxes/{id}/ingress/{service}` on
//! the admin API with a token of its own, made at registration, answered
//! once and kept 0600 in `webhook.ingress` beside the record.
//!
//! Dials: an app's URL is the platform's (E2B exposes a sandbox's port at
//! a public URL), dialed from the gateway's host under the gateway's dial
//! policy ([`Dialer::Policed`]): only where a sandbox's passthrough could
//! go (public addresses, and `--allow-dial` blocks), checked at
//! registration and again at every dial. `https://` URLs are verified
//! against the system's roots, as the gateway's passthrough is.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use veris_proxy::callback::{dial::split_authority, Dialer, Webhook};
use veris_receipt::ledger::Ledger;
use veris_twin::webhook::{Dropped, Event, Secret};

use crate::runtime::stack::webhooks::{self as stack, Webhooks};
use crate::tier::gateway::{Deliveries, Sandboxes};
use crate::tier::gateway_record::Record;

/// The secrets file in the sandbox's directory.
pub(super) const SECRETS_FILE: &str = "webhook.secrets";

/// The ingress token's file in the sandbox's directory.
pub(super) const INGRESS_FILE: &str = "webhook.ingress";

/// The most bytes a secrets file may have (a real one is under 1 KiB).
const SECRETS_CAP: u64 = 16 * 1024;

/// How long a registration waits to resolve a webhook URL's host.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// What a registration may ask for.
pub(super) struct Ask<'a> {
    pub webhooks: &'a [String],
    pub faults: &'a [String],
    /// The sandbox's events come from the gateway's built-in twin.
    pub builtin_twin: bool,
    /// `--nats`: the sandbox is the fleet's.
    pub fleet: bool,
}

/// What a registration answers once: the signing secrets (built-in twin)
/// or the ingress token (an external twin).
#[derive(Default)]
pub(super) struct Registration {
    pub secrets: BTreeMap<String, String>,
    pub ingress_token: Option<String>,
}

/// Checks a registration's `--webhook` values (run's syntax and errors;
/// `http://`; an address the dial policy lets the gateway reach) and, when
/// there are any, writes fresh secrets (or with an external twin an
/// ingress token) to `dir` (created 0700). `dir` must be the sandbox's.
pub(super) async fn register(dir: &Path, ask: Ask<'_>) -> Result<Registration> {
    let Some((targets, faults)) = stack::targets(ask.webhooks, ask.faults)? else {
        return Ok(Registration::default());
    };
    if !ask.builtin_twin && !faults.is_empty() {
        bail!("--webhook-faults needs the gateway's built-in twin: this sandbox's twin (its --twin, or the gateway's) makes and signs its own deliveries, which its ingress forwards unchanged. Next: drop --webhook-faults");
    }
    if ask.fleet {
        bail!("--webhook is refused on a gateway with --nats: every gateway of the fleet serves the sandbox, and each makes the events of the requests it serves, so each would need the sandbox's signing secret (or ingress token); the fleet shares only its registry bucket, which every gateway and every reader of the bucket can read, so a secret kept there would be no secret, and one kept by this gateway alone would leave the others' events unsigned and undelivered. Next: register sandboxes that need webhooks on a gateway without --nats, or drop --webhook");
    }
    for w in &targets {
        reachable(w).await?;
    }
    if !ask.builtin_twin {
        let token = crate::util::random_hex(32).context("making the ingress token")?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        super::private(dir, 0o700)?;
        let path = dir.join(INGRESS_FILE);
        veris_ca::fsutil::write_file(&path, format!("{token}\n").as_bytes(), 0o600)
            .with_context(|| format!("writing the sandbox's ingress token {}", path.display()))?;
        return Ok(Registration {
            secrets: BTreeMap::new(),
            ingress_token: Some(token),
        });
    }
    let secrets = stack::fresh_secrets(&targets)?;
    save(dir, &secrets)?;
    Ok(Registration {
        secrets: secrets
            .into_iter()
            .filter_map(|(service, s)| Some((service, s.first()?.expose().to_string())))
            .collect(),
        ingress_token: None,
    })
}

/// Refuses a URL the gateway would not dial for the sandbox itself.
async fn reachable(w: &Webhook) -> Result<()> {
    let (host, port) = split_authority(&w.authority)?;
    let checked = tokio::time::timeout(
        RESOLVE_TIMEOUT,
        veris_proxy::outbound::dial::check_host_for_client(host, port),
    )
    .await;
    match checked {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::PermissionDenied => bail!(
            "--webhook {}: {e}. The gateway delivers a sandbox's webhooks only where the sandbox's own passthrough may go. Next: give the URL the platform exposes the app's port at, or allow the block with --allow-dial",
            w.url()
        ),
        Ok(Err(e)) => bail!("--webhook {}: {e}. Next: check the URL's host", w.url()),
        Err(_) => bail!(
            "--webhook {}: {host} did not resolve within {} s. Next: check the URL's host",
            w.url(),
            RESOLVE_TIMEOUT.as_secs()
        ),
    }
}

/// Writes the secrets file: a fresh 0600 file renamed into place.
fn save(dir: &Path, secrets: &[(String, Vec<Secret>)]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    super::private(dir, 0o700)?;
    let map: BTreeMap<&str, Vec<&str>> = secrets
        .iter()
        .map(|(service, s)| (service.as_str(), s.iter().map(Secret::expose).collect()))
        .collect();
    let mut body = serde_json::to_vec(&map)?;
    body.push(b'\n');
    let path = dir.join(SECRETS_FILE);
    veris_ca::fsutil::write_file(&path, &body, 0o600)
        .with_context(|| format!("writing the sandbox's webhook secrets {}", path.display()))
}

/// The secrets file of `dir`, read with care (never through a link, never
/// blocking on a FIFO, bounded).
fn load(dir: &Path) -> Result<Vec<(String, Vec<Secret>)>> {
    let path = dir.join(SECRETS_FILE);
    let bytes = crate::util::read_bounded_bytes(&path, SECRETS_CAP, false)
        .with_context(|| format!("reading {}", path.display()))?;
    let map: BTreeMap<String, Vec<String>> = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not a secrets file", path.display()))?;
    Ok(map
        .into_iter()
        .map(|(service, s)| (service, s.iter().map(|t| Secret::from_text(t)).collect()))
        .collect())
}

/// Deletes the secrets and ingress token files of `dir` (a removed sandbox
/// is never served again).
pub(super) fn forget(dir: &Path) {
    for file in [SECRETS_FILE, INGRESS_FILE] {
        match std::fs::remove_file(dir.join(file)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                warn!(dir = %dir.display(), error = %e, "cannot delete a removed sandbox's webhook secrets")
            }
        }
    }
}

/// Starts the deliveries of `record`'s webhooks into `ledger`, signed with
/// the secrets in `dir` (with the built-in twin, which also renders `veris
/// trigger`'s fixtures), else its ingress with the token in `dir`; none without webhooks. `https://` URLs are verified against
/// `roots` (the system's). A sandbox whose webhooks cannot start
/// is still served, with its webhooks off and a log line saying why and
/// what to do.
pub(super) fn start(
    dir: &Path,
    record: &Record,
    ledger: &Arc<Ledger>,
    builtin_twin: Option<&Arc<veris_twin::Twin>>,
    roots: &rustls::RootCertStore,
) -> Option<Deliveries> {
    // An ended sandbox (its chain only gets its final seal) delivers nothing.
    let ended = record.revoked_ms.is_some()
        || record
            .expires()
            .is_some_and(|e| std::time::SystemTime::now() >= e);
    if record.webhooks.is_empty() || ended {
        return None;
    }
    let started = (|| -> Result<Webhooks> {
        let (targets, faults) =
            stack::targets(&record.webhooks, &record.webhook_faults)?.context("no webhooks")?;
        let Some(twin) = builtin_twin else {
            let path = dir.join(INGRESS_FILE);
            let token = crate::util::read_bounded_bytes(&path, SECRETS_CAP, false)
                .with_context(|| format!("reading {}", path.display()))?;
            let token = String::from_utf8(token)
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| t.len() == 64)
                .with_context(|| format!("{} holds no token", path.display()))?;
            return Webhooks::new(targets, faults, Vec::new()).map(|w| w.with_ingress(token));
        };
        let secrets = load(dir)?;
        for w in &targets {
            if !secrets
                .iter()
                .any(|(s, v)| *s == w.service && !v.is_empty())
            {
                bail!("no secret for {} in {SECRETS_FILE}", w.service);
            }
        }
        let mut webhooks = Webhooks::new(targets, faults, secrets)?;
        webhooks.twin = Some(Arc::clone(twin));
        Ok(webhooks)
    })();
    let webhooks = match started {
        Ok(w) => w,
        Err(e) => {
            warn!(sandbox = %record.id, error = %format!("{e:#}"), "the sandbox's webhooks are off: its events are not delivered. Next: remove the sandbox and add it again (its app needs the new secret add-sandbox prints)");
            return None;
        }
    };
    for line in webhooks.described() {
        info!(sandbox = %record.id, "{line}");
    }
    let events = webhooks.sink();
    let started = webhooks.start(Arc::clone(ledger), Dialer::Policed, roots.clone());
    Some(Deliveries {
        control: started.engine.as_ref().map(|e| e.control()),
        events,
        engine: tokio::sync::Mutex::new(started.engine),
        ingress: started.ingress,
    })
}

/// Hands each event of the built-in twin to its sandbox's deliveries (and
/// no other's) until `cancel`; an event for a sandbox without webhooks, or
/// one no longer served, goes nowhere. Events the shared queue `dropped`
/// are handed to their sandbox's count the same way.
pub(super) async fn route(
    mut events: mpsc::Receiver<Event>,
    dropped: Arc<Dropped>,
    sandboxes: Arc<Sandboxes>,
    cancel: CancellationToken,
) {
    loop {
        let event = tokio::select! {
            () = cancel.cancelled() => return,
            // The shared queue was full: each sandbox's engine records the
            // drops of its own events (an event names its sandbox).
            () = dropped.wait() => {
                for ((sandbox, service), n) in dropped.take_by_sandbox() {
                    match sandboxes.get(&sandbox).and_then(|s| s.webhooks.as_ref().map(|d| d.events.clone())) {
                        Some(sink) => sink.count_dropped(&service, n),
                        None => warn!(%sandbox, %service, events = n, "webhook events dropped for a sandbox without webhooks"),
                    }
                }
                continue;
            }
            e = events.recv() => match e {
                Some(e) => e,
                None => return,
            },
        };
        let Some(sandbox) = sandboxes.get(&event.sandbox) else {
            continue;
        };
        let Some(deliveries) = &sandbox.webhooks else {
            continue;
        };
        // A full queue counts the drop; the sandbox's engine records it.
        deliveries.events.offer(event);
    }
}
