//! Receipt integrity end to end: seals and tampering, the admin API and its
//! token, the event stream's resume, `veris check`, baselines, the twin
//! cross-check, and a full run that reports `integrity: verified`.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::fake_twin::FakeTwin;
use support::{
    assert_verified_with_its_key, bin, command, http, json, output, skip, text, tool_works, veris,
    Serve, TempDir, DEADLINE,
};
use veris_receipt::ledger::line_hash;

/// Rewrites `prev` of every line after `from` (0-based) so the chain holds
/// again after an edit: what a forger without the seal key can do.
fn rechain(lines: &mut [String], from: usize) {
    for i in from + 1..lines.len() {
        let prev = line_hash(lines[i - 1].as_bytes());
        let at = lines[i].rfind(",\"prev\":\"").unwrap();
        lines[i] = format!("{},\"prev\":\"{prev}\"}}", &lines[i][..at]);
    }
}

#[test]
fn admin_api_needs_its_token_and_announces_itself() {
    let mut serve = Serve::start("admin", &[]);
    let state = serve.state.clone();
    let token = serve.token();
    assert_eq!(token.len(), 64);
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(state.join("admin.token"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // The seal key lives only in the proxy's memory; its public half is
    // listed beside the ledger.
    assert!(!state.join("seal.key").exists());
    assert!(state.join("ledger.pub").exists());
    let announced = std::fs::read_to_string(state.join("admin.addr")).unwrap();
    assert_eq!(announced.trim(), serve.admin().to_string());

    let admin = serve.admin();
    let (status, body) = http(admin, "GET", "/healthz", "127.0.0.1", "", "");
    assert_eq!((status, json(&body)["status"].as_str()), (200, Some("ok")));
    for path in ["/status", "/ledger", "/receipt", "/events"] {
        assert_eq!(http(admin, "GET", path, "x", "", "").0, 401, "{path}");
        let wrong = format!("Authorization: Bearer {}\r\n", "0".repeat(64));
        assert_eq!(http(admin, "GET", path, "x", &wrong, "").0, 401, "{path}");
    }
    assert_eq!(http(admin, "POST", "/seal", "x", "", "").0, 401);
    let lines_before = serve.ledger_lines().len();
    assert_eq!(
        serve.ledger_lines().len(),
        lines_before,
        "a refused seal wrote nothing"
    );

    let (status, body) = serve.admin_call("GET", "/status");
    assert_eq!(status, 200, "{body}");
    let st = json(&body);
    assert_eq!(st["veris_proxy"], true);
    assert!(st["canary"].as_str().unwrap().starts_with("cnry_"));
    assert_eq!(st["tier"], "explicit");
    assert_eq!(st["sandbox_id"], "sbx_local");

    assert_eq!(serve.vendor("GET", "api.stripe.com", "/v1/customers"), 200);
    let (status, body) = serve.admin_call("POST", "/seal");
    assert_eq!(status, 200, "{body}");
    let seal = json(&body);
    let seq = seal["seq"].as_u64().unwrap();
    let line = serve.ledger_lines()[seq as usize - 1].clone();
    assert_eq!(line["kind"], "seal");
    assert_eq!(line["reason"], "demand");
    assert_eq!(line["sealed_seq"].as_u64(), Some(seq - 1));
    assert_eq!(line["signature"], seal["signature"]);

    let (status, body) = serve.admin_call("GET", "/ledger?since=0");
    assert_eq!(status, 200);
    let file = std::fs::read_to_string(serve.ledger()).unwrap();
    assert!(
        file.starts_with(&body),
        "the JSONL answer is the file's lines"
    );
    let (_, body) = serve.admin_call("GET", &format!("/ledger?since={}", seq - 1));
    assert_eq!(
        json(body.lines().next().unwrap())["seq"].as_u64(),
        Some(seq)
    );

    let (status, body) = serve.admin_call("GET", "/receipt?since=0");
    assert_eq!(status, 200, "{body}");
    let r = json(&body);
    assert_eq!(r["services"]["stripe"]["requests"], 1);
    assert_eq!(r["integrity"]["status"], "verified", "{body}");
    // Polling the receipt of an idle proxy reuses the head seal.
    let lines = serve.ledger_lines().len();
    for _ in 0..3 {
        assert_eq!(serve.admin_call("GET", "/receipt").0, 200);
    }
    assert_eq!(serve.ledger_lines().len(), lines, "an idle ledger grew");

    serve.stop();
    assert!(!state.join("admin.addr").exists());
    assert!(!state.join("admin.token").exists());
    let last = serve.ledger_lines().pop().unwrap();
    assert_eq!(
        (last["kind"].as_str(), last["reason"].as_str()),
        (Some("seal"), Some("shutdown"))
    );
}

#[test]
fn a_sealed_line_edited_and_rechained_fails_the_receipt() {
    let mut serve = Serve::start_same_uid("tamper", &[]);
    assert_eq!(serve.vendor("POST", "api.stripe.com", "/v1/charges"), 200);
    assert_eq!(serve.vendor("GET", "api.stripe.com", "/v1/customers"), 200);
    serve.stop();
    let state = serve.state.clone();
    let receipt = |dir: &std::path::Path| output(veris(["receipt", "--state-dir"]).arg(dir));

    // Untouched, read without the proxy: sealed, but ledger.pub is only a hint.
    let out = receipt(&state);
    let (stdout, _) = text(&out);
    assert!(
        stdout.contains("integrity: unverified (the seals match ledger.pub"),
        "{stdout}"
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    // Pinning the key the session used makes it verified: the key never left
    // the proxy's memory, whatever uid the workload had.
    assert_verified_with_its_key(&state);

    let file = std::fs::read_to_string(serve.ledger()).unwrap();
    let mut lines: Vec<String> = file.lines().map(str::to_string).collect();
    let i = lines
        .iter()
        .position(|l| l.contains("\"path\":\"/v1/charges\""))
        .unwrap();
    lines[i] = lines[i].replace("\"status\":200", "\"status\":402");
    rechain(&mut lines, i);
    std::fs::write(serve.ledger(), lines.join("\n") + "\n").unwrap();
    let out = receipt(&state);
    let (stdout, _) = text(&out);
    assert!(
        stdout.contains("integrity: failed (seal at seq")
            && stdout.contains("signature does not verify"),
        "{stdout}"
    );
    assert_eq!(out.status.code(), Some(3), "{stdout}");

    // Without rechaining, the chain itself names the line.
    let mut lines: Vec<String> = file.lines().map(str::to_string).collect();
    lines[i] = lines[i].replace("\"status\":200", "\"status\":402");
    std::fs::write(serve.ledger(), lines.join("\n") + "\n").unwrap();
    let out = receipt(&state);
    assert!(text(&out).0.contains("integrity: failed (chain broken"));
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn cutting_the_tail_after_a_seal_is_caught_by_the_live_proxy_fresh_seal() {
    let serve = Serve::start("cut", &[]);
    assert_eq!(serve.vendor("GET", "api.stripe.com", "/v1/customers"), 200);
    let (_, body) = serve.admin_call("POST", "/seal");
    let kept = json(&body)["seq"].as_u64().unwrap();
    assert_eq!(serve.vendor("POST", "api.stripe.com", "/v1/charges"), 200);
    // Seal again so the proxy's interval timer has nothing left to seal.
    serve.admin_call("POST", "/seal");
    let file = std::fs::read_to_string(serve.ledger()).unwrap();
    let cut: String = file
        .lines()
        .take(kept as usize)
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(cut.len() < file.len());
    std::fs::write(serve.ledger(), &cut).unwrap();

    // The file alone ends on a valid seal, but not on the session's final one.
    let out = output(veris(["receipt", "--ledger"]).arg(serve.ledger()));
    let (stdout, _) = text(&out);
    assert!(
        stdout.contains("integrity: unverified (no final seal"),
        "{stdout}"
    );
    assert!(!stdout.contains("/v1/charges"), "{stdout}");
    let out = output(veris(["receipt", "--require-verified", "--ledger"]).arg(serve.ledger()));
    assert_eq!(out.status.code(), Some(3));

    // The live proxy notices its file was cut, and its fresh seal follows
    // its real head, not the file's.
    let out = output(veris(["receipt", "--state-dir"]).arg(&serve.state));
    let (stdout, _) = text(&out);
    assert!(stdout.contains("integrity: failed ("), "{stdout}");
    assert_eq!(out.status.code(), Some(3), "{stdout}");
    let out = output(veris(["receipt", "--json", "--state-dir"]).arg(&serve.state));
    let r = json(&text(&out).0);
    let tamper = r["integrity"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "tamper")
        .cloned()
        .unwrap_or_default();
    assert_eq!(tamper["status"], "failed", "{r}");
    assert!(tamper["detail"].as_str().unwrap().contains("cut"), "{r}");
}

/// Reads SSE events from a `/events` stream until one with `id >= until`.
fn read_events(serve: &Serve, last_id: Option<u64>, until: u64) -> Vec<(u64, String)> {
    read_events_poking(serve, last_id, until, || {})
}

/// [`read_events`], calling `poke` whenever the stream is quiet (to make
/// the proxy write a line a stream that only shows new lines will see).
fn read_events_poking(
    serve: &Serve,
    last_id: Option<u64>,
    until: u64,
    mut poke: impl FnMut(),
) -> Vec<(u64, String)> {
    let mut s = TcpStream::connect(serve.admin()).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let resume = last_id
        .map(|id| format!("Last-Event-ID: {id}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET /events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n{resume}\r\n",
        serve.token()
    )
    .unwrap();
    let mut raw = String::new();
    let start = Instant::now();
    let mut events = Vec::new();
    while start.elapsed() < DEADLINE {
        let mut buf = [0u8; 8192];
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(_) => poke(),
        }
        events.clear();
        let mut id = None;
        for line in raw.lines() {
            if let Some(v) = line.strip_prefix("id: ") {
                id = v.trim().parse::<u64>().ok();
            } else if let (Some(v), Some(i)) = (line.strip_prefix("data: "), id) {
                events.push((i, v.to_string()));
                id = None;
            }
        }
        if events.last().is_some_and(|(i, _)| *i >= until) {
            return events;
        }
    }
    panic!("no event {until} within {DEADLINE:?}: {raw}");
}

#[test]
fn events_resume_with_last_event_id_without_loss_or_duplication() {
    let serve = Serve::start("events", &[]);
    for _ in 0..2 {
        assert_eq!(serve.vendor("GET", "api.stripe.com", "/v1/customers"), 200);
    }
    let (_, body) = serve.admin_call("POST", "/seal");
    let first_target = json(&body)["seq"].as_u64().unwrap();
    let first = read_events(&serve, Some(0), first_target);
    let last_seen = first.last().unwrap().0;

    // Traffic while no one listens.
    for p in ["/v1/charges", "/v1/customers", "/v1/customers"] {
        assert_eq!(serve.vendor("POST", "api.stripe.com", p), 200);
    }
    let (_, body) = serve.admin_call("POST", "/seal");
    let target = json(&body)["seq"].as_u64().unwrap();
    let second = read_events(&serve, Some(last_seen), target);

    let mut all = first.clone();
    all.extend(second.iter().cloned());
    let ids: Vec<u64> = all.iter().map(|(i, _)| *i).collect();
    let expected: Vec<u64> = (1..=ids[ids.len() - 1]).collect();
    assert_eq!(ids, expected, "events lost or duplicated");
    assert_eq!(second[0].0, last_seen + 1);
    let file = std::fs::read_to_string(serve.ledger()).unwrap();
    let lines: Vec<&str> = file.lines().collect();
    for (id, data) in &all {
        assert_eq!(
            lines[*id as usize - 1],
            data,
            "event {id} is not the ledger line"
        );
    }

    // Without Last-Event-ID the stream starts with new lines only.
    let (_, body) = serve.admin_call("GET", "/status");
    let head = json(&body)["head_seq"].as_u64().unwrap();
    let live = read_events_poking(&serve, None, head + 1, || {
        serve.admin_call("POST", "/seal");
    });
    assert!(
        !live.is_empty() && live.iter().all(|(i, _)| *i > head),
        "{live:?}"
    );
}

/// A listener at the proxy URL that answers the canary with an endless
/// body (here 64 MiB, then it stops): `veris check` refuses it after a
/// small bound instead of holding whatever arrives before its timeout.
#[test]
fn check_refuses_an_endless_canary_answer() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut head = [0u8; 4096];
        let _ = conn.read(&mut head);
        let _ = conn.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"veris_proxy\":true,",
        );
        let block = vec![b' '; 1 << 20];
        for _ in 0..64 {
            if conn.write_all(&block).is_err() {
                break;
            }
        }
    });
    let url = format!("http://{addr}");
    let out = output(&mut veris([
        "check",
        "--timeout",
        "20s",
        "--proxy",
        &url,
        "--any-run",
    ]));
    let (o, e) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{o}{e}");
    assert!(
        e.contains("over 65536 bytes") || o.contains("over 65536 bytes"),
        "{o}{e}"
    );
    server.join().unwrap();
}

