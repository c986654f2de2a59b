//! The load generator: hyper 1 client connections over tokio-rustls, driven by
//! tokio tasks in this process.
//!
//! An [`Endpoint`] is one way to reach the twin's `GET /v1/customers` (an
//! empty list from the fixtures: a small JSON body, and no object created):
//! straight to the twin over TLS, or through a proxy — TCP to the proxy,
//! `CONNECT api.stripe.com:443`, TLS with SNI `api.stripe.com` verified
//! against that proxy's CA, then the request with `Host: api.stripe.com`.
//! The twin receives the same request either way (the proxies rewrite it to
//! `/s/{sandbox}/stripe/v1/customers`, which the direct path asks for itself).
//!
//! Each [`Scenario`] run is bounded by a request count and a deadline, records
//! every latency (the request's, plus the dial for new-connection requests),
//! and counts answers other than 200 and errors.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// The vendor host every proxied request names.
pub const VENDOR_HOST: &str = "api.stripe.com";
/// The vendor path; the twin answers it from its fixtures with an empty list.
pub const VENDOR_PATH: &str = "/v1/customers";
/// The sandbox the twin is addressed with (veris's default with a named twin).
pub const SANDBOX: &str = "sbx_local";

/// A dial (TCP, CONNECT, TLS) or a request that takes longer has failed:
/// no run waits on a stuck peer for more than its time limit plus this.
const STUCK: Duration = Duration::from_secs(10);

type Body = Empty<Bytes>;

/// The four load shapes of the issue, in the order they are run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// HTTP/1.1 keep-alive, 16 connections, each with one request in flight.
    KeepAlive,
    /// 16 workers; each request is a new TCP connection, CONNECT, TLS
    /// handshake, one HTTP/1.1 request, close.
    NewConnection,
    /// One HTTP/2 connection (ALPN h2) with 16 concurrent streams.
    Http2,
    /// One keep-alive HTTP/1.1 connection, one request at a time.
    Latency,
}

impl Scenario {
    pub const ALL: [Scenario; 4] = [
        Scenario::KeepAlive,
        Scenario::NewConnection,
        Scenario::Http2,
        Scenario::Latency,
    ];

    /// The name `--only` takes.
    pub fn key(self) -> &'static str {
        match self {
            Scenario::KeepAlive => "keep-alive",
            Scenario::NewConnection => "new-conn",
            Scenario::Http2 => "h2",
            Scenario::Latency => "c1",
        }
    }

    /// The row title in the tables.
    pub fn title(self) -> &'static str {
        match self {
            Scenario::KeepAlive => "keep-alive HTTP/1.1, 16 conns",
            Scenario::NewConnection => "new connection per request, 16 workers",
            Scenario::Http2 => "HTTP/2, 16 streams on 1 conn",
            Scenario::Latency => "c=1 keep-alive latency",
        }
    }

    pub fn from_key(key: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|s| s.key() == key)
    }

    /// Requests in flight at once.
    pub fn concurrency(self) -> usize {
        match self {
            Scenario::Latency => 1,
            _ => 16,
        }
    }
}

/// What one run measured.
#[derive(Debug, Default)]
pub struct RunResult {
    /// Requests answered (any status).
    pub answered: u64,
    /// Answers other than 200.
    pub not_ok: u64,
    /// Requests that failed (dial, CONNECT, TLS, HTTP); the first one's message.
    pub errors: u64,
    pub first_error: Option<String>,
    pub elapsed: Duration,
    /// Every answered request's latency, sorted.
    pub latencies: Vec<Duration>,
}

impl RunResult {
    pub fn per_second(&self) -> f64 {
        self.answered as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn percentile(&self, p: f64) -> Option<Duration> {
        if self.latencies.is_empty() {
            return None;
        }
        let rank = ((p / 100.0) * self.latencies.len() as f64).ceil() as usize;
        Some(self.latencies[rank.clamp(1, self.latencies.len()) - 1])
    }

    fn merge(&mut self, other: Tally) {
        self.answered += other.answered;
        self.not_ok += other.not_ok;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.latencies.extend(other.latencies);
    }
}

/// One worker's counts, merged into the [`RunResult`] at the end.
#[derive(Default)]
struct Tally {
    answered: u64,
    not_ok: u64,
    errors: u64,
    first_error: Option<String>,
    latencies: Vec<Duration>,
}

impl Tally {
    fn answer(&mut self, status: StatusCode, started: Instant) {
        self.latencies.push(started.elapsed());
        self.answered += 1;
        if status != StatusCode::OK {
            self.not_ok += 1;
        }
    }

    fn error(&mut self, e: anyhow::Error) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(format!("{e:#}"));
        }
    }
}

