//! The gateway's TLS listener (`veris gateway --tls-listen`, issue G1): a
//! platform that reaches the gateway over the internet speaks SOCKS5 or
//! HTTP CONNECT inside TLS, so the sandbox's credential never crosses the
//! network in clear. Clients are real: curl's `https://` proxy (CONNECT
//! inside TLS) trusting the gateway's CA or an operator's certificate, and,
//! as the platform, redsocks in a sandbox namespace speaking SOCKS5 to a
//! host-side `stunnel` (client mode, verifying the gateway's chain and
//! name) that wraps it in TLS to the gateway.
//!
//! The attacks: a client that does not trust the gateway's certificate
//! gets through anyway; a plaintext client on the TLS listener has its
//! credential read (or accepted); a TLS client sending garbage, or a client
//! stalling its handshake, holds its connection or the listener.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::support::gateway::*;
use crate::support::netns::{self, run_ok, self_signed};
use crate::support::{
    self, command, output, skip, text, veris, wait_for, Guard, TempDir, DEADLINE,
};

/// The gateway's TLS listener, from its ready file.
fn tls_address(gw: &Gateway) -> SocketAddr {
    gw.ready["tls_address"]
        .as_str()
        .unwrap_or_else(|| panic!("no `tls_address` in the ready file: {}", gw.ready))
        .parse()
        .expect("tls_address is ADDR:PORT")
}

/// A sandbox's ledger lines other than seals (which come and go with time).
fn unsealed(gw: &Gateway, id: &str) -> usize {
    gw.ledger(id).iter().filter(|l| l["kind"] != "seal").count()
}

/// A throwaway self-signed certificate and key under `dir` (`name.pem`,
/// `name-key.pem`) for `subject`, with `san` when given.
fn openssl_cert(dir: &TempDir, name: &str, subject: &str, san: Option<&str>) -> (PathBuf, PathBuf) {
    let (cert, key) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}-key.pem")),
    );
    run_ok(&mut self_signed(&cert, &key, subject, san));
    (cert, key)
}

/// Item (a): CONNECT inside TLS (curl's `https://` proxy) trusting the
/// gateway's CA reaches the stripe twin and the sandbox's receipt lists
/// it; the ready file and `add-sandbox --json` name the TLS listener, its
/// URL and the CA. A curl that trusts another CA is refused at the
/// handshake, before its credential is sent: no line in the ledger.
#[test]
fn connect_inside_tls_reaches_the_twin_and_an_untrusting_client_is_refused() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let mut gw = Gateway::start("gw-tls", "127.0.0.1:0", &["--tls-listen", "127.0.0.1:0"]);
    let tls = tls_address(&gw);
    let ca = gw.ca();
    assert_eq!(
        gw.ready["tls_ca"].as_str().map(PathBuf::from),
        Some(ca.clone()),
        "the ready file names the CA that verifies the TLS listener: {}",
        gw.ready
    );
    let a = gw.add_sandbox_json("sbx-a", "stripe");
    let json = a.json.clone().unwrap();
    assert_eq!(json["tls_address"], tls.to_string(), "{json}");
    assert_eq!(json["tls_ca"], ca.display().to_string(), "{json}");
    let https = json["https_proxy_url"].as_str().unwrap_or_default();
    assert_eq!(
        https,
        format!("https://{}:{}@{tls}", a.username, a.password),
        "{json}"
    );

    let (ok, status, stderr) = curl_charge_over_tls(https, &ca, &ca);
    assert!(
        ok && status == "200",
        "CONNECT inside TLS: curl ok={ok} status={status:?}: {stderr}; gateway: {}",
        gw.stderr()
    );
    let receipt = gw.receipt_json("sbx-a");
    assert_eq!(receipt["interception"], "gateway", "{receipt}");
    let listed = charges(&receipt);
    assert_eq!(listed.len(), 1, "the call over TLS is listed: {receipt}");
    assert_eq!(listed[0]["status"], 200, "{receipt}");

    // A client that trusts another CA: refused, nothing recorded.
    let dir = TempDir::new("gw-tls-other");
    let (other, _) = openssl_cert(&dir, "other", "/CN=other CA", None);
    let before = unsealed(&gw, "sbx-a");
    let (ok, status, stderr) = curl_charge_over_tls(https, &other, &ca);
    assert!(
        !ok,
        "a client that does not trust the gateway's certificate got through: {status} {stderr}"
    );
    assert!(
        stderr.to_lowercase().contains("certificate") || stderr.contains("SSL"),
        "curl fails at the proxy's certificate: {stderr}"
    );
    assert_eq!(
        unsealed(&gw, "sbx-a"),
        before,
        "a refused handshake left a line"
    );

    // The plain listener still serves (it may stay on a private network).
    charge_ok(&a.url("socks5h"), &ca, "plain SOCKS5");
    gw.stop();
}

