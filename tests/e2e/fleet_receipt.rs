//! Receipts from the stream (`veris receipt --nats URL --sandbox ID`, G2):
//! gateways publish to a real `nats-server -js` (the support of
//! [`crate::fleet`]); the receipt read back from the stream holds every
//! gateway's requests, and one whose stream was altered by someone with
//! write access to it (an operator, a leaked NATS user) never reads
//! `verified`.

use std::time::Duration;

use serde_json::Value;

use crate::fleet::{gateway_flags, gateway_published, start_gateway};
use crate::support::gateway::{curl_charges, probe_canary, Gateway};
use crate::support::nats::{with_js, Nats};
use crate::support::{self, output, skip, text};

/// `veris receipt --nats URL --sandbox ID --json --key K…`, parsed.
fn stream_receipt(nats: &Nats, id: &str, keys: &[&str]) -> Value {
    let mut cmd = support::veris(["receipt", "--json", "--nats", &nats.url(), "--sandbox", id]);
    for k in keys {
        cmd.args(["--key", k]);
    }
    let out = output(&mut cmd);
    let (stdout, stderr) = text(&out);
    serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "receipt --nats --sandbox {id} ({}) is not JSON ({e}): {stdout}{stderr}",
            out.status
        )
    })
}

/// [`stream_receipt`] with more arguments.
pub(crate) fn stream_receipt_with(nats: &Nats, id: &str, keys: &[&str], more: &[&str]) -> Value {
    let mut cmd = support::veris(["receipt", "--json", "--nats", &nats.url(), "--sandbox", id]);
    for k in keys {
        cmd.args(["--key", k]);
    }
    let out = output(cmd.args(more));
    let (stdout, stderr) = text(&out);
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("receipt --nats {more:?} is not JSON ({e}): {stdout}{stderr}"))
}

/// `veris receipt --state-dir S --sandbox ID --json --key K` of a stopped gateway.
fn local_receipt(gw: &Gateway, id: &str, key: &str) -> Value {
    let out = output(
        gw.veris(&["receipt", "--json", "--key", key, "--state-dir"])
            .arg(&gw.state)
            .args(["--sandbox", id]),
    );
    let (stdout, stderr) = text(&out);
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("local receipt of {id} is not JSON ({e}): {stdout}{stderr}"))
}

