//! End-to-end tests of DESIGN §7a rules 14 and 15, with the command under
//! `veris run` as the attacker (it runs as veris's own uid):
//!
//! - **Nothing of the command outlives it.** A `setsid` grandchild that
//!   ignores SIGTERM, waits until veris is done and then rewrites the
//!   `--junit` and `--receipt` files and prints a forged receipt is ended
//!   before veris writes its reports — in the isolated, confined and
//!   explicit tiers. It holds a `flock` on a file while it lives, so "is it
//!   dead?" is a non-blocking lock attempt, not a sleep.
//! - **Report files are veris's alone.** The command (in each tier)
//!   replaces `--receipt` and `--junit` with a FIFO (a regression hangs;
//!   the run has a deadline), a symlink to another file (which must stay
//!   untouched), a directory (an error in words, after the text receipt);
//!   a file left there owned by another uid with mode 0666 is replaced by
//!   a file of veris's uid with the documented mode. `serve`'s
//!   `--ready-file` and `--write-env`, `veris har -o` and `veris receipt
//!   --junit` get the same treatment.

use crate::support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::{
    euid, output_within, skip, text, tool_works, veris, wait_for, Guard, TempDir, DEADLINE,
};

/// The deadline of one `veris run`: a hang fails the test instead.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// A `veris run` whose stdout and stderr go to files: a leftover process
/// holding a pipe could otherwise keep the test waiting for EOF.
struct Run {
    code: Option<i32>,
    stderr: String,
    stderr_path: PathBuf,
}

fn run_to_files(dir: &TempDir, flags: &[&str], child: &[&str]) -> Run {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let err_path = dir.join(format!("veris-{n}.stderr"));
    let mut cmd = veris(["run", "--state-dir"]);
    cmd.arg(dir.join("state"))
        .args(flags)
        .arg("--")
        .args(child)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join(format!("veris-{n}.stdout"))).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap());
    let mut guard = Guard::spawn(&mut cmd);
    let status = guard.wait_timeout(RUN_TIMEOUT).unwrap_or_else(|| {
        panic!(
            "veris run did not finish within {RUN_TIMEOUT:?}; stderr:\n{}",
            std::fs::read_to_string(&err_path).unwrap_or_default()
        )
    });
    Run {
        code: status.code(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
        stderr_path: err_path,
    }
}

/// Whether nobody holds a lock on `path` (`flock -n` gets it at once).
fn unlocked(path: &Path) -> bool {
    Command::new("flock")
        .args(["-n", "-E", "99"])
        .arg(path)
        .arg("true")
        .status()
        .expect("running flock")
        .success()
}

