//! `--junit FILE` of `veris receipt` and `veris run`: the verdict as a JUnit
//! XML report for CI pages. The report is rendered by the receipt crate from
//! the same [`Verdict`](veris_receipt::receipt::Verdict) that decides the exit
//! code; this module only checks the path early, times the command and
//! writes the file atomically (also when the command fails before it has a
//! receipt: then the report holds one case in error).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use veris_receipt::receipt::{render_junit, render_junit_error, CommandRan, JunitContext};

use crate::runtime::receipt::Report;

/// A suite name's length at most, in characters.
const MAX_SUITE: usize = 200;

/// Where the report goes, and the clock of the command it reports on.
pub struct Junit {
    path: PathBuf,
    suite: String,
    started: SystemTime,
    clock: Instant,
}

impl Junit {
    /// Starts the clock; checks that `path` can be written and `suite` is a
    /// name, so a typo fails before a whole run is spent.
    pub fn start(path: Option<&Path>, suite: &str) -> Result<Option<Junit>> {
        let Some(path) = path else {
            return Ok(None);
        };
        if suite.trim().is_empty()
            || suite.chars().count() > MAX_SUITE
            || suite.chars().any(char::is_control)
        {
            bail!("--junit-suite {suite:?}: not a suite name. Next: give a name of 1 to {MAX_SUITE} printable characters, e.g. --junit-suite 'payments e2e'");
        }
        let junit = Junit {
            path: path.to_path_buf(),
            suite: suite.to_string(),
            started: SystemTime::now(),
            clock: Instant::now(),
        };
        junit.probe()?;
        Ok(Some(junit))
    }

    fn probe(&self) -> Result<()> {
        let next = "Next: pass --junit a file path in a directory that exists and is writable";
        if self.path.is_dir() {
            bail!("--junit {}: is a directory. {next}", self.path.display());
        }
        let cannot = || {
            format!(
                "--junit {}: cannot write there. {next}",
                self.path.display()
            )
        };
        // A report left from an earlier run goes now: should this run's
        // report fail to be written, CI finds none, never a stale one that
        // passed.
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(cannot)
            }
            _ => {}
        }
        // A file beside the report, created new (never through a link
        // planted at its name) and removed, as the atomic write's temp
        // file will be.
        let probe = crate::util::temp_beside(&self.path, "probe").with_context(cannot)?;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)
            .and_then(|_| std::fs::remove_file(&probe))
            .with_context(cannot)
    }

    fn context<'a>(&'a self, hostname: &'a str, judged: Duration) -> JunitContext<'a> {
        JunitContext {
            suite: &self.suite,
            started: self.started,
            elapsed: self.clock.elapsed(),
            judged,
            hostname,
        }
    }

    /// Writes the report of a judged receipt: `command` is `veris run`'s
    /// command, `judged` how long reading and judging its ledger took.
    pub fn write(
        &self,
        report: &Report,
        command: Option<CommandRan>,
        judged: Duration,
    ) -> Result<()> {
        let host = hostname();
        let cx = self.context(&host, judged);
        let xml = render_junit(&report.receipt, &report.verdict, &report.text, command, &cx);
        self.save(&xml)
    }

    /// Writes the report of a command that ended without a receipt.
    pub fn write_error(&self, message: &str) -> Result<()> {
        let host = hostname();
        self.save(&render_junit_error(
            message,
            &self.context(&host, Duration::ZERO),
        ))
    }

    fn save(&self, xml: &str) -> Result<()> {
        // 0644: CI's report readers may be another uid; it holds no secret.
        veris_ca::fsutil::write_file(&self.path, xml.as_bytes(), 0o644).with_context(|| {
            format!(
                "writing the JUnit report {}. Next: pass --junit a path in a writable directory",
                self.path.display()
            )
        })
    }
}

/// The machine's name, for the suite's `hostname`.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}
