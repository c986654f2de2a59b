//! End-to-end tests of `--junit FILE` (M7): `veris run` and `veris receipt`
//! write a JUnit XML report whose test cases fail exactly where the exit code
//! says the receipt failed (pass, empty, requirement unmet, integrity failed,
//! unverified under --require-verified, the command's own code), the report
//! of a hostile request path is well-formed and valid against
//! tests/junit/junit.xsd (xmllint), a report is written when the receipt
//! cannot be built, and a path that cannot be written is an error before
//! the command runs. Real binary, built-in twin, real curl; the client's
//! environment is cleared (no ambient CA or proxy variable), vendor names are
//! resolved by veris, never by real DNS.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Output;

use support::{command, output, skip, text, veris, TempDir};

const CHARGE: &str =
    "curl -sS --max-time 20 https://api.stripe.com/v1/charges -d amount=100 -d currency=usd >/dev/null";

const EMPTY: &str = "0 requests reached the twin: the code never reached its dependency";

fn run(dir: &TempDir, junit: &Path, extra: &[&str], child: &[&str]) -> Output {
    let mut cmd = veris(["run", "--state-dir"]);
    cmd.arg(dir.join("state"))
        .arg("--junit")
        .arg(junit)
        .args(extra)
        .arg("--")
        .args(child);
    output(&mut cmd)
}

/// One `<testcase>` of a report.
#[derive(Debug)]
struct Case {
    name: String,
    /// The lines of its `<failure>` text, entities decoded.
    failure: Option<Vec<String>>,
    skipped: bool,
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#13;", "\r")
        .replace("&#10;", "\n")
        .replace("&#9;", "\t")
        .replace("&amp;", "&")
}

/// `name="value"` in a start tag.
fn attribute(tag: &str, name: &str) -> Option<String> {
    let key = format!(" {name}=\"");
    let start = tag.find(&key)? + key.len();
    let end = tag[start..].find('"')? + start;
    Some(unescape(&tag[start..end]))
}

/// The test cases of a report, and the suite's start tag.
fn cases(xml: &str) -> (String, Vec<Case>) {
    let suite_start = xml.find("<testsuite ").expect("a <testsuite>");
    let suite = xml[suite_start..xml[suite_start..].find('>').unwrap() + suite_start].to_string();
    let mut out = Vec::new();
    for chunk in xml.split("<testcase ").skip(1) {
        let head_end = chunk.find('>').unwrap();
        let head = format!(" {}", &chunk[..head_end]);
        let body = if head.ends_with('/') {
            ""
        } else {
            &chunk[head_end..chunk.find("</testcase>").expect("</testcase>")]
        };
        let failure = body.find("<failure ").map(|at| {
            let text_start = body[at..].find('>').unwrap() + at + 1;
            let text_end = body.find("</failure>").unwrap();
            unescape(&body[text_start..text_end])
                .lines()
                .map(str::to_string)
                .collect()
        });
        out.push(Case {
            name: attribute(&head, "name").expect("a case has a name"),
            failure,
            skipped: body.contains("<skipped"),
        });
    }
    (suite, out)
}

/// Checks the report against the command's exit code and printed verdict:
/// a case fails exactly when the receipt failed, and the failure texts are
/// the receipt's `FAIL:` lines (plus the empty sentence and, for `run`, the
/// command's code). Returns the names of the failing cases.
fn agrees(path: &Path, out: &Output, command_exit: Option<i32>, allow_empty: bool) -> Vec<String> {
    let (stdout, stderr) = text(out);
    let xml = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no report at {}: {e}\n{stdout}\n{stderr}", path.display()));
    let (suite, cases) = cases(&xml);
    let failing: Vec<&Case> = cases.iter().filter(|c| c.failure.is_some()).collect();
    let code = out.status.code().expect("an exit code");
    assert_eq!(
        code != 0,
        !failing.is_empty(),
        "exit {code} but failing cases {failing:?}\n{xml}\n{stderr}"
    );
    assert_eq!(
        attribute(&suite, "tests"),
        Some(cases.len().to_string()),
        "{suite}"
    );
    assert_eq!(
        attribute(&suite, "failures"),
        Some(failing.len().to_string()),
        "{suite}"
    );
    assert_eq!(
        attribute(&suite, "skipped"),
        Some(cases.iter().filter(|c| c.skipped).count().to_string()),
        "{suite}"
    );
    assert_eq!(attribute(&suite, "errors").as_deref(), Some("0"), "{suite}");
    let printed = format!("{stdout}\n{stderr}");
    let mut expected: Vec<String> = printed
        .lines()
        .filter_map(|l| l.strip_prefix("FAIL: "))
        .map(str::to_string)
        .collect();
    if printed.contains(EMPTY) && !allow_empty {
        expected.push(EMPTY.to_string());
    }
    if let Some(c) = command_exit.filter(|c| *c != 0) {
        expected.push(format!("the command exited {c}"));
    }
    let mut got: Vec<String> = failing
        .iter()
        .flat_map(|c| c.failure.clone().unwrap())
        .collect();
    expected.sort();
    got.sort();
    assert_eq!(got, expected, "failures vs the printed verdict\n{xml}");
    if let Some(why) = xmllint_missing() {
        // The schema test below says SKIP; here validity is a bonus.
        eprintln!("(not validated: {why})");
    } else {
        validate(path);
    }
    failing.iter().map(|c| c.name.clone()).collect()
}

