//! End-to-end tests of body capture (M7): `veris serve --capture-bodies
//! DIR` with the built-in twin and real curl requests; `veris har --bodies
//! DIR` shows the redacted bodies, schema-valid (Python's `jsonschema`),
//! only where the stored file matches the SHA-256 in the sealed ledger.
//! The workload is the adversary: it edits and deletes stored files
//! (`body_altered`, `body_missing`), and plants a symlink and a FIFO at the
//! next names (never followed, never waited on). Caps per body and in total
//! hold; without the flag nothing is captured.
//!
//! Loopback only: curl is given the proxy (`-x`), so vendor names go to it
//! unresolved and never to real DNS.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use support::{command, output, skip, text, veris, Serve, TempDir};

const SK: &str = "sk_live_51HqLyjWDarjtT1zdp7dc";
const PASSWORD: &str = "hunter2-Correct-Horse";
const CARD: &str = "4242424242424242";
const BEARER_TOKEN: &str = "abcDEF123ghiJKL456mno";

/// Every secret this file sends, as it was sent.
const SECRETS: [&str; 5] = [SK, PASSWORD, CARD, BEARER_TOKEN, "9271"];

const VALIDATE: &str = r#"
import json, sys, jsonschema
schema = json.load(open(sys.argv[1]))
har = json.load(open(sys.argv[2]))
errors = list(jsonschema.Draft7Validator(schema).iter_errors(har))
for e in errors[:5]:
    print(list(e.path), e.message)
sys.exit(1 if errors else 0)
"#;

fn ready() -> Result<(), String> {
    support::curl()?;
    if support::tool_works("python3", &["-c", "import jsonschema"]) {
        Ok(())
    } else {
        Err("python3 with `jsonschema` not available (pip install jsonschema)".into())
    }
}

/// `veris har --bodies DIR` of the latest session, validated; the JSON and
/// its text.
fn har(state: &Path, bodies: &Path, out_dir: &TempDir, name: &str) -> (Value, String) {
    let out = output(
        veris(["har", "--state-dir"])
            .arg(state)
            .arg("--bodies")
            .arg(bodies),
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let path = out_dir.join(name);
    std::fs::write(&path, &out.stdout).unwrap();
    let schema = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/har/har-1.2.schema.json");
    let v = output(
        command("python3")
            .args(["-c", VALIDATE])
            .arg(schema)
            .arg(&path),
    );
    assert!(
        v.status.success(),
        "not valid HAR 1.2: {:?}\n{stdout}",
        text(&v)
    );
    (serde_json::from_str(&stdout).unwrap(), stdout)
}

/// The `body_capture` lines of the ledger, waiting until there are `n`
/// (they are written once both bodies ended, off the request path).
fn captures(serve: &Serve, n: usize) -> Vec<Value> {
    support::wait_for("body_capture lines", Duration::from_secs(20), || {
        let lines: Vec<Value> = serve
            .ledger_lines()
            .into_iter()
            .filter(|l| l["kind"] == "body_capture")
            .collect();
        (lines.len() >= n).then_some(lines)
    })
}

/// The seq of the last `request` line.
fn last_request(serve: &Serve) -> u64 {
    serve
        .ledger_lines()
        .iter()
        .rev()
        .find(|l| l["kind"] == "request")
        .and_then(|l| l["seq"].as_u64())
        .expect("a request line")
}

fn entry_of(har: &Value, seq: u64) -> Value {
    har["log"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["_veris"]["seq"] == seq)
        .unwrap_or_else(|| panic!("no HAR entry for seq {seq}"))
        .clone()
}

/// No secret in any form in `what`.
fn assert_clean(what: &str, text: &str) {
    for s in SECRETS {
        assert!(!text.contains(s), "{s} in {what}: {text}");
    }
    assert!(
        !text.contains("sk_live_51"),
        "part of a key in {what}: {text}"
    );
}

fn all_files(dir: &Path) -> String {
    let mut all = String::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.file_type().unwrap().is_file() {
            all.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
        }
    }
    all
}

