//! Telling a client that refused our certificate from one that merely hung
//! up, by evidence. When a TLS handshake in which the proxy already sent its
//! minted leaf fails, only an alert that names the certificate
//! ([`veris_receipt::entry::REFUSAL_ALERTS`]: `unknown_ca`, `bad_certificate`,
//! `certificate_unknown`, ..., `access_denied`) is a refusal, recorded as a
//! `trust_failure` that the receipt turns into a prescription. A close, a
//! reset or an alert that names nothing about the certificate is recorded as
//! a `tls_abandoned` handshake, and so is a connection that completes the
//! handshake and closes without one request byte: notes in the receipt,
//! never failures by themselves, since a client that gave up (a load tool
//! cancelling, an aborted connection) closes the same way.
//!
//! Measured against this proxy: curl 7.88 / OpenSSL 3.0 without the veris
//! CA sends an encrypted `unknown_ca`, which rustls reports as
//! `AlertReceived(UnknownCA)`; Node 20 closes mid-handshake with no alert;
//! wget (GnuTLS) finishes the handshake and closes with no alert and no
//! request.

use rustls::AlertDescription;
use tracing::{info, warn};
use veris_receipt::entry::is_refusal_alert;
use veris_receipt::Entry;
use veris_receipt::{TlsAbandonedLine, TrustFailureLine};

use crate::request::route::Route;
use crate::request::Leg;
use crate::Proxy;

/// How a handshake after our server flight ended, judged by its evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handshake {
    /// An alert that names the certificate (its ledger name).
    Refused(String),
    /// A close, a reset, or an alert that names no certificate (its name).
    Abandoned(Option<String>),
}

/// Where a TLS connection the client left without a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Before the handshake finished.
    Handshake,
    /// After the handshake, without one byte of request.
    NoRequest,
}

impl Proxy {
    fn routed_service(&self, name: &str) -> Option<String> {
        match self.router.route_connection(name) {
            Route::Service(s) => Some(s.name.clone()),
            _ => None,
        }
    }

    /// Records what the client of `leg` did after our leaf for `name` was
    /// sent, when the handshake failed.
    pub(crate) async fn record_handshake_failure(&self, name: &str, leg: &Leg, how: Handshake) {
        match how {
            Handshake::Refused(alert) => self.record_trust_failure(name, leg, alert).await,
            Handshake::Abandoned(alert) => {
                self.record_tls_abandoned(name, leg, Stage::Handshake, alert, None)
                    .await
            }
        }
    }

    /// Records that the client of `leg` refused the leaf minted for `name`.
    pub(crate) async fn record_trust_failure(&self, name: &str, leg: &Leg, alert: String) {
        let service = self.routed_service(name);
        warn!(host = %name, %alert, ?service, "the client refused the veris certificate");
        self.record_or_log(Entry::TrustFailure(TrustFailureLine {
            host: name.to_string(),
            port: leg.port,
            tier: leg.tier,
            service,
            alert,
        }))
        .await;
    }

    /// Records a TLS connection for `name` that the client left after our
    /// leaf without a refusal alert and without a request.
    pub(crate) async fn record_tls_abandoned(
        &self,
        name: &str,
        leg: &Leg,
        stage: Stage,
        alert: Option<String>,
        alpn: Option<String>,
    ) {
        let service = self.routed_service(name);
        let stage = match stage {
            Stage::Handshake => "handshake",
            Stage::NoRequest => "no_request",
        };
        info!(host = %name, stage, ?alert, "the client left after the veris certificate without a refusal alert or a request");
        self.record_or_log(Entry::TlsAbandoned(TlsAbandonedLine {
            host: name.to_string(),
            port: leg.port,
            tier: leg.tier,
            service,
            stage: stage.to_string(),
            alert,
            alpn,
        }))
        .await;
    }
}

/// How a failed handshake after our server flight ended, or `None` when the
/// failure says nothing about the client's view of our certificate (a
/// protocol mismatch, garbage, our own error, a timeout).
pub fn classify(err: &std::io::Error) -> Option<Handshake> {
    if let Some(tls) = err
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        return match tls {
            rustls::Error::AlertReceived(alert) => {
                let name = alert_name(*alert);
                Some(if is_refusal_alert(&name) {
                    Handshake::Refused(name)
                } else {
                    Handshake::Abandoned(Some(name))
                })
            }
            _ => None,
        };
    }
    match err.kind() {
        std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::ConnectionAborted
        | std::io::ErrorKind::BrokenPipe => Some(Handshake::Abandoned(None)),
        _ => None,
    }
}

/// The ledger spelling of an alert: snake case of its rustls name, with
/// `unknown_ca` for `UnknownCA`.
pub fn alert_name(alert: AlertDescription) -> String {
    match alert {
        AlertDescription::UnknownCA => "unknown_ca".to_string(),
        other => snake_case(&format!("{other:?}")),
    }
}

fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls_err(e: rustls::Error) -> std::io::Error {
        // How tokio-rustls hands rustls errors back.
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    }

    #[test]
    fn alerts_that_name_the_certificate_are_refusals() {
        let cases = [
            (AlertDescription::UnknownCA, "unknown_ca"),
            (AlertDescription::BadCertificate, "bad_certificate"),
            (AlertDescription::CertificateUnknown, "certificate_unknown"),
            (AlertDescription::CertificateExpired, "certificate_expired"),
            (AlertDescription::CertificateRevoked, "certificate_revoked"),
            (AlertDescription::AccessDenied, "access_denied"),
            (
                AlertDescription::UnsupportedCertificate,
                "unsupported_certificate",
            ),
            (
                AlertDescription::BadCertificateStatusResponse,
                "bad_certificate_status_response",
            ),
            (
                AlertDescription::BadCertificateHashValue,
                "bad_certificate_hash_value",
            ),
            (
                AlertDescription::CertificateUnobtainable,
                "certificate_unobtainable",
            ),
        ];
        for (alert, name) in cases {
            assert_eq!(
                classify(&tls_err(rustls::Error::AlertReceived(alert))),
                Some(Handshake::Refused(name.into()))
            );
        }
    }

    #[test]
    fn other_alerts_and_silence_are_abandoned_and_the_rest_is_nothing() {
        for (alert, name) in [
            (AlertDescription::CloseNotify, "close_notify"),
            (AlertDescription::UserCanceled, "user_canceled"),
            (AlertDescription::HandshakeFailure, "handshake_failure"),
            (AlertDescription::DecryptError, "decrypt_error"),
            (AlertDescription::BadRecordMac, "bad_record_mac"),
        ] {
            assert_eq!(
                classify(&tls_err(rustls::Error::AlertReceived(alert))),
                Some(Handshake::Abandoned(Some(name.into())))
            );
        }
        let eof = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "tls handshake eof");
        assert_eq!(classify(&eof), Some(Handshake::Abandoned(None)));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(classify(&reset), Some(Handshake::Abandoned(None)));
        let incompatible = tls_err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::NoCipherSuitesInCommon,
        ));
        assert_eq!(classify(&incompatible), None);
        let timeout = std::io::Error::from(std::io::ErrorKind::TimedOut);
        assert_eq!(classify(&timeout), None);
    }
}
