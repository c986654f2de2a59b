//! Prints what seals cost: appending a request line, appending a seal
//! (Ed25519 signature included), and reading + verifying a sealed ledger.
//! A program that prints figures, not a test: `cargo run --release -p
//! veris-receipt --example bench_seal`.

// Prints figures, not veris: a failed unwrap or expect ends the run with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use veris_receipt::ledger::{self, Ledger};
use veris_receipt::seal::{self, PublicKeys, Sealer};
use veris_receipt::RequestLine;
use veris_receipt::{Entry, ListenerTier};

fn request(i: u64) -> Entry {
    Entry::Request(RequestLine {
        service: "stripe".into(),
        host: "api.stripe.com".into(),
        method: "POST".into(),
        path: format!("/v1/charges/ch_{i}"),
        query: None,
        status: 200,
        http: "HTTP/1.1".into(),
        tier: ListenerTier::Explicit,
        bytes_in: 40,
        bytes_out: Some(900),
        duration_ms: 2,
        duration_us: Some(2_412),
        upstream: format!("http://127.0.0.1:9/s/sbx/stripe/v1/charges/ch_{i}"),
        headers: Vec::new(),
        websocket: false,
        client_gone: false,
    })
}

fn main() {
    let dir = std::env::temp_dir().join(format!("veris-bench-seal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let sealer = Sealer::generate().expect("seal key");
    sealer.publish(&dir).expect("ledger.pub");
    let (ledger, _) = Ledger::open(&dir.join("ledger.jsonl")).expect("ledger");

    const LINES: u64 = 20_000;
    const SEAL_EVERY: u64 = 100;
    let start = Instant::now();
    for i in 0..LINES {
        ledger.append(request(i)).expect("append");
    }
    let append = start.elapsed();

    let start = Instant::now();
    for _ in 0..LINES / SEAL_EVERY {
        ledger.seal(&sealer, "demand").expect("seal");
    }
    let sealing = start.elapsed();
    ledger.sync().expect("sync");

    let start = Instant::now();
    let read = ledger::read(&dir.join("ledger.jsonl")).expect("read");
    let reading = start.elapsed();
    let keys = PublicKeys::load(&dir.join(seal::PUB_FILE)).expect("keys");
    let start = Instant::now();
    let report = seal::verify_lines(&read.lines, &keys);
    let verifying = start.elapsed();
    assert!(report.faults.is_empty());

    let seals = LINES / SEAL_EVERY;
    println!(
        "append request line: {:.1} µs",
        append.as_micros() as f64 / LINES as f64
    );
    println!(
        "append seal line:    {:.1} µs",
        sealing.as_micros() as f64 / seals as f64
    );
    println!(
        "read + chain check:  {:.1} µs/line ({} lines)",
        reading.as_micros() as f64 / read.lines.len() as f64,
        read.lines.len()
    );
    println!(
        "verify one seal:     {:.1} µs",
        verifying.as_micros() as f64 / report.valid as f64
    );
    drop(ledger);
    let _ = std::fs::remove_dir_all(&dir);
}
