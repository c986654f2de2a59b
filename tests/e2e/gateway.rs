//! The gateway tier end to end (DESIGN §13, issue G1): one `veris gateway`
//! outside many sandboxes, each with its own credential, ledger and
//! receipt. Clients are real: curl through the `socks5h://` and `http://`
//! URLs `add-sandbox` prints; and, as the sandbox platform, network
//! namespaces whose TCP redsocks tunnels to the gateway as SOCKS5 with the
//! sandbox's credentials, with proxy-unaware clients inside (curl without
//! proxy flags, Python requests with `trust_env=False`, Node fetch)
//! trusting only the gateway's CA. The platform part is proven on its own
//! against a python3 SOCKS5 stand-in
//! ([`redsocks_forwards_a_namespaces_tcp_as_socks5_with_credentials`]).
//!
//! Each test's attack: a sandbox that reads another's calls in its receipt,
//! a wrong or revoked credential that still gets through, a sandbox whose
//! probe-less window reads verified, a sandbox that makes the gateway dial
//! its own loopback or the cloud metadata address.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::support::gateway::*;
use crate::support::netns::{self, python_with_requests, which, Netns};
use crate::support::{self, command, output, skip, text, wait_for, TempDir, DEADLINE};

/// Items 1 and 2: two sandboxes through one gateway with `scheme`
/// (`socks5h` or `http`): each receipt holds only its own calls, a wrong
/// password and another sandbox's password are refused with no ledger line
/// anywhere, and a removed sandbox's URL is refused while the other's works.
fn two_sandboxes_each_see_only_their_own(scheme: &str) {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let mut gw = Gateway::start(&format!("gw-two-{scheme}"), "127.0.0.1:0", &[]);
    let a = gw.add_sandbox("sbx-a", "stripe,github");
    let b = gw.add_sandbox_json("sbx-b", "stripe,github");
    assert_eq!(a.addr, gw.listen.to_string(), "A's URL names the listener");
    assert_eq!(b.addr, gw.listen.to_string(), "B's URL names the listener");
    assert_ne!(a.password, b.password, "each sandbox has its own secret");
    let ca = gw.ca();

    // A calls once, B twice: a receipt that mixed them would count three.
    charge_ok(&a.url(scheme), &ca, "A");
    charge_ok(&b.url(scheme), &ca, "B");
    // Over the HTTP proxy, B's second call is absolute-form plain HTTP.
    let second = if scheme == "http" {
        "http://api.stripe.com/v1/charges"
    } else {
        HTTPS_CHARGES
    };
    charge_ok_to(&b.url(scheme), second, &ca, "B");

    let (ra, rb) = (gw.receipt_json("sbx-a"), gw.receipt_json("sbx-b"));
    assert_eq!(ra["interception"], "gateway", "{ra}");
    assert_eq!(rb["interception"], "gateway", "{rb}");
    assert_eq!(
        charges(&ra).len(),
        1,
        "A's receipt holds A's one call only: {ra}"
    );
    assert_eq!(
        charges(&rb).len(),
        2,
        "B's receipt holds B's two calls only: {rb}"
    );
    for r in [&ra, &rb] {
        assert!(
            charges(r).iter().all(|e| e["status"] == 200),
            "every charge answered 200: {r}"
        );
    }
    let text_a = gw.receipt_text("sbx-a");
    assert!(text_a.contains("interception: gateway"), "{text_a}");

    // A wrong password, and B's name with A's secret: refused before any
    // byte is forwarded, and in no sandbox's ledger.
    let before = (gw.ledger("sbx-a").len(), gw.ledger("sbx-b").len());
    let wrong = a.url_with_password(scheme, "not-the-password");
    let crossed = b.url_with_password(scheme, &a.password);
    for (what, url) in [
        ("a wrong password", &wrong),
        ("B's name with A's password", &crossed),
    ] {
        let (ok, status, stderr) = curl_charge(url, HTTPS_CHARGES, &ca);
        assert!(
            !ok,
            "{what} must be refused, curl got through with {status}: {stderr}"
        );
    }
    let after = (gw.ledger("sbx-a").len(), gw.ledger("sbx-b").len());
    assert_eq!(
        before, after,
        "refused credentials left lines in a sandbox's ledger (A, B lines before vs after)"
    );

    // Revoked: A's URL is refused, B's still works.
    gw.remove_sandbox("sbx-a");
    let (ok, status, stderr) = curl_charge(&a.url(scheme), HTTPS_CHARGES, &ca);
    assert!(
        !ok,
        "a removed sandbox's URL must be refused, curl got {status}: {stderr}"
    );
    charge_ok(&b.url(scheme), &ca, "B after A's removal");
    assert_eq!(charges(&gw.receipt_json("sbx-b")).len(), 3);
    let listed = gw.admin_command("list-sandboxes", &[]);
    let (stdout, stderr) = text(&listed);
    assert!(listed.status.success(), "list-sandboxes: {stdout}{stderr}");
    assert!(stdout.contains("sbx-b"), "B is listed: {stdout}");
    assert!(!stdout.contains("sbx-a"), "A is no longer listed: {stdout}");
    gw.stop();
}

