//! A CA that can only sign for the vendors (issue E2): the interception CA
//! carries X.509 name constraints and lives a year.
//! - `veris ca rotate` makes the next CA, keeps the previous certificate
//!   and says what changed;
//! - a route (or a gateway's `--tls-name`) outside the CA's constraints is
//!   refused at start with the fix, and the CA file is left as it was
//!   (never silently regenerated);
//! - an expired CA is refused with the fix and left as it was; one within
//!   30 days of its end is warned about (start log, doctor);
//! - a CA made before constraints keeps working, and the start log and
//!   `veris doctor` say it is unconstrained and how to get a constrained one;
//! - strict mode refuses a name outside the constraints without a
//!   certificate and records it as `blocked`, not as a `trust_failure`, and
//!   so does any mode for a ClientHello naming such a host behind a routed
//!   `CONNECT`;
//! - real clients (OpenSSL, Python, Node, Go, Java) trusting only the CA
//!   accept a leaf for a routed vendor and refuse one a thief holding the
//!   CA key made for another name.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::Value;

use crate::support::*;

fn ok_output(cmd: &mut std::process::Command) -> String {
    let out = output(cmd);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    stdout
}

fn has_tool(tool: &str, probe: &[&str]) -> bool {
    if tool_works(tool, probe) {
        return true;
    }
    skip(&format!("`{tool}` is not installed"));
    false
}

#[test]
fn rotate_makes_the_next_constrained_ca_and_keeps_the_previous_certificate() {
    if !has_tool("openssl", &["version"]) {
        return;
    }
    let dir = TempDir::new("ca-rotate");
    let state = dir.join("state");
    ok_output(veris(["ca", "init", "--state-dir"]).arg(&state));
    let ca_pem = state.join("ca").join("veris-ca.pem");
    let first = std::fs::read_to_string(&ca_pem).unwrap();
    let first_key = std::fs::read(state.join("ca").join("veris-ca-key.pem")).unwrap();
    let shown = ok_output(veris(["ca", "show", "--state-dir"]).arg(&state));
    assert!(
        shown.contains("may sign for: ") && shown.contains("api.stripe.com"),
        "{shown}"
    );
    let text_of = |pem: &Path| {
        ok_output(
            command("openssl")
                .args(["x509", "-noout", "-text", "-in"])
                .arg(pem),
        )
    };
    let parsed = text_of(&ca_pem);
    assert!(
        parsed.contains("X509v3 Name Constraints: critical"),
        "{parsed}"
    );
    assert!(parsed.contains("DNS:api.stripe.com"), "{parsed}");
    assert!(parsed.contains("DNS:canary.veris.internal"), "{parsed}");
    assert!(!parsed.contains("DNS:api.acme.test"), "{parsed}");
    // One year: valid in 364 days, not in 366.
    let valid_in = |days: u32| {
        command("openssl")
            .args(["x509", "-noout", "-checkend"])
            .arg((days * 86_400).to_string())
            .arg("-in")
            .arg(&ca_pem)
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success()
    };
    assert!(valid_in(364) && !valid_in(366), "not a one-year CA");

    let said = ok_output(veris(["ca", "rotate", "--state-dir"]).arg(&state).args([
        "--route",
        "acme=api.acme.test",
        "--name",
        "gw.example.net",
    ]));
    assert!(
        said.contains("added:       api.acme.test, gw.example.net"),
        "{said}"
    );
    assert!(said.contains("removed:     none"), "{said}");
    assert!(said.contains("Next: give every client the new"), "{said}");
    let prev = state.join("ca").join("veris-ca.prev.pem");
    assert_eq!(std::fs::read_to_string(&prev).unwrap(), first);
    assert_ne!(std::fs::read_to_string(&ca_pem).unwrap(), first);
    assert_ne!(
        std::fs::read(state.join("ca").join("veris-ca-key.pem")).unwrap(),
        first_key,
        "a rotation makes a new key"
    );
    assert!(text_of(&ca_pem).contains("DNS:api.acme.test"));
    // The published trust material follows the new CA.
    let trusted = std::fs::read_to_string(state.join("trust").join("ca.pem")).unwrap();
    assert_eq!(trusted, std::fs::read_to_string(&ca_pem).unwrap());

    // Rotating again without the route says it is gone.
    let said = ok_output(veris(["ca", "rotate", "--state-dir"]).arg(&state));
    assert!(
        said.contains("removed:     api.acme.test, gw.example.net"),
        "{said}"
    );
}

