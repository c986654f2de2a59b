//! Shared helpers for end-to-end tests of the `veris` binary: temp dirs that
//! clean up after themselves, child processes that are killed when a test
//! fails, bounded polling, a cleared client environment (the machine sets CA
//! variables that would otherwise leak into every client), `veris serve`
//! started on port 0 with its ready file read back (and its admin API
//! called with the token it wrote), raw HTTP/1.1 over loopback, and the SKIP
//! rule (`SKIP: <why>` and pass, unless `VERIS_REQUIRE_ALL=1`, where it fails).
//!
//! Every module of the e2e test binary uses it (`use crate::support;`). Submodules by
//! job: [`netns`] (network namespaces, the transparent tier and its local
//! origin and fake vendor), [`gateway`] (`veris gateway`, its sandboxes
//! and receipts, and redsocks as the sandbox platform), [`fake_twin`] (a twin whose request log lies),
//! [`tmux`] (a private tmux server for the TUI), [`nats`] (a nats-server for the fleet),
//! [`webhook_app`] (an app verifying webhooks with the `stripe` SDK).
#![allow(dead_code)]

pub mod fake_twin;
pub mod gateway;
pub mod nats;
pub mod netns;
pub mod tmux;
pub mod webhook_app;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Default deadline for anything a test waits on.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// The binary under test (the release binary under `cargo test --release`).
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_veris"))
}

/// True when CI asked for every test to really run.
pub fn require_all() -> bool {
    std::env::var("VERIS_REQUIRE_ALL").is_ok_and(|v| v == "1")
}

/// Prints `SKIP: <why>` so the caller can return; panics instead under
/// `VERIS_REQUIRE_ALL=1`. Use as `if cond { return skip("..."); }`.
pub fn skip(why: &str) {
    if require_all() {
        panic!("VERIS_REQUIRE_ALL=1 and this test would skip: {why}");
    }
    println!("SKIP: {why}");
    eprintln!("SKIP: {why}");
    record_skip(why);
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

/// A unique directory under the system temp dir (mode 0755, so another uid,
/// the proxy's or the workload's, can reach it), removed on drop.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "veris-e2e-{label}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).expect("creating a temp dir");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .expect("chmod the temp dir");
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.path.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("VERIS_KEEP_TEMP").is_none() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Clears the environment down to PATH, HOME and a locale, so no ambient
/// proxy or CA variable (SSL_CERT_FILE, CURL_CA_BUNDLE, NO_PROXY, ...)
/// reaches the child. Add what the test means to set afterwards.
pub fn client_env(cmd: &mut Command) -> &mut Command {
    cmd.env_clear();
    for var in ["PATH", "HOME", "PYENV_ROOT", "PYENV_VERSION"] {
        if let Some(v) = std::env::var_os(var) {
            cmd.env(var, v);
        }
    }
    cmd.env("LANG", "C.UTF-8")
}

/// `veris ARGS` with a cleared environment.
pub fn veris<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = Command::new(bin());
    client_env(&mut cmd);
    cmd.args(args);
    cmd
}

/// A command with a cleared environment.
pub fn command(program: &str) -> Command {
    let mut cmd = Command::new(program);
    client_env(&mut cmd);
    cmd
}

/// Whether `program args` runs and exits 0 (with a cleared environment).
pub fn tool_works(program: &str, args: &[&str]) -> bool {
    let mut cmd = command(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    match cmd.spawn() {
        Ok(child) => {
            let mut child = Guard::new(child);
            matches!(child.wait_timeout(DEADLINE), Some(s) if s.success())
        }
        Err(_) => false,
    }
}

/// `python3` with `requests` importable, or a skip reason.
pub fn python_requests() -> Result<(), String> {
    if tool_works("python3", &["-c", "import requests"]) {
        Ok(())
    } else {
        Err("python3 with `requests` not available (apt install python3-requests)".into())
    }
}

/// `python3` with `module` importable, or a skip reason.
pub fn python_module(module: &str) -> Result<(), String> {
    if tool_works("python3", &["-c", &format!("import {module}")]) {
        Ok(())
    } else {
        Err(format!(
            "python3 with `{module}` not available (pip install {module})"
        ))
    }
}

/// `curl` present, or a skip reason.
pub fn curl() -> Result<(), String> {
    if tool_works("curl", &["--version"]) {
        Ok(())
    } else {
        Err("curl not installed".into())
    }
}

/// Polls `f` until it returns `Some`, every 20 ms, up to `timeout`; panics
/// naming `what` when the deadline passes.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child process that is killed (SIGKILL) and reaped when dropped, so a
/// failing test leaves nothing running.
pub struct Guard {
    child: Option<Child>,
}

impl Guard {
    pub fn new(child: Child) -> Guard {
        Guard { child: Some(child) }
    }

    pub fn spawn(cmd: &mut Command) -> Guard {
        Guard::new(
            cmd.spawn()
                .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}")),
        )
    }

    pub fn id(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    pub fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("child already reaped")
    }

    /// Sends a signal by name (`TERM`, `INT`, `KILL`) with kill(1).
    pub fn signal(&self, sig: &str) {
        signal(self.id(), sig);
    }

    /// Waits up to `timeout`; `None` when the child is still running.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            match self.child().try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) => {}
                Err(e) => panic!("waiting for a child: {e}"),
            }
            if start.elapsed() > timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for exit within the default deadline, or panics.
    pub fn wait(&mut self) -> ExitStatus {
        self.wait_timeout(DEADLINE)
            .unwrap_or_else(|| panic!("child {} did not exit within {DEADLINE:?}", self.id()))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Sends a signal by name to a pid with kill(1).
pub fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("running kill");
    assert!(status.success(), "kill -{sig} {pid} failed");
}

