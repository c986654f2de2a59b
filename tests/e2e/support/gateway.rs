//! Helpers for the gateway-tier tests (DESIGN §13): `veris gateway` started
//! with its ready file (on the host or inside a [`Netns`]), sandboxes
//! registered with `veris gateway add-sandbox`, each sandbox's receipt and
//! ledger, and a sandbox platform stand-in: a network namespace per sandbox
//! whose TCP egress `redsocks` (inside it, behind an nftables `redirect`)
//! tunnels as SOCKS5 with the sandbox's credentials to the gateway on the
//! host, reached over a veth pair. A python3 SOCKS5 stand-in (it logs what
//! it was asked for and answers HTTP itself) proves that platform part
//! without the gateway.
//!
//! Addresses: a [`Platform`] owns an anchor veth pair on the host with one
//! `10.201.N.1/32` address, where the gateway (or the stand-in) listens;
//! each [`SandboxNet`] is a [`Netns`] (with its TEST-NET sink) plus a veth
//! pair `10.201.M.1/30` (host) – `10.201.M.2/30` (namespace) and a route to
//! the anchor address only. The host does not forward (nothing leaves), and
//! vendor names resolve in the namespace to [`VENDOR_V4`], a TEST-NET
//! address routed into the sink: a connection redsocks misses goes nowhere.
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::netns::{run_ok, which, Netns, NetnsHosts, VENDOR_V4};
use super::tmux::{sh_quote, Tmux, TUI_DEADLINE};
use super::{command, output, text, veris, wait_for, Guard, TempDir, DEADLINE};

/// The canary URL a sandbox probes to prove its egress goes through the gateway.
pub const CANARY_URL: &str = "https://canary.veris.internal/__veris/canary";

/// The words a receipt gives a sandbox window with no probe from inside.
pub const NO_PROBE: &str = "no canary probe from the sandbox";

/// The first tool of `tools` not installed, as a skip reason.
pub fn missing(tools: &[&str]) -> Option<String> {
    tools
        .iter()
        .find(|t| which(t).is_none())
        .map(|t| format!("`{t}` is not installed (see .ci/run)"))
}

/// A running `veris gateway`, killed on drop.
pub struct Gateway {
    pub dir: TempDir,
    pub state: PathBuf,
    pub ready: Value,
    /// The SOCKS5 + HTTP proxy listener (the ready file's `listen`).
    pub listen: SocketAddr,
    stderr_file: PathBuf,
    process: Guard,
    /// The `ip netns` namespace it runs in, where its admin API is reached.
    netns: Option<String>,
}

impl Gateway {
    /// `veris gateway --listen LISTEN EXTRA…` on the host.
    pub fn start(label: &str, listen: &str, extra: &[&str]) -> Gateway {
        Gateway::start_in(None, label, listen, extra)
    }

    /// `veris gateway` inside `ns` when given (its dials then reach only
    /// what the namespace reaches), on the host otherwise; waits for the
    /// ready file. Panics with a clear message when the binary has no
    /// `gateway` command.
    pub fn start_in(ns: Option<&Netns>, label: &str, listen: &str, extra: &[&str]) -> Gateway {
        Gateway::start_in_env(ns, label, listen, extra, &[])
    }

