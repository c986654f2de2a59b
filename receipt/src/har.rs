//! The ledger window as a HAR 1.2 document (HTTP Archive, the format browser
//! devtools, proxies and HAR viewers read): one entry per `request` line of
//! the window a receipt covers, and one per `callback` line (a webhook
//! delivery attempt by veris to the app, the other direction: its
//! `_veris.callback` names the event; the app's answer body is never kept). It is a view of the record, never a second
//! judgement of it: the window and the integrity verdict are the receipt's
//! ([`HarBuilder::finish`] takes the built [`Receipt`]), and every field comes
//! from the ledger line or is marked unknown (`-1`, `""`, `[]`). The ledger
//! is redacted when written, so nothing here can carry more than it does.
//!
//! What the ledger does not record, and how the HAR says so: the scheme
//! (URLs are written `https://`, the vendor APIs' scheme), response headers
//! and content type (empty), header sizes (`-1`), the split of the time
//! between sending and waiting (the line's duration runs from the request
//! head to the twin's response head: all of it is `wait`, `send` and
//! `receive` are `0`, as HAR allows no `-1` there, and the timings'
//! comment says so). veris's own facts go in `_veris` fields (HAR's
//! custom-field prefix): seq, service, tier and outcome per entry; window,
//! twin and integrity for the log. Each proxy session in the window is a
//! page (`log.pages`, `pageref`), so HAR tools that group by page load it.
//!
//! Like the receipt, it is a fold ([`HarBuilder::line`]) over verified
//! lines in file order, in the same pass as the receipt's own
//! ([`crate::receipt::build_file_with`]): the HAR shows exactly the lines
//! the verdict in its comment was reached on. Only the entries are kept.

use serde::{Deserialize, Serialize};

use crate::capture::Loaded;
use crate::entry::{CallbackLine, RequestLine, ResponseIncompleteLine};
use crate::entry::{CapturedBody, Entry, Line, ListenerTier};
use crate::receipt::{IntegrityStatus, Receipt, Window};

/// The HAR version written in `log.version`.
pub const HAR_VERSION: &str = "1.2";

/// A HAR document: `{"log": …}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Har {
    pub log: Log,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Log {
    pub version: String,
    pub creator: Creator,
    /// What made the requests: not a browser, so veris says it stood
    /// between the workload's clients and the twin (HAR viewers expect it).
    pub browser: Creator,
    /// One page per proxy session in the window (a session line: a start
    /// of `veris serve`, `run` or a gateway's sandbox); each entry's
    /// `pageref` names its session.
    pub pages: Vec<Page>,
    pub entries: Vec<HarEntry>,
    /// The window and the receipt's integrity verdict, in words.
    pub comment: String,
    #[serde(rename = "_veris")]
    pub veris: LogVeris,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Creator {
    pub name: String,
    pub version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

/// A proxy session as a HAR page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Page {
    /// The session line's time.
    pub started_date_time: String,
    /// `session_<seq>` (prefixed by the gateway in a stream HAR).
    pub id: String,
    pub title: String,
    /// A proxy has no page loads: both `-1`.
    pub page_timings: PageTimings,
    /// The session line's seq (its gateway's, in a stream HAR).
    #[serde(skip)]
    pub seq: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PageTimings {
    pub on_content_load: i64,
    pub on_load: i64,
}

/// The receipt's facts about the window, as the receipt states them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogVeris {
    /// The twin's sandbox id, from the session line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub twin: Option<String>,
    pub window: Window,
    pub integrity: IntegrityStatus,
    /// Why integrity is not `verified`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub integrity_reason: Option<String>,
}

/// One request the proxy forwarded to the twin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HarEntry {
    /// The id of the page of the session the line belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pageref: Option<String>,
    /// When the request head reached the proxy: the line's time less its
    /// duration (the line is written when the twin's answer arrives).
    pub started_date_time: String,
    /// Total milliseconds: the sum of the timings that are not `-1`;
    /// fractional from a version-9 line's `duration_us`.
    pub time: f64,
    pub request: Request,
    pub response: Response,
    pub cache: Cache,
    pub timings: Timings,
    #[serde(rename = "_veris")]
    pub veris: EntryVeris,
    /// The entry's `body_capture` line, once a seal after it covers it:
    /// what [`Har::attach_bodies`] looks for in the capture dir.
    #[serde(skip)]
    pub captured: Option<Box<Bodies>>,
    /// Why the entry's bodies are not shown although a `body_capture` line
    /// names them: `body_unsealed` (no seal covers the line) or
    /// `body_altered` (two lines name this request).
    #[serde(skip)]
    pub capture_note: Option<&'static str>,
}

/// The request and response bodies a `body_capture` line names.
pub type Bodies = (CapturedBody, CapturedBody);

/// A header, query parameter or cookie.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameValue {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    pub method: String,
    pub url: String,
    pub http_version: String,
    /// Never recorded (the ledger redacts cookies): always empty.
    pub cookies: Vec<NameValue>,
    /// The request headers the ledger keeps (few, redacted), often none.
    pub headers: Vec<NameValue>,
    /// The recorded (redacted) query, split at `&` and `=`, not decoded.
    pub query_string: Vec<NameValue>,
    pub headers_size: i64,
    /// Request body bytes forwarded when the twin's answer arrived.
    pub body_size: i64,
    /// The captured request body (`veris har --bodies`), when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_data: Option<PostData>,
}