/// `--tls-cert` and `--tls-key`: an operator's certificate is served (curl
/// trusts it alone, no gateway CA for the proxy), the answers name no CA
/// for it; a key of another certificate and an unreadable file stop the
/// start with a message that says what to do.
#[test]
fn an_operators_certificate_is_served_and_a_wrong_key_stops_the_start() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    if netns::which("openssl").is_none() {
        return skip("openssl not installed");
    }
    let dir = TempDir::new("gw-tls-operator");
    let (cert, key) = openssl_cert(
        &dir,
        "gw",
        "/CN=gw.veris.test",
        Some("subjectAltName=DNS:gw.veris.test,IP:127.0.0.1"),
    );
    let (_, other_key) = openssl_cert(&dir, "other", "/CN=other", None);

    let start_fails = |cert: &Path, key: &Path| {
        let out = output(
            veris(["gateway", "--state-dir"])
                .arg(dir.join("failed-state"))
                .args(["--listen", "127.0.0.1:0", "--tls-listen", "127.0.0.1:0"])
                .arg("--tls-cert")
                .arg(cert)
                .arg("--tls-key")
                .arg(key),
        );
        let (stdout, stderr) = text(&out);
        assert!(
            !out.status.success(),
            "the gateway started with {cert:?} and {key:?}: {stdout}"
        );
        stderr
    };
    let mismatched = start_fails(&cert, &other_key);
    assert!(
        mismatched.contains("does not belong") && mismatched.contains("next:"),
        "a key of another certificate: {mismatched}"
    );
    let unreadable = start_fails(&dir.join("absent.pem"), &key);
    assert!(
        unreadable.contains("cannot be read") && unreadable.contains("next:"),
        "a missing certificate file: {unreadable}"
    );

    let cert_arg = cert.display().to_string();
    let key_arg = key.display().to_string();
    let mut gw = Gateway::start(
        "gw-tls-op",
        "127.0.0.1:0",
        &[
            "--tls-listen",
            "127.0.0.1:0",
            "--tls-cert",
            &cert_arg,
            "--tls-key",
            &key_arg,
        ],
    );
    assert!(gw.ready["tls_ca"].is_null(), "{}", gw.ready);
    let a = gw.add_sandbox_json("sbx-a", "stripe");
    let json = a.json.clone().unwrap();
    assert!(json.get("tls_ca").is_none(), "{json}");
    let https = json["https_proxy_url"].as_str().unwrap_or_default();
    let (ok, status, stderr) = curl_charge_over_tls(https, &cert, &gw.ca());
    assert!(
        ok && status == "200",
        "CONNECT inside TLS with the operator's certificate: {status} {stderr}; gateway: {}",
        gw.stderr()
    );
    // The gateway's CA does not verify the operator's certificate.
    let (ok, _, _) = curl_charge_over_tls(https, &gw.ca(), &gw.ca());
    assert!(!ok, "the gateway CA verified the operator's certificate");
    assert_eq!(charges(&gw.receipt_json("sbx-a")).len(), 1);
    gw.stop();
}

/// stunnel in client mode: `[NAME]` sections from `services` (name,
/// accept, checkHost), each verifying the chain with `ca` and the name
/// against `connect`'s certificate; killed on drop.
struct Stunnel {
    _process: Guard,
}

