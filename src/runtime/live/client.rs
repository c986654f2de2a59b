//! A reader's side of the live proxy's admin API: `/status`, `/seal` and
//! the webhook deliveries on demand (`/webhooks/*`), asked with the one
//! HTTP/1 client (`veris-admin-client`), which also
//! reads the twins' logs under the same [`LIMITS`].

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use veris_admin_client::{Limits, Response};
use veris_proxy::request::recorder::UnrecordedCounts;
use veris_receipt::ledger::SealInfo;
use veris_receipt::{Entry, ListenerTier, SessionLine};

use super::twin_check::ServiceRef;

/// Bounds on one admin or twin exchange: whatever answers at a twin or
/// admin address (a misconfigured upstream serving a large file) cannot
/// make a reader hold it all or wait for ever. A page of 1000 twin rows
/// is ~150 KB.
pub(super) const LIMITS: Limits = Limits {
    body: 8 << 20,
    time: Duration::from_secs(10),
};

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
    async fn call(&self, method: &str, path: &str) -> Result<Vec<u8>> {
        let url = format!("{}{path}", self.base);
        let Response { status, body } =
            veris_admin_client::call(method, &url, Some(&self.token), LIMITS).await?;
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

    /// `POST /webhooks/{action}?{query}`: a delivery on demand. `Err`
    /// carries the proxy's own message (which says what to do next).
    pub async fn webhook(&self, action: &str, query: &str) -> Result<Queued> {
        let url = format!("{}/webhooks/{action}?{query}", self.base);
        let Response { status, body } =
            veris_admin_client::call("POST", &url, Some(&self.token), LIMITS).await?;
        if status != 202 {
            #[derive(Deserialize)]
            struct Refused {
                message: String,
            }
            match serde_json::from_slice::<Refused>(&body) {
                Ok(r) => bail!("{}", r.message),
                Err(_) => bail!(
                    "POST {url} answered {status}: {}. Next: is this a veris {} proxy? `veris --version` against the one serving",
                    String::from_utf8_lossy(&body).chars().take(200).collect::<String>(),
                    env!("CARGO_PKG_VERSION")
                ),
            }
        }
        serde_json::from_slice(&body).context("reading the admin /webhooks answer")
    }
}

/// What the proxy queued for `veris trigger` or `veris replay`.
#[derive(Debug, Clone, Deserialize)]
pub struct Queued {
    pub service: String,
    pub event: String,
    pub event_id: String,
    pub origin: String,
    pub urls: Vec<String>,
}
