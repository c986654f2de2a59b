//! End-to-end tests of the smaller commands of the `veris` binary: `demo`,
//! `twin`, `ca init|show|path|env`, `completions` and `man`, and the answers
//! to bad input (exit 1 with a "Next:" line).

use crate::support;

use support::{command, output, output_within, text, veris, Serve, TempDir, DEADLINE};

#[test]
fn demo_makes_four_calls_and_prints_the_receipt() {
    let dir = TempDir::new("demo");
    let mut cmd = veris(["demo", "--state-dir"]);
    cmd.arg(dir.join("state"));
    let out = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("POST https://api.stripe.com/v1/customers -> 200"),
        "{stdout}"
    );
    assert!(
        stdout.contains("POST https://api.stripe.com/v1/charges -> 200"),
        "{stdout}"
    );
    assert!(
        stdout.contains("GET  https://api.stripe.com/v1/charges/ch_"),
        "{stdout}"
    );
    assert!(
        stdout.contains("GET  https://www.googleapis.com/calendar/v3/"),
        "{stdout}"
    );
    assert!(stdout.contains("4 request(s) reached the twin"), "{stdout}");
    assert!(stdout.contains("POST \"/v1/customers\" -> 200"), "{stdout}");
    assert!(stdout.contains("POST \"/v1/charges\" -> 200"), "{stdout}");
    assert!(!stdout.contains("FAIL:"), "{stdout}");
}

/// The demo runs its client the way `veris run` runs a command: isolated
/// where this machine allows it (its receipt then says so and has no
/// `direct-egress-possible`), and in the explicit tier when asked, where the
/// client finds the proxy through HTTPS_PROXY and the receipt says what leaks.
#[test]
fn demo_runs_its_client_in_the_tier_run_would_pick() {
    let dir = TempDir::new("demo-tier");
    let mut cmd = veris(["demo", "--state-dir"]);
    cmd.arg(dir.join("state"));
    let out = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    if stdout.contains("the client runs isolated") {
        assert!(stdout.contains("interception: isolated"), "{stdout}");
        assert!(!stdout.contains("direct-egress-possible"), "{stdout}");
    } else {
        // Not isolated: veris said why on stderr.
        assert!(
            stderr.contains("not isolated") || stderr.contains("Not isolated"),
            "{stderr}"
        );
        support::skip("this machine cannot isolate the demo's client");
    }
    let mut cmd = veris(["demo", "--tier", "explicit", "--state-dir"]);
    cmd.arg(dir.join("state-explicit"));
    let out = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("runs behind HTTPS_PROXY=http://127.0.0.1:"),
        "{stdout}"
    );
    // It says why: asked, not a machine that cannot isolate.
    assert!(
        stdout.contains("(the explicit tier, as asked with --tier explicit)"),
        "{stdout}"
    );
    assert!(stdout.contains("4 request(s) reached the twin"), "{stdout}");
    assert!(stdout.contains("direct-egress-possible"), "{stdout}");
    // A named state dir keeps the run's ledger, and the demo says where.
    assert!(stdout.contains("ledger: "), "{stdout}");
}

/// A veris binary under /tmp (a checkout there, a download) still runs its
/// demo: the isolated run's private /tmp hides that path from the client,
/// so the client is started by the kernel's link to the binary.
#[test]
fn the_demo_runs_from_a_binary_under_tmp() {
    let dir = TempDir::new("demo-tmp");
    if !dir.path().starts_with("/tmp") {
        return support::skip("the temp dir is not under /tmp here");
    }
    let copy = dir.join("veris");
    std::fs::copy(support::bin(), &copy).expect("copying the binary");
    let mut cmd = command(copy.to_str().unwrap());
    cmd.args(["demo", "--state-dir"]).arg(dir.join("state"));
    let out = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("4 request(s) reached the twin"), "{stdout}");
}

