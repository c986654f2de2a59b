//! A client for the proxy's admin API, written against its contract (no
//! dependency on the proxy crate): `GET /events` is a server-sent event
//! stream with one event per ledger line (`id: <seq>`, `data: <line JSON>`),
//! resumable with `Last-Event-ID`; `GET /receipt` is the receipt JSON. Every
//! call carries `Authorization: Bearer <token>`. Plain HTTP only: the admin
//! listener is on loopback or reached through a forwarded port. Spoken with
//! veris's one HTTP/1 client (`veris-admin-client`); this module adds the
//! admin API's statuses and the event stream's framing.

use std::time::Duration;

use tokio::net::TcpStream;
use veris_admin_client::{Answer, ErrorKind, HttpUrl, Request};
use veris_receipt::receipt::Receipt;
use veris_receipt::Line;

/// Time allowed to connect and to receive a response head.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// An event stream silent this long is presumed dead (a dropped network
/// sends no FIN); the client reconnects and resumes from the last seq.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(45);

/// Largest receipt body accepted.
const MAX_RECEIPT: usize = 32 << 20;

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("bad admin URL {url:?}: {why}")]
    Url { url: String, why: String },
    /// Connecting, sending, or reading the answer failed (the client's
    /// error says which, and what to do).
    #[error("{0}")]
    Client(#[from] veris_admin_client::Error),
    #[error("the admin API rejected the token (HTTP {0})")]
    Unauthorized(u16),
    #[error("the admin API answered HTTP {0}")]
    Status(u16),
    #[error("the receipt is not valid JSON")]
    Json(#[source] serde_json::Error),
    #[error("the event stream was silent for {}s", IDLE_TIMEOUT.as_secs())]
    Idle,
    #[error("the event stream ended")]
    Ended,
}

impl AdminError {
    /// Short words for the header's connection state.
    pub fn short(&self) -> String {
        match self {
            AdminError::Client(e) => match e.kind() {
                ErrorKind::Connect(source) => source.to_string(),
                _ => e.what(),
            },
            other => other.to_string(),
        }
    }
}

/// Where the admin API is and how to authenticate.
#[derive(Clone, PartialEq, Eq)]
pub struct Target {
    /// `http://host:port` plus an optional path prefix, no trailing `/`.
    pub base: String,
    pub token: String,
}

impl std::fmt::Debug for Target {
    // The token is a credential: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// `url` may be `host:port` (http assumed) or `http://host:port[/prefix]`.
    pub fn new(url: &str, token: &str) -> Result<Target, AdminError> {
        let url = url.trim().trim_end_matches('/');
        let base = if url.contains("://") {
            url.to_string()
        } else {
            format!("http://{url}")
        };
        if let Err(e) = HttpUrl::parse(&base) {
            let why = match e.kind() {
                ErrorKind::Url(why) => why.clone(),
                _ => e.what(),
            };
            return Err(AdminError::Url {
                url: url.to_string(),
                why,
            });
        }
        Ok(Target {
            base,
            token: token.trim().to_string(),
        })
    }

    fn url(&self) -> HttpUrl {
        // `new` checked it; a `Target` built by hand with a bad base
        // connects to the base as written and fails there.
        HttpUrl::parse(&self.base).unwrap_or_else(|_| HttpUrl {
            authority: self.base.clone(),
            path: String::new(),
        })
    }

    /// `host:port` for display and for connecting.
    pub fn authority(&self) -> String {
        self.url().authority
    }

    async fn send(
        &self,
        path: &str,
        last_event_id: Option<u64>,
    ) -> Result<Answer<TcpStream>, AdminError> {
        let url = self.url();
        let addr = url.authority.as_str();
        let tcp =
            veris_admin_client::within(addr, CONNECT_TIMEOUT, veris_admin_client::connect(addr))
                .await?;
        let target = format!("{}{path}", url.path.trim_end_matches('/'));
        let mut req = Request::get(&target, addr).bearer(&self.token);
        if let Some(id) = last_event_id {
            req = req
                .header("accept", "text/event-stream")
                .header("last-event-id", id.to_string());
        }
        let answer = veris_admin_client::within(
            addr,
            CONNECT_TIMEOUT,
            veris_admin_client::send(tcp, addr, &req),
        )
        .await?;
        match answer.status() {
            200 => Ok(answer),
            s @ (401 | 403) => Err(AdminError::Unauthorized(s)),
            s => Err(AdminError::Status(s)),
        }
    }

    /// `GET /receipt`.
    pub async fn receipt(&self) -> Result<Receipt, AdminError> {
        let answer = self.send("/receipt", None).await?;
        let addr = self.authority();
        let body =
            veris_admin_client::within(&addr, Duration::from_secs(30), answer.body(MAX_RECEIPT))
                .await?;
        serde_json::from_slice(&body).map_err(AdminError::Json)
    }

    /// Opens `GET /events` resuming after `last_seq` (0: from the first line).
    pub async fn events(&self, last_seq: u64) -> Result<Events, AdminError> {
        let answer = self.send("/events", Some(last_seq)).await?;
        Ok(Events {
            answer,
            parser: SseParser::default(),
        })
    }
}

/// An open event stream.
pub struct Events {
    answer: Answer<TcpStream>,
    parser: SseParser,
}

impl Events {
    /// The next ledger lines: waits for at least one event, returns every
    /// event that arrived with it. Events whose data is not a ledger line
    /// (other event types, a future format) or that are over [`MAX_EVENT`]
    /// are skipped and counted in `bad`.
    pub async fn next_batch(&mut self) -> Result<(Vec<Line>, usize), AdminError> {
        loop {
            let data = match tokio::time::timeout(IDLE_TIMEOUT, self.answer.chunk()).await {
                Err(_) => return Err(AdminError::Idle),
                Ok(Ok(None)) => return Err(AdminError::Ended),
                Ok(result) => result?.unwrap_or_default(),
            };
            let skipped = self.parser.oversized();
            let events = self.parser.feed(&data);
            let skipped = self.parser.oversized() - skipped;
            if events.is_empty() && skipped == 0 {
                continue;
            }
            let mut lines = Vec::with_capacity(events.len());
            let mut bad = skipped;
            for ev in events {
                match serde_json::from_str::<Line>(&ev.data) {
                    Ok(line) => lines.push(line),
                    Err(_) => bad += 1,
                }
            }
            return Ok((lines, bad));
        }
    }
}

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
}

