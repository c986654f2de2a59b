//! `veris run`: the proxy in-process, a child behind it, and this run's receipt.
//!
//! Each run writes a ledger of its own (`<state>/runs/<run_id>/ledger.jsonl`)
//! sealed by a key that exists only in this process, which is non-dumpable:
//! the child, running as the same uid, can read and rewrite every file it
//! likes but can neither sign a seal nor reach the admin API (there is none).
//! The receipt is anchored on the proxy's own final seal, so a rewritten or
//! replaced file fails it.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use tracing::warn;
use veris_receipt::ledger::{self, LedgerRead};
use veris_receipt::receipt::{Anchor, LiveChannel, Options, WindowSpec};
use veris_receipt::receipt::{Check, Requirement};

use crate::runtime::junit::Junit;
use crate::runtime::receipt::{report, Report, RequireArgs};
use crate::runtime::stack::{Finished, ProxyArgs, Role, ServeArgs, Stack};
use crate::tier::Tier;

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub proxy: ProxyArgs,
    #[command(flatten)]
    pub require: RequireArgs,
    /// How the command is put behind the proxy. auto: isolated where the
    /// kernel allows it, else the explicit tier confined by Landlock, else
    /// the plain explicit tier (with a line saying why). isolated: its own
    /// network namespace, where every connection goes to the proxy whatever
    /// the client does. confined: proxy variables, and TCP connects allowed
    /// only to the proxy's port (Landlock). explicit: proxy variables only,
    /// which clients may ignore.
    #[arg(long, value_enum, default_value = "auto")]
    pub tier: TierArg,
    /// Fail instead of falling back from isolation (CI that must not run
    /// unconfined).
    #[arg(long, conflicts_with = "tier")]
    pub isolate: bool,
    /// Isolated tier: also put the veris bundle over this CA file inside the
    /// run (a client's own bundled roots, e.g. certifi's cacert.pem); the
    /// system trust stores are covered already. Repeat for more.
    #[arg(long, value_name = "FILE")]
    pub trust_file: Vec<PathBuf>,
    /// Isolated tier: let the command see the host's /tmp, /var/tmp and
    /// /dev/shm. By default it gets private, empty ones (the working
    /// directory and veris's trust files, when under them, are carried
    /// over), so a host daemon's unix socket there is out of its reach.
    #[arg(long)]
    pub share_tmp: bool,
    /// Also write the JSON receipt here (mode 0600).
    #[arg(long, value_name = "FILE")]
    pub receipt: Option<PathBuf>,
    /// Also write the verdict as a JUnit XML report here (one test case per
    /// requirement, integrity, non-emptiness and the command's exit code),
    /// also when it fails.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// The JUnit suite's name (default `veris run`); its cases'
    /// `classname` is made of it (spaces become dots). Stable per job, so CI
    /// history lines up the same checks across runs.
    #[arg(long, value_name = "NAME", requires = "junit")]
    pub junit_suite: Option<String>,
    /// Not for run (serve's transparent tier); accepted only to answer with
    /// what to do instead of a bare "unexpected argument".
    #[arg(long, hide = true)]
    pub transparent: bool,
    /// Internal to `veris mcp`'s `veris_run`: also write the judged run as
    /// one JSON object to this inherited descriptor (a pipe the command
    /// never inherits), where the command's own output cannot pose as it.
    #[arg(long, hide = true, value_name = "FD")]
    pub report_fd: Option<i32>,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
    /// Set by `veris demo` (no flag): the receipt goes to stdout after the
    /// client's lines.
    #[arg(skip)]
    pub demo: Option<DemoOutput>,
}

