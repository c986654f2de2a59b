//! Persistence tests: modes, reuse, refusal of readable keys, regeneration and its reasons.

// Test code: a failed unwrap or expect is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;

use common::Scratch;
use veris_ca::{CaError, CertificateAuthority, LoadOutcome};

fn mode(p: &std::path::Path) -> u32 {
    fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn first_load_creates_files_with_their_modes() {
    let s = Scratch::new("store-create");
    let dir = s.path().join("state").join("ca");
    let (ca, outcome) = CertificateAuthority::load_or_create(&dir, &common::scope()).unwrap();
    match outcome {
        LoadOutcome::Created { reason } => assert!(reason.starts_with("missing"), "{reason}"),
        LoadOutcome::Loaded => panic!("nothing to load"),
    }
    assert_eq!(ca.cert_path(), dir.join("veris-ca.pem"));
    assert_eq!(ca.key_path(), dir.join("veris-ca-key.pem"));
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(ca.cert_path()), 0o644);
    assert_eq!(mode(ca.key_path()), 0o600);
    assert_eq!(fs::read_to_string(ca.cert_path()).unwrap(), ca.cert_pem());
    let key = fs::read_to_string(ca.key_path()).unwrap();
    assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"));
    // Only the two files: temp files were renamed, not left behind.
    let mut names: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["veris-ca-key.pem", "veris-ca.pem"]);
}

#[test]
fn second_load_reuses_the_same_ca() {
    let s = Scratch::new("store-reuse");
    let (a, _) = CertificateAuthority::load_or_create(s.path(), &common::scope()).unwrap();
    let (b, outcome) = CertificateAuthority::load_or_create(s.path(), &common::scope()).unwrap();
    assert_eq!(outcome, LoadOutcome::Loaded);
    assert_eq!(a.fingerprint_sha256(), b.fingerprint_sha256());
    assert_eq!(a.cert_pem(), b.cert_pem());
    assert_eq!(a.not_after(), b.not_after());
    // Leaves minted by the reloaded CA chain to the same certificate.
    assert_eq!(&b.mint_leaf("example.com").unwrap().chain[1], a.cert_der());
}

#[test]
fn group_or_world_readable_key_is_refused_with_a_fix() {
    let s = Scratch::new("store-perms");
    let (ca, _) = CertificateAuthority::load_or_create(s.path(), &common::scope()).unwrap();
    for bad in [0o644, 0o640, 0o604] {
        fs::set_permissions(ca.key_path(), fs::Permissions::from_mode(bad)).unwrap();
        let err = CertificateAuthority::load_or_create(s.path(), &common::scope()).unwrap_err();
        match &err {
            CaError::InsecureKeyPermissions { path, mode } => {
                assert_eq!(path, ca.key_path());
                assert_eq!(*mode, bad);
            }
            other => panic!("unexpected error {other:?}"),
        }
        let msg = err.to_string();
        assert!(msg.contains("chmod 600"), "{msg}");
        assert!(msg.contains(&ca.key_path().display().to_string()), "{msg}");
    }
    // The refused key was left as it was, not replaced.
    fs::set_permissions(ca.key_path(), fs::Permissions::from_mode(0o600)).unwrap();
    let (again, outcome) =
        CertificateAuthority::load_or_create(s.path(), &common::scope()).unwrap();
    assert_eq!(outcome, LoadOutcome::Loaded);
    assert_eq!(again.fingerprint_sha256(), ca.fingerprint_sha256());
}

#[test]
fn loose_dir_mode_is_tightened() {
    let s = Scratch::new("store-dirmode");
    fs::set_permissions(s.path(), fs::Permissions::from_mode(0o755)).unwrap();
    CertificateAuthority::load_or_create(s.path(), &common::scope()).unwrap();
    assert_eq!(mode(s.path()), 0o700);
}

#[test]
fn missing_or_unparsable_files_regenerate_and_say_why() {
    let s = Scratch::new("store-regen");
    let (first, _) = CertificateAuthority::load_or_create(s.path(), &common::scope()).unwrap();

    fs::remove_file(first.cert_path()).unwrap();
    let (second, outcome) =
        CertificateAuthority::load_or_create(s.path(), &common::scope()).unwrap();
    assert!(
        matches!(&outcome, LoadOutcome::Created { reason } if reason.starts_with("missing") && reason.contains("veris-ca.pem")),
        "{outcome:?}"
    );
    assert_ne!(second.fingerprint_sha256(), first.fingerprint_sha256());

    fs::write(second.cert_path(), "not a certificate").unwrap();
    let (third, outcome) =
        CertificateAuthority::load_or_create(s.path(), &common::scope()).unwrap();
    assert!(
        matches!(&outcome, LoadOutcome::Created { reason } if reason.starts_with("unparsable")),
        "{outcome:?}"
    );
    assert_ne!(third.fingerprint_sha256(), second.fingerprint_sha256());

    fs::write(third.key_path(), "garbage").unwrap();
    let (fourth, outcome) =
        CertificateAuthority::load_or_create(s.path(), &common::scope()).unwrap();
    assert!(
        matches!(&outcome, LoadOutcome::Created { reason } if reason.starts_with("unparsable: key")),
        "{outcome:?}"
    );
    assert_eq!(mode(fourth.key_path()), 0o600);

    // A key from another CA does not match the certificate.
    let other = Scratch::new("store-regen-other");
    let (o, _) = CertificateAuthority::load_or_create(other.path(), &common::scope()).unwrap();
    fs::copy(o.key_path(), fourth.key_path()).unwrap();
    let (_, outcome) = CertificateAuthority::load_or_create(s.path(), &common::scope()).unwrap();
    assert!(
        matches!(&outcome, LoadOutcome::Created { reason } if reason.contains("does not match")),
        "{outcome:?}"
    );

    fs::remove_file(fourth.key_path()).unwrap();
    let (_, outcome) = CertificateAuthority::load_or_create(s.path(), &common::scope()).unwrap();
    assert!(
        matches!(&outcome, LoadOutcome::Created { reason } if reason.starts_with("missing") && reason.contains("veris-ca-key.pem")),
        "{outcome:?}"
    );
}

/// The process umask, from /proc (Linux); None elsewhere.
fn umask() -> Option<u32> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Umask:"))?;
    u32::from_str_radix(line.trim_start_matches("Umask:").trim(), 8).ok()
}

#[test]
fn parents_of_the_ca_dir_keep_the_ordinary_mode() {
    let s = Scratch::new("store-parents");
    let state = s.path().join("state");
    CertificateAuthority::load_or_create(&state.join("ca"), &common::scope()).unwrap();
    assert_eq!(mode(&state.join("ca")), 0o700);
    let Some(umask) = umask() else {
        println!("SKIP: no /proc/self/status umask");
        common::record_skip("no /proc/self/status umask");
        return;
    };
    // `<state>` must stay traversable so the workload can read `<state>/trust`.
    assert_eq!(mode(&state), 0o777 & !umask);
}
