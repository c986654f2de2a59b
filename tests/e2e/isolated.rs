//! End-to-end tests of `veris run`'s isolated tier: the child runs in user,
//! network, mount and PID namespaces of its own, where every TCP connection
//! goes to the proxy, UDP 443 to the QUIC sink, all DNS to the stub, and the
//! rest of UDP is dropped and counted — whatever the client does. Each
//! client here ignores the proxy on purpose (`--noproxy '*'`,
//! `trust_env = False`, no proxy variables) and still shows up in the
//! receipt; the child's attacks on the sandbox fail; nothing reaches a
//! listener of the host. The confined and explicit tiers are run beside it
//! for contrast.
//!
//! Root and rootless: scenarios marked so run once as root and once as uid
//! 65534 (`setpriv`, with a work dir that uid owns as its HOME and state
//! dir); not as root, the rootless variant is the normal run and the root
//! variant skips.
//!
//! Network safety: isolated runs use `--isolate`, so a machine without
//! isolation fails the run instead of falling back to a tier where the
//! child's traffic could leave. Runs that make non-vendor connections use
//! `--mode strict`, so the proxy refuses instead of dialing out. Non-vendor
//! targets are TEST-NET addresses and `.invalid` names; the one client that
//! runs outside any namespace (the explicit-tier contrast) is pointed at a
//! local listener standing in for the vendor, and no vendor name is ever
//! resolved by real DNS.

use crate::support;

use std::io::{ErrorKind, Read};
use std::net::{Ipv4Addr, Ipv6Addr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{euid, output_within, python_module, skip, tool_works, Guard, TempDir};

/// The deadline of one `veris run` (they take well under a second here).
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// `go run` compiles first: more room.
const GO_TIMEOUT: Duration = Duration::from_secs(300);

/// The uid (and gid) of the rootless variant when the tests run as root.
const NOBODY: &str = "65534";

/// The system trust store the isolated tier bind-mounts the veris bundle over.
const SYSTEM_STORE: &str = "/etc/ssl/certs/ca-certificates.crt";

const CHARGE_NOPROXY: &[&str] = &[
    "curl",
    "-sS",
    "--max-time",
    "20",
    "--noproxy",
    "*",
    "https://api.stripe.com/v1/charges",
    "-d",
    "amount=100",
    "-d",
    "currency=usd",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    Root,
    Rootless,
}

const BOTH: [Who; 2] = [Who::Root, Who::Rootless];

/// One test's `veris run`s, as root or rootless, sharing a state dir.
struct Runner {
    who: Who,
    dir: TempDir,
    /// Owned by the uid veris runs as: its HOME, state dir, receipts, scripts.
    work: PathBuf,
    /// The binary (a copy when uid 65534 cannot reach the original).
    exe: PathBuf,
    /// Whether veris is started through `setpriv` as uid 65534.
    as_nobody: bool,
    runs: AtomicU32,
}

/// What one `veris run` left: its status, output, receipt and ledger.
struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    receipt: Option<Value>,
    ledger: Vec<Value>,
    /// The uid veris ran as.
    uid: u32,
}

impl Runner {
    /// A runner for `who`, or why that variant cannot run here.
    fn new(who: Who, label: &str) -> Result<Runner, String> {
        let root = euid() == 0;
        let as_nobody = match (who, root) {
            (Who::Root, false) => {
                let uid = euid();
                return Err(format!(
                    "needs root (this is uid {uid}: the rootless variant is this run)"
                ));
            }
            (Who::Root, true) => false,
            (Who::Rootless, false) => false,
            (Who::Rootless, true) => {
                if !tool_works("setpriv", &["--version"]) {
                    return Err("setpriv not installed (util-linux)".into());
                }
                true
            }
        };
        // Mode 0755: uid 65534 reaches the work dir and a copy of the binary.
        let dir = TempDir::new(&format!("iso-{label}"));
        let work = dir.join("work");
        std::fs::create_dir(&work).expect("creating the work dir");
        let mut exe = support::bin();
        if as_nobody {
            std::os::unix::fs::chown(&work, Some(65534), Some(65534)).expect("chown the work dir");
            if !nobody_can_exec(&exe) {
                // e.g. a checkout under /root: a copy in the temp dir, removed with it.
                let copy = dir.join("veris");
                std::fs::copy(&exe, &copy).expect("copying the veris binary");
                std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755))
                    .expect("chmod the copy");
                exe = copy;
                assert!(
                    nobody_can_exec(&exe),
                    "uid {NOBODY} cannot run {} either: is the temp dir ({}) reachable?",
                    exe.display(),
                    dir.path().display()
                );
            }
        }
        Ok(Runner {
            who,
            dir,
            work,
            exe,
            as_nobody,
            runs: AtomicU32::new(0),
        })
    }

    /// The state dir every run of this test shares (each run has its own ledger).
    fn state(&self) -> PathBuf {
        self.work.join("state")
    }

    /// Writes a file the child can read; its path.
    fn write(&self, name: &str, content: &str) -> PathBuf {
        let path = self.work.join(name);
        std::fs::write(&path, content).expect("writing a test file");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
            .expect("chmod a test file");
        path
    }

    /// `veris run --state-dir … --receipt FILE FLAGS -- CHILD`, with a cleared
    /// environment (PATH and HOME kept), as this runner's uid; and the receipt path.
    fn command(&self, flags: &[&str], child: &[&str]) -> (Command, PathBuf) {
        let n = self.runs.fetch_add(1, Ordering::Relaxed);
        let receipt = self.work.join(format!("receipt-{n}.json"));
        let mut cmd = if self.as_nobody {
            let mut cmd = support::command("setpriv");
            cmd.args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"])
                .arg(&self.exe)
                .env("HOME", &self.work);
            cmd
        } else {
            let mut cmd = Command::new(&self.exe);
            support::client_env(&mut cmd);
            cmd
        };
        // The work dir (scripts, state) is under /tmp: as the working
        // directory it is carried into the run's private /tmp.
        cmd.current_dir(&self.work);
        cmd.args(["run", "--state-dir"])
            .arg(self.state())
            .arg("--receipt")
            .arg(&receipt)
            .args(flags)
            .arg("--")
            .args(child);
        (cmd, receipt)
    }

    /// Runs `veris run FLAGS -- CHILD` to the end (bounded); `adjust` may
    /// change the command (PATH, extra variables) first.
    fn run_with(
        &self,
        flags: &[&str],
        child: &[&str],
        timeout: Duration,
        adjust: impl FnOnce(&mut Command),
    ) -> Outcome {
        let (mut cmd, receipt) = self.command(flags, child);
        adjust(&mut cmd);
        let out = output_within(&mut cmd, timeout);
        let (stdout, stderr) = support::text(&out);
        let receipt = std::fs::read_to_string(&receipt)
            .ok()
            .map(|s| serde_json::from_str(&s).unwrap_or_else(|e| panic!("receipt JSON: {e}: {s}")));
        let ledger = stderr
            .lines()
            .find_map(|l| l.strip_prefix("ledger: "))
            .and_then(|l| l.split(" (verify it later").next())
            .map(|p| {
                std::fs::read_to_string(p)
                    .unwrap_or_else(|e| panic!("reading the ledger {p}: {e}"))
                    .lines()
                    .map(|l| serde_json::from_str(l).expect("a ledger line is JSON"))
                    .collect()
            })
            .unwrap_or_default();
        Outcome {
            code: out.status.code(),
            stdout,
            stderr,
            receipt,
            ledger,
            uid: if self.as_nobody { 65534 } else { euid() },
        }
    }

    fn run(&self, flags: &[&str], child: &[&str]) -> Outcome {
        self.run_with(flags, child, RUN_TIMEOUT, |_| {})
    }

    /// `veris run --isolate FLAGS -- CHILD`; Err (a skip reason) when this
    /// machine cannot isolate, which `--isolate` turns into exit 1 before
    /// the child starts.
    fn isolated_with(
        &self,
        flags: &[&str],
        child: &[&str],
        timeout: Duration,
        adjust: impl FnOnce(&mut Command),
    ) -> Result<Outcome, String> {
        let mut all = vec!["--isolate"];
        all.extend_from_slice(flags);
        let out = self.run_with(&all, child, timeout, adjust);
        if out.code == Some(1) {
            if let Some(line) = out
                .stderr
                .lines()
                .find(|l| l.contains("cannot isolate the command"))
            {
                return Err(format!(
                    "isolation unavailable ({:?}): {}",
                    self.who,
                    line.trim()
                ));
            }
        }
        Ok(out)
    }

    fn isolated(&self, flags: &[&str], child: &[&str]) -> Result<Outcome, String> {
        self.isolated_with(flags, child, RUN_TIMEOUT, |_| {})
    }

    /// Whether `program args` works as the uid veris runs as (uid 65534
    /// cannot reach a pyenv under /root, say).
    fn child_tool_works(&self, program: &str, args: &[&str]) -> bool {
        if !self.as_nobody {
            return tool_works(program, args);
        }
        let mut cmd = support::command("setpriv");
        cmd.args([
            "--reuid",
            NOBODY,
            "--regid",
            NOBODY,
            "--clear-groups",
            // The shell's PATH search skips entries this uid cannot reach
            // (setpriv's gives up at the first: a pyenv shim under /root).
            "sh",
            "-c",
            "exec \"$0\" \"$@\"",
            program,
        ])
        .args(args)
        .env("HOME", &self.work);
        output_within(&mut cmd, support::DEADLINE).status.success()
    }
}

/// Whether uid 65534 can execute `path` (every parent dir reachable).
fn nobody_can_exec(path: &Path) -> bool {
    let mut cmd = support::command("setpriv");
    cmd.args([
        "--reuid",
        NOBODY,
        "--regid",
        NOBODY,
        "--clear-groups",
        "test",
        "-x",
    ])
    .arg(path);
    output_within(&mut cmd, support::DEADLINE).status.success()
}

