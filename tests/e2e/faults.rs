//! Faults injected under the real binary: a full disk under the ledger, a
//! body built to exhaust the stack.
//! DESIGN §7: records are never dropped — when the ledger cannot be written,
//! vendor requests are refused with 503 rather than served unrecorded, and
//! the proxy recovers once space is back, with the chain intact.

use crate::support;

use std::io::Write;
use std::path::PathBuf;

use support::*;

/// A small tmpfs mounted for the test, unmounted (and its dir removed) on drop.
struct Tmpfs {
    mount_point: PathBuf,
    parent: PathBuf,
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = command("umount").arg(&self.mount_point).status();
        let _ = std::fs::remove_dir_all(&self.parent);
    }
}

#[test]
fn a_full_disk_refuses_vendor_traffic_with_503_and_recovers_without_a_gap() {
    let (dir, _state, _tmpfs) = match state_on_tmpfs("fulldisk") {
        Ok(t) => t,
        Err(why) => return skip(&why),
    };
    let mut serve = Serve::start_in(dir, &[]);

    assert_eq!(serve.vendor("POST", "api.stripe.com", "/v1/customers"), 200);

    // Fill the disk (bounded: the tmpfs is 4 MiB).
    let filler = serve.state.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    let mut full = false;
    for _ in 0..200 {
        if let Err(e) = f.write_all(&chunk).and_then(|()| f.sync_all()) {
            assert_eq!(e.raw_os_error(), Some(28), "expected ENOSPC, got {e}");
            full = true;
            break;
        }
    }
    assert!(full, "the 4 MiB tmpfs never filled");
    drop(f);

    // The ledger's last page may still have room (file systems allocate in
    // pages), so requests are served until a line no longer fits; from then
    // on every vendor request is refused, never served unrecorded.
    let mut served = 1;
    let mut refusal = None;
    for _ in 0..100 {
        let (status, body) = http(
            serve.proxy_addr(),
            "POST",
            "http://api.stripe.com/v1/customers",
            "api.stripe.com",
            "",
            "",
        );
        match status {
            200 => served += 1,
            503 => {
                refusal = Some(body);
                break;
            }
            other => panic!("unexpected status {other}: {body}"),
        }
    }
    let body = refusal.expect("a full disk must turn vendor requests into 503");
    eprintln!("{served} request(s) served before the full disk refused one");
    assert!(body.contains("veris_ledger_unavailable"), "{body}");
    assert!(body.contains("Next:"), "{body}");
    let (status, _) = http(
        serve.proxy_addr(),
        "POST",
        "http://api.stripe.com/v1/customers",
        "api.stripe.com",
        "",
        "",
    );
    assert_eq!(status, 503, "still refused while the disk is full");

    // Space is back: the very next request is served and recorded.
    std::fs::remove_file(&filler).unwrap();
    assert_eq!(serve.vendor("POST", "api.stripe.com", "/v1/customers"), 200);
    served += 1;

    // A live reader learns from the proxy (`/status`) that the twin's rows
    // for the refused requests are its own write failures, not direct calls.
    let out = output(veris(["receipt", "--json", "--state-dir"]).arg(&serve.state));
    let live: serde_json::Value = serde_json::from_str(&text(&out).0)
        .unwrap_or_else(|e| panic!("live receipt JSON: {e}: {:?}", text(&out)));
    let twin = check_named(&live, "twin_cross_check");
    let detail = twin["detail"].as_str().unwrap_or_default();
    assert_eq!(twin["status"], "unverified", "{live}");
    assert!(
        detail.contains("could not write their ledger lines")
            && !detail.contains("called the twin directly"),
        "{detail}"
    );
    serve.stop();

    let out =
        output(veris(["receipt", "--json", "--ledger"]).arg(serve.state.join("ledger.jsonl")));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let receipt: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_ne!(receipt["integrity"]["status"], "failed", "{stdout}");
    assert_eq!(
        receipt["services"]["stripe"]["requests"], served,
        "every served request is in the ledger and no refused one is: {stdout}"
    );
    assert!(
        serve.stderr().contains("ledger"),
        "the refusal is said in the log: {}",
        serve.stderr()
    );
}

/// A state dir on a fresh 4 MiB tmpfs mounted for the test; `Err` is why
/// not (the caller skips).
fn state_on_tmpfs(label: &str) -> Result<(TempDir, PathBuf, Tmpfs), String> {
    if euid() != 0 {
        return Err("mounting a small tmpfs for the state dir needs root".into());
    }
    let dir = TempDir::new(label);
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let mounted = command("mount")
        .args(["-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs"])
        .arg(&state)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        return Err("cannot mount a tmpfs here (mount -t tmpfs failed)".into());
    }
    let tmpfs = Tmpfs {
        mount_point: state.clone(),
        parent: dir.path().to_path_buf(),
    };
    Ok((dir, state, tmpfs))
}

