//! Reliability scenarios against a real `veris serve` (built-in twin), each
//! printed as a Markdown table row (scenario | what was done | outcome |
//! figures) ready for RELIABILITY.md. Prints figures; asserts nothing, but an
//! outcome that is not what veris promises says so in the row (`MISMATCH`,
//! `LOST`, `DIED`, …) and the program exits 1.
//!
//! ```sh
//! cargo build --release && cargo run --release --example reliability -- [--quick] [--seed N] [SCENARIO...]
//! ```
//!
//! Scenarios (default: all, in this order): `load`, `kill9`, `faults`,
//! `badinput`, `slowloris`, `bigledger`, `fuzz`. `--quick` divides the counts
//! by 10 (and shortens the client timeouts) for a smoke run. The binary is
//! `target/release/veris`, or `$VERIS_BIN`.
//!
//! All traffic goes to loopback: the proxy (`--listen 127.0.0.1:0`), its admin
//! API and its built-in twin. The client is in-process (hyper over
//! tokio-rustls, trusting only the veris CA of the run), so no ambient
//! `SSL_CERT_FILE`-style variable reaches it; `veris serve` itself starts with
//! a cleared environment. Every loop is bounded in count and time, every
//! scenario has a deadline, and the serve process groups, the tmpfs mount and
//! the temp dirs are removed on exit, on a panic and on Ctrl-C.

// Prints figures, not veris: a failed unwrap or expect ends the run with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

const SCENARIOS: [&str; 7] = [
    "load",
    "kill9",
    "faults",
    "badinput",
    "slowloris",
    "bigledger",
    "fuzz",
];

/// The vendor call every scenario makes: the built-in twin answers it 200.
const HOST: &str = "api.stripe.com";
const PATH: &str = "/v1/customers";
const FORM: &[u8] = b"email=reliability%40example.com&name=Reliability";

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;
type Tls = tokio_rustls::client::TlsStream<TcpStream>;

fn main() -> ExitCode {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        cleanup_all();
        std::process::exit(101);
    }));
    let opts = match Opts::parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "{e}\nusage: reliability [--quick] [--seed N] [{}]...",
                SCENARIOS.join("|")
            );
            return ExitCode::from(2);
        }
    };
    raise_open_file_limit();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let ok = rt.block_on(run(opts));
    drop(rt);
    cleanup_all();
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

// ---------------------------------------------------------------- options

struct Opts {
    quick: bool,
    seed: u64,
    scenarios: Vec<String>,
}

impl Opts {
    fn parse(args: impl Iterator<Item = String>) -> Result<Opts> {
        let mut o = Opts {
            quick: false,
            seed: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1,
            scenarios: Vec::new(),
        };
        let mut args = args;
        while let Some(a) = args.next() {
            match a.as_str() {
                "--quick" => o.quick = true,
                "--seed" => {
                    o.seed = args
                        .next()
                        .and_then(|s| s.parse::<u64>().ok())
                        .ok_or_else(|| anyhow!("--seed takes a number"))?
                        | 1
                }
                s if SCENARIOS.contains(&s) => o.scenarios.push(s.to_string()),
                s => bail!("unknown argument {s:?}"),
            }
        }
        if o.scenarios.is_empty() {
            o.scenarios = SCENARIOS.iter().map(|s| s.to_string()).collect();
        }
        Ok(o)
    }
}

/// What every scenario needs.
struct Ctx {
    bin: PathBuf,
    /// 1, or 10 under `--quick`.
    scale: usize,
    quick: bool,
    rng: Mutex<Rng>,
}

impl Ctx {
    fn n(&self, full: usize) -> usize {
        (full / self.scale).max(1)
    }
    fn rand(&self) -> u64 {
        self.rng.lock().unwrap_or_else(|e| e.into_inner()).next()
    }
}

/// xorshift64*: kill points and garbage bytes, reproducible with `--seed`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| (self.next() >> 24) as u8).collect()
    }
}

// ---------------------------------------------------------------- cleanup

/// What must not outlive the program: serve process groups, the tmpfs
/// mount, temp dirs.
#[derive(Default)]
struct Cleanup {
    pgids: Vec<i32>,
    mounts: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
}

static CLEANUP: Mutex<Option<Cleanup>> = Mutex::new(None);

fn with_cleanup(f: impl FnOnce(&mut Cleanup)) {
    let mut g = CLEANUP.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(Cleanup::default));
}

fn cleanup_all() {
    let c = CLEANUP
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .unwrap_or_default();
    for pg in c.pgids {
        kill_group(pg);
    }
    for m in c.mounts {
        let _ = Command::new("umount").arg("-l").arg(&m).status();
    }
    for d in c.dirs {
        if std::env::var_os("VERIS_KEEP_TEMP").is_none() {
            let _ = std::fs::remove_dir_all(&d);
        }
    }
}

fn kill_group(pgid: i32) {
    if let Some(pid) = rustix::process::Pid::from_raw(pgid) {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

fn raise_open_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let l = getrlimit(Resource::Nofile);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: l.maximum,
            maximum: l.maximum,
        },
    );
}

/// A temp dir, removed on drop (kept with `VERIS_KEEP_TEMP=1`).
struct Work {
    path: PathBuf,
}

