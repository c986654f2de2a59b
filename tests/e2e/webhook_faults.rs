//! Webhook deliveries veris makes on demand or wrong on purpose (W1,
//! issue #31): `veris trigger` and `veris replay` against a live `serve`,
//! and `--webhook-faults`. Each such delivery is on record with its origin
//! or fault, verified (or rejected) by the official `stripe` SDK in a real
//! app, and never counts toward `--require-callback`.
//! Attacks: a workload calling trigger from inside a run has no admin API to
//! reach; an admin call without the token is refused and records nothing;
//! a triggered or faulted delivery never satisfies a requirement.

use crate::support;
use crate::webhook::{callbacks, free_port, ledger, run_app, tools, ServeApp};

use serde_json::Value;
use support::{output, skip, text, veris, Serve, TempDir};

/// A serve delivering stripe's events to a [`ServeApp`].
fn serve_with_app(label: &str, extra: &[&str]) -> (Serve, ServeApp) {
    let dir = TempDir::new(label);
    let app = ServeApp::start(&dir);
    let hook = format!("stripe=http://127.0.0.1:{}/webhook", app.port);
    let mut flags = vec![
        "--workload-uid",
        support::DECLARED_WORKLOAD_UID,
        "--webhook",
        &hook,
    ];
    flags.extend_from_slice(extra);
    let serve = Serve::start_in(dir, &flags);
    (serve, app)
}

/// `veris trigger|replay ARGS --state-dir STATE`.
fn ask(serve: &Serve, args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = veris(args);
    cmd.arg("--state-dir").arg(&serve.state);
    let out = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    (out.status.code(), stdout, stderr)
}

/// `veris receipt --require-callback REQ` over the serve's state dir.
fn receipt_requiring(serve: &Serve, req: &str) -> (Option<i32>, String) {
    let mut cmd = veris(["receipt", "--state-dir"]);
    cmd.arg(&serve.state).args(["--require-callback", req]);
    let out = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    (out.status.code(), format!("{stdout}\n{stderr}"))
}

