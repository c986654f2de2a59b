//! The `veris` binary: parses the command line, reads env, files and signals,
//! and wires the library crates together. It is the only place that does so.
#![deny(unsafe_code)]

mod baseline;
mod bundles;
mod ca_cmd;
mod check;
mod confine;
mod demo;
mod doctor;
mod handover;
mod har_cmd;
mod isolate;
mod junit;
mod ledgers;
mod live;
mod logging;
mod mcp;
mod receipt_cmd;
mod run;
mod runs_cmd;
mod stack;
mod sys;
mod transparent;
mod tui_cmd;
mod twin_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// Exit code for usage and configuration errors.
pub const EXIT_USAGE: u8 = 1;

#[derive(Parser)]
#[command(
    name = "veris",
    version,
    about = "Egress interception proxy and receipt reporter: route vendor API calls to a twin and prove they happened"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: logging::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the interception proxy (explicit tier; with --transparent also the
    /// redirected one) until SIGINT/SIGTERM.
    Serve(stack::ServeArgs),
    /// Run a command behind the proxy, then print this run's receipt to stderr.
    ///
    /// The run writes a ledger of its own (<state>/runs/<run_id>/ledger.jsonl), sealed by a key
    /// that exists only in this process: the command cannot forge its receipt, and the receipt
    /// prints the key's fingerprint to verify the ledger later (`veris receipt --key`). In CI and
    /// agent tools add --require-verified, so anything short of `integrity: verified` exits 3.
    Run(run::RunArgs),
    /// Summarize what reached the twin, from a state dir or a ledger file.
    Receipt(receipt_cmd::ReceiptArgs),
    /// List the runs of a state dir, newest first: id, start, command and
    /// the verdict of each run's own ledger (read without a pin, so a
    /// finished run is `unverified`; ledgers over 16 MiB are not judged).
    Runs(runs_cmd::RunsArgs),
    /// Export the receipt's window as a HAR 1.2 document (one entry per request
    /// that reached the twin), for HAR viewers and browser devtools.
    Har(har_cmd::HarArgs),
    /// Check that this run's proxy answers the canary on the interception path (exit 2 if not).
    Check(check::CheckArgs),
    /// Print a token marking now, for `veris receipt --since TOKEN`.
    Baseline(baseline::BaselineArgs),
    /// Run the built-in twin.
    Twin(twin_cmd::TwinArgs),
    /// Manage the interception CA and its trust material.
    #[command(subcommand)]
    Ca(ca_cmd::CaCommand),
    /// Offline demo: built-in twin, proxy, real HTTPS requests, receipt.
    Demo(demo::DemoArgs),
    /// Watch twin traffic live (admin API, state dir or ledger file).
    Tui(tui_cmd::TuiArgs),
    /// Check what makes runs fail (CA, trust, env, namespaces, nft, the live
    /// proxy and its canary, clock, permissions): one line per check, with
    /// the next step for each problem; exit 2 when one FAILs.
    Doctor(doctor::DoctorArgs),
    /// Serve baseline, receipt and check as MCP tools on stdio, for an agent
    /// session (register `veris mcp` as a stdio server in the MCP client).
    Mcp(mcp::McpArgs),
    /// Print a shell completion script, e.g. `veris completions bash > /etc/bash_completion.d/veris`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), e.g. `veris man | man -l -`.
    Man,
    /// Internal to `veris run`: confine this process's TCP connects to the
    /// given ports with Landlock, then exec the command.
    #[command(name = "__confine", hide = true)]
    Confine(confine::ConfineArgs),
    /// Internal to `veris run`: set up the isolated namespace (see `isolate`).
    #[command(name = "__isolate", hide = true)]
    Isolate(InternalCommand),
    /// Internal to `veris run`: pid 1 of the isolated run's PID namespace.
    #[command(name = "__isolate-init", hide = true)]
    IsolateInit(InternalCommand),
    /// Internal to `veris demo`: the client it runs behind the proxy.
    #[command(name = "__demo-client", hide = true)]
    DemoClient,
    /// Internal to `veris doctor`: try the isolated run's namespace steps.
    #[command(name = "__isolate-probe", hide = true)]
    IsolateProbe,
}

