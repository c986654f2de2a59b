//! What a gateway sandbox's readers show (DESIGN §13, issue G1): `veris
//! tui --sandbox` and `veris receipt --sandbox` must say the same of one
//! sandbox, before and after its canary probe.
//!
//! The attack: a reader who trusts the TUI's header is told something
//! other than the receipt (a custody doubt the receipt does not have, or
//! a "verified" the receipt does not give).

use crate::support::gateway::*;
use crate::support::tmux::TUI_DEADLINE;
use crate::support::{self, command, output, skip, text, tool_works, TempDir};

/// What follows `integrity: ` on the receipt's interception line, and the
/// interception word before it.
fn receipt_words(receipt: &str) -> (String, String) {
    let line = receipt
        .lines()
        .find(|l| l.trim_start().starts_with("interception: "))
        .unwrap_or_else(|| panic!("no interception line in the receipt:\n{receipt}"));
    let (interception, integrity) = line
        .trim_start()
        .trim_start_matches("interception: ")
        .split_once("   integrity: ")
        .unwrap_or_else(|| panic!("no integrity on the interception line: {line}"));
    (interception.to_string(), integrity.trim_end().to_string())
}

/// Whether the TUI's header says what the receipt says: its integrity line
/// (cut at the pane's width) is the start of the receipt's, and its first
/// line names the receipt's interception.
fn screen_agrees(screen: &str, interception: &str, integrity: &str) -> bool {
    let mut lines = screen.lines();
    let first = lines.next().unwrap_or_default();
    let Some(shown) = lines.find_map(|l| l.trim_start().strip_prefix("integrity: ")) else {
        return false;
    };
    let shown = shown.trim_end();
    first.contains(&format!("· {interception} "))
        && !shown.is_empty()
        && integrity.starts_with(shown)
        && shown.len() >= integrity.len().min(60)
}

/// A gateway sandbox seen by `veris tui --sandbox` and `veris receipt
/// --sandbox` while the gateway is live: with no canary probe both read
/// `unverified (no canary probe from the sandbox …)`; after a probe through
/// the sandbox's credential both read `verified`. (The TUI used to show the
/// gateway's own `GET /receipt`, which judged custody as for a serve whose
/// workload may share its uid.)
#[test]
fn tui_and_receipt_of_a_sandbox_agree_before_and_after_its_probe() {
    if !tool_works("tmux", &["-V"]) {
        return skip("tmux is not installed (apt-get install tmux)");
    }
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let dir = TempDir::new("gwv-tui");
    let mut gw = Gateway::start("gwv-tui", "127.0.0.1:0", &[]);
    let a = gw.add_sandbox_json("sbx-a", "stripe");
    let ca = gw.ca();
    let tmux = gw.tui(&dir, "sbx-a", (200, 30), &["--receipt-every", "1"]);

    let receipt = gw.receipt_text("sbx-a");
    let (interception, integrity) = receipt_words(&receipt);
    assert_eq!(interception, "gateway", "{receipt}");
    assert!(
        integrity.starts_with(&format!("unverified ({NO_PROBE}")),
        "no probe yet: {receipt}"
    );
    tmux.keys(&["r"]);
    tmux.wait_screen(
        &format!("the TUI's header to read as the receipt: `{integrity}`"),
        TUI_DEADLINE,
        |s| screen_agrees(s, &interception, &integrity),
    );

    // The canary probe, through A's credential as its platform sends it.
    let answer = probe_canary(&a.url("socks5h"), &ca);
    assert_eq!(answer["sandbox_id"], "sbx-a", "{answer}");

    let receipt = gw.receipt_text("sbx-a");
    let (interception, integrity) = receipt_words(&receipt);
    assert_eq!(integrity, "verified", "after the probe: {receipt}");
    tmux.keys(&["r"]);
    tmux.wait_screen(
        "the TUI's header to read `integrity: verified` as the receipt does",
        TUI_DEADLINE,
        |s| screen_agrees(s, &interception, &integrity),
    );
    tmux.keys(&["q"]);
    gw.stop();
}

