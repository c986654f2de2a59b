//! The SOCKS5 server side ([`veris_proxy::inbound::socks5`]) against a real
//! client: curl through a one-connection test server on 127.0.0.1:0 that
//! runs the handshake, checks the credentials, answers `Succeeded` and then
//! plays the destination itself with a fixed HTTP response. Nothing is
//! dialed: the targets only have to arrive as curl sent them.

// Test code: a failed unwrap or expect is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output, Stdio};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use veris_proxy::inbound::socks5::{self, Credentials, Reply, Request, Target};

const USER: &str = "sbx-alpha";
const PASS: &str = "s3cret-Pa55";
const BODY: &str = "hello through socks\n";

/// `SKIP: <why>` and pass, unless `VERIS_REQUIRE_ALL=1`, where it fails.
fn have_curl() -> bool {
    if Command::new("curl")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        return true;
    }
    if std::env::var("VERIS_REQUIRE_ALL").is_ok_and(|v| v == "1") {
        panic!("VERIS_REQUIRE_ALL=1 and curl is missing");
    }
    println!("SKIP: curl is not installed");
    false
}

/// What the test server saw of one connection.
#[derive(Debug)]
struct Seen {
    credentials: Credentials,
    request: Option<Request>,
    tunneled: String,
}

/// Serves one SOCKS5 connection: refuses credentials other than
/// USER/PASS, else answers the request `Succeeded` and the tunneled HTTP
/// request with a fixed 200.
async fn serve_one(listener: TcpListener) -> Seen {
    let (mut conn, _) = listener.accept().await.unwrap();
    let handshake = socks5::handshake(&mut conn).await.unwrap();
    let credentials = handshake.credentials().clone();
    if credentials.username != USER || credentials.password != PASS {
        handshake.refuse(&mut conn).await.unwrap();
        return Seen {
            credentials,
            request: None,
            tunneled: String::new(),
        };
    }
    let request = handshake.accept(&mut conn).await.unwrap();
    let bound = conn.local_addr().unwrap();
    socks5::reply(&mut conn, Reply::Succeeded, bound)
        .await
        .unwrap();
    // The tunneled request head, bounded.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
        if conn.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    conn.write_all(response.as_bytes()).await.unwrap();
    conn.shutdown().await.unwrap();
    Seen {
        credentials,
        request: Some(request),
        tunneled: String::from_utf8_lossy(&head).into_owned(),
    }
}

/// curl through `proxy` to `url`, with no proxy settings from the
/// environment or a config file.
fn curl(proxy: &str, url: &str) -> Output {
    let mut cmd = Command::new("curl");
    cmd.args(["-q", "-sS", "--max-time", "20", "-x", proxy, url]);
    for var in [
        "http_proxy",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
        "no_proxy",
        "NO_PROXY",
        "CURL_HOME",
    ] {
        cmd.env_remove(var);
    }
    cmd.output().unwrap()
}

async fn through(scheme: &str, user: &str, url: &str) -> (Output, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = format!(
        "{scheme}://{user}:{PASS}@{}",
        listener.local_addr().unwrap()
    );
    let server = tokio::spawn(serve_one(listener));
    let url = url.to_string();
    let out = tokio::task::spawn_blocking(move || curl(&proxy, &url))
        .await
        .unwrap();
    (out, server.await.unwrap())
}

#[tokio::test]
async fn curl_tunnels_through_the_socks5_handshake_by_name_ipv4_and_ipv6() {
    if !have_curl() {
        return;
    }
    for (scheme, url, want) in [
        // socks5h: the name goes to the proxy unresolved.
        (
            "socks5h",
            "http://vendor.test/",
            Target::Name {
                host: veris_host::Host::new("vendor.test"),
                port: 80,
            },
        ),
        // socks5: curl resolves (a literal resolves to itself), ATYP 1.
        (
            "socks5",
            "http://127.0.0.1:9/",
            Target::Addr("127.0.0.1:9".parse().unwrap()),
        ),
        (
            "socks5h",
            "http://[::1]:9/",
            Target::Addr("[::1]:9".parse().unwrap()),
        ),
    ] {
        let (out, seen) = through(scheme, USER, url).await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(stdout, BODY, "{url}");
        assert_eq!(seen.credentials.username, USER);
        assert_eq!(seen.credentials.password, PASS);
        assert_eq!(seen.request, Some(Request::Connect(want)), "{url}");
        assert!(seen.tunneled.starts_with("GET / HTTP/1.1\r\n"), "{seen:?}");
    }
}

#[tokio::test]
async fn curl_with_a_wrong_username_is_refused_before_any_request() {
    if !have_curl() {
        return;
    }
    let (out, seen) = through("socks5h", "sbx-other", "http://vendor.test/").await;
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    assert_eq!(seen.credentials.username, "sbx-other");
    assert_eq!(seen.request, None);
}
