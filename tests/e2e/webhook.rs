//! Webhooks from the built-in twin (W1, DESIGN §15): `veris run --webhook
//! stripe=URL` delivers the twin's `charge.succeeded` for a charge the
//! command made to the command's own app, signed so the official `stripe`
//! SDK's `Webhook.construct_event` accepts it with `STRIPE_WEBHOOK_SECRET`
//! from the command's environment; every attempt is a `callback` line.
//! Attacks: an app that never answers or sends an endless body is cut off,
//! recorded, and holds up no other delivery; a workload that posts to its
//! own app, or writes callback-looking text into a request, makes no
//! `callback` line.

use crate::support;

use std::path::{Path, PathBuf};

use serde_json::Value;
use support::{output, skip, text, veris, TempDir};

/// The app: one `http.server` per `PORT:MODE` argument, a charge made with
/// curl through the proxy, then waiting (up to `APP_WAIT` seconds) until a
/// delivery to an `ok`/`flaky` server verified as `charge.succeeded`.
/// Modes: `ok` (verifies with the SDK: 200, or 400 when it does not verify),
/// `wrong-secret` (verifies with another secret: 400), `flaky` (500 twice,
/// then as `ok`), `hang` (never answers), `endless` (200 and a body
/// without end). With `APP_CUSTOMER=N` it makes N customers before the
/// charge; with `APP_EVENTS=N` it waits for N verified events of any type
/// instead; with `APP_TLS_CERT` and `APP_TLS_KEY` (PEM files) its servers
/// speak HTTPS. It prints `verified TYPE ID` per event, in arrival order.
pub(crate) const APP: &str = r#"
import http.server, json, os, ssl, subprocess, sys, threading, time
import stripe
secret = os.environ.get("STRIPE_WEBHOOK_SECRET", "")
want = int(os.environ.get("APP_EVENTS", "0"))
done = threading.Event()
counts = {}
lock = threading.Lock()

def handler(mode):
    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with lock:
                counts[mode] = counts.get(mode, 0) + 1
                n = counts[mode]
            if mode == "hang":
                time.sleep(120)
                return
            if mode == "endless":
                self.send_response(200)
                self.end_headers()
                try:
                    while True:
                        self.wfile.write(b"x" * 65536)
                except Exception:
                    return
            if mode == "flaky" and n <= 2:
                self.send_response(500)
                self.end_headers()
                return
            key = "whsec_not_the_one" if mode == "wrong-secret" else secret
            try:
                event = stripe.Webhook.construct_event(body, self.headers.get("Stripe-Signature", ""), key)
            except Exception as e:
                self.send_response(400)
                self.end_headers()
                print("rejected", type(e).__name__, flush=True)
                done.set()
                return
            self.send_response(200)
            self.end_headers()
            print("verified", event["type"], event["data"]["object"]["id"], flush=True)
            with lock:
                counts["verified"] = counts.get("verified", 0) + 1
                enough = want > 0 and counts["verified"] >= want
            if enough or (want == 0 and event["type"] == "charge.succeeded"):
                done.set()
        def log_message(self, *args):
            pass
    return H

for arg in sys.argv[1:]:
    port, mode = arg.split(":")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", int(port)), handler(mode))
    if os.environ.get("APP_TLS_CERT"):
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(os.environ["APP_TLS_CERT"], os.environ["APP_TLS_KEY"])
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
for _ in range(int(os.environ.get("APP_CUSTOMER", "0"))):
    subprocess.run(["curl", "-sS", "--max-time", "20", "https://api.stripe.com/v1/customers",
                    "-d", "email=a@example.com"], capture_output=True, text=True)
out = subprocess.run(["curl", "-sS", "--max-time", "20", "https://api.stripe.com/v1/charges",
                      "-d", "amount=100", "-d", "currency=usd"], capture_output=True, text=True)
print("charge", json.loads(out.stdout)["id"], flush=True)
done.wait(float(os.environ.get("APP_WAIT", "20")))
"#;

/// python3 with the `stripe` SDK, and curl; or why not.
pub(crate) fn tools() -> Result<(), String> {
    support::curl()?;
    if support::tool_works("python3", &["-c", "import stripe"]) {
        Ok(())
    } else {
        Err("python3 with the `stripe` SDK not available (pip install stripe)".into())
    }
}

