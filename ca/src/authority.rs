//! The persisted interception CA: creation, loading, validation and leaf minting.
//!
//! The CA lives in one directory (0700) as `veris-ca.pem` (0644) and `veris-ca-key.pem` (0600).
//! It is reused on every start and generated only when a file is missing or unparsable; the
//! reason is logged and returned. A CA is valid for a year and carries name constraints (its
//! [`Scope`]): a stolen key can sign only for the names veris routes. An expired CA is refused
//! with the fix, never silently replaced: every client that trusts it would need the new file,
//! so a new CA is made deliberately, by [`CertificateAuthority::rotate`], which keeps the
//! previous certificate beside it (`veris-ca.prev.pem`) so old ledgers can still be explained.
//! A key file that group or others can read is refused outright: silently "fixing" it would
//! hide that the key may have leaked.

use std::fmt;
use std::fs;
use std::io::ErrorKind;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType, SerialNumber, PKCS_ECDSA_P256_SHA256,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::{Duration, OffsetDateTime};

use crate::fsutil::{ensure_dir, write_atomic};
use crate::{CaError, Scope};

/// File name of the CA certificate inside the CA dir.
pub const CA_CERT_FILE: &str = "veris-ca.pem";
/// File name of the CA private key inside the CA dir.
pub const CA_KEY_FILE: &str = "veris-ca-key.pem";
/// File name of the previous CA certificate, kept by a rotation (no key is kept).
pub const CA_PREV_FILE: &str = "veris-ca.prev.pem";

const CA_COMMON_NAME: &str = "veris interception CA";
const CA_ORGANIZATION: &str = "veris";
/// One year: a key that leaks stops being useful within it, and a yearly `veris ca rotate`
/// is rare enough for fleets whose sandboxes all trust one CA file.
const CA_VALIDITY: Duration = Duration::days(365);
/// A CA this close to its end is warned about at every start (and by `veris doctor`).
pub const EXPIRY_WARNING: Duration = Duration::days(30);
pub(crate) const LEAF_VALIDITY: Duration = Duration::days(30);
/// Clocks in sandboxes drift; backdating keeps a freshly minted cert valid for a slow client.
const BACKDATE: Duration = Duration::minutes(5);

/// Why `load_or_create` did what it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadOutcome {
    /// An existing, valid CA was loaded.
    Loaded,
    /// A new CA was generated; `reason` says why ("missing: …", "unparsable: …", "expired").
    Created { reason: String },
}

/// A leaf certificate for one host, ready to serve: `chain` is `[leaf, ca]`.
pub struct Leaf {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl fmt::Debug for Leaf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print key material.
        f.debug_struct("Leaf")
            .field("chain_len", &self.chain.len())
            .finish_non_exhaustive()
    }
}

/// The interception CA, loaded from or created in its directory.
pub struct CertificateAuthority {
    cert_path: PathBuf,
    key_path: PathBuf,
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: rcgen::Issuer<'static, KeyPair>,
    subject: String,
    fingerprint: String,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    /// `None` for a CA made before veris constrained its CAs: it signs for any name.
    scope: Option<Scope>,
}

/// What [`CertificateAuthority::rotate`] replaced, and the CA it made.
#[derive(Debug)]
pub struct Rotated {
    /// The CA that was in the dir, if a usable one was (its certificate is now
    /// `veris-ca.prev.pem`).
    pub previous: Option<Previous>,
    pub ca: CertificateAuthority,
}

/// The certificate a rotation replaced.
#[derive(Debug)]
pub struct Previous {
    pub path: PathBuf,
    pub fingerprint: String,
    pub not_after: OffsetDateTime,
    pub scope: Option<Scope>,
}

impl fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("cert_path", &self.cert_path)
            .field("subject", &self.subject)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

/// What was found on disk, before deciding whether to regenerate.
enum Found {
    Usable(Box<CertificateAuthority>),
    Regenerate(String),
}

