//! The fleet view's state (`veris tui --nats`): one row per sandbox seen
//! on the stream, and, after Enter on one, that sandbox's own request
//! table — an [`App`] fed the same lines a ledger file would feed it.
//! Like [`App`], nothing here reads a clock, a socket or a file:
//! [`FleetApp::update`] applies [`FleetEvent`]s and may ask the loop for an
//! [`Action`].
//!
//! The stream is storage that anyone with write access could fill, so a
//! message's bytes are parsed here, line by line: what does not parse as a
//! ledger line is counted (`skipped`), never shown. Names come from
//! subjects the source checked (subject tokens) and recorded words are
//! escaped when drawn.
//!
//! Memory is bounded: per sandbox and gateway the newest `rows` lines are
//! kept (plus the chain's newest session line, for the drill-in header);
//! at most `sandboxes` sandboxes are tracked, the one idle longest is
//! forgotten (and counted) when a new one arrives; per sandbox at most
//! [`MAX_GATEWAYS`] chains and [`MAX_SERVICES`] service names (the stream
//! names them, not veris). Counters are kept for
//! every line read since the view started.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use veris_receipt::receipt::Receipt;
use veris_receipt::{Entry, Line, RequestLine};

use crate::app::{Action, App, ConnState, Connection, Event};

/// Lines kept per sandbox and gateway by default in the fleet view.
pub const DEFAULT_FLEET_ROWS: usize = 100;

/// Sandboxes tracked at most by default.
pub const DEFAULT_SANDBOXES: usize = 2_000;

/// Gateways kept per sandbox: a chain beyond them replaces the one idle
/// longest (anyone who can write to the stream can name any gateway).
pub const MAX_GATEWAYS: usize = 16;

/// Services counted by name per sandbox; more names count as [`OTHER`].
pub const MAX_SERVICES: usize = 32;

/// Where the calls of services beyond [`MAX_SERVICES`] are counted (not a
/// subject token, so no service can be named so).
pub const OTHER: &str = "(others)";

/// One ledger message as the stream stored it.
#[derive(Debug, Clone)]
pub struct Message {
    /// A subject token (the source checked it).
    pub sandbox: String,
    /// A subject token.
    pub gateway: String,
    /// `Veris-Ledger`: which chain the publisher said this is.
    pub ledger_id: String,
    /// When the stream stored it (the server's clock), ms since the epoch.
    pub stored_ms: i64,
    /// Ledger lines, each ending in `\n`.
    pub payload: Vec<u8>,
}

/// Everything that changes the fleet view.
#[derive(Debug, Clone)]
pub enum FleetEvent {
    /// A key, a tick or a resize (as for [`App`]).
    Term(Event),
    Message(Message),
    /// A message on a subject that names no sandbox: counted.
    Malformed,
    Connection(Connection),
    /// The receipt of a sandbox (asked for by [`FleetAction::Receipt`]).
    Receipt {
        sandbox: String,
        result: Result<Box<Receipt>, String>,
    },
}

impl From<Event> for FleetEvent {
    fn from(ev: Event) -> FleetEvent {
        FleetEvent::Term(ev)
    }
}

/// What the loop must do for the fleet view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FleetAction {
    Quit,
    /// Build this sandbox's receipt.
    Receipt(String),
}

/// One gateway's chain of a sandbox: its newest lines.
#[derive(Debug, Default)]
struct Chain {
    ledger_id: String,
    /// When the stream stored its newest message.
    last_ms: i64,
    lines: VecDeque<Line>,
    /// The chain's newest session line, kept out of the ring.
    session: Option<Line>,
}

/// One fleet row.
#[derive(Debug, Default)]
pub struct SandboxRow {
    pub id: String,
    gateways: BTreeMap<String, Chain>,
    /// Request lines (calls that reached the twin).
    pub requests: u64,
    /// Requests answered 4xx/5xx, and upstream errors.
    pub errors: u64,
    /// Blocked connections, trust failures and reserved paths.
    pub refused: u64,
    /// Requests per service.
    pub services: BTreeMap<String, u64>,
    /// When the stream stored this sandbox's newest message.
    pub last_ms: i64,
}

impl SandboxRow {
    pub fn gateways(&self) -> impl Iterator<Item = &str> {
        self.gateways.keys().map(String::as_str)
    }
}

/// The drill-in: one sandbox's chain on one gateway.
#[derive(Debug)]
pub struct Drill {
    pub sandbox: String,
    pub gateway: String,
    pub app: App,
}

