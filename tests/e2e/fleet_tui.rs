//! The fleet's live view (`veris tui --nats URL`, G2) in a tmux pane over
//! a real `nats-server -js`: one row per sandbox a real gateway publishes,
//! a new sandbox's row appearing live, Enter opening a sandbox's request
//! table and Esc coming back; `--sandbox PATTERN` listing only matching
//! sandboxes; and a stream holding garbage (terminal escapes, forged
//! lines, subjects that name no sandbox) skipped and counted, with no
//! escape taking effect and nothing claiming `verified`.

use std::path::Path;

use veris_receipt::{Entry, Line, RequestLine, SessionLine, LEDGER_VERSION};

use crate::fleet::start_gateway;
use crate::support::gateway::curl_charges;
use crate::support::nats::{with_js, Nats};
use crate::support::tmux::{sh_quote, Tmux, TUI_DEADLINE};
use crate::support::{self, bin, skip, tool_works, TempDir};

/// The TUI in a tmux pane: `veris tui --nats URL ARGS…`, its exit status
/// written to `<dir>/tui.status`.
fn start_tui(dir: &Path, nats: &Nats, args: &[&str]) -> Tmux {
    let tmux = Tmux::start(dir, 140, 36);
    let args: Vec<String> = args.iter().map(|a| sh_quote(a)).collect();
    tmux.respawn(&format!(
        "{} tui --nats {} --log-file {} {} 2> {}; echo $? > {}",
        sh_quote(&bin().display().to_string()),
        sh_quote(&nats.url()),
        sh_quote(&dir.join("tui.log").display().to_string()),
        args.join(" "),
        sh_quote(&dir.join("tui.stderr").display().to_string()),
        sh_quote(&dir.join("tui.status").display().to_string()),
    ));
    tmux
}

/// Quits with `q` and checks the exit status.
fn quit(tmux: &Tmux, dir: &Path) {
    tmux.keys(&["q"]);
    let status = support::wait_for("the TUI to exit", TUI_DEADLINE, || {
        std::fs::read_to_string(dir.join("tui.status")).ok()
    });
    let stderr = std::fs::read_to_string(dir.join("tui.stderr")).unwrap_or_default();
    assert_eq!(status.trim(), "0", "exit status; stderr: {stderr}");
}

/// The word after `integrity: ` on the screen's header line.
fn integrity_word(screen: &str) -> String {
    let line = screen
        .lines()
        .find(|l| l.trim_start().starts_with("integrity: "))
        .unwrap_or_else(|| panic!("no integrity line:\n{screen}"));
    line.trim_start()["integrity: ".len()..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect()
}

/// The row of sandbox `id` in the fleet list.
fn row<'a>(screen: &'a str, id: &str) -> Option<&'a str> {
    screen
        .lines()
        .find(|l| l.split_whitespace().any(|w| w.trim_matches('│') == id))
}

fn ok_tools() -> bool {
    if !tool_works("tmux", &["-V"]) {
        skip("tmux is not installed (apt-get install tmux)");
        return false;
    }
    true
}

/// A real gateway publishes two sandboxes' charges; the fleet view lists
/// each with its gateway and twin calls, shows a third sandbox live as it
/// starts calling, opens one with Enter (its requests in the request
/// table, its header the stream receipt's: not `verified` with no key
/// pinned) and comes back with Esc.
#[test]
fn fleet_view_lists_sandboxes_live_and_opens_one() {
    let Some(nats) = Nats::start() else { return };
    if !ok_tools() {
        return;
    }
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let dir = TempDir::new("fleet-tui");
    let gw = start_gateway("fleet-tui-gw", &nats, "gw1");
    let ca = gw.ca();
    let a = gw.add_sandbox("sbx-a", "stripe");
    let b = gw.add_sandbox("sbx-b", "stripe");
    assert_eq!(curl_charges(&a.url("socks5h"), 2, &ca), 2);
    assert_eq!(curl_charges(&b.url("socks5h"), 1, &ca), 1);
    crate::fleet::gateway_published(&gw, "sbx-a");
    crate::fleet::gateway_published(&gw, "sbx-b");

    let tmux = start_tui(dir.path(), &nats, &[]);
    let screen = tmux.wait_screen("both sandboxes' rows", TUI_DEADLINE, |s| {
        row(s, "sbx-a").is_some_and(|r| r.contains("gw1") && r.contains("stripe 2"))
            && row(s, "sbx-b").is_some_and(|r| r.contains("stripe 1"))
    });
    assert!(screen.contains("2 sandboxes · 1 gateways"), "{screen}");
    assert!(
        screen.contains("integrity: unverified (no key pinned; veris receipt --nats"),
        "{screen}"
    );

    // A sandbox that starts calling while the view is open.
    let c = gw.add_sandbox("sbx-c", "stripe");
    assert_eq!(curl_charges(&c.url("socks5h"), 3, &ca), 3);
    tmux.wait_screen("the new sandbox's row, live", TUI_DEADLINE, |s| {
        row(s, "sbx-c").is_some_and(|r| r.contains("stripe 3")) && s.contains("3 sandboxes")
    });

    // Filter to one, open it: its requests in the request table.
    tmux.keys(&["/", "sbx-a", "Enter"]);
    tmux.wait_screen("only sbx-a listed", TUI_DEADLINE, |s| {
        row(s, "sbx-a").is_some() && row(s, "sbx-b").is_none()
    });
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_screen("sbx-a's requests and its receipt", TUI_DEADLINE, |s| {
        s.contains("twin sbx-a")
            && s.lines()
                .filter(|l| l.contains("POST") && l.contains("/v1/charges") && l.contains(" 200 "))
                .count()
                == 2
            && !s.contains("integrity: pending")
    });
    assert_ne!(integrity_word(&screen), "verified", "{screen}");
    assert!(screen.contains("Esc  fleet"), "{screen}");
    // Seal lines are not kept for the table: their seqs are not missing.
    assert!(!screen.contains("seqs missing"), "{screen}");

    tmux.keys(&["Escape"]);
    tmux.wait_screen("the fleet list again", TUI_DEADLINE, |s| {
        s.contains("SANDBOX") && row(s, "sbx-a").is_some()
    });
    quit(&tmux, dir.path());
}