impl Stunnel {
    fn start(
        dir: &TempDir,
        ca: &Path,
        connect: SocketAddr,
        services: &[(&str, SocketAddr, &str)],
    ) -> Stunnel {
        let mut conf = String::from("foreground = yes\npid =\ndebug = 5\n");
        for (name, accept, host) in services {
            conf.push_str(&format!(
                "[{name}]\nclient = yes\naccept = {accept}\nconnect = {connect}\nverifyChain = yes\nCAfile = {}\ncheckHost = {host}\nsni = {host}\n",
                ca.display()
            ));
        }
        let file = dir.join("stunnel.conf");
        std::fs::write(&file, conf).unwrap();
        let log = dir.join("stunnel.log");
        let mut process = Guard::spawn(
            command("stunnel")
                .arg(&file)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap()),
        );
        wait_for("stunnel's configuration", DEADLINE, || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Ok(Some(status)) = process.child().try_wait() {
                panic!("stunnel exited ({status}): {text}");
            }
            text.contains("Configuration successful").then_some(())
        });
        Stunnel { _process: process }
    }
}

/// A free port on `ip` (bound, then released for stunnel, which cannot
/// take port 0 and say what it got; the address is this test's own).
fn free_port(ip: &str) -> SocketAddr {
    let l = TcpListener::bind((ip, 0)).expect("binding a probe port");
    l.local_addr().unwrap()
}