/// A captured request body: its redacted text only when the stored file is
/// the one the sealed ledger line names; `_veris` says why not, or that it
/// was cut at the cap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PostData {
    pub mime_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(rename = "_veris", default, skip_serializing_if = "Option::is_none")]
    pub veris: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Response {
    pub status: u16,
    /// The standard reason phrase of the status, `""` for others.
    pub status_text: String,
    pub http_version: String,
    pub cookies: Vec<NameValue>,
    pub headers: Vec<NameValue>,
    pub content: Content,
    #[serde(rename = "redirectURL")]
    pub redirect_url: String,
    pub headers_size: i64,
    /// The body length the twin declared, or what reached the client when
    /// the body ended short; `-1` when neither is known.
    pub body_size: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Content {
    /// The length the twin declared, `-1` when it did not.
    pub size: i64,
    pub mime_type: String,
    /// The captured (redacted) response body, as [`PostData::text`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// As [`PostData::veris`].
    #[serde(rename = "_veris", default, skip_serializing_if = "Option::is_none")]
    pub veris: Option<String>,
}

/// Nothing is cached by the proxy: `{}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cache {}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    pub send: i64,
    /// Milliseconds, fractional like [`HarEntry::time`].
    pub wait: f64,
    pub receive: i64,
    pub comment: String,
}

/// veris's own facts about an entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntryVeris {
    pub seq: u64,
    pub service: String,
    /// The listener that took the request; none for a callback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<ListenerTier>,
    /// `completed`; `client_gone` (the twin answered, the client had left);
    /// or why the body ended short (`twin_cut`, `client_gone`) when a
    /// `response_incomplete` line follows the request. For a callback:
    /// `answered`, or `no_answer` (then `response.status` is 0).
    pub outcome: String,
    /// Set on a webhook delivery by veris to the app (a `callback` line,
    /// the other direction): the entry's request is veris's, its response
    /// the app's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<CallbackVeris>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub websocket: bool,
    /// Body bytes handed to the client, when the body ended short.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered: Option<u64>,
    /// The gateway whose chain holds the line, in a HAR read from the NATS
    /// stream (`seq` is that gateway's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
}

/// A webhook delivery's own facts: the event and which attempt it was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallbackVeris {
    pub event: String,
    pub event_id: String,
    pub attempt: u32,
    /// `twin`: an event for an object the twin created for a request it
    /// served; `trigger` or `replay`: asked for by hand. Only `twin`
    /// deliveries with no `fault` count toward a callback requirement.
    pub origin: String,
    /// The fault `--webhook-faults` put on this delivery, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
    /// Why there is no answer, or why the answer was cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

const TIMINGS_COMMENT: &str = "wait: from the request head reaching the proxy to the twin's response head (sending included); send and receive are not measured apart: 0, all of it is in wait";

/// The HAR of a receipt's window, as a fold over the ledger's lines.
pub struct HarBuilder {
    service: Option<String>,
    /// The window's start as the fold stands: entries at or before it are
    /// gone (a later session line moved the latest session's start).
    since: u64,
    entries: Vec<HarEntry>,
    /// The sessions seen, oldest first.
    pages: Vec<Page>,
    /// `body_capture` lines no seal covers yet: (the line's seq, its
    /// request's seq, the bodies).
    unsealed: Vec<(u64, u64, Box<Bodies>)>,
}

impl HarBuilder {
    /// Only `service`'s requests when given (as `veris receipt --service`).
    pub fn new(service: Option<&str>) -> HarBuilder {
        HarBuilder {
            service: service.map(str::to_string),
            since: 0,
            entries: Vec::new(),
            pages: Vec::new(),
            unsealed: Vec::new(),
        }
    }

    /// Takes the next verified line, with the receipt's window as its fold
    /// stands after that line (`since < seq <= until`, see
    /// [`crate::receipt::Builder::window_so_far`]), so both read the same
    /// lines in one pass.
    pub fn line(&mut self, line: &Line, (since, until): (u64, u64)) {
        if since > self.since {
            self.entries.retain(|e| e.veris.seq > since);
            self.since = since;
        }
        // Every session is a page for now, also one that began before the
        // window (its entries in the window name it); [`Self::finish`]
        // keeps the pages the window needs.
        if let Entry::Session(s) = &line.entry {
            self.pages.push(session_page(line, s));
        }
        if line.seq <= since || line.seq > until {
            return;
        }
        let before = self.entries.len();
        self.fold(line);
        if self.entries.len() > before {
            let page = self.pages.last().map(|p| p.id.clone());
            if let Some(e) = self.entries.last_mut() {
                e.pageref = page;
            }
        }
    }