/// The stream's name for the tests that publish by hand, created as a
/// gateway creates it.
fn create_stream(nats: &Nats) {
    with_js(&nats.url(), async |js| {
        js.get_or_create_stream(async_nats::jetstream::stream::Config {
            name: veris_fleet::DEFAULT_STREAM.into(),
            subjects: vec!["veris.ledger.>".into(), "veris.checkpoint.>".into()],
            ..Default::default()
        })
        .await
        .expect("creating the stream");
    })
    .expect("NATS");
}

/// Publishes `payload` on `subject` as a gateway does (ledger id, seqs and
/// message id in headers).
fn publish(nats: &Nats, subject: &str, first: u64, last: u64, payload: Vec<u8>) {
    with_js(&nats.url(), async |js| {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(veris_fleet::HEADER_LEDGER, "0123456789abcdef");
        headers.insert(veris_fleet::HEADER_FIRST, first.to_string().as_str());
        headers.insert(veris_fleet::HEADER_LAST, last.to_string().as_str());
        headers.insert(
            "Nats-Msg-Id",
            format!("0123456789abcdef.{first}-{last}.{subject}").as_str(),
        );
        js.publish_with_headers(subject.to_string(), headers, payload.into())
            .await
            .expect("publish")
            .await
            .expect("publish ack");
    })
    .expect("NATS");
}

/// A session line and `requests` lines of sandbox `id`, as ledger lines.
fn ledger_lines(id: &str, requests: &[RequestLine]) -> Vec<u8> {
    let mut session = SessionLine::test();
    session.sandbox_id = id.into();
    let entries = std::iter::once(Entry::Session(session))
        .chain(requests.iter().cloned().map(Entry::Request));
    let mut out = Vec::new();
    for (i, entry) in entries.enumerate() {
        let line = Line {
            v: LEDGER_VERSION,
            seq: i as u64 + 1,
            ts: "2026-12-04T10:00:00.000Z".into(),
            entry,
            prev: "0".repeat(64),
        };
        out.extend(serde_json::to_vec(&line).expect("a line"));
        out.push(b'\n');
    }
    out
}