#[test]
fn check_exit_codes() {
    let check = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = veris(["check", "--timeout", "3s"]);
        cmd.args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = output(&mut cmd);
        let (o, e) = text(&out);
        (out.status.code(), format!("{o}{e}"))
    };
    // Unreachable: a port nobody listens on.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let url = format!("http://{closed}");
    let (code, out) = check(&["--proxy", &url, "--expect-canary", "cnry_x"], &[]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("no proxy answered"), "{out}");
    // The transparent probe with no redirect in place.
    let probe = closed.to_string();
    let (code, out) = check(&["--transparent", "--probe-addr", &probe, "--any-run"], &[]);
    assert_eq!(code, Some(2), "{out}");

    // Something answers, but it is not veris.
    let other = FakeTwin::start(0);
    let (code, out) = check(&["--proxy", &other.url(), "--any-run"], &[]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("not a veris canary"), "{out}");

    let serve = Serve::start("check", &[]);
    let proxy = serve.proxy_url.clone();
    let (_, body) = serve.admin_call("GET", "/status");
    let canary = json(&body)["canary"].as_str().unwrap().to_string();
    // Another run's proxy.
    let (code, out) = check(&["--proxy", &proxy, "--expect-canary", "cnry_0000"], &[]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("another run"), "{out}");
    // Ours, by flags and by the env file's variables.
    let (code, out) = check(&["--proxy", &proxy, "--expect-canary", &canary], &[]);
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = check(
        &[],
        &[("VERIS_PROXY_URL", &proxy), ("VERIS_CANARY", &canary)],
    );
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = check(&["--proxy", &proxy, "--any-run"], &[]);
    assert_eq!(code, Some(0), "{out}");
    // Nothing to compare with (no canary, no --any-run): no run to check,
    // which fails the check like a missing proxy (exit 2), as a bare
    // `veris check` outside any run does.
    let (code, out) = check(&["--proxy", &proxy], &[]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("no run to check"), "{out}");
    let (code, out) = check(&[], &[]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("no run to check"), "{out}");

    // A receipt read in another run's environment fails its canary check.
    let out = output(
        veris(["receipt", "--allow-empty", "--state-dir"])
            .arg(&serve.state)
            .env("VERIS_CANARY", "cnry_0000"),
    );
    let (stdout, _) = text(&out);
    assert!(
        stdout.contains("integrity: failed (the live proxy's canary"),
        "{stdout}"
    );
    assert_eq!(out.status.code(), Some(3));
    let out = output(
        veris(["receipt", "--allow-empty", "--state-dir"])
            .arg(&serve.state)
            .env("VERIS_CANARY", &canary),
    );
    assert!(
        text(&out).0.contains("integrity: verified"),
        "{}",
        text(&out).0
    );
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn baseline_then_since_reports_exactly_the_window_after_it() {
    let mut serve = Serve::start("baseline", &[]);
    assert_eq!(
        serve.vendor("GET", "api.stripe.com", "/v1/customers/cus_before1"),
        404
    );
    assert_eq!(
        serve.vendor("GET", "api.stripe.com", "/v1/customers/cus_before2"),
        404
    );
    let out = output(veris(["baseline", "--state-dir"]).arg(&serve.state));
    assert_eq!(out.status.code(), Some(0));
    let token = text(&out).0.trim().to_string();
    assert!(token.starts_with("vb2:"), "{token}");
    let after = [
        "/v1/customers/cus_a",
        "/v1/customers/cus_b",
        "/v1/customers/cus_c",
    ];
    for p in after {
        serve.vendor("GET", "api.stripe.com", p);
    }
    let paths = |out: &std::process::Output| {
        let r = json(&text(out).0);
        let entries = r["services"]["stripe"]["entries"]
            .as_array()
            .unwrap()
            .clone();
        let paths: Vec<String> = entries
            .iter()
            .map(|e| e["path"].as_str().unwrap().to_string())
            .collect();
        (r, paths)
    };
    let out =
        output(veris(["receipt", "--json", "--since", &token, "--state-dir"]).arg(&serve.state));
    let (r, got) = paths(&out);
    assert_eq!(got, after);
    assert_eq!(r["services"]["stripe"]["requests"], 3);
    assert_eq!(r["integrity"]["status"], "verified", "{r}");
    let seq: u64 = token.split(':').nth(2).unwrap().parse().unwrap();
    assert_eq!(r["window"]["since_seq"].as_u64(), Some(seq));

    serve.stop();
    let out =
        output(veris(["receipt", "--json", "--since", &token, "--state-dir"]).arg(&serve.state));
    assert_eq!(paths(&out).1, after, "the same window from the file alone");
    let out = output(veris(["receipt", "--since", "vb1:x", "--state-dir"]).arg(&serve.state));
    assert_eq!(out.status.code(), Some(1));
    // A token is bound to its ledger: one from another state dir is refused.
    let other = Serve::start("baseline-other", &[]);
    let out = output(veris(["receipt", "--since", &token, "--state-dir"]).arg(&other.state));
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("taken on another ledger"), "{stderr}");
}

