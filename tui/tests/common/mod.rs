//! Ledger lines and receipts for the TUI tests: fixed timestamps (the app's
//! clock is injected), a real hash chain, a real receipt build.
#![allow(dead_code)]

use crossterm::event::{KeyCode, KeyEvent};
use ratatui::backend::TestBackend;
use ratatui::Terminal;
use veris_receipt::ledger::{encode, line_hash, read_bytes};
use veris_receipt::receipt::{build, Check, CheckStatus, Integrity, IntegrityStatus, Options};
use veris_receipt::{BlockedLine, PassthroughLine, RequestLine, SessionLine, TrustFailureLine};
use veris_receipt::{Entry, Line, Receipt, GENESIS_PREV, LEDGER_VERSION};
use veris_tui::app::{parse_ts_ms, App, ConnState, Connection, Event};
use veris_tui::render::render;

/// The clock every test runs at: 07:30:00 UTC; lines are written before it.
pub const NOW: &str = "2026-11-29T07:30:00.000Z";

pub fn now_ms() -> i64 {
    parse_ts_ms(NOW).unwrap()
}

/// `ms` before NOW, as the ledger writes it.
pub fn ts_before(ms: i64) -> String {
    let t = now_ms() - ms;
    let s = t.div_euclid(1000);
    let dt = time::OffsetDateTime::from_unix_timestamp(s).unwrap();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        dt.year(),
        u8::from(dt.month()),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second(),
        t.rem_euclid(1000)
    )
}

/// Lines chained from genesis: `(ms before NOW, entry)` each.
pub fn chain(entries: Vec<(i64, Entry)>) -> Vec<Line> {
    let mut prev = GENESIS_PREV.to_string();
    let mut out = Vec::new();
    for (i, (ago, entry)) in entries.into_iter().enumerate() {
        let line = Line {
            v: LEDGER_VERSION,
            seq: i as u64 + 1,
            ts: ts_before(ago),
            entry,
            prev: prev.clone(),
        };
        prev = line_hash(encode(&line).unwrap().as_bytes());
        out.push(line);
    }
    out
}

pub fn session() -> Entry {
    Entry::Session(SessionLine::test())
}

pub fn request(service: &str, method: &str, path: &str, status: u16, ms: u64) -> Entry {
    let host = match service {
        "stripe" => "api.stripe.com",
        "google-calendar" => "www.googleapis.com",
        _ => "api.github.com",
    };
    let (path, query) = match path.split_once('?') {
        Some((p, q)) => (p.to_string(), Some(q.to_string())),
        None => (path.to_string(), None),
    };
    let base = RequestLine::test(service, method, &path);
    RequestLine {
        path,
        query,
        status,
        bytes_in: if method == "POST" { 42 } else { 0 },
        bytes_out: Some(1536),
        duration_ms: ms,
        headers: vec![
            (
                "content-type".into(),
                "application/x-www-form-urlencoded".into(),
            ),
            ("user-agent".into(), "curl/7.88.1".into()),
            ("authorization".into(), "[redacted]".into()),
        ],
        host: host.into(),
        ..base
    }
    .into()
}

pub fn passthrough(host: &str) -> Entry {
    PassthroughLine {
        bytes_in: 812,
        bytes_out: 20480,
        duration_ms: 240,
        ..PassthroughLine::test(host)
    }
    .into()
}

pub fn blocked(host: &str) -> Entry {
    BlockedLine::test(host).into()
}

pub fn trust_failure(host: &str) -> Entry {
    TrustFailureLine {
        service: Some("stripe".into()),
        ..TrustFailureLine::test(host)
    }
    .into()
}

pub fn seal(seq: u64) -> Entry {
    Entry::Seal {
        sealed_seq: seq,
        signature: "00".repeat(64),
        key_id: "11".repeat(32),
        reason: "interval".into(),
    }
}