/// How `veris demo` shows the run it makes.
#[derive(Clone, Copy, Debug)]
pub struct DemoOutput {
    /// Name the run's ledger (false: it lives in a throwaway state dir).
    pub keep_ledger: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TierArg {
    Auto,
    Isolated,
    Confined,
    Explicit,
}

/// Exit code for a command that cannot be found, as a shell has it.
pub const EXIT_NOT_FOUND: u8 = 127;
/// Exit code for a command that is there but cannot be executed.
pub const EXIT_NOT_EXECUTABLE: u8 = 126;

/// How a run ended: judged, or before its command could start.
enum Ended {
    Judged {
        report: Box<Report>,
        /// The command's own code.
        status: u8,
        /// How long the command ran, and how long reading and judging its
        /// ledger took (the JUnit cases' times).
        ran: std::time::Duration,
        judged: std::time::Duration,
        /// The run's: the verdict's when it fails, else the command's.
        exit: u8,
        ledger: PathBuf,
        key_id: String,
    },
    NotStarted {
        exit: u8,
        why: String,
    },
}

pub async fn run(args: RunArgs) -> Result<u8> {
    let report_fd = match args.report_fd {
        Some(fd) => Some(ReportFd::take(fd)?),
        None => None,
    };
    let result = run_reporting(args).await;
    if let Some(fd) = report_fd {
        fd.write(&result);
    }
    result.map(|(exit, _)| exit)
}

/// The descriptor `--report-fd` names, taken before anything starts: closed
/// on exec, so neither the command nor its children hold it.
struct ReportFd(std::fs::File);

impl ReportFd {
    fn take(fd: i32) -> Result<ReportFd> {
        // A same-uid process could open the pipe through /proc/<pid>/fd
        // while this process is dumpable: it stops being so now.
        if let Err(e) = crate::os::prctl::set_non_dumpable() {
            warn!(error = %e, "cannot make the process non-dumpable");
        }
        let owned = crate::os::fd::inherited_fd(fd)
            .with_context(|| format!("--report-fd {fd}: not an open descriptor"))?;
        rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC)
            .with_context(|| format!("--report-fd {fd}: cannot set close-on-exec"))?;
        Ok(ReportFd(std::fs::File::from(owned)))
    }

    /// One JSON object: the receipt, its text and verdict, the exit codes;
    /// or the error that stopped the run.
    fn write(mut self, result: &Result<(u8, Reported)>) {
        use std::io::Write;
        let body = match result {
            Ok((exit, Reported::Judged(r))) => serde_json::json!({
                "exit_code": exit,
                "command_exit": r.command_exit,
                "verdict_exit": r.report.exit_code,
                "failures": r.report.verdict.lines,
                "text": r.report.text,
                "receipt": r.report.receipt,
                "ledger": r.ledger,
                "key_id": r.key_id,
            }),
            Ok((exit, Reported::NotStarted(why))) => {
                serde_json::json!({"exit_code": exit, "error": why})
            }
            Err(e) => {
                serde_json::json!({"exit_code": crate::util::EXIT_USAGE, "error": format!("{e:#}")})
            }
        };
        let written = serde_json::to_vec(&body)
            .map_err(std::io::Error::other)
            .and_then(|bytes| self.0.write_all(&bytes))
            .and_then(|()| self.0.flush());
        if let Err(e) = written {
            warn!(error = %e, "cannot write the run's report to --report-fd");
        }
    }
}

/// How a run that did not fail outright ended, for `--report-fd`.
enum Reported {
    Judged(RunReport),
    /// The command could not start: why.
    NotStarted(String),
}

/// What `--report-fd` carries of a judged run.
struct RunReport {
    report: Box<Report>,
    command_exit: u8,
    ledger: PathBuf,
    key_id: String,
}