/// Runs a command to completion within `timeout`, capturing stdout and stderr
/// (read on threads so a chatty child cannot block on a full pipe).
pub fn output_within(cmd: &mut Command, timeout: Duration) -> Output {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut guard = Guard::spawn(cmd);
    let mut out = guard.child().stdout.take().expect("piped stdout");
    let mut err = guard.child().stderr.take().expect("piped stderr");
    let out_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let status = match guard.wait_timeout(timeout) {
        Some(s) => s,
        None => {
            drop(guard);
            let stderr = err_t.join().unwrap_or_default();
            panic!(
                "{cmd:?} did not finish within {timeout:?}; stderr:\n{}",
                String::from_utf8_lossy(&stderr)
            );
        }
    };
    Output {
        status,
        stdout: out_t.join().unwrap_or_default(),
        stderr: err_t.join().unwrap_or_default(),
    }
}

/// `output_within` with the default deadline.
pub fn output(cmd: &mut Command) -> Output {
    output_within(cmd, DEADLINE)
}

/// Stdout and stderr as text, for assertion messages.
pub fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A value in kB from `/proc/<pid>/status` (`VmRSS`, `VmHWM`).
pub fn proc_status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Reads a JSON file once it exists and parses (writers rename it into place).
pub fn wait_json_file(path: &Path, timeout: Duration) -> serde_json::Value {
    wait_for(&format!("{}", path.display()), timeout, || {
        let text = std::fs::read_to_string(path).ok()?;
        serde_json::from_str(&text).ok()
    })
}

