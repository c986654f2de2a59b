//! H1: receipts the workload cannot forge. Each test is an attack a hostile
//! workload can make with nothing but its own uid (read and write files,
//! rename, open sockets, start processes), done against the real binary;
//! each must end `failed` or `unverified` (exit 3 under
//! `--require-verified`), while the genuine run beside it stays `verified`.

use crate::support;

use std::path::Path;
use std::process::Stdio;

use support::{
    assert_verified_with_its_key, command, curl, json, output, skip, text, veris, Guard, Serve,
    TempDir, DEADLINE,
};

/// A forger in Python: appends one invented `POST /v1/charges` request to the
/// run's ledger with a correct chain, then (mode `rename`) writes the result
/// to a new file renamed over the ledger, or (mode `append`) appends in place.
/// It also tries the seal key and the admin token, which a run never leaves
/// on disk.
const FORGER: &str = r#"
import glob, hashlib, json, os, sys
state, mode = sys.argv[1], sys.argv[2]
assert not glob.glob(os.path.join(state, "**", "seal.key"), recursive=True), "a run left its seal key on disk"
assert not os.path.exists(os.path.join(state, "admin.token")), "a run left an admin token on disk"
[path] = glob.glob(os.path.join(state, "runs", "*", "ledger.jsonl"))
lines = open(path).read().splitlines()
last = json.loads(lines[-1])
line = {"v": 2, "seq": last["seq"] + 1, "ts": last["ts"], "kind": "request",
        "service": "stripe", "host": "api.stripe.com", "method": "POST",
        "path": "/v1/charges", "status": 200, "http": "HTTP/1.1",
        "tier": "explicit", "bytes_in": 10, "duration_ms": 3,
        "upstream": "http://127.0.0.1:1/s/sbx_local/stripe/v1/charges",
        "prev": hashlib.sha256(lines[-1].encode()).hexdigest()}
forged = json.dumps(line, separators=(",", ":"))
if mode == "rename":
    tmp = path + ".forged"
    with open(tmp, "w") as f:
        f.write("\n".join(lines + [forged]) + "\n")
    os.rename(tmp, path)
else:
    with open(path, "a") as f:
        f.write(forged + "\n")
print("forged", path)
"#;

fn python() -> Result<(), String> {
    if support::tool_works("python3", &["-c", "import hashlib, json"]) {
        Ok(())
    } else {
        Err("python3 is not installed".into())
    }
}

#[test]
fn a_run_child_that_forges_its_ledger_gets_a_failed_receipt() {
    if let Err(why) = python() {
        return skip(&why);
    }
    for mode in ["rename", "append"] {
        let dir = TempDir::new("forge-run");
        let state = dir.join("state");
        let receipt = dir.join("receipt.json");
        let out = output(
            veris(["run", "--require-verified", "--state-dir"])
                // Under /tmp: carried into the run's private /tmp as its
                // working directory, so the child can reach its ledger.
                .current_dir(dir.path())
                .arg(&state)
                .arg("--receipt")
                .arg(&receipt)
                .args([
                    "--require-request",
                    "stripe POST /v1/charges",
                    "--",
                    "python3",
                    "-c",
                    FORGER,
                ])
                .arg(&state)
                .arg(mode),
        );
        let (stdout, stderr) = text(&out);
        assert!(stdout.contains("forged"), "{mode}: {stdout}\n{stderr}");
        assert!(
            stderr.contains("integrity: failed ("),
            "{mode}: the forged charge must not pass:\n{stderr}"
        );
        assert_eq!(out.status.code(), Some(3), "{mode}: {stderr}");
        let r = json(&std::fs::read_to_string(&receipt).unwrap());
        assert_eq!(r["integrity"]["status"], "failed", "{mode}: {r}");
        // The fingerprint of the run's in-memory key is in the receipt.
        let key = r["seal_key"].as_str().unwrap();
        assert_eq!(key.len(), 64);
        assert!(stderr.contains(&format!("seal key: {key}")), "{stderr}");
    }
}

