//! `veris baseline`: a token marking now, for `veris receipt --since TOKEN`.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::runtime::baseline::take;

#[derive(Args, Debug)]
pub struct BaselineArgs {
    /// State dir of the proxy [default: $VERIS_STATE_DIR, else ~/.veris]: its live
    /// `veris serve`, else its `ledger.jsonl`, else its newest run's ledger.
    #[arg(long, value_name = "DIR", conflicts_with = "ledger")]
    pub state_dir: Option<PathBuf>,
    /// Mark the end of this run's ledger (`veris runs` lists them).
    #[arg(long, value_name = "ID", conflicts_with = "ledger")]
    pub run: Option<String>,
    /// Ledger file to read when no proxy is live.
    #[arg(long, value_name = "FILE")]
    pub ledger: Option<PathBuf>,
}

/// `veris baseline`: prints the token on stdout.
pub async fn baseline(args: BaselineArgs) -> Result<u8> {
    let state_dir = crate::util::state_dir(args.state_dir.clone());
    let baseline = take(&state_dir, args.ledger.as_deref(), args.run.as_deref()).await?;
    crate::outln!("{}", baseline.token());
    Ok(0)
}