    /// [`HarBuilder::line`]'s work on a line of the window.
    fn fold(&mut self, line: &Line) {
        let wanted = |s: &str| self.service.as_deref().is_none_or(|w| w == s);
        match &line.entry {
            Entry::Request(RequestLine {
                service,
                host,
                method,
                path,
                query,
                status,
                http,
                tier,
                bytes_in,
                bytes_out,
                duration_ms,
                duration_us,
                headers,
                websocket,
                client_gone,
                ..
            }) if wanted(service) => {
                let duration = millis(*duration_ms, *duration_us);
                let declared = bytes_out.map_or(-1, size);
                self.entries.push(HarEntry {
                    pageref: None,
                    started_date_time: started(&line.ts, *duration_ms),
                    time: duration,
                    request: Request {
                        method: method.clone(),
                        url: url(host, path, query.as_deref()),
                        http_version: http.clone(),
                        cookies: Vec::new(),
                        headers: headers
                            .iter()
                            .map(|(name, value)| NameValue {
                                name: name.clone(),
                                value: value.clone(),
                            })
                            .collect(),
                        query_string: query.as_deref().map(query_string).unwrap_or_default(),
                        headers_size: -1,
                        body_size: size(*bytes_in),
                        post_data: None,
                    },
                    response: Response {
                        status: *status,
                        status_text: status_text(*status).to_string(),
                        http_version: http.clone(),
                        cookies: Vec::new(),
                        headers: Vec::new(),
                        content: Content {
                            size: declared,
                            mime_type: String::new(),
                            text: None,
                            veris: None,
                        },
                        redirect_url: String::new(),
                        headers_size: -1,
                        body_size: declared,
                    },
                    cache: Cache {},
                    timings: Timings {
                        send: 0,
                        wait: duration,
                        receive: 0,
                        comment: TIMINGS_COMMENT.into(),
                    },
                    veris: EntryVeris {
                        seq: line.seq,
                        service: service.clone(),
                        tier: Some(*tier),
                        callback: None,
                        outcome: if *client_gone {
                            "client_gone".into()
                        } else {
                            "completed".into()
                        },
                        websocket: *websocket,
                        delivered: None,
                        gateway: None,
                    },
                    captured: None,
                    capture_note: None,
                });
            }
            Entry::Callback(c) if wanted(&c.service) => self.entries.push(callback_entry(line, c)),
            // Follows its request line: what the client actually got.
            Entry::ResponseIncomplete(ResponseIncompleteLine {
                of, bytes, reason, ..
            }) => {
                if let Ok(i) = self.entries.binary_search_by_key(of, |e| e.veris.seq) {
                    let e = &mut self.entries[i];
                    e.veris.outcome = reason.clone();
                    e.veris.delivered = Some(*bytes);
                    e.response.body_size = size(*bytes);
                }
            }
            // Bodies count only once a seal covers their line: a line
            // appended after the last seal (by anyone who can write the
            // file) must not put a body of its choosing on a sealed request.
            // A second line for the same request makes both suspect.
            Entry::BodyCapture {
                of,
                request,
                response,
            } => {
                if let Ok(i) = self.entries.binary_search_by_key(of, |e| e.veris.seq) {
                    let e = &mut self.entries[i];
                    if e.captured.is_some() || self.unsealed.iter().any(|u| u.1 == *of) {
                        // Kept for its sizes only: the note hides the text.
                        e.captured = Some(Box::new((request.clone(), response.clone())));
                        e.capture_note = Some("body_altered");
                        self.unsealed.retain(|u| u.1 != *of);
                    } else if e.capture_note.is_none() {
                        self.unsealed.push((
                            line.seq,
                            *of,
                            Box::new((request.clone(), response.clone())),
                        ));
                    }
                }
            }
            Entry::Seal { sealed_seq, .. } => {
                let (covered, rest) = std::mem::take(&mut self.unsealed)
                    .into_iter()
                    .partition(|u| u.0 <= *sealed_seq);
                self.unsealed = rest;
                for (_, of, bodies) in covered {
                    if let Ok(i) = self.entries.binary_search_by_key(&of, |e| e.veris.seq) {
                        self.entries[i].captured = Some(bodies);
                    }
                }
            }
            _ => {}
        }
    }

    /// The HAR, with `receipt`'s window and integrity verdict: the receipt
    /// built from the same lines.
    pub fn finish(mut self, receipt: &Receipt) -> Har {
        for (_, of, bodies) in std::mem::take(&mut self.unsealed) {
            if let Ok(i) = self.entries.binary_search_by_key(&of, |e| e.veris.seq) {
                self.entries[i].captured = Some(bodies);
                self.entries[i].capture_note = Some("body_unsealed");
            }
        }
        let w = receipt.window;
        self.entries
            .retain(|e| e.veris.seq > w.since_seq && e.veris.seq <= w.until_seq);
        // The window's sessions, and the one its first entries belong to
        // when the window starts inside it (a baseline).
        let entries = &self.entries;
        self.pages.retain(|p| {
            (p.seq > w.since_seq && p.seq <= w.until_seq)
                || entries.iter().any(|e| e.pageref.as_deref() == Some(&p.id))
        });
        let scope = match w.scope {
            crate::receipt::Scope::Session => "latest session",
            crate::receipt::Scope::All => "whole ledger",
            crate::receipt::Scope::Baseline => "since baseline",
        };
        let comment = format!(
            "veris ledger, seq {}..={} ({scope}); integrity: {}",
            w.since_seq.saturating_add(1),
            w.until_seq,
            crate::receipt::integrity_text(&receipt.integrity)
        );
        har_of(self.pages, self.entries, comment, receipt)
    }
}

/// A session line as a HAR page.
fn session_page(line: &Line, s: &crate::entry::SessionLine) -> Page {
    Page {
        started_date_time: line.ts.clone(),
        id: format!("session_{}", line.seq),
        title: format!("veris session at seq {} (run {})", line.seq, s.run_id),
        page_timings: PageTimings {
            on_content_load: -1,
            on_load: -1,
        },
        seq: line.seq,
    }
}

const CALLBACK_TIMINGS_COMMENT: &str = "wait: from veris dialing the app to the end of its answer (or the error); send and receive are not measured apart: 0, all of it is in wait";

