//! The gateway seen from inside a sandbox (DESIGN §13, issue G1): `veris
//! check --gateway` probing the way the sandbox's traffic leaves (straight
//! out through the platform's redsocks tunnel, or its proxy setting),
//! `veris gateway ca` giving a sandbox's clients the gateway's trust, and
//! `veris tui --sandbox` following one sandbox's ledger live.
//!
//! Each test's attack: a sandbox checking with another sandbox's canary or
//! credentials, a sandbox whose egress bypasses the gateway, a workload
//! that answers the canary itself to turn its receipt verified, a TUI for
//! one sandbox that shows another's calls.

use std::path::Path;

use crate::support::gateway::*;
use crate::support::netns::{python_with_requests, which, Netns};
use crate::support::tmux::{sh_quote, TUI_DEADLINE};
use crate::support::{self, bin, command, output, skip, text, tool_works, TempDir};

/// `veris check --gateway ARGS` inside `net` (its environment cleared but
/// for `env`); (exit code, stdout, stderr).
fn check_in(net: &SandboxNet, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = net.command(bin());
    cmd.args(["check", "--gateway", "--timeout", "5s"])
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = net.output(&mut cmd);
    let (stdout, stderr) = text(&out);
    (out.status.code().unwrap_or(-1), stdout, stderr)
}

/// The canary lines the gateway recorded in a sandbox's ledger.
fn canary_lines(gw: &Gateway, id: &str) -> usize {
    gw.ledger(id)
        .iter()
        .filter(|l| l["kind"] == "check" && l["name"] == "canary")
        .count()
}

