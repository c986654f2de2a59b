//! The checks a live session's receipt needs the network for, built in one
//! place for every reader: the canary along the run's interception path and
//! the twin cross-check of the window ([`live_checks`]). `serve`'s admin API,
//! `veris receipt` on a live state dir and the end of `veris run`/`demo` all
//! call it; what each can check differs only by who reads ([`Reader`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use veris_proxy::canary::{probe, CanaryAnswer, ProbeError, ProbePath, DEFAULT_PROBE_ADDR};
use veris_proxy::request::recorder::UnrecordedCounts;
use veris_receipt::receipt::{Check, CheckStatus};
use veris_receipt::ListenerTier;

use crate::runtime::live::{twin_cross_check_file, ServiceRef};

/// How long a canary probe may take.
const CANARY_TIMEOUT: Duration = Duration::from_secs(5);

/// Who runs the checks, which decides what the canary can be asked along.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    /// The proxy's own process (`serve`'s admin API, a session's end): its
    /// uid is exempt from the redirect, so it probes the explicit path only,
    /// and its environment is not the workload's.
    Proxy,
    /// A reader in the workload's environment (`veris receipt`): probes the
    /// tier's path (the kernel redirect in the transparent tier) and holds
    /// the proxy to `VERIS_CANARY` when that is set.
    Workload,
}

/// The live session the checks are about, and who asks.
pub struct LiveRun<'a> {
    pub tier: ListenerTier,
    pub proxy_url: &'a str,
    pub canary: &'a str,
    pub run_id: &'a str,
    pub reader: Reader,
    /// Routed services and their twin upstreams.
    pub services: &'a [ServiceRef],
    /// The twin's log position at the window's start.
    pub twin_heads: Option<&'a BTreeMap<String, u64>>,
    /// The ledger file the window is read from.
    pub ledger: &'a Path,
    /// Re-read the ledger to explain twin rows of requests in flight at the
    /// window's edge (a session that still serves).
    pub refresh: bool,
    /// What the proxy says it sent to the twin but could not record.
    pub unrecorded: Option<&'a UnrecordedCounts>,
}

/// The checks of a live session's window `since..=until`: the canary
/// (`probed`, when whoever could reach the interception path asked already,
/// else asked now) and the twin cross-check.
pub async fn live_checks(
    run: &LiveRun<'_>,
    probed: Option<Check>,
    since: u64,
    until: u64,
) -> Vec<Check> {
    let canary = match probed {
        Some(c) => c,
        None => canary(run).await,
    };
    let twin = twin_cross_check_file(
        run.ledger,
        since,
        until,
        run.services,
        run.twin_heads,
        run.refresh,
        run.unrecorded,
    )
    .await;
    vec![canary, twin]
}

/// The canary along the run's interception path, as `run.reader` can ask
/// for it.
pub async fn canary(run: &LiveRun<'_>) -> Check {
    if run.tier == ListenerTier::Gateway {
        // Only a probe from inside the sandbox shows its egress goes
        // through the gateway; the gateway records each in the ledger.
        return Check {
            name: "canary".into(),
            status: CheckStatus::Unverified,
            detail: "a gateway's canary counts only when probed from inside the sandbox (recorded in its ledger)".into(),
        };
    }
    if run.reader == Reader::Proxy && run.tier == ListenerTier::Transparent {
        // The proxy's own uid is exempt from the redirect: only a reader
        // in the sandbox can probe the transparent path.
        return Check {
            name: "canary".into(),
            status: CheckStatus::Unverified,
            detail: "the transparent canary is probed by `veris receipt` inside the sandbox".into(),
        };
    }
    let path = probe_path(run.tier, run.proxy_url);
    let mut canary = canary_check(&path, run.canary, run.run_id, CANARY_TIMEOUT).await;
    // Inside the sandbox the env file names the run the workload belongs to.
    let expected = std::env::var("VERIS_CANARY")
        .ok()
        .filter(|c| run.reader == Reader::Workload && !c.is_empty())
        .unwrap_or_else(|| run.canary.to_string());
    if expected != run.canary && canary.status == CheckStatus::Ok {
        canary.status = CheckStatus::Failed;
        canary.detail = "the live proxy's canary is not the one in VERIS_CANARY: this environment belongs to another run".into();
    }
    canary
}

/// The probe path for a run: the proxy URL in the explicit tier, the kernel
/// redirect in the transparent tier.
pub fn probe_path(tier: ListenerTier, proxy_url: &str) -> ProbePath {
    match tier {
        // A reader's probe of a gateway goes to it as to a proxy; it is
        // not a probe from inside the sandbox, and the receipt never takes
        // it for one.
        ListenerTier::Explicit | ListenerTier::Gateway => {
            ProbePath::Explicit(proxy_url.to_string())
        }
        ListenerTier::Transparent => ProbePath::Transparent(
            std::env::var("VERIS_PROBE_ADDR")
                .ok()
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| {
                    DEFAULT_PROBE_ADDR
                        .parse()
                        .unwrap_or(SocketAddr::from(([203, 0, 113, 1], 443)))
                }),
        ),
    }
}

/// The canary integrity check for a receipt: the probe along the run's
/// interception path must be answered with this run's canary and run id.
pub async fn canary_check(
    path: &ProbePath,
    expect_canary: &str,
    expect_run: &str,
    timeout: Duration,
) -> Check {
    canary_verdict(
        probe(path, timeout).await,
        &path.describe(),
        expect_canary,
        expect_run,
    )
}

/// The canary check for what a probe `path` (described) got.
pub fn canary_verdict(
    answer: Result<CanaryAnswer, ProbeError>,
    path: &str,
    expect_canary: &str,
    expect_run: &str,
) -> Check {
    let (status, detail) = match answer {
        Ok(a) if a.canary == expect_canary && a.run_id == expect_run => (
            CheckStatus::Ok,
            format!("canary answered by this run ({}) {}", a.run_id, path),
        ),
        Ok(a) => (
            CheckStatus::Failed,
            format!(
                "canary {} answered by another run ({}), not this one ({expect_run})",
                path, a.run_id
            ),
        ),
        Err(e) => (CheckStatus::Unverified, format!("canary {}: {e}", path)),
    };
    Check {
        name: "canary".into(),
        status,
        detail,
    }
}