/// `veris trigger stripe customer.created` delivers a fixture customer the
/// SDK verifies; the line says `origin: trigger`, and a requirement over
/// the receipt is not met by it (and says why).
#[test]
fn trigger_delivers_a_fixture_event_that_never_counts() {
    if let Err(why) = tools() {
        return skip(&why);
    }
    let (mut serve, app) = serve_with_app("wh-trigger", &[]);
    let (code, stdout, stderr) = ask(&serve, &["trigger", "stripe", "customer.created"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("stripe customer.created evt_") && stdout.contains("(trigger)"),
        "{stdout}"
    );
    app.wait_for("200 customer.created", 1);
    serve.stop();
    let lines = serve.ledger_lines();
    let calls = callbacks(&lines);
    assert_eq!(calls.len(), 1, "{calls:?}");
    let line = calls[0];
    assert_eq!(
        (&line["event"], &line["origin"], &line["status"]),
        (
            &Value::from("customer.created"),
            &Value::from("trigger"),
            &Value::from(200)
        ),
        "{line}"
    );
    assert!(line["fault"].is_null(), "{line}");
    // No customer exists in the twin for it: nothing was created.
    assert!(
        lines.iter().all(|l| l["kind"] != "request"),
        "a trigger makes no request line"
    );
    let (code, said) = receipt_requiring(&serve, "/webhook");
    assert_eq!(code, Some(3), "{said}");
    assert!(
        said.contains("1 more were triggered, replayed or fault-injected: not counted"),
        "{said}"
    );
    assert!(
        said.contains(r#""customer.created" #1 -> 200 [trigger: not counted]"#),
        "{said}"
    );
    // The JSON receipt carries the origin, and counts it apart.
    let mut cmd = veris(["receipt", "--json", "--state-dir"]);
    cmd.arg(&serve.state);
    let out = output(&mut cmd);
    let receipt: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {:?}", text(&out)));
    let callbacks = &receipt["callbacks"];
    assert_eq!(callbacks["entries"][0]["origin"], "trigger", "{callbacks}");
    assert!(
        callbacks["entries"][0].get("fault").is_none(),
        "{callbacks}"
    );
    assert_eq!(
        callbacks["statuses"]["trigger"]["/webhook"]["200"], 1,
        "{callbacks}"
    );
    assert!(callbacks["statuses"].get("twin").is_none(), "{callbacks}");
}

/// An event the twin delivered, replayed: two deliveries with one id, the
/// second `origin: replay`, and only the first counts.
#[test]
fn replay_sends_the_same_event_again_and_only_the_first_counts() {
    if let Err(why) = tools() {
        return skip(&why);
    }
    let (mut serve, app) = serve_with_app("wh-replay", &[]);
    let out = output(serve.curl().args(&support::CURL_CHARGE[1..]));
    assert!(out.status.success(), "{:?}", text(&out));
    app.wait_for("200 charge.succeeded", 1);
    // The line is written once veris has the app's answer, a moment after
    // the app logged it.
    let first = support::wait_for("the twin's delivery on record", support::DEADLINE, || {
        callbacks(&serve.ledger_lines())
            .into_iter()
            .find(|c| c["event"] == "charge.succeeded")
            .cloned()
    });
    let id = first["event_id"].as_str().unwrap().to_string();
    let (code, stdout, stderr) = ask(&serve, &["replay", &id]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&id) && stdout.contains("(replay)"),
        "{stdout}"
    );
    app.wait_for("200 charge.succeeded", 2);
    serve.stop();
    let lines = serve.ledger_lines();
    let same: Vec<&Value> = callbacks(&lines)
        .into_iter()
        .filter(|c| c["event_id"] == id.as_str())
        .collect();
    let origins: Vec<&str> = same.iter().map(|c| c["origin"].as_str().unwrap()).collect();
    assert_eq!(origins, ["twin", "replay"], "{same:?}");
    assert!(same.iter().all(|c| c["status"] == 200), "{same:?}");
    let (code, said) = receipt_requiring(&serve, "/webhook:2");
    assert_eq!(code, Some(3), "{said}");
    assert!(
        said.contains("saw 1, with status 200 (1 more were"),
        "{said}"
    );
    let (code, said) = receipt_requiring(&serve, "/webhook");
    assert_eq!(code, Some(0), "{said}");
}

/// Bad input to trigger and replay: unknown event, a service without a
/// webhook, an unknown id, no live proxy: each a clear error, nonzero.
#[test]
fn trigger_and_replay_refuse_what_they_cannot_do() {
    if let Err(why) = tools() {
        return skip(&why);
    }
    let (mut serve, _app) = serve_with_app("wh-refuse", &[]);
    for (args, says) in [
        (
            vec!["trigger", "stripe", "charge.refunded"],
            "customer.created, charge.succeeded",
        ),
        (
            vec!["trigger", "github", "push"],
            "no --webhook names \"github\"",
        ),
        (vec!["replay", "evt_nope"], "no event \"evt_nope\""),
        (vec!["trigger", "stripe", "a b"], "is not a name"),
    ] {
        let (code, stdout, stderr) = ask(&serve, &args);
        assert_eq!(code, Some(1), "{args:?}: {stdout}\n{stderr}");
        assert!(
            stderr.contains(says) && stderr.contains("Next:"),
            "{args:?}: {stderr}"
        );
    }
    serve.stop();
    assert!(callbacks(&serve.ledger_lines()).is_empty());
    // The proxy is gone: nothing to ask.
    let (code, _, stderr) = ask(&serve, &["trigger", "stripe", "customer.created"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("no live veris proxy") && stderr.contains("Next:"),
        "{stderr}"
    );
}

/// Attack: an admin call without the token (what a workload that cannot
/// read `admin.token` has) is a 401 and records nothing; with it, the
/// trigger is on record as such and still never counts.
#[test]
fn an_admin_call_without_the_token_triggers_nothing() {
    if let Err(why) = tools() {
        return skip(&why);
    }
    let (mut serve, _app) = serve_with_app("wh-401", &[]);
    for path in [
        "/webhooks/trigger?service=stripe&event=charge.succeeded",
        "/webhooks/replay?event_id=evt_1",
    ] {
        let (status, body) = support::http(serve.admin(), "POST", path, "127.0.0.1", "", "");
        assert_eq!(status, 401, "{path}: {body}");
        let (status, body) = support::http(
            serve.admin(),
            "POST",
            path,
            "127.0.0.1",
            "Authorization: Bearer not-the-token\r\n",
            "",
        );
        assert_eq!(status, 401, "{path}: {body}");
    }
    serve.stop();
    assert!(callbacks(&serve.ledger_lines()).is_empty());
}

/// Attack: the command of a `veris run` calls `veris trigger` to satisfy
/// its own requirement. A run has no admin API (no `admin.addr`, no token
/// in the state dir or the environment), so there is nothing to ask; the
/// requirement stays unmet.
#[test]
fn a_run_cannot_trigger_its_own_callback() {
    if let Err(why) = tools() {
        return skip(&why);
    }
    let dir = TempDir::new("wh-self");
    let state = dir.join("state");
    let port = free_port();
    let hook = format!("stripe=http://127.0.0.1:{port}/webhook");
    let script = format!(
        r#"
import http.server, threading, subprocess, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200); self.end_headers()
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", {port}), H)
threading.Thread(target=s.serve_forever, daemon=True).start()
print("token in env:", any("ADMIN_TOKEN" in k for k in os.environ), flush=True)
print("admin files:", [f for f in os.listdir(sys.argv[2]) if f.startswith("admin.")], flush=True)
r = subprocess.run([sys.argv[1], "trigger", "stripe", "charge.succeeded", "--state-dir", sys.argv[2]],
                   capture_output=True, text=True)
print("trigger exit", r.returncode, r.stderr.strip(), flush=True)
"#
    );
    let mut cmd = veris(["run", "--tier", "explicit", "--state-dir"]);
    cmd.arg(&state)
        .args(["--webhook", &hook, "--require-callback", "/webhook"])
        .args(["--", "python3", "-c", &script])
        .arg(support::bin())
        .arg(&state);
    let out = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    assert!(stdout.contains("token in env: False"), "{stdout}\n{stderr}");
    assert!(stdout.contains("admin files: []"), "{stdout}\n{stderr}");
    assert!(stdout.contains("trigger exit 1"), "{stdout}\n{stderr}");
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(callbacks(&ledger(&dir)).is_empty());
}

/// The app's stdout lines `verified TYPE ID`, in arrival order.
fn verified(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("verified "))
        .filter_map(|l| l.split_whitespace().next())
        .collect()
}