#[test]
fn twin_cross_check_fails_when_the_twin_never_saw_a_forwarded_request() {
    for (hide, expect) in [
        (0, "integrity: verified"),
        (1, "integrity: failed (the twin's log for stripe lacks"),
    ] {
        let twin = FakeTwin::start(hide);
        let url = twin.url();
        let serve = Serve::start(
            "cross",
            &[
                "--twin",
                &url,
                "--sandbox",
                "sbx_cross",
                "--services",
                "stripe",
            ],
        );
        assert_eq!(serve.vendor("POST", "api.stripe.com", "/v1/charges"), 200);
        assert_eq!(serve.vendor("GET", "api.stripe.com", "/v1/charges"), 200);
        let out = output(veris(["receipt", "--state-dir"]).arg(&serve.state));
        let (stdout, _) = text(&out);
        assert!(stdout.contains(expect), "hide {hide}: {stdout}");
        assert_eq!(
            out.status.code(),
            Some(if hide == 0 { 0 } else { 3 }),
            "{stdout}"
        );
    }
}

#[test]
fn a_full_run_with_curl_is_verified() {
    if !tool_works("curl", &["--version"]) {
        return skip("curl is not installed");
    }
    let dir = TempDir::new("run");
    let out = output(veris(["run", "--state-dir"]).arg(dir.path()).args([
        "--require-request",
        "stripe POST /v1/customers",
        "--",
        "curl",
        "-sS",
        "-f",
        "-o",
        "/dev/null",
        "https://api.stripe.com/v1/customers",
        "-d",
        "email=ada@example.com",
    ]));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stderr.contains("integrity: verified"), "{stderr}");
    assert!(stderr.contains("POST \"/v1/customers\" -> 200"), "{stderr}");
}

