//! The TUI's whole state ([`App`]) and the one place it changes
//! ([`App::update`]). Every input — a key, a frame tick carrying the wall
//! clock, a resize, a batch of ledger lines, a change of connection state, a
//! fresh receipt — is an [`Event`]; `update` applies it and may ask the event
//! loop to do something it cannot do itself ([`Action`]). Nothing here reads
//! a clock, a file or a socket, so tests drive it with plain values.
//!
//! Rows live in a ring buffer (oldest evicted and counted) keyed by ledger
//! `seq`: a line at or below the last seq seen is a duplicate (a resumed
//! stream replaying what was delivered) and is skipped, which is what makes
//! reconnects lose and duplicate nothing.

use std::collections::{BTreeMap, VecDeque};

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use veris_receipt::receipt::{Interception, Receipt};
use veris_receipt::{
    BlockedLine, PassthroughLine, RequestLine, ReservedPathLine, ResponseIncompleteLine,
    TlsAbandonedLine, TrustFailureLine, UpstreamErrorLine,
};
use veris_receipt::{Entry, Line, Mode};

use crate::filter::Filter;
use crate::layout;

/// Rows kept by default; older ones are counted as dropped.
pub const DEFAULT_CAPACITY: usize = 50_000;

/// Seconds covered by the request-rate sparkline.
pub const SPARK_SECONDS: usize = 60;

/// Latencies kept per service for the p50 (the most recent ones).
const LATENCY_WINDOW: usize = 1024;

/// Clock differences below this between the proxy and this terminal are
/// taken as none (they are mostly delivery latency).
pub const SKEW_DEADBAND_MS: i64 = 2_000;

/// Everything that can change the state.
#[derive(Debug, Clone)]
pub enum Event {
    /// A key press.
    Key(KeyEvent),
    /// A frame tick with the wall clock, milliseconds since the Unix epoch.
    Tick { now_ms: i64 },
    /// The terminal was resized.
    Resize { width: u16, height: u16 },
    /// Ledger lines, oldest first (sources coalesce many lines into one event).
    Lines(Vec<Line>),
    /// The source's connection changed.
    Connection(Connection),
    /// A fresh receipt for the header (integrity, leaks, mode).
    Receipt(Box<Receipt>),
    /// The receipt could not be fetched or built.
    ReceiptError(String),
    /// The source started over (the ledger file was replaced or truncated):
    /// forget every row, seqs start again.
    Reset(String),
}

/// What `update` asks the event loop to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Quit,
    RefreshReceipt,
}

/// Where the rows come from and whether that works right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    pub state: ConnState,
    /// What is being read: `admin 127.0.0.1:4567`, `file /x/ledger.jsonl`.
    pub via: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnState {
    Connecting,
    /// Rows are flowing (or would be, if there were traffic).
    Live,
    /// The last attempt failed; the source retries from the last seq.
    Reconnecting {
        attempt: u32,
        error: String,
    },
    /// The source gave up; the message says what to do next.
    Stopped(String),
}

/// One table row: a ledger line other than a seal.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub seq: u64,
    /// RFC 3339 as written in the ledger.
    pub ts: String,
    pub entry: Entry,
}

impl Row {
    /// Status for colouring and filtering: the HTTP status the client got.
    pub fn status(&self) -> Option<u16> {
        match &self.entry {
            Entry::Request(RequestLine { status, .. })
            | Entry::UpstreamError(UpstreamErrorLine { status, .. }) => Some(*status),
            Entry::Blocked(_) => Some(421),
            Entry::ReservedPath(ReservedPathLine { status, .. }) => Some(*status),
            Entry::Callback(c) => c.status,
            _ => None,
        }
    }

