//! In-process integration tests: a real proxy on 127.0.0.1:0, the built-in twin
//! or a local echo origin, and real clients (hyper over tokio-rustls trusting
//! only the veris CA) going through CONNECT, on HTTP/1.1 and HTTP/2.

// Test code: a failed unwrap or expect is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use veris_ca::{CertificateAuthority, Issuer};
use veris_proxy::config::{Flags, Settings};
use veris_proxy::outbound::upstream::{Upstream, UpstreamOptions};
use veris_proxy::request::recorder::MemoryRecorder;
use veris_proxy::request::route::{Claim, HostPattern, Router, Service};
use veris_proxy::{Identity, Proxy, ProxyOptions};
use veris_receipt::{
    BlockedLine, PassthroughLine, RequestLine, ReservedPathLine, TunnelCloseLine, UpstreamErrorLine,
};
use veris_receipt::{Entry, ListenerTier, Mode};

type Body = http_body_util::combinators::BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "veris-proxy-test-{tag}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

struct Harness {
    proxy: SocketAddr,
    ca: CertificateDer<'static>,
    recorder: Arc<MemoryRecorder>,
    _stop: oneshot::Sender<()>,
}

struct Setup {
    router: Router,
    mode: Mode,
    twin_base: String,
    response_timeout: Duration,
    twin_auth: Option<String>,
}

async fn start_proxy(setup: Setup, tag: &str) -> Harness {
    let dir = temp_dir(tag);
    let (ca, _) = CertificateAuthority::load_or_create(
        &dir.join("ca"),
        &veris_proxy::scope::scope(None, &["acme.test".into(), "example.test".into()]).unwrap(),
    )
    .unwrap();
    let ca_der = ca.cert_der().clone();
    let issuer = Arc::new(Issuer::new(Arc::new(ca), 100));
    let recorder = Arc::new(MemoryRecorder::default());
    let proxy = Proxy::new(
        ProxyOptions {
            router: setup.router,
            identity: Identity {
                run_id: "run1".into(),
                sandbox_id: "sbx".into(),
                canary: "cnry_00112233445566778899aabbccddeeff".into(),
                mode: setup.mode,
                tier: ListenerTier::Explicit,
            },
            twin_base: setup.twin_base,
            twin_auth: setup.twin_auth,
            upstream: Arc::new(Upstream::new(UpstreamOptions {
                response_timeout: setup.response_timeout,
                ..UpstreamOptions::default()
            })),
            grace: Duration::from_secs(2),
            limits: veris_proxy::Limits::default(),
            capture: None,
        },
        issuer,
        recorder.clone(),
    );
    proxy.probe_twin().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(veris_proxy::inbound::explicit::serve(
        listener,
        proxy,
        async move {
            let _ = stopped.await;
        },
    ));
    Harness {
        proxy: addr,
        ca: ca_der,
        recorder,
        _stop: stop,
    }
}

/// The built-in twin on loopback; returns its base URL.
async fn start_twin() -> String {
    start_twin_with(veris_twin::Fixtures::builtin()).await
}

/// The built-in twin with these fixtures; returns its base URL.
async fn start_twin_with(fixtures: veris_twin::Fixtures) -> String {
    let twin = veris_twin::Twin::new(veris_twin::TwinOptions {
        fixtures,
        sandbox: None,
        log: None,
        credential: None,
    })
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(veris_twin::serve(
        listener,
        twin,
        None,
        std::future::pending(),
    ));
    url
}

fn catalog_setup(twin: &str, mode: Mode) -> Setup {
    let services: Vec<String> = vec![
        "stripe".into(),
        "google-calendar".into(),
        "google-drive".into(),
    ];
    let settings = Settings::from_flags(Flags {
        listen: "127.0.0.1:0",
        twin,
        sandbox_id: "sbx",
        services: &services,
        routes: &[],
        mode,
        allow_passthrough: &[],
    })
    .unwrap();
    Setup {
        router: settings.router,
        mode,
        twin_base: twin.to_string(),
        response_timeout: Duration::from_secs(10),
        twin_auth: None,
    }
}

/// A router with explicit services pointing at arbitrary upstreams.
fn custom_setup(services: &[(&str, &str, &str, &[&str])], mode: Mode) -> Setup {
    let mut svcs = Vec::new();
    let mut claims = Vec::new();
    for (name, host, upstream, prefixes) in services {
        if !svcs.iter().any(|s: &Service| s.name == *name) {
            svcs.push(Service {
                name: name.to_string(),
                upstream: upstream.to_string(),
            });
        }
        claims.push(Claim {
            service: name.to_string(),
            host: HostPattern::parse(host).unwrap(),
            prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
        });
    }
    Setup {
        router: Router::new(svcs, claims, &[]).unwrap(),
        mode,
        twin_base: "http://127.0.0.1:1".into(),
        response_timeout: Duration::from_secs(10),
        twin_auth: None,
    }
}

/// CONNECT through the proxy, then TLS trusting only `ca`, offering `alpn`.
async fn tls_through(
    proxy: SocketAddr,
    ca: &CertificateDer<'static>,
    host: &str,
    port: u16,
    alpn: &[u8],
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tcp = connect_tunnel(proxy, host, port).await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    let name = ServerName::try_from(host.to_string()).unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS through the proxy verifies against the veris CA");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(alpn));
    tls
}

