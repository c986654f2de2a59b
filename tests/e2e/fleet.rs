//! Publishing ledgers to NATS JetStream (`serve --nats`, G2): a real
//! `nats-server -js` on a free loopback port with a temporary store, and the
//! stream read back with `veris_fleet::read`. What every test checks: the
//! subject holds every line of the ledger file(s) exactly once, byte for
//! byte, in order, with no message id twice.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::{self, http, skip, wait_for, Guard, Serve, TempDir, DEADLINE};

const NAME: &str = "gw1";
const SUBJECT: &str = "veris.ledger.sbx_local.gw1";

/// A `nats-server -js` on loopback, stopped on drop.
struct Nats {
    dir: TempDir,
    port: u16,
    process: Option<Guard>,
}

impl Nats {
    /// `None` (after `SKIP`) when nats-server is not installed.
    fn start() -> Option<Nats> {
        if !support::tool_works("nats-server", &["--version"]) {
            skip("nats-server is not installed (apt-get install nats-server)");
            return None;
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut nats = Nats {
            dir: TempDir::new("nats"),
            port,
            process: None,
        };
        nats.run();
        Some(nats)
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server on its port and store, and waits until it accepts.
    fn run(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("nats.log"))
            .expect("nats log");
        let mut cmd = Command::new("nats-server");
        cmd.args([
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-sd",
        ])
        .arg(self.dir.join("store"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
        self.process = Some(Guard::spawn(&mut cmd));
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let log = self.dir.join("nats.log");
        wait_for("nats-server to accept", DEADLINE, || {
            let up = TcpStream::connect(addr).is_ok()
                && std::fs::read_to_string(&log)
                    .unwrap_or_default()
                    .matches("Server is ready")
                    .count()
                    >= self.starts();
            up.then_some(())
        });
    }

    fn starts(&self) -> usize {
        1 + std::fs::read_to_string(self.dir.join("nats.log"))
            .unwrap_or_default()
            .matches("Server Exiting")
            .count()
    }

    /// Stops the server (SIGKILL: as an outage looks to a client).
    fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.signal("KILL");
            p.wait();
            // A killed server logs no exit line: count it by hand.
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(self.dir.join("nats.log"))
                .expect("nats log");
            std::io::Write::write_all(&mut f, b"(test) Server Exiting\n").expect("log");
        }
    }

    /// Every message on `subject`, oldest first.
    fn messages(&self, subject: &str) -> Vec<veris_fleet::read::Stored> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(veris_fleet::read::messages(
            &self.url(),
            veris_fleet::DEFAULT_STREAM,
            subject,
        ))
        .expect("reading the stream")
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
    }
}

fn serve_flags(nats: &Nats) -> Vec<String> {
    // A small stream: the server refuses to create one larger than the
    // disk space it sees free.
    vec![
        "--nats-max-bytes".into(),
        "67108864".into(),
        "--nats".into(),
        nats.url(),
        "--nats-name".into(),
        NAME.into(),
    ]
}

fn start_serve(label: &str, nats: &Nats) -> Serve {
    let flags = serve_flags(nats);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Serve::start(label, &flags)
}

/// Requests on a thread until stopped; counts statuses (200 or not).
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(proxy: SocketAddr) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
            std::thread::spawn(move || {
                // Bounded: at most this many requests.
                for _ in 0..100_000 {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let got = std::panic::catch_unwind(|| {
                        http(
                            proxy,
                            "GET",
                            "http://api.stripe.com/v1/customers",
                            "api.stripe.com",
                            "",
                            "",
                        )
                        .0
                    });
                    match got {
                        Ok(200) => ok.fetch_add(1, Ordering::SeqCst),
                        _ => failed.fetch_add(1, Ordering::SeqCst),
                    };
                }
            })
        };
        Load {
            stop,
            ok,
            failed,
            thread: Some(thread),
        }
    }

    fn ok(&self) -> usize {
        self.ok.load(Ordering::SeqCst)
    }

    /// Waits until `n` more requests were answered 200.
    fn served(&self, n: usize) {
        let target = self.ok() + n;
        wait_for("requests served", Duration::from_secs(60), || {
            (self.ok() >= target).then_some(())
        });
    }

    /// (answered 200, anything else)
    fn stop(mut self) -> (usize, usize) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().expect("load thread");
        }
        (self.ok(), self.failed.load(Ordering::SeqCst))
    }
}