    /// The service column: the vendor service, or what kind of event it was.
    pub fn label(&self) -> &str {
        match &self.entry {
            Entry::Request(RequestLine { service, .. })
            | Entry::UpstreamError(UpstreamErrorLine { service, .. }) => service,
            Entry::Passthrough(_) => "passthrough",
            Entry::Blocked(_) => "blocked",
            Entry::TrustFailure(_) => "trust-failure",
            Entry::Session(_) => "session",
            Entry::Seal { .. } => "seal",
            Entry::Quic { .. } => "quic",
            Entry::Ech { .. } => "ech",
            Entry::ReservedPath(_) => "reserved",
            Entry::Tamper { .. } => "tamper",
            Entry::Check(_) => "check",
            Entry::RedirectChange { .. } => "rules-changed",
            Entry::UdpDropped { .. } => "udp-dropped",
            Entry::Dns { .. } => "dns",
            Entry::TlsAbandoned(_) => "tls-abandoned",
            Entry::ResponseIncomplete(ResponseIncompleteLine { service, .. }) => service,
            Entry::TunnelClose(_) => "tunnel-close",
            Entry::BodyCapture { .. } => "body-capture",
            Entry::Callback(c) => &c.service,
            Entry::CallbackDropped(d) => &d.service,
        }
    }

    /// The host the row is about, when it has one.
    pub fn host(&self) -> Option<&str> {
        match &self.entry {
            Entry::Request(RequestLine { host, .. })
            | Entry::UpstreamError(UpstreamErrorLine { host, .. })
            | Entry::Passthrough(PassthroughLine { host, .. })
            | Entry::Blocked(BlockedLine { host, .. })
            | Entry::TrustFailure(TrustFailureLine { host, .. })
            | Entry::TlsAbandoned(TlsAbandonedLine { host, .. })
            | Entry::ReservedPath(ReservedPathLine { host, .. })
            | Entry::Ech { host, .. } => Some(host),
            Entry::Quic { host, .. } => host.as_deref(),
            _ => None,
        }
    }
}

/// Per-service counters for the services panel.
#[derive(Debug, Clone)]
pub struct ServiceStats {
    pub requests: u64,
    /// Requests answered 4xx/5xx plus upstream errors.
    pub errors: u64,
    latencies: VecDeque<u64>,
    /// Requests per second, indexed by `second % SPARK_SECONDS`, with the
    /// second each slot currently counts.
    rate: [(i64, u32); SPARK_SECONDS],
}

impl Default for ServiceStats {
    fn default() -> Self {
        ServiceStats {
            requests: 0,
            errors: 0,
            latencies: VecDeque::new(),
            rate: [(i64::MIN, 0); SPARK_SECONDS],
        }
    }
}

impl ServiceStats {
    fn record(&mut self, ts_s: Option<i64>, duration_ms: Option<u64>, error: bool) {
        self.requests += 1;
        if error {
            self.errors += 1;
        }
        if let Some(d) = duration_ms {
            if self.latencies.len() == LATENCY_WINDOW {
                self.latencies.pop_front();
            }
            self.latencies.push_back(d);
        }
        if let Some(s) = ts_s {
            // rem_euclid of a positive modulus is in 0..SPARK_SECONDS.
            let slot = &mut self.rate[s.rem_euclid(SPARK_SECONDS as i64) as usize];
            if slot.0 == s {
                slot.1 += 1;
            } else if slot.0 < s {
                *slot = (s, 1);
            }
        }
    }

    /// Median of the most recent latencies.
    pub fn p50_ms(&self) -> Option<u64> {
        if self.latencies.is_empty() {
            return None;
        }
        let mut v: Vec<u64> = self.latencies.iter().copied().collect();
        let mid = v.len() / 2;
        let (_, m, _) = v.select_nth_unstable(mid);
        Some(*m)
    }

    /// Requests in each of the last [`SPARK_SECONDS`] seconds ending at
    /// `now_s`, oldest first.
    pub fn rate(&self, now_s: i64) -> [u32; SPARK_SECONDS] {
        let mut out = [0u32; SPARK_SECONDS];
        for (i, o) in out.iter_mut().enumerate() {
            let s = now_s - (SPARK_SECONDS as i64 - 1) + i as i64;
            let slot = self.rate[s.rem_euclid(SPARK_SECONDS as i64) as usize];
            if slot.0 == s {
                *o = slot.1;
            }
        }
        out
    }
}