/// The backquoted command of `hint` that starts with `program `, as argv.
fn hinted(hint: &str, program: &str) -> Vec<String> {
    let start = hint
        .find(&format!("`{program} "))
        .unwrap_or_else(|| panic!("no `{program} …` command in the hint: {hint}"));
    let rest = &hint[start + 1..];
    let end = rest
        .find('`')
        .unwrap_or_else(|| panic!("unclosed command in the hint: {hint}"));
    rest[..end].split_whitespace().map(str::to_string).collect()
}

/// The receipt's canary check detail for a sandbox.
fn canary_detail(gw: &Gateway, id: &str) -> String {
    let receipt = gw.receipt_json(id);
    receipt["integrity"]["checks"]
        .as_array()
        .and_then(|checks| checks.iter().find(|c| c["name"] == "canary"))
        .and_then(|c| c["detail"].as_str())
        .unwrap_or_else(|| panic!("no canary check in the receipt of {id}: {receipt}"))
        .to_string()
}

/// The receipt of a sandbox with no canary probe tells how to probe: the
/// printed curl command, run as printed through the sandbox's credential
/// (`socks5h://`, and `socks5://` where curl sends the hint's address, as
/// a platform's redirect does), and the printed `veris check --gateway`,
/// each turn that sandbox's receipt `verified`. The hint needs no DNS in
/// the sandbox (the old one, a plain `curl https://canary…`, did), and it
/// is the same for a sandbox whose workload filled its ledger with a
/// hint-like text of its own.
#[test]
fn the_receipts_probe_hint_works_as_printed() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let mut gw = Gateway::start("gwv-hint", "127.0.0.1:0", &[]);
    let ca = gw.ca();
    let a = gw.add_sandbox_json("sbx-a", "stripe");
    let b = gw.add_sandbox_json("sbx-b", "stripe");
    let c = gw.add_sandbox_json("sbx-c", "stripe");
    // B's workload puts a command of its own into its ledger.
    let planted = format!("{HTTPS_CHARGES}?next=%60curl%20https%3A%2F%2Fevil.example%60");
    charge_ok_to(&b.url("socks5h"), &planted, &ca, "B's call");

    let hint = canary_detail(&gw, "sbx-a");
    assert!(hint.starts_with(NO_PROBE), "{hint}");
    let curl = hinted(&hint, "curl");
    // Checked before anything runs: a hint without an address would make
    // curl ask real DNS for the canary host.
    let resolve = curl
        .iter()
        .position(|a| a == "--resolve")
        .and_then(|i| curl.get(i + 1))
        .unwrap_or_else(|| panic!("the hint's curl needs DNS (no --resolve): {hint}"));
    let ip = resolve.rsplit(':').next().unwrap_or_default();
    assert!(
        ip.parse::<std::net::IpAddr>().is_ok(),
        "the hint resolves the canary host to an address: {hint}"
    );
    assert_eq!(
        canary_detail(&gw, "sbx-b"),
        hint,
        "the hint is veris's own words, whatever the sandbox sent"
    );

    for (sandbox, scheme) in [(&a, "socks5h"), (&b, "socks5")] {
        let out = output(
            command("curl")
                .args(&curl[1..])
                .args(["-sS", "--max-time", "15", "--proxy", &sandbox.url(scheme)])
                .arg("--cacert")
                .arg(&ca),
        );
        let (stdout, stderr) = text(&out);
        assert!(
            out.status.success(),
            "{curl:?} through {scheme}: {stdout}{stderr}\n{}",
            gw.stderr()
        );
        assert_eq!(support::json(&stdout)["sandbox_id"], sandbox.id.as_str());
        let receipt = gw.receipt_json(&sandbox.id);
        assert_eq!(
            receipt["integrity"]["status"], "verified",
            "after the hinted probe through {scheme}: {receipt}"
        );
    }

    // The other command, with C's canary for the placeholder.
    let check: Vec<String> = hinted(&hint, "veris")
        .into_iter()
        .map(|a| match a.as_str() {
            "CANARY" => c.canary.clone().expect("add-sandbox --json gives a canary"),
            _ => a,
        })
        .collect();
    let out = output(
        gw.veris(&check[1..].iter().map(String::as_str).collect::<Vec<_>>())
            .env("ALL_PROXY", c.url("socks5h")),
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{check:?}: {stdout}{stderr}");
    let receipt = gw.receipt_json("sbx-c");
    assert_eq!(
        receipt["integrity"]["status"], "verified",
        "after the hinted check: {receipt}"
    );
    gw.stop();
}
