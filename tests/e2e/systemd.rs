//! The systemd unit and readiness (`Type=notify`): `deploy/veris.service`
//! passes `systemd-analyze verify` and scores at most [`THRESHOLD`] in
//! `systemd-analyze security --offline=true`; `serve` and the gateway send
//! `READY=1` to `NOTIFY_SOCKET` (a path or an `@abstract` name) only once
//! they accept, and `STOPPING=1` when they stop; the workload of `veris run`
//! never inherits `NOTIFY_SOCKET` (it could tell systemd a start is ready, or
//! a stop, for veris).

use crate::support;

use std::net::TcpStream;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Stdio;

use support::gateway::Gateway;
use support::{output, skip, text, veris, Guard, TempDir, DEADLINE};

/// The exposure score the unit must not exceed, in tenths (2.7 "OK"; the
/// unhardened unit scored 9.0 "UNSAFE").
const THRESHOLD: &str = "27";

fn unit() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/veris.service")
}

fn systemd_analyze() -> Option<String> {
    if support::tool_works("systemd-analyze", &["--version"]) {
        None
    } else {
        Some("no systemd-analyze (apt-get install systemd)".into())
    }
}

#[test]
fn the_unit_verifies_and_is_hardened() {
    if let Some(why) = systemd_analyze() {
        return skip(&why);
    }
    // `verify` wants the executables the unit names: the same unit, with
    // the installed paths pointing at this build and this checkout.
    let dir = TempDir::new("systemd-verify");
    let text_unit = std::fs::read_to_string(unit()).unwrap();
    let boot = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/veris-boot.sh");
    let local = text_unit
        .replace(
            "/usr/local/bin/veris",
            &support::bin().display().to_string(),
        )
        .replace(
            "/usr/local/lib/veris/veris-boot.sh",
            &boot.display().to_string(),
        );
    assert_ne!(local, text_unit, "the unit names the installed paths");
    let copy = dir.join("veris.service");
    std::fs::write(&copy, local).unwrap();
    let out = output(support::command("systemd-analyze").arg("verify").arg(&copy));
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "verify: {stdout}\n{stderr}");
    assert!(stderr.trim().is_empty(), "verify warned: {stderr}");

    let out = output(
        support::command("systemd-analyze")
            .args(["security", "--offline=true", "--no-pager"])
            .arg(format!("--threshold={THRESHOLD}"))
            .arg(unit()),
    );
    let (stdout, stderr) = text(&out);
    let score = stdout
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or("no score line");
    println!("systemd-analyze security: {score}");
    assert!(
        out.status.success(),
        "exposure above {THRESHOLD}: {score}\n{stdout}\n{stderr}"
    );
    assert!(
        text_unit.contains("\nType=notify\n"),
        "readiness by sd_notify"
    );
}

/// Waits for one datagram on `socket`.
fn receive(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 512];
    let n = socket
        .recv(&mut buf)
        .unwrap_or_else(|e| panic!("no notification within {DEADLINE:?}: {e}"));
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// `veris serve` with `NOTIFY_SOCKET=notify_socket`; READY=1 arrives only
/// once the ready file is there and the proxy accepts, STOPPING=1 on SIGTERM.
fn serve_notifies(label: &str, socket: &UnixDatagram, notify_socket: &str) {
    let dir = TempDir::new(label);
    let ready_file = dir.join("ready.json");
    let mut cmd = veris(["serve", "--listen", "127.0.0.1:0", "--state-dir"]);
    cmd.arg(dir.join("state"))
        .arg("--ready-file")
        .arg(&ready_file)
        .env("NOTIFY_SOCKET", notify_socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("serve.stderr")).unwrap());
    let mut serve = Guard::spawn(&mut cmd);
    assert_eq!(receive(socket), "READY=1\n");
    // Nothing waited for the ready file: READY=1 came after it.
    let ready: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&ready_file).expect("ready file"))
            .expect("a complete ready file");
    let addr = ready["proxy_url"]
        .as_str()
        .unwrap()
        .trim_start_matches("http://")
        .to_string();
    TcpStream::connect(&addr).expect("the proxy accepts once READY=1 is sent");
    serve.signal("TERM");
    assert_eq!(receive(socket), "STOPPING=1\n");
    let status = serve.wait_timeout(DEADLINE).expect("serve stops");
    assert!(
        status.success(),
        "{status}: {}",
        std::fs::read_to_string(dir.join("serve.stderr")).unwrap_or_default()
    );
}

#[test]
fn serve_notifies_ready_once_it_accepts_on_a_path_socket() {
    let dir = TempDir::new("systemd-notify");
    let path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket.set_read_timeout(Some(DEADLINE)).unwrap();
    serve_notifies("systemd-serve", &socket, &path.display().to_string());
}

#[test]
fn serve_notifies_on_an_abstract_socket() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("veris-e2e-notify-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let socket = UnixDatagram::bind_addr(&addr).unwrap();
    socket.set_read_timeout(Some(DEADLINE)).unwrap();
    serve_notifies("systemd-abstract", &socket, &format!("@{name}"));
}

#[test]
fn the_gateway_notifies_ready_after_its_ready_file() {
    let dir = TempDir::new("systemd-gateway");
    let path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket.set_read_timeout(Some(DEADLINE)).unwrap();
    let notify = path.display().to_string();
    let mut gateway = Gateway::start_in_env(
        None,
        "systemd-gw",
        "127.0.0.1:0",
        &[],
        &[("NOTIFY_SOCKET", &notify)],
    );
    assert_eq!(receive(&socket), "READY=1\n");
    TcpStream::connect(gateway.listen).expect("the gateway accepts once READY=1 is sent");
    gateway.stop();
    assert_eq!(receive(&socket), "STOPPING=1\n");
}

/// The attack: a workload that inherits NOTIFY_SOCKET can send READY=1 or
/// STOPPING=1 (or MAINPID=) on veris's behalf.
#[test]
fn the_workload_of_run_does_not_see_notify_socket() {
    let dir = TempDir::new("systemd-run");
    let sock = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&sock).unwrap();
    let mut cmd = veris(["run", "--tier", "explicit", "--allow-empty", "--state-dir"]);
    cmd.arg(dir.join("state"))
        .env("NOTIFY_SOCKET", &sock)
        .args([
            "--",
            "sh",
            "-c",
            "echo \"NOTIFY_SOCKET=${NOTIFY_SOCKET-unset}\"",
        ]);
    let out = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("NOTIFY_SOCKET=unset"), "{stdout}\n{stderr}");
    // `run` is not a service: it says nothing to systemd either.
    socket.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 64];
    assert!(socket.recv(&mut buf).is_err(), "run notified systemd");
}