impl Work {
    fn new(label: &str) -> Result<Work> {
        let path =
            std::env::temp_dir().join(format!("veris-reliability-{}-{label}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        with_cleanup(|c| c.dirs.push(path.clone()));
        Ok(Work { path })
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        if std::env::var_os("VERIS_KEEP_TEMP").is_none() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
        with_cleanup(|c| c.dirs.retain(|d| d != &self.path));
    }
}

/// A tmpfs mounted on `path`, unmounted on drop.
struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    fn mount(path: &Path, size: &str) -> Result<Tmpfs> {
        std::fs::create_dir_all(path)?;
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(path)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            bail!("mount -t tmpfs failed");
        }
        with_cleanup(|c| c.mounts.push(path.to_path_buf()));
        Ok(Tmpfs {
            path: path.to_path_buf(),
        })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        with_cleanup(|c| c.mounts.retain(|m| m != &self.path));
    }
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

// ---------------------------------------------------------------- serve

/// A `veris serve` in a process group of its own, killed on drop.
struct Serve {
    child: Child,
    pid: u32,
    stderr_path: PathBuf,
    proxy: SocketAddr,
    admin: Option<SocketAddr>,
    twin: String,
    sandbox: String,
    tls: Arc<rustls::ClientConfig>,
    tls_h2: Arc<rustls::ClientConfig>,
    token: String,
}

static SERVE_COUNT: AtomicUsize = AtomicUsize::new(0);

impl Serve {
    async fn start(ctx: &Ctx, work: &Path, state: &Path, extra: &[&str]) -> Result<Serve> {
        let n = SERVE_COUNT.fetch_add(1, Ordering::Relaxed);
        let ready_path = work.join(format!("ready-{n}.json"));
        let stderr_path = work.join(format!("serve-{n}.stderr"));
        let mut cmd = Command::new(&ctx.bin);
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--state-dir",
        ])
        .arg(state)
        .arg("--ready-file")
        .arg(&ready_path)
        .args(extra)
        // A cleared environment: no ambient proxy or CA variable, no ~/.veris.
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", work)
        .env("LANG", "C.UTF-8")
        .env("VERIS_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path)?)
        .process_group(0);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", ctx.bin.display()))?;
        let pid = child.id();
        with_cleanup(|c| c.pgids.push(pid as i32));
        let started = Instant::now();
        let ready: Value = loop {
            if let Some(status) = child.try_wait()? {
                with_cleanup(|c| c.pgids.retain(|p| *p != pid as i32));
                bail!(
                    "veris serve exited at start ({status}): {}",
                    tail(&stderr_path, 600)
                );
            }
            if let Some(v) = std::fs::read_to_string(&ready_path)
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
            {
                break v;
            }
            if started.elapsed() > Duration::from_secs(30) {
                kill_group(pid as i32);
                let _ = child.wait();
                bail!("veris serve wrote no ready file within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let addr = |key: &str| -> Option<SocketAddr> {
            ready[key]
                .as_str()?
                .trim_start_matches("http://")
                .parse()
                .ok()
        };
        let proxy = addr("proxy_url").ok_or_else(|| anyhow!("no proxy_url in {ready}"))?;
        let ca_path = PathBuf::from(
            ready["ca"]
                .as_str()
                .ok_or_else(|| anyhow!("no ca in {ready}"))?,
        );
        let ca = CertificateDer::from_pem_file(&ca_path)
            .map_err(|e| anyhow!("reading the veris CA {}: {e:?}", ca_path.display()))?;
        let token = std::fs::read_to_string(state.join("admin.token"))
            .unwrap_or_default()
            .trim()
            .to_string();
        Ok(Serve {
            child,
            pid,
            stderr_path,
            proxy,
            admin: addr("admin"),
            twin: ready["twin"].as_str().unwrap_or_default().to_string(),
            sandbox: ready["sandbox_id"]
                .as_str()
                .unwrap_or("sbx_local")
                .to_string(),
            tls: tls_config(&ca, &[b"http/1.1"]),
            tls_h2: tls_config(&ca, &[b"h2"]),
            token,
        })
    }

    fn twin_addr(&self) -> Option<SocketAddr> {
        self.twin.trim_start_matches("http://").parse().ok()
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// `kill -9` of the whole process group.
    fn kill9(&mut self) {
        kill_group(self.pid as i32);
        let _ = self.child.wait();
        with_cleanup(|c| c.pgids.retain(|p| *p != self.pid as i32));
    }

    /// SIGTERM (final seal, drain); SIGKILL after 30 s. What happened.
    async fn stop(&mut self) -> String {
        if let Ok(Some(s)) = self.child.try_wait() {
            return format!("had already exited ({s})");
        }
        if let Some(pid) = rustix::process::Pid::from_raw(self.pid as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(s)) = self.child.try_wait() {
                with_cleanup(|c| c.pgids.retain(|p| *p != self.pid as i32));
                return format!("exited {s}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.kill9();
        "did not stop within 30 s of SIGTERM (killed)".into()
    }

    fn kb(&self, field: &str) -> u64 {
        proc_kb(self.pid, field).unwrap_or(0)
    }

    /// `panicked` in the log: a crash the process survived is still a bug.
    fn panics(&self) -> usize {
        std::fs::read_to_string(&self.stderr_path)
            .unwrap_or_default()
            .matches("panicked")
            .count()
    }

    /// One HTTPS POST through the proxy on a fresh connection: (status, body).
    async fn https_once(&self, query: &str) -> Result<(u16, String)> {
        tokio::time::timeout(Duration::from_secs(30), async {
            let mut s = h1(tls_tunnel(self.proxy, &self.tls).await?).await?;
            let (status, body) = post(&mut s, query).await?;
            Ok((status, String::from_utf8_lossy(&body?).into_owned()))
        })
        .await
        .map_err(|_| anyhow!("no answer within 30 s"))?
    }

    /// Rows of the twin's request log for our vendor call (tier handler).
    async fn twin_rows(&self) -> Result<u64> {
        let twin = self
            .twin_addr()
            .ok_or_else(|| anyhow!("twin URL {}", self.twin))?;
        let mut since = 0u64;
        let mut rows = 0u64;
        for _ in 0..10_000 {
            let path = format!(
                "/s/{}/stripe/veris/requests?limit=1000&order=asc&tier=handler&since_id={since}",
                self.sandbox
            );
            let (status, body) = call(twin, "GET", &path, None, Duration::from_secs(30)).await?;
            if status != 200 {
                bail!("twin log: {status} {}", String::from_utf8_lossy(&body));
            }
            let v: Value = serde_json::from_slice(&body)?;
            let page = v["requests"].as_array().cloned().unwrap_or_default();
            rows += page
                .iter()
                .filter(|r| r["path"] == PATH && r["method"] == "POST")
                .count() as u64;
            match page.last().and_then(|r| r["id"].as_u64()) {
                Some(id) if page.len() == 1000 => since = id,
                _ => return Ok(rows),
            }
        }
        bail!("twin log: more than 10,000 pages")
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill9();
        }
        with_cleanup(|c| c.pgids.retain(|p| *p != self.pid as i32));
    }
}

fn tail(path: &Path, n: usize) -> String {
    let t = std::fs::read_to_string(path).unwrap_or_default();
    let start = t.len().saturating_sub(n);
    let start = (start..t.len())
        .find(|i| t.is_char_boundary(*i))
        .unwrap_or(t.len());
    t[start..].trim().replace('\n', " / ")
}

fn proc_kb(pid: u32, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// `veris twin` in a process group of its own, killed on drop.
struct Twin {
    child: Child,
    pid: u32,
    url: String,
}

impl Twin {
    fn start(ctx: &Ctx) -> Result<Twin> {
        use std::io::BufRead;
        let mut child = Command::new(&ctx.bin)
            .args(["twin", "--listen", "127.0.0.1:0"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("VERIS_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .context("spawning veris twin")?;
        let pid = child.id();
        with_cleanup(|c| c.pgids.push(pid as i32));
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let mut twin = Twin {
            child,
            pid,
            url: String::new(),
        };
        twin.url = rx
            .recv_timeout(Duration::from_secs(20))
            .map_err(|_| anyhow!("veris twin printed no URL within 20 s"))?
            .trim()
            .to_string();
        if !twin.url.starts_with("http://127.0.0.1:") {
            bail!("veris twin printed {:?}", twin.url);
        }
        Ok(twin)
    }
}

impl Drop for Twin {
    fn drop(&mut self) {
        kill_group(self.pid as i32);
        let _ = self.child.wait();
        with_cleanup(|c| c.pgids.retain(|p| *p != self.pid as i32));
    }
}

// ---------------------------------------------------------------- clients

fn tls_config(ca: &CertificateDer<'static>, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).expect("the veris CA is a valid root");
    let mut c = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(c)
}

/// Reads a response head byte by byte (so nothing after it is consumed).
async fn read_head<R: AsyncRead + Unpin>(r: &mut R) -> Result<Vec<u8>> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 64 * 1024 {
            bail!("response head over 64 KiB");
        }
        let mut b = [0u8; 1];
        if r.read(&mut b).await? == 0 {
            bail!("closed after {} bytes of head", head.len());
        }
        head.push(b[0]);
    }
    Ok(head)
}

fn status_of(head: &[u8]) -> Option<u16> {
    let line = head.split(|b| *b == b'\n').next()?;
    let text = std::str::from_utf8(line).ok()?;
    if !text.starts_with("HTTP/") {
        return None;
    }
    text.split_whitespace().nth(1)?.parse().ok()
}

/// `CONNECT target` through the proxy, the way an `HTTPS_PROXY` client does.
async fn tunnel(proxy: SocketAddr, target: &str) -> Result<TcpStream> {
    let mut tcp = TcpStream::connect(proxy).await?;
    tcp.set_nodelay(true)?;
    tcp.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await?;
    let head = read_head(&mut tcp).await?;
    match status_of(&head) {
        Some(200) => Ok(tcp),
        _ => bail!(
            "CONNECT {target}: {}",
            String::from_utf8_lossy(&head).lines().next().unwrap_or("")
        ),
    }
}

async fn tls_tunnel(proxy: SocketAddr, cfg: &Arc<rustls::ClientConfig>) -> Result<Tls> {
    let tcp = tunnel(proxy, &format!("{HOST}:443")).await?;
    Ok(tokio_rustls::TlsConnector::from(cfg.clone())
        .connect(ServerName::try_from(HOST)?, tcp)
        .await?)
}

async fn h1<IO>(io: IO) -> Result<Sender>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// POST /v1/customers: the status as soon as the head arrives (which is when
/// veris has appended the ledger line), and the body.
async fn post(s: &mut Sender, query: &str) -> Result<(u16, Result<Bytes>)> {
    let uri = if query.is_empty() {
        PATH.to_string()
    } else {
        format!("{PATH}?{query}")
    };
    let req = http::Request::post(uri)
        .header("host", HOST)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Full::new(Bytes::from_static(FORM)))?;
    s.ready().await?;
    let resp = s.send_request(req).await?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(anyhow::Error::from);
    Ok((status, body))
}

/// A plain HTTP/1.1 call (admin API, twin): (status, body).
async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    limit: Duration,
) -> Result<(u16, Bytes)> {
    tokio::time::timeout(limit, async {
        let mut s = h1(TcpStream::connect(addr).await?).await?;
        let mut b = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", addr.to_string());
        if let Some(t) = token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        let resp = s.send_request(b.body(Full::new(Bytes::new()))?).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, body))
    })
    .await
    .map_err(|_| anyhow!("{method} {path}: no answer within {limit:?}"))?
}

// ---------------------------------------------------------------- load

struct LoadSpec {
    total: usize,
    conns: usize,
    deadline: Duration,
    /// Tag each request `?rid=<tag>-<n>` and keep the acknowledged ones.
    tag: Option<String>,
    stop: Arc<AtomicBool>,
}

#[derive(Default)]
struct LoadStats {
    ok: u64,
    other: BTreeMap<u16, u64>,
    errors: u64,
    error_sample: Option<String>,
    lat: Vec<Duration>,
    acked: Vec<String>,
    elapsed: Duration,
}

impl LoadStats {
    fn merge(&mut self, o: LoadStats) {
        self.ok += o.ok;
        for (k, v) in o.other {
            *self.other.entry(k).or_default() += v;
        }
        self.errors += o.errors;
        if self.error_sample.is_none() {
            self.error_sample = o.error_sample;
        }
        self.lat.extend(o.lat);
        self.acked.extend(o.acked);
    }
    fn pct(&mut self, q: f64) -> Duration {
        if self.lat.is_empty() {
            return Duration::ZERO;
        }
        self.lat.sort_unstable();
        self.lat[((self.lat.len() as f64 * q) as usize).min(self.lat.len() - 1)]
    }
    fn rps(&self) -> f64 {
        (self.ok + self.other.values().sum::<u64>()) as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// `spec.total` POSTs over `spec.conns` keep-alive HTTPS connections through
/// the proxy (reconnecting after an error, at most 20 errors per connection).
async fn drive_load(
    proxy: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    spec: LoadSpec,
) -> LoadStats {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let spec = Arc::new(spec);
    let mut tasks = Vec::new();
    for _ in 0..spec.conns {
        let (next, spec, tls) = (next.clone(), spec.clone(), tls.clone());
        tasks.push(tokio::spawn(async move {
            let mut st = LoadStats::default();
            let mut sender: Option<Sender> = None;
            let mut failures = 0;
            while failures < 20
                && started.elapsed() < spec.deadline
                && !spec.stop.load(Ordering::Relaxed)
            {
                if sender.is_none() {
                    let conn = match tls_tunnel(proxy, &tls).await {
                        Ok(io) => h1(io).await,
                        Err(e) => Err(e),
                    };
                    match conn {
                        Ok(s) => sender = Some(s),
                        Err(e) => {
                            st.fail(&mut failures, e);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    }
                }
                let Some(s) = sender.as_mut() else { continue };
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= spec.total {
                    break;
                }
                let query = spec
                    .tag
                    .as_ref()
                    .map(|t| format!("rid={t}-{n}"))
                    .unwrap_or_default();
                let t0 = Instant::now();
                let r = tokio::time::timeout(Duration::from_secs(60), post(s, &query)).await;
                match r {
                    Ok(Ok((status, body))) => {
                        if (200..300).contains(&status) {
                            st.ok += 1;
                            if spec.tag.is_some() {
                                st.acked.push(query[4..].to_string());
                            }
                        } else {
                            *st.other.entry(status).or_default() += 1;
                        }
                        if let Err(e) = body {
                            sender = None;
                            st.fail(&mut failures, e.context("reading the body"));
                        } else {
                            st.lat.push(t0.elapsed());
                        }
                    }
                    Ok(Err(e)) => {
                        sender = None;
                        st.fail(&mut failures, e);
                    }
                    Err(_) => {
                        sender = None;
                        st.fail(&mut failures, anyhow!("no answer within 60 s"));
                    }
                }
            }
            st
        }));
    }
    let mut all = LoadStats::default();
    for t in tasks {
        if let Ok(st) = t.await {
            all.merge(st);
        }
    }
    all.elapsed = started.elapsed();
    all
}

impl LoadStats {
    fn fail(&mut self, failures: &mut u32, e: anyhow::Error) {
        *failures += 1;
        self.errors += 1;
        if self.error_sample.is_none() {
            self.error_sample = Some(format!("{e:#}"));
        }
    }
}

// ---------------------------------------------------------------- ledger

/// `ledger.jsonl` and every `ledger.jsonl.moved-<n>` beside it.
fn ledger_files(state: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(state)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                    n == "ledger.jsonl" || n.starts_with("ledger.jsonl.moved-")
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn files_named(state: &Path, prefix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(state)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(prefix))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Complete JSON lines of a ledger file.
fn ledger_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn is_our_request(v: &Value) -> bool {
    v["kind"] == "request" && v["path"] == PATH && v["method"] == "POST"
}

fn rid_of(v: &Value) -> Option<String> {
    v["query"]
        .as_str()?
        .split('&')
        .find_map(|kv| kv.strip_prefix("rid="))
        .map(str::to_string)
}

// ---------------------------------------------------------------- rows

struct Row {
    scenario: String,
    done: String,
    outcome: String,
    figures: String,
    ok: bool,
}

impl Row {
    fn new(scenario: &str, done: String, ok: bool, outcome: String, figures: String) -> Row {
        Row {
            scenario: scenario.into(),
            done,
            outcome,
            figures,
            ok,
        }
    }
    fn markdown(&self) -> String {
        format!(
            "| {} | {} | {} | {} |",
            self.scenario,
            self.done.replace('|', "\\|"),
            self.outcome.replace('|', "\\|"),
            self.figures.replace('|', "\\|")
        )
    }
}

fn n(v: impl Into<u64>) -> String {
    let s = v.into().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn mb(kb: u64) -> String {
    format!("{:.1} MB", kb as f64 / 1024.0)
}

fn today() -> String {
    let days = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() / 86_400)
        .unwrap_or(0) as i64;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

// ---------------------------------------------------------------- main flow

async fn run(opts: Opts) -> bool {
    tokio::spawn(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("interrupted: cleaning up");
            cleanup_all();
            std::process::exit(130);
        }
    });
    let bin = std::env::var_os("VERIS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/release/veris"));
    if !bin.is_file() {
        eprintln!("no {}: cargo build --release first", bin.display());
        return false;
    }
    let ctx = Ctx {
        bin,
        scale: if opts.quick { 10 } else { 1 },
        quick: opts.quick,
        rng: Mutex::new(Rng(opts.seed)),
    };
    let rev = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .is_ok_and(|o| !o.stdout.is_empty());
    let rev = if dirty {
        format!("{rev} + uncommitted changes")
    } else {
        rev
    };
    println!(
        "veris reliability run {} — binary {} (git {rev}), {} cores, kernel {}, {}, seed {}{}",
        today(),
        ctx.bin.display(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        if is_root() { "root" } else { "not root" },
        opts.seed,
        if opts.quick {
            ", --quick (counts / 10)"
        } else {
            ""
        }
    );
    let mut rows: Vec<Row> = Vec::new();
    let started = Instant::now();
    for s in &opts.scenarios {
        let deadline = Duration::from_secs(match s.as_str() {
            "load" => 300,
            "kill9" => 180,
            "faults" => 180,
            "badinput" => 420,
            "slowloris" => 240,
            "bigledger" => 600,
            _ => 30,
        });
        println!("\n## {s}");
        let t0 = Instant::now();
        let result = tokio::time::timeout(deadline, async {
            match s.as_str() {
                "load" => load(&ctx).await,
                "kill9" => kill9(&ctx).await,
                "faults" => faults(&ctx).await,
                "badinput" => badinput(&ctx).await,
                "slowloris" => slowloris(&ctx).await,
                "bigledger" => bigledger(&ctx).await,
                _ => fuzz().await,
            }
        })
        .await;
        let new = match result {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => vec![Row::new(
                s,
                "see the program".into(),
                false,
                format!("ERROR: {e:#}"),
                String::new(),
            )],
            Err(_) => vec![Row::new(
                s,
                "see the program".into(),
                false,
                format!("TIMEOUT: not finished within {deadline:?}"),
                String::new(),
            )],
        };
        for r in &new {
            println!("{}", r.markdown());
        }
        println!("({s}: {:.1} s)", t0.elapsed().as_secs_f64());
        rows.extend(new);
    }
    println!(
        "\n## Results ({}, {:.0} s in all)\n",
        today(),
        started.elapsed().as_secs_f64()
    );
    println!("| scenario | what was done | outcome | figures |");
    println!("|---|---|---|---|");
    for r in &rows {
        println!("{}", r.markdown());
    }
    let bad = rows.iter().filter(|r| !r.ok).count();
    if bad > 0 {
        println!("\n{bad} row(s) are not what veris promises: see above");
    }
    bad == 0
}

// ---------------------------------------------------------------- 1. load

async fn load(ctx: &Ctx) -> Result<Vec<Row>> {
    let total = ctx.n(10_000);
    let conns = ctx.n(200);
    let work = Work::new("load")?;
    let state = work.path.join("state");
    let mut serve = Serve::start(ctx, &work.path, &state, &[]).await?;
    let mut st = drive_load(
        serve.proxy,
        serve.tls.clone(),
        LoadSpec {
            total,
            conns,
            deadline: Duration::from_secs(240),
            tag: None,
            stop: Arc::new(AtomicBool::new(false)),
        },
    )
    .await;
    let twin_rows = serve.twin_rows().await?;
    let rss = serve.kb("VmHWM");
    let stopped = serve.stop().await;
    let lines = ledger_lines(&state.join("ledger.jsonl"));
    let in_ledger = lines.iter().filter(|v| is_our_request(v)).count() as u64;
    let ledger_2xx = lines
        .iter()
        .filter(|v| {
            is_our_request(v)
                && v["status"]
                    .as_u64()
                    .is_some_and(|s| (200..300).contains(&s))
        })
        .count() as u64;
    let equal = st.ok == in_ledger && in_ledger == twin_rows && st.ok == total as u64;
    let (p50, p99) = (st.pct(0.50), st.pct(0.99));
    println!(
        "client 2xx {} other {:?} errors {} ({}); ledger request lines {} (2xx {}); twin rows {}; serve {stopped}",
        st.ok,
        st.other,
        st.errors,
        st.error_sample.as_deref().unwrap_or("-"),
        in_ledger,
        ledger_2xx,
        twin_rows
    );
    Ok(vec![Row::new(
        "load",
        format!(
            "{} HTTPS `POST {PATH}` to {HOST} through the proxy (CONNECT as an `HTTPS_PROXY` client does, TLS trusting only the veris CA) from {} concurrent keep-alive connections; then the ledger's request lines and the built-in twin's request log are counted",
            n(total as u64),
            n(conns as u64)
        ),
        equal && serve.panics() == 0,
        if equal {
            "three-way counts equal".into()
        } else {
            "MISMATCH between client, ledger and twin".into()
        },
        format!(
            "client 2xx {}, ledger request lines {}, twin rows {}; non-2xx {}, transport errors {}; {:.0} req/s, p50 {}, p99 {}; serve peak RSS {} (proxy + built-in twin, whose object store keeps every customer created)",
            n(st.ok),
            n(in_ledger),
            n(twin_rows),
            st.other.values().sum::<u64>(),
            st.errors,
            st.rps(),
            ms(p50),
            ms(p99),
            mb(rss)
        ),
    )])
}

// ---------------------------------------------------------------- 2. kill -9

async fn kill9(ctx: &Ctx) -> Result<Vec<Row>> {
    let conns = ctx.n(50).max(2);
    let rounds = 3;
    let work = Work::new("kill9")?;
    let state = work.path.join("state");
    let mut acked: Vec<String> = Vec::new();
    let mut points = Vec::new();
    let mut errors = 0;
    for round in 0..rounds {
        let mut serve = Serve::start(ctx, &work.path, &state, &[]).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let load = tokio::spawn(drive_load(
            serve.proxy,
            serve.tls.clone(),
            LoadSpec {
                total: 10_000_000,
                conns,
                deadline: Duration::from_secs(30),
                tag: Some(format!("k{round}")),
                stop: stop.clone(),
            },
        ));
        let delay = Duration::from_millis(500 + ctx.rand() % 2500);
        tokio::time::sleep(delay).await;
        serve.kill9();
        stop.store(true, Ordering::Relaxed);
        let st = load.await.unwrap_or_default();
        println!(
            "round {round}: kill -9 after {} ms; {} acknowledged, {} errors ({})",
            delay.as_millis(),
            st.acked.len(),
            st.errors,
            st.error_sample.as_deref().unwrap_or("-")
        );
        points.push(format!("{} ms", delay.as_millis()));
        errors += st.errors;
        acked.extend(st.acked);
    }
    // The fourth start on the same state dir must come up and serve.
    let mut serve = Serve::start(ctx, &work.path, &state, &[]).await?;
    let after = serve.https_once("rid=after").await.map(|r| r.0);
    let stopped = serve.stop().await;
    let mut in_ledger = HashSet::new();
    let files = ledger_files(&state);
    for f in &files {
        for v in ledger_lines(f) {
            if is_our_request(&v) {
                if let Some(rid) = rid_of(&v) {
                    in_ledger.insert(rid);
                }
            }
        }
    }
    let missing: Vec<&String> = acked.iter().filter(|r| !in_ledger.contains(*r)).collect();
    let acked_in = acked.len() - missing.len();
    let unacked = in_ledger
        .iter()
        .filter(|r| r.starts_with('k'))
        .count()
        .saturating_sub(acked_in);
    let torn = files_named(&state, "ledger.jsonl.torn-").len();
    println!(
        "ledger files {:?}; torn tails {torn}; restart after the kills: {after:?}, {stopped}; missing sample {:?}",
        files.iter().map(|f| f.file_name().unwrap_or_default().to_string_lossy().into_owned()).collect::<Vec<_>>(),
        missing.iter().take(5).collect::<Vec<_>>()
    );
    let ok = missing.is_empty() && matches!(after, Ok(200)) && !acked.is_empty();
    Ok(vec![Row::new(
        "kill -9 mid-load",
        format!(
            "{rounds} rounds on one state dir: {conns} keep-alive HTTPS connections posting tagged requests (`?rid=`), `kill -9` of the serve process group at a random point, restart; then every acknowledged (2xx) tag is looked up in `ledger.jsonl` and the `ledger.jsonl.moved-<n>` files the restarts set aside"
        ),
        ok,
        if ok {
            "no acknowledged request missing; each restart served".into()
        } else if !missing.is_empty() {
            format!("LOST: {} acknowledged request(s) not in the ledger", missing.len())
        } else {
            format!("restart after the kills answered {after:?}")
        },
        format!(
            "acknowledged {}, in ledger {}, missing {}; recorded but not acknowledged (in flight at the kill) {}; kill points {}; client errors at the kills {}; ledger files {} ({} moved aside, {} torn tails)",
            n(acked.len() as u64),
            n(acked_in as u64),
            missing.len(),
            unacked,
            points.join(", "),
            errors,
            files.len(),
            files.len().saturating_sub(1),
            torn
        ),
    )])
}

// ---------------------------------------------------------------- 3. faults

async fn faults(ctx: &Ctx) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    rows.push(fault_twin_down(ctx).await.unwrap_or_else(|e| {
        Row::new(
            "fault: twin down",
            String::new(),
            false,
            format!("ERROR: {e:#}"),
            String::new(),
        )
    }));
    rows.push(fault_full_disk(ctx).await.unwrap_or_else(|e| {
        Row::new(
            "fault: ledger disk full",
            String::new(),
            false,
            format!("ERROR: {e:#}"),
            String::new(),
        )
    }));
    rows.push(fault_torn_tail(ctx).await.unwrap_or_else(|e| {
        Row::new(
            "fault: torn ledger line",
            String::new(),
            false,
            format!("ERROR: {e:#}"),
            String::new(),
        )
    }));
    Ok(rows)
}

fn veris_code(body: &str) -> String {
    body.find("veris_")
        .map(|i| {
            body[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .unwrap_or_else(|| "-".into())
}

async fn fault_twin_down(ctx: &Ctx) -> Result<Row> {
    let work = Work::new("twindown")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let twin = format!("http://127.0.0.1:{port}");
    let state = work.path.join("state");
    let mut serve = Serve::start(ctx, &work.path, &state, &["--twin", &twin]).await?;
    let (status, body) = serve.https_once("").await?;
    let alive = serve.alive();
    let stopped = serve.stop().await;
    let lines = ledger_lines(&state.join("ledger.jsonl"));
    let upstream_errors = lines
        .iter()
        .filter(|v| v["kind"] == "upstream_error")
        .count();
    let requests = lines.iter().filter(|v| v["kind"] == "request").count();
    println!(
        "status {status}, body {body}; upstream_error lines {upstream_errors}; serve {stopped}"
    );
    let ok = status == 502 && !body.is_empty() && upstream_errors == 1 && requests == 0 && alive;
    Ok(Row::new(
        "fault: twin down",
        format!("`veris serve --twin {twin}` (a closed port), one HTTPS `POST {PATH}`"),
        ok,
        if ok {
            "502 with a JSON body; one `upstream_error` ledger line, no request line".into()
        } else {
            "UNEXPECTED (see figures)".into()
        },
        format!(
            "status {status} `{}`; ledger: {upstream_errors} upstream_error, {requests} request line(s)",
            veris_code(&body)
        ),
    ))
}

async fn fault_full_disk(ctx: &Ctx) -> Result<Row> {
    let scenario = "fault: ledger disk full";
    let done = "state dir on a 4 MiB tmpfs mounted by the program; one request, then the disk filled by a file, requests until refused, the file removed, one more request".to_string();
    if !is_root() {
        println!("SKIP: mounting a tmpfs needs root");
        return Ok(Row::new(
            scenario,
            done,
            true,
            "SKIP: mounting a tmpfs needs root".into(),
            String::new(),
        ));
    }
    let work = Work::new("fulldisk")?;
    let state = work.path.join("state");
    let _tmpfs = match Tmpfs::mount(&state, "4m") {
        Ok(t) => t,
        Err(e) => {
            println!("SKIP: {e}");
            return Ok(Row::new(
                scenario,
                done,
                true,
                format!("SKIP: {e}"),
                String::new(),
            ));
        }
    };
    let mut serve = Serve::start(ctx, &work.path, &state, &[]).await?;
    let first = serve.https_once("").await?.0;
    let filler = state.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler)?;
        let chunk = vec![0u8; 64 * 1024];
        for _ in 0..200 {
            if f.write_all(&chunk).and_then(|()| f.sync_all()).is_err() {
                break;
            }
        }
    }
    let mut served = u64::from(first == 200);
    let mut refusal = None;
    for _ in 0..200 {
        let (status, body) = serve.https_once("").await?;
        if status == 200 {
            served += 1;
        } else {
            refusal = Some((status, body));
            break;
        }
    }
    let again = serve.https_once("").await?.0;
    std::fs::remove_file(&filler)?;
    let recovered = serve.https_once("").await?.0;
    served += u64::from(recovered == 200);
    let alive = serve.alive();
    let stopped = serve.stop().await;
    let in_ledger = ledger_lines(&state.join("ledger.jsonl"))
        .iter()
        .filter(|v| is_our_request(v))
        .count() as u64;
    let (status, body) = refusal.unwrap_or((0, String::new()));
    println!("refusal {status} {body}; again {again}; after freeing {recovered}; serve {stopped}");
    let ok = status == 503
        && body.contains("veris_ledger_unavailable")
        && again == 503
        && recovered == 200
        && in_ledger == served
        && alive;
    Ok(Row::new(
        scenario,
        done,
        ok,
        if ok {
            "refused with 503 `veris_ledger_unavailable` while full (never served unrecorded); served again once space was freed".into()
        } else {
            "UNEXPECTED (see figures)".into()
        },
        format!(
            "{served} served (all {in_ledger} in the ledger), then {status} `{}`, again {again}; after freeing: {recovered}",
            veris_code(&body)
        ),
    ))
}

async fn fault_torn_tail(ctx: &Ctx) -> Result<Row> {
    let work = Work::new("torn")?;
    let state = work.path.join("state");
    let mut serve = Serve::start(ctx, &work.path, &state, &[]).await?;
    for _ in 0..3 {
        serve.https_once("").await?;
    }
    serve.stop().await;
    drop(serve);
    let ledger = state.join("ledger.jsonl");
    let half =
        br#"{"v":1,"seq":99999,"ts":"2026-12-01T00:00:00.000Z","kind":"request","service":"str"#;
    {
        use std::io::Write;
        std::fs::OpenOptions::new()
            .append(true)
            .open(&ledger)?
            .write_all(half)?;
    }
    let mut serve = Serve::start(ctx, &work.path, &state, &[]).await?;
    let after = serve.https_once("").await?.0;
    serve.stop().await;
    let torn = files_named(&state, "ledger.jsonl.torn-");
    let moved = files_named(&state, "ledger.jsonl.moved-");
    let sessions: Vec<Value> = ledger_lines(&ledger)
        .into_iter()
        .filter(|v| v["kind"] == "session")
        .collect();
    let recorded = sessions
        .last()
        .map(|s| s["recovered_torn_tail"].clone())
        .unwrap_or(Value::Null);
    let saved_ok = torn
        .first()
        .and_then(|p| std::fs::read(p).ok())
        .is_some_and(|b| b == half);
    println!(
        "torn files {torn:?}; moved {moved:?}; sessions in ledger.jsonl {}; recovered_torn_tail {recorded}; after {after}",
        sessions.len()
    );
    let ok = saved_ok && !recorded.is_null() && after == 200;
    Ok(Row::new(
        "fault: torn ledger line",
        format!(
            "clean stop after 3 requests, then half a line ({} bytes, no newline) appended to `ledger.jsonl`, restart on the same state dir, one request",
            half.len()
        ),
        ok,
        if ok {
            format!(
                "torn bytes moved aside to `{}` and the new session line records `recovered_torn_tail`; {}",
                torn[0].file_name().unwrap_or_default().to_string_lossy(),
                if moved.is_empty() {
                    "the sealed chain was continued"
                } else {
                    "the old chain was moved aside"
                }
            )
        } else {
            "UNEXPECTED (see figures)".into()
        },
        format!("recovered_torn_tail `{recorded}`; request after restart {after}; sessions in ledger.jsonl {}", sessions.len()),
    ))
}

// ---------------------------------------------------------------- 4. bad input

#[derive(Clone, Copy, PartialEq)]
enum Dest {
    Proxy,
    Admin,
    Twin,
}

enum How {
    /// Bytes on a fresh TCP connection.
    Raw(Vec<u8>),
    /// `CONNECT api.stripe.com:443`, then these bytes in the tunnel.
    Tunnel(Vec<u8>),
    /// Through the tunnel and a TLS handshake with the veris leaf (ALPN h2
    /// when true), then these bytes.
    Tls(bool, Vec<u8>),
}

struct Shape {
    name: String,
    dest: Dest,
    how: How,
}

fn shape(name: &str, dest: Dest, how: How) -> Shape {
    Shape {
        name: name.into(),
        dest,
        how,
    }
}

fn req(line: &str, headers: &str, body: &[u8]) -> Vec<u8> {
    let mut v = format!("{line}\r\n{headers}\r\n").into_bytes();
    v.extend_from_slice(body);
    v
}

/// An h2 frame header: length, type, flags, stream.
fn h2_frame(len: u32, kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = len.to_be_bytes()[1..].to_vec();
    v.push(kind);
    v.push(flags);
    v.extend_from_slice(&stream.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn shapes(ctx: &Ctx, serve: &Serve) -> Vec<Shape> {
    use Dest::*;
    use How::*;
    let mut rng = Rng(ctx.rand() | 1);
    let abs = format!("http://{HOST}{PATH}");
    let host = format!("Host: {HOST}\r\n");
    let token = format!("Authorization: Bearer {}\r\n", serve.token);
    let sbx = &serve.sandbox;
    let deep_form = {
        let mut b = b"a".to_vec();
        while b.len() < 1_000_000 {
            b.extend_from_slice(b"[b]");
        }
        b.extend_from_slice(b"=1");
        b
    };
    let deep_json = {
        let mut b = vec![b'['; 500_000];
        b.extend(vec![b']'; 500_000]);
        b
    };
    let mut h2_garbage = PREFACE.to_vec();
    h2_garbage.extend(rng.bytes(512));
    let mut h2_huge_settings = PREFACE.to_vec();
    h2_huge_settings.extend(h2_frame(0xFF_FFFF, 0x4, 0, 0, &[0; 64]));
    let mut h2_bad_headers = PREFACE.to_vec();
    h2_bad_headers.extend(h2_frame(0, 0x4, 0, 0, &[]));
    h2_bad_headers.extend(h2_frame(64, 0x1, 0x5, 1, &rng.bytes(64)));
    let mut tls_big_record = vec![0x16, 0x03, 0x01, 0x40, 0x00];
    tls_big_record.extend(rng.bytes(100));
    let mut tls_bad_lengths = vec![0x16, 0x03, 0x01, 0x00, 0x2f, 0x01, 0xff, 0xff, 0xff];
    tls_bad_lengths.extend(rng.bytes(43));
    let mut sslv2 = vec![
        0x80, 0x2e, 0x01, 0x00, 0x02, 0x00, 0x15, 0x00, 0x00, 0x00, 0x10,
    ];
    sslv2.extend(rng.bytes(37));
    let mut tls_no_connect = vec![0x16, 0x03, 0x01, 0x00, 0x50];
    tls_no_connect.extend(rng.bytes(80));
    let many_headers: String = (0..10_000).map(|i| format!("X-H{i}: v\r\n")).collect();
    let big_header = format!("X-Big: {}\r\n", "a".repeat(128 * 1024));
    let chunked = |size: &str| {
        req(
            &format!("POST {PATH} HTTP/1.1"),
            &format!("{host}Transfer-Encoding: chunked\r\n"),
            format!("{size}\r\nabc").as_bytes(),
        )
    };
    let connect = |target: &str| {
        req(
            &format!("CONNECT {target} HTTP/1.1"),
            &format!("Host: {target}\r\n"),
            b"",
        )
    };
    vec![
        // The proxy port: HTTP/1 framing.
        shape("proxy: 4 KiB of random bytes", Proxy, Raw(rng.bytes(4096))),
        shape("proxy: 1 KiB of NUL bytes", Proxy, Raw(vec![0; 1024])),
        shape("proxy: empty lines only", Proxy, Raw(b"\r\n\r\n\r\n\r\n".to_vec())),
        shape("proxy: request line without a version", Proxy, Raw(b"GET /\r\n\r\n".to_vec())),
        shape("proxy: HTTP/9.9", Proxy, Raw(req("GET / HTTP/9.9", &host, b""))),
        shape("proxy: 1 KiB method of bad token bytes", Proxy, Raw(req(&format!("G{}T {abs} HTTP/1.1", "(\")".repeat(340)), &host, b""))),
        shape("proxy: 64 KiB request line", Proxy, Raw(req(&format!("GET http://{HOST}/{} HTTP/1.1", "a".repeat(64 * 1024)), &host, b""))),
        shape("proxy: one 128 KiB header", Proxy, Raw(req(&format!("GET {abs} HTTP/1.1"), &format!("{host}{big_header}"), b""))),
        shape("proxy: 10,000 headers", Proxy, Raw(req(&format!("GET {abs} HTTP/1.1"), &format!("{host}{many_headers}"), b""))),
        shape("proxy: header line without a colon", Proxy, Raw(req(&format!("GET {abs} HTTP/1.1"), &format!("{host}no colon here\r\n"), b""))),
        shape("proxy: obs-fold continuation line", Proxy, Raw(req(&format!("GET {abs} HTTP/1.1"), &format!("{host}X-A: a\r\n  folded\r\n"), b""))),
        shape("proxy: NUL in a header value", Proxy, Raw(req(&format!("GET {abs} HTTP/1.1"), &format!("{host}X-A: a\0b\r\n"), b""))),
        shape("proxy: raw bad UTF-8 in the path", Proxy, Raw([b"GET http://api.stripe.com/\xff\xfe\xfd HTTP/1.1\r\n".as_slice(), host.as_bytes(), b"\r\n"].concat())),
        shape("proxy: absolute-form with port 99999", Proxy, Raw(req(&format!("GET http://{HOST}:99999{PATH} HTTP/1.1"), &host, b""))),
        shape("proxy: absolute-form with userinfo", Proxy, Raw(req(&format!("GET http://user:pass@{HOST}{PATH} HTTP/1.1"), &host, b""))),
        shape("proxy: Content-Length and Transfer-Encoding", Proxy, Raw(req(&format!("POST {abs} HTTP/1.1"), &format!("{host}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n"), b"0\r\n\r\nGET /x HTTP/1.1\r\n\r\n"))),
        shape("proxy: two different Content-Lengths", Proxy, Raw(req(&format!("POST {abs} HTTP/1.1"), &format!("{host}Content-Length: 1\r\nContent-Length: 2\r\n"), b"ab"))),
        shape("proxy: Content-Length -1", Proxy, Raw(req(&format!("POST {abs} HTTP/1.1"), &format!("{host}Content-Length: -1\r\n"), b""))),
        shape("proxy: Content-Length 2^70", Proxy, Raw(req(&format!("POST {abs} HTTP/1.1"), &format!("{host}Content-Length: 1180591620717411303424\r\n"), b""))),
        shape("proxy: chunk size 2^72 (absolute-form)", Proxy, Raw({ let mut v = chunked("ffffffffffffffffff"); v.splice(5..5 + PATH.len(), abs.bytes()); v })),
        shape("proxy: chunk size not hex", Proxy, Raw({ let mut v = chunked("zz"); v.splice(5..5 + PATH.len(), abs.bytes()); v })),
        // CONNECT targets.
        shape("proxy: CONNECT port 99999", Proxy, Raw(connect(&format!("{HOST}:99999")))),
        shape("proxy: CONNECT port 65536", Proxy, Raw(connect(&format!("{HOST}:65536")))),
        shape("proxy: CONNECT port abc", Proxy, Raw(connect(&format!("{HOST}:abc")))),
        shape("proxy: CONNECT empty port", Proxy, Raw(connect(&format!("{HOST}:")))),
        shape("proxy: CONNECT without a port", Proxy, Raw(connect(HOST))),
        shape("proxy: CONNECT empty target", Proxy, Raw(b"CONNECT  HTTP/1.1\r\nHost: \r\n\r\n".to_vec())),
        shape("proxy: CONNECT empty host", Proxy, Raw(connect(":443"))),
        shape("proxy: CONNECT broken IPv6 literal", Proxy, Raw(connect("[::1:443"))),
        shape("proxy: CONNECT 300-byte host label", Proxy, Raw(connect(&format!("{}.com:443", "a".repeat(300))))),
        shape("proxy: CONNECT %00 in the host", Proxy, Raw(connect("api%00stripe.com:443"))),
        // Other protocols on the proxy port.
        shape("proxy: h2 preface, then garbage", Proxy, Raw(h2_garbage.clone())),
        shape("proxy: TLS ClientHello record without CONNECT", Proxy, Raw(tls_no_connect)),
        // After CONNECT: TLS garbage.
        shape("tunnel: random bytes instead of TLS", Proxy, Tunnel(rng.bytes(2048))),
        shape("tunnel: TLS record header claiming 16 KiB, 100 bytes sent", Proxy, Tunnel(tls_big_record)),
        shape("tunnel: ClientHello with a 16 MiB length", Proxy, Tunnel(tls_bad_lengths)),
        shape("tunnel: TLS alert record", Proxy, Tunnel(vec![0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28])),
        shape("tunnel: SSLv2-style hello", Proxy, Tunnel(sslv2)),
        shape("tunnel: plain HTTP instead of TLS", Proxy, Tunnel(req(&format!("GET {PATH} HTTP/1.1"), &host, b""))),
        // Inside TLS, to the twin through the proxy.
        shape("tls: 1 MB form key a[b][b]…", Proxy, Tls(false, req(&format!("POST {PATH} HTTP/1.1"), &format!("{host}Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n", deep_form.len()), &deep_form))),
        shape("tls: 1 MB deep JSON [[[…]]]", Proxy, Tls(false, req(&format!("POST {PATH} HTTP/1.1"), &format!("{host}Content-Type: application/json\r\nContent-Length: {}\r\n", deep_json.len()), &deep_json))),
        shape("tls: percent-encoded bad UTF-8 path", Proxy, Tls(false, req(&format!("GET {PATH}/%ff%fe HTTP/1.1"), &host, b""))),
        shape("tls: raw bad UTF-8 path", Proxy, Tls(false, [b"GET /v1/\xff\xfe HTTP/1.1\r\n".as_slice(), host.as_bytes(), b"\r\n"].concat())),
        shape("tls: encoded dot-segments to /veris/", Proxy, Tls(false, req("GET /v1/%2e%2e/%2E%2E/veris/requests HTTP/1.1", &host, b""))),
        shape("tls: chunk size 2^72", Proxy, Tls(false, chunked("ffffffffffffffffff"))),
        shape("tls: Content-Length 2^70", Proxy, Tls(false, req(&format!("POST {PATH} HTTP/1.1"), &format!("{host}Content-Length: 1180591620717411303424\r\n"), b""))),
        shape("tls: one 128 KiB header", Proxy, Tls(false, req(&format!("GET {PATH} HTTP/1.1"), &format!("{host}{big_header}"), b""))),
        shape("tls+h2: preface, then garbage", Proxy, Tls(true, h2_garbage.clone())),
        shape("tls+h2: SETTINGS frame of 16 MiB", Proxy, Tls(true, h2_huge_settings.clone())),
        shape("tls+h2: HEADERS of random HPACK", Proxy, Tls(true, h2_bad_headers.clone())),
        // The admin API.
        shape("admin: 4 KiB of random bytes", Admin, Raw(rng.bytes(4096))),
        shape("admin: /status without a token", Admin, Raw(req("GET /status HTTP/1.1", "Host: a\r\n", b""))),
        shape("admin: /status with a 64 KiB token", Admin, Raw(req("GET /status HTTP/1.1", &format!("Host: a\r\nAuthorization: Bearer {}\r\n", "x".repeat(64 * 1024)), b""))),
        shape("admin: /ledger?since=-1", Admin, Raw(req("GET /ledger?since=-1 HTTP/1.1", &format!("Host: a\r\n{token}"), b""))),
        shape("admin: /ledger?since=10^23", Admin, Raw(req("GET /ledger?since=99999999999999999999999 HTTP/1.1", &format!("Host: a\r\n{token}"), b""))),
        shape("admin: /receipt?since=abc", Admin, Raw(req("GET /receipt?since=abc HTTP/1.1", &format!("Host: a\r\n{token}"), b""))),
        shape("admin: /events with Last-Event-ID garbage", Admin, Raw(req("GET /events HTTP/1.1", &format!("Host: a\r\n{token}Last-Event-ID: \u{1}zz-99\r\n"), b""))),
        shape("admin: POST /seal with a 1 MiB body", Admin, Raw(req("POST /seal HTTP/1.1", &format!("Host: a\r\n{token}Content-Length: {}\r\n", 1 << 20), &vec![b'x'; 1 << 20]))),
        shape("admin: /../../etc/passwd", Admin, Raw(req("GET /../../etc/passwd HTTP/1.1", &format!("Host: a\r\n{token}"), b""))),
        shape("admin: raw bad UTF-8 path", Admin, Raw([b"GET /\xff\xfe HTTP/1.1\r\nHost: a\r\n".as_slice(), token.as_bytes(), b"\r\n"].concat())),
        shape("admin: h2 preface, then garbage", Admin, Raw(h2_garbage.clone())),
        // The built-in twin, directly.
        shape("twin: 4 KiB of random bytes", Twin, Raw(rng.bytes(4096))),
        shape("twin: limit=10^23", Twin, Raw(req(&format!("GET /s/{sbx}/stripe/veris/requests?limit=99999999999999999999999 HTTP/1.1"), "Host: t\r\n", b""))),
        shape("twin: since_id=-1&tier=%ff", Twin, Raw(req(&format!("GET /s/{sbx}/stripe/veris/requests?since_id=-1&tier=%ff HTTP/1.1"), "Host: t\r\n", b""))),
        shape("twin: vendor POST without the proxy's credential", Twin, Raw(req(&format!("POST /s/{sbx}/stripe{PATH} HTTP/1.1"), "Host: t\r\nContent-Length: 0\r\n", b""))),
        shape("twin: /s/../../etc/passwd", Twin, Raw(req("GET /s/../../etc/passwd HTTP/1.1", "Host: t\r\n", b""))),
        shape("twin: h2c preface, then garbage", Twin, Raw(h2_garbage)),
        shape("twin: h2c SETTINGS frame of 16 MiB", Twin, Raw(h2_huge_settings)),
        shape("twin: h2c HEADERS of random HPACK", Twin, Raw(h2_bad_headers)),
    ]
}

/// What came back: a status line (and any `veris_…` error code), h2
/// frames, a TLS alert, a close or a reset, or nothing within `wait`.
async fn outcome<IO>(io: IO, send: Vec<u8>, wait: Duration) -> String
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut r, mut w) = tokio::io::split(io);
    let writer = tokio::spawn(async move {
        let res = w.write_all(&send).await;
        let _ = w.flush().await;
        // Keep the write half open until the reader is done.
        (res, w)
    });
    let mut got = Vec::new();
    let start = Instant::now();
    let mut end = None;
    while start.elapsed() < wait && got.len() < 64 * 1024 {
        let mut buf = [0u8; 8192];
        match tokio::time::timeout(wait.saturating_sub(start.elapsed()), r.read(&mut buf)).await {
            Err(_) => break,
            Ok(Ok(0)) => {
                end = Some("closed");
                break;
            }
            Ok(Ok(k)) => {
                got.extend_from_slice(&buf[..k]);
                // An HTTP/1 answer: the head plus a little of the body is enough.
                if got.starts_with(b"HTTP/") && got.windows(4).any(|w| w == b"\r\n\r\n") {
                    let more =
                        tokio::time::timeout(Duration::from_millis(150), r.read(&mut buf)).await;
                    if let Ok(Ok(k)) = more {
                        got.extend_from_slice(&buf[..k]);
                    }
                    break;
                }
            }
            Ok(Err(e)) => {
                end = Some(if e.kind() == std::io::ErrorKind::ConnectionReset {
                    "reset"
                } else {
                    "error"
                });
                break;
            }
        }
    }
    let wrote = matches!(
        tokio::time::timeout(Duration::from_secs(1), writer).await,
        Ok(Ok((Ok(()), _)))
    );
    let partial = if wrote {
        ""
    } else {
        " (before our upload finished)"
    };
    if got.starts_with(b"HTTP/") {
        let text = String::from_utf8_lossy(&got);
        let line = text.lines().next().unwrap_or("").trim();
        // An error code in an error answer (a 200 may carry ledger lines).
        let code = if status_of(&got).is_some_and(|s| s >= 400) {
            veris_code(&text)
        } else {
            "-".into()
        };
        let status = line
            .split_whitespace()
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ");
        return if code == "-" {
            format!("{status}{partial}")
        } else {
            format!("{status} `{code}`{partial}")
        };
    }
    if !got.is_empty() {
        if got[0] == 0x15 && got.len() >= 7 {
            return format!("TLS alert {}{partial}", got[6]);
        }
        if let Some(frames) = h2_frames(&got) {
            return format!("h2 {frames}{partial}");
        }
        return format!("{} bytes, not HTTP{partial}", got.len());
    }
    match end {
        Some(e) => format!("{e} without an answer{partial}"),
        None => format!(
            "no answer within {} s (waits for the rest){partial}",
            wait.as_secs()
        ),
    }
}

/// h2 frames in `b`, named: `SETTINGS, GOAWAY(PROTOCOL_ERROR)`.
fn h2_frames(b: &[u8]) -> Option<String> {
    let mut names = Vec::new();
    let mut i = 0;
    while i + 9 <= b.len() && names.len() < 6 {
        let len = u32::from_be_bytes([0, b[i], b[i + 1], b[i + 2]]) as usize;
        let kind = b[i + 3];
        let payload = b.get(i + 9..(i + 9 + len).min(b.len()))?;
        names.push(match kind {
            0x4 => "SETTINGS".to_string(),
            0x6 => "PING".to_string(),
            0x8 => "WINDOW_UPDATE".to_string(),
            0x7 => {
                let code = payload
                    .get(4..8)
                    .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                    .unwrap_or(u32::MAX);
                let name = [
                    "NO_ERROR",
                    "PROTOCOL_ERROR",
                    "INTERNAL_ERROR",
                    "FLOW_CONTROL_ERROR",
                    "SETTINGS_TIMEOUT",
                    "STREAM_CLOSED",
                    "FRAME_SIZE_ERROR",
                    "REFUSED_STREAM",
                    "CANCEL",
                    "COMPRESSION_ERROR",
                ]
                .get(code as usize)
                .copied()
                .unwrap_or("?");
                format!("GOAWAY({name})")
            }
            0x1 => "HEADERS".to_string(),
            0x3 => "RST_STREAM".to_string(),
            k if k <= 0x9 => format!("frame {k}"),
            _ => return None,
        });
        i += 9 + len;
    }
    (!names.is_empty()).then(|| names.join(", "))
}

async fn send_shape(serve: &Serve, s: &Shape) -> Result<String> {
    let wait = Duration::from_secs(3);
    let addr = match s.dest {
        Dest::Proxy => serve.proxy,
        Dest::Admin => serve.admin.ok_or_else(|| anyhow!("no admin address"))?,
        Dest::Twin => serve
            .twin_addr()
            .ok_or_else(|| anyhow!("no twin address"))?,
    };
    Ok(match &s.how {
        How::Raw(b) => outcome(TcpStream::connect(addr).await?, b.clone(), wait).await,
        How::Tunnel(b) => match tunnel(addr, &format!("{HOST}:443")).await {
            Ok(t) => outcome(t, b.clone(), wait).await,
            Err(e) => format!("CONNECT failed: {e}"),
        },
        How::Tls(h2, b) => {
            let cfg = if *h2 { &serve.tls_h2 } else { &serve.tls };
            match tls_tunnel(addr, cfg).await {
                Ok(t) => outcome(t, b.clone(), wait).await,
                Err(e) => format!("TLS failed: {e}"),
            }
        }
    })
}

async fn badinput(ctx: &Ctx) -> Result<Vec<Row>> {
    let work = Work::new("badinput")?;
    let state = work.path.join("state");
    // Strict: a CONNECT to an odd unmapped host is refused in words, never
    // resolved or dialed, so this traffic stays on loopback.
    let mut serve = Serve::start(ctx, &work.path, &state, &["--mode", "strict"]).await?;
    let list = shapes(ctx, &serve);
    let mut survived = 0;
    let mut details = Vec::new();
    println!("| shape | port | answer | then a normal request |");
    println!("|---|---|---|---|");
    for s in &list {
        let got = match send_shape(&serve, s).await {
            Ok(o) => o,
            Err(e) => format!("error: {e:#}"),
        };
        let alive = serve.alive();
        let normal = if alive {
            match serve.https_once("").await {
                Ok((st, _)) => st.to_string(),
                Err(e) => format!("failed: {e:#}"),
            }
        } else {
            "DIED".into()
        };
        if alive && normal == "200" {
            survived += 1;
        }
        let port = match s.dest {
            Dest::Proxy => "proxy",
            Dest::Admin => "admin",
            Dest::Twin => "twin",
        };
        let line = format!(
            "| {} | {port} | {} | {normal} |",
            s.name,
            got.replace('|', "\\|")
        );
        println!("{line}");
        details.push(line);
        if !alive {
            println!("serve died: {}", tail(&serve.stderr_path, 800));
            break;
        }
    }
    let final_normal = serve.https_once("").await.map(|r| r.0).ok();
    let alive = serve.alive();
    let panics = serve.panics();
    let rss = serve.kb("VmHWM");
    serve.stop().await;
    let total = list.len();
    let ok = survived == total && alive && final_normal == Some(200) && panics == 0;
    let per_port = |d: Dest| list.iter().filter(|s| s.dest == d).count();
    Ok(vec![Row::new(
        "bad-input shapes",
        format!(
            "{total} malformed inputs to a `veris serve --mode strict` (so no odd host name is ever resolved), one connection each ({} to the proxy port — garbage, framing, oversized heads, invalid CONNECT targets, TLS garbage after CONNECT, h2 garbage, 1 MB nested form key and deep JSON through TLS to the twin —, {} to the admin API, {} to the twin directly); after each, a normal HTTPS request (the table of shapes is printed by the program)",
            per_port(Dest::Proxy),
            per_port(Dest::Admin),
            per_port(Dest::Twin)
        ),
        ok,
        if ok {
            format!("{total} shapes, {survived} survived: each got an error status, a close or a wait for the rest; the process never died and the next request was 200")
        } else {
            format!("{total} shapes, {survived} survived (alive {alive}, panics in the log {panics})")
        },
        format!("{total} shapes, {survived} survived; panics in the log {panics}; proxy peak RSS {}", mb(rss)),
    )])
}

// ---------------------------------------------------------------- 5. slowloris

struct Held {
    /// Time from connect (or from the end of the TLS handshake) to the
    /// proxy's close; `None` when still open at the deadline or never opened.
    closed_after: Option<Duration>,
    opened: bool,
}

fn summary(v: &[Held]) -> (usize, usize, String) {
    let opened = v.iter().filter(|h| h.opened).count();
    let mut t: Vec<Duration> = v.iter().filter_map(|h| h.closed_after).collect();
    t.sort_unstable();
    let span = if t.is_empty() {
        "-".to_string()
    } else {
        format!(
            "{:.1}/{:.1}/{:.1} s",
            t[0].as_secs_f64(),
            t[t.len() / 2].as_secs_f64(),
            t[t.len() - 1].as_secs_f64()
        )
    };
    (opened, t.len(), span)
}

/// Waits until the peer closes or errors (reading), or `until`.
async fn until_closed<R: AsyncRead + Unpin>(
    r: &mut R,
    from: Instant,
    until: Instant,
) -> Option<Duration> {
    let mut buf = [0u8; 1024];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, r.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(from.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

async fn slowloris(ctx: &Ctx) -> Result<Vec<Row>> {
    let slow_n = ctx.n(2000);
    let idle_n = ctx.n(1000);
    let stall_n = ctx.n(200);
    let (head_t, hs_t) = if ctx.quick { (8u64, 4u64) } else { (30, 10) };
    let flags = [
        "--client-timeout".to_string(),
        head_t.to_string(),
        "--handshake-timeout".into(),
        hs_t.to_string(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let work = Work::new("slowloris")?;
    let state = work.path.join("state");
    let mut serve = Serve::start(ctx, &work.path, &state, &flags).await?;
    // Warm: the leaf is minted, the twin pool is up.
    serve.https_once("").await?;
    let base_kb = serve.kb("VmRSS");
    let hold = Duration::from_secs(head_t.max(hs_t) + 30);
    let until = Instant::now() + hold;
    let proxy = serve.proxy;

    // 1. Idle TLS connections: CONNECT, handshake, then nothing.
    let opened = Arc::new(AtomicUsize::new(0));
    let mut idle = Vec::new();
    for _ in 0..idle_n {
        let (tls, opened) = (serve.tls.clone(), opened.clone());
        idle.push(tokio::spawn(async move {
            let Ok(Ok(mut s)) =
                tokio::time::timeout(Duration::from_secs(30), tls_tunnel(proxy, &tls)).await
            else {
                return Held {
                    closed_after: None,
                    opened: false,
                };
            };
            opened.fetch_add(1, Ordering::Relaxed);
            let from = Instant::now();
            Held {
                closed_after: until_closed(&mut s, from, until).await,
                opened: true,
            }
        }));
        if idle.len() % 50 == 0 {
            tokio::task::yield_now().await;
        }
    }
    let t = Instant::now();
    while opened.load(Ordering::Relaxed) < idle_n && t.elapsed() < Duration::from_secs(40) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let idle_open = opened.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let idle_kb = serve.kb("VmRSS");

    // 2. Slow heads: one byte every 2 s, never finished.
    let slow_open = Arc::new(AtomicUsize::new(0));
    let mut slow = Vec::new();
    for i in 0..slow_n {
        let slow_open = slow_open.clone();
        let jitter = Duration::from_millis((i as u64 * 37) % 2000);
        slow.push(tokio::spawn(async move {
            let Ok(mut s) = TcpStream::connect(proxy).await else {
                return Held { closed_after: None, opened: false };
            };
            slow_open.fetch_add(1, Ordering::Relaxed);
            let from = Instant::now();
            let head = format!("GET http://{HOST}{PATH} HTTP/1.1\r\nHost: {HOST}\r\nX-Slow: ");
            let mut bytes = head.bytes().chain(std::iter::repeat(b'a'));
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + jitter, Duration::from_secs(2));
            let mut buf = [0u8; 256];
            loop {
                tokio::select! {
                    r = s.read(&mut buf) => match r {
                        Ok(0) | Err(_) => return Held { closed_after: Some(from.elapsed()), opened: true },
                        Ok(_) => {}
                    },
                    _ = tick.tick() => {
                        let b = bytes.next().unwrap_or(b'a');
                        if s.write_all(&[b]).await.is_err() {
                            return Held { closed_after: Some(from.elapsed()), opened: true };
                        }
                    }
                    _ = tokio::time::sleep_until(until.into()) => return Held { closed_after: None, opened: true },
                }
            }
        }));
        if slow.len() % 100 == 0 {
            tokio::task::yield_now().await;
        }
    }
    // 3. Stalled handshakes: CONNECT, five bytes of a TLS record, nothing more.
    let mut stall = Vec::new();
    for _ in 0..stall_n {
        stall.push(tokio::spawn(async move {
            let Ok(mut s) = tunnel(proxy, &format!("{HOST}:443")).await else {
                return Held {
                    closed_after: None,
                    opened: false,
                };
            };
            let from = Instant::now();
            let _ = s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).await;
            Held {
                closed_after: until_closed(&mut s, from, until).await,
                opened: true,
            }
        }));
    }
    let t = Instant::now();
    while slow_open.load(Ordering::Relaxed) < slow_n && t.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held_kb = serve.kb("VmRSS");
    // A normal request while all of them are held.
    let t = Instant::now();
    let normal = serve.https_once("").await;
    let normal_took = t.elapsed();
    let normal = normal.map(|r| r.0);
    println!(
        "RSS base {base_kb} kB, with {idle_open} idle TLS {idle_kb} kB, with all held {held_kb} kB; normal request while held: {normal:?} in {}",
        ms(normal_took)
    );
    let collect = |v: Vec<tokio::task::JoinHandle<Held>>| async move {
        let mut out = Vec::new();
        for h in v {
            out.push(h.await.unwrap_or(Held {
                closed_after: None,
                opened: false,
            }));
        }
        out
    };
    let idle = collect(idle).await;
    let slow = collect(slow).await;
    let stall = collect(stall).await;
    let after_kb = serve.kb("VmRSS");
    let after = serve.https_once("").await.map(|r| r.0);
    let alive = serve.alive();
    serve.stop().await;
    let (io, ic, ispan) = summary(&idle);
    let (so, sc, sspan) = summary(&slow);
    let (to, tc, tspan) = summary(&stall);
    println!("idle TLS {io} open, {ic} closed ({ispan}); slow heads {so} open, {sc} closed ({sspan}); stalled handshakes {to} open, {tc} closed ({tspan}); RSS after {after_kb} kB; request after {after:?}");
    let per_conn = idle_kb.saturating_sub(base_kb) as f64 / idle_open.max(1) as f64;
    let ok = io == idle_n
        && so == slow_n
        && to == stall_n
        && ic == io
        && sc == so
        && tc == to
        && matches!(normal, Ok(200))
        && matches!(after, Ok(200))
        && alive;
    Ok(vec![
        Row::new(
            "slowloris",
            format!(
                "{} connections sending a request head one byte every 2 s, {} idle TLS connections (CONNECT + handshake, then nothing) and {} stalled TLS handshakes (5 bytes of a record), held at once; a normal HTTPS request meanwhile. Timeouts: `--client-timeout {head_t}` `--handshake-timeout {hs_t}`{}",
                n(slow_n as u64),
                n(idle_n as u64),
                n(stall_n as u64),
                if ctx.quick { " (shortened for --quick)" } else { " (the defaults)" }
            ),
            ok,
            if ok {
                "every one closed by the proxy at its timeout; the normal request succeeded while they were held".into()
            } else {
                let mut what = Vec::new();
                for (name, opened, closed) in [
                    ("slow heads", so, sc),
                    ("idle TLS connections", io, ic),
                    ("stalled handshakes", to, tc),
                ] {
                    if closed < opened {
                        what.push(format!(
                            "{} of {opened} {name} NOT closed by the proxy (still open when we gave up, {} s after the start)",
                            opened - closed,
                            hold.as_secs()
                        ));
                    }
                }
                if !matches!(normal, Ok(200)) || !matches!(after, Ok(200)) || !alive {
                    what.push("the normal request failed or the proxy died".into());
                }
                if what.is_empty() {
                    what.push("not every connection could be opened".into());
                }
                what.join("; ")
            },
            format!(
                "slow heads: {sc}/{so} closed after {sspan} (min/median/max); idle TLS: {ic}/{io} closed after {ispan}; stalled handshakes: {tc}/{to} closed after {tspan}; normal request while held: {} in {}",
                normal.map(|s| s.to_string()).unwrap_or_else(|e| format!("failed: {e}")),
                ms(normal_took)
            ),
        ),
        Row::new(
            "RSS, idle connections",
            format!("proxy VmRSS before, with the {} idle TLS connections above held, with all {} held, and after they ended", n(idle_open as u64), n((idle_open + so + to) as u64)),
            true,
            "measured".into(),
            format!(
                "{} before; {} with {} idle TLS ({:.1} KB per connection); {} with all held; {} after",
                mb(base_kb),
                mb(idle_kb),
                n(idle_open as u64),
                per_conn,
                mb(held_kb),
                mb(after_kb)
            ),
        ),
    ])
}

// ---------------------------------------------------------------- 6. big ledger

/// Resets VmHWM to the current RSS (Linux: "5" to clear_refs).
fn reset_peak(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

async fn bigledger(ctx: &Ctx) -> Result<Vec<Row>> {
    let target: u64 = 25 * 1024 * 1024 / ctx.scale as u64;
    let work = Work::new("bigledger")?;
    let state = work.path.join("state");
    // The twin in a process of its own, so the RSS measured is the proxy's:
    // the built-in twin keeps every object created in memory.
    let twin = Twin::start(ctx)?;
    let mut serve = Serve::start(ctx, &work.path, &state, &["--twin", &twin.url]).await?;
    let ledger = state.join("ledger.jsonl");
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (stop, ledger) = (stop.clone(), ledger.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if std::fs::metadata(&ledger).map(|m| m.len()).unwrap_or(0) >= target {
                    stop.store(true, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let st = drive_load(
        serve.proxy,
        serve.tls.clone(),
        LoadSpec {
            total: 2_000_000,
            conns: 16,
            deadline: Duration::from_secs(300),
            tag: None,
            stop: stop.clone(),
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let _ = watcher.await;
    let size = std::fs::metadata(&ledger).map(|m| m.len()).unwrap_or(0);
    let lines = std::fs::read_to_string(&ledger)
        .map(|t| t.lines().count())
        .unwrap_or(0);
    println!(
        "ledger {} bytes, {} lines, from {} requests in {:.1} s ({:.0} req/s); errors {}",
        size,
        lines,
        st.ok,
        st.elapsed.as_secs_f64(),
        st.rps(),
        st.errors
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pid = serve.pid;
    let mut figures = Vec::new();
    let mut all_ok = true;
    let start_kb = serve.kb("VmRSS");
    for (name, path) in [
        ("/receipt", "/receipt"),
        ("/status", "/status"),
        ("/ledger?since=1", "/ledger?since=1"),
    ] {
        let before = serve.kb("VmRSS");
        let reset = reset_peak(pid);
        // A sampler as well, in case VmHWM cannot be reset.
        let peak = Arc::new(AtomicU64::new(before));
        let done = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (peak, done) = (peak.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    if let Some(kb) = proc_kb(pid, "VmRSS") {
                        peak.fetch_max(kb, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        let t = Instant::now();
        let mut calls = Vec::new();
        for _ in 0..5 {
            let admin = serve.admin;
            let token = serve.token.clone();
            calls.push(tokio::spawn(async move {
                let admin = admin.ok_or_else(|| anyhow!("no admin address"))?;
                call(admin, "GET", path, Some(&token), Duration::from_secs(300)).await
            }));
        }
        let mut statuses = Vec::new();
        let mut bytes = 0;
        for c in calls {
            match c.await {
                Ok(Ok((s, b))) => {
                    statuses.push(s.to_string());
                    bytes = bytes.max(b.len());
                }
                Ok(Err(e)) => statuses.push(format!("error: {e:#}")),
                Err(e) => statuses.push(format!("task: {e}")),
            }
        }
        let took = t.elapsed();
        done.store(true, Ordering::Relaxed);
        let _ = sampler.join();
        let hwm = serve.kb("VmHWM");
        let peak_kb = if reset {
            hwm.max(peak.load(Ordering::Relaxed))
        } else {
            peak.load(Ordering::Relaxed)
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = serve.kb("VmRSS");
        let ok = statuses.iter().all(|s| s == "200");
        all_ok &= ok;
        println!(
            "{name} ×5: statuses {statuses:?}, {bytes} bytes each, {:.2} s; RSS before {before} kB, peak {peak_kb} kB ({}), after {after} kB",
            took.as_secs_f64(),
            if reset { "VmHWM after clear_refs" } else { "sampled every 5 ms" }
        );
        figures.push(format!(
            "`{name}` ×5 concurrent: {} in {:.1} s ({} each), RSS {} → peak {} → {}",
            if ok {
                "all 200".to_string()
            } else {
                statuses.join(",")
            },
            took.as_secs_f64(),
            if bytes >= 1 << 20 {
                format!("{:.1} MB", bytes as f64 / (1 << 20) as f64)
            } else {
                format!("{} B", n(bytes as u64))
            },
            mb(before),
            mb(peak_kb),
            mb(after)
        ));
    }
    let alive = serve.alive();
    serve.stop().await;
    Ok(vec![Row::new(
        "big ledger served",
        format!(
            "a {:.1} MB ledger ({} lines) made by {} HTTPS requests over 16 connections (twin: a separate `veris twin` process, so the RSS is the proxy's alone), then the admin API asked 5 times at once for each of `/receipt`, `/status`, `/ledger?since=1`; proxy VmRSS before, peak (VmHWM reset before each group) and after",
            size as f64 / (1 << 20) as f64,
            n(lines as u64),
            n(st.ok)
        ),
        all_ok && alive,
        if all_ok && alive { "all answered 200; the proxy stayed up".into() } else { "UNEXPECTED (see figures)".into() },
        format!("RSS after the traffic {}; {}", mb(start_kb), figures.join("; ")),
    )])
}

// ---------------------------------------------------------------- 7. fuzz

async fn fuzz() -> Result<Vec<Row>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let readme = root.join("fuzz/README.md");
    let targets: Vec<String> = std::fs::read_dir(root.join("fuzz/fuzz_targets"))
        .map(|d| {
            let mut v: Vec<String> = d
                .filter_map(|e| e.ok())
                .filter_map(|e| {
                    e.path()
                        .file_stem()
                        .map(|s| s.to_string_lossy().into_owned())
                })
                .filter(|s| s != "common")
                .collect();
            v.sort();
            v
        })
        .unwrap_or_default();
    let text = std::fs::read_to_string(&readme).unwrap_or_default();
    // The "Runs and findings" section: its table rows and numbered findings.
    let runs = text
        .split_once("## Runs and findings")
        .map(|(_, r)| r)
        .unwrap_or("");
    let (runs_part, findings_part) = runs.split_once("### Findings").unwrap_or((runs, ""));
    let findings_part = findings_part.split("\n## ").next().unwrap_or("");
    let findings_part = findings_part.split("\n### ").next().unwrap_or("");
    let table: Vec<&str> = runs_part
        .lines()
        .filter(|l| l.trim_start().starts_with('|'))
        .collect();
    let findings: Vec<&str> = findings_part
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            t.split_once(". ")
                .is_some_and(|(num, _)| !num.is_empty() && num.chars().all(|c| c.is_ascii_digit()))
        })
        .collect();
    for l in table.iter().chain(&findings) {
        println!("{l}");
    }
    Ok(vec![Row::new(
        "fuzz",
        "not run by this program (cargo-fuzz needs nightly): `fuzz/run.sh SECONDS`; see `fuzz/README.md` (Runs and findings) for the hours run".into(),
        true,
        if !readme.is_file() {
            "fuzz/README.md not written yet".into()
        } else if table.len() > 2 {
            format!("runs table in fuzz/README.md ({} rows); {} finding(s) listed", table.len() - 2, findings.len())
        } else {
            format!("no runs recorded in fuzz/README.md yet; {} finding(s) listed", findings.len())
        },
        format!("{} targets: {}", targets.len(), targets.join(", ")),
    )])
}
