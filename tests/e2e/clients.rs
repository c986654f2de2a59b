//! End-to-end tests with two more real clients, each run where a client that
//! ignored its configuration could reach nothing but loopback or a sink:
//!
//! - Java 17, explicit tier: `veris run -- java Probe.java` inside a network
//!   namespace that has only `lo`. Nothing but the environment `veris run`
//!   sets (`JAVA_TOOL_OPTIONS` with the JKS truststore and the proxy flags)
//!   tells the JVM about the proxy and the CA; `HttpURLConnection` (HTTP/1.1)
//!   and `java.net.http.HttpClient` (HTTP/2) both reach the twin. The same
//!   probe without that environment fails in the same namespace; under
//!   `veris run` with only `JAVA_TOOL_OPTIONS` removed it fails too
//!   (`HTTPS_PROXY` means nothing to Java), the receipt is empty and
//!   `veris run` exits 3.
//! - Node 20, transparent tier: Node 20 ignores `HTTPS_PROXY` but honours
//!   `NODE_EXTRA_CA_CERTS`, exactly the client the transparent tier exists
//!   for. In the namespace of `support::netns` (TEST-NET routed into a
//!   sink), `api.stripe.com` resolves through `/etc/netns/<name>/hosts` to
//!   TEST-NET addresses, which only the nftables redirect turns into the twin.
//!
//! Vendor names are never resolved by real DNS here: neither namespace has a
//! route off the machine, so a lookup or a direct connection simply fails.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;
use support::netns::{
    bin, euid, ledger, run_ok, skip, wait_output, which, Netns, NetnsHosts, TempDir, Veris,
    VENDOR_V4, VENDOR_V6,
};

/// A JVM compiling a single-file program is the slowest thing here.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(90);

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Why the namespace tests cannot run here, if they cannot; `client` is the
/// program the test drives (`java`, `node`).
fn unavailable(client: &str) -> Option<String> {
    if euid() != 0 {
        return Some(format!(
            "the {client} client test needs root (ip netns, a namespace with no route off the machine)"
        ));
    }
    for tool in ["ip", client] {
        if which(tool).is_none() {
            return Some(format!("`{tool}` is not installed"));
        }
    }
    None
}

/// The caller's PATH (so a JDK or Node outside /usr/bin is found), else the
/// namespace default.
fn path_var() -> String {
    std::env::var("PATH").unwrap_or_else(|_| support::netns::PATH.to_string())
}

/// A network namespace with nothing but `lo` up: the only reachable
/// addresses are loopback, so a client that ignores the proxy reaches
/// nothing (and a vendor name cannot even be looked up). Deleted on drop.
struct LoopbackNetns {
    name: String,
}

impl LoopbackNetns {
    fn create(tag: &str) -> LoopbackNetns {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "veris-{tag}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        run_ok(Command::new("ip").args(["netns", "add", &name]));
        let ns = LoopbackNetns { name };
        run_ok(Command::new("ip").args(["-n", &ns.name, "link", "set", "lo", "up"]));
        ns
    }

    /// Every route of the namespace, IPv4 and IPv6, one per line.
    fn routes(&self) -> Vec<String> {
        let mut all = Vec::new();
        for family in ["-4", "-6"] {
            let out = run_ok(
                Command::new("ip")
                    .args([family, "-n", &self.name, "route", "show", "table", "all"]),
            );
            all.extend(text(&out.stdout).lines().map(str::to_string));
        }
        all
    }

    /// `program` inside the namespace, environment cleared but for PATH,
    /// HOME and JAVA_HOME when the caller has it (the machine's CA and proxy
    /// variables, JAVA_TOOL_OPTIONS included, must not reach the client).
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name])
            .arg(program)
            .env_clear()
            .env("PATH", path_var())
            .env("HOME", "/root")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Ok(java_home) = std::env::var("JAVA_HOME") {
            cmd.env("JAVA_HOME", java_home);
        }
        cmd
    }

    fn output(&self, cmd: &mut Command) -> Output {
        wait_output(
            cmd.spawn().expect("spawning in the namespace"),
            CLIENT_TIMEOUT,
        )
    }
}

