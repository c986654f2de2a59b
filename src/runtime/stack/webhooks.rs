//! `--webhook SERVICE=URL`: the checked targets, the per-start signing
//! secrets and the variables that give them to the app, `--webhook-faults`,
//! and the delivery engine started once the ledger is open (DESIGN §15).
//! With an external twin (`--twin`, `--config`), which makes and signs its
//! own events, no engine: an ingress on the admin listener with a per-start
//! token takes the twin's deliveries and forwards them
//! ([`veris_proxy::callback::ingress`]). `https://` URLs are delivered over
//! TLS verified against the system roots and `--webhook-ca`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rustls::pki_types::CertificateDer;
use tokio::sync::mpsc;
use veris_proxy::callback::faults::MAX_DELAY;
use veris_proxy::callback::{
    Dialer, Engine, EngineOptions, Faults, Ingress, Reach, Webhook, WebhookTls, ATTEMPT_TIMEOUT,
    PENDING,
};
use veris_twin::webhook::{Dropped, Event, EventSink, Secret, EVENT_QUEUE};

/// Services whose vendor signature scheme the twin implements.
const SIGNED: &[&str] = &["stripe"];

/// Scales the waits between delivery attempts (tests: `0.001`).
const TIME_SCALE_VAR: &str = "VERIS_WEBHOOK_TIME_SCALE";
/// One attempt's bound in milliseconds (tests; default 10 s).
const TIMEOUT_VAR: &str = "VERIS_WEBHOOK_TIMEOUT_MS";
/// Events queued and events under way at most, each (tests: a small queue
/// to make drops happen; default [`EVENT_QUEUE`] and [`PENDING`]).
const QUEUE_VAR: &str = "VERIS_WEBHOOK_QUEUE";

/// The most bytes a `--webhook-ca` file may have.
const CA_CAP: u64 = 1024 * 1024;

/// The webhooks of a start, before the ledger is open.
pub(crate) struct Webhooks {
    targets: Vec<Webhook>,
    faults: Faults,
    /// The built-in twin, which renders `veris trigger`'s fixture events.
    pub(crate) twin: Option<std::sync::Arc<veris_twin::Twin>>,
    secrets: Vec<(String, Vec<Secret>)>,
    sink: EventSink,
    events: mpsc::Receiver<Event>,
    dropped: Arc<Dropped>,
    pending: usize,
    backoff_scale: f64,
    attempt_timeout: Duration,
    /// `--webhook-ca`: roots trusted for `https://` URLs besides the system's.
    extra_roots: Vec<CertificateDer<'static>>,
    /// With an external twin: the ingress token it must present.
    ingress_token: Option<String>,
}

/// What [`Webhooks::start`] started: the engine (built-in twin) or the
/// ingress (external twin).
pub(crate) struct Started {
    pub engine: Option<Engine>,
    pub ingress: Option<std::sync::Arc<Ingress>>,
}

impl Webhooks {
    /// Parses `--webhook` values (none: `None`), `--webhook-faults` and
    /// `--webhook-ca`; `builtin` says whether the built-in twin runs (only
    /// it makes events).
    pub(super) fn from_args(
        values: &[String],
        faults: &[String],
        ca: Option<&Path>,
        builtin: bool,
    ) -> Result<Option<Webhooks>> {
        let Some((targets, faults)) = targets(values, faults)? else {
            if ca.is_some() {
                bail!("--webhook-ca needs --webhook: there are no deliveries to verify. Next: add --webhook stripe=https://HOST:PORT/PATH, or drop --webhook-ca");
            }
            return Ok(None);
        };
        let extra_roots = ca.map(load_ca).transpose()?.unwrap_or_default();
        if !builtin {
            if !faults.is_empty() {
                bail!("--webhook-faults needs the built-in twin: an external twin (--twin, --config) makes and signs its own deliveries, which the ingress forwards unchanged. Next: drop --webhook-faults");
            }
            let token = crate::util::random_hex(32).context("making the ingress token")?;
            return Webhooks::new(targets, faults, Vec::new())
                .map(|w| Some(w.with_ingress(token).with_roots(extra_roots)));
        }
        let secrets = fresh_secrets(&targets)?;
        Webhooks::new(targets, faults, secrets).map(|w| Some(w.with_roots(extra_roots)))
    }

    /// The webhooks of `targets`, signed with `secrets` (one list per
    /// service, the newest first), with their own event queue.
    pub(crate) fn new(
        targets: Vec<Webhook>,
        faults: Faults,
        secrets: Vec<(String, Vec<Secret>)>,
    ) -> Result<Webhooks> {
        let (backoff_scale, attempt_timeout) = time_knobs()?;
        let (queue, pending) = queue_knob()?;
        let (sink, events, dropped) = veris_twin::webhook::channel(queue);
        Ok(Webhooks {
            targets,
            faults,
            twin: None,
            secrets,
            sink,
            events,
            dropped,
            pending,
            backoff_scale,
            attempt_timeout,
            extra_roots: Vec::new(),
            ingress_token: None,
        })
    }

