//! `veris doctor` against real state dirs: none, one with a CA, one made
//! world-writable, one with a live `veris serve`, and one whose `admin.addr`
//! names a dead port. Every child gets the environment the test means
//! (`support::veris` clears it), so the machine's CA variables never count.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;

use support::*;

/// `veris doctor --state-dir STATE` with `env` added to a cleared environment.
fn doctor(state: &Path, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = veris(["doctor", "--state-dir"]);
    cmd.arg(state);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out: Output = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    assert!(stderr.trim().is_empty(), "doctor wrote to stderr: {stderr}");
    (out.status.code(), stdout)
}

/// The report's line for `check` (`ok   ca: …`, `FAIL ca: …`).
fn line<'a>(report: &'a str, check: &str) -> &'a str {
    report
        .lines()
        .find(|l| {
            l.get(5..)
                .is_some_and(|rest| rest.starts_with(&format!("{check}: ")))
        })
        .unwrap_or_else(|| panic!("no {check} line in:\n{report}"))
}

fn level<'a>(report: &'a str, check: &str) -> &'a str {
    line(report, check)[..4].trim_end()
}

fn ca_init(state: &Path) {
    let out = output(veris(["ca", "init", "--state-dir"]).arg(state));
    assert!(out.status.success(), "{:?}", text(&out));
}

#[test]
fn a_fresh_state_dir_says_the_ca_comes_on_first_use_and_passes_once_made() {
    let dir = TempDir::new("doctor-fresh");
    let state = dir.join("state");
    let (code, report) = doctor(&state, &[]);
    // No CA yet is no failure: `run` and `serve` create it on first use.
    assert_eq!(code, Some(0), "{report}");
    let ca = line(&report, "ca");
    assert!(ca.starts_with("ok   ca: no CA yet in"), "{ca}");
    assert!(ca.contains("create it on first use"), "{ca}");
    assert!(
        ca.contains(&format!("`veris ca init --state-dir {}`", state.display())),
        "{ca}"
    );
    // One line per check, every problem with its next step.
    for check in [
        "ca",
        "clock",
        "trust files",
        "system trust",
        "permissions",
        "env",
        "userns",
        "nft",
        "proxy",
        "canary",
    ] {
        let l = line(&report, check);
        assert!(l.starts_with("ok ") || l.contains(". Next: "), "{l}");
    }
    assert!(report.trim_end().ends_with("ok"), "{report}");

    ca_init(&state);
    let (code, report) = doctor(&state, &[]);
    assert_eq!(code, Some(0), "warnings only:\n{report}");
    for check in ["ca", "clock", "trust files", "permissions"] {
        assert_eq!(level(&report, check), "ok", "{report}");
    }
    // No proxy variable in this (cleared) environment: a warning, not a failure.
    assert_eq!(level(&report, "env"), "warn", "{report}");
    assert_eq!(level(&report, "proxy"), "warn", "{report}");
}