    /// [`Gateway::start_in`] with `env` set for the gateway (test knobs
    /// such as `VERIS_WEBHOOK_TIME_SCALE`).
    pub fn start_in_env(
        ns: Option<&Netns>,
        label: &str,
        listen: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Gateway {
        let dir = TempDir::new(label);
        let state = dir.join("state");
        let ready_file = dir.join("ready.json");
        let stderr_file = dir.join("gateway.stderr");
        if let Some(ns) = ns {
            assert!(
                !ns.rootless(),
                "the gateway runs in `ip netns` namespaces only"
            );
        }
        let netns = ns.map(|ns| ns.name.clone());
        let mut cmd = veris_in(netns.as_deref());
        cmd.args(["gateway", "--state-dir"])
            .arg(&state)
            .args(["--listen", listen, "--ready-file"])
            .arg(&ready_file)
            .args(extra)
            .env("VERIS_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("gateway.stdout")).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr_file).expect("stderr file"));
        let mut process = Guard::spawn(&mut cmd);
        let ready = wait_for("the gateway's ready file", DEADLINE, || {
            if let Ok(Some(status)) = process.child().try_wait() {
                let stderr = std::fs::read_to_string(&stderr_file).unwrap_or_default();
                if stderr.contains("unrecognized subcommand") {
                    panic!(
                        "this veris has no `veris gateway` command yet (G1, DESIGN §13): {stderr}"
                    );
                }
                panic!("veris gateway exited early ({status}): {stderr}");
            }
            let text = std::fs::read_to_string(&ready_file).ok()?;
            serde_json::from_str::<Value>(&text).ok()
        });
        let listen = ready["listen"]
            .as_str()
            .unwrap_or_else(|| panic!("no `listen` in the gateway's ready file: {ready}"))
            .parse()
            .unwrap_or_else(|e| panic!("the ready file's `listen` is not ADDR:PORT: {e}: {ready}"));
        assert!(
            ready["admin"].is_string(),
            "no `admin` in the gateway's ready file: {ready}"
        );
        Gateway {
            dir,
            state,
            ready,
            listen,
            stderr_file,
            process,
            netns,
        }
    }

    /// `veris ARGS` where the gateway runs (its namespace, if any).
    pub fn veris(&self, args: &[&str]) -> Command {
        let mut cmd = veris_in(self.netns.as_deref());
        cmd.args(args);
        cmd
    }

    /// The interception CA alone (not a bundle with the system roots): the
    /// only file a sandbox needs to trust.
    pub fn ca(&self) -> PathBuf {
        let candidates = [
            self.ready["ca"].as_str().map(PathBuf::from),
            Some(self.state.join("trust").join("ca.pem")),
            Some(self.state.join("ca").join("ca.pem")),
        ];
        candidates
            .into_iter()
            .flatten()
            .find(|p| p.is_file())
            .unwrap_or_else(|| {
                panic!(
                    "no gateway CA (ready file `ca`, {0}/trust/ca.pem, {0}/ca/ca.pem)",
                    self.state.display()
                )
            })
    }

    /// `veris gateway SUB --state-dir S ARGS…`, run to completion.
    pub fn admin_command(&self, sub: &str, args: &[&str]) -> std::process::Output {
        output(
            self.veris(&["gateway", sub, "--state-dir"])
                .arg(&self.state)
                .args(args),
        )
    }

    /// `add-sandbox ID --services SERVICES`, its plain output: the last
    /// stdout line is the `socks5h://` URL.
    pub fn add_sandbox(&self, id: &str, services: &str) -> Sandbox {
        let out = self.admin_command("add-sandbox", &[id, "--services", services]);
        let (stdout, stderr) = text(&out);
        assert!(
            out.status.success(),
            "add-sandbox {id} failed: {stdout}{stderr}"
        );
        let url = stdout.lines().last().unwrap_or_default().trim().to_string();
        Sandbox::from_url(id, &url)
    }

    /// `add-sandbox ID --services SERVICES --json`: the fields a platform
    /// takes separately, checked against its URL.
    pub fn add_sandbox_json(&self, id: &str, services: &str) -> Sandbox {
        let out = self.admin_command("add-sandbox", &[id, "--services", services, "--json"]);
        let (stdout, stderr) = text(&out);
        assert!(
            out.status.success(),
            "add-sandbox {id} --json failed: {stdout}{stderr}"
        );
        let json = super::json(&stdout);
        for field in ["id", "username", "password", "proxy_url", "read_token"] {
            assert!(
                json[field].is_string(),
                "add-sandbox --json has no string `{field}`: {json}"
            );
        }
        assert_eq!(json["id"], id, "{json}");
        let mut sandbox = Sandbox::from_url(id, json["proxy_url"].as_str().unwrap());
        assert_eq!(json["username"], sandbox.username.as_str(), "{json}");
        assert_eq!(json["password"], sandbox.password.as_str(), "{json}");
        sandbox.canary = json["canary"].as_str().map(str::to_string);
        sandbox.json = Some(json);
        sandbox
    }

    /// `remove-sandbox ID`, which must succeed.
    pub fn remove_sandbox(&self, id: &str) {
        let out = self.admin_command("remove-sandbox", &[id]);
        assert!(
            out.status.success(),
            "remove-sandbox {id}: {:?}",
            text(&out)
        );
    }

    /// `veris receipt --state-dir S --sandbox ID` (text).
    pub fn receipt_text(&self, id: &str) -> String {
        let out = output(
            self.veris(&["receipt", "--state-dir"])
                .arg(&self.state)
                .args(["--sandbox", id]),
        );
        let (stdout, stderr) = text(&out);
        assert!(
            !stdout.trim().is_empty(),
            "no receipt for sandbox {id} ({}): {stderr}",
            out.status
        );
        stdout
    }

    /// `veris receipt --state-dir S --sandbox ID --json`, parsed.
    pub fn receipt_json(&self, id: &str) -> Value {
        let out = output(
            self.veris(&["receipt", "--json", "--state-dir"])
                .arg(&self.state)
                .args(["--sandbox", id]),
        );
        let (stdout, stderr) = text(&out);
        serde_json::from_str(&stdout).unwrap_or_else(|e| {
            panic!(
                "receipt --json --sandbox {id} ({}) is not JSON ({e}): {stdout}{stderr}",
                out.status
            )
        })
    }

    /// The sandbox's own ledger file: `S/sandboxes/ID/ledger.jsonl`, or
    /// the one `ledger.jsonl` under S with a path component equal to ID.
    pub fn ledger_file(&self, id: &str) -> PathBuf {
        let usual = self.state.join("sandboxes").join(id).join("ledger.jsonl");
        if usual.is_file() {
            return usual;
        }
        let mut all = Vec::new();
        find_ledgers(&self.state, 0, &mut all);
        let mine: Vec<&PathBuf> = all
            .iter()
            .filter(|p| p.iter().any(|c| c == std::ffi::OsStr::new(id)))
            .collect();
        match mine.as_slice() {
            [one] => (*one).clone(),
            _ => panic!("no single ledger for sandbox {id} under the state dir; ledgers: {all:?}"),
        }
    }

    /// The sandbox's ledger lines, parsed (none before its first line).
    pub fn ledger(&self, id: &str) -> Vec<Value> {
        std::fs::read_to_string(self.ledger_file(id))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("ledger line is JSON"))
            .collect()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_file).unwrap_or_default()
    }

