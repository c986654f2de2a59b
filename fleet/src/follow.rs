//! Following the fleet live, for `veris tui --nats`: every message on
//! `veris.ledger.>` (or one sandbox's subjects) from a start time on, then
//! each new one as the stream stores it, by one ordered consumer that the
//! client recreates after an outage from the last sequence it delivered.
//!
//! Nothing here is trusted, as in [`crate::stream_read`]: a subject that
//! does not name a sandbox and a gateway as subject tokens is reported as
//! [`Followed::Malformed`], never passed on; payloads are passed on as
//! bytes for the reader to parse (and to count what does not parse).

use std::time::Duration;

use async_nats::jetstream::consumer::pull::OrderedConfig;
use async_nats::jetstream::consumer::DeliverPolicy;
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::stream_read::Reader;
use crate::HEADER_LEDGER;

/// Messages per pull: up to 256 KiB each, so at most 8 MiB in flight.
const MAX_BATCH: i64 = 32;

/// Wait before the consumer is made again after a failure.
const RETRY: Duration = Duration::from_secs(1);

/// Which sandboxes to follow: one id (the server filters its subjects) or
/// a glob with `*` over the ids (every ledger subject is read, the others
/// skipped here: NATS wildcards match whole tokens only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    All,
    Id(String),
    Glob(String),
}

impl Pattern {
    /// `None` or `*`: every sandbox; letters, digits, `-` and `_`: one id;
    /// with `*` among them: a glob.
    pub fn parse(text: Option<&str>) -> Result<Pattern, String> {
        let Some(text) = text.filter(|t| *t != "*") else {
            return Ok(Pattern::All);
        };
        if !text.contains('*') {
            crate::check_token("the sandbox id", text).map_err(|e| e.to_string())?;
            return Ok(Pattern::Id(text.to_string()));
        }
        let ok = text.len() <= 64
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'*'));
        if !ok {
            return Err(format!(
                "the sandbox pattern {text:?} may hold only letters, digits, '-', '_' and '*'"
            ));
        }
        Ok(Pattern::Glob(text.to_string()))
    }

    /// The subject filter the server applies.
    pub fn subject(&self) -> String {
        match self {
            Pattern::Id(id) => crate::ledger_subject(id, "*"),
            Pattern::All | Pattern::Glob(_) => "veris.ledger.>".into(),
        }
    }

    pub fn matches(&self, sandbox: &str) -> bool {
        match self {
            Pattern::All => true,
            Pattern::Id(id) => id == sandbox,
            Pattern::Glob(g) => glob(g.as_bytes(), sandbox.as_bytes()),
        }
    }
}

/// `*` matches any run of bytes, everything else itself.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    // Where the last `*` was and the text position it was tried at.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

/// Where following starts.
#[derive(Debug, Clone, Copy)]
pub enum Start {
    /// The whole stream.
    All,
    /// Messages stored this long ago or later.
    Recent(Duration),
}

/// What the follower reports.
#[derive(Debug, Clone)]
pub enum Followed {
    /// One ledger message of a sandbox.
    Message {
        sandbox: String,
        gateway: String,
        /// `Veris-Ledger` as published (a hint: a new id is a new chain).
        ledger_id: String,
        stream_seq: u64,
        /// When the stream stored it, ms since the epoch (the server's
        /// clock, not a field anyone publishing could pick).
        stored_ms: i64,
        payload: Bytes,
    },
    /// A message on a subject that names no sandbox and gateway.
    Malformed { stream_seq: u64 },
    /// Reading works (again).
    Live,
    /// Reading failed; it is retried.
    Failed(String),
}