/// Counts of the non-request kinds, for the header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KindCounts {
    pub passthrough: u64,
    pub blocked: u64,
    pub trust_failures: u64,
    pub upstream_errors: u64,
    pub quic_attempts: u64,
    pub ech: u64,
    /// Seq covered by the newest seal line.
    pub sealed_seq: Option<u64>,
}

/// What the newest session line said.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionInfo {
    pub sandbox_id: String,
    pub mode: Mode,
    pub interception: Interception,
    pub started_ms: Option<i64>,
    /// When the session's final seal (`shutdown`) was written: the proxy
    /// stopped, and the uptime stops with it.
    pub ended_ms: Option<i64>,
    pub listen: String,
}

/// The whole TUI state.
#[derive(Debug)]
pub struct App {
    pub conn: Connection,
    /// Wall clock of the last tick (ms since the epoch); render reads only this.
    pub now_ms: i64,
    /// The proxy runs on this host (a ledger file, a state dir, an admin
    /// API on loopback): its clock is ours, and nothing is estimated. An
    /// estimate from ledger lines ran slow after a quiet spell.
    pub local_clock: bool,
    /// How far the proxy's clock is ahead of ours, estimated as the largest
    /// `ts - now` seen (a line cannot be written after it arrives, so the
    /// newest lines bound the difference from below and come closest).
    /// Only lines that arrive as they are written (and the lines of the
    /// latest session only: an older session may be another proxy on
    /// another clock) can say where the proxy's clock is.
    skew_ms: Option<i64>,
    /// The next batch of lines is the backlog (the first after starting,
    /// a reset or a reconnect): written a while ago, so its `ts - now` only
    /// bounds the skew from below, and a stale bound taken as the skew would
    /// shift the clock back by the time the proxy has been quiet (uptime 26 s
    /// for a proxy up 81 s). Only a backlog line from our future counts.
    backlog: bool,
    /// Terminal size, for page moves.
    pub size: (u16, u16),
    capacity: usize,
    rows: VecDeque<Row>,
    /// Rows evicted from the ring.
    pub dropped: u64,
    /// Lines skipped because their seq was already seen.
    pub duplicates: u64,
    /// Seqs that never arrived between two that did (after the first line).
    pub gaps: u64,
    last_seq: u64,
    /// Seq of the newest line that is not a seal (fetching a receipt from a
    /// live proxy appends a seal, which must not look like new traffic).
    activity_seq: u64,
    /// Seqs of the rows that pass the filter, ascending.
    view: VecDeque<u64>,
    selected: Option<u64>,
    /// Seq of the first row shown when not following.
    top: Option<u64>,
    follow: bool,
    /// While paused the table shows rows up to this seq only.
    paused_at: Option<u64>,
    pub detail: bool,
    filter: Filter,
    /// The filter being typed after `/`; `None` when not editing.
    input: Option<String>,
    services: BTreeMap<String, ServiceStats>,
    pub counts: KindCounts,
    pub session: Option<SessionInfo>,
    pub receipt: Option<Receipt>,
    pub receipt_error: Option<String>,
    /// Why the rows were last cleared, shown until the next line arrives.
    pub notice: Option<String>,
    /// Shown inside the fleet view (`veris tui --nats`): Esc goes back.
    pub nested: bool,
}

impl App {
    /// A fresh state reading from `via`, keeping at most `capacity` rows.
    pub fn new(via: impl Into<String>, capacity: usize, now_ms: i64, size: (u16, u16)) -> App {
        App {
            conn: Connection {
                state: ConnState::Connecting,
                via: via.into(),
            },
            now_ms,
            local_clock: false,
            skew_ms: None,
            backlog: true,
            size,
            capacity: capacity.max(1),
            rows: VecDeque::new(),
            dropped: 0,
            duplicates: 0,
            gaps: 0,
            last_seq: 0,
            activity_seq: 0,
            view: VecDeque::new(),
            selected: None,
            top: None,
            follow: true,
            paused_at: None,
            detail: false,
            filter: Filter::default(),
            input: None,
            services: BTreeMap::new(),
            counts: KindCounts::default(),
            session: None,
            receipt: None,
            receipt_error: None,
            notice: None,
            nested: false,
        }
    }