/// Item 1: inside a redsocks sandbox, `veris check --gateway` with the
/// sandbox's canary passes straight out (no proxy setting, no DNS) and
/// through each proxy setting, and turns its receipt from `unverified (no
/// canary probe …)` to `verified`; with a wrong canary, another sandbox's
/// canary, another sandbox's id or a wrong password it fails and says why.
#[test]
fn check_gateway_inside_a_sandbox_proves_its_egress_and_verifies_its_receipt() {
    if let Some(why) = platform_unavailable(&["redsocks", "python3"]) {
        return skip(&why);
    }
    let dir = TempDir::new("gwin-check");
    let platform = Platform::new();
    let mut gw = Gateway::start("gwin-check", &format!("{}:0", platform.addr), &[]);
    let a = gw.add_sandbox_json("sbx-a", "stripe");
    let b = gw.add_sandbox_json("sbx-b", "stripe");
    let (canary_a, canary_b) = (a.canary.clone().unwrap(), b.canary.clone().unwrap());
    let na = platform.sandbox(&dir, "gwica", gw.listen, &a.username, &a.password);

    let before = gw.receipt_json("sbx-a");
    let (status, why) = integrity(&before);
    assert_eq!(status, "unverified", "{before}");
    assert!(why.contains(NO_PROBE), "{before}");

    // Straight out: the platform's tunnel is the only way to the gateway.
    let (code, stdout, stderr) = check_in(
        &na,
        &["--expect-canary", &canary_a, "--sandbox", "sbx-a"],
        &[],
    );
    assert_eq!(code, 0, "check --gateway in A: {stdout}{stderr}");
    assert!(
        stdout.contains("sandbox sbx-a") && stdout.contains("canary matches"),
        "{stdout}"
    );
    assert!(stdout.contains("straight out"), "{stdout}");
    assert!(
        canary_lines(&gw, "sbx-a") >= 1,
        "the gateway recorded the probe"
    );
    let after = gw.receipt_json("sbx-a");
    let (status, why) = integrity(&after);
    assert_eq!(status, "verified", "after the check: {why}: {after}");
    let text_a = gw.receipt_text("sbx-a");
    assert!(text_a.contains("integrity: verified"), "{text_a}");

    // Through the sandbox's proxy setting, each scheme (the gateway's
    // address is not redirected in the namespace, as a platform lets its
    // proxy through).
    for (var, scheme) in [
        ("ALL_PROXY", "socks5h"),
        ("ALL_PROXY", "socks5"),
        ("HTTPS_PROXY", "http"),
    ] {
        let url = a.url(scheme);
        let (code, stdout, stderr) = check_in(&na, &["--expect-canary", &canary_a], &[(var, &url)]);
        assert_eq!(code, 0, "{var}={scheme}://…: {stdout}{stderr}");
        assert!(
            !stdout.contains(&a.password),
            "a password printed: {stdout}"
        );
        assert!(stdout.contains("sandbox sbx-a"), "{stdout}");
    }

    // Wrong canary; B's canary; B's id: each fails, saying what differs.
    let (code, stdout, stderr) = check_in(&na, &["--expect-canary", "cnry_wrong"], &[]);
    assert_eq!(code, 2, "a wrong canary must fail: {stdout}{stderr}");
    assert!(
        stderr.contains("canary other than the one expected"),
        "{stderr}"
    );
    let (code, stdout, stderr) = check_in(&na, &["--expect-canary", &canary_b], &[]);
    assert_eq!(code, 2, "A checked with B's canary: {stdout}{stderr}");
    assert!(stderr.contains("sandbox sbx-a"), "{stderr}");
    let (code, stdout, stderr) = check_in(
        &na,
        &["--expect-canary", &canary_b, "--sandbox", "sbx-b"],
        &[],
    );
    assert_eq!(code, 2, "A claiming to be B: {stdout}{stderr}");
    assert!(stderr.contains("not sbx-b"), "{stderr}");
    // A's egress carrying B's credential (a platform mix-up): the gateway
    // answers for B, and A's canary does not match.
    let (code, stdout, stderr) = check_in(
        &na,
        &["--expect-canary", &canary_a],
        &[("ALL_PROXY", &b.url("socks5h"))],
    );
    assert_eq!(code, 2, "through B's credential: {stdout}{stderr}");
    assert!(stderr.contains("sandbox sbx-b"), "{stderr}");
    // A wrong password is refused, in words, with no password printed.
    let bad = a.url_with_password("socks5h", "not-the-password");
    let (code, stdout, stderr) =
        check_in(&na, &["--expect-canary", &canary_a], &[("ALL_PROXY", &bad)]);
    assert_eq!(code, 2, "a wrong password: {stdout}{stderr}");
    assert!(stderr.contains("refused the credentials"), "{stderr}");
    assert!(!stderr.contains("not-the-password"), "{stderr}");
    gw.stop();
}