impl CertificateAuthority {
    /// Loads the CA from `dir` or creates it, constrained to `scope`; logs (tracing::info/warn)
    /// why it was (re)generated. An expired CA is [`CaError::Expired`]. A loaded CA keeps the
    /// scope it was made with: the caller checks its names against it
    /// ([`CertificateAuthority::permits`]).
    pub fn load_or_create(
        dir: &Path,
        scope: &Scope,
    ) -> Result<(CertificateAuthority, LoadOutcome), CaError> {
        ensure_dir(dir, 0o700)?;
        match Self::inspect(dir)? {
            Found::Usable(ca) => {
                let ca = ca.unexpired()?;
                tracing::debug!(path = %ca.cert_path.display(), fingerprint = %ca.fingerprint, "loaded veris ca");
                Ok((ca, LoadOutcome::Loaded))
            }
            Found::Regenerate(reason) => {
                let now = OffsetDateTime::now_utc();
                let ca = Self::create(dir, now - BACKDATE, now + CA_VALIDITY, scope)?;
                if reason.starts_with("missing") {
                    tracing::info!(path = %ca.cert_path.display(), %reason, fingerprint = %ca.fingerprint, "generated a new veris ca");
                } else {
                    tracing::warn!(path = %ca.cert_path.display(), %reason, fingerprint = %ca.fingerprint, "regenerated the veris ca; clients must trust the new one");
                }
                Ok((ca, LoadOutcome::Created { reason }))
            }
        }
    }

    /// Loads the CA from `dir` without creating or changing anything (not
    /// even the dir): [`CaError::NoCa`] says why there is none usable —
    /// what [`CertificateAuthority::load_or_create`] would regenerate —
    /// and [`CaError::Expired`] that it expired.
    pub fn load(dir: &Path) -> Result<CertificateAuthority, CaError> {
        match Self::inspect(dir)? {
            Found::Usable(ca) => ca.unexpired(),
            Found::Regenerate(reason) => Err(CaError::NoCa {
                dir: dir.to_path_buf(),
                reason,
            }),
        }
    }

    /// Makes the next CA in `dir`, constrained to `scope`, valid for a year from now: a new
    /// key replaces the old one, and the old certificate (if there was a usable one, expired
    /// or not) is kept as `veris-ca.prev.pem`.
    pub fn rotate(dir: &Path, scope: &Scope) -> Result<Rotated, CaError> {
        ensure_dir(dir, 0o700)?;
        let previous = match Self::inspect(dir)? {
            Found::Usable(old) => {
                let path = dir.join(CA_PREV_FILE);
                write_atomic(&path, old.cert_pem.as_bytes(), 0o644)?;
                Some(Previous {
                    path,
                    fingerprint: old.fingerprint,
                    not_after: old.not_after,
                    scope: old.scope,
                })
            }
            Found::Regenerate(_) => None,
        };
        let now = OffsetDateTime::now_utc();
        let ca = Self::create(dir, now - BACKDATE, now + CA_VALIDITY, scope)?;
        tracing::info!(path = %ca.cert_path.display(), fingerprint = %ca.fingerprint, "rotated the veris ca; clients must trust the new one");
        Ok(Rotated { previous, ca })
    }

    /// The CA, or [`CaError::Expired`] when its validity has ended.
    fn unexpired(self: Box<Self>) -> Result<CertificateAuthority, CaError> {
        if self.not_after <= OffsetDateTime::now_utc() {
            return Err(CaError::Expired {
                path: self.cert_path.clone(),
                not_after: self.not_after.to_string(),
            });
        }
        Ok(*self)
    }

    /// Where the CA certificate in `dir` is (or would be created).
    pub fn cert_path_in(dir: &Path) -> PathBuf {
        dir.join(CA_CERT_FILE)
    }

