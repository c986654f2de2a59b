//! `veris check`: is this run's proxy on the path? It asks for the canary the
//! way intercepted traffic travels ([`veris_proxy::canary::probe`]), and
//! compares the answer with the token the run published (`VERIS_CANARY`).
//! Without a proxy URL, or with `--transparent`, it probes the kernel
//! redirect.
//!
//! `--gateway` runs inside a gateway sandbox (DESIGN §13) and probes the way
//! the sandbox's traffic leaves ([`gateway_path`]): its proxy setting when
//! it has one, else straight out, which only the platform's redirect to the
//! gateway answers. The answer must come from a gateway, for the sandbox
//! and with the canary expected. The gateway records the probe in that
//! sandbox's ledger, which is what its receipt's canary check reads: this
//! command's own verdict, printed inside the sandbox, counts for nothing
//! there.

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
    /// Probe as a gateway sandbox's traffic leaves: through its proxy
    /// setting (--proxy, else $HTTPS_PROXY or $ALL_PROXY: `socks5h://`,
    /// `socks5://` or `http://` with the sandbox's USER:PASS) when it has
    /// one, else straight out (TLS to --probe-addr with the canary's SNI,
    /// which only the platform's redirect to the gateway answers). The
    /// answer must come from a veris gateway.
    #[arg(long)]
    pub gateway: bool,
    /// With --gateway: the sandbox id the gateway must answer for.
    #[arg(long, value_name = "ID", requires = "gateway")]
    pub sandbox: Option<String>,
    /// How long the probe may take: `5s`, `500ms`.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = crate::util::parse_duration)]
    pub timeout: Duration,
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
            if args.gateway {
                eprintln!("veris check: FAIL: no canary to compare: VERIS_CANARY is not set. Next: pass --expect-canary TOKEN (the `canary` of `veris gateway add-sandbox --json`), or --any-run to accept any veris gateway");
            } else {
                eprintln!("veris check: FAIL: no run to check: VERIS_CANARY is not set (this shell is not inside `veris run` and has no run's env file sourced). Next: run it inside `veris run -- …`, source the env file of `veris serve --write-env`, pass --expect-canary TOKEN, or --any-run to accept any veris proxy");
            }
            return Ok(EXIT_CHECK_FAILED);
        }
    };
    if args.gateway {
        let outcome = match gateway_path(&args) {
            Ok(path) => {
                let answer = probe(&path, args.timeout).await;
                judge_gateway(&path, expected.as_deref(), args.sandbox.as_deref(), answer)
            }
            Err(message) => Outcome {
                exit_code: EXIT_CHECK_FAILED,
                message,
                answer: None,
            },
        };
        return Ok(print(outcome));
    }
    let path = match (&args.proxy, args.transparent) {
        (Some(url), false) if !url.is_empty() => ProbePath::Explicit(url.clone()),
        _ => ProbePath::Transparent(args.probe_addr),
    };
    let outcome = judge(&path, expected.as_deref(), probe(&path, args.timeout).await);
    Ok(print(outcome))
}

/// Prints the outcome's line (stdout when it passed, else stderr); its exit code.
fn print(outcome: Outcome) -> u8 {
    if outcome.exit_code == 0 {
        crate::outln!("{}", outcome.message);
    } else {
        eprintln!("{}", outcome.message);
    }
    outcome.exit_code
}

/// The variables a gateway sandbox's proxy setting may sit in, in the
/// order a client honouring them picks one for HTTPS.
const PROXY_VARS: [&str; 4] = ["HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"];

/// How a gateway sandbox's traffic leaves: `--transparent` forces straight
/// out; else the proxy URL (--proxy, then [`PROXY_VARS`]) by its scheme;
/// else straight out. The canary host is never resolved: straight out and
/// `socks5://` dial the probe address, and the gateway routes by SNI.
fn gateway_path(args: &CheckArgs) -> Result<ProbePath, String> {
    let direct = ProbePath::Transparent(args.probe_addr);
    if args.transparent {
        return Ok(direct);
    }
    let url = args.proxy.clone().filter(|u| !u.is_empty()).or_else(|| {
        PROXY_VARS
            .iter()
            .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
    });
    let Some(url) = url else {
        return Ok(direct);
    };
    let scheme = url
        .split_once("://")
        .map_or("http", |(s, _)| s)
        .to_ascii_lowercase();
    match scheme.as_str() {
        "socks5" | "socks5h" => Ok(ProbePath::Socks5 {
            url,
            probe_addr: args.probe_addr,
        }),
        "http" => Ok(ProbePath::Explicit(url)),
        _ => Err(format!(
            "veris check: FAIL: the proxy setting {} has a scheme the probe does not speak ({scheme}://). Next: use socks5h://, socks5:// or http://, or --transparent to probe straight out",
            veris_proxy::canary::redacted(&url)
        )),
    }
}

/// Words for a gateway probe's path: straight out is not "the kernel
/// redirect" of the transparent tier but whatever the platform does.
fn gateway_describe(path: &ProbePath) -> String {
    match path {
        ProbePath::Transparent(addr) => format!(
            "straight out (TLS to {addr} with SNI {}, which only a redirect to the gateway answers)",
            veris_proxy::canary::CANARY_HOST
        ),
        other => other.describe(),
    }
}

