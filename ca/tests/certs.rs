//! Certificate tests: parse what was minted, verify chains with webpki, openssl and curl.

// Test code: a failed unwrap or expect is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;

use ::time::{Duration, OffsetDateTime};
use common::{clean_command, have_tool, Scratch};
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use veris_ca::{CertificateAuthority, Issuer};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::*;

fn ca(scratch: &Scratch) -> CertificateAuthority {
    CertificateAuthority::load_or_create(&scratch.path().join("ca"), &common::scope())
        .unwrap()
        .0
}

#[test]
fn ca_certificate_is_a_constrained_p256_ca() {
    let s = Scratch::new("ca-fields");
    let before = OffsetDateTime::now_utc();
    let ca = ca(&s);
    let (_, x) = parse_x509_certificate(ca.cert_der()).unwrap();
    assert!(
        ca.subject().contains("CN=veris interception CA"),
        "{}",
        ca.subject()
    );
    assert_eq!(x.subject().to_string(), x.issuer().to_string());
    let bc = x.basic_constraints().unwrap().unwrap();
    assert!(bc.critical);
    assert!(bc.value.ca);
    assert_eq!(bc.value.path_len_constraint, Some(0));
    let ku = x.key_usage().unwrap().unwrap().value;
    assert!(ku.key_cert_sign() && ku.crl_sign());
    assert!(!ku.digital_signature());
    // P-256 public key: uncompressed point, 65 bytes.
    assert_eq!(
        x.public_key().algorithm.algorithm.to_id_string(),
        "1.2.840.10045.2.1"
    );
    assert_eq!(x.public_key().subject_public_key.data.len(), 65);
    // Backdated five minutes (second precision in the certificate).
    let nb = x.validity().not_before.to_datetime();
    let backdate = before - nb;
    assert!(
        backdate >= Duration::minutes(5) - Duration::seconds(1),
        "{backdate}"
    );
    assert!(
        backdate <= Duration::minutes(5) + Duration::seconds(60),
        "{backdate}"
    );
    assert_eq!(nb, ca.not_before());
    assert_eq!(x.validity().not_after.to_datetime(), ca.not_after());
    // Random 128-bit serial: 16 bytes (a leading zero byte may be dropped by DER rarely).
    assert!(x.raw_serial().len() >= 15 && x.raw_serial().len() <= 17);
    // Fingerprint is SHA-256 of the DER, upper-case with colons.
    let fp = ca.fingerprint_sha256();
    assert_eq!(fp.len(), 95);
    assert_eq!(fp, fp.to_uppercase());
}

fn sans(x: &X509Certificate<'_>) -> Vec<String> {
    x.subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .map(|g| match g {
            GeneralName::DNSName(d) => format!("dns:{d}"),
            GeneralName::IPAddress(b) => {
                let ip: IpAddr = match b.len() {
                    4 => <[u8; 4]>::try_from(*b).unwrap().into(),
                    16 => <[u8; 16]>::try_from(*b).unwrap().into(),
                    n => panic!("ip san of {n} bytes"),
                };
                format!("ip:{ip}")
            }
            other => panic!("unexpected san {other:?}"),
        })
        .collect()
}

