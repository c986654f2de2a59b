//! Finding a live proxy through its state dir: `admin.addr` names it and
//! `/status` answers to the token from `admin.token` or `$VERIS_ADMIN_TOKEN`.

use std::path::Path;

use super::client::{LiveProxy, LIMITS};

/// Where the admin API's address is announced.
pub const ADDR_FILE: &str = "admin.addr";
/// Where the admin API's bearer token is kept (0600).
pub const TOKEN_FILE: &str = "admin.token";

/// What [`discover`] found.
#[derive(Debug)]
pub enum Discovery {
    /// A proxy answers `/status` to the token.
    Live(LiveProxy),
    /// No proxy announced, or the announced one is gone (read the file).
    NotLive,
    /// A proxy is announced and answers, but this process cannot use it.
    Unusable(String),
}

/// Finds a live proxy for `state_dir`: `admin.addr` names it and `/status`
/// answers to the token from `admin.token` (0600, so readable by the proxy
/// uid and root), else to `$VERIS_ADMIN_TOKEN`.
pub async fn discover(state_dir: &Path) -> Discovery {
    // Bounded, regular files only: the workload may have planted a FIFO or
    // a link to /dev/zero here, and a reader (an MCP tool call) must not hang.
    let read = |name: &str| crate::util::read_bounded(&state_dir.join(name), 4096, false);
    let Ok(addr) = read(ADDR_FILE) else {
        return Discovery::NotLive;
    };
    let base = format!("http://{}", addr.trim());
    let token = match read(TOKEN_FILE) {
        Ok(t) => t.trim().to_string(),
        Err(e) => match std::env::var("VERIS_ADMIN_TOKEN") {
            Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
            _ => {
                // Only worth saying if something answers at the address.
                let healthz = format!("{base}/healthz");
                return match veris_admin_client::call("GET", &healthz, None, LIMITS).await {
                    Ok(answer) if answer.status == 200 => Discovery::Unusable(format!(
                        "proxy live but {TOKEN_FILE} is unreadable ({}): run as the proxy uid or root, or set VERIS_ADMIN_TOKEN",
                        e.kind()
                    )),
                    _ => Discovery::NotLive,
                };
            }
        },
    };
    let live = LiveProxy { base, token };
    // Ask with the token, not just /healthz: after a crash the announced
    // port may belong to something else, or to a proxy with a new token.
    match live.status().await {
        Ok(_) => Discovery::Live(live),
        Err(e) => {
            tracing::debug!(error = %e, "no usable proxy behind admin.addr");
            Discovery::NotLive
        }
    }
}

/// The live proxy of `state_dir` for a command that needs one (`veris
/// trigger`, `veris replay`); the error says why there is none and what to
/// start.
pub async fn require_live(state_dir: &Path, command: &str) -> anyhow::Result<LiveProxy> {
    match discover(state_dir).await {
        Discovery::Live(live) => Ok(live),
        Discovery::Unusable(why) => anyhow::bail!("veris {command}: {why}"),
        Discovery::NotLive => anyhow::bail!(
            "veris {command}: no live veris proxy for state dir {} (no {ADDR_FILE} there, or nothing answers at it). Next: start `veris serve --state-dir {} --webhook stripe=http://HOST:PORT/PATH` (a `veris run` has no admin API to ask), or pass the serving proxy's --state-dir",
            state_dir.display(),
            state_dir.display()
        ),
    }
}

/// A gateway sandbox's part of the admin API for a command that delivers
/// into its ledger (`veris trigger|replay --sandbox ID`): the gateway of
/// `state_dir` (its `admin.addr`), asked with the gateway's own token
/// (`admin.token` there, else `$VERIS_ADMIN_TOKEN`); a sandbox's read token
/// only reads. The error says why there is none and what to do.
pub async fn require_gateway_sandbox(
    state_dir: &Path,
    sandbox: &str,
    command: &str,
) -> anyhow::Result<LiveProxy> {
    let read = |name: &str| crate::util::read_bounded(&state_dir.join(name), 4096, false);
    let next = format!(
        "Next: pass the gateway's own --state-dir (not a sandbox's), where `veris gateway --state-dir {}` runs",
        state_dir.display()
    );
    let addr = read(ADDR_FILE).map_err(|e| {
        anyhow::anyhow!(
            "veris {command}: no gateway announced in {} ({ADDR_FILE}: {}). {next}",
            state_dir.display(),
            e.kind()
        )
    })?;
    let token = match read(TOKEN_FILE) {
        Ok(t) => t.trim().to_string(),
        Err(e) => match std::env::var("VERIS_ADMIN_TOKEN") {
            Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
            _ => anyhow::bail!(
                "veris {command}: the gateway's {TOKEN_FILE} is unreadable ({}). Next: run as the gateway's uid or root, or set VERIS_ADMIN_TOKEN to the gateway's admin token",
                e.kind()
            ),
        },
    };
    let base = format!("http://{}", addr.trim());
    let healthz = format!("{base}/healthz");
    match veris_admin_client::call("GET", &healthz, None, LIMITS).await {
        Ok(answer) if answer.status == 200 => {}
        _ => anyhow::bail!(
            "veris {command}: no live gateway answers at {} (from {}). {next}",
            addr.trim(),
            state_dir.join(ADDR_FILE).display()
        ),
    }
    Ok(LiveProxy {
        base: format!("{base}/sandboxes/{sandbox}"),
        token,
    })
}
