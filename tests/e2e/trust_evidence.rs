//! Trust failures judged by evidence, under the real binary with real
//! clients (explicit tier; the transparent tier shares the same terminate
//! path and has in-process tests in `proxy/src/transparent.rs`):
//! - curl trusting another CA refuses our leaf with `unknown_ca`: a
//!   `trust_failure`, and a vendor host with nothing completed fails the receipt;
//! - a raw client that sends a ClientHello and resets the connection, and
//!   wget (GnuTLS), which finishes the handshake and closes without a
//!   request, are `tls_abandoned` lines: listed in the receipt, never a
//!   failure by themselves;
//! - a normal request is not flagged.

use crate::support;

use std::process::Output;

use serde_json::Value;
use support::*;

/// Python: `tunnel(addr, name)` CONNECTs through the proxy at `addr`
/// (`host:port`) to `name:443` and returns the socket once it answered 200.
macro_rules! tunnel_py {
    () => {
        r#"
import socket, ssl, struct, sys
def tunnel(addr, name):
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(f"CONNECT {name}:443 HTTP/1.1\r\nHost: {name}:443\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        c = s.recv(1)
        if not c:
            sys.exit("the proxy closed before answering the CONNECT")
        head += c
    assert head.startswith(b"HTTP/1.1 200"), head
    return s
"#
    };
}

/// CONNECTs, sends a real ClientHello (Python's ssl, through memory BIOs),
/// waits for the first byte of the proxy's flight, then resets.
const HELLO_THEN_RESET: &str = concat!(
    tunnel_py!(),
    r#"
addr, name = sys.argv[1], sys.argv[2]
s = tunnel(addr, name)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
tls = ctx.wrap_bio(incoming, outgoing, server_hostname=name)
try:
    tls.do_handshake()
except ssl.SSLWantReadError:
    pass
s.sendall(outgoing.read())
assert s.recv(1), "the proxy's flight"
s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
s.close()
print("hello sent, connection reset")
"#
);

fn kinds<'a>(lines: &'a [Value], kind: &str) -> Vec<&'a Value> {
    lines.iter().filter(|l| l["kind"] == kind).collect()
}

fn receipt(serve: &Serve) -> (Option<i32>, String, String) {
    let out: Output = output(veris(["receipt", "--state-dir"]).arg(&serve.state));
    let (stdout, stderr) = text(&out);
    (out.status.code(), stdout, stderr)
}

#[test]
fn closes_without_a_certificate_alert_never_fail_a_receipt_and_a_refusal_does() {
    if let Err(why) = curl() {
        return skip(&why);
    }
    for tool in ["wget", "python3"] {
        if !tool_works(tool, &["--version"]) {
            return skip(&format!("`{tool}` is not installed"));
        }
    }
    let mut serve = Serve::start("trust-evidence", &[]);
    // A CA nobody uses: the wrong one to trust.
    let other = serve.dir.join("other.pem");
    let made = command("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:P-256", "-nodes", "-days", "2", "-subj"])
        .arg("/CN=not veris")
        .arg("-keyout")
        .arg(serve.dir.join("other.key"))
        .arg("-out")
        .arg(&other)
        .status()
        .is_ok_and(|s| s.success());
    assert!(made, "openssl made a CA");

    // A normal request: served, not flagged.
    let out = output(
        serve
            .curl()
            .args(["-o", "/dev/null", "-w", "%{http_code}"])
            .arg("https://api.stripe.com/v1/customers"),
    );
    assert_eq!(text(&out).0, "200", "{:?}", text(&out));

    // A ClientHello, then a reset: an abandoned handshake.
    let addr = serve.proxy_addr().to_string();
    let out = output(command("python3").args(["-c", HELLO_THEN_RESET, &addr, "api.github.com"]));
    assert!(out.status.success(), "{:?}", text(&out));

    // wget refusing our leaf: it finishes the handshake, then closes.
    let out = output(
        command("wget")
            .args(["-q", "-O", "/dev/null", "--tries=1", "--timeout=10"])
            .arg(format!("--ca-certificate={}", other.display()))
            .args(["-e", "use_proxy=yes", "-e"])
            .arg(format!("https_proxy={}", serve.proxy_url))
            .arg("https://api.github.com/user"),
    );
    assert_eq!(
        out.status.code(),
        Some(5),
        "wget's SSL failure: {:?}",
        text(&out)
    );

    let lines = wait_for("two tls_abandoned lines", DEADLINE, || {
        let lines = serve.ledger_lines();
        (kinds(&lines, "tls_abandoned").len() >= 2).then_some(lines)
    });
    let abandoned = kinds(&lines, "tls_abandoned");
    let stages: Vec<(&str, &str, &Value)> = abandoned
        .iter()
        .map(|l| {
            (
                l["host"].as_str().unwrap(),
                l["stage"].as_str().unwrap(),
                &l["alert"],
            )
        })
        .collect();
    assert_eq!(
        stages,
        [
            ("api.github.com", "handshake", &Value::Null),
            ("api.github.com", "no_request", &Value::Null)
        ],
        "{lines:?}"
    );
    for l in &abandoned {
        assert_eq!(l["service"], "github");
        assert_eq!(l["tier"], "explicit");
        assert_eq!(l["v"], veris_receipt::entry::LEDGER_VERSION);
    }
    assert!(kinds(&lines, "trust_failure").is_empty(), "{lines:?}");
    // The normal request's answer reached curl whole.
    assert_eq!(kinds(&lines, "request").len(), 1, "{lines:?}");
    assert!(kinds(&lines, "response_incomplete").is_empty(), "{lines:?}");

    // Nothing completed to api.github.com, and the receipt still holds.
    let (code, stdout, stderr) = receipt(&serve);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("tls note: \"api.github.com\": 1 handshake(s) closed after our certificate with no alert naming it (alerts: none (1))"),
        "{stdout}"
    );
    assert!(
        stdout.contains("1 connection(s) closed right after our certificate, no request — a client that doesn't trust the veris CA closes like this"),
        "{stdout}"
    );
    assert!(!stdout.contains("trust failure"), "{stdout}");

    // curl trusting another CA says why: unknown_ca, a refusal that fails.
    let out = output(
        command("curl")
            .args([
                "-sS",
                "--max-time",
                "10",
                "-x",
                &serve.proxy_url,
                "--cacert",
            ])
            .arg(&other)
            .arg("https://api.hubapi.com/crm/v3/objects/contacts"),
    );
    assert_eq!(out.status.code(), Some(60), "{:?}", text(&out));
    let lines = wait_for("the trust_failure line", DEADLINE, || {
        let lines = serve.ledger_lines();
        (!kinds(&lines, "trust_failure").is_empty()).then_some(lines)
    });
    let refused = kinds(&lines, "trust_failure");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0]["host"], "api.hubapi.com");
    assert_eq!(refused[0]["alert"], "unknown_ca");
    let (code, stdout, stderr) = receipt(&serve);
    assert_eq!(code, Some(3), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("trust failure: \"api.hubapi.com\": 1 refusal(s), 0 completed"),
        "{stdout}"
    );
    // The verdict names the refusal, and only it.
    let verdict = format!("{stdout}{stderr}");
    assert!(
        verdict.contains("vendor host \"api.hubapi.com\" refused the veris certificate"),
        "{verdict}"
    );
    assert!(
        !verdict.contains("vendor host \"api.github.com\""),
        "{verdict}"
    );
    serve.stop();
}

