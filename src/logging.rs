//! The one tracing subscriber of the binary, and its terminal manners:
//! colour only on a terminal and never with `NO_COLOR`, and fields printed
//! plainly (`service=stripe`, not `service=Some("stripe")`; a `None` field
//! is left out), whatever the library crates record.

use std::fmt;
use std::io::IsTerminal;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::FormatFields;

/// Log format on stderr.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The filter from `VERIS_LOG`, then `RUST_LOG`, else `default_level`.
pub fn filter(default_level: &str) -> tracing_subscriber::EnvFilter {
    let filter = std::env::var("VERIS_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| default_level.to_string());
    tracing_subscriber::EnvFilter::try_new(&filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level))
}

/// Whether log lines on stderr may carry ANSI colour: only when stderr is
/// a terminal and `NO_COLOR` is unset or empty (no-color.org).
pub fn colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// What to print before veris's own report on a stream: on a terminal, the
/// SGR reset, so colours or a hidden mode the workload left set (say
/// `ESC[30;40m`, black on black) cannot disguise it; elsewhere nothing.
pub fn reset(terminal: bool) -> &'static str {
    if terminal {
        "\x1b[0m"
    } else {
        ""
    }
}

/// The format [`init`] installed: [`announce`] follows it.
static FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

/// A long-running command's announcement on stderr (`veris: proxy …`,
/// where a person or a log collector reads it): `veris: TEXT` in the text
/// format, and in the JSON format a line shaped as the subscriber's own
/// (`timestamp`, `level`, `fields.message`, `target`), so that every stderr
/// line of `--log-format json` is JSON. Not subject to the level filter:
/// the announcement is what the command is for.
pub fn announce(text: &str) {
    match FORMAT.get() {
        Some(LogFormat::Json) => {
            let now = time::OffsetDateTime::now_utc()
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default();
            let line = serde_json::json!({
                "timestamp": now,
                "level": "INFO",
                "fields": {"message": text},
                "target": "veris",
            });
            eprintln!("{line}");
        }
        _ => eprintln!("veris: {text}"),
    }
}

/// Installs the subscriber writing to stderr.
pub fn init(format: LogFormat, default_level: &str) {
    let _ = FORMAT.set(format);
    let ansi = colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter(default_level))
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.fmt_fields(PlainFields).init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Field formatting for the text format: `name=value` separated by spaces,
/// the message bare, an `Option` shown as its value or left out when `None`.
pub struct PlainFields;

impl<'w> FormatFields<'w> for PlainFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut visitor = PlainVisitor {
            writer: &mut writer,
            seen: false,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct PlainVisitor<'a, 'w> {
    writer: &'a mut Writer<'w>,
    seen: bool,
    result: fmt::Result,
}

impl Visit for PlainVisitor<'_, '_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.result.is_err() {
            return;
        }
        let shown = if field.name() == "message" {
            format!("{value:?}")
        } else {
            match plain(&format!("{value:?}")) {
                Some(v) => format!("{}={v}", field.name()),
                None => return,
            }
        };
        // A host or path the workload chose stays on its log line, with
        // no control character or bidi mark reaching the terminal.
        let shown = veris_receipt::quote::escaped(&shown);
        let sep = if self.seen { " " } else { "" };
        self.seen = true;
        self.result = write!(self.writer, "{sep}{shown}");
    }
}

/// A field's Debug text as it should read: `Some(x)` as `x` (a simple
/// quoted string without its quotes), `None` as nothing.
fn plain(debug: &str) -> Option<String> {
    if debug == "None" {
        return None;
    }
    let Some(inner) = debug
        .strip_prefix("Some(")
        .and_then(|rest| rest.strip_suffix(')'))
    else {
        return Some(debug.to_string());
    };
    let simple = inner
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .filter(|s| {
            !s.is_empty()
                && !s
                    .chars()
                    .any(|c| c.is_whitespace() || c == '"' || c == '\\' || c == '=')
        });
    Some(simple.unwrap_or(inner).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_read_as_their_value() {
        assert_eq!(plain("Some(\"stripe\")").as_deref(), Some("stripe"));
        assert_eq!(plain("Some(3)").as_deref(), Some("3"));
        assert_eq!(plain("Some(\"a b\")").as_deref(), Some("\"a b\""));
        assert_eq!(plain("None"), None);
        assert_eq!(plain("\"x\"").as_deref(), Some("\"x\""));
        assert_eq!(plain("[1, 2]").as_deref(), Some("[1, 2]"));
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(colour(true, None));
        assert!(colour(true, Some(OsStr::new(""))));
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None));
    }

    #[test]
    fn fields_are_written_plainly() {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .fmt_fields(PlainFields)
            .with_writer(move || writer.clone())
            .finish();
        let service: Option<&str> = Some("stripe");
        let none: Option<u32> = None;
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(host = %"api.stripe.com", ?service, ?none, n = 2, "refused");
            tracing::warn!(host = %"a\tb\u{1b}[0m\u{202e}", "Host disagrees");
        });
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert!(
            out.contains("refused host=api.stripe.com service=stripe n=2"),
            "{out}"
        );
        assert!(!out.contains("none"), "{out}");
        assert!(
            out.contains("Host disagrees host=a\\tb\\u{1b}[0m\\u{202e}"),
            "{out}"
        );
    }
}
