//! The `veris` binary: parses the command line and dispatches to the command
//! (`cmd`). Below the commands: the runtime they share (`runtime`), the
//! interception tiers (`tier`), the OS glue (`os`) and helpers (`util`,
//! `logging`); imports run only downward. Unsafe code is denied
//! (`[workspace.lints]`) but in the `os` modules that allow it, each saying why.

mod cmd;
mod logging;
mod os;
mod runtime;
mod tier;
mod util;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

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
    Serve(runtime::stack::ServeArgs),
    /// Run a gateway: one veris outside many sandboxes, reached through
    /// their platform's SOCKS5 or CONNECT egress setting, each sandbox with
    /// its own credential, ledger and receipt; or manage its sandboxes.
    Gateway(cmd::gateway::GatewayCmd),
    /// Run a command behind the proxy, then print this run's receipt to stderr.
    ///
    /// The run writes a ledger of its own (<state>/runs/<run_id>/ledger.jsonl), sealed by a key
    /// that exists only in this process: the command cannot forge its receipt, and the receipt
    /// prints the key's fingerprint to verify the ledger later (`veris receipt --key`). In CI and
    /// agent tools add --require-verified, so anything short of `integrity: verified` exits 3.
    Run(cmd::run::RunArgs),
    /// Summarize what reached the twin, from a state dir or a ledger file.
    Receipt(runtime::receipt::ReceiptArgs),
    /// List the runs of a state dir, newest first: id, start, command and
    /// the verdict of each run's own ledger (read without a pin, so a
    /// finished run is `unverified`; ledgers over 16 MiB are not judged).
    Runs(cmd::runs::RunsArgs),
    /// Export the receipt's window as a HAR 1.2 document (one entry per request
    /// that reached the twin), for HAR viewers and browser devtools.
    Har(cmd::har::HarArgs),
    /// Check that this run's proxy answers the canary on the interception path (exit 2 if not).
    Check(cmd::check::CheckArgs),
    /// Print a token marking now, for `veris receipt --since TOKEN`.
    Baseline(cmd::baseline::BaselineArgs),
    /// Run the built-in twin.
    Twin(cmd::twin::TwinArgs),
    /// Manage the interception CA and its trust material.
    #[command(subcommand)]
    Ca(cmd::ca::CaCommand),
    /// Manage the fleet's operator key and the gateway identities it
    /// certifies (readers pin it: veris receipt --fleet-key).
    #[command(subcommand)]
    FleetKey(cmd::fleet_key::FleetKeyCommand),
    /// Offline demo: built-in twin, proxy, real HTTPS requests, receipt.
    Demo(cmd::demo::DemoArgs),
    /// Ask a live `serve` to deliver one webhook event now, for a fixture
    /// object (like `stripe trigger`); never counted by --require-callback.
    Trigger(cmd::trigger::TriggerArgs),
    /// Ask a live `serve` to deliver again an event it delivered (by id);
    /// never counted by --require-callback.
    Replay(cmd::replay::ReplayArgs),
    /// Watch twin traffic live (admin API, state dir or ledger file).
    Tui(cmd::tui::TuiArgs),
    /// Check what makes runs fail (CA, trust, env, namespaces, nft, the live
    /// proxy and its canary, clock, permissions): one line per check, with
    /// the next step for each problem; exit 2 when one FAILs.
    Doctor(cmd::doctor::DoctorArgs),
    /// Serve baseline, receipt and check as MCP tools on stdio, for an agent
    /// session (register `veris mcp` as a stdio server in the MCP client).
    #[cfg(feature = "mcp")]
    Mcp(cmd::mcp::McpArgs),
    /// Not in this build (built without the `mcp` feature): says so, exit 1.
    #[cfg(not(feature = "mcp"))]
    #[command(hide = true)]
    Mcp {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Print a shell completion script, e.g. `veris completions bash > /etc/bash_completion.d/veris`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), e.g. `veris man | man -l -`; with a
    /// command, that command's own page (options, exit status, environment,
    /// files, examples), e.g. `veris man run | man -l -`.
    Man {
        /// The command whose page to print (veris(1) without one).
        #[arg(value_name = "COMMAND")]
        command: Option<String>,
    },
    /// Internal to `veris run`: confine this process's TCP connects to the
    /// given ports with Landlock, then exec the command.
    #[command(name = "__confine", hide = true)]
    Confine(cmd::confine::ConfineArgs),
    /// Internal to `veris run`: set up the isolated namespace (see `isolate`).
    #[command(name = "__isolate", hide = true)]
    Isolate(InternalCommand),
    /// Internal to `veris run`: pid 1 of the isolated run's PID namespace.
    #[command(name = "__isolate-init", hide = true)]
    IsolateInit(InternalCommand),
    /// Internal to `veris demo`: the client it runs behind the proxy.
    #[command(name = "__demo-client", hide = true)]
    DemoClient(cmd::demo::ClientArgs),
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
    // While single-threaded, and before any child: no workload inherits it.
    os::notify::take_socket();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { util::EXIT_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    // Before logging and the runtime: the process must still be single-threaded
    // when it confines itself and execs.
    let cli = match cli.command {
        Command::Confine(args) => return cmd::confine::main(args),
        Command::Isolate(c) => return ExitCode::from(tier::isolated::init_main(c.command)),
        Command::IsolateInit(c) => return ExitCode::from(tier::isolated::pid1_main(c.command)),
        Command::IsolateProbe => return ExitCode::from(tier::isolated::probe_main()),
        Command::Completions { shell } => {
            return cmd::completions::completions(shell, &Cli::command())
        }
        Command::Man { command } => return cmd::man::man(Cli::command(), command.as_deref()),
        _ => cli,
    };
    let default_level = match cli.command {
        Command::Serve(_) | Command::Twin(_) => "info",
        Command::Gateway(ref g) if g.action.is_none() => "info",
        _ => "warn",
    };
    match &cli.command {
        // The TUI owns the terminal: its logs go to a file.
        Command::Tui(args) => cmd::tui::init_logging(args),
        _ => logging::init(cli.log_format, default_level),
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("veris: cannot start the async runtime: {e}");
            return ExitCode::from(util::EXIT_USAGE);
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => cmd::serve::serve(args).await,
            Command::Gateway(args) => cmd::gateway::gateway(args).await,
            // After the privilege drop the child would run as the exempt proxy uid.
            Command::Run(args) if args.transparent => Err(tier::transparent::only_for_serve("run")),
            Command::Demo(args) if args.transparent => {
                Err(tier::transparent::only_for_serve("demo"))
            }
            Command::Run(args) => cmd::run::run(args).await,
            Command::Receipt(args) => cmd::receipt::receipt(args).await,
            Command::Har(args) => cmd::har::har(args).await,
            Command::Runs(args) => cmd::runs::runs(args).await,
            Command::Check(args) => cmd::check::check(args).await,
            Command::Baseline(args) => cmd::baseline::baseline(args).await,
            Command::Twin(args) => cmd::twin::twin(args).await,
            Command::Ca(cmd) => cmd::ca::ca(cmd),
            Command::FleetKey(cmd) => cmd::fleet_key::fleet_key(cmd),
            Command::Demo(args) => cmd::demo::demo(args).await,
            Command::DemoClient(args) => cmd::demo::client_main(args).await,
            Command::Trigger(args) => cmd::trigger::trigger(args).await,
            Command::Replay(args) => cmd::replay::replay(args).await,
            Command::Tui(args) => cmd::tui::tui(args).await,
            #[cfg(feature = "mcp")]
            Command::Mcp(args) => cmd::mcp::mcp(args).await,
            #[cfg(not(feature = "mcp"))]
            Command::Mcp { .. } => {
                eprintln!("veris: this build has no MCP server (built without the `mcp` feature)");
                Ok(util::EXIT_USAGE)
            }
            Command::Doctor(args) => cmd::doctor::doctor(args).await,
            // Handled at the top of main, before the runtime exists.
            Command::Confine(_)
            | Command::Isolate(_)
            | Command::IsolateInit(_)
            | Command::IsolateProbe
            | Command::Completions { .. }
            | Command::Man { .. } => {
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
            ExitCode::from(util::EXIT_USAGE)
        }
    }
}