    /// SIGTERM; panics when it does not exit within the deadline.
    pub fn stop(&mut self) {
        if let Ok(Some(_)) = self.process.child().try_wait() {
            return;
        }
        self.process.signal("TERM");
        if self.process.wait_timeout(DEADLINE).is_none() {
            panic!(
                "veris gateway did not stop on SIGTERM within {DEADLINE:?}; stderr:\n{}",
                self.stderr()
            );
        }
    }
}

/// The `veris` binary with a cleared environment, inside the `ip netns`
/// namespace `netns` when given.
fn veris_in(netns: Option<&str>) -> Command {
    match netns {
        Some(name) => {
            let mut cmd = command("ip");
            cmd.args(["netns", "exec", name]).arg(super::bin());
            cmd
        }
        None => veris(Vec::<&str>::new()),
    }
}

/// Every `ledger.jsonl` under `dir` (bounded depth).
fn find_ledgers(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    if depth > 4 {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            find_ledgers(&path, depth + 1, out);
        } else if path.file_name().is_some_and(|n| n == "ledger.jsonl") {
            out.push(path);
        }
    }
}

/// A registered sandbox: its credentials and proxy address.
#[derive(Clone, Debug)]
pub struct Sandbox {
    pub id: String,
    pub username: String,
    pub password: String,
    /// `host:port` of the gateway listener, as the URL names it.
    pub addr: String,
    /// `socks5h://USER:PASS@HOST:PORT` as add-sandbox printed it.
    pub proxy_url: String,
    /// The canary token, when `--json` gave one.
    pub canary: Option<String>,
    /// The whole `--json` answer, when asked for.
    pub json: Option<Value>,
}

impl Sandbox {
    /// From `socks5h://USER:PASS@HOST:PORT`.
    pub fn from_url(id: &str, url: &str) -> Sandbox {
        let rest = url.strip_prefix("socks5h://").unwrap_or_else(|| {
            panic!("add-sandbox {id}: last line is not a socks5h:// URL: {url:?}")
        });
        let (userinfo, addr) = rest
            .rsplit_once('@')
            .unwrap_or_else(|| panic!("no USER:PASS@ in {url:?}"));
        let (user, pass) = userinfo
            .split_once(':')
            .unwrap_or_else(|| panic!("no USER:PASS in {url:?}"));
        let username = percent_decode(user);
        assert_eq!(username, id, "the URL's user names the sandbox: {url}");
        Sandbox {
            id: id.to_string(),
            username,
            password: percent_decode(pass),
            addr: addr.trim_end_matches('/').to_string(),
            proxy_url: url.to_string(),
            canary: None,
            json: None,
        }
    }

