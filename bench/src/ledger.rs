//! The ledger's write and read paths, in figures next to their targets
//! (no assertions):
//! 1. appends per second: one thread, each append waiting for its ack; one
//!    producer thread (a current_thread runtime with 256 tasks, as a proxy
//!    worker thread with many connections in flight) each awaiting its ack;
//!    64 tasks on two worker threads. The writer thread groups what is
//!    queued into one write(2) either way;
//! 2. `veris receipt --ledger FILE --key FP` on a generated ledger of
//!    LINES lines (valid chain, a seal every 1000 lines, a final seal):
//!    wall time and peak RSS (from wait4's rusage);
//! 3. `veris serve` on that state dir (sealed by its own seal.key): time
//!    until ready, RSS (VmRSS) and peak (VmHWM) idle, after one `/receipt`,
//!    and after five concurrent `/ledger` calls.
//!
//! `cargo build --release && cargo run --release -p veris-bench -- ledger [LINES] [--only appends|receipt|serve]`
//! (default 1,000,000; the binary is `target/release/veris`, or `$VERIS_BIN`);
//! `... -- ledger gen DIR LINES` only writes the ledger (for profiling).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use veris_receipt::entry::{Entry, ListenerTier, Mode};
use veris_receipt::ledger::Ledger;
use veris_receipt::seal::Sealer;
use veris_receipt::{RequestLine, SessionLine};

fn request(i: u64) -> Entry {
    Entry::Request(RequestLine {
        service: "stripe".into(),
        host: "api.stripe.com".into(),
        method: "POST".into(),
        // 100 distinct paths: the receipt lists calls per path, so distinct
        // paths are output, not ledger, size.
        path: format!("/v1/charges/ch_{:012}", i % 100),
        query: Some("expand[]=customer&limit=10".into()),
        status: 200,
        http: "HTTP/1.1".into(),
        tier: ListenerTier::Explicit,
        bytes_in: 512,
        bytes_out: Some(2048),
        duration_ms: 3,
        duration_us: Some(3_412),
        upstream: "http://127.0.0.1:9/s/sbx_bench/stripe/v1/charges".into(),
        headers: vec![
            ("idempotency-key".into(), format!("key-{i}")),
            (
                "content-type".into(),
                "application/x-www-form-urlencoded".into(),
            ),
        ],
        websocket: false,
        client_gone: false,
    })
}

fn session(sealer: &Sealer) -> Entry {
    Entry::Session(SessionLine {
        run_id: "run_bench".into(),
        sandbox_id: "sbx_bench".into(),
        mode: Mode::Passthrough,
        tier: ListenerTier::Explicit,
        twin: "http://127.0.0.1:9/".into(),
        pid: std::process::id(),
        version: "bench".into(),
        listen: "127.0.0.1:0".into(),
        recovered_torn_tail: None,
        key_id: Some(sealer.key_id().to_string()),
        public_key: Some(sealer.public_key_hex()),
        key_storage: Some("file".into()),
        proxy_uid: Some(1),
        workload_uid: Some(2),
        twin_heads: None,
        moved_aside: None,
        coverage: None,
    })
}

fn rate(n: u64, d: Duration) -> String {
    format!(
        "{:>9.0} lines/s ({n} in {:.2} s)",
        n as f64 / d.as_secs_f64(),
        d.as_secs_f64()
    )
}

