//! How recorded text is shown in every text form (DESIGN §7a.17): the
//! receipt, the `FAIL:` lines, JUnit messages, the MCP tool's text and the
//! TUI. Hosts, paths, SNI, header values and DNS names are the workload's
//! words; printed as they are, a Host header such as
//! `a\tintegrity: verified   leaks: none` would read as a line of veris's
//! own, and an ESC sequence or a bidi override could recolour or reorder
//! the lines around it. [`quoted`] is the one escaping function: visible
//! quotes around the text, and every character that could break out of
//! them or hide itself written as an escape. Structured outputs (JSON)
//! keep the raw strings in their own fields and need none of this.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `s` in double quotes, with `\` and `"` escaped, `\t`, `\r`, `\n` as
/// such, and every other control character, bidi or format mark, line or
/// paragraph separator and zero-width character as `\u{…}`: the result is
/// one visible line that cannot end the quote early.
pub fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    escape_into(&mut out, s, true);
    out.push('"');
    out
}

/// `s` escaped as in [`quoted`] but without the quotes (and with `"` left
/// as is), for a sentence of the proxy's own that may carry recorded words
/// (an integrity reason, a check's detail): it stays on its line.
pub fn escaped(s: &str) -> Cow<'_, str> {
    if s.chars().all(|c| c != '\\' && !hidden(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    escape_into(&mut out, s, false);
    Cow::Owned(out)
}

fn escape_into(out: &mut String, s: &str, quotes: bool) {
    for c in s.chars() {
        match c {
            '"' if quotes => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            c if hidden(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// A recorded word that is normally a plain token (a service name, a
/// method, an `ip:port`, an alert name): bare when it is non-empty visible
/// ASCII without quotes or backslashes — it then has no space, so it cannot
/// spell a phrase of veris's own —, otherwise [`quoted`].
pub fn token(s: &str) -> Cow<'_, str> {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
    {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(quoted(s))
    }
}

/// Whether a character must be escaped to stay visible and in place:
/// controls (C0, DEL, C1), and the format characters that reorder, join or
/// hide text (Unicode category Cf, the line and paragraph separators).
pub fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{ad}'
                | '\u{600}'..='\u{605}'
                | '\u{61c}'
                | '\u{6dd}'
                | '\u{70f}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{206f}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
                | '\u{e0000}'..='\u{e007f}'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_text_stays_one_quoted_visible_line() {
        assert_eq!(quoted("api.stripe.com"), "\"api.stripe.com\"");
        assert_eq!(
            quoted("a:\tb\r\n\u{1b}[30;40m\u{202e}x\u{2066}\u{200b}\u{7f}\u{85}"),
            "\"a:\\tb\\r\\n\\u{1b}[30;40m\\u{202e}x\\u{2066}\\u{200b}\\u{7f}\\u{85}\""
        );
        assert_eq!(quoted(r#"say "hi" \ bye"#), r#""say \"hi\" \\ bye""#);
        assert_eq!(
            quoted("\u{61c}\u{200e}\u{200f}\u{feff}"),
            "\"\\u{61c}\\u{200e}\\u{200f}\\u{feff}\""
        );
        // What is left is printable: é and 中 stay as they are.
        assert_eq!(quoted("café/中"), "\"café/中\"");
    }

    #[test]
    fn a_token_is_bare_only_when_it_cannot_spell_a_phrase() {
        assert_eq!(token("stripe"), "stripe");
        assert_eq!(token("127.0.0.1:443"), "127.0.0.1:443");
        assert_eq!(token("POST"), "POST");
        assert_eq!(token(""), "\"\"");
        assert_eq!(token("integrity: verified"), "\"integrity: verified\"");
        assert_eq!(token("a\"b"), "\"a\\\"b\"");
        assert_eq!(token("é"), "\"é\"");
    }

    #[test]
    fn a_sentence_keeps_its_quotes_and_loses_its_breaks() {
        assert_eq!(escaped("plain `words` \"here\""), "plain `words` \"here\"");
        assert_eq!(escaped("a\nFAIL: b\u{1b}[0m"), "a\\nFAIL: b\\u{1b}[0m");
    }
}
