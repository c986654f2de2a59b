//! `veris man`: the manual page (roff), one page for every command.

use std::process::ExitCode;

/// Prints the manual page of `cli`.
pub fn man(cli: clap::Command) -> ExitCode {
    let mut out = Vec::new();
    match clap_mangen::Man::new(cli).render(&mut out) {
        Ok(()) => super::completions::print_bytes(
            one_page(&title_first(&String::from_utf8_lossy(&out))).as_bytes(),
        ),
        Err(e) => {
            eprintln!("veris: rendering the manual page: {e}");
            ExitCode::from(crate::util::EXIT_USAGE)
        }
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

/// The page without references to pages that do not exist: clap_mangen
/// names each subcommand as a page of its own (`veris\-run(1)`), and only
/// `veris(1)` is shipped. Each becomes the command and where its options are.
fn one_page(page: &str) -> String {
    let mut out = String::with_capacity(page.len());
    for line in page.split_inclusive('\n') {
        let bare = line.trim_end_matches('\n');
        match bare
            .strip_prefix("veris\\-")
            .and_then(|rest| rest.strip_suffix("(1)"))
        {
            Some(sub) if !sub.contains(' ') => {
                out.push_str(&format!(
                    "\\fBveris {sub}\\fR (options: \\fBveris {sub} \\-\\-help\\fR)\n"
                ));
            }
            _ => out.push_str(line),
        }
    }
    out
}
