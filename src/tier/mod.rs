//! The interception tiers: how the workload's traffic is made to reach the
//! proxy, and what that covers. One module per tier — `explicit` (proxy
//! variables), `confined` (explicit, with Landlock), `transparent` (the
//! kernel redirect of `serve --transparent`), `isolated` (namespaces of
//! the run's own) — each saying what it binds ([`bind`]), what coverage it
//! records, how the workload starts and what tears it down.

pub mod bundles;
pub mod confined;
pub mod explicit;
pub mod handover;
pub mod isolated;
pub mod transparent;

use anyhow::Result;
use tokio::net::TcpListener;
use tracing::warn;

/// How `veris run` confines its child (DESIGN §4); `serve` and `demo` confine nothing.
pub enum Confinement {
    /// Nothing: the explicit tier as such (or `serve`'s transparent flags).
    None,
    /// Namespaces of its own: the proxy serves the sockets made inside them.
    Isolated(isolated::Sockets),
    /// The explicit tier, with Landlock allowing the child TCP connects to
    /// the proxy's port only.
    Landlock,
}

/// The transparent tier's listeners, bound before privileges drop (or,
/// for an isolated run, made inside its namespace).
pub struct TransparentListeners {
    pub https: TcpListener,
    pub http: TcpListener,
    /// The QUIC sink, unless UDP 443 is let through.
    pub quic: Option<tokio::net::UdpSocket>,
    /// Isolated run: the DNS stub's sockets.
    pub dns: Option<(tokio::net::UdpSocket, TcpListener)>,
}

/// The tiers' registration: the listeners (and the coverage to record)
/// each tier has the proxy serve besides its explicit listener — made
/// inside an isolated run's namespace, none for Landlock, else `serve`'s
/// own (`--transparent`).
pub async fn bind(
    confinement: Confinement,
    transparent: &transparent::TransparentArgs,
) -> Result<(
    Option<TransparentListeners>,
    Option<veris_receipt::Coverage>,
)> {
    Ok(match confinement {
        Confinement::Isolated(sockets) => {
            let coverage = sockets.coverage();
            (Some(isolated::listeners(sockets)?), Some(coverage))
        }
        Confinement::Landlock => (None, Some(confined::coverage())),
        Confinement::None => (transparent::bind(transparent).await?, None),
    })
}

/// Passes `signal` on to the command's process group.
pub fn forward(pgid: Option<u32>, signal: rustix::process::Signal) {
    if let Some(pgid) = pgid {
        if let Err(e) = crate::os::procs::kill_group(pgid, signal) {
            warn!(error = %e, "cannot forward the signal to the child");
        }
    }
}
