//! The ingress for an external twin (W1, DESIGN §15): `veris serve --twin
//! URL --webhook stripe=URL` makes no events itself; the external twin (a
//! python3 stand-in that signs as Stripe does) POSTs each to `POST
//! /ingress/stripe` on the admin listener with the ingress token `serve`
//! printed, and veris forwards it unchanged to the app, records a
//! `callback` line with origin `ingress` and passes the app's status back
//! (no retry: the external twin retries on its own).
//!
//! Attacks: a delivery without the token (or with the admin token) is
//! refused 401 and recorded nowhere; the token is in none of the files a
//! workload reads (env file, ready file, state dir); a `veris run` refuses
//! `--webhook` with an external twin rather than make a token its command
//! could find.

use serde_json::Value;

use crate::support::webhook_app::{app, deliver, wait_log, EVENT};
use crate::support::{self, output, skip, text, veris, Serve, TempDir};
use crate::webhook;

/// The ingress URL and token `serve` printed on stderr.
fn ingress(serve: &Serve) -> (String, String) {
    // Printed right after the ready file is written.
    let line = support::wait_for("serve's ingress line", support::DEADLINE, || {
        serve
            .stderr()
            .lines()
            .find(|l| l.contains("webhook ingress for the external twin"))
            .map(str::to_string)
    });
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .replace("SERVICE", "stripe");
    let token = line
        .rsplit_once("Bearer ")
        .unwrap_or_else(|| panic!("no token in {line:?}"))
        .1
        .trim()
        .to_string();
    (url, token)
}

fn callbacks(serve: &Serve) -> Vec<Value> {
    serve
        .ledger_lines()
        .into_iter()
        .filter(|l| l["kind"] == "callback")
        .collect()
}

#[test]
fn an_external_twins_signed_event_reaches_the_app_through_the_ingress_and_counts() {
    if let Err(why) = webhook::tools() {
        return skip(&why);
    }
    let dir = TempDir::new("ingress");
    let (_twin, twin_url) = support::spawn_twin(&mut veris(["twin", "--listen", "127.0.0.1:0"]));
    let app = app(&dir, "app", "ok");
    // The external twin's own secret, which the app was given by it.
    let secret = "whsec_the_external_twins_own_secret";
    std::fs::write(dir.join("app.secret"), secret).unwrap();
    let hook = format!("stripe=http://127.0.0.1:{}/webhook", app.port);
    let mut serve = Serve::start(
        "ingress-serve",
        &[
            "--twin",
            &twin_url,
            "--services",
            "stripe",
            "--webhook",
            &hook,
        ],
    );
    let (url, token) = ingress(&serve);
    assert_eq!(token.len(), 64, "a 32-byte token in hex: {token}");

    // Without the token, with a wrong one, with the admin token: 401, and
    // nothing reaches the app or the ledger.
    for wrong in ["", "not-the-token", &serve.token()] {
        let status = deliver(&dir, &url, secret, EVENT, wrong);
        assert_eq!(status, "401", "token {wrong:?}");
    }
    assert!(callbacks(&serve).is_empty(), "{:?}", serve.ledger_lines());
    assert!(!app.log().contains("verified"), "{}", app.log());
    assert!(
        serve
            .stderr()
            .contains("refused a webhook ingress delivery"),
        "the refusal is in the log: {}",
        serve.stderr()
    );

    // With it: forwarded unchanged, verified by the app with the twin's
    // secret, its 200 passed back, one line with origin ingress.
    assert_eq!(deliver(&dir, &url, secret, EVENT, &token), "200");
    wait_log(&app, "verified charge.succeeded ch_ext_1");
    let lines = callbacks(&serve);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let l = &lines[0];
    assert_eq!(
        (
            &l["origin"],
            &l["event"],
            &l["event_id"],
            &l["status"],
            &l["attempt"]
        ),
        (
            &Value::from("ingress"),
            &Value::from("charge.succeeded"),
            &Value::from("evt_ext_1"),
            &Value::from(200),
            &Value::from(1)
        ),
        "{l}"
    );
    assert_eq!(l["v"], veris_receipt::LEDGER_VERSION, "{l}");

    // A body that is not JSON is still forwarded (the app rejects it: 400,
    // passed back, never retried) and recorded with no event.
    assert_eq!(deliver(&dir, &url, secret, "not json", &token), "400");
    let lines = callbacks(&serve);
    assert_eq!(lines.len(), 2, "one attempt, no retry: {lines:?}");
    assert_eq!(
        (&lines[1]["event"], &lines[1]["status"]),
        (&Value::from(""), &Value::from(400)),
        "{}",
        lines[1]
    );

    // The workload's own call (an empty receipt fails by itself), then the
    // requirement counts the ingress's 2xx delivery.
    let out = output(serve.curl().args([
        "https://api.stripe.com/v1/charges",
        "-d",
        "amount=100",
        "-d",
        "currency=usd",
    ]));
    assert!(out.status.success(), "the charge: {:?}", text(&out));
    let out = output(
        veris(["receipt", "--state-dir"])
            .arg(&serve.state)
            .args(["--require-callback", "/webhook"]),
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains(r#""charge.succeeded" #1 -> 200"#) && !stdout.contains("not counted"),
        "{stdout}"
    );

    // The workload's files never hold the token.
    let mut files = vec![serve.env_file.clone(), serve.dir.join("ready.json")];
    let mut stack = vec![serve.state.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            } else {
                files.push(p);
            }
        }
    }
    for f in files {
        let bytes = std::fs::read(&f).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(&token),
            "{} holds the ingress token",
            f.display()
        );
    }
    serve.stop();
}

/// A run has no admin API, so no ingress: `--webhook` with an external twin
/// is refused with a next step before anything starts.
#[test]
fn a_run_refuses_webhooks_with_an_external_twin() {
    let dir = TempDir::new("ingress-run");
    let out = output(veris(["run", "--state-dir"]).arg(dir.join("state")).args([
        "--twin",
        "http://127.0.0.1:9",
        "--webhook",
        "stripe=http://127.0.0.1:9/webhook",
        "--",
        "true",
    ]));
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("veris serve") && stderr.contains("Next:"),
        "{stderr}"
    );
}
