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
//!   Inside a gateway sandbox whose platform redirects its TCP, the same
//!   probe is a proxy-unaware client's connection: the gateway gets only
//!   the address and routes it by its SNI, so no name is resolved;
//! - a gateway sandbox with a proxy setting: the explicit probe with the
//!   URL's `USER:PASS` as `Proxy-Authorization: Basic`, or SOCKS5 (RFC
//!   1928/1929) to `canary.veris.internal:443` by name (`socks5h://`) or
//!   to the probe address (`socks5://`, a client that resolves names
//!   itself), then TLS as above.
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
    /// A proxy answered and refused the probe's credentials (or wanted some).
    Refused(String),
}

impl std::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeError::Unreachable(why) => write!(f, "no proxy answered ({why})"),
            ProbeError::NotVeris(why) => write!(f, "the answer is not a veris canary ({why})"),
            ProbeError::Refused(why) => write!(f, "the proxy refused the probe ({why})"),
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
    /// Through a SOCKS5 proxy URL (`socks5h://[USER:PASS@]HOST:PORT` asks
    /// for the canary host by name; `socks5://` for `probe_addr`), then TLS.
    Socks5 { url: String, probe_addr: SocketAddr },
}

impl ProbePath {
    /// Words for the path; a proxy URL's password is never among them.
    pub fn describe(&self) -> String {
        match self {
            ProbePath::Explicit(url) => format!("through the proxy {}", redacted(url)),
            ProbePath::Transparent(addr) => format!("through the kernel redirect (TLS to {addr})"),
            ProbePath::Socks5 { url, .. } => {
                format!("through the SOCKS5 proxy {}", redacted(url))
            }
        }
    }
}

/// A proxy URL as the probe uses it: its address and credentials.
struct ProxyUrl {
    scheme: String,
    /// `host:port`.
    addr: String,
    credentials: Option<(String, String)>,
}

impl ProxyUrl {
    /// `scheme://[USER[:PASS]@]HOST[:PORT][/]`; the userinfo is
    /// percent-decoded. The port defaults to 1080 for SOCKS, else 80.
    fn parse(url: &str) -> Result<ProxyUrl, ProbeError> {
        let (scheme, rest) = url.split_once("://").unwrap_or(("http", url));
        let scheme = scheme.to_ascii_lowercase();
        let rest = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let (userinfo, host) = match rest.rsplit_once('@') {
            Some((userinfo, host)) => (Some(userinfo), host),
            None => (None, rest),
        };
        let decode = |s: &str| {
            let bytes = crate::request::reserved::percent_decode(s.as_bytes())
                .unwrap_or_else(|| s.as_bytes().to_vec());
            String::from_utf8_lossy(&bytes).into_owned()
        };
        let credentials = userinfo.map(|u| match u.split_once(':') {
            Some((user, pass)) => (decode(user), decode(pass)),
            None => (decode(u), String::new()),
        });
        let port = if scheme.starts_with("socks") {
            1080
        } else {
            80
        };
        let addr = veris_admin_client::HttpUrl::parse(&format!("http://{host}"))
            .map(|u| u.authority)
            .map_err(|e| {
                ProbeError::Unreachable(format!("bad proxy URL {:?} ({})", redacted(url), e.what()))
            })?;
        let addr = match host.rsplit_once(':') {
            Some((_, p)) if !p.contains(']') => addr,
            _ => format!("{}:{port}", addr.strip_suffix(":80").unwrap_or(&addr)),
        };
        Ok(ProxyUrl {
            scheme,
            addr,
            credentials,
        })
    }
}

/// `url` with the password of its userinfo, if any, replaced by `***`.
pub fn redacted(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), url),
    };
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            format!("{scheme}{user}:***@{host}")
        }
        None => url.to_string(),
    }
}

