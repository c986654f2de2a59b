//! Trust material published for the workload: the bare CA, a bundle, a Java truststore, and
//! the small config files of clients that read no variable naming a CA file (wget, PHP).
//!
//! Everything goes into one directory (0755, files 0644) that an unprivileged workload can read,
//! separate from the 0700 CA dir that holds the key. The bundle is the system roots plus the
//! veris CA (last), for variables such as `SSL_CERT_FILE` that *replace* a client's roots. The
//! truststore holds the same certificates, because `-Djavax.net.ssl.trustStore` replaces Java's
//! defaults too. It is written as JKS by hand (a simple, stable format every JDK reads) rather
//! than pulling in a PKCS#12 implementation. wget (GnuTLS in Debian, deaf to `SSL_CERT_FILE`)
//! reads its CA from a wgetrc, which `WGETRC` names; PHP's openssl and curl extensions read
//! theirs from ini settings, which an extra ini dir on `PHP_INI_SCAN_DIR` supplies.

use std::fs;
use std::path::{Path, PathBuf};

use crate::fsutil::{ensure_dir, write_atomic};
use crate::{CaError, CertificateAuthority};

/// Bundles looked for, in order, when no override is given.
pub const SYSTEM_BUNDLES: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// File names inside the trust dir.
pub const CA_PEM_FILE: &str = "ca.pem";
pub const BUNDLE_FILE: &str = "bundle.pem";
pub const TRUSTSTORE_FILE: &str = "truststore.jks";
pub const WGETRC_FILE: &str = "wgetrc";
/// A directory of its own: `PHP_INI_SCAN_DIR` names directories, and PHP reads every `.ini`
/// in them.
pub const PHP_INI_DIR: &str = "php";
pub const PHP_INI_FILE: &str = "veris.ini";
/// The conventional JDK password; a truststore holds only public certificates, so the password
/// protects integrity against accidental edits, not secrecy.
pub const TRUSTSTORE_PASSWORD: &str = "changeit";

/// Where the published trust material lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustFiles {
    pub dir: PathBuf,
    pub ca_pem: PathBuf,
    pub bundle: PathBuf,
    pub truststore: PathBuf,
    /// wget's startup file (`WGETRC`): `ca_certificate` = the bundle.
    pub wgetrc: PathBuf,
    /// A PHP ini dir (for `PHP_INI_SCAN_DIR`) holding `veris.ini`: `openssl.cafile` and
    /// `curl.cainfo` = the bundle.
    pub php_ini_dir: PathBuf,
    pub truststore_password: String,
    /// "JKS" or "PKCS12".
    pub truststore_type: &'static str,
}

impl TrustFiles {
    /// The paths `publish` writes into `trust_dir`, without writing anything (e.g. for
    /// `veris ca path` or an env file rendered for an existing trust dir).
    pub fn at(trust_dir: &Path) -> TrustFiles {
        TrustFiles {
            dir: trust_dir.to_path_buf(),
            ca_pem: trust_dir.join(CA_PEM_FILE),
            bundle: trust_dir.join(BUNDLE_FILE),
            truststore: trust_dir.join(TRUSTSTORE_FILE),
            wgetrc: trust_dir.join(WGETRC_FILE),
            php_ini_dir: trust_dir.join(PHP_INI_DIR),
            truststore_password: TRUSTSTORE_PASSWORD.to_owned(),
            truststore_type: "JKS",
        }
    }
}

/// First existing of override, then the standard list.
pub fn find_system_bundle(override_path: Option<&Path>) -> Option<PathBuf> {
    override_path
        .into_iter()
        .map(Path::to_path_buf)
        .chain(SYSTEM_BUNDLES.iter().map(PathBuf::from))
        .find(|p| p.is_file())
}

