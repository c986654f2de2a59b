//! `veris trigger SERVICE EVENT`: asks a live `serve` to deliver one event
//! now (like `stripe trigger`), for a fresh fixture object its built-in
//! twin renders, to the service's `--webhook` URLs. The deliveries are
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
    /// State dir of the live `veris serve` [default: $VERIS_STATE_DIR, else ~/.veris].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

/// `veris trigger`.
pub async fn trigger(args: TriggerArgs) -> Result<u8> {
    for (what, value) in [("SERVICE", &args.service), ("EVENT", &args.event)] {
        if !plain(value) {
            anyhow::bail!("veris trigger: {what} {value:?} is not a name (letters, digits, `.`, `_`, `-`). Next: e.g. `veris trigger stripe customer.created`");
        }
    }
    let state_dir = crate::util::state_dir(args.state_dir);
    let proxy = live::require_live(&state_dir, "trigger").await?;
    let query = format!("service={}&event={}", args.service, args.event);
    let queued = proxy.webhook("trigger", &query).await?;
    report(&queued);
    Ok(0)
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