    /// Reads the CA files and decides whether they can be used.
    fn inspect(dir: &Path) -> Result<Found, CaError> {
        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        let read = |path: &Path| match fs::read_to_string(path) {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) if e.kind() == ErrorKind::InvalidData => Ok(Some(String::new())),
            Err(source) => Err(CaError::Read {
                path: path.to_path_buf(),
                source,
            }),
        };
        let key_meta = match fs::metadata(&key_path) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(source) => {
                return Err(CaError::Read {
                    path: key_path,
                    source,
                })
            }
        };
        let Some(key_meta) = key_meta else {
            return Ok(Found::Regenerate(format!(
                "missing: {}",
                key_path.display()
            )));
        };
        let mode = key_meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(CaError::InsecureKeyPermissions {
                path: key_path,
                mode,
            });
        }
        let Some(cert_pem) = read(&cert_path)? else {
            return Ok(Found::Regenerate(format!(
                "missing: {}",
                cert_path.display()
            )));
        };
        let Some(key_pem) = read(&key_path)? else {
            return Ok(Found::Regenerate(format!(
                "missing: {}",
                key_path.display()
            )));
        };
        match Self::from_pems(cert_path, key_path, cert_pem, &key_pem) {
            Ok(ca) => Ok(Found::Usable(Box::new(ca))),
            Err(why) => Ok(Found::Regenerate(format!("unparsable: {why}"))),
        }
    }

    /// Builds a CA from its PEM files; the error string says what is wrong with them.
    fn from_pems(
        cert_path: PathBuf,
        key_path: PathBuf,
        cert_pem: String,
        key_pem: &str,
    ) -> Result<CertificateAuthority, String> {
        let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
            .map_err(|e| format!("certificate pem: {e}"))?;
        if pem.label != "CERTIFICATE" {
            return Err(format!("certificate pem has label {:?}", pem.label));
        }
        let cert_der = CertificateDer::from(pem.contents);
        let (_, x509) = x509_parser::parse_x509_certificate(&cert_der)
            .map_err(|e| format!("certificate: {e}"))?;
        match x509.basic_constraints() {
            Ok(Some(bc)) if bc.value.ca => {}
            _ => return Err("certificate is not a ca".to_owned()),
        }
        let key = KeyPair::from_pem(key_pem).map_err(|e| format!("key: {e}"))?;
        if key.public_key_raw() != x509.public_key().subject_public_key.data.as_ref() {
            return Err("key does not match certificate".to_owned());
        }
        let subject = x509.subject().to_string();
        let not_before = x509.validity().not_before.to_datetime();
        let not_after = x509.validity().not_after.to_datetime();
        let scope = Scope::from_cert(&x509)?;
        let issuer = rcgen::Issuer::from_ca_cert_der(&cert_der, key)
            .map_err(|e| format!("certificate as issuer: {e}"))?;
        Ok(CertificateAuthority {
            cert_path,
            key_path,
            fingerprint: fingerprint_sha256(&cert_der),
            cert_pem,
            cert_der,
            issuer,
            subject,
            not_before,
            not_after,
            scope,
        })
    }

    /// Generates a new CA with the given validity and scope and writes it atomically into `dir`.
    pub(crate) fn create(
        dir: &Path,
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
        scope: &Scope,
    ) -> Result<CertificateAuthority, CaError> {
        let name_constraints = scope.to_rcgen()?;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(CaError::GenerateCa)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, CA_COMMON_NAME);
        dn.push(DnType::OrganizationName, CA_ORGANIZATION);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.serial_number = Some(random_serial());
        params.not_before = not_before;
        params.not_after = not_after;
        params.name_constraints = Some(name_constraints);
        let cert = params.self_signed(&key).map_err(CaError::GenerateCa)?;

        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        let cert_pem = cert.pem();
        // Key first: a crash between the two writes leaves a mismatched pair, which the next
        // load reports as unparsable and regenerates, rather than a new cert with an old key.
        write_atomic(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
        write_atomic(&cert_path, cert_pem.as_bytes(), 0o644)?;
        let key_pem = key.serialize_pem();
        Self::from_pems(cert_path.clone(), key_path, cert_pem, &key_pem).map_err(|reason| {
            CaError::LoadCa {
                path: cert_path,
                reason,
            }
        })
    }

    /// The CA certificate in PEM form, as written to disk.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate in DER form.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// `<dir>/veris-ca.pem`.
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// `<dir>/veris-ca-key.pem`.
    pub fn key_path(&self) -> &Path {
        &self.key_path
    }

    /// The subject in RFC 4514-like form, e.g. `CN=veris interception CA, O=veris`.
    pub fn subject(&self) -> String {
        self.subject.clone()
    }

    /// SHA-256 of the DER certificate, upper-case hex with colons (as `openssl x509 -fingerprint`).
    pub fn fingerprint_sha256(&self) -> String {
        self.fingerprint.clone()
    }

    /// Start of the CA's validity.
    pub fn not_before(&self) -> OffsetDateTime {
        self.not_before
    }

    /// End of the CA's validity.
    pub fn not_after(&self) -> OffsetDateTime {
        self.not_after
    }

    /// True when the CA's validity ends within [`EXPIRY_WARNING`].
    pub fn expires_soon(&self) -> bool {
        self.not_after - OffsetDateTime::now_utc() <= EXPIRY_WARNING
    }

    /// The names the CA may sign for; `None` for a CA without name constraints (made before
    /// veris constrained its CAs), which can sign for any name.
    pub fn scope(&self) -> Option<&Scope> {
        self.scope.as_ref()
    }

    /// Whether the CA may sign a leaf for `host` (always, without name constraints).
    pub fn permits(&self, host: &str) -> bool {
        self.scope.as_ref().is_none_or(|s| s.permits(host))
    }

    /// Mints a leaf for `host` (DNS name, IPv4 or IPv6 literal without brackets) with its own
    /// fresh P-256 key. The leaf never outlives the CA.
    pub fn mint_leaf(&self, host: &str) -> Result<Leaf, CaError> {
        self.mint_leaf_for(&[host])
    }

    /// Mints one leaf naming every host of `hosts` (DNS names or IP literals; the first is
    /// its common name), as [`CertificateAuthority::mint_leaf`] does for one.
    pub fn mint_leaf_for(&self, hosts: &[&str]) -> Result<Leaf, CaError> {
        let hosts = hosts
            .iter()
            .map(|h| normalize_host(h))
            .collect::<Result<Vec<_>, _>>()?;
        let Some(host) = hosts.first().cloned() else {
            return Err(CaError::InvalidHost {
                host: String::new(),
            });
        };
        // A leaf outside the constraints is one no checking client accepts: refuse to mint it
        // rather than hand out a certificate that only fails later, in the client.
        if let Some(outside) = hosts.iter().find(|h| !self.permits(h)) {
            return Err(CaError::OutsideConstraints {
                host: outside.clone(),
            });
        }
        let mint_err = |source| CaError::MintLeaf {
            host: host.clone(),
            source,
        };
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(mint_err)?;
        let mut params = CertificateParams::default();
        for name in &hosts {
            let san = match name.parse::<IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(name.clone().try_into().map_err(mint_err)?),
            };
            params.subject_alt_names.push(san);
        }
        let mut dn = DistinguishedName::new();
        // ub-common-name is 64; longer hosts live only in the SAN, which is what clients check.
        // An IP address never goes in the common name: OpenSSL checks a dotted common name
        // against the CA's DNS name constraints, and `127.0.0.1` is no permitted DNS name.
        if let Some(cn) = hosts
            .iter()
            .find(|h| h.len() <= 64 && h.parse::<IpAddr>().is_err())
        {
            dn.push(DnType::CommonName, cn.as_str());
        }
        dn.push(DnType::OrganizationName, CA_ORGANIZATION);
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(random_serial());
        let now = OffsetDateTime::now_utc();
        params.not_before = (now - BACKDATE).max(self.not_before);
        params.not_after = (now + LEAF_VALIDITY).min(self.not_after);
        let cert = params.signed_by(&key, &self.issuer).map_err(mint_err)?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok(Leaf {
            chain: vec![cert.der().clone(), self.cert_der.clone()],
            key: key_der,
        })
    }
}

