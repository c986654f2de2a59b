//! A gateway sandbox's own limits (DESIGN §13, issue G1): requests a
//! second, bytes a second and connections open, so that one sandbox cannot
//! starve the others. Each hit is a `blocked` line in that sandbox's own
//! ledger, at most one a second per limit, with a count — an ordinary line
//! of its chain, so the receipt still verifies.
//!
//! Each test's attack: a sandbox that floods the gateway with requests, one
//! that pulls bytes as fast as it can, one that opens keep-alive HTTP proxy
//! connections past its cap (the HTTP proxy path once counted none), and a
//! connection that switches sandboxes between requests to spend another's
//! limits.

use serde_json::Value;

use crate::support::gateway::*;
use crate::support::{self, command, skip, text, wait_for, DEADLINE};

/// `add-sandbox ID --services stripe EXTRA…`.
fn add(gw: &Gateway, id: &str, extra: &[&str]) -> Sandbox {
    let mut args = vec![id, "--services", "stripe"];
    args.extend_from_slice(extra);
    let out = gw.admin_command("add-sandbox", &args);
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "add-sandbox {id} {extra:?}: {stdout}{stderr}"
    );
    Sandbox::from_url(id, stdout.lines().last().unwrap_or_default().trim())
}

/// The reasons of a ledger's `blocked` lines that contain `words`.
fn limit_lines(lines: &[Value], words: &str) -> Vec<(String, String)> {
    lines
        .iter()
        .filter(|l| l["kind"] == "blocked")
        .filter_map(|l| {
            let reason = l["reason"].as_str()?;
            reason.contains(words).then(|| {
                (
                    l["ts"].as_str().unwrap_or_default().to_string(),
                    reason.to_string(),
                )
            })
        })
        .collect()
}

/// The count a limit line carries: the number opening its last `(…)`.
fn count(reason: &str) -> u64 {
    reason
        .rsplit_once('(')
        .and_then(|(_, rest)| rest.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no count in {reason:?}"))
}

/// Milliseconds since the epoch of an RFC 3339 `ts` with milliseconds
/// (`2026-01-02T03:04:05.678Z`), enough to compare lines of one run.
fn millis(ts: &str) -> i64 {
    let time = ts.split('T').nth(1).unwrap_or_default();
    let time = time.trim_end_matches('Z');
    let mut parts = time.split(':');
    let h: i64 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let m: i64 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let s: f64 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0.0);
    let day: i64 = ts
        .get(8..10)
        .and_then(|d| d.parse().ok())
        .unwrap_or_default();
    (((day * 24 + h) * 60 + m) * 60) * 1000 + (s * 1000.0).round() as i64
}

/// Sends absolute-form `POST http://api.stripe.com/v1/charges` requests
/// through the gateway (argv: host port user password seconds) on one
/// keep-alive connection (a new one only if the gateway closed it), for
/// `seconds` or 4000 requests; prints `{"ok","limited","other","bad_429"}`
/// where `bad_429` counts 429s without a `Retry-After` of whole seconds or
/// the JSON error `veris_rate_limited`.
const BURST_PY: &str = r#"
import base64, http.client, json, sys, time
host, port, user, password, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5])
auth = "Basic " + base64.b64encode(("%s:%s" % (user, password)).encode()).decode()
headers = {"Host": "api.stripe.com", "Proxy-Authorization": auth,
           "Content-Type": "application/x-www-form-urlencoded"}
counts = {"ok": 0, "limited": 0, "other": [], "bad_429": 0}
conn = None
end = time.time() + seconds
for _ in range(4000):
    if time.time() >= end:
        break
    if conn is None:
        conn = http.client.HTTPConnection(host, port, timeout=15)
    try:
        conn.request("POST", "http://api.stripe.com/v1/charges", body="amount=100&currency=usd", headers=headers)
        r = conn.getresponse()
        body = r.read()
    except (OSError, http.client.HTTPException) as e:
        # The gateway closes a connection whose refused request body it
        # did not read: the next request on it never reached it.
        counts["reset"] = counts.get("reset", 0) + 1
        conn.close()
        conn = None
        continue
    if r.status == 200:
        counts["ok"] += 1
    elif r.status == 429:
        counts["limited"] += 1
        retry = r.getheader("Retry-After") or ""
        try:
            error = json.loads(body).get("error")
        except ValueError:
            error = None
        if not retry.isdigit() or int(retry) < 1 or error != "veris_rate_limited":
            counts["bad_429"] += 1
    else:
        counts["other"].append(r.status)
    if r.getheader("Connection", "").lower() == "close":
        conn.close()
        conn = None
print(json.dumps(counts), flush=True)
"#;

