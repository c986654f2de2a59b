//! The verdict as a JUnit XML report (`--junit FILE`), the shape CI systems
//! (Jenkins, GitHub test reporters, GitLab's `reports: junit`) show as test
//! results: one `<testcase>` per assertion [`evaluate`] made — integrity,
//! non-emptiness, trust, each requirement — plus, for `veris run`, the
//! command's own exit code. Nothing is judged here: a case fails exactly
//! when its [`Outcome`] has failure lines, so the report agrees with the
//! exit code by construction. The receipt text goes to `<system-out>`.
//!
//! Everything a workload chose (request paths, host names) is escaped as
//! entities, and characters XML 1.0 cannot carry at all (NUL, ESC and the
//! other C0 controls, U+FFFE/U+FFFF) become U+FFFD, so any receipt yields a
//! well-formed document.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use super::*;

/// What a report says besides the verdict: who wrote it, when, where.
#[derive(Debug, Clone)]
pub struct JunitContext<'a> {
    /// The suite's name, e.g. `veris receipt` or `veris run`, or the
    /// user's (`--junit-suite`); the cases' `classname` is made of it.
    pub suite: &'a str,
    /// When the command started (the suite's `timestamp`, UTC).
    pub started: SystemTime,
    /// How long it took (the suite's `time`).
    pub elapsed: Duration,
    /// How long reading, verifying and judging the ledger took (the
    /// integrity case's `time`).
    pub judged: Duration,
    pub hostname: &'a str,
}

/// `veris run`'s command: its own exit code and how long it ran (a case of
/// its own, with that time).
#[derive(Debug, Clone, Copy)]
pub struct CommandRan {
    pub code: u8,
    pub ran: Duration,
}

/// The JUnit report of a judged receipt. `text` is the receipt text as
/// printed (with its `FAIL:` lines); `command` is `veris run`'s command,
/// which becomes a case of its own.
///
/// Case names are stable across runs (CI history keys tests by name): a
/// case is named for what it asserts, never for its result.
pub fn render_junit(
    r: &Receipt,
    verdict: &Verdict,
    text: &str,
    command: Option<CommandRan>,
    cx: &JunitContext<'_>,
) -> String {
    let mut cases = Vec::new();
    // Integrity: failed integrity and an unmet --require-verified are one case.
    let integrity_failures: Vec<String> = verdict
        .outcomes
        .iter()
        .filter(|o| {
            matches!(
                o.assertion,
                Assertion::Integrity | Assertion::Requirement(Requirement::Verified)
            )
        })
        .flat_map(|o| o.failures.iter().cloned())
        .collect();
    let mut checks = format!("integrity: {}\n", super::text::integrity_text(&r.integrity));
    for c in &r.integrity.checks {
        let _ = writeln!(
            checks,
            "  {}: {} {}",
            c.name,
            c.status.word(),
            crate::quote::escaped(&c.detail)
        );
    }
    cases.push(Case {
        name: "integrity".into(),
        kind: "integrity",
        failures: integrity_failures,
        skipped: None,
        out: Some(checks),
        time: cx.judged,
    });
    for o in &verdict.outcomes {
        let (name, kind) = match &o.assertion {
            Assertion::Integrity | Assertion::Requirement(Requirement::Verified) => continue,
            Assertion::NonEmpty => ("at least 1 request reached the twin".to_string(), "empty"),
            Assertion::Trust => (
                "no vendor host refused the veris certificate".to_string(),
                "trust",
            ),
            Assertion::Requirement(req) => (requirement_name(req), "requirement"),
        };
        cases.push(Case {
            name,
            kind,
            failures: o.failures.clone(),
            skipped: o
                .waived
                .then(|| format!("not asserted (--allow-empty): {EMPTY_SENTENCE}")),
            out: None,
            time: Duration::ZERO,
        });
    }
    if let Some(command) = command {
        cases.push(Case {
            name: "command exits 0".into(),
            kind: "command",
            failures: match command.code {
                0 => Vec::new(),
                c => vec![format!("the command exited {c}")],
            },
            skipped: None,
            out: None,
            time: command.ran,
        });
    }
    let mut properties = vec![
        ("twin", r.twin.clone().unwrap_or_default()),
        ("integrity", super::text::integrity_text(&r.integrity)),
        ("leaks", r.leaks.join(", ")),
        ("requests", r.total_requests().to_string()),
    ];
    if let Some(key) = &r.seal_key {
        properties.push(("seal_key", key.clone()));
    }
    document(cx, &properties, &cases, None, text)
}

