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

use serde_json::Value;

use crate::support::gateway::*;
use crate::support::netns::{self, python_with_requests, which, Netns};
use crate::support::{self, command, euid, skip, text, TempDir};

/// Why the namespace (platform) tests cannot run here: they need root
/// (veth pairs to the host, `ip netns`), nftables, curl, python3, redsocks.
fn platform_unavailable() -> Option<String> {
    if let Some(why) = netns::unavailable() {
        return Some(why);
    }
    if euid() != 0 {
        return Some("the gateway platform tests need root (veth pairs between the host and `ip netns` namespaces)".into());
    }
    missing(&["redsocks", "python3"])
}

/// The receipt's integrity reason, or "".
fn reason(receipt: &Value) -> String {
    receipt["integrity"]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// One curl call through `proxy` (a sandbox's URL) that must succeed with 200.
fn charge_ok(proxy: &str, target: &str, ca: &Path, who: &str) {
    let (ok, status, stderr) = curl_charge(proxy, target, ca);
    assert!(
        ok && status == "200",
        "{who}: POST {target} through its own URL: curl ok={ok} status={status:?}: {stderr}"
    );
}

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
    charge_ok(&a.url(scheme), HTTPS_CHARGES, &ca, "A");
    charge_ok(&b.url(scheme), HTTPS_CHARGES, &ca, "B");
    // Over the HTTP proxy, B's second call is absolute-form plain HTTP.
    let second = if scheme == "http" {
        "http://api.stripe.com/v1/charges"
    } else {
        HTTPS_CHARGES
    };
    charge_ok(&b.url(scheme), second, &ca, "B");

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
    charge_ok(&b.url(scheme), HTTPS_CHARGES, &ca, "B after A's removal");
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
    if let Some(why) = platform_unavailable() {
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
    if let Some(why) = platform_unavailable() {
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
        !reason(&ra).contains(NO_PROBE),
        "A probed from inside, yet: {}",
        reason(&ra)
    );
    let text_a = gw.receipt_text("sbx-a");
    assert!(text_a.contains("interception: gateway"), "{text_a}");
    assert!(!text_a.contains(NO_PROBE), "{text_a}");

    let rb = gw.receipt_json("sbx-b");
    assert_eq!(charges(&rb).len(), 1, "B's one call only: {rb}");
    assert_eq!(rb["integrity"]["status"], "unverified", "{rb}");
    assert!(reason(&rb).contains(NO_PROBE), "{rb}");
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
    if let Some(why) = netns::unavailable() {
        return skip(&why);
    }
    if euid() != 0 {
        return skip("the SSRF test runs the gateway in an `ip netns` namespace (root)");
    }
    if let Some(why) = missing(&["python3"]) {
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
    allowing.stop();
}