impl Drop for LoopbackNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Posts a form-encoded charge to `https://api.stripe.com/v1/charges` with
/// `HttpURLConnection` (HTTP/1.1), then with `java.net.http.HttpClient`
/// (HTTP/2 preferred; its default proxy selector reads `https.proxyHost`).
/// Prints `<client> <status> <protocol>` and the body on the next line.
/// Configured by nothing in the program: only the JVM's system properties.
const PROBE_JAVA: &str = r#"
import java.io.ByteArrayOutputStream;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.HttpURLConnection;
import java.net.URI;
import java.net.URL;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;

public class Probe {
    static final String URL = "https://api.stripe.com/v1/charges";
    static final String FORM = "amount=100&currency=usd";

    public static void main(String[] args) throws Exception {
        HttpURLConnection c = (HttpURLConnection) new URL(URL).openConnection();
        c.setConnectTimeout(10000);
        c.setReadTimeout(10000);
        c.setRequestMethod("POST");
        c.setDoOutput(true);
        c.setRequestProperty("Content-Type", "application/x-www-form-urlencoded");
        try (OutputStream out = c.getOutputStream()) {
            out.write(FORM.getBytes(StandardCharsets.UTF_8));
        }
        int status = c.getResponseCode();
        InputStream in = status < 400 ? c.getInputStream() : c.getErrorStream();
        ByteArrayOutputStream body = new ByteArrayOutputStream();
        if (in != null) {
            in.transferTo(body);
        }
        System.out.println("urlconnection " + status + " proxied=" + c.usingProxy());
        System.out.println(body.toString(StandardCharsets.UTF_8));

        HttpClient client = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(10)).build();
        HttpRequest req = HttpRequest.newBuilder(URI.create(URL))
            .timeout(Duration.ofSeconds(10))
            .header("Content-Type", "application/x-www-form-urlencoded")
            .POST(HttpRequest.BodyPublishers.ofString(FORM))
            .build();
        HttpResponse<String> res = client.send(req, HttpResponse.BodyHandlers.ofString());
        System.out.println("httpclient " + res.statusCode() + " " + res.version());
        System.out.println(res.body());
    }
}
"#;

/// Writes Probe.java into `dir` and returns its path.
fn write_probe(dir: &TempDir) -> PathBuf {
    let probe = dir.join("Probe.java");
    std::fs::write(&probe, PROBE_JAVA).unwrap();
    probe
}

/// Asserts `body` is the twin's answer to `amount=100&currency=usd`.
fn assert_twin_charge(body: &str, context: &str) {
    let v: Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("{context}: the body is not JSON ({e}): {body}"));
    assert_eq!(v["object"], "charge", "{context}: {body}");
    assert_eq!(v["amount"], 100, "{context}: {body}");
    assert_eq!(v["currency"], "usd", "{context}: {body}");
    assert_eq!(v["livemode"], false, "{context}: {body}");
    assert!(
        v["id"].as_str().is_some_and(|id| id.starts_with("ch_")),
        "{context}: {body}"
    );
}

/// The line after the one starting with `label `, and the label line itself.
fn labelled<'a>(stdout: &'a str, label: &str) -> Option<(&'a str, &'a str)> {
    let mut lines = stdout.lines();
    let head = lines.find(|l| l.starts_with(&format!("{label} ")))?;
    Some((head, lines.next()?))
}

fn request_lines(ledger: &[Value]) -> Vec<&Value> {
    ledger.iter().filter(|l| l["kind"] == "request").collect()
}