impl Outcome {
    /// Everything the run printed, for assertion messages.
    fn ctx(&self) -> String {
        format!(
            "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }

    fn receipt(&self) -> &Value {
        self.receipt
            .as_ref()
            .unwrap_or_else(|| panic!("no receipt was written:\n{}", self.ctx()))
    }

    /// The leaks, but `workload-root`, which an isolated run as root must
    /// name (a root workload writes the host's files) and a rootless one
    /// must not.
    fn leaks(&self) -> Vec<String> {
        let mut leaks: Vec<String> = self.receipt()["leaks"]
            .as_array()
            .unwrap_or_else(|| panic!("no leaks array: {}", self.receipt()))
            .iter()
            .map(|l| l.as_str().expect("a leak is a string").to_string())
            .collect();
        if self.receipt()["isolation"] == "netns" {
            let named = leaks.iter().any(|l| l == "workload-root");
            assert_eq!(named, self.uid == 0, "workload-root iff root: {leaks:?}");
            leaks.retain(|l| l != "workload-root");
            // Unix sockets under home directories stay reachable, and
            // every isolated receipt says so.
            let home = "host-sockets-reachable (home directories)";
            assert!(leaks.iter().any(|l| l == home), "{leaks:?}");
            leaks.retain(|l| l != home);
        }
        leaks
    }

    /// `METHOD PATH STATUS` of each request of `service` in the receipt.
    fn entries(&self, service: &str) -> Vec<String> {
        self.receipt()["services"][service]["entries"]
            .as_array()
            .map(|entries| {
                entries
                    .iter()
                    .map(|e| format!("{} {} {}", e["method"], e["path"], e["status"]))
                    .map(|s| s.replace('"', ""))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The bundle files the session line says held the veris bundle.
    fn bundles(&self) -> Vec<String> {
        self.kind("session")
            .first()
            .and_then(|s| s["coverage"]["bundles"].as_array())
            .map(|b| {
                b.iter()
                    .map(|p| p.as_str().expect("a path").to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn kind(&self, kind: &str) -> Vec<&Value> {
        self.ledger.iter().filter(|l| l["kind"] == kind).collect()
    }

    /// The isolated tier's verdict for a run where nothing else happened.
    fn assert_isolated_and_verified(&self) {
        let r = self.receipt();
        assert_eq!(r["isolation"], "netns", "{r}\n{}", self.ctx());
        assert_eq!(r["interception"], "isolated", "{r}");
        assert_eq!(r["integrity"]["status"], "verified", "{r}\n{}", self.ctx());
        assert!(
            self.stderr.contains("interception: isolated"),
            "{}",
            self.ctx()
        );
        assert!(
            !self.ledger.is_empty(),
            "the ledger path is printed and the ledger read:\n{}",
            self.ctx()
        );
        // The variant ran as meant: `veris run` (the proxy) had that uid.
        assert_eq!(
            self.kind("session")[0]["proxy_uid"],
            self.uid,
            "{}",
            self.ctx()
        );
    }
}

/// Runs `scenario` as root and rootless; a variant that cannot run here skips.
fn for_both(label: &str, mut scenario: impl FnMut(&Runner) -> Result<(), String>) {
    for who in BOTH {
        let runner = match Runner::new(who, &format!("{label}-{who:?}")) {
            Ok(r) => r,
            Err(why) => {
                skip(&format!("{label} ({who:?}): {why}"));
                continue;
            }
        };
        if let Err(why) = scenario(&runner) {
            skip(&format!("{label} ({who:?}): {why}"));
        }
    }
}

/// A runner as whoever runs the tests (for client tests that need no variant).
fn this_user(label: &str) -> Runner {
    let who = if euid() == 0 {
        Who::Root
    } else {
        Who::Rootless
    };
    Runner::new(who, label).expect("a runner as this user")
}

/// A first non-loopback IPv4 address of this host (`ip`, else `hostname -I`), if any.
fn host_ipv4() -> Option<Ipv4Addr> {
    let words = |program: &str, args: &[&str]| -> Vec<String> {
        if !tool_works(program, &[]) && !tool_works(program, &["-V"]) {
            return Vec::new();
        }
        let out = output_within(support::command(program).args(args), support::DEADLINE);
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(|w| w.split('/').next().unwrap_or(w).to_string())
            .collect()
    };
    let usable = |a: &Ipv4Addr| !a.is_loopback() && !a.is_unspecified();
    // `ip -4 -o addr`: `… inet 192.0.2.2/24 brd …`, one line per address.
    let ip = words("ip", &["-4", "-o", "addr", "show"]);
    ip.windows(2)
        .filter(|w| w[0] == "inet")
        .filter_map(|w| w[1].parse::<Ipv4Addr>().ok())
        .find(usable)
        .or_else(|| {
            words("hostname", &["-I"])
                .iter()
                .filter_map(|w| w.parse::<Ipv4Addr>().ok())
                .find(usable)
        })
}

/// Whether a nonblocking accept finds a connection the listener received.
pub(super) fn received_a_connection(listener: &TcpListener) -> Option<std::net::SocketAddr> {
    listener.set_nonblocking(true).expect("nonblocking");
    match listener.accept() {
        Ok((_, peer)) => Some(peer),
        Err(e) if e.kind() == ErrorKind::WouldBlock => None,
        Err(e) => panic!("accept: {e}"),
    }
}

// --- 1. Clients that ignore the proxy, one test per client ------------------

/// One client that ignores the proxy on purpose, run in the isolated tier:
/// what it needs, how it is started, what it must print, and the requests
/// the receipt must hold.
struct Client {
    /// Names the run's temp dir and its SKIP lines.
    label: &'static str,
    /// Err (a skip reason) when the client is not installed here.
    needs: fn() -> Result<(), String>,
    /// A script written to the work dir first (file name, content); `{script}`
    /// in `argv` stands for its path.
    script: Option<(&'static str, &'static str)>,
    /// The command `veris run --isolate` runs.
    argv: &'static [&'static str],
    /// Runs as root and rootless ([`for_both`]), or once as this user.
    both: bool,
    /// The deadline of the run.
    timeout: Duration,
    /// Changes the `veris run` command first (the Go toolchain's dirs).
    adjust: fn(&Runner, &mut Command),
    /// What the client prints when its requests were answered by the twin.
    prints: Prints,
    /// `METHOD PATH STATUS` of each request of `stripe` in the receipt.
    entries: &'static [&'static str],
}

/// How a client's stdout shows the twin answered.
enum Prints {
    /// Exactly this line (trimmed).
    Line(&'static str),
    /// Each of these somewhere.
    All(&'static [&'static str]),
    /// The twin's JSON, with this `object`.
    Json(&'static str),
}

fn no_adjust(_: &Runner, _: &mut Command) {}

/// One client's test: in the receipt, verified, no leak.
fn client_case(c: &Client) {
    if let Err(why) = (c.needs)() {
        return skip(&why);
    }
    let scenario = |r: &Runner| -> Result<(), String> {
        let script = c
            .script
            .map(|(name, content)| r.write(name, content).to_str().unwrap().to_string());
        let argv: Vec<&str> = c
            .argv
            .iter()
            .map(|a| match (*a, &script) {
                ("{script}", Some(path)) => path.as_str(),
                _ => a,
            })
            .collect();
        let out = r.isolated_with(&[], &argv, c.timeout, |cmd| (c.adjust)(r, cmd))?;
        assert_eq!(out.code, Some(0), "{}", out.ctx());
        match c.prints {
            Prints::Line(line) => assert_eq!(out.stdout.trim(), line, "{}", out.ctx()),
            Prints::All(all) => {
                for s in all {
                    assert!(out.stdout.contains(s), "{s:?} in\n{}", out.ctx());
                }
            }
            Prints::Json(object) => {
                let body: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
                    panic!("{} printed the twin's JSON: {e}\n{}", c.label, out.ctx())
                });
                assert_eq!(body["object"], object, "{}", out.ctx());
            }
        }
        out.assert_isolated_and_verified();
        assert_eq!(out.leaks(), Vec::<String>::new(), "{}", out.ctx());
        let printed = if out.uid == 0 {
            "leaks: host-sockets-reachable (home directories), workload-root"
        } else {
            "leaks: host-sockets-reachable (home directories)"
        };
        assert!(out.stderr.contains(printed), "{}", out.ctx());
        assert_eq!(
            out.receipt()["services"]["stripe"]["requests"],
            c.entries.len(),
            "{}",
            out.ctx()
        );
        assert_eq!(out.entries("stripe"), c.entries, "{}", out.ctx());
        Ok(())
    };
    if c.both {
        for_both(c.label, scenario);
    } else if let Err(why) = scenario(&this_user(c.label)) {
        skip(&why);
    }
}

/// One `#[test]` per client, named so that a failure names the client.
macro_rules! clients {
    ($($test:ident => $client:expr),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                client_case(&$client);
            }
        )*
    };
}

clients! {
    isolated_curl_ignoring_the_proxy_is_in_the_receipt => Client {
        label: "curl",
        needs: support::curl,
        script: None,
        argv: CHARGE_NOPROXY,
        both: true,
        timeout: RUN_TIMEOUT,
        adjust: no_adjust,
        prints: Prints::Json("charge"),
        entries: &["POST /v1/charges 200"],
    },
    isolated_node_fetch_and_https_request_are_in_the_receipt => Client {
        label: "node",
        needs: || {
            tool_works("node", &["-e", "fetch"])
                .then_some(())
                .ok_or_else(|| "node (18+, with fetch) not installed".into())
        },
        script: Some(("client.js", NODE_JS)),
        argv: &["node", "{script}"],
        both: false,
        timeout: RUN_TIMEOUT,
        adjust: no_adjust,
        prints: Prints::All(&["fetch 200", "https.request 200"]),
        entries: &["POST /v1/charges 200", "GET /v1/customers 200"],
    },
    isolated_aiohttp_default_session_is_in_the_receipt => Client {
        label: "aiohttp",
        needs: || python_module("aiohttp"),
        script: Some(("aiohttp_client.py", AIOHTTP_PY)),
        argv: &["python3", "{script}"],
        both: false,
        timeout: RUN_TIMEOUT,
        adjust: no_adjust,
        prints: Prints::Line("aiohttp 200 charge"),
        entries: &["POST /v1/charges 200"],
    },
    // httplib2 reads its bundled roots (or certifi's), not the system store
    // veris mounts over: only HTTPLIB2_CA_CERTS points it at the bundle.
    isolated_httplib2_trusts_veris_through_its_own_variable => Client {
        label: "httplib2",
        needs: || python_module("httplib2"),
        script: Some(("httplib2_client.py", HTTPLIB2_PY)),
        argv: &["python3", "{script}"],
        both: false,
        timeout: RUN_TIMEOUT,
        adjust: no_adjust,
        prints: Prints::Line("httplib2 200"),
        entries: &["GET /v1/customers 200"],
    },
    isolated_wget_with_the_system_store_is_in_the_receipt => Client {
        label: "wget",
        needs: || {
            tool_works("wget", &["--version"])
                .then_some(())
                .ok_or_else(|| "wget not installed".into())
        },
        script: None,
        argv: &[
            "wget",
            "-q",
            "-O",
            "-",
            "--tries=1",
            "--timeout=20",
            "--no-proxy",
            "https://api.stripe.com/v1/customers",
        ],
        both: false,
        timeout: RUN_TIMEOUT,
        adjust: no_adjust,
        prints: Prints::Json("list"),
        entries: &["GET /v1/customers 200"],
    },
    isolated_go_net_http_is_in_the_receipt => Client {
        label: "go",
        needs: || {
            tool_works("go", &["version"])
                .then_some(())
                .ok_or_else(|| "go not installed (apt install golang-go)".into())
        },
        script: Some(("main.go", GO_MAIN)),
        argv: &["go", "run", "{script}"],
        both: false,
        timeout: GO_TIMEOUT,
        adjust: |r, cmd| {
            let go = r.work.join("go");
            cmd.env("GOCACHE", go.join("cache"))
                .env("GOPATH", go.join("path"))
                .env("GOFLAGS", "-mod=mod")
                .env("GOPROXY", "off")
                .env("GOTOOLCHAIN", "local")
                .current_dir(&r.work);
        },
        prints: Prints::Line("go 200"),
        entries: &["GET /v1/customers 200"],
    },
}

// --- 2. Python requests, trust_env = False --------------------------------

const REQUESTS_NO_ENV_PY: &str = r#"
import sys, certifi, requests
verify = sys.argv[1]
print("certifi", certifi.where())
s = requests.Session()
s.trust_env = False
try:
    r = s.get("https://api.stripe.com/v1/customers", verify=True if verify == "default" else verify, timeout=20)
    print("status", r.status_code)
except requests.exceptions.SSLError as e:
    print("ssl-error", str(e)[:200])
"#;

#[test]
fn isolated_python_requests_without_env_reaches_the_twin_through_the_system_store() {
    if let Err(why) = python_module("requests") {
        return skip(&why);
    }
    let r = this_user("requests");
    let script = r.write("requests_no_env.py", REQUESTS_NO_ENV_PY);
    let script = script.to_str().unwrap();

    // The system store, bind-mounted over with the veris bundle.
    let out = match r.isolated(&[], &["python3", script, SYSTEM_STORE]) {
        Ok(out) => out,
        Err(why) => return skip(&why),
    };
    assert_eq!(out.code, Some(0), "{}", out.ctx());
    assert!(out.stdout.contains("status 200"), "{}", out.ctx());
    out.assert_isolated_and_verified();
    assert_eq!(out.entries("stripe"), ["GET /v1/customers 200"]);
    assert_eq!(out.leaks(), Vec::<String>::new());

    // Default verify: certifi's own bundle, which no variable reaches: the
    // scan found it in the site-packages of the python3 on PATH and covered
    // it (E1), whether or not certifi is the distribution's.
    let out = r.isolated(&[], &["python3", script, "default"]).unwrap();
    let certifi = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("certifi "))
        .unwrap_or_else(|| panic!("the script printed certifi.where():\n{}", out.ctx()))
        .to_string();
    out.assert_isolated_and_verified();
    assert_eq!(out.code, Some(0), "{}", out.ctx());
    assert_eq!(out.entries("stripe"), ["GET /v1/customers 200"]);
    assert_eq!(out.receipt()["trust_failures"], serde_json::json!([]));
    let system = std::fs::canonicalize(SYSTEM_STORE).ok();
    if std::fs::canonicalize(&certifi).ok() != system {
        assert!(
            out.bundles().contains(&certifi),
            "{certifi} in {:?}",
            out.bundles()
        );
    }

    // A copy of those roots the scan cannot know of (here: in the work
    // dir) still refuses the veris CA, and the receipt says so.
    let copy = r.work.join("copied-roots.pem");
    std::fs::copy(&certifi, &copy).expect("copying certifi's bundle");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644)).unwrap();
    let copy = copy.to_str().unwrap();
    let out = r.isolated(&[], &["python3", script, copy]).unwrap();
    out.assert_isolated_and_verified();
    assert!(out.stdout.contains("ssl-error"), "{}", out.ctx());
    assert_eq!(
        out.code,
        Some(3),
        "a vendor host that refused the CA fails the receipt: {}",
        out.ctx()
    );
    assert_eq!(out.entries("stripe"), Vec::<String>::new());
    let failures = out.receipt()["trust_failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0]["host"], "api.stripe.com");
    assert_eq!(failures[0]["service"], "stripe");
    assert_eq!(failures[0]["completed"], 0);
    assert!(
        failures[0]["refusals"].as_u64().unwrap() >= 1,
        "{failures:?}"
    );
    assert!(
        failures[0]["alerts"]["unknown_ca"].as_u64().unwrap_or(0) >= 1,
        "{failures:?}"
    );
    assert!(
        out.stderr
            .contains("FAIL: vendor host \"api.stripe.com\" refused the veris certificate"),
        "{}",
        out.ctx()
    );
    // The hint names the flag for such a file, and what veris covers itself.
    assert!(
        out.stderr.contains("veris run --trust-file FILE")
            && out.stderr.contains("not one installed during the run"),
        "{}",
        out.ctx()
    );
    let ledger_failures = out.kind("trust_failure");
    assert_eq!(ledger_failures.len(), 1, "{ledger_failures:?}");
    assert_eq!(ledger_failures[0]["host"], "api.stripe.com");

    // --allow-empty forgives an empty receipt, not a refused CA.
    let out = r
        .isolated(&["--allow-empty"], &["python3", script, copy])
        .unwrap();
    assert_eq!(out.code, Some(3), "{}", out.ctx());
}

// --- 3. Node ---------------------------------------------------------------

const NODE_JS: &str = r#"
const https = require('https');
async function main() {
  const r = await fetch('https://api.stripe.com/v1/charges', {
    method: 'POST', body: 'amount=500&currency=usd',
    headers: {'content-type': 'application/x-www-form-urlencoded'},
    signal: AbortSignal.timeout(20000),
  });
  await r.text();
  console.log('fetch', r.status);
  await new Promise((resolve, reject) => {
    const req = https.request('https://api.stripe.com/v1/customers', {method: 'GET'}, (res) => {
      res.resume();
      res.on('end', () => { console.log('https.request', res.statusCode); resolve(); });
    });
    req.on('error', reject);
    req.setTimeout(20000, () => req.destroy(new Error('timeout')));
    req.end();
  });
}
main().catch((e) => { console.log('error', e.message, e.cause && e.cause.message); process.exit(1); });
"#;

// --- 4. aiohttp --------------------------------------------------------------

const AIOHTTP_PY: &str = r#"
import asyncio, aiohttp
async def main():
    async with aiohttp.ClientSession() as s:
        async with s.post("https://api.stripe.com/v1/charges", data={"amount": "700", "currency": "usd"},
                          timeout=aiohttp.ClientTimeout(total=20)) as r:
            body = await r.json()
            print("aiohttp", r.status, body["object"])
asyncio.run(main())
"#;

// --- 4b. httplib2 (its own CA bundle unless HTTPLIB2_CA_CERTS says otherwise) --

const HTTPLIB2_PY: &str = r#"
import httplib2
resp, body = httplib2.Http(timeout=20).request("https://api.stripe.com/v1/customers")
print("httplib2", resp.status)
"#;

// --- 4c. SDKs and runtimes with a CA bundle of their own (E1) ---------------

/// A user's PATH: no sbin dirs, no pyenv under /root.
const USER_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

const STRIPE_SDK_PY: &str = r#"
import os, sys
for v in ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "CURL_CA_BUNDLE"):
    os.environ.pop(v, None)
import stripe
stripe.api_key = "sk_test_veris"
stripe.max_network_retries = 0
print("bundle", stripe.ca_bundle_path)
try:
    c = stripe.Customer.create(email="e1@example.com")
    ch = stripe.Charge.create(amount=100, currency="usd", source="tok_visa")
    print("ok", c.object, ch.object)
except stripe.error.StripeError as e:
    print("error", type(e).__name__, str(e)[:300])
    sys.exit(2)
"#;

impl Runner {
    /// Whether the `python3` that `path` leads this runner's uid to has `module`.
    fn python_with(&self, path: &str, module: &str) -> bool {
        let mut cmd = if self.as_nobody {
            let mut c = support::command("setpriv");
            c.args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups", "sh"]);
            c
        } else {
            support::command("sh")
        };
        cmd.args(["-c", &format!("exec python3 -c 'import {module}'")])
            .env("PATH", path)
            .env("HOME", &self.work);
        output_within(&mut cmd, support::DEADLINE).status.success()
    }

