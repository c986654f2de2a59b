//! One operator key for the fleet (`veris fleet-key`, `veris gateway
//! --fleet-identity`, `veris receipt --nats --fleet-key`, G2): gateways
//! certify each run's seal key in the bucket VERIS_KEYS, and a reader who
//! pins the operator key verifies every gateway's chain, restarts
//! included. The bucket is storage anyone with write access to NATS could
//! fill: each attack below writes an entry naming a gateway's real seal
//! key (a reader that trusted the bucket would pin it, and read
//! `verified`, as pinning that key by hand does) and must leave the chain
//! `unverified`, saying which link failed.

use std::path::{Path, PathBuf};

use serde_json::Value;
use veris_receipt::fleet_cert::{IdentityCert, KeyEntry, SealKeyCert};
use veris_receipt::seal::{PublicKeys, Sealer};

use crate::fleet::{gateway_flags, gateway_published};
use crate::fleet_receipt::{charge, check, requests, seal_key, status, stream_receipt_with};
use crate::support::gateway::{probe_canary, Gateway, Sandbox};
use crate::support::nats::{with_js, with_js_as, Nats, READER_PASSWORD, SANDBOX_PASSWORD};
use crate::support::{self, output, skip, text, wait_for, TempDir, DEADLINE};

const BUCKET: &str = "VERIS_KEYS";

/// `veris fleet-key new --out DIR/op`: the fingerprint and the key file.
fn operator(dir: &TempDir, name: &str) -> (String, PathBuf) {
    let out = dir.join(name);
    let o = output(support::veris(["fleet-key", "new", "--out"]).arg(&out));
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "fleet-key new: {stderr}");
    let fp = stdout.lines().last().unwrap_or_default().trim().to_string();
    assert_eq!(fp.len(), 64, "{stdout}");
    (fp, out.join("operator.key"))
}

/// `veris fleet-key certify`: the identity directory.
fn certify(operator_key: &Path, gateway: &str, dir: &TempDir, name: &str) -> PathBuf {
    let out = dir.join(name);
    let o = output(
        support::veris([
            "fleet-key",
            "certify",
            "--gateway",
            gateway,
            "--operator-key",
        ])
        .arg(operator_key)
        .arg("--out")
        .arg(&out),
    );
    assert!(o.status.success(), "fleet-key certify: {}", text(&o).1);
    out
}

