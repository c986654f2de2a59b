//! `GET /metrics` on the admin API of a live `veris serve` (built-in twin,
//! curl through the proxy): the token is needed unless `--metrics-open`, the
//! counts match the requests made and the ledger, and the text parses with
//! a real Prometheus parser (Python's `prometheus_client`). The token never
//! shows in the metrics or the log.

use crate::support;

use std::collections::BTreeMap;
use std::net::TcpStream;

use serde_json::Value;
use support::*;

/// Reads the text format from stdin with `prometheus_client`'s parser and
/// prints every sample as JSON: `[name, labels, value]`.
const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        out.append([s.name, s.labels, s.value, family.type])
print(json.dumps(out))
"#;

/// `GET /metrics` with or without the token: (status, headers and body).
fn scrape(serve: &Serve, token: bool) -> (u16, String) {
    let auth = if token {
        format!("Authorization: Bearer {}\r\n", serve.token())
    } else {
        String::new()
    };
    http(serve.admin(), "GET", "/metrics", "127.0.0.1", &auth, "")
}

/// The value of the sample `series` (`name{labels}` exactly as written).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

fn curl_ok(serve: &Serve, args: &[&str]) {
    let out = output(
        serve
            .curl()
            .args(["-o", "/dev/null", "-w", "%{http_code}"])
            .args(args),
    );
    assert!(out.status.success(), "curl {args:?}: {:?}", text(&out));
}