#[test]
fn a_genuine_run_is_verified_live_and_offline_with_its_key_pinned() {
    if let Err(why) = curl() {
        return skip(&why);
    }
    let dir = TempDir::new("genuine-run");
    let state = dir.join("state");
    let receipt = dir.join("receipt.json");
    let out = output(
        veris(["run", "--require-verified", "--state-dir"])
            .arg(&state)
            .arg("--receipt")
            .arg(&receipt)
            .args([
                "--require-request",
                "stripe POST /v1/charges",
                "--",
                "curl",
                "-sS",
                "--max-time",
                "20",
                "-X",
                "POST",
                "-d",
                "amount=2000",
                "https://api.stripe.com/v1/charges",
            ]),
    );
    let (_, stderr) = text(&out);
    assert!(stderr.contains("integrity: verified"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let r = json(&std::fs::read_to_string(&receipt).unwrap());
    let key = r["seal_key"].as_str().unwrap().to_string();

    // Each run has a ledger of its own; read it later with the key pinned.
    let runs: Vec<_> = std::fs::read_dir(state.join("runs")).unwrap().collect();
    assert_eq!(runs.len(), 1);
    let ledger = runs[0].as_ref().unwrap().path().join("ledger.jsonl");
    assert!(
        stderr.contains(&format!("--ledger {}", ledger.display())),
        "{stderr}"
    );
    let offline = |extra: &[&str]| {
        output(
            veris(["receipt", "--require-verified", "--ledger"])
                .arg(&ledger)
                .args(extra),
        )
    };
    let out = offline(&["--key", &key]);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("integrity: verified"), "{stdout}");
    assert!(stdout.contains("POST \"/v1/charges\" -> 200"), "{stdout}");
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    // The key in a file works as well.
    let key_file = dir.join("run.key");
    std::fs::write(&key_file, format!("{key}\n")).unwrap();
    let out = offline(&["--key", key_file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    // Without a pin: never verified offline.
    let out = offline(&[]);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("integrity: unverified ("), "{stdout}");
    assert_eq!(out.status.code(), Some(3), "{stdout}");
    // Another key pinned: this is not the ledger it sealed.
    let out = offline(&["--key", &"ab".repeat(32)]);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("integrity: failed ("), "{stdout}");
    assert_eq!(out.status.code(), Some(3));

    // Offline forgery of the finished file: a request appended after the
    // final seal, chained correctly. Pinned, it is caught as unsealed.
    let mut text_now = std::fs::read_to_string(&ledger).unwrap();
    let last = text_now.lines().last().unwrap().to_string();
    let v = json(&last);
    let forged = format!(
        r#"{{"v":2,"seq":{},"ts":"{}","kind":"request","service":"stripe","host":"api.stripe.com","method":"POST","path":"/v1/refunds","status":200,"http":"HTTP/1.1","tier":"explicit","bytes_in":0,"duration_ms":1,"upstream":"http://x/v1/refunds","prev":"{}"}}"#,
        v["seq"].as_u64().unwrap() + 1,
        v["ts"].as_str().unwrap(),
        veris_receipt::ledger::line_hash(last.as_bytes())
    );
    text_now.push_str(&forged);
    text_now.push('\n');
    std::fs::write(&ledger, text_now).unwrap();
    let out = offline(&[
        "--key",
        &key,
        "--require-request",
        "stripe POST /v1/refunds",
    ]);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("after the last seal"), "{stdout}");
    assert_eq!(out.status.code(), Some(3), "{stdout}");
}