/// CONNECTs `count` times and finishes a TLS handshake that agrees `h2`
/// (trusting the CA file given), then closes each without a request: what
/// an HTTP/2 client does with the extra connections it dialed at once.
const UNUSED_H2: &str = concat!(
    tunnel_py!(),
    r#"
addr, name, ca, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ctx = ssl.create_default_context(cafile=ca)
ctx.set_alpn_protocols(["h2"])
for _ in range(count):
    s = tunnel(addr, name)
    tls = ctx.wrap_socket(s, server_hostname=name)
    assert tls.selected_alpn_protocol() == "h2", tls.selected_alpn_protocol()
    tls.close()
print("unused", count)
"#
);

/// E1.7: HTTP/2 connections closed unused beside working requests to the
/// same host (a Go client with several workers dials extras and drops
/// them) are not trust evidence: no `tls note`, only a count in the JSON.
/// To a host where nothing completed, the same closes are still a note.
#[test]
fn unused_http2_connections_beside_working_ones_are_not_a_trust_note() {
    if let Err(why) = curl() {
        return skip(&why);
    }
    if !tool_works("python3", &["--version"]) {
        return skip("`python3` is not installed");
    }
    let serve = Serve::start("unused-h2", &[]);
    let out = output(
        serve
            .curl()
            .args(["--http2", "-o", "/dev/null", "-w", "%{http_code}"])
            .arg("https://api.stripe.com/v1/customers"),
    );
    assert_eq!(text(&out).0, "200", "{:?}", text(&out));
    let addr = serve.proxy_addr().to_string();
    let ca = serve.ca.to_str().unwrap();
    for host in ["api.stripe.com", "api.github.com"] {
        let out = output(command("python3").args(["-c", UNUSED_H2, &addr, host, ca, "3"]));
        assert!(out.status.success(), "{:?}", text(&out));
    }
    wait_for("six tls_abandoned lines", DEADLINE, || {
        let lines = serve.ledger_lines();
        (kinds(&lines, "tls_abandoned").len() >= 6).then_some(())
    });
    for l in kinds(&serve.ledger_lines(), "tls_abandoned") {
        assert_eq!(
            (&l["stage"], &l["alpn"]),
            (&Value::from("no_request"), &Value::from("h2")),
            "{l}"
        );
    }
    let (code, stdout, stderr) = receipt(&serve);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(!stdout.contains("tls note: \"api.stripe.com\""), "{stdout}");
    assert!(
        stdout.contains(
            "tls note: \"api.github.com\": 3 connection(s) closed right after our certificate"
        ),
        "{stdout}"
    );
    let out = output(veris(["receipt", "--json", "--state-dir"]).arg(&serve.state));
    let json: Value = serde_json::from_slice(&out.stdout).expect("receipt JSON");
    let abandoned = json["tls_abandoned"].as_array().expect("tls_abandoned");
    let of = |host: &str| abandoned.iter().find(|a| a["host"] == host).cloned();
    let stripe = of("api.stripe.com").expect("stripe's unused connections are counted");
    assert_eq!(
        (stripe["unused_h2"].as_u64(), stripe["no_request"].as_u64()),
        (Some(3), Some(0))
    );
    let github = of("api.github.com").expect("github's closes are counted");
    assert_eq!(
        (github["unused_h2"].as_u64(), github["no_request"].as_u64()),
        (None, Some(3))
    );
}
