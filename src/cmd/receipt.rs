//! `veris receipt`: the receipt of a state dir or a ledger file, printed as
//! text (coloured on a terminal) or JSON, optionally with a JUnit report.

use anyhow::Result;

use crate::runtime::receipt::{build, ReceiptArgs, Report};

pub async fn receipt(args: ReceiptArgs) -> Result<u8> {
    let junit = crate::runtime::junit::Junit::start(
        args.junit.as_deref(),
        args.junit_suite.as_deref().unwrap_or("veris receipt"),
    )?;
    let judging = std::time::Instant::now();
    let result = match build(&args).await {
        Ok(report) => {
            if let Some(note) = report.note() {
                eprintln!("{note}");
            }
            print(&args, &report).map(|()| report)
        }
        Err(e) => Err(e),
    };
    match (junit, result) {
        (None, result) => result.map(|report| report.exit_code),
        (Some(junit), Ok(report)) => {
            junit.write(&report, None, judging.elapsed())?;
            Ok(report.exit_code)
        }
        (Some(junit), Err(e)) => {
            // CI reads the report whatever happened; the error decides the exit.
            if let Err(write) = junit.write_error(&format!("{e:#}")) {
                eprintln!("veris: {write:#}");
            }
            Err(e)
        }
    }
}

/// Prints a judged receipt: its text, or with `--json` the JSON and the
/// verdict lines on stderr, where they still reach a person.
fn print(args: &ReceiptArgs, report: &Report) -> Result<()> {
    if args.json {
        match &report.stream {
            // From the stream: the receipt and what the stream held.
            Some(stream) => {
                let mut json = serde_json::to_value(&report.receipt)?;
                if let Some(o) = json.as_object_mut() {
                    o.insert("stream".into(), stream.clone());
                }
                crate::outln!("{}", serde_json::to_string_pretty(&json)?);
            }
            None => crate::outln!("{}", serde_json::to_string_pretty(&report.receipt)?),
        }
        for line in report.text.lines().filter(|l| l.starts_with("FAIL: ")) {
            eprintln!("{line}");
        }
    } else {
        use std::io::IsTerminal;
        let terminal = std::io::stdout().is_terminal();
        let colour = crate::logging::colour(terminal, std::env::var_os("NO_COLOR").as_deref());
        crate::out!(
            "{}{}",
            crate::logging::reset(terminal),
            paint(&report.text, colour)
        );
    }
    Ok(())
}

/// The receipt text for a terminal: the integrity verdict green, yellow or
/// red by its word, `FAIL:` lines red. Without `colour`, the text as is
/// (a pipe, a file, `NO_COLOR`): nothing but a person's eye reads colour.
fn paint(text: &str, colour: bool) -> String {
    if !colour {
        return text.to_string();
    }
    const RED: &str = "\x1b[31m";
    const GREEN: &str = "\x1b[32m";
    const YELLOW: &str = "\x1b[33m";
    const RESET: &str = "\x1b[0m";
    let mut out = String::with_capacity(text.len() + 64);
    for line in text.split_inclusive('\n') {
        if line.starts_with("FAIL: ") {
            let body = line.trim_end_matches('\n');
            out.push_str(&format!("{RED}{body}{RESET}{}", &line[body.len()..]));
            continue;
        }
        let mut line = line.to_string();
        // Only veris's own integrity line is coloured, never a phrase
        // elsewhere (recorded text is quoted, and this keeps it so).
        if !line.starts_with("  interception: ") {
            out.push_str(&line);
            continue;
        }
        for (word, hue) in [
            ("integrity: verified", GREEN),
            ("integrity: unverified", YELLOW),
            ("integrity: failed", RED),
        ] {
            if let Some(at) = line.find(word) {
                let end = at + word.len();
                line = format!(
                    "{}{hue}{}{RESET}{}",
                    &line[..at],
                    &line[at..end],
                    &line[end..]
                );
                break;
            }
        }
        out.push_str(&line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::paint;

    #[test]
    fn colour_marks_the_verdict_and_fail_lines_only_when_asked() {
        let text = "Veris receipt — twin sbx\n  interception: explicit   integrity: unverified (why)\nFAIL: stripe: wanted 2\n";
        assert_eq!(paint(text, false), text);
        let painted = paint(text, true);
        assert!(
            painted.contains("\x1b[33mintegrity: unverified\x1b[0m (why)\n"),
            "{painted:?}"
        );
        assert!(
            painted.contains("\x1b[31mFAIL: stripe: wanted 2\x1b[0m\n"),
            "{painted:?}"
        );
        assert!(
            painted.starts_with("Veris receipt — twin sbx\n"),
            "{painted:?}"
        );
        // Nothing but the escapes is added.
        let plain = painted
            .replace("\x1b[33m", "")
            .replace("\x1b[31m", "")
            .replace("\x1b[0m", "");
        assert_eq!(plain, text);
        let line = "  interception: x   integrity: verified\n";
        assert!(paint(line, true).contains("\x1b[32mintegrity: verified"));
        let line = "  interception: x   integrity: failed (x)";
        assert!(paint(line, true).contains("\x1b[31mintegrity: failed\x1b[0m (x)"));
        // The same words anywhere else (a quoted host) are not coloured.
        let line = "passthrough: \"integrity: verified\" (1)\n";
        assert_eq!(paint(line, true), line);
    }
}