async fn connect_tunnel(proxy: SocketAddr, host: &str, port: u16) -> TcpStream {
    let mut tcp = TcpStream::connect(proxy).await.unwrap();
    tcp.write_all(
        format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let head = read_head(&mut tcp).await;
    assert!(head.starts_with("HTTP/1.1 200"), "CONNECT answered {head}");
    tcp
}

async fn read_head(tcp: &mut TcpStream) -> String {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        assert_eq!(
            tcp.read(&mut b).await.unwrap(),
            1,
            "closed mid-head: {head:?}"
        );
        head.push(b[0]);
    }
    String::from_utf8(head).unwrap()
}

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl Sender {
    async fn open(h: &Harness, host: &str, h2: bool) -> Sender {
        let alpn: &[u8] = if h2 { b"h2" } else { b"http/1.1" };
        let tls = tls_through(h.proxy, &h.ca, host, 443, alpn).await;
        let io = TokioIo::new(tls);
        if h2 {
            let (s, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .unwrap();
            tokio::spawn(conn);
            Sender::H2(s)
        } else {
            let (s, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn.with_upgrades());
            Sender::H1(s)
        }
    }

    async fn send(&mut self, req: Request<Full<Bytes>>) -> Response<Incoming> {
        match self {
            Sender::H1(s) => s.send_request(req).await.unwrap(),
            Sender::H2(s) => s.send_request(req).await.unwrap(),
        }
    }
}

fn request(method: &str, host: &str, path: &str, body: &str, h2: bool) -> Request<Full<Bytes>> {
    let b = Request::builder().method(method);
    let b = if h2 {
        b.uri(format!("https://{host}{path}"))
    } else {
        b.uri(path).header("host", host)
    };
    b.header("content-type", "application/x-www-form-urlencoded")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

async fn json_body(resp: Response<Incoming>) -> Value {
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&bytes)))
}

