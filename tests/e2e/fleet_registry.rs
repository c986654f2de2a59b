//! Shared sandboxes (`veris gateway --nats`, G2): two gateways on one
//! `nats-server -js`, each with its own state dir and `--nats-name`, share
//! the sandbox registry bucket VERIS_SANDBOXES. A sandbox added through one
//! is served by the other; removed through one, refused by both (an open
//! keep-alive connection included); a malformed or reviving bucket entry is
//! skipped; and with deploy/nats/nats-server.conf only a gateway can write
//! the bucket.

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::gateway::{charges, curl_charges, Gateway, Sandbox};
use crate::support::nats::{with_js, Nats, READER_PASSWORD, SANDBOX_PASSWORD};
use crate::support::{self, command, skip, wait_for, DEADLINE};

const BUCKET: &str = "VERIS_SANDBOXES";

fn start_gateway(label: &str, nats: &Nats, name: &str, extra: &[&str]) -> Gateway {
    let mut flags = vec![
        "--nats-max-bytes",
        "67108864",
        "--nats",
        &nats.url(),
        "--nats-name",
        name,
    ]
    .into_iter()
    .map(str::to_string)
    .collect::<Vec<_>>();
    flags.extend(extra.iter().map(|s| s.to_string()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Gateway::start(label, "127.0.0.1:0", &flags)
}

/// The ids the gateway serves now.
fn served(gw: &Gateway) -> Vec<String> {
    let (code, body) = gw.admin_get("/sandboxes");
    assert_eq!(code, 200, "{body}");
    support::json(&body)["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .filter_map(|s| s["id"].as_str().map(str::to_string))
        .collect()
}

/// The gateway's `/status` registry part.
fn registry(gw: &Gateway) -> Value {
    let (code, body) = gw.admin_get("/status");
    assert_eq!(code, 200, "{body}");
    support::json(&body)["registry"].clone()
}

fn wait_synced(gw: &Gateway) {
    wait_for("the registry synced", DEADLINE, || {
        (registry(gw)["state"] == "synced").then_some(())
    });
}

/// Polls until `gw` serves `id` (or, `false`, no longer does); how long it took.
fn wait_served(gw: &Gateway, id: &str, serving: bool) -> Duration {
    let t0 = Instant::now();
    wait_for(&format!("{id} served: {serving}"), DEADLINE, || {
        (served(gw).iter().any(|s| s == id) == serving).then_some(())
    });
    t0.elapsed()
}

/// `sandbox`'s credentials on `gw`'s listener.
fn url_on(sandbox: &Sandbox, gw: &Gateway, scheme: &str) -> String {
    format!(
        "{scheme}://{}:{}@{}",
        sandbox.username, sandbox.password, gw.listen
    )
}

/// Puts `value` under `key` in the registry bucket as `url`'s user: the
/// new revision, or why not.
fn bucket_put(url: &str, key: &str, value: Vec<u8>) -> Result<u64, String> {
    with_js(url, async |js| {
        let kv = js
            .get_key_value(BUCKET)
            .await
            .map_err(|e| format!("the bucket: {e}"))?;
        kv.put(key, value.into())
            .await
            .map_err(|e| format!("put: {e}"))
    })?
}

/// Deletes `key` from the registry bucket as `url`'s user.
fn bucket_delete(url: &str, key: &str) -> Result<(), String> {
    with_js(url, async |js| {
        let kv = js
            .get_key_value(BUCKET)
            .await
            .map_err(|e| format!("the bucket: {e}"))?;
        kv.delete(key).await.map_err(|e| format!("delete: {e}"))
    })?
}

/// `key`'s value in the registry bucket (none: no such key, or deleted).
fn bucket_get(url: &str, key: &str) -> Option<Value> {
    with_js(url, async |js| {
        let kv = js.get_key_value(BUCKET).await.expect("the bucket");
        kv.get(key).await.expect("reading the bucket")
    })
    .expect("reading the bucket")
    .map(|v| serde_json::from_slice(&v).expect("a record"))
}

/// argv HOST PORT USER:PASS: one keep-alive HTTP proxy connection; one
/// absolute-form canary request, then another per line read from stdin;
/// prints `STATUS` per request, or `closed` when the connection is gone.
const KEEP_ALIVE_PY: &str = r#"
import base64, http.client, sys
host, port, cred = sys.argv[1], int(sys.argv[2]), sys.argv[3]
headers = {"Proxy-Authorization": "Basic " + base64.b64encode(cred.encode()).decode()}
c = http.client.HTTPConnection(host, port, timeout=10)
def once():
    try:
        c.request("GET", "http://canary.veris.internal/__veris/canary", headers=headers)
        r = c.getresponse()
        r.read()
        print(r.status, flush=True)
    except Exception as e:
        print("closed", type(e).__name__, flush=True)
        sys.exit(0)
once()
for _ in sys.stdin:
    once()
"#;

/// argv HOST PORT USER:PASS CAFILE: one CONNECT tunnel to api.stripe.com
/// (TLS inside, trusting CAFILE), one GET, then another per line read
/// from stdin; prints `STATUS` per request, or `closed` once the tunnel is
/// gone.
const TUNNEL_PY: &str = r#"
import base64, socket, ssl, sys
host, port, cred, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
s = socket.create_connection((host, port), timeout=10)
auth = base64.b64encode(cred.encode()).decode()
s.sendall(("CONNECT api.stripe.com:443 HTTP/1.1\r\nHost: api.stripe.com:443\r\nProxy-Authorization: Basic " + auth + "\r\n\r\n").encode())
head = b""
while b"\r\n\r\n" not in head:
    b = s.recv(1)
    if not b:
        print("closed", flush=True); sys.exit(0)
    head += b
if b" 200" not in head.split(b"\r\n")[0]:
    print("refused", head.split(b"\r\n")[0].decode(), flush=True); sys.exit(0)
t = ssl.create_default_context(cafile=ca).wrap_socket(s, server_hostname="api.stripe.com")
f = t.makefile("rb")
def once():
    try:
        t.sendall(b"GET /v1/customers HTTP/1.1\r\nHost: api.stripe.com\r\nAuthorization: Bearer sk_test_x\r\n\r\n")
        status = f.readline()
        if not status:
            raise EOFError()
        length = 0
        while True:
            line = f.readline()
            if not line:
                raise EOFError()
            if line in (b"\r\n", b"\n"):
                break
            k, _, v = line.decode().partition(":")
            if k.strip().lower() == "content-length":
                length = int(v.strip())
        f.read(length)
        print(status.split()[1].decode(), flush=True)
    except Exception as e:
        print("closed", type(e).__name__, flush=True)
        sys.exit(0)
once()
for _ in sys.stdin:
    once()
"#;

/// Runs [`TUNNEL_PY`] through `gw` as `sandbox`: its first answer, and the
/// handle to ask again.
struct Tunnel {
    child: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Tunnel {
    fn open(gw: &Gateway, sandbox: &Sandbox) -> (Tunnel, String) {
        let mut child = command("python3")
            .args(["-c", TUNNEL_PY, "127.0.0.1", &gw.listen.port().to_string()])
            .arg(format!("{}:{}", sandbox.username, sandbox.password))
            .arg(gw.ca())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut t = Tunnel { child, out };
        let first = t.read();
        (t, first)
    }

    fn read(&mut self) -> String {
        let mut line = String::new();
        self.out.read_line(&mut line).expect("an answer");
        line.trim().to_string()
    }

    /// One more request on the open tunnel: its answer.
    fn again(&mut self) -> String {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        writeln!(stdin, "again").expect("asking again");
        self.read()
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A sandbox added on A with `--ttl 3`: its expiry is in the record every
/// gateway holds, so on B too, once it runs out, new connections are
/// refused and an open CONNECT tunnel (no credential check per request)
/// is closed.
#[test]
fn a_ttl_expiry_closes_open_tunnels_on_every_gateway() {
    let Some(nats) = Nats::start() else { return };
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    if !support::tool_works("python3", &["--version"]) {
        return skip("python3 is not installed");
    }
    let mut a = start_gateway("fleetttl-a", &nats, "gwa", &[]);
    let mut b = start_gateway("fleetttl-b", &nats, "gwb", &[]);
    let out = a.admin_command(
        "add-sandbox",
        &["sbx-t", "--services", "stripe", "--ttl", "3"],
    );
    let (stdout, stderr) = support::text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let t = Sandbox::from_url("sbx-t", stdout.lines().last().unwrap_or_default().trim());
    wait_served(&b, "sbx-t", true);
    let (mut tunnel, first) = Tunnel::open(&b, &t);
    assert_eq!(first, "200", "the tunnel through B works within the TTL");
    b.wait_expired("sbx-t");
    let answer = wait_for("the tunnel closed", DEADLINE, || {
        let a = tunnel.again();
        (a != "200").then_some(a)
    });
    assert!(answer.starts_with("closed"), "{answer}");
    for gw in [&a, &b] {
        assert_eq!(curl_charges(&url_on(&t, gw, "socks5h"), 1, &gw.ca()), 0);
    }
    a.stop();
    b.stop();
}

/// Added on A, served by B (a request through B with its credentials is
/// charged to B's twin and lands in B's ledger for it); removed on B,
/// refused on A (new connections, and the next request of an open
/// keep-alive connection); the revoked record put back by an
/// operator-level writer revives it nowhere; the sandbox's own credentials
/// cannot register or remove one; and its id, once removed, is never
/// served again (an add of it is refused), the old password still refused.
#[test]
fn a_sandbox_added_on_one_gateway_is_served_and_revoked_on_every_gateway() {
    let Some(nats) = Nats::start() else { return };
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    if !support::tool_works("python3", &["--version"]) {
        return skip("python3 is not installed");
    }
    let mut a = start_gateway("fleetreg-a", &nats, "gwa", &[]);
    let mut b = start_gateway("fleetreg-b", &nats, "gwb", &[]);
    wait_synced(&a);
    wait_synced(&b);
    let t0 = Instant::now();
    let s = a.add_sandbox("sbx-s", "stripe");
    let added = t0.elapsed();
    let propagated = wait_served(&b, "sbx-s", true);
    eprintln!(
        "propagation of an add: {propagated:?} after add-sandbox on A returned ({added:?} for the add)"
    );
    // Through B with A's credentials: B's twin, B's ledger.
    assert_eq!(curl_charges(&url_on(&s, &b, "socks5h"), 3, &b.ca()), 3);
    let on_b = charges(&b.receipt_json("sbx-s"));
    assert_eq!(on_b.len(), 3, "B's ledger holds the 3 charges: {on_b:?}");
    assert!(
        charges(&a.receipt_json("sbx-s")).is_empty(),
        "A's ledger holds none of B's requests"
    );
    let b_status = b.admin_get("/status").1;
    assert!(
        b_status.contains("veris.ledger.sbx-s.gwb"),
        "B publishes its own chain for it: {b_status}"
    );
    assert!(
        b.ledger_file("sbx-s").starts_with(&b.state),
        "its own dir under B's state dir"
    );
    // The sandbox's own secrets open no write on any admin API.
    let read_token = std::fs::read_to_string(a.state.join("sandboxes/sbx-s/admin.token"))
        .expect("the read token")
        .trim()
        .to_string();
    for gw in [&a, &b] {
        for token in [s.password.as_str(), read_token.as_str()] {
            let (code, body) = gw.admin_api(
                "POST",
                "/sandboxes",
                Some(token),
                Some(r#"{"id":"sbx-evil","services":["stripe"]}"#),
            );
            assert_eq!(code, "401", "a sandbox's secret registered one: {body}");
            let (code, body) = gw.admin_api("DELETE", "/sandboxes/sbx-s", Some(token), None);
            assert_eq!(code, "401", "a sandbox's secret removed one: {body}");
        }
    }
    // An open keep-alive connection on A.
    let mut keep = command("python3")
        .args([
            "-c",
            KEEP_ALIVE_PY,
            "127.0.0.1",
            &a.listen.port().to_string(),
        ])
        .arg(format!("{}:{}", s.username, s.password))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3");
    let mut keep_out = BufReader::new(keep.stdout.take().expect("stdout"));
    let mut line = String::new();
    keep_out.read_line(&mut line).expect("first answer");
    assert_eq!(line.trim(), "200", "the keep-alive connection works first");
    // Removed through B: refused on A.
    let t1 = Instant::now();
    b.remove_sandbox("sbx-s");
    let removed = wait_served(&a, "sbx-s", false);
    eprintln!(
        "propagation of a removal: {removed:?} after remove-sandbox on B returned ({:?} with it)",
        t1.elapsed()
    );
    for gw in [&a, &b] {
        assert_eq!(
            curl_charges(&url_on(&s, gw, "socks5h"), 1, &gw.ca()),
            0,
            "a removed credential was served"
        );
        assert_eq!(
            curl_charges(&url_on(&s, gw, "http"), 1, &gw.ca()),
            0,
            "a removed credential was served"
        );
    }
    let mut stdin = keep.stdin.take().expect("stdin");
    writeln!(stdin, "again").expect("asking again");
    drop(stdin);
    line.clear();
    keep_out.read_line(&mut line).expect("second answer");
    // The removal shuts the sandbox's proxy down on every gateway, which
    // closes its open connections; a request that races the close is
    // judged by its credential, now unknown (407). Never served.
    eprintln!(
        "the open keep-alive connection on A after the removal: {}",
        line.trim()
    );
    assert!(
        line.starts_with("closed") || line.trim() == "407",
        "the removed sandbox's open connection on A served a request: {line:?}"
    );
    let _ = keep.wait();
    // An operator-level writer puts the revoked record back, live: no
    // gateway serves the revoked credential again.
    let mut revived = bucket_get(&nats.url(), "sbx-s").expect("the revoked record");
    assert!(revived["revoked_ms"].is_u64(), "{revived}");
    revived["revoked_ms"] = Value::Null;
    bucket_put(
        &nats.url(),
        "sbx-s",
        serde_json::to_vec(&revived).expect("json"),
    )
    .expect("an operator writes the bucket");
    for gw in [&a, &b] {
        wait_for("the revival skipped", DEADLINE, || {
            (registry(gw)["skipped"].as_u64() >= Some(1)).then_some(())
        });
        assert!(!served(gw).contains(&"sbx-s".to_string()));
        assert_eq!(
            curl_charges(&url_on(&s, gw, "socks5h"), 1, &gw.ca()),
            0,
            "a revoked credential was revived"
        );
    }
    // The revived entry is live in the bucket: an add of its id is refused.
    let out = a.admin_command("add-sandbox", &["sbx-s", "--services", "stripe"]);
    assert!(!out.status.success(), "an add over a live entry");
    b.remove_sandbox("sbx-s");
    // Removed: its id is never served again, on any gateway (each chain of
    // it ended in its `removed` seal, which a stream reader takes as the
    // end), and the old password stays refused.
    let out = a.admin_command("add-sandbox", &["sbx-s", "--services", "stripe"]);
    let (stdout, stderr) = support::text(&out);
    assert!(!out.status.success(), "a removed id added again: {stdout}");
    assert!(stderr.contains("an id is served once"), "{stderr}");
    for gw in [&a, &b] {
        assert!(!served(gw).contains(&"sbx-s".to_string()));
        assert_eq!(curl_charges(&url_on(&s, gw, "socks5h"), 1, &gw.ca()), 0);
    }
    a.stop();
    b.stop();
}

/// An operator-level writer puts garbage in the bucket: entries that are
/// not records, records naming another id, bad digests, a zero limit,
/// unknown fields, a key that is no sandbox id, and garbage over a served
/// sandbox's key. Each gateway logs and skips each one, keeps running and
/// serving what it served, and still follows the bucket afterwards.
#[test]
fn malformed_registry_entries_are_skipped_and_the_fleet_keeps_serving() {
    let Some(nats) = Nats::start() else { return };
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let mut a = start_gateway("fleetbad-a", &nats, "gwa", &[]);
    let mut b = start_gateway("fleetbad-b", &nats, "gwb", &[]);
    let ok = a.add_sandbox("sbx-ok", "stripe");
    wait_served(&b, "sbx-ok", true);
    let good = bucket_get(&nats.url(), "sbx-ok").expect("its record");
    let with = |f: &dyn Fn(&mut Value)| {
        let mut v = good.clone();
        f(&mut v);
        serde_json::to_vec(&v).expect("json")
    };
    let garbage: Vec<(&str, Vec<u8>)> = vec![
        ("sbx-bad1", b"not json at all".to_vec()),
        ("sbx-bad2", b"{\"v\":1}".to_vec()),
        ("sbx-bad3", with(&|v| v["id"] = "sbx-other".into())),
        (
            "sbx-bad4",
            with(&|v| {
                v["id"] = "sbx-bad4".into();
                v["password_sha256"] = "zz".into();
            }),
        ),
        (
            "sbx-bad5",
            with(&|v| {
                v["id"] = "sbx-bad5".into();
                v["limits"]["max_connections"] = 0.into();
            }),
        ),
        (
            "sbx-bad6",
            with(&|v| {
                v["id"] = "sbx-bad6".into();
                v["admin"] = true.into();
            }),
        ),
        (
            "sbx-bad7",
            with(&|v| {
                v["id"] = "sbx-bad7".into();
                v["v"] = 99.into();
            }),
        ),
        ("SBX_UPPER", with(&|v| v["id"] = "SBX_UPPER".into())),
        ("sbx-ok", b"\xff\xfe garbage over a served sandbox".to_vec()),
    ];
    for (key, value) in &garbage {
        bucket_put(&nats.url(), key, value.clone()).expect("an operator writes the bucket");
    }
    for gw in [&a, &b] {
        wait_for("every bad entry skipped", DEADLINE, || {
            (registry(gw)["skipped"].as_u64() >= Some(garbage.len() as u64)).then_some(())
        });
        let list = served(gw);
        assert_eq!(list, vec!["sbx-ok".to_string()], "only the good one");
        assert_eq!(
            curl_charges(&url_on(&ok, gw, "socks5h"), 1, &gw.ca()),
            1,
            "the good sandbox is served on"
        );
        assert_eq!(registry(gw)["state"], "synced");
    }
    // Still following: one added on B after the garbage is served on A.
    let later = b.add_sandbox("sbx-later", "stripe");
    wait_served(&a, "sbx-later", true);
    assert_eq!(curl_charges(&url_on(&later, &a, "socks5h"), 1, &a.ca()), 1);
    let stderr = a.stderr();
    assert!(
        stderr.contains("skipped a registry entry that is not a sandbox record"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    a.stop();
    b.stop();
}

/// NATS down: the gateway keeps serving the sandboxes it knows and says
/// `down` in /status; a removal made meanwhile is written once NATS is
/// back (the other gateway then refuses it); NATS back, both read the
/// bucket again (a sandbox added after is served by both).
#[test]
fn a_gateway_serves_what_it_knows_while_nats_is_down_and_resyncs() {
    let Some(mut nats) = Nats::start() else {
        return;
    };
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let mut a = start_gateway("fleetdown-a", &nats, "gwa", &[]);
    let mut b = start_gateway("fleetdown-b", &nats, "gwb", &[]);
    let s = a.add_sandbox("sbx-s", "stripe");
    let t = a.add_sandbox("sbx-t", "stripe");
    wait_served(&b, "sbx-s", true);
    wait_served(&b, "sbx-t", true);
    nats.kill();
    for gw in [&a, &b] {
        wait_for("the registry down", DEADLINE, || {
            (registry(gw)["state"] == "down").then_some(())
        });
        assert_eq!(curl_charges(&url_on(&s, gw, "socks5h"), 1, &gw.ca()), 1);
    }
    // Adding needs the registry; removing works here at once.
    let out = a.admin_command("add-sandbox", &["sbx-u", "--services", "stripe"]);
    assert!(!out.status.success(), "an add without the registry");
    let out = a.admin_command("remove-sandbox", &["sbx-t"]);
    assert!(
        !out.status.success(),
        "the removal says it is not in the fleet yet"
    );
    assert_eq!(registry(&a)["pending_revocations"], 1);
    assert_eq!(curl_charges(&url_on(&t, &a, "socks5h"), 1, &a.ca()), 0);
    // B restarted while NATS is down: it serves its local records.
    let flags = [
        "--nats-max-bytes",
        "67108864",
        "--nats",
        &nats.url(),
        "--nats-name",
        "gwb",
    ];
    b.restart(&flags);
    assert_eq!(registry(&b)["state"], "connecting");
    assert_eq!(curl_charges(&url_on(&s, &b, "socks5h"), 1, &b.ca()), 1);
    nats.run();
    wait_synced(&a);
    wait_synced(&b);
    wait_served(&b, "sbx-t", false);
    assert_eq!(curl_charges(&url_on(&t, &b, "socks5h"), 1, &b.ca()), 0);
    assert_eq!(registry(&a)["pending_revocations"], 0);
    let u = b.add_sandbox("sbx-u", "stripe");
    wait_served(&a, "sbx-u", true);
    assert_eq!(curl_charges(&url_on(&u, &a, "socks5h"), 1, &a.ca()), 1);
    a.stop();
    b.stop();
}

/// deploy/nats/nats-server.conf: the gateway (its nkey) creates, writes
/// and follows the registry bucket; the `reader` and `sandbox` users can
/// neither put nor delete a key (the sandbox user cannot even read it), and
/// the bucket is as the gateway left it.
#[test]
fn only_a_gateway_can_write_the_registry_bucket() {
    let key = nkeys::KeyPair::new_user();
    let Some(nats) = Nats::start_with_auth(&key.public_key()) else {
        return;
    };
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let seed = nats.dir.join("gw1.seed");
    std::fs::write(&seed, format!("{}\n", key.seed().expect("seed"))).expect("seed file");
    let seed = seed.display().to_string();
    let mut gw = start_gateway("fleetperm", &nats, "gw1", &["--nats-creds", &seed]);
    wait_synced(&gw);
    let a = gw.add_sandbox("sbx-a", "stripe");
    assert_eq!(curl_charges(&url_on(&a, &gw, "socks5h"), 1, &gw.ca()), 1);
    let reader = format!("nats://reader:{READER_PASSWORD}@127.0.0.1:{}", nats.port);
    let sandbox = format!("nats://sandbox:{SANDBOX_PASSWORD}@127.0.0.1:{}", nats.port);
    let before = bucket_get(&reader, "sbx-a").expect("the reader reads the bucket");
    let mut forged = before.clone();
    forged["password_sha256"] = "0".repeat(64).into();
    let forged = serde_json::to_vec(&forged).expect("json");
    for (who, url) in [("reader", &reader), ("sandbox", &sandbox)] {
        for id in ["sbx-a", "sbx-evil"] {
            let put = bucket_put(url, id, forged.clone());
            assert!(put.is_err(), "{who} put {id}: {put:?}");
        }
        let deleted = bucket_delete(url, "sbx-a");
        assert!(deleted.is_err(), "{who} deleted sbx-a: {deleted:?}");
    }
    assert_eq!(bucket_get(&reader, "sbx-a"), Some(before), "unchanged");
    assert_eq!(bucket_get(&reader, "sbx-evil"), None);
    assert!(
        with_js(&sandbox, async |js| js.get_key_value(BUCKET).await.is_err()).expect("connects"),
        "the sandbox user reads the bucket"
    );
    assert_eq!(curl_charges(&url_on(&a, &gw, "socks5h"), 1, &gw.ca()), 1);
    // The gateway writes the removal.
    gw.remove_sandbox("sbx-a");
    let after = bucket_get(&reader, "sbx-a").expect("the revoked record");
    assert!(after["revoked_ms"].is_u64(), "{after}");
    assert_eq!(registry(&gw)["last_error"], Value::Null);
    gw.stop();
    // What the server refused (the other users' attempts above), for the log.
    let log = std::fs::read_to_string(nats.dir.join("nats.log")).unwrap_or_default();
    for l in log.lines().filter(|l| l.contains("Permissions Violation")) {
        eprintln!("{l}");
    }
}

/// `add-sandbox --webhook` on a gateway with `--nats` is refused with why
/// (the secret would have to be in the shared bucket, or on one gateway
/// only) and what to do, and nothing is registered: the bucket never holds
/// a signing secret.
#[test]
fn webhooks_on_a_fleet_gateway_are_refused_with_why() {
    let Some(nats) = Nats::start() else { return };
    let mut gw = start_gateway("fleet-webhook", &nats, "gwa", &[]);
    let out = gw.admin_command(
        "add-sandbox",
        &[
            "sbx-w",
            "--services",
            "stripe",
            "--webhook",
            "stripe=https://4242-sbx.example/webhook",
        ],
    );
    let (stdout, stderr) = support::text(&out);
    assert!(!out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("registry bucket")
            && stderr.contains(
                "Next: register sandboxes that need webhooks on a gateway without --nats"
            ),
        "{stderr}"
    );
    assert!(!served(&gw).contains(&"sbx-w".to_string()));
    gw.stop();
}
