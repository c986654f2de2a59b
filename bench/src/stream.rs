//! The stream receipt at scale (G2): `veris receipt --nats URL --sandbox
//! ID --key FP` on a sandbox whose ledger of LINES lines (the `ledger`
//! group's generated ledger: valid chain, a seal every 1000 lines, a final
//! seal) is in a JetStream stream, in figures next to the target (no
//! assertions): the time to publish it (256 KiB messages, as a gateway
//! batches them, acknowledgements pipelined), and the wall time, read rate
//! and peak RSS of the receipt.
//!
//! `cargo build --release && cargo run --release -p veris-bench -- stream [LINES]`
//! (default 1,000,000; needs `nats-server` on PATH; the binary is
//! `target/release/veris`, or `$VERIS_BIN`).

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The sandbox id the generated ledger's session line names.
const SANDBOX: &str = "sbx_bench";

pub fn main(args: &[String]) -> bool {
    let lines: u64 = args
        .iter()
        .find_map(|a| a.parse().ok())
        .unwrap_or(1_000_000)
        .clamp(1000, 20_000_000);
    let bin = crate::ledger::veris_bin();
    if Command::new("nats-server")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("veris-bench stream: nats-server is not installed (apt-get install nats-server)");
        return false;
    }
    let root = std::env::temp_dir().join(format!("veris-bench-stream-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).expect("temp dir");
    let start = Instant::now();
    let key = crate::ledger::generate(&root, lines);
    let ledger = root.join("ledger.jsonl");
    let size = std::fs::metadata(&ledger).map(|m| m.len()).unwrap_or(0);
    println!(
        "generated {lines} lines ({:.0} MB) in {:.1} s",
        size as f64 / 1e6,
        start.elapsed().as_secs_f64()
    );
    let (mut server, url) = nats_server(root.join("store"));
    let published = publish(&url, &ledger, size, lines);
    println!(
        "published to the stream in {:.2} s ({:.0} lines/s, {:.0} MB/s)",
        published.as_secs_f64(),
        lines as f64 / published.as_secs_f64(),
        size as f64 / 1e6 / published.as_secs_f64()
    );
    receipt(&bin, &url, &key, lines);
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&root);
    true
}

/// A `nats-server -js` on a free loopback port storing in `store`, and its URL.
pub(crate) fn nats_server(store: std::path::PathBuf) -> (std::process::Child, String) {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let server = Command::new("nats-server")
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(store)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nats-server");
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nats-server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    (server, format!("nats://127.0.0.1:{port}"))
}

/// Publishes the ledger file on `veris.ledger.SANDBOX.bench` in messages
/// of whole lines up to 256 KiB, with veris's headers.
fn publish(url: &str, ledger: &Path, size: u64, lines: u64) -> Duration {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let bytes = std::fs::read(ledger).expect("ledger");
    rt.block_on(async move {
        let client = async_nats::connect(url).await.expect("connect");
        let js = async_nats::jetstream::new(client);
        js.create_stream(async_nats::jetstream::stream::Config {
            name: veris_fleet::DEFAULT_STREAM.into(),
            subjects: vec!["veris.ledger.>".into(), "veris.checkpoint.>".into()],
            max_bytes: (size * 2 + (64 << 20)) as i64,
            max_message_size: 1 << 20,
            ..Default::default()
        })
        .await
        .expect("stream");
        let subject = veris_fleet::ledger_subject(SANDBOX, "bench");
        let start = Instant::now();
        let mut acks = std::collections::VecDeque::new();
        let (mut at, mut seq) = (0usize, 1u64);
        while at < bytes.len() {
            let mut end = at;
            let mut last = seq - 1;
            while end < bytes.len() && (end == at || end - at < veris_fleet::publish::BATCH_BYTES) {
                let nl = bytes[end..]
                    .iter()
                    .position(|b| *b == b'\n')
                    .map_or(bytes.len(), |i| end + i + 1);
                if end != at && nl - at > veris_fleet::publish::BATCH_BYTES {
                    break;
                }
                end = nl;
                last += 1;
            }
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(veris_fleet::HEADER_LEDGER, "benchbenchbench0");
            headers.insert(veris_fleet::HEADER_FIRST, seq.to_string().as_str());
            headers.insert(veris_fleet::HEADER_LAST, last.to_string().as_str());
            let payload = bytes::Bytes::copy_from_slice(&bytes[at..end]);
            acks.push_back(
                js.publish_with_headers(subject.clone(), headers, payload)
                    .await
                    .expect("publish"),
            );
            if acks.len() >= 64 {
                acks.pop_front().expect("ack").await.expect("acknowledged");
            }
            at = end;
            seq = last + 1;
        }
        for a in acks {
            a.await.expect("acknowledged");
        }
        assert_eq!(seq - 1, lines, "every line published");
        start.elapsed()
    })
}

/// `veris receipt --nats URL --sandbox SANDBOX --key FP`: wall time, read
/// rate, peak RSS.
fn receipt(bin: &Path, url: &str, key: &str, lines: u64) {
    let script = format!(
        "/usr/bin/time -f PEAK_KB=%M {} receipt --nats {url} --sandbox {SANDBOX} --key {key} >/dev/null",
        bin.display()
    );
    for run in ["first", "second"] {
        let (wall, peak, _) = crate::ledger::timed(Command::new("sh").args(["-c", &script]));
        println!(
            "veris receipt --nats ({lines} lines, {run} run): {:.2} s ({:.0} lines/s) {}, peak RSS {:.0} MB",
            wall.as_secs_f64(),
            lines as f64 / wall.as_secs_f64(),
            crate::ledger::versus(wall.as_secs_f64() <= 3.0, "<= 3 s"),
            peak as f64 / 1024.0,
        );
    }
}
