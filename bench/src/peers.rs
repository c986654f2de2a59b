//! The processes a run talks to, each in its own process so that CPU time and
//! memory are per process: the upstream (`veris twin --tls`), veris
//! (`veris serve --twin https://…`), and the peers — the hudsucker proxy in
//! `bench/peers/hudsucker` (built on demand, its own workspace) and
//! `mitmdump` from PATH.
//!
//! Everything listens on 127.0.0.1 and names `api.stripe.com` only as a host
//! the proxies route to the twin: veris runs `--mode strict`, the hudsucker
//! peer answers other hosts itself, and mitmdump connects lazily (only to the
//! twin its script rewrote the request to) without looking up upstream
//! certificates. A [`Child`] is killed when dropped (also on panic), and the
//! [`Workdir`] under the temp dir is removed.

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::load::{SANDBOX, VENDOR_HOST};

/// How long a process may take to say it is ready.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A temp dir removed when dropped.
pub struct Workdir(pub PathBuf);

impl Workdir {
    pub fn new(tag: &str) -> Result<Workdir> {
        let path = std::env::temp_dir().join(format!("veris-bench-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Workdir(path))
    }
}

impl Drop for Workdir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed (SIGKILL) and reaped when dropped. Its stderr goes
/// to `log`, shown when it fails to start.
pub struct Child {
    pub name: &'static str,
    inner: std::process::Child,
    log: PathBuf,
}

impl Child {
    pub fn spawn(name: &'static str, mut cmd: Command, log: PathBuf) -> Result<Child> {
        let err =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(err);
        let inner = cmd
            .spawn()
            .with_context(|| format!("starting {name} ({:?})", cmd.get_program()))?;
        Ok(Child { name, inner, log })
    }

    pub fn pid(&self) -> u32 {
        self.inner.id()
    }

    /// The first line the child prints, read on a thread that keeps draining
    /// stdout afterwards (the child never blocks on a full pipe).
    fn first_line(&mut self) -> Result<String> {
        let stdout = self
            .inner
            .stdout
            .take()
            .ok_or_else(|| anyhow!("{}: stdout already taken", self.name))?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        });
        match rx.recv_timeout(START_TIMEOUT) {
            Ok(line) if !line.trim().is_empty() => Ok(line.trim().to_string()),
            _ => Err(self.failed("printed no address")),
        }
    }

