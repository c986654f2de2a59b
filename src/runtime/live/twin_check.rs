//! The twin cross-check: the twin's log after the position recorded in the
//! session line, compared with the requests the ledger forwarded, both
//! ways; and the routed services whose twins are asked.

use std::collections::BTreeMap;
use std::path::Path;

use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use veris_proxy::request::recorder::UnrecordedCounts;
use veris_receipt::receipt::{Check, CheckStatus};
use veris_receipt::{redact, Entry, RequestLine, UpstreamErrorLine};

use veris_admin_client::{call, Response};

use super::client::LIMITS;

/// Bound on the twin rows read per service (pages of 1000).
const TWIN_MAX_PAGES: usize = 100;

/// The routed services and their twin upstreams.
pub fn service_refs(router: &veris_proxy::request::route::Router) -> Vec<ServiceRef> {
    router
        .services()
        .iter()
        .map(|s| ServiceRef {
            name: s.name.clone(),
            upstream: s.upstream.clone(),
        })
        .collect()
}

#[derive(Debug, Clone, serde::Serialize, Deserialize)]
pub struct ServiceRef {
    pub name: String,
    pub upstream: String,
}

/// `(method, path)` → count: a multiset of calls.
type Calls = BTreeMap<(String, String), u64>;

/// What the ledger says per service in a window: requests forwarded to the
/// twin (`sure`), and requests the twin may or may not have executed
/// (`maybe`: a timeout, a body the client never finished, a session that
/// ended first).
#[derive(Default)]
struct Expected {
    sure: BTreeMap<String, Calls>,
    maybe: BTreeMap<String, Calls>,
}

impl Expected {
    fn add(&mut self, line: &veris_receipt::Line) {
        match &line.entry {
            Entry::Request(RequestLine {
                service,
                method,
                path,
                ..
            }) => {
                *self
                    .sure
                    .entry(service.clone())
                    .or_default()
                    .entry((method.clone(), path.clone()))
                    .or_default() += 1;
            }
            Entry::UpstreamError(UpstreamErrorLine {
                service,
                method,
                path,
                error,
                ..
            }) if veris_receipt::entry::may_have_reached_twin(error) => {
                *self
                    .maybe
                    .entry(service.clone())
                    .or_default()
                    .entry((method.clone(), path.clone()))
                    .or_default() += 1;
            }
            _ => {}
        }
    }

    /// From the file, a line at a time: lines outside the window are
    /// skipped after reading their seq.
    fn of_file(
        path: &Path,
        since: u64,
        until: u64,
    ) -> Result<Expected, veris_receipt::LedgerError> {
        let mut e = Expected::default();
        veris_receipt::ledger::scan_file(path, 0, |line, _, _| {
            if line.seq > since && line.seq <= until {
                e.add(line);
            }
        })?;
        Ok(e)
    }
}

/// Takes `n` of `(method, path)` out of `calls`; returns how many were there.
fn take(calls: &mut Calls, key: &(String, String), n: u64) -> u64 {
    let have = calls.get(key).copied().unwrap_or(0);
    let took = have.min(n);
    if have > took {
        calls.insert(key.clone(), have - took);
    } else {
        calls.remove(key);
    }
    took
}

fn describe(calls: &Calls) -> String {
    const SHOWN: usize = 5;
    let mut out: Vec<String> = calls
        .iter()
        .take(SHOWN)
        .map(|((m, p), n)| format!("{m} {p} ({n})"))
        .collect();
    if calls.len() > SHOWN {
        out.push(format!("… and {} more", calls.len() - SHOWN));
    }
    out.join(", ")
}