/// A webhook delivery attempt (a `callback` line) as an entry: veris's
/// POST to the app and the app's answer (status 0 when none came). The
/// delivery's headers and body are veris's own and not recorded; the
/// app's answer body is never kept.
fn callback_entry(line: &Line, c: &CallbackLine) -> HarEntry {
    let duration = millis(c.duration_ms, c.duration_us);
    let status = c.status.unwrap_or(0);
    let scheme = if c.tls { "https" } else { "http" };
    let target = match &c.query {
        Some(q) => format!("{scheme}://{}{}?{q}", c.target, c.path),
        None => format!("{scheme}://{}{}", c.target, c.path),
    };
    HarEntry {
        pageref: None,
        started_date_time: started(&line.ts, c.duration_ms),
        time: duration,
        request: Request {
            method: c.method.clone(),
            url: target,
            http_version: "HTTP/1.1".into(),
            cookies: Vec::new(),
            headers: Vec::new(),
            query_string: c.query.as_deref().map(query_string).unwrap_or_default(),
            headers_size: -1,
            body_size: -1,
            post_data: None,
        },
        response: Response {
            status,
            status_text: status_text(status).to_string(),
            http_version: if c.status.is_some() {
                "HTTP/1.1".into()
            } else {
                String::new()
            },
            cookies: Vec::new(),
            headers: Vec::new(),
            content: Content {
                size: -1,
                mime_type: String::new(),
                text: None,
                veris: None,
            },
            redirect_url: String::new(),
            headers_size: -1,
            body_size: -1,
        },
        cache: Cache {},
        timings: Timings {
            send: 0,
            wait: duration,
            receive: 0,
            comment: CALLBACK_TIMINGS_COMMENT.into(),
        },
        veris: EntryVeris {
            seq: line.seq,
            service: c.service.clone(),
            tier: None,
            outcome: if c.status.is_some() {
                "answered".into()
            } else {
                "no_answer".into()
            },
            callback: Some(CallbackVeris {
                event: c.event.clone(),
                event_id: c.event_id.clone(),
                attempt: c.attempt,
                origin: c.origin.clone(),
                fault: c.fault.clone(),
                error: c.error.clone(),
            }),
            websocket: false,
            delivered: None,
            gateway: None,
        },
        captured: None,
        capture_note: None,
    }
}

/// A HAR of `entries` under `receipt`'s window and verdict.
fn har_of(pages: Vec<Page>, entries: Vec<HarEntry>, comment: String, receipt: &Receipt) -> Har {
    Har {
        log: Log {
            version: HAR_VERSION.into(),
            creator: Creator {
                name: "veris".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                comment: None,
            },
            browser: Creator {
                name: "veris".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                comment: Some("an interception proxy: the requests are what it forwarded for the workload's own clients".into()),
            },
            pages,
            entries,
            comment,
            veris: LogVeris {
                twin: receipt.twin.clone(),
                window: receipt.window,
                integrity: receipt.integrity.status,
                integrity_reason: receipt.integrity.reason.clone(),
            },
        },
    }
}

/// One HAR of several gateways' HARs of the same sandbox (read from the
/// NATS stream): every entry tagged with its gateway, all in time order,
/// under `receipt`'s window and verdict (the merged receipt of the same
/// chains), the comment naming where the lines came from.
pub fn merged(parts: Vec<(String, Har)>, receipt: &Receipt, source: &str) -> Har {
    let mut pages = Vec::new();
    let mut entries: Vec<HarEntry> = Vec::new();
    for (gateway, har) in parts {
        // Each gateway numbers its own sessions: ids get its name.
        pages.extend(har.log.pages.into_iter().map(|mut p| {
            p.id = format!("{gateway}.{}", p.id);
            p
        }));
        entries.extend(har.log.entries.into_iter().map(|mut e| {
            e.pageref = e.pageref.map(|p| format!("{gateway}.{p}"));
            e.veris.gateway = Some(gateway.clone());
            e
        }));
    }
    pages.sort_by(|a, b| (&a.started_date_time, &a.id).cmp(&(&b.started_date_time, &b.id)));
    // RFC 3339 times of one format sort as text; ties by gateway and seq.
    entries.sort_by(|a, b| {
        (&a.started_date_time, &a.veris.gateway, a.veris.seq).cmp(&(
            &b.started_date_time,
            &b.veris.gateway,
            b.veris.seq,
        ))
    });
    let comment = format!(
        "veris ledgers from {source}, each gateway's chain verified and windowed on its own (`_veris.gateway`, `_veris.seq`); integrity: {}",
        crate::receipt::integrity_text(&receipt.integrity)
    );
    har_of(pages, entries, comment, receipt)
}

/// Said in the log's comment when bodies are attached.
const BODIES_COMMENT: &str = "bodies come from the capture dir, redacted and cut at its caps, shown only where the file matches the SHA-256 in the sealed ledger; they are a view, never evidence for the verdict";

