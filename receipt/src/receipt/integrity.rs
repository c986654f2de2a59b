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
//! reader, or recorded by the proxy before its final seal). A gateway
//! sandbox's `canary` is only ever a probe from inside the sandbox that the
//! gateway recorded in the sandbox's window ([`NO_SANDBOX_PROBE`] without
//! one).

use crate::entry::{CheckLine, SessionLine};
use crate::entry::{Entry, Line, TornTail};
use crate::ledger::{LedgerRead, SealInfo};
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

/// How many names of other recorded checks a session keeps.
const MAX_OTHER_CHECKS: usize = 8;

/// A recorded `check` line: its status, detail and seq.
type Recorded = (String, String, u64);

/// One session's part of the window (or the lines before the first
/// session line of a window that starts mid-session).
#[derive(Debug, Default)]
struct Segment {
    /// Seq of its first line, and whether that line is a session line.
    first: Option<(u64, bool)>,
    /// The newest recorded `canary` and `twin_cross_check` lines.
    canary: Option<Recorded>,
    twin: Option<Recorded>,
    /// A gateway sandbox's session: its canary is a probe from inside the
    /// sandbox, recorded by the gateway ([`gateway_canary`]).
    gateway: bool,
    /// The newest recorded `canary` line with status `ok`.
    canary_ok: Option<Recorded>,
    /// Other checks the proxy recorded (`veris run`'s `descendants`), the
    /// newest per name; a few names at most.
    other: Vec<(String, Recorded)>,
}

/// What the integrity checks need from a window, gathered a line at a time
/// ([`Evidence::line`]); its size depends on the number of sessions and
/// findings, not on the number of lines.
#[derive(Debug, Default)]
pub(super) struct Evidence {
    recovered: Vec<String>,
    moved: Vec<String>,
    /// The same, for the receipt's `set_aside`.
    pub(super) set_aside: Vec<SetAside>,
    tampered: Vec<String>,
    redirects: Vec<String>,
    has_seals: bool,
    seals: seal::SealReport,
    /// `unclosed_session` state: the open session, whether the last line
    /// was its final seal, the first seq of the window, the first session
    /// found open when the next one began.
    open: Option<u64>,
    last_was_final: bool,
    first_seq: Option<u64>,
    unclosed: Option<u64>,
    segments: Vec<Segment>,
    /// The first session line of the window whose key custody fails.
    custody: Option<Check>,
    /// The key the current session's line names (none before the first
    /// session line of the window, or in a version 1 line).
    session_key: PublicKeys,
    /// Whether the current session is a gateway sandbox's.
    gateway: bool,
    /// The first session of the window sealed by its own key where the
    /// anchor is another: `(session seq, key_id)`.
    unpinned: Option<(u64, String)>,
}

/// The seal keys a window's seals are checked with, decided by the anchor,
/// and what a session's custody of its key is judged by.
pub(super) struct Keys {
    keys: Result<PublicKeys, &'static str>,
    anchored: bool,
    whose: &'static str,
    custody: Custody,
}

/// What could have signed in the proxy's place, by the anchor (DESIGN
/// §7a.13: never a session line's own word that its key was safe).
#[derive(Debug, Clone)]
enum Custody {
    /// Nothing vouched for: the seals cannot lift the verdict anyway.
    Unanchored,
    /// The proxy's own process judged its session.
    InProcess,
    /// A live proxy reached through state-dir files.
    StateDir,
    /// A live gateway reached through its state dir, named so by the reader.
    Gateway,
    /// A pinned key, and the private key file it sat in, if any.
    Pin(Option<String>),
}

impl Keys {
    pub(super) fn of(options: &Options) -> Keys {
        match &options.anchor {
            Anchor::Live {
                seal,
                public_key,
                channel,
            } => Keys {
                keys: match PublicKeys::from_hex(public_key) {
                    Some(k) if k.key_id == seal.key_id => Ok(PublicKeys { keys: vec![k] }),
                    _ => {
                        Err("the live proxy's public key does not match the key of its fresh seal")
                    }
                },
                anchored: true,
                whose: "the live proxy's key",
                custody: match channel {
                    LiveChannel::InProcess => Custody::InProcess,
                    LiveChannel::StateDir => Custody::StateDir,
                    LiveChannel::Gateway => Custody::Gateway,
                },
            },
            Anchor::Pinned(keys) => Keys {
                keys: Ok(keys.clone()),
                anchored: true,
                whose: "the pinned key",
                custody: Custody::Pin(options.pinned_key_file.clone()),
            },
            Anchor::None => Keys {
                keys: Ok(options.hint_keys.clone().unwrap_or_default()),
                anchored: false,
                whose: "ledger.pub",
                custody: Custody::Unanchored,
            },
        }
    }
}

impl Evidence {
    /// The key a session line names seals the lines that follow it.
    pub(super) fn enter_session(&mut self, l: &Line) {
        if let Entry::Session(SessionLine {
            public_key, tier, ..
        }) = &l.entry
        {
            self.gateway = *tier == ListenerTier::Gateway;
            self.session_key = PublicKeys {
                keys: public_key
                    .as_deref()
                    .and_then(PublicKeys::from_hex)
                    .into_iter()
                    .collect(),
            };
        }
    }

    /// One line of the window, in file order.
    pub(super) fn line(&mut self, l: &Line, keys: &Keys) {
        self.first_seq.get_or_insert(l.seq);
        let is_session = matches!(l.entry, Entry::Session(_));
        if is_session {
            self.enter_session(l);
        }
        let starts_segment = is_session || self.segments.is_empty();
        if starts_segment && self.segments.last().is_none_or(|s| s.first.is_some()) {
            self.segments.push(Segment::default());
        }
        if let Some(seg) = self.segments.last_mut() {
            if seg.first.is_none() {
                seg.first = Some((l.seq, is_session));
                // A window that starts mid-session is in the session
                // before it (`enter_session` took its line).
                seg.gateway = self.gateway;
            }
        }
        match &l.entry {
            Entry::Session(SessionLine {
                recovered_torn_tail,
                moved_aside,
                ..
            }) => {
                if let Some(t) = recovered_torn_tail {
                    self.recovered.push(format!(
                        "torn line {} ({} bytes) set aside at restart (seq {})",
                        t.line, t.bytes, l.seq
                    ));
                }
                if let Some(m) = moved_aside {
                    let requests = m
                        .requests
                        .map_or(String::new(), |n| format!(", {n} request(s)"));
                    self.moved.push(format!(
                        "an earlier ledger the proxy could not verify ({}) was moved to {} (head seq {}, hash {}{requests}) before seq {}",
                        m.why, m.file, m.head_seq, m.head_hash, l.seq
                    ));
                    self.set_aside.push(SetAside {
                        file: m.file.clone(),
                        requests: m.requests,
                        why: m.why.clone(),
                        before_seq: l.seq,
                    });
                }
                if self.custody.is_none() {
                    self.custody = custody_check(l, &keys.custody);
                }
                if let Some(s) = self.open.filter(|_| !self.last_was_final) {
                    self.unclosed.get_or_insert(s);
                }
                self.open = Some(l.seq);
                self.last_was_final = false;
            }
            Entry::Tamper { what, detail } => {
                self.tampered
                    .push(format!("{what}: {detail} (seq {})", l.seq));
            }
            Entry::RedirectChange { detail } => {
                self.redirects.push(format!("seq {}: {detail}", l.seq));
            }
            Entry::Check(CheckLine {
                name,
                status,
                detail,
                ..
            }) => {
                if let Some(seg) = self.segments.last_mut() {
                    let r = Some((status.clone(), detail.clone(), l.seq));
                    match name.as_str() {
                        "canary" => {
                            if status == "ok" {
                                seg.canary_ok.clone_from(&r);
                            }
                            seg.canary = r;
                        }
                        "twin_cross_check" => seg.twin = r,
                        // Not about this ledger: the receipt's `publishing`.
                        super::PUBLISH_CHECK => {}
                        _ => {
                            if let Some(r) = r {
                                let at = seg.other.iter().position(|(n, _)| n == name);
                                match at {
                                    Some(i) => seg.other[i].1 = r,
                                    None if seg.other.len() < MAX_OTHER_CHECKS => {
                                        seg.other.push((name.clone(), r))
                                    }
                                    None => {}
                                }
                            }
                        }
                    }
                }
            }
            _ => {}
        }
        match &l.entry {
            Entry::Seal { reason, key_id, .. } => {
                self.has_seals = true;
                if let Ok(k) = &keys.keys {
                    // A session sealed by the key its own line names, where
                    // the anchor is another key: an earlier session of the
                    // file (each session has a key of its own), or one the
                    // workload appended. Its seals can show breaks, never
                    // vouch: the session stays unverified until pinned.
                    let own = self.session_key.find(key_id).is_some();
                    if keys.anchored && own && k.find(key_id).is_none() {
                        self.seals.check(l, &self.session_key);
                        if self.unpinned.is_none() {
                            let start = self.open.unwrap_or(l.seq);
                            self.unpinned = Some((start, key_id.clone()));
                        }
                    } else {
                        self.seals.check(l, k);
                    }
                }
                self.last_was_final = crate::seal::is_final(reason);
            }
            Entry::Session(_) => {}
            _ => self.last_was_final = false,
        }
    }