async fn run_reporting(args: RunArgs) -> Result<(u8, Reported)> {
    // First, so that a report left by an earlier run is gone even when this
    // one stops at a usage error (which then gets a report of its own).
    let junit = Junit::start(
        args.junit.as_deref(),
        args.junit_suite.as_deref().unwrap_or("veris run"),
    )?;
    let receipt_file = args.receipt.clone();
    if let Some(path) = &receipt_file {
        // Likewise a receipt left by an earlier run (unlinked, never
        // followed): a run that ends without one leaves none behind.
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.is_dir() => bail!(
                "--receipt {}: is a directory. Next: pass --receipt a file path",
                path.display()
            ),
            Ok(_) => std::fs::remove_file(path)
                .with_context(|| format!("--receipt {}: cannot replace it", path.display()))?,
            Err(_) => {}
        }
    }
    let ended = async {
        let reqs = args.require.parse()?;
        // Checked before anything starts: a typo must not cost a whole run.
        crate::runtime::receipt::known_services(
            &reqs,
            &crate::runtime::stack::routed_services(&args.proxy)?,
        )?;
        run_with(args, &reqs).await
    }
    .await;
    match ended {
        Ok(Ended::Judged {
            report,
            status,
            ran,
            judged,
            exit,
            ledger,
            key_id,
        }) => {
            // The text receipt is out already; each file is written even
            // when another cannot be, and the first failure decides the exit.
            let mut failures = Vec::new();
            if let Some(path) = &receipt_file {
                let json = serde_json::to_vec_pretty(&report.receipt).map(|mut j| {
                    j.push(b'\n');
                    j
                })?;
                if let Err(e) = veris_ca::fsutil::write_file(path, &json, 0o600) {
                    failures.push(anyhow::anyhow!(e).context(format!(
                        "writing receipt {}. Next: pass --receipt a file path in a directory veris can write",
                        path.display()
                    )));
                }
            }
            if let Some(junit) = &junit {
                let command = veris_receipt::receipt::CommandRan { code: status, ran };
                if let Err(e) = junit.write(&report, Some(command), judged) {
                    failures.push(e);
                }
            }
            let mut failures = failures.into_iter();
            match failures.next() {
                None => Ok((
                    exit,
                    Reported::Judged(RunReport {
                        report,
                        command_exit: status,
                        ledger,
                        key_id,
                    }),
                )),
                Some(first) => {
                    for other in failures {
                        eprintln!("veris: {other:#}");
                    }
                    Err(first)
                }
            }
        }
        Ok(Ended::NotStarted { exit, why }) => {
            if let Some(junit) = &junit {
                junit.write_error(&why)?;
            }
            Ok((exit, Reported::NotStarted(why)))
        }
        Err(e) => {
            // CI reads the report whatever happened; the error decides the exit.
            if let Some(junit) = &junit {
                if let Err(write) = junit.write_error(&format!("{e:#}")) {
                    eprintln!("veris: {write:#}");
                }
            }
            Err(e)
        }
    }
}