    /// These webhooks with `roots` trusted for `https://` URLs besides the
    /// system's.
    fn with_roots(mut self, roots: Vec<CertificateDer<'static>>) -> Webhooks {
        self.extra_roots = roots;
        self
    }

    /// These webhooks taken by an ingress with `token` (an external twin's
    /// deliveries) instead of an engine.
    pub(crate) fn with_ingress(mut self, token: String) -> Webhooks {
        self.ingress_token = Some(token);
        self
    }

    /// The ingress token, with an external twin: given to that twin (it is
    /// never in the workload's environment, env file or state dir).
    pub(crate) fn ingress_token(&self) -> Option<&str> {
        self.ingress_token.as_deref()
    }

    /// Where the twin hands its events.
    pub(crate) fn sink(&self) -> EventSink {
        self.sink.clone()
    }

    /// The variables that give the app its secrets
    /// (`STRIPE_WEBHOOK_SECRET=whsec_…`).
    pub(super) fn env(&self) -> Vec<(String, String)> {
        self.secrets
            .iter()
            .filter_map(|(service, secrets)| {
                let secret = secrets.first()?;
                Some((env_name(service), secret.expose().to_string()))
            })
            .collect()
    }

    /// One line per target for a person: where events go and the variable
    /// that holds their secret.
    pub(crate) fn described(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .targets
            .iter()
            .map(|w| match self.ingress_token {
                None => format!(
                    "webhook {} -> {} (secret in {})",
                    w.service,
                    w.url(),
                    env_name(&w.service)
                ),
                Some(_) => format!(
                    "webhook {} -> {} (the external twin's events, through the ingress; it signs them)",
                    w.service,
                    w.url(),
                ),
            })
            .collect();
        // Said up front: every delivery of this start is wrong on purpose.
        if let Some(faults) = self.faults.label(self.faults.duplicate) {
            lines.push(format!(
                "webhook faults: {faults} (these deliveries never count toward --require-callback)"
            ));
        }
        lines
    }

    /// Starts delivering through `dialer` (`https://` URLs verified against
    /// `roots`, the system's, and `--webhook-ca`), recording into `ledger`:
    /// the engine, or with an external twin the ingress.
    pub(crate) fn start(
        self,
        ledger: std::sync::Arc<veris_receipt::ledger::Ledger>,
        dialer: Dialer,
        mut roots: rustls::RootCertStore,
    ) -> Started {
        roots.add_parsable_certificates(self.extra_roots);
        let reach = Reach {
            dialer,
            tls: WebhookTls::new(roots),
        };
        if let Some(token) = self.ingress_token {
            return Started {
                engine: None,
                ingress: Some(std::sync::Arc::new(Ingress::new(
                    token,
                    self.targets,
                    ledger,
                    reach,
                    self.attempt_timeout,
                ))),
            };
        }
        let engine = Engine::start(
            self.events,
            EngineOptions {
                webhooks: self.targets,
                secrets: self.secrets,
                ledger,
                backoff_scale: self.backoff_scale,
                attempt_timeout: self.attempt_timeout,
                faults: self.faults,
                twin: self.twin,
                reach,
                pending: self.pending,
                dropped: Some(self.dropped),
            },
        );
        Started {
            engine: Some(engine),
            ingress: None,
        }
    }
}

/// `--webhook` and `--webhook-faults` values checked: the targets and
/// their faults, `None` without targets (faults without one are refused).
pub(crate) fn targets(
    values: &[String],
    faults: &[String],
) -> Result<Option<(Vec<Webhook>, Faults)>> {
    let faults = parse_faults(faults)?;
    if values.is_empty() {
        if !faults.is_empty() {
            bail!("--webhook-faults needs --webhook: there are no deliveries to put faults on. Next: add --webhook stripe=http://HOST:PORT/PATH");
        }
        return Ok(None);
    }
    let targets = values
        .iter()
        .map(|v| parse(v))
        .collect::<Result<Vec<_>>>()?;
    Ok(Some((targets, faults)))
}

/// A fresh signing secret for each service `targets` names.
pub(crate) fn fresh_secrets(targets: &[Webhook]) -> Result<Vec<(String, Vec<Secret>)>> {
    let mut secrets: Vec<(String, Vec<Secret>)> = Vec::new();
    for w in targets {
        if !secrets.iter().any(|(s, _)| *s == w.service) {
            let secret = Secret::generate()
                .map_err(|_| anyhow::anyhow!("the system's random source failed"))
                .context("making a webhook signing secret")?;
            secrets.push((w.service.clone(), vec![secret]));
        }
    }
    Ok(secrets)
}

