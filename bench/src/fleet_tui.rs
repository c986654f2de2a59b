//! The fleet view (`veris tui --nats`) at scale, in figures (no
//! assertions): SANDBOXES sandboxes (default 1,000) with LINES ledger lines
//! each (default 100: a session line and requests) in a JetStream stream,
//! one gateway's messages of 50 lines as a gateway batches them. Measured
//! in this process, with the TUI crate's own pieces: the stream's follower
//! (`veris_fleet::follow`, from the stream's start) feeding a `FleetApp`,
//! drawn on ratatui's test backend (140x40): the time to the first full
//! frame (every message read and drawn), the fleet view's frame time
//! (p50/p99 over 300 frames), the sandbox view's (drilled into one), and
//! the process's RSS before and after.
//!
//! `cargo run --release -p veris-bench -- fleet-tui [SANDBOXES] [LINES]`
//! (needs `nats-server` on PATH).

use std::time::{Duration, Instant};

use ratatui::backend::TestBackend;
use ratatui::Terminal;
use veris_fleet::follow::{Followed, Pattern, Start};
use veris_receipt::{Entry, Line, RequestLine, SessionLine, LEDGER_VERSION};
use veris_tui::fleet::{FleetApp, FleetEvent, Message};

/// Lines per message.
const BATCH: usize = 50;
/// Frames timed per view.
const FRAMES: usize = 300;

