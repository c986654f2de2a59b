//! `veris completions SHELL`: a completion script for the visible commands.

use std::process::ExitCode;

/// Prints the completion script of `cli` for `shell`.
pub fn completions(shell: clap_complete::Shell, cli: &clap::Command) -> ExitCode {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut visible(cli), "veris", &mut out);
    print_bytes(&out)
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

/// Generated output (completions, the manual page) to stdout.
pub(crate) fn print_bytes(bytes: &[u8]) -> ExitCode {
    crate::out!("{}", String::from_utf8_lossy(bytes));
    ExitCode::SUCCESS
}