#[test]
fn twin_prints_its_url_answers_health_and_stops_on_sigterm() {
    if let Err(why) = support::curl() {
        return support::skip(&why);
    }
    let (mut twin, url) = support::spawn_twin(&mut veris(["twin", "--listen", "127.0.0.1:0"]));
    let health = format!("{url}/s/sbx_test/stripe/veris/health");
    let out = output(command("curl").args(["-sS", "--max-time", "10", &health]));
    assert!(out.status.success(), "{:?}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("health JSON");
    assert_eq!(v["status"], "ok");
    assert_eq!(v["service"], "stripe");
    twin.signal("TERM");
    assert_eq!(twin.wait().code(), Some(0));
}

#[test]
fn ca_init_show_path_env() {
    let dir = TempDir::new("ca");
    let state = dir.join("state");
    let ca = |args: &[&str]| {
        let mut cmd = veris(["ca"]);
        cmd.args(args).arg("--state-dir").arg(&state);
        let out = output(&mut cmd);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(0), "ca {args:?}: {stdout}{stderr}");
        stdout
    };
    let init = ca(&["init"]);
    let path = ca(&["path"]);
    assert_eq!(init, path, "init and path name the same certificate");
    let path = std::path::PathBuf::from(path.trim());
    let pem = std::fs::read_to_string(&path).expect("path prints an existing file");
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");

    let show = ca(&["show"]);
    let fp = show
        .lines()
        .find_map(|l| l.strip_prefix("sha256:"))
        .unwrap_or_else(|| panic!("no fingerprint: {show}"))
        .trim()
        .to_string();
    assert_eq!(fp.split(':').count(), 32, "{fp}");
    assert!(fp
        .split(':')
        .all(|b| b.len() == 2 && b.chars().all(|c| c.is_ascii_hexdigit())));
    assert_eq!(ca(&["show"]), show, "the CA is reused, not regenerated");
    // Dates as `2026-12-03 06:23:28 UTC`, not the `time` crate's Display.
    for label in ["not before:", "not after:"] {
        let date = show
            .lines()
            .find_map(|l| l.strip_prefix(label))
            .unwrap_or_else(|| panic!("no {label}: {show}"))
            .trim();
        let shape: String = date
            .chars()
            .map(|c| if c.is_ascii_digit() { '9' } else { c })
            .collect();
        assert_eq!(shape, "9999-99-99 99:99:99 UTC", "{date}");
    }

    let docker = ca(&["env", "--format", "docker"]);
    assert!(
        docker.lines().any(|l| l.starts_with("HTTPS_PROXY=")),
        "{docker}"
    );
    assert!(!docker.contains("export "), "{docker}");
    let trust_only = ca(&["env", "--trust-only"]);
    assert!(trust_only.contains("SSL_CERT_FILE="), "{trust_only}");
    for line in trust_only.lines().filter(|l| !l.starts_with('#')) {
        let name = line
            .trim_start_matches("export ")
            .split('=')
            .next()
            .unwrap();
        assert!(
            !name.to_ascii_uppercase().ends_with("_PROXY"),
            "routing variable in --trust-only: {line}"
        );
    }
}

#[test]
fn config_with_an_unknown_field_is_a_usage_error() {
    let dir = TempDir::new("badcfg");
    let cfg = dir.join("veris-bad.json");
    std::fs::write(
        &cfg,
        r#"{"version": 1, "sandbox_id": "sbx_x", "bogus_field": true}"#,
    )
    .unwrap();
    let mut cmd = veris(["serve", "--listen", "127.0.0.1:0", "--config"]);
    cmd.arg(&cfg).arg("--state-dir").arg(dir.join("state"));
    let out = support::output_within(&mut cmd, DEADLINE);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("veris-bad.json"),
        "names the file: {stderr}"
    );
    assert!(stderr.contains("bogus_field"), "names the field: {stderr}");
    assert!(stderr.contains("Next:"), "{stderr}");
}

#[test]
fn unknown_service_is_a_usage_error() {
    let dir = TempDir::new("badsvc");
    let mut cmd = veris(["serve", "--listen", "127.0.0.1:0", "--services", "nope"]);
    cmd.arg("--state-dir").arg(dir.join("state"));
    let out = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stderr.contains("nope"), "{stderr}");
    assert!(stderr.contains("Next:"), "{stderr}");
}

