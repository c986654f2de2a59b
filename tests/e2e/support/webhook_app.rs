//! A webhook app for the tests of deliveries that do not come from `veris
//! run`'s own command (the gateway's sandboxes, an external twin's
//! ingress): a python3 `http.server` on loopback that verifies every POST
//! with the official `stripe` SDK, and its log; and an external twin
//! stand-in that signs an event as Stripe does and POSTs it to an ingress.

use super::gateway::PyServer;
use super::{command, output, text, wait_for, TempDir, DEADLINE};

/// The app: an `http.server` on loopback (port 0, printed as `ready
/// PORT`) that verifies every POST with the official `stripe` SDK against
/// the secret in the file `argv[1]` (read per request: the secret is known
/// only once the sandbox is registered) and answers 200, or 400 when it
/// does not verify; and tries the secret in `argv[2]` too. With `argv[3]`
/// = `fail` it answers 500 to everything. Logs to `argv[-1]`:
/// `verified TYPE OBJECT_ID`, `rejected`, `other-secret verifies` or
/// `other-secret rejects`, `failed`.
pub const APP: &str = r#"
import http.server, stripe
own_file, other_file, mode, log = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[-1]
def note(line):
    with open(log, "a") as f:
        f.write(line + "\n")
def secret(path):
    try:
        return open(path).read().strip()
    except OSError:
        return ""
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if mode == "fail":
            self.send_response(500)
            self.end_headers()
            note("failed")
            return
        sig = self.headers.get("Stripe-Signature", "")
        try:
            stripe.Webhook.construct_event(body, sig, secret(other_file))
            note("other-secret verifies")
        except Exception:
            note("other-secret rejects")
        try:
            event = stripe.Webhook.construct_event(body, sig, secret(own_file))
        except Exception:
            self.send_response(400)
            self.end_headers()
            note("rejected")
            return
        self.send_response(200)
        self.end_headers()
        note("verified %s %s" % (event["type"], event["data"]["object"]["id"]))
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print("ready", server.server_address[1], flush=True)
server.serve_forever()
"#;

/// One app (see [`APP`]) in `dir` under `name`, verifying with the secret
/// later written to `name.secret` (and trying `name.other`).
pub fn app(dir: &TempDir, name: &str, mode: &str) -> PyServer {
    let own = dir.join(format!("{name}.secret"));
    let other = dir.join(format!("{name}.other"));
    PyServer::start(
        command("python3"),
        dir,
        name,
        APP,
        &[own.to_str().unwrap(), other.to_str().unwrap(), mode],
    )
}

/// Waits for the app's log to hold a line starting with `prefix`.
pub fn wait_log(app: &PyServer, prefix: &str) -> String {
    wait_for(&format!("{prefix:?} in the app's log"), DEADLINE, || {
        let log = app.log();
        log.lines().any(|l| l.starts_with(prefix)).then_some(log)
    })
}

/// The external twin stand-in: signs `argv[3]` (the body) with the secret
/// `argv[2]` as Stripe does and POSTs it to `argv[1]` with the bearer token
/// `argv[4]`; prints the status it got.
pub const EXTERNAL_TWIN: &str = r#"
import hmac, hashlib, sys, time, urllib.request, urllib.error
url, secret, body, token = sys.argv[1], sys.argv[2], sys.argv[3].encode(), sys.argv[4]
t = int(time.time())
sig = hmac.new(secret.encode(), b"%d." % t + body, hashlib.sha256).hexdigest()
req = urllib.request.Request(url, data=body, method="POST", headers={
    "Content-Type": "application/json; charset=utf-8",
    "Stripe-Signature": "t=%d,v1=%s" % (t, sig),
    "Authorization": "Bearer " + token,
})
try:
    with urllib.request.urlopen(req, timeout=15) as r:
        print(r.status)
except urllib.error.HTTPError as e:
    print(e.code)
"#;

pub const EVENT: &str = r#"{"id":"evt_ext_1","object":"event","type":"charge.succeeded","data":{"object":{"id":"ch_ext_1","object":"charge","status":"succeeded"}}}"#;

/// The external twin POSTs `body` signed with `secret` to `url` with
/// `token`: the status it got.
pub fn deliver(dir: &TempDir, url: &str, secret: &str, body: &str, token: &str) -> String {
    let script = dir.join("external_twin.py");
    std::fs::write(&script, EXTERNAL_TWIN).unwrap();
    let out = output(
        command("python3")
            .arg(&script)
            .args([url, secret, body, token]),
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "the external twin: {stdout}{stderr}");
    stdout.trim().to_string()
}
