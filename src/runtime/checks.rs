//! The checks a receipt needs the network for: the canary along the run's
//! interception path, judged against the run's own canary and run id.

use std::time::Duration;

use veris_proxy::canary::{probe, CanaryAnswer, ProbeError, ProbePath};
use veris_receipt::receipt::{Check, CheckStatus};

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