/// A loopback port nothing listens on now.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `veris run` in the explicit tier with `extra` flags and the app serving
/// `servers`, each `PORT:MODE`.
pub(crate) fn run_app(
    dir: &TempDir,
    extra: &[&str],
    servers: &[String],
    env: &[(&str, &str)],
) -> std::process::Output {
    output(&mut app_command(
        dir,
        &["--tier", "explicit"],
        extra,
        servers,
        env,
    ))
}

/// `veris run TIER EXTRA -- python3 APP SERVERS` (see [`APP`]) in `dir`,
/// which an isolated run carries into its private /tmp; its state dir is
/// `dir/state`.
pub(super) fn app_command(
    dir: &TempDir,
    tier: &[&str],
    extra: &[&str],
    servers: &[String],
    env: &[(&str, &str)],
) -> std::process::Command {
    let app = dir.join("app.py");
    std::fs::write(&app, APP).expect("writing the app");
    let mut cmd = veris(["run"]);
    cmd.args(tier)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .current_dir(dir.path())
        .env("VERIS_WEBHOOK_TIME_SCALE", "0.001")
        .envs(env.iter().copied())
        .args(extra)
        .arg("--")
        .arg("python3")
        .arg(&app)
        .args(servers);
    cmd
}

/// The run's ledger lines.
pub(crate) fn ledger(dir: &TempDir) -> Vec<Value> {
    let runs = dir.join("state").join("runs");
    let path: PathBuf = std::fs::read_dir(&runs)
        .expect("the runs dir")
        .filter_map(Result::ok)
        .map(|e| e.path().join("ledger.jsonl"))
        .find(|p| p.exists())
        .expect("a run's ledger");
    read_lines(&path)
}

fn read_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("reading the ledger")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// Asserts that the run exited 0, its app verified `charge.succeeded` with
/// the SDK, and the receipt lists that callback answered 200; returns the
/// delivery's ledger line.
pub(crate) fn verified_charge_callback(out: &std::process::Output, dir: &TempDir) -> Value {
    let (stdout, stderr) = text(out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("verified charge.succeeded ch_"),
        "{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains(r#"stripe POST "/webhook" "charge.succeeded" #1 -> 200"#),
        "the receipt lists the callback: {stderr}"
    );
    let lines = ledger(dir);
    let calls = callbacks(&lines);
    calls
        .iter()
        .find(|c| c["event"] == "charge.succeeded")
        .map(|c| (*c).clone())
        .unwrap_or_else(|| panic!("no charge.succeeded line: {calls:?}"))
}

pub(crate) fn callbacks(lines: &[Value]) -> Vec<&Value> {
    lines.iter().filter(|l| l["kind"] == "callback").collect()
}

#[test]
fn the_app_verifies_charge_succeeded_with_the_official_sdk() {
    if let Err(why) = tools() {
        return skip(&why);
    }
    let dir = TempDir::new("webhook-ok");
    let port = free_port();
    let url = format!("stripe=http://127.0.0.1:{port}/webhook");
    let out = run_app(
        &dir,
        &["--webhook", &url, "--require-callback", "/webhook"],
        &[format!("{port}:ok")],
        &[],
    );
    let charge = verified_charge_callback(&out, &dir);
    let stderr = text(&out).1;
    assert_eq!(charge["status"], 200, "{charge}");
    assert_eq!(charge["path"], "/webhook");
    assert_eq!(charge["attempt"], 1);
    assert_eq!(charge["origin"], "twin");
    assert_eq!(charge["target"], format!("127.0.0.1:{port}"));
    // The secret the app was given reaches neither the ledger nor the logs.
    let secret = stripe_secret_of(&stderr);
    let ledger_text = std::fs::read_to_string(
        std::fs::read_dir(dir.join("state").join("runs"))
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.path().join("ledger.jsonl"))
            .find(|p| p.exists())
            .unwrap(),
    )
    .unwrap();
    if let Some(secret) = secret {
        assert!(!ledger_text.contains(&secret));
    }
    assert!(
        !ledger_text.contains("whsec_"),
        "no secret shape in the ledger"
    );
    assert!(
        !stderr.contains("whsec_"),
        "no secret in the logs: {stderr}"
    );
}

/// `veris run` never prints the secret; the app printed nothing of it.
fn stripe_secret_of(stderr: &str) -> Option<String> {
    stderr
        .split_whitespace()
        .find(|w| w.starts_with("whsec_"))
        .map(str::to_string)
}

