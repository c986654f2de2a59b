//! Helpers for the integrity end-to-end tests: temp dirs, `veris serve` on
//! port 0 (stopped with SIGTERM so it writes its shutdown seal), raw HTTP/1.1
//! over loopback (plain-HTTP vendor requests through the proxy, admin calls),
//! a fake twin whose request log can be made to lie, and bounded polling.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const DEADLINE: Duration = Duration::from_secs(20);

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_veris"))
}

pub fn require_all() -> bool {
    std::env::var("VERIS_REQUIRE_ALL").is_ok_and(|v| v == "1")
}

pub fn skip(why: &str) {
    if require_all() {
        panic!("VERIS_REQUIRE_ALL=1 and this test would skip: {why}");
    }
    println!("SKIP: {why}");
}

pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "veris-integrity-{label}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `veris` with a cleared environment (the machine sets CA variables).
pub fn veris<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = Command::new(bin());
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", std::env::temp_dir())
        .args(args);
    cmd
}

/// Runs a command to completion within the deadline (killed after it).
pub fn output(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!("command did not finish within {DEADLINE:?}: {cmd:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Polls `f` until it gives a value, at most `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    for _ in 0..100_000 {
        if let Some(v) = f() {
            return v;
        }
        if start.elapsed() > timeout {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("timed out waiting for {what}");
}

/// A running `veris serve`.
pub struct Serve {
    pub dir: TempDir,
    pub ready: serde_json::Value,
    child: Option<Child>,
}

impl Serve {
    pub fn start(label: &str, extra: &[&str]) -> Serve {
        let dir = TempDir::new(label);
        let state = dir.path().join("state");
        let ready_path = dir.path().join("ready.json");
        let mut cmd = veris(["serve", "--listen", "127.0.0.1:0", "--state-dir"]);
        cmd.arg(&state)
            .arg("--ready-file")
            .arg(&ready_path)
            .args(extra)
            .env("VERIS_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let ready = wait_for("the ready file", DEADLINE, || {
            if let Ok(Some(status)) = child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                panic!("veris serve exited early ({status}): {err}");
            }
            let text = std::fs::read_to_string(&ready_path).ok()?;
            serde_json::from_str::<serde_json::Value>(&text).ok()
        });
        Serve {
            dir,
            ready,
            child: Some(child),
        }
    }

    pub fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }
    pub fn ledger(&self) -> PathBuf {
        self.state().join("ledger.jsonl")
    }
    pub fn proxy(&self) -> SocketAddr {
        let url = self.ready["proxy_url"].as_str().unwrap();
        url.trim_start_matches("http://").parse().unwrap()
    }
    pub fn admin(&self) -> SocketAddr {
        let url = self.ready["admin"].as_str().unwrap();
        url.trim_start_matches("http://").parse().unwrap()
    }
    pub fn token(&self) -> String {
        std::fs::read_to_string(self.state().join("admin.token"))
            .unwrap()
            .trim()
            .to_string()
    }

    /// An admin call with the right token; (status, body).
    pub fn admin_call(&self, method: &str, path: &str) -> (u16, String) {
        let auth = format!("Authorization: Bearer {}\r\n", self.token());
        http(self.admin(), method, path, "127.0.0.1", &auth, "")
    }

    /// A vendor request through the proxy as absolute-form plain HTTP.
    pub fn vendor(&self, method: &str, host: &str, path: &str) -> u16 {
        let target = format!("http://{host}{path}");
        http(self.proxy(), method, &target, host, "", "").0
    }

    /// The ledger's lines as JSON.
    pub fn lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.ledger())
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// SIGTERM and wait: the proxy seals and removes its admin files.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let start = Instant::now();
            while child.try_wait().unwrap().is_none() {
                if start.elapsed() > DEADLINE {
                    let _ = child.kill();
                    panic!("veris serve did not stop on SIGTERM");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One HTTP/1.1 request with `Connection: close`; (status, body).
pub fn http(
    addr: SocketAddr,
    method: &str,
    target: &str,
    host: &str,
    extra_headers: &str,
    body: &str,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    let req = format!(
        "{method} {target} HTTP/1.1\r\nHost: {host}\r\n{extra_headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = match text.split_once("\r\n\r\n") {
        Some((head, rest))
            if head
                .to_ascii_lowercase()
                .contains("transfer-encoding: chunked") =>
        {
            dechunk(rest)
        }
        Some((_, rest)) => rest.to_string(),
        None => String::new(),
    };
    (status, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    for _ in 0..100_000 {
        let Some((size, rest)) = s.split_once("\r\n") else {
            break;
        };
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A fake twin on loopback: answers every vendor request `200 {}` and serves
/// `/veris/requests` from what it saw, minus the first `hide` vendor rows
/// (a twin whose log does not account for a request).
pub struct FakeTwin {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl FakeTwin {
    pub fn start(hide: usize) -> FakeTwin {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        std::thread::spawn(move || {
            let rows: Rows = Arc::new(std::sync::Mutex::new(Vec::new()));
            while !flag.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((s, _)) => {
                        let rows = rows.clone();
                        std::thread::spawn(move || serve_one(s, &rows, hide));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        FakeTwin { addr, stop }
    }
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for FakeTwin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

type Rows = Arc<std::sync::Mutex<Vec<(String, String)>>>;

/// Answers the requests on one connection (keep-alive) until it closes.
fn serve_one(mut s: TcpStream, rows: &Rows, hide: usize) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(DEADLINE));
    let mut buf = Vec::new();
    for _ in 0..1000 {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            if buf.len() > 65536 {
                return;
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut parts = head.split_whitespace();
        let (method, target) = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        );
        if method == "PRI" {
            return; // the proxy's h2c probe: not offered
        }
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .unwrap_or(0);
        while buf.len() < head_end + len {
            let mut chunk = [0u8; 4096];
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..head_end + len);
        let path = target.split('?').next().unwrap_or("").to_string();
        // /s/{sandbox}/{service}/rest
        let segs: Vec<&str> = path.splitn(5, '/').collect();
        let rest = if segs.len() == 5 {
            format!("/{}", segs[4])
        } else {
            "/".into()
        };
        let mut rows = rows.lock().unwrap();
        let body = if rest == "/veris/requests" {
            let list: Vec<serde_json::Value> = rows
                .iter()
                .enumerate()
                .skip(hide)
                .map(|(i, (m, p))| {
                    serde_json::json!({"id": i + 1, "ts": "2026-11-29T00:00:00.000Z", "method": m, "path": p, "status": 200, "tier": "handler", "duration_ms": 0})
                })
                .collect();
            serde_json::json!({ "requests": list }).to_string()
        } else if rest.starts_with("/veris/") {
            r#"{"status":"ok"}"#.to_string()
        } else {
            rows.push((method.clone(), rest));
            "{}".to_string()
        };
        drop(rows);
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if s.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}
