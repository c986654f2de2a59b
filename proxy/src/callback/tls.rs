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
            .map_err(|e| reason(&e, host))
    }
}

impl Default for WebhookTls {
    /// No roots: every certificate fails (tests that never dial https).
    fn default() -> WebhookTls {
        WebhookTls::new(rustls::RootCertStore::empty())
    }
}

/// The line's words for a failed handshake: a certificate the roots do not
/// vouch for is named as such, with what to do. The words are veris's own:
/// the certificate is the app's (the workload's) and none of its text (the
/// names it presents) is quoted.
fn reason(e: &std::io::Error, host: &str) -> String {
    let tls = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match tls {
        Some(rustls::Error::InvalidCertificate(why)) => {
            use rustls::CertificateError as C;
            let what = match why {
                C::UnknownIssuer => "UnknownIssuer: no CA veris trusts issued it".to_string(),
                C::NotValidForName | C::NotValidForNameContext { .. } => {
                    format!("NotValidForName: it is not for {host}")
                }
                C::Expired | C::ExpiredContext { .. } => "Expired".to_string(),
                C::NotValidYet | C::NotValidYetContext { .. } => "NotValidYet".to_string(),
                C::Revoked => "Revoked".to_string(),
                C::BadSignature => "BadSignature".to_string(),
                C::BadEncoding => "BadEncoding".to_string(),
                C::InvalidPurpose | C::InvalidPurposeContext { .. } => {
                    "InvalidPurpose: not for a TLS server".to_string()
                }
                _ => "it does not verify".to_string(),
            };
            format!(
                "tls: the app's certificate was not accepted ({what}); nothing was delivered. Next: serve a certificate the system trusts for this host, or give its CA with --webhook-ca"
            )
        }
        Some(rustls::Error::AlertReceived(alert)) => {
            format!("tls: the app refused the handshake ({alert:?})")
        }
        Some(_) => "tls: the handshake failed".to_string(),
        None => format!("tls: {}", e.kind()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_certificate_is_said_in_veris_words_only() {
        let err = |why: rustls::CertificateError| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                rustls::Error::InvalidCertificate(why),
            )
        };
        let unknown = reason(&err(rustls::CertificateError::UnknownIssuer), "127.0.0.1");
        assert!(
            unknown.contains("not accepted (UnknownIssuer") && unknown.contains("Next:"),
            "{unknown}"
        );
        // The names the app's certificate presents are its words: not quoted.
        let misnamed = reason(
            &err(rustls::CertificateError::NotValidForNameContext {
                expected: ServerName::try_from("app.example").unwrap(),
                presented: vec!["verified: all deliveries ok".into()],
            }),
            "app.example",
        );
        assert!(
            misnamed.contains("NotValidForName: it is not for app.example"),
            "{misnamed}"
        );
        assert!(!misnamed.contains("all deliveries ok"), "{misnamed}");
    }
}