/// The most bytes one event may hold (a line, or an event's data lines
/// together). A ledger line is far smaller; a stream that sends more (a
/// line that never ends) is not buffered without bound: the event is
/// skipped and counted ([`SseParser::oversized`]).
pub const MAX_EVENT: usize = 8 << 20;

/// The text/event-stream framing (WHATWG HTML §9.2): fields per line,
/// `data` lines joined by `\n`, an empty line dispatches, `:` lines are
/// comments (keep-alives), `\r\n`, `\r` and `\n` all end a line.
/// Bounded: at most about twice its limit is held, however the stream runs.
#[derive(Debug)]
pub struct SseParser {
    buf: Vec<u8>,
    id: Option<String>,
    event: Option<String>,
    data: Option<String>,
    /// A `\r` ended the previous chunk: a `\n` opening this one belongs to it.
    after_cr: bool,
    limit: usize,
    /// The line being read is over the limit: its bytes are dropped.
    long_line: bool,
    /// The event being read went over the limit: it will not be dispatched.
    skipping: bool,
    oversized: usize,
}

impl Default for SseParser {
    fn default() -> SseParser {
        SseParser::with_limit(MAX_EVENT)
    }
}

impl SseParser {
    /// A parser that skips events (and lines) longer than `limit` bytes.
    pub fn with_limit(limit: usize) -> SseParser {
        SseParser {
            buf: Vec::new(),
            id: None,
            event: None,
            data: None,
            after_cr: false,
            limit,
            long_line: false,
            skipping: false,
            oversized: 0,
        }
    }

    /// Events skipped so far because they were over the limit.
    pub fn oversized(&self) -> usize {
        self.oversized
    }

    /// Bytes held for the line and event being read.
    pub fn held(&self) -> usize {
        self.buf.len() + self.data.as_ref().map_or(0, String::len)
    }

