//! The gateway's TLS listener (`veris gateway --tls-listen`): SOCKS5 and HTTP
//! proxy requests inside TLS, for platforms that reach the gateway over the
//! internet, where the sandbox's credential must not travel in clear. It is
//! a listener of its own, TLS only, beside the plain `--listen` one: the
//! plain port can stay on loopback or a private network while this one faces
//! the internet, and a client that speaks plaintext to it is closed before
//! its credential is read ([`veris_proxy::inbound::gateway`]).
//!
//! Its certificate is an operator's (`--tls-cert`, `--tls-key`), which a
//! platform trusts through its usual roots, or else a leaf of the gateway's
//! CA for `--tls-name` (default: the listener's address and `localhost`),
//! which a platform trusts through the CA file it already has for the
//! interception ([`veris_ca::ServerCert`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use tokio::net::TcpListener;
use veris_ca::{CertificateAuthority, ServerCert};

/// What `--tls-listen` and its companions ask for.
#[derive(Debug, Clone)]
pub struct TlsSettings {
    pub listen: String,
    /// `--tls-cert` and `--tls-key`, both or neither.
    pub cert: Option<(PathBuf, PathBuf)>,
    /// `--tls-name`: the names a minted leaf carries.
    pub names: Vec<String>,
}

/// The bound TLS listener and what a platform needs to reach it.
pub struct TlsListener {
    pub listener: TcpListener,
    pub addr: SocketAddr,
    pub config: Arc<rustls::ServerConfig>,
    /// The file a client trusts: the gateway's CA when it minted the leaf;
    /// `None` for an operator's certificate (the client's usual roots).
    pub ca: Option<PathBuf>,
}

/// `--tls-listen` as an address.
fn listen_addr(settings: &TlsSettings) -> Result<SocketAddr> {
    settings.listen.parse().with_context(|| {
        format!(
            "--tls-listen {:?} is not an IP:PORT. Next: e.g. --tls-listen 0.0.0.0:1443",
            settings.listen
        )
    })
}

/// The names the listener's leaf of the CA carries: `--tls-name`, else
/// its address and `localhost`; none with an operator's certificate. The
/// CA must be allowed to sign for each (its name constraints).
pub fn minted_names(settings: &TlsSettings) -> Result<Vec<String>> {
    if settings.cert.is_some() {
        return Ok(Vec::new());
    }
    if !settings.names.is_empty() {
        return Ok(settings.names.clone());
    }
    Ok(default_names(listen_addr(settings)?))
}

/// Loads or mints the certificate, then binds `settings.listen`.
pub async fn bind(
    settings: &TlsSettings,
    ca: &Arc<CertificateAuthority>,
    ca_pem: PathBuf,
) -> Result<TlsListener> {
    let listen = listen_addr(settings)?;
    let (cert, trust) = match &settings.cert {
        Some((cert, key)) => (
            ServerCert::load(cert, key).context("loading the TLS listener's certificate")?,
            None,
        ),
        None => {
            let names = minted_names(settings)?;
            let cert = ServerCert::mint(ca.clone(), &names).with_context(|| {
                format!("minting the TLS listener's certificate for {names:?}. Next: give each --tls-name as a DNS name or an IP address")
            })?;
            (cert, Some(ca_pem))
        }
    };
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(cert));
    let listener = TcpListener::bind(listen).await.with_context(|| {
        format!("binding the gateway's TLS listener to {listen}. Next: pick a free address with --tls-listen (port 0 picks one)")
    })?;
    let addr = listener.local_addr()?;
    Ok(TlsListener {
        listener,
        addr,
        config: Arc::new(config),
        ca: trust,
    })
}

/// The names a client may dial the listener by: its address (every
/// interface address when it listens on all of them) and `localhost`.
fn default_names(listen: SocketAddr) -> Vec<String> {
    let ips = if listen.ip().is_unspecified() {
        veris_proxy::outbound::policy::own_addresses().unwrap_or_default()
    } else {
        vec![listen.ip()]
    };
    let mut names: Vec<String> = ips
        .into_iter()
        .filter(|ip| !ip.is_unspecified())
        .map(|ip| ip.to_string())
        .collect();
    names.push("localhost".into());
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_names_are_the_address_and_localhost() {
        let named = default_names("10.1.2.3:1443".parse().unwrap());
        assert_eq!(named, ["10.1.2.3", "localhost"]);
        let all = default_names("0.0.0.0:1443".parse().unwrap());
        assert!(all.contains(&"localhost".to_string()), "{all:?}");
        assert!(!all.contains(&"0.0.0.0".to_string()), "{all:?}");
    }
}
