//! Publishing ledgers to NATS JetStream (`serve --nats`, G2): a real
//! `nats-server -js` on a free loopback port with a temporary store, and the
//! stream read back with `veris_fleet::read`. What every test checks: the
//! subject holds every line of the ledger file(s) exactly once, byte for
//! byte, in order, with no message id twice.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::gateway::{curl_charges, Gateway};
use crate::support::nats::{with_js, Nats, SANDBOX_PASSWORD};
use crate::support::{self, http, skip, wait_for, Serve, TempDir, DEADLINE};

const NAME: &str = "gw1";
const SUBJECT: &str = "veris.ledger.sbx_local.gw1";

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
    assert_subject_is(nats, SUBJECT, files);
}

/// [`assert_stream_is`] for any subject.
fn assert_subject_is(nats: &Nats, subject: &str, files: &[PathBuf]) {
    let messages = nats.messages(subject);
    assert!(!messages.is_empty(), "no message on {subject}");
    let lines: u64 = messages.iter().map(|m| m.last - m.first + 1).sum();
    let largest = messages.iter().map(|m| m.last - m.first + 1).max();
    eprintln!(
        "{subject}: {lines} lines in {} messages (at most {largest:?} lines in one)",
        messages.len()
    );
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

pub(crate) fn gateway_flags(nats: &Nats, name: &str) -> Vec<String> {
    let mut flags = serve_flags(nats);
    flags[5] = name.into();
    flags
}

pub(crate) fn start_gateway(label: &str, nats: &Nats, name: &str) -> Gateway {
    let flags = gateway_flags(nats, name);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Gateway::start(label, "127.0.0.1:0", &flags)
}

/// The gateway's `/status` publishing part for sandbox `id`.
fn gateway_publishing(gw: &Gateway, id: &str) -> serde_json::Value {
    let (code, body) = gw.admin_get("/status");
    assert_eq!(code, 200, "{body}");
    support::json(&body)["publishing"][id].clone()
}

/// Waits until the gateway's `/status` says every line of `id` is in the stream.
pub(crate) fn gateway_published(gw: &Gateway, id: &str) -> serde_json::Value {
    wait_for(
        "the sandbox's ledger published",
        Duration::from_secs(30),
        || {
            let p = gateway_publishing(gw, id);
            (p["lag"] == 0 && p["ledger_id"].is_string()).then_some(p)
        },
    )
}

/// Two sandboxes under load through one gateway (curl over `socks5h://`),
/// one removed while the gateway runs, the gateway restarted (its
/// sandboxes restored) and stopped: per sandbox subject, the stream holds
/// exactly the bytes of that sandbox's ledger file, in order, each once.
#[test]
fn gateway_publishes_each_sandbox_ledger_on_its_own_subject() {
    let Some(nats) = Nats::start() else { return };
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let mut gw = start_gateway("fleet-gw", &nats, NAME);
    let sandboxes = [
        gw.add_sandbox("sbx-a", "stripe"),
        gw.add_sandbox("sbx-b", "stripe"),
        gw.add_sandbox("sbx-c", "stripe"),
    ];
    let ca = gw.ca();
    let load = |sandboxes: &[support::gateway::Sandbox]| {
        std::thread::scope(|s| {
            for sbx in sandboxes {
                let (url, ca) = (sbx.url("socks5h"), &ca);
                s.spawn(move || {
                    for _ in 0..3 {
                        assert_eq!(
                            curl_charges(&url, 20, ca),
                            20,
                            "{url}: every charge answered 200"
                        );
                    }
                });
            }
        });
    };
    load(&sandboxes);
    for id in ["sbx-a", "sbx-b", "sbx-c"] {
        let p = gateway_published(&gw, id);
        assert_eq!(p["subject"], format!("veris.ledger.{id}.{NAME}"), "{p}");
        assert!(p["refused"].is_null() && p["fork"] == false, "{p}");
    }
    let (code, metrics) = gw.admin_get("/metrics");
    assert_eq!(code, 200, "{metrics}");
    for id in ["sbx-a", "sbx-b", "sbx-c"] {
        let series = format!("veris_publish_lag_lines{{subject=\"veris.ledger.{id}.{NAME}\"}} 0");
        assert!(metrics.contains(&series), "{metrics}");
    }
    // Removed while the gateway runs: its final seal reaches the stream
    // before the removal answers.
    gw.remove_sandbox("sbx-c");
    assert_subject_is(
        &nats,
        &format!("veris.ledger.sbx-c.{NAME}"),
        &[gw.ledger_file("sbx-c")],
    );
    // Restarted: the sandboxes are restored and their ledgers continue,
    // published from where the stream stands.
    let flags = gateway_flags(&nats, NAME);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    gw.restart(&flags);
    load(&sandboxes[..2]);
    gw.stop();
    for id in ["sbx-a", "sbx-b"] {
        assert_subject_is(
            &nats,
            &format!("veris.ledger.{id}.{NAME}"),
            &[gw.ledger_file(id)],
        );
        let last = nats.messages(&format!("veris.checkpoint.{id}.{NAME}"));
        let last = last.last().expect("a checkpoint");
        let ledger = std::fs::read_to_string(gw.ledger_file(id)).expect("ledger");
        assert!(
            ledger.ends_with(&String::from_utf8_lossy(&last.payload).to_string()),
            "{id}: the last checkpoint is the final seal"
        );
    }
}

/// Publishes `payload` to `subject` through JetStream at `url` as whoever
/// the URL names; the server's acknowledgement, or why there was none.
fn publish_raw(url: &str, subject: &str, payload: &'static str) -> Result<u64, String> {
    with_js(url, async |js| {
        let ack = js
            .publish(subject.to_string(), payload.into())
            .await
            .map_err(|e| format!("publishing: {e}"))?
            .await
            .map_err(|e| format!("no acknowledgement: {e}"))?;
        Ok(ack.sequence)
    })?
}

/// The last `veris_publish_*` sample of `name` for `subject` in `metrics`.
fn metric(metrics: &str, name: &str, subject: &str) -> Option<String> {
    let prefix = format!("{name}{{subject=\"{subject}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
}

/// A second writer on a sandbox's subject (another gateway with the same
/// `--nats-name` and sandbox id), and a foreign message on a subject before
/// the gateway's first publish: each a fork, in `/status`, the metrics and
/// the sandbox's receipt (its text and `publishing` in --json), live and
/// after the gateway stopped; the sandbox is served all along.
#[test]
fn a_fork_on_a_sandbox_subject_is_reported_in_status_metrics_and_receipt() {
    let Some(nats) = Nats::start() else { return };
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let mut gw1 = start_gateway("fleet-fork-1", &nats, NAME);
    // The second writer keeps its own sandbox registry (another bucket): it
    // registers sbx-f itself, as a gateway outside the fleet would.
    let mut flags = gateway_flags(&nats, NAME);
    flags.extend(["--nats-registry".into(), "VERIS_SANDBOXES_OTHER".into()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut gw2 = Gateway::start("fleet-fork-2", "127.0.0.1:0", &flags);
    let ca1 = gw1.ca();
    let f1 = gw1.add_sandbox("sbx-f", "stripe");
    assert_eq!(curl_charges(&f1.url("socks5h"), 5, &ca1), 5);
    // Quiet: every line, the seal of the last request's included, is in
    // the stream, so nothing of the first gateway's follows the second's
    // chain until the next request.
    wait_for("the first gateway quiet", DEADLINE, || {
        let p = gateway_publishing(&gw1, "sbx-f");
        let sealed = gw1
            .ledger("sbx-f")
            .last()
            .is_some_and(|l| l["kind"] == "seal");
        (sealed && p["lag"] == 0 && p["published_seq"] == p["head_seq"]).then_some(())
    });
    // The second writer: its chain follows the first's on the subject.
    let f2 = gw2.add_sandbox("sbx-f", "stripe");
    assert_eq!(curl_charges(&f2.url("socks5h"), 5, &gw2.ca()), 5);
    gateway_published(&gw2, "sbx-f");
    // A foreign message where the next sandbox's lines will go.
    let foreign = format!("veris.ledger.sbx-g.{NAME}");
    publish_raw(&nats.url(), &foreign, "{\"not\":\"a ledger line\"}\n")
        .expect("publishing the foreign message");
    let g = gw1.add_sandbox("sbx-g", "stripe");
    // The first gateway's next lines: its subject moved under it.
    assert_eq!(
        curl_charges(&f1.url("socks5h"), 5, &ca1),
        5,
        "served all along"
    );
    assert_eq!(
        curl_charges(&g.url("socks5h"), 5, &ca1),
        5,
        "served all along"
    );
    for id in ["sbx-f", "sbx-g"] {
        let p = wait_for("the fork seen", DEADLINE, || {
            let p = gateway_publishing(&gw1, id);
            (p["fork"] == true).then_some(p)
        });
        let refused = p["refused"].as_str().unwrap_or_default();
        assert!(refused.starts_with("fork:"), "{id}: {p}");
        let subject = format!("veris.ledger.{id}.{NAME}");
        let (code, metrics) = gw1.admin_get("/metrics");
        assert_eq!(code, 200);
        assert_eq!(
            metric(&metrics, "veris_publish_fork", &subject).as_deref(),
            Some("1"),
            "{metrics}"
        );
        assert_eq!(
            metric(&metrics, "veris_publish_refused", &subject).as_deref(),
            Some("1"),
            "{metrics}"
        );
        // The live receipt (the refusal is recorded under the next seal).
        let r = wait_for("the refusal in the live receipt", DEADLINE, || {
            let r = gw1.receipt_json(id);
            r["publishing"].is_object().then_some(r)
        });
        assert_eq!(r["publishing"]["status"], "refused", "{r}");
    }
    assert_eq!(
        gateway_publishing(&gw2, "sbx-f")["fork"],
        false,
        "the later writer is not told"
    );
    gw1.stop();
    gw2.stop();
    // After the gateway is gone: from the file.
    for (id, why) in [
        ("sbx-f", "belongs to chain"),
        ("sbx-g", "is not a veris ledger message"),
    ] {
        let r = gw1.receipt_json(id);
        let reason = r["publishing"]["reason"].as_str().unwrap_or_default();
        assert_eq!(r["publishing"]["status"], "refused", "{id}: {r}");
        assert!(
            reason.contains(why) && reason.contains(&format!("veris.ledger.{id}.{NAME}")),
            "{id}: {reason}"
        );
        let text = gw1.receipt_text(id);
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with("publishing: refused"))
            .unwrap_or_else(|| panic!("{id}: no publishing line in the receipt:\n{text}"));
        assert!(line.contains("fork"), "{line}");
        assert_eq!(text.matches("publishing:").count(), 1, "one line: {text}");
    }
    // The sandbox the second gateway served reads no refusal.
    assert!(gw2.receipt_json("sbx-f")["publishing"].is_null());
}

/// deploy/nats/nats-server.conf: the gateway publishes with its nkey
/// (`--nats-creds` holding its seed); the `sandbox` user can publish to no
/// ledger subject, the gateway's own included.
#[test]
fn gateway_publishes_with_its_nkey_and_a_sandbox_user_cannot_publish() {
    let key = nkeys::KeyPair::new_user();
    let Some(nats) = Nats::start_with_auth(&key.public_key()) else {
        return;
    };
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let seed = nats.dir.join("gw1.seed");
    std::fs::write(&seed, format!("{}\n", key.seed().expect("seed"))).expect("seed file");
    let mut flags = gateway_flags(&nats, NAME);
    flags.extend(["--nats-creds".to_string(), seed.display().to_string()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut gw = Gateway::start("fleet-creds", "127.0.0.1:0", &flags);
    let a = gw.add_sandbox("sbx-a", "stripe");
    assert_eq!(curl_charges(&a.url("socks5h"), 10, &gw.ca()), 10);
    let p = gateway_published(&gw, "sbx-a");
    assert!(p["refused"].is_null() && p["last_error"].is_null(), "{p}");
    let sandbox = format!("nats://sandbox:{SANDBOX_PASSWORD}@127.0.0.1:{}", nats.port);
    let own = format!("veris.ledger.sbx-a.{NAME}");
    for subject in ["veris.ledger.x.y", own.as_str(), "veris.checkpoint.x.y"] {
        let got = publish_raw(&sandbox, subject, "{\"v\":5,\"seq\":1}\n");
        assert!(
            got.is_err(),
            "the sandbox user published to {subject}: {got:?}"
        );
    }
    assert!(
        nats.messages("veris.ledger.x.y").is_empty(),
        "nothing on veris.ledger.x.y"
    );
    // Without credentials nothing is published either.
    let anonymous = publish_raw(&nats.url(), "veris.ledger.x.y", "{}\n");
    assert!(anonymous.is_err(), "{anonymous:?}");
    gw.stop();
    // Nothing but the gateway's lines on its subject.
    assert_subject_is(&nats, &own, &[gw.ledger_file("sbx-a")]);
}

/// Sets the stream's `max_bytes` (an operator making room).
fn set_stream_max_bytes(nats: &Nats, max_bytes: i64) {
    with_js(&nats.url(), async |js| {
        let mut stream = js
            .get_stream(veris_fleet::DEFAULT_STREAM)
            .await
            .expect("the stream");
        let mut config = stream.info().await.expect("stream info").config.clone();
        config.max_bytes = max_bytes;
        js.update_stream(config).await.expect("updating the stream");
    })
    .expect("connecting");
}

/// The `publish` check lines of a ledger file: (status, detail).
fn publish_lines(ledger: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(ledger)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["kind"] == "check" && l["name"] == "publish")
        .map(|l| {
            (
                l["status"].as_str().unwrap_or_default().to_string(),
                l["detail"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// A full stream refuses serve's lines: serve keeps answering, and its
/// receipt says the stream's copy is not whole (live and from the file)
/// while the refusal lasts. Once the operator makes room, the lines the
/// file held meanwhile are sent in order, the ledger records that the
/// refusal passed, and the receipt no longer names it.
#[test]
fn a_full_stream_is_in_serves_receipt_until_it_takes_the_lines_again() {
    let Some(nats) = Nats::start() else { return };
    let mut flags = serve_flags(&nats);
    let at = flags.iter().position(|f| f == "--nats-max-bytes").unwrap();
    flags[at + 1] = "16384".into();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut serve = Serve::start("fleet-full", &flags);
    for _ in 0..60 {
        assert_eq!(serve.vendor("GET", "api.stripe.com", "/v1/customers"), 200);
    }
    let p = wait_for("the stream's refusal", DEADLINE, || {
        let p = publishing(&serve);
        p["refused"].is_string().then_some(p)
    });
    assert_eq!(p["fork"], false, "{p}");
    let receipt = |serve: &Serve| {
        let out =
            support::output(support::veris(["receipt", "--json", "--state-dir"]).arg(&serve.state));
        support::json(&String::from_utf8_lossy(&out.stdout))
    };
    let r = wait_for("the refusal in the receipt", DEADLINE, || {
        let r = receipt(&serve);
        r["publishing"].is_object().then_some(r)
    });
    assert_eq!(r["publishing"]["status"], "refused", "{r}");
    let reason = r["publishing"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(SUBJECT) && reason.contains("retries"),
        "{reason}"
    );
    assert_eq!(serve.vendor("GET", "api.stripe.com", "/v1/customers"), 200);

    // Room again: within the publisher's 30 s retry.
    set_stream_max_bytes(&nats, 64 << 20);
    wait_for("publishing resumed", Duration::from_secs(90), || {
        let p = publishing(&serve);
        (p["refused"].is_null() && p["lag"] == 0).then_some(())
    });
    let r = wait_for("the receipt without the refusal", DEADLINE, || {
        let r = receipt(&serve);
        r["publishing"].is_null().then_some(r)
    });
    assert!(r["publishing"].is_null(), "{r}");
    serve.stop();
    let statuses: Vec<String> = publish_lines(&serve.ledger())
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(statuses, ["refused", "resumed"], "one line per change");
    assert!(receipt(&serve)["publishing"].is_null());
    // Nothing was lost: the stream holds the whole file, once, in order.
    assert_stream_is(&nats, &[serve.ledger()]);
}