#[test]
fn a_start_that_fails_writes_no_session_line() {
    let dir = TempDir::new("failedstart");
    let state = dir.join("state");
    let ready = dir.join("ready.json");
    let start = |admin: &str| {
        let mut cmd = veris(["serve", "--listen", "127.0.0.1:0", "--admin", admin]);
        cmd.arg("--state-dir")
            .arg(&state)
            .arg("--ready-file")
            .arg(&ready);
        output(&mut cmd)
    };
    // A first start that cannot bind its admin address (TEST-NET, not ours).
    let out = start("192.0.2.1:1");
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("admin"), "{stderr}");
    let ledger = std::fs::read_to_string(state.join("ledger.jsonl")).unwrap_or_default();
    assert!(
        !ledger.contains("\"kind\":\"session\""),
        "a failed start recorded a session: {ledger}"
    );
    assert!(!ready.exists(), "a failed start announced itself ready");
}

#[test]
fn check_any_run_accepts_any_run_even_with_a_canary_in_the_env() {
    // After sourcing a run's env file VERIS_CANARY is always set; --any-run
    // must still accept whatever veris proxy answers (M7).
    let mut serve = Serve::start("anyrun", &[]);
    let mut cmd = veris(["check", "--any-run", "--proxy", &serve.proxy_url]);
    cmd.env("VERIS_CANARY", "cnry_00000000000000000000000000000000");
    let out = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("veris check: ok"), "{stdout}");
    // Without --any-run the other run's canary still fails the check.
    let mut cmd = veris(["check", "--proxy", &serve.proxy_url]);
    cmd.env("VERIS_CANARY", "cnry_00000000000000000000000000000000");
    let out = output(&mut cmd);
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    serve.stop();
}

#[test]
fn a_config_error_is_printed_once() {
    let dir = TempDir::new("cfgonce");
    let cfg = dir.join("veris-v2.json");
    std::fs::write(
        &cfg,
        r#"{"version": 2, "sandbox_id": "sbx_x", "upstream": {"base_url": "http://127.0.0.1:9"}, "services": [{"name": "a", "hosts": ["a.test"]}]}"#,
    )
    .unwrap();
    let mut cmd = veris(["serve", "--listen", "127.0.0.1:0", "--config"]);
    cmd.arg(&cfg).arg("--state-dir").arg(dir.join("state"));
    let out = support::output_within(&mut cmd, DEADLINE);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert_eq!(
        stderr.matches("unsupported version 2").count(),
        1,
        "{stderr}"
    );
    assert_eq!(stderr.matches("Next:").count(), 1, "{stderr}");
    assert!(stderr.contains("veris-v2.json"), "{stderr}");
}

/// A config file for a twin that is not there (nothing is forwarded).
fn config_file(dir: &TempDir, sandbox: &str, mode: &str) -> std::path::PathBuf {
    let cfg = dir.join("veris.json");
    std::fs::write(
        &cfg,
        serde_json::json!({
            "version": 1,
            "sandbox_id": sandbox,
            "mode": mode,
            "upstream": {"base_url": "http://127.0.0.1:9"},
            "services": [{"name": "stripe", "hosts": ["api.stripe.com"]}],
        })
        .to_string(),
    )
    .unwrap();
    cfg
}

#[test]
fn flags_override_the_config_file_sandbox_and_mode_alike() {
    let dir = TempDir::new("cfgflags");
    let cfg = config_file(&dir, "sbx_cfg", "passthrough");
    let cfg = cfg.to_str().unwrap();
    let mut serve = Serve::start_in(
        dir,
        &["--config", cfg, "--sandbox", "sbx_flag", "--mode", "strict"],
    );
    assert_eq!(serve.ready["sandbox_id"], "sbx_flag", "{}", serve.ready);
    let out = output(&mut veris([
        "check",
        "--any-run",
        "--proxy",
        &serve.proxy_url,
    ]));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("sandbox sbx_flag") && stdout.contains("strict mode"),
        "{stdout}"
    );
    // Strict mode really applies: an unmapped host is refused with 421.
    assert_eq!(serve.vendor("GET", "example.com", "/"), 421);
    serve.stop();
    let session = serve
        .ledger_lines()
        .into_iter()
        .find(|l| l["kind"] == "session")
        .expect("a session line");
    assert_eq!(session["sandbox_id"], "sbx_flag", "{session}");
    assert_eq!(session["mode"], "strict", "{session}");
}

