//! `--log-format json`: every line `veris serve` writes to stderr is JSON
//! (a log collector parses each), its announcement of the proxy too, in
//! the subscriber's own shape; the text format keeps `veris: proxy …`.

use crate::support;

use serde_json::Value;
use support::Serve;

#[test]
fn every_stderr_line_of_a_json_serve_is_json() {
    let mut serve = Serve::start("logs-json", &["--log-format", "json"]);
    assert_eq!(serve.vendor("GET", "api.stripe.com", "/v1/customers"), 200);
    serve.stop();
    let stderr = std::fs::read_to_string(&serve.stderr_file).unwrap();
    let lines: Vec<Value> = stderr
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}\n{stderr}"))
        })
        .collect();
    for l in &lines {
        assert!(l["level"].is_string() && l["timestamp"].is_string(), "{l}");
        assert!(l["fields"]["message"].is_string(), "{l}");
    }
    let proxy = format!("proxy http://{}", serve.proxy_addr());
    assert!(
        lines.iter().any(|l| l["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with(&proxy))),
        "the announcement: {stderr}"
    );
    // The same start in text: a plain line.
    let mut text = Serve::start("logs-text", &[]);
    text.stop();
    let stderr = std::fs::read_to_string(&text.stderr_file).unwrap();
    assert!(
        stderr.contains(&format!("veris: proxy http://{}", text.proxy_addr())),
        "{stderr}"
    );
}
