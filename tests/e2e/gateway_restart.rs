//! A gateway restart keeps its sandboxes (DESIGN §13): each sandbox's
//! registration record (`<state>/sandboxes/<id>/sandbox.json`) brings it
//! back with the same credentials and read token, its ledger continued
//! under the new run's key; a removed or expired sandbox never comes back;
//! after a SIGKILL the receipt says the crashed session had no final seal;
//! and records a workload could plant (a symlink, a FIFO, a linked
//! directory, a hostile id, a huge file) are skipped with a log line while
//! the gateway serves the others.

use std::path::Path;

use serde_json::Value;

use crate::support::gateway::*;
use crate::support::{self, command, output, skip, text, wait_for, DEADLINE};

/// One curl call through `proxy` that must be refused.
fn refused(proxy: &str, ca: &Path, who: &str) {
    let (ok, status, stderr) = curl_charge(proxy, HTTPS_CHARGES, ca);
    assert!(
        !ok,
        "{who} must be refused, curl got through with {status}: {stderr}"
    );
}

/// The ids `list-sandboxes` names.
fn listed(gw: &Gateway) -> String {
    let out = gw.admin_command("list-sandboxes", &[]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "list-sandboxes: {stdout}{stderr}");
    stdout
}

/// `veris receipt --json --all` of sandbox `id`, the seal keys `keys`
/// (each run's, from its ready file) pinned.
fn receipt_pinned(gw: &Gateway, id: &str, keys: &[String]) -> Value {
    let file = gw.dir.join(format!("keys-{id}"));
    std::fs::write(&file, keys.join("\n") + "\n").unwrap();
    let out = output(
        gw.veris(&["receipt", "--json", "--all", "--key"])
            .arg(&file)
            .arg("--state-dir")
            .arg(&gw.state)
            .args(["--sandbox", id]),
    );
    let (stdout, stderr) = text(&out);
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("receipt --sandbox {id} is not JSON ({e}): {stdout}{stderr}"))
}

