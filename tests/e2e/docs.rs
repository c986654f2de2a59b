//! The README and `docs/` say what the program does: every command they show
//! in a shell block that starts with `veris ` is checked here. The ones that
//! are safe to run on this machine (loopback only, the built-in twin, a temp
//! state dir) are run for real and their outcome asserted; every other one
//! is parsed by the binary itself (`--help` appended: clap rejects an
//! unknown subcommand or flag, or a bad value, before it prints any help),
//! so a doc that shows a flag that does not exist fails this test.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::{output_within, text, veris, Guard, TempDir};

/// One `veris …` command shown in a doc.
#[derive(Debug, Clone)]
struct DocCommand {
    /// `README.md:12`.
    at: String,
    /// The words as a shell would split them (expansions become `X`).
    words: Vec<String>,
}

impl DocCommand {
    /// The words joined by one space: the key of [`REAL`].
    fn key(&self) -> String {
        self.words.join(" ")
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every page in docs/, with their text.
fn doc_files() -> Vec<(String, String)> {
    let mut names = vec!["README.md".to_string()];
    let mut pages: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    pages.sort();
    assert!(!pages.is_empty(), "no pages in docs/");
    names.extend(pages);
    names
        .into_iter()
        .map(|n| {
            let text = std::fs::read_to_string(root().join(&n)).expect("reading a doc");
            (n, text)
        })
        .collect()
}

/// The lines of the shell blocks (```sh, ```bash, ```shell, ```console) of
/// `markdown`, continuation lines joined, with their line numbers.
fn shell_lines(markdown: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_shell = None::<bool>;
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(lang) = trimmed.strip_prefix("```") {
            in_shell = match in_shell {
                Some(_) => None,
                None => Some(matches!(
                    lang.trim(),
                    "sh" | "bash" | "shell" | "console" | "zsh"
                )),
            };
            continue;
        }
        if in_shell != Some(true) {
            continue;
        }
        let (n, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
        match line.strip_suffix('\\') {
            Some(head) => {
                joined.push_str(head);
                joined.push(' ');
                pending = Some((n, joined));
            }
            None => {
                joined.push_str(line);
                out.push((n, joined));
            }
        }
    }
    out
}

/// Splits a command line as a shell would, up to the first unquoted
/// comment, pipe, redirection or list operator. A word with an expansion
/// (`$TOKEN`, `$(cat …)`) becomes `X`: what matters here is that the flag
/// takes a value.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut expands = false;
    let mut chars = line.chars().peekable();
    let finish = |word: &mut String, expands: &mut bool, words: &mut Vec<String>| {
        words.push(if *expands {
            "X".to_string()
        } else {
            std::mem::take(word)
        });
        word.clear();
        *expands = false;
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    word.push(q);
                }
            }
            '"' => {
                in_word = true;
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' => word.extend(chars.next()),
                        '$' => {
                            expands = true;
                            word.push(q);
                        }
                        _ => word.push(q),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.extend(chars.next());
            }
            '$' => {
                in_word = true;
                expands = true;
                word.push(c);
            }
            '#' if !in_word => break,
            '|' | ';' | '&' | '<' | '>' => break,
            c if c.is_whitespace() => {
                if in_word {
                    finish(&mut word, &mut expands, &mut words);
                    in_word = false;
                }
            }
            _ => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        finish(&mut word, &mut expands, &mut words);
    }
    words
}

/// Every command in `markdown` (named `name`) that starts with `veris `,
/// after an optional `$ ` prompt.
fn commands_in(name: &str, markdown: &str) -> Vec<DocCommand> {
    shell_lines(markdown)
        .into_iter()
        .filter_map(|(n, line)| {
            let line = line.trim_start();
            let line = line.strip_prefix("$ ").unwrap_or(line);
            line.starts_with("veris ").then(|| DocCommand {
                at: format!("{name}:{n}"),
                words: shell_words(line),
            })
        })
        .collect()
}

