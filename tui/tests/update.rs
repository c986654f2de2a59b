//! Event sequences through `App::update`: following the tail, scrolling,
//! pausing, filtering, the ring buffer, and resuming after a reconnect.

// Test code: a failed unwrap or expect is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use crossterm::event::KeyCode;
use veris_receipt::SessionLine;
use veris_tui::app::{Action, App, ConnState, Connection, Event};

fn lines(n: usize) -> Vec<veris_receipt::Line> {
    let mut entries = vec![(120_000, session())];
    for i in 0..n as i64 {
        entries.push((
            60_000 - i * 10,
            request("stripe", "GET", "/v1/charges", 200, 5),
        ));
    }
    chain(entries)
}

fn seqs(app: &App) -> Vec<u64> {
    (0..app.visible_len())
        .map(|i| app.visible_row(i).unwrap().seq)
        .collect()
}

#[test]
fn follows_the_tail_until_the_user_scrolls() {
    let all = lines(60);
    let mut app = app_with(all[..30].to_vec(), (80, 24));
    assert!(app.following());
    assert_eq!(app.selected_row().unwrap().seq, 30);
    let h = veris_tui::layout::table_rows(&app);
    assert_eq!(app.window_start(h), 30 - h);

    app.update(Event::Lines(all[30..40].to_vec()));
    assert_eq!(
        app.selected_row().unwrap().seq,
        40,
        "following moves with the tail"
    );

    // One step up: the selection stays put while lines keep arriving.
    app.update(key('k'));
    assert!(!app.following());
    assert_eq!(app.selected_row().unwrap().seq, 39);
    app.update(Event::Lines(all[40..50].to_vec()));
    assert_eq!(app.selected_row().unwrap().seq, 39);
    let start = app.window_start(h);
    assert!(
        start <= 38 && 38 < start + h,
        "selection stays in the window"
    );

    // g goes to the top, j moves down, G follows again.
    app.update(key('g'));
    assert_eq!(app.selected_row().unwrap().seq, 1);
    assert_eq!(app.window_start(h), 0);
    app.update(code(KeyCode::Down));
    app.update(key('j'));
    assert_eq!(app.selected_row().unwrap().seq, 3);
    app.update(code(KeyCode::PageDown));
    assert_eq!(app.selected_row().unwrap().seq, 3 + h as u64);
    app.update(key('G'));
    assert!(app.following());
    app.update(Event::Lines(all[50..].to_vec()));
    assert_eq!(app.selected_row().unwrap().seq, 61);
}

#[test]
fn reconnect_resumes_from_the_last_seq_without_loss_or_duplicates() {
    let all = lines(20);
    let mut app = app_with(all[..8].to_vec(), (80, 24));
    assert_eq!(app.last_seq(), 8);
    app.update(Event::Connection(Connection {
        state: ConnState::Reconnecting {
            attempt: 1,
            error: "connection reset".into(),
        },
        via: "admin 127.0.0.1:1".into(),
    }));
    // The stream a resumed connection sends may overlap what was seen.
    app.update(live("admin 127.0.0.1:2"));
    app.update(Event::Lines(all[5..14].to_vec()));
    app.update(Event::Lines(all[14..].to_vec()));
    assert_eq!(seqs(&app), (1..=21).collect::<Vec<_>>());
    assert_eq!(app.duplicates, 3);
    assert_eq!(app.gaps, 0);
    assert_eq!(app.last_seq(), 21);
    assert_eq!(app.conn.state, ConnState::Live);

    // A gap (lines the source could not replay) is counted, not hidden.
    let more = lines(30);
    app.update(Event::Lines(more[25..].to_vec()));
    assert_eq!(app.gaps, 4);
}

#[test]
fn ring_buffer_keeps_memory_bounded_and_counts_older_rows() {
    let all = lines(100);
    let mut app = App::new("x", 25, now_ms(), (80, 24));
    app.update(key('k'));
    for chunk in all.chunks(7) {
        app.update(Event::Lines(chunk.to_vec()));
    }
    assert_eq!(app.rows_len(), 25);
    assert_eq!(app.dropped, 76);
    assert_eq!(seqs(&app), (77..=101).collect::<Vec<_>>());
    assert_eq!(
        app.services()["stripe"].requests,
        100,
        "counters stay exact"
    );
    // A scrolled selection that was evicted moves to the oldest row kept.
    app.update(key('g'));
    app.update(Event::Lines(lines(110)[101..].to_vec()));
    assert_eq!(app.selected_row().unwrap().seq, 87);
}

