//! Webhooks into an isolated `veris run` (W1, DESIGN §15): the app listens
//! on `127.0.0.1:PORT` inside the run's own network namespace and gets the
//! twin's deliveries there, unchanged; the run stays isolated. The proxy
//! connects sockets the run's init step made inside the namespace.
//! Attacks: a listener of the host on the same port gets nothing; the
//! workload finds no way to have sockets made for it (its own fds, other
//! processes' fds); an app left running in the background when the command
//! exits dies with the namespace, and the receipt says no delivery was
//! answered.
//!
//! Runs that must be isolated use `--isolate`, so a machine that cannot
//! isolate fails them (a SKIP here) instead of falling back.

use crate::support;

use std::net::TcpListener;
use std::time::Duration;

use serde_json::Value;
use support::{output_within, skip, text, veris, TempDir};

use crate::isolated::received_a_connection;
use crate::webhook::{app_command, callbacks, free_port, ledger, tools};

/// One isolated run's deadline (the app waits 20 s at most).
const RUN_TIMEOUT: Duration = Duration::from_secs(90);

/// Why an `--isolate` run could not isolate, if that is why it failed.
fn unavailable(out: &std::process::Output) -> Option<String> {
    let (_, stderr) = text(out);
    (out.status.code() == Some(1))
        .then(|| {
            stderr
                .lines()
                .find(|l| l.contains("cannot isolate the command"))
                .map(|l| format!("isolation unavailable: {}", l.trim()))
        })
        .flatten()
}

/// The JSON receipt a run wrote.
fn receipt(path: &std::path::Path, ctx: &str) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no receipt at {} ({e}):\n{ctx}", path.display()));
    serde_json::from_str(&text).expect("the receipt is JSON")
}

/// `veris run --webhook stripe=http://127.0.0.1:PORT/webhook`, the default
/// tier: isolated, the app inside verifies `charge.succeeded` with the
/// official SDK and the secret from its environment, answers 200, and the
/// requirement holds.
#[test]
fn the_default_run_stays_isolated_and_the_app_inside_verifies_the_delivery() {
    if let Err(why) = tools() {
        return skip(&why);
    }
    let dir = TempDir::new("webhook-iso");
    let port = free_port();
    let url = format!("stripe=http://127.0.0.1:{port}/webhook");
    let receipt_file = dir.join("receipt.json");
    let receipt_arg = receipt_file.display().to_string();
    let mut cmd = app_command(
        &dir,
        &[],
        &[
            "--webhook",
            &url,
            "--require-callback",
            "/webhook",
            "--receipt",
            &receipt_arg,
        ],
        &[format!("{port}:ok")],
        &[],
    );
    let out = output_within(&mut cmd, RUN_TIMEOUT);
    let (stdout, stderr) = text(&out);
    if let Some(line) = stderr.lines().find(|l| l.contains("veris: not isolated (")) {
        return skip(&format!("isolation unavailable: {}", line.trim()));
    }
    let ctx = format!("{stdout}\n{stderr}");
    assert_eq!(out.status.code(), Some(0), "{ctx}");
    assert!(stderr.contains("interception: isolated"), "{ctx}");
    assert_eq!(receipt(&receipt_file, &ctx)["interception"], "isolated");
    assert!(stdout.contains("verified charge.succeeded ch_"), "{ctx}");
    assert!(
        stderr.contains(r#"stripe POST "/webhook" "charge.succeeded" #1 -> 200"#),
        "{ctx}"
    );
    let lines = ledger(&dir);
    let charge = callbacks(&lines)
        .into_iter()
        .find(|c| c["event"] == "charge.succeeded")
        .cloned()
        .unwrap_or_else(|| panic!("no charge.succeeded line:\n{ctx}"));
    assert_eq!(charge["status"], 200, "{charge}");
    assert_eq!(charge["attempt"], 1, "{charge}");
    assert_eq!(charge["target"], format!("127.0.0.1:{port}"), "{charge}");
}

/// Attack: a listener of the host holds `127.0.0.1:PORT` too. The
/// isolated run's delivery reaches the app inside, never the host's
/// listener (a host dial would have reached it: it is the one on the
/// host's loopback).
#[test]
fn a_listener_of_the_host_on_the_apps_port_gets_no_delivery() {
    if let Err(why) = tools() {
        return skip(&why);
    }
    let dir = TempDir::new("webhook-iso-host");
    let host = TcpListener::bind("127.0.0.1:0").expect("a host listener");
    let port = host.local_addr().expect("its address").port();
    let url = format!("stripe=http://127.0.0.1:{port}/webhook");
    let mut cmd = app_command(
        &dir,
        &["--isolate"],
        &["--webhook", &url, "--require-callback", "/webhook"],
        &[format!("{port}:ok")],
        &[],
    );
    let out = output_within(&mut cmd, RUN_TIMEOUT);
    if let Some(why) = unavailable(&out) {
        return skip(&why);
    }
    let (stdout, stderr) = text(&out);
    let ctx = format!("{stdout}\n{stderr}");
    assert_eq!(out.status.code(), Some(0), "{ctx}");
    assert!(stdout.contains("verified charge.succeeded"), "{ctx}");
    assert_eq!(
        received_a_connection(&host),
        None,
        "the host's listener got a connection:\n{ctx}"
    );
    let lines = ledger(&dir);
    let statuses: Vec<&Value> = callbacks(&lines).iter().map(|c| &c["status"]).collect();
    assert!(!statuses.is_empty(), "{ctx}");
    assert!(statuses.iter().all(|s| **s == 200), "{statuses:?}\n{ctx}");
}

/// The workload's attempts on the socket factory: each of its own fds,
/// then each fd of every process it can see taken with `pidfd_getfd`, is
/// checked for a unix socket (either end of the factory's pair: the init
/// step's end would let it answer the proxy's requests with sockets of its
/// choosing) and asked for a socket the factory's way; prints `scanned N
/// unix [...] got [...]`.
const PROBE: &str = r#"
import ctypes, os, select, socket
libc = ctypes.CDLL(None, use_errno=True)
ASK = b'{"ipv6":false}\n'

def answers_with_a_socket(fd):
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        s.setblocking(False)
        try:
            s.send(ASK)
        except OSError:
            return False
        if not select.select([s], [], [], 1.0)[0]:
            return False
        _, anc, _, _ = s.recvmsg(4096, socket.CMSG_SPACE(64))
        return any(l == socket.SOL_SOCKET and t == socket.SCM_RIGHTS for l, t, _ in anc)
    except OSError:
        return False
    finally:
        s.close()

def is_unix(fd):
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    family = s.family
    s.close()
    return family == socket.AF_UNIX

scanned, unix, got = 0, [], []
def check(fd, what):
    global scanned
    scanned += 1
    if is_unix(fd):
        unix.append(what)
    if answers_with_a_socket(fd):
        got.append(what)

for fd in [int(n) for n in os.listdir("/proc/self/fd")]:
    check(fd, f"own fd {fd}")
for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
    if pid == os.getpid():
        continue
    pidfd = libc.syscall(434, pid, 0)  # pidfd_open
    if pidfd < 0:
        continue
    for target in range(0, 64):
        fd = libc.syscall(438, pidfd, target, 0)  # pidfd_getfd
        if fd < 0:
            continue
        check(fd, f"pid {pid} fd {target}")
        os.close(fd)
    os.close(pidfd)
print("scanned", scanned, "unix", unix, "got", got, flush=True)
"#;

/// Attack: the workload looks for the socket factory's pair among its own
/// fds and takes what it can of other processes' (pid 1 of its namespace
/// included). It finds no unix socket at all: the init step's end is
/// close-on-exec (neither pid 1 nor the command inherits it) and the init
/// step lives outside the command's PID namespace. Holding that end, it
/// could answer the proxy's requests itself (the proxy checks what it gets
/// is an unconnected TCP socket, of the namespace or not: see
/// `tier::app_sockets`).
#[test]
fn the_workload_cannot_reach_the_socket_factory() {
    if let Err(why) = tools() {
        return skip(&why);
    }
    let dir = TempDir::new("webhook-iso-probe");
    let port = free_port();
    let url = format!("stripe=http://127.0.0.1:{port}/webhook");
    let mut cmd = veris(["run", "--isolate", "--state-dir"]);
    cmd.arg(dir.join("state")).current_dir(dir.path()).args([
        "--webhook",
        &url,
        "--",
        "python3",
        "-c",
        PROBE,
    ]);
    let out = output_within(&mut cmd, RUN_TIMEOUT);
    if let Some(why) = unavailable(&out) {
        return skip(&why);
    }
    let (stdout, stderr) = text(&out);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("scanned "))
        .unwrap_or_else(|| panic!("the probe did not finish:\n{stdout}\n{stderr}"));
    assert!(line.ends_with("unix [] got []"), "{line}\n{stderr}");
    assert!(stderr.contains("interception: isolated"), "{stderr}");
}

