//! The certificate a veris listener presents as itself (the gateway's TLS listener), rather
//! than as a vendor: either an operator's PEM pair, checked when loaded (readable, a key that
//! belongs to the certificate, within its validity), or one leaf of the interception CA naming
//! the listener's addresses, re-minted a day before it expires so that a gateway running for
//! months never presents an expired one. A platform that dials the gateway over the internet
//! trusts the former through its usual roots, the latter through the gateway's CA file.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use time::OffsetDateTime;

use crate::authority::LEAF_VALIDITY;
use crate::issuer::RENEW_BEFORE;
use crate::{CaError, CertificateAuthority};

/// A listener's own certificate; hand it to rustls as its certificate resolver.
pub struct ServerCert {
    source: Source,
}

enum Source {
    Loaded(Arc<CertifiedKey>),
    Minted {
        ca: Arc<CertificateAuthority>,
        names: Vec<String>,
        current: Mutex<(Arc<CertifiedKey>, OffsetDateTime)>,
    },
}

impl std::fmt::Debug for ServerCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        match &self.source {
            Source::Loaded(_) => f.write_str("ServerCert::Loaded"),
            Source::Minted { names, .. } => write!(f, "ServerCert::Minted({names:?})"),
        }
    }
}

impl ServerCert {
    /// An operator's certificate chain (PEM, leaf first) and private key (PEM: PKCS#8, SEC1
    /// or PKCS#1). Refused with the reason and the next step when a file cannot be read or
    /// holds no such block, when the key is not the certificate's, or when the certificate is
    /// outside its validity.
    pub fn load(cert: &Path, key: &Path) -> Result<ServerCert, CaError> {
        let bad = |path: &Path, reason: String| CaError::ServerCert {
            path: path.to_path_buf(),
            reason,
        };
        let read = |path: &Path| {
            std::fs::read(path).map_err(|e| bad(path, format!("cannot be read ({e})")))
        };
        let chain = CertificateDer::pem_slice_iter(&read(cert)?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(cert, format!("not a PEM certificate chain ({e})")))?;
        let Some(leaf) = chain.first() else {
            return Err(bad(cert, "holds no `BEGIN CERTIFICATE` block".into()));
        };
        let (_, parsed) = x509_parser::parse_x509_certificate(leaf)
            .map_err(|e| bad(cert, format!("its first certificate does not parse ({e})")))?;
        let now = OffsetDateTime::now_utc();
        let validity = parsed.validity();
        if validity.not_after.to_datetime() <= now {
            return Err(bad(cert, format!("expired on {}", validity.not_after)));
        }
        if validity.not_before.to_datetime() > now {
            return Err(bad(
                cert,
                format!("is not valid before {}", validity.not_before),
            ));
        }
        let key_der = PrivateKeyDer::from_pem_slice(&read(key)?)
            .map_err(|e| bad(key, format!("holds no PEM private key ({e})")))?;
        let provider = rustls::crypto::aws_lc_rs::default_provider();
        let certified = CertifiedKey::from_der(chain, key_der, &provider).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => CaError::KeyMismatch {
                cert: cert.to_path_buf(),
                key: key.to_path_buf(),
            },
            other => bad(key, format!("the key is not usable ({other})")),
        })?;
        Ok(ServerCert {
            source: Source::Loaded(Arc::new(certified)),
        })
    }

    /// A leaf of `ca` for `names` (DNS names or IP literals), minted now and again before it
    /// expires.
    pub fn mint(ca: Arc<CertificateAuthority>, names: &[String]) -> Result<ServerCert, CaError> {
        let current = mint(&ca, names)?;
        Ok(ServerCert {
            source: Source::Minted {
                ca,
                names: names.to_vec(),
                current: Mutex::new(current),
            },
        })
    }

    /// True for a leaf of the CA, false for an operator's certificate.
    pub fn is_minted(&self) -> bool {
        matches!(self.source, Source::Minted { .. })
    }
}

/// A leaf for `names` and when to replace it.
fn mint(
    ca: &CertificateAuthority,
    names: &[String],
) -> Result<(Arc<CertifiedKey>, OffsetDateTime), CaError> {
    let hosts: Vec<&str> = names.iter().map(String::as_str).collect();
    let leaf = ca.mint_leaf_for(&hosts)?;
    let host = names.first().cloned().unwrap_or_default();
    let signing_key = rustls::crypto::aws_lc_rs::sign::any_ecdsa_type(&leaf.key)
        .map_err(|source| CaError::SigningKey { host, source })?;
    let renew_at = (OffsetDateTime::now_utc() + LEAF_VALIDITY).min(ca.not_after()) - RENEW_BEFORE;
    Ok((
        Arc::new(CertifiedKey::new(leaf.chain, signing_key)),
        renew_at,
    ))
}