/// The workload of the full-disk runs: fills the file system under `$1`
/// (the state dir) with `$1/filler` until ENOSPC, then sends vendor
/// requests (a short line each, so what room is left in the ledger's last
/// page is less than a line) until the proxy refuses one with 503 (it could
/// not record it; the twin had executed it); with `$2` = `free`, removes
/// the filler and sends one more request, which is served.
const FULL_DISK_SH: &str = r#"
python3 - "$1/filler" <<'PY'
import os, sys
f = open(sys.argv[1], "wb", buffering=0)
chunk = b"\0" * 65536
for _ in range(1000):
    try:
        f.write(chunk)
        os.fsync(f.fileno())
    except OSError as e:
        assert e.errno == 28, e
        print("disk full")
        break
PY
i=0
while [ $i -lt 200 ]; do
    i=$((i+1))
    code=$(curl -sS -o /dev/null -w '%{http_code}' --max-time 20 -X POST https://api.stripe.com/v1/customers)
    echo "request $i: $code"
    [ "$code" = 503 ] && break
done
if [ "$2" = free ]; then
    rm -f "$1/filler"
    echo "after freeing: $(curl -sS -o /dev/null -w '%{http_code}' --max-time 20 -X POST https://api.stripe.com/v1/customers)"
fi
"#;

/// `veris run --tier explicit` with the state dir on a small tmpfs, the
/// workload [`FULL_DISK_SH`]; its stdout+stderr and JSON receipt.
fn full_disk_run(label: &str, then: &str) -> Result<(String, serde_json::Value), String> {
    let (dir, state, _tmpfs) = state_on_tmpfs(label)?;
    let script = dir.join("full_disk.sh");
    std::fs::write(&script, FULL_DISK_SH).unwrap();
    // Outside the tmpfs, so it can be written whatever the disk holds.
    let receipt = dir.join("receipt.json");
    let out = output_within(
        veris(["run", "--tier", "explicit", "--state-dir"])
            .arg(&state)
            .arg("--receipt")
            .arg(&receipt)
            .args(["--", "sh"])
            .arg(&script)
            .arg(&state)
            .arg(then),
        std::time::Duration::from_secs(120),
    );
    let (stdout, stderr) = text(&out);
    let all = format!("exit {:?}\n{stdout}\n{stderr}", out.status.code());
    assert!(
        all.contains("disk full"),
        "the filler never filled the disk: {all}"
    );
    assert!(all.contains(": 503"), "no request was refused: {all}");
    let json = std::fs::read_to_string(&receipt)
        .unwrap_or_else(|e| panic!("no receipt file ({e}): {all}"));
    Ok((all, serde_json::from_str(&json).unwrap()))
}

fn check_named<'a>(receipt: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    receipt["integrity"]["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no {name} check: {receipt}"))
}

/// DESIGN §7a.18: a disk the workload filled keeps the final seal out of
/// the ledger; the receipt says that (with the write error), never "no
/// public key to check the seals with", and the twin's row for the request
/// the proxy could not record is its write failure, not a direct call.
#[test]
fn a_full_disk_at_the_final_seal_is_named_as_the_reason() {
    let (all, receipt) = match full_disk_run("fulldisk-seal", "keep") {
        Ok(r) => r,
        Err(why) => return skip(&why),
    };
    let integrity = &receipt["integrity"];
    let reason = integrity["reason"].as_str().unwrap_or_default();
    assert_eq!(integrity["status"], "unverified", "{receipt}\n{all}");
    assert!(!reason.contains("no public key"), "{reason}");
    assert!(
        reason.contains("the final seal could not be written")
            && reason.contains("No space left on device"),
        "{reason}"
    );
    assert!(!reason.contains("called the twin directly"), "{reason}");
}

