//! Prometheus metrics, served as `GET /metrics` by the admin API.
//!
//! What the proxy counts for each request is kept to a few relaxed atomics
//! ([`Stats`]): one status-class counter of the request's service, found by
//! the service's index in the router (no label lookup, no lock), and one
//! bucket and the sum of the upstream latency histogram. Everything else is
//! read when a scrape asks ([`Scrape`]): the ledger writer's per-kind line
//! counters (trust failures and QUIC attempts are ledger kinds, so they are
//! not counted twice) and the open client connections (the permits the
//! connection cap has handed out). Every registry also carries the
//! process's own metrics and `veris_build_info` ([`super::process`]). The
//! text itself is written by `prometheus-client`: OpenMetrics 1.0 when the
//! scraper's `Accept` asks for it (Prometheus does), else the Prometheus
//! text format 0.0.4 ([`response`]).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
pub use prometheus_client::registry::Registry;
use prometheus_client::registry::Unit;
use veris_receipt::ledger::Ledger;

use crate::body::ProxyBody;
use crate::Proxy;

/// The `Content-Type` of a scrape's answer in the Prometheus text format.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Where `--metrics-listen` without an address listens: a port of its own,
/// so parallel proxies on one host only collide when told to.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9479";

/// The `Content-Type` of a scrape's answer in OpenMetrics.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds of the upstream latency buckets, in microseconds: 1 ms to
/// 30 s (the default upstream timeout), roughly 1-2.5-5 per decade.
const LATENCY_BOUNDS_US: [u64; 14] = [
    1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    5_000_000, 10_000_000, 30_000_000,
];

/// Status classes a request is counted under, by `status / 100 - 1`.
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// What the proxy counts per request, read by [`Scrape`]. `Sync`; every
/// update is one or two relaxed atomic adds.
#[derive(Debug)]
pub struct Stats {
    /// Per service (in [`crate::request::route::Router::services`] order), requests
    /// forwarded to the twin by the class of the status the client was
    /// given: the twin's, or the proxy's 502/504 when the twin failed.
    requests: Box<[[AtomicU64; 5]]>,
    /// Time from forwarding a request to the twin's response head (or its
    /// failure), per bucket of [`LATENCY_BOUNDS_US`]; the last slot is
    /// everything slower. Not cumulative: the encoder sums them.
    latency: [AtomicU64; LATENCY_BOUNDS_US.len() + 1],
    latency_sum_us: AtomicU64,
}

impl Stats {
    /// Counters for `services` services, all zero.
    pub fn new(services: usize) -> Stats {
        Stats {
            requests: (0..services).map(|_| Default::default()).collect(),
            latency: Default::default(),
            latency_sum_us: AtomicU64::new(0),
        }
    }

    /// One request of service number `service` answered with `status`.
    pub fn request(&self, service: usize, status: u16) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        if let Some(classes) = self.requests.get(service) {
            classes[class].fetch_add(1, Relaxed);
        }
    }

    /// One exchange with the twin that took `elapsed`.
    pub fn upstream_latency(&self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let bucket = LATENCY_BOUNDS_US.partition_point(|bound| *bound < us);
        self.latency[bucket].fetch_add(1, Relaxed);
        self.latency_sum_us.fetch_add(us, Relaxed);
    }

    /// Requests counted for service number `service`, by class (tests).
    pub fn requests_of(&self, service: usize) -> [u64; 5] {
        self.requests
            .get(service)
            .map_or([0; 5], |c| c.each_ref().map(|n| n.load(Relaxed)))
    }
}

/// Where a scrape reads its numbers from.
pub struct Scrape {
    /// Service names, in the order of [`Stats`]' slots.
    pub services: Vec<String>,
    pub stats: Arc<Stats>,
    /// Client connections open now.
    pub connections_open: Box<dyn Fn() -> usize + Send + Sync>,
    /// Ledger lines per kind since the proxy's session line.
    pub ledger_lines: Box<dyn Fn() -> BTreeMap<String, u64> + Send + Sync>,
}

