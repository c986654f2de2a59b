//! Integrity: what the receipt's record can be trusted for, and against whom
//! (DESIGN §7a). The workload under test is the adversary: it can write
//! whatever its uid can, so a `verified` verdict needs a reference it could
//! not touch ([`Anchor`]): the live proxy's own chain head, or a seal key
//! the reader pinned. `ledger.pub` beside the file is only a hint.
//!
//! Checks, in order: `chain` (hash chain of the whole file), `tail` (a torn
//! last line), `recovered_tail` and `moved_aside` (what a restart set aside),
//! `tamper` (the proxy found its file replaced, cut or extended), `seals`
//! (every seal of the window by the anchor key, the window covered, the
//! session closed by its final seal), `custody` (could the workload have
//! read the seal key), and `canary` and `twin_cross_check` (run by a live
//! reader, or recorded by the proxy before its final seal).

use crate::entry::{Entry, Line, TornTail};
use crate::ledger::LedgerRead;
use crate::seal::{self, PublicKeys};

use super::*;

/// The detail of a check that needs the live proxy when there is none.
pub const PROXY_NOT_LIVE: &str = "proxy not live";

fn check(name: &str, status: CheckStatus, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        status,
        detail: detail.into(),
    }
}

/// The lines of the window `(since, until]`, as one slice of the read (the
/// file order is the seq order wherever the chain holds).
pub(super) fn window_lines<'a>(read: &'a LedgerRead, w: &Window) -> &'a [Line] {
    let start = read.lines.partition_point(|l| l.seq <= w.since_seq);
    let end = read.lines.partition_point(|l| l.seq <= w.until_seq);
    &read.lines[start..end.max(start)]
}

/// Every integrity check of a window and the verdict they add up to.
pub(super) fn integrity(read: &LedgerRead, options: &Options, w: &Window) -> Integrity {
    let lines = window_lines(read, w);
    let mut checks = vec![chain_check(read)];
    if let Some(TornTail { line, bytes }) = read.torn_tail {
        checks.push(check(
            "tail",
            CheckStatus::Unverified,
            format!("torn last line {line} ({bytes} bytes) not counted"),
        ));
    }
    let mut recovered = Vec::new();
    let mut moved = Vec::new();
    for l in lines {
        if let Entry::Session {
            recovered_torn_tail,
            moved_aside,
            ..
        } = &l.entry
        {
            if let Some(t) = recovered_torn_tail {
                recovered.push(format!(
                    "torn line {} ({} bytes) set aside at restart (seq {})",
                    t.line, t.bytes, l.seq
                ));
            }
            if let Some(m) = moved_aside {
                moved.push(format!(
                    "an earlier ledger the proxy could not verify ({}) was moved to {} (head seq {}, hash {}) before seq {}",
                    m.why, m.file, m.head_seq, m.head_hash, l.seq
                ));
            }
        }
    }
    if !recovered.is_empty() {
        checks.push(check(
            "recovered_tail",
            CheckStatus::Ok,
            recovered.join("; "),
        ));
    }
    if !moved.is_empty() {
        checks.push(check("moved_aside", CheckStatus::Ok, moved.join("; ")));
    }
    let mut tampered: Vec<String> = lines
        .iter()
        .filter_map(|l| match &l.entry {
            Entry::Tamper { what, detail } => Some(format!("{what}: {detail} (seq {})", l.seq)),
            _ => None,
        })
        .collect();
    if let Anchor::Live { seal, .. } = &options.anchor {
        if let Some(t) = &seal.tampered {
            if tampered.is_empty() {
                tampered.push(t.clone());
            }
        }
    }
    if !tampered.is_empty() {
        checks.push(check(
            "tamper",
            CheckStatus::Failed,
            format!(
                "the proxy found its ledger file changed behind its back: {}",
                tampered.join("; ")
            ),
        ));
    }
    checks.push(seals_check(read, lines, options, w));
    if !matches!(options.anchor, Anchor::Live { .. }) {
        if let Some(c) = custody_check(lines, read, w) {
            checks.push(c);
        }
    }
    for name in ["canary", "twin_cross_check"] {
        checks.push(network_check(name, lines, options, w));
    }
    verdict(checks)
}

