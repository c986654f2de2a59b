//! `veris __confine`: internal to `veris run`, confines its own TCP connects
//! with Landlock ([`crate::os::landlock`]), then execs the command.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use clap::Args;

use crate::os::landlock::confine_connect;

/// Exit code when the command cannot be started, as a shell uses.
const EXIT_CANNOT_START: u8 = 127;

/// `veris __confine --allow-port PORT ... -- CMD [ARGS...]`.
#[derive(Args, Debug)]
pub struct ConfineArgs {
    /// A TCP port the command may connect to, on any address; repeat for more.
    /// With none, every TCP connect is refused.
    #[arg(long = "allow-port", value_name = "PORT")]
    pub allow_port: Vec<u16>,
    /// The command to exec, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// `veris __confine`: confine this process, then become the command. Runs
/// before the async runtime exists, so the process is single-threaded and
/// the rules cover the only thread there is.
pub fn main(args: ConfineArgs) -> ExitCode {
    if let Err(e) = confine_connect(&args.allow_port) {
        eprintln!("veris: cannot confine the command: {e:#}");
        return ExitCode::from(crate::util::EXIT_USAGE);
    }
    let Some((program, rest)) = args.command.split_first() else {
        // clap requires at least one word after `--`; this is for completeness.
        eprintln!("veris: no command given after `--`");
        return ExitCode::from(crate::util::EXIT_USAGE);
    };
    // exec returns only on failure; the environment is inherited as it is.
    let e = std::process::Command::new(program).args(rest).exec();
    eprintln!(
        "veris: cannot start {}: {e}. Next: check the command name and PATH",
        program.to_string_lossy()
    );
    ExitCode::from(EXIT_CANNOT_START)
}