/// The report of a command that ended before it had a receipt to judge
/// (no ledger, a command that cannot be found, an I/O error): one case in
/// error, with the message.
pub fn render_junit_error(message: &str, cx: &JunitContext<'_>) -> String {
    let case = Case {
        name: "receipt".into(),
        kind: "error",
        failures: Vec::new(),
        skipped: None,
        out: None,
        time: cx.elapsed,
    };
    document(cx, &[], &[case], Some(message), message)
}

/// `require stripe >= 1 (2xx)`: how a CI page lists a requirement.
fn requirement_name(req: &Requirement) -> String {
    match req {
        Requirement::Service { name, min, status } => {
            format!("require {name} >= {min} ({status})")
        }
        Requirement::Host { host, min, status } => {
            format!("require host {host} >= {min} ({status})")
        }
        Requirement::Request {
            service,
            method,
            path,
            status,
        } => format!("require request {service} {method} {path} ({status})"),
        Requirement::Callback { path, min, status } => {
            format!("require callback {path} >= {min} ({status})")
        }
        Requirement::Verified => "require integrity verified".into(),
    }
}

struct Case {
    name: String,
    /// The failure's `type`.
    kind: &'static str,
    failures: Vec<String>,
    skipped: Option<String>,
    out: Option<String>,
    /// What the case took: the command's run, the ledger's reading and
    /// verifying; judging a requirement takes no measurable time.
    time: Duration,
}