fn start(label: &str, nats: &Nats, name: &str, identity: Option<&Path>) -> (Gateway, Vec<String>) {
    let mut flags = gateway_flags(nats, name);
    if let Some(dir) = identity {
        flags.extend(["--fleet-identity".to_string(), dir.display().to_string()]);
    }
    let f: Vec<&str> = flags.iter().map(String::as_str).collect();
    (Gateway::start(label, "127.0.0.1:0", &f), flags)
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A bucket entry as whoever `url` names sees it.
fn bucket_get(url: &str, key: &str) -> Option<Vec<u8>> {
    with_js(url, async |js| {
        let store = js.get_key_value(BUCKET).await.ok()?;
        store.get(key).await.ok()?.map(|b| b.to_vec())
    })
    .ok()
    .flatten()
}

/// Waits until the gateway's current seal key is certified in the bucket.
fn wait_certified(url: &str, name: &str, gw: &Gateway) {
    let key = format!("{name}.{}", seal_key(gw));
    wait_for("the seal key in VERIS_KEYS", DEADLINE, || {
        bucket_get(url, &key).map(|_| ())
    });
}

/// Writes `value` at `key` (a server without users: anyone can).
fn bucket_put(url: &str, key: &str, value: Vec<u8>) {
    with_js(url, async |js| {
        let store = js.get_key_value(BUCKET).await.expect("the bucket");
        store.put(key, value.into()).await.expect("put");
    })
    .expect("connects");
}

/// The raw seal key (hex) of the gateway's newest session of sandbox `id`.
fn session_key(gw: &Gateway, id: &str) -> String {
    gw.ledger(id)
        .iter()
        .rev()
        .find(|l| l["kind"] == "session")
        .and_then(|l| l["public_key"].as_str())
        .expect("a session line with its public key")
        .to_string()
}

/// A sandbox added on `a`, served by `b` too (the fleet's registry).
fn shared_sandbox(a: &Gateway, b: &Gateway, id: &str) -> (Sandbox, Sandbox) {
    let s1 = a.add_sandbox(id, "stripe");
    let s2 = Sandbox {
        addr: b.listen.to_string(),
        ..s1.clone()
    };
    wait_for("the sandbox served by the second gateway", DEADLINE, || {
        let (code, body) = b.admin_get("/sandboxes");
        (code == 200 && body.contains(&format!("\"{id}\""))).then_some(())
    });
    (s1, s2)
}

/// Two gateways with identities the same operator key certified, one of
/// them restarted (a new seal key) and both stopped: one `--fleet-key`
/// pin verifies the whole stream receipt, the session from before the
/// restart included (`--all`), and the latest one; without the pin the
/// same stream is not `verified`.
#[test]
fn one_fleet_key_verifies_every_gateway_across_restarts() {
    let Some(nats) = Nats::start() else { return };
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let dir = TempDir::new("fleet-keys");
    let (fp, op) = operator(&dir, "op");
    let (i1, i2) = (
        certify(&op, "gw1", &dir, "gw1"),
        certify(&op, "gw2", &dir, "gw2"),
    );
    let (mut gw1, f1) = start("fleet-keys-1", &nats, "gw1", Some(&i1));
    let (mut gw2, _) = start("fleet-keys-2", &nats, "gw2", Some(&i2));
    let id = "sbx-keys";
    let (s1, s2) = shared_sandbox(&gw1, &gw2, id);
    charge(&gw1, &s1, 2);
    charge(&gw2, &s2, 2);
    probe_canary(&s1.url("socks5h"), &gw1.ca());
    probe_canary(&s2.url("socks5h"), &gw2.ca());
    let before = seal_key(&gw1);
    gw1.restart(&strs(&f1));
    assert_ne!(seal_key(&gw1), before, "a new seal key at each start");
    probe_canary(&s1.url("socks5h"), &gw1.ca());
    charge(&gw1, &s1, 3);
    gateway_published(&gw1, id);
    gateway_published(&gw2, id);
    wait_certified(&nats.url(), "gw1", &gw1);
    wait_certified(&nats.url(), "gw2", &gw2);
    assert!(bucket_get(&nats.url(), &format!("gw1.{before}")).is_some());
    gw1.stop();
    gw2.stop();

    let all = stream_receipt_with(&nats, id, &[], &["--all", "--fleet-key", &fp]);
    assert_eq!(requests(&all), 7, "{all}");
    for gw in ["gw1", "gw2"] {
        for c in ["fleet_key", "seals", "chain", "complete"] {
            let (st, detail) = check(&all, &format!("{gw}: {c}"));
            assert_eq!(st, "ok", "--all, {gw}: {c}: {detail}");
        }
    }
    assert_eq!(status(&all), "verified", "{}", all["integrity"]);
    let (_, detail) = check(&all, "gw1: fleet_key");
    assert!(detail.starts_with("2 seal key(s) certified"), "{detail}");
    let latest = stream_receipt_with(&nats, id, &[], &["--fleet-key", &fp]);
    assert_eq!(requests(&latest), 5, "{latest}");
    assert_eq!(status(&latest), "verified", "{}", latest["integrity"]);
    // The pin as operator.pub's file works the same.
    let public = op.with_file_name("operator.pub").display().to_string();
    let by_file = stream_receipt_with(&nats, id, &[], &["--all", "--fleet-key", &public]);
    assert_eq!(status(&by_file), "verified", "{}", by_file["integrity"]);
    // Storage is no anchor: the same stream and bucket, no pin.
    let none = stream_receipt_with(&nats, id, &[], &["--all"]);
    assert_ne!(status(&none), "verified", "{}", none["integrity"]);
}

/// gw1 certifies its keys, gw2 does not: gw2's chain has no entry (then
/// one forged entry after another) and reads `unverified` (never
/// `failed`) with the link that failed, while gw1's verifies. Each forged
/// entry names gw2's real seal key: pinned by hand (what a reader that
/// trusted the bucket would do), the receipt is `verified`.
#[test]
fn bucket_entries_that_do_not_chain_to_the_pinned_operator_key_certify_nothing() {
    let Some(nats) = Nats::start() else { return };
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let url = nats.url();
    let dir = TempDir::new("fleet-keys-forged");
    let (fp, op) = operator(&dir, "op");
    let (_, other_op) = operator(&dir, "other-op");
    let i1 = certify(&op, "gw1", &dir, "gw1");
    let evil = certify(&other_op, "gw2", &dir, "evil-gw2");
    let (mut gw1, _) = start("fleet-forged-1", &nats, "gw1", Some(&i1));
    let (mut gw2, _) = start("fleet-forged-2", &nats, "gw2", None);
    let id = "sbx-forged";
    let (s1, s2) = shared_sandbox(&gw1, &gw2, id);
    charge(&gw1, &s1, 1);
    charge(&gw2, &s2, 2);
    probe_canary(&s1.url("socks5h"), &gw1.ca());
    probe_canary(&s2.url("socks5h"), &gw2.ca());
    gateway_published(&gw1, id);
    gateway_published(&gw2, id);
    wait_certified(&url, "gw1", &gw1);
    let (k1, k2) = (seal_key(&gw1), seal_key(&gw2));
    let k2_raw = session_key(&gw2, id);
    gw1.stop();
    gw2.stop();

    let trusted = stream_receipt_with(&nats, id, &[&k1, &k2], &[]);
    assert_eq!(status(&trusted), "verified", "{}", trusted["integrity"]);

    let judge = |what: &str, expect: &str| {
        let r = stream_receipt_with(&nats, id, &[], &["--fleet-key", &fp]);
        assert_eq!(requests(&r), 3, "{what}: {r}");
        assert_eq!(check(&r, "gw1: fleet_key").0, "ok", "{what}");
        assert_eq!(check(&r, "gw1: seals").0, "ok", "{what}");
        let (st, detail) = check(&r, "gw2: fleet_key");
        assert_eq!(st, "unverified", "{what}: {detail}");
        assert!(detail.contains(expect), "{what}: {detail}");
        assert_eq!(check(&r, "gw2: seals").0, "unverified", "{what}");
        assert_eq!(status(&r), "unverified", "{what}: {}", r["integrity"]);
    };
    judge("no entry", "holds no entry gw2.");

    let key = format!("gw2.{k2}");
    let seal = PublicKeys::from_hex(&k2_raw).expect("gw2's seal key");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let load = |d: &Path| -> (Sealer, IdentityCert) {
        let der = std::fs::read(d.join("identity.key")).expect("identity.key");
        let cert = std::fs::read(d.join("identity.cert")).expect("identity.cert");
        (
            Sealer::from_pkcs8(&der).expect("an identity key"),
            serde_json::from_slice(&cert).expect("an identity cert"),
        )
    };
    let entry = |identity: &(Sealer, IdentityCert), name: &str| {
        serde_json::to_vec(&KeyEntry {
            identity: identity.1.clone(),
            seal: SealKeyCert::issue(&identity.0, name, &seal, now),
        })
        .expect("json")
    };
    // Certified by another operator key.
    bucket_put(&url, &key, entry(&load(&evil), "gw2"));
    judge("another operator", "not the pinned one");
    // A bare key, and a garbled certificate.
    bucket_put(&url, &key, format!("ed25519 {k2_raw}\n").into_bytes());
    judge("bare key", "not a certificate pair");
    let real = bucket_get(&url, &format!("gw1.{k1}")).expect("gw1's entry");
    bucket_put(&url, &key, real[..real.len() / 2].to_vec());
    judge("garbled", "not a certificate pair");
    // gw1's entry with its names changed to gw2's.
    let mut v: Value = serde_json::from_slice(&real).expect("json");
    v["identity"]["gateway"] = "gw2".into();
    v["seal"]["gateway"] = "gw2".into();
    bucket_put(&url, &key, serde_json::to_vec(&v).expect("json"));
    judge("renamed", "altered");
    // gw1's valid identity certifying gw2's key, as gw2's and as its own.
    let gw1_identity = load(&i1);
    bucket_put(&url, &key, entry(&gw1_identity, "gw2"));
    judge("gw1's identity", "is gateway \"gw1\"'s, not \"gw2\"'s");
    bucket_put(&url, &key, entry(&gw1_identity, "gw1"));
    judge(
        "gw1's identity, gw1's name",
        "is gateway \"gw1\"'s, not \"gw2\"'s",
    );
}

/// No gateway certified a key: the bucket does not exist. The receipt
/// says so, `unverified`, with no crash and nothing `failed`. Then the
/// gateway is restarted with an identity (a fleet adopting `--fleet-key`):
/// the latest session verifies with the one pin, the whole chain names
/// the earlier session's key as the one not certified.
#[test]
fn without_the_key_bucket_a_fleet_key_reads_unverified_and_says_why() {
    let Some(nats) = Nats::start() else { return };
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let (mut gw, _) = start("fleet-nobucket", &nats, "gw1", None);
    let id = "sbx-nobucket";
    let s = gw.add_sandbox(id, "stripe");
    charge(&gw, &s, 1);
    gateway_published(&gw, id);
    let old = seal_key(&gw);
    gw.stop();
    let dir = TempDir::new("fleet-keys-adopt");
    let (fp, op) = operator(&dir, "op");
    let r = stream_receipt_with(&nats, id, &[], &["--fleet-key", &fp]);
    let (st, detail) = check(&r, "gw1: fleet_key");
    assert_eq!(st, "unverified", "{detail}");
    assert!(detail.contains("could not be read"), "{detail}");
    assert_eq!(check(&r, "gw1: seals").0, "unverified");
    assert_eq!(status(&r), "unverified", "{}", r["integrity"]);
    assert_eq!(requests(&r), 1);

    let i1 = certify(&op, "gw1", &dir, "gw1");
    let mut flags = gateway_flags(&nats, "gw1");
    flags.extend(["--fleet-identity".into(), i1.display().to_string()]);
    gw.restart(&strs(&flags));
    charge(&gw, &s, 2);
    gateway_published(&gw, id);
    wait_certified(&nats.url(), "gw1", &gw);
    gw.stop();
    let latest = stream_receipt_with(&nats, id, &[], &["--fleet-key", &fp]);
    assert_eq!(requests(&latest), 2, "{latest}");
    for c in ["fleet_key", "seals", "chain", "complete"] {
        let (st, detail) = check(&latest, &format!("gw1: {c}"));
        assert_eq!(st, "ok", "latest session, {c}: {detail}");
    }
    let all = stream_receipt_with(&nats, id, &[], &["--all", "--fleet-key", &fp]);
    let (st, detail) = check(&all, "gw1: fleet_key");
    assert_eq!(st, "unverified", "{detail}");
    assert!(
        detail.contains(&format!(
            "seal key {old}: the bucket VERIS_KEYS holds no entry"
        )),
        "{detail}"
    );
    assert_eq!(check(&all, "gw1: seals").0, "unverified");
    assert_eq!(status(&all), "unverified", "{}", all["integrity"]);
}

/// Bad input: a gateway refuses an identity certified for another name,
/// or whose key file others may read; a reader refuses the operator's
/// private key as a pin; a key is never overwritten.
#[test]
fn fleet_keys_refuse_bad_input_with_the_next_step() {
    let dir = TempDir::new("fleet-keys-bad");
    let (_, op) = operator(&dir, "op");
    let again = output(support::veris(["fleet-key", "new", "--out"]).arg(dir.join("op")));
    assert!(!again.status.success());
    assert!(
        text(&again).1.contains("never overwrites"),
        "{}",
        text(&again).1
    );
    let i1 = certify(&op, "gw1", &dir, "gw1");
    let gateway = |name: &str| {
        output(
            support::veris(["gateway", "--listen", "127.0.0.1:0", "--state-dir"])
                .arg(dir.join(format!("state-{name}")))
                .args(["--nats", "nats://127.0.0.1:1", "--nats-name", name])
                .arg("--fleet-identity")
                .arg(&i1),
        )
    };
    let o = gateway("gw2");
    assert!(!o.status.success());
    let err = text(&o).1;
    assert!(
        err.contains("gateway \"gw1\"'s") && err.contains("Next:"),
        "{err}"
    );
    use std::os::unix::fs::PermissionsExt;
    let key = i1.join("identity.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let o = gateway("gw1");
    assert!(!o.status.success());
    assert!(text(&o).1.contains("readable by others"), "{}", text(&o).1);
    let o = output(
        support::veris([
            "receipt",
            "--nats",
            "nats://127.0.0.1:1",
            "--sandbox",
            "sbx",
            "--fleet-key",
        ])
        .arg(&op),
    );
    assert!(!o.status.success());
    assert!(text(&o).1.contains("private key file"), "{}", text(&o).1);
}

/// deploy/nats/nats-server.conf: the gateway (its nkey) creates the key
/// bucket and certifies its seal key under its own name; it cannot write
/// a key under another gateway's name, the `reader` and `sandbox` users
/// none at all, and the sandbox user cannot read the bucket.
#[test]
fn only_a_gateway_writes_its_own_keys_in_the_key_bucket() {
    let nkey = nkeys::KeyPair::new_user();
    let Some(nats) = Nats::start_with_auth(&nkey.public_key()) else {
        return;
    };
    let dir = TempDir::new("fleet-keys-perm");
    let (_, op) = operator(&dir, "op");
    let i1 = certify(&op, "gw1", &dir, "gw1");
    let seed = nkey.seed().expect("seed");
    let seed_file = nats.dir.join("gw1.seed");
    std::fs::write(&seed_file, format!("{seed}\n")).expect("seed file");
    let mut flags = gateway_flags(&nats, "gw1");
    flags.extend(["--nats-creds".into(), seed_file.display().to_string()]);
    flags.extend(["--fleet-identity".into(), i1.display().to_string()]);
    let mut gw = Gateway::start("fleet-keys-perm", "127.0.0.1:0", &strs(&flags));
    let reader = format!("nats://reader:{READER_PASSWORD}@127.0.0.1:{}", nats.port);
    let sandbox = format!("nats://sandbox:{SANDBOX_PASSWORD}@127.0.0.1:{}", nats.port);
    wait_certified(&reader, "gw1", &gw);
    let own = format!("gw1.{}", seal_key(&gw));
    let before = bucket_get(&reader, &own).expect("the reader reads the bucket");
    let put = |url: &str, seed: Option<&str>, key: &str| {
        with_js_as(url, seed, async |js| {
            let store = js.get_key_value(BUCKET).await.map_err(|e| e.to_string())?;
            store
                .put(key, b"ed25519 00".to_vec().into())
                .await
                .map_err(|e| e.to_string())
        })
        .and_then(|r| r)
    };
    let other = format!("gw2.{}", "0".repeat(64));
    let attempt = put(&nats.url(), Some(&seed), &other);
    assert!(attempt.is_err(), "gw1 wrote under gw2's name: {attempt:?}");
    for (who, url) in [("reader", &reader), ("sandbox", &sandbox)] {
        for key in [&own, &other] {
            let attempt = put(url, None, key);
            assert!(attempt.is_err(), "{who} put {key}: {attempt:?}");
        }
    }
    assert!(
        with_js(&sandbox, async |js| js.get_key_value(BUCKET).await.is_err()).expect("connects"),
        "the sandbox user reads the bucket"
    );
    assert_eq!(bucket_get(&reader, &own), Some(before), "unchanged");
    assert_eq!(bucket_get(&reader, &other), None);
    gw.stop();
}

/// Attack: someone who can delete stream messages cuts a sandbox's chain
/// back to the final seal of an earlier gateway run (with every checkpoint
/// after it), so the chain looks ended and the later run's requests are
/// gone. The gateway restarted in between with a new seal key, and writes a
/// session line to every sandbox it holds at each start: with the operator
/// key pinned, the key bucket shows the newer key, so `complete` is
/// `unverified` (never `verified`), as it is with both runs' keys pinned by
/// hand. A sandbox removed and one expired before the restart end with
/// their `removed` seal, as does one that expired while the gateway was
/// down (at its next start): they still read `verified`, and a removed id
/// is not served again.
#[test]
fn a_chain_cut_back_to_an_earlier_runs_final_seal_never_reads_verified() {
    let Some(nats) = Nats::start() else { return };
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let dir = TempDir::new("fleet-keys-rollback");
    let (fp, op) = operator(&dir, "op");
    let i1 = certify(&op, "gw1", &dir, "gw1");
    let (mut gw, flags) = start("fleet-rollback", &nats, "gw1", Some(&i1));
    let (cut, gone, short, late) = ("sbx-cut", "sbx-gone", "sbx-short", "sbx-late");
    let s = gw.add_sandbox(cut, "stripe");
    let g = gw.add_sandbox(gone, "stripe");
    charge(&gw, &s, 2);
    charge(&gw, &g, 1);
    probe_canary(&s.url("socks5h"), &gw.ca());
    probe_canary(&g.url("socks5h"), &gw.ca());
    gw.remove_sandbox(gone);
    let out = gw.admin_command(
        "add-sandbox",
        &[short, "--services", "stripe", "--ttl", "3"],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let t = Sandbox::from_url(short, stdout.lines().last().unwrap_or_default().trim());
    probe_canary(&t.url("socks5h"), &gw.ca());
    gw.wait_expired(short);
    // One that expires while the gateway is down: its chain gets its
    // `removed` seal at the next start.
    let added = std::time::Instant::now();
    let out = gw.admin_command("add-sandbox", &[late, "--services", "stripe", "--ttl", "4"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let l = Sandbox::from_url(late, stdout.lines().last().unwrap_or_default().trim());
    probe_canary(&l.url("socks5h"), &gw.ca());
    let k1 = seal_key(&gw);
    wait_certified(&nats.url(), "gw1", &gw);
    gw.stop();
    std::thread::sleep(
        (added + std::time::Duration::from_secs(5))
            .saturating_duration_since(std::time::Instant::now()),
    );
    gw.restart(&strs(&flags));
    let k2 = seal_key(&gw);
    assert_ne!(k1, k2, "a new seal key at each start");
    wait_certified(&nats.url(), "gw1", &gw);
    charge(&gw, &s, 3);
    probe_canary(&s.url("socks5h"), &gw.ca());
    gateway_published(&gw, cut);
    // A removed id is served once.
    let again = gw.admin_command("add-sandbox", &[gone, "--services", "stripe"]);
    let (stdout, stderr) = text(&again);
    assert!(
        !again.status.success(),
        "a removed id added again: {stdout}"
    );
    assert!(stderr.contains("an id is served once"), "{stderr}");
    gw.stop();

    let by_fleet = |id: &str| stream_receipt_with(&nats, id, &[], &["--all", "--fleet-key", &fp]);
    let by_keys =
        |id: &str| stream_receipt_with(&nats, id, &[k1.as_str(), k2.as_str()], &["--all"]);
    // Before the cut: both ways verified, with all 5 requests.
    for r in [by_fleet(cut), by_keys(cut)] {
        assert_eq!(status(&r), "verified", "{}", r["integrity"]);
        assert_eq!(requests(&r), 5, "{r}");
    }
    // Ended before the restart: verified by the fleet key.
    for id in [gone, short, late] {
        let r = by_fleet(id);
        let (st, detail) = check(&r, "gw1: complete");
        assert!(st == "ok" && detail.contains("(removed)"), "{id}: {detail}");
        for c in ["chain", "seals", "fleet_key"] {
            assert_eq!(check(&r, &format!("gw1: {c}")).0, "ok", "{id}: {c}: {r}");
        }
        // The late one's last session (its end, written at the restart)
        // saw no canary probe: that alone is unverified.
        if id != late {
            assert_eq!(status(&r), "verified", "{id}: {}", r["integrity"]);
        }
    }

    // The cut: every message and checkpoint after run 1's final seal.
    let lines: Vec<Value> = gw.ledger(cut);
    let run1_end = lines
        .iter()
        .find(|l| l["kind"] == "seal" && l["reason"] == "shutdown")
        .and_then(|l| l["seq"].as_u64())
        .expect("run 1's final seal");
    let mut doomed: Vec<u64> = nats
        .messages(&format!("veris.ledger.{cut}.gw1"))
        .iter()
        .filter(|m| m.first > run1_end)
        .map(|m| m.sequence)
        .collect();
    assert!(!doomed.is_empty(), "run 2's lines are in the stream");
    doomed.extend(
        nats.messages(&format!("veris.checkpoint.{cut}.gw1"))
            .iter()
            .filter(|m| {
                serde_json::from_slice::<Value>(m.payload.trim_ascii_end())
                    .ok()
                    .and_then(|v| v["seq"].as_u64())
                    .is_none_or(|seq| seq > run1_end)
            })
            .map(|m| m.sequence),
    );
    crate::fleet_receipt::delete(&nats, &doomed);

    let r = by_fleet(cut);
    assert_eq!(requests(&r), 2, "the cut chain holds run 1's requests: {r}");
    assert_ne!(status(&r), "verified", "{}", r["integrity"]);
    let (st, detail) = check(&r, "gw1: complete");
    assert_eq!(st, "unverified", "{detail}");
    assert!(
        detail.contains(&k2) && detail.contains("started again"),
        "{detail}"
    );
    let r = by_keys(cut);
    assert_ne!(status(&r), "verified", "{}", r["integrity"]);
    let (st, detail) = check(&r, "pins");
    assert_eq!(st, "unverified", "{detail}");
    assert!(detail.contains(&k2), "{detail}");
}
