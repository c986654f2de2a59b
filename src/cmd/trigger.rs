//! `veris trigger SERVICE EVENT`: asks a live `serve` (or, with `--sandbox
//! ID`, a gateway for one of its sandboxes) to deliver one event now (like
//! `stripe trigger`), for a fresh fixture object its built-in twin renders,
//! to the service's `--webhook` URLs. The deliveries are
//! recorded with `origin: trigger` and never count toward
//! `--require-callback`: no request of the workload made the object.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::runtime::live;

/// Deliver one webhook event now, for a fixture object (like `stripe trigger`).
#[derive(Args, Debug)]
pub struct TriggerArgs {
    /// The service whose event it is (one named by the proxy's --webhook), e.g. stripe.
    pub service: String,
    /// The event type: customer.created, charge.succeeded, charge.failed,
    /// charge.pending, payment_intent.created, payment_intent.succeeded.
    pub event: String,
    /// State dir of the live `veris serve` (with --sandbox: of the live `veris
    /// gateway`) [default: $VERIS_STATE_DIR, else ~/.veris].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// A gateway sandbox's id: the gateway of --state-dir delivers to that
    /// sandbox's --webhook URLs, recorded in its ledger (the gateway's
    /// admin token is needed; a sandbox's read token only reads).
    #[arg(long, value_name = "ID")]
    pub sandbox: Option<String>,
}

/// `veris trigger`.
pub async fn trigger(args: TriggerArgs) -> Result<u8> {
    for (what, value) in [("SERVICE", &args.service), ("EVENT", &args.event)] {
        if !plain(value) {
            anyhow::bail!("veris trigger: {what} {value:?} is not a name (letters, digits, `.`, `_`, `-`). Next: e.g. `veris trigger stripe customer.created`");
        }
    }
    let state_dir = crate::util::state_dir(args.state_dir);
    let proxy = asked(&state_dir, args.sandbox.as_deref(), "trigger").await?;
    let query = format!("service={}&event={}", args.service, args.event);
    let queued = proxy.webhook("trigger", &query).await?;
    report(&queued);
    Ok(0)
}

/// The admin API that delivers: the live `serve` of `state_dir`, or with
/// `sandbox` that sandbox's part of the gateway of `state_dir`.
pub(crate) async fn asked(
    state_dir: &std::path::Path,
    sandbox: Option<&str>,
    command: &str,
) -> Result<live::client::LiveProxy> {
    match sandbox {
        None => live::require_live(state_dir, command).await,
        Some(id) if !plain(id) => anyhow::bail!(
            "veris {command}: --sandbox {id:?} is not a sandbox id. Next: give the id `veris gateway add-sandbox` was given"
        ),
        Some(id) => live::require_gateway_sandbox(state_dir, id, command).await,
    }
}

/// Names the admin API takes as they are (it decodes nothing).
pub(crate) fn plain(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// What was queued, and that it does not count.
pub(crate) fn report(q: &live::client::Queued) {
    crate::outln!(
        "{} {} {} queued ({}): delivering to {}",
        q.service,
        q.event,
        q.event_id,
        q.origin,
        q.urls.join(", ")
    );
    crate::outln!(
        "each attempt is a callback line with origin {:?}; it does not count toward --require-callback",
        q.origin
    );
}