#[test]
fn an_app_that_answers_500_twice_gets_three_attempts() {
    if let Err(why) = tools() {
        return skip(&why);
    }
    let dir = TempDir::new("webhook-flaky");
    let port = free_port();
    let url = format!("stripe=http://127.0.0.1:{port}/webhook");
    let out = run_app(
        &dir,
        &["--webhook", &url, "--require-callback", "/webhook"],
        &[format!("{port}:flaky")],
        &[],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let lines = ledger(&dir);
    let attempts: Vec<(u64, u64)> = callbacks(&lines)
        .iter()
        .filter(|c| c["event"] == "charge.succeeded")
        .map(|c| {
            (
                c["attempt"].as_u64().unwrap(),
                c["status"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        [(1, 500), (2, 500), (3, 200)],
        "{stdout}\n{stderr}"
    );
    // The HAR lists the attempts apart from the requests, and stays valid
    // HAR 1.2 (the finished run read without its key: unverified).
    if let Err(why) = crate::har::validator() {
        return skip(&why);
    }
    {
        let out = output(veris(["har", "--state-dir"]).arg(dir.join("state")));
        let (har, err) = text(&out);
        assert_eq!(out.status.code(), Some(0), "{har}\n{err}");
        let path = dir.join("run.har");
        std::fs::write(&path, &out.stdout).unwrap();
        crate::har::validate(&path);
        let har: Value = serde_json::from_str(&har).unwrap();
        let entries = har["log"]["entries"].as_array().unwrap();
        let delivered: Vec<(u64, u64)> = entries
            .iter()
            .filter(|e| e["_veris"]["callback"]["event"] == "charge.succeeded")
            .map(|e| {
                (
                    e["_veris"]["callback"]["attempt"].as_u64().unwrap(),
                    e["response"]["status"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(delivered, [(1, 500), (2, 500), (3, 200)], "{har}");
        assert!(
            entries.iter().any(|e| e["request"]["url"]
                .as_str()
                .is_some_and(|u| u.starts_with("https://api.stripe.com/v1/charges"))
                && e["_veris"].get("callback").is_none()),
            "the charge is a request entry: {har}"
        );
    }
}

#[test]
fn a_wrong_secret_is_a_400_on_record() {
    if let Err(why) = tools() {
        return skip(&why);
    }
    let dir = TempDir::new("webhook-wrong");
    let port = free_port();
    let url = format!("stripe=http://127.0.0.1:{port}/webhook");
    let out = run_app(
        &dir,
        &["--webhook", &url, "--require-callback", "/webhook"],
        &[format!("{port}:wrong-secret")],
        &[],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(r#""charge.succeeded" #1 -> 400"#),
        "the receipt shows the 400: {stderr}"
    );
    assert!(
        stderr.contains(r#"required callback "/webhook": at least 1 delivery(ies) of the twin's events answered 2xx; saw"#),
        "{stderr}"
    );
    assert!(
        stdout.contains("rejected SignatureVerificationError"),
        "{stdout}\n{stderr}"
    );
    let lines = ledger(&dir);
    let first = callbacks(&lines)
        .into_iter()
        .find(|c| c["event"] == "charge.succeeded" && c["attempt"] == 1)
        .cloned()
        .unwrap_or_else(|| panic!("no first attempt: {stderr}"));
    assert_eq!(first["status"], 400, "{first}");
}

/// Attack: one app never answers, another sends a body without end; the
/// third gets its delivery all the same, well before the hung attempt's
/// timeout (30 s) could have passed: the app waits 15 s at most.
#[test]
fn a_hung_or_endless_app_holds_up_no_other_delivery() {
    if let Err(why) = tools() {
        return skip(&why);
    }
    let dir = TempDir::new("webhook-hang");
    let (hang, endless, ok) = (free_port(), free_port(), free_port());
    let hooks = [
        format!("stripe=http://127.0.0.1:{hang}/hang"),
        format!("stripe=http://127.0.0.1:{endless}/endless"),
        format!("stripe=http://127.0.0.1:{ok}/webhook"),
    ];
    let mut extra = Vec::new();
    for h in &hooks {
        extra.extend(["--webhook", h.as_str()]);
    }
    let out = run_app(
        &dir,
        &extra,
        &[
            format!("{hang}:hang"),
            format!("{endless}:endless"),
            format!("{ok}:ok"),
        ],
        &[("VERIS_WEBHOOK_TIMEOUT_MS", "30000"), ("APP_WAIT", "15")],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("verified charge.succeeded"),
        "{stdout}\n{stderr}"
    );
    let lines = ledger(&dir);
    let calls = callbacks(&lines);
    let at = |path: &str| -> Vec<&Value> {
        calls
            .iter()
            .copied()
            .filter(|c| c["path"] == path && c["event"] == "charge.succeeded")
            .collect()
    };
    assert_eq!(at("/webhook")[0]["status"], 200);
    let endless_line = at("/endless")[0];
    assert_eq!(endless_line["status"], 200, "{endless_line}");
    assert!(
        endless_line["error"]
            .as_str()
            .unwrap_or_default()
            .contains("cut off"),
        "{endless_line}"
    );
    // No answer came: cut at the session's end, or closed when the app
    // exited; either way on record without a status.
    let hung = at("/hang")[0];
    assert!(hung["status"].is_null(), "{hung}");
    assert!(
        hung["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{hung}"
    );
}

/// Attack: the workload posts a signed-looking event to its own app and
/// puts callback words in a request to the vendor; neither is a callback
/// line: only veris's deliveries are.
#[test]
fn a_workload_cannot_make_a_callback_line() {
    if let Err(why) = tools() {
        return skip(&why);
    }
    let dir = TempDir::new("webhook-forge");
    let port = free_port();
    let script = format!(
        r#"
import http.server, threading, urllib.request, subprocess
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200); self.end_headers()
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", {port}), H)
threading.Thread(target=s.serve_forever, daemon=True).start()
req = urllib.request.Request("http://127.0.0.1:{port}/webhook", data=b'{{"type":"charge.succeeded"}}',
    headers={{"Stripe-Signature": "t=1,v1=00", "Content-Type": "application/json"}})
urllib.request.ProxyHandler({{}})
print(urllib.request.build_opener(urllib.request.ProxyHandler({{}})).open(req).status, flush=True)
subprocess.run(["curl", "-sS", "--max-time", "20", "https://api.stripe.com/v1/customers/callback%20charge.succeeded",
    "-H", "X-Kind: callback", "-H", "Stripe-Signature: t=1,v1=00"], capture_output=True)
"#
    );
    let url = format!("stripe=http://127.0.0.1:{port}/webhook");
    let mut cmd = veris(["run", "--tier", "explicit", "--state-dir"]);
    cmd.arg(dir.join("state")).args([
        "--webhook",
        &url,
        "--require-callback",
        "/webhook",
        "--",
        "python3",
        "-c",
        &script,
    ]);
    let out = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    assert!(stdout.contains("200"), "{stdout}\n{stderr}");
    assert_eq!(
        out.status.code(),
        Some(3),
        "not met by the workload's own post: {stderr}"
    );
    let lines = ledger(&dir);
    assert!(callbacks(&lines).is_empty(), "{:?}", callbacks(&lines));
}

/// `serve --webhook`: the secret is in the env file the app reads; a
/// charge through the proxy is delivered to an app outside, verified by
/// the SDK with that secret, and recorded; the receipt's requirement holds.
#[test]
fn serve_writes_the_secret_to_the_env_file_and_delivers() {
    if let Err(why) = tools() {
        return skip(&why);
    }
    let dir = TempDir::new("webhook-serve");
    let app = ServeApp::start(&dir);
    let port = app.port;
    let hook = format!("stripe=http://127.0.0.1:{port}/webhook");
    let mut serve = support::Serve::start_in(
        dir,
        &[
            "--workload-uid",
            support::DECLARED_WORKLOAD_UID,
            "--webhook",
            &hook,
        ],
    );
    let env_text = std::fs::read_to_string(&serve.env_file).unwrap();
    assert!(
        env_text.contains("export STRIPE_WEBHOOK_SECRET='whsec_"),
        "{env_text}"
    );
    let out = output(serve.curl().args([
        "https://api.stripe.com/v1/charges",
        "-d",
        "amount=100",
        "-d",
        "currency=usd",
    ]));
    assert!(out.status.success(), "{:?}", text(&out));
    app.wait_for("200 charge.succeeded", 1);
    serve.stop();
    let lines = serve.ledger_lines();
    let delivered = callbacks(&lines)
        .into_iter()
        .any(|c| c["event"] == "charge.succeeded" && c["status"] == 200);
    assert!(delivered, "{:?}", callbacks(&lines));
    // The secret is the app's, in the env file; never in the ledger.
    let ledger_text = std::fs::read_to_string(serve.ledger()).unwrap();
    assert!(!ledger_text.contains("whsec_"));
    let mut receipt = veris(["receipt", "--state-dir"]);
    receipt
        .arg(&serve.state)
        .args(["--require-callback", "/webhook"]);
    let out = output(&mut receipt);
    let (stdout, stderr) = text(&out);
    assert!(
        !stdout.contains("FAIL") && !stderr.contains("FAIL"),
        "{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains(r#""charge.succeeded" #1 -> 200"#),
        "{stdout}\n{stderr}"
    );
}

/// An app outside a `serve`: verifies each delivery with the `stripe` SDK
/// and the secret from the serve's env file (read per delivery), answers
/// 200 or 400, and appends `STATUS TYPE` to a file.
const SERVE_APP: &str = r#"
import http.server, re, sys, stripe
port, env_file, got = int(sys.argv[1]), sys.argv[2], sys.argv[3]
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        secret = re.search(r"STRIPE_WEBHOOK_SECRET='([^']+)'", open(env_file).read()).group(1)
        try:
            kind = stripe.Webhook.construct_event(body, self.headers.get("Stripe-Signature", ""), secret)["type"]
            code = 200
        except Exception as e:
            kind, code = type(e).__name__, 400
        self.send_response(code)
        self.end_headers()
        with open(got, "a") as f:
            f.write(f"{code} {kind}\n")
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"#;

/// [`SERVE_APP`] running, listening before this returns (the first
/// attempt must find it up: the next is a minute later).
pub(crate) struct ServeApp {
    pub port: u16,
    got: PathBuf,
    _process: support::Guard,
}

impl ServeApp {
    /// Starts the app for a serve whose env file is `dir/client.env`
    /// (`Serve::start_in`'s).
    pub(crate) fn start(dir: &TempDir) -> ServeApp {
        let (env_file, got) = (dir.join("client.env"), dir.join("got.txt"));
        let port = free_port();
        let mut app_cmd = support::command("python3");
        app_cmd
            .args(["-c", SERVE_APP, &port.to_string()])
            .arg(&env_file)
            .arg(&got);
        let process = support::Guard::spawn(&mut app_cmd);
        support::wait_for("the app to listen", support::DEADLINE, || {
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        });
        ServeApp {
            port,
            got,
            _process: process,
        }
    }

    /// Waits until the app has answered `line` (`200 charge.succeeded`)
    /// `times` times.
    pub(crate) fn wait_for(&self, line: &str, times: usize) {
        support::wait_for(
            &format!("the app's {line} x{times}"),
            support::DEADLINE,
            || {
                let got = std::fs::read_to_string(&self.got).ok()?;
                (got.lines().filter(|l| *l == line).count() >= times).then_some(())
            },
        );
    }
}

/// Bad input: each wrong `--webhook` or `--require-callback` is a usage
/// error that names the syntax, before anything starts.
#[test]
fn bad_webhook_flags_say_the_syntax() {
    let dir = TempDir::new("webhook-bad");
    for (flags, says) in [
        (vec!["--webhook", "stripe"], "SERVICE=http://HOST:PORT/PATH"),
        (
            vec!["--webhook", "stripe=ftp://127.0.0.1/x"],
            "only http:// and https://",
        ),
        (
            vec![
                "--tier",
                "explicit",
                "--webhook",
                "stripe=https://127.0.0.1/x",
                "--webhook-ca",
                "/nonexistent/ca.pem",
            ],
            "--webhook-ca /nonexistent/ca.pem: cannot read it. Next:",
        ),
        (
            vec![
                "--tier",
                "explicit",
                "--webhook",
                "stripe=https://127.0.0.1/x",
                "--webhook-ca",
                "/etc/hostname",
            ],
            "no certificate in it. Next:",
        ),
        (
            vec!["--tier", "explicit", "--webhook-ca", "/etc/hostname"],
            "--webhook-ca needs --webhook",
        ),
        (
            vec!["--webhook", "acme=http://127.0.0.1:1/x"],
            "stripe only",
        ),
        // An isolated run (the default tier, or asked for) delivers into
        // the command's namespace, where only loopback exists.
        (
            vec!["--isolate", "--webhook", "stripe=http://192.0.2.1:1/x"],
            "where only loopback exists",
        ),
        (
            vec!["--webhook", "stripe=http://app.invalid:1/x"],
            "or run with --tier confined",
        ),
        (vec!["--require-callback", "webhook"], "expected PATH[:N]"),
    ] {
        let mut cmd = veris(["run", "--state-dir"]);
        cmd.arg(dir.join("state")).args(&flags).args(["--", "true"]);
        let out = output(&mut cmd);
        let (stdout, stderr) = text(&out);
        assert_ne!(out.status.code(), Some(0), "{flags:?}: {stdout}\n{stderr}");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
    }
}

/// The MCP tools take webhooks and callback requirements as the CLI does:
/// `veris_run` with `webhook` delivers to the command's app and its receipt
/// lists the callback; `veris_receipt` judges `require_callback`.
#[test]
fn the_mcp_tools_deliver_and_judge_callbacks() {
    if let Err(why) = tools() {
        return skip(&why);
    }
    let dir = TempDir::new("webhook-mcp");
    let port = free_port();
    let mut mcp = crate::mcp::Mcp::start_with(&dir.join("state"), &dir, &[]);
    mcp.initialize();
    let run = mcp.call(
        "veris_run",
        serde_json::json!({
            // The app as `-c`: an isolated run's /tmp is its own.
            "command": ["python3", "-c", APP, format!("{port}:ok")],
            "webhook": [format!("stripe=http://127.0.0.1:{port}/webhook")],
            "require_callback": ["/webhook"],
            "timeout_secs": 120,
        }),
    );
    let s = &run["structuredContent"];
    assert_eq!(s["verdict"], "pass", "{run}");
    let entries = s["receipt"]["callbacks"]["entries"].as_array().unwrap();
    assert!(
        entries
            .iter()
            .any(|e| e["event"] == "charge.succeeded" && e["status"] == 200),
        "{run}"
    );
    // Read back from the finished run: one delivery meets ":1", not ":2".
    let met = mcp.call(
        "veris_receipt",
        serde_json::json!({"require_callback": ["/webhook"]}),
    );
    assert!(!crate::mcp::is_error(&met), "{met}");
    let unmet = mcp.call(
        "veris_receipt",
        serde_json::json!({"require_callback": ["/webhook:2"]}),
    );
    assert!(crate::mcp::is_error(&unmet), "{unmet}");
    assert_eq!(unmet["structuredContent"]["exit_code"], 3, "{unmet}");
    mcp.finish();
}

/// The app in Node: verifies each delivery with stripe-node's
/// `webhooks.constructEvent` and `STRIPE_WEBHOOK_SECRET`, after making a
/// charge with curl through the proxy; exits once `charge.succeeded`
/// verified (1 after 20 s without).
const NODE_APP: &str = r#"
const http = require('http');
const { execFileSync } = require('child_process');
const stripe = require('stripe')('sk_test_veris');
const secret = process.env.STRIPE_WEBHOOK_SECRET || '';
const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    let event;
    try {
      event = stripe.webhooks.constructEvent(Buffer.concat(chunks), req.headers['stripe-signature'] || '', secret);
    } catch (e) {
      res.writeHead(400);
      res.end();
      console.log('rejected', e.type || e.message);
      return;
    }
    res.writeHead(200);
    res.end();
    console.log('verified', event.type, event.data.object.id);
    if (event.type === 'charge.succeeded') {
      server.close();
      setTimeout(() => process.exit(0), 200);
    }
  });
});
server.listen(Number(process.argv[2]), '127.0.0.1', () => {
  const out = execFileSync('curl', ['-sS', '--max-time', '20', 'https://api.stripe.com/v1/charges',
                                    '-d', 'amount=100', '-d', 'currency=usd']);
  console.log('charge', JSON.parse(out).id);
});
setTimeout(() => { console.log('no charge.succeeded'); process.exit(1); }, 20000);
"#;

#[test]
fn a_node_app_verifies_charge_succeeded_with_stripe_node() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let modules = match crate::client_matrix::npm_modules() {
        Ok(m) => m,
        Err(why) => return skip(&why),
    };
    let dir = TempDir::new("webhook-node");
    let app = dir.join("app.js");
    std::fs::write(&app, NODE_APP).expect("writing the app");
    let port = free_port();
    let mut cmd = veris(["run", "--tier", "explicit", "--state-dir"]);
    cmd.arg(dir.join("state"))
        .env("NODE_PATH", &modules)
        .arg("--webhook")
        .arg(format!("stripe=http://127.0.0.1:{port}/webhook"))
        .args(["--require-callback", "/webhook", "--", "node"])
        .arg(&app)
        .arg(port.to_string());
    let out = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("verified charge.succeeded ch_"),
        "{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains(r#"stripe POST "/webhook" "charge.succeeded" #1 -> 200"#),
        "{stderr}"
    );
}