async fn run_with(args: RunArgs, reqs: &[Requirement]) -> Result<Ended> {
    if let Err((exit, why)) = findable(&args.command[0]) {
        let why = format!(
            "veris run: {}: {why}. Next: check the command name and PATH",
            args.command[0]
        );
        eprintln!("{why}");
        return Ok(Ended::NotStarted { exit, why });
    }
    let started = std::time::Instant::now();
    // Before anything is started: whatever the command leaves behind
    // (a `setsid` daemon included) becomes ours to end (DESIGN §7a.14).
    if let Err(e) = crate::os::procs::become_subreaper() {
        warn!(error = %e, "cannot become the subreaper of the command's processes");
    }
    let tier = confine(&args).await?;
    let serve = ServeArgs::with_defaults(args.proxy.clone())?;
    let mut stack = Stack::start(&serve, "127.0.0.1:0", Role::Run, tier).await?;
    for line in &stack.webhooks_described {
        eprintln!("veris: {line}");
    }
    // What `veris runs` shows as the command: beside the ledger, not under
    // its seals (the listing says so).
    if let Err(e) = crate::runtime::ledgers::write_run_file(
        stack.ledger.path(),
        &stack.identity.run_id,
        &args.command,
    ) {
        warn!(error = %e, "cannot write the run's run.json; `veris runs` will show no command");
    }

    let running = std::time::Instant::now();
    let (status, canary) = match stack.run_workload(&args.command, started).await {
        Ok(ran) => {
            let canary = ran.canary.map(|(answer, where_)| {
                crate::runtime::checks::canary_verdict(
                    answer,
                    where_,
                    &stack.identity.canary,
                    &stack.identity.run_id,
                )
            });
            (ran.code, canary)
        }
        Err(e) => {
            end_leftovers().await;
            stack.finish().await?;
            return Err(e);
        }
    };

    // Nothing the command started may outlive it (DESIGN §7a.14): ended
    // before the final seal, so the check is recorded under it, and before
    // any report is written, so nothing can rewrite one afterwards.
    let ran = running.elapsed();
    let leftovers = end_leftovers().await;
    let finished = stack.finish_with(canary, vec![leftovers]).await?;
    let judging = std::time::Instant::now();
    let (read, options) = finished_receipt(&finished)?;
    let report = report(&read, &options, reqs, args.require.allow_empty);
    let judged = judging.elapsed();
    // The text first, whatever then happens to the files (DESIGN §7a.15).
    crate::os::fd::blocking_stdio();
    let ledger_line = format!(
        "\nledger: {} (verify it later: veris receipt --ledger {} --key {})",
        finished.ledger_path.display(),
        finished.ledger_path.display(),
        finished.key_id
    );
    if let Some(demo) = args.demo {
        use std::io::IsTerminal;
        let reset = crate::logging::reset(std::io::stdout().is_terminal());
        crate::out!("\n{reset}{}", report.text);
        if demo.keep_ledger {
            crate::outln!("{ledger_line}");
        }
    } else {
        use std::io::IsTerminal;
        let terminal = std::io::stderr().is_terminal();
        let reset = crate::logging::reset(terminal);
        // On a terminal the command's last line may lack its newline: the
        // receipt starts on a line of its own.
        let fresh_line = if terminal { "\n" } else { "" };
        eprint!("{fresh_line}{reset}{}", report.text);
        eprintln!("{ledger_line}");
    }
    if report.exit_code != 0 {
        // The receipt's verdict decides the exit code; the command's own
        // code would otherwise be lost, so say both.
        eprintln!(
            "veris run: exit {}: {}; the command itself exited {status}",
            report.exit_code,
            unmet(&report.verdict)
        );
    }
    let exit = match report.exit_code {
        0 => status,
        code => code,
    };
    Ok(Ended::Judged {
        report: Box::new(report),
        status,
        ran,
        judged,
        exit,
        ledger: finished.ledger_path.clone(),
        key_id: finished.key_id.clone(),
    })
}

/// What the receipt's verdict found unmet, from its lines (never from the
/// rendered text, where only veris's own lines may start with `FAIL:`).
fn unmet(verdict: &veris_receipt::Verdict) -> String {
    if verdict.lines.is_empty() {
        "requirement unmet (see the receipt above)".to_string()
    } else {
        format!("requirement unmet: {}", verdict.lines.join("; "))
    }
}

/// Whether `program` can be started the way `execvp` would find it: Err
/// with the shell's exit code (127 not found, 126 not executable) and why.
fn findable(program: &str) -> std::result::Result<(), (u8, String)> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = std::path::Path::new(program);
        return if executable(path) {
            Ok(())
        } else if path.exists() {
            Err((EXIT_NOT_EXECUTABLE, "not an executable file".into()))
        } else {
            Err((EXIT_NOT_FOUND, "no such file".into()))
        };
    }
    let search = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    if std::env::split_paths(&search).any(|dir| executable(&dir.join(program))) {
        Ok(())
    } else {
        Err((EXIT_NOT_FOUND, "command not found".into()))
    }
}

