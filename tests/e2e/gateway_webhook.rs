//! The gateway delivers each sandbox's webhooks (W1 with G1, DESIGN §13,
//! §15): `add-sandbox --webhook stripe=URL` answers the sandbox's own
//! `whsec_` secret; the built-in twin's events for what a sandbox did are
//! delivered to that sandbox's app only, verified there with the official
//! `stripe` SDK, and recorded as `callback` lines in that sandbox's ledger,
//! which `veris receipt --sandbox ID --require-callback /webhook` counts.
//!
//! Attacks: another sandbox's secret verifies nothing of this one's; a
//! workload that posts a correctly signed event to its own app through the
//! gateway makes a passthrough line, never a `callback`, and its
//! requirement stays unmet; a webhook URL the gateway's dial policy refuses
//! (its loopback, the metadata address) is refused at registration; a
//! removed sandbox's pending retries are never made; a restarted gateway
//! still signs with the secret the app was given.

use std::path::Path;

use serde_json::Value;

use crate::support::gateway::*;
use crate::support::webhook_app::{app, deliver, wait_log, EVENT};
use crate::support::{self, command, output, skip, text, wait_for, TempDir, DEADLINE};
use crate::webhook;

/// `add-sandbox ID --services stripe --webhook stripe=http://127.0.0.1:PORT/webhook EXTRA`:
/// its proxy URL (the last stdout line) and its `STRIPE_WEBHOOK_SECRET`
/// (the line before), or the failed output.
fn add(gw: &Gateway, id: &str, port: u16, extra: &[&str]) -> Result<(Sandbox, String), String> {
    let hook = format!("stripe=http://127.0.0.1:{port}/webhook");
    let mut args = vec![id, "--services", "stripe", "--webhook", &hook];
    args.extend_from_slice(extra);
    let out = gw.admin_command("add-sandbox", &args);
    let (stdout, stderr) = text(&out);
    if !out.status.success() {
        return Err(format!("{stdout}{stderr}"));
    }
    let lines: Vec<&str> = stdout.lines().collect();
    let [.., secret, url] = lines.as_slice() else {
        return Err(format!(
            "add-sandbox printed fewer than two lines: {stdout}"
        ));
    };
    let secret = secret
        .strip_prefix("STRIPE_WEBHOOK_SECRET=")
        .unwrap_or_else(|| panic!("the line before the URL is not the secret: {stdout}"));
    Ok((Sandbox::from_url(id, url), secret.to_string()))
}

/// The sandbox's `callback` lines.
fn callbacks(gw: &Gateway, id: &str) -> Vec<Value> {
    gw.ledger(id)
        .into_iter()
        .filter(|l| l["kind"] == "callback")
        .collect()
}

/// `veris receipt --state-dir S --sandbox ID --require-callback /webhook
/// --json`: its exit code and JSON.
fn receipt_requiring_callback(gw: &Gateway, id: &str) -> (Option<i32>, Value) {
    let out = output(
        gw.veris(&["receipt", "--json", "--state-dir"])
            .arg(&gw.state)
            .args(["--sandbox", id, "--require-callback", "/webhook"]),
    );
    let (stdout, stderr) = text(&out);
    let json = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("receipt --json for {id} is not JSON ({e}): {stdout}{stderr}"));
    (out.status.code(), json)
}

/// A correctly signed `charge.succeeded` POSTed by the workload to its own
/// app through its gateway URL, as a delivery would be: (curl ok, status).
fn forge(proxy: &str, port: u16, secret: &str) -> (bool, String) {
    let body = r#"{"id":"evt_forged","object":"event","type":"charge.succeeded","data":{"object":{"id":"ch_forged","object":"charge","status":"succeeded"}}}"#;
    let sign = format!(
        "import hmac,hashlib,time;t=int(time.time());print('t=%d,v1=%s'%(t,hmac.new({secret:?}.encode(),('%d.'%t).encode()+{body:?}.encode(),hashlib.sha256).hexdigest()))"
    );
    let sig = text(&output(command("python3").args(["-c", &sign])))
        .0
        .trim()
        .to_string();
    let out = output(command("curl").args([
        "-sS",
        "--max-time",
        "15",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--proxy",
        proxy,
        "-H",
        "Content-Type: application/json",
        "-H",
        &format!("Stripe-Signature: {sig}"),
        "--data",
        body,
        &format!("http://127.0.0.1:{port}/webhook"),
    ]));
    (out.status.success(), text(&out).0.trim().to_string())
}

