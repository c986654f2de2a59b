//! End-to-end tests of `veris har` (M7): a `veris serve` session with the
//! built-in twin and real curl requests through the proxy becomes a HAR 1.2
//! document, valid against tests/har/har-1.2.schema.json (checked by
//! Python's `jsonschema`, a real validator); `--since` a baseline narrows
//! it, `-o` writes the file, an empty window is a HAR with no entries, the
//! integrity in `log.comment` is the receipt's, a hostile ledger (quotes,
//! markup, control characters, bytes that are not UTF-8, a torn tail) still
//! gives valid JSON, and bad input is an error with a `Next:` step.
//!
//! Loopback only: curl is given the proxy (`-x`), so vendor names go to it
//! unresolved and never to real DNS; the environment is cleared, so no
//! ambient CA or proxy variable (SSL_CERT_FILE, CURL_CA_BUNDLE, ...) reaches
//! a client.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;
use support::{command, output, skip, text, veris, Serve, TempDir};

/// A secret the ledger must redact, so the HAR can never carry it.
const SECRET: &str = "sk_test_4eC39HqLyjWDarjtT1zdp7dc";

fn schema() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/har/har-1.2.schema.json")
}

/// Python with `jsonschema`, or why not.
pub(crate) fn validator() -> Result<(), String> {
    if support::tool_works("python3", &["-c", "import jsonschema"]) {
        Ok(())
    } else {
        Err("python3 with `jsonschema` not available (pip install jsonschema)".into())
    }
}

const VALIDATE: &str = r#"
import json, sys, jsonschema
schema = json.load(open(sys.argv[1]))
jsonschema.Draft7Validator.check_schema(schema)
har = json.load(open(sys.argv[2], encoding="utf-8"))
errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(har), key=lambda e: list(e.path))
for e in errors:
    print("/".join(str(p) for p in e.path), e.message)
sys.exit(1 if errors else 0)
"#;

/// Valid against the HAR 1.2 schema, judged by `jsonschema`.
pub(crate) fn validate(path: &Path) {
    let out = output(
        command("python3")
            .args(["-c", VALIDATE])
            .arg(schema())
            .arg(path),
    );
    assert!(
        out.status.success(),
        "{} is not valid HAR 1.2: {:?}\n{}",
        path.display(),
        text(&out),
        std::fs::read_to_string(path).unwrap_or_default()
    );
}

/// Parses what `veris har` printed, validates it, and returns it.
fn har_of(out: &Output, dir: &TempDir, name: &str) -> Value {
    let (stdout, stderr) = text(out);
    let json: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}\n{stderr}"));
    let path = dir.join(name);
    std::fs::write(&path, &out.stdout).unwrap();
    validate(&path);
    assert_eq!(json["log"]["version"], "1.2");
    json
}

fn entries(har: &Value) -> Vec<Value> {
    har["log"]["entries"].as_array().expect("entries").clone()
}

fn paths(har: &Value) -> Vec<String> {
    entries(har)
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e["request"]["method"].as_str().unwrap(),
                e["request"]["url"].as_str().unwrap()
            )
        })
        .collect()
}

fn har_cmd(state: &Path, extra: &[&str]) -> Output {
    let mut cmd = veris(["har", "--state-dir"]);
    cmd.arg(state).args(extra);
    output(&mut cmd)
}

/// What `haralyzer` (a HAR reader library nobody here wrote) loads: its
/// pages and, on each, the entries with their URL, status and time.
const HARALYZER: &str = r#"
import json, sys
from haralyzer import HarParser
har = HarParser(json.load(open(sys.argv[1], encoding="utf-8")))
pages = []
for page in har.pages:
    pages.append([[e.request.method, e.url, e.status, e.time] for e in page.entries])
print(json.dumps({"browser": har.browser, "version": har.version, "pages": pages}))
"#;

fn haralyzer(path: &Path) -> Value {
    let out = output(command("python3").args(["-c", HARALYZER]).arg(path));
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "haralyzer cannot load {}: {stderr}",
        path.display()
    );
    serde_json::from_str(&stdout).unwrap()
}

