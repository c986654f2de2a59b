//! End-to-end tests of `veris serve` in the explicit tier (M1.3): real curl
//! (HTTP/1.1 and HTTP/2) and Python `requests` send vendor calls through the
//! proxy to the built-in twin; a 50 MB response streams without the proxy
//! buffering it; `veris receipt` reads the session and detects tampering;
//! SIGTERM lets an in-flight request finish.
//!
//! Vendor hostnames are never resolved by real DNS: clients are given the
//! proxy explicitly, so they send `CONNECT api.stripe.com:443` with the name,
//! and the environment is cleared so no NO_PROXY or CA variable interferes.

use crate::support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use serde_json::Value;
use support::{command, output, skip, text, veris, wait_for, Guard, Serve, DEADLINE};

fn twin_posts(serve: &Serve, path: &str) -> usize {
    serve.twin_requests("stripe")["requests"]
        .as_array()
        .expect("requests array")
        .iter()
        .filter(|r| r["method"] == "POST" && r["path"] == path && r["status"] == 200)
        .count()
}

fn ledger_requests(serve: &Serve, method: &str, path: &str) -> Vec<Value> {
    serve
        .ledger_lines()
        .into_iter()
        .filter(|l| {
            l["kind"] == "request"
                && l["service"] == "stripe"
                && l["host"] == "api.stripe.com"
                && l["method"] == method
                && l["path"] == path
        })
        .collect()
}

#[test]
fn curl_http1_and_http2_reach_the_builtin_twin() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let serve = Serve::start("curl", &[]);
    for (flag, version) in [("--http1.1", "1.1"), ("--http2", "2")] {
        let out = output(serve.curl().args([
            flag,
            "-v",
            "-w",
            "\n%{http_code} %{http_version}",
            "https://api.stripe.com/v1/charges",
            "-d",
            "amount=100",
            "-d",
            "currency=usd",
        ]));
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "curl {flag} failed: {stderr}");
        let (body, trailer) = stdout.rsplit_once('\n').expect("status trailer");
        assert_eq!(trailer, format!("200 {version}"), "curl {flag}");
        // The vendor name goes to the proxy unresolved.
        assert!(
            stderr.contains("CONNECT api.stripe.com:443 HTTP/1.1"),
            "{stderr}"
        );
        let charge: Value = serde_json::from_str(body).expect("the twin's JSON");
        assert_eq!(charge["object"], "charge");
        assert_eq!(charge["amount"], 100);
        assert_eq!(charge["currency"], "usd");
        let id = charge["id"].as_str().expect("charge id");
        assert!(id.starts_with("ch_"), "{id}");
        // The twin stored this charge. Read back through the proxy: the
        // built-in twin answers vendor requests only with the proxy's
        // per-start credential, so a direct call would get 401.
        let url = format!("https://api.stripe.com/v1/charges/{id}");
        let out = output(serve.curl().args([flag, &url]));
        let stored: Value = serde_json::from_slice(&out.stdout).expect("twin JSON");
        assert_eq!(stored, charge, "the twin holds what curl was answered");
    }
    assert_eq!(twin_posts(&serve, "/v1/charges"), 2, "the twin saw both");
    let lines = ledger_requests(&serve, "POST", "/v1/charges");
    assert_eq!(lines.len(), 2, "one ledger line per request");
    let versions: Vec<_> = lines.iter().map(|l| l["http"].clone()).collect();
    assert!(versions.contains(&Value::from("HTTP/1.1")), "{versions:?}");
    assert!(versions.contains(&Value::from("HTTP/2")), "{versions:?}");
    for l in &lines {
        assert_eq!(l["status"], 200);
        assert_eq!(l["tier"], "explicit");
    }
}