/// `--webhook-faults duplicate,reorder,delay=DURATION,stale-signature,bad-signature`
/// (repeatable, or comma-separated).
fn parse_faults(values: &[String]) -> Result<Faults> {
    const SYNTAX: &str = "Next: give a comma-separated list of duplicate, reorder, delay=DURATION (e.g. delay=30s, at most 10m), stale-signature, bad-signature";
    let mut faults = Faults::default();
    for item in values.iter().flat_map(|v| v.split(',')) {
        let item = item.trim();
        match item.split_once('=') {
            None if item == "duplicate" => faults.duplicate = true,
            None if item == "reorder" => faults.reorder = true,
            None if item == "stale-signature" => faults.stale_signature = true,
            None if item == "bad-signature" => faults.bad_signature = true,
            Some(("delay", d)) => {
                let delay = crate::util::parse_duration(d).map_err(|why| {
                    anyhow::anyhow!("--webhook-faults delay={d}: {why}. {SYNTAX}")
                })?;
                if delay > MAX_DELAY {
                    bail!("--webhook-faults delay={d}: longer than {} s, the longest delay taken. {SYNTAX}", MAX_DELAY.as_secs());
                }
                faults.delay = Some(delay);
            }
            _ => bail!("--webhook-faults: {item:?} is not a fault. {SYNTAX}"),
        }
    }
    Ok(faults)
}

/// One `--webhook` value, checked; the error names the syntax.
pub fn parse(value: &str) -> Result<Webhook> {
    let w = Webhook::parse(value).map_err(|why| {
        anyhow::anyhow!("--webhook {value:?}: {why}. Next: give it as SERVICE=http://HOST:PORT/PATH, e.g. --webhook stripe=http://127.0.0.1:4242/webhook")
    })?;
    if !SIGNED.contains(&w.service.as_str()) {
        bail!(
            "--webhook {value:?}: the built-in twin makes webhook events for {} only. Next: name one of those services",
            SIGNED.join(", ")
        );
    }
    Ok(w)
}

/// `--webhook-ca FILE`: the PEM certificates in it (at least one).
fn load_ca(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let next = "Next: give a PEM file with the CA certificate the app's certificate chains to";
    let bytes = crate::util::read_bounded_bytes(path, CA_CAP, true)
        .with_context(|| format!("--webhook-ca {}: cannot read it. {next}", path.display()))?;
    let certs: Vec<CertificateDer<'static>> =
        rustls::pki_types::pem::PemObject::pem_slice_iter(&bytes)
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| {
                anyhow::anyhow!("--webhook-ca {}: not PEM ({e:?}). {next}", path.display())
            })?;
    if certs.is_empty() {
        bail!(
            "--webhook-ca {}: no certificate in it. {next}",
            path.display()
        );
    }
    Ok(certs)
}

/// The queue knob: events queued and under way at most.
fn queue_knob() -> Result<(usize, usize)> {
    match std::env::var(QUEUE_VAR) {
        Ok(v) => {
            let n = v.parse::<usize>().ok().filter(|n| *n > 0).with_context(|| {
                format!("{QUEUE_VAR}={v:?} is not a whole number above 0. Next: unset it, or give e.g. 2")
            })?;
            Ok((n, n))
        }
        Err(_) => Ok((EVENT_QUEUE, PENDING)),
    }
}

/// The test knobs: the backoff's scale and one attempt's bound.
fn time_knobs() -> Result<(f64, Duration)> {
    let backoff_scale = match std::env::var(TIME_SCALE_VAR) {
        Ok(v) => v
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite() && *f >= 0.0)
            .with_context(|| format!("{TIME_SCALE_VAR}={v:?} is not a number of at least 0. Next: unset it, or give e.g. 0.001"))?,
        Err(_) => 1.0,
    };
    let attempt_timeout = match std::env::var(TIMEOUT_VAR) {
        Ok(v) => Duration::from_millis(v.parse::<u64>().ok().filter(|n| *n > 0).with_context(
            || format!("{TIMEOUT_VAR}={v:?} is not a whole number of milliseconds. Next: unset it, or give e.g. 2000"),
        )?),
        Err(_) => ATTEMPT_TIMEOUT,
    };
    Ok((backoff_scale, attempt_timeout))
}

/// `STRIPE_WEBHOOK_SECRET` for `stripe`.
pub(crate) fn env_name(service: &str) -> String {
    format!(
        "{}_WEBHOOK_SECRET",
        service.to_ascii_uppercase().replace('-', "_")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_and_bad_ones_say_the_syntax() {
        let f = parse_faults(&["duplicate,delay=2s".into(), "bad-signature".into()]).unwrap();
        assert!(f.duplicate && f.bad_signature && !f.reorder);
        assert_eq!(f.delay, Some(Duration::from_secs(2)));
        for bad in [
            "nonsense",
            "delay=abc",
            "delay=99h",
            "delay=11m",
            "duplicate=1",
            "",
        ] {
            let e = parse_faults(&[bad.into()]).unwrap_err().to_string();
            assert!(e.contains("Next:"), "{bad}: {e}");
        }
    }
}
