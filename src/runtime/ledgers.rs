//! Which ledger a state dir means, and the runs it holds: the one rule every
//! reader of a state dir follows (`receipt`, `har`, `tui`, `doctor`,
//! `baseline`, `runs` and the MCP tools).
//!
//! A state dir holds the ledger of `veris serve` (`<state>/ledger.jsonl`)
//! and one ledger per `veris run` (`<state>/runs/<run_id>/ledger.jsonl`).
//! The rule: `--ledger FILE`, else `--run ID`, else the serve's ledger when
//! a serve is live or its file is there, else the newest run. A run is
//! newer by the `ts` of its ledger's first line (the session line, under
//! the run's seals), never by a file's mtime.
//!
//! The workload can write the state dir: it can plant run dirs, copy a
//! ledger, link a run dir elsewhere. So a run id is 16 lower-case hex digits
//! (as `random_hex` makes them) and nothing else, run dirs and ledgers that
//! are symlinks are listed but never read, and a ledger whose session line
//! names another run than its dir's is read with a failed `run_dir` check:
//! a copy of a sealed run cannot pass for another run. What a listing shows
//! of a run is its ledger's word (start, and the verdict computed from the
//! ledger's own checks) plus the command the run wrote beside it
//! (`run.json`), which is not sealed and is shown quoted.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use veris_receipt::quote;
use veris_receipt::receipt::{Check, CheckStatus};

use crate::runtime::stack::RUNS_DIR;

/// The ledger file of a serve, and of each run in its dir.
pub const LEDGER_FILE: &str = "ledger.jsonl";
/// What `veris run` writes beside its ledger at its start.
pub const RUN_FILE: &str = "run.json";
/// Hex digits of a run id (`random_hex(8)`).
pub const RUN_ID_LEN: usize = 16;
/// Entries of `<state>/runs` looked at, at most: a workload that plants a
/// million dirs costs a reader this many `lstat`s, no more.
const MAX_ENTRIES: usize = 10_000;
/// Bytes read of a ledger's first line, and of a `run.json`.
const HEAD_CAP: u64 = 64 * 1024;

/// Whether `id` is a run id as veris makes them: nothing that could name
/// another directory (`..`, `/`, a symlink's name is fine but is refused
/// later as a symlink).
pub fn valid_run_id(id: &str) -> bool {
    id.len() == RUN_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The ledger a reader reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `--ledger FILE`, as given.
    File(PathBuf),
    /// The serve's ledger of the state dir: a live proxy may anchor it.
    Serve(PathBuf),
    /// A run's ledger. `newest` when it was picked as the newest run, not
    /// named by `--run`.
    Run {
        id: String,
        path: PathBuf,
        newest: bool,
        /// The run id its session line names, when it is not `id`.
        names_other_run: Option<String>,
    },
}

impl Source {
    pub fn path(&self) -> &Path {
        match self {
            Source::File(p) | Source::Serve(p) => p,
            Source::Run { path, .. } => path,
        }
    }

    /// Checks the reader adds to the receipt of this source: a run dir
    /// holding another run's ledger fails.
    pub fn checks(&self) -> Vec<Check> {
        match self {
            Source::Run {
                id,
                names_other_run: Some(other),
                ..
            } => vec![Check {
                name: "run_dir".into(),
                status: CheckStatus::Failed,
                detail: format!(
                    "the ledger in {RUNS_DIR}/{id} is the ledger of run {}: copied or moved there, it is not this run's record",
                    quote::quoted(other)
                ),
            }],
            _ => Vec::new(),
        }
    }

    /// A line for stderr naming what was read, when the reader did not name
    /// it: the newest of several runs.
    pub fn note(&self) -> Option<String> {
        match self {
            Source::Run {
                id, newest: true, ..
            } => Some(format!(
                "veris: reading run {id}, the newest in this state dir (`veris runs` lists them; --run ID picks another)"
            )),
            _ => None,
        }
    }
}