#[test]
fn routes_with_a_config_file_are_an_error_naming_both() {
    let dir = TempDir::new("cfgroute");
    let cfg = config_file(&dir, "sbx_cfg", "strict");
    let mut cmd = veris(["serve", "--listen", "127.0.0.1:0", "--config"]);
    cmd.arg(&cfg)
        .args(["--twin", "http://127.0.0.1:9", "--state-dir"])
        .arg(dir.join("state"));
    let out = support::output_within(&mut cmd, DEADLINE);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("--twin") && stderr.contains("veris.json") && stderr.contains("Next:"),
        "{stderr}"
    );
}

#[test]
fn ca_show_and_path_create_no_ca() {
    let dir = TempDir::new("ca-none");
    let state = dir.join("state");
    let ca = |args: &[&str]| {
        let mut cmd = veris(["ca"]);
        cmd.args(args).arg("--state-dir").arg(&state);
        output(&mut cmd)
    };
    let out = ca(&["show"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("no CA") && stderr.contains("veris ca init"),
        "{stderr}"
    );
    let out = ca(&["path"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert_eq!(
        stdout.trim(),
        state.join("ca").join("veris-ca.pem").to_str().unwrap(),
        "the path it would use"
    );
    assert!(stderr.contains("veris ca init"), "{stderr}");
    assert!(!state.exists(), "show/path created {}", state.display());
    // Once there is one, path names the same file and creates nothing new.
    assert_eq!(ca(&["init"]).status.code(), Some(0));
    let out = ca(&["path"]);
    assert_eq!(text(&out).1, "", "no note once the CA exists");
    assert!(std::path::Path::new(text(&out).0.trim()).is_file());
}

#[test]
fn logs_off_a_terminal_have_no_colour_and_plain_fields() {
    if let Err(why) = support::curl() {
        return support::skip(&why);
    }
    // Serve's stderr is a file here, not a terminal.
    let mut serve = Serve::start("manners", &[]);
    // curl without the veris CA refuses the leaf with an alert: the proxy
    // warns, naming the host and the service.
    let out = output(command("curl").args([
        "-sS",
        "--max-time",
        "10",
        "-x",
        &serve.proxy_url,
        "https://api.stripe.com/v1/charges",
    ]));
    assert!(!out.status.success(), "{:?}", text(&out));
    support::wait_for("the trust-failure warning", DEADLINE, || {
        serve
            .stderr()
            .contains("refused the veris certificate")
            .then_some(())
    });
    serve.stop();
    let stderr = serve.stderr();
    assert!(
        !stderr.contains('\x1b'),
        "ANSI escapes off a terminal: {stderr}"
    );
    let line = stderr
        .lines()
        .find(|l| l.contains("refused the veris certificate"))
        .unwrap();
    assert!(line.contains("service=stripe"), "{line}");
    assert!(!line.contains("Some("), "{line}");
}

#[test]
fn no_color_turns_colour_off_on_a_terminal() {
    if !support::tool_works("script", &["--version"]) {
        return support::skip("script (util-linux) is not installed");
    }
    let dir = TempDir::new("nocolor");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // A run whose twin is down logs a warning; `script` gives it a terminal.
    let line = format!(
        "{} run --state-dir {} --twin http://127.0.0.1:{port} --allow-empty -- true",
        support::bin().display(),
        dir.join("state").display()
    );
    for (no_color, coloured) in [(None, true), (Some("1"), false)] {
        let mut cmd = command("script");
        cmd.args(["-qec", &line, "/dev/null"]);
        if let Some(v) = no_color {
            cmd.env("NO_COLOR", v);
        }
        let out = output(&mut cmd);
        let (terminal, _) = text(&out);
        assert!(terminal.contains("the twin is not reachable"), "{terminal}");
        // The SGR reset before the receipt is no colour: it undoes what the
        // command left set, NO_COLOR or not.
        assert!(terminal.contains("\x1b[0mVeris receipt"), "{terminal:?}");
        assert_eq!(
            terminal
                .replace("\x1b[0mVeris receipt", "")
                .contains("\x1b["),
            coloured,
            "NO_COLOR={no_color:?}: {terminal:?}"
        );
    }
}

#[test]
fn a_receipt_requirement_for_a_service_the_live_proxy_does_not_route_is_a_usage_error() {
    let serve = Serve::start("unrouted", &["--services", "stripe,github"]);
    let receipt = |args: &[&str]| {
        let mut cmd = veris(["receipt", "--state-dir"]);
        cmd.arg(&serve.state).args(args);
        output(&mut cmd)
    };
    let seals = || {
        serve
            .ledger_lines()
            .iter()
            .filter(|l| l["kind"] == "seal" && l["reason"] == "demand")
            .count()
    };
    let before = seals();
    for args in [
        &["--require", "strpe:1"][..],
        &["--require-request", "hubspot GET /crm/v3/objects"][..],
    ] {
        let out = receipt(args);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stdout}{stderr}");
        assert!(stderr.contains("unknown service"), "{stderr}");
        assert!(
            stderr.contains("stripe, github"),
            "the routed names: {stderr}"
        );
        assert!(stderr.contains("Next:"), "{stderr}");
        // The way to add one names both places, since --route is refused
        // beside --config.
        assert!(
            stderr.contains("--route and --config do not mix"),
            "{stderr}"
        );
    }
    // A usage error asks the proxy for no seal: it writes nothing (the
    // proxy's own interval seals may come and go meanwhile).
    assert_eq!(seals(), before, "no seal on demand for a refused read");
    // A routed service that saw no request is an unmet requirement, as before.
    let out = receipt(&["--require", "github:1"]);
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));
}

