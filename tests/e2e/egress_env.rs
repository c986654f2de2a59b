//! End-to-end tests of what veris hands the workload beyond the usual
//! variables, and of where its passthrough traffic goes:
//!
//! - wget (GnuTLS in Debian: it reads no CA variable) trusts veris through
//!   the generated wgetrc that `WGETRC` names, and fails without it;
//! - PHP's curl extension (libcurl reads no CA variable either) trusts veris
//!   through the ini dir on `PHP_INI_SCAN_DIR`, while the system's ini files
//!   (which load that extension) still load;
//! - a user's `NO_PROXY` is merged into veris's, except an entry that would
//!   send a routed vendor host around the proxy: it is dropped with a
//!   warning, and the vendor call is still in the receipt;
//! - `--upstream-proxy`: passthrough tunnels and re-originated plain HTTP go
//!   through a CONNECT proxy (a small one in this test, counting tunnels),
//!   twin traffic never does, and a refusal by that proxy reaches the client
//!   as a 502 that names it, with ledger lines that say the same.
//!
//! Network safety: clients that would resolve or dial a vendor name
//! themselves if they ignored the proxy run in a network namespace with only
//! `lo` (`unshare -rn`), where any escape simply fails. The upstream proxy
//! here dials nothing but its own loopback origin, whatever name it is
//! asked for.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use support::{output_within, skip, text, tool_works, Serve, TempDir};

const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// `veris run --tier explicit --state-dir STATE FLAGS -- CHILD` inside a
/// fresh network namespace that has only `lo`, environment cleared but for
/// PATH, HOME and what `adjust` adds.
fn run_lo_only(
    state: &std::path::Path,
    flags: &[&str],
    child: &[&str],
    adjust: impl FnOnce(&mut Command),
) -> (Option<i32>, String, String) {
    let mut cmd = support::lo_only(support::bin());
    cmd.args(["run", "--tier", "explicit", "--state-dir"])
        .arg(state)
        .args(flags)
        .arg("--")
        .args(child);
    adjust(&mut cmd);
    let out = output_within(&mut cmd, RUN_TIMEOUT);
    let (stdout, stderr) = text(&out);
    (out.status.code(), stdout, stderr)
}

#[test]
fn wget_trusts_veris_through_the_generated_wgetrc() {
    if let Some(why) = support::lo_only_unavailable() {
        return skip(&why);
    }
    if !tool_works("wget", &["--version"]) {
        return skip("wget not installed (apt install wget)");
    }
    let dir = TempDir::new("wgetrc");
    let state = dir.join("state");
    let wget = "wget -q -O - --tries=1 --timeout=20 https://api.stripe.com/v1/customers";
    let (code, stdout, stderr) = run_lo_only(&state, &[], &["sh", "-c", wget], |_| {});
    assert_eq!(code, Some(0), "stdout: {stdout}\nstderr: {stderr}");
    let list: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(list["object"], "list", "{stdout}");
    assert!(stderr.contains("stripe: 1 request(s)"), "{stderr}");
    let wgetrc = std::fs::read_to_string(state.join("trust").join("wgetrc")).unwrap();
    assert!(
        wgetrc.contains(&format!(
            "ca_certificate = {}",
            state.join("trust").join("bundle.pem").display()
        )),
        "{wgetrc}"
    );

    // The same without WGETRC: wget is back on the system roots, refuses the
    // veris leaf, and the receipt is empty (exit 3).
    let bare = format!("unset WGETRC; {wget}");
    let (code, stdout, stderr) = run_lo_only(&state, &[], &["sh", "-c", &bare], |_| {});
    assert_eq!(code, Some(3), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stderr.contains("0 requests reached the twin"), "{stderr}");
}

