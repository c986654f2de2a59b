//! `veris run`: the proxy in-process, a child behind it, and this run's receipt.
//!
//! Each run writes a ledger of its own (`<state>/runs/<run_id>/ledger.jsonl`)
//! sealed by a key that exists only in this process, which is non-dumpable:
//! the child, running as the same uid, can read and rewrite every file it
//! likes but can neither sign a seal nor reach the admin API (there is none).
//! The receipt is anchored on the proxy's own final seal, so a rewritten or
//! replaced file fails it.

use std::path::PathBuf;
use std::process::Stdio;

use anyhow::{bail, Context, Result};
use clap::Args;
use tracing::warn;
use veris_receipt::ledger::{self, LedgerRead};
use veris_receipt::receipt::{Anchor, Options, WindowSpec};

use crate::receipt_cmd::{report, RequireArgs};
use crate::stack::{no_proxy, Finished, Role, ServeArgs, Stack};

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    #[command(flatten)]
    pub require: RequireArgs,
    /// Also write the JSON receipt here (mode 0600).
    #[arg(long, value_name = "FILE")]
    pub receipt: Option<PathBuf>,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

pub async fn run(args: RunArgs) -> Result<u8> {
    let reqs = args.require.parse()?;
    let stack = Stack::start(&args.serve, "127.0.0.1:0", Role::Run).await?;

    let java_base = std::env::var("JAVA_TOOL_OPTIONS").ok();
    let no_proxy = no_proxy();
    let vars = veris_ca::env::vars(&stack.env_spec(&no_proxy, false, java_base.as_deref()));
    let mut cmd = tokio::process::Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .envs(vars)
        // Node 22.21+/24.5+ honour HTTPS_PROXY only with this; older versions ignore it.
        .env("NODE_USE_ENV_PROXY", "1")
        // The child is the workload: it gets no way into the admin API.
        .env_remove("VERIS_ADMIN_TOKEN")
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .process_group(0);
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            stack.finish().await?;
            bail!(
                "cannot start {:?}: {e}. Next: check the command name and PATH",
                args.command[0]
            );
        }
    };
    let pgid = child.id();
    let status = {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        loop {
            tokio::select! {
                status = child.wait() => break status?,
                _ = term.recv() => forward(pgid, libc::SIGTERM),
                _ = int.recv() => forward(pgid, libc::SIGINT),
            }
        }
    };
    let child_code: u8 = match status.code() {
        Some(c) => u8::try_from(c).unwrap_or(1),
        // Killed by a signal: the shell convention, 128 + signal.
        None => {
            use std::os::unix::process::ExitStatusExt;
            128u8.saturating_add(u8::try_from(status.signal().unwrap_or(0)).unwrap_or(0))
        }
    };

    let finished = stack.finish().await?;
    let (read, options) = finished_receipt(&finished)?;
    let report = report(&read, &options, &reqs, args.require.allow_empty);
    eprint!("{}", report.text);
    eprintln!(
        "\nledger: {} (verify it later: veris receipt --ledger {} --key {})",
        finished.ledger_path.display(),
        finished.ledger_path.display(),
        finished.key_id
    );
    if let Some(path) = &args.receipt {
        write_private(path, &serde_json::to_vec_pretty(&report.receipt)?)
            .with_context(|| format!("writing receipt {}", path.display()))?;
    }
    Ok(if report.exit_code != 0 {
        report.exit_code
    } else {
        child_code
    })
}

/// The receipt of a finished session, anchored on the proxy's own final
/// seal and key (held in this process, never on disk): the file must hold
/// exactly the chain the proxy wrote up to that seal.
pub fn finished_receipt(f: &Finished) -> Result<(LedgerRead, Options)> {
    let read = ledger::read(&f.ledger_path)
        .with_context(|| format!("reading ledger {}", f.ledger_path.display()))?;
    let options = Options {
        scope: WindowSpec::LatestSession,
        proxy_live: true,
        until: f.seal.as_ref().map(|s| s.seq),
        anchor: match &f.seal {
            Some(seal) => Anchor::Live {
                seal: seal.clone(),
                public_key: f.public_key.clone(),
            },
            None => Anchor::None,
        },
        external_checks: f.checks.clone(),
        ..Options::default()
    };
    Ok((read, options))
}

fn forward(pgid: Option<u32>, signal: i32) {
    if let Some(pgid) = pgid {
        if let Err(e) = crate::sys::kill_group(pgid, signal) {
            warn!(error = %e, "cannot forward the signal to the child");
        }
    }
}

fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.write_all(b"\n")?;
    f.sync_all()
}