#[test]
fn the_demo_is_verified() {
    let out = output(&mut veris(["demo"]));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("integrity: verified"), "{stdout}");
}

/// The transparent tier in a network namespace this test creates (`unshare
/// -rn`, no route off the machine): a TEST-NET address on the loopback, an
/// nft rule that redirects its port 443 to the proxy's TLS listener, then a
/// real client, `veris check --transparent` and a live receipt.
const NAMESPACE_SCRIPT: &str = r#"
set -e
V=$1; D=$2
ip link set lo up
ip addr add 203.0.113.1/32 dev lo
"$V" serve --state-dir "$D/state" --listen 127.0.0.1:0 --transparent \
  --https-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --ready-file "$D/ready.json" \
  > "$D/serve.log" 2>&1 &
SP=$!
trap 'kill $SP 2>/dev/null || true' EXIT
for i in $(seq 200); do [ -s "$D/ready.json" ] && break; sleep 0.05; done
PORT=$(sed -e 's/.*"https_listen":"127.0.0.1:\([0-9]*\)".*/\1/' "$D/ready.json")
nft -f - <<NFT
table ip veris_test {
  chain out {
    type nat hook output priority -100;
    ip daddr 203.0.113.0/24 tcp dport 443 redirect to :$PORT
  }
}
NFT
curl -sS -f -o /dev/null --noproxy '*' --resolve api.stripe.com:443:203.0.113.1 \
  --cacert "$D/state/trust/ca.pem" -d email=ada@example.com https://api.stripe.com/v1/customers