/// Internal steps of `veris run` (and doctor's namespace probe), which no user types.
const INTERNAL: [&str; 5] = [
    "__demo-client",
    "__confine",
    "__isolate",
    "__isolate-init",
    "__isolate-probe",
];

#[test]
fn completions_cover_the_commands_and_hide_the_internal_ones() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = output(&mut veris(["completions", shell]));
        let (script, stderr) = text(&out);
        assert!(out.status.success(), "{shell}: {stderr}");
        for word in ["receipt", "run", "require-verified", "junit", "doctor"] {
            assert!(script.contains(word), "{shell} completions lack {word}");
        }
        for internal in INTERNAL {
            assert!(
                !script.contains(internal),
                "{shell} completions offer {internal}"
            );
        }
    }
    let dir = TempDir::new("completions");
    let file = dir.join("veris.bash");
    let out = output(&mut veris(["completions", "bash"]));
    std::fs::write(&file, &out.stdout).unwrap();
    let check = output(command("bash").arg("-n").arg(&file));
    assert!(check.status.success(), "bash -n: {:?}", text(&check));
    // Loaded into a shell, it completes the subcommands of `veris rec`.
    let probe = format!(
        "source {}; COMP_WORDS=(veris rec); COMP_CWORD=1; COMP_LINE='veris rec'; COMP_POINT=9; _veris veris rec veris; echo \"${{COMPREPLY[@]}}\"",
        file.display()
    );
    let out = output(command("bash").args(["-c", &probe]));
    let (completed, stderr) = text(&out);
    assert_eq!(completed.trim(), "receipt", "{stderr}");
    assert!(!output(&mut veris(["completions", "tcsh"])).status.success());
}