fn all_commands() -> Vec<DocCommand> {
    doc_files()
        .iter()
        .flat_map(|(name, text)| commands_in(name, text))
        .collect()
}

/// Parses `cmd` with the binary, doing nothing: `--help` goes before any
/// `--` (or at the end), so clap reads every subcommand, flag and value the
/// doc shows first and prints the help only when all of them parse.
fn parses(cmd: &DocCommand, state: &Path) -> Result<(), String> {
    let mut args: Vec<String> = cmd.words[1..].to_vec();
    if !args.iter().any(|a| a == "--help" || a == "-h") {
        let at = args.iter().position(|a| a == "--").unwrap_or(args.len());
        args.insert(at, "--help".into());
    }
    let mut run = veris(&args);
    run.env("VERIS_STATE_DIR", state);
    let out = output_within(&mut run, Duration::from_secs(20));
    let (stdout, stderr) = text(&out);
    if out.status.code() == Some(0) && stdout.contains("Usage:") {
        Ok(())
    } else {
        Err(format!(
            "{}: `{}` does not parse (exit {:?}): {}",
            cmd.at,
            cmd.key(),
            out.status.code(),
            stderr.trim()
        ))
    }
}

const CURL_CHARGE: &str =
    "curl -sS https://api.stripe.com/v1/charges -d amount=2000 -d currency=usd";

/// Commands run for real (keyed by their words joined with one space), each
/// with what it must do. Every key must still be shown by some doc. All of
/// them stay on loopback: the built-in twin, or an isolated namespace that
/// has no route off the machine. Everything not listed is parsed only:
/// it needs root and a sandbox image (`serve --transparent
/// --install-redirect`), a twin or file that is not here (`--twin
/// http://twin:9000`, `python3 charge.py`, `npm test`, a ledger of `runs/…`),
/// a terminal (`tui`), stdin (`mcp`), or a proxy that stays up (`serve`
/// without a ready file).
fn real(key: &str) -> Option<Real> {
    let run = |flags: &str| format!("veris run {flags}-- {CURL_CHARGE}");
    Some(match key {
        "veris demo" | "veris demo --tier explicit" => Real::Demo,
        "veris check" => Real::CheckOutsideARun,
        "veris doctor" => Real::Doctor,
        "veris ca init" | "veris ca show" | "veris ca path" => Real::Ca,
        "veris ca env --proxy http://127.0.0.1:8080 --format docker" => Real::CaEnv,
        "veris ca env --trust-only" => Real::CaEnv,
        "veris completions bash" => Real::Completions,
        "veris man" => Real::Man,
        "veris --help" | "veris run --help" => Real::Help,
        "veris serve --listen 127.0.0.1:0 --ready-file ready.json --write-env veris.env" => {
            Real::Serve
        }
        k if k == run("") => Real::Run(Tier::Auto),
        k if k == run("--isolate ") => Real::Run(Tier::Isolated),
        k if k == run("--tier confined ") => Real::Run(Tier::Confined),
        k if k == run("--tier explicit ") => Real::Run(Tier::Explicit),
        k if k == run("--require stripe:1 ") => Real::Run(Tier::Auto),
        k if k == run("--require-verified ") => Real::Run(Tier::Auto),
        k if k == run("--receipt receipt.json ") => Real::RunFile("receipt.json"),
        k if k == run("--require stripe:1 --require-verified --junit veris-report.xml ") => {
            Real::RunFile("veris-report.xml")
        }
        _ => return None,
    })
}

#[derive(Debug, Clone, Copy)]
enum Tier {
    Auto,
    Isolated,
    Confined,
    Explicit,
}