    /// Root keeps the test's PATH (a pyenv shim, say); uid 65534 a user's.
    fn child_path(&self) -> String {
        if self.as_nobody {
            return USER_PATH.to_string();
        }
        std::env::var("PATH").unwrap_or_else(|_| USER_PATH.to_string())
    }
}

/// The real stripe SDK verifies against its own `stripe/data/ca-certificates.crt`,
/// which no variable replaces: the scan finds it where the command's python3
/// looks, and the run covers it, with no `--trust-file` and no variable.
#[test]
fn isolated_stripe_sdk_trusts_veris_through_its_own_bundle() {
    for_both("stripe-sdk", |runner| {
        let path = runner.child_path();
        if !runner.python_with(&path, "stripe") {
            return Err(format!(
                "no python3 with the stripe SDK on {path} for this uid (.ci/run installs it)"
            ));
        }
        let script = runner.write("stripe_sdk.py", STRIPE_SDK_PY);
        let out = runner.isolated_with(
            &[],
            &["python3", script.to_str().unwrap()],
            RUN_TIMEOUT,
            |c| {
                c.env("PATH", &path);
            },
        )?;
        assert_eq!(out.code, Some(0), "{}", out.ctx());
        assert!(out.stdout.contains("ok customer charge"), "{}", out.ctx());
        out.assert_isolated_and_verified();
        assert_eq!(
            out.entries("stripe"),
            ["POST /v1/customers 200", "POST /v1/charges 200"]
        );
        assert_eq!(out.receipt()["trust_failures"], serde_json::json!([]));
        let bundle = out
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("bundle "))
            .unwrap_or_else(|| panic!("the script printed its bundle:\n{}", out.ctx()));
        let bundle = std::fs::canonicalize(bundle).unwrap().display().to_string();
        // Named in the session line and the JSON receipt; counted in the text.
        assert!(out.bundles().contains(&bundle), "{:?}", out.bundles());
        assert!(
            out.receipt()["bundles"]
                .as_array()
                .is_some_and(|b| b.iter().any(|p| p == bundle.as_str())),
            "{}",
            out.receipt()
        );
        let line = format!(
            "  bundles: {} CA file(s) that runtimes and SDKs ship held the veris bundle",
            out.bundles().len()
        );
        assert!(out.stderr.contains(&line), "{}", out.ctx());
        assert!(
            out.stderr.contains(
                "a bundle installed during the run is not covered (name it with --trust-file)"
            ),
            "{}",
            out.ctx()
        );
        Ok(())
    });
}

const CHARGE_JAVA: &str = r#"
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;

public class Charge {
    public static void main(String[] args) throws Exception {
        HttpClient client = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(20)).build();
        HttpRequest req = HttpRequest.newBuilder(URI.create("https://api.stripe.com/v1/charges"))
            .timeout(Duration.ofSeconds(20))
            .header("Content-Type", "application/x-www-form-urlencoded")
            .POST(HttpRequest.BodyPublishers.ofString("amount=100&currency=usd"))
            .build();
        HttpResponse<String> res = client.send(req, HttpResponse.BodyHandlers.ofString());
        System.out.println("java " + res.statusCode());
    }
}
"#;

/// Java without `JAVA_TOOL_OPTIONS` reads its JDK's own `cacerts`: the run
/// covers it with veris's truststore.
#[test]
fn isolated_java_trusts_veris_through_its_default_cacerts() {
    if !tool_works("javac", &["-version"]) {
        return skip("javac not installed (default-jdk-headless)");
    }
    let java = std::env::split_paths(USER_PATH)
        .map(|d| d.join("java"))
        .find(|j| j.is_file());
    let Some(java) = java else {
        return skip(&format!("no java on {USER_PATH}"));
    };
    let jdk = std::fs::canonicalize(&java).unwrap();
    let cacerts = jdk
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("lib/security/cacerts");
    let Ok(cacerts) = std::fs::canonicalize(&cacerts) else {
        return skip(&format!("no {}", cacerts.display()));
    };
    for_both("java-cacerts", |runner| {
        let source = runner.write("Charge.java", CHARGE_JAVA);
        let mut javac = support::command("javac");
        javac.arg("-d").arg(&runner.work).arg(&source);
        let built = output_within(&mut javac, Duration::from_secs(120));
        assert!(built.status.success(), "javac: {:?}", support::text(&built));
        let work = runner.work.to_str().unwrap();
        let out = runner.isolated_with(
            &[],
            &[
                "env",
                "-u",
                "JAVA_TOOL_OPTIONS",
                "java",
                "-cp",
                work,
                "Charge",
            ],
            Duration::from_secs(120),
            |c| {
                c.env("PATH", USER_PATH);
            },
        )?;
        assert_eq!(out.code, Some(0), "{}", out.ctx());
        assert_eq!(out.stdout.trim(), "java 200", "{}", out.ctx());
        out.assert_isolated_and_verified();
        assert_eq!(out.entries("stripe"), ["POST /v1/charges 200"]);
        let cacerts = cacerts.display().to_string();
        assert!(out.bundles().contains(&cacerts), "{:?}", out.bundles());
        Ok(())
    });
}

/// The scan's cache sits in the state dir, where the workload writes: a
/// forged one naming files no scan would cover (a system file, a file of
/// the workload's) covers none of them, and the session line names none.
#[test]
fn a_forged_bundle_cache_covers_nothing_the_scan_would_not() {
    let r = this_user("forged-cache");
    let planted = r.write(
        "cacert.pem",
        "# planted\n-----BEGIN CERTIFICATE-----\nforged\n-----END CERTIFICATE-----\n",
    );
    let planted = planted.to_str().unwrap().to_string();
    let forge = format!(
        "import json; p = {state:?} + '/cache/bundles.json'; c = json.load(open(p)); \
         c['files'] = ['/etc/passwd', {planted:?}] + c['files']; json.dump(c, open(p, 'w'))",
        state = r.state().display().to_string(),
    );
    // The workload's run: the scan's cache exists, and it rewrites it.
    let out = match r.isolated(&["--allow-empty"], &["python3", "-c", &forge]) {
        Ok(out) => out,
        Err(why) => return skip(&why),
    };
    assert_eq!(
        out.code,
        Some(0),
        "the cache was written and forged: {}",
        out.ctx()
    );
    let covered_before = out.bundles();
    // The next run reads the forged cache.
    let out = r
        .isolated(
            &["--allow-empty"],
            &[
                "sh",
                "-c",
                "head -c 5 /etc/passwd; echo; head -c 9 cacert.pem",
            ],
        )
        .unwrap();
    assert_eq!(out.code, Some(0), "{}", out.ctx());
    assert_eq!(
        out.stdout,
        "root:\n# planted",
        "neither file was covered: {}",
        out.ctx()
    );
    let covered = out.bundles();
    assert!(
        !covered.iter().any(|b| b == "/etc/passwd" || b == &planted),
        "{covered:?}"
    );
    assert_eq!(covered, covered_before, "what a fresh scan covers, no more");
}

// --- 6. Go net/http ---------------------------------------------------------

const GO_MAIN: &str = r#"package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	// No proxy at all, whatever the environment says.
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{Proxy: nil}}
	resp, err := client.Get("https://api.stripe.com/v1/customers")
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	fmt.Println("go", resp.StatusCode)
}
"#;

// --- 7. raw TCP -------------------------------------------------------------

/// Connects, sends a PostgreSQL SSLRequest (neither TLS nor HTTP), prints
/// how many bytes came back or the errno.
const RAW_TCP_PY: &str = r#"
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
s.sendall(b"\x00\x00\x00\x08\x04\xd2\x16\x2f")
try:
    print("answer", len(s.recv(100)))
except OSError as e:
    print("error", e.errno)
"#;