/// Each value completes by its kind: only directories for `--state-dir` and
/// `--ca-dir`, files for a file flag, the catalog's names for `--services`
/// and `--require` (bash: the script loaded into a real bash and asked; zsh
/// and fish: what their scripts say for those flags).
#[test]
fn completions_complete_values_by_kind() {
    let dir = TempDir::new("completions-kind");
    let script = dir.join("veris.bash");
    let out = output(&mut veris(["completions", "bash"]));
    std::fs::write(&script, &out.stdout).unwrap();
    std::fs::create_dir(dir.join("adir")).unwrap();
    std::fs::write(dir.join("afile"), "").unwrap();
    // The words of a command line typed up to its last (partial) word.
    let complete = |words: &[&str]| {
        let line = words.join(" ");
        let probe = format!(
            "source {}; cd {}; COMP_WORDS=({line}); COMP_CWORD={}; COMP_LINE='{line}'; COMP_POINT={}; _veris veris {} {} 2>/dev/null; echo \"${{COMPREPLY[@]}}\"",
            script.display(),
            dir.path().display(),
            words.len() - 1,
            line.len(),
            words[words.len() - 1],
            words[words.len() - 2],
        );
        let out = output(command("bash").args(["-c", &probe]));
        let (completed, stderr) = text(&out);
        assert!(out.status.success(), "{line}: {stderr}");
        completed.trim().to_string()
    };
    // Directories come from bash itself (`compopt -o plusdirs`): the script
    // offers no file.
    for flag in ["--state-dir", "--ca-dir"] {
        let got = complete(&["veris", "serve", flag, "a"]);
        assert!(!got.contains("afile"), "{flag} offers a file: {got:?}");
    }
    let got = complete(&["veris", "serve", "--ready-file", "a"]);
    assert!(got.contains("afile"), "--ready-file: {got:?}");
    assert_eq!(complete(&["veris", "serve", "--services", "str"]), "stripe");
    assert_eq!(
        complete(&["veris", "run", "--require", "goo"]),
        "google-calendar google-drive google-gmail google-identity"
    );
    // The command line still takes a name outside the catalog (a route
    // may name one): veris, not the parser, judges it, and says how to
    // route it.
    let out = output(veris(["run", "--state-dir"]).arg(dir.join("state")).args([
        "--require",
        "my-api",
        "--",
        "true",
    ]));
    let stderr = text(&out).1;
    assert!(
        !stderr.contains("invalid value") && stderr.contains("--route my-api=HOST"),
        "{stderr}"
    );

    let zsh = text(&output(&mut veris(["completions", "zsh"]))).0;
    let line = |script: &str, flag: &str| {
        script
            .lines()
            .find(|l| l.contains(flag))
            .unwrap_or_else(|| panic!("no {flag} in the script"))
            .to_string()
    };
    assert!(line(&zsh, "--state-dir=").contains("_files -/"), "{zsh}");
    assert!(line(&zsh, "--ca-dir=").contains("_files -/"));
    assert!(line(&zsh, "--services=").contains("stripe"));
    assert!(line(&zsh, "--require=").contains("github"));
    // fish: one `complete` command a flag, its values over several lines.
    let fish = text(&output(&mut veris(["completions", "fish"]))).0;
    let entry = |flag: &str| {
        let at = fish
            .find(&format!(" -l {flag} "))
            .unwrap_or_else(|| panic!("no {flag} in the fish script"));
        let end = fish[at..]
            .find("\ncomplete ")
            .map_or(fish.len(), |n| at + n);
        fish[at..end].to_string()
    };
    assert!(
        entry("state-dir").contains("-f -a \"(__fish_complete_directories)\""),
        "{}",
        entry("state-dir")
    );
    assert!(
        entry("services").contains("stripe"),
        "{}",
        entry("services")
    );
    assert!(entry("require").contains("github"), "{}", entry("require"));
}

