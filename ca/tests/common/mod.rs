//! Helpers shared by the integration tests: scratch dirs and external-tool gating.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A fresh, empty directory unique to this test (removed on drop).
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("veris-ca-it-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// True when `tool` runs; otherwise prints SKIP (or panics under VERIS_REQUIRE_ALL=1).
pub fn have_tool(tool: &str, probe_arg: &str) -> bool {
    let ok = Command::new(tool)
        .arg(probe_arg)
        .output()
        .map(|o| o.status.success() || !o.stdout.is_empty() || !o.stderr.is_empty())
        .unwrap_or(false);
    if !ok {
        if std::env::var("VERIS_REQUIRE_ALL").as_deref() == Ok("1") {
            panic!("{tool} is required (VERIS_REQUIRE_ALL=1) but not runnable");
        }
        println!("SKIP: {tool} not found");
        record_skip(&format!("{tool} not found"));
    }
    ok
}

/// A command with the machine's CA/proxy variables cleared so the test decides trust itself.
pub fn clean_command(tool: &str) -> Command {
    let mut c = Command::new(tool);
    for v in [
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "JAVA_TOOL_OPTIONS",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        c.env_remove(v);
    }
    c
}

/// Picks the leaf from the Issuer by SNI, or by the IP the client dialled when it sent none.
#[derive(Debug)]
struct Resolver(std::sync::Arc<veris_ca::Issuer>);

impl rustls::server::ResolvesServerCert for Resolver {
    fn resolve(
        &self,
        hello: rustls::server::ClientHello<'_>,
    ) -> Option<std::sync::Arc<rustls::sign::CertifiedKey>> {
        self.0
            .certified_key(hello.server_name().unwrap_or("127.0.0.1"))
            .ok()
    }
}

/// Serves `hello` over TLS with leaves from `issuer` on 127.0.0.1:0; returns the port.
pub async fn serve_hello(issuer: std::sync::Arc<veris_ca::Issuer>) -> u16 {
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_cert_resolver(Arc::new(Resolver(issuer)));
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = tls
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
                    )
                    .await;
                let _ = tls.shutdown().await;
            });
        }
    });
    port
}

/// Appends `<test binary>::<test>: <why>` to the file `VERIS_SKIP_LOG` names,
/// if set: `scripts/test` ends with a summary of the tests that skipped
/// (libtest captures what a passing test prints).
pub fn record_skip(why: &str) {
    use std::io::Write as _;
    let Some(log) = std::env::var_os("VERIS_SKIP_LOG") else {
        return;
    };
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let line = format!("{}::{test}: {why}\n", env!("CARGO_CRATE_NAME"));
    // One write on an O_APPEND file: lines of parallel tests do not mix.
    let _ = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(log)
        .and_then(|mut f| f.write_all(line.as_bytes()));
}

/// The names these tests mint leaves for, as a CA's name constraints.
pub fn scope() -> veris_ca::Scope {
    veris_ca::Scope::of(&[
        "example.com",
        "example",
        "bench.example",
        "api.stripe.com",
        "www.googleapis.com",
        "localhost",
        "127.0.0.0/8",
        "10.0.0.0/8",
        "::1",
        "2001:db8::/32",
    ])
    .expect("test scope")
}
