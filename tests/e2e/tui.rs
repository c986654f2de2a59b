//! End-to-end test of `veris tui`: the binary runs in a tmux pane watching a
//! state dir; `veris run -- curl …` sends a request through the proxy and
//! the built-in twin; the request must appear on the screen, its detail must
//! open, and `q` must quit with status 0 and give the terminal back.

use crate::support;

use std::time::Duration;

use support::tmux::{sh_quote, Tmux, TUI_DEADLINE};
use support::{bin, output, output_within, skip, tool_works, veris, TempDir};

#[test]
fn tui_shows_a_request_made_through_veris_run() {
    if !tool_works("tmux", &["-V"]) {
        return skip("tmux is not installed (apt-get install tmux)");
    }
    if !tool_works("curl", &["--version"]) {
        return skip("curl is not installed");
    }
    let dir = TempDir::new("tui");
    let state = dir.path().join("state");
    let log = dir.path().join("tui.log");
    let tmux = Tmux::start(dir.path(), 120, 36);
    // The shell records the exit status: tmux 3.3 sometimes leaves a pane's
    // exited process unreaped, with no status to report.
    let status_file = dir.path().join("tui.status");
    // Its stderr kept apart: nothing may write there while the TUI owns
    // the screen (a note such as `veris receipt`'s naming the newest run
    // would land on it).
    let stderr = dir.path().join("tui.stderr");
    tmux.respawn(&format!(
        "{} tui --state-dir {} --log-file {} 2> {}; echo $? > {}",
        sh_quote(&bin().display().to_string()),
        sh_quote(&state.display().to_string()),
        sh_quote(&log.display().to_string()),
        sh_quote(&stderr.display().to_string()),
        sh_quote(&status_file.display().to_string()),
    ));
    tmux.wait_screen("the TUI to start", TUI_DEADLINE, |s| {
        s.contains("veris") && s.contains("waiting for traffic")
    });

    let out = output_within(
        veris(["run", "--state-dir"]).arg(&state).args([
            "--",
            "curl",
            "-sS",
            "--max-time",
            "20",
            "https://api.stripe.com/v1/charges?expand=customer",
            "-d",
            "amount=100",
        ]),
        TUI_DEADLINE,
    );
    assert!(
        out.status.success(),
        "veris run failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    tmux.wait_screen(
        "the request row, with its host, under the twin's header",
        TUI_DEADLINE,
        |s| {
            s.contains("twin sbx_local")
                && s.lines().any(|l| {
                    l.contains("stripe")
                        && l.contains("POST")
                        && l.contains("api.stripe.com")
                        && l.contains("/v1/charges")
                        && l.contains(" 200 ")
                })
        },
    );
    tmux.wait_screen("the services panel to count the call", TUI_DEADLINE, |s| {
        s.lines()
            .any(|l| l.contains("stripe") && l.contains("1 req"))
    });
    // Nothing but the TUI writes on its screen (a note on stderr, such as
    // the one `veris receipt` prints naming the newest run, would).
    let screen = tmux.capture();
    assert!(
        !screen.contains("veris: "),
        "stderr on the screen:\n{screen}"
    );

    // The detail pane of the selected (newest) request.
    tmux.keys(&[
        "/", "s", "e", "r", "v", "i", "c", "e", ":", "s", "t", "r", "i", "p", "e", "Enter", "Enter",
    ]);
    // Polled as a whole: a capture can land between two draws.
    tmux.wait_screen(
        "the detail pane of the filtered request",
        TUI_DEADLINE,
        |s| {
            s.contains("detail · seq")
                && s.contains("POST \"/v1/charges?expand=customer\"")
                && s.contains("host     \"api.stripe.com\"")
                && s.contains("filter: service:stripe")
        },
    );

    tmux.keys(&["q"]);
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(code) = std::fs::read_to_string(&status_file)
            .ok()
            .filter(|s| s.ends_with('\n'))
        {
            break code.trim().to_string();
        }
        assert!(
            start.elapsed() < TUI_DEADLINE,
            "the TUI did not quit on q:\n{}\nlog:\n{}",
            tmux.capture(),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        status,
        "0",
        "{}\nlog:\n{}",
        tmux.capture(),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let after = tmux.capture();
    assert!(
        !after.contains("requests "),
        "the alternate screen was left:\n{after}"
    );
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        log_text.contains("tui starting"),
        "logs went to the file: {log_text}"
    );
    let stray = std::fs::read_to_string(&stderr).unwrap_or_default();
    assert!(stray.is_empty(), "written to stderr under the TUI: {stray}");
}

