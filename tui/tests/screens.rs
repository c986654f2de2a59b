//! Whole-screen snapshots on ratatui's TestBackend: the states a person
//! watching the twin meets, at narrow and wide sizes.

// Test code: a failed unwrap or expect is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use crossterm::event::KeyCode;
use ratatui::style::Color;
use veris_tui::app::{ConnState, Connection, Event};

#[test]
fn empty_receipt_narrow() {
    let mut app = app_with(vec![], (80, 24));
    app.update(Event::Receipt(Box::new(receipt(&[], unverified()))));
    insta::assert_snapshot!("empty_80x24", screen(&app));
}

#[test]
fn busy_receipt_narrow() {
    let lines = busy();
    let r = receipt(&lines, unverified());
    let mut app = app_with(lines, (80, 24));
    app.update(Event::Receipt(Box::new(r)));
    insta::assert_snapshot!("busy_80x24", screen(&app));
}

#[test]
fn busy_receipt_wide() {
    let lines = busy();
    let r = receipt(&lines, unverified());
    let mut app = app_with(lines, (160, 45));
    app.update(Event::Receipt(Box::new(r)));
    insta::assert_snapshot!("busy_160x45", screen(&app));
}

#[test]
fn failed_integrity_and_reconnecting() {
    let lines = busy();
    let r = receipt(&lines, failed());
    let mut app = app_with(lines, (100, 30));
    app.update(Event::Receipt(Box::new(r)));
    app.update(Event::Connection(Connection {
        state: ConnState::Reconnecting {
            attempt: 3,
            error: "connection refused".into(),
        },
        via: "admin 127.0.0.1:43999".into(),
    }));
    let s = screen(&app);
    assert!(s.contains("integrity: FAILED — chain: chain broken at line 7"));
    assert!(s.contains("reconnecting #3: connection refused"), "{s}");
    insta::assert_snapshot!("failed_100x30", s);
}

#[test]
fn detail_pane_narrow_and_wide() {
    let lines = busy();
    let r = receipt(&lines, unverified());
    let mut app = app_with(lines, (80, 24));
    app.update(Event::Receipt(Box::new(r)));
    // Up to the GET /v1/customers call two rows above the tail's stripe POST.
    for _ in 0..6 {
        app.update(key('k'));
    }
    app.update(code(KeyCode::Enter));
    let narrow = screen(&app);
    assert!(narrow.contains("detail · seq"));
    insta::assert_snapshot!("detail_80x24", narrow);
    app.update(Event::Resize {
        width: 140,
        height: 40,
    });
    insta::assert_snapshot!("detail_140x40", screen(&app));
}

#[test]
fn filter_typing_and_applied() {
    let lines = busy();
    let r = receipt(&lines, unverified());
    let mut app = app_with(lines, (100, 30));
    app.update(Event::Receipt(Box::new(r)));
    app.update(key('/'));
    for c in "service:stripe 4xx".chars() {
        app.update(key(c));
    }
    insta::assert_snapshot!("filter_typing_100x30", screen(&app));
    app.update(code(KeyCode::Enter));
    let s = screen(&app);
    assert!(s.contains("filter: service:stripe 4xx"));
    assert!(!s.contains(" 200 "));
    insta::assert_snapshot!("filter_applied_100x30", s);

    // Passthrough, blocked and trust-failure events are filterable by kind.
    app.update(key('/'));
    app.update(code(KeyCode::Esc));
    app.update(key('/'));
    for c in "kind:trust_failure".chars() {
        app.update(key(c));
    }
    app.update(code(KeyCode::Enter));
    assert_eq!(app.visible_len(), 1);
    assert!(screen(&app).contains("trust-failure    TLS     \"files.stripe.com\":443"));
}

#[test]
fn a_hostile_host_is_quoted_and_escaped_in_table_and_detail() {
    // A plain-HTTP passthrough's Host header is the workload's text.
    let host = "a\tintegrity: verified   leaks: none \u{1b}[30;40m\u{202e}x";
    let lines = chain(vec![(2_000, session()), (1_000, passthrough(host))]);
    let mut app = app_with(lines, (160, 45));
    app.update(code(KeyCode::Enter));
    let s = screen(&app);
    // The table row and the detail pane both show it quoted, tab escaped.
    assert!(
        s.contains("TUNNEL \"a\\tintegrity: verified   leaks: none \\u{1b"),
        "{s}"
    );
    assert!(
        s.contains("host     \"a\\tintegrity: verified   leaks: none"),
        "{s}"
    );
    assert!(s.contains("\\u{1b}[30;40m\\u{202e}x\":443"), "{s}");
    assert!(!s.contains('\u{1b}') && !s.contains('\u{202e}'), "{s}");
}

#[test]
fn paused_with_held_back_rows() {
    let lines = busy();
    let (first, rest) = lines.split_at(20);
    let mut app = app_with(first.to_vec(), (80, 24));
    app.update(key('p'));
    app.update(Event::Lines(rest.to_vec()));
    let s = screen(&app);
    assert!(s.contains("PAUSED (+"), "{s}");
    insta::assert_snapshot!("paused_80x24", s);
}

#[test]
fn status_cells_are_coloured_by_class() {
    let lines = busy();
    let app = app_with(lines, (100, 30));
    let (w, h) = app.size;
    let mut terminal = ratatui::Terminal::new(ratatui::backend::TestBackend::new(w, h)).unwrap();
    terminal
        .draw(|f| veris_tui::render::render(&app, f))
        .unwrap();
    let buf = terminal.backend().buffer().clone();
    let mut seen = std::collections::BTreeMap::new();
    for y in 0..h {
        let row: String = (0..w).map(|x| buf[(x, y)].symbol().to_string()).collect();
        for (status, colour) in [
            ("500", Color::Red),
            ("402", Color::Yellow),
            ("201", Color::Green),
        ] {
            if let Some(col) = row.find(&format!(" {status} ")) {
                let x = (col + 1) as u16;
                // The selected (last) row is drawn reversed; others keep the class colour.
                if buf[(x, y)].fg == colour {
                    seen.insert(status, true);
                }
            }
        }
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
}

/// Webhook deliveries that do not count show their origin and fault in the
/// table, and the detail pane says so.
#[test]
fn callback_rows_show_origin_and_fault() {
    let callback = |event: &str, origin: &str, fault: Option<&str>| {
        veris_receipt::Entry::Callback(veris_receipt::CallbackLine {
            service: "stripe".into(),
            event: event.into(),
            event_id: "evt_1".into(),
            target: "127.0.0.1:4242".into(),
            method: "POST".into(),
            path: "/webhook".into(),
            query: None,
            status: Some(400),
            error: None,
            duration_ms: 3,
            duration_us: None,
            attempt: 1,
            origin: origin.into(),
            fault: fault.map(str::to_string),
            tls: false,
        })
    };
    let lines = chain(vec![
        (4_000, session()),
        (3_000, callback("charge.succeeded", "twin", None)),
        (2_000, callback("customer.created", "trigger", None)),
        (
            1_000,
            callback("charge.succeeded", "twin", Some("bad-signature")),
        ),
    ]);
    let mut app = app_with(lines, (160, 45));
    let s = screen(&app);
    assert!(s.contains("\"customer.created\" #1  [trigger]"), "{s}");
    assert!(
        s.contains("\"charge.succeeded\" #1  [twin fault \"bad-signature\"]"),
        "{s}"
    );
    app.update(code(KeyCode::Enter));
    let s = screen(&app);
    assert!(
        s.contains("fault    \"bad-signature\" (not counted)"),
        "{s}"
    );
}