#[test]
fn a_serve_session_exports_as_valid_har() {
    if let Err(why) = support::curl()
        .and_then(|()| validator())
        .and_then(|()| support::python_module("haralyzer"))
    {
        return skip(&why);
    }
    let mut serve = Serve::start("har", &[]);
    let dir = TempDir::new("har-out");
    let curl = |args: &[&str]| {
        let out = output(serve.curl().args(args));
        assert!(out.status.success(), "curl {args:?}: {:?}", text(&out));
    };
    let auth = format!("Authorization: Bearer {SECRET}");
    curl(&[
        "https://api.stripe.com/v1/charges",
        "-H",
        &auth,
        "-H",
        "Stripe-Version: 2024-06-20",
        "-d",
        "amount=100",
        "-d",
        "currency=usd",
    ]);
    curl(&[
        "--http1.1",
        &format!("https://api.stripe.com/v1/customers?limit=3&api_key={SECRET}"),
    ]);
    let out = output(veris(["baseline", "--state-dir"]).arg(&serve.state));
    assert!(out.status.success(), "{:?}", text(&out));
    let token = text(&out).0.trim().to_string();
    curl(&[
        "https://api.stripe.com/v1/customers",
        "-d",
        "email=a@example.com",
    ]);

    // The latest session, read from the live proxy.
    let out = har_cmd(&serve.state, &[]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let har = har_of(&out, &dir, "live.har");
    assert_eq!(
        paths(&har),
        [
            "POST https://api.stripe.com/v1/charges",
            "GET https://api.stripe.com/v1/customers?limit=3&api_key=[redacted]",
            "POST https://api.stripe.com/v1/customers",
        ]
    );
    // haralyzer loads it: one page, the three entries on it.
    let loaded = haralyzer(&dir.join("live.har"));
    assert_eq!(loaded["version"], "1.2", "{loaded}");
    assert_eq!(loaded["browser"]["name"], "veris", "{loaded}");
    let pages = loaded["pages"].as_array().unwrap();
    assert_eq!(pages.len(), 1, "{loaded}");
    let loaded_entries = pages[0].as_array().unwrap();
    assert_eq!(loaded_entries.len(), 3, "{loaded}");
    assert_eq!(loaded_entries[0][0], "POST", "{loaded}");
    assert_eq!(loaded_entries[0][2], 200, "{loaded}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains(SECRET), "a secret in the HAR: {stdout}");
    let e = &entries(&har)[0];
    assert_eq!(e["response"]["status"], 200);
    assert_eq!(e["response"]["statusText"], "OK");
    assert_eq!(e["request"]["bodySize"], "amount=100&currency=usd".len());
    assert_eq!(e["_veris"]["service"], "stripe");
    assert_eq!(e["_veris"]["tier"], "explicit");
    assert_eq!(e["_veris"]["outcome"], "completed");
    assert!(e["_veris"]["seq"].as_u64().unwrap() > 1);
    // One page, the serve's session, and every entry on it; no negative
    // send/receive (HAR allows none).
    let pages = har["log"]["pages"].as_array().expect("log.pages");
    assert_eq!(pages.len(), 1, "{har}");
    let page = pages[0]["id"].as_str().unwrap();
    for e in entries(&har) {
        assert_eq!(e["pageref"], page, "{e}");
        assert_eq!(
            (&e["timings"]["send"], &e["timings"]["receive"]),
            (&0.into(), &0.into())
        );
    }
    // Timed in fractions of a millisecond (the ledger's microseconds): a
    // loopback twin answers in well under one, which whole milliseconds
    // wrote as 0.
    let times: Vec<f64> = entries(&har)
        .iter()
        .map(|e| {
            assert_eq!(e["time"], e["timings"]["wait"], "{e}");
            e["time"].as_f64().unwrap()
        })
        .collect();
    assert!(times.iter().all(|t| *t > 0.0), "{times:?}");
    assert!(times.iter().any(|t| t.fract() != 0.0), "{times:?}");
    assert_eq!(har["log"]["browser"]["name"], "veris");
    let headers = e["request"]["headers"].as_array().unwrap();
    assert!(
        headers
            .iter()
            .any(|h| h["name"] == "stripe-version" && h["value"] == "2024-06-20"),
        "{headers:?}"
    );
    assert!(
        headers
            .iter()
            .all(|h| h["name"] != "authorization"
                || h["value"].as_str().unwrap().contains("redacted")),
        "{headers:?}"
    );
    let q = &entries(&har)[1]["request"]["queryString"];
    assert_eq!(q[0], serde_json::json!({"name": "limit", "value": "3"}));
    assert_eq!(q[1]["value"], "[redacted]");
    assert_eq!(entries(&har)[1]["request"]["httpVersion"], "HTTP/1.1");
    // The receipt's integrity, not a judgement of its own.
    let receipt = output(veris(["receipt", "--json", "--state-dir"]).arg(&serve.state));
    let receipt: Value = serde_json::from_slice(&receipt.stdout).expect("receipt JSON");
    let status = receipt["integrity"]["status"].as_str().unwrap();
    assert_eq!(har["log"]["_veris"]["integrity"], status);
    let comment = har["log"]["comment"].as_str().unwrap();
    assert!(
        comment.contains("(latest session); integrity: ") && comment.contains(status),
        "{comment}"
    );

    // --since the baseline: only the request after it; -o writes the file.
    let file = dir.join("since.har");
    let out = har_cmd(
        &serve.state,
        &["--since", &token, "-o", file.to_str().unwrap()],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.is_empty(), "-o prints nothing on stdout: {stdout}");
    assert!(stderr.contains("wrote 1 HAR entry to"), "{stderr}");
    validate(&file);
    let since: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(paths(&since), ["POST https://api.stripe.com/v1/customers"]);
    assert_eq!(since["log"]["_veris"]["window"]["scope"], "baseline");
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "temp files left beside the HAR: {left:?}");

    // An empty window: a valid HAR with no entries, exit 0.
    let out = output(veris(["baseline", "--state-dir"]).arg(&serve.state));
    let now = text(&out).0.trim().to_string();
    let out = har_cmd(&serve.state, &["--since", &now]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let empty = har_of(&out, &dir, "empty.har");
    assert!(entries(&empty).is_empty());

    // Offline, after the proxy stopped: the same requests, --all too.
    serve.stop();
    let out = har_cmd(&serve.state, &["--all"]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let all = har_of(&out, &dir, "all.har");
    assert_eq!(entries(&all).len(), 3);
    assert!(all["log"]["comment"]
        .as_str()
        .unwrap()
        .contains("(whole ledger); integrity: "));
}

/// A ledger of two stripe requests from a `veris run`, and its key.
fn run_ledger(dir: &TempDir) -> (PathBuf, String) {
    let script = "curl -sS --max-time 20 https://api.stripe.com/v1/charges -d amount=100 -d currency=usd >/dev/null && curl -sS --max-time 20 https://api.stripe.com/v1/customers >/dev/null";
    let mut cmd = veris(["run", "--state-dir"]);
    cmd.arg(dir.join("state"))
        .args(["--require", "stripe:2", "--", "sh", "-c", script]);
    let out = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("ledger: "))
        .unwrap_or_else(|| panic!("no ledger line: {stderr}"));
    let path = line["ledger: ".len()..].split(" (").next().unwrap();
    let key = line.rsplit("--key ").next().unwrap().trim_end_matches(')');
    (PathBuf::from(path), key.to_string())
}

fn har_ledger(ledger: &Path, extra: &[&str]) -> Output {
    let mut cmd = veris(["har", "--ledger"]);
    cmd.arg(ledger).args(extra);
    output(&mut cmd)
}

#[test]
fn a_hostile_ledger_still_gives_valid_har() {
    if let Err(why) = support::curl().and_then(|()| validator()) {
        return skip(&why);
    }
    let dir = TempDir::new("har-hostile");
    let (ledger, key) = run_ledger(&dir);

    // The run's own ledger with its pinned key: verified, and it says so.
    let out = har_ledger(&ledger, &["--key", &key]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let har = har_of(&out, &dir, "run.har");
    assert_eq!(entries(&har).len(), 2);
    assert_eq!(har["log"]["_veris"]["integrity"], "verified");
    assert!(har["log"]["comment"]
        .as_str()
        .unwrap()
        .ends_with("integrity: verified"));

    // The workload can write the ledger itself: quotes, markup and control
    // characters in a request line's path and header (JSON escapes in the
    // file). Integrity fails (exit 3, as the receipt), the HAR stays valid
    // and says so.
    let recorded = std::fs::read_to_string(&ledger).unwrap();
    assert!(recorded.contains(r#""path":"/v1/charges""#), "{recorded}");
    let forged = dir.join("forged.jsonl");
    std::fs::write(
        &forged,
        recorded.replacen(
            r#""path":"/v1/charges""#,
            r#""path":"/v1/\"</script><a href='x'>\u0000\u001b\u007f\u0085\u2028""#,
            1,
        ),
    )
    .unwrap();
    let out = har_ledger(&forged, &["--key", &key]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("FAIL: integrity failed") && stderr.contains("Next:"),
        "{stderr}"
    );
    let har = har_of(&out, &dir, "forged.har");
    assert_eq!(har["log"]["_veris"]["integrity"], "failed");
    assert!(har["log"]["comment"]
        .as_str()
        .unwrap()
        .contains("integrity: failed ("));
    let urls = paths(&har);
    assert!(
        urls.iter()
            .any(|u| u.contains("/v1/\"</script><a href='x'>\u{0}\u{1b}\u{7f}\u{85}\u{2028}")),
        "{urls:?}"
    );

    // Bytes that are not UTF-8 in a line: that line is not read (a chain
    // problem), the rest still is.
    let mut bytes = recorded.clone().into_bytes();
    let at = bytes
        .windows(10)
        .position(|w| w == b"/v1/charge")
        .expect("the recorded path");
    bytes.splice(at + 4..at + 5, [0xff, 0xfe, 0x1b, 0xc3]);
    std::fs::write(&forged, &bytes).unwrap();
    let out = har_ledger(&forged, &["--key", &key]);
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));
    let har = har_of(&out, &dir, "bytes.har");
    assert_eq!(har["log"]["_veris"]["integrity"], "failed");

    // A torn tail (a crash mid-write): left out, and said so with a next step.
    let torn = dir.join("torn.jsonl");
    std::fs::write(&torn, format!("{recorded}{{\"v\":3,\"seq\":")).unwrap();
    let out = har_ledger(&torn, &[]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("torn last line") && stderr.contains("Next:"),
        "{stderr}"
    );
    let har = har_of(&out, &dir, "torn.har");
    assert_eq!(entries(&har).len(), 2);
    assert!(har["log"]["comment"]
        .as_str()
        .unwrap()
        .contains("integrity: unverified ("));
}

#[test]
fn bad_input_is_an_error_with_a_next_step() {
    let dir = TempDir::new("har-errors");
    let state = dir.join("state");

    // No ledger.
    let out = har_cmd(&state, &[]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("no ledger in")
            && stderr.contains("holds no run")
            && stderr.contains("Next:"),
        "{stderr}"
    );

    // A baseline that is not one.
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("ledger.jsonl"), "").unwrap();
    let out = har_cmd(&state, &["--since", "yesterday"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("bad baseline") && stderr.contains("Next:"),
        "{stderr}"
    );
    // One taken on another ledger.
    let out = har_cmd(&state, &["--since", "vb2:0123456789abcdef:3"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("another ledger") && stderr.contains("Next:"),
        "{stderr}"
    );

    // An empty ledger is an empty HAR.
    let out = har_cmd(&state, &[]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let har: Value = serde_json::from_slice(&out.stdout).expect("HAR JSON");
    assert_eq!(har["log"]["entries"], serde_json::json!([]));
    match validator() {
        Ok(()) => {
            let path = dir.join("empty.har");
            std::fs::write(&path, &out.stdout).unwrap();
            validate(&path);
        }
        // The other tests say SKIP; here validity is a bonus.
        Err(why) => eprintln!("(not validated: {why})"),
    }

    // A path that cannot be written: exit 1, nothing left behind.
    let bad = dir.join("no-such-dir").join("out.har");
    let out = har_cmd(&state, &["-o", bad.to_str().unwrap()]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("writing the HAR to") && stderr.contains("Next:"),
        "{stderr}"
    );
    assert!(!bad.exists());
}