#[test]
fn metrics_count_the_requests_made_and_parse_as_the_text_format() {
    if let Err(why) = curl() {
        return skip(&why);
    }
    let parser = tool_works("python3", &["-c", "import prometheus_client.parser"]);
    let mut serve = Serve::start("metrics", &[]);

    // Three stripe calls the twin answers 2xx, one 404, one calendar call.
    for _ in 0..3 {
        curl_ok(
            &serve,
            &["https://api.stripe.com/v1/customers", "-d", "email=a@b.c"],
        );
    }
    curl_ok(&serve, &["https://api.stripe.com/v1/nothing-here"]);
    curl_ok(
        &serve,
        &["https://www.googleapis.com/calendar/v3/calendars/primary/events"],
    );
    // A client that trusts another CA refuses the leaf: a trust failure.
    let other = serve.dir.join("other-state");
    let made = output(veris(["ca", "init", "--state-dir"]).arg(&other));
    assert!(made.status.success(), "{:?}", text(&made));
    let refused = output(
        command("curl")
            .args([
                "-sS",
                "--max-time",
                "10",
                "-x",
                &serve.proxy_url,
                "--cacert",
            ])
            .arg(other.join("trust").join("ca.pem"))
            .arg("https://api.stripe.com/v1/charges"),
    );
    assert_eq!(refused.status.code(), Some(60), "{:?}", text(&refused));
    wait_for("the trust_failure line", DEADLINE, || {
        serve
            .ledger_lines()
            .iter()
            .any(|l| l["kind"] == "trust_failure")
            .then_some(())
    });

    // Without the token: 401, and nothing about the metrics.
    let (status, body) = scrape(&serve, false);
    assert_eq!(status, 401, "{body}");
    assert!(!body.contains("veris_requests"), "{body}");
    // The rest of the API is unchanged.
    assert_eq!(
        http(serve.admin(), "GET", "/status", "127.0.0.1", "", "").0,
        401
    );

    // A connection held open shows in the gauge (the curls' have closed).
    let held = TcpStream::connect(serve.proxy_addr()).expect("connecting to the proxy");
    let text = wait_for("connections_open to be 1", DEADLINE, || {
        let (status, body) = scrape(&serve, true);
        assert_eq!(status, 200, "{body}");
        (sample(&body, "veris_connections_open") == Some(1.0)).then_some(body)
    });
    drop(held);

    let want = [
        (r#"veris_requests_total{service="stripe",class="2xx"}"#, 3.0),
        (r#"veris_requests_total{service="stripe",class="4xx"}"#, 1.0),
        (r#"veris_requests_total{service="stripe",class="5xx"}"#, 0.0),
        (
            r#"veris_requests_total{service="google-calendar",class="2xx"}"#,
            1.0,
        ),
        (
            r#"veris_requests_total{service="hubspot",class="2xx"}"#,
            0.0,
        ),
        (r#"veris_ledger_lines_total{kind="request"}"#, 5.0),
        (r#"veris_ledger_lines_total{kind="session"}"#, 1.0),
        (r#"veris_ledger_lines_total{kind="trust_failure"}"#, 1.0),
        ("veris_trust_failures_total", 1.0),
        ("veris_quic_attempts_total", 0.0),
        ("veris_upstream_latency_seconds_count", 5.0),
        (r#"veris_upstream_latency_seconds_bucket{le="+Inf"}"#, 5.0),
    ];
    for (series, value) in want {
        assert_eq!(sample(&text, series), Some(value), "{series} in:\n{text}");
    }
    let sum = sample(&text, "veris_upstream_latency_seconds_sum").expect("a sum");
    assert!(sum > 0.0 && sum < 5.0 * 20.0, "{sum}");
    // The request counts agree with the ledger's lines.
    let lines = serve.ledger_lines();
    let requests = lines.iter().filter(|l| l["kind"] == "request").count();
    assert_eq!(requests, 5);

    // The token is in neither the metrics nor the log.
    let token = serve.token();
    assert!(!text.contains(&token));
    assert!(!serve.stderr().contains(&token));

    // The text format, read by a real parser.
    if !parser {
        skip("python3 with prometheus_client not available (pip install prometheus-client)");
    } else {
        let mut cmd = command("python3");
        cmd.args(["-c", PARSE])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().expect("python3 runs");
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("piped stdin");
            stdin
                .write_all(text.as_bytes())
                .expect("writing the metrics");
        }
        let out = child.wait_with_output().expect("python3 ends");
        assert!(
            out.status.success(),
            "the parser refused:\n{text}\n{:?}",
            support::text(&out)
        );
        let samples: Vec<(String, BTreeMap<String, String>, f64, String)> =
            serde_json::from_slice(&out.stdout).expect("the parser's JSON");
        let find = |name: &str, labels: &[(&str, &str)]| {
            samples
                .iter()
                .find(|(n, l, _, _)| {
                    n == name
                        && labels
                            .iter()
                            .all(|(k, v)| l.get(*k).map(String::as_str) == Some(v))
                })
                .map(|(_, _, v, t)| (*v, t.clone()))
        };
        assert_eq!(
            find(
                "veris_requests_total",
                &[("service", "stripe"), ("class", "2xx")]
            ),
            Some((3.0, "counter".into()))
        );
        assert_eq!(
            find("veris_trust_failures_total", &[]),
            Some((1.0, "counter".into()))
        );
        assert_eq!(
            find("veris_connections_open", &[]),
            Some((1.0, "gauge".into()))
        );
        assert_eq!(
            find("veris_upstream_latency_seconds_count", &[]),
            Some((5.0, "histogram".into()))
        );
        let buckets: Vec<f64> = samples
            .iter()
            .filter(|(n, _, _, _)| n == "veris_upstream_latency_seconds_bucket")
            .map(|(_, _, v, _)| *v)
            .collect();
        assert!(buckets.len() > 5, "{buckets:?}");
        assert!(
            buckets.windows(2).all(|w| w[0] <= w[1]),
            "cumulative: {buckets:?}"
        );
    }
    serve.stop();
}

#[test]
fn metrics_open_serves_metrics_without_the_token_and_nothing_else() {
    let mut serve = Serve::start("metrics-open", &["--metrics-open"]);
    assert_eq!(serve.vendor("GET", "api.stripe.com", "/v1/customers"), 200);
    let (status, body) = scrape(&serve, false);
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        sample(
            &body,
            r#"veris_requests_total{service="stripe",class="2xx"}"#
        ),
        Some(1.0),
        "{body}"
    );
    assert!(!body.contains(&serve.token()));
    // Every other endpoint still needs the token.
    for path in ["/status", "/ledger", "/receipt"] {
        let (status, _) = http(serve.admin(), "GET", path, "127.0.0.1", "", "");
        assert_eq!(status, 401, "{path}");
    }
    let status: Value = serde_json::from_str(&serve.admin_call("GET", "/status").1).unwrap();
    assert_eq!(status["veris_proxy"], true);
    serve.stop();
}