fn xmllint_missing() -> Option<String> {
    (!support::tool_works("xmllint", &["--version"]))
        .then(|| "xmllint is not installed (apt install libxml2-utils)".to_string())
}

fn schema() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/junit/junit.xsd")
}

/// Well-formed and valid against tests/junit/junit.xsd.
fn validate(path: &Path) {
    let out = output(
        command("xmllint")
            .arg("--noout")
            .arg("--schema")
            .arg(schema())
            .arg(path),
    );
    assert!(
        out.status.success(),
        "{} is not valid JUnit XML: {:?}\n{}",
        path.display(),
        text(&out),
        std::fs::read_to_string(path).unwrap_or_default()
    );
}

/// `ledger: PATH (verify it later: veris receipt --ledger PATH --key FP)`.
fn ledger_and_key(stderr: &str) -> (PathBuf, String) {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("ledger: "))
        .unwrap_or_else(|| panic!("no ledger line: {stderr}"));
    let path = line["ledger: ".len()..].split(" (").next().unwrap();
    let key = line.rsplit("--key ").next().unwrap().trim_end_matches(')');
    (PathBuf::from(path), key.to_string())
}

#[test]
fn junit_cases_fail_exactly_where_the_exit_code_says() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let dir = TempDir::new("junit-agree");

    // Pass: a charge, required, verified.
    let pass = dir.join("pass.xml");
    let out = run(
        &dir,
        &pass,
        &[
            "--require",
            "stripe:1",
            "--require-request",
            "stripe POST /v1/charges",
            "--require-verified",
            "--junit-suite",
            "payments e2e",
        ],
        &["sh", "-c", CHARGE],
    );
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert!(agrees(&pass, &out, Some(0), false).is_empty());
    let xml = std::fs::read_to_string(&pass).unwrap();
    // The suite is the user's; the cases' class is made of it.
    assert!(xml.contains("<testsuite name=\"payments e2e\""), "{xml}");
    assert!(xml.contains("classname=\"payments.e2e\""), "{xml}");
    // The command's case carries the time the command ran.
    let command = xml
        .split("<testcase ")
        .find(|c| c.starts_with("name=\"command exits 0\""))
        .expect("the command's case");
    let time: f64 = attribute(command, "time").unwrap().parse().unwrap();
    assert!(time > 0.0, "{command}");
    // Checks in words, never the code's names for them.
    assert!(xml.contains("  chain: ok "), "{xml}");
    for name in [
        "integrity",
        "at least 1 request reached the twin",
        "no vendor host refused the veris certificate",
        "require stripe &gt;= 1 (2xx)",
        "require request stripe POST /v1/charges (2xx)",
        "command exits 0",
    ] {
        assert!(xml.contains(&format!("name=\"{name}\"")), "{name}: {xml}");
    }
    assert!(
        xml.contains("POST \"/v1/charges\" -&gt; 200"),
        "the receipt text is the system-out: {xml}"
    );
    let (ledger, key) = ledger_and_key(&text(&out).1);

    // Empty: nothing reached the twin.
    let empty = dir.join("empty.xml");
    let out = run(&dir, &empty, &[], &["true"]);
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));
    assert_eq!(
        agrees(&empty, &out, Some(0), false),
        ["at least 1 request reached the twin"]
    );

    // Allowed empty: the case is skipped, the run passes.
    let allowed = dir.join("allowed.xml");
    let out = run(&dir, &allowed, &["--allow-empty"], &["true"]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert!(agrees(&allowed, &out, Some(0), true).is_empty());
    assert!(std::fs::read_to_string(&allowed)
        .unwrap()
        .contains("skipped=\"1\""));

    // A requirement unmet, and the command's own code.
    let unmet = dir.join("unmet.xml");
    let script = format!("{CHARGE}; exit 7");
    let out = run(
        &dir,
        &unmet,
        &["--require", "stripe:2"],
        &["sh", "-c", &script],
    );
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));
    assert_eq!(
        agrees(&unmet, &out, Some(7), false),
        ["require stripe >= 2 (2xx)", "command exits 0"]
    );

    // The command's code alone.
    let code = dir.join("code.xml");
    let out = run(
        &dir,
        &code,
        &["--require", "stripe"],
        &["sh", "-c", &script],
    );
    assert_eq!(out.status.code(), Some(7), "{:?}", text(&out));
    assert_eq!(agrees(&code, &out, Some(7), false), ["command exits 0"]);

    // Unverified under --require-verified: no pinned key, offline.
    let unverified = dir.join("unverified.xml");
    let mut cmd = veris(["receipt", "--ledger"]);
    cmd.arg(&ledger)
        .arg("--require-verified")
        .arg("--junit")
        .arg(&unverified);
    let out = output(&mut cmd);
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));
    assert_eq!(
        agrees(&unverified, &out, None, false),
        // Named for what it asserts: the same case whatever the result.
        ["integrity"]
    );

    // Integrity failed: a request line rewritten after the run.
    let forged =
        std::fs::read_to_string(&ledger)
            .unwrap()
            .replacen("/v1/charges", "/v1/chargez", 1);
    std::fs::write(&ledger, forged).unwrap();
    let failed = dir.join("failed.xml");
    let mut cmd = veris(["receipt", "--ledger"]);
    cmd.arg(&ledger)
        .args(["--key", &key, "--allow-empty", "--junit"])
        .arg(&failed);
    let out = output(&mut cmd);
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));
    assert_eq!(agrees(&failed, &out, None, true), ["integrity"]);
}

