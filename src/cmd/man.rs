//! `veris man [SUBCOMMAND]`: the manual pages (roff). `veris man` is
//! veris(1), one page for every command; `veris man run` is veris-run(1),
//! the subcommand's options with its EXIT STATUS, ENVIRONMENT, FILES and
//! EXAMPLES, as man-pages(7) orders a command's page.

use std::process::ExitCode;

use clap_mangen::roff::{bold, roman, Roff};

/// Prints veris(1), or the page of `sub` (`veris-SUB(1)`).
pub fn man(cli: clap::Command, sub: Option<&str>) -> ExitCode {
    let page = match sub {
        None => render(&cli, |m, out| m.render(out)).map(|p| one_page(&title_first(&p), "veris")),
        Some(name) => {
            let Some(cmd) = cli
                .get_subcommands()
                .find(|c| c.get_name() == name && !c.is_hide_set())
            else {
                let known: Vec<&str> = cli
                    .get_subcommands()
                    .filter(|c| !c.is_hide_set() && c.get_name() != "help")
                    .map(|c| c.get_name())
                    .collect();
                eprintln!(
                    "veris man: no command {name:?}. Next: one of {}",
                    known.join(", ")
                );
                return ExitCode::from(crate::util::EXIT_USAGE);
            };
            subcommand_page(cmd, name)
        }
    };
    match page {
        Ok(page) => super::completions::print_bytes(page.as_bytes()),
        Err(e) => {
            eprintln!("veris: rendering the manual page: {e}");
            ExitCode::from(crate::util::EXIT_USAGE)
        }
    }
}

