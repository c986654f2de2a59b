//! Telling a client that refused our certificate from one that merely hung
//! up. When a TLS handshake in which the proxy already sent its minted leaf
//! fails, the client's alert (or its silence) says why: `unknown_ca` is the
//! usual "this client does not trust the veris CA", the others name rarer
//! causes. The classification is recorded per host as a ledger
//! `trust_failure` line, which the receipt turns into a prescription.
//!
//! Measured with curl 7.88 / OpenSSL 3.0 against this proxy under TLS 1.3:
//! a client without the veris CA sends an encrypted `unknown_ca` alert, which
//! rustls decrypts and reports as `AlertReceived(UnknownCA)`.

use rustls::AlertDescription;
use tracing::warn;
use veris_receipt::Entry;

use crate::route::Route;
use crate::{Leg, Proxy};

impl Proxy {
    /// Records that the client of `leg` refused the leaf minted for `name`.
    pub(crate) fn record_trust_failure(&self, name: &str, leg: &Leg, alert: String) {
        let service = match self.router.route_connection(name) {
            Route::Service(s) => Some(s.name.clone()),
            _ => None,
        };
        warn!(host = %name, %alert, ?service, "the client refused the veris certificate");
        let entry = Entry::TrustFailure {
            host: name.to_string(),
            port: leg.port,
            tier: leg.tier,
            service,
            alert,
        };
        if let Err(e) = self.recorder.record(entry).wait() {
            warn!(error = %e, "trust failure could not be recorded");
        }
    }
}

/// The `alert` value of a ledger `trust_failure` line for a failed handshake
/// after our server flight, or `None` when the failure does not look like a
/// refusal of our certificate (a protocol mismatch, garbage, our own error).
pub fn classify(err: &std::io::Error) -> Option<String> {
    if let Some(tls) = err
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        return match tls {
            rustls::Error::AlertReceived(alert) => Some(alert_name(*alert)),
            _ => None,
        };
    }
    // A close or reset once the ClientHello was in and our flight was out:
    // the client judged the certificate and left without saying why.
    match err.kind() {
        std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::ConnectionAborted
        | std::io::ErrorKind::BrokenPipe => Some(NO_ALERT.to_string()),
        _ => None,
    }
}

/// A close after the server flight with no alert.
pub const NO_ALERT: &str = "no_alert";

/// The ledger spelling of an alert: the names the issue lists, otherwise
/// `other:<snake_case name>`.
pub fn alert_name(alert: AlertDescription) -> String {
    let known = match alert {
        AlertDescription::UnknownCA => "unknown_ca",
        AlertDescription::BadCertificate => "bad_certificate",
        AlertDescription::CertificateUnknown => "certificate_unknown",
        AlertDescription::CertificateExpired => "certificate_expired",
        AlertDescription::UnsupportedCertificate => "unsupported_certificate",
        // A close_notify mid-handshake carries no reason either.
        AlertDescription::CloseNotify => NO_ALERT,
        other => return format!("other:{}", snake_case(&format!("{other:?}"))),
    };
    known.to_string()
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
    fn alerts_are_named() {
        let cases = [
            (AlertDescription::UnknownCA, "unknown_ca"),
            (AlertDescription::BadCertificate, "bad_certificate"),
            (AlertDescription::CertificateUnknown, "certificate_unknown"),
            (AlertDescription::CertificateExpired, "certificate_expired"),
            (
                AlertDescription::UnsupportedCertificate,
                "unsupported_certificate",
            ),
            (AlertDescription::DecryptError, "other:decrypt_error"),
            (AlertDescription::BadRecordMac, "other:bad_record_mac"),
        ];
        for (alert, name) in cases {
            assert_eq!(
                classify(&tls_err(rustls::Error::AlertReceived(alert))).as_deref(),
                Some(name)
            );
        }
    }

    #[test]
    fn silence_after_the_flight_is_no_alert_and_other_failures_are_not_refusals() {
        let eof = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "tls handshake eof");
        assert_eq!(classify(&eof).as_deref(), Some(NO_ALERT));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(classify(&reset).as_deref(), Some(NO_ALERT));
        let incompatible = tls_err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::NoCipherSuitesInCommon,
        ));
        assert_eq!(classify(&incompatible), None);
        let timeout = std::io::Error::from(std::io::ErrorKind::TimedOut);
        assert_eq!(classify(&timeout), None);
    }
}