#[test]
fn python_requests_with_explicit_proxy_and_ca_reaches_the_twin() {
    if let Err(why) = support::python_requests() {
        return skip(&why);
    }
    let serve = Serve::start("pyreq", &[]);
    let script = r#"
import json, sys, requests
proxy, ca = sys.argv[1], sys.argv[2]
r = requests.post("https://api.stripe.com/v1/charges",
                  data={"amount": "250", "currency": "eur"},
                  proxies={"http": proxy, "https": proxy}, verify=ca, timeout=20)
print(json.dumps({"status": r.status_code, "body": r.json()}))
"#;
    let out = output(
        command("python3")
            .args(["-c", script, &serve.proxy_url])
            .arg(&serve.ca),
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "python failed: {stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).expect("script output");
    assert_eq!(v["status"], 200);
    assert_eq!(v["body"]["object"], "charge");
    assert_eq!(v["body"]["amount"], 250);
    assert_eq!(twin_posts(&serve, "/v1/charges"), 1);
    assert_eq!(ledger_requests(&serve, "POST", "/v1/charges").len(), 1);
}

const BIG: usize = 50 * 1024 * 1024;

/// A loopback origin: `/small` answers 1 KiB, `/veris/…` 404, any other
/// path 50 MiB of generated bytes written in 64 KiB chunks. Anything that is not an HTTP/1
/// request (the proxy's h2c probe) is closed.
fn start_origin() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding the origin");
    let port = listener.local_addr().expect("origin addr").port();
    std::thread::spawn(move || {
        // Bounded: the start's reachability check and log-position reads
        // (one per routed service: the catalog and the route), the probe,
        // a warm-up, the download, and some slack.
        for conn in listener.incoming().take(64) {
            let Ok(conn) = conn else { continue };
            std::thread::spawn(move || serve_origin(conn));
        }
    });
    port
}

fn serve_origin(mut conn: TcpStream) {
    let _ = conn.set_read_timeout(Some(DEADLINE));
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
        match conn.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head);
    let Some(path) = head.split_whitespace().nth(1) else {
        return;
    };
    if head.starts_with("PRI ") {
        return;
    }
    if path.contains("/veris/") {
        // Not a twin: no control surface (the start reads each service's
        // log position there; 50 MiB answers would be read and dropped).
        let _ = write!(
            conn,
            "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        );
        return;
    }
    let len = if path.ends_with("/small") { 1024 } else { BIG };
    let _ = write!(
        conn,
        "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n"
    );
    let chunk: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    let mut left = len;
    while left > 0 {
        let n = left.min(chunk.len());
        if conn.write_all(&chunk[..n]).is_err() {
            return;
        }
        left -= n;
    }
}

#[test]
fn a_50_mb_response_streams_without_growing_the_proxy() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let port = start_origin();
    let twin = format!("http://127.0.0.1:{port}");
    let serve = Serve::start(
        "stream",
        &["--route", "bigfile=big.example.test", "--twin", &twin],
    );
    // Warm up (leaf minted, pools and buffers allocated) so the figure is the download's.
    let out = output(serve.curl().args([
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{size_download}",
        "https://big.example.test/small",
    ]));
    assert_eq!(text(&out).0, "200 1024", "warm-up: {:?}", text(&out));

    let rss_before = support::proc_status_kb(serve.pid(), "VmRSS");
    let hwm_before = support::proc_status_kb(serve.pid(), "VmHWM");
    let out = support::output_within(
        serve.curl().args([
            "--max-time",
            "120",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{size_download}",
            "https://big.example.test/big.bin",
        ]),
        Duration::from_secs(150),
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "download failed: {stderr}");
    assert_eq!(stdout, format!("200 {BIG}"));
    let hwm_after = support::proc_status_kb(serve.pid(), "VmHWM");
    // Peak during the download against what was resident before it (conservative).
    let growth_kb = hwm_after.saturating_sub(rss_before);
    println!(
        "proxy memory: VmRSS before {rss_before} kB, VmHWM before {hwm_before} kB, VmHWM after {hwm_after} kB, growth {growth_kb} kB for a {} MiB body",
        BIG >> 20
    );
    assert!(
        growth_kb < 20 * 1024,
        "the proxy's peak RSS grew by {growth_kb} kB while streaming {BIG} bytes"
    );
    let lines: Vec<_> = serve
        .ledger_lines()
        .into_iter()
        .filter(|l| l["kind"] == "request" && l["service"] == "bigfile")
        .collect();
    assert_eq!(lines.len(), 2, "warm-up and download recorded");
    assert_eq!(lines[1]["path"], "/big.bin");
    assert_eq!(lines[1]["status"], 200);
}

