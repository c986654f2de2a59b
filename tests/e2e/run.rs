//! End-to-end tests of `veris run` (M1.4): the child gets the proxy and the
//! CA from the environment `veris run` sets (curl and Python `requests` are
//! given no proxy or CA flags), the receipt goes to stderr, and the exit code
//! is the receipt's verdict or else the child's. The ambient CA variables of
//! the machine are cleared before `veris run` starts.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;

use serde_json::Value;
use support::{output, skip, text, veris, wait_for, Guard, TempDir, DEADLINE};

const CHARGE: &str =
    "curl -sS --max-time 20 https://api.stripe.com/v1/charges -d amount=100 -d currency=usd";

fn run(dir: &TempDir, extra: &[&str], child: &[&str]) -> std::process::Output {
    let mut cmd = veris(["run", "--state-dir"]);
    cmd.arg(dir.join("state")).args(extra).arg("--").args(child);
    output(&mut cmd)
}

#[test]
fn run_curl_gets_proxy_and_ca_from_the_env() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let dir = TempDir::new("run-curl");
    let out = run(&dir, &[], support::CURL_CHARGE);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let charge: Value = serde_json::from_str(&stdout).expect("curl printed the twin's JSON");
    assert_eq!(charge["object"], "charge");
    assert!(
        stderr.contains("Veris receipt — twin sbx_local"),
        "{stderr}"
    );
    assert!(
        stderr.contains("1 request(s) reached the twin:"),
        "{stderr}"
    );
    assert!(stderr.contains("POST \"/v1/charges\" -> 200"), "{stderr}");
}

/// On a terminal, a command whose output ends without a newline does not
/// leave the receipt starting on its line (util-linux `script` gives the
/// run a terminal).
#[test]
fn on_a_terminal_the_receipt_starts_on_a_line_of_its_own() {
    if !support::tool_works("script", &["--version"]) {
        return skip("no util-linux script to give the run a terminal");
    }
    let dir = TempDir::new("run-tty");
    let line = format!(
        "{} run --tier explicit --allow-empty --state-dir {} -- printf no-newline-mark",
        support::bin().display(),
        dir.join("state").display()
    );
    let out = output(support::command("script").args(["-qec", &line, "/dev/null"]));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("no-newline-mark\r\n"), "{stdout:?}");
    assert!(stdout.contains("interception: explicit"), "{stdout:?}");
}

#[test]
fn run_true_is_an_empty_receipt() {
    let dir = TempDir::new("run-true");
    let out = run(&dir, &[], &["true"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("0 requests reached the twin: the code never reached its dependency"),
        "{stderr}"
    );
}

#[test]
fn run_unmet_require_says_what_was_wanted_and_seen() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let dir = TempDir::new("run-require");
    let out = run(&dir, &["--require", "stripe:2"], &["sh", "-c", CHARGE]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    let fail = stderr
        .lines()
        .find(|l| l.starts_with("FAIL: "))
        .unwrap_or_else(|| panic!("no FAIL line: {stderr}"));
    assert!(fail.contains("stripe"), "{fail}");
    assert!(fail.contains("at least 2"), "names what was wanted: {fail}");
    assert!(fail.contains("saw 1"), "names what was seen: {fail}");
}

#[test]
fn run_returns_the_childs_code_when_the_receipt_is_satisfied() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let dir = TempDir::new("run-code");
    let script = format!("{CHARGE} >/dev/null; exit 7");
    let out = run(
        &dir,
        &["--require", "stripe:1"],
        &["sh", "-c", script.as_str()],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(7), "{stdout}\n{stderr}");
    assert!(stderr.contains("POST \"/v1/charges\" -> 200"), "{stderr}");
}

#[test]
fn run_writes_a_private_json_receipt() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let dir = TempDir::new("run-receipt");
    let file = dir.join("receipt.json");
    let file_arg = file.to_str().unwrap().to_string();
    let out = run(
        &dir,
        &["--receipt", &file_arg],
        &["sh", "-c", &format!("{CHARGE} >/dev/null")],
    );
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let mode = std::fs::metadata(&file)
        .expect("receipt file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "receipt mode {mode:o}");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).expect("receipt JSON");
    assert!(json["version"].is_u64(), "{json}");
    assert_eq!(json["services"]["stripe"]["requests"], 1, "{json}");
    let entries = json["services"]["stripe"]["entries"].as_array().unwrap();
    assert_eq!(entries[0]["method"], "POST");
    assert_eq!(entries[0]["path"], "/v1/charges");
    assert_eq!(entries[0]["status"], 200);
}

#[test]
fn run_python_requests_uses_the_env_alone() {
    if let Err(why) = support::python_requests() {
        return skip(&why);
    }
    let dir = TempDir::new("run-python");
    let script = r#"
import requests
r = requests.post("https://api.stripe.com/v1/charges", data={"amount": "300", "currency": "usd"}, timeout=20)
r.raise_for_status()
print(r.json()["object"], r.json()["amount"])
"#;
    let out = run(&dir, &[], &["python3", "-c", script]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "charge 300");
    assert!(stderr.contains("POST \"/v1/charges\" -> 200"), "{stderr}");
}