#[test]
fn two_sandboxes_over_socks5h_each_receipt_holds_only_its_own_calls() {
    two_sandboxes_each_see_only_their_own("socks5h");
}

#[test]
fn two_sandboxes_over_http_connect_each_receipt_holds_only_its_own_calls() {
    two_sandboxes_each_see_only_their_own("http");
}

/// The platform stand-in alone, no gateway: redsocks in a namespace takes
/// a proxy-unaware curl's TCP (an nftables redirect) and opens a SOCKS5
/// tunnel with the configured login/password to the server on the host,
/// naming the destination by its IPv4 address; with a wrong password the
/// server refuses it and the curl fails.
#[test]
fn redsocks_forwards_a_namespaces_tcp_as_socks5_with_credentials() {
    if let Some(why) = platform_unavailable(&["redsocks", "python3"]) {
        return skip(&why);
    }
    let dir = TempDir::new("redsocks");
    let platform = Platform::new();
    let socks = PyServer::start(
        command("python3"),
        &dir,
        "socks5",
        SOCKS5_STAND_IN_PY,
        &[&platform.addr, "sbx-a", "right-pass"],
    );
    let target: SocketAddr = format!("{}:{}", platform.addr, socks.port).parse().unwrap();
    let a = platform.sandbox(&dir, "rsa", target, "sbx-a", "right-pass");
    let b = platform.sandbox(&dir, "rsb", target, "sbx-b", "wrong-pass");

    let curl = |net: &SandboxNet| {
        net.output(net.command("curl").args([
            "-sS",
            "--max-time",
            "10",
            "http://api.stripe.com/v1/charges",
        ]))
    };
    let out = curl(&a);
    let (stdout, stderr) = text(&out);
    let want = format!("stand-in saw sbx-a {}:80", netns::VENDOR_V4);
    assert!(
        out.status.success() && stdout == want,
        "curl in A without proxy flags: {stdout:?} {stderr}; redsocks: {}",
        std::fs::read_to_string(&a.log).unwrap_or_default()
    );
    // Python's urllib (no proxy handler) and Node's fetch, proxy-unaware
    // too, resolve the vendor name through the namespace's hosts file.
    let out = a.output(a.command("python3").args([
        "-c",
        "import urllib.request as u; print(u.build_opener(u.ProxyHandler({})).open('http://api.stripe.com/v1/charges', timeout=10).read().decode())",
    ]));
    let (stdout, stderr) = text(&out);
    assert_eq!(stdout.trim(), want, "python urllib in A: {stderr}");
    if which("node").is_some() {
        let out = a.output(a.command("node").args([
            "-e",
            "fetch('http://api.stripe.com/v1/charges').then(r => r.text()).then(t => console.log(t)).catch(e => { console.error(e, e.cause); process.exit(1); })",
        ]));
        let (stdout, stderr) = text(&out);
        assert_eq!(stdout.trim(), want, "node fetch in A: {stderr}");
    }
    let out = curl(&b);
    let (stdout, _) = text(&out);
    assert!(
        !out.status.success() && !stdout.contains("stand-in saw"),
        "B's wrong password got through: {stdout}"
    );
    let log = socks.log();
    let tunnels = format!("connect sbx-a {}:80", netns::VENDOR_V4);
    assert!(
        log.matches(&tunnels).count() >= 2,
        "curl's and python's connections each tunneled with A's login: {log}"
    );
    assert!(log.contains("refused sbx-b"), "{log}");
    assert!(!log.contains("connect sbx-b"), "{log}");
}

/// POSTs a charge with `requests`, proxy variables ignored (`trust_env =
/// False`), trusting only argv[2]; prints the status.
const REQUESTS_PY: &str = r#"
import sys, requests
s = requests.Session()
s.trust_env = False
r = s.post(sys.argv[1], data={"amount": "100", "currency": "usd"}, verify=sys.argv[2], timeout=20)
print(r.status_code)
"#;

/// Node's fetch POSTing a charge; prints the status.
const NODE_JS: &str = r#"
fetch("https://api.stripe.com/v1/charges", {
  method: "POST",
  headers: { "content-type": "application/x-www-form-urlencoded" },
  body: "amount=100&currency=usd",
}).then((r) => console.log(r.status)).catch((e) => { console.error(e, e.cause); process.exit(1); });
"#;