#[test]
fn man_prints_a_manual_page_that_renders() {
    let out = output(&mut veris(["man"]));
    let (page, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(page.starts_with(".TH"), "{}", &page[..page.len().min(200)]);
    for word in ["receipt", "completions", "doctor"] {
        assert!(page.contains(word), "the page lacks {word}");
    }
    for internal in INTERNAL {
        assert!(!page.contains(internal), "the page shows {internal}");
    }
    // Only veris(1) is shipped: no reference to a page of a subcommand.
    assert!(
        !page.contains("(1)"),
        "the page names a page that does not exist"
    );
    assert!(
        page.contains("veris run \\-\\-help"),
        "the page says where run's options are"
    );
    if !support::tool_works("groff", &["--version"]) {
        return support::skip("groff is not installed (apt install groff-base)");
    }
    let dir = TempDir::new("man");
    let file = dir.join("veris.1");
    std::fs::write(&file, &out.stdout).unwrap();
    let rendered = output(command("groff").args(["-man", "-Tutf8", "-ww"]).arg(&file));
    let (text_page, warnings) = text(&rendered);
    assert!(rendered.status.success(), "groff: {warnings}");
    assert!(warnings.is_empty(), "groff warns: {warnings}");
    assert!(text_page.contains("veris"), "{text_page}");
    assert!(text_page.contains("receipt"), "{text_page}");
}

/// Skips only when `skip_is_recorded_for_the_summary` runs it.
#[test]
fn skip_probe() {
    if std::env::var_os("VERIS_SKIP_PROBE").is_some() {
        support::skip("probe skip");
    }
}

#[test]
fn skip_is_recorded_for_the_summary() {
    // This test binary, run again on the probe alone, as scripts/test runs it.
    let dir = TempDir::new("skiplog");
    let log = dir.join("skips");
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "cli::skip_probe", "--test-threads", "2"])
        .env("VERIS_SKIP_PROBE", "1")
        .env("VERIS_SKIP_LOG", &log)
        .env_remove("VERIS_REQUIRE_ALL");
    let out = output(&mut cmd);
    assert!(out.status.success(), "{:?}", text(&out));
    let lines = std::fs::read_to_string(&log).expect("the skip log");
    assert_eq!(lines, "e2e::cli::skip_probe: probe skip\n");
}

/// A workload that shares the state dir may plant a FIFO or a link to
/// /dev/zero where a reader looks for the live proxy: `veris receipt` (and
/// with it every MCP call) and `veris doctor` must answer, not hang or fill
/// their memory. (Under a 2 GB address-space limit, so a reader that reads
/// /dev/zero unbounded fails fast instead of growing.)
#[test]
fn planted_fifos_and_dev_zero_in_the_state_dir_neither_hang_nor_fill_a_reader() {
    let dir = TempDir::new("planted");
    let state = dir.join("state");
    let out = output(veris(["ca", "init", "--state-dir"]).arg(&state));
    assert!(out.status.success(), "{:?}", text(&out));
    let bin = support::bin();
    let limited = |args: &str| {
        let mut cmd = command("sh");
        cmd.arg("-c")
            .arg(format!("ulimit -v 2000000; exec {} {args}", bin.display()));
        output_within(&mut cmd, std::time::Duration::from_secs(30))
    };
    let mkfifo = |p: &std::path::Path| {
        let out = output(command("mkfifo").arg(p));
        assert!(out.status.success(), "{:?}", text(&out));
    };
    let s = state.display().to_string();
    mkfifo(&state.join("admin.addr"));
    let out = limited(&format!("receipt --state-dir {s}"));
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
    let out = limited(&format!("doctor --state-dir {s}"));
    assert!(out.status.code().is_some(), "{:?}", text(&out));

    std::fs::remove_file(state.join("admin.addr")).unwrap();
    std::fs::write(state.join("admin.addr"), "127.0.0.1:9\n").unwrap();
    std::os::unix::fs::symlink("/dev/zero", state.join("admin.token")).unwrap();
    let bundle = state.join("trust").join("bundle.pem");
    std::fs::remove_file(&bundle).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &bundle).unwrap();
    let out = limited(&format!("receipt --state-dir {s}"));
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
    assert!(!text(&out).1.contains("memory"), "{:?}", text(&out));
    let out = limited(&format!("doctor --state-dir {s}"));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(stdout.contains("not a regular file"), "{stdout}");

    // A FIFO as the ledger itself.
    mkfifo(&state.join("ledger.jsonl"));
    let out = limited(&format!("receipt --state-dir {s}"));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("not a regular file"), "{stderr}");
}