/// Asks for the canary along `path`, within `timeout`.
pub async fn probe(path: &ProbePath, timeout: Duration) -> Result<CanaryAnswer, ProbeError> {
    let work = async {
        match path {
            ProbePath::Explicit(url) => probe_explicit(url).await,
            ProbePath::Transparent(addr) => probe_transparent(*addr).await,
            ProbePath::Socks5 { url, probe_addr } => probe_socks5(url, *probe_addr).await,
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
#[cfg(test)]
fn proxy_addr(url: &str) -> Result<String, ProbeError> {
    ProxyUrl::parse(url).map(|u| u.addr)
}

async fn probe_explicit(url: &str) -> Result<CanaryAnswer, ProbeError> {
    let proxy = ProxyUrl::parse(url)?;
    let addr = proxy.addr.as_str();
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| ProbeError::Unreachable(format!("{addr}: {e}")))?;
    let uri = format!("http://{CANARY_HOST}{CANARY_PATH}");
    ask(tcp, addr, &uri, proxy.credentials.as_ref()).await
}

async fn probe_transparent(addr: SocketAddr) -> Result<CanaryAnswer, ProbeError> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| ProbeError::Unreachable(format!("{addr}: {e}")))?;
    ask_tls(tcp, &addr.to_string()).await
}

async fn probe_socks5(url: &str, probe_addr: SocketAddr) -> Result<CanaryAnswer, ProbeError> {
    let proxy = ProxyUrl::parse(url)?;
    let addr = proxy.addr.as_str();
    let mut tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| ProbeError::Unreachable(format!("{addr}: {e}")))?;
    let target = if proxy.scheme == "socks5h" {
        Socks5Target::Name(CANARY_HOST, 443)
    } else {
        Socks5Target::Addr(probe_addr)
    };
    socks5_connect(&mut tcp, proxy.credentials.as_ref(), target).await?;
    ask_tls(tcp, addr).await
}

/// What a SOCKS5 `CONNECT` names.
enum Socks5Target {
    Name(&'static str, u16),
    Addr(SocketAddr),
}

/// The client side of a SOCKS5 handshake and `CONNECT` (RFC 1928, with
/// RFC 1929 username/password when `credentials` are given); afterwards
/// `io` is the tunnel.
async fn socks5_connect<IO>(
    io: &mut IO,
    credentials: Option<&(String, String)>,
    target: Socks5Target,
) -> Result<(), ProbeError>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let io_err = |e: std::io::Error| ProbeError::Unreachable(format!("SOCKS5: {e}"));
    let method = if credentials.is_some() { 0x02 } else { 0x00 };
    io.write_all(&[5, 1, method]).await.map_err(io_err)?;
    let mut two = [0u8; 2];
    io.read_exact(&mut two).await.map_err(io_err)?;
    if two[0] != 5 {
        return Err(ProbeError::NotVeris("not a SOCKS5 server".into()));
    }
    if two[1] != method {
        return Err(ProbeError::Refused(
            "the SOCKS5 proxy accepts no method the probe offered: it wants the sandbox's USER:PASS in the proxy URL".into(),
        ));
    }
    if let Some((user, pass)) = credentials {
        let (user, pass) = (user.as_bytes(), pass.as_bytes());
        let (Ok(ulen), Ok(plen)) = (u8::try_from(user.len()), u8::try_from(pass.len())) else {
            return Err(ProbeError::Refused(
                "SOCKS5 credentials longer than 255 bytes".into(),
            ));
        };
        let mut auth = vec![1, ulen];
        auth.extend_from_slice(user);
        auth.push(plen);
        auth.extend_from_slice(pass);
        io.write_all(&auth).await.map_err(io_err)?;
        io.read_exact(&mut two).await.map_err(io_err)?;
        if two[1] != 0 {
            return Err(ProbeError::Refused(
                "the SOCKS5 proxy refused the credentials of the proxy URL".into(),
            ));
        }
    }
    let mut request = vec![5, 1, 0];
    let port = match target {
        Socks5Target::Name(host, port) => {
            request.push(3);
            request.push(host.len() as u8);
            request.extend_from_slice(host.as_bytes());
            port
        }
        Socks5Target::Addr(SocketAddr::V4(a)) => {
            request.push(1);
            request.extend_from_slice(&a.ip().octets());
            a.port()
        }
        Socks5Target::Addr(SocketAddr::V6(a)) => {
            request.push(4);
            request.extend_from_slice(&a.ip().octets());
            a.port()
        }
    };
    request.extend_from_slice(&port.to_be_bytes());
    io.write_all(&request).await.map_err(io_err)?;
    let mut head = [0u8; 4];
    io.read_exact(&mut head).await.map_err(io_err)?;
    let bound = match head[3] {
        1 => 4,
        4 => 16,
        3 => usize::from(io.read_u8().await.map_err(io_err)?),
        _ => return Err(ProbeError::NotVeris("a malformed SOCKS5 reply".into())),
    };
    let mut rest = vec![0u8; bound + 2];
    io.read_exact(&mut rest).await.map_err(io_err)?;
    if head[1] != 0 {
        return Err(ProbeError::Unreachable(format!(
            "the SOCKS5 proxy answered the CONNECT with reply {:#04x}",
            head[1]
        )));
    }
    Ok(())
}

