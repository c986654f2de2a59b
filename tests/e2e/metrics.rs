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

/// A port nothing listens on now (bound and released: a test that loses the
/// race fails to start, it never scrapes something else).
fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

/// The `Content-Type` of an open scrape that sends `accept`.
fn content_type(serve: &Serve, accept: Option<&str>) -> String {
    let mut cmd = command("curl");
    cmd.args(["-sS", "-o", "/dev/null", "-w", "%{content_type}"]);
    if let Some(a) = accept {
        cmd.args(["-H", &format!("Accept: {a}")]);
    }
    let out = output(cmd.arg(format!("http://{}/metrics", serve.admin())));
    text(&out).0
}

/// `promtool check metrics` on `text`: its exit code and what it said.
fn promtool(text: &str) -> (Option<i32>, String) {
    let mut child = command("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool runs");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin
            .write_all(text.as_bytes())
            .expect("writing the metrics");
    }
    let out = child.wait_with_output().expect("promtool ends");
    let (o, e) = support::text(&out);
    (out.status.code(), format!("{o}{e}"))
}

/// Prometheus's own linter passes the text format and a strict parser the
/// OpenMetrics one, which is what an
/// `Accept` asking for it gets (Prometheus asks), with the process's
/// metrics and the build's version in both.
#[test]
fn both_formats_pass_their_checkers_with_the_process_metrics() {
    if !tool_works("promtool", &["--version"]) {
        return skip("promtool not installed (apt install prometheus)");
    }
    let mut serve = Serve::start("metrics-promtool", &["--metrics-open"]);
    assert_eq!(serve.vendor("GET", "api.stripe.com", "/v1/customers"), 200);
    let (status, text) = scrape(&serve, false);
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        content_type(&serve, None),
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let (code, said) = promtool(&text);
    assert_eq!(code, Some(0), "promtool on the text format: {said}\n{text}");

    let accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
    let header = format!("Accept: {accept}\r\n");
    let (status, om) = http(serve.admin(), "GET", "/metrics", "127.0.0.1", &header, "");
    assert_eq!(status, 200, "{om}");
    assert_eq!(
        content_type(&serve, Some(accept)),
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(om.trim_end().ends_with("# EOF"), "{om}");
    // promtool lints the text format only; OpenMetrics is read by the
    // Python client's strict OpenMetrics parser.
    if let Err(why) = support::python_module("prometheus_client.openmetrics.parser") {
        return skip(&why);
    }
    let mut child = command("python3")
        .args([
            "-c",
            "import sys\nfrom prometheus_client.openmetrics.parser import text_string_to_metric_families as p\nprint(sum(1 for _ in p(sys.stdin.read())))",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin.write_all(om.as_bytes()).expect("writing the metrics");
    }
    let out = child.wait_with_output().expect("python3 ends");
    assert!(
        out.status.success(),
        "the OpenMetrics parser refused:\n{om}\n{:?}",
        support::text(&out)
    );

    for body in [&text, &om] {
        let version = format!(
            r#"veris_build_info{{version="{}"}}"#,
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(sample(body, &version), Some(1.0), "{body}");
        assert!(
            sample(body, "process_resident_memory_bytes").is_some_and(|v| v > 1e6),
            "{body}"
        );
        assert!(
            sample(body, "process_open_fds").is_some_and(|v| v >= 3.0),
            "{body}"
        );
        assert!(
            sample(body, "process_max_fds").is_some_and(|v| v >= 64.0),
            "{body}"
        );
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let started = sample(body, "process_start_time_seconds").expect("start time");
        assert!(
            (now - 600.0..=now + 5.0).contains(&started),
            "{started} vs {now}"
        );
    }
    serve.stop();
}

/// `--metrics-listen`: a fixed scrape address serving /metrics (with the
/// admin token unless --metrics-open) and /healthz, and no admin endpoint.
#[test]
fn metrics_listen_is_a_scrape_address_and_nothing_else() {
    let addr = free_addr();
    let listen = addr.to_string();
    let mut serve = Serve::start("metrics-listen", &["--metrics-listen", &listen]);
    let bearer = format!("Authorization: Bearer {}\r\n", serve.token());
    let (status, body) = http(addr, "GET", "/metrics", "127.0.0.1", "", "");
    assert_eq!(status, 401, "{body}");
    let (status, body) = http(addr, "GET", "/metrics", "127.0.0.1", &bearer, "");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("veris_requests_total") || body.contains("veris_build_info"),
        "{body}"
    );
    // The admin API is not behind this address, token or not.
    for path in ["/status", "/ledger", "/receipt", "/seal"] {
        let (status, _) = http(addr, "GET", path, "127.0.0.1", &bearer, "");
        assert_eq!(status, 404, "{path}");
    }
    let (status, _) = http(addr, "GET", "/healthz", "127.0.0.1", "", "");
    assert_eq!(status, 200);
    assert!(
        serve.stderr().contains("metrics listening"),
        "{}",
        serve.stderr()
    );

    // The address is taken now: a second proxy told to use it says so.
    let out = output(
        veris(["serve", "--state-dir"])
            .arg(serve.dir.join("other"))
            .args(["--listen", "127.0.0.1:0", "--metrics-listen", &listen]),
    );
    assert!(!out.status.success());
    let (_, err) = text(&out);
    assert!(err.contains("--metrics-listen"), "{err}");
    serve.stop();

    let addr = free_addr();
    let mut open = Serve::start(
        "metrics-listen-open",
        &["--metrics-listen", &addr.to_string(), "--metrics-open"],
    );
    let (status, body) = http(addr, "GET", "/metrics", "127.0.0.1", "", "");
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains(&open.token()));
    open.stop();
}

/// The gateway takes the same flags: its scrape address has the process's
/// metrics, behind its admin token.
#[test]
fn a_gateway_serves_its_metrics_on_its_metrics_listen() {
    let addr = free_addr();
    let gw = support::gateway::Gateway::start(
        "metrics-gateway",
        "127.0.0.1:0",
        &["--metrics-listen", &addr.to_string()],
    );
    let (status, _) = http(addr, "GET", "/metrics", "127.0.0.1", "", "");
    assert_eq!(status, 401);
    let bearer = format!("Authorization: Bearer {}\r\n", gw.admin_token());
    let (status, body) = http(addr, "GET", "/metrics", "127.0.0.1", &bearer, "");
    assert_eq!(status, 200, "{body}");
    assert!(
        sample(&body, "process_threads").is_some_and(|v| v >= 1.0),
        "{body}"
    );
    let (status, _) = http(addr, "GET", "/sandboxes", "127.0.0.1", &bearer, "");
    assert_eq!(status, 404);
}
