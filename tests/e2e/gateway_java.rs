//! Java through the gateway (issue G1): a proxy-unaware Java 17 HttpClient
//! in a redsocks sandbox (the platform's SOCKS5 tunnel) trusting only the
//! gateway's Java trust store, named by `veris gateway ca --env`'s
//! `JAVA_TOOL_OPTIONS`, charges the stripe twin; the sandbox's receipt
//! lists the call. An untrusting JVM (its own cacerts only) is refused at
//! the handshake and nothing reaches the twin.

use crate::support::gateway::*;
use crate::support::{self, output, skip, text, veris, TempDir};

const CHARGE_JAVA: &str = r#"
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;

public class Charge {
    public static void main(String[] args) throws Exception {
        HttpClient client = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(20)).build();
        HttpRequest req = HttpRequest.newBuilder(URI.create(args[0]))
            .timeout(Duration.ofSeconds(20))
            .header("Content-Type", "application/x-www-form-urlencoded")
            .POST(HttpRequest.BodyPublishers.ofString("amount=100&currency=usd"))
            .build();
        HttpResponse<String> res = client.send(req, HttpResponse.BodyHandlers.ofString());
        System.out.println(res.statusCode());
    }
}
"#;

/// `JAVA_TOOL_OPTIONS` from `veris gateway ca --env` (its trust store).
fn java_tool_options(gw: &Gateway) -> String {
    let out = output(
        veris(["gateway", "ca", "--state-dir"])
            .arg(&gw.state)
            .arg("--env"),
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "gateway ca --env: {stderr}");
    let line = stdout
        .lines()
        .find_map(|l| {
            l.trim_start_matches("export ")
                .strip_prefix("JAVA_TOOL_OPTIONS=")
        })
        .unwrap_or_else(|| panic!("no JAVA_TOOL_OPTIONS in `gateway ca --env`: {stdout}"));
    line.trim_matches(|c| c == '"' || c == '\'').to_string()
}

#[test]
fn a_proxy_unaware_java_client_in_a_redsocks_sandbox_is_received_by_the_gateway() {
    if let Some(why) = platform_unavailable(&["redsocks", "java"]) {
        return skip(&why);
    }
    let dir = TempDir::new("gw-java");
    let platform = Platform::new();
    let mut gw = Gateway::start("gw-java", &format!("{}:0", platform.addr), &[]);
    let a = gw.add_sandbox_json("sbx-java", "stripe");
    let net = platform.sandbox(&dir, "gwj", gw.listen, &a.username, &a.password);
    let source = dir.join("Charge.java");
    std::fs::write(&source, CHARGE_JAVA).unwrap();
    let java = |options: Option<&str>| {
        let mut cmd = net.command("java");
        // Only what the test names: no ambient trust or proxy settings.
        support::client_env(&mut cmd);
        if let Some(o) = options {
            cmd.env("JAVA_TOOL_OPTIONS", o);
        }
        cmd.arg(&source).arg(HTTPS_CHARGES);
        net.output(&mut cmd)
    };

    // The JVM's own cacerts do not hold the gateway's CA: refused at the
    // handshake, before any request.
    let out = java(None);
    let (stdout, stderr) = text(&out);
    assert!(
        !out.status.success() && stderr.contains("PKIX"),
        "an untrusting JVM got through: {stdout} {stderr}"
    );
    let before = charges(&gw.receipt_json("sbx-java")).len();
    assert_eq!(before, 0, "a refused handshake reached the twin");

    let options = java_tool_options(&gw);
    let out = java(Some(&options));
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success() && stdout.trim() == "200",
        "Java HttpClient with the gateway's trust store: {stdout:?} {stderr}; redsocks: {}; gateway: {}",
        std::fs::read_to_string(&net.log).unwrap_or_default(),
        gw.stderr()
    );
    let receipt = gw.receipt_json("sbx-java");
    assert_eq!(receipt["interception"], "gateway", "{receipt}");
    let listed = charges(&receipt);
    assert_eq!(listed.len(), 1, "the Java call is listed once: {receipt}");
    assert_eq!(listed[0]["status"], 200, "{receipt}");
    gw.stop();
}