    /// The proxy URL for `scheme` (`socks5h` or `http`).
    pub fn url(&self, scheme: &str) -> String {
        format!(
            "{scheme}://{}:{}@{}",
            self.username, self.password, self.addr
        )
    }

    /// The same URL with another password.
    pub fn url_with_password(&self, scheme: &str, password: &str) -> String {
        format!("{scheme}://{}:{password}@{}", self.username, self.addr)
    }
}

/// `%XX` sequences decoded (what a URL's userinfo may carry).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The POST /v1/charges entries of the receipt's stripe service.
pub fn charges(receipt: &Value) -> Vec<Value> {
    receipt["services"]["stripe"]["entries"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e["method"] == "POST" && e["path"] == "/v1/charges")
        .collect()
}

/// The Stripe charges endpoint the tests call.
pub const HTTPS_CHARGES: &str = "https://api.stripe.com/v1/charges";

/// `curl` (cleared env, so no SSL_CERT_FILE & co) POSTing a Stripe charge
/// to `target` through `proxy` trusting only `ca`; (succeeded, HTTP
/// status, stderr).
pub fn curl_charge(proxy: &str, target: &str, ca: &Path) -> (bool, String, String) {
    curl_charge_via(proxy, None, target, ca)
}

/// [`curl_charge`] to the stripe twin through an `https://` proxy (CONNECT
/// inside TLS) whose certificate curl checks against `proxy_ca`.
pub fn curl_charge_over_tls(proxy: &str, proxy_ca: &Path, ca: &Path) -> (bool, String, String) {
    curl_charge_via(proxy, Some(proxy_ca), HTTPS_CHARGES, ca)
}

fn curl_charge_via(
    proxy: &str,
    proxy_ca: Option<&Path>,
    target: &str,
    ca: &Path,
) -> (bool, String, String) {
    let mut cmd = command("curl");
    cmd.args([
        "-sS",
        "--max-time",
        "15",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
    ])
    .args(["--proxy", proxy]);
    if let Some(proxy_ca) = proxy_ca {
        cmd.arg("--proxy-cacert").arg(proxy_ca);
    }
    cmd.arg("--cacert")
        .arg(ca)
        .args([target, "-d", "amount=100", "-d", "currency=usd"]);
    let out = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    (out.status.success(), stdout.trim().to_string(), stderr)
}

static SUBNET: AtomicU64 = AtomicU64::new(0);

/// A fresh `10.201.N` prefix and a short unique tag for interface names.
fn next_subnet() -> (String, String) {
    let n = SUBNET.fetch_add(1, Ordering::Relaxed);
    let pid = u64::from(std::process::id());
    let third = (pid * 7 + n) % 250 + 1;
    (format!("10.201.{third}"), format!("{}x{n}", pid % 100_000))
}

/// The host side of the platform: an anchor veth pair holding the address
/// the gateway (or a stand-in) listens on; removed on drop.
pub struct Platform {
    /// The anchor address (`10.201.N.1`).
    pub addr: String,
    link: String,
}

impl Platform {
    pub fn new() -> Platform {
        let (prefix, tag) = next_subnet();
        let link = format!("vga{tag}");
        let peer = format!("vgp{tag}");
        run_ok(
            Command::new("ip").args(["link", "add", &link, "type", "veth", "peer", "name", &peer]),
        );
        let platform = Platform {
            addr: format!("{prefix}.1"),
            link,
        };
        for dev in [&platform.link, &peer] {
            run_ok(Command::new("ip").args(["link", "set", dev, "up"]));
        }
        run_ok(Command::new("ip").args([
            "addr",
            "add",
            &format!("{}/32", platform.addr),
            "dev",
            &platform.link,
        ]));
        platform
    }