/// The verdict on a probe from inside a gateway sandbox: a gateway
/// answered, for `sandbox` when given, with the `expected` canary.
pub fn judge_gateway(
    path: &ProbePath,
    expected: Option<&str>,
    sandbox: Option<&str>,
    answer: Result<CanaryAnswer, ProbeError>,
) -> Outcome {
    let via = gateway_describe(path);
    let fail = |message: String, answer: Option<CanaryAnswer>| Outcome {
        exit_code: EXIT_CHECK_FAILED,
        message: format!("veris check: FAIL: {message}"),
        answer,
    };
    let a = match answer {
        Ok(a) => a,
        Err(e) => {
            let next = match (&e, path) {
                (ProbeError::Refused(_), _) => "use the proxy URL `veris gateway add-sandbox` printed for this sandbox (a removed or expired sandbox is refused)",
                (ProbeError::Unreachable(_), ProbePath::Transparent(_)) => "this sandbox's egress is not sent to a veris gateway: set the platform's egress proxy to the gateway with this sandbox's credentials (`veris gateway add-sandbox` prints them), or give the sandbox a proxy setting (ALL_PROXY=socks5h://…)",
                (ProbeError::Unreachable(_), _) => "the proxy setting does not reach a gateway: fix HTTPS_PROXY/ALL_PROXY (or --proxy), or check that the gateway runs",
                (ProbeError::NotVeris(_), _) => "what answered is not a veris gateway: this sandbox's egress goes somewhere else",
            };
            return fail(format!("{via}: {e}. Next: {next}"), None);
        }
    };
    if a.tier != veris_receipt::ListenerTier::Gateway {
        let message = format!(
            "a veris proxy answered {via}, but it is not a gateway (run {}, sandbox {}). Next: drop --gateway to check a run's proxy, or send this sandbox's egress to the gateway",
            a.run_id, a.sandbox_id
        );
        return fail(message, Some(a));
    }
    if let Some(id) = sandbox.filter(|id| *id != a.sandbox_id) {
        let message = format!(
            "the gateway answered {via} for sandbox {}, not {id}: this sandbox's egress carries another sandbox's credentials. Next: give the platform this sandbox's own proxy URL",
            a.sandbox_id
        );
        return fail(message, Some(a));
    }
    if expected.is_some_and(|t| t != a.canary) {
        let message = format!(
            "the gateway answered {via} for sandbox {} with a canary other than the one expected: the egress goes through a gateway, but as another sandbox or for another registration. Next: compare with the `canary` of `veris gateway add-sandbox --json` for this sandbox",
            a.sandbox_id
        );
        return fail(message, Some(a));
    }
    let compared = if expected.is_some() {
        "its canary matches"
    } else {
        "canary not compared (--any-run)"
    };
    Outcome {
        exit_code: 0,
        message: format!(
            "veris check: ok: the veris gateway answered {via} for sandbox {} ({compared}; run {}): this sandbox's egress goes through it",
            a.sandbox_id, a.run_id
        ),
        answer: Some(a),
    }
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
                (ProbeError::Refused(_), _) => "the proxy wants credentials this check does not have: check a gateway sandbox with --gateway and its proxy URL",
                (ProbeError::Unreachable(_), ProbePath::Socks5 { .. }) => "start the gateway or fix the proxy URL",
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

    fn answer(sandbox: &str, canary: &str, tier: veris_receipt::ListenerTier) -> CanaryAnswer {
        CanaryAnswer {
            veris_proxy: true,
            canary: canary.into(),
            run_id: "run_1".into(),
            sandbox_id: sandbox.into(),
            mode: veris_receipt::Mode::Passthrough,
            tier,
        }
    }

    #[test]
    fn a_gateway_check_passes_only_for_its_own_sandbox_and_canary() {
        use veris_receipt::ListenerTier::{Explicit, Gateway};
        let path = ProbePath::Transparent(DEFAULT_PROBE_ADDR.parse().unwrap());
        let judge = |expected, sandbox, a| judge_gateway(&path, expected, sandbox, Ok(a));
        let ok = judge(Some("c1"), Some("sbx-a"), answer("sbx-a", "c1", Gateway));
        assert_eq!(ok.exit_code, 0, "{}", ok.message);
        assert!(ok.message.contains("sandbox sbx-a"), "{}", ok.message);
        assert!(ok.message.contains("straight out"), "{}", ok.message);
        for (outcome, says) in [
            (
                judge(Some("c1"), None, answer("sbx-a", "c2", Gateway)),
                "canary other than the one expected",
            ),
            (
                judge(Some("c1"), Some("sbx-a"), answer("sbx-b", "c1", Gateway)),
                "for sandbox sbx-b, not sbx-a",
            ),
            (
                judge(Some("c1"), None, answer("sbx-a", "c1", Explicit)),
                "not a gateway",
            ),
        ] {
            assert_eq!(outcome.exit_code, EXIT_CHECK_FAILED, "{}", outcome.message);
            assert!(outcome.message.contains(says), "{}", outcome.message);
        }
        let unreachable = judge_gateway(
            &path,
            Some("c1"),
            None,
            Err(ProbeError::Unreachable("timed out".into())),
        );
        assert_eq!(unreachable.exit_code, EXIT_CHECK_FAILED);
        assert!(
            unreachable.message.contains("not sent to a veris gateway"),
            "{}",
            unreachable.message
        );
    }
}