/// Why the twin's log holds rows the ledger has no line for, the likeliest
/// cause first (DESIGN §7a.18). The ledger's own `maybe` lines (timeouts,
/// cut bodies, a session that ended first) are matched before this is
/// asked; what is left is either a request whose line the proxy could not
/// write (it knows how many per service: `unrecorded`, when the reader is
/// the proxy's own process) or a call that never went through veris.
/// Explained by veris's own write failures → `unverified`, never a
/// direct call; anything beyond them → `failed`.
fn unexplained(
    extras: &BTreeMap<String, Calls>,
    unrecorded: Option<&UnrecordedCounts>,
) -> (CheckStatus, String) {
    let n: u64 = extras.values().flat_map(|c| c.values()).sum();
    let list: Vec<String> = extras
        .iter()
        .map(|(s, c)| format!("{s}: {}", describe(c)))
        .collect();
    let rows = format!(
        "the twin's log has {n} request(s) the ledger has no line for ({})",
        list.join("; ")
    );
    let Some(u) = unrecorded else {
        return (
            CheckStatus::Failed,
            format!(
                "{rows}: something called the twin directly, not through veris, or the proxy could not write their ledger lines (a full disk: it then answers 503 veris_ledger_unavailable and logs it; the check the proxy records when the session ends can tell which)"
            ),
        );
    };
    let explained: u64 = extras
        .iter()
        .map(|(s, c)| {
            let rows: u64 = c.values().sum();
            rows.min(u.by_service.get(s).copied().unwrap_or(0))
        })
        .sum();
    let failed_writes: u64 = u.by_service.values().sum();
    let why = u.last_error.as_deref().unwrap_or("a write error");
    if explained == n {
        return (
            CheckStatus::Unverified,
            format!(
                "{rows}: the proxy sent {failed_writes} request(s) of this session to the twin but could not write their ledger lines ({why}; it answered them 503 veris_ledger_unavailable), which most likely are these: veris's own write failure, not a direct call. Next: free space where the ledger lives (or fix the write error) and run again"
            ),
        );
    }
    let direct = n - explained;
    if explained == 0 {
        return (
            CheckStatus::Failed,
            format!(
                "{rows}: nothing on veris's side explains them (no request line of theirs failed to be written; cut bodies, timeouts and requests the session's end interrupted are accounted for): something called the twin directly, not through veris"
            ),
        );
    }
    (
        CheckStatus::Failed,
        format!(
            "{rows}: {explained} may be requests whose ledger lines the proxy could not write ({why}); the other {direct} have no explanation on veris's side: something called the twin directly, not through veris"
        ),
    )
}

/// Twin cross-check (DESIGN §7a.6): the twin's own log, after the position
/// recorded when the session started (`heads`, or a baseline's), must hold
/// exactly the requests the ledger says were forwarded in `(since, until]`,
/// by (service, method, path), in both directions:
/// - a forwarded request the twin lacks → `failed` (the ledger claims a call
///   the twin never executed);
/// - a twin row the ledger lacks → `failed` (a call the proxy never saw: the
///   workload talking to the twin directly), unless it is a request still in
///   flight at the window's edge, which `ledger` (the file, re-read a few
///   times) then shows after `until`, or a timeout the twin may have executed;
///   rows that requests the proxy could not record (`unrecorded`, known
///   only in the proxy's own process) explain make it `unverified` instead,
///   with that reason ([`unexplained`]).
///
/// A twin whose log cannot be read, or a session whose start position is
/// unknown, makes the check `unverified`, never `ok`.
///
/// The ledger file is read a line at a time; with `refresh`, it is re-read
/// for requests in flight at the window's edge.
pub async fn twin_cross_check_file(
    path: &Path,
    since: u64,
    until: u64,
    services: &[ServiceRef],
    heads: Option<&BTreeMap<String, u64>>,
    refresh: bool,
    unrecorded: Option<&UnrecordedCounts>,
) -> Check {
    match Expected::of_file(path, since, until) {
        Ok(expected) => {
            cross_check(
                expected,
                until,
                services,
                heads,
                refresh.then_some(path),
                unrecorded,
            )
            .await
        }
        Err(e) => Check {
            name: "twin_cross_check".into(),
            status: CheckStatus::Unverified,
            detail: format!("cannot read the ledger to cross-check the twin ({e})"),
        },
    }
}

