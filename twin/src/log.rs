//! The request log: one row per request the twin received, per (sandbox, service).
//!
//! Ids come from one counter per (sandbox, service), start at 1, are assigned when the
//! row is recorded (so a `Vec` per service stays sorted by id) and are never reused.
//! Rows live in memory for the twin's lifetime — a `Vec` per service, unbounded on
//! purpose: the contract lets a reader page through every row with `since_id`, and a
//! twin is a test fixture whose lifetime is one run. With a log file, every row is also
//! appended as one JSON line (handed to the kernel before the response is sent) and the
//! file is reloaded on start, so a restarted twin still shows old rows and continues
//! the ids after the last one it logged.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::TwinError;

/// How a request was handled, as the contract names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Vendor traffic answered by a fixture (or a vendor-shaped 404/4xx).
    Handler,
    /// Vendor traffic answered by a fixture that declares a fault.
    Fault,
    /// `/veris/*` traffic: never vendor traffic.
    Control,
    /// Webhook deliveries made by the twin (the built-in twin makes none).
    Delivery,
}

impl Tier {
    fn parse(s: &str) -> Option<Tier> {
        match s {
            "handler" => Some(Tier::Handler),
            "fault" => Some(Tier::Fault),
            "control" => Some(Tier::Control),
            "delivery" => Some(Tier::Delivery),
            _ => None,
        }
    }
}

/// One row of `GET /veris/requests`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRow {
    pub id: u64,
    /// RFC 3339 UTC with milliseconds.
    pub ts: String,
    pub method: String,
    /// The path after `/s/{sandbox}/{service}`, without the query (queries may hold keys).
    pub path: String,
    /// `None` when the client went away before the twin answered.
    pub status: Option<u16>,
    pub tier: Tier,
    pub duration_ms: u64,
}

/// A row as written to the log file: the row plus the key it belongs to.
#[derive(Serialize, Deserialize)]
struct LogLine {
    sandbox: String,
    service: String,
    #[serde(flatten)]
    row: RequestRow,
}

#[derive(Default)]
struct ServiceLog {
    last_id: u64,
    rows: Vec<RequestRow>,
}

/// A validated `GET /veris/requests` query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestsQuery {
    pub limit: usize,
    pub descending: bool,
    pub since_id: u64,
    pub tier: Option<Tier>,
}

/// Parses the query of `/veris/requests`; the error is the 422 `detail`, naming the parameter.
pub(crate) fn parse_requests_query(
    query: &BTreeMap<String, String>,
) -> Result<RequestsQuery, String> {
    let mut q = RequestsQuery {
        limit: 50,
        descending: true,
        since_id: 0,
        tier: None,
    };
    if let Some(v) = query.get("limit") {
        q.limit = match v.parse::<usize>() {
            Ok(n) if (1..=1000).contains(&n) => n,
            _ => {
                return Err(format!(
                    "limit must be an integer between 1 and 1000, got {v:?}"
                ))
            }
        };
    }
    if let Some(v) = query.get("order") {
        q.descending = match v.as_str() {
            "asc" => false,
            "desc" => true,
            _ => return Err(format!("order must be \"asc\" or \"desc\", got {v:?}")),
        };
    }
    if let Some(v) = query.get("since_id") {
        q.since_id = v
            .parse::<u64>()
            .map_err(|_| format!("since_id must be a non-negative integer, got {v:?}"))?;
    }
    if let Some(v) = query.get("tier") {
        q.tier = Some(Tier::parse(v).ok_or_else(|| {
            format!("tier must be one of handler, fault, control, delivery, got {v:?}")
        })?);
    }
    Ok(q)
}

/// The fields of a row known before its id is assigned.
pub(crate) struct NewRow {
    pub method: String,
    pub path: String,
    pub status: Option<u16>,
    pub tier: Tier,
    pub duration_ms: u64,
}

pub(crate) struct RequestLog {
    services: HashMap<(String, String), ServiceLog>,
    file: Option<(PathBuf, File)>,
}

impl RequestLog {
    pub(crate) fn in_memory() -> RequestLog {
        RequestLog {
            services: HashMap::new(),
            file: None,
        }
    }