#[test]
fn loose_permissions_fail_naming_the_path() {
    let dir = TempDir::new("doctor-perms");
    let state = dir.join("state");
    ca_init(&state);
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (code, report) = doctor(&state, &[]);
    assert_eq!(code, Some(2), "{report}");
    let perms = line(&report, "permissions");
    assert!(
        perms.starts_with("FAIL permissions: writable by group or others"),
        "{perms}"
    );
    assert!(
        perms.contains(&format!("{} (0777)", state.display())),
        "{perms}"
    );
    assert!(
        perms.contains(&format!("Next: chmod go-w {}", state.display())),
        "{perms}"
    );
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();

    // A secret readable by others: named too.
    let token = state.join("admin.token");
    std::fs::write(&token, "not a real token\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, report) = doctor(&state, &[]);
    assert_eq!(code, Some(2), "{report}");
    let perms = line(&report, "permissions");
    assert!(
        perms.contains(&format!("{} (0644)", token.display())),
        "{perms}"
    );
    assert!(!report.contains("not a real token"), "{report}");
}

#[test]
fn a_live_serve_has_its_proxy_and_canary_ok_and_the_env_is_judged() {
    let mut serve = Serve::start("doctor-live", &[]);
    let bundle = serve.state.join("trust").join("bundle.pem");
    let bundle = bundle.to_str().unwrap();
    let (code, report) = doctor(&serve.state, &[]);
    assert_eq!(code, Some(0), "{report}");
    let proxy = line(&report, "proxy");
    assert!(proxy.starts_with("ok   proxy: live at http://"), "{proxy}");
    assert!(proxy.contains(&serve.proxy_url), "{proxy}");
    let canary = line(&report, "canary");
    assert!(
        canary.starts_with("ok   canary: canary answered by this run"),
        "{canary}"
    );
    assert!(!report.contains(&serve.token()), "{report}");

    // A shell pointed at this proxy and bundle.
    let (code, report) = doctor(
        &serve.state,
        &[
            ("HTTPS_PROXY", &serve.proxy_url),
            ("https_proxy", &serve.proxy_url),
            ("SSL_CERT_FILE", bundle),
            ("CURL_CA_BUNDLE", bundle),
        ],
    );
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(level(&report, "env"), "ok", "{report}");

    // ... at another proxy, and a bundle without the veris CA.
    let other = serve.dir.join("other.pem");
    std::fs::write(&other, "").unwrap();
    let (code, report) = doctor(
        &serve.state,
        &[
            ("HTTPS_PROXY", "http://127.0.0.1:9"),
            ("SSL_CERT_FILE", other.to_str().unwrap()),
        ],
    );
    assert_eq!(code, Some(2), "{report}");
    let env = line(&report, "env");
    assert!(env.starts_with("FAIL env: "), "{env}");
    assert!(
        env.contains(&format!(
            "HTTPS_PROXY=http://127.0.0.1:9 but this state dir's proxy is {}",
            serve.proxy_url
        )),
        "{env}"
    );
    assert!(
        env.contains("which does not hold this state dir's CA"),
        "{env}"
    );
    assert!(env.contains("Next: "), "{env}");

    // Stopped: the announcement is gone, so no proxy is a warning again.
    serve.stop();
    let (_, report) = doctor(&serve.state, &[]);
    assert_eq!(level(&report, "proxy"), "warn", "{report}");
}

#[test]
fn an_admin_addr_naming_a_dead_port_fails_with_a_next_step() {
    let dir = TempDir::new("doctor-dead");
    let state = dir.join("state");
    ca_init(&state);
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    std::fs::write(state.join("admin.addr"), format!("{dead}\n")).unwrap();
    let token = state.join("admin.token");
    std::fs::write(&token, "0123456789abcdef\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (code, report) = doctor(&state, &[]);
    assert_eq!(code, Some(2), "{report}");
    let proxy = line(&report, "proxy");
    assert!(proxy.starts_with("FAIL proxy: "), "{proxy}");
    assert!(proxy.contains(&dead.to_string()), "{proxy}");
    assert!(
        proxy.contains(&format!(
            "Next: start `veris serve --state-dir {}`",
            state.display()
        )),
        "{proxy}"
    );
    assert!(!report.contains("0123456789abcdef"), "{report}");
}

/// Red team F4: `admin.addr` and `admin.token` copied from another state
/// dir's live proxy. That proxy answers `/status` to the token, but it
/// writes the other state dir's ledger: doctor must say so and judge
/// nothing (canary, env) against it.
#[test]
fn admin_files_copied_from_another_state_dirs_proxy_fail() {
    let theirs = Serve::start("doctor-theirs", &[]);
    let mut ours = Serve::start("doctor-ours", &[]);
    // Ours has a ledger of its own (stopped: its announcement is gone).
    ours.stop();
    for name in ["admin.addr", "admin.token"] {
        std::fs::copy(theirs.state.join(name), ours.state.join(name)).unwrap();
    }
    let (code, report) = doctor(&ours.state, &[("HTTPS_PROXY", &theirs.proxy_url)]);
    assert_eq!(code, Some(2), "{report}");
    let proxy = line(&report, "proxy");
    assert!(
        proxy.starts_with("FAIL proxy: the proxy at http://"),
        "{proxy}"
    );
    assert!(
        proxy.contains("is not the one writing this state dir's ledger"),
        "{proxy}"
    );
    let run = theirs.ledger_lines()[0]["run_id"]
        .as_str()
        .expect("the session line's run_id")
        .to_string();
    assert!(proxy.contains(&run), "{proxy}");
    assert!(
        proxy.contains(&format!(
            "Next: {s}/admin.addr and {s}/admin.token name another state dir's proxy",
            s = ours.state.display()
        )),
        "{proxy}"
    );
    assert_eq!(level(&report, "canary"), "warn", "{report}");
    assert!(!report.contains(&theirs.token()), "{report}");
    // The proxy itself, asked through its own state dir, is fine.
    let (code, report) = doctor(&theirs.state, &[]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(level(&report, "proxy"), "ok", "{report}");
}

/// A serve given `--ca-dir` uses that CA: doctor checks it with the same
/// flag (and without it says the state dir's default CA is missing, with a
/// fix that names the flags).
#[test]
fn ca_dir_checks_the_ca_serve_uses() {
    let dir = TempDir::new("doctor-ca-dir");
    let ca_dir = dir.join("own-ca");
    let ca_arg = ca_dir.to_str().unwrap().to_string();
    let serve = Serve::start_in(
        dir,
        &["--workload-uid", DECLARED_WORKLOAD_UID, "--ca-dir", &ca_arg],
    );
    assert!(!serve.state.join("ca").exists(), "serve used <state>/ca");

    let (code, report) = doctor(&serve.state, &[]);
    assert_eq!(code, Some(2), "{report}");
    // A live proxy with no CA here uses another one: that is a failure.
    let ca = line(&report, "ca");
    assert!(ca.starts_with("FAIL ca: no CA in"), "{report}");
    assert!(ca.contains("--ca-dir"), "{ca}");

    let mut cmd = veris(["doctor", "--state-dir"]);
    cmd.arg(&serve.state).arg("--ca-dir").arg(&ca_dir);
    let out = output(&mut cmd);
    let (report, stderr) = text(&out);
    assert!(stderr.trim().is_empty(), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{report}");
    let ca = line(&report, "ca");
    assert!(ca.starts_with("ok   ca: "), "{ca}");
    assert!(ca.contains(&ca_arg), "{ca}");
    for check in ["clock", "trust files", "permissions", "proxy", "canary"] {
        assert_eq!(level(&report, check), "ok", "{report}");
    }
    assert!(line(&report, "permissions").contains(&ca_arg), "{report}");

    // That CA dir opened to others: judged as <state>/ca would be.
    std::fs::set_permissions(&ca_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = output(&mut cmd);
    let (report, _) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{report}");
    let perms = line(&report, "permissions");
    assert!(perms.contains(&format!("{ca_arg} (0755)")), "{perms}");
    std::fs::set_permissions(&ca_dir, std::fs::Permissions::from_mode(0o700)).unwrap();

    // No CA there: the fix names both flags.
    let empty = serve.dir.join("no-ca");
    let mut cmd = veris(["doctor", "--state-dir"]);
    cmd.arg(&serve.state).arg("--ca-dir").arg(&empty);
    let (report, _) = text(&output(&mut cmd));
    let ca = line(&report, "ca");
    assert!(
        ca.contains(&format!(
            "Next: `veris ca init --state-dir {} --ca-dir {}`",
            serve.state.display(),
            empty.display()
        )),
        "{ca}"
    );
}

/// A secret that is a symlink: the report says where it leads and how to
/// replace the link, not a chmod (which would change only the target).
#[test]
fn a_linked_secret_names_its_target_and_how_to_replace_it() {
    let dir = TempDir::new("doctor-links");
    let state = dir.join("state");
    ca_init(&state);
    let elsewhere = dir.join("elsewhere-token");
    std::fs::write(&elsewhere, "not a real token\n").unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o600)).unwrap();
    let token = state.join("admin.token");
    std::os::unix::fs::symlink(&elsewhere, &token).unwrap();
    let target = std::fs::canonicalize(&elsewhere).unwrap();

    let (code, report) = doctor(&state, &[]);
    assert_eq!(code, Some(2), "{report}");
    let perms = line(&report, "permissions");
    assert!(
        perms.starts_with("FAIL permissions: secrets that are symlinks: "),
        "{perms}"
    );
    assert!(
        perms.contains(&format!("{} -> {}", token.display(), target.display())),
        "{perms}"
    );
    assert!(perms.contains("can read or swap"), "{perms}");
    assert!(
        perms.contains(&format!(
            "`cp --remove-destination {t} {l} && chmod 600 {l}`",
            t = target.display(),
            l = token.display()
        )),
        "{perms}"
    );
    assert!(!perms.contains("chmod go-rwx"), "{perms}");
    assert!(!report.contains("not a real token"), "{report}");

    // The CA dir as a link: use --ca-dir instead.
    std::fs::remove_file(&token).unwrap();
    let real_ca = dir.join("real-ca");
    std::fs::rename(state.join("ca"), &real_ca).unwrap();
    std::os::unix::fs::symlink(&real_ca, state.join("ca")).unwrap();
    let (code, report) = doctor(&state, &[]);
    assert_eq!(code, Some(2), "{report}");
    let perms = line(&report, "permissions");
    let real_ca = std::fs::canonicalize(&real_ca).unwrap();
    assert!(
        perms.contains(&format!("pass `--ca-dir {}`", real_ca.display())),
        "{perms}"
    );
    assert!(!perms.contains("chmod go-rwx"), "{perms}");
}

/// H4: doctor says when a pin can never give `verified`: a `seal.key` an
/// earlier veris left holds a key that sat on disk.
#[test]
fn a_seal_key_left_on_disk_is_named_as_a_custody_problem() {
    let dir = TempDir::new("doctor-custody");
    let state = dir.join("state");
    ca_init(&state);
    let (_, report) = doctor(&state, &[]);
    assert_eq!(level(&report, "custody"), "ok", "{report}");
    let key = state.join("seal.key");
    std::fs::write(&key, b"old key").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (_, report) = doctor(&state, &[]);
    let custody = line(&report, "custody");
    assert!(
        custody.starts_with("warn custody: ") && custody.contains("can never be verified"),
        "{custody}"
    );
    assert!(
        custody.contains(&format!("Next: delete {}", key.display())),
        "{custody}"
    );
}