    /// Stdout drained and dropped (for children whose output means nothing).
    pub fn drain_stdout(&mut self) {
        if let Some(mut stdout) = self.inner.stdout.take() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while matches!(stdout.read(&mut buf), Ok(n) if n > 0) {}
            });
        }
    }

    /// An error naming what went wrong, with the tail of the child's stderr.
    fn failed(&mut self, what: &str) -> anyhow::Error {
        let status = match self.inner.try_wait() {
            Ok(Some(s)) => format!(" (exited: {s})"),
            _ => String::new(),
        };
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(8).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        anyhow!(
            "{} {what}{status}; its stderr ends:\n  {}",
            self.name,
            tail.join("\n  ")
        )
    }

    /// The JSON of the ready file the child writes at `path` once it serves.
    pub fn ready_file(&mut self, path: &Path) -> Result<serde_json::Value> {
        let started = Instant::now();
        let text = loop {
            // Written whole (a rename), so a file that parses is complete.
            if let Ok(text) = std::fs::read_to_string(path) {
                break text;
            }
            if self.exited() || started.elapsed() > START_TIMEOUT {
                return Err(self.failed("wrote no ready file"));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    fn exited(&mut self) -> bool {
        matches!(self.inner.try_wait(), Ok(Some(_)))
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.inner.kill();
        let _ = self.inner.wait();
    }
}

/// A `nats-server` with JetStream on a free loopback port, its store under
/// `dir`: the process and its `nats://` URL. Errors when it is not
/// installed or does not listen within 20 s.
pub fn start_nats(dir: &Path) -> Result<(Child, String)> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("finding a free port")?
        .port();
    let mut cmd = Command::new("nats-server");
    cmd.args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(dir.join("nats-store"));
    let mut child = Child::spawn("nats-server", cmd, dir.join("nats-server.log"))
        .context("nats-server is not installed (apt-get install nats-server)")?;
    child.drain_stdout();
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("nats-server did not listen on 127.0.0.1:{port} within 20 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((child, format!("nats://127.0.0.1:{port}")))
}

/// The `veris` binary: `$VERIS_BIN`, else `target/release/veris` of this workspace.
pub fn veris_binary() -> Result<PathBuf> {
    let bin = match std::env::var_os("VERIS_BIN") {
        Some(p) => PathBuf::from(p),
        None => workspace_root().join("target/release/veris"),
    };
    if !bin.is_file() {
        bail!(
            "no veris binary at {}. Next: cargo build --release first (or set VERIS_BIN)",
            bin.display()
        );
    }
    Ok(bin)
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The upstream: `veris twin --tls`, its leaf for 127.0.0.1 minted by the CA
/// in `<state>/ca`, which veris (same state dir) trusts for its twin.
pub struct Twin {
    pub child: Child,
    pub addr: SocketAddr,
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// The CA its leaf chains to (PEM).
    pub ca: PathBuf,
}

pub fn start_twin(bin: &Path, state: &Path, dir: &Path) -> Result<Twin> {
    let mut cmd = Command::new(bin);
    cmd.arg("twin")
        .arg("--tls")
        .arg("--state-dir")
        .arg(state)
        .args(["--listen", "127.0.0.1:0"]);
    let mut child = Child::spawn("twin", cmd, dir.join("twin.log"))?;
    let url = child.first_line()?;
    let addr = url
        .strip_prefix("https://")
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| anyhow!("the twin printed {url:?}, not https://ADDR"))?;
    Ok(Twin {
        child,
        addr,
        url,
        ca: state.join("ca/veris-ca.pem"),
    })
}

/// A proxy under test: where it listens and which CA its leaves chain to.
pub struct Proxy {
    pub child: Child,
    pub addr: SocketAddr,
    pub ca: PathBuf,
    /// veris's ledger, for the request count check.
    pub ledger: Option<PathBuf>,
}

/// `veris serve` in front of the twin, sharing its state dir (and so its CA).
pub fn start_veris(bin: &Path, state: &Path, dir: &Path, twin: &Twin) -> Result<Proxy> {
    let ready = dir.join("veris-ready.json");
    let mut cmd = Command::new(bin);
    cmd.arg("serve")
        .arg("--state-dir")
        .arg(state)
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--twin", &twin.url, "--sandbox", SANDBOX])
        .args(["--services", "stripe", "--mode", "strict"])
        .arg("--ready-file")
        .arg(&ready)
        .env("VERIS_LOG", "warn");
    let mut child = Child::spawn("veris", cmd, dir.join("veris.log"))?;
    child.drain_stdout();
    let json = child.ready_file(&ready)?;
    let url = json["proxy_url"].as_str().unwrap_or_default();
    let addr = url
        .strip_prefix("http://")
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| anyhow!("{} has proxy_url {url:?}, not http://ADDR", ready.display()))?;
    Ok(Proxy {
        child,
        addr,
        ca: state.join("ca/veris-ca.pem"),
        ledger: Some(state.join("ledger.jsonl")),
    })
}

/// Why a peer is not in this run, printed instead of its figures.
pub type Skip = String;

/// The hudsucker peer, built first if `build` (cargo is quick when it is
/// up to date). Err: why it is skipped.
pub fn start_hudsucker(dir: &Path, twin: &Twin, build: bool) -> Result<Proxy, Skip> {
    let root = workspace_root().join("bench/peers/hudsucker");
    let bin = root.join("target/release/veris-bench-hudsucker");
    if build {
        let log = dir.join("hudsucker-build.log");
        eprintln!(
            "building the hudsucker peer (the first build takes a few minutes; log: {})",
            log.display()
        );
        let out = std::fs::File::create(&log).map_err(|e| format!("hudsucker: {e}"))?;
        let err = out.try_clone().map_err(|e| format!("hudsucker: {e}"))?;
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--release", "--manifest-path"])
            .arg(root.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(root.join("target"))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .status()
            .map_err(|e| format!("hudsucker: running cargo: {e}"))?;
        if !status.success() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(6).collect();
            return Err(format!(
                "hudsucker: the build failed ({status}) — skipped; it ends:\n  {}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n  ")
            ));
        }
    }
    if !bin.is_file() {
        return Err(format!(
            "hudsucker: no {} — skipped (drop --no-build to build it)",
            bin.display()
        ));
    }
    let ca = dir.join("hudsucker-ca.pem");
    let mut cmd = Command::new(&bin);
    cmd.arg("--twin")
        .arg(&twin.url)
        .arg("--twin-ca")
        .arg(&twin.ca)
        .arg("--ca-out")
        .arg(&ca)
        .args(["--sandbox", SANDBOX])
        // hudsucker logs every refused or failed forward at error level.
        .env("RUST_LOG", "off");
    let started = (|| -> Result<Proxy> {
        let mut child = Child::spawn("hudsucker", cmd, dir.join("hudsucker.log"))?;
        let url = child.first_line()?;
        let addr = url
            .strip_prefix("http://")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| anyhow!("the hudsucker peer printed {url:?}, not http://ADDR"))?;
        Ok(Proxy {
            child,
            addr,
            ca,
            ledger: None,
        })
    })();
    started.map_err(|e| format!("hudsucker: {e:#} — skipped"))
}