/// E1: a relative `--state-dir` never puts a relative path into a file
/// that is read from elsewhere (`--write-env`, the ready file, `ca env`).
#[test]
fn a_relative_state_dir_writes_absolute_paths() {
    let dir = TempDir::new("relative-state");
    let mut proxy = support::Guard::spawn(
        veris([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            "st",
            "--write-env",
            "env.sh",
            "--ready-file",
            "ready.json",
        ])
        .current_dir(dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null()),
    );
    let ready = support::wait_json_file(&dir.join("ready.json"), DEADLINE);
    proxy.signal("TERM");
    proxy.wait();
    for field in ["state_dir", "ledger", "ca"] {
        let p = ready[field].as_str().unwrap_or_default();
        assert!(p.starts_with('/'), "{field}: {ready}");
    }
    let env = std::fs::read_to_string(dir.join("env.sh")).unwrap();
    let cert = env
        .lines()
        .find(|l| l.contains("SSL_CERT_FILE="))
        .unwrap_or_else(|| panic!("{env}"));
    assert!(
        cert.contains(&format!("{}/st/trust/", dir.path().display())),
        "{cert}"
    );
    let out = output(veris(["ca", "env", "--state-dir", "st"]).current_dir(dir.path()));
    let (stdout, _) = text(&out);
    assert!(!stdout.contains("'st/"), "{stdout}");
    assert!(
        stdout.contains(&format!("{}/st/", dir.path().display())),
        "{stdout}"
    );
}

/// `veris man COMMAND`: each command's own page, with the sections a
/// command's page has, rendering without a warning in man(1), and every
/// example in it a command line veris accepts.
#[test]
fn each_command_has_a_page_of_its_own_whose_examples_parse() {
    let help = output(&mut veris(["--help"]));
    let (help, _) = text(&help);
    let commands: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect();
    assert!(commands.len() > 15, "{commands:?}");
    let man = support::tool_works("man", &["--version"]);
    let dir = TempDir::new("man-pages");
    for c in &commands {
        let out = output(&mut veris(["man", c]));
        let (page, stderr) = text(&out);
        assert!(out.status.success(), "veris man {c}: {stderr}");
        assert!(
            page.starts_with(&format!(".TH veris-{c} 1")),
            "{c}: {}",
            &page[..80.min(page.len())]
        );
        for section in [
            "SYNOPSIS",
            "EXIT STATUS",
            "ENVIRONMENT",
            "FILES",
            "EXAMPLES",
        ] {
            assert!(
                page.contains(&format!(".SH {section}"))
                    || page.contains(&format!(".SH \"{section}\"")),
                "veris man {c} has no {section}"
            );
        }
        // Every example line that runs veris parses (its flags exist).
        let examples = page
            .split(".EX\n")
            .skip(1)
            .filter_map(|e| e.split(".EE").next());
        for line in examples.flat_map(str::lines) {
            let line = line.replace("\\-", "-");
            let Some(args) = line.strip_prefix("veris ") else {
                continue;
            };
            let args: Vec<&str> = args
                .split_whitespace()
                .take_while(|w| !matches!(*w, "&" | ">" | "|"))
                .map(|w| w.trim_matches('"'))
                .collect();
            let at = args.iter().position(|a| *a == "--").unwrap_or(args.len());
            let mut cmd = veris(&args[..at]);
            let out = output(cmd.arg("--help"));
            assert!(
                out.status.success(),
                "veris man {c}: the example `{line}` does not parse: {:?}",
                text(&out)
            );
        }
        if man {
            let file = dir.join(format!("veris-{c}.1"));
            std::fs::write(&file, &out.stdout).unwrap();
            let rendered = output(
                command("man")
                    .args(["--warnings", "-l"])
                    .arg(&file)
                    .env("MANWIDTH", "80")
                    .env("MANPAGER", "cat"),
            );
            let (shown, warnings) = text(&rendered);
            assert!(rendered.status.success(), "man {c}: {warnings}");
            assert!(
                warnings.trim().is_empty(),
                "man warns on veris-{c}(1): {warnings}"
            );
            assert!(shown.contains("EXIT STATUS"), "{shown}");
        }
    }
    if !man {
        return support::skip("man is not installed (apt install man-db)");
    }
    let out = output(&mut veris(["man", "no-such-command"]));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).1.contains("Next: one of serve"),
        "{:?}",
        text(&out)
    );
}