/// No file under `dir` (the state dir) nor the gateway's log holds a
/// `whsec_` secret but the secrets files the gateway keeps.
fn secrets_kept_only_in_their_files(gw: &Gateway, secrets: &[&str]) {
    let mut files = Vec::new();
    walk(&gw.state, 0, &mut files);
    for f in files {
        if f.file_name()
            .is_some_and(|n| n == "webhook.secrets" || n == "webhook.ingress")
        {
            let mode = std::os::unix::fs::PermissionsExt::mode(
                &std::fs::metadata(&f).unwrap().permissions(),
            );
            assert_eq!(mode & 0o777, 0o600, "{} is 0600", f.display());
            continue;
        }
        let bytes = std::fs::read(&f).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        for s in secrets {
            assert!(!text.contains(s), "{} holds a webhook secret", f.display());
        }
    }
    let log = gw.stderr();
    for s in secrets {
        assert!(!log.contains(s), "the gateway's log holds a webhook secret");
    }
}

fn walk(dir: &Path, depth: usize, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) && depth < 4 {
            walk(&p, depth + 1, out);
        } else if e.file_type().is_ok_and(|t| t.is_file()) {
            out.push(p);
        }
    }
}

#[test]
fn each_sandbox_gets_only_its_own_events_signed_with_its_own_secret() {
    if let Err(why) = webhook::tools() {
        return skip(&why);
    }
    let dir = TempDir::new("gw-webhook");
    let mut gw = Gateway::start(
        "gw-webhook",
        "127.0.0.1:0",
        &["--allow-dial", "127.0.0.1/32"],
    );
    let (app_a, app_b) = (app(&dir, "app-a", "ok"), app(&dir, "app-b", "ok"));
    let (a, secret_a) = add(&gw, "sbx-a", app_a.port, &[]).unwrap_or_else(|e| panic!("{e}"));
    // The same through --json: its `webhook_secrets`.
    let hook_b = format!("stripe=http://127.0.0.1:{}/webhook", app_b.port);
    let out = gw.admin_command(
        "add-sandbox",
        &[
            "sbx-b",
            "--services",
            "stripe",
            "--webhook",
            &hook_b,
            "--json",
        ],
    );
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "add-sandbox sbx-b --json: {stdout}{stderr}"
    );
    let json = support::json(&stdout);
    let secret_b = json["webhook_secrets"]["stripe"]
        .as_str()
        .unwrap_or_else(|| panic!("no webhook_secrets.stripe in --json: {json}"))
        .to_string();
    let b = Sandbox::from_url("sbx-b", json["proxy_url"].as_str().unwrap());
    for s in [&secret_a, &secret_b] {
        assert!(
            s.starts_with("whsec_") && s.len() >= 70,
            "a high-entropy whsec_ secret: {s}"
        );
    }
    assert_ne!(secret_a, secret_b, "each sandbox has its own secret");
    std::fs::write(dir.join("app-a.secret"), &secret_a).unwrap();
    std::fs::write(dir.join("app-a.other"), &secret_b).unwrap();
    std::fs::write(dir.join("app-b.secret"), &secret_b).unwrap();
    std::fs::write(dir.join("app-b.other"), &secret_a).unwrap();
    let ca = gw.ca();

    // A charges: A's app verifies charge.succeeded with A's secret, and
    // B's secret does not verify it.
    charge_ok(&a.url("socks5h"), &ca, "A");
    let log_a = wait_log(&app_a, "verified charge.succeeded ch_");
    assert!(log_a.contains("other-secret rejects"), "{log_a}");
    assert!(
        !log_a.contains("other-secret verifies"),
        "B's secret verified A's event: {log_a}"
    );
    let delivered = wait_for("A's callback line", DEADLINE, || {
        let c = callbacks(&gw, "sbx-a");
        (!c.is_empty()).then_some(c)
    });
    assert_eq!(
        delivered.len(),
        1,
        "one delivery, one attempt: {delivered:?}"
    );
    let line = &delivered[0];
    assert_eq!(
        (
            &line["event"],
            &line["status"],
            &line["origin"],
            &line["path"]
        ),
        (
            &Value::from("charge.succeeded"),
            &Value::from(200),
            &Value::from("twin"),
            &Value::from("/webhook")
        ),
        "{line}"
    );

    // B forges a correctly signed delivery to its own app through the
    // gateway: the app takes it, and it is a passthrough, not a callback.
    let (ok, status) = forge(&b.url("socks5h"), app_b.port, &secret_b);
    assert!(
        ok && status == "200",
        "the forged POST reached B's app: {status}"
    );
    let log_b = wait_log(&app_b, "verified charge.succeeded ch_forged");
    assert_eq!(
        log_b.matches("verified").count(),
        1,
        "B's app got the forgery and nothing of A's: {log_b}"
    );
    assert!(
        callbacks(&gw, "sbx-b").is_empty(),
        "{:?}",
        gw.ledger("sbx-b")
    );
    assert!(
        gw.ledger("sbx-b")
            .iter()
            .any(|l| l["kind"] == "passthrough" || l["kind"] == "tunnel_close"),
        "the forgery is recorded as the workload's own traffic: {:?}",
        gw.ledger("sbx-b")
    );

    // A's requirement is met, B's is not.
    let (code, ra) = receipt_requiring_callback(&gw, "sbx-a");
    assert_eq!(code, Some(0), "A's receipt: {ra}");
    assert!(
        ra.to_string().contains("charge.succeeded"),
        "the JSON lists the callback: {ra}"
    );
    let (code, rb) = receipt_requiring_callback(&gw, "sbx-b");
    assert_eq!(
        code,
        Some(3),
        "B's forged delivery must not meet the requirement: {rb}"
    );
    let text_a = gw.receipt_text("sbx-a");
    assert!(
        text_a.contains(r#""charge.succeeded" #1 -> 200"#),
        "the text receipt lists the callback: {text_a}"
    );
    secrets_kept_only_in_their_files(&gw, &[&secret_a, &secret_b]);
    gw.stop();
}