/// `mitmdump` from PATH, its script rewriting `api.stripe.com` requests to
/// the twin. Err: why it is skipped.
pub fn start_mitmdump(dir: &Path, twin: &Twin) -> Result<Proxy, Skip> {
    let Some(bin) = on_path("mitmdump") else {
        return Err("mitmdump: not on PATH — skipped (pip install mitmproxy)".into());
    };
    let start = || -> Result<Proxy> {
        let confdir = dir.join("mitmproxy");
        std::fs::create_dir_all(&confdir)?;
        let script = dir.join("route.py");
        std::fs::write(&script, route_script(twin.addr))?;
        // mitmdump prints nothing about its port when quiet: pick a free one.
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut cmd = Command::new(&bin);
        cmd.args([
            "--listen-host",
            "127.0.0.1",
            "--listen-port",
            &port.to_string(),
            "-q",
        ])
        .arg("--set")
        .arg(format!("confdir={}", confdir.display()))
        .arg("--set")
        .arg(format!(
            "ssl_verify_upstream_trusted_ca={}",
            twin.ca.display()
        ))
        // Never dial the vendor: connect only when a request is routed
        // (to the twin), and do not fetch upstream certificates.
        .args([
            "--set",
            "connection_strategy=lazy",
            "--set",
            "upstream_cert=false",
        ])
        .arg("-s")
        .arg(&script);
        let mut child = Child::spawn("mitmdump", cmd, dir.join("mitmdump.log"))?;
        child.drain_stdout();
        let ca = confdir.join("mitmproxy-ca-cert.pem");
        let started = Instant::now();
        while !(ca.is_file() && TcpStream::connect(addr).is_ok()) {
            if child.exited() || started.elapsed() > START_TIMEOUT {
                return Err(child.failed("did not start listening"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Proxy {
            child,
            addr,
            ca,
            ledger: None,
        })
    };
    start().map_err(|e| format!("mitmdump: {e:#} — skipped"))
}

/// The mitmproxy addon: vendor requests to the twin, as veris sends them.
fn route_script(twin: SocketAddr) -> String {
    format!(
        r#"# Written by veris-bench: route {host} to the twin like veris does.
from mitmproxy import http

def request(flow: http.HTTPFlow) -> None:
    if flow.request.pretty_host != "{host}":
        flow.response = http.Response.make(403, b"", {{}})
        return
    flow.request.scheme = "https"
    flow.request.host = "{ip}"
    flow.request.port = {port}
    flow.request.path = "/s/{sandbox}/stripe" + flow.request.path
    flow.request.headers["x-veris-original-host"] = "{host}"
    flow.request.headers["x-veris-service"] = "stripe"
    flow.request.headers["x-veris-sandbox"] = "{sandbox}"
"#,
        host = VENDOR_HOST,
        ip = twin.ip(),
        port = twin.port(),
        sandbox = SANDBOX,
    )
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}