#[test]
fn captured_bodies_are_redacted_sealed_and_checked() {
    if let Err(why) = ready() {
        return skip(&why);
    }
    let out_dir = TempDir::new("capture-out");
    let bodies = out_dir.join("bodies");
    let mut serve = Serve::start(
        "capture",
        &[
            "--capture-bodies",
            bodies.to_str().unwrap(),
            "--capture-max-body",
            "2048",
        ],
    );
    let curl = |args: &[&str]| {
        let out = output(serve.curl().args(args));
        assert!(out.status.success(), "curl {args:?}: {:?}", text(&out));
    };
    let json = format!(
        r#"{{"amount":2000,"currency":"usd","password":"{PASSWORD}","api_key":"{SK}","card":{{"number":"{CARD}","cvc":"9271"}},"description":"Bearer {BEARER_TOKEN}"}}"#
    );
    curl(&[
        "https://api.stripe.com/v1/charges",
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        &json,
    ]);
    let post = last_request(&serve);
    curl(&["https://api.stripe.com/v1/customers?limit=2"]);
    let get = last_request(&serve);
    // Longer than the per-body cap: cut, and the cut recorded.
    let long = format!("note=ok{}", "&x=1".repeat(1500));
    curl(&[
        "https://api.stripe.com/v1/customers",
        "-H",
        "Content-Type: application/x-www-form-urlencoded",
        "--data-binary",
        &long,
    ]);
    let cut = last_request(&serve);
    // Binary: only the size.
    curl(&[
        "https://api.stripe.com/v1/customers",
        "-H",
        "Content-Type: application/octet-stream",
        "--data-binary",
        "\u{1}\u{2}binary",
    ]);
    let binary = last_request(&serve);
    // XML: a secret in an element, which the text scanner cannot see, so
    // the body is not stored at all.
    curl(&[
        "https://api.stripe.com/v1/customers",
        "-H",
        "Content-Type: application/xml",
        "--data-binary",
        &format!("<login><password>{PASSWORD}</password></login>"),
    ]);
    let xml = last_request(&serve);

    let lines = captures(&serve, 5);
    let line = |of: u64| {
        lines
            .iter()
            .find(|l| l["of"] == of)
            .unwrap_or_else(|| panic!("no body_capture for {of}: {lines:?}"))
            .clone()
    };
    assert!(line(post)["request"]["sha256"].is_string());
    assert_eq!(line(get)["request"]["skipped"], "empty");
    assert_eq!(line(cut)["request"]["truncated_at"], 2048);
    assert_eq!(line(cut)["request"]["bytes"], long.len());
    assert_eq!(line(binary)["request"]["skipped"], "binary");
    assert_eq!(line(xml)["request"]["skipped"], "unstructured_text");
    // Nothing secret anywhere: the dir, the ledger.
    assert_clean("the capture dir", &all_files(&bodies));
    assert_clean(
        "the ledger",
        &std::fs::read_to_string(serve.ledger()).unwrap(),
    );
    // A body capture is not a request.
    let receipt = output(veris(["receipt", "--json", "--state-dir"]).arg(&serve.state));
    let receipt: Value = serde_json::from_slice(&receipt.stdout).expect("receipt JSON");
    assert_eq!(receipt["services"]["stripe"]["requests"], 5, "{receipt}");

    let (h, raw) = har(&serve.state, &bodies, &out_dir, "live.har");
    assert_clean("the HAR", &raw);
    assert!(h["log"]["comment"]
        .as_str()
        .unwrap()
        .contains("never evidence for the verdict"));
    let e = entry_of(&h, post);
    let sent: Value =
        serde_json::from_str(e["request"]["postData"]["text"].as_str().unwrap()).unwrap();
    assert_eq!(sent["amount"], 2000);
    assert_eq!(sent["currency"], "usd");
    assert_eq!(sent["password"], "[redacted]");
    assert_eq!(sent["card"]["number"], "[redacted]");
    assert_eq!(sent["description"], "Bearer [redacted]");
    assert_eq!(e["request"]["postData"]["mimeType"], "application/json");
    let got: Value =
        serde_json::from_str(e["response"]["content"]["text"].as_str().unwrap()).unwrap();
    assert_eq!(got["object"], "charge");
    let e = entry_of(&h, get);
    assert!(e["request"].get("postData").is_none(), "{e}");
    assert!(e["response"]["content"]["text"]
        .as_str()
        .unwrap()
        .contains("\"list\""));
    let e = entry_of(&h, cut);
    assert_eq!(
        e["request"]["postData"]["_veris"],
        "truncated at 2048 bytes"
    );
    assert!(e["request"]["postData"]["text"].as_str().unwrap().len() <= 2048);
    let e = entry_of(&h, binary);
    assert_eq!(e["request"]["postData"]["_veris"], "not_captured: binary");
    assert!(e["request"]["postData"].get("text").is_none());

    // (a) The workload edits one stored body and deletes another: neither
    // is shown, each says why.
    let file =
        |of: u64, side: &str| bodies.join(line(of)[side]["file"].as_str().expect("a stored file"));
    std::fs::write(
        file(post, "request"),
        r#"{"password":"[redacted]","amount":1}"#,
    )
    .unwrap();
    std::fs::remove_file(file(get, "response")).unwrap();
    let (h, _) = har(&serve.state, &bodies, &out_dir, "edited.har");
    let e = entry_of(&h, post);
    assert_eq!(e["request"]["postData"]["_veris"], "body_altered");
    assert!(e["request"]["postData"].get("text").is_none(), "{e}");
    assert!(e["response"]["content"]["text"].is_string());
    let e = entry_of(&h, get);
    assert_eq!(e["response"]["content"]["_veris"], "body_missing");
    assert!(e["response"]["content"].get("text").is_none(), "{e}");

    // (b) A symlink and a FIFO at the next names: not followed, not waited
    // on; the proxy answers and records `store_failed`.
    let run_id = serve.ledger_lines()[0]["run_id"]
        .as_str()
        .expect("run_id")
        .to_string();
    let target = out_dir.join("outside.txt");
    std::fs::write(&target, "untouched").unwrap();
    let next = serve.ledger_lines().last().unwrap()["seq"]
        .as_u64()
        .unwrap();
    for seq in next + 1..next + 12 {
        let at = |side: &str| bodies.join(format!("{run_id}-{seq}-{side}.txt"));
        std::os::unix::fs::symlink(&target, at("request")).unwrap();
        let made = command("mkfifo").arg(at("response")).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo");
    }
    curl(&[
        "https://api.stripe.com/v1/customers",
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        r#"{"email":"a@example.com"}"#,
    ]);
    let planted = last_request(&serve);
    assert!(planted <= next + 11, "the request took seq {planted}");
    let lines = captures(&serve, 5);
    let l = lines.iter().find(|l| l["of"] == planted).expect("its line");
    assert_eq!(l["request"]["skipped"], "store_failed", "{l}");
    assert_eq!(l["response"]["skipped"], "store_failed", "{l}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched");
    let (h, _) = har(&serve.state, &bodies, &out_dir, "planted.har");
    let e = entry_of(&h, planted);
    assert_eq!(
        e["request"]["postData"]["_veris"],
        "not_captured: store_failed"
    );

    // Offline after a clean stop: every capture line is under the final
    // seal, and the HAR reads the same.
    serve.stop();
    let last = serve.ledger_lines().last().unwrap().clone();
    assert_eq!(last["kind"], "seal", "{last}");
    let (h, _) = har(&serve.state, &bodies, &out_dir, "offline.har");
    assert_eq!(
        entry_of(&h, post)["request"]["postData"]["_veris"],
        "body_altered"
    );
}

