//! End-to-end tests of `veris __confine`, the Landlock fallback of `veris run`
//! where no network namespace can be had: the command it execs may connect
//! over TCP only to the allowed ports (any other connect fails with EACCES),
//! the rules survive fork and exec, binding stays free, and a command that
//! cannot be started exits 127. Everything is on loopback with port 0; the
//! clients get a cleared environment, so no proxy variable reaches them.
//! Where the kernel has no Landlock ABI 4, the tests SKIP with the binary's
//! own reason (the refusal itself is unit-tested in `src/confine.rs`).

use crate::support;

use std::net::{TcpListener, TcpStream};

use support::{landlock_ready, output, skip, text, tool_works, veris};

/// EACCES: what a Landlock-refused connect() fails with.
const EACCES: i32 = 13;

/// Landlock and python3 both present, or a skip reason.
fn ready_with_python() -> Result<(), String> {
    landlock_ready()?;
    if tool_works("python3", &["-c", ""]) {
        Ok(())
    } else {
        Err("python3 not installed".into())
    }
}

/// A loopback listener on port 0 and its port; the kernel completes
/// connects into its backlog, so nothing needs to accept.
fn listener() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    let port = l.local_addr().expect("listener address").port();
    (l, port)
}

/// `veris __confine --allow-port ALLOW -- python3 -c SCRIPT ARGS...`.
fn confined_python(allow: u16, script: &str, args: &[String]) -> std::process::Output {
    let mut cmd = veris(["__confine", "--allow-port"]);
    cmd.arg(allow.to_string())
        .args(["--", "python3", "-c", script])
        .args(args);
    output(&mut cmd)
}

const CONNECT_A_THEN_B: &str = r#"
import socket, sys

def attempt(port):
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(("127.0.0.1", port))
        return "ok"
    except OSError as e:
        return "errno=%d" % e.errno
    finally:
        s.close()

print("A", attempt(int(sys.argv[1])))
print("B", attempt(int(sys.argv[2])))
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen()
print("listen ok")
"#;

#[test]
fn confined_connect_reaches_only_the_allowed_port() {
    if let Err(why) = ready_with_python() {
        return skip(&why);
    }
    let (_a, port_a) = listener();
    let (_b, port_b) = listener();
    // Unconfined, both ports answer: a refusal below is the confinement's.
    TcpStream::connect(("127.0.0.1", port_b)).expect("B is reachable unconfined");

    let out = confined_python(
        port_a,
        CONNECT_A_THEN_B,
        &[port_a.to_string(), port_b.to_string()],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        ["A ok", &format!("B errno={EACCES}"), "listen ok"],
        "stderr:\n{stderr}"
    );
}

const FORK_AND_EXEC: &str = r#"
import os, socket, subprocess, sys

b = int(sys.argv[1])
pid = os.fork()
if pid == 0:
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", b))
        os._exit(0)
    except OSError as e:
        os._exit(e.errno)
_, status = os.waitpid(pid, 0)
print("fork", os.waitstatus_to_exitcode(status))
r = subprocess.run(
    ["curl", "--noproxy", "*", "-sS", "--max-time", "3", "http://127.0.0.1:%d/" % b],
    capture_output=True, text=True)
print("curl", r.returncode)
print("curl-stderr", r.stderr.strip())
"#;

#[test]
fn confinement_survives_fork_and_exec() {
    if let Err(why) = ready_with_python().and_then(|()| support::curl()) {
        return skip(&why);
    }
    let (_a, port_a) = listener();
    let (_b, port_b) = listener();
    let out = confined_python(port_a, FORK_AND_EXEC, &[port_b.to_string()]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("fork {EACCES}\n")),
        "a forked child is refused with EACCES:\n{stdout}\n{stderr}"
    );
    // curl's 7 is "could not connect"; 28 would mean it hung until the timeout.
    assert!(
        stdout.contains("curl 7\n"),
        "an exec'd curl cannot connect:\n{stdout}\n{stderr}"
    );
}

#[test]
fn confined_command_keeps_its_arguments_environment_and_exit_code() {
    if let Err(why) = landlock_ready() {
        return skip(&why);
    }
    let mut cmd = veris([
        "__confine",
        "--allow-port",
        "1",
        "--",
        "sh",
        "-c",
        r#"echo "$VERIS_CONFINE_PROBE $1"; exit 5"#,
        "sh",
        "two words",
    ]);
    cmd.env("VERIS_CONFINE_PROBE", "inherited");
    let out = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(5), "{stdout}\n{stderr}");
    assert_eq!(stdout, "inherited two words\n", "{stderr}");
}

#[test]
fn confine_with_a_missing_command_exits_127() {
    if let Err(why) = landlock_ready() {
        return skip(&why);
    }
    let missing = "/nonexistent/veris-no-such-command";
    let out = output(&mut veris([
        "__confine",
        "--allow-port",
        "1",
        "--",
        missing,
    ]));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(127), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(&format!("veris: cannot start {missing}: ")),
        "{stderr}"
    );
    assert!(stdout.is_empty(), "{stdout}");
}

#[test]
fn confine_without_a_command_is_a_usage_error() {
    let out = output(&mut veris(["__confine", "--allow-port", "1"]));
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("CMD"), "{stderr}");
}

#[test]
fn confine_is_hidden_from_help() {
    let out = output(&mut veris(["--help"]));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stdout.contains("run"), "{stdout}");
    assert!(!stdout.contains("__confine"), "{stdout}");
}