/// Item 3: sandboxes as their platform runs them (a namespace each,
/// redsocks tunneling all TCP to the gateway with the sandbox's
/// credentials). Proxy-unaware clients inside reach the Stripe twin through
/// the gateway, routed by SNI (redsocks names only an IPv4 address); the
/// canary probe from inside answers with the sandbox's id and token and
/// lifts the "no probe" verdict; the other sandbox, which made calls but no
/// probe, reads `unverified (no canary probe from the sandbox)`.
#[test]
fn proxy_unaware_clients_in_redsocks_sandboxes_are_received_by_the_gateway() {
    if let Some(why) = platform_unavailable(&["redsocks", "python3"]) {
        return skip(&why);
    }
    let Some(python) = python_with_requests() else {
        return skip("python3 with `requests` not available (apt install python3-requests)");
    };
    let dir = TempDir::new("gw-platform");
    let platform = Platform::new();
    let mut gw = Gateway::start("gw-platform", &format!("{}:0", platform.addr), &[]);
    let a = gw.add_sandbox_json("sbx-a", "stripe");
    let b = gw.add_sandbox_json("sbx-b", "stripe");
    let ca = gw.ca();
    let na = platform.sandbox(&dir, "gwa", gw.listen, &a.username, &a.password);
    let nb = platform.sandbox(&dir, "gwb", gw.listen, &b.username, &b.password);

    let status_of = |net: &SandboxNet, cmd: &mut std::process::Command, what: &str| {
        let out = net.output(cmd);
        let (stdout, stderr) = text(&out);
        assert!(
            out.status.success() && stdout.trim() == "200",
            "{what} inside the sandbox: {stdout:?} {stderr}; redsocks: {}; gateway: {}",
            std::fs::read_to_string(&net.log).unwrap_or_default(),
            gw.stderr()
        );
    };
    let curl_charge_in = |net: &SandboxNet| {
        let mut cmd = net.command("curl");
        cmd.args([
            "-sS",
            "--max-time",
            "15",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .arg("--cacert")
        .arg(&ca)
        .args([HTTPS_CHARGES, "-d", "amount=100", "-d", "currency=usd"]);
        cmd
    };
    status_of(&na, &mut curl_charge_in(&na), "curl without proxy flags");
    let script = dir.join("requests_charge.py");
    std::fs::write(&script, REQUESTS_PY).unwrap();
    status_of(
        &na,
        na.command(&python).arg(&script).arg(HTTPS_CHARGES).arg(&ca),
        "python requests (trust_env=False)",
    );
    let mut calls = 2;
    if which("node").is_some() {
        status_of(
            &na,
            na.command("node")
                .env("NODE_EXTRA_CA_CERTS", &ca)
                .args(["-e", NODE_JS]),
            "node fetch",
        );
        calls += 1;
    } else {
        eprintln!("node not installed: Node fetch not checked");
    }

    // The canary, probed from inside A with a plain curl.
    let out = na.output(
        na.command("curl")
            .args(["-sS", "--max-time", "15", "--cacert"])
            .arg(&ca)
            .arg(CANARY_URL),
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "canary probe from A: {stderr}");
    let canary = support::json(&stdout);
    assert_eq!(canary["sandbox_id"], "sbx-a", "{canary}");
    match &a.canary {
        Some(token) => assert_eq!(canary["canary"], token.as_str(), "{canary}"),
        None => assert!(
            canary["canary"].as_str().is_some_and(|t| !t.is_empty()),
            "{canary}"
        ),
    }
    assert!(
        gw.ledger("sbx-a").iter().any(|l| l["kind"] == "check"),
        "the probe is a check line in A's ledger"
    );

    // B calls, never probes.
    status_of(&nb, &mut curl_charge_in(&nb), "curl in B");

    let ra = gw.receipt_json("sbx-a");
    assert_eq!(ra["interception"], "gateway", "{ra}");
    assert_eq!(charges(&ra).len(), calls, "A's calls, each listed: {ra}");
    assert!(charges(&ra).iter().all(|e| e["status"] == 200), "{ra}");
    assert!(
        !integrity(&ra).1.contains(NO_PROBE),
        "A probed from inside, yet: {}",
        integrity(&ra).1
    );
    let text_a = gw.receipt_text("sbx-a");
    assert!(text_a.contains("interception: gateway"), "{text_a}");
    assert!(!text_a.contains(NO_PROBE), "{text_a}");

    let rb = gw.receipt_json("sbx-b");
    assert_eq!(charges(&rb).len(), 1, "B's one call only: {rb}");
    assert_eq!(rb["integrity"]["status"], "unverified", "{rb}");
    assert!(integrity(&rb).1.contains(NO_PROBE), "{rb}");
    let text_b = gw.receipt_text("sbx-b");
    assert!(
        text_b.contains(&format!("unverified ({NO_PROBE}")),
        "{text_b}"
    );
    gw.stop();
}

/// Item 4: a sandbox names the gateway's loopback (a listener there) and
/// the cloud metadata address, by name (socks5h), by address (socks5) and
/// as an absolute-form HTTP proxy request, with the gateway in passthrough
/// mode so that only its dial policy can refuse: every attempt fails or
/// reads 403, the listener sees no connection, and the sandbox's ledger
/// holds blocked lines naming `loopback` and `link-local`. A second gateway
/// with `--allow-dial 127.0.0.1/32` does reach the listener. Gateway,
/// listener and curl run in a namespace of their own, so a gateway that
/// dialed 169.254.169.254 would find no route, not a real metadata service.
#[test]
fn a_sandbox_cannot_make_the_gateway_dial_loopback_or_the_metadata_address() {
    if let Some(why) = platform_unavailable(&["python3"]) {
        return skip(&why);
    }
    let dir = TempDir::new("gw-ssrf");
    let ns = Netns::create("gwssrf");
    let listener = PyServer::start(
        ns.command("python3"),
        &dir,
        "loopback",
        LISTENER_PY,
        &["127.0.0.1"],
    );
    let local = format!("http://127.0.0.1:{}/", listener.port);
    let metadata = "http://169.254.169.254/latest/meta-data/";

    let mut gw = Gateway::start_in(
        Some(&ns),
        "gw-ssrf",
        "127.0.0.1:0",
        &["--mode", "passthrough"],
    );
    let a = gw.add_sandbox("sbx-a", "stripe");
    let attempts = [
        ("socks5h", local.as_str()),
        ("socks5", local.as_str()),
        ("http", local.as_str()),
        ("socks5h", metadata),
    ];
    for (scheme, target) in attempts {
        let out = ns.output(
            ns.command("curl")
                .args([
                    "-sS",
                    "--max-time",
                    "10",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                ])
                .args(["--proxy", &a.url(scheme), target]),
            netns::DEADLINE,
        );
        let (status, stderr) = text(&out);
        assert!(
            !out.status.success() || status == "403",
            "{target} through A's {scheme} URL was not refused: {status} {stderr}"
        );
    }
    assert_eq!(
        listener.log(),
        "",
        "the gateway connected to its own loopback for a sandbox"
    );
    let blocked: Vec<String> = gw
        .ledger("sbx-a")
        .iter()
        .filter(|l| l["kind"] == "blocked")
        .map(|l| l["reason"].as_str().unwrap_or_default().to_string())
        .collect();
    for class in ["loopback", "link-local"] {
        assert!(
            blocked.iter().any(|r| r.contains(class)),
            "no blocked line naming {class} in A's ledger: {blocked:?}"
        );
    }
    gw.stop();

    // The operator's deliberate exception: loopback allowed.
    let mut allowing = Gateway::start_in(
        Some(&ns),
        "gw-ssrf-allow",
        "127.0.0.1:0",
        &["--mode", "passthrough", "--allow-dial", "127.0.0.1/32"],
    );
    let b = allowing.add_sandbox("sbx-b", "stripe");
    let out = ns.output(
        ns.command("curl").args(["-sS", "--max-time", "10"]).args([
            "--proxy",
            &b.url("socks5h"),
            &local,
        ]),
        netns::DEADLINE,
    );
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success() && stdout == "reached",
        "with --allow-dial 127.0.0.1/32 the listener is reached: {stdout:?} {stderr}"
    );
    assert!(
        listener.log().contains("hit"),
        "the listener saw the allowed dial"
    );

    // A platform tunnel that knows only the address (`socks5://`: curl
    // resolves, here to a TEST-NET address no route reaches): the request
    // names `localhost`, and the gateway dials what that name resolves to,
    // never the address the platform gave (which would not answer).
    let hits = listener.log().matches("hit").count();
    let port = listener.port;
    let out = ns.output(
        ns.command("curl")
            .args(["-sS", "--max-time", "10", "--proxy", &b.url("socks5")])
            .args(["--resolve", &format!("localhost:{port}:203.0.113.9")])
            .arg(format!("http://localhost:{port}/")),
        netns::DEADLINE,
    );
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success() && stdout == "reached",
        "an address-only CONNECT whose request names localhost reaches what localhost resolves to: {stdout:?} {stderr}"
    );
    assert_eq!(listener.log().matches("hit").count(), hits + 1);
    let dialed: Vec<String> = allowing
        .ledger("sbx-b")
        .iter()
        .filter(|l| l["kind"] == "passthrough" && l["host"] == "localhost")
        .map(|l| l["dst"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        dialed,
        [format!("127.0.0.1:{port}")],
        "the line names the address the name resolved to, not 203.0.113.9"
    );
    allowing.stop();
}

/// `add-sandbox ID --services stripe EXTRA…` (plain output, the URL last).
fn add_with(gw: &Gateway, id: &str, extra: &[&str]) -> Sandbox {
    let mut args = vec![id, "--services", "stripe"];
    args.extend_from_slice(extra);
    let out = gw.admin_command("add-sandbox", &args);
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "add-sandbox {id} {extra:?}: {stdout}{stderr}"
    );
    Sandbox::from_url(id, stdout.lines().last().unwrap_or_default().trim())
}

