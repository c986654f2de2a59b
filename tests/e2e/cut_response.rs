//! A response the twin cuts mid-body, under the real binary with curl. The
//! request line is written when the head arrives (200, the declared length),
//! before the client sees anything; what the client then got is a broken
//! body, so a `response_incomplete` line follows, and the receipt says
//! "200 (cut after N of M bytes)" while still counting the request (the twin
//! did get it).

use crate::support;

use std::io::Write;

use serde_json::Value;
use support::*;

const DECLARED: usize = 5000;
const SENT: usize = DECLARED / 2;

/// A twin stand-in on loopback: every vendor request gets a head declaring
/// [`DECLARED`] bytes, [`SENT`] of them, then a close. The proxy's own calls
/// (the h2c probe, `/veris/…` reads) get nothing useful, which is fine: the
/// cross-check is then unverified, not part of this test.
fn cutting_twin() -> String {
    stand_in_twin(|stream, head| {
        let head = String::from_utf8_lossy(head);
        if head.starts_with("PRI ") || head.contains("/veris/") {
            let _ = stream.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
            return;
        }
        let _ = stream.write_all(
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {DECLARED}\r\n\r\n"
            )
            .as_bytes(),
        );
        let _ = stream.write_all(&vec![b'x'; SENT]);
        let _ = stream.flush();
        // Dropped: the connection closes halfway through the body.
    })
}

#[test]
fn a_body_the_twin_cuts_is_recorded_as_incomplete_and_still_counted() {
    if let Err(why) = curl() {
        return skip(&why);
    }
    let twin = cutting_twin();
    let mut serve = Serve::start("cut-response", &["--twin", &twin, "--services", "stripe"]);
    let out = output(
        serve
            .curl()
            .args([
                "--http1.1",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code} %{size_download}",
            ])
            .arg("https://api.stripe.com/v1/charges"),
    );
    let (stdout, stderr) = text(&out);
    // curl: (18) transfer closed with outstanding read data remaining.
    assert_eq!(out.status.code(), Some(18), "{stdout} {stderr}");
    assert_eq!(stdout, format!("200 {SENT}"), "{stderr}");

    let lines = wait_for("the response_incomplete line", DEADLINE, || {
        let lines = serve.ledger_lines();
        lines
            .iter()
            .any(|l| l["kind"] == "response_incomplete")
            .then_some(lines)
    });
    let request: Vec<&Value> = lines.iter().filter(|l| l["kind"] == "request").collect();
    assert_eq!(request.len(), 1, "{lines:?}");
    assert_eq!(request[0]["status"], 200);
    assert_eq!(request[0]["bytes_out"], DECLARED);
    let cut: Vec<&Value> = lines
        .iter()
        .filter(|l| l["kind"] == "response_incomplete")
        .collect();
    assert_eq!(cut.len(), 1, "{lines:?}");
    assert_eq!(cut[0]["of"], request[0]["seq"]);
    assert_eq!(cut[0]["service"], "stripe");
    assert_eq!(cut[0]["bytes"], SENT);
    assert_eq!(cut[0]["declared"], DECLARED);
    assert_eq!(cut[0]["reason"], "twin_cut");
    assert!(cut[0]["seq"].as_u64() > request[0]["seq"].as_u64());

    // The receipt says what the client got, and still counts the request.
    let out = output(veris(["receipt", "--require", "stripe:1", "--state-dir"]).arg(&serve.state));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("stripe: 1 request(s), 1 answered incomplete"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "GET \"/v1/charges\" -> 200 (cut after {SENT} of {DECLARED} bytes)"
        )),
        "{stdout}"
    );
    let out = output(veris(["receipt", "--json", "--state-dir"]).arg(&serve.state));
    let receipt: Value = serde_json::from_slice(&out.stdout).unwrap();
    let stripe = &receipt["services"]["stripe"];
    assert_eq!(stripe["requests"], 1, "{receipt}");
    assert_eq!(stripe["incomplete"], 1, "{receipt}");
    assert_eq!(
        stripe["entries"][0]["incomplete"],
        serde_json::json!({"bytes": SENT, "declared": DECLARED, "reason": "twin_cut"})
    );
    serve.stop();
}