/// The status of the receipt's integrity check `name`.
fn check(receipt: &Value, name: &str) -> String {
    receipt["integrity"]["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == name)
        .map(|c| c["status"].as_str().unwrap_or_default().to_string())
        .unwrap_or_default()
}

/// The seal key of the gateway's current run.
fn seal_key(gw: &Gateway) -> String {
    gw.ready["seal_key"].as_str().expect("seal_key").to_string()
}

fn sessions(lines: &[Value]) -> Vec<&Value> {
    lines.iter().filter(|l| l["kind"] == "session").collect()
}

/// `add-sandbox ID --services stripe --ttl 2`, then polled until the
/// gateway lists it expired.
fn add_expiring(gw: &Gateway, id: &str) -> Sandbox {
    let out = gw.admin_command("add-sandbox", &[id, "--services", "stripe", "--ttl", "2"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "add-sandbox {id}: {stdout}{stderr}");
    let sandbox = Sandbox::from_url(id, stdout.lines().last().unwrap_or_default().trim());
    gw.wait_expired(id);
    sandbox
}

/// Attack and item: a SIGTERM restart on the same state dir and port.
/// A's and B's URLs (same credentials) still work, A's read token still
/// reads A (and not B), a removed sandbox stays refused and an expired
/// one is not restored; the receipts hold both runs' calls, A's (probed
/// in each run) reads verified, and `ledger.pub` keeps both runs' keys.
#[test]
fn after_a_restart_the_same_urls_and_read_tokens_work_and_removed_ones_stay_refused() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let mut gw = Gateway::start("gw-restart", "127.0.0.1:0", &[]);
    let a = gw.add_sandbox_json("sbx-a", "stripe");
    let b = gw.add_sandbox_json("sbx-b", "stripe");
    let gone = gw.add_sandbox("sbx-gone", "stripe");
    let ca = gw.ca();
    charge_ok(&a.url("socks5h"), &ca, "A");
    charge_ok(&b.url("http"), &ca, "B");
    charge_ok(&gone.url("socks5h"), &ca, "the one to be removed");
    assert_eq!(probe_canary(&a.url("socks5h"), &ca)["sandbox_id"], "sbx-a");
    gw.remove_sandbox("sbx-gone");
    let short = add_expiring(&gw, "sbx-short");
    let token_a = a.json.as_ref().unwrap()["read_token"]
        .as_str()
        .unwrap()
        .to_string();
    let first_key = seal_key(&gw);

    gw.restart(&[]);
    let keys = [first_key, seal_key(&gw)];
    assert_ne!(keys[0], keys[1], "a new run, a new seal key");
    charge_ok(&a.url("socks5h"), &ca, "A after the restart");
    charge_ok(&b.url("http"), &ca, "B after the restart");
    charge_ok(&b.url("socks5h"), &ca, "B after the restart (socks5h)");
    refused(
        &gone.url("socks5h"),
        &ca,
        "a removed sandbox after a restart",
    );
    refused(
        &short.url("socks5h"),
        &ca,
        "an expired sandbox after a restart",
    );
    let list = listed(&gw);
    assert!(list.contains("sbx-a") && list.contains("sbx-b"), "{list}");
    assert!(
        !list.contains("sbx-gone") && !list.contains("sbx-short"),
        "removed and expired sandboxes are not restored: {list}"
    );
    let log = gw.stderr();
    assert!(log.contains("not restoring a removed sandbox"), "{log}");
    assert!(log.contains("not restoring an expired sandbox"), "{log}");

    // The read token the platform holds still reads A, and only A.
    for path in ["/sandboxes/sbx-a/status", "/sandboxes/sbx-a/ledger"] {
        assert_eq!(
            gw.admin_api("GET", path, Some(&token_a), None).0,
            "200",
            "A's token on {path}"
        );
    }
    let status = gw
        .admin_api("GET", "/sandboxes/sbx-b/ledger", Some(&token_a), None)
        .0;
    assert!(
        status == "401" || status == "404",
        "A's token read B: {status}"
    );
    let dir_a = gw.state.join("sandboxes/sbx-a");
    let addr = std::fs::read_to_string(dir_a.join("admin.addr")).unwrap();
    assert_eq!(
        addr.trim(),
        format!("{}/sandboxes/sbx-a", gw.ready["admin"].as_str().unwrap()),
        "admin.addr names this run's admin API"
    );

    // No secret in the record: neither the password nor the read token.
    let record = std::fs::read_to_string(dir_a.join("sandbox.json")).unwrap();
    assert!(!record.contains(&a.password), "the password is in {record}");
    assert!(!record.contains(&token_a), "the read token is in {record}");
    let mode = std::fs::metadata(dir_a.join("sandbox.json")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );

    assert_eq!(probe_canary(&a.url("socks5h"), &ca)["sandbox_id"], "sbx-a");
    gw.stop();
    let pubs = std::fs::read_to_string(dir_a.join("ledger.pub")).unwrap();
    assert_eq!(pubs.lines().count(), 2, "both runs' keys: {pubs}");
    assert_eq!(
        sessions(&gw.ledger("sbx-a")).len(),
        2,
        "one session per run"
    );

    // Both runs' seals verify under their pinned keys; each run ended
    // with its final seal.
    for (id, calls) in [("sbx-a", 2), ("sbx-b", 3)] {
        let r = receipt_pinned(&gw, id, &keys);
        assert_eq!(charges(&r).len(), calls, "{id}'s calls of both runs: {r}");
        for name in ["chain", "seals"] {
            assert_eq!(check(&r, name), "ok", "{id}'s {name} check: {r}");
        }
        assert!(
            !integrity(&r).1.contains("final seal"),
            "{id}'s runs both ended with their final seal: {}",
            integrity(&r).1
        );
        assert!(
            r["set_aside"].as_array().is_none_or(|a| a.is_empty()),
            "{r}"
        );
    }
    let ra = receipt_pinned(&gw, "sbx-a", &keys);
    assert_eq!(check(&ra, "canary"), "ok", "A probed in each run: {ra}");
    let rg = gw.receipt_json("sbx-gone");
    assert_eq!(charges(&rg).len(), 1, "the removed one's call only: {rg}");
}

/// Attack: the gateway is SIGKILLed twice: once after its interval seal
/// covered A's call (the session has no final seal), once right after a
/// call (perhaps an unsealed tail). Each time the same URL works after the
/// restart; the receipt (read after a stop, every run's key pinned) never
/// reads verified: it names the crashed session, and a ledger the restart
/// set aside for its unsealed tail is listed with its requests.
#[test]
fn after_a_sigkill_the_sandbox_is_served_again_and_its_receipt_names_the_crash() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let mut gw = Gateway::start("gw-kill", "127.0.0.1:0", &[]);
    let a = gw.add_sandbox_json("sbx-a", "stripe");
    let ca = gw.ca();
    let mut keys = vec![seal_key(&gw)];
    assert_eq!(probe_canary(&a.url("socks5h"), &ca)["sandbox_id"], "sbx-a");
    charge_ok(&a.url("socks5h"), &ca, "A");
    wait_for("A's call under an interval seal", DEADLINE, || {
        (gw.ledger("sbx-a").last()?["kind"] == "seal").then_some(())
    });
    gw.kill_and_restart(&[]);
    keys.push(seal_key(&gw));
    charge_ok(&a.url("socks5h"), &ca, "A after the first SIGKILL");
    gw.stop();
    let r = receipt_pinned(&gw, "sbx-a", &keys);
    assert_eq!(charges(&r).len(), 2, "both calls: {r}");
    assert_eq!(check(&r, "chain"), "ok", "one chain across the runs: {r}");
    assert_ne!(r["integrity"]["status"], "verified", "{r}");
    assert!(
        integrity(&r).1.contains("no final seal"),
        "the receipt names the crashed session: {}",
        integrity(&r).1
    );

    // Killed right after a call: its line may be past the last seal.
    gw.restart(&[]);
    keys.push(seal_key(&gw));
    charge_ok(&a.url("socks5h"), &ca, "A before the second SIGKILL");
    gw.kill_and_restart(&[]);
    keys.push(seal_key(&gw));
    charge_ok(&a.url("socks5h"), &ca, "A after the second SIGKILL");
    assert_eq!(probe_canary(&a.url("socks5h"), &ca)["sandbox_id"], "sbx-a");
    gw.stop();
    let r = receipt_pinned(&gw, "sbx-a", &keys);
    let set_aside: u64 = r["set_aside"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| s["requests"].as_u64().unwrap_or(0))
        .sum();
    if set_aside == 0 {
        assert_ne!(
            r["integrity"]["status"], "verified",
            "a receipt over crashed sessions read verified: {r}"
        );
        assert_eq!(charges(&r).len(), 4, "every call: {r}");
        assert!(
            integrity(&r).1.contains("no final seal"),
            "{}",
            integrity(&r).1
        );
    } else {
        // The unsealed tail was moved aside with the earlier chain: listed
        // with its calls, never counted; the receipt is over the new chain.
        assert_eq!(
            set_aside + charges(&r).len() as u64,
            4,
            "every call is counted or named as set aside: {r}"
        );
        assert!(
            integrity(&r).1.contains("moved") || !check(&r, "moved_aside").is_empty(),
            "the receipt names the set-aside tail: {r}"
        );
    }
}

