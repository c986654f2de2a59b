//! End-to-end tests of DESIGN §7a rule 15, with the command under
//! `veris run` as the attacker (it runs as veris's own uid):
//!
//! - **Report files are veris's alone.** The command replaces `--receipt`
//!   and `--junit` with a FIFO (a regression hangs; the run has a
//!   deadline), a symlink to another file (which must stay untouched), a
//!   directory (an error in words, after the text receipt); a file left
//!   there owned by another uid with mode 0666 is replaced by a file of
//!   veris's uid with the documented mode. `serve`'s `--ready-file` and
//!   `--write-env` and `veris har -o` get the same treatment.

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use support::{output_within, skip, text, veris, TempDir};

/// The deadline of one `veris run`: a hang fails the test instead.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

fn euid() -> u32 {
    std::fs::metadata("/proc/self")
        .expect("stat /proc/self")
        .uid()
}

/// `veris run --tier explicit --receipt R --junit J -- sh -c SCRIPT sh R J ARGS`,
/// bounded by [`RUN_TIMEOUT`].
fn run_planting(
    dir: &TempDir,
    script: &str,
    args: &[&Path],
) -> (std::process::Output, PathBuf, PathBuf) {
    let (receipt, junit) = (dir.join("receipt.json"), dir.join("junit.xml"));
    let mut cmd = veris(["run", "--tier", "explicit", "--state-dir"]);
    cmd.arg(dir.join("state"))
        .arg("--receipt")
        .arg(&receipt)
        .arg("--junit")
        .arg(&junit)
        .args(["--", "sh", "-c", script, "sh"])
        .arg(&receipt)
        .arg(&junit)
        .args(args);
    (output_within(&mut cmd, RUN_TIMEOUT), receipt, junit)
}

/// A regular file of this uid with exactly `mode`.
fn assert_ours(path: &Path, mode: u32) {
    let m = std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        m.is_file(),
        "{} is not a regular file: {m:?}",
        path.display()
    );
    assert_eq!(m.uid(), euid(), "{} owner", path.display());
    assert_eq!(
        m.mode() & 0o7777,
        mode,
        "{} mode {:o}",
        path.display(),
        m.mode()
    );
}

/// The JSON receipt veris wrote, and the JUnit report.
fn assert_reports(receipt: &Path, junit: &Path) {
    assert_ours(receipt, 0o600);
    assert_ours(junit, 0o644);
    let r: Value = serde_json::from_str(&std::fs::read_to_string(receipt).unwrap()).unwrap();
    assert!(r["integrity"]["status"].is_string(), "{r}");
    assert!(std::fs::read_to_string(junit)
        .unwrap()
        .contains("<testsuite"));
}

#[test]
fn a_fifo_at_the_report_paths_is_replaced_without_hanging() {
    let dir = TempDir::new("report-fifo");
    let (out, receipt, junit) = run_planting(&dir, r#"rm -f "$1" "$2"; mkfifo "$1" "$2""#, &[]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("Veris receipt"), "{stderr}");
    assert_reports(&receipt, &junit);
}

#[test]
fn a_symlink_at_the_report_paths_is_replaced_and_its_target_untouched() {
    let dir = TempDir::new("report-link");
    let victim = dir.join("victim");
    std::fs::write(&victim, "keep").unwrap();
    let (out, receipt, junit) = run_planting(
        &dir,
        r#"rm -f "$1" "$2"; ln -s "$3" "$1"; ln -s "$3" "$2""#,
        &[&victim],
    );
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    assert_reports(&receipt, &junit);
}

#[test]
fn a_directory_at_the_receipt_path_is_an_error_after_the_text_receipt() {
    let dir = TempDir::new("report-dir");
    let (out, receipt, junit) = run_planting(&dir, r#"rm -f "$1"; mkdir "$1""#, &[]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let text_at = stderr
        .find("Veris receipt")
        .unwrap_or_else(|| panic!("{stderr}"));
    let error_at = stderr
        .find("is a directory")
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        text_at < error_at,
        "the text receipt comes first:\n{stderr}"
    );
    assert!(receipt.is_dir());
    // The other report is still written.
    assert_ours(&junit, 0o644);
}

#[test]
fn a_loose_file_of_another_uid_is_replaced_by_one_of_veris() {
    if euid() != 0 {
        return skip("needs root to leave a file of another uid");
    }
    let dir = TempDir::new("report-owner");
    let (receipt, junit) = (dir.join("receipt.json"), dir.join("junit.xml"));
    let mut inodes = Vec::new();
    for f in [&receipt, &junit] {
        std::fs::write(f, "old").unwrap();
        std::os::unix::fs::chown(f, Some(65534), Some(65534)).unwrap();
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o666)).unwrap();
        inodes.push(std::fs::metadata(f).unwrap().ino());
    }
    // The command leaves them as they are; `true` is enough.
    let (out, receipt, junit) = run_planting(&dir, "true", &[]);
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));
    assert_reports(&receipt, &junit);
    assert_ne!(std::fs::metadata(&receipt).unwrap().ino(), inodes[0]);
}

#[test]
fn serve_ready_and_env_files_replace_planted_links() {
    let dir = TempDir::new("report-serve");
    let victim = dir.join("victim");
    std::fs::write(&victim, "keep").unwrap();
    std::os::unix::fs::symlink(&victim, dir.join("ready.json")).unwrap();
    std::os::unix::fs::symlink(&victim, dir.join("client.env")).unwrap();
    let mut serve = support::Serve::start_in(dir, &[]);
    let victim = serve.dir.join("victim");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    assert_ours(&serve.dir.join("ready.json"), 0o644);
    assert_ours(&serve.env_file, 0o644);
    serve.stop();
}

#[test]
fn har_output_replaces_a_fifo_or_a_link_and_refuses_a_directory() {
    let dir = TempDir::new("report-har");
    // A ledger to read: an empty run's.
    let out = output_within(
        veris(["run", "--tier", "explicit", "--state-dir"])
            .arg(dir.join("state"))
            .args(["--", "true"]),
        RUN_TIMEOUT,
    );
    let (_, stderr) = text(&out);
    let ledger = stderr
        .lines()
        .find_map(|l| l.strip_prefix("ledger: "))
        .and_then(|l| l.split(" (verify it later").next())
        .unwrap_or_else(|| panic!("no ledger line: {stderr}"))
        .to_string();
    let har = dir.join("out.har");
    let victim = dir.join("victim");
    std::fs::write(&victim, "keep").unwrap();
    let write_har = || {
        output_within(
            veris(["har", "--ledger", &ledger, "--all", "-o"]).arg(&har),
            RUN_TIMEOUT,
        )
    };
    assert!(Command::new("mkfifo").arg(&har).status().unwrap().success());
    let out = write_har();
    assert!(
        out.status.success() || out.status.code() == Some(3),
        "{:?}",
        text(&out)
    );
    assert_ours(&har, 0o600);
    std::fs::remove_file(&har).unwrap();
    std::os::unix::fs::symlink(&victim, &har).unwrap();
    let out = write_har();
    assert!(
        out.status.success() || out.status.code() == Some(3),
        "{:?}",
        text(&out)
    );
    assert_ours(&har, 0o600);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    std::fs::remove_file(&har).unwrap();
    std::fs::create_dir(&har).unwrap();
    let out = write_har();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is a directory"), "{stderr}");
}