/// Item (b): the platform that takes only SOCKS5 over TLS. A sandbox
/// namespace's proxy-unaware curl goes to redsocks, which speaks SOCKS5
/// with the sandbox's credential to stunnel on the host, which verifies
/// the gateway's chain (its CA) and name (`--tls-name gw.veris.test`) and
/// wraps the tunnel in TLS to the gateway's TLS listener. The call and the
/// canary probe land in the sandbox's receipt, verified. A second sandbox
/// whose stunnel checks another name never reaches the gateway.
#[test]
fn a_redsocks_sandbox_behind_stunnel_reaches_the_gateway_over_tls() {
    if let Some(why) = platform_unavailable(&["redsocks", "stunnel", "curl"]) {
        return skip(&why);
    }
    let dir = TempDir::new("gw-tls-platform");
    let platform = Platform::new();
    let mut gw = Gateway::start(
        "gw-tls-platform",
        "127.0.0.1:0",
        &["--tls-listen", "127.0.0.1:0", "--tls-name", "gw.veris.test"],
    );
    let tls = tls_address(&gw);
    let ca = gw.ca();
    let a = gw.add_sandbox_json("sbx-a", "stripe");
    let b = gw.add_sandbox_json("sbx-b", "stripe");
    let (good, wrong_name) = (free_port(&platform.addr), free_port(&platform.addr));
    let _stunnel = Stunnel::start(
        &dir,
        &ca,
        tls,
        &[
            ("good", good, "gw.veris.test"),
            ("wrongname", wrong_name, "other.veris.test"),
        ],
    );
    let na = platform.sandbox(&dir, "tla", good, &a.username, &a.password);
    let nb = platform.sandbox(&dir, "tlb", wrong_name, &b.username, &b.password);
    let stunnel_log = || std::fs::read_to_string(dir.join("stunnel.log")).unwrap_or_default();

    let charge_in = |net: &SandboxNet| {
        net.output(
            net.command("curl")
                .args([
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
                .args([HTTPS_CHARGES, "-d", "amount=100", "-d", "currency=usd"]),
        )
    };
    let out = charge_in(&na);
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success() && stdout.trim() == "200",
        "proxy-unaware curl in A: {stdout:?} {stderr}; redsocks: {}; stunnel: {}; gateway: {}",
        std::fs::read_to_string(&na.log).unwrap_or_default(),
        stunnel_log(),
        gw.stderr()
    );
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
    assert_eq!(
        canary["canary"],
        a.canary.clone().unwrap().as_str(),
        "{canary}"
    );

    let receipt = gw.receipt_json("sbx-a");
    assert_eq!(receipt["interception"], "gateway", "{receipt}");
    assert_eq!(charges(&receipt).len(), 1, "{receipt}");
    assert_eq!(
        receipt["integrity"]["status"], "verified",
        "A probed from inside over TLS: {receipt}"
    );

    // B's stunnel expects another name: the tunnel never opens.
    let before = unsealed(&gw, "sbx-b");
    let out = charge_in(&nb);
    assert!(
        !out.status.success(),
        "B reached the twin through a stunnel that refuses the gateway's name: {:?}",
        text(&out)
    );
    assert_eq!(unsealed(&gw, "sbx-b"), before, "B's ledger grew");
    assert!(charges(&gw.receipt_json("sbx-b")).is_empty());
    gw.stop();
}

/// argv TLS_HOST TLS_PORT PLAIN_PORT USER PASS: plaintext SOCKS5 and HTTP
/// CONNECT with the sandbox's real credential, to the TLS listener (each
/// line says what came back: `closed` means no byte) and, for comparison,
/// SOCKS5 to the plain listener (`plain-socks5 auth 0100` when accepted).
const PLAINTEXT_PY: &str = r#"
import base64, socket, sys
host, tls_port, plain_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
user, password = sys.argv[4].encode(), sys.argv[5].encode()
auth = bytes([1, len(user)]) + user + bytes([len(password)]) + password
name = b"api.stripe.com"
request = bytes([5, 1, 0, 3, len(name)]) + name + b"\x01\xbb"
def answer(port, payload):
    c = socket.create_connection((host, port), timeout=10)
    try:
        c.sendall(payload)
        got = b""
        while True:
            piece = c.recv(4096)
            if not piece:
                break
            got += piece
    except ConnectionResetError:
        pass
    except socket.timeout:
        return "open"
    finally:
        c.close()
    return got.hex() if got else "closed"
print("socks5-greeting", answer(tls_port, b"\x05\x01\x02"))
print("socks5-all-at-once", answer(tls_port, b"\x05\x01\x02" + auth + request))
basic = base64.b64encode(user + b":" + password)
print("http-connect", answer(tls_port, b"CONNECT api.stripe.com:443 HTTP/1.1\r\nHost: api.stripe.com:443\r\nProxy-Authorization: Basic " + basic + b"\r\n\r\n"))
c = socket.create_connection((host, plain_port), timeout=10)
c.sendall(b"\x05\x01\x02")
c.recv(2)
c.sendall(auth)
print("plain-socks5 auth", c.recv(2).hex())
c.close()
"#;

/// Item (c), plaintext: a SOCKS5 client and an HTTP CONNECT client with
/// the sandbox's real credential speak plaintext to the TLS listener. Both
/// are closed without a byte (no SOCKS5 method selection, so the SOCKS5
/// client never even sends its credential; no 200 nor 407), no ledger line,
/// no credential check in the log, no password in the log; the same
/// credential is accepted on the plain listener.
#[test]
fn a_plaintext_client_on_the_tls_listener_is_closed_before_its_credential_is_read() {
    if let Some(why) = missing(&["python3"]) {
        return skip(&why);
    }
    let mut gw = Gateway::start(
        "gw-tls-plain",
        "127.0.0.1:0",
        &["--tls-listen", "127.0.0.1:0"],
    );
    let tls = tls_address(&gw);
    let a = gw.add_sandbox("sbx-a", "stripe");
    let before = unsealed(&gw, "sbx-a");
    let script = gw.dir.join("plaintext.py");
    std::fs::write(&script, PLAINTEXT_PY).unwrap();
    let out = output(command("python3").arg(&script).args([
        "127.0.0.1",
        &tls.port().to_string(),
        &gw.listen.port().to_string(),
        &a.username,
        &a.password,
    ]));
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    for line in [
        "socks5-greeting closed",
        "socks5-all-at-once closed",
        "http-connect closed",
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "want `{line}` from a plaintext client on the TLS listener: {stdout}"
        );
    }
    assert!(
        stdout.contains("plain-socks5 auth 0100"),
        "the same credential is accepted on the plain listener: {stdout}"
    );
    assert_eq!(
        unsealed(&gw, "sbx-a"),
        before,
        "a plaintext client left a line"
    );
    let log = gw.stderr();
    assert!(
        log.contains("plaintext client on the gateway's TLS listener"),
        "the operator is told why: {log}"
    );
    assert!(
        !log.contains("refused a sandbox credential"),
        "a plaintext client's credential was checked: {log}"
    );
    assert!(
        !log.contains(&a.password),
        "the password is in the gateway's log"
    );
    gw.stop();
}