/// Writes a sealed ledger of `lines` lines to `dir/ledger.jsonl` with the
/// key in `dir` (seal.key, ledger.pub): a session line, requests, a seal
/// every 1000 lines and a final `shutdown` seal as the last line. The lines
/// are what the writer would write (same encoding, `prev` hashes and
/// signatures), written straight to the file: a million in a few seconds.
/// Returns the key id.
pub(crate) fn generate(dir: &Path, lines: u64) -> String {
    use std::io::Write;
    use veris_receipt::entry::{Line, GENESIS_PREV, LEDGER_VERSION};
    use veris_receipt::ledger::{encode, line_hash, now_rfc3339};
    let sealer = Sealer::generate().expect("seal key");
    sealer.publish(dir).expect("ledger.pub");
    let file = std::fs::File::create(dir.join("ledger.jsonl")).expect("create ledger");
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let ts = now_rfc3339();
    let mut prev = GENESIS_PREV.to_string();
    let lines = lines.max(2);
    for seq in 1..=lines {
        let entry = if seq == 1 {
            session(&sealer)
        } else if seq == lines {
            sealer.seal(seq - 1, &prev, "shutdown")
        } else if seq % 1000 == 0 {
            sealer.seal(seq - 1, &prev, "interval")
        } else {
            request(seq)
        };
        let text = encode(&Line {
            v: LEDGER_VERSION,
            seq,
            ts: ts.clone(),
            entry,
            prev,
        })
        .expect("encode");
        out.write_all(text.as_bytes()).expect("write");
        out.write_all(b"\n").expect("write");
        prev = line_hash(text.as_bytes());
    }
    out.into_inner().expect("flush").sync_all().expect("sync");
    sealer.key_id().to_string()
}

/// Runs a command and returns its wall time and peak RSS in KiB (from
/// `/usr/bin/time -f %M`), and its stdout.
pub(crate) fn timed(cmd: &mut Command) -> (Duration, u64, String) {
    let start = Instant::now();
    let out = cmd.output().expect("runs");
    let wall = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let peak = stderr
        .lines()
        .rev()
        .find_map(|l| {
            l.trim()
                .strip_prefix("PEAK_KB=")
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0);
    (
        wall,
        peak,
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn proc_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)
                .map(|v| v.trim().trim_end_matches(" kB").trim().parse().unwrap_or(0))
        })
        .unwrap_or(0)
}

fn curl(addr: &str, token: &str, path: &str) -> usize {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--noproxy",
            "*",
            "-H",
            &format!("Authorization: Bearer {token}"),
        ])
        .arg(format!("http://{addr}{path}"))
        .env_remove("SSL_CERT_FILE")
        .env_remove("REQUESTS_CA_BUNDLE")
        .env_remove("CURL_CA_BUNDLE")
        .env_remove("NODE_EXTRA_CA_CERTS")
        .output()
        .expect("curl");
    out.stdout.len()
}

