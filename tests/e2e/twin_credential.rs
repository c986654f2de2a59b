//! The twin only executes vendor requests that carry the proxy's credential:
//! a workload that calls the twin's port directly can neither fake a vendor
//! call nor write a row into the log the receipt's cross-check reads.
//! Covered for the built-in twin of `veris serve` (a fresh credential per
//! start) and for `veris twin --credential-env` behind a configured proxy.

use crate::support;

use std::net::SocketAddr;
use std::process::Stdio;

use support::{http, output, text, veris, wait_json_file, Guard, Serve, TempDir, DEADLINE};

const FORM: &str = "Content-Type: application/x-www-form-urlencoded\r\n";
const CHARGE: &str = "amount=2000&currency=usd";

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("{e}: {s}"))
}

fn addr_of(url: &str) -> SocketAddr {
    url.trim_start_matches("http://")
        .parse()
        .unwrap_or_else(|e| panic!("{url} is not http://<addr>: {e}"))
}

/// Rows of a twin log answer that are vendor traffic (not control reads).
fn vendor_rows(log: &serde_json::Value) -> Vec<serde_json::Value> {
    log["requests"]
        .as_array()
        .expect("requests array")
        .iter()
        .filter(|r| r["tier"] != "control")
        .cloned()
        .collect()
}

/// What a workload can try against the twin's port: no credential, a guess,
/// and a guess in the header the proxy uses for the client's own value.
fn direct_attempts() -> Vec<String> {
    vec![
        String::new(),
        format!("Authorization: Bearer {}\r\n", "0".repeat(64)),
        format!(
            "X-Veris-Original-Authorization: Bearer {}\r\n",
            "0".repeat(64)
        ),
    ]
}

#[test]
fn the_builtin_twin_answers_only_its_proxy() {
    let mut serve = Serve::start("twin-credential", &[]);
    let twin = addr_of(&serve.twin);
    let sandbox = serve.ready["sandbox_id"].as_str().unwrap_or("sbx_local");
    let direct = format!("/s/{sandbox}/stripe/v1/charges");

    for extra in direct_attempts() {
        let headers = format!("{FORM}{extra}");
        let (status, body) = http(twin, "POST", &direct, "127.0.0.1", &headers, CHARGE);
        assert_eq!(status, 401, "direct call with {extra:?}: {body}");
        let v = json(&body);
        assert_eq!(v["error"], "twin_unauthorized");
        assert!(v["message"].as_str().unwrap_or("").contains("Next:"), "{v}");
    }
    let log = serve.twin_requests("stripe");
    assert!(
        vendor_rows(&log).is_empty(),
        "a direct call left a row in the twin's log: {log}"
    );

    // The same call through the proxy: executed and logged, once.
    let (status, body) = http(
        serve.proxy_addr(),
        "POST",
        "http://api.stripe.com/v1/charges",
        "api.stripe.com",
        FORM,
        CHARGE,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["amount"], 2000);
    let rows = vendor_rows(&serve.twin_requests("stripe"));
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (
            rows[0]["method"].as_str(),
            rows[0]["path"].as_str(),
            rows[0]["status"].as_u64()
        ),
        (Some("POST"), Some("/v1/charges"), Some(200))
    );

    // Neither file the workload reads names a twin credential.
    let secretish = |name: &str| {
        let name = name.to_ascii_lowercase();
        ["credential", "auth", "secret"]
            .iter()
            .any(|w| name.contains(w))
    };
    let ready = serve.ready.as_object().expect("ready file is an object");
    assert!(
        !ready.keys().any(|k| secretish(k)),
        "ready file: {:?}",
        ready.keys()
    );
    let env = std::fs::read_to_string(&serve.env_file).expect("env file");
    for line in env.lines() {
        let name = line
            .trim_start_matches("export ")
            .split('=')
            .next()
            .unwrap_or("");
        assert!(!secretish(name), "env file sets {name}");
    }
    serve.stop();
    let requests = serve
        .ledger_lines()
        .into_iter()
        .filter(|l| l["kind"] == "request")
        .count();
    assert_eq!(requests, 1, "only the proxied call is a ledger request");
}

/// `veris twin --credential-env VAR` on port 0; (process, base URL).
fn start_twin(var: &str, value: &str) -> (Guard, String) {
    let mut cmd = veris(["twin", "--listen", "127.0.0.1:0", "--credential-env", var]);
    cmd.env(var, value);
    support::spawn_twin(&mut cmd)
}

