//! `--webhook SERVICE=URL`: the checked targets, the per-start signing
//! secrets and the variables that give them to the app, and the delivery
//! engine started once the ledger is open (DESIGN §15).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::sync::mpsc;
use veris_proxy::callback::{Dialer, Engine, EngineOptions, Webhook, ATTEMPT_TIMEOUT};
use veris_twin::webhook::{Event, EventSink, Secret, EVENT_QUEUE};

/// Services whose vendor signature scheme the twin implements.
const SIGNED: &[&str] = &["stripe"];

/// Scales the waits between delivery attempts (tests: `0.001`).
const TIME_SCALE_VAR: &str = "VERIS_WEBHOOK_TIME_SCALE";
/// One attempt's bound in milliseconds (tests; default 10 s).
const TIMEOUT_VAR: &str = "VERIS_WEBHOOK_TIMEOUT_MS";

/// The webhooks of a start, before the ledger is open.
pub(super) struct Webhooks {
    targets: Vec<Webhook>,
    secrets: Vec<(String, Vec<Secret>)>,
    sink: EventSink,
    events: mpsc::Receiver<Event>,
    backoff_scale: f64,
    attempt_timeout: Duration,
}

impl Webhooks {
    /// Parses `--webhook` values (none: `None`); `builtin` says whether
    /// the built-in twin runs (only it makes events).
    pub(super) fn from_args(values: &[String], builtin: bool) -> Result<Option<Webhooks>> {
        if values.is_empty() {
            return Ok(None);
        }
        if !builtin {
            bail!("--webhook needs the built-in twin, which makes the events; a twin named by --twin or --config delivers its own. Next: drop --twin/--config, or drop --webhook");
        }
        let targets = values
            .iter()
            .map(|v| parse(v))
            .collect::<Result<Vec<_>>>()?;
        let mut secrets: Vec<(String, Vec<Secret>)> = Vec::new();
        for w in &targets {
            if !secrets.iter().any(|(s, _)| *s == w.service) {
                let secret = Secret::generate()
                    .map_err(|_| anyhow::anyhow!("the system's random source failed"))
                    .context("making a webhook signing secret")?;
                secrets.push((w.service.clone(), vec![secret]));
            }
        }
        let (backoff_scale, attempt_timeout) = time_knobs()?;
        let (sink, events) = mpsc::channel(EVENT_QUEUE);
        Ok(Some(Webhooks {
            targets,
            secrets,
            sink,
            events,
            backoff_scale,
            attempt_timeout,
        }))
    }

    /// Where the twin hands its events.
    pub(super) fn sink(&self) -> EventSink {
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
    pub(super) fn described(&self) -> Vec<String> {
        self.targets
            .iter()
            .map(|w| {
                format!(
                    "webhook {} -> {} (secret in {})",
                    w.service,
                    w.url(),
                    env_name(&w.service)
                )
            })
            .collect()
    }

    /// Starts delivering through `dialer`, recording into `ledger`.
    pub(super) fn start(
        self,
        ledger: std::sync::Arc<veris_receipt::ledger::Ledger>,
        dialer: Dialer,
    ) -> Engine {
        Engine::start(
            self.events,
            EngineOptions {
                webhooks: self.targets,
                secrets: self.secrets,
                ledger,
                backoff_scale: self.backoff_scale,
                attempt_timeout: self.attempt_timeout,
                dialer,
            },
        )
    }
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
fn env_name(service: &str) -> String {
    format!(
        "{}_WEBHOOK_SECRET",
        service.to_ascii_uppercase().replace('-', "_")
    )
}