/// The tier this run gets: isolation where possible (unless told
/// otherwise), else Landlock, else the plain explicit tier, saying why.
async fn confine(args: &RunArgs) -> Result<Box<dyn Tier>> {
    use crate::tier::{confined::Confined, explicit::Explicit, isolated};
    if !args.proxy.webhooks.is_empty() && (args.proxy.twin.is_some() || args.proxy.config.is_some())
    {
        bail!("--webhook with an external twin (--twin, --config) needs the ingress that takes its deliveries, on an admin API a run does not have. Next: use `veris serve` (it prints the ingress URL and token), or drop --twin/--config to use the built-in twin");
    }
    let strict = args.isolate || args.tier == TierArg::Isolated;
    let mut why_not_isolated = None;
    if matches!(args.tier, TierArg::Auto | TierArg::Isolated) {
        webhooks_reach_the_namespace(&args.proxy.webhooks)?;
        match isolated::start(&args.command).await {
            Ok((isolation, sockets)) => {
                return Ok(Box::new(isolated::Isolated::new(
                    isolation,
                    sockets,
                    args.share_tmp,
                    args.trust_file.clone(),
                    runtime_bundles(args),
                )));
            }
            Err(why) if strict => bail!(
                "cannot isolate the command: {why} (without --isolate, `veris run` would fall back to the explicit tier, confined by Landlock where the kernel has it)"
            ),
            Err(why) => why_not_isolated = Some(why),
        }
    }
    if args.tier == TierArg::Explicit {
        return Ok(Box::new(Explicit));
    }
    match (crate::os::landlock::unavailable(), why_not_isolated) {
        (None, Some(why)) => {
            eprintln!("veris: not isolated ({why}); the command runs behind the proxy with TCP confined to it by Landlock (interception: confined)");
            Ok(Box::new(Confined))
        }
        (None, None) => Ok(Box::new(Confined)),
        (Some(why), _) if args.tier == TierArg::Confined => {
            bail!("cannot confine the command: {why}")
        }
        (Some(landlock), isolation) => {
            eprintln!(
                "veris: the command runs in the plain explicit tier: clients that ignore HTTPS_PROXY are not seen (leaks: direct-egress-possible). Not isolated: {}; not confined: {landlock}",
                isolation.unwrap_or_default()
            );
            Ok(Box::new(Explicit))
        }
    }
}

/// An isolated run's app listens inside the run's network namespace,
/// where only loopback exists, and deliveries go there: a `--webhook` URL
/// of another host would be redirected to the proxy itself. Refused
/// whenever the run may be isolated, so the same command line means the
/// same thing on every machine (isolation available or not).
fn webhooks_reach_the_namespace(values: &[String]) -> Result<()> {
    for value in values {
        let webhook = crate::runtime::stack::parse_webhook(value)?;
        if !webhook.loopback() {
            bail!("--webhook {value:?}: an isolated run delivers into the command's own network namespace, where only loopback exists. Next: let the app listen on 127.0.0.1 and name that (e.g. stripe=http://127.0.0.1:4242/webhook), or run with --tier confined to deliver to {} on the host's network", webhook.url());
        }
    }
    Ok(())
}

/// The CA bundles the command's Python and Java ship ([`crate::tier::bundles`]),
/// but those a private /tmp hides from it (they could not be read there),
/// and those `--trust-file` names already.
fn runtime_bundles(args: &RunArgs) -> Vec<crate::tier::bundles::Bundle> {
    let state = crate::util::state_dir(args.proxy.state_dir.clone());
    let cache = state.join(crate::tier::bundles::CACHE_FILE);
    let began = std::time::Instant::now();
    let mut found =
        crate::tier::bundles::scan(&crate::tier::bundles::Env::from_env(), Some(&cache));
    tracing::debug!(
        files = found.len(),
        took_us = began.elapsed().as_micros() as u64,
        "scanned for the CA bundles the command's runtimes ship"
    );
    let cwd: Vec<PathBuf> = std::env::current_dir().into_iter().collect();
    let given: Vec<PathBuf> = args
        .trust_file
        .iter()
        .filter_map(|f| std::fs::canonicalize(f).ok())
        .collect();
    found.retain(|b| {
        (args.share_tmp || !crate::tier::isolated::hidden_by_private_tmp(&b.path, &cwd))
            && !given.contains(&b.path)
    });
    found
}

