//! `veris demo`: the whole product offline in one command. Starts the built-in
//! twin and the proxy on loopback, makes real HTTPS requests through the proxy
//! the way a client in a sandbox would (a rustls client that trusts only the
//! generated CA), then prints the receipt and checks it.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use veris_receipt::receipt::Requirement;

use crate::receipt_cmd::report;
use crate::stack::{Confinement, Role, ServeArgs, Stack};

#[derive(Args, Debug)]
pub struct DemoArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
}

pub async fn demo(mut args: DemoArgs) -> Result<u8> {
    // A throwaway state dir unless one is named, so the demo leaves nothing behind.
    let temp =
        if args.serve.proxy.state_dir.is_none() && std::env::var_os("VERIS_STATE_DIR").is_none() {
            let dir = std::env::temp_dir().join(format!("veris-demo-{}", crate::random_hex(6)?));
            args.serve.proxy.state_dir = Some(dir.clone());
            Some(dir)
        } else {
            None
        };
    let result = demo_in(&args.serve).await;
    if let Some(dir) = temp {
        let _ = std::fs::remove_dir_all(dir);
    }
    result
}

async fn demo_in(serve: &ServeArgs) -> Result<u8> {
    let stack = Stack::start(serve, "127.0.0.1:0", Role::Run, Confinement::None).await?;
    crate::outln!(
        "veris demo: twin {} (sandbox {}), proxy {}",
        stack.twin_base,
        stack.identity.sandbox_id,
        stack.proxy_url
    );
    crate::outln!(
        "client: rustls trusting only the veris CA ({})\n",
        stack.trust.ca_pem.display()
    );
    let client = Client {
        proxy: stack.proxy_addr,
        ca: stack.ca.cert_der().clone(),
    };
    let outcome = calls(&client).await;
    let finished = stack.finish().await?;
    let (read, options) = crate::run::finished_receipt(&finished)?;
    outcome?;

    let reqs = vec![
        Requirement::parse_request("stripe POST /v1/customers")?,
        Requirement::parse_request("stripe POST /v1/charges")?,
        Requirement::parse_service("stripe:3")?,
        Requirement::parse_service("google-calendar:1")?,
    ];
    let report = report(&read, &options, &reqs, false);
    crate::outln!();
    crate::out!("{}", report.text);
    crate::outln!(
        "\nYour own code: `veris run -- CMD` (e.g. `veris run -- curl https://api.stripe.com/v1/charges -d amount=1`)."
    );
    crate::outln!(
        "It runs CMD isolated: a network namespace of its own where every connection, DNS query"
    );
    crate::outln!(
        "and QUIC packet goes to veris whatever the client does, with no capability to undo it"
    );
    crate::outln!(
        "(`interception: isolated`). Without user namespaces it falls back to the proxy variables"
    );
    crate::outln!(
        "with TCP confined to the proxy by Landlock, and says so; --isolate makes that an error."
    );
    Ok(report.exit_code)
}

async fn calls(client: &Client) -> Result<()> {
    let (status, customer) = client
        .call(
            "api.stripe.com",
            "POST",
            "/v1/customers",
            Some("email=ada%40example.com&name=Ada+Lovelace"),
        )
        .await?;
    let customer_id = id_of(&customer)?;
    crate::outln!("  POST https://api.stripe.com/v1/customers -> {status} ({customer_id})");
    let form = format!("amount=2000&currency=usd&customer={customer_id}");
    let (status, charge) = client
        .call("api.stripe.com", "POST", "/v1/charges", Some(&form))
        .await?;
    let charge_id = id_of(&charge)?;
    crate::outln!(
        "  POST https://api.stripe.com/v1/charges -> {status} ({charge_id}, amount {})",
        charge["amount"]
    );
    let path = format!("/v1/charges/{charge_id}");
    let (status, read_back) = client.call("api.stripe.com", "GET", &path, None).await?;
    if read_back["id"] != charge["id"] {
        bail!(
            "the charge read back ({}) is not the one created ({charge_id})",
            read_back["id"]
        );
    }
    crate::outln!("  GET  https://api.stripe.com{path} -> {status} (same charge)");
    let path = "/calendar/v3/calendars/primary/events";
    let (status, events) = client.call("www.googleapis.com", "GET", path, None).await?;
    let n = events["items"].as_array().map(|a| a.len()).unwrap_or(0);
    crate::outln!("  GET  https://www.googleapis.com{path} -> {status} ({n} events)");
    Ok(())
}

fn id_of(v: &Value) -> Result<String> {
    v["id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("the twin's answer has no id: {v}"))
}

/// A minimal HTTPS client that goes through the proxy with CONNECT.
struct Client {
    proxy: SocketAddr,
    ca: CertificateDer<'static>,
}

impl Client {
    async fn call(
        &self,
        host: &str,
        method: &str,
        path: &str,
        form: Option<&str>,
    ) -> Result<(u16, Value)> {
        let mut tcp = TcpStream::connect(self.proxy)
            .await
            .context("connecting to the proxy")?;
        tcp.write_all(
            format!("CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n").as_bytes(),
        )
        .await?;
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            if tcp.read(&mut byte).await? == 0 || head.len() > 8192 {
                bail!("the proxy closed the CONNECT");
            }
            head.push(byte[0]);
        }
        if !head.starts_with(b"HTTP/1.1 200") {
            bail!(
                "CONNECT refused: {}",
                String::from_utf8_lossy(&head).lines().next().unwrap_or("")
            );
        }
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.clone())?;
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = ServerName::try_from(host.to_string())?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .with_context(|| format!("TLS to {host} through the proxy"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(conn);
        let mut req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", host)
            .header(
                "user-agent",
                concat!("veris-demo/", env!("CARGO_PKG_VERSION")),
            )
            .header("authorization", "Bearer sk_test_demo0000000000000000");
        if form.is_some() {
            req = req.header("content-type", "application/x-www-form-urlencoded");
        }
        let body = Full::new(Bytes::from(form.unwrap_or("").to_string()));
        let resp = sender.send_request(req.body(body)?).await?;
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await?.to_bytes();
        let json: Value = serde_json::from_slice(&bytes)
            .with_context(|| format!("{method} {host}{path} answered {status} with non-JSON"))?;
        if !(200..300).contains(&status) {
            bail!("{method} https://{host}{path} -> {status}: {json}");
        }
        Ok((status, json))
    }
}