    /// Applies one event; returns what the event loop must do, if anything.
    pub fn update(&mut self, event: Event) -> Option<Action> {
        match event {
            Event::Key(key) => return self.key(key),
            Event::Tick { now_ms } => self.now_ms = now_ms,
            Event::Resize { width, height } => self.size = (width, height),
            Event::Lines(lines) => {
                for line in lines {
                    self.ingest(line);
                }
                self.backlog = false;
            }
            Event::Connection(c) => {
                if c.state == ConnState::Live && self.conn.state != ConnState::Live {
                    // A (re)connected source first replays what it missed.
                    self.backlog = true;
                }
                self.conn = c;
            }
            Event::Receipt(r) => {
                self.receipt = Some(*r);
                self.receipt_error = None;
            }
            Event::ReceiptError(e) => self.receipt_error = Some(e),
            Event::Reset(why) => self.reset(why),
        }
        None
    }

    /// "Now" on the proxy's clock: the sparkline and uptime are measured
    /// against it, so a sandbox whose clock is off (a restored VM snapshot)
    /// still shows its last minute.
    pub fn ledger_now_ms(&self) -> i64 {
        match self.skew_ms {
            Some(s) if !self.local_clock && s.abs() >= SKEW_DEADBAND_MS => {
                self.now_ms.saturating_add(s)
            }
            _ => self.now_ms,
        }
    }

    /// How long the live proxy has run: from its session line (the latest
    /// one) to now on the proxy's clock.
    pub fn uptime_ms(&self) -> Option<i64> {
        let session = self.session.as_ref()?;
        let started = session.started_ms?;
        let until = session.ended_ms.unwrap_or_else(|| self.ledger_now_ms());
        Some(until.saturating_sub(started).max(0))
    }

    /// Whether the session shown has ended (its final seal is in).
    pub fn ended(&self) -> bool {
        self.session.as_ref().is_some_and(|s| s.ended_ms.is_some())
    }

    /// The seq a resumed stream must continue after.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Seq of the newest line other than a seal.
    pub fn activity_seq(&self) -> u64 {
        self.activity_seq
    }

    pub fn rows_len(&self) -> usize {
        self.rows.len()
    }

    pub fn following(&self) -> bool {
        self.follow
    }

    pub fn paused(&self) -> bool {
        self.paused_at.is_some()
    }

    pub fn filter(&self) -> &Filter {
        &self.filter
    }

    /// The filter text being edited, when `/` was pressed.
    pub fn filter_input(&self) -> Option<&str> {
        self.input.as_deref()
    }

    pub fn services(&self) -> &BTreeMap<String, ServiceStats> {
        &self.services
    }

    /// Rows that pass the filter and are not hidden by pause.
    pub fn visible_len(&self) -> usize {
        match self.paused_at {
            Some(p) => self.view.partition_point(|&s| s <= p),
            None => self.view.len(),
        }
    }

    /// Rows that arrived since pause, matching the filter.
    pub fn held_back(&self) -> usize {
        self.view.len() - self.visible_len()
    }

    /// The `i`-th visible row.
    pub fn visible_row(&self, i: usize) -> Option<&Row> {
        let seq = *self.view.get(i)?;
        self.row(seq)
    }

    fn row(&self, seq: u64) -> Option<&Row> {
        let i = self.rows.binary_search_by_key(&seq, |r| r.seq).ok()?;
        self.rows.get(i)
    }

    /// Index of the selected row among the visible ones.
    pub fn selected_index(&self) -> Option<usize> {
        let n = self.visible_len();
        if n == 0 {
            return None;
        }
        if self.follow {
            return Some(n - 1);
        }
        let seq = self.selected?;
        Some(self.view.partition_point(|&s| s < seq).min(n - 1))
    }

    pub fn selected_row(&self) -> Option<&Row> {
        self.visible_row(self.selected_index()?)
    }

