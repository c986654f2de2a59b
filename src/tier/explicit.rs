//! The explicit tier: the command runs with the proxy variables
//! (`HTTPS_PROXY` and the trust variables) and nothing else makes its
//! traffic reach the proxy; clients that ignore them are not seen.

use std::process::Stdio;

use anyhow::Result;
use futures_util::future::BoxFuture;

use super::{Bound, Ran, Tier, Workload};

/// The explicit tier: binds nothing, covers nothing by itself.
pub struct Explicit;

impl Tier for Explicit {
    fn bind(&mut self) -> BoxFuture<'_, Result<Bound>> {
        Box::pin(async { Ok(Bound::default()) })
    }

    fn run<'a>(&'a mut self, w: Workload<'a>) -> BoxFuture<'a, Result<Ran>> {
        Box::pin(async move {
            let code = run(w.command, vars(&w), w.file_limit).await?;
            Ok(Ran { code, canary: None })
        })
    }
}

/// The proxy variables for a child that is told where the proxy is.
pub fn vars(w: &Workload<'_>) -> Vec<(String, String)> {
    veris_ca::env::vars(&veris_ca::env::EnvSpec {
        no_proxy: w.no_proxy,
        trust_only: false,
        ..w.env
    })
}

/// Runs the command with the proxy variables, forwarding signals.
pub async fn run(
    command: &[String],
    vars: Vec<(String, String)>,
    file_limit: crate::os::fd::FileLimit,
) -> Result<u8> {
    let mut cmd = tokio::process::Command::new(&command[0]);
    crate::os::fd::restore_file_limit_at_exec(&mut cmd, file_limit);
    cmd.args(&command[1..])
        .envs(vars)
        // Node 22.21+/24.5+ honour HTTPS_PROXY only with this; older versions ignore it.
        .env("NODE_USE_ENV_PROXY", "1")
        // The child is the workload: it gets no way into the admin API.
        .env_remove("VERIS_ADMIN_TOKEN")
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .process_group(0);
    let mut child = cmd.spawn().map_err(|e| {
        anyhow::anyhow!(
            "cannot start {:?}: {e}. Next: check the command name and PATH",
            command[0]
        )
    })?;
    let pgid = child.id();
    let status = {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut chld = signal(SignalKind::child())?;
        loop {
            tokio::select! {
                status = child.wait() => break status?,
                _ = term.recv() => super::forward(pgid, rustix::process::Signal::TERM),
                _ = int.recv() => super::forward(pgid, rustix::process::Signal::INT),
                // Orphans of the command that ended while it runs are
                // ours to reap (we are their subreaper); the command
                // itself is tokio's.
                _ = chld.recv() => crate::os::procs::reap_orphans(pgid),
            }
        }
    };
    Ok(match status.code() {
        Some(c) => u8::try_from(c).unwrap_or(1),
        // Killed by a signal: the shell convention, 128 + signal.
        None => {
            use std::os::unix::process::ExitStatusExt;
            128u8.saturating_add(u8::try_from(status.signal().unwrap_or(0)).unwrap_or(0))
        }
    })
}