#[test]
fn java_reaches_the_twin_through_the_env_veris_run_sets() {
    if let Some(why) = unavailable("java") {
        return skip(&why);
    }
    let dir = TempDir::new("java");
    let probe = write_probe(&dir);
    let state = dir.join("state");
    let ns = LoopbackNetns::create("java");
    // The safety rule, checked rather than assumed: no default route, and
    // every route the namespace has leads to `lo`.
    let routes = ns.routes();
    assert!(
        routes
            .iter()
            .all(|r| !r.starts_with("default") && r.contains("dev lo")),
        "the namespace must have no route off the machine: {routes:?}"
    );

    // The probe alone, in this namespace: it tries to go direct, and there
    // is nowhere to go. This is what a client that bypasses the proxy looks
    // like to this test: a failure, never a silent pass.
    let mut cmd = ns.command("java");
    cmd.arg(&probe).current_dir(dir.path());
    let out = ns.output(&mut cmd);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success(), "java alone must fail: {stdout}");
    assert!(!stdout.contains("urlconnection"), "{stdout}");
    assert!(stderr.contains("java.net."), "a network error: {stderr}");
    assert!(
        !stderr.contains("Picked up JAVA_TOOL_OPTIONS"),
        "the machine's JAVA_TOOL_OPTIONS must not leak in: {stderr}"
    );

    let mut cmd = ns.command(bin());
    // The explicit tier: what the JVM does with the proxy variables.
    cmd.args(["run", "--tier", "explicit"])
        .arg("--state-dir")
        .arg(&state)
        .args(["--", "java"])
        .arg(&probe)
        .current_dir(dir.path());
    let out = ns.output(&mut cmd);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(0),
        "veris run -- java Probe.java\nstdout: {stdout}\nstderr: {stderr}"
    );

    // What the JVM was told, as it reports it: the JKS truststore in this
    // state dir and the proxy on loopback.
    let picked = stderr
        .lines()
        .find_map(|l| l.strip_prefix("Picked up JAVA_TOOL_OPTIONS: "))
        .unwrap_or_else(|| panic!("the JVM did not pick up JAVA_TOOL_OPTIONS: {stderr}"));
    let truststore = state.join("trust").join("truststore.jks");
    assert!(truststore.is_file(), "{} exists", truststore.display());
    for flag in [
        format!("-Djavax.net.ssl.trustStore={}", truststore.display()),
        "-Djavax.net.ssl.trustStoreType=JKS".to_string(),
        "-Dhttps.proxyHost=127.0.0.1".to_string(),
    ] {
        assert!(picked.contains(&flag), "{flag} in {picked}");
    }

    let (head, body) = labelled(&stdout, "urlconnection")
        .unwrap_or_else(|| panic!("no HttpURLConnection result: {stdout}"));
    assert_eq!(head, "urlconnection 200 proxied=true", "{stdout}");
    assert_twin_charge(body, "HttpURLConnection");
    let (head, body) =
        labelled(&stdout, "httpclient").unwrap_or_else(|| panic!("no HttpClient result: {stdout}"));
    assert_eq!(head, "httpclient 200 HTTP_2", "{stdout}");
    assert_twin_charge(body, "HttpClient");

    // The receipt on stderr lists both calls.
    // As root the command could read the proxy's memory: never verified.
    let integrity = match support::euid() {
        0 => "interception: explicit   integrity: unverified",
        _ => "interception: explicit   integrity: verified",
    };
    assert!(stderr.contains(integrity), "{stderr}");
    assert!(stderr.contains("stripe: 2 request(s)"), "{stderr}");
    assert_eq!(
        stderr.matches("POST \"/v1/charges\" -> 200").count(),
        2,
        "{stderr}"
    );

    let ledger = ledger(&state);
    let requests = request_lines(&ledger);
    let mut seen: Vec<String> = requests
        .iter()
        .map(|r| {
            format!(
                "{} {} {} {} {} {}",
                r["service"], r["host"], r["method"], r["path"], r["status"], r["http"]
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            r#""stripe" "api.stripe.com" "POST" "/v1/charges" 200 "HTTP/1.1""#,
            r#""stripe" "api.stripe.com" "POST" "/v1/charges" 200 "HTTP/2""#,
        ],
        "{requests:?}"
    );
    assert!(requests.iter().all(|r| r["tier"] == "explicit"));
    for client in ["Java 17 HttpClient", "Java 17 HttpURLConnection"] {
        support::record_client(
            client,
            "explicit",
            "works",
            // As tests/e2e/client_matrix.rs words it (one cell of CLIENTS.md).
            "JAVA_TOOL_OPTIONS proxy flags (-Dhttps.proxyHost…); its JKS truststore (-Djavax.net.ssl.trustStore)",
        );
    }
}