async fn twin_rows(twin: &str, service: &str) -> Vec<Value> {
    let url = format!("{twin}/s/sbx/{service}/veris/requests?order=asc&tier=handler&limit=1000");
    let uri: http::Uri = url.parse().unwrap();
    let tcp = TcpStream::connect(uri.authority().unwrap().as_str())
        .await
        .unwrap();
    let (mut s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get(uri.path_and_query().unwrap().as_str())
        .header("host", uri.authority().unwrap().as_str())
        .body(Full::new(Bytes::new()))
        .unwrap();
    let v = json_body(s.send_request(req).await.unwrap()).await;
    v["requests"].as_array().unwrap().clone()
}

fn requests(entries: &[Entry]) -> Vec<(String, String, String, u16, String)> {
    entries
        .iter()
        .filter_map(|e| match e {
            Entry::Request(RequestLine {
                service,
                method,
                path,
                status,
                http,
                ..
            }) => Some((
                service.clone(),
                method.clone(),
                path.clone(),
                *status,
                http.clone(),
            )),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn h1_and_h2_through_connect_reach_the_builtin_twin() {
    let twin = start_twin().await;
    let h = start_proxy(catalog_setup(&twin, Mode::Passthrough), "twin").await;
    for h2 in [false, true] {
        let mut s = Sender::open(&h, "api.stripe.com", h2).await;
        let resp = s
            .send(request(
                "POST",
                "api.stripe.com",
                "/v1/charges",
                "amount=2000&currency=usd",
                h2,
            ))
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(
            resp.headers().get("x-veris-proxy").is_none(),
            "the twin answered, not the proxy"
        );
        let charge = json_body(resp).await;
        assert_eq!(charge["amount"], 2000);
        let id = charge["id"].as_str().unwrap().to_string();
        let resp = s
            .send(request(
                "GET",
                "api.stripe.com",
                &format!("/v1/charges/{id}"),
                "",
                h2,
            ))
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(json_body(resp).await["id"], id.as_str());
    }
    let rows = twin_rows(&twin, "stripe").await;
    let seen: Vec<(String, u64)> = rows
        .iter()
        .map(|r| {
            (
                format!(
                    "{} {}",
                    r["method"].as_str().unwrap(),
                    r["path"].as_str().unwrap()
                ),
                r["status"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert_eq!(seen[0], ("POST /v1/charges".to_string(), 200));
    let recorded = requests(&h.recorder.entries());
    assert_eq!(recorded.len(), 4);
    assert_eq!(
        recorded[0],
        (
            "stripe".into(),
            "POST".into(),
            "/v1/charges".into(),
            200,
            "HTTP/1.1".into()
        )
    );
    assert_eq!(recorded[2].4, "HTTP/2");
}

/// An origin that echoes what it received as JSON, and has a few special paths.
async fn start_echo(sse_gate: Arc<Mutex<Option<oneshot::Receiver<()>>>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let gate = sse_gate.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let gate = gate.clone();
                    async move { Ok::<_, Infallible>(echo(req, gate).await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    url
}

async fn echo(
    mut req: Request<Incoming>,
    gate: Arc<Mutex<Option<oneshot::Receiver<()>>>>,
) -> Response<Body> {
    match req.uri().path() {
        "/hang" => std::future::pending().await,
        "/redirect" => Response::builder()
            .status(302)
            .header("location", "https://elsewhere.example/next")
            .body(full(""))
            .unwrap(),
        "/sse" => {
            let (mut tx, body) = http_body_util::channel::Channel::<
                Bytes,
                Box<dyn std::error::Error + Send + Sync>,
            >::new(4);
            let gate = gate.lock().unwrap().take();
            tokio::spawn(async move {
                tx.send_data(Bytes::from_static(b"data: first\n\n"))
                    .await
                    .unwrap();
                if let Some(gate) = gate {
                    let _ = gate.await;
                }
                tx.send_data(Bytes::from_static(b"data: second\n\n"))
                    .await
                    .unwrap();
            });
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(body.boxed())
                .unwrap()
        }
        "/ws" => {
            let on_upgrade = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                let mut io = TokioIo::new(on_upgrade.await.unwrap());
                let mut buf = [0u8; 64];
                loop {
                    let n = io.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    io.write_all(&buf[..n]).await.unwrap();
                }
            });
            Response::builder()
                .status(101)
                .header("upgrade", "websocket")
                .header("connection", "upgrade")
                .body(full(""))
                .unwrap()
        }
        _ => {
            let method = req.method().to_string();
            let uri = req.uri().clone();
            let version = format!("{:?}", req.version());
            let headers: serde_json::Map<String, Value> = req
                .headers()
                .iter()
                .map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap_or(""))))
                .collect();
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let v = json!({
                "method": method,
                "path": uri.path(),
                "query": uri.query(),
                "version": version,
                "headers": headers,
                "body": String::from_utf8_lossy(&body),
            });
            Response::builder()
                .header("content-type", "application/json")
                .body(full(&v.to_string()))
                .unwrap()
        }
    }
}

fn full(s: &str) -> Body {
    Full::new(Bytes::from(s.to_string()))
        .map_err(|n| match n {})
        .boxed()
}

#[tokio::test]
async fn request_arrives_intact_with_veris_headers() {
    let echo = start_echo(Arc::default()).await;
    let up = format!("{echo}/base");
    let h = start_proxy(
        custom_setup(&[("acme", "*.acme.test", &up, &[])], Mode::Strict),
        "intact",
    )
    .await;
    for h2 in [false, true] {
        let mut s = Sender::open(&h, "api.acme.test", h2).await;
        let mut req = request(
            "PATCH",
            "api.acme.test",
            "/v1/things/7?expand=a&limit=3",
            "name=x&n=1",
            h2,
        );
        req.headers_mut()
            .insert("x-custom", "kept".parse().unwrap());
        req.headers_mut()
            .insert("idempotency-key", "idem-1".parse().unwrap());
        let resp = s.send(req).await;
        assert_eq!(resp.status(), 200);
        let v = json_body(resp).await;
        assert_eq!(v["method"], "PATCH");
        assert_eq!(v["path"], "/base/v1/things/7");
        assert_eq!(v["query"], "expand=a&limit=3");
        assert_eq!(v["body"], "name=x&n=1");
        let hd = &v["headers"];
        assert_eq!(hd["x-custom"], "kept");
        assert_eq!(hd["idempotency-key"], "idem-1");
        assert_eq!(hd["x-veris-original-host"], "api.acme.test");
        assert_eq!(hd["x-veris-service"], "acme");
        assert_eq!(hd["x-veris-sandbox"], "sbx");
        assert_eq!(hd["host"], echo.trim_start_matches("http://"));
    }
    // The bare domain matches the wildcard too.
    let mut s = Sender::open(&h, "acme.test", false).await;
    let v = json_body(s.send(request("GET", "acme.test", "/x", "", false)).await).await;
    assert_eq!(v["headers"]["x-veris-service"], "acme");
    let entries = h.recorder.entries();
    match &entries[0] {
        Entry::Request(RequestLine {
            query,
            bytes_in,
            headers,
            ..
        }) => {
            assert_eq!(query.as_deref(), Some("expand=a&limit=3"));
            assert_eq!(*bytes_in, 10);
            assert!(headers
                .iter()
                .any(|(k, v)| k == "idempotency-key" && v == "idem-1"));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn redirects_are_returned_not_followed() {
    let echo = start_echo(Arc::default()).await;
    let h = start_proxy(
        custom_setup(&[("acme", "api.acme.test", &echo, &[])], Mode::Strict),
        "redirect",
    )
    .await;
    let mut s = Sender::open(&h, "api.acme.test", false).await;
    let resp = s
        .send(request("GET", "api.acme.test", "/redirect", "", false))
        .await;
    assert_eq!(resp.status(), 302);
    assert_eq!(resp.headers()["location"], "https://elsewhere.example/next");
}

#[tokio::test]
async fn path_prefixes_split_a_shared_host_between_services() {
    let twin = start_twin().await;
    let h = start_proxy(catalog_setup(&twin, Mode::Strict), "prefix").await;
    let mut s = Sender::open(&h, "www.googleapis.com", true).await;
    let resp = s
        .send(request(
            "GET",
            "www.googleapis.com",
            "/calendar/v3/calendars/primary/events",
            "",
            true,
        ))
        .await;
    assert_eq!(resp.status(), 200);
    let resp = s
        .send(request(
            "GET",
            "www.googleapis.com",
            "/drive/v3/files",
            "",
            true,
        ))
        .await;
    let drive_status = resp.status();
    assert_ne!(drive_status, 421, "drive is routed, not refused");
    // Not claimed by any service on this host: refused in strict mode.
    let resp = s
        .send(request(
            "GET",
            "www.googleapis.com",
            "/youtube/v3/videos",
            "",
            true,
        ))
        .await;
    assert_eq!(resp.status(), 421);
    assert_eq!(twin_rows(&twin, "google-calendar").await.len(), 1);
    assert_eq!(twin_rows(&twin, "google-drive").await.len(), 1);
    let rec = requests(&h.recorder.entries());
    assert_eq!(rec[0].0, "google-calendar");
    assert_eq!(rec[1].0, "google-drive");
}

#[tokio::test]
async fn strict_mode_refuses_unmapped_hosts_with_421_in_words() {
    let twin = start_twin().await;
    let h = start_proxy(catalog_setup(&twin, Mode::Strict), "strict").await;
    let mut s = Sender::open(&h, "unmapped.example.test", false).await;
    let resp = s
        .send(request("GET", "unmapped.example.test", "/v1/x", "", false))
        .await;
    assert_eq!(resp.status(), StatusCode::MISDIRECTED_REQUEST);
    assert_eq!(resp.headers()["x-veris-proxy"], "1");
    let v = json_body(resp).await;
    assert_eq!(v["error"], "veris_unmapped_host");
    assert_eq!(v["host"], "unmapped.example.test");
    assert_eq!(v["sandbox_id"], "sbx");
    assert!(v["message"].as_str().unwrap().contains("strict"));
    assert!(!v["remedy"].as_array().unwrap().is_empty());
    let known: Vec<&str> = v["known_services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    assert!(known.contains(&"stripe"));
    match &h.recorder.entries()[..] {
        [Entry::Blocked(BlockedLine {
            host, path, dst, ..
        })] => {
            assert_eq!(host, "unmapped.example.test");
            assert_eq!(path.as_deref(), Some("/v1/x"));
            // Explicit tier: the client's bytes were headed to the proxy, no further.
            assert_eq!(dst, &None);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn loopback_connect_is_tunneled_and_recorded_at_open_and_close() {
    let echo = start_echo(Arc::default()).await;
    let port: u16 = echo.rsplit(':').next().unwrap().parse().unwrap();
    let twin = start_twin().await;
    let h = start_proxy(catalog_setup(&twin, Mode::Strict), "tunnel").await;
    let tcp = connect_tunnel(h.proxy, "127.0.0.1", port).await;
    let (mut s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let v = json_body(
        s.send_request(request("GET", "127.0.0.1", "/plain", "", false))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(v["path"], "/plain");
    assert!(
        v["headers"].get("x-veris-service").is_none(),
        "a tunnel is not intercepted"
    );
    // Recorded while still open (a tunnel open when the proxy stops is in
    // the ledger too).
    match &h.recorder.entries()[..] {
        [Entry::Passthrough(PassthroughLine {
            host,
            port: p,
            reason,
            bytes_in: 0,
            bytes_out: 0,
            dst,
            ..
        })] => {
            assert_eq!(host, "127.0.0.1");
            assert_eq!(*p, port);
            assert_eq!(reason, "loopback");
            // The address the tunnel's dial connected to.
            assert_eq!(dst.as_deref(), Some(format!("127.0.0.1:{port}").as_str()));
        }
        other => panic!("{other:?}"),
    }
    drop(s);
    let _ = conn.await;
    let entries = h.recorder.wait_for(2).await;
    match &entries[1] {
        Entry::TunnelClose(TunnelCloseLine {
            of: 1,
            bytes_in,
            bytes_out,
            ..
        }) => assert!(*bytes_in > 0 && *bytes_out > 0, "{:?}", entries[1]),
        other => panic!("{other:?}"),
    }
}

/// `*.localhost` is loopback by definition (RFC 6761): a CONNECT to one is
/// dialed on loopback without asking a resolver, and its line records the
/// address the dial reached beside the name.
#[tokio::test]
async fn a_localhost_subdomain_is_tunneled_to_loopback_and_recorded_with_its_address() {
    let echo = start_echo(Arc::default()).await;
    let port: u16 = echo.rsplit(':').next().unwrap().parse().unwrap();
    let twin = start_twin().await;
    let h = start_proxy(catalog_setup(&twin, Mode::Strict), "localhost-sub").await;
    let tcp = connect_tunnel(h.proxy, "app.dev.localhost", port).await;
    let (mut s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let resp = s
        .send_request(request("GET", "app.dev.localhost", "/plain", "", false))
        .await
        .unwrap();
    assert_eq!(json_body(resp).await["path"], "/plain");
    drop(s);
    let _ = conn.await;
    match &h.recorder.wait_for(1).await[..] {
        [Entry::Passthrough(PassthroughLine {
            host, reason, dst, ..
        })] => {
            assert_eq!(host, "app.dev.localhost");
            assert_eq!(reason, "loopback");
            assert_eq!(dst.as_deref(), Some(format!("127.0.0.1:{port}").as_str()));
        }
        other => panic!("{other:?}"),
    }
}

/// A re-originated plain-HTTP passthrough records the address the upstream
/// client's connection reached.
#[tokio::test]
async fn a_reoriginated_passthrough_records_the_address_it_reached() {
    let echo = start_echo(Arc::default()).await;
    let port: u16 = echo.rsplit(':').next().unwrap().parse().unwrap();
    let twin = start_twin().await;
    let h = start_proxy(catalog_setup(&twin, Mode::Strict), "reoriginated").await;
    let tcp = TcpStream::connect(h.proxy).await.unwrap();
    let (mut s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get(format!("http://echo.localhost:{port}/plain"))
        .header("host", format!("echo.localhost:{port}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = s.send_request(req).await.unwrap();
    assert_eq!(json_body(resp).await["path"], "/plain");
    match &h.recorder.wait_for(1).await[..] {
        [Entry::Passthrough(PassthroughLine {
            host,
            port: p,
            reason,
            dst,
            tier,
            ..
        })] => {
            assert_eq!(host, "echo.localhost");
            assert_eq!(*p, port);
            assert_eq!(reason, "loopback");
            assert_eq!(*tier, ListenerTier::Explicit);
            assert_eq!(dst.as_deref(), Some(format!("127.0.0.1:{port}").as_str()));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn twin_down_is_a_502_naming_the_upstream() {
    // A port that was just free: nothing listens there.
    let dead = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let up = format!("http://{dead}/s/sbx/stripe");
    let h = start_proxy(
        custom_setup(&[("stripe", "api.stripe.com", &up, &[])], Mode::Strict),
        "down",
    )
    .await;
    let mut s = Sender::open(&h, "api.stripe.com", false).await;
    let resp = s
        .send(request(
            "POST",
            "api.stripe.com",
            "/v1/charges",
            "amount=1",
            false,
        ))
        .await;
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(resp.headers()["x-veris-proxy"], "1");
    let v = json_body(resp).await;
    assert_eq!(v["error"], "veris_upstream_unreachable");
    assert!(v["upstream"].as_str().unwrap().contains(&dead.to_string()));
    assert!(v["message"].as_str().unwrap().contains("Next:"));
    match &h.recorder.entries()[..] {
        [Entry::UpstreamError(UpstreamErrorLine {
            status: 502,
            error,
            service,
            ..
        })] => {
            assert_eq!(error, "veris_upstream_unreachable");
            assert_eq!(service, "stripe");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn slow_twin_is_a_504() {
    let echo = start_echo(Arc::default()).await;
    let mut setup = custom_setup(&[("acme", "api.acme.test", &echo, &[])], Mode::Strict);
    setup.response_timeout = Duration::from_millis(300);
    let h = start_proxy(setup, "slow").await;
    let mut s = Sender::open(&h, "api.acme.test", false).await;
    let resp = s
        .send(request("GET", "api.acme.test", "/hang", "", false))
        .await;
    assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(json_body(resp).await["error"], "veris_upstream_timeout");
    assert!(matches!(
        &h.recorder.entries()[..],
        [Entry::UpstreamError(UpstreamErrorLine { status: 504, .. })]
    ));
}

#[tokio::test]
async fn unrecordable_requests_are_refused_with_503() {
    let twin = start_twin().await;
    let h = start_proxy(catalog_setup(&twin, Mode::Passthrough), "ledger").await;
    h.recorder.set_failing(true);
    let mut s = Sender::open(&h, "api.stripe.com", false).await;
    let resp = s
        .send(request(
            "POST",
            "api.stripe.com",
            "/v1/customers",
            "email=a%40b.c",
            false,
        ))
        .await;
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(json_body(resp).await["error"], "veris_ledger_unavailable");
    // Recovery: the next request is served and recorded.
    h.recorder.set_failing(false);
    let resp = s
        .send(request(
            "POST",
            "api.stripe.com",
            "/v1/customers",
            "email=a%40b.c",
            false,
        ))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(requests(&h.recorder.entries()).len(), 1);
}

#[tokio::test]
async fn canary_is_answered_by_the_proxy_on_every_path_to_it() {
    let twin = start_twin().await;
    let h = start_proxy(catalog_setup(&twin, Mode::Strict), "canary").await;
    let check = |v: Value| {
        assert_eq!(v["veris_proxy"], true);
        assert_eq!(v["canary"], "cnry_00112233445566778899aabbccddeeff");
        assert_eq!(v["run_id"], "run1");
        assert_eq!(v["sandbox_id"], "sbx");
        assert_eq!(v["mode"], "strict");
        assert_eq!(v["tier"], "explicit");
    };
    // On a vendor host, through TLS.
    let mut s = Sender::open(&h, "api.stripe.com", true).await;
    let resp = s
        .send(request(
            "GET",
            "api.stripe.com",
            "/__veris/canary",
            "",
            true,
        ))
        .await;
    assert_eq!(resp.headers()["x-veris-proxy"], "1");
    check(json_body(resp).await);
    // The reserved host.
    let mut s = Sender::open(&h, "canary.veris.internal", false).await;
    check(
        json_body(
            s.send(request("GET", "canary.veris.internal", "/", "", false))
                .await,
        )
        .await,
    );
    // Absolute-form plain HTTP for any host.
    let tcp = TcpStream::connect(h.proxy).await.unwrap();
    let (mut s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get("http://anything.example.test/__veris/canary")
        .header("host", "anything.example.test")
        .body(Full::new(Bytes::new()))
        .unwrap();
    check(json_body(s.send_request(req).await.unwrap()).await);
    assert!(
        requests(&h.recorder.entries()).is_empty(),
        "canary probes are not vendor traffic"
    );
    assert_eq!(twin_rows(&twin, "stripe").await.len(), 0);
}

#[tokio::test]
async fn absolute_form_plain_http_is_routed_like_https() {
    let twin = start_twin().await;
    let h = start_proxy(catalog_setup(&twin, Mode::Strict), "plain").await;
    let tcp = TcpStream::connect(h.proxy).await.unwrap();
    let (mut s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::post("http://api.stripe.com/v1/customers")
        .header("host", "api.stripe.com")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Full::new(Bytes::from_static(b"email=x%40y.z")))
        .unwrap();
    let resp = s.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(json_body(resp).await["email"], "x@y.z");
    let req = Request::get("http://unmapped.example.test/")
        .header("host", "unmapped.example.test")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(s.send_request(req).await.unwrap().status(), 421);
    assert_eq!(twin_rows(&twin, "stripe").await.len(), 1);
}

#[tokio::test]
async fn websocket_upgrades_are_relayed_to_the_twin() {
    let echo = start_echo(Arc::default()).await;
    let h = start_proxy(
        custom_setup(&[("acme", "api.acme.test", &echo, &[])], Mode::Strict),
        "ws",
    )
    .await;
    let tls = tls_through(h.proxy, &h.ca, "api.acme.test", 443, b"http/1.1").await;
    let (mut s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn.with_upgrades());
    let req = Request::get("/ws")
        .header("host", "api.acme.test")
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = s.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    let mut io = TokioIo::new(hyper::upgrade::on(resp).await.unwrap());
    io.write_all(b"ping-frame").await.unwrap();
    let mut buf = [0u8; 10];
    io.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping-frame");
    assert!(matches!(
        &h.recorder.entries()[..],
        [Entry::Request(RequestLine {
            websocket: true,
            status: 101,
            ..
        })]
    ));
}

#[tokio::test]
async fn event_streams_are_not_buffered() {
    let (open_gate, gate) = oneshot::channel();
    let echo = start_echo(Arc::new(Mutex::new(Some(gate)))).await;
    let h = start_proxy(
        custom_setup(&[("acme", "api.acme.test", &echo, &[])], Mode::Strict),
        "sse",
    )
    .await;
    let mut s = Sender::open(&h, "api.acme.test", false).await;
    let resp = s
        .send(request("GET", "api.acme.test", "/sse", "", false))
        .await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    // The origin holds the second event until the client has seen the first:
    // this only completes if the proxy streams.
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"data: first\n\n");
    open_gate.send(()).unwrap();
    let second = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&second[..], b"data: second\n\n");
}

#[tokio::test]
async fn garbage_on_the_proxy_port_gets_400_and_the_proxy_keeps_serving() {
    let twin = start_twin().await;
    let h = start_proxy(catalog_setup(&twin, Mode::Strict), "garbage").await;
    let mut tcp = TcpStream::connect(h.proxy).await.unwrap();
    tcp.write_all(b"\x16\x03\x01\x02\x00 not http at all\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tcp.read_to_end(&mut out).await;
    assert!(
        String::from_utf8_lossy(&out).starts_with("HTTP/1.1 400"),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
    // Origin-form requests to the proxy itself are explained.
    let tcp = TcpStream::connect(h.proxy).await.unwrap();
    let (mut s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let resp = s
        .send_request(
            Request::get("/")
                .header("host", "x")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert_eq!(json_body(resp).await["error"], "veris_not_a_proxy_request");
    // Still serving.
    let mut s = Sender::open(&h, "api.stripe.com", false).await;
    assert_eq!(
        s.send(request("GET", "api.stripe.com", "/v1/customers", "", false))
            .await
            .status(),
        200
    );
}

/// Every row of a service's twin log, control reads included (this read's own
/// row is written after it answers, so it is not in what it returns).
async fn twin_log(twin: &str, service: &str) -> Vec<Value> {
    let uri: http::Uri = format!("{twin}/s/sbx/{service}/veris/requests?order=asc&limit=1000")
        .parse()
        .unwrap();
    let tcp = TcpStream::connect(uri.authority().unwrap().as_str())
        .await
        .unwrap();
    let (mut s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get(uri.path_and_query().unwrap().as_str())
        .header("host", uri.authority().unwrap().as_str())
        .body(Full::new(Bytes::new()))
        .unwrap();
    let v = json_body(s.send_request(req).await.unwrap()).await;
    v["requests"].as_array().unwrap().clone()
}

#[tokio::test]
async fn reserved_paths_never_reach_the_twin_and_are_recorded_as_such() {
    let twin = start_twin().await;
    let h = start_proxy(catalog_setup(&twin, Mode::Strict), "reserved").await;
    // (path, status, error): the control surface in several spellings, and
    // dot-segments raw, percent-encoded and behind encoded separators.
    let cases: &[(&str, u16, &str)] = &[
        ("/veris/health", 404, "veris_reserved_path"),
        ("/veris/requests?limit=1000", 404, "veris_reserved_path"),
        ("/%76eris/health", 404, "veris_reserved_path"),
        ("/VERIS/requests", 404, "veris_reserved_path"),
        ("//veris/requests", 404, "veris_reserved_path"),
        ("/v1/../veris/requests", 400, "veris_bad_path"),
        ("/%2e%2e/x", 400, "veris_bad_path"),
        (
            "/v1/%2E%2e/%2e%2e/s/sbx/stripe/v1/charges",
            400,
            "veris_bad_path",
        ),
        ("/v1%2f..%2fveris%2frequests", 400, "veris_bad_path"),
        ("/v1/./charges", 400, "veris_bad_path"),
    ];
    let mut expected = Vec::new();
    for h2 in [false, true] {
        let mut s = Sender::open(&h, "api.stripe.com", h2).await;
        for (path, status, error) in cases {
            let resp = s
                .send(request("POST", "api.stripe.com", path, "amount=1", h2))
                .await;
            assert_eq!(resp.status().as_u16(), *status, "{path} (h2: {h2})");
            assert_eq!(resp.headers()["x-veris-proxy"], "1", "{path}");
            let v = json_body(resp).await;
            assert_eq!(v["error"], *error, "{path}");
            assert!(
                v["message"].as_str().unwrap().contains("Next:"),
                "{path}: {v}"
            );
            let recorded_path = path.split('?').next().unwrap();
            expected.push((recorded_path.to_string(), *status, error.to_string()));
        }
    }
    // Absolute-form plain HTTP is screened the same way.
    let tcp = TcpStream::connect(h.proxy).await.unwrap();
    let (mut plain, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get("http://api.stripe.com/veris/requests")
        .header("host", "api.stripe.com")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(plain.send_request(req).await.unwrap().status(), 404);
    expected.push(("/veris/requests".into(), 404, "veris_reserved_path".into()));

    assert_eq!(
        twin_log(&twin, "stripe").await,
        Vec::<Value>::new(),
        "nothing reached the twin, not even its control surface"
    );
    let entries = h.recorder.entries();
    assert!(requests(&entries).is_empty(), "no vendor call: {entries:?}");
    let recorded: Vec<(String, u16, String)> = entries
        .iter()
        .map(|e| match e {
            Entry::ReservedPath(ReservedPathLine {
                service,
                host,
                method,
                path,
                status,
                error,
                tier,
            }) => {
                assert_eq!(
                    (service.as_str(), host.as_str(), *tier),
                    ("stripe", "api.stripe.com", ListenerTier::Explicit)
                );
                assert!(method == "POST" || method == "GET");
                (path.clone(), *status, error.clone())
            }
            other => panic!("expected reserved_path, got {other:?}"),
        })
        .collect();
    assert_eq!(recorded, expected);

    // A vendor call still works on the same connection, and an unrecordable
    // refusal is a 503 like any unrecordable vendor request.
    let mut s = Sender::open(&h, "api.stripe.com", false).await;
    let resp = s
        .send(request(
            "POST",
            "api.stripe.com",
            "/v1/charges",
            "amount=1",
            false,
        ))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        twin_log(&twin, "stripe").await.len(),
        2,
        "the charge and one log read"
    );
    h.recorder.set_failing(true);
    let resp = s
        .send(request("GET", "api.stripe.com", "/veris/health", "", false))
        .await;
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(json_body(resp).await["error"], "veris_ledger_unavailable");
}

#[tokio::test]
async fn a_request_the_twin_executed_is_recorded_when_the_client_left_first() {
    let mut fixtures = veris_twin::Fixtures::builtin();
    fixtures.extend(
        veris_twin::Fixtures::from_json(
            r#"[{"service": "stripe", "method": "POST", "path": "/v1/slow",
                 "fault": {"hang_ms": 1000}, "body": {"object": "slow"}}]"#,
        )
        .unwrap(),
    );
    let twin = start_twin_with(fixtures).await;
    let h = start_proxy(catalog_setup(&twin, Mode::Strict), "gone").await;

    // A client that waits for its answer: client_gone false.
    let mut s = Sender::open(&h, "api.stripe.com", false).await;
    let resp = s
        .send(request(
            "POST",
            "api.stripe.com",
            "/v1/charges",
            "amount=1",
            false,
        ))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);

    // Clients that send the slow request and hang up 200 ms later, long
    // before the twin answers (HTTP/1.1, then an HTTP/2 stream).
    let mut tls = tls_through(h.proxy, &h.ca, "api.stripe.com", 443, b"http/1.1").await;
    tls.write_all(
        b"POST /v1/slow HTTP/1.1\r\nHost: api.stripe.com\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 8\r\n\r\namount=1",
    )
    .await
    .unwrap();
    tls.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(tls);
    let entries = tokio::time::timeout(Duration::from_secs(10), h.recorder.wait_for(2))
        .await
        .expect("the abandoned request is recorded once the twin answers");

    let tls = tls_through(h.proxy, &h.ca, "api.stripe.com", 443, b"h2").await;
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let pending = tokio::spawn(async move {
        h2.send_request(request(
            "POST",
            "api.stripe.com",
            "/v1/slow",
            "amount=2",
            true,
        ))
        .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    pending.abort();
    conn.abort();
    let _ = conn.await;
    let entries_h2 = tokio::time::timeout(Duration::from_secs(10), h.recorder.wait_for(3))
        .await
        .expect("the abandoned HTTP/2 request is recorded once the twin answers");
    assert_eq!(entries[..2], entries_h2[..2]);

    let lines: Vec<(String, u16, bool, u64)> = entries_h2
        .iter()
        .map(|e| match e {
            Entry::Request(RequestLine {
                path,
                status,
                client_gone,
                duration_ms,
                ..
            }) => (path.clone(), *status, *client_gone, *duration_ms),
            other => panic!("expected request lines, got {other:?}"),
        })
        .collect();
    assert_eq!(
        (lines[0].0.as_str(), lines[0].1, lines[0].2),
        ("/v1/charges", 200, false)
    );
    for line in &lines[1..] {
        assert_eq!((line.0.as_str(), line.1, line.2), ("/v1/slow", 200, true));
        assert!(line.3 >= 900, "recorded when the twin answered: {line:?}");
    }
    // The twin's own log agrees: it executed both and answered 200.
    let slow: Vec<Value> = twin_log(&twin, "stripe")
        .await
        .into_iter()
        .filter(|r| r["path"] == "/v1/slow")
        .collect();
    assert_eq!(slow.len(), 2, "{slow:?}");
    assert!(slow.iter().all(|r| r["status"] == 200), "{slow:?}");
}

#[tokio::test]
async fn an_upstream_timeout_is_recorded_when_the_client_left_first() {
    let echo = start_echo(Arc::default()).await;
    let mut setup = custom_setup(&[("acme", "api.acme.test", &echo, &[])], Mode::Strict);
    setup.response_timeout = Duration::from_millis(500);
    let h = start_proxy(setup, "gone-timeout").await;
    let mut tls = tls_through(h.proxy, &h.ca, "api.acme.test", 443, b"http/1.1").await;
    tls.write_all(b"GET /hang HTTP/1.1\r\nHost: api.acme.test\r\n\r\n")
        .await
        .unwrap();
    tls.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(tls);
    let entries = tokio::time::timeout(Duration::from_secs(10), h.recorder.wait_for(1))
        .await
        .expect("the timeout is recorded although nobody waits for it");
    match &entries[..] {
        [Entry::UpstreamError(UpstreamErrorLine {
            status: 504,
            error,
            path,
            ..
        })] => assert_eq!(
            (error.as_str(), path.as_str()),
            ("veris_upstream_timeout", "/hang")
        ),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn with_a_twin_credential_only_the_proxy_says_what_the_client_authorization_was() {
    let echo = start_echo(Arc::default()).await;
    let mut setup = custom_setup(&[("acme", "api.acme.test", &echo, &[])], Mode::Strict);
    setup.twin_auth = Some("twin-secret".into());
    let h = start_proxy(setup, "twin-auth").await;
    let mut s = Sender::open(&h, "api.acme.test", false).await;
    let send = |auth: Option<&'static str>| {
        let mut req = request("GET", "api.acme.test", "/x", "", false);
        if let Some(auth) = auth {
            req.headers_mut()
                .insert("authorization", auth.parse().unwrap());
        }
        // A client trying to tell the twin what its authorization was.
        req.headers_mut().insert(
            "x-veris-original-authorization",
            "Bearer spoofed".parse().unwrap(),
        );
        req
    };
    let v = json_body(s.send(send(Some("Bearer client-own"))).await).await;
    assert_eq!(v["headers"]["authorization"], "Bearer twin-secret");
    assert_eq!(
        v["headers"]["x-veris-original-authorization"],
        "Bearer client-own"
    );
    let v = json_body(s.send(send(None)).await).await;
    assert_eq!(v["headers"]["authorization"], "Bearer twin-secret");
    assert_eq!(v["headers"]["x-veris-original-authorization"], Value::Null);
    // The ledger records the client's own authorization, redacted, never the credential.
    let line = format!("{:?}", h.recorder.entries());
    assert!(!line.contains("twin-secret"), "{line}");
}

/// A client session store that offers whatever ticket it holds for
/// `api.stripe.com` to every server name: a client trying to resume one
/// host's session on another host's connection.
#[derive(Debug)]
struct OneTicketForAll(rustls::client::ClientSessionMemoryCache);

impl rustls::client::ClientSessionStore for OneTicketForAll {
    fn set_kx_hint(&self, name: ServerName<'static>, group: rustls::NamedGroup) {
        self.0.set_kx_hint(name, group)
    }
    fn kx_hint(&self, name: &ServerName<'_>) -> Option<rustls::NamedGroup> {
        self.0.kx_hint(name)
    }
    fn set_tls12_session(
        &self,
        name: ServerName<'static>,
        value: rustls::client::Tls12ClientSessionValue,
    ) {
        self.0.set_tls12_session(name, value)
    }
    fn tls12_session(
        &self,
        name: &ServerName<'_>,
    ) -> Option<rustls::client::Tls12ClientSessionValue> {
        self.0.tls12_session(name)
    }
    fn remove_tls12_session(&self, name: &ServerName<'static>) {
        self.0.remove_tls12_session(name)
    }
    fn insert_tls13_ticket(
        &self,
        name: ServerName<'static>,
        value: rustls::client::Tls13ClientSessionValue,
    ) {
        self.0.insert_tls13_ticket(name, value)
    }
    fn take_tls13_ticket(
        &self,
        _: &ServerName<'static>,
    ) -> Option<rustls::client::Tls13ClientSessionValue> {
        self.0
            .take_tls13_ticket(&ServerName::try_from("api.stripe.com").unwrap())
    }
}

/// One request on a fresh connection through the proxy with `config`;
/// returns how the TLS handshake went.
async fn one_request(
    h: &Harness,
    config: &Arc<rustls::ClientConfig>,
    host: &str,
) -> rustls::HandshakeKind {
    let tcp = connect_tunnel(h.proxy, host, 443).await;
    let name = ServerName::try_from(host.to_string()).unwrap();
    let tls = tokio_rustls::TlsConnector::from(config.clone())
        .connect(name, tcp)
        .await
        .expect("TLS through the proxy verifies against the veris CA");
    let kind = tls.get_ref().1.handshake_kind().expect("handshake done");
    let (mut s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let path = if host == "api.stripe.com" {
        "/v1/customers"
    } else {
        "/user"
    };
    let resp = s
        .send_request(request("GET", host, path, "", false))
        .await
        .unwrap();
    assert!(resp.status().is_success() || resp.status() == StatusCode::NOT_FOUND);
    // Reading the answer also reads the session tickets sent after the handshake.
    resp.into_body().collect().await.unwrap();
    kind
}

#[tokio::test]
async fn a_client_resumes_its_tls_session_for_the_same_host_only() {
    let twin = start_twin().await;
    let h = start_proxy(catalog_setup(&twin, Mode::Strict), "resume").await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(h.ca.clone()).unwrap();
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.resumption = rustls::client::Resumption::store(Arc::new(OneTicketForAll(
        rustls::client::ClientSessionMemoryCache::new(16),
    )));
    let config = Arc::new(config);

    use rustls::HandshakeKind::{Full, Resumed};
    assert_eq!(one_request(&h, &config, "api.stripe.com").await, Full);
    // The next connection to the same host resumes: no certificate, no signature.
    assert_eq!(one_request(&h, &config, "api.stripe.com").await, Resumed);
    // api.stripe.com's ticket offered for another host is refused: that host's
    // connection gets a full handshake with its own leaf, verified as usual.
    one_request(&h, &config, "api.stripe.com").await;
    assert_eq!(one_request(&h, &config, "files.stripe.com").await, Full);
    // A resumed connection is served and recorded like any other.
    let entries = h.recorder.wait_for(4).await;
    let hosts: Vec<String> = entries
        .iter()
        .filter_map(|e| match e {
            Entry::Request(RequestLine { host, .. }) => Some(host.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        hosts,
        [
            "api.stripe.com",
            "api.stripe.com",
            "api.stripe.com",
            "files.stripe.com"
        ]
    );
}
