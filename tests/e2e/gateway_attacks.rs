//! The gateway attacked as a sandbox (its workload) or a hostile network
//! client would (issue G1, DESIGN §7a and §13): slow and idle clients on
//! the admin API, a canary-probe flood, a platform's address-only CONNECT
//! whose TLS names another host, IPv6 and IPv4-embedding targets, a
//! receipt read after the gateway stopped and tampered with, the modes of
//! a sandbox's files, log injection through a username, path tricks on
//! the admin API, a removed sandbox's read token, and credentials switched
//! on one keep-alive connection. Each attack must fail; the receipts that
//! result must stay true.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::support::gateway::*;
use crate::support::netns::{self, Netns, NetnsHosts};
use crate::support::{self, command, output, skip, text, Guard, TempDir};

/// Lines of `kind` in `lines`.
fn count(lines: &[Value], kind: &str) -> usize {
    lines.iter().filter(|l| l["kind"] == kind).count()
}

/// argv HOST PORT N: opens N idle connections to the admin API and one
/// slow one that sends a request-head byte every second and never ends
/// its head; prints `holding N`, then `slow closed` once the server
/// closed the slow one and `idle closed K of N` once K idle ones were
/// closed (or `gave up` after 120 s).
const ADMIN_HOLD_PY: &str = r#"
import resource, select, socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
idle = [socket.create_connection((host, port), timeout=10) for _ in range(n)]
slow = socket.create_connection((host, port), timeout=10)
slow.sendall(b"GET /sandboxes HTTP/1.1\r\nHost: x\r\n")
print("holding", n, flush=True)
def closed(s):
    p = select.poll()
    p.register(s, select.POLLIN)
    if not p.poll(0):
        return False
    try:
        return s.recv(65536) == b""
    except OSError:
        return True
start = time.time()
slow_open, idle_open = True, set(range(n))
while (slow_open or idle_open) and time.time() - start < 120:
    if slow_open:
        try:
            slow.sendall(b"X")
        except OSError:
            pass
        if closed(slow):
            slow_open = False
            print("slow closed", flush=True)
    for i in list(idle_open):
        if closed(idle[i]):
            idle_open.discard(i)
    time.sleep(1)
print("idle closed %d of %d" % (n - len(idle_open), n), flush=True)
if slow_open:
    print("gave up", flush=True)
"#;