    /// First visible row index of a table window `height` rows high that
    /// shows the selection: the tail when following, else from `top`,
    /// moved just enough to keep the selection in sight.
    pub fn window_start(&self, height: usize) -> usize {
        let n = self.visible_len();
        let height = height.max(1);
        let Some(sel) = self.selected_index() else {
            return 0;
        };
        if self.follow {
            return n.saturating_sub(height);
        }
        let mut start = self
            .top
            .map(|t| self.view.partition_point(|&s| s < t))
            .unwrap_or(0)
            .min(sel);
        if sel >= start + height {
            start = sel + 1 - height;
        }
        start
    }

    fn ingest(&mut self, line: Line) {
        if line.seq <= self.last_seq {
            self.duplicates += 1;
            return;
        }
        if self.last_seq > 0 && line.seq > self.last_seq + 1 {
            self.gaps += line.seq - self.last_seq - 1;
        }
        self.last_seq = line.seq;
        self.notice = None;
        let ts_ms = parse_ts_ms(&line.ts);
        if matches!(line.entry, Entry::Session(_)) {
            // A new proxy: what older lines said about the clock is void.
            self.skew_ms = None;
        }
        if let Some(t) = ts_ms {
            let candidate = t - self.now_ms;
            if !self.backlog || candidate > 0 {
                self.skew_ms = Some(self.skew_ms.map_or(candidate, |s| s.max(candidate)));
            }
        }
        match &line.entry {
            Entry::Session(s) => {
                self.session = Some(SessionInfo {
                    sandbox_id: s.sandbox_id.clone(),
                    mode: s.mode,
                    interception: Interception::of(
                        s.tier,
                        s.coverage.as_ref().and_then(|c| c.isolation.as_deref()),
                    ),
                    started_ms: ts_ms,
                    ended_ms: None,
                    listen: s.listen.clone(),
                });
            }
            Entry::Seal { reason, .. } if reason == "shutdown" => {
                if let Some(session) = self.session.as_mut() {
                    session.ended_ms = ts_ms;
                }
            }
            Entry::Request(RequestLine {
                service,
                status,
                duration_ms,
                ..
            }) => self.services.entry(service.clone()).or_default().record(
                ts_ms.map(|t| t.div_euclid(1000)),
                Some(*duration_ms),
                *status >= 400,
            ),
            Entry::UpstreamError(UpstreamErrorLine { service, .. }) => {
                self.counts.upstream_errors += 1;
                self.services.entry(service.clone()).or_default().record(
                    ts_ms.map(|t| t.div_euclid(1000)),
                    None,
                    true,
                );
            }
            Entry::Passthrough(_) => self.counts.passthrough += 1,
            Entry::Blocked(_) => self.counts.blocked += 1,
            Entry::TrustFailure(_) => self.counts.trust_failures += 1,
            Entry::Quic { attempts, .. } => self.counts.quic_attempts += attempts,
            Entry::Ech { .. } => self.counts.ech += 1,
            // Listed, never counted as vendor traffic.
            Entry::ReservedPath(_)
            | Entry::Tamper { .. }
            | Entry::Check(_)
            | Entry::RedirectChange { .. }
            | Entry::UdpDropped { .. }
            | Entry::Dns { .. }
            | Entry::TlsAbandoned(_)
            | Entry::ResponseIncomplete(_)
            | Entry::TunnelClose(_)
            | Entry::Callback(_)
            | Entry::CallbackDropped(_) => {}
            // Bookkeeping for `veris har --bodies`: neither traffic nor news.
            Entry::BodyCapture { .. } => return,
            Entry::Seal { sealed_seq, .. } => {
                // Seals arrive every second while traffic flows: counted, not listed.
                self.counts.sealed_seq = Some(*sealed_seq);
                return;
            }
        }
        self.activity_seq = line.seq;
        let row = Row {
            seq: line.seq,
            ts: line.ts,
            entry: line.entry,
        };
        let matches = self.filter.matches(&row);
        self.rows.push_back(row);
        if matches {
            self.view.push_back(line.seq);
        }
        while self.rows.len() > self.capacity {
            if let Some(old) = self.rows.pop_front() {
                self.dropped += 1;
                if self.view.front() == Some(&old.seq) {
                    self.view.pop_front();
                }
            }
        }
    }