/// bad-signature and stale-signature: the SDK app rejects each delivery
/// (400), which is on record with its fault; the requirement is unmet.
#[test]
fn signature_faults_are_rejected_by_the_sdk_and_recorded() {
    if let Err(why) = tools() {
        return skip(&why);
    }
    for fault in ["bad-signature", "stale-signature"] {
        let dir = TempDir::new("wh-sig");
        let port = free_port();
        let url = format!("stripe=http://127.0.0.1:{port}/webhook");
        let out = run_app(
            &dir,
            &[
                "--webhook",
                &url,
                "--webhook-faults",
                fault,
                "--require-callback",
                "/webhook",
            ],
            &[format!("{port}:ok")],
            &[],
        );
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(3), "{fault}: {stdout}\n{stderr}");
        assert!(
            stdout.contains("rejected SignatureVerificationError"),
            "{fault}: {stdout}\n{stderr}"
        );
        let lines = ledger(&dir);
        let first = callbacks(&lines)
            .into_iter()
            .find(|c| c["event"] == "charge.succeeded" && c["attempt"] == 1)
            .cloned()
            .unwrap_or_else(|| panic!("{fault}: no first attempt: {stderr}"));
        assert_eq!(first["status"], 400, "{first}");
        assert_eq!(first["fault"], fault, "{first}");
        assert_eq!(first["origin"], "twin", "{first}");
        assert!(
            stderr.contains(&format!(r#"-> 400 [twin fault "{fault}": not counted]"#)),
            "{fault}: {stderr}"
        );
    }
}

/// duplicate: each event twice, the second marked; one counts. delay:
/// recorded (scaled to milliseconds here), and never counted.
#[test]
fn duplicate_and_delay_are_recorded_and_counted_right() {
    if let Err(why) = tools() {
        return skip(&why);
    }
    let dir = TempDir::new("wh-dup");
    let port = free_port();
    let url = format!("stripe=http://127.0.0.1:{port}/webhook");
    let out = run_app(
        &dir,
        &[
            "--webhook",
            &url,
            "--webhook-faults",
            "duplicate",
            "--require-callback",
            "/webhook:2",
            "--receipt",
            dir.join("receipt.json").to_str().unwrap(),
        ],
        &[format!("{port}:ok")],
        &[("APP_EVENTS", "2")],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(
        verified(&stdout),
        ["charge.succeeded"; 2],
        "{stdout}\n{stderr}"
    );
    assert_eq!(out.status.code(), Some(3), "one of two counts: {stderr}");
    assert!(
        stderr.contains("saw 1, with status 200 (1 more were"),
        "{stderr}"
    );
    let lines = ledger(&dir);
    let mut faults: Vec<Value> = callbacks(&lines)
        .iter()
        .map(|c| c["fault"].clone())
        .collect();
    faults.sort_by_key(|f| f.to_string());
    assert_eq!(faults, [Value::from("duplicate"), Value::Null], "{lines:?}");
    let ids: Vec<&Value> = callbacks(&lines).iter().map(|c| &c["event_id"]).collect();
    assert_eq!(ids[0], ids[1], "one event, twice");
    let receipt: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("receipt.json")).unwrap()).unwrap();
    let statuses = &receipt["callbacks"]["statuses"];
    assert_eq!(statuses["twin"]["/webhook"]["200"], 1, "{statuses}");
    assert_eq!(
        statuses["twin+duplicate"]["/webhook"]["200"], 1,
        "{statuses}"
    );

    let dir = TempDir::new("wh-delay");
    let out = run_app(
        &dir,
        &[
            "--webhook",
            &url,
            "--webhook-faults",
            "delay=2s",
            "--require-callback",
            "/webhook",
        ],
        &[format!("{port}:ok")],
        &[],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(
        verified(&stdout),
        ["charge.succeeded"],
        "{stdout}\n{stderr}"
    );
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let lines = ledger(&dir);
    let calls = callbacks(&lines);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["fault"], "delay=2s");
    assert_eq!(calls[0]["status"], 200);
}