/// [`twin_cross_check_file`] with the ledger's side already counted.
async fn cross_check(
    expected: Expected,
    until: u64,
    services: &[ServiceRef],
    heads: Option<&BTreeMap<String, u64>>,
    ledger: Option<&Path>,
    unrecorded: Option<&UnrecordedCounts>,
) -> Check {
    let check = |status, detail: String| Check {
        name: "twin_cross_check".into(),
        status,
        detail,
    };
    let Some(heads) = heads else {
        return check(
            CheckStatus::Unverified,
            "the twin's log position when the session started is unknown, so its rows cannot be matched to this window".into(),
        );
    };
    let mut unreadable = Vec::new();
    let mut accounted = Vec::new();
    let mut extras: BTreeMap<String, Calls> = BTreeMap::new();
    for service in services {
        let mut sure = expected
            .sure
            .get(&service.name)
            .cloned()
            .unwrap_or_default();
        let Some(after) = heads.get(&service.name) else {
            // A service the twin did not answer for at start: nothing to
            // compare with unless the ledger says it was called.
            if !sure.is_empty() {
                unreadable.push(format!(
                    "{}: its log was unreadable when the session started",
                    service.name
                ));
            }
            continue;
        };
        let mut rows = match twin_rows(&service.upstream, *after).await {
            Ok(rows) => rows,
            Err(e) => {
                unreadable.push(format!("{}: {e:#}", service.name));
                continue;
            }
        };
        let total: u64 = sure.values().sum();
        let mut missing = Calls::new();
        for (key, n) in std::mem::take(&mut sure) {
            let found = take(&mut rows, &key, n);
            if found < n {
                missing.insert(key, n - found);
            }
        }
        if !missing.is_empty() {
            return check(
                CheckStatus::Failed,
                format!(
                    "the twin's log for {} lacks request(s) the ledger says were forwarded: {}",
                    service.name,
                    describe(&missing)
                ),
            );
        }
        if let Some(maybe) = expected.maybe.get(&service.name) {
            for (key, n) in maybe {
                take(&mut rows, key, *n);
            }
        }
        if !rows.is_empty() {
            extras.insert(service.name.clone(), rows);
        }
        accounted.push(format!("{} {total}", service.name));
    }
    // Rows of requests in flight when the window closed: their ledger lines
    // follow `until` once the twin's answer reaches the proxy.
    if let Some(path) = ledger {
        for attempt in 0..5 {
            if extras.is_empty() {
                break;
            }
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            let Ok(after) = Expected::of_file(path, until, u64::MAX) else {
                break;
            };
            for (service, rows) in extras.iter_mut() {
                for calls in [after.sure.get(service), after.maybe.get(service)]
                    .into_iter()
                    .flatten()
                {
                    for (key, n) in calls {
                        take(rows, key, *n);
                    }
                }
            }
            extras.retain(|_, rows| !rows.is_empty());
        }
    }
    if !extras.is_empty() {
        let (status, detail) = unexplained(&extras, unrecorded);
        return check(status, detail);
    }
    if !unreadable.is_empty() {
        return check(
            CheckStatus::Unverified,
            format!("twin log not readable: {}", unreadable.join("; ")),
        );
    }
    check(
        CheckStatus::Ok,
        format!(
            "the twin's log matches the ledger exactly ({})",
            if accounted.is_empty() {
                "no services".to_string()
            } else {
                accounted.join(", ")
            }
        ),
    )
}

#[derive(Deserialize)]
struct TwinPage {
    requests: Vec<TwinRow>,
}

#[derive(Deserialize)]
struct TwinRow {
    id: u64,
    method: String,
    path: String,
    tier: String,
}