#[test]
fn junit_of_a_hostile_request_path_is_well_formed_and_valid() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    if let Some(why) = xmllint_missing() {
        return skip(&why);
    }
    let dir = TempDir::new("junit-hostile");
    let report = dir.join("hostile.xml");
    // What a request line can carry (the proxy answers `<` and `>` with 400
    // itself): a CDATA end without its `>`, an entity start, quotes, and NUL,
    // ESC and invalid UTF-8 percent-encoded.
    let url = "https://api.stripe.com/v1/x]]&b\"c'd/%00%1b%ff%c3%28?q=]]&";
    let out = run(
        &dir,
        &report,
        &["--require", "stripe:2"],
        &[
            "curl",
            "-gsS",
            "--http1.1",
            "--max-time",
            "20",
            "-o",
            "/dev/null",
            url,
        ],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(r#"GET "/v1/x]]&b\"c'd/%00%1b%ff%c3%28" -> 404"#),
        "the path is recorded: {stderr}"
    );
    validate(&report);
    let xml = std::fs::read_to_string(&report).unwrap();
    assert!(
        xml.contains(r#"GET "/v1/x]]&amp;b\"c'd/%00%1b%ff%c3%28" -&gt; 404"#),
        "{xml}"
    );
    agrees(&report, &out, Some(0), false);

    // The workload can write the ledger file itself: a request line whose
    // path holds markup, a CDATA end, NUL, ESC, a noncharacter and a C1
    // control reaches the receipt text as is (integrity fails, the listing
    // stays), and the report still parses.
    let (ledger, key) = ledger_and_key(&stderr);
    let recorded = std::fs::read_to_string(&ledger).unwrap();
    let forged = dir.join("forged.jsonl");
    std::fs::write(
        &forged,
        recorded.replacen(
            r#""path":"/v1/x]]&b\"c'd/"#,
            r#""path":"/v1/x]]><a>&amp;\u0000\u001b\uffff\u0085/"#,
            1,
        ),
    )
    .unwrap();
    let forged_report = dir.join("forged.xml");
    let mut cmd = veris(["receipt", "--ledger"]);
    cmd.arg(&forged)
        .args(["--key", &key, "--junit"])
        .arg(&forged_report);
    let out = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("GET \"/v1/x]]><a>&amp;\\u{0}\\u{1b}\u{ffff}\\u{85}/"),
        "the forged path reaches the receipt: {stdout:?}"
    );
    validate(&forged_report);
    let xml = std::fs::read_to_string(&forged_report).unwrap();
    assert!(
        xml.contains("GET &quot;/v1/x]]&gt;&lt;a&gt;&amp;amp;\\u{0}\\u{1b}\u{fffd}\\u{85}/")
            || xml.contains("GET \"/v1/x]]&gt;&lt;a&gt;&amp;amp;\\u{0}\\u{1b}\u{fffd}\\u{85}/"),
        "{xml}"
    );
    assert_eq!(xml.matches("]]>").count(), 0, "{xml}");
    assert_eq!(agrees(&forged_report, &out, None, false), ["integrity"]);

    // Raw bytes that are not UTF-8 in a ledger line.
    let mut bytes = recorded.into_bytes();
    let at = bytes
        .windows(5)
        .position(|w| w == b"/v1/x")
        .expect("the recorded path");
    bytes.splice(at + 4..at + 5, [0xff, 0xfe, 0x1b, 0xc3]);
    std::fs::write(&forged, bytes).unwrap();
    let mut cmd = veris(["receipt", "--ledger"]);
    cmd.arg(&forged)
        .args(["--key", &key, "--junit"])
        .arg(&forged_report);
    let out = output(&mut cmd);
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));
    validate(&forged_report);

    // The error report of a ledger path made of control bytes and markup.
    let weird = dir.join("no\u{1b}such\u{7}<ledger>&]]>");
    let error = dir.join("error.xml");
    let mut cmd = veris(["receipt", "--ledger"]);
    cmd.arg(&weird).arg("--junit").arg(&error);
    let out = output(&mut cmd);
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
    validate(&error);
    let xml = std::fs::read_to_string(&error).unwrap();
    assert!(
        xml.contains("errors=\"1\"") && !xml.contains('\u{1b}') && !xml.contains('\u{7}'),
        "{xml}"
    );
}