#[test]
fn isolated_raw_tcp_in_strict_mode_is_blocked_and_nothing_else() {
    for_both("raw-tcp", |r| {
        if !r.child_tool_works("python3", &["-c", ""]) {
            return Err("python3 not available to this uid".into());
        }
        let script = r.write("raw_tcp.py", RAW_TCP_PY);
        let out = r.isolated(
            &["--mode", "strict", "--allow-empty"],
            &["python3", script.to_str().unwrap(), "203.0.113.7", "5432"],
        )?;
        assert_eq!(out.code, Some(0), "{}", out.ctx());
        assert_eq!(
            out.stdout.trim(),
            "answer 0",
            "refused: closed without an answer\n{}",
            out.ctx()
        );
        out.assert_isolated_and_verified();
        let receipt = out.receipt();
        assert_eq!(
            receipt["blocked"]["hosts"],
            serde_json::json!({"203.0.113.7": 1}),
            "{receipt}"
        );
        assert_eq!(receipt["passthrough"]["hosts"], serde_json::json!({}));
        assert_eq!(receipt["services"], serde_json::json!({}), "{receipt}");
        assert_eq!(out.leaks(), Vec::<String>::new());
        let blocked = out.kind("blocked");
        assert_eq!(blocked.len(), 1, "{blocked:?}");
        assert_eq!(blocked[0]["dst"], "203.0.113.7:5432");
        assert_eq!(blocked[0]["port"], 5432);
        // Nothing else happened: no request, passthrough, DNS or UDP line.
        for line in &out.ledger {
            let kind = line["kind"].as_str().unwrap_or("");
            assert!(
                ["session", "seal", "blocked", "check"].contains(&kind),
                "unexpected ledger line {line}"
            );
        }
        Ok(())
    });
}

// --- 8. QUIC ----------------------------------------------------------------

/// One datagram shaped like a QUIC Initial (long header, version 1) and
/// padded like one, to port 443; waits a second for an answer.
const QUIC_DATAGRAM_PY: &str = r#"
import os, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.sendto(b"\xc0\x00\x00\x00\x01" + os.urandom(1195), (sys.argv[1], 443))
s.settimeout(1)
try:
    s.recvfrom(2048)
    print("answered")
except socket.timeout:
    print("no answer")
"#;

#[test]
fn isolated_quic_goes_to_the_sink_and_is_a_leak_note() {
    for_both("quic", |r| {
        if !r.child_tool_works("python3", &["-c", ""]) {
            return Err("python3 not available to this uid".into());
        }
        let script = r.write("quic_datagram.py", QUIC_DATAGRAM_PY);
        let out = r.isolated(
            &["--mode", "strict", "--allow-empty"],
            &["python3", script.to_str().unwrap(), "203.0.113.9"],
        )?;
        assert_eq!(out.code, Some(0), "{}", out.ctx());
        assert_eq!(
            out.stdout.trim(),
            "no answer",
            "the sink never answers\n{}",
            out.ctx()
        );
        out.assert_isolated_and_verified();
        let quic = out.kind("quic");
        assert_eq!(quic.len(), 1, "{quic:?}\n{}", out.ctx());
        assert_eq!(quic[0]["dst"], "203.0.113.9:443");
        assert_eq!(quic[0]["attempts"], 1);
        assert_eq!(out.leaks(), ["quic-attempts 1"]);
        assert!(out.kind("udp_dropped").is_empty(), "UDP 443 is not dropped");
        Ok(())
    });

    // A real QUIC Initial: the sink decrypts its SNI.
    let Ok(()) = python_module("aioquic") else {
        return skip("python3 with `aioquic` not available (pip install aioquic)");
    };
    let r = this_user("aioquic");
    // Not `aioquic.py`: the script would shadow the package.
    let script = r.write("quic_client.py", support::netns::AIOQUIC_PY);
    let out = r
        .isolated(
            &["--mode", "strict", "--allow-empty"],
            &[
                "python3",
                script.to_str().unwrap(),
                "203.0.113.9",
                "api.stripe.com",
                "2",
            ],
        )
        .unwrap();
    assert_eq!(out.code, Some(0), "{}", out.ctx());
    assert_eq!(out.stdout.trim(), "no answer", "{}", out.ctx());
    out.assert_isolated_and_verified();
    let quic = out.kind("quic");
    assert_eq!(quic.len(), 1, "{quic:?}");
    assert_eq!(quic[0]["host"], "api.stripe.com");
    assert_eq!(quic[0]["dst"], "203.0.113.9:443");
    let attempts = quic[0]["attempts"].as_u64().unwrap();
    assert!(attempts >= 1, "{quic:?}");
    assert_eq!(
        out.leaks(),
        [format!("quic-attempts {attempts} (\"api.stripe.com\")")]
    );
    assert_eq!(out.entries("stripe"), Vec::<String>::new());
}

// --- 9. DNS to any resolver, other UDP --------------------------------------

/// Raw DNS queries to the resolver named in argv[1] (never a real one:
/// inside the namespace all of port 53 goes to the stub): A over UDP, AAAA
/// over UDP, A over TCP; then three datagrams to a non-DNS, non-QUIC port.
const DNS_PY: &str = r#"
import socket, struct, sys

def query(name, qid, qtype):
    q = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for part in name.split("."):
        q += bytes([len(part)]) + part.encode()
    return q + b"\x00" + struct.pack("!HH", qtype, 1)

def answers(resp, qid):
    rid, flags, qd, an = struct.unpack("!HHHH", resp[:8])
    assert rid == qid, (rid, qid)
    i = 12
    for _ in range(qd):
        while resp[i] != 0:
            i += resp[i] + 1
        i += 5
    out = []
    for _ in range(an):
        if resp[i] & 0xC0 == 0xC0:
            i += 2
        else:
            while resp[i] != 0:
                i += resp[i] + 1
            i += 1
        typ, _cls, _ttl, rdlen = struct.unpack("!HHIH", resp[i:i + 10])
        i += 10
        data = resp[i:i + rdlen]
        if typ == 1:
            out.append(socket.inet_ntop(socket.AF_INET, data))
        elif typ == 28:
            out.append(socket.inet_ntop(socket.AF_INET6, data))
        i += rdlen
    return "rcode=%d %s" % (flags & 0xF, ",".join(out))

server = sys.argv[1]
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(5)
u.sendto(query("exfil.invalid", 0x1234, 1), (server, 53))
print("udp-a", answers(u.recvfrom(4096)[0], 0x1234))
u.sendto(query("exfil6.invalid", 0x2345, 28), (server, 53))
print("udp-aaaa", answers(u.recvfrom(4096)[0], 0x2345))

t = socket.create_connection((server, 53), timeout=5)
q = query("tcp-exfil.invalid", 0x4321, 1)
t.sendall(struct.pack("!H", len(q)) + q)
head = b""
while len(head) < 2:
    head += t.recv(2 - len(head))
n = struct.unpack("!H", head)[0]
body = b""
while len(body) < n:
    chunk = t.recv(n - len(body))
    if not chunk:
        break
    body += chunk
print("tcp-a", answers(body, 0x4321))

o = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(3):
    try:
        o.sendto(b"hello", ("203.0.113.9", 9999))
        print("other sent")
    except OSError as e:
        print("other errno", e.errno)
"#;

/// The address after `label rcode=0 ` in the script's output.
fn dns_answer(stdout: &str, label: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{label} rcode=0 ")))
        .unwrap_or_else(|| panic!("no successful {label} answer in:\n{stdout}"))
        .to_string()
}

#[test]
fn isolated_dns_to_any_resolver_gets_synthetic_answers_and_other_udp_is_dropped() {
    for_both("dns", |r| {
        if !r.child_tool_works("python3", &["-c", ""]) {
            return Err("python3 not available to this uid".into());
        }
        let script = r.write("dns.py", DNS_PY);
        // A resolver that is not in /etc/resolv.conf (TEST-NET-2).
        let out = r.isolated(
            &["--mode", "strict", "--allow-empty"],
            &["python3", script.to_str().unwrap(), "198.51.100.53"],
        )?;
        assert_eq!(out.code, Some(0), "{}", out.ctx());
        out.assert_isolated_and_verified();

        let synthetic_v4 = |label: &str| {
            let a: Ipv4Addr = dns_answer(&out.stdout, label)
                .parse()
                .unwrap_or_else(|e| panic!("{label}: {e}\n{}", out.ctx()));
            let [o1, o2, _, _] = a.octets();
            assert!(
                o1 == 198 && (o2 == 18 || o2 == 19),
                "{label}: {a} is not in 198.18.0.0/15"
            );
        };
        synthetic_v4("udp-a");
        synthetic_v4("tcp-a");
        let aaaa: Ipv6Addr = dns_answer(&out.stdout, "udp-aaaa")
            .parse()
            .unwrap_or_else(|e| panic!("udp-aaaa: {e}\n{}", out.ctx()));
        let [s0, s1, s2, ..] = aaaa.segments();
        assert_eq!(
            (s0, s1, s2),
            (0x2001, 0x2, 0),
            "{aaaa} is not in 2001:2::/48"
        );

        let dns: Vec<String> = out
            .kind("dns")
            .iter()
            .map(|l| format!("{} {}", l["name"], l["qtype"]).replace('"', ""))
            .collect();
        assert_eq!(
            dns,
            [
                "exfil.invalid A",
                "exfil6.invalid AAAA",
                "tcp-exfil.invalid A"
            ],
            "{}",
            out.ctx()
        );

        // The other datagrams: refused by the ruleset (EPERM) and counted.
        assert_eq!(
            out.stdout.matches("other errno 1").count(),
            3,
            "{}",
            out.ctx()
        );
        assert_eq!(out.leaks(), ["udp-dropped 3"], "{}", out.ctx());
        let dropped: u64 = out
            .kind("udp_dropped")
            .iter()
            .map(|l| l["packets"].as_u64().unwrap())
            .sum();
        assert_eq!(dropped, 3);
        assert!(out.kind("quic").is_empty());
        assert_eq!(out.receipt()["blocked"]["hosts"], serde_json::json!({}));
        Ok(())
    });
}

/// Floods the DNS stub (any resolver: all of port 53 goes to it) with
/// argv[1] distinct made-up names over UDP, one query at a time (bounded:
/// a count, and a 5 s wait per answer), and prints how many got an address
/// and how many SERVFAIL; then asks for three more made-up names.
const DNS_FLOOD_PY: &str = r#"
import socket, struct, sys

def query(name, qid):
    q = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for part in name.split("."):
        q += bytes([len(part)]) + part.encode()
    return q + b"\x00" + struct.pack("!HH", 1, 1)

u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(5)
def ask(name, qid):
    for _ in range(3):
        u.sendto(query(name, qid), ("198.51.100.53", 53))
        try:
            while True:
                resp = u.recvfrom(4096)[0]
                if struct.unpack("!H", resp[:2])[0] == qid:
                    return struct.unpack("!H", resp[2:4])[0] & 0xF
        except socket.timeout:
            continue
    return -1

rcodes = {}
for i in range(int(sys.argv[1])):
    rc = ask("n%d.flood.test" % i, i & 0xFFFF)
    rcodes[rc] = rcodes.get(rc, 0) + 1
print("flood", sorted(rcodes.items()))
for i in range(3):
    print("extra rcode", ask("extra%d.flood.test" % i, 0xBEEF + i))
"#;

/// DESIGN §7a.18: a workload that fills the DNS stub's table (65,536
/// made-up names) cannot make a vendor name fail to resolve: the vendor
/// call after the flood reaches the twin, and the names the full table
/// refused are in the ledger and the receipt as the stub's refusals, not
/// left for the code to take the blame.
#[test]
fn a_full_dns_stub_table_still_resolves_vendor_names_and_names_the_stub() {
    let r = this_user("dns-flood");
    if !r.child_tool_works("python3", &["-c", ""]) {
        return skip("dns-flood: python3 not available to this uid");
    }
    let script = r.write("dns_flood.py", DNS_FLOOD_PY);
    let flood = format!(
        "python3 {} 65536 && {}",
        script.display(),
        CHARGE_NOPROXY.join(" ").replace('*', "'*'")
    );
    let out = match r.isolated_with(&[], &["sh", "-c", &flood], Duration::from_secs(300), |_| {}) {
        Ok(out) => out,
        Err(why) => return skip(&format!("dns-flood: {why}")),
    };
    assert!(
        out.stdout.contains("flood [(0, 65536)]"),
        "every made-up name up to the capacity got an address: {}",
        out.ctx()
    );
    assert_eq!(
        out.stdout.matches("extra rcode 2").count(),
        3,
        "the full table refuses new made-up names (SERVFAIL): {}",
        out.ctx()
    );
    // The vendor call after the flood resolved and reached the twin.
    assert_eq!(
        out.receipt()["services"]["stripe"]["requests"],
        1,
        "{}",
        out.ctx()
    );
    // The refusals are the stub's, in the ledger and the receipt (its
    // text on stderr).
    let refused: Vec<String> = out
        .kind("dns")
        .iter()
        .filter(|l| l["refused"] == true)
        .map(|l| l["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        refused,
        [
            "extra0.flood.test",
            "extra1.flood.test",
            "extra2.flood.test"
        ],
        "{}",
        out.ctx()
    );
    assert_eq!(
        out.receipt()["dns_refused"],
        serde_json::json!(refused),
        "{}",
        out.ctx()
    );
    assert!(
        out.stderr.contains("refused 3 name(s)")
            && out.stderr.contains("veris's DNS stub, not the code"),
        "{}",
        out.ctx()
    );
}

// --- 10. the child attacks the sandbox ---------------------------------------

/// Each attempt prints `name=<exit code or outcome>`; then a curl that
/// ignores the proxy, which must still be seen.
const ATTACK_SH: &str = r#"
nft delete table inet veris 2>/dev/null; echo "nft-delete=$?"
nft flush ruleset 2>/dev/null; echo "nft-flush=$?"
python3 -c '
import socket
s = socket.socket()
try:
    s.setsockopt(socket.SOL_SOCKET, 36, 0x76657269)
    print("so-mark=set")
except PermissionError:
    print("so-mark=EPERM")
'
unshare -n true 2>/dev/null; echo "unshare-n=$?"
unshare -rn true 2>/dev/null; echo "unshare-rn=$?"
unshare -rn python3 -c '
import socket
try:
    socket.create_connection(("203.0.113.7", 443), timeout=3)
    print("inner=connected")
except OSError as e:
    print("inner=errno", e.errno)
' 2>/dev/null
ip link set lo down 2>/dev/null; echo "lo-down=$?"
ip route del default 2>/dev/null; echo "route-del=$?"
sed -n -E 's/^(CapEff|NoNewPrivs):[[:space:]]*/\1=/p' /proc/self/status
curl -sS --max-time 20 --noproxy '*' -o /dev/null -w 'curl=%{http_code}\n' https://api.stripe.com/v1/charges -d amount=900
"#;

fn attack_result<'a>(stdout: &'a str, name: &str) -> &'a str {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name}= line in:\n{stdout}"))
}