/// The fleet view's whole state.
#[derive(Debug)]
pub struct FleetApp {
    pub conn: Connection,
    pub now_ms: i64,
    pub size: (u16, u16),
    /// Lines kept per sandbox and gateway.
    rows: usize,
    /// Sandboxes tracked at most.
    cap: usize,
    sandboxes: HashMap<String, SandboxRow>,
    /// Sandboxes forgotten to stay under the cap.
    pub forgotten: u64,
    /// Gateways' chains forgotten to stay under [`MAX_GATEWAYS`].
    pub forgotten_chains: u64,
    /// Messages read, and what could not be read from them.
    pub messages: u64,
    pub malformed_messages: u64,
    pub skipped_lines: u64,
    /// The filter (a part of the sandbox id), and the text being typed.
    filter: String,
    input: Option<String>,
    /// The selected sandbox, by id; `None` follows the top row.
    selected: Option<String>,
    pub drill: Option<Drill>,
    /// Words for where the rows come from (`nats HOST stream NAME`).
    pub via: String,
    /// The header's integrity line: what the reader can do to verify.
    pub integrity: String,
}

impl FleetApp {
    pub fn new(via: impl Into<String>, rows: usize, cap: usize, now_ms: i64) -> FleetApp {
        let via = via.into();
        FleetApp {
            conn: Connection {
                state: ConnState::Connecting,
                via: via.clone(),
            },
            now_ms,
            size: (80, 24),
            rows: rows.max(1),
            cap: cap.max(1),
            sandboxes: HashMap::new(),
            forgotten: 0,
            forgotten_chains: 0,
            messages: 0,
            malformed_messages: 0,
            skipped_lines: 0,
            filter: String::new(),
            input: None,
            selected: None,
            drill: None,
            via,
            integrity: String::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.sandboxes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sandboxes.is_empty()
    }

    pub fn filter(&self) -> &str {
        &self.filter
    }

    pub fn filter_input(&self) -> Option<&str> {
        self.input.as_deref()
    }

    /// Gateways seen across the fleet.
    pub fn gateway_count(&self) -> usize {
        let mut all: Vec<&str> = self.sandboxes.values().flat_map(|s| s.gateways()).collect();
        all.sort_unstable();
        all.dedup();
        all.len()
    }

    /// The rows that pass the filter, most recent activity first.
    pub fn view(&self) -> Vec<&SandboxRow> {
        let mut v: Vec<&SandboxRow> = self
            .sandboxes
            .values()
            .filter(|s| s.id.contains(&self.filter))
            .collect();
        v.sort_unstable_by(|a, b| b.last_ms.cmp(&a.last_ms).then_with(|| a.id.cmp(&b.id)));
        v
    }

    /// Index of the selected row in `view`.
    pub fn selected_index(&self, view: &[&SandboxRow]) -> usize {
        self.selected
            .as_ref()
            .and_then(|id| view.iter().position(|s| &s.id == id))
            .unwrap_or(0)
    }

    pub fn update(&mut self, event: FleetEvent) -> Option<FleetAction> {
        match event {
            FleetEvent::Term(Event::Key(k)) => return self.key(k),
            FleetEvent::Term(ev) => {
                if let Event::Tick { now_ms } = ev {
                    self.now_ms = now_ms;
                }
                if let Event::Resize { width, height } = ev {
                    self.size = (width, height);
                }
                if let Some(d) = &mut self.drill {
                    d.app.update(ev);
                }
            }
            FleetEvent::Message(m) => self.ingest(m),
            FleetEvent::Malformed => {
                self.messages += 1;
                self.malformed_messages += 1;
            }
            FleetEvent::Connection(c) => {
                if let Some(d) = &mut self.drill {
                    // The table keeps naming its sandbox and gateway.
                    let via = d.app.conn.via.clone();
                    d.app.update(Event::Connection(Connection {
                        state: c.state.clone(),
                        via,
                    }));
                }
                self.conn = c;
            }
            FleetEvent::Receipt { sandbox, result } => {
                if let Some(d) = self.drill.as_mut().filter(|d| d.sandbox == sandbox) {
                    d.app.update(match result {
                        Ok(r) => Event::Receipt(r),
                        Err(e) => Event::ReceiptError(e),
                    });
                }
            }
        }
        None
    }

    fn ingest(&mut self, m: Message) {
        self.messages += 1;
        let mut lines = Vec::new();
        let mut bad = 0;
        for raw in m.payload.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            match serde_json::from_slice::<Line>(raw) {
                Ok(l) => lines.push(l),
                Err(_) => bad += 1,
            }
        }
        self.skipped_lines += bad;
        if lines.is_empty() {
            self.malformed_messages += 1;
            return;
        }
        if !self.sandboxes.contains_key(&m.sandbox) && self.sandboxes.len() >= self.cap {
            self.forget_idlest();
        }
        let rows = self.rows;
        let row = self
            .sandboxes
            .entry(m.sandbox.clone())
            .or_insert_with(|| SandboxRow {
                id: m.sandbox.clone(),
                ..SandboxRow::default()
            });
        row.last_ms = row.last_ms.max(m.stored_ms);
        if !row.gateways.contains_key(&m.gateway) && row.gateways.len() >= MAX_GATEWAYS {
            let idlest = row
                .gateways
                .iter()
                .min_by_key(|(_, c)| c.last_ms)
                .map(|(g, _)| g.clone());
            if let Some(g) = idlest {
                row.gateways.remove(&g);
                self.forgotten_chains += 1;
                if self
                    .drill
                    .as_ref()
                    .is_some_and(|d| d.sandbox == m.sandbox && d.gateway == g)
                {
                    self.drill = None;
                }
            }
        }
        let chain = row.gateways.entry(m.gateway.clone()).or_default();
        chain.last_ms = chain.last_ms.max(m.stored_ms);
        let mut drilled = self
            .drill
            .as_mut()
            .filter(|d| d.sandbox == m.sandbox && d.gateway == m.gateway);
        if chain.ledger_id != m.ledger_id {
            // A new chain on the subject (the ledger was moved aside): its
            // seqs start over.
            if !chain.ledger_id.is_empty() {
                chain.lines.clear();
                chain.session = None;
                if let Some(d) = drilled.as_mut() {
                    d.app
                        .update(Event::Reset("the gateway started a new chain".into()));
                }
            }
            chain.ledger_id = m.ledger_id.clone();
        }
        for line in &lines {
            match &line.entry {
                Entry::Request(RequestLine {
                    service, status, ..
                }) => {
                    row.requests += 1;
                    if *status >= 400 {
                        row.errors += 1;
                    }
                    let name = if row.services.contains_key(service)
                        || row.services.len() < MAX_SERVICES
                    {
                        service.as_str()
                    } else {
                        OTHER
                    };
                    *row.services.entry(name.to_string()).or_default() += 1;
                }
                Entry::UpstreamError(_) => row.errors += 1,
                Entry::Blocked(_) | Entry::TrustFailure(_) | Entry::ReservedPath(_) => {
                    row.refused += 1
                }
                _ => {}
            }
        }
        for line in &lines {
            match &line.entry {
                Entry::Session(_) => chain.session = Some(line.clone()),
                // Neither rows nor news in the table.
                Entry::Seal { .. } | Entry::BodyCapture { .. } => continue,
                _ => {}
            }
            if chain.lines.len() == rows {
                chain.lines.pop_front();
            }
            chain.lines.push_back(line.clone());
        }
        if let Some(d) = drilled {
            d.app.update(Event::Lines(lines));
        }
    }