fn verdict(checks: Vec<Check>) -> Integrity {
    if let Some(failed) = checks.iter().find(|c| c.status == CheckStatus::Failed) {
        return Integrity {
            status: IntegrityStatus::Failed,
            reason: Some(failed.detail.clone()),
            checks,
        };
    }
    let mut reason: Vec<&str> = Vec::new();
    for c in &checks {
        if matches!(
            c.status,
            CheckStatus::Unverified | CheckStatus::NotImplemented
        ) && !reason.contains(&c.detail.as_str())
        {
            reason.push(&c.detail);
        }
    }
    if reason.is_empty() {
        return Integrity {
            status: IntegrityStatus::Verified,
            reason: None,
            checks,
        };
    }
    let reason = reason.join("; ");
    Integrity {
        status: IntegrityStatus::Unverified,
        reason: Some(reason),
        checks,
    }
}

fn chain_check(read: &LedgerRead) -> Check {
    let head_seq = read.head.0;
    match read.first_problem() {
        Some(p) => check(
            "chain",
            CheckStatus::Failed,
            format!("chain broken at line {}: {}", p.line, p.what),
        ),
        None if head_seq == 0 => check("chain", CheckStatus::Ok, "chain empty"),
        None => check(
            "chain",
            CheckStatus::Ok,
            format!("chain ok through seq {head_seq}"),
        ),
    }
}

/// The hash of the line at `index` of the read: the next line's `prev`, or
/// the head hash for the last line. Only meaningful where the chain holds
/// (the chain check fails the receipt otherwise).
fn hash_at(read: &LedgerRead, index: usize) -> Option<&str> {
    match read.lines.get(index + 1) {
        Some(next) => Some(next.prev.as_str()),
        None if index + 1 == read.lines.len() => Some(read.head.1.as_str()),
        None => None,
    }
}

/// Every seal in the window must verify with the anchor's key, and the
/// window must be covered: up to the live proxy's fresh seal (whose line in
/// the file must be byte-for-byte the one the proxy wrote), or, offline, up
/// to each session's final (`shutdown`) seal.
fn seals_check(read: &LedgerRead, lines: &[Line], options: &Options, w: &Window) -> Check {
    let name = "seals";
    let (keys, anchored, whose) = match &options.anchor {
        Anchor::Live { seal, public_key } => match PublicKeys::from_hex(public_key) {
            Some(k) if k.key_id == seal.key_id => (PublicKeys { keys: vec![k] }, true, "the live proxy's key"),
            _ => {
                return check(
                    name,
                    CheckStatus::Failed,
                    "the live proxy's public key does not match the key of its fresh seal",
                )
            }
        },
        Anchor::Pinned(keys) => (keys.clone(), true, "the pinned key"),
        Anchor::None => (
            options.hint_keys.clone().unwrap_or_default(),
            false,
            "ledger.pub",
        ),
    };
    let has_seals = lines.iter().any(|l| matches!(l.entry, Entry::Seal { .. }));
    if keys.is_empty() {
        return match &options.anchor {
            Anchor::Pinned(_) => check(
                name,
                CheckStatus::Failed,
                "no session of this ledger names the pinned key: it is not the ledger that key sealed",
            ),
            _ if !has_seals => check(name, CheckStatus::Unverified, "ledger has no seals"),
            _ => check(
                name,
                CheckStatus::Unverified,
                "no public key to check the seals with. Next: pin the seal key the run printed (--key)",
            ),
        };
    }
    let report = seal::verify_lines(lines, &keys);
    if let Some((seq, fault)) = report.faults.first() {
        let detail = match fault {
            seal::SealFault::UnknownKey => format!(
                "seal at seq {seq} is signed by a key other than {whose}: the ledger was re-sealed"
            ),
            _ => format!(
                "seal at seq {seq} {fault}: the ledger was altered at or before seq {}",
                seq.saturating_sub(1)
            ),
        };
        return check(name, CheckStatus::Failed, detail);
    }
    if let Anchor::Live { seal, .. } = &options.anchor {
        let index = read.lines.partition_point(|l| l.seq < seal.seq);
        let matches = read.lines.get(index).is_some_and(|l| {
            l.seq == seal.seq
                && l.prev == seal.head
                && matches!(&l.entry, Entry::Seal { signature, key_id, .. }
                    if *signature == seal.signature && *key_id == seal.key_id)
                && (seal.line_hash.is_empty() || hash_at(read, index) == Some(seal.line_hash.as_str()))
        });
        if !matches {
            return check(
                name,
                CheckStatus::Failed,
                format!(
                    "the ledger file does not hold the seal the live proxy wrote at seq {}: the file was cut, replaced or rewritten",
                    seal.seq
                ),
            );
        }
        return check(
            name,
            CheckStatus::Ok,
            format!(
                "{} seal(s) valid; the file matches the live proxy's chain head at seq {}",
                report.valid, seal.seq
            ),
        );
    }
    let Some(last) = report.last_valid else {
        return check(name, CheckStatus::Unverified, "no seal in the window");
    };
    if last < w.until_seq {
        return check(
            name,
            CheckStatus::Unverified,
            format!(
                "{} line(s) after the last seal (seq {last}) are not covered by any seal",
                w.until_seq - last
            ),
        );
    }
    if let Some(open) = unclosed_session(lines) {
        return check(
            name,
            CheckStatus::Unverified,
            format!("no final seal: the session at seq {open} crashed or its tail was cut"),
        );
    }
    if !anchored {
        return check(
            name,
            CheckStatus::Unverified,
            "the seals match ledger.pub, which the workload could have written. Next: pin the seal key (--key) or read while the proxy is live",
        );
    }
    check(
        name,
        CheckStatus::Ok,
        format!("{} seal(s) by {whose}, through the final seal at seq {last}", report.valid),
    )
}

