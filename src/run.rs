//! `veris run`: the proxy in-process, a child behind it, and this run's receipt.

use std::path::PathBuf;
use std::process::Stdio;

use anyhow::{bail, Context, Result};
use clap::Args;
use tracing::warn;
use veris_receipt::ledger::{self, LedgerRead};
use veris_receipt::receipt::Options;

use crate::receipt_cmd::{live_checks, report, seal_keys_beside, LiveRun, RequireArgs};
use crate::stack::{no_proxy, ServeArgs, Stack};

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
    let stack = Stack::start(&args.serve, "127.0.0.1:0").await?;

    let java_base = std::env::var("JAVA_TOOL_OPTIONS").ok();
    let no_proxy = no_proxy();
    let vars = veris_ca::env::vars(&stack.env_spec(&no_proxy, false, java_base.as_deref()));
    let mut cmd = tokio::process::Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .envs(vars)
        // Node 22.21+/24.5+ honour HTTPS_PROXY only with this; older versions ignore it.
        .env("NODE_USE_ENV_PROXY", "1")
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .process_group(0);
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            stack.stop().await?;
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

    let (read, options) = live_receipt(stack).await?;
    let report = report(&read, &options, &reqs, args.require.allow_empty);
    eprint!("{}", report.text);
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

/// Stops the stack and reads this run's ledger window with every integrity
/// check: the canary through the interception path and the twin cross-check
/// while the proxy is still live, then the proxy's own shutdown seal as the
/// fresh seal over everything it wrote.
pub async fn live_receipt(stack: Stack) -> Result<(LedgerRead, Options)> {
    let since = stack.session_seq.saturating_sub(1);
    let ledger_path = stack.ledger.path().to_path_buf();
    let run = LiveRun {
        tier: stack.identity.tier,
        proxy_url: &stack.proxy_url,
        canary: &stack.identity.canary,
        run_id: &stack.identity.run_id,
        env_canary: false,
    };
    let head = stack.ledger.head().0;
    let read = ledger::read(&ledger_path)
        .with_context(|| format!("reading ledger {}", ledger_path.display()))?;
    let external_checks = live_checks(&read, &run, since, head, None).await;
    let seal = stack.stop_sealed().await?;
    let read = ledger::read(&ledger_path)
        .with_context(|| format!("reading ledger {}", ledger_path.display()))?;
    let options = Options {
        since: Some(since),
        proxy_live: true,
        until: seal.as_ref().map(|s| s.seq),
        seal_keys: seal_keys_beside(&ledger_path),
        fresh_seal: seal.as_ref().map(|s| s.seq),
        external_checks,
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
