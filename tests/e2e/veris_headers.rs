//! `X-Veris-*` is the proxy's prefix toward the twin: a client that sends
//! its own `X-Veris-Sandbox`, `X-Veris-Service`, `X-Veris-Original-*` or any
//! other header under it must not reach the twin with it. A twin stand-in
//! echoes the request head it received; curl sends the forgeries.

use crate::support;

use std::io::Write;

use support::*;

/// Answers every request with the request head it received as the body.
fn echo_twin() -> String {
    stand_in_twin(|stream, head| {
        if head.starts_with(b"PRI ") {
            return;
        }
        let _ = stream.write_all(
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                head.len()
            )
            .as_bytes(),
        );
        let _ = stream.write_all(head);
    })
}

#[test]
fn a_clients_own_x_veris_headers_never_reach_the_twin() {
    if let Err(why) = curl() {
        return skip(&why);
    }
    let twin = echo_twin();
    let mut serve = Serve::start(
        "veris-headers",
        &[
            "--twin",
            &twin,
            "--sandbox",
            "sbx_real",
            "--services",
            "stripe",
        ],
    );
    let out = output(
        serve
            .curl()
            .args(["--http1.1", "-f"])
            .args(["-H", "X-Veris-Sandbox: sbx_forged"])
            .args(["-H", "X-Veris-Service: github"])
            .args(["-H", "X-Veris-Original-Host: evil.example"])
            .args(["-H", "X-Veris-Original-Authorization: Bearer forged"])
            .args(["-H", "X-Veris-Tier: control"])
            .args(["-H", "Authorization: Bearer sk_test_client"])
            .arg("https://api.stripe.com/v1/customers"),
    );
    let (echoed, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let echoed = echoed.to_ascii_lowercase();
    let veris: Vec<&str> = echoed
        .lines()
        .filter(|l| l.starts_with("x-veris-"))
        .collect();
    assert_eq!(
        veris.len(),
        3,
        "only the proxy's own three X-Veris headers: {echoed}"
    );
    assert!(veris.contains(&"x-veris-sandbox: sbx_real"), "{echoed}");
    assert!(veris.contains(&"x-veris-service: stripe"), "{echoed}");
    assert!(
        veris.contains(&"x-veris-original-host: api.stripe.com"),
        "{echoed}"
    );
    // Without a twin credential the client's own Authorization travels as is.
    assert!(
        echoed.contains("authorization: bearer sk_test_client"),
        "{echoed}"
    );
    serve.stop();
}