impl Scrape {
    /// A live proxy and the ledger it writes.
    pub fn of(proxy: &Arc<Proxy>, ledger: Arc<Ledger>) -> Scrape {
        let open = proxy.clone();
        Scrape {
            services: proxy
                .router()
                .services()
                .iter()
                .map(|s| s.name.clone())
                .collect(),
            stats: proxy.stats().clone(),
            connections_open: Box::new(move || open.open_connections()),
            ledger_lines: Box::new(move || ledger.counters()),
        }
    }

    /// A registry whose every scrape reads these sources (and the process).
    pub fn registry(self) -> Registry {
        let mut registry = registry();
        registry.register_collector(Box::new(self));
        registry
    }
}

/// A registry with the process's metrics and `veris_build_info`, for a
/// server to add its own to.
pub fn registry() -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(super::process::Process));
    registry
}

/// Whether an `Accept` header asks for OpenMetrics (any version: 1.0.0 is
/// the one written).
fn wants_openmetrics(accept: Option<&HeaderValue>) -> bool {
    accept.and_then(|a| a.to_str().ok()).is_some_and(|a| {
        a.split(',').any(|t| {
            t.trim()
                .to_ascii_lowercase()
                .starts_with("application/openmetrics-text")
        })
    })
}

/// The registry's metrics in the format `accept` asks for, and its
/// `Content-Type`.
pub fn render(
    registry: &Registry,
    accept: Option<&HeaderValue>,
) -> Result<(String, &'static str), fmt::Error> {
    let mut out = String::with_capacity(8 * 1024);
    if wants_openmetrics(accept) {
        prometheus_client::encoding::text::encode(&mut out, registry)?;
        Ok((out, OPENMETRICS_CONTENT_TYPE))
    } else {
        prometheus_client::encoding::prometheus_text::encode(&mut out, registry)?;
        Ok((out, CONTENT_TYPE))
    }
}

/// A scrape's answer: the registry rendered for the request's `Accept`,
/// never cached.
pub fn response(registry: &Registry, headers: &HeaderMap) -> Response<ProxyBody> {
    match render(registry, headers.get(header::ACCEPT)) {
        Ok((text, content_type)) => {
            let mut resp = Response::new(crate::body::full(text));
            let h = resp.headers_mut();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            resp
        }
        Err(e) => crate::request::respond::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "veris_internal",
            format!("encoding the metrics failed: {e}"),
            serde_json::json!({}),
        ),
    }
}

/// What a scrape listener answers `GET /metrics` with.
pub type ScrapeFn = Arc<dyn Fn(&HeaderMap) -> Response<ProxyBody> + Send + Sync>;

/// A listener of its own for scrapers (`--metrics-listen`): `GET /metrics`
/// (with the admin token unless `token` is `None`, `--metrics-open`) and
/// `GET /healthz`, nothing else, so a scraper's fixed address never exposes
/// the admin API. Serves until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    scrape: ScrapeFn,
    token: Option<String>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let cancel = tokio_util::sync::CancellationToken::new();
    let token = token.map(Arc::new);
    veris_accept::accept_until(
        listener,
        shutdown,
        veris_accept::OnError::Retry,
        |stream, peer| {
            let (scrape, token, cancel) = (scrape.clone(), token.clone(), cancel.clone());
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let answer =
                            scrape_answer(&scrape, token.as_deref().map(String::as_str), &req);
                        async move { Ok::<_, std::convert::Infallible>(answer) }
                    });
                if let Err(e) = crate::inbound::http::serve_http1(
                    stream,
                    service,
                    &cancel,
                    crate::Limits::default().request_head,
                )
                .await
                {
                    tracing::debug!(error = %e, %peer, "metrics connection ended with an error");
                }
            });
        },
    )
    .await?;
    cancel.cancel();
    Ok(())
}