/// The publishing part of the serve's `/status`.
fn publishing(serve: &Serve) -> serde_json::Value {
    let (code, body) = serve.admin_call("GET", "/status");
    assert_eq!(code, 200, "{body}");
    support::json(&body)["publishing"].clone()
}

/// Checks the subject against the files, chain by chain, in order: every
/// line once, byte for byte, gapless seqs, no message id twice, every
/// message's headers naming its lines.
fn assert_stream_is(nats: &Nats, files: &[PathBuf]) {
    let messages = nats.messages(SUBJECT);
    assert!(!messages.is_empty(), "no message on {SUBJECT}");
    let lines: u64 = messages.iter().map(|m| m.last - m.first + 1).sum();
    eprintln!("{SUBJECT}: {lines} lines in {} messages", messages.len());
    let mut ids = std::collections::BTreeSet::new();
    for m in &messages {
        assert!(
            ids.insert(m.msg_id.clone()),
            "message id {} twice",
            m.msg_id
        );
        let lines: Vec<&[u8]> = m.payload.split(|b| *b == b'\n').collect();
        assert_eq!(
            lines.last(),
            Some(&&b""[..]),
            "message {} ends with a newline",
            m.sequence
        );
        assert_eq!(
            (lines.len() - 1) as u64,
            m.last - m.first + 1,
            "message {} holds lines {}..={}",
            m.sequence,
            m.first,
            m.last
        );
        assert_eq!(m.msg_id, format!("{}.{}-{}", m.ledger_id, m.first, m.last));
    }
    // Group by chain, in stream order.
    let mut chains: Vec<(String, Vec<u8>, u64)> = Vec::new();
    for m in &messages {
        match chains.last_mut() {
            Some((id, bytes, next)) if *id == m.ledger_id => {
                assert_eq!(
                    m.first, *next,
                    "chain {id}: message {} is not the next line",
                    m.sequence
                );
                bytes.extend_from_slice(&m.payload);
                *next = m.last + 1;
            }
            _ => {
                assert_eq!(m.first, 1, "chain {} starts at line 1", m.ledger_id);
                chains.push((m.ledger_id.clone(), m.payload.clone(), m.last + 1));
            }
        }
    }
    assert_eq!(
        chains.len(),
        files.len(),
        "one chain per file, in order: {:?}",
        chains.iter().map(|c| &c.0).collect::<Vec<_>>()
    );
    for ((id, bytes, _), file) in chains.iter().zip(files) {
        let want = std::fs::read(file).expect("ledger file");
        let first = want.split(|b| *b == b'\n').next().unwrap_or_default();
        assert_eq!(
            *id,
            veris_fleet::publish::ledger_id(first),
            "chain of {}",
            file.display()
        );
        if *bytes != want {
            let (got, want) = (
                String::from_utf8_lossy(bytes),
                String::from_utf8_lossy(&want),
            );
            let differs = got.lines().zip(want.lines()).position(|(a, b)| a != b);
            panic!(
                "the stream's chain {id} is not {} byte for byte: {} lines vs {} in the file, first differing line {differs:?}",
                file.display(),
                got.lines().count(),
                want.lines().count()
            );
        }
    }
}

/// Waits until `/status` says every line is in the stream.
fn wait_published(serve: &Serve) -> serde_json::Value {
    wait_for("the ledger published", Duration::from_secs(30), || {
        let p = publishing(serve);
        (p["lag"] == 0 && p["ledger_id"].is_string()).then_some(p)
    })
}