/// DESIGN §7a.18: the workload fills the disk, the proxy answers 503 to a
/// request the twin had already executed, space comes back and the session
/// seals: the twin's row without a ledger line is the proxy's own write
/// failure (`unverified`, naming it), not "something called the twin
/// directly" (`failed`).
#[test]
fn a_request_the_full_disk_kept_out_of_the_ledger_is_not_called_a_direct_call() {
    let (all, receipt) = match full_disk_run("fulldisk-cross", "free") {
        Ok(r) => r,
        Err(why) => return skip(&why),
    };
    assert!(all.contains("after freeing: 200"), "{all}");
    let twin = check_named(&receipt, "twin_cross_check");
    let detail = twin["detail"].as_str().unwrap_or_default();
    assert_eq!(twin["status"], "unverified", "{twin}\n{all}");
    assert!(
        detail.contains("could not write their ledger lines")
            && detail.contains("No space left on device")
            && !detail.contains("called the twin directly"),
        "{detail}"
    );
    assert_eq!(receipt["integrity"]["status"], "unverified", "{receipt}");
    // The seal went in once space was back: the seals check passed.
    assert_eq!(check_named(&receipt, "seals")["status"], "ok", "{receipt}");
}

/// One request must never take the process down: a form key nested 300,000
/// levels deep (about 900 KB) once overflowed the built-in twin's stack,
/// and with it the proxy sharing its process.
#[test]
fn a_deeply_nested_form_body_is_refused_and_the_proxy_lives_on() {
    let serve = Serve::start("nested", &[]);
    let body = format!("a{}=1", "[b]".repeat(300_000));
    let (status, answer) = http(
        serve.proxy_addr(),
        "POST",
        "http://api.stripe.com/v1/customers",
        "api.stripe.com",
        "Content-Type: application/x-www-form-urlencoded\r\n",
        &body,
    );
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("nested"), "{answer}");
    assert_eq!(serve.vendor("GET", "api.stripe.com", "/v1/customers"), 200);
}

/// A CONNECT (or an absolute-form request) without a valid host and port is
/// refused, never dialed as 443 (or 80).
#[test]
fn connect_without_a_valid_port_is_refused_and_never_dialed() {
    use std::io::Read;
    let serve = Serve::start("connect-port", &[]);
    for request in [
        "CONNECT example.org:99999",
        "CONNECT example.org:65536",
        "CONNECT example.org:",
        "CONNECT example.org:0",
        "CONNECT :443",
        "GET http://api.stripe.com:99999/v1/customers",
        "GET http://example.org:0/",
    ] {
        let target = request.split_once(' ').unwrap().1;
        let mut s = std::net::TcpStream::connect(serve.proxy_addr()).unwrap();
        s.set_read_timeout(Some(DEADLINE)).unwrap();
        write!(s, "{request} HTTP/1.1\r\nHost: {target}\r\n\r\n").unwrap();
        let mut head = [0u8; 12];
        let n = s.read(&mut head).unwrap_or(0);
        let head = String::from_utf8_lossy(&head[..n]).to_string();
        assert!(head.starts_with("HTTP/1.1 400"), "{request}: {head:?}");
    }
    let lines = serve.ledger_lines();
    assert!(
        !lines
            .iter()
            .any(|l| l["kind"] == "passthrough" || l["kind"] == "request"),
        "a bad CONNECT was dialed: {lines:?}"
    );
}