/// Replaces the alphanumeric byte nearest the middle of `line_no` (1-based)
/// with another of the same class, so the line still parses but its bytes change.
fn tamper_middle_byte(path: &std::path::Path, line_no: usize) {
    let mut bytes = std::fs::read(path).expect("reading the ledger");
    let mut start = 0;
    for _ in 1..line_no {
        start += bytes[start..]
            .iter()
            .position(|&b| b == b'\n')
            .expect("line")
            + 1;
    }
    let len = bytes[start..]
        .iter()
        .position(|&b| b == b'\n')
        .expect("line");
    let mid = start + len / 2;
    let at = (mid..start + len)
        .find(|&i| bytes[i].is_ascii_alphanumeric())
        .expect("an alphanumeric byte after the middle");
    bytes[at] = match bytes[at] {
        b'0'..=b'8' | b'a'..=b'y' | b'A'..=b'Y' => bytes[at] + 1,
        b'9' => b'0',
        b'z' => b'a',
        _ => b'A',
    };
    std::fs::write(path, bytes).expect("writing the ledger");
}

#[test]
fn receipt_after_a_serve_session_and_tampering() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let mut serve = Serve::start("receipt", &[]);
    for path in ["/v1/customers", "/v1/charges"] {
        let out = output(serve.curl().args([
            &format!("https://api.stripe.com{path}"),
            "-d",
            "amount=100",
            "-d",
            "currency=usd",
        ]));
        assert!(out.status.success(), "{path}: {:?}", text(&out));
    }
    serve.process.signal("TERM");
    assert!(serve.process.wait().success(), "{}", serve.stderr());

    let state = serve.state.clone();
    let receipt = |extra: &[&str]| {
        let mut cmd = veris(["receipt", "--state-dir"]);
        cmd.arg(&state).args(extra);
        output(&mut cmd)
    };
    let out = receipt(&[]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.starts_with("Veris receipt — twin sbx_local\n"),
        "{stdout}"
    );
    assert!(stdout.contains("interception: explicit"), "{stdout}");
    assert!(stdout.contains("integrity: "), "{stdout}");
    assert!(stdout.contains("leaks: direct-egress-possible"), "{stdout}");
    assert!(
        stdout.contains("2 request(s) reached the twin:"),
        "{stdout}"
    );
    assert!(stdout.contains("  stripe: 2 request(s)\n"), "{stdout}");
    assert!(
        stdout.contains("    POST \"/v1/customers\" -> 200\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("    POST \"/v1/charges\" -> 200\n"),
        "{stdout}"
    );

    let out = receipt(&["--json"]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let json: Value = serde_json::from_slice(&out.stdout).expect("receipt JSON");
    assert!(json["version"].is_u64(), "{json}");
    assert_eq!(json["interception"], "explicit");
    assert_eq!(json["services"]["stripe"]["requests"], 2, "{json}");

    let out = receipt(&["--require-request", "stripe POST /v1/charges"]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let out = receipt(&["--require-request", "stripe GET /v1/balance"]);
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));

    // The ledger: session (1), two requests (2, 3), maybe seals after. Alter line 2.
    let ledger = serve.ledger();
    assert!(std::fs::read_to_string(&ledger).unwrap().lines().count() >= 3);
    tamper_middle_byte(&ledger, 2);
    let out = receipt(&[]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}{stderr}");
    assert!(stdout.contains("integrity: failed"), "{stdout}");
    assert!(
        format!("{stdout}{stderr}").contains("line 2"),
        "names the line: {stdout}{stderr}"
    );
}