/// Runs [`BURST_PY`] for `sandbox` in the background.
fn burst(gw: &Gateway, sandbox: &Sandbox, seconds: &str) -> std::process::Child {
    let script = gw.dir.join("burst.py");
    if !script.exists() {
        std::fs::write(&script, BURST_PY).unwrap();
    }
    command("python3")
        .arg(&script)
        .args([
            "127.0.0.1",
            &gw.listen.port().to_string(),
            &sandbox.username,
            &sandbox.password,
            seconds,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting python3")
}

/// The JSON summary a [`burst`] printed.
fn summary(child: std::process::Child, who: &str) -> Value {
    let out = child.wait_with_output().expect("waiting for python3");
    let (stdout, stderr) = text(&out);
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{who}'s burst printed no summary ({e}): {stdout}{stderr}"))
}

/// Attack: sandbox A floods the gateway with requests for 2.5 s. With
/// `--max-rps 5`, A gets 429s (`Retry-After`, `veris_rate_limited`), its
/// ledger holds at most one requests-limit line a second whose counts add
/// up to exactly A's 429s, and its receipt still verifies; sandbox B,
/// bursting at the same time under the gateway's default, gets every one
/// of its requests answered 200.
#[test]
fn a_sandbox_over_its_request_rate_is_refused_and_counted_while_another_is_served() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    if let Some(why) = missing(&["python3"]) {
        return skip(&why);
    }
    let mut gw = Gateway::start("gw-rps", "127.0.0.1:0", &[]);
    let a = add(&gw, "sbx-a", &["--max-rps", "5"]);
    // B's own limit is far above its burst: only A's limit could refuse it.
    let b = add(&gw, "sbx-b", &["--max-rps", "1000000"]);
    let ca = gw.ca();
    // A's probe from inside (one of its requests): its receipt can verify.
    probe_canary(&a.url("http"), &ca);

    let (burst_a, burst_b) = (burst(&gw, &a, "2.5"), burst(&gw, &b, "1.5"));
    let (sa, sb) = (summary(burst_a, "A"), summary(burst_b, "B"));
    println!("A: {sa}\nB: {sb}");
    let limited = sa["limited"].as_u64().unwrap();
    assert!(limited > 0, "A over 5 requests a second got no 429: {sa}");
    assert_eq!(
        sa["bad_429"], 0,
        "every 429 says when to retry, as JSON: {sa}"
    );
    assert_eq!(sa["other"], Value::Array(vec![]), "{sa}");
    assert!(sb["ok"].as_u64().unwrap() > 0, "{sb}");
    assert_eq!(sb["limited"], 0, "B is never refused for A's flood: {sb}");
    assert_eq!(sb["other"], Value::Array(vec![]), "{sb}");

    // Every 429 is counted, in lines at most a second apart; the last one
    // is written a second after the one before, at most.
    let lines = wait_for("A's limit lines to count every 429", DEADLINE, || {
        let lines = limit_lines(&gw.ledger("sbx-a"), "requests a second");
        let counted: u64 = lines.iter().map(|(_, r)| count(r)).sum();
        (counted >= limited).then_some(lines)
    });
    let counted: u64 = lines.iter().map(|(_, r)| count(r)).sum();
    assert_eq!(
        counted, limited,
        "the lines count A's 429s exactly: {lines:?}"
    );
    assert!(
        lines.len() >= 2 && lines.len() <= 5,
        "2.5 s of refusals is 2 to 5 lines (one a second at most): {lines:?}"
    );
    for pair in lines.windows(2) {
        let gap = millis(&pair[1].0) - millis(&pair[0].0);
        assert!(
            gap >= 990,
            "two requests-limit lines {gap} ms apart: {pair:?}"
        );
    }
    assert!(
        lines
            .iter()
            .all(|(_, r)| r.contains("limit of 5 requests a second")),
        "{lines:?}"
    );
    // A's served requests are in its receipt; B's ledger has no limit line.
    let ra = gw.receipt_json("sbx-a");
    assert_eq!(
        charges(&ra).len() as u64,
        sa["ok"].as_u64().unwrap(),
        "A's receipt lists the requests it was served, no refused one: {ra}"
    );
    assert_eq!(ra["integrity"]["status"], "verified", "{ra}");
    assert!(
        limit_lines(&gw.ledger("sbx-b"), "limit").is_empty(),
        "B hit no limit"
    );
    let listed = gw.admin_command("list-sandboxes", &[]);
    let listed = text(&listed).0;
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("sbx-a\t") && l.contains("rps=5")),
        "list-sandboxes shows A's own limit: {listed}"
    );
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("sbx-b\t") && l.contains("rps=1000")),
        "list-sandboxes shows B's default: {listed}"
    );
    gw.stop();
}