/// Reads until the server closes the connection (or `within` passes);
/// true when it closed.
fn closed_within(stream: &mut std::net::TcpStream, within: std::time::Duration) -> bool {
    use std::io::Read;
    let deadline = std::time::Instant::now() + within;
    let mut buf = [0u8; 4096];
    while std::time::Instant::now() < deadline {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        stream
            .set_read_timeout(Some(left.max(std::time::Duration::from_millis(10))))
            .unwrap();
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
    false
}

#[test]
fn slow_and_idle_clients_are_closed_and_none_is_taken_for_a_refusal() {
    let mut serve = Serve::start(
        "slowloris",
        &["--client-timeout", "1", "--handshake-timeout", "1"],
    );
    let addr = serve.proxy_addr();
    let generous = std::time::Duration::from_secs(15);

    // Slowloris: a head that never ends.
    let mut slow = std::net::TcpStream::connect(addr).unwrap();
    slow.write_all(
        b"GET http://api.stripe.com/v1/charges HTTP/1.1\r\nHost: api.stripe.com\r\nX-A: ",
    )
    .unwrap();
    // Idle: connected, says nothing.
    let mut idle = std::net::TcpStream::connect(addr).unwrap();
    // A CONNECT, then no ClientHello.
    let mut silent_tls = std::net::TcpStream::connect(addr).unwrap();
    silent_tls
        .write_all(b"CONNECT api.stripe.com:443 HTTP/1.1\r\nHost: api.stripe.com:443\r\n\r\n")
        .unwrap();
    // A keep-alive connection idle after one answered request.
    let mut kept = std::net::TcpStream::connect(addr).unwrap();
    kept.write_all(
        b"GET http://api.stripe.com/v1/customers HTTP/1.1\r\nHost: api.stripe.com\r\n\r\n",
    )
    .unwrap();

    assert!(
        closed_within(&mut slow, generous),
        "a head that never ends is closed"
    );
    assert!(
        closed_within(&mut idle, generous),
        "a silent connection is closed"
    );
    assert!(
        closed_within(&mut silent_tls, generous),
        "a CONNECT without a ClientHello is closed"
    );
    assert!(
        closed_within(&mut kept, generous),
        "an idle keep-alive connection is closed"
    );

    // The proxy still serves, and a client too slow for the handshake is
    // not recorded as one that refused the veris certificate.
    assert_eq!(serve.vendor("GET", "api.stripe.com", "/v1/customers"), 200);
    serve.stop();
    let lines = serve.ledger_lines();
    assert!(
        !lines.iter().any(|l| l["kind"] == "trust_failure"),
        "no trust failure recorded: {lines:?}"
    );
}

#[test]
fn connections_beyond_the_cap_are_closed_and_the_open_ones_go_on() {
    let mut serve = Serve::start("maxconn", &["--max-connections", "3"]);
    let addr = serve.proxy_addr();
    let request =
        b"GET http://api.stripe.com/v1/customers HTTP/1.1\r\nHost: api.stripe.com\r\n\r\n";
    let mut held: Vec<std::net::TcpStream> = (0..3)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            // Answered: the connection is admitted and open.
            s.write_all(request).unwrap();
            let mut buf = [0u8; 12];
            use std::io::Read;
            s.set_read_timeout(Some(DEADLINE)).unwrap();
            s.read_exact(&mut buf).unwrap();
            assert_eq!(&buf, b"HTTP/1.1 200");
            s
        })
        .collect();
    // The fourth is closed at once, without an answer.
    let mut fourth = std::net::TcpStream::connect(addr).unwrap();
    let _ = fourth.write_all(request);
    assert!(
        closed_within(&mut fourth, std::time::Duration::from_secs(15)),
        "a connection over the cap is closed"
    );
    // The admitted ones still work.
    held[0].write_all(request).unwrap();
    {
        use std::io::Read;
        let mut buf = [0u8; 1];
        held[0].read_exact(&mut buf).unwrap();
    }
    // One leaves: room for a new one (the permit is returned when the
    // proxy notices the close).
    drop(held.pop());
    let status = wait_for("a free slot", DEADLINE, || {
        let s = serve.vendor("GET", "api.stripe.com", "/v1/customers");
        (s == 200).then_some(s)
    });
    assert_eq!(status, 200);
    assert!(
        std::fs::read_to_string(&serve.stderr_file)
            .unwrap()
            .contains("too many client connections open"),
        "the refusal is logged"
    );
    serve.stop();
}

#[test]
fn a_strict_connect_that_speaks_no_tls_is_refused_and_recorded() {
    let mut serve = Serve::start("strict-notls", &["--mode", "strict"]);
    let mut s = std::net::TcpStream::connect(serve.proxy_addr()).unwrap();
    s.write_all(b"CONNECT unmapped.invalid:443 HTTP/1.1\r\nHost: unmapped.invalid:443\r\n\r\n")
        .unwrap();
    // The CONNECT is answered (the refusal would come inside TLS) ...
    let mut head = [0u8; 12];
    {
        use std::io::Read;
        s.set_read_timeout(Some(DEADLINE)).unwrap();
        s.read_exact(&mut head).unwrap();
    }
    assert_eq!(&head, b"HTTP/1.1 200");
    // ... but the client speaks plain bytes, not TLS: closed, and recorded.
    s.write_all(b"hello, not TLS\r\n\r\n").unwrap();
    assert!(closed_within(&mut s, std::time::Duration::from_secs(15)));
    serve.stop();
    let lines = serve.ledger_lines();
    let blocked: Vec<_> = lines.iter().filter(|l| l["kind"] == "blocked").collect();
    assert_eq!(blocked.len(), 1, "{lines:?}");
    assert_eq!(blocked[0]["host"], "unmapped.invalid");
    assert_eq!(blocked[0]["method"], "CONNECT");
    assert!(
        blocked[0]["reason"]
            .as_str()
            .unwrap()
            .contains("no TLS ClientHello"),
        "{:?}",
        blocked[0]
    );
    assert!(!lines.iter().any(|l| l["kind"] == "passthrough"));
}
