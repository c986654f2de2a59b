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

/// A request's line in JSON carries the request's fields (service, host,
/// method, the redacted path, never a query string) and its numbers as JSON
/// numbers; so does the start's open-file limit.
#[test]
fn a_json_request_line_keeps_its_fields_and_numbers() {
    let mut serve = Serve::start("logs-json-fields", &["--log-format", "json"]);
    // A reserved path: answered by the proxy, logged at info. The secret in
    // the path and the query must not reach the log.
    let path = "/veris/sk_test_4eC39HqLyjWDarjtT1zdp7dc?token=sk_test_4eC39HqLyjWDarjtT1zdp7dc";
    assert_eq!(serve.vendor("GET", "api.stripe.com", path), 404);
    serve.stop();
    let stderr = std::fs::read_to_string(&serve.stderr_file).unwrap();
    assert!(!stderr.contains("4eC39HqLyjWDarjtT1zdp7dc"), "{stderr}");
    let lines: Vec<Value> = stderr
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let line = lines
        .iter()
        .find(|l| l["fields"]["message"] == "reserved path answered by the proxy")
        .unwrap_or_else(|| panic!("no line for the request: {stderr}"));
    let fields = &line["fields"];
    assert_eq!(fields["service"], "stripe", "{line}");
    assert_eq!(fields["host"], "api.stripe.com", "{line}");
    assert_eq!(fields["method"], "GET", "{line}");
    assert_eq!(fields["path"], "/veris/[redacted]", "{line}");
    assert_eq!(fields["status"], 404, "a number: {line}");
    let limit = lines
        .iter()
        .find(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("open-file limit"))
        })
        .unwrap_or_else(|| panic!("no open-file limit line: {stderr}"));
    assert!(
        limit["fields"]["soft"].is_u64() || limit["fields"]["unlimited"] == true,
        "a number: {limit}"
    );
}