/// One HTTP/1.1 request with `Connection: close` (`extra_headers` are whole
/// `Name: value\r\n` lines); (status, body), the body de-chunked. Status 0
/// when no status line came back.
pub fn http(
    addr: SocketAddr,
    method: &str,
    target: &str,
    host: &str,
    extra_headers: &str,
    body: &str,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    s.set_read_timeout(Some(DEADLINE))
        .expect("setting a read timeout");
    let req = format!(
        "{method} {target} HTTP/1.1\r\nHost: {host}\r\n{extra_headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())
        .unwrap_or_else(|e| panic!("writing to {addr}: {e}"));
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

/// The data of a chunked body, up to its last chunk (bounded in chunks).
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

/// A `veris serve` on port 0 with its own state dir, killed on drop.
pub struct Serve {
    pub dir: TempDir,
    pub state: PathBuf,
    pub ready: serde_json::Value,
    pub proxy_url: String,
    pub twin: String,
    pub ca: PathBuf,
    pub env_file: PathBuf,
    pub stderr_file: PathBuf,
    pub process: Guard,
}

/// The workload uid the harness declares to `serve` (`--workload-uid`):
/// the uid `nobody`, never the proxy's. Without a declared other uid, a live
/// receipt is at most `unverified (workload may share the proxy uid)`, which
/// is what [`Serve::start_same_uid`] tests; the other tests are about the
/// other checks.
pub const DECLARED_WORKLOAD_UID: &str = "65534";

impl Serve {
    /// Starts `veris serve` with `extra` flags and waits for its ready file.
    pub fn start(label: &str, extra: &[&str]) -> Serve {
        let mut flags = vec!["--workload-uid", DECLARED_WORKLOAD_UID];
        flags.extend_from_slice(extra);
        Serve::start_in(TempDir::new(label), &flags)
    }

    /// `veris serve` with no workload uid declared: the workload may share
    /// the proxy's uid, as in a plain `serve` started by the user whose code
    /// then runs.
    pub fn start_same_uid(label: &str, extra: &[&str]) -> Serve {
        Serve::start_in(TempDir::new(label), extra)
    }

    /// Like [`Serve::start`], in a dir the caller prepared (its `state`
    /// subdir may already exist, e.g. as a small mount).
    pub fn start_in(dir: TempDir, extra: &[&str]) -> Serve {
        let state = dir.join("state");
        let ready_file = dir.join("ready.json");
        let env_file = dir.join("client.env");
        let stderr_file = dir.join("serve.stderr");
        let mut cmd = veris(["serve", "--listen", "127.0.0.1:0", "--state-dir"]);
        cmd.arg(&state)
            .arg("--ready-file")
            .arg(&ready_file)
            .arg("--write-env")
            .arg(&env_file)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("serve.stdout")).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr_file).expect("stderr file"));
        let mut process = Guard::spawn(&mut cmd);
        let ready = wait_for("the serve ready file", DEADLINE, || {
            if let Ok(Some(status)) = process.child().try_wait() {
                panic!(
                    "veris serve exited early ({status}): {}",
                    std::fs::read_to_string(&stderr_file).unwrap_or_default()
                );
            }
            let text = std::fs::read_to_string(&ready_file).ok()?;
            serde_json::from_str::<serde_json::Value>(&text).ok()
        });
        let proxy_url = ready["proxy_url"].as_str().expect("proxy_url").to_string();
        let twin = ready["twin"].as_str().expect("twin").to_string();
        let ca = state.join("trust").join("ca.pem");
        assert!(ca.is_file(), "no CA at {}", ca.display());
        assert!(env_file.is_file(), "the env file is written before ready");
        Serve {
            dir,
            state,
            ready,
            proxy_url,
            twin,
            ca,
            env_file,
            stderr_file,
            process,
        }
    }

    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// The proxy's listen address (from `proxy_url`).
    pub fn proxy_addr(&self) -> SocketAddr {
        addr_of(&self.proxy_url)
    }

    /// The admin API's address (from the ready file).
    pub fn admin(&self) -> SocketAddr {
        addr_of(
            self.ready["admin"]
                .as_str()
                .expect("admin in the ready file"),
        )
    }

    /// The admin token the proxy wrote to its state dir.
    pub fn token(&self) -> String {
        std::fs::read_to_string(self.state.join("admin.token"))
            .expect("reading admin.token")
            .trim()
            .to_string()
    }

    /// An admin call with the right token; (status, body).
    pub fn admin_call(&self, method: &str, path: &str) -> (u16, String) {
        let auth = format!("Authorization: Bearer {}\r\n", self.token());
        http(self.admin(), method, path, "127.0.0.1", &auth, "")
    }

    /// A vendor request through the proxy as absolute-form plain HTTP; the status.
    pub fn vendor(&self, method: &str, host: &str, path: &str) -> u16 {
        let target = format!("http://{host}{path}");
        http(self.proxy_addr(), method, &target, host, "", "").0
    }

    /// SIGTERM and wait within the deadline: the proxy writes its shutdown
    /// seal and removes its admin files. A second call does nothing.
    pub fn stop(&mut self) {
        if let Ok(Some(_)) = self.process.child().try_wait() {
            return;
        }
        self.process.signal("TERM");
        if self.process.wait_timeout(DEADLINE).is_none() {
            panic!(
                "veris serve did not stop on SIGTERM within {DEADLINE:?}; stderr:\n{}",
                self.stderr()
            );
        }
    }

    pub fn ledger(&self) -> PathBuf {
        self.state.join("ledger.jsonl")
    }

    /// Ledger lines parsed.
    pub fn ledger_lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.ledger())
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("ledger line is JSON"))
            .collect()
    }

    /// `curl -x proxy --cacert ca` with a cleared env plus `args`.
    pub fn curl(&self) -> Command {
        let mut cmd = command("curl");
        cmd.args(["-sS", "--max-time", "20", "-x", &self.proxy_url, "--cacert"])
            .arg(&self.ca);
        cmd
    }

    /// The twin's `/veris/requests` for a service (sandbox from the ready file).
    pub fn twin_requests(&self, service: &str) -> serde_json::Value {
        let sandbox = self.ready["sandbox_id"].as_str().unwrap_or("sbx_local");
        let url = format!(
            "{}/s/{sandbox}/{service}/veris/requests?limit=1000",
            self.twin
        );
        let out = output(command("curl").args(["-sS", "--max-time", "10", &url]));
        assert!(out.status.success(), "GET {url}: {:?}", text(&out));
        serde_json::from_slice(&out.stdout).expect("twin requests JSON")
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_file).unwrap_or_default()
    }
}

/// Starts `cmd` (a `veris twin …` command) with stdout piped and returns
/// the process and the URL it prints as its first line; the read is on a
/// thread, so a twin that never prints cannot hang the test past the deadline.
pub fn spawn_twin(cmd: &mut Command) -> (Guard, String) {
    use std::io::{BufRead, BufReader};
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut process = Guard::spawn(cmd);
    let stdout = process.child().stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let url = rx
        .recv_timeout(DEADLINE)
        .expect("veris twin printed its URL")
        .trim()
        .to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{url:?}");
    (process, url)
}