/// Item 1: 2,000 idle connections and a slowloris client on the admin API.
/// Meanwhile `add-sandbox` and a live receipt read are served; the slow
/// client and the idle ones are closed after the bounded request-head time
/// (30 s), never held for ever.
#[test]
fn slow_and_idle_admin_clients_neither_block_the_admin_api_nor_stay_open() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    if let Some(why) = missing(&["python3"]) {
        return skip(&why);
    }
    let mut gw = Gateway::start("gwa-slow", "127.0.0.1:0", &[]);
    let admin: std::net::SocketAddr = gw.ready["admin"].as_str().unwrap().parse().unwrap();
    let script = gw.dir.join("admin_hold.py");
    std::fs::write(&script, ADMIN_HOLD_PY).unwrap();
    let mut holder = Guard::spawn(
        command("python3")
            .arg(&script)
            .args([&admin.ip().to_string(), &admin.port().to_string(), "2000"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
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
    let first = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
    assert_eq!(first, "holding 2000", "the admin clients did not open");

    // While they hold: a sandbox is registered, used and read.
    let a = gw.add_sandbox("sbx-a", "stripe");
    charge_ok(&a.url("socks5h"), &gw.ca(), "A while the admin API is held");
    let receipt = gw.receipt_json("sbx-a");
    assert_eq!(charges(&receipt).len(), 1, "{receipt}");

    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.starts_with("idle closed")) {
        match rx.recv_timeout(Duration::from_secs(150)) {
            Ok(line) => seen.push(line),
            Err(_) => panic!("the holder stopped after {seen:?}"),
        }
    }
    assert!(
        seen.iter().any(|l| l == "slow closed") && !seen.iter().any(|l| l == "gave up"),
        "the slowloris client was never closed: {seen:?}"
    );
    assert!(
        seen.iter().any(|l| l == "idle closed 2000 of 2000"),
        "idle admin connections stayed open: {seen:?}"
    );
    drop(holder);
    gw.stop();
}

/// argv HOST PORT USER PASS N: N canary GETs as absolute-form HTTP proxy
/// requests with the sandbox's credentials over 8 keep-alive connections;
/// prints `ok K of N SECONDS` and the set of canary tokens seen.
const CANARY_FLOOD_PY: &str = r#"
import base64, http.client, json, sys, threading, time
host, port, user, password, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
auth = "Basic " + base64.b64encode(("%s:%s" % (user, password)).encode()).decode()
lock = threading.Lock()
ok, tokens = [0], set()
def worker(k):
    c = http.client.HTTPConnection(host, port, timeout=20)
    for i in range(k, n, 8):
        try:
            c.request("GET", "http://canary.veris.internal/__veris/canary", headers={"Proxy-Authorization": auth})
            r = c.getresponse()
            body = r.read()
            if r.status == 200:
                t = json.loads(body)["canary"]
                with lock:
                    ok[0] += 1
                    tokens.add(t)
        except (OSError, http.client.HTTPException, ValueError):
            c.close()
            c = http.client.HTTPConnection(host, port, timeout=20)
start = time.time()
threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print("ok %d of %d %d" % (ok[0], n, int(time.time() - start) + 1), flush=True)
print(" ".join(sorted(tokens)), flush=True)
"#;

/// Item 2: sandbox A floods its canary (5,000 probes). Its ledger gains at
/// most one `check` line a second of flood and no other line; B, called
/// during the flood, is served; A's receipt stays verified and counts its
/// one real call.
#[test]
fn a_canary_probe_flood_adds_at_most_a_line_a_second_and_keeps_the_receipt_true() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    if let Some(why) = missing(&["python3"]) {
        return skip(&why);
    }
    // No request rate limit: this is about the canary's line rate.
    let mut gw = Gateway::start("gwa-canary", "127.0.0.1:0", &["--sandbox-rps", "0"]);
    let a = gw.add_sandbox_json("sbx-a", "stripe");
    let b = gw.add_sandbox("sbx-b", "stripe");
    let ca = gw.ca();
    charge_ok(&a.url("socks5h"), &ca, "A");
    let lines = gw.ledger("sbx-a");
    let checks_before = count(&lines, "check");
    let others = |lines: &[Value]| {
        lines
            .iter()
            .filter(|l| l["kind"] != "seal" && l["kind"] != "check")
            .count()
    };
    let others_before = others(&lines);

    let script = gw.dir.join("canary_flood.py");
    std::fs::write(&script, CANARY_FLOOD_PY).unwrap();
    let port = gw.listen.port().to_string();
    let mut flood = Guard::spawn(
        command("python3")
            .arg(&script)
            .args(["127.0.0.1", &port, &a.username, &a.password, "5000"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    charge_ok(&b.url("http"), &ca, "B during A's canary flood");
    let status = flood
        .wait_timeout(Duration::from_secs(300))
        .expect("the flood did not finish within 300 s");
    let mut out = String::new();
    use std::io::Read;
    flood
        .child()
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(status.success(), "the flood script failed: {out}");
    let mut words = out.lines();
    let head: Vec<&str> = words.next().unwrap_or_default().split(' ').collect();
    assert_eq!(&head[..4], ["ok", "5000", "of", "5000"], "{out}");
    let seconds: usize = head[4].parse().unwrap();
    assert_eq!(
        words.next().unwrap_or_default(),
        a.canary.as_deref().unwrap(),
        "every probe answered A's own canary token"
    );

    let lines = gw.ledger("sbx-a");
    let added = count(&lines, "check") - checks_before;
    println!("{added} check lines for 5000 probes over about {seconds} s");
    assert!(
        (1..=seconds + 1).contains(&added),
        "A's ledger gained {added} check lines for a {seconds} s flood (at most one a second)"
    );
    assert_eq!(
        others(&lines),
        others_before,
        "the probes left lines other than checks and seals in A's ledger"
    );
    let ra = gw.receipt_json("sbx-a");
    assert_eq!(ra["integrity"]["status"], "verified", "{ra}");
    assert_eq!(charges(&ra).len(), 1, "A's one real call: {ra}");
    let rb = gw.receipt_json("sbx-b");
    assert_eq!(charges(&rb).len(), 1, "B's one call: {rb}");
    assert_eq!(
        count(&gw.ledger("sbx-b"), "check"),
        0,
        "A's probes in B's ledger"
    );
    gw.stop();
}

/// A listener on argv[1] port 0 and on argv[2] with the same port, that
/// appends `hit ADDR` to argv[3] per connection and answers `200 reached`;
/// prints `ready PORT`. Run after [`PY_LIB`].
const TWO_LISTENERS_PY: &str = r#"
import socket, sys, threading
first, second, log = sys.argv[1], sys.argv[2], sys.argv[3]
def family(a):
    return socket.AF_INET6 if ":" in a else socket.AF_INET
def serve(c, addr):
    with open(log, "a") as f:
        f.write("hit %s\n" % addr)
    try:
        c.settimeout(3)
        read_head(c)
    except OSError:
        pass
    try:
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\nreached")
    except OSError:
        pass
    c.close()
def loop(s, addr):
    while True:
        c, _ = s.accept()
        threading.Thread(target=serve, args=(c, addr), daemon=True).start()
a = socket.socket(family(first))
a.bind((first, 0))
a.listen(16)
port = a.getsockname()[1]
b = socket.socket(family(second))
b.bind((second, port))
b.listen(16)
threading.Thread(target=loop, args=(b, second), daemon=True).start()
print("ready", port, flush=True)
loop(a, first)
"#;

/// curl in `ns` through `proxy` to `url`, with `resolve` (`NAME:PORT:ADDR`):
/// (succeeded, stdout, stderr).
fn curl_in(ns: &Netns, proxy: &str, url: &str, resolve: Option<&str>) -> (bool, String, String) {
    let mut cmd = ns.command("curl");
    cmd.args(["-sS", "-k", "--max-time", "10", "--proxy", proxy]);
    if let Some(r) = resolve {
        cmd.args(["--resolve", r]);
    }
    cmd.arg(url);
    let out = ns.output(&mut cmd, netns::DEADLINE);
    let (stdout, stderr) = text(&out);
    (out.status.success(), stdout, stderr)
}

/// The `reason` of every blocked line of `id` whose host is `host`.
fn blocked_for(gw: &Gateway, id: &str, host: &str) -> Vec<String> {
    gw.ledger(id)
        .iter()
        .filter(|l| l["kind"] == "blocked" && l["host"] == host)
        .map(|l| l["reason"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Item 3: a platform tunnel's SOCKS5 CONNECT by bare IP (curl `socks5://`
/// with `--resolve`, so the CONNECT names 127.0.0.1) carrying a TLS
/// ClientHello whose SNI names another host. The gateway dials what the
/// name resolves to (the namespace's hosts file), under the dial policy:
/// a name for the metadata address or loopback is refused and recorded
/// against the name even when the CONNECT address itself is allowed; a
/// name for an allowed address reaches that address, never the CONNECT's.
#[test]
fn an_address_only_connect_is_dialed_by_its_sni_name_under_the_dial_policy() {
    if let Some(why) = platform_unavailable(&["python3", "curl"]) {
        return skip(&why);
    }
    let dir = TempDir::new("gwa-sni");
    let ns = Netns::create("gwasni");
    let _hosts = NetnsHosts::write(
        &ns.name,
        "169.254.169.254 meta.example\n127.0.0.1 loop.example\n127.0.0.2 good.example\n",
    );
    let listeners = PyServer::start(
        ns.command("python3"),
        &dir,
        "two",
        TWO_LISTENERS_PY,
        &["127.0.0.2", "127.0.0.1"],
    );
    let port = listeners.port;
    let via = |name: &str| {
        (
            format!("https://{name}:{port}/"),
            format!("{name}:{port}:127.0.0.1"),
        )
    };

    // No exception: every name is refused, the listeners see nothing.
    let mut gw = Gateway::start_in(
        Some(&ns),
        "gwa-sni",
        "127.0.0.1:0",
        &["--mode", "passthrough"],
    );
    let a = gw.add_sandbox("sbx-a", "stripe");
    for (name, class) in [
        ("meta.example", "link-local"),
        ("loop.example", "loopback"),
        ("good.example", "loopback"),
    ] {
        let (url, resolve) = via(name);
        let (ok, stdout, stderr) = curl_in(&ns, &a.url("socks5"), &url, Some(&resolve));
        assert!(!ok, "{name} was served: {stdout} {stderr}");
        let reasons = blocked_for(&gw, "sbx-a", name);
        assert!(
            reasons.iter().any(|r| r.contains(class)),
            "no blocked line for {name} naming {class}: {reasons:?}; ledger: {:?}",
            gw.ledger("sbx-a")
        );
    }
    assert_eq!(listeners.log(), "", "a loopback listener was dialed");
    gw.stop();

    // The CONNECT's address (127.0.0.1) is allowed, as is good.example's
    // (127.0.0.2): a name for the metadata address or one that does not
    // resolve is still refused, never sent to the CONNECT's address.
    let mut gw = Gateway::start_in(
        Some(&ns),
        "gwa-sni-allow",
        "127.0.0.1:0",
        &["--mode", "passthrough", "--allow-dial", "127.0.0.0/8"],
    );
    let b = gw.add_sandbox("sbx-b", "stripe");
    for name in ["meta.example", "nowhere.invalid"] {
        let (url, resolve) = via(name);
        let (ok, stdout, stderr) = curl_in(&ns, &b.url("socks5"), &url, Some(&resolve));
        assert!(!ok, "{name} was served: {stdout} {stderr}");
    }
    assert_eq!(
        listeners.log(),
        "",
        "the gateway dialed the CONNECT's address for a name that does not resolve to it"
    );
    let reasons = blocked_for(&gw, "sbx-b", "meta.example");
    assert!(
        reasons.iter().any(|r| r.contains("link-local")),
        "meta.example's refusal is recorded: {reasons:?}; ledger: {:?}",
        gw.ledger("sbx-b")
    );
    let refused_dst: Vec<String> = gw
        .ledger("sbx-b")
        .iter()
        .filter(|l| l["kind"] == "blocked" && l["host"] == "meta.example")
        .filter_map(|l| l["dst"].as_str().map(str::to_string))
        .collect();
    assert!(
        refused_dst.iter().all(|d| !d.starts_with("127.0.0.1:")),
        "a refusal by name names the CONNECT's address as its destination: {refused_dst:?}"
    );
    let (url, resolve) = via("good.example");
    let _ = curl_in(&ns, &b.url("socks5"), &url, Some(&resolve));
    let log = listeners.log();
    assert!(
        log.contains("hit 127.0.0.2"),
        "good.example's address was not reached: {log}"
    );
    assert!(
        !log.contains("hit 127.0.0.1"),
        "the CONNECT's address was dialed: {log}"
    );
    let dst: Vec<String> = gw
        .ledger("sbx-b")
        .iter()
        .filter(|l| l["kind"] == "passthrough" && l["host"] == "good.example")
        .map(|l| l["dst"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        dst,
        [format!("127.0.0.2:{port}")],
        "the passthrough line names the address the name resolved to"
    );
    gw.stop();
}

/// argv HOST PORT USER PASS then `ADDR:PORT` targets: per target a SOCKS5
/// CONNECT by IPv6 address (ATYP 4), then an HTTP/1.0 request without a
/// Host header (nothing names another host); prints `TARGET REP BODY`
/// (REP in hex or `closed`, BODY the answer's last line or `-`). Run
/// after [`PY_LIB`].
const SOCKS5_V6_PY: &str = r#"
import socket, sys
host, port, user, password = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode(), sys.argv[4].encode()
for target in sys.argv[5:]:
    addr, p = target.rsplit(":", 1)
    c = socket.create_connection((host, port), timeout=15)
    body = "-"
    try:
        assert socks5_login(c, user, password)[1] == b"\x01\x00", "login refused"
        c.sendall(b"\x05\x01\x00\x04" + socket.inet_pton(socket.AF_INET6, addr) + int(p).to_bytes(2, "big"))
        rep = "%02x" % exact(c, 10)[1]
        if rep == "00":
            c.sendall(b"GET / HTTP/1.0\r\n\r\n")
            data = b""
            while True:
                piece = c.recv(4096)
                if not piece:
                    break
                data += piece
            body = data.decode(errors="replace").strip().splitlines()[-1] if data.strip() else "-"
    except (EOFError, OSError):
        rep = "closed"
    print(target, rep, body, flush=True)
    c.close()
"#;

/// Item 6: IPv6. A loopback IPv6 listener, reached by `socks5h://` with an
/// IPv6 literal and by a raw SOCKS5 CONNECT to an IPv6 address, and a
/// loopback IPv4 listener named through IPv4-mapped (`::ffff:127.0.0.1`)
/// and NAT64-embedded (`64:ff9b::7f00:1`) addresses: all refused and
/// recorded as loopback, no listener sees a connection. With `--allow-dial
/// ::1/128` the IPv6 listener is served and the passthrough line names it,
/// while the embedded forms stay refused.
#[test]
fn ipv6_and_ipv4_embedding_targets_obey_the_dial_policy() {
    if let Some(why) = platform_unavailable(&["python3", "curl"]) {
        return skip(&why);
    }
    let dir = TempDir::new("gwa-v6");
    let ns = Netns::create("gwav6");
    let listeners = PyServer::start(
        ns.command("python3"),
        &dir,
        "two",
        TWO_LISTENERS_PY,
        &["::1", "127.0.0.1"],
    );
    let port = listeners.port;
    let v6_url = format!("http://[::1]:{port}/");
    let script = py_script(dir.path(), "socks5_v6", SOCKS5_V6_PY);
    let targets = [
        format!("::1:{port}"),
        format!("::ffff:127.0.0.1:{port}"),
        format!("64:ff9b::7f00:1:{port}"),
    ];
    let raw = |gw: &Gateway, s: &Sandbox| {
        let mut cmd = ns.command("python3");
        cmd.arg(&script)
            .args([&gw.listen.ip().to_string(), &gw.listen.port().to_string()])
            .args([&s.username, &s.password])
            .args(&targets);
        let out = ns.output(&mut cmd, netns::DEADLINE);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "the SOCKS5 client: {stdout}{stderr}");
        stdout
    };

    let mut gw = Gateway::start_in(
        Some(&ns),
        "gwa-v6",
        "127.0.0.1:0",
        &["--mode", "passthrough"],
    );
    let a = gw.add_sandbox("sbx-a", "stripe");
    for scheme in ["socks5h", "socks5"] {
        let (ok, stdout, stderr) = curl_in(&ns, &a.url(scheme), &v6_url, None);
        assert!(
            !ok || !stdout.contains("reached"),
            "[::1] through {scheme} was served: {stdout} {stderr}"
        );
    }
    let answers = raw(&gw, &a);
    assert!(!answers.contains("reached"), "{answers}");
    assert_eq!(
        listeners.log(),
        "",
        "a loopback listener was dialed: {answers}"
    );
    let blocked: Vec<String> = gw
        .ledger("sbx-a")
        .iter()
        .filter(|l| l["kind"] == "blocked")
        .map(|l| l["reason"].as_str().unwrap_or_default().to_string())
        .collect();
    println!("A's blocked reasons: {blocked:?}");
    assert!(
        blocked.iter().filter(|r| r.contains("loopback")).count() >= 2 + targets.len(),
        "every attempt is a blocked line naming loopback: {blocked:?}; answers: {answers}"
    );
    gw.stop();

    let mut gw = Gateway::start_in(
        Some(&ns),
        "gwa-v6-allow",
        "127.0.0.1:0",
        &["--mode", "passthrough", "--allow-dial", "::1/128"],
    );
    let b = gw.add_sandbox("sbx-b", "stripe");
    let (ok, stdout, stderr) = curl_in(&ns, &b.url("socks5h"), &v6_url, None);
    assert!(
        ok && stdout == "reached",
        "with --allow-dial ::1/128, [::1] is served: {stdout:?} {stderr}"
    );
    let answers = raw(&gw, &b);
    let log = listeners.log();
    assert!(log.contains("hit ::1"), "{log}");
    assert!(
        !log.contains("hit 127.0.0.1"),
        "an IPv4-embedding address reached 127.0.0.1 under an IPv6-only exception: {log}; {answers}"
    );
    let dst: Vec<String> = gw
        .ledger("sbx-b")
        .iter()
        .filter(|l| l["kind"] == "passthrough")
        .map(|l| l["dst"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        dst.contains(&format!("[::1]:{port}")),
        "the passthrough line names [::1]: {dst:?}"
    );
    gw.stop();
}

/// Re-signs a sandbox ledger with a key of its own (Python
/// `cryptography`): argv LEDGER PUB. Changes the first request's status to
/// 201, recomputes the chain and every seal, and writes its key to PUB.
const RESIGN_PY: &str = r#"
import hashlib, json, sys
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
path, pub = sys.argv[1], sys.argv[2]
key = Ed25519PrivateKey.generate()
raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
fp = hashlib.sha256(raw).hexdigest()
out, prev, edited = [], "0" * 64, False
for text in open(path).read().splitlines():
    line = json.loads(text)
    if line["kind"] == "request" and not edited:
        line["status"], edited = 201, True
    if line["kind"] == "session":
        line["key_id"], line["public_key"] = fp, raw.hex()
    line["prev"] = prev
    if line["kind"] == "seal":
        msg = "veris-seal-v2 %d %s %s" % (line["sealed_seq"], prev, line["reason"])
        line["signature"], line["key_id"] = key.sign(msg.encode()).hex(), fp
    text = json.dumps(line, separators=(",", ":"))
    out.append(text)
    prev = hashlib.sha256(text.encode()).hexdigest()
assert edited
open(path, "w").write("\n".join(out) + "\n")
open(pub, "w").write("ed25519 " + raw.hex() + "\n")
"#;

/// Item 4: after the gateway stopped, a sandbox's receipt pinned with the
/// seal key the gateway announced is verified; a copy whose ledger the
/// workload edited, truncated, or re-signed with its own key (ledger.pub
/// replaced) never reads verified.
#[test]
fn a_stopped_gateways_sandbox_receipt_is_verified_pinned_and_tampering_never_is() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let mut gw = Gateway::start("gwa-offline", "127.0.0.1:0", &[]);
    let key = gw.ready["seal_key"]
        .as_str()
        .expect("seal_key in the ready file")
        .to_string();
    let a = gw.add_sandbox("sbx-a", "stripe");
    let ca = gw.ca();
    probe_canary(&a.url("socks5h"), &ca);
    charge_ok(&a.url("socks5h"), &ca, "A");
    charge_ok(&a.url("http"), &ca, "A");
    gw.stop();

    let read = |state: &Path, pin: bool| {
        let mut cmd = gw.veris(&["receipt", "--require-verified", "--state-dir"]);
        cmd.arg(state).args(["--sandbox", "sbx-a"]);
        if pin {
            cmd.args(["--key", &key]);
        }
        let out = output(&mut cmd);
        let (stdout, stderr) = text(&out);
        (out.status.code(), format!("{stdout}{stderr}"))
    };
    let (code, said) = read(&gw.state, true);
    assert!(said.contains("integrity: verified"), "{said}");
    assert!(said.contains(r#"POST "/v1/charges" -> 200"#), "{said}");
    assert_eq!(code, Some(0), "{said}");

    let tampered = |label: &str, tamper: &dyn Fn(&Path)| {
        let copy = gw.dir.join(label);
        let out = output(command("cp").arg("-a").arg(&gw.state).arg(&copy));
        assert!(out.status.success(), "{:?}", text(&out));
        tamper(&copy.join("sandboxes/sbx-a"));
        for pin in [true, false] {
            let (code, said) = read(&copy, pin);
            assert!(
                !said.contains("integrity: verified"),
                "{label} (pinned: {pin}) reads verified: {said}"
            );
            assert_eq!(code, Some(3), "{label} (pinned: {pin}): {said}");
        }
    };
    let ledger_of = |dir: &Path| dir.join("ledger.jsonl");
    tampered("edited", &|dir| {
        let text = std::fs::read_to_string(ledger_of(dir)).unwrap();
        assert!(text.contains(r#""status":200"#));
        std::fs::write(
            ledger_of(dir),
            text.replacen(r#""status":200"#, r#""status":201"#, 1),
        )
        .unwrap();
    });
    tampered("truncated", &|dir| {
        let text = std::fs::read_to_string(ledger_of(dir)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let kept = lines[..lines.len() - 2].join("\n") + "\n";
        std::fs::write(ledger_of(dir), kept).unwrap();
    });
    if support::tool_works(
        "python3",
        &[
            "-c",
            "import cryptography.hazmat.primitives.asymmetric.ed25519",
        ],
    ) {
        tampered("resigned", &|dir| {
            let out = output(
                command("python3")
                    .args(["-c", RESIGN_PY])
                    .arg(ledger_of(dir))
                    .arg(dir.join("ledger.pub")),
            );
            assert!(out.status.success(), "{:?}", text(&out));
        });
    } else {
        println!("python3 cryptography missing: the re-signed ledger is not checked");
    }
}

/// The permission bits of `path`.
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Item 5: a sandbox's directory (0700) and its ledger (0600) are the
/// gateway uid's alone: they hold one tenant's request paths, which other
/// users of the gateway host must not read. The tokens are 0600 too.
#[test]
fn a_sandboxs_dir_and_ledger_are_private_to_the_gateway_uid() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let mut gw = Gateway::start("gwa-modes", "127.0.0.1:0", &[]);
    let a = gw.add_sandbox("sbx-a", "stripe");
    charge_ok(&a.url("socks5h"), &gw.ca(), "A");
    let dir = gw.state.join("sandboxes/sbx-a");
    let check = |when: &str| {
        assert_eq!(mode(&dir), 0o700, "the sandbox dir {when}");
        assert_eq!(mode(&dir.join("ledger.jsonl")), 0o600, "its ledger {when}");
    };
    check("while served");
    assert_eq!(mode(&dir.join("admin.token")), 0o600, "its read token");
    assert_eq!(
        mode(&gw.state.join("admin.token")),
        0o600,
        "the admin token"
    );
    gw.stop();
    check("after the gateway stopped");
}

/// argv HOST PORT: SOCKS5 and HTTP Basic logins whose usernames carry a
/// forged log line after a newline; prints `done`.
const LOG_INJECT_PY: &str = r#"
import base64, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
forged = "\n2026-12-03T00:00:00.000000Z  INFO veris: FORGED sandbox registered sandbox=root"
c = socket.create_connection((host, port), timeout=10)
c.sendall(b"\x05\x01\x02")
c.recv(2)
user = ("x" + forged).encode()[:255]
c.sendall(bytes([1, len(user)]) + user + b"\x01p")
c.recv(2)
c.close()
auth = base64.b64encode(("y\r" + forged + ":p").encode()).decode()
c = socket.create_connection((host, port), timeout=10)
c.sendall(("GET http://api.stripe.com/ HTTP/1.1\r\nHost: api.stripe.com\r\nProxy-Authorization: Basic %s\r\n\r\n" % auth).encode())
c.recv(4096)
c.close()
print("done")
"#;

/// Item 8: a username that carries a forged log line (newline, then text
/// shaped like the gateway's own line) shows up in the gateway's log only
/// escaped, inside the refusal line, never as a line of its own.
#[test]
fn a_username_cannot_forge_a_line_in_the_gateways_log() {
    if let Some(why) = missing(&["python3"]) {
        return skip(&why);
    }
    let mut gw = Gateway::start("gwa-loginject", "127.0.0.1:0", &[]);
    let port = gw.listen.port().to_string();
    let out = output(command("python3").args(["-c", LOG_INJECT_PY, "127.0.0.1", &port]));
    assert_eq!(text(&out).0.trim(), "done", "{:?}", text(&out));
    gw.stop();
    let log = gw.stderr();
    // A parser may refuse such a name before any line is logged; where one
    // is logged, the name is inside it, escaped.
    println!(
        "{} refusal lines carry the forged text",
        log.matches("FORGED").count()
    );
    assert!(
        !log.lines().any(|l| l.starts_with("2026-12-03T00")),
        "a forged line in the gateway's log: {log}"
    );
    for line in log.lines().filter(|l| l.contains("FORGED")) {
        assert!(
            line.contains("refused a sandbox credential") && !line.starts_with("2026-12-03T00"),
            "a username made a line of its own in the gateway's log: {line:?}"
        );
    }
}

/// Item 8: the admin API's sandbox id as a path: dot-segments and their
/// percent-encodings on GET and DELETE reach no other sandbox and no file
/// (404/400, A still served); an id that is a path is refused at
/// registration; a removed sandbox's read token reads nothing, and its id
/// is not registered again (an id is served once).
#[test]
fn admin_paths_and_stale_read_tokens_reach_no_other_sandbox() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let mut gw = Gateway::start("gwa-paths", "127.0.0.1:0", &[]);
    let a = gw.add_sandbox("sbx-a", "stripe");
    let b = gw.add_sandbox_json("sbx-b", "stripe");
    let ca = gw.ca();
    let token = gw.admin_token();
    let b_token = b.json.as_ref().unwrap()["read_token"]
        .as_str()
        .unwrap()
        .to_string();
    for (method, path) in [
        ("DELETE", "/sandboxes/.."),
        ("DELETE", "/sandboxes/%2e%2e"),
        ("DELETE", "/sandboxes/sbx-b/../sbx-a"),
        ("DELETE", "/sandboxes/..%2Fsbx-a"),
        ("GET", "/sandboxes/../sandboxes/sbx-a/status"),
        ("GET", "/sandboxes/%2e%2e/sbx-a/status"),
        ("GET", "/sandboxes/sbx-a%2F..%2Fsbx-b/status"),
        ("GET", "/sandboxes/sbx-b/..%2F..%2Fadmin.token"),
    ] {
        let (status, body) = gw.admin_api(method, path, Some(&token), None);
        assert!(
            status == "404" || status == "400",
            "admin {method} {path}: {status} {body}"
        );
        assert!(
            !body.contains(&token),
            "{method} {path} answered the admin token"
        );
        // B's read token on a path that names A through dot-segments.
        let (status, body) = gw.admin_api(method, path, Some(&b_token), None);
        assert!(
            status == "404" || status == "400" || status == "401",
            "B's read token on {method} {path}: {status} {body}"
        );
    }
    for id in ["..", "../x", "a%2Fb", "sbx-a/../../x"] {
        let out = gw.admin_command("add-sandbox", &[id, "--services", "stripe"]);
        assert!(!out.status.success(), "add-sandbox {id:?} was accepted");
    }
    assert!(!gw.dir.join("x").exists() && !gw.state.join("x").exists());
    charge_ok(&a.url("socks5h"), &ca, "A after the path tricks");
    charge_ok(&b.url("socks5h"), &ca, "B after the path tricks");

    // B removed: its read token reads nothing, and its id is not served
    // again (its chain ended in its final seal).
    gw.remove_sandbox("sbx-b");
    for path in [
        "/sandboxes/sbx-b/status",
        "/sandboxes/sbx-b/ledger",
        "/sandboxes/sbx-b/receipt",
    ] {
        let (status, _) = gw.admin_api("GET", path, Some(&b_token), None);
        assert_eq!(status, "404", "a removed sandbox's token on {path}");
    }
    let out = gw.admin_command("add-sandbox", &["sbx-b", "--services", "stripe"]);
    let (stdout, stderr) = support::text(&out);
    assert!(!out.status.success(), "a removed id added again: {stdout}");
    assert!(stderr.contains("an id is served once"), "{stderr}");
    gw.stop();
}

/// argv HOST PORT then `USER:PASS` credentials (`-` for none): one
/// keep-alive connection, one absolute-form canary request per credential;
/// prints `STATUS SANDBOX` per request (`-` when there is none).
const SWITCH_PY: &str = r#"
import base64, http.client, json, sys
host, port = sys.argv[1], int(sys.argv[2])
c = http.client.HTTPConnection(host, port, timeout=10)
for cred in sys.argv[3:]:
    headers = {}
    if cred != "-":
        headers["Proxy-Authorization"] = "Basic " + base64.b64encode(cred.encode()).decode()
    c.request("GET", "http://canary.veris.internal/__veris/canary", headers=headers)
    r = c.getresponse()
    body = r.read()
    who = "-"
    if r.status == 200:
        who = json.loads(body)["sandbox_id"]
    print(r.status, who, flush=True)
"#;

/// Item 8: one keep-alive HTTP proxy connection that switches credentials
/// between requests: each request is served as the sandbox its own
/// credentials name, or refused (403: a connection belongs to the sandbox
/// its first request named), and one without (or with a crossed password)
/// gets 407, never the connection's earlier sandbox.
#[test]
fn credentials_switched_on_a_keep_alive_connection_are_judged_per_request() {
    if let Some(why) = missing(&["python3"]) {
        return skip(&why);
    }
    let mut gw = Gateway::start("gwa-switch", "127.0.0.1:0", &[]);
    let a = gw.add_sandbox("sbx-a", "stripe");
    let b = gw.add_sandbox("sbx-b", "stripe");
    let cred = |user: &str, pass: &str| format!("{user}:{pass}");
    let port = gw.listen.port().to_string();
    let out = output(
        command("python3")
            .args(["-c", SWITCH_PY, "127.0.0.1", &port])
            .args([
                cred(&a.username, &a.password),
                "-".into(),
                cred(&b.username, &b.password),
                cred(&b.username, &a.password),
                cred(&a.username, &a.password),
            ]),
    );
    let (stdout, stderr) = text(&out);
    let lines: Vec<&str> = stdout.trim().lines().collect();
    assert_eq!(lines.len(), 5, "{stdout}{stderr}");
    assert_eq!(lines[0], "200 sbx-a", "{stderr}");
    assert_eq!(lines[1], "407 -", "{stderr}");
    // B on A's connection is refused (403); on a new one it is B's.
    assert!(
        ["200 sbx-b", "403 -"].contains(&lines[2]),
        "B's credentials served as another sandbox: {stdout}{stderr}"
    );
    assert_eq!(lines[3], "407 -", "{stderr}");
    assert_eq!(lines[4], "200 sbx-a", "{stderr}");
    gw.stop();
}