/// Item 1: a sandbox whose egress is not sent to the gateway (a namespace
/// with no redirect; TEST-NET goes to a sink) fails the check with words
/// that say so, and no probe reaches any ledger.
#[test]
fn check_gateway_fails_where_the_egress_does_not_reach_a_gateway() {
    if let Some(why) = platform_unavailable(&[]) {
        return skip(&why);
    }
    let ns = Netns::create("gwinno");
    let out = ns.output(
        ns.command(bin()).args([
            "check",
            "--gateway",
            "--timeout",
            "3s",
            "--expect-canary",
            "cnry_x",
        ]),
        support::DEADLINE,
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
    assert!(
        stderr.contains("FAIL") && stderr.contains("is not sent to a veris gateway"),
        "{stderr}"
    );
    assert!(stdout.trim().is_empty(), "{stdout}");
}

/// A python3 HTTP server on argv[1] (port 0) answering every request with
/// the canary JSON argv[2] (a workload's fake canary); prints `ready PORT`.
/// Run after [`PY_LIB`].
const FAKE_CANARY_PY: &str = r#"
import socket, sys, threading
addr, body, log = sys.argv[1], sys.argv[2].encode(), sys.argv[3]
def serve(c):
    try:
        c.settimeout(5)
        read_head(c)
        with open(log, "a") as f:
            f.write("asked\n")
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    except OSError:
        pass
    c.close()
serve_forever(addr, serve)
"#;

/// Item 1, attack: a workload inside its sandbox answers the canary itself
/// (a local server speaking the gateway's JSON with its own sandbox id and
/// canary, reached as a "proxy" or by a hosts-style `--resolve`). Its own
/// check may be fooled, but its receipt stays `unverified (no canary
/// probe …)`: only a probe line the gateway itself recorded counts.
#[test]
fn a_canary_served_inside_the_sandbox_never_verifies_its_receipt() {
    if let Some(why) = platform_unavailable(&["redsocks", "python3"]) {
        return skip(&why);
    }
    let dir = TempDir::new("gwin-fake");
    let platform = Platform::new();
    let mut gw = Gateway::start("gwin-fake", &format!("{}:0", platform.addr), &[]);
    let b = gw.add_sandbox_json("sbx-b", "stripe");
    let canary = b.canary.clone().unwrap();
    let nb = platform.sandbox(&dir, "gwifb", gw.listen, &b.username, &b.password);
    let fake = serde_json::json!({
        "veris_proxy": true,
        "canary": canary,
        "run_id": "run_fake",
        "sandbox_id": "sbx-b",
        "mode": "passthrough",
        "tier": "gateway",
    });
    let server = PyServer::start(
        nb.command("python3"),
        &dir,
        "fake-canary",
        FAKE_CANARY_PY,
        &["127.0.0.1", &fake.to_string()],
    );
    let local = format!("http://127.0.0.1:{}", server.port);
    let (code, stdout, stderr) = check_in(
        &nb,
        &["--expect-canary", &canary],
        &[("HTTPS_PROXY", &local)],
    );
    eprintln!("the workload's own check through its fake: {code} {stdout}{stderr}");
    let out = nb.output(nb.command("curl").args([
        "-sS",
        "--max-time",
        "10",
        "--resolve",
        &format!("canary.veris.internal:{}:127.0.0.1", server.port),
        &format!(
            "http://canary.veris.internal:{}/__veris/canary",
            server.port
        ),
    ]));
    let (curl_out, curl_err) = text(&out);
    assert!(
        curl_out.contains(&canary),
        "the fake answered: {curl_out}{curl_err}"
    );
    assert!(
        server.log().lines().count() >= 2,
        "the fake was asked: {}",
        server.log()
    );

    assert_eq!(
        canary_lines(&gw, "sbx-b"),
        0,
        "no probe reached the gateway"
    );
    let receipt = gw.receipt_json("sbx-b");
    let (status, why) = integrity(&receipt);
    assert_eq!(status, "unverified", "{receipt}");
    assert!(why.contains(NO_PROBE), "{receipt}");
    gw.stop();
}

/// Node through the gateway's HTTP CONNECT (argv: gateway HOST:PORT,
/// USER:PASS), TLS trusting what NODE_EXTRA_CA_CERTS adds; prints the status.
const NODE_CONNECT_JS: &str = r#"
const http = require("http"), tls = require("tls");
const [addr, auth] = process.argv.slice(-2);
const [host, port] = [addr.slice(0, addr.lastIndexOf(":")), addr.slice(addr.lastIndexOf(":") + 1)];
const req = http.request({ host, port, method: "CONNECT", path: "api.stripe.com:443",
  headers: { "Proxy-Authorization": "Basic " + Buffer.from(auth).toString("base64") } });
req.on("connect", (res, socket) => {
  if (res.statusCode !== 200) { console.error("CONNECT", res.statusCode); process.exit(1); }
  const s = tls.connect({ socket, servername: "api.stripe.com" }, () => {
    s.write("POST /v1/charges HTTP/1.1\r\nHost: api.stripe.com\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 10\r\nConnection: close\r\n\r\namount=100");
  });
  let data = "";
  s.on("data", (d) => (data += d));
  s.on("end", () => console.log(data.split(" ")[1]));
  s.on("error", (e) => { console.error(e); process.exit(1); });
});
req.on("error", (e) => { console.error(e); process.exit(1); });
req.end();
"#;

/// Python requests with the environment it is given (trust_env on: the
/// proxy and REQUESTS_CA_BUNDLE come from the sourced env file).
const REQUESTS_ENV_PY: &str = r#"
import sys, requests
r = requests.post(sys.argv[1], data={"amount": "100", "currency": "usd"}, timeout=20)
print(r.status_code)
"#;

/// `sh -c '. ENV_FILE; exec CMD…'` with a cleared environment plus `extra`.
fn sourced(env_file: Option<&Path>, extra: &[(&str, &str)], cmd: &str) -> std::process::Output {
    let script = match env_file {
        Some(f) => format!(". {}; {cmd}", sh_quote(&f.display().to_string())),
        None => cmd.to_string(),
    };
    let mut sh = command("sh");
    sh.args(["-c", &script]);
    for (k, v) in extra {
        sh.env(k, v);
    }
    output(&mut sh)
}

/// Item 2: `veris gateway ca --env`, sourced in a fresh shell with no
/// ambient trust variables, makes curl (socks5h), Python requests (the
/// HTTP proxy URL: no PySocks needed) and Node (CONNECT, then TLS) trust
/// the gateway; without it curl refuses the gateway's leaf. `--pem` is
/// the CA itself, the default output its path, and `--java` a trust store
/// that keytool reads with the password the env file gives Java.
#[test]
fn gateway_ca_env_makes_a_sandboxs_clients_trust_the_gateway() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let dir = TempDir::new("gwin-ca");
    let mut gw = Gateway::start("gwin-ca", "127.0.0.1:0", &[]);
    let a = gw.add_sandbox_json("sbx-a", "stripe");
    let ca_cmd = |args: &[&str]| {
        let out = gw.admin_command("ca", args);
        let (stdout, stderr) = text(&out);
        assert!(
            out.status.success(),
            "gateway ca {args:?}: {stdout}{stderr}"
        );
        (stdout, stderr)
    };
    let (path, _) = ca_cmd(&[]);
    assert_eq!(
        Path::new(path.trim()),
        gw.ca(),
        "the default output is the CA's path"
    );
    let (pem, _) = ca_cmd(&["--pem"]);
    assert_eq!(pem, std::fs::read_to_string(gw.ca()).unwrap());
    let (env, _) = ca_cmd(&["--env", "--sandbox", "sbx-a", "--canary", "cnry_1"]);
    for var in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "JAVA_TOOL_OPTIONS",
    ] {
        assert!(env.contains(&format!("{var}=")), "no {var} in:\n{env}");
    }
    assert!(!env.contains("HTTPS_PROXY"), "trust only:\n{env}");
    assert!(
        env.contains("VERIS_CANARY='cnry_1'") || env.contains("VERIS_CANARY=cnry_1"),
        "{env}"
    );
    let env_file = dir.join("gateway.env");
    std::fs::write(&env_file, &env).unwrap();

    let curl = format!(
        "curl -sS --max-time 15 -o /dev/null -w '%{{http_code}}' --proxy {} {HTTPS_CHARGES} -d amount=100",
        sh_quote(&a.url("socks5h"))
    );
    let out = sourced(None, &[], &curl);
    assert!(
        !out.status.success(),
        "curl trusted the gateway with no env sourced: {:?}",
        text(&out)
    );
    let out = sourced(Some(&env_file), &[], &curl);
    let (stdout, stderr) = text(&out);
    assert_eq!(stdout.trim(), "200", "curl with the env file: {stderr}");

    match python_with_requests() {
        Some(python) => {
            let script = dir.join("requests_env.py");
            std::fs::write(&script, REQUESTS_ENV_PY).unwrap();
            let cmd = format!(
                "{} {} {HTTPS_CHARGES}",
                sh_quote(&python.display().to_string()),
                sh_quote(&script.display().to_string())
            );
            let out = sourced(Some(&env_file), &[("HTTPS_PROXY", &a.url("http"))], &cmd);
            let (stdout, stderr) = text(&out);
            assert_eq!(
                stdout.trim(),
                "200",
                "python requests with the env file: {stderr}"
            );
        }
        None => eprintln!("python3 requests not available: not checked"),
    }
    if which("node").is_some() {
        let script = dir.join("connect.js");
        std::fs::write(&script, NODE_CONNECT_JS).unwrap();
        let cmd = format!(
            "node {} {} {}",
            sh_quote(&script.display().to_string()),
            sh_quote(&a.addr),
            sh_quote(&format!("{}:{}", a.username, a.password))
        );
        let out = sourced(Some(&env_file), &[], &cmd);
        let (stdout, stderr) = text(&out);
        assert_eq!(stdout.trim(), "200", "node with the env file: {stderr}");
    } else {
        eprintln!("node not installed: not checked");
    }

    let (store, note) = ca_cmd(&["--java"]);
    let store = store.trim().to_string();
    assert!(Path::new(&store).is_file(), "{store}");
    assert!(
        env.contains(&store),
        "JAVA_TOOL_OPTIONS names the store:\n{env}"
    );
    assert!(note.contains("JKS"), "{note}");
    let password = env
        .split("javax.net.ssl.trustStorePassword=")
        .nth(1)
        .and_then(|rest| rest.split([' ', '\'', '"']).next())
        .expect("the env file gives Java the store's password")
        .to_string();
    gw.stop();
    if !tool_works("keytool", &["-help"]) {
        return skip("keytool is not installed: the Java trust store was not read");
    }
    let out =
        output(command("keytool").args(["-list", "-keystore", &store, "-storepass", &password]));
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "keytool -list: {stdout}{stderr}");
    assert!(stdout.contains("veris-ca"), "{stdout}");
}

