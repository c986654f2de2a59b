//! Throughput and latency through the proxy versus straight to the twin, in one run.
//!
//! Prints figures; asserts nothing. Both paths use the built-in twin on loopback
//! and keep-alive HTTP/1.1 clients; the proxied path adds CONNECT, TLS with a
//! minted leaf, routing, header rewriting and a real ledger append per request.
//!
//!     cargo run --release -p veris-proxy --example bench_proxy [-- REQUESTS CONNECTIONS]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use veris_ca::{CertificateAuthority, Issuer};
use veris_proxy::config::{Flags, Settings};
use veris_proxy::upstream::UpstreamOptions;
use veris_proxy::{Identity, Proxy, ProxyOptions};
use veris_receipt::ledger::Ledger;
use veris_receipt::{ListenerTier, Mode};

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

#[tokio::main]
async fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let total = args.first().copied().unwrap_or(5_000).min(200_000);
    let conns = args.get(1).copied().unwrap_or(8).clamp(1, 256);

    let twin = veris_twin::Twin::new(veris_twin::TwinOptions {
        fixtures: veris_twin::Fixtures::builtin(),
        sandbox: None,
        log: None,
        credential: None,
    })
    .expect("twin");
    let twin_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind twin");
    let twin_addr = twin_listener.local_addr().expect("twin addr");
    tokio::spawn(veris_twin::serve(
        twin_listener,
        twin,
        None,
        std::future::pending(),
    ));
    let twin_url = format!("http://{twin_addr}");

    let dir = std::env::temp_dir().join(format!("veris-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (ca, _) = CertificateAuthority::load_or_create(&dir.join("ca")).expect("ca");
    let ca_der = ca.cert_der().clone();
    let (ledger, _) = Ledger::open(&dir.join("ledger.jsonl")).expect("ledger");
    let settings = Settings::from_flags(Flags {
        listen: "127.0.0.1:0",
        twin: &twin_url,
        sandbox_id: "sbx",
        services: &["stripe".to_string()],
        routes: &[],
        mode: Mode::Passthrough,
        allow_passthrough: &[],
    })
    .expect("settings");
    let proxy = Proxy::new(
        ProxyOptions {
            router: settings.router,
            identity: Identity {
                run_id: "bench".into(),
                sandbox_id: "sbx".into(),
                canary: "cnry_00000000000000000000000000000000".into(),
                mode: Mode::Passthrough,
                tier: ListenerTier::Explicit,
            },
            twin_base: twin_url.clone(),
            twin_auth: None,
            upstream: UpstreamOptions::default(),
            grace: Duration::from_secs(1),
            limits: veris_proxy::Limits::default(),
        },
        Arc::new(Issuer::new(Arc::new(ca), 100)),
        Arc::new(ledger),
    );
    let h2c = proxy.probe_twin().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
    let proxy_addr = listener.local_addr().expect("proxy addr");
    tokio::spawn(veris_proxy::serve(listener, proxy, std::future::pending()));

    println!("veris proxy benchmark: {total} requests over {conns} keep-alive connections (twin h2c upstream: {h2c})");
    let direct = {
        let mut senders = Vec::new();
        for _ in 0..conns {
            let tcp = TcpStream::connect(twin_addr).await.expect("connect twin");
            senders.push(handshake(tcp).await);
        }
        run(
            "direct to twin",
            senders,
            total,
            "/s/sbx/stripe/v1/customers",
            &twin_addr.to_string(),
        )
        .await
    };
    let proxied = {
        let mut senders = Vec::new();
        for _ in 0..conns {
            let mut tcp = TcpStream::connect(proxy_addr).await.expect("connect proxy");
            tcp.write_all(
                b"CONNECT api.stripe.com:443 HTTP/1.1\r\nHost: api.stripe.com:443\r\n\r\n",
            )
            .await
            .expect("connect");
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                let mut b = [0u8; 1];
                if tcp.read(&mut b).await.expect("read") == 0 {
                    panic!("proxy closed");
                }
                head.push(b[0]);
            }
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca_der.clone()).expect("root");
            let config = rustls::ClientConfig::builder()
                .with_root_certificates(roots)
                .with_no_client_auth();
            let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
                .connect(ServerName::try_from("api.stripe.com").expect("name"), tcp)
                .await
                .expect("tls");
            senders.push(handshake(tls).await);
        }
        run(
            "through veris",
            senders,
            total,
            "/v1/customers",
            "api.stripe.com",
        )
        .await
    };
    println!(
        "ratio: throughput through veris / direct = {:.2}; p50 latency through veris / direct = {:.2}",
        proxied.0 / direct.0,
        proxied.1.as_secs_f64() / direct.1.as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

async fn handshake<IO>(io: IO) -> Sender
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    sender
}

/// Sends `total` GETs spread over the senders; returns (req/s, p50).
async fn run(
    label: &str,
    senders: Vec<Sender>,
    total: usize,
    path: &str,
    host: &str,
) -> (f64, Duration) {
    let per = total / senders.len();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for mut s in senders {
        let path = path.to_string();
        let host = host.to_string();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per);
            for _ in 0..per {
                let t = Instant::now();
                let req = Request::get(&path)
                    .header("host", &host)
                    .body(Full::new(Bytes::new()))
                    .expect("req");
                let resp = s.send_request(req).await.expect("send");
                assert!(resp.status().is_success(), "status {}", resp.status());
                resp.into_body().collect().await.expect("body");
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.expect("task"));
    }
    let elapsed = started.elapsed();
    lat.sort();
    let rps = lat.len() as f64 / elapsed.as_secs_f64();
    let p = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    println!(
        "{label:>15}: {rps:>9.0} req/s   p50 {:>8.1?}   p99 {:>8.1?}   ({} requests in {:.2?})",
        p(0.50),
        p(0.99),
        lat.len(),
        elapsed
    );
    (rps, p(0.50))
}