/// A plain-HTTP twin stand-in on argv[1] (port 0; prints `ready PORT`)
/// that answers every vendor request with [`BIG`] bytes of a known
/// pattern, and `/veris/…` with an empty request log. Run after
/// [`PY_LIB`].
const BIG_TWIN_PY: &str = r#"
import socket, sys, threading
addr = sys.argv[1]
big = bytes((i * 7) % 251 for i in range(int(sys.argv[2])))
def serve(c):
    try:
        c.settimeout(30)
        while True:
            data = read_head(c)
            if b"\r\n\r\n" not in data:
                return
            head = data.split(b"\r\n\r\n", 1)[0]
            target = head.split(b" ")[1] if b" " in head else b"/"
            if b"/veris/" in target:
                body, kind = b'{"requests":[]}', b"application/json"
            else:
                body, kind = big, b"application/octet-stream"
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: " + kind + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    except OSError:
        pass
    finally:
        c.close()
serve_forever(addr, serve)
"#;

/// The size of [`BIG_TWIN_PY`]'s answer.
const BIG: usize = 1 << 20;

/// Attack: sandbox A pulls a large answer as fast as it can. With
/// `--max-bytes-per-sec 524288`, A's download arrives whole (the same
/// bytes the twin sent) and A's ledger holds a bytes-limit line ("slowed,
/// nothing dropped"); sandbox B's download of the same answer meanwhile is
/// whole too, and B's ledger has no such line.
#[test]
fn a_sandbox_over_its_byte_rate_is_slowed_never_cut_and_another_is_not() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    if let Some(why) = missing(&["python3"]) {
        return skip(&why);
    }
    let mut gw = Gateway::start("gw-bytes", "127.0.0.1:0", &[]);
    let twin = PyServer::start(
        command("python3"),
        &gw.dir,
        "big-twin",
        BIG_TWIN_PY,
        &["127.0.0.1", &BIG.to_string()],
    );
    let twin_url = format!("http://127.0.0.1:{}", twin.port);
    let a = add(
        &gw,
        "sbx-a",
        &["--twin", &twin_url, "--max-bytes-per-sec", "524288"],
    );
    let b = add(&gw, "sbx-b", &["--twin", &twin_url]);
    let ca = gw.ca();
    let expected: Vec<u8> = (0..BIG).map(|i| ((i * 7) % 251) as u8).collect();
    let download = |sandbox: &Sandbox, scheme: &str| {
        let file = gw.dir.join(format!("{}-{scheme}.bin", sandbox.id));
        command("curl")
            .args(["-sS", "--max-time", "30", "--proxy", &sandbox.url(scheme)])
            .arg("--cacert")
            .arg(&ca)
            .arg("-o")
            .arg(&file)
            .arg("https://api.stripe.com/v1/files/big")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map(|child| (child, file))
            .expect("starting curl")
    };
    // A over SOCKS5 and over the HTTP proxy, B over both, all at once.
    let runs = [
        ("sbx-a", download(&a, "socks5h")),
        ("sbx-a", download(&a, "http")),
        ("sbx-b", download(&b, "socks5h")),
        ("sbx-b", download(&b, "http")),
    ];
    for (who, (child, file)) in runs {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{who}'s download: {:?}", text(&out));
        let got = std::fs::read(&file).unwrap();
        assert_eq!(got.len(), BIG, "{who}'s download is whole");
        assert!(got == expected, "{who}'s download has the twin's bytes");
    }
    let slowed = wait_for("A's bytes-limit line", DEADLINE, || {
        let lines = limit_lines(&gw.ledger("sbx-a"), "bytes a second");
        (!lines.is_empty()).then_some(lines)
    });
    println!("A's bytes-limit lines: {slowed:?}");
    assert!(
        slowed
            .iter()
            .all(|(_, r)| r.contains("limit of 524288 bytes a second") && count(r) > 0),
        "{slowed:?}"
    );
    for pair in slowed.windows(2) {
        let gap = millis(&pair[1].0) - millis(&pair[0].0);
        assert!(gap >= 990, "two bytes-limit lines {gap} ms apart: {pair:?}");
    }
    assert!(
        limit_lines(&gw.ledger("sbx-b"), "limit").is_empty(),
        "B was not slowed"
    );
    // Both were served the same answers, in full.
    for id in ["sbx-a", "sbx-b"] {
        let sizes: Vec<Value> = gw
            .ledger(id)
            .iter()
            .filter(|l| l["kind"] == "request")
            .map(|l| l["bytes_out"].clone())
            .collect();
        assert_eq!(sizes, vec![Value::from(BIG); 2], "{id}'s request lines");
    }
    gw.stop();
}