/// One entry of `<state>/runs`.
#[derive(Debug, Clone, Serialize)]
pub struct RunInfo {
    pub id: String,
    pub ledger: PathBuf,
    /// The `ts` of the ledger's first line when it is a session line.
    pub started: Option<String>,
    /// The run id that session line names.
    #[serde(skip)]
    pub session_run_id: Option<String>,
    /// The command, as the run wrote it at its start in `run.json` (not
    /// sealed: the workload can rewrite it).
    pub command: Option<Vec<String>>,
    /// Why this entry cannot be read as a run, when it cannot.
    pub unusable: Option<String>,
}

impl RunInfo {
    /// The command as one line, each argument quoted as recorded text.
    pub fn command_text(&self) -> String {
        match &self.command {
            Some(argv) => argv
                .iter()
                .map(|a| quote::quoted(a))
                .collect::<Vec<_>>()
                .join(" "),
            None => "-".into(),
        }
    }
}

/// What `veris run` writes to `run.json` at its start.
#[derive(Debug, Serialize, Deserialize)]
pub struct RunFile {
    pub run_id: String,
    pub command: Vec<String>,
}

/// Writes `run.json` beside a run's ledger (replacing whatever is there,
/// never through a link), each argument redacted as the ledger's text is:
/// a token on a command line stays off the disk.
pub fn write_run_file(ledger: &Path, run_id: &str, command: &[String]) -> Result<()> {
    let dir = ledger.parent().unwrap_or(Path::new("."));
    let body = serde_json::to_vec(&RunFile {
        run_id: run_id.to_string(),
        command: command
            .iter()
            .map(|a| veris_receipt::redact::text(a))
            .collect(),
    })?;
    veris_ca::fsutil::write_file(&dir.join(RUN_FILE), &body, 0o644)?;
    Ok(())
}

/// The runs of a state dir, newest first (by their session line's start;
/// those without one last, by id).
pub fn list_runs(state_dir: &Path) -> Vec<RunInfo> {
    let Ok(entries) = std::fs::read_dir(state_dir.join(RUNS_DIR)) else {
        return Vec::new();
    };
    let mut runs: Vec<RunInfo> = entries
        .take(MAX_ENTRIES)
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let id = e.file_name().to_str()?.to_string();
            valid_run_id(&id).then(|| inspect(state_dir, &id))
        })
        .collect();
    runs.sort_by(|a, b| {
        let usable = |r: &RunInfo| r.unusable.is_none();
        usable(b)
            .cmp(&usable(a))
            .then_with(|| b.started.cmp(&a.started))
            .then_with(|| a.id.cmp(&b.id))
    });
    runs
}

/// What `<state>/runs/<id>` holds; `id` must be valid.
fn inspect(state_dir: &Path, id: &str) -> RunInfo {
    let dir = state_dir.join(RUNS_DIR).join(id);
    let ledger = dir.join(LEDGER_FILE);
    let mut info = RunInfo {
        id: id.to_string(),
        ledger: ledger.clone(),
        started: None,
        session_run_id: None,
        command: None,
        unusable: None,
    };
    match std::fs::symlink_metadata(&dir) {
        Ok(m) if m.file_type().is_symlink() => {
            info.unusable = Some("the run dir is a symlink (not followed)".into());
            return info;
        }
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            info.unusable = Some("not a directory".into());
            return info;
        }
        Err(e) => {
            info.unusable = Some(format!("no such run dir ({e})"));
            return info;
        }
    }
    match std::fs::symlink_metadata(&ledger) {
        Ok(m) if m.file_type().is_symlink() => {
            info.unusable = Some("its ledger is a symlink (not followed)".into());
            return info;
        }
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            info.unusable = Some("its ledger is not a regular file".into());
            return info;
        }
        Err(_) => {
            info.unusable = Some(format!("no {LEDGER_FILE} in it"));
            return info;
        }
    }
    if let Some(first) = first_line(&ledger) {
        if first["kind"] == "session" {
            info.started = first["ts"].as_str().map(str::to_string);
            info.session_run_id = first["run_id"].as_str().map(str::to_string);
        }
    }
    if let Ok(bytes) = crate::util::read_bounded_bytes(&dir.join(RUN_FILE), HEAD_CAP, false) {
        if let Ok(file) = serde_json::from_slice::<RunFile>(&bytes) {
            info.command = Some(file.command);
        }
    }
    info
}