/// The ledger's `request` lines.
fn requests(lines: &[Value]) -> usize {
    lines.iter().filter(|l| l["kind"] == "request").count()
}

/// Attack: a sandbox keeps using its URL after its `--ttl` ran out. One
/// call within the TTL works; once the gateway lists it expired, the same
/// URL is refused and A's ledger gains no request line.
#[test]
fn an_expired_sandbox_is_refused() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let mut gw = Gateway::start("gw-ttl", "127.0.0.1:0", &[]);
    let added = std::time::Instant::now();
    let a = add_with(&gw, "sbx-a", &["--ttl", "2"]);
    let ca = gw.ca();
    charge_ok(&a.url("socks5h"), &ca, "A within its TTL");
    let served = requests(&gw.ledger("sbx-a"));
    assert_eq!(served, 1, "A's one call is a request line");

    // Expiry is time itself: never earlier than the TTL.
    gw.wait_expired("sbx-a");
    assert!(
        added.elapsed() >= Duration::from_secs(2),
        "A was listed expired before its 2 s TTL ran out"
    );
    for scheme in ["socks5h", "http"] {
        let (ok, status, stderr) = curl_charge(&a.url(scheme), HTTPS_CHARGES, &ca);
        assert!(
            !ok,
            "an expired sandbox's {scheme} URL must be refused, curl got {status}: {stderr}"
        );
    }
    assert_eq!(
        requests(&gw.ledger("sbx-a")),
        served,
        "a refused expired sandbox gained request lines in its ledger"
    );
    gw.stop();
}