/// Retries pending when a sandbox is removed are never made: its chain
/// ends in its `removed` seal with the one attempt made, and its app gets
/// nothing more (the first retry is due 3 s after the first attempt).
#[test]
fn a_removed_sandboxs_pending_retries_are_dropped() {
    if let Err(why) = webhook::tools() {
        return skip(&why);
    }
    let dir = TempDir::new("gw-webhook-rm");
    let gw = Gateway::start_in_env(
        None,
        "gw-webhook-rm",
        "127.0.0.1:0",
        &["--allow-dial", "127.0.0.1/32"],
        &[("VERIS_WEBHOOK_TIME_SCALE", "0.05")],
    );
    let failing = app(&dir, "app-fail", "fail");
    let (a, _) = add(&gw, "sbx-a", failing.port, &[]).unwrap_or_else(|e| panic!("{e}"));
    charge_ok(&a.url("socks5h"), &gw.ca(), "A");
    wait_for("the first attempt's line", DEADLINE, || {
        callbacks(&gw, "sbx-a")
            .iter()
            .any(|l| l["status"] == 500)
            .then_some(())
    });
    gw.remove_sandbox("sbx-a");
    let lines = gw.ledger("sbx-a");
    let last = lines.last().expect("a ledger");
    assert_eq!(
        (&last["kind"], &last["reason"]),
        (&Value::from("seal"), &Value::from("removed")),
        "the chain ends in its removed seal: {last}"
    );
    let attempts = callbacks(&gw, "sbx-a");
    assert!(
        attempts.iter().all(|l| l["status"] != 200),
        "nothing recorded as answered: {attempts:?}"
    );
    assert!(
        !gw.state.join("sandboxes/sbx-a/webhook.secrets").exists(),
        "a removed sandbox's secret is deleted"
    );
    // Past the first retry's due time: nothing more reached the app.
    std::thread::sleep(std::time::Duration::from_secs(4));
    assert_eq!(
        failing.log().matches("failed").count(),
        attempts.len(),
        "the app got only the attempts recorded before the removal"
    );
    assert_eq!(
        gw.ledger("sbx-a").len(),
        lines.len(),
        "no line after the removed seal"
    );
}