    /// A sandbox namespace whose TCP egress redsocks tunnels to `target`
    /// (an address on this platform's anchor) as SOCKS5 with `login` and
    /// `password`; the vendor names in `hosts` (and the canary host)
    /// resolve to [`VENDOR_V4`] inside it.
    pub fn sandbox(
        &self,
        dir: &TempDir,
        tag: &str,
        target: SocketAddr,
        login: &str,
        password: &str,
    ) -> SandboxNet {
        let ns = Netns::create(tag);
        let (prefix, link_tag) = next_subnet();
        let host_if = format!("vgh{link_tag}");
        run_ok(Command::new("ip").args([
            "link", "add", &host_if, "type", "veth", "peer", "name", "vg0", "netns", &ns.name,
        ]));
        let net = SandboxNet {
            ns,
            host_if,
            redsocks: None,
            _hosts: None,
            log: dir.join(format!("redsocks-{tag}.log")),
        };
        let n = net.ns.name.as_str();
        run_ok(Command::new("ip").args(["link", "set", &net.host_if, "up"]));
        run_ok(Command::new("ip").args([
            "addr",
            "add",
            &format!("{prefix}.1/30"),
            "dev",
            &net.host_if,
        ]));
        run_ok(Command::new("ip").args(["-n", n, "link", "set", "vg0", "up"]));
        run_ok(Command::new("ip").args([
            "-n",
            n,
            "addr",
            "add",
            &format!("{prefix}.2/30"),
            "dev",
            "vg0",
        ]));
        run_ok(Command::new("ip").args([
            "-n",
            n,
            "route",
            "add",
            &format!("{}/32", target.ip()),
            "via",
            &format!("{prefix}.1"),
        ]));
        // Every TCP connection but loopback's and redsocks' own to the
        // gateway goes to redsocks, as a platform's host-side tunnel takes it.
        let rules = format!(
            "table ip platform {{\n chain out {{\n  type nat hook output priority -100; policy accept;\n  ip daddr 127.0.0.0/8 return\n  ip daddr {} return\n  meta l4proto tcp redirect to :12345\n }}\n}}\n",
            target.ip()
        );
        let rules_file = dir.join(format!("platform-{tag}.nft"));
        std::fs::write(&rules_file, rules).unwrap();
        run_ok(net.ns.command("nft").arg("-f").arg(&rules_file));
        let conf = format!(
            "base {{ log_debug = off; log_info = on; log = stderr; daemon = off; redirector = iptables; }}\n\
             redsocks {{ local_ip = 127.0.0.1; local_port = 12345; ip = {}; port = {}; type = socks5; login = \"{login}\"; password = \"{password}\"; }}\n",
            target.ip(),
            target.port()
        );
        let conf_file = dir.join(format!("redsocks-{tag}.conf"));
        std::fs::write(&conf_file, conf).unwrap();
        let names = format!(
            "{VENDOR_V4} api.stripe.com\n{VENDOR_V4} api.github.com\n{VENDOR_V4} canary.veris.internal\n"
        );
        let mut net = net;
        net._hosts = Some(NetnsHosts::write(&net.ns.name, &names));
        let child = net
            .ns
            .command("redsocks")
            .arg("-c")
            .arg(&conf_file)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&net.log).unwrap())
            .spawn()
            .expect("starting redsocks in the namespace");
        net.redsocks = Some(child);
        let log = net.log.clone();
        let deadline = Instant::now() + DEADLINE;
        loop {
            let started = std::fs::read_to_string(&log).unwrap_or_default();
            if started.contains("redsocks started") {
                break;
            }
            if let Some(Ok(Some(status))) = net.redsocks.as_mut().map(|c| c.try_wait()) {
                panic!("redsocks exited ({status}): {started}");
            }
            assert!(
                Instant::now() < deadline,
                "redsocks did not start within {DEADLINE:?}: {started}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        net
    }
}

impl Drop for Platform {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.link])
            .stderr(Stdio::null())
            .status();
    }
}

/// A sandbox as its platform runs it: a namespace, its link to the host
/// and the redsocks inside; torn down on drop.
pub struct SandboxNet {
    pub ns: Netns,
    host_if: String,
    redsocks: Option<Child>,
    _hosts: Option<NetnsHosts>,
    /// redsocks' log.
    pub log: PathBuf,
}

impl SandboxNet {
    /// `program` in the namespace, environment cleared but for PATH and HOME.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        self.ns.command(program)
    }

    /// Runs `cmd` (from [`SandboxNet::command`]) within the deadline.
    pub fn output(&self, cmd: &mut Command) -> std::process::Output {
        self.ns.output(cmd, DEADLINE)
    }
}

impl Drop for SandboxNet {
    fn drop(&mut self) {
        if let Some(mut child) = self.redsocks.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .stderr(Stdio::null())
            .status();
    }
}