/// Attack: CI holding A's read token reads B, lists or adds sandboxes, or
/// deletes B. A's token reads A's status and ledger (200) and nothing
/// else (401/404, never 2xx); with no token everything is 401; B is still
/// served afterwards.
#[test]
fn a_read_token_reads_only_its_own_sandbox() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let mut gw = Gateway::start("gw-read", "127.0.0.1:0", &[]);
    let a = gw.add_sandbox_json("sbx-a", "stripe");
    let b = gw.add_sandbox("sbx-b", "stripe");
    let ca = gw.ca();
    charge_ok(&b.url("socks5h"), &ca, "B");
    let token = a.json.as_ref().unwrap()["read_token"]
        .as_str()
        .unwrap()
        .to_string();
    let on_disk = std::fs::read_to_string(gw.state.join("sandboxes/sbx-a/admin.token"))
        .expect("<state>/sandboxes/sbx-a/admin.token");
    assert_eq!(on_disk.trim(), token, "the read token on disk is --json's");

    // A POST carries a new sandbox: the answer must not depend on a body.
    let admin_status = |method: &str, path: &str, token: Option<&str>| {
        let json = (method == "POST").then_some(r#"{"id":"sbx-c","services":["stripe"]}"#);
        gw.admin_api(method, path, token, json).0
    };
    for path in ["/sandboxes/sbx-a/status", "/sandboxes/sbx-a/ledger"] {
        assert_eq!(
            admin_status("GET", path, Some(&token)),
            "200",
            "A's read token on {path}"
        );
        assert_eq!(admin_status("GET", path, None), "401", "no token on {path}");
    }
    for (method, path) in [
        ("GET", "/sandboxes/sbx-b/ledger"),
        ("GET", "/sandboxes/sbx-b/receipt"),
        ("GET", "/sandboxes/sbx-b/status"),
        ("POST", "/sandboxes/sbx-b/seal"),
        ("GET", "/sandboxes"),
        ("POST", "/sandboxes"),
        ("DELETE", "/sandboxes/sbx-b"),
        ("DELETE", "/sandboxes/sbx-a"),
    ] {
        let status = admin_status(method, path, Some(&token));
        assert!(
            status == "401" || status == "404",
            "A's read token on {method} {path} answered {status} (want 401 or 404)"
        );
        let status = admin_status(method, path, None);
        assert_eq!(status, "401", "no token on {method} {path}");
    }
    charge_ok(&b.url("socks5h"), &ca, "B after A's token tried");
    charge_ok(&a.url("socks5h"), &ca, "A after its token tried");
    assert!(
        !gw.state.join("sandboxes/sbx-c").exists(),
        "A's read token registered a sandbox"
    );
    assert_eq!(charges(&gw.receipt_json("sbx-b")).len(), 2);
    gw.stop();
}