#[test]
fn isolated_child_cannot_undo_the_sandbox_and_the_rules_hold() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    for_both("attack", |r| {
        if !r.child_tool_works("python3", &["-c", ""]) {
            return Err("python3 not available to this uid".into());
        }
        let script = r.write("attack.sh", ATTACK_SH);
        let out = r.isolated(&["--mode", "strict"], &["sh", script.to_str().unwrap()])?;
        let stdout = &out.stdout;
        for name in [
            "nft-delete",
            "nft-flush",
            "unshare-n",
            "unshare-rn",
            "lo-down",
            "route-del",
        ] {
            assert_ne!(
                attack_result(stdout, name),
                "0",
                "{name} succeeded\n{}",
                out.ctx()
            );
        }
        assert_eq!(attack_result(stdout, "so-mark"), "EPERM", "{}", out.ctx());
        assert!(
            !stdout.contains("inner=connected"),
            "a nested namespace reached something\n{}",
            out.ctx()
        );
        assert_eq!(
            attack_result(stdout, "CapEff"),
            "0000000000000000",
            "{}",
            out.ctx()
        );
        assert_eq!(attack_result(stdout, "NoNewPrivs"), "1", "{}", out.ctx());

        // After all that, the redirect still catches a client ignoring the proxy.
        assert_eq!(attack_result(stdout, "curl"), "200", "{}", out.ctx());
        assert_eq!(out.code, Some(0), "{}", out.ctx());
        out.assert_isolated_and_verified();
        assert_eq!(out.entries("stripe"), ["POST /v1/charges 200"]);
        assert_eq!(out.leaks(), Vec::<String>::new(), "{}", out.ctx());
        Ok(())
    });
}

// --- 11. nothing reaches the host -------------------------------------------

/// Connects to each address in argv[2:] on port argv[1], sends a line and
/// reads; prints `<addr> connected <n>` or `<addr> errno <n>`.
const CONNECT_PY: &str = r#"
import socket, sys
port = int(sys.argv[1])
for host in sys.argv[2:]:
    s = socket.socket()
    s.settimeout(10)
    try:
        s.connect((host, port))
        s.sendall(b"PING\r\n")
        print(host, "connected", len(s.recv(100)))
    except OSError as e:
        print(host, "errno", e.errno)
    finally:
        s.close()
"#;

#[test]
fn isolated_child_reaches_no_listener_of_the_host() {
    let Some(host_ip) = host_ipv4() else {
        return skip("this host has no non-loopback IPv4 address");
    };
    for_both("host-listener", |r| {
        if !r.child_tool_works("python3", &["-c", ""]) {
            return Err("python3 not available to this uid".into());
        }
        let listener = TcpListener::bind("0.0.0.0:0").expect("binding 0.0.0.0:0");
        let port = listener.local_addr().unwrap().port();
        let script = r.write("connect.py", CONNECT_PY);
        let host = host_ip.to_string();
        let port_s = port.to_string();
        let out = r.isolated(
            &["--mode", "strict", "--allow-empty"],
            &[
                "python3",
                script.to_str().unwrap(),
                &port_s,
                "127.0.0.1",
                &host,
            ],
        )?;
        assert_eq!(out.code, Some(0), "{}", out.ctx());
        assert_eq!(
            received_a_connection(&listener),
            None,
            "the host's listener on port {port} received a connection from the isolated child\n{}",
            out.ctx()
        );
        // 127.0.0.1 is the namespace's own loopback: nothing listens there.
        assert!(out.stdout.contains("127.0.0.1 errno 111"), "{}", out.ctx());
        // The host's address goes to the proxy, which refuses it (strict).
        assert!(
            out.stdout.contains(&format!("{host} connected 0")),
            "{}",
            out.ctx()
        );
        out.assert_isolated_and_verified();
        let blocked = out.kind("blocked");
        assert_eq!(blocked.len(), 1, "{blocked:?}\n{}", out.ctx());
        assert_eq!(blocked[0]["dst"], format!("{host}:{port}"));
        assert_eq!(
            out.receipt()["blocked"]["hosts"][&host],
            1,
            "{}",
            out.receipt()
        );
        assert!(out.kind("passthrough").is_empty());
        Ok(())
    });
}

/// Every non-loopback address of the host's interfaces (IPv4 and global
/// IPv6; link-local IPv6 needs a scope), from `ip -o addr`.
fn host_addresses() -> Vec<std::net::IpAddr> {
    if !tool_works("ip", &["-V"]) {
        return Vec::new();
    }
    let out = output_within(
        support::command("ip").args(["-o", "addr", "show"]),
        support::DEADLINE,
    );
    let words: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    words
        .windows(2)
        .filter(|w| w[0] == "inet" || w[0] == "inet6")
        .filter_map(|w| w[1].split('/').next()?.parse::<std::net::IpAddr>().ok())
        .filter(|a| match a {
            std::net::IpAddr::V4(v4) => !v4.is_loopback(),
            std::net::IpAddr::V6(v6) => !v6.is_loopback() && (v6.segments()[0] & 0xffc0) != 0xfe80,
        })
        .collect()
}

const CONNECT_ANY_PY: &str = r#"
import socket, sys
port = int(sys.argv[1])
for host in sys.argv[2:]:
    try:
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(b"PING\r\n")
        print(host, "connected", len(s.recv(100)))
        s.close()
    except OSError as e:
        print(host, "errno", e.errno)
"#;

/// Passthrough mode (the default), where other destinations are dialed
/// from the host: the host's own addresses — any address of any interface,
/// IPv4, IPv6 and v4-mapped IPv6 — are this host, refused like its
/// loopback and recorded as blocked; a service listening on 0.0.0.0/:: on
/// the host never sees a connection.
#[test]
fn isolated_passthrough_never_reaches_the_host_by_its_own_addresses() {
    let addrs = host_addresses();
    let Some(v4) = addrs.iter().find_map(|a| match a {
        std::net::IpAddr::V4(v4) => Some(*v4),
        _ => None,
    }) else {
        return skip("this host has no non-loopback IPv4 address");
    };
    for_both("host-addrs", |r| {
        if !r.child_tool_works("python3", &["-c", ""]) {
            return Err("python3 not available to this uid".into());
        }
        // Dual-stack: IPv4, IPv6 and v4-mapped connections all land here.
        let listener = TcpListener::bind("[::]:0").expect("binding [::]:0");
        let port = listener.local_addr().unwrap().port();
        let script = r.write("connect_any.py", CONNECT_ANY_PY);
        let mut hosts: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
        hosts.push(format!("::ffff:{v4}"));
        hosts.push("0.0.0.0".into());
        let port_s = port.to_string();
        let mut args = vec!["python3", script.to_str().unwrap(), &port_s];
        args.extend(hosts.iter().map(String::as_str));
        let out = r.isolated(&["--allow-empty"], &args)?;
        assert_eq!(out.code, Some(0), "{}", out.ctx());
        assert_eq!(
            received_a_connection(&listener),
            None,
            "the host's listener on port {port} received a connection from the isolated child\n{}",
            out.ctx()
        );
        for host in &hosts {
            assert!(
                out.stdout.contains(&format!("{host} connected 0"))
                    || out.stdout.contains(&format!("{host} errno")),
                "{host}: {}",
                out.ctx()
            );
        }
        assert!(
            out.kind("passthrough").is_empty(),
            "a host address was let through\n{}",
            out.ctx()
        );
        let blocked = out.kind("blocked");
        for a in &addrs {
            let dst = std::net::SocketAddr::new(*a, port).to_string();
            assert!(
                blocked.iter().any(|b| b["dst"] == dst.as_str()),
                "no blocked line for {dst}: {blocked:?}\n{}",
                out.ctx()
            );
        }
        out.assert_isolated_and_verified();
        Ok(())
    });
}

// --- 12. contrast: the explicit tier ----------------------------------------

#[test]
fn explicit_tier_does_not_see_a_client_that_ignores_the_proxy() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    // A local listener stands in for the real api.stripe.com (`--connect-to`),
    // so the direct connection stays on this machine and no name is resolved.
    let stand_in = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    let port = stand_in.local_addr().unwrap().port();
    let r = this_user("explicit");
    let connect_to = format!("api.stripe.com:443:127.0.0.1:{port}");
    let mut child: Vec<&str> = CHARGE_NOPROXY.to_vec();
    child.splice(1..1, ["--connect-to", connect_to.as_str()]);
    // Accept the direct connection and close it: curl fails its handshake.
    let accepted = std::thread::spawn(move || {
        stand_in.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + RUN_TIMEOUT;
        while Instant::now() < deadline {
            match stand_in.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    let mut hello = [0u8; 5];
                    let _ = s.read_exact(&mut hello);
                    return Some(hello[0]);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
        None
    });
    let out = r.run(&["--tier", "explicit"], &child);
    let first_byte = accepted.join().unwrap();
    assert_eq!(
        first_byte,
        Some(0x16),
        "the direct TLS connection bypassed veris and reached the stand-in\n{}",
        out.ctx()
    );
    assert_eq!(
        out.code,
        Some(3),
        "no request reached the twin\n{}",
        out.ctx()
    );
    let receipt = out.receipt();
    assert!(receipt.get("isolation").is_none(), "{receipt}");
    assert_eq!(receipt["interception"], "explicit");
    // A root command could read the proxy's memory: never verified.
    let status = if out.uid == 0 {
        "unverified"
    } else {
        "verified"
    };
    assert_eq!(receipt["integrity"]["status"], status, "{receipt}");
    assert_eq!(out.entries("stripe"), Vec::<String>::new());
    let leaks = out.leaks();
    assert!(
        leaks.contains(&"direct-egress-possible".to_string()),
        "{leaks:?}"
    );
    assert!(
        out.stderr.contains("interception: explicit"),
        "{}",
        out.ctx()
    );
}

// --- 13. the confined tier --------------------------------------------------

#[test]
fn confined_tier_refuses_direct_connects_and_sees_proxied_calls() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    if let Err(why) = support::landlock_ready() {
        return skip(&why);
    }
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    let port = listener.local_addr().unwrap().port();
    let r = this_user("confined");
    // The direct connect first (its exit code), then a curl that honours
    // the proxy variables veris sets.
    let script = format!(
        "curl -sS --max-time 10 --noproxy '*' http://127.0.0.1:{port}/; echo \"direct=$?\"; \
         curl -sS --max-time 20 -o /dev/null -w 'proxied=%{{http_code}}\\n' \
         https://api.stripe.com/v1/charges -d amount=1300 -d currency=usd"
    );
    let out = r.run(&["--tier", "confined"], &["sh", "-c", &script]);
    assert_eq!(out.code, Some(0), "{}", out.ctx());
    assert!(
        out.stdout.contains("direct=7"),
        "curl could not connect (exit 7)\n{}",
        out.ctx()
    );
    assert_eq!(
        received_a_connection(&listener),
        None,
        "the direct connect reached the listener\n{}",
        out.ctx()
    );
    assert!(out.stdout.contains("proxied=200"), "{}", out.ctx());
    let receipt = out.receipt();
    assert_eq!(receipt["isolation"], "landlock", "{receipt}");
    assert_eq!(receipt["interception"], "confined", "{receipt}");
    assert_eq!(receipt["integrity"]["status"], "verified", "{receipt}");
    assert_eq!(out.entries("stripe"), ["POST /v1/charges 200"]);
    let leaks = out.leaks();
    assert!(
        leaks.contains(&"tcp-proxy-port-any-host".to_string()),
        "{leaks:?}"
    );
    assert!(
        !leaks.contains(&"direct-egress-possible".to_string()),
        "{leaks:?}"
    );
    assert!(
        out.stderr.contains("interception: confined"),
        "{}",
        out.ctx()
    );
}