#[test]
fn sigterm_lets_an_in_flight_request_finish() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let mut serve = Serve::start("grace", &[]);
    let curl_err = serve.dir.join("curl.stderr");
    let curl_out = serve.dir.join("curl.stdout");
    // The built-in twin answers POST /v1/test/hang after 2 s.
    let mut curl = Guard::spawn(
        serve
            .curl()
            .args([
                "-v",
                "--http1.1",
                "-w",
                "\n%{http_code}",
                "https://api.stripe.com/v1/test/hang",
                "-d",
                "x=1",
            ])
            .stdout(std::fs::File::create(&curl_out).unwrap())
            .stderr(std::fs::File::create(&curl_err).unwrap()),
    );
    // In flight: curl has written the head and the 3-byte body (its -v trace).
    wait_for("curl to send the request", DEADLINE, || {
        let log = std::fs::read_to_string(&curl_err).ok()?;
        let after_head = &log[log.find("> POST /v1/test/hang")?..];
        after_head.contains("} [3 bytes data]").then_some(())
    });
    serve.process.signal("TERM");
    let status = serve.process.wait();
    assert_eq!(status.code(), Some(0), "serve: {}", serve.stderr());
    assert!(
        curl.wait().success(),
        "curl: {:?}",
        std::fs::read_to_string(&curl_err)
    );
    let body = std::fs::read_to_string(&curl_out).unwrap();
    assert!(body.ends_with("\n200"), "{body}");
    assert!(body.contains("test_hang"), "{body}");
    assert_eq!(ledger_requests(&serve, "POST", "/v1/test/hang").len(), 1);
}