/// Renders `cmd` with `how` into a string.
fn render(
    cmd: &clap::Command,
    how: impl FnOnce(&clap_mangen::Man, &mut Vec<u8>) -> std::io::Result<()>,
) -> std::io::Result<String> {
    let mut out = Vec::new();
    how(&clap_mangen::Man::new(cmd.clone()), &mut out)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// veris-SUB(1): clap's sections for the subcommand, then the ones a user
/// looks for in a command's page.
fn subcommand_page(cmd: &clap::Command, name: &str) -> std::io::Result<String> {
    let cmd = cmd
        .clone()
        .name(format!("veris-{name}"))
        .bin_name(format!("veris {name}"));
    let page = render(&cmd, |m, out| {
        m.render_title(out)?;
        m.render_name_section(out)?;
        m.render_synopsis_section(out)?;
        m.render_description_section(out)?;
        m.render_options_section(out)?;
        if cmd.get_subcommands().any(|c| !c.is_hide_set()) {
            m.render_subcommands_section(out)?;
        }
        Ok(())
    })?;
    let mut roff = Roff::new();
    roff.control("SH", ["EXIT STATUS"]);
    for &(code, meaning) in EXIT_STATUS {
        roff.control("TP", [])
            .text([bold(code)])
            .text([roman(meaning)]);
    }
    roff.control("SH", ["ENVIRONMENT"]);
    for &(var, meaning) in ENVIRONMENT {
        roff.control("TP", [])
            .text([bold(var)])
            .text([roman(meaning)]);
    }
    roff.control("SH", ["FILES"]);
    for &(file, meaning) in FILES {
        roff.control("TP", [])
            .text([bold(file)])
            .text([roman(meaning)]);
    }
    let examples = examples(name);
    if !examples.is_empty() {
        roff.control("SH", ["EXAMPLES"]);
        for &(what, lines) in examples {
            roff.control("TP", []).text([roman(what)]);
            roff.control("EX", []);
            for line in lines.lines() {
                roff.text([roman(line)]);
            }
            roff.control("EE", []);
        }
    }
    roff.control("SH", ["SEE ALSO"]);
    roff.text([
        bold("veris"),
        roman("(1), "),
        roman("docs/cli.md in the veris sources for every flag's full story."),
    ]);
    let extra = roff.to_roff();
    let words = format!("veris {name}");
    Ok(one_page(
        &format!(
            "{}{}",
            title_first(&page),
            // clap_mangen defines the apostrophe string in its own part;
            // ours uses none, so only its sections follow.
            extra
                .split_once(".ie \\n(.g .ds Aq")
                .map_or(extra.as_str(), |(_, rest)| rest
                    .split_once('\n')
                    .map_or("", |(_, r)| r))
        ),
        &words,
    ))
}

/// veris's exit codes, the same for every command (docs/cli.md).
const EXIT_STATUS: &[(&str, &str)] = &[
    ("0", "Success."),
    (
        "1",
        "Usage or configuration error, or an I/O error (a ledger that cannot be read, a --receipt or --junit path that cannot be written).",
    ),
    (
        "2",
        "veris check failed (no run to check, no proxy, not veris, or another run's); veris doctor: a check FAILed.",
    ),
    (
        "3",
        "A requirement unmet: --require..., --require-verified, an empty receipt, a fatal trust failure, integrity failed.",
    ),
    (
        "126, 127",
        "veris run: the command is not executable, or not found.",
    ),
    (
        "other",
        "veris run returns the command's own exit code when the receipt holds.",
    ),
];

/// What veris reads from the environment (docs/cli.md, Environment).
const ENVIRONMENT: &[(&str, &str)] = &[
    (
        "VERIS_STATE_DIR",
        "The state dir when --state-dir is not given (default ~/.veris).",
    ),
    (
        "VERIS_LOG",
        "The log filter (then RUST_LOG), e.g. veris_proxy=debug.",
    ),
    (
        "VERIS_ADMIN_TOKEN",
        "The admin token, for a reader whose uid cannot read admin.token.",
    ),
    (
        "VERIS_PROXY_URL, VERIS_CANARY",
        "Set by veris run for its command; read by veris check.",
    ),
    (
        "VERIS_SYSTEM_CA_BUNDLE",
        "The system roots the trust bundle is built from.",
    ),
    ("NO_COLOR", "No colour in logs."),
    (
        "NOTIFY_SOCKET",
        "systemd readiness: serve and gateway send READY=1 once they accept, STOPPING=1 when they stop. No child inherits it.",
    ),
];

/// Where veris keeps its state (docs/cli.md, the state dir).
const FILES: &[(&str, &str)] = &[
    (
        "~/.veris/ledger.jsonl",
        "The signed, hash-chained ledger of a serve (a run's is under runs/).",
    ),
    (
        "~/.veris/ca/",
        "The interception CA (veris-ca.pem) and its key (0600).",
    ),
    (
        "~/.veris/admin.addr, ~/.veris/admin.token",
        "Where a live proxy's admin API listens, and its bearer token (0600).",
    ),
    (
        "~/.veris/runs/",
        "One directory per veris run: its ledger and run.json.",
    ),
    (
        "~/.veris/sandboxes/",
        "A gateway's sandboxes: one directory each, with its ledger and record.",
    ),
];

/// A few invocations per command: what they do, and the line.
fn examples(name: &str) -> &'static [(&'static str, &'static str)] {
    match name {
        "serve" => &[
            ("Serve the explicit tier on the defaults, writing the proxy variables for a workload:", "veris serve --write-env /tmp/veris.env"),
            ("Serve, with a fixed scrape address for Prometheus:", "veris serve --metrics-listen 127.0.0.1:9479"),
        ],
        "gateway" => &[
            ("Run a gateway, then register a sandbox and print its proxy URL:", "veris gateway --listen 0.0.0.0:1080 &\nveris gateway add-sandbox sbx-1"),
        ],
        "run" => &[
            ("Run a script; exit 3 unless a Stripe request reached the twin:", "veris run --require stripe:1 -- python3 charge.py"),
            ("Deliver webhooks to the app the command starts, and require one:", "veris run --webhook stripe=http://127.0.0.1:4242/webhook --require-callback /webhook -- ./test.sh"),
        ],
        "receipt" => &[
            ("The receipt of the live proxy's session, failing CI unless verified:", "veris receipt --require stripe:1 --require-verified"),
            ("Only what happened after a baseline, as JUnit for CI:", "veris receipt --since \"$BASE\" --junit receipt.xml"),
        ],
        "runs" => &[("The runs of the default state dir:", "veris runs")],
        "har" => &[("The live session as a HAR file:", "veris har -o session.har")],
        "check" => &[("Is this process's traffic going through its veris?", "veris check")],
        "baseline" => &[("Mark now, then read only what follows:", "BASE=$(veris baseline)\nveris receipt --since \"$BASE\"")],
        "twin" => &[("The built-in twin on a fixed port:", "veris twin --listen 127.0.0.1:8787")],
        "ca" => &[
            ("Make the CA and the trust files:", "veris ca init"),
            ("Make the next CA before this one expires:", "veris ca rotate"),
        ],
        "fleet-key" => &[("Make the fleet's operator key, to keep offline:", "veris fleet-key new --out operator")],
        "demo" => &[("Everything offline, start to receipt:", "veris demo")],
        "trigger" => &[("Deliver one customer.created to a live serve's webhook:", "veris trigger stripe customer.created")],
        "replay" => &[("Deliver an event again:", "veris replay evt_123")],
        "tui" => &[("Watch the live proxy's traffic:", "veris tui")],
        "doctor" => &[("What would make a run fail here:", "veris doctor")],
        "mcp" => &[("The MCP server for an agent, reading /veris:", "veris mcp --state-dir /veris")],
        "completions" => &[("Bash completions for this user:", "veris completions bash > ~/.local/share/bash-completion/completions/veris")],
        "man" => &[("A subcommand's page:", "veris man run | man -l -")],
        _ => &[],
    }
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

/// The page of `command` (its words: `veris`, `veris gateway`) with each
/// reference to a subcommand's page (`veris\-gateway\-add\-sandbox(1)`, as
/// clap_mangen names them, though only veris(1) and `veris man SUB`'s pages
/// exist) made the command and where its options are.
fn one_page(page: &str, command: &str) -> String {
    let prefix = format!("{}\\-", command.replace(' ', "\\-"));
    let mut out = String::with_capacity(page.len());
    for line in page.split_inclusive('\n') {
        let bare = line.trim_end_matches('\n');
        match bare
            .strip_prefix(prefix.as_str())
            .and_then(|rest| rest.strip_suffix("(1)"))
        {
            Some(sub) if !sub.contains(' ') => {
                out.push_str(&format!(
                    "\\fB{command} {sub}\\fR (options: \\fB{command} {sub} \\-\\-help\\fR)\n"
                ));
            }
            _ => out.push_str(line),
        }
    }
    out
}
