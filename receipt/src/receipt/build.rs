//! Building a receipt from a ledger window: what reached the twin, leaks,
//! trust failures. Integrity is computed in `integrity`.
//!
//! The receipt is a fold: a [`Builder`] takes the verified lines one at a
//! time ([`Builder::line`], e.g. from [`crate::ledger::scan`]) and keeps
//! only what the receipt reports (counts, the listed requests up to
//! [`JSON_ENTRY_CAP`] per service, findings), so its memory does not grow
//! with the ledger. [`build`] folds a read that holds every line.

use std::collections::BTreeMap;

use crate::entry::{
    BlockedLine, PassthroughLine, ReservedPathLine, ResponseIncompleteLine, SessionLine,
    TunnelCloseLine,
};
use crate::entry::{Entry, Line};
use crate::ledger::LedgerRead;

use super::integrity::{Evidence, FileFacts, Keys};
use super::*;

/// Builds the receipt for a window of a verified read. Mode, tier and twin
/// come from the newest session line at or before the window end.
pub fn build(read: &LedgerRead, options: &Options) -> Receipt {
    let mut b = Builder::new(options);
    for (i, line) in read.lines.iter().enumerate() {
        // The line's hash: the next line's `prev`, or the head's for the
        // last (only read where the chain holds; the chain check fails the
        // receipt otherwise).
        let hash = match read.lines.get(i + 1) {
            Some(next) => next.prev.as_str(),
            None => read.head.1.as_str(),
        };
        b.line(line, hash);
    }
    b.finish(read)
}

/// Builds the receipt for a ledger file by streaming it through a
/// [`Builder`]: memory does not grow with the file. A missing file is an
/// empty ledger.
pub fn build_file(
    path: &std::path::Path,
    options: &Options,
) -> Result<Receipt, crate::LedgerError> {
    build_file_with(path, options, |_, _| {})
}

/// [`build_file`] that also hands every line to `visit` in the same pass,
/// after the fold took it, with the window as it stands then
/// ([`Builder::window_so_far`]): another view of the window (the HAR) then
/// reads exactly the lines the receipt judged, never a second read of a
/// file the workload could have changed in between.
pub fn build_file_with(
    path: &std::path::Path,
    options: &Options,
    mut visit: impl FnMut(&Line, &Builder<'_>),
) -> Result<Receipt, crate::LedgerError> {
    let mut b = Builder::new(options);
    let read = crate::ledger::scan_file(path, crate::ledger::PROBLEM_CAP, |line, hash, _| {
        b.line(line, hash);
        visit(line, &b);
    })?;
    Ok(b.finish(&read))
}

/// What the receipt says about one window, gathered line by line; a new
/// session line starts it over when the window is the latest session.
#[derive(Default)]
struct WindowFold {
    since: u64,
    services: BTreeMap<String, ServiceSummary>,
    upstream_errors: Vec<UpstreamErrorEntry>,
    reserved_paths: BTreeMap<String, u64>,
    dns_refused: Vec<String>,
    callbacks: super::Callbacks,
    publishing: Option<PublishRefused>,
    passthrough: HostCounts,
    blocked: HostCounts,
    // (host, destination) -> count, for passthrough and blocked lines.
    passed: BTreeMap<(String, Option<String>), u64>,
    blocked_at: BTreeMap<(String, Option<String>), u64>,
    /// Passthrough lines with no destination, by seq, until their
    /// `tunnel_close` says whether the dial failed (bounded).
    undialed: BTreeMap<u64, String>,
    /// Passthroughs whose dial never connected, per host: how many and the
    /// last reason.
    unreached: BTreeMap<String, (u64, String)>,
    tls: super::tls::TlsTally,
    evidence: Evidence,
    /// The lines the leaks are judged by, condensed: one per kind and host.
    leak_lines: Vec<Line>,
}

/// The receipt as a fold over verified lines, in file order.
pub struct Builder<'o> {
    options: &'o Options,
    keys: Keys,
    /// Lines with a greater seq are after the window.
    until: u64,
    /// The last line's seq (the window's end without `until`).
    last: u64,
    /// The newest session line at or before the window end.
    session: Option<Line>,
    /// The newest session line not in the window (at or before its start).
    session_before: Option<Line>,
    /// The live anchor's seal line was looked for (`Some`) and found (`true`).
    live_seal: Option<bool>,
    w: WindowFold,
    /// Reused for each request's `METHOD /path`.
    call: String,
}