/// Registration refuses what the gateway would not deliver honestly: a URL
/// the dial policy forbids (loopback without --allow-dial, over http:// or
/// https://; the metadata address), faults on an external twin's deliveries, and
/// faults without a webhook.
#[test]
fn webhook_urls_the_dial_policy_refuses_are_refused_at_registration() {
    let gw = Gateway::start("gw-webhook-policy", "127.0.0.1:0", &[]);
    let refused = |args: &[&str], words: &str| {
        let out = gw.admin_command("add-sandbox", args);
        let (stdout, stderr) = text(&out);
        assert!(!out.status.success(), "{args:?} was accepted: {stdout}");
        assert!(
            stderr.contains(words) && stderr.contains("Next:"),
            "{args:?}: {stderr}"
        );
    };
    refused(
        &["sbx-1", "--webhook", "stripe=http://127.0.0.1:9/webhook"],
        "--allow-dial",
    );
    refused(
        &["sbx-2", "--webhook", "stripe=http://localhost:9/webhook"],
        "--allow-dial",
    );
    refused(
        &["sbx-3", "--webhook", "stripe=http://169.254.169.254/latest"],
        "metadata",
    );
    // https:// is delivered, under the same dial policy as http://.
    refused(
        &["sbx-4", "--webhook", "stripe=https://127.0.0.1:9/webhook"],
        "--allow-dial",
    );
    refused(
        &[
            "sbx-5",
            "--twin",
            "http://127.0.0.1:9",
            "--webhook",
            "stripe=http://203.0.113.9/webhook",
            "--webhook-faults",
            "duplicate",
        ],
        "built-in twin",
    );
    refused(
        &["sbx-6", "--webhook-faults", "duplicate"],
        "needs --webhook",
    );
    refused(
        &["sbx-7", "--webhook", "github=http://203.0.113.9/"],
        "stripe",
    );
    // Nothing of them stays: not listed, no secrets left behind.
    let listed = text(&gw.admin_command("list-sandboxes", &[])).0;
    assert!(!listed.contains("sbx-"), "{listed}");
    let mut files = Vec::new();
    walk(&gw.state, 0, &mut files);
    assert!(
        !files.iter().any(|f| f.ends_with("webhook.secrets")),
        "{files:?}"
    );
}

/// A restarted gateway restores the sandbox with the secret its app was
/// given: the next event still verifies.
#[test]
fn a_restarted_gateway_signs_with_the_secret_the_app_was_given() {
    if let Err(why) = webhook::tools() {
        return skip(&why);
    }
    let dir = TempDir::new("gw-webhook-restart");
    let extra = ["--allow-dial", "127.0.0.1/32"];
    let mut gw = Gateway::start("gw-webhook-restart", "127.0.0.1:0", &extra);
    let app_a = app(&dir, "app-a", "ok");
    let (a, secret) = add(&gw, "sbx-a", app_a.port, &[]).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.join("app-a.secret"), &secret).unwrap();
    gw.restart(&extra);
    charge_ok(&a.url("socks5h"), &gw.ca(), "A after the restart");
    let log = wait_log(&app_a, "verified charge.succeeded");
    assert!(!log.contains("rejected"), "{log}");
    gw.stop();
}