/// How requests reach the twin.
#[derive(Clone, Debug)]
enum Via {
    /// TLS straight to the twin at this address.
    Direct(SocketAddr),
    /// CONNECT through the proxy at this address.
    Proxy(SocketAddr),
    /// SOCKS5 through the gateway at this address, as this sandbox
    /// (username, password).
    Socks5(SocketAddr, Arc<(String, String)>),
}

/// One path to the twin, with the TLS settings of its trust anchor.
#[derive(Clone)]
pub struct Endpoint {
    via: Via,
    /// ALPN `http/1.1` only, and `h2` only: the scenario picks the protocol.
    h1: TlsConnector,
    h2: TlsConnector,
    server_name: ServerName<'static>,
    /// `Host` (HTTP/1.1) and `:authority` (HTTP/2).
    authority: String,
    path: String,
}

impl Endpoint {
    /// Straight to a TLS twin whose certificate names 127.0.0.1 and chains to `ca`.
    /// `resume`: new connections resume TLS sessions (else full handshakes).
    pub fn direct(twin: SocketAddr, ca: &Path, resume: bool) -> Result<Endpoint> {
        Ok(Endpoint {
            via: Via::Direct(twin),
            h1: connector(ca, b"http/1.1", resume)?,
            h2: connector(ca, b"h2", resume)?,
            server_name: ServerName::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST).into()),
            authority: twin.to_string(),
            path: format!("/s/{SANDBOX}/stripe{VENDOR_PATH}"),
        })
    }

    /// Through an intercepting proxy whose leaves chain to `ca`.
    pub fn proxied(proxy: SocketAddr, ca: &Path, resume: bool) -> Result<Endpoint> {
        Ok(Endpoint {
            via: Via::Proxy(proxy),
            h1: connector(ca, b"http/1.1", resume)?,
            h2: connector(ca, b"h2", resume)?,
            server_name: ServerName::try_from(VENDOR_HOST)?.to_owned(),
            authority: VENDOR_HOST.to_string(),
            path: VENDOR_PATH.to_string(),
        })
    }

    /// This endpoint's TLS settings, reached through the gateway at
    /// `gateway` by SOCKS5 as sandbox `username` (`crate::gateway`).
    pub fn via_socks5(&self, gateway: SocketAddr, username: &str, password: &str) -> Endpoint {
        Endpoint {
            via: Via::Socks5(
                gateway,
                Arc::new((username.to_string(), password.to_string())),
            ),
            ..self.clone()
        }
    }

    /// TCP, CONNECT when proxied (SOCKS5 through a gateway), then the TLS handshake.
    pub async fn dial(&self, h2: bool) -> Result<TlsStream<TcpStream>> {
        tokio::time::timeout(STUCK, self.dial_now(h2))
            .await
            .map_err(|_| anyhow!("no TLS connection after {STUCK:?}"))?
    }

    async fn dial_now(&self, h2: bool) -> Result<TlsStream<TcpStream>> {
        let (Via::Direct(addr) | Via::Proxy(addr) | Via::Socks5(addr, _)) = self.via;
        let mut tcp = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        tcp.set_nodelay(true)?;
        match &self.via {
            Via::Direct(_) => {}
            Via::Proxy(proxy) => {
                let target = format!("{VENDOR_HOST}:443");
                veris_admin_client::connect_tunnel(&mut tcp, &proxy.to_string(), &target).await?;
            }
            Via::Socks5(_, login) => {
                crate::gateway::socks5_connect(&mut tcp, &login.0, &login.1, VENDOR_HOST, 443)
                    .await?;
            }
        }
        let tls = if h2 { &self.h2 } else { &self.h1 };
        let stream = tls
            .connect(self.server_name.clone(), tcp)
            .await
            .context("TLS handshake")?;
        if h2 && stream.get_ref().1.alpn_protocol() != Some(b"h2") {
            bail!("the server did not negotiate h2 by ALPN");
        }
        Ok(stream)
    }

    async fn h1(&self) -> Result<hyper::client::conn::http1::SendRequest<Body>> {
        let io = TokioIo::new(self.dial(false).await?);
        let (sender, conn) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    async fn h2(&self) -> Result<hyper::client::conn::http2::SendRequest<Body>> {
        let io = TokioIo::new(self.dial(true).await?);
        let (sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    fn request(&self, h2: bool) -> Result<Request<Body>> {
        let mut builder = if h2 {
            Request::get(format!("https://{}{}", self.authority, self.path))
        } else {
            Request::get(&self.path).header(http::header::HOST, &self.authority)
        };
        if let Via::Direct(_) = self.via {
            // What a proxy adds on its way to the twin, so the twin does
            // the same work on every path.
            builder = builder
                .header("x-veris-original-host", VENDOR_HOST)
                .header("x-veris-service", "stripe")
                .header("x-veris-sandbox", SANDBOX);
        }
        Ok(builder.body(Empty::new())?)
    }

    /// One request on an HTTP/1.1 connection: its status once the body is read.
    async fn get_h1(
        &self,
        sender: &mut hyper::client::conn::http1::SendRequest<Body>,
    ) -> Result<StatusCode> {
        let exchange = async {
            sender.ready().await?;
            let res = sender.send_request(self.request(false)?).await?;
            let status = res.status();
            res.into_body().collect().await?;
            Ok(status)
        };
        tokio::time::timeout(STUCK, exchange)
            .await
            .map_err(|_| anyhow!("no answer after {STUCK:?}"))?
    }

    async fn get_h2(
        &self,
        sender: &mut hyper::client::conn::http2::SendRequest<Body>,
    ) -> Result<StatusCode> {
        let exchange = async {
            sender.ready().await?;
            let res = sender.send_request(self.request(true)?).await?;
            let status = res.status();
            res.into_body().collect().await?;
            Ok(status)
        };
        tokio::time::timeout(STUCK, exchange)
            .await
            .map_err(|_| anyhow!("no answer after {STUCK:?}"))?
    }

    /// A new keep-alive connection and its first request, whose answer must
    /// be the twin's (an empty customer list), not a 200 the proxy made up.
    /// Bounded like every dial and request.
    pub async fn first_answer(&self) -> Result<hyper::client::conn::http1::SendRequest<Body>> {
        let mut h1 = self.h1().await?;
        let exchange = async {
            h1.ready().await?;
            let res = h1.send_request(self.request(false)?).await?;
            Ok::<_, anyhow::Error>(res.into_body().collect().await?.to_bytes())
        };
        let body = tokio::time::timeout(STUCK, exchange)
            .await
            .map_err(|_| anyhow!("no answer after {STUCK:?}"))??;
        let list = b"\"object\":\"list\"";
        if !body.windows(list.len()).any(|w| w == list) {
            bail!(
                "the answer is not the twin's customer list: {:?}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            );
        }
        Ok(h1)
    }

    /// A few requests that mint the proxy's leaf and fill its upstream pool,
    /// so the first measured run does not pay for them.
    pub async fn warm_up(&self) -> Result<()> {
        let mut h1 = self.first_answer().await?;
        let mut h2 = self.h2().await?;
        for _ in 0..20 {
            let status = self.get_h1(&mut h1).await?;
            if status != StatusCode::OK {
                bail!("warm-up request answered {status}");
            }
            self.get_h2(&mut h2).await?;
        }
        Ok(())
    }

    /// Runs `scenario` until `requests` are answered or `limit` has passed.
    /// Connections a scenario keeps open are dialed before the clock starts;
    /// `started` is called right then (the caller's CPU snapshot).
    pub async fn run(
        &self,
        scenario: Scenario,
        requests: u64,
        limit: Duration,
        started: impl FnOnce(),
    ) -> Result<RunResult> {
        let budget = Arc::new(AtomicI64::new(requests as i64));
        let mut tasks = tokio::task::JoinSet::new();
        let workers = scenario.concurrency();
        let clock;
        match scenario {
            Scenario::KeepAlive | Scenario::Latency => {
                let conns = vec![self.clone(); workers];
                return keep_alive(&conns, requests, limit, started).await;
            }
            Scenario::NewConnection => {
                started();
                clock = Instant::now();
                let deadline = clock + limit;
                for _ in 0..workers {
                    let (this, budget) = (self.clone(), budget.clone());
                    tasks.spawn(async move {
                        let mut tally = Tally::default();
                        while take(&budget, deadline) {
                            let t = Instant::now();
                            let once = async {
                                let mut sender = this.h1().await?;
                                this.get_h1(&mut sender).await
                            };
                            match once.await {
                                Ok(status) => tally.answer(status, t),
                                Err(e) => tally.error(e),
                            }
                        }
                        tally
                    });
                }
            }
            Scenario::Http2 => {
                let sender = self.h2().await.context("opening the HTTP/2 connection")?;
                started();
                clock = Instant::now();
                let deadline = clock + limit;
                for _ in 0..workers {
                    let (this, budget, mut sender) = (self.clone(), budget.clone(), sender.clone());
                    tasks.spawn(async move {
                        let mut tally = Tally::default();
                        while take(&budget, deadline) {
                            let t = Instant::now();
                            match this.get_h2(&mut sender).await {
                                Ok(status) => tally.answer(status, t),
                                Err(e) => {
                                    tally.error(e);
                                    if sender.is_closed() {
                                        break;
                                    }
                                }
                            }
                        }
                        tally
                    });
                }
            }
        }
        collect(tasks, clock).await
    }

    /// Opens `n` TLS connections (CONNECT and handshake, then nothing), at
    /// most 32 handshakes at a time, and returns them held open.
    pub async fn hold_idle(&self, n: usize) -> Result<Vec<TlsStream<TcpStream>>> {
        let mut held = Vec::with_capacity(n);
        let mut pending = tokio::task::JoinSet::new();
        let mut started = 0;
        while held.len() < n {
            while started < n && pending.len() < 32 {
                let this = self.clone();
                pending.spawn(async move { this.dial(false).await });
                started += 1;
            }
            match pending.join_next().await {
                Some(done) => held.push(done.map_err(|e| anyhow!("a dial task panicked: {e}"))??),
                None => break,
            }
        }
        Ok(held)
    }
}

/// HTTP/1.1 keep-alive: one connection per entry of `conns` (one endpoint
/// repeated, or one per gateway sandbox), each with one request in flight,
/// until `requests` are answered or `limit` has passed. The connections are
/// dialed before the clock starts; `started` is called right then.
pub async fn keep_alive(
    conns: &[Endpoint],
    requests: u64,
    limit: Duration,
    started: impl FnOnce(),
) -> Result<RunResult> {
    keep_alive_at(conns, requests, limit, None, started).await
}

/// [`keep_alive`], open loop when `rate` is set: requests go out on a fixed
/// schedule of `rate` a second in all (each connection its share,
/// staggered), whatever the answers' pace, and a request's latency counts
/// from when it was due, so a stall shows in the percentiles instead of
/// slowing the load (no coordinated omission).
pub async fn keep_alive_at(
    conns: &[Endpoint],
    requests: u64,
    limit: Duration,
    rate: Option<f64>,
    started: impl FnOnce(),
) -> Result<RunResult> {
    let budget = Arc::new(AtomicI64::new(requests as i64));
    let mut senders = Vec::with_capacity(conns.len());
    for endpoint in conns {
        let sender = endpoint
            .h1()
            .await
            .context("opening a keep-alive connection")?;
        senders.push((endpoint.clone(), sender));
    }
    started();
    let clock = Instant::now();
    let deadline = clock + limit;
    let mut tasks = tokio::task::JoinSet::new();
    // Per connection: the time between its requests (open loop).
    let every = rate.map(|r| Duration::from_secs_f64(senders.len() as f64 / r.max(1e-3)));
    let count = senders.len() as u32;
    for (i, (this, mut sender)) in senders.into_iter().enumerate() {
        let budget = budget.clone();
        tasks.spawn(async move {
            let mut tally = Tally::default();
            let mut due = every.map(|e| clock + e * i as u32 / count);
            while take(&budget, deadline) {
                let t = match (&mut due, every) {
                    (Some(d), Some(e)) => {
                        if *d >= deadline {
                            break;
                        }
                        tokio::time::sleep_until((*d).into()).await;
                        let t = *d;
                        *d += e;
                        t
                    }
                    _ => Instant::now(),
                };
                match this.get_h1(&mut sender).await {
                    Ok(status) => tally.answer(status, t),
                    Err(e) => {
                        tally.error(e);
                        // The connection is likely gone: dial again.
                        match this.h1().await {
                            Ok(s) => sender = s,
                            Err(e) => {
                                tally.error(e);
                                break;
                            }
                        }
                    }
                }
            }
            tally
        });
    }
    collect(tasks, clock).await
}

/// Every task's tally, and the wall time since `clock`.
async fn collect(mut tasks: tokio::task::JoinSet<Tally>, clock: Instant) -> Result<RunResult> {
    let mut result = RunResult::default();
    while let Some(tally) = tasks.join_next().await {
        result.merge(tally.map_err(|e| anyhow!("a load task panicked: {e}"))?);
    }
    result.elapsed = clock.elapsed();
    result.latencies.sort_unstable();
    Ok(result)
}

/// Takes one request from the budget unless it is spent or the deadline passed.
fn take(budget: &AtomicI64, deadline: Instant) -> bool {
    Instant::now() < deadline && budget.fetch_sub(1, Ordering::Relaxed) > 0
}

/// A TLS client trusting only the certificates in `ca`, offering one ALPN protocol.
fn connector(ca: &Path, alpn: &[u8], resume: bool) -> Result<TlsConnector> {
    let mut roots = RootCertStore::empty();
    for cert in
        CertificateDer::pem_file_iter(ca).with_context(|| format!("reading {}", ca.display()))?
    {
        roots.add(cert.with_context(|| format!("parsing {}", ca.display()))?)?;
    }
    let mut config = ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    // By default every new connection pays a full handshake: resumption
    // hides the cost of the leaf and its signature, and many SDKs (Python's,
    // Go's) do not resume. `--resume` keeps rustls's in-memory session cache
    // (one per ALPN protocol), as Node's agents and curl do.
    if !resume {
        config.resumption = rustls::client::Resumption::disabled();
    }
    Ok(TlsConnector::from(Arc::new(config)))
}