/// argv HOST PORT CA: a TLS client (verifying with CA) that sends garbage
/// after the handshake, one that sends a second ClientHello inside, and
/// one that completes the handshake and says nothing: each line says
/// whether the gateway closed it (`closed`) or answered (hex).
const GARBAGE_PY: &str = r#"
import socket, ssl, sys
host, port, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ctx = ssl.create_default_context(cafile=ca)
def after_handshake(payload):
    raw = socket.create_connection((host, port), timeout=40)
    c = ctx.wrap_socket(raw, server_hostname=host)
    try:
        if payload:
            c.sendall(payload)
        got = c.recv(4096)
    except (ConnectionResetError, ssl.SSLError, ssl.SSLEOFError):
        got = b""
    except socket.timeout:
        return "open"
    finally:
        c.close()
    return got.hex() if got else "closed"
print("garbage", after_handshake(b"\x00\xffGARBAGE\r\n\r\n"))
print("tls-in-tls", after_handshake(b"\x16\x03\x01\x00\x05hello"))
print("silent", after_handshake(b""))
"#;

/// argv HOST PORT: a client that stalls its TLS handshake after the record
/// header and one that trickles a ClientHello a byte a second; prints
/// `holding`, then, once the gateway closed each (bounded at 40 s),
/// `stalled closed` and `trickle closed`.
const SLOW_PY: &str = r#"
import socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
stalled = socket.create_connection((host, port), timeout=40)
stalled.sendall(b"\x16\x03\x01")
trickle = socket.create_connection((host, port), timeout=2)
hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 600
print("holding", flush=True)
def closed(c):
    try:
        return c.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False
verdict = "open"
deadline = time.time() + 40
for b in hello:
    if time.time() > deadline:
        break
    try:
        trickle.send(bytes([b]))
    except OSError:
        verdict = "closed"
        break
    if closed(trickle):
        verdict = "closed"
        break
print("trickle", verdict, flush=True)
print("stalled", "closed" if closed(stalled) else "open", flush=True)
"#;

/// Item (c), misbehaving TLS clients: garbage after the handshake, a TLS
/// handshake inside TLS, and silence after the handshake are closed
/// without an answer; a stalled and a trickling handshake are closed by
/// the handshake timeout, and while they hang a real client is served.
#[test]
fn garbage_and_slow_handshakes_on_the_tls_listener_are_closed() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    if let Some(why) = missing(&["python3"]) {
        return skip(&why);
    }
    let mut gw = Gateway::start(
        "gw-tls-garbage",
        "127.0.0.1:0",
        &["--tls-listen", "127.0.0.1:0"],
    );
    let tls = tls_address(&gw);
    let ca = gw.ca();
    let a = gw.add_sandbox_json("sbx-a", "stripe");
    let https = a.json.as_ref().unwrap()["https_proxy_url"]
        .as_str()
        .unwrap()
        .to_string();
    let before = unsealed(&gw, "sbx-a");

    let garbage = gw.dir.join("garbage.py");
    std::fs::write(&garbage, GARBAGE_PY).unwrap();
    let out = support::output_within(
        command("python3")
            .arg(&garbage)
            .args(["127.0.0.1", &tls.port().to_string()])
            .arg(&ca),
        Duration::from_secs(90),
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    for line in ["garbage closed", "tls-in-tls closed", "silent closed"] {
        assert!(stdout.lines().any(|l| l == line), "want `{line}`: {stdout}");
    }
    assert_eq!(unsealed(&gw, "sbx-a"), before, "garbage left a line");

    let slow = gw.dir.join("slow.py");
    std::fs::write(&slow, SLOW_PY).unwrap();
    let mut child = Guard::spawn(
        command("python3")
            .arg(&slow)
            .args(["127.0.0.1", &tls.port().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    );
    let stdout = child.child().stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    assert_eq!(
        rx.recv_timeout(DEADLINE).unwrap_or_default(),
        "holding",
        "the slow clients did not start"
    );
    let (ok, status, stderr) = curl_charge_over_tls(&https, &ca, &ca);
    assert!(
        ok && status == "200",
        "a real client while slow handshakes hang: {status} {stderr}"
    );
    let verdicts: Vec<Value> = (0..2)
        .map(|_| Value::from(rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default()))
        .collect();
    assert_eq!(
        verdicts,
        [Value::from("trickle closed"), Value::from("stalled closed")],
        "the handshake timeout closes slow clients"
    );
    assert_eq!(charges(&gw.receipt_json("sbx-a")).len(), 1);
    gw.stop();
}
