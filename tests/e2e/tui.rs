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
    tmux.respawn(&format!(
        "{} tui --state-dir {} --log-file {}; echo $? > {}",
        sh_quote(&bin().display().to_string()),
        sh_quote(&state.display().to_string()),
        sh_quote(&log.display().to_string()),
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