/// A raw SOCKS5 client: argv HOST PORT USER PASS CMD…; per CMD (decimal)
/// one connection that logs in and asks CMD for api.stripe.com:443;
/// prints `CMD REP` (REP in hex, or `closed`). Run after [`PY_LIB`].
const SOCKS5_COMMANDS_PY: &str = r#"
import socket, sys
host, port, user, password = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode(), sys.argv[4].encode()
for cmd in sys.argv[5:]:
    c = socket.create_connection((host, port), timeout=10)
    method, login = socks5_login(c, user, password)
    assert method == b"\x05\x02"
    assert login == b"\x01\x00", "login refused"
    name = b"api.stripe.com"
    c.sendall(bytes([5, int(cmd), 0, 3, len(name)]) + name + b"\x01\xbb")
    try:
        rep = "%02x" % exact(c, 2)[1]
    except (EOFError, OSError):
        rep = "closed"
    print(cmd, rep, flush=True)
    c.close()
"#;

/// Attack: a sandbox asks for BIND (an inbound port on the gateway) or UDP
/// ASSOCIATE (a UDP relay around the TCP ledger). Both are answered with
/// REP 0x07 (command not supported) and are blocked lines in its ledger.
#[test]
fn bind_and_udp_associate_are_refused_with_0x07_and_recorded() {
    if let Some(why) = missing(&["python3"]) {
        return skip(&why);
    }
    let mut gw = Gateway::start("gw-bind", "127.0.0.1:0", &[]);
    let a = gw.add_sandbox("sbx-a", "stripe");
    let script = py_script(gw.dir.path(), "socks5_commands", SOCKS5_COMMANDS_PY);
    let port = gw.listen.port().to_string();
    let out = output(command("python3").arg(&script).args([
        "127.0.0.1",
        &port,
        &a.username,
        &a.password,
        "2",
        "3",
    ]));
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "the SOCKS5 client: {stdout}{stderr}");
    assert_eq!(
        stdout.trim(),
        "2 07\n3 07",
        "BIND and UDP ASSOCIATE must be answered REP 0x07"
    );
    let methods: Vec<String> = wait_for("two blocked lines in A's ledger", DEADLINE, || {
        let m: Vec<String> = gw
            .ledger("sbx-a")
            .iter()
            .filter(|l| l["kind"] == "blocked")
            .map(|l| l["method"].as_str().unwrap_or_default().to_string())
            .collect();
        (m.len() >= 2).then_some(m)
    });
    assert_eq!(
        methods,
        ["SOCKS5 BIND", "SOCKS5 UDP ASSOCIATE"],
        "A's blocked lines name the refused commands"
    );
    gw.stop();
}

/// argv HOST PORT USER N: N SOCKS5 logins as USER with wrong passwords
/// over 16 threads; prints `refused R of N`.
const LOGIN_FLOOD_PY: &str = r#"
import socket, sys, threading
host, port, user, n = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode(), int(sys.argv[4])
lock = threading.Lock()
count = {"refused": 0, "other": 0}
def one(i):
    password = ("wrong-%d" % i).encode()
    try:
        c = socket.create_connection((host, port), timeout=10)
        c.sendall(b"\x05\x01\x02")
        if c.recv(2) != b"\x05\x02":
            raise OSError("no auth method")
        c.sendall(bytes([1, len(user)]) + user + bytes([len(password)]) + password)
        reply = c.recv(2)
        c.close()
        ok = len(reply) == 2 and reply[1] != 0
    except OSError:
        ok = False
    with lock:
        count["refused" if ok else "other"] += 1
def worker(k):
    for i in range(k, n, 16):
        one(i)
threads = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
for t in threads: t.start()
for t in threads: t.join()
print("refused %d of %d" % (count["refused"], n), flush=True)
"#;

