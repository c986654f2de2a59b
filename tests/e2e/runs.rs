//! End-to-end tests of how the readers of a state dir find the ledgers of
//! `veris run` (`<state>/runs/<id>/ledger.jsonl`): `veris receipt`, `har`,
//! `baseline`, `doctor` and `tui` after a run, `--run ID`, `veris runs`, and
//! what a workload of the same uid can plant there (run dirs holding a
//! copied or forged ledger, a symlinked run dir, ids that climb out).

use crate::support;

use std::path::{Path, PathBuf};

use serde_json::Value;
use support::{output, skip, text, veris, TempDir};

/// `veris run --state-dir STATE -- curl …` (one charge): the run id and the
/// seal key fingerprint it printed.
fn charge_run(state: &Path) -> (String, String) {
    let mut cmd = veris(["run", "--state-dir"]);
    cmd.arg(state)
        .args(["--require", "stripe:1", "--"])
        .args(support::CURL_CHARGE);
    let out = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let key = stderr
        .split("--key ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .unwrap_or_else(|| panic!("no key printed: {stderr}"))
        .to_string();
    let ids = run_ids(state);
    assert_eq!(ids.len(), 1, "{ids:?}");
    (ids[0].clone(), key)
}

fn run_ids(state: &Path) -> Vec<String> {
    std::fs::read_dir(state.join("runs"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn run_dir(state: &Path, id: &str) -> PathBuf {
    state.join("runs").join(id)
}

/// `veris ARGS`: exit code, stdout, stderr.
fn veris_out(args: &[&str]) -> (i32, String, String) {
    let out = output(&mut veris(args));
    let (stdout, stderr) = text(&out);
    (out.status.code().unwrap_or(-1), stdout, stderr)
}

#[test]
fn every_reader_of_a_state_dir_finds_the_run() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let dir = TempDir::new("runs-readers");
    let state = dir.join("state");
    let (id, key) = charge_run(&state);
    let s = state.to_str().unwrap();

    // The receipt: the run's, read from its ledger, naming which run it read.
    let (code, stdout, stderr) = veris_out(&["receipt", "--state-dir", s]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("1 request(s) reached the twin"), "{stdout}");
    assert!(stdout.contains("POST \"/v1/charges\" -> 200"), "{stdout}");
    assert!(stderr.contains(&format!("reading run {id}")), "{stderr}");
    // Without a pin, a finished run is unverified: its key is gone.
    assert!(stdout.contains("integrity: unverified"), "{stdout}");
    // With the key the run printed, and by its id: verified.
    let (code, stdout, stderr) =
        veris_out(&["receipt", "--state-dir", s, "--run", &id, "--key", &key]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("integrity: verified"), "{stdout}");

    // The HAR of the same window.
    let (code, stdout, stderr) = veris_out(&["har", "--state-dir", s]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let har: Value = serde_json::from_str(&stdout).expect("HAR JSON");
    assert_eq!(
        har["log"]["entries"].as_array().map(Vec::len),
        Some(1),
        "{stdout}"
    );
    let (code, stdout, _) = veris_out(&["har", "--state-dir", s, "--run", &id]);
    assert_eq!(code, 0);
    assert!(stdout.contains("/v1/charges"), "{stdout}");

    // A baseline marks the end of the run's ledger, and the receipt since it is empty.
    let (code, token, stderr) = veris_out(&["baseline", "--state-dir", s]);
    assert_eq!(code, 0, "{token}\n{stderr}");
    let token = token.trim();
    assert!(token.starts_with("vb2:"), "{token}");
    let (code, stdout, _) = veris_out(&["receipt", "--state-dir", s, "--since", token]);
    assert_eq!(code, 3, "{stdout}");
    assert!(stdout.contains("0 requests reached the twin"), "{stdout}");

    // The doctor names the ledger the readers read.
    let (_, stdout, _) = veris_out(&["doctor", "--state-dir", s]);
    let line = stdout
        .lines()
        .find(|l| l.contains("ledger:"))
        .unwrap_or_else(|| panic!("no ledger line: {stdout}"));
    assert!(
        line.starts_with("ok") && line.contains(&format!("run {id}")),
        "{line}"
    );

    // The listing: id, start, the command quoted, the verdict of its ledger.
    let (code, stdout, stderr) = veris_out(&["runs", "--state-dir", s]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let row = stdout
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("no row for {id}: {stdout}"));
    assert!(row.contains("unverified"), "{row}");
    assert!(row.contains("\"curl\" \"-sS\""), "{row}");
    assert!(stdout.contains("without a pin"), "{stdout}");
    let (code, stdout, _) = veris_out(&["runs", "--state-dir", s, "--json"]);
    assert_eq!(code, 0);
    let runs: Value = serde_json::from_str(&stdout).expect("runs JSON");
    assert_eq!(runs[0]["id"], id.as_str(), "{runs}");
    assert_eq!(runs[0]["command"][0], "curl", "{runs}");
    assert_eq!(runs[0]["verdict"]["integrity"], "unverified", "{runs}");
    assert_eq!(runs[0]["verdict"]["requests"], 1, "{runs}");
    assert!(
        runs[0]["started"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{runs}"
    );
}

#[test]
fn an_empty_state_dir_says_what_is_there_and_what_to_do() {
    let dir = TempDir::new("runs-empty");
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let s = state.to_str().unwrap();
    for args in [
        vec!["receipt", "--state-dir", s],
        vec!["har", "--state-dir", s],
        vec!["baseline", "--state-dir", s],
    ] {
        let (code, stdout, stderr) = veris_out(&args);
        assert_eq!(code, 1, "{args:?}: {stdout}\n{stderr}");
        assert!(stderr.contains("holds no run"), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "Next: run a command under veris (`veris run --state-dir {s} -- CMD`)"
            )),
            "{args:?}: {stderr}"
        );
    }
    let (code, stdout, _) = veris_out(&["runs", "--state-dir", s]);
    assert_eq!(code, 0);
    assert!(stdout.contains("holds no run"), "{stdout}");
    let (code, stdout, _) = veris_out(&["runs", "--state-dir", s, "--json"]);
    assert_eq!(code, 0);
    assert_eq!(stdout.trim(), "[]");
}

#[test]
fn a_run_id_that_climbs_out_is_refused_by_every_reader() {
    let dir = TempDir::new("runs-climb");
    let state = dir.join("state");
    // What `../x` would name from the runs dir, holding a ledger.
    std::fs::create_dir_all(state.join("x")).unwrap();
    std::fs::write(state.join("x").join("ledger.jsonl"), "").unwrap();
    let s = state.to_str().unwrap();
    for args in [
        vec!["receipt", "--state-dir", s, "--run", "../x"],
        vec!["har", "--state-dir", s, "--run", "../x"],
        vec!["baseline", "--state-dir", s, "--run", "../x"],
        vec!["tui", "--state-dir", s, "--run", "../x"],
        vec!["receipt", "--state-dir", s, "--run", "../../x"],
    ] {
        let (code, stdout, stderr) = veris_out(&args);
        assert_eq!(code, 1, "{args:?}: {stdout}\n{stderr}");
        assert!(stderr.contains("not a run id"), "{args:?}: {stderr}");
    }
}

#[test]
fn a_run_dir_the_workload_planted_never_reads_verified() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let dir = TempDir::new("runs-planted");
    let state = dir.join("state");
    let (id, key) = charge_run(&state);
    let s = state.to_str().unwrap();
    let real = run_dir(&state, &id).join("ledger.jsonl");
    let ledger = std::fs::read_to_string(&real).unwrap();

    // A copy of the real run's sealed ledger under another id (and the
    // real run's command beside it): every seal is the real key's.
    let copy = "0000000000000001";
    std::fs::create_dir_all(run_dir(&state, copy)).unwrap();
    std::fs::write(run_dir(&state, copy).join("ledger.jsonl"), &ledger).unwrap();
    for f in ["ledger.pub", "run.json"] {
        std::fs::copy(run_dir(&state, &id).join(f), run_dir(&state, copy).join(f)).unwrap();
    }
    let (code, stdout, stderr) =
        veris_out(&["receipt", "--state-dir", s, "--run", copy, "--key", &key]);
    assert_eq!(code, 3, "{stdout}\n{stderr}");
    assert!(stdout.contains("integrity: failed"), "{stdout}");
    assert!(stdout.contains("is the ledger of run"), "{stdout}");

    // A forged run claiming to be the newest: its session line says 2099
    // and its request a call that never happened.
    let forged = "0000000000000002";
    let text = ledger
        .replacen(
            &ledger[ledger.find("\"ts\":\"").unwrap() + 6..][..4],
            "2099",
            1,
        )
        .replace("/v1/charges", "/v1/refunds");
    std::fs::create_dir_all(run_dir(&state, forged)).unwrap();
    std::fs::write(run_dir(&state, forged).join("ledger.jsonl"), text).unwrap();
    std::fs::copy(
        run_dir(&state, &id).join("ledger.pub"),
        run_dir(&state, forged).join("ledger.pub"),
    )
    .unwrap();
    // Picked as the newest, it is read, and fails, pinned or not.
    for extra in [vec![], vec!["--key", key.as_str()]] {
        let mut args = vec!["receipt", "--state-dir", s];
        args.extend(extra);
        let (code, stdout, stderr) = veris_out(&args);
        assert!(
            stderr.contains(&format!("reading run {forged}")),
            "{stderr}"
        );
        assert!(!stdout.contains("integrity: verified"), "{stdout}");
        assert!(stdout.contains("integrity: failed"), "{stdout}");
        assert_eq!(code, 3, "{stdout}\n{stderr}");
    }

    // A run dir that is a link to the real one: listed, never read.
    let link = "0000000000000003";
    std::os::unix::fs::symlink(run_dir(&state, &id), run_dir(&state, link)).unwrap();
    let (code, _, stderr) = veris_out(&["receipt", "--state-dir", s, "--run", link, "--key", &key]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("symlink"), "{stderr}");

    // The listing shows all four; none of the planted ones reads verified,
    // and the real one is the only one its key verifies.
    let (code, stdout, _) = veris_out(&["runs", "--state-dir", s, "--json"]);
    assert_eq!(code, 0);
    let runs: Value = serde_json::from_str(&stdout).unwrap();
    let by_id = |want: &str| {
        runs.as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == want)
            .unwrap_or_else(|| panic!("{want} not listed: {runs}"))
            .clone()
    };
    assert_eq!(runs[0]["id"], forged, "the newest by its own words: {runs}");
    assert_eq!(by_id(forged)["verdict"]["integrity"], "failed", "{runs}");
    assert_eq!(by_id(copy)["verdict"]["integrity"], "failed", "{runs}");
    assert!(
        by_id(link)["unreadable"]
            .as_str()
            .unwrap()
            .contains("symlink"),
        "{runs}"
    );
    assert_eq!(by_id(&id)["verdict"]["integrity"], "unverified", "{runs}");
    let (code, stdout, _) = veris_out(&["receipt", "--state-dir", s, "--run", &id, "--key", &key]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("integrity: verified"), "{stdout}");
}