/// A SOCKS5 server stand-in (RFC 1928 + RFC 1929): accepts only
/// argv[2]/argv[3], appends `connect USER HOST:PORT` or `refused USER` to
/// argv[4], and answers the tunneled HTTP request itself with
/// `stand-in saw USER HOST:PORT` (it dials nothing). Listens on argv[1],
/// prints `ready PORT`. Run after [`PY_LIB`].
pub const SOCKS5_STAND_IN_PY: &str = r#"
import socket, struct, sys, threading
addr, user, password, log = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
lock = threading.Lock()
def note(line):
    with lock:
        with open(log, "a") as f:
            f.write(line + "\n")
def serve(c):
    try:
        c.settimeout(10)
        ver, n = exact(c, 2)
        methods = exact(c, n)
        if ver != 5 or 2 not in methods:
            note("no-auth-offered")
            c.sendall(b"\x05\xff")
            return
        c.sendall(b"\x05\x02")
        _, ulen = exact(c, 2)
        u = exact(c, ulen).decode()
        p = exact(c, exact(c, 1)[0]).decode()
        if (u, p) != (user, password):
            note("refused " + u)
            c.sendall(b"\x01\x01")
            return
        c.sendall(b"\x01\x00")
        ver, cmd, _, atyp = exact(c, 4)
        if atyp == 1:
            host = socket.inet_ntop(socket.AF_INET, exact(c, 4))
        elif atyp == 4:
            host = "[" + socket.inet_ntop(socket.AF_INET6, exact(c, 16)) + "]"
        else:
            host = exact(c, exact(c, 1)[0]).decode()
        port = struct.unpack("!H", exact(c, 2))[0]
        target = "%s:%d" % (host, port)
        note("connect %s %s" % (u, target))
        c.sendall(b"\x05\x00\x00\x01\x00\x00\x00\x00\x00\x00")
        if b"\r\n\r\n" not in read_head(c):
            return
        body = ("stand-in saw %s %s" % (u, target)).encode()
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    except (OSError, EOFError, ValueError):
        pass
    finally:
        c.close()
serve_forever(addr, serve)
"#;

/// A TCP listener on argv[1] (port 0) that appends `hit` to argv[2] for
/// every connection and answers `200 reached`; prints `ready PORT`. Run
/// after [`PY_LIB`].
pub const LISTENER_PY: &str = r#"
import socket, sys, threading
addr, log = sys.argv[1], sys.argv[2]
def serve(c):
    with open(log, "a") as f:
        f.write("hit\n")
    try:
        c.settimeout(5)
        read_head(c)
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\nreached")
    except OSError:
        pass
    c.close()
serve_forever(addr, serve)
"#;

/// A python3 helper process that printed `ready PORT`; killed on drop.
pub struct PyServer {
    child: Child,
    pub port: u16,
    /// The file it appends to.
    pub log: PathBuf,
}