// --- 14. --isolate, and falling back ----------------------------------------

/// A PATH dir holding symlinks to just these programs (found on this PATH).
fn path_with(dir: &TempDir, name: &str, programs: &[&str]) -> PathBuf {
    let bin = dir.join(name);
    std::fs::create_dir(&bin).expect("creating a PATH dir");
    let path = std::env::var_os("PATH").unwrap_or_default();
    for program in programs {
        let found = std::env::split_paths(&path)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("{program} is not on PATH"));
        std::os::unix::fs::symlink(&found, bin.join(program)).expect("symlinking a program");
    }
    bin
}

#[test]
fn isolate_runs_isolated_or_fails_naming_the_missing_tool() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let r = this_user("isolate-flag");

    // Where isolation works, --isolate just runs isolated.
    let out = match r.isolated(&[], CHARGE_NOPROXY) {
        Ok(out) => out,
        Err(why) => return skip(&why),
    };
    assert_eq!(out.code, Some(0), "{}", out.ctx());
    out.assert_isolated_and_verified();
    assert_eq!(out.entries("stripe"), ["POST /v1/charges 200"]);

    // Without `nft` (or `ip`) on PATH the init step cannot isolate: exit 1
    // naming the tool, and the child never starts.
    let proxied = "touch started; curl -sS --max-time 20 -o /dev/null -w 'proxied=%{http_code}\\n' https://api.stripe.com/v1/charges -d amount=1400";
    for (missing, present) in [
        ("nft", ["curl", "sh", "touch", "ip"]),
        ("ip", ["curl", "sh", "touch", "nft"]),
    ] {
        let path = path_with(&r.dir, &format!("no-{missing}"), &present);
        let out = r.run_with(&["--isolate"], &["sh", "-c", proxied], RUN_TIMEOUT, |cmd| {
            // Nor in the sbin dirs veris looks in beyond PATH.
            cmd.env("PATH", &path)
                .env("VERIS_SBIN_DIRS", "")
                .current_dir(&r.work);
        });
        assert_eq!(out.code, Some(1), "{}", out.ctx());
        assert!(
            out.stderr.contains("cannot isolate the command")
                && out.stderr.contains(&format!("`{missing}`")),
            "the message names `{missing}`\n{}",
            out.ctx()
        );
        assert!(
            !r.work.join("started").exists(),
            "the child ran although --isolate failed\n{}",
            out.ctx()
        );
        assert!(out.receipt.is_none(), "{}", out.ctx());
    }

    // Default tier auto: falls back to confined, with one line saying so.
    if let Err(why) = support::landlock_ready() {
        return skip(&why);
    }
    let path = path_with(&r.dir, "no-tools", &["curl", "sh", "touch"]);
    let out = r.run_with(&[], &["sh", "-c", proxied], RUN_TIMEOUT, |cmd| {
        cmd.env("PATH", &path)
            .env("VERIS_SBIN_DIRS", "")
            .current_dir(&r.work);
    });
    assert_eq!(out.code, Some(0), "{}", out.ctx());
    let notes: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("veris: not isolated"))
        .collect();
    assert_eq!(notes.len(), 1, "{}", out.ctx());
    assert!(out.stdout.contains("proxied=200"), "{}", out.ctx());
    let receipt = out.receipt();
    assert_eq!(receipt["isolation"], "landlock", "{receipt}");
    assert_eq!(out.entries("stripe"), ["POST /v1/charges 200"]);
    assert!(out.leaks().contains(&"tcp-proxy-port-any-host".to_string()));
}

// --- 15. exit codes, daemons ------------------------------------------------

#[test]
fn isolated_exit_code_passes_through_and_daemons_do_not_outlive_the_run() {
    for_both("exit", |r| {
        let out = r.isolated(&["--allow-empty"], &["sh", "-c", "exit 7"])?;
        assert_eq!(out.code, Some(7), "{}", out.ctx());
        out.assert_isolated_and_verified();

        let out = r.isolated(&["--allow-empty"], &["sh", "-c", "kill -TERM $$"])?;
        assert_eq!(out.code, Some(128 + 15), "shell convention\n{}", out.ctx());

        // A daemon holding the run's stdout: the run returns promptly, and
        // the pipe reaches EOF — every process of the namespace is gone.
        let (mut cmd, _) = r.command(
            &["--isolate", "--allow-empty"],
            &["sh", "-c", "sleep 300 & echo started"],
        );
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let mut run = Guard::spawn(&mut cmd);
        let mut stdout = run.child().stdout.take().unwrap();
        let mut stderr = run.child().stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stdout.read_to_string(&mut s);
            let _ = tx.send(s);
        });
        let err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        let status = run.wait_timeout(Duration::from_secs(30));
        let elapsed = started.elapsed();
        assert!(
            status.is_some(),
            "veris run is still running after {elapsed:?} with a daemon left behind"
        );
        let stdout = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| {
                panic!("the child's stdout stays open: the daemon outlived the run")
            });
        let stderr = err.join().unwrap();
        assert_eq!(status.unwrap().code(), Some(0), "{stdout}\n{stderr}");
        assert_eq!(stdout.trim(), "started", "{stderr}");
        assert!(
            elapsed < Duration::from_secs(30),
            "took {elapsed:?}\n{stderr}"
        );
        Ok(())
    });
}

// --- 16. red-team regressions ----------------------------------------------

/// Sends `CONNECT <target> HTTP/1.1` for each of argv[2:] (host:port, with
/// port argv[1]) to 203.0.113.9:3128, a redirected address that is no proxy
/// of ours; prints `<target> | <status line> | <whether the body names
/// veris_host_loopback>`.
const CONNECT_LOOPBACK_PY: &str = r#"
import socket, sys
port = sys.argv[1]
for host in sys.argv[2:]:
    target = "%s:%s" % (host, port)
    s = socket.create_connection(("203.0.113.9", 3128), timeout=10)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    data = b""
    try:
        while b"veris_host_loopback" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    except OSError as e:
        print(target, "errno", e.errno)
    s.close()
    status = data.split(b"\r\n", 1)[0].decode(errors="replace")
    print(target, "|", status, "|", b"veris_host_loopback" in data)
"#;

/// B1: a CONNECT to the host's loopback, sent to any redirected address,
/// is refused with 403 `veris_host_loopback` and recorded as blocked, in
/// passthrough mode (the default) and in strict mode; the host's listener
/// on 127.0.0.1 accepts nothing.
#[test]
fn isolated_connect_to_the_hosts_loopback_is_refused_and_blocked() {
    for_both("b1-connect-loopback", |r| {
        if !r.child_tool_works("python3", &["-c", ""]) {
            return Err("python3 not available to this uid".into());
        }
        let script = r.write("connect_loopback.py", CONNECT_LOOPBACK_PY);
        for mode in ["passthrough", "strict"] {
            let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
            let port = listener.local_addr().unwrap().port();
            let port_s = port.to_string();
            let out = r.isolated(
                &["--mode", mode, "--allow-empty"],
                &[
                    "python3",
                    script.to_str().unwrap(),
                    &port_s,
                    "127.0.0.1",
                    "localhost",
                    "[::1]",
                ],
            )?;
            assert_eq!(
                received_a_connection(&listener),
                None,
                "{mode}: the host's 127.0.0.1:{port} received a connection from the isolated child\n{}",
                out.ctx()
            );
            assert_eq!(out.code, Some(0), "{mode}: {}", out.ctx());
            for host in ["127.0.0.1", "localhost", "[::1]"] {
                let line = format!("{host}:{port} | HTTP/1.1 403 Forbidden | True");
                assert!(
                    out.stdout.lines().any(|l| l.trim() == line),
                    "{mode}: expected `{line}`\n{}",
                    out.ctx()
                );
            }
            out.assert_isolated_and_verified();
            let blocked = out.kind("blocked");
            assert_eq!(blocked.len(), 3, "{mode}: {blocked:?}\n{}", out.ctx());
            let mut hosts: Vec<&str> = blocked
                .iter()
                .map(|b| b["host"].as_str().unwrap_or(""))
                .collect();
            hosts.sort();
            assert_eq!(
                hosts,
                ["127.0.0.1", "::1", "localhost"],
                "{mode}: {blocked:?}"
            );
            for b in &blocked {
                assert_eq!(b["port"], port, "{mode}: {b}");
                assert_eq!(b["method"], "CONNECT", "{mode}: {b}");
                assert_eq!(b["dst"], "203.0.113.9:3128", "{mode}: {b}");
                let reason = b["reason"].as_str().unwrap_or("");
                assert!(
                    reason.contains("host's loopback"),
                    "{mode}: the reason names the host's loopback: {b}"
                );
            }
            let receipt = out.receipt();
            for host in ["127.0.0.1", "::1", "localhost"] {
                assert_eq!(receipt["blocked"]["hosts"][host], 1, "{mode}: {receipt}");
            }
            assert_eq!(
                receipt["passthrough"]["hosts"],
                serde_json::json!({}),
                "{mode}: {receipt}"
            );
            assert_eq!(out.leaks(), Vec::<String>::new(), "{mode}: {}", out.ctx());
        }
        Ok(())
    });
}

/// Asks the DNS "resolver" 203.0.113.53 (UDP; the stub answers inside)
/// for an A record of each name in argv[2:], connects to the answer on
/// port argv[1] and sends a line; prints `<name> answer <addr>` and
/// `<name> connected <bytes read>` or `<name> errno <n>`.
const DNS_LOOPBACK_NAME_PY: &str = r#"
import socket, struct, sys

def query(name, qid):
    q = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for part in name.split("."):
        q += bytes([len(part)]) + part.encode()
    return q + b"\x00" + struct.pack("!HH", 1, 1)

def first_a(resp, qid):
    rid, flags, qd, an = struct.unpack("!HHHH", resp[:8])
    assert rid == qid, (rid, qid)
    i = 12
    for _ in range(qd):
        while resp[i] != 0:
            i += resp[i] + 1
        i += 5
    for _ in range(an):
        if resp[i] & 0xC0 == 0xC0:
            i += 2
        else:
            while resp[i] != 0:
                i += resp[i] + 1
            i += 1
        typ, _cls, _ttl, rdlen = struct.unpack("!HHIH", resp[i:i + 10])
        i += 10
        if typ == 1:
            return socket.inet_ntop(socket.AF_INET, resp[i:i + rdlen])
        i += rdlen
    return "none-rcode=%d" % (flags & 0xF)

port = int(sys.argv[1])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(5)
for qid, name in enumerate(sys.argv[2:], 0x100):
    u.sendto(query(name, qid), ("203.0.113.53", 53))
    addr = first_a(u.recvfrom(4096)[0], qid)
    print(name, "answer", addr)
    s = socket.socket()
    s.settimeout(10)
    try:
        s.connect((addr, port))
        s.sendall(b"PING\r\n")
        print(name, "connected", len(s.recv(100)))
    except OSError as e:
        print(name, "errno", e.errno)
    finally:
        s.close()
"#;

