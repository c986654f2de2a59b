//! End-to-end tests of `veris mcp`: the binary started as an MCP client
//! starts a stdio server (stdin and stdout piped), driven with the JSON-RPC
//! lines an MCP client sends, against a live `veris serve` with its built-in
//! twin and a real curl request through it. Every receipt the tool returns is
//! compared with the exit code `veris receipt` gives for the same arguments.

use crate::support;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Stdio};
use std::sync::mpsc;

use serde_json::{json, Value};
use support::{output, text, veris, Guard, Serve, TempDir, DEADLINE};

/// A `veris mcp` child and the lines it writes to stdout.
pub(crate) struct Mcp {
    process: Guard,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    next_id: u64,
    stderr_file: PathBuf,
    /// Every stdout line, for the secrets check.
    seen: String,
}

impl Mcp {
    fn start(state: &Path, dir: &TempDir) -> Mcp {
        Mcp::start_with(state, dir, &[])
    }

    pub(crate) fn start_with(state: &Path, dir: &TempDir, extra: &[&str]) -> Mcp {
        let stderr_file = dir.join("mcp.stderr");
        let mut cmd = veris(["mcp", "--state-dir"]);
        cmd.arg(state)
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_file).expect("stderr file"));
        let mut process = Guard::spawn(&mut cmd);
        let stdin = process.child().stdin.take();
        let stdout = process.child().stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Mcp {
            process,
            stdin,
            lines,
            next_id: 1,
            stderr_file,
            seen: String::new(),
        }
    }

    fn send_raw(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").expect("writing to veris mcp");
        stdin.flush().expect("flushing to veris mcp");
    }

    fn send(&mut self, message: Value) {
        self.send_raw(&message.to_string());
    }

    /// The next line on stdout: always a JSON-RPC message (stdout is the protocol).
    fn recv(&mut self) -> Value {
        let line = self.lines.recv_timeout(DEADLINE).unwrap_or_else(|e| {
            panic!(
                "no message from veris mcp within {DEADLINE:?} ({e}); stderr:\n{}",
                self.stderr()
            )
        });
        self.seen.push_str(&line);
        self.seen.push('\n');
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"));
        assert_eq!(v["jsonrpc"], "2.0", "{v}");
        v
    }

    /// Sends a request and returns the response with its id (notifications
    /// the server sends meanwhile are skipped).
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let v = self.recv();
            if v["id"] == json!(id) {
                return v;
            }
            assert!(v.get("id").is_none(), "a response to another request: {v}");
        }
    }

    pub(crate) fn initialize(&mut self) -> Value {
        let init = self.request(
            "initialize",
            json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "veris-e2e", "version": "0"}
            }),
        );
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        init
    }

    /// `tools/call`: the result (a JSON-RPC error fails the test).
    pub(crate) fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let v = self.request("tools/call", json!({"name": tool, "arguments": arguments}));
        assert!(v.get("error").is_none(), "{tool}: JSON-RPC error {v}");
        v["result"].clone()
    }

    fn alive(&mut self) {
        let pong = self.request("ping", json!({}));
        assert_eq!(pong["result"], json!({}), "{pong}");
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_file).unwrap_or_default()
    }

    /// Closes stdin: the session ends and the server exits 0.
    pub(crate) fn finish(&mut self) {
        drop(self.stdin.take());
        let status = self
            .process
            .wait_timeout(DEADLINE)
            .unwrap_or_else(|| panic!("veris mcp did not exit at end of input"));
        assert_eq!(status.code(), Some(0), "stderr:\n{}", self.stderr());
    }
}