/// Item 3: `veris tui --state-dir S --sandbox sbx-a` follows A's ledger live
/// through the gateway's admin API: A's call appears, B's (made first,
/// to another vendor) never does.
#[test]
fn tui_for_one_sandbox_shows_its_requests_and_never_anothers() {
    if !tool_works("tmux", &["-V"]) {
        return skip("tmux is not installed (apt-get install tmux)");
    }
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let dir = TempDir::new("gwin-tui");
    let mut gw = Gateway::start("gwin-tui", "127.0.0.1:0", &[]);
    let a = gw.add_sandbox("sbx-a", "stripe");
    let b = gw.add_sandbox("sbx-b", "github");
    let ca = gw.ca();
    let tmux = gw.tui(&dir, "sbx-a", (140, 36), &[]);
    tmux.wait_screen("the TUI live on A", TUI_DEADLINE, |s| {
        s.contains("proxy started")
    });

    let out = output(
        command("curl")
            .args([
                "-sS",
                "--max-time",
                "15",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .args(["--proxy", &b.url("socks5h"), "--cacert"])
            .arg(&ca)
            .arg("https://api.github.com/user"),
    );
    assert!(out.status.success(), "B's call: {:?}", text(&out));
    charge_ok(&a.url("socks5h"), &ca, "A's call");

    let screen = tmux.wait_screen("A's request row", TUI_DEADLINE, |s| {
        s.lines().any(|l| {
            l.contains("POST") && l.contains("api.stripe.com") && l.contains("/v1/charges")
        })
    });
    assert!(
        screen.contains("sbx-a"),
        "the TUI names the sandbox:\n{screen}"
    );
    // B's call was recorded before A's: had the TUI followed B's ledger (or
    // the gateway's whole state), it would be on the screen by now.
    assert!(
        gw.ledger("sbx-b")
            .iter()
            .any(|l| l["host"] == "api.github.com"),
        "B's call is in B's ledger"
    );
    let again = tmux.capture();
    for s in [&screen, &again] {
        assert!(!s.contains("api.github.com"), "B's call on A's TUI:\n{s}");
        assert!(!s.contains("sbx-b"), "B on A's TUI:\n{s}");
    }
    tmux.keys(&["q"]);
    gw.stop();
}