/// The grandchild: a new session (`setsid`), holding `$1` locked while it
/// lives, deaf to SIGTERM; it marks `$2` once running, waits for `$3` (at
/// most ~10 s), then rewrites `$4` and `$5` and prints a forged receipt.
/// Its parent waits for the mark and exits 0.
const LEFTOVER: &str = r#"
setsid flock "$1" sh -c '
  trap "" TERM HUP INT
  : > "$2"
  i=0; while [ ! -e "$3" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
  echo "<testsuite failures=\"0\">forged</testsuite>" > "$4"
  echo "{\"forged\": true}" > "$5"
  echo "Veris receipt — FORGED integrity: verified" >&2
' leftover "$@" &
i=0; while [ ! -e "$2" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done
"#;

/// Runs the leftover attack in a tier (`flags`); Err is a skip reason.
fn leftover_is_ended(label: &str, flags: &[&str]) -> Result<(), String> {
    for tool in ["flock", "setsid"] {
        if !tool_works(tool, &["--version"]) {
            return Err(format!("{tool} not installed (util-linux)"));
        }
    }
    let dir = TempDir::new(label);
    let (lock, started, go) = (dir.join("lock"), dir.join("started"), dir.join("go"));
    let (junit, receipt) = (dir.join("junit.xml"), dir.join("receipt.json"));
    std::fs::write(&lock, "").unwrap();
    let path = |p: &PathBuf| p.to_str().unwrap().to_string();
    let mut all = flags.to_vec();
    let (junit_s, receipt_s) = (path(&junit), path(&receipt));
    all.extend(["--junit", &junit_s, "--receipt", &receipt_s]);
    let args = [
        path(&lock),
        path(&started),
        path(&go),
        junit_s.clone(),
        receipt_s.clone(),
    ];
    let mut child = vec!["sh", "-c", LEFTOVER, "sh"];
    child.extend(args.iter().map(String::as_str));
    let out = run_to_files(&dir, &all, &child);
    if out.code == Some(1) {
        for refusal in ["cannot isolate the command", "cannot confine the command"] {
            if let Some(line) = out.stderr.lines().find(|l| l.contains(refusal)) {
                return Err(format!("{label}: {}", line.trim()));
            }
        }
    }
    assert!(
        started.exists(),
        "the grandchild never ran:\n{}",
        out.stderr
    );
    let dead = unlocked(&lock);
    // On a veris that let it live, let it do its worst before judging.
    std::fs::write(&go, "").unwrap();
    wait_for("the grandchild to end", DEADLINE, || {
        unlocked(&lock).then_some(())
    });
    // Read again: a live grandchild may have printed since.
    let stderr = std::fs::read_to_string(&out.stderr_path).unwrap();
    assert!(
        dead,
        "a process of the command was still alive after veris exited:\n{stderr}"
    );
    assert!(!stderr.contains("FORGED"), "{stderr}");
    assert_eq!(out.code, Some(3), "an empty receipt:\n{stderr}");
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(
        !xml.contains("forged") && xml.contains("<testsuite"),
        "{xml}"
    );
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&receipt).unwrap()).unwrap();
    assert!(r.get("forged").is_none(), "{r}");
    let check = r["integrity"]["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "descendants"))
        .unwrap_or_else(|| panic!("no descendants check: {r}"));
    assert_eq!(check["status"], "ok", "{check}");
    // Outside a PID namespace it is veris that ended them (inside, they
    // died with its pid 1); there, a daemon of the host could still start
    // processes for the command, and the leaks say so.
    let isolated = r["isolation"] == "netns";
    if !isolated {
        let detail = check["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("veris ended them"), "{check}");
    }
    let named = r["leaks"]
        .as_array()
        .is_some_and(|l| l.iter().any(|l| l == "host-daemon-escape-possible"));
    assert_eq!(named, !isolated, "{}", r["leaks"]);
    Ok(())
}

#[test]
fn explicit_tier_ends_what_the_command_left_before_writing_reports() {
    if let Err(why) = leftover_is_ended("leftover-explicit", &["--tier", "explicit"]) {
        skip(&why);
    }
}

#[test]
fn confined_tier_ends_what_the_command_left_before_writing_reports() {
    if let Err(why) = leftover_is_ended("leftover-confined", &["--tier", "confined"]) {
        skip(&why);
    }
}

#[test]
fn isolated_tier_ends_what_the_command_left_before_writing_reports() {
    // --share-tmp: the test's files are under /tmp, and the attack needs
    // the report paths within the command's reach.
    if let Err(why) = leftover_is_ended("leftover-isolated", &["--isolate", "--share-tmp"]) {
        skip(&why);
    }
}

/// The tiers of `veris run`: the report files are written the same way
/// whichever ran the command.
const TIERS: [&[&str]; 3] = [
    &["--tier", "explicit"],
    &["--tier", "confined"],
    // The report paths are under /tmp: shared, so the command can attack them.
    &["--isolate", "--share-tmp"],
];

/// `veris run TIER --receipt R --junit J -- sh -c SCRIPT sh R J ARGS`,
/// bounded by [`RUN_TIMEOUT`]; `None` (after a skip line) when this machine
/// cannot give the command that tier.
fn run_planting(
    dir: &TempDir,
    tier: &[&str],
    script: &str,
    args: &[&Path],
) -> Option<(std::process::Output, PathBuf, PathBuf)> {
    let (receipt, junit) = (dir.join("receipt.json"), dir.join("junit.xml"));
    let mut cmd = veris(["run"]);
    cmd.args(tier)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--receipt")
        .arg(&receipt)
        .arg("--junit")
        .arg(&junit)
        .args(["--", "sh", "-c", script, "sh"])
        .arg(&receipt)
        .arg(&junit)
        .args(args);
    let out = output_within(&mut cmd, RUN_TIMEOUT);
    let (_, stderr) = text(&out);
    for refusal in ["cannot isolate the command", "cannot confine the command"] {
        if let Some(line) = stderr.lines().find(|l| l.contains(refusal)) {
            skip(&format!("{tier:?}: {}", line.trim()));
            return None;
        }
    }
    Some((out, receipt, junit))
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
    for tier in TIERS {
        let dir = TempDir::new("report-fifo");
        let script = r#"rm -f "$1" "$2"; mkfifo "$1" "$2""#;
        let Some((out, receipt, junit)) = run_planting(&dir, tier, script, &[]) else {
            continue;
        };
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(3), "{tier:?}: {stderr}");
        assert!(stderr.contains("Veris receipt"), "{stderr}");
        assert_reports(&receipt, &junit);
    }
}

#[test]
fn a_symlink_at_the_report_paths_is_replaced_and_its_target_untouched() {
    for tier in TIERS {
        let dir = TempDir::new("report-link");
        let victim = dir.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let script = r#"rm -f "$1" "$2"; ln -s "$3" "$1"; ln -s "$3" "$2""#;
        let Some((out, receipt, junit)) = run_planting(&dir, tier, script, &[&victim]) else {
            continue;
        };
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(3), "{tier:?}: {stderr}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_reports(&receipt, &junit);
    }
}

#[test]
fn a_directory_at_the_receipt_path_is_an_error_after_the_text_receipt() {
    for tier in TIERS {
        let dir = TempDir::new("report-dir");
        let script = r#"rm -f "$1"; mkdir "$1""#;
        let Some((out, receipt, junit)) = run_planting(&dir, tier, script, &[]) else {
            continue;
        };
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{tier:?}: {stderr}");
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
    let Some((out, receipt, junit)) = run_planting(&dir, TIERS[0], "true", &[]) else {
        return;
    };
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
    // `veris receipt --junit` over a planted link, likewise.
    let junit = dir.join("junit.xml");
    std::os::unix::fs::symlink(&victim, &junit).unwrap();
    let out = output_within(
        veris(["receipt", "--ledger", &ledger, "--junit"]).arg(&junit),
        RUN_TIMEOUT,
    );
    assert!(out.status.code().is_some(), "{:?}", text(&out));
    assert_ours(&junit, 0o644);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    std::fs::remove_file(&har).unwrap();
    std::fs::create_dir(&har).unwrap();
    let out = write_har();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is a directory"), "{stderr}");
}

/// Orphans that end while the command still runs: `veris run`, their
/// subreaper, reaps them then, so they do not pile up as zombies over a
/// long run. The command waits (bounded) until veris has no child left but
/// itself, and exits 42 if one stays.
const ORPHANS: &str = r#"
for n in 1 2 3 4 5 6 7 8 9 10; do (sleep 0.01 &); done
i=0
while [ $i -lt 100 ]; do
  others=0
  for s in /proc/[0-9]*/status; do
    pid=${s#/proc/}; pid=${pid%/status}
    [ "$pid" = "$$" ] && continue
    grep -q "^PPid:[[:space:]]*$PPID\$" "$s" 2>/dev/null && others=$((others+1))
  done
  [ $others -eq 0 ] && exit 0
  sleep 0.1; i=$((i+1))
done
exit 42
"#;

#[test]
fn orphans_that_end_during_the_run_are_reaped() {
    let dir = TempDir::new("orphans");
    let out = output_within(
        veris(["run", "--tier", "explicit", "--allow-empty", "--state-dir"])
            .arg(dir.join("state"))
            .args(["--", "sh", "-c", ORPHANS]),
        RUN_TIMEOUT,
    );
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}