#[test]
fn restart_laundering_is_moved_aside_not_sealed_over() {
    let mut serve = Serve::start("launder", &[]);
    assert_eq!(serve.vendor("GET", "api.stripe.com", "/v1/customers"), 200);
    serve.stop();
    let ledger = serve.ledger();
    // Strip the seals, insert a charge, recompute the chain: no key needed.
    let mut lines: Vec<String> = std::fs::read_to_string(&ledger)
        .unwrap()
        .lines()
        .filter(|l| !l.contains("\"kind\":\"seal\""))
        .map(str::to_string)
        .collect();
    let charge = lines
        .iter()
        .find(|l| l.contains("\"kind\":\"request\""))
        .unwrap()
        .replace("\"method\":\"GET\"", "\"method\":\"POST\"")
        .replace("/v1/customers", "/v1/charges");
    lines.push(charge);
    let mut prev = veris_receipt::GENESIS_PREV.to_string();
    for (i, line) in lines.iter_mut().enumerate() {
        let mut v = json(line);
        v["seq"] = (i as u64 + 1).into();
        v["prev"] = prev.clone().into();
        *line = serde_json::to_string(&v).unwrap();
        prev = veris_receipt::ledger::line_hash(line.as_bytes());
    }
    let forged = lines.join("\n") + "\n";
    std::fs::write(&ledger, &forged).unwrap();

    // A new proxy on the same state dir.
    let dir = TempDir::new("launder-restart");
    let ready = dir.join("ready.json");
    let mut proxy = Guard::spawn(
        veris(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(&serve.state)
            .arg("--ready-file")
            .arg(&ready)
            .args(["--workload-uid", support::DECLARED_WORKLOAD_UID])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    support::wait_json_file(&ready, DEADLINE);
    let out = output(
        veris([
            "receipt",
            "--all",
            "--json",
            "--require",
            "stripe:1",
            "--state-dir",
        ])
        .arg(&serve.state),
    );
    let r = json(&text(&out).0);
    assert_eq!(out.status.code(), Some(3), "{r}");
    assert_eq!(r["integrity"]["status"], "verified", "{r}");
    assert!(r["services"].as_object().unwrap().is_empty(), "{r}");
    let moved = r["integrity"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "moved_aside")
        .cloned()
        .expect("moved_aside check");
    let detail = moved["detail"].as_str().unwrap().to_string();
    let aside = serve.state.join("ledger.jsonl.moved-1");
    assert!(detail.contains(&aside.display().to_string()), "{detail}");
    assert_eq!(std::fs::read_to_string(&aside).unwrap(), forged);
    // The moved file is still readable, and never verified.
    let out = output(veris(["receipt", "--require-verified", "--ledger"]).arg(&aside));
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));
    proxy.signal("TERM");
    proxy.wait();
}

/// `veris twin` in its own process (no credential: any caller can use it),
/// with its URL from its first stdout line.
fn external_twin() -> (Guard, String) {
    support::spawn_twin(&mut veris(["twin", "--listen", "127.0.0.1:0"]))
}

fn serve_with_twin(label: &str, twin: &str) -> Serve {
    Serve::start(
        label,
        &[
            "--twin",
            twin,
            "--sandbox",
            "sbx_ext",
            "--services",
            "stripe",
        ],
    )
}

fn receipt_live(state: &Path, extra: &[&str]) -> (std::process::Output, String) {
    let out = output(veris(["receipt"]).args(extra).arg("--state-dir").arg(state));
    let stdout = text(&out).0;
    (out, stdout)
}