#[derive(Debug, Clone, Copy)]
enum Real {
    Demo,
    CheckOutsideARun,
    Doctor,
    Ca,
    CaEnv,
    Completions,
    Man,
    Help,
    Serve,
    Run(Tier),
    /// A run that also writes this report file (in its working dir).
    RunFile(&'static str),
}

/// Runs `cmd` for real in `dir` (its working dir, HOME and state dir) and
/// checks its outcome. Err says what went wrong; Ok(Some) is a skip.
fn run_for_real(cmd: &DocCommand, how: Real, dir: &Path) -> Result<Option<String>, String> {
    let state = dir.join("state");
    let mut c = veris(&cmd.words[1..]);
    c.current_dir(dir)
        .env("HOME", dir)
        .env("VERIS_STATE_DIR", &state);
    let fail = |why: &str, out: &std::process::Output| {
        let (stdout, stderr) = text(out);
        Err(format!(
            "{}: `{}`: {why} (exit {:?})\nstdout:\n{stdout}\nstderr:\n{stderr}",
            cmd.at,
            cmd.key(),
            out.status.code()
        ))
    };
    if let Real::Serve = how {
        return serve_for_real(cmd, c, dir);
    }
    if matches!(how, Real::Run(_) | Real::RunFile(_)) {
        if let Err(why) = support::curl() {
            return Ok(Some(why));
        }
    }
    let out = output_within(&mut c, Duration::from_secs(90));
    let (stdout, stderr) = text(&out);
    let code = out.status.code();
    match how {
        Real::Demo => {
            // As root, a client in the proxy's own namespaces (the explicit
            // tier) could read its memory: at most unverified.
            let explicit_root = cmd.key().contains("explicit") && support::euid() == 0;
            let integrity = match explicit_root {
                true => "integrity: unverified",
                false => "integrity: verified",
            };
            if code != Some(0)
                || !stdout.contains("4 request(s) reached the twin")
                || !stdout.contains(integrity)
            {
                return fail("the demo did not pass with a verified receipt", &out);
            }
        }
        Real::CheckOutsideARun => {
            if code != Some(2) || !stderr.contains("no run to check") {
                return fail("outside a run, check must fail with exit 2", &out);
            }
        }
        Real::Doctor => {
            let counted = stdout
                .lines()
                .last()
                .is_some_and(|l| l.contains(" FAIL, ") && l.ends_with(" ok"));
            if !matches!(code, Some(0) | Some(2)) || !counted {
                return fail("doctor must end with its count, exit 0 or 2", &out);
            }
            if stdout.contains("FAIL ca:") {
                return fail("a fresh state dir is no CA failure", &out);
            }
        }
        Real::Ca | Real::CaEnv | Real::Completions | Real::Man | Real::Help => {
            let want = match how {
                Real::Completions => "_veris",
                Real::Man => ".TH",
                Real::Help => "Usage:",
                Real::CaEnv => "SSL_CERT_FILE=",
                _ => "",
            };
            if code != Some(0) || !stdout.contains(want) {
                return fail(&format!("expected exit 0 and {want:?} on stdout"), &out);
            }
            if cmd.key() == "veris ca show" && !stdout.contains(" UTC") {
                return fail("ca show prints its dates in UTC", &out);
            }
        }
        Real::Run(tier) => {
            let unavailable = match tier {
                Tier::Isolated => stderr.contains("cannot isolate the command"),
                Tier::Confined => stderr.contains("cannot confine the command"),
                _ => false,
            };
            if code == Some(1) && unavailable {
                return Ok(Some(format!("{:?} tier unavailable here: {stderr}", tier)));
            }
            if code != Some(0) || !stderr.contains("stripe: 1 request(s)") {
                return fail("the run did not reach the twin once and pass", &out);
            }
            let want = match tier {
                Tier::Isolated => Some("interception: isolated"),
                Tier::Explicit => Some("direct-egress-possible"),
                Tier::Confined => Some("confined"),
                Tier::Auto => None,
            };
            if let Some(want) = want {
                if !stderr.contains(want) {
                    return fail(&format!("the receipt lacks {want:?}"), &out);
                }
            }
        }
        Real::RunFile(file) => {
            if code != Some(0) {
                return fail("the run did not pass", &out);
            }
            let written = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
            let version = format!("\"version\": {}", veris_receipt::receipt::RECEIPT_VERSION);
            let want = if file.ends_with(".json") {
                version.as_str()
            } else {
                "<testsuite"
            };
            if !written.contains(want) {
                return fail(&format!("{file} lacks {want:?}: {written}"), &out);
            }
            if file.ends_with(".json") {
                let undocumented = undocumented_json_fields(&written);
                if !undocumented.is_empty() {
                    return fail(
                        &format!("docs/receipt-formats.md's JSON section does not name the fields {undocumented:?}"),
                        &out,
                    );
                }
            }
        }
        Real::Serve => unreachable!("handled above"),
    }
    Ok(None)
}

/// The field names of a JSON receipt that docs/receipt-formats.md's JSON
/// section does not name as a word. Maps keyed by data (services, hosts,
/// calls, statuses, alerts) are not field names: only a service's own
/// fields are looked at below them.
fn undocumented_json_fields(receipt: &str) -> Vec<String> {
    fn fields(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, child) in m {
                    if !out.contains(k) {
                        out.push(k.clone());
                    }
                    match k.as_str() {
                        "services" => {
                            for service in child.as_object().into_iter().flat_map(|m| m.values()) {
                                fields(service, out);
                            }
                        }
                        "hosts" | "calls" | "host_statuses" | "call_statuses" | "seen_statuses"
                        | "alerts" | "reserved_paths" => {}
                        _ => fields(child, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|c| fields(c, out)),
            _ => {}
        }
    }
    let value: serde_json::Value = serde_json::from_str(receipt).unwrap_or_default();
    let mut names = Vec::new();
    fields(&value, &mut names);
    let page = std::fs::read_to_string(root().join("docs/receipt-formats.md")).unwrap();
    let json = section(&page, "## JSON");
    let is_word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    names
        .into_iter()
        .filter(|n| {
            !json.match_indices(n.as_str()).any(|(i, _)| {
                !is_word(json[..i].chars().next_back())
                    && !is_word(json[i + n.len()..].chars().next())
            })
        })
        .collect()
}

/// Starts the documented `veris serve` (relative ready and env files, in
/// `dir`), checks its ready file holds exactly the fields docs/cli.md lists,
/// then stops it with SIGTERM (exit 0).
fn serve_for_real(cmd: &DocCommand, mut c: Command, dir: &Path) -> Result<Option<String>, String> {
    let mut serve = Guard::spawn(
        c.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
    );
    let ready = support::wait_json_file(&dir.join("ready.json"), support::DEADLINE);
    let env = std::fs::read_to_string(dir.join("veris.env")).unwrap_or_default();
    serve.signal("TERM");
    let status = serve.wait();
    let keys: Vec<String> = ready
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    let documented = documented_ready_fields();
    let mut sorted_doc = documented.clone();
    sorted_doc.sort();
    let mut sorted_keys = keys.clone();
    sorted_keys.sort();
    if sorted_doc != sorted_keys {
        return Err(format!(
            "{}: the ready file has {sorted_keys:?}, docs/cli.md lists {sorted_doc:?}",
            cmd.at
        ));
    }
    if !env.contains("HTTPS_PROXY=") || env.contains("NODE_USE_ENV_PROXY") {
        return Err(format!(
            "{}: the env file is not what docs/cli.md says (proxy variables, no NODE_USE_ENV_PROXY): {env}",
            cmd.at
        ));
    }
    if status.code() != Some(0) {
        return Err(format!("{}: serve exited {status:?} on SIGTERM", cmd.at));
    }
    // And `veris serve --help` names the same fields.
    let help = text(&output_within(
        &mut veris(["serve", "--help"]),
        Duration::from_secs(20),
    ))
    .0;
    let said = help
        .split("--ready-file")
        .nth(1)
        .and_then(|rest| rest.split("--write-env").next())
        .unwrap_or_default()
        .to_string();
    if let Some(missing) = documented.iter().find(|f| !said.contains(f.as_str())) {
        return Err(format!(
            "`veris serve --help` does not name the ready file's field {missing}: {said}"
        ));
    }
    Ok(None)
}

/// The fields docs/cli.md's `--ready-file` bullet lists: `{"a", "b", …}`.
fn documented_ready_fields() -> Vec<String> {
    let cli = std::fs::read_to_string(root().join("docs/cli.md")).expect("docs/cli.md");
    let at = cli
        .find("`--ready-file` is written last")
        .expect("docs/cli.md describes the ready file");
    let open = at + cli[at..].find("`{").expect("a field list") + 2;
    let close = open + cli[open..].find("}`").expect("the end of the field list");
    cli[open..close]
        .split(',')
        .map(|f| f.trim().trim_matches('"').to_string())
        .collect()
}

#[test]
fn every_command_in_the_docs_runs_or_parses() {
    let commands = all_commands();
    assert!(
        commands.len() > 40,
        "found only {} commands: {commands:?}",
        commands.len()
    );
    let dir = TempDir::new("docs");
    let parse_state = dir.join("parse-state");
    let mut failures = Vec::new();
    let mut ran = Vec::new();
    // Real runs in the order the docs show them (ca init before ca show),
    // each kind in a fresh dir but the `ca` commands, which share one.
    let ca_dir = dir.join("ca");
    std::fs::create_dir_all(&ca_dir).unwrap();
    for (i, cmd) in commands.iter().enumerate() {
        if let Err(e) = parses(cmd, &parse_state) {
            failures.push(e);
            continue;
        }
        let Some(how) = real(&cmd.key()) else {
            continue;
        };
        // A command several pages show runs once.
        if ran.contains(&cmd.key()) {
            continue;
        }
        let here = match how {
            Real::Ca | Real::CaEnv => ca_dir.clone(),
            _ => {
                let d = dir.join(format!("real-{i}"));
                std::fs::create_dir_all(&d).unwrap();
                d
            }
        };
        match run_for_real(cmd, how, &here) {
            Ok(None) => ran.push(cmd.key()),
            Ok(Some(why)) => {
                support::skip(&format!("{}: not run for real: {why}", cmd.at));
                ran.push(cmd.key());
            }
            Err(e) => failures.push(e),
        }
    }
    eprintln!(
        "{} doc commands parsed; run for real: {ran:#?}",
        commands.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // The real-run list must not go stale: each of its commands is still shown.
    for key in [
        "veris demo".to_string(),
        "veris check".into(),
        "veris doctor".into(),
        "veris ca init".into(),
        "veris ca show".into(),
        "veris man".into(),
        "veris serve --listen 127.0.0.1:0 --ready-file ready.json --write-env veris.env".into(),
        format!("veris run -- {CURL_CHARGE}"),
        format!("veris run --tier explicit -- {CURL_CHARGE}"),
        format!("veris run --receipt receipt.json -- {CURL_CHARGE}"),
    ] {
        assert!(ran.contains(&key), "no doc shows `{key}` any more: {ran:?}");
    }
}

/// The checker itself: a flag, a subcommand or a value that does not exist
/// fails it, and a shell line is split as a shell would.
#[test]
fn a_doc_command_that_does_not_exist_fails_the_check() {
    let doc = "text\n\n```sh\n$ veris run --no-such-flag -- true\nveris receipt --json  # a comment\nveris nosuchcmd\nveris run --tier nowhere -- true\nveris serve --twin http://t:9000 \\\n    --no-such-either\n```\n\n```json\nveris run --not-a-shell-block\n```\n";
    let commands = commands_in("test.md", doc);
    let keys: Vec<String> = commands.iter().map(DocCommand::key).collect();
    assert_eq!(
        keys,
        [
            "veris run --no-such-flag -- true",
            "veris receipt --json",
            "veris nosuchcmd",
            "veris run --tier nowhere -- true",
            "veris serve --twin http://t:9000 --no-such-either",
        ]
    );
    let dir = TempDir::new("docs-neg");
    let results: Vec<bool> = commands
        .iter()
        .map(|c| parses(c, &dir.join("state")).is_ok())
        .collect();
    assert_eq!(results, [false, true, false, false, false]);
    let err = parses(&commands[0], &dir.join("state")).unwrap_err();
    assert!(err.contains("--no-such-flag"), "{err}");
    assert_eq!(
        shell_words(r#"veris tui --token "$(cat /veris/admin.token)" --x 'a b' c\ d > f"#),
        ["veris", "tui", "--token", "X", "--x", "a b", "c d"]
    );
}

/// The README's test command is the one `.ci/run` runs, and it is what the
/// README says it is.
#[test]
fn the_readme_test_command_is_what_ci_runs() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let shown: Vec<String> = shell_lines(&readme)
        .into_iter()
        .map(|(_, l)| l)
        .filter(|l| l.starts_with("scripts/"))
        .collect();
    assert_eq!(shown.len(), 1, "{shown:?}");
    let program = shell_words(&shown[0]).remove(0);
    assert_eq!(program, "scripts/test");
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    assert!(
        ci.lines().any(|l| shell_words(l).first() == Some(&program)),
        ".ci/run does not run {program}"
    );
    let script = std::fs::read_to_string(root().join(&program)).unwrap();
    assert!(
        script.contains("cargo test --release --workspace"),
        "{program} no longer runs what the README says"
    );
}

/// The completions install lines work as shown in a fresh home, where the
/// completions directory does not exist yet.
#[test]
fn the_completions_install_lines_work_in_a_fresh_home() {
    let cli = std::fs::read_to_string(root().join("docs/cli.md")).unwrap();
    let lines: Vec<String> = shell_lines(&cli)
        .into_iter()
        .map(|(_, l)| l)
        .filter(|l| l.starts_with("mkdir -p ") || l.starts_with("veris completions bash >"))
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    let home = TempDir::new("docs-home");
    let bin_dir = support::bin().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = format!("set -e\n{}\n", lines.join("\n"));
    let out = output_within(
        support::command("bash")
            .args(["-c", &script])
            .env("HOME", home.path())
            .env("PATH", path),
        Duration::from_secs(20),
    );
    assert!(out.status.success(), "{:?}", text(&out));
    let file = home.join(".local/share/bash-completion/completions/veris");
    let written = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(written.contains("_veris"), "{}", file.display());
}

/// The example file in docs/config.md is one `veris serve --config` accepts
/// (an unknown or misspelt field would be an error naming it).
#[test]
fn the_config_example_is_accepted() {
    let page = std::fs::read_to_string(root().join("docs/config.md")).unwrap();
    let start = page.find("```json\n").expect("a JSON example") + "```json\n".len();
    let end = start + page[start..].find("```").expect("the end of the example");
    let example: serde_json::Value =
        serde_json::from_str(&page[start..end]).expect("the example is JSON");
    let dir = TempDir::new("docs-config");
    let file = dir.join("veris.json");
    std::fs::write(&file, example.to_string()).unwrap();
    let mut cmd = veris(["serve", "--listen", "127.0.0.1:0", "--config"]);
    cmd.arg(&file)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--ready-file")
        .arg(dir.join("ready.json"))
        // The example names the twin credential's variable.
        .env("TWIN_TOKEN", "docs-test")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut serve = Guard::spawn(&mut cmd);
    let ready = support::wait_json_file(&dir.join("ready.json"), support::DEADLINE);
    serve.signal("TERM");
    assert_eq!(serve.wait().code(), Some(0));
    assert_eq!(ready["sandbox_id"], example["sandbox_id"], "{ready}");
}

/// The part of `page` from the line that starts with `heading` to the next
/// heading of the same or a higher level.
fn section<'a>(page: &'a str, heading: &str) -> &'a str {
    let start = page
        .find(&format!("\n{heading}"))
        .unwrap_or_else(|| panic!("no heading {heading:?}"))
        + 1;
    let level = heading.chars().take_while(|c| *c == '#').count();
    let rest = &page[start..];
    let end = rest
        .match_indices("\n#")
        .find(|(i, _)| {
            let hashes = rest[i + 1..].chars().take_while(|c| *c == '#').count();
            hashes <= level
        })
        .map(|(i, _)| i)
        .unwrap_or(rest.len());
    &rest[..end]
}

