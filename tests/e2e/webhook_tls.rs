//! `https://` webhook URLs (W1, issue #31; E2B exposes a sandbox's port as
//! an https URL): the event is delivered over TLS, the app's certificate
//! verified against the system's roots and `--webhook-ca`, and the official
//! `stripe` SDK verifies the signature in an app served over HTTPS.
//! Attacks: an app whose certificate no trusted CA signed, or one signed
//! for another name, gets nothing: each attempt is a failed delivery on
//! record with a reason naming the certificate (no status the app could
//! have given), and nothing counts toward `--require-callback`.

use crate::support;
use crate::webhook::{callbacks, free_port, ledger, run_app, tools, verified_charge_callback};

use std::path::{Path, PathBuf};
use std::process::Stdio;

use support::{command, skip, text, TempDir};

/// A CA and an app certificate it signed for `127.0.0.1` (IP SAN) under
/// `dir`: (CA, app certificate, app key).
fn mint(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let p = |name: &str| dir.join(name);
    let run = |args: &[&str]| {
        let out = command("openssl")
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()
            .expect("running openssl");
        assert!(out.status.success(), "openssl {args:?}: {:?}", text(&out));
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-days",
        "1",
        "-subj",
        "/CN=veris test app CA",
        "-keyout",
        "ca-key.pem",
        "-out",
        "ca.pem",
    ]);
    run(&ca);
    let mut csr = vec!["req"];
    csr.extend(ec);
    csr.extend([
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "app-key.pem",
        "-out",
        "app.csr",
    ]);
    run(&csr);
    std::fs::write(
        p("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "app.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca-key.pem",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "ext.cnf",
        "-out",
        "app.pem",
    ]);
    (p("ca.pem"), p("app.pem"), p("app-key.pem"))
}

fn openssl() -> Result<(), String> {
    if support::tool_works("openssl", &["version"]) {
        Ok(())
    } else {
        Err("openssl not installed".into())
    }
}

/// The app's HTTPS server, with `extra` flags: `veris run` in the explicit
/// tier requiring a callback on `/webhook`.
fn run_tls(dir: &TempDir, url: &str, extra: &[&str], port: u16) -> std::process::Output {
    let (_, cert, key) = (
        dir.join("ca.pem"),
        dir.join("app.pem"),
        dir.join("app-key.pem"),
    );
    let hook = format!("stripe={url}");
    let mut flags = vec!["--webhook", hook.as_str(), "--require-callback", "/webhook"];
    flags.extend_from_slice(extra);
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    run_app(
        dir,
        &flags,
        &[format!("{port}:ok")],
        &[
            ("APP_TLS_CERT", cert.as_str()),
            ("APP_TLS_KEY", key.as_str()),
            ("APP_WAIT", "4"),
        ],
    )
}

#[test]
fn an_https_app_verifies_the_event_delivered_over_tls() {
    if let Err(why) = tools().and_then(|()| openssl()) {
        return skip(&why);
    }
    let dir = TempDir::new("webhook-tls");
    let (ca, _, _) = mint(dir.path());
    let port = free_port();
    let url = format!("https://127.0.0.1:{port}/webhook");
    let ca = ca.display().to_string();
    let out = run_tls(&dir, &url, &["--webhook-ca", &ca], port);
    let charge = verified_charge_callback(&out, &dir);
    assert_eq!(
        (&charge["status"], &charge["tls"]),
        (&200.into(), &true.into()),
        "{charge}"
    );
}

/// Without `--webhook-ca` the app's certificate chains to no trusted root;
/// with it, a certificate for 127.0.0.1 does not vouch for `localhost`.
/// Either way the app receives nothing, every attempt says why, and the
/// requirement fails.
#[test]
fn an_untrusted_or_misnamed_certificate_fails_the_delivery_with_its_reason() {
    if let Err(why) = tools().and_then(|()| openssl()) {
        return skip(&why);
    }
    let dir = TempDir::new("webhook-tls-untrusted");
    let (ca, _, _) = mint(dir.path());
    let ca = ca.display().to_string();
    let port = free_port();
    let cases: [(String, Vec<&str>, &str); 2] = [
        (
            format!("https://127.0.0.1:{port}/webhook"),
            vec![],
            "UnknownIssuer",
        ),
        (
            format!("https://localhost:{port}/webhook"),
            vec!["--webhook-ca", ca.as_str()],
            "NotValidForName",
        ),
    ];
    for (url, extra, why) in cases {
        let _ = std::fs::remove_dir_all(dir.join("state"));
        let out = run_tls(&dir, &url, &extra, port);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(3), "{url}: {stdout}\n{stderr}");
        assert!(
            !stdout.contains("verified"),
            "{url}: the app got an event: {stdout}"
        );
        assert!(
            stderr.contains("no answer (tls: the app's certificate was not accepted"),
            "{url}: the receipt says why: {stderr}"
        );
        let lines = ledger(&dir);
        let calls = callbacks(&lines);
        assert!(!calls.is_empty(), "{url}: no attempt on record");
        for c in &calls {
            assert!(c["status"].is_null(), "{url}: a status: {c}");
            let error = c["error"].as_str().unwrap_or_default();
            assert!(
                error.contains("certificate was not accepted") && error.contains(why),
                "{url}: {c}"
            );
            assert_eq!(c["tls"], true, "{c}");
        }
    }
}