/// PHP's curl extension, configured by nothing but its ini settings and the
/// proxy variables: prints the body, or the curl error and exits 1.
const PHP_CURL: &str = r#"
if (!function_exists("curl_init")) { fwrite(STDERR, "no curl extension\n"); exit(2); }
$c = curl_init("https://api.stripe.com/v1/customers");
curl_setopt($c, CURLOPT_RETURNTRANSFER, true);
curl_setopt($c, CURLOPT_TIMEOUT, 20);
$r = curl_exec($c);
if ($r === false) { fwrite(STDERR, "curl error: " . curl_error($c) . "\n"); exit(1); }
fwrite(STDERR, "cainfo=" . ini_get("curl.cainfo") . " openssl=" . ini_get("openssl.cafile") . "\n");
echo $r;
"#;

#[test]
fn php_curl_trusts_veris_through_the_ini_scan_dir_and_keeps_the_system_ini() {
    if let Some(why) = support::lo_only_unavailable() {
        return skip(&why);
    }
    if !tool_works(
        "php",
        &["-r", "exit(function_exists('curl_init') ? 0 : 1);"],
    ) {
        return skip("php with its curl extension not installed (apt install php-cli php-curl)");
    }
    let dir = TempDir::new("php");
    let state = dir.join("state");
    let (code, stdout, stderr) = run_lo_only(&state, &[], &["php", "-r", PHP_CURL], |_| {});
    assert_eq!(code, Some(0), "stdout: {stdout}\nstderr: {stderr}");
    let list: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(list["object"], "list", "{stdout}");
    let bundle = state.join("trust").join("bundle.pem");
    assert!(
        stderr.contains(&format!(
            "cainfo={} openssl={}",
            bundle.display(),
            bundle.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("stripe: 1 request(s)"), "{stderr}");

    // A user's own scan dir stays first, and the system's then does not
    // load unless it listed it: here it lists nothing else, so the curl
    // extension is gone, which shows the variable is appended to, not lost.
    let (code, _, stderr) = run_lo_only(
        &state,
        &["--allow-empty"],
        &["php", "-r", PHP_CURL],
        |cmd| {
            cmd.env("PHP_INI_SCAN_DIR", "/nonexistent-veris-php");
        },
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("no curl extension"), "{stderr}");
}

#[test]
fn a_users_no_proxy_is_merged_but_never_exempts_a_routed_host() {
    if let Some(why) = support::lo_only_unavailable() {
        return skip(&why);
    }
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let dir = TempDir::new("no-proxy");
    let state = dir.join("state");
    // curl honours NO_PROXY: had `.stripe.com` survived, it would go
    // direct, and in this namespace there is nowhere to go.
    let script = r#"printf 'NO_PROXY=%s\nno_proxy=%s\n' "$NO_PROXY" "$no_proxy" >&2
exec curl -sS --max-time 20 https://api.stripe.com/v1/customers"#;
    let (code, stdout, stderr) = run_lo_only(&state, &[], &["sh", "-c", script], |cmd| {
        cmd.env("NO_PROXY", "internal.corp,.stripe.com,localhost")
            .env("no_proxy", "10.0.0.0/8 *");
    });
    assert_eq!(code, Some(0), "stdout: {stdout}\nstderr: {stderr}");
    let merged = "localhost,127.0.0.1,::1,internal.corp,10.0.0.0/8";
    assert!(
        stderr.contains(&format!("NO_PROXY={merged}\nno_proxy={merged}\n")),
        "{stderr}"
    );
    for entry in ["\".stripe.com\"", "\"*\""] {
        assert!(
            stderr
                .lines()
                .any(|l| l.contains("ignoring a NO_PROXY entry") && l.contains(entry)),
            "a warning naming {entry}: {stderr}"
        );
    }
    let list: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(list["object"], "list", "{stdout}");
    assert!(stderr.contains("stripe: 1 request(s)"), "{stderr}");
    assert!(stderr.contains("GET \"/v1/customers\" -> 200"), "{stderr}");
}

/// A loopback HTTP/1.1 server that answers every request `origin:<path>`
/// and closes; its address.
fn origin() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let head = read_head(&mut conn);
                let path = head.split_whitespace().nth(1).unwrap_or("?").to_string();
                let body = format!("origin:{path}");
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    addr
}

/// Reads up to the end of a request or reply head (bounded).
fn read_head(conn: &mut TcpStream) -> String {
    conn.set_read_timeout(Some(support::DEADLINE)).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
        match conn.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// A CONNECT proxy on loopback standing in for a corporate proxy: every
/// tunnel it opens leads to `origin`, whatever it was asked for (so it
/// never dials anything else); `denied.*` targets get 403.
struct ConnectProxy {
    url: String,
    tunnels: Arc<AtomicUsize>,
    targets: Arc<Mutex<Vec<String>>>,
}

impl ConnectProxy {
    fn start(origin: SocketAddr) -> ConnectProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let tunnels = Arc::new(AtomicUsize::new(0));
        let targets = Arc::new(Mutex::new(Vec::new()));
        let (t, g) = (tunnels.clone(), targets.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut client) = conn else { continue };
                let (tunnels, targets) = (t.clone(), g.clone());
                std::thread::spawn(move || {
                    let head = read_head(&mut client);
                    let mut words = head.split_whitespace();
                    let (method, target) = (words.next(), words.next().unwrap_or(""));
                    targets.lock().unwrap().push(target.to_string());
                    if method != Some("CONNECT") {
                        let _ = client.write_all(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n");
                        return;
                    }
                    if target.starts_with("denied.") {
                        let _ = client
                            .write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n");
                        return;
                    }
                    let Ok(mut up) = TcpStream::connect(origin) else {
                        return;
                    };
                    tunnels.fetch_add(1, Ordering::SeqCst);
                    let _ = client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
                    let (mut c2, mut u2) = (client.try_clone().unwrap(), up.try_clone().unwrap());
                    let copy = std::thread::spawn(move || {
                        let _ = std::io::copy(&mut c2, &mut u2);
                        let _ = u2.shutdown(std::net::Shutdown::Write);
                    });
                    let _ = std::io::copy(&mut up, &mut client);
                    let _ = client.shutdown(std::net::Shutdown::Write);
                    let _ = copy.join();
                });
            }
        });
        ConnectProxy {
            url,
            tunnels,
            targets,
        }
    }

    fn tunnels(&self) -> usize {
        self.tunnels.load(Ordering::SeqCst)
    }

    fn targets(&self) -> Vec<String> {
        self.targets.lock().unwrap().clone()
    }
}