#[test]
fn serve_publishes_every_line_once_byte_for_byte() {
    let Some(nats) = Nats::start() else { return };
    let mut serve = start_serve("fleet-once", &nats);
    for _ in 0..30 {
        assert_eq!(serve.vendor("GET", "api.stripe.com", "/v1/customers"), 200);
    }
    let p = wait_published(&serve);
    assert_eq!(p["subject"], SUBJECT, "{p}");
    assert!(p["refused"].is_null() && p["fork"] == false, "{p}");
    let (code, metrics) = serve.admin_call("GET", "/metrics");
    assert_eq!(code, 200);
    assert!(
        metrics.contains(&format!(
            "veris_publish_lag_lines{{subject=\"{SUBJECT}\"}} 0"
        )),
        "{metrics}"
    );
    serve.stop();
    // The final seal (written at shutdown) is flushed before the exit.
    assert_stream_is(&nats, &[serve.ledger()]);
    let checkpoints = nats.messages("veris.checkpoint.sbx_local.gw1");
    let last = checkpoints.last().expect("a checkpoint");
    let text = String::from_utf8_lossy(&last.payload).to_string();
    assert!(text.contains(r#""kind":"seal""#), "{text}");
    let lines = std::fs::read_to_string(serve.ledger()).unwrap();
    assert!(
        lines.contains(text.trim_end()),
        "the checkpoint is a seal line of the ledger"
    );
}

#[test]
fn nats_outage_mid_load_serves_from_the_ledger_and_resends_the_backlog() {
    let Some(mut nats) = Nats::start() else {
        return;
    };
    let serve = start_serve("fleet-outage", &nats);
    let load = Load::start(serve.proxy_addr());
    load.served(50);
    nats.kill();
    // Requests keep being served from the local ledger while the server is
    // away for a few seconds, and the backlog grows.
    load.served(100);
    wait_for("the outage seen", DEADLINE, || {
        let p = publishing(&serve);
        (p["lag"].as_u64() > Some(0) && p["last_error"].is_string()).then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    nats.run();
    load.served(50);
    let (ok, failed) = load.stop();
    assert_eq!(failed, 0, "every request was served ({ok} answered 200)");
    wait_published(&serve);
    let mut serve = serve;
    serve.stop();
    assert_stream_is(&nats, &[serve.ledger()]);
}

#[test]
fn veris_killed_mid_load_resends_from_the_file_on_restart() {
    let Some(nats) = Nats::start() else { return };
    let serve = start_serve("fleet-kill", &nats);
    let load = Load::start(serve.proxy_addr());
    load.served(200);
    serve.process.signal("KILL");
    let _ = load.stop();
    let Serve {
        dir, mut process, ..
    } = serve;
    process.wait();
    drop(process);
    std::fs::remove_file(dir.join("ready.json")).expect("old ready file");
    let flags = serve_flags(&nats);
    let mut flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    flags.extend_from_slice(&["--workload-uid", support::DECLARED_WORKLOAD_UID]);
    let mut serve = Serve::start_in(dir, &flags);
    for _ in 0..20 {
        assert_eq!(serve.vendor("GET", "api.stripe.com", "/v1/customers"), 200);
    }
    wait_published(&serve);
    serve.stop();
    // The killed session's file was moved aside (its tail was unsealed) and
    // the new chain names it: both are in the stream, the old one first.
    let first_line = std::fs::read_to_string(serve.ledger()).unwrap();
    let session = support::json(first_line.lines().next().unwrap());
    let moved = session["moved_aside"]["file"]
        .as_str()
        .map(PathBuf::from)
        .expect("the killed session's ledger was moved aside");
    assert_stream_is(
        &nats,
        &[moved_complete_lines(&moved, &serve.dir), serve.ledger()],
    );
}

/// The moved-aside file's complete lines (a line torn by the kill was cut
/// off before the move), as a file to compare with.
fn moved_complete_lines(moved: &Path, dir: &TempDir) -> PathBuf {
    let bytes = std::fs::read(moved).expect("moved-aside ledger");
    let end = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let out = dir.join("moved-complete.jsonl");
    std::fs::write(&out, &bytes[..end]).expect("writing");
    out
}