/// The text blocks of a tool result, joined.
pub(crate) fn text_of(result: &Value) -> String {
    result["content"]
        .as_array()
        .expect("content")
        .iter()
        .map(|c| {
            assert_eq!(c["type"], "text", "{c}");
            c["text"].as_str().unwrap_or_default().to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

pub(crate) fn is_error(result: &Value) -> bool {
    result["isError"].as_bool().unwrap_or(false)
}

/// `veris receipt --state-dir STATE ARGS`: its exit code.
fn cli_receipt(state: &Path, args: &[&str]) -> i32 {
    let mut cmd = veris(["receipt", "--state-dir"]);
    cmd.arg(state).args(args);
    let out = output(&mut cmd);
    out.status
        .code()
        .unwrap_or_else(|| panic!("veris receipt: {:?}", text(&out)))
}

#[test]
fn mcp_tools_report_what_the_receipt_reports() {
    if let Err(why) = support::curl() {
        return support::skip(&why);
    }
    let mut serve = Serve::start("mcp", &[]);
    let mut mcp = Mcp::start(&serve.state, &serve.dir);

    let init = mcp.initialize();
    let info = &init["result"];
    assert_eq!(info["serverInfo"]["name"], "veris", "{init}");
    assert_eq!(
        info["serverInfo"]["version"],
        env!("CARGO_PKG_VERSION"),
        "{init}"
    );
    assert!(info["capabilities"]["tools"].is_object(), "{init}");
    assert_eq!(info["protocolVersion"], "2025-06-18", "{init}");

    let list = mcp.request("tools/list", json!({}));
    let tools = list["result"]["tools"].as_array().expect("tools").clone();
    let mut names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "veris_baseline",
            "veris_check",
            "veris_receipt",
            "veris_run",
            "veris_runs"
        ]
    );
    for t in &tools {
        assert_eq!(t["inputSchema"]["type"], "object", "{t}");
        assert!(!t["description"].as_str().unwrap_or("").is_empty(), "{t}");
        assert_eq!(t["outputSchema"]["type"], "object", "{t}");
        assert_eq!(
            t["outputSchema"]["required"],
            json!(["verdict", "exit_code"]),
            "{t}"
        );
        assert!(t["annotations"].is_object(), "{t}");
    }
    let hint = |name: &str, h: &str| {
        tools.iter().find(|t| t["name"] == name).unwrap()["annotations"][h].clone()
    };
    assert_eq!(hint("veris_baseline", "readOnlyHint"), true);
    assert_eq!(hint("veris_runs", "readOnlyHint"), true);
    assert_eq!(hint("veris_receipt", "idempotentHint"), true);
    assert_eq!(hint("veris_run", "readOnlyHint"), false);
    assert_eq!(hint("veris_run", "destructiveHint"), true);
    let receipt_tool = tools.iter().find(|t| t["name"] == "veris_receipt").unwrap();
    let props = receipt_tool["inputSchema"]["properties"]
        .as_object()
        .expect("veris_receipt properties");
    for p in ["since", "require", "require_verified", "require_request"] {
        assert!(props.contains_key(p), "no {p}: {receipt_tool}");
    }
    // Nothing that picks another ledger, pins a key or skips a check.
    for p in ["ledger", "key", "state_dir"] {
        assert!(!props.contains_key(p), "{p} offered: {receipt_tool}");
    }

    let check = mcp.call("veris_check", json!({}));
    assert!(!is_error(&check), "{check}");
    assert_eq!(check["structuredContent"]["verdict"], "pass", "{check}");
    assert_eq!(check["structuredContent"]["exit_code"], 0, "{check}");
    assert_eq!(check["structuredContent"]["live"], true, "{check}");
    assert!(text_of(&check).contains("veris check: ok"), "{check}");

    let records = || {
        serve
            .ledger_lines()
            .into_iter()
            .filter(|l| l["kind"] != "seal")
            .collect::<Vec<_>>()
    };
    let before = records();
    let base = mcp.call("veris_baseline", json!({}));
    assert_eq!(
        records(),
        before,
        "a baseline records nothing in the ledger"
    );
    assert!(!is_error(&base), "{base}");
    let token = base["structuredContent"]["baseline"]
        .as_str()
        .expect("baseline token")
        .to_string();
    assert!(token.starts_with("vb2:"), "{token}");
    assert!(text_of(&base).contains(&token), "{base}");

    let out = output(serve.curl().args([
        "-f",
        "https://api.stripe.com/v1/charges",
        "-d",
        "amount=2000",
        "-d",
        "currency=usd",
    ]));
    assert!(out.status.success(), "curl: {:?}", text(&out));

    // Each receipt: the tool's verdict and exit code agree with the CLI's.
    let cases: Vec<(Value, Vec<&str>, i32)> = vec![
        (
            json!({"since": token, "require": ["stripe:1"]}),
            vec!["--since", &token, "--require", "stripe:1"],
            0,
        ),
        (
            json!({"since": token, "require": ["stripe:1"], "require_request": ["stripe POST /v1/charges"], "require_verified": true}),
            vec![
                "--since",
                &token,
                "--require",
                "stripe:1",
                "--require-request",
                "stripe POST /v1/charges",
                "--require-verified",
            ],
            0,
        ),
        (
            json!({"since": token, "require": ["stripe:5"]}),
            vec!["--since", &token, "--require", "stripe:5"],
            3,
        ),
        (
            json!({"since": token, "require": ["strpe:1"]}),
            vec!["--since", &token, "--require", "strpe:1"],
            1,
        ),
        (
            json!({"since": "yesterday"}),
            vec!["--since", "yesterday"],
            1,
        ),
    ];
    let mut results = Vec::new();
    for (arguments, cli_args, expected) in &cases {
        let before = records();
        let r = mcp.call("veris_receipt", arguments.clone());
        assert_eq!(
            records(),
            before,
            "a receipt adds nothing but the proxy's own seal"
        );
        let code = r["structuredContent"]["exit_code"]
            .as_i64()
            .expect("exit_code");
        assert_eq!(code, i64::from(*expected), "{arguments}: {r}");
        assert_eq!(is_error(&r), *expected != 0, "{arguments}: {r}");
        assert_eq!(
            cli_receipt(&serve.state, cli_args),
            *expected,
            "veris receipt {cli_args:?} agrees with the tool"
        );
        results.push(r);
    }

    let pass = &results[0];
    let pass_text = text_of(pass);
    assert!(
        pass_text.contains("POST \"/v1/charges\" -> 200"),
        "{pass_text}"
    );
    assert!(pass_text.contains("verdict: pass"), "{pass_text}");
    let s = &pass["structuredContent"];
    assert_eq!(s["verdict"], "pass", "{s}");
    assert_eq!(s["receipt"]["services"]["stripe"]["requests"], 1, "{s}");
    assert!(s["failures"].as_array().unwrap().is_empty(), "{s}");
    assert_eq!(
        results[1]["structuredContent"]["receipt"]["integrity"]["status"],
        "verified"
    );

    let unmet = &results[2];
    assert_eq!(unmet["structuredContent"]["verdict"], "fail", "{unmet}");
    assert!(
        text_of(unmet).contains("FAIL: "),
        "the unmet requirement is named: {unmet}"
    );
    assert!(
        !unmet["structuredContent"]["failures"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{unmet}"
    );

    let typo = text_of(&results[3]);
    assert!(typo.contains("unknown service \"strpe\""), "{typo}");
    for service in ["stripe", "google-calendar", "github"] {
        assert!(typo.contains(service), "the valid names are listed: {typo}");
    }
    let bad_since = text_of(&results[4]);
    assert!(bad_since.contains("bad baseline"), "{bad_since}");
    assert!(bad_since.contains("Next:"), "{bad_since}");

    // An empty window fails, and says why in `failures` too.
    let later = mcp.call("veris_baseline", json!({}));
    let later = later["structuredContent"]["baseline"].as_str().unwrap();
    let empty = mcp.call("veris_receipt", json!({"since": later}));
    assert!(is_error(&empty), "{empty}");
    let failures = empty["structuredContent"]["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{empty}");
    assert!(
        failures[0]
            .as_str()
            .unwrap()
            .contains("never reached its dependency"),
        "{empty}"
    );

    // Arguments that do not exist (here: one that would weaken a check) are
    // refused as invalid params, and the session goes on.
    let v = mcp.request(
        "tools/call",
        json!({"name": "veris_receipt", "arguments": {"skip_integrity": true}}),
    );
    assert!(v["error"].is_object() || is_error(&v["result"]), "{v}");
    mcp.alive();
    for tool in ["veris_check", "veris_baseline"] {
        let v = mcp.request(
            "tools/call",
            json!({"name": tool, "arguments": {"skip_canary": true}}),
        );
        assert!(
            v["error"].is_object() || is_error(&v["result"]),
            "{tool}: {v}"
        );
        mcp.alive();
    }

    // Nothing secret in any result or log line. The seal key exists only
    // in the proxy's memory: no file of it to leak from.
    let token_secret = serve.token();
    let stderr = mcp.stderr();
    for (what, s) in [("stdout", &mcp.seen), ("stderr", &stderr)] {
        assert!(!s.contains(&token_secret), "admin token on {what}");
    }
    assert!(!serve.state.join("seal.key").exists());

    // Once the proxy is gone the same session reads the ledger file alone:
    // `unverified` (the workload shares the proxy's uid and no key is
    // pinned), which fails `require_verified` with exit 3 as the CLI does.
    serve.stop();
    let r = mcp.call(
        "veris_receipt",
        json!({"since": token, "require": ["stripe:1"], "require_verified": true}),
    );
    assert!(is_error(&r), "{r}");
    let s = &r["structuredContent"];
    assert_eq!(s["exit_code"], 3, "{r}");
    assert_eq!(s["verdict"], "fail", "{r}");
    assert_eq!(s["receipt"]["integrity"]["status"], "unverified", "{r}");
    assert_eq!(s["receipt"]["services"]["stripe"]["requests"], 1, "{r}");
    assert!(text_of(&r).contains("FAIL: required verified"), "{r}");
    let cli = [
        "--since",
        &token,
        "--require",
        "stripe:1",
        "--require-verified",
    ];
    assert_eq!(cli_receipt(&serve.state, &cli), 3, "the CLI agrees");
    let check = mcp.call("veris_check", json!({}));
    assert!(is_error(&check), "{check}");
    assert_eq!(check["structuredContent"]["exit_code"], 2, "{check}");
    assert!(text_of(&check).contains("Next:"), "{check}");
    mcp.finish();
}

#[test]
fn mcp_without_a_live_proxy_says_what_to_do_and_survives_garbage() {
    let dir = TempDir::new("mcp-none");
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let mut mcp = Mcp::start(&state, &dir);

    // Before initialize: a line that is not JSON gets a parse error whose id
    // is null (JSON-RPC: it could not be read), a request gets "not
    // initialized", a ping its answer; the session goes on.
    mcp.send_raw("this is not JSON");
    let v = mcp.recv();
    assert_eq!(v["error"]["code"], -32700, "{v}");
    assert!(v.get("id").is_some_and(Value::is_null), "{v}");
    mcp.send(json!({"jsonrpc": "2.0", "id": "early", "method": "tools/list"}));
    let v = mcp.recv();
    assert_eq!(v["id"], "early", "{v}");
    assert_eq!(v["error"]["code"], -32002, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("initialize")),
        "{v}"
    );
    mcp.alive();
    let init = mcp.initialize();
    assert_eq!(init["result"]["serverInfo"]["name"], "veris", "{init}");
    // After it, the same for a cut line.
    mcp.send_raw("{\"jsonrpc\": \"2.0\", \"id\": 99, \"method\": ");
    let v = mcp.recv();
    assert_eq!(v["error"]["code"], -32700, "{v}");
    assert!(v.get("id").is_some_and(Value::is_null), "{v}");
    mcp.alive();
    assert!(
        mcp.stderr().contains("not JSON"),
        "the dropped line is reported on stderr: {}",
        mcp.stderr()
    );
    // JSON that is not a JSON-RPC message is answered as an invalid request.
    mcp.send_raw("{\"hello\": 1}");
    let v = mcp.recv();
    assert_eq!(v["error"]["code"], -32600, "{v}");
    mcp.alive();

    let check = mcp.call("veris_check", json!({}));
    assert!(is_error(&check), "{check}");
    assert_eq!(check["structuredContent"]["exit_code"], 2, "{check}");
    let t = text_of(&check);
    assert!(t.contains("no live veris proxy"), "{t}");
    assert!(t.contains("Next:"), "{t}");

    // A wrong argument name or type: an error result with the structured
    // shape of every other failure, not text alone.
    for (tool, args) in [
        ("veris_receipt", json!({"require": 5})),
        ("veris_receipt", json!({"ledger": "/tmp/forged.jsonl"})),
        ("veris_check", json!({"verbose": true})),
    ] {
        let r = mcp.call(tool, args.clone());
        assert!(is_error(&r), "{tool} {args}: {r}");
        let s = &r["structuredContent"];
        assert_eq!(s["verdict"], "error", "{r}");
        assert_eq!(s["exit_code"], 1, "{r}");
        assert!(
            s["error"].as_str().is_some_and(|e| e.contains("Next:")),
            "{r}"
        );
    }

    for tool in ["veris_receipt", "veris_baseline"] {
        let r = mcp.call(tool, json!({}));
        assert!(is_error(&r), "{tool}: {r}");
        assert_eq!(r["structuredContent"]["verdict"], "error", "{r}");
        assert_eq!(r["structuredContent"]["exit_code"], 1, "{r}");
        let t = text_of(&r);
        assert!(t.contains("Next:"), "{tool}: {t}");
        assert!(t.contains(&state.display().to_string()), "{tool}: {t}");
    }
    assert_eq!(cli_receipt(&state, &[]), 1, "the CLI agrees: exit 1");

    let r = mcp.call(
        "veris_receipt",
        json!({"since": "vb2:0123456789abcdef:1", "all": true}),
    );
    assert!(is_error(&r), "{r}");
    assert!(text_of(&r).contains("exclude each other"), "{r}");
    mcp.finish();
}

/// A workload that can write the state dir can point discovery at a proxy
/// of its own; `veris mcp --key` pins the real proxy's seal key, so a
/// proxy that seals with any other key fails every receipt.
#[test]
fn a_pinned_key_fails_a_proxy_that_seals_with_another() {
    if let Err(why) = support::curl() {
        return support::skip(&why);
    }
    let serve = Serve::start("mcp-pin", &[]);
    let real = serve.ready["key_id"].as_str().expect("key_id").to_string();
    let out = output(
        serve
            .curl()
            .args(["-f", "https://api.stripe.com/v1/customers"]),
    );
    assert!(out.status.success(), "curl: {:?}", text(&out));
    let args = json!({"require": ["stripe:1"], "require_verified": true});
    let receipt = |key: &str| {
        let mut mcp = Mcp::start_with(&serve.state, &serve.dir, &["--key", key]);
        mcp.initialize();
        let r = mcp.call("veris_receipt", args.clone());
        mcp.finish();
        r
    };
    // The real proxy's key: verified, pass.
    let ok = receipt(&real);
    assert!(!is_error(&ok), "{ok}");
    assert_eq!(ok["structuredContent"]["exit_code"], 0, "{ok}");
    // Any other key (as a proxy the workload started would have): a failure,
    // never a pass.
    let other = "ab".repeat(32);
    let bad = receipt(&other);
    assert!(is_error(&bad), "{bad}");
    assert_eq!(bad["structuredContent"]["exit_code"], 3, "{bad}");
    assert_eq!(
        cli_receipt(
            &serve.state,
            &[
                "--require",
                "stripe:1",
                "--require-verified",
                "--key",
                &other
            ]
        ),
        3
    );
    // A malformed pin is refused when the server starts.
    let mut cmd = veris(["mcp", "--state-dir"]);
    cmd.arg(&serve.state)
        .args(["--key", "not-a-key"])
        .stdin(Stdio::null());
    let out = output(&mut cmd);
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
}

/// `veris_run` runs a command under `veris run` inside the server and
/// returns its live receipt, `verified`; `veris_runs` lists that run, and
/// `veris_receipt` (by default the newest run, or by id) reads it back from
/// its file: `unverified`, saying why. No path reaches a tool; an id that
/// climbs out is refused.
#[test]
fn mcp_runs_a_command_and_reads_its_runs() {
    if let Err(why) = support::curl() {
        return support::skip(&why);
    }
    let dir = TempDir::new("mcp-run");
    let state = dir.join("state");
    let mut mcp = Mcp::start(&state, &dir);
    mcp.initialize();
    let list = mcp.request("tools/list", json!({}));
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    for tool in ["veris_run", "veris_runs"] {
        assert!(names.contains(&tool), "{names:?}");
    }

    // Nothing yet: the listing says what to do.
    let runs = mcp.call("veris_runs", json!({}));
    assert!(!is_error(&runs), "{runs}");
    assert!(text_of(&runs).contains("holds no run"), "{runs}");

    let run = mcp.call(
        "veris_run",
        json!({
            "command": ["curl", "-sS", "--max-time", "20", "https://api.stripe.com/v1/charges", "-d", "amount=100"],
            "require": ["stripe:1"],
            "require_verified": true,
            "timeout_secs": 120,
        }),
    );
    let s = &run["structuredContent"];
    assert!(!is_error(&run), "{run}");
    assert_eq!(s["verdict"], "pass", "{run}");
    assert_eq!(s["exit_code"], 0, "{run}");
    assert_eq!(s["receipt"]["integrity"]["status"], "verified", "{run}");
    assert_eq!(s["receipt"]["services"]["stripe"]["requests"], 1, "{run}");
    assert!(text_of(&run).contains("integrity: verified"), "{run}");
    // The command's own output is returned as its output.
    assert!(
        s["output"]["stdout_tail"]
            .as_str()
            .unwrap()
            .contains("charge"),
        "{run}"
    );

    let runs = mcp.call("veris_runs", json!({}));
    let listed = runs["structuredContent"]["runs"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(listed.len(), 1, "{runs}");
    let id = listed[0]["id"].as_str().unwrap().to_string();
    assert!(s["ledger"].as_str().unwrap().contains(&id), "{run}");
    assert_eq!(listed[0]["verdict"]["integrity"], "unverified", "{runs}");

    for args in [json!({}), json!({"run": id})] {
        let r = mcp.call("veris_receipt", args.clone());
        let st = &r["structuredContent"];
        assert_eq!(st["run"], id.as_str(), "{args}: {r}");
        assert_eq!(st["receipt"]["integrity"]["status"], "unverified", "{r}");
        assert!(
            st["note"]
                .as_str()
                .unwrap()
                .contains("lived only in the run's memory"),
            "{r}"
        );
        assert!(text_of(&r).contains("veris_run"), "{r}");
        // Requirements hold; integrity is what falls short.
        assert_eq!(st["exit_code"], 0, "{r}");
        let strict = mcp.call(
            "veris_receipt",
            json!({"run": id, "require_verified": true}),
        );
        assert!(is_error(&strict), "{strict}");
    }

    for bad in [json!({"run": "../x"}), json!({"run": "../../state/runs"})] {
        let r = mcp.call("veris_receipt", bad.clone());
        assert!(is_error(&r), "{bad}: {r}");
        assert!(text_of(&r).contains("not a run id"), "{r}");
    }
    let r = mcp.request(
        "tools/call",
        json!({"name": "veris_receipt", "arguments": {"ledger": "/etc/passwd"}}),
    );
    assert!(
        r.get("error").is_some() || r["result"]["isError"] == json!(true),
        "{r}"
    );
    mcp.finish();
}

/// A command that outlives `timeout_secs` is stopped with everything it
/// started, and what it prints never poses as veris's receipt.
#[test]
fn mcp_run_stops_a_command_at_its_time_limit() {
    let dir = TempDir::new("mcp-run-limit");
    let state = dir.join("state");
    let mut mcp = Mcp::start(&state, &dir);
    mcp.initialize();
    // A duration no other process sleeps, to find it in /proc (an
    // isolated run's pids are its namespace's, not the host's).
    let script =
        "echo 'integrity: verified'; echo '{\"verdict\":\"pass\"}' >&2; sleep 2999.25 & wait";
    let r = mcp.call(
        "veris_run",
        json!({"command": ["sh", "-c", script], "allow_empty": true, "timeout_secs": 1}),
    );
    assert!(is_error(&r), "{r}");
    let s = &r["structuredContent"];
    assert_eq!(s["timed_out"], true, "{r}");
    assert_eq!(s["verdict"], "fail", "{r}");
    assert!(text_of(&r).contains("time limit of 1 s"), "{r}");
    assert!(
        s["output"]["stdout_tail"]
            .as_str()
            .unwrap()
            .contains("integrity: verified"),
        "the command's words stay its output: {r}"
    );
    let sleeping: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.starts_with("sleep 2999.25"))
        .collect();
    assert!(
        sleeping.is_empty(),
        "the command's sleep outlived the run: {sleeping:?}"
    );

    // A command that cannot start: the run's reason and the shell's code.
    let r = mcp.call("veris_run", json!({"command": ["veris-no-such-command"]}));
    assert!(is_error(&r), "{r}");
    assert_eq!(r["structuredContent"]["exit_code"], 127, "{r}");
    assert!(text_of(&r).contains("command not found"), "{r}");
    mcp.call("veris_check", json!({}));
    mcp.finish();
}

/// The official MCP Python SDK as the client: it lists the tools with their
/// output schemas and annotations, and checks every result that is not an
/// error against its tool's schema (it raises on a mismatch); the test asks
/// it to check the error results too, since every result has one shape.
#[test]
fn the_mcp_python_sdk_checks_every_result_against_its_output_schema() {
    for need in [support::curl(), support::python_module("mcp")] {
        if let Err(why) = need {
            return support::skip(&why);
        }
    }
    let serve = Serve::start("mcp-sdk", &[]);
    let out = output(serve.curl().args([
        "-f",
        "https://api.stripe.com/v1/charges",
        "-d",
        "amount=2000",
        "-d",
        "currency=usd",
    ]));
    assert!(out.status.success(), "curl: {:?}", text(&out));
    let script = r#"
import asyncio, json, sys
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

def field(o, snake, camel):
    # The SDK's 2.x names are snake_case, 1.x's camelCase.
    return getattr(o, snake, getattr(o, camel, None))

async def main():
    params = StdioServerParameters(command=sys.argv[1], args=["mcp", "--state-dir", sys.argv[2]])
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            tools = {t.name: t for t in (await s.list_tools()).tools}
            out = {"tools": {n: {"output_schema": field(t, "output_schema", "outputSchema") is not None,
                                 "read_only": field(t.annotations, "read_only_hint", "readOnlyHint")}
                             for n, t in tools.items()}}
            calls = [("veris_check", {}), ("veris_baseline", {}), ("veris_runs", {}),
                     ("veris_receipt", {"require": ["stripe:1"]}),
                     ("veris_receipt", {"require": ["stripe:5"]}),
                     ("veris_receipt", {"require": 5})]
            out["calls"] = []
            for name, args in calls:
                res = await s.call_tool(name, args)
                # The SDK checked a result that is not an error; check errors too.
                await s.validate_tool_result(name, res)
                out["calls"].append({"tool": name, "error": bool(field(res, "is_error", "isError")),
                                     "verdict": field(res, "structured_content", "structuredContent")["verdict"]})
            print(json.dumps(out))

asyncio.run(main())
"#;
    let mut cmd = support::command("python3");
    cmd.arg("-c")
        .arg(script)
        .arg(support::bin())
        .arg(&serve.state);
    for var in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "HTTPS_PROXY",
        "HTTP_PROXY",
    ] {
        cmd.env_remove(var);
    }
    let out = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "the SDK client failed:\n{stdout}\n{stderr}"
    );
    let v: Value = serde_json::from_str(stdout.trim()).expect("the script's JSON");
    for (name, t) in v["tools"].as_object().expect("tools") {
        assert_eq!(t["output_schema"], true, "{name}: {v}");
    }
    assert_eq!(v["tools"]["veris_baseline"]["read_only"], true, "{v}");
    let calls: Vec<(String, bool, String)> = v["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["tool"].as_str().unwrap().to_string(),
                c["error"].as_bool().unwrap(),
                c["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expect = [
        ("veris_check", false, "pass"),
        ("veris_baseline", false, "pass"),
        ("veris_runs", false, "pass"),
        ("veris_receipt", false, "pass"),
        ("veris_receipt", true, "fail"),
        ("veris_receipt", true, "error"),
    ];
    let expect: Vec<(String, bool, String)> = expect
        .iter()
        .map(|(t, e, v)| (t.to_string(), *e, v.to_string()))
        .collect();
    assert_eq!(calls, expect, "{v}");
}