/// TLS with SNI [`CANARY_HOST`] over `tcp` (any certificate: the answer's
/// token authenticates it), then the canary request.
async fn ask_tls(tcp: TcpStream, addr: &str) -> Result<CanaryAnswer, ProbeError> {
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
    ask(tls, addr, CANARY_PATH, None).await
}

/// The most bytes a canary answer may have (it is a small JSON object).
const MAX_ANSWER: usize = 64 << 10;

/// One HTTP/1.1 GET of the canary over `io` (to `addr`), with
/// `Proxy-Authorization: Basic` when `credentials` are given.
async fn ask<IO>(
    io: IO,
    addr: &str,
    target: &str,
    credentials: Option<&(String, String)>,
) -> Result<CanaryAnswer, ProbeError>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use base64::Engine as _;
    let mut req = veris_admin_client::Request::get(target, CANARY_HOST).header(
        "user-agent",
        concat!("veris-check/", env!("CARGO_PKG_VERSION")),
    );
    if let Some((user, pass)) = credentials {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
        req = req.header("proxy-authorization", format!("Basic {token}"));
    }
    let answer = veris_admin_client::exchange(io, addr, &req, MAX_ANSWER)
        .await
        .map_err(|e| ProbeError::Unreachable(e.what()))?;
    let status = answer.status;
    if status == 407 {
        return Err(ProbeError::Refused(if credentials.is_some() {
            "HTTP 407: the proxy refused the credentials of the proxy URL".into()
        } else {
            "HTTP 407: the proxy wants credentials: the sandbox's USER:PASS in the proxy URL".into()
        }));
    }
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
        assert_eq!(
            proxy_addr("socks5h://u:p@10.0.0.1").unwrap(),
            "10.0.0.1:1080"
        );
        assert_eq!(
            proxy_addr("http://sbx:p%40ss@10.0.0.1:1080/").unwrap(),
            "10.0.0.1:1080"
        );
        let url = ProxyUrl::parse("socks5h://sbx-a:p%40ss@[::1]:9").unwrap();
        assert_eq!(url.addr, "[::1]:9");
        assert_eq!(
            url.credentials,
            Some(("sbx-a".to_string(), "p@ss".to_string()))
        );
    }

    #[test]
    fn descriptions_never_name_a_password() {
        let path = ProbePath::Socks5 {
            url: "socks5h://sbx-a:secret@10.0.0.1:1080".into(),
            probe_addr: DEFAULT_PROBE_ADDR.parse().unwrap(),
        };
        assert_eq!(
            path.describe(),
            "through the SOCKS5 proxy socks5h://sbx-a:***@10.0.0.1:1080"
        );
        let path = ProbePath::Explicit("http://sbx-a:secret@10.0.0.1:1080".into());
        assert!(!path.describe().contains("secret"));
    }

    /// The receipt crate cannot see these constants; the probe its hint
    /// prints must still be the one this module answers.
    #[test]
    fn the_receipts_probe_hint_names_the_canary_and_the_probe_address() {
        let addr: SocketAddr = DEFAULT_PROBE_ADDR.parse().unwrap();
        let curl = format!(
            "`curl --resolve {CANARY_HOST}:{}:{} https://{CANARY_HOST}{CANARY_PATH}`",
            addr.port(),
            addr.ip()
        );
        let hint = veris_receipt::receipt::SANDBOX_PROBE_HINT;
        assert!(hint.contains(&curl), "{hint}");
        assert!(hint.contains("`veris check --gateway "), "{hint}");
    }
}