#[test]
fn sigterm_to_run_reaches_the_child_and_the_receipt_is_printed() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let dir = TempDir::new("run-term");
    let started = dir.join("started");
    let marker = dir.join("got-term");
    let stderr_file = dir.join("run.stderr");
    // The child makes its call, says so, then waits (bounded) for TERM.
    let script = format!(
        "trap 'echo term > \"{marker}\"; exit 5' TERM; {CHARGE} >/dev/null; echo up > \"{started}\"; sleep 30 & wait",
        marker = marker.display(),
        started = started.display()
    );
    let mut cmd = veris(["run", "--state-dir"]);
    // The marker files are under /tmp: as the working directory, the dir
    // is carried into the isolated run's private /tmp.
    cmd.current_dir(dir.path())
        .arg(dir.join("state"))
        .args(["--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_file).unwrap());
    let mut run = Guard::spawn(&mut cmd);
    wait_for("the child to make its call", DEADLINE, || {
        started.exists().then_some(())
    });
    run.signal("TERM");
    let status = run.wait();
    let stderr = std::fs::read_to_string(&stderr_file).unwrap();
    assert_eq!(status.code(), Some(5), "the child's code: {stderr}");
    assert_eq!(
        std::fs::read_to_string(&marker).expect("the child got TERM"),
        "term\n"
    );
    assert!(stderr.contains("Veris receipt"), "{stderr}");
    assert!(stderr.contains("POST \"/v1/charges\" -> 200"), "{stderr}");
}

#[test]
fn run_requiring_an_unknown_service_is_a_usage_error_listing_the_known_ones() {
    let dir = TempDir::new("run-unknown-svc");
    let out = run(
        &dir,
        &["--require", "strip:1", "--route", "acme=api.acme.test"],
        &["true"],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("\"strip\""), "names the typo: {stderr}");
    for known in ["stripe", "google-calendar", "acme"] {
        assert!(stderr.contains(known), "lists {known}: {stderr}");
    }
    assert!(stderr.contains("Next:"), "{stderr}");
    assert!(
        !stderr.contains("Veris receipt"),
        "nothing ran, so no receipt: {stderr}"
    );
}

#[test]
fn run_with_an_unmet_requirement_names_it_and_the_childs_code() {
    let dir = TempDir::new("run-unmet-code");
    let out = run(&dir, &["--require", "stripe"], &["sh", "-c", "exit 7"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    let last = stderr
        .lines()
        .find(|l| l.starts_with("veris run: exit 3"))
        .unwrap_or_else(|| panic!("no summary line: {stderr}"));
    assert!(last.contains("stripe"), "names the requirement: {last}");
    assert!(last.contains("exited 7"), "names the child's code: {last}");
}

#[test]
fn run_of_a_missing_command_exits_127_like_a_shell() {
    let dir = TempDir::new("run-127");
    let out = run(&dir, &[], &["veris-no-such-command-m7"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(127), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("veris-no-such-command-m7: command not found"),
        "{stderr}"
    );
    let out = run(&dir, &[], &["/etc/passwd"]);
    assert_eq!(out.status.code(), Some(126), "{:?}", text(&out));
}

#[test]
fn run_help_lists_only_what_run_uses() {
    let out = output(&mut veris(["run", "--help"]));
    let (help, _) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{help}");
    for used in ["--require", "--twin", "--route", "--tier", "--receipt"] {
        assert!(help.contains(used), "run uses {used}: {help}");
    }
    for serve_only in [
        "--ready-file",
        "--write-env",
        "--env-format",
        "--env-trust-only",
        "--transparent",
        "--install-redirect",
        "--https-listen",
        "--admin",
    ] {
        assert!(
            !help.contains(serve_only),
            "{serve_only} is serve's: {help}"
        );
    }
    // And they are refused, not silently ignored.
    let dir = TempDir::new("run-serve-flag");
    let out = run(&dir, &["--ready-file", "/dev/null"], &["true"]);
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
    // --transparent is refused with what to do instead.
    let out = run(&dir, &["--transparent"], &["true"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("veris serve --transparent"), "{stderr}");
}

#[test]
fn run_warns_once_when_the_twin_is_unreachable_and_runs_anyway() {
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let twin = format!("http://127.0.0.1:{port}");
    let dir = TempDir::new("run-twin-down");
    let out = run(&dir, &["--twin", &twin, "--allow-empty"], &["true"]);
    let (stdout, stderr) = text(&out);
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("the twin is not reachable"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stdout}\n{stderr}");
    assert!(
        warnings[0].contains(&twin),
        "names the URL: {}",
        warnings[0]
    );
    assert!(warnings[0].contains("Next:"), "{}", warnings[0]);
    assert!(
        stderr.contains("Veris receipt"),
        "the run went on: {stderr}"
    );
}