#[test]
fn junit_is_written_when_no_receipt_can_be_built() {
    let dir = TempDir::new("junit-error");
    let report = dir.join("r.xml");
    let mut cmd = veris(["receipt", "--ledger"]);
    cmd.arg(dir.join("missing.jsonl"))
        .arg("--junit")
        .arg(&report);
    let out = output(&mut cmd);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no ledger at"), "{stderr}");
    let xml = std::fs::read_to_string(&report).expect("a report even without a receipt");
    assert!(
        xml.contains("tests=\"1\" failures=\"0\" errors=\"1\""),
        "{xml}"
    );
    assert!(xml.contains("<error message=\"no ledger at "), "{xml}");

    // A command that cannot be found: 127, and the report says why.
    let out = run(&dir, &report, &[], &["veris-no-such-command"]);
    assert_eq!(out.status.code(), Some(127), "{:?}", text(&out));
    let xml = std::fs::read_to_string(&report).unwrap();
    assert!(
        xml.contains("errors=\"1\"") && xml.contains("veris-no-such-command: command not found"),
        "{xml}"
    );

    // A usage error (a misspelt service): the passing report of an earlier
    // run is replaced by one that names the error, never left behind.
    std::fs::write(&report, "<testsuites tests=\"1\" failures=\"0\"/>").unwrap();
    let out = run(&dir, &report, &["--require", "strpe:1"], &["true"]);
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
    let xml = std::fs::read_to_string(&report).expect("a report of the usage error");
    assert!(
        xml.contains("errors=\"1\"") && xml.contains("strpe"),
        "{xml}"
    );
}