    fn reset(&mut self, why: String) {
        self.rows.clear();
        self.view.clear();
        self.services.clear();
        self.counts = KindCounts::default();
        self.session = None;
        self.receipt = None;
        self.last_seq = 0;
        self.activity_seq = 0;
        self.skew_ms = None;
        self.backlog = true;
        self.dropped = 0;
        self.selected = None;
        self.top = None;
        self.follow = true;
        if self.paused_at.is_some() {
            self.paused_at = Some(0);
        }
        self.notice = Some(why);
    }

    fn key(&mut self, key: KeyEvent) -> Option<Action> {
        if key.kind == KeyEventKind::Release {
            return None;
        }
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Some(Action::Quit);
        }
        if let Some(input) = &mut self.input {
            match key.code {
                KeyCode::Enter => self.input = None,
                KeyCode::Esc => {
                    self.input = None;
                    self.set_filter("");
                }
                KeyCode::Backspace => {
                    input.pop();
                    let text = input.clone();
                    self.set_filter(&text);
                }
                KeyCode::Char(c) => {
                    input.push(c);
                    let text = input.clone();
                    self.set_filter(&text);
                }
                _ => {}
            }
            return None;
        }
        let page = layout::table_rows(self).max(1) as isize;
        match key.code {
            KeyCode::Char('q') => return Some(Action::Quit),
            KeyCode::Char('r') => return Some(Action::RefreshReceipt),
            KeyCode::Char('p') => {
                self.paused_at = match self.paused_at {
                    Some(_) => None,
                    None => Some(self.last_seq),
                };
            }
            KeyCode::Char('/') => self.input = Some(self.filter.text().to_string()),
            KeyCode::Enter => self.detail = !self.detail,
            KeyCode::Esc => {
                if self.detail {
                    self.detail = false;
                } else if !self.filter.is_empty() {
                    self.set_filter("");
                }
            }
            KeyCode::Down | KeyCode::Char('j') => self.move_by(1),
            KeyCode::Up | KeyCode::Char('k') => self.move_by(-1),
            KeyCode::PageDown => self.move_by(page),
            KeyCode::PageUp => self.move_by(-page),
            KeyCode::Home | KeyCode::Char('g') => self.move_to(0),
            KeyCode::End | KeyCode::Char('G') => {
                self.follow = true;
                self.top = None;
            }
            _ => {}
        }
        None
    }

    fn move_by(&mut self, delta: isize) {
        let Some(cur) = self.selected_index() else {
            return;
        };
        let target = if delta < 0 {
            cur.saturating_sub(delta.unsigned_abs())
        } else {
            cur.saturating_add(delta as usize)
        };
        self.move_to(target);
    }

    /// Selects visible row `index` (clamped); scrolling stops following.
    fn move_to(&mut self, index: usize) {
        let n = self.visible_len();
        if n == 0 {
            return;
        }
        let height = layout::table_rows(self).max(1);
        let start = self.window_start(height);
        let index = index.min(n - 1);
        self.follow = false;
        self.selected = self.view.get(index).copied();
        let start = if index < start {
            index
        } else if index >= start + height {
            index + 1 - height
        } else {
            start
        };
        self.top = self.view.get(start).copied();
    }

    fn set_filter(&mut self, text: &str) {
        self.filter = Filter::parse(text);
        self.view = self
            .rows
            .iter()
            .filter(|r| self.filter.matches(r))
            .map(|r| r.seq)
            .collect();
        self.top = None;
        if !self.follow {
            // Keep the nearest row to the old selection selected.
            if let Some(sel) = self.selected {
                let i = self.view.partition_point(|&s| s < sel);
                self.selected = self.view.get(i).or(self.view.back()).copied();
            }
        }
    }
}

/// Milliseconds since the epoch of an RFC 3339 timestamp.
pub fn parse_ts_ms(ts: &str) -> Option<i64> {
    let t = time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}