#[test]
fn tui_refuses_without_a_terminal_or_a_token() {
    let out = output(&mut veris(["tui", "--ledger", "/nonexistent/ledger.jsonl"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("needs an interactive terminal. Next:"),
        "{stderr}"
    );

    let out = output(&mut veris(["tui", "--admin", "http://127.0.0.1:9"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--admin needs a token. Next:"), "{stderr}");

    let out = output(&mut veris([
        "tui",
        "--admin",
        "https://127.0.0.1:9",
        "--token",
        "t",
    ]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("only http:// is supported"), "{stderr}");
}

#[test]
fn tui_follows_a_finished_run_named_by_its_id() {
    if !tool_works("tmux", &["-V"]) {
        return skip("tmux is not installed (apt-get install tmux)");
    }
    if !tool_works("curl", &["--version"]) {
        return skip("curl is not installed");
    }
    let dir = TempDir::new("tui-run");
    let state = dir.path().join("state");
    let out = output_within(
        veris(["run", "--state-dir"]).arg(&state).args([
            "--",
            "curl",
            "-sS",
            "--max-time",
            "20",
            "https://api.stripe.com/v1/charges",
            "-d",
            "amount=100",
        ]),
        TUI_DEADLINE,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = std::fs::read_dir(state.join("runs"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .file_name()
        .to_string_lossy()
        .into_owned();
    // A later run dir the workload planted, newer by mtime: --run ID reads
    // the one named, whatever else is there.
    let planted = state.join("runs").join("0000000000000000");
    std::fs::create_dir_all(&planted).unwrap();
    std::fs::write(planted.join("ledger.jsonl"), "").unwrap();
    let log = dir.path().join("tui.log");
    let tmux = Tmux::start(dir.path(), 120, 36);
    tmux.respawn(&format!(
        "{} tui --state-dir {} --run {id} --log-file {}",
        sh_quote(&bin().display().to_string()),
        sh_quote(&state.display().to_string()),
        sh_quote(&log.display().to_string()),
    ));
    tmux.wait_screen("the run's request row", TUI_DEADLINE, |s| {
        s.lines()
            .any(|l| l.contains("stripe") && l.contains("POST") && l.contains("/v1/charges"))
    });
    tmux.keys(&["q"]);
}

/// What the workload runs: an HTTP server answering `GET /receipt` with a
/// receipt it edited to `verified`, `/events` with an open, empty event
/// stream, anything else with 404. Its port goes to argv[2] once listening.
const PLANTED_ADMIN: &str = r#"
import http.server, sys, time
body = open(sys.argv[1], 'rb').read()
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path.startswith('/receipt'):
            self.send_response(200)
            self.send_header('Content-Type', 'application/json')
            self.send_header('Content-Length', str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path.startswith('/events'):
            self.send_response(200)
            self.send_header('Content-Type', 'text/event-stream')
            self.end_headers()
            self.wfile.write(open(sys.argv[3], 'rb').read())
            self.wfile.flush()
            time.sleep(120)
        else:
            self.send_error(404)
s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), H)
s.daemon_threads = True
open(sys.argv[2] + '.tmp', 'w').write(str(s.server_address[1]))
import os; os.rename(sys.argv[2] + '.tmp', sys.argv[2])
s.serve_forever()
"#;

/// The integrity word after `integrity: ` on the first line holding it.
fn integrity_word(text: &str) -> Option<String> {
    let rest = text.split("integrity: ").nth(1)?;
    let word: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect();
    Some(word.to_ascii_lowercase())
}

/// The workload plants `admin.addr`/`admin.token` in the state dir it
/// shares the uid of, for a server whose `GET /receipt` says `verified` and
/// whose event stream carries a charge the ledger does not hold. The TUI
/// shows neither: its header is `veris receipt`'s, its rows the ledger's.
#[test]
fn tui_does_not_trust_an_admin_planted_in_the_state_dir() {
    if !tool_works("tmux", &["-V"]) {
        return skip("tmux is not installed (apt-get install tmux)");
    }
    if !tool_works("curl", &["--version"]) || !tool_works("python3", &["--version"]) {
        return skip("curl or python3 is not installed");
    }
    // A real session whose honest receipt is not verified: explicit tier,
    // no declared workload uid, read after the proxy stopped.
    let mut serve = support::Serve::start_same_uid("tui-planted", &[]);
    let out = output(support::command("curl").args([
        "-sS",
        "--max-time",
        "20",
        "--proxy",
        &serve.proxy_url,
        "http://api.stripe.com/v1/charges",
        "-d",
        "amount=100",
    ]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serve.stop();
    let state = serve.state.clone();
    let out = output(veris(["receipt", "--json", "--state-dir"]).arg(&state));
    let mut receipt: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_ne!(receipt["integrity"]["status"], "verified", "{receipt}");

    // The workload's forgery, served where the state dir says the admin is.
    receipt["integrity"]["status"] = "verified".into();
    receipt["integrity"]["reason"] = serde_json::Value::Null;
    for check in receipt["integrity"]["checks"].as_array_mut().unwrap() {
        check["status"] = "ok".into();
    }
    let forged = serve.dir.join("forged.json");
    std::fs::write(&forged, receipt.to_string()).unwrap();
    // A row that follows the real ones and names a call never made.
    let ledger = std::fs::read_to_string(state.join("ledger.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = ledger
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last_seq = lines
        .iter()
        .filter_map(|l| l["seq"].as_u64())
        .max()
        .unwrap();
    let mut fake = lines
        .iter()
        .find(|l| l["kind"] == "request")
        .expect("the charge's request line")
        .clone();
    fake["seq"] = (last_seq + 1).into();
    fake["path"] = "/v1/refunds_never_made".into();
    let events = serve.dir.join("forged.events");
    std::fs::write(&events, format!("id: {}\ndata: {fake}\n\n", last_seq + 1)).unwrap();
    let port_file = serve.dir.join("planted.port");
    let _planted = support::Guard::spawn(
        support::command("python3")
            .arg("-c")
            .arg(PLANTED_ADMIN)
            .arg(&forged)
            .arg(&port_file)
            .arg(&events)
            .stdin(std::process::Stdio::null()),
    );
    let port = support::wait_for("the planted admin's port", TUI_DEADLINE, || {
        std::fs::read_to_string(&port_file).ok()
    });
    std::fs::write(state.join("admin.addr"), format!("127.0.0.1:{port}\n")).unwrap();
    std::fs::write(state.join("admin.token"), "planted\n").unwrap();

    let dir = TempDir::new("tui-planted-tmux");
    let log = dir.path().join("tui.log");
    let tmux = Tmux::start(dir.path(), 160, 36);
    tmux.respawn(&format!(
        "{} tui --state-dir {} --log-file {}",
        sh_quote(&bin().display().to_string()),
        sh_quote(&state.display().to_string()),
        sh_quote(&log.display().to_string()),
    ));
    let screen = tmux.wait_screen("the header's integrity and the charge", TUI_DEADLINE, |s| {
        integrity_word(s).is_some_and(|w| w != "pending") && s.contains("/v1/charges")
    });
    // The planted stream had time to be read, had the TUI connected to it.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let screen = format!("{screen}\n{}", tmux.capture());
    assert!(
        !screen.contains("refunds_never_made"),
        "the TUI shows a row the ledger does not hold:\n{screen}"
    );
    let out = output(veris(["receipt", "--state-dir"]).arg(&state));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        integrity_word(&screen),
        integrity_word(&text),
        "the TUI header says what `veris receipt` does not:\n{screen}\nreceipt:\n{text}"
    );
    tmux.keys(&["q"]);
}