/// The receipt of a finished session, anchored on the proxy's own final
/// seal and key (held in this process, never on disk): the file must hold
/// exactly the chain the proxy wrote up to that seal.
pub fn finished_receipt(f: &Finished) -> Result<(LedgerRead, Options)> {
    let read = ledger::read(&f.ledger_path)
        .with_context(|| format!("reading ledger {}", f.ledger_path.display()))?;
    let options = Options {
        scope: WindowSpec::LatestSession,
        proxy_live: true,
        until: f.seal.as_ref().map(|s| s.seq),
        anchor: match &f.seal {
            Some(seal) => Anchor::Live {
                seal: seal.clone(),
                public_key: f.public_key.clone(),
                channel: LiveChannel::InProcess,
            },
            None => Anchor::None,
        },
        external_checks: f.checks.clone(),
        seal_failure: f.seal.is_none().then(|| f.seal_error.clone()).flatten(),
        ..Options::default()
    };
    Ok((read, options))
}

/// How long the command's leftover processes get after SIGTERM before
/// SIGKILL, and how long the whole ending may take.
const LEFTOVER_GRACE: std::time::Duration = std::time::Duration::from_millis(500);
const LEFTOVER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// Ends every process the command left running, and says so as the
/// `descendants` check: `ok` when none is left, `unverified` naming each
/// one that could not be ended (it could still rewrite this run's files or
/// send traffic after its window).
async fn end_leftovers() -> Check {
    let ending = tokio::task::spawn_blocking(|| {
        crate::os::procs::end_descendants(LEFTOVER_GRACE, LEFTOVER_DEADLINE)
    })
    .await
    .unwrap_or_default();
    leftover_check(&ending)
}

fn leftover_check(ending: &crate::os::procs::Ending) -> Check {
    use veris_receipt::receipt::CheckStatus;
    if ending.left.is_empty() {
        return Check {
            name: "descendants".into(),
            status: CheckStatus::Ok,
            detail: match ending.ended {
                0 => "the command left no process running".into(),
                n => format!("the command left {n} process(es) running; veris ended them before writing the receipt"),
            },
        };
    }
    let named: Vec<String> = ending
        .left
        .iter()
        .map(|p| format!("pid {} ({:?}, state {})", p.pid, p.name, p.state))
        .collect();
    warn!(processes = %named.join(", "), "processes of the command could not be ended");
    Check {
        name: "descendants".into(),
        status: CheckStatus::Unverified,
        detail: format!(
            "{} process(es) the command started outlived it and could not be ended: {}; they may still send traffic or rewrite this run's files",
            named.len(),
            named.join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_found_like_a_shell_finds_them() {
        assert_eq!(findable("sh"), Ok(()));
        assert_eq!(findable("/bin/sh"), Ok(()));
        assert_eq!(findable("veris-no-such-command").unwrap_err().0, 127);
        assert_eq!(findable("/no/such/file").unwrap_err().0, 127);
        assert_eq!(findable("/etc/passwd").unwrap_err().0, 126);
    }

    #[test]
    fn a_process_that_could_not_be_ended_is_named_in_quotes() {
        use crate::os::procs::{Descendant, Ending};
        let none = leftover_check(&Ending::default());
        assert_eq!(none.status, veris_receipt::receipt::CheckStatus::Ok);
        let ended = leftover_check(&Ending {
            ended: 2,
            left: Vec::new(),
        });
        assert!(
            ended.detail.contains("left 2 process(es)"),
            "{}",
            ended.detail
        );
        let left = leftover_check(&Ending {
            ended: 1,
            left: vec![Descendant {
                pid: 42,
                name: "x\nFAIL: y".into(),
                state: 'D',
            }],
        });
        assert_eq!(left.status, veris_receipt::receipt::CheckStatus::Unverified);
        assert!(
            left.detail.contains(r#"pid 42 ("x\nFAIL: y", state D)"#),
            "{}",
            left.detail
        );
    }

    #[test]
    fn the_unmet_requirement_is_named() {
        let verdict = veris_receipt::Verdict {
            exit_code: 3,
            lines: vec![
                "required service stripe: at least 2 request(s) answered 2xx; saw 1".into(),
            ],
            outcomes: Vec::new(),
            requirements: Vec::new(),
        };
        assert_eq!(
            unmet(&verdict),
            "requirement unmet: required service stripe: at least 2 request(s) answered 2xx; saw 1"
        );
    }
}