/// The seq of a session in `lines` that does not end with its final seal
/// (a `shutdown` seal as its last line before the next session).
fn unclosed_session(lines: &[Line]) -> Option<u64> {
    let mut open: Option<u64> = None;
    let mut last_was_final = false;
    for l in lines {
        match &l.entry {
            Entry::Session { .. } => {
                if let Some(s) = open.filter(|_| !last_was_final) {
                    return Some(s);
                }
                open = Some(l.seq);
                last_was_final = false;
            }
            Entry::Seal { reason, .. } => last_was_final = reason == "shutdown",
            _ => last_was_final = false,
        }
    }
    // A window that starts mid-session (a baseline) is judged by its end.
    match open {
        Some(s) if !last_was_final => Some(s),
        None if !last_was_final && !lines.is_empty() => lines.first().map(|l| l.seq),
        _ => None,
    }
}

/// Offline, a key on disk is only as private as the uid that can read it: a
/// workload sharing the proxy's uid could have re-signed everything.
fn custody_check(lines: &[Line], read: &LedgerRead, w: &Window) -> Option<Check> {
    let session = lines
        .iter()
        .rev()
        .chain(read.lines.iter().rev().filter(|l| l.seq <= w.since_seq))
        .find(|l| matches!(l.entry, Entry::Session { .. }))?;
    let Entry::Session {
        key_storage,
        proxy_uid,
        workload_uid,
        tier,
        ..
    } = &session.entry
    else {
        return None;
    };
    if key_storage.as_deref() == Some("memory") {
        return None;
    }
    let detail = match (proxy_uid, workload_uid) {
        (Some(p), Some(wl)) if p == wl => "workload shares the proxy uid",
        (Some(_), Some(_)) => return None,
        // The redirect exempts the proxy uid alone: a workload caught by it
        // runs as another uid.
        _ if *tier == ListenerTier::Transparent && key_storage.is_some() => return None,
        _ => "workload may share the proxy uid",
    };
    Some(check(
        "custody",
        CheckStatus::Unverified,
        format!("{detail} (it could read seal.key). Next: read the receipt while the proxy is live, or run the workload as another uid (--workload-uid)"),
    ))
}

/// The canary or twin cross-check: run by a live reader, else as the proxy
/// recorded it before sealing — trusted only when the seals are anchored.
fn network_check(name: &str, lines: &[Line], options: &Options, w: &Window) -> Check {
    if let Some(c) = options.external_checks.iter().find(|c| c.name == name) {
        return c.clone();
    }
    let recorded = lines.iter().rev().find_map(|l| match &l.entry {
        Entry::Check {
            name: n,
            status,
            detail,
            since_seq,
            ..
        } if n == name && *since_seq <= w.since_seq => Some((status, detail, l.seq)),
        _ => None,
    });
    match recorded {
        Some((status, detail, seq)) if !matches!(options.anchor, Anchor::None) => {
            let status = match status.as_str() {
                "ok" => CheckStatus::Ok,
                "failed" => CheckStatus::Failed,
                _ => CheckStatus::Unverified,
            };
            check(name, status, format!("{detail} (recorded by the proxy at seq {seq})"))
        }
        _ if options.proxy_live => check(
            name,
            CheckStatus::Unverified,
            format!("{} not run", name.replace('_', " ")),
        ),
        _ => check(name, CheckStatus::Unverified, PROXY_NOT_LIVE),
    }
}