    /// The seq of a session of the window that does not end with its final
    /// seal (a `shutdown` seal as its last line before the next session).
    fn unclosed_session(&self) -> Option<u64> {
        if self.unclosed.is_some() {
            return self.unclosed;
        }
        // A window that starts mid-session (a baseline) is judged by its end.
        match self.open {
            Some(s) if !self.last_was_final => Some(s),
            None if !self.last_was_final => self.first_seq,
            _ => None,
        }
    }
}

/// What the whole file (not only the window) tells the integrity checks.
pub(super) struct FileFacts<'a> {
    /// The chain problems, torn tail and head of the read (its `lines` unused).
    pub read: &'a LedgerRead,
    /// The newest session line at or before the window end.
    pub session: Option<&'a Line>,
    /// The newest session line before the window's first line: the session
    /// the window starts in when it does not start with a session line.
    pub session_before: Option<&'a Line>,
    /// For a live anchor: whether the file's line at the fresh seal's seq
    /// is that seal, byte for byte.
    pub live_seal_found: bool,
}

/// Whether `line` (with hash `hash`) is the seal the live proxy returned.
pub(super) fn is_live_seal(seal: &SealInfo, line: &Line, hash: &str) -> bool {
    line.seq == seal.seq
        && line.prev == seal.head
        && matches!(&line.entry, Entry::Seal { signature, key_id, .. }
            if *signature == seal.signature && *key_id == seal.key_id)
        && (seal.line_hash.is_empty() || hash == seal.line_hash)
}

