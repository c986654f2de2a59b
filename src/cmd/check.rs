//! `veris check`: is this run's proxy on the path? It asks for the canary the
//! way intercepted traffic travels ([`veris_proxy::canary::probe`]), and
//! compares the answer with the token the run published (`VERIS_CANARY`).
//! Without a proxy URL, or with `--transparent`, it probes the kernel
//! redirect.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use veris_proxy::canary::{probe, CanaryAnswer, ProbeError, ProbePath, DEFAULT_PROBE_ADDR};

/// Exit code when the check fails (no proxy, not veris, another run's).
pub const EXIT_CHECK_FAILED: u8 = 2;

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// Proxy URL to probe (explicit tier) [default: $VERIS_PROXY_URL; without one, the transparent probe].
    #[arg(long, value_name = "URL", env = "VERIS_PROXY_URL")]
    pub proxy: Option<String>,
    /// The canary this run published [default: $VERIS_CANARY].
    #[arg(
        long,
        value_name = "TOKEN",
        env = "VERIS_CANARY",
        hide_env_values = true
    )]
    pub expect_canary: Option<String>,
    /// Accept any veris proxy, whatever run it belongs to: no canary is
    /// compared, not even one from $VERIS_CANARY or --expect-canary.
    #[arg(long)]
    pub any_run: bool,
    /// Probe the kernel redirect (TLS to a TEST-NET address) even when a proxy URL is known.
    #[arg(long)]
    pub transparent: bool,
    /// Address the transparent probe dials.
    #[arg(long, value_name = "IP:PORT", default_value = DEFAULT_PROBE_ADDR)]
    pub probe_addr: SocketAddr,
    /// How long the probe may take: `5s`, `500ms`.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// `5s`, `500ms`, `2m` or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("bad duration {s:?}; expected e.g. 5s or 500ms"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n.saturating_mul(60))),
        _ => Err(format!("bad duration {s:?}; expected e.g. 5s or 500ms")),
    }
}

/// `veris check`.
pub async fn check(args: CheckArgs) -> Result<u8> {
    // --any-run wins over a canary from the environment: sourcing a run's
    // env file sets VERIS_CANARY, and `--any-run` must still mean any run.
    let expected = match (&args.expect_canary, args.any_run) {
        (_, true) => None,
        (Some(t), false) if !t.is_empty() => Some(t.clone()),
        _ => {
            // Outside a run there is no run's proxy to find: the check
            // fails (exit 2), as it does when the proxy is not there.
            eprintln!("veris check: FAIL: no run to check: VERIS_CANARY is not set (this shell is not inside `veris run` and has no run's env file sourced). Next: run it inside `veris run -- …`, source the env file of `veris serve --write-env`, pass --expect-canary TOKEN, or --any-run to accept any veris proxy");
            return Ok(EXIT_CHECK_FAILED);
        }
    };
    let path = match (&args.proxy, args.transparent) {
        (Some(url), false) if !url.is_empty() => ProbePath::Explicit(url.clone()),
        _ => ProbePath::Transparent(args.probe_addr),
    };
    let outcome = judge(&path, expected.as_deref(), probe(&path, args.timeout).await);
    if outcome.exit_code == 0 {
        crate::outln!("{}", outcome.message);
    } else {
        eprintln!("{}", outcome.message);
    }
    Ok(outcome.exit_code)
}

/// What a check concluded: its exit code (0 or [`EXIT_CHECK_FAILED`]), the
/// one line `veris check` prints, and the canary's answer when one came.
#[derive(Debug)]
pub struct Outcome {
    pub exit_code: u8,
    pub message: String,
    /// Read by the MCP server only.
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub answer: Option<CanaryAnswer>,
}

/// The verdict on a probe along `path`: a veris canary answered, and it is
/// `expected` when one is given. `veris check` and the MCP tool share it.
pub fn judge(
    path: &ProbePath,
    expected: Option<&str>,
    answer: Result<CanaryAnswer, ProbeError>,
) -> Outcome {
    match answer {
        Ok(a) => match expected {
            Some(token) if token != a.canary => Outcome {
                exit_code: EXIT_CHECK_FAILED,
                message: format!(
                    "veris check: FAIL: a veris proxy answered {} but it belongs to another run (run {}, sandbox {}). Next: use the env file of the run you started, or restart the proxy",
                    path.describe(),
                    a.run_id,
                    a.sandbox_id
                ),
                answer: Some(a),
            },
            _ => {
                let word = |v: serde_json::Value| v.as_str().unwrap_or("?").to_string();
                Outcome {
                    exit_code: 0,
                    message: format!(
                        "veris check: ok: run {} (sandbox {}, {} listener, {} mode) answered {}",
                        a.run_id,
                        a.sandbox_id,
                        word(serde_json::json!(a.tier)),
                        word(serde_json::json!(a.mode)),
                        path.describe()
                    ),
                    answer: Some(a),
                }
            }
        },
        Err(e) => {
            let next = match (&e, path) {
                (ProbeError::Unreachable(_), ProbePath::Explicit(_)) => "start the proxy (`veris serve`) or fix VERIS_PROXY_URL",
                (ProbeError::Unreachable(_), ProbePath::Transparent(_)) => "the kernel redirect is not in place: check the nft rules (`veris serve --transparent`) and that this uid is not exempt",
                (ProbeError::NotVeris(_), _) => "the address is not a veris proxy: fix VERIS_PROXY_URL or the redirect target",
            };
            Outcome {
                exit_code: EXIT_CHECK_FAILED,
                message: format!("veris check: FAIL: {} {e}. Next: {next}", path.describe()),
                answer: None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("5h").is_err());
        assert!(parse_duration("s").is_err());
    }
}