impl PyServer {
    /// Runs `script` (written to `dir`) with `args` (then the log path)
    /// through `cmd` (a python3 command, on the host or in a namespace).
    pub fn start(
        mut cmd: Command,
        dir: &TempDir,
        name: &str,
        script: &str,
        args: &[&str],
    ) -> PyServer {
        let file = py_script(dir.path(), name, script);
        let log = dir.join(format!("{name}.log"));
        std::fs::write(&log, "").unwrap();
        let mut child = cmd
            .arg(&file)
            .args(args)
            .arg(&log)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting a python3 helper");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(DEADLINE).unwrap_or_default();
        let port = line
            .strip_prefix("ready ")
            .and_then(|p| p.trim().parse().ok());
        let Some(port) = port else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the python3 helper {name} did not start: {line:?}");
        };
        PyServer { child, port, log }
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for PyServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Gateway {
    /// SIGTERM, then `veris gateway` again on the same state dir and
    /// listen address (its ready file read anew).
    pub fn restart(&mut self, extra: &[&str]) {
        self.stop();
        self.respawn(extra);
    }

    /// SIGKILL (no final seal, files left behind), then the same as
    /// [`Gateway::restart`].
    pub fn kill_and_restart(&mut self, extra: &[&str]) {
        self.process.signal("KILL");
        if self.process.wait_timeout(DEADLINE).is_none() {
            panic!("veris gateway did not die on SIGKILL");
        }
        self.respawn(extra);
    }

    /// Starts the gateway again in this one's place; the earlier run's
    /// stderr stays in `gateway.stderr.N`.
    fn respawn(&mut self, extra: &[&str]) {
        let ready_file = self.dir.join("ready.json");
        let _ = std::fs::remove_file(&ready_file);
        let mut n = 1;
        while self.dir.join(format!("gateway.stderr.{n}")).exists() {
            n += 1;
        }
        let _ = std::fs::rename(
            &self.stderr_file,
            self.dir.join(format!("gateway.stderr.{n}")),
        );
        let listen = self.listen.to_string();
        let mut cmd = veris_in(self.netns.as_deref());
        cmd.args(["gateway", "--state-dir"])
            .arg(&self.state)
            .args(["--listen", &listen, "--ready-file"])
            .arg(&ready_file)
            .args(extra)
            .env("VERIS_LOG", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(self.dir.join("gateway.stdout")).expect("stdout file"))
            .stderr(std::fs::File::create(&self.stderr_file).expect("stderr file"));
        self.process = Guard::spawn(&mut cmd);
        let stderr_file = self.stderr_file.clone();
        let process = &mut self.process;
        self.ready = wait_for("the restarted gateway's ready file", DEADLINE, || {
            if let Ok(Some(status)) = process.child().try_wait() {
                let stderr = std::fs::read_to_string(&stderr_file).unwrap_or_default();
                panic!("the restarted veris gateway exited early ({status}): {stderr}");
            }
            let text = std::fs::read_to_string(&ready_file).ok()?;
            serde_json::from_str::<Value>(&text).ok()
        });
        assert_eq!(
            self.ready["listen"].as_str(),
            Some(listen.as_str()),
            "the restarted gateway listens where it did: {}",
            self.ready
        );
    }
}

/// Why a test that needs root and `ip netns` namespaces (a platform's
/// sandboxes, or a namespace for the gateway itself) and `tools` cannot
/// run here.
pub fn platform_unavailable(tools: &[&str]) -> Option<String> {
    if let Some(why) = super::netns::unavailable() {
        return Some(why);
    }
    if super::euid() != 0 {
        return Some("the gateway's namespace tests need root (`ip netns`, veth pairs between the host and the namespaces)".into());
    }
    missing(tools)
}

impl Gateway {
    /// The gateway's own admin token (`<state>/admin.token`).
    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.state.join("admin.token"))
            .expect("<state>/admin.token")
            .trim()
            .to_string()
    }

    /// `curl -X METHOD http://ADMIN<path>` (the path sent as written) on
    /// the admin API, with `token` as bearer and `json` as the body: (HTTP
    /// status, body).
    pub fn admin_api(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        json: Option<&str>,
    ) -> (String, String) {
        let admin = self.ready["admin"]
            .as_str()
            .expect("the ready file's admin");
        let mut cmd = command("curl");
        cmd.args(["-sS", "--path-as-is", "--max-time", "10"]).args([
            "-w",
            "\n%{http_code}",
            "-X",
            method,
        ]);
        if let Some(token) = token {
            cmd.args(["-H", &format!("Authorization: Bearer {token}")]);
        }
        if let Some(json) = json {
            cmd.args(["-H", "Content-Type: application/json", "--data", json]);
        }
        let out = output(cmd.arg(format!("http://{admin}{path}")));
        let stdout = text(&out).0;
        let (body, status) = stdout.rsplit_once('\n').unwrap_or(("", stdout.as_str()));
        (status.trim().to_string(), body.to_string())
    }

    /// Polls the admin API (up to [`DEADLINE`]) until it lists sandbox
    /// `id` expired.
    pub fn wait_expired(&self, id: &str) {
        let token = self.admin_token();
        wait_for(&format!("{id} listed as expired"), DEADLINE, || {
            let (_, body) = self.admin_api("GET", "/sandboxes", Some(&token), None);
            let list: Value = serde_json::from_str(&body).ok()?;
            list["sandboxes"]
                .as_array()?
                .iter()
                .any(|s| s["id"] == id && s["expired"] == true)
                .then_some(())
        });
    }
}

/// One curl POST of a charge to [`HTTPS_CHARGES`] through `proxy` (a
/// sandbox's URL) that must be answered 200.
pub fn charge_ok(proxy: &str, ca: &Path, who: &str) {
    charge_ok_to(proxy, HTTPS_CHARGES, ca, who);
}

/// [`charge_ok`] to another `target`.
pub fn charge_ok_to(proxy: &str, target: &str, ca: &Path, who: &str) {
    let (ok, status, stderr) = curl_charge(proxy, target, ca);
    assert!(
        ok && status == "200",
        "{who}: POST {target}: curl ok={ok} status={status:?}: {stderr}"
    );
}