echo "curl=$?"
set +e
"$V" check --transparent --timeout 5s --any-run; echo "check=$?"
"$V" receipt --state-dir "$D/state"; echo "receipt=$?"
"$V" check --transparent --timeout 5s --expect-canary cnry_0000; echo "other=$?"
"#;

#[test]
fn the_transparent_canary_answers_only_through_the_redirect() {
    let tools = ["unshare", "nft", "ip", "curl"];
    for tool in tools {
        let found = command("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return skip(&format!("{tool} is not installed"));
        }
    }
    let probe = output(command("unshare").args(["-rn", "true"]));
    if !probe.status.success() {
        return skip("cannot create a network namespace (unshare -rn)");
    }
    let dir = TempDir::new("transparent");
    let mut cmd = command("unshare");
    cmd.env("HOME", dir.path())
        .args(["-rn", "sh", "-c", NAMESPACE_SCRIPT, "sh"])
        .arg(bin())
        .arg(dir.path());
    let out = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    let log = std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default();
    let all = format!("{stdout}{stderr}\n--- serve log:\n{log}");
    assert!(stdout.contains("curl=0"), "{all}");
    assert!(stdout.contains("check=0"), "{all}");
    // Everything here runs as root in the namespace and serve was told no
    // workload uid: the workload could stand in for the live proxy, so the
    // canary and cross-check pass and the live verdict still stops short.
    assert!(
        stdout.contains(
            "interception: transparent   integrity: unverified (workload may share the proxy uid"
        ),
        "{all}"
    );
    assert!(stdout.contains("POST \"/v1/customers\" -> 200"), "{all}");
    assert!(stdout.contains("receipt=0"), "{all}");
    assert!(stdout.contains("other=2"), "{all}");
}