/// The leak names receipt/src/receipt/leaks.rs can put in a receipt: the
/// first word of each string literal of its code (not its comments or
/// tests) that is a hyphenated lower-case name.
fn leak_names_in_code() -> Vec<String> {
    let src = std::fs::read_to_string(root().join("receipt/src/receipt/leaks.rs"))
        .expect("receipt/src/receipt/leaks.rs");
    let code = src.split("#[cfg(test)]").next().unwrap_or_default();
    let mut names = Vec::new();
    for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for literal in line.split('"').skip(1).step_by(2) {
            let name = literal.split([' ', '{']).next().unwrap_or_default();
            let leak_like = name.contains('-')
                && !name.starts_with('-')
                && !name.ends_with('-')
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            if leak_like && !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
        }
    }
    names
}

/// Every leak the receipt can print is named, with its meaning, in
/// docs/trust-model.md's leak table, so the list cannot fall behind the code.
#[test]
fn every_leak_the_receipt_can_print_is_in_the_trust_model() {
    let names = leak_names_in_code();
    // The extraction itself must still find them (20 when written).
    assert!(names.len() >= 15, "found only {names:?} in leaks.rs");
    for known in [
        "workload-root",
        "host-daemon-escape-possible",
        "udp-dropped",
    ] {
        assert!(names.iter().any(|n| n == known), "{known} not in {names:?}");
    }
    let page = std::fs::read_to_string(root().join("docs/trust-model.md")).unwrap();
    let leaks = section(&page, "## Leaks");
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !leaks.contains(&format!("| `{n}")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/trust-model.md's leak table lacks {missing:?} (a row `| `NAME …` | tier | meaning |` each)"
    );
}

