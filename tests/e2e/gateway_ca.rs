//! One interception CA for a fleet (`veris gateway --ca-dir`): a sandbox
//! trusts one file whichever gateway it reaches, and a gateway never makes
//! a CA of its own in place of the shared one (its sandboxes would then
//! trust a file that no longer names it).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use crate::support::gateway::*;
use crate::support::{self, skip, TempDir};

/// Copies the CA files of `from` into `to`, modes kept.
fn copy_ca(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for f in ["veris-ca.pem", "veris-ca-key.pem"] {
        std::fs::copy(from.join(f), to.join(f)).unwrap();
    }
}

/// Files in `dir`, sorted, with their modes.
fn listing(dir: &Path) -> Vec<(String, u32)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let mode = e.metadata().unwrap().permissions().mode() & 0o7777;
            (e.file_name().to_string_lossy().into_owned(), mode)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn gateways_sharing_a_ca_dir_are_trusted_through_one_file() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let first = Gateway::start("gw-ca-first", "127.0.0.1:0", &[]);
    let shared = TempDir::new("fleet-ca");
    let ca_dir = shared.join("ca");
    copy_ca(&first.state.join("ca"), &ca_dir);
    let before = listing(&ca_dir);

    let second = Gateway::start(
        "gw-ca-second",
        "127.0.0.1:0",
        &["--ca-dir", ca_dir.to_str().unwrap()],
    );
    // The one file a sandbox was given for the first gateway works on the
    // second, and the second publishes that same certificate.
    let sbx = second.add_sandbox("sbx-ca", "stripe");
    charge_ok(
        &sbx.url("socks5h"),
        &first.ca(),
        "second gateway, first's CA",
    );
    assert_eq!(
        std::fs::read(second.ca()).unwrap(),
        std::fs::read(first.ca()).unwrap(),
        "the second gateway publishes another CA"
    );
    assert_eq!(listing(&ca_dir), before, "the shared CA dir was changed");

    // The control: a gateway with its own CA is not trusted through that
    // file (so the charge above proves the sharing, not a lax client).
    let own = Gateway::start("gw-ca-own", "127.0.0.1:0", &[]);
    let other = own.add_sandbox("sbx-own", "stripe");
    let (ok, status, stderr) = curl_charge(&other.url("socks5h"), HTTPS_CHARGES, &first.ca());
    assert!(
        !ok && status != "200",
        "a gateway with its own CA was trusted through the first's file: {status} {stderr}"
    );
}

#[test]
fn a_missing_or_unsafe_shared_ca_stops_the_gateway_and_is_left_alone() {
    let dir = TempDir::new("gw-ca-bad");
    let start = |ca_dir: &Path| {
        support::output_within(
            support::veris(["gateway", "--state-dir"])
                .arg(dir.join("state"))
                .args(["--listen", "127.0.0.1:0", "--ca-dir"])
                .arg(ca_dir),
            Duration::from_secs(60),
        )
    };

    // Empty: no CA is made there.
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let out = start(&empty);
    let (_, stderr) = support::text(&out);
    assert!(!out.status.success(), "started without a CA: {stderr}");
    assert!(
        stderr.contains("--ca-dir") && stderr.contains("Next:"),
        "no clear error: {stderr}"
    );
    assert!(
        listing(&empty).is_empty(),
        "a CA was made in the shared dir"
    );

    // A key others can read: refused, not replaced.
    let first = Gateway::start("gw-ca-src", "127.0.0.1:0", &[]);
    let loose = dir.join("loose");
    copy_ca(&first.state.join("ca"), &loose);
    std::fs::set_permissions(
        loose.join("veris-ca-key.pem"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let before = std::fs::read(loose.join("veris-ca-key.pem")).unwrap();
    let out = start(&loose);
    let (_, stderr) = support::text(&out);
    assert!(
        !out.status.success(),
        "started with a readable key: {stderr}"
    );
    assert_eq!(
        std::fs::read(loose.join("veris-ca-key.pem")).unwrap(),
        before,
        "the shared key was replaced"
    );
}