/// E1: a SIGTERM that arrives the moment the ready file exists ends the
/// session cleanly (final seal, admin files removed), never by the default
/// action. Ten starts, each signalled as soon as its ready file appears.
#[test]
fn a_sigterm_right_after_the_ready_file_ends_the_session_cleanly() {
    for i in 0..10 {
        let dir = support::TempDir::new(&format!("term-{i}"));
        let state = dir.join("state");
        let ready = dir.join("ready.json");
        let mut proxy = support::Guard::spawn(
            veris(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
                .arg(&state)
                .arg("--ready-file")
                .arg(&ready)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null()),
        );
        let start = Instant::now();
        while !ready.exists() {
            assert!(start.elapsed() < support::DEADLINE, "no ready file");
            std::thread::sleep(Duration::from_micros(200));
        }
        proxy.signal("TERM");
        let status = proxy
            .wait_timeout(support::DEADLINE)
            .expect("serve did not stop on SIGTERM");
        assert_eq!(status.code(), Some(0), "try {i}: {status:?}");
        assert!(!state.join("admin.addr").exists(), "try {i}");
        let ledger = std::fs::read_to_string(state.join("ledger.jsonl")).unwrap();
        let last: serde_json::Value = serde_json::from_str(ledger.lines().last().unwrap()).unwrap();
        assert_eq!(last["reason"], "shutdown", "try {i}: {ledger}");
    }
}