/// Writes ca.pem, bundle.pem, truststore, wgetrc and php/veris.ini into trust_dir (0755 dirs,
/// 0644 files, atomic).
/// Without a system bundle, bundle = the veris CA alone (log a warning).
pub fn publish(
    trust_dir: &Path,
    ca: &CertificateAuthority,
    system_bundle: Option<&Path>,
) -> Result<TrustFiles, CaError> {
    ensure_dir(trust_dir, 0o755)?;
    let files = TrustFiles::at(trust_dir);

    let mut bundle = String::new();
    match system_bundle {
        Some(path) => {
            let system = fs::read_to_string(path).map_err(|source| CaError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            bundle.push_str(&system);
            if !bundle.is_empty() && !bundle.ends_with('\n') {
                bundle.push('\n');
            }
        }
        None => tracing::warn!(
            "no system ca bundle found; {} holds only the veris ca, so clients using it can reach only intercepted hosts",
            files.bundle.display()
        ),
    }
    bundle.push_str("# veris interception CA\n");
    bundle.push_str(ca.cert_pem());
    if !bundle.ends_with('\n') {
        bundle.push('\n');
    }

    // The truststore mirrors the bundle: every certificate that parses, veris CA included.
    let mut certs: Vec<(String, Vec<u8>)> = Vec::new();
    let mut n = 0usize;
    for pem in x509_parser::pem::Pem::iter_from_buffer(bundle.as_bytes()) {
        let Ok(pem) = pem else { break };
        // Java refuses the whole keystore if one certificate in it is malformed.
        if pem.label != "CERTIFICATE" || x509_parser::parse_x509_certificate(&pem.contents).is_err()
        {
            continue;
        }
        if pem.contents.as_slice() == ca.cert_der().as_ref() {
            continue;
        }
        n += 1;
        certs.push((format!("system-{n:04}"), pem.contents));
    }
    certs.push(("veris-ca".to_owned(), ca.cert_der().to_vec()));
    let jks = jks_truststore(&certs, TRUSTSTORE_PASSWORD, now_millis());

    write_atomic(&files.ca_pem, ca.cert_pem().as_bytes(), 0o644)?;
    write_atomic(&files.bundle, bundle.as_bytes(), 0o644)?;
    write_atomic(&files.truststore, &jks, 0o644)?;
    write_atomic(&files.wgetrc, wgetrc(&files.bundle).as_bytes(), 0o644)?;
    ensure_dir(&files.php_ini_dir, 0o755)?;
    write_atomic(
        &files.php_ini_dir.join(PHP_INI_FILE),
        php_ini(&files.bundle).as_bytes(),
        0o644,
    )?;
    tracing::debug!(dir = %trust_dir.display(), system_roots = n, "published trust material");
    Ok(files)
}

/// wget's startup file. The proxy itself comes from the `http_proxy`/`https_proxy`/`no_proxy`
/// variables, which wget reads when `use_proxy` is on: it is said here because a system
/// wgetrc may turn it off, and in the transparent tier (no proxy variables) it changes nothing.
/// `WGETRC` replaces the user's `~/.wgetrc` (the system one is still read first).
pub fn wgetrc(bundle: &Path) -> String {
    format!(
        "# veris: generated, do not edit. wget trusts the veris bundle (system roots + veris CA).\n\
         ca_certificate = {}\n\
         use_proxy = on\n",
        bundle.display()
    )
}

/// PHP's ini settings for its TLS clients: streams (`openssl.cafile`, used by
/// `file_get_contents` and sockets) and the curl extension (`curl.cainfo`; libcurl reads no
/// CA variable of its own).
pub fn php_ini(bundle: &Path) -> String {
    // A double-quoted ini value takes everything up to the next quote literally.
    let path = bundle.display().to_string().replace('"', "");
    format!(
        "; veris: generated, do not edit. PHP trusts the veris bundle (system roots + veris CA).\n\
         openssl.cafile = \"{path}\"\n\
         curl.cainfo = \"{path}\"\n"
    )
}

fn now_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Serializes a JKS keystore holding only trusted-certificate entries.
///
/// Layout (big-endian): magic 0xFEEDFEED, version 2, entry count, then per entry: tag 2,
/// alias (u16 length + modified UTF-8; aliases here are ASCII), creation time in ms, type
/// "X.509", certificate length and DER. The trailer is SHA-1 over the password as UTF-16BE,
/// the string "Mighty Aphrodite" and everything before it — the JDK's integrity check.
pub(crate) fn jks_truststore(certs: &[(String, Vec<u8>)], password: &str, millis: u64) -> Vec<u8> {
    fn put_utf(out: &mut Vec<u8>, s: &str) {
        let b = s.as_bytes();
        // Aliases and the type string are short ASCII; cap defensively at the u16 limit.
        let len = b.len().min(u16::MAX as usize);
        out.extend_from_slice(&(len as u16).to_be_bytes());
        out.extend_from_slice(&b[..len]);
    }
    let mut out = Vec::new();
    out.extend_from_slice(&0xFEED_FEEDu32.to_be_bytes());
    out.extend_from_slice(&2u32.to_be_bytes());
    out.extend_from_slice(&(certs.len() as u32).to_be_bytes());
    for (alias, der) in certs {
        out.extend_from_slice(&2u32.to_be_bytes());
        put_utf(&mut out, &alias.to_ascii_lowercase());
        out.extend_from_slice(&millis.to_be_bytes());
        put_utf(&mut out, "X.509");
        out.extend_from_slice(&(der.len() as u32).to_be_bytes());
        out.extend_from_slice(der);
    }
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY);
    let pw: Vec<u8> = password
        .encode_utf16()
        .flat_map(|u| u.to_be_bytes())
        .collect();
    ctx.update(&pw);
    ctx.update(b"Mighty Aphrodite");
    ctx.update(&out);
    out.extend_from_slice(ctx.finish().as_ref());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jks_layout_is_as_the_jdk_expects() {
        let jks = jks_truststore(&[("A".into(), vec![1, 2, 3])], "changeit", 7);
        assert_eq!(&jks[..4], &[0xFE, 0xED, 0xFE, 0xED]);
        assert_eq!(&jks[4..8], &2u32.to_be_bytes());
        assert_eq!(&jks[8..12], &1u32.to_be_bytes());
        assert_eq!(&jks[12..16], &2u32.to_be_bytes());
        assert_eq!(&jks[16..19], &[0, 1, b'a']);
        assert_eq!(&jks[19..27], &7u64.to_be_bytes());
        assert_eq!(&jks[27..34], b"\0\x05X.509");
        assert_eq!(&jks[34..41], &[0, 0, 0, 3, 1, 2, 3]);
        assert_eq!(jks.len(), 41 + 20);
    }

    #[test]
    fn find_system_bundle_prefers_an_existing_override() {
        let missing = Path::new("/nonexistent/veris/bundle.pem");
        let found = find_system_bundle(Some(missing));
        assert_ne!(found.as_deref(), Some(missing));
        let this_file = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        assert_eq!(find_system_bundle(Some(&this_file)), Some(this_file));
    }
}