impl ResolvesServerCert for ServerCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        match &self.source {
            Source::Loaded(key) => Some(key.clone()),
            Source::Minted { ca, names, current } => {
                let mut current = current.lock().unwrap_or_else(PoisonError::into_inner);
                if OffsetDateTime::now_utc() >= current.1 {
                    // A failed renewal keeps the old leaf, still valid for a day.
                    match mint(ca, names) {
                        Ok(fresh) => *current = fresh,
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot renew the listener's own certificate")
                        }
                    }
                }
                Some(current.0.clone())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;
    use std::path::PathBuf;

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("veris-ca-server-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn minted_leaf_names_every_name_and_verifies_against_the_ca() {
        let dir = temp_dir("mint");
        let (ca, _) = CertificateAuthority::load_or_create(
            &dir.join("ca"),
            &crate::Scope::of(&["localhost", "a.example", "b.example", "10.0.0.0/8"]).unwrap(),
        )
        .unwrap();
        let ca = Arc::new(ca);
        let names = vec!["10.0.0.5".to_string(), "localhost".to_string()];
        let cert = ServerCert::mint(ca.clone(), &names).unwrap();
        assert!(cert.is_minted());
        let Source::Minted { current, .. } = &cert.source else {
            unreachable!()
        };
        let key = current.lock().unwrap().0.clone();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert_der().clone()).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder(Arc::new(roots))
            .build()
            .unwrap();
        for name in ["10.0.0.5", "localhost"] {
            let server = rustls::pki_types::ServerName::try_from(name).unwrap();
            verifier
                .verify_server_cert(
                    &key.cert[0],
                    &key.cert[1..],
                    &server,
                    &[],
                    rustls::pki_types::UnixTime::now(),
                )
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let other = rustls::pki_types::ServerName::try_from("other.example").unwrap();
        assert!(verifier
            .verify_server_cert(
                &key.cert[0],
                &[],
                &other,
                &[],
                rustls::pki_types::UnixTime::now()
            )
            .is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn loading_refuses_a_key_of_another_certificate_and_missing_files() {
        let dir = temp_dir("load");
        let (ca, _) = CertificateAuthority::load_or_create(
            &dir.join("ca"),
            &crate::Scope::of(&["localhost", "a.example", "b.example", "10.0.0.0/8"]).unwrap(),
        )
        .unwrap();
        let a = ca.mint_leaf("a.example").unwrap();
        let b = ca.mint_leaf("b.example").unwrap();
        let pem = |label: &str, der: &[u8]| {
            let lines: Vec<String> = base64(der)
                .as_bytes()
                .chunks(64)
                .map(|c| String::from_utf8_lossy(c).into_owned())
                .collect();
            format!(
                "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
                lines.join("\n")
            )
        };
        let (cert, key_a, key_b) = (
            dir.join("a.pem"),
            dir.join("a-key.pem"),
            dir.join("b-key.pem"),
        );
        std::fs::write(&cert, pem("CERTIFICATE", &a.chain[0])).unwrap();
        std::fs::write(&key_a, pem("PRIVATE KEY", a.key.secret_der())).unwrap();
        std::fs::write(&key_b, pem("PRIVATE KEY", b.key.secret_der())).unwrap();
        assert!(!ServerCert::load(&cert, &key_a).unwrap().is_minted());
        match ServerCert::load(&cert, &key_b) {
            Err(CaError::KeyMismatch { .. }) => {}
            other => panic!("a key of another certificate: {other:?}"),
        }
        match ServerCert::load(&dir.join("absent.pem"), &key_a) {
            Err(CaError::ServerCert { reason, .. }) => {
                assert!(reason.contains("cannot be read"), "{reason}")
            }
            other => panic!("a missing certificate file: {other:?}"),
        }
        match ServerCert::load(&key_a, &key_a) {
            Err(CaError::ServerCert { reason, .. }) => {
                assert!(reason.contains("no `BEGIN CERTIFICATE`"), "{reason}")
            }
            other => panic!("a key as the certificate: {other:?}"),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Standard base64 with padding, for the PEM files above.
    fn base64(data: &[u8]) -> String {
        const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for chunk in data.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(ABC[(n >> (18 - 6 * i)) as usize & 63] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }
}