/// A busy minute: a session, two vendors with successes and failures,
/// passthrough, blocked and trust-failure events, seals.
pub fn busy() -> Vec<Line> {
    let mut entries = vec![(300_000, session())];
    let calls = [
        ("stripe", "POST", "/v1/charges", 200, 23),
        (
            "stripe",
            "GET",
            "/v1/customers?limit=3&api_key=[redacted]",
            200,
            11,
        ),
        (
            "google-calendar",
            "GET",
            "/calendar/v3/calendars/primary/events",
            200,
            35,
        ),
        ("stripe", "POST", "/v1/payment_intents", 402, 19),
        (
            "google-calendar",
            "POST",
            "/calendar/v3/calendars/primary/events",
            201,
            48,
        ),
        ("stripe", "GET", "/v1/charges/ch_3Nq", 404, 9),
        (
            "google-calendar",
            "DELETE",
            "/calendar/v3/calendars/primary/events/evt1",
            500,
            120,
        ),
    ];
    for i in 0..42i64 {
        let (svc, m, p, s, d) = calls[(i as usize) % calls.len()];
        entries.push((
            57_000 - i * 1_350,
            request(svc, m, p, s, d + (i as u64 % 5)),
        ));
        if i == 10 {
            entries.push((44_000, passthrough("pypi.org")));
        }
        if i == 20 {
            entries.push((31_000, blocked("telemetry.example.net")));
        }
        if i == 30 {
            entries.push((19_000, trust_failure("files.stripe.com")));
            entries.push((18_900, seal(38)));
        }
    }
    chain(entries)
}

/// The receipt the header shows for `lines`: built by the receipt crate,
/// with integrity and leaks fixed so snapshots do not move with the
/// receipt crate's checks.
pub fn receipt(lines: &[Line], integrity: Integrity) -> Receipt {
    let mut bytes = Vec::new();
    for l in lines {
        bytes.extend_from_slice(encode(l).unwrap().as_bytes());
        bytes.push(b'\n');
    }
    let mut r = build(&read_bytes(&bytes), &Options::default());
    r.integrity = integrity;
    r.leaks = if lines.is_empty() {
        vec![]
    } else {
        vec!["direct-egress-possible".into(), "udp-quic-possible".into()]
    };
    r
}

pub fn check(name: &str, status: CheckStatus, detail: &str) -> Check {
    Check {
        name: name.into(),
        status,
        detail: detail.into(),
    }
}

pub fn unverified() -> Integrity {
    Integrity {
        status: IntegrityStatus::Unverified,
        reason: Some("chain ok through seq 48; canary not run".into()),
        checks: vec![
            check("chain", CheckStatus::Ok, "chain ok through seq 48"),
            check("seals", CheckStatus::Ok, "sealed through seq 38"),
            check("canary", CheckStatus::Unverified, "proxy not live"),
            check(
                "twin_cross_check",
                CheckStatus::Unverified,
                "twin not reachable",
            ),
        ],
    }
}

pub fn failed() -> Integrity {
    Integrity {
        status: IntegrityStatus::Failed,
        reason: Some("chain broken at line 7: prev does not match line 6".into()),
        checks: vec![
            check(
                "chain",
                CheckStatus::Failed,
                "chain broken at line 7: prev does not match line 6",
            ),
            check("seals", CheckStatus::Ok, "sealed through seq 38"),
        ],
    }
}

pub fn live(via: &str) -> Event {
    Event::Connection(Connection {
        state: ConnState::Live,
        via: via.into(),
    })
}

pub fn key(c: char) -> Event {
    Event::Key(KeyEvent::from(KeyCode::Char(c)))
}

pub fn code(c: KeyCode) -> Event {
    Event::Key(KeyEvent::from(c))
}

/// An app of this size with `lines` applied, live on a ledger file.
pub fn app_with(lines: Vec<Line>, size: (u16, u16)) -> App {
    let mut app = App::new("file /state/ledger.jsonl", 50_000, now_ms(), size);
    app.update(live("file /state/ledger.jsonl"));
    app.update(Event::Lines(lines));
    app
}

/// The screen as text: one line per row, trailing spaces trimmed, loopback
/// ports replaced (they differ per run in real use).
pub fn screen(app: &App) -> String {
    let (w, h) = app.size;
    let mut terminal = Terminal::new(TestBackend::new(w, h)).unwrap();
    terminal.draw(|f| render(app, f)).unwrap();
    let buf = terminal.backend().buffer();
    let mut out = String::new();
    for y in 0..h {
        let mut line = String::new();
        for x in 0..w {
            line.push_str(buf[(x, y)].symbol());
        }
        out.push_str(&filter_ports(line.trim_end()));
        out.push('\n');
    }
    out
}

/// `127.0.0.1:41234` → `127.0.0.1:[port]`.
pub fn filter_ports(s: &str) -> String {
    let pat = "127.0.0.1:";
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find(pat) {
        out.push_str(&rest[..i + pat.len()]);
        rest = &rest[i + pat.len()..];
        let digits = rest.bytes().take_while(|b| b.is_ascii_digit()).count();
        if digits > 0 {
            out.push_str("[port]");
            rest = &rest[digits..];
        }
    }
    out.push_str(rest);
    out
}