/// reorder: a customer then a charge are delivered charge first, both on
/// record as `reorder`.
#[test]
fn reorder_sends_the_newest_event_first() {
    if let Err(why) = tools() {
        return skip(&why);
    }
    let dir = TempDir::new("wh-reorder");
    let port = free_port();
    let url = format!("stripe=http://127.0.0.1:{port}/webhook");
    let out = run_app(
        &dir,
        &["--webhook", &url, "--webhook-faults", "reorder"],
        &[format!("{port}:ok")],
        &[("APP_EVENTS", "2"), ("APP_CUSTOMER", "1")],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(
        verified(&stdout),
        ["charge.succeeded", "customer.created"],
        "{stdout}\n{stderr}"
    );
    let lines = ledger(&dir);
    let calls = callbacks(&lines);
    let events: Vec<&Value> = calls.iter().map(|c| &c["event"]).collect();
    assert_eq!(
        events,
        ["charge.succeeded", "customer.created"],
        "{calls:?}"
    );
    assert!(calls.iter().all(|c| c["fault"] == "reorder"), "{calls:?}");
}

/// Bad input: each wrong `--webhook-faults` is a usage error that names the
/// syntax, before anything starts.
#[test]
fn bad_webhook_faults_say_the_syntax() {
    let dir = TempDir::new("wh-faults-bad");
    for (flags, says) in [
        (vec!["nonsense"], "\"nonsense\" is not a fault"),
        (vec!["delay=abc"], "bad duration \"abc\""),
        (vec!["delay=99h"], "bad duration \"99h\""),
        (vec!["delay=11m"], "longer than 600 s"),
    ] {
        let mut cmd = veris(["run", "--tier", "explicit", "--state-dir"]);
        cmd.arg(dir.join("state"))
            .args([
                "--webhook",
                "stripe=http://127.0.0.1:1/x",
                "--webhook-faults",
            ])
            .args(&flags)
            .args(["--", "true"]);
        let out = output(&mut cmd);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{flags:?}: {stdout}\n{stderr}");
        assert!(
            stderr.contains(says) && stderr.contains("Next:"),
            "{flags:?}: {stderr}"
        );
    }
    let mut cmd = veris(["run", "--tier", "explicit", "--state-dir"]);
    cmd.arg(dir.join("state"))
        .args(["--webhook-faults", "duplicate", "--", "true"]);
    let out = output(&mut cmd);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--webhook-faults needs --webhook"),
        "{stderr}"
    );
}