/// A sandbox whose twin is an external one gets an ingress: its twin
/// POSTs signed events to `/sandboxes/ID/ingress/stripe` with the token
/// add-sandbox answered; they reach the sandbox's app and its ledger
/// (origin `ingress`) and count. The gateway's admin token and another
/// sandbox's ingress token are refused 401, recorded nowhere.
#[test]
fn an_external_twins_events_reach_a_sandboxs_app_through_its_ingress() {
    if let Err(why) = webhook::tools() {
        return skip(&why);
    }
    let dir = TempDir::new("gw-ingress");
    let (_twin, twin_url) =
        support::spawn_twin(&mut support::veris(["twin", "--listen", "127.0.0.1:0"]));
    let mut gw = Gateway::start(
        "gw-ingress",
        "127.0.0.1:0",
        &["--allow-dial", "127.0.0.1/32"],
    );
    let app_a = app(&dir, "app-a", "ok");
    let secret = "whsec_the_external_twins_secret_for_a";
    std::fs::write(dir.join("app-a.secret"), secret).unwrap();
    let register = |id: &str, port: u16| {
        let hook = format!("stripe=http://127.0.0.1:{port}/webhook");
        let out = gw.admin_command(
            "add-sandbox",
            &[
                id,
                "--services",
                "stripe",
                "--twin",
                &twin_url,
                "--webhook",
                &hook,
                "--json",
            ],
        );
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "add-sandbox {id}: {stdout}{stderr}");
        support::json(&stdout)
    };
    let a = register("sbx-a", app_a.port);
    let b = register("sbx-b", app_a.port);
    let url = a["ingress_url"]
        .as_str()
        .unwrap_or_else(|| panic!("no ingress_url: {a}"))
        .replace("SERVICE", "stripe");
    let token = a["ingress_token"]
        .as_str()
        .expect("ingress_token")
        .to_string();
    assert!(
        a["webhook_secrets"].is_null(),
        "the external twin signs: {a}"
    );
    let other = b["ingress_token"].as_str().unwrap().to_string();
    assert_ne!(token, other);
    for wrong in [gw.admin_token(), other] {
        assert_eq!(deliver(&dir, &url, secret, EVENT, &wrong), "401");
    }
    assert!(callbacks(&gw, "sbx-a").is_empty());
    assert_eq!(deliver(&dir, &url, secret, EVENT, &token), "200");
    wait_log(&app_a, "verified charge.succeeded ch_ext_1");
    let lines = callbacks(&gw, "sbx-a");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["origin"], "ingress", "{}", lines[0]);
    assert!(
        callbacks(&gw, "sbx-b").is_empty(),
        "B's ledger holds nothing of A's"
    );
    let sandbox = Sandbox::from_url("sbx-a", a["proxy_url"].as_str().unwrap());
    charge_ok(&sandbox.url("socks5h"), &gw.ca(), "A");
    let (code, receipt) = receipt_requiring_callback(&gw, "sbx-a");
    assert_eq!(code, Some(0), "{receipt}");
    secrets_kept_only_in_their_files(&gw, &[&token]);
    gw.stop();
}