pub fn main(args: &[String]) {
    // `ledger steps N`: only the per-step costs (for callgrind).
    if args.first().map(String::as_str) == Some("steps") {
        steps(args.get(1).and_then(|a| a.parse().ok()).unwrap_or(100_000));
        return;
    }
    // `ledger gen DIR LINES`: only write a sealed ledger (for profiling).
    if args.first().map(String::as_str) == Some("gen") {
        let dir = PathBuf::from(args.get(1).expect("ledger gen DIR LINES"));
        let lines = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(50_000);
        std::fs::create_dir_all(&dir).expect("dir");
        let start = Instant::now();
        let key = generate(&dir, lines);
        println!(
            "{lines} lines in {:.2} s; key {key}",
            start.elapsed().as_secs_f64()
        );
        return;
    }
    let lines: u64 = args
        .iter()
        .find_map(|a| a.parse().ok())
        .unwrap_or(1_000_000)
        .clamp(1000, 20_000_000);
    // `--only appends|receipt|serve` runs one part.
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let wanted = |part: &str| only.as_deref().is_none_or(|o| o == part);
    let bin = veris_bin();
    let root = std::env::temp_dir().join(format!("veris-bench-ledger-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).expect("temp dir");
    if wanted("appends") {
        appends(&root);
    }
    if wanted("receipt") || wanted("serve") {
        let big = root.join("big");
        std::fs::create_dir_all(&big).unwrap();
        let start = Instant::now();
        let key = generate(&big, lines);
        let size = std::fs::metadata(big.join("ledger.jsonl"))
            .map(|m| m.len())
            .unwrap_or(0);
        println!(
            "generated {lines} lines ({:.0} MB, valid chain, a seal every 1000 lines, final seal) in {:.1} s",
            size as f64 / 1e6,
            start.elapsed().as_secs_f64()
        );
        if wanted("receipt") {
            receipt(&bin, &big, &key, lines);
        }
        if wanted("serve") {
            serve(&bin, &root, &big, lines);
        }
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// The release binary: `$VERIS_BIN`, else `target/release/veris`.
pub(crate) fn veris_bin() -> PathBuf {
    let bin = std::env::var_os("VERIS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/veris")
        });
    assert!(
        bin.is_file(),
        "no {}: cargo build --release first",
        bin.display()
    );
    bin
}

/// `figure (target: ...)` with a verdict.
pub(crate) fn versus(met: bool, target: &str) -> String {
    format!("(target {target}: {})", if met { "met" } else { "NOT met" })
}

/// 1. Appends: one thread each waiting for its ack; one producer thread
///    (a current_thread runtime, as a proxy worker with many connections
///    in flight) with 256 tasks; 64 tasks on 2 worker threads.
fn appends(root: &Path) {
    let n = 300_000u64;
    let fresh = |name: &str| {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let (ledger, _) = Ledger::open(&dir.join("ledger.jsonl")).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        Arc::new(ledger)
    };
    steps(100_000);
    {
        let ledger = fresh("one");
        let n = n / 4;
        let start = Instant::now();
        for i in 0..n {
            ledger.append(request(i)).unwrap();
        }
        println!(
            "appends, 1 thread, each waits for its ack:        {}",
            rate(n, start.elapsed())
        );
    }
    let tasks_on = |rt: tokio::runtime::Runtime, tasks: u64, label: &str| {
        let ledger = fresh(label);
        let start = Instant::now();
        rt.block_on(async {
            let handles: Vec<_> = (0..tasks)
                .map(|t| {
                    let l = ledger.clone();
                    tokio::spawn(async move {
                        for i in 0..n / tasks {
                            l.append_queued(request(t * n + i)).await.unwrap();
                        }
                    })
                })
                .collect();
            for h in handles {
                h.await.unwrap();
            }
        });
        let d = start.elapsed();
        let per_s = (n / tasks * tasks) as f64 / d.as_secs_f64();
        (rate(n / tasks * tasks, d), per_s)
    };
    let (line, per_s) = tasks_on(
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap(),
        256,
        "current",
    );
    println!(
        "appends, 1 producer thread, 256 tasks await:      {line} {}",
        versus(per_s >= 300_000.0, ">= 300,000 lines/s")
    );
    let (line, _) = tasks_on(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap(),
        64,
        "many",
    );
    println!("appends, 64 tasks on 2 worker threads await:      {line}");
}

/// Where an append's time goes, per line, each step alone (redaction,
/// encoding, the line hash), over `m` request entries.
fn steps(m: u64) {
    let entries: Vec<Entry> = (0..m).map(request).collect();
    let start = Instant::now();
    let redacted: Vec<Entry> = entries
        .into_iter()
        .map(veris_receipt::redact::entry)
        .collect();
    let redact = start.elapsed();
    let start = Instant::now();
    let mut texts = Vec::with_capacity(m as usize);
    for (i, e) in redacted.into_iter().enumerate() {
        texts.push(
            veris_receipt::ledger::encode(&veris_receipt::entry::Line {
                v: 3,
                seq: i as u64 + 1,
                ts: "2026-12-01T07:00:00.000Z".into(),
                entry: e,
                prev: veris_receipt::GENESIS_PREV.into(),
            })
            .unwrap(),
        );
    }
    let encode = start.elapsed();
    let start = Instant::now();
    for t in &texts {
        std::hint::black_box(veris_receipt::ledger::line_hash(t.as_bytes()));
    }
    let hash = start.elapsed();
    let us = |d: Duration| d.as_secs_f64() * 1e6 / m as f64;
    println!(
        "per line, each step alone: redact {:.2} µs, encode {:.2} µs, SHA-256 + hex {:.2} µs ({} bytes)",
        us(redact),
        us(encode),
        us(hash),
        texts[0].len()
    );
}

/// 2. `veris receipt --ledger FILE --key FP` on the big sealed ledger.
fn receipt(bin: &Path, big: &Path, key: &str, lines: u64) {
    let script = format!(
        "/usr/bin/time -f PEAK_KB=%M {} receipt --ledger {} --key {key} >/dev/null",
        bin.display(),
        big.join("ledger.jsonl").display()
    );
    // Once to warm the page cache, then the figure.
    let _ = timed(Command::new("sh").args(["-c", &script]));
    let (wall, peak, _) = timed(Command::new("sh").args(["-c", &script]));
    println!(
        "veris receipt ({lines} lines): {:.2} s {}, peak RSS {:.1} MB {}",
        wall.as_secs_f64(),
        versus(wall.as_secs_f64() <= 2.0, "<= 2 s"),
        peak as f64 / 1024.0,
        versus(peak <= 64 * 1024, "<= 64 MB")
    );
}

/// 3. `veris serve` on the big ledger's state dir (sealed by its own
///    seal.key): time until ready, memory idle and around admin calls.
fn serve(bin: &Path, root: &Path, state: &Path, lines: u64) {
    let ready = root.join("ready.json");
    let start = Instant::now();
    let mut child = Command::new(bin)
        .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(state)
        .arg("--ready-file")
        .arg(&ready)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("veris serve");
    let deadline = Instant::now() + Duration::from_secs(60);
    let info = loop {
        if let Some(v) = std::fs::read_to_string(&ready)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        {
            break v;
        }
        assert!(Instant::now() < deadline, "veris serve not ready in 60 s");
        std::thread::sleep(Duration::from_millis(2));
    };
    let ready_after = start.elapsed();
    let pid = child.id();
    let moved = state.join("ledger.jsonl.moved-1").exists();
    let admin = info["admin"]
        .as_str()
        .unwrap_or_default()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let token = std::fs::read_to_string(state.join("admin.token"))
        .unwrap_or_default()
        .trim()
        .to_string();
    let mb = |kb: u64| kb as f64 / 1024.0;
    std::thread::sleep(Duration::from_millis(300));
    let (idle, idle_peak) = (proc_kb(pid, "VmRSS:"), proc_kb(pid, "VmHWM:"));
    println!(
        "veris serve ({lines}-line ledger{}): ready in {:.3} s {}; idle RSS {:.1} MB (peak {:.1} MB) {}",
        if moved { ", MOVED ASIDE" } else { ", continued" },
        ready_after.as_secs_f64(),
        versus(ready_after.as_secs_f64() <= 0.5, "<= 0.5 s"),
        mb(idle),
        mb(idle_peak),
        versus(idle_peak <= 32 * 1024, "<= 32 MB")
    );
    let start = Instant::now();
    let body = curl(&admin, &token, "/receipt");
    let took = start.elapsed();
    std::thread::sleep(Duration::from_millis(300));
    let rss = proc_kb(pid, "VmRSS:");
    println!(
        "  after /receipt ({body} bytes, {:.2} s): RSS {:.1} MB (peak {:.1} MB), {:+.1} MB over idle",
        took.as_secs_f64(),
        mb(rss),
        mb(proc_kb(pid, "VmHWM:")),
        mb(rss) - mb(idle)
    );
    let calls: Vec<_> = (0..5)
        .map(|_| {
            let (a, t) = (admin.clone(), token.clone());
            std::thread::spawn(move || curl(&a, &t, "/ledger?since=0"))
        })
        .collect();
    let sizes: Vec<usize> = calls.into_iter().map(|c| c.join().unwrap_or(0)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let rss = proc_kb(pid, "VmRSS:");
    println!(
        "  after 5 concurrent /ledger ({} MB each): RSS {:.1} MB (peak {:.1} MB), {:+.1} MB over idle",
        sizes.first().copied().unwrap_or(0) / 1_000_000,
        mb(rss),
        mb(proc_kb(pid, "VmHWM:")),
        mb(rss) - mb(idle)
    );
    let _ = Command::new("kill").arg(pid.to_string()).status();
    let _ = child.wait();
}
