//! H2: the transparent tier with no way around it. Inside a namespace the
//! test creates (root mode: the sink namespace behind the TEST-NET routes
//! holds a fake vendor that logs every hit), an unprivileged workload tries
//! the ways out the default rules must close: TLS on a port that is not 443,
//! UDP to another port, DNS to an outside resolver. Each is either caught and
//! recorded (the fake vendor saw nothing) or named in the receipt's leaks.
//! Narrower rules show in the leaks; a killed proxy fails closed; rules
//! deleted during a run fail its receipt.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::netns::*;

const CLIENT_TIMEOUT: Duration = Duration::from_secs(20);
/// Sends one UDP datagram from the workload to `VENDOR_V4:port`.
fn udp_send(ns: &Netns, port: u16) {
    // The output hook's drop surfaces as EPERM to a local sender.
    let code = format!(
        "import socket\ns=socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ntry:\n    s.sendto(b'hello', ('{VENDOR_V4}', {port}))\nexcept PermissionError:\n    print('dropped')"
    );
    let out = ns.output(workload(ns, "python3").args(["-c", &code]), CLIENT_TIMEOUT);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn receipt_json(ns: &Netns, state: &Path) -> (Value, Option<i32>) {
    let out = ns.output(
        ns.command(bin())
            .args(["receipt", "--json", "--state-dir"])
            .arg(state),
        CLIENT_TIMEOUT,
    );
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "receipt JSON: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (v, out.status.code())
}

fn leaks(receipt: &Value) -> Vec<String> {
    receipt["leaks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect()
}

fn wait_for_line(state: &Path, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(l) = ledger(state).into_iter().find(|l| f(l)) {
            return l;
        }
        assert!(
            Instant::now() < deadline,
            "no {what} line within {DEADLINE:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_unprivileged_workload_finds_no_way_out() {
    if let Some(why) = sink_unavailable() {
        return skip(&why);
    }
    let dir = TempDir::new("egress");
    let ns = Netns::create("egress");
    let vendor = FakeVendor::start(&ns, &dir, "8443,2222", "8443,53,443");
    let veris = Veris::start(&ns, &dir, &["--workload-uid", &WORKLOAD_UID.to_string()]);
    let ca = veris.ca();
    // The workload must read the CA to trust it.
    readable(&dir);

    // TLS to a vendor on a port that is not 443: caught, served by the twin.
    let out = ns.output(
        workload(&ns, "curl")
            .args(["-sS", "--max-time", "10", "--cacert"])
            .arg(&ca)
            .args([
                "--resolve",
                &format!("api.stripe.com:8443:{VENDOR_V4}"),
                "https://api.stripe.com:8443/v1/customers",
            ]),
        CLIENT_TIMEOUT,
    );
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        body.contains("\"object\":\"list\"") || body.contains("\"object\": \"list\""),
        "{body} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // UDP elsewhere, QUIC-less UDP 443 is the sink's; DNS to an outside resolver.
    udp_send(&ns, 8443);
    udp_send(&ns, 53);
    // A ping and a raw IP packet (protocol 253, for experiments), sent by
    // root in the namespace (raw sockets need it; the rules apply to every
    // uid but the proxy's): both dropped and counted.
    let raw = format!(
        "import socket\nfor proto, data in ((socket.IPPROTO_ICMP, bytes([8,0,0xf7,0xff,0,0,0,0])), (253, b'x')):\n    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, proto)\n    try:\n        s.sendto(data, ('{VENDOR_V4}', 0))\n        print('sent', proto)\n    except PermissionError:\n        print('dropped', proto)"
    );
    let out = ns.output(ns.command("python3").args(["-c", &raw]), CLIENT_TIMEOUT);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        printed,
        "dropped 1\ndropped 253\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(ns.nft_counter("other_dropped").unwrap_or(0) >= 2);
    let dropped = wait_for_line(&veris.state, "udp_dropped", |l| l["kind"] == "udp_dropped");
    assert!(dropped["packets"].as_u64().unwrap() >= 1, "{dropped}");
    assert_eq!(vendor.hits(), "", "traffic escaped to the fake vendor");

    let (r, _) = receipt_json(&ns, &veris.state);
    let l = leaks(&r);
    assert!(
        r["services"]["stripe"]["requests"].as_u64().unwrap() >= 1,
        "{r}"
    );
    for absent in [
        "ip-other-open",
        "workload-root",
        "tcp-other-ports-open",
        "udp-quic-possible",
        "coverage-unverified",
        "redirect-changed",
    ] {
        assert!(!l.iter().any(|x| x == absent), "{absent} in {l:?}");
    }
    assert!(l.iter().any(|x| x.starts_with("udp-dropped ")), "{l:?}");
    let session = ledger(&veris.state)
        .into_iter()
        .find(|l| l["kind"] == "session")
        .unwrap();
    let coverage = &session["coverage"];
    assert_eq!(coverage["quic"], "sink", "{session}");
    assert_eq!(coverage["udp_other"], "dropped");
    assert!(
        coverage.get("tcp_ports").is_none(),
        "every TCP port: {coverage}"
    );
    assert_eq!(coverage["installed_by"], "veris");
    assert_ne!(r["integrity"]["status"], "failed", "{r}");
    veris.stop();
    assert!(!ns.has_veris_table(), "a clean stop removes the rules");
}

#[test]
fn narrower_rules_and_an_unknown_workload_show_in_the_leaks() {
    if let Some(why) = sink_unavailable() {
        return skip(&why);
    }
    let dir = TempDir::new("narrow");
    let ns = Netns::create("narrow");
    let veris = Veris::start(&ns, &dir, &["--allow-quic", "--egress-ports", "80,443"]);
    let (r, _) = receipt_json(&ns, &veris.state);
    let l = leaks(&r);
    for expected in ["tcp-other-ports-open", "udp-quic-possible", "workload-root"] {
        assert!(l.iter().any(|x| x == expected), "{expected} missing: {l:?}");
    }
}

#[test]
fn a_killed_proxy_fails_closed() {
    if let Some(why) = sink_unavailable() {
        return skip(&why);
    }
    let dir = TempDir::new("closed");
    let ns = Netns::create("closed");
    let vendor = FakeVendor::start(&ns, &dir, "8443,443", "8443");
    let veris = Veris::start(&ns, &dir, &["--workload-uid", &WORKLOAD_UID.to_string()]);
    let pid = veris.ready["pid"].as_u64().unwrap().to_string();
    let _ = Command::new("kill").args(["-KILL", &pid]).status();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        ns.has_veris_table(),
        "the rules must outlive a killed proxy"
    );
    for port in ["8443", "443"] {
        let out = ns.output(
            workload(&ns, "curl").args([
                "-sS",
                "--max-time",
                "5",
                &format!("http://{VENDOR_V4}:{port}/"),
            ]),
            CLIENT_TIMEOUT,
        );
        assert!(
            !out.status.success(),
            "port {port} connected after the proxy died"
        );
    }
    udp_send(&ns, 8443);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(vendor.hits(), "", "traffic escaped once the proxy died");
    drop(veris);
}

#[test]
fn rules_deleted_during_a_run_fail_its_receipt() {
    if let Some(why) = sink_unavailable() {
        return skip(&why);
    }
    let dir = TempDir::new("deleted");
    let ns = Netns::create("deleted");
    let vendor = FakeVendor::start(&ns, &dir, "8443", "8443");
    let veris = Veris::start(&ns, &dir, &["--workload-uid", &WORKLOAD_UID.to_string()]);
    // Give the helper's monitor a moment to subscribe.
    std::thread::sleep(Duration::from_millis(500));
    let status = ns
        .command("nft")
        .args(["delete", "table", "inet", "veris"])
        .status()
        .unwrap();
    assert!(status.success());
    // With the rules gone the fake vendor is reachable: it does see escapes.
    let out = ns.output(
        workload(&ns, "curl").args([
            "-sS",
            "--max-time",
            "5",
            &format!("http://{VENDOR_V4}:8443/"),
        ]),
        CLIENT_TIMEOUT,
    );
    let _ = out;
    let deadline = Instant::now() + DEADLINE;
    while !vendor.hits().contains("tcp 8443") {
        assert!(
            Instant::now() < deadline,
            "the fake vendor never saw the escape"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let change = wait_for_line(&veris.state, "redirect_change", |l| {
        l["kind"] == "redirect_change"
    });
    assert!(
        change["detail"].as_str().unwrap().contains("veris"),
        "{change}"
    );
    let (r, code) = receipt_json(&ns, &veris.state);
    assert_eq!(r["integrity"]["status"], "failed", "{r}");
    assert!(leaks(&r).iter().any(|l| l == "redirect-changed"), "{r}");
    assert_eq!(code, Some(3));
}

#[test]
fn files_named_on_the_command_line_are_written_before_root_is_dropped() {
    if let Some(why) = sink_unavailable() {
        return skip(&why);
    }
    let dir = TempDir::new("files");
    let ns = Netns::create("files");
    // A root-owned directory the proxy uid cannot write.
    let announce = dir.join("announce");
    std::fs::create_dir_all(&announce).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&announce, std::fs::Permissions::from_mode(0o755)).unwrap();
    let env = announce.join("veris.env");
    let veris = Veris::start(
        &ns,
        &dir,
        &["--env-trust-only", "--write-env", env.to_str().unwrap()],
    );
    let mode = std::fs::metadata(&env).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode, 0o644,
        "the workload (another uid) must read the env file"
    );
    let text = std::fs::read_to_string(&env).unwrap();
    assert!(text.contains("SSL_CERT_FILE"), "{text}");
    assert!(!text.contains("HTTPS_PROXY"), "trust only: {text}");
    drop(veris);
}

#[test]
fn a_start_that_fails_after_installing_the_rules_takes_them_back_out() {
    if let Some(why) = sink_unavailable() {
        return skip(&why);
    }
    let dir = TempDir::new("badstart");
    let ns = Netns::create("badstart");
    // The admin address cannot be bound: the start fails after the rules went in.
    let out = ns.output(
        ns.command(bin())
            .args([
                "serve",
                "--transparent",
                "--install-redirect",
                "--listen",
                "127.0.0.1:0",
                "--https-listen",
                "[::]:0",
                "--http-listen",
                "[::]:0",
                "--quic-listen",
                "[::]:0",
                "--admin",
                "192.0.2.1:1",
                "--state-dir",
            ])
            .arg(dir.join("state")),
        CLIENT_TIMEOUT,
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("admin"));
    assert!(
        !ns.has_veris_table(),
        "a failed start left the redirect behind"
    );
}

#[test]
fn a_shared_state_dir_is_refused_before_anything_is_handed_over() {
    if let Some(why) = sink_unavailable() {
        return skip(&why);
    }
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let dir = TempDir::new("sharedstate");
    let shared = dir.join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let ns = Netns::create("sharedst");
    let out = ns.output(
        ns.command(bin())
            .args([
                "serve",
                "--transparent",
                "--install-redirect",
                "--listen",
                "127.0.0.1:0",
                "--https-listen",
                "[::]:0",
                "--http-listen",
                "[::]:0",
                "--quic-listen",
                "[::]:0",
                "--admin",
                "127.0.0.1:0",
                "--state-dir",
            ])
            .arg(&shared),
        CLIENT_TIMEOUT,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is shared"), "{stderr}");
    assert_eq!(std::fs::metadata(&shared).unwrap().uid(), 0, "handed over");
    let ledger = std::fs::read_to_string(shared.join("ledger.jsonl")).unwrap_or_default();
    assert!(!ledger.contains("\"kind\":\"session\""), "{ledger}");
    assert!(
        !ns.has_veris_table(),
        "a failed start left the redirect behind"
    );
}
