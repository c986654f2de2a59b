//! Helpers for the transparent-tier end-to-end tests: a network namespace
//! with a sink (a veth pair whose peer sits in a second, empty namespace, with
//! the TEST-NET prefixes 203.0.113.0/24 and 2001:db8::/32 routed into it, so
//! nothing can leave the machine), commands run inside it with a cleared
//! environment, `veris serve --transparent --install-redirect` started in it,
//! a small local origin (TLS 443 and plain 80) on the namespace's own address,
//! and the SKIP rule (`SKIP: <why>`, or a failure under `VERIS_REQUIRE_ALL=1`).
//!
//! As root the namespaces are `ip netns` ones (veris then takes the root
//! path: it drops to the proxy uid, exempt by uid). Otherwise they are
//! rootless: `unshare -rnm` (a user namespace mapping only uid 0, to us,
//! with its own network and mount namespaces) held open by a `cat`, entered
//! with `nsenter`; veris then exempts its dials by mark. There the sink is a
//! veth pair inside the one namespace, TEST-NET routed via a gateway whose
//! neighbour entry names a MAC nobody has, so those frames are dropped just
//! as the sink drops them. [`Netns::create_rootless`] as root builds the same
//! for an unprivileged uid, so CI (root) runs the rootless path too.
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Deadline for anything a test waits on.
pub const DEADLINE: Duration = Duration::from_secs(30);
/// The namespace's own (non-loopback) address, where the local origin listens.
pub const LOCAL_V4: &str = "10.200.0.1";
/// A vendor address: TEST-NET-3, reachable only through the redirect.
pub const VENDOR_V4: &str = "203.0.113.10";
/// A vendor address: IPv6 documentation prefix, reachable only through the redirect.
pub const VENDOR_V6: &str = "2001:db8::10";
/// PATH inside the namespace.
pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

// The binary, the skip rule, VERIS_REQUIRE_ALL, temp dirs and the
// effective uid are shared with every end-to-end test.
#[allow(unused_imports)]
pub use super::{bin, euid, require_all, skip, TempDir};

/// A program on PATH or in the sbin dirs.
pub fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(PATH.split(':'))
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}

/// Why the namespace tests cannot run here, if they cannot: neither root
/// nor a working `unshare -rn`, or a tool missing.
pub fn unavailable() -> Option<String> {
    let root = euid() == 0;
    let mut tools = vec!["ip", "nft", "curl", "openssl"];
    if !root {
        tools.extend(["unshare", "nsenter"]);
    }
    for tool in tools {
        if which(tool).is_none() {
            return Some(format!(
                "`{tool}` is not installed (nftables / iproute2 / curl / openssl / util-linux)"
            ));
        }
    }
    if !root && !rootless_works(None) {
        return Some("the transparent-tier tests need root or a working `unshare -rn` (unprivileged user namespaces are disabled here)".into());
    }
    None
}

/// `setpriv` arguments that run a command as `uid` (group `uid`, no others).
fn as_uid_args(uid: u32) -> Vec<String> {
    vec![
        format!("--reuid={uid}"),
        format!("--regid={uid}"),
        "--clear-groups".into(),
    ]
}