    /// Forgets the sandbox idle longest (never the one drilled into).
    fn forget_idlest(&mut self) {
        let drilled = self.drill.as_ref().map(|d| d.sandbox.as_str());
        let idlest = self
            .sandboxes
            .values()
            .filter(|s| Some(s.id.as_str()) != drilled)
            .min_by(|a, b| a.last_ms.cmp(&b.last_ms).then_with(|| b.id.cmp(&a.id)))
            .map(|s| s.id.clone());
        if let Some(id) = idlest {
            self.sandboxes.remove(&id);
            self.forgotten += 1;
        }
    }

    /// Opens `sandbox`'s chain on `gateway`: a fresh [`App`] fed the lines
    /// kept, then each new one.
    fn open(&mut self, sandbox: &str, gateway: &str) -> Option<FleetAction> {
        let row = self.sandboxes.get(sandbox)?;
        let chain = row.gateways.get(gateway)?;
        let mut app = App::new(
            format!("{} · sandbox {sandbox} via gateway {gateway}", self.via),
            self.rows,
            self.now_ms,
            self.size,
        );
        app.nested = true;
        let via = app.conn.via.clone();
        app.update(Event::Connection(Connection {
            state: self.conn.state.clone(),
            via,
        }));
        // The session line first when the ring no longer holds it.
        let first = chain.lines.front().map_or(u64::MAX, |l| l.seq);
        let mut lines: Vec<Line> = chain
            .session
            .iter()
            .filter(|s| s.seq < first)
            .cloned()
            .collect();
        lines.extend(chain.lines.iter().cloned());
        app.update(Event::Lines(lines));
        // The lines kept skip seals (and the session line may lie before
        // them): their seqs are not missing from the stream. Lines from
        // now on arrive whole, and a gap among them is one.
        app.gaps = 0;
        self.drill = Some(Drill {
            sandbox: sandbox.to_string(),
            gateway: gateway.to_string(),
            app,
        });
        Some(FleetAction::Receipt(sandbox.to_string()))
    }