#[test]
fn pause_holds_rows_back_without_losing_them() {
    let all = lines(30);
    let mut app = app_with(all[..10].to_vec(), (80, 24));
    app.update(key('p'));
    assert!(app.paused());
    app.update(Event::Lines(all[10..].to_vec()));
    assert_eq!(app.visible_len(), 10);
    assert_eq!(app.held_back(), 21);
    assert_eq!(app.selected_row().unwrap().seq, 10);
    app.update(key('p'));
    assert_eq!(app.visible_len(), 31);
    assert_eq!(app.selected_row().unwrap().seq, 31);
}

#[test]
fn filter_by_service_status_class_and_kind() {
    let mut app = app_with(busy(), (80, 24));
    app.update(key('/'));
    assert!(app.filter_input().is_some());
    for c in "5xx".chars() {
        app.update(key(c));
    }
    app.update(code(KeyCode::Enter));
    assert!(app.filter_input().is_none());
    assert_eq!(app.filter().text(), "5xx");
    assert!(app.visible_len() > 0);
    for i in 0..app.visible_len() {
        assert_eq!(app.visible_row(i).unwrap().status(), Some(500));
    }
    // New lines are filtered as they arrive.
    let before = app.visible_len();
    let more = chain(vec![(1, session()); 60]);
    app.update(Event::Lines(more[48..].to_vec()));
    assert_eq!(app.visible_len(), before);

    for (text, kind) in [
        ("kind:passthrough", "passthrough"),
        ("kind:blocked", "blocked"),
        ("k:trust-failure", "trust_failure"),
    ] {
        app.update(key('/'));
        app.update(code(KeyCode::Esc));
        assert!(app.filter().is_empty());
        app.update(key('/'));
        for c in text.chars() {
            app.update(key(c));
        }
        app.update(code(KeyCode::Enter));
        assert_eq!(app.visible_len(), 1, "{text}");
        assert_eq!(app.visible_row(0).unwrap().entry.kind(), kind);
    }
    app.update(code(KeyCode::Esc));
    assert!(app.filter().is_empty());
}

#[test]
fn keys_ask_the_loop_for_quit_and_receipt_refresh() {
    let mut app = app_with(vec![], (80, 24));
    assert_eq!(app.update(key('r')), Some(Action::RefreshReceipt));
    assert_eq!(app.update(key('q')), Some(Action::Quit));
    // While typing a filter, q and r are text.
    app.update(key('/'));
    assert_eq!(app.update(key('q')), None);
    assert_eq!(app.update(key('r')), None);
    assert_eq!(app.filter_input(), Some("qr"));
    assert_eq!(
        app.update(Event::Key(crossterm::event::KeyEvent::new(
            KeyCode::Char('c'),
            crossterm::event::KeyModifiers::CONTROL
        ))),
        Some(Action::Quit)
    );
}

#[test]
fn reset_forgets_rows_and_seqs_start_again() {
    let mut app = app_with(lines(10), (80, 24));
    app.update(Event::Reset("the ledger file was replaced".into()));
    assert_eq!(app.rows_len(), 0);
    assert_eq!(app.last_seq(), 0);
    assert!(screen(&app).contains("the ledger file was replaced"));
    app.update(Event::Lines(lines(3)));
    assert_eq!(seqs(&app), vec![1, 2, 3, 4]);
    assert_eq!(app.duplicates, 0);
}

#[test]
fn seals_are_counted_not_listed_and_sparkline_counts_the_last_minute() {
    let mut app = app_with(busy(), (80, 24));
    assert_eq!(app.counts.sealed_seq, Some(38));
    assert!((0..app.visible_len()).all(|i| app.visible_row(i).unwrap().entry.kind() != "seal"));
    let stripe = &app.services()["stripe"];
    let rate = stripe.rate(now_ms() / 1000);
    assert_eq!(
        rate.iter().sum::<u32>() as u64,
        stripe.requests,
        "every call is in the last minute"
    );
    assert_eq!(stripe.errors, 12);
    // A minute later the sparkline is empty; the counters are not.
    app.update(Event::Tick {
        now_ms: now_ms() + 120_000,
    });
    let stripe = &app.services()["stripe"];
    assert_eq!(stripe.rate(app.now_ms / 1000).iter().sum::<u32>(), 0);
    assert_eq!(stripe.requests, 24);
}