#[test]
fn leaves_have_exact_san_server_auth_and_30_day_validity() {
    let s = Scratch::new("leaf-fields");
    let ca = ca(&s);
    let (_, cax) = parse_x509_certificate(ca.cert_der()).unwrap();
    let ca_spki = cax.public_key().raw.to_vec();
    let cases = [
        ("api.stripe.com", "dns:api.stripe.com"),
        ("127.0.0.1", "ip:127.0.0.1"),
        ("::1", "ip:::1"),
        ("2001:db8::42", "ip:2001:db8::42"),
    ];
    let mut serials = HashSet::new();
    let mut keys = HashSet::new();
    for (host, want) in cases {
        let before = OffsetDateTime::now_utc();
        let leaf = ca.mint_leaf(host).unwrap();
        assert_eq!(leaf.chain.len(), 2);
        assert_eq!(&leaf.chain[1], ca.cert_der());
        let (_, x) = parse_x509_certificate(&leaf.chain[0]).unwrap();
        assert_eq!(sans(&x), vec![want.to_owned()], "{host}");
        let eku = x.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth);
        assert!(!eku.client_auth && !eku.any && eku.other.is_empty());
        let bc = x.basic_constraints().unwrap().unwrap().value;
        assert!(!bc.ca);
        assert_eq!(x.issuer().to_string(), cax.subject().to_string());
        let nb = x.validity().not_before.to_datetime();
        let na = x.validity().not_after.to_datetime();
        assert_eq!(na - nb, Duration::days(30) + Duration::minutes(5));
        assert!(before - nb >= Duration::minutes(5) - Duration::seconds(1));
        assert!(before - nb <= Duration::minutes(5) + Duration::seconds(60));
        assert_ne!(
            x.public_key().raw,
            ca_spki.as_slice(),
            "leaf must not reuse the ca key"
        );
        assert!(keys.insert(x.public_key().raw.to_vec()));
        assert!(serials.insert(x.raw_serial().to_vec()));
    }
    // Serials and keys stay unique over many mints of the same host.
    for _ in 0..50 {
        let leaf = ca.mint_leaf("api.stripe.com").unwrap();
        let (_, x) = parse_x509_certificate(&leaf.chain[0]).unwrap();
        assert!(serials.insert(x.raw_serial().to_vec()), "duplicate serial");
        assert!(keys.insert(x.public_key().raw.to_vec()), "duplicate key");
    }
}

