//! The sources against real sockets and files on loopback: a fake admin API
//! that speaks the `/events` and `/receipt` contract, drops the stream, and
//! checks that the client resumes with `Last-Event-ID`.

// Test code: a failed unwrap or expect is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use veris_receipt::ledger::encode;
use veris_receipt::Line;
use veris_tui::admin::{AdminError, Target};
use veris_tui::app::{App, ConnState, Event};
use veris_tui::source::{self, SourceSpec};

const DEADLINE: Duration = Duration::from_secs(20);

async fn read_head(s: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 65536 {
        let n = s.read(&mut chunk).await.unwrap();
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8_lossy(&buf).to_ascii_lowercase()
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(str::trim)
}

fn sse(lines: &[Line]) -> Vec<u8> {
    let mut out = b": hello\n\n".to_vec();
    for l in lines {
        out.extend_from_slice(
            format!("id: {}\ndata: {}\n\n", l.seq, encode(l).unwrap()).as_bytes(),
        );
    }
    out
}

const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-store\r\n\r\n";

/// Collects events into an app until `done` says so.
async fn drive(
    rx: &mut mpsc::Receiver<Event>,
    app: &mut App,
    states: &mut Vec<ConnState>,
    done: impl Fn(&App) -> bool,
) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !done(app) {
        let ev = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .expect("the source delivered in time")
            .expect("the source is running");
        if let Event::Connection(c) = &ev {
            states.push(c.state.clone());
        }
        app.update(ev);
    }
}

#[tokio::test]
async fn admin_stream_resumes_from_the_last_seq_after_a_drop() {
    let mut entries = vec![(60_000, session())];
    for i in 0..8 {
        entries.push((
            50_000 - i * 100,
            request("stripe", "POST", "/v1/charges", 200, 7),
        ));
    }
    let lines = chain(entries);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (heads_tx, mut heads) = mpsc::unbounded_channel::<String>();
    let served = lines.clone();
    let server = tokio::spawn(async move {
        // First connection: lines 1..=5 in awkward pieces, then the "proxy" dies.
        let (mut s, _) = listener.accept().await.unwrap();
        heads_tx.send(read_head(&mut s).await).unwrap();
        s.write_all(SSE_HEAD).await.unwrap();
        let body = sse(&served[..5]);
        for piece in body.chunks(37) {
            s.write_all(piece).await.unwrap();
            s.flush().await.unwrap();
        }
        drop(s);
        // While "restarting", refuse one attempt with a 503.
        let (mut s, _) = listener.accept().await.unwrap();
        heads_tx.send(read_head(&mut s).await).unwrap();
        s.write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
            .await
            .unwrap();
        drop(s);
        // Back: replays from a little earlier than asked (overlap) and stays open.
        let (mut s, _) = listener.accept().await.unwrap();
        let head = read_head(&mut s).await;
        let from: usize = header(&head, "last-event-id").unwrap().parse().unwrap();
        heads_tx.send(head).unwrap();
        s.write_all(SSE_HEAD).await.unwrap();
        s.write_all(&sse(&served[from - 2..])).await.unwrap();
        s.flush().await.unwrap();
        // Hold the stream open until the test ends.
        let mut sink = [0u8; 16];
        let _ = s.read(&mut sink).await;
    });

    let target = Target::new(&addr.to_string(), "tok-123").unwrap();
    let (tx, mut rx) = mpsc::channel(64);
    let feed = tokio::spawn(source::feed(SourceSpec::Admin(target), tx));
    let mut app = App::new("admin", 1000, now_ms(), (80, 24));
    let mut states = Vec::new();
    drive(&mut rx, &mut app, &mut states, |a| a.last_seq() >= 9).await;

    let got: Vec<u64> = (0..app.visible_len())
        .map(|i| app.visible_row(i).unwrap().seq)
        .collect();
    assert_eq!(
        got,
        (1..=9).collect::<Vec<_>>(),
        "nothing lost, nothing repeated"
    );
    assert_eq!(app.gaps, 0);
    let first = heads.recv().await.unwrap();
    assert!(first.starts_with("get /events "), "{first}");
    assert_eq!(header(&first, "authorization"), Some("bearer tok-123"));
    assert_eq!(header(&first, "last-event-id"), Some("0"));
    assert_eq!(header(&first, "accept"), Some("text/event-stream"));
    let second = heads.recv().await.unwrap();
    assert_eq!(header(&second, "last-event-id"), Some("5"));
    let third = heads.recv().await.unwrap();
    assert_eq!(
        header(&third, "last-event-id"),
        Some("5"),
        "a refused attempt does not move the resume point"
    );
    assert_eq!(states.first(), Some(&ConnState::Live));
    assert!(
        matches!(
            states.get(1),
            Some(ConnState::Reconnecting { attempt: 1, .. })
        ),
        "{states:?}"
    );
    assert!(
        matches!(states.get(2), Some(ConnState::Reconnecting { attempt: 2, error }) if error.contains("503")),
        "{states:?}"
    );
    assert_eq!(states.last(), Some(&ConnState::Live));
    feed.abort();
    server.abort();
}