/// Attack: a sandbox (or an outsider) floods A's username with wrong
/// passwords, to fill A's ledger with noise, or to lock A out. 10,000
/// refusals: none in any ledger, A's URL still works, and the gateway's
/// own log holds rate-limited refusal lines, far fewer than 10,000.
#[test]
fn failed_logins_never_reach_a_ledger_and_do_not_lock_out_the_real_sandbox() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    if let Some(why) = missing(&["python3"]) {
        return skip(&why);
    }
    let mut gw = Gateway::start("gw-flood", "127.0.0.1:0", &[]);
    let a = gw.add_sandbox("sbx-a", "stripe");
    let b = gw.add_sandbox("sbx-b", "stripe");
    let ca = gw.ca();
    charge_ok(&a.url("socks5h"), &ca, "A before the flood");
    // Interval seals come and go with time; every other line counts.
    let unsealed = |id: &str| {
        gw.ledger(id)
            .into_iter()
            .filter(|l| l["kind"] != "seal")
            .count()
    };
    let before = (unsealed("sbx-a"), unsealed("sbx-b"));

    let script = gw.dir.join("login_flood.py");
    std::fs::write(&script, LOGIN_FLOOD_PY).unwrap();
    let port = gw.listen.port().to_string();
    let out = support::output_within(
        command("python3")
            .arg(&script)
            .args(["127.0.0.1", &port, &a.username, "10000"]),
        Duration::from_secs(300),
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(
        stdout.trim(),
        "refused 10000 of 10000",
        "every wrong password is refused: {stderr}"
    );
    assert_eq!(
        (unsealed("sbx-a"), unsealed("sbx-b")),
        before,
        "failed logins left lines in a sandbox's ledger: A {:?} B {:?}",
        gw.ledger("sbx-a"),
        gw.ledger("sbx-b")
    );

    charge_ok(&a.url("socks5h"), &ca, "A after the flood");
    charge_ok(&b.url("http"), &ca, "B after the flood");
    let lines_a = gw.ledger("sbx-a");
    assert_eq!(
        requests(&lines_a),
        2,
        "A's ledger: its own two calls only: {lines_a:?}"
    );
    for l in &lines_a {
        let s = l.to_string();
        assert!(
            !s.contains("wrong-") && !s.contains("credential"),
            "a ledger line about the failed logins: {s}"
        );
    }
    let log = gw.stderr();
    let refusal_lines = log
        .lines()
        .filter(|l| l.contains("refused a sandbox credential"))
        .count();
    println!("gateway stderr: {refusal_lines} refusal lines for 10000 failed logins");
    assert!(
        (1..200).contains(&refusal_lines),
        "the gateway logs refusals rate-limited: {refusal_lines} lines for 10000"
    );
    assert!(
        !log.contains("wrong-1"),
        "the gateway's log shows a tried password"
    );
    gw.stop();
}

/// argv HOST PORT USER PASS: opens SOCKS5 CONNECTs to api.stripe.com:443
/// one after another and holds them idle; prints `tunnel REP` per
/// connection (3 of them), then `holding`, and waits for stdin to close.
/// Run after [`PY_LIB`].
const HOLD_TUNNELS_PY: &str = r#"
import socket, sys
host, port, user, password = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode(), sys.argv[4].encode()
held = []
for i in range(3):
    c = socket.create_connection((host, port), timeout=10)
    try:
        socks5_login(c, user, password)
        name = b"api.stripe.com"
        c.sendall(bytes([5, 1, 0, 3, len(name)]) + name + b"\x01\xbb")
        rep = "%02x" % exact(c, 10)[1]
    except (EOFError, OSError):
        rep = "closed"
    print("tunnel", rep, flush=True)
    held.append(c)
print("holding", flush=True)
sys.stdin.read()
"#;

/// Attack: sandbox A holds its connection limit open (idle tunnels) to
/// starve the gateway. With `--sandbox-connections 2`, A's third tunnel is
/// refused (REP 0x01 or closed) and recorded as a `limit` blocked line in
/// A's ledger, while B's request meanwhile returns 200.
#[test]
fn a_sandbox_at_its_connection_limit_does_not_block_another() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    if let Some(why) = missing(&["python3"]) {
        return skip(&why);
    }
    let mut gw = Gateway::start("gw-limit", "127.0.0.1:0", &["--sandbox-connections", "2"]);
    let a = gw.add_sandbox("sbx-a", "stripe");
    let b = gw.add_sandbox("sbx-b", "stripe");
    let ca = gw.ca();
    let script = py_script(gw.dir.path(), "hold_tunnels", HOLD_TUNNELS_PY);
    let port = gw.listen.port().to_string();
    let mut holder = support::Guard::spawn(
        command("python3")
            .arg(&script)
            .args(["127.0.0.1", &port, &a.username, &a.password])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null()),
    );
    let stdout = holder.child().stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    while seen.last().map(String::as_str) != Some("holding") {
        let line = rx
            .recv_timeout(DEADLINE)
            .unwrap_or_else(|_| panic!("the tunnel holder stopped after {seen:?}"));
        seen.push(line);
    }
    assert_eq!(
        &seen[..2],
        ["tunnel 00", "tunnel 00"],
        "A's two tunnels open"
    );
    assert!(
        seen[2] == "tunnel 01" || seen[2] == "tunnel closed",
        "A's third tunnel over its limit must be refused: {seen:?}"
    );
    // While A holds its two: B is served.
    charge_ok(&b.url("socks5h"), &ca, "B while A is at its limit");
    let reasons: Vec<String> = wait_for("a limit line in A's ledger", DEADLINE, || {
        let r: Vec<String> = gw
            .ledger("sbx-a")
            .iter()
            .filter(|l| l["kind"] == "blocked")
            .map(|l| l["reason"].as_str().unwrap_or_default().to_string())
            .collect();
        r.iter().any(|r| r.contains("limit")).then_some(r)
    });
    println!("A's blocked reasons: {reasons:?}");
    assert!(
        gw.ledger("sbx-b").iter().all(|l| l["kind"] != "blocked"),
        "B's ledger has no blocked line"
    );
    drop(holder);
    gw.stop();
}

