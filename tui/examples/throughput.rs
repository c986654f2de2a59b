//! Prints how fast the TUI's pieces go, to check the "10,000 requests/s
//! without falling behind" goal: parsing a growing ledger file, applying
//! lines to the state, drawing a frame with a full ring, and the memory the
//! ring holds. A program that prints figures, not a test.
//!
//! `cargo run --release -p veris-tui --example throughput`

// Prints figures, not veris: a failed unwrap or expect ends the run with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::time::Instant;

use ratatui::backend::TestBackend;
use ratatui::Terminal;
use veris_receipt::ledger::encode;
use veris_receipt::RequestLine;
use veris_receipt::{Entry, Line, ListenerTier};
use veris_tui::app::{App, Event};
use veris_tui::follow::{Follower, Polled};
use veris_tui::render::render;

const LINES: usize = 300_000;
const NOW_MS: i64 = 1_795_937_400_000;

fn line(seq: u64) -> Line {
    let services = ["stripe", "google-calendar", "github", "notion"];
    let service = services[(seq % 4) as usize];
    let t = NOW_MS - 60_000 + (seq as i64 % 60_000);
    let secs = t / 1000;
    Line {
        v: 1,
        seq,
        ts: format!(
            "2026-11-29T07:{:02}:{:02}.{:03}Z",
            (secs / 60) % 60,
            secs % 60,
            t % 1000
        ),
        entry: Entry::Request(RequestLine {
            service: service.into(),
            host: "api.example.com".into(),
            method: "POST".into(),
            path: format!("/v1/things/{seq}"),
            query: Some("limit=3".into()),
            status: match seq % 17 {
                0 => 500,
                _ => 200,
            },
            http: "HTTP/1.1".into(),
            tier: ListenerTier::Explicit,
            bytes_in: 120,
            bytes_out: Some(2048),
            duration_ms: seq % 40,
            duration_us: None,
            upstream: format!("http://127.0.0.1:9/s/sbx/{service}/v1/things/{seq}"),
            headers: vec![
                ("content-type".into(), "application/json".into()),
                ("user-agent".into(), "bench/1".into()),
            ],
            websocket: false,
            client_gone: false,
        }),
        prev: "0".repeat(64),
    }
}

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    let lines: Vec<Line> = (1..=LINES as u64).map(line).collect();

    // 1. The file follower: a ledger written in full, read back by polls.
    let dir = std::env::temp_dir().join(format!("veris-tui-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("ledger.jsonl");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).expect("create"));
        for l in &lines {
            writeln!(f, "{}", encode(l).expect("encode")).expect("write");
        }
    }
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let mut follower = Follower::new(&path);
    let start = Instant::now();
    let mut read = 0;
    // Bounded: every poll reads up to 4 MiB of a file of `size` bytes.
    for _ in 0..(size / (1 << 20) + 10) {
        match follower.poll().expect("poll") {
            Polled::Lines { lines, more, .. } => {
                read += lines.len();
                if !more {
                    break;
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "follow+parse: {read} lines ({:.0} MiB) in {secs:.2}s = {:.0} lines/s",
        size as f64 / (1 << 20) as f64,
        read as f64 / secs
    );
    let _ = std::fs::remove_dir_all(&dir);

    // 2. Applying lines to the state (the default 50,000-row ring).
    let rss0 = rss_kb();
    let mut app = App::new("bench", veris_tui::DEFAULT_CAPACITY, NOW_MS, (160, 45));
    let start = Instant::now();
    for chunk in lines.chunks(512) {
        app.update(Event::Lines(chunk.to_vec()));
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "update: {LINES} lines in {secs:.2}s = {:.0} lines/s (rows kept {}, dropped {})",
        LINES as f64 / secs,
        app.rows_len(),
        app.dropped
    );
    println!(
        "memory: RSS grew {} MiB holding {} rows (the {LINES} lines, already parsed, are also held by this program)",
        rss_kb().saturating_sub(rss0) / 1024,
        app.rows_len()
    );

    // 3. Drawing with a full ring: following, and with a filter.
    for (label, filter) in [("following", ""), ("filtered 5xx", "5xx")] {
        if !filter.is_empty() {
            app.update(Event::Key(crossterm::event::KeyEvent::from(
                crossterm::event::KeyCode::Char('/'),
            )));
            for c in filter.chars() {
                app.update(Event::Key(crossterm::event::KeyEvent::from(
                    crossterm::event::KeyCode::Char(c),
                )));
            }
        }
        let mut terminal = Terminal::new(TestBackend::new(160, 45)).expect("terminal");
        let frames = 200;
        let start = Instant::now();
        for i in 0..frames {
            app.update(Event::Tick {
                now_ms: NOW_MS + i * 33,
            });
            terminal.draw(|f| render(&app, f)).expect("draw");
        }
        let per = start.elapsed().as_secs_f64() * 1000.0 / frames as f64;
        println!("render 160x45 ({label}): {per:.2} ms/frame (budget at 30 fps: 33 ms)");
    }

    // 4. A live mix: 10,000 lines/s arriving in 33 ms batches, drawn each frame.
    let mut app = App::new("bench", veris_tui::DEFAULT_CAPACITY, NOW_MS, (160, 45));
    let mut terminal = Terminal::new(TestBackend::new(160, 45)).expect("terminal");
    let per_frame = 10_000 / 30;
    let start = Instant::now();
    let mut frames = 0;
    for chunk in lines.chunks(per_frame).take(300) {
        app.update(Event::Lines(chunk.to_vec()));
        terminal.draw(|f| render(&app, f)).expect("draw");
        frames += 1;
    }
    let busy = start.elapsed().as_secs_f64();
    println!(
        "10k lines/s as {frames} frames of {per_frame} lines: {busy:.2}s of work for {:.1}s of traffic ({:.0}% of one core)",
        frames as f64 / 30.0,
        100.0 * busy / (frames as f64 / 30.0)
    );
}