#[test]
fn passthrough_is_chained_through_the_upstream_proxy_and_twin_traffic_is_not() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let origin = origin();
    let port = origin.port();
    let upstream = ConnectProxy::start(origin);
    let mut serve = Serve::start("upstream-proxy", &["--upstream-proxy", &upstream.url]);

    // A CONNECT tunnel (curl -p) to a host no service routes: through the
    // upstream proxy, which is handed the name, unresolved.
    let out = output_within(
        serve
            .curl()
            .args(["-p", &format!("http://passthrough.test:{port}/tunnel")]),
        support::DEADLINE,
    );
    assert_eq!(text(&out).0, "origin:/tunnel", "{:?}", text(&out));
    assert_eq!(upstream.tunnels(), 1);
    assert_eq!(upstream.targets(), [format!("passthrough.test:{port}")]);

    // Plain HTTP in absolute form, re-originated by veris: also through it.
    let out = output_within(
        serve
            .curl()
            .arg(format!("http://passthrough.test:{port}/plain")),
        support::DEADLINE,
    );
    assert_eq!(text(&out).0, "origin:/plain", "{:?}", text(&out));
    assert_eq!(upstream.tunnels(), 2);

    // A vendor call goes to the twin, never to the upstream proxy.
    let out = output_within(
        serve.curl().arg("https://api.stripe.com/v1/customers"),
        support::DEADLINE,
    );
    let list: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {:?}", text(&out)));
    assert_eq!(list["object"], "list");
    assert_eq!(upstream.tunnels(), 2, "{:?}", upstream.targets());

    // The upstream proxy refuses: the client gets a 502 in words.
    let (status, body) = support::http(
        serve.proxy_addr(),
        "CONNECT",
        "denied.test:443",
        "denied.test:443",
        "",
        "",
    );
    assert_eq!(status, 502, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(body["error"], "veris_upstream_proxy_failed", "{body}");
    assert_eq!(body["upstream_proxy"], upstream.url.as_str(), "{body}");
    assert_eq!(body["upstream_proxy_status"], 403, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("answered CONNECT denied.test:443 with \"HTTP/1.1 403 Forbidden\""),
        "{message}"
    );
    assert_eq!(upstream.tunnels(), 2);

    serve.stop();
    let ledger = serve.ledger_lines();
    let proxy_addr = upstream.url.trim_start_matches("http://");
    let passthrough: Vec<&Value> = ledger
        .iter()
        .filter(|l| l["kind"] == "passthrough" && l["host"] == "passthrough.test")
        .collect();
    assert_eq!(passthrough.len(), 2, "{ledger:?}");
    // What veris dialed is the upstream proxy.
    assert!(
        passthrough.iter().all(|l| l["dst"] == proxy_addr),
        "{passthrough:?}"
    );
    let denied = ledger
        .iter()
        .find(|l| l["kind"] == "passthrough" && l["host"] == "denied.test")
        .unwrap_or_else(|| panic!("a passthrough line for denied.test: {ledger:?}"));
    assert!(denied.get("dst").is_none(), "{denied}");
    let closed = ledger
        .iter()
        .find(|l| l["kind"] == "tunnel_close" && l["of"] == denied["seq"])
        .unwrap_or_else(|| panic!("a tunnel_close for the refused tunnel: {ledger:?}"));
    assert!(
        closed["error"]
            .as_str()
            .is_some_and(|e| e.contains("403 Forbidden")),
        "{closed}"
    );
    let requests: Vec<&Value> = ledger.iter().filter(|l| l["kind"] == "request").collect();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0]["host"], "api.stripe.com");

    // `veris run` takes the flag too.
    let state = serve.dir.join("run-state");
    let mut cmd = support::veris(["run", "--tier", "explicit", "--allow-empty", "--state-dir"]);
    cmd.arg(&state)
        .args(["--upstream-proxy", &upstream.url, "--", "sh", "-c"])
        .arg(format!(
            "exec curl -sS --max-time 20 -p -x \"$HTTP_PROXY\" http://passthrough.test:{port}/run"
        ));
    let out = output_within(&mut cmd, RUN_TIMEOUT);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert_eq!(stdout, "origin:/run", "{stderr}");
    assert_eq!(upstream.tunnels(), 3);
}