pub fn main(args: &[String]) -> bool {
    let mut nums = args.iter().filter_map(|a| a.parse::<usize>().ok());
    let sandboxes = nums.next().unwrap_or(1000).clamp(1, 100_000);
    let lines = nums.next().unwrap_or(100).clamp(2, 100_000);
    let root = std::env::temp_dir().join(format!("veris-bench-fleet-tui-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).expect("temp dir");
    let (server, url) = match crate::peers::start_nats(&root) {
        Ok(started) => started,
        Err(e) => {
            eprintln!("veris-bench fleet-tui: {e:#}");
            return false;
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let messages = rt.block_on(publish(&url, sandboxes, lines));
    let pid = std::process::id();
    let rss_before = crate::procstat::rss_kib(pid).unwrap_or(0);
    rt.block_on(measure(&url, sandboxes, lines, messages));
    let rss_after = crate::procstat::rss_kib(pid).unwrap_or(0);
    let peak = crate::procstat::peak_rss_kib(pid).unwrap_or(0);
    println!(
        "RSS: {:.0} MB before reading, {:.0} MB after ({:.0} MB for the view; peak {:.0} MB)",
        rss_before as f64 / 1024.0,
        rss_after as f64 / 1024.0,
        rss_after.saturating_sub(rss_before) as f64 / 1024.0,
        peak as f64 / 1024.0
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&root);
    true
}

/// `lines` ledger lines of sandbox `id`: a session, then requests.
fn ledger(id: &str, lines: usize) -> Vec<Vec<u8>> {
    let mut session = SessionLine::test();
    session.sandbox_id = id.into();
    (0..lines)
        .map(|i| {
            let entry = if i == 0 {
                Entry::Session(session.clone())
            } else {
                let mut r = RequestLine::test("stripe", "POST", "/v1/charges");
                r.status = if i % 10 == 0 { 402 } else { 200 };
                Entry::Request(r)
            };
            let line = Line {
                v: LEDGER_VERSION,
                seq: i as u64 + 1,
                ts: "2026-12-04T10:00:00.000Z".into(),
                entry,
                prev: "0".repeat(64),
            };
            let mut out = serde_json::to_vec(&line).expect("a line");
            out.push(b'\n');
            out
        })
        .collect()
}

/// Publishes every sandbox's lines; returns the messages published.
async fn publish(url: &str, sandboxes: usize, lines: usize) -> u64 {
    let client = async_nats::connect(url).await.expect("connect");
    let js = async_nats::jetstream::new(client);
    js.create_stream(async_nats::jetstream::stream::Config {
        name: veris_fleet::DEFAULT_STREAM.into(),
        subjects: vec!["veris.ledger.>".into(), "veris.checkpoint.>".into()],
        ..Default::default()
    })
    .await
    .expect("stream");
    let start = Instant::now();
    let mut acks = std::collections::VecDeque::new();
    let (mut count, mut bytes) = (0u64, 0usize);
    for s in 0..sandboxes {
        let id = format!("sbx-{s:05}");
        let subject = veris_fleet::ledger_subject(&id, "gw1");
        for (b, chunk) in ledger(&id, lines).chunks(BATCH).enumerate() {
            let first = b * BATCH + 1;
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(veris_fleet::HEADER_LEDGER, "benchbenchbench0");
            headers.insert(veris_fleet::HEADER_FIRST, first.to_string().as_str());
            let last = first + chunk.len() - 1;
            headers.insert(veris_fleet::HEADER_LAST, last.to_string().as_str());
            let payload: Vec<u8> = chunk.concat();
            bytes += payload.len();
            acks.push_back(
                js.publish_with_headers(subject.clone(), headers, payload.into())
                    .await
                    .expect("publish"),
            );
            if acks.len() >= 256 {
                acks.pop_front().expect("ack").await.expect("acknowledged");
            }
            count += 1;
        }
    }
    for a in acks {
        a.await.expect("acknowledged");
    }
    println!(
        "published {sandboxes} sandboxes x {lines} lines ({count} messages, {:.0} MB) in {:.2} s",
        bytes as f64 / 1e6,
        start.elapsed().as_secs_f64()
    );
    count
}

fn percentiles(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort_unstable();
    let at = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1e3;
    (at(0.50), at(0.99))
}

async fn measure(url: &str, sandboxes: usize, lines: usize, messages: u64) {
    let start = Instant::now();
    let reader = veris_fleet::stream_read::Reader::connect(url, None, veris_fleet::DEFAULT_STREAM)
        .await
        .expect("connect");
    let (tx, mut rx) = tokio::sync::mpsc::channel(256);
    let follower = tokio::spawn(veris_fleet::follow::follow(
        reader,
        Pattern::All,
        Start::All,
        tx,
    ));
    let mut app = FleetApp::new(
        "bench",
        veris_tui::fleet::DEFAULT_FLEET_ROWS,
        veris_tui::fleet::DEFAULT_SANDBOXES,
        0,
    );
    app.size = (140, 40);
    let mut read = 0;
    while read < messages {
        match rx.recv().await.expect("the follower") {
            Followed::Message {
                sandbox,
                gateway,
                ledger_id,
                stored_ms,
                payload,
                ..
            } => {
                read += 1;
                app.update(FleetEvent::Message(Message {
                    sandbox,
                    gateway,
                    ledger_id,
                    stored_ms,
                    payload: payload.to_vec(),
                }));
            }
            Followed::Failed(e) => panic!("reading the stream: {e}"),
            Followed::Live | Followed::Malformed { .. } => {}
        }
    }
    let ingested = start.elapsed();
    let mut terminal = Terminal::new(TestBackend::new(140, 40)).expect("terminal");
    terminal
        .draw(|f| veris_tui::fleet_render::render_fleet(&app, f))
        .expect("draw");
    let first = start.elapsed();
    println!(
        "first full frame: {:.2} s after connecting ({} messages, {} lines read and parsed in {:.2} s; {} sandboxes listed, {} idle ones forgotten)",
        first.as_secs_f64(),
        messages,
        sandboxes * lines,
        ingested.as_secs_f64(),
        app.len(),
        app.forgotten
    );
    let frames = |app: &mut FleetApp, terminal: &mut Terminal<TestBackend>| {
        (0..FRAMES)
            .map(|i| {
                app.update(FleetEvent::Term(veris_tui::Event::Tick {
                    now_ms: i as i64 * 33,
                }));
                let t = Instant::now();
                terminal
                    .draw(|f| veris_tui::fleet_render::render_fleet(app, f))
                    .expect("draw");
                t.elapsed()
            })
            .collect::<Vec<_>>()
    };
    let (p50, p99) = percentiles(frames(&mut app, &mut terminal));
    println!(
        "fleet view frame ({} sandboxes): p50 {p50:.2} ms, p99 {p99:.2} ms",
        app.len()
    );
    app.update(FleetEvent::Term(veris_tui::Event::Key(crossterm_enter())));
    assert!(app.drill.is_some(), "a sandbox opened");
    let (p50, p99) = percentiles(frames(&mut app, &mut terminal));
    let kept = lines.min(veris_tui::fleet::DEFAULT_FLEET_ROWS);
    println!(
        "sandbox view frame (one sandbox, its {kept} lines kept): p50 {p50:.2} ms, p99 {p99:.2} ms"
    );
    follower.abort();
}

fn crossterm_enter() -> ratatui::crossterm::event::KeyEvent {
    ratatui::crossterm::event::KeyEvent::from(ratatui::crossterm::event::KeyCode::Enter)
}
