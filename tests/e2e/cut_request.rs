//! Request bodies a client never finishes, under the real binary with raw
//! sockets as the workload (exact control over what is sent): a POST with
//! `Expect: 100-continue` whose body never comes, a short `Content-Length`,
//! an unfinished chunked body, and a body still unfinished when the session
//! ends. Each reached the twin (its log has the row), so each must have a
//! ledger line (`upstream_error`, `veris_request_body_incomplete`, with the
//! bytes sent and declared), and the twin cross-check must account for them
//! instead of failing with "something called the twin directly": a workload
//! must not be able to turn a run into `failed` by hanging up mid-body.

use crate::support;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};

use serde_json::Value;
use support::*;

const TARGET: &str = "http://api.stripe.com/v1/customers";

/// Opens a connection to the proxy and sends `head` (the request line is
/// added) and `body`.
fn send(serve: &Serve, head: &str, body: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(serve.proxy_addr()).expect("connecting to the proxy");
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    write!(
        s,
        "POST {TARGET} HTTP/1.1\r\nHost: api.stripe.com\r\nContent-Type: application/x-www-form-urlencoded\r\n{head}\r\n"
    )
    .unwrap();
    s.write_all(body).unwrap();
    s
}

/// Reads until `100 Continue` arrived: the proxy polls the body only once
/// its request to the twin is under way.
fn read_continue(s: &mut TcpStream) {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") && got.len() < 4096 {
        match s.read(&mut byte) {
            Ok(1) => got.push(byte[0]),
            other => panic!("no 100 Continue ({other:?}): {got:?}"),
        }
    }
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 100"), "{got}");
}

/// Ends the client's side and reads whatever the proxy still says.
fn hang_up(mut s: TcpStream) {
    let _ = s.shutdown(Shutdown::Write);
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
}

fn upstream_errors(lines: &[Value]) -> Vec<Value> {
    lines
        .iter()
        .filter(|l| l["kind"] == "upstream_error")
        .cloned()
        .collect()
}

fn twin_check(lines: &[Value]) -> Value {
    lines
        .iter()
        .find(|l| l["kind"] == "check" && l["name"] == "twin_cross_check")
        .cloned()
        .unwrap_or_else(|| panic!("no twin_cross_check line: {lines:?}"))
}

#[test]
fn bodies_the_client_never_finished_are_recorded_and_the_cross_check_accounts_for_them() {
    let mut serve = Serve::start("cut-request", &[]);

    // 1. Expect: 100-continue, then nothing, then gone.
    let mut s = send(
        &serve,
        "Content-Length: 100\r\nExpect: 100-continue\r\n",
        b"",
    );
    read_continue(&mut s);
    drop(s);
    // 2. A short Content-Length: 10 bytes of 100, then the write side closes.
    let s = send(&serve, "Content-Length: 100\r\n", b"email=ada@");
    hang_up(s);
    // 3. An unfinished chunked body: one chunk, no last chunk.
    let s = send(&serve, "Transfer-Encoding: chunked\r\n", b"6\r\nemail=\r\n");
    hang_up(s);

    let lines = wait_for("three upstream_error lines", DEADLINE, || {
        let lines = serve.ledger_lines();
        (upstream_errors(&lines).len() >= 3).then_some(lines)
    });
    let errors = upstream_errors(&lines);
    assert_eq!(errors.len(), 3, "{errors:?}");
    for e in &errors {
        assert_eq!(e["error"], "veris_request_body_incomplete", "{e}");
        assert_eq!(e["service"], "stripe", "{e}");
        assert_eq!(e["method"], "POST", "{e}");
        assert_eq!(e["path"], "/v1/customers", "{e}");
        assert_eq!(e["v"], veris_receipt::LEDGER_VERSION, "{e}");
    }
    let mut sent: Vec<(u64, Option<u64>)> = errors
        .iter()
        .map(|e| (e["bytes_in"].as_u64().unwrap(), e["declared_in"].as_u64()))
        .collect();
    sent.sort();
    assert_eq!(
        sent,
        [(0, Some(100)), (6, None), (10, Some(100))],
        "{errors:?}"
    );
    // The twin did see them (the point of recording them).
    let rows = serve.twin_requests("stripe");
    let rows = rows["requests"].as_array().expect("twin rows").clone();
    assert!(
        rows.iter()
            .filter(|r| r["path"] == "/v1/customers" && r["method"] == "POST")
            .count()
            >= 1,
        "{rows:?}"
    );

    // A live receipt: the cross-check accounts for them; the receipt says
    // what was cut.
    let out = output(veris(["receipt", "--state-dir"]).arg(&serve.state));
    let (stdout, stderr) = text(&out);
    assert!(!stdout.contains("integrity: failed"), "{stdout}{stderr}");
    assert!(!stdout.contains("directly"), "{stdout}");
    assert!(
        stdout.contains(
            "requests whose body the client never finished (the twin may have processed them): 3"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("(body: 10 of 100 bytes sent)"), "{stdout}");

    serve.stop();
    let lines = serve.ledger_lines();
    let check = twin_check(&lines);
    assert_eq!(check["status"], "ok", "{check}");
}

#[test]
fn a_body_still_unfinished_when_the_session_ends_is_recorded() {
    let mut serve = Serve::start("cut-request-end", &["--grace", "1"]);
    let mut s = send(
        &serve,
        "Content-Length: 100\r\nExpect: 100-continue\r\n",
        b"",
    );
    read_continue(&mut s);
    s.write_all(b"email=ada@").unwrap();
    // The client stays, its body unfinished, while the session ends.
    serve.stop();
    drop(s);
    let lines = serve.ledger_lines();
    let errors = upstream_errors(&lines);
    assert_eq!(errors.len(), 1, "{lines:?}");
    assert_eq!(errors[0]["error"], "veris_request_body_incomplete");
    assert_eq!(errors[0]["bytes_in"], 10);
    assert_eq!(errors[0]["declared_in"], 100);
    // Before the checks and the final seal, which cover it.
    let check = twin_check(&lines);
    assert!(check["seq"].as_u64() > errors[0]["seq"].as_u64());
    assert_eq!(check["status"], "ok", "{check}");
    assert_eq!(lines.last().unwrap()["kind"], "seal");
}