#[test]
fn an_isolated_runs_passthrough_goes_through_the_upstream_proxy_by_name() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let origin = origin();
    let port = origin.port();
    let upstream = ConnectProxy::start(origin);
    let dir = TempDir::new("upstream-isolated");
    // Inside, the name resolves to a synthetic address (veris's DNS stub),
    // the connection is redirected to veris, and veris hands the upstream
    // proxy the name that address stands for.
    let mut cmd = support::veris(["run", "--tier", "isolated", "--allow-empty", "--state-dir"]);
    cmd.arg(dir.join("state"))
        .args(["--upstream-proxy", &upstream.url, "--", "curl", "-sS"])
        .args(["--max-time", "20"])
        .arg(format!("http://passthrough.test:{port}/isolated"));
    let out = output_within(&mut cmd, RUN_TIMEOUT);
    let (stdout, stderr) = text(&out);
    if out.status.code() == Some(1) && stderr.contains("cannot isolate the command") {
        return skip(&format!("isolation unavailable: {}", stderr.trim()));
    }
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert_eq!(stdout, "origin:/isolated", "{stderr}");
    assert_eq!(upstream.tunnels(), 1);
    assert_eq!(upstream.targets(), [format!("passthrough.test:{port}")]);
}

/// From an isolated run, a name the upstream proxy would resolve to this
/// host (here: the machine's own host name, which resolves to loopback)
/// is refused before the upstream proxy sees it — a proxy beside veris
/// would otherwise reach the host's loopback for the command. What the
/// upstream proxy's own resolution leaves open is named in the leaks.
#[test]
fn an_isolated_runs_name_for_this_host_never_reaches_the_upstream_proxy() {
    if let Err(why) = support::curl() {
        return skip(&why);
    }
    let name = String::from_utf8_lossy(&Command::new("hostname").output().unwrap().stdout)
        .trim()
        .to_string();
    let getent = Command::new("getent")
        .args(["hosts", &name])
        .output()
        .unwrap();
    let resolved = String::from_utf8_lossy(&getent.stdout).to_string();
    if name.is_empty() || name == "localhost" || !resolved.starts_with("127.") {
        return skip(&format!(
            "the host name {name:?} does not resolve to loopback here ({resolved:?})"
        ));
    }
    let origin = origin();
    let port = origin.port();
    let upstream = ConnectProxy::start(origin);
    let dir = TempDir::new("upstream-isolated-host");
    let state = dir.join("state");
    let mut cmd = support::veris(["run", "--tier", "isolated", "--allow-empty", "--state-dir"]);
    cmd.arg(&state)
        .args(["--upstream-proxy", &upstream.url, "--", "sh", "-c"])
        .arg(format!(
            "curl -sS --max-time 20 http://{name}:{port}/host; \
             curl -sS --max-time 20 http://passthrough.test:{port}/other"
        ));
    let out = output_within(&mut cmd, RUN_TIMEOUT);
    let (stdout, stderr) = text(&out);
    if out.status.code() == Some(1) && stderr.contains("cannot isolate the command") {
        return skip(&format!("isolation unavailable: {}", stderr.trim()));
    }
    assert!(!stdout.contains("origin:/host"), "{stdout}\n{stderr}");
    assert!(stdout.contains("origin:/other"), "{stdout}\n{stderr}");
    assert_eq!(
        upstream.targets(),
        [format!("passthrough.test:{port}")],
        "{stderr}"
    );
    let out = output_within(
        support::veris(["receipt", "--json", "--state-dir"]).arg(&state),
        RUN_TIMEOUT,
    );
    let (stdout, stderr) = text(&out);
    let receipt: Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    let leaks = receipt["leaks"]
        .as_array()
        .unwrap_or_else(|| panic!("{receipt}"));
    assert!(
        leaks.iter().any(|l| l == "upstream-proxy-resolves-names"),
        "{leaks:?}"
    );
}

