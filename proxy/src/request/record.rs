//! Phase 7: the ledger lines of requests (what each one records, and the
//! 503 a client gets when its line cannot be written), and the helper both
//! tiers use for lines whose loss only costs a log line.

use http::{HeaderName, Response, StatusCode};
use serde_json::json;
use tracing::warn;
use veris_receipt::UpstreamErrorLine;
use veris_receipt::{Entry, ListenerTier};

use crate::admin::summary;
use crate::body::ProxyBody;
use crate::request::recorder::RecordError;
use crate::request::respond;
use crate::Proxy;

impl Proxy {
    /// Records an entry whose loss only costs a log line (the connection has
    /// no response on which to refuse service).
    pub(crate) async fn record_or_log(&self, entry: Entry) {
        let kind = entry.kind();
        if let Err(e) = self.recorder.record(entry).await {
            warn!(error = %e, kind, "ledger entry could not be recorded");
        }
    }

    /// Phase 7: a vendor request's ledger line (its seq), before its answer
    /// goes out. `Err` is the answer instead (503): the proxy does not serve
    /// vendor traffic unrecorded.
    pub(crate) async fn record(
        &self,
        entry: Entry,
        service: &str,
    ) -> Result<u64, Response<ProxyBody>> {
        self.recorder.record(entry).await.map_err(|e| {
            warn!(error = %e, service, "ledger unavailable: refusing vendor traffic until it recovers");
            // The twin executed it: its log will hold a row with no line.
            self.unrecorded.note(service, &e);
            ledger_unavailable(&e, service)
        })
    }

    /// The `upstream_error` line of a request sent to the twin that got no
    /// answer from it.
    pub(crate) async fn record_unanswered(
        &self,
        line: &RequestLine,
        why: &Unanswered,
        duration_ms: u64,
    ) {
        self.summary.note(summary::Outcome::UpstreamError);
        let entry = Entry::UpstreamError(UpstreamErrorLine {
            service: line.service.clone(),
            host: line.host.clone(),
            method: line.method.clone(),
            path: line.path.clone(),
            upstream: line.upstream.clone(),
            status: why.status.as_u16(),
            error: why.code.to_string(),
            tier: line.tier,
            duration_ms,
            bytes_in: why.body.map(|(sent, _)| sent),
            declared_in: why.body.and_then(|(_, declared)| declared),
        });
        if let Err(e) = self.recorder.record(entry).await {
            warn!(error = %e, "upstream error could not be recorded");
            if veris_receipt::entry::may_have_reached_twin(why.code) {
                self.unrecorded.note(&line.service, &e);
            }
        }
    }
}

/// Why a request sent to the twin got no answer from it, for its
/// `upstream_error` line.
pub(crate) struct Unanswered {
    pub(crate) status: StatusCode,
    pub(crate) code: &'static str,
    /// Request body bytes forwarded and the length the client declared,
    /// when the body is part of why.
    pub(crate) body: Option<(u64, Option<u64>)>,
}

/// The fields of an [`Entry::Request`] known before the twin answers.
pub(crate) struct RequestLine {
    pub(crate) service: String,
    pub(crate) host: String,
    pub(crate) method: String,
    pub(crate) path: String,
    /// Already redacted.
    pub(crate) query: Option<String>,
    pub(crate) http: &'static str,
    pub(crate) tier: ListenerTier,
    pub(crate) upstream: String,
    pub(crate) headers: Vec<(String, String)>,
}

impl RequestLine {
    pub(crate) fn into_entry(
        self,
        status: StatusCode,
        bytes_in: u64,
        bytes_out: Option<u64>,
        elapsed: std::time::Duration,
        websocket: bool,
        client_gone: bool,
    ) -> Entry {
        Entry::Request(veris_receipt::RequestLine {
            service: self.service,
            host: self.host,
            method: self.method,
            path: self.path,
            query: self.query,
            status: status.as_u16(),
            http: self.http.to_string(),
            tier: self.tier,
            bytes_in,
            bytes_out,
            duration_ms: u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
            // Loopback answers in well under a millisecond: the HAR's
            // timings read this.
            duration_us: Some(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX)),
            upstream: self.upstream,
            headers: self.headers,
            websocket,
            client_gone,
        })
    }
}

/// The answer when a vendor request's ledger line could not be written: the
/// proxy does not serve vendor traffic unrecorded (DESIGN §7).
pub(crate) fn ledger_unavailable(e: &RecordError, service: &str) -> Response<ProxyBody> {
    respond::error(
        StatusCode::SERVICE_UNAVAILABLE,
        "veris_ledger_unavailable",
        format!("the proxy could not record this request ({e}) and does not serve vendor traffic unrecorded. Next: check free space and permissions of the veris state dir"),
        json!({"service": service}),
    )
}

/// Request headers worth keeping in the ledger (values redacted by its writer).
pub(crate) const RECORDED_HEADERS: [HeaderName; 8] = [
    HeaderName::from_static("content-type"),
    HeaderName::from_static("content-length"),
    HeaderName::from_static("user-agent"),
    HeaderName::from_static("accept"),
    HeaderName::from_static("idempotency-key"),
    HeaderName::from_static("stripe-version"),
    HeaderName::from_static("stripe-account"),
    HeaderName::from_static("authorization"),
];

/// The request headers the ledger keeps, as sent: the writer redacts them
/// (`redact::entry`) like every field of every line.
pub(crate) fn recorded_headers(headers: &http::HeaderMap) -> Vec<(String, String)> {
    RECORDED_HEADERS
        .iter()
        .filter_map(|name| {
            let value = headers.get(name)?.to_str().ok()?;
            Some((name.as_str().to_string(), value.to_string()))
        })
        .collect()
}