/// A host by the one rule ([`veris_host::Host`]), rejecting what cannot be a certificate
/// name. Cache keys and SANs both use this form.
pub(crate) fn normalize_host(host: &str) -> Result<String, CaError> {
    let invalid = || CaError::InvalidHost {
        host: host.to_owned(),
    };
    let h = veris_host::Host::new(host);
    if h.ip().is_some() {
        return Ok(h.into_string());
    }
    if h.as_str().is_empty() || rustls::pki_types::ServerName::try_from(h.as_str()).is_err() {
        return Err(invalid());
    }
    Ok(h.into_string())
}

/// A random positive 128-bit serial (RFC 5280 allows up to 20 octets; DER adds a sign byte).
fn random_serial() -> SerialNumber {
    let mut bytes = [0u8; 16];
    // SystemRandom failing means the OS RNG is unusable; fall back to a hash of time and a
    // counter so minting still yields distinct serials rather than failing every handshake.
    if aws_lc_rs::rand::fill(&mut bytes).is_err() {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let seed = format!(
            "{:?}{}",
            std::time::SystemTime::now(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, seed.as_bytes());
        bytes.copy_from_slice(&d.as_ref()[..16]);
    }
    if bytes.iter().all(|b| *b == 0) {
        bytes[15] = 1;
    }
    SerialNumber::from_slice(&bytes)
}

/// Upper-case hex SHA-256 with colons, as openssl prints fingerprints.
pub(crate) fn fingerprint_sha256(der: &[u8]) -> String {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, der);
    d.as_ref()
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(names: &[&str]) -> Scope {
        let mut s = Scope::new();
        for n in names {
            s.permit(n).unwrap();
        }
        s
    }

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("veris-ca-unit-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn load_creates_nothing() {
        let dir = temp_dir("loadonly");
        match CertificateAuthority::load(&dir) {
            Err(CaError::NoCa { reason, .. }) => assert!(reason.starts_with("missing"), "{reason}"),
            other => panic!("{other:?}"),
        }
        assert!(!dir.exists(), "load created the CA dir");
        let (made, _) = CertificateAuthority::load_or_create(&dir, &scope(&["a.test"])).unwrap();
        let loaded = CertificateAuthority::load(&dir).unwrap();
        assert_eq!(loaded.fingerprint_sha256(), made.fingerprint_sha256());
        assert_eq!(loaded.cert_path(), CertificateAuthority::cert_path_in(&dir));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn expired_ca_is_refused_until_rotated() {
        let dir = temp_dir("expired");
        ensure_dir(&dir, 0o700).unwrap();
        let now = OffsetDateTime::now_utc();
        let names = scope(&["api.stripe.com"]);
        let old = CertificateAuthority::create(
            &dir,
            now - Duration::days(20),
            now - Duration::days(1),
            &names,
        )
        .unwrap();
        for refused in [
            CertificateAuthority::load_or_create(&dir, &names).map(|_| ()),
            CertificateAuthority::load(&dir).map(|_| ()),
        ] {
            let err = refused.unwrap_err();
            assert!(matches!(err, CaError::Expired { .. }), "{err:?}");
            assert!(err.to_string().contains("veris ca rotate"), "{err}");
        }
        // Nothing was replaced behind the user's back.
        let kept = fs::read_to_string(dir.join(CA_CERT_FILE)).unwrap();
        assert_eq!(kept, old.cert_pem());
        let rotated = CertificateAuthority::rotate(&dir, &names).unwrap();
        let previous = rotated.previous.expect("the expired CA was there");
        assert_eq!(previous.fingerprint, old.fingerprint_sha256());
        assert_eq!(fs::read_to_string(&previous.path).unwrap(), old.cert_pem());
        let ca = rotated.ca;
        assert_ne!(ca.fingerprint_sha256(), old.fingerprint_sha256());
        assert!(ca.not_after() > now + Duration::days(364));
        assert!(ca.not_after() < now + Duration::days(366));
        let (again, outcome) = CertificateAuthority::load_or_create(&dir, &names).unwrap();
        assert_eq!(outcome, LoadOutcome::Loaded);
        assert_eq!(again.fingerprint_sha256(), ca.fingerprint_sha256());
        assert_eq!(again.scope(), Some(&names));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_name_outside_the_constraints_gets_no_leaf() {
        let dir = temp_dir("outside");
        let names = scope(&["api.stripe.com", "127.0.0.0/8"]);
        let (ca, _) = CertificateAuthority::load_or_create(&dir, &names).unwrap();
        assert!(ca.mint_leaf("api.stripe.com").is_ok());
        assert!(ca.mint_leaf("127.0.0.1").is_ok());
        for outside in ["evil.example", "stripe.com", "10.0.0.1", "::1"] {
            let err = ca.mint_leaf(outside).unwrap_err();
            assert!(
                matches!(err, CaError::OutsideConstraints { .. }),
                "{outside}: {err:?}"
            );
        }
        assert!(ca
            .mint_leaf_for(&["api.stripe.com", "evil.example"])
            .is_err());
        // The constraints are in the certificate, critical, as the scope says.
        let (_, x) = x509_parser::parse_x509_certificate(ca.cert_der()).unwrap();
        let ext = x
            .get_extension_unique(&x509_parser::oid_registry::OID_X509_EXT_NAME_CONSTRAINTS)
            .unwrap()
            .unwrap();
        assert!(ext.critical);
        assert_eq!(Scope::from_cert(&x).unwrap(), Some(names));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn leaf_never_outlives_the_ca() {
        let dir = temp_dir("short");
        ensure_dir(&dir, 0o700).unwrap();
        let now = OffsetDateTime::now_utc();
        let ca = CertificateAuthority::create(
            &dir,
            now - BACKDATE,
            now + Duration::days(2),
            &scope(&["example.com"]),
        )
        .unwrap();
        let leaf = ca.mint_leaf("example.com").unwrap();
        let (_, x) = x509_parser::parse_x509_certificate(&leaf.chain[0]).unwrap();
        assert_eq!(x.validity().not_after.to_datetime(), ca.not_after());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn normalize_host_cases() {
        assert_eq!(normalize_host("API.Stripe.com.").unwrap(), "api.stripe.com");
        assert_eq!(normalize_host("[::1]").unwrap(), "::1");
        assert_eq!(normalize_host("2001:DB8::1").unwrap(), "2001:db8::1");
        assert_eq!(normalize_host("10.0.0.1").unwrap(), "10.0.0.1");
        assert!(normalize_host("").is_err());
        assert!(normalize_host("bad host").is_err());
    }

    #[test]
    fn fingerprint_format_matches_openssl() {
        let f = fingerprint_sha256(b"");
        assert_eq!(f.len(), 32 * 3 - 1);
        assert!(f.starts_with("E3:B0:C4:42"));
    }
}