/// The whole document; `error` puts the (single) case in error instead.
fn document(
    cx: &JunitContext<'_>,
    properties: &[(&str, String)],
    cases: &[Case],
    error: Option<&str>,
    system_out: &str,
) -> String {
    let tests = cases.len();
    let failures = cases.iter().filter(|c| !c.failures.is_empty()).count();
    let errors = usize::from(error.is_some());
    let skipped = cases.iter().filter(|c| c.skipped.is_some()).count();
    let time = format!("{:.3}", cx.elapsed.as_secs_f64());
    let name = attr(cx.suite);
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        x,
        "<testsuites name=\"{name}\" tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{skipped}\" time=\"{time}\">"
    );
    let _ = writeln!(
        x,
        "  <testsuite name=\"{name}\" tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{skipped}\" time=\"{time}\" timestamp=\"{}\" hostname=\"{}\">",
        timestamp(cx.started),
        attr(cx.hostname)
    );
    if !properties.is_empty() {
        x.push_str("    <properties>\n");
        for (k, v) in properties {
            let _ = writeln!(
                x,
                "      <property name=\"{}\" value=\"{}\"/>",
                attr(k),
                attr(v)
            );
        }
        x.push_str("    </properties>\n");
    }
    let classname = attr(&cx.suite.replace(' ', "."));
    for c in cases {
        let _ = write!(
            x,
            "    <testcase name=\"{}\" classname=\"{classname}\" time=\"{:.3}\"",
            attr(&c.name),
            c.time.as_secs_f64()
        );
        if c.failures.is_empty() && c.skipped.is_none() && c.out.is_none() && error.is_none() {
            x.push_str("/>\n");
            continue;
        }
        x.push_str(">\n");
        if let Some(message) = error {
            let _ = writeln!(
                x,
                "      <error message=\"{}\" type=\"{}\">{}</error>",
                attr(first_line(message)),
                c.kind,
                body(message)
            );
        }
        if let Some(first) = c.failures.first() {
            let _ = writeln!(
                x,
                "      <failure message=\"{}\" type=\"{}\">{}</failure>",
                attr(first),
                c.kind,
                body(&c.failures.join("\n"))
            );
        }
        if let Some(why) = &c.skipped {
            let _ = writeln!(x, "      <skipped message=\"{}\"/>", attr(why));
        }
        if let Some(out) = &c.out {
            let _ = writeln!(x, "      <system-out>{}</system-out>", body(out));
        }
        x.push_str("    </testcase>\n");
    }
    let _ = writeln!(x, "    <system-out>{}</system-out>", body(system_out));
    x.push_str("  </testsuite>\n</testsuites>\n");
    x
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// `2026-12-01T20:25:38`: UTC, no offset (the Ant/Jenkins schema's form).
fn timestamp(t: SystemTime) -> String {
    let t = time::OffsetDateTime::from(t);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// Whether XML 1.0 can carry `c` (its `Char` production), leaving out the
/// C1 controls and DEL it discourages.
fn allowed(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{7E}' | '\u{A0}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

/// Escapes text content: markup characters as entities (so `]]>` cannot
/// occur), CR as a reference (it would be normalized away), and what XML
/// cannot carry as U+FFFD.
fn body(s: &str) -> String {
    escape(s, false)
}

/// Escapes an attribute value: as [`body`], plus quotes, and tab and
/// newline as references so attribute normalization keeps them.
fn attr(s: &str) -> String {
    escape(s, true)
}

fn escape(s: &str, attribute: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' if attribute => out.push_str("&quot;"),
            '\'' if attribute => out.push_str("&apos;"),
            '\t' if attribute => out.push_str("&#9;"),
            '\n' if attribute => out.push_str("&#10;"),
            '\r' => out.push_str("&#13;"),
            c if allowed(c) => out.push(c),
            _ => out.push('\u{FFFD}'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::ListenerTier;

    fn cx() -> JunitContext<'static> {
        JunitContext {
            suite: "veris receipt",
            started: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            elapsed: Duration::from_millis(1234),
            judged: Duration::from_micros(4_250),
            hostname: "ci-1",
        }
    }

    fn receipt(paths: &[&str]) -> Receipt {
        let mut services = BTreeMap::new();
        if !paths.is_empty() {
            services.insert(
                "stripe".to_string(),
                ServiceSummary {
                    requests: paths.len() as u64,
                    entries: paths
                        .iter()
                        .enumerate()
                        .map(|(i, p)| RequestEntry {
                            seq: i as u64 + 2,
                            method: "GET".into(),
                            path: p.to_string(),
                            status: 200,
                            tier: ListenerTier::Explicit,
                            client_gone: false,
                            incomplete: None,
                        })
                        .collect(),
                    calls: paths.iter().map(|p| (format!("GET {p}"), 1)).collect(),
                    call_statuses: paths
                        .iter()
                        .map(|p| (format!("GET {p}"), BTreeMap::from([(200, 1)])))
                        .collect(),
                    ..ServiceSummary::default()
                },
            );
        }
        Receipt {
            version: RECEIPT_VERSION,
            twin: Some("sbx_<&>".into()),
            window: Window {
                since_seq: 0,
                until_seq: 9,
                scope: Scope::Session,
            },
            mode: None,
            interception: Some(Interception::Explicit),
            isolation: None,
            bundles: Vec::new(),
            integrity: Integrity {
                status: IntegrityStatus::Unverified,
                reason: Some("no \"anchor\"".into()),
                checks: vec![Check {
                    name: "chain".into(),
                    status: CheckStatus::Ok,
                    detail: "9 lines".into(),
                }],
            },
            leaks: vec!["direct-egress-possible".into()],
            services,
            trust_failures: Vec::new(),
            tls_abandoned: Vec::new(),
            passthrough: HostCounts::default(),
            blocked: HostCounts::default(),
            upstream_errors: Vec::new(),
            seal_key: None,
            reserved_paths: BTreeMap::new(),
            set_aside: Vec::new(),
            dns_refused: Vec::new(),
            callbacks: Default::default(),
            publishing: None,
            requirements: Vec::new(),
        }
    }

    #[test]
    fn escaping_leaves_no_markup_and_no_character_xml_forbids() {
        let nasty = "/v1/x]]><a href='1'>&amp;\u{0}\u{1b}\u{7f}\r\t\n\u{FFFE}é";
        let b = body(nasty);
        assert!(!b.contains("]]>") && !b.contains('<') && !b.contains('\u{0}'));
        assert!(!b.contains('\u{1b}') && !b.contains('\u{FFFE}') && !b.contains('\r'));
        assert!(b.contains("]]&gt;&lt;a href='1'&gt;&amp;amp;"), "{b}");
        assert!(
            b.ends_with("\u{FFFD}\u{FFFD}\u{FFFD}&#13;\t\n\u{FFFD}é"),
            "{b}"
        );
        let a = attr(nasty);
        assert!(
            a.contains("href=&apos;1&apos;") && a.contains("&#13;&#9;&#10;"),
            "{a}"
        );
        assert!(!a.contains('"') && !a.contains('\n'));
    }

    #[test]
    fn the_cases_follow_the_verdict() {
        let r = receipt(&["/v1/charges", "/v1/x]]>\u{1b}&\u{0}"]);
        let reqs = [
            Requirement::parse_service("stripe:1").unwrap(),
            Requirement::parse_service("stripe:5").unwrap(),
            Requirement::parse_request("stripe POST /v1/charges").unwrap(),
            Requirement::Verified,
        ];
        let v = evaluate(&r, &reqs, false);
        assert_eq!(v.exit_code, EXIT_UNMET);
        let text = render_text(&r);
        let ran = CommandRan {
            code: 7,
            ran: Duration::from_millis(900),
        };
        let x = render_junit(&r, &v, &text, Some(ran), &cx());
        assert!(x.contains("<testsuite name=\"veris receipt\" tests=\"7\" failures=\"4\" errors=\"0\" skipped=\"0\" time=\"1.234\" timestamp=\"2023-11-14T22:13:20\" hostname=\"ci-1\">"), "{x}");
        assert!(x.contains("<testcase name=\"require stripe &gt;= 1 (2xx)\" classname=\"veris.receipt\" time=\"0.000\"/>"), "{x}");
        assert!(
            x.contains("<testcase name=\"require stripe &gt;= 5 (2xx)\""),
            "{x}"
        );
        assert!(x.contains("message=\"required service stripe: at least 5 request(s) answered 2xx; saw 2, with status 200\" type=\"requirement\""), "{x}");
        assert!(
            x.contains("<testcase name=\"require request stripe POST /v1/charges (2xx)\""),
            "{x}"
        );
        assert!(
            x.contains("<testcase name=\"integrity\" classname=\"veris.receipt\" time=\"0.004\">"),
            "{x}"
        );
        // The checks in words, not as the enum's names.
        assert!(x.contains("  chain: ok "), "{x}");
        assert!(!x.contains(": Ok ") && !x.contains(": Unverified "), "{x}");
        assert!(
            x.contains(
                "<testcase name=\"command exits 0\" classname=\"veris.receipt\" time=\"0.900\">"
            ),
            "{x}"
        );
        assert!(x.contains("required verified integrity (--require-verified), got unverified (no &quot;anchor&quot;)"), "{x}");
        assert!(
            x.contains("<failure message=\"the command exited 7\" type=\"command\">"),
            "{x}"
        );
        assert!(
            x.contains("GET \"/v1/x]]&gt;\\u{1b}&amp;\\u{0}\" -&gt; 200"),
            "{x}"
        );
        assert!(!x.contains('\u{0}') && !x.contains('\u{1b}'));
        assert_eq!(x.matches("<failure ").count(), 4);
        // Every FAIL line of the verdict is a failure of some case.
        for line in &v.lines {
            assert!(x.contains(&body(line)), "{line} missing from\n{x}");
        }
    }

    #[test]
    fn a_passing_receipt_has_no_failure_and_an_allowed_empty_one_is_skipped() {
        let mut r = receipt(&["/v1/charges"]);
        r.integrity = Integrity {
            status: IntegrityStatus::Verified,
            reason: None,
            checks: Vec::new(),
        };
        let v = evaluate(&r, &[Requirement::Verified], false);
        assert_eq!(v.exit_code, 0);
        let ran = CommandRan {
            code: 0,
            ran: Duration::from_secs(2),
        };
        let x = render_junit(&r, &v, &render_text(&r), Some(ran), &cx());
        assert!(
            x.contains("tests=\"4\" failures=\"0\" errors=\"0\" skipped=\"0\""),
            "{x}"
        );
        // The same case name whatever the result: CI history keeps one test.
        assert!(x.contains("<testcase name=\"integrity\""), "{x}");
        assert!(!x.contains("<failure"), "{x}");

        let r = receipt(&[]);
        let v = evaluate(&r, &[], true);
        assert_eq!(v.exit_code, 0);
        let x = render_junit(&r, &v, &render_text(&r), None, &cx());
        assert!(
            x.contains("tests=\"3\" failures=\"0\" errors=\"0\" skipped=\"1\""),
            "{x}"
        );
        assert!(
            x.contains("<skipped message=\"not asserted (--allow-empty): 0 requests"),
            "{x}"
        );
        let v = evaluate(&r, &[], false);
        let x = render_junit(&r, &v, &render_text(&r), None, &cx());
        assert!(x.contains("tests=\"3\" failures=\"1\""), "{x}");
        assert!(x.contains("type=\"empty\""), "{x}");
    }

    #[test]
    fn an_error_report_has_one_case_in_error() {
        let x = render_junit_error("no ledger at /x<y>\nNext: run it", &cx());
        assert!(
            x.contains("tests=\"1\" failures=\"0\" errors=\"1\" skipped=\"0\""),
            "{x}"
        );
        assert!(x.contains("<error message=\"no ledger at /x&lt;y&gt;\" type=\"error\">no ledger at /x&lt;y&gt;\nNext: run it</error>"), "{x}");
    }
}