/// A plain `serve` whose workload runs as the same uid: the workload can read
/// admin.token and rewrite admin.addr, so it could answer a reader as "the
/// live proxy" itself (here: a relay in front of the real admin port, which
/// could as well have answered with canary and twin answers of its own). No
/// live read or proxy answer may then say `verified`, pinned or not.
#[test]
fn a_workload_sharing_the_proxy_uid_never_gets_a_verified_receipt() {
    let serve = Serve::start_same_uid("same-uid", &[]);
    assert_eq!(serve.vendor("POST", "api.stripe.com", "/v1/charges"), 200);
    let custody =
        "unverified (workload may share the proxy uid, which could stand in for the live proxy";
    let (out, stdout) = receipt_live(&serve.state, &["--require-verified"]);
    assert!(stdout.contains(custody), "{stdout}");
    assert!(stdout.contains("POST \"/v1/charges\" -> 200"), "{stdout}");
    assert_eq!(out.status.code(), Some(3), "{stdout}");

    // The workload points admin.addr at its own listener, which relays to the
    // real proxy: every answer is genuine, the verdict still cannot be.
    let real: std::net::SocketAddr = std::fs::read_to_string(serve.state.join("admin.addr"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let relay = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let stand_in = relay.local_addr().unwrap();
    std::thread::spawn(move || {
        for client in relay.incoming().flatten() {
            let Ok(upstream) = std::net::TcpStream::connect(real) else {
                continue;
            };
            let (mut a, mut b) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
            let (mut c, mut d) = (client, upstream);
            std::thread::spawn(move || std::io::copy(&mut a, &mut d));
            std::thread::spawn(move || std::io::copy(&mut b, &mut c));
        }
    });
    std::fs::write(serve.state.join("admin.addr"), stand_in.to_string()).unwrap();
    let r = json(
        &text(&output(
            veris(["receipt", "--json", "--require-verified", "--state-dir"]).arg(&serve.state),
        ))
        .0,
    );
    assert_eq!(r["integrity"]["status"], "unverified", "{r}");
    let key = r["seal_key"].as_str().expect("seal_key").to_string();
    // Pinning the real key changes nothing live: the live checks go to
    // whatever the stand-in names.
    let (out, stdout) = receipt_live(&serve.state, &["--require-verified", "--key", &key]);
    assert!(stdout.contains(custody), "{stdout}");
    assert_eq!(out.status.code(), Some(3), "{stdout}");
    // The proxy's own /receipt says the same.
    let (status, body) = serve.admin_call("GET", "/receipt?since=0");
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["integrity"]["status"], "unverified", "{body}");
}

#[test]
fn a_twin_that_dies_leaves_the_receipt_unverified() {
    let (mut twin, url) = external_twin();
    let serve = serve_with_twin("twin-dies", &url);
    assert_eq!(serve.vendor("POST", "api.stripe.com", "/v1/customers"), 200);
    let (out, stdout) = receipt_live(&serve.state, &["--require-verified"]);
    assert!(stdout.contains("integrity: verified"), "{stdout}");
    assert_eq!(out.status.code(), Some(0));
    twin.signal("KILL");
    twin.wait();
    let (out, stdout) = receipt_live(&serve.state, &["--require-verified"]);
    assert!(stdout.contains("integrity: unverified ("), "{stdout}");
    assert!(stdout.contains("twin log not readable"), "{stdout}");
    assert_eq!(out.status.code(), Some(3), "{stdout}");
}

#[test]
fn a_twin_topped_up_directly_fails_the_cross_check() {
    if let Err(why) = curl() {
        return skip(&why);
    }
    let (_twin, url) = external_twin();
    // Rows from before the session never count.
    let direct = format!("{url}/s/sbx_ext/stripe/v1/charges");
    let post = || {
        let out = output(command("curl").args(["-sS", "--max-time", "10", "-X", "POST", &direct]));
        assert!(out.status.success(), "{:?}", text(&out));
    };
    post();
    let serve = serve_with_twin("twin-topped", &url);
    assert_eq!(serve.vendor("GET", "api.stripe.com", "/v1/customers"), 200);
    let (out, stdout) = receipt_live(&serve.state, &["--require-verified"]);
    assert!(stdout.contains("integrity: verified"), "{stdout}");
    assert_eq!(out.status.code(), Some(0));

    // The workload charges the twin itself, not through the proxy.
    post();
    let (out, stdout) = receipt_live(&serve.state, &["--require-verified"]);
    assert!(
        stdout.contains(
            "integrity: failed (the twin's log has 1 request(s) the ledger has no line for"
        ),
        "{stdout}"
    );
    // Every ledger write succeeded: nothing on veris's side explains it.
    assert!(
        stdout.contains("nothing on veris's side explains them")
            && stdout.contains("something called the twin directly"),
        "{stdout}"
    );
    assert!(!stdout.contains("POST \"/v1/charges\" -> "), "{stdout}");
    assert_eq!(out.status.code(), Some(3), "{stdout}");
}

#[test]
fn control_surface_traffic_is_never_a_vendor_call() {
    let serve = Serve::start("control", &[]);
    for path in [
        "/veris/health",
        "/veris/requests",
        "/v1/../veris/requests",
        "/%76eris/health",
    ] {
        let status = serve.vendor("GET", "api.stripe.com", path);
        assert!(status == 404 || status == 400, "{path}: {status}");
    }
    let (out, stdout) = receipt_live(&serve.state, &["--require", "stripe:1"]);
    assert_eq!(out.status.code(), Some(3), "{stdout}");
    assert!(stdout.contains("reserved paths"), "{stdout}");
    let lines = serve.ledger_lines();
    let kinds: Vec<&str> = lines.iter().filter_map(|l| l["kind"].as_str()).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "reserved_path").count(),
        4,
        "{kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|k| **k == "request").count(),
        0,
        "{kinds:?}"
    );
    // Nothing reached the twin's health endpoint through the proxy.
    let twin = serve.twin_requests("stripe");
    let health: Vec<_> = twin["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["path"].as_str().unwrap_or("").contains("health"))
        .collect();
    assert!(health.is_empty(), "the twin saw {health:?}");
}