/// B2: in passthrough mode a name that the host's resolver would read as
/// loopback (`127.1`, `2130706433`) gets a synthetic address from the stub;
/// the proxy's dial for it must not reach the host's 127.0.0.1.
#[test]
fn isolated_passthrough_of_a_loopback_spelled_name_reaches_nothing_on_the_host() {
    for_both("b2-dns-loopback-name", |r| {
        if !r.child_tool_works("python3", &["-c", ""]) {
            return Err("python3 not available to this uid".into());
        }
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
        let port = listener.local_addr().unwrap().port();
        let port_s = port.to_string();
        let script = r.write("dns_loopback_name.py", DNS_LOOPBACK_NAME_PY);
        // Default mode: passthrough.
        let out = r.isolated(
            &["--allow-empty"],
            &[
                "python3",
                script.to_str().unwrap(),
                &port_s,
                "127.1",
                "2130706433",
            ],
        )?;
        assert_eq!(
            received_a_connection(&listener),
            None,
            "the host's 127.0.0.1:{port} received a connection for a loopback-spelled name\n{}",
            out.ctx()
        );
        assert_eq!(out.code, Some(0), "{}", out.ctx());
        for name in ["127.1", "2130706433"] {
            let answer: Ipv4Addr = out
                .stdout
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name} answer ")))
                .and_then(|a| a.trim().parse().ok())
                .unwrap_or_else(|| panic!("no A answer for {name}\n{}", out.ctx()));
            let [o1, o2, _, _] = answer.octets();
            assert!(
                o1 == 198 && (o2 == 18 || o2 == 19),
                "{name}: {answer} is not in 198.18.0.0/15\n{}",
                out.ctx()
            );
            // Closed without an answer, or refused: never an answer from the host.
            let result = out
                .stdout
                .lines()
                .find_map(|l| {
                    l.strip_prefix(&format!("{name} "))
                        .filter(|l| !l.starts_with("answer"))
                })
                .unwrap_or_else(|| panic!("no connect result for {name}\n{}", out.ctx()));
            assert!(
                result == "connected 0" || result.starts_with("errno"),
                "{name}: {result}\n{}",
                out.ctx()
            );
        }
        let receipt = out.receipt();
        assert_eq!(receipt["isolation"], "netns", "{receipt}");
        assert_eq!(receipt["integrity"]["status"], "verified", "{receipt}");
        // Whatever the receipt calls them, no byte went either way.
        for line in out
            .kind("passthrough")
            .iter()
            .chain(&out.kind("tunnel_close"))
        {
            assert_eq!(line["bytes_out"], 0, "{line}");
            assert_eq!(line["bytes_in"], 0, "{line}");
        }
        println!(
            "b2 ({:?}): passthrough {} blocked {} leaks {}",
            r.who, receipt["passthrough"], receipt["blocked"], receipt["leaks"]
        );
        Ok(())
    });
}

/// B5: the system store inside is the veris bundle, read-only: appending
/// to it fails and the state dir's bundle keeps its bytes.
#[test]
fn isolated_system_trust_store_is_read_only_and_the_bundle_unchanged() {
    const MARKER: &str = "# veris-e2e-appended-marker";
    for_both("b5-trust-ro", |r| {
        // A first run writes the bundle.
        let out = r.isolated(&["--mode", "strict", "--allow-empty"], &["true"])?;
        assert_eq!(out.code, Some(0), "{}", out.ctx());
        let bundle = r.state().join("trust").join("bundle.pem");
        let before = std::fs::read(&bundle)
            .unwrap_or_else(|e| panic!("reading {}: {e}\n{}", bundle.display(), out.ctx()));
        let host_store_before = std::fs::read(SYSTEM_STORE).ok();

        let script = format!("printf '%s\\n' '{MARKER}' >> {SYSTEM_STORE}; echo \"append=$?\"");
        let out = r.isolated(
            &["--mode", "strict", "--allow-empty"],
            &["sh", "-c", &script],
        )?;
        assert_eq!(out.code, Some(0), "{}", out.ctx());
        let append = attack_result(&out.stdout, "append");
        assert_ne!(append, "0", "the append succeeded\n{}", out.ctx());
        assert!(
            out.stderr.contains("Read-only file system"),
            "{}",
            out.ctx()
        );
        out.assert_isolated_and_verified();

        let after = std::fs::read(&bundle).expect("reading the bundle again");
        let text = String::from_utf8_lossy(&after);
        assert!(
            !text.contains(MARKER) && !text.trim_end().ends_with('x'),
            "the state dir's bundle took the append:\n…{}",
            &text[text.len().saturating_sub(300)..]
        );
        assert_eq!(before, after, "the bundle's bytes changed");
        let host_store_after = std::fs::read(SYSTEM_STORE).ok();
        assert_eq!(
            host_store_before, host_store_after,
            "the host's {SYSTEM_STORE} changed"
        );
        Ok(())
    });
}

/// Five datagrams to a non-DNS, non-QUIC port; prints how many were
/// refused with EPERM (the ruleset's drop).
const UDP_FIVE_PY: &str = r#"
import errno, socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
n = 0
for _ in range(5):
    try:
        s.sendto(b"hello", ("203.0.113.5", 9999))
    except OSError as e:
        n += e.errno == errno.EPERM
print("eperm", n)
"#;

/// B6: the command signalling its own process group (SIGTERM, ignored by
/// the shell itself) does not kill what counts dropped datagrams.
#[test]
fn isolated_udp_drop_counter_survives_the_command_signalling_its_group() {
    for_both("b6-udp-counter", |r| {
        if !r.child_tool_works("python3", &["-c", ""]) {
            return Err("python3 not available to this uid".into());
        }
        let py = r.write("udp_five.py", UDP_FIVE_PY);
        let script = format!(
            "trap '' TERM; kill -TERM 0; sleep .3; python3 {}; sleep 1.5",
            py.display()
        );
        let out = r.isolated(
            &["--mode", "strict", "--allow-empty"],
            &["sh", "-c", &script],
        )?;
        assert_eq!(out.stdout.trim(), "eperm 5", "{}", out.ctx());
        assert_eq!(out.code, Some(0), "{}", out.ctx());
        // The counter first (before the workload-root check in `leaks()`).
        assert!(
            out.receipt()["leaks"]
                .as_array()
                .is_some_and(|l| l.iter().any(|l| l == "udp-dropped 5")),
            "the drop counter did not survive kill(0, SIGTERM)\n{}",
            out.ctx()
        );
        out.assert_isolated_and_verified();
        assert_eq!(out.leaks(), ["udp-dropped 5"], "{}", out.ctx());
        let dropped: u64 = out
            .kind("udp_dropped")
            .iter()
            .map(|l| l["packets"].as_u64().unwrap())
            .sum();
        assert_eq!(dropped, 5, "{}", out.ctx());
        Ok(())
    });
}

/// B7a: the command SIGKILLing its own group still leaves a printed and
/// written receipt, within the run's deadline.
#[test]
fn isolated_command_killing_its_own_group_still_gets_a_receipt() {
    for_both("b7a-kill-group", |r| {
        let started = Instant::now();
        // `output_within` fails the test past RUN_TIMEOUT.
        let out = r.isolated(
            &["--mode", "strict", "--allow-empty"],
            &["sh", "-c", "kill -KILL 0"],
        )?;
        let elapsed = started.elapsed();
        assert!(elapsed < RUN_TIMEOUT, "took {elapsed:?}\n{}", out.ctx());
        let receipt = out.receipt();
        assert_eq!(receipt["isolation"], "netns", "{receipt}");
        assert!(
            out.stderr.contains("interception: isolated"),
            "{}",
            out.ctx()
        );
        assert!(out.stderr.contains("Veris receipt"), "{}", out.ctx());
        let code = out
            .code
            .unwrap_or_else(|| panic!("veris run was killed\n{}", out.ctx()));
        assert_ne!(code, 0, "{}", out.ctx());
        println!(
            "b7a ({:?}): exit {code} in {elapsed:?}, integrity {}",
            r.who, receipt["integrity"]["status"]
        );
        Ok(())
    });
}

/// Runs `cmd` with piped output read on threads; waits `first`, then, if
/// still running, sends SIGTERM, and again after two seconds; gives it up to
/// `limit` in all. Returns the status (None: still running at `limit`,
/// then killed), stdout, stderr, how many signals were sent, and the time.
fn run_signalling(
    cmd: &mut Command,
    first: Duration,
    limit: Duration,
) -> (
    Option<std::process::ExitStatus>,
    String,
    String,
    u32,
    Duration,
) {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut run = Guard::spawn(cmd);
    let mut stdout = run.child().stdout.take().unwrap();
    let mut stderr = run.child().stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stdout.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let err_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stderr.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let mut signals = 0;
    let mut status = run.wait_timeout(first);
    if status.is_none() {
        run.signal("TERM");
        signals += 1;
        status = run.wait_timeout(Duration::from_secs(2));
    }
    if status.is_none() {
        run.signal("TERM");
        signals += 1;
        status = run.wait_timeout(limit.saturating_sub(started.elapsed()));
    }
    let elapsed = started.elapsed();
    drop(run); // kills it if it still runs, so the pipes close
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    (status, stdout, stderr, signals, elapsed)
}

/// B7b: the command stopping its own group (SIGTSTP, ignored by the shell
/// itself) must not hang the run; where it does, two SIGTERMs to `veris
/// run` end it, and a receipt is written either way.
#[test]
fn isolated_command_stopping_its_own_group_does_not_hang_the_run() {
    for_both("b7b-tstp-group", |r| {
        let (mut cmd, receipt_path) = r.command(
            &["--isolate", "--mode", "strict", "--allow-empty"],
            &["sh", "-c", "trap '' TSTP; kill -TSTP 0; exit 0"],
        );
        let (status, stdout, stderr, signals, elapsed) =
            run_signalling(&mut cmd, Duration::from_secs(10), Duration::from_secs(30));
        let ctx = format!("status {status:?}, {signals} SIGTERM(s), {elapsed:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}");
        if stderr.contains("cannot isolate the command") {
            return Err(format!("isolation unavailable ({:?})", r.who));
        }
        assert!(
            status.is_some(),
            "veris run did not exit within 30 s\n{ctx}"
        );
        let receipt: Value =
            serde_json::from_str(&std::fs::read_to_string(&receipt_path).unwrap_or_else(|e| {
                panic!("no receipt at {}: {e}\n{ctx}", receipt_path.display())
            }))
            .expect("receipt JSON");
        assert_eq!(receipt["isolation"], "netns", "{receipt}");
        println!(
            "b7b ({:?}): exit {:?} after {signals} SIGTERM(s) in {elapsed:?}; integrity {}",
            r.who,
            status.and_then(|s| s.code()),
            receipt["integrity"]["status"],
        );
        Ok(())
    });
}

/// Sets O_NONBLOCK on fd 2 (shared with `veris run`) and fills that pipe
/// until it would block, then exits 0: `veris run`'s own writes after the
/// command would meet EAGAIN unless it clears the flag.
const NONBLOCK_STDERR_PY: &str = r#"
import fcntl, os
fcntl.fcntl(2, fcntl.F_SETFL, fcntl.fcntl(2, fcntl.F_GETFL) | os.O_NONBLOCK)
n = 0
try:
    while n < (1 << 22):
        n += os.write(2, b"x" * 4096)
except BlockingIOError:
    pass
print("filled", n)
"#;

/// B8: a command leaving the shared stderr non-blocking (and full) does not
/// make `veris run` panic (101) while it prints the receipt to a reader
/// that is slow.
#[test]
fn isolated_nonblocking_stderr_left_by_the_command_does_not_break_the_receipt() {
    for_both("b8-nonblock-stderr", |r| {
        if !r.child_tool_works("python3", &["-c", ""]) {
            return Err("python3 not available to this uid".into());
        }
        let script = r.write("nonblock_stderr.py", NONBLOCK_STDERR_PY);
        let (mut cmd, receipt_path) = r.command(
            &["--isolate", "--mode", "strict", "--allow-empty"],
            &["python3", script.to_str().unwrap()],
        );
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut run = Guard::spawn(&mut cmd);
        let mut stdout = run.child().stdout.take().unwrap();
        let mut stderr = run.child().stderr.take().unwrap();
        let out_t = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stdout.read_to_string(&mut s);
            s
        });
        // The slow reader: nothing read from stderr for two seconds.
        std::thread::sleep(Duration::from_secs(2));
        let err_t = std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = stderr.read_to_end(&mut s);
            String::from_utf8_lossy(&s).into_owned()
        });
        let status = run.wait_timeout(RUN_TIMEOUT);
        drop(run);
        let stdout = out_t.join().unwrap_or_default();
        let stderr = err_t.join().unwrap_or_default();
        // The command's filler, cut from the messages.
        let stderr = stderr.trim_start_matches('x');
        let ctx = format!(
            "status {status:?}\n--- stdout\n{stdout}\n--- stderr (after the filler)\n{stderr}"
        );
        if stderr.contains("cannot isolate the command") {
            return Err(format!("isolation unavailable ({:?})", r.who));
        }
        let status = status.unwrap_or_else(|| panic!("veris run did not exit\n{ctx}"));
        assert!(stdout.starts_with("filled "), "{ctx}");
        assert_ne!(status.code(), Some(101), "veris run panicked\n{ctx}");
        assert_eq!(status.code(), Some(0), "{ctx}");
        assert!(!stderr.contains("panicked"), "{ctx}");
        assert!(stderr.contains("Veris receipt"), "{ctx}");
        assert!(receipt_path.exists(), "no receipt written\n{ctx}");
        Ok(())
    });
}