#[test]
fn uptime_counts_from_the_live_session_not_from_the_last_old_line() {
    // The proxy started 81 s ago and has been quiet for the last 55 s; the
    // TUI starts now and reads all of it at once (M7: it showed "up 26s").
    let backlog = chain(vec![
        (3_600_000, session()),
        (3_500_000, request("stripe", "GET", "/v1/old", 200, 5)),
        (81_000, session()),
        (55_000, request("stripe", "GET", "/v1/charges", 200, 5)),
    ]);
    let app = app_with(backlog, (80, 24));
    assert_eq!(app.uptime_ms(), Some(81_000));
    assert!(screen(&app).contains("up 1m21s"), "{}", screen(&app));
    // A proxy clock ahead of ours shows even in the backlog: a line from
    // our future is proof.
    let ahead = chain(vec![(-30_000, session()), (-20_000, session())]);
    let app = app_with(ahead, (80, 24));
    assert_eq!(app.ledger_now_ms(), app.now_ms + 20_000);
    assert_eq!(app.uptime_ms(), Some(0));
}

#[test]
fn a_proxy_clock_that_is_off_still_shows_its_last_minute() {
    // The sandbox's clock is 10 minutes behind ours (a restored VM snapshot).
    // The first batch is the backlog, which cannot tell a skewed clock from
    // a quiet proxy; lines that arrive as they are written can.
    let mut lines = busy();
    let arriving = lines.split_off(1);
    let mut app = App::new("admin", 1000, now_ms() + 600_000, (80, 24));
    app.update(live("admin"));
    app.update(Event::Lines(lines));
    app.update(Event::Lines(arriving));
    let stripe = &app.services()["stripe"];
    let rate = stripe.rate(app.ledger_now_ms() / 1000);
    assert_eq!(rate.iter().sum::<u32>() as u64, stripe.requests);
    assert!(screen(&app).contains("up 4m58s"), "{}", screen(&app));
    // Clocks that agree are left alone.
    let app = app_with(busy(), (80, 24));
    assert_eq!(app.ledger_now_ms(), app.now_ms);
}

#[test]
fn a_gateway_sandboxs_session_reads_gateway() {
    let mut gateway = session();
    if let veris_receipt::Entry::Session(SessionLine { tier, coverage, .. }) = &mut gateway {
        *tier = veris_receipt::ListenerTier::Gateway;
        *coverage = Some(
            serde_json::from_value(serde_json::json!({
                "quic": "platform", "dns": "platform", "udp_other": "platform", "ipv6": true,
                "exempt": [], "installed_by": "platform", "isolation": "gateway"
            }))
            .unwrap(),
        );
    }
    let lines = chain(vec![
        (50_000, gateway),
        (40_000, request("stripe", "POST", "/v1/charges", 200, 5)),
    ]);
    let shown = screen(&app_with(lines, (100, 24)));
    assert!(shown.contains("passthrough · gateway"), "{shown}");
}

#[test]
fn a_finished_session_reads_ended_with_its_uptime_stopped_and_its_interception() {
    // An isolated run that lasted 30 s and ended 20 s ago, read from its file.
    let mut isolated = session();
    if let veris_receipt::Entry::Session(SessionLine { tier, coverage, .. }) = &mut isolated {
        *tier = veris_receipt::ListenerTier::Transparent;
        *coverage = Some(
            serde_json::from_value(serde_json::json!({
                "quic": "sink", "dns": "stub", "udp_other": "dropped", "ipv6": true,
                "exempt": [], "installed_by": "veris run", "isolation": "netns"
            }))
            .unwrap(),
        );
    }
    let mut shutdown = seal(2);
    if let veris_receipt::Entry::Seal { reason, .. } = &mut shutdown {
        *reason = "shutdown".into();
    }
    let lines = chain(vec![
        (50_000, isolated),
        (40_000, request("stripe", "POST", "/v1/charges", 200, 5)),
        (20_000, shutdown),
    ]);
    let mut app = app_with(lines.clone(), (100, 24));
    assert!(app.ended());
    assert_eq!(app.uptime_ms(), Some(30_000));
    let shown = screen(&app);
    assert!(shown.contains("■ ended"), "{shown}");
    assert!(!shown.contains("● live"), "{shown}");
    assert!(shown.contains("passthrough · isolated"), "{shown}");
    assert!(shown.contains("up 30s"), "{shown}");
    // Time passes; the uptime of an ended session does not.
    app.now_ms += 60_000;
    assert_eq!(app.uptime_ms(), Some(30_000));
    // A live session (no final seal yet) is live.
    let app = app_with(lines[..2].to_vec(), (100, 24));
    assert!(!app.ended());
    assert!(screen(&app).contains("● live"), "{}", screen(&app));
}

#[test]
fn a_proxy_on_this_host_is_on_our_clock() {
    // Lines whose `ts` run ahead of ours would move an estimate; a source
    // on this host uses our clock as it is.
    let ahead = chain(vec![(-30_000, session()), (-20_000, session())]);
    let mut app = app_with(ahead, (80, 24));
    app.local_clock = true;
    assert_eq!(app.ledger_now_ms(), app.now_ms);
}