#[test]
fn invalid_hosts_are_refused() {
    let s = Scratch::new("leaf-invalid");
    let ca = ca(&s);
    for bad in ["", "has space.com", "a..b", "[::1"] {
        assert!(ca.mint_leaf(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn webpki_verifies_leaf_chain_with_ca_as_only_root() {
    let s = Scratch::new("webpki");
    let ca = ca(&s);
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert_der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .unwrap();
    for host in ["api.stripe.com", "www.googleapis.com", "127.0.0.1", "::1"] {
        let leaf = ca.mint_leaf(host).unwrap();
        let name = ServerName::try_from(host.to_owned()).unwrap();
        verifier
            .verify_server_cert(
                &leaf.chain[0],
                &leaf.chain[1..],
                &name,
                &[],
                UnixTime::now(),
            )
            .unwrap_or_else(|e| panic!("{host}: {e}"));
        // The leaf is for that host only.
        let other = ServerName::try_from("evil.example.com").unwrap();
        assert!(verifier
            .verify_server_cert(
                &leaf.chain[0],
                &leaf.chain[1..],
                &other,
                &[],
                UnixTime::now()
            )
            .is_err());
    }
    // A chain from a different CA is rejected.
    let s2 = Scratch::new("webpki-other");
    let other_ca = CertificateAuthority::load_or_create(s2.path(), &common::scope())
        .unwrap()
        .0;
    let leaf = other_ca.mint_leaf("api.stripe.com").unwrap();
    let name = ServerName::try_from("api.stripe.com").unwrap();
    assert!(verifier
        .verify_server_cert(
            &leaf.chain[0],
            &leaf.chain[1..],
            &name,
            &[],
            UnixTime::now()
        )
        .is_err());
}

fn pem(der: &CertificateDer<'_>) -> String {
    let b64 = base64(der.as_ref());
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap());
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn openssl_verifies_leaf_for_dns_and_ip_hosts() {
    if !have_tool("openssl", "version") {
        return;
    }
    let s = Scratch::new("openssl");
    let ca = ca(&s);
    for (host, flag) in [
        ("api.stripe.com", "-verify_hostname"),
        ("127.0.0.1", "-verify_ip"),
        ("::1", "-verify_ip"),
    ] {
        let leaf = ca.mint_leaf(host).unwrap();
        let leaf_path = s.path().join("leaf.pem");
        std::fs::write(&leaf_path, pem(&leaf.chain[0])).unwrap();
        let out = clean_command("openssl")
            .args([
                "verify",
                "-x509_strict",
                "-no-CApath",
                "-purpose",
                "sslserver",
                "-CAfile",
            ])
            .arg(ca.cert_path())
            .args([flag, host])
            .arg(&leaf_path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains(": OK"),
            "{host}: {text}"
        );
        // A different name must fail.
        let out = clean_command("openssl")
            .args(["verify", "-no-CApath", "-CAfile"])
            .arg(ca.cert_path())
            .args(["-verify_hostname", "other.example.com"])
            .arg(&leaf_path)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{host}: wrong name accepted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_trusts_a_rustls_server_using_minted_leaves() {
    if !have_tool("curl", "--version") {
        return;
    }
    let s = Scratch::new("curl");
    let ca = Arc::new(ca(&s));
    let issuer = Arc::new(Issuer::new(Arc::clone(&ca), Issuer::DEFAULT_CAPACITY));
    let port = common::serve_hello(Arc::clone(&issuer)).await;

    for (url, resolve) in [
        (
            format!("https://api.stripe.com:{port}/v1/charges"),
            Some(format!("api.stripe.com:{port}:127.0.0.1")),
        ),
        (format!("https://127.0.0.1:{port}/"), None),
    ] {
        let mut cmd = clean_command("curl");
        cmd.args(["-sS", "--noproxy", "*", "--cacert"])
            .arg(ca.cert_path());
        if let Some(r) = &resolve {
            cmd.args(["--resolve", r]);
        }
        cmd.arg(&url);
        let out = tokio::process::Command::from(cmd).output().await.unwrap();
        assert!(
            out.status.success(),
            "{url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, b"hello", "{url}");
    }
    assert_eq!(issuer.minted(), 2);

    // Without our CA, curl refuses the leaf: the trust really comes from the CA.
    let empty = s.path().join("empty.pem");
    let other = CertificateAuthority::load_or_create(&s.path().join("other"), &common::scope())
        .unwrap()
        .0;
    std::fs::write(&empty, other.cert_pem()).unwrap();
    let mut cmd = clean_command("curl");
    cmd.args(["-sS", "--noproxy", "*", "--cacert"])
        .arg(&empty)
        .args(["--resolve", &format!("api.stripe.com:{port}:127.0.0.1")])
        .arg(format!("https://api.stripe.com:{port}/"));
    let out = tokio::process::Command::from(cmd).output().await.unwrap();
    assert!(!out.status.success());
}

/// A leaf the CA's key signs for `host`, made directly with rcgen: what a
/// thief holding the key could make, bypassing veris's own refusal.
fn forged_leaf(ca: &CertificateAuthority, host: &str) -> CertificateDer<'static> {
    let key_pem = std::fs::read_to_string(ca.key_path()).unwrap();
    let ca_key = rcgen::KeyPair::from_pem(&key_pem).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_der(ca.cert_der(), ca_key).unwrap();
    let mut params = rcgen::CertificateParams::new(vec![host.to_owned()]).unwrap();
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = rcgen::KeyPair::generate().unwrap();
    params.signed_by(&key, &issuer).unwrap().der().clone()
}

#[test]
fn webpki_refuses_a_leaf_outside_the_name_constraints() {
    let s = Scratch::new("webpki-constraints");
    let scope = veris_ca::Scope::of(&["api.stripe.com", "127.0.0.0/8", "::1"]).unwrap();
    let ca = CertificateAuthority::load_or_create(&s.path().join("ca"), &scope)
        .unwrap()
        .0;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert_der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .unwrap();
    let verify = |leaf: &CertificateDer<'static>, host: &str| {
        verifier.verify_server_cert(
            leaf,
            &[ca.cert_der().clone()],
            &ServerName::try_from(host.to_owned()).unwrap(),
            &[],
            UnixTime::now(),
        )
    };
    // Inside: accepted, whether veris or the key's holder made the leaf.
    for host in ["api.stripe.com", "127.0.0.1"] {
        verify(&forged_leaf(&ca, host), host).unwrap_or_else(|e| panic!("{host}: {e}"));
        verify(&ca.mint_leaf(host).unwrap().chain[0], host)
            .unwrap_or_else(|e| panic!("{host}: {e}"));
    }
    // Outside: veris mints nothing, and a leaf made with the key is refused.
    for host in ["evil.example.com", "stripe.com", "10.0.0.1", "2001:db8::1"] {
        assert!(ca.mint_leaf(host).is_err(), "{host}: veris minted it");
        let err = verify(&forged_leaf(&ca, host), host).expect_err(host);
        assert!(
            format!("{err:?}").contains("NameConstraint"),
            "{host}: {err:?}"
        );
    }
}