/// Follows `pattern` from `start` until `tx` closes.
pub async fn follow(reader: Reader, pattern: Pattern, start: Start, tx: mpsc::Sender<Followed>) {
    let mut policy = match start {
        Start::All => DeliverPolicy::All,
        Start::Recent(d) => DeliverPolicy::ByStartTime {
            start_time: time::OffsetDateTime::now_utc() - d,
        },
    };
    while !tx.is_closed() {
        let err = match follow_once(&reader, &pattern, policy, &tx).await {
            Ok(None) => return,
            Ok(Some(last)) => {
                policy = DeliverPolicy::ByStartSequence {
                    start_sequence: last + 1,
                };
                continue;
            }
            Err((last, e)) => {
                if let Some(last) = last {
                    policy = DeliverPolicy::ByStartSequence {
                        start_sequence: last + 1,
                    };
                }
                e
            }
        };
        tracing::warn!(error = %err, "following the stream failed; retrying");
        if tx.send(Followed::Failed(err)).await.is_err() {
            return;
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// One consumer's life. `Ok(None)`: the receiver is gone; otherwise the
/// last stream sequence delivered, to resume after.
async fn follow_once(
    reader: &Reader,
    pattern: &Pattern,
    policy: DeliverPolicy,
    tx: &mpsc::Sender<Followed>,
) -> Result<Option<u64>, (Option<u64>, String)> {
    let filter = pattern.subject();
    let consumer = reader
        .stream()
        .create_consumer(OrderedConfig {
            filter_subject: filter.clone(),
            deliver_policy: policy,
            max_batch: MAX_BATCH,
            ..Default::default()
        })
        .await
        .map_err(|e| (None, format!("reading {filter}: {e}")))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| (None, format!("reading {filter}: {e}")))?;
    if tx.send(Followed::Live).await.is_err() {
        return Ok(None);
    }
    let mut last = None;
    while let Some(m) = messages.next().await {
        let m = m.map_err(|e| (last, format!("reading {filter}: {e}")))?;
        let (stream_seq, stored_ms) = {
            let info = m
                .info()
                .map_err(|e| (last, format!("reading {filter}: {e}")))?;
            let ms = info.published.unix_timestamp_nanos() / 1_000_000;
            (info.stream_sequence, i64::try_from(ms).unwrap_or(0))
        };
        last = Some(stream_seq);
        let names = m
            .subject
            .as_str()
            .strip_prefix("veris.ledger.")
            .and_then(|rest| rest.split_once('.'))
            .filter(|(s, g)| {
                crate::check_token("sandbox", s).is_ok() && crate::check_token("gateway", g).is_ok()
            });
        let ev = match names {
            None => Followed::Malformed { stream_seq },
            Some((sandbox, _)) if !pattern.matches(sandbox) => continue,
            Some((sandbox, gateway)) => Followed::Message {
                sandbox: sandbox.to_string(),
                gateway: gateway.to_string(),
                ledger_id: m
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(HEADER_LEDGER))
                    .map(|v| v.as_str().to_string())
                    .unwrap_or_default(),
                stream_seq,
                stored_ms,
                payload: m.message.payload.clone(),
            },
        };
        if tx.send(ev).await.is_err() {
            return Ok(None);
        }
    }
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_parse_and_match() {
        assert_eq!(Pattern::parse(None).unwrap(), Pattern::All);
        assert_eq!(Pattern::parse(Some("*")).unwrap(), Pattern::All);
        let id = Pattern::parse(Some("sbx-a")).unwrap();
        assert_eq!(id.subject(), "veris.ledger.sbx-a.*");
        assert!(id.matches("sbx-a") && !id.matches("sbx-ab"));
        let g = Pattern::parse(Some("team-*-ci")).unwrap();
        assert_eq!(g.subject(), "veris.ledger.>");
        assert!(g.matches("team-a-ci") && g.matches("team--ci") && g.matches("team-x-y-ci"));
        assert!(!g.matches("team-a-cd") && !g.matches("xteam-a-ci"));
        assert!(Pattern::parse(Some("a.b")).is_err());
        assert!(Pattern::parse(Some("a>*")).is_err());
        assert!(Pattern::parse(Some("")).is_err());
    }
}