#[test]
fn java_ignores_the_proxy_variables_without_java_tool_options() {
    if let Some(why) = unavailable("java") {
        return skip(&why);
    }
    let dir = TempDir::new("java-bare");
    let probe = write_probe(&dir);
    let ns = LoopbackNetns::create("java-bare");

    // Under `veris run`, but with JAVA_TOOL_OPTIONS removed: the proxy
    // variables are all still set, and Java ignores every one of them. The
    // receipt is empty and `veris run` says so with exit code 3.
    let state = dir.join("state");
    let mut cmd = ns.command(bin());
    // The explicit tier: what the JVM does with the proxy variables.
    cmd.args(["run", "--tier", "explicit"])
        .arg("--state-dir")
        .arg(&state)
        .args(["--", "sh", "-c"])
        .arg(r#"test -n "$HTTPS_PROXY" && unset JAVA_TOOL_OPTIONS && exec java "$0""#)
        .arg(&probe)
        .current_dir(dir.path());
    let out = ns.output(&mut cmd);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(3),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(!stdout.contains("urlconnection"), "{stdout}");
    assert!(stderr.contains("java.net."), "a network error: {stderr}");
    assert!(
        stderr.contains("0 requests reached the twin: the code never reached its dependency"),
        "{stderr}"
    );
    assert!(request_lines(&ledger(&state)).is_empty());
}

/// Node's own https module, no proxy agent: POSTs a charge to
/// api.stripe.com over IPv4 and then IPv6 (the name resolves through the
/// namespace's hosts file); prints `<family> <status> <remote address>` and
/// the body on the next line, or `<family> error <code>` and exits 1.
const PROBE_JS: &str = r#"
const https = require("https");
const form = "amount=100&currency=usd";
function post(family) {
  return new Promise((resolve, reject) => {
    const req = https.request("https://api.stripe.com/v1/charges", {
      method: "POST",
      family,
      timeout: 10000,
      headers: {
        "Content-Type": "application/x-www-form-urlencoded",
        "Content-Length": Buffer.byteLength(form),
      },
    }, (res) => {
      const peer = res.socket.remoteAddress;
      let data = "";
      res.setEncoding("utf8");
      res.on("data", (c) => { data += c; });
      res.on("end", () => resolve(`${family} ${res.statusCode} ${peer}\n${data}`));
    });
    req.on("timeout", () => req.destroy(Object.assign(new Error("timed out"), { code: "TIMEOUT" })));
    req.on("error", (e) => reject(Object.assign(e, { family })));
    req.end(form);
  });
}
(async () => {
  for (const family of [4, 6]) {
    console.log(await post(family));
  }
})().catch((e) => {
  console.log(`${e.family} error ${e.code}`);
  console.error(e);
  process.exit(1);
});
"#;

#[test]
fn node_reaches_the_twin_through_the_transparent_redirect() {
    // Root or a rootless namespace (support::netns decides which).
    let no_node = which("node").map_or(Some("`node` is not installed".to_string()), |_| None);
    if let Some(why) = no_node.or_else(support::netns::unavailable) {
        return skip(&why);
    }
    let dir = TempDir::new("node");
    let ns = Netns::create("node");
    let entries = format!("{VENDOR_V4} api.stripe.com\n{VENDOR_V6} api.stripe.com\n");
    let _hosts = if ns.rootless() {
        let file = dir.join("hosts");
        std::fs::write(
            &file,
            format!("127.0.0.1 localhost\n::1 localhost\n{entries}"),
        )
        .unwrap();
        ns.bind_hosts(&file);
        None
    } else {
        Some(NetnsHosts::write(&ns.name, &entries))
    };
    // Strict: anything but a vendor host would be refused, not passed on.
    let veris = Veris::start(&ns, &dir, &["--mode", "strict"]);
    let ca = veris.state.join("trust").join("ca.pem");
    assert!(ca.is_file(), "{} exists", ca.display());

    let node = |extra_ca: Option<&Path>| {
        let mut cmd = ns.command("node");
        cmd.env("PATH", path_var()).args(["-e", PROBE_JS]);
        if let Some(ca) = extra_ca {
            cmd.env("NODE_EXTRA_CA_CERTS", ca);
        }
        let out = ns.output(&mut cmd, CLIENT_TIMEOUT);
        (out.status, text(&out.stdout), text(&out.stderr))
    };

    // Trusting only Node's bundled roots: our leaf is refused, which shows
    // the answer below comes from the interception and nothing else.
    let (status, stdout, stderr) = node(None);
    assert!(!status.success(), "node must refuse our leaf: {stdout}");
    // Our leaf is served with the CA, which Node does not know: the chain
    // ends in a self-signed certificate.
    assert_eq!(
        stdout.trim(),
        "4 error SELF_SIGNED_CERT_IN_CHAIN",
        "a certificate error: {stderr}"
    );

    let (status, stdout, stderr) = node(Some(&ca));
    assert!(status.success(), "stdout: {stdout}\nstderr: {stderr}");
    for (family, addr) in [("4", VENDOR_V4), ("6", VENDOR_V6)] {
        let (head, body) =
            labelled(&stdout, family).unwrap_or_else(|| panic!("no IPv{family} result: {stdout}"));
        // The socket's peer is the TEST-NET address Node dialed: only the
        // redirect could have answered it.
        assert_eq!(head, format!("{family} 200 {addr}"), "{stdout}");
        assert_twin_charge(body, &format!("node over IPv{family}"));
    }

    let state = veris.state.clone();
    let status = veris.stop();
    assert!(status.success(), "veris exit: {status}");
    let ledger = ledger(&state);
    let requests = request_lines(&ledger);
    assert_eq!(requests.len(), 2, "{requests:?}");
    for r in &requests {
        assert_eq!(r["tier"], "transparent", "{r}");
        assert_eq!(r["service"], "stripe", "{r}");
        assert_eq!(r["host"], "api.stripe.com", "{r}");
        assert_eq!(r["method"], "POST", "{r}");
        assert_eq!(r["path"], "/v1/charges", "{r}");
        assert_eq!(r["status"], 200, "{r}");
    }
    // Node closes mid-handshake without an alert when it rejects our leaf:
    // no evidence of a refusal, so an abandoned handshake (a note).
    let abandoned: Vec<&Value> = ledger
        .iter()
        .filter(|l| l["kind"] == "tls_abandoned")
        .collect();
    assert_eq!(abandoned.len(), 1, "the refused attempt: {abandoned:?}");
    assert_eq!(abandoned[0]["host"], "api.stripe.com");
    assert_eq!(abandoned[0]["tier"], "transparent");
    assert_eq!(abandoned[0]["stage"], "handshake");
    assert!(
        !ledger.iter().any(|l| l["kind"] == "trust_failure"),
        "{ledger:?}"
    );

    // And the receipt reads the same: two charges, through the transparent tier.
    let out = Command::new(bin())
        .args(["receipt", "--json", "--allow-empty", "--state-dir"])
        .arg(&state)
        .env_clear()
        .output()
        .unwrap();
    let receipt: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("receipt JSON: {e}: {}", text(&out.stdout)));
    assert_eq!(receipt["interception"], "transparent", "{receipt}");
    assert_eq!(receipt["services"]["stripe"]["requests"], 2, "{receipt}");
    support::record_client(
        "Node https (Node 20)",
        "transparent",
        "works",
        "redirected; NODE_EXTRA_CA_CERTS",
    );
}