#[tokio::test]
async fn admin_token_rejection_and_receipt_fetch() {
    let lines = busy();
    let receipt = receipt(&lines, unverified());
    let body = serde_json::to_vec(&receipt).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        for _ in 0..2 {
            let (mut s, _) = listener.accept().await.unwrap();
            let head = read_head(&mut s).await;
            if header(&head, "authorization") != Some("bearer good") {
                s.write_all(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n")
                    .await
                    .unwrap();
                continue;
            }
            assert!(head.starts_with("get /receipt "), "{head}");
            s.write_all(format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len()).as_bytes()).await.unwrap();
            s.write_all(&body).await.unwrap();
        }
    });
    let bad = Target::new(&addr.to_string(), "bad").unwrap();
    assert!(matches!(
        bad.events(0).await,
        Err(AdminError::Unauthorized(401))
    ));
    let good = Target::new(&format!("http://{addr}/"), "good").unwrap();
    let got = good.receipt().await.unwrap();
    assert_eq!(got, receipt);
    server.await.unwrap();
}

/// A state dir is followed through its ledger file only: an admin API
/// planted in it (the workload may share its uid) is never asked, and a
/// newer ledger the pick names is switched to.
#[tokio::test]
async fn state_dir_follows_its_ledger_never_the_admin_it_names() {
    let dir = std::env::temp_dir().join(format!("veris-tui-statedir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut entries = vec![(60_000, session())];
    for i in 0..5 {
        entries.push((
            50_000 - i * 100,
            request("stripe", "GET", "/v1/customers", 200, 3),
        ));
    }
    let lines = chain(entries);
    let write = |path: &std::path::Path, lines: &[veris_receipt::Line]| {
        let mut file = String::new();
        for l in lines {
            file.push_str(&encode(l).unwrap());
            file.push('\n');
        }
        std::fs::write(path, file).unwrap();
    };
    write(&dir.join("ledger.jsonl"), &lines[..3]);

    // A server that counts the connections it gets.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = asked.clone();
    let server = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = s.write_all(SSE_HEAD).await;
        }
    });
    std::fs::write(dir.join("admin.token"), "planted\n").unwrap();
    std::fs::write(dir.join("admin.addr"), format!("{addr}\n")).unwrap();

    let (tx, mut rx) = mpsc::channel(64);
    let feed = tokio::spawn(source::feed(
        SourceSpec::StateDir(dir.clone(), |d| {
            let newer = d.join("newer.jsonl");
            if newer.exists() {
                newer
            } else {
                d.join("ledger.jsonl")
            }
        }),
        tx,
    ));
    let mut app = App::new("state", 1000, now_ms(), (80, 24));
    let mut states = Vec::new();
    drive(&mut rx, &mut app, &mut states, |a| a.last_seq() >= 3).await;
    assert!(app.conn.via.starts_with("file "), "{}", app.conn.via);

    let mut more = String::new();
    for l in &lines[3..] {
        more.push_str(&encode(l).unwrap());
        more.push('\n');
    }
    std::io::Write::write_all(
        &mut std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("ledger.jsonl"))
            .unwrap(),
        more.as_bytes(),
    )
    .unwrap();
    drive(&mut rx, &mut app, &mut states, |a| a.last_seq() >= 6).await;
    let got: Vec<u64> = (0..app.visible_len())
        .map(|i| app.visible_row(i).unwrap().seq)
        .collect();
    assert_eq!(got, (1..=6).collect::<Vec<_>>());

    // The pick now names another ledger: the feed starts over on it.
    write(&dir.join("newer.jsonl"), &lines[..2]);
    drive(&mut rx, &mut app, &mut states, |a| {
        a.conn.via.ends_with("newer.jsonl") && a.last_seq() == 2
    })
    .await;
    assert!(app.conn.via.starts_with("file "), "{}", app.conn.via);
    feed.abort();
    server.abort();
    assert_eq!(
        asked.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the admin named in the state dir was asked"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
