//! The interception tiers: how the workload's traffic is made to reach the
//! proxy, and what that covers. One module per tier — `explicit` (proxy
//! variables), `confined` (explicit, with Landlock), `transparent` (the
//! kernel redirect of `serve --transparent`), `isolated` (namespaces of
//! the run's own) — each implementing [`Tier`]: what it binds and what
//! coverage it records ([`Tier::bind`]), how the workload starts
//! ([`Tier::run`]) and what tears it down ([`Tier::teardown`]). The stack
//! ([`crate::runtime::stack::Stack`]) calls these in its phases and knows no
//! tier by name; a command picks its tier and hands it over (`veris run`:
//! [`crate::cmd::run`]'s `confine`, `veris serve`: [`for_serve`]).

pub mod app_sockets;
pub mod bundles;
pub mod confined;
pub mod explicit;
pub mod gateway;
pub mod gateway_record;
pub mod handover;
pub mod isolated;
pub mod transparent;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Result;
use futures_util::future::BoxFuture;
use tokio::net::TcpListener;
use tracing::warn;
use veris_ca::env::EnvSpec;
use veris_ca::trust::TrustFiles;
use veris_proxy::canary::{CanaryAnswer, ProbeError};
use veris_receipt::ledger::Ledger;
use veris_receipt::Coverage;

/// One interception tier, as the stack drives it. Only [`Tier::bind`] and
/// [`Tier::run`] have no default: a tier that binds nothing returns
/// [`Bound::default`].
pub trait Tier: Send {
    /// Checks its flags against the host before anything is started.
    fn preflight(&self) -> Result<()> {
        Ok(())
    }

    /// What it binds besides the proxy's own listener, and what sends the
    /// workload's traffic there; before the session line, which records
    /// the coverage returned.
    fn bind(&mut self) -> BoxFuture<'_, Result<Bound>>;

    /// The env and ready files are written (as root, if it started so):
    /// the transparent tier hands `owned_dirs` over and drops root.
    fn announced(&mut self, _owned_dirs: &[&Path]) -> Result<()> {
        Ok(())
    }

    /// The session line is in and the proxy serves: what the tier watches
    /// goes into `ledger` from now on.
    fn serving(&mut self, _ledger: &Arc<Ledger>) {}

    /// Starts the workload and waits for it to end.
    fn run<'a>(&'a mut self, workload: Workload<'a>) -> BoxFuture<'a, Result<Ran>>;

    /// Takes out what [`Tier::bind`] put in, after the final seal.
    fn teardown(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async {})
    }
}

/// What a tier bound ([`Tier::bind`]).
#[derive(Default)]
pub struct Bound {
    /// Listeners the proxy serves for it, redirected or made inside an
    /// isolated run's namespace ([`transparent::serve`]).
    pub listeners: Option<TransparentListeners>,
    /// What it covers, for the session line (`None`: the explicit tier).
    pub coverage: Option<Coverage>,
    /// Listeners the host's rules redirect to (`serve --transparent`), as
    /// the env and ready files announce them.
    pub redirected: Option<(SocketAddr, SocketAddr)>,
    /// How webhook deliveries reach the workload's app, when not through
    /// the host's network (an isolated run's: into its namespace).
    pub app_dialer: Option<veris_proxy::callback::Dialer>,
}

/// What a workload is started with ([`Tier::run`]).
pub struct Workload<'a> {
    pub command: &'a [String],
    /// The proxy's variables for a client, with `no_proxy` empty and
    /// `trust_only` false: a tier sets those its way.
    pub env: EnvSpec<'a>,
    /// The user's `NO_PROXY` merged with veris's, never exempting a routed host.
    pub no_proxy: &'a [String],
    pub trust: &'a TrustFiles,
    pub ledger: &'a Ledger,
    pub proxy_addr: SocketAddr,
    /// The open-file limit before the start raised it.
    pub file_limit: crate::os::fd::FileLimit,
    /// When the run began (its setup time is logged).
    pub started: std::time::Instant,
}

/// How the workload ended ([`Tier::run`]).
pub struct Ran {
    /// Its exit code (128 + signal when killed).
    pub code: u8,
    /// The canary's answer from inside, where the tier probes it there
    /// (isolated), with where it was probed; otherwise the stack probes it.
    pub canary: Option<(Result<CanaryAnswer, ProbeError>, &'static str)>,
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

/// `veris serve`'s tier: the transparent one with `--transparent`, else
/// the explicit one (its clients are whoever uses the proxy variables).
pub fn for_serve(args: &transparent::TransparentArgs) -> Box<dyn Tier> {
    if args.transparent {
        Box::new(transparent::Transparent::new(args.clone()))
    } else {
        Box::new(explicit::Explicit)
    }
}

/// Passes `signal` on to the command's process group.
pub fn forward(pgid: Option<u32>, signal: rustix::process::Signal) {
    if let Some(pgid) = pgid {
        if let Err(e) = crate::os::procs::kill_group(pgid, signal) {
            warn!(error = %e, "cannot forward the signal to the child");
        }
    }
}