/// `veris trigger|replay --sandbox ID` against a live gateway: the event
/// is delivered to that sandbox's app (verified there) and recorded in its
/// ledger with origin `trigger`, then `replay`, counting toward nothing.
/// Attacks: a sandbox's read token (its own state dir, which its operator
/// may hand out) cannot deliver; sandbox A's event id replayed through
/// sandbox B is unknown to B's engine, so B's app gets nothing and B's
/// ledger no line.
#[test]
fn trigger_and_replay_reach_one_sandbox_with_the_gateways_token_only() {
    if let Err(why) = webhook::tools() {
        return skip(&why);
    }
    let dir = TempDir::new("gw-webhook-trigger");
    let mut gw = Gateway::start(
        "gw-webhook-trigger",
        "127.0.0.1:0",
        &["--allow-dial", "127.0.0.1/32"],
    );
    let (app_a, app_b) = (app(&dir, "app-a", "ok"), app(&dir, "app-b", "ok"));
    let (_, secret_a) = add(&gw, "sbx-a", app_a.port, &[]).unwrap_or_else(|e| panic!("{e}"));
    let (_, secret_b) = add(&gw, "sbx-b", app_b.port, &[]).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.join("app-a.secret"), &secret_a).unwrap();
    std::fs::write(dir.join("app-b.secret"), &secret_b).unwrap();
    let ask = |args: &[&str], state: &Path| {
        let out = output(
            gw.veris(args)
                .arg("--state-dir")
                .arg(state)
                .env_remove("VERIS_ADMIN_TOKEN"),
        );
        let (stdout, stderr) = text(&out);
        (out.status.code(), format!("{stdout}{stderr}"))
    };

    let (code, said) = ask(
        &[
            "trigger",
            "stripe",
            "customer.created",
            "--sandbox",
            "sbx-a",
        ],
        &gw.state,
    );
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("(trigger)"), "{said}");
    wait_log(&app_a, "verified customer.created cus_");
    let triggered = wait_for("sbx-a's triggered line", DEADLINE, || {
        callbacks(&gw, "sbx-a")
            .into_iter()
            .find(|l| l["origin"] == "trigger")
    });
    assert_eq!(triggered["status"], 200, "{triggered}");
    let id = triggered["event_id"].as_str().unwrap().to_string();

    let (code, said) = ask(&["replay", &id, "--sandbox", "sbx-a"], &gw.state);
    assert_eq!(code, Some(0), "{said}");
    let replayed = wait_for("sbx-a's replayed line", DEADLINE, || {
        callbacks(&gw, "sbx-a")
            .into_iter()
            .find(|l| l["origin"] == "replay")
    });
    assert_eq!(
        (&replayed["event_id"], &replayed["status"]),
        (&Value::from(id.as_str()), &Value::from(200)),
        "{replayed}"
    );

    // A's event through B: unknown to B's engine.
    let (code, said) = ask(&["replay", &id, "--sandbox", "sbx-b"], &gw.state);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("no event"), "{said}");
    // A sandbox's read token (its own state dir) delivers nothing.
    let before = callbacks(&gw, "sbx-a").len();
    let (code, said) = ask(
        &["trigger", "stripe", "customer.created"],
        &gw.state.join("sandboxes").join("sbx-a"),
    );
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("admin token"), "{said}");

    // Neither counts toward a requirement.
    let (code, receipt) = receipt_requiring_callback(&gw, "sbx-a");
    assert_eq!(code, Some(3), "{receipt}");
    gw.stop();
    assert_eq!(
        callbacks(&gw, "sbx-a").len(),
        before,
        "the read token's ask left a line"
    );
    assert!(
        callbacks(&gw, "sbx-b").is_empty(),
        "{:?}",
        gw.ledger("sbx-b")
    );
    assert!(
        !app_b.log().contains("verified"),
        "B's app got A's event: {}",
        app_b.log()
    );
}

/// A sandbox whose app keeps failing holds its delivery (retries pending)
/// while its workload keeps charging: with a queue of one
/// (`VERIS_WEBHOOK_QUEUE=1`) the first event is under way, the second
/// waits, and the third and fourth are dropped, counted in that sandbox's
/// ledger (`callback_dropped`) and said by its receipt.
#[test]
fn a_sandboxs_dropped_events_are_on_its_own_record() {
    if let Err(why) = webhook::tools() {
        return skip(&why);
    }
    let dir = TempDir::new("gw-webhook-drop");
    let mut gw = Gateway::start_in_env(
        None,
        "gw-webhook-drop",
        "127.0.0.1:0",
        &["--allow-dial", "127.0.0.1/32"],
        &[("VERIS_WEBHOOK_QUEUE", "1")],
    );
    let failing = app(&dir, "app-fail", "fail");
    let (a, _) = add(&gw, "sbx-a", failing.port, &[]).unwrap_or_else(|e| panic!("{e}"));
    let ca = gw.ca();
    for _ in 0..4 {
        charge_ok(&a.url("socks5h"), &ca, "A");
    }
    let dropped = |gw: &Gateway| -> u64 {
        gw.ledger("sbx-a")
            .iter()
            .filter(|l| l["kind"] == "callback_dropped")
            .filter_map(|l| l["events"].as_u64())
            .sum()
    };
    wait_for("two drops on record", DEADLINE, || {
        (dropped(&gw) == 2).then_some(())
    });
    let text_a = gw.receipt_text("sbx-a");
    assert!(
        text_a.contains("2 webhook event(s) dropped (queue full)"),
        "{text_a}"
    );
    gw.stop();
    assert_eq!(dropped(&gw), 2, "{:?}", gw.ledger("sbx-a"));
}