impl Har {
    /// Fills in each entry's captured bodies from `dir`: the redacted text
    /// where the stored file's SHA-256 is the one its sealed `body_capture`
    /// line names, otherwise no text and a `_veris` note: `body_altered`,
    /// `body_missing`, `not_captured: <why>`; a body cut at the cap is
    /// noted `truncated at N bytes`. Nothing in `dir` is trusted beyond
    /// that check.
    pub fn attach_bodies(&mut self, dir: &std::path::Path) {
        for e in &mut self.log.entries {
            if let Some(note) = e.capture_note {
                if e.captured.as_ref().is_some_and(|c| c.0.bytes > 0) {
                    e.request.post_data = Some(PostData {
                        mime_type: String::new(),
                        text: None,
                        veris: Some(note.into()),
                    });
                }
                e.response.content.veris = Some(note.into());
                continue;
            }
            let Some(captured) = e.captured.as_deref() else {
                e.response.content.veris = Some("not_captured: no body_capture line".into());
                continue;
            };
            let (request, response) = captured;
            if request.bytes > 0 {
                let (text, note) = body(dir, request);
                e.request.post_data = Some(PostData {
                    mime_type: request.mime.clone().unwrap_or_default(),
                    text,
                    veris: note,
                });
            }
            let (text, note) = body(dir, response);
            if let Some(mime) = &response.mime {
                e.response.content.mime_type = mime.clone();
            }
            e.response.content.text = text;
            e.response.content.veris = note;
        }
        self.log.comment.push_str("; ");
        self.log.comment.push_str(BODIES_COMMENT);
    }
}

/// One body's text and note for the HAR.
fn body(dir: &std::path::Path, b: &CapturedBody) -> (Option<String>, Option<String>) {
    match crate::capture::load(dir, b) {
        Loaded::Text(text) => (
            Some(text),
            b.truncated_at.map(|n| format!("truncated at {n} bytes")),
        ),
        Loaded::NotCaptured(why) => (None, Some(format!("not_captured: {why}"))),
        Loaded::Missing => (None, Some("body_missing".into())),
        Loaded::Altered => (None, Some("body_altered".into())),
    }
}

/// The HAR of `receipt`'s window over `lines` (verified, in file order),
/// for a caller that holds the lines; a file is read once for both with
/// [`crate::receipt::build_file_with`] and a [`HarBuilder`].
pub fn build<'l>(
    lines: impl IntoIterator<Item = &'l Line>,
    receipt: &Receipt,
    service: Option<&str>,
) -> Har {
    let mut b = HarBuilder::new(service);
    let w = receipt.window;
    for line in lines {
        b.line(line, (w.since_seq, w.until_seq));
    }
    b.finish(receipt)
}

fn size(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `https://host/path?query`. An IPv6 literal gets its brackets.
fn url(host: &str, path: &str, query: Option<&str>) -> String {
    let mut url = String::with_capacity(8 + host.len() + path.len() + 64);
    url.push_str("https://");
    if host.contains(':') && !host.starts_with('[') {
        url.push('[');
        url.push_str(host);
        url.push(']');
    } else {
        url.push_str(host);
    }
    if !path.starts_with('/') {
        url.push('/');
    }
    url.push_str(path);
    if let Some(q) = query.filter(|q| !q.is_empty()) {
        url.push('?');
        url.push_str(q);
    }
    url
}

/// `a=1&b&c=x=y` → `a`:`1`, `b`:``, `c`:`x=y`, as recorded (not decoded).
fn query_string(q: &str) -> Vec<NameValue> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (name, value) = p.split_once('=').unwrap_or((p, ""));
            NameValue {
                name: name.to_string(),
                value: value.to_string(),
            }
        })
        .collect()
}

/// A line's duration in HAR's milliseconds: fractional from `duration_us`
/// (version 9), else the whole `duration_ms` of an older line (0 for
/// anything under a millisecond).
fn millis(duration_ms: u64, duration_us: Option<u64>) -> f64 {
    match duration_us {
        Some(us) => us as f64 / 1000.0,
        None => duration_ms as f64,
    }
}

/// The line's time less `duration_ms`, in the ledger's form; the recorded
/// text itself when it is not RFC 3339 (a line the writer did not write).
fn started(ts: &str, duration_ms: u64) -> String {
    use time::format_description::well_known::Rfc3339;
    let Ok(at) = time::OffsetDateTime::parse(ts, &Rfc3339) else {
        return ts.to_string();
    };
    let back = time::Duration::milliseconds(i64::try_from(duration_ms).unwrap_or(i64::MAX));
    match at.checked_sub(back) {
        Some(t) => crate::ledger::format_ts(t),
        None => ts.to_string(),
    }
}