/// The first line of a ledger as JSON: read without following a link,
/// without blocking, at most [`HEAD_CAP`] bytes.
fn first_line(path: &Path) -> Option<serde_json::Value> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOFOLLOW).bits() as i32)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut head = Vec::new();
    f.take(HEAD_CAP).read_to_end(&mut head).ok()?;
    let end = head.iter().position(|&b| b == b'\n')?;
    serde_json::from_slice(&head[..end]).ok()
}

/// Which ledger of `state_dir` to read: `ledger` (`--ledger`), else `run`
/// (`--run`), else the serve's when `serve_live` or its file is there,
/// else the newest readable run. An error says what the state dir holds and
/// what to do.
pub fn resolve(
    state_dir: &Path,
    ledger: Option<&Path>,
    run: Option<&str>,
    serve_live: bool,
) -> Result<Source> {
    if let Some(path) = ledger {
        return Ok(Source::File(path.to_path_buf()));
    }
    if let Some(id) = run {
        if !valid_run_id(id) {
            bail!(
                "--run {}: not a run id (a run id is {RUN_ID_LEN} hex digits, as `veris runs` lists them). {}",
                quote::quoted(id),
                what_is_there(state_dir)
            );
        }
        let info = inspect(state_dir, id);
        if let Some(why) = &info.unusable {
            bail!(
                "--run {id}: cannot read {}: {why}. {}",
                info.ledger.display(),
                what_is_there(state_dir)
            );
        }
        return Ok(run_source(info, false));
    }
    let serve = state_dir.join(LEDGER_FILE);
    if serve_live || std::fs::symlink_metadata(&serve).is_ok() {
        return Ok(Source::Serve(serve));
    }
    match list_runs(state_dir)
        .into_iter()
        .find(|r| r.unusable.is_none())
    {
        Some(info) => Ok(run_source(info, true)),
        None => bail!("{}", no_ledger(state_dir)),
    }
}

/// The ledger `veris tui` follows in a state dir while no serve is live:
/// the one [`resolve`] picks, else (nothing there yet) the serve's path,
/// where a proxy that starts will write.
pub fn followed(state_dir: &Path) -> PathBuf {
    match resolve(state_dir, None, None, false) {
        Ok(source) => source.path().to_path_buf(),
        Err(_) => state_dir.join(LEDGER_FILE),
    }
}

fn run_source(info: RunInfo, newest: bool) -> Source {
    let names_other_run = info
        .session_run_id
        .filter(|named| *named != info.id)
        .or_else(|| {
            // A first line that is no session line at all names no run.
            info.started
                .is_none()
                .then(|| "none (its first line is not a session line)".to_string())
        });
    Source::Run {
        id: info.id,
        path: info.ledger,
        newest,
        names_other_run,
    }
}

/// Runs shown in a message, at most.
const SHOWN: usize = 5;

/// The runs of `state_dir`, newest first, a few, one a line (indented).
pub fn runs_summary(state_dir: &Path) -> String {
    let runs = list_runs(state_dir);
    let mut out = String::new();
    for r in runs.iter().take(SHOWN) {
        out.push_str(&format!(
            "\n  {}  {}  {}{}",
            r.id,
            r.started
                .as_deref()
                .map_or("-".into(), |s| quote::token(s).into_owned()),
            r.command_text(),
            r.unusable
                .as_deref()
                .map_or(String::new(), |w| format!("  (unreadable: {w})")),
        ));
    }
    if runs.len() > SHOWN {
        out.push_str(&format!(
            "\n  … and {} more (`veris runs` lists them all)",
            runs.len() - SHOWN
        ));
    }
    out
}