/// Only an http:// upstream proxy is supported: an https:// (TLS to the
/// proxy) or SOCKS URL is refused at start, by serve and by run before its
/// command starts, in words with the next step, and nothing is written.
#[test]
fn an_upstream_proxy_that_is_not_http_is_refused_at_start() {
    let dir = TempDir::new("upstream-scheme");
    for url in ["https://proxy.test:3128", "socks5://proxy.test:1080"] {
        let scheme = url.split_once("://").unwrap().0;
        let state = dir.join(format!("serve-{scheme}"));
        let mut cmd = support::veris(["serve", "--listen", "127.0.0.1:0", "--state-dir"]);
        cmd.arg(&state).args(["--upstream-proxy", url]);
        let out = output_within(&mut cmd, RUN_TIMEOUT);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "--upstream-proxy \"{url}\": the upstream proxy must be an http:// URL (a {scheme}:// proxy is not supported). Next: give it as http://[user:password@]host:port"
            )),
            "{stderr}"
        );
        assert!(!state.exists(), "nothing written before the refusal");

        let state = dir.join(format!("run-{scheme}"));
        let marker = dir.join(format!("ran-{scheme}"));
        let mut cmd = support::veris(["run", "--tier", "explicit", "--state-dir"]);
        cmd.arg(&state)
            .args(["--upstream-proxy", url, "--", "touch"])
            .arg(&marker);
        let out = output_within(&mut cmd, RUN_TIMEOUT);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("the upstream proxy must be an http:// URL"),
            "{stderr}"
        );
        assert!(stderr.contains("Next: "), "{stderr}");
        assert!(!marker.exists(), "the command ran");
    }
}