/// Attack: records a workload could plant in the state dir while the
/// gateway is down. Each would, if followed or read, serve a sandbox with
/// A's password: a symlink to a record outside, a FIFO (would block the
/// start), a directory that is a symlink, a record whose id is `../x`, a
/// record padded past 64 KiB. After the restart each is refused, the log
/// names each one's path, and A is served.
#[test]
fn planted_records_are_skipped_with_a_log_line_and_the_others_are_served() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let mut gw = Gateway::start("gw-planted", "127.0.0.1:0", &[]);
    let a = gw.add_sandbox_json("sbx-a", "stripe");
    let ca = gw.ca();
    charge_ok(&a.url("socks5h"), &ca, "A");
    gw.stop();

    let sandboxes = gw.state.join("sandboxes");
    let record: Value = serde_json::from_str(
        &std::fs::read_to_string(sandboxes.join("sbx-a/sandbox.json")).unwrap(),
    )
    .unwrap();
    let as_id = |id: &str| {
        let mut r = record.clone();
        r["id"] = Value::from(id);
        serde_json::to_string(&r).unwrap()
    };
    let outside = gw.dir.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let planted = ["sbx-link", "sbx-fifo", "sbx-dirlink", "sbx-evil", "sbx-big"];
    // A link to a record (of its own id) outside the state dir.
    std::fs::write(outside.join("link.json"), as_id("sbx-link")).unwrap();
    std::fs::create_dir(sandboxes.join("sbx-link")).unwrap();
    std::os::unix::fs::symlink(
        outside.join("link.json"),
        sandboxes.join("sbx-link/sandbox.json"),
    )
    .unwrap();
    // A FIFO no one writes.
    std::fs::create_dir(sandboxes.join("sbx-fifo")).unwrap();
    let fifo = output(command("mkfifo").arg(sandboxes.join("sbx-fifo/sandbox.json")));
    assert!(fifo.status.success(), "mkfifo: {:?}", text(&fifo));
    // The sandbox's directory itself a link to one outside.
    std::fs::create_dir(outside.join("dir")).unwrap();
    std::fs::write(outside.join("dir/sandbox.json"), as_id("sbx-dirlink")).unwrap();
    std::os::unix::fs::symlink(outside.join("dir"), sandboxes.join("sbx-dirlink")).unwrap();
    // A hostile id.
    std::fs::create_dir(sandboxes.join("sbx-evil")).unwrap();
    std::fs::write(sandboxes.join("sbx-evil/sandbox.json"), as_id("../x")).unwrap();
    // A good record, past 64 KiB of trailing whitespace.
    std::fs::create_dir(sandboxes.join("sbx-big")).unwrap();
    let big = format!("{}{}", as_id("sbx-big"), " ".repeat(70 * 1024));
    std::fs::write(sandboxes.join("sbx-big/sandbox.json"), big).unwrap();

    gw.restart(&[]);
    charge_ok(&a.url("socks5h"), &ca, "A beside the planted records");
    let log = gw.stderr();
    for id in planted {
        let fake = Sandbox::from_url(id, &a.proxy_url.replacen("sbx-a", id, 1));
        refused(&fake.url("socks5h"), &ca, &format!("planted {id}"));
        assert!(
            log.lines()
                .any(|l| l.contains("skipped a sandbox record") && l.contains(id)),
            "no log line names the skipped {id}:\n{log}"
        );
    }
    assert!(
        !gw.state.join("x").exists(),
        "the hostile id made a directory outside sandboxes/"
    );
    let list = listed(&gw);
    assert!(list.contains("sbx-a"), "{list}");
    for id in planted {
        assert!(!list.contains(id), "{id} is served: {list}");
    }
    gw.stop();
}
