//! `veris completions SHELL`: a completion script for the visible commands,
//! each value completed by its kind (see [`by_kind`]).

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
        .args(cmd.get_arguments().map(by_kind))
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

/// What a value is, for the shells: directories for a `DIR` flag
/// (`--state-dir`, `--ca-dir`, ...), files for any other path, and the
/// catalog's service names for `--services` and `--require`. Only the copy
/// the scripts are generated from carries them: what the command line
/// accepts is unchanged (a configured route may name a service the catalog
/// lacks, and a requirement takes `:N` and `status=` after the name).
fn by_kind(arg: &clap::Arg) -> clap::Arg {
    use clap::builder::{PossibleValuesParser, ValueHint};
    let arg = arg.clone();
    let dir = arg
        .get_value_names()
        .is_some_and(|names| names.iter().any(|n| n == "DIR"));
    if dir {
        arg.value_hint(ValueHint::DirPath)
    } else if arg.get_value_hint() == ValueHint::AnyPath {
        arg.value_hint(ValueHint::FilePath)
    } else if matches!(arg.get_id().as_str(), "services" | "require") {
        arg.value_parser(PossibleValuesParser::new(veris_proxy::catalog::names()))
    } else {
        arg
    }
}

/// Generated output (completions, the manual page) to stdout.
pub(crate) fn print_bytes(bytes: &[u8]) -> ExitCode {
    crate::out!("{}", String::from_utf8_lossy(bytes));
    ExitCode::SUCCESS
}