/// Someone with write access to the stream publishes garbage: a payload of
/// terminal escapes posing as veris's header, a forged ledger line whose
/// recorded words carry escapes, and a subject that names no sandbox. The
/// view lists only the sandboxes the pattern names, counts what it
/// skipped, and no escape takes effect (the screen is not cleared, the
/// pane's title is unchanged); the forged words show escaped, inside the
/// request table, and the header still says `unverified`.
#[test]
fn fleet_view_skips_garbage_and_filters_by_pattern() {
    let Some(nats) = Nats::start() else { return };
    if !ok_tools() {
        return;
    }
    let dir = TempDir::new("fleet-tui-garbage");
    create_stream(&nats);
    let charge = RequestLine::test("stripe", "POST", "/v1/charges");
    publish(
        &nats,
        "veris.ledger.ci-1.gw1",
        1,
        2,
        ledger_lines("ci-1", std::slice::from_ref(&charge)),
    );
    let mut forged = RequestLine::test("stripe\u{1b}[2J\u{1b}[H", "POST", "/v1/x");
    forged.path = "/v1/x\u{1b}]0;pwned\u{7}\u{1b}[2J\n integrity: verified".into();
    publish(
        &nats,
        "veris.ledger.ci-2.gw1",
        1,
        2,
        ledger_lines("ci-2", &[forged]),
    );
    publish(
        &nats,
        "veris.ledger.ci-3.gw1",
        1,
        1,
        b"\x1b]0;pwned\x07\x1b[2J\x1b[H integrity: verified \x1b[32m\n".to_vec(),
    );
    publish(
        &nats,
        "veris.ledger.ci-4.gw1.extra",
        1,
        2,
        ledger_lines("ci-4", std::slice::from_ref(&charge)),
    );
    publish(
        &nats,
        "veris.ledger.dev-1.gw1",
        1,
        2,
        ledger_lines("dev-1", &[charge]),
    );

    let tmux = start_tui(dir.path(), &nats, &["--sandbox", "ci-*", "--since", "all"]);
    let title = |tmux: &Tmux| {
        let out = tmux.run(&["display-message", "-p", "#{pane_title}"]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let screen = tmux.wait_screen("the matching sandboxes' rows", TUI_DEADLINE, |s| {
        row(s, "ci-1").is_some() && row(s, "ci-2").is_some() && s.contains("skipped")
    });
    assert!(row(&screen, "dev-1").is_none(), "the pattern: {screen}");
    assert!(
        row(&screen, "ci-3").is_none(),
        "garbage has no row: {screen}"
    );
    assert!(
        row(&screen, "ci-4").is_none(),
        "a bad subject has no row: {screen}"
    );
    assert!(
        screen.contains("skipped 2 malformed messages, 1 lines that are not ledger lines"),
        "{screen}"
    );
    assert!(screen.contains("2 sandboxes"), "{screen}");
    // The forged service name is shown quoted and escaped.
    let forged_row = row(&screen, "ci-2").unwrap();
    assert!(forged_row.contains("\"stripe\\u{1b}[2J"), "{forged_row}");
    assert_eq!(integrity_word(&screen), "unverified", "{screen}");
    assert!(!title(&tmux).contains("pwned"), "the pane's title changed");

    tmux.keys(&["/", "ci-2", "Enter", "Enter"]);
    let screen = tmux.wait_screen("ci-2's forged request, escaped", TUI_DEADLINE, |s| {
        s.contains("twin ci-2") && s.contains("\\u{1b}") && !s.contains("integrity: pending")
    });
    assert_ne!(integrity_word(&screen), "verified", "{screen}");
    // Only the header's line starts with the integrity word: the forged
    // path stays inside its quoted cell.
    let claims = screen
        .lines()
        .filter(|l| l.trim_start().starts_with("integrity:"))
        .count();
    assert_eq!(claims, 1, "{screen}");
    assert!(!title(&tmux).contains("pwned"), "the pane's title changed");
    quit(&tmux, dir.path());
}

/// Bad input is told before the terminal is taken, with what to do next:
/// a pattern NATS would read as more than a token, a start that is not a
/// duration, a server that does not answer, a stream that does not exist.
#[test]
fn fleet_view_refuses_bad_input_with_a_next_step() {
    let Some(nats) = Nats::start() else { return };
    let url = nats.url();
    let cases: [(&[&str], &str); 4] = [
        (
            &["--nats", &url, "--sandbox", "a.b"],
            "--sandbox with --nats. Next:",
        ),
        (&["--nats", &url, "--since", "5x"], "bad --since \"5x\""),
        (&["--nats", "nats://127.0.0.1:1"], "Next: check the URL"),
        (
            &["--nats", &url, "--nats-stream", "NOPE"],
            "Next: check the URL, --nats-creds and --nats-stream",
        ),
    ];
    for (args, want) in cases {
        let out = support::output(support::veris(["tui"]).args(args));
        let (stdout, stderr) = support::text(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stdout}{stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}

/// With the gateway's seal key pinned (`--key`), a sandbox opened from
/// the list reads `verified` exactly as `veris receipt --nats --key` does
/// (a stopped gateway: its chain ends in its final seal; a canary probe
/// from inside), while the list itself still says nothing is checked there.
#[test]
fn fleet_view_verifies_only_an_opened_sandbox_with_a_pinned_key() {
    let Some(nats) = Nats::start() else { return };
    if !ok_tools() {
        return;
    }
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let dir = TempDir::new("fleet-tui-key");
    let mut gw = start_gateway("fleet-tui-key", &nats, "gw1");
    let key = gw.ready["seal_key"].as_str().expect("seal_key").to_string();
    let sbx = gw.add_sandbox("sbx-k", "stripe");
    assert_eq!(curl_charges(&sbx.url("socks5h"), 2, &gw.ca()), 2);
    crate::support::gateway::probe_canary(&sbx.url("socks5h"), &gw.ca());
    crate::fleet::gateway_published(&gw, "sbx-k");
    gw.stop();

    let tmux = start_tui(dir.path(), &nats, &["--key", &key, "--since", "all"]);
    let screen = tmux.wait_screen("the sandbox's row", TUI_DEADLINE, |s| {
        row(s, "sbx-k").is_some_and(|r| r.contains("stripe 2"))
    });
    assert_eq!(integrity_word(&screen), "not", "{screen}");
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_screen("the opened sandbox's receipt", TUI_DEADLINE, |s| {
        s.contains("twin sbx-k") && !s.contains("integrity: pending")
    });
    assert_eq!(integrity_word(&screen), "verified", "{screen}");
    tmux.keys(&["Escape"]);
    let screen = tmux.wait_screen("the list again", TUI_DEADLINE, |s| s.contains("SANDBOX"));
    assert_eq!(integrity_word(&screen), "not", "{screen}");
    quit(&tmux, dir.path());
}