    /// Feeds bytes; returns the events they completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        let mut chunk = chunk;
        if self.after_cr && chunk.first() == Some(&b'\n') {
            chunk = &chunk[1..];
        }
        self.after_cr = false;
        let mut start = 0;
        let mut i = 0;
        while i < chunk.len() {
            let b = chunk[i];
            if b == b'\n' || b == b'\r' {
                let mut line = std::mem::take(&mut self.buf);
                line.extend_from_slice(&chunk[start..i]);
                if std::mem::take(&mut self.long_line) || line.len() > self.limit {
                    self.skip_event();
                } else {
                    self.line(&line, &mut out);
                }
                if b == b'\r' {
                    if i + 1 < chunk.len() {
                        if chunk[i + 1] == b'\n' {
                            i += 1;
                        }
                    } else {
                        self.after_cr = true;
                    }
                }
                start = i + 1;
            }
            i += 1;
        }
        let rest = &chunk[start..];
        if self.long_line || self.buf.len() + rest.len() > self.limit {
            // A line that does not end within the limit: drop what came.
            self.long_line = true;
            self.buf = Vec::new();
        } else {
            self.buf.extend_from_slice(rest);
        }
        out
    }

    /// The event being read is over the limit: drop it whole.
    fn skip_event(&mut self) {
        self.skipping = true;
        self.data = None;
        self.event = None;
    }

    fn line(&mut self, line: &[u8], out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            if std::mem::take(&mut self.skipping) {
                self.oversized += 1;
            } else if let Some(data) = self.data.take() {
                out.push(SseEvent {
                    id: self.id.clone(),
                    event: self.event.take(),
                    data,
                });
            }
            self.event = None;
            return;
        }
        if self.skipping {
            return;
        }
        if line[0] == b':' {
            return;
        }
        let line = String::from_utf8_lossy(line);
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_ref(), ""),
        };
        match field {
            // Measured after the lossy decoding, which may triple the bytes.
            "data" if self.data.as_ref().map_or(0, |d| d.len() + 1) + value.len() > self.limit => {
                self.skip_event()
            }
            "data" => match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            },
            "id" if !value.contains('\0') => self.id = Some(value.to_string()),
            "event" => self.event = Some(value.to_string()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_events_split_anywhere() {
        let stream = b": keep-alive\r\nid: 1\r\ndata: {\"a\":1}\r\n\r\nid: 2\nevent: ledger\ndata: x\ndata: y\n\n";
        for split in 0..stream.len() {
            let mut p = SseParser::default();
            let mut got = p.feed(&stream[..split]);
            got.extend(p.feed(&stream[split..]));
            assert_eq!(
                got,
                vec![
                    SseEvent {
                        id: Some("1".into()),
                        event: None,
                        data: "{\"a\":1}".into()
                    },
                    SseEvent {
                        id: Some("2".into()),
                        event: Some("ledger".into()),
                        data: "x\ny".into()
                    },
                ],
                "split at {split}"
            );
        }
    }

    #[test]
    fn events_over_the_limit_are_skipped_and_memory_stays_bounded() {
        let mut p = SseParser::with_limit(64);
        let long = "x".repeat(100);
        let stream = format!(
            "data: {long}\n\ndata: a\ndata: {}\ndata: b\n\nid: 7\ndata: ok\n\n",
            "y".repeat(60)
        );
        let got = p.feed(stream.as_bytes());
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(
            (got[0].id.as_deref(), got[0].data.as_str()),
            (Some("7"), "ok")
        );
        assert_eq!(p.oversized(), 2);
        // A line that never ends: fed 1 MB, the parser holds at most its limit.
        let mut p = SseParser::with_limit(64);
        for _ in 0..1024 {
            assert!(p.feed(&[b'z'; 1024]).is_empty());
            assert!(p.held() <= 64, "{}", p.held());
        }
        assert!(p
            .feed(b"\n\ndata: next\n\n")
            .iter()
            .any(|e| e.data == "next"));
        assert_eq!(p.oversized(), 1);
    }

    #[test]
    fn bare_cr_ends_lines_and_no_data_dispatches_nothing() {
        let mut p = SseParser::default();
        assert_eq!(p.feed(b"id: 5\r\r"), vec![]);
        let got = p.feed(b"data:z\r\r");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].id.as_deref(), Some("5"));
        assert_eq!(got[0].data, "z");
    }

    #[test]
    fn targets() {
        let t = Target::new("127.0.0.1:4567", "tok\n").unwrap();
        assert_eq!(t.base, "http://127.0.0.1:4567");
        assert_eq!(t.token, "tok");
        assert_eq!(t.authority(), "127.0.0.1:4567");
        assert!(!format!("{t:?}").contains("tok"));
        let t = Target::new("http://localhost/admin/", "t").unwrap();
        assert_eq!(t.authority(), "localhost:80");
        assert!(Target::new("https://x:1", "t").is_err());
    }
}