impl<'o> Builder<'o> {
    pub fn new(options: &'o Options) -> Builder<'o> {
        let since = match options.scope {
            WindowSpec::Since(s) => s,
            WindowSpec::All | WindowSpec::LatestSession => 0,
        };
        Builder {
            options,
            keys: Keys::of(options),
            until: options.until.unwrap_or(u64::MAX),
            last: 0,
            session: None,
            session_before: None,
            live_seal: None,
            w: WindowFold {
                since,
                ..WindowFold::default()
            },
            call: String::new(),
        }
    }

    /// The window the lines so far put the receipt in: `since < seq <=
    /// until` (a later session line may still move `since` forward, never
    /// back).
    pub fn window_so_far(&self) -> (u64, u64) {
        (self.w.since, self.until)
    }

    /// Takes the next verified line and its hash.
    pub fn line(&mut self, line: &Line, hash: &str) {
        self.last = line.seq;
        if let Anchor::Live { seal, .. } = &self.options.anchor {
            if self.live_seal.is_none() && line.seq >= seal.seq {
                self.live_seal = Some(super::integrity::is_live_seal(seal, line, hash));
            }
        }
        if line.seq > self.until {
            return;
        }
        if let Entry::Session(_) = &line.entry {
            self.session = Some(line.clone());
            if self.options.scope == WindowSpec::LatestSession {
                self.w = WindowFold {
                    since: line.seq.saturating_sub(1),
                    ..WindowFold::default()
                };
            }
        }
        if line.seq <= self.w.since {
            if let Entry::Session(_) = &line.entry {
                // A window that starts mid-session is sealed by this
                // session's key.
                self.w.evidence.enter_session(line);
                self.session_before = Some(line.clone());
            }
            return;
        }
        self.w.evidence.line(line, &self.keys);
        self.leak_line(line);
        let options = self.options;
        let wanted = |service: &str| options.service.as_deref().is_none_or(|s| s == service);
        let w = &mut self.w;
        match &line.entry {
            Entry::Request(r) if wanted(&r.service) => {
                let (service, host, status) = (&r.service, &r.host, r.status);
                // Counted without allocating for keys already seen: most
                // lines repeat a service, host and call.
                if !w.services.contains_key(service.as_str()) {
                    w.services
                        .insert(service.clone(), ServiceSummary::default());
                }
                let Some(summary) = w.services.get_mut(service.as_str()) else {
                    return;
                };
                summary.requests += 1;
                let plain = host.bytes().all(|b| {
                    b.is_ascii() && !b.is_ascii_uppercase() && b != b':' && !b.is_ascii_whitespace()
                });
                if plain {
                    count_key(&mut summary.hosts, host);
                    count_status(&mut summary.host_statuses, host, status);
                } else {
                    let host = normalize_host(host);
                    count_key(&mut summary.hosts, &host);
                    count_status(&mut summary.host_statuses, &host, status);
                }
                let path = strip_query(&r.path);
                let call = &mut self.call;
                call.clear();
                call.push_str(&r.method);
                call.push(' ');
                call.push_str(path);
                count_key(&mut summary.calls, call);
                count_status(&mut summary.call_statuses, call, status);
                if summary.entries.len() < JSON_ENTRY_CAP {
                    summary.entries.push(RequestEntry {
                        seq: line.seq,
                        method: r.method.clone(),
                        path: path.to_string(),
                        status,
                        tier: r.tier,
                        client_gone: r.client_gone,
                        incomplete: None,
                    });
                } else {
                    summary.capped = true;
                }
            }
            Entry::UpstreamError(e) if wanted(&e.service) => {
                w.upstream_errors.push(UpstreamErrorEntry {
                    seq: line.seq,
                    service: e.service.clone(),
                    host: normalize_host(&e.host),
                    method: e.method.clone(),
                    path: strip_query(&e.path).to_string(),
                    status: e.status,
                    error: e.error.clone(),
                    tier: e.tier,
                    bytes_in: e.bytes_in,
                    declared_in: e.declared_in,
                })
            }
            Entry::Callback(c) if wanted(&c.service) => w.callbacks.add(line.seq, c),
            Entry::CallbackDropped(d) if wanted(&d.service) => w.callbacks.add_dropped(d.events),
            Entry::ReservedPath(ReservedPathLine {
                service,
                method,
                path,
                ..
            }) if wanted(service) => {
                *w.reserved_paths
                    .entry(format!("{service} {method} {}", strip_query(path)))
                    .or_default() += 1;
            }
            Entry::Check(crate::entry::CheckLine {
                name,
                status,
                detail,
                ..
            }) if name == PUBLISH_CHECK => {
                // A refusal that passed: the stream got the lines since.
                w.publishing = (status != PUBLISH_RESUMED).then(|| PublishRefused {
                    status: status.clone(),
                    reason: detail.clone(),
                    seq: line.seq,
                });
            }
            Entry::Dns {
                name,
                refused: true,
                ..
            } => w.dns_refused.push(name.clone()),
            Entry::Passthrough(PassthroughLine { host, dst, .. }) => {
                let host = normalize_host(host);
                *w.passthrough.hosts.entry(host.clone()).or_default() += 1;
                if dst.is_none() && w.undialed.len() < UNDIALED_CAP {
                    w.undialed.insert(line.seq, host.clone());
                }
                *w.passed.entry((host, dst.clone())).or_default() += 1;
            }
            // A passthrough that reached nothing: its dial failed, and the
            // close says why. It moves from the passed to the unreached.
            Entry::TunnelClose(TunnelCloseLine {
                of,
                bytes_in: 0,
                bytes_out: 0,
                error: Some(error),
                ..
            }) => {
                if let Some(host) = w.undialed.remove(of) {
                    if let Some(n) = w.passthrough.hosts.get_mut(&host) {
                        *n -= 1;
                        if *n == 0 {
                            w.passthrough.hosts.remove(&host);
                        }
                    }
                    let key = (host, None);
                    if let Some(n) = w.passed.get_mut(&key) {
                        *n -= 1;
                        if *n == 0 {
                            w.passed.remove(&key);
                        }
                    }
                    let failed = w.unreached.entry(key.0).or_default();
                    failed.0 += 1;
                    failed.1 = error.clone();
                }
            }
            Entry::TunnelClose(TunnelCloseLine { of, .. }) => {
                w.undialed.remove(of);
            }
            Entry::Blocked(BlockedLine { host, dst, .. }) => {
                let host = normalize_host(host);
                *w.blocked.hosts.entry(host.clone()).or_default() += 1;
                *w.blocked_at.entry((host, dst.clone())).or_default() += 1;
            }
            Entry::TrustFailure(_) | Entry::TlsAbandoned(_) => w.tls.add(&line.entry),
            // Follows its request line; one whose request is before the
            // window is not this window's.
            Entry::ResponseIncomplete(ResponseIncompleteLine {
                of,
                service,
                bytes,
                declared,
                reason,
            }) if wanted(service) => {
                if let Some(summary) = w.services.get_mut(service) {
                    let listed = summary.entries.binary_search_by_key(of, |e| e.seq);
                    if let Ok(i) = listed {
                        summary.entries[i].incomplete = Some(Incomplete {
                            bytes: *bytes,
                            declared: *declared,
                            reason: reason.clone(),
                        });
                    }
                    if listed.is_ok() || summary.entries.last().is_some_and(|e| e.seq < *of) {
                        summary.incomplete += 1;
                    }
                }
            }
            _ => {}
        }
    }

    /// Keeps what the leaks are judged by, one line per kind (and host):
    /// the leaks say whether a kind occurred, which hosts, and sums.
    fn leak_line(&mut self, line: &Line) {
        let lines = &mut self.w.leak_lines;
        let same = |l: &Line| -> bool {
            match (&l.entry, &line.entry) {
                (Entry::RedirectChange { .. }, Entry::RedirectChange { .. })
                | (Entry::Passthrough(_), Entry::Passthrough(_))
                | (Entry::UdpDropped { .. }, Entry::UdpDropped { .. }) => true,
                (Entry::Ech { host: a, .. }, Entry::Ech { host: b, .. }) => {
                    normalize_host(a) == normalize_host(b)
                }
                (Entry::Quic { host: a, .. }, Entry::Quic { host: b, .. }) => {
                    a.as_deref().map(normalize_host) == b.as_deref().map(normalize_host)
                }
                _ => false,
            }
        };
        match &line.entry {
            Entry::RedirectChange { .. }
            | Entry::Passthrough(_)
            | Entry::Ech { .. }
            | Entry::Quic { .. }
            | Entry::UdpDropped { .. } => {}
            _ => return,
        }
        match lines.iter_mut().find(|l| same(l)) {
            None => lines.push(line.clone()),
            Some(kept) => match (&mut kept.entry, &line.entry) {
                (Entry::Quic { attempts, .. }, Entry::Quic { attempts: more, .. }) => {
                    *attempts = attempts.saturating_add(*more);
                }
                (Entry::UdpDropped { packets }, Entry::UdpDropped { packets: more }) => {
                    *packets = packets.saturating_add(*more);
                }
                _ => {}
            },
        }
    }

    /// The receipt. `read` gives what the whole file says (chain problems,
    /// torn tail, head); its `lines` are not used.
    pub fn finish(self, read: &LedgerRead) -> Receipt {
        let until = self.options.until.map_or(self.last, |u| u.min(self.last));
        let w = self.w;
        let (since, scope) = match self.options.scope {
            WindowSpec::All => (0, Scope::All),
            WindowSpec::Since(s) => (s, Scope::Baseline),
            WindowSpec::LatestSession => (w.since, Scope::Session),
        };
        let window = Window {
            since_seq: since,
            until_seq: until,
            scope,
        };
        let facts = FileFacts {
            read,
            session: self.session.as_ref(),
            session_before: self.session_before.as_ref(),
            live_seal_found: self.live_seal == Some(true),
        };
        let mut evidence = w.evidence;
        let set_aside = std::mem::take(&mut evidence.set_aside);
        let integrity =
            super::integrity::integrity(evidence, &self.keys, &facts, self.options, &window);
        let (twin, mode, interception, (isolation, bundles), seal_key) =
            match self.session.as_ref().map(|l| &l.entry) {
                Some(Entry::Session(SessionLine {
                    sandbox_id,
                    mode,
                    tier,
                    key_id,
                    coverage,
                    ..
                })) => (
                    Some(sandbox_id.clone()),
                    Some(*mode),
                    Some(Interception::of(
                        *tier,
                        coverage.as_ref().and_then(|c| c.isolation.as_deref()),
                    )),
                    coverage.as_ref().map_or((None, Vec::new()), |c| {
                        (c.isolation.clone(), c.bundles.clone())
                    }),
                    key_id.clone(),
                ),
                _ => (None, None, None, (None, Vec::new()), None),
            };
        // The leaks read the newest session line and the condensed lines.
        let mut leak_read = LedgerRead::default();
        leak_read.lines.extend(self.session);
        leak_read.lines.extend(w.leak_lines);
        let leaks = super::leaks::leaks(&leak_read, since, until);
        let mut passthrough = w.passthrough;
        passthrough.destinations = destinations(w.passed);
        passthrough.unreached = w
            .unreached
            .into_iter()
            .map(|(host, (count, error))| Unreached { host, count, error })
            .collect();
        let mut blocked = w.blocked;
        blocked.destinations = destinations(w.blocked_at);
        let (trust_failures, tls_abandoned) = w.tls.finish(&w.services);
        Receipt {
            version: RECEIPT_VERSION,
            twin,
            window,
            mode,
            interception,
            isolation,
            bundles,
            integrity,
            leaks,
            services: w.services,
            trust_failures,
            tls_abandoned,
            passthrough,
            blocked,
            upstream_errors: w.upstream_errors,
            seal_key,
            reserved_paths: w.reserved_paths,
            set_aside,
            dns_refused: w.dns_refused,
            callbacks: w.callbacks,
            publishing: w.publishing,
            requirements: Vec::new(),
        }
    }
}

/// Passthrough lines without a destination kept waiting for their close:
/// a proxy closes a failed dial's line at once, so only a ledger of lines
/// never closed (an older proxy's) could grow the map.
const UNDIALED_CAP: usize = 4096;

/// Adds one to `key`'s count, allocating the key only the first time.
fn count_key(counts: &mut BTreeMap<String, u64>, key: &str) {
    match counts.get_mut(key) {
        Some(n) => *n += 1,
        None => {
            counts.insert(key.to_string(), 1);
        }
    }
}

/// Adds one to `key`'s count of `status`, allocating the key only the
/// first time.
fn count_status(counts: &mut BTreeMap<String, BTreeMap<u16, u64>>, key: &str, status: u16) {
    match counts.get_mut(key) {
        Some(by_status) => *by_status.entry(status).or_default() += 1,
        None => {
            counts.insert(key.to_string(), BTreeMap::from([(status, 1)]));
        }
    }
}

fn destinations(counts: BTreeMap<(String, Option<String>), u64>) -> Vec<Destination> {
    counts
        .into_iter()
        .map(|((host, dst), count)| Destination { host, dst, count })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::Line;
    use crate::entry::{RequestLine, TrustFailureLine};

    fn req(seq: u64, path: &str) -> Line {
        Line {
            v: 1,
            seq,
            ts: "2026-11-29T07:28:19.123Z".into(),
            entry: Entry::Request(RequestLine {
                host: "API.Stripe.com:443".into(),
                http: "HTTP/2".into(),
                tier: ListenerTier::Transparent,
                duration_ms: 1,
                upstream: "http://twin/".into(),
                ..RequestLine::test("stripe", "GET", path)
            }),
            prev: String::new(),
        }
    }

    /// The streaming fold over a file gives the receipt the whole read gives,
    /// for every golden ledger and several windows and anchors.
    #[test]
    fn streaming_equals_the_whole_read_on_the_golden_ledgers() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("jsonl") {
                continue;
            }
            let read = crate::ledger::read(&path).unwrap();
            let last = read.head.0;
            let keys = crate::seal::PublicKeys::parse(
                &std::fs::read_to_string(dir.join("ledger.pub")).unwrap_or_default(),
            );
            for scope in [
                WindowSpec::LatestSession,
                WindowSpec::All,
                WindowSpec::Since(last / 2),
            ] {
                for until in [None, Some(last.saturating_sub(1)), Some(last + 5)] {
                    for pinned in [false, true] {
                        let options = Options {
                            scope,
                            until,
                            anchor: if pinned {
                                Anchor::Pinned(keys.clone())
                            } else {
                                Anchor::None
                            },
                            hint_keys: Some(keys.clone()),
                            ..Options::default()
                        };
                        let whole = build(&read, &options);
                        let streamed = build_file(&path, &options).unwrap();
                        assert_eq!(
                            streamed,
                            whole,
                            "{} {scope:?} {until:?} {pinned}",
                            path.display()
                        );
                        n += 1;
                    }
                }
            }
        }
        assert!(n >= 18, "golden ledgers found: {}", n / 18);
    }

    #[test]
    fn json_entries_are_capped_but_counts_stay_exact() {
        let read = LedgerRead {
            lines: (1..=JSON_ENTRY_CAP as u64 + 5)
                .map(|s| req(s, "/v1/x?limit=1"))
                .collect(),
            head: (JSON_ENTRY_CAP as u64 + 5, String::new()),
            ..LedgerRead::default()
        };
        let r = build(&read, &Options::default());
        let s = &r.services["stripe"];
        assert_eq!(s.requests, JSON_ENTRY_CAP as u64 + 5);
        assert_eq!(s.entries.len(), JSON_ENTRY_CAP);
        assert!(s.capped);
        assert_eq!(s.calls["GET /v1/x"], JSON_ENTRY_CAP as u64 + 5);
        assert_eq!(s.hosts["api.stripe.com"], JSON_ENTRY_CAP as u64 + 5);
        assert!(render_text(&r).contains(&format!("    … and {} more\n", JSON_ENTRY_CAP + 5 - 20)));
        // No session line: nothing is claimed about interception or leaks.
        assert_eq!(r.interception, None);
        assert!(r.leaks.is_empty());
    }

    fn pass(seq: u64, host: &str, dst: Option<&str>) -> Line {
        Line {
            v: 2,
            seq,
            ts: "2026-11-29T07:28:19.123Z".into(),
            entry: Entry::Passthrough(PassthroughLine {
                tier: ListenerTier::Transparent,
                bytes_in: 1,
                bytes_out: 1,
                duration_ms: 1,
                dst: dst.map(str::to_string),
                ..PassthroughLine::test(host)
            }),
            prev: String::new(),
        }
    }

    fn block(seq: u64, host: &str, dst: Option<&str>) -> Line {
        Line {
            v: 2,
            seq,
            ts: "2026-11-29T07:28:19.123Z".into(),
            entry: Entry::Blocked(BlockedLine {
                tier: ListenerTier::Transparent,
                reason: "strict mode: name does not match the destination".into(),
                dst: dst.map(str::to_string),
                ..BlockedLine::test(host)
            }),
            prev: String::new(),
        }
    }

    #[test]
    fn one_name_sent_to_two_destinations_stays_two() {
        let read = LedgerRead {
            lines: vec![
                pass(1, "example.org", Some("203.0.113.10:443")),
                pass(2, "Example.ORG", Some("198.51.100.7:443")),
                pass(3, "example.org", Some("203.0.113.10:443")),
                pass(4, "registry.npmjs.org", None),
                block(5, "x.localhost", Some("203.0.113.10:443")),
            ],
            head: (5, String::new()),
            ..LedgerRead::default()
        };
        let r = build(&read, &Options::default());
        // By name, as before: the count the name's lines add up to.
        assert_eq!(r.passthrough.hosts["example.org"], 3);
        let d: Vec<(&str, Option<&str>, u64)> = r
            .passthrough
            .destinations
            .iter()
            .map(|d| (d.host.as_str(), d.dst.as_deref(), d.count))
            .collect();
        assert_eq!(
            d,
            [
                ("example.org", Some("198.51.100.7:443"), 1),
                ("example.org", Some("203.0.113.10:443"), 2),
                ("registry.npmjs.org", None, 1),
            ]
        );
        let text = render_text(&r);
        assert!(
            text.contains("passthrough: \"example.org\" → 198.51.100.7:443 (1), \"example.org\" → 203.0.113.10:443 (2), \"registry.npmjs.org\" (1)\n"),
            "{text}"
        );
        assert!(
            text.contains("blocked: \"x.localhost\" → 203.0.113.10:443 (1)\n"),
            "{text}"
        );
        // JSON adds the field beside `hosts`, and reads back.
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["passthrough"]["hosts"]["example.org"], 3);
        assert_eq!(
            json["blocked"]["destinations"],
            serde_json::json!([{"host": "x.localhost", "dst": "203.0.113.10:443", "count": 1}])
        );
        let back: Receipt = serde_json::from_value(json).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn a_receipt_without_destinations_still_reads() {
        let counts: HostCounts = serde_json::from_str(r#"{"hosts":{"example.org":2}}"#).unwrap();
        assert_eq!(counts.hosts["example.org"], 2);
        assert!(counts.destinations.is_empty());
    }

    #[test]
    fn hosts_are_normalized() {
        assert_eq!(normalize_host("API.stripe.com:443"), "api.stripe.com");
        assert_eq!(normalize_host("api.stripe.com"), "api.stripe.com");
        assert_eq!(normalize_host("[::1]:8443"), "::1");
        assert_eq!(normalize_host("API.stripe.com.:443"), "api.stripe.com");
        assert_eq!(normalize_host("::1"), "::1");
    }

    #[test]
    fn a_file_alone_is_never_verified() {
        let r = build(&LedgerRead::default(), &Options::default());
        assert_eq!(r.integrity.status, IntegrityStatus::Unverified);
        assert_eq!(
            r.integrity.reason.as_deref(),
            Some("ledger has no seals; proxy not live")
        );
    }

    fn trust(seq: u64, host: &str, service: Option<&str>, alert: &str) -> Line {
        Line {
            v: 1,
            seq,
            ts: "2026-11-29T07:28:19.123Z".into(),
            entry: Entry::TrustFailure(TrustFailureLine {
                tier: ListenerTier::Transparent,
                service: service.map(str::to_string),
                alert: alert.into(),
                ..TrustFailureLine::test(host)
            }),
            prev: String::new(),
        }
    }

    #[test]
    fn a_vendor_host_that_only_refused_fails_the_receipt() {
        let read = LedgerRead {
            lines: vec![
                req(1, "/v1/customers"),
                trust(2, "api.stripe.com", Some("stripe"), "unknown_ca"),
                trust(3, "api.github.com", Some("github"), "unknown_ca"),
                trust(4, "api.github.com", Some("github"), "bad_certificate"),
                trust(5, "example.org", None, "unknown_ca"),
            ],
            head: (5, String::new()),
            ..LedgerRead::default()
        };
        let r = build(&read, &Options::default());
        let by_host: BTreeMap<&str, &TrustFailure> = r
            .trust_failures
            .iter()
            .map(|f| (f.host.as_str(), f))
            .collect();
        // Stripe also completed a request: listed, not fatal.
        assert_eq!(by_host["api.stripe.com"].completed, 1);
        assert!(!by_host["api.stripe.com"].is_fatal());
        let github = by_host["api.github.com"];
        assert_eq!((github.refusals, github.completed), (2, 0));
        assert_eq!(github.alerts["bad_certificate"], 1);
        assert!(github.is_fatal());
        assert!(github
            .detail
            .starts_with("alerts bad_certificate (1), unknown_ca (1). Next: "));
        // An unmapped host is not a vendor: never fatal.
        assert!(!by_host["example.org"].is_fatal());
        let text = render_text(&r);
        assert!(
            text.contains("trust failure: \"api.github.com\": 2 refusal(s), 0 completed: alerts")
        );
        let verdict = evaluate(&r, &[], false);
        assert_eq!(verdict.exit_code, EXIT_UNMET);
        let fatal: Vec<&String> = verdict
            .lines
            .iter()
            .filter(|l| l.contains("refused the veris certificate"))
            .collect();
        assert_eq!(fatal.len(), 1, "{:?}", verdict.lines);
        assert!(fatal[0].contains("api.github.com") && fatal[0].contains("Next:"));
    }
}