    fn key(&mut self, key: KeyEvent) -> Option<FleetAction> {
        if key.kind == KeyEventKind::Release {
            return None;
        }
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Some(FleetAction::Quit);
        }
        if let Some(d) = &mut self.drill {
            let idle = !d.app.detail && d.app.filter().is_empty() && d.app.filter_input().is_none();
            match key.code {
                KeyCode::Esc if idle => {
                    self.drill = None;
                    return None;
                }
                KeyCode::Tab if d.app.filter_input().is_none() => {
                    let (sandbox, gateway) = (d.sandbox.clone(), d.gateway.clone());
                    let next = self.sandboxes.get(&sandbox).and_then(|s| {
                        s.gateways
                            .keys()
                            .find(|g| **g > gateway)
                            .or_else(|| s.gateways.keys().next())
                            .cloned()
                    });
                    return next.and_then(|g| self.open(&sandbox, &g));
                }
                _ => {}
            }
            return match d.app.update(Event::Key(key)) {
                Some(Action::Quit) => Some(FleetAction::Quit),
                Some(Action::RefreshReceipt) => Some(FleetAction::Receipt(d.sandbox.clone())),
                None => None,
            };
        }
        if let Some(input) = &mut self.input {
            match key.code {
                KeyCode::Enter => self.input = None,
                KeyCode::Esc => {
                    self.input = None;
                    self.filter.clear();
                }
                KeyCode::Backspace => {
                    input.pop();
                    self.filter = input.clone();
                }
                KeyCode::Char(c) => {
                    input.push(c);
                    self.filter = input.clone();
                }
                _ => {}
            }
            return None;
        }
        let page = usize::from(self.size.1.saturating_sub(8)).max(1);
        match key.code {
            KeyCode::Char('q') => return Some(FleetAction::Quit),
            KeyCode::Char('/') => self.input = Some(self.filter.clone()),
            KeyCode::Esc => self.filter.clear(),
            KeyCode::Down | KeyCode::Char('j') => self.move_by(1, false),
            KeyCode::Up | KeyCode::Char('k') => self.move_by(1, true),
            KeyCode::PageDown => self.move_by(page, false),
            KeyCode::PageUp => self.move_by(page, true),
            KeyCode::Home | KeyCode::Char('g') => self.selected = None,
            KeyCode::End | KeyCode::Char('G') => self.move_by(usize::MAX, false),
            KeyCode::Enter => {
                let view = self.view();
                let row = view.get(self.selected_index(&view))?;
                // The gateway that stored the newest lines first.
                let gateway = row
                    .gateways
                    .iter()
                    .max_by_key(|(_, c)| c.last_ms)
                    .map(|(g, _)| g.clone())?;
                let id = row.id.clone();
                return self.open(&id, &gateway);
            }
            _ => {}
        }
        None
    }

    fn move_by(&mut self, n: usize, up: bool) {
        let view = self.view();
        if view.is_empty() {
            return;
        }
        let cur = self.selected_index(&view);
        let to = if up {
            cur.saturating_sub(n)
        } else {
            cur.saturating_add(n).min(view.len() - 1)
        };
        self.selected = Some(view[to].id.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use veris_receipt::{SessionLine, LEDGER_VERSION};

    fn payload(entries: Vec<Entry>) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, entry) in entries.into_iter().enumerate() {
            let line = Line {
                v: LEDGER_VERSION,
                seq: i as u64 + 1,
                ts: "2026-12-04T10:00:00.000Z".into(),
                entry,
                prev: "0".repeat(64),
            };
            out.extend(serde_json::to_vec(&line).unwrap());
            out.push(b'\n');
        }
        out
    }

    fn charges(service: &str, n: usize) -> Vec<Entry> {
        (0..n)
            .map(|_| Entry::Request(RequestLine::test(service, "POST", "/v1/charges")))
            .collect()
    }

    fn msg(sandbox: &str, gateway: &str, at: i64, payload: Vec<u8>) -> FleetEvent {
        FleetEvent::Message(Message {
            sandbox: sandbox.into(),
            gateway: gateway.into(),
            ledger_id: "0123456789abcdef".into(),
            stored_ms: at,
            payload,
        })
    }

    fn key(code: KeyCode) -> FleetEvent {
        FleetEvent::Term(Event::Key(KeyEvent::from(code)))
    }

    #[test]
    fn garbage_is_counted_never_listed() {
        let mut app = FleetApp::new("t", 10, 10, 0);
        app.update(msg(
            "a",
            "gw",
            1,
            b"\x1b[2J integrity: verified\n{\"v\":5}\n".to_vec(),
        ));
        assert!(app.is_empty());
        assert_eq!((app.malformed_messages, app.skipped_lines), (1, 2));
        let mut p = payload(charges("stripe", 1));
        p.extend(b"not a line\n");
        app.update(msg("a", "gw", 2, p));
        assert_eq!(app.len(), 1);
        assert_eq!((app.malformed_messages, app.skipped_lines), (1, 3));
        app.update(FleetEvent::Malformed);
        assert_eq!((app.messages, app.malformed_messages), (3, 2));
    }

    #[test]
    fn memory_is_bounded_whatever_the_stream_names() {
        let mut app = FleetApp::new("t", 3, 2, 0);
        app.update(msg("a", "gw", 1, payload(charges("stripe", 10))));
        let row = &app.sandboxes["a"];
        assert_eq!(row.requests, 10);
        assert_eq!(row.gateways["gw"].lines.len(), 3, "the newest 3 lines kept");
        // A third sandbox: the idlest is forgotten.
        app.update(msg("b", "gw", 2, payload(charges("stripe", 1))));
        app.update(msg("c", "gw", 3, payload(charges("stripe", 1))));
        assert_eq!((app.len(), app.forgotten), (2, 1));
        assert!(!app.sandboxes.contains_key("a"));
        // Gateways and service names are the writer's to pick: capped.
        for g in 0..MAX_GATEWAYS + 4 {
            app.update(msg(
                "c",
                &format!("gw{g}"),
                4 + g as i64,
                payload(charges("s", 1)),
            ));
        }
        assert_eq!(app.sandboxes["c"].gateways.len(), MAX_GATEWAYS);
        assert_eq!(app.forgotten_chains, 5);
        let many: Vec<Entry> = (0..MAX_SERVICES + 8)
            .flat_map(|i| charges(&format!("svc{i}"), 1))
            .collect();
        app.update(msg("c", "gw9", 100, payload(many)));
        let services = &app.sandboxes["c"].services;
        assert_eq!(services.len(), MAX_SERVICES + 1);
        assert!(services[OTHER] >= 8);
    }

    #[test]
    fn newest_first_enter_opens_esc_returns_new_chain_resets() {
        let mut app = FleetApp::new("t", 50, 50, 0);
        let mut entries = vec![Entry::Session(SessionLine::test())];
        entries.extend(charges("stripe", 2));
        app.update(msg("old", "gw", 1, payload(entries.clone())));
        app.update(msg("new", "gw", 5, payload(entries)));
        let ids: Vec<&str> = app.view().iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["new", "old"]);
        assert_eq!(
            app.update(key(KeyCode::Enter)),
            Some(FleetAction::Receipt("new".into()))
        );
        let d = app.drill.as_ref().unwrap();
        assert_eq!((d.sandbox.as_str(), d.app.rows_len()), ("new", 3));
        assert!(d.app.nested);
        // Live lines of the sandbox opened reach its table.
        let mut more = payload(vec![]);
        more.extend(
            serde_json::to_vec(&Line {
                v: LEDGER_VERSION,
                seq: 4,
                ts: "2026-12-04T10:00:01.000Z".into(),
                entry: charges("stripe", 1).remove(0),
                prev: "0".repeat(64),
            })
            .unwrap(),
        );
        more.push(b'\n');
        app.update(msg("new", "gw", 6, more));
        assert_eq!(app.drill.as_ref().unwrap().app.rows_len(), 4);
        // A new chain on the subject starts the table over.
        app.update(FleetEvent::Message(Message {
            ledger_id: "fedcba9876543210".into(),
            ..match msg("new", "gw", 7, payload(charges("stripe", 1))) {
                FleetEvent::Message(m) => m,
                _ => unreachable!(),
            }
        }));
        assert_eq!(app.drill.as_ref().unwrap().app.rows_len(), 1);
        app.update(key(KeyCode::Esc));
        assert!(app.drill.is_none());
    }
}