/// The command an internal step runs, after `--`.
#[derive(clap::Args)]
struct InternalCommand {
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    // Before logging and the runtime: the process must still be single-threaded
    // when it confines itself and execs.
    let cli = match cli.command {
        Command::Confine(args) => return confine::main(args),
        Command::Isolate(c) => return ExitCode::from(isolate::init_main(c.command)),
        Command::IsolateInit(c) => return ExitCode::from(isolate::pid1_main(c.command)),
        Command::IsolateProbe => return ExitCode::from(isolate::probe_main()),
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut visible(&Cli::command()), "veris", &mut out);
            return print_bytes(&out);
        }
        Command::Man => {
            let mut out = Vec::new();
            return match clap_mangen::Man::new(Cli::command()).render(&mut out) {
                Ok(()) => {
                    print_bytes(one_page(&title_first(&String::from_utf8_lossy(&out))).as_bytes())
                }
                Err(e) => {
                    eprintln!("veris: rendering the manual page: {e}");
                    ExitCode::from(EXIT_USAGE)
                }
            };
        }
        _ => cli,
    };
    let default_level = match cli.command {
        Command::Serve(_) | Command::Twin(_) => "info",
        _ => "warn",
    };
    match &cli.command {
        // The TUI owns the terminal: its logs go to a file.
        Command::Tui(args) => tui_cmd::init_logging(args),
        _ => logging::init(cli.log_format, default_level),
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("veris: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => stack::serve(args).await,
            // After the privilege drop the child would run as the exempt proxy uid.
            Command::Run(args) if args.transparent => Err(transparent::only_for_serve("run")),
            Command::Demo(args) if args.transparent => Err(transparent::only_for_serve("demo")),
            Command::Run(args) => run::run(args).await,
            Command::Receipt(args) => receipt_cmd::receipt(args).await,
            Command::Har(args) => har_cmd::har(args).await,
            Command::Runs(args) => runs_cmd::runs(args).await,
            Command::Check(args) => check::check(args).await,
            Command::Baseline(args) => baseline::baseline(args).await,
            Command::Twin(args) => twin_cmd::twin(args).await,
            Command::Ca(cmd) => ca_cmd::ca(cmd),
            Command::Demo(args) => demo::demo(args).await,
            Command::DemoClient => demo::client_main().await,
            Command::Tui(args) => tui_cmd::tui(args).await,
            Command::Mcp(args) => mcp::mcp(args).await,
            Command::Doctor(args) => doctor::doctor(args).await,
            // Handled at the top of main, before the runtime exists.
            Command::Confine(_)
            | Command::Isolate(_)
            | Command::IsolateInit(_)
            | Command::IsolateProbe
            | Command::Completions { .. }
            | Command::Man => {
                unreachable!("these commands return before the runtime starts")
            }
        }
    });
    // Do not wait for lingering tasks (tunnels, idle pools) at exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("veris: {e:#}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// `--state-dir`, else `$VERIS_STATE_DIR`, else `~/.veris`.
pub fn state_dir(flag: Option<PathBuf>) -> PathBuf {
    let dir = flag
        .or_else(|| std::env::var_os("VERIS_STATE_DIR").map(PathBuf::from))
        .unwrap_or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/tmp"))
                .join(".veris")
        });
    // Absolute, so the paths written into env and ready files still work
    // when they are read from another directory.
    std::path::absolute(&dir).unwrap_or(dir)
}

/// `println!` for command output: a reader that closed the pipe early
/// (`veris receipt | head -1`) ends the output quietly instead of panicking.
#[macro_export]
macro_rules! outln {
    () => { $crate::emit(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::emit(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` with the same treatment of a closed pipe as [`outln!`].
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::emit(format_args!($($arg)*)) };
}

/// Writes to stdout; a broken pipe is not an error, anything else is reported on stderr.
pub fn emit(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("veris: writing to stdout: {e}");
        }
    }
}

/// The command line without its hidden (internal) subcommands: the
/// completion generators list every subcommand they are given, while the
/// help and the manual page leave hidden ones out by themselves.
fn visible(cmd: &clap::Command) -> clap::Command {
    let mut out = clap::Command::new(cmd.get_name().to_string())
        .args(cmd.get_arguments().cloned())
        .groups(cmd.get_groups().cloned())
        .subcommands(
            cmd.get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(visible),
        );
    if let Some(about) = cmd.get_about() {
        out = out.about(about.clone());
    }
    if let Some(version) = cmd.get_version() {
        out = out.version(version.to_string());
    }
    out
}

/// The page with its `.TH` title line first: clap_mangen puts the
/// definition of the apostrophe string (`.ie \n(.g .ds Aq …`) before it,
/// and tools that look for a page's title (`file`, `whatis`, `lexgrog`) read
/// the first line. The definition works as well after the title.
fn title_first(page: &str) -> String {
    let Some(at) = page.find("\n.TH ") else {
        return page.to_string();
    };
    let end = page[at + 1..]
        .find('\n')
        .map_or(page.len(), |e| at + 1 + e + 1);
    format!("{}{}{}", &page[at + 1..end], &page[..at + 1], &page[end..])
}

/// The page without references to pages that do not exist: clap_mangen
/// names each subcommand as a page of its own (`veris\-run(1)`), and only
/// `veris(1)` is shipped. Each becomes the command and where its options are.
fn one_page(page: &str) -> String {
    let mut out = String::with_capacity(page.len());
    for line in page.split_inclusive('\n') {
        let bare = line.trim_end_matches('\n');
        match bare
            .strip_prefix("veris\\-")
            .and_then(|rest| rest.strip_suffix("(1)"))
        {
            Some(sub) if !sub.contains(' ') => {
                out.push_str(&format!(
                    "\\fBveris {sub}\\fR (options: \\fBveris {sub} \\-\\-help\\fR)\n"
                ));
            }
            _ => out.push_str(line),
        }
    }
    out
}

/// Generated output (completions, the manual page) to stdout.
fn print_bytes(bytes: &[u8]) -> ExitCode {
    crate::out!("{}", String::from_utf8_lossy(bytes));
    ExitCode::SUCCESS
}

/// Random lower-case hex from the kernel's CSPRNG.
pub fn random_hex(bytes: usize) -> anyhow::Result<String> {
    use std::io::Read;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| anyhow::anyhow!("reading /dev/urandom: {e}"))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}