/// `127.0.0.1:port` out of `http://127.0.0.1:port`.
fn addr_of(url: &str) -> SocketAddr {
    url.trim_start_matches("http://")
        .parse()
        .unwrap_or_else(|e| panic!("{url} is not http://<addr>: {e}"))
}

/// Why a network namespace with only `lo` cannot be made here (`unshare
/// -rn`: user and network namespaces), if it cannot.
pub fn lo_only_unavailable() -> Option<String> {
    if !tool_works("unshare", &["-rn", "true"]) {
        return Some("`unshare -rn` does not work here (user namespaces)".into());
    }
    if !tool_works("ip", &["-V"]) {
        return Some("`ip` (iproute2) is not installed".into());
    }
    None
}

/// `program` in a fresh network namespace whose only interface is `lo`
/// (up), with a cleared environment: a client that ignores the proxy finds
/// no route and no resolver, so it fails instead of reaching anything.
pub fn lo_only(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = command("unshare");
    cmd.args(["-rn", "sh", "-c", "ip link set lo up && exec \"$@\"", "sh"])
        .arg(program);
    cmd
}

/// Appends one (client, tier, outcome, reason) line to the file
/// `VERIS_CLIENTS_LOG` names, if set: `scripts/clients-md` renders
/// CLIENTS.md from those lines. `outcome` is `works` or `fails`.
pub fn record_client(client: &str, tier: &str, outcome: &str, reason: &str) {
    use std::io::Write as _;
    let Some(log) = std::env::var_os("VERIS_CLIENTS_LOG") else {
        return;
    };
    let line = serde_json::json!({
        "client": client,
        "tier": tier,
        "outcome": outcome,
        "reason": reason,
        "test": format!(
            "{}::{}",
            env!("CARGO_CRATE_NAME"),
            std::thread::current().name().unwrap_or("?")
        ),
    });
    // One write on an O_APPEND file: lines of parallel tests do not mix.
    let _ = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(log)
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
}

/// This process's effective uid (a run's workload uid: a root workload in
/// the proxy's own namespaces is never `verified`).
pub fn euid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .expect("reading /proc/self/status")
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("an effective uid in /proc/self/status")
}

/// A twin stand-in on loopback: a thread per connection reads the request
/// head (bounded, with the default deadline) and hands the stream and the
/// head to `answer`. Its URL (`http://127.0.0.1:port`).
pub fn stand_in_twin(answer: fn(&mut TcpStream, &[u8])) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    let url = format!(
        "http://{}",
        listener.local_addr().expect("listener address")
    );
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let _ = stream.set_read_timeout(Some(DEADLINE));
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 65536 {
                    match stream.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                answer(&mut stream, &head);
            });
        }
    });
    url
}

/// `curl` POSTing a charge to Stripe (the twin answers it), the client
/// command of many runs: proxy and CA come from the run's environment.
pub const CURL_CHARGE: &[&str] = &[
    "curl",
    "-sS",
    "--max-time",
    "20",
    "https://api.stripe.com/v1/charges",
    "-d",
    "amount=100",
    "-d",
    "currency=usd",
];

/// Whether `veris __confine -- true` works, or why not (Landlock's network
/// rules need Linux 6.7+).
pub fn landlock_ready() -> Result<(), String> {
    let out = output(&mut veris(["__confine", "--", "true"]));
    let (_, stderr) = text(&out);
    match out.status.code() {
        Some(0) => Ok(()),
        _ if stderr.contains("cannot confine the command") => Err(format!(
            "Landlock network rules unavailable: {}",
            stderr.trim()
        )),
        code => panic!("`veris __confine -- true` exited {code:?}: {stderr}"),
    }
}

/// JSON text parsed; panics showing the text.
pub fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("{e}: {s}"))
}

/// Pins the seal key `veris receipt --json` reports for `state` and checks
/// that `veris receipt --require-verified --key` with it says verified.
pub fn assert_verified_with_its_key(state: &Path) {
    let key = json(
        &text(&output(
            veris(["receipt", "--json", "--state-dir"]).arg(state),
        ))
        .0,
    )["seal_key"]
        .as_str()
        .unwrap()
        .to_string();
    let out = output(
        veris([
            "receipt",
            "--require-verified",
            "--key",
            &key,
            "--state-dir",
        ])
        .arg(state),
    );
    let (stdout, _) = text(&out);
    assert!(stdout.contains("integrity: verified"), "{stdout}");
    assert_eq!(out.status.code(), Some(0), "{stdout}");
}