#[test]
fn caps_hold_and_without_the_flag_nothing_is_captured() {
    if let Err(why) = ready() {
        return skip(&why);
    }
    let out_dir = TempDir::new("capture-caps");
    let bodies = out_dir.join("bodies");
    let mut serve = Serve::start(
        "capture-caps",
        &[
            "--capture-bodies",
            bodies.to_str().unwrap(),
            "--capture-max-body",
            "100",
            "--capture-max-total",
            "700",
        ],
    );
    let body = format!("text=y{}", "&y=1".repeat(100));
    for _ in 0..8 {
        let out = output(serve.curl().args([
            "https://api.stripe.com/v1/customers",
            "-H",
            "Content-Type: application/x-www-form-urlencoded",
            "--data-binary",
            &body,
        ]));
        assert!(out.status.success(), "{:?}", text(&out));
    }
    let lines = captures(&serve, 8);
    let mut stored = 0;
    let mut capped = false;
    for l in &lines {
        for side in ["request", "response"] {
            let b = &l[side];
            if let Some(n) = b["stored"].as_u64() {
                assert!(!capped, "stored after the total cap: {lines:?}");
                assert!(n <= 100, "{b}");
                stored += n;
            }
            if b["skipped"] == "total_cap" {
                capped = true;
            }
        }
        assert_eq!(l["request"]["bytes"], body.len());
    }
    assert!(capped, "the total cap was never reached: {lines:?}");
    assert_eq!(lines[0]["request"]["truncated_at"], 100);
    let on_disk: u64 = std::fs::read_dir(&bodies)
        .unwrap()
        .flatten()
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert_eq!(on_disk, stored);
    assert!(on_disk <= 700, "{on_disk} bytes stored");
    let (h, _) = har(&serve.state, &bodies, &out_dir, "caps.har");
    let last = h["log"]["entries"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        last["request"]["postData"]["_veris"],
        "not_captured: total_cap"
    );
    serve.stop();

    // Off by default: no capture line, nothing to show.
    let mut plain = Serve::start("capture-off", &[]);
    let out = output(plain.curl().args([
        "https://api.stripe.com/v1/customers",
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        &format!(r#"{{"password":"{PASSWORD}"}}"#),
    ]));
    assert!(out.status.success(), "{:?}", text(&out));
    plain.stop();
    let kinds: Vec<Value> = plain
        .ledger_lines()
        .iter()
        .map(|l| l["kind"].clone())
        .collect();
    assert!(kinds.iter().all(|k| k != "body_capture"), "{kinds:?}");
    assert!(kinds.iter().any(|k| k == "request"), "{kinds:?}");
    let empty = out_dir.join("empty");
    std::fs::create_dir(&empty).unwrap();
    let (h, raw) = har(&plain.state, &empty, &out_dir, "off.har");
    assert_clean("the HAR", &raw);
    let e = &h["log"]["entries"][0];
    assert_eq!(
        e["response"]["content"]["_veris"],
        "not_captured: no body_capture line"
    );
    assert!(e["request"].get("postData").is_none());
    let state_files: Vec<String> = walk(&plain.state);
    assert!(
        state_files
            .iter()
            .all(|f| !f.ends_with("-request.txt") && !f.ends_with("-response.txt")),
        "{state_files:?}"
    );
}

/// Every file under `dir`, as paths.
fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(p);
            } else {
                out.push(p.display().to_string());
            }
        }
    }
    out
}