/// What the state dir holds, and what to do: for a message about a ledger
/// that is not there.
pub fn what_is_there(state_dir: &Path) -> String {
    let runs = runs_summary(state_dir);
    if runs.is_empty() {
        format!(
            "{} holds no run. Next: run a command under veris (`veris run --state-dir {} -- CMD`) or start the proxy (`veris serve --state-dir {}`), or pass --ledger FILE",
            state_dir.display(),
            state_dir.display(),
            state_dir.display()
        )
    } else {
        format!(
            "Runs in {} (newest first):{runs}\nNext: pick one with --run ID, or pass --ledger FILE",
            state_dir.display()
        )
    }
}

/// The message for a state dir with no ledger to read.
pub fn no_ledger(state_dir: &Path) -> String {
    format!(
        "no ledger in {}: no live `veris serve`, no {LEDGER_FILE}, and no readable run under {RUNS_DIR}/. {}",
        state_dir.display(),
        what_is_there(state_dir)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_hex_as_veris_makes_them() {
        assert!(valid_run_id("0123456789abcdef"));
        for bad in [
            "",
            "..",
            "../../x",
            "0123456789abcde",
            "0123456789abcdef0",
            "0123456789ABCDEF",
            "0123456789abcde/",
            "0123456789abcdeg",
        ] {
            assert!(!valid_run_id(bad), "{bad}");
        }
    }

    #[test]
    fn the_newest_run_is_read_by_its_session_start_and_links_are_not_followed() {
        let dir = std::env::temp_dir().join(format!("veris-ledgers-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let runs = dir.join(RUNS_DIR);
        let session = |id: &str, ts: &str| {
            format!(
                "{{\"v\":5,\"seq\":1,\"ts\":\"{ts}\",\"kind\":\"session\",\"run_id\":\"{id}\"}}\n"
            )
        };
        for (id, ts) in [
            ("aaaaaaaaaaaaaaaa", "2026-01-02T00:00:00.000Z"),
            ("bbbbbbbbbbbbbbbb", "2026-01-01T00:00:00.000Z"),
        ] {
            std::fs::create_dir_all(runs.join(id)).unwrap();
            std::fs::write(runs.join(id).join(LEDGER_FILE), session(id, ts)).unwrap();
        }
        // Newer by its words, but a link: listed, never read.
        std::os::unix::fs::symlink(runs.join("aaaaaaaaaaaaaaaa"), runs.join("cccccccccccccccc"))
            .unwrap();
        std::fs::create_dir_all(runs.join("not-a-run")).unwrap();
        let listed = list_runs(&dir);
        let ids: Vec<&str> = listed.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(
            ids,
            ["aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb", "cccccccccccccccc"]
        );
        assert!(listed[2].unusable.as_deref().unwrap().contains("symlink"));
        let newest = resolve(&dir, None, None, false).unwrap();
        assert!(
            matches!(&newest, Source::Run { id, newest: true, names_other_run: None, .. } if id == "aaaaaaaaaaaaaaaa"),
            "{newest:?}"
        );
        assert!(resolve(&dir, None, Some("cccccccccccccccc"), false).is_err());
        assert!(resolve(&dir, None, Some("../x"), false).is_err());
        // A copy of one run's ledger in another run's dir names the other run.
        std::fs::create_dir_all(runs.join("dddddddddddddddd")).unwrap();
        std::fs::write(
            runs.join("dddddddddddddddd").join(LEDGER_FILE),
            session("aaaaaaaaaaaaaaaa", "2026-01-03T00:00:00.000Z"),
        )
        .unwrap();
        let copy = resolve(&dir, None, None, false).unwrap();
        assert_eq!(copy.checks().len(), 1, "{copy:?}");
        assert_eq!(copy.checks()[0].status, CheckStatus::Failed);
        // The serve's ledger, once there, is what the state dir means.
        std::fs::write(dir.join(LEDGER_FILE), "").unwrap();
        assert!(matches!(
            resolve(&dir, None, None, false).unwrap(),
            Source::Serve(_)
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_empty_state_dir_lists_nothing_and_says_what_to_do() {
        let dir = std::env::temp_dir().join(format!("veris-ledgers-empty-{}", std::process::id()));
        let e = resolve(&dir, None, None, false).unwrap_err().to_string();
        assert!(e.contains("holds no run"), "{e}");
        assert!(e.contains("Next: run a command under veris"), "{e}");
    }
}