/// The canary probed through `proxy` (a sandbox's URL): its answer.
pub fn probe_canary(proxy: &str, ca: &Path) -> Value {
    let out = output(
        command("curl")
            .args(["-sS", "--max-time", "15", "--proxy", proxy, "--cacert"])
            .arg(ca)
            .arg(CANARY_URL),
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "canary probe: {stdout}{stderr}");
    super::json(&stdout)
}

/// A receipt's integrity status and reason ("" where absent).
pub fn integrity(receipt: &Value) -> (String, String) {
    let word = |k: &str| {
        receipt["integrity"][k]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    (word("status"), word("reason"))
}

/// What the python3 helpers share, put before each script
/// ([`py_script`]): `exact(c, n)` (n bytes or `EOFError`), `read_head(c)`
/// (an HTTP head, at most 64 KiB), `socks5_login(c, user, password)`
/// (RFC 1928 greeting offering USER/PASS, then the RFC 1929 login: the two
/// 2-byte answers) and `serve_forever(addr, serve)` (listens on port 0 of
/// `addr`, prints `ready PORT`, serves each connection in a thread).
pub const PY_LIB: &str = r#"
import socket, sys, threading
def exact(c, n):
    b = b""
    while len(b) < n:
        piece = c.recv(n - len(b))
        if not piece:
            raise EOFError
        b += piece
    return b
def read_head(c):
    head = b""
    while b"\r\n\r\n" not in head and len(head) < 65536:
        piece = c.recv(4096)
        if not piece:
            break
        head += piece
    return head
def socks5_login(c, user, password):
    c.sendall(b"\x05\x01\x02")
    method = exact(c, 2)
    c.sendall(bytes([1, len(user)]) + user + bytes([len(password)]) + password)
    return method, exact(c, 2)
def serve_forever(addr, serve):
    s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 0))
    s.listen(64)
    print("ready", s.getsockname()[1], flush=True)
    while True:
        c, _ = s.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// Writes `script`, after [`PY_LIB`], to `dir/NAME.py`; its path.
pub fn py_script(dir: &Path, name: &str, script: &str) -> PathBuf {
    let file = dir.join(format!("{name}.py"));
    std::fs::write(&file, format!("{PY_LIB}{script}")).expect("writing a python3 helper");
    file
}

impl Gateway {
    /// `veris tui --state-dir S --sandbox ID EXTRA…` in a tmux pane of
    /// `width`x`height` (a tmux server of its own in `dir`, its log in
    /// `dir/tui.log`), returned once the header is live on the sandbox.
    pub fn tui(
        &self,
        dir: &TempDir,
        id: &str,
        (width, height): (u16, u16),
        extra: &[&str],
    ) -> Tmux {
        let tmux = Tmux::start(dir.path(), width, height);
        let mut line = format!(
            "{} tui --state-dir {} --sandbox {} --log-file {}",
            sh_quote(&super::bin().display().to_string()),
            sh_quote(&self.state.display().to_string()),
            sh_quote(id),
            sh_quote(&dir.join("tui.log").display().to_string()),
        );
        for arg in extra {
            line.push(' ');
            line.push_str(&sh_quote(arg));
        }
        tmux.respawn(&line);
        tmux.wait_screen(&format!("the TUI live on {id}"), TUI_DEADLINE, |s| {
            s.contains(&format!("twin {id}")) && s.contains("live")
        });
        tmux
    }
}

impl Gateway {
    /// `GET http://ADMIN<path>` with the gateway's own admin token:
    /// (HTTP status, body).
    pub fn admin_get(&self, path: &str) -> (u16, String) {
        let (status, body) = self.admin_api("GET", path, Some(&self.admin_token()), None);
        (status.parse().unwrap_or(0), body)
    }
}

/// `curl` POSTing `n` Stripe charges in one process (one connection
/// through `proxy` when it can) trusting only `ca`: how many were answered 200.
pub fn curl_charges(proxy: &str, n: usize, ca: &Path) -> usize {
    let mut cmd = command("curl");
    cmd.args(["-sS", "--max-time", "60", "-w", "\nSTATUS:%{http_code}\n"])
        .args(["--proxy", proxy, "--cacert"])
        .arg(ca)
        .args(["-d", "amount=100", "-d", "currency=usd"]);
    for _ in 0..n {
        cmd.arg(HTTPS_CHARGES);
    }
    text(&output(&mut cmd)).0.matches("STATUS:200").count()
}
