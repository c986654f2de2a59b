//! The text receipt, as `verisReceipt` prints it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::entry::Mode;
use crate::quote::{quoted, token};

use super::*;

/// `verified`, or the status with its reason: what the text receipt and
/// the TUI say of integrity.
pub fn integrity_text(i: &Integrity) -> String {
    let word = match i.status {
        IntegrityStatus::Verified => "verified",
        IntegrityStatus::Unverified => "unverified",
        IntegrityStatus::Failed => "failed",
    };
    match &i.reason {
        // A reason may carry what a ledger line said: kept on its line.
        Some(reason) if i.status != IntegrityStatus::Verified => {
            format!("{word} ({})", crate::quote::escaped(reason))
        }
        _ => word.to_string(),
    }
}

fn host_list(hosts: &BTreeMap<String, u64>) -> String {
    hosts
        .iter()
        .map(|(h, n)| format!("{} ({n})", quoted(h)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `name → ip:port (n)` per name and destination, `name (n)` where no
/// destination was recorded (and by name only for a receipt without
/// destinations).
fn destination_list(counts: &HostCounts) -> String {
    if counts.destinations.is_empty() {
        return host_list(&counts.hosts);
    }
    counts
        .destinations
        .iter()
        .map(|d| match &d.dst {
            Some(dst) => format!("{} → {} ({})", quoted(&d.host), token(dst), d.count),
            None => format!("{} ({})", quoted(&d.host), d.count),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// ` (cut after 1234 of 5000 bytes)`: what the client got of a response.
fn incomplete_text(i: &Incomplete) -> String {
    let what = match i.reason.as_str() {
        "client_gone" => "client left",
        _ => "cut",
    };
    match i.declared {
        Some(d) => format!(" ({what} after {} of {d} bytes)", i.bytes),
        None => format!(" ({what} after {} bytes)", i.bytes),
    }
}

/// A `service METHOD /path` key: words as tokens, the path quoted.
fn call_text(key: &str) -> String {
    let mut words = key.splitn(3, ' ');
    match (words.next(), words.next(), words.next()) {
        (Some(service), Some(method), Some(path)) => {
            format!("{} {} {}", token(service), token(method), quoted(path))
        }
        _ => quoted(key),
    }
}

/// The text receipt (DESIGN §8): title with the twin id, interception and
/// integrity, leaks, the count line, then per service its count and its
/// requests `METHOD /path -> status` oldest first (newest last), at most
/// [`TEXT_ENTRY_CAP`] then `… and N more`. Upstream errors, passthrough and
/// blocked hosts follow when there are any. Every recorded string is
/// shown through [`quoted`] or [`token`]: no line can start with, or
/// spell, the workload's text (DESIGN §7a.17).
pub fn render_text(r: &Receipt) -> String {
    let mut out = String::new();
    let twin = r
        .twin
        .as_deref()
        .map_or("unknown (no session line)".into(), token);
    let _ = write!(out, "Veris receipt — twin {twin}");
    match r.window.scope {
        Scope::Baseline => {
            let _ = write!(out, " (since seq {})", r.window.since_seq);
        }
        Scope::All if r.window.since_seq == 0 => out.push_str(" (whole ledger)"),
        _ => {}
    }
    out.push('\n');
    let strict = if r.mode == Some(Mode::Strict) {
        " (strict)"
    } else {
        ""
    };
    let interception = match r.interception {
        Some(i) => format!("{}{strict}", i.word()),
        None => "unknown (no session line)".to_string(),
    };
    let _ = writeln!(
        out,
        "  interception: {interception}   integrity: {}",
        integrity_text(&r.integrity)
    );
    let leaks = if r.leaks.is_empty() {
        "none".to_string()
    } else {
        let leaks: Vec<_> = r.leaks.iter().map(|l| crate::quote::escaped(l)).collect();
        leaks.join(", ")
    };
    let _ = writeln!(out, "  leaks: {leaks}");
    if !r.bundles.is_empty() {
        let _ = writeln!(
            out,
            "  bundles: {} CA file(s) that runtimes and SDKs ship held the veris bundle (listed under \"bundles\" in the JSON receipt); a bundle installed during the run is not covered (name it with --trust-file)",
            r.bundles.len()
        );
    }
    if let Some(key) = &r.seal_key {
        let _ = writeln!(out, "  seal key: {key}");
    }
    // A crash and the restart after it: what the earlier ledger held is in
    // no window of this file, so it is named where people read.
    for a in &r.set_aside {
        let held = a
            .requests
            .map_or(String::new(), |n| format!(", {n} request(s) in it"));
        let _ = writeln!(
            out,
            "  set aside at seq {}: an earlier ledger this proxy could not verify ({}{held}). Read it: veris receipt --all --ledger {}",
            a.before_seq, a.why, a.file
        );
    }
    if let Some(p) = &r.publishing {
        let _ = writeln!(
            out,
            "  publishing: {} at seq {}: {}. The local ledger is whole; the stream's copy of it is not",
            p.status, p.seq, p.reason
        );
    }
    out.push('\n');

    let total = r.total_requests();
    if total == 0 {
        let _ = writeln!(out, "{EMPTY_SENTENCE}");
    } else {
        let _ = writeln!(out, "{total} request(s) reached the twin:");
    }
    for (name, s) in &r.services {
        let incomplete = match s.incomplete {
            0 => String::new(),
            n => format!(", {n} answered incomplete"),
        };
        let _ = writeln!(
            out,
            "  {}: {} request(s){incomplete}",
            token(name),
            s.requests
        );
        for e in s.entries.iter().take(TEXT_ENTRY_CAP) {
            let gone = if e.client_gone { " (client gone)" } else { "" };
            let cut = e.incomplete.as_ref().map_or(String::new(), incomplete_text);
            let _ = writeln!(
                out,
                "    {} {} -> {}{gone}{cut}",
                token(&e.method),
                quoted(&e.path),
                e.status
            );
        }
        let shown = s.entries.len().min(TEXT_ENTRY_CAP) as u64;
        if s.requests > shown {
            let _ = writeln!(out, "    … and {} more", s.requests - shown);
        }
    }

    if !r.callbacks.is_empty() {
        out.push('\n');
        r.callbacks.render(&mut out, TEXT_ENTRY_CAP);
    }

    let mut extra = Vec::new();
    // A timeout, a body the client never finished or a session that ended
    // first means the twin may have executed the request; only a failure
    // to connect means it did not reach it.
    let group = |error: &str| match error {
        "veris_upstream_timeout" => 1,
        "veris_request_body_incomplete" => 2,
        "veris_session_ended" => 3,
        _ => 0,
    };
    for (n, what) in [
        (0, "upstream errors (did not reach the twin)"),
        (1, "upstream timeouts (the twin may have processed them)"),
        (
            2,
            "requests whose body the client never finished (the twin may have processed them)",
        ),
        (
            3,
            "requests unanswered when the session ended (the twin may have processed them)",
        ),
    ] {
        let list: Vec<_> = r
            .upstream_errors
            .iter()
            .filter(|e| group(&e.error) == n)
            .collect();
        if list.is_empty() {
            continue;
        }
        const SHOWN: usize = 5;
        let mut shown: Vec<String> = list
            .iter()
            .take(SHOWN)
            .map(|e| {
                let body = match (e.bytes_in, e.declared_in) {
                    (Some(b), Some(d)) => format!(" (body: {b} of {d} bytes sent)"),
                    (Some(b), None) => format!(" (body: {b} bytes sent)"),
                    _ => String::new(),
                };
                format!(
                    "{} {} {} -> {} {}{body}",
                    token(&e.service),
                    token(&e.method),
                    quoted(&e.path),
                    e.status,
                    token(&e.error)
                )
            })
            .collect();
        if list.len() > SHOWN {
            shown.push(format!("… and {} more", list.len() - SHOWN));
        }
        extra.push(format!("{what}: {} ({})", list.len(), shown.join("; ")));
    }
    if !r.dns_refused.is_empty() {
        let n = r.dns_refused.len() as u64;
        let count = if n >= crate::entry::DNS_REFUSED_LINES {
            format!("at least {n}")
        } else {
            n.to_string()
        };
        let shown: Vec<String> = r.dns_refused.iter().take(5).map(|h| quoted(h)).collect();
        extra.push(format!(
            "DNS: veris's stub refused {count} name(s), its table of names being full ({}{}): those lookups failed because of veris's DNS stub, not the code",
            shown.join(", "),
            if r.dns_refused.len() > 5 { ", …" } else { "" }
        ));
    }
    if !r.reserved_paths.is_empty() {
        extra.push(format!(
            "answered by the proxy, not vendor calls (reserved paths): {}",
            r.reserved_paths
                .iter()
                .map(|(call, n)| format!("{} ({n})", call_text(call)))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for f in &r.trust_failures {
        extra.push(format!(
            "trust failure: {}: {} refusal(s), {} completed: {}",
            quoted(&f.host),
            f.refusals,
            f.completed,
            f.detail
        ));
    }
    extra.extend(
        r.tls_abandoned
            .iter()
            .filter_map(super::tls::abandoned_text),
    );
    if !r.passthrough.hosts.is_empty() {
        extra.push(format!("passthrough: {}", destination_list(&r.passthrough)));
    }
    for u in &r.passthrough.unreached {
        extra.push(format!(
            "passthrough not reached: {} ({}): {}",
            quoted(&u.host),
            u.count,
            quoted(&u.error)
        ));
    }
    if !r.blocked.hosts.is_empty() {
        extra.push(format!("blocked: {}", destination_list(&r.blocked)));
    }
    if !extra.is_empty() {
        out.push('\n');
        for l in extra {
            out.push_str(&l);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::UpstreamErrorLine;
    use crate::entry::{Entry, Line};
    use crate::ledger::LedgerRead;

    fn upstream_error(seq: u64, error: &str, status: u16) -> Line {
        Line {
            v: 2,
            seq,
            ts: "2026-11-30T00:00:00.000Z".into(),
            entry: Entry::UpstreamError(UpstreamErrorLine {
                upstream: "http://twin/s/sbx/stripe/v1/charges".into(),
                status,
                error: error.into(),
                duration_ms: 1,
                bytes_in: (error == "veris_request_body_incomplete").then_some(5),
                declared_in: (error == "veris_request_body_incomplete").then_some(100),
                ..UpstreamErrorLine::test("stripe", "POST", "/v1/charges")
            }),
            prev: String::new(),
        }
    }

    #[test]
    fn a_timeout_is_never_said_to_have_missed_the_twin() {
        let read = LedgerRead {
            lines: vec![
                upstream_error(1, "veris_upstream_timeout", 504),
                upstream_error(2, "veris_upstream_unreachable", 502),
                upstream_error(3, "veris_request_body_incomplete", 400),
            ],
            head: (3, String::new()),
            ..LedgerRead::default()
        };
        let text = render_text(&super::super::build(&read, &Options::default()));
        assert!(
            text.contains("upstream timeouts (the twin may have processed them): 1 (stripe POST \"/v1/charges\" -> 504"),
            "{text}"
        );
        assert!(
            text.contains(
                "upstream errors (did not reach the twin): 1 (stripe POST \"/v1/charges\" -> 502"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "requests whose body the client never finished (the twin may have processed them): 1 (stripe POST \"/v1/charges\" -> 400 veris_request_body_incomplete (body: 5 of 100 bytes sent))"
            ),
            "{text}"
        );
    }
}