/// The app runs in the background and the command exits right after the
/// charge, the app still holding its delivery unanswered. Pid 1 exits with
/// the command, which ends every process of the namespace, the app too:
/// the delivery is on record without a status, the requirement fails (exit
/// 3) and the run does not wait for the app.
#[test]
fn an_app_left_running_when_the_command_exits_answers_nothing() {
    if let Err(why) = tools() {
        return skip(&why);
    }
    let dir = TempDir::new("webhook-iso-left");
    let port = free_port();
    let script = format!(
        r#"
import socket, subprocess, time
app = '''
import http.server, time
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        time.sleep(60)
        self.send_response(200); self.end_headers()
http.server.ThreadingHTTPServer(("127.0.0.1", {port}), H).serve_forever()
'''
subprocess.Popen(["python3", "-c", app], start_new_session=True)
for _ in range(200):
    try:
        socket.create_connection(("127.0.0.1", {port})).close()
        break
    except OSError:
        time.sleep(0.05)
out = subprocess.run(["curl", "-sS", "--max-time", "20", "https://api.stripe.com/v1/charges",
                      "-d", "amount=100", "-d", "currency=usd"], capture_output=True, text=True)
print("charged", out.stdout[:40], flush=True)
"#
    );
    let url = format!("stripe=http://127.0.0.1:{port}/webhook");
    let mut cmd = veris(["run", "--isolate", "--state-dir"]);
    cmd.arg(dir.join("state"))
        .current_dir(dir.path())
        .env("VERIS_WEBHOOK_TIME_SCALE", "0.001")
        .args([
            "--webhook",
            &url,
            "--require-callback",
            "/webhook",
            "--",
            "python3",
            "-c",
            &script,
        ]);
    let out = output_within(&mut cmd, RUN_TIMEOUT);
    if let Some(why) = unavailable(&out) {
        return skip(&why);
    }
    let (stdout, stderr) = text(&out);
    let ctx = format!("{stdout}\n{stderr}");
    assert!(stdout.contains("charged {"), "{ctx}");
    assert_eq!(out.status.code(), Some(3), "{ctx}");
    let lines = ledger(&dir);
    let calls = callbacks(&lines);
    assert!(!calls.is_empty(), "the delivery is on record:\n{ctx}");
    for call in &calls {
        assert!(call["status"].is_null(), "{call}\n{ctx}");
        assert!(
            call["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{call}"
        );
    }
}