/// Vendor rows (`handler`, `fault`) of one twin log after id `after`,
/// counted by `(method, redacted path)` the way the ledger records them.
/// A log longer than the pages read is an error, not a partial answer.
async fn twin_rows(base: &str, after: u64) -> Result<Calls> {
    let mut out = BTreeMap::new();
    let mut since_id = after;
    for _ in 0..TWIN_MAX_PAGES {
        let url = format!("{base}/veris/requests?order=asc&limit=1000&since_id={since_id}");
        let Response { status, body } = call("GET", &url, None, LIMITS).await?;
        if status != 200 {
            bail!("GET /veris/requests answered {status}");
        }
        let page: TwinPage =
            serde_json::from_slice(&body).context("reading the twin's /veris/requests")?;
        let n = page.requests.len();
        for row in page.requests {
            if row.id <= since_id {
                bail!("the twin's /veris/requests ids are not increasing");
            }
            since_id = row.id;
            if row.tier == "handler" || row.tier == "fault" {
                *out.entry((row.method, redact::text(&row.path)))
                    .or_default() += 1;
            }
        }
        if n < 1000 {
            return Ok(out);
        }
    }
    bail!(
        "the twin's log has more than {} rows in the window",
        TWIN_MAX_PAGES * 1000
    )
}

/// The newest request id of each service's twin log, asked concurrently;
/// services whose log cannot be read are left out.
pub async fn twin_newest_ids(services: &[ServiceRef]) -> BTreeMap<String, u64> {
    let asks = services.iter().map(|s| async move {
        let url = format!("{}/veris/requests?order=desc&limit=1", s.upstream);
        match call("GET", &url, None, LIMITS).await {
            Ok(Response { status: 200, body }) => serde_json::from_slice::<TwinPage>(&body)
                .ok()
                .map(|page| (s.name.clone(), page.requests.first().map_or(0, |r| r.id))),
            _ => None,
        }
    });
    futures_util::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(service: &str, n: u64) -> BTreeMap<String, Calls> {
        let mut calls = Calls::new();
        calls.insert(("POST".into(), "/v1/customers".into()), n);
        BTreeMap::from([(service.to_string(), calls)])
    }

    fn unrecorded(service: &str, n: u64) -> UnrecordedCounts {
        UnrecordedCounts {
            by_service: BTreeMap::from([(service.to_string(), n)]),
            last_error: Some("writing ledger /s/l: No space left on device (os error 28)".into()),
        }
    }

    /// DESIGN §7a.18: twin rows that veris's own write failures explain are
    /// never called a direct call; rows beyond them are, and say so.
    #[test]
    fn rows_without_a_line_are_blamed_on_what_explains_them() {
        let (status, why) = unexplained(&rows("stripe", 2), Some(&unrecorded("stripe", 2)));
        assert_eq!(status, CheckStatus::Unverified, "{why}");
        assert!(why.contains("No space left on device"), "{why}");
        assert!(!why.contains("called the twin directly"), "{why}");

        let (status, why) = unexplained(&rows("stripe", 3), Some(&unrecorded("stripe", 1)));
        assert_eq!(status, CheckStatus::Failed, "{why}");
        assert!(
            why.contains("1 may be requests whose ledger lines"),
            "{why}"
        );
        assert!(why.contains("the other 2"), "{why}");

        // A failure for another service explains nothing here.
        let (status, why) = unexplained(&rows("stripe", 1), Some(&unrecorded("github", 4)));
        assert_eq!(status, CheckStatus::Failed, "{why}");
        assert!(
            why.contains("nothing on veris's side explains them"),
            "{why}"
        );

        // A reader outside the proxy's process cannot tell: both causes.
        let (status, why) = unexplained(&rows("stripe", 1), None);
        assert_eq!(status, CheckStatus::Failed, "{why}");
        assert!(
            why.contains("called the twin directly") && why.contains("veris_ledger_unavailable"),
            "{why}"
        );
    }
}
