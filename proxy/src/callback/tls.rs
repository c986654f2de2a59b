//! TLS for `https://` webhook URLs (a platform such as E2B exposes a
//! sandbox's port at an `https://` host). The app's certificate is verified
//! against the roots the proxy already trusts for real hosts (the system
//! bundle) plus, for a private CA, `--webhook-ca`; a certificate that does
//! not verify fails the attempt with a reason that says so, never a status
//! the app gave. HTTP/1.1 only, as over `http://`.

use std::sync::Arc;

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// The client side of a webhook's TLS: which roots an app's certificate
/// must chain to.
#[derive(Clone)]
pub struct WebhookTls(Arc<rustls::ClientConfig>);

impl WebhookTls {
    /// Verifies apps' certificates against `roots`.
    pub fn new(roots: rustls::RootCertStore) -> WebhookTls {
        let mut config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        WebhookTls(Arc::new(config))
    }

    /// The TLS handshake over `stream` for `host` (a name or an address,
    /// brackets and all); `Err` is the line's reason.
    pub(super) async fn handshake(
        &self,
        stream: TcpStream,
        host: &str,
    ) -> Result<TlsStream<TcpStream>, String> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(bare.to_string())
            .map_err(|_| format!("tls: {host:?} is not a name a certificate can be checked for"))?;
        TlsConnector::from(Arc::clone(&self.0))
            .connect(name, stream)
            .await
            .map_err(|e| reason(&e))
    }
}

impl Default for WebhookTls {
    /// No roots: every certificate fails (tests that never dial https).
    fn default() -> WebhookTls {
        WebhookTls::new(rustls::RootCertStore::empty())
    }
}

/// The line's words for a failed handshake: a certificate the roots do not
/// vouch for is named as such, with what to do.
fn reason(e: &std::io::Error) -> String {
    let tls = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match tls {
        Some(rustls::Error::InvalidCertificate(why)) => format!(
            "tls: the app's certificate was not accepted ({why:?}); nothing was delivered. Next: serve a certificate the system trusts for this host, or give its CA with --webhook-ca"
        ),
        Some(other) => format!("tls: {other}"),
        None => format!("tls: {e}"),
    }
}