fn scrape_answer<B>(
    scrape: &ScrapeFn,
    token: Option<&str>,
    req: &http::Request<B>,
) -> Response<ProxyBody> {
    use crate::request::respond;
    let (method, path) = (req.method(), req.uri().path());
    match (method == http::Method::GET, path) {
        (true, "/healthz") => respond::json(StatusCode::OK, serde_json::json!({"status": "ok"})),
        (true, "/metrics") => match token {
            Some(t) if !super::authorized(req.headers(), t) => super::unauthorized(),
            _ => scrape(req.headers()),
        },
        (false, "/metrics" | "/healthz") => respond::error(
            StatusCode::METHOD_NOT_ALLOWED,
            "veris_method_not_allowed",
            format!("{path} takes GET"),
            serde_json::json!({}),
        ),
        _ => respond::error(
            StatusCode::NOT_FOUND,
            "veris_not_found",
            format!("this listener serves /metrics and /healthz only, not {path}; the admin API has the rest"),
            serde_json::json!({}),
        ),
    }
}

impl fmt::Debug for Scrape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scrape").finish_non_exhaustive()
    }
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let stats = &self.stats;

        let mut metric = encoder.encode_descriptor(
            "veris_requests",
            "Vendor requests forwarded to the twin, by service and the status class the client was given (the twin's, or the proxy's 502/504 when the twin failed).",
            None,
            MetricType::Counter,
        )?;
        for (i, service) in self.services.iter().enumerate() {
            for (class, n) in CLASSES.iter().zip(stats.requests_of(i)) {
                let labels = [("service", service.as_str()), ("class", class)];
                ConstCounter::new(n).encode(metric.encode_family(&labels)?)?;
            }
        }

        // Since this proxy's session line: the writer resets them there.
        let lines = (self.ledger_lines)();
        let mut metric = encoder.encode_descriptor(
            "veris_ledger_lines",
            "Ledger lines this proxy has written since its session line, by kind.",
            None,
            MetricType::Counter,
        )?;
        for (kind, n) in &lines {
            let labels = [("kind", kind.as_str())];
            ConstCounter::new(*n).encode(metric.encode_family(&labels)?)?;
        }
        let of_kind = |kind: &str| lines.get(kind).copied().unwrap_or(0);
        ConstCounter::new(of_kind("trust_failure")).encode(encoder.encode_descriptor(
            "veris_trust_failures",
            "TLS handshakes a client aborted after the proxy offered its leaf (refusals of the veris CA).",
            None,
            MetricType::Counter,
        )?)?;
        ConstCounter::new(of_kind("quic")).encode(encoder.encode_descriptor(
            "veris_quic_attempts",
            "QUIC connection attempts caught by the UDP 443 sink (one ledger line each, written when the attempt goes quiet).",
            None,
            MetricType::Counter,
        )?)?;

        ConstGauge::new(i64::try_from((self.connections_open)()).unwrap_or(i64::MAX)).encode(
            encoder.encode_descriptor(
                "veris_connections_open",
                "Client connections open now, over every listener.",
                None,
                MetricType::Gauge,
            )?,
        )?;

        // The last slot is the `+Inf` bucket, named: OpenMetrics requires
        // it, and the text encoder adds none of its own when it is there.
        let mut buckets = [(f64::INFINITY, 0); LATENCY_BOUNDS_US.len() + 1];
        let mut count = 0;
        for (i, slot) in stats.latency.iter().enumerate() {
            let n = slot.load(Relaxed);
            count += n;
            if let Some(bucket) = buckets.get_mut(i) {
                let bound = LATENCY_BOUNDS_US
                    .get(i)
                    .map_or(f64::INFINITY, |b| *b as f64 / 1e6);
                *bucket = (bound, n);
            }
        }
        let sum = stats.latency_sum_us.load(Relaxed) as f64 / 1e6;
        encoder
            .encode_descriptor(
                "veris_upstream_latency",
                "Time from forwarding a vendor request to the twin's response head (or its failure).",
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?
            .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_and_latency_buckets() {
        let s = Stats::new(2);
        s.request(0, 200);
        s.request(0, 201);
        s.request(1, 504);
        s.request(1, 99);
        s.request(7, 200);
        assert_eq!(s.requests_of(0), [0, 2, 0, 0, 0]);
        assert_eq!(s.requests_of(1), [1, 0, 0, 0, 1]);
        assert_eq!(s.requests_of(7), [0; 5]);

        s.upstream_latency(Duration::from_micros(1_000));
        s.upstream_latency(Duration::from_micros(1_001));
        s.upstream_latency(Duration::from_secs(60));
        let counts: Vec<u64> = s.latency.iter().map(|n| n.load(Relaxed)).collect();
        assert_eq!(counts[0], 1, "a bound is inclusive (le)");
        assert_eq!(counts[1], 1);
        assert_eq!(counts[LATENCY_BOUNDS_US.len()], 1, "over the last bound");
        assert_eq!(s.latency_sum_us.load(Relaxed), 60_002_001);
    }

    #[test]
    fn the_exposition_is_the_prometheus_text_format() {
        let stats = Arc::new(Stats::new(2));
        stats.request(0, 200);
        stats.request(0, 201);
        stats.request(1, 502);
        stats.upstream_latency(Duration::from_micros(800));
        stats.upstream_latency(Duration::from_millis(40));
        stats.upstream_latency(Duration::from_secs(45));
        let registry = Scrape {
            services: vec!["stripe".into(), "we\"ird\\".into()],
            stats,
            connections_open: Box::new(|| 3),
            ledger_lines: Box::new(|| {
                [("session", 1), ("request", 2), ("trust_failure", 4)]
                    .into_iter()
                    .map(|(k, n)| (k.to_string(), n))
                    .collect()
            }),
        }
        .registry();
        let (text, content_type) = render(&registry, None).unwrap();
        assert_eq!(content_type, CONTENT_TYPE);
        for line in [
            "# TYPE veris_requests_total counter",
            "veris_requests_total{service=\"stripe\",class=\"2xx\"} 2",
            "veris_requests_total{service=\"stripe\",class=\"5xx\"} 0",
            // A label value is escaped, whatever a config names a service.
            "veris_requests_total{service=\"we\\\"ird\\\\\",class=\"5xx\"} 1",
            "# TYPE veris_ledger_lines_total counter",
            "veris_ledger_lines_total{kind=\"request\"} 2",
            "veris_ledger_lines_total{kind=\"session\"} 1",
            "veris_trust_failures_total 4",
            "veris_quic_attempts_total 0",
            "# TYPE veris_connections_open gauge",
            "veris_connections_open 3",
            "# TYPE veris_upstream_latency_seconds histogram",
            "veris_upstream_latency_seconds_bucket{le=\"0.001\"} 1",
            "veris_upstream_latency_seconds_bucket{le=\"0.025\"} 1",
            "veris_upstream_latency_seconds_bucket{le=\"0.05\"} 2",
            "veris_upstream_latency_seconds_bucket{le=\"30\"} 2",
            "veris_upstream_latency_seconds_bucket{le=\"+Inf\"} 3",
            "veris_upstream_latency_seconds_count 3",
            "veris_upstream_latency_seconds_sum 45.0408",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "no line {line:?} in:\n{text}"
            );
        }
        // Every sample line is `name{labels} value` with a number for value;
        // every family has its HELP and TYPE before its samples.
        let mut typed = Vec::new();
        for l in text.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                typed.push(rest.split(' ').next().unwrap().to_string());
                continue;
            }
            if l.starts_with("# HELP ") {
                continue;
            }
            let (series, value) = l.rsplit_once(' ').expect("a sample line");
            assert!(value.parse::<f64>().is_ok(), "{l}");
            let name = series.split('{').next().unwrap();
            assert!(
                typed.iter().any(|t| name.starts_with(t.as_str())),
                "{name} before its TYPE"
            );
        }
        assert!(text.ends_with('\n'));
        assert!(
            !text.contains("# EOF"),
            "OpenMetrics, not the Prometheus text format"
        );
    }
}