/// Connects to each unix socket path in argv[1:]; prints `<path> ok` or
/// `<path> errno <n>`.
const UNIX_CONNECT_PY: &str = r#"
import socket, sys
for path in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        print(path, "ok")
    except OSError as e:
        print(path, "errno", e.errno)
    finally:
        s.close()
"#;

/// A unix socket the test listens on, removed on drop.
struct HostSocket {
    path: PathBuf,
    listener: std::os::unix::net::UnixListener,
}

impl HostSocket {
    fn bind(path: PathBuf) -> std::io::Result<HostSocket> {
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path)?;
        // Uid 65534 must be able to connect (write permission on the socket).
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
        listener.set_nonblocking(true)?;
        Ok(HostSocket { path, listener })
    }

    fn accepted(&self) -> bool {
        match self.listener.accept() {
            Ok(_) => true,
            Err(e) if e.kind() == ErrorKind::WouldBlock => false,
            Err(e) => panic!("accept on {}: {e}", self.path.display()),
        }
    }
}

impl Drop for HostSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The host's daemon sockets under /run (Docker, D-Bus, systemd; with it
/// /run/user/UID and /var/run/docker.sock) are hidden from the command by
/// a fresh tmpfs over /run, and those in /tmp (a tmux server, X11) by a
/// private /tmp: a host daemon's socket there is not reachable from inside
/// (ENOENT), and never sees a connection. `--share-tmp` shares the host's
/// /tmp again (documented), and then the same socket is reachable.
#[test]
fn isolated_run_hides_the_hosts_run_and_tmp_sockets() {
    for_both("run-hidden", |r| {
        if !r.child_tool_works("python3", &["-c", ""]) {
            return Err("python3 not available to this uid".into());
        }
        let in_run = PathBuf::from(format!(
            "/run/veris-test-{}-{:?}.sock",
            std::process::id(),
            r.who
        ));
        let in_run = match HostSocket::bind(in_run.clone()) {
            Ok(s) => s,
            Err(e) => return Err(format!("cannot bind {}: {e}", in_run.display())),
        };
        // A host daemon's socket in /tmp, outside the run's work dir.
        let in_tmp = HostSocket::bind(r.dir.join("host.sock")).expect("binding in /tmp");
        let script = r.write("unix_connect.py", UNIX_CONNECT_PY);
        let args = [
            "python3",
            script.to_str().unwrap(),
            in_run.path.to_str().unwrap(),
            in_tmp.path.to_str().unwrap(),
            "/run/user",
            "/var/run/docker.sock",
        ];
        let out = r.isolated(&["--mode", "strict", "--allow-empty"], &args)?;
        assert_eq!(out.code, Some(0), "{}", out.ctx());
        for path in [
            in_run.path.to_str().unwrap(),
            in_tmp.path.to_str().unwrap(),
            "/run/user",
            "/var/run/docker.sock",
        ] {
            assert!(
                out.stdout.contains(&format!("{path} errno 2")),
                "{path} is not there inside (ENOENT)\n{}",
                out.ctx()
            );
        }
        assert!(
            !in_run.accepted(),
            "the /run socket accepted\n{}",
            out.ctx()
        );
        assert!(
            !in_tmp.accepted(),
            "the /tmp socket accepted\n{}",
            out.ctx()
        );
        out.assert_isolated_and_verified();

        // Shared on request: the same socket is reachable.
        let out = r.isolated(
            &["--mode", "strict", "--allow-empty", "--share-tmp"],
            &args[..4],
        )?;
        assert_eq!(out.code, Some(0), "{}", out.ctx());
        assert!(
            out.stdout
                .contains(&format!("{} ok", in_tmp.path.display())),
            "{}",
            out.ctx()
        );
        assert!(in_tmp.accepted(), "{}", out.ctx());
        // And the receipt names what was shared.
        assert!(
            out.receipt()["leaks"]
                .as_array()
                .is_some_and(|l| l
                    .iter()
                    .any(|l| l
                        == "host-sockets-reachable (home directories, /tmp, /var/tmp, /dev/shm)")),
            "{}",
            out.ctx()
        );
        Ok(())
    });
}

/// E1: a user whose PATH lacks the sbin dirs (Debian's `nft` is
/// `/usr/sbin/nft`) still gets the isolated tier, and `doctor` agrees.
#[test]
fn a_user_path_without_sbin_still_isolates() {
    let user_path = "/usr/local/bin:/usr/bin:/bin";
    if ["/usr/local/bin", "/usr/bin", "/bin"]
        .iter()
        .any(|d| Path::new(d).join("nft").exists())
    {
        return skip("nft is on a user's PATH here: nothing to find elsewhere");
    }
    for_both("sbin", |runner| {
        let (mut cmd, _) = runner.command(&[], &["true"]);
        cmd.env("PATH", user_path);
        let out = output_within(&mut cmd, Duration::from_secs(60));
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        if stderr.contains("user namespaces") && !stderr.contains("nft") {
            return Err(format!("no user namespaces here: {stderr}"));
        }
        assert!(
            stderr.contains("interception: isolated"),
            "{:?}: {stderr}",
            runner.who
        );
        assert!(!stderr.contains("not isolated"), "{stderr}");
        let mut doctor = if runner.as_nobody {
            let mut c = support::command("setpriv");
            c.args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"])
                .arg(&runner.exe);
            c
        } else {
            Command::new(&runner.exe)
        };
        doctor
            .env("PATH", user_path)
            .env("HOME", &runner.work)
            .current_dir(&runner.work)
            .arg("doctor")
            .arg("--state-dir")
            .arg(runner.state());
        let out = output_within(&mut doctor, Duration::from_secs(60));
        let report = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            report.lines().any(|l| l.starts_with("ok   nft: ")),
            "{report}"
        );
        Ok(())
    });
}

/// A host this machine can route to that is not this machine: the far end
/// of a veth pair in a namespace of its own, listening on nothing, so every
/// connection to it is refused. No route leaves the machine; removed on drop.
struct RefusingPeer {
    netns: String,
    addr: Ipv4Addr,
}

impl RefusingPeer {
    fn create(tag: &str) -> Result<RefusingPeer, String> {
        if euid() != 0 {
            return Err("making a veth pair needs root".into());
        }
        let n = std::process::id() % 200 + 20;
        let netns = format!("veris-{tag}-{}", std::process::id());
        let (host_if, peer_if) = (format!("vrh{n}"), format!("vrp{n}"));
        let (host_addr, addr) = (
            format!("10.251.{n}.1/30"),
            Ipv4Addr::new(10, 251, n as u8, 2),
        );
        let ip = |args: &[&str]| -> Result<(), String> {
            let out = output_within(Command::new("ip").args(args), support::DEADLINE);
            match out.status.success() {
                true => Ok(()),
                false => Err(format!(
                    "ip {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                )),
            }
        };
        ip(&["netns", "add", &netns])?;
        let peer = RefusingPeer { netns, addr };
        let ns = peer.netns.as_str();
        let peer_addr = format!("{addr}/30");
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &peer_if, "netns", ns,
        ])?;
        ip(&["addr", "add", &host_addr, "dev", &host_if])?;
        ip(&["link", "set", &host_if, "up"])?;
        ip(&["-n", ns, "addr", "add", &peer_addr, "dev", &peer_if])?;
        ip(&["-n", ns, "link", "set", &peer_if, "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        Ok(peer)
    }
}

impl Drop for RefusingPeer {
    fn drop(&mut self) {
        // Deleting the namespace deletes both ends of the pair.
        let _ = output_within(
            Command::new("ip").args(["netns", "del", &self.netns]),
            support::DEADLINE,
        );
    }
}

/// E1.5: a passthrough whose dial fails is recorded as a failure: its
/// `passthrough` line names no destination (nothing was reached, and never
/// veris's own DNS answer), a `tunnel_close` line says why and which
/// address was dialed, and the receipt lists it as not reached rather than
/// as a passthrough that worked. Both ways a passthrough dials: TLS relayed
/// to the original destination, and plain HTTP forwarded by the proxy.
#[test]
fn isolated_passthrough_that_cannot_connect_is_recorded_as_not_reached() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let peer = match RefusingPeer::create("e15") {
        Ok(peer) => peer,
        Err(why) => return skip(&format!("e1.5: {why}")),
    };
    let peer_ip = peer.addr.to_string();
    for_both("e15-unreached", |r| {
        let https = format!("https://{peer_ip}:443/");
        let http = format!("http://{peer_ip}:8080/");
        let script = format!(
            "curl -sS --max-time 10 -o /dev/null {https}; echo tls=$?; \
             curl -sS --max-time 10 -o /dev/null -w '%{{http_code}}\\n' {http}; echo http=$?"
        );
        let out = r.isolated(&["--allow-empty"], &["sh", "-c", &script])?;
        assert_eq!(out.code, Some(0), "{}", out.ctx());
        assert!(!out.stdout.contains("tls=0"), "{}", out.ctx());
        assert!(
            out.stdout.contains("502"),
            "plain HTTP got no 502\n{}",
            out.ctx()
        );
        let passes = out.kind("passthrough");
        assert_eq!(passes.len(), 2, "{}", out.ctx());
        for pass in &passes {
            assert!(
                pass["dst"].is_null(),
                "a failed dial names a destination: {pass}"
            );
            let close = out
                .kind("tunnel_close")
                .into_iter()
                .find(|c| c["of"] == pass["seq"])
                .unwrap_or_else(|| panic!("no tunnel_close for {pass}\n{}", out.ctx()));
            let error = close["error"].as_str().unwrap_or_default();
            assert!(
                error.contains(&format!("{peer_ip}:")) && error.contains("refused"),
                "the close does not say what was dialed and why: {close}"
            );
        }
        let receipt = out.receipt();
        assert_eq!(
            receipt["passthrough"]["hosts"],
            serde_json::json!({}),
            "{receipt}"
        );
        let unreached = &receipt["passthrough"]["unreached"];
        assert_eq!(unreached[0]["host"], peer_ip.as_str(), "{receipt}");
        assert_eq!(unreached[0]["count"], 2, "{receipt}");
        assert!(
            out.stderr
                .contains(&format!("passthrough not reached: \"{peer_ip}\" (2)")),
            "{}",
            out.ctx()
        );
        Ok(())
    });
}

/// Reads the first 4 KiB of its parent's heap through /proc (what a root
/// command can do to the proxy that started it), and says whether it could.
const READ_PARENT_HEAP_PY: &str = r#"
import os
ppid = os.getppid()
try:
    with open(f"/proc/{ppid}/maps") as maps:
        heap = next(l for l in maps if l.rstrip().endswith("[heap]"))
    start = int(heap.split("-")[0], 16)
    with open(f"/proc/{ppid}/mem", "rb") as mem:
        mem.seek(start)
        print("read", len(mem.read(4096)))
except (OSError, StopIteration) as e:
    print("denied", type(e).__name__)
"#;

/// H4 (custody): in the explicit tier the command runs in the proxy's own
/// namespaces; as root it holds CAP_SYS_PTRACE and reads the proxy's
/// memory, seal key included, non-dumpable or not. Such a run is never
/// `verified` and its leaks say `workload-root`; as another user the read
/// is refused and the run verifies.
#[test]
fn a_root_command_in_the_explicit_tier_never_reads_verified() {
    for_both("explicit-root", |r| {
        if !r.child_tool_works("python3", &["-c", ""]) {
            return Err("python3 not available to this uid".into());
        }
        let script = r.write("read_parent_heap.py", READ_PARENT_HEAP_PY);
        let out = r.run(
            &["--tier", "explicit", "--allow-empty"],
            &["python3", script.to_str().unwrap()],
        );
        assert_eq!(out.code, Some(0), "{}", out.ctx());
        let receipt = out.receipt();
        let custody = receipt["integrity"]["checks"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "custody"))
            .cloned();
        if out.uid == 0 {
            assert!(out.stdout.contains("read 4096"), "{}", out.ctx());
            assert_eq!(receipt["integrity"]["status"], "unverified", "{receipt}");
            let custody = custody.unwrap_or_else(|| panic!("no custody check: {receipt}"));
            assert!(
                custody["detail"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("workload ran as root"),
                "{custody}"
            );
            assert!(
                out.leaks().contains(&"workload-root".to_string()),
                "{receipt}"
            );
        } else {
            assert!(out.stdout.contains("denied"), "{}", out.ctx());
            assert_eq!(receipt["integrity"]["status"], "verified", "{receipt}");
            assert!(
                !out.leaks().contains(&"workload-root".to_string()),
                "{receipt}"
            );
        }
        Ok(())
    });
}