#[test]
fn veris_twin_with_a_credential_env_serves_only_a_proxy_configured_with_it() {
    let secret = "3f9c0c5e2b7d4a1e8f6b0d2c4a6e8f1b3d5c7e9f0a2b4c6d8e0f1a3b5c7d9e1f";
    let (mut twin_process, twin) = start_twin("TWIN_SECRET", secret);
    let twin_addr = addr_of(&twin);
    let direct = "/s/sbx_ext/stripe/v1/charges";
    for extra in direct_attempts() {
        let headers = format!("{FORM}{extra}");
        let (status, body) = http(twin_addr, "POST", direct, "127.0.0.1", &headers, CHARGE);
        assert_eq!(status, 401, "{body}");
    }
    let with_secret = format!("{FORM}Authorization: Bearer {secret}\r\n");
    let (status, body) = http(twin_addr, "POST", direct, "127.0.0.1", &with_secret, CHARGE);
    assert_eq!(status, 200, "{body}");

    // A proxy configured with the same variable gets through.
    let dir = TempDir::new("twin-credential-ext");
    let config = dir.join("veris.json");
    let cfg = serde_json::json!({
        "version": 1,
        "listen": "127.0.0.1:0",
        "sandbox_id": "sbx_ext",
        "upstream": {"base_url": twin, "auth_value_env": "TWIN_SECRET"},
        "services": [{"name": "stripe", "hosts": ["api.stripe.com"]}],
    });
    std::fs::write(&config, cfg.to_string()).expect("config written");
    let ready_file = dir.join("ready.json");
    let mut cmd = veris(["serve", "--state-dir"]);
    cmd.arg(dir.join("state"))
        .arg("--config")
        .arg(&config)
        .arg("--ready-file")
        .arg(&ready_file)
        .env("TWIN_SECRET", secret)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("serve.stderr")).expect("stderr file"));
    let mut serve = Guard::spawn(&mut cmd);
    let ready = wait_json_file(&ready_file, DEADLINE);
    assert_eq!(ready["twin"], twin.as_str());
    let proxy = addr_of(ready["proxy_url"].as_str().expect("proxy_url"));
    let (status, body) = http(
        proxy,
        "POST",
        "http://api.stripe.com/v1/charges",
        "api.stripe.com",
        FORM,
        CHARGE,
    );
    assert_eq!(status, 200, "{body}");
    let (_, log) = http(
        twin_addr,
        "GET",
        "/s/sbx_ext/stripe/veris/requests?limit=1000",
        "127.0.0.1",
        "",
        "",
    );
    let rows = vendor_rows(&json(&log));
    assert_eq!(
        rows.len(),
        2,
        "the direct call with the secret and the proxied one: {rows:?}"
    );
    serve.signal("TERM");
    assert!(serve.wait_timeout(DEADLINE).is_some(), "serve stopped");
    let stderr = std::fs::read_to_string(dir.join("serve.stderr")).unwrap_or_default();
    assert!(!stderr.contains(secret), "the proxy logged the credential");
    twin_process.signal("TERM");
    assert!(
        twin_process.wait_timeout(DEADLINE).is_some(),
        "twin stopped"
    );
}

#[test]
fn veris_twin_refuses_to_start_without_its_credential_variable() {
    let out = output(&mut veris([
        "twin",
        "--listen",
        "127.0.0.1:0",
        "--credential-env",
        "VERIS_TEST_UNSET_SECRET",
    ]));
    let (stdout, stderr) = text(&out);
    assert_ne!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stderr.contains("VERIS_TEST_UNSET_SECRET"), "{stderr}");
    assert!(stderr.contains("Next:"), "{stderr}");
    assert!(stdout.is_empty(), "no URL printed: {stdout}");

    let mut cmd = veris([
        "twin",
        "--listen",
        "127.0.0.1:0",
        "--credential-env",
        "WEAK_SECRET",
    ]);
    cmd.env("WEAK_SECRET", "has a space");
    let out = output(&mut cmd);
    let (_, stderr) = text(&out);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr.contains("WEAK_SECRET") && !stderr.contains("has a space"),
        "names the variable, never the value: {stderr}"
    );
}