/// The status and detail of the integrity check `name`.
pub(crate) fn check(receipt: &Value, name: &str) -> (String, String) {
    let c = receipt["integrity"]["checks"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no check {name:?}: {}", receipt["integrity"]));
    (
        c["status"].as_str().unwrap_or_default().to_string(),
        c["detail"].as_str().unwrap_or_default().to_string(),
    )
}

pub(crate) fn status(receipt: &Value) -> &str {
    receipt["integrity"]["status"].as_str().unwrap_or_default()
}

pub(crate) fn requests(receipt: &Value) -> u64 {
    receipt["services"]
        .as_object()
        .map(|s| {
            s.values()
                .map(|v| v["requests"].as_u64().unwrap_or(0))
                .sum()
        })
        .unwrap_or(0)
}

/// The listed requests as (service, method, path, status), sorted.
fn listed(receipt: &Value) -> Vec<(String, String, String, u64)> {
    let mut out = Vec::new();
    for (name, s) in receipt["services"].as_object().into_iter().flatten() {
        for e in s["entries"].as_array().into_iter().flatten() {
            out.push((
                name.clone(),
                e["method"].as_str().unwrap_or_default().to_string(),
                e["path"].as_str().unwrap_or_default().to_string(),
                e["status"].as_u64().unwrap_or(0),
            ));
        }
    }
    out.sort();
    out
}

pub(crate) fn seal_key(gw: &Gateway) -> String {
    gw.ready["seal_key"]
        .as_str()
        .unwrap_or_else(|| panic!("no seal_key in the ready file: {}", gw.ready))
        .to_string()
}

pub(crate) fn charge(gw: &Gateway, sbx: &support::gateway::Sandbox, n: usize) {
    assert_eq!(
        curl_charges(&sbx.url("socks5h"), n, &gw.ca()),
        n,
        "every charge through {} answered 200",
        sbx.url("socks5h")
    );
}

/// Two gateways, one stream: a sandbox added on one and served by both
/// (the fleet's registry; each gateway keeps its own chain for it), charges
/// through both, both stopped. The stream receipt holds
/// every request of both, each gateway's chain in the stream is exactly its
/// local ledger, complete (its final seal) and sealed by its pinned key;
/// its request list is the merge of the two local receipts'. With both
/// keys pinned (and a canary probe from the sandbox through each gateway)
/// it is `verified`; without the keys it is not, with one key neither.
#[test]
fn two_gateways_one_stream_receipt_is_the_merge_of_the_local_ones() {
    let Some(nats) = Nats::start() else { return };
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let id = "sbx-merge";
    let mut gw1 = start_gateway("fleet-rcpt-1", &nats, "gw1");
    let mut gw2 = start_gateway("fleet-rcpt-2", &nats, "gw2");
    let (k1, k2) = (seal_key(&gw1), seal_key(&gw2));
    // Added on one, served by both (the fleet's registry), each gateway
    // with its own chain for it.
    let s1 = gw1.add_sandbox(id, "stripe");
    let s2 = crate::support::gateway::Sandbox {
        addr: gw2.listen.to_string(),
        ..s1.clone()
    };
    support::wait_for(
        "the sandbox served by the second gateway",
        support::DEADLINE,
        || {
            let (code, body) = gw2.admin_get("/sandboxes");
            (code == 200 && body.contains(&format!("\"{id}\""))).then_some(())
        },
    );
    charge(&gw1, &s1, 3);
    charge(&gw2, &s2, 4);
    charge(&gw1, &s1, 2);
    // A probe from inside each sandbox: the one check a gateway cannot run.
    for (gw, sbx) in [(&gw1, &s1), (&gw2, &s2)] {
        probe_canary(&sbx.url("socks5h"), &gw.ca());
    }
    gateway_published(&gw1, id);
    gateway_published(&gw2, id);
    gw1.stop();
    gw2.stop();

    let r = stream_receipt(&nats, id, &[&k1, &k2]);
    assert_eq!(requests(&r), 9, "{r}");
    assert_eq!(r["twin"], id, "{r}");
    assert_eq!(status(&r), "verified", "{}", r["integrity"]);
    for gw in ["gw1", "gw2"] {
        for c in ["chain", "seals", "canary", "complete"] {
            let (st, detail) = check(&r, &format!("{gw}: {c}"));
            assert_eq!(st, "ok", "{gw}: {c}: {detail}");
        }
    }
    let gws = r["stream"]["gateways"].as_array().expect("stream.gateways");
    assert_eq!(gws.len(), 2, "{}", r["stream"]);
    // Per gateway, the stream holds exactly its local ledger's bytes.
    for (gw, name) in [(&gw1, "gw1"), (&gw2, "gw2")] {
        let local = std::fs::read(gw.ledger_file(id)).expect("ledger");
        let stream: Vec<u8> = nats
            .messages(&format!("veris.ledger.{id}.{name}"))
            .into_iter()
            .flat_map(|m| m.payload)
            .collect();
        assert!(
            stream == local,
            "{name}: the stream's chain is the local ledger"
        );
    }
    // The merge of the two local receipts.
    let (l1, l2) = (local_receipt(&gw1, id, &k1), local_receipt(&gw2, id, &k2));
    assert_eq!(requests(&l1) + requests(&l2), 9);
    let mut both = listed(&l1);
    both.extend(listed(&l2));
    both.sort();
    assert_eq!(listed(&r), both, "the stream receipt's requests");

    // Storage is no anchor: without the keys, or with one, never verified.
    for keys in [vec![], vec![k1.as_str()]] {
        let r = stream_receipt(&nats, id, &keys);
        assert_ne!(status(&r), "verified", "keys {keys:?}: {}", r["integrity"]);
        assert_ne!(check(&r, "gw2: seals").0, "ok", "keys {keys:?}");
        assert_eq!(requests(&r), 9, "keys {keys:?}");
    }

    // The same window as a HAR: the local HARs' entries, each tagged with
    // its gateway, in time order, under the same verdict.
    let local_har = |gw: &Gateway, key: &str| -> Vec<(String, u64, String)> {
        let out = output(&mut gw.veris(&[
            "har",
            "--state-dir",
            gw.state.to_str().unwrap(),
            "--sandbox",
            id,
            "--key",
            key,
        ]));
        let har: Value = serde_json::from_slice(&out.stdout).expect("local HAR");
        har["log"]["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["request"]["url"].as_str().unwrap().to_string(),
                    e["_veris"]["seq"].as_u64().unwrap(),
                    e["startedDateTime"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let stream_har = |keys: &[&str]| -> (Value, std::process::ExitStatus) {
        let mut cmd = support::veris(["har", "--nats", &nats.url(), "--sandbox", id]);
        for k in keys {
            cmd.args(["--key", k]);
        }
        let out = output(&mut cmd);
        let dir = support::TempDir::new("stream-har");
        let path = dir.join("stream.har");
        std::fs::write(&path, &out.stdout).unwrap();
        if crate::har::validator().is_ok() {
            crate::har::validate(&path);
        } else {
            support::record_skip("the stream HAR's schema check: python3 jsonschema missing");
        }
        let har = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", text(&out)));
        (har, out.status)
    };
    let (har, code) = stream_har(&[&k1, &k2]);
    assert!(code.success(), "veris har --nats: {code}");
    assert_eq!(
        har["log"]["_veris"]["integrity"], "verified",
        "{}",
        har["log"]["comment"]
    );
    let entries = har["log"]["entries"].as_array().expect("entries");
    let mut from_stream: Vec<(String, String, u64, String)> = entries
        .iter()
        .map(|e| {
            (
                e["_veris"]["gateway"]
                    .as_str()
                    .expect("_veris.gateway")
                    .to_string(),
                e["request"]["url"].as_str().unwrap().to_string(),
                e["_veris"]["seq"].as_u64().unwrap(),
                e["startedDateTime"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let times: Vec<&String> = from_stream.iter().map(|e| &e.3).collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "not in time order: {times:?}"
    );
    let mut expected: Vec<(String, String, u64, String)> = [("gw1", &gw1, &k1), ("gw2", &gw2, &k2)]
        .into_iter()
        .flat_map(|(name, gw, key)| {
            local_har(gw, key)
                .into_iter()
                .map(move |(u, s, t)| (name.to_string(), u, s, t))
        })
        .collect();
    expected.sort();
    from_stream.sort();
    assert_eq!(from_stream.len(), 9);
    assert_eq!(
        from_stream, expected,
        "the stream HAR's entries are the local HARs'"
    );
    // The MCP tool, configured with the stream and the keys by whoever
    // starts the server: the same verdict and requests.
    let dir = support::TempDir::new("stream-mcp");
    let url = nats.url();
    let mut mcp = crate::mcp::Mcp::start_with(
        &dir.join("state"),
        &dir,
        &["--nats", &url, "--key", &k1, "--key", &k2],
    );
    mcp.initialize();
    let got = mcp.call(
        "veris_receipt",
        serde_json::json!({"sandbox": id, "require_verified": true}),
    );
    assert!(!crate::mcp::is_error(&got), "{}", crate::mcp::text_of(&got));
    let receipt = &got["structuredContent"]["receipt"];
    assert_eq!(status(receipt), "verified", "{got}");
    assert_eq!(requests(receipt), 9, "{got}");
    // A local-ledger argument is refused, not silently ignored.
    let got = mcp.call(
        "veris_receipt",
        serde_json::json!({"sandbox": id, "run": "x"}),
    );
    assert!(crate::mcp::is_error(&got), "{got}");
    // One key pinned: the HAR says so, and holds the same entries.
    let (har, _) = stream_har(&[&k1]);
    assert_ne!(har["log"]["_veris"]["integrity"], "verified");
    assert_eq!(har["log"]["entries"].as_array().map(Vec::len), Some(9));
}

/// Deletes stream messages (`$JS.API.STREAM.MSG.DELETE`), as an operator can.
pub(crate) fn delete(nats: &Nats, seqs: &[u64]) {
    with_js(&nats.url(), async |js| {
        let stream = js
            .get_stream(veris_fleet::DEFAULT_STREAM)
            .await
            .expect("stream");
        for s in seqs {
            stream.delete_message(*s).await.expect("deleting a message");
        }
    })
    .expect("connecting");
}

/// Publishes `payload` on `subject` with veris's headers for lines `first..=last`.
fn publish(nats: &Nats, subject: &str, payload: Vec<u8>, ledger: &str, first: u64, last: u64) {
    with_js(&nats.url(), async |js| {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(veris_fleet::HEADER_LEDGER, ledger);
        headers.insert(veris_fleet::HEADER_FIRST, first.to_string().as_str());
        headers.insert(veris_fleet::HEADER_LAST, last.to_string().as_str());
        js.publish_with_headers(subject.to_string(), headers, payload.into())
            .await
            .expect("publishing")
            .await
            .expect("acknowledged");
    })
    .expect("connecting");
}

/// What someone with write access to the stream can do to a sandbox's
/// chain, each on a sandbox of its own (one gateway, its key pinned): a
/// line altered (the messages from it on deleted and published again with
/// one line changed), a message removed from the middle, the tail removed
/// with every checkpoint, a well-formed chain under a foreign gateway
/// subject sealed by a key nobody pinned, another sandbox's genuine chain
/// under this sandbox's subject, and this sandbox's own chain again under
/// another gateway name. None reads `verified` (receipt or `veris har
/// --nats`); each says why; the copies never add their requests.
#[test]
fn stream_receipt_of_an_altered_stream_is_never_verified() {
    let Some(nats) = Nats::start() else { return };
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let mut gw = start_gateway("fleet-attack", &nats, "gw1");
    let key = seal_key(&gw);
    let ids = ["sbx-alter", "sbx-gap", "sbx-trunc", "sbx-ok"];
    let sandboxes: Vec<_> = ids.iter().map(|id| gw.add_sandbox(id, "stripe")).collect();
    for sbx in &sandboxes {
        // Several publishes: charges a second apart land in messages apart.
        for _ in 0..3 {
            charge(&gw, sbx, 1);
            std::thread::sleep(Duration::from_millis(1100));
        }
    }
    for id in ids {
        gateway_published(&gw, id);
    }
    gw.stop();
    // A gateway that never published: its sandbox's ledger is a
    // well-formed chain sealed by a key nobody pins.
    let mut evil = Gateway::start("fleet-attack-evil", "127.0.0.1:0", &[]);
    let evil_sbx = evil.add_sandbox("sbx-ok", "stripe");
    charge(&evil, &evil_sbx, 2);
    evil.stop();

    for id in ids {
        let r = stream_receipt(&nats, id, &[&key]);
        assert_eq!(requests(&r), 3, "{id} before the attacks: {r}");
        for c in ["chain", "seals", "complete"] {
            assert_eq!(check(&r, &format!("gw1: {c}")).0, "ok", "{id}: {c}: {r}");
        }
    }
    let subject = |id: &str| format!("veris.ledger.{id}.gw1");
    let messages = |id: &str| nats.messages(&subject(id));

    // A line altered: delete the messages from the middle one on, publish
    // them again in order with one path changed.
    let m = messages("sbx-alter");
    assert!(m.len() >= 3, "sbx-alter: {} message(s)", m.len());
    let mid = m.len() / 2;
    delete(
        &nats,
        &m[mid..].iter().map(|x| x.sequence).collect::<Vec<_>>(),
    );
    let mut altered = false;
    for x in &m[mid..] {
        let mut payload = x.payload.clone();
        let text = String::from_utf8_lossy(&payload).to_string();
        if !altered && text.contains("/v1/charges") {
            payload = text.replacen("/v1/charges", "/v1/chargez", 1).into_bytes();
            altered = true;
        }
        publish(
            &nats,
            &subject("sbx-alter"),
            payload,
            &x.ledger_id,
            x.first,
            x.last,
        );
    }
    assert!(altered, "a request line after the middle message");
    let r = stream_receipt(&nats, "sbx-alter", &[&key]);
    assert_eq!(status(&r), "failed", "{}", r["integrity"]);
    assert_eq!(check(&r, "gw1: chain").0, "failed", "{}", r["integrity"]);

    // A message removed from the middle.
    let m = messages("sbx-gap");
    delete(&nats, &[m[m.len() / 2].sequence]);
    let r = stream_receipt(&nats, "sbx-gap", &[&key]);
    assert_eq!(status(&r), "failed", "{}", r["integrity"]);

    // The tail removed, its final seal and every checkpoint with it.
    let m = messages("sbx-trunc");
    delete(&nats, &[m[m.len() - 1].sequence]);
    let cps: Vec<u64> = nats
        .messages("veris.checkpoint.sbx-trunc.gw1")
        .iter()
        .map(|x| x.sequence)
        .collect();
    delete(&nats, &cps);
    let r = stream_receipt(&nats, "sbx-trunc", &[&key]);
    assert_ne!(status(&r), "verified", "{}", r["integrity"]);
    let (st, detail) = check(&r, "gw1: complete");
    assert_eq!(st, "unverified", "{detail}");

    // A foreign gateway's well-formed chain, another sandbox's genuine
    // chain, and this sandbox's own chain again under another name.
    let evil_ledger = std::fs::read(evil.ledger_file("sbx-ok")).expect("ledger");
    publish(
        &nats,
        &subject("sbx-ok").replace("gw1", "fakegw"),
        evil_ledger,
        "feedfeedfeedfeed",
        1,
        1,
    );
    let other = std::fs::read(gw.ledger_file("sbx-gap")).expect("ledger");
    publish(
        &nats,
        &subject("sbx-ok").replace("gw1", "copygw"),
        other,
        "0000000000000000",
        1,
        1,
    );
    let own = std::fs::read(gw.ledger_file("sbx-ok")).expect("ledger");
    publish(
        &nats,
        &subject("sbx-ok").replace("gw1", "dupgw"),
        own,
        "1111111111111111",
        1,
        1,
    );
    let r = stream_receipt(&nats, "sbx-ok", &[&key]);
    assert_ne!(status(&r), "verified", "{}", r["integrity"]);
    assert_eq!(check(&r, "fakegw: seals").0, "failed", "{}", r["integrity"]);
    assert_eq!(
        check(&r, "copygw: sandbox").0,
        "failed",
        "{}",
        r["integrity"]
    );
    assert_eq!(check(&r, "dupgw: copy").0, "failed", "{}", r["integrity"]);
    // gw1's three and the foreign gateway's two: copies never count.
    assert_eq!(requests(&r), 5, "{r}");
    for gw in ["gw1"] {
        for c in ["chain", "seals", "complete"] {
            assert_eq!(check(&r, &format!("{gw}: {c}")).0, "ok", "{c}");
        }
    }
    // The HAR from the stream says what the receipt says.
    for id in ids {
        let out = output(&mut support::veris([
            "har",
            "--nats",
            &nats.url(),
            "--sandbox",
            id,
            "--key",
            &key,
        ]));
        let har: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{id}: not JSON ({e}): {:?}", text(&out)));
        assert_ne!(
            har["log"]["_veris"]["integrity"], "verified",
            "{id}: {}",
            har["log"]["comment"]
        );
    }
}

/// A live gateway: its sandbox's chain in the stream has no final seal, so
/// it is complete only when the gateway's checkpoint was stored after the
/// read began (`--nats-wait`, while the sandbox makes calls): then, with
/// its key pinned and a canary probe, every check holds, its window ending
/// at that checkpoint, but the twin cross-check (only the gateway runs
/// it, at its final seal); read after the calls stopped, the chain is not
/// complete. After a restart (a new seal key, a new session in the
/// same chain) the latest session verifies with the new key alone, the
/// whole chain only with both keys.
#[test]
fn a_live_gateway_chain_is_complete_only_with_a_fresh_checkpoint() {
    let Some(nats) = Nats::start() else { return };
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let id = "sbx-live";
    let mut gw = start_gateway("fleet-live", &nats, "gw1");
    let k1 = seal_key(&gw);
    let sbx = gw.add_sandbox(id, "stripe");
    probe_canary(&sbx.url("socks5h"), &gw.ca());
    charge(&gw, &sbx, 2);
    gateway_published(&gw, id);

    let r = stream_receipt(&nats, id, &[&k1]);
    let (st, detail) = check(&r, "gw1: complete");
    assert_eq!(st, "unverified", "{detail}");
    assert!(detail.contains("not newer than this read"), "{detail}");
    assert_ne!(status(&r), "verified", "{}", r["integrity"]);

    // Calls while the reader waits for a checkpoint newer than its start.
    let mut cmd = support::veris([
        "receipt",
        "--json",
        "--nats",
        &nats.url(),
        "--sandbox",
        id,
        "--key",
        &k1,
        "--nats-wait",
        "30",
    ]);
    let dir = support::TempDir::new("fleet-live-receipt");
    let out_file = dir.join("receipt.json");
    let mut guard = support::Guard::spawn(
        cmd.stdout(std::fs::File::create(&out_file).expect("stdout file"))
            .stderr(std::fs::File::create(dir.join("stderr")).expect("stderr file")),
    );
    // Bounded: the receipt waits at most 30 s, a charge takes well under 1 s.
    for _ in 0..100 {
        if let Ok(Some(_)) = guard.child().try_wait() {
            break;
        }
        charge(&gw, &sbx, 1);
    }
    guard.wait();
    let stdout = std::fs::read_to_string(&out_file).unwrap_or_default();
    let stderr = std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
    let r: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("receipt --nats-wait is not JSON ({e}): {stdout}{stderr}"));
    let (st, detail) = check(&r, "gw1: complete");
    assert_eq!(st, "ok", "{detail}");
    assert!(detail.contains("stored after this read began"), "{detail}");
    for c in ["chain", "seals", "canary"] {
        let (st, detail) = check(&r, &format!("gw1: {c}"));
        assert_eq!(st, "ok", "{c}: {detail}");
    }
    // The one check only the gateway can run, at its final seal.
    let (st, detail) = check(&r, "gw1: twin_cross_check");
    assert_eq!(st, "unverified", "{detail}");
    assert!(detail.contains("the sandbox is live"), "{detail}");
    assert_eq!(status(&r), "unverified", "{}", r["integrity"]);
    assert!(requests(&r) >= 3, "{r}");

    // Restarted: a new key seals the new session of the same chain.
    let flags = gateway_flags(&nats, "gw1");
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    gw.restart(&flags);
    let k2 = seal_key(&gw);
    assert_ne!(k1, k2, "a new seal key at each start");
    charge(&gw, &sbx, 2);
    gateway_published(&gw, id);
    gw.stop();
    let latest = stream_receipt(&nats, id, &[&k2]);
    assert_eq!(requests(&latest), 2, "{latest}");
    for c in ["chain", "seals", "complete"] {
        let (st, detail) = check(&latest, &format!("gw1: {c}"));
        assert_eq!(st, "ok", "latest session, {c}: {detail}");
    }
    let all = stream_receipt_with(&nats, id, &[&k1, &k2], &["--all"]);
    assert_eq!(check(&all, "gw1: seals").0, "ok", "{}", all["integrity"]);
    let half = stream_receipt_with(&nats, id, &[&k2], &["--all"]);
    assert_ne!(check(&half, "gw1: seals").0, "ok", "{}", half["integrity"]);
    assert_ne!(status(&half), "verified");
}