/// A plain-HTTP twin stand-in that appends every request it receives
/// (head and body, raw) to argv[2] and answers `200 {}`; listens on
/// argv[1] port 0 and prints `ready PORT`. Run after [`PY_LIB`].
const RECORDING_TWIN_PY: &str = r#"
import socket, sys, threading
addr, log = sys.argv[1], sys.argv[2]
lock = threading.Lock()
def serve(c):
    try:
        c.settimeout(10)
        head, _, body = read_head(c).partition(b"\r\n\r\n")
        n = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                n = int(line.split(b":", 1)[1])
        while len(body) < n:
            piece = c.recv(4096)
            if not piece:
                break
            body += piece
        with lock:
            with open(log, "ab") as f:
                f.write(head + b"\r\n\r\n" + body + b"\n")
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
    except (OSError, ValueError):
        pass
    c.close()
serve_forever(addr, serve)
"#;

/// Attack: the gateway forwards the sandbox's proxy credential
/// (`Proxy-Authorization: Basic …`, or the password itself) to the twin or
/// writes it into a ledger, where whoever reads those can log in as the
/// sandbox. A (built-in twin) and B (a recording twin that logs raw
/// requests) each POST a charge over the HTTP proxy form, absolute-form
/// plain HTTP and CONNECT + HTTPS; neither password appears in any ledger,
/// the twin's request log, the recording twin's raw log, or anywhere in
/// the state dir.
#[test]
fn a_credential_in_proxy_authorization_never_reaches_the_twin_or_the_ledger() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    if let Some(why) = missing(&["python3"]) {
        return skip(&why);
    }
    let mut gw = Gateway::start("gw-cred", "127.0.0.1:0", &[]);
    let recorder = PyServer::start(
        command("python3"),
        &gw.dir,
        "recording-twin",
        RECORDING_TWIN_PY,
        &["127.0.0.1"],
    );
    let a = gw.add_sandbox("sbx-a", "stripe");
    let b = add_with(
        &gw,
        "sbx-b",
        &["--twin", &format!("http://127.0.0.1:{}", recorder.port)],
    );
    let ca = gw.ca();
    for sandbox in [&a, &b] {
        for target in ["http://api.stripe.com/v1/charges", HTTPS_CHARGES] {
            charge_ok_to(&sandbox.url("http"), target, &ca, &sandbox.id);
        }
    }
    assert_eq!(charges(&gw.receipt_json("sbx-a")).len(), 2);
    assert_eq!(charges(&gw.receipt_json("sbx-b")).len(), 2);

    let raw = recorder.log();
    assert_eq!(
        raw.matches("POST ").count(),
        2,
        "the recording twin saw B's two charges: {raw}"
    );
    assert!(
        !raw.to_ascii_lowercase().contains("proxy-authorization"),
        "the twin received a Proxy-Authorization header: {raw}"
    );
    let twin = gw.ready["twin"]
        .as_str()
        .unwrap_or_default()
        .trim_end_matches('/');
    let view = output(command("curl").args([
        "-sS",
        "--max-time",
        "10",
        &format!("{twin}/s/sbx-a/stripe/veris/requests"),
    ]));
    let view = text(&view).0;
    assert!(view.contains("/v1/charges"), "the twin's view of A: {view}");

    for sandbox in [&a, &b] {
        let secret = sandbox.password.as_str();
        for (what, body) in [
            ("the recording twin's raw log", raw.clone()),
            ("the built-in twin's view of A", view.clone()),
            ("the gateway's stderr", gw.stderr()),
        ] {
            assert!(
                !body.contains(secret),
                "{}'s password in {what}",
                sandbox.id
            );
        }
        let mut files = Vec::new();
        all_files(&gw.state, 0, &mut files);
        for file in files {
            let bytes = std::fs::read(&file).unwrap_or_default();
            assert!(
                !String::from_utf8_lossy(&bytes).contains(secret),
                "{}'s password in {}",
                sandbox.id,
                file.display()
            );
        }
    }
    gw.stop();
}

/// Every regular file under `dir` (bounded depth).
fn all_files(dir: &Path, depth: usize, out: &mut Vec<std::path::PathBuf>) {
    if depth > 5 {
        return;
    }
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => all_files(&path, depth + 1, out),
            Ok(t) if t.is_file() => out.push(path),
            _ => {}
        }
    }
}