#[test]
fn a_client_that_gives_up_before_the_answer_is_still_recorded() {
    if let Err(why) = curl() {
        return skip(&why);
    }
    let serve = Serve::start("gone", &[]);
    // The built-in twin answers POST /v1/test/hang after 2 s; curl leaves at 0.5 s.
    let out = output(serve.curl().args([
        "--max-time",
        "0.5",
        "-X",
        "POST",
        "https://api.stripe.com/v1/test/hang",
    ]));
    assert!(!out.status.success(), "curl should have given up");
    let found = support::wait_for("the request line", DEADLINE, || {
        serve
            .ledger_lines()
            .into_iter()
            .find(|l| l["kind"] == "request" && l["path"] == "/v1/test/hang")
    });
    assert_eq!(found["client_gone"], true, "{found}");
    let (out, stdout) = receipt_live(&serve.state, &["--require-verified"]);
    assert!(
        stdout.contains("POST \"/v1/test/hang\" -> 200 (client gone)"),
        "{stdout}"
    );
    assert!(stdout.contains("integrity: verified"), "{stdout}");
    assert_eq!(out.status.code(), Some(0), "{stdout}");
}

#[test]
fn after_a_restart_the_receipt_is_the_new_sessions() {
    let mut serve = Serve::start("window", &[]);
    assert_eq!(serve.vendor("GET", "api.stripe.com", "/v1/customers"), 200);
    serve.stop();
    let dir = TempDir::new("window-restart");
    let ready = dir.join("ready.json");
    let mut proxy = Guard::spawn(
        veris(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(&serve.state)
            .arg("--ready-file")
            .arg(&ready)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    support::wait_json_file(&ready, DEADLINE);
    let (out, stdout) = receipt_live(&serve.state, &[]);
    assert!(stdout.contains("0 requests reached the twin"), "{stdout}");
    assert_eq!(out.status.code(), Some(3));
    // The continued file verified with the proxy's own key: not moved aside.
    assert!(!serve.state.join("ledger.jsonl.moved-1").exists());
    let (out, stdout) = receipt_live(&serve.state, &["--all"]);
    assert!(stdout.contains("GET \"/v1/customers\" -> 200"), "{stdout}");
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    proxy.signal("TERM");
    proxy.wait();
}

#[test]
fn a_run_child_of_the_same_uid_cannot_read_the_proxys_memory() {
    // As root the test drops to nobody for the whole run (root could ptrace
    // anything); the child then shares veris's uid, as a workload does.
    let is_root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if is_root && !support::tool_works("setpriv", &["--version"]) {
        return skip("setpriv (util-linux) is not installed");
    }
    let dir = TempDir::new("dumpable");
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    let probe = "for f in maps environ; do if cat /proc/$PPID/$f >/dev/null 2>&1; then echo READ-$f; else echo DENIED-$f; fi; done";
    let mut cmd = if is_root {
        let mut c = command("setpriv");
        c.args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .arg(support::bin());
        c
    } else {
        command(support::bin().to_str().unwrap())
    };
    cmd.env("HOME", dir.path())
        .args(["run", "--allow-empty", "--state-dir"])
        .arg(&state)
        .args(["--", "sh", "-c", probe]);
    let out = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    assert!(
        stdout.contains("DENIED-maps") && stdout.contains("DENIED-environ"),
        "the child read the proxy's memory: {stdout}\n{stderr}"
    );
    assert!(stderr.contains("integrity: verified"), "{stderr}");
}

/// A new `veris serve` on `state`, ready.
fn restart(state: &Path, label: &str) -> Guard {
    let dir = TempDir::new(label);
    let ready = dir.join("ready.json");
    let proxy = Guard::spawn(
        veris(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(state)
            .arg("--ready-file")
            .arg(&ready)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    support::wait_json_file(&ready, DEADLINE);
    proxy
}

/// A restarted proxy reads only the end of its ledger (the last line must
/// be its own seal). A line edited in the middle of the history between
/// sessions is not looked for at the start, so it must be caught by every
/// reader: live or pinned, the latest session or `--all`, never verified.
#[test]
fn an_edit_to_history_between_sessions_fails_every_receipt_after_a_restart() {
    let mut serve = Serve::start("history-edit", &[]);
    assert_eq!(serve.vendor("GET", "api.stripe.com", "/v1/customers"), 200);
    assert_eq!(serve.vendor("GET", "api.stripe.com", "/v1/customers"), 200);
    serve.stop();
    let ledger = serve.ledger();
    let text_before = std::fs::read_to_string(&ledger).unwrap();
    // Turn the recorded GET into a charge, without touching the chain.
    let edited = text_before.replacen("\"method\":\"GET\"", "\"method\":\"POST\"", 1);
    assert_ne!(edited, text_before);
    std::fs::write(&ledger, &edited).unwrap();
    let key = json(
        &text(&output(
            veris(["receipt", "--all", "--json", "--ledger"]).arg(&ledger),
        ))
        .0,
    )["seal_key"]
        .as_str()
        .unwrap()
        .to_string();

    let mut proxy = restart(&serve.state, "history-edit-restart");
    // Its own seal ends the file: continued, not moved aside.
    assert!(!serve.state.join("ledger.jsonl.moved-1").exists());
    for extra in [&["--all"][..], &[]] {
        let (out, stdout) = receipt_live(&serve.state, &[extra, &["--json"]].concat());
        let r = json(&stdout);
        assert_eq!(r["integrity"]["status"], "failed", "{extra:?} {r}");
        assert!(
            r["integrity"]["reason"]
                .as_str()
                .unwrap()
                .starts_with("chain broken at line "),
            "{r}"
        );
        assert_eq!(out.status.code(), Some(3), "{r}");
    }
    proxy.signal("TERM");
    proxy.wait();
    // Offline with the key pinned, over the whole file.
    let out = output(
        veris([
            "receipt",
            "--all",
            "--require-verified",
            "--key",
            &key,
            "--ledger",
        ])
        .arg(&ledger),
    );
    let stdout = text(&out).0;
    assert!(
        stdout.contains("integrity: failed (chain broken at line "),
        "{stdout}"
    );
    assert_eq!(out.status.code(), Some(3), "{stdout}");
}

/// The ledger replaced between sessions by another state dir's sealed
/// ledger (another key): moved aside at the restart, never continued.
#[test]
fn a_ledger_sealed_by_another_key_is_moved_aside_at_a_restart() {
    let mut serve = Serve::start("replace-a", &[]);
    assert_eq!(serve.vendor("GET", "api.stripe.com", "/v1/customers"), 200);
    serve.stop();
    let mut other = Serve::start("replace-b", &[]);
    assert_eq!(other.vendor("POST", "api.stripe.com", "/v1/charges"), 200);
    other.stop();
    let foreign = std::fs::read_to_string(other.ledger()).unwrap();
    std::fs::write(serve.ledger(), &foreign).unwrap();
    let mut proxy = restart(&serve.state, "replace-restart");
    let aside = serve.state.join("ledger.jsonl.moved-1");
    assert_eq!(std::fs::read_to_string(&aside).unwrap(), foreign);
    let (out, stdout) = receipt_live(&serve.state, &["--all", "--json"]);
    let r = json(&stdout);
    assert!(r["services"].as_object().unwrap().is_empty(), "{r}");
    let moved = r["integrity"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "moved_aside")
        .cloned()
        .expect("moved_aside check");
    assert!(
        moved["detail"]
            .as_str()
            .unwrap()
            .contains("signed by a key other than"),
        "{moved}"
    );
    assert_eq!(out.status.code(), Some(3), "{r}");
    proxy.signal("TERM");
    proxy.wait();
}

/// H4 (custody): an earlier `serve` kept its key in `seal.key`, where a
/// workload of its uid could read it. The workload signs a ledger of its
/// own with that key, every session line saying the key stayed in memory,
/// with a charge that never happened. Pinned by the key's fingerprint (a
/// `seal.key` holding it beside the ledger) or by the key file itself, the
/// receipt is never `verified`: a session's word about its own key is no
/// evidence. A session of the current `serve` leaves no key on disk, and a
/// pin of the fingerprint it printed verifies it offline even though its
/// workload shared its uid.
#[test]
fn a_key_that_sat_in_a_file_never_verifies_whatever_the_ledger_says() {
    if !support::tool_works(
        "python3",
        &[
            "-c",
            "import cryptography.hazmat.primitives.asymmetric.ed25519",
        ],
    ) {
        return skip("python3 with cryptography is not installed");
    }
    let dir = TempDir::new("file-key");
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let forged = output(
        command("python3")
            .args(["-c", FILE_KEY_FORGER])
            .arg(&state)
            .arg(veris_receipt::entry::LEDGER_VERSION.to_string()),
    );
    let (fp, err) = text(&forged);
    assert!(forged.status.success(), "{err}");
    let fp = fp.trim().to_string();
    let ledger = state.join("ledger.jsonl");
    let read = |key: &str| {
        let out =
            output(veris(["receipt", "--require-verified", "--key", key, "--ledger"]).arg(&ledger));
        let stdout = text(&out).0;
        (out.status.code(), stdout)
    };
    // The forgery is otherwise perfect: chain, seals, final seal, checks.
    for key in [fp.clone(), state.join("seal.key").display().to_string()] {
        let (code, stdout) = read(&key);
        assert!(
            stdout.contains("integrity: unverified (the pinned key sits in the private key file"),
            "{key}: {stdout}"
        );
        assert!(stdout.contains(r#"POST "/v1/charges" -> 200"#), "{stdout}");
        assert_eq!(code, Some(3), "{stdout}");
    }

    // Today's serve: no key on disk, and the key it logged verifies its
    // finished session offline although the workload shared its uid.
    let mut serve = Serve::start_same_uid("file-key-now", &[]);
    assert_eq!(serve.vendor("POST", "api.stripe.com", "/v1/charges"), 200);
    serve.stop();
    assert!(!serve.state.join("seal.key").exists());
    assert_verified_with_its_key(&serve.state);
}

/// Writes `<state>/seal.key` (PKCS#8, as `serve` did before ledger v5) and a
/// ledger of one session signed by it, which claims `key_storage: memory`;
/// prints the key's fingerprint.
const FILE_KEY_FORGER: &str = r#"
import hashlib, json, os, sys
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
state, v = sys.argv[1], int(sys.argv[2])
key = Ed25519PrivateKey.generate()
der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                        serialization.NoEncryption())
with open(os.path.join(state, "seal.key"), "wb") as f:
    f.write(der)
raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
fp = hashlib.sha256(raw).hexdigest()
ts = "2026-12-03T08:00:00.000Z"
entries = [
    {"kind": "session", "run_id": "run_x", "sandbox_id": "sbx_local", "mode": "passthrough",
     "tier": "explicit", "twin": "http://127.0.0.1:1", "pid": 1, "version": "0.1.0",
     "listen": "127.0.0.1:8080", "key_id": fp, "public_key": raw.hex(),
     "key_storage": "memory", "proxy_uid": 1000, "workload_uid": 2000, "twin_heads": {}},
    {"kind": "request", "service": "stripe", "host": "api.stripe.com", "method": "POST",
     "path": "/v1/charges", "status": 200, "http": "HTTP/1.1", "tier": "explicit",
     "bytes_in": 10, "duration_ms": 3,
     "upstream": "http://127.0.0.1:1/s/sbx_local/stripe/v1/charges"},
    {"kind": "check", "name": "canary", "status": "ok", "detail": "canary ok",
     "since_seq": 0, "until_seq": 2},
    {"kind": "check", "name": "twin_cross_check", "status": "ok", "detail": "twin ok",
     "since_seq": 0, "until_seq": 2},
    "shutdown",
]
lines, prev = [], "0" * 64
for seq, e in enumerate(entries, 1):
    if e == "shutdown":
        msg = f"veris-seal-v2 {seq - 1} {prev} shutdown".encode()
        e = {"kind": "seal", "sealed_seq": seq - 1, "signature": key.sign(msg).hex(),
             "key_id": fp, "reason": "shutdown"}
    line = json.dumps({"v": v, "seq": seq, "ts": ts, **e, "prev": prev}, separators=(",", ":"))
    lines.append(line)
    prev = hashlib.sha256(line.encode()).hexdigest()
with open(os.path.join(state, "ledger.jsonl"), "w") as f:
    f.write("\n".join(lines) + "\n")
with open(os.path.join(state, "ledger.pub"), "w") as f:
    f.write("ed25519 " + raw.hex() + "\n")
print(fp)
"#;

/// H4 (a crash is visible): `serve` is killed with lines after its last
/// seal (a crash mid-traffic; the test adds the unsealed line a crash
/// leaves, since the seal timer may have covered the real ones). The
/// restart moves the file aside; the new session's text receipt, and
/// `--all`, name it with its request count and how to read it.
#[test]
fn a_crashed_session_is_named_in_the_text_receipt_after_a_restart() {
    let mut serve = Serve::start("crash", &[]);
    for _ in 0..3 {
        assert_eq!(serve.vendor("POST", "api.stripe.com", "/v1/charges"), 200);
    }
    serve.process.signal("KILL");
    let _ = serve.process.wait_timeout(DEADLINE);
    let ledger = serve.ledger();
    let mut lines: Vec<String> = std::fs::read_to_string(&ledger)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let mut unsealed = json(
        lines
            .iter()
            .find(|l| l.contains("\"kind\":\"request\""))
            .unwrap(),
    );
    unsealed["seq"] = (lines.len() as u64 + 1).into();
    unsealed["prev"] = veris_receipt::ledger::line_hash(lines.last().unwrap().as_bytes()).into();
    lines.push(serde_json::to_string(&unsealed).unwrap());
    std::fs::write(&ledger, lines.join("\n") + "\n").unwrap();

    let mut proxy = restart(&serve.state, "crash-restart");
    let aside = serve.state.join("ledger.jsonl.moved-1");
    assert!(aside.exists());
    for extra in [&[][..], &["--all"]] {
        let (_, stdout) = receipt_live(&serve.state, extra);
        // How many lines the seal timer covered before the kill varies.
        let line = stdout
            .lines()
            .find(|l| {
                l.starts_with(
                    "  set aside at seq 1: an earlier ledger this proxy could not verify (",
                )
            })
            .unwrap_or_else(|| panic!("{extra:?}: {stdout}"));
        assert!(line.contains("line(s) after the last seal (seq "), "{line}");
        let tail = format!(
            ", 4 request(s) in it). Read it: veris receipt --all --ledger {}",
            aside.display()
        );
        assert!(line.ends_with(&tail), "{line}");
    }
    proxy.signal("TERM");
    proxy.wait();
    // What it points at works, and says what it can.
    let out = output(veris(["receipt", "--all", "--ledger"]).arg(&aside));
    let stdout = text(&out).0;
    assert!(stdout.contains("4 request(s) reached the twin"), "{stdout}");
    assert!(!stdout.contains("integrity: verified"), "{stdout}");
}