/// Opens keep-alive HTTP proxy connections to the gateway (argv: host port
/// user password other_user other_password n) and on each sends one
/// absolute-form request with the first credentials, keeping every
/// connection open; then, on the first, one more request with the same
/// credentials and one with the other's. Prints one JSON line of statuses
/// and error codes, then waits for stdin to close.
const KEEP_ALIVE_PY: &str = r#"
import base64, http.client, json, sys
host, port, user, password, other, other_password, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6], int(sys.argv[7])
def auth(u, p):
    return "Basic " + base64.b64encode(("%s:%s" % (u, p)).encode()).decode()
def call(conn, u, p):
    try:
        conn.request("POST", "http://api.stripe.com/v1/charges", body="amount=100",
                     headers={"Host": "api.stripe.com", "Proxy-Authorization": auth(u, p),
                              "Content-Type": "application/x-www-form-urlencoded"})
        r = conn.getresponse()
        body = r.read()
        try:
            error = json.loads(body).get("error")
        except ValueError:
            error = None
        return [r.status, error, (r.getheader("Connection") or "").lower()]
    except (OSError, http.client.HTTPException) as e:
        return [0, repr(e), ""]
conns = [http.client.HTTPConnection(host, port, timeout=15) for _ in range(n)]
opened = [call(c, user, password) for c in conns]
again = call(conns[0], user, password)
switched = call(conns[0], other, other_password)
print(json.dumps({"opened": opened, "again": again, "switched": switched}), flush=True)
sys.stdin.read()
"#;

/// Attack: the HTTP proxy path once counted no connection against a
/// sandbox's cap. With `--max-connections 2`, A's third keep-alive
/// connection is refused (429 `veris_sandbox_connections`, closed) and
/// counted in a connections-limit line of A's ledger while its first two
/// keep serving it; a request with B's credentials on A's connection is
/// refused (403 `veris_sandbox_switch`) and reaches neither ledger; and
/// once A's connections close, A is served again.
#[test]
fn http_proxy_connections_count_against_the_sandbox_cap_and_cannot_switch_sandbox() {
    if let Some(why) = missing(&["python3"]) {
        return skip(&why);
    }
    let mut gw = Gateway::start("gw-http-cap", "127.0.0.1:0", &[]);
    let a = add(&gw, "sbx-a", &["--max-connections", "2"]);
    let b = add(&gw, "sbx-b", &[]);
    let script = gw.dir.join("keep_alive.py");
    std::fs::write(&script, KEEP_ALIVE_PY).unwrap();
    let port = gw.listen.port().to_string();
    let mut holder = support::Guard::spawn(
        command("python3")
            .arg(&script)
            .args([
                "127.0.0.1",
                &port,
                &a.username,
                &a.password,
                &b.username,
                &b.password,
                "3",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null()),
    );
    let stdout = holder.child().stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(DEADLINE).expect("the holder's report");
    let seen: Value = serde_json::from_str(line.trim())
        .unwrap_or_else(|e| panic!("the holder's report is not JSON ({e}): {line:?}"));
    println!("{seen}");
    assert_eq!(seen["opened"][0][0], 200, "A's first connection: {seen}");
    assert_eq!(seen["opened"][1][0], 200, "A's second connection: {seen}");
    assert_eq!(
        seen["opened"][2][0], 429,
        "A's third connection over its cap of 2 must be refused: {seen}"
    );
    assert_eq!(seen["opened"][2][1], "veris_sandbox_connections", "{seen}");
    assert_eq!(seen["opened"][2][2], "close", "{seen}");
    assert_eq!(
        seen["again"][0], 200,
        "A's first connection still serves A: {seen}"
    );
    assert_eq!(
        seen["switched"][0], 403,
        "B's request on A's connection: {seen}"
    );
    assert_eq!(seen["switched"][1], "veris_sandbox_switch", "{seen}");

    let lines = wait_for("A's connections-limit line", DEADLINE, || {
        let lines = limit_lines(&gw.ledger("sbx-a"), "open connections");
        (!lines.is_empty()).then_some(lines)
    });
    assert_eq!(
        lines.iter().map(|(_, r)| count(r)).sum::<u64>(),
        1,
        "one refusal, counted once: {lines:?}"
    );
    assert!(
        lines[0].1.contains("limit of 2 open connections"),
        "{lines:?}"
    );
    let requests = |id: &str| {
        gw.ledger(id)
            .iter()
            .filter(|l| l["kind"] == "request")
            .count()
    };
    assert_eq!(requests("sbx-a"), 3, "A's three served requests");
    assert_eq!(
        requests("sbx-b"),
        0,
        "B's request on A's connection went nowhere"
    );

    // The holder leaves: its connections' permits come back.
    drop(holder);
    wait_for(
        "A served again after its connections closed",
        DEADLINE,
        || {
            let (ok, status, _) =
                curl_charge(&a.url("http"), "http://api.stripe.com/v1/charges", &gw.ca());
            (ok && status == "200").then_some(())
        },
    );
    gw.stop();
}
