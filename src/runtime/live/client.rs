//! A reader's side of the live proxy's admin API: `/status`, `/seal`, and
//! the one bounded plain-HTTP exchange the admin API and twin logs are read
//! with.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::net::TcpStream;
use veris_proxy::request::recorder::UnrecordedCounts;
use veris_receipt::ledger::SealInfo;
use veris_receipt::{Entry, ListenerTier, SessionLine};

use super::twin_check::ServiceRef;

/// Bound on one admin or twin HTTP exchange.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on one answer read by [`http`] (a page of 1000 twin rows is ~150 KB).
const MAX_BODY: usize = 8 << 20;

/// A live proxy found through its state dir.
#[derive(Debug, Clone)]
pub struct LiveProxy {
    pub base: String,
    pub(super) token: String,
}

/// What `GET /status` answers (the fields readers use).
#[derive(Debug, Clone, Deserialize)]
pub struct LiveStatus {
    pub run_id: String,
    pub canary: String,
    pub tier: ListenerTier,
    pub proxy_url: String,
    pub head_seq: u64,
    #[serde(default)]
    pub session_seq: u64,
    #[serde(default)]
    pub services: Vec<ServiceRef>,
    /// The raw public key the proxy seals with (hex): with a fresh seal,
    /// the anchor of a live verdict.
    #[serde(default)]
    pub public_key: Option<String>,
    /// Requests the proxy sent to the twin but could not record (absent
    /// from a proxy before this field): the cross-check's explanation for
    /// twin rows with no ledger line.
    #[serde(default)]
    pub unrecorded: Option<UnrecordedCounts>,
}

impl LiveStatus {
    /// Whether this proxy is the one writing the ledger at `path`: the
    /// file's line at the proxy's `session_seq` must be a session line with
    /// its run id and (when both name one) its public key. `admin.addr` and
    /// `admin.token` copied from another state dir reach a proxy that
    /// answers `/status` to the token but writes another file. Reads a few
    /// blocks of the file (found by seq), opened without blocking; `Err`
    /// says what does not match.
    pub fn writes_ledger(&self, path: &Path) -> Result<(), String> {
        let shown = path.display();
        let file = veris_receipt::ledger::open_ledger(path)
            .map_err(|e| format!("cannot read its ledger {shown} ({e})"))?;
        let line = veris_receipt::ledger::line_at(&file, self.session_seq)
            .map_err(|e| format!("cannot read its ledger {shown} ({e})"))?;
        let Some(line) = line else {
            return Err(format!(
                "it says its session line is seq {}, but {shown} has no such line",
                self.session_seq
            ));
        };
        let Entry::Session(SessionLine {
            run_id, public_key, ..
        }) = &line.entry
        else {
            return Err(format!(
                "it says its session line is seq {}, but that line of {shown} is a {} line",
                self.session_seq,
                line.entry.kind()
            ));
        };
        if *run_id != self.run_id {
            return Err(format!(
                "it is run {}, but the session line at seq {} of {shown} is run {run_id}",
                self.run_id, self.session_seq
            ));
        }
        if let (Some(file_key), Some(live_key)) = (public_key, &self.public_key) {
            if file_key != live_key {
                return Err(format!(
                    "it seals with another key than the session line at seq {} of {shown} names",
                    self.session_seq
                ));
            }
        }
        Ok(())
    }
}

impl LiveProxy {
    async fn call(&self, method: &str, path: &str) -> Result<Bytes> {
        let url = format!("{}{path}", self.base);
        let (status, body) = http(method, &url, Some(&self.token)).await?;
        if status != 200 {
            bail!(
                "{method} {url} answered {status}: {}",
                String::from_utf8_lossy(&body)
            );
        }
        Ok(body)
    }

    pub async fn status(&self) -> Result<LiveStatus> {
        let body = self.call("GET", "/status").await?;
        serde_json::from_slice(&body).context("reading the admin /status answer")
    }

    pub async fn seal(&self) -> Result<SealInfo> {
        let body = self.call("POST", "/seal").await?;
        serde_json::from_slice(&body).context("reading the admin /seal answer")
    }
}

/// One HTTP/1.1 exchange with a plain-HTTP server, bounded in time.
pub async fn http(method: &str, url: &str, bearer: Option<&str>) -> Result<(u16, Bytes)> {
    let work = async {
        let uri: http::Uri = url.parse().with_context(|| format!("bad URL {url}"))?;
        if uri.scheme_str() != Some("http") {
            bail!("{url}: only http:// is supported here");
        }
        let host = uri.host().context("URL without host")?;
        let port = uri.port_u16().unwrap_or(80);
        let authority = uri
            .authority()
            .map(|a| a.as_str().to_string())
            .unwrap_or_default();
        let tcp = TcpStream::connect((host.trim_matches(|c| c == '[' || c == ']'), port))
            .await
            .with_context(|| format!("connecting to {authority}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(conn);
        let mut req = http::Request::builder()
            .method(method)
            .uri(uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"))
            .header(http::header::HOST, authority);
        if let Some(token) = bearer {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let resp = sender
            .send_request(req.body(Full::new(Bytes::new()))?)
            .await?;
        let status = resp.status().as_u16();
        // A bounded read: whatever answers at a twin or admin address (a
        // misconfigured upstream serving a large file) cannot make the proxy
        // or a reader hold it all.
        let body = http_body_util::Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| anyhow::anyhow!("{url}: reading the answer: {e}"))?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(HTTP_TIMEOUT, work)
        .await
        .unwrap_or_else(|_| bail!("{url}: no answer within {HTTP_TIMEOUT:?}"))
}
