//! `veris replay EVENT_ID`: asks a live `serve` (or, with `--sandbox ID`, a
//! gateway sandbox's engine) to deliver again an event that engine
//! delivered in this session (it keeps the newest 1024). The deliveries are recorded with `origin: replay` and
//! never count toward `--require-callback`.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

/// Deliver again an event this session delivered (by its evt_… id).
#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// The event's id, as in its callback lines (`event_id`).
    pub event_id: String,
    /// State dir of the live `veris serve` (with --sandbox: of the live `veris
    /// gateway`) [default: $VERIS_STATE_DIR, else ~/.veris].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// A gateway sandbox's id: its engine sends again one of its own events
    /// (the gateway's admin token is needed).
    #[arg(long, value_name = "ID")]
    pub sandbox: Option<String>,
}

/// `veris replay`.
pub async fn replay(args: ReplayArgs) -> Result<u8> {
    if !super::trigger::plain(&args.event_id) {
        anyhow::bail!(
            "veris replay: {:?} is not an event id. Next: copy an event_id (evt_…) from `veris receipt --json`",
            args.event_id
        );
    }
    let state_dir = crate::util::state_dir(args.state_dir);
    let proxy = super::trigger::asked(&state_dir, args.sandbox.as_deref(), "replay").await?;
    let queued = proxy
        .webhook("replay", &format!("event_id={}", args.event_id))
        .await?;
    super::trigger::report(&queued);
    Ok(0)
}