/// Every integrity check of a window and the verdict they add up to.
pub(super) fn integrity(
    ev: Evidence,
    keys: &Keys,
    facts: &FileFacts<'_>,
    options: &Options,
    w: &Window,
) -> Integrity {
    let read = facts.read;
    let mut checks = vec![chain_check(read)];
    if let Some(TornTail { line, bytes }) = read.torn_tail {
        checks.push(check(
            "tail",
            CheckStatus::Unverified,
            format!("torn last line {line} ({bytes} bytes) not counted"),
        ));
    }
    if !ev.recovered.is_empty() {
        checks.push(check(
            "recovered_tail",
            CheckStatus::Ok,
            ev.recovered.join("; "),
        ));
    }
    if !ev.moved.is_empty() {
        checks.push(check("moved_aside", CheckStatus::Ok, ev.moved.join("; ")));
    }
    let mut tampered = ev.tampered.clone();
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
    if !ev.redirects.is_empty() {
        checks.push(check(
            "redirect",
            CheckStatus::Failed,
            format!(
                "the kernel redirect changed while the proxy ran, so traffic may have escaped it ({})",
                ev.redirects.join("; ")
            ),
        ));
    }
    let seals = seals_check(&ev, keys, facts, options, w);
    // Custody only matters once the seals themselves hold: it is the last
    // reason a verdict could still be forged. It holds for a live read too:
    // a workload that can read seal.key and admin.token can also rewrite
    // admin.addr and answer a reader as "the live proxy" itself.
    let seals_ok = seals.status == CheckStatus::Ok;
    checks.push(seals);
    if seals_ok {
        if let Some(c) = window_custody(&ev, facts, keys) {
            checks.push(c);
        }
    }
    const NETWORK: [&str; 2] = ["canary", "twin_cross_check"];
    for name in NETWORK {
        checks.push(network_check(name, &ev.segments, options));
    }
    // Any other check the reader ran (a live reader's `pinned_key`) counts
    // as it is: a check handed in and then ignored would let a proxy that
    // seals with another key be reported verified.
    checks.extend(
        options
            .external_checks
            .iter()
            .filter(|c| !NETWORK.contains(&c.name.as_str()))
            .cloned(),
    );
    // Other checks the proxy recorded under its seals (`descendants`: a
    // process of a `veris run` it could not end) count offline as they did
    // in the run's own receipt, unless the reader handed the same in.
    if !matches!(options.anchor, Anchor::None) {
        for seg in &ev.segments {
            for (name, (status, detail, seq)) in &seg.other {
                if options.external_checks.iter().any(|c| &c.name == name) {
                    continue;
                }
                let status = match status.as_str() {
                    "ok" => CheckStatus::Ok,
                    "failed" => CheckStatus::Failed,
                    _ => CheckStatus::Unverified,
                };
                checks.push(check(
                    name,
                    status,
                    format!("{detail} (recorded by the proxy at seq {seq})"),
                ));
            }
        }
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

/// Every seal in the window must verify with the anchor's key, and the
/// window must be covered: up to the live proxy's fresh seal (whose line in
/// the file must be byte-for-byte the one the proxy wrote), or, offline, up
/// to each session's final (`shutdown`) seal.
fn seals_check(
    ev: &Evidence,
    keys: &Keys,
    facts: &FileFacts<'_>,
    options: &Options,
    w: &Window,
) -> Check {
    let name = "seals";
    let (anchored, whose) = (keys.anchored, keys.whose);
    if let Some(why) = &options.seal_failure {
        return check(
            name,
            CheckStatus::Unverified,
            format!(
                "the final seal could not be written ({why}): veris could not write its ledger, so the end of this session is sealed by nothing. Next: free space where the ledger lives (or fix the write error) and run again"
            ),
        );
    }
    let key_set = match &keys.keys {
        Ok(k) => k,
        Err(why) => return check(name, CheckStatus::Failed, *why),
    };
    if key_set.is_empty() {
        return match &options.anchor {
            Anchor::Pinned(_) => check(
                name,
                CheckStatus::Failed,
                "no session of this ledger names the pinned key: it is not the ledger that key sealed",
            ),
            _ if !ev.has_seals => check(name, CheckStatus::Unverified, "ledger has no seals"),
            _ => check(
                name,
                CheckStatus::Unverified,
                "no public key to check the seals with. Next: pin the seal key the run printed (--key)",
            ),
        };
    }
    let report = &ev.seals;
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
        if !facts.live_seal_found {
            return check(
                name,
                CheckStatus::Failed,
                format!(
                    "the ledger file does not hold the seal the live proxy wrote at seq {}: the file was cut, replaced or rewritten",
                    seal.seq
                ),
            );
        }
    }
    if let Some((seq, key)) = &ev.unpinned {
        return check(
            name,
            CheckStatus::Unverified,
            format!(
                "the session at seq {seq} is sealed by its own key {key}, not {whose}: every session seals with a key of its own. Next: pin that session's key too (--key FILE, one fingerprint a line)"
            ),
        );
    }
    if let Anchor::Live { seal, .. } = &options.anchor {
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
    if let Some(open) = ev.unclosed_session() {
        return check(
            name,
            CheckStatus::Unverified,
            format!("no final seal: the session at seq {open} crashed, its tail was cut, or its final seal could not be written (a full disk: the proxy's log says so)"),
        );
    }
    if !anchored {
        return check(
            name,
            CheckStatus::Unverified,
            "the seals match ledger.pub, which the workload could have written. Next: pin the seal key (--key) or read while the proxy is live",
        );
    }
    let unsigned = if report.unsigned_reasons {
        " (seals before ledger v5 leave their reason unsigned: that the session closed cleanly is the file's word)"
    } else {
        ""
    };
    check(
        name,
        CheckStatus::Ok,
        format!(
            "{} seal(s) by {whose}, through the final seal at seq {last}{unsigned}",
            report.valid
        ),
    )
}

/// Could something other than the proxy have signed, or answered, as the
/// proxy? Never decided by what a session line says of itself (DESIGN
/// §7a.13): its `key_storage: file` is believed (it says less), its
/// `memory` proves nothing; custody comes from the anchor: a pin of a key
/// veris printed (which only ever lived in its memory), not one read off a
/// key file; the proxy's own process; or a live proxy reached through
/// state-dir files, which a workload of the proxy's uid could rewrite to
/// answer in its place. Every session the window covers counts, the worst
/// deciding: a window that spans a restart is only as safe as its least
/// guarded session.
fn window_custody(ev: &Evidence, facts: &FileFacts<'_>, keys: &Keys) -> Option<Check> {
    if let Some(c) = &ev.custody {
        return Some(c.clone());
    }
    let starts_with_session = ev
        .segments
        .first()
        .and_then(|s| s.first)
        .is_some_and(|(_, s)| s);
    match facts.session_before.filter(|_| !starts_with_session) {
        Some(before) => custody_check(before, &keys.custody),
        // No session line names the key's custody at all.
        None if facts.session.is_none() => Some(check(
            "custody",
            CheckStatus::Unverified,
            "no session line says where the seal key was kept or which uid the workload ran as",
        )),
        None => None,
    }
}

/// A gateway's session: its line names the gateway tier and coverage.
fn walled_off_gateway(session: &Line) -> bool {
    matches!(&session.entry, Entry::Session(SessionLine { tier, coverage, .. })
        if *tier == ListenerTier::Gateway
            && coverage.as_ref().and_then(|c| c.isolation.as_deref()) == Some("gateway"))
}

fn custody_check(session: &Line, custody: &Custody) -> Option<Check> {
    let Entry::Session(SessionLine {
        key_storage,
        proxy_uid,
        workload_uid,
        coverage,
        ..
    }) = &session.entry
    else {
        return None;
    };
    let unverified = |detail: String| Some(check("custody", CheckStatus::Unverified, detail));
    if key_storage.as_deref() != Some("memory") {
        return unverified(format!(
            "the session at seq {} kept its seal key in a file (seal.key, veris before ledger v5), which a workload of the proxy's uid could read and re-sign with. Next: verify a session of a current veris, whose keys never touch disk",
            session.seq
        ));
    }
    // A root workload in the proxy's own namespaces holds CAP_SYS_PTRACE:
    // it can read (and write) the proxy's memory through /proc/PID/mem,
    // seal key included, non-dumpable or not. An isolated child holds no
    // capability, and Landlock keeps a confined one from tracing anything
    // outside its domain.
    let walled = coverage
        .as_ref()
        .and_then(|c| c.isolation.as_deref())
        .is_some_and(|i| i == "netns" || i == "landlock");
    if *workload_uid == Some(0) && !walled && !matches!(custody, Custody::Unanchored) {
        return unverified(
            "the workload ran as root in the proxy's own namespaces, where it can read the proxy's memory (its seal key) through /proc or ptrace. Next: run the command as another user, or let veris isolate it (`veris run` without --tier explicit)".into(),
        );
    }
    match custody {
        Custody::Unanchored | Custody::InProcess | Custody::Pin(None) => None,
        Custody::Pin(Some(file)) => unverified(format!(
            "the pinned key sits in the private key file {file}: whoever could read it could have re-signed the ledger. Next: pin the fingerprint veris printed for the session (its `seal key`)"
        )),
        // The reader named the state dir a gateway's, and the session is a
        // gateway's: its workload runs in a sandbox elsewhere, which cannot
        // write the gateway's files to answer in its place.
        Custody::Gateway if walled_off_gateway(session) => None,
        Custody::StateDir | Custody::Gateway => {
            // Only a uid the proxy was told (`--workload-uid`) counts: the
            // redirect exempting the proxy's uid does not show that the
            // workload runs as another (one started as the proxy's uid is
            // simply not redirected).
            let detail = match (proxy_uid, workload_uid) {
                (_, Some(0)) => "workload runs as root",
                (Some(p), Some(wl)) if p == wl => "workload shares the proxy uid",
                (Some(_), Some(_)) => return None,
                _ => "workload may share the proxy uid",
            };
            unverified(format!(
                "{detail}, which could stand in for the live proxy (admin.addr and admin.token are files of its uid). Next: once the session has ended, read it with the seal key `veris serve` logged at its start (--key), or run the workload as another uid and name it with `serve --workload-uid`"
            ))
        }
    }
}

/// The canary or twin cross-check, per session of the window: for the
/// latest session, the result a live reader ran (`external_checks`), else
/// the one the proxy recorded before its final seal; for earlier sessions
/// (whose proxy and twin are gone), the recorded one. Recorded results count
/// only when the seals are anchored. The worst session decides.
fn network_check(name: &str, segments: &[Segment], options: &Options) -> Check {
    let anchored = !matches!(options.anchor, Anchor::None);
    let empty = [Segment::default()];
    let segments = if segments.is_empty() {
        &empty[..]
    } else {
        segments
    };
    let last = segments.len() - 1;
    let mut results = Vec::new();
    for (i, segment) in segments.iter().enumerate() {
        let external = options
            .external_checks
            .iter()
            .find(|c| c.name == name)
            .filter(|_| i == last);
        let what = match segment.first {
            Some((seq, true)) => format!("the session at seq {seq}"),
            Some((seq, false)) => format!("the lines from seq {seq}"),
            None => "an empty window".into(),
        };
        if name == "canary" && segment.gateway {
            let what = (i < last).then_some(what.as_str());
            results.push(gateway_canary(segment, external, anchored, what));
            continue;
        }
        if let Some(c) = external {
            results.push(c.clone());
            continue;
        }
        let recorded = match name {
            "canary" => segment.canary.as_ref(),
            _ => segment.twin.as_ref(),
        };
        results.push(match recorded {
            Some((status, detail, seq)) if anchored => {
                let status = match status.as_str() {
                    "ok" => CheckStatus::Ok,
                    "failed" => CheckStatus::Failed,
                    _ => CheckStatus::Unverified,
                };
                check(
                    name,
                    status,
                    format!("{detail} (recorded by the proxy at seq {seq})"),
                )
            }
            _ if i < last => check(
                name,
                CheckStatus::Unverified,
                format!("no recorded {} for {what}", name.replace('_', " ")),
            ),
            _ if options.proxy_live => check(
                name,
                CheckStatus::Unverified,
                format!("{} not run", name.replace('_', " ")),
            ),
            _ => check(name, CheckStatus::Unverified, PROXY_NOT_LIVE),
        });
    }
    // A failure anywhere; else the latest session's own doubt; else the
    // first earlier one.
    let worst = results
        .iter()
        .position(|c| c.status == CheckStatus::Failed)
        .or_else(|| (results[last].status != CheckStatus::Ok).then_some(last))
        .or_else(|| results.iter().position(|c| c.status != CheckStatus::Ok))
        .unwrap_or(last);
    let mut c = results.swap_remove(worst);
    if segments.len() > 1 && c.status == CheckStatus::Ok {
        c.detail = format!("{} sessions: {}", segments.len(), c.detail);
    }
    c
}

/// Why a gateway sandbox's window without a probe from inside it is not
/// verified.
pub const NO_SANDBOX_PROBE: &str = "no canary probe from the sandbox";

/// How to probe a sandbox's canary, as the receipt tells its reader (often
/// an agent, which may run it). A constant: nothing of the ledger, which
/// the workload's traffic fills, can reach it. Both commands work with no
/// DNS in the sandbox: `veris check --gateway` and the curl line dial the
/// TEST-NET probe address (`veris_proxy::canary::DEFAULT_PROBE_ADDR`) with
/// the canary's SNI, which the gateway routes by (a platform's redirect
/// tunnels the address; a proxy setting sends the name instead); the
/// gateway answers it itself, dialing nothing. The proxy crate's tests
/// check it against the canary constants.
pub const SANDBOX_PROBE_HINT: &str = "Next: probe it from inside the sandbox: `veris check --gateway --expect-canary CANARY` (CANARY: the sandbox's `canary` from `veris gateway add-sandbox --json`), or `curl --resolve canary.veris.internal:443:203.0.113.1 https://canary.veris.internal/__veris/canary` (trusting the gateway's CA, `veris gateway ca`)";

/// The canary of a gateway sandbox's session. Only the gateway writes a
/// `canary` line into a sandbox's ledger, and only when a probe that came
/// through the platform's tunnel with that sandbox's credential reached its
/// canary host: that line, under an anchored seal, is the one proof that
/// the sandbox's egress goes through the gateway. Without it, a sandbox
/// whose traffic bypasses the gateway reads the same as one that made no
/// calls. A live reader's own probe (from the reader's host, not the
/// sandbox) cannot stand in for it; it can only fail the window.
/// `earlier` names the session when it is not the window's latest.
fn gateway_canary(
    segment: &Segment,
    external: Option<&Check>,
    anchored: bool,
    earlier: Option<&str>,
) -> Check {
    let name = "canary";
    if let Some(c) = external.filter(|c| c.status == CheckStatus::Failed) {
        return c.clone();
    }
    let recorded =
        |detail: &str, seq: u64| format!("{detail} (recorded by the gateway at seq {seq})");
    match (&segment.canary, &segment.canary_ok) {
        (Some((status, detail, seq)), _) if anchored && status == "failed" => {
            check(name, CheckStatus::Failed, recorded(detail, *seq))
        }
        (_, Some((_, detail, seq))) if anchored => {
            check(name, CheckStatus::Ok, recorded(detail, *seq))
        }
        (_, Some((_, _, seq))) => check(
            name,
            CheckStatus::Unverified,
            format!(
                "the sandbox's canary probe recorded at seq {seq} counts only under seals of a pinned key or the live gateway"
            ),
        ),
        (_, None) => check(
            name,
            CheckStatus::Unverified,
            format!(
                "{NO_SANDBOX_PROBE}{}: the gateway cannot tell a sandbox whose egress bypasses it from one that made no calls. {SANDBOX_PROBE_HINT}",
                earlier.map_or(String::new(), |w| format!(" in {w}"))
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    //! The verdict rules against a workload that edits the file: each attack
    //! is done to real ledger bytes written by [`Ledger`], then read back.
    use super::*;
    use crate::entry::RequestLine;
    use crate::ledger::{read, read_bytes, Ledger, SealInfo};
    use crate::receipt::build;
    use crate::seal::{Pin, Sealer};
    use std::path::PathBuf;

    struct Dir(PathBuf);

    impl Dir {
        fn new() -> Dir {
            use std::sync::atomic::{AtomicU32, Ordering};
            static N: AtomicU32 = AtomicU32::new(0);
            let d = std::env::temp_dir().join(format!(
                "veris-integrity-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            ));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Dir(d)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn session(sealer: &Sealer, storage: &str, uids: (u32, u32)) -> Entry {
        Entry::Session(SessionLine {
            run_id: "run_1".into(),
            sandbox_id: "sbx".into(),
            twin: "http://127.0.0.1:9".into(),
            pid: 1,
            version: "0".into(),
            listen: "127.0.0.1:1".into(),
            key_id: Some(sealer.key_id().into()),
            public_key: Some(sealer.public_key_hex()),
            key_storage: Some(storage.into()),
            proxy_uid: Some(uids.0),
            workload_uid: Some(uids.1),
            twin_heads: Some(Default::default()),
            ..SessionLine::test()
        })
    }

    fn request(path: &str) -> Entry {
        Entry::Request(RequestLine {
            duration_ms: 1,
            upstream: format!("http://127.0.0.1:9/s/sbx/stripe{path}"),
            ..RequestLine::test("stripe", "POST", path)
        })
    }

    fn recorded(name: &str, status: &str) -> Entry {
        Entry::Check(CheckLine {
            detail: format!("{name} {status}"),
            until_seq: 3,
            ..CheckLine::test(name, status)
        })
    }

    /// A finished `veris run` ledger: session, two requests, an interval
    /// seal, the recorded checks, the final seal. Returns the file's text.
    fn finished_run(dir: &Dir, sealer: &Sealer, storage: &str, twin: &str) -> (String, SealInfo) {
        let path = dir.0.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        ledger
            .append(session(sealer, storage, (1000, 1000)))
            .unwrap();
        ledger.append(request("/v1/customers")).unwrap();
        ledger.seal(sealer, "interval").unwrap();
        ledger.append(request("/v1/charges")).unwrap();
        ledger.append(recorded("canary", "ok")).unwrap();
        ledger.append(recorded("twin_cross_check", twin)).unwrap();
        let last = ledger.seal(sealer, "shutdown").unwrap();
        drop(ledger);
        (std::fs::read_to_string(&path).unwrap(), last)
    }

    fn pinned(sealer: &Sealer, text: &str) -> Options {
        let pin = Pin::parse(sealer.key_id()).unwrap();
        let read = read_bytes(text.as_bytes());
        let offered: Vec<String> = read
            .lines
            .iter()
            .filter_map(|l| match &l.entry {
                Entry::Session(SessionLine { public_key, .. }) => public_key.clone(),
                _ => None,
            })
            .collect();
        Options {
            anchor: Anchor::Pinned(pin.select(offered.iter().map(String::as_str))),
            ..Options::default()
        }
    }

    fn verdict_of(text: &str, options: &Options) -> Integrity {
        build(&read_bytes(text.as_bytes()), options).integrity
    }

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_string).collect()
    }

    /// Recomputes `prev` from line `from` on: what a forger without the key can do.
    fn rechain(lines: &mut [String]) -> String {
        for i in 0..lines.len() {
            let prev = if i == 0 {
                crate::GENESIS_PREV.to_string()
            } else {
                crate::hash::line_hash(lines[i - 1].as_bytes())
            };
            let at = lines[i].rfind(",\"prev\":\"").unwrap();
            lines[i] = format!("{},\"prev\":\"{prev}\"}}", &lines[i][..at]);
        }
        lines.iter().map(|l| format!("{l}\n")).collect()
    }

    #[test]
    fn a_finished_run_with_its_key_pinned_is_verified_offline() {
        let dir = Dir::new();
        let sealer = Sealer::generate().unwrap();
        let (text, _) = finished_run(&dir, &sealer, "memory", "ok");
        let i = verdict_of(&text, &pinned(&sealer, &text));
        assert_eq!(i.status, IntegrityStatus::Verified, "{i:?}");
        // Without the pin the same bytes prove nothing.
        let i = verdict_of(&text, &Options::default());
        assert_eq!(i.status, IntegrityStatus::Unverified, "{i:?}");
        // ledger.pub is a hint: matching it is not enough.
        let hint = Options {
            hint_keys: Some(PublicKeys {
                keys: vec![sealer.public_key()],
            }),
            ..Options::default()
        };
        let i = verdict_of(&text, &hint);
        assert_eq!(i.status, IntegrityStatus::Unverified);
        assert!(i.reason.unwrap().contains("could have written"));
    }

    /// The run's own process knows why its final seal is missing (its
    /// write failed): the reason says so, never "no public key".
    #[test]
    fn a_final_seal_that_could_not_be_written_is_named_as_such() {
        let dir = Dir::new();
        let sealer = Sealer::generate().unwrap();
        let path = dir.0.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        ledger
            .append(session(&sealer, "memory", (1000, 1000)))
            .unwrap();
        ledger.append(request("/v1/customers")).unwrap();
        drop(ledger);
        let text = std::fs::read_to_string(&path).unwrap();
        let why = "writing ledger /s/ledger.jsonl: No space left on device (os error 28)";
        let options = Options {
            seal_failure: Some(why.into()),
            ..Options::default()
        };
        let i = verdict_of(&text, &options);
        assert_eq!(i.status, IntegrityStatus::Unverified, "{i:?}");
        let reason = i.reason.unwrap();
        assert!(reason.contains(why), "{reason}");
        assert!(
            reason.contains("final seal could not be written"),
            "{reason}"
        );
        assert!(!reason.contains("no public key"), "{reason}");
    }

    #[test]
    fn a_recorded_failed_cross_check_fails_the_receipt() {
        let dir = Dir::new();
        let sealer = Sealer::generate().unwrap();
        let (text, _) = finished_run(&dir, &sealer, "memory", "failed");
        let i = verdict_of(&text, &pinned(&sealer, &text));
        assert_eq!(i.status, IntegrityStatus::Failed, "{i:?}");
    }

    #[test]
    fn a_recorded_leftover_process_keeps_an_offline_receipt_unverified() {
        let dir = Dir::new();
        let sealer = Sealer::generate().unwrap();
        let path = dir.0.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        ledger
            .append(session(&sealer, "memory", (1000, 1000)))
            .unwrap();
        ledger.append(recorded("canary", "ok")).unwrap();
        ledger.append(recorded("twin_cross_check", "ok")).unwrap();
        ledger
            .append(recorded("descendants", "unverified"))
            .unwrap();
        ledger.seal(&sealer, "shutdown").unwrap();
        drop(ledger);
        let text = std::fs::read_to_string(&path).unwrap();
        let i = verdict_of(&text, &pinned(&sealer, &text));
        assert_eq!(i.status, IntegrityStatus::Unverified, "{i:?}");
        assert!(
            i.reason.unwrap().contains("descendants unverified"),
            "the run's own words"
        );
    }

    #[test]
    fn offline_forgeries_never_verify() {
        let dir = Dir::new();
        let sealer = Sealer::generate().unwrap();
        let (text, _) = finished_run(&dir, &sealer, "memory", "ok");
        let opts = pinned(&sealer, &text);

        // Seals stripped, chain recomputed.
        let mut l = lines(&text);
        l.retain(|x| !x.contains("\"kind\":\"seal\""));
        let stripped = rechain(&mut l);
        // (renumber is not even needed for the verdict: the gap fails the chain)
        let i = verdict_of(&stripped, &opts);
        assert_ne!(i.status, IntegrityStatus::Verified, "{i:?}");

        // A request appended after the final seal.
        let mut l = lines(&text);
        let forged = serde_json::to_string(&crate::entry::Line {
            v: 2,
            seq: l.len() as u64 + 1,
            ts: "2026-11-30T00:00:00.000Z".into(),
            entry: request("/v1/refunds"),
            prev: String::new(),
        })
        .unwrap();
        l.push(forged);
        let appended = rechain(&mut l);
        let i = verdict_of(&appended, &opts);
        assert_eq!(i.status, IntegrityStatus::Unverified, "{i:?}");
        assert!(i.reason.unwrap().contains("after the last seal"));

        // The tail cut back to the interval seal: no final seal.
        let l = lines(&text);
        let cut: String = l[..3].iter().map(|x| format!("{x}\n")).collect();
        let i = verdict_of(&cut, &opts);
        assert_eq!(i.status, IntegrityStatus::Unverified, "{i:?}");
        assert!(i.reason.unwrap().contains("no final seal"), "cut");

        // Everything re-signed with another key (the workload's own), its
        // session line naming that key: a session sealed by its own key is
        // never vouched for by a pin of another.
        let other = Sealer::generate().unwrap();
        let (resigned, _) = finished_run(&Dir::new(), &other, "memory", "ok");
        let i = verdict_of(&resigned, &opts);
        assert_eq!(i.status, IntegrityStatus::Unverified, "{i:?}");
        assert!(i.reason.unwrap().contains("not the pinned key"));
        // Re-signed but still naming the real key: re-sealed.
        let mut l = lines(&resigned);
        l[0] = l[0].replace(&other.public_key_hex(), &sealer.public_key_hex());
        let renamed = rechain(&mut l);
        let i = verdict_of(&renamed, &opts);
        assert_eq!(i.status, IntegrityStatus::Failed, "{i:?}");
        assert!(i.reason.unwrap().contains("re-sealed"));
        // The pin resolved against the forged file alone finds no key of it.
        let i = verdict_of(&resigned, &pinned(&sealer, &resigned));
        assert_eq!(i.status, IntegrityStatus::Failed, "{i:?}");
        assert!(i.reason.unwrap().contains("not the ledger that key sealed"));
    }

    /// A session of a veris that kept its key in `seal.key` says so, and
    /// that is believed: no pin lifts it, whatever uid the workload had.
    #[test]
    fn a_session_whose_key_sat_in_a_file_never_verifies() {
        let dir = Dir::new();
        let sealer = Sealer::generate().unwrap();
        let (text, last) = finished_run(&dir, &sealer, "file", "ok");
        for options in [pinned(&sealer, &text), live_read(&sealer, &last)] {
            let i = verdict_of(&text, &options);
            assert_eq!(i.status, IntegrityStatus::Unverified, "{i:?}");
            assert!(i.reason.unwrap().contains("kept its seal key in a file"));
        }
    }

    /// H4: a workload of `serve`'s uid read the old `seal.key`, rewrote
    /// the session line to say `memory`, and re-signed every seal. The
    /// session's word is no evidence; the pin's provenance is: a key that
    /// sits in a private key file (the pin was read from it, or it lies
    /// beside the ledger) never gives `verified`.
    #[test]
    fn a_pin_of_a_key_that_sat_in_a_file_never_verifies() {
        let dir = Dir::new();
        let sealer = Sealer::generate().unwrap();
        let (text, _) = finished_run(&dir, &sealer, "memory", "ok");
        let mut options = pinned(&sealer, &text);
        assert_eq!(
            verdict_of(&text, &options).status,
            IntegrityStatus::Verified
        );
        options.pinned_key_file = Some("/s/seal.key".into());
        let i = verdict_of(&text, &options);
        assert_eq!(i.status, IntegrityStatus::Unverified, "{i:?}");
        assert!(
            custody(&i)
                .unwrap()
                .contains("private key file /s/seal.key"),
            "{i:?}"
        );
    }

    /// Every session seals with a key of its own. A pin vouches for the
    /// sessions that key sealed; the others of a window stay unverified
    /// (never failed: a restart is no forgery), and a session the workload
    /// appends with a key of its own after the real final seal is one of
    /// those.
    #[test]
    fn each_session_is_verified_by_a_pin_of_its_own_key() {
        let dir = Dir::new();
        let first = Sealer::generate().unwrap();
        let second = Sealer::generate().unwrap();
        let path = dir.0.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        for sealer in [&first, &second] {
            ledger
                .append(session(sealer, "memory", (1000, 1000)))
                .unwrap();
            ledger.append(request("/v1/charges")).unwrap();
            ledger.append(recorded("canary", "ok")).unwrap();
            ledger.append(recorded("twin_cross_check", "ok")).unwrap();
            ledger.seal(sealer, "shutdown").unwrap();
        }
        drop(ledger);
        let text = std::fs::read_to_string(&path).unwrap();
        // The latest session, pinned: verified.
        let latest = pinned(&second, &text);
        assert_eq!(verdict_of(&text, &latest).status, IntegrityStatus::Verified);
        // The whole file with one pin: the other session is unverified.
        let mut all = latest.clone();
        all.scope = WindowSpec::All;
        let i = verdict_of(&text, &all);
        assert_eq!(i.status, IntegrityStatus::Unverified, "{i:?}");
        assert!(
            i.reason.as_deref().unwrap().contains(&format!(
                "session at seq 1 is sealed by its own key {}",
                first.key_id()
            )),
            "{i:?}"
        );
        // Both pinned: verified.
        let both = Pin::parse(&format!("{}\n{}", first.key_id(), second.key_id())).unwrap();
        all.anchor = Anchor::Pinned(both.select([
            first.public_key_hex().as_str(),
            second.public_key_hex().as_str(),
        ]));
        assert_eq!(verdict_of(&text, &all).status, IntegrityStatus::Verified);
        // The latest session read with a pin of the first alone.
        let old_pin = pinned(&first, &text);
        let i = verdict_of(&text, &old_pin);
        assert_eq!(i.status, IntegrityStatus::Unverified, "{i:?}");

        // The workload appends a session of its own, well chained, sealed
        // by its own key, after the real final seal.
        let forger = Sealer::generate().unwrap();
        let (extra, _) = finished_run(&Dir::new(), &forger, "memory", "ok");
        let mut l = lines(&text);
        let n = l.len() as u64;
        for (k, mut line) in lines(&extra).into_iter().enumerate() {
            let seq_at = line.find(",\"seq\":").unwrap();
            let rest = &line[seq_at + 7..];
            let end = rest.find(',').unwrap();
            let old: u64 = rest[..end].parse().unwrap();
            line = format!("{},\"seq\":{}{}", &line[..seq_at], n + old, &rest[end..]);
            if let Some(s) = line.find("\"sealed_seq\":") {
                let rest = &line[s + 13..];
                let end = rest.find(',').unwrap();
                let old: u64 = rest[..end].parse().unwrap();
                line = format!("{}\"sealed_seq\":{}{}", &line[..s], n + old, &rest[end..]);
            }
            let _ = k;
            l.push(line);
        }
        let appended = rechain(&mut l);
        let i = verdict_of(&appended, &pinned(&second, &appended));
        assert_ne!(i.status, IntegrityStatus::Verified, "{i:?}");
    }

    fn session_of(sealer: &Sealer, tier: ListenerTier, uids: (Option<u32>, Option<u32>)) -> Entry {
        let mut e = session(sealer, "memory", (0, 0));
        if let Entry::Session(SessionLine {
            tier: t,
            proxy_uid,
            workload_uid,
            ..
        }) = &mut e
        {
            *t = tier;
            (*proxy_uid, *workload_uid) = uids;
        }
        e
    }

    /// Each session: its line, a request, its final seal. Returns the text
    /// and the last seal (a live reader's anchor).
    fn sessions(dir: &Dir, sealer: &Sealer, lines: Vec<Entry>) -> (String, SealInfo) {
        let path = dir.0.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        let mut last = None;
        for session in lines {
            ledger.append(session).unwrap();
            ledger.append(request("/v1/charges")).unwrap();
            ledger.append(recorded("canary", "ok")).unwrap();
            ledger.append(recorded("twin_cross_check", "ok")).unwrap();
            last = Some(ledger.seal(sealer, "shutdown").unwrap());
        }
        drop(ledger);
        (std::fs::read_to_string(&path).unwrap(), last.unwrap())
    }

    fn custody(i: &Integrity) -> Option<String> {
        i.checks
            .iter()
            .find(|c| c.name == "custody")
            .map(|c| c.detail.clone())
    }

    /// Read live through state-dir files, a restart that adds
    /// `--workload-uid` does not vouch for the session before it: a window
    /// spanning both is as weak as the weaker one, also when it starts
    /// inside the weak session (a baseline).
    #[test]
    fn every_session_of_the_window_counts_for_custody() {
        let dir = Dir::new();
        let sealer = Sealer::generate().unwrap();
        let explicit = ListenerTier::Explicit;
        let (text, last) = sessions(
            &dir,
            &sealer,
            vec![
                session_of(&sealer, explicit, (Some(1000), None)),
                session_of(&sealer, explicit, (Some(1000), Some(2000))),
            ],
        );
        let mut all = live_read(&sealer, &last);
        all.scope = WindowSpec::All;
        let i = verdict_of(&text, &all);
        assert!(
            custody(&i)
                .unwrap()
                .contains("workload may share the proxy uid"),
            "{i:?}"
        );
        assert_eq!(i.status, IntegrityStatus::Unverified, "{i:?}");
        // From a baseline inside the first session: its custody holds.
        let mut since = all.clone();
        since.scope = WindowSpec::Since(2);
        assert!(custody(&verdict_of(&text, &since)).is_some());
        // The latest session alone has its workload uid.
        let latest = live_read(&sealer, &last);
        assert_eq!(custody(&verdict_of(&text, &latest)), None);
        // A pin needs no uid: the key never left the proxy's memory.
        let mut pin_all = pinned(&sealer, &text);
        pin_all.scope = WindowSpec::All;
        assert_eq!(custody(&verdict_of(&text, &pin_all)), None);
        // A baseline inside the latest session.
        let mut inside = all;
        inside.scope = WindowSpec::Since(7);
        assert_eq!(custody(&verdict_of(&text, &inside)), None);
    }

    /// Read live through state-dir files: the transparent tier's redirect
    /// exempts the proxy uid, which does not show that the workload runs as
    /// another; root can rewrite any file. A pin of the in-memory key, or
    /// the proxy's own process, needs no uid.
    #[test]
    fn only_a_named_other_uid_keeps_the_key_from_the_workload() {
        let cases = [
            (
                ListenerTier::Transparent,
                (Some(14741), None),
                Some("may share"),
            ),
            (
                ListenerTier::Transparent,
                (Some(0), None),
                Some("may share"),
            ),
            (
                ListenerTier::Transparent,
                (Some(14741), Some(0)),
                Some("as root"),
            ),
            (ListenerTier::Explicit, (Some(0), Some(0)), Some("as root")),
            (ListenerTier::Transparent, (Some(14741), Some(1000)), None),
            (ListenerTier::Explicit, (Some(0), Some(65534)), None),
        ];
        for (tier, uids, want) in cases {
            let dir = Dir::new();
            let sealer = Sealer::generate().unwrap();
            let (text, last) = sessions(&dir, &sealer, vec![session_of(&sealer, tier, uids)]);
            // A root workload outside any namespace or Landlock domain of
            // its own could read the proxy's memory, whatever the anchor.
            let root = uids.1 == Some(0);
            let pin = custody(&verdict_of(&text, &pinned(&sealer, &text)));
            let own = custody(&verdict_of(&text, &in_process(live_read(&sealer, &last))));
            for got in [pin, own] {
                match root {
                    true => assert!(
                        got.as_deref()
                            .is_some_and(|g| g.contains("workload ran as root")),
                        "{tier:?} {uids:?}: {got:?}"
                    ),
                    false => assert_eq!(got, None, "{tier:?} {uids:?}"),
                }
            }
            let got = custody(&verdict_of(&text, &live_read(&sealer, &last)));
            match want {
                Some(w) => assert!(
                    got.as_deref().is_some_and(|g| g.contains(w)),
                    "{tier:?} {uids:?}: {got:?}"
                ),
                None => assert_eq!(got, None, "{tier:?} {uids:?}"),
            }
        }
    }

    /// A live read anchored on `last`, the fresh seal the proxy returned.
    fn live_read(sealer: &Sealer, last: &SealInfo) -> Options {
        Options {
            anchor: Anchor::Live {
                seal: last.clone(),
                public_key: sealer.public_key_hex(),
                channel: LiveChannel::StateDir,
            },
            until: Some(last.seq),
            proxy_live: true,
            ..Options::default()
        }
    }

    /// A live read by the proxy's own process (`veris run`'s end).
    fn in_process(mut options: Options) -> Options {
        if let Anchor::Live { channel, .. } = &mut options.anchor {
            *channel = LiveChannel::InProcess;
        }
        options
    }

    /// Read live, the answer comes from whatever `admin.addr` names, which a
    /// workload of the proxy's uid could have pointed at a stand-in.
    #[test]
    fn a_live_read_through_state_dir_files_needs_another_workload_uid() {
        let dir = Dir::new();
        let sealer = Sealer::generate().unwrap();
        let (text, last) = finished_run(&dir, &sealer, "memory", "ok");
        let live = live_read(&sealer, &last);
        let i = verdict_of(&text, &live);
        assert_eq!(i.status, IntegrityStatus::Unverified, "{i:?}");
        assert!(i.reason.unwrap().contains("workload shares the proxy uid"));
    }

    #[test]
    fn the_live_anchor_demands_the_proxys_own_seal_line() {
        let dir = Dir::new();
        let sealer = Sealer::generate().unwrap();
        let (text, last) = finished_run(&dir, &sealer, "memory", "ok");
        let live = in_process(live_read(&sealer, &last));
        let i = verdict_of(&text, &live);
        assert_eq!(i.status, IntegrityStatus::Verified, "{i:?}");

        // The workload wrote its own ledger of the same length, sealed with
        // its own key, and put it in place: the seal at that seq is not ours.
        let other = Sealer::generate().unwrap();
        let (forged, _) = finished_run(&Dir::new(), &other, "memory", "ok");
        let i = verdict_of(&forged, &live);
        assert_eq!(i.status, IntegrityStatus::Failed, "{i:?}");

        // Cut before the fresh seal.
        let cut: String = lines(&text)[..5].iter().map(|x| format!("{x}\n")).collect();
        let i = verdict_of(&cut, &live);
        assert_eq!(i.status, IntegrityStatus::Failed, "{i:?}");
        assert!(i.reason.unwrap().contains("does not hold the seal"));

        // The proxy noticed its file replaced.
        let mut noticed = live.clone();
        if let Anchor::Live { seal, .. } = &mut noticed.anchor {
            seal.tampered = Some("replaced: another file".into());
        }
        let i = verdict_of(&text, &noticed);
        assert_eq!(i.status, IntegrityStatus::Failed, "{i:?}");
    }

    #[test]
    fn the_writer_notices_its_file_replaced_cut_or_extended() {
        let dir = Dir::new();
        let sealer = Sealer::generate().unwrap();
        let path = dir.0.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        ledger.append(session(&sealer, "memory", (1, 1))).unwrap();
        assert_eq!(ledger.seal(&sealer, "demand").unwrap().tampered, None);
        // Replaced by rename, as `mv forged ledger.jsonl` does.
        let forged = dir.0.join("forged");
        std::fs::write(&forged, "{}\n").unwrap();
        std::fs::rename(&forged, &path).unwrap();
        let seal = ledger.seal(&sealer, "demand").unwrap();
        assert!(seal.tampered.unwrap().starts_with("replaced"));
        drop(ledger);

        let path = dir.0.join("cut.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        ledger.append(session(&sealer, "memory", (1, 1))).unwrap();
        ledger.append(request("/v1/x")).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(10).unwrap();
        let seal = ledger.seal(&sealer, "demand").unwrap();
        assert!(seal.tampered.unwrap().starts_with("cut"));
        drop(ledger);

        let path = dir.0.join("extended.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        ledger.append(session(&sealer, "memory", (1, 1))).unwrap();
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"{\"forged\":1}\n").unwrap();
        let seal = ledger.seal(&sealer, "demand").unwrap();
        assert!(seal.tampered.unwrap().starts_with("extended"));
        // The tamper line is in the proxy's own chain.
        let r = read(&path).unwrap();
        assert!(r
            .lines
            .iter()
            .any(|l| matches!(l.entry, Entry::Tamper { .. })));
    }

    #[test]
    fn a_restarted_proxy_never_continues_history_it_cannot_verify() {
        let dir = Dir::new();
        let sealer = Sealer::generate().unwrap();
        let own = PublicKeys {
            keys: vec![sealer.public_key()],
        };
        let (text, _) = finished_run(&dir, &sealer, "file", "ok");
        let path = dir.0.join("ledger.jsonl");
        // Its own, sealed to the end: continued.
        let (ledger, report) = Ledger::open_sealed_by(&path, &own).unwrap();
        assert!(report.moved_aside.is_none());
        assert_eq!(report.next_seq, lines(&text).len() as u64 + 1);
        drop(ledger);

        // Laundering: seals stripped, a request inserted, chain recomputed.
        let mut l = lines(&text);
        l.retain(|x| !x.contains("\"kind\":\"seal\""));
        let forged = rechain(&mut l);
        std::fs::write(&path, &forged).unwrap();
        let (ledger, report) = Ledger::open_sealed_by(&path, &own).unwrap();
        let moved = report.moved_aside.expect("moved aside");
        assert_eq!(report.next_seq, 1, "a new chain");
        assert_eq!(std::fs::read_to_string(&moved.file).unwrap(), forged);
        assert!(!moved.why.is_empty());
        drop(ledger);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
    }

    /// A gateway sandbox's session line: the platform sends the sandbox's
    /// TCP to the gateway; the sandbox has no uid on the gateway's host.
    fn gateway_session(sealer: &Sealer) -> Entry {
        let Entry::Session(line) = session(sealer, "memory", (0, 0)) else {
            unreachable!("session() builds a session line")
        };
        Entry::Session(SessionLine {
            sandbox_id: "sbx-gw".into(),
            tier: ListenerTier::Gateway,
            workload_uid: None,
            coverage: Some(Box::new(crate::entry::Coverage {
                tcp_ports: None,
                quic: "platform".into(),
                dns: "platform".into(),
                udp_other: "platform".into(),
                ip_other: "platform".into(),
                ipv6: true,
                exempt: Vec::new(),
                installed_by: "platform".into(),
                isolation: Some("gateway".into()),
                sockets_reachable: Vec::new(),
                bundles: Vec::new(),
                upstream_proxy: false,
            })),
            ..line
        })
    }

    fn gateway_request() -> Entry {
        Entry::Request(RequestLine {
            tier: ListenerTier::Gateway,
            duration_ms: 1,
            upstream: "http://127.0.0.1:9/s/sbx-gw/stripe/v1/charges".into(),
            ..RequestLine::test("stripe", "POST", "/v1/charges")
        })
    }

    /// What the gateway appends when a probe from inside the sandbox
    /// reaches its canary host.
    fn sandbox_probe() -> Entry {
        Entry::Check(CheckLine {
            detail: "probed from inside sandbox sbx-gw through the gateway".into(),
            ..CheckLine::test("canary", "ok")
        })
    }

    /// A gateway sandbox's ledger, a session per item of `probes`: its
    /// line, a request, that many probes from the sandbox, the recorded
    /// twin cross-check and the final seal. Returns the text and the last
    /// seal (a live reader's anchor).
    fn gateway_ledger(dir: &Dir, sealer: &Sealer, probes: &[usize]) -> (String, SealInfo) {
        let path = dir.0.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        let mut last = None;
        for &n in probes {
            ledger.append(gateway_session(sealer)).unwrap();
            ledger.append(gateway_request()).unwrap();
            for _ in 0..n {
                ledger.append(sandbox_probe()).unwrap();
            }
            ledger.append(recorded("twin_cross_check", "ok")).unwrap();
            last = Some(ledger.seal(sealer, "shutdown").unwrap());
        }
        drop(ledger);
        (std::fs::read_to_string(&path).unwrap(), last.unwrap())
    }

    /// The only doubt of `i` is the missing probe from the sandbox.
    fn no_probe_is_the_only_doubt(i: &Integrity) {
        assert_eq!(i.status, IntegrityStatus::Unverified, "{i:?}");
        let reason = i.reason.as_deref().unwrap_or_default();
        assert!(reason.starts_with(NO_SANDBOX_PROBE), "{reason}");
        let doubts: Vec<&str> = i
            .checks
            .iter()
            .filter(|c| c.status != CheckStatus::Ok)
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(doubts, ["canary"], "{i:?}");
    }

    /// The gateway sees only what the platform sends it: without a probe
    /// from inside the sandbox, a sandbox whose egress bypasses it reads
    /// like one that made no calls. A reader's own probe of the gateway,
    /// from outside the sandbox, is no such probe.
    #[test]
    fn a_gateway_window_without_a_probe_from_the_sandbox_is_unverified() {
        let dir = Dir::new();
        let sealer = Sealer::generate().unwrap();
        let (text, last) = gateway_ledger(&dir, &sealer, &[0]);
        let mut live = in_process(live_read(&sealer, &last));
        live.external_checks = vec![check(
            "canary",
            CheckStatus::Ok,
            "the live gateway answered its canary",
        )];
        for options in [pinned(&sealer, &text), live] {
            no_probe_is_the_only_doubt(&verdict_of(&text, &options));
        }
        let r = build(&read_bytes(text.as_bytes()), &pinned(&sealer, &text));
        let out = crate::receipt::render_text(&r);
        assert!(
            out.contains("  interception: gateway   integrity: unverified (no canary probe from the sandbox: "),
            "{out}"
        );
    }

    /// An ok probe from the sandbox inside the session, under seals of a
    /// pinned key or the live gateway: `verified`, with what the platform
    /// still vouches for alone in the leaks.
    #[test]
    fn a_gateway_window_with_a_probe_from_the_sandbox_is_verified() {
        for probes in [1, 3] {
            let dir = Dir::new();
            let sealer = Sealer::generate().unwrap();
            let (text, last) = gateway_ledger(&dir, &sealer, &[probes]);
            for options in [
                pinned(&sealer, &text),
                in_process(live_read(&sealer, &last)),
            ] {
                let r = build(&read_bytes(text.as_bytes()), &options);
                assert_eq!(r.integrity.status, IntegrityStatus::Verified, "{r:?}");
                let canary = r.integrity.checks.iter().find(|c| c.name == "canary");
                let detail = canary.map(|c| c.detail.as_str()).unwrap_or_default();
                assert!(
                    detail.starts_with("probed from inside sandbox sbx-gw through the gateway (recorded by the gateway at seq"),
                    "{detail}"
                );
                assert_eq!(r.interception, Some(Interception::Gateway));
                assert_eq!(r.leaks, ["platform-enforced", "udp-not-tunneled"]);
                let out = crate::receipt::render_text(&r);
                assert!(
                    out.contains("\n  interception: gateway   integrity: verified\n  leaks: platform-enforced, udp-not-tunneled\n"),
                    "{out}"
                );
                let json = serde_json::to_value(&r).unwrap();
                assert_eq!(json["interception"], "gateway");
                assert_eq!(json["isolation"], "gateway");
            }
            // Unanchored, the probe line is only the file's word.
            let i = verdict_of(&text, &Options::default());
            assert_eq!(i.status, IntegrityStatus::Unverified, "{i:?}");
            // A live reader whose own canary failed fails the window.
            let mut failed = in_process(live_read(&sealer, &last));
            failed.external_checks = vec![check("canary", CheckStatus::Failed, "not ours")];
            assert_eq!(verdict_of(&text, &failed).status, IntegrityStatus::Failed);
        }
    }

    /// A probe counts for its own session's window only: never for a later
    /// session of the same file, nor when it is before a baseline or after
    /// the window's end.
    #[test]
    fn only_a_probe_inside_the_sessions_window_counts() {
        let sealer = Sealer::generate().unwrap();
        // The earlier session probed; the latest did not.
        let dir = Dir::new();
        let (text, _) = gateway_ledger(&dir, &sealer, &[1, 0]);
        let latest = pinned(&sealer, &text);
        no_probe_is_the_only_doubt(&verdict_of(&text, &latest));
        let every = Options {
            scope: WindowSpec::All,
            ..latest.clone()
        };
        no_probe_is_the_only_doubt(&verdict_of(&text, &every));
        // The latest probed, the earlier did not: the whole file names it.
        let dir = Dir::new();
        let (text, _) = gateway_ledger(&dir, &sealer, &[0, 1]);
        let latest = pinned(&sealer, &text);
        let i = verdict_of(&text, &latest);
        assert_eq!(i.status, IntegrityStatus::Verified, "{i:?}");
        let every = Options {
            scope: WindowSpec::All,
            ..latest
        };
        let i = verdict_of(&text, &every);
        no_probe_is_the_only_doubt(&i);
        let reason = i.reason.unwrap();
        assert!(
            reason.starts_with("no canary probe from the sandbox in the session at seq 1: "),
            "{reason}"
        );

        // Session 1, request 2, probe 3, cross-check 4, final seal 5.
        let dir = Dir::new();
        let (text, _) = gateway_ledger(&dir, &sealer, &[1]);
        let from = |since| Options {
            scope: WindowSpec::Since(since),
            ..pinned(&sealer, &text)
        };
        assert_eq!(
            verdict_of(&text, &from(2)).status,
            IntegrityStatus::Verified
        );
        no_probe_is_the_only_doubt(&verdict_of(&text, &from(3)));

        // A probe after the window's end: session 1, request 2,
        // cross-check 3, final seal 4, probe 5, seal 6.
        let dir = Dir::new();
        let path = dir.0.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        ledger.append(gateway_session(&sealer)).unwrap();
        ledger.append(gateway_request()).unwrap();
        ledger.append(recorded("twin_cross_check", "ok")).unwrap();
        ledger.seal(&sealer, "shutdown").unwrap();
        ledger.append(sandbox_probe()).unwrap();
        ledger.seal(&sealer, "shutdown").unwrap();
        drop(ledger);
        let text = std::fs::read_to_string(&path).unwrap();
        let to = |until| Options {
            until: Some(until),
            ..pinned(&sealer, &text)
        };
        no_probe_is_the_only_doubt(&verdict_of(&text, &to(4)));
        assert_eq!(verdict_of(&text, &to(6)).status, IntegrityStatus::Verified);
    }
}