/// docs/cli.md's `veris doctor` table has one row per line doctor prints,
/// in the order it prints them, and no other.
#[test]
fn the_doctor_table_names_every_check_doctor_prints() {
    let dir = TempDir::new("docs-doctor");
    let mut cmd = veris(["doctor", "--state-dir"]);
    cmd.arg(dir.join("state")).env("HOME", dir.path());
    let out = output_within(&mut cmd, Duration::from_secs(60));
    let (stdout, stderr) = text(&out);
    let printed: Vec<String> = stdout
        .lines()
        .filter_map(|l| {
            let rest = ["ok ", "warn ", "FAIL "]
                .iter()
                .find_map(|level| l.strip_prefix(level))?;
            Some(rest.trim_start().split(':').next()?.to_string())
        })
        .collect();
    assert!(printed.len() >= 10, "doctor printed {stdout}\n{stderr}");
    let page = std::fs::read_to_string(root().join("docs/cli.md")).unwrap();
    let table: Vec<String> = section(&page, "## `veris doctor`")
        .lines()
        .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
        .map(str::to_string)
        .collect();
    assert_eq!(
        table, printed,
        "docs/cli.md's doctor table (left) is not what `veris doctor` prints (right)"
    );
}

/// The fixture example of docs/cli.md works as shown: its file, given to
/// `veris twin --fixtures`, makes the documented `veris run --twin …`
/// see a charge declined with 402, and its `status=402` requirement holds.
#[test]
fn the_twin_fixture_example_declines_a_card() {
    if let Err(why) = support::curl() {
        support::skip(&why);
        return;
    }
    let page = std::fs::read_to_string(root().join("docs/cli.md")).unwrap();
    let fixtures = section(&page, "### Fixtures: your own answers");
    let start = fixtures.find("```json\n").expect("a JSON example") + "```json\n".len();
    let end = start
        + fixtures[start..]
            .find("```")
            .expect("the end of the example");
    let example: serde_json::Value =
        serde_json::from_str(&fixtures[start..end]).expect("the example is JSON");
    let lines: Vec<Vec<String>> = shell_lines(fixtures)
        .into_iter()
        .map(|(_, l)| shell_words(&l))
        .collect();
    let shown = |program: &str| {
        lines
            .iter()
            .find(|w| w.len() > 1 && w[0] == "veris" && w[1] == program)
            .unwrap_or_else(|| panic!("no `veris {program}` in the fixtures section"))
            .clone()
    };
    let (twin, run) = (shown("twin"), shown("run"));
    let file = twin[twin.iter().position(|w| w == "--fixtures").unwrap() + 1].clone();
    let dir = TempDir::new("docs-fixtures");
    std::fs::write(dir.join(&file), example.to_string()).unwrap();
    // The doc's fixed port, made a free one here.
    let twin: Vec<String> = twin[1..]
        .iter()
        .map(|w| w.replace("127.0.0.1:9000", "127.0.0.1:0"))
        .collect();
    let mut twin_cmd = veris(&twin);
    twin_cmd.current_dir(dir.path());
    let (_twin, url) = support::spawn_twin(&mut twin_cmd);
    let run: Vec<String> = run[1..]
        .iter()
        .map(|w| w.replace("http://127.0.0.1:9000", &url))
        .collect();
    assert!(
        run.contains(&url),
        "the run does not name the twin: {run:?}"
    );
    let mut run_cmd = veris(&run);
    run_cmd
        .current_dir(dir.path())
        .env("HOME", dir.path())
        .env("VERIS_STATE_DIR", dir.join("state"));
    let out = output_within(&mut run_cmd, Duration::from_secs(90));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("card_declined"), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("POST \"/v1/charges\" -> 402"),
        "{stdout}\n{stderr}"
    );
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces
/// become hyphens.
fn anchors(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        if !fenced && line.starts_with('#') {
            let title = line.trim_start_matches('#').trim().to_lowercase();
            out.push(
                title
                    .chars()
                    .filter(|c| c.is_alphanumeric() || *c == '-' || *c == ' ' || *c == '_')
                    .map(|c| if c == ' ' { '-' } else { c })
                    .collect(),
            );
        }
    }
    out
}

/// Every relative link of README.md and docs/ leads to a file that exists,
/// and to a heading of it when it names one.
#[test]
fn every_relative_link_in_the_docs_leads_somewhere() {
    let mut broken = Vec::new();
    for (name, text) in doc_files() {
        let base = root().join(&name).parent().unwrap().to_path_buf();
        for (i, _) in text.match_indices("](") {
            let rest = &text[i + 2..];
            let Some(end) = rest.find(')') else { continue };
            let link = &rest[..end];
            if link.starts_with("http://") || link.starts_with("https://") {
                continue;
            }
            let (path, fragment) = link.split_once('#').unwrap_or((link, ""));
            let target = if path.is_empty() {
                root().join(&name)
            } else {
                base.join(path)
            };
            if !target.exists() {
                broken.push(format!("{name}: {link}: no such file"));
                continue;
            }
            if !fragment.is_empty() && path.is_empty()
                || path.ends_with(".md") && !fragment.is_empty()
            {
                let page = std::fs::read_to_string(&target).unwrap_or_default();
                if !anchors(&page).iter().any(|a| a == fragment) {
                    broken.push(format!("{name}: {link}: no such heading"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}