#[test]
fn a_junit_path_that_cannot_be_written_fails_before_the_command_runs() {
    let dir = TempDir::new("junit-unwritable");
    let marker = dir.join("ran");
    let bad = dir.join("no-such-dir").join("r.xml");
    let touch = format!("touch {}", marker.display());
    let out = run(&dir, &bad, &["--allow-empty"], &["sh", "-c", &touch]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--junit") && stderr.contains("no-such-dir") && stderr.contains("Next:"),
        "{stderr}"
    );
    assert!(!marker.exists(), "the command ran before the error");

    // A directory is not a report file either; nothing is left beside it.
    let mut cmd = veris(["receipt", "--ledger"]);
    cmd.arg(dir.join("missing.jsonl"))
        .arg("--junit")
        .arg(dir.path());
    let out = output(&mut cmd);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is a directory"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().contains("probe") || n.to_string_lossy().contains("tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// What `junitparser` (a JUnit reader nobody here wrote) sees in a report:
/// per suite its name, per case its name, class, time and results.
const JUNITPARSER: &str = r#"
import json, sys
from junitparser import JUnitXml, TestSuite, Failure, Skipped, Error
xml = JUnitXml.fromfile(sys.argv[1])
suites = [xml] if isinstance(xml, TestSuite) else list(xml)
out = []
for s in suites:
    cases = []
    for c in s:
        kinds = [type(r).__name__ for r in c.result]
        cases.append({"name": c.name, "classname": c.classname, "time": c.time,
                      "results": kinds,
                      "text": [r.text or "" for r in c.result if isinstance(r, Failure)]})
    out.append({"name": s.name, "tests": s.tests, "failures": s.failures, "cases": cases})
print(json.dumps(out))
"#;

fn junitparser(path: &Path) -> serde_json::Value {
    let out = output(command("python3").args(["-c", JUNITPARSER]).arg(path));
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "junitparser cannot read {}: {stderr}",
        path.display()
    );
    serde_json::from_str(&stdout).unwrap()
}

/// junitparser reads what `veris run --junit` and `veris receipt --junit`
/// write as written: the same cases by name, in order, the same failures
/// (and their texts), a time on each case, and the suite's counts.
#[test]
fn junitparser_reads_the_reports_as_written() {
    if let Err(why) = support::curl().and_then(|()| support::python_module("junitparser")) {
        return skip(&why);
    }
    let dir = TempDir::new("junit-parser");
    let report = dir.join("run.xml");
    let script = format!("{CHARGE}; exit 7");
    let out = run(
        &dir,
        &report,
        &["--require", "stripe:2", "--junit-suite", "payments e2e"],
        &["sh", "-c", &script],
    );
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));
    let (ledger, key) = ledger_and_key(&text(&out).1);
    let receipt = dir.join("receipt.xml");
    let out = output(
        veris(["receipt", "--ledger"])
            .arg(&ledger)
            .args(["--key", &key, "--require", "stripe:2", "--junit"])
            .arg(&receipt),
    );
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));
    for (path, failing) in [
        (
            &report,
            vec!["require stripe >= 2 (2xx)", "command exits 0"],
        ),
        (&receipt, vec!["require stripe >= 2 (2xx)"]),
    ] {
        let xml = std::fs::read_to_string(path).unwrap();
        let (_, ours) = cases(&xml);
        let seen = junitparser(path);
        let suites = seen.as_array().unwrap();
        assert_eq!(suites.len(), 1, "{seen}");
        let suite = &suites[0];
        let theirs = suite["cases"].as_array().unwrap();
        let names: Vec<&str> = theirs.iter().map(|c| c["name"].as_str().unwrap()).collect();
        let expected: Vec<&str> = ours.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, expected, "{seen}");
        let failed: Vec<&str> = theirs
            .iter()
            .filter(|c| {
                c["results"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|r| r == "Failure")
            })
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(failed, failing, "{seen}");
        assert_eq!(suite["failures"], failing.len(), "{seen}");
        assert_eq!(suite["tests"], ours.len(), "{seen}");
        for (c, o) in theirs.iter().zip(&ours) {
            assert!(c["time"].as_f64().is_some_and(|t| t >= 0.0), "{c}");
            assert!(
                c["classname"].as_str().is_some_and(|n| !n.is_empty()),
                "{c}"
            );
            if let Some(lines) = &o.failure {
                assert_eq!(
                    c["text"][0].as_str().unwrap().lines().collect::<Vec<_>>(),
                    *lines,
                    "{c}"
                );
            }
        }
    }
    let run_suite = &junitparser(&report)[0];
    assert_eq!(run_suite["name"], "payments e2e");
    let command = run_suite["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "command exits 0")
        .unwrap();
    assert!(command["time"].as_f64().unwrap() > 0.0, "{command}");
}
