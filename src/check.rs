//! `veris check`: is this run's proxy on the path? It asks for the canary the
//! way intercepted traffic travels, and compares the answer with the token the
//! run published (`VERIS_CANARY`). Also the canary probes the receipt uses.
//!
//! - explicit tier (a proxy URL is known): an absolute-form plain-HTTP
//!   request for `http://canary.veris.internal/__veris/canary` sent to the
//!   proxy, exactly what a client honouring `HTTP_PROXY` sends;
//! - transparent tier (no proxy URL, or `--transparent`): a TLS connection to
//!   a TEST-NET address on port 443 with SNI `canary.veris.internal` and no
//!   proxy settings. Nothing routes TEST-NET, so only a live kernel redirect
//!   to the proxy can answer it.
//!
//! The answer is authenticated by the canary token, not by the certificate
//! (the certificate is minted by the very proxy being probed), so the TLS
//! probe accepts any certificate.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::net::TcpStream;
use veris_receipt::receipt::{Check, CheckStatus};
use veris_receipt::{ListenerTier, Mode};

/// Exit code when the check fails (no proxy, not veris, another run's).
pub const EXIT_CHECK_FAILED: u8 = 2;

/// The reserved canary host.
pub const CANARY_HOST: &str = "canary.veris.internal";
/// The canary path, answered on any host.
pub const CANARY_PATH: &str = "/__veris/canary";
/// TEST-NET-3 (RFC 5737): never routed, so only a redirect answers.
pub const DEFAULT_PROBE_ADDR: &str = "203.0.113.1:443";

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

/// What the canary endpoint answers.
#[derive(Debug, Clone, Deserialize)]
pub struct CanaryAnswer {
    pub veris_proxy: bool,
    pub canary: String,
    pub run_id: String,
    pub sandbox_id: String,
    pub mode: Mode,
    pub tier: ListenerTier,
}

/// Why a probe got no canary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeError {
    /// Nothing answered (refused, timed out, reset).
    Unreachable(String),
    /// Something answered, but not a veris canary.
    NotVeris(String),
}

impl std::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeError::Unreachable(why) => write!(f, "no proxy answered ({why})"),
            ProbeError::NotVeris(why) => write!(f, "the answer is not a veris canary ({why})"),
        }
    }
}

/// Where a probe goes.
#[derive(Debug, Clone)]
pub enum ProbePath {
    /// Through a proxy URL (`http://host:port`).
    Explicit(String),
    /// Straight to this address; the kernel must redirect it.
    Transparent(SocketAddr),
}

impl ProbePath {
    pub fn describe(&self) -> String {
        match self {
            ProbePath::Explicit(url) => format!("through the proxy {url}"),
            ProbePath::Transparent(addr) => format!("through the kernel redirect (TLS to {addr})"),
        }
    }
}

/// Asks for the canary along `path`, within `timeout`.
pub async fn probe(path: &ProbePath, timeout: Duration) -> Result<CanaryAnswer, ProbeError> {
    let work = async {
        match path {
            ProbePath::Explicit(url) => probe_explicit(url).await,
            ProbePath::Transparent(addr) => probe_transparent(*addr).await,
        }
    };
    tokio::time::timeout(timeout, work)
        .await
        .unwrap_or_else(|_| {
            Err(ProbeError::Unreachable(format!(
                "timed out after {timeout:?}"
            )))
        })
}

fn proxy_addr(url: &str) -> Result<String, ProbeError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|_| ProbeError::Unreachable(format!("bad proxy URL {url:?}")))?;
    let host = uri
        .host()
        .ok_or_else(|| ProbeError::Unreachable(format!("proxy URL {url:?} has no host")))?;
    let port = uri.port_u16().unwrap_or(80);
    Ok(if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    })
}

async fn probe_explicit(url: &str) -> Result<CanaryAnswer, ProbeError> {
    let addr = proxy_addr(url)?;
    let tcp = TcpStream::connect(&addr)
        .await
        .map_err(|e| ProbeError::Unreachable(format!("{addr}: {e}")))?;
    let uri = format!("http://{CANARY_HOST}{CANARY_PATH}");
    ask(TokioIo::new(tcp), &uri).await
}

async fn probe_transparent(addr: SocketAddr) -> Result<CanaryAnswer, ProbeError> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| ProbeError::Unreachable(format!("{addr}: {e}")))?;
    let mut config = rustls::ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(veris_proxy::outbound::upstream::AcceptAnyCert::new())
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = rustls::pki_types::ServerName::try_from(CANARY_HOST)
        .map_err(|e| ProbeError::Unreachable(e.to_string()))?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| ProbeError::Unreachable(format!("TLS to {addr}: {e}")))?;
    ask(TokioIo::new(tls), CANARY_PATH).await
}

/// One HTTP/1.1 GET of the canary over `io`.
async fn ask<IO>(io: TokioIo<IO>, uri: &str) -> Result<CanaryAnswer, ProbeError>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| ProbeError::Unreachable(e.to_string()))?;
    tokio::spawn(conn);
    let req = http::Request::get(uri)
        .header(http::header::HOST, CANARY_HOST)
        .header(
            http::header::USER_AGENT,
            concat!("veris-check/", env!("CARGO_PKG_VERSION")),
        )
        .body(Empty::<Bytes>::new())
        .map_err(|e| ProbeError::Unreachable(e.to_string()))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| ProbeError::Unreachable(e.to_string()))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| ProbeError::Unreachable(e.to_string()))?
        .to_bytes();
    if !status.is_success() {
        return Err(ProbeError::NotVeris(format!("HTTP {status}")));
    }
    match serde_json::from_slice::<CanaryAnswer>(&body) {
        Ok(a) if a.veris_proxy => Ok(a),
        _ => Err(ProbeError::NotVeris(format!(
            "HTTP {status} without a canary body"
        ))),
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

    #[test]
    fn proxy_urls_become_addresses() {
        assert_eq!(
            proxy_addr("http://127.0.0.1:8080").unwrap(),
            "127.0.0.1:8080"
        );
        assert_eq!(proxy_addr("http://[::1]:8080/").unwrap(), "[::1]:8080");
        assert!(proxy_addr("not a url").is_err());
    }
}