/// DESIGN §7a.16: a requirement counts the twin's 2xx answers. A charge the
/// twin refused (400: a body it cannot parse) does not meet
/// `stripe POST /v1/charges`, and the FAIL line says what was seen; a
/// status clause counts other answers; a charge at `/v1/charges/` (one
/// trailing slash, which the twin answers) meets `/v1/charges`.
#[test]
fn a_refused_charge_does_not_meet_a_charge_requirement() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let mut serve = Serve::start("require-status", &[]);
    let refused = output(serve.curl().args([
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "https://api.stripe.com/v1/charges",
        "-H",
        "content-type: application/json",
        "-d",
        "{",
    ]));
    assert_eq!(text(&refused).0, "400", "{:?}", text(&refused));
    serve.process.signal("TERM");
    assert!(serve.process.wait().success(), "{}", serve.stderr());
    let state = serve.state.clone();
    let receipt = |extra: &[&str]| {
        let mut cmd = veris(["receipt", "--state-dir"]);
        cmd.arg(&state).args(extra);
        output(&mut cmd)
    };

    let out = receipt(&["--require-request", "stripe POST /v1/charges"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}{stderr}");
    assert!(
        stdout.contains(
            "FAIL: required request stripe POST \"/v1/charges\" answered 2xx: saw 1, with status 400\n"
        ),
        "{stdout}"
    );
    let out = receipt(&["--require", "stripe:1"]);
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));
    assert!(
        text(&out).0.contains("saw 1, with status 400"),
        "{:?}",
        text(&out)
    );
    for met in [
        &["--require-request", "stripe POST /v1/charges status=4xx"][..],
        &["--require-request", "stripe POST /v1/charges/ status=400"],
        &["--require", "stripe:1 status=any"],
        &["--require-host", "api.stripe.com status=4xx"],
    ] {
        let out = receipt(met);
        assert_eq!(out.status.code(), Some(0), "{met:?}: {:?}", text(&out));
    }
    // The JSON receipt carries the filter and the statuses seen.
    let out = receipt(&["--json", "--require-request", "stripe POST /v1/charges"]);
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));
    let json: Value = serde_json::from_slice(&out.stdout).expect("receipt JSON");
    let req = &json["requirements"][0];
    assert_eq!(req["status"], "2xx", "{json}");
    assert_eq!(req["counted"], 0, "{json}");
    assert_eq!(req["seen_statuses"]["400"], 1, "{json}");
    assert_eq!(req["holds"], false, "{json}");
    // On a terminal the receipt starts with an SGR reset, so colours the
    // workload left set cannot hide it; in a pipe there is no escape at all.
    assert!(!text(&receipt(&[])).0.contains('\x1b'));
    if command("script").arg("--version").output().is_ok() {
        let line = format!(
            "{} receipt --state-dir {}",
            support::bin().display(),
            state.display()
        );
        let out = output(command("script").args(["-qec", &line, "/dev/null"]));
        let (stdout, _) = text(&out);
        assert!(stdout.starts_with("\x1b[0mVeris receipt"), "{stdout:?}");
    } else if support::require_all() {
        panic!("VERIS_REQUIRE_ALL=1 and `script` (util-linux) is missing");
    }
    // A malformed clause is a usage error.
    for bad in [
        &["--require-request", "stripe POST /v1/charges status=4x"][..],
        &["--require", "stripe:1 4xx"],
        &["--require-host", "api.stripe.com status=999"],
    ] {
        let out = receipt(bad);
        assert_eq!(out.status.code(), Some(1), "{bad:?}: {:?}", text(&out));
        assert!(
            text(&out).1.contains("status="),
            "{bad:?}: {:?}",
            text(&out)
        );
    }

    // A charge at /v1/charges/ meets /v1/charges.
    let mut serve = Serve::start("require-slash", &[]);
    let out = output(serve.curl().args([
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "https://api.stripe.com/v1/charges/",
        "-d",
        "amount=100",
        "-d",
        "currency=usd",
    ]));
    assert_eq!(text(&out).0, "200", "{:?}", text(&out));
    serve.process.signal("TERM");
    assert!(serve.process.wait().success(), "{}", serve.stderr());
    let mut cmd = veris(["receipt", "--state-dir"]);
    cmd.arg(&serve.state)
        .args(["--require-request", "stripe POST /v1/charges"]);
    let out = output(&mut cmd);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
}

/// E1.5: a CONNECT passthrough whose dial is refused gets a 502 that says
/// so, and the ledger a `passthrough` line with no destination closed by a
/// `tunnel_close` that names the address dialed and why: the receipt lists
/// it as not reached, never as a tunnel that worked.
#[test]
fn a_passthrough_whose_dial_fails_reads_as_not_reached() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    // A port nothing listens on: bound, then closed.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let serve = Serve::start("unreached", &[]);
    let url = format!("https://127.0.0.1:{port}/");
    let out = output(serve.curl().args(["-sS", "-v", "-o", "/dev/null", &url]));
    let (_, stderr) = text(&out);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("502"),
        "CONNECT was not answered 502: {stderr}"
    );
    let lines = serve.ledger_lines();
    let pass = lines
        .iter()
        .find(|l| l["kind"] == "passthrough")
        .unwrap_or_else(|| panic!("no passthrough line: {lines:?}"));
    assert!(pass["dst"].is_null(), "{pass}");
    let close = lines
        .iter()
        .find(|l| l["kind"] == "tunnel_close" && l["of"] == pass["seq"])
        .unwrap_or_else(|| panic!("no tunnel_close for {pass}: {lines:?}"));
    let error = close["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&format!("127.0.0.1:{port}")) && error.contains("refused"),
        "{close}"
    );
    let out = output(veris(["receipt", "--state-dir"]).arg(&serve.state));
    let (receipt, _) = text(&out);
    assert!(
        receipt.contains("passthrough not reached: \"127.0.0.1\" (1): \"dialed 127.0.0.1:"),
        "{receipt}"
    );
    assert!(!receipt.contains("passthrough: "), "{receipt}");
}