    /// Opens (creating if needed) the JSONL log and reloads every readable row.
    pub(crate) fn open(path: &Path) -> Result<RequestLog, TwinError> {
        let open_err = |source| TwinError::OpenLog {
            path: path.to_path_buf(),
            source,
        };
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)
            .map_err(open_err)?;
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(open_err)?;
        let mut log = RequestLog::in_memory();
        let mut skipped = 0usize;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            match serde_json::from_str::<LogLine>(line) {
                Ok(l) => {
                    let svc = log.services.entry((l.sandbox, l.service)).or_default();
                    svc.last_id = svc.last_id.max(l.row.id);
                    svc.rows.push(l.row);
                }
                Err(_) => skipped += 1,
            }
        }
        for svc in log.services.values_mut() {
            svc.rows.sort_by_key(|r| r.id);
            svc.rows.dedup_by_key(|r| r.id);
        }
        if skipped > 0 {
            tracing::warn!(path = %path.display(), skipped, "request log has unreadable lines (torn write?); they are ignored");
        }
        // A torn last line has no newline; start the next row on a line of its own.
        if !text.is_empty() && !text.ends_with('\n') {
            file.write_all(b"\n").map_err(open_err)?;
        }
        log.file = Some((path.to_path_buf(), file));
        Ok(log)
    }

    /// Records a row, assigning the next id of its (sandbox, service).
    pub(crate) fn record(&mut self, sandbox: &str, service: &str, new: NewRow) -> u64 {
        let svc = self
            .services
            .entry((sandbox.to_string(), service.to_string()))
            .or_default();
        svc.last_id += 1;
        let row = RequestRow {
            id: svc.last_id,
            ts: rfc3339_now(),
            method: new.method,
            path: new.path,
            status: new.status,
            tier: new.tier,
            duration_ms: new.duration_ms,
        };
        if let Some((path, file)) = &mut self.file {
            let line = LogLine {
                sandbox: sandbox.to_string(),
                service: service.to_string(),
                row: row.clone(),
            };
            // Serializing plain strings and numbers cannot fail; keep going if it somehow does.
            let mut text = serde_json::to_string(&line).unwrap_or_default();
            text.push('\n');
            if let Err(e) = file.write_all(text.as_bytes()) {
                // The row stays in memory; the twin keeps answering rather than failing traffic.
                tracing::warn!(path = %path.display(), error = %e, "appending to the request log failed");
            }
        }
        let id = row.id;
        svc.rows.push(row);
        id
    }

    pub(crate) fn query(&self, sandbox: &str, service: &str, q: &RequestsQuery) -> Vec<RequestRow> {
        let Some(svc) = self
            .services
            .get(&(sandbox.to_string(), service.to_string()))
        else {
            return Vec::new();
        };
        // Rows are sorted by id, so the rows after `since_id` are a suffix.
        let start = svc.rows.partition_point(|r| r.id <= q.since_id);
        let rows = &svc.rows[start..];
        let keep = |r: &&RequestRow| q.tier.is_none_or(|t| r.tier == t);
        if q.descending {
            rows.iter()
                .rev()
                .filter(keep)
                .take(q.limit)
                .cloned()
                .collect()
        } else {
            rows.iter().filter(keep).take(q.limit).cloned().collect()
        }
    }
}

const RFC3339_MS: &[time::format_description::FormatItem<'static>] = time::macros::format_description!(
    "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
);

/// Now, as RFC 3339 UTC with milliseconds.
pub(crate) fn rfc3339_now() -> String {
    // Formatting a UTC timestamp with a fixed description only fails for years past 9999.
    time::OffsetDateTime::now_utc()
        .format(RFC3339_MS)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Result<RequestsQuery, String> {
        parse_requests_query(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn query_defaults_and_bounds() {
        assert_eq!(
            q(&[]),
            Ok(RequestsQuery {
                limit: 50,
                descending: true,
                since_id: 0,
                tier: None
            })
        );
        assert_eq!(q(&[("limit", "1000")]).map(|q| q.limit), Ok(1000));
        for (k, v) in [
            ("limit", "0"),
            ("limit", "1001"),
            ("limit", "x"),
            ("order", "sideways"),
            ("since_id", "-1"),
            ("tier", "nope"),
        ] {
            let err = q(&[(k, v)]).expect_err("must be rejected");
            assert!(err.starts_with(k), "{err}");
        }
    }

    #[test]
    fn ids_increase_and_queries_page() {
        let mut log = RequestLog::in_memory();
        for i in 0..10u16 {
            let tier = if i % 2 == 0 {
                Tier::Handler
            } else {
                Tier::Control
            };
            let id = log.record(
                "s",
                "stripe",
                NewRow {
                    method: "GET".into(),
                    path: "/x".into(),
                    status: Some(200),
                    tier,
                    duration_ms: 0,
                },
            );
            assert_eq!(id, u64::from(i) + 1);
        }
        assert_eq!(
            log.record(
                "s",
                "other",
                NewRow {
                    method: "GET".into(),
                    path: "/".into(),
                    status: None,
                    tier: Tier::Handler,
                    duration_ms: 0
                }
            ),
            1
        );
        let asc = log.query(
            "s",
            "stripe",
            &RequestsQuery {
                limit: 3,
                descending: false,
                since_id: 4,
                tier: None,
            },
        );
        assert_eq!(asc.iter().map(|r| r.id).collect::<Vec<_>>(), vec![5, 6, 7]);
        let desc = log.query(
            "s",
            "stripe",
            &RequestsQuery {
                limit: 2,
                descending: true,
                since_id: 0,
                tier: Some(Tier::Handler),
            },
        );
        assert_eq!(desc.iter().map(|r| r.id).collect::<Vec<_>>(), vec![9, 7]);
    }
}