/// The standard reason phrase of the statuses a vendor API answers with.
fn status_text(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        421 => "Misdirected Request",
        422 => "Unprocessable Content",
        428 => "Precondition Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::BlockedLine;
    use crate::ledger::LedgerRead;
    use crate::receipt::{self, Options, WindowSpec};

    fn line(seq: u64, entry: Entry) -> Line {
        Line {
            v: 3,
            seq,
            ts: "2026-11-29T07:28:19.123Z".into(),
            entry,
            prev: String::new(),
        }
    }

    fn req(seq: u64, service: &str, path: &str, query: Option<&str>) -> Line {
        line(
            seq,
            Entry::Request(RequestLine {
                host: "api.stripe.com".into(),
                query: query.map(str::to_string),
                status: 201,
                http: "HTTP/2".into(),
                bytes_in: 27,
                bytes_out: Some(512),
                duration_ms: 1_250,
                upstream: "http://127.0.0.1:9/s/sbx/stripe/v1/charges".into(),
                headers: vec![("stripe-version".into(), "2024-06-20".into())],
                ..RequestLine::test(service, "POST", path)
            }),
        )
    }

    fn har_of(lines: Vec<Line>, scope: WindowSpec, service: Option<&str>) -> Har {
        let read = LedgerRead {
            head: (lines.last().map_or(0, |l| l.seq), String::new()),
            lines,
            ..LedgerRead::default()
        };
        let options = Options {
            scope,
            service: service.map(str::to_string),
            ..Options::default()
        };
        let r = receipt::build(&read, &options);
        build(&read.lines, &r, service)
    }

    fn ledger() -> Vec<Line> {
        vec![
            req(
                1,
                "stripe",
                "/v1/charges",
                Some("expand=customer&key=[redacted]&flag"),
            ),
            req(2, "github", "/repos", None),
            line(
                3,
                Entry::ResponseIncomplete(ResponseIncompleteLine {
                    bytes: 100,
                    declared: Some(512),
                    ..ResponseIncompleteLine::test(1, "stripe")
                }),
            ),
            line(
                4,
                Entry::Blocked(BlockedLine {
                    reason: "mode".into(),
                    ..BlockedLine::test("example.org")
                }),
            ),
            req(5, "stripe", "/v1/customers", None),
        ]
    }

    fn callback(seq: u64, status: Option<u16>, attempt: u32) -> Line {
        line(
            seq,
            Entry::Callback(CallbackLine {
                service: "stripe".into(),
                event: "charge.succeeded".into(),
                event_id: "evt_1".into(),
                target: "127.0.0.1:4242".into(),
                method: "POST".into(),
                path: "/webhook".into(),
                query: None,
                status,
                error: status
                    .is_none()
                    .then(|| "timeout (waiting for the answer)".into()),
                duration_ms: 7,
                duration_us: None,
                attempt,
                origin: "twin".into(),
                fault: None,
                tls: false,
            }),
        )
    }

    fn session(seq: u64) -> Line {
        line(
            seq,
            Entry::Session(crate::entry::SessionLine {
                run_id: format!("run{seq}"),
                ..crate::entry::SessionLine::test()
            }),
        )
    }

    #[test]
    fn each_session_is_a_page_and_entries_name_theirs() {
        let mut lines = vec![session(1)];
        lines.extend(ledger().into_iter().map(|mut l| {
            l.seq += 1;
            if let Entry::ResponseIncomplete(r) = &mut l.entry {
                r.of += 1;
            }
            l
        }));
        lines.push(session(7));
        lines.push(req(8, "stripe", "/v1/refunds", None));
        let all = har_of(lines.clone(), WindowSpec::All, None);
        let ids: Vec<&str> = all.log.pages.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["session_1", "session_7"]);
        let refs: Vec<(u64, Option<&str>)> = all
            .log
            .entries
            .iter()
            .map(|e| (e.veris.seq, e.pageref.as_deref()))
            .collect();
        assert_eq!(
            refs,
            [
                (2, Some("session_1")),
                (3, Some("session_1")),
                (6, Some("session_1")),
                (8, Some("session_7"))
            ]
        );
        assert!(
            all.log.pages[1].title.contains("run7"),
            "{:?}",
            all.log.pages
        );
        // The latest session: its page only.
        let latest = har_of(lines.clone(), WindowSpec::LatestSession, None);
        let ids: Vec<&str> = latest.log.pages.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["session_7"]);
        // A window starting inside a session keeps that session's page.
        let since = har_of(lines, WindowSpec::Since(4), None);
        let ids: Vec<&str> = since.log.pages.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["session_1", "session_7"]);
        let json = serde_json::to_value(&all).unwrap();
        assert_eq!(json["log"]["pages"][0]["pageTimings"]["onLoad"], -1);
        assert_eq!(json["log"]["entries"][0]["pageref"], "session_1");
        assert_eq!(json["log"]["browser"]["name"], "veris");
    }

    #[test]
    fn a_callback_attempt_is_an_entry_of_its_own_direction() {
        let mut lines = ledger();
        lines.push(callback(6, None, 1));
        lines.push(callback(7, Some(200), 2));
        let har = har_of(lines.clone(), WindowSpec::All, None);
        let seqs: Vec<u64> = har.log.entries.iter().map(|e| e.veris.seq).collect();
        assert_eq!(seqs, [1, 2, 5, 6, 7]);
        let cut = &har.log.entries[3];
        assert_eq!(cut.request.url, "http://127.0.0.1:4242/webhook");
        assert_eq!(cut.response.status, 0);
        assert_eq!(cut.veris.outcome, "no_answer");
        assert_eq!(cut.veris.tier, None);
        let c = cut.veris.callback.as_ref().expect("callback facts");
        assert_eq!((c.event.as_str(), c.attempt), ("charge.succeeded", 1));
        assert!(c.error.as_deref().unwrap().starts_with("timeout"));
        let ok = &har.log.entries[4];
        assert_eq!(ok.response.status, 200);
        assert_eq!(ok.response.status_text, "OK");
        assert_eq!(ok.veris.outcome, "answered");
        let json = serde_json::to_value(&har).unwrap();
        assert_eq!(
            json["log"]["entries"][4]["_veris"]["callback"]["origin"],
            "twin"
        );
        assert!(json["log"]["entries"][0]["_veris"]
            .get("callback")
            .is_none());
        assert_eq!(json["log"]["entries"][0]["_veris"]["tier"], "explicit");
        // `--service` narrows callbacks as it narrows requests.
        let github = har_of(lines, WindowSpec::All, Some("github"));
        assert!(github
            .log
            .entries
            .iter()
            .all(|e| e.veris.callback.is_none()));
    }

    #[test]
    fn one_entry_per_request_line_with_what_the_line_says() {
        let har = har_of(ledger(), WindowSpec::All, None);
        let log = &har.log;
        assert_eq!(log.version, "1.2");
        assert_eq!(log.creator.name, "veris");
        let seqs: Vec<u64> = log.entries.iter().map(|e| e.veris.seq).collect();
        assert_eq!(
            seqs,
            [1, 2, 5],
            "blocked and incomplete lines are not entries"
        );
        let e = &log.entries[0];
        assert_eq!(
            e.request.url,
            "https://api.stripe.com/v1/charges?expand=customer&key=[redacted]&flag"
        );
        let q: Vec<(&str, &str)> = e
            .request
            .query_string
            .iter()
            .map(|p| (p.name.as_str(), p.value.as_str()))
            .collect();
        assert_eq!(
            q,
            [("expand", "customer"), ("key", "[redacted]"), ("flag", "")]
        );
        assert_eq!(e.request.headers[0].name, "stripe-version");
        assert_eq!(e.request.body_size, 27);
        assert_eq!(e.request.headers_size, -1);
        assert!(e.request.cookies.is_empty());
        assert_eq!(
            (e.response.status, e.response.status_text.as_str()),
            (201, "Created")
        );
        assert_eq!(e.response.http_version, "HTTP/2");
        assert_eq!(e.response.content.size, 512);
        // The body ended short: what reached the client, and why.
        assert_eq!(e.response.body_size, 100);
        assert_eq!(e.veris.outcome, "twin_cut");
        assert_eq!(e.veris.delivered, Some(100));
        assert_eq!(log.entries[2].veris.outcome, "completed");
        assert_eq!(log.entries[2].response.body_size, 512);
        // Started when the head arrived: the line's time less its duration.
        assert_eq!(e.started_date_time, "2026-11-29T07:28:17.873Z");
        assert_eq!(
            (e.timings.send, e.timings.wait, e.timings.receive),
            (0, 1250.0, 0)
        );
        assert_eq!(e.time, 1250.0);
        // The receipt's verdict, not a second one.
        assert_eq!(log.veris.integrity, IntegrityStatus::Unverified);
        assert!(
            log.comment
                .starts_with("veris ledger, seq 1..=5 (whole ledger); integrity: unverified ("),
            "{}",
            log.comment
        );
    }

    /// A body is shown only once a seal covers its `body_capture` line: a
    /// line appended after the last seal (the workload's, naming a file it
    /// planted with the right SHA-256) shows nothing, and a second line for
    /// an already captured request makes it `body_altered`.
    #[test]
    fn only_sealed_body_capture_lines_put_a_body_in_the_har() {
        let dir = std::env::temp_dir().join(format!("veris-har-seal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let stored = |name: &str, text: &str| {
            std::fs::write(dir.join(name), text).unwrap();
            CapturedBody {
                bytes: text.len() as u64,
                mime: Some("application/json".into()),
                file: Some(name.into()),
                sha256: Some(crate::hash::line_hash(text.as_bytes())),
                stored: Some(text.len() as u64),
                ..CapturedBody::default()
            }
        };
        let capture = |seq: u64, of: u64, body: CapturedBody| {
            line(
                seq,
                Entry::BodyCapture {
                    of,
                    request: body,
                    response: CapturedBody::default(),
                },
            )
        };
        let seal = |seq: u64, sealed_seq: u64| {
            line(
                seq,
                Entry::Seal {
                    sealed_seq,
                    signature: String::new(),
                    key_id: String::new(),
                    reason: "interval".into(),
                },
            )
        };
        let lines = vec![
            req(1, "stripe", "/v1/charges", None),
            capture(2, 1, stored("a.txt", r#"{"amount":1}"#)),
            req(3, "stripe", "/v1/charges", None),
            capture(4, 3, stored("b.txt", r#"{"amount":3}"#)),
            req(5, "stripe", "/v1/charges", None),
            seal(6, 5),
            // After the last seal: a second capture of 1, a first of 5.
            capture(7, 1, stored("c.txt", r#"{"amount":999999}"#)),
            capture(8, 5, stored("d.txt", r#"{"amount":999999}"#)),
        ];
        let mut har = har_of(lines, WindowSpec::All, None);
        har.attach_bodies(&dir);
        let shown = |seq: u64| {
            let e = har.log.entries.iter().find(|e| e.veris.seq == seq).unwrap();
            let post = e.request.post_data.as_ref().unwrap();
            (post.text.clone(), post.veris.clone())
        };
        assert_eq!(shown(1), (None, Some("body_altered".into())));
        assert_eq!(shown(3), (Some(r#"{"amount":3}"#.into()), None));
        assert_eq!(shown(5), (None, Some("body_unsealed".into())));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_window_and_service_narrow_it() {
        let har = har_of(ledger(), WindowSpec::Since(2), None);
        let seqs: Vec<u64> = har.log.entries.iter().map(|e| e.veris.seq).collect();
        assert_eq!(seqs, [5]);
        assert_eq!(har.log.veris.window.since_seq, 2);
        assert!(har.log.comment.contains("seq 3..=5 (since baseline)"));
        let har = har_of(ledger(), WindowSpec::All, Some("github"));
        let seqs: Vec<u64> = har.log.entries.iter().map(|e| e.veris.seq).collect();
        assert_eq!(seqs, [2]);
        // An empty window is a HAR with no entries.
        let har = har_of(ledger(), WindowSpec::Since(5), None);
        assert!(har.log.entries.is_empty());
        let json = serde_json::to_value(&har).unwrap();
        assert_eq!(json["log"]["entries"], serde_json::json!([]));
        let har = har_of(Vec::new(), WindowSpec::LatestSession, None);
        assert!(har.log.entries.is_empty());
    }

    /// A version-9 line's microseconds give fractional milliseconds (a
    /// loopback answer is not 0); an older line keeps its whole ones.
    #[test]
    fn timings_are_fractional_from_microseconds() {
        let mut fast = req(2, "stripe", "/v1/charges", None);
        if let Entry::Request(r) = &mut fast.entry {
            r.duration_ms = 0;
            r.duration_us = Some(250);
        }
        let har = har_of(vec![fast], WindowSpec::All, None);
        let e = &har.log.entries[0];
        assert_eq!((e.time, e.timings.wait), (0.25, 0.25));
        let json = serde_json::to_value(&har).unwrap();
        assert_eq!(json["log"]["entries"][0]["time"], serde_json::json!(0.25));
        assert_eq!(json["log"]["entries"][0]["timings"]["send"], 0);
        let old = req(2, "stripe", "/v1/charges", None);
        let e = &har_of(vec![old], WindowSpec::All, None).log.entries[0];
        assert_eq!((e.time, e.timings.wait), (1250.0, 1250.0));
    }

    #[test]
    fn json_has_the_har_names_and_reads_back() {
        let har = har_of(ledger(), WindowSpec::All, None);
        let json = serde_json::to_value(&har).unwrap();
        let e = &json["log"]["entries"][0];
        for key in [
            "startedDateTime",
            "time",
            "request",
            "response",
            "cache",
            "timings",
            "_veris",
        ] {
            assert!(e.get(key).is_some(), "{key}: {e}");
        }
        assert_eq!(e["cache"], serde_json::json!({}));
        assert_eq!(e["request"]["httpVersion"], "HTTP/2");
        assert!(e["request"]["queryString"].is_array());
        assert_eq!(e["response"]["redirectURL"], "");
        assert_eq!(e["response"]["content"]["mimeType"], "");
        assert_eq!(e["_veris"]["tier"], "explicit");
        assert_eq!(json["log"]["_veris"]["integrity"], "unverified");
        let back: Har = serde_json::from_value(json).unwrap();
        assert_eq!(back, har);
    }

    #[test]
    fn hostile_text_stays_valid_json() {
        let mut l = req(
            1,
            "s\"<x>",
            "/v1/\"</script>\u{0}\u{1b}\u{7f}\u{85}\u{2028}",
            Some("a=\"&b=<"),
        );
        if let Entry::Request(RequestLine { host, headers, .. }) = &mut l.entry {
            *host = "::1".into();
            headers.push(("x\"y".into(), "\u{1}\n\r\t".into()));
        }
        l.ts = "not a time\u{0}".into();
        let har = har_of(vec![l], WindowSpec::All, None);
        let e = &har.log.entries[0];
        assert!(
            e.request.url.starts_with("https://[::1]/v1/\""),
            "{}",
            e.request.url
        );
        assert_eq!(e.started_date_time, "not a time\u{0}");
        let text = serde_json::to_string(&har).unwrap();
        assert!(
            !text.bytes().any(|b| b < 0x20),
            "raw control bytes in {text:?}"
        );
        let back: Har = serde_json::from_str(&text).unwrap();
        assert_eq!(back, har);
    }

    /// One pass over a file (the receipt's fold and the HAR's together)
    /// gives the HAR the lines in memory give, on the golden ledgers (one
    /// of them has two sessions) for every window.
    #[test]
    fn one_pass_over_a_file_equals_the_whole_read() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
        let mut entries = 0;
        for name in ["basic", "empty", "evidence", "rich", "upstream-error"] {
            let path = dir.join(format!("{name}.jsonl"));
            let read = crate::ledger::read(&path).unwrap();
            let last = read.head.0;
            for scope in [
                WindowSpec::LatestSession,
                WindowSpec::All,
                WindowSpec::Since(last / 2),
            ] {
                for until in [None, Some(last / 3), Some(last + 5)] {
                    let options = Options {
                        scope,
                        until,
                        ..Options::default()
                    };
                    let mut b = HarBuilder::new(None);
                    let r = receipt::build_file_with(&path, &options, |line, fold| {
                        b.line(line, fold.window_so_far())
                    })
                    .unwrap();
                    assert_eq!(r, receipt::build(&read, &options));
                    let streamed = b.finish(&r);
                    let whole = build(&read.lines, &r, None);
                    assert_eq!(streamed, whole, "{name} {scope:?} {until:?}");
                    let requests = r.total_requests();
                    assert_eq!(
                        streamed.log.entries.len() as u64,
                        requests,
                        "{name} {scope:?} {until:?}"
                    );
                    entries += streamed.log.entries.len();
                }
            }
        }
        assert!(entries > 25, "{entries}");
    }

    #[test]
    fn urls_and_queries() {
        assert_eq!(url("h", "/p", None), "https://h/p");
        assert_eq!(url("h", "*", Some("")), "https://h/*");
        assert_eq!(url("[::1]", "/", Some("a")), "https://[::1]/?a");
        assert!(query_string("&&").is_empty());
        assert_eq!(status_text(299), "");
        assert_eq!(
            started("2026-01-01T00:00:00.000Z", 1),
            "2025-12-31T23:59:59.999Z"
        );
    }
}
