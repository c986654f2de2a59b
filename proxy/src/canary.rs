//! The canary: the reserved host and path the proxy answers itself, and the
//! probe that asks for it the way intercepted traffic travels. The proxy's
//! router (`route`) and the binary (`veris check`, the receipt's canary
//! check, the isolated run's init step) share these.
//!
//! - explicit tier (a proxy URL is known): an absolute-form plain-HTTP
//!   request for `http://canary.veris.internal/__veris/canary` sent to the
//!   proxy, exactly what a client honouring `HTTP_PROXY` sends;
//! - transparent tier: a TLS connection to a TEST-NET address on port 443
//!   with SNI `canary.veris.internal` and no proxy settings. Nothing routes
//!   TEST-NET, so only a live kernel redirect to the proxy can answer it.
//!
//! The answer is authenticated by the canary token, not by the certificate
//! (the certificate is minted by the very proxy being probed), so the TLS
//! probe accepts any certificate.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::net::TcpStream;
use veris_receipt::{ListenerTier, Mode};

/// The reserved host the proxy answers itself (canary probe).
pub const CANARY_HOST: &str = "canary.veris.internal";
/// The path the proxy answers itself on any host it can see requests for.
pub const CANARY_PATH: &str = "/__veris/canary";
/// TEST-NET-3 (RFC 5737): never routed, so only a redirect answers.
pub const DEFAULT_PROBE_ADDR: &str = "203.0.113.1:443";

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

/// `host:port` of a proxy URL (any scheme, or none; port 80 unless given).
fn proxy_addr(url: &str) -> Result<String, ProbeError> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    veris_admin_client::HttpUrl::parse(&format!("http://{rest}"))
        .map(|u| u.authority)
        .map_err(|e| ProbeError::Unreachable(format!("bad proxy URL {url:?} ({})", e.what())))
}

async fn probe_explicit(url: &str) -> Result<CanaryAnswer, ProbeError> {
    let addr = proxy_addr(url)?;
    let tcp = TcpStream::connect(&addr)
        .await
        .map_err(|e| ProbeError::Unreachable(format!("{addr}: {e}")))?;
    let uri = format!("http://{CANARY_HOST}{CANARY_PATH}");
    ask(tcp, &addr, &uri).await
}

async fn probe_transparent(addr: SocketAddr) -> Result<CanaryAnswer, ProbeError> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| ProbeError::Unreachable(format!("{addr}: {e}")))?;
    let mut config = rustls::ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(crate::outbound::upstream::AcceptAnyCert::new())
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = rustls::pki_types::ServerName::try_from(CANARY_HOST)
        .map_err(|e| ProbeError::Unreachable(e.to_string()))?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| ProbeError::Unreachable(format!("TLS to {addr}: {e}")))?;
    ask(tls, &addr.to_string(), CANARY_PATH).await
}

/// The most bytes a canary answer may have (it is a small JSON object).
const MAX_ANSWER: usize = 64 << 10;

/// One HTTP/1.1 GET of the canary over `io` (to `addr`).
async fn ask<IO>(io: IO, addr: &str, target: &str) -> Result<CanaryAnswer, ProbeError>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let req = veris_admin_client::Request::get(target, CANARY_HOST).header(
        "user-agent",
        concat!("veris-check/", env!("CARGO_PKG_VERSION")),
    );
    let answer = veris_admin_client::exchange(io, addr, &req, MAX_ANSWER)
        .await
        .map_err(|e| ProbeError::Unreachable(e.what()))?;
    let status = answer.status;
    if !(200..300).contains(&status) {
        return Err(ProbeError::NotVeris(format!("HTTP {status}")));
    }
    match serde_json::from_slice::<CanaryAnswer>(&answer.body) {
        Ok(a) if a.veris_proxy => Ok(a),
        _ => Err(ProbeError::NotVeris(format!(
            "HTTP {status} without a canary body"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