/// A command run as `as_uid` (through `setpriv`, which needs root) or as we are.
fn command_as(as_uid: Option<u32>, program: &str) -> Command {
    match as_uid {
        Some(uid) => {
            let mut cmd = Command::new("setpriv");
            cmd.args(as_uid_args(uid)).arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

/// Whether `unshare -rnm` works (for `as_uid`, when given).
pub fn rootless_works(as_uid: Option<u32>) -> bool {
    command_as(as_uid, "unshare")
        .args(["-rnm", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The Python interpreter that has `requests` (see [`python_with_module`]).
pub fn python_with_requests() -> Option<PathBuf> {
    python_with_module("requests")
}

/// The Python interpreter that can import `module`, resolved with the
/// caller's environment (pyenv shims need it) so it can then run with a
/// cleared one.
pub fn python_with_module(module: &str) -> Option<PathBuf> {
    let out = Command::new("python3")
        .args([
            "-c",
            &format!("import sys, {module}; print(sys.executable)"),
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let exe = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!exe.is_empty()).then(|| PathBuf::from(exe))
}

/// `openssl req` making a throwaway self-signed P-256 certificate (1 day).
pub fn self_signed(cert: &Path, key: &Path, subject: &str, ext: Option<&str>) -> Command {
    let mut cmd = Command::new("openssl");
    cmd.args([
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-days",
        "1",
        "-subj",
        subject,
    ]);
    if let Some(ext) = ext {
        cmd.args(["-addext", ext]);
    }
    cmd.arg("-keyout")
        .arg(key)
        .arg("-out")
        .arg(cert)
        .stderr(Stdio::null());
    cmd
}

/// Runs a setup command to completion; panics when it fails.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("running a setup command");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A workload namespace with loopback, an address of its own and a sink for
/// TEST-NET traffic; deleted on drop.
pub struct Netns {
    /// The `ip netns` name (root mode; a label when rootless).
    pub name: String,
    kind: Kind,
}

enum Kind {
    /// `ip netns` namespaces: the workload's and the sink's.
    Root { sink: String },
    /// A `unshare -rnm` namespace held by `holder`, owned by `as_uid` (set
    /// up through `setpriv` by root) or by us.
    Rootless { holder: Child, as_uid: Option<u32> },
}

static NS_COUNTER: AtomicU64 = AtomicU64::new(0);

impl Netns {
    /// Root mode as root, rootless otherwise (see the module comment).
    pub fn create(tag: &str) -> Netns {
        if euid() != 0 {
            return Netns::create_rootless(tag, None);
        }
        let id = format!(
            "{}-{}",
            std::process::id(),
            NS_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let ns = Netns {
            name: format!("veris-{tag}-{id}"),
            kind: Kind::Root {
                sink: format!("veris-sink-{id}"),
            },
        };
        let w = ns.name.as_str();
        let Kind::Root { sink } = &ns.kind else {
            unreachable!("built as root above")
        };
        let s = sink.as_str();
        run_ok(Command::new("ip").args(["netns", "add", w]));
        run_ok(Command::new("ip").args(["netns", "add", s]));
        // Created inside the namespace, so the names never clash with the host's.
        run_ok(Command::new("ip").args([
            "-n", w, "link", "add", "vw0", "type", "veth", "peer", "name", "vs0", "netns", s,
        ]));
        for (n, dev) in [(w, "lo"), (w, "vw0"), (s, "lo"), (s, "vs0")] {
            run_ok(Command::new("ip").args(["-n", n, "link", "set", dev, "up"]));
        }
        run_ok(Command::new("ip").args(["-n", w, "addr", "add", "10.200.0.1/24", "dev", "vw0"]));
        run_ok(Command::new("ip").args(["-n", s, "addr", "add", "10.200.0.2/24", "dev", "vs0"]));
        run_ok(Command::new("ip").args([
            "-n",
            w,
            "addr",
            "add",
            "fd00:200::1/64",
            "dev",
            "vw0",
            "nodad",
        ]));
        run_ok(Command::new("ip").args([
            "-n",
            s,
            "addr",
            "add",
            "fd00:200::2/64",
            "dev",
            "vs0",
            "nodad",
        ]));
        run_ok(Command::new("ip").args([
            "-n",
            w,
            "route",
            "add",
            "203.0.113.0/24",
            "via",
            "10.200.0.2",
        ]));
        run_ok(Command::new("ip").args([
            "-n",
            w,
            "-6",
            "route",
            "add",
            "2001:db8::/32",
            "via",
            "fd00:200::2",
        ]));
        ns
    }

    /// A rootless namespace (`unshare -rnm`) owned by `as_uid` (root only:
    /// entered through `setpriv`) or by us, with the addresses and routes of
    /// [`Netns::create`]; the sink is a veth pair in the same namespace and a
    /// gateway neighbour with a MAC nobody has.
    pub fn create_rootless(tag: &str, as_uid: Option<u32>) -> Netns {
        let name = format!(
            "veris-{tag}-{}-{}",
            std::process::id(),
            NS_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        // `cat` on a pipe: the namespace lives until we close it or die.
        let holder = command_as(as_uid, "unshare")
            .args(["-rnm", "cat"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting `unshare -rnm cat`");
        // setpriv and unshare exec in place: the pid becomes `cat` once the
        // namespaces exist and the uid map is written.
        let comm = format!("/proc/{}/comm", holder.id());
        let deadline = Instant::now() + DEADLINE;
        while std::fs::read_to_string(&comm).map_or(true, |c| c.trim() != "cat") {
            assert!(
                Instant::now() < deadline,
                "`unshare -rnm` did not start within {DEADLINE:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let ns = Netns {
            name,
            kind: Kind::Rootless { holder, as_uid },
        };
        for args in [
            "link set lo up",
            "link add vw0 type veth peer name vs0",
            "link set vw0 up",
            "link set vs0 up",
            "addr add 10.200.0.1/24 dev vw0",
            "addr add fd00:200::1/64 dev vw0 nodad",
            "neigh add 10.200.0.2 lladdr 02:00:00:00:00:02 dev vw0 nud permanent",
            "-6 neigh add fd00:200::2 lladdr 02:00:00:00:00:02 dev vw0 nud permanent",
            "route add 203.0.113.0/24 via 10.200.0.2",
            "-6 route add 2001:db8::/32 via fd00:200::2",
        ] {
            run_ok(ns.command("ip").args(args.split_whitespace()));
        }
        ns
    }

    /// Rootless only: bind-mounts `hosts` over /etc/hosts in the namespace's
    /// own mount namespace, for every later command (what
    /// `/etc/netns/<name>/hosts` does for `ip netns exec`).
    pub fn bind_hosts(&self, hosts: &Path) {
        assert!(
            self.rootless(),
            "ip netns namespaces use /etc/netns/<name>/hosts"
        );
        self.own(hosts);
        run_ok(
            self.command("mount")
                .arg("--bind")
                .arg(hosts)
                .arg("/etc/hosts"),
        );
    }

    /// True for a rootless namespace (veris exempts its dials by mark there).
    pub fn rootless(&self) -> bool {
        matches!(self.kind, Kind::Rootless { .. })
    }

    /// `program` inside the sink namespace (root mode only): where traffic
    /// that escaped the redirect would arrive. Gives the sink the vendor
    /// addresses first, so something there can listen on them.
    pub fn sink_command(&self, program: impl AsRef<std::ffi::OsStr>) -> Option<Command> {
        let Kind::Root { sink } = &self.kind else {
            return None;
        };
        for (family, addr) in [
            ("-4", format!("{VENDOR_V4}/32")),
            ("-6", format!("{VENDOR_V6}/128")),
        ] {
            let _ = Command::new("ip")
                .args(["-n", sink, family, "addr", "add", &addr, "dev", "lo"])
                .stderr(Stdio::null())
                .status();
        }
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", sink])
            .arg(program)
            .env_clear()
            .env("PATH", PATH)
            .stdin(Stdio::null());
        Some(cmd)
    }

    /// Hands `path` (recursively) to the uid owning a rootless namespace
    /// made by root for another uid; nothing otherwise.
    pub fn own(&self, path: &Path) {
        if let Kind::Rootless {
            as_uid: Some(uid), ..
        } = self.kind
        {
            chown_tree(path, uid).expect("handing a test file to the namespace's uid");
        }
    }

    /// `program args…` inside the namespace, environment cleared but for PATH
    /// and HOME (the machine's CA variables must not reach clients).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = match &self.kind {
            Kind::Root { .. } => {
                let mut cmd = Command::new("ip");
                cmd.args(["netns", "exec", &self.name]);
                cmd
            }
            Kind::Rootless { holder, as_uid } => {
                // As uid 0 of the namespace (our uid, mapped), with its
                // capabilities: what `unshare -rn` itself gives a command.
                let mut cmd = command_as(*as_uid, "nsenter");
                let target = holder.id().to_string();
                cmd.args(["-t", &target, "-U", "-n", "-m"])
                    .args(["--preserve-credentials", "--"]);
                cmd
            }
        };
        cmd.arg(program)
            .env_clear()
            .env("PATH", PATH)
            .env("HOME", "/root")
            .stdin(Stdio::null());
        cmd
    }

    /// Runs a command to completion, bounded by `timeout` (killed after it).
    pub fn output(&self, cmd: &mut Command, timeout: Duration) -> Output {
        let child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning a command in the namespace");
        wait_output(child, timeout)
    }

    /// The packet count of the `quic_dropped` counter, if the table exists.
    pub fn quic_dropped(&self) -> Option<u64> {
        self.nft_counter("quic_dropped")
    }

    /// The packet count of a named counter of `table inet veris`, if it exists.
    pub fn nft_counter(&self, name: &str) -> Option<u64> {
        let out = self
            .command("nft")
            .args(["list", "counter", "inet", "veris", name])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut words = text.split_whitespace();
        words.find(|w| *w == "packets")?;
        words.next()?.parse().ok()
    }

    /// Whether `table inet veris` exists in the namespace.
    pub fn has_veris_table(&self) -> bool {
        self.command("nft")
            .args(["list", "table", "inet", "veris"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        match &mut self.kind {
            Kind::Root { sink } => {
                for n in [&self.name, &*sink] {
                    let _ = Command::new("ip").args(["netns", "del", n]).status();
                }
            }
            Kind::Rootless { holder, .. } => {
                // The namespace goes with its last process.
                let _ = holder.kill();
                let _ = holder.wait();
            }
        }
    }
}

/// `chown -R uid:uid` without following symlinks.
fn chown_tree(path: &Path, uid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid))?;
    if std::fs::symlink_metadata(path)?.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid)?;
        }
    }
    Ok(())
}

/// Waits for a child with a deadline, killing it when the deadline passes.
pub fn wait_output(mut child: Child, timeout: Duration) -> Output {
    let deadline = Instant::now() + timeout;
    // Readers on threads so a chatty child cannot block on a full pipe.
    let out = child.stdout.take().map(|mut s| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = std::io::Read::read_to_end(&mut s, &mut v);
            v
        })
    });
    let err = child.stderr.take().map(|mut s| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = std::io::Read::read_to_end(&mut s, &mut v);
            v
        })
    });
    let status = loop {
        match child.try_wait().expect("waiting for a child") {
            Some(status) => break status,
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                break child.wait().expect("reaping a killed child");
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    Output {
        status,
        stdout: out.and_then(|t| t.join().ok()).unwrap_or_default(),
        stderr: err.and_then(|t| t.join().ok()).unwrap_or_default(),
    }
}

/// `veris serve --transparent --install-redirect` inside a namespace.
pub struct Veris {
    child: Option<Child>,
    pub state: PathBuf,
    pub ready: serde_json::Value,
    pub stderr_path: PathBuf,
}

impl Veris {
    pub fn start(ns: &Netns, dir: &TempDir, extra: &[&str]) -> Veris {
        Veris::start_bin(ns, dir, extra, &bin())
    }

    /// [`Veris::start`] with the binary at `program`.
    pub fn start_bin(ns: &Netns, dir: &TempDir, extra: &[&str], program: &Path) -> Veris {
        let state = dir.join("state");
        let ready_file = state.join("ready.json");
        std::fs::create_dir_all(&state).unwrap();
        let stderr_path = dir.join("veris.stderr");
        let stderr = std::fs::File::create(&stderr_path).unwrap();
        ns.own(dir.path());
        let mut cmd = ns.command(program);
        cmd.args([
            "serve",
            "--transparent",
            "--install-redirect",
            "--listen",
            "127.0.0.1:0",
            "--https-listen",
            "[::]:0",
            "--http-listen",
            "[::]:0",
            "--quic-listen",
            "[::]:0",
            "--grace",
            "1",
        ])
        .arg("--state-dir")
        .arg(&state)
        .arg("--ready-file")
        .arg(&ready_file)
        .args(extra)
        .env("VERIS_LOG", "info")
        .stdout(Stdio::null())
        .stderr(stderr);
        let mut child = cmd.spawn().expect("starting veris");
        let deadline = Instant::now() + DEADLINE;
        let ready = loop {
            if let Ok(text) = std::fs::read_to_string(&ready_file) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                    break v;
                }
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "veris exited ({status}) before it was ready: {}",
                    std::fs::read_to_string(&stderr_path).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "veris not ready within {DEADLINE:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        Veris {
            child: Some(child),
            state,
            ready,
            stderr_path,
        }
    }

    pub fn ca(&self) -> PathBuf {
        PathBuf::from(self.ready["ca"].as_str().expect("ready file names the CA"))
    }

    pub fn ledger(&self) -> Vec<serde_json::Value> {
        ledger(&self.state)
    }

    /// SIGTERM, then waits (bounded) for the exit.
    pub fn stop(mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = child.try_wait().expect("waiting for veris") {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                panic!("veris did not exit within {DEADLINE:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Veris {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The lines of the state dir's ledger, then those of every `veris run`
/// ledger under `runs/` (each run writes its own).
pub fn ledger(state: &Path) -> Vec<serde_json::Value> {
    let mut files = vec![state.join("ledger.jsonl")];
    if let Ok(runs) = std::fs::read_dir(state.join("runs")) {
        let mut run_files: Vec<PathBuf> = runs
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("ledger.jsonl"))
            .collect();
        run_files.sort();
        files.extend(run_files);
    }
    files
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A local origin in the namespace: TLS on `LOCAL_V4:443` (self-signed for
/// `origin.test`) and plain HTTP on `LOCAL_V4:80`, both answering `origin ok`.
pub struct Origin {
    child: Child,
    _stdout: BufReader<ChildStdout>,
    pub cert: PathBuf,
}

const ORIGIN_PY: &str = r#"
import http.server, socketserver, ssl, sys, threading
cert, key, addr = sys.argv[1], sys.argv[2], sys.argv[3]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"origin ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
tls = S((addr, 443), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
plain = S((addr, 80), H)
threading.Thread(target=plain.serve_forever, daemon=True).start()
print("ready", flush=True)
tls.serve_forever()
"#;

impl Origin {
    pub fn start(ns: &Netns, dir: &TempDir, python: &Path) -> Origin {
        let cert = dir.join("origin.crt");
        let key = dir.join("origin.key");
        run_ok(&mut self_signed(
            &cert,
            &key,
            "/CN=origin.test",
            Some("subjectAltName=DNS:origin.test"),
        ));
        let script = dir.join("origin.py");
        std::fs::write(&script, ORIGIN_PY).unwrap();
        ns.own(dir.path());
        let mut child = ns
            .command(python)
            .arg(&script)
            .arg(&cert)
            .arg(&key)
            .arg(LOCAL_V4)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting the origin");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        // Blocks until the origin printed `ready` (bound both ports) or died.
        let _ = stdout.read_line(&mut line);
        assert_eq!(line.trim(), "ready", "the local origin did not start");
        Origin {
            child,
            _stdout: stdout,
            cert,
        }
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fake vendor for the sink namespace: listens on `VENDOR_V4` for TCP on
/// the ports in argv[2] and UDP on those in argv[3] (comma-separated),
/// appends `tcp PORT` / `udp PORT` to argv[1] for every hit, prints `ready`.
pub const FAKE_VENDOR_PY: &str = r#"
import socket, sys, threading
log, tcp_ports, udp_ports = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
lock = threading.Lock()
def hit(what):
    with lock:
        with open(log, "a") as f:
            f.write(what + "\n")
def tcp(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("203.0.113.10", int(port))); s.listen(16)
    while True:
        c, _ = s.accept(); hit("tcp " + port); c.close()
def udp(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("203.0.113.10", int(port)))
    while True:
        s.recvfrom(65535); hit("udp " + port)
for p in tcp_ports:
    threading.Thread(target=tcp, args=(p,), daemon=True).start()
for p in udp_ports:
    threading.Thread(target=udp, args=(p,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"#;

/// A TLS client that sends its ClientHello one byte per TCP segment, then a
/// GET over HTTP/1.1; prints the status line and the number of segments.
pub const SPLIT_HELLO_PY: &str = r#"
import socket, ssl, sys
host, addr, ca, path = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
ctx = ssl.create_default_context(cafile=ca)
ctx.set_alpn_protocols(["http/1.1"])
inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
tls = ctx.wrap_bio(inc, out, server_hostname=host)
fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
s = socket.socket(fam, socket.SOCK_STREAM)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
s.settimeout(10)
s.connect((addr, 443))
segments = 0
for _ in range(100):
    try:
        tls.do_handshake()
        break
    except ssl.SSLWantReadError:
        data = out.read()
        if segments == 0:
            for b in data:
                s.send(bytes([b]))
                segments += 1
        else:
            s.sendall(data)
        chunk = s.recv(65536)
        if not chunk:
            sys.exit("closed during the handshake")
        inc.write(chunk)
s.sendall(out.read())
tls.write(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: " + host.encode() + b"\r\nConnection: close\r\n\r\n")
s.sendall(out.read())
resp = b""
for _ in range(10000):
    try:
        piece = tls.read(65536)
        if not piece:
            break
        resp += piece
        continue
    except ssl.SSLWantReadError:
        pass
    except ssl.SSLZeroReturnError:
        break
    chunk = s.recv(65536)
    if not chunk:
        break
    inc.write(chunk)
print(resp.split(b"\r\n")[0].decode(), segments)
"#;

/// Python `requests` with no proxy variables: the vendor name resolves to a
/// TEST-NET address (getaddrinfo patched), so only the redirect reaches it.
pub const REQUESTS_PY: &str = r#"
import socket, sys
import requests
name, addr, url, ca = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
real = socket.getaddrinfo
def resolve(host, *args, **kwargs):
    return real(addr if host == name else host, *args, **kwargs)
socket.getaddrinfo = resolve
r = requests.get(url, verify=ca, timeout=10)
print(r.status_code, r.json().get("object"))
"#;

/// UDP 443 datagrams (QUIC-shaped) to both TEST-NET vendors; prints how many
/// the kernel refused.
pub const QUIC_PY: &str = r#"
import socket, sys
refused = 0
for fam, addr in ((socket.AF_INET, sys.argv[1]), (socket.AF_INET6, sys.argv[2])):
    s = socket.socket(fam, socket.SOCK_DGRAM)
    try:
        s.sendto(b"\xc0" + b"\x00" * 1199, (addr, 443))
    except OSError:
        refused += 1
print(refused)
"#;

/// A real QUIC client (aioquic): connects to `argv[1]:443` with server name
/// `argv[2]`, giving up after `argv[3]` seconds; prints `connected` or
/// `no answer`. Certificate checks are off: nothing should ever answer.
pub const AIOQUIC_PY: &str = r#"
import asyncio, ssl, sys
from aioquic.asyncio.client import connect
from aioquic.quic.configuration import QuicConfiguration

async def attempt():
    config = QuicConfiguration(is_client=True, alpn_protocols=["h3"], server_name=sys.argv[2])
    config.verify_mode = ssl.CERT_NONE
    config.idle_timeout = float(sys.argv[3])
    async with connect(sys.argv[1], 443, configuration=config):
        return "connected"

try:
    print(asyncio.run(asyncio.wait_for(attempt(), float(sys.argv[3]))))
except (asyncio.TimeoutError, ConnectionError):
    print("no answer")
"#;

/// Sends a hand-built ClientHello for `origin.test` carrying the Encrypted
/// Client Hello extension (0xfe0d) to `addr:443` and reads until the peer
/// closes; prints the bytes received (the origin answers with an alert).
pub const ECH_HELLO_PY: &str = r#"
import os, socket, struct, sys
addr = sys.argv[1]
def ext(kind, data):
    return struct.pack("!HH", kind, len(data)) + data
name = b"origin.test"
sni = ext(0, struct.pack("!HBH", len(name) + 3, 0, len(name)) + name)
versions = ext(0x002B, b"\x02\x03\x04")
ech = ext(0xFE0D, b"\x00" + os.urandom(40))
exts = sni + versions + ech
body = b"\x03\x03" + os.urandom(32) + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
body += struct.pack("!H", len(exts)) + exts
hs = b"\x01" + struct.pack("!I", len(body))[1:] + body
record = b"\x16\x03\x01" + struct.pack("!H", len(hs)) + hs
s = socket.create_connection((addr, 443), timeout=10)
s.sendall(record)
got = 0
for _ in range(1000):
    chunk = s.recv(4096)
    if not chunk:
        break
    got += len(chunk)
print(got)
"#;

/// The unprivileged uid the workload runs as in the sink-namespace tests.
pub const WORKLOAD_UID: u32 = 65534;

/// Why the tests with a fake vendor in the sink namespace cannot run here:
/// they need root (the sink is an `ip netns` namespace), python3 and setpriv.
pub fn sink_unavailable() -> Option<String> {
    if let Some(why) = unavailable() {
        return Some(why);
    }
    if euid() != 0 {
        return Some("these tests need root (a sink namespace for the fake vendor)".into());
    }
    if which("python3").is_none() || which("setpriv").is_none() {
        return Some("python3 and setpriv (util-linux) are needed".into());
    }
    None
}

/// `program` in the namespace as the unprivileged workload uid.
pub fn workload(ns: &Netns, program: &str) -> Command {
    let mut cmd = ns.command("setpriv");
    cmd.args([
        &format!("--reuid={WORKLOAD_UID}"),
        &format!("--regid={WORKLOAD_UID}"),
        "--clear-groups",
        program,
    ]);
    cmd
}

/// Lets the workload uid read what the test wrote and the trust material.
pub fn readable(dir: &TempDir) {
    let status = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(status.success());
}

/// The fake vendor in the sink namespace (root mode): it listens on
/// `VENDOR_V4` for TCP on `tcp` and UDP on `udp` (comma-separated ports)
/// and logs every hit (`tcp PORT`, `udp PORT`): traffic that escaped.
pub struct FakeVendor {
    child: Child,
    log: PathBuf,
}

impl FakeVendor {
    pub fn start(ns: &Netns, dir: &TempDir, tcp: &str, udp: &str) -> FakeVendor {
        let script = dir.join("vendor.py");
        std::fs::write(&script, FAKE_VENDOR_PY).unwrap();
        let log = dir.join("vendor.log");
        std::fs::write(&log, "").unwrap();
        let mut child = ns
            .sink_command("python3")
            .expect("root mode has a sink namespace")
            .arg(&script)
            .arg(&log)
            .args([tcp, udp])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting the fake vendor");
        let mut line = String::new();
        let _ = BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line);
        assert_eq!(line.trim(), "ready", "the fake vendor did not start");
        FakeVendor { child, log }
    }

    /// Every hit so far, one per line.
    pub fn hits(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for FakeVendor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `/etc/netns/<name>/hosts`, which `ip netns exec` mounts over /etc/hosts
/// for commands in that namespace only (veris included); removed on drop.
pub struct NetnsHosts {
    dir: PathBuf,
    created_parent: bool,
}

impl NetnsHosts {
    pub fn write(ns: &str, entries: &str) -> NetnsHosts {
        let parent = Path::new("/etc/netns");
        let created_parent = !parent.exists();
        let dir = parent.join(ns);
        std::fs::create_dir_all(&dir).expect("creating /etc/netns/<name>");
        let hosts = format!("127.0.0.1 localhost\n::1 localhost\n{entries}");
        std::fs::write(dir.join("hosts"), hosts).expect("writing the namespace's hosts file");
        NetnsHosts {
            dir,
            created_parent,
        }
    }
}

impl Drop for NetnsHosts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        if self.created_parent {
            // Fails harmlessly when another namespace's files are still there.
            let _ = std::fs::remove_dir(Path::new("/etc/netns"));
        }
    }
}