#[test]
fn a_route_outside_the_constraints_is_refused_at_start_with_the_fix() {
    let dir = TempDir::new("ca-outside");
    let state = dir.join("state");
    ok_output(veris(["ca", "init", "--state-dir"]).arg(&state));
    let ca_pem = state.join("ca").join("veris-ca.pem");
    let before = std::fs::read_to_string(&ca_pem).unwrap();
    let out = output_within(
        veris(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(&state)
            .args(["--route", "acme=api.acme.test"]),
        DEADLINE,
    );
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "served: {stdout}\n{stderr}");
    assert!(
        stderr.contains("may not sign for api.acme.test") && stderr.contains("veris ca rotate"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(&ca_pem).unwrap(),
        before,
        "the CA was replaced behind the user's back"
    );
    // The fix the message names works.
    ok_output(
        veris(["ca", "rotate", "--state-dir"])
            .arg(&state)
            .args(["--route", "acme=api.acme.test"]),
    );
    let mut serve = Serve::start_in(dir, &["--route", "acme=api.acme.test"]);
    serve.stop();
}

/// A CA as veris made them before name constraints: no constraints,
/// `pathlen:0`, valid `days` (veris made them for ten years).
fn legacy_ca(ca_dir: &Path, days: u32) {
    std::fs::create_dir_all(ca_dir).unwrap();
    let made = command("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:P-256", "-nodes", "-days"])
        .arg(days.to_string())
        .args(["-subj", "/CN=veris interception CA/O=veris"])
        .args(["-addext", "basicConstraints=critical,CA:TRUE,pathlen:0"])
        .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
        .arg("-keyout")
        .arg(ca_dir.join("veris-ca-key.pem"))
        .arg("-out")
        .arg(ca_dir.join("veris-ca.pem"))
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(made, "openssl made the legacy CA");
    use std::os::unix::fs::PermissionsExt;
    let private = std::fs::Permissions::from_mode(0o600);
    std::fs::set_permissions(ca_dir.join("veris-ca-key.pem"), private).unwrap();
    std::fs::set_permissions(ca_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
}

#[test]
fn an_unconstrained_ca_keeps_working_and_doctor_and_the_start_log_say_so() {
    if !has_tool("openssl", &["version"]) {
        return;
    }
    if let Err(why) = curl() {
        return skip(&why);
    }
    let dir = TempDir::new("ca-legacy");
    let state = dir.join("state");
    legacy_ca(&state.join("ca"), 3650);
    let before = std::fs::read_to_string(state.join("ca").join("veris-ca.pem")).unwrap();
    // Any route: an unconstrained CA signs for anything.
    let mut serve = Serve::start_in(dir, &["--route", "acme=api.acme.test"]);
    let out = output(
        serve
            .curl()
            .args(["-o", "/dev/null", "-w", "%{http_code}"])
            .arg("https://api.stripe.com/v1/customers"),
    );
    assert_eq!(text(&out).0, "200", "{:?}", text(&out));
    let log = serve.stderr();
    assert!(
        log.contains("the CA is unconstrained") && log.contains("veris ca rotate"),
        "{log}"
    );
    let doctor = output(veris(["doctor", "--state-dir"]).arg(&serve.state));
    let (stdout, stderr) = text(&doctor);
    assert!(
        stdout.contains("is unconstrained") && stdout.contains("`veris ca rotate --state-dir"),
        "{stdout}\n{stderr}"
    );
    serve.stop();
    assert_eq!(
        std::fs::read_to_string(serve.state.join("ca").join("veris-ca.pem")).unwrap(),
        before,
        "the old CA was replaced"
    );
}

/// A veris-shaped CA whose validity ended in 2021 (`openssl ca -selfsign`
/// sets dates in the past).
fn expired_ca(ca_dir: &Path, work: &Path) {
    std::fs::create_dir_all(ca_dir).unwrap();
    std::fs::create_dir_all(work).unwrap();
    let key = ca_dir.join("veris-ca-key.pem");
    ok_output(
        command("openssl")
            .args(["req", "-new", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:P-256", "-nodes"])
            .args(["-subj", "/CN=veris interception CA"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(work.join("ca.csr")),
    );
    std::fs::write(work.join("index.txt"), "").unwrap();
    std::fs::write(work.join("serial"), "01\n").unwrap();
    std::fs::write(
        work.join("ca.cnf"),
        "[ca]\ndefault_ca=c\n[c]\ndatabase=index.txt\nnew_certs_dir=.\nserial=serial\npolicy=p\ndefault_md=sha256\n[p]\ncommonName=supplied\n[v]\nbasicConstraints=critical,CA:TRUE,pathlen:0\nkeyUsage=critical,keyCertSign,cRLSign\n",
    )
    .unwrap();
    ok_output(
        command("openssl")
            .current_dir(work)
            .args(["ca", "-batch", "-config", "ca.cnf", "-selfsign", "-keyfile"])
            .arg(&key)
            .args(["-in", "ca.csr", "-extensions", "v", "-notext"])
            .args([
                "-startdate",
                "20200101000000Z",
                "-enddate",
                "20210101000000Z",
            ])
            .arg("-out")
            .arg(ca_dir.join("veris-ca.pem")),
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(ca_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
}

#[test]
fn an_expired_ca_is_refused_with_the_fix_and_never_replaced_behind_the_users_back() {
    if !has_tool("openssl", &["version"]) {
        return;
    }
    let dir = TempDir::new("ca-expired");
    let state = dir.join("state");
    expired_ca(&state.join("ca"), &dir.join("openssl"));
    let ca_pem = state.join("ca").join("veris-ca.pem");
    let before = std::fs::read_to_string(&ca_pem).unwrap();
    let out = output_within(
        veris(["serve", "--listen", "127.0.0.1:0", "--state-dir"]).arg(&state),
        DEADLINE,
    );
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "served: {stdout}{stderr}");
    assert!(
        stderr.contains("expired") && stderr.contains("veris ca rotate"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&ca_pem).unwrap(), before);
    let doctor = output(veris(["doctor", "--state-dir"]).arg(&state));
    let (stdout, _) = text(&doctor);
    assert!(
        stdout.contains("expired") && stdout.contains("`veris ca rotate --state-dir"),
        "{stdout}"
    );
    let said = ok_output(veris(["ca", "rotate", "--state-dir"]).arg(&state));
    assert!(
        said.contains("the previous CA could sign for any name"),
        "{said}"
    );
    assert_eq!(
        std::fs::read_to_string(state.join("ca").join("veris-ca.prev.pem")).unwrap(),
        before
    );
    let mut serve = Serve::start_in(dir, &[]);
    serve.stop();
}

#[test]
fn a_ca_within_30_days_of_its_end_is_warned_about_at_start_and_by_doctor() {
    if !has_tool("openssl", &["version"]) {
        return;
    }
    let dir = TempDir::new("ca-ending");
    legacy_ca(&dir.join("state").join("ca"), 10);
    let mut serve = Serve::start_in(dir, &[]);
    let log = serve.stderr();
    assert!(
        log.contains("the CA expires within 30 days") && log.contains("veris ca rotate"),
        "{log}"
    );
    let doctor = output(veris(["doctor", "--state-dir"]).arg(&serve.state));
    let (stdout, stderr) = text(&doctor);
    assert!(
        stdout.contains("the CA expires at") && stdout.contains("`veris ca rotate --state-dir"),
        "{stdout}\n{stderr}"
    );
    serve.stop();
}

#[test]
fn strict_mode_records_a_name_outside_the_constraints_as_blocked_not_a_trust_failure() {
    if let Err(why) = curl() {
        return skip(&why);
    }
    let mut serve = Serve::start("ca-strict", &["--mode", "strict", "--services", "stripe"]);
    // Outside the constraints: no certificate, the handshake is refused.
    let out = output(serve.curl().arg("https://unmapped.example.org/"));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(35), "{stdout}\n{stderr}");
    assert!(stderr.contains("access denied"), "{stderr}");
    // Unmapped but inside them (a catalog host not routed now): refused in words.
    let out = output(
        serve
            .curl()
            .args(["-o", "/dev/null", "-w", "%{http_code}"])
            .arg("https://api.github.com/user"),
    );
    assert_eq!(text(&out).0, "421", "{:?}", text(&out));
    // A routed vendor: served.
    let out = output(
        serve
            .curl()
            .args(["-o", "/dev/null", "-w", "%{http_code}"])
            .arg("https://api.stripe.com/v1/customers"),
    );
    assert_eq!(text(&out).0, "200", "{:?}", text(&out));
    serve.stop();
    let lines = serve.ledger_lines();
    let of = |kind: &str| -> Vec<&Value> { lines.iter().filter(|l| l["kind"] == kind).collect() };
    assert!(of("trust_failure").is_empty(), "{lines:?}");
    assert!(of("tls_abandoned").is_empty(), "{lines:?}");
    let blocked: Vec<&Value> = of("blocked")
        .into_iter()
        .filter(|l| l["host"] == "unmapped.example.org")
        .collect();
    assert_eq!(blocked.len(), 1, "{lines:?}");
    let reason = blocked[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("strict mode: unmapped host")
            && reason.contains("outside the CA's name constraints"),
        "{reason}"
    );
    let out = output(veris(["receipt", "--state-dir"]).arg(&serve.state));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(!stdout.contains("trust failure"), "{stdout}");
}

/// Python: CONNECT through the proxy to a routed host, then a TLS handshake
/// naming another host (SNI) and trusting the veris CA; prints what happened.
const SNI_NOT_THE_CONNECT_HOST_PY: &str = r#"
import socket, ssl, sys
addr, ca, connect_host, sni = sys.argv[1:5]
host, port = addr.rsplit(":", 1)
s = socket.create_connection((host, int(port)), timeout=10)
s.sendall(f"CONNECT {connect_host}:443 HTTP/1.1\r\nHost: {connect_host}:443\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    c = s.recv(1)
    if not c:
        sys.exit("the proxy closed before answering the CONNECT")
    head += c
assert head.startswith(b"HTTP/1.1 200"), head
ctx = ssl.create_default_context(cafile=ca)
try:
    ctx.wrap_socket(s, server_hostname=sni)
    print("accepted")
except ssl.SSLError as e:
    print("refused:", e)
"#;

#[test]
fn a_tls_name_outside_the_constraints_behind_a_routed_connect_gets_no_certificate() {
    if !has_tool("python3", &["--version"]) {
        return;
    }
    // Passthrough mode (the default): the CONNECT names a vendor, the
    // ClientHello another host. veris minted a leaf for whatever the SNI
    // said; now that name is outside the CA's constraints, so none.
    let mut serve = Serve::start("ca-sni", &[]);
    let addr = serve.proxy_addr().to_string();
    let out = output(
        command("python3")
            .args(["-c", SNI_NOT_THE_CONNECT_HOST_PY])
            .args([
                addr.as_str(),
                serve.ca.to_str().unwrap(),
                "api.stripe.com",
                "evil.example.com",
            ]),
    );
    let (stdout, stderr) = text(&out);
    assert!(
        stdout.starts_with("refused:") && stdout.contains("ACCESS_DENIED"),
        "{stdout}{stderr}"
    );
    serve.stop();
    let lines = serve.ledger_lines();
    assert!(
        !lines.iter().any(|l| l["kind"] == "trust_failure"),
        "{lines:?}"
    );
    let blocked: Vec<&Value> = lines
        .iter()
        .filter(|l| l["kind"] == "blocked" && l["host"] == "evil.example.com")
        .collect();
    assert_eq!(blocked.len(), 1, "{lines:?}");
    assert!(
        blocked[0]["reason"]
            .as_str()
            .unwrap()
            .contains("the name the client asked for is outside the CA's name constraints"),
        "{}",
        blocked[0]
    );
}

/// A leaf for `host` signed with the CA's key by openssl, bypassing veris
/// (which refuses to mint outside the constraints): (cert, key).
fn leaf_signed_with_the_ca_key(dir: &Path, ca_dir: &Path, host: &str) -> (PathBuf, PathBuf) {
    let key = dir.join(format!("{host}.key"));
    let csr = dir.join(format!("{host}.csr"));
    let cert = dir.join(format!("{host}.pem"));
    let ext = dir.join(format!("{host}.ext"));
    // No IP address in the common name: OpenSSL checks a dotted common name
    // against the DNS constraints (veris's own leaves do the same).
    let (san, subject) = match host.parse::<std::net::IpAddr>() {
        Ok(_) => (format!("IP:{host}"), "/O=test".to_string()),
        Err(_) => (format!("DNS:{host}"), format!("/CN={host}")),
    };
    std::fs::write(
        &ext,
        format!("subjectAltName={san}\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n"),
    )
    .unwrap();
    ok_output(
        command("openssl")
            .args(["req", "-new", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:P-256", "-nodes", "-subj"])
            .arg(subject)
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&csr),
    );
    ok_output(
        command("openssl")
            .args(["x509", "-req", "-days", "2", "-set_serial", "7", "-in"])
            .arg(&csr)
            .arg("-CA")
            .arg(ca_dir.join("veris-ca.pem"))
            .arg("-CAkey")
            .arg(ca_dir.join("veris-ca-key.pem"))
            .arg("-extfile")
            .arg(&ext)
            .arg("-out")
            .arg(&cert),
    );
    (cert, key)
}

const TLS_SERVER_PY: &str = r#"
import socket, ssl, sys, threading
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(16)
print(s.getsockname()[1], flush=True)
def serve(c):
    try:
        t = ctx.wrap_socket(c, server_side=True)
        t.settimeout(10)
        t.sendall(b"hello")
        t.close()
    except Exception:
        c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// A TLS server on loopback presenting `cert`; (process, port).
fn tls_server(cert: &Path, key: &Path) -> (Guard, u16) {
    let mut cmd = command("python3");
    cmd.args(["-c", TLS_SERVER_PY])
        .arg(cert)
        .arg(key)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut server = Guard::spawn(&mut cmd);
    let stdout = server.child().stdout.take().expect("server stdout");
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .expect("the server's port");
    let port = line.trim().parse().expect("a port");
    (server, port)
}

const PY_CLIENT: &str = r#"
import socket, ssl, sys
ctx = ssl.create_default_context(cafile=sys.argv[1])
try:
    with socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=10) as s:
        with ctx.wrap_socket(s, server_hostname=sys.argv[3]) as t:
            t.recv(5)
    print("accepted")
except ssl.SSLError as e:
    print("refused:", e)
"#;

const NODE_CLIENT: &str = r#"
const tls = require("tls"), fs = require("fs");
const [ca, port, host] = process.argv.slice(1);
let done = false;
const s = tls.connect({ host: "127.0.0.1", port: Number(port), servername: host, ca: fs.readFileSync(ca) }, () => {
  done = true; console.log("accepted"); s.destroy();
});
s.on("error", e => { if (!done) { done = true; console.log("refused:", e.code, e.message); } });
"#;

const GO_CLIENT: &str = r#"
package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

func main() {
	pem, err := os.ReadFile(os.Args[1])
	if err != nil {
		panic(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	c, err := tls.Dial("tcp", "127.0.0.1:"+os.Args[2], &tls.Config{RootCAs: pool, ServerName: os.Args[3]})
	if err != nil {
		fmt.Println("refused:", err)
		return
	}
	c.Close()
	fmt.Println("accepted")
}
"#;

const JAVA_CLIENT: &str = r#"
import java.io.FileInputStream;
import java.security.KeyStore;
import java.security.cert.CertificateFactory;
import java.util.List;
import javax.net.ssl.*;

public class Probe {
    public static void main(String[] args) throws Exception {
        KeyStore ks = KeyStore.getInstance(KeyStore.getDefaultType());
        ks.load(null, null);
        ks.setCertificateEntry("veris", CertificateFactory.getInstance("X.509")
            .generateCertificate(new FileInputStream(args[0])));
        TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        tmf.init(ks);
        SSLContext ctx = SSLContext.getInstance("TLS");
        ctx.init(null, tmf.getTrustManagers(), null);
        SSLSocket s = (SSLSocket) ctx.getSocketFactory().createSocket("127.0.0.1", Integer.parseInt(args[1]));
        SSLParameters p = s.getSSLParameters();
        p.setEndpointIdentificationAlgorithm("HTTPS");
        p.setServerNames(List.of(new SNIHostName(args[2])));
        s.setSSLParameters(p);
        try {
            s.startHandshake();
            System.out.println("accepted");
        } catch (SSLException e) {
            System.out.println("refused: " + e.getMessage());
        }
        s.close();
    }
}
"#;

#[test]
fn clients_accept_a_routed_leaf_and_refuse_one_outside_the_constraints() {
    for (tool, probe) in [("openssl", "version"), ("python3", "--version")] {
        if !has_tool(tool, &[probe]) {
            return;
        }
    }
    let dir = TempDir::new("ca-clients");
    let state = dir.join("state");
    ok_output(veris(["ca", "init", "--state-dir"]).arg(&state));
    let ca_dir = state.join("ca");
    let ca_pem = ca_dir.join("veris-ca.pem");
    let inside = "api.stripe.com";
    let outside = "evil.example.com";

    // OpenSSL, by `openssl verify` of each leaf (DNS and IP).
    for (host, flag, accepted) in [
        (inside, "-verify_hostname", true),
        ("127.0.0.1", "-verify_ip", true),
        (outside, "-verify_hostname", false),
        ("10.0.0.1", "-verify_ip", false),
    ] {
        let (cert, _) = leaf_signed_with_the_ca_key(dir.path(), &ca_dir, host);
        let out = output(
            command("openssl")
                .args(["verify", "-no-CApath", "-purpose", "sslserver", "-CAfile"])
                .arg(&ca_pem)
                .args([flag, host])
                .arg(&cert),
        );
        let (stdout, stderr) = text(&out);
        assert_eq!(
            out.status.success(),
            accepted,
            "openssl {host}: {stdout}{stderr}"
        );
        if !accepted {
            assert!(stderr.contains("subtree violation"), "{stderr}");
        }
    }

    let (in_cert, in_key) = leaf_signed_with_the_ca_key(dir.path(), &ca_dir, inside);
    let (out_cert, out_key) = leaf_signed_with_the_ca_key(dir.path(), &ca_dir, outside);
    let (_in_server, in_port) = tls_server(&in_cert, &in_key);
    let (_out_server, out_port) = tls_server(&out_cert, &out_key);

    let go = dir.join("probe.go");
    std::fs::write(&go, GO_CLIENT).unwrap();
    let java = dir.join("Probe.java");
    std::fs::write(&java, JAVA_CLIENT).unwrap();
    type Client<'a> = (&'a str, Box<dyn Fn() -> std::process::Command + 'a>);
    let clients: Vec<Client> = vec![
        (
            "python3",
            Box::new(|| {
                let mut c = command("python3");
                c.args(["-c", PY_CLIENT]);
                c
            }),
        ),
        (
            "node",
            Box::new(|| {
                let mut c = command("node");
                c.args(["-e", NODE_CLIENT]);
                c
            }),
        ),
        (
            "go",
            Box::new(|| {
                let mut c = command("go");
                c.arg("run").arg(&go);
                c
            }),
        ),
        (
            "java",
            Box::new(|| {
                let mut c = command("java");
                c.arg(&java);
                c
            }),
        ),
    ];
    // Java's PKIX validation does not apply the name constraints of a trust
    // anchor (the CA file a client trusts is one): it accepts the leaf a
    // thief made. Asserted as it is, and said in docs/ca.md.
    let honors = |client: &str| client != "java";
    for (name, client) in &clients {
        if !tool_works(name, &["--version"]) && !tool_works(name, &["version"]) {
            skip(&format!("`{name}` is not installed"));
            continue;
        }
        for (host, port, accepted) in [
            (inside, in_port, true),
            (outside, out_port, !honors(name)),
            // The probe checks names at all: the outside leaf for the inside name.
            (inside, out_port, false),
        ] {
            let mut cmd = client();
            cmd.arg(&ca_pem).arg(port.to_string()).arg(host);
            let out = output_within(&mut cmd, std::time::Duration::from_secs(120));
            let (stdout, stderr) = text(&out);
            let said = stdout.trim();
            if accepted {
                assert_eq!(said, "accepted", "{name} {host}: {stdout}{stderr}");
            } else {
                assert!(
                    said.starts_with("refused"),
                    "{name} accepted {host}: {stdout}{stderr}"
                );
            }
            eprintln!("{name} {host}: {said}");
        }
    }
}

#[test]
fn a_gateway_whose_tls_name_the_shared_ca_may_not_sign_for_is_refused() {
    let dir = TempDir::new("ca-gw-name");
    let shared = dir.join("fleet-ca");
    ok_output(
        veris(["ca", "init", "--ca-dir"])
            .arg(&shared)
            .arg("--state-dir")
            .arg(dir.join("maker")),
    );
    let before = std::fs::read_to_string(shared.join("veris-ca.pem")).unwrap();
    let start = || {
        output_within(
            veris(["gateway", "--state-dir"])
                .arg(dir.join("gw"))
                .args(["--listen", "127.0.0.1:0", "--tls-listen", "127.0.0.1:0"])
                .args(["--tls-name", "gw.example.net", "--ca-dir"])
                .arg(&shared),
            std::time::Duration::from_secs(60),
        )
    };
    let out = start();
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "started: {stdout}{stderr}");
    assert!(
        stderr.contains("may not sign for gw.example.net") && stderr.contains("veris ca rotate"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(shared.join("veris-ca.pem")).unwrap(),
        before,
        "the shared CA was changed"
    );
    // The fix names it: the rotated CA may sign for the gateway's name.
    let said = ok_output(
        veris(["ca", "rotate", "--ca-dir"])
            .arg(&shared)
            .arg("--state-dir")
            .arg(dir.join("maker"))
            .args(["--name", "gw.example.net"]),
    );
    assert!(said.contains("added:       gw.example.net"), "{said}");
}
